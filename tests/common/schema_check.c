/* schema_check.c: see schema_check.h. */
#include "schema_check.h"

#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ctx {
    const cJSON *root;
    char *why;
    size_t why_len;
    int quiet; /* inside "not" or an alternative: failures are not the reason */
    int depth;
} ctx;

static int bad(ctx *c, const char *fmt, ...) {
    if (!c->quiet && c->why && !c->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->why, c->why_len, fmt, ap);
        va_end(ap);
    }
    return 0;
}

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static int same(const cJSON *a, const cJSON *b) {
    if (cJSON_IsNumber(a) || cJSON_IsNumber(b)) return cJSON_IsNumber(a) && cJSON_IsNumber(b) && a->valuedouble == b->valuedouble;
    if ((a->type & 0xFF) != (b->type & 0xFF)) return 0;
    if (cJSON_IsString(a)) return strcmp(a->valuestring, b->valuestring) == 0;
    if (cJSON_IsArray(a)) {
        const cJSON *x = a->child, *y = b->child;
        while (x && y && same(x, y)) x = x->next, y = y->next;
        return !x && !y;
    }
    if (cJSON_IsObject(a)) {
        int na = 0, nb = 0;
        for (const cJSON *x = a->child; x; x = x->next, na++) {
            const cJSON *y = get(b, x->string);
            if (!y || !same(x, y)) return 0;
        }
        for (const cJSON *y = b->child; y; y = y->next) nb++;
        return na == nb;
    }
    return 1; /* true, false, null of the same type */
}

static long utf8_length(const char *s) {
    long n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if ((*p & 0xC0) != 0x80) n++;
    return n;
}

/* ---- formats ----------------------------------------------------------------------- */

static int digits(const char *s, int n) {
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

static int num(const char *s, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) v = v * 10 + (s[i] - '0');
    return v;
}

static int is_date(const char *s) {
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (strlen(s) < 10 || !digits(s, 4) || s[4] != '-' || !digits(s + 5, 2) || s[7] != '-' || !digits(s + 8, 2)) return 0;
    int y = num(s, 4), m = num(s + 5, 2), d = num(s + 8, 2);
    if (m < 1 || m > 12 || d < 1 || d > mdays[m - 1]) return 0;
    if (m == 2 && d == 29 && !(y % 4 == 0 && (y % 100 != 0 || y % 400 == 0))) return 0;
    return 1;
}

/* RFC 3339 full-time: hh:mm:ss(.frac)?(Z|+hh:mm|-hh:mm); *end past it. */
static int is_time(const char *s) {
    if (!digits(s, 2) || s[2] != ':' || !digits(s + 3, 2) || s[5] != ':' || !digits(s + 6, 2)) return 0;
    if (num(s, 2) > 23 || num(s + 3, 2) > 59 || num(s + 6, 2) > 60) return 0;
    const char *p = s + 8;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9') return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p == 'Z' || *p == 'z') return p[1] == 0;
    if (*p != '+' && *p != '-') return 0;
    p++;
    return digits(p, 2) && p[2] == ':' && digits(p + 3, 2) && num(p, 2) <= 23 && num(p + 3, 2) <= 59 && p[5] == 0;
}

static int is_ipv4(const char *s) {
    for (int part = 0; part < 4; part++) {
        int n = 0, v = 0;
        while (s[n] >= '0' && s[n] <= '9' && n < 4) v = v * 10 + (s[n] - '0'), n++;
        if (n == 0 || n > 3 || v > 255 || (n > 1 && s[0] == '0')) return 0;
        s += n;
        if (part < 3 && *s++ != '.') return 0;
    }
    return *s == 0;
}

static int is_uuid(const char *s) {
    static const int dash[] = {8, 13, 18, 23};
    if (strlen(s) != 36) return 0;
    for (int i = 0, k = 0; i < 36; i++) {
        if (k < 4 && i == dash[k]) {
            if (s[i] != '-') return 0;
            k++;
        } else if (!strchr("0123456789abcdefABCDEF", s[i]) || !s[i]) {
            return 0;
        }
    }
    return 1;
}

static int is_email(const char *s) {
    const char *at = strchr(s, '@');
    return at && at != s && at[1] && !strchr(at + 1, '@');
}

