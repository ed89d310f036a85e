/* The decode shortcuts of needle_session_complete (agent/chat.c): jump-forward (a run of
 * grammar-forced tokens evaluated as one chunk) and sparse logits (only the allowed ids'
 * rows of the output projection). Neither may change an output token.
 *
 *   - session_run_rows gives, for the ids asked, exactly the logits of a full run (bit for
 *     bit) and -INFINITY elsewhere, for ids in a few runs and for 200 scattered ids
 *     (several batches of products);
 *   - whole turns (the demo model on its own tools, greedy and sampled; a random-weight
 *     fixture, whose arbitrary calls are long and full of forced tokens) give the same
 *     envelopes, timing fields aside, with both shortcuts off (NEEDLE_JUMP_FORWARD=0,
 *     NEEDLE_SPARSE_LOGITS=0), each alone, and both on; and with them on the session ran
 *     fewer forward passes and computed fewer output rows (so they did engage). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/session.h"
#include "needle.h"

#ifndef NEEDLE_SOURCE_DIR
#define NEEDLE_SOURCE_DIR "."
#endif

static void test_rows_equal_full_logits(void) {
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open(fixture_path("tiny_cq4.cact"), NULL, &m), NEEDLE_OK);
    if (!m) return;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    const uint32_t V = info.vocab;
    int32_t prompt[9] = {NEEDLE_TOKEN_BOS, 17, 4, 99, 250, 3, 77, 31, 8};
    /* a few runs of consecutive ids; then every other id (200 runs) */
    int32_t few[40], many[200];
    uint32_t n_few = 0, n_many = 0;
    for (int32_t v = 5; v < 15; v++) few[n_few++] = v;
    for (int32_t v = 100; v < 120; v++) few[n_few++] = v;
    few[n_few++] = (int32_t)V - 1;
    for (int32_t v = 0; v < (int32_t)V && n_many < 200; v += 2) many[n_many++] = v;
    const struct { const int32_t *rows; uint32_t n; } cases[] = {{few, n_few}, {many, n_many}};
    float *full = malloc(V * sizeof *full);
    for (int c = 0; c < 2; c++) {
        model_session *a = NULL, *b = NULL;
        CHECK_EQ_INT(session_create(m, NULL, &a), NEEDLE_OK);
        CHECK_EQ_INT(session_create(m, NULL, &b), NEEDLE_OK);
        if (a && b) {
            CHECK_EQ_INT(session_run(a, prompt, 9, NULL, 1, NULL), NEEDLE_OK);
            memcpy(full, session_logits(a), V * sizeof *full);
            CHECK_EQ_INT(session_run_rows(b, prompt, 9, cases[c].rows, cases[c].n, NULL), NEEDLE_OK);
            const float *got = session_logits(b);
            uint32_t r = 0, bad = 0;
            for (uint32_t v = 0; got && v < V; v++) {
                if (r < cases[c].n && cases[c].rows[r] == (int32_t)v) {
                    bad += memcmp(&got[v], &full[v], sizeof(float)) != 0;
                    r++;
                } else {
                    bad += !(isinf(got[v]) && got[v] < 0);
                }
            }
            CHECK_MSG(got && bad == 0, "case %d: %u logits differ from the full run", c, bad);
            needle_session_stats st = {.size = sizeof st};
            session_get_stats(b, &st);
            CHECK_EQ_INT(st.logit_rows, cases[c].n);
        }
        session_free(a);
        session_free(b);
    }
    free(full);
    needle_model_free(m);
}

/* The envelope without its timing fields. */
static char *strip_timing(const char *text) {
    cJSON *env = cJSON_Parse(text);
    CHECK_MSG(env != NULL, "envelope is not JSON: %s", text);
    if (!env) return NULL;
    cJSON_DeleteItemFromObject(env, "prefill_tps");
    cJSON_DeleteItemFromObject(env, "decode_tps");
    cJSON_DeleteItemFromObject(env, "peak_ram_mb");
    char *out = cJSON_PrintUnformatted(env);
    cJSON_Delete(env);
    return out;
}

typedef struct run_result {
    char *envelopes[16];
    uint64_t forward_calls, logit_rows;
} run_result;

/* Every query on one fresh session (turns continue the conversation, as a user would),
 * with the shortcuts as given. */
