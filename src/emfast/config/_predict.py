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

A config may hold this section beside the training sections, or alone. Everything is checked before any file is
opened; problems are :class:`ConfigError` naming the key and line.
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from .._core.gather import PAD_MODES
from ..inference import BLENDS, COMPRESSIONS, OUTPUT_DTYPES, TTA_COUNTS, Prediction, predict
from ._sections import _check_normalize, _file
from ._spec import Builtin, plain
from ._yaml import ConfigError, Path_, Reader, describe_value, parse_yaml, read_source

_KEYS = ("model", "model_args", "input", "output", "patch_in", "patch_out", "overlap", "roi", "blend", "tta", "pad",
         "fill", "normalize", "channels", "dtype", "chunks", "block", "compression", "batch_size", "device",
         "threads", "engine")
_CHOICES = {"blend": BLENDS, "tta": TTA_COUNTS, "pad": PAD_MODES, "dtype": OUTPUT_DTYPES,
            "compression": COMPRESSIONS}
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
    output : Path
        ``container/dataset`` of the output.
    options : mapping
        The other keyword arguments of :func:`emfast.predict`.
    engine : mapping or None
        None: run here; else the ``dask`` settings (``address`` of a scheduler, or ``workers`` of a local cluster).
    base : Path
        The config's folder: relative paths resolve, and model modules import, from there.
    """

    model: str
    input: Union[Path, Builtin]
    output: Path
    options: Mapping[str, Any]
    model_args: Mapping[str, Any] = field(default_factory=dict)
    dataset: Optional[str] = None
    engine: Optional[Mapping[str, Any]] = None
    base: Path = Path(".")

    def load_model(self) -> Callable:
        """Import the factory and call it with ``model_args``."""
        module_name, _, function = self.model.partition(":")
        added = str(self.base) not in sys.path
        if added:
            sys.path.insert(0, str(self.base))
        try:
            factory = getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError) as error:
            raise ConfigError(f"cannot import {self.model}: {error}", "predict.model") from error
        finally:
            if added:
                sys.path.remove(str(self.base))
        return factory(**self.model_args)

    def input_path(self, cache_dir=None) -> str:
        if isinstance(self.input, Builtin):
            return str(self.input.path(cache_dir) / (self.dataset or _DEMO_DATASET))
        return str(self.input / self.dataset) if self.dataset else str(self.input)

    def run(self, *, resume: bool = False, overwrite: bool = False, progress=True, cache_dir=None) -> Prediction:
        """Run the prediction; a Dask engine gets a client for the run's duration."""
        arguments = dict(self.options, resume=resume, overwrite=overwrite, progress=progress)
        model = self.load_model()
        if self.engine is None:
            return predict(model, self.input_path(cache_dir), self.output, **arguments)
        from distributed import Client, LocalCluster

        if "address" in self.engine:
            with Client(self.engine["address"]) as client:
                return predict(model, self.input_path(cache_dir), self.output, client=client, **arguments)
        with LocalCluster(n_workers=self.engine["workers"], threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            return predict(model, self.input_path(cache_dir), self.output, client=client, **arguments)

    def to_yaml(self) -> dict:
        out = {"model": self.model}
        if self.model_args:
            out["model_args"] = plain(self.model_args)
        out["input"] = self.input.to_yaml() if isinstance(self.input, Builtin) else str(self.input)
        if self.dataset:
            out["input"] = {"file": out["input"], "dataset": self.dataset}
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
    model_args = reader.mapping(section.get("model_args") or {}, path + ("model_args",),
                                tuple(map(str, (section.get("model_args") or {}))))
    dataset = None
    source = section["input"]
    if isinstance(source, dict) and "dataset" in source:
        reader.mapping(source, path + ("input",), ("file", "dataset"), required=("file", "dataset"))
        dataset = reader.string(source["dataset"], path + ("input", "dataset"))
        source = source["file"]
        where = path + ("input", "file")
    else:
        where = path + ("input",)
    if isinstance(source, dict):  # a built-in volume without a dataset reads its raw
        dataset = dataset or _DEMO_DATASET
    input_file = _file(reader, source, where)
    output = _file(reader, reader.string(section["output"], path + ("output",)), path + ("output",))
    options = {"patch_in": reader.triple(section["patch_in"], path + ("patch_in",), minimum=1)}
    for key in ("patch_out", "overlap", "chunks", "block"):
        if section.get(key) is not None:
            options[key] = reader.triple(section[key], path + (key,), minimum=0 if key == "overlap" else 1)
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
    return PredictSpec(model, input_file, output, options, dict(model_args), dataset,
                       _engine(reader, section.get("engine"), path + ("engine",)), reader.base)


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
    return predict_section(reader, document["predict"], ("predict",))
