"""YAML training configs that map one-to-one onto emfast's Python objects.

A config names the volumes of each :class:`~emfast.Sample`, the keyword arguments of :class:`~emfast.Loader`
(same names), the augmentations, targets and sampler by their registered names with their constructor
parameters, and optional overrides for a validation loader on held-out samples::

    data:
      samples:
        - name: A
          file: a.h5                          # relative paths resolve against the config's folder
          raw: volumes/raw                    # a dataset of the sample's file, or {file: ..., dataset: ...}
          labels: volumes/labels/neuron_ids
      hold_out: [B]
    loader: {patch: [32, 128, 128], batch_size: 8, threads: 2, epoch_size: 100}
    augment: [mirror, transpose, {intensity: {scale: 0.1, shift: 0.1}}]
    targets: [{affinities: {offsets: [[-1, 0, 0], [0, -1, 0], [0, 0, -1]]}}]
    sampler: {balanced: {classes: boundary}}
    validation: {sampler: tiled, augment: []}

:func:`load_config` parses with PyYAML's safe loader (plain mappings, lists, strings, numbers, booleans and null;
any other tag is refused) and checks everything that can be checked without opening a file: keys, value types,
names and parameters of augmentations, targets and samplers (by building them). :meth:`Config.loader` then opens
the volumes and builds the :class:`~emfast.Loader`. Every problem is a :class:`ConfigError` naming the key path
(``data.samples[1].raw.dataset``) and, for configs read from YAML, the line. See ``docs/CONFIG.md``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from .._checks import concerned_key
from ..io import CacheBudgetError, LevelChoiceError, UnknownFormatError, Volume, is_url, open_volume
from ..pipeline import Loader
from ..sampling import Dataset, Sample, Sampler
from ..transfer import DeviceUnavailableError
from ._yaml import Path_, Reader, dump_yaml, parse_yaml, read_source
from ._predict import predict_section
from ._spec import Builtin, ComponentSpec, SampleSpec, Validation, VolumeSpec, components_yaml, plain
from ._sections import (SECTIONS, check_augment, component, components, construct, entry_of, loader_default,
                        loader_section, sample_spec)


#: The default config of ``emfast demo --config``: the built-in volume, its raw and labels.
BUILTIN_CONFIG = Path(__file__).parent.parent / "data" / "demo.yaml"


@dataclass(frozen=True)
class Config:
    """A parsed config: the samples, the Loader's keyword arguments, and the specifications of augmentations,
    targets and sampler. Build objects from it with :meth:`dataset`, :meth:`loader` and the like.

    Two configs are equal when they describe the same objects (line numbers and the source file do not count).

    Attributes
    ----------
    samples : tuple of SampleSpec
    hold_out : tuple of str
        Names of the samples of the validation set (empty: no validation set).
    loader_args : mapping
        Keyword arguments of :class:`~emfast.Loader` (the ``loader`` section).
    augment, targets : tuple of ComponentSpec, or None
        None: the Loader's default.
    sampler : ComponentSpec or None
        None: :class:`~emfast.Uniform`.
    validation : Validation
        Overrides for the validation loader.
    """

    samples: Tuple[SampleSpec, ...]
    loader_args: Mapping[str, Any]
    hold_out: Tuple[str, ...] = ()
    augment: Optional[Tuple[ComponentSpec, ...]] = None
    targets: Optional[Tuple[ComponentSpec, ...]] = None
    sampler: Optional[ComponentSpec] = None
    validation: Validation = Validation()
    source: str = field(default="<text>", compare=False)
    marks: Mapping[Path_, int] = field(default_factory=dict, compare=False, repr=False)

    # -- building ----------------------------------------------------------------------------------------------

    def _reader(self) -> Reader:
        return Reader(dict(self.marks), self.source, Path.cwd())

    def split_samples(self, split: str = "train") -> List[Tuple[int, SampleSpec]]:
        """(index in :attr:`samples`, sample) of the samples of ``split`` ("train" or "validation")."""
        if split not in ("train", "validation"):
            raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
        if split == "validation" and not self.hold_out:
            raise self._reader().error(("data",), "no validation set: data.hold_out names no sample")
        held = set(self.hold_out)
        names = [spec.name for spec in self.samples]
        return [(i, spec) for i, spec in enumerate(self.samples) if (names[i] in held) == (split == "validation")]

    def _open(self, index: int, spec: SampleSpec, cache_dir, demo_shape) -> Sample:
        reader = self._reader()
        path = ("data", "samples", index)
        opened: List[Volume] = []
        volumes: Dict[Tuple[str, ...], Volume] = {}
        try:
            for key, volume in spec.volumes():
                file = volume.file.path(cache_dir, demo_shape) if isinstance(volume.file, Builtin) else volume.file
                try:
                    remote = {"storage_options": dict(spec.storage_options)} \
                        if spec.storage_options and is_url(file) else {}
                    opened.append(open_volume(file, volume.dataset, in_memory=not spec.lazy,
                                               cache_bytes=spec.cache_bytes, level=volume.level,
                                               resolution=volume.resolution, **remote))
                except (OSError, UnknownFormatError) as error:  # the file, not its dataset
                    raise reader.error(path + (("file",) if volume.shared_file else key + ("file",)),
                                       str(error)) from error
                except CacheBudgetError as error:  # the sample's budget, not the volume, is the culprit
                    if spec.cache_bytes is None:  # the default's: said so, at the key that asked for it
                        raise reader.error(path + ("lazy",), f"{error} (the default budget: set this sample's "
                                                             "cache_bytes)") from error
                    raise reader.error(path + ("cache_bytes",), str(error)) from error
                except (KeyError, TypeError, ValueError) as error:
                    culprit = ("storage_options",) if concerned_key(error, ("storage_options",)) else \
                        key + (_culprit(volume, error),)
                    raise reader.error(path + culprit, str(error)) from error
                volumes[key] = opened[-1]
            try:
                return Sample(volumes[("raw",)], volumes.get(("labels",)), volumes.get(("mask",)),
                              extra={key[1]: v for key, v in volumes.items() if key[0] == "extra"},
                              name=spec.name, weight=spec.weight, label_offset=spec.label_offset,
                              mask_offset=spec.mask_offset, own_resolution=spec.own_resolution)
            except (TypeError, ValueError) as error:
                raise reader.error(path, str(error)) from error
        except BaseException:
            for volume in opened:
                volume.close()
            raise

    def dataset(self, split: str = "train", *, cache_dir=None, demo_shape=None) -> Dataset:
        """Open the volumes of the samples of ``split`` and return them as a :class:`~emfast.Dataset`.

        Parameters
        ----------
        split : {"train", "validation"}
            The samples not held out, or the held-out ones.
        cache_dir, demo_shape
            Where the built-in volume is generated (default: ``$EMFAST_CACHE_DIR``, else ``~/.cache/emfast``)
            and its shape when its ``file`` names none.

        Raises
        ------
        ConfigError
            A missing file or dataset, unsupported data, misaligned volumes, inconsistent samples.
        """
        samples: List[Sample] = []
        try:
            for index, spec in self.split_samples(split):
                samples.append(self._open(index, spec, cache_dir, demo_shape))
            try:
                return Dataset(samples)
            except (TypeError, ValueError) as error:
                raise self._reader().error(("data", "samples"), str(error)) from error
        except BaseException:
            close_volumes(samples)
            raise

    def loader_kwargs(self, split: str = "train") -> Dict[str, Any]:
        """The keyword arguments of the :class:`~emfast.Loader` of ``split``, with augmentations, targets and
        sampler built.

        The validation loader takes the training arguments, overridden by ``validation.loader``, except
        ``epoch_size``: a sampler with a finite epoch (such as ``tiled``) sets it (``validation.loader`` may only
        repeat it), else it comes from ``validation.loader``, else from the training loader.
        """
        reader = self._reader()
        kwargs = dict(self.loader_args)
        augment, targets, sampler = self.augment, self.targets, self.sampler
        section = {"augment": ("augment",), "targets": ("targets",), "sampler": ("sampler",)}
        if split == "validation":
            kwargs.update(self.validation.loader)
            for key in ("augment", "targets", "sampler"):
                if getattr(self.validation, key) is not None:
                    section[key] = ("validation", key)
            augment = self.validation.augment if self.validation.augment is not None else augment
            targets = self.validation.targets if self.validation.targets is not None else targets
            sampler = self.validation.sampler if self.validation.sampler is not None else sampler
        elif split != "train":
            raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
        if augment is not None:
            kwargs["augment"] = [construct(reader, item, "augment", section["augment"] + (i,))
                                 for i, item in enumerate(augment)]
        if targets is not None:
            kwargs["targets"] = [construct(reader, item, "targets", section["targets"] + (i,))
                                 for i, item in enumerate(targets)]
        if sampler is not None:
            kwargs["sampler"] = construct(reader, sampler, "sampler", section["sampler"])
            finite = type(kwargs["sampler"]).batches_per_epoch is not Sampler.batches_per_epoch
            if split == "validation" and finite and "epoch_size" not in self.validation.loader:
                kwargs.pop("epoch_size", None)
        return kwargs

    def loader(self, split: str = "train", *, cache_dir=None, demo_shape=None) -> Loader:
        """Build the (not yet started) :class:`~emfast.Loader` of ``split`` ("train" or "validation").

        Opens the volumes (see :meth:`dataset`), builds augmentations, targets and sampler, and binds the
        sampler (its index is built here). Close it, or use it in a ``with`` block, as any Loader: closing it
        closes the files the config opened.

        Raises
        ------
        ConfigError
            Anything the Loader refuses (a patch larger than a volume, a sampler without the data it needs,
            ...), with the key path of the section it comes from.
        """
        kwargs = self.loader_kwargs(split)
        dataset = self.dataset(split, cache_dir=cache_dir, demo_shape=demo_shape)
        try:
            return Loader(dataset, close_data=True, **kwargs)
        except (TypeError, ValueError, KeyError, OSError, DeviceUnavailableError) as error:
            close_volumes(dataset.samples)
            culprit = getattr(error, "emfast_section", None) or "loader"
            overridden = {"loader": bool(self.validation.loader), "sampler": self.validation.sampler is not None,
                          "targets": self.validation.targets is not None,
                          "augment": self.validation.augment is not None}
            section = ("validation", culprit) if split == "validation" and overridden[culprit] else (culprit,)
            if culprit == "loader":
                key = concerned_key(error, self.validation.loader if len(section) == 2 else self.loader_args)
                section += (key,) if key is not None else ()
            reader = self._reader()
            raise reader.error(entry_of(reader, section, error), str(error)) from error
        except BaseException:
            close_volumes(dataset.samples)
            raise

    # -- writing -----------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The config as plain data (what :func:`dump_config` writes): every file as an absolute path, defaults
        left out."""
        data: Dict[str, Any] = {"samples": [spec.to_yaml() for spec in self.samples]}
        if self.hold_out:
            data["hold_out"] = list(self.hold_out)
        out: Dict[str, Any] = {"data": data, "loader": plain(dict(self.loader_args)),
                               **components_yaml(self.augment, self.targets, self.sampler)}
        validation = self.validation.to_yaml()
        if validation:
            out["validation"] = validation
        return out


