/* See strbuf.h. */
#include "util/strbuf.h"

#include <stdlib.h>
#include <string.h>

void strbuf_put(strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void strbuf_puts(strbuf *b, const char *s) { strbuf_put(b, s, strlen(s)); }
