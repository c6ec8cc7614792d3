"""What windows are drawn from: the training set (:class:`Sample`, :class:`Dataset`: volumes aligned and checked
up front) and the samplers that place each example's output window in it, one module per family (:class:`Uniform`,
:class:`Masked`, :class:`Balanced`, :class:`Tiled`), each a dataclass registered by name.

May import: ``emfast._core``, ``emfast._registry``, ``emfast._checks``, ``emfast.io``.
"""
from ._balanced import Balanced
from ._base import Draw, Region, Sampler
from ._dataset import MASK_DTYPES, Dataset, Placed, Sample, as_dataset, origin_in
from ._masked import Masked
from ._resolution import FieldGrid, OnRawGrid, lcm_phase
from ._tiled import Tiled
from ._uniform import Uniform

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
