/* The library's one monotonic clock: stats, the per-operation profile, the thread pool's
 * spin limits and the chat layer's timings all read it, so their figures agree. */
#ifndef NEEDLE_UTIL_CLOCK_H
#define NEEDLE_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC (never goes back, unaffected by wall-clock changes). */
static inline int64_t util_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline double util_clock_ms(void) { return (double)util_clock_ns() / 1e6; }

#endif
