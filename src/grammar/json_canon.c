/* Compact re-serialization of JSON text in Python json.dumps style (see json_canon.h).
 * A small recursive-descent parser that writes as it reads; depth is bounded so hostile
 * input cannot exhaust the stack. */
#include "grammar/json_canon.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "needle.h"
#include "util/error.h"
#include "util/json_escape.h"
#include "util/strbuf.h"
#include "util/utf8.h"

#define MAX_DEPTH 128

typedef struct parser {
    const char *s;
    size_t len, pos;
    strbuf out;
    const char *error;
} parser;

static int fail_at(parser *p, const char *what) {
    if (!p->error) p->error = what;
    return -1;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                               p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static int hex4(parser *p, unsigned *v) {
    if (p->len - p->pos < 4) return fail_at(p, "truncated \\u escape");
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos++];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d > 15) return fail_at(p, "bad hex digit in \\u escape");
        *v = *v * 16 + d;
    }
    return 0;
}

static void put_codepoint(strbuf *b, unsigned cp) {
    uint8_t u[4];
    strbuf_put(b, (const char *)u, util_utf8_encode(cp, u));
}

/* Emits one code point as Python's ensure_ascii=False encoder does. */
static void emit_char(strbuf *b, unsigned cp) {
    char esc[UTIL_JSON_ESCAPE_MAX];
    strbuf_put(b, esc, util_json_escape_cp(cp, 0, esc));
}

/* Decodes one UTF-8 sequence at p->pos (strict: no overlongs, surrogates or > U+10FFFF). */
static int utf8_next(parser *p, unsigned *cp) {
    uint32_t v;
    int n = util_utf8_next((const uint8_t *)p->s + p->pos, p->len - p->pos, &v, NULL);
    if (n <= 0) return fail_at(p, "invalid UTF-8");
    p->pos += (size_t)n;
    *cp = v;
    return 0;
}

/* Parses a string at p->pos (opening quote) and appends its decoded UTF-8 to `raw` if
 * non-NULL, and its re-escaped form to the output if `emit`. */
