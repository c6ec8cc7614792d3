/* Reading many files, or byte ranges of them, in one call without the GIL: the chunk files (or shard ranges) a
 * lazy volume misses for a box. In Python each file costs a stat, an open, an fstat, a read and a close through
 * the interpreter (about 100 microseconds with the bookkeeping); here the same system calls cost a few.
 *
 * A path is checked by stat before it is opened, and opened non-blocking and checked again through its
 * descriptor, so a FIFO or a device is never read and cannot block (the Python reader's contract). These
 * functions never touch Python; the Cython wrapper allocates the buffers between the two phases.
 */
#ifndef EMFAST_FILES_H
#define EMFAST_FILES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What became of one file. */
typedef enum {
    EMF_FILE_OPEN = 0,         /* emf_open_files: opened; emf_read_files: read and closed */
    EMF_FILE_MISSING = 1,      /* no such file */
    EMF_FILE_NOT_REGULAR = 2,  /* a directory, FIFO, device or socket: never read (its st_mode in modes[]) */
    EMF_FILE_FAILED = 3,       /* a system call failed: its errno in errors[] */
    EMF_FILE_UNSUPPORTED = 4,  /* this build reads no files (Windows): the caller reads them another way */
} emf_file_status;

/* Open each of the n paths for reading: status[i], and on EMF_FILE_OPEN its descriptors[i], sizes[i] (bytes)
 * and mtimes_ns[i] (modification time, nanoseconds) from fstat of the open descriptor. */
void emf_open_files(int64_t n, const char *const *paths, int *descriptors, int64_t *sizes, int64_t *mtimes_ns,
                    int *status, int *modes, int *errors);

/* For each file with status[i] == EMF_FILE_OPEN: read up to lengths[i] bytes from byte starts[i] into
 * destinations[i], store how many were read in lengths[i] (fewer at the end of the file), and close it; a read
 * that fails sets status[i] to EMF_FILE_FAILED and errors[i]. Interrupted reads are retried. */
void emf_read_files(int64_t n, const int *descriptors, const int64_t *starts, int64_t *lengths,
                    char *const *destinations, int *status, int *errors);

/* Close each file with status[i] == EMF_FILE_OPEN (after an error between the two phases). */
void emf_close_files(int64_t n, const int *descriptors, const int *status);

#ifdef __cplusplus
}
#endif

#endif
