# cython: language_level=3
"""Thin wrappers around the file reader in csrc/files.cpp (contract in csrc/files.h): many files, or byte ranges of
them, read in one call without the GIL; and around the zstd, blosc and deflate decoders in csrc/zstd.cpp,
csrc/blosc.cpp and csrc/deflate.cpp (their .h files): their frames decoded in one call without the GIL, by the
libraries whose functions :func:`bind_zstd`, :func:`bind_blosc` and :func:`bind_deflate` were given; and around
the compressed_segmentation decoder in csrc/cseg.cpp (:func:`decode_compressed_segmentation`)."""
import os
import time

from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc

import numpy as np

cimport numpy as cnp

cnp.import_array()


cdef extern from "files.h" nogil:
    ctypedef enum emf_file_status:
        EMF_FILE_OPEN
        EMF_FILE_MISSING
        EMF_FILE_NOT_REGULAR
        EMF_FILE_FAILED
        EMF_FILE_UNSUPPORTED
    void emf_open_files(int64_t n, const char *const *paths, int *descriptors, int64_t *sizes, int64_t *mtimes_ns,
                        int *status, int *modes, int *errors)
    void emf_read_files(int64_t n, const int *descriptors, const int64_t *starts, int64_t *lengths,
                        char *const *destinations, int *status, int *errors)
    void emf_close_files(int64_t n, const int *descriptors, const int *status)


cdef extern from "zstd.h" nogil:
    ctypedef void *(*emf_zstd_create_fn)()
    ctypedef size_t (*emf_zstd_free_fn)(void *context)
    ctypedef size_t (*emf_zstd_decompress_fn)(void *context, void *destination, size_t capacity, const void *source,
                                              size_t size)
    ctypedef unsigned (*emf_zstd_is_error_fn)(size_t code)
    ctypedef struct emf_zstd_library:
        emf_zstd_create_fn create
        emf_zstd_free_fn free
        emf_zstd_decompress_fn decompress
        emf_zstd_is_error_fn is_error
    int emf_decode_zstd(const emf_zstd_library *library, int64_t n, const char *const *sources, const int64_t *sizes,
                        char *const *destinations, const int64_t *capacities, uint8_t *decoded)


cdef extern from "blosc.h" nogil:
    ctypedef int (*emf_blosc_validate_fn)(const void *source, size_t size, size_t *decoded_size)
    ctypedef int (*emf_blosc_decompress_fn)(const void *source, void *destination, size_t capacity, int threads)
    ctypedef struct emf_blosc_library:
        emf_blosc_validate_fn validate
        emf_blosc_decompress_fn decompress
    void emf_decode_blosc(const emf_blosc_library *library, int64_t n, const char *const *sources,
                          const int64_t *sizes, char *const *destinations, const int64_t *capacities,
                          uint8_t *decoded)


cdef extern from "deflate.h" nogil:
    ctypedef void *(*emf_deflate_alloc_fn)()
    ctypedef void (*emf_deflate_free_fn)(void *decompressor)
    ctypedef int (*emf_deflate_decompress_fn)(void *decompressor, const void *source, size_t size,
                                              void *destination, size_t capacity, size_t *consumed, size_t *written)
    ctypedef struct emf_deflate_library:
        emf_deflate_alloc_fn alloc
        emf_deflate_free_fn free
        emf_deflate_decompress_fn gzip
        emf_deflate_decompress_fn zlib
    int emf_decode_deflate(const emf_deflate_library *library, int64_t n, const char *const *sources,
                           const int64_t *sizes, char *const *destinations, const int64_t *capacities,
                           uint8_t *decoded)

cdef extern from "cseg.h" nogil:
    ctypedef enum emf_cseg_status:
        EMF_CSEG_OK
        EMF_CSEG_OUTSIDE
        EMF_CSEG_BITS
        EMF_CSEG_SIZE
    emf_cseg_status emf_decode_cseg(const void *data, int64_t words, const int64_t *size, const int64_t *block,
                                    int64_t channels, int value_words, void *out, int64_t *channel,
                                    int64_t *block_index)


