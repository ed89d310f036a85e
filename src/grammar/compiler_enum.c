/* compiler_enum.c: which enum/const values the rest of their schema admits.
 *
 * An enum or const is matched on its spellings (compiler_scalar.c), so everything else in
 * the schema would be lost unless each value is checked against it here: a value that
 * violates a sibling keyword ("type": "string" beside "const": 5, "maximum": 10 beside
 * "enum": [1, 50]) is dropped, and a schema left without values is refused with the value
 * and the keyword it breaks. Because the values are the whole domain, keywords the grammar
 * cannot generate from (allOf, not, dependentRequired, minProperties, ...) are fine here:
 * they only need checking. Keywords neither generated nor checked are refused, as
 * elsewhere.
 *
 * This is JSON Schema's validation of one value, for the keywords listed in
 * gram_value_admits; "pattern" is read as the grammar reads it everywhere (a full match,
 * stricter than the standard's search), so an admitted value is valid either way. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "grammar/compiler.h"
#include "needle.h"
#include "util/utf8.h"

enum { CHECK_MAX_DEPTH = 64 };

typedef struct check {
    gram_builder *b;
    char *why;
    size_t why_len;
    int depth;
} check;

static const cJSON *kw(const cJSON *s, const char *name) { return cJSON_GetObjectItemCaseSensitive(s, name); }

/* Records the first reason a value fails (later ones come from inner alternatives). */
static int reject(check *c, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int reject(check *c, const char *fmt, ...) {
    if (c->why && !c->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->why, c->why_len, fmt, ap);
        va_end(ap);
    }
    return 0;
}

static int json_equal(const cJSON *x, const cJSON *y) {
    if (cJSON_IsNumber(x) && cJSON_IsNumber(y)) return x->valuedouble == y->valuedouble;
    if (cJSON_IsString(x) && cJSON_IsString(y)) return !strcmp(x->valuestring, y->valuestring);
    if (cJSON_IsBool(x) && cJSON_IsBool(y)) return cJSON_IsTrue(x) == cJSON_IsTrue(y);
    if (cJSON_IsNull(x) && cJSON_IsNull(y)) return 1;
    if (cJSON_IsArray(x) && cJSON_IsArray(y)) {
        const cJSON *a = x->child, *b = y->child;
        for (; a && b; a = a->next, b = b->next)
            if (!json_equal(a, b)) return 0;
        return !a && !b;
    }
    if (cJSON_IsObject(x) && cJSON_IsObject(y)) {
        if (cJSON_GetArraySize(x) != cJSON_GetArraySize(y)) return 0;
        for (const cJSON *a = x->child; a; a = a->next) {
            const cJSON *b = kw(y, a->string);
            if (!b || !json_equal(a, b)) return 0;
        }
        return 1;
    }
    return 0;
}

static int is_integer(const cJSON *v) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
}

