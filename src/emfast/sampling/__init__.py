"""What windows are drawn from: the training set (:class:`Sample`, :class:`Dataset`: volumes aligned and checked
up front) and the samplers that place each example's output window in it (:class:`Uniform`, :class:`Masked`,
:class:`Balanced`, :class:`Tiled`), each registered by name.

May import: ``emfast._core``, ``emfast._registry``, ``emfast._checks``, ``emfast.io``.
"""
from ._dataset import MASK_DTYPES, Dataset, Placed, Sample, as_dataset, origin_in
from ._resolution import FieldGrid, OnRawGrid, lcm_phase
from ._samplers import Balanced, Draw, Masked, Region, Sampler, Tiled, Uniform

__all__ = [
    "MASK_DTYPES",
    "Balanced",
    "Dataset",
    "Draw",
    "FieldGrid",
    "Masked",
    "OnRawGrid",
    "Placed",
    "Region",
    "Sample",
    "Sampler",
    "Tiled",
    "Uniform",
    "as_dataset",
    "lcm_phase",
    "origin_in",
]
