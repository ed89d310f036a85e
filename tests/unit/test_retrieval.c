/* Tool retrieval, the tool index file, the envelope's confidence and min_confidence
 * (agent/retrieval.c, agent/confidence.c) on a random-weight fixture with probe heads. The
 * weights are random, so what is checked is the mechanism: the tools the envelope says were
 * rendered are the top k by the contrastive head computed independently, calls stay inside
 * them, the index file is written, reused, validated and rebuilt. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "needle.h"

#define N_TOOLS 60
#define TOP_K 5
#define INDEX_SIZE(n) (40 + (size_t)(n) * (8 + 4 * NEEDLE_EMBEDDING_DIM))

static const char *const WORDS[] = {"weather", "light", "timer", "music", "email", "alarm",
                                    "note", "call", "map", "news", "stock", "taxi"};

/* Tool i in the engine's canonical (Python-compact) JSON, so the text embedded is this. */
static void tool_json(int i, char *out, size_t cap) {
    snprintf(out, cap,
             "{\"name\":\"tool_%02d\",\"description\":\"%s %s\",\"parameters\":{\"type\":"
             "\"object\",\"properties\":{\"x\":{\"type\":\"string\"}}}}",
             i, WORDS[i % 12], WORDS[(i / 12 + i) % 12]);
}

static char *tools_array(int n) {
    char *t = malloc((size_t)n * 200 + 3), one[200];
    size_t len = 0;
    t[len++] = '[';
    for (int i = 0; i < n; i++) {
        tool_json(i, one, sizeof one);
        if (i) t[len++] = ',';
        memcpy(t + len, one, strlen(one));
        len += strlen(one);
    }
    t[len++] = ']';
    t[len] = 0;
    return t;
}

static needle_session *new_session(needle_model *m) {
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 8192; /* the fixture's max_seq_len (128) is too short for a tools prefix */
    needle_session *s = NULL;
    CHECK(needle_session_create(m, &sp, &s) == NEEDLE_OK);
    return s;
}

static cJSON *complete(needle_session *s, const char *text, const needle_complete_params *p) {
    static char out[1 << 16];
    size_t len = 0;
    int rc = needle_session_complete(s, text, p, out, sizeof out, &len);
    CHECK_MSG(rc == NEEDLE_OK, "complete: %d %s", rc, needle_last_error());
    cJSON *e = cJSON_Parse(out);
    CHECK(e != NULL);
    return e;
}

static uint64_t tokens_evaluated(const needle_session *s) {
    needle_session_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    needle_session_get_stats(s, &st);
    return st.tokens_evaluated;
}

static uint8_t *slurp(const char *path, size_t *size) { return read_file(path, size); }

