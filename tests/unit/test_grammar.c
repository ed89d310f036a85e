/* Grammar tests, table driven: for every supported keyword, values that must be accepted
 * byte by byte and complete the call array, and values that must be rejected at a given
 * byte (marked with a backtick in the tables: the byte after the mark is the first one
 * refused, everything before it is accepted). Then the call-array surface, options, the
 * API contract, and schema errors (each with NEEDLE_ERR_SCHEMA or NEEDLE_ERR_JSON and a
 * message naming the tool and the path), and an exhaustive walk over short number prefixes.
 * Random schemas and walks are in test_grammar_walk.c, masks on the real vocabulary in
 * test_grammar_mask.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "harness.h"
#include "needle.h"
#include "util/error.h"

#define MARK '`'

static grammar *compile(const char *tools, const grammar_options *opt) {
    grammar *g = NULL;
    int rc = grammar_compile(tools, strlen(tools), opt, &g);
    CHECK_MSG(rc == NEEDLE_OK, "compile failed (%d): %s\n  tools: %s", rc, needle_last_error(), tools);
    return rc == NEEDLE_OK ? g : NULL;
}

/* Feeds `text` (with at most one MARK) to g. Valid text: every byte accepted and the array
 * complete. Marked text: the bytes before the mark accepted, the one after it rejected. */
static void expect(const grammar *g, const char *text, const char *what) {
    const char *mark = strchr(text, MARK);
    grammar_state st;
    grammar_state_init(g, &st);
    size_t n = strlen(text), i = 0;
    for (const char *p = text; p < text + n; p++) {
        if (p == mark) continue;
        int ok = grammar_accept_byte(g, &st, (uint8_t)*p);
        if (mark && p == mark + 1) {
            CHECK_MSG(!ok, "%s: byte %zu ('%c') of %s accepted, expected rejected", what, i, *p, text);
            return;
        }
        if (!ok) {
            CHECK_MSG(0, "%s: byte %zu (0x%02x) of %s rejected", what, i, (uint8_t)*p, text);
            return;
        }
        i++;
    }
    if (mark) CHECK_MSG(0, "%s: mark at the end of %s", what, text);
    else CHECK_MSG(grammar_is_complete(g, &st), "%s: %s accepted but incomplete", what, text);
}

/* A one-tool grammar whose arguments are {"v": <schema>} with v required; each case is the
 * text of v. */
typedef struct vcase { const char *schema; const char *values[16]; } vcase;

static void run_value_cases(const vcase *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char tools[2048], text[1024];
        snprintf(tools, sizeof tools,
                 "[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"v\":%s},"
                 "\"required\":[\"v\"]}}]", cases[i].schema);
        grammar *g = compile(tools, NULL);
        if (!g) continue;
        for (int k = 0; k < 16 && cases[i].values[k]; k++) {
            snprintf(text, sizeof text, "[{\"name\":\"f\",\"arguments\":{\"v\":%s}}]", cases[i].values[k]);
            expect(g, text, cases[i].schema);
        }
        grammar_free(g);
    }
}

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void test_strings(void) {
    static const vcase cases[] = {
        {"{\"type\":\"string\"}",
         {"\"abc\"", "\"\"", "\"a\\\"b\\\\c\\/\\b\\f\\n\\r\\t\"", "\"caf\\u00e9\"", "\"caf\xc3\xa9\"",
          "\"\\ud83d\\ude00\"", "\"\xf0\x9f\x98\x80 \x7f\"", "\"`\x01\"", "\"\\`q\"", "\"\\ud`c00\"",
          "\"\\ud83d`x\"", "\"\\ud83d\\ud`800\"", "\"`\xc0\xaf\"", "\"\xe0`\x80\x80\"", "\"\xed`\xa0\x80\"",
          "\"\xc3`x\""}},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
         {"\"ab\"", "\"abc\"", "\"\xc3\xa9\xc3\xa9\"", "\"\\u00e9\\u00e9\\u00e9\"", "\"\\ud83d\\ude00x\"",
          "\"a`\"", "\"abc`d\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9`\xc3\"", "\"abc`\\u0041\""}},
        {"{\"type\":\"string\",\"maxLength\":0}", {"\"\"", "\"`a\""}},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-\\\\d{2,4}$\"}",
         {"\"ABC-12\"", "\"ABC-1234\"", "\"AB`1\"", "\"ABC-1`\"", "\"ABC-1234`5\"", "\"`abc\""}},
        {"{\"type\":\"string\",\"pattern\":\"(cat|dog)s?\"}",
         {"\"cats\"", "\"dog\"", "\"\\u0063at\"", "\"c`ow\"", "\"cats`s\""}},
        {"{\"type\":\"string\",\"pattern\":\"[^a-c]x|\\\\.\\\\w+\"}",
         {"\"dx\"", "\"\xc3\xa9x\"", "\".a_1\"", "\"`ax\"", "\".`-\""}},
        {"{\"type\":\"string\",\"pattern\":\"[a-z]+\",\"maxLength\":3}", {"\"abc\"", "\"abc`d\"", "\"`\"\""}},
        {"{\"type\":\"string\",\"pattern\":\"a*b?\",\"minLength\":2}", {"\"aab\"", "\"ab\"", "\"a`\"", "\"`ba\""}},
        {"{\"type\":\"string\",\"pattern\":\"\\u00e9+\"}", {"\"\xc3\xa9\"", "\"\\u00e9\\u00e9\"", "\"\\u00`f\""}},
        {"{\"type\":\"string\",\"pattern\":\"x.y\"}", {"\"x\\u00e9y\"", "\"x\\ud83d\\ude00y\"", "\"x\\`ny\""}},
        {"{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-28\"", "\"2024-1`3-01\"", "\"2024-01-3`2\""}},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", /* RFC 3339: seconds and offset required */
         {"\"2024-01-01T10:00:00Z\"", "\"2024-01-01t10:00:00.123+02:00\"", "\"2024-01-01`x\"",
          "\"2024-01-01T2`5:00\"", "\"2024-01-01T10:00`\"", "\"2024-01-01` 10:00:00Z\""}},
        {"{\"type\":\"string\",\"format\":\"time\"}",
         {"\"23:59:59Z\"", "\"07:30:00+02:00\"", "\"2`4:00\"", "\"07:`60\"", "\"07:30`\"", "\"07:30:00`\""}},
        {"{\"type\":\"string\",\"format\":\"email\"}", {"\"a.b+c@ex.co.uk\"", "\"a@b`\"", "\"`@b.c\""}},
        {"{\"type\":\"string\",\"format\":\"uri\"}", {"\"https://x.org/a?b=c#d\"", "\"`1http:x\"", "\"http`\""}},
        {"{\"type\":\"string\",\"format\":\"uuid\"}",
         {"\"123e4567-e89b-12d3-a456-426614174000\"", "\"123e456`-\"", "\"123e4567-e89`g\""}},
        {"{\"type\":\"string\",\"format\":\"ipv4\"}", {"\"192.168.0.1\"", "\"25`6.1.1.1\"", "\"1.2.3`\""}},
        {"{\"type\":\"string\",\"format\":\"color\"}", {"\"anything\""}}, /* unknown: annotation */
    };
    run_value_cases(cases, N(cases));
}

