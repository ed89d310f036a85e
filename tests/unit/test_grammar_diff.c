/* The differential schema fuzzer (schema_diff.c) as a ctest: random schemas, contradictory
 * ones included, x random and adversarial byte walks through the recognizer, every
 * completed call checked by the independent validator of schema_check.c. A fixed seed
 * list, so a failure reproduces; NEEDLE_DIFF_ROUNDS and NEEDLE_DIFF_SEED run more or
 * other rounds. About 3 s in a release build on one core (20000 rounds), ~30 s under ASan.
 * The validator itself is checked first on values the standard decides. */
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "harness.h"
#include "schema_check.h"
#include "schema_diff.h"

static int verdict(const char *schema, const char *value) {
    cJSON *s = cJSON_Parse(schema), *v = cJSON_Parse(value);
    char why[200];
    int ok = s && v ? schema_check(s, s, v, why, sizeof why) : -1;
    cJSON_Delete(s);
    cJSON_Delete(v);
    return ok;
}

/* The validator agrees with the standard (and jsonschema) on the cases. */
static void test_validator(void) {
    static const struct { const char *schema, *value; int ok; } cases[] = {
        {"{\"type\":\"string\",\"const\":5}", "5", 0},
        {"{\"type\":\"integer\",\"enum\":[\"x\"]}", "\"x\"", 0},
        {"{\"type\":\"integer\",\"enum\":[1,50],\"maximum\":10}", "50", 0},
        {"{\"type\":\"integer\",\"enum\":[1,50],\"maximum\":10}", "1", 1},
        {"{\"type\":\"integer\",\"const\":5,\"minimum\":10}", "5", 0},
        {"{\"type\":\"string\",\"enum\":[\"aa\"],\"maxLength\":1}", "\"aa\"", 0},
        {"{\"type\":\"string\",\"enum\":[\"ab\"],\"pattern\":\"^[0-9]+$\"}", "\"ab\"", 0},
        {"{\"type\":\"boolean\",\"enum\":[1]}", "1", 0},
        {"{\"type\":\"integer\"}", "1.0", 1},
        {"{\"type\":\"integer\"}", "1.5", 0},
        {"{\"pattern\":\"\\\\d{3}\"}", "\"ab1234\"", 1}, /* a search, not a full match */
        {"{\"pattern\":\"^\\\\d{3}$\"}", "\"1234\"", 0},
        {"{\"pattern\":\"^.$\"}", "\"\xc3\xa9\"", 1},
        {"{\"maxLength\":1}", "\"\xc3\xa9\"", 1},
        {"{\"format\":\"date\"}", "\"2024-02-29\"", 1},
        {"{\"format\":\"date\"}", "\"2023-02-29\"", 0},
        {"{\"format\":\"ipv4\"}", "\"10.0.0.256\"", 0},
        {"{\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"", 1},
        {"{\"format\":\"date-time\"}", "\"2024-01-02T03:04:05Z\"", 1},
        {"{\"multipleOf\":0.1}", "0.3", 1},
        {"{\"multipleOf\":0.1}", "0.35", 0},
        {"{\"minimum\":5,\"exclusiveMinimum\":true}", "5", 0},
        {"{\"exclusiveMaximum\":5}", "5", 0},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "[1,1.0]", 0},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "[{\"a\":1,\"b\":2},{\"b\":2,\"a\":1}]", 0},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "[{\"a\":1},{\"a\":2}]", 1},
        {"{\"properties\":{\"a\":{}},\"additionalProperties\":false}", "{\"b\":1}", 0},
        {"{\"required\":[\"a\"]}", "{}", 0},
        {"{\"dependentRequired\":{\"a\":[\"b\"]}}", "{\"a\":1}", 0},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "1", 0},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}", "\"s\"", 1},
        {"{\"not\":{\"type\":\"null\"}}", "null", 0},
        {"{\"type\":\"string\",\"nullable\":true}", "null", 1},
        {"{\"$defs\":{\"A\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/A\"}", "\"x\"", 0},
        {"{\"allOf\":[{\"minimum\":1},{\"maximum\":3}]}", "4", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_MSG(verdict(cases[i].schema, cases[i].value) == cases[i].ok, "validator: %s against %s should be %s",
                  cases[i].value, cases[i].schema, cases[i].ok ? "valid" : "invalid");
}

static void test_differential(void) {
    const char *e = getenv("NEEDLE_DIFF_ROUNDS"), *sd = getenv("NEEDLE_DIFF_SEED");
    const long rounds = e ? atol(e) : 20000;
    const unsigned long long seed0 = sd ? strtoull(sd, NULL, 10) : 31;
    diff_stats st = {0};
    static char msg[16384];
    int failures = 0;
    for (long i = 0; i < rounds && failures < 5; i++) {
        diff_rng r;
        diff_rng_init(&r, NULL, 0, seed0 * 1000003ull + (unsigned long long)i);
        if (diff_round(&r, 4, &st, msg, sizeof msg)) {
            failures++;
            CHECK_MSG(0, "round %ld (NEEDLE_DIFF_SEED=%llu): %s", i, seed0, msg);
        } else {
            CHECK(1);
        }
    }
    printf("  %lu rounds, %lu refused, %lu walks, %lu calls validated, %lu bytes; accepted with not %lu, "
           "with dependentRequired %lu\n",
           st.rounds, st.refused, st.walks, st.calls, st.bytes, st.accepted_not, st.accepted_dependent);
    /* the generator must reach both sides: refusals and accepted schemas with calls */
    CHECK(st.refused > st.rounds / 20);
    CHECK(st.calls > st.rounds / 2);
    /* and "not" / "dependentRequired" compiled, not only refused (issue 31) */
    CHECK(st.accepted_not > st.rounds / 50);
    CHECK(st.accepted_dependent > st.rounds / 50);
}

int main(void) {
    /* POSIX regex over UTF-8 code points (glibc has C.UTF-8 built in since 2.35) */
    if (!setlocale(LC_ALL, "C.UTF-8") && !setlocale(LC_ALL, "C.utf8"))
        fprintf(stderr, "test_grammar_diff: no C.UTF-8 locale: patterns over non-ASCII text will disagree\n");
    RUN(test_validator);
    RUN(test_differential);
    return test_summary();
}
