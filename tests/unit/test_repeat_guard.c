/* The repetition guard (agent/repeat_guard.h).
 *
 * 1. The detector alone: cycles of 1 to 4 tokens fire exactly when their repeats cover
 *    REPEAT_GUARD_MIN_TOKENS tokens; short runs ("aaa", the zeros of "1000000"), a run
 *    broken once, a cycle longer than 4 and varied text never fire.
 * 2. Following string values through the grammar: tokens inside one value count, a token
 *    that closes it or opens the next one starts over.
 * 3. End to end on the demo model, made to loop by a logits hook that favours one piece,
 *    or a cycle of pieces, wherever the grammar allows it (inside strings): without the
 *    guard a value runs until the token budget's verified ending closes it (or the turn
 *    fails at max_tokens), most of the budget; with it (the default) the
 *    value is closed after exactly the threshold's tokens, the call goes on to its other
 *    required value, and the envelope is valid. NEEDLE_REPEAT_GUARD=0 turns the default
 *    off and the parameter overrides the variable.
 * 4. Numbers (issue 31): the detector over digits fires at REPEAT_GUARD_MIN_DIGIT_TOKENS,
 *    never on a cycle of zeros; the guard follows a number value through the grammar and,
 *    once fired, keeps only tokens that end it; the looping model made to write "3232..."
 *    into an unbounded integer writes the whole digit budget without the guard and
 *    stops after the threshold with it. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "agent/repeat_guard.h"
#include "grammar/grammar.h"
#include "harness.h"
#include "model/model.h"
#include "api/session.h"
#include "model/session.h"
#include "needle.h"

#ifndef NEEDLE_SOURCE_DIR
#define NEEDLE_SOURCE_DIR "."
#endif

/* Pushes n tokens; returns how many were pushed before the guard fired (n if never). */
static uint32_t push_until_fired(repeat_guard *rg, const int32_t *toks, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (repeat_guard_push(rg, toks[i])) return i + 1;
    return n;
}

static void test_cycles_fire_at_threshold(void) {
    const uint32_t T = REPEAT_GUARD_MIN_TOKENS;
    for (uint32_t p = 1; p <= REPEAT_GUARD_MAX_PERIOD; p++) {
        /* a few distinct tokens first: the cycle's tail is what counts */
        int32_t toks[200];
        uint32_t n = 0;
        for (int32_t k = 0; k < 5; k++) toks[n++] = 500 + k;
        for (; n < 200; n++) toks[n] = 10 + (int32_t)((n - 5) % p);
        repeat_guard rg;
        repeat_guard_reset(&rg);
        const uint32_t fired_at = push_until_fired(&rg, toks, 200);
        CHECK_MSG(rg.fired && fired_at == 5 + T, "period %u fired after %u tokens, want %u", p,
                  fired_at, 5 + T);
        /* one token short of the threshold: not yet */
        repeat_guard_reset(&rg);
        push_until_fired(&rg, toks, 5 + T - 1);
        CHECK_MSG(!rg.fired, "period %u fired early", p);
    }
}

