"""Argument checks every stage shares: one way to accept an integer, a real number, a label id, a (z, y, x) triple
and a seed, one wording of the error when it is not one.

The rule every caller follows: a setting the checks refuse raises ``ValueError`` naming the setting (with its
owner, e.g. ``"Elastic: spacing"``) and the value given, whether its type or its range is wrong. Settings come as
often from a YAML config or the command line as from code, and ``ValueError`` is what ``emfast check`` and the
``emfast`` command report as the user's error in one line. ``TypeError`` is kept for objects of the wrong kind
handed over in code (an array of the wrong dtype, a volume that is neither a Volume, an array nor a path), which
a config cannot produce; the command line shows those with a traceback, as bugs.

Errors name their setting as data too: a refusal carries ``emfast_setting`` (the setting's name, without its
owner), and code that calls into a component marks what it raises with the section of the settings it concerns
(:func:`concerning`). A config reads those attributes to point at the key that caused an error, instead of
guessing from the message or the traceback."""
from __future__ import annotations

import math
import numbers
import os
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator, Optional, Tuple, Union

import numpy as np

from ._machine import cores

#: Largest coordinate magnitude accepted: products and sums of a few of them cannot overflow int64.
_INTEGER_LIMIT = 1 << 62
#: The range of ids a label setting may name: anything an int64 or a uint64 label volume can hold.
ID_RANGE = (-(2**63), 2**64 - 1)


def refusal(message: str, setting: str, section: Optional[str] = None) -> ValueError:
    """The ValueError refusing ``setting`` (its name, or ``"Owner: name"``), carrying the setting's name as
    ``emfast_setting`` (and ``section``, where the error belongs to another section than its caller's)."""
    error = ValueError(message)
    error.emfast_setting = setting.rsplit(": ", 1)[-1]
    if section is not None:
        error.emfast_section = section
    return error


@contextmanager
def concerning(section: Optional[str] = None, setting: Union[str, Tuple[str, ...], None] = None,
               item: Optional[Tuple[int, str]] = None) -> Iterator[None]:
    """Mark an error raised inside as concerning ``section`` of the settings ("sampler", "targets", "augment") or
    ``setting`` (a name, or the names it may have been given under, first match wins), and ``item``, (position,
    name) of the list entry it comes from (an augmentation or target). The innermost mark wins: a refusal naming
    its own setting keeps it."""
    try:
        yield
    except Exception as error:
        for attribute, value in (("emfast_section", section), ("emfast_setting", setting), ("emfast_item", item)):
            if value is not None and getattr(error, attribute, None) is None:
                setattr(error, attribute, value)
        raise


def concerned_key(error: BaseException, keys) -> Optional[str]:
    """The key of ``keys`` that ``error`` concerns (see :func:`concerning`), or None."""
    setting = getattr(error, "emfast_setting", None)
    candidates = (setting,) if isinstance(setting, str) else tuple(setting or ())
    return next((str(c) for c in candidates if c in keys), None)


def is_integer(value) -> bool:
    """True for Python and NumPy integers, False for bools and everything else."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(value, what: str, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``, or a ValueError naming ``what``."""
    if not is_integer(value) or value < minimum:
        raise refusal(f"{what} must be an integer >= {minimum}, got {value!r}", what)
    return int(value)


#: Threads (a loader's producers, predict's readers) beyond this many per usable core, or beyond MIN_THREAD_LIMIT on
#: small machines, are refused.
THREADS_PER_CORE = 4
MIN_THREAD_LIMIT = 16


def check_threads(threads: int) -> None:
    """Refuse thread counts far beyond the cores: the kernels release the GIL, so about one per core is fastest,
    and each thread holds buffers of its own."""
    usable = cores()
    limit = max(MIN_THREAD_LIMIT, THREADS_PER_CORE * usable)
    if threads > limit:
        raise refusal(f"threads={threads} is far beyond this machine's {usable} usable cores (at most "
                      f"{limit}): the kernels release the GIL, so about one thread per core is fastest", "threads")


def flag(value, name: str) -> bool:
    """``value`` as a bool if it is True or False (NumPy's too), else a TypeError naming the option."""
    if not isinstance(value, (bool, np.bool_)):
        error = TypeError(f"{name} must be True or False, got {value!r}")
        error.emfast_setting = name
        raise error
    return bool(value)


