"""The volume formats, each a registered :class:`VolumeFormat`: how ``emfast.open`` detects it from a path or URL,
how it opens it, and what ``emfast info`` lists of it.

A format joins with ``@register("format")`` (:mod:`emfast._registry`) on a :class:`VolumeFormat` subclass; the
built-in ones are in :mod:`emfast.io._format_entries`. Detection, opening and ``info`` then take it with no other
change.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Type, Union

from .._registry import lookup, registered
from ._remote import RemoteStore
from ._source import VolumeSource, require_kind
from ._volume import Volume


@dataclass
class Listed:
    """One dataset of a container as ``emfast info`` shows it.

    Attributes
    ----------
    name : str
        Its path inside the container ("" for the container itself).
    summary : str
        Shape, dtype and chunks as the format stores them (:meth:`VolumeSource.describe` for a volume).
    attributes : dict
        Attributes shown after the geometry (empty where the format shows none).
    volume : Volume or None
        The dataset opened lazily as a volume (the caller closes it), or None for a dataset emfast does not read
        as a volume.
    """

    name: str
    summary: str
    attributes: dict = field(default_factory=dict)
    volume: Optional[Volume] = None


@dataclass
class Contents:
    """What a container (or a group inside it) holds, for ``emfast info``: the container's attributes (shown
    after its path), its datasets (opened one at a time as they are iterated; the caller closes each volume) and
    the line printed when there are none."""

    attributes: dict
    datasets: Iterator[Listed]
    nothing: str = "(no arrays)"


class VolumeFormat:
    """A volume format: detection, opening and listing. Subclasses set the class attributes and override the
    class methods that apply, and register with ``@register("format")``.

    Attributes
    ----------
    name : str
        The ``format=`` value.
    suffixes : tuple of str
        Container suffixes that name the format (lower case, with the dot).
    rank : int
        Detection order for a container without a telling suffix: lower is tried first.
    multiscale : bool
        Whether ``level=`` and ``resolution=`` choose a level of it.
    """

    name = ""
    suffixes: Tuple[str, ...] = ()
    rank = 50
    multiscale = False

    @classmethod
    def detect(cls, container: Path) -> bool:
        """Whether the local ``container`` (a file or directory that exists) is of this format."""
        return False

    @classmethod
    def detect_remote(cls, store: RemoteStore, dataset: str) -> bool:
        """Whether the remote ``store`` (with ``dataset`` inside it) is of this format."""
        return False

    @classmethod
    def open(cls, where: Union[Path, RemoteStore], dataset: str, level: Optional[int],
             resolution: Optional[Sequence[float]]) -> VolumeSource:
        """The source for ``dataset`` in ``where``, a local container or a remote store."""
        raise NotImplementedError

    @classmethod
    def contents(cls, container: Path, inner: str) -> Contents:
        """What ``emfast info`` lists of ``inner`` ("" for all) in the local ``container``."""
        raise NotImplementedError


def formats() -> List[Type[VolumeFormat]]:
    """Every registered format, in detection order."""
    return sorted(registered("format").values(), key=lambda f: (f.rank, f.name))


def format_named(name: str) -> Type[VolumeFormat]:
    """The format registered as ``name``; ValueError naming the known ones otherwise."""
    if not isinstance(name, str) or name not in registered("format"):
        raise ValueError(f"format must be one of {', '.join(f.name for f in formats())}, got {name!r}")
    return lookup("format", name)


def format_of_suffix(part: str) -> Optional[str]:
    """The format whose container suffix ends ``part`` (a path component), or None."""
    suffix = Path(part).suffix.lower()
    return next((f.name for f in formats() if suffix in f.suffixes), None)


def suffixes() -> List[str]:
    return sorted(s for f in formats() for s in f.suffixes)


class UnknownFormatError(ValueError):
    """A container without a telling suffix that no format recognises."""


def _cannot_tell(where) -> UnknownFormatError:
    names = ", ".join(f.name for f in formats())
    return UnknownFormatError(f"{where}: cannot tell its format (none of {names} recognises it, or the server refuses "
                      f"their metadata files); name the container with a suffix {suffixes()} (or, in Python, "
                      "pass format= to emfast.open)")


def detect(container: Path) -> str:
    """The format of a local container without a telling suffix, from what it holds."""
    if container.exists() and not container.is_dir():
        require_kind(container, "file", "a volume's file")  # a FIFO or device: refused before anything opens it
    if not container.exists():
        raise FileNotFoundError(f"no such file or store: {container}")
    found = next((f.name for f in formats() if f.detect(container)), None)
    if found is None:
        raise _cannot_tell(container)
    return found


def detect_remote(store: RemoteStore, dataset: str) -> str:
    """The format of a remote store without a telling suffix, from the metadata files it holds."""
    found = next((f.name for f in formats() if f.detect_remote(store, dataset)), None)
    if found is None:
        raise _cannot_tell(store)
    return found
