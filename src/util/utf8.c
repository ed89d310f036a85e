/* See utf8.h. */
#include "util/utf8.h"

int util_utf8_next(const uint8_t *s, size_t n, uint32_t *cp, size_t *bad) {
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t ignored;
    int need;
    uint32_t v;
    if (!bad) bad = &ignored;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        v = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        v = c & 0x0Fu;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        v = c & 0x07u;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* > U+10FFFF */
    } else {
        *bad = 1;
        return 0;
    }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) return -1;
        if (s[k] < lo || s[k] > hi) {
            *bad = (size_t)k;
            return 0;
        }
        v = v << 6 | (s[k] & 0x3Fu);
        lo = 0x80;
        hi = 0xBF;
    }
    *cp = v;
    return need + 1;
}

size_t util_utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6), out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12), out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18), out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}