static void test_legitimate_repeats_pass(void) {
    repeat_guard rg;
    /* "1000000" one digit a token, and zeros up to one short of the threshold */
    int32_t digits[64] = {49};
    for (uint32_t i = 1; i < REPEAT_GUARD_MIN_TOKENS; i++) digits[i] = 48;
    repeat_guard_reset(&rg);
    CHECK_EQ_INT(push_until_fired(&rg, digits, 7), 7);
    CHECK(!rg.fired);
    repeat_guard_reset(&rg);
    push_until_fired(&rg, digits, REPEAT_GUARD_MIN_TOKENS);
    CHECK_MSG(!rg.fired, "1 then %u zeros fired", REPEAT_GUARD_MIN_TOKENS - 1);
    /* varied text with short runs ("aaa", "!!") over many tokens */
    int32_t text[300];
    uint64_t x = 12345;
    for (uint32_t i = 0; i < 300; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        text[i] = (int32_t)((x >> 56) % 40);
        if (i % 37 == 0 && i + 3 < 300) { /* a run of three */
            text[i + 1] = text[i + 2] = text[i];
            i += 2;
        }
    }
    repeat_guard_reset(&rg);
    push_until_fired(&rg, text, 300);
    CHECK(!rg.fired);
    /* a run broken in the middle starts over */
    int32_t broken[64];
    for (uint32_t i = 0; i < 64; i++) broken[i] = i == 20 ? 8 : 7;
    repeat_guard_reset(&rg);
    CHECK_EQ_INT(push_until_fired(&rg, broken, 64), 21 + REPEAT_GUARD_MIN_TOKENS);
    /* a cycle longer than the longest period looked for is left alone */
    int32_t long_cycle[200];
    for (uint32_t i = 0; i < 200; i++) long_cycle[i] = (int32_t)(i % (REPEAT_GUARD_MAX_PERIOD + 1));
    repeat_guard_reset(&rg);
    push_until_fired(&rg, long_cycle, 200);
    CHECK(!rg.fired);
}

static void test_digit_cycles(void) {
    const uint32_t T = REPEAT_GUARD_MIN_DIGIT_TOKENS;
    for (uint32_t p = 1; p <= REPEAT_GUARD_MAX_PERIOD; p++) {
        repeat_guard rg;
        repeat_guard_reset(&rg);
        uint32_t fired_at = 0;
        for (uint32_t i = 0; i < 40 && !fired_at; i++)
            if (repeat_guard_push_digits(&rg, 51 + (int32_t)(i % p), 0)) fired_at = i + 1;
        CHECK_MSG(fired_at == T, "digit period %u fired after %u tokens, want %u", p, fired_at, T);
    }
    /* zeros: "1" then any number of "0" (round numbers), and "10" cycles of "00" pieces */
    repeat_guard rg;
    repeat_guard_reset(&rg);
    CHECK(!repeat_guard_push_digits(&rg, 49, 0));
    for (uint32_t i = 0; i < 40; i++) CHECK(!repeat_guard_push_digits(&rg, 48, 1));
    repeat_guard_reset(&rg);
    for (uint32_t i = 0; i < 40; i++) repeat_guard_push_digits(&rg, i % 2 ? 60 : 61, i % 2);
    CHECK_MSG(rg.fired, "a cycle holding a non-zero piece (\"5\" \"00\") fires");
    /* a zero cycle that turns into a non-zero one fires on its own count */
    repeat_guard_reset(&rg);
    for (uint32_t i = 0; i < 10; i++) repeat_guard_push_digits(&rg, 48, 1);
    uint32_t n = 0;
    while (!repeat_guard_push_digits(&rg, 55, 0) && n < 40) n++;
    CHECK_EQ_INT(n + 1, T);
    /* one short of the threshold, then a different digit: no */
    repeat_guard_reset(&rg);
    for (uint32_t i = 0; i + 1 < T; i++) CHECK(!repeat_guard_push_digits(&rg, 57, 0));
    CHECK(!repeat_guard_push_digits(&rg, 56, 0));
}

static const char *NOTE_TOOLS =
    "[{\"name\":\"create_note\",\"description\":\"Save a note\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"text\":{\"type\":\"string\"}},"
    "\"required\":[\"title\",\"text\"]}}]";

static int accept(repeat_guard *rg, const grammar *g, grammar_state *st, int32_t tok,
                  const char *text) {
    return repeat_guard_accept(rg, g, st, tok, text, strlen(text));
}

