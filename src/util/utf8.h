/* The library's one UTF-8 decoder and encoder (tokenizer, JSON re-serializer, grammar).
 *
 * Decoding follows the Unicode table of well-formed byte sequences (Unicode 15, table
 * 3-7): no overlong forms, no surrogates, nothing past U+10FFFF. */
#ifndef NEEDLE_UTIL_UTF8_H
#define NEEDLE_UTIL_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Classifies the bytes s[0..n), n >= 1. Returns the length (1-4) of a well-formed
 * sequence and sets *cp; returns 0 if the bytes are ill-formed, with *bad = the length of
 * the maximal subpart that one U+FFFD replaces (what Python's errors='replace' does);
 * returns -1 if they are a valid but unfinished prefix. bad may be NULL. */
int util_utf8_next(const uint8_t *s, size_t n, uint32_t *cp, size_t *bad);

/* Writes code point cp (< 0x110000) as UTF-8 to out; returns the length, 1-4. */
size_t util_utf8_encode(uint32_t cp, uint8_t out[4]);

#endif
