/* Streaming and progress callbacks (needle_session_set_callbacks) on a fixture model:
 * the token callback sees every output token in order and the pieces add up to the final
 * text (generate's continuation, complete's call array and reasoning); prefill progress
 * rises to the total; callbacks change no result; a callback that cancels gets
 * NEEDLE_ERR_CANCELLED at once, and the session then gives what a fresh one gives. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "needle.h"

static needle_model *model;

static const char *TOOLS =
    "[{\"name\": \"get_weather\", \"description\": \"Current weather for a city\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"city\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 24}},"
    "\"required\": [\"city\"]}},"
    "{\"name\": \"set_timer\", \"description\": \"Start a timer\","
    "\"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"minutes\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 120}},"
    "\"required\": [\"minutes\"]}}]";

/* What the callbacks saw. */
typedef struct seen {
    char text[3][8192]; /* per needle_piece_kind */
    size_t len[3];
    int32_t tokens[1024];
    int32_t kinds[1024];
    size_t n_tokens;
    uint32_t prefill_calls, last_done, last_total;
    int monotonic;       /* every prefill report advanced */
    int bad_kind;
    size_t cancel_at_token;   /* nonzero: cancel on this (1-based) token */
    uint32_t cancel_at_prefill; /* nonzero: cancel on this (1-based) progress report */
} seen;

static int on_token(void *user, int32_t kind, int32_t token, const char *text, size_t len) {
    seen *s = user;
    if (kind < 0 || kind > 2) {
        s->bad_kind = 1;
        return 0;
    }
    if (s->len[kind] + len < sizeof s->text[kind]) {
        memcpy(s->text[kind] + s->len[kind], text, len);
        s->len[kind] += len;
    }
    if (s->n_tokens < sizeof s->tokens / sizeof s->tokens[0]) {
        s->tokens[s->n_tokens] = token;
        s->kinds[s->n_tokens] = kind;
    }
    s->n_tokens++;
    return s->cancel_at_token && s->n_tokens >= s->cancel_at_token;
}

static int on_prefill(void *user, uint32_t done, uint32_t total) {
    seen *s = user;
    if (done <= s->last_done && s->last_total == total) s->monotonic = 0;
    if (done > total) s->monotonic = 0;
    s->prefill_calls++;
    s->last_done = done;
    s->last_total = total;
    return s->cancel_at_prefill && s->prefill_calls >= s->cancel_at_prefill;
}

static void watch(needle_session *s, seen *w) {
    memset(w, 0, sizeof *w);
    w->monotonic = 1;
    needle_callbacks cb = {sizeof cb, w, on_prefill, on_token};
    CHECK_EQ_INT(needle_session_set_callbacks(s, &cb), NEEDLE_OK);
}

static needle_session *plain_session(void) {
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(model, NULL, &s), NEEDLE_OK);
    return s;
}

/* a prompt of n ids that avoids the special ones */
static void prompt_ids(int32_t *ids, size_t n) {
    ids[0] = NEEDLE_TOKEN_BOS;
    for (size_t i = 1; i < n; i++) ids[i] = (int32_t)(4 + (i * 37) % 400);
}