static int parse_string(parser *p, strbuf *raw, int emit) {
    p->pos++;
    if (emit) strbuf_put(&p->out, "\"", 1);
    for (;;) {
        if (p->pos >= p->len) return fail_at(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        unsigned cp;
        if (c == '"') { p->pos++; break; }
        if (c < 0x20) return fail_at(p, "control character in string");
        if (c == '\\') {
            if (++p->pos >= p->len) return fail_at(p, "unterminated escape");
            char e = p->s[p->pos++];
            const int simple = json_simple_escape(e);
            if (simple >= 0) {
                cp = (unsigned)simple;
            } else if (e == 'u') {
                if (hex4(p, &cp)) return -1;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (p->len - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                        return fail_at(p, "unpaired surrogate escape");
                    p->pos += 2;
                    if (hex4(p, &lo)) return -1;
                    if (lo < 0xDC00 || lo > 0xDFFF) return fail_at(p, "unpaired surrogate escape");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return fail_at(p, "unpaired surrogate escape");
                }
            } else {
                return fail_at(p, "unknown escape");
            }
        } else if (utf8_next(p, &cp)) {
            return -1;
        }
        if (raw) put_codepoint(raw, cp);
        if (emit) emit_char(&p->out, cp);
    }
    if (emit) strbuf_put(&p->out, "\"", 1);
    return 0;
}

size_t gram_python_float(double v, char *out) {
    if (v == 0) return (size_t)sprintf(out, signbit(v) ? "-0.0" : "0.0");
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v) break;
    }
    /* tmp = [-]D[.DDD]e[+-]XX: collect the digits and the decimal exponent */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *q = tmp + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    size_t n = 0;
    if (neg) out[n++] = '-';
    if (exp10 >= -5 + 1 && exp10 < 16) { /* Python repr: fixed for 1e-4 <= |v| < 1e16 */
        if (exp10 < 0) {
            out[n++] = '0';
            out[n++] = '.';
            for (int i = 0; i < -exp10 - 1; i++) out[n++] = '0';
            for (int i = 0; i < nd; i++) out[n++] = digits[i];
        } else {
            for (int i = 0; i <= exp10; i++) out[n++] = i < nd ? digits[i] : '0';
            out[n++] = '.';
            if (nd > exp10 + 1) for (int i = exp10 + 1; i < nd; i++) out[n++] = digits[i];
            else out[n++] = '0';
        }
    } else {
        out[n++] = digits[0];
        if (nd > 1) {
            out[n++] = '.';
            for (int i = 1; i < nd; i++) out[n++] = digits[i];
        }
        n += (size_t)sprintf(out + n, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
    out[n] = 0;
    return n;
}

static int parse_number(parser *p) {
    size_t start = p->pos;
    int is_float = 0;
    if (p->s[p->pos] == '-') p->pos++;
    if (p->pos >= p->len) return fail_at(p, "bad number");
    if (p->s[p->pos] == '0') p->pos++;
    else if (p->s[p->pos] >= '1' && p->s[p->pos] <= '9')
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    else return fail_at(p, "bad number");
    if (p->pos < p->len && p->s[p->pos] == '.') {
        is_float = 1;
        p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return fail_at(p, "bad number");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        is_float = 1;
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return fail_at(p, "bad number");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    size_t n = p->pos - start;
    if (!is_float) {
        /* Python ints keep every digit; only "-0" changes */
        if (n == 2 && p->s[start] == '-' && p->s[start + 1] == '0') strbuf_put(&p->out, "0", 1);
        else strbuf_put(&p->out, p->s + start, n);
        return 0;
    }
    char tmp[512];
    if (n >= sizeof tmp) return fail_at(p, "number too long");
    memcpy(tmp, p->s + start, n);
    tmp[n] = 0;
    double v = strtod(tmp, NULL);
    if (!isfinite(v)) { /* Python writes Infinity, which is not JSON: refuse */
        return fail_at(p, "number out of double range");
    }
    char out[40];
    strbuf_put(&p->out, out, gram_python_float(v, out));
    return 0;
}

static int parse_value(parser *p, int depth);

static int parse_object(parser *p, int depth) {
    p->pos++;
    strbuf_put(&p->out, "{", 1);
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') { p->pos++; strbuf_put(&p->out, "}", 1); return 0; }
    strbuf keys = {0};
    int rc = 0;
    for (int first = 1;; first = 0) {
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '"') { rc = fail_at(p, "expected a key"); break; }
        if (!first) strbuf_put(&p->out, ",", 1);
        strbuf key = {0};
        if ((rc = parse_string(p, &key, 1))) { free(key.data); break; }
        /* keys are stored NUL-separated to detect duplicates */
        size_t klen = key.len;
        const char *kd = key.data ? key.data : "";
        for (size_t off = 0; off < keys.len;) {
            size_t l = strlen(keys.data + off);
            if (l == klen && !memcmp(keys.data + off, kd, klen)) { rc = fail_at(p, "duplicate key"); break; }
            off += l + 1;
        }
        strbuf_put(&keys, kd, klen + 1);
        free(key.data);
        if (rc) break;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') { rc = fail_at(p, "expected ':'"); break; }
        p->pos++;
        strbuf_put(&p->out, ":", 1);
        if ((rc = parse_value(p, depth + 1))) break;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') { p->pos++; continue; }
        if (p->pos < p->len && p->s[p->pos] == '}') { p->pos++; strbuf_put(&p->out, "}", 1); break; }
        rc = fail_at(p, "expected ',' or '}'");
        break;
    }
    free(keys.data);
    return rc;
}

static int parse_array(parser *p, int depth) {
    p->pos++;
    strbuf_put(&p->out, "[", 1);
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') { p->pos++; strbuf_put(&p->out, "]", 1); return 0; }
    for (int first = 1;; first = 0) {
        if (!first) strbuf_put(&p->out, ",", 1);
        if (parse_value(p, depth + 1)) return -1;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') { p->pos++; continue; }
        if (p->pos < p->len && p->s[p->pos] == ']') { p->pos++; strbuf_put(&p->out, "]", 1); return 0; }
        return fail_at(p, "expected ',' or ']'");
    }
}

static int parse_literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n)) return fail_at(p, "unexpected character");
    p->pos += n;
    strbuf_put(&p->out, word, n);
    return 0;
}

static int parse_value(parser *p, int depth) {
    if (depth > MAX_DEPTH) return fail_at(p, "nesting too deep");
    skip_ws(p);
    if (p->pos >= p->len) return fail_at(p, "unexpected end of input");
    switch (p->s[p->pos]) {
    case '{': return parse_object(p, depth);
    case '[': return parse_array(p, depth);
    case '"': return parse_string(p, NULL, 1);
    case 't': return parse_literal(p, "true");
    case 'f': return parse_literal(p, "false");
    case 'n': return parse_literal(p, "null");
    default: return parse_number(p);
    }
}

int grammar_json_canon(const char *text, size_t len, char **out, size_t *out_len) {
    if (!text || !out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "json: NULL argument");
    parser p = {text, len, 0, {0}, NULL};
    int rc = parse_value(&p, 0);
    if (!rc) {
        skip_ws(&p);
        if (p.pos != len) rc = fail_at(&p, "trailing characters after the JSON value");
    }
    if (!rc && p.out.oom) {
        free(p.out.data);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "json: out of memory");
    }
    if (rc) {
        free(p.out.data);
        return needle_fail(NEEDLE_ERR_JSON, "malformed JSON at byte %zu: %s", p.pos, p.error);
    }
    *out = p.out.data;
    *out_len = p.out.len;
    return NEEDLE_OK;
}