static void test_follows_string_values(void) {
    grammar *g = NULL;
    CHECK_EQ_INT(grammar_compile(NOTE_TOOLS, strlen(NOTE_TOOLS), NULL, &g), NEEDLE_OK);
    if (!g) return;
    grammar_state st;
    grammar_state_init(g, &st);
    repeat_guard rg;
    repeat_guard_reset(&rg);
    CHECK(accept(&rg, g, &st, 1, "[{\"name\":\"create_note\",\"arguments\":{\"title\":"));
    CHECK(rg.depth == 0);
    CHECK(accept(&rg, g, &st, 2, "\"ab")); /* opens the value: followed, fragment not counted */
    CHECK(rg.depth > 0 && rg.count == 0);
    const uint32_t depth = rg.depth;
    for (uint32_t i = 0; i + 1 < REPEAT_GUARD_MIN_TOKENS; i++) CHECK(accept(&rg, g, &st, 3, "z"));
    CHECK(!rg.fired && rg.count == REPEAT_GUARD_MIN_TOKENS - 1);
    CHECK(!accept(&rg, g, &st, 4, "\"}")); /* "text" is required: rejected, nothing changes */
    CHECK(rg.count == REPEAT_GUARD_MIN_TOKENS - 1 && rg.depth == depth);
    /* closing one value and opening the next in one token starts over */
    CHECK(accept(&rg, g, &st, 5, "\",\"text\":\"z"));
    CHECK(rg.depth == depth && rg.count == 0 && !rg.fired);
    for (uint32_t i = 0; i < REPEAT_GUARD_MIN_TOKENS; i++) CHECK(accept(&rg, g, &st, 3, "z"));
    CHECK(rg.fired && rg.closes == 1);
    /* an escape and a multi-byte character stay inside the value */
    CHECK(accept(&rg, g, &st, 6, "\\n") && accept(&rg, g, &st, 7, "\xc5\x81"));
    CHECK(rg.depth == depth && rg.count == REPEAT_GUARD_MIN_TOKENS + 2);
    CHECK(accept(&rg, g, &st, 8, "\"}"));
    CHECK(rg.depth == 0 && !rg.fired && rg.count == 0 && rg.closes == 1);
    CHECK(accept(&rg, g, &st, 9, "}]") && grammar_is_complete(g, &st));
    grammar_free(g);
}

static const char *ALARM_TOOLS =
    "[{\"name\":\"set_alarm\",\"description\":\"Set an alarm\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"hour\":{\"type\":\"integer\"},\"label\":{\"type\":"
    "\"string\"}},\"required\":[\"hour\",\"label\"]}}]";

static const char *HOUR_TOOLS =
    "[{\"name\":\"set_alarm\",\"description\":\"Set an alarm\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"hour\":{\"type\":\"integer\"}},\"required\":[\"hour\"]}}]";

/* A number value: its first digit opens it (not counted), the digits after it count, and
 * once the guard fired only tokens that begin the number's ending (",": the required label
 * follows) stay allowed on the demo vocabulary; the digits are gone. */
