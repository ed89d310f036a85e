/* See json_escape.h. */
#include "util/json_escape.h"

#include <string.h>

#include "util/utf8.h"

static size_t put_u(uint32_t v, char *out) {
    static const char hex[] = "0123456789abcdef";
    out[0] = '\\', out[1] = 'u';
    for (int i = 0; i < 4; i++) out[2 + i] = hex[(v >> (12 - 4 * i)) & 15];
    return 6;
}

size_t util_json_escape_cp(uint32_t cp, int ascii, char *out) {
    char short_form = 0;
    switch (cp) {
    case '"': short_form = '"'; break;
    case '\\': short_form = '\\'; break;
    case '\n': short_form = 'n'; break;
    case '\r': short_form = 'r'; break;
    case '\t': short_form = 't'; break;
    case '\b': short_form = 'b'; break;
    case '\f': short_form = 'f'; break;
    default: break;
    }
    if (short_form) {
        out[0] = '\\', out[1] = short_form;
        return 2;
    }
    if (cp < 0x20 || (ascii && cp >= 0x7F && cp < 0x10000)) return put_u(cp, out);
    if (ascii && cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        put_u(0xD800 + (v >> 10), out);
        return 6 + put_u(0xDC00 + (v & 0x3FF), out + 6);
    }
    return util_utf8_encode(cp, (uint8_t *)out);
}

void util_json_put_string(strbuf *b, const char *s, size_t n, int ascii) {
    const uint8_t *u = (const uint8_t *)s;
    char esc[UTIL_JSON_ESCAPE_MAX];
    size_t run = 0, i = 0; /* bytes [run, i) are copied as they are */
    strbuf_put(b, "\"", 1);
    while (i < n) {
        uint32_t cp = u[i];
        int len = 1;
        if (cp >= 0x80) {
            if (!ascii) { /* raw UTF-8 (or stray bytes) needs no escaping */
                i++;
                continue;
            }
            len = util_utf8_next(u + i, n - i, &cp, NULL);
            if (len <= 0) { /* not UTF-8: copied */
                i++;
                continue;
            }
        } else if (cp >= 0x20 && cp != '"' && cp != '\\' && !(ascii && cp == 0x7F)) {
            i++;
            continue;
        }
        strbuf_put(b, s + run, i - run);
        strbuf_put(b, esc, util_json_escape_cp(cp, ascii, esc));
        i += (size_t)len;
        run = i;
    }
    strbuf_put(b, s + run, n - run);
    strbuf_put(b, "\"", 1);
}