static void test_retrieval_and_index(void) {
    needle_model *m;
    CHECK(needle_model_open(fixture_path("tinyb_mixed.cact"), NULL, &m) == NEEDLE_OK);
    char index_path[64];
    snprintf(index_path, sizeof index_path, "/tmp/needle_tool_index_%d.bin", (int)getpid());
    remove(index_path);
    char *tools = tools_array(N_TOOLS);
    const char *query = "please turn on the light in the kitchen";

    /* the expected choice, computed independently with the public embedding call */
    needle_session *ref = new_session(m);
    float q[NEEDLE_EMBEDDING_DIM], e[NEEDLE_EMBEDDING_DIM], score[N_TOOLS];
    size_t n = 0;
    CHECK(needle_session_embed(ref, query, q, NEEDLE_EMBEDDING_DIM, &n) == NEEDLE_OK);
    for (int i = 0; i < N_TOOLS; i++) {
        char one[200];
        tool_json(i, one, sizeof one);
        CHECK(needle_session_embed(ref, one, e, NEEDLE_EMBEDDING_DIM, &n) == NEEDLE_OK);
        double dot = 0;
        for (int j = 0; j < NEEDLE_EMBEDDING_DIM; j++) dot += (double)q[j] * e[j];
        score[i] = (float)dot;
    }
    int taken[N_TOOLS] = {0};
    for (int r = 0; r < TOP_K; r++) {
        int best = -1;
        for (int i = 0; i < N_TOOLS; i++)
            if (!taken[i] && (best < 0 || score[i] > score[best])) best = i;
        taken[best] = 1;
    }
    needle_session_free(ref);

    needle_tools_params tp = needle_tools_default_params();
    tp.tool_index_path = index_path;
    needle_session *s = new_session(m);
    CHECK(needle_session_set_tools_ex(s, "", tools, &tp) == NEEDLE_OK);
    const uint64_t first_cost = tokens_evaluated(s);
    needle_complete_params cp = needle_complete_default_params();
    cp.max_new_tokens = 48;
    cJSON *env = complete(s, query, &cp);
    const cJSON *rt = cJSON_GetObjectItem(env, "retrieved_tools");
    CHECK(cJSON_IsArray(rt) && cJSON_GetArraySize(rt) == TOP_K);
    int k = 0;
    for (int i = 0; i < N_TOOLS; i++) {
        if (!taken[i]) continue;
        char name[16];
        snprintf(name, sizeof name, "tool_%02d", i);
        const cJSON *got = cJSON_GetArrayItem(rt, k++);
        CHECK_MSG(cJSON_IsString(got) && !strcmp(got->valuestring, name), "retrieved %d: %s vs %s",
                  k - 1, cJSON_IsString(got) ? got->valuestring : "?", name);
    }
    /* calls only name rendered tools; confidence is a number in [0, 1] */
    const cJSON *call;
    cJSON_ArrayForEach(call, cJSON_GetObjectItem(env, "function_calls")) {
        const char *nm = cJSON_GetObjectItem(call, "name")->valuestring;
        int found = 0;
        const cJSON *r;
        cJSON_ArrayForEach(r, rt) found |= !strcmp(r->valuestring, nm);
        CHECK_MSG(found, "call to %s, which was not retrieved", nm);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItem(env, "success"))) {
        const cJSON *conf = cJSON_GetObjectItem(env, "confidence");
        CHECK(cJSON_IsNumber(conf) && conf->valuedouble >= 0 && conf->valuedouble <= 1);
    }
    cJSON_Delete(env);
    needle_session_free(s);

    /* the index file: the documented size; a second session reads it instead of embedding */
    size_t size = 0;
    uint8_t *saved = slurp(index_path, &size);
    CHECK(saved && size == INDEX_SIZE(N_TOOLS) && !memcmp(saved, "NDLTIDX1", 8));
    s = new_session(m);
    CHECK(needle_session_set_tools_ex(s, "", tools, &tp) == NEEDLE_OK);
    const uint64_t reuse_cost = tokens_evaluated(s);
    CHECK_MSG(reuse_cost < first_cost, "with the index: %llu tokens, without: %llu",
              (unsigned long long)reuse_cost, (unsigned long long)first_cost);
    env = complete(s, query, &cp);
    rt = cJSON_GetObjectItem(env, "retrieved_tools");
    CHECK(cJSON_IsArray(rt) && cJSON_GetArraySize(rt) == TOP_K);
    cJSON_Delete(env);
    needle_session_free(s);

    /* a damaged file (one embedding no longer unit length) is rebuilt, to the same bytes */
    FILE *f = fopen(index_path, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, 40 + 8 + 4 * 3, SEEK_SET);
        const float big = 7.0f;
        fwrite(&big, 4, 1, f);
        fclose(f);
    }
    s = new_session(m);
    CHECK(needle_session_set_tools_ex(s, "", tools, &tp) == NEEDLE_OK);
    CHECK(tokens_evaluated(s) == first_cost);
    size_t size2 = 0;
    uint8_t *rebuilt = slurp(index_path, &size2);
    CHECK(rebuilt && size2 == size && saved && !memcmp(rebuilt, saved, size));
    free(rebuilt);
    needle_session_free(s);

    /* changed tools: the file follows them */
    char *fewer = tools_array(N_TOOLS - 7);
    s = new_session(m);
    CHECK(needle_session_set_tools_ex(s, "", fewer, &tp) == NEEDLE_OK);
    rebuilt = slurp(index_path, &size2);
    CHECK(rebuilt && size2 == INDEX_SIZE(N_TOOLS - 7));
    free(rebuilt);
    needle_session_free(s);
    free(fewer);

    /* a file that is not an index is replaced, not trusted */
    f = fopen(index_path, "wb");
    if (f) {
        fputs("not an index", f);
        fclose(f);
    }
    s = new_session(m);
    CHECK(needle_session_set_tools_ex(s, "", tools, &tp) == NEEDLE_OK);
    rebuilt = slurp(index_path, &size2);
    CHECK(rebuilt && size2 == size && saved && !memcmp(rebuilt, saved, size));
    free(rebuilt);
    needle_session_free(s);

    /* retrieval off: every tool rendered, no retrieved_tools key */
    tp.retrieval_threshold = UINT32_MAX;
    tp.tool_index_path = NULL;
    s = new_session(m);
    CHECK(needle_session_set_tools_ex(s, "", tools, &tp) == NEEDLE_OK);
    env = complete(s, query, &cp);
    CHECK(cJSON_GetObjectItem(env, "retrieved_tools") == NULL);
    cJSON_Delete(env);
    /* bad parameters */
    tp = needle_tools_default_params();
    tp.top_k = 1000;
    CHECK(needle_session_set_tools_ex(s, "", tools, &tp) == NEEDLE_ERR_INVALID_ARGUMENT);
    needle_session_free(s);

    free(saved);
    free(tools);
    remove(index_path);
    needle_model_free(m);
}

