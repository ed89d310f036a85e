/* The POSIX functions the C suite uses that the Windows C runtime (mingw-w64's msvcrt)
 * lacks, for the tests built under platform/windows.cmake (force-included there, so the
 * tests stay plain POSIX). Each behaves as POSIX specifies for what the tests ask of it. */
#ifndef NEEDLE_TESTS_WIN_POSIX_H
#define NEEDLE_TESTS_WIN_POSIX_H
#ifdef _WIN32

#include <direct.h>
#include <errno.h>
#include <io.h>
#include <process.h>
#include <stdlib.h>
#include <string.h>

/* mkdtemp: the trailing XXXXXX replaced until a new folder can be created there */
static inline char *win_mkdtemp(char *tmpl) {
    const size_t n = strlen(tmpl);
    if (n < 6 || strcmp(tmpl + n - 6, "XXXXXX") != 0) {
        errno = EINVAL;
        return NULL;
    }
    static unsigned counter;
    for (int attempt = 0; attempt < 1000; attempt++) {
        unsigned v = (unsigned)rand() ^ (++counter * 2654435761u) ^ (unsigned)_getpid();
        for (int i = 0; i < 6; i++, v /= 36) tmpl[n - 6 + i] = "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36];
        if (_mkdir(tmpl) == 0) return tmpl;
        if (errno != EEXIST) return NULL;
    }
    return NULL;
}
#define mkdtemp win_mkdtemp

static inline char *win_strndup(const char *s, size_t n) {
    size_t len = 0;
    while (len < n && s[len]) len++;
    char *out = malloc(len + 1);
    if (out) {
        memcpy(out, s, len);
        out[len] = 0;
    }
    return out;
}
#define strndup win_strndup

/* setenv / unsetenv over _putenv_s (an empty value removes the variable there, as
 * unsetenv does; the tests never set one to the empty string) */
static inline int win_setenv(const char *name, const char *value, int overwrite) {
    if (!overwrite && getenv(name)) return 0;
    return _putenv_s(name, value) == 0 ? 0 : -1;
}
static inline int win_unsetenv(const char *name) { return _putenv_s(name, "") == 0 ? 0 : -1; }
#define setenv win_setenv
#define unsetenv win_unsetenv

#endif
#endif
