/* platform.h under WASI (WebAssembly): no mmap, so the model file is read whole into
 * 64-byte-aligned memory; one thread; the files the runtime opened to the module
 * (wasmtime --dir) are the only ones reachable. */
#if defined(__wasi__)

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"
#include "util/platform.h"

int platform_map_file(const char *path, const void **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return needle_fail(NEEDLE_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return needle_fail(NEEDLE_ERR_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX - 64) {
        fclose(f);
        return needle_fail(NEEDLE_ERR_IO, "%s is %llu bytes, larger than this 32-bit build's "
                           "address space", path, (unsigned long long)st.st_size);
    }
    const size_t n = (size_t)st.st_size;
    if (n == 0) {
        fclose(f);
        return needle_fail(NEEDLE_ERR_FORMAT, "%s is empty", path);
    }
    void *buf = platform_aligned_alloc(64, n);
    if (!buf) {
        fclose(f);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "cannot read %s: out of memory (%zu bytes)",
                           path, n);
    }
    const size_t got = fread(buf, 1, n, f);
    const int read_errno = errno;
    fclose(f);
    if (got != n) {
        free(buf);
        return needle_fail(NEEDLE_ERR_IO, "cannot read %s: %s", path,
                           got < n ? "short read" : strerror(read_errno));
    }
    *data = buf;
    *size = n;
    return NEEDLE_OK;
}

void platform_unmap_file(const void *data, size_t size) {
    (void)size;
    free((void *)(uintptr_t)data);
}

int platform_readable(const char *path) { return path[0] && access(path, R_OK) == 0; }

double platform_link_mtime(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return -1;
    return (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
}

int platform_mkdir(const char *path) { return mkdir(path, 0777); }

FILE *platform_fopen(const char *path, const char *mode) { return fopen(path, mode); }

int platform_replace_file(const char *from, const char *to) { return rename(from, to); }

int platform_remove(const char *path) { return remove(path); }

int platform_utf8_args(int *argc, char ***argv) {
    (void)argc, (void)argv;
    return 0;
}

int platform_cpu_count(void) { return 1; }

uint64_t platform_memory_bytes(void) { return 0; }

void platform_machine_name(char *out, size_t cap) { snprintf(out, cap, "wasm32"); }

double platform_peak_rss_mb(void) {
    /* the linear memory never shrinks: its size is the peak */
    return (double)__builtin_wasm_memory_size(0) * 65536.0 / (1024.0 * 1024.0);
}

void *platform_aligned_alloc(size_t align, size_t size) {
    if (size > SIZE_MAX - align) return NULL;
    return aligned_alloc(align, (size + align - 1) / align * align);
}

void platform_aligned_free(void *p) { free(p); }

int platform_has_threads(void) { return 0; }

#else
typedef int platform_wasi_unused; /* ISO C wants at least one declaration */
#endif
