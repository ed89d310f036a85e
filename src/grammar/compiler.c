/* compiler.c: grammar_compile(): tools JSON -> grammar (see grammar.h, schema_ir.h).
 *
 * The JSON Schema subset, per value:
 *   type            string, number, integer, boolean, null, object, array, or a list of
 *                   them; "nullable": true adds null. Without "type", the type is inferred
 *                   from the keywords present (properties -> object, items -> array, ...),
 *                   and a schema with none (or `true`) admits any JSON value.
 *   enum, const     any JSON values, matched on their compact spelling (strings raw UTF-8
 *                   or \u-escaped; integral numbers as "1" or "1.0"). Every other keyword
 *                   of the schema filters them (compiler_enum.c, JSON Schema validation of
 *                   each value, allOf/not/dependentRequired/min/maxProperties included): a
 *                   value that breaks one is dropped; a schema left with none is refused
 *                   naming the value and the keyword it breaks.
 *   anyOf, oneOf    alternatives that start with different bytes (different JSON types,
 *                   or enums starting differently), except objects: several object
 *                   alternatives are allowed when a const property or their required keys
 *                   tell them apart (compiler_union.c). oneOf also needs its object
 *                   alternatives exclusive as JSON Schema reads them (open unless
 *                   additionalProperties is false; check_one_of).
 *                   Keywords beside them hold for every alternative (each becomes an
 *                   allOf of them and the alternative). oneOf
 *                   alternatives must say their type (check_one_of).
 *   object          properties (at most 64) in any order, each at most once; no unknown
 *                   keys; required ones before "}", and those dependentRequired names for
 *                   the properties written (not in unions of objects or uniqueItems
 *                   items). additionalProperties may be false (or
 *                   true without properties). Without "properties" the object is free-form
 *                   (what tools.py writes for dict): any keys, any values; repeated keys are
 *                   not detected there.
 *   array           items (a schema; absent = any values), minItems, maxItems, uniqueItems
 *                   (at most GRAMMAR_MAX_UNIQUE items, of one type). Scalar items: enums,
 *                   booleans, numbers, strings without maxLength/pattern/format. Object
 *                   items: declared properties, each a string without maxLength/pattern/
 *                   format, an array without maxItems, or a number or literal with at least
 *                   as many values as the array's items; array items: without maxItems;
 *                   their parts may be any typed values (no free-form values, no nested
 *                   uniqueItems). Equality is JSON's: 1 == 1.0, "\u0061" == "a", objects
 *                   equal with their members in any order (by a 64-bit hash of the
 *                   canonical value: code points, exact numbers, members as a sum). A
 *                   repeat is refused at the byte where it would become certain: for
 *                   scalars where no unused value can follow, for an object at the byte
 *                   that completes its last property (or at "}"; a number or literal last
 *                   property avoids the repeating values as it is read), for an array at "]";
 *                   there the value can always go on differently (that is what the
 *                   restrictions on object and array items ensure), so a unique array never
 *                   traps the decoder. Numbers in unique items keep to 15 significant
 *                   digits (plain numbers: 6 decimals, below 1e9), so that distinct values
 *                   stay distinct doubles.
 *   string          minLength/maxLength (code points), pattern (regex.h), format (date,
 *                   time, date-time, email, uri, uuid, ipv4; others are ignored as
 *                   annotations), not pattern and format together.
 *   number/integer  minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, or
 *                   draft-4 booleans), multipleOf (k * 10^-s with s <= 9), always within
 *                   |x| <= 2^53 (GRAM_JSON_SAFE_INT); without bounds at most 17 digits and
 *                   no exponent (gram_unbounded_number). Bounds hold both
 *                   for the decimal written and for the double a tool reads from it: a
 *                   strict bound b is applied as >= nextafter(b) (inclusive bounds need no
 *                   care, rounding being monotone).
 * A tool is {"name", "description"?, "parameters"?} (or "input_schema"), optionally wrapped
 * as {"type":"function","function":{...}}; parameters must be an object schema, and a
 * missing one means no arguments ({}).
 * $ref          local refs only ("#/$defs/A", "#/definitions/A", any JSON pointer into the
 *               tool's parameters schema, ~0/~1 escaped), followed through chains and
 *               inlined; only annotations beside it. Recursive refs (a tree type) are
 *               refused, as are remote refs and refs that point at nothing.
 * allOf         merged into one schema, the intersection of its entries (compiler_allof.c).
 * not           {"type": T} only: the schema's types less T (apply_not); beside an enum or
 *               const any schema (checked value by value).
 * Annotations (title, description, default, examples, $schema, $defs, ...) and unknown
 * keywords are ignored, as JSON Schema does. Keywords that change validation in ways the
 * grammar does not implement are refused: other forms of not, if/then/else,
 * patternProperties, dependencies, propertyNames, contains, prefixItems, ... (beside an
 * enum or const, not, dependentRequired and min/maxProperties are checked). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_canon.h"
#include "grammar/compiler.h"
#include "needle.h"
#include "util/error.h"

/* ---- gram_builder plumbing ------------------------------------------------------------------ */

int gram_fail(gram_builder *b, const char *fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return needle_fail(NEEDLE_ERR_SCHEMA, "tool \"%.60s\": %s: %s", b->tool ? b->tool : "?",
                       b->path_len ? b->path : "(tool)", msg);
}

int gram_oom(gram_builder *b) {
    (void)b;
    return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "grammar: out of memory");
}

size_t gram_path_push(gram_builder *b, const char *seg, long index) {
    size_t old = b->path_len, room = sizeof b->path - old;
    int n = seg ? snprintf(b->path + old, room, "%s%s", old ? "." : "", seg)
                : snprintf(b->path + old, room, "[%ld]", index);
    b->path_len = n < 0 || (size_t)n >= room ? sizeof b->path - 1 : old + (size_t)n;
    return old;
}

void gram_path_pop(gram_builder *b, size_t len) {
    b->path_len = len;
    b->path[len] = 0;
}

