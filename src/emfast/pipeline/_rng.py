"""Counter-based random draws keyed by (seed, epoch, batch, example, stream).

Every random number emfast uses is a pure function of that key (Philox4x64-10, computed in C), never of a
generator's history: the same seed gives the same batches whatever the thread count, the number of buffers, or
the point a run restarts from. Each consumer of randomness (the sampler, each augmentation) reads its own stream,
so adding an augmentation does not change where windows are cut.
"""
from __future__ import annotations

import numpy as np

from .._checks import check_seed
from .._core import random as _random

#: Second key word: separates emfast's streams from other users of Philox with the same seed.
_KEY_TAG = 0x656D66617374  # "emfast"
_STREAM_BITS = 16
MAX_STREAMS = 1 << _STREAM_BITS
MAX_EPOCHS = 1 << (64 - _STREAM_BITS)

#: Stream of the window sampler; augmentation i reads stream FIRST_AUGMENT_STREAM + i.
SAMPLER_STREAM = 0
FIRST_AUGMENT_STREAM = 1


class BatchRandom:
    """Uniform draws for the examples of one batch.

    Parameters
    ----------
    seed : int
        The run's seed, in [0, 2**64).
    epoch, batch : int
        Epoch number and batch index within the epoch.
    examples : int
        Number of examples in the batch; row n of every draw belongs to example n.
    """

    def __init__(self, seed: int, epoch: int, batch: int, examples: int) -> None:
        if not 0 <= epoch < MAX_EPOCHS:
            raise ValueError(f"epoch must be in [0, 2**{64 - _STREAM_BITS}), got {epoch}")
        if not 0 <= batch < 1 << 64:
            raise ValueError(f"batch index must be in [0, 2**64), got {batch}")
        self.seed = check_seed(seed)
        self.epoch = epoch
        self.batch = batch
        self.examples = examples

    def uniform(self, stream: int, draws: int) -> np.ndarray:
        """Return a (examples, draws) float64 array of uniforms in [0, 1) from ``stream``."""
        if not 0 <= stream < MAX_STREAMS:
            raise ValueError(f"stream must be in [0, {MAX_STREAMS}), got {stream}")
        stream_word = (self.epoch << _STREAM_BITS) | stream
        return _random.uniform_batch(self.seed, _KEY_TAG, self.batch, stream_word, self.examples, draws)
