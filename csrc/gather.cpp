/* Batched window gather kernels; see gather.h for the contract.
 *
 * Each output (z) plane is produced row by row. Three cases, by where the output x axis reads the source:
 *   - along a contiguous source axis, forwards or backwards (no transpose): a vectorised convert loop per row;
 *   - across rows while the output y axis is contiguous in the source (a y<->x transpose): blocks of K rows are
 *     transposed in SIMD registers into a small tile, which is then converted row by row like the first case;
 *   - anything else (isotropic permutations that move x to z): a plain strided gather.
 * Windows of chunked volumes are cut, along each output axis, where they cross into the next chunk; each piece is a
 * strided box in one chunk, gathered by the same plane loop. Rows that cross chunks along x are first assembled
 * in a small staging plane, so every output row is still written whole (and streamed) by one loop.
 */
#include "gather.h"
#include "half.h"

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define EMF_HAVE_SSE2 1
#endif

namespace {

using emf_half::float_to_half;

/* Source element -> output element. */
struct Copy {
    template <typename T>
    T operator()(T value) const { return value; }
};

template <typename Out>
struct Convert;

template <>
struct Convert<float> {
    float scale, shift;
    template <typename T>
    float operator()(T value) const { return static_cast<float>(value) * scale + shift; }
};

template <>
struct Convert<uint16_t> { /* float16 output, stored as its bits */
    float scale, shift;
    template <typename T>
    uint16_t operator()(T value) const { return float_to_half(static_cast<float>(value) * scale + shift); }
};

template <typename Src, typename Out, typename Op>
inline void row_forward(const Src *src, int64_t n, Out *out, const Op &op) {
    if constexpr (std::is_same<Op, Copy>::value && std::is_same<Src, Out>::value) {
        /* a plain copy: memcpy moves short rows (the pieces of rows that cross chunks, 64 bytes and less) with a
         * few overlapping loads, where the loop's vector body leaves a scalar tail of up to 31 elements */
        std::memcpy(out, src, static_cast<size_t>(n) * sizeof(Src));
    } else {
        for (int64_t i = 0; i < n; ++i) out[i] = op(src[i]);
    }
}

/* Output of at least this many bytes per call is written with non-temporal (streaming) stores: it cannot stay
 * in cache anyway, and streaming skips reading each output line before overwriting it, which is a third of
 * the memory traffic of a uint8 -> float32 gather. Smaller outputs stay in cache for the consumer. */
constexpr int64_t kStreamBytes = 2 << 20;

/* row_forward into the final output, streaming when asked. */
template <typename Src, typename Out, typename Op>
inline void emit_row(const Src *src, int64_t n, Out *out, const Op &op, bool stream) {
#ifdef EMF_HAVE_SSE2
    if (stream) {
        constexpr int64_t kChunk = 256 / sizeof(Out);
        int64_t i = 0;
        for (; i < n && (reinterpret_cast<uintptr_t>(out + i) & 15u); ++i) out[i] = op(src[i]);
        alignas(16) Out chunk[kChunk];
        for (; i + kChunk <= n; i += kChunk) {
            row_forward(src + i, kChunk, chunk, op);
            char *dst = reinterpret_cast<char *>(out + i);
            for (size_t b = 0; b < sizeof chunk; b += 16)
                _mm_stream_si128(reinterpret_cast<__m128i *>(dst + b),
                                 _mm_load_si128(reinterpret_cast<const __m128i *>(reinterpret_cast<char *>(chunk) + b)));
        }
        /* The rest of the row streams too, 16 bytes at a time: an ordinary store into a line that is being
         * streamed (the next row shares it unless rows are whole lines) costs far more than it saves. */
        constexpr int64_t kUnit = 16 / sizeof(Out);
        for (; i + kUnit <= n; i += kUnit) {
            row_forward(src + i, kUnit, chunk, op);
            _mm_stream_si128(reinterpret_cast<__m128i *>(out + i), _mm_load_si128(reinterpret_cast<const __m128i *>(chunk)));
        }
        row_forward(src + i, n - i, out + i, op);
        return;
    }
#else
    (void)stream;
#endif
    row_forward(src, n, out, op);
}

template <typename Src, typename Out, typename Op>
inline void row_strided(const char *src, int64_t step, int64_t n, Out *out, const Op &op) {
    for (int64_t i = 0; i < n; ++i) out[i] = op(*reinterpret_cast<const Src *>(src + i * step));
}

#ifdef EMF_HAVE_SSE2
template <int Bytes>
inline __m128i interleave_low(__m128i a, __m128i b);
template <int Bytes>
inline __m128i interleave_high(__m128i a, __m128i b);
template <> inline __m128i interleave_low<1>(__m128i a, __m128i b) { return _mm_unpacklo_epi8(a, b); }
template <> inline __m128i interleave_high<1>(__m128i a, __m128i b) { return _mm_unpackhi_epi8(a, b); }
template <> inline __m128i interleave_low<2>(__m128i a, __m128i b) { return _mm_unpacklo_epi16(a, b); }
template <> inline __m128i interleave_high<2>(__m128i a, __m128i b) { return _mm_unpackhi_epi16(a, b); }
template <> inline __m128i interleave_low<4>(__m128i a, __m128i b) { return _mm_unpacklo_epi32(a, b); }
template <> inline __m128i interleave_high<4>(__m128i a, __m128i b) { return _mm_unpackhi_epi32(a, b); }
template <> inline __m128i interleave_low<8>(__m128i a, __m128i b) { return _mm_unpacklo_epi64(a, b); }
template <> inline __m128i interleave_high<8>(__m128i a, __m128i b) { return _mm_unpackhi_epi64(a, b); }
#endif

/* Source rows are requested this many rows ahead. Output rows are always written in ascending order (writing
 * them backwards costs up to 4x), so a mirrored y axis reads source rows backwards while reading each row
 * forwards, a pattern the hardware prefetcher does not follow: software prefetch covers it. */
constexpr int64_t kPrefetchRows = 8;
/* The transposer requests the rows of this many groups (of K rows) ahead. */
constexpr int64_t kPrefetchGroups = 2;

/* Prefetch the bytes [row + first, row + first + bytes) into cache. */
inline void prefetch_row(const char *row, int64_t first, int64_t bytes) {
#ifdef EMF_HAVE_SSE2
    for (int64_t offset = 0; offset < bytes; offset += 64)
        _mm_prefetch(row + first + offset, _MM_HINT_T0);
#else
    (void)row;
    (void)first;
    (void)bytes;
#endif
}

/* Elements per cache line: the transposer consumes a whole line of each source row per pass, which keeps the
 * number of passes over (and TLB entries for) the source rows low. */
template <typename T>
constexpr int line_elements() { return 128 / sizeof(T); }

#ifdef EMF_HAVE_SSE2
/* The 16 bytes of v with their T-sized elements in reverse order. */
template <int Bytes>
inline __m128i reverse_elements(__m128i v);
template <> inline __m128i reverse_elements<8>(__m128i v) { return _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)); }
template <> inline __m128i reverse_elements<4>(__m128i v) { return _mm_shuffle_epi32(v, _MM_SHUFFLE(0, 1, 2, 3)); }
template <> inline __m128i reverse_elements<2>(__m128i v) {
    v = reverse_elements<4>(v);
    return _mm_shufflehi_epi16(_mm_shufflelo_epi16(v, _MM_SHUFFLE(2, 3, 0, 1)), _MM_SHUFFLE(2, 3, 0, 1));
}
template <> inline __m128i reverse_elements<1>(__m128i v) {
    v = reverse_elements<2>(v);
    return _mm_or_si128(_mm_slli_epi16(v, 8), _mm_srli_epi16(v, 8));
}
#endif

