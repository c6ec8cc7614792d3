"""Prediction over whole volumes (:func:`predict`, public as ``emfast.predict``): the tile plan and its
chunk-aligned blocks (``_tiling``), the memory budget that sizes them (``_memory``), blend weights (``_blend``),
test-time variants (``_tta``), the model adapter (``_model``), one block's computation (``_block``), shared tiles
kept for the blocks after the first (``_cache``), the output store with its record of finished blocks
(``_store``), the local and Dask engines (``_local``, ``_dask``), the model on a device through a transfer backend
(``_device``) and :func:`predict` (``_predict``).

May import: ``emfast.pipeline`` (normalisation), ``emfast.transfer`` (device backends), ``emfast.io``, and the
shared modules (``emfast._core``,
``emfast._checks``, ``emfast._version``).
"""
import warnings
from typing import TYPE_CHECKING

from ._blend import BLENDS
from ._dask import DaskRunLostError
from ._memory import (CACHE_SHARE, DEFAULT_MEMORY, block_estimate, budget_block, input_cache_refusal, parse_memory,
                      too_large_block)
from ._model import ModelOutputError, check_torch_device, model_blamed, require_torch
from ._predict import (CHUNK_EDGE, InputDtypeError, NonFiniteWarning, Prediction, PredictProgress, SaturationWarning,
                       TrainingModeWarning, UnfinishedInputError, check_fill, check_input_dtype, predict)
from ._store import (COMPRESSIONS, FLAGS_SUFFIX, PREDICT_OUTPUT_DTYPE_NAMES, BlockWriteError, OutputExistsError,
                     prediction_complete)
from ._tiling import Block, TilePlan
from ._tta import TTA_COUNTS, variants

__all__ = ["BLENDS", "CACHE_SHARE", "COMPRESSIONS", "DEFAULT_MEMORY", "FLAGS_SUFFIX", "PREDICT_OUTPUT_DTYPE_NAMES",
           "TTA_COUNTS", "Block", "BlockWriteError", "DaskRunLostError", "InputDtypeError", "ModelOutputError",
           "OutputExistsError",
           "Prediction", "PredictProgress", "NonFiniteWarning", "SaturationWarning", "TilePlan", "TrainingModeWarning",
           "UnfinishedInputError", "block_estimate",
           "budget_block", "check_fill", "check_input_dtype", "check_torch_device", "input_cache_refusal",
           "model_blamed", "predict", "require_torch", "too_large_block", "variants"]


if not TYPE_CHECKING:  # for type checkers every other name stays an error, not Any
    def __getattr__(name: str):
        # OUTPUT_DTYPES (names) was renamed: the loader has an OUTPUT_DTYPES too, of NumPy dtypes, for its batches.
        if name == "OUTPUT_DTYPES":
            warnings.warn("emfast.inference.OUTPUT_DTYPES is deprecated; use PREDICT_OUTPUT_DTYPE_NAMES (the same "
                          "names)", DeprecationWarning, stacklevel=2)
            return PREDICT_OUTPUT_DTYPE_NAMES
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
