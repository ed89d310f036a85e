/* grammar_json_canon against Python's own json.dumps(json.loads(x), separators=(",", ":"),
 * ensure_ascii=False) on recorded cases (tests/data/json_canon_cases.jsonl, written by
 * tests/reference/make_json_cases.py), plus malformed input that must fail cleanly. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_canon.h"
#include "harness.h"
#include "util/json_escape.h"
#include "util/utf8.h"
#include "needle.h"

static char *data_path(const char *name) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/../data/%s", fixture_dir(), name);
    return path;
}

static void test_matches_python(void) {
    char *text = (char *)read_file(data_path("json_canon_cases.jsonl"), NULL);
    CHECK_MSG(text != NULL, "missing %s", data_path("json_canon_cases.jsonl"));
    if (!text) return;
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *pair = cJSON_Parse(line);
        const char *in = cJSON_GetArrayItem(pair, 0)->valuestring;
        const char *want = cJSON_GetArrayItem(pair, 1)->valuestring;
        char *got = NULL;
        size_t len = 0;
        int rc = grammar_json_canon(in, strlen(in), &got, &len);
        CHECK_MSG(rc == NEEDLE_OK && !strcmp(got, want), "case %d: %s\n  got  %s\n  want %s", n,
                  in, got ? got : needle_last_error(), want);
        free(got);
        cJSON_Delete(pair);
        n++;
    }
    CHECK(n > 50);
    free(text);
}

static void test_malformed_input_fails(void) {
    const char *bad[] = {"", "{", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "[1 2]", "tru", "01",
                         "1.", "-", "1e", "\"abc", "\"\\x\"", "\"\\s\"", "\"\\ud800\"", "\"\\udc00x\"",
                         "\"a\x01\"", "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "[1] 2",
                         "{\"a\":1,\"a\":2}", "1e999", "{1:2}", "NaN"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = NULL;
        size_t len;
        int rc = grammar_json_canon(bad[i], strlen(bad[i]), &out, &len);
        CHECK_MSG(rc == NEEDLE_ERR_JSON, "'%s' gave %d", bad[i], rc);
        CHECK(strlen(needle_last_error()) > 0);
        free(out);
    }
    /* deep nesting is refused, not a stack overflow */
    size_t depth = 100000;
    char *deep = malloc(depth + 1);
    memset(deep, '[', depth);
    deep[depth] = 0;
    char *out = NULL;
    size_t len;
    CHECK_EQ_INT(grammar_json_canon(deep, depth, &out, &len), NEEDLE_ERR_JSON);
    free(deep);
    free(out);
}

static void test_python_float_repr(void) {
    struct { double v; const char *s; } cases[] = {
        {1.0, "1.0"}, {0.1, "0.1"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
        {1e-5, "1e-05"}, {0.0001, "0.0001"}, {-0.0, "-0.0"}, {123.456, "123.456"},
        {5e-324, "5e-324"}, {1.5e300, "1.5e+300"}, {2.0 / 3.0, "0.6666666666666666"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[40];
        gram_python_float(cases[i].v, buf);
        CHECK_MSG(!strcmp(buf, cases[i].s), "%.17g -> %s, want %s", cases[i].v, buf, cases[i].s);
    }
}

/* The one escaper: Python's json.dumps spelling with ensure_ascii False and True. */
static void test_escaper(void) {
    static const struct { const char *in; int ascii; const char *out; } cases[] = {
        {"a\"b\\c/\n\r\t\b\f\x01\x1f\x7f", 0, "\"a\\\"b\\\\c/\\n\\r\\t\\b\\f\\u0001\\u001f\x7f\""},
        {"caf\xc3\xa9 \xf0\x9f\x98\x80", 0, "\"caf\xc3\xa9 \xf0\x9f\x98\x80\""},
        {"caf\xc3\xa9 \xf0\x9f\x98\x80\x7f", 1, "\"caf\\u00e9 \\ud83d\\ude00\\u007f\""},
        {"\xff\xc3", 0, "\"\xff\xc3\""}, /* not UTF-8: copied, never dropped */
        {"\xff\xc3", 1, "\"\xff\xc3\""},
        {"", 1, "\"\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        strbuf b = {0};
        util_json_put_string(&b, cases[i].in, strlen(cases[i].in), cases[i].ascii);
        CHECK_MSG(!b.oom && b.data && !strcmp(b.data, cases[i].out), "case %zu: got %s", i, b.data ? b.data : "(null)");
        free(b.data);
    }
}

/* The one decoder: well-formed lengths, maximal subparts of ill-formed input, unfinished
 * prefixes; and the encoder round trip at every length boundary. */
static void test_utf8(void) {
    static const struct { const char *s; int ret; uint32_t cp; size_t bad; } cases[] = {
        {"A", 1, 'A', 0},           {"\xc3\xa9", 2, 0xE9, 0},      {"\xe2\x82\xac", 3, 0x20AC, 0},
        {"\xf4\x8f\xbf\xbf", 4, 0x10FFFF, 0},                  {"\xc0\xaf", 0, 0, 1},
        {"\xe0\x80\x80", 0, 0, 1}, {"\xed\xa0\x80", 0, 0, 1},    {"\xf4\x90\x80\x80", 0, 0, 1},
        {"\xe2\x82x", 0, 0, 2},     {"\xe2\x82", -1, 0, 0},        {"\xff", 0, 0, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t cp = 0;
        size_t bad = 0;
        int r = util_utf8_next((const uint8_t *)cases[i].s, strlen(cases[i].s), &cp, &bad);
        CHECK_MSG(r == cases[i].ret, "case %zu: %d", i, r);
        if (r > 0) CHECK_MSG(cp == cases[i].cp, "case %zu: U+%04X", i, cp);
        if (r == 0) CHECK_MSG(bad == cases[i].bad, "case %zu: bad %zu", i, bad);
    }
    static const uint32_t cps[] = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF};
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
        uint8_t u[4];
        uint32_t back = UINT32_MAX;
        size_t n = util_utf8_encode(cps[i], u);
        CHECK_MSG(util_utf8_next(u, n, &back, NULL) == (int)n && back == cps[i], "U+%04X", cps[i]);
    }
}

int main(void) {
    RUN(test_matches_python);
    RUN(test_malformed_input_fails);
    RUN(test_python_float_repr);
    RUN(test_escaper);
    RUN(test_utf8);
    return test_summary();
}