#: What became of a file, as :func:`read_files` reports it: read (its bytes where ``offsets`` says), no such file,
#: not a regular file (never read; ``modes`` holds its st_mode), a system call failed (``errors`` holds errno), or
#: not read by this build (Windows: read it another way).
FILE_READ = EMF_FILE_OPEN
FILE_MISSING = EMF_FILE_MISSING
FILE_NOT_REGULAR = EMF_FILE_NOT_REGULAR
FILE_FAILED = EMF_FILE_FAILED
FILE_UNSUPPORTED = EMF_FILE_UNSUPPORTED


def read_files(list paths, starts=None, lengths=None, list into=None, scratch=None):
    """Read ``paths`` (str, bytes or path-like), whole or byte ranges of them, one after another without the GIL.

    ``starts`` and ``lengths`` (int64 per path, default 0 and -1) choose the bytes: from ``starts[i]`` (a negative
    start counts from the file's end, as an HTTP suffix range does), ``lengths[i]`` of them (-1: to the end).
    ``into`` (None or a list of None or writeable C-contiguous arrays) names where a file's bytes go when it has
    exactly ``into[i].nbytes`` of them to read; others go to one buffer: the start of ``scratch`` (a writeable
    C-contiguous uint8 array) if it is large enough, else a new one. Reusing a scratch buffer spares the page
    faults of fresh memory, which cost more than the reads themselves.

    Returns
    -------
    data : numpy.ndarray
        uint8: the bytes of every file read but not into its ``into``, one after another (a view of ``scratch``
        where they fit in it).
    offsets : numpy.ndarray
        int64 per path: where its bytes start in ``data``; -1 where they went to ``into[i]`` or none were read.
    read : numpy.ndarray
        int64 per path: how many bytes were read (fewer than asked for where the file ends first).
    status, modes, errors : numpy.ndarray
        int32 per path: :data:`FILE_READ` and the other codes above, st_mode where not regular, errno where failed.
    sizes, mtimes_ns : numpy.ndarray
        int64 per path: the file's size and modification time (ns) when it was opened (its ``fstat``), so a
        caller can tell a file rewritten since it last looked at it.
    """
    cdef Py_ssize_t n = len(paths), i
    encoded = [os.fsencode(path) for path in paths]
    cdef cnp.ndarray[cnp.int64_t] begin = np.zeros(n, np.int64) if starts is None else \
        np.ascontiguousarray(starts, np.int64)
    cdef cnp.ndarray[cnp.int64_t] wanted = np.full(n, -1, np.int64) if lengths is None else \
        np.ascontiguousarray(lengths, np.int64)
    if begin.shape[0] != n or wanted.shape[0] != n or (into is not None and len(into) != n):
        raise ValueError(f"read_files: {n} paths but {begin.shape[0]} starts, {wanted.shape[0]} lengths"
                         + ("" if into is None else f", {len(into)} destinations"))
    cdef cnp.ndarray[cnp.int32_t] descriptors = np.full(n, -1, np.int32)
    cdef cnp.ndarray[cnp.int32_t] status = np.empty(n, np.int32)
    cdef cnp.ndarray[cnp.int32_t] modes = np.zeros(n, np.int32)
    cdef cnp.ndarray[cnp.int32_t] errors = np.zeros(n, np.int32)
    cdef cnp.ndarray[cnp.int64_t] sizes = np.zeros(n, np.int64)
    cdef cnp.ndarray[cnp.int64_t] mtimes = np.zeros(n, np.int64)
    cdef cnp.ndarray[cnp.int64_t] offsets = np.full(n, -1, np.int64)
    cdef cnp.ndarray[cnp.int64_t] read = np.zeros(n, np.int64)
    cdef const char **c_paths = <const char **>malloc(max(n, 1) * sizeof(char *))
    cdef char **destinations = <char **>malloc(max(n, 1) * sizeof(char *))
    cdef int64_t size, first, total = 0
    cdef char *base
    if c_paths == NULL or destinations == NULL:
        free(c_paths)
        free(destinations)
        raise MemoryError("read_files: out of memory for the list of paths")
    try:
        for i in range(n):
            c_paths[i] = encoded[i]
        with nogil:
            emf_open_files(n, c_paths, <int *>descriptors.data, <int64_t *>sizes.data, <int64_t *>mtimes.data,
                           <int *>status.data, <int *>modes.data, <int *>errors.data)
        try:
            targets = [None] * n
            for i in range(n):
                if status[i] != EMF_FILE_OPEN:
                    continue
                size = sizes[i]
                first = min(max(size + begin[i] if begin[i] < 0 else begin[i], 0), size)
                begin[i] = first
                read[i] = size - first if wanted[i] < 0 else min(wanted[i], size - first)
                target = into[i] if into is not None else None
                if target is not None and _writeable_contiguous(target, "read_files: into", i) \
                        and (<cnp.ndarray>target).nbytes == read[i]:
                    targets[i] = target
                else:
                    offsets[i] = total
                    total += read[i]
            if scratch is not None and _writeable_contiguous(scratch, "read_files: scratch", -1) \
                    and scratch.dtype == np.uint8 and scratch.ndim == 1 and scratch.shape[0] >= total:
                data = scratch[:total]
            else:
                data = np.empty(total, np.uint8)
            base = <char *>cnp.PyArray_DATA(data)
            for i in range(n):
                if offsets[i] >= 0:
                    destinations[i] = base + offsets[i]
                elif targets[i] is not None:
                    destinations[i] = <char *>cnp.PyArray_DATA(<cnp.ndarray>targets[i])
                else:
                    destinations[i] = NULL
        except BaseException:
            emf_close_files(n, <int *>descriptors.data, <int *>status.data)
            raise
        with nogil:  # closes every file it reads
            emf_read_files(n, <int *>descriptors.data, <int64_t *>begin.data, <int64_t *>read.data, destinations,
                           <int *>status.data, <int *>errors.data)
    finally:
        free(c_paths)
        free(destinations)
    return data, offsets, read, status, modes, errors, sizes, mtimes


