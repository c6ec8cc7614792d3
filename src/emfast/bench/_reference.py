"""The NumPy reference pipeline of ``emfast bench``: the standard task done the way a NumPy data pipeline does it.

Per example: crop the raw window and the label window (the labels with the targets' margin), mirror and transpose
both with ``np.flip``/``transpose``, convert raw to float32 and apply ``x * scale + shift`` (normalisation and
intensity augmentation folded into one scale and shift, as emfast does), and compute nearest-neighbour affinities
and their mask with array comparisons; a batch is the ``np.stack`` of its examples. The single-threaded NumPy row
calls :func:`reference_batch`, and the PyTorch ``DataLoader`` row runs :class:`ReferenceDataset` (one example per
item, collated by the ``DataLoader``) in its worker processes, so both do exactly this work.

The output of :func:`reference_example` for an example's window and transform is bit-identical to the emfast
loader's for the same window and transform (``tests/test_bench.py`` checks it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

Triple = Tuple[int, int, int]

#: The standard task's targets: affinities to the previous voxel along z, y and x (``emfast.Affinities()``).
NEAREST_NEIGHBOURS = ((-1, 0, 0), (0, -1, 0), (0, 0, -1))
#: Label voxels cut on each side of the output window so that every affinity is known.
MARGIN = (1, 1, 1)
#: Intensity augmentation of the standard task: gain in [1 - 0.1, 1 + 0.1], bias in [-0.1, 0.1].
INTENSITY = (0.1, 0.1)
#: uint8 raw normalised to [0, 1] (emfast's default for uint8).
NORMALIZE = (1.0 / 255.0, 0.0)


@dataclass(frozen=True)
class Example:
    """The random draws of one example.

    Attributes
    ----------
    corner : (int, int, int)
        Low corner (z, y, x) of the output window's source box in the volume (without the label margin).
    perm : (int, int, int)
        Output axis j reads source axis ``perm[j]``.
    flips : (bool, bool, bool)
        Mirrors, in source axes (z, y, x), applied before the transpose.
    scale, shift : float
        Raw output = ``x * scale + shift`` in float32 (normalisation times intensity gain, plus bias).
    """

    corner: Triple
    perm: Triple
    flips: Tuple[bool, bool, bool]
    scale: float
    shift: float


def source_extent(patch: Sequence[int], perm: Sequence[int]) -> Triple:
    """Extent along the source axes of a window whose output axis j reads source axis ``perm[j]``."""
    extent = [0, 0, 0]
    for j, axis in enumerate(perm):
        extent[axis] = int(patch[j])
    return tuple(extent)


def window(volume: np.ndarray, corner: Sequence[int], patch: Sequence[int], perm: Sequence[int],
           flips: Sequence[bool], margin: Sequence[int] = (0, 0, 0)) -> np.ndarray:
    """The transformed window of a 3-D (z, y, x) or 4-D (c, z, y, x) volume as a view: ``transpose(flip(crop),
    perm)``, output axis j reading source axis ``perm[j]``, mirrored where ``flips`` (source axes) says so.

    This is the one NumPy reference of a crop, shared by ``emfast bench``, the tests and the benchmarks.
    ``corner`` is the low corner of the output window's source box; the crop grows by ``margin`` (given in output
    axes) on each side, so the view has shape ``patch + 2 * margin`` (after the channels of a 4-D volume).
    """
    lead = volume.ndim - 3
    margin_src = source_extent(margin, perm)
    extent = source_extent(patch, perm)
    crop = volume[(slice(None),) * lead +
                  tuple(slice(int(c) - m, int(c) + e + m) for c, e, m in zip(corner, extent, margin_src))]
    flipped = tuple(lead + axis for axis in range(3) if flips[axis])
    if flipped:
        crop = np.flip(crop, axis=flipped)
    return crop.transpose(tuple(range(lead)) + tuple(lead + int(p) for p in perm))


def affinities(labels: np.ndarray, offsets: Sequence[Sequence[int]] = NEAREST_NEIGHBOURS,
               margin: Sequence[int] = MARGIN, background: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Affinities of a (Z + 2 mz, Y + 2 my, X + 2 mx) label window, gunpowder's convention (as
    :class:`emfast.Affinities`): channel k at voxel v is 1 where v and ``v + offsets[k]`` have the same label and
    it is not ``background``. Every offset lies within the margin, so every neighbour is known and the mask is 1.

    Returns (affinities (K, Z, Y, X) float32, mask (K, Z, Y, X) uint8).
    """
    out = tuple(s - 2 * m for s, m in zip(labels.shape, margin))
    inner = labels[tuple(slice(m, m + o) for m, o in zip(margin, out))]
    foreground = inner != background
    result = np.empty((len(offsets),) + out, dtype=np.float32)
    for k, offset in enumerate(offsets):
        if any(abs(d) > m for d, m in zip(offset, margin)):
            raise ValueError(f"offset {tuple(offset)} reaches beyond the margin {tuple(margin)}")
        neighbour = labels[tuple(slice(m + d, m + d + o) for m, d, o in zip(margin, offset, out))]
        result[k] = (inner == neighbour) & foreground
    return result, np.ones(result.shape, dtype=np.uint8)


