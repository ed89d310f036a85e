/* compiler_scalar.c: strings, numbers and enum/const literals of the schema compiler.
 *
 * Literals are matched on their spelling, so each value is written the way Python's
 * json.dumps(separators=(",", ":")) writes it. Strings get two spellings, raw UTF-8
 * (ensure_ascii=False, what cactus-needle 2.0.15 trains on) and \u-escaped
 * (ensure_ascii=True, older releases); integral numbers get "1" and "1.0", because cJSON
 * no longer knows whether the tools JSON said int or float. Spellings of one value share
 * a member id, so uniqueItems counts values, not spellings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_canon.h"
#include "grammar/compiler.h"
#include "util/json_escape.h"
#include "util/strbuf.h"

/* Strings reaching the compiler were validated as UTF-8 by grammar_json_canon. */
static void sb_json_string(strbuf *o, const char *s, int ascii) {
    util_json_put_string(o, s, strlen(s), ascii);
}

static int integral(double v) { return v == floor(v) && fabs(v) < 1e16; }

static void sb_number(strbuf *o, double v, int float_form) {
    char t[48];
    if (!float_form && integral(v)) snprintf(t, sizeof t, "%.0f", v == 0 ? 0.0 : v);
    else gram_python_float(v, t);
    strbuf_puts(o, t);
}

/* Compact spelling of any value (nested strings raw, nested integral numbers as ints). */
static void sb_value(strbuf *o, const cJSON *v) {
    if (cJSON_IsString(v)) sb_json_string(o, v->valuestring, 0);
    else if (cJSON_IsNumber(v)) sb_number(o, v->valuedouble, 0);
    else if (cJSON_IsTrue(v)) strbuf_puts(o, "true");
    else if (cJSON_IsFalse(v)) strbuf_puts(o, "false");
    else if (cJSON_IsNull(v)) strbuf_puts(o, "null");
    else {
        int obj = cJSON_IsObject(v);
        strbuf_put(o, obj ? "{" : "[", 1);
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) strbuf_put(o, ",", 1);
            if (obj) {
                sb_json_string(o, c->string, 0);
                strbuf_put(o, ":", 1);
            }
            sb_value(o, c);
        }
        strbuf_put(o, obj ? "}" : "]", 1);
    }
}

long gram_spell_string(gram_builder *b, const char *s, int ascii) {
    strbuf o = {0};
    sb_json_string(&o, s, ascii);
    long n = o.oom || gram_push_lit(b, (const uint8_t *)o.data, o.len, 0) ? -1 : (long)o.len;
    free(o.data);
    return n;
}

/* Sorts the entries pushed since `first`, drops repeated spellings (keeping the earliest
 * member) and makes a literal node of them. */
static int finish_literal(gram_builder *b, uint32_t first, uint32_t *node) {
    grammar *g = b->g;
    uint32_t n = g->n_lits - first, m = 0;
    gram_sort_lits(g, first, n);
    gram_lit *v = g->lits + first;
    for (uint32_t i = 0; i < n; i++) {
        if (m && v[i].len == v[m - 1].len &&
            !memcmp(g->lit_bytes + v[i].off, g->lit_bytes + v[m - 1].off, v[i].len)) {
            if (v[i].member < v[m - 1].member) v[m - 1].member = v[i].member;
            continue;
        }
        v[m++] = v[i];
    }
    g->n_lits = first + m;
    uint32_t members = 0;
    for (uint32_t i = 0; i < m; i++) { /* distinct member ids */
        uint32_t j = 0;
        while (j < i && v[j].member != v[i].member) j++;
        members += j == i;
    }
    uint32_t id = gram_new_node(b, GRAM_NODE_LITERAL);
    if (id == GRAM_NONE) return gram_oom(b);
    g->nodes[id].u.lit.first = first;
    g->nodes[id].u.lit.count = m;
    g->nodes[id].u.lit.n_members = members;
    *node = id;
    return 0;
}

int gram_build_fixed_literal(gram_builder *b, const char *const *words, uint32_t n, uint32_t *node) {
    uint32_t first = b->g->n_lits;
    for (uint32_t i = 0; i < n; i++)
        if (gram_push_lit(b, (const uint8_t *)words[i], strlen(words[i]), i)) return gram_oom(b);
    return finish_literal(b, first, node);
}