cdef bint _writeable_contiguous(target, str what, Py_ssize_t i) except -1:
    """Check ``target``, named ``what[i]`` (``what`` alone where ``i`` < 0) in the error."""
    if not isinstance(target, np.ndarray) or not target.flags.c_contiguous or not target.flags.writeable:
        name = what if i < 0 else f"{what}[{i}]"
        raise TypeError(f"{name} must be a writeable C-contiguous NumPy array, got {type(target).__name__}")
    return True


cdef emf_zstd_library _zstd
cdef bint _zstd_bound = False


def data_addresses(list arrays):
    """The address of each array's first element (``arrays``: ndarrays), as int64: ``array.ctypes.data`` of a
    list at once, at a fraction of its cost (a chunk cache records the address of every block it reads)."""
    cdef Py_ssize_t n = len(arrays), i
    cdef cnp.ndarray[cnp.int64_t] addresses = np.empty(n, np.int64)
    for i in range(n):
        addresses[i] = <int64_t><size_t>cnp.PyArray_DATA(<cnp.ndarray?>arrays[i])
    return addresses


def bind_zstd(size_t create, size_t free_context, size_t decompress, size_t is_error):
    """Decode with the libzstd functions at these addresses: ``ZSTD_createDCtx``, ``ZSTD_freeDCtx``,
    ``ZSTD_decompressDCtx`` and ``ZSTD_isError`` (from ctypes, of a library loaded for the life of the process)."""
    global _zstd_bound
    if not (create and free_context and decompress and is_error):
        raise ValueError("bind_zstd: every address must be a function's")
    _zstd.create = <emf_zstd_create_fn>create
    _zstd.free = <emf_zstd_free_fn>free_context
    _zstd.decompress = <emf_zstd_decompress_fn>decompress
    _zstd.is_error = <emf_zstd_is_error_fn>is_error
    _zstd_bound = True


cdef emf_blosc_library _blosc
cdef bint _blosc_bound = False


def bind_blosc(size_t validate, size_t decompress):
    """Decode with the c-blosc functions at these addresses: ``blosc_cbuffer_validate`` and
    ``blosc_decompress_ctx`` (from ctypes, of a library loaded for the life of the process)."""
    global _blosc_bound
    if not (validate and decompress):
        raise ValueError("bind_blosc: every address must be a function's")
    _blosc.validate = <emf_blosc_validate_fn>validate
    _blosc.decompress = <emf_blosc_decompress_fn>decompress
    _blosc_bound = True


cdef emf_deflate_library _deflate
cdef bint _deflate_bound = False


