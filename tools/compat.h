/* The POSIX functions the CLI uses that the Windows C runtime lacks (mingw-w64 builds,
 * cmake/toolchain-x86_64-w64-mingw32.cmake), and the peak-memory query on every system. The library's own
 * portability layer is src/util/platform.h; tools use only the public header. */
#ifndef NEEDLE_TOOLS_COMPAT_H
#define NEEDLE_TOOLS_COMPAT_H

#ifdef _WIN32
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

/* POSIX getline: a whole line (with its '\n') into *line, grown as needed; -1 at the end
 * of the input or when out of memory. */
static inline ssize_t compat_getline(char **line, size_t *cap, FILE *f) {
    if (!line || !cap || !f) return -1;
    size_t n = 0;
    int c;
    while ((c = fgetc(f)) != EOF) {
        if (n + 2 > *cap) {
            size_t want = *cap ? *cap * 2 : 128;
            char *grown = realloc(*line, want);
            if (!grown) return -1;
            *line = grown;
            *cap = want;
        }
        (*line)[n++] = (char)c;
        if (c == '\n') break;
    }
    if (n == 0) return -1;
    (*line)[n] = '\0';
    return n > (size_t)INT64_MAX ? -1 : (ssize_t)n;
}
#define getline compat_getline
#endif

/* Processors online; the process's peak resident memory in MiB. */
#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
/* after windows.h; GetProcessMemoryInfo is kernel32's K32GetProcessMemoryInfo */
#include <psapi.h>
static inline long compat_cpu_count(void) {
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return (long)si.dwNumberOfProcessors;
}
static inline double compat_peak_rss_mb(void) {
    PROCESS_MEMORY_COUNTERS pmc;
    if (!GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof pmc)) return 0;
    return (double)pmc.PeakWorkingSetSize / (1024.0 * 1024.0);
}
#elif defined(__wasi__)
static inline long compat_cpu_count(void) { return 1; }
/* the linear memory never shrinks: its size is the peak */
static inline double compat_peak_rss_mb(void) {
    return (double)__builtin_wasm_memory_size(0) * 65536.0 / (1024.0 * 1024.0);
}
#else
#include <sys/resource.h>
#include <unistd.h>
static inline long compat_cpu_count(void) { return sysconf(_SC_NPROCESSORS_ONLN); }
static inline double compat_peak_rss_mb(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
}
#endif

#endif
