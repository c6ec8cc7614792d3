"""YAML training configs that map one-to-one onto emfast's Python objects.

A config names the volumes of each :class:`~emfast.Sample`, the keyword arguments of :class:`~emfast.Loader`
(same names), the augmentations, targets and sampler by their registered names with their constructor
parameters, and optional overrides for a validation loader on held-out samples::

    data:
      samples:
        - name: A
          file: a.h5                          # relative paths resolve against the config's folder
          raw: volumes/raw                    # a dataset of the sample's file, or {file: ..., dataset: ...}
          labels: volumes/labels/neuron_ids
      hold_out: [B]
    loader: {patch: [32, 128, 128], batch_size: 8, threads: 2, epoch_size: 100}
    augment: [mirror, transpose, {intensity: {scale: 0.1, shift: 0.1}}]
    targets: [{affinities: {offsets: [[-1, 0, 0], [0, -1, 0], [0, 0, -1]]}}]
    sampler: {balanced: {classes: boundary}}
    validation: {sampler: tiled, augment: []}

:func:`load_config` parses with PyYAML's safe loader (plain mappings, lists, strings, numbers, booleans and null;
any other tag is refused) and checks everything that can be checked without opening a file: keys, value types,
names and parameters of augmentations, targets and samplers (by building them). :meth:`Config.loader` then opens
the volumes and builds the :class:`~emfast.Loader`. Every problem is a :class:`ConfigError` naming the key path
(``data.samples[1].raw.dataset``) and, for configs read from YAML, the line. See ``docs/CONFIG.md``.
"""
from __future__ import annotations

import difflib
import inspect
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import yaml

from . import augment as _augment
from . import targets as _targets
from .dataset import Dataset, Sample
from .loader import NORMALIZE_MODES, Loader
from .sampling import Masked, Sampler
from .synthetic import demo_volume_path
from .volumes import Volume, hdf5

__all__ = ["BUILTIN_CONFIG", "Builtin", "ComponentSpec", "Config", "ConfigError", "SampleSpec", "Validation",
           "VolumeSpec", "close_volumes", "describe", "dump_config", "load_config"]

#: The default config of ``emfast demo --config``: the built-in volume, its raw and labels.
BUILTIN_CONFIG = Path(__file__).parent / "data" / "demo.yaml"

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


def _parse(text: str, source: str) -> Tuple[Any, Dict[Path_, int]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        marks: Dict[Path_, int] = {}
        if node is None:
            return None, marks
        _marks(node, (), marks, source, [MAX_NODES])
        return loader.construct_document(node), marks
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        reason = " ".join(part for part in (error.context, error.problem) if part)
        raise ConfigError(f"invalid YAML: {reason}", "", None if mark is None else mark.line + 1,
                          source) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"invalid YAML: {error}", "", None, source) from None
    finally:
        loader.dispose()


# -- the spec -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Builtin:
    """The built-in EM-like volume (:func:`emfast.synthetic.demo_volume_path`), generated in the emfast cache
    directory on first use. YAML: ``file: {builtin: demo, shape: [z, y, x], seed: 0}``.

    Attributes
    ----------
    shape : (int, int, int) or None
        Volume shape; None: the shape given to :meth:`Config.loader` as ``demo_shape``, else the default.
    seed : int
        Seed of the generated volume.
    """

    shape: Optional[Tuple[int, int, int]] = None
    seed: int = 0

    def path(self, cache_dir=None, demo_shape=None) -> Path:
        shape = self.shape if self.shape is not None else demo_shape
        kwargs = {} if shape is None else {"shape": tuple(shape)}
        return demo_volume_path(cache_dir=cache_dir, seed=self.seed, **kwargs)

    def to_yaml(self) -> dict:
        out: Dict[str, Any] = {"builtin": "demo"}
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.seed:
            out["seed"] = self.seed
        return out


@dataclass(frozen=True)
class VolumeSpec:
    """One HDF5 dataset: an absolute file path (or the built-in volume) and the dataset inside it.

    ``shared_file`` (not compared) records that the file came from the sample's ``file`` key, for messages.
    """

    file: Union[Path, Builtin]
    dataset: str
    shared_file: bool = field(default=False, compare=False, repr=False)

    def to_yaml(self) -> dict:
        file = self.file.to_yaml() if isinstance(self.file, Builtin) else str(self.file)
        return {"file": file, "dataset": self.dataset}


