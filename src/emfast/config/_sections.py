"""Parsing the sections of a config: samples and their volumes, loader arguments, and the augmentations, targets and
sampler by their registered names (``emfast._registry``), each built once to check its parameters."""
from __future__ import annotations

import difflib
import inspect
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union


from ..augment import check_fills
from ..io import is_url, local_path, resolved_above_container
from ..pipeline import LOADER_SETTINGS, NORMALIZE_MODES, PATCH_KEYS, Loader, fixed_normalization
from .._checks import concerned_key
from .._registry import lookup
from ..targets import outputs
from ._yaml import Path_, Reader, describe_value
from ._spec import Builtin, ComponentSpec, SampleSpec, VolumeSpec


# The registry kind of each section that names components.
_KINDS = {"augment": "augmentation", "targets": "target", "sampler": "sampler"}

# Loader arguments that have their own section of the config, or belong to each sample.
_NOT_LOADER_KEYS = {"self", "data", "labels", "augment", "targets", "sampler", "label_offset", "close_data"}


def _loader_keys() -> List[str]:
    return [name for name in inspect.signature(Loader.__init__).parameters if name not in _NOT_LOADER_KEYS]


def loader_default(name: str):
    return inspect.signature(Loader.__init__).parameters[name].default


# -- parsing the sections -----------------------------------------------------------------------------------------

#: The sections a config file may have (one with only ``predict`` is a prediction's config).
SECTIONS = ("data", "loader", "augment", "targets", "sampler", "validation", "predict")
_SAMPLE_KEYS = ("name", "file", "raw", "labels", "mask", "extra", "weight", "label_offset", "mask_offset", "lazy",
                "cache_bytes", "own_resolution", "storage_options")


def _file(reader: Reader, value, path: Path_) -> Union[Path, Builtin, str]:
    if isinstance(value, dict):
        reader.mapping(value, path, ("builtin", "shape", "seed"), required=("builtin",))
        if value["builtin"] != "demo":
            raise reader.error(path + ("builtin",), f"the only built-in volume is 'demo', got "
                                                    f"{describe_value(value['builtin'])}")
        shape = value.get("shape")
        return Builtin(None if shape is None else reader.triple(shape, path + ("shape",), minimum=8),
                       reader.integer(value.get("seed", 0), path + ("seed",), minimum=0))
    text = reader.string(value, path)
    if is_url(text):  # a remote store (s3://, gs://, http(s)://), kept as its URL
        return text
    try:
        file = local_path(text)  # ~ and file:// URLs, as emfast.open reads them
    except ValueError as error:
        raise reader.error(path, str(error)) from None
    # the store's own name kept: one reached through a link (fast.zarr -> scratch space) keeps its format's suffix
    return resolved_above_container(file if file.is_absolute() else reader.base / file)


def _volume(reader: Reader, value, path: Path_, sample_file) -> VolumeSpec:
    if isinstance(value, str):
        if sample_file is None:
            raise reader.error(path, f"{value!r} names a dataset, but the sample has no 'file'; write "
                                     "{file: ..., dataset: ...} or give the sample a file")
        return VolumeSpec(sample_file, value, shared_file=True)
    reader.mapping(value, path, ("file", "dataset", "level", "resolution"),
                   required=("dataset",) if sample_file else ("file", "dataset"))
    dataset = _dataset(reader, value["dataset"], path + ("dataset",))
    level, resolution = _level_choice(reader, value, path)
    if "file" in value:
        return VolumeSpec(_file(reader, value["file"], path + ("file",)), dataset, level=level, resolution=resolution)
    return VolumeSpec(sample_file, dataset, shared_file=True, level=level, resolution=resolution)


def _dataset(reader: Reader, value, path: Path_) -> str:
    """A volume's dataset path: "" is the array (or image) at the store's root, as in the short form."""
    if not isinstance(value, str):
        raise reader.error(path, f"expected a dataset path (\"\" for the array or image at the store's root), got "
                                 f"{describe_value(value)}")
    return value


def _level_choice(reader: Reader, value: dict, path: Path_) -> tuple:
    """(level, resolution) of a volume's mapping ``value``: which level of a multiscale image it reads, by index or
    by voxel size (at most one given; None where not, null included, as for the other optional keys)."""
    level, resolution = value.get("level"), value.get("resolution")
    if level is not None and resolution is not None:
        raise reader.error(path + ("resolution",), "give level or resolution, not both")
    level = None if level is None else reader.integer(level, path + ("level",), minimum=0)
    resolution = None if resolution is None else _resolution(reader, resolution, path + ("resolution",))
    return level, resolution


def _resolution(reader: Reader, value, path: Path_) -> Tuple[float, float, float]:
    """A (z, y, x) voxel size: three positive numbers."""
    if not isinstance(value, list) or len(value) != 3:
        raise reader.error(path, f"expected a list of 3 positive numbers [z, y, x] (nm), got {describe_value(value)}")
    return tuple(float(reader.number(v, path + (i,), positive=True)) for i, v in enumerate(value))