static void test_follows_number_values(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/needle-demo.cact", NEEDLE_SOURCE_DIR);
    needle_model *m = NULL;
    grammar *g = NULL;
    CHECK_EQ_INT(needle_model_open(path, NULL, &m), NEEDLE_OK);
    CHECK_EQ_INT(grammar_compile(ALARM_TOOLS, strlen(ALARM_TOOLS), NULL, &g), NEEDLE_OK);
    if (!m || !g) {
        grammar_free(g);
        needle_model_free(m);
        return;
    }
    grammar_state st;
    grammar_state_init(g, &st);
    repeat_guard rg;
    repeat_guard_reset(&rg);
    CHECK(accept(&rg, g, &st, 1, "[{\"name\":\"set_alarm\",\"arguments\":{\"hour\":"));
    CHECK(rg.depth == 0 && grammar_number_depth(g, &st) == 0);
    CHECK(accept(&rg, g, &st, 2, "6"));
    CHECK(rg.depth > 0 && rg.number && rg.count == 0 && grammar_number_depth(g, &st) == rg.depth);
    for (uint32_t i = 0; i + 1 < REPEAT_GUARD_MIN_DIGIT_TOKENS; i++)
        CHECK(accept(&rg, g, &st, i % 2 ? 3 : 4, i % 2 ? "2" : "3")); /* 3 "2", 4 "3" */
    CHECK(!rg.fired);
    const uint32_t V = tokenizer_vocab(m->tok);
    uint8_t *allowed = malloc(V);
    char scratch[256];
    memset(allowed, 1, V);
    CHECK_EQ_INT(repeat_guard_restrict(&rg, g, &st, m->tok, allowed, V, V, scratch, sizeof scratch),
                 V);
    CHECK(accept(&rg, g, &st, 3, "2") && rg.fired && rg.closes == 1); /* 6 3232323 2 */
    const uint32_t kept =
        repeat_guard_restrict(&rg, g, &st, m->tok, allowed, V, V, scratch, sizeof scratch);
    uint32_t counted = 0, bad = 0;
    for (uint32_t v = 0; v < V; v++) {
        if (!allowed[v]) continue;
        const char *b;
        size_t n;
        counted++;
        bad += tokenizer_token_bytes(m->tok, (int32_t)v, &b, &n) != NEEDLE_OK || !n || b[0] != ',';
    }
    CHECK_MSG(kept > 0 && kept < V && kept == counted && bad == 0, "kept %u (%u counted, %u bad)",
              kept, counted, bad);
    /* the byte after the number ends it: the guard lets go of it, the cut is remembered */
    CHECK(accept(&rg, g, &st, 5, ",\"label\":\"x\"}}"));
    CHECK(rg.depth == 0 && !rg.fired && rg.closes == 1 && grammar_between_calls(g, &st));
    /* a number that leaves in the same token as its last digit ("5}") counts nothing */
    grammar_state st2;
    grammar_state_init(g, &st2);
    repeat_guard rg2;
    repeat_guard_reset(&rg2);
    CHECK(accept(&rg2, g, &st2, 1, "[{\"name\":\"set_alarm\",\"arguments\":{\"label\":\"a\",\"hour\":1"));
    CHECK(accept(&rg2, g, &st2, 2, "5}"));
    CHECK(rg2.depth == 0 && rg2.count == 0);
    free(allowed);
    grammar_free(g);
    needle_model_free(m);
}

/* The restriction on the demo model's vocabulary: nothing before the guard fires or
 * inside a character; at a character boundary only tokens that begin with the closing
 * quote (the shortest ending of an unconstrained string); after the call that holds the
 * cut value only the end of the array. */