@dataclass(frozen=True)
class SampleSpec:
    """The arguments of one :class:`~emfast.Sample`, its volumes named by file and dataset.

    ``lazy`` opens the volumes with ``in_memory=False`` (each window read through a chunk cache of
    ``cache_bytes``); otherwise they are loaded into memory.
    """

    raw: VolumeSpec
    labels: Optional[VolumeSpec] = None
    mask: Optional[VolumeSpec] = None
    extra: Tuple[Tuple[str, VolumeSpec], ...] = ()
    name: Optional[str] = None
    weight: float = 1.0
    label_offset: Optional[Tuple[int, int, int]] = None
    mask_offset: Optional[Tuple[int, int, int]] = None
    lazy: bool = False
    cache_bytes: Optional[int] = None

    def volumes(self) -> List[Tuple[Tuple[str, ...], VolumeSpec]]:
        """(key path within the sample, volume) of every volume, raw first."""
        named = [(("raw",), self.raw), (("labels",), self.labels), (("mask",), self.mask)]
        named += [(("extra", key), volume) for key, volume in self.extra]
        return [(key, volume) for key, volume in named if volume is not None]

    def to_yaml(self) -> dict:
        out: Dict[str, Any] = {}
        if self.name is not None:
            out["name"] = self.name
        out["raw"] = self.raw.to_yaml()
        for key in ("labels", "mask"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key).to_yaml()
        if self.extra:
            out["extra"] = {key: volume.to_yaml() for key, volume in self.extra}
        defaults = SampleSpec(self.raw)
        for key in ("weight", "label_offset", "mask_offset", "lazy", "cache_bytes"):
            value = getattr(self, key)
            if value != getattr(defaults, key):
                out[key] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class ComponentSpec:
    """An augmentation, target or sampler: its registered name and the keyword arguments of its constructor."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_yaml(self):
        return {self.name: dict(self.params)} if self.params else self.name


@dataclass(frozen=True)
class Validation:
    """Overrides for the loader of the held-out samples: loader keyword arguments, augmentations, targets and
    sampler (None: as for training). ``epoch_size`` is not inherited; see :meth:`Config.loader`."""

    loader: Mapping[str, Any] = field(default_factory=dict)
    augment: Optional[Tuple[ComponentSpec, ...]] = None
    targets: Optional[Tuple[ComponentSpec, ...]] = None
    sampler: Optional[ComponentSpec] = None

    def to_yaml(self) -> dict:
        out: Dict[str, Any] = {}
        if self.loader:
            out["loader"] = _plain(dict(self.loader))
        for key in ("augment", "targets"):
            if getattr(self, key) is not None:
                out[key] = [item.to_yaml() for item in getattr(self, key)]
        if self.sampler is not None:
            out["sampler"] = self.sampler.to_yaml()
        return out


def _plain(value):
    """Tuples as lists, for YAML."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# -- registries, read at run time so that every registered augmentation/target/sampler is accepted ---------------

def _samplers() -> Dict[str, type]:
    found: Dict[str, type] = {}
    pending = list(Sampler.__subclasses__())
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        if "name" in cls.__dict__ and not inspect.isabstract(cls):
            found[cls.name] = cls
    return found


_KINDS = {
    "augment": ("augmentation", lambda: _augment.REGISTRY),
    "targets": ("target", lambda: _targets.REGISTRY),
    "sampler": ("sampler", _samplers),
}

# Loader arguments that have their own section of the config, or belong to each sample.
_NOT_LOADER_KEYS = {"self", "data", "labels", "augment", "targets", "sampler", "label_offset"}


def _loader_keys() -> List[str]:
    return [name for name in inspect.signature(Loader.__init__).parameters if name not in _NOT_LOADER_KEYS]


def _loader_default(name: str):
    return inspect.signature(Loader.__init__).parameters[name].default


# -- checking values ----------------------------------------------------------------------------------------------

class _Reader:
    """Checks values of the parsed document, raising ConfigError with key path and line."""

    def __init__(self, marks: Dict[Path_, int], source: str, base: Path) -> None:
        self.marks, self.source, self.base = marks, source, base

    def line(self, path: Path_) -> Optional[int]:
        for end in range(len(path), -1, -1):
            if path[:end] in self.marks:
                return self.marks[path[:end]]
        return None

    def error(self, path: Path_, reason: str) -> ConfigError:
        return ConfigError(reason, _format_path(path), self.line(path), self.source)

    def mapping(self, value, path: Path_, allowed: Sequence[str], required: Sequence[str] = ()) -> dict:
        if not isinstance(value, dict):
            raise self.error(path, f"expected a mapping with keys {', '.join(allowed)}; got {_describe(value)}")
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
            raise self.error(path, f"expected an integer{bound}, got {_describe(value)}")
        return value

    def number(self, value, path: Path_, positive: bool = False) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                or (positive and value <= 0):
            raise self.error(path, f"expected a {'positive' if positive else 'finite'} number, got "
                                   f"{_describe(value)}")
        return value

    def boolean(self, value, path: Path_) -> bool:
        if not isinstance(value, bool):
            raise self.error(path, f"expected true or false, got {_describe(value)}")
        return value

    def string(self, value, path: Path_) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(path, f"expected a non-empty string, got {_describe(value)}")
        return value

    def triple(self, value, path: Path_, minimum: Optional[int] = None) -> Tuple[int, int, int]:
        items = value if isinstance(value, list) else None
        if items is None or len(items) != 3 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                       and (minimum is None or v >= minimum) for v in items):
            kind = "integers" if minimum is None else f"integers >= {minimum}"
            raise self.error(path, f"expected a list of 3 {kind} [z, y, x], got {_describe(value)}")
        return tuple(items)

    def listing(self, value, path: Path_) -> list:
        if not isinstance(value, list):
            raise self.error(path, f"expected a list, got {_describe(value)}")
        return value