def is_real(value) -> bool:
    """True for Python and NumPy real numbers, False for bools and everything else."""
    return isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_))


def real(value, what: str, minimum: Optional[float] = None, strict: bool = False) -> float:
    """``value`` as a finite float (>= ``minimum``, or > with ``strict``), or a ValueError naming ``what``."""
    valid = is_real(value) and math.isfinite(value)
    if valid and minimum is not None:
        valid = value > minimum if strict else value >= minimum
    if not valid:
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        raise refusal(f"{what} must be a finite number{bound}, got {value!r}", what)
    return float(value)


def label_id(value, what: str, optional: bool = False) -> Optional[int]:
    """A label id (an integer in ``ID_RANGE``) as an int, None where ``optional``, or a ValueError naming ``what``."""
    if value is None and optional:
        return None
    if not is_integer(value) or not ID_RANGE[0] <= int(value) <= ID_RANGE[1]:
        allowed = "an integer label id or None" if optional else "an integer label id"
        raise refusal(f"{what} must be {allowed}, got {value!r}", what)
    return int(value)


def check_seed(seed: object) -> int:
    """Return ``seed`` as an int in [0, 2**64), or raise a ValueError naming it."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 1 << 64:
        raise refusal(f"seed must be an integer in [0, 2**64), got {seed!r}", "seed")
    return int(seed)


def triple(value, what: str, *, integer: bool = True, minimum: Optional[float] = None,
           strict: bool = False) -> Tuple:
    """Three numbers (z, y, x), or a ValueError naming ``what`` and the value given.

    Parameters
    ----------
    value
        Any sequence of three items (not a string).
    what : str
        The name used in the message, e.g. ``"patch"`` or ``"Elastic: spacing"``.
    integer : bool
        Integers (returned as ints, within +-2**62), else finite real numbers (returned as floats).
    minimum : number, optional
        Each item must be >= ``minimum`` (> with ``strict``).
    """
    kind = "integers" if integer else "finite numbers"
    if minimum is not None:
        kind += f" {'>' if strict else '>='} {minimum:g}"
    try:
        items = () if isinstance(value, (str, bytes)) else tuple(value)
    except TypeError:
        items = ()
    valid = len(items) == 3 and all(_accepted(v, integer) for v in items)
    if len(items) == 3 and integer and all(is_integer(v) for v in items) and not valid:
        raise refusal(f"{what} is out of range (each |value| < 2**62): {value!r}", what)
    if valid and minimum is not None:
        valid = all(v > minimum if strict else v >= minimum for v in items)
    if not valid:
        raise refusal(f"{what} must be 3 {kind} (z, y, x), got {value!r}", what)
    if integer:
        return tuple(int(v) for v in items)
    return tuple(float(v) for v in items)


def patch_window(value, what: str) -> Tuple[int, int, int]:
    """A window (z, y, x) of voxels, each >= 1, as :func:`triple` checks it; a (y, x) pair is told how to be one
    section (a 2-D patch was refused as "must be 3 integers" alone)."""
    try:
        return triple(value, what, minimum=1)
    except ValueError:
        hint = one_section(value)
        if not hint:
            raise
    raise refusal(f"{what} must be 3 integers >= 1 (z, y, x), got {value!r}{hint}", what)


def one_section(value) -> str:
    """For a window given as a valid (y, x) pair (a tuple, list or array of two integers >= 1): how it is written
    as one section; else ""."""
    try:
        items = () if isinstance(value, (str, bytes)) else tuple(value)
    except TypeError:
        return ""
    if len(items) != 2 or not all(is_integer(item) and item >= 1 for item in items):
        return ""
    return f": a 2-D patch is one section deep, (1, {int(items[0])}, {int(items[1])})"


def _accepted(item, integer: bool) -> bool:
    if integer:
        return is_integer(item) and abs(int(item)) < _INTEGER_LIMIT
    return is_real(item) and math.isfinite(item)


def warn_user(message: str, category: type = UserWarning) -> None:
    """``warnings.warn`` pointing at the first caller outside emfast (the user's ``Loader(...)`` or
    ``load_config(...).loader()``), however deep inside emfast the warning is raised, so that the user can find it
    and filter it by their own module."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 2  # stacklevel 2 is the caller, frame 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