def bind_deflate(size_t alloc, size_t free_decompressor, size_t gzip, size_t zlib):
    """Inflate with the libdeflate functions at these addresses: ``libdeflate_alloc_decompressor``,
    ``libdeflate_free_decompressor``, ``libdeflate_gzip_decompress_ex`` and ``libdeflate_zlib_decompress_ex``
    (from ctypes, of a library loaded for the life of the process)."""
    global _deflate_bound
    if not (alloc and free_decompressor and gzip and zlib):
        raise ValueError("bind_deflate: every address must be a function's")
    _deflate.alloc = <emf_deflate_alloc_fn>alloc
    _deflate.free = <emf_deflate_free_fn>free_decompressor
    _deflate.gzip = <emf_deflate_decompress_fn>gzip
    _deflate.zlib = <emf_deflate_decompress_fn>zlib
    _deflate_bound = True


cdef enum _Codec:
    _ZSTD
    _BLOSC
    _DEFLATE


#: The codecs :func:`decode_frames` decodes.
_CODECS = {"zstd": _ZSTD, "blosc": _BLOSC, "deflate": _DEFLATE}


cdef _Codec _bound_codec(str codec, str who) except *:
    """``codec``'s code, refusing a codec not known or whose library was not bound."""
    if codec not in _CODECS:
        raise ValueError(f"{who}: codec must be one of {', '.join(_CODECS)}, got {codec!r}")
    if not {"zstd": _zstd_bound, "blosc": _blosc_bound, "deflate": _deflate_bound}[codec]:
        raise RuntimeError(f"{who}: no {codec} library was bound (bind_{codec})")
    return _CODECS[codec]


cdef int _decode(_Codec kind, int64_t n, const char **sources, int64_t *sizes, char **destinations,
                 int64_t *capacities, uint8_t *decoded) noexcept nogil:
    """The frames decoded by ``kind``'s library (see :func:`decode_frames`); non-zero if it had no context."""
    if kind == _ZSTD:
        return emf_decode_zstd(&_zstd, n, sources, sizes, destinations, capacities, decoded)
    if kind == _BLOSC:
        emf_decode_blosc(&_blosc, n, sources, sizes, destinations, capacities, decoded)
        return 0
    return emf_decode_deflate(&_deflate, n, sources, sizes, destinations, capacities, decoded)


def decode_frames(str codec, list sources, list outs):
    """Decode the frames ``sources[i]`` (bytes-like) of ``codec`` into ``outs[i]`` (writeable C-contiguous arrays),
    one after another without the GIL, with the library given to ``bind_<codec>``: "zstd" (frames back to back),
    "blosc" (its header's sizes checked against the frame's length and ``outs[i]``, before decoding) or "deflate"
    (gzip where a stream starts with its magic bytes, else zlib; exactly one whole stream).

    Returns
    -------
    numpy.ndarray
        uint8 per frame: 1 where it decoded to exactly ``outs[i].nbytes`` bytes, else 0 (damaged, or another
        size; ``outs[i]`` then holds undefined bytes).
    """
    cdef _Codec kind = _bound_codec(codec, "decode_frames")
    who = f"decode_frames({codec!r})"
    cdef Py_ssize_t n = len(sources), i
    if len(outs) != n:
        raise ValueError(f"{who}: {n} sources but {len(outs)} destinations")
    frames = [np.frombuffer(source, np.uint8) for source in sources]  # held until the call returns
    for i in range(n):
        _writeable_contiguous(outs[i], f"{who}: outs", i)
    cdef cnp.ndarray[cnp.uint8_t] decoded = np.zeros(n, np.uint8)
    cdef cnp.ndarray[cnp.int64_t] sizes = np.array([frame.nbytes for frame in frames], np.int64)
    cdef cnp.ndarray[cnp.int64_t] capacities = np.array([out.nbytes for out in outs], np.int64)
    cdef const char **c_sources = <const char **>malloc(max(n, 1) * sizeof(char *))
    cdef char **destinations = <char **>malloc(max(n, 1) * sizeof(char *))
    cdef int status = 0
    if c_sources == NULL or destinations == NULL:
        free(c_sources)
        free(destinations)
        raise MemoryError(f"{who}: out of memory for the list of frames")
    try:
        for i in range(n):
            c_sources[i] = <const char *>cnp.PyArray_DATA(<cnp.ndarray>frames[i])
            destinations[i] = <char *>cnp.PyArray_DATA(<cnp.ndarray>outs[i])
        with nogil:
            status = _decode(kind, n, c_sources, <int64_t *>sizes.data, destinations,
                             <int64_t *>capacities.data, <uint8_t *>decoded.data)
    finally:
        free(c_sources)
        free(destinations)
    if status != 0:
        raise MemoryError(f"{who}: the library could not make a decoding context")
    return decoded


