/* Tool calling end to end on a fixture model (random weights, so the answers are
 * arbitrary but must always be well formed): envelopes parse, calls use declared names
 * and satisfy their schemas, multi-turn continues from the cache without recomputing the
 * prefix, reset returns to the prefix, a conversation far longer than the window runs in
 * bounded memory, every bad input is a clean error, and the official global ABI works. */
#include <cjson/cJSON.h>
#include <glob.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"
#include "needle2.h"

static char model_path[1024];
static needle_model *model;

static const char *WEATHER_TOOLS =
    "[{\"name\": \"get_weather\", \"description\": \"Current weather for a city\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"city\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 24},"
    "\"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}},"
    "\"required\": [\"city\"]}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"set_timer\", \"description\": \"Start a timer\","
    "\"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"minutes\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 120}},"
    "\"required\": [\"minutes\"]}}}]";

static const char *ONE_WEATHER_TOOL =
    "[{\"name\": \"get_weather\", \"description\": \"Current weather for a city\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"city\": {\"type\": \"string\", \"maxLength\": 24},"
    "\"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}},"
    "\"required\": [\"city\"]}}]";

/* Checks an envelope's shape and that every call is declared and valid for the tools
 * above. Returns the parsed envelope (caller frees). */
static cJSON *check_envelope(const char *text) {
    cJSON *env = cJSON_Parse(text);
    CHECK_MSG(env != NULL, "envelope is not JSON: %s", text);
    if (!env) return NULL;
    const char *keys[] = {"type", "success", "error", "error_code", "function_calls", "reasoning",
                          "confidence", "prefill_tps", "decode_tps", "peak_ram_mb"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        CHECK_MSG(cJSON_HasObjectItem(env, keys[i]), "envelope lacks %s: %s", keys[i], text);
    /* every successful turn has a confidence in [0, 1]; failures have none */
    const cJSON *conf = cJSON_GetObjectItem(env, "confidence");
    if (cJSON_IsTrue(cJSON_GetObjectItem(env, "success")))
        CHECK_MSG(cJSON_IsNumber(conf) && conf->valuedouble >= 0 && conf->valuedouble <= 1,
                  "confidence not in [0, 1]: %s", text);
    else
        CHECK_MSG(cJSON_IsNull(conf), "a failed turn with a confidence: %s", text);
    const cJSON *calls = cJSON_GetObjectItem(env, "function_calls");
    CHECK(cJSON_IsArray(calls));
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(call, "name"));
        const cJSON *args = cJSON_GetObjectItem(call, "arguments");
        CHECK_MSG(name && cJSON_IsObject(args), "malformed call in %s", text);
        if (!name || !cJSON_IsObject(args)) continue;
        if (!strcmp(name, "get_weather")) {
            const cJSON *city = cJSON_GetObjectItem(args, "city");
            const cJSON *unit = cJSON_GetObjectItem(args, "unit");
            CHECK_MSG(cJSON_IsString(city), "get_weather without a city: %s", text);
            if (cJSON_IsString(city)) {
                size_t n = 0; /* code points */
                for (const unsigned char *p = (const unsigned char *)city->valuestring; *p; p++) n += (*p & 0xC0) != 0x80;
                CHECK_MSG(n >= 1 && n <= 24, "city length %zu: %s", n, text);
            }
            if (unit)
                CHECK_MSG(cJSON_IsString(unit) && (!strcmp(unit->valuestring, "celsius") ||
                                                   !strcmp(unit->valuestring, "fahrenheit")),
                          "bad unit: %s", text);
            const cJSON *k;
            cJSON_ArrayForEach(k, args) CHECK_MSG(!strcmp(k->string, "city") || !strcmp(k->string, "unit"), "unknown key %s", k->string);
        } else if (!strcmp(name, "set_timer")) {
            const cJSON *minutes = cJSON_GetObjectItem(args, "minutes");
            CHECK_MSG(cJSON_IsNumber(minutes) && minutes->valuedouble >= 1 && minutes->valuedouble <= 120 &&
                      minutes->valuedouble == (double)(long)minutes->valuedouble,
                      "bad minutes: %s", text);
            CHECK_MSG(cJSON_GetArraySize(args) == 1, "extra keys: %s", text);
        } else {
            CHECK_MSG(0, "undeclared tool %s", name);
        }
    }
    return env;
}

