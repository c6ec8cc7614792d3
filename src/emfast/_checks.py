"""Argument checks every stage shares: one way to accept an integer, a (z, y, x) triple and a seed, one wording
of the error when it is not one."""
from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple

import numpy as np

#: Largest coordinate magnitude accepted: products and sums of a few of them cannot overflow int64.
_INTEGER_LIMIT = 1 << 62


def is_integer(value) -> bool:
    """True for Python and NumPy integers, False for bools and everything else."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(value, what: str, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``, or a ValueError naming ``what``."""
    if not is_integer(value) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_seed(seed: object) -> int:
    """Return ``seed`` as an int in [0, 2**64), or raise a ValueError naming it."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 1 << 64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
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
        raise ValueError(f"{what} is out of range (each |value| < 2**62): {value!r}")
    if valid and minimum is not None:
        valid = all(v > minimum if strict else v >= minimum for v in items)
    if not valid:
        raise ValueError(f"{what} must be 3 {kind} (z, y, x), got {value!r}")
    if integer:
        return tuple(int(v) for v in items)
    return tuple(float(v) for v in items)


def _accepted(item, integer: bool) -> bool:
    if integer:
        return is_integer(item) and abs(int(item)) < _INTEGER_LIMIT
    return isinstance(item, (numbers.Real, np.floating, np.integer)) and not isinstance(item, (bool, np.bool_)) \
        and math.isfinite(item)