def _culprit(volume: VolumeSpec, error: BaseException) -> str:
    """The key of a volume's mapping an error opening it concerns: its ``level`` or ``resolution`` where those
    name no level, else its ``dataset``."""
    if isinstance(error, LevelChoiceError):
        return "resolution" if volume.resolution is not None else "level"
    return "dataset"


def close_volumes(samples) -> None:
    """Close the files of the lazy volumes of ``samples`` (a Dataset or Samples) that a config opened. A loader
    built by :meth:`Config.loader` does this itself when it closes."""
    for sample in samples:
        sample.close()


def dump_config(config: Config, path: Union[str, os.PathLike, None] = None) -> str:
    """Write ``config`` as YAML (to ``path`` if given) and return the text.

    ``load_config(dump_config(config)) == config``; the objects built from both are equivalent. A ``predict``
    section beside the training sections is not part of a Config, and is not written.
    """
    text = dump_yaml(config.to_dict())
    if path is not None:
        Path(path).write_text(text)
    return text


def load_config(source: Union[str, os.PathLike]) -> Config:
    """Read a config from a YAML file, or from YAML text.

    Parameters
    ----------
    source : str or path-like
        A path (a path-like, or a string without a newline), or YAML text (a string with a newline). Relative
        file names in the config resolve against the config file's folder (for text: the working directory).

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        Naming the key path and line of the culprit: invalid YAML or a disallowed tag, an unknown key (with the
        closest valid one), a value of the wrong type, a missing required key, an unknown augmentation, target or
        sampler or parameter (with the allowed ones), a parameter value its constructor refuses, a held-out name
        that matches no sample. Files are not opened here; :meth:`Config.loader` reports those problems.
    """
    return _load(*read_source(source, "load_config"))