/* The tiny fixtures' 512-piece tokenizer spends ~200 tokens on the tools, more than their
 * 128-position max_seq_len, so chat sessions here ask for a longer context. */
#define CHAT_CTX 4096u

static needle_session *chat_session_kv(uint32_t n_ctx, const char *tools, int32_t kv_type) {
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = n_ctx ? n_ctx : CHAT_CTX;
    sp.kv_type = kv_type;
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(model, &sp, &s), NEEDLE_OK);
    if (s) CHECK_MSG(needle_session_set_tools(s, "You are a helpful assistant.", tools) == NEEDLE_OK,
                     "set_tools: %s", needle_last_error());
    return s;
}

static needle_session *chat_session(uint32_t n_ctx, const char *tools) {
    return chat_session_kv(n_ctx, tools, NEEDLE_KV_F32);
}

static int complete(needle_session *s, const char *text, int turn, float temperature,
                    uint64_t seed, char *out, size_t cap) {
    needle_complete_params p = needle_complete_default_params();
    p.max_new_tokens = 160;
    p.max_think_tokens = 16;
    p.turn = turn;
    p.temperature = temperature;
    p.seed = seed;
    size_t len = 0;
    return needle_session_complete(s, text, &p, out, cap, &len);
}

static void test_calls_are_well_formed(void) {
    needle_session *s = chat_session(0, WEATHER_TOOLS);
    static char out[65536];
    const char *queries[] = {"What's the weather in Lagos?", "set a timer for 5 minutes",
                             "tell me a joke", "météo à Paris 😀"};
    for (int round = 0; round < 12; round++) {
        needle_session_reset(s);
        const int sampled = round >= 4;
        int rc = complete(s, queries[round % 4], NEEDLE_TURN_QUERY, sampled ? 0.8f : 0.0f,
                          (uint64_t)round, out, sizeof out);
        CHECK_MSG(rc == NEEDLE_OK, "complete: %s", needle_last_error());
        cJSON *env = check_envelope(out);
        if (env) {
            /* random weights sampled hot may keep appending calls past max_new_tokens;
             * that must still be a clean envelope. Greedy turns must succeed. */
            const cJSON *ok = cJSON_GetObjectItem(env, "success");
            const char *code = cJSON_GetStringValue(cJSON_GetObjectItem(env, "error_code"));
            CHECK_MSG(cJSON_IsTrue(ok) || (sampled && code && !strcmp(code, "max_tokens")),
                      "turn failed: %s", out);
            CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(env, "type")), "call"));
        }
        cJSON_Delete(env);
    }
    needle_session_free(s);
}

static void test_single_tool_extraction_always_calls_it(void) {
    const char *tools = "[{\"name\":\"extract_contact\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                        "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}},"
                        "\"required\":[\"name\",\"age\"]}}]";
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = CHAT_CTX;
    needle_session *s;
    CHECK_EQ_INT(needle_session_create(model, &sp, &s), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_set_tools(s, "", tools), NEEDLE_OK);
    static char out[65536];
    needle_complete_params p = needle_complete_default_params();
    p.extract = 1;
    p.max_think_tokens = 8;
    for (int i = 0; i < 4; i++) {
        size_t len;
        needle_session_reset(s);
        p.seed = (uint64_t)i;
        p.temperature = i ? 1.0f : 0.0f;
        CHECK_EQ_INT(needle_session_complete(s, "Ada Lovelace, 36", &p, out, sizeof out, &len), NEEDLE_OK);
        cJSON *env = cJSON_Parse(out);
        const cJSON *calls = cJSON_GetObjectItem(env, "function_calls");
        CHECK_MSG(cJSON_GetArraySize(calls) == 1, "extraction must yield exactly one call: %s", out);
        const cJSON *c0 = cJSON_GetArrayItem(calls, 0);
        CHECK(c0 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(c0, "name")), "extract_contact"));
        const cJSON *args = cJSON_GetObjectItem(c0, "arguments");
        CHECK(cJSON_IsString(cJSON_GetObjectItem(args, "name")) && cJSON_IsNumber(cJSON_GetObjectItem(args, "age")));
        cJSON_Delete(env);
    }
    needle_session_free(s);
}

