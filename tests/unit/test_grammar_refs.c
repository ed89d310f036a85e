/* $ref in tool schemas: local refs ($defs, definitions, JSON pointers into the parameters,
 * ~0/~1 escapes, chains) are inlined and recognized like the schema they point at;
 * recursive, dangling and remote refs are refused with NEEDLE_ERR_SCHEMA naming the ref.
 * Ends with a constrained decode over a small vocabulary: every output is an instance. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "harness.h"
#include "needle.h"
#include "util/error.h"

#define MARK '`'
#define N(a) (sizeof(a) / sizeof((a)[0]))

/* What pydantic writes for class Trip(BaseModel): start: Place; stops: list[Place]; where
 * Place has a Point inside: refs to refs, $defs beside the properties. */
#define TRIP                                                                                             \
    "[{\"name\":\"plan\",\"parameters\":{\"$defs\":{"                                                     \
    "\"Point\":{\"properties\":{\"lat\":{\"type\":\"number\"},\"lon\":{\"type\":\"number\"}},"           \
    "\"required\":[\"lat\",\"lon\"],\"title\":\"Point\",\"type\":\"object\"},"                           \
    "\"Place\":{\"properties\":{\"name\":{\"type\":\"string\"},\"at\":{\"$ref\":\"#/$defs/Point\"}},"    \
    "\"required\":[\"name\"],\"title\":\"Place\",\"type\":\"object\"}},"                                 \
    "\"properties\":{\"start\":{\"$ref\":\"#/$defs/Place\",\"description\":\"where from\"},"             \
    "\"stops\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/Place\"}}},"                            \
    "\"required\":[\"start\"],\"type\":\"object\"}}]"

static grammar *compile(const char *tools, const grammar_options *opt) {
    grammar *g = NULL;
    int rc = grammar_compile(tools, strlen(tools), opt, &g);
    CHECK_MSG(rc == NEEDLE_OK, "compile failed (%d): %s\n  tools: %s", rc, needle_last_error(), tools);
    return rc == NEEDLE_OK ? g : NULL;
}

/* Valid text: every byte accepted and the call array complete. Marked text: the byte after
 * the mark is the first one refused. */
static void expect(const grammar *g, const char *text) {
    const char *mark = strchr(text, MARK);
    grammar_state st;
    grammar_state_init(g, &st);
    for (const char *p = text; *p; p++) {
        if (p == mark) continue;
        int ok = grammar_accept_byte(g, &st, (uint8_t)*p);
        if (mark && p == mark + 1) {
            CHECK_MSG(!ok, "byte %zu of %s accepted, expected refused", (size_t)(p - text), text);
            return;
        }
        if (!ok) {
            CHECK_MSG(0, "byte %zu of %s refused", (size_t)(p - text), text);
            return;
        }
    }
    if (mark) CHECK_MSG(0, "mark at the end of %s", text);
    else CHECK_MSG(grammar_is_complete(g, &st), "%s accepted but incomplete", text);
}

static void test_nested_models(void) {
    grammar *g = compile(TRIP, NULL);
    if (!g) return;
    static const char *const texts[] = {
        "[{\"name\":\"plan\",\"arguments\":{\"start\":{\"name\":\"Oslo\"}}}]",
        "[{\"name\":\"plan\",\"arguments\":{\"start\":{\"name\":\"Oslo\",\"at\":{\"lat\":59.9,\"lon\":10.7}}}}]",
        "[{\"name\":\"plan\",\"arguments\":{\"stops\":[{\"at\":{\"lon\":1,\"lat\":2},\"name\":\"x\"}],"
        "\"start\":{\"name\":\"y\"}}}]",
        /* the nested Point requires both coordinates */
        "[{\"name\":\"plan\",\"arguments\":{\"start\":{\"name\":\"Oslo\",\"at\":{\"lat\":59.9`}",
        /* Place has no property "lat"; $defs is not a property of the arguments */
        "[{\"name\":\"plan\",\"arguments\":{\"start\":{\"`lat\":1}}}]",
        "[{\"name\":\"plan\",\"arguments\":{\"`$defs\":{}}}]",
        "[{\"name\":\"plan\",\"arguments\":{\"start\":{\"name\":`1}}}]",
        "[{\"name\":\"plan\",\"arguments\":{\"stops\":[]`}}]",
    };
    for (size_t i = 0; i < N(texts); i++) expect(g, texts[i]);
    grammar_free(g);
}

