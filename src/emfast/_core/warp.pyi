# Stub of the compiled module emfast._core.warp (warp.pyx): the warp kernels (their Python API is
# emfast.augment._resample).
from typing import Optional, Sequence, Tuple

import numpy as np
from numpy.typing import ArrayLike

RAW_DTYPES: Tuple[np.dtype, ...]
FLOAT_DTYPES: Tuple[np.dtype, ...]
MAX_CENTRE: float
MAX_MATRIX: float
MAX_DISPLACEMENT: float

def warp_convert(sources: Sequence[np.ndarray], centres: ArrayLike, matrices: ArrayLike, grid: Optional[np.ndarray],
                 spacing: Optional[Sequence[float]], origin: Optional[Sequence[float]], scale: ArrayLike,
                 shift: ArrayLike, fill: float, out: np.ndarray, valid: Optional[np.ndarray] = None,
                 gather_path: bool = True) -> np.ndarray: ...
def warp_copy(sources: Sequence[np.ndarray], centres: ArrayLike, matrices: ArrayLike, grid: Optional[np.ndarray],
              spacing: Optional[Sequence[float]], origin: Optional[Sequence[float]], fill: int, out: np.ndarray,
              valid: Optional[np.ndarray] = None, gather_path: bool = True) -> np.ndarray: ...
def warp_coordinates(shape: Sequence[int], centres: ArrayLike, matrices: ArrayLike, grid: Optional[np.ndarray],
                     spacing: Optional[Sequence[float]], origin: Optional[Sequence[float]]) -> np.ndarray: ...
def uses_avx2() -> bool: ...
