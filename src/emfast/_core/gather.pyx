# cython: language_level=3
"""Thin typed wrappers around the gather kernels in csrc/gather.cpp (contract in csrc/gather.h).

Each public function checks its arguments (types, dtypes, shapes, bounds), translates them into plain pointers and
byte steps, and calls the kernel once per batch with the GIL released. Kernels assume valid input; all checking is
here. Windows of in-memory arrays are origin pointers and steps; windows of chunked volumes (a lazy volume's chunk
cache) are read through a :class:`ChunkGrid`, the address of every held chunk, each element in place.
"""
from libc.stdint cimport int32_t, int64_t, uint16_t
from libc.stdlib cimport free, malloc

import numpy as np

cimport numpy as cnp

from emfast._core.common cimport check_status, dtype_code, emf_dtype, plain_array, writeable_array

from emfast._core.common import FLOAT_DTYPES, RAW_DTYPES

cnp.import_array()


cdef extern from "gather.h" nogil:
    ctypedef struct emf_window:
        const char *origin
        int64_t steps[4]
        float scale
        float shift

    int emf_gather_convert(const emf_window *windows, int64_t count, const int64_t *shape,
                           emf_dtype src_dtype, emf_dtype out_dtype, void *out)
    int emf_gather_copy(const emf_window *windows, int64_t count, const int64_t *shape, int itemsize, void *out)
    uint16_t emf_float_to_half(float value)

    int64_t EMF_PAD_FILL
    ctypedef struct emf_padded_window:
        const char *origin
        int64_t channel_step
        const int64_t *offsets[3]
        float scale
        float shift

    int emf_gather_padded_convert(const emf_padded_window *windows, int64_t count, const int64_t *shape,
                                  emf_dtype src_dtype, emf_dtype out_dtype, const void *fill, void *out)
    int emf_gather_padded_copy(const emf_padded_window *windows, int64_t count, const int64_t *shape, int itemsize,
                               const void *fill, void *out)

    ctypedef struct emf_chunked_window:
        const int64_t *chunks
        int64_t grid[3]
        int64_t chunk[3]
        int64_t volume[3]
        int64_t corner[3]
        int32_t perm[3]
        int32_t flip[3]
        float scale
        float shift

    int emf_gather_chunked_convert(const emf_chunked_window *windows, int64_t count, const int64_t *shape,
                                   emf_dtype src_dtype, emf_dtype out_dtype, void *out)
    int emf_gather_chunked_copy(const emf_chunked_window *windows, int64_t count, const int64_t *shape,
                                int itemsize, void *out)

#: Ways to fill the part of a window outside its source: NumPy's np.pad modes of the same names.
PAD_MODES = ("reflect", "edge", "constant")


def pad_indices(indices, Py_ssize_t extent, str mode):
    """The source index each of ``indices`` reads along an axis of ``extent`` elements under padding ``mode``
    (as ``np.pad``: "reflect" mirrors about the border elements without repeating them, "edge" repeats them);
    -1 where "constant" takes the fill value."""
    indices = np.asarray(indices, dtype=np.int64)
    if mode == "edge":
        return np.clip(indices, 0, extent - 1)
    if mode == "constant":
        return np.where((indices >= 0) & (indices < extent), indices, -1)
    if mode == "reflect":
        if extent == 1:
            return np.zeros_like(indices)
        period = 2 * (extent - 1)
        folded = np.mod(indices, period)
        return np.where(folded >= extent, period - folded, folded)
    raise ValueError(f"pad must be one of {', '.join(PAD_MODES)} or None, got {mode!r}")


def _geometry(Py_ssize_t count, corners, perms, flips):
    """corners, perms and flips as (count, 3) arrays."""
    corners = np.asarray(corners, dtype=np.int64)
    perms = np.asarray(perms, dtype=np.int64)
    flips = np.asarray(flips, dtype=bool)
    for name, arr in (("corners", corners), ("perms", perms), ("flips", flips)):
        if arr.shape != (count, 3):
            raise ValueError(f"{name} must have shape ({count}, 3), got {arr.shape}")
    return corners, perms, flips


