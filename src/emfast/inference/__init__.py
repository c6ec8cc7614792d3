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
from ._blend import BLENDS
from ._model import ModelOutputError
from ._predict import Prediction, PredictProgress, SaturationWarning, predict
from ._store import COMPRESSIONS, OUTPUT_DTYPES, BlockWriteError, OutputExistsError
from ._tiling import Block, TilePlan
from ._tta import TTA_COUNTS

__all__ = ["BLENDS", "COMPRESSIONS", "OUTPUT_DTYPES", "TTA_COUNTS", "Block", "BlockWriteError", "ModelOutputError",
           "OutputExistsError", "Prediction", "PredictProgress", "SaturationWarning", "TilePlan", "predict"]
