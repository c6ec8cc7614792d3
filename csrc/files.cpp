/* Reading many files in one call without the GIL; contract in files.h. */
#include "files.h"

#ifndef _WIN32

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

static int64_t mtime_ns(const struct stat &status) {
#if defined(__APPLE__)
    return (int64_t)status.st_mtimespec.tv_sec * 1000000000 + status.st_mtimespec.tv_nsec;
#else
    return (int64_t)status.st_mtim.tv_sec * 1000000000 + status.st_mtim.tv_nsec;
#endif
}

static int missing(int error) { return error == ENOENT || error == ENOTDIR; }

void emf_open_files(int64_t n, const char *const *paths, int *descriptors, int64_t *sizes, int64_t *mtimes_ns,
                    int *status, int *modes, int *errors) {
    for (int64_t i = 0; i < n; ++i) {
        descriptors[i] = -1;
        errors[i] = 0;
        modes[i] = 0;
        struct stat before;
        if (stat(paths[i], &before) != 0) {  // never opened unless a regular file stood there
            status[i] = missing(errno) ? EMF_FILE_MISSING : EMF_FILE_FAILED;
            errors[i] = errno;
            continue;
        }
        if (!S_ISREG(before.st_mode)) {
            status[i] = EMF_FILE_NOT_REGULAR;
            modes[i] = (int)before.st_mode;
            continue;
        }
        int descriptor;
        do {
            descriptor = open(paths[i], O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        } while (descriptor < 0 && errno == EINTR);
        if (descriptor < 0) {
            status[i] = missing(errno) ? EMF_FILE_MISSING : EMF_FILE_FAILED;
            errors[i] = errno;
            continue;
        }
        struct stat opened;
        if (fstat(descriptor, &opened) != 0) {
            status[i] = EMF_FILE_FAILED;
            errors[i] = errno;
            close(descriptor);
            continue;
        }
        if (!S_ISREG(opened.st_mode)) {  // swapped for another kind between stat and open
            status[i] = EMF_FILE_NOT_REGULAR;
            modes[i] = (int)opened.st_mode;
            close(descriptor);
            continue;
        }
        descriptors[i] = descriptor;
        sizes[i] = (int64_t)opened.st_size;
        mtimes_ns[i] = mtime_ns(opened);
        status[i] = EMF_FILE_OPEN;
    }
}

void emf_read_files(int64_t n, const int *descriptors, const int64_t *starts, int64_t *lengths,
                    char *const *destinations, int *status, int *errors) {
    for (int64_t i = 0; i < n; ++i) {
        if (status[i] != EMF_FILE_OPEN)
            continue;
        int64_t got = 0;
        while (got < lengths[i]) {
            ssize_t count = pread(descriptors[i], destinations[i] + got, (size_t)(lengths[i] - got),
                                  (off_t)(starts[i] + got));
            if (count < 0 && errno == EINTR)
                continue;
            if (count < 0) {
                status[i] = EMF_FILE_FAILED;
                errors[i] = errno;
                break;
            }
            if (count == 0)
                break;  // the end of the file
            got += count;
        }
        lengths[i] = got;
        close(descriptors[i]);
    }
}

void emf_close_files(int64_t n, const int *descriptors, const int *status) {
    for (int64_t i = 0; i < n; ++i)
        if (status[i] == EMF_FILE_OPEN)
            close(descriptors[i]);
}

#else  // Windows: no descriptors of this kind; the Python reader reads these files

void emf_open_files(int64_t n, const char *const *, int *descriptors, int64_t *, int64_t *, int *status, int *modes,
                    int *errors) {
    for (int64_t i = 0; i < n; ++i) {
        descriptors[i] = -1;
        status[i] = EMF_FILE_UNSUPPORTED;
        modes[i] = errors[i] = 0;
    }
}

void emf_read_files(int64_t, const int *, const int64_t *, int64_t *, char *const *, int *, int *) {}

void emf_close_files(int64_t, const int *, const int *) {}

#endif