/* tile[i] = last[-i] for i < n, reading the source in ascending order (as the prefetchers expect). */
template <typename T>
void reverse_row(const T *last, int64_t n, T *tile) {
    const T *first = last - (n - 1);
    int64_t j = 0; /* source index, ascending */
#ifdef EMF_HAVE_SSE2
    constexpr int K = 16 / sizeof(T);
    for (; j + K <= n; j += K) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(first + j));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(tile + n - j - K), reverse_elements<sizeof(T)>(v));
    }
#endif
    for (; j < n; ++j) tile[n - 1 - j] = first[j];
}

/* Transposes L contiguous elements (at most line_elements<T>(), a multiple of 16 bytes) from each of nrows source
 * rows (row r at base + r * row_step) into dst[k * dst_step + r], dst_step in elements and possibly negative.
 * With SSE2, each 16-byte piece of K = 16 / sizeof(T) elements from K rows goes through one register per row and
 * log2(K) rounds of interleaving rows i and i + K/2 (the perfect-shuffle transpose). */
template <typename T, int L>
void transpose_rows(const char *base, int64_t row_step, int64_t nrows, T *dst, int64_t dst_step) {
    int64_t r = 0;
#ifdef EMF_HAVE_SSE2
    constexpr int K = 16 / sizeof(T);
    for (; r + K <= nrows; r += K) {
        /* Rows are visited across the source (row_step apart): request the ones a few groups ahead. */
        for (int i = 0; i < K && r + kPrefetchGroups * K + i < nrows; ++i)
            prefetch_row(base + (r + kPrefetchGroups * K + i) * row_step, 0, L * sizeof(T));
        for (int piece = 0; piece < L; piece += K) {
            __m128i v[K], t[K];
            for (int i = 0; i < K; ++i) {
                const T *row = reinterpret_cast<const T *>(base + (r + i) * row_step);
                v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i *>(row + piece));
            }
            for (int round = 1; round < K; round *= 2) {
                for (int i = 0; i < K / 2; ++i) {
                    t[2 * i] = interleave_low<sizeof(T)>(v[i], v[i + K / 2]);
                    t[2 * i + 1] = interleave_high<sizeof(T)>(v[i], v[i + K / 2]);
                }
                for (int i = 0; i < K; ++i) v[i] = t[i];
            }
            for (int k = 0; k < K; ++k)
                _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + (piece + k) * dst_step + r), v[k]);
        }
    }
