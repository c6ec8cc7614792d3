"""The tiled sampler: a deterministic grid of windows covering every region, split between the shards."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence, Tuple, Union

import numpy as np

from .._checks import is_integer, refusal
from .._registry import register
from ._base import Draw, Sampler, as_triple


def _tile_starts(lo: int, hi: int, extent: int, stride: int) -> np.ndarray:
    """Window corners along one axis: every ``stride`` from ``lo``, the last clamped to end at ``hi``."""
    starts = np.arange(lo, hi - extent + 1, stride, dtype=np.int64)
    if starts[-1] + extent < hi:
        starts = np.append(starts, hi - extent)
    return starts


@register("sampler")
@dataclass(eq=False)
class Tiled(Sampler):
    """A deterministic grid of output windows over every region, for inference or validation.

    Windows step by ``stride`` from each region's low corner along z, y and x; along each axis the last window
    is moved back to end at the region's high bound, so the windows cover every voxel of every region. Tiles are
    numbered region by region (in order), then in C order (z, y, x) within a region; batches take them in that
    order. Uniforms are not used.

    Sharding: with ``world_size`` W, rank r gets the tiles i with ``i % W == r``; the shards are disjoint and
    together hold every tile. Every shard makes the same number of batches, as torch's ``DistributedSampler``
    gives every rank the same number of samples: ranks that run a collective operation per batch
    (DistributedDataParallel's forward) would otherwise wait forever for one that ran out. Let n be the shard's
    tile count, m = ceil(T / W) the largest shard's (T tiles in all) and B the batch size:

    - ``last="keep"``: ``ceil(m / B)`` batches; batch k has ``valid = clip(n - k * B, 0, B)`` real examples and
      repeats the shard's last tile in the remaining places (a shard one tile short of the largest may end with
      a batch of ``valid = 0``; a shard of no tile, with fewer tiles than ranks, makes its batch of
      ``valid = 0`` from tile 0, as torch's DistributedSampler pads a rank with others' samples).
    - ``last="drop"``: ``floor(T / W) // B`` batches (the smallest shard's full batches), all full; a shard's
      tiles beyond them are never delivered.
    - ``last="roll"``: ``ceil(m / B)`` batches, all full (so every shard needs a tile of its own): the sequence
      wraps around, so place p of the epoch (``p = batch * B + example``) gets the shard's tile ``p % n``; with
      ``n >= B`` the first ``ceil(m / B) * B - n`` tiles come twice, at the start and again at the end of the last
      batch, and with fewer tiles than ``B`` the one batch cycles through them (3 tiles, B = 8: 0, 1, 2, 0, 1, 2, 0,
      1). Every epoch is the same.

    Parameters
    ----------
    stride : int, (int, int, int) or None
        Step between windows along (z, y, x), each >= 1 and at most the window extent (larger steps would leave
        gaps); None: the window extent (tiles touch, no overlap).
    last : {"keep", "drop", "roll"}
        What becomes of the shard's last, incomplete batch (see above).
    """

    stride: Union[None, int, Sequence[int]] = None
    last: str = "keep"
    name: ClassVar[str] = "tiled"
    draws: ClassVar[int] = 0

    def __post_init__(self) -> None:
        if self.stride is not None:
            values = (self.stride,) * 3 if is_integer(self.stride) else self.stride
            if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)) \
                    or len(values) != 3 or not all(is_integer(v) for v in values):
                raise refusal(f"Tiled: stride must be an integer or three integers (z, y, x), got {self.stride!r}",
                              "stride")
            if min(values) < 1:
                raise refusal(f"Tiled: stride must be >= 1 along each axis, got {self.stride!r}", "stride")
            self.stride = tuple(int(v) for v in values)
        if self.last not in ("keep", "drop", "roll"):
            raise refusal(f"Tiled: last must be 'keep', 'drop' or 'roll', got {self.last!r}", "last")

    def bind(self, regions, extents, batch_size, rank=0, world_size=1) -> None:
        super().bind(regions, extents, batch_size, rank, world_size)
        extents = np.asarray(extents, dtype=np.int64).reshape(-1, 3)
        if len(np.unique(extents, axis=0)) != 1:
            raise ValueError(f"{self!r}: all windows must have the same extent, got "
                             f"{sorted(set(map(as_triple, extents)))}; tiling does not combine with augmentations "
                             f"that transpose the window")
        if not is_integer(world_size) or world_size < 1 or not is_integer(rank) or not 0 <= rank < world_size:
            raise ValueError(f"{self!r}: need 0 <= rank < world_size, got rank={rank!r}, "
                             f"world_size={world_size!r}")
        extent = extents[0]
        stride = extent if self.stride is None else np.asarray(self.stride, dtype=np.int64)
        if np.any(stride > extent):
            raise ValueError(f"{self!r}: stride {as_triple(stride)} exceeds the window extent {as_triple(extent)} "
                             f"along some axis; the tiles would leave gaps")
        self._extent = extent
        self._starts = []
        for region in self.regions:
            if np.any(np.asarray(region.hi) - np.asarray(region.lo) < extent):
                raise ValueError(f"{self!r}: the window {as_triple(extent)} does not fit region {region.name!r} "
                                 f"[{as_triple(region.lo)}, {as_triple(region.hi)})")
            self._starts.append([_tile_starts(int(region.lo[a]), int(region.hi[a]), int(extent[a]), int(stride[a]))
                                 for a in range(3)])
        counts = [math.prod(len(s) for s in starts) for starts in self._starts]
        self._first_tile = np.cumsum([0] + counts)
        self.tiles = int(self._first_tile[-1])
        self.batch_size = int(batch_size)
        self.rank, self.world_size = int(rank), int(world_size)
        self.shard_tiles = len(range(self.rank, self.tiles, self.world_size))
        if self.shard_tiles == 0 and self.last == "roll":
            raise ValueError(f"{self!r}: {self.tiles} tiles leave none for rank {rank} of {world_size} to roll "
                             "through; with last='keep' its batch holds valid = 0 examples")
        if self.last == "drop" and self.tiles // self.world_size < self.batch_size:
            raise ValueError(f"{self!r}: a shard of {self.tiles // self.world_size} tiles (of {self.tiles} over "
                             f"{world_size}) is smaller than batch_size={batch_size}, so last='drop' leaves no "
                             f"batch")

    def batches_per_epoch(self) -> int:
        """Batches per epoch, the same for every shard (see the class documentation)."""
        if self.last == "drop":
            return (self.tiles // self.world_size) // self.batch_size
        largest = -(-self.tiles // self.world_size)
        return -(-largest // self.batch_size)

    def tile(self, i: int) -> Tuple[int, np.ndarray]:
        """(region index, window corner) of global tile ``i``."""
        volume = int(np.searchsorted(self._first_tile, i, side="right")) - 1
        starts = self._starts[volume]
        local = np.unravel_index(i - int(self._first_tile[volume]), [len(s) for s in starts])
        return volume, np.asarray([starts[a][local[a]] for a in range(3)], dtype=np.int64)

    def sample(self, uniforms: np.ndarray, extents: np.ndarray, epoch: int, index: int) -> Draw:
        batches = self.batches_per_epoch()
        if not 0 <= index < batches:
            raise ValueError(f"{self!r}: batch index {index} is outside the epoch of {batches} "
                             f"batch{'' if batches == 1 else 'es'}")
        extents = np.asarray(extents, dtype=np.int64)
        if len(extents) != self.batch_size or np.any(extents != self._extent):
            raise ValueError(f"{self!r}: expected {self.batch_size} windows of extent {as_triple(self._extent)}")
        places = index * self.batch_size + np.arange(self.batch_size)
        valid = self.batch_size
        if self.last == "roll":
            places %= self.shard_tiles
        elif self.last == "keep":
            valid = min(self.batch_size, max(0, self.shard_tiles - index * self.batch_size))
            places = np.minimum(places, self.shard_tiles - 1)
        volumes = np.empty(self.batch_size, dtype=np.int64)
        corners = np.empty((self.batch_size, 3), dtype=np.int64)
        for n, place in enumerate(places.tolist()):  # an empty shard's places (valid = 0): tile 0
            volumes[n], corners[n] = self.tile(self.rank + place * self.world_size if self.shard_tiles else 0)
        return Draw(volumes=volumes, corners=corners, valid=valid)

    def __repr__(self) -> str:
        return f"Tiled(stride={self.stride}, last={self.last!r})"