static void test_numbers(void) {
    static const vcase cases[] = {
        /* issue 31: no bounds = the JSON-safe range |x| <= 2^53 in at most 17 digits, no
         * exponent (what a double reaching the tool holds; a digit loop ends) */
        {"{\"type\":\"number\"}",
         {"0.00001", "-9007199254740992", "9007199254740992.0", "3.14", "-0.0", "0.0000000000000001", "1`E5",
          "0`1", "`.5", "1.`e5", "-`}", "1`e", "900719925474099`3", "9007199254740992.`1", "0.0000000000000000`1",
          "12345678.123456789`1"}},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
         {"0", "1", "0.5", "1.0", "0.999", "-0", "-0.`5", "1.`5", "`2", "1`e5", "1.0000000000000000`1"}},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}",
         {"0.1", "9.99", "0.000000000000000001", "0`}", "1`0", "9.999999999999998", "9.99999999999999`9", "`-1"}},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-2.5}", {"-2.5", "-2.50", "-2.`4", "`2"}},
        {"{\"type\":\"number\",\"maximum\":0.1}", {"0.1", "-1`e5", "0.1`1", "0.10`1", "-99"}},
        {"{\"type\":\"integer\"}", {"-42", "0", "9007199254740992", "-9007199254740992", "1`.0", "0`1", "-`a",
                                    "1`e3", "900719925474099`3", "-900719925474099`3", "6323232323232323`2"}},
        {"{\"type\":\"integer\",\"maximum\":1e17}", {"9007199254740992", "900719925474099`3"}},
        {"{\"type\":\"number\",\"minimum\":0}", {"9007199254740992", "900719925474099`3", "0.5"}},
        {"{\"type\":\"integer\",\"minimum\":10,\"maximum\":20}", {"10", "20", "15", "2`1", "`9", "`3", "1`}"}},
        {"{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":true}", {"6", "50", "5`}", "`-1"}},
        {"{\"type\":\"integer\",\"multipleOf\":5}", {"15", "0", "-5", "7`}", "1000000000000000"}},
        {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":100,\"multipleOf\":25}", {"75", "100", "7`6", "10`}"}},
        {"{\"type\":\"integer\",\"multipleOf\":0.5}", {"3", "-8", "3`.0"}},
        {"{\"type\":\"number\",\"multipleOf\":0.01}", {"1.25", "-3.1", "2", "2.0", "1.250", "1.25`5", "1`e2"}},
        {"{\"type\":\"number\",\"multipleOf\":0.5,\"minimum\":0,\"maximum\":2}", {"1.5", "2.0", "0", "1.`2", "2.`5"}},
        {"{\"type\":\"number\",\"multipleOf\":3}", {"9", "9.0", "9.`5", "1`}"}},
        {"{\"type\":\"number\",\"maximum\":1e30}", {"12345", "-1"}},
        {"{\"type\":\"number\",\"minimum\":-1e30,\"exclusiveMaximum\":1e-20}", {"0", "-5.5", "`1"}},
    };
    run_value_cases(cases, N(cases));
}

/* Every number prefix up to 6 bytes for tricky bounds: each must have a continuation
 * (no dead end), and each number the grammar lets end must be in range, a multiple of
 * the step, and an integer where asked (checked with strtod, not the grammar's decimals). */
typedef struct nbound { const char *schema; double lo, hi; int lo_excl, hi_excl, integer; double step; } nbound;

static void explore(const grammar *g, const grammar_state *st, char *buf, int len, const nbound *nb,
                    int *ends) {
    static const char alphabet[] = "-0123456789.e+}";
    int any = 0;
    for (const char *a = alphabet; *a; a++) {
        grammar_state tmp;
        grammar_state_copy(&tmp, st);
        if (!grammar_accept_byte(g, &tmp, (uint8_t)*a)) continue;
        any = 1;
        if (*a == '}') {
            buf[len] = 0;
            double v = strtod(buf, NULL), q = nb->step ? v / nb->step : 0;
            int ok = (nb->lo_excl ? v > nb->lo : v >= nb->lo) && (nb->hi_excl ? v < nb->hi : v <= nb->hi) &&
                     (!nb->integer || !strpbrk(buf, ".e")) && fabs(q - round(q)) < 1e-9;
            CHECK_MSG(ok, "%s: number %s should not end", nb->schema, buf);
            (*ends)++;
        } else if (len < 6) {
            buf[len] = *a;
            explore(g, &tmp, buf, len + 1, nb, ends);
        }
    }
    buf[len] = 0;
    CHECK_MSG(any, "%s: dead end after number prefix '%s'", nb->schema, buf);
}

static void test_number_prefixes(void) {
    static const nbound cases[] = {
        {"{\"type\":\"integer\",\"minimum\":10,\"maximum\":20}", 10, 20, 0, 0, 1, 0},
        {"{\"type\":\"integer\",\"minimum\":-15,\"maximum\":-3,\"multipleOf\":4}", -15, -3, 0, 0, 1, 4},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":99,\"maximum\":1000,\"multipleOf\":7}", 99, 1000, 1, 0, 1, 7},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", 0, 1, 0, 0, 0, 0},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":0.5}", 0, 0.5, 1, 1, 0, 0},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-2.5}", -2.5, -2.5, 0, 0, 0, 0},
        {"{\"type\":\"number\",\"minimum\":-1,\"maximum\":1,\"multipleOf\":0.25}", -1, 1, 0, 0, 0, 0.25},
        {"{\"type\":\"number\",\"maximum\":0.1}", -1e300, 0.1, 0, 0, 0, 0},
        {"{\"type\":\"number\",\"minimum\":123.456,\"maximum\":1000}", 123.456, 1000, 0, 0, 0, 0},
        {"{\"type\":\"number\",\"minimum\":-0.003,\"exclusiveMaximum\":0.002}", -0.003, 0.002, 0, 1, 0, 0},
    };
    for (size_t i = 0; i < N(cases); i++) {
        char tools[512], buf[16];
        snprintf(tools, sizeof tools, "[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
                 "{\"v\":%s},\"required\":[\"v\"]}}]", cases[i].schema);
        grammar *g = compile(tools, NULL);
        if (!g) continue;
        grammar_state st;
        grammar_state_init(g, &st);
        const char *head = "[{\"name\":\"f\",\"arguments\":{\"v\":";
        CHECK(grammar_accept_bytes(g, &st, head, strlen(head)));
        int ends = 0;
        explore(g, &st, buf, 0, &cases[i], &ends);
        CHECK(ends > 0);
        grammar_free(g);
    }
}