/* A session re-bound to other tools answers exactly as a fresh session bound to them: no
 * state of the earlier tools' conversation (position, KV, engram ring) survives. */
static void test_rebinding_tools_starts_afresh(void) {
    const char *other = "[{\"name\":\"play_music\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"query\":{\"type\":\"string\",\"maxLength\":16}},"
                        "\"required\":[\"query\"]}}]";
    static char a[65536], b[65536];
    needle_session *reused = chat_session(0, WEATHER_TOOLS);
    needle_session *fresh = chat_session(0, other);
    if (!reused || !fresh) goto done;
    CHECK_EQ_INT(complete(reused, "weather in Oslo?", NEEDLE_TURN_QUERY, 0, 0, a, sizeof a), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_set_tools(reused, "You are a helpful assistant.", other), NEEDLE_OK);
    CHECK_EQ_INT(complete(reused, "play some jazz", NEEDLE_TURN_QUERY, 0, 0, a, sizeof a), NEEDLE_OK);
    CHECK_EQ_INT(complete(fresh, "play some jazz", NEEDLE_TURN_QUERY, 0, 0, b, sizeof b), NEEDLE_OK);
    /* the envelopes differ only in timing fields, so compare the calls */
    cJSON *ea = cJSON_Parse(a), *eb = cJSON_Parse(b);
    char *ca = ea ? cJSON_PrintUnformatted(cJSON_GetObjectItem(ea, "function_calls")) : NULL;
    char *cb = eb ? cJSON_PrintUnformatted(cJSON_GetObjectItem(eb, "function_calls")) : NULL;
    CHECK_MSG(ca && cb && !strcmp(ca, cb), "re-bound: %s\n    fresh: %s", ca ? ca : a, cb ? cb : b);
    CHECK_EQ_INT(needle_session_position(reused), needle_session_position(fresh));
    free(ca);
    free(cb);
    cJSON_Delete(ea);
    cJSON_Delete(eb);
done:
    needle_session_free(reused);
    needle_session_free(fresh);
}