static run_result run_turns(const needle_model *m, const char *tools, const char *const *queries,
                            int n, float temperature, uint32_t n_ctx, int jump, int sparse) {
    run_result r;
    memset(&r, 0, sizeof r);
    setenv("NEEDLE_JUMP_FORWARD", jump ? "1" : "0", 1);
    setenv("NEEDLE_SPARSE_LOGITS", sparse ? "1" : "0", 1);
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = n_ctx;
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    if (s) CHECK_EQ_INT(needle_session_set_tools(s, "You are a helpful assistant.", tools), NEEDLE_OK);
    static char out[1 << 15];
    for (int i = 0; s && i < n && i < 16; i++) {
        needle_complete_params p = needle_complete_default_params();
        p.max_new_tokens = 96;
        p.max_think_tokens = 12;
        p.temperature = temperature;
        p.seed = 1000u + (uint64_t)i;
        p.turn = NEEDLE_TURN_QUERY;
        size_t len = 0;
        CHECK_EQ_INT(needle_session_complete(s, queries[i], &p, out, sizeof out, &len), NEEDLE_OK);
        r.envelopes[i] = strip_timing(out);
    }
    if (s) {
        needle_session_stats st = {.size = sizeof st};
        needle_session_get_stats(s, &st);
        r.forward_calls = st.forward_calls;
        r.logit_rows = st.logit_rows;
    }
    needle_session_free(s);
    unsetenv("NEEDLE_JUMP_FORWARD");
    unsetenv("NEEDLE_SPARSE_LOGITS");
    return r;
}

static void compare_modes(const needle_model *m, const char *tools, const char *const *queries,
                          int n, float temperature, uint32_t n_ctx, const char *label) {
    run_result off = run_turns(m, tools, queries, n, temperature, n_ctx, 0, 0);
    const int modes[3][2] = {{1, 0}, {0, 1}, {1, 1}};
    for (int k = 0; k < 3; k++) {
        run_result on = run_turns(m, tools, queries, n, temperature, n_ctx, modes[k][0], modes[k][1]);
        for (int i = 0; i < n; i++)
            CHECK_MSG(off.envelopes[i] && on.envelopes[i] && !strcmp(off.envelopes[i], on.envelopes[i]),
                      "%s, jump %d sparse %d, query %d:\n  off: %s\n  on:  %s", label, modes[k][0],
                      modes[k][1], i, off.envelopes[i] ? off.envelopes[i] : "(none)",
                      on.envelopes[i] ? on.envelopes[i] : "(none)");
        if (modes[k][0])
            CHECK_MSG(on.forward_calls < off.forward_calls, "%s: jump-forward ran %llu passes, "
                      "%llu without", label, (unsigned long long)on.forward_calls,
                      (unsigned long long)off.forward_calls);
        if (modes[k][1])
            CHECK_MSG(on.logit_rows < off.logit_rows, "%s: sparse logits computed %llu rows, "
                      "%llu without", label, (unsigned long long)on.logit_rows,
                      (unsigned long long)off.logit_rows);
        if (k == 2)
            printf("    %s: %llu -> %llu forward passes, %llu -> %llu output rows\n", label,
                   (unsigned long long)off.forward_calls, (unsigned long long)on.forward_calls,
                   (unsigned long long)off.logit_rows, (unsigned long long)on.logit_rows);
        for (int i = 0; i < n; i++) cJSON_free(on.envelopes[i]);
    }
    for (int i = 0; i < n; i++) cJSON_free(off.envelopes[i]);
}

static void test_demo_turns_identical(void) {
    if (getenv("NEEDLE_EMULATED")) { /* the demo's tools prefix takes minutes under qemu */
        harness_skip("the demo model under emulation is slow; covered by the native builds");
        return;
    }
    char path[1200], tools_path[1200];
    snprintf(path, sizeof path, "%s/models/needle-demo.cact", NEEDLE_SOURCE_DIR);
    snprintf(tools_path, sizeof tools_path, "%s/models/needle-demo.tools.json", NEEDLE_SOURCE_DIR);
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open(path, NULL, &m), NEEDLE_OK);
    char *tools = (char *)read_file(tools_path, NULL);
    CHECK(tools != NULL);
    if (m && tools) {
        const char *const queries[] = {
            "Book a premium ride to the airport.", "Convert 120 dollars to euros.",
            "Set a timer for 25 minutes called pasta.", "What's the weather like in Lisbon?",
            "Tell me a joke."};
        compare_modes(m, tools, queries, 5, 0.0f, 4096, "demo greedy");
        compare_modes(m, tools, queries, 5, 0.8f, 4096, "demo sampled");
    }
    free(tools);
    needle_model_free(m);
}

static void test_random_model_turns_identical(void) {
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open(fixture_path("tiny_cq4.cact"), NULL, &m), NEEDLE_OK);
    if (!m) return;
    const char *tools =
        "[{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": {"
        "\"city\": {\"type\": \"string\", \"maxLength\": 12},"
        "\"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}},"
        "\"required\": [\"city\", \"unit\"]}},"
        "{\"name\": \"set_timer\", \"parameters\": {\"type\": \"object\", \"properties\": {"
        "\"minutes\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 120}},"
        "\"required\": [\"minutes\"]}}]";
    const char *const queries[] = {"weather in Rome", "a timer please", "and in Oslo?"};
    compare_modes(m, tools, queries, 3, 0.0f, 4096, "tiny greedy");
    compare_modes(m, tools, queries, 3, 1.0f, 4096, "tiny sampled");
    needle_model_free(m);
}

int main(void) {
    RUN(test_rows_equal_full_logits);
    RUN(test_demo_turns_identical);
    RUN(test_random_model_turns_identical);
    return test_summary();
}