static void test_literals(void) {
    static const vcase cases[] = {
        {"{\"type\":\"boolean\"}", {"true", "false", "t`x", "`null", "true`e"}},
        {"{\"type\":\"null\"}", {"null", "`0", "nul`}"}},
        {"{\"enum\":[\"red\",\"green\",\"blue\"]}", {"\"red\"", "\"blue\"", "\"r`x\"", "\"gre`y\"", "\"red`2\"",
                                                     "\"`\\u0072ed\""}},
        {"{\"enum\":[\"caf\xc3\xa9\",\"\\u00fc\"]}", {"\"caf\xc3\xa9\"", "\"caf\\u00e9\"", "\"\\u00fc\"", "\"\xc3\xbc\"",
                                                      "\"caf\\u00`c9\""}},
        {"{\"enum\":[1,2.5,10]}", {"1", "1.0", "2.5", "10", "10.0", "2`}", "`3", "10.`5", "1.`5"}},
        {"{\"enum\":[null,\"a\",1,true,{\"k\":[1,2]}]}",
         {"null", "\"a\"", "1", "true", "{\"k\":[1,2]}", "{\"k\":[1,`3]}", "{\"`j\"", "`false"}},
        {"{\"const\":\"fixed\"}", {"\"fixed\"", "\"fixed`2\"", "\"`\""}},
        {"{\"type\":\"integer\",\"enum\":[1,2]}", {"1", "2", "`\"1\""}}, /* tools.py Literal[1, 2] */
        /* issue 31: every keyword beside enum/const filters the values (jsonschema's verdict) */
        {"{\"type\":\"integer\",\"enum\":[1,50],\"maximum\":10}", {"1", "`50", "1`0"}},
        {"{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}", {"\"a\"", "\"b\"", "`1"}}, /* Literal["a", 1] */
        {"{\"type\":\"string\",\"enum\":[\"ab\",\"ax\",\"b\"],\"pattern\":\"a[a-c]\"}", {"\"ab\"", "\"a`x\"", "\"`b\""}},
        {"{\"type\":\"string\",\"enum\":[\"2024-01-02\",\"soon\"],\"format\":\"date\"}", {"\"2024-01-02\"", "\"`soon\""}},
        {"{\"enum\":[\"a\",\"bb\",\"ccc\"],\"minLength\":2,\"maxLength\":2}", {"\"bb\"", "\"`a\"", "\"`ccc\""}},
        {"{\"type\":[\"integer\",\"null\"],\"enum\":[1,null,\"x\",2.5]}", {"1", "null", "`\"x\"", "`2.5"}},
        {"{\"type\":\"number\",\"enum\":[3,4.5,5],\"multipleOf\":1.5}", {"4.5", "3", "`5"}},
        {"{\"type\":\"integer\",\"enum\":[1,2,3],\"exclusiveMinimum\":1,\"exclusiveMaximum\":3}", {"2", "`1", "`3"}},
        {"{\"type\":\"integer\",\"enum\":[1,2,3],\"minimum\":1,\"exclusiveMinimum\":true}", {"2", "3", "`1"}}, /* draft 4 */
        {"{\"type\":\"boolean\",\"enum\":[true,1,\"false\"]}", {"true", "`1", "`f"}},
        {"{\"enum\":[\"a\",\"b\",\"c\"],\"const\":\"b\"}", {"\"b\"", "\"`a\""}},
        {"{\"enum\":[\"a\",\"b\",\"c\"],\"not\":{\"enum\":[\"b\"]}}", {"\"a\"", "\"c\"", "\"`b\""}},
        {"{\"enum\":[1,2,3,4],\"allOf\":[{\"minimum\":2},{\"maximum\":3}]}", {"2", "3", "`1", "`4"}},
        {"{\"enum\":[1,\"a\",true],\"anyOf\":[{\"type\":\"string\"},{\"type\":\"boolean\"}]}", {"\"a\"", "true", "`1"}},
        {"{\"enum\":[5,10,15],\"oneOf\":[{\"multipleOf\":5},{\"multipleOf\":3}]}", {"5", "10", "1`5"}},
        {"{\"enum\":[[1,1],[1,2],[1,2,3]],\"uniqueItems\":true,\"maxItems\":2,\"items\":{\"type\":\"integer\"}}",
         {"[1,2]", "[1,`1", "[1,2`,"}},
        {"{\"enum\":[{\"a\":1},{\"a\":1,\"b\":2},{\"b\":2},{\"a\":\"x\"}],\"type\":\"object\",\"required\":[\"a\"],"
         "\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false}", {"{\"a\":1}", "{\"a\":1`,", "{\"`b", "{\"a\":`\""}},
        {"{\"enum\":[{\"a\":1},{\"a\":1,\"b\":2}],\"dependentRequired\":{\"a\":[\"b\"]},\"minProperties\":1}",
         {"{\"a\":1,\"b\":2}", "{\"a\":1`}"}},
        {"{\"enum\":[\"x\",\"y\"],\"$defs\":{\"X\":{\"const\":\"x\"}},\"not\":{\"$ref\":\"#/properties/v/$defs/X\"}}",
         {"\"y\"", "\"`x\""}},
    };
    run_value_cases(cases, N(cases));
}

/* issue 31: allOf as the intersection of its entries (compiler_allof.c) */
static void test_all_of(void) {
    static const vcase cases[] = {
        {"{\"allOf\":[{}]}", {"1", "\"s\"", "null"}},
        {"{\"allOf\":[{\"$ref\":\"#/properties/v/$defs/U\"}],\"description\":\"pydantic v1\","
         "\"$defs\":{\"U\":{\"type\":\"string\",\"enum\":[\"a\",\"b\"]}}}", {"\"a\"", "\"b\"", "\"`c"}},
        {"{\"allOf\":[{\"type\":\"integer\",\"minimum\":0},{\"maximum\":10}]}", {"5", "10", "1`1", "-`1", "0`.5"}},
        {"{\"allOf\":[{\"type\":\"number\"},{\"type\":[\"integer\",\"string\"]}]}", {"3", "`\"", "3`.5"}},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]},"
         "{\"properties\":{\"b\":{\"type\":\"integer\"}},\"required\":[\"b\"]}]}",
         {"{\"a\":\"x\",\"b\":1}", "{\"b\":1,\"a\":\"x\"}", "{\"a\":\"x\"`}", "{\"`c"}},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0}}},"
         "{\"properties\":{\"a\":{\"maximum\":3}}}],\"required\":[\"a\"]}", {"{\"a\":3}", "{\"a\":`4", "{\"a\":-`1"}},
        {"{\"allOf\":[{\"enum\":[1,2,3]},{\"enum\":[2,3,4]}]}", {"2", "3", "`1", "`4"}},
        /* keywords beside anyOf/oneOf hold for every alternative */
        {"{\"minimum\":0,\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}",
         {"5", "\"x\"", "-`1", "\"x`y"}},
        {"{\"type\":\"object\",\"required\":[\"a\"],\"oneOf\":[{\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\"]},"
         "{\"properties\":{\"a\":{\"const\":2},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}]}",
         {"{\"a\":1}", "{\"a\":2,\"b\":\"s\"}", "{\"a\":`3", "{\"a\":1`,"}},
        {"{\"allOf\":[{\"type\":\"string\",\"maxLength\":3},{\"minLength\":2,\"maxLength\":5}]}",
         {"\"ab\"", "\"abc\"", "\"a`\"", "\"abc`d"}},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"additionalProperties\":false},"
         "{\"properties\":{\"b\":{},\"c\":{}}}]}", {"{\"a\":1,\"b\":2}", "{\"`c"}},
    };
    run_value_cases(cases, N(cases));
}

static void test_objects(void) {
    static const vcase cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
         "\"required\":[\"a\"]}",
         {"{\"a\":1}", "{\"b\":\"x\",\"a\":2}", "{\"b\":\"x\"`}", "{\"a\":1,\"`a\":2}", "{\"`c\":1}", "{`}",
          "{` \"a\":1}", "{\"a\"` :1}", "{\"a\":1,\"b\":\"\"`,", "{\"a\":`\"1\"}"}},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"boolean\"}}}", {"{}", "{\"x\":true}"}},
        {"{\"type\":\"object\",\"additionalProperties\":false}", {"{}", "{`\"x\":1}"}},
        {"{\"type\":\"object\"}",
         {"{\"x\":[1,{\"y\":null}],\"z\":\"w\"}", "{}", "{\"x\"` :1}", "{\"\":{\"\":[]}}", "{\"a\":1,`}"}},
        {"{\"type\":\"object\",\"properties\":{\"na\xc3\xafve\":{\"type\":\"integer\"}}}",
         {"{\"na\xc3\xafve\":1}", "{\"na\\u00efve\":1}", "{\"na\\u00`f\""}},
        {"{\"properties\":{\"ab\":{\"type\":\"null\"},\"a\":{\"type\":\"null\"}},\"required\":[\"a\",\"ab\"]}",
         {"{\"a\":null,\"ab\":null}", "{\"ab\":null,\"a\":null}", "{\"a\":null`}", "{\"ab\":null,\"a`b\""}},
        {"{\"type\":\"object\",\"properties\":{\"o\":{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"array\","
         "\"items\":{\"type\":\"integer\"}}},\"required\":[\"p\"]}}}",
         {"{\"o\":{\"p\":[1,2]}}", "{\"o\":{\"p\":[]}}", "{\"o\":{`}}"}},
        {"true", {"[1,{\"a\":\"b\"},null]", "-0.0005", "-0.5`e-3", "\"s\"", "` 1"}},
        {"{}", {"{\"k\":[true,false]}", "`x"}},
    };
    run_value_cases(cases, N(cases));
}

