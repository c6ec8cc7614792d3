"""The ``predict`` section of a config, run by ``emfast predict CONFIG``: the model as ``module:function`` (a
factory returning the network), the input and output, and the keyword arguments of :func:`emfast.predict`::

    predict:
      model: nets:load_unet                 # imported with the config's folder on the path
      model_args: {checkpoint: unet.pt}     # keyword arguments of the factory
      input: sample.zarr/raw                # or {file: ..., dataset: ...}; file may be {builtin: demo}
      output: sample.zarr/affinities
      patch_in: [20, 132, 132]
      patch_out: [12, 92, 92]
      overlap: [2, 16, 16]
      blend: gaussian
      tta: 8
      engine: local                         # or {dask: {address: tcp://host:8786}} or {dask: {workers: 2}}

A config may hold this section beside the training sections, or alone. Reading it checks every value without
opening a file; :meth:`PredictSpec.check` (run by ``emfast check`` and before ``emfast predict``) then imports the
model factory without calling it, matches ``model_args`` to its parameters, checks ``device``, opens the input and
lays the tiles over it. Every problem is a :class:`ConfigError` naming the file, line and key path
(``predict.model_args.checkpoint``), each attributed by the step that checks that key.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Tuple, Union

from .._checks import check_threads, concerned_key
from .._core.gather import PAD_MODES
from ..inference import (BLENDS, CACHE_SHARE, CHUNK_EDGE, COMPRESSIONS, DEFAULT_MEMORY, FLAGS_SUFFIX,
                         PREDICT_OUTPUT_DTYPE_NAMES, TTA_COUNTS, InputDtypeError, Prediction, TilePlan, block_estimate,
                         budget_block, check_fill, check_input_dtype, check_torch_device, input_cache_refusal,
                         parse_memory, predict, prediction_complete, too_large_block, variants)
from ..io import (CacheBudgetError, LevelChoiceError, UnfinishedOutputWarning, check_compression,
                  check_output_location, open_volume, parse_output)
from ..transfer import cuda_ordinal
from ._sections import SECTIONS, _check_normalize, _dataset, _file, _level_choice, storage_options_of
from ._spec import Builtin, plain
from ._yaml import ConfigError, Path_, Reader, describe_value, parse_yaml, read_source

#: Keys of the section that are not predict()'s keywords: the model's factory and arguments, the input and output
#: (predict's volume, with its level or resolution, and out), and the Dask engine (its client).
_SECTION_KEYS = ("model", "model_args", "input", "output", "engine")
#: predict()'s parameters a section does not set: given above under other names, or by ``emfast predict``'s flags.
_NOT_KEYS = {"model", "volume", "out", "level", "resolution", "storage_options", "client", "resume", "overwrite",
             "progress"}
#: Every key of the section: predict()'s own settings are its keywords, declared once in its signature.
_KEYS = _SECTION_KEYS + tuple(name for name in inspect.signature(predict).parameters if name not in _NOT_KEYS)
_CHOICES = {"blend": BLENDS, "tta": TTA_COUNTS, "pad": PAD_MODES, "dtype": PREDICT_OUTPUT_DTYPE_NAMES,
            "compression": COMPRESSIONS, "zarr_format": (2, 3)}
#: The input dataset when ``input`` is the built-in volume.
_DEMO_DATASET = "volumes/raw"


@dataclass(frozen=True)
class PredictSpec:
    """A parsed ``predict`` section.

    Attributes
    ----------
    model : str
        ``module:function`` of the factory that returns the network.
    model_args : mapping
        Keyword arguments of the factory.
    input : Path or Builtin
        The input file or store (a path may name the dataset after the container).
    dataset : str or None
        The input dataset, when not part of ``input``.
    level, resolution : int, (float, float, float) or None
        The level of a multiscale input to read (by index, or by its voxel size); None: the finest.
    storage_options : tuple of (str, value)
        fsspec's options for a remote input (e.g. ``endpoint_url``), as sorted pairs; left out of the spec's
        repr (they may hold credentials) and of the output's record; :meth:`to_yaml` writes them back.
    output : Path
        ``container/dataset`` of the output.
    options : mapping
        The other keyword arguments of :func:`emfast.predict`.
    engine : mapping or None
        None: run here; else the ``dask`` settings (``address`` of a scheduler, or ``workers`` of a local cluster).
    base : Path
        The config's folder: relative paths resolve, and model modules import, from there.
    source : str
        The config file (or ``"<text>"``), and ``marks`` the line of every key: what errors name.
    """

    model: str
    input: Union[Path, Builtin]
    output: Path
    options: Mapping[str, Any]
    model_args: Mapping[str, Any] = field(default_factory=dict)
    dataset: Optional[str] = None
    level: Optional[int] = None
    resolution: Optional[Tuple[float, float, float]] = None
    storage_options: Tuple[Tuple[str, Any], ...] = field(default=(), repr=False)
    engine: Optional[Mapping[str, Any]] = None
    base: Path = Path(".")
    source: str = field(default="<text>", compare=False)
    marks: Mapping[Path_, int] = field(default_factory=dict, compare=False, repr=False)

    def error(self, key: Path_, reason: str) -> ConfigError:
        """A :class:`ConfigError` for ``predict.<key>``, with the config's file and the key's line."""
        return Reader(dict(self.marks), self.source, self.base).error(("predict",) + key, reason)

    # -- the model ---------------------------------------------------------------------------------------------

    def factory(self) -> Callable:
        """Import the model factory (``module:function``, the module found from the config's folder first) without
        calling it.

        Raises
        ------
        ConfigError
            At ``predict.model``: the module cannot be imported or raises while importing (with the file and
            line of the failure inside it), or has no such callable.
        """
        module_name, _, function = self.model.partition(":")
        added = str(self.base) not in sys.path
        if added:
            sys.path.insert(0, str(self.base))
        _forget_if_elsewhere(module_name, self.base)
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # anything the user's module raises while importing is reported, not a bug
            raise self.error(("model",), f"cannot import the module {module_name!r} of {self.model}: "
                                         f"{_what_failed(error)}") from error
        finally:
            if added:
                sys.path.remove(str(self.base))
        factory = getattr(module, function, None)
        if factory is None:
            close = difflib.get_close_matches(function, [n for n in dir(module) if not n.startswith("_")], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise self.error(("model",), f"the module {module_name!r} ({getattr(module, '__file__', '?')}) has "
                                         f"no {function!r}{hint}")
        if not callable(factory):
            raise self.error(("model",), f"{self.model} is {describe_value(factory)}, not a factory function")
        return factory

    def check_model_args(self, factory: Callable) -> None:
        """``model_args`` against the factory's parameters: every key one of them, every required one given.

        Raises
        ------
        ConfigError
            At ``predict.model_args.<key>`` for a key the factory does not take (with the closest one), at
            ``predict.model_args`` for a required parameter left out.
        """
        try:
            signature = inspect.signature(factory)
        except (TypeError, ValueError):  # a callable without a readable signature (some C functions)
            return
        parameters = signature.parameters.values()
        named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            for key in self.model_args:
                if key not in named:
                    close = difflib.get_close_matches(str(key), named, n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise self.error(("model_args", str(key)), f"{self.model} takes no argument {key!r}{hint} "
                                                               f"(it takes: {', '.join(named) or 'none'})")
        missing = [p.name for p in parameters if p.default is p.empty
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in self.model_args]
        if missing:
            raise self.error(("model_args",), f"{self.model} needs {', '.join(map(repr, missing))}: add "
                                              f"{'them' if len(missing) > 1 else 'it'} to model_args")

    def load_model(self) -> Callable:
        """Import the factory, check ``model_args`` against it and call it.

        Raises
        ------
        ConfigError
            As :meth:`factory` and :meth:`check_model_args`; and at ``predict.model`` when the factory raises,
            naming the exception and where it was raised, or returns something that cannot be called.
        """
        factory = self.factory()
        self.check_model_args(factory)
        try:
            model = factory(**self.model_args)
        except Exception as error:  # the user's factory failing (a missing checkpoint...) is reported, not a bug
            raise self.error(("model",), f"{self.model}(**model_args) failed: {_what_failed(error)}") from error
        if not callable(model):  # a factory returning its checkpoint's state dict, say: the user's slip, not ours
            raise self.error(("model",), f"{self.model}(**model_args) returned {describe_value(model)}, not a "
                                         "network: the factory must return a callable (a function or a torch "
                                         "module)")
        return model

    # -- the device, the input, the tiles ----------------------------------------------------------------------

    def check_device(self) -> Optional[str]:
        """Whether ``device`` can be used here: PyTorch installed, the name a torch device, a GPU there for
        ``cuda``. Returns a description of the device (None without one).

        Raises
        ------
        ConfigError
            At ``predict.device``.
        """
        device = self.options.get("device")
        if device is None:
            return None
        try:
            # a scheduler's address: the workers open the device on their machines, not here
            return check_torch_device(device, here=self.engine is None or "address" not in self.engine)
        except (ImportError, ValueError) as error:
            raise self.error(("device",), str(error)) from None

    def plan(self, cache_dir=None) -> TilePlan:
        """Open the input and lay the tiles over it as :func:`emfast.predict` will.

        A refusal names the key of the setting it concerns (``patch_out``, ``overlap``, ``roi``, ``block``;
        ``patch_in`` when ``patch_out`` is not given).

        Raises
        ------
        ConfigError
            At ``predict.input`` (or its ``file``/``dataset``) when the input cannot be opened, else at the key
            whose value does not fit the input or the other values.
        """
        mapped = self.dataset is not None or self.level is not None or self.resolution is not None \
            or bool(self.storage_options)
        input_key = ("input", "file") if mapped and not isinstance(self.input, Builtin) else ("input",)
        try:
            with warnings.catch_warnings():  # predict refuses it: so is it here, at the input's key
                warnings.simplefilter("error", UnfinishedOutputWarning)
                volume = open_volume(self.input_path(cache_dir), in_memory=False, **self._opening())
        except UnfinishedOutputWarning as warning:
            raise self.error(input_key, f"{warning}; predict does not read an unfinished output") from None
        except LevelChoiceError as error:
            raise self.error(("input", "resolution" if self.resolution is not None else "level"), str(error)) \
                from None
        except KeyError as error:
            raise self.error(("input", "dataset") if self.dataset else input_key, str(error).strip("'\"")) from None
        except (OSError, ValueError) as error:
            key = ("input", "storage_options") if concerned_key(error, ("storage_options",)) else input_key
            raise self.error(key, str(error)) from None
        try:
            check_input_dtype(volume)
            shape, chunks = volume.shape, self.options.get("chunks")
            channels_in, itemsize_in = volume.channels, volume.dtype.itemsize
            try:
                check_fill(self.options.get("fill", 0), volume, self.options.get("pad", "reflect"))
            except ValueError as error:
                raise self.error(("fill",), str(error)) from None
            container, dataset, kind = parse_output(self.output, companions=(FLAGS_SUFFIX,))
            try:  # the input itself, inside it or above it: refused whatever ran before, so checked here too
                check_output_location(container, dataset, kind, volume.stamp, "input")
            except ValueError as error:
                raise self.error(("output",), str(error)) from None
        except InputDtypeError as error:
            raise self.error(input_key, str(error)) from None
        finally:
            volume.close()
        if self.options.get("memory") is not None:  # predict gives the input's chunk cache a share of it
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UnfinishedOutputWarning)
                    open_volume(self.input_path(cache_dir), in_memory=False,
                                cache_bytes=self.options["memory"] // CACHE_SHARE, **self._opening()).close()
            except CacheBudgetError as error:
                raise self.error(("memory",), str(input_cache_refusal(error, self.options["memory"]))) from None
        chunks = chunks or tuple(min(CHUNK_EDGE, s) for s in shape)  # predict's default
        patch_in = self.options["patch_in"]
        patch_out = self.options.get("patch_out", patch_in)
        blend = self.options.get("blend", "gaussian")
        overlap = self.options.get("overlap", (0, 0, 0) if blend == "none" else tuple(p // 4 for p in patch_out))
        try:
            plan = TilePlan(shape, patch_in, patch_out, overlap, chunks, self.options.get("roi"),
                            self.options.get("block"), crop=blend == "none")
        except ValueError as error:  # the plan's refusals name their setting (patch_out given as patch_in here)
            key = concerned_key(error, self.options) or "patch_in"
            raise self.error((key,), f"{error} (input {self.input_path(cache_dir)}, shape {shape})") from None
        budget = self.options.get("memory") or DEFAULT_MEMORY
        if self.options.get("block") is None:  # laid within the budget, as predict lays them
            try:
                block = budget_block(plan, self._estimate(plan, channels_in, itemsize_in), budget,
                                     budget // CACHE_SHARE)
            except ValueError as error:
                raise self.error(("memory",), str(error)) from None
            plan = TilePlan(shape, patch_in, patch_out, overlap, chunks, self.options.get("roi"), block,
                            crop=blend == "none")
        elif self.options.get("memory") is not None:
            self._check_block_fits(plan, channels_in, itemsize_in)
        return plan

    def _estimate(self, plan: TilePlan, channels_in: int, itemsize_in: int):
        """predict's estimate of a block's bytes, counting the model's output channels as ``channels`` says, or as
        1 (the least) where only the model knows them."""
        options = self.options
        return block_estimate(plan, channels_in, itemsize_in, options.get("channels", 1),
                              options.get("dtype", "float32"), options.get("threads", 2), options.get("batch_size", 1),
                              len(variants(options.get("tta", 0), plan.patch_in, plan.patch_out)))

    def _check_block_fits(self, plan: TilePlan, channels_in: int, itemsize_in: int) -> None:
        """Refuse a given block that memory cannot hold, as predict will."""
        options = self.options
        error = too_large_block(plan.block, self._estimate(plan, channels_in, itemsize_in), options["memory"],
                                options["memory"] // CACHE_SHARE)
        if error is not None:
            counted = "" if "channels" in options else " (counting 1 output channel: the model may have more)"
            raise self.error(("block",), f"{error}{counted}")

    def check(self, cache_dir=None) -> List[str]:
        """Everything that can be checked without calling the model: the factory imports, ``model_args`` fit
        it, the device is there, the input opens and the tiles fit it. Returns the summary ``emfast check``
        prints.

        Raises
        ------
        ConfigError
            Naming the file, line and key of the first problem.
        """
        factory = self.factory()
        self.check_model_args(factory)
        device = self.check_device()
        plan = self.plan(cache_dir)
        where = getattr(inspect.getmodule(factory), "__file__", None)
        return [f"predict: model {self.model}" + (f" ({where})" if where else "")
                + (f" with {', '.join(f'{k}={v!r}' for k, v in self.model_args.items())}" if self.model_args else ""),
                f"  input {self.input_path(cache_dir)}{''.join(f' ({k} {v})' for k, v in self._level().items())}, "
                f"shape {plan.shape}; output {self.output}",
                f"  {plan.tile_count} tiles of {plan.patch_out} (input {plan.patch_in}, overlap {plan.overlap}) "
                f"in {len(plan.blocks())} blocks of {plan.block} over {plan.roi[0]}..{plan.roi[1]}"
                + ("" if "channels" in self.options or "block" in self.options else
                   " (for 1 output channel: the model's may make them smaller)"),
                f"  device: {device or 'none (the model gets NumPy arrays)'}",
                "  engine: " + ("local" if self.engine is None else f"dask {dict(self.engine)}")]

    def _level(self) -> dict:
        """The input's level or resolution, as :func:`emfast.open` and :func:`emfast.predict` take them."""
        return {key: value for key, value in (("level", self.level), ("resolution", self.resolution))
                if value is not None}

    def _opening(self) -> dict:
        """How the input is opened: :meth:`_level`, and a remote input's ``storage_options``."""
        remote = {"storage_options": dict(self.storage_options)} if self.storage_options else {}
        return dict(self._level(), **remote)

    def input_path(self, cache_dir=None) -> str:
        if isinstance(self.input, Builtin):
            return str(self.input.path(cache_dir) / (self.dataset or _DEMO_DATASET))
        if not self.dataset:
            return str(self.input)
        if isinstance(self.input, str):  # a remote store's URL: its dataset is a key below it
            return f"{self.input.rstrip('/')}/{self.dataset.lstrip('/')}"
        return str(self.input / self.dataset.lstrip("/"))  # "/raw" is inside the file, as HDF5 names it

    def run(self, *, resume: bool = False, overwrite: bool = False, progress=True, cache_dir=None) -> Prediction:
        """Run the prediction; a Dask engine gets a client for the run's duration."""
        arguments = dict(self.options, resume=resume, overwrite=overwrite, progress=progress, **self._opening())
        self.check_device()
        self.plan(cache_dir)
        # a finished output is left as it is: its model is not loaded (a checkpoint read, a device set up) to be
        # never called
        model = _NotLoaded(self.model) if resume and prediction_complete(self.output) else self.load_model()
        try:
            return self._predict(model, arguments, cache_dir)
        except ValueError as error:  # what only the run finds (a memory too small for a block) names its key
            key = concerned_key(error, self.options)
            if key is None:
                raise
            raise self.error((key,), str(error)) from None

    def _predict(self, model, arguments: dict, cache_dir) -> Prediction:
        if self.engine is None:
            return predict(model, self.input_path(cache_dir), self.output, **arguments)
        from distributed import Client, LocalCluster

        if "address" in self.engine:
            address = self.engine["address"]
            try:
                client = Client(address)
            except (OSError, ValueError) as error:  # no scheduler answered within Dask's connect timeout
                raise self.error(("engine", "dask", "address"), f"no Dask scheduler answers at {address!r}: "
                                                                f"{error}") from None
            with client:
                self._send_model_module(client)
                return predict(model, self.input_path(cache_dir), self.output, client=client, **arguments)
        with LocalCluster(n_workers=self.engine["workers"], threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            self._send_model_module(client)
            return predict(model, self.input_path(cache_dir), self.output, client=client, **arguments)

    def _send_model_module(self, client) -> None:
        """Give the Dask workers the model's module when the config's folder is why it imports (a module or a
        package directly in that folder): the workers do not have that folder on their path, and could not
        import it by name ("No module named 'nets'"). A package goes as a zip of its folder. A module found
        elsewhere, an installed one included, is the workers' to import as it is."""
        module = sys.modules.get(self.model.partition(":")[0].split(".")[0])
        if module is None:
            return
        here = _module_location(module.__name__)
        there = client.run(_module_location, module.__name__)
        if there and all(location == here for location in there.values()):  # installed where the workers are
            return
        base = Path(self.base).resolve()
        where = getattr(module, "__file__", None)
        if where is not None and Path(where).resolve().parent == base:  # nets.py
            # and the modules beside it that it imported (from helpers import crop): sent first, not imported
            # there until nets.py is (one may import another), as only nets.py went and "No module named
            # 'helpers'" ended a run that works locally
            for sibling in _modules_in(base, besides=module):
                client.upload_file(sibling, load=False)
            client.upload_file(str(Path(where).resolve()))
            return
        folders = [Path(f).resolve() for f in getattr(module, "__path__", [])]  # a package, a namespace one too
        folder = next((f for f in folders if f.parent == base), None)
        if folder is None:
            return
        with tempfile.TemporaryDirectory() as scratch:
            client.upload_file(shutil.make_archive(str(Path(scratch) / folder.name), "zip", root_dir=base,
                                                   base_dir=folder.name))

    def to_yaml(self) -> dict:
        out = {"model": self.model}
        if self.model_args:
            out["model_args"] = plain(self.model_args)
        out["input"] = self.input.to_yaml() if isinstance(self.input, Builtin) else str(self.input)
        mapped = {"dataset": self.dataset, "level": self.level,
                  "resolution": None if self.resolution is None else list(self.resolution),
                  "storage_options": plain(dict(self.storage_options)) if self.storage_options else None}
        if any(value is not None for value in mapped.values()):  # the level was lost: written as the finest's
            out["input"] = dict({"file": out["input"]}, **{k: v for k, v in mapped.items() if v is not None})
        out["output"] = str(self.output)
        out.update(plain(self.options))
        if self.engine is not None:
            out["engine"] = {"dask": plain(self.engine)}
        return out


def predict_section(reader: Reader, value, path: Path_) -> PredictSpec:
    section = reader.mapping(value, path, _KEYS, required=("model", "input", "output", "patch_in"))
    model = reader.string(section["model"], path + ("model",))
    module, _, function = model.partition(":")
    if not module or not function.isidentifier():
        raise reader.error(path + ("model",), f"expected module:function (a factory returning the network), got "
                                              f"{model!r}")
    given = section.get("model_args")
    if given is not None and not isinstance(given, dict):  # 5, [] or 0 was read as no arguments, or crashed
        raise reader.error(path + ("model_args",), f"expected a mapping of the factory's keyword arguments, got "
                                                   f"{describe_value(given)}")
    model_args = reader.mapping(given or {}, path + ("model_args",), tuple(map(str, given or {})))
    dataset = level = resolution = None
    storage_options: tuple = ()
    source = section["input"]
    if isinstance(source, dict) and "file" in source:  # else a built-in volume ({builtin: demo})
        reader.mapping(source, path + ("input",), ("file", "dataset", "level", "resolution", "storage_options"),
                       required=("file",))
        if source.get("dataset") is not None:  # "": the store's root, as the file alone (and null: not given)
            dataset = _dataset(reader, source["dataset"], path + ("input", "dataset"))
        level, resolution = _level_choice(reader, source, path + ("input",))
        if source.get("storage_options") is not None:
            storage_options = storage_options_of(reader, source["storage_options"],
                                                 path + ("input", "storage_options"), [source["file"]], "input")
        source = source["file"]
        where = path + ("input", "file")
    else:
        where = path + ("input",)
    if isinstance(source, dict):  # a built-in volume without a dataset reads its raw
        dataset = dataset or _DEMO_DATASET
    input_file = _file(reader, source, where)
    output = _file(reader, reader.string(section["output"], path + ("output",)), path + ("output",))
    options = {"patch_in": reader.triple(section["patch_in"], path + ("patch_in",), minimum=1, window=True)}
    for key in ("patch_out", "overlap", "chunks", "block"):
        if section.get(key) is not None:
            options[key] = reader.triple(section[key], path + (key,), minimum=0 if key == "overlap" else 1,
                                         window=key == "patch_out")
    if section.get("roi") is not None:
        roi = reader.mapping(section["roi"], path + ("roi",), ("start", "stop"), required=("start", "stop"))
        options["roi"] = (reader.triple(roi["start"], path + ("roi", "start"), minimum=0),
                          reader.triple(roi["stop"], path + ("roi", "stop"), minimum=1))
    for key, choices in _CHOICES.items():
        if section.get(key) is not None:
            if section[key] not in choices:
                raise reader.error(path + (key,), f"expected one of {', '.join(map(str, choices))}, got "
                                                  f"{describe_value(section[key])}")
            options[key] = section[key]
    for key in ("channels", "batch_size", "threads"):
        if section.get(key) is not None:
            options[key] = reader.integer(section[key], path + (key,), minimum=1)
    if section.get("fill") is not None:
        options["fill"] = reader.number(section["fill"], path + ("fill",))
    if section.get("normalize") is not None:
        options["normalize"] = _check_normalize(reader, section["normalize"], path + ("normalize",))
    if section.get("device") is not None:
        options["device"] = reader.string(section["device"], path + ("device",))
    if section.get("cuda_graphs") is not None:
        options["cuda_graphs"] = reader.boolean(section["cuda_graphs"], path + ("cuda_graphs",))
        device = options.get("device")
        if options["cuda_graphs"] and cuda_ordinal(device) is None:
            raise reader.error(path + ("cuda_graphs",), f"CUDA graphs need device: cuda (or cuda:N), not "
                                                        f"{describe_value(device)}")
    if section.get("memory") is not None:
        try:
            options["memory"] = parse_memory(section["memory"])
        except ValueError as error:
            raise reader.error(path + ("memory",), str(error)) from None
    engine = _engine(reader, section.get("engine"), path + ("engine",))
    _check_output(reader, output, options.get("compression"), engine, path)
    if engine is None and "threads" in options:  # predict's reader threads; a Dask engine starts none here
        try:
            check_threads(options["threads"])
        except ValueError as error:
            raise reader.error(path + ("threads",), str(error)) from None
    return PredictSpec(model, input_file, output, options, dict(model_args), dataset, level, resolution,
                       storage_options, engine, reader.base, reader.source, reader.marks)


def _check_output(reader: Reader, output: Path, compression: Optional[str], engine, path: Path_) -> None:
    """The output names a dataset in a .zarr or .h5 container (.zarr with a Dask engine), and the compression suits
    that container."""
    try:
        _, _, kind = parse_output(output, companions=(FLAGS_SUFFIX,))
    except ValueError as error:
        raise reader.error(path + ("output",), str(error)) from None
    if engine is not None and kind != "zarr":  # as predict refuses it, found by emfast check too
        raise reader.error(path + ("output",), "a Dask engine writes from many processes at once, which HDF5 does "
                                               "not allow: write a .zarr output (emfast convert can make an HDF5 copy "
                                               "afterwards)")
    if compression is not None:
        try:
            check_compression(compression, kind)
        except ValueError as error:
            raise reader.error(path + ("compression",), str(error)) from None


def _forget_if_elsewhere(module_name: str, base: Path) -> None:
    """Drop an imported module (with its submodules) of the same top-level name as one in ``base`` but loaded from
    elsewhere, e.g. the nets.py of another config read earlier in this process: a config's model comes from its
    own folder."""
    top = module_name.split(".")[0]
    if not ((base / f"{top}.py").is_file() or (base / top / "__init__.py").is_file()):
        return
    loaded = getattr(sys.modules.get(top), "__file__", None)
    if loaded is None or Path(loaded).resolve().is_relative_to(base.resolve()):
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def _what_failed(error: BaseException) -> str:
    """``error`` in one line with where it was raised: the file and line of a syntax error, else of the
    innermost frame of its traceback (the user's code)."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"SyntaxError: {error.msg} ({error.filename}, line {error.lineno})"
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith("<frozen") and frame.filename != __file__
              and os.sep + "importlib" + os.sep not in frame.filename]
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def _engine(reader: Reader, value, path: Path_) -> Optional[Mapping[str, Any]]:
    if value is None or value == "local":
        return None
    engine = reader.mapping(value, path, ("dask",), required=("dask",))
    dask = reader.mapping(engine["dask"], path + ("dask",), ("address", "workers"))
    if len(dask) != 1:
        raise reader.error(path + ("dask",), "give either address (a running scheduler) or workers (a local "
                                             "cluster of that many processes)")
    if "address" in dask:
        return {"address": reader.string(dask["address"], path + ("dask", "address"))}
    return {"workers": reader.integer(dask["workers"], path + ("dask", "workers"), minimum=1)}


def load_predict_config(source: Union[str, os.PathLike]) -> PredictSpec:
    """The ``predict`` section of a config file (or of YAML text, a string with a newline).

    Raises
    ------
    ConfigError
        The file cannot be read, has no ``predict`` section, or the section is invalid (key path and line).
    """
    text, name, base = read_source(source, "load_predict_config")
    document, marks = parse_yaml(text, name)
    reader = Reader(marks, name, base)
    if not isinstance(document, dict) or "predict" not in document:
        raise reader.error((), "no predict section: add predict: with model, input, output and patch_in")
    # a key of the section indented one level too little (tta: 8) was ignored, and the run went without it
    reader.mapping(document, (), SECTIONS)
    return predict_section(reader, document["predict"], ("predict",))


def _modules_in(folder: Path, besides) -> List[str]:
    """The files of the modules imported from ``folder`` (a config's) other than ``besides``, sorted."""
    found = set()
    for module in list(sys.modules.values()):
        where = getattr(module, "__file__", None)
        if module is not besides and isinstance(where, str) and where.endswith(".py") \
                and Path(where).resolve().parent == folder:
            found.add(str(Path(where).resolve()))
    return sorted(found)


def _module_location(name: str) -> Optional[str]:
    """Where the module ``name`` imports from in this process (a Dask worker's, or the client's): its file, or
    its package folders; None if it does not import. A worker whose module is another one of that name (the
    standard library's ``test``, an earlier run's upload, a folder in its working directory) says so."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return ",".join(sorted(str(Path(p).resolve()) for p in spec.submodule_search_locations))
    return str(Path(spec.origin).resolve()) if spec.origin else None


class _NotLoaded:
    """The model of a rerun with ``resume`` of a finished output, which predict leaves as it is, never calling its
    model (picklable, as a Dask engine's model must be)."""

    def __init__(self, model: str) -> None:
        self.model = model

    def __call__(self, batch):
        raise RuntimeError(f"{self.model} was not loaded: the output was complete when this run started, and "
                           "another program changed it since; run again")
