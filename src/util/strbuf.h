/* A growing, NUL-terminated byte buffer for building JSON and prompts. Allocation failure
 * is sticky (`oom`), so a sequence of appends needs one check at the end. */
#ifndef NEEDLE_UTIL_STRBUF_H
#define NEEDLE_UTIL_STRBUF_H

#include <stddef.h>

typedef struct strbuf {
    char *data; /* NULL until the first append */
    size_t len, cap;
    int oom;
} strbuf;

void strbuf_put(strbuf *b, const char *s, size_t n);
void strbuf_puts(strbuf *b, const char *s);
/* Appends s as a JSON string literal: quotes, backslash and control characters escaped,
 * everything else (valid UTF-8 is assumed) copied as is. */
void strbuf_put_json_string(strbuf *b, const char *s, size_t n);

#endif
