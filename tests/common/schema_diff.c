/* schema_diff.c: see schema_diff.h. */
#include "schema_diff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "needle.h"
#include "schema_check.h"

/* ---- random choices ------------------------------------------------------------------ */

void diff_rng_init(diff_rng *r, const uint8_t *data, size_t len, uint64_t seed) {
    r->data = data;
    r->len = len;
    r->pos = 0;
    r->s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < len; i++) r->s = (r->s ^ data[i]) * 0x100000001B3ull;
    if (!r->s) r->s = 1;
}

uint32_t diff_rand(diff_rng *r, uint32_t n) {
    if (n <= 1) return 0;
    if (r->pos < r->len) return r->data[r->pos++] % n;
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)((r->s >> 11) % n);
}

static int chance(diff_rng *r, int percent) { return (int)diff_rand(r, 100) < percent; }

/* ---- schemas ------------------------------------------------------------------------- */

static const char *const PATTERNS[] = {"^[a-z]+$", "^[A-Z]{2,3}$", "\\d{3}", "^(ab|cd)*$", "^[0-9]{4}-[0-9]{2}$",
                                       "x", "^a.c$", "^(?:foo|bar)\\d?$", "[aeiou]", "^\\w+@\\w+\\.com$",
                                       "^.{2,4}$", "^[^x]*$", "^-?[0-9]+(\\.[0-9]+)?$", "^\\s*$"};
static const char *const FORMATS[] = {"date", "time", "date-time", "email", "uuid", "ipv4", "hostname"};
static const char *const STRINGS[] = {"a", "aa", "abc", "", "x1", "2024-01-02", "2023-02-30", "\xc3\xa9",
                                      "foo", "bar7", "AB", "10.0.0.1", "a@b.com", "123"};
static const char *const KEYS[] = {"a", "b", "name", "qty", "id", "\xc3\xa9t\xc3\xa9"};
static const char *const TYPES[] = {"string", "integer", "number", "boolean", "null", "object", "array"};
#define N(a) (sizeof(a) / sizeof((a)[0]))

static double small_number(diff_rng *r) {
    double v = (double)diff_rand(r, 81) - 20;
    if (chance(r, 30)) v += (double)diff_rand(r, 4) * 0.25;
    return v;
}

static cJSON *random_value(diff_rng *r, int depth) {
    switch (diff_rand(r, depth > 0 ? 8 : 6)) {
    case 0: return cJSON_CreateNumber(small_number(r));
    case 1: return cJSON_CreateNumber((double)diff_rand(r, 12));
    case 2: return cJSON_CreateString(STRINGS[diff_rand(r, N(STRINGS))]);
    case 3: return cJSON_CreateBool(diff_rand(r, 2));
    case 4: return cJSON_CreateNull();
    case 5: return cJSON_CreateString(STRINGS[diff_rand(r, N(STRINGS))]);
    case 6: {
        cJSON *a = cJSON_CreateArray();
        for (int i = (int)diff_rand(r, 4); i > 0; i--) cJSON_AddItemToArray(a, random_value(r, depth - 1));
        return a;
    }
    default: {
        cJSON *o = cJSON_CreateObject();
        for (int i = (int)diff_rand(r, 3); i > 0; i--) {
            const char *k = KEYS[diff_rand(r, N(KEYS))];
            if (!cJSON_GetObjectItemCaseSensitive(o, k)) cJSON_AddItemToObject(o, k, random_value(r, depth - 1));
        }
        return o;
    }
    }
}

static void add_string_keywords(diff_rng *r, cJSON *s) {
    if (chance(r, 30)) cJSON_AddNumberToObject(s, "minLength", diff_rand(r, 4));
    if (chance(r, 30)) cJSON_AddNumberToObject(s, "maxLength", diff_rand(r, 9));
    if (chance(r, 30)) cJSON_AddStringToObject(s, "pattern", PATTERNS[diff_rand(r, N(PATTERNS))]);
    else if (chance(r, 20)) cJSON_AddStringToObject(s, "format", FORMATS[diff_rand(r, N(FORMATS))]);
}

static void add_number_keywords(diff_rng *r, cJSON *s) {
    static const double steps[] = {2, 3, 5, 0.5, 0.25, 0.1, 1.5};
    if (chance(r, 35)) cJSON_AddNumberToObject(s, "minimum", small_number(r));
    if (chance(r, 35)) cJSON_AddNumberToObject(s, "maximum", small_number(r));
    if (chance(r, 15)) cJSON_AddNumberToObject(s, "exclusiveMinimum", small_number(r));
    if (chance(r, 15)) cJSON_AddNumberToObject(s, "exclusiveMaximum", small_number(r));
    if (chance(r, 25)) cJSON_AddNumberToObject(s, "multipleOf", steps[diff_rand(r, N(steps))]);
}

