/* Non-ASCII argument values through the whole decode path (issue 18): names and places
 * with diacritics ("Łódź", "Zoë", "São Paulo", "Zürichberg"), Greek, Cyrillic, CJK and
 * emoji, written by the demo model under the grammar and carried intact by the envelope.
 *
 * The model is forced (a logits hook favours the next token of a chosen spelling of the
 * answer wherever the grammar allows it), so what is tested is the engine, not what the
 * model learned: every token of the spelling must be allowed by the grammar at its step,
 * else the model's own choice takes over and the answer differs. Two spellings of the
 * same bytes: the tokenizer's own encoding (pieces, with byte pieces where the vocabulary
 * has no piece), and every non-ASCII character as its UTF-8 byte pieces one by one. The
 * demo model's vocabulary has no piece with non-ASCII bytes, so there both are byte
 * pieces; the official vocabulary (the random-weight fixture full_mixed) has a few, and
 * the answer uses two of them. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/model.h"
#include "api/session.h"
#include "model/session.h"
#include "needle.h"
#include "tokenizer/tokenizer.h"

#ifndef NEEDLE_SOURCE_DIR
#define NEEDLE_SOURCE_DIR "."
#endif

#define MAX_IDS 512

static const char *TOOLS =
    "[{\"name\":\"create_note\",\"description\":\"Save a note\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"text\":{\"type\":\"string\"},"
    "\"place\":{\"type\":\"string\",\"maxLength\":12}},\"required\":[\"title\",\"text\"]}}]";

/* The answer as the model writes it (json.dumps, ensure_ascii=False, no spaces). */
static const char *ANSWER =
    "[{\"name\":\"create_note\",\"arguments\":{\"title\":\"\xc5\x81\xc3\xb3" "d\xc5\xba, Zo\xc3\xab"
    " i S\xc3\xa3o Paulo\",\"text\":\"Z\xc3\xbcrichberg \xe2\x80\x90 \xe2\x94\x80\xe2\x94\x80 \xce\x91\xce\xb8\xce\xae\xce\xbd\xce\xb1 "
    "\xd0\x9c\xd0\xbe\xd1\x81\xd0\xba\xd0\xb2\xd0\xb0 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x8e\x89"
    "\xf0\x9f\x91\x8d\",\"place\":\"\xe5\x8c\x97\xe4\xba\xac \xc4\x9e\xc3\xbc\xc5\x9f\"}}]";

typedef struct forced {
    int32_t ids[MAX_IDS];
    size_t n;
    size_t next;     /* tokens of ids[] written so far */
    int32_t id_call; /* "<tool_call>": the answer starts after it */
    int active;
} forced;

static void favour_next(void *user, const int32_t *tokens, uint32_t n, float *logits,
                        uint32_t vocab) {
    forced *f = user;
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] == f->id_call) {
            f->active = 1;
            f->next = 0;
        } else if (f->active && f->next < f->n && tokens[i] == f->ids[f->next]) {
            f->next++;
        }
    }
    float top = -INFINITY;
    for (uint32_t v = 0; v < vocab; v++)
        if (isfinite(logits[v]) && logits[v] > top) top = logits[v];
    const int32_t want = !f->active ? f->id_call : f->next < f->n ? f->ids[f->next] : -1;
    if (want >= 0) logits[want] = (isfinite(top) ? top : 0.0f) + 50.0f;
}

/* Runs one turn forced along f->ids; returns the envelope's calls (or NULL). */
static cJSON *forced_turn(needle_model *m, forced *f) {
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(m, NULL, &s), NEEDLE_OK);
    if (!s) return NULL;
    CHECK_EQ_INT(needle_session_set_tools(s, "", TOOLS), NEEDLE_OK);
    f->active = 0;
    f->next = 0;
    api_session_set_logits_hook(s, favour_next, f);
    needle_complete_params p = needle_complete_default_params();
    p.turn = NEEDLE_TURN_QUERY;
    static char out[1 << 16];
    size_t len = 0;
    CHECK_EQ_INT(needle_session_complete(s, "Note it down", &p, out, sizeof out, &len),
                 NEEDLE_OK);
    needle_session_free(s);
    cJSON *env = cJSON_Parse(out);
    CHECK_MSG(env && cJSON_IsTrue(cJSON_GetObjectItem(env, "success")), "envelope: %s", out);
    cJSON *calls = env ? cJSON_DetachItemFromObject(env, "function_calls") : NULL;
    cJSON_Delete(env);
    return calls;
}

