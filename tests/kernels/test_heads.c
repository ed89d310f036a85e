/* Probe heads (spec §4): the streaming pool against a direct two-pass softmax, and parity
 * of the contrastive and confidence heads with the official forward_* functions
 * (tests/reference/make_head_fixtures.py -> tests/fixtures/heads/<model>.json): embedding
 * within 1e-4 of its largest component, confidence logit within 1e-4 relative, by prefill
 * and by one-token steps. Prints the worst errors, the figures the parity claim rests on. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/heads.h"
#include "model/session.h"
#include "needle.h"

#define TOLERANCE 1e-4

/* ---- the pool on synthetic cells ------------------------------------------------------- */

static void test_pool_matches_two_pass_softmax(void) {
    enum { D = 16, P = 3, OUT = 2, TOKENS = 5, CELLS = 4 };
    float probes[P * D], proj[OUT * P * D], bias[OUT] = {0.25f, -0.5f};
    float cells[TOKENS * CELLS][D];
    int32_t tokens[TOKENS] = {2, 17, 0, 40, 9}; /* token 2 (index 2) is PAD: left out */
    uint32_t seed = 12345;
#define RND() ((float)((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.0f * 4.0f - 2.0f)
    for (int i = 0; i < P * D; i++) probes[i] = RND();
    for (int i = 0; i < OUT * P * D; i++) proj[i] = RND() * 0.1f;
    for (int c = 0; c < TOKENS * CELLS; c++)
        for (int j = 0; j < D; j++) cells[c][j] = RND() * 3.0f;
    probe_head head = {.code = HEAD_CODE_CONFIDENCE, .num_probes = P, .out_dim = OUT,
                       .probes = probes, .proj = proj, .bias = bias};
    head_pool pool;
    CHECK(head_pool_init(&pool, &head, D) == NEEDLE_OK);
    float out[OUT];
    CHECK(head_pool_output(&pool, out) == NEEDLE_ERR_STATE); /* nothing pooled yet */
    /* cells arrive layer by layer for all tokens at once, as the forward hands them over */
    for (int l = 0; l < CELLS; l++) {
        float layer[TOKENS][D];
        for (int t = 0; t < TOKENS; t++) memcpy(layer[t], cells[t * CELLS + l], sizeof layer[t]);
        head_pool_add(&pool, tokens, TOKENS, (uint32_t)l, &layer[0][0]);
    }
    CHECK_EQ_INT(pool.cells, (TOKENS - 1) * CELLS);
    CHECK(head_pool_output(&pool, out) == NEEDLE_OK);
    /* direct: scores, max, softmax, weighted sum, projection, in double */
    double u[P * D];
    for (int k = 0; k < P; k++) {
        double score[TOKENS * CELLS], mx = -INFINITY, sum = 0;
        for (int c = 0; c < TOKENS * CELLS; c++) {
            double dot = 0;
            for (int j = 0; j < D; j++) dot += (double)cells[c][j] * probes[k * D + j];
            score[c] = dot / sqrt((double)D);
            if (tokens[c / CELLS] != 0 && score[c] > mx) mx = score[c];
        }
        for (int j = 0; j < D; j++) u[k * D + j] = 0;
        for (int c = 0; c < TOKENS * CELLS; c++) {
            if (tokens[c / CELLS] == 0) continue;
            double w = exp(score[c] - mx);
            sum += w;
            for (int j = 0; j < D; j++) u[k * D + j] += w * cells[c][j];
        }
        for (int j = 0; j < D; j++) u[k * D + j] /= sum;
    }
    for (int o = 0; o < OUT; o++) {
        double y = bias[o];
        for (int j = 0; j < P * D; j++) y += (double)proj[o * P * D + j] * u[j];
        CHECK_MSG(fabs(out[o] - y) <= 1e-5 * fmax(1.0, fabs(y)), "output %d: %g vs %g", o,
                  out[o], y);
    }
    /* a copy carries the state; clearing empties it */
    head_pool copy;
    CHECK(head_pool_init(&copy, &head, D) == NEEDLE_OK);
    head_pool_copy(&copy, &pool);
    float out2[OUT];
    CHECK(head_pool_output(&copy, out2) == NEEDLE_OK && !memcmp(out, out2, sizeof out));
    head_pool_clear(&copy);
    CHECK(copy.cells == 0 && head_pool_output(&copy, out2) == NEEDLE_ERR_STATE);
    /* the contrastive head's output is unit length */
    head.code = HEAD_CODE_CONTRASTIVE;
    CHECK(head_pool_output(&pool, out) == NEEDLE_OK);
    CHECK(fabs(sqrt((double)out[0] * out[0] + (double)out[1] * out[1]) - 1.0) < 1e-6);
    head_pool_free(&pool);
    head_pool_free(&copy);
    CHECK(fabsf(head_confidence_probability(0.0f) - 0.5f) < 1e-7f);
    CHECK(head_confidence_probability(-200.0f) >= 0.0f && head_confidence_probability(200.0f) <= 1.0f);
}