def _describe(value) -> str:
    kind = {dict: "a mapping", list: "a list", str: "the string", bool: "the boolean", type(None): "nothing (null)",
            int: "the integer", float: "the number"}.get(type(value), type(value).__name__)
    if isinstance(value, (dict, list)):
        text = repr(value)
        return f"{kind} {text if len(text) < 60 else text[:57] + '...'}"
    return kind if value is None else f"{kind} {value!r}"


# -- parsing the sections -----------------------------------------------------------------------------------------

_SAMPLE_KEYS = ("name", "file", "raw", "labels", "mask", "extra", "weight", "label_offset", "mask_offset", "lazy",
                "cache_bytes")


def _file(reader: _Reader, value, path: Path_) -> Union[Path, Builtin]:
    if isinstance(value, dict):
        reader.mapping(value, path, ("builtin", "shape", "seed"), required=("builtin",))
        if value["builtin"] != "demo":
            raise reader.error(path + ("builtin",), f"the only built-in volume is 'demo', got "
                                                    f"{_describe(value['builtin'])}")
        shape = value.get("shape")
        return Builtin(None if shape is None else reader.triple(shape, path + ("shape",), minimum=8),
                       reader.integer(value.get("seed", 0), path + ("seed",), minimum=0))
    text = reader.string(value, path)
    file = Path(text).expanduser()
    return (file if file.is_absolute() else reader.base / file).resolve()


def _volume(reader: _Reader, value, path: Path_, sample_file) -> VolumeSpec:
    if isinstance(value, str):
        if sample_file is None:
            raise reader.error(path, f"{value!r} names a dataset, but the sample has no 'file'; write "
                                     "{file: ..., dataset: ...} or give the sample a file")
        return VolumeSpec(sample_file, value, shared_file=True)
    reader.mapping(value, path, ("file", "dataset"), required=("dataset",) if sample_file else ("file", "dataset"))
    dataset = reader.string(value["dataset"], path + ("dataset",))
    if "file" in value:
        return VolumeSpec(_file(reader, value["file"], path + ("file",)), dataset)
    return VolumeSpec(sample_file, dataset, shared_file=True)


def _sample(reader: _Reader, value, path: Path_) -> SampleSpec:
    reader.mapping(value, path, _SAMPLE_KEYS, required=("raw",))
    file = _file(reader, value["file"], path + ("file",)) if "file" in value else None
    volumes = {key: _volume(reader, value[key], path + (key,), file) for key in ("raw", "labels", "mask")
               if value.get(key) is not None}
    extra = value.get("extra") or {}
    if not isinstance(extra, dict):
        raise reader.error(path + ("extra",), f"expected a mapping of field name to volume, got {_describe(extra)}")
    extra = tuple((reader.string(key, path + ("extra",)), _volume(reader, item, path + ("extra", str(key)), file))
                  for key, item in extra.items())
    optional = {}
    if value.get("name") is not None:
        optional["name"] = reader.string(value["name"], path + ("name",))
    if "weight" in value:
        optional["weight"] = reader.number(value["weight"], path + ("weight",), positive=True)
    for key in ("label_offset", "mask_offset"):
        if value.get(key) is not None:
            optional[key] = reader.triple(value[key], path + (key,))
    if "lazy" in value:
        optional["lazy"] = reader.boolean(value["lazy"], path + ("lazy",))
    if value.get("cache_bytes") is not None:
        optional["cache_bytes"] = reader.integer(value["cache_bytes"], path + ("cache_bytes",), minimum=1)
        if not optional.get("lazy"):
            raise reader.error(path + ("cache_bytes",), "cache_bytes applies to lazy volumes; add lazy: true")
    for key, offset in (("label_offset", "labels"), ("mask_offset", "mask")):
        if key in optional and offset not in volumes:
            raise reader.error(path + (key,), f"{key} was given but the sample has no {offset}")
    return SampleSpec(extra=extra, **volumes, **optional)


def _check_normalize(reader: _Reader, value, path: Path_):
    if value is None or (isinstance(value, str) and value in NORMALIZE_MODES):
        return value
    if isinstance(value, list) and len(value) == 2:
        for index, item in enumerate(value):
            reader.number(item, path + (index,))
        return value
    if isinstance(value, dict):
        reader.mapping(value, path, ("mean", "std"), required=("mean", "std"))
        reader.number(value["mean"], path + ("mean",))
        reader.number(value["std"], path + ("std",), positive=True)
        return value
    modes = ", ".join(repr(mode) for mode in NORMALIZE_MODES)
    raise reader.error(path, f"expected one of {modes}, [scale, shift] or {{mean: m, std: s}}; got "
                             f"{_describe(value)}")


def _check_loader_value(reader: _Reader, key: str, value, path: Path_):
    """Type-check the Loader arguments whose types are known here; the Loader checks the rest when built."""
    path = path + (key,)
    positive = {"batch_size": 1, "threads": 1, "world_size": 1, "rank": 0, "seed": 0}
    if key in ("patch", "patch_in", "patch_out"):
        return list(reader.triple(value, path, minimum=1))
    if key in positive:
        return reader.integer(value, path, minimum=positive[key])
    if key == "epoch_size":
        return None if value is None else reader.integer(value, path, minimum=1)
    if key in ("buffers", "max_buffers"):
        return None if value is None else reader.integer(value, path, minimum=2)
    if key in ("dtype", "device"):
        return reader.string(value, path)
    if key == "isotropic":
        return reader.boolean(value, path)
    if key == "normalize":
        return _check_normalize(reader, value, path)
    return value


