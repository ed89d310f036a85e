/* Unions of object schemas (anyOf/oneOf of objects, pydantic's Union[A, B]): the two ways
 * alternatives are told apart (a const discriminator, distinct required keys), the bytes
 * refused where the text would stop matching every alternative, the compile errors of
 * unions that cannot be told apart, and decodes whose every output matches exactly one
 * branch, checked by a checker written apart from the grammar. Random unions are walked
 * in test_grammar_walk.c, and masks on the real vocabulary in test_grammar_mask.c. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "harness.h"
#include "needle.h"

#define MARK '`'

/* As pydantic 2 writes Pet = Annotated[Union[Cat, Dog], Field(discriminator="pet_type")]. */
#define PETS                                                                                                   \
    "{\"type\":\"object\",\"properties\":{\"pet\":{\"discriminator\":{\"mapping\":{\"cat\":\"#/$defs/Cat\","    \
    "\"dog\":\"#/$defs/Dog\"},\"propertyName\":\"pet_type\"},\"oneOf\":[{\"$ref\":\"#/$defs/Cat\"},"             \
    "{\"$ref\":\"#/$defs/Dog\"}],\"title\":\"Pet\"},\"owner\":{\"type\":\"string\"}},\"required\":[\"pet\"],"    \
    "\"$defs\":{\"Cat\":{\"properties\":{\"pet_type\":{\"const\":\"cat\",\"title\":\"Pet Type\",\"type\":"      \
    "\"string\"},\"meows\":{\"type\":\"integer\"},\"name\":{\"type\":\"string\"}},\"required\":[\"pet_type\","  \
    "\"meows\"],\"title\":\"Cat\",\"type\":\"object\"},\"Dog\":{\"properties\":{\"pet_type\":{\"enum\":"        \
    "[\"dog\"],\"title\":\"Pet Type\",\"type\":\"string\"},\"barks\":{\"type\":\"number\"},\"name\":{\"type\":"  \
    "\"string\"}},\"required\":[\"pet_type\",\"barks\"],\"title\":\"Dog\",\"type\":\"object\"}}}"

/* As pydantic writes Union[Point2D, Point3D, Circle] | None: told apart by required keys. */
#define SHAPES                                                                                                 \
    "{\"type\":\"object\",\"properties\":{\"shape\":{\"anyOf\":[{\"$ref\":\"#/$defs/P2\"},{\"$ref\":"           \
    "\"#/$defs/P3\"},{\"$ref\":\"#/$defs/Circle\"},{\"type\":\"null\"}]}},\"required\":[\"shape\"],\"$defs\":"  \
    "{\"P2\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},\"y\":{\"type\":\"integer\"}},"  \
    "\"required\":[\"x\",\"y\"]},\"P3\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},"      \
    "\"y\":{\"type\":\"integer\"},\"z\":{\"type\":\"integer\"}},\"required\":[\"x\",\"y\",\"z\"]},\"Circle\":"  \
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\"},\"r\":{\"type\":\"number\","            \
    "\"minimum\":0}},\"required\":[\"r\"]}}}"

static grammar *compile_params(const char *params) {
    char tools[4096];
    snprintf(tools, sizeof tools, "[{\"name\":\"f\",\"parameters\":%s}]", params);
    grammar *g = NULL;
    int rc = grammar_compile(tools, strlen(tools), NULL, &g);
    CHECK_MSG(rc == NEEDLE_OK, "compile failed (%d): %s", rc, needle_last_error());
    return rc == NEEDLE_OK ? g : NULL;
}

/* args: the arguments object, with at most one MARK: unmarked text must be accepted and
 * complete the array; marked text accepted up to the mark and refused at the byte after. */