static void test_generate_streams_every_token(void) {
    needle_session *a = plain_session(), *b = plain_session();
    if (!a || !b) goto out;
    int32_t prompt[40], ga[48], gb[48];
    prompt_ids(prompt, 40);
    needle_generate_params gp = needle_generate_default_params();
    gp.max_new_tokens = 48;
    gp.temperature = 0.8f;
    gp.seed = 7;
    size_t na = 0, nb = 0;
    CHECK_EQ_INT(needle_session_generate(a, prompt, 40, &gp, ga, 48, &na), NEEDLE_OK);
    seen w;
    watch(b, &w);
    CHECK_EQ_INT(needle_session_generate(b, prompt, 40, &gp, gb, 48, &nb), NEEDLE_OK);
    /* the callbacks change nothing, and they saw every token in order */
    CHECK_EQ_INT(na, nb);
    CHECK(na > 0 && memcmp(ga, gb, na * sizeof *ga) == 0);
    CHECK(!w.bad_kind && w.len[NEEDLE_PIECE_REASONING] == 0 && w.len[NEEDLE_PIECE_CALLS] == 0);
    /* tokens that add no text (control pieces) are not reported */
    size_t k = 0;
    for (size_t i = 0; i < nb && k < w.n_tokens; i++)
        if (gb[i] == w.tokens[k]) k++;
    CHECK_MSG(k == w.n_tokens && w.n_tokens > 0, "%zu of %zu reported tokens in order", k,
              w.n_tokens);
    size_t len = 0;
    char text[8192];
    CHECK_EQ_INT(needle_detokenize(model, gb, nb, text, sizeof text, &len), NEEDLE_OK);
    if (!strstr(text, "\xEF\xBF\xBD")) /* the pieces are raw bytes, decode replaces bad ones */
        CHECK_MSG(len == w.len[0] && memcmp(text, w.text[0], len) == 0,
                  "pieces \"%.*s\"\n  text \"%s\"", (int)w.len[0], w.text[0], text);
    CHECK(w.prefill_calls >= 1 && w.monotonic && w.last_done == 40 && w.last_total == 40);
out:
    needle_session_free(a);
    needle_session_free(b);
}

static void test_generate_cancel(void) {
    needle_session *a = plain_session(), *b = plain_session();
    if (!a || !b) goto out;
    int32_t prompt[20], ga[32], gb[32];
    prompt_ids(prompt, 20);
    needle_generate_params gp = needle_generate_default_params();
    gp.max_new_tokens = 32;
    size_t na = 0, nb = 0;
    CHECK_EQ_INT(needle_session_generate(a, prompt, 20, &gp, ga, 32, &na), NEEDLE_OK);
    seen w;
    watch(b, &w);
    w.cancel_at_token = 3;
    CHECK_EQ_INT(needle_session_generate(b, prompt, 20, &gp, gb, 32, &nb), NEEDLE_ERR_CANCELLED);
    CHECK(strstr(needle_last_error(), "cancel") != NULL);
    CHECK(nb >= 3 && nb <= na && memcmp(ga, gb, nb * sizeof *ga) == 0);
    /* the session is usable: from the start it generates what it did unwatched */
    needle_session_reset(b);
    CHECK_EQ_INT(needle_session_set_callbacks(b, NULL), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_generate(b, prompt, 20, &gp, gb, 32, &nb), NEEDLE_OK);
    CHECK(na == nb && memcmp(ga, gb, na * sizeof *ga) == 0);
    /* cancelled in the prompt's prefill: nothing generated */
    needle_session_reset(b);
    watch(b, &w);
    w.cancel_at_prefill = 1;
    CHECK_EQ_INT(needle_session_generate(b, prompt, 20, &gp, gb, 32, &nb), NEEDLE_ERR_CANCELLED);
    CHECK_EQ_INT(nb, 0);
    CHECK_EQ_INT(w.n_tokens, 0);
out:
    needle_session_free(a);
    needle_session_free(b);
}

/* The tiny fixtures' tokenizer spends ~200 tokens on the tools (see test_chat.c). */
static needle_session *chat_session(void) {
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 4096;
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(model, &sp, &s), NEEDLE_OK);
    if (s) CHECK_EQ_INT(needle_session_set_tools(s, "", TOOLS), NEEDLE_OK);
    return s;
}

static int complete_sampled(needle_session *s, const char *text, float temperature,
                            uint64_t seed, char *out, size_t cap) {
    needle_complete_params p = needle_complete_default_params();
    p.max_new_tokens = 160;
    p.max_think_tokens = 24;
    p.temperature = temperature;
    p.seed = seed;
    size_t len = 0;
    return needle_session_complete(s, text, &p, out, cap, &len);
}