/* Compact spelling of v for messages, cut to fit. */
static void brief_value(const cJSON *v, char *out, size_t cap) {
    strbuf o = {0};
    sb_value(&o, v);
    snprintf(out, cap, "%.*s%s", o.len > 60 ? 60 : (int)o.len, o.data ? o.data : "", o.len > 60 ? "..." : "");
    free(o.data);
}

int gram_build_literal(gram_builder *b, const cJSON *s, uint32_t *node) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (e && !cJSON_IsArray(e)) return gram_fail(b, "enum must be an array");
    if (!c && !cJSON_GetArraySize(e)) return gram_fail(b, "enum must not be empty");
    uint32_t first = b->g->n_lits, member = 0, dropped = 0;
    char why[200] = "", first_why[200] = "", first_value[80] = "";
    const cJSON *v = c ? c : e->child; /* a const is checked against the enum beside it */
    for (; v; v = c ? NULL : v->next) {
        /* every other keyword of s must hold for the value too: a value that breaks one
         * is dropped (compiler_enum.c) */
        int ok = gram_value_admits(b, s, v, c ? "const" : "enum", why, sizeof why);
        if (ok < 0) return ok;
        if (!ok) {
            if (!dropped++) {
                snprintf(first_why, sizeof first_why, "%s", why);
                brief_value(v, first_value, sizeof first_value);
            }
            continue;
        }
        for (int variant = 0; variant < 2; variant++) {
            strbuf o = {0};
            if (cJSON_IsString(v)) sb_json_string(&o, v->valuestring, variant);
            else if (cJSON_IsNumber(v)) sb_number(&o, v->valuedouble, variant);
            else if (!variant) sb_value(&o, v);
            int rc = o.oom || (o.len && gram_push_lit(b, (const uint8_t *)o.data, o.len, member));
            free(o.data);
            if (rc) return gram_oom(b);
        }
        member++;
    }
    if (!member) {
        if (c) return gram_fail(b, "const %s conflicts with the other keywords: %s", first_value, first_why);
        return gram_fail(b, "no enum value satisfies the other keywords (%u dropped; %s: %s)", dropped, first_value,
                         first_why);
    }
    return finish_literal(b, first, node);
}

/* ---- strings ----------------------------------------------------------------------------- */

static int add_dfa(gram_builder *b, gram_dfa *d, int32_t *index) {
    grammar *g = b->g;
    if (g->n_dfas == b->cap_dfas) {
        uint32_t cap = b->cap_dfas ? 2 * b->cap_dfas : 8;
        gram_dfa *p = realloc(g->dfas, cap * sizeof *p);
        if (!p) return -1;
        g->dfas = p;
        b->cap_dfas = cap;
    }
    g->dfas[g->n_dfas] = *d;
    *index = (int32_t)g->n_dfas++;
    return 0;
}

static int add_table(gram_builder *b, uint32_t *next, uint32_t k, int32_t *index) {
    grammar *g = b->g;
    if (g->n_tables == b->cap_tables) {
        uint32_t cap = b->cap_tables ? 2 * b->cap_tables : 8;
        gram_len_table *p = realloc(g->tables, cap * sizeof *p);
        if (!p) return -1;
        g->tables = p;
        b->cap_tables = cap;
    }
    g->tables[g->n_tables].next = next;
    g->tables[g->n_tables].k = k;
    *index = (int32_t)g->n_tables++;
    return 0;
}

