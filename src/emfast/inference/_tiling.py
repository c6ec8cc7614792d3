"""The tile plan: a deterministic grid of network tiles over a volume or a region of interest, and the blocks of
work that cover it, aligned to the output store's chunks.

A tile is the network's output window, ``patch_out`` voxels, read with ``context`` more on every side
(``patch_in``). Tiles step by ``patch_out - overlap`` from the region's low corner; along each axis the last one is
moved back to end at the region's high bound (or, in a region smaller than a tile, starts at its low corner and
reaches past it), so every voxel of the region is covered.

A block is a box of whole output chunks, clipped to the region. A block blends every tile that writes into it and
writes its own chunks, so no two blocks write the same chunk and a block's result does not depend on which others
ran. A tile straddling a block border is *shared* (:meth:`TilePlan.shared`): the first block that needs it computes
it and keeps its prediction for the others (see :mod:`~emfast.inference._cache`), so each tile is computed once.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

from .._checks import flag, refusal, triple

Triple = Tuple[int, int, int]

#: Default target edge of a block (voxels), rounded up to whole chunks: large enough that the tiles straddling
#: block borders cost little, small enough that a block's float64 sums stay tens of MiB.
BLOCK_EDGE = 128


@dataclass(frozen=True)
class Block:
    """One unit of work: the output box ``[start, stop)`` (z, y, x) and the tiles that write into it."""

    index: int
    start: Triple
    stop: Triple
    tiles: np.ndarray  # (T, 3) tile starts, in the plan's order (C order of the tile grid)

    @property
    def shape(self) -> Triple:
        return tuple(b - a for a, b in zip(self.start, self.stop))


class TilePlan:
    """Tiles and blocks over ``roi`` of a volume of spatial ``shape``.

    Parameters
    ----------
    shape : (int, int, int)
        The volume's spatial shape (z, y, x).
    patch_in, patch_out : (int, int, int)
        The network's input and output window; ``patch_in - patch_out`` must be even and >= 0 on each axis (the
        context is the same on both sides).
    overlap : (int, int, int)
        Voxels shared by neighbouring tiles, ``0 <= overlap < patch_out``.
    chunks : (int, int, int)
        The output store's chunks; blocks are whole numbers of them.
    roi : ((int, int, int), (int, int, int)), optional
        ``(start, stop)`` of the region to predict, inside the volume; default the whole volume.
    block : (int, int, int), optional
        Block shape, a multiple of ``chunks``; default about :data:`BLOCK_EDGE` voxels per axis.
    crop : bool
        Tiles do not blend: each voxel takes the prediction of the tile whose output it is nearest the middle of
        (overlaps are cut in half, see :attr:`cuts`; a voxel as near the middles of two tiles goes to the later
        one), and a block computes only the tiles that own its voxels.
    """

    def __init__(self, shape: Sequence[int], patch_in, patch_out, overlap, chunks, roi=None, block=None,
                 crop: bool = False) -> None:
        self.shape = triple(shape, "volume shape", minimum=1)
        self.patch_in = triple(patch_in, "patch_in", minimum=1)
        self.patch_out = triple(patch_out, "patch_out", minimum=1)
        self.overlap = triple(overlap, "overlap", minimum=0)
        self.chunks = triple(chunks, "chunks", minimum=1)
        margin = [i - o for i, o in zip(self.patch_in, self.patch_out)]
        if min(margin) < 0 or any(m % 2 for m in margin):
            raise refusal(f"patch_in {self.patch_in} must exceed patch_out {self.patch_out} by an even number of "
                          "voxels on each axis (the same context on both sides)", "patch_out")
        self.context: Triple = tuple(m // 2 for m in margin)
        if any(v >= p for v, p in zip(self.overlap, self.patch_out)):
            raise refusal(f"overlap {self.overlap} must be smaller than patch_out {self.patch_out} on each axis",
                          "overlap")
        self.stride: Triple = tuple(p - v for p, v in zip(self.patch_out, self.overlap))
        self.roi = self._roi(roi)
        self.block = self._block(block)
        self.crop = flag(crop, "crop")
        #: Per axis, the tiles' starts (output voxels, in the volume).
        self.starts: List[np.ndarray] = [self._axis_starts(axis) for axis in range(3)]
        self._positions = [{int(v): i for i, v in enumerate(s)} for s in self.starts]
        #: Per axis, ``len(starts) + 1`` cut positions: tile i owns ``[cuts[i], cuts[i + 1])`` when cropping.
        self.cuts: List[np.ndarray] = [np.concatenate([[s[0]], (s[1:] + s[:-1] + p) // 2, [s[-1] + p]])
                                       for s, p in zip(self.starts, self.patch_out)]

    def _roi(self, roi) -> Tuple[Triple, Triple]:
        if roi is None:
            return (0, 0, 0), self.shape
        try:
            start, stop = roi
        except (TypeError, ValueError):
            raise refusal(f"roi must be (start, stop), two (z, y, x) corners, got {roi!r}", "roi") from None
        try:
            start = triple(start, "roi start", minimum=0)
            stop = triple(stop, "roi stop", minimum=1)
        except ValueError as error:
            error.emfast_setting = "roi"  # the setting; its message names the corner
            raise
        if any(a >= b or b > s for a, b, s in zip(start, stop, self.shape)):
            raise refusal(f"roi {start}..{stop} must be a non-empty box inside the volume of shape {self.shape}",
                          "roi")
        return start, stop

    def _block(self, block) -> Triple:
        if block is None:
            return tuple(c * max(1, -(-min(BLOCK_EDGE, b - a) // c))
                         for c, a, b in zip(self.chunks, *self.roi))
        block = triple(block, "block", minimum=1)
        if any(b % c for b, c in zip(block, self.chunks)):
            raise refusal(f"block {block} must be a multiple of the output chunks {self.chunks}, so that no two "
                          "blocks write the same chunk", "block")
        return block

    def _axis_starts(self, axis: int) -> np.ndarray:
        low, high = self.roi[0][axis], self.roi[1][axis]
        size, step = self.patch_out[axis], self.stride[axis]
        if high - low <= size:
            return np.array([low], dtype=np.int64)
        starts = np.arange(low, high - size, step, dtype=np.int64)
        return np.append(starts, high - size)

    @property
    def grid(self) -> Triple:
        """Number of blocks along (z, y, x) over the whole volume (blocks outside the roi are empty)."""
        return tuple(-(-s // b) for s, b in zip(self.shape, self.block))

    @property
    def tile_count(self) -> int:
        return int(np.prod([len(s) for s in self.starts]))

    def tile_key(self, start) -> Triple:
        """The grid position (i, j, k) of the tile whose output starts at ``start``."""
        return tuple(index[int(v)] for index, v in zip(self._positions, start))

    def _axis_spans(self, axis: int) -> List[Tuple[int, int]]:
        """``[start, stop)`` of the non-empty blocks along ``axis``, clipped to the roi."""
        low, high = self.roi[0][axis], self.roi[1][axis]
        size = self.block[axis]
        return [(max(p * size, low), min((p + 1) * size, high)) for p in range(low // size, -(-high // size))]

    def _reaches(self, axis: int, start: int, stop: int) -> np.ndarray:
        """Which tiles along ``axis`` write into ``[start, stop)``: those owning voxels there when cropping, else
        those whose output overlaps it."""
        s = self.starts[axis]
        if self.crop:
            c = self.cuts[axis]
            return (c[:-1] < stop) & (c[1:] > start)
        return (s < stop) & (s + self.patch_out[axis] > start)

    def shared(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per axis, how many blocks along that axis each tile writes into; a tile is shared by the product of
        its three counts, and computed once only because it is kept for the others when that exceeds 1."""
        return tuple(np.sum([self._reaches(axis, a, b) for a, b in self._axis_spans(axis)], axis=0)
                     for axis in range(3))

    def block_box(self) -> Tuple[Triple, Triple]:
        """(first, end) grid positions of the blocks the roi touches, the others being empty."""
        return (tuple(lo // b for lo, b in zip(self.roi[0], self.block)),
                tuple(-(-hi // b) for hi, b in zip(self.roi[1], self.block)))

    def blocks(self) -> List[Block]:
        """Every non-empty block, numbered in C order of the block grid (walking the roi's blocks only: the
        volume may have 10^8 of them)."""
        result = []
        for position in itertools.product(*(range(a, b) for a, b in zip(*self.block_box()))):
            start = tuple(max(p * b, lo) for p, b, lo in zip(position, self.block, self.roi[0]))
            stop = tuple(min((p + 1) * b, hi) for p, b, hi in zip(position, self.block, self.roi[1]))
            tiles = [s[self._reaches(axis, a, b)] for axis, (s, a, b) in enumerate(zip(self.starts, start, stop))]
            grid = np.stack(np.meshgrid(*tiles, indexing="ij"), axis=-1).reshape(-1, 3)
            result.append(Block(int(np.ravel_multi_index(position, self.grid)), start, stop, grid))
        return result

    def input_box(self, block: Block) -> Tuple[Triple, Triple]:
        """(corner, extent) of the input the block's tiles read, context included; it may reach past the volume."""
        low = tuple(int(block.tiles[:, a].min()) - self.context[a] for a in range(3))
        high = tuple(int(block.tiles[:, a].max()) + self.patch_in[a] - self.context[a] for a in range(3))
        return low, tuple(h - lo for lo, h in zip(low, high))
