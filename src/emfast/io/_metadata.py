"""The checks every format's metadata parsing uses, so that malformed metadata of any format raises one error,
:class:`~emfast.io._source.StoreMetadataError`, naming the store, the array, the key and the value.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._source import StoreMetadataError

#: Longest value repr quoted in a metadata error.
_QUOTED = 120


def bad_metadata(where: str, key: str, value: Any, expected: str) -> StoreMetadataError:
    """The error for metadata key ``key`` of ``where`` (store:array and file) holding ``value``."""
    quoted = repr(value)
    quoted = quoted if len(quoted) <= _QUOTED else quoted[:_QUOTED] + "..."
    return StoreMetadataError(f"{where}: malformed metadata: {key} = {quoted}; expected {expected}")


def metadata_key(meta: Any, key: str, where: str, parent: str = "") -> Any:
    """``meta[key]``, or a StoreMetadataError if ``meta`` is not a JSON object or has no ``key``."""
    name = f"{parent}.{key}" if parent else key
    if not isinstance(meta, Mapping):
        raise bad_metadata(where, parent or "the metadata", meta, "a JSON object")
    if key not in meta:
        raise StoreMetadataError(f"{where}: malformed metadata: {name} is missing")
    return meta[key]


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def int_list(value: Any, key: str, where: str, *, minimum: Optional[int], length: Optional[int] = None,
             lengths: Sequence[int] = ()) -> Tuple[int, ...]:
    """``value`` as a tuple of ints >= ``minimum`` (of ``length``, or one of ``lengths``), else StoreMetadataError."""
    sizes = (length,) if length is not None else tuple(lengths)
    low = -2 ** 62 if minimum is None else minimum
    ok = (isinstance(value, (list, tuple)) and (not sizes or len(value) in sizes)
          and all(_is_int(v) and low <= v < 2 ** 62 for v in value))
    if not ok:
        count = " or ".join(str(n) for n in sizes) + " " if sizes else ""
        at_least = "" if minimum is None else f" >= {minimum}"
        raise bad_metadata(where, key, value, f"a list of {count}integers{at_least}")
    return tuple(int(v) for v in value)


def number_list(value: Any, key: str, where: str, *, length: int, positive: bool = False) -> Tuple[float, ...]:
    """``value`` as a tuple of ``length`` finite numbers (> 0 with ``positive``), else StoreMetadataError."""
    ok = (isinstance(value, (list, tuple)) and len(value) == length
          and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
                  and np.isfinite(v) and (v > 0 or not positive) for v in value))
    if not ok:
        raise bad_metadata(where, key, value, f"a list of {length} finite {'positive ' if positive else ''}numbers")
    return tuple(float(v) for v in value)


@contextlib.contextmanager
def parsing(where: str) -> Iterator[None]:
    """Turn any error that parsing metadata raises (a key missing deeper down, a value of the wrong type) into a
    StoreMetadataError naming ``where``; the named checks above catch the common cases with a better message."""
    try:
        yield
    except StoreMetadataError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError) as error:
        detail = f"key {error} is missing" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
        raise StoreMetadataError(f"{where}: malformed metadata: {detail}") from error


def deprecated_level(level: Optional[int], scale: Optional[int], where: str) -> Optional[int]:
    """The multiscale level asked for as ``level=`` or, deprecated, as ``scale=`` (a DeprecationWarning naming
    ``level=``); both given is a ValueError."""
    if scale is None:
        return level
    if level is not None:
        raise ValueError(f"{where}: give level= only (scale= is its deprecated name), got level={level!r} and "
                         f"scale={scale!r}")
    warnings.warn(f"{where}: scale= is deprecated; use level= (the same index)", DeprecationWarning, stacklevel=3)
    return scale


def zarr_text(setting) -> Any:
    """A zarr-python codec setting (an endianness, a blosc shuffle, a shard index's location) as its text: zarr
    3.1 gives enums, 3.2 on plain strings (``.value`` of one raised AttributeError, and emfast read no sharded
    store and wrote no chunk with zarr 3.4, which Python 3.12 installs)."""
    return getattr(setting, "value", setting)