#endif
    for (; r < nrows; ++r) {
        const T *row = reinterpret_cast<const T *>(base + r * row_step);
        for (int k = 0; k < L; ++k) dst[k * dst_step + r] = row[k];
    }
}

/* Output rows [y, ...) of a plane whose output y axis reads the source contiguously (step_y = +-item), in groups
 * of L rows, each transposed through the tile and then written row by row; returns the first row not written. */
template <int L, typename Src, typename Out, typename Op>
int64_t transposed_groups(const char *plane, int64_t step_y, int64_t step_x, int64_t y, int64_t ny, int64_t nx,
                          Out *out, int64_t out_row, const Op &op, Src *tile, bool stream) {
    /* The L source elements of output rows y..y+L-1 are contiguous, in reverse for a negative step: then tile
     * row k belongs to output row y + L - 1 - k. */
    const bool forward = step_y > 0;
    for (; y + L <= ny; y += L) {
        transpose_rows<Src, L>(plane + (forward ? y : y + L - 1) * step_y, step_x, nx, tile, nx);
        for (int k = 0; k < L; ++k)
            emit_row(tile + (forward ? k : L - 1 - k) * nx, nx, out + (y + k) * out_row, op, stream);
    }
    return y;
}

/* One output plane of ny rows by nx columns, output y stepping step_y bytes in the source and x step_x; output
 * rows start out_row elements apart (nx for a whole plane, more for a part of a wider plane).
 * tile holds line_elements<Src>() * nx elements: reversed rows and transposed blocks are put there first, then
 * every output row is written by one forward (vectorised) loop. */
template <typename Src, typename Out, typename Op>
void gather_plane(const char *plane, int64_t step_y, int64_t step_x, int64_t ny, int64_t nx, Out *out,
                  int64_t out_row, const Op &op, Src *tile, bool stream) {
    const int64_t item = static_cast<int64_t>(sizeof(Src));
    if (step_x == item || step_x == -item) {
        for (int64_t y = 0; y < ny; ++y, out += out_row) {
            if (y + kPrefetchRows < ny)
                prefetch_row(plane + (y + kPrefetchRows) * step_y, step_x > 0 ? 0 : -(nx - 1) * item, nx * item);
            const Src *start = reinterpret_cast<const Src *>(plane + y * step_y);
            if (step_x > 0) {
                emit_row(start, nx, out, op, stream);
            } else {
                reverse_row(start, nx, tile);
                emit_row(tile, nx, out, op, stream);
            }
        }
        return;
    }
    int64_t y = 0;
    if (step_y == item || step_y == -item) {
        /* Whole cache lines first, then the rows left (a plane's rest, or a run of a chunk narrower than a line)
         * in groups of half, a quarter and an eighth of a line: the last is one 16-byte register per row. */
        constexpr int L = line_elements<Src>();
        y = transposed_groups<L>(plane, step_y, step_x, y, ny, nx, out, out_row, op, tile, stream);
        y = transposed_groups<L / 2>(plane, step_y, step_x, y, ny, nx, out, out_row, op, tile, stream);
        y = transposed_groups<L / 4>(plane, step_y, step_x, y, ny, nx, out, out_row, op, tile, stream);
        y = transposed_groups<L / 8>(plane, step_y, step_x, y, ny, nx, out, out_row, op, tile, stream);
    }
    for (; y < ny; ++y) row_strided<Src>(plane + y * step_y, step_x, nx, out + y * out_row, op);
}