static int format_ok(const char *f, const char *s) {
    if (!strcmp(f, "date")) return strlen(s) == 10 && is_date(s);
    if (!strcmp(f, "time")) return is_time(s);
    if (!strcmp(f, "date-time")) return is_date(s) && (s[10] == 'T' || s[10] == 't') && is_time(s + 11);
    if (!strcmp(f, "ipv4")) return is_ipv4(s);
    if (!strcmp(f, "uuid")) return is_uuid(s);
    if (!strcmp(f, "email")) return is_email(s);
    return 1;
}

/* ---- pattern: ECMA-262 classes rewritten for POSIX ERE ------------------------------- */

#define ECMA_SPACE "\t\n\v\f\r \xc2\xa0\xe1\x9a\x80\xe2\x80\x80\xe2\x80\x81\xe2\x80\x82\xe2\x80\x83" \
                   "\xe2\x80\x84\xe2\x80\x85\xe2\x80\x86\xe2\x80\x87\xe2\x80\x88\xe2\x80\x89\xe2\x80\x8a" \
                   "\xe2\x80\xa8\xe2\x80\xa9\xe2\x80\xaf\xe2\x81\x9f\xe3\x80\x80\xef\xbb\xbf"

static int pattern_ok(const char *pat, const char *s, int *err) {
    size_t n = strlen(pat), o = 0;
    char *ere = malloc(n * 16 + 1);
    if (!ere) return *err = 1, 0;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = pat[i];
        if (ch == '\\' && i + 1 < n) {
            char e = pat[++i];
            const char *rep = NULL;
            switch (e) {
            case 'd': rep = in_class ? "0-9" : "[0-9]"; break;
            case 'w': rep = in_class ? "A-Za-z0-9_" : "[A-Za-z0-9_]"; break;
            /* ECMA-262 white space and line terminators, as UTF-8 */
            case 's': rep = in_class ? ECMA_SPACE : "[" ECMA_SPACE "]"; break;
            case 'D': rep = "[^0-9]"; break;
            case 'W': rep = "[^A-Za-z0-9_]"; break;
            default: break;
            }
            if (rep) {
                o += (size_t)sprintf(ere + o, "%s", rep);
            } else if (in_class) {
                ere[o++] = e; /* an escaped class member stands for itself */
            } else if (strchr(".[]{}()*+?|^$\\/", e)) {
                if (e != '/') ere[o++] = '\\';
                ere[o++] = e;
            } else {
                ere[o++] = e;
            }
            continue;
        }
        if (!in_class && ch == '(' && i + 2 < n && pat[i + 1] == '?' && pat[i + 2] == ':') {
            ere[o++] = '(';
            i += 2;
            continue;
        }
        if (ch == '[' && !in_class) in_class = 1;
        else if (ch == ']' && in_class) in_class = 0;
        ere[o++] = ch;
    }
    ere[o] = 0;
    regex_t re;
    if (regcomp(&re, ere, REG_EXTENDED | REG_NOSUB)) {
        free(ere);
        return *err = 1, 0;
    }
    int ok = regexec(&re, s, 0, NULL, 0) == 0;
    regfree(&re);
    free(ere);
    return ok;
}

/* ---- validation -------------------------------------------------------------------- */

static int valid(ctx *c, const cJSON *s, const cJSON *v, const char *at);

static int integral(const cJSON *v) { return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble); }

static int type_is(const cJSON *v, const char *t) {
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return integral(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    return 0;
}

static const cJSON *resolve(const ctx *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *at = c->root;
    char seg[256];
    const char *p = ref + 1;
    while (at && *p == '/') {
        size_t k = 0;
        for (p++; *p && *p != '/' && k + 1 < sizeof seg; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) seg[k++] = *++p == '0' ? '~' : '/';
            else seg[k++] = *p;
        }
        seg[k] = 0;
        at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(seg)) : get(at, seg);
    }
    return at;
}