#: What became of a chunk, as :func:`read_decode_files` reports it: decoded into its array (or, raw, read into it),
#: no such file, or to be read again the general way (not a regular file, a failed read, a frame that does not
#: decode to exactly the array's bytes, a raw file of another size, a build that reads no files).
cdef enum _Chunk:
    _CHUNK_FILLED = 0
    _CHUNK_MISSING = 1
    _CHUNK_AGAIN = 2


CHUNK_FILLED, CHUNK_MISSING, CHUNK_AGAIN = _CHUNK_FILLED, _CHUNK_MISSING, _CHUNK_AGAIN


def read_decode_files(str codec, list paths, list outs, scratch=None, ranges=None):
    """Read the files ``paths`` (whole, or the byte range ``ranges[i]``: (start, length), int64) and decode each
    into ``outs[i]`` (writeable C-contiguous arrays): the reads and the decodes of all of them without the GIL,
    and no Python work per file beyond its path. ``codec`` is one of :func:`decode_frames`'s, or "raw": exactly
    ``outs[i].nbytes`` bytes are read straight into it. Encoded bytes go to ``scratch`` (as :func:`read_files`
    takes it) where they fit, else to a new buffer.

    Returns
    -------
    result : numpy.ndarray
        uint8 per path: :data:`CHUNK_FILLED`, :data:`CHUNK_MISSING` or :data:`CHUNK_AGAIN` (for the caller to read
        the general way, which names what is wrong).
    data : numpy.ndarray
        The buffer the encoded bytes were read into (``scratch``'s view where they fitted).
    read_seconds : float
        The seconds spent opening and reading the files (the rest of the call decoded them).
    versions : numpy.ndarray
        int64 (size, modification time in ns) per path, of the file as it was opened; (0, 0) where it was not.
    """
    cdef bint raw = codec == "raw"
    cdef _Codec kind = _ZSTD if raw else _bound_codec(codec, "read_decode_files")
    cdef Py_ssize_t n = len(paths), i, frames = 0
    if len(outs) != n:
        raise ValueError(f"read_decode_files: {n} paths but {len(outs)} destinations")
    cdef bint whole = ranges is None
    cdef cnp.ndarray[cnp.int64_t, ndim=2] bounds = np.zeros((0, 2), np.int64) if whole else \
        np.ascontiguousarray(ranges, np.int64).reshape(-1, 2)
    if not whole and bounds.shape[0] != n:
        raise ValueError(f"read_decode_files: {n} paths but {bounds.shape[0]} ranges")
    encoded = [os.fsencode(path) for path in paths]
    # per file: its descriptor, status, st_mode and errno (unused: the general way names what is wrong), size,
    # modification time, where its bytes start, bytes to read and read, the array it fills and that array's bytes,
    # its bytes' place in the buffer, the bytes it must have (-1: left unread)
    ints = np.zeros((4, n), np.int32)
    longs = np.zeros((7, n), np.int64)
    cdef int *descriptors = <int *>cnp.PyArray_DATA(ints[0])
    cdef int *status = <int *>cnp.PyArray_DATA(ints[1])
    cdef int *modes = <int *>cnp.PyArray_DATA(ints[2])
    cdef int *errors = <int *>cnp.PyArray_DATA(ints[3])
    cdef int64_t *sizes = <int64_t *>cnp.PyArray_DATA(longs[0])
    cdef int64_t *mtimes = <int64_t *>cnp.PyArray_DATA(longs[1])
    cdef int64_t *starts = <int64_t *>cnp.PyArray_DATA(longs[2])
    cdef int64_t *lengths = <int64_t *>cnp.PyArray_DATA(longs[3])
    cdef int64_t *capacities = <int64_t *>cnp.PyArray_DATA(longs[4])
    cdef int64_t *offsets = <int64_t *>cnp.PyArray_DATA(longs[5])
    cdef int64_t *wanted = <int64_t *>cnp.PyArray_DATA(longs[6])
    cdef int64_t *span = <int64_t *>bounds.data
    result = np.full(n, CHUNK_AGAIN, np.uint8)
    decoded = np.zeros(n, np.uint8)
    cdef uint8_t *results = <uint8_t *>cnp.PyArray_DATA(result)
    cdef uint8_t *done = <uint8_t *>cnp.PyArray_DATA(decoded)
    cdef const char **c_paths = <const char **>malloc(max(n, 1) * sizeof(char *))
    cdef char **destinations = <char **>malloc(max(n, 1) * sizeof(char *))
    cdef char **targets = <char **>malloc(max(n, 1) * sizeof(char *))
    cdef const char **sources = <const char **>malloc(max(n, 1) * sizeof(char *))
    cdef int64_t *frame_sizes = <int64_t *>malloc(max(n, 1) * sizeof(int64_t))
    cdef int64_t *frame_capacities = <int64_t *>malloc(max(n, 1) * sizeof(int64_t))
    cdef Py_ssize_t *frame_files = <Py_ssize_t *>malloc(max(n, 1) * sizeof(Py_ssize_t))
    cdef int64_t total = 0
    cdef int failed = 0
    cdef char *base
    try:
        if (c_paths == NULL or destinations == NULL or targets == NULL or sources == NULL or frame_sizes == NULL
                or frame_capacities == NULL or frame_files == NULL):
            raise MemoryError("read_decode_files: out of memory for the list of paths")
        for i in range(n):
            _writeable_contiguous(outs[i], "read_decode_files: outs", i)
            c_paths[i] = encoded[i]
            targets[i] = <char *>cnp.PyArray_DATA(<cnp.ndarray>outs[i])
            capacities[i] = (<cnp.ndarray>outs[i]).nbytes
            offsets[i] = wanted[i] = -1
        started = time.perf_counter()
        with nogil:
            emf_open_files(n, c_paths, descriptors, sizes, mtimes, status, modes, errors)
            for i in range(n):  # what to read: a range past the end, or raw bytes of another size, left unread
                if status[i] != EMF_FILE_OPEN:
                    continue
                if not whole:
                    starts[i] = span[2 * i]
                    lengths[i] = span[2 * i + 1]
                    if starts[i] < 0 or lengths[i] < 0 or starts[i] > sizes[i] or lengths[i] > sizes[i] - starts[i]:
                        lengths[i] = 0
                        continue
                else:
                    lengths[i] = sizes[i]
                if raw and lengths[i] != capacities[i]:
                    lengths[i] = 0
                    continue
                wanted[i] = lengths[i]
                if not raw:
                    offsets[i] = total
                    total += lengths[i]
        try:
            if scratch is not None and _writeable_contiguous(scratch, "read_decode_files: scratch", -1) \
                    and scratch.dtype == np.uint8 and scratch.ndim == 1 and scratch.shape[0] >= total:
                data = scratch[:total]
            else:
                data = np.empty(total, np.uint8)
        except BaseException:
            emf_close_files(n, descriptors, status)
            raise
        base = <char *>cnp.PyArray_DATA(data)
        with nogil:
            for i in range(n):
                destinations[i] = base + offsets[i] if offsets[i] >= 0 else (targets[i] if raw else base)
            emf_read_files(n, descriptors, starts, lengths, destinations, status, errors)
            for i in range(n):
                if status[i] == EMF_FILE_MISSING:
                    results[i] = _CHUNK_MISSING
                elif status[i] != EMF_FILE_OPEN or wanted[i] < 0 or lengths[i] != wanted[i]:
                    continue  # not read, or not all of it (the file changed meanwhile): the general way
                elif raw:
                    results[i] = _CHUNK_FILLED
                else:  # listed for the decoder (frames <= i: the entries moved are those of files done)
                    sources[frames] = destinations[i]
                    frame_sizes[frames] = lengths[i]
                    targets[frames] = targets[i]
                    frame_capacities[frames] = capacities[i]
                    frame_files[frames] = i
                    frames += 1
        read_seconds = time.perf_counter() - started
        if frames:
            with nogil:
                failed = _decode(kind, frames, sources, frame_sizes, targets, frame_capacities, done)
                for i in range(frames):
                    if done[i]:
                        results[frame_files[i]] = _CHUNK_FILLED
    finally:
        free(c_paths)
        free(destinations)
        free(targets)
        free(sources)
        free(frame_sizes)
        free(frame_capacities)
        free(frame_files)
    if failed:
        raise MemoryError("read_decode_files: the library could not make a decoding context")
    return result, data, read_seconds, longs[:2].T