static void test_arrays(void) {
    static const vcase cases[] = {
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
         {"[1]", "[1,2,3]", "[`]", "[1,2,3`,", "[1,`]", "[1` ,2]"}},
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"uniqueItems\":true}",
         {"[\"a\",\"b\"]", "[]", "[\"b\"]", "[\"a\",\"`a\"]", "[\"a\",\"b\"`,"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":3},\"uniqueItems\":true,"
         "\"minItems\":3}",
         {"[1,2,3]", "[3,1,2]", "[1,`1", "[1,2`]", "[1,2,3`,"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}",
         {"[\"a\",\"b\",\"ab\"]", "[\"a\",\"a`\"]", "[\"\\u0061\",\"a`\"]", "[\"\",\"`\"]"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"uniqueItems\":true}",
         {"[1,1.5,2]", "[1,1.0`]", "[0,-0`]", "[0.5,0.50`]", "[1,10]"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"uniqueItems\":true}", {"[true,false]", "[true,false`,"}},
        {"{\"type\":\"array\",\"items\":{\"enum\":[1,12]},\"uniqueItems\":true}", {"[1,12]", "[12,1]", "[1,1`]", "[12,1`2"}},
        {"{\"type\":\"array\"}", {"[1,\"a\",[],{}]", "[]", "[`}"}},
        {"{\"type\":\"array\",\"maxItems\":0}", {"[]", "[`1]"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"maxItems\":1}}",
         {"[[],[null]]", "[[null`,null]]"}},
    };
    run_value_cases(cases, N(cases));
}

/* uniqueItems on objects and arrays: items compare as JSON values (members in any order,
 * strings by code points, numbers by value); a repeat is refused at the byte that makes
 * it certain: "}" or "]", or the byte completing an object's last property. */
static void test_unique_compound(void) {
#define OBJ_AB "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\"}}"
#define NUMS "{\"type\":\"array\",\"items\":{\"type\":\"number\"}}"
    static const vcase cases[] = {
        {"{\"type\":\"array\",\"uniqueItems\":true,\"items\":" OBJ_AB ",\"required\":[\"a\"]}}",
         {"[{\"a\":\"x\"},{\"a\":\"y\"}]", "[{\"a\":\"x\"},{\"a\":\"x\",\"b\":\"y\"}]",
          "[{\"a\":\"x\",\"b\":\"y\"},{\"b\":\"y\",\"a\":\"z\"}]", "[{\"a\":\"x\"},{\"a\":\"xx\"}]",
          "[{\"a\":\"x\"},{\"a\":\"x\"`}]", "[{\"a\":\"x\"},{\"a\":\"\\u0078\"`}]",
          "[{\"a\":\"x\",\"b\":\"y\"},{\"b\":\"y\",\"a\":\"x`\"}]",
          "[{\"a\":\"x\",\"b\":\"y\"},{\"a\":\"x\",\"b\":\"y`\"}]",
          "[{\"a\":\"x\",\"b\":\"\"},{\"b\":\"\",\"a\":\"x`\"}]"}},
        {"{\"type\":\"array\",\"uniqueItems\":true,\"items\":" OBJ_AB "}}",
         {"[{},{\"a\":\"\"}]", "[{},{`}]", "[{\"b\":\"1\"},{\"a\":\"1\"}]"}},
        /* issue 31: numbers and enums in object items, [{"name": string, "quantity": integer}]:
         * written last, a number or literal avoids the values that would repeat an item */
        {"{\"type\":\"array\",\"uniqueItems\":true,\"items\":{\"type\":\"object\",\"properties\":{\"name\":"
         "{\"type\":\"string\"},\"quantity\":{\"type\":\"integer\"}},\"required\":[\"name\",\"quantity\"]}}",
         {"[{\"name\":\"a\",\"quantity\":1},{\"name\":\"a\",\"quantity\":2}]",
          "[{\"name\":\"a\",\"quantity\":1},{\"name\":\"a\",\"quantity\":12}]",
          "[{\"name\":\"a\",\"quantity\":1},{\"quantity\":1,\"name\":\"b\"}]",
          "[{\"name\":\"a\",\"quantity\":1},{\"name\":\"a\",\"quantity\":1`}",
          "[{\"name\":\"a\",\"quantity\":1},{\"name\":\"a\",\"quantity\":1`.0",
          "[{\"name\":\"a\",\"quantity\":1},{\"quantity\":1,\"name\":\"a`\"",
          "[{\"name\":\"a\",\"quantity\":0},{\"name\":\"a\",\"quantity\":`0",
          "[{\"name\":\"a\",\"quantity\":-5},{\"name\":\"a\",\"quantity\":-5`}"}},
        {"{\"type\":\"array\",\"uniqueItems\":true,\"maxItems\":2,\"items\":{\"type\":\"object\",\"properties\":"
         "{\"s\":{\"type\":\"string\"},\"b\":{\"type\":\"boolean\"},\"k\":{\"enum\":[\"x\",\"y\"]}},"
         "\"required\":[\"s\",\"b\",\"k\"]}}",
         {"[{\"s\":\"q\",\"b\":true,\"k\":\"x\"},{\"s\":\"q\",\"k\":\"x\",\"b\":false}]",
          "[{\"s\":\"q\",\"b\":true,\"k\":\"x\"},{\"s\":\"q\",\"k\":\"x\",\"b\":`true",
          "[{\"s\":\"q\",\"b\":true,\"k\":\"x\"},{\"s\":\"q\",\"b\":true,\"k\":\"`x",
          "[{\"s\":\"q\",\"b\":true,\"k\":\"x\"},{\"s\":\"q\",\"b\":true,\"k\":\"y\"}]"}},
        {"{\"type\":\"array\",\"uniqueItems\":true,\"items\":" NUMS "}",
         {"[[1,2],[2,1],[1],[]]", "[[1,2],[1,2`]]", "[[1],[1.0`]]", "[[],[`]]", "[[0.5],[0.50`]]",
          "[[1],[1,1]]"}},
        {"{\"type\":\"array\",\"uniqueItems\":true,\"items\":{\"type\":\"object\",\"properties\":{\"n\":" NUMS
         "},\"required\":[\"n\"]}}",
         {"[{\"n\":[1]},{\"n\":[2]}]", "[{\"n\":[1]},{\"n\":[1.0`]}]"}},
        {"{\"type\":\"array\",\"uniqueItems\":true,\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\","
         "\"properties\":{\"k\":{\"enum\":[1,\"x\"]},\"m\":{\"type\":\"boolean\"}}}}}",
         {"[[{\"k\":1,\"m\":true}],[{\"m\":true,\"k\":1.0}`]]", "[[{\"k\":1}],[{\"k\":\"x\"}],[{}]]",
          "[[{\"k\":\"x\",\"m\":false}],[{\"m\":false,\"k\":\"x\"}`]]"}},
    };
#undef OBJ_AB
#undef NUMS
    run_value_cases(cases, N(cases));
}

/* Random decodes through token masks over a small vocabulary that makes repeats likely:
 * every finished array parses, and no two of its items are equal JSON values. */
static void test_unique_compound_decode(void) {
    static const char *const vocab[] = {"{", "}", "[", "]", ",", ":", "\"", "a", "b", "\"a\"", "\"b\"",
                                        "{\"a\":\"", "\"}", "\"},", "}]", "\\u0061", "1", "1.0", "[1]",
                                        "],[", "[],", "\",\"b\":\"", "]}"};
    enum { NV = sizeof vocab / sizeof vocab[0] };
    size_t lens[NV];
    for (int i = 0; i < NV; i++) lens[i] = strlen(vocab[i]);
    grammar_trie *trie = NULL;
    CHECK(grammar_trie_build(vocab, lens, NV, &trie) == NEEDLE_OK);
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\"}},"
        "\"required\":[\"a\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"number\"}}"};
    uint64_t rng = 12345;
    int decodes = 0;
    for (size_t k = 0; k < N(schemas) && trie; k++) {
        char tools[512];
        snprintf(tools, sizeof tools,
                 "[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
                 "\"array\",\"uniqueItems\":true,\"minItems\":4,\"items\":%s}},\"required\":[\"v\"]}}]",
                 schemas[k]);
        grammar_options one = grammar_default_options();
        one.single_call = 1; /* the vocabulary cannot spell a second call */
        grammar *g = compile(tools, &one);
        if (!g) continue;
        for (int run = 0; run < 150; run++) {
            grammar_state st;
            grammar_state_init(g, &st);
            char text[4096];
            size_t n = (size_t)snprintf(text, sizeof text, "[{\"name\":\"f\",\"arguments\":{\"v\":");
            CHECK(grammar_accept_bytes(g, &st, text, n));
            uint8_t allowed[NV];
            for (int step = 0; step < 300 && !grammar_is_complete(g, &st); step++) {
                uint32_t n_allowed = grammar_mask(g, &st, trie, allowed);
                CHECK_MSG(n_allowed > 0, "dead end after %.*s", (int)n, text);
                if (!n_allowed) break;
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                uint32_t pick = (uint32_t)(rng >> 33) % n_allowed, t = 0;
                while (!allowed[t] || pick--) t++;
                for (int i = 0; i < NV; i++) /* a repeat is what the walk tries first */
                    if (allowed[i] && !strcmp(vocab[i], "\"},") && (rng >> 20) % 2) t = (uint32_t)i;
                if (n + lens[t] >= sizeof text - 256) break;
                CHECK(grammar_accept_bytes(g, &st, vocab[t], lens[t]));
                memcpy(text + n, vocab[t], lens[t]);
                n += lens[t];
            }
            size_t m = 0;
            CHECK(grammar_complete(g, &st, text + n, sizeof text - n - 1, &m) == NEEDLE_OK);
            text[n + m] = 0;
            cJSON *calls = cJSON_Parse(text);
            const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "arguments"), "v");
            CHECK_MSG(cJSON_IsArray(v) && cJSON_GetArraySize(v) >= 4, "output %s", text);
            for (const cJSON *x = v ? v->child : NULL; x; x = x->next)
                for (const cJSON *y = v->child; y != x; y = y->next)
                    CHECK_MSG(!cJSON_Compare(x, y, 1), "repeated item in %s", text);
            decodes++;
            cJSON_Delete(calls);
        }
        grammar_free(g);
    }
    CHECK_EQ_INT(decodes, 300);
    grammar_trie_free(trie);
}

