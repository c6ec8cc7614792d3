# Stub of the compiled module emfast._core.blend (blend.pyx): the blending kernels of prediction.
from typing import Optional, Sequence, Tuple

import numpy as np

Box = Tuple[Sequence[int], Sequence[int]]

PREDICTION_DTYPES: Tuple[np.dtype, ...]
BLEND_OUTPUT_DTYPES: Tuple[np.dtype, ...]
MAX_PARTS: int

def blend_add(sums: np.ndarray, weights: Sequence[np.ndarray], prediction: np.ndarray,
              first: Box = ((0, 0, 0), (0, 0, 0))) -> None: ...
def blend_finish(sums: np.ndarray, totals: Sequence[np.ndarray], count: float, out: np.ndarray) -> int: ...

class TileBlends:
    """A group of tiles checked once, then blended into a block's sums in parts, each one call without the GIL."""
    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def add(self, sums: np.ndarray, weights: Sequence[np.ndarray], prediction: np.ndarray,
            first: Box = ((0, 0, 0), (0, 0, 0)), row: int = 0, keep: Optional[np.ndarray] = None,
            kept_from: Optional[np.ndarray] = None) -> None: ...
    def run(self, part: int = 0, parts: int = 1) -> None: ...


def uses_avx2() -> bool: ...
