"""Which backend a ``device=`` argument names: ``"cpu"``, ``"auto"``, or a registered backend's kind."""
from __future__ import annotations

import re
import warnings
from typing import Optional

from .._registry import registered
from . import _pycuda  # noqa: F401  (registers the pycuda backend as "cuda")
from ._backend import DeviceNotice, TransferBackend


class DeviceUnavailableError(RuntimeError):
    """A device named by ``device=`` cannot be used on this machine (its driver, library or GPU is missing): the
    machine's state, told in one line, not a fault of emfast. Carries ``emfast_setting = "device"``, the key a
    config error points at."""

    emfast_setting = "device"


def cuda_ordinal(device) -> Optional[int]:
    """N for ``"cuda:N"``, 0 for ``"cuda"``; None for anything else."""
    match = re.fullmatch(r"cuda(?::(\d+))?", device) if isinstance(device, str) else None
    return None if match is None else int(match.group(1) or 0)


def resolve_device(device) -> Optional[TransferBackend]:
    """The backend for ``device`` (None for the CPU).

    Parameters
    ----------
    device : str or TransferBackend
        ``"cpu"``, a registered backend's kind (``"cuda"``, device 0) or kind and ordinal (``"cuda:N"``),
        ``"auto"`` (device 0 of the first usable backend that offers itself to auto, else the CPU with a
        :class:`DeviceNotice`), or a backend object.

    Raises
    ------
    ValueError
        For a string that names no device.
    DeviceUnavailableError
        For a device that cannot be used (a RuntimeError); the message says what is missing.
    """
    if isinstance(device, TransferBackend):
        return device
    backends = registered("backend")
    match = re.fullmatch(r"(\w+)(?::(\d+))?", device) if isinstance(device, str) else None
    if match is None or (match.group(2) is not None and match.group(1) not in backends) or \
            match.group(1) not in ("cpu", "auto", *backends):
        named = ", ".join(["'cpu'"] + [f"'{kind}', '{kind}:N'" for kind in backends])
        raise ValueError(f"device must be {named} or 'auto', got {device!r}")
    kind, ordinal = match.group(1), int(match.group(2) or 0)
    if kind == "cpu":
        return None
    if kind == "auto":
        reasons = []
        for backend in (b for b in backends.values() if b.auto):
            reason = backend.unavailable(0)
            if reason is None:
                return backend(0)
            reasons.append(reason)
        warnings.warn(f"emfast: device='auto' uses the CPU: {'; '.join(reasons) or 'no device backend'}",
                      DeviceNotice, stacklevel=3)
        return None
    reason = backends[kind].unavailable(ordinal)
    if reason is not None:
        raise DeviceUnavailableError(f"device={device!r} cannot be used: {reason}")
    return backends[kind](ordinal)