static cJSON *random_schema(diff_rng *r, int depth);

static void add_object_keywords(diff_rng *r, cJSON *s, int depth) {
    cJSON *props = cJSON_AddObjectToObject(s, "properties"), *req = cJSON_CreateArray();
    for (int i = (int)diff_rand(r, 4); i > 0; i--) {
        const char *k = KEYS[diff_rand(r, N(KEYS))];
        if (cJSON_GetObjectItemCaseSensitive(props, k)) continue;
        cJSON_AddItemToObject(props, k, random_schema(r, depth - 1));
        if (chance(r, 50)) cJSON_AddItemToArray(req, cJSON_CreateString(k));
    }
    cJSON_AddItemToObject(s, "required", req);
    if (chance(r, 40)) cJSON_AddFalseToObject(s, "additionalProperties");
    if (chance(r, 30)) { /* names that need others, declared or not (then refused) */
        cJSON *dep = cJSON_AddObjectToObject(s, "dependentRequired");
        for (int i = 1 + (int)diff_rand(r, 2); i > 0; i--) {
            const char *k = KEYS[diff_rand(r, N(KEYS))];
            if (cJSON_GetObjectItemCaseSensitive(dep, k)) continue;
            cJSON *l = cJSON_AddArrayToObject(dep, k);
            for (int j = (int)diff_rand(r, 3); j > 0; j--) {
                const char *d = KEYS[diff_rand(r, N(KEYS))];
                if (chance(r, 80) && props->child) { /* mostly a declared one */
                    const cJSON *p = props->child;
                    for (uint32_t m = diff_rand(r, 4); m > 0 && p->next; m--) p = p->next;
                    d = p->string;
                }
                cJSON_AddItemToArray(l, cJSON_CreateString(d));
            }
        }
    }
}

/* "not" beside a schema: a type or two (their complement is computed), rarely something
 * the compiler refuses under not */