template <typename Src, typename Out, typename Op>
void gather_window(const emf_window &w, const int64_t shape[4], Out *out, const Op &op, Src *tile, bool stream) {
    const int64_t plane_size = shape[2] * shape[3];
    for (int64_t c = 0; c < shape[0]; ++c) {
        for (int64_t z = 0; z < shape[1]; ++z, out += plane_size) {
            gather_plane(w.origin + c * w.steps[0] + z * w.steps[1], w.steps[2], w.steps[3], shape[2], shape[3],
                         out, shape[3], op, tile, stream);
        }
    }
}

template <typename Src, typename Out, typename MakeOp>
int gather_all(const emf_window *windows, int64_t count, const int64_t shape[4], void *out, MakeOp make_op) {
    try {
        std::vector<Src> tile(static_cast<size_t>(line_elements<Src>() * shape[3]));
        const int64_t per_window = shape[0] * shape[1] * shape[2] * shape[3];
        /* Streaming needs every row to start 16-byte aligned, so that no ordinary store touches a streamed line. */
        const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0 && shape[3] * sizeof(Out) % 16 == 0;
        const bool stream = aligned && count * per_window * static_cast<int64_t>(sizeof(Out)) >= kStreamBytes;
        Out *o = static_cast<Out *>(out);
        for (int64_t n = 0; n < count; ++n)
            gather_window<Src>(windows[n], shape, o + n * per_window, make_op(windows[n]), tile.data(), stream);
#ifdef EMF_HAVE_SSE2
        if (stream) _mm_sfence(); /* streamed stores are globally visible before the batch is handed over */
#endif
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

template <typename Src, typename Out>
int convert_all(const emf_window *windows, int64_t count, const int64_t shape[4], void *out) {
    return gather_all<Src, Out>(windows, count, shape, out,
                                [](const emf_window &w) { return Convert<Out>{w.scale, w.shift}; });
}

template <typename T>
int copy_all(const emf_window *windows, int64_t count, const int64_t shape[4], void *out) {
    return gather_all<T, T>(windows, count, shape, out, [](const emf_window &) { return Copy{}; });
}

template <typename Out>
int convert_from(const emf_window *windows, int64_t count, const int64_t shape[4], emf_dtype src_dtype,
                 void *out) {
    switch (src_dtype) {
        case EMF_UINT8: return convert_all<uint8_t, Out>(windows, count, shape, out);
        case EMF_UINT16: return convert_all<uint16_t, Out>(windows, count, shape, out);
        case EMF_FLOAT32: return convert_all<float, Out>(windows, count, shape, out);
        case EMF_INT8: return convert_all<int8_t, Out>(windows, count, shape, out);
        case EMF_INT16: return convert_all<int16_t, Out>(windows, count, shape, out);
        case EMF_UINT32: return convert_all<uint32_t, Out>(windows, count, shape, out);
        case EMF_FLOAT16: return convert_all<emf_half::Half, Out>(windows, count, shape, out);
        case EMF_FLOAT64: return convert_all<double, Out>(windows, count, shape, out);
        default: return EMF_BAD_DTYPE;
    }
}

/* The longest run [first, last) of output x indices reading consecutive source elements: all of a row's
 * interior, which is copied or converted like an unpadded row; only the padding around it is looked up. */
template <typename Src>
std::pair<int64_t, int64_t> contiguous_run(const int64_t *ox, int64_t n) {
    int64_t first = 0, last = 0, start = 0;
    for (int64_t x = 0; x < n; ++x) {
        const bool continues = x > start && ox[x] != EMF_PAD_FILL && ox[x] == ox[x - 1] + (int64_t)sizeof(Src);
        if (!continues)
            start = x;
        if (ox[x] != EMF_PAD_FILL && x + 1 - start > last - first) {
            first = start;
            last = x + 1;
        }
    }
    return {first, last};
}

/* Padded windows: rows whose z or y index is padding take the fill value whole; in the others the interior run
 * is one row copy and the padding around it one table lookup per element. */
template <typename Src, typename Out, typename Op>
void padded_window(const emf_padded_window &w, const int64_t shape[4], Src fill, Out *out, const Op &op) {
    const Out filled = op(fill);
    const int64_t *oz = w.offsets[0], *oy = w.offsets[1], *ox = w.offsets[2];
    const auto run = contiguous_run<Src>(ox, shape[3]);
    auto looked_up = [&](const char *row, Out *o, int64_t from, int64_t to) {
        for (int64_t x = from; x < to; ++x)
            o[x] = ox[x] == EMF_PAD_FILL ? filled : op(*reinterpret_cast<const Src *>(row + ox[x]));
    };
    for (int64_t c = 0; c < shape[0]; ++c) {
        for (int64_t z = 0; z < shape[1]; ++z) {
            for (int64_t y = 0; y < shape[2]; ++y, out += shape[3]) {
                if (oz[z] == EMF_PAD_FILL || oy[y] == EMF_PAD_FILL) {
                    for (int64_t x = 0; x < shape[3]; ++x) out[x] = filled;
                    continue;
                }
                const char *row = w.origin + c * w.channel_step + oz[z] + oy[y];
                looked_up(row, out, 0, run.first);
                if (run.second > run.first)
                    row_forward(reinterpret_cast<const Src *>(row + ox[run.first]), run.second - run.first,
                                out + run.first, op);
                looked_up(row, out, run.second, shape[3]);
            }
        }
    }
}

template <typename Src, typename Out, typename MakeOp>
int padded_all(const emf_padded_window *windows, int64_t count, const int64_t shape[4], const void *fill,
               void *out, MakeOp make_op) {
    const int64_t per_window = shape[0] * shape[1] * shape[2] * shape[3];
    Src fill_value;
    std::memcpy(&fill_value, fill, sizeof(Src));
    Out *o = static_cast<Out *>(out);
    for (int64_t n = 0; n < count; ++n)
        padded_window<Src>(windows[n], shape, fill_value, o + n * per_window, make_op(windows[n]));
    return EMF_OK;
}

template <typename Out>
int padded_convert_from(const emf_padded_window *windows, int64_t count, const int64_t shape[4],
                        emf_dtype src_dtype, const void *fill, void *out) {
    auto make_op = [](const emf_padded_window &w) { return Convert<Out>{w.scale, w.shift}; };
    switch (src_dtype) {
        case EMF_UINT8: return padded_all<uint8_t, Out>(windows, count, shape, fill, out, make_op);
        case EMF_UINT16: return padded_all<uint16_t, Out>(windows, count, shape, fill, out, make_op);
        case EMF_FLOAT32: return padded_all<float, Out>(windows, count, shape, fill, out, make_op);
        case EMF_INT8: return padded_all<int8_t, Out>(windows, count, shape, fill, out, make_op);
        case EMF_INT16: return padded_all<int16_t, Out>(windows, count, shape, fill, out, make_op);
        case EMF_UINT32: return padded_all<uint32_t, Out>(windows, count, shape, fill, out, make_op);
        case EMF_FLOAT16: return padded_all<emf_half::Half, Out>(windows, count, shape, fill, out, make_op);
        case EMF_FLOAT64: return padded_all<double, Out>(windows, count, shape, fill, out, make_op);
        default: return EMF_BAD_DTYPE;
    }
}

template <typename T>
int padded_copy_all(const emf_padded_window *windows, int64_t count, const int64_t shape[4], const void *fill,
                    void *out) {
    return padded_all<T, T>(windows, count, shape, fill, out, [](const emf_padded_window &) { return Copy{}; });
}

/* Chunked windows. Along each output axis a window is cut where it crosses from one chunk into the next; a run
 * is a range of output indices that read one chunk. Every (z, y-run, x-run) piece is then a strided box in one
 * chunk, gathered by gather_plane as a window of an in-memory array would be. */
struct Run {
    int64_t first;  /* output indices [first, first + count) */
    int64_t count;
    int64_t chunk;  /* chunk index along the volume axis */
    int64_t local;  /* index inside that chunk read by output index `first` */
};

/* The runs of output axis j (n indices): volume axis perm[j] read forwards from corner, or backwards. */
void runs_along(const emf_chunked_window &w, int j, int64_t n, std::vector<Run> &runs) {
    runs.clear();
    const int a = w.perm[j];
    const int64_t size = w.chunk[a];
    const bool backwards = w.flip[a] != 0;
    for (int64_t i = 0; i < n;) {
        const int64_t voxel = backwards ? w.corner[a] + n - 1 - i : w.corner[a] + i;
        const int64_t chunk = voxel / size, local = voxel - chunk * size;
        const int64_t count = std::min(backwards ? local + 1 : size - local, n - i);
        runs.push_back({i, count, chunk, local});
        i += count;
    }
}

/* Address and byte strides (channel, z, y, x) of one chunk; edge chunks are clipped by the volume. */
struct Chunk {
    const char *data;
    int64_t channel_step;
    int64_t steps[3];
};

inline Chunk chunk_at(const emf_chunked_window &w, const int64_t index[3], int64_t item) {
    int64_t extent[3];
    for (int a = 0; a < 3; ++a) extent[a] = std::min(w.chunk[a], w.volume[a] - index[a] * w.chunk[a]);
    const int64_t address = w.chunks[(index[0] * w.grid[1] + index[1]) * w.grid[2] + index[2]];
    Chunk c;
    c.data = reinterpret_cast<const char *>(static_cast<uintptr_t>(address));
    c.steps[2] = item;
    c.steps[1] = extent[2] * item;
    c.steps[0] = extent[1] * c.steps[1];
    c.channel_step = extent[0] * c.steps[0];
    return c;
}

/* Copies n bytes of a row piece into staging. The pieces of rows that cross chunks are short (at most a chunk's
 * row, often under 64 bytes) and many (one per row per chunk): a library call each, dispatched by size, cost more
 * than the copy. Up to 128 bytes they are moved here with overlapping 16-, 8-, 4- and 2-byte moves, as memcpy
 * does inside; longer ones by memcpy. */
inline void copy_piece(void *to, const void *from, int64_t n) {
    char *dst = static_cast<char *>(to);
    const char *src = static_cast<const char *>(from);
#ifdef EMF_HAVE_SSE2
    if (n >= 16 && n <= 128) {
        for (int64_t i = 0; i + 16 < n; i += 16)
            _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + i),
                             _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i)));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + n - 16),
                         _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + n - 16)));
        return;
    }