static int complete(needle_session *s, const char *text, char *out, size_t cap) {
    return complete_sampled(s, text, 0.7f, 11, out, cap);
}

/* function_calls and reasoning of two envelopes are equal */
static int same_answer(const char *a, const char *b) {
    cJSON *ea = cJSON_Parse(a), *eb = cJSON_Parse(b);
    int same = ea && eb &&
               cJSON_Compare(cJSON_GetObjectItem(ea, "function_calls"),
                             cJSON_GetObjectItem(eb, "function_calls"), 1) &&
               cJSON_Compare(cJSON_GetObjectItem(ea, "reasoning"),
                             cJSON_GetObjectItem(eb, "reasoning"), 1) &&
               cJSON_Compare(cJSON_GetObjectItem(ea, "success"),
                             cJSON_GetObjectItem(eb, "success"), 1);
    cJSON_Delete(ea);
    cJSON_Delete(eb);
    return same;
}

/* a query long enough to take several prefill chunks */
static char *long_query(void) {
    const char *word = "weather tomorrow in Paris and Lyon, ";
    const size_t n = 60, wl = strlen(word);
    char *q = malloc(n * wl + 1);
    if (!q) return NULL;
    for (size_t i = 0; i < n; i++) memcpy(q + i * wl, word, wl);
    q[n * wl] = 0;
    return q;
}

static void test_complete_streams_calls_and_reasoning(void) {
    needle_session *a = chat_session(), *b = chat_session();
    char ea[16384], eb[16384];
    char *q = long_query();
    if (!a || !b || !q) goto out;
    const char *queries[] = {"What's the weather in Paris?", q, "set a timer for 5 minutes"};
    for (size_t i = 0; i < 3; i++) {
        seen w;
        CHECK_EQ_INT(complete(a, queries[i], ea, sizeof ea), NEEDLE_OK);
        watch(b, &w);
        CHECK_EQ_INT(complete(b, queries[i], eb, sizeof eb), NEEDLE_OK);
        CHECK_MSG(same_answer(ea, eb), "with callbacks: %s\n  without: %s", eb, ea);
        CHECK(!w.bad_kind && w.len[NEEDLE_PIECE_TEXT] == 0);
        cJSON *env = cJSON_Parse(eb);
        CHECK(env != NULL);
        if (!env) continue;
        if (cJSON_IsTrue(cJSON_GetObjectItem(env, "success"))) {
            /* the call pieces are the envelope's call array, byte for byte */
            w.text[NEEDLE_PIECE_CALLS][w.len[NEEDLE_PIECE_CALLS]] = 0;
            cJSON *calls = cJSON_Parse(w.text[NEEDLE_PIECE_CALLS]);
            CHECK_MSG(calls && cJSON_Compare(calls, cJSON_GetObjectItem(env, "function_calls"), 1),
                      "streamed calls %s, envelope %s", w.text[NEEDLE_PIECE_CALLS], eb);
            CHECK(strstr(eb, w.text[NEEDLE_PIECE_CALLS]) != NULL);
            cJSON_Delete(calls);
            /* and the reasoning pieces, trimmed, its reasoning */
            const char *r = cJSON_GetStringValue(cJSON_GetObjectItem(env, "reasoning"));
            char *t = w.text[NEEDLE_PIECE_REASONING];
            t[w.len[NEEDLE_PIECE_REASONING]] = 0;
            while (*t == ' ' || *t == '\n') t++;
            size_t tl = strlen(t);
            while (tl && (t[tl - 1] == ' ' || t[tl - 1] == '\n')) t[--tl] = 0;
            if (r && !strstr(r, "\xEF\xBF\xBD"))
                CHECK_MSG(!strcmp(r, t), "streamed reasoning \"%s\", envelope \"%s\"", t, r);
        }
        cJSON_Delete(env);
        /* the turn text was prefilled with progress reports up to its length */
        CHECK(w.prefill_calls >= 1 && w.monotonic && w.last_done == w.last_total);
        if (queries[i] == q) CHECK_MSG(w.prefill_calls > 1, "%u reports", w.prefill_calls);
        /* both go on to the next turn from the same conversation */
        needle_session_set_callbacks(b, NULL);
    }
out:
    free(q);
    needle_session_free(a);
    needle_session_free(b);
}

