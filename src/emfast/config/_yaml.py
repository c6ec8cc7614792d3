"""YAML with line marks, the :class:`ConfigError` that names a key path and line, and the typed reader of values."""
from __future__ import annotations

import difflib
import math
import os
import re
import shlex
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import yaml

from .._checks import one_section, triple



Path_ = Tuple[Union[str, int], ...]


class ConfigError(ValueError):
    """A config that cannot be loaded or built.

    Attributes
    ----------
    path : str
        Key path of the culprit, e.g. ``data.samples[1].raw.dataset`` (empty for the whole document).
    line : int or None
        1-based line of that key in the YAML file (or of its closest enclosing key), when known.
    source : str
        The config file, or ``"<text>"``.
    reason : str
        What is wrong.
    """

    def __init__(self, reason: str, path: str = "", line: Optional[int] = None, source: str = "<text>") -> None:
        self.reason, self.path, self.line, self.source = reason, path, line, source
        where = source + (f", line {line}" if line is not None else "")
        super().__init__(f"{where}: {path + ': ' if path else ''}{reason}")

    def __reduce__(self):  # across processes (a spawned worker's config) with its parts, not the message as reason
        return type(self), (self.reason, self.path, self.line, self.source), self.__dict__


def _format_path(path: Path_) -> str:
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


# -- YAML with line marks -----------------------------------------------------------------------------------------

_SAFE_TAGS = set(yaml.SafeLoader.yaml_constructors) | {"tag:yaml.org,2002:merge"}

#: Most nodes a config may expand to, counting every use of an alias: a real config has a few hundred, and a few
#: nested aliases ("billion laughs") would otherwise expand to billions, costing minutes and gigabytes.
MAX_NODES = 100_000
#: Deepest nesting a config may have: a real one has under 10 levels, an alias that contains itself has no end.
MAX_DEPTH = 64


def _marks(node: yaml.Node, path: Path_, marks: Dict[Path_, int], source: str, budget: List[int]) -> None:
    """Record the line of every key and item under ``node``; refuse unsafe tags, repeated keys, and more than
    ``MAX_NODES`` expanded nodes (``budget`` holds the nodes left)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise ConfigError(f"the config expands to more than {MAX_NODES:,} values (through YAML aliases?); refused "
                          "before reading it", _format_path(path), node.start_mark.line + 1, source)
    if len(path) > MAX_DEPTH:
        raise ConfigError(f"the config nests more than {MAX_DEPTH} levels deep (a YAML alias that contains "
                          "itself?)", _format_path(path[:MAX_DEPTH]), node.start_mark.line + 1, source)
    marks.setdefault(path, node.start_mark.line + 1)
    if node.tag not in _SAFE_TAGS:
        raise ConfigError(f"the YAML tag {node.tag!r} is not allowed; configs hold only mappings, lists, strings, "
                          "numbers, booleans and null (they are parsed with yaml.SafeLoader)",
                          _format_path(path), node.start_mark.line + 1, source)
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _marks(item, path + (index,), marks, source, budget)
    elif isinstance(node, yaml.MappingNode):
        seen = set()
        for key, value in node.value:
            name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
            if key.tag == "tag:yaml.org,2002:merge":
                _marks(value, path, marks, source, budget)
                continue
            if name in seen:
                raise ConfigError(f"the key {name!r} appears twice", _format_path(path + (name,)),
                                  key.start_mark.line + 1, source)
            seen.add(name)
            marks[path + (name,)] = key.start_mark.line + 1
            _marks(key, path + (name,), {}, source, budget)  # tags of keys are checked too
            _marks(value, path + (name,), marks, source, budget)


def read_source(source: Union[str, os.PathLike], what: str) -> Tuple[str, str, Path]:
    """(text, name, base folder) of a config given as a path (a path-like, or a string without a newline) or as
    YAML text (a string with a newline, or only blanks: an empty file's text, not the path "."; its base is the
    working directory)."""
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source and source.strip()):
        path = Path(source).expanduser()
        return _config_text(path), str(path), path.resolve().parent
    if not isinstance(source, str):
        raise TypeError(f"{what} takes a path or YAML text, got {type(source).__name__}")
    return source, "<text>", Path.cwd()


#: The signature an HDF5 file starts with (at byte 0, or after a user block of 512, 1024, 2048... bytes).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _config_text(path: Path) -> str:
    """The text of a config file; a data file or store given by mistake is named as such, not as a decode error."""
    shown = shlex.quote(str(path))  # as it would be pasted into a shell
    if path.is_dir():
        raise ConfigError("is a folder (a zarr or N5 store?), not a YAML config file; give the config that names "
                          f"it (see docs/CONFIG.md); emfast info {shown} lists its arrays", source=str(path))
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read the config file: {error.strerror or error}", source=str(path)) from None
    offsets = [0] + [512 * 2**k for k in range(12) if 512 * 2**k < len(data)]
    if any(data[offset:offset + len(HDF5_SIGNATURE)] == HDF5_SIGNATURE for offset in offsets):
        raise ConfigError("is an HDF5 file, not a YAML config file; give the config that names it (see "
                          f"docs/CONFIG.md); emfast info {shown} lists its datasets", source=str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"is not a YAML config file: it looks like a binary file (byte {error.start} is not "
                          "UTF-8 text)", source=str(path)) from None
    if "\0" in text:
        raise ConfigError(f"is not a YAML config file: it looks like a binary file (byte {text.index(chr(0))} is "
                          "NUL)", source=str(path))
    return text


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` reading numbers as YAML 1.2 and JSON do (the resolvers below): ``1e-3`` and ``1.5e3``
    are numbers (YAML 1.1's float pattern wants a dot and a signed exponent, so PyYAML read them as strings, refused
    as "must be in [0, 1), got '1e-3'")."""