def sample_spec(reader: Reader, value, path: Path_) -> SampleSpec:
    reader.mapping(value, path, _SAMPLE_KEYS, required=("raw",))
    if value["raw"] is None:  # "raw:" left empty (its dataset commented out, say)
        raise reader.error(path + ("raw",), "is empty; give the raw volume: a dataset path in the sample's file, "
                                            "or a mapping with file and dataset")
    file = _file(reader, value["file"], path + ("file",)) if "file" in value else None
    volumes = {key: _volume(reader, value[key], path + (key,), file) for key in ("raw", "labels", "mask")
               if value.get(key) is not None}
    extra = value.get("extra") or {}
    if not isinstance(extra, dict):
        raise reader.error(path + ("extra",), f"expected a mapping of field name to volume, got {describe_value(extra)}")
    extra = tuple((reader.string(key, path + ("extra",)), _volume(reader, item, path + ("extra", str(key)), file))
                  for key, item in extra.items())
    optional = {}
    if value.get("name") is not None:
        optional["name"] = reader.string(value["name"], path + ("name",))
    if "weight" in value:
        optional["weight"] = reader.number(value["weight"], path + ("weight",), positive=True)
    for key in ("label_offset", "mask_offset"):
        if value.get(key) is not None:
            optional[key] = reader.triple(value[key], path + (key,))
    if "lazy" in value:
        optional["lazy"] = reader.boolean(value["lazy"], path + ("lazy",))
    if value.get("cache_bytes") is not None:
        optional["cache_bytes"] = reader.integer(value["cache_bytes"], path + ("cache_bytes",), minimum=1)
        if not optional.get("lazy"):
            raise reader.error(path + ("cache_bytes",), "cache_bytes applies to lazy volumes; add lazy: true")
    for key, offset in (("label_offset", "labels"), ("mask_offset", "mask")):
        if key in optional and offset not in volumes:
            raise reader.error(path + (key,), f"{key} was given but the sample has no {offset}")
    if value.get("storage_options") is not None:
        optional["storage_options"] = storage_options_of(reader, value["storage_options"], path + ("storage_options",),
                                                       [volume.file for volume in volumes.values()] +
                                                       [volume.file for _, volume in extra])
    if value.get("own_resolution") is not None:
        optional["own_resolution"] = _own_resolution(reader, value["own_resolution"], path + ("own_resolution",),
                                                     [*volumes, *(key for key, _ in extra)])
    return SampleSpec(extra=extra, **volumes, **optional)


def storage_options_of(reader: Reader, value, path: Path_, files, owner: str = "sample") -> tuple:
    """fsspec's options for the remote ones of ``files`` (e.g. ``endpoint_url``), as sorted (key, value) pairs;
    ``owner`` reads the files, for the refusal where none is remote."""
    if not isinstance(value, dict):
        raise reader.error(path, f"expected a mapping of fsspec options, got {describe_value(value)}")
    if not any(isinstance(file, str) and is_url(file) for file in files):
        raise reader.error(path, "storage_options applies to remote files (s3://, gs://, http(s)://); this "
                                 f"{owner} reads none")
    return tuple(sorted((str(key), item) for key, item in value.items()))


def _own_resolution(reader: Reader, value, path: Path_, fields) -> tuple:
    """The fields a sample delivers at their own voxel size: a list of its field names (not raw)."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list):
        raise reader.error(path, f"expected a list of field names, got {describe_value(value)}")
    for n, name in enumerate(names):
        name = reader.string(name, path + (n,))
        if name == "raw" or name not in fields:
            raise reader.error(path + (n,), f"{name!r} is not a field of this sample that can be delivered at its own "
                                            f"voxel size; its fields: {[f for f in fields if f != 'raw']}")
    return tuple(names)


def _check_normalize(reader: Reader, value, path: Path_):
    if value is None or (isinstance(value, str) and value in NORMALIZE_MODES):
        return value
    if isinstance(value, list) and len(value) == 2:
        for index, item in enumerate(value):
            reader.number(item, path + (index,))
        return _fixed(reader, value, path)
    if isinstance(value, dict):
        reader.mapping(value, path, ("mean", "std"), required=("mean", "std"))
        reader.number(value["mean"], path + ("mean",))
        reader.number(value["std"], path + ("std",), positive=True)
        return _fixed(reader, value, path)
    modes = ", ".join(repr(mode) for mode in NORMALIZE_MODES)
    raise reader.error(path, f"expected one of {modes}, [scale, shift] or {{mean: m, std: s}}; got "
                             f"{describe_value(value)}")


def _fixed(reader: Reader, value, path: Path_):
    """``value``, a normalisation that needs no data, if the kernels can apply it (checked before any volume is
    read, so that ``emfast check`` refuses what predict and the Loader would)."""
    try:
        fixed_normalization(value)
    except ValueError as error:
        raise reader.error(path, str(error)) from None
    return value


def _check_loader_value(reader: Reader, key: str, value, path: Path_):
    """A loader value checked by the Loader's own check of that setting (:data:`emfast.pipeline.LOADER_SETTINGS`),
    so that YAML and Python refuse it in the same words; the device and normalisation by their form here (the
    Loader checks them against the machine and the data when built)."""
    path = path + (key,)
    if key in LOADER_SETTINGS:
        try:
            LOADER_SETTINGS[key](value)
        except (TypeError, ValueError) as error:
            raise reader.error(path, str(error)) from None
        return list(value) if key in PATCH_KEYS else value
    if key == "device":
        return reader.string(value, path)
    if key == "normalize":
        return _check_normalize(reader, value, path)
    return value


def loader_section(reader: Reader, value, path: Path_, require_patch: bool) -> Dict[str, Any]:
    keys = _loader_keys()
    reader.mapping(value, path, keys)
    if require_patch and not set(PATCH_KEYS) & set(value):
        raise reader.error(path, "missing required key 'patch' (or 'patch_in' and 'patch_out')")
    return {key: _check_loader_value(reader, key, item, path) for key, item in value.items()}


def _signature_parameters(cls: type) -> Optional[List[str]]:
    """Keyword parameters of ``cls``'s constructor; None if it takes ``**kwargs``."""
    parameters = list(inspect.signature(cls).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                      inspect.Parameter.KEYWORD_ONLY)]


