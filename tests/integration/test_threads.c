/* Many conversations over one shared model at once, the way a server runs them (needle.h:
 * a model is shared by any number of threads, a session is used by one thread at a time).
 *
 * Four clients, each with its own tools and system prompt, run a whole conversation (a
 * query, the turn after it, a reset, another query) on their own sessions, all at the same
 * time, for a few rounds; every envelope must equal the one the same conversation gave run
 * alone (timing fields aside). The model's pool has two threads, so each session's
 * operations also run on a worker while the other sessions compute. Then one session is
 * passed from thread to thread between turns (a server's workers picking up whichever
 * conversation has input), and the official global ABI is called from several threads at
 * once (its lock serializes them: every call returns a well-formed envelope).
 *
 * Race detection itself is ThreadSanitizer's (the NEEDLE_TSAN build, scripts/test.sh);
 * without it, this checks that concurrency changes no result. Uses tiny_cq4.cact (random
 * weights: the answers are arbitrary, but deterministic). */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"
#include "needle2.h"

#define CLIENTS 4
#define TURNS 3
#define ROUNDS 2
#define MAX_NEW 64 /* see the note above test_each_conversation_alone */
#define ENVELOPE (1 << 16)

static needle_model *model;

typedef struct client {
    const char *system, *tools;
    const char *turns[TURNS]; /* turn 1 is AUTO (a tool result after a call); reset before 2 */
} client;

static const client CLIENT[CLIENTS] = {
    {"",
     "[{\"name\":\"get_weather\",\"description\":\"Current weather for a city\",\"parameters\":"
     "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":24},"
     "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]}},"
     "\"required\":[\"city\"]}}]",
     {"What's the weather in Lagos?", "{\"temperature\": 31}", "and in Oslo, in fahrenheit"}},
    {"You are a kitchen assistant.",
     "[{\"name\":\"set_timer\",\"description\":\"Start a timer\",\"parameters\":{\"type\":"
     "\"object\",\"properties\":{\"minutes\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":"
     "120}},\"required\":[\"minutes\"]}}]",
     {"Set a timer for 25 minutes", "{\"ok\": true}", "timer for an hour please"}},
    {"Answer with tool calls only.",
     "[{\"name\":\"send_message\",\"description\":\"Send a text message\",\"parameters\":{"
     "\"type\":\"object\",\"properties\":{\"to\":{\"type\":\"string\"},\"body\":{\"type\":"
     "\"string\",\"maxLength\":40}},\"required\":[\"to\",\"body\"]}},"
     "{\"name\":\"call\",\"description\":\"Phone someone\",\"parameters\":{\"type\":\"object\","
     "\"properties\":{\"who\":{\"type\":\"string\"}},\"required\":[\"who\"]}}]",
     {"text Ada that I am late", "{\"sent\": true}", "call Grace"}},
    {"",
     "[{\"name\":\"add_item\",\"description\":\"Add to the shopping list\",\"parameters\":{"
     "\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"type\":"
     "\"string\"},\"minItems\":1,\"maxItems\":3},\"urgent\":{\"type\":\"boolean\"}},"
     "\"required\":[\"items\"]}}]",
     {"add milk and eggs", "{\"added\": 2}", "I need bread, urgently"}},
};

typedef struct transcript {
    char *turn[TURNS]; /* each envelope without its timing fields (malloc'd), NULL on error */
    int rc[TURNS];
} transcript;

static void transcript_free(transcript *t) {
    for (int i = 0; i < TURNS; i++) {
        free(t->turn[i]);
        t->turn[i] = NULL;
    }
}

/* The envelope without the fields that measure time or memory (they differ run to run). */
static char *stable_envelope(const char *text) {
    cJSON *env = cJSON_Parse(text);
    if (!env) return NULL;
    cJSON_DeleteItemFromObject(env, "prefill_tps");
    cJSON_DeleteItemFromObject(env, "decode_tps");
    cJSON_DeleteItemFromObject(env, "peak_ram_mb");
    char *s = cJSON_PrintUnformatted(env);
    cJSON_Delete(env);
    return s;
}