static void test_unions(void) {
    static const vcase cases[] = {
        {"{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}],\"default\":null}", {"\"x\"", "null", "`1"}},
        {"{\"oneOf\":[{\"type\":\"integer\",\"maximum\":3},{\"type\":\"array\",\"items\":{\"type\":\"string\"}}]}",
         {"3", "[\"a\"]", "`4", "[`1]"}},
        {"{\"type\":[\"integer\",\"null\"],\"minimum\":0}", {"5", "null", "-0", "-`1", "`\"5\""}},
        {"{\"type\":\"string\",\"nullable\":true,\"maxLength\":1}", {"\"a\"", "null", "\"a`b\""}},
        {"{\"anyOf\":[{\"enum\":[\"a\",\"b\"]},{\"type\":\"integer\"},{\"anyOf\":[{\"type\":\"boolean\"}]}]}",
         {"\"a\"", "7", "false", "\"`c\""}},
        {"{\"type\":[\"number\",\"integer\"]}", {"1.5", "2"}},
        {"{\"minimum\":3}", {"3", "4.5", "2`}"}}, /* type inferred from the keywords */
        {"{\"minLength\":2,\"minimum\":3}", {"\"ab\"", "3", "\"a`\""}},
    };
    run_value_cases(cases, N(cases));
}

static const char *const WEATHER =
    "[{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\",\"minimum\":1,"
    "\"maximum\":14}},\"required\":[\"city\"]}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"m\xc3\xa9t\xc3\xa9o\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{}}}},"
    "{\"name\":\"noop\"}]";

static void test_call_array(void) {
    grammar *g = compile(WEATHER, NULL);
    if (!g) return;
    CHECK_EQ_INT(grammar_tool_count(g), 3);
    CHECK(!strcmp(grammar_tool_name(g, 1), "m\xc3\xa9t\xc3\xa9o"));
    CHECK(grammar_tool_name(g, 3) == NULL);
    const char *cases[] = {
        "[]",
        "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3}}]",
        "[{\"name\":\"noop\",\"arguments\":{}},{\"name\":\"m\xc3\xa9t\xc3\xa9o\",\"arguments\":{}}]",
        "[{\"name\":\"m\\u00e9t\\u00e9o\",\"arguments\":{}}]",
        "[{\"name\":\"noop\",\"arguments\":{}},{\"name\":\"noop\",\"arguments\":{}}]",
        "`{}", "[` ]", "[`[]", "[{\"name\":\"`x\"", "[{\"name\"` :", "[{\"`arguments\"",
        "[{\"name\":\"noop\"`}", "[{\"name\":\"noop\",\"arguments\":{`\"a\":1}}]",
        "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}`,", "[]` ", "[{\"name\":\"noo`\"",
        "[{\"name\":\"noop\",\"arguments\":{}},`]",
    };
    for (size_t i = 0; i < N(cases); i++) expect(g, cases[i], "call array");
    grammar_free(g);

    grammar_options o = grammar_default_options();
    CHECK(o.allow_empty == 1 && o.single_call == 0);
    o.allow_empty = 0;
    o.single_call = 1;
    g = compile(WEATHER, &o);
    if (!g) return;
    expect(g, "[`]", "no empty");
    expect(g, "[{\"name\":\"noop\",\"arguments\":{}}]", "single");
    expect(g, "[{\"name\":\"noop\",\"arguments\":{}}`,", "single");
    grammar_free(g);

    g = compile("[]", NULL); /* no tools: only the refusal */
    if (g) {
        expect(g, "[]", "no tools");
        expect(g, "[`{", "no tools");
        grammar_free(g);
    }
}