int gram_build_string(gram_builder *b, const cJSON *s, int ctx, uint32_t *node) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    uint32_t min = 0, max = UINT32_MAX;
    int rc;
    char err[200];
    if ((rc = gram_get_count(b, s, "minLength", &min)) || (rc = gram_get_count(b, s, "maxLength", &max))) return rc;
    if (min > max) return gram_fail(b, "minLength (%u) > maxLength (%u)", min, max);
    if (pat && !cJSON_IsString(pat)) return gram_fail(b, "pattern must be a string");
    if (fmt && !cJSON_IsString(fmt)) return gram_fail(b, "format must be a string");
    gram_dfa dfa;
    int has_dfa = 0;
    if (pat) {
        rc = gram_regex_compile(pat->valuestring, strlen(pat->valuestring), &dfa, err, sizeof err);
        if (rc == -2) return gram_oom(b);
        if (rc) return gram_fail(b, "pattern \"%.80s\": %s", pat->valuestring, err);
        has_dfa = 1;
    }
    if (fmt) {
        gram_dfa f;
        rc = gram_regex_compile_format(fmt->valuestring, &f, err, sizeof err);
        if (rc == -2) {
            if (has_dfa) gram_regex_free(&dfa);
            return gram_oom(b);
        }
        if (rc == 0) {
            if (has_dfa) {
                gram_regex_free(&dfa);
                gram_regex_free(&f);
                return gram_fail(b, "pattern together with format is not supported");
            }
            dfa = f;
            has_dfa = 1;
        } /* rc == 1: unknown format, an annotation */
    }
    if ((ctx & GRAM_CTX_UNIQUE_ITEM) && (has_dfa || max != UINT32_MAX)) {
        if (has_dfa) gram_regex_free(&dfa);
        return gram_fail(b, "uniqueItems is only supported for strings without maxLength, pattern or format");
    }
    int32_t di = -1, ti = -1;
    if (has_dfa) {
        if (add_dfa(b, &dfa, &di)) {
            gram_regex_free(&dfa);
            return gram_oom(b);
        }
        if (min > 0 || max != UINT32_MAX) {
            uint32_t *next, k;
            rc = gram_regex_length_table(&b->g->dfas[di], min, max, &next, &k, err, sizeof err);
            if (rc == -2) return gram_oom(b);
            if (rc) return gram_fail(b, "%s", err);
            if (add_table(b, next, k, &ti)) {
                free(next);
                return gram_oom(b);
            }
            uint32_t r = next[min <= k ? min : k];
            if (r == UINT32_MAX || (max != UINT32_MAX && r > max))
                return gram_fail(b, "no string matches the %s within minLength %u / maxLength %u",
                             pat ? "pattern" : "format", min, max);
        }
    }
    uint32_t id = gram_new_node(b, GRAM_NODE_STRING);
    if (id == GRAM_NONE) return gram_oom(b);
    gram_node *n = &b->g->nodes[id];
    n->u.str.dfa = di;
    n->u.str.table = ti;
    n->u.str.min_len = min;
    n->u.str.max_len = max;
    *node = id;
    return 0;
}

/* ---- numbers ----------------------------------------------------------------------------- */