static int numeric(ctx *c, const cJSON *s, double x, const char *at) {
    const cJSON *k;
    const cJSON *xmin = get(s, "exclusiveMinimum"), *xmax = get(s, "exclusiveMaximum");
    if ((k = get(s, "minimum"))) {
        if (cJSON_IsTrue(xmin) ? !(x > k->valuedouble) : !(x >= k->valuedouble))
            return bad(c, "%s: %.17g below minimum %.17g", at, x, k->valuedouble);
    }
    if ((k = get(s, "maximum"))) {
        if (cJSON_IsTrue(xmax) ? !(x < k->valuedouble) : !(x <= k->valuedouble))
            return bad(c, "%s: %.17g above maximum %.17g", at, x, k->valuedouble);
    }
    if (cJSON_IsNumber(xmin) && !(x > xmin->valuedouble)) return bad(c, "%s: %.17g <= exclusiveMinimum", at, x);
    if (cJSON_IsNumber(xmax) && !(x < xmax->valuedouble)) return bad(c, "%s: %.17g >= exclusiveMaximum", at, x);
    if ((k = get(s, "multipleOf"))) {
        double q = x / k->valuedouble;
        if (fabs(q - nearbyint(q)) > 1e-9 * fmax(1, fabs(q)))
            return bad(c, "%s: %.17g not a multiple of %.17g", at, x, k->valuedouble);
    }
    return 1;
}

static int textual(ctx *c, const cJSON *s, const char *str, const char *at) {
    const cJSON *k;
    long n = utf8_length(str);
    if ((k = get(s, "minLength")) && n < (long)k->valuedouble) return bad(c, "%s: length %ld < minLength", at, n);
    if ((k = get(s, "maxLength")) && n > (long)k->valuedouble) return bad(c, "%s: length %ld > maxLength", at, n);
    if ((k = get(s, "pattern")) && cJSON_IsString(k)) {
        int err = 0;
        if (!pattern_ok(k->valuestring, str, &err))
            return bad(c, "%s: \"%.40s\" %s pattern %s", at, str, err ? "(unreadable)" : "does not match", k->valuestring);
    }
    if ((k = get(s, "format")) && cJSON_IsString(k) && !format_ok(k->valuestring, str))
        return bad(c, "%s: \"%.40s\" is not a %s", at, str, k->valuestring);
    return 1;
}

static int listy(ctx *c, const cJSON *s, const cJSON *v, const char *at) {
    const cJSON *k;
    int n = cJSON_GetArraySize(v), i = 0;
    char sub[300];
    if ((k = get(s, "minItems")) && n < (int)k->valuedouble) return bad(c, "%s: %d items < minItems", at, n);
    if ((k = get(s, "maxItems")) && n > (int)k->valuedouble) return bad(c, "%s: %d items > maxItems", at, n);
    const cJSON *items = get(s, "items");
    for (const cJSON *x = v->child; x; x = x->next, i++) {
        snprintf(sub, sizeof sub, "%s[%d]", at, i);
        if (items && !cJSON_IsArray(items) && !valid(c, items, x, sub)) return 0;
        if (cJSON_IsTrue(get(s, "uniqueItems")))
            for (const cJSON *y = v->child; y != x; y = y->next)
                if (same(x, y)) return bad(c, "%s: repeats an earlier item (uniqueItems)", sub);
    }
    return 1;
}

static int objecty(ctx *c, const cJSON *s, const cJSON *v, const char *at) {
    const cJSON *props = get(s, "properties"), *more = get(s, "additionalProperties"), *k;
    int n = 0;
    char sub[300];
    for (const cJSON *x = v->child; x; x = x->next) {
        n++;
        snprintf(sub, sizeof sub, "%s.%s", at, x->string);
        if (props || more)
            for (const cJSON *y = v->child; y != x; y = y->next)
                if (!strcmp(x->string, y->string)) return bad(c, "%s: key repeated", sub);
        const cJSON *ps = props ? get(props, x->string) : NULL;
        if (ps) {
            if (!valid(c, ps, x, sub)) return 0;
        } else if (cJSON_IsFalse(more)) {
            return bad(c, "%s: not a declared property (additionalProperties false)", sub);
        } else if (cJSON_IsObject(more) && !valid(c, more, x, sub)) {
            return 0;
        }
    }
    for (const cJSON *r = (k = get(s, "required")) ? k->child : NULL; r; r = r->next)
        if (!get(v, r->valuestring)) return bad(c, "%s: required '%s' missing", at, r->valuestring);
    for (const cJSON *d = (k = get(s, "dependentRequired")) ? k->child : NULL; d; d = d->next)
        if (get(v, d->string))
            for (const cJSON *r = d->child; r; r = r->next)
                if (!get(v, r->valuestring)) return bad(c, "%s: '%s' needs '%s'", at, d->string, r->valuestring);
    if ((k = get(s, "minProperties")) && n < (int)k->valuedouble) return bad(c, "%s: too few members", at);
    if ((k = get(s, "maxProperties")) && n > (int)k->valuedouble) return bad(c, "%s: too many members", at);
    return 1;
}