def _source_extent(Py_ssize_t n, src, perm, tuple out_shape):
    """The extent (z, y, x) in source axes of window n, after checking the source's shape and the permutation."""
    if src.ndim != 4 or src.shape[0] != out_shape[0]:
        raise ValueError(f"source {n} must be 4-D (C, Z, Y, X) with C={out_shape[0]}, got shape {src.shape}")
    return _permuted_extent(n, perm, out_shape)


def _permuted_extent(Py_ssize_t n, perm, tuple out_shape):
    """The extent (z, y, x) in source axes of window n, whose output axis j reads source axis perm[j]."""
    if sorted(perm) != [0, 1, 2]:
        raise ValueError(f"perms[{n}] = {perm.tolist()} is not a permutation of (0, 1, 2)")
    extent = [0, 0, 0]
    for j in range(3):
        extent[perm[j]] = out_shape[1 + j]
    return extent


class _PaddedTables:
    """The byte-offset tables of padded windows (kept alive while the kernel reads them)."""

    def __init__(self, tuple sources, corners, perms, flips, tuple out_shape, str mode):
        count = len(sources)
        corners, perms, flips = _geometry(count, corners, perms, flips)
        self.tables = []
        for n in range(count):
            src = sources[n]
            extent = _source_extent(n, src, perms[n], out_shape)
            per_axis = []
            for j in range(3):
                axis = perms[n, j]
                indices = corners[n, axis] + np.arange(extent[axis], dtype=np.int64)
                if flips[n, axis]:
                    indices = indices[::-1]
                read = pad_indices(indices, src.shape[1 + axis], mode)
                per_axis.append(np.ascontiguousarray(
                    np.where(read < 0, EMF_PAD_FILL, read * src.strides[1 + axis]), dtype=np.int64))
            self.tables.append(per_axis)


cdef emf_padded_window *_padded_windows(tuple sources, tables) except NULL:
    """Padded windows pointing into ``tables`` (a _PaddedTables); the caller frees."""
    cdef Py_ssize_t count = len(sources)
    cdef Py_ssize_t n, j
    cdef int64_t[::1] table
    cdef emf_padded_window *windows = <emf_padded_window *> malloc(max(count, 1) * sizeof(emf_padded_window))
    if windows == NULL:
        raise MemoryError("cannot allocate the window table")
    for n in range(count):
        windows[n].origin = <const char *> cnp.PyArray_DATA(<cnp.ndarray> sources[n])
        windows[n].channel_step = sources[n].strides[0]
        for j in range(3):
            table = tables.tables[n][j]
            windows[n].offsets[j] = &table[0]
    return windows


def _fill_element(fill, dtype, what):
    """``fill`` as a one-element array of ``dtype``; ValueError if it does not fit."""
    value = np.asarray(fill)
    cast = value.astype(dtype)
    if value.ndim != 0 or not np.array_equal(cast, value, equal_nan=dtype.kind == "f"):
        raise ValueError(f"fill {fill!r} is not a single value representable in {what}'s dtype {dtype}")
    return cast.reshape(1)


cdef emf_window *_windows(tuple sources, corners, perms, flips, tuple out_shape) except NULL:
    """Validate B windows and describe each as an origin pointer plus signed byte steps (caller frees)."""
    cdef Py_ssize_t count = len(sources)
    cdef Py_ssize_t n, j, axis
    cdef int64_t extent[3]
    cdef int64_t corner, stride
    cdef const char *origin
    corners, perms, flips = _geometry(count, corners, perms, flips)
    cdef emf_window *windows = <emf_window *> malloc(max(count, 1) * sizeof(emf_window))
    if windows == NULL:
        raise MemoryError("cannot allocate the window table")
    try:
        for n in range(count):
            src = sources[n]
            for axis, size in enumerate(_source_extent(n, src, perms[n], out_shape)):
                extent[axis] = size
            origin = <const char *> cnp.PyArray_DATA(<cnp.ndarray> src)
            windows[n].steps[0] = src.strides[0]
            for axis in range(3):
                corner = corners[n, axis]
                if corner < 0 or corner > src.shape[1 + axis] - extent[axis]:  # no overflow for huge corners
                    raise IndexError(
                        f"window {n} spans [{corner}, {int(corner) + int(extent[axis])}) along axis {'zyx'[axis]}, "
                        f"outside the source extent {src.shape[1 + axis]}")
                origin += corner * src.strides[1 + axis]
            for j in range(3):
                axis = perms[n, j]
                stride = src.strides[1 + axis]
                if flips[n, axis]:
                    origin += stride * (extent[axis] - 1)
                    stride = -stride
                windows[n].steps[1 + j] = stride
            windows[n].origin = origin
    except BaseException:
        free(windows)
        raise
    return windows


