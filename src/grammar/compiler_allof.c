/* compiler_allof.c: allOf as one schema, the intersection of its entries and the keywords
 * beside it (pydantic v1 writes {"allOf": [{"$ref": ...}], "description": ...}; others
 * split a schema into parts).
 *
 * The entries ($refs followed) are merged keyword by keyword into one schema that admits
 * exactly the values every entry admits:
 *   type                 the intersection of the type sets ("integer" within "number");
 *                        empty: refused
 *   minimum, minLength,  the largest; maximum, maxLength, maxItems: the smallest;
 *   minItems               exclusive bounds likewise, each kind kept apart
 *   required             the union
 *   properties           per name; a name in several entries gets {"allOf": [its schemas]}
 *   enum                 the values in every enum (JSON equality)
 *   additionalProperties false if any entry says false; a name such an entry does not
 *                        declare leaves the merge (refused if required)
 *   uniqueItems          true if any entry says so
 *   anything else        (pattern, format, const, multipleOf, items, anyOf, ...) kept when
 *                        every entry that has it gives it the same value; differing values
 *                        are refused naming the keyword (their intersection is not computed)
 * Annotations are dropped. The merged schema is then compiled as any other. */
#include <math.h>
#include <string.h>

#include "grammar/compiler.h"
#include "needle.h"

static const cJSON *kw(const cJSON *s, const char *name) { return cJSON_GetObjectItemCaseSensitive(s, name); }