static void test_multi_turn_reuses_the_cache(void) {
    needle_session *s = chat_session(0, WEATHER_TOOLS);
    static char first[65536], again[65536], out[65536];
    needle_session_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
    needle_session_get_stats(s, &st0);
    CHECK_EQ_INT(st0.prefix_evaluations, 1);
    uint32_t prefix = needle_session_prefix_length(s);
    CHECK(prefix > 20);
    CHECK_EQ_INT(needle_session_position(s), prefix);

    CHECK_EQ_INT(complete(s, "What's the weather in Lagos?", NEEDLE_TURN_QUERY, 0, 0, first, sizeof first), NEEDLE_OK);
    uint32_t after_first = needle_session_position(s);
    CHECK(after_first > prefix);
    /* a tool result, then a follow-up query: both continue the same conversation */
    CHECK_EQ_INT(complete(s, "[{\"temp_c\": 27, \"sky\": \"clear\"}]", NEEDLE_TURN_TOOL_RESULT, 0, 0, out, sizeof out), NEEDLE_OK);
    cJSON_Delete(check_envelope(out));
    CHECK(needle_session_position(s) > after_first);
    CHECK_EQ_INT(complete(s, "and in Oslo?", NEEDLE_TURN_QUERY, 0, 0, out, sizeof out), NEEDLE_OK);
    cJSON_Delete(check_envelope(out));

    /* the prefix was evaluated once: every later token is a turn token */
    needle_session_get_stats(s, &st1);
    CHECK_EQ_INT(st1.prefix_evaluations, 1);
    CHECK_EQ_INT(st1.tokens_evaluated - st0.tokens_evaluated, needle_session_position(s) - prefix);

    /* reset goes back to the cached prefix and the same query gives the same answer */
    needle_session_reset(s);
    CHECK_EQ_INT(needle_session_position(s), prefix);
    CHECK_EQ_INT(complete(s, "What's the weather in Lagos?", NEEDLE_TURN_QUERY, 0, 0, again, sizeof again), NEEDLE_OK);
    cJSON *a = cJSON_Parse(first), *b = cJSON_Parse(again);
    char *ca = cJSON_PrintUnformatted(cJSON_GetObjectItem(a, "function_calls"));
    char *cb = cJSON_PrintUnformatted(cJSON_GetObjectItem(b, "function_calls"));
    CHECK_MSG(ca && cb && !strcmp(ca, cb), "after reset: %s vs %s", ca, cb);
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(a, "reasoning")),
                  cJSON_GetStringValue(cJSON_GetObjectItem(b, "reasoning"))));
    needle_session_get_stats(s, &st1);
    CHECK_EQ_INT(st1.prefix_evaluations, 1);
    cJSON_free(ca);
    cJSON_free(cb);
    cJSON_Delete(a);
    cJSON_Delete(b);
    needle_session_free(s);
}

/* The calls and reasoning of two envelopes (the rest are timings) are the same. */
static void check_same_answer(const char *a, const char *b, const char *what) {
    cJSON *ea = cJSON_Parse(a), *eb = cJSON_Parse(b);
    char *ca = ea ? cJSON_PrintUnformatted(cJSON_GetObjectItem(ea, "function_calls")) : NULL;
    char *cb = eb ? cJSON_PrintUnformatted(cJSON_GetObjectItem(eb, "function_calls")) : NULL;
    const char *ra = ea ? cJSON_GetStringValue(cJSON_GetObjectItem(ea, "reasoning")) : NULL;
    const char *rb = eb ? cJSON_GetStringValue(cJSON_GetObjectItem(eb, "reasoning")) : NULL;
    CHECK_MSG(ca && cb && !strcmp(ca, cb), "%s: %s\n    unbroken: %s", what, a, b);
    CHECK_MSG(ra && rb && !strcmp(ra, rb), "%s: reasoning differs", what);
    cJSON_free(ca);
    cJSON_free(cb);
    cJSON_Delete(ea);
    cJSON_Delete(eb);
}

/* A failed turn leaves the conversation as it was before the turn. Two failures in the
 * second turn of a conversation: a hard one (the envelope does not fit the caller's
 * buffer, after the whole turn was decoded) and a turn-level one (max_new_tokens). After
 * each the position is that after the first turn, and the second turn, run again, gives
 * what a conversation without the failures gives. The fixture's window is shorter than
 * the conversation, so the rollback must bring back KV rows the failed turn overwrote
 * (and, for the int8 cache, their scales). */
