"""Device backends: where batches live when the consumer gets them. The backend protocol and device arrays
(``_backend``), the pycuda backend (``_pycuda``), a fake device that enforces a GPU's rules in host memory
(``_fake``), and the ``device=`` argument's resolution (``_resolve``). The copier thread that drives a backend is
a pipeline stage (:mod:`emfast.pipeline._copier`).

A backend selectable by name registers with ``@register("backend")`` under its ``kind``.

May import: ``emfast._registry`` (pycuda only when a CUDA device is asked for).
"""
from ._backend import DeviceArray, DeviceNotice, Fields, TransferBackend, cuda_unavailable
from ._resolve import DeviceUnavailableError, cuda_ordinal, resolve_device

__all__ = ["DeviceArray", "DeviceNotice", "DeviceUnavailableError", "Fields", "TransferBackend", "cuda_ordinal",
           "cuda_unavailable", "resolve_device"]