cdef tuple _plain_sources(sources):
    """Checked base-class views of the sources; the tuple keeps every source alive while the kernel runs."""
    return tuple(plain_array(src, f"source {n}") for n, src in enumerate(sources))


cdef object _plain_out(out, Py_ssize_t count):
    """A base-class view of ``out`` after checking it (see _plain_sources)."""
    out = writeable_array(out, "out")
    if out.ndim != 5:
        raise ValueError(f"out must be a writeable C-contiguous ndarray of shape (B, C, Z, Y, X), got {out.shape}")
    if out.shape[0] != count:
        raise ValueError(f"out holds {out.shape[0]} windows but {count} sources were given")
    return out


def _conversion(sources, scale, shift):
    """The sources' one dtype and the per-window scale and shift as float32, checked (TypeError, ValueError)."""
    src_dtype = sources[0].dtype
    if any(s.dtype != src_dtype for s in sources):
        raise TypeError("all sources of one gather must share a dtype")
    scale = np.asarray(scale, dtype=np.float32)
    shift = np.asarray(shift, dtype=np.float32)
    if scale.shape != (len(sources),) or shift.shape != (len(sources),):
        raise ValueError(f"scale and shift must have shape ({len(sources)},)")
    return src_dtype, scale, shift


def _check_copy(str name, sources, out):
    """TypeError unless every source has the output's dtype, of an element size the copy kernels move."""
    if any(s.dtype != out.dtype for s in sources):
        raise TypeError(f"{name} needs sources of the output dtype {out.dtype}, "
                        f"got {sorted({str(s.dtype) for s in sources})}")
    if out.itemsize not in (1, 2, 4, 8):
        raise TypeError(f"cannot copy elements of {out.itemsize} bytes")


def gather_convert(sources, corners, perms, flips, scale, shift, out, pad=None, fill=0):
    """Crop, transform and convert B windows into ``out`` (B, C, Z, Y, X) in one pass, without the GIL.

    ``out[n] = transpose(flip(src_n[:, window_n], flips[n]), perms[n]).astype(float32) * scale[n] + shift[n]``,
    cast to ``out.dtype`` (float32 or float16). The window of example n starts at ``corners[n]`` (z, y, x) in
    source axes; its extent along source axis ``perms[n][j]`` is ``out.shape[2 + j]``. Sources (4-D, any strides)
    share one dtype: uint8, int8, uint16, int16, uint32, float16, float32 or float64.

    Windows must lie inside their sources (IndexError otherwise) unless ``pad`` is given: then the part outside
    is read as ``np.pad(src, mode=pad)`` would have it ("reflect", "edge", or "constant" with the value ``fill``
    in the sources' dtype), before the transform and the conversion.
    """
    sources = _plain_sources(sources)
    cdef Py_ssize_t count = len(sources)
    result = out
    out = _plain_out(out, count)
    shape = out.shape[1:]
    if count == 0 or 0 in shape:
        return result
    src_dtype, scale, shift = _conversion(sources, scale, shift)
    cdef emf_dtype c_src = dtype_code(src_dtype, "the sources", RAW_DTYPES)
    cdef emf_dtype c_out = dtype_code(out.dtype, "out", FLOAT_DTYPES)
    cdef int64_t c_shape[4]
    for j in range(4):
        c_shape[j] = shape[j]
    cdef void *c_data = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef Py_ssize_t n
    cdef int status
    cdef emf_window *windows
    cdef emf_padded_window *padded
    cdef cnp.ndarray fill_value
    cdef const void *c_fill
    if pad is None:
        windows = _windows(sources, corners, perms, flips, shape)
        for n in range(count):
            windows[n].scale = scale[n]
            windows[n].shift = shift[n]
        with nogil:
            status = emf_gather_convert(windows, count, c_shape, c_src, c_out, c_data)
        free(windows)
    else:
        fill_value = _fill_element(fill, src_dtype, "the sources")
        c_fill = cnp.PyArray_DATA(fill_value)
        tables = _PaddedTables(sources, corners, perms, flips, shape, pad)
        padded = _padded_windows(sources, tables)
        for n in range(count):
            padded[n].scale = scale[n]
            padded[n].shift = shift[n]
        with nogil:
            status = emf_gather_padded_convert(padded, count, c_shape, c_src, c_out, c_fill, c_data)
        free(padded)
    check_status(status, "gather_convert")
    return result


