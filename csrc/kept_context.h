/* A decoder's context kept by each thread for its next calls (zstd.cpp, deflate.cpp).
 *
 * Making a context costs more than decoding a small part of a box: libzstd's is 96 KiB, allocated and set up afresh,
 * about 13 us, and the decode helpers decode a box's missing chunks in calls of a few chunks each
 * (benchmarks/lazy_cold.py). Each thread keeps the one it made and frees it when it ends. A context belongs to the
 * library that made it: a thread given another library's functions frees it and makes a new one.
 */
#ifndef EMFAST_KEPT_CONTEXT_H
#define EMFAST_KEPT_CONTEXT_H

namespace emf_kept {

template <typename Make, typename Free>
class Context {
public:
    Context() = default;
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;
    ~Context() { release(); }

    /* This thread's context made by `make` (freed by `free`), made now if it has none of that library; nullptr
     * if `make` fails. */
    void *get(Make make, Free free) {
        if (context_ != nullptr && make_ == make && free_ == free)
            return context_;
        release();
        context_ = make();
        make_ = make;
        free_ = free;
        return context_;
    }

private:
    void release() {
        if (context_ != nullptr)
            free_(context_);
        context_ = nullptr;
    }

    void *context_ = nullptr;
    Make make_ = nullptr;
    Free free_ = nullptr;
};

}  // namespace emf_kept

#endif