static void trim(char *t) {
    char *p = t;
    while (*p == ' ' || *p == '\n') p++;
    size_t n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\n')) n--;
    memmove(t, p, n);
    t[n] = 0;
}

/* Hot sampling makes the random fixture think: the reasoning tokens reported, decoded and
 * trimmed, are the envelope's reasoning, and so are the pieces' bytes when that is valid
 * UTF-8 (the random model's byte pieces rarely are). */
static void test_complete_streams_reasoning(void) {
    needle_session *s = chat_session();
    char env_text[16384], decoded[8192];
    int32_t ids[1024];
    int with_reasoning = 0;
    for (uint64_t seed = 1; s && seed <= 40 && with_reasoning < 3; seed++) {
        needle_session_reset(s);
        seen w;
        watch(s, &w);
        CHECK_EQ_INT(complete_sampled(s, "weather?", 3.0f, seed, env_text, sizeof env_text),
                     NEEDLE_OK);
        cJSON *env = cJSON_Parse(env_text);
        const char *r = cJSON_GetStringValue(cJSON_GetObjectItem(env, "reasoning"));
        CHECK(r != NULL);
        size_t n = 0, len = 0;
        for (size_t i = 0; i < w.n_tokens && i < 1024; i++)
            if (w.kinds[i] == NEEDLE_PIECE_REASONING) ids[n++] = w.tokens[i];
        CHECK_EQ_INT(needle_detokenize(model, ids, n, decoded, sizeof decoded, &len), NEEDLE_OK);
        trim(decoded);
        char *t = w.text[NEEDLE_PIECE_REASONING];
        t[w.len[NEEDLE_PIECE_REASONING]] = 0;
        trim(t);
        if (r && r[0]) {
            with_reasoning++;
            CHECK_MSG(!strcmp(r, decoded), "streamed reasoning \"%s\", envelope \"%s\"", decoded, r);
            if (!strstr(r, "\xEF\xBF\xBD"))
                CHECK_MSG(!strcmp(r, t), "streamed bytes \"%s\", envelope \"%s\"", t, r);
        }
        cJSON_Delete(env);
    }
    CHECK_MSG(with_reasoning > 0, "no seed made the fixture reason");
    needle_session_free(s);
}

/* Cancelled in the prefill and in the decode, a turn leaves the conversation as it was:
 * the same query then answers as in a session that never saw the cancelled turns. */