# Numbers without YAML 1.1's surprises: it made "seed: 010" the octal 8, "epoch_size: 1:30" the base-60 90 and
# "1:30.5" the float 90.5, silently. Integers are decimal without a leading zero, 0o octal or 0x hex; a leading
# zero ("010", "08") is neither octal nor decimal, so it stays a string (a name "08" as before; "seed: 010" is
# refused as no integer); base-60 forms are strings.
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in _ConfigLoader.yaml_implicit_resolvers.items()}
_ConfigLoader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                    list("-+0123456789"))
_ConfigLoader.add_implicit_resolver(_FLOAT, re.compile(
    r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+.0123456789"))


def _integer(loader: yaml.SafeLoader, node) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    try:
        return int(text, 0) if text.startswith(("0o", "0x")) else int(text, 10)
    except ValueError:  # an explicit !!int of another form (0b11, 1:30)
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is no integer (decimal, 0o octal or 0x hex)",
                                                node.start_mark) from None


_ConfigLoader.add_constructor(_INT, _integer)


class _ConfigDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that quotes every string the config loader would read as another type: a sample named
    "1e5" was written plain and read back as the number 100000.0."""


_ConfigDumper.yaml_implicit_resolvers = {first: list(resolvers)
                                         for first, resolvers in _ConfigLoader.yaml_implicit_resolvers.items()}


def dump_yaml(data) -> str:
    """``data`` as YAML text that :func:`parse_yaml` reads back as ``data``."""
    return yaml.dump(data, Dumper=_ConfigDumper, sort_keys=False, default_flow_style=None, width=120)


def parse_yaml(text: str, source: str) -> Tuple[Any, Dict[Path_, int]]:
    loader = _ConfigLoader(text)
    try:
        node = loader.get_single_node()
        marks: Dict[Path_, int] = {}
        if node is None:
            return None, marks
        _marks(node, (), marks, source, [MAX_NODES])
        return loader.construct_document(node), marks
    except yaml.MarkedYAMLError as error:
        problem, context = error.problem_mark, error.context_mark
        # A quote or bracket left open is found where the text ends, past the last line: the line it was opened
        # on is the one to name. Elsewhere the problem's line is (an indentation mistake inside a mapping begun
        # far above); where both are known, the message gives the other too.
        at_end = problem is not None and problem.index >= len(text.rstrip())
        mark = context if context is not None and (problem is None or at_end) else problem
        reason = error.problem or ""
        if error.context and context is not None and mark is not None and context.line != mark.line:
            reason += f", {error.context} that starts on line {context.line + 1}"
        elif error.context:
            reason = f"{error.context}: {reason}"
        if at_end and mark is context:
            reason += f" (line {context.line + 1} opens it and the text ends before it is closed)"
        raise ConfigError(f"invalid YAML: {reason}", "", None if mark is None else mark.line + 1,
                          source) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"invalid YAML: {error}", "", None, source) from None
    finally:
        loader.dispose()


# -- checking values ----------------------------------------------------------------------------------------------

class Reader:
    """Checks values of the parsed document, raising ConfigError with key path and line."""

    def __init__(self, marks: Dict[Path_, int], source: str, base: Path) -> None:
        self.marks, self.source, self.base = marks, source, base

    def line(self, path: Path_) -> Optional[int]:
        for end in range(len(path), -1, -1):
            if path[:end] in self.marks:
                return self.marks[path[:end]]
        return None

    def has(self, path: Path_) -> bool:
        """Whether the YAML spells out ``path`` (a key, or a list entry)."""
        return path in self.marks

    def error(self, path: Path_, reason: str) -> ConfigError:
        return ConfigError(reason, _format_path(path), self.line(path), self.source)

    def mapping(self, value, path: Path_, allowed: Sequence[str], required: Sequence[str] = ()) -> dict:
        if not isinstance(value, dict):
            raise self.error(path, f"expected a mapping with keys {', '.join(allowed)}; got {describe_value(value)}")
        for key in value:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise self.error(path + (str(key),), f"unknown key {key!r}{hint} (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in value:
                raise self.error(path, f"missing required key {key!r}")
        return value

    def integer(self, value, path: Path_, minimum: Optional[int] = None) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
            bound = "" if minimum is None else f" >= {minimum}"
            raise self.error(path, f"expected an integer{bound}, got {describe_value(value)}")
        return value

    def number(self, value, path: Path_, positive: bool = False) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                or (positive and value <= 0):
            raise self.error(path, f"expected a {'positive' if positive else 'finite'} number, got "
                                   f"{describe_value(value)}")
        return value

    def boolean(self, value, path: Path_) -> bool:
        if not isinstance(value, bool):
            raise self.error(path, f"expected true or false, got {describe_value(value)}")
        return value

    def string(self, value, path: Path_) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(path, f"expected a non-empty string, got {describe_value(value)}")
        return value

    def triple(self, value, path: Path_, minimum: Optional[int] = None, window: bool = False) -> Tuple[int, int, int]:
        """A list of 3 integers (>= ``minimum``); ``window``: a patch, whose (y, x) pair is told how to be one
        section."""
        try:
            if not isinstance(value, list):
                raise ValueError("not a list")
            return triple(value, _format_path(path), minimum=minimum)
        except ValueError:
            kind = "integers" if minimum is None else f"integers >= {minimum}"
            hint = one_section(value) if window else ""
            raise self.error(path, f"expected a list of 3 {kind} [z, y, x], got {describe_value(value)}{hint}") \
                from None

    def listing(self, value, path: Path_) -> list:
        if not isinstance(value, list):
            raise self.error(path, f"expected a list, got {describe_value(value)}")
        return value


def describe_value(value) -> str:
    kind = {dict: "a mapping", list: "a list", tuple: "a tuple", str: "the string", bool: "the boolean",
            type(None): "nothing (null)", int: "the integer", float: "the number"}.get(type(value), type(value).__name__)
    if value is None:
        return kind
    text = repr(value)  # shortened: a factory's (model, state dict) would fill a screen; most paths stay whole
    limit = 240 if isinstance(value, str) else 60
    return f"{kind} {text if len(text) < limit else text[:limit - 3] + '...'}"
