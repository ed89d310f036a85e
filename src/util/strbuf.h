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
/* JSON string literals: util_json_put_string in util/json_escape.h. */

#endif
