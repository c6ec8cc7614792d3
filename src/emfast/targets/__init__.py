"""Training targets computed from the augmented labels (affinities, boundaries, classes, foreground, local shape
descriptors), each registered by name, and :func:`compute_targets`.

May import: ``emfast._core``, ``emfast._registry``, ``emfast._checks``.
"""
from ._specs import (LSD, Affinities, Boundaries, Classes, Foreground, Target, TargetLike, compute_targets, outputs,
                     required_margin, resolve)

__all__ = [
    "Affinities",
    "Boundaries",
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