def _loader_section(reader: _Reader, value, path: Path_, require_patch: bool) -> Dict[str, Any]:
    keys = _loader_keys()
    reader.mapping(value, path, keys)
    if require_patch and not {"patch", "patch_in", "patch_out"} & set(value):
        raise reader.error(path, "missing required key 'patch' (or 'patch_in' and 'patch_out')")
    return {key: _check_loader_value(reader, key, item, path) for key, item in value.items()}


def _signature_parameters(cls: type) -> Optional[List[str]]:
    """Keyword parameters of ``cls``'s constructor; None if it takes ``**kwargs``."""
    parameters = list(inspect.signature(cls).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                      inspect.Parameter.KEYWORD_ONLY)]


def _named_key(error: BaseException, keys) -> Tuple[str, ...]:
    """The one key of ``keys`` that the message of ``error`` names as a word, if it names exactly one."""
    named = [key for key in keys if re.search(rf"\b{re.escape(str(key))}\b", str(error))]
    return (str(named[0]),) if len(named) == 1 else ()


def _construct(reader: _Reader, spec: ComponentSpec, section: str, path: Path_):
    """Build the object of ``spec`` from its registry, mapping constructor errors to ConfigError at ``path``."""
    kind, registry = _KINDS[section][0], _KINDS[section][1]()
    cls = registry[spec.name]
    try:
        return cls(**spec.params)
    except (TypeError, ValueError) as error:
        where = path + (spec.name,) + _named_key(error, spec.params)
        allowed = _signature_parameters(cls)
        note = "" if allowed is None or not isinstance(error, TypeError) else \
            f" (parameters of {kind} {spec.name!r}: {', '.join(allowed) or 'none'})"
        raise reader.error(where, f"{error}{note}") from error