static void test_restrict_to_ending(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/needle-demo.cact", NEEDLE_SOURCE_DIR);
    needle_model *m = NULL;
    grammar *g = NULL;
    CHECK_EQ_INT(needle_model_open(path, NULL, &m), NEEDLE_OK);
    CHECK_EQ_INT(grammar_compile(NOTE_TOOLS, strlen(NOTE_TOOLS), NULL, &g), NEEDLE_OK);
    if (!m || !g) {
        grammar_free(g);
        needle_model_free(m);
        return;
    }
    const uint32_t V = tokenizer_vocab(m->tok);
    uint8_t *allowed = malloc(V);
    char scratch[256];
    grammar_state st;
    grammar_state_init(g, &st);
    repeat_guard rg;
    repeat_guard_reset(&rg);
    CHECK(accept(&rg, g, &st, 1, "[{\"name\":\"create_note\",\"arguments\":{\"title\":\"z"));
    for (uint32_t i = 0; i + 1 < REPEAT_GUARD_MIN_TOKENS; i++) CHECK(accept(&rg, g, &st, 2, "z"));
    memset(allowed, 1, V);
    CHECK_EQ_INT(repeat_guard_restrict(&rg, g, &st, m->tok, allowed, V, V, scratch, sizeof scratch),
                 V); /* not fired yet */
    CHECK(accept(&rg, g, &st, 2, "z") && rg.fired);
    /* inside a character: left to the model */
    grammar_state mid = st;
    CHECK(grammar_accept_byte(g, &mid, 0xE6));
    CHECK_EQ_INT(repeat_guard_restrict(&rg, g, &mid, m->tok, allowed, V, V, scratch, sizeof scratch),
                 V);
    /* at a boundary: every token kept starts with the quote, and some are kept */
    const uint32_t kept =
        repeat_guard_restrict(&rg, g, &st, m->tok, allowed, V, V, scratch, sizeof scratch);
    uint32_t counted = 0, bad = 0;
    for (uint32_t v = 0; v < V; v++) {
        if (!allowed[v]) continue;
        const char *b;
        size_t n;
        counted++;
        bad += tokenizer_token_bytes(m->tok, (int32_t)v, &b, &n) != NEEDLE_OK || !n || b[0] != '"';
    }
    CHECK_MSG(kept > 0 && kept < V && kept == counted && bad == 0, "kept %u (%u counted, %u bad)",
              kept, counted, bad);
    /* a string the guard does not follow is left alone */
    repeat_guard other = rg;
    other.depth = rg.depth + 1;
    other.closes = 0;
    memset(allowed, 1, V);
    CHECK_EQ_INT(repeat_guard_restrict(&other, g, &st, m->tok, allowed, V, V, scratch,
                                       sizeof scratch),
                 V);
    /* once the call is complete, the array ends: of the tokens the grammar allows there,
     * those that begin with "]" */
    CHECK(accept(&rg, g, &st, 3, "\",\"text\":\"ok\"}}") && grammar_between_calls(g, &st));
    const char **bytes = malloc(V * sizeof *bytes);
    size_t *lens = malloc(V * sizeof *lens);
    grammar_trie *trie = NULL;
    for (uint32_t v = 0; v < V; v++)
        if (tokenizer_token_bytes(m->tok, (int32_t)v, &bytes[v], &lens[v]) != NEEDLE_OK ||
            (tokenizer_piece_type(m->tok, (int32_t)v) != TOKENIZER_BYTE &&
             tokenizer_piece_type(m->tok, (int32_t)v) != TOKENIZER_NORMAL)) {
            bytes[v] = "";
            lens[v] = 0;
        }
    CHECK_EQ_INT(grammar_trie_build(bytes, lens, V, &trie), NEEDLE_OK);
    const uint32_t n_mask = trie ? grammar_mask(g, &st, trie, allowed) : 0;
    const uint32_t kept_end =
        repeat_guard_restrict(&rg, g, &st, m->tok, allowed, V, n_mask, scratch, sizeof scratch);
    CHECK(kept_end < n_mask);
    bad = counted = 0;
    for (uint32_t v = 0; v < V; v++) {
        if (!allowed[v]) continue;
        const char *b;
        size_t n;
        counted++;
        bad += tokenizer_token_bytes(m->tok, (int32_t)v, &b, &n) != NEEDLE_OK || !n || b[0] != ']';
    }
    CHECK_MSG(kept_end > 0 && kept_end == counted && bad == 0, "kept %u (%u counted, %u bad)",
              kept_end, counted, bad);
    /* no value was cut in a decode: another call may follow */
    repeat_guard clean;
    repeat_guard_reset(&clean);
    const uint32_t n_again = trie ? grammar_mask(g, &st, trie, allowed) : 0;
    CHECK_EQ_INT(repeat_guard_restrict(&clean, g, &st, m->tok, allowed, V, n_again, scratch,
                                       sizeof scratch),
                 n_again);
    /* inside a call, a token that would end it and start the next one ("}},{") is out,
     * its other tokens stay */
    grammar_state in_call;
    grammar_state_init(g, &in_call);
    const char *open_call = "[{\"name\":\"create_note\",\"arguments\":{\"title\":\"a\","
                            "\"text\":\"b\"";
    CHECK(grammar_accept_bytes(g, &in_call, open_call, strlen(open_call)));
    uint32_t with_comma = 0, crossing = 0;
    const uint32_t n_in = trie ? grammar_mask(g, &in_call, trie, allowed) : 0;
    for (uint32_t v = 0; v < V; v++)
        if (allowed[v] && memchr(bytes[v], ',', lens[v])) {
            with_comma++;
            grammar_state probe = in_call;
            for (size_t k = 0; k < lens[v]; k++) {
                if (bytes[v][k] == ',' && grammar_between_calls(g, &probe)) crossing++;
                grammar_accept_byte(g, &probe, (uint8_t)bytes[v][k]);
            }
        }
    printf("    in a call: %u allowed, %u with a comma, %u cross into another call\n", n_in,
           with_comma, crossing);
    const uint32_t kept_in =
        repeat_guard_restrict(&rg, g, &in_call, m->tok, allowed, V, n_in, scratch, sizeof scratch);
    CHECK_MSG(kept_in == n_in - crossing && kept_in > 0, "%u allowed, %u with a comma, %u "
              "cross into another call, %u kept", n_in, with_comma, crossing, kept_in);
    grammar_trie_free(trie);
    free(bytes);
    free(lens);
    free(allowed);
    grammar_free(g);
    needle_model_free(m);
}

