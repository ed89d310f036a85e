/* The one-character JSON string escapes (RFC 8259 §7), shared by the parsers that decode
 * them (the prompt re-serializer and the grammar). */
#ifndef NEEDLE_UTIL_JSON_ESCAPE_H
#define NEEDLE_UTIL_JSON_ESCAPE_H

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

#endif