static int is_annotation(const char *k) {
    static const char *const names[] = {"title", "description", "default", "examples", "$schema", "$id",
                                        "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(k, names[i])) return 1;
    return !strncmp(k, "x-", 2);
}

static int json_equal(const cJSON *a, const cJSON *b) { return cJSON_Compare(a, b, 1); }

enum { T_STRING = 1, T_NUMBER = 2, T_INTEGER = 4, T_BOOLEAN = 8, T_NULL = 16, T_OBJECT = 32, T_ARRAY = 64, T_ALL = 127 };
static const char *const TYPE_NAMES[] = {"string", "number", "integer", "boolean", "null", "object", "array"};

static int type_set(const cJSON *t) {
    int set = 0;
    for (const cJSON *x = cJSON_IsArray(t) ? t->child : t; x; x = cJSON_IsArray(t) ? x->next : NULL)
        for (int i = 0; i < 7; i++)
            if (cJSON_IsString(x) && !strcmp(x->valuestring, TYPE_NAMES[i])) set |= 1 << i;
    if (set & T_NUMBER) set |= T_INTEGER; /* number covers integer */
    return set;
}

typedef struct merge {
    gram_builder *b;
    cJSON *out;
    int types;         /* intersection so far (T_ALL: none said) */
    cJSON *props;      /* name -> array of schemas */
    cJSON *required;   /* names */
    cJSON *enums;      /* NULL: no enum yet */
    cJSON *closed;     /* per entry with additionalProperties false: its property names */
    int unique, has_props; /* has_props: some entry declares properties (maybe none) */
} merge;

static int fail_keyword(merge *m, const char *k) {
    return gram_fail(m->b, "allOf: entries give '%s' different values; their intersection is not supported", k);
}

/* Numeric keywords: keeps the tighter. */
static int merge_bound(merge *m, const cJSON *v, const char *k, int take_max) {
    cJSON *cur = cJSON_GetObjectItemCaseSensitive(m->out, k);
    if (!cJSON_IsNumber(v) || (cur && !cJSON_IsNumber(cur))) return fail_keyword(m, k);
    if (!cur) cJSON_AddNumberToObject(m->out, k, v->valuedouble);
    else if (take_max ? v->valuedouble > cur->valuedouble : v->valuedouble < cur->valuedouble)
        cJSON_SetNumberValue(cur, v->valuedouble);
    return 0;
}

static int merge_entry(merge *m, const cJSON *s, int depth);

static int merge_keyword(merge *m, const cJSON *v, int depth) {
    const char *k = v->string;
    static const char *const lower[] = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"};
    static const char *const upper[] = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"};
    if (is_annotation(k)) return 0;
    for (int i = 0; i < 5; i++) {
        if (!strcmp(k, lower[i]) && !cJSON_IsBool(v)) return merge_bound(m, v, k, 1);
        if (!strcmp(k, upper[i]) && !cJSON_IsBool(v)) return merge_bound(m, v, k, 0);
    }
    if (!strcmp(k, "allOf")) {
        if (!cJSON_IsArray(v) || !v->child) return gram_fail(m->b, "allOf must be a non-empty array of schemas");
        for (const cJSON *x = v->child; x; x = x->next) {
            int rc = merge_entry(m, x, depth + 1);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(k, "type")) {
        m->types &= type_set(v);
        return 0;
    }
    if (!strcmp(k, "nullable")) return 0; /* folded into type by the caller */
    if (!strcmp(k, "required")) {
        for (const cJSON *x = cJSON_IsArray(v) ? v->child : NULL; x; x = x->next) {
            if (!cJSON_IsString(x)) return gram_fail(m->b, "required must be an array of names");
            int seen = 0;
            for (const cJSON *y = m->required->child; y && !seen; y = y->next) seen = !strcmp(y->valuestring, x->valuestring);
            if (!seen) cJSON_AddItemToArray(m->required, cJSON_CreateString(x->valuestring));
        }
        return cJSON_IsArray(v) ? 0 : gram_fail(m->b, "required must be an array of names");
    }
    if (!strcmp(k, "properties")) {
        if (!cJSON_IsObject(v)) return gram_fail(m->b, "properties must be an object");
        m->has_props = 1;
        for (const cJSON *p = v->child; p; p = p->next) {
            cJSON *list = cJSON_GetObjectItemCaseSensitive(m->props, p->string);
            if (!list) list = cJSON_AddArrayToObject(m->props, p->string);
            cJSON *copy = cJSON_Duplicate(p, 1);
            if (!list || !copy) return gram_oom(m->b);
            cJSON_AddItemToArray(list, copy);
        }
        return 0;
    }
    if (!strcmp(k, "additionalProperties")) {
        if (!cJSON_IsBool(v)) return fail_keyword(m, k);
        return 0; /* false: recorded by merge_entry with the entry's names */
    }
    if (!strcmp(k, "uniqueItems")) {
        m->unique |= cJSON_IsTrue(v);
        return 0;
    }
    if (!strcmp(k, "enum")) {
        if (!cJSON_IsArray(v)) return gram_fail(m->b, "enum must be an array");
        if (!m->enums) {
            m->enums = cJSON_Duplicate(v, 1);
            return m->enums ? 0 : gram_oom(m->b);
        }
        for (cJSON *x = m->enums->child; x;) { /* keep the values both have */
            cJSON *next = x->next;
            int found = 0;
            for (const cJSON *y = v->child; y && !found; y = y->next) found = json_equal(x, y);
            if (!found) cJSON_Delete(cJSON_DetachItemViaPointer(m->enums, x));
            x = next;
        }
        return 0;
    }
    const cJSON *cur = cJSON_GetObjectItemCaseSensitive(m->out, k);
    if (cur) return json_equal(cur, v) ? 0 : fail_keyword(m, k);
    cJSON *copy = cJSON_Duplicate(v, 1);
    if (!copy) return gram_oom(m->b);
    cJSON_AddItemToObject(m->out, k, copy);
    return 0;
}

static int merge_entry(merge *m, const cJSON *s, int depth) {
    if (depth > GRAM_MAX_REF_DEPTH) return gram_fail(m->b, "allOf nests more than %d deep", GRAM_MAX_REF_DEPTH);
    if (cJSON_IsTrue(s)) return 0;
    if (!cJSON_IsObject(s)) return gram_fail(m->b, "allOf entries must be schemas (objects)");
    const cJSON *ref = kw(s, "$ref");
    if (ref) {
        if (++m->b->ref_expansions > GRAM_MAX_REF_EXPANSIONS)
            return gram_fail(m->b, "$refs expand to more than %d schemas", GRAM_MAX_REF_EXPANSIONS);
        const cJSON *t = cJSON_IsString(ref) ? gram_resolve_ref(m->b, ref->valuestring) : NULL;
        if (!t) return cJSON_IsString(ref) ? NEEDLE_ERR_SCHEMA : gram_fail(m->b, "$ref must be a string");
        int rc = merge_entry(m, t, depth + 1);
        if (rc) return rc;
    }
    int types_before = m->types, own_types = T_ALL;
    for (const cJSON *v = s->child; v; v = v->next) {
        if (!strcmp(v->string, "$ref")) continue;
        if (!strcmp(v->string, "type")) {
            own_types = type_set(v);
            continue;
        }
        int rc = merge_keyword(m, v, depth);
        if (rc) return rc;
    }
    if (cJSON_IsFalse(kw(s, "additionalProperties"))) { /* keys beyond its own are forbidden */
        cJSON *names = cJSON_CreateArray();
        const cJSON *props = kw(s, "properties");
        if (!names) return gram_oom(m->b);
        for (const cJSON *p = cJSON_IsObject(props) ? props->child : NULL; p; p = p->next)
            cJSON_AddItemToArray(names, cJSON_CreateString(p->string));
        cJSON_AddItemToArray(m->closed, names);
    }
    if (kw(s, "type")) {
        if (cJSON_IsTrue(kw(s, "nullable"))) own_types |= T_NULL;
        m->types = types_before & own_types & m->types;
    }
    return 0;
}

int gram_merge_all_of(gram_builder *b, const cJSON *s, cJSON **out) {
    merge m = {b, cJSON_CreateObject(), T_ALL, cJSON_CreateObject(), cJSON_CreateArray(), NULL, cJSON_CreateArray(), 0, 0};
    *out = NULL;
    int rc = m.out && m.props && m.required && m.closed ? 0 : gram_oom(b);
    if (!rc) {
        size_t mark = gram_path_push(b, "allOf", 0);
        rc = merge_entry(&m, s, 0);
        gram_path_pop(b, mark);
    }
    if (!rc && m.types == 0) rc = gram_fail(b, "allOf: the entries' types have no type in common");
    if (!rc && m.types != T_ALL) {
        cJSON *t = cJSON_AddArrayToObject(m.out, "type");
        int types = m.types & T_NUMBER ? m.types & ~T_INTEGER : m.types;
        for (int i = 0; i < 7; i++)
            if (types & (1 << i)) cJSON_AddItemToArray(t, cJSON_CreateString(TYPE_NAMES[i]));
    }
    /* an entry with additionalProperties false forbids every name it does not declare:
     * such names leave the merge, and one that is required makes the schema impossible */
    for (cJSON *p = rc ? NULL : m.props->child; p;) {
        cJSON *next = p->next;
        int allowed = 1;
        for (const cJSON *names = m.closed->child; names && allowed; names = names->next) {
            int found = 0;
            for (const cJSON *x = names->child; x && !found; x = x->next) found = !strcmp(x->valuestring, p->string);
            allowed = found;
        }
        if (!allowed) {
            for (const cJSON *r = m.required->child; r && !rc; r = r->next)
                if (!strcmp(r->valuestring, p->string))
                    rc = gram_fail(b, "allOf: '%s' is required by one entry and forbidden by another "
                                      "(additionalProperties false)", p->string);
            cJSON_Delete(cJSON_DetachItemViaPointer(m.props, p));
        }
        p = next;
    }
    if (!rc && m.closed->child) /* the merge declares every name allowed: closed as the grammar reads it */
        for (const cJSON *r = m.required->child; r && !rc; r = r->next)
            if (!cJSON_GetObjectItemCaseSensitive(m.props, r->valuestring))
                rc = gram_fail(b, "allOf: '%s' is required but forbidden by an entry's additionalProperties false",
                               r->valuestring);
    if (!rc && (m.props->child || m.has_props)) { /* declared, even empty: a closed object */
        cJSON *props = cJSON_AddObjectToObject(m.out, "properties");
        for (cJSON *p = m.props->child; p; p = p->next) {
            cJSON *one = cJSON_GetArraySize(p) == 1 ? cJSON_Duplicate(p->child, 1) : cJSON_CreateObject();
            if (!one) {
                rc = gram_oom(b);
                break;
            }
            if (cJSON_GetArraySize(p) > 1) cJSON_AddItemToObject(one, "allOf", cJSON_Duplicate(p, 1));
            cJSON_AddItemToObject(props, p->string, one);
        }
    }
    if (!rc && m.required->child) cJSON_AddItemToObject(m.out, "required", cJSON_Duplicate(m.required, 1));
    if (!rc && m.closed->child) cJSON_AddFalseToObject(m.out, "additionalProperties");
    if (!rc && m.unique) cJSON_AddTrueToObject(m.out, "uniqueItems");
    if (!rc && m.enums) {
        if (!m.enums->child) rc = gram_fail(b, "allOf: no value is in every enum");
        else cJSON_AddItemToObject(m.out, "enum", m.enums), m.enums = NULL;
    }
    cJSON_Delete(m.enums);
    cJSON_Delete(m.closed);
    cJSON_Delete(m.props);
    cJSON_Delete(m.required);
    if (rc) cJSON_Delete(m.out);
    else *out = m.out;
    return rc;
}