static void test_api(void) {
    grammar *g = compile(WEATHER, NULL);
    if (!g) return;
    grammar_state st, copy;
    grammar_state_init(g, &st);
    const char *head = "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"P";
    CHECK(grammar_accept_bytes(g, &st, head, strlen(head)));
    grammar_state_copy(&copy, &st);
    CHECK(!grammar_accept_bytes(g, &st, "aris\"}x", 7)); /* all or nothing */
    CHECK(!memcmp(&st.frames, &copy.frames, st.depth * sizeof st.frames[0]) && st.depth == copy.depth);
    CHECK(grammar_accept_bytes(g, &st, "aris\"}}]", 8));
    CHECK(grammar_is_complete(g, &st));
    CHECK(!grammar_accept_byte(g, &st, ']'));
    CHECK(grammar_accept_bytes(g, &st, "", 0));
    CHECK(!grammar_is_complete(g, &copy));
    grammar_state big = copy; /* plain struct copies work too */
    CHECK(grammar_accept_bytes(g, &big, "\"}}]", 4) && grammar_is_complete(g, &big));
    grammar_free(g);
    grammar_free(NULL);
    CHECK(grammar_compile(NULL, 0, NULL, &g) == NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(grammar_compile("[]", 2, NULL, NULL) == NEEDLE_ERR_INVALID_ARGUMENT);
    grammar_trie *t = NULL;
    CHECK(grammar_trie_build(NULL, NULL, 0, &t) == NEEDLE_ERR_INVALID_ARGUMENT);
    grammar_trie_free(NULL);
    CHECK(grammar_trie_size(NULL) == 0);
}

/* grammar_complete from hand-picked states: each completion is accepted and ends the
 * array; some are pinned to the expected text. */
typedef struct ccase { const char *schema, *prefix, *expect; } ccase;

static void test_complete(void) {
    static const ccase cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"x?y*z\"}", "\"", "z\"}}]"},
        {"{\"type\":\"string\",\"format\":\"email\"}", "\"", "a@a.a\"}}]"},
        {"{\"type\":\"string\",\"pattern\":\"[a-z]+@[a-z]+\\\\.com\"}", "\"ab", "@a.com\"}}]"},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-0", NULL},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"", NULL},
        {"{\"type\":\"string\",\"pattern\":\"[a-c]{2,}\",\"minLength\":4}", "\"", "aaaa\"}}]"},
        {"{\"type\":\"string\",\"minLength\":3}", "\"x", "aa\"}}]"},
        {"{\"type\":\"string\"}", "\"\xc3", "\x80\"}}]"},
        {"{\"type\":\"string\"}", "\"\\u00", "00\"}}]"},
        {"{\"type\":\"string\"}", "\"\\ud83d", "\\udc00\"}}]"},
        {"{\"type\":\"string\",\"pattern\":\"\\\"+\"}", "\"", "\\\"\"}}]"},
        {"{\"type\":\"integer\",\"minimum\":10}", "", "10}}]"},
        {"{\"type\":\"integer\",\"minimum\":-20,\"maximum\":-10,\"multipleOf\":7}", "-", "14}}]"},
        {"{\"type\":\"number\",\"minimum\":0.5,\"maximum\":0.6}", "0.", "5}}]"},
        {"{\"type\":\"number\"}", "1.", "0}}]"},
        {"{\"enum\":[1,12,\"abc\"]}", "1", "}}]"},
        {"{\"enum\":[\"abc\",12]}", "\"a", "bc\"}}]"},
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"uniqueItems\":true,\"minItems\":2}", "[\"a\",", "\"b\"]}}]"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true,\"minItems\":3}", "[\"\",\"a\",", "\"aa\"]}}]"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":3},\"uniqueItems\":true,"
         "\"minItems\":3}", "[1,", "2,3]}}]"},
        {"{\"type\":\"array\",\"uniqueItems\":true,\"minItems\":2,\"items\":{\"type\":\"object\",\"properties\":"
         "{\"a\":{\"type\":\"string\"}}}}", "[{\"a\":\"\"},{\"a\":\"", "a\"}]}}]"},
        {"{\"type\":\"array\",\"uniqueItems\":true,\"minItems\":3,\"items\":{\"type\":\"object\",\"properties\":"
         "{\"a\":{\"type\":\"string\"}}}}", "[{},", "{\"a\":\"\"},{\"a\":\"a\"}]}}]"},
        {"{\"type\":\"array\",\"uniqueItems\":true,\"minItems\":3,\"items\":{\"type\":\"array\",\"items\":"
         "{\"type\":\"null\"}}}", "[[],[null],", "[null,null]]}}]"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"object\",\"properties\":"
         "{\"c\":{\"type\":\"null\"}},\"required\":[\"c\"]}},\"required\":[\"b\"]}", "{", "\"b\":{\"c\":null}}}}]"},
        {"{\"type\":\"object\"}", "{\"k\":[{\"", "\":\"\"}]}}}]"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\",\"minItems\":1}]}", "[", "\"\"]}}]"},
    };
    char text[1024], out[512];
    for (size_t i = 0; i < N(cases); i++) {
        char tools[1024];
        snprintf(tools, sizeof tools,
                 "[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"v\":%s},"
                 "\"required\":[\"v\"]}}]", cases[i].schema);
        grammar *g = compile(tools, NULL);
        if (!g) continue;
        grammar_state st;
        grammar_state_init(g, &st);
        snprintf(text, sizeof text, "[{\"name\":\"f\",\"arguments\":{\"v\":%s", cases[i].prefix);
        CHECK_MSG(grammar_accept_bytes(g, &st, text, strlen(text)), "prefix %s", text);
        size_t n = 0;
        int rc = grammar_complete(g, &st, out, sizeof out - 1, &n);
        out[n] = 0;
        CHECK_MSG(rc == NEEDLE_OK, "%s: %s", cases[i].schema, needle_last_error());
        CHECK_MSG(grammar_accept_bytes(g, &st, out, n) && grammar_is_complete(g, &st), "%s: completion %s",
                  cases[i].schema, out);
        if (cases[i].expect) CHECK_MSG(!strcmp(out, cases[i].expect), "%s: got %s, want %s", cases[i].schema, out,
                                       cases[i].expect);
        grammar_free(g);
    }
    /* from the start: the refusal, or with allow_empty = 0 the shortest call */
    grammar *g = compile(WEATHER, NULL);
    grammar_options o = {0, 1};
    grammar *g1 = compile(WEATHER, &o);
    if (!g || !g1) return;
    grammar_state st;
    size_t n = 0;
    grammar_state_init(g, &st);
    CHECK(grammar_complete(g, &st, out, sizeof out, &n) == NEEDLE_OK && n == 2 && !memcmp(out, "[]", 2));
    grammar_state_init(g1, &st);
    CHECK(grammar_complete(g1, &st, out, sizeof out, &n) == NEEDLE_OK);
    out[n] = 0;
    CHECK_MSG(!strcmp(out, "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"\"}}]"), "got %s", out);
    CHECK(grammar_complete(g1, &st, out, 10, &n) == NEEDLE_ERR_BUFFER_TOO_SMALL && n == 10);
    CHECK(grammar_complete(g1, NULL, out, 10, &n) == NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(grammar_accept_bytes(g, &st, "[]", 2) || 1);
    grammar_state_init(g, &st);
    CHECK(grammar_accept_bytes(g, &st, "[]", 2));
    CHECK(grammar_complete(g, &st, out, sizeof out, &n) == NEEDLE_OK && n == 0);
    grammar_free(g);
    grammar_free(g1);
}

/* ---- schema errors ------------------------------------------------------------------- */

typedef struct ecase { int status; const char *tools; const char *needle; } ecase;

#define P1(props) "[{\"name\":\"t1\",\"parameters\":{\"type\":\"object\",\"properties\":" props "}}]"
#define V1(schema) P1("{\"v\":" schema "}")

static void run_error_cases(const ecase *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        grammar *g = NULL;
        needle_clear_error();
        int rc = grammar_compile(cases[i].tools, strlen(cases[i].tools), NULL, &g);
        CHECK_MSG(rc == cases[i].status, "case %zu: got %d, want %d (%s)\n  tools: %s", i, rc, cases[i].status,
                  needle_last_error(), cases[i].tools);
        CHECK_MSG(strstr(needle_last_error(), cases[i].needle) != NULL, "case %zu: message \"%s\" lacks \"%s\"", i,
                  needle_last_error(), cases[i].needle);
        CHECK(g == NULL);
        if (rc == NEEDLE_OK) grammar_free(g);
    }
}

/* issue 31: "not" and "dependentRequired" away from enum/const. {"not": {"type": T}} is the
 * schema's types less T; dependentRequired makes a written property require others
 * before "}" (and grammar_complete writes them). */