static void test_complete_cancel_rolls_back(void) {
    needle_session *a = chat_session(), *b = chat_session();
    char ea[16384], eb[16384];
    char *q = long_query();
    if (!a || !b || !q) goto out;
    CHECK_EQ_INT(complete(a, "What's the weather in Paris?", ea, sizeof ea), NEEDLE_OK);
    CHECK_EQ_INT(complete(b, "What's the weather in Paris?", eb, sizeof eb), NEEDLE_OK);
    const uint32_t pos = needle_session_position(b);
    seen w;
    watch(b, &w);
    w.cancel_at_prefill = 2;
    size_t len = 0;
    CHECK_EQ_INT(complete(b, q, eb, sizeof eb), NEEDLE_ERR_CANCELLED);
    CHECK_EQ_INT(w.n_tokens, 0);
    CHECK_EQ_INT(needle_session_position(b), pos);
    watch(b, &w);
    w.cancel_at_token = 2;
    CHECK_EQ_INT(complete(b, q, eb, sizeof eb), NEEDLE_ERR_CANCELLED);
    CHECK_EQ_INT(w.n_tokens, 2);
    CHECK_EQ_INT(needle_session_position(b), pos);
    CHECK_EQ_INT(needle_session_set_callbacks(b, NULL), NEEDLE_OK);
    CHECK_EQ_INT(complete(a, q, ea, sizeof ea), NEEDLE_OK);
    CHECK_EQ_INT(complete(b, q, eb, sizeof eb), NEEDLE_OK);
    CHECK_MSG(same_answer(ea, eb), "after cancelled turns: %s\n  never cancelled: %s", eb, ea);
    (void)len;
    /* cancelling set_tools leaves a session that takes tools again */
    watch(b, &w);
    w.cancel_at_prefill = 1;
    CHECK_EQ_INT(needle_session_set_tools(b, "", TOOLS), NEEDLE_ERR_CANCELLED);
    CHECK_EQ_INT(needle_session_complete(b, "hi", NULL, eb, sizeof eb, &len), NEEDLE_ERR_STATE);
    CHECK_EQ_INT(needle_session_set_callbacks(b, NULL), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_set_tools(b, "", TOOLS), NEEDLE_OK);
    needle_session_reset(a);
    CHECK_EQ_INT(complete(a, "set a timer for 5 minutes", ea, sizeof ea), NEEDLE_OK);
    CHECK_EQ_INT(complete(b, "set a timer for 5 minutes", eb, sizeof eb), NEEDLE_OK);
    CHECK_MSG(same_answer(ea, eb), "after a cancelled set_tools: %s\n  never cancelled: %s", eb, ea);
out:
    free(q);
    needle_session_free(a);
    needle_session_free(b);
}

/* function_calls of an envelope, as JSON text (caller frees) */
static char *calls_of(const char *envelope) {
    cJSON *e = cJSON_Parse(envelope);
    char *calls = e ? cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "function_calls")) : NULL;
    cJSON_Delete(e);
    return calls;
}

/* The demo model's weather and timer tools, for the replay test: a trained model writes
 * its calls as the tokenizer encodes them, so a replayed turn can match a decoded one. */
static const char *DEMO_TOOLS =
    "[{\"name\": \"get_weather\", \"description\": \"Get the current weather or forecast for a "
    "location.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": "
    "\"string\", \"description\": \"City name\"}, \"day\": {\"type\": \"string\", \"description\": "
    "\"Day of the forecast, e.g. today or tomorrow\"}}, \"required\": [\"location\"]}}, "
    "{\"name\": \"set_timer\", \"description\": \"Start a countdown timer.\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"minutes\": {\"type\": \"integer\", \"description\": "
    "\"Duration in minutes\", \"minimum\": 1, \"maximum\": 1440}, \"label\": {\"type\": \"string\", "
    "\"description\": \"Optional name for the timer\"}}, \"required\": [\"minutes\"]}}]";

/* needle_session_append_turn replays an exchange the caller holds: on the demo model, a
 * session that replays a decoded turn ends where the decoding session ended and answers
 * the next AUTO turn (a tool result after a call) alike; bad
 * calls or an overflow leave the conversation as it was. */