static needle_session *open_session(const client *c) {
    needle_session *s = NULL;
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 512;
    if (needle_session_create(model, &sp, &s) != NEEDLE_OK) return NULL;
    if (needle_session_set_tools(s, c->system, c->tools) != NEEDLE_OK) {
        needle_session_free(s);
        return NULL;
    }
    return s;
}

/* Turn `i` of client `c` on `s`, recorded in t. */
static void run_turn(needle_session *s, const client *c, int i, transcript *t, char *buf) {
    if (i == 2) needle_session_reset(s);
    needle_complete_params p = needle_complete_default_params();
    p.max_new_tokens = MAX_NEW;
    p.turn = i == 0 ? NEEDLE_TURN_QUERY : NEEDLE_TURN_AUTO;
    size_t len = 0;
    t->rc[i] = needle_session_complete(s, c->turns[i], &p, buf, ENVELOPE, &len);
    t->turn[i] = t->rc[i] == NEEDLE_OK ? stable_envelope(buf) : NULL;
}

typedef struct job {
    const client *c;
    transcript t;
    int open_failed;
} job;

static void *run_conversation(void *arg) {
    job *j = arg;
    char *buf = malloc(ENVELOPE);
    needle_session *s = buf ? open_session(j->c) : NULL;
    j->open_failed = s == NULL;
    for (int i = 0; s && i < TURNS; i++) run_turn(s, j->c, i, &j->t, buf);
    needle_session_free(s);
    free(buf);
    return NULL;
}

static void check_same(const transcript *want, const transcript *got, const char *what, int who) {
    for (int i = 0; i < TURNS; i++) {
        CHECK_MSG(got->rc[i] == NEEDLE_OK && got->turn[i], "%s: client %d turn %d: rc %d", what,
                  who, i, got->rc[i]);
        if (got->turn[i] && want->turn[i])
            CHECK_MSG(!strcmp(got->turn[i], want->turn[i]),
                      "%s: client %d turn %d differs from the conversation alone:\n  %s\n  %s",
                      what, who, i, want->turn[i], got->turn[i]);
    }
}

static transcript alone[CLIENTS];

/* The reference transcripts. MAX_NEW leaves room for the calls these tools produce, so
 * the turns here test threads, not the budget-closing path (test_chat.c's
 * test_tight_budgets_are_safe_and_repeatable covers that one). */

static void test_each_conversation_alone(void) {
    for (int k = 0; k < CLIENTS; k++) {
        job j = {.c = &CLIENT[k]};
        run_conversation(&j);
        CHECK_MSG(!j.open_failed, "client %d: session or tools refused: %s", k,
                  needle_last_error());
        for (int i = 0; i < TURNS; i++)
            CHECK_MSG(j.t.rc[i] == NEEDLE_OK && j.t.turn[i], "client %d turn %d: rc %d", k, i,
                      j.t.rc[i]);
        alone[k] = j.t;
    }
}

static void test_conversations_at_once(void) {
    for (int r = 0; r < ROUNDS; r++) {
        job jobs[CLIENTS];
        pthread_t th[CLIENTS];
        int started[CLIENTS];
        memset(jobs, 0, sizeof jobs);
        for (int k = 0; k < CLIENTS; k++) {
            jobs[k].c = &CLIENT[k];
            started[k] = pthread_create(&th[k], NULL, run_conversation, &jobs[k]) == 0;
            CHECK(started[k]);
        }
        for (int k = 0; k < CLIENTS; k++) {
            if (!started[k]) continue;
            pthread_join(th[k], NULL);
            CHECK(!jobs[k].open_failed);
            char what[32];
            snprintf(what, sizeof what, "round %d", r);
            check_same(&alone[k], &jobs[k].t, what, k);
            transcript_free(&jobs[k].t);
        }
    }
}

/* One turn of a session on a fresh thread. */
typedef struct handoff {
    needle_session *s;
    const client *c;
    int turn;
    transcript *t;
    char *buf;
} handoff;