static int has_type(const cJSON *v, const char *t) {
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return is_integer(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    return -1;
}

static size_t code_points(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((uint8_t)*s & 0xC0) != 0x80;
    return n;
}

/* Full match of s against a compiled DFA (UTF-8 validated upstream). */
static int dfa_matches(const gram_dfa *d, const char *s) {
    const uint8_t *p = (const uint8_t *)s;
    size_t n = strlen(s);
    int32_t st = 0;
    while (n) {
        uint32_t cp;
        int k = util_utf8_next(p, n, &cp, NULL);
        if (k <= 0) return 0;
        st = d->trans[(size_t)st * d->n_classes + gram_regex_class(d, cp)];
        if (st < 0) return 0;
        p += k;
        n -= (size_t)k;
    }
    return d->accept[st];
}

static int schema_admits(check *c, const cJSON *s, const cJSON *v, const char *skip);

static int check_number(check *c, const cJSON *s, const cJSON *v) {
    static const char *const names[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    const double x = v->valuedouble;
    for (int i = 0; i < 4; i++) {
        const cJSON *k = kw(s, names[i]);
        if (!k || (i >= 2 && cJSON_IsBool(k))) continue;
        if (!cJSON_IsNumber(k)) return gram_fail(c->b, "%s must be a number", names[i]);
        const double bnd = k->valuedouble;
        int excl = i >= 2 || cJSON_IsTrue(kw(s, names[i + 2])); /* draft 4's boolean form */
        int lower = i % 2 == 0;
        int ok = lower ? (excl ? x > bnd : x >= bnd) : (excl ? x < bnd : x <= bnd);
        if (!ok) return reject(c, "it is %s %s %.17g", excl ? (lower ? "not above" : "not below") : (lower ? "below" : "above"),
                          names[i], bnd);
    }
    const cJSON *m = kw(s, "multipleOf");
    if (m) {
        int64_t step;
        int scale;
        if (!cJSON_IsNumber(m) || gram_dec_multiple_of(m->valuedouble, &step, &scale))
            return gram_fail(c->b, "multipleOf must be a positive number with at most 9 decimal places");
        const double y = x * (double)gram_dec_pow10(scale), r = nearbyint(y);
        if (fabs(y - r) > 1e-9 * fmax(1.0, fabs(y)) || fabs(r) > 9e15 || fmod(r, (double)step) != 0)
            return reject(c, "%s", "it is not a multiple of multipleOf");
    }
    return 1;
}

static int check_string(check *c, const cJSON *s, const cJSON *v) {
    uint32_t min = 0, max = UINT32_MAX;
    int rc;
    if ((rc = gram_get_count(c->b, s, "minLength", &min)) || (rc = gram_get_count(c->b, s, "maxLength", &max))) return rc;
    const size_t n = code_points(v->valuestring);
    if (n < min) return reject(c, "it is shorter than minLength %u", min);
    if (n > max) return reject(c, "it is longer than maxLength %u", max);
    static const char *const dfa_kws[] = {"pattern", "format"};
    for (int i = 0; i < 2; i++) {
        const cJSON *k = kw(s, dfa_kws[i]);
        if (!k) continue;
        if (!cJSON_IsString(k)) return gram_fail(c->b, "%s must be a string", dfa_kws[i]);
        gram_dfa d;
        char err[200];
        rc = i ? gram_regex_compile_format(k->valuestring, &d, err, sizeof err)
               : gram_regex_compile(k->valuestring, strlen(k->valuestring), &d, err, sizeof err);
        if (rc == -2) return gram_oom(c->b);
        if (rc == 1) continue; /* unknown format: an annotation */
        if (rc) return gram_fail(c->b, "%s \"%.80s\": %s", dfa_kws[i], k->valuestring, err);
        int ok = dfa_matches(&d, v->valuestring);
        gram_regex_free(&d);
        if (!ok) return reject(c, "it does not match %s \"%.80s\"", dfa_kws[i], k->valuestring);
    }
    return 1;
}

static int check_array(check *c, const cJSON *s, const cJSON *v) {
    uint32_t min = 0, max = UINT32_MAX;
    int rc;
    if ((rc = gram_get_count(c->b, s, "minItems", &min)) || (rc = gram_get_count(c->b, s, "maxItems", &max))) return rc;
    const uint32_t n = (uint32_t)cJSON_GetArraySize(v);
    if (n < min) return reject(c, "%s", "it has fewer items than minItems");
    if (n > max) return reject(c, "%s", "it has more items than maxItems");
    const cJSON *items = kw(s, "items"), *u = kw(s, "uniqueItems");
    if (u && !cJSON_IsBool(u)) return gram_fail(c->b, "uniqueItems must be a boolean");
    if (cJSON_IsArray(items)) return gram_fail(c->b, "items as an array (tuple validation) is not supported");
    for (const cJSON *x = v->child; x; x = x->next) {
        if (items) {
            rc = schema_admits(c, items, x, NULL);
            if (rc <= 0) return rc < 0 ? rc : reject(c, "%s", "an item does not satisfy items");
        }
        if (cJSON_IsTrue(u))
            for (const cJSON *y = v->child; y != x; y = y->next)
                if (json_equal(x, y)) return reject(c, "%s", "its items repeat (uniqueItems)");
    }
    return 1;
}

static int is_string_array(const cJSON *a) {
    if (!cJSON_IsArray(a)) return 0;
    for (const cJSON *x = a->child; x; x = x->next)
        if (!cJSON_IsString(x)) return 0;
    return 1;
}

static int check_object(check *c, const cJSON *s, const cJSON *v) {
    const cJSON *props = kw(s, "properties"), *addl = kw(s, "additionalProperties");
    const cJSON *req = kw(s, "required"), *dep = kw(s, "dependentRequired");
    uint32_t min = 0, max = UINT32_MAX;
    if (props && !cJSON_IsObject(props)) return gram_fail(c->b, "properties must be an object");
    if (req && !is_string_array(req)) return gram_fail(c->b, "required must be an array of names");
    if (dep && !cJSON_IsObject(dep)) return gram_fail(c->b, "dependentRequired must be an object");
    int rc;
    if ((rc = gram_get_count(c->b, s, "minProperties", &min)) || (rc = gram_get_count(c->b, s, "maxProperties", &max)))
        return rc;
    const uint32_t n = (uint32_t)cJSON_GetArraySize(v);
    if (n < min) return reject(c, "%s", "it has fewer members than minProperties");
    if (n > max) return reject(c, "%s", "it has more members than maxProperties");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!kw(v, r->valuestring)) return reject(c, "it lacks the required property '%.60s'", r->valuestring);
    for (const cJSON *d = dep ? dep->child : NULL; d; d = d->next) {
        if (!is_string_array(d)) return gram_fail(c->b, "dependentRequired must map names to arrays of names");
        if (!kw(v, d->string)) continue;
        for (const cJSON *r = d->child; r; r = r->next)
            if (!kw(v, r->valuestring))
                return reject(c, "it has '%.60s' without '%.60s' (dependentRequired)", d->string, r->valuestring);
    }
    for (const cJSON *x = v->child; x; x = x->next) {
        const cJSON *ps = props ? kw(props, x->string) : NULL;
        if (!ps && !addl) continue;
        rc = schema_admits(c, ps ? ps : addl, x, NULL);
        if (rc < 0) return rc;
        if (!rc)
            return reject(c, ps ? "its property '%.60s' does not satisfy its schema"
                                : "its property '%.60s' is not allowed by additionalProperties", x->string);
    }
    return 1;
}

/* Keywords that change validation and are neither generated nor checked here. */
static const char *const UNCHECKED[] = {"$dynamicRef", "$recursiveRef", "if", "then", "else",
    "patternProperties", "dependencies", "dependentSchemas", "propertyNames", "unevaluatedProperties",
    "unevaluatedItems", "contains", "minContains", "maxContains", "prefixItems", "additionalItems"};

/* 1: s admits v; 0: it does not; -1: s is refused (gram_fail was called). skip names a
 * keyword not to check (the enum or const whose values are being checked). */
static int schema_admits(check *c, const cJSON *s, const cJSON *v, const char *skip) {
    if (cJSON_IsTrue(s)) return 1;
    if (cJSON_IsFalse(s)) return reject(c, "%s", "the schema is false");
    if (!cJSON_IsObject(s)) return gram_fail(c->b, "a schema must be an object");
    if (++c->depth > CHECK_MAX_DEPTH) return gram_fail(c->b, "schemas nest more than %d deep", CHECK_MAX_DEPTH);
    int rc = 1;
    for (size_t i = 0; i < sizeof UNCHECKED / sizeof UNCHECKED[0]; i++)
        if (kw(s, UNCHECKED[i])) {
            rc = gram_fail(c->b, "keyword '%s' is not supported", UNCHECKED[i]);
            goto out;
        }
    const cJSON *ref = kw(s, "$ref");
    if (ref) {
        const cJSON *target = cJSON_IsString(ref) ? gram_resolve_ref(c->b, ref->valuestring) : NULL;
        if (!target) {
            rc = cJSON_IsString(ref) ? NEEDLE_ERR_SCHEMA : gram_fail(c->b, "$ref must be a string");
            goto out;
        }
        if ((rc = schema_admits(c, target, v, NULL)) <= 0) goto out;
    }
    const cJSON *t = kw(s, "type");
    if (t) {
        int any = 0;
        for (const cJSON *x = cJSON_IsArray(t) ? t->child : t; x; x = cJSON_IsArray(t) ? x->next : NULL) {
            int h = cJSON_IsString(x) ? has_type(v, x->valuestring) : -1;
            if (h < 0) {
                rc = gram_fail(c->b, "type must name JSON types");
                goto out;
            }
            any |= h;
        }
        if (cJSON_IsTrue(kw(s, "nullable")) && cJSON_IsNull(v)) any = 1;
        if (!any) {
            char *tt = cJSON_PrintUnformatted(t);
            rc = reject(c, "it is not of type %.80s", tt ? tt : "?");
            cJSON_free(tt);
            goto out;
        }
    }
    const cJSON *e = kw(s, "enum"), *k = kw(s, "const");
    if (e && (!skip || strcmp(skip, "enum"))) {
        if (!cJSON_IsArray(e)) {
            rc = gram_fail(c->b, "enum must be an array");
            goto out;
        }
        int found = 0;
        for (const cJSON *x = e->child; x && !found; x = x->next) found = json_equal(x, v);
        if (!found) {
            rc = reject(c, "%s", "it is not in the enum");
            goto out;
        }
    }
    if (k && (!skip || strcmp(skip, "const")) && !json_equal(k, v)) {
        rc = reject(c, "%s", "it is not the const");
        goto out;
    }
    if (cJSON_IsNumber(v)) rc = check_number(c, s, v);
    else if (cJSON_IsString(v)) rc = check_string(c, s, v);
    else if (cJSON_IsArray(v)) rc = check_array(c, s, v);
    else if (cJSON_IsObject(v)) rc = check_object(c, s, v);
    if (rc <= 0) goto out;
    const cJSON *all = kw(s, "allOf"), *anyof = kw(s, "anyOf"), *one = kw(s, "oneOf"), *not = kw(s, "not");
    static const char *const lists[] = {"allOf", "anyOf", "oneOf"};
    const cJSON *lv[] = {all, anyof, one};
    for (int i = 0; i < 3; i++) {
        if (!lv[i]) continue;
        if (!cJSON_IsArray(lv[i]) || !lv[i]->child) {
            rc = gram_fail(c->b, "%s must be a non-empty array of schemas", lists[i]);
            goto out;
        }
        int hits = 0, n = 0;
        for (const cJSON *x = lv[i]->child; x; x = x->next, n++) {
            int r = schema_admits(c, x, v, NULL);
            if (r < 0) {
                rc = r;
                goto out;
            }
            hits += r;
        }
        if (i == 0 ? hits != n : i == 1 ? hits == 0 : hits != 1) {
            rc = reject(c, i == 2 && hits > 1 ? "it matches more than one schema of %s" : "it does not satisfy %s",
                        lists[i]);
            goto out;
        }
    }
    if (not) {
        check inner = {c->b, NULL, 0, c->depth}; /* a failure inside "not" is no reason */
        int r = schema_admits(&inner, not, v, NULL);
        if (r < 0) {
            rc = r;
            goto out;
        }
        if (r) {
            rc = reject(c, "%s", "it matches the schema under not");
            goto out;
        }
    }
out:
    c->depth--;
    return rc;
}

int gram_value_admits(gram_builder *b, const cJSON *s, const cJSON *v, const char *skip, char *why, size_t why_len) {
    check c = {b, why, why_len, 0};
    if (why && why_len) why[0] = 0;
    return schema_admits(&c, s, v, skip);
}