static void test_append_turn(void) {
    needle_model *demo = NULL;
    needle_session *a = NULL, *b = NULL, *bare = plain_session();
    char ea[16384], eb[16384];
    const char *path = NEEDLE_SOURCE_DIR "/models/needle-demo.cact";
    if (access(path, R_OK) != 0) {
        harness_skip("no models/needle-demo.cact");
        goto out;
    }
    CHECK_EQ_INT(needle_model_open(path, NULL, &demo), NEEDLE_OK);
    if (!demo) goto out;
    CHECK_EQ_INT(needle_session_create(demo, NULL, &a), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_create(demo, NULL, &b), NEEDLE_OK);
    if (!a || !b || !bare) goto out;
    CHECK_EQ_INT(needle_session_set_tools(a, "", DEMO_TOOLS), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_set_tools(b, "", DEMO_TOOLS), NEEDLE_OK);
    const char *queries[] = {"What's the weather in Paris?", "Set a timer for 25 minutes"};
    for (size_t i = 0; i < 2; i++) {
        needle_session_reset(a);
        needle_session_reset(b);
        CHECK_EQ_INT(complete_sampled(a, queries[i], 0, 0, ea, sizeof ea), NEEDLE_OK);
        char *calls = calls_of(ea);
        CHECK_MSG(calls && strcmp(calls, "[]") != 0, "%s", ea);
        if (!calls) continue;
        CHECK_EQ_INT(needle_session_append_turn(b, queries[i], NEEDLE_TURN_QUERY, calls),
                     NEEDLE_OK);
        cJSON_free(calls);
        CHECK_EQ_INT(needle_session_position(b), needle_session_position(a));
        CHECK_EQ_INT(complete_sampled(a, "{\"ok\": true}", 0, 0, ea, sizeof ea), NEEDLE_OK);
        CHECK_EQ_INT(complete_sampled(b, "{\"ok\": true}", 0, 0, eb, sizeof eb), NEEDLE_OK);
        CHECK_MSG(same_answer(ea, eb), "replayed: %s\n  decoded: %s", eb, ea);
    }
    needle_session_reset(b);
    const uint32_t pos = needle_session_position(b);
    CHECK_EQ_INT(needle_session_append_turn(b, "hi", NEEDLE_TURN_QUERY, "[{\"name\""),
                 NEEDLE_ERR_JSON);
    CHECK_EQ_INT(needle_session_append_turn(b, "hi", NEEDLE_TURN_QUERY, "{}"), NEEDLE_ERR_JSON);
    CHECK_EQ_INT(needle_session_position(b), pos);
    char *huge = malloc(400000);
    if (huge) {
        memset(huge, 'a', 399999);
        huge[399999] = 0;
        CHECK_EQ_INT(needle_session_append_turn(b, huge, NEEDLE_TURN_QUERY, "[]"),
                     NEEDLE_ERR_CONTEXT_FULL);
        CHECK_EQ_INT(needle_session_position(b), pos);
        free(huge);
    }
    /* a replayed refusal keeps the next turn a query */
    CHECK_EQ_INT(needle_session_append_turn(b, "hi", NEEDLE_TURN_QUERY, "[]"), NEEDLE_OK);
    CHECK_EQ_INT(complete_sampled(b, "Set a timer for 5 minutes", 0, 0, eb, sizeof eb), NEEDLE_OK);
    CHECK_MSG(strstr(eb, "\"type\":\"call\"") != NULL, "%s", eb);
    CHECK_EQ_INT(needle_session_append_turn(bare, "hi", NEEDLE_TURN_QUERY, "[]"), NEEDLE_ERR_STATE);
    CHECK_EQ_INT(needle_session_append_turn(NULL, "hi", 0, "[]"), NEEDLE_ERR_INVALID_ARGUMENT);
out:
    needle_session_free(a);
    needle_session_free(b);
    needle_session_free(bare);
    needle_model_free(demo);
}

static void test_bad_arguments(void) {
    needle_callbacks cb = {sizeof cb, NULL, NULL, NULL};
    CHECK_EQ_INT(needle_session_set_callbacks(NULL, &cb), NEEDLE_ERR_INVALID_ARGUMENT);
    needle_session *s = plain_session();
    if (!s) return;
    cb.size = 0;
    CHECK_EQ_INT(needle_session_set_callbacks(s, &cb), NEEDLE_ERR_INVALID_ARGUMENT);
    cb.size = sizeof cb + 8;
    CHECK_EQ_INT(needle_session_set_callbacks(s, &cb), NEEDLE_ERR_INVALID_ARGUMENT);
    /* an older caller's struct without on_token */
    seen w;
    memset(&w, 0, sizeof w);
    w.monotonic = 1;
    needle_callbacks old = {(uint32_t)offsetof(needle_callbacks, on_token), &w, on_prefill, on_token};
    CHECK_EQ_INT(needle_session_set_callbacks(s, &old), NEEDLE_OK);
    int32_t prompt[8], out[4];
    prompt_ids(prompt, 8);
    needle_generate_params gp = needle_generate_default_params();
    gp.max_new_tokens = 4;
    size_t n = 0;
    CHECK_EQ_INT(needle_session_generate(s, prompt, 8, &gp, out, 4, &n), NEEDLE_OK);
    CHECK(w.prefill_calls >= 1 && w.n_tokens == 0);
    needle_session_free(s);
}