def construct(reader: Reader, spec: ComponentSpec, section: str, path: Path_):
    """Build the object of ``spec`` from its registry, mapping constructor errors to ConfigError at ``path``."""
    kind = _KINDS[section]
    cls = lookup(kind, spec.name)
    try:
        return cls(**spec.params)
    except (TypeError, ValueError) as error:
        key = concerned_key(error, spec.params)
        where = path + (spec.name,) + ((key,) if key is not None else ())
        allowed = _signature_parameters(cls)
        note = "" if allowed is None or not isinstance(error, TypeError) else \
            f" (parameters of {kind} {spec.name!r}: {', '.join(allowed) or 'none'})"
        raise reader.error(where, f"{error}{note}") from error


def component(reader: Reader, value, path: Path_, section: str) -> ComponentSpec:
    kind = _KINDS[section]
    if isinstance(value, str):
        name, params, params_path = value, {}, path
    elif isinstance(value, dict) and len(value) == 1:
        name, params = next(iter(value.items()))
        params_path = path + (str(name),)
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise reader.error(params_path, f"the parameters of {kind} {name!r} must be a mapping "
                                            f"{{parameter: value}}, got {describe_value(params)}")
    else:
        raise reader.error(path, f"expected a {kind} name, or a mapping {{name: {{parameter: value}}}} with one "
                                 f"name; got {describe_value(value)}")
    try:
        cls = lookup(kind, str(name))
    except ValueError as error:
        raise reader.error(params_path, str(error)) from None
    allowed = _signature_parameters(cls)
    for key in params:
        if allowed is not None and key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise reader.error(params_path + (str(key),),
                               f"unknown parameter {key!r} of {kind} {name!r}{hint} (parameters: "
                               f"{', '.join(allowed) or 'none'})")
    spec = ComponentSpec(name, params)
    construct(reader, spec, section, path)
    return spec


def components(reader: Reader, value, path: Path_, section: str) -> Tuple[ComponentSpec, ...]:
    if isinstance(value, (str, dict)):
        value = [value]  # a single item
    items = tuple(component(reader, item, path + (index,), section)
                  for index, item in enumerate(reader.listing(value, path)))
    if section == "targets":
        try:
            outputs([construct(reader, item, section, path) for item in items])
        except ValueError as error:
            raise reader.error(entry_of(reader, path, error), str(error)) from error
    return items


def entry_of(reader: Reader, section: tuple, error: BaseException) -> tuple:
    """``section``, narrowed to the entry of its list (an augmentation, a target) and the parameter of it that
    ``error`` concerns, as far as the YAML spells them out (a bare name has no parameters)."""
    item = getattr(error, "emfast_item", None)
    if item is None or section[-1] not in ("augment", "targets"):
        return section
    index, name = item
    path = section + (index,)
    if not reader.has(path):  # not written as a list entry (one mapping; the loader's default augmentations)
        return section
    if reader.has(path + (name,)):
        path += (name,)
        key = concerned_key(error, _keys(reader, path))
        path += (key,) if key is not None else ()
    return path


def _keys(reader, path: tuple) -> list:
    """The keys the YAML gives below ``path``."""
    return [mark[-1] for mark in reader.marks if len(mark) == len(path) + 1 and mark[:-1] == path]


def check_augment(reader: Reader, items: Optional[Tuple[ComponentSpec, ...]], isotropic: bool, dtype,
                   path: Path_) -> None:
    """Refuse an augmentation the Loader would: one that needs ``isotropic``, or a fill beyond the batches'
    ``dtype`` (named at its item and key, which the Loader, refusing it later, cannot name)."""
    for index, item in enumerate(items or ()):
        try:
            augmentation = construct(reader, item, "augment", path + (index,))
            augmentation.check(isotropic)
            check_fills([augmentation], dtype)
        except ValueError as error:
            key = concerned_key(error, item.params)
            raise reader.error(path + (index,) + ((item.name, key) if key is not None else ()), str(error)) \
                from error