static void failed_turn_is_rolled_back(int32_t kv_type) {
    static char out[65536], unbroken[65536];
    char small[40];
    size_t len = 0;
    needle_session *s = chat_session_kv(0, WEATHER_TOOLS, kv_type);
    needle_session *ref = chat_session_kv(0, WEATHER_TOOLS, kv_type);
    if (!s || !ref) goto done;
    const char *q1 = "What's the weather in Lagos?", *q2 = "and in Oslo, in fahrenheit?";
    CHECK_EQ_INT(complete(s, q1, NEEDLE_TURN_QUERY, 0, 0, out, sizeof out), NEEDLE_OK);
    CHECK_EQ_INT(complete(ref, q1, NEEDLE_TURN_QUERY, 0, 0, unbroken, sizeof unbroken), NEEDLE_OK);
    const uint32_t after_first = needle_session_position(s);
    CHECK(after_first > needle_session_prefix_length(s));

    needle_complete_params p = needle_complete_default_params();
    p.max_new_tokens = 160;
    p.max_think_tokens = 16;
    p.turn = NEEDLE_TURN_TOOL_RESULT; /* a "call" turn before: AUTO would be a result too */
    CHECK_EQ_INT(needle_session_complete(s, "[{\"temp_c\": 30}]", &p, small, sizeof small, &len),
                 NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(needle_session_position(s), after_first);
    p.max_new_tokens = 3;
    CHECK_EQ_INT(needle_session_complete(s, "[{\"temp_c\": 30}]", &p, out, sizeof out, &len),
                 NEEDLE_OK);
    cJSON *env = check_envelope(out);
    CHECK(env && cJSON_IsFalse(cJSON_GetObjectItem(env, "success")));
    cJSON_Delete(env);
    CHECK_EQ_INT(needle_session_position(s), after_first);

    CHECK_EQ_INT(complete(s, "[{\"temp_c\": 30}]", NEEDLE_TURN_TOOL_RESULT, 0, 0, out, sizeof out),
                 NEEDLE_OK);
    CHECK_EQ_INT(complete(ref, "[{\"temp_c\": 30}]", NEEDLE_TURN_TOOL_RESULT, 0, 0, unbroken,
                          sizeof unbroken), NEEDLE_OK);
    check_same_answer(out, unbroken, "after the failed turns");
    CHECK_EQ_INT(complete(s, q2, NEEDLE_TURN_QUERY, 0, 0, out, sizeof out), NEEDLE_OK);
    CHECK_EQ_INT(complete(ref, q2, NEEDLE_TURN_QUERY, 0, 0, unbroken, sizeof unbroken), NEEDLE_OK);
    check_same_answer(out, unbroken, "the turn after");
    CHECK_EQ_INT(needle_session_position(s), needle_session_position(ref));
    /* the same cache: a few more tokens give the same logits, bit for bit (a row the
     * rollback failed to bring back changes them even where the answers survive) */
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(model, &info);
    const int32_t probe[4] = {5, 6, 7, 8};
    float *ls = malloc(4 * (size_t)info.vocab * sizeof *ls);
    float *lr = malloc(4 * (size_t)info.vocab * sizeof *lr);
    CHECK(ls && lr &&
          needle_session_eval(s, probe, 4, ls, 4 * (size_t)info.vocab) == NEEDLE_OK &&
          needle_session_eval(ref, probe, 4, lr, 4 * (size_t)info.vocab) == NEEDLE_OK);
    CHECK_MSG(ls && lr && memcmp(ls, lr, 4 * (size_t)info.vocab * sizeof *ls) == 0,
              "kv %d: logits after the conversation differ from the unbroken one's", kv_type);
    free(ls);
    free(lr);
done:
    needle_session_free(s);
    needle_session_free(ref);
}

static void test_failed_turn_is_rolled_back(void) {
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(model, &info);
    CHECK(info.kv_window > 0 && info.kv_window < 90); /* a turn here is ~90 positions */
    failed_turn_is_rolled_back(NEEDLE_KV_F32);
    failed_turn_is_rolled_back(NEEDLE_KV_INT8);
}

/* Needle 3: the same rollbacks on the v3a fixture, whose local layers keep a ring of only
 * their 8-position window (session.c kv_layout) while the conversation runs to hundreds of
 * positions: the failed turns overwrite ring rows the checkpoint must bring back, in every
 * KV precision. */
static void test_failed_turn_is_rolled_back_v3(void) {
    needle_model *v2 = model, *v3 = NULL;
    CHECK_EQ_INT(needle_model_open(fixture_path("v3/v3a.cact"), NULL, &v3), NEEDLE_OK);
    if (!v3) return;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(v3, &info);
    CHECK(info.generation == 3 && info.sliding_window > 0 && info.sliding_window < 90);
    model = v3;
    failed_turn_is_rolled_back(NEEDLE_KV_F32);
    failed_turn_is_rolled_back(NEEDLE_KV_F16);
    failed_turn_is_rolled_back(NEEDLE_KV_INT8);
    model = v2;
    needle_model_free(v3);
}

static void test_long_conversation_bounded_memory(void) {
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(model, &info);
    CHECK(info.kv_window > 0);
    needle_session *s = chat_session(1u << 16, WEATHER_TOOLS);
    static char out[65536];
    uint32_t target = needle_session_prefix_length(s) + 8 * info.kv_window;
    int turns = 0;
    while (needle_session_position(s) < target && turns < 400) {
        CHECK_EQ_INT(complete(s, turns % 2 ? "[{\"ok\": true}]" : "and then?", NEEDLE_TURN_AUTO, 0, 0, out, sizeof out), NEEDLE_OK);
        cJSON *env = check_envelope(out);
        CHECK_MSG(cJSON_IsTrue(cJSON_GetObjectItem(env, "success")), "turn %d failed: %s", turns, out);
        cJSON_Delete(env);
        turns++;
    }
    CHECK_MSG(needle_session_position(s) >= target, "conversation reached %u of %u positions",
              needle_session_position(s), target);
    needle_session_free(s);
}

static void test_bad_input(void) {
    needle_session *s;
    needle_session_params big = needle_session_default_params();
    big.n_ctx = CHAT_CTX;
    CHECK_EQ_INT(needle_session_create(model, &big, &s), NEEDLE_OK);
    static char out[65536];
    size_t len;
    CHECK_EQ_INT(needle_session_complete(s, "hi", NULL, out, sizeof out, &len), NEEDLE_ERR_STATE);
    CHECK_EQ_INT(needle_session_set_tools(s, "", "[{\"name\": \"a\""), NEEDLE_ERR_JSON);
    CHECK_EQ_INT(needle_session_set_tools(s, "", "[{\"name\":\"a\"},{\"name\":\"a\"}]"), NEEDLE_ERR_SCHEMA);
    CHECK_EQ_INT(needle_session_set_tools(s, "", "[{\"name\":\"a\",\"parameters\":{\"type\":\"object\","
                 "\"properties\":{\"x\":{\"$ref\":\"#/defs/y\"}}}}]"), NEEDLE_ERR_SCHEMA);
    CHECK(strlen(needle_last_error()) > 0);
    CHECK_EQ_INT(needle_session_set_tools(s, "", "[{\"name\":\"a\",\"parameters\":{\"type\":\"object\","
                 "\"properties\":{\"x\":{\"type\":\"integer\",\"minimum\":5,\"maximum\":1}}}}]"), NEEDLE_ERR_SCHEMA);
    CHECK_EQ_INT(needle_session_set_tools(s, "\xff", WEATHER_TOOLS), NEEDLE_ERR_INVALID_UTF8);
    CHECK_EQ_INT(needle_session_set_tools(s, NULL, WEATHER_TOOLS), NEEDLE_OK);

    /* invalid text is an error envelope, and the session stays usable */
    CHECK_EQ_INT(needle_session_complete(s, "bad \xc3\x28 text", NULL, out, sizeof out, &len), NEEDLE_OK);
    cJSON *env = check_envelope(out);
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(env, "success")));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(env, "error_code")), "invalid_input"));
    cJSON_Delete(env);

    /* cut by max_new_tokens: an error envelope, and the conversation is back at the prefix */
    needle_complete_params p = needle_complete_default_params();
    p.max_new_tokens = 3;
    CHECK_EQ_INT(needle_session_complete(s, "weather in Rome", &p, out, sizeof out, &len), NEEDLE_OK);
    env = check_envelope(out);
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(env, "success")));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(env, "error_code")), "max_tokens"));
    cJSON_Delete(env);
    CHECK_EQ_INT(needle_session_position(s), needle_session_prefix_length(s));

    /* a buffer too small: negative status, and never truncated JSON */
    char small[40];
    memset(small, 'x', sizeof small);
    CHECK_EQ_INT(needle_session_complete(s, "weather in Rome", NULL, small, sizeof small, &len), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK(len + 1 > sizeof small);
    CHECK(small[0] == 0 || cJSON_Parse(small) != NULL);

    /* a query longer than the context */
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = needle_session_prefix_length(s) + 8;
    needle_session *tiny;
    CHECK_EQ_INT(needle_session_create(model, &sp, &tiny), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_set_tools(tiny, "", WEATHER_TOOLS), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_complete(tiny, "a long query that cannot fit in eight positions at all",
                                         NULL, out, sizeof out, &len), NEEDLE_OK);
    env = check_envelope(out);
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(env, "error_code")), "context_full"));
    cJSON_Delete(env);
    needle_session_free(tiny);
    needle_session_free(s);
}

