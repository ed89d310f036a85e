/* platform.h on Windows: CreateFileMapping for the model file, UTF-8 paths converted to
 * UTF-16 for the wide-character API (the ANSI one would read them in the local code
 * page), GetSystemInfo and GlobalMemoryStatusEx. */
#if defined(_WIN32)

#define WIN32_LEAN_AND_MEAN
#include <windows.h>
/* after windows.h; PSAPI_VERSION 2: GetProcessMemoryInfo is in kernel32 (K32...) */
#include <psapi.h>
/* CommandLineToArgvW (shell32), outside WIN32_LEAN_AND_MEAN */
#include <shellapi.h>

#include <errno.h>
#include <malloc.h>
#include <wchar.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/error.h"
#include "util/platform.h"

/* The UTF-16 form of a UTF-8 path (malloc'd), or NULL when it is not valid UTF-8. */
static wchar_t *wide_path(const char *path) {
    int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, NULL, 0);
    if (n <= 0) return NULL;
    wchar_t *w = malloc((size_t)n * sizeof *w);
    if (w && MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, w, n) != n) {
        free(w);
        w = NULL;
    }
    return w;
}

/* The system's message for `code`, in English where the system has it. */
static const char *win_message(DWORD code, char *buf, DWORD cap) {
    DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL,
                             code, 0, buf, cap, NULL);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == '.')) buf[--n] = 0;
    if (!n) snprintf(buf, cap, "error %lu", (unsigned long)code);
    return buf;
}

int platform_map_file(const char *path, const void **data, size_t *size) {
    char msg[256];
    wchar_t *w = wide_path(path);
    if (!w) return needle_fail(NEEDLE_ERR_IO, "cannot open %s: the path is not valid UTF-8", path);
    HANDLE file = CreateFileW(w, GENERIC_READ, FILE_SHARE_READ, NULL, OPEN_EXISTING,
                              FILE_ATTRIBUTE_NORMAL, NULL);
    free(w);
    if (file == INVALID_HANDLE_VALUE)
        return needle_fail(NEEDLE_ERR_IO, "cannot open %s: %s", path,
                           win_message(GetLastError(), msg, sizeof msg));
    LARGE_INTEGER len;
    if (!GetFileSizeEx(file, &len) || GetFileType(file) != FILE_TYPE_DISK) {
        CloseHandle(file);
        return needle_fail(NEEDLE_ERR_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)len.QuadPart > (uint64_t)SIZE_MAX) {
        CloseHandle(file);
        return needle_fail(NEEDLE_ERR_IO, "%s is %llu bytes, larger than this build's address "
                           "space", path, (unsigned long long)len.QuadPart);
    }
    if (len.QuadPart == 0) {
        CloseHandle(file);
        return needle_fail(NEEDLE_ERR_FORMAT, "%s is empty", path);
    }
    /* The view keeps the mapping object, and that the file, alive: both handles can be
     * closed at once, and UnmapViewOfFile alone releases everything. */
    HANDLE mapping = CreateFileMappingW(file, NULL, PAGE_READONLY, 0, 0, NULL);
    const DWORD map_error = GetLastError();
    CloseHandle(file);
    if (!mapping)
        return needle_fail(NEEDLE_ERR_IO, "cannot map %s: %s", path,
                           win_message(map_error, msg, sizeof msg));
    void *view = MapViewOfFile(mapping, FILE_MAP_READ, 0, 0, 0);
    const DWORD view_error = GetLastError();
    CloseHandle(mapping);
    if (!view)
        return needle_fail(NEEDLE_ERR_IO, "cannot map %s: %s", path,
                           win_message(view_error, msg, sizeof msg));
    *data = view;
    *size = (size_t)len.QuadPart;
    return NEEDLE_OK;
}

void platform_unmap_file(const void *data, size_t size) {
    (void)size;
    if (data) UnmapViewOfFile(data);
}

int platform_readable(const char *path) {
    if (!path[0]) return 0;
    wchar_t *w = wide_path(path);
    if (!w) return 0;
    HANDLE f = CreateFileW(w, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE, NULL,
                           OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, NULL);
    free(w);
    if (f == INVALID_HANDLE_VALUE) return 0;
    CloseHandle(f);
    return 1;
}

