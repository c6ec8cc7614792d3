# Stub of the compiled module emfast._core.rescale (rescale.pyx): fields at other voxel sizes onto raw's grid.
from typing import Sequence, Tuple

import numpy as np

LINEAR_DTYPES: Tuple[np.dtype, ...]

def rescale_nearest(src: np.ndarray, index_z: np.ndarray, index_y: np.ndarray, index_x: np.ndarray,
                    out: np.ndarray) -> np.ndarray: ...
def rescale_linear(src: np.ndarray, tables: Sequence[Tuple[np.ndarray, np.ndarray, np.ndarray]],
                   out: np.ndarray) -> np.ndarray: ...