static void expect(const grammar *g, const char *args) {
    char text[1024];
    snprintf(text, sizeof text, "[{\"name\":\"f\",\"arguments\":%s}]", args);
    const char *mark = strchr(text, MARK);
    grammar_state st;
    grammar_state_init(g, &st);
    for (const char *p = text; *p; p++) {
        if (p == mark) continue;
        int ok = grammar_accept_byte(g, &st, (uint8_t)*p);
        if (mark && p == mark + 1) {
            CHECK_MSG(!ok, "'%c' after %.*s accepted, expected refused", *p, (int)(mark - text), text);
            return;
        }
        if (!ok) {
            CHECK_MSG(0, "byte %d ('%c') of %s refused", (int)(p - text), *p, text);
            return;
        }
    }
    CHECK_MSG(!mark, "mark at the end of %s", text);
    if (!mark) CHECK_MSG(grammar_is_complete(g, &st), "%s accepted but incomplete", text);
}

static void test_discriminated(void) {
    grammar *g = compile_params(PETS);
    if (!g) return;
    static const char *const cases[] = {
        "{\"pet\":{\"pet_type\":\"cat\",\"meows\":3}}",
        "{\"pet\":{\"pet_type\":\"dog\",\"barks\":1.5,\"name\":\"Rex\"},\"owner\":\"Ann\"}",
        "{\"owner\":\"Ann\",\"pet\":{\"name\":\"Tom\",\"pet_type\":\"cat\",\"meows\":0}}", /* shared key first */
        "{\"pet\":{\"meows\":2,\"pet_type\":\"cat\"}}",      /* a key of one alternative commits it */
        "{\"pet\":{\"pet_type\":\"cat\",\"`barks\":1}}",       /* Dog's key after the cat commit */
        "{\"pet\":{\"pet_type\":\"c`o\"}}",                    /* no such discriminator value */
        "{\"pet\":{\"pet_type\":\"cat\"`}}",                   /* meows is required */
        "{\"pet\":{\"meows\":2,\"pet_type\":\"`dog\"}}",       /* the Cat commit excludes "dog" */
        "{\"pet\":{\"barks\":1,\"`meows\":1}}",
        "{\"pet\":{\"name\":\"a\"`}}",                          /* neither alternative is complete */
        "{\"pet\":{\"`color\":1}}",                             /* declared by neither */
        "{\"pet\":`null}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect(g, cases[i]);
    grammar_free(g);
}

static void test_required_keys(void) {
    grammar *g = compile_params(SHAPES);
    if (!g) return;
    static const char *const cases[] = {
        "{\"shape\":{\"y\":1,\"x\":2}}",
        "{\"shape\":{\"y\":1,\"x\":2,\"z\":3}}",
        "{\"shape\":{\"z\":3,\"y\":2,\"x\":1}}",
        "{\"shape\":{\"r\":2.5}}",
        "{\"shape\":{\"r\":2.5,\"x\":\"c\"}}", /* x after the Circle commit is a string */
        "{\"shape\":null}",
        /* x is an integer in P2/P3, a string in Circle: its first byte tells them apart */
        "{\"shape\":{\"x\":1,\"y\":2}}",
        "{\"shape\":{\"x\":1,\"y\":2,\"z\":3}}",
        "{\"shape\":{\"x\":\"c\",\"r\":1}}",
        "{\"shape\":{\"x\":\"c\",\"`y\":1}}",
        "{\"shape\":{\"x\":1,\"`r\":1}}",
        "{\"shape\":{\"x\":`true}}",
        "{\"shape\":{\"y\":1,\"x\":`\"a\"}}", /* y leaves P2 and P3, where x is an integer */
        "{\"shape\":{\"y\":1,\"z\":2`}}",
        "{\"shape\":{\"y\":1,\"`r\":2}}",
        "{\"shape\":{\"r\":-`1}}",
        "{\"shape\":{`}}", /* every alternative has a required key */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect(g, cases[i]);
    grammar_free(g);
}

/* Unions inside arrays, nested unions, numbers and booleans as discriminators. */
static void test_shapes_of_unions(void) {
    grammar *g = compile_params(
        "{\"type\":\"object\",\"properties\":{\"ops\":{\"type\":\"array\",\"items\":{\"oneOf\":["
        "{\"type\":\"object\",\"properties\":{\"v\":{\"const\":1},\"a\":{\"type\":\"string\"}},\"required\":[\"v\",\"a\"]},"
        "{\"type\":\"object\",\"properties\":{\"v\":{\"const\":2},\"b\":{\"type\":\"boolean\"}},\"required\":[\"v\"]},"
        "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"v\":{\"const\":12}},\"required\":[\"v\"]},"
        "{\"type\":\"object\",\"properties\":{\"v\":{\"enum\":[true]}},\"required\":[\"v\"]}]}]}}},"
        "\"required\":[\"ops\"]}");
    if (!g) return;
    static const char *const cases[] = {
        "{\"ops\":[{\"v\":1,\"a\":\"x\"},{\"v\":2},{\"v\":12},{\"v\":true},{\"v\":2.0,\"b\":false}]}",
        "{\"ops\":[{\"v\":1`}]}",
        "{\"ops\":[{\"v\":1`3}]}",
        "{\"ops\":[{\"v\":2,\"`a\":\"x\"}]}",
        "{\"ops\":[{\"v\":`false}]}",
        "{\"ops\":[{\"b\":true,\"v\":2}]}",
        "{\"ops\":[{\"b\":true,\"v\":`1}]}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect(g, cases[i]);
    grammar_free(g);
}

/* An optional discriminator left out: "}" only where one alternative alone is complete
 * (here never: both are empty without it), so that oneOf holds. */
static void test_optional_discriminator(void) {
    grammar *g = compile_params(
        "{\"type\":\"object\",\"properties\":{\"u\":{\"oneOf\":["
        "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"n\":{\"type\":\"integer\"}}},"
        "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"c\"},\"n\":{\"type\":\"integer\"}}}]}},"
        "\"required\":[\"u\"]}");
    if (!g) return;
    static const char *const cases[] = {
        "{\"u\":{\"kind\":\"a\"}}",
        "{\"u\":{\"n\":1,\"kind\":\"c\"}}",
        "{\"u\":{`}}",
        "{\"u\":{\"n\":1`}}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect(g, cases[i]);
    grammar_free(g);
}

static void test_errors(void) {
    static const struct { const char *params, *msg; } cases[] = {
        /* issue 31 (found by test_grammar_diff): oneOf over open objects, where {"a": 1}
         * written for [0] is also valid against [1], which does not forbid undeclared keys */
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":"
         "{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"type\":\"object\",\"properties\":{}}]}}}",
         "parameters.properties.u.oneOf: oneOf[0] and oneOf[1]: an object written for [0] may also be valid against [1]"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":"
         "{\"const\":\"a\"},\"n\":{\"type\":\"integer\"}}},{\"type\":\"object\",\"properties\":{\"k\":"
         "{\"const\":\"c\"},\"m\":{\"type\":\"string\"}}}]}}}",
         "oneOf[0] and oneOf[1]"},
        /* found by test_grammar_diff: {"minimum": 1} also admits true, which [1] writes */
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"oneOf\":[{\"minimum\":1},{\"type\":\"boolean\"}]}}}",
         "oneOf[0] does not say its type"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":"
         "{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
         "\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}]}}}",
         "parameters.properties.u.anyOf: alternatives [0] and [1] are objects that cannot be told apart"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":"
         "{\"const\":\"x\"}}},{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"y\",\"x\"]}}}]}}}",
         "cannot be told apart"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"x\":"
         "{\"type\":\"integer\"}},\"required\":[\"x\"]},{\"type\":\"object\",\"properties\":{\"x\":{\"type\":"
         "\"number\"},\"y\":{\"type\":\"integer\"}},\"required\":[\"x\",\"y\"]}]}}}",
         "alternative [0] can never be chosen: the properties that would tell it apart (such as \"x\")"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\","
         "\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}]}}}",
         "alternative [0] is a free-form object"},
        {"{\"type\":\"object\",\"properties\":{\"u\":{\"type\":\"array\",\"uniqueItems\":true,\"items\":{\"type\":"
         "\"object\",\"properties\":{\"p\":{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"object\","
         "\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]},{\"type\":\"object\",\"properties\":"
         "{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}}}}}}}",
         "a union of objects inside the items of a uniqueItems array is not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tools[2048];
        snprintf(tools, sizeof tools, "[{\"name\":\"f\",\"parameters\":%s}]", cases[i].params);
        grammar *g = NULL;
        int rc = grammar_compile(tools, strlen(tools), NULL, &g);
        CHECK_EQ_INT(rc, NEEDLE_ERR_SCHEMA);
        CHECK_MSG(rc != NEEDLE_OK || !g, "compiled: %s", cases[i].params);
        CHECK_MSG(strstr(needle_last_error(), cases[i].msg) != NULL, "message \"%s\" lacks \"%s\"",
                  needle_last_error(), cases[i].msg);
        CHECK_MSG(strstr(needle_last_error(), "tool \"f\"") != NULL, "message lacks the tool: %s", needle_last_error());
        grammar_free(g);
    }
}

/* Which alternative of PETS a parsed pet is: 0 Cat, 1 Dog, -1 neither or both. Written
 * from the schema, not from the grammar. */
static int pet_branch(const cJSON *pet) {
    int fits[2] = {1, 1};
    static const char *const kind[2] = {"cat", "dog"}, *const own[2] = {"meows", "barks"};
    for (int b = 0; b < 2; b++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(pet, "pet_type");
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(pet, own[b]);
        fits[b] = cJSON_IsString(t) && !strcmp(t->valuestring, kind[b]) && cJSON_IsNumber(o) &&
                  (b || o->valuedouble == (double)(long long)o->valuedouble);
        for (const cJSON *c = pet->child; c && fits[b]; c = c->next)
            fits[b] = !strcmp(c->string, "pet_type") || !strcmp(c->string, own[b]) ||
                      (!strcmp(c->string, "name") && cJSON_IsString(c));
    }
    return fits[0] == fits[1] ? -1 : fits[1];
}

static uint64_t rng = 7;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 11) % n);
}

