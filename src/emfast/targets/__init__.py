"""Training targets computed from the augmented labels (affinities, boundaries, classes, foreground, local shape
descriptors) and loss weights balancing a target's classes, each registered by name, and :func:`compute_targets`:
the protocol in ``_base``, one module per family (``_affinities``, ``_maps``, ``_lsd``, ``_weights``), and
``_compute`` (targets by name, their fields and margin, the computation of a batch).

May import: ``emfast._core``, ``emfast._registry``, ``emfast._checks``.
"""
from ._affinities import Affinities
from ._base import Target
from ._compute import TargetLike, compute_targets, outputs, required_margin, resolve
from ._lsd import LSD
from ._maps import Boundaries, Classes, Foreground
from ._weights import ClassWeights

__all__ = [
    "Affinities",
    "Boundaries",
    "ClassWeights",
    "Classes",
    "Foreground",
    "LSD",
    "Target",
    "TargetLike",
    "compute_targets",
    "outputs",
    "required_margin",
    "resolve",
]
