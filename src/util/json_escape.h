/* The library's one JSON string escaper, and the one-character escapes (RFC 8259 §7)
 * shared by the parsers that decode them (the JSON re-serializer and the grammar).
 *
 * Strings are written as Python's json.dumps writes them, since that is the surface the
 * model was trained on: \" \\ \n \r \t \b \f as two characters, other control characters
 * as \u00XX (lowercase hex), "/" and DEL unescaped; with ensure_ascii (ascii = 1) every
 * code point from U+007F up as \uXXXX, above U+FFFF as a surrogate pair. */
#ifndef NEEDLE_UTIL_JSON_ESCAPE_H
#define NEEDLE_UTIL_JSON_ESCAPE_H

#include <stddef.h>
#include <stdint.h>

#include "util/strbuf.h"

/* Most bytes util_json_escape_cp writes (a surrogate pair). */
#define UTIL_JSON_ESCAPE_MAX 12

/* The character that `\e` stands for, or -1 if e is 'u' (a \uXXXX escape) or not an
 * escape at all. */
static inline int json_simple_escape(int e) {
    switch (e) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return -1;
    }
}

/* Writes code point cp (< 0x110000, not a surrogate) as it appears inside a JSON string
 * to out (room for UTIL_JSON_ESCAPE_MAX bytes); returns the number of bytes written. */
size_t util_json_escape_cp(uint32_t cp, int ascii, char *out);

/* Appends s[0..n) as a JSON string literal, quotes included. Bytes that are not
 * well-formed UTF-8 are copied as they are (the escaper does not validate). */
void util_json_put_string(strbuf *b, const char *s, size_t n, int ascii);

#endif