def gather_copy(sources, corners, perms, flips, out, pad=None, fill=0):
    """Crop and transform B windows into ``out`` (B, C, Z, Y, X) bit for bit, without the GIL.

    Same geometry and padding as :func:`gather_convert`; ``out`` must have the sources' dtype (any of 1, 2, 4 or
    8 bytes, e.g. labels of uint32, uint64 or int64, or uint8 masks).
    """
    sources = _plain_sources(sources)
    cdef Py_ssize_t count = len(sources)
    result = out
    out = _plain_out(out, count)
    shape = out.shape[1:]
    if count == 0 or 0 in shape:
        return result
    _check_copy("gather_copy", sources, out)
    cdef int64_t c_shape[4]
    for j in range(4):
        c_shape[j] = shape[j]
    cdef int itemsize = out.itemsize
    cdef void *c_data = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int status
    cdef emf_window *windows
    cdef emf_padded_window *padded
    cdef cnp.ndarray fill_value
    cdef const void *c_fill
    if pad is None:
        windows = _windows(sources, corners, perms, flips, shape)
        with nogil:
            status = emf_gather_copy(windows, count, c_shape, itemsize, c_data)
        free(windows)
    else:
        fill_value = _fill_element(fill, out.dtype, "out")
        c_fill = cnp.PyArray_DATA(fill_value)
        tables = _PaddedTables(sources, corners, perms, flips, shape, pad)
        padded = _padded_windows(sources, tables)
        with nogil:
            status = emf_gather_padded_copy(padded, count, c_shape, itemsize, c_fill, c_data)
        free(padded)
    check_status(status, "gather_copy")
    return result


def float_to_half(values):
    """Convert float32 values to float16 with the kernels' rounding (for testing against NumPy)."""
    cdef float[::1] src = np.ascontiguousarray(values, dtype=np.float32).ravel()
    result = np.empty(src.shape[0], dtype=np.uint16)
    cdef uint16_t[::1] dst = result
    cdef Py_ssize_t i
    with nogil:
        for i in range(src.shape[0]):
            dst[i] = emf_float_to_half(src[i])
    return result.view(np.float16).reshape(np.shape(values))