static int grow(void *pp, uint32_t *cap, uint64_t need, size_t elem) {
    void **p = pp;
    if (need <= *cap) return 0;
    if (need > UINT32_MAX / 2) return -1;
    uint32_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

uint32_t gram_new_node(gram_builder *b, int kind) {
    grammar *g = b->g;
    if (grow(&g->nodes, &b->cap_nodes, (uint64_t)g->n_nodes + 1, sizeof *g->nodes)) return GRAM_NONE;
    memset(&g->nodes[g->n_nodes], 0, sizeof g->nodes[0]);
    g->nodes[g->n_nodes].kind = (uint8_t)kind;
    return g->n_nodes++;
}

int gram_push_lit(gram_builder *b, const uint8_t *bytes, size_t len, uint32_t member) {
    grammar *g = b->g;
    if (grow(&g->lit_bytes, &b->cap_bytes, (uint64_t)b->n_bytes + len + 1, 1) ||
        grow(&g->lits, &b->cap_lits, (uint64_t)g->n_lits + 1, sizeof *g->lits))
        return -1;
    memcpy(g->lit_bytes + b->n_bytes, bytes, len);
    g->lits[g->n_lits].off = b->n_bytes;
    g->lits[g->n_lits].len = (uint32_t)len;
    g->lits[g->n_lits].member = member;
    g->n_lits++;
    b->n_bytes += (uint32_t)len;
    return 0;
}

int gram_push_props(gram_builder *b, uint32_t n, uint32_t *first) {
    if (grow(&b->g->prop_nodes, &b->cap_props, (uint64_t)b->n_props + n, sizeof(uint32_t))) return -1;
    *first = b->n_props;
    b->n_props += n;
    return 0;
}

static int lit_cmp(const grammar *g, const gram_lit *x, const gram_lit *y) {
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(g->lit_bytes + x->off, g->lit_bytes + y->off, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

void gram_sort_lits(grammar *g, uint32_t first, uint32_t n) {
    if (n < 2) return; /* g->lits may still be NULL (a tool without literals) */
    gram_lit *v = g->lits + first; /* insertion sort for small sets, else bottom-up merge */
    gram_lit *tmp = n > 16 ? malloc(n * sizeof *tmp) : NULL;
    if (!tmp) {
        for (uint32_t i = 1; i < n; i++) {
            gram_lit x = v[i];
            uint32_t j = i;
            while (j && lit_cmp(g, &v[j - 1], &x) > 0) v[j] = v[j - 1], j--;
            v[j] = x;
        }
        return;
    }
    for (uint32_t w = 1; w < n; w *= 2) {
        for (uint32_t lo = 0; lo < n; lo += 2 * w) {
            uint32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            uint32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = lit_cmp(g, &v[j], &v[i]) < 0 ? v[j++] : v[i++];
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof *v);
    }
    free(tmp);
}

/* ---- helpers for keywords ------------------------------------------------------------- */

static const char *const UNSUPPORTED[] = {
    "$dynamicRef", "$recursiveRef", "if", "then", "else",
    "patternProperties", "dependencies", "dependentSchemas",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains",
    "maxContains", "prefixItems", "additionalItems", "minProperties", "maxProperties"};

static const cJSON *kw(const cJSON *s, const char *name) {
    return cJSON_GetObjectItemCaseSensitive(s, name);
}

static int has_any(const cJSON *s, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (kw(s, names[i])) return 1;
    return 0;
}

int gram_get_count(gram_builder *b, const cJSON *s, const char *name, uint32_t *v) {
    const cJSON *x = kw(s, name);
    if (!x) return 0;
    double d = cJSON_IsNumber(x) ? x->valuedouble : -1;
    if (!(d >= 0 && d <= 1e9 && d == (double)(uint32_t)d))
        return gram_fail(b, "%s must be a non-negative integer", name);
    *v = (uint32_t)d;
    return 0;
}

/* ---- any value -------------------------------------------------------------------------- */


uint32_t gram_node_domain(const gram_builder *b, uint32_t node) {
    const gram_node *n = &b->g->nodes[node];
    if (n->kind == GRAM_NODE_LITERAL) return n->u.lit.n_members;
    if (n->kind != GRAM_NODE_NUMBER) return UINT32_MAX;
    if (n->u.num.mode == GRAM_NUM_SCALED) {
        int64_t k = n->u.num.step, lo = n->u.num.slo, hi = n->u.num.shi;
        int64_t a = lo >= 0 ? (lo + k - 1) / k : -(-lo / k), z = hi >= 0 ? hi / k : -((-hi + k - 1) / k);
        return z < a ? 0 : (uint64_t)(z - a) >= UINT32_MAX - 1 ? UINT32_MAX : (uint32_t)(z - a + 1);
    }
    if (n->u.num.mode == GRAM_NUM_EXACT) {
        gram_fx lo = n->u.num.lo, hi = n->u.num.hi;
        if (hi.ip - lo.ip >= 2) return UINT32_MAX;
        uint64_t span = (uint64_t)(hi.ip - lo.ip) * GRAM_FX_ONE + hi.fp - lo.fp;
        return span >= UINT32_MAX - 1 ? UINT32_MAX : (uint32_t)span + 1;
    }
    return UINT32_MAX;
}

static int free_string(gram_builder *b, uint32_t *out) {
    if (b->free_str == GRAM_NONE) {
        uint32_t n = gram_new_node(b, GRAM_NODE_STRING);
        if (n == GRAM_NONE) return gram_oom(b);
        b->g->nodes[n].u.str.dfa = -1;
        b->g->nodes[n].u.str.table = -1;
        b->g->nodes[n].u.str.max_len = UINT32_MAX;
        b->free_str = n;
    }
    *out = b->free_str;
    return 0;
}

static int any_value(gram_builder *b, uint32_t *out) {
    if (b->any != GRAM_NONE) {
        *out = b->any;
        return 0;
    }
    static const char *const words[] = {"false", "null", "true"};
    uint32_t u = gram_new_node(b, GRAM_NODE_UNION), alts[5];
    int rc;
    if (u == GRAM_NONE) return gram_oom(b);
    b->any = u;
    if ((rc = free_string(b, &alts[0])) || (rc = gram_build_fixed_literal(b, words, 3, &alts[2]))) return rc;
    alts[1] = gram_new_node(b, GRAM_NODE_NUMBER);
    alts[3] = gram_new_node(b, GRAM_NODE_OBJECT);
    alts[4] = gram_new_node(b, GRAM_NODE_ARRAY);
    if (alts[1] == GRAM_NONE || alts[3] == GRAM_NONE || alts[4] == GRAM_NONE) return gram_oom(b);
    gram_unbounded_number(b, alts[1]);
    gram_node *o = &b->g->nodes[alts[3]];
    o->u.obj.deps = GRAM_NONE;
    o->u.obj.free_value = u;
    o->u.obj.free_key = alts[0];
    gram_node *a = &b->g->nodes[alts[4]];
    a->u.arr.items = u;
    a->u.arr.max = UINT32_MAX;
    if ((rc = gram_set_picks(b, u, alts, 5))) return rc;
    *out = u;
    return 0;
}

/* ---- unions ------------------------------------------------------------------------------ */

void gram_first_bytes(const gram_builder *b, uint32_t node, uint8_t *set) {
    const grammar *g = b->g;
    const gram_node *n = &g->nodes[node];
    switch (n->kind) {
    case GRAM_NODE_STRING: set['"'] = 1; break;
    case GRAM_NODE_NUMBER:
        set['-'] = 1;
        for (int c = '0'; c <= '9'; c++) set[c] = 1;
        break;
    case GRAM_NODE_LITERAL:
        for (uint32_t i = 0; i < n->u.lit.count; i++)
            set[g->lit_bytes[g->lits[n->u.lit.first + i].off]] = 1;
        break;
    case GRAM_NODE_OBJECT:
    case GRAM_NODE_OBJ_UNION: set['{'] = 1; break;
    case GRAM_NODE_ARRAY: set['['] = 1; break;
    case GRAM_NODE_UNION:
        for (int c = 0; c < 256; c++) set[c] = g->picks[n->u.uni.pick + c] != 0;
        break;
    default: break;
    }
}

int gram_set_picks(gram_builder *b, uint32_t node, const uint32_t *alts, uint32_t n) {
    grammar *g = b->g;
    if (grow(&g->picks, &b->cap_picks, (uint64_t)b->n_picks + 256, sizeof *g->picks)) return gram_oom(b);
    uint32_t base = b->n_picks;
    b->n_picks += 256;
    memset(g->picks + base, 0, 256 * sizeof *g->picks);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t set[256] = {0};
        gram_first_bytes(b, alts[i], set);
        for (int c = 0; c < 256; c++) {
            if (!set[c]) continue;
            if (g->picks[base + c])
                return gram_fail(b, "alternatives must differ in JSON type: two of them can start with '%c'", c);
            g->picks[base + c] = alts[i] + 1;
        }
    }
    g->nodes[node].u.uni.pick = base;
    return 0;
}

/* The schema a list entry stands for, through its $ref chain (NULL: unresolved). */
static const cJSON *deref(gram_builder *b, const cJSON *s) {
    for (int i = 0; s && cJSON_IsObject(s) && kw(s, "$ref") && i < GRAM_MAX_REF_DEPTH; i++)
        s = cJSON_IsString(kw(s, "$ref")) ? gram_resolve_ref(b, kw(s, "$ref")->valuestring) : NULL;
    return s;
}

/* The object nodes a value of `node` may be written as: itself, the alternatives of an
 * object union, the object alternative of a union. Returns how many (at most cap). */
static uint32_t object_leaves(const gram_builder *b, uint32_t node, uint32_t *out, uint32_t cap) {
    const grammar *g = b->g;
    const gram_node *u = &g->nodes[node];
    if (u->kind == GRAM_NODE_UNION) {
        uint32_t pick = g->picks[u->u.uni.pick + '{'];
        return pick ? object_leaves(b, pick - 1, out, cap) : 0;
    }
    if (u->kind == GRAM_NODE_OBJECT && cap) {
        out[0] = node;
        return 1;
    }
    uint32_t n = 0;
    if (u->kind == GRAM_NODE_OBJ_UNION)
        for (uint32_t a = 0; a < u->u.ou.n_alts && n < cap; a++) out[n++] = g->prop_nodes[u->u.ou.table + a];
    return n;
}

/* oneOf means exactly one: a value the grammar writes for one alternative must fail every
 * other. Alternatives of different JSON types are exclusive (the union's pick table
 * guarantees that); objects are, in JSON Schema, open unless additionalProperties is
 * false, so each object a value of alternative i may be written as must be shown to fail
 * every object of alternative j (gram_objects_exclusive; additionalProperties is read
 * from the oneOf's own entries, a nested union's objects count as open). */
/* Whether schema s admits values of its declared types only (JSON Schema's keywords of
 * one type let every other type through): it says "type", lists its values (enum,
 * const), or is a union or an intersection of such schemas. */
static int typed(gram_builder *b, const cJSON *s, int depth) {
    s = deref(b, s);
    if (!cJSON_IsObject(s) || depth > GRAM_MAX_REF_DEPTH) return 0;
    if (kw(s, "type") || kw(s, "enum") || kw(s, "const")) return 1;
    const cJSON *all = kw(s, "allOf"), *any = kw(s, "anyOf") ? kw(s, "anyOf") : kw(s, "oneOf");
    for (const cJSON *x = cJSON_IsArray(all) ? all->child : NULL; x; x = x->next)
        if (typed(b, x, depth + 1)) return 1;
    if (!cJSON_IsArray(any) || !any->child) return 0;
    for (const cJSON *x = any->child; x; x = x->next)
        if (!typed(b, x, depth + 1)) return 0;
    return 1;
}

static int check_one_of(gram_builder *b, const cJSON *list, const uint32_t *alts, uint32_t n) {
    uint32_t li[GRAM_MAX_OBJ_ALTS], lj[GRAM_MAX_OBJ_ALTS];
    const cJSON *x = list->child;
    /* values of different JSON types are told apart only by alternatives that say their
     * type: {"minimum": 1} also admits every string, boolean, ... */
    for (uint32_t i = 0; i < n && n > 1; i++, x = x->next)
        if (!typed(b, x, 0))
            return gram_fail(b, "oneOf[%u] does not say its type, so in JSON Schema it also admits the values "
                                "of other types the other alternatives write, and oneOf needs exactly one: add "
                                "\"type\" or use anyOf", i);
    x = list->child;
    for (uint32_t i = 0; i < n; i++, x = x->next) {
        const uint32_t ni = object_leaves(b, alts[i], li, GRAM_MAX_OBJ_ALTS);
        const cJSON *y = list->child;
        for (uint32_t j = 0; j < n && ni; j++, y = y->next) {
            const uint32_t nj = j == i ? 0 : object_leaves(b, alts[j], lj, GRAM_MAX_OBJ_ALTS);
            if (!nj) continue;
            const cJSON *sj = deref(b, y);
            if (!sj) return NEEDLE_ERR_SCHEMA;
            const int closed = b->g->nodes[alts[j]].kind == GRAM_NODE_OBJECT && cJSON_IsObject(sj) &&
                               cJSON_IsFalse(kw(sj, "additionalProperties"));
            for (uint32_t p = 0; p < ni; p++)
                for (uint32_t q = 0; q < nj; q++)
                    if (!gram_objects_exclusive(b, li[p], lj[q], closed))
                        return gram_fail(b, "oneOf[%u] and oneOf[%u]: an object written for [%u] may also be valid "
                                            "against [%u] (JSON Schema objects accept undeclared keys unless "
                                            "additionalProperties is false), and oneOf needs exactly one: make [%u] "
                                            "require a key [%u] lacks, give them distinct const values of a "
                                            "required key, or use anyOf", i, j, i, j, j, i);
        }
    }
    return 0;
}

static int build_anyof(gram_builder *b, const cJSON *s, const cJSON *list, const char *name, int ctx,
                       uint32_t *node, int *depth) {
    /* "discriminator" (OpenAPI, pydantic) names the property the const values tell apart:
     * the compiler finds that property by itself (compiler_union.c) */
    static const char *const annotations[] = {"title", "description", "default", "examples",
        "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
        "discriminator"};
    int siblings = 0;
    for (const cJSON *k = s->child; k; k = k->next) {
        int ok = !strcmp(k->string, name) || !strncmp(k->string, "x-", 2);
        for (size_t i = 0; !ok && i < sizeof annotations / sizeof annotations[0]; i++)
            ok = !strcmp(k->string, annotations[i]);
        siblings += !ok;
    }
    if (siblings && cJSON_IsArray(list)) {
        /* keywords beside the list hold for every alternative: {"type": "string", "anyOf":
         * [A, B]} is {"anyOf": [{"allOf": [{"type": "string"}, A]}, {"allOf": [..., B]}]}, the
         * same values for anyOf and for oneOf (the common part cannot make two match) */
        cJSON *rw = cJSON_CreateObject(), *common = cJSON_Duplicate(s, 1), *alts_rw = NULL;
        if (rw && common) {
            cJSON_DeleteItemFromObjectCaseSensitive(common, name);
            alts_rw = cJSON_AddArrayToObject(rw, name);
        }
        int rc = alts_rw ? 0 : gram_oom(b);
        for (const cJSON *x = list->child; x && !rc; x = x->next) {
            cJSON *e = cJSON_CreateObject(), *all = e ? cJSON_AddArrayToObject(e, "allOf") : NULL;
            if (!all) rc = gram_oom(b);
            else {
                cJSON_AddItemToArray(all, cJSON_Duplicate(common, 1));
                cJSON_AddItemToArray(all, cJSON_Duplicate(x, 1));
            }
            if (e) cJSON_AddItemToArray(alts_rw, e);
        }
        if (!rc) rc = build_anyof(b, rw, alts_rw, name, ctx, node, depth);
        cJSON_Delete(common);
        cJSON_Delete(rw);
        return rc;
    }
    if (ctx & GRAM_CTX_UNIQUE_ITEM) return gram_fail(b, "uniqueItems is not supported for items with %s", name);
    int n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
    if (n < 1 || n > 64) return gram_fail(b, "%s must be an array of 1 to 64 schemas", name);
    uint32_t alts[64];
    *depth = 1;
    size_t mark = gram_path_push(b, name, 0);
    int i = 0, rc = 0;
    for (const cJSON *x = list->child; x && !rc; x = x->next, i++) {
        size_t m2 = gram_path_push(b, NULL, i);
        int d = 0;
        rc = gram_build_schema(b, x, ctx & GRAM_CTX_HASHED, &alts[i], &d);
        if (d > *depth) *depth = d;
        gram_path_pop(b, m2);
    }
    if (!rc) rc = gram_make_union(b, alts, (uint32_t)n, node);
    if (!rc && !strcmp(name, "oneOf")) rc = check_one_of(b, list, alts, (uint32_t)n);
    if (!rc && (ctx & GRAM_CTX_HASHED) && gram_has_object_union(b, *node))
        rc = gram_fail(b, "a union of objects inside the items of a uniqueItems array is not supported");
    gram_path_pop(b, mark);
    return rc;
}

/* ---- containers ----------------------------------------------------------------------------- */

/* Index of the declared property `name` in props, -1 if none. */
static int prop_index(const cJSON *props, const char *name) {
    int j = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, j++)
        if (!strcmp(p->string, name)) return j;
    return -1;
}

/* dependentRequired of an object with declared properties: one mask per property (the
 * properties its presence requires) in g->dep_masks, *deps its first; GRAM_NONE when
 * nothing depends. Every property can be written once, so a dependency on a declared
 * property never leads to a dead end; a dependency on an undeclared one (the object is
 * closed) forbids its property: refused, like an undeclared required name, and so is a
 * required property whose dependencies are (transitively) required too: folded into
 * *required. A name with dependencies that is not a declared property can never appear:
 * nothing to do. */
static int build_dependent_required(gram_builder *b, const cJSON *s, const cJSON *props, int ctx,
                                    uint64_t *required, uint32_t *deps) {
    const cJSON *dep = kw(s, "dependentRequired");
    *deps = GRAM_NONE;
    if (!dep) return 0;
    size_t mark = gram_path_push(b, "dependentRequired", 0);
    int rc = 0;
    uint64_t masks[GRAM_MAX_PROPS] = {0}, any = 0;
    if (!cJSON_IsObject(dep)) rc = gram_fail(b, "dependentRequired must be an object");
    if (!rc && (ctx & (GRAM_CTX_UNIQUE_ITEM | GRAM_CTX_HASHED)))
        rc = gram_fail(b, "dependentRequired inside the items of a uniqueItems array is not supported");
    for (const cJSON *d = dep && !rc ? dep->child : NULL; d && !rc; d = d->next) {
        const int from = prop_index(props, d->string);
        if (!cJSON_IsArray(d)) {
            rc = gram_fail(b, "dependentRequired must map names to arrays of names");
            break;
        }
        for (const cJSON *r = d->child; r && !rc; r = r->next) {
            if (!cJSON_IsString(r)) {
                rc = gram_fail(b, "dependentRequired must map names to arrays of names");
                break;
            }
            const int to = prop_index(props, r->valuestring);
            if (from < 0) continue;
            if (to < 0) {
                size_t m = gram_path_push(b, d->string, 0);
                rc = gram_fail(b, "'%s' requires '%s', which is not a declared property", d->string,
                               r->valuestring);
                gram_path_pop(b, m);
                break;
            }
            masks[from] |= 1ull << to;
            any = 1;
        }
    }
    gram_path_pop(b, mark);
    if (rc || !any) return rc;
    /* a required property's dependencies are required from the start */
    for (uint64_t before = 0; before != *required;) {
        before = *required;
        for (int p = 0; p < GRAM_MAX_PROPS; p++)
            if (*required >> p & 1) *required |= masks[p];
    }
    const int n = cJSON_GetArraySize(props);
    if (grow(&b->g->dep_masks, &b->cap_deps, (uint64_t)b->n_deps + (uint64_t)n, sizeof(uint64_t)))
        return gram_oom(b);
    *deps = b->n_deps;
    memcpy(b->g->dep_masks + b->n_deps, masks, (size_t)n * sizeof(uint64_t));
    b->n_deps += (uint32_t)n;
    return 0;
}

static int build_object(gram_builder *b, const cJSON *s, int ctx, uint32_t *node, int *depth) {
    const cJSON *props = kw(s, "properties"), *addl = kw(s, "additionalProperties");
    const cJSON *req = kw(s, "required");
    int rc;
    if (props && !cJSON_IsObject(props)) return gram_fail(b, "properties must be an object");
    if (addl && !cJSON_IsFalse(addl) && !(cJSON_IsTrue(addl) && !props))
        return gram_fail(b, "additionalProperties other than false is not supported");
    if (req && !cJSON_IsArray(req)) return gram_fail(b, "required must be an array of names");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r)) return gram_fail(b, "required must be an array of names");
    *depth = 1;
    const int part_ctx = ctx & (GRAM_CTX_UNIQUE_ITEM | GRAM_CTX_HASHED) ? GRAM_CTX_HASHED : 0;
    if (!props && !cJSON_IsFalse(addl)) { /* free-form object */
        if (part_ctx) return gram_fail(b, "uniqueItems needs objects with declared properties in its items");
        const cJSON *dep = kw(s, "dependentRequired");
        if (dep && !(cJSON_IsObject(dep) && !dep->child)) /* an object of any keys: nothing to follow */
            return gram_fail(b, "dependentRequired needs an object with declared properties");
        if (req && req->child) {
            size_t m = gram_path_push(b, "required", 0);
            rc = gram_fail(b, "'%s' is not a declared property", req->child->valuestring);
            gram_path_pop(b, m);
            return rc;
        }
        uint32_t v = GRAM_NONE, k = GRAM_NONE;
        if ((rc = any_value(b, &v)) || (rc = free_string(b, &k))) return rc;
        uint32_t o = gram_new_node(b, GRAM_NODE_OBJECT);
        if (o == GRAM_NONE) return gram_oom(b);
        b->g->nodes[o].u.obj.deps = GRAM_NONE;
        b->g->nodes[o].u.obj.free_value = v;
        b->g->nodes[o].u.obj.free_key = k;
        *node = o;
        return 0;
    }
    int n = props ? cJSON_GetArraySize(props) : 0;
    if (n > GRAM_MAX_PROPS) return gram_fail(b, "more than %d properties", GRAM_MAX_PROPS);
    uint32_t kids[GRAM_MAX_PROPS];
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        size_t m = gram_path_push(b, "properties", 0);
        gram_path_push(b, p->string, 0);
        int d = 0;
        rc = gram_build_schema(b, p, part_ctx, &kids[i], &d);
        gram_path_pop(b, m);
        if (rc) return rc;
        if (d + 1 > *depth) *depth = d + 1;
    }
    uint64_t required = 0;
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        int found = -1, j = 0;
        for (const cJSON *p = props->child; p; p = p->next, j++)
            if (!strcmp(p->string, r->valuestring)) found = j;
        if (found < 0) {
            size_t m = gram_path_push(b, "required", 0);
            rc = gram_fail(b, "'%s' is not a declared property", r->valuestring);
            gram_path_pop(b, m);
            return rc;
        }
        required |= 1ull << found;
    }
    uint32_t deps = GRAM_NONE;
    if ((rc = build_dependent_required(b, s, props, ctx, &required, &deps))) return rc;
    uint32_t first_prop, first_lit = b->g->n_lits;
    if (gram_push_props(b, (uint32_t)n, &first_prop)) return gram_oom(b);
    i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        b->g->prop_nodes[first_prop + i] = kids[i];
        for (int ascii = 0; ascii < 2; ascii++) {
            if (gram_spell_string(b, p->string, ascii) < 0) return gram_oom(b);
        }
        /* the two spellings are equal for ASCII names: keep one */
        uint32_t nl = b->g->n_lits;
        gram_lit *x = &b->g->lits[nl - 2], *y = &b->g->lits[nl - 1];
        x->member = y->member = (uint32_t)i;
        if (x->len == y->len && !memcmp(b->g->lit_bytes + x->off, b->g->lit_bytes + y->off, x->len))
            b->g->n_lits--;
    }
    gram_sort_lits(b->g, first_lit, b->g->n_lits - first_lit);
    uint32_t o = gram_new_node(b, GRAM_NODE_OBJECT);
    if (o == GRAM_NONE) return gram_oom(b);
    gram_node *on = &b->g->nodes[o];
    on->u.obj.first = first_lit;
    on->u.obj.count = b->g->n_lits - first_lit;
    on->u.obj.props = first_prop;
    on->u.obj.n_props = (uint32_t)n;
    on->u.obj.required = required;
    on->u.obj.deps = deps;
    on->u.obj.free_value = GRAM_NONE;
    on->u.obj.free_key = GRAM_NONE;
    *node = o;
    return 0;
}