static void test_pointers(void) {
    /* definitions (draft 7), a pointer into the properties, escapes ~1 (/) and ~0 (~), an
     * array index, and "#" (the parameters themselves, here inside an array item) */
    static const char tools[] =
        "[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"definitions\":{\"a/b\":{\"type\":\"integer\"},"
        "\"c~d\":{\"enum\":[\"x\",\"y\"]},\"alts\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]},"
        "\"properties\":{\"i\":{\"$ref\":\"#/definitions/a~1b\"},\"e\":{\"$ref\":\"#/definitions/c~0d\"},"
        "\"j\":{\"$ref\":\"#/properties/i\"},\"n\":{\"$ref\":\"#/definitions/alts/1\"}}}}]";
    grammar *g = compile(tools, NULL);
    if (!g) return;
    expect(g, "[{\"name\":\"f\",\"arguments\":{\"i\":3,\"e\":\"y\",\"j\":4,\"n\":null}}]");
    expect(g, "[{\"name\":\"f\",\"arguments\":{\"i\":`\"3\"}}]");
    expect(g, "[{\"name\":\"f\",\"arguments\":{\"j\":3`.5}}]");
    expect(g, "[{\"name\":\"f\",\"arguments\":{\"e\":\"`z\"}}]");
    expect(g, "[{\"name\":\"f\",\"arguments\":{\"n\":`true}}]");
    grammar_free(g);
    /* the whole parameters schema given by a ref */
    g = compile("[{\"name\":\"f\",\"parameters\":{\"$ref\":\"#/$defs/A\",\"$defs\":{\"A\":{\"type\":\"object\","
                "\"properties\":{\"k\":{\"type\":\"string\"}},\"required\":[\"k\"]}}}}]",
                NULL);
    if (!g) return;
    expect(g, "[{\"name\":\"f\",\"arguments\":{\"k\":\"v\"}}]");
    expect(g, "[{\"name\":\"f\",\"arguments\":{`}}]");
    grammar_free(g);
}

typedef struct ecase { const char *tools; const char *needle; } ecase;
#define P(props, defs)                                                                                    \
    "[{\"name\":\"t\",\"parameters\":{\"type\":\"object\",\"$defs\":{" defs "},\"properties\":{" props "}}}]"

static void test_refused(void) {
    static const ecase cases[] = {
        {P("\"v\":{\"$ref\":\"#/$defs/Nope\"}", ""), "$ref '#/$defs/Nope' points at nothing"},
        {P("\"v\":{\"$ref\":\"#/$defs/A/properties/zz\"}", "\"A\":{\"type\":\"object\"}"), "points at nothing"},
        {P("\"v\":{\"$ref\":\"#/$defs/a~2b\"}", "\"a~2b\":{}"), "points at nothing"},
        {P("\"v\":{\"$ref\":\"https://example.com/s.json#/A\"}", ""), "'https://example.com/s.json#/A' is not local"},
        {P("\"v\":{\"$ref\":\"other.json#/A\"}", ""), "is not local"},
        {P("\"v\":{\"$ref\":3}", ""), "$ref must be a string"},
        {P("\"v\":{\"$ref\":\"#/$defs/A\",\"type\":\"object\"}", "\"A\":{}"), "'type' beside $ref"},
        /* a tree: Node has children: list[Node] */
        {P("\"v\":{\"$ref\":\"#/$defs/Node\"}",
           "\"Node\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":"
           "\"#/$defs/Node\"}}}}"),
         "$ref '#/$defs/Node' is recursive"},
        /* mutual recursion and a ref to itself */
        {P("\"v\":{\"$ref\":\"#/$defs/A\"}", "\"A\":{\"$ref\":\"#/$defs/B\"},\"B\":{\"$ref\":\"#/$defs/A\"}"),
         "is recursive"},
        {P("\"v\":{\"$ref\":\"#/$defs/A\"}", "\"A\":{\"$ref\":\"#/$defs/A\"}"), "is recursive"},
        /* "#" from inside the parameters: the arguments object contains itself */
        {P("\"v\":{\"$ref\":\"#\"}", ""), "'#' is recursive"},
    };
    for (size_t i = 0; i < N(cases); i++) {
        grammar *g = NULL;
        needle_clear_error();
        int rc = grammar_compile(cases[i].tools, strlen(cases[i].tools), NULL, &g);
        CHECK_MSG(rc == NEEDLE_ERR_SCHEMA, "case %zu: got %d (%s)", i, rc, needle_last_error());
        CHECK_MSG(strstr(needle_last_error(), cases[i].needle) != NULL, "case %zu: \"%s\" lacks \"%s\"", i,
                  needle_last_error(), cases[i].needle);
        CHECK_MSG(strstr(needle_last_error(), "tool \"t\": parameters.properties.v") != NULL,
                  "case %zu: \"%s\" does not name the place", i, needle_last_error());
        CHECK(g == NULL);
        if (g) grammar_free(g);
    }
    /* a ref used twice at each of 14 levels would inline 2^14 schemas: refused, not built */
    char big[8192] = "[{\"name\":\"t\",\"parameters\":{\"type\":\"object\",\"$defs\":{";
    for (int i = 0; i < 14; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big),
                 "%s\"D%d\":{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/D%d\"},"
                 "\"b\":{\"$ref\":\"#/$defs/D%d\"}}}",
                 i ? "," : "", i, i + 1, i + 1);
    strcat(big, ",\"D14\":{\"type\":\"null\"}},\"properties\":{\"v\":{\"$ref\":\"#/$defs/D0\"}}}}]");
    grammar *g = NULL;
    CHECK_EQ_INT(grammar_compile(big, strlen(big), NULL, &g), NEEDLE_ERR_SCHEMA);
    CHECK_MSG(strstr(needle_last_error(), "expand to more than") != NULL, "%s", needle_last_error());
}