/* ---- end to end ------------------------------------------------------------------------ */

typedef struct loop_hook {
    int32_t cycle[REPEAT_GUARD_MAX_PERIOD];
    uint32_t period;
} loop_hook;

/* Favours the piece after the last token in the cycle (the first one after any other
 * token) far above everything else; where the grammar refuses it, the model decides. */
static void favour_cycle(void *user, const int32_t *tokens, uint32_t n, float *logits,
                         uint32_t vocab) {
    const loop_hook *h = user;
    uint32_t next = 0;
    for (uint32_t i = 0; n && i < h->period; i++)
        if (tokens[n - 1] == h->cycle[i]) next = (i + 1) % h->period;
    float top = -INFINITY;
    for (uint32_t v = 0; v < vocab; v++)
        if (isfinite(logits[v]) && logits[v] > top) top = logits[v];
    logits[h->cycle[next]] = (isfinite(top) ? top : 0.0f) + 50.0f;
}

/* One turn of the looping model; returns the envelope (parsed) and the tokens generated. */
static cJSON *looping_turn(needle_model *m, loop_hook *h, int32_t guard, int32_t max_new,
                           uint64_t *generated) {
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(m, NULL, &s), NEEDLE_OK);
    if (!s) return NULL;
    CHECK_EQ_INT(needle_session_set_tools(s, "", NOTE_TOOLS), NEEDLE_OK);
    api_session_set_logits_hook(s, favour_cycle, h);
    needle_complete_params p = needle_complete_default_params();
    p.turn = NEEDLE_TURN_QUERY;
    p.max_new_tokens = max_new;
    p.repeat_guard = guard;
    needle_session_stats before = {.size = sizeof before}, after = {.size = sizeof after};
    needle_session_get_stats(s, &before);
    static char out[1 << 16];
    size_t len = 0;
    CHECK_EQ_INT(needle_session_complete(s, "Save a note about the garden", &p, out, sizeof out,
                                         &len),
                 NEEDLE_OK);
    needle_session_get_stats(s, &after);
    *generated = after.decode_steps - before.decode_steps;
    needle_session_free(s);
    cJSON *env = cJSON_Parse(out);
    CHECK_MSG(env != NULL, "envelope is not JSON: %s", out);
    return env;
}

