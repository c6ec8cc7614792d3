# Stub of the compiled module emfast._core.blend (blend.pyx): the blending kernels of prediction.
from typing import Tuple

import numpy as np

PREDICTION_DTYPES: Tuple[np.dtype, ...]
BLEND_OUTPUT_DTYPES: Tuple[np.dtype, ...]

def blend_add(sums: np.ndarray, totals: np.ndarray, weight: np.ndarray, prediction: np.ndarray) -> None: ...
def blend_finish(sums: np.ndarray, totals: np.ndarray, out: np.ndarray) -> np.ndarray: ...
