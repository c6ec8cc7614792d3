"""Which backend a ``device=`` argument names."""
from __future__ import annotations

import re
import warnings
from typing import Optional


from ._backend import DeviceNotice, TransferBackend, cuda_unavailable
from ._pycuda import PycudaBackend


def resolve_device(device) -> Optional[TransferBackend]:
    """The backend for ``device`` (None for the CPU).

    Parameters
    ----------
    device : str or TransferBackend
        ``"cpu"``, ``"cuda"`` (device 0), ``"cuda:N"``, ``"auto"`` (CUDA device 0 if usable, else the CPU with a
        :class:`DeviceNotice`), or a backend object.

    Raises
    ------
    ValueError
        For a string that names no device.
    RuntimeError
        For a CUDA device that cannot be used; the message says what is missing.
    """
    if isinstance(device, TransferBackend):
        return device
    match = re.fullmatch(r"(cpu|auto|cuda)(?::(\d+))?", device) if isinstance(device, str) else None
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    kind, ordinal = match.group(1), int(match.group(2) or 0)
    if kind == "cpu":
        return None
    reason = cuda_unavailable(ordinal)
    if kind == "auto":
        if reason is not None:
            warnings.warn(f"emfast: device='auto' uses the CPU: {reason}", DeviceNotice, stacklevel=3)
            return None
        return PycudaBackend(0)
    if reason is not None:
        raise RuntimeError(f"device={device!r} cannot be used: {reason}")
    return PycudaBackend(ordinal)