/* One turn on the alarm tool (one unbounded integer); the hour written, as text. */
static void looping_hour(needle_model *m, loop_hook *h, int32_t guard, char *hour, size_t cap) {
    needle_session *s = NULL;
    hour[0] = 0;
    CHECK_EQ_INT(needle_session_create(m, NULL, &s), NEEDLE_OK);
    if (!s) return;
    CHECK_EQ_INT(needle_session_set_tools(s, "", HOUR_TOOLS), NEEDLE_OK);
    api_session_set_logits_hook(s, favour_cycle, h);
    needle_complete_params p = needle_complete_default_params();
    p.turn = NEEDLE_TURN_QUERY;
    p.max_new_tokens = 120;
    p.repeat_guard = guard;
    static char out[1 << 16];
    size_t len = 0;
    CHECK_EQ_INT(needle_session_complete(s, "Wake me up at seven", &p, out, sizeof out, &len),
                 NEEDLE_OK);
    needle_session_free(s);
    cJSON *env = cJSON_Parse(out);
    CHECK_MSG(env && cJSON_IsTrue(cJSON_GetObjectItem(env, "success")), "turn failed: %s", out);
    if (getenv("NEEDLE_TEST_VERBOSE")) printf("    %s\n", out);
    const cJSON *calls = cJSON_GetObjectItem(env, "function_calls");
    const cJSON *args = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "arguments");
    const cJSON *v = cJSON_GetObjectItem(args, "hour");
    CHECK_MSG(cJSON_IsNumber(v), "no hour: %s", out);
    /* the digits as written: the envelope's number, printed back exactly */
    if (cJSON_IsNumber(v)) snprintf(hour, cap, "%.0f", v->valuedouble);
    cJSON_Delete(env);
}

/* The digit loop of issue 31: "{"hour": 632323232323232323}". */
static void test_looping_digits(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/needle-demo.cact", NEEDLE_SOURCE_DIR);
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open(path, NULL, &m), NEEDLE_OK);
    if (!m) return;
    int32_t ids[8];
    size_t n_ids = 0;
    CHECK_EQ_INT(needle_tokenize(m, "32", 2, ids, 8, &n_ids), NEEDLE_OK);
    CHECK(n_ids >= 2);
    if (n_ids < 2) {
        needle_model_free(m);
        return;
    }
    /* the digit pieces, one a digit (after any space piece) */
    loop_hook h = {.cycle = {ids[n_ids - 2], ids[n_ids - 1]}, .period = 2};
    char off[64], on[64], want[64] = "";
    looping_hour(m, &h, -1, off, sizeof off);
    looping_hour(m, &h, 0, on, sizeof on);
    /* the first digit opens the number, then the threshold's digits: "323232323" */
    for (uint32_t i = 0; i <= REPEAT_GUARD_MIN_DIGIT_TOKENS; i++) strcat(want, i % 2 ? "2" : "3");
    CHECK_MSG(strlen(off) >= 15 && !strncmp(off, want, 8), "guard off: hour %s", off);
    CHECK_MSG(!strcmp(on, want), "guard on: hour %s, want %s", on, want);
    needle_model_free(m);
}

static const char *arg(const cJSON *env, const char *key) {
    const cJSON *calls = cJSON_GetObjectItem(env, "function_calls");
    const cJSON *args = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "arguments");
    return cJSON_GetStringValue(cJSON_GetObjectItem(args, key));
}