/* `needle generate` prints the continuation as it streams: stdout is the API's decoded
 * continuation of the same prompt. */
static void test_cli_generate_streams(void) {
    static char out[8192];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s generate --weights %s -n 24 --prompt 'call the weather tool' "
             "2>/dev/null", cli_path(), fixture_path("tiny_cq4.cact"));
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    needle_session *s = plain_session();
    if (!s) return;
    int32_t ids[64], gen[24];
    size_t n = 0, n_gen = 0, len = 0;
    ids[0] = NEEDLE_TOKEN_BOS;
    const char *prompt = "call the weather tool";
    CHECK_EQ_INT(needle_tokenize(model, prompt, strlen(prompt), ids + 1, 63, &n), NEEDLE_OK);
    needle_generate_params gp = needle_generate_default_params();
    gp.max_new_tokens = 24;
    CHECK_EQ_INT(needle_session_generate(s, ids, n + 1, &gp, gen, 24, &n_gen), NEEDLE_OK);
    char text[4096];
    CHECK_EQ_INT(needle_detokenize(model, gen, n_gen, text, sizeof text - 1, &len), NEEDLE_OK);
    text[len] = '\n';
    text[len + 1] = 0;
    if (strstr(text, "\xEF\xBF\xBD")) harness_skip("the continuation is not valid UTF-8");
    else CHECK_MSG(!strcmp(out, text), "cli \"%s\"\n  api \"%s\"", out, text);
    needle_session_free(s);
}

/* `needle run` on a terminal shows the progress of a long prefill on stderr; piped, not. */
static void test_cli_prefill_progress(void) {
    if (access("/usr/bin/script", X_OK) != 0) {
        harness_skip("no script(1) to give the CLI a terminal");
        return;
    }
    char tools_path[] = "/tmp/needle_stream_tools_XXXXXX";
    int fd = mkstemp(tools_path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(write(fd, TOOLS, strlen(TOOLS)) == (ssize_t)strlen(TOOLS));
    close(fd);
    char *q = long_query();
    static char out[16384];
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "/usr/bin/script -qec \"%s run --weights %s --tools %s --ctx 4096 "
             "'%s' >/dev/null\" /dev/null", cli_path(), fixture_path("tiny_cq4.cact"),
             tools_path, q);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "[prefill ") && strstr(out, " tokens]"), "terminal: %s", out);
    snprintf(cmd, sizeof cmd, "%s run --weights %s --tools %s --ctx 4096 '%s' 2>&1 >/dev/null",
             cli_path(), fixture_path("tiny_cq4.cact"), tools_path, q);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(!strstr(out, "[prefill "), "piped: %s", out);
    unlink(tools_path);
    free(q);
}

static void test_fixture_present(void) {
    CHECK_EQ_INT(needle_model_open(fixture_path("tiny_cq4.cact"), NULL, &model), NEEDLE_OK);
}

int main(void) {
    RUN(test_fixture_present);
    if (!model) return test_summary();
    RUN(test_generate_streams_every_token);
    RUN(test_generate_cancel);
    RUN(test_complete_streams_calls_and_reasoning);
    RUN(test_complete_streams_reasoning);
    RUN(test_complete_cancel_rolls_back);
    RUN(test_append_turn);
    RUN(test_bad_arguments);
    RUN(test_cli_generate_streams);
    RUN(test_cli_prefill_progress);
    needle_model_free(model);
    return test_summary();
}