def _component(reader: _Reader, value, path: Path_, section: str) -> ComponentSpec:
    kind, registry = _KINDS[section][0], _KINDS[section][1]()
    if isinstance(value, str):
        name, params, params_path = value, {}, path
    elif isinstance(value, dict) and len(value) == 1:
        name, params = next(iter(value.items()))
        params_path = path + (str(name),)
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise reader.error(params_path, f"the parameters of {kind} {name!r} must be a mapping "
                                            f"{{parameter: value}}, got {_describe(params)}")
    else:
        raise reader.error(path, f"expected a {kind} name, or a mapping {{name: {{parameter: value}}}} with one "
                                 f"name; got {_describe(value)}")
    if not isinstance(name, str) or name not in registry:
        close = difflib.get_close_matches(str(name), registry, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise reader.error(params_path, f"unknown {kind} {name!r}{hint} (known: {', '.join(sorted(registry))})")
    allowed = _signature_parameters(registry[name])
    for key in params:
        if allowed is not None and key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise reader.error(params_path + (str(key),),
                               f"unknown parameter {key!r} of {kind} {name!r}{hint} (parameters: "
                               f"{', '.join(allowed) or 'none'})")
    spec = ComponentSpec(name, params)
    _construct(reader, spec, section, path)
    return spec


def _components(reader: _Reader, value, path: Path_, section: str) -> Tuple[ComponentSpec, ...]:
    if isinstance(value, (str, dict)):
        value = [value]  # a single item
    items = tuple(_component(reader, item, path + (index,), section)
                  for index, item in enumerate(reader.listing(value, path)))
    if section == "targets":
        try:
            _targets.outputs([_construct(reader, item, section, path) for item in items])
        except ValueError as error:
            raise reader.error(path, str(error)) from error
    return items


def _check_augment(reader: _Reader, items: Optional[Tuple[ComponentSpec, ...]], isotropic: bool,
                   path: Path_) -> None:
    for index, item in enumerate(items or ()):
        try:
            _construct(reader, item, "augment", path + (index,)).check(isotropic)
        except ValueError as error:
            raise reader.error(path + (index,), str(error)) from error


@dataclass(frozen=True)
class Config:
    """A parsed config: the samples, the Loader's keyword arguments, and the specifications of augmentations,
    targets and sampler. Build objects from it with :meth:`dataset`, :meth:`loader` and the like.

    Two configs are equal when they describe the same objects (line numbers and the source file do not count).

    Attributes
    ----------
    samples : tuple of SampleSpec
    hold_out : tuple of str
        Names of the samples of the validation set (empty: no validation set).
    loader_args : mapping
        Keyword arguments of :class:`~emfast.Loader` (the ``loader`` section).
    augment, targets : tuple of ComponentSpec, or None
        None: the Loader's default.
    sampler : ComponentSpec or None
        None: :class:`~emfast.Uniform`.
    validation : Validation
        Overrides for the validation loader.
    """

    samples: Tuple[SampleSpec, ...]
    loader_args: Mapping[str, Any]
    hold_out: Tuple[str, ...] = ()
    augment: Optional[Tuple[ComponentSpec, ...]] = None
    targets: Optional[Tuple[ComponentSpec, ...]] = None
    sampler: Optional[ComponentSpec] = None
    validation: Validation = Validation()
    source: str = field(default="<text>", compare=False)
    marks: Mapping[Path_, int] = field(default_factory=dict, compare=False, repr=False)

    # -- building ----------------------------------------------------------------------------------------------

    def _reader(self) -> _Reader:
        return _Reader(dict(self.marks), self.source, Path.cwd())

    def split_samples(self, split: str = "train") -> List[Tuple[int, SampleSpec]]:
        """(index in :attr:`samples`, sample) of the samples of ``split`` ("train" or "validation")."""
        if split not in ("train", "validation"):
            raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
        if split == "validation" and not self.hold_out:
            raise self._reader().error(("data",), "no validation set: data.hold_out names no sample")
        held = set(self.hold_out)
        names = [spec.name for spec in self.samples]
        return [(i, spec) for i, spec in enumerate(self.samples) if (names[i] in held) == (split == "validation")]

    def _open(self, index: int, spec: SampleSpec, cache_dir, demo_shape) -> Sample:
        reader = self._reader()
        path = ("data", "samples", index)
        opened: List[Volume] = []
        volumes: Dict[Tuple[str, ...], Volume] = {}
        try:
            for key, volume in spec.volumes():
                file = volume.file.path(cache_dir, demo_shape) if isinstance(volume.file, Builtin) else volume.file
                try:
                    opened.append(hdf5(file, volume.dataset, in_memory=not spec.lazy, cache_bytes=spec.cache_bytes))
                except OSError as error:
                    raise reader.error(path + (("file",) if volume.shared_file else key + ("file",)),
                                       str(error)) from error
                except (KeyError, TypeError, ValueError) as error:
                    raise reader.error(path + key + ("dataset",), str(error)) from error
                volumes[key] = opened[-1]
            try:
                return Sample(volumes[("raw",)], volumes.get(("labels",)), volumes.get(("mask",)),
                              extra={key[1]: v for key, v in volumes.items() if key[0] == "extra"},
                              name=spec.name, weight=spec.weight, label_offset=spec.label_offset,
                              mask_offset=spec.mask_offset)
            except (TypeError, ValueError) as error:
                raise reader.error(path, str(error)) from error
        except BaseException:
            for volume in opened:
                volume.close()
            raise

    def dataset(self, split: str = "train", *, cache_dir=None, demo_shape=None) -> Dataset:
        """Open the volumes of the samples of ``split`` and return them as a :class:`~emfast.Dataset`.

        Parameters
        ----------
        split : {"train", "validation"}
            The samples not held out, or the held-out ones.
        cache_dir, demo_shape
            Where the built-in volume is generated (default: ``$EMFAST_CACHE_DIR``, else ``~/.cache/emfast``)
            and its shape when its ``file`` names none.

        Raises
        ------
        ConfigError
            A missing file or dataset, unsupported data, misaligned volumes, inconsistent samples.
        """
        samples: List[Sample] = []
        try:
            for index, spec in self.split_samples(split):
                samples.append(self._open(index, spec, cache_dir, demo_shape))
            try:
                return Dataset(samples)
            except (TypeError, ValueError) as error:
                raise self._reader().error(("data", "samples"), str(error)) from error
        except BaseException:
            close_volumes(samples)
            raise

    def loader_kwargs(self, split: str = "train") -> Dict[str, Any]:
        """The keyword arguments of the :class:`~emfast.Loader` of ``split``, with augmentations, targets and
        sampler built.

        The validation loader takes the training arguments, overridden by ``validation.loader``, except
        ``epoch_size``: that comes from ``validation.loader`` only, else from the sampler if it has a finite
        epoch (such as ``tiled``), else from the training loader.
        """
        reader = self._reader()
        kwargs = dict(self.loader_args)
        augment, targets, sampler = self.augment, self.targets, self.sampler
        section = {"augment": ("augment",), "targets": ("targets",), "sampler": ("sampler",)}
        if split == "validation":
            kwargs.update(self.validation.loader)
            for key in ("augment", "targets", "sampler"):
                if getattr(self.validation, key) is not None:
                    section[key] = ("validation", key)
            augment = self.validation.augment if self.validation.augment is not None else augment
            targets = self.validation.targets if self.validation.targets is not None else targets
            sampler = self.validation.sampler if self.validation.sampler is not None else sampler
        elif split != "train":
            raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
        if augment is not None:
            kwargs["augment"] = [_construct(reader, item, "augment", section["augment"] + (i,))
                                 for i, item in enumerate(augment)]
        if targets is not None:
            kwargs["targets"] = [_construct(reader, item, "targets", section["targets"] + (i,))
                                 for i, item in enumerate(targets)]
        if sampler is not None:
            kwargs["sampler"] = _construct(reader, sampler, "sampler", section["sampler"])
            finite = type(kwargs["sampler"]).batches_per_epoch is not Sampler.batches_per_epoch
            if split == "validation" and finite and "epoch_size" not in self.validation.loader:
                kwargs.pop("epoch_size", None)
        return kwargs

    def loader(self, split: str = "train", *, cache_dir=None, demo_shape=None) -> Loader:
        """Build the (not yet started) :class:`~emfast.Loader` of ``split`` ("train" or "validation").

        Opens the volumes (see :meth:`dataset`), builds augmentations, targets and sampler, and binds the
        sampler (its index is built here). Close it, or use it in a ``with`` block, as any Loader.

        Raises
        ------
        ConfigError
            Anything the Loader refuses (a patch larger than a volume, a sampler without the data it needs,
            ...), with the key path of the section it comes from.
        """
        kwargs = self.loader_kwargs(split)
        dataset = self.dataset(split, cache_dir=cache_dir, demo_shape=demo_shape)
        try:
            return Loader(dataset, **kwargs)
        except (TypeError, ValueError, KeyError, OSError) as error:
            close_volumes(dataset.samples)
            culprit = next((key for key, cls in (("sampler", Sampler), ("targets", _targets.Target),
                                                 ("augment", _augment.Augmentation)) if _raised_by(error, cls)),
                           "loader")
            overridden = {"loader": bool(self.validation.loader), "sampler": self.validation.sampler is not None,
                          "targets": self.validation.targets is not None,
                          "augment": self.validation.augment is not None}
            section = ("validation", culprit) if split == "validation" and overridden[culprit] else (culprit,)
            if culprit == "loader":
                section += _named_key(error, self.validation.loader if len(section) == 2 else self.loader_args)
            raise self._reader().error(section, str(error)) from error
        except BaseException:
            close_volumes(dataset.samples)
            raise

    # -- writing -----------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The config as plain data (what :func:`dump_config` writes): every file as an absolute path, defaults
        left out."""
        data: Dict[str, Any] = {"samples": [spec.to_yaml() for spec in self.samples]}
        if self.hold_out:
            data["hold_out"] = list(self.hold_out)
        out: Dict[str, Any] = {"data": data, "loader": _plain(dict(self.loader_args))}
        for key in ("augment", "targets"):
            if getattr(self, key) is not None:
                out[key] = [item.to_yaml() for item in getattr(self, key)]
        if self.sampler is not None:
            out["sampler"] = self.sampler.to_yaml()
        validation = self.validation.to_yaml()
        if validation:
            out["validation"] = validation
        return out


def close_volumes(samples) -> None:
    """Close the HDF5 files of the lazy volumes of ``samples`` (a Dataset or Samples), e.g. after a loader built by
    :meth:`Config.loader` is done (a Loader does not own its volumes)."""
    for sample in samples:
        volumes = [sample.raw, *sample.extra.values()]
        volumes += [placed.volume for placed in (sample.placed_labels, sample.placed_mask) if placed is not None]
        for volume in volumes:
            volume.close()


def _raised_by(error: BaseException, cls: type) -> bool:
    """Whether ``error`` was raised inside a method of a ``cls`` object (a sampler's bind, a target's check of
    the label dtype, ...), to name that section of the config rather than the loader."""
    trace = error.__traceback__
    while trace is not None:
        if isinstance(trace.tb_frame.f_locals.get("self"), cls):
            return True
        trace = trace.tb_next
    return False


def dump_config(config: Config, path: Union[str, os.PathLike, None] = None) -> str:
    """Write ``config`` as YAML (to ``path`` if given) and return the text.

    ``load_config(dump_config(config)) == config``; the objects built from both are equivalent.
    """
    text = yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=None, width=120)
    if path is not None:
        Path(path).write_text(text)
    return text


def load_config(source: Union[str, os.PathLike]) -> Config:
    """Read a config from a YAML file, or from YAML text.

    Parameters
    ----------
    source : str or path-like
        A path (a path-like, or a string without a newline), or YAML text (a string with a newline). Relative
        file names in the config resolve against the config file's folder (for text: the working directory).

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        Naming the key path and line of the culprit: invalid YAML or a disallowed tag, an unknown key (with the
        closest valid one), a value of the wrong type, a missing required key, an unknown augmentation, target or
        sampler or parameter (with the allowed ones), a parameter value its constructor refuses, a held-out name
        that matches no sample. Files are not opened here; :meth:`Config.loader` reports those problems.
    """
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source):
        path = Path(source).expanduser()
        try:
            text = path.read_text()
        except OSError as error:
            raise ConfigError(f"cannot read the config file: {error.strerror or error}", source=str(path)) from None
        return _load(text, str(path), path.resolve().parent)
    if not isinstance(source, str):
        raise TypeError(f"load_config takes a path or YAML text, got {type(source).__name__}")
    return _load(source, "<text>", Path.cwd())


def _load(text: str, source: str, base: Path) -> Config:
    document, marks = _parse(text, source)
    reader = _Reader(marks, source, base)
    reader.mapping(document, (), ("data", "loader", "augment", "targets", "sampler", "validation"),
                   required=("data", "loader"))
    data = reader.mapping(document["data"], ("data",), ("samples", "hold_out"), required=("samples",))
    items = reader.listing(data["samples"], ("data", "samples"))
    if not items:
        raise reader.error(("data", "samples"), "expected at least one sample")
    samples = tuple(_sample(reader, item, ("data", "samples", i)) for i, item in enumerate(items))
    hold_out = data.get("hold_out") or []
    hold_out = [hold_out] if isinstance(hold_out, str) else reader.listing(hold_out, ("data", "hold_out"))
    names = [spec.name for spec in samples]
    for index, name in enumerate(hold_out):
        reader.string(name, ("data", "hold_out", index))
        if name not in names:
            named = [n for n in names if n is not None]
            raise reader.error(("data", "hold_out", index),
                               f"{name!r} matches no sample; sample names: {', '.join(map(repr, named)) or 'none'}"
                               + ("" if len(named) == len(names) else " (give every sample a name)"))
    if hold_out and len(set(hold_out)) == len(samples):
        raise reader.error(("data", "hold_out"), "holds out every sample; leave at least one for training")

    loader_args = _loader_section(reader, document["loader"], ("loader",), require_patch=True)
    isotropic = loader_args.get("isotropic", _loader_default("isotropic"))
    parts: Dict[str, Any] = {}
    for key in ("augment", "targets"):
        if document.get(key) is not None:
            parts[key] = _components(reader, document[key], (key,), key)
    _check_augment(reader, parts.get("augment"), isotropic, ("augment",))
    if document.get("sampler") is not None:
        parts["sampler"] = _component(reader, document["sampler"], ("sampler",), "sampler")

    validation = Validation()
    if document.get("validation") is not None:
        if not hold_out:
            raise reader.error(("validation",), "validation settings need held-out samples: add data.hold_out")
        section = reader.mapping(document["validation"], ("validation",), ("loader", "augment", "targets",
                                                                           "sampler"))
        overrides: Dict[str, Any] = {}
        if section.get("loader") is not None:
            overrides["loader"] = _loader_section(reader, section["loader"], ("validation", "loader"), False)
        for key in ("augment", "targets"):
            if section.get(key) is not None:
                overrides[key] = _components(reader, section[key], ("validation", key), key)
        _check_augment(reader, overrides.get("augment"), {**loader_args, **overrides.get("loader", {})}.get(
            "isotropic", isotropic), ("validation", "augment"))
        if section.get("sampler") is not None:
            overrides["sampler"] = _component(reader, section["sampler"], ("validation", "sampler"), "sampler")
        validation = Validation(**overrides)
    return Config(samples=samples, loader_args=loader_args, hold_out=tuple(hold_out), validation=validation,
                  source=source, marks=marks, **parts)


# -- the summary of `emfast check` --------------------------------------------------------------------------------

#: Most label voxels looked at per sample for the label census of :func:`describe`.
CENSUS_VOXELS = 1 << 20


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def _tuple(values) -> str:
    return "(" + ", ".join(f"{v:g}" if isinstance(v, float) else str(int(v)) for v in values) + ")"


def _volume_line(role: str, volume: Volume) -> str:
    parts = [f"  {role:<8} {volume.name}", f"shape {_tuple(volume.shape)}", str(volume.dtype)]
    if volume.channels > 1:
        parts.append(f"{volume.channels} channels")
    parts.append(f"chunks {_tuple(volume.chunks)}" if volume.chunks else "contiguous")
    if volume.resolution is not None:
        parts.append(f"resolution {_tuple(volume.resolution)}")
    if volume.in_memory:
        parts.append(f"in memory {_size(volume.nbytes)}")
    else:
        parts.append(f"lazy, chunk cache {_size(volume.cache_stats.budget_bytes)}")
    return ", ".join(parts)


def _placement(raw: Volume, placed) -> str:
    lo = np.maximum(placed.origin, 0)
    hi = np.minimum(placed.end, np.asarray(raw.shape))
    overlap = np.maximum(hi - lo, 0)
    fraction = float(np.prod(overlap)) / float(np.prod(raw.shape))
    return (f"           origin {_tuple(placed.origin)} in raw voxels; overlap with raw {_tuple(overlap)} "
            f"= {100 * fraction:.1f}% of raw")


def _label_census(labels: Volume) -> str:
    """Background fraction and distinct ids from a strided subsample (in memory) or the central box (lazy)."""
    shape = np.asarray(labels.shape)
    if labels.in_memory:
        step = max(1, math.ceil((float(np.prod(shape)) / CENSUS_VOXELS) ** (1 / 3)))
        data = labels.array[0][::step, ::step, ::step]
        how = f"a subsample with step {step} along each axis" if step > 1 else "every voxel"
    else:
        extent = np.minimum(shape, [32, 128, 128])
        corner = (shape - extent) // 2
        out = np.empty((labels.channels,) + tuple(int(e) for e in extent), labels.dtype)
        data = labels.read_box(corner, extent, out)[0]
        how = f"the central box {_tuple(extent)}"
    background = float(np.count_nonzero(data == 0)) / data.size
    ids = len(np.unique(data))
    return f"background (id 0) {100 * background:.1f}%, {ids} distinct ids ({data.size:,} voxels: {how})"


def _windows(loader: Loader, index: int) -> str:
    region = loader.regions[index]
    raw = loader.dataset.samples[index].raw
    lo, hi = np.asarray(region.lo), np.asarray(region.hi)
    box = float(np.prod(hi - lo)) / float(np.prod(raw.shape))
    text = f"output windows lie in [{_tuple(lo)}, {_tuple(hi)}) = {100 * box:.1f}% of raw"
    sampler = loader.sampler
    if isinstance(sampler, Masked):
        # the qualifying corners of the untransposed window, from the sampler's index
        extent = tuple(int(e) for e in loader.patch_out)
        corners = sampler._corners[sampler._extents[extent]][index]
        positions = int(np.prod(np.maximum(hi - lo - np.asarray(extent) + 1, 0)))
        share = corners.total / positions if positions else 0.0
        text += f"; {sampler!r}: {100 * share:.1f}% of {positions:,} window positions qualify"
    return text


def _class_line(loader: Loader, index: int) -> Optional[str]:
    counts = getattr(loader.sampler, "class_counts", None)
    if counts is None:
        return None
    row = counts()[loader.dataset.samples[index].name]
    total = sum(row.values())
    shares = ", ".join(f"{name} {100 * count / total:.1f}%" if total else f"{name} 0" for name, count in row.items())
    return f"  classes  {shares} of {total:,} indexed centre voxels ({type(loader.sampler).__name__} sampler)"


def describe(config: Config, *, cache_dir=None, demo_shape=None) -> str:
    """Build every loader of ``config`` without streaming and summarise what it would read.

    Per sample: the volumes (file:dataset, shape, dtype, chunking, resolution, in memory or lazy), where labels
    and mask lie in raw voxels and how much of raw they cover, a label census (the sampler's class counts for a
    balanced sampler, else the background fraction and distinct ids of a subsample of at most
    :data:`CENSUS_VOXELS` voxels), and where windows can lie (for a masked sampler: the share of window positions
    its index accepts). Per loader: batch geometry, fields and components. Then the memory estimate: volumes in
    memory, batch slots, chunk-cache budgets and sampler indexes.

    Raises
    ------
    ConfigError
        Whatever :meth:`Config.loader` raises.
    """
    splits = ["train"] + (["validation"] if config.hold_out else [])
    loaders: Dict[str, Loader] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for split in splits:
                loaders[split] = config.loader(split, cache_dir=cache_dir, demo_shape=demo_shape)
        except BaseException:
            for loader in loaders.values():
                close_volumes(loader.dataset.samples)
            raise
    lines = [f"config {config.source}"]
    in_memory = slots = caches = indexes = 0
    try:
        for split, loader in loaders.items():
            for index, sample in enumerate(loader.dataset.samples):
                lines.append(f"sample {sample.name!r} ({split}, weight {sample.weight:g})")
                lines.append(_volume_line("raw", sample.raw))
                volumes = [sample.raw, *sample.extra.values()]
                for role, placed in (("labels", sample.placed_labels), ("mask", sample.placed_mask)):
                    if placed is not None:
                        lines += [_volume_line(role, placed.volume), _placement(sample.raw, placed)]
                        volumes.append(placed.volume)
                for key, volume in sample.extra.items():
                    lines.append(_volume_line(key, volume))
                classes = _class_line(loader, index)
                if classes is not None:
                    lines.append(classes)
                elif sample.placed_labels is not None:
                    lines.append("  labels   " + _label_census(sample.placed_labels.volume))
                lines.append("  windows  " + _windows(loader, index))
                in_memory += sum(v.nbytes for v in volumes if v.in_memory)
                caches += sum(v.cache_stats.budget_bytes for v in volumes if not v.in_memory)
            epoch = f"{loader.epoch_size} batches per epoch" if loader.epoch_size else "endless"
            geometry = f"patch {_tuple(loader.patch_out)}" if loader.patch_in == loader.patch_out else \
                f"patch_in {_tuple(loader.patch_in)} -> patch_out {_tuple(loader.patch_out)}"
            lines.append(f"loader ({split}): batch {loader.batch_size} x {geometry}, {loader.threads} thread(s), "
                         f"{loader.buffers} buffers (at most {loader.max_buffers}), {epoch}, seed {loader.seed}, "
                         f"device {loader.device}")
            lines.append("  augment  " + (", ".join(map(repr, loader.augmentations)) or "none"))
            lines.append("  targets  " + (", ".join(map(repr, loader.targets)) or "none"))
            lines.append(f"  sampler  {loader.sampler!r}")
            lines.append("  fields   " + ", ".join(f"{name} {_tuple(shape)} {dtype}"
                                                  for name, (shape, dtype) in loader.fields.items()))
            if loader.device == "cpu":
                slots += loader.max_buffers * loader.slot_bytes
            else:
                slots += loader.buffers * loader.slot_bytes
                lines.append(f"  device   at most {_size(loader.max_buffers * loader.slot_bytes)} of device slots "
                             "besides the page-locked host slots")
            indexes += getattr(loader.sampler, "index_nbytes", 0)
        total = in_memory + slots + caches + indexes
        lines.append(f"memory: volumes in memory {_size(in_memory)}, batch slots {_size(slots)}, chunk-cache "
                     f"budgets {_size(caches)}, sampler indexes {_size(indexes)}; total at most {_size(total)}")
        lines += [f"warning: {w.message}" for w in caught]
        lines.append("valid")
        return "\n".join(lines)
    finally:
        for loader in loaders.values():
            loader.close()
            close_volumes(loader.dataset.samples)