static void test_not_and_dependent_required(void) {
    static const vcase values[] = {
        {"{\"type\":[\"string\",\"integer\"],\"not\":{\"type\":\"integer\"}}", {"\"a\"", "`1", "`n"}},
        {"{\"not\":{\"type\":\"null\"}}", {"1", "\"s\"", "true", "[]", "{}", "`null"}},
        {"{\"not\":{\"type\":[\"null\",\"string\",\"object\"]}}", {"1.5", "false", "`\"", "`{"}},
        {"{\"type\":\"integer\",\"minimum\":3,\"not\":{\"type\":\"string\"}}", {"3", "`-1", "`\""}},
        {"{\"type\":[\"integer\",\"boolean\"],\"not\":{\"type\":\"number\"}}", {"true", "`1"}},
        {"{\"minLength\":2,\"not\":{\"type\":\"string\"}}", {"1", "null", "`\""}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
         "\"dependentRequired\":{\"a\":[\"b\"]}}",
         {"{\"a\":1,\"b\":2}", "{\"b\":2,\"a\":1}", "{\"b\":2}", "{}", "{\"a\":1`}"}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{},\"c\":{}},\"required\":[\"a\"],"
         "\"dependentRequired\":{\"a\":[\"b\"],\"b\":[\"c\"],\"z\":[\"a\"]}}",
         {"{\"a\":1,\"b\":2,\"c\":3}", "{\"c\":3,\"b\":2,\"a\":1}", "{`}", "{\"a\":1`}", "{\"a\":1,\"b\":2`}",
          "{\"c\":3`}"}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"dependentRequired\":{\"a\":[]}}",
         {"{\"a\":1}", "{}"}},
    };
    run_value_cases(values, N(values));
    /* the completion writes what a dependency needs */
    static const char *tools =
        "[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
        "\"b\":{\"type\":\"boolean\"}},\"dependentRequired\":{\"a\":[\"b\"]}}}]";
    grammar *g = compile(tools, NULL);
    if (g) {
        grammar_state st;
        grammar_state_init(g, &st);
        const char *prefix = "[{\"name\":\"f\",\"arguments\":{\"a\":7";
        CHECK(grammar_accept_bytes(g, &st, prefix, strlen(prefix)));
        char out[256];
        size_t n = 0;
        CHECK_EQ_INT(grammar_complete(g, &st, out, sizeof out, &n), NEEDLE_OK);
        out[n < sizeof out ? n : sizeof out - 1] = 0;
        CHECK_MSG(strstr(out, "\"b\":") != NULL, "completion of %s: %s", prefix, out);
        CHECK(grammar_accept_bytes(g, &st, out, n) && grammar_is_complete(g, &st));
        grammar_free(g);
    }
    static const ecase errors[] = {
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"not\":{\"type\":\"string\"}}"),
         "parameters.properties.v.not: not excludes every type the schema allows"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"number\",\"not\":{\"type\":\"integer\"}}"),
         "numbers that are not integers cannot be generated"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"not\":{\"pattern\":\"a\"}}"),
         "tool \"t1\": parameters.properties.v.not: only {\"type\": ...} is supported under not (found 'pattern')"},
        {NEEDLE_ERR_SCHEMA, V1("{\"not\":true}"), "not true excludes every value"},
        {NEEDLE_ERR_SCHEMA, V1("{\"not\":3}"), "not must be a schema"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"object\",\"properties\":{\"a\":{}},\"dependentRequired\":{\"a\":[\"x\"]}}"),
         "parameters.properties.v.dependentRequired.a: 'a' requires 'x', which is not a declared property"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"object\",\"dependentRequired\":{\"a\":[\"b\"]}}"),
         "dependentRequired needs an object with declared properties"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"object\",\"properties\":{\"a\":{}},\"dependentRequired\":[]}"),
         "dependentRequired must be an object"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"object\",\"properties\":{\"a\":{}},\"dependentRequired\":{\"a\":[1]}}"),
         "must map names to arrays of names"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"uniqueItems\":true,\"items\":{\"type\":\"object\",\"properties\":"
                               "{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}},\"dependentRequired\":{\"a\":[\"b\"]}}}"),
         "dependentRequired inside the items of a uniqueItems array is not supported"},
        {NEEDLE_ERR_SCHEMA, V1("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":1},\"a\":{}},"
                               "\"required\":[\"k\"],\"dependentRequired\":{\"a\":[\"k\"]},\"additionalProperties\":false},"
                               "{\"type\":\"object\",\"properties\":{\"k\":{\"const\":2}},\"required\":[\"k\"],"
                               "\"additionalProperties\":false}]}"),
         "has dependentRequired: not supported in a union of objects"},
    };
    run_error_cases(errors, N(errors));
}