static void test_official_abi(void) {
    size_t size = 0;
    uint8_t *blob = read_file(model_path, &size);
    CHECK(blob != NULL);
    static char out[65536];
    CHECK_EQ_INT(needle_complete("hi", 64, out, sizeof out) < 0, 1); /* before init */
    CHECK_EQ_INT(needle_load((const char *)blob, size), 0);
    CHECK_EQ_INT(needle_init("", WEATHER_TOOLS, NULL), 0);
    CHECK_EQ_INT(needle_complete("weather in Lima", 128, out, sizeof out), 0);
    cJSON_Delete(check_envelope(out));
    needle_reset();
    CHECK_EQ_INT(needle_complete("weather in Lima", 128, out, sizeof out), 0);
    CHECK(needle_init("", "[{\"name\":", NULL) < 0);
    CHECK(needle_complete("weather in Lima", 128, out, 10) < 0);
    CHECK(needle_load("not a cact file at all", 22) < 0);
    /* the model stays loaded across a failed load */
    CHECK_EQ_INT(needle_init("", WEATHER_TOOLS, NULL), 0);
    CHECK_EQ_INT(needle_complete("weather in Lima", 128, out, sizeof out), 0);
    free(blob); /* needle_load copied the misaligned heap image, so this is safe */
}

typedef struct worker {
    char out[65536];
    int rc;
} worker;

