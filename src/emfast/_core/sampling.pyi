# Stub of the compiled module emfast._core.sampling (sampling.pyx): the samplers' index kernels.
from typing import Optional, Sequence, Tuple

import numpy as np
from numpy.typing import ArrayLike

LABEL_DTYPES: Tuple[np.dtype, ...]
MAX_WINDOW_VOXELS: int
NO_CLASS: int

class ClassRule:
    ids: Optional[np.ndarray]
    id_classes: Optional[np.ndarray]
    def __init__(self, n_classes: int, thickness: int = 1, in_plane: bool = False, ids: Optional[ArrayLike] = None,
                 id_classes: Optional[ArrayLike] = None) -> None: ...
    @property
    def n_classes(self) -> int: ...

def words_per_row(corners_x: int) -> int: ...
def window_bits(coverage: np.ndarray, extent: Sequence[int], threshold: int, bits: np.ndarray,
                row_counts: np.ndarray) -> int: ...
def select_bits(bits: np.ndarray, rows: ArrayLike, ranks: ArrayLike) -> np.ndarray: ...
def grid_shape(lo: Sequence[int], hi: Sequence[int], block: Sequence[int]) -> Tuple[int, ...]: ...
def count_classes(labels: np.ndarray, rule: ClassRule, lo: Sequence[int], hi: Sequence[int], block: Sequence[int],
                  counts: np.ndarray) -> np.ndarray: ...
def select_class(labels: np.ndarray, rule: ClassRule, lo: Sequence[int], hi: Sequence[int], cls: int,
                 rank: int) -> Optional[Tuple[int, int, int]]: ...