#endif
    if (n >= 16) {
        std::memcpy(dst, src, static_cast<size_t>(n));
    } else if (n >= 8) {
        uint64_t head, tail;
        std::memcpy(&head, src, 8), std::memcpy(&tail, src + n - 8, 8);
        std::memcpy(dst, &head, 8), std::memcpy(dst + n - 8, &tail, 8);
    } else if (n >= 4) {
        uint32_t head, tail;
        std::memcpy(&head, src, 4), std::memcpy(&tail, src + n - 4, 4);
        std::memcpy(dst, &head, 4), std::memcpy(dst + n - 4, &tail, 4);
    } else if (n >= 2) {
        uint16_t head, tail;
        std::memcpy(&head, src, 2), std::memcpy(&tail, src + n - 2, 2);
        std::memcpy(dst, &head, 2), std::memcpy(dst + n - 2, &tail, 2);
    } else if (n == 1) {
        *dst = *src;
    }
}

/* A y<->x transposed window with z kept (the anisotropic transposes): chunk runs along output y are source x
 * runs, often shorter than a cache line, which the register transposer could not take whole. Each output plane's
 * source region is copied instead, row segment by row segment, into staging (its rows ey = shape[3] source rows of
 * ex = shape[2] elements), and that compact plane is gathered like a window of an in-memory array. */