void gram_unbounded_number(gram_builder *b, uint32_t id) {
    gram_node *n = &b->g->nodes[id];
    n->u.num.mode = GRAM_NUM_EXACT;
    n->u.num.lo = (gram_fx){-GRAM_JSON_SAFE_INT, 0};
    n->u.num.hi = (gram_fx){GRAM_JSON_SAFE_INT, 0};
    n->u.num.digits = GRAM_NUM_DIGIT_BUDGET;
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

typedef struct bound { double v; int lower; } bound; /* inclusive */

static int collect_bounds(gram_builder *b, const cJSON *s, bound *out, int *n) {
    static const char *const names[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    const cJSON *x[4];
    for (int i = 0; i < 4; i++) x[i] = cJSON_GetObjectItemCaseSensitive(s, names[i]);
    *n = 0;
    for (int i = 0; i < 4; i++) {
        if (!x[i]) continue;
        if (i >= 2 && cJSON_IsBool(x[i])) continue; /* draft 4: modifies minimum/maximum */
        if (!cJSON_IsNumber(x[i])) return gram_fail(b, "%s must be a number", names[i]);
        out[*n].v = x[i]->valuedouble;
        out[*n].lower = i % 2 == 0;
        if (i >= 2 || cJSON_IsTrue(x[i + 2])) {
            /* Consumers read the value as a double, so "> b" must hold for the double: a
             * decimal just above b that rounds to b would pass an exact test and fail the
             * tool's. x > b for doubles is x >= nextafter(b), an inclusive bound. */
            out[*n].v = nextafter(out[*n].v, out[*n].lower ? HUGE_VAL : -HUGE_VAL);
        }
        (*n)++;
    }
    return 0;
}

int gram_build_number(gram_builder *b, const cJSON *s, int integer, int ctx, uint32_t *node) {
    bound bd[4];
    int nb, rc;
    if ((rc = collect_bounds(b, s, bd, &nb))) return rc;
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(s, "multipleOf");
    int64_t step = 1;
    int scale = 0;
    if (mo && (!cJSON_IsNumber(mo) || gram_dec_multiple_of(mo->valuedouble, &step, &scale)))
        return gram_fail(b, "multipleOf must be a positive number with at most 9 decimal places");
    uint32_t id = gram_new_node(b, GRAM_NODE_NUMBER);
    if (id == GRAM_NONE) return gram_oom(b);
    gram_node *n = &b->g->nodes[id];
    *node = id;
    /* Items of a unique array keep to 15 significant digits (DBL_DIG): distinct decimals
     * of that size stay distinct doubles, so the tool sees distinct values too. A plain
     * number there becomes a multiple of 1e-6 below 1e9. */
    int unique = (ctx & (GRAM_CTX_UNIQUE_ITEM | GRAM_CTX_HASHED)) != 0, digits = unique ? 15 : 18;
    if (unique && !integer && !mo) scale = 6;
    if (integer || mo || unique) {
        if (integer && scale) { /* integers that are multiples of k / 10^s */
            step /= gcd64(step, (int64_t)gram_dec_pow10(scale));
            scale = 0;
        }
        if (scale > digits - 1) return gram_fail(b, "multipleOf needs too many decimal places for uniqueItems");
        int64_t top = (int64_t)gram_dec_pow10(digits) - 1, lo = -top, hi = top;
        for (int i = 0; i < nb; i++) {
            gram_fx x;
            int exact;
            gram_fx_from_double(bd[i].v, bd[i].lower, &x, &exact); /* ceil a minimum, floor a maximum */
            int64_t t = gram_fx_scaled(x, scale, bd[i].lower);
            if (bd[i].lower && t > lo) lo = t;
            if (!bd[i].lower && t < hi) hi = t;
        }
        /* the JSON-safe range: what every consumer holds exactly as a double */
        if (scale <= 2) { /* larger scales: 18 digits are below 2^53 * 10^scale already */
            const int64_t safe = GRAM_JSON_SAFE_INT * (int64_t)gram_dec_pow10(scale);
            if (lo < -safe) lo = -safe;
            if (hi > safe) hi = safe;
        }
        n->u.num.mode = GRAM_NUM_SCALED;
        n->u.num.scale = (uint8_t)scale;
        n->u.num.digits = (uint8_t)digits;
        n->u.num.allow_frac = !integer;
        n->u.num.step = step;
        n->u.num.slo = lo;
        n->u.num.shi = hi;
        if (!gram_node_domain(b, id))
            return gram_fail(b, "no %s satisfies minimum/maximum/multipleOf", integer ? "integer" : "number");
        return 0;
    }
    if (!nb) {
        gram_unbounded_number(b, id);
        return 0;
    }
    gram_fx lo = {-GRAM_JSON_SAFE_INT, 0}, hi = {GRAM_JSON_SAFE_INT, 0}; /* the JSON-safe range */
    for (int i = 0; i < nb; i++) {
        gram_fx x;
        int exact, r = gram_fx_from_double(bd[i].v, bd[i].lower, &x, &exact);
        if (bd[i].lower) {
            if (r > 0) return gram_fail(b, "lower bound %g is beyond the supported range (|x| < 1e18)", bd[i].v);
            if (gram_fx_cmp(x, lo) > 0) lo = x;
        } else {
            if (r < 0) return gram_fail(b, "upper bound %g is beyond the supported range (|x| < 1e18)", bd[i].v);
            if (gram_fx_cmp(x, hi) < 0) hi = x;
        }
    }
    if (gram_fx_cmp(lo, hi) > 0)
        return gram_fail(b, "no number satisfies minimum/maximum within the JSON-safe range |x| <= 2^53");
    n->u.num.mode = GRAM_NUM_EXACT;
    n->u.num.lo = lo;
    n->u.num.hi = hi;
    return 0;
}