static void add_not(diff_rng *r, cJSON *s) {
    cJSON *n = cJSON_CreateObject();
    if (chance(r, 10)) {
        cJSON_AddNumberToObject(n, "minimum", 1);
    } else if (chance(r, 30)) {
        cJSON *t = cJSON_AddArrayToObject(n, "type");
        const uint32_t a = diff_rand(r, N(TYPES)), b = diff_rand(r, N(TYPES));
        cJSON_AddItemToArray(t, cJSON_CreateString(TYPES[a]));
        if (b != a) cJSON_AddItemToArray(t, cJSON_CreateString(TYPES[b]));
    } else if (!chance(r, 5)) {
        cJSON_AddStringToObject(n, "type", TYPES[diff_rand(r, N(TYPES))]);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(s, "not");
    cJSON_AddItemToObject(s, "not", n);
}

/* Object items of the kind tool schemas use with uniqueItems: a string and numbers,
 * enums or booleans ([{"name": string, "quantity": integer}]). */
static cJSON *record_schema(diff_rng *r) {
    cJSON *s = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    cJSON_AddStringToObject(s, "type", "object");
    for (int i = 1 + (int)diff_rand(r, 3); i > 0; i--) {
        const char *k = KEYS[diff_rand(r, N(KEYS))];
        if (cJSON_GetObjectItemCaseSensitive(props, k)) continue;
        cJSON *v = cJSON_CreateObject();
        switch (diff_rand(r, 4)) {
        case 0: cJSON_AddStringToObject(v, "type", "string"); break;
        case 1:
            cJSON_AddStringToObject(v, "type", chance(r, 50) ? "integer" : "number");
            add_number_keywords(r, v);
            break;
        case 2: cJSON_AddStringToObject(v, "type", "boolean"); break;
        default: {
            cJSON *e = cJSON_AddArrayToObject(v, "enum");
            for (int j = 1 + (int)diff_rand(r, 4); j > 0; j--) cJSON_AddItemToArray(e, random_value(r, 0));
        }
        }
        cJSON_AddItemToObject(props, k, v);
        if (chance(r, 60)) cJSON_AddItemToArray(req, cJSON_CreateString(k));
    }
    cJSON_AddItemToObject(s, "properties", props);
    cJSON_AddItemToObject(s, "required", req);
    return s;
}

static void add_array_keywords(diff_rng *r, cJSON *s, int depth) {
    if (chance(r, 25)) {
        cJSON_AddItemToObject(s, "items", record_schema(r));
        cJSON_AddTrueToObject(s, "uniqueItems");
        if (chance(r, 60)) cJSON_AddNumberToObject(s, "maxItems", 1 + diff_rand(r, 4));
        return;
    }
    cJSON_AddItemToObject(s, "items", random_schema(r, depth - 1));
    if (chance(r, 30)) cJSON_AddNumberToObject(s, "minItems", diff_rand(r, 3));
    if (chance(r, 30)) cJSON_AddNumberToObject(s, "maxItems", diff_rand(r, 5));
    if (chance(r, 30)) cJSON_AddTrueToObject(s, "uniqueItems");
}

/* enum or const with siblings that may contradict every value */
static cJSON *random_literal(diff_rng *r, int depth) {
    cJSON *s = cJSON_CreateObject();
    if (chance(r, 25)) {
        cJSON_AddItemToObject(s, "const", random_value(r, 1));
    } else {
        cJSON *e = cJSON_AddArrayToObject(s, "enum");
        for (int i = 1 + (int)diff_rand(r, 5); i > 0; i--) cJSON_AddItemToArray(e, random_value(r, 1));
    }
    if (chance(r, 60)) cJSON_AddStringToObject(s, "type", TYPES[diff_rand(r, N(TYPES))]);
    if (chance(r, 30)) add_string_keywords(r, s);
    if (chance(r, 30)) add_number_keywords(r, s);
    if (chance(r, 15)) {
        cJSON *n = cJSON_CreateObject();
        cJSON_AddItemToObject(n, "enum", cJSON_CreateArray());
        cJSON_AddItemToArray(cJSON_GetObjectItem(n, "enum"), random_value(r, 0));
        cJSON_AddItemToObject(s, "not", n);
    }
    if (chance(r, 10)) {
        cJSON *all = cJSON_AddArrayToObject(s, "allOf"), *x = cJSON_CreateObject();
        add_number_keywords(r, x);
        add_string_keywords(r, x);
        cJSON_AddItemToArray(all, x);
    }
    if (chance(r, 10)) {
        cJSON *any = cJSON_AddArrayToObject(s, chance(r, 50) ? "anyOf" : "oneOf");
        for (int i = 2; i > 0; i--) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "type", TYPES[diff_rand(r, 5)]);
            cJSON_AddItemToArray(any, x);
        }
    }
    if (chance(r, 10)) {
        cJSON *d = cJSON_AddObjectToObject(s, "dependentRequired"), *l = cJSON_CreateArray();
        cJSON_AddItemToArray(l, cJSON_CreateString("b"));
        cJSON_AddItemToObject(d, "a", l);
    }
    if (chance(r, 10)) {
        cJSON_AddTrueToObject(s, "uniqueItems");
        cJSON_AddNumberToObject(s, "maxItems", diff_rand(r, 3));
    }
    (void)depth;
    return s;
}

static cJSON *random_schema(diff_rng *r, int depth) {
    cJSON *s = cJSON_CreateObject();
    uint32_t kind = diff_rand(r, depth > 0 ? 14 : 8);
    switch (kind) {
    case 0:
    case 1:
        cJSON_AddStringToObject(s, "type", "string");
        add_string_keywords(r, s);
        break;
    case 2:
    case 3:
        cJSON_AddStringToObject(s, "type", kind == 2 ? "integer" : "number");
        add_number_keywords(r, s);
        break;
    case 4: cJSON_AddStringToObject(s, "type", chance(r, 50) ? "boolean" : "null"); break;
    case 5:
    case 6:
        cJSON_Delete(s);
        return random_literal(r, depth);
    case 7: { /* a type list */
        cJSON *t = cJSON_AddArrayToObject(s, "type");
        int a = (int)diff_rand(r, 5), b = (int)diff_rand(r, 5);
        cJSON_AddItemToArray(t, cJSON_CreateString(TYPES[a]));
        if (b != a) cJSON_AddItemToArray(t, cJSON_CreateString(TYPES[b]));
        if (chance(r, 50)) add_number_keywords(r, s);
        if (chance(r, 50)) add_string_keywords(r, s);
        if (chance(r, 20)) cJSON_AddTrueToObject(s, "nullable");
        break;
    }
    case 8:
    case 9:
        cJSON_AddStringToObject(s, "type", "object");
        if (chance(r, 85)) add_object_keywords(r, s, depth);
        break;
    case 10:
        cJSON_AddStringToObject(s, "type", "array");
        add_array_keywords(r, s, depth);
        break;
    case 12:
    case 13: { /* allOf: parts of one schema, or two schemas that may contradict */
        cJSON *all = cJSON_AddArrayToObject(s, "allOf");
        for (int i = 2; i > 0; i--) {
            cJSON *x;
            if (chance(r, 50)) {
                x = random_schema(r, depth - 1);
            } else {
                x = cJSON_CreateObject();
                if (chance(r, 50)) cJSON_AddStringToObject(x, "type", TYPES[diff_rand(r, N(TYPES))]);
                if (chance(r, 40)) add_number_keywords(r, x);
                if (chance(r, 40)) add_string_keywords(r, x);
                if (chance(r, 30)) add_object_keywords(r, x, depth);
            }
            cJSON_AddItemToArray(all, x);
        }
        break;
    }
    default: {
        cJSON *any = cJSON_AddArrayToObject(s, chance(r, 50) ? "anyOf" : "oneOf");
        for (int i = 2 + (int)diff_rand(r, 2); i > 0; i--) cJSON_AddItemToArray(any, random_schema(r, depth - 1));
        if (chance(r, 30)) add_number_keywords(r, s); /* keywords beside the list */
        if (chance(r, 20)) add_string_keywords(r, s);
        if (chance(r, 15)) cJSON_AddStringToObject(s, "type", TYPES[diff_rand(r, N(TYPES))]);
        break;
    }
    }
    if (chance(r, 8)) add_not(r, s);
    return s;
}