static void test_confidence_and_min_confidence(void) {
    needle_model *m;
    CHECK(needle_model_open(fixture_path("tinyb_mixed.cact"), NULL, &m) == NEEDLE_OK);
    char *tools = tools_array(3);
    needle_session *s = new_session(m);
    CHECK(needle_session_set_tools(s, "", tools) == NEEDLE_OK);
    needle_complete_params cp = needle_complete_default_params();
    cp.max_new_tokens = 64;
    cp.extract = 1; /* exactly one call, whatever the random weights prefer */
    cJSON *env = complete(s, "set a timer", &cp);
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(env, "success")));
    const cJSON *conf = cJSON_GetObjectItem(env, "confidence");
    CHECK(cJSON_IsNumber(conf) && conf->valuedouble >= 0 && conf->valuedouble <= 1);
    const double c0 = cJSON_IsNumber(conf) ? conf->valuedouble : -1;
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(env, "function_calls")) == 1);
    CHECK(cJSON_GetObjectItem(env, "suppressed_calls") == NULL);
    char *calls = cJSON_PrintUnformatted(cJSON_GetObjectItem(env, "function_calls"));
    cJSON_Delete(env);

    /* the same turn again from the prefix gives the same confidence; above it, the call is
     * suppressed and the turn leaves no trace */
    needle_session_reset(s);
    const uint32_t at = needle_session_position(s);
    cp.min_confidence = (float)c0 + 0.01f;
    env = complete(s, "set a timer", &cp);
    CHECK(!strcmp(cJSON_GetObjectItem(env, "type")->valuestring, "low_confidence"));
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(env, "function_calls")) == 0);
    char *supp = cJSON_PrintUnformatted(cJSON_GetObjectItem(env, "suppressed_calls"));
    CHECK(supp && calls && !strcmp(supp, calls));
    conf = cJSON_GetObjectItem(env, "confidence");
    CHECK(cJSON_IsNumber(conf) && fabs(conf->valuedouble - c0) < 1e-4);
    CHECK_EQ_INT(needle_session_position(s), at);
    free(supp);
    cJSON_Delete(env);
    /* at or below it, the call goes through */
    cp.min_confidence = (float)fmax(0.0, c0 - 0.01);
    env = complete(s, "set a timer", &cp);
    CHECK(!strcmp(cJSON_GetObjectItem(env, "type")->valuestring, "call"));
    cJSON_Delete(env);
    cp.min_confidence = -1;
    char out[256];
    size_t len;
    CHECK(needle_session_complete(s, "x", &cp, out, sizeof out, &len) == NEEDLE_ERR_INVALID_ARGUMENT);
    free(calls);
    needle_session_free(s);
    free(tools);
    needle_model_free(m);
}

/* The CLI: `needle embed` prints what needle_session_embed computes; `needle run
 * --min-confidence` above any confidence suppresses the call. */
static void test_cli(void) {
    needle_model *m;
    CHECK(needle_model_open(fixture_path("tinyb_mixed.cact"), NULL, &m) == NEEDLE_OK);
    needle_session *s = new_session(m);
    float want[NEEDLE_EMBEDDING_DIM];
    size_t n = 0;
    CHECK(needle_session_embed(s, "hello world", want, NEEDLE_EMBEDDING_DIM, &n) == NEEDLE_OK);
    needle_session_free(s);
    needle_model_free(m);
    static char out[1 << 16], cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' embed -w '%s' 'hello world'", cli_path(),
             fixture_path("tinyb_mixed.cact"));
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    cJSON *line = cJSON_Parse(out);
    const cJSON *emb = cJSON_GetObjectItem(line, "embedding");
    CHECK(cJSON_IsArray(emb) && cJSON_GetArraySize(emb) == NEEDLE_EMBEDDING_DIM);
    CHECK(!strcmp(cJSON_GetObjectItem(line, "text")->valuestring, "hello world"));
    double err = 0;
    for (int i = 0; i < cJSON_GetArraySize(emb); i++)
        err = fmax(err, fabs(cJSON_GetArrayItem(emb, i)->valuedouble - want[i]));
    CHECK_MSG(err < 1e-6, "CLI embedding differs by %g", err);
    cJSON_Delete(line);
    snprintf(cmd, sizeof cmd, "'%s' embed -w '%s' x 2>/dev/null", cli_path(),
             fixture_path("tiny_cq4.cact"));
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 1); /* no retrieval head */

    char *tools = tools_array(2);
    snprintf(cmd, sizeof cmd, "'%s' run -w '%s' --ctx 4096 --tools '%s' -n 48 --min-confidence 1.5 "
             "'set a timer'", cli_path(), fixture_path("tinyb_mixed.cact"), tools);
    free(tools);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    cJSON *env = cJSON_Parse(out);
    const cJSON *type = cJSON_GetObjectItem(env, "type");
    const int called = cJSON_GetArraySize(cJSON_GetObjectItem(env, "suppressed_calls")) > 0;
    CHECK(cJSON_IsNumber(cJSON_GetObjectItem(env, "confidence")));
    CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(env, "function_calls")), 0);
    /* the random model may refuse; a call it made is suppressed */
    CHECK(cJSON_IsString(type) && !strcmp(type->valuestring, called ? "low_confidence" : "call"));
    cJSON_Delete(env);
}

int main(void) {
    RUN(test_retrieval_and_index);
    RUN(test_cli);
    RUN(test_confidence_and_min_confidence);
    return test_summary();
}
