# Stub of the compiled module emfast._core.blend (blend.pyx): the blending kernels of prediction.
from typing import Sequence, Tuple

import numpy as np

Box = Tuple[Sequence[int], Sequence[int]]

PREDICTION_DTYPES: Tuple[np.dtype, ...]
BLEND_OUTPUT_DTYPES: Tuple[np.dtype, ...]

def blend_add(sums: np.ndarray, weights: Sequence[np.ndarray], prediction: np.ndarray,
              first: Box = ((0, 0, 0), (0, 0, 0))) -> None: ...
def blend_finish(sums: np.ndarray, totals: Sequence[np.ndarray], count: float, out: np.ndarray) -> np.ndarray: ...