static char *random_tools(diff_rng *r) {
    cJSON *tools = cJSON_CreateArray();
    for (int t = 0, n = 1 + (int)diff_rand(r, 2); t < n; t++) {
        cJSON *tool = cJSON_CreateObject(), *p = cJSON_CreateObject();
        char name[16];
        snprintf(name, sizeof name, "tool%d", t);
        cJSON_AddStringToObject(tool, "name", name);
        cJSON_AddStringToObject(p, "type", "object");
        add_object_keywords(r, p, 3);
        cJSON_AddItemToObject(tool, "parameters", p);
        cJSON_AddItemToArray(tools, tool);
    }
    char *text = cJSON_PrintUnformatted(tools);
    cJSON_Delete(tools);
    return text;
}

/* ---- walks ----------------------------------------------------------------------------- */

enum { MAX_TEXT = 2048 };

static const char *const PIECES[] = {"\"", "\":", "\",\"", "{\"", "\"}", "[]", "}]", "}}]", "true", "false",
                                     "null", "\\u00e9", "\\ud83d\\ude00", "\xc3\xa9", "\xf0\x9f\x98\x80", "12",
                                     "-0.5", "00", "99999", "0.000", "2024-", "ab", "@", ".com", "\\\"", "\\n"};
static const char CLOSERS[] = "\"}],0123456789";

/* grammar_accept_bytes is all or nothing (st unchanged on a refusal): each byte scanned
 * costs one state copy, no more */
static int try_bytes(const grammar *g, grammar_state *st, const char *b, size_t n) {
    return grammar_accept_bytes(g, st, b, n);
}

/* One adversarial or random step; returns the bytes taken (0: none accepted). */
static size_t step(diff_rng *r, const grammar *g, grammar_state *st, char *text, size_t len) {
    uint32_t mode = diff_rand(r, 6);
    if (mode == 0 && len && try_bytes(g, st, &text[len - 1], 1)) { /* the same byte again */
        text[len] = text[len - 1];
        return 1;
    }
    if (mode == 1) {
        const char *p = PIECES[diff_rand(r, N(PIECES))];
        size_t n = strlen(p);
        if (len + n < MAX_TEXT && try_bytes(g, st, p, n)) {
            memcpy(text + len, p, n);
            return n;
        }
    }
    if (mode == 2) {
        char c = CLOSERS[diff_rand(r, sizeof CLOSERS - 1)];
        if (try_bytes(g, st, &c, 1)) {
            text[len] = c;
            return 1;
        }
    }
    /* any accepted byte, scanning from a random start */
    uint32_t start = diff_rand(r, 256);
    int printable = !chance(r, 10);
    for (uint32_t i = 0; i < 256; i++) {
        char c = (char)((start + i) & 0xFF);
        if (printable && ((uint8_t)c < 0x20 || (uint8_t)c >= 0x7F) && i < 256 - 1) {
            /* skip non-printables on the first pass; a second pass below covers them */
            continue;
        }
        if (try_bytes(g, st, &c, 1)) {
            text[len] = c;
            return 1;
        }
    }
    for (uint32_t c = 0; c < 256; c++) {
        char b = (char)c;
        if (try_bytes(g, st, &b, 1)) {
            text[len] = b;
            return 1;
        }
    }
    return 0;
}

static int finding(char *msg, size_t cap, const char *tools, const char *text, const char *fmt, const char *detail) {
    char head[640];
    snprintf(head, sizeof head, fmt, detail);
    snprintf(msg, cap, "%s\n  tools: %s\n  text: %s", head, tools, text ? text : "");
    return -1;
}