static int valid(ctx *c, const cJSON *s, const cJSON *v, const char *at) {
    if (cJSON_IsBool(s)) return cJSON_IsTrue(s) ? 1 : bad(c, "%s: schema false", at);
    if (!cJSON_IsObject(s)) return bad(c, "%s: schema is not an object", at);
    if (++c->depth > 200) return bad(c, "%s: $ref loop", at);
    int ok = 1;
    const cJSON *k;
    if ((k = get(s, "$ref")) && cJSON_IsString(k)) {
        const cJSON *t = resolve(c, k->valuestring);
        ok = t ? valid(c, t, v, at) : bad(c, "%s: $ref %s unresolved", at, k->valuestring);
    }
    if (ok && (k = get(s, "type"))) {
        int hit = cJSON_IsNull(v) && cJSON_IsTrue(get(s, "nullable"));
        if (cJSON_IsString(k)) hit |= type_is(v, k->valuestring);
        for (const cJSON *t = cJSON_IsArray(k) ? k->child : NULL; t; t = t->next) hit |= type_is(v, t->valuestring);
        if (!hit) ok = bad(c, "%s: wrong type", at);
    }
    if (ok && (k = get(s, "enum"))) {
        int hit = 0;
        for (const cJSON *e = k->child; e && !hit; e = e->next) hit = same(e, v);
        if (!hit) ok = bad(c, "%s: not in enum", at);
    }
    if (ok && (k = get(s, "const")) && !same(k, v)) ok = bad(c, "%s: not the const", at);
    if (ok && cJSON_IsNumber(v)) ok = numeric(c, s, v->valuedouble, at);
    if (ok && cJSON_IsString(v)) ok = textual(c, s, v->valuestring, at);
    if (ok && cJSON_IsArray(v)) ok = listy(c, s, v, at);
    if (ok && cJSON_IsObject(v)) ok = objecty(c, s, v, at);
    if (ok && (k = get(s, "allOf")))
        for (const cJSON *x = k->child; x && ok; x = x->next) ok = valid(c, x, v, at);
    if (ok && ((k = get(s, "anyOf")) || (k = get(s, "oneOf")))) {
        int hits = 0, quiet = c->quiet;
        c->quiet = 1;
        for (const cJSON *x = k->child; x; x = x->next) hits += valid(c, x, v, at);
        c->quiet = quiet;
        if (!strcmp(k->string, "anyOf") ? hits == 0 : hits != 1)
            ok = bad(c, "%s: %d alternatives of %s match", at, hits, k->string);
        if (ok && k == get(s, "anyOf") && (k = get(s, "oneOf"))) { /* both present */
            hits = 0;
            c->quiet = 1;
            for (const cJSON *x = k->child; x; x = x->next) hits += valid(c, x, v, at);
            c->quiet = quiet;
            if (hits != 1) ok = bad(c, "%s: %d alternatives of oneOf match", at, hits);
        }
    }
    if (ok && (k = get(s, "not"))) {
        int quiet = c->quiet;
        c->quiet = 1;
        int hit = valid(c, k, v, at);
        c->quiet = quiet;
        if (hit) ok = bad(c, "%s: matches the schema under not", at);
    }
    c->depth--;
    return ok;
}

int schema_check(const cJSON *root, const cJSON *schema, const cJSON *value, char *why, size_t why_len) {
    ctx c = {root, why, why_len, 0, 0};
    if (why && why_len) why[0] = 0;
    return valid(&c, schema, value, "$");
}