/* ---- parity with the official heads ------------------------------------------------------ */

static void pool_cb(void *user, const int32_t *tokens, uint32_t n, uint32_t cell,
                    const float *cells) {
    head_pool_add(user, tokens, n, cell, cells);
}

/* The confidence logit of ids by one session run (steps = 0) or one token at a time. */
static int confidence_logit(needle_model *m, uint32_t window, const int32_t *ids, size_t n,
                            int steps, float *logit) {
    const probe_head *h = model_probe_head(m, HEAD_CODE_CONFIDENCE);
    if (!h) return -1;
    needle_session_params sp = needle_session_default_params();
    sp.kv_window = (int32_t)window;
    model_session *s;
    if (session_create(m, &sp, &s) != NEEDLE_OK) return -1;
    head_pool pool;
    head_pool_init(&pool, h, m->w.d);
    const session_cells to_pool = {pool_cb, &pool};
    int rc = 0;
    if (steps) {
        for (size_t i = 0; i < n && !rc; i++) rc = session_run(s, ids + i, 1, NULL, 0, &to_pool);
    } else {
        rc = session_run(s, ids, (uint32_t)n, NULL, 0, &to_pool);
    }
    if (!rc) rc = head_pool_output(&pool, logit);
    head_pool_free(&pool);
    session_free(s);
    return rc;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void check_fixture(const char *name) {
    char file[300];
    snprintf(file, sizeof file, "heads/%s.json", name);
    size_t size;
    char *text = (char *)read_file(fixture_path(file), &size);
    if (!text) {
        harness_skip("heads fixture missing");
        return;
    }
    cJSON *doc = cJSON_Parse(text);
    free(text);
    CHECK(doc != NULL);
    if (!doc) return;
    const char *model_file = cJSON_GetObjectItem(doc, "model")->valuestring;
    const uint32_t window = (uint32_t)cJSON_GetObjectItem(doc, "window")->valuedouble;
    needle_model *m;
    CHECK(needle_model_open(fixture_path(model_file), NULL, &m) == NEEDLE_OK);
    needle_session_params sp = needle_session_default_params();
    sp.kv_window = (int32_t)window;
    model_session *s, *embedder = NULL;
    CHECK(session_create(m, &sp, &s) == NEEDLE_OK);
    double worst_emb = 0, worst_conf = 0;
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "cases")) {
        const cJSON *jt = cJSON_GetObjectItem(c, "tokens");
        size_t n = (size_t)cJSON_GetArraySize(jt), i = 0;
        int32_t *ids = malloc(n * sizeof *ids);
        const cJSON *it;
        cJSON_ArrayForEach(it, jt) ids[i++] = (int32_t)it->valuedouble;
        float emb[HEAD_EMBED_DIM];
        CHECK(session_embed_tokens(s, &embedder, ids, n, emb) == NEEDLE_OK);
        const cJSON *je = cJSON_GetObjectItem(c, "embedding");
        CHECK_EQ_INT(cJSON_GetArraySize(je), HEAD_EMBED_DIM);
        double mx = 0, err = 0;
        i = 0;
        cJSON_ArrayForEach(it, je) {
            mx = fmax(mx, fabs(it->valuedouble));
            if (i < HEAD_EMBED_DIM) err = fmax(err, fabs(emb[i] - it->valuedouble));
            i++;
        }
        const double rel_e = err / mx;
        CHECK_MSG(rel_e <= TOLERANCE, "%s case %d: embedding error %.3g", name, n_cases, rel_e);
        if (!(rel_e <= worst_emb)) worst_emb = rel_e;
        const double ref = cJSON_GetObjectItem(c, "confidence_logit")->valuedouble;
        for (int steps = 0; steps < 2; steps++) {
            float logit = NAN;
            CHECK(confidence_logit(m, window, ids, n, steps, &logit) == 0);
            const double rel_c = fabs(logit - ref) / fabs(ref);
            CHECK_MSG(rel_c <= TOLERANCE, "%s case %d (%s): confidence logit %.7g vs %.7g", name,
                      n_cases, steps ? "steps" : "prefill", logit, ref);
            if (!(rel_c <= worst_conf)) worst_conf = rel_c;
        }
        free(ids);
        n_cases++;
    }
    printf("  heads %s: %d cases, window %u: worst embedding error %.3g (of the largest "
           "component), worst confidence-logit error %.3g (relative)\n",
           name, n_cases, window, worst_emb, worst_conf);
    CHECK(n_cases > 0);
    session_free(embedder);
    session_free(s);
    needle_model_free(m);
    cJSON_Delete(doc);
}