def _load(text: str, source: str, base: Path) -> Config:
    document, marks = parse_yaml(text, source)
    reader = Reader(marks, source, base)
    reader.mapping(document, (), SECTIONS, required=("data", "loader"))
    if "predict" in document:  # checked here (an empty one too), run by emfast predict (see _predict)
        predict_section(reader, document["predict"], ("predict",))
    data = reader.mapping(document["data"], ("data",), ("samples", "hold_out"), required=("samples",))
    items = reader.listing(data["samples"], ("data", "samples"))
    if not items:
        raise reader.error(("data", "samples"), "expected at least one sample")
    samples = tuple(sample_spec(reader, item, ("data", "samples", i)) for i, item in enumerate(items))
    hold_out = data.get("hold_out") or []
    hold_out = [hold_out] if isinstance(hold_out, str) else reader.listing(hold_out, ("data", "hold_out"))
    names = [spec.name for spec in samples]
    repeated = sorted({n for n in names if n is not None and names.count(n) > 1})
    if repeated:  # before hold_out, which would hold out every sample of the name
        raise reader.error(("data", "samples"), f"sample names must be unique; repeated: {repeated}")
    for index, name in enumerate(hold_out):
        reader.string(name, ("data", "hold_out", index))
        if name not in names:
            named = [n for n in names if n is not None]
            raise reader.error(("data", "hold_out", index),
                               f"{name!r} matches no sample; sample names: {', '.join(map(repr, named)) or 'none'}"
                               + ("" if len(named) == len(names) else " (give every sample a name)"))
    if hold_out and all(name in hold_out for name in names):
        raise reader.error(("data", "hold_out"), "holds out every sample; leave at least one for training")

    loader_args = loader_section(reader, document["loader"], ("loader",), require_patch=True)
    isotropic = loader_args.get("isotropic", loader_default("isotropic"))
    dtype = loader_args.get("dtype", loader_default("dtype"))
    _refuse_empty(reader, document, ())
    parts: Dict[str, Any] = {}
    for key in ("augment", "targets"):
        if document.get(key) is not None:
            parts[key] = components(reader, document[key], (key,), key)
    check_augment(reader, parts.get("augment"), isotropic, dtype, ("augment",))
    if document.get("sampler") is not None:
        parts["sampler"] = component(reader, document["sampler"], ("sampler",), "sampler")

    validation = Validation()
    if document.get("validation") is not None:
        if not hold_out:
            raise reader.error(("validation",), "validation settings need held-out samples: add data.hold_out")
        section = reader.mapping(document["validation"], ("validation",), ("loader", "augment", "targets",
                                                                           "sampler"))
        _refuse_empty(reader, section, ("validation",))
        overrides: Dict[str, Any] = {}
        if section.get("loader") is not None:
            overrides["loader"] = loader_section(reader, section["loader"], ("validation", "loader"), False)
        for key in ("augment", "targets"):
            if section.get(key) is not None:
                overrides[key] = components(reader, section[key], ("validation", key), key)
        validation_loader = {**loader_args, **overrides.get("loader", {})}
        check_augment(reader, overrides.get("augment"), validation_loader.get("isotropic", isotropic),
                      validation_loader.get("dtype", dtype), ("validation", "augment"))
        if section.get("sampler") is not None:
            overrides["sampler"] = component(reader, section["sampler"], ("validation", "sampler"), "sampler")
        validation = Validation(**overrides)
    return Config(samples=samples, loader_args=loader_args, hold_out=tuple(hold_out), validation=validation,
                  source=source, marks=marks, **parts)


def _refuse_empty(reader, section: dict, path: tuple) -> None:
    """An ``augment:``, ``targets:`` or ``sampler:`` key left empty (YAML's null) read as absent: the defaults, or
    under ``validation`` the training settings, where whoever wrote it most likely meant none."""
    for key in ("augment", "targets", "sampler"):
        if key in section and section[key] is None:
            instead = "the training loader's" if path else "the default"
            none = "" if key == "sampler" else f", [] for no {'augmentation' if key == 'augment' else 'targets'}"
            raise reader.error(path + (key,), f"is empty: give {'a sampler' if key == 'sampler' else 'a list'}"
                               f"{none}, or leave the key out for {instead}")