template <typename Src, typename Out, typename Op>
void transposed_window(const emf_chunked_window &w, const int64_t shape[4], Out *out, const Op &op, Src *tile,
                       Src *staging, std::vector<Run> runs[3], bool stream) {
    const int64_t ey = shape[3], ex = shape[2], plane_size = shape[2] * shape[3];
    const int64_t item = static_cast<int64_t>(sizeof(Src));
    emf_chunked_window ascending = w; /* staging keeps source order: runs of a window without flips */
    ascending.perm[0] = 0, ascending.perm[1] = 1, ascending.perm[2] = 2;
    ascending.flip[0] = ascending.flip[1] = ascending.flip[2] = 0;
    runs_along(ascending, 0, shape[1], runs[0]);
    runs_along(ascending, 1, ey, runs[1]);
    runs_along(ascending, 2, ex, runs[2]);
    /* Output y reads staging columns, output x staging rows; mirrors start at the far end. */
    const Src *origin = staging + (w.flip[1] ? (ey - 1) * ex : 0) + (w.flip[2] ? ex - 1 : 0);
    const int64_t step_y = w.flip[2] ? -item : item, step_x = (w.flip[1] ? -ex : ex) * item;
    int64_t index[3];
    for (int64_t c = 0; c < shape[0]; ++c) {
        for (const Run &rz : runs[0]) {
            index[0] = rz.chunk;
            for (int64_t dz = 0; dz < rz.count; ++dz) {
                for (const Run &ry : runs[1]) {
                    index[1] = ry.chunk;
                    for (const Run &rx : runs[2]) {
                        index[2] = rx.chunk;
                        const Chunk chunk = chunk_at(w, index, item);
                        const char *row = chunk.data + c * chunk.channel_step + (rz.local + dz) * chunk.steps[0] +
                                          ry.local * chunk.steps[1] + rx.local * item;
                        for (int64_t r = 0; r < ry.count; ++r, row += chunk.steps[1])
                            copy_piece(staging + (ry.first + r) * ex + rx.first, row, rx.count * item);
                    }
                }
                const int64_t z = w.flip[0] ? shape[1] - 1 - (rz.first + dz) : rz.first + dz;
                gather_plane<Src>(reinterpret_cast<const char *>(origin), step_y, step_x, shape[2], shape[3],
                                  out + (c * shape[1] + z) * plane_size, shape[3], op, tile, stream);
            }
        }
    }
}

