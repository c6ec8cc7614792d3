"""YAML training configs that map one to one onto emfast's objects (see ``docs/CONFIG.md``): YAML with line marks
and the typed reader (``_yaml``), the spec dataclasses (``_spec``), parsing of each section against the registry
(``_sections``), :class:`Config` with its builders and :func:`load_config` (``_config``), the ``emfast check``
summary (``_report``), and the ``predict`` section that ``emfast predict`` runs (``_predict``).

May import: ``emfast.inference``, the pipeline and every stage below them.
"""
from ._config import BUILTIN_CONFIG, Config, close_volumes, dump_config, load_config
from ._predict import PredictSpec, load_predict_config
from ._report import describe
from ._spec import Builtin, ComponentSpec, SampleSpec, Validation, VolumeSpec
from ._yaml import ConfigError

__all__ = ["BUILTIN_CONFIG", "Builtin", "ComponentSpec", "Config", "ConfigError", "PredictSpec", "SampleSpec", "Validation",
           "VolumeSpec", "close_volumes", "describe", "dump_config", "load_config",
           "load_predict_config"]