/* Every fixture in tests/fixtures/heads/, in name order. */
static void test_parity(void) {
    DIR *d = opendir(fixture_path("heads"));
    if (!d) {
        harness_skip("no tests/fixtures/heads folder");
        return;
    }
    char *names[64];
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) && n < 64) {
        const size_t len = strlen(ent->d_name);
        if (len > 5 && !strcmp(ent->d_name + len - 5, ".json"))
            names[n++] = strndup(ent->d_name, len - 5);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_names);
    for (int i = 0; i < n; i++) {
        check_fixture(names[i]);
        free(names[i]);
    }
    CHECK_MSG(n >= 2, "%d head fixtures, expected at least the two tiny ones", n);
}

/* ---- the public call ------------------------------------------------------------------- */

static void test_session_embed(void) {
    needle_model *m;
    CHECK(needle_model_open(fixture_path("tinyb_mixed.cact"), NULL, &m) == NEEDLE_OK);
    needle_session *s;
    CHECK(needle_session_create(m, NULL, &s) == NEEDLE_OK);
    size_t n = 0;
    CHECK(needle_session_embed(s, "hello", NULL, 0, &n) == NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(n, NEEDLE_EMBEDDING_DIM);
    float a[NEEDLE_EMBEDDING_DIM], b[NEEDLE_EMBEDDING_DIM], c[NEEDLE_EMBEDDING_DIM];
    CHECK(needle_session_embed(s, "What is the weather in Paris today?", a, 128, &n) == NEEDLE_OK);
    /* a conversation in progress is not disturbed, and the same text embeds the same */
    int32_t ids[3] = {2, 40, 41};
    CHECK(needle_session_eval(s, ids, 3, NULL, 0) == NEEDLE_OK);
    CHECK(needle_session_embed(s, "What is the weather in Paris today?", b, 128, &n) == NEEDLE_OK);
    CHECK(!memcmp(a, b, sizeof a));
    CHECK_EQ_INT(needle_session_position(s), 3);
    CHECK(needle_session_embed(s, "Set an alarm for 7am tomorrow.", c, 128, &n) == NEEDLE_OK);
    CHECK(memcmp(a, c, sizeof a) != 0);
    CHECK(fabs(head_similarity(a, a, 128) - 1.0) < 1e-5);
    CHECK(needle_session_embed(s, "\xff bad", a, 128, &n) == NEEDLE_ERR_INVALID_UTF8);
    CHECK(needle_session_embed(NULL, "x", a, 128, &n) == NEEDLE_ERR_INVALID_ARGUMENT);
    needle_session_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    CHECK(needle_session_get_stats(s, &st) == NEEDLE_OK && st.heads_ms > 0);
    needle_session_free(s);
    needle_model_free(m);
    /* a model without heads says so */
    CHECK(needle_model_open(fixture_path("tiny_cq4.cact"), NULL, &m) == NEEDLE_OK);
    CHECK(needle_session_create(m, NULL, &s) == NEEDLE_OK);
    CHECK(needle_session_embed(s, "hello", a, 128, &n) == NEEDLE_ERR_STATE);
    needle_session_free(s);
    needle_model_free(m);
}

int main(void) {
    RUN(test_pool_matches_two_pass_softmax);
    RUN(test_parity);
    RUN(test_session_embed);
    return test_summary();
}
