"""The standard benchmark workload, shared by the pytest-benchmark suite and ``foundation.py``.

Standard task: batches of 8 windows of (32, 128, 128) cut at random corners from a (96, 384, 384) volume held in
memory, each with one of the 16 anisotropic transforms (mirror z/y/x with p=0.5 each, transpose y<->x with
p=0.5), uint8 raw -> float32 normalised as ``x * scale + shift``, uint64 labels copied bit for bit.

Plans come from emfast's own :class:`~emfast.pipeline._plan.Planner` (``Mirror()`` + ``Transpose()``, uniform corners) with a
fixed seed, and are drawn once: every timed call replays one of a fixed list of plans, so all rounds and all
methods do comparable work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np

import emfast
from emfast._core import gather as _kernels
from emfast.bench._reference import window as reference_window
from emfast.augment import Params
from emfast.pipeline._plan import BatchPlan, Planner, window_extents
from emfast.sampling import Region, Uniform

VOLUME_SHAPE = (96, 384, 384)
PATCH = (32, 128, 128)
BATCH = 8
N_PLANS = 16
#: Raw normalisation of the standard task: uint8 [0, 255] -> [-1, 1].
SCALE = 2.0 / 255.0
SHIFT = -1.0


def make_volumes(shape: Sequence[int] = VOLUME_SHAPE, seed: int = 0):
    """Random uint8 raw and uint64 labels of ``shape`` (z, y, x); content does not matter to the kernels."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=tuple(shape), dtype=np.uint8)
    labels = rng.integers(0, 1 << 40, size=tuple(shape), dtype=np.uint64)
    return raw, labels


def make_plans(shape: Sequence[int] = VOLUME_SHAPE, patch: Sequence[int] = PATCH, batch: int = BATCH,
               count: int = N_PLANS, seed: int = 1) -> List[BatchPlan]:
    """``count`` batch plans with the 16 anisotropic transforms and uniform corners, as the Loader draws them."""
    sampler = Uniform()
    sampler.bind([Region("volume", 1.0, np.zeros(3, dtype=np.int64), np.asarray(shape, dtype=np.int64))],
                 window_extents(patch, np.array([[0, 1, 2], [0, 2, 1]])), batch)
    planner = Planner(patch=tuple(patch), batch_size=batch, sampler=sampler,
                      augmentations=[emfast.Mirror(), emfast.Transpose()], seed=seed)
    return [planner.plan(0, i) for i in range(count)]


def transform_codes(plans: Sequence[BatchPlan]) -> set:
    """Distinct (perm, flips) combinations used by the plans (to check the workload covers the transforms)."""
    return {(tuple(p), tuple(bool(f) for f in fl)) for plan in plans
            for p, fl in zip(plan.params.perms.tolist(), plan.params.flips.tolist())}


def uniform_plan(plan: BatchPlan, perm: Sequence[int], flips: Sequence[bool], patch: Sequence[int],
                 shape: Sequence[int]) -> BatchPlan:
    """``plan``'s corners (clipped to fit) with every example given the same transform (for per-transform timing)."""
    b = len(plan.corners)
    params = Params.identity(b)
    params.perms[:] = np.asarray(perm, dtype=np.int64)
    params.flips[:] = np.asarray(flips, dtype=bool)
    extents = window_extents(patch, params.perms)
    corners = np.minimum(plan.corners, np.asarray(shape, dtype=np.int64) - extents)
    return BatchPlan(epoch=plan.epoch, index=plan.index, corners=corners, extents=extents, params=params)


@dataclass
class Workload:
    """Volumes (4-D views, as the kernels take them), plans and output buffers of one benchmark setting."""

    raw: np.ndarray  # (1, Z, Y, X) uint8
    labels: np.ndarray  # (1, Z, Y, X) uint64
    plans: List[BatchPlan]
    patch: tuple
    batch: int

    @classmethod
    def create(cls, shape=VOLUME_SHAPE, patch=PATCH, batch=BATCH, count=N_PLANS, seed=0) -> "Workload":
        raw, labels = make_volumes(shape, seed)
        return cls(raw[np.newaxis], labels[np.newaxis], make_plans(shape, patch, batch, count, seed + 1),
                   tuple(patch), batch)

    @property
    def out_shape(self) -> tuple:
        return (self.batch, 1) + self.patch

    def new_raw_out(self) -> np.ndarray:
        out = np.empty(self.out_shape, dtype=np.float32)
        out.fill(0)  # map the pages now, not inside a timed call
        return out

    def new_labels_out(self) -> np.ndarray:
        out = np.empty(self.out_shape, dtype=np.uint64)
        out.fill(0)
        return out

    def scale_shift(self):
        scale = np.full(self.batch, SCALE, dtype=np.float32)
        shift = np.full(self.batch, SHIFT, dtype=np.float32)
        return scale, shift

    # -- the emfast kernels, one call per batch ---------------------------------------------------------------

    def kernel_raw(self, plan: BatchPlan, out: np.ndarray) -> np.ndarray:
        scale, shift = self.scale_shift()
        p = plan.params
        return _kernels.gather_convert([self.raw] * self.batch, plan.corners, p.perms, p.flips, scale, shift, out)

    def kernel_labels(self, plan: BatchPlan, out: np.ndarray) -> np.ndarray:
        p = plan.params
        return _kernels.gather_copy([self.labels] * self.batch, plan.corners, p.perms, p.flips, out)

    # -- the NumPy reference pipelines --------------------------------------------------------------------------

    def reference_raw(self, plan: BatchPlan) -> np.ndarray:
        """Per example: crop, np.flip, transpose, astype(float32), * scale + shift (in place); then np.stack."""
        scale, shift = self.scale_shift()
        return np.stack([_convert(_window(self.raw, plan, n), scale[n], shift[n]) for n in range(self.batch)])

    def reference_labels(self, plan: BatchPlan) -> np.ndarray:
        """Per example: crop, np.flip, transpose; then np.stack (which makes the copy)."""
        return np.stack([_window(self.labels, plan, n) for n in range(self.batch)])


def _window(volume: np.ndarray, plan: BatchPlan, n: int) -> np.ndarray:
    """The transformed window of example n of ``plan`` as a NumPy view of the 4-D ``volume``."""
    perm = plan.params.perms[n]
    patch = tuple(int(plan.extents[n][a]) for a in perm)  # output axis j spans source axis perm[j]
    return reference_window(volume, plan.corners[n], patch, perm, plan.params.flips[n])


def _convert(window: np.ndarray, scale: np.float32, shift: np.float32) -> np.ndarray:
    converted = window.astype(np.float32)
    converted *= scale
    converted += shift
    return converted


# -- machine description: shared with `emfast bench` ---------------------------------------------------------

from emfast.bench import machine_info, rss_bytes  # noqa: E402,F401
from emfast._machine import read_proc_field as _read_field  # noqa: E402,F401


def count_option(given, full: int, quick: int, is_quick: bool) -> int:
    """A count option's value (``--batches``, ``--rounds``): as given, else its ``--quick`` or its full default;
    ``--quick`` never overrides a count given explicitly."""
    return given if given is not None else (quick if is_quick else full)