/* Whether a repeated object or array item can always be turned into a new one: "]" of an
 * array item can give way to one more item (no maxItems). An object item is complete
 * when its last property is; a "}" before that can give way to one more property. Its
 * last property can then always be written differently: a string without maxLength,
 * pattern or format, or an array without maxItems, goes on where the repeat would be
 * certain; a number or a literal (enum, const, boolean, null) avoids, while it is read,
 * the values that would repeat an earlier item (recognizer.c, used_for), which needs
 * more values than the array has earlier items: at least `cap`. Returns 1, or 0 with
 * the property that fails in *bad (GRAM_NONE: the object has no properties). */
static int item_can_change(const gram_builder *b, uint32_t node, uint32_t cap, uint32_t *bad) {
    const gram_node *n = &b->g->nodes[node];
    *bad = GRAM_NONE;
    if (n->kind == GRAM_NODE_ARRAY) return n->u.arr.max == UINT32_MAX;
    if (n->kind != GRAM_NODE_OBJECT) return 1; /* scalars: see the scalar builders */
    if (!n->u.obj.n_props) return 0;
    for (uint32_t p = 0; p < n->u.obj.n_props; p++) {
        const uint32_t pn = b->g->prop_nodes[n->u.obj.props + p];
        const gram_node *v = &b->g->nodes[pn];
        const int scalar = v->kind == GRAM_NODE_NUMBER || v->kind == GRAM_NODE_LITERAL;
        if (!(v->kind == GRAM_NODE_STRING && v->u.str.dfa < 0 && v->u.str.max_len == UINT32_MAX) &&
            !(v->kind == GRAM_NODE_ARRAY && v->u.arr.max == UINT32_MAX) && !(scalar && gram_node_domain(b, pn) >= cap)) {
            *bad = p;
            return 0;
        }
    }
    return 1;
}

