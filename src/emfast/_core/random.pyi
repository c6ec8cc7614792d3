# Stub of the compiled module emfast._core.random (random.pyx): Philox4x64-10 draws.
from typing import Sequence

import numpy as np

def philox4x64(key: Sequence[int], counter: Sequence[int]) -> np.ndarray: ...
def uniform_batch(key0: int, key1: int, batch: int, stream_word: int, examples: int, draws: int) -> np.ndarray: ...