static void test_looping_model(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/needle-demo.cact", NEEDLE_SOURCE_DIR);
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open(path, NULL, &m), NEEDLE_OK);
    if (!m) return;
    /* pieces to loop on: the first distinct ones of a few words */
    int32_t ids[32];
    size_t n_ids = 0;
    CHECK_EQ_INT(needle_tokenize(m, " red green blue gold", 20, ids, 32, &n_ids), NEEDLE_OK);
    const int max_new = 200;
    for (uint32_t period = 1; period <= REPEAT_GUARD_MAX_PERIOD; period += 2) {
        loop_hook h = {.period = period};
        uint32_t k = 0;
        for (size_t i = 0; i < n_ids && k < period; i++) {
            int dup = 0;
            for (uint32_t j = 0; j < k; j++) dup |= h.cycle[j] == ids[i];
            if (!dup) h.cycle[k++] = ids[i];
        }
        CHECK_EQ_INT(k, period);
        /* the value the guard leaves: the cycle over exactly the threshold's tokens */
        char want[1024] = "";
        for (uint32_t i = 0; i < REPEAT_GUARD_MIN_TOKENS; i++) {
            const char *b;
            size_t n;
            CHECK_EQ_INT(tokenizer_token_bytes(m->tok, h.cycle[i % period], &b, &n), NEEDLE_OK);
            strncat(want, b, n);
        }
        uint64_t gen_off = 0, gen_on = 0;
        cJSON *off = looping_turn(m, &h, -1, max_new, &gen_off);
        cJSON *on = looping_turn(m, &h, 0, max_new, &gen_on);
        /* without the guard the loop takes the whole budget (the budget's verified ending
         * closes it, or the turn fails at max_tokens) */
        CHECK_MSG(gen_off >= (uint64_t)max_new * 3 / 4, "period %u, guard off: %llu tokens",
                  period, (unsigned long long)gen_off);
        const char *off_title = off ? arg(off, "title") : NULL;
        const char *off_text = off ? arg(off, "text") : NULL;
        const size_t off_len = (off_title ? strlen(off_title) : 0) + (off_text ? strlen(off_text) : 0);
        CHECK_MSG(off_len > 3 * strlen(want), "guard off: title \"%s\", text \"%s\"",
                  off_title ? off_title : "(none)", off_text ? off_text : "(none)");
        /* with it both values close after the threshold and the call is complete */
        CHECK_MSG(on && cJSON_IsTrue(cJSON_GetObjectItem(on, "success")), "guard on failed");
        const char *title = on ? arg(on, "title") : NULL, *text = on ? arg(on, "text") : NULL;
        CHECK_MSG(title && !strcmp(title, want), "period %u: title \"%s\", want \"%s\"", period,
                  title ? title : "(none)", want);
        CHECK_MSG(text && !strcmp(text, want), "period %u: text \"%s\", want \"%s\"", period,
                  text ? text : "(none)", want);
        CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(on, "function_calls")), 1);
        CHECK_MSG(gen_on < gen_off / 2, "guard on: %llu tokens, off: %llu",
                  (unsigned long long)gen_on, (unsigned long long)gen_off);
        cJSON_Delete(off);
        cJSON_Delete(on);
    }
    /* the variable turns the default off; the parameter wins over it */
    loop_hook one = {.cycle = {ids[0]}, .period = 1};
    uint64_t gen_env = 0, gen_forced = 0;
    setenv("NEEDLE_REPEAT_GUARD", "0", 1);
    cJSON *env_off = looping_turn(m, &one, 0, max_new, &gen_env);
    cJSON *forced_on = looping_turn(m, &one, 1, max_new, &gen_forced);
    unsetenv("NEEDLE_REPEAT_GUARD");
    CHECK_MSG(gen_env >= (uint64_t)max_new * 3 / 4, "NEEDLE_REPEAT_GUARD=0: %llu tokens",
              (unsigned long long)gen_env);
    CHECK_MSG(gen_forced < gen_env / 2, "repeat_guard = 1 under NEEDLE_REPEAT_GUARD=0: %llu",
              (unsigned long long)gen_forced);
    cJSON_Delete(env_off);
    cJSON_Delete(forced_on);
    needle_model_free(m);
}

int main(void) {
    RUN(test_cycles_fire_at_threshold);
    RUN(test_legitimate_repeats_pass);
    RUN(test_digit_cycles);
    RUN(test_follows_string_values);
    RUN(test_follows_number_values);
    RUN(test_restrict_to_ending);
    RUN(test_looping_model);
    RUN(test_looping_digits);
    return test_summary();
}