template <typename Src, typename Out, typename Op>
void chunked_window(const emf_chunked_window &w, const int64_t shape[4], Out *out, const Op &op, Src *tile,
                    Src *staging, std::vector<Run> runs[3], bool stream) {
    if (w.perm[0] == 0 && w.perm[1] == 2) {
        transposed_window<Src>(w, shape, out, op, tile, staging, runs, stream);
        return;
    }
    for (int j = 0; j < 3; ++j) runs_along(w, j, shape[1 + j], runs[j]);
    const int az = w.perm[0], ay = w.perm[1], ax = w.perm[2];
    const int64_t nx = shape[3], plane_size = shape[2] * shape[3];
    const int64_t item = static_cast<int64_t>(sizeof(Src));
    const bool split_rows = runs[2].size() > 1;
    int64_t index[3], local[3];
    for (int64_t c = 0; c < shape[0]; ++c) {
        for (const Run &rz : runs[0]) {
            for (int64_t dz = 0; dz < rz.count; ++dz) {
                Out *plane_out = out + (c * shape[1] + rz.first + dz) * plane_size;
                index[az] = rz.chunk;
                local[az] = w.flip[az] ? rz.local - dz : rz.local + dz;
                for (const Run &ry : runs[1]) {
                    index[ay] = ry.chunk;
                    local[ay] = ry.local;
                    for (const Run &rx : runs[2]) {
                        index[ax] = rx.chunk;
                        local[ax] = rx.local;
                        const Chunk chunk = chunk_at(w, index, item);
                        const char *origin = chunk.data + c * chunk.channel_step;
                        for (int a = 0; a < 3; ++a) origin += local[a] * chunk.steps[a];
                        const int64_t step_y = w.flip[ay] ? -chunk.steps[ay] : chunk.steps[ay];
                        const int64_t step_x = w.flip[ax] ? -chunk.steps[ax] : chunk.steps[ax];
                        if (split_rows && step_x == item) /* a piece of each row, in one chunk's row: copied */
                            for (int64_t r = 0; r < ry.count; ++r)
                                copy_piece(staging + r * nx + rx.first, origin + r * step_y, rx.count * item);
                        else if (split_rows) /* rows crossing chunks are assembled in staging, then converted whole */
                            gather_plane<Src>(origin, step_y, step_x, ry.count, rx.count, staging + rx.first, nx,
                                              Copy{}, tile, false);
                        else
                            gather_plane<Src>(origin, step_y, step_x, ry.count, nx, plane_out + ry.first * nx, nx,
                                              op, tile, stream);
                    }
                    if (split_rows)
                        for (int64_t r = 0; r < ry.count; ++r)
                            emit_row(staging + r * nx, nx, plane_out + (ry.first + r) * nx, op, stream);
                }
            }
        }
    }
}