#: The longest chunk or block edge the decoder takes (EMF_CSEG_MAX_EDGE in csrc/cseg.h).
_CSEG_MAX_EDGE = 1 << 21


def _cseg_out_of_range(size, block) -> str:
    return (f"compressed_segmentation: size {tuple(size)} or block {tuple(block)} out of range (edges up to "
            f"{_CSEG_MAX_EDGE}, blocks up to 2^32 voxels)")


def decode_compressed_segmentation(data, size, block, Py_ssize_t channels, dtype):
    """Decode one chunk of neuroglancer's compressed_segmentation encoding without the GIL (format in csrc/cseg.h).

    Parameters
    ----------
    data : bytes-like
        The chunk's bytes, decompressed.
    size, block : sequence of 3 int
        The chunk's size and the encoding's block size, (x, y, z) as the precomputed ``info`` gives them.
    channels : int
        Channels in the chunk.
    dtype : numpy dtype
        uint32 or uint64.

    Returns
    -------
    numpy.ndarray
        (channels, z, y, x), little-endian ``dtype``.

    Raises
    ------
    ValueError
        Data that is not whole 32-bit words, or whose offsets, encoded bits or table indices are not those of a
        chunk of this size (the message says which channel and block).
    """
    kind = np.dtype(dtype)
    if kind not in (np.dtype(np.uint32), np.dtype(np.uint64)):
        raise ValueError(f"compressed_segmentation holds uint32 or uint64 values, not {kind}")
    edges = [int(n) for n in size] + [int(n) for n in block]
    if len(edges) != 6 or len(size) != 3 or min(edges) < 1 or channels < 1:
        raise ValueError(f"compressed_segmentation: size {tuple(size)}, block {tuple(block)} and channels "
                         f"{channels} must be 3 positive sizes, 3 positive sizes and a positive count")
    if max(edges) > _CSEG_MAX_EDGE:  # before the output is allocated (the decoder refuses it too)
        raise ValueError(_cseg_out_of_range(size, block))
    cdef cnp.ndarray[cnp.int64_t] c_size = np.array(edges[:3], np.int64)
    cdef cnp.ndarray[cnp.int64_t] c_block = np.array(edges[3:], np.int64)
    frame = np.frombuffer(data, np.uint8)
    if frame.nbytes % 4:
        raise ValueError(f"compressed_segmentation: {frame.nbytes} bytes are not whole 32-bit words")
    cdef cnp.ndarray out = np.empty((channels, c_size[2], c_size[1], c_size[0]), kind.newbyteorder("<"))
    cdef const void *source = cnp.PyArray_DATA(frame)
    cdef int64_t words = frame.nbytes // 4, channel = 0, block_index = 0
    cdef int value_words = kind.itemsize // 4
    cdef emf_cseg_status status
    with nogil:
        status = emf_decode_cseg(source, words, <int64_t *>c_size.data, <int64_t *>c_block.data, channels,
                                 value_words, cnp.PyArray_DATA(out), &channel, &block_index)
    if status == EMF_CSEG_OK:
        return out
    where = f"channel {channel}" + ("" if block_index < 0 else f", block {block_index}")
    if status == EMF_CSEG_BITS:
        raise ValueError(f"compressed_segmentation: {where}: encoded bits not 0, 1, 2, 4, 8, 16 or 32")
    if status == EMF_CSEG_SIZE:
        raise ValueError(_cseg_out_of_range(size, block))
    raise ValueError(f"compressed_segmentation: {where}: an offset or table index beyond the chunk's {words} words")
