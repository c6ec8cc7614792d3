# Stub of the compiled module emfast._core.gather (gather.pyx): crop + transform + convert, in memory or chunked.
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

RAW_DTYPES: Tuple[np.dtype, ...]
FLOAT_DTYPES: Tuple[np.dtype, ...]
PAD_MODES: Tuple[str, ...]

class ChunkGrid:
    addresses: np.ndarray
    pins: np.ndarray
    stamps: np.ndarray
    chunk: Tuple[int, int, int]
    volume: Tuple[int, int, int]
    channels: int
    dtype: np.dtype
    def __init__(self, addresses: np.ndarray, chunk: Sequence[int], volume: Sequence[int], channels: int,
                 dtype: DTypeLike) -> None: ...
    def pin(self, boxes: ArrayLike, clock: int) -> Tuple[int, List[int]]: ...
    def unpin(self, boxes: ArrayLike) -> None: ...

def gather_convert(sources: Sequence[np.ndarray], corners: ArrayLike, perms: ArrayLike, flips: ArrayLike,
                   scale: ArrayLike, shift: ArrayLike, out: np.ndarray, pad: Optional[str] = None,
                   fill: Union[int, float] = 0) -> np.ndarray: ...
def gather_copy(sources: Sequence[np.ndarray], corners: ArrayLike, perms: ArrayLike, flips: ArrayLike,
                out: np.ndarray, pad: Optional[str] = None, fill: Union[int, float] = 0) -> np.ndarray: ...
def gather_chunked_convert(grids: Sequence[ChunkGrid], corners: ArrayLike, perms: ArrayLike, flips: ArrayLike,
                           scale: ArrayLike, shift: ArrayLike, out: np.ndarray) -> np.ndarray: ...
def gather_chunked_copy(grids: Sequence[ChunkGrid], corners: ArrayLike, perms: ArrayLike, flips: ArrayLike,
                        out: np.ndarray) -> np.ndarray: ...
def pad_indices(indices: np.ndarray, extent: int, mode: str) -> np.ndarray: ...
def float_to_half(values: ArrayLike) -> np.ndarray: ...