def reference_example(raw: np.ndarray, labels: np.ndarray, example: Example, patch: Sequence[int],
                      offsets: Sequence[Sequence[int]] = NEAREST_NEIGHBOURS,
                      margin: Sequence[int] = MARGIN) -> Dict[str, np.ndarray]:
    """One example of the standard task from 3-D ``raw`` (uint8) and ``labels`` volumes.

    Returns ``{"raw": (1, Z, Y, X) float32, "affinities": (K, Z, Y, X) float32, "affinities_mask": (K, Z, Y, X)
    uint8}``.
    """
    converted = window(raw, example.corner, patch, example.perm, example.flips).astype(np.float32)
    converted *= np.float32(example.scale)
    converted += np.float32(example.shift)
    label_window = window(labels, example.corner, patch, example.perm, example.flips, margin)
    affs, mask = affinities(label_window, offsets, margin)
    return {"raw": converted[np.newaxis], "affinities": affs, "affinities_mask": mask}


def reference_batch(raw: np.ndarray, labels: np.ndarray, examples: Sequence[Example], patch: Sequence[int],
                    offsets: Sequence[Sequence[int]] = NEAREST_NEIGHBOURS,
                    margin: Sequence[int] = MARGIN) -> Dict[str, np.ndarray]:
    """The batch of ``examples``: each field is the ``np.stack`` of the examples' arrays, (B, C, Z, Y, X)."""
    parts = [reference_example(raw, labels, example, patch, offsets, margin) for example in examples]
    return {name: np.stack([part[name] for part in parts]) for name in parts[0]}


def sampling_region(shape: Sequence[int], margin: Sequence[int] = MARGIN) -> Tuple[Triple, Triple]:
    """[lo, hi) for output windows whose label margin must stay inside a volume of ``shape``.

    The margin is taken as the largest over all axes, so it holds for every transpose of the window.
    """
    m = max(margin)
    return (m, m, m), tuple(int(s) - m for s in shape)


def draw_examples(rng: np.random.Generator, count: int, patch: Sequence[int], shape: Sequence[int],
                  margin: Sequence[int] = MARGIN, intensity: Tuple[float, float] = INTENSITY,
                  normalize: Tuple[float, float] = NORMALIZE) -> List[Example]:
    """``count`` examples with the standard task's distribution: uniform window corners, each of the mirrors z, y,
    x with p = 0.5, the y<->x transpose with p = 0.5, intensity gain and bias uniform in ``1 +- intensity[0]`` and
    ``+- intensity[1]``."""
    lo, hi = sampling_region(shape, margin)
    examples = []
    for _ in range(count):
        perm = (0, 2, 1) if rng.random() < 0.5 else (0, 1, 2)
        extent = source_extent(patch, perm)
        corner = tuple(int(rng.integers(low, high - e + 1)) for low, high, e in zip(lo, hi, extent))
        flips = tuple(bool(f) for f in rng.random(3) < 0.5)
        gain = 1.0 + intensity[0] * (2.0 * rng.random() - 1.0)
        bias = intensity[1] * (2.0 * rng.random() - 1.0)
        examples.append(Example(corner, perm, flips, normalize[0] * gain, normalize[1] * gain + bias))
    return examples


class ReferenceDataset:
    """A map-style dataset for ``torch.utils.data.DataLoader``: item i is one example of the standard task, drawn
    from its own generator ``default_rng((seed, i))``, as NumPy arrays (the ``DataLoader`` collates them).

    Parameters
    ----------
    raw, labels : ndarray
        3-D volumes (uint8 raw, integer labels of the same shape).
    patch : (int, int, int)
        Output window (z, y, x).
    length : int
        Number of items.
    seed : int
        Seed of the draws.
    """

    def __init__(self, raw: np.ndarray, labels: np.ndarray, patch: Sequence[int], length: int, seed: int = 0):
        self.raw = raw
        self.labels = labels
        self.patch = tuple(int(p) for p in patch)
        self.length = int(length)
        self.seed = int(seed)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Dict[str, np.ndarray]:
        if not 0 <= index < self.length:
            raise IndexError(f"item {index} out of range [0, {self.length})")
        rng = np.random.default_rng((self.seed, int(index)))
        example, = draw_examples(rng, 1, self.patch, self.raw.shape)
        return reference_example(self.raw, self.labels, example, self.patch)