static void *run_worker(void *arg) {
    worker *w = arg;
    needle_session *s = NULL;
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = CHAT_CTX;
    if (needle_session_create(model, &sp, &s) || needle_session_set_tools(s, "", WEATHER_TOOLS)) {
        w->rc = -1;
        needle_session_free(s);
        return NULL;
    }
    size_t len;
    w->rc = needle_session_complete(s, "What's the weather in Lagos?", NULL, w->out, sizeof w->out, &len);
    needle_session_free(s);
    return NULL;
}

static void test_sessions_in_threads(void) {
    static worker w[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, run_worker, &w[i]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(w[i].rc, NEEDLE_OK);
    cJSON *a = cJSON_Parse(w[0].out), *b = cJSON_Parse(w[1].out);
    char *ca = cJSON_PrintUnformatted(cJSON_GetObjectItem(a, "function_calls"));
    char *cb = cJSON_PrintUnformatted(cJSON_GetObjectItem(b, "function_calls"));
    CHECK(ca && cb && !strcmp(ca, cb));
    cJSON_free(ca);
    cJSON_free(cb);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

/* A token budget too small for any valid ending: the turn must fail with max_tokens and
 * nothing else. The closing logic used to keep "following" an empty plan, walking its
 * cursor past the plan's end, and then compared the next tokens with bytes beyond the
 * buffer (a heap over-read under ASan; without it, envelopes that changed from one fresh
 * session to the next). Every budget from tiny to comfortable, each on two fresh
 * sessions, must give one well-formed, repeatable envelope. */
static void test_tight_budgets_are_safe_and_repeatable(void) {
    needle_model_params mp = needle_model_default_params();
    mp.n_threads = 1;
    needle_model *m1 = NULL;
    CHECK_EQ_INT(needle_model_open(model_path, &mp, &m1), NEEDLE_OK);
    if (!m1) return;
    static char first[8192], again[8192];
    const char *tool_sets[2] = {WEATHER_TOOLS, ONE_WEATHER_TOOL}; /* choice; extraction */
    for (int32_t case_ = 0; case_ < 2 * 31; case_++) {
        const char *tools = tool_sets[case_ % 2];
        const int32_t budget = 4 + 2 * (case_ / 2);
        char *out[2] = {first, again};
        for (int k = 0; k < 2; k++) {
            needle_session_params sp = needle_session_default_params();
            sp.n_ctx = CHAT_CTX;
            needle_session *s = NULL;
            CHECK_EQ_INT(needle_session_create(m1, &sp, &s), NEEDLE_OK);
            if (!s) break;
            CHECK_EQ_INT(needle_session_set_tools(s, "", tools), NEEDLE_OK);
            needle_complete_params p = needle_complete_default_params();
            p.max_new_tokens = budget;
            size_t len = 0;
            CHECK_EQ_INT(needle_session_complete(s, "What's the weather in Lagos?", &p, out[k],
                                                 sizeof first, &len), NEEDLE_OK);
            needle_session_free(s);
        }
        /* (check_envelope knows WEATHER_TOOLS' minLength; the single tool has none) */
        cJSON *env = tools == WEATHER_TOOLS ? check_envelope(first) : cJSON_Parse(first);
        CHECK_MSG(env != NULL, "budget %d: not JSON: %s", budget, first);
        if (env) {
            const cJSON *ok = cJSON_GetObjectItem(env, "success");
            const char *code = cJSON_GetStringValue(cJSON_GetObjectItem(env, "error_code"));
            CHECK_MSG(cJSON_IsTrue(ok) || (code && !strcmp(code, "max_tokens")),
                      "budget %d: %s", budget, first);
        }
        cJSON_Delete(env);
        /* the timings differ between runs; everything before them must not */
        char *t1 = strstr(first, "\"prefill_tps\""), *t2 = strstr(again, "\"prefill_tps\"");
        CHECK_MSG(t1 && t2 && t1 - first == t2 - again && !memcmp(first, again, (size_t)(t1 - first)),
                  "budget %d differs between fresh sessions:\n%s\n%s", budget, first, again);
    }
    needle_model_free(m1);
}

static void test_fixture_present(void) {
    glob_t g;
    char pattern[1100];
    snprintf(pattern, sizeof pattern, "%s/tiny_cq4.cact", fixture_dir());
    int found = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0;
    if (found) snprintf(model_path, sizeof model_path, "%s", g.gl_pathv[0]);
    globfree(&g);
    CHECK_MSG(found, "no tiny_cq4.cact in %s", fixture_dir());
    if (found) CHECK_EQ_INT(needle_model_open(model_path, NULL, &model), NEEDLE_OK);
}

int main(void) {
    RUN(test_fixture_present);
    if (!model) return test_summary();
    RUN(test_calls_are_well_formed);
    RUN(test_single_tool_extraction_always_calls_it);
    RUN(test_rebinding_tools_starts_afresh);
    RUN(test_multi_turn_reuses_the_cache);
    RUN(test_failed_turn_is_rolled_back);
    RUN(test_failed_turn_is_rolled_back_v3);
    RUN(test_tight_budgets_are_safe_and_repeatable);
    RUN(test_long_conversation_bounded_memory);
    RUN(test_bad_input);
    RUN(test_official_abi);
    RUN(test_sessions_in_threads);
    needle_model_free(model);
    return test_summary();
}
