"""``emfast check``: a config with training sections, a ``predict`` section, or both, checked as far as it can be
without streaming batches or calling the model."""
from __future__ import annotations

import os
from typing import Union

from ._config import load_config
from ._predict import predict_section
from ._report import describe
from ._sections import SECTIONS
from ._yaml import Reader, parse_yaml, read_source

#: The sections of a training config; a config without any of them is a predict-only config.
TRAINING_SECTIONS = tuple(section for section in SECTIONS if section != "predict")


def check_config(source: Union[str, os.PathLike], cache_dir=None) -> str:
    """Check the config at ``source`` (a path, or YAML text) and summarise it; the last line says "valid".

    Training sections are checked by building their loaders (:func:`describe`); a ``predict`` section by
    :meth:`PredictSpec.check <emfast.config.PredictSpec.check>`, which imports the model factory without calling
    it. A config may hold either or both.

    Raises
    ------
    ConfigError
        Naming the file, line and key path of the first problem, or saying the file is no config at all.
    """
    text, name, base = read_source(source, "check_config")
    document, marks = parse_yaml(text, name)
    reader = Reader(marks, name, base)
    if not isinstance(document, dict) or not (set(document) & {*TRAINING_SECTIONS, "predict"}):
        raise reader.error((), "neither a training config (data, loader, ...) nor a predict section: see "
                               "docs/CONFIG.md")
    reader.mapping(document, (), SECTIONS)  # a predict-only config's stray keys too (tta: 8 one level too far out)
    lines = []
    if "predict" in document:  # an empty one too: `emfast predict` refuses it
        lines += predict_section(reader, document["predict"], ("predict",)).check(cache_dir)
    if set(document) & set(TRAINING_SECTIONS):
        summary = describe(load_config(source), cache_dir=cache_dir)
        lines.insert(0, summary.removesuffix("\nvalid"))
    return "\n".join(lines + ["valid"])
