/* platform.h on POSIX systems: mmap, sysconf, uname. */
#if !defined(_WIN32) && !defined(__wasi__)

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "util/error.h"
#include "util/platform.h"

int platform_map_file(const char *path, const void **data, size_t *size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return needle_fail(NEEDLE_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return needle_fail(NEEDLE_ERR_IO, "%s is not a regular file", path);
    }
    /* st_size is 64-bit (the build defines _FILE_OFFSET_BITS=64); on a 32-bit target a
     * file past SIZE_MAX cannot be mapped whole, and a cast would wrap to a prefix */
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return needle_fail(NEEDLE_ERR_IO, "%s is %llu bytes, larger than this %u-bit build's "
                           "address space", path, (unsigned long long)st.st_size,
                           (unsigned)(sizeof(void *) * 8));
    }
    const size_t n = (size_t)st.st_size;
    if (n == 0) {
        close(fd);
        return needle_fail(NEEDLE_ERR_FORMAT, "%s is empty", path);
    }
    void *map = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED)
        return needle_fail(NEEDLE_ERR_IO, "cannot map %s: %s", path, strerror(map_errno));
    *data = map;
    *size = n;
    return NEEDLE_OK;
}

void platform_unmap_file(const void *data, size_t size) {
    if (data) munmap((void *)(uintptr_t)data, size);
}

int platform_readable(const char *path) { return path[0] && access(path, R_OK) == 0; }

double platform_link_mtime(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return -1;
#ifdef __APPLE__ /* Darwin names the field st_mtimespec */
    const struct timespec t = st.st_mtimespec;
#else
    const struct timespec t = st.st_mtim;
#endif
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int platform_mkdir(const char *path) { return mkdir(path, 0777); }

FILE *platform_fopen(const char *path, const char *mode) { return fopen(path, mode); }

int platform_replace_file(const char *from, const char *to) { return rename(from, to); }

int platform_remove(const char *path) { return remove(path); }

int platform_utf8_args(int *argc, char ***argv) {
    (void)argc, (void)argv;
    return 0;
}

int platform_cpu_count(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > 65536 ? 65536 : (int)cores;
}

uint64_t platform_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

void platform_machine_name(char *out, size_t cap) {
    struct utsname u;
    snprintf(out, cap, "%s", uname(&u) == 0 ? u.machine : "");
}

double platform_peak_rss_mb(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
#if defined(__APPLE__)
    return (double)ru.ru_maxrss / (1024.0 * 1024.0); /* bytes on macOS */
#else
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux and the BSDs */
#endif
}

void *platform_aligned_alloc(size_t align, size_t size) {
    /* C11 wants a size that is a multiple of the alignment */
    if (size > SIZE_MAX - align) return NULL;
    return aligned_alloc(align, (size + align - 1) / align * align);
}

void platform_aligned_free(void *p) { free(p); }

int platform_has_threads(void) { return 1; }

#else
typedef int platform_posix_unused; /* ISO C wants at least one declaration */
#endif
