"""Where the data comes from: volumes (NumPy arrays, or stores read-only, in memory or lazily through a bounded
chunk cache), the volume-source protocol and its formats (HDF5, zarr and OME-Zarr, N5, neuroglancer precomputed),
local or remote (``_remote``: S3, GCS, HTTP through fsspec),
the registered formats (``_formats``: each a ``VolumeFormat`` that says how it is detected, opened and listed;
the built-in ones in ``_format_entries``), format detection (``open_volume``, public as ``emfast.open``), per-volume statistics cached beside the user's
data, and the built-in demo volume.

May import: ``emfast._core``, ``emfast._registry``, ``emfast._checks``, ``emfast._machine``.
"""
from ._blockslots import mapped_empty
from ._chunkcache import CacheBudgetError, CacheStats, default_budget
from ._convert import COMPRESSORS, ConvertError, convert, progress_bar
from ._geometry import Geometry, world_box
from ._demo import LABELS_DATASET, RAW_DATASET, demo_volume_path, make_em_volume
from ._stats import VolumeStatistics, volume_statistics
from ._hdf5 import Hdf5Source, hdf5, list_datasets, open_hdf5
from ._formats import Contents, Listed, UnknownFormatError, VolumeFormat, format_of_suffix, formats
from ._n5 import N5Source
from ._open import contents, open_source, open_volume, resolved_above_container, split_path
from ._outputs import (REMOVING_TAIL, InputChangedError, OutputLock, UnfinishedOutputWarning, add_ome_multiscales,
                       array_fingerprint, check_free_space, check_input_unchanged, check_output_location,
                       command_line_options, fingerprint, fingerprints, option, placement, recordable,
                       refuse_if_unfinished, remove_folder, stored_in_file,
                       remove_leftovers, set_aside, unfinished, unique_beside, zarr_geometry)
from ._precomputed import PrecomputedSource, tensorstore_missing
from ._progress import WIDTH, ProgressBar, plural
from ._pyramid import DOWNSAMPLING, level_geometry
from ._remote import ChunkChangedError, ReadAbandoned, RemoteReadError, RemoteStore, abandoned_when, is_url
from ._source import (CorruptChunkError, DatasetNotFoundError, LevelChoiceError, Stamp, StoreMetadataError,
                      VolumeSource, local_path)
from ._volume import (ASARRAY_LIMIT_BYTES, UnsupportedDtypeError, Volume, VolumeTooLargeError, as_volume,
                      first_non_finite)
from ._zarr import ZarrSource, import_zarr, local_store, settling_store, zarr_missing
from ._writer import (COMPRESSIONS, OutputWriter, check_compression, compared_record, compression_option, parse_output,
                      zarr_compressor)

__all__ = [
    "Contents",
    "DOWNSAMPLING",
    "Listed",
    "VolumeFormat",
    "command_line_options",
    "compression_option",
    "contents",
    "first_non_finite",
    "format_of_suffix",
    "formats",
    "plural",
    "ASARRAY_LIMIT_BYTES",
    "COMPRESSIONS",
    "COMPRESSORS",
    "ConvertError",
    "ChunkChangedError",
    "CorruptChunkError",
    "LABELS_DATASET",
    "RAW_DATASET",
    "CacheBudgetError",
    "CacheStats",
    "DatasetNotFoundError",
    "Geometry",
    "Hdf5Source",
    "N5Source",
    "OutputWriter",
    "PrecomputedSource",
    "ProgressBar",
    "ReadAbandoned",
    "RemoteReadError",
    "RemoteStore",
    "Stamp",
    "StoreMetadataError",
    "LevelChoiceError",
    "Volume",
    "abandoned_when",
    "VolumeSource",
    "VolumeStatistics",
    "UnsupportedDtypeError",
    "VolumeTooLargeError",
    "ZarrSource",
    "add_ome_multiscales",
    "as_volume",
    "check_compression",
    "compared_record",
    "convert",
    "default_budget",
    "demo_volume_path",
    "hdf5",
    "import_zarr",
    "local_store",
    "settling_store",
    "is_url",
    "level_geometry",
    "list_datasets",
    "local_path",
    "make_em_volume",
    "mapped_empty",
    "open_hdf5",
    "open_source",
    "open_volume",
    "parse_output",
    "progress_bar",
    "REMOVING_TAIL",
    "recordable",
    "refuse_if_unfinished",
    "remove_folder",
    "remove_leftovers",
    "unique_beside",
    "fingerprints",
    "placement",
    "set_aside",
    "stored_in_file",
    "resolved_above_container",
    "split_path",
    "tensorstore_missing",
    "volume_statistics",
    "world_box",
    "zarr_geometry",
    "zarr_missing",
    "UnfinishedOutputWarning",
    "UnknownFormatError",
    "unfinished",
    "InputChangedError",
]
