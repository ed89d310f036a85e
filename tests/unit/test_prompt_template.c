/* The prompt template in one place (agent/prompt.h), through its public entries:
 * 1. needle_system_with_date gives, for every case of tests/fixtures/date_fact.json, the
 *    system facts the official cactus-needle 3.2.8 client sends with auto_date (made by
 *    its own _with_date_fact: tests/reference/make_date_fact_fixtures.py): the `date:` key
 *    (case-sensitive, not after an ASCII letter), YYYY-MM-DD stamps in any Unicode digits,
 *    Python's blank and JSON-object rules, the weekday; bad times and small buffers are
 *    refused with a status.
 * 2. needle_render_prompt is the text a session renders: the template's pieces in order,
 *    and on the demo model its tokens (BOS first) are the session's prefix plus the first
 *    turn: set_tools then append_turn land at that position plus the answer's tokens. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "harness.h"
#include "needle.h"

static void test_date_fact_matches_official(void) {
    size_t size = 0;
    char *text = (char *)read_file(fixture_path("date_fact.json"), &size);
    CHECK_MSG(text != NULL, "missing fixture date_fact.json");
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "cases")) {
        const char *system = cJSON_GetObjectItem(c, "system")->valuestring;
        const char *expected = cJSON_GetObjectItem(c, "expected")->valuestring;
        const cJSON *t = cJSON_GetObjectItem(c, "time");
        int32_t f[5];
        for (int i = 0; i < 5; i++) f[i] = (int32_t)cJSON_GetArrayItem(t, i)->valuedouble;
        char out[512];
        size_t len = 0;
        const int rc = needle_system_with_date(system, f[0], f[1], f[2], f[3], f[4], out,
                                               sizeof out, &len);
        CHECK_MSG(rc == NEEDLE_OK && len == strlen(expected) && !strcmp(out, expected),
                  "case %d (%s): got \"%s\", official \"%s\" (%s)", n, system,
                  rc ? "" : out, expected, needle_last_error());
        n++;
    }
    CHECK_MSG(n >= 300, "only %d date fact cases", n);
    cJSON_Delete(doc);
}

static void test_date_fact_errors(void) {
    char out[64];
    size_t len = 0;
    CHECK_EQ_INT(needle_system_with_date("x", 2026, 2, 29, 0, 0, out, sizeof out, &len),
                 NEEDLE_ERR_INVALID_ARGUMENT); /* not a leap year */
    CHECK_EQ_INT(needle_system_with_date("x", 2026, 13, 1, 0, 0, out, sizeof out, &len),
                 NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(needle_system_with_date("x", 2026, 1, 1, 24, 0, out, sizeof out, &len),
                 NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(needle_system_with_date("x", 999, 1, 1, 0, 0, out, sizeof out, &len),
                 NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(needle_system_with_date("x", 2026, 1, 1, 0, 0, out, sizeof out, NULL),
                 NEEDLE_ERR_INVALID_ARGUMENT);
    /* "date: 2026-01-01 Thu 00:00; x" is 29 bytes: the NUL needs a 30th */
    CHECK_EQ_INT(needle_system_with_date("x", 2026, 1, 1, 0, 0, out, 29, &len),
                 NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(len, 29);
    CHECK_EQ_INT(needle_system_with_date("x", 2026, 1, 1, 0, 0, out, 30, &len), NEEDLE_OK);
    CHECK(!strcmp(out, "date: 2026-01-01 Thu 00:00; x"));
    /* NULL system is blank; bytes that are not UTF-8 are neither spaces nor digits */
    CHECK_EQ_INT(needle_system_with_date(NULL, 2026, 1, 1, 0, 0, out, sizeof out, &len), NEEDLE_OK);
    CHECK(!strcmp(out, "date: 2026-01-01 Thu 00:00"));
    CHECK_EQ_INT(needle_system_with_date("\xff", 2026, 1, 1, 0, 0, out, sizeof out, &len), NEEDLE_OK);
    CHECK(!strcmp(out, "date: 2026-01-01 Thu 00:00; \xff"));
}

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"set_timer\", \"description\": "
    "\"Start a timer\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"minutes\": {\"type\": \"integer\"}}, \"required\": [\"minutes\"]}}}]";

static void test_render_prompt_text(void) {
    char out[1024];
    size_t len = 0;
    CHECK_EQ_INT(needle_render_prompt("user: Ada", TOOLS, "Set a timer", out, sizeof out, &len),
                 NEEDLE_OK);
    const char *want =
        "<|im_start|>system\nuser: Ada<|im_end|>\n<|im_start|>user\n<tools>"
        "[{\"name\":\"set_timer\",\"description\":\"Start a timer\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"minutes\":{\"type\":\"integer\"}},"
        "\"required\":[\"minutes\"]}}]</tools>\nSet a timer<|im_end|>\n"
        "<|im_start|>assistant\n";
    CHECK_MSG(!strcmp(out, want), "rendered:\n%s", out);
    CHECK_EQ_INT(len, strlen(want));
    /* no system block without system facts */
    CHECK_EQ_INT(needle_render_prompt("", TOOLS, "q", out, sizeof out, &len), NEEDLE_OK);
    CHECK(!strncmp(out, "<|im_start|>user\n<tools>[", 25));
    CHECK_EQ_INT(needle_render_prompt(NULL, TOOLS, "q", out, 10, &len), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK(len > 10);
    CHECK_EQ_INT(needle_render_prompt(NULL, "[{", "q", out, sizeof out, &len), NEEDLE_ERR_JSON);
    CHECK_EQ_INT(needle_render_prompt(NULL, NULL, "q", out, sizeof out, &len),
                 NEEDLE_ERR_INVALID_ARGUMENT);
}

/* The rendered text, encoded, is what a session evaluates: prefix + first turn. */
static void test_render_prompt_is_what_runs(void) {
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open(NEEDLE_SOURCE_DIR "/models/needle-demo.cact", NULL, &m),
                 NEEDLE_OK);
    if (!m) return;
    const char *system = "date: 2026-01-05 Mon 09:07";
    const char *query = "Set a timer for 25 minutes";
    char text[4096];
    size_t len = 0;
    CHECK_EQ_INT(needle_render_prompt(system, TOOLS, query, text, sizeof text, &len), NEEDLE_OK);
    int32_t ids[1024];
    size_t n = 0;
    CHECK_EQ_INT(needle_tokenize(m, text, len, ids, 1024, &n), NEEDLE_OK);
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(m, NULL, &s), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_set_tools(s, system, TOOLS), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_append_turn(s, query, NEEDLE_TURN_QUERY, "[]"), NEEDLE_OK);
    /* the answer appended: "▁" <tool_call> "[]" </tool_call> <|im_end|> */
    char answer_text[] = "<tool_call>[]</tool_call><|im_end|>";
    int32_t answer[16];
    size_t n_answer = 0;
    CHECK_EQ_INT(needle_tokenize(m, answer_text, strlen(answer_text), answer, 16, &n_answer),
                 NEEDLE_OK);
    /* +1: BOS, which needle_tokenize does not add */
    CHECK_EQ_INT(needle_session_position(s), 1 + n + n_answer);
    needle_session_free(s);
    needle_model_free(m);
}

int main(void) {
    RUN(test_date_fact_matches_official);
    RUN(test_date_fact_errors);
    RUN(test_render_prompt_text);
    RUN(test_render_prompt_is_what_runs);
    return test_summary();
}
