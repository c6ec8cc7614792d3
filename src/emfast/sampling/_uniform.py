"""The uniform sampler: every window position equally likely."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._registry import register
from ._base import Draw, Sampler, uniform_offsets


@register("sampler")
@dataclass(eq=False)
class Uniform(Sampler):
    """A region drawn by weight, then an output-window corner uniformly over every position where it fits."""

    name: ClassVar[str] = "uniform"
    draws: ClassVar[int] = 4

    def sample(self, uniforms: np.ndarray, extents: np.ndarray, epoch: int, index: int) -> Draw:
        volumes = self.choose_regions(uniforms[:, 0])
        lo = np.stack([self.regions[v].lo for v in volumes])
        hi = np.stack([self.regions[v].hi for v in volumes])
        corners = lo + uniform_offsets(uniforms[:, 1:4], hi - lo - extents + 1)
        return Draw(volumes=volumes, corners=corners, valid=len(volumes))

    def __repr__(self) -> str:
        return "Uniform()"
