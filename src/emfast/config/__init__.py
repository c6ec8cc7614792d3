"""YAML training configs that map one to one onto emfast's objects (see ``docs/CONFIG.md``): YAML with line marks
and the typed reader (``_yaml``), the spec dataclasses (``_spec``), parsing of each section against the registry
(``_sections``), :class:`Config` with its builders and :func:`load_config` (``_config``), the ``emfast check``
summary (``_report``), the ``predict`` section that ``emfast predict`` runs (``_predict``), and what ``emfast check``
checks of a training config, a predict-only one or both (``_check``).

May import: ``emfast.inference``, the pipeline and every stage below them.
"""
from ._check import check_config
from ._config import BUILTIN_CONFIG, Config, close_volumes, dump_config, load_config
from ._predict import PredictSpec, load_predict_config
from ._report import describe
from ._spec import Builtin, ComponentSpec, SampleSpec, Validation, VolumeSpec
from ._yaml import ConfigError

__all__ = ["BUILTIN_CONFIG", "Builtin", "ComponentSpec", "Config", "ConfigError", "PredictSpec", "SampleSpec",
           "Validation", "VolumeSpec", "check_config", "close_volumes", "describe", "dump_config", "load_config",
           "load_predict_config"]