double platform_link_mtime(const char *path) {
    /* the attributes of the entry itself: a reparse point (link) is not followed */
    wchar_t *w = wide_path(path);
    if (!w) return -1;
    WIN32_FILE_ATTRIBUTE_DATA a;
    const BOOL ok = GetFileAttributesExW(w, GetFileExInfoStandard, &a);
    free(w);
    if (!ok) return -1;
    /* FILETIME: 100 ns ticks since 1601-01-01 */
    const ULONGLONG ticks = ((ULONGLONG)a.ftLastWriteTime.dwHighDateTime << 32) |
                            a.ftLastWriteTime.dwLowDateTime;
    return (double)ticks * 1e-7 - 11644473600.0;
}

int platform_mkdir(const char *path) {
    wchar_t *w = wide_path(path);
    if (!w) {
        errno = ENOMEM;
        return -1;
    }
    const int rc = _wmkdir(w);
    free(w);
    return rc;
}

FILE *platform_fopen(const char *path, const char *mode) {
    wchar_t *w = wide_path(path), wmode[8];
    size_t i = 0;
    for (; mode[i] && i + 1 < sizeof wmode / sizeof *wmode; i++) wmode[i] = (wchar_t)(unsigned char)mode[i];
    wmode[i] = 0;
    if (!w) {
        errno = EINVAL; /* not valid UTF-8 (or out of memory) */
        return NULL;
    }
    FILE *f = _wfopen(w, wmode);
    free(w);
    return f;
}

int platform_replace_file(const char *from, const char *to) {
    wchar_t *wf = wide_path(from), *wt = wide_path(to);
    BOOL ok = wf && wt && MoveFileExW(wf, wt, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH);
    const DWORD code = ok ? 0 : GetLastError();
    free(wf);
    free(wt);
    if (ok) return 0;
    errno = code == ERROR_ACCESS_DENIED || code == ERROR_SHARING_VIOLATION ? EACCES
            : code == ERROR_FILE_NOT_FOUND || code == ERROR_PATH_NOT_FOUND ? ENOENT
                                                                            : EIO;
    return -1;
}

int platform_remove(const char *path) {
    wchar_t *w = wide_path(path);
    if (!w) {
        errno = EINVAL;
        return -1;
    }
    const int rc = _wremove(w);
    free(w);
    return rc;
}

int platform_utf8_args(int *argc, char ***argv) {
    SetConsoleOutputCP(CP_UTF8);
    int n = 0;
    wchar_t **wargv = CommandLineToArgvW(GetCommandLineW(), &n);
    if (!wargv) return -1;
    char **out = calloc((size_t)n + 1, sizeof *out);
    for (int i = 0; out && i < n; i++) {
        const int len = WideCharToMultiByte(CP_UTF8, 0, wargv[i], -1, NULL, 0, NULL, NULL);
        out[i] = len > 0 ? malloc((size_t)len) : NULL;
        if (!out[i] || WideCharToMultiByte(CP_UTF8, 0, wargv[i], -1, out[i], len, NULL, NULL) != len) {
            for (int j = 0; j <= i; j++) free(out[j]);
            free(out);
            out = NULL;
        }
    }
    LocalFree(wargv);
    if (!out) return -1;
    *argc = n;
    *argv = out;
    return 0;
}

int platform_cpu_count(void) {
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return si.dwNumberOfProcessors ? (int)si.dwNumberOfProcessors : 1;
}

uint64_t platform_memory_bytes(void) {
    MEMORYSTATUSEX ms;
    ms.dwLength = sizeof ms;
    return GlobalMemoryStatusEx(&ms) ? (uint64_t)ms.ullTotalPhys : 0;
}

void platform_machine_name(char *out, size_t cap) {
    SYSTEM_INFO si;
    GetNativeSystemInfo(&si);
    const char *name = si.wProcessorArchitecture == PROCESSOR_ARCHITECTURE_AMD64   ? "x86_64"
                       : si.wProcessorArchitecture == PROCESSOR_ARCHITECTURE_ARM64 ? "arm64"
                       : si.wProcessorArchitecture == PROCESSOR_ARCHITECTURE_INTEL ? "x86"
                                                                                   : "";
    snprintf(out, cap, "%s", name);
}

double platform_peak_rss_mb(void) {
    PROCESS_MEMORY_COUNTERS pmc;
    if (!GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof pmc)) return 0;
    return (double)pmc.PeakWorkingSetSize / (1024.0 * 1024.0);
}

void *platform_aligned_alloc(size_t align, size_t size) { return _aligned_malloc(size, align); }

void platform_aligned_free(void *p) { _aligned_free(p); }

int platform_has_threads(void) { return 1; }

#else
typedef int platform_win32_unused; /* ISO C wants at least one declaration */
#endif