static void test_errors(void) {
    static const ecase cases[] = {
        {NEEDLE_ERR_JSON, "[{\"name\":\"f\"", "malformed"},
        {NEEDLE_ERR_JSON, "not json", "malformed"},
        {NEEDLE_ERR_JSON, "[{\"name\":\"f\xff\"}]", "UTF-8"},
        {NEEDLE_ERR_JSON, "[{\"name\":\"f\",\"name\":\"g\"}]", "duplicate"},
        {NEEDLE_ERR_SCHEMA, "{\"name\":\"f\"}", "array"},
        {NEEDLE_ERR_SCHEMA, "[{\"description\":\"x\"}]", "name"},
        {NEEDLE_ERR_SCHEMA, "[{\"name\":\"\"}]", "name"},
        {NEEDLE_ERR_SCHEMA, "[3]", "name"},
        {NEEDLE_ERR_SCHEMA, "[{\"name\":\"a\"},{\"name\":\"a\"}]", "duplicate tool name"},
        {NEEDLE_ERR_SCHEMA, "[{\"name\":\"t1\",\"parameters\":[]}]", "parameters"},
        {NEEDLE_ERR_SCHEMA, "[{\"name\":\"t1\",\"parameters\":{\"type\":\"string\"}}]", "parameters"},
        {NEEDLE_ERR_SCHEMA, "[{\"name\":\"t1\",\"parameters\":{\"enum\":[1]}}]", "parameters"},
        {NEEDLE_ERR_SCHEMA, V1("{\"$ref\":\"#/$defs/x\"}"), "t1\": parameters.properties.v: $ref '#/$defs/x' points at nothing"},
        {NEEDLE_ERR_SCHEMA, V1("{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}"),
         "parameters.properties.v: allOf: the entries' types have no type in common"},
        {NEEDLE_ERR_SCHEMA, V1("{\"allOf\":[{\"type\":\"string\",\"pattern\":\"a\"},{\"pattern\":\"b\"}]}"),
         "allOf: entries give 'pattern' different values"},
        {NEEDLE_ERR_SCHEMA, V1("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":false},"
                               "{\"properties\":{\"b\":{}},\"required\":[\"b\"]}]}"), "'b' is required by one entry and forbidden"},
        {NEEDLE_ERR_SCHEMA, V1("{\"allOf\":[{\"enum\":[1]},{\"enum\":[2]}]}"), "allOf: no value is in every enum"},
        {NEEDLE_ERR_SCHEMA, V1("{\"allOf\":[]}"), "allOf must be a non-empty array"},
        {NEEDLE_ERR_SCHEMA, V1("{\"not\":{}}"), "parameters.properties.v.not: not {} excludes every value"},
        {NEEDLE_ERR_SCHEMA, V1("{\"if\":{},\"then\":{}}"), "'if'"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"object\",\"patternProperties\":{}}"), "patternProperties"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"object\",\"dependencies\":{}}"), "dependencies"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"object\",\"properties\":{},\"additionalProperties\":true}"),
         "additionalProperties"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}"),
         "additionalProperties"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"prefixItems\":[]}"), "prefixItems"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":[{}]}"), "tuple"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"number\",\"minimum\":5,\"maximum\":3}"), "parameters.properties.v: no number"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"number\",\"exclusiveMinimum\":3,\"exclusiveMaximum\":3}"), "no number"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"integer\",\"minimum\":1.2,\"maximum\":1.8}"), "no integer"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"integer\",\"minimum\":1,\"maximum\":4,\"multipleOf\":5}"), "no integer"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"number\",\"minimum\":1e19}"), "range"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"number\",\"multipleOf\":0}"), "multipleOf"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"number\",\"multipleOf\":1e-12}"), "multipleOf"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"number\",\"minimum\":\"1\"}"), "minimum must be a number"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"minLength\":4,\"maxLength\":3}"), "minLength (4) > maxLength (3)"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"minLength\":-1}"), "minLength"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"maxLength\":1.5}"), "maxLength"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"minItems\":2,\"maxItems\":1}"), "minItems (2) > maxItems (1)"},
        {NEEDLE_ERR_SCHEMA, V1("{\"enum\":[]}"), "enum"},
        /* issue 31: enum/const values that no sibling keyword leaves: refused, naming the
         * tool, the path, the value and the keyword */
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"const\":5}"),
         "tool \"t1\": parameters.properties.v: const 5 conflicts with the other keywords: it is not of type \"string\""},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"integer\",\"enum\":[\"x\"]}"),
         "t1\": parameters.properties.v: no enum value satisfies the other keywords (1 dropped; \"x\": it is not of type \"integer\")"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"integer\",\"const\":5,\"minimum\":10}"), "const 5 conflicts with the other keywords: it is below minimum 10"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"enum\":[\"aa\"],\"maxLength\":1}"), "\"aa\": it is longer than maxLength 1"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"enum\":[\"abc\",\"x1\"],\"pattern\":\"^[0-9]+$\"}"), "2 dropped; \"abc\": it does not match pattern"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"boolean\",\"enum\":[1]}"), "1: it is not of type \"boolean\""},
        {NEEDLE_ERR_SCHEMA, V1("{\"const\":\"a\",\"enum\":[\"b\"]}"), "const \"a\" conflicts with the other keywords: it is not in the enum"},
        {NEEDLE_ERR_SCHEMA, V1("{\"enum\":[1],\"not\":{\"type\":\"integer\"}}"), "it matches the schema under not"},
        {NEEDLE_ERR_SCHEMA, V1("{\"enum\":[1],\"if\":{}}"), "'if'"},
        {NEEDLE_ERR_SCHEMA, V1("{\"enum\":[\"a\"],\"pattern\":\"(a\"}"), "pattern \"(a\": missing )"},
        {NEEDLE_ERR_SCHEMA, V1("{\"enum\":[1],\"not\":{\"$ref\":\"#/nowhere\"}}"), "points at nothing"},
        {NEEDLE_ERR_SCHEMA, V1("{\"enum\":\"a\"}"), "enum"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}"), "pattern"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"a(?=b)\"}"), "lookaround"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"(ab\"}"), "missing )"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"ab)\"}"), "unbalanced"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"\\\\bx\"}"), "boundary"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"a^b\"}"), "^"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"*a\"}"), "quantifier"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"[z-a]\"}"), "order"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"a{2001}\"}"), "repetition"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"[]\"}"), "matches no string"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"[a-z]{5}\",\"maxLength\":3}"), "no string matches"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"a\",\"format\":\"date\"}"), "format"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"pattern\":\"[ab]*a[ab]{12}\"}"), "DFA states"},
        {NEEDLE_ERR_SCHEMA, "[{\"name\":\"t1\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{}},"
                            "\"required\":[\"a\",\"b\"]}}]", "parameters.required: 'b' is not a declared property"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"object\",\"required\":[\"x\"]}"), "not a declared property"},
        {NEEDLE_ERR_SCHEMA, V1("{\"anyOf\":[{\"type\":\"string\"},{\"enum\":[\"a\"]}]}"), "differ in JSON type"},
        {NEEDLE_ERR_SCHEMA, V1("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}"), "differ"},
        {NEEDLE_ERR_SCHEMA, V1("{\"anyOf\":[]}"), "anyOf"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"string\",\"anyOf\":[{\"type\":\"integer\"}]}"), "no type in common"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"object\"},\"uniqueItems\":true}"),
         "declared properties"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"n\":"
                               "{\"type\":\"boolean\"}}},\"uniqueItems\":true}"),
         "property \"n\" can be written last and then cannot always differ"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"n\":"
                               "{\"type\":\"integer\",\"minimum\":1,\"maximum\":3}}},\"uniqueItems\":true,\"maxItems\":4}"),
         "at least 4 values"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"null\"},"
                               "\"maxItems\":2},\"uniqueItems\":true}"), "without maxItems"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"null\"},"
                               "\"uniqueItems\":true},\"uniqueItems\":true}"), "inside the items"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\"}},"
                               "\"uniqueItems\":true}"), "declared properties"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"array\"},\"uniqueItems\":true}"),
         "items schema"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"uniqueItems\":true}"), "uniqueItems"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"uniqueItems\":true,"
                               "\"minItems\":3}"), "at most 2 distinct"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":2},"
                               "\"uniqueItems\":true}"), "uniqueItems"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"uniqueItems\":true,"
                               "\"minItems\":65}"), "at most 64"},
        {NEEDLE_ERR_SCHEMA, V1("{\"type\":\"strin\"}"), "unknown type"},
        {NEEDLE_ERR_SCHEMA, V1("false"), "schema must be an object"},
        {NEEDLE_ERR_SCHEMA, V1("3"), "schema must be an object"},
    };
    run_error_cases(cases, N(cases));
    /* too deep: 31 nested arrays inside the arguments object */
    char deep[1024] = "[{\"name\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":{\"v\":";
    for (int i = 0; i < 31; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 31; i++) strcat(deep, "}");
    strcat(deep, "}}}]");
    grammar *g = NULL;
    CHECK(grammar_compile(deep, strlen(deep), NULL, &g) == NEEDLE_ERR_SCHEMA);
    CHECK_MSG(strstr(needle_last_error(), "tool \"d\"") && strstr(needle_last_error(), "deep"), "%s",
              needle_last_error());
    /* 65 properties */
    char many[4096] = "[{\"name\":\"m\",\"parameters\":{\"type\":\"object\",\"properties\":{";
    for (int i = 0; i < 65; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s\"p%d\":{}", i ? "," : "", i);
    strcat(many, "}}}]");
    CHECK(grammar_compile(many, strlen(many), NULL, &g) == NEEDLE_ERR_SCHEMA);
    CHECK(strstr(needle_last_error(), "64") != NULL);
    grammar_options o = {0, 0};
    CHECK(grammar_compile("[]", 2, &o, &g) == NEEDLE_ERR_SCHEMA);
}

/* Declared nesting up to the limit works, and free-form values stop opening containers
 * when the stack is full but can still close. */
static void test_depth(void) {
    char deep[1024] = "[{\"name\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":{\"v\":";
    for (int i = 0; i < 28; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 28; i++) strcat(deep, "}");
    strcat(deep, "}}}]");
    grammar *g = compile(deep, NULL);
    if (g) {
        char text[256] = "[{\"name\":\"d\",\"arguments\":{\"v\":";
        for (int i = 0; i < 28; i++) strcat(text, "[");
        strcat(text, "null");
        for (int i = 0; i < 28; i++) strcat(text, "]");
        strcat(text, "}}]");
        expect(g, text, "deep");
        grammar_free(g);
    }
    g = compile(P1("{\"v\":{}}"), NULL);
    if (!g) return;
    grammar_state st;
    grammar_state_init(g, &st);
    const char *head = "[{\"name\":\"t1\",\"arguments\":{\"v\":";
    CHECK(grammar_accept_bytes(g, &st, head, strlen(head)));
    int opened = 0;
    while (grammar_accept_byte(g, &st, '[')) opened++;
    CHECK_EQ_INT(opened, GRAMMAR_MAX_DEPTH - 3);
    CHECK(!grammar_accept_byte(g, &st, '1')); /* the innermost array can only be empty */
    for (int i = 0; i < opened; i++) CHECK(grammar_accept_byte(g, &st, ']'));
    CHECK(grammar_accept_bytes(g, &st, "}}]", 3) && grammar_is_complete(g, &st));
    grammar_free(g);
}

int main(void) {
    RUN(test_strings);
    RUN(test_numbers);
    RUN(test_number_prefixes);
    RUN(test_literals);
    RUN(test_all_of);
    RUN(test_objects);
    RUN(test_arrays);
    RUN(test_unique_compound);
    RUN(test_unique_compound_decode);
    RUN(test_unions);
    RUN(test_call_array);
    RUN(test_api);
    RUN(test_complete);
    RUN(test_errors);
    RUN(test_not_and_dependent_required);
    RUN(test_depth);
    return test_summary();
}
