"""The spec: what a config says, as frozen dataclasses that map one to one onto YAML and onto emfast objects."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union


from ..io import demo_volume_path



# -- the spec -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Builtin:
    """The built-in EM-like volume (:func:`emfast.io.demo_volume_path`), generated in the emfast cache
    directory on first use. YAML: ``file: {builtin: demo, shape: [z, y, x], seed: 0}``.

    Attributes
    ----------
    shape : (int, int, int) or None
        Volume shape; None: the shape given to :meth:`Config.loader` as ``demo_shape``, else the default.
    seed : int
        Seed of the generated volume.
    """

    shape: Optional[Tuple[int, int, int]] = None
    seed: int = 0

    def path(self, cache_dir=None, demo_shape=None) -> Path:
        shape = self.shape if self.shape is not None else demo_shape
        kwargs = {} if shape is None else {"shape": tuple(shape)}
        return demo_volume_path(cache_dir=cache_dir, seed=self.seed, **kwargs)

    def to_yaml(self) -> dict:
        out: Dict[str, Any] = {"builtin": "demo"}
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.seed:
            out["seed"] = self.seed
        return out


@dataclass(frozen=True)
class VolumeSpec:
    """One dataset: an absolute file path, a remote store's URL (or the built-in volume) and the dataset inside it;
    for an OME-Zarr image or a precomputed volume, the ``level`` (index) or the (z, y, x) ``resolution`` to read.

    ``shared_file`` (not compared) records that the file came from the sample's ``file`` key, for messages.
    """

    file: Union[Path, Builtin, str]
    dataset: str
    shared_file: bool = field(default=False, compare=False, repr=False)
    level: Optional[int] = None
    resolution: Optional[Tuple[float, float, float]] = None

    def to_yaml(self) -> dict:
        file = self.file.to_yaml() if isinstance(self.file, Builtin) else str(self.file)
        out: Dict[str, Any] = {"file": file, "dataset": self.dataset}
        if self.level is not None:
            out["level"] = self.level
        if self.resolution is not None:
            out["resolution"] = list(self.resolution)
        return out


@dataclass(frozen=True)
class SampleSpec:
    """The arguments of one :class:`~emfast.Sample`, its volumes named by file and dataset.

    ``lazy`` opens the volumes with ``in_memory=False`` (each window read through a chunk cache of
    ``cache_bytes``); otherwise they are loaded into memory.
    """

    raw: VolumeSpec
    labels: Optional[VolumeSpec] = None
    mask: Optional[VolumeSpec] = None
    extra: Tuple[Tuple[str, VolumeSpec], ...] = ()
    name: Optional[str] = None
    weight: float = 1.0
    label_offset: Optional[Tuple[int, int, int]] = None
    mask_offset: Optional[Tuple[int, int, int]] = None
    lazy: bool = False
    cache_bytes: Optional[int] = None
    own_resolution: Tuple[str, ...] = ()
    #: fsspec's options for the sample's remote files, as sorted (key, value) pairs.
    storage_options: Tuple[Tuple[str, Any], ...] = ()

    def volumes(self) -> List[Tuple[Tuple[str, ...], VolumeSpec]]:
        """(key path within the sample, volume) of every volume, raw first."""
        named = [(("raw",), self.raw), (("labels",), self.labels), (("mask",), self.mask)]
        named += [(("extra", key), volume) for key, volume in self.extra]
        return [(key, volume) for key, volume in named if volume is not None]

    def to_yaml(self) -> dict:
        out: Dict[str, Any] = {}
        if self.name is not None:
            out["name"] = self.name
        out["raw"] = self.raw.to_yaml()
        for key in ("labels", "mask"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key).to_yaml()
        if self.extra:
            out["extra"] = {key: volume.to_yaml() for key, volume in self.extra}
        defaults = SampleSpec(self.raw)
        for key in ("weight", "label_offset", "mask_offset", "lazy", "cache_bytes", "own_resolution"):
            value = getattr(self, key)
            if value != getattr(defaults, key):
                out[key] = list(value) if isinstance(value, tuple) else value
        if self.storage_options:
            out["storage_options"] = dict(self.storage_options)
        return out


@dataclass(frozen=True)
class ComponentSpec:
    """An augmentation, target or sampler: its registered name and the keyword arguments of its constructor."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_yaml(self):
        return {self.name: dict(self.params)} if self.params else self.name


@dataclass(frozen=True)
class Validation:
    """Overrides for the loader of the held-out samples: loader keyword arguments, augmentations, targets and
    sampler (None: as for training). ``epoch_size`` is not inherited; see :meth:`Config.loader`."""

    loader: Mapping[str, Any] = field(default_factory=dict)
    augment: Optional[Tuple[ComponentSpec, ...]] = None
    targets: Optional[Tuple[ComponentSpec, ...]] = None
    sampler: Optional[ComponentSpec] = None

    def to_yaml(self) -> dict:
        out: Dict[str, Any] = {"loader": plain(dict(self.loader))} if self.loader else {}
        out.update(components_yaml(self.augment, self.targets, self.sampler))
        return out


def components_yaml(augment: Optional[Tuple[ComponentSpec, ...]], targets: Optional[Tuple[ComponentSpec, ...]],
                    sampler: Optional[ComponentSpec]) -> Dict[str, Any]:
    """The ``augment``, ``targets`` and ``sampler`` sections as YAML data, those that are None left out (the
    training sections and the validation overrides are written alike)."""
    out: Dict[str, Any] = {}
    for key, items in (("augment", augment), ("targets", targets)):
        if items is not None:
            out[key] = [item.to_yaml() for item in items]
    if sampler is not None:
        out["sampler"] = sampler.to_yaml()
    return out


def plain(value):
    """Tuples as lists, for YAML."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