/* Random walks over the allowed bytes (closing bytes preferred after a while), then
 * grammar_complete: every output parses and its pet is exactly one of Cat and Dog; both
 * occur. */
static void test_decode(void) {
    grammar *g = compile_params(PETS);
    if (!g) return;
    int seen[2] = {0, 0};
    for (int w = 0; w < 200; w++) {
        grammar_state st;
        grammar_state_init(g, &st);
        char text[4096];
        size_t len = 0;
        size_t stop = 5 + rnd(80);
        while (!grammar_is_complete(g, &st) && len < stop) {
            int cand[256], n = 0;
            for (int b = 0x20; b < 0x7f; b++) {
                grammar_state tmp = st;
                if (grammar_accept_byte(g, &tmp, (uint8_t)b)) cand[n++] = b;
            }
            CHECK_MSG(n > 0, "dead end after %.*s", (int)len, text);
            if (!n) break;
            int b = cand[rnd((uint32_t)n)];
            grammar_accept_byte(g, &st, (uint8_t)b);
            text[len++] = (char)b;
        }
        size_t more = 0;
        CHECK(grammar_complete(g, &st, text + len, sizeof text - len - 1, &more) == NEEDLE_OK);
        len += more;
        text[len] = 0;
        cJSON *calls = cJSON_Parse(text);
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 0), "arguments");
        const cJSON *pet = cJSON_GetObjectItemCaseSensitive(args, "pet");
        int branch = cJSON_IsObject(pet) ? pet_branch(pet) : -2;
        CHECK_MSG(branch >= 0 || (!cJSON_GetArraySize(calls) && calls), "not one branch: %s", text);
        if (branch >= 0) seen[branch]++;
        cJSON_Delete(calls);
    }
    CHECK_MSG(seen[0] > 0 && seen[1] > 0, "cats %d, dogs %d", seen[0], seen[1]);
    grammar_free(g);
}

int main(void) {
    RUN(test_discriminated);
    RUN(test_required_keys);
    RUN(test_shapes_of_unions);
    RUN(test_optional_discriminator);
    RUN(test_errors);
    RUN(test_decode);
    return test_summary();
}