/* Whether the forced turn wrote exactly ANSWER: same calls, every string byte for byte. */
static void check_answer(const cJSON *calls, const forced *f, const char *spelling) {
    cJSON *want = cJSON_Parse(ANSWER);
    char *got = calls ? cJSON_PrintUnformatted(calls) : NULL;
    char *want_text = cJSON_PrintUnformatted(want);
    CHECK_MSG(got && want_text && !strcmp(got, want_text),
              "%s: stopped after %zu of %zu forced tokens\n    want %s\n    got  %s", spelling,
              f->next, f->n, want_text ? want_text : "?", got ? got : "(none)");
    free(got);
    free(want_text);
    cJSON_Delete(want);
}

/* require_pieces: the vocabulary has pieces for some of the characters ("\u2010",
 * "\u2500\u2500" in the official one), and the spelling must use them. */
static void forced_non_ascii_values(const char *path, int require_pieces) {
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open(path, NULL, &m), NEEDLE_OK);
    if (!m) return;
    const tokenizer *tok = m->tok;
    /* the byte pieces <0x00>..<0xFF> */
    int32_t byte_piece[256];
    for (int b = 0; b < 256; b++) byte_piece[b] = -1;
    for (uint32_t v = 0; v < tokenizer_vocab(tok); v++) {
        const char *b;
        size_t n;
        if (tokenizer_piece_type(tok, (int32_t)v) == TOKENIZER_BYTE &&
            tokenizer_token_bytes(tok, (int32_t)v, &b, &n) == NEEDLE_OK && n == 1)
            byte_piece[(uint8_t)b[0]] = (int32_t)v;
    }
    forced f = {.id_call = tokenizer_marker_id(tok, "<tool_call>")};
    CHECK(f.id_call >= 0);

    /* 1. the tokenizer's own spelling, as a continuation after "<tool_call>" */
    CHECK_EQ_INT(tokenizer_encode_ex(tok, ANSWER, strlen(ANSWER), 0, f.ids, MAX_IDS, &f.n),
                 NEEDLE_OK);
    size_t n_bytes = 0, n_pieces = 0; /* tokens with non-ASCII bytes: byte pieces, others */
    for (size_t i = 0; i < f.n; i++) {
        const char *b;
        size_t n;
        tokenizer_token_bytes(tok, f.ids[i], &b, &n);
        int high = 0;
        for (size_t k = 0; k < n; k++) high |= (uint8_t)b[k] >= 0x80;
        if (high && tokenizer_piece_type(tok, f.ids[i]) == TOKENIZER_BYTE) n_bytes++;
        else if (high) n_pieces++;
    }
    printf("    %s\n    own spelling: %zu tokens, %zu byte pieces and %zu pieces with non-ASCII bytes\n",
           strrchr(path, '/') + 1, f.n, n_bytes, n_pieces);
    if (require_pieces) CHECK_MSG(n_pieces > 0, "no piece with non-ASCII bytes was used");
    cJSON *calls = forced_turn(m, &f);
    check_answer(calls, &f, "own spelling");
    cJSON_Delete(calls);

    /* 2. every token holding non-ASCII bytes replaced by its byte pieces */
    forced g = {.id_call = f.id_call};
    for (size_t i = 0; i < f.n; i++) {
        const char *b;
        size_t n;
        tokenizer_token_bytes(tok, f.ids[i], &b, &n);
        int high = 0;
        for (size_t k = 0; k < n; k++) high |= (uint8_t)b[k] >= 0x80;
        if (!high) {
            g.ids[g.n++] = f.ids[i];
            continue;
        }
        for (size_t k = 0; k < n && g.n < MAX_IDS; k++) {
            CHECK_MSG(byte_piece[(uint8_t)b[k]] >= 0, "no byte piece for 0x%02x", (uint8_t)b[k]);
            g.ids[g.n++] = byte_piece[(uint8_t)b[k]];
        }
    }
    CHECK(g.n > f.n || n_pieces == 0);
    calls = forced_turn(m, &g);
    check_answer(calls, &g, "byte pieces");
    cJSON_Delete(calls);
    needle_model_free(m);
}

static void test_demo_model(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/needle-demo.cact", NEEDLE_SOURCE_DIR);
    forced_non_ascii_values(path, 0);
}

/* random weights, the official tokenizer: the logits are forced anyway */
static void test_official_vocabulary(void) {
    forced_non_ascii_values(fixture_path("full_mixed.cact"), 1);
}

int main(void) {
    RUN(test_demo_model);
    RUN(test_official_vocabulary);
    return test_summary();
}