static void *run_handoff(void *arg) {
    handoff *h = arg;
    run_turn(h->s, h->c, h->turn, h->t, h->buf);
    return NULL;
}

static void test_session_moves_between_threads(void) {
    /* two conversations interleaved turn by turn, each turn on a new thread */
    needle_session *s[2] = {open_session(&CLIENT[0]), open_session(&CLIENT[3])};
    const int who[2] = {0, 3};
    CHECK(s[0] && s[1]);
    char *buf[2] = {malloc(ENVELOPE), malloc(ENVELOPE)};
    CHECK(buf[0] && buf[1]);
    transcript t[2];
    memset(t, 0, sizeof t);
    for (int i = 0; s[0] && s[1] && buf[0] && buf[1] && i < TURNS; i++) {
        handoff h[2];
        pthread_t th[2];
        for (int k = 0; k < 2; k++) {
            h[k] = (handoff){s[k], &CLIENT[who[k]], i, &t[k], buf[k]};
            CHECK_EQ_INT(pthread_create(&th[k], NULL, run_handoff, &h[k]), 0);
        }
        for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    }
    for (int k = 0; k < 2; k++) {
        check_same(&alone[who[k]], &t[k], "handed between threads", who[k]);
        transcript_free(&t[k]);
        needle_session_free(s[k]);
        free(buf[k]);
    }
}

/* ---- the official global ABI from several threads ------------------------------------ */

typedef struct abi_job {
    const char *query;
    int calls, ok, parsed;
} abi_job;

static void *run_abi(void *arg) {
    abi_job *j = arg;
    char *out = malloc(ENVELOPE);
    for (int i = 0; out && i < 4; i++) {
        if (i == 2) needle_reset();
        j->calls++;
        if (needle_complete(j->query, MAX_NEW, out, ENVELOPE) != 0) continue;
        j->ok++;
        cJSON *env = cJSON_Parse(out);
        j->parsed += env && cJSON_HasObjectItem(env, "function_calls");
        cJSON_Delete(env);
    }
    free(out);
    return NULL;
}

static void test_official_abi_from_threads(void) {
    /* kept for the life of the process: needle_load may use the bytes in place */
    static char *blob;
    size_t size = 0;
    blob = (char *)read_file(fixture_path("tiny_cq4.cact"), &size);
    CHECK(blob != NULL);
    if (!blob) return;
    CHECK_EQ_INT(needle_load(blob, size), 0);
    CHECK_EQ_INT(needle_init("", CLIENT[0].tools, NULL), 0);
    abi_job jobs[3] = {{.query = "weather in Lima"}, {.query = "is it cold in Oslo"},
                       {.query = "Nairobi weather"}};
    pthread_t th[3];
    for (int k = 0; k < 3; k++) CHECK_EQ_INT(pthread_create(&th[k], NULL, run_abi, &jobs[k]), 0);
    for (int k = 0; k < 3; k++) {
        pthread_join(th[k], NULL);
        CHECK_EQ_INT(jobs[k].calls, 4);
        CHECK_MSG(jobs[k].ok == 4 && jobs[k].parsed == 4, "thread %d: %d of 4 calls ok, %d parsed",
                  k, jobs[k].ok, jobs[k].parsed);
    }
}

static void test_model_opens(void) {
    needle_model_params mp = needle_model_default_params();
    mp.n_threads = 2; /* each session's pool has a worker, whatever the machine */
    const int rc = needle_model_open(fixture_path("tiny_cq4.cact"), &mp, &model);
    CHECK_MSG(rc == NEEDLE_OK, "tiny_cq4.cact: %s", needle_last_error());
}

int main(void) {
    RUN(test_model_opens);
    if (!model) return test_summary();
    RUN(test_each_conversation_alone);
    RUN(test_conversations_at_once);
    RUN(test_session_moves_between_threads);
    RUN(test_official_abi_from_threads);
    for (int k = 0; k < CLIENTS; k++) transcript_free(&alone[k]);
    needle_model_free(model);
    return test_summary();
}