/* The name of property p of object node o (its first spelling), for messages. */
static void prop_name(const gram_builder *b, uint32_t o, uint32_t p, char *out, size_t cap) {
    const gram_node *n = &b->g->nodes[o];
    snprintf(out, cap, "?");
    for (uint32_t i = 0; i < n->u.obj.count; i++) {
        const gram_lit *e = &b->g->lits[n->u.obj.first + i];
        if (e->member == p) {
            snprintf(out, cap, "%.*s", e->len > 62 ? 62 : (int)e->len, (const char *)b->g->lit_bytes + e->off);
            return;
        }
    }
}

static int build_array(gram_builder *b, const cJSON *s, int ctx, uint32_t *node, int *depth) {
    const cJSON *items = kw(s, "items"), *uniq = kw(s, "uniqueItems");
    uint32_t min = 0, max = UINT32_MAX, item;
    int rc, d = 1;
    const int part = (ctx & (GRAM_CTX_UNIQUE_ITEM | GRAM_CTX_HASHED)) != 0;
    if ((rc = gram_get_count(b, s, "minItems", &min)) || (rc = gram_get_count(b, s, "maxItems", &max))) return rc;
    if (min > max) return gram_fail(b, "minItems (%u) > maxItems (%u)", min, max);
    if (uniq && !cJSON_IsBool(uniq)) return gram_fail(b, "uniqueItems must be a boolean");
    int unique = cJSON_IsTrue(uniq);
    if (unique && part) return gram_fail(b, "uniqueItems inside the items of a uniqueItems array is not supported");
    if (cJSON_IsArray(items)) return gram_fail(b, "items as an array (tuple validation) is not supported");
    if (!items || cJSON_IsTrue(items)) {
        if (unique || part) return gram_fail(b, "uniqueItems needs an items schema, in nested arrays too");
        if ((rc = any_value(b, &item))) return rc;
    } else {
        size_t m = gram_path_push(b, "items", 0);
        rc = gram_build_schema(b, items, unique ? GRAM_CTX_UNIQUE_ITEM : part ? GRAM_CTX_HASHED : 0, &item, &d);
        const uint32_t cap = max < GRAMMAR_MAX_UNIQUE ? max : GRAMMAR_MAX_UNIQUE;
        uint32_t bad = GRAM_NONE;
        if (!rc && unique && !item_can_change(b, item, cap, &bad)) {
            char name[80] = "";
            if (bad != GRAM_NONE) prop_name(b, item, bad, name, sizeof name);
            if (b->g->nodes[item].kind == GRAM_NODE_ARRAY)
                rc = gram_fail(b, "uniqueItems on array items needs item arrays without maxItems, so that a "
                                  "repeated item can always be changed");
            else if (bad == GRAM_NONE)
                rc = gram_fail(b, "uniqueItems on object items needs declared properties");
            else
                rc = gram_fail(b, "uniqueItems on object items: property %s can be written last and then cannot "
                                  "always differ from the other items (up to %u); every property must be a string "
                                  "without maxLength, pattern or format, an array without maxItems, or a number "
                                  "or enum with at least %u values (or lower maxItems)", name, cap, cap);
        }
        gram_path_pop(b, m);
        if (rc) return rc;
    }
    if (unique) {
        uint32_t dom = gram_node_domain(b, item), cap = max;
        if (dom < cap) cap = dom;
        if (cap > GRAMMAR_MAX_UNIQUE) cap = GRAMMAR_MAX_UNIQUE;
        if (min > cap)
            return gram_fail(b, "uniqueItems with minItems %u, but at most %u distinct items are possible", min, cap);
        max = cap;
    }
    uint32_t a = gram_new_node(b, GRAM_NODE_ARRAY);
    if (a == GRAM_NONE) return gram_oom(b);
    gram_node *an = &b->g->nodes[a];
    an->u.arr.items = item;
    an->u.arr.min = min;
    an->u.arr.max = max;
    an->u.arr.unique = (uint32_t)unique;
    *node = a;
    *depth = d + 1;
    return 0;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

enum { T_STRING = 1, T_NUMBER = 2, T_INTEGER = 4, T_BOOLEAN = 8, T_NULL = 16, T_OBJECT = 32, T_ARRAY = 64 };

static int type_bit(const char *t) {
    static const char *const names[] = {"string", "number", "integer", "boolean", "null", "object", "array"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return 1 << i;
    return 0;
}

static int schema_types(gram_builder *b, const cJSON *s, int *types) {
    const cJSON *t = kw(s, "type");
    *types = 0;
    if (cJSON_IsString(t)) {
        if (!(*types = type_bit(t->valuestring))) return gram_fail(b, "unknown type '%s'", t->valuestring);
    } else if (cJSON_IsArray(t)) {
        for (const cJSON *x = t->child; x; x = x->next) {
            int bit = cJSON_IsString(x) ? type_bit(x->valuestring) : 0;
            if (!bit) return gram_fail(b, "type must name JSON types");
            *types |= bit;
        }
        if (!*types) return gram_fail(b, "type must not be empty");
    } else if (t) {
        return gram_fail(b, "type must be a string or an array of strings");
    } else {
        static const char *const obj[] = {"properties", "required", "additionalProperties"};
        static const char *const arr[] = {"items", "minItems", "maxItems", "uniqueItems"};
        static const char *const str[] = {"minLength", "maxLength", "pattern", "format"};
        static const char *const num[] = {"minimum", "maximum", "exclusiveMinimum",
                                          "exclusiveMaximum", "multipleOf"};
        if (has_any(s, obj, 3)) *types |= T_OBJECT;
        if (has_any(s, arr, 4)) *types |= T_ARRAY;
        if (has_any(s, str, 4)) *types |= T_STRING;
        if (has_any(s, num, 5)) *types |= T_NUMBER;
    }
    if (cJSON_IsTrue(kw(s, "nullable")) && *types) *types |= T_NULL;
    if ((*types & T_NUMBER) && (*types & T_INTEGER)) *types &= ~T_INTEGER; /* number covers it */
    return 0;
}

/* "not" beside a schema without enum/const (those check it value by value,
 * compiler_enum.c): the complement of a type set is a type set, so {"not": {"type": T}}
 * is computed as the schema's types less T (its types as schema_types reads them, every
 * type when it names none or "not" takes all it implies); anything else under "not" is refused, naming it. *out: a copy
 * of s without "not" and with the remaining types, for the caller to build and delete. */
static int apply_not(gram_builder *b, const cJSON *s, cJSON **out) {
    static const char *const names[] = {"string", "number", "integer", "boolean", "null", "object", "array"};
    const cJSON *n = kw(s, "not");
    *out = NULL;
    size_t mark = gram_path_push(b, "not", 0);
    int rc = 0, outer = 0, excluded = 0;
    if (cJSON_IsFalse(n)) { /* excludes nothing */
    } else if (cJSON_IsTrue(n) || (cJSON_IsObject(n) && !n->child)) {
        rc = gram_fail(b, "not %s excludes every value", cJSON_IsTrue(n) ? "true" : "{}");
    } else if (!cJSON_IsObject(n)) {
        rc = gram_fail(b, "not must be a schema");
    } else {
        for (const cJSON *k = n->child; k && !rc; k = k->next)
            if (strcmp(k->string, "type") && strcmp(k->string, "title") && strcmp(k->string, "description"))
                rc = gram_fail(b, "only {\"type\": ...} is supported under not (found '%s'): the complement of "
                                  "other keywords is not computed",
                               k->string);
        if (!rc) rc = schema_types(b, n, &excluded);
    }
    gram_path_pop(b, mark);
    if (!rc) rc = schema_types(b, s, &outer);
    if (rc) return rc;
    const int all = T_STRING | T_NUMBER | T_BOOLEAN | T_NULL | T_OBJECT | T_ARRAY;
    if (excluded & T_NUMBER) excluded |= T_INTEGER;
    /* without "type" the keywords pick the types generated (a subset is sound); when "not"
     * takes them all, the other types are what JSON Schema still admits */
    if (!outer || (!kw(s, "type") && !(outer & ~excluded))) outer = all;
    if ((outer & T_NUMBER) && (excluded & T_INTEGER) && !(excluded & T_NUMBER)) {
        mark = gram_path_push(b, "not", 0);
        rc = gram_fail(b, "not integer beside number: numbers that are not integers cannot be generated");
        gram_path_pop(b, mark);
        return rc;
    }
    const int left = outer & ~excluded;
    if (!left) {
        mark = gram_path_push(b, "not", 0);
        rc = gram_fail(b, "not excludes every type the schema allows");
        gram_path_pop(b, mark);
        return rc;
    }
    cJSON *copy = cJSON_Duplicate(s, 1), *types = cJSON_CreateArray();
    if (!copy || !types) {
        cJSON_Delete(copy);
        cJSON_Delete(types);
        return gram_oom(b);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(copy, "not");
    cJSON_DeleteItemFromObjectCaseSensitive(copy, "nullable"); /* null is in the set or out */
    for (int i = 0; i < 7; i++)
        if (left >> i & 1) cJSON_AddItemToArray(types, cJSON_CreateString(names[i]));
    if (cJSON_GetObjectItemCaseSensitive(copy, "type")) cJSON_ReplaceItemInObjectCaseSensitive(copy, "type", types);
    else cJSON_AddItemToObject(copy, "type", types);
    *out = copy;
    return 0;
}

/* ---- $ref --------------------------------------------------------------------------------- */

/* Follows the JSON pointer of a local ref ("#", "#/$defs/A", "#/properties/x/items") from
 * the tool's parameters schema, undoing ~1 (/) and ~0 (~); NULL if it leads nowhere. */
static const cJSON *follow_pointer(const cJSON *root, const char *ref) {
    const cJSON *at = root;
    const char *p = ref + 1;
    char seg[256];
    while (at && *p == '/') {
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            if (n + 1 >= sizeof seg) return NULL;
            if (*p == '~') {
                if (p[1] != '0' && p[1] != '1') return NULL;
                seg[n++] = p[1] == '0' ? '~' : '/';
                p++;
            } else {
                seg[n++] = *p;
            }
        }
        seg[n] = 0;
        if (cJSON_IsObject(at)) {
            at = cJSON_GetObjectItemCaseSensitive(at, seg);
        } else if (cJSON_IsArray(at)) {
            char *end;
            long i = strtol(seg, &end, 10);
            if (!n || *end || (seg[0] == '0' && n > 1) || i < 0 || i >= cJSON_GetArraySize(at)) return NULL;
            at = cJSON_GetArrayItem(at, (int)i);
        } else {
            return NULL;
        }
    }
    return *p ? NULL : at;
}

const cJSON *gram_resolve_ref(gram_builder *b, const char *r) {
    if (r[0] != '#') {
        gram_fail(b, "$ref '%.120s' is not local: only refs into the tool's own schema (\"#/$defs/...\") "
                     "are supported", r);
        return NULL;
    }
    const cJSON *target = b->ref_root ? follow_pointer(b->ref_root, r) : NULL;
    if (!target) gram_fail(b, "$ref '%.120s' points at nothing in the tool's parameters", r);
    return target;
}

/* A schema with "$ref" is the schema it points at (inlined: the grammar has no rule
 * references). Only annotations may sit beside it, as pydantic writes them. A ref to a
 * schema that is being expanded (a tree type) would inline forever: it is refused. */
static int build_ref(gram_builder *b, const cJSON *s, int ctx, uint32_t *node, int *depth) {
    static const char *const annotations[] = {"$ref", "title", "description", "default", "examples",
        "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
    const cJSON *ref = kw(s, "$ref");
    for (const cJSON *k = s->child; k; k = k->next) {
        int ok = !strncmp(k->string, "x-", 2);
        for (size_t i = 0; !ok && i < sizeof annotations / sizeof annotations[0]; i++)
            ok = !strcmp(k->string, annotations[i]);
        if (!ok) return gram_fail(b, "keyword '%s' beside $ref is not supported", k->string);
    }
    if (!cJSON_IsString(ref)) return gram_fail(b, "$ref must be a string");
    const char *r = ref->valuestring;
    const cJSON *target = gram_resolve_ref(b, r);
    if (!target) return NEEDLE_ERR_SCHEMA;
    for (uint32_t i = 0; i < b->n_refs; i++)
        if (b->refs[i] == target)
            return gram_fail(b, "$ref '%.120s' is recursive (the schema contains itself), which is not supported", r);
    if (b->n_refs == GRAM_MAX_REF_DEPTH) return gram_fail(b, "$refs nest more than %d deep", GRAM_MAX_REF_DEPTH);
    if (++b->ref_expansions > GRAM_MAX_REF_EXPANSIONS)
        return gram_fail(b, "$refs expand to more than %d schemas", GRAM_MAX_REF_EXPANSIONS);
    b->refs[b->n_refs++] = target;
    int rc = gram_build_schema(b, target, ctx, node, depth);
    b->n_refs--;
    return rc;
}

int gram_build_schema(gram_builder *b, const cJSON *s, int ctx, uint32_t *node, int *depth) {
    int rc, types;
    *depth = 1;
    if (cJSON_IsObject(s) && kw(s, "$ref")) return build_ref(b, s, ctx, node, depth);
    if (cJSON_IsTrue(s)) {
        if (ctx & (GRAM_CTX_UNIQUE_ITEM | GRAM_CTX_HASHED)) return gram_fail(b, "uniqueItems needs items without free values");
        return any_value(b, node);
    }
    if (!cJSON_IsObject(s)) return gram_fail(b, "a schema must be an object");
    /* values listed: every other keyword only filters them (compiler_enum.c) */
    if (kw(s, "enum") || kw(s, "const")) return gram_build_literal(b, s, node);
    if (kw(s, "allOf")) { /* one schema, the intersection (compiler_allof.c) */
        cJSON *merged = NULL;
        if ((rc = gram_merge_all_of(b, s, &merged))) return rc;
        rc = gram_build_schema(b, merged, ctx, node, depth);
        cJSON_Delete(merged);
        return rc;
    }
    if (kw(s, "not")) { /* a type set (apply_not) */
        cJSON *rest = NULL;
        if ((rc = apply_not(b, s, &rest))) return rc;
        rc = gram_build_schema(b, rest, ctx, node, depth);
        cJSON_Delete(rest);
        return rc;
    }
    for (size_t i = 0; i < sizeof UNSUPPORTED / sizeof UNSUPPORTED[0]; i++)
        if (kw(s, UNSUPPORTED[i])) return gram_fail(b, "keyword '%s' is not supported", UNSUPPORTED[i]);
    if (kw(s, "anyOf")) return build_anyof(b, s, kw(s, "anyOf"), "anyOf", ctx, node, depth);
    if (kw(s, "oneOf")) return build_anyof(b, s, kw(s, "oneOf"), "oneOf", ctx, node, depth);
    if ((rc = schema_types(b, s, &types))) return rc;
    if (!types) {
        if (ctx & (GRAM_CTX_UNIQUE_ITEM | GRAM_CTX_HASHED)) return gram_fail(b, "uniqueItems needs items whose values have a type");
        return any_value(b, node);
    }
    if ((ctx & GRAM_CTX_UNIQUE_ITEM) && (types & (types - 1)))
        return gram_fail(b, "uniqueItems is only supported for items of one type");
    uint32_t alts[7], n = 0;
    static const char *const bools[] = {"false", "true"}, *const nulls[] = {"null"};
    for (int bit = 1; bit <= T_ARRAY; bit <<= 1) {
        if (!(types & bit)) continue;
        int d = 1;
        switch (bit) {
        case T_STRING: rc = gram_build_string(b, s, ctx, &alts[n]); break;
        case T_NUMBER: rc = gram_build_number(b, s, 0, ctx, &alts[n]); break;
        case T_INTEGER: rc = gram_build_number(b, s, 1, ctx, &alts[n]); break;
        case T_BOOLEAN: rc = gram_build_fixed_literal(b, bools, 2, &alts[n]); break;
        case T_NULL: rc = gram_build_fixed_literal(b, nulls, 1, &alts[n]); break;
        case T_OBJECT: rc = build_object(b, s, ctx, &alts[n], &d); break;
        default: rc = build_array(b, s, ctx, &alts[n], &d); break;
        }
        if (rc) return rc;
        if (d > *depth) *depth = d;
        n++;
    }
    return gram_make_union(b, alts, n, node);
}

/* ---- tools ------------------------------------------------------------------------------- */

void grammar_free(grammar *g) {
    if (!g) return;
    for (uint32_t i = 0; i < g->n_dfas; i++) gram_regex_free(&g->dfas[i]);
    for (uint32_t i = 0; i < g->n_tables; i++) free(g->tables[i].next);
    for (uint32_t i = 0; i < g->n_tools; i++) free(g->tool_names[i]);
    free(g->nodes);
    free(g->lits);
    free(g->lit_bytes);
    free(g->prop_nodes);
    free(g->dep_masks);
    free(g->picks);
    free(g->dfas);
    free(g->tables);
    free(g->tool_names);
    free(g->tool_args);
    free(g);
}

/* Compiles tool i (already unwrapped from {"type":"function","function":...}). */
static int build_tool(gram_builder *b, const cJSON *t, uint32_t i) {
    const cJSON *params = kw(t, "parameters");
    if (!params) params = kw(t, "input_schema");
    int rc, depth = 1;
    uint32_t node = GRAM_NONE;
    size_t m = gram_path_push(b, "parameters", 0);
    b->ref_root = params;
    b->n_refs = 0;
    b->ref_expansions = 0;
    if (!params) {
        static const char empty[] = "{\"type\":\"object\",\"properties\":{}}";
        cJSON *e = cJSON_Parse(empty);
        if (!e) return gram_oom(b);
        rc = build_object(b, e, 0, &node, &depth);
        cJSON_Delete(e);
    } else {
        const cJSON *type = kw(params, "type");
        if (!cJSON_IsObject(params) || (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "object"))))
            rc = gram_fail(b, "parameters must be an object schema");
        else rc = gram_build_schema(b, params, 0, &node, &depth);
        if (!rc && b->g->nodes[node].kind != GRAM_NODE_OBJECT) rc = gram_fail(b, "parameters must be an object schema");
    }
    gram_path_pop(b, m);
    if (rc) return rc;
    if (depth + 2 > GRAMMAR_MAX_DEPTH)
        return gram_fail(b, "schema nests %d levels deep; the limit is %d", depth, GRAMMAR_MAX_DEPTH - 2);
    b->g->tool_args[i] = node;
    return 0;
}

static int compile_tools(gram_builder *b, const cJSON *root) {
    grammar *g = b->g;
    if (!cJSON_IsArray(root))
        return needle_fail(NEEDLE_ERR_SCHEMA, "tools: the tools JSON must be an array of tools");
    int n = cJSON_GetArraySize(root), i = 0, rc;
    if (!n && !g->opt.allow_empty)
        return needle_fail(NEEDLE_ERR_SCHEMA, "tools: no tool declared and allow_empty is 0");
    g->tool_names = calloc((size_t)n + 1, sizeof *g->tool_names);
    g->tool_args = calloc((size_t)n + 1, sizeof *g->tool_args);
    if (!g->tool_names || !g->tool_args) return gram_oom(b);
    for (const cJSON *entry = root->child; entry; entry = entry->next, i++) {
        const cJSON *fn = kw(entry, "function"), *t = cJSON_IsObject(fn) ? fn : entry;
        const cJSON *name = cJSON_IsObject(t) ? kw(t, "name") : NULL;
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return needle_fail(NEEDLE_ERR_SCHEMA, "tools[%d]: missing or empty \"name\"", i);
        for (uint32_t j = 0; j < (uint32_t)i; j++)
            if (!strcmp(g->tool_names[j], name->valuestring))
                return needle_fail(NEEDLE_ERR_SCHEMA, "tools[%d]: duplicate tool name \"%.60s\"", i,
                                   name->valuestring);
        if (!(g->tool_names[i] = strdup(name->valuestring))) return gram_oom(b);
        g->n_tools = (uint32_t)i + 1;
        b->tool = g->tool_names[i];
        gram_path_pop(b, 0);
        if ((rc = build_tool(b, t, (uint32_t)i))) return rc;
    }
    /* names last, so that their entries are contiguous */
    g->names_first = g->n_lits;
    for (uint32_t t = 0; t < g->n_tools; t++) {
        for (int ascii = 0; ascii < 2; ascii++)
            if (gram_spell_string(b, g->tool_names[t], ascii) < 0) return gram_oom(b);
        gram_lit *x = &g->lits[g->n_lits - 2], *y = &g->lits[g->n_lits - 1];
        x->member = y->member = t;
        if (x->len == y->len && !memcmp(g->lit_bytes + x->off, g->lit_bytes + y->off, x->len)) g->n_lits--;
    }
    g->names_count = g->n_lits - g->names_first;
    gram_sort_lits(g, g->names_first, g->names_count);
    return 0;
}

int grammar_compile(const char *tools_json, size_t len, const grammar_options *opt, grammar **out) {
    if (!tools_json || !out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "grammar_compile: NULL argument");
    /* strict syntax and UTF-8 first: cJSON alone lets invalid UTF-8 through */
    char *canon = NULL;
    size_t canon_len = 0;
    int rc = grammar_json_canon(tools_json, len, &canon, &canon_len);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(canon, canon_len);
    free(canon);
    if (!root) return needle_fail(NEEDLE_ERR_JSON, "tools: malformed JSON");
    grammar *g = calloc(1, sizeof *g);
    if (!g) {
        cJSON_Delete(root);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "grammar: out of memory");
    }
    g->opt = opt ? *opt : grammar_default_options();
    gram_builder b = {0};
    b.g = g;
    b.any = b.free_str = GRAM_NONE;
    rc = compile_tools(&b, root);
    cJSON_Delete(root);
    if (rc) {
        grammar_free(g);
        return rc;
    }
    *out = g;
    return NEEDLE_OK;
}
