"""How a batch is made and handed over: plans (``_plan``, with the counter-based random streams of ``_rng``), the
gatherer that cuts, augments and computes targets (``_gather``, with normalisation in ``_normalize``), the
ordered hand-off (``_ring``), batch memory lent as leases (``_pool``), per-stage timing (``_profile``), the copier
thread of a GPU loader (``_copier``), the read-ahead thread of lazy volumes (``_readahead``), snapshots of
batches to look at (``_snapshot``), window geometry (``_windows``), the :class:`Batch` the consumer gets
(``_batch``), and the :class:`Loader` that runs it all (``_loader``).

May import: every stage below it (``emfast.io``, ``emfast.sampling``, ``emfast.augment``, ``emfast.targets``,
``emfast.transfer``) and the shared modules (``emfast._core``, ``emfast._registry``, ``emfast._checks``,
``emfast._machine``).
"""
from ._batch import Batch, BatchReleasedError, MissingFieldError
from ._loader import Loader
from ._normalize import NORMALIZE_MODES, fixed_normalization, kernel_shift, normalization
from ._options import LOADER_SETTINGS, InsufficientMemoryError, chunk_cache_bytes
from ._pool import BackPressureWarning, SlotsExhaustedError
from ._profile import STAGES, ProfileReport
from ._windows import PATCH_KEYS

__all__ = ["LOADER_SETTINGS", "NORMALIZE_MODES", "PATCH_KEYS", "STAGES", "BackPressureWarning", "Batch", "BatchReleasedError",
           "InsufficientMemoryError", "Loader", "MissingFieldError", "ProfileReport", "SlotsExhaustedError",
           "chunk_cache_bytes", "fixed_normalization", "kernel_shift", "normalization"]