cdef class ChunkGrid:
    """A chunked volume as the chunked gather kernels read it: the address of every chunk's data.

    Parameters
    ----------
    addresses : numpy.ndarray
        int64 (gz, gy, gx), C-contiguous: the address of each chunk's C-contiguous (c, z, y, x) data, 0 where the
        chunk is not held. Its owner updates it in place; the kernels read it while they run.
    chunk, volume : tuple of 3 int
        Chunk and volume shape (z, y, x); chunks on the far edges are clipped by the volume.
    channels : int
        Channels of every chunk.
    dtype : numpy.dtype
        Element type of the chunks.

    Attributes
    ----------
    pins : numpy.ndarray
        int32 per chunk: how many gathers in flight need it (its owner must not free a pinned chunk).
    stamps : numpy.ndarray
        int64 per chunk: when it was last pinned or stamped (its owner's clock), for least-recently-used eviction.

    :meth:`pin` and :meth:`unpin` keep both for whole boxes of chunks in typed loops: no Python work per chunk.
    The caller serialises them with its own lock.
    """

    cdef readonly object addresses
    cdef readonly object pins
    cdef readonly object stamps
    cdef readonly tuple chunk
    cdef readonly tuple volume
    cdef readonly Py_ssize_t channels
    cdef readonly object dtype

    def __init__(self, addresses, chunk, volume, Py_ssize_t channels, dtype):
        self.chunk = tuple(int(c) for c in chunk)
        self.volume = tuple(int(v) for v in volume)
        grid = tuple(-(-v // c) for v, c in zip(self.volume, self.chunk))
        if (not isinstance(addresses, np.ndarray) or addresses.dtype != np.int64 or addresses.shape != grid
                or not addresses.flags.c_contiguous):
            raise ValueError(f"addresses must be a C-contiguous int64 array of the grid's shape {grid}")
        self.addresses = addresses
        self.pins = np.zeros(grid, np.int32)
        self.stamps = np.zeros(grid, np.int64)
        self.channels = channels
        self.dtype = np.dtype(dtype)

    def pin(self, boxes, int64_t clock):
        """Pin every chunk of ``boxes`` ((n, 2, 3): first and last chunk index, inclusive, per box) once per box
        and stamp it with ``clock``. Returns ``(held, missing)``: how many of the boxes' chunks are held, and the
        indices of the boxes with a chunk not held."""
        cdef int64_t[:, :, ::1] b = self._checked(boxes)
        cdef int32_t[:, :, ::1] pins = self.pins
        cdef int64_t[:, :, ::1] stamps = self.stamps
        cdef int64_t[:, :, ::1] held = self.addresses
        cdef Py_ssize_t n, z, y, x
        cdef int64_t count = 0
        cdef bint complete
        missing = []
        for n in range(b.shape[0]):
            complete = True
            for z in range(b[n, 0, 0], b[n, 1, 0] + 1):
                for y in range(b[n, 0, 1], b[n, 1, 1] + 1):
                    for x in range(b[n, 0, 2], b[n, 1, 2] + 1):
                        pins[z, y, x] += 1
                        stamps[z, y, x] = clock
                        if held[z, y, x] != 0:
                            count += 1
                        else:
                            complete = False
            if not complete:
                missing.append(n)
        return count, missing

    def unpin(self, boxes):
        """Undo one :meth:`pin` of ``boxes``."""
        cdef int64_t[:, :, ::1] b = self._checked(boxes)
        cdef int32_t[:, :, ::1] pins = self.pins
        cdef Py_ssize_t n, z, y, x
        for n in range(b.shape[0]):
            for z in range(b[n, 0, 0], b[n, 1, 0] + 1):
                for y in range(b[n, 0, 1], b[n, 1, 1] + 1):
                    for x in range(b[n, 0, 2], b[n, 1, 2] + 1):
                        pins[z, y, x] -= 1

    def _checked(self, boxes):
        """``boxes`` as a C-contiguous int64 (n, 2, 3) array inside the grid (ValueError otherwise)."""
        b = np.ascontiguousarray(boxes, dtype=np.int64)
        grid = self.addresses.shape
        if b.ndim != 3 or b.shape[1:] != (2, 3) or not _inside(b, self.addresses):
            raise ValueError(f"boxes must be (n, 2, 3) first and last chunk indices inside the grid {grid}, "
                             f"got {b.tolist()}")
        return b


cdef bint _inside(int64_t[:, :, ::1] boxes, cnp.ndarray grid):
    """Whether every (2, 3) box of first and last indices is ordered and inside ``grid``'s shape (a typed loop: a
    box's blocks are pinned and unpinned per read, where NumPy's reductions cost more than the pinning)."""
    cdef Py_ssize_t n, a
    cdef int64_t extent
    for n in range(boxes.shape[0]):
        for a in range(3):
            extent = grid.shape[a]
            if boxes[n, 0, a] < 0 or boxes[n, 0, a] > boxes[n, 1, a] or boxes[n, 1, a] >= extent:
                return False
    return True


cdef emf_chunked_window *_chunked_windows(tuple grids, corners, perms, flips, tuple out_shape) except NULL:
    """Validate B windows of chunked volumes, every chunk they touch held (caller frees)."""
    cdef Py_ssize_t count = len(grids)
    cdef Py_ssize_t n, a
    cdef int64_t[:, :, ::1] held
    cdef int64_t lo[3]
    cdef int64_t hi[3]
    cdef int64_t kz, ky, kx
    corners, perms, flips = _geometry(count, corners, perms, flips)
    cdef emf_chunked_window *windows = <emf_chunked_window *> malloc(max(count, 1) * sizeof(emf_chunked_window))
    if windows == NULL:
        raise MemoryError("cannot allocate the window table")
    try:
        for n in range(count):
            grid = <ChunkGrid?> grids[n]
            if grid.channels != out_shape[0]:
                raise ValueError(f"grid {n} has {grid.channels} channels, out has {out_shape[0]}")
            extent = _permuted_extent(n, perms[n], out_shape)
            held = grid.addresses
            windows[n].chunks = &held[0, 0, 0]
            for a in range(3):
                corner = int(corners[n, a])
                if corner < 0 or corner > grid.volume[a] - extent[a]:
                    raise IndexError(f"window {n} spans [{corner}, {corner + extent[a]}) along axis {'zyx'[a]}, "
                                     f"outside the volume extent {grid.volume[a]}")
                windows[n].grid[a] = held.shape[a]
                windows[n].chunk[a] = grid.chunk[a]
                windows[n].volume[a] = grid.volume[a]
                windows[n].corner[a] = corner
                windows[n].perm[a] = perms[n, a]
                windows[n].flip[a] = flips[n, a]
                lo[a] = corner // grid.chunk[a]
                hi[a] = (corner + extent[a] - 1) // grid.chunk[a]
            for kz in range(lo[0], hi[0] + 1):
                for ky in range(lo[1], hi[1] + 1):
                    for kx in range(lo[2], hi[2] + 1):
                        if held[kz, ky, kx] == 0:
                            raise ValueError(f"window {n} needs chunk {(kz, ky, kx)}, which is not held")
    except BaseException:
        free(windows)
        raise
    return windows


cdef tuple _checked_grids(grids, out):
    grids = tuple(grids)
    if len(grids) != out.shape[0]:
        raise ValueError(f"out holds {out.shape[0]} windows but {len(grids)} grids were given")
    return grids


def gather_chunked_convert(grids, corners, perms, flips, scale, shift, out):
    """:func:`gather_convert` for windows of chunked volumes: window n reads ``grids[n]`` (a :class:`ChunkGrid`),
    each element in place from its chunk, without the GIL. Windows must lie inside their volumes (IndexError) and
    every chunk they touch must be held (ValueError); the caller keeps those chunks alive until this returns.
    """
    result = out
    out = _plain_out(out, len(grids))
    grids = _checked_grids(grids, out)
    cdef Py_ssize_t count = len(grids)
    shape = out.shape[1:]
    if count == 0 or 0 in shape:
        return result
    src_dtype, scale, shift = _conversion(grids, scale, shift)
    cdef emf_dtype c_src = dtype_code(src_dtype, "the sources", RAW_DTYPES)
    cdef emf_dtype c_out = dtype_code(out.dtype, "out", FLOAT_DTYPES)
    cdef int64_t c_shape[4]
    for j in range(4):
        c_shape[j] = shape[j]
    cdef void *c_data = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef Py_ssize_t n
    cdef int status
    cdef emf_chunked_window *windows = _chunked_windows(grids, corners, perms, flips, shape)
    for n in range(count):
        windows[n].scale = scale[n]
        windows[n].shift = shift[n]
    with nogil:
        status = emf_gather_chunked_convert(windows, count, c_shape, c_src, c_out, c_data)
    free(windows)
    check_status(status, "gather_chunked_convert")
    return result


def gather_chunked_copy(grids, corners, perms, flips, out):
    """:func:`gather_copy` for windows of chunked volumes (see :func:`gather_chunked_convert`)."""
    result = out
    out = _plain_out(out, len(grids))
    grids = _checked_grids(grids, out)
    cdef Py_ssize_t count = len(grids)
    shape = out.shape[1:]
    if count == 0 or 0 in shape:
        return result
    _check_copy("gather_chunked_copy", grids, out)
    cdef int64_t c_shape[4]
    for j in range(4):
        c_shape[j] = shape[j]
    cdef int itemsize = out.itemsize
    cdef void *c_data = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int status
    cdef emf_chunked_window *windows = _chunked_windows(grids, corners, perms, flips, shape)
    with nogil:
        status = emf_gather_chunked_copy(windows, count, c_shape, itemsize, c_data)
    free(windows)
    check_status(status, "gather_chunked_copy")
    return result