static int check_calls(const cJSON *tools, const char *tools_text, const char *text, char *msg, size_t cap,
                       diff_stats *st) {
    /* cJSON's strings end at a NUL, so "\u0000" would cut the value the validator sees: it
     * reads U+0001 instead, which every pattern, format and enum generated here treats as
     * it treats U+0000 (none names either) */
    char *copy = strdup(text);
    if (!copy) return finding(msg, cap, tools_text, text, "out of memory%s", "");
    for (char *p = copy; (p = strstr(p, "\\u0000")) != NULL; p += 6) {
        size_t slashes = 0; /* an escape only after an odd run of backslashes */
        while (p - slashes > copy && p[-1 - (long)slashes] == '\\') slashes++;
        if (slashes % 2 == 0) p[5] = '1';
    }
    cJSON *calls = cJSON_Parse(copy);
    free(copy);
    if (!cJSON_IsArray(calls)) {
        cJSON_Delete(calls);
        return finding(msg, cap, tools_text, text, "the completed call array does not parse%s", "");
    }
    int rc = 0;
    for (const cJSON *c = calls->child; c && !rc; c = c->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(c, "arguments");
        const cJSON *params = NULL;
        for (const cJSON *t = tools->child; t && cJSON_IsString(name); t = t->next)
            if (!strcmp(cJSON_GetObjectItem(t, "name")->valuestring, name->valuestring))
                params = cJSON_GetObjectItem(t, "parameters");
        if (!params || !args) {
            rc = finding(msg, cap, tools_text, text, "a call without a declared tool or arguments%s", "");
            break;
        }
        char why[400];
        if (!schema_check(params, params, args, why, sizeof why))
            rc = finding(msg, cap, tools_text, text, "a completed call violates its schema: %s", why);
        st->calls++;
    }
    cJSON_Delete(calls);
    return rc;
}

int diff_round(diff_rng *r, int walks, diff_stats *st, char *msg, size_t cap) {
    char *tools_text = random_tools(r);
    cJSON *tools = cJSON_Parse(tools_text);
    grammar *g = NULL;
    int rc = grammar_compile(tools_text, strlen(tools_text), NULL, &g);
    st->rounds++;
    if (rc != NEEDLE_OK) {
        const char *err = needle_last_error();
        st->refused++;
        if (rc != NEEDLE_ERR_SCHEMA) rc = finding(msg, cap, tools_text, NULL, "refused without NEEDLE_ERR_SCHEMA: %s", err);
        else if (!strstr(err, "tool \"tool") || !strstr(err, "parameters"))
            rc = finding(msg, cap, tools_text, NULL, "refusal without the tool and the path: %s", err);
        else rc = 0;
        cJSON_Delete(tools);
        free(tools_text);
        return rc;
    }
    rc = 0;
    st->accepted_not += strstr(tools_text, "\"not\"") != NULL;
    st->accepted_dependent += strstr(tools_text, "\"dependentRequired\"") != NULL;
    char *text = malloc(MAX_TEXT + 1024);
    for (int w = 0; w < walks && !rc && text; w++) {
        grammar_state s;
        grammar_state_init(g, &s);
        size_t len = 0, stop = diff_rand(r, 4) ? diff_rand(r, 600) : MAX_TEXT - 64;
        while (!grammar_is_complete(g, &s) && len < stop && len < MAX_TEXT - 64) {
            size_t n = step(r, g, &s, text, len);
            if (!n) {
                text[len] = 0;
                rc = finding(msg, cap, tools_text, text, "dead end: no byte continues the text%s", "");
                break;
            }
            len += n;
        }
        if (rc) break;
        if (!grammar_is_complete(g, &s)) {
            size_t n = 0;
            if (grammar_complete(g, &s, text + len, MAX_TEXT + 1023 - len, &n) != NEEDLE_OK) {
                text[len] = 0;
                rc = finding(msg, cap, tools_text, text, "grammar_complete failed: %s", needle_last_error());
                break;
            }
            if (!grammar_accept_bytes(g, &s, text + len, n) || !grammar_is_complete(g, &s)) {
                text[len + n] = 0;
                rc = finding(msg, cap, tools_text, text, "the completion is not accepted%s", "");
                break;
            }
            len += n;
        }
        text[len] = 0;
        st->walks++;
        st->bytes += len;
        rc = check_calls(tools, tools_text, text, msg, cap, st);
    }
    free(text);
    grammar_free(g);
    cJSON_Delete(tools);
    free(tools_text);
    return rc;
}
