/* Error reporting shared by every module.
 *
 * A failing internal function records a message for the calling thread and returns a
 * negative needle_status; needle_last_error() hands that message to the user. The
 * message is thread-local so that sessions running in different threads never see
 * each other's errors, and so that constructors can report failures before any handle
 * exists. Library code never prints and never aborts. */
#ifndef NEEDLE_UTIL_ERROR_H
#define NEEDLE_UTIL_ERROR_H

#include "needle.h"

#if defined(__MINGW32__)
/* gnu_printf with __USE_MINGW_ANSI_STDIO (the build defines it): C99 formats (%zu, %lld) */
#define NEEDLE_PRINTF(a, b) __attribute__((format(gnu_printf, a, b)))
#elif defined(__GNUC__) || defined(__clang__)
#define NEEDLE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NEEDLE_PRINTF(a, b)
#endif

/* Records "fmt" for this thread and returns `status` (a negative needle_status), so that
 * callers can write `return needle_fail(NEEDLE_ERR_FORMAT, "...", ...);`. */
int needle_fail(int status, const char *fmt, ...) NEEDLE_PRINTF(2, 3);

/* Clears this thread's message; public entry points call it on success paths. */
void needle_clear_error(void);

#endif
