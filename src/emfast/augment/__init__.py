"""Augmentations: the protocol and its capabilities (``_base``), the 48 axis transforms (``_dihedral``), warps
(``_warp``, with their geometry in ``_geometry`` and the warp kernels' API in ``_resample``), intensity changes
(``_intensity``), section defects (``_defects``) and changes of the labels (``_labels``).

Every augmentation registers its name (``emfast._registry``), so the loader and configs accept it by name.

May import: ``emfast._core``, ``emfast._registry``, ``emfast._checks``, ``emfast.io``.
"""
from ._base import (Augmentation, AugmentationLike, Params, Patches, Windows, check_fills, check_voxel_sizes,
                    reachable_permutations, resolve)
from ._defects import Artifacts, LowContrast, MissingSection, Slip
from ._dihedral import Mirror, Transpose
from ._geometry import WarpPlan
from ._intensity import Blur, Contrast, Gamma, Intensity, Noise
from ._labels import GrowBoundary
from ._resample import warp_labels, warp_raw
from ._warp import Elastic, Rotate, Scale

#: The full default augmentation list for anisotropic EM training, by name (each with its default parameters):
#: geometry (dihedral, rotation about z, elastic), intensity, and section defects. ``Loader(augment=FULL)``.
FULL = ("mirror", "transpose", "rotate", "elastic", "intensity", "gamma", "contrast", "noise", "blur",
        "missing_section", "low_contrast", "slip")

__all__ = [
    "FULL",
    "Artifacts",
    "Augmentation",
    "AugmentationLike",
    "Blur",
    "Contrast",
    "Elastic",
    "Gamma",
    "GrowBoundary",
    "Intensity",
    "LowContrast",
    "Mirror",
    "MissingSection",
    "Noise",
    "Params",
    "Patches",
    "Rotate",
    "Scale",
    "Slip",
    "Transpose",
    "Windows",
    "check_fills",
    "check_voxel_sizes",
    "reachable_permutations",
    "resolve",
]