/* Random walks through the token mask: every completed output parses and matches TRIP. */
static int valid_place(const cJSON *p) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(p, "name"), *at = cJSON_GetObjectItemCaseSensitive(p, "at");
    int n = 0;
    for (const cJSON *k = p ? p->child : NULL; k; k = k->next) n++;
    if (!cJSON_IsObject(p) || !cJSON_IsString(name) || n != 1 + (at != NULL)) return 0;
    if (!at) return 1;
    n = 0;
    for (const cJSON *k = at->child; k; k = k->next) n++;
    return cJSON_IsObject(at) && n == 2 && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(at, "lat")) &&
           cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(at, "lon"));
}

static void test_decode(void) {
    static const char *const vocab[] = {"{", "}", "[", "]", ",", ":", "\"", "a", "1", ".5", "\"name\"",
                                        "\"at\"", "\"lat\"", "\"lon\"", "\"start\"", "\"stops\"", "\":",
                                        "{\"", "\"}", "}}", "},{", "\"lat\":", "lon", "s", "t", "r", "o", "p", "n", "m", "e", "l"};
    enum { NV = sizeof vocab / sizeof vocab[0] };
    size_t lens[NV];
    for (int i = 0; i < NV; i++) lens[i] = strlen(vocab[i]);
    grammar_trie *trie = NULL;
    CHECK(grammar_trie_build(vocab, lens, NV, &trie) == NEEDLE_OK);
    grammar_options one = grammar_default_options();
    one.single_call = 1;
    grammar *g = trie ? compile(TRIP, &one) : NULL;
    uint64_t rng = 99;
    int decodes = 0;
    for (int run = 0; g && run < 200; run++) {
        grammar_state st;
        grammar_state_init(g, &st);
        char text[4096];
        size_t n = (size_t)snprintf(text, sizeof text, "[{\"name\":\"plan\",\"arguments\":");
        CHECK(grammar_accept_bytes(g, &st, text, n));
        uint8_t allowed[NV];
        for (int step = 0; step < 200 && !grammar_is_complete(g, &st); step++) {
            uint32_t n_allowed = grammar_mask(g, &st, trie, allowed);
            CHECK_MSG(n_allowed > 0, "dead end after %.*s", (int)n, text);
            if (!n_allowed) break;
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t pick = (uint32_t)(rng >> 33) % n_allowed, t = 0;
            while (!allowed[t] || pick--) t++;
            if (n + lens[t] >= sizeof text - 512) break;
            CHECK(grammar_accept_bytes(g, &st, vocab[t], lens[t]));
            memcpy(text + n, vocab[t], lens[t]);
            n += lens[t];
        }
        size_t m = 0;
        CHECK(grammar_complete(g, &st, text + n, sizeof text - n - 1, &m) == NEEDLE_OK);
        text[n + m] = 0;
        cJSON *calls = cJSON_Parse(text);
        const cJSON *args = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "arguments");
        const cJSON *stops = cJSON_GetObjectItemCaseSensitive(args, "stops");
        int ok = valid_place(cJSON_GetObjectItemCaseSensitive(args, "start"));
        if (stops) {
            ok = ok && cJSON_IsArray(stops);
            for (const cJSON *x = stops->child; x; x = x->next) ok = ok && valid_place(x);
        }
        CHECK_MSG(ok, "not an instance: %s", text);
        decodes++;
        cJSON_Delete(calls);
    }
    CHECK_EQ_INT(decodes, 200);
    grammar_free(g);
    grammar_trie_free(trie);
}

int main(void) {
    RUN(test_nested_models);
    RUN(test_pointers);
    RUN(test_refused);
    RUN(test_decode);
    return test_summary();
}