template <typename Src, typename Out, typename MakeOp>
int chunked_all(const emf_chunked_window *windows, int64_t count, const int64_t shape[4], void *out,
                MakeOp make_op) {
    try {
        std::vector<Src> tile(static_cast<size_t>(line_elements<Src>() * shape[3]));
        std::vector<Src> staging(static_cast<size_t>(shape[2] * shape[3]));
        std::vector<Run> runs[3];
        const int64_t per_window = shape[0] * shape[1] * shape[2] * shape[3];
        const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0 && shape[3] * sizeof(Out) % 16 == 0;
        const bool stream = aligned && count * per_window * static_cast<int64_t>(sizeof(Out)) >= kStreamBytes;
        Out *o = static_cast<Out *>(out);
        for (int64_t n = 0; n < count; ++n)
            chunked_window<Src>(windows[n], shape, o + n * per_window, make_op(windows[n]), tile.data(),
                                staging.data(), runs, stream);
#ifdef EMF_HAVE_SSE2
        if (stream) _mm_sfence();
#endif
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

template <typename Out>
int chunked_convert_from(const emf_chunked_window *windows, int64_t count, const int64_t shape[4],
                         emf_dtype src_dtype, void *out) {
    auto make_op = [](const emf_chunked_window &w) { return Convert<Out>{w.scale, w.shift}; };
    switch (src_dtype) {
        case EMF_UINT8: return chunked_all<uint8_t, Out>(windows, count, shape, out, make_op);
        case EMF_UINT16: return chunked_all<uint16_t, Out>(windows, count, shape, out, make_op);
        case EMF_FLOAT32: return chunked_all<float, Out>(windows, count, shape, out, make_op);
        case EMF_INT8: return chunked_all<int8_t, Out>(windows, count, shape, out, make_op);
        case EMF_INT16: return chunked_all<int16_t, Out>(windows, count, shape, out, make_op);
        case EMF_UINT32: return chunked_all<uint32_t, Out>(windows, count, shape, out, make_op);
        case EMF_FLOAT16: return chunked_all<emf_half::Half, Out>(windows, count, shape, out, make_op);
        case EMF_FLOAT64: return chunked_all<double, Out>(windows, count, shape, out, make_op);
        default: return EMF_BAD_DTYPE;
    }
}

template <typename T>
int chunked_copy_all(const emf_chunked_window *windows, int64_t count, const int64_t shape[4], void *out) {
    return chunked_all<T, T>(windows, count, shape, out, [](const emf_chunked_window &) { return Copy{}; });
}

}  // namespace

extern "C" {

uint16_t emf_float_to_half(float value) { return float_to_half(value); }

int emf_gather_convert(const emf_window *windows, int64_t count, const int64_t shape[4], emf_dtype src_dtype,
                       emf_dtype out_dtype, void *out) {
    switch (out_dtype) {
        case EMF_FLOAT32: return convert_from<float>(windows, count, shape, src_dtype, out);
        case EMF_FLOAT16: return convert_from<uint16_t>(windows, count, shape, src_dtype, out);
        default: return EMF_BAD_DTYPE;
    }
}

int emf_gather_copy(const emf_window *windows, int64_t count, const int64_t shape[4], int itemsize, void *out) {
    switch (itemsize) {
        case 1: return copy_all<uint8_t>(windows, count, shape, out);
        case 2: return copy_all<uint16_t>(windows, count, shape, out);
        case 4: return copy_all<uint32_t>(windows, count, shape, out);
        case 8: return copy_all<uint64_t>(windows, count, shape, out);
        default: return EMF_BAD_DTYPE;
    }
}

int emf_gather_padded_convert(const emf_padded_window *windows, int64_t count, const int64_t shape[4],
                              emf_dtype src_dtype, emf_dtype out_dtype, const void *fill, void *out) {
    switch (out_dtype) {
        case EMF_FLOAT32: return padded_convert_from<float>(windows, count, shape, src_dtype, fill, out);
        case EMF_FLOAT16: return padded_convert_from<uint16_t>(windows, count, shape, src_dtype, fill, out);
        default: return EMF_BAD_DTYPE;
    }
}

int emf_gather_padded_copy(const emf_padded_window *windows, int64_t count, const int64_t shape[4], int itemsize,
                           const void *fill, void *out) {
    switch (itemsize) {
        case 1: return padded_copy_all<uint8_t>(windows, count, shape, fill, out);
        case 2: return padded_copy_all<uint16_t>(windows, count, shape, fill, out);
        case 4: return padded_copy_all<uint32_t>(windows, count, shape, fill, out);
        case 8: return padded_copy_all<uint64_t>(windows, count, shape, fill, out);
        default: return EMF_BAD_DTYPE;
    }
}

int emf_gather_chunked_convert(const emf_chunked_window *windows, int64_t count, const int64_t shape[4],
                               emf_dtype src_dtype, emf_dtype out_dtype, void *out) {
    switch (out_dtype) {
        case EMF_FLOAT32: return chunked_convert_from<float>(windows, count, shape, src_dtype, out);
        case EMF_FLOAT16: return chunked_convert_from<uint16_t>(windows, count, shape, src_dtype, out);
        default: return EMF_BAD_DTYPE;
    }
}

int emf_gather_chunked_copy(const emf_chunked_window *windows, int64_t count, const int64_t shape[4], int itemsize,
                            void *out) {
    switch (itemsize) {
        case 1: return chunked_copy_all<uint8_t>(windows, count, shape, out);
        case 2: return chunked_copy_all<uint16_t>(windows, count, shape, out);
        case 4: return chunked_copy_all<uint32_t>(windows, count, shape, out);
        case 8: return chunked_copy_all<uint64_t>(windows, count, shape, out);
        default: return EMF_BAD_DTYPE;
    }
}

}  // extern "C"
