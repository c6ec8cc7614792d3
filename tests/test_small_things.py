"""Small conveniences users reach for: ``len(loader)``, ``volume[z0:z1, y0:y1, x0:x1]`` and value statistics in
``emfast info``."""
import numpy as np
import pytest

import emfast as ef


# -- len(loader) --------------------------------------------------------------------------------------------------

def _raw(seed=0, shape=(16, 32, 32)):
    return np.random.default_rng(seed).integers(0, 255, shape, dtype=np.uint8)


def test_len_is_epoch_size_and_one_epoch_yields_that_many_batches():
    with ef.Loader(_raw(), patch=(4, 8, 8), batch_size=2, epoch_size=5, augment=()) as loader:
        assert len(loader) == 5
        assert sum(1 for _ in loader) == 5
        assert len(loader) == 5  # a length, not what is left


def test_len_of_tiled_sampler_is_its_epoch():
    # (16, 32, 32) tiled by (4, 8, 8) windows at their own stride: 4 * 4 * 4 = 64 tiles, 10 per batch -> 7 batches
    with ef.Loader(_raw(), patch=(4, 8, 8), batch_size=10, sampler=ef.Tiled(), augment=()) as loader:
        assert len(loader) == loader.sampler.batches_per_epoch() == 7
        assert sum(1 for _ in loader) == 7


def test_len_of_endless_stream_is_a_type_error_that_says_why():
    loader = ef.Loader(_raw(), patch=(4, 8, 8), batch_size=2, augment=())
    with pytest.raises(TypeError, match="endless.*epoch_size"):
        len(loader)
    loader.close()
