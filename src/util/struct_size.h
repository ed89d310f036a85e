/* The "Struct sizes" rule of needle.h, in one place: every public struct begins with
 * `uint32_t size`, the caller's sizeof. An input is read up to the caller's size over the
 * library's defaults; an output is written up to the caller's size. Both refuse 0 (an
 * uninitialized struct), less than the size field itself, and more than the library's own
 * struct (a caller built against a newer header), with NEEDLE_ERR_INVALID_ARGUMENT and a
 * message naming `what`. */
#ifndef NEEDLE_UTIL_STRUCT_SIZE_H
#define NEEDLE_UTIL_STRUCT_SIZE_H

#include <stddef.h>

/* `dst` holds the library's defaults (a full struct of `full` bytes); a non-NULL `src`
 * overrides its first src->size bytes. dst->size ends as `full`. */
int struct_size_in(void *dst, const void *src, size_t full, const char *what);

/* Copies the complete struct `full` (`full_size` bytes) into `out` up to out->size,
 * leaving out->size as the caller set it. */
int struct_size_out(void *out, const void *full, size_t full_size, const char *what);

#endif
