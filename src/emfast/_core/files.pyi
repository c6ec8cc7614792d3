# Stub of the compiled module emfast._core.files (files.pyx): many files read, and their zstd, blosc or deflate
# frames decoded, in one call without the GIL; compressed_segmentation chunks decoded.
import os
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

FILE_READ: int
FILE_MISSING: int
FILE_NOT_REGULAR: int
FILE_FAILED: int
FILE_UNSUPPORTED: int

def read_files(paths: List[Union[str, bytes, os.PathLike]], starts: Optional[Sequence[int]] = None,
               lengths: Optional[Sequence[int]] = None, into: Optional[List[Optional[np.ndarray]]] = None,
               scratch: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                          np.ndarray]: ...

def data_addresses(arrays: List[np.ndarray]) -> np.ndarray: ...

CHUNK_FILLED: int
CHUNK_MISSING: int
CHUNK_AGAIN: int

def read_decode_files(codec: str, paths: List[Union[str, bytes, os.PathLike]], outs: List[np.ndarray],
                      scratch: Optional[np.ndarray] = None, ranges: Optional[np.ndarray] = None
                      ) -> Tuple[np.ndarray, np.ndarray, float, np.ndarray]: ...

def bind_zstd(create: int, free_context: int, decompress: int, is_error: int) -> None: ...

def bind_blosc(validate: int, decompress: int) -> None: ...

def bind_deflate(alloc: int, free_decompressor: int, gzip: int, zlib: int) -> None: ...

def decode_frames(codec: str, sources: List[Union[bytes, memoryview, np.ndarray]],
                  outs: List[np.ndarray]) -> np.ndarray: ...

def decode_compressed_segmentation(data: Union[bytes, memoryview, np.ndarray], size: Sequence[int],
                                   block: Sequence[int], channels: int, dtype: np.dtype) -> np.ndarray: ...
