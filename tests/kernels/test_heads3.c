/* Needle 3 probe heads (NEEDLE3.md §3): the two-stage pool against a direct computation
 * on synthetic cells, and parity of the embedding, confidence and router heads with the
 * official forward_embedding / forward_confidence / forward_router of cactus-needle 3.2.8
 * (tests/reference/make_v3_head_fixtures.py -> tests/fixtures/v3/v3a.heads.json), by one
 * prefill and by one-token steps, each output within 1e-4 of its largest reference value.
 * Prints the worst errors, the figures the parity claim rests on. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/heads.h"
#include "model/session.h"
#include "needle.h"

#define TOLERANCE 1e-4

/* ---- the two-stage pool on synthetic cells --------------------------------------------- */

static void test_two_stage_matches_direct(void) {
    enum { D = 8, ROWS = 3, K = 2, Q = 2, OUT = 3, T = 4, P = ROWS * K };
    float probes[P * D], gain[P], query[Q * D], row_bias[Q * P], proj[OUT * Q * D], bias[OUT];
    float cells[ROWS][T][D];
    const int32_t tokens[T] = {2, 30, 0, 41}; /* index 2 is PAD: left out */
    uint32_t seed = 777;
#define RND() ((float)((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.0f * 2.0f - 1.0f)
    for (int i = 0; i < P * D; i++) probes[i] = RND();
    for (int i = 0; i < P; i++) gain[i] = 1.0f + 0.5f * RND();
    for (int i = 0; i < Q * D; i++) query[i] = RND();
    for (int i = 0; i < Q * P; i++) row_bias[i] = RND();
    for (int i = 0; i < OUT * Q * D; i++) proj[i] = RND() * 0.2f;
    for (int i = 0; i < OUT; i++) bias[i] = RND();
    for (int l = 0; l < ROWS; l++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < D; j++) cells[l][t][j] = RND() * 2.0f;
#undef RND
    probe_head head = {.code = 3, .num_probes = P, .out_dim = OUT, .probes = probes,
                       .proj = proj, .bias = bias, .rows = ROWS, .per_row = K, .queries = Q,
                       .gain = gain, .query = query, .row_bias = row_bias};
    head_pool pool;
    CHECK(head_pool_init(&pool, &head, D) == NEEDLE_OK);
    /* rows in reverse order: the result must not depend on the order cells arrive in */
    for (int l = ROWS - 1; l >= 0; l--) head_pool_add(&pool, tokens, T, (uint32_t)l, &cells[l][0][0]);
    float out[OUT];
    CHECK(head_pool_output(&pool, out) == NEEDLE_OK);

    double r[P][D];
    for (int p = 0; p < P; p++) {
        const int l = p / K;
        double s[T], mx = -INFINITY, sum = 0, sq = 0;
        for (int t = 0; t < T; t++) {
            double dot = 0;
            for (int j = 0; j < D; j++) dot += (double)cells[l][t][j] * probes[p * D + j];
            s[t] = dot / sqrt((double)D);
            if (tokens[t] && s[t] > mx) mx = s[t];
        }
        for (int j = 0; j < D; j++) r[p][j] = 0;
        for (int t = 0; t < T; t++) {
            if (!tokens[t]) continue;
            const double w = exp(s[t] - mx);
            sum += w;
            for (int j = 0; j < D; j++) r[p][j] += w * cells[l][t][j];
        }
        for (int j = 0; j < D; j++) sq += (r[p][j] / sum) * (r[p][j] / sum);
        for (int j = 0; j < D; j++) r[p][j] = r[p][j] / sum / sqrt(sq / D + 1e-6) * gain[p];
    }
    double pooled[Q * D];
    for (int q = 0; q < Q; q++) {
        double u[P], mx = -INFINITY, sum = 0;
        for (int p = 0; p < P; p++) {
            double dot = 0;
            for (int j = 0; j < D; j++) dot += r[p][j] * query[q * D + j];
            u[p] = dot / sqrt((double)D) + row_bias[q * P + p];
            if (u[p] > mx) mx = u[p];
        }
        for (int p = 0; p < P; p++) sum += exp(u[p] - mx);
        for (int j = 0; j < D; j++) {
            pooled[q * D + j] = 0;
            for (int p = 0; p < P; p++) pooled[q * D + j] += exp(u[p] - mx) / sum * r[p][j];
        }
    }
    for (int o = 0; o < OUT; o++) {
        double y = bias[o];
        for (int j = 0; j < Q * D; j++) y += (double)proj[o * Q * D + j] * pooled[j];
        CHECK_MSG(fabs(out[o] - y) <= 1e-5 * fmax(1.0, fabs(y)), "output %d: %.7g vs %.7g", o,
                  out[o], y);
    }
    head_pool_free(&pool);
}

/* ---- parity with the official heads ------------------------------------------------------ */

static void pool_cb(void *user, const int32_t *tokens, uint32_t n, uint32_t cell,
                    const float *cells) {
    head_pool_add(user, tokens, n, cell, cells);
}

/* The output of head `code` over ids, by one session run (steps = 0) or one token at a time. */
static int head_output(needle_model *m, uint32_t code, const int32_t *ids, size_t n, int steps,
                       float *out) {
    const probe_head *h = model_probe_head(m, code);
    if (!h) return -1;
    model_session *s;
    if (session_create(m, NULL, &s) != NEEDLE_OK) return -1;
    head_pool pool;
    int rc = head_pool_init(&pool, h, m->w.d);
    const session_cells to_pool = {pool_cb, &pool};
    if (!rc && steps) {
        for (size_t i = 0; i < n && !rc; i++) rc = session_run(s, ids + i, 1, NULL, 0, &to_pool);
    } else if (!rc) {
        rc = session_run(s, ids, (uint32_t)n, NULL, 0, &to_pool);
    }
    if (!rc) rc = head_pool_output(&pool, out);
    head_pool_free(&pool);
    session_free(s);
    return rc;
}

/* max |ours - ref| / max |ref| over the n values of a JSON array (or one number). */
static double rel_error(const float *ours, const cJSON *ref, uint32_t n) {
    double mx = 0, err = 0;
    if (cJSON_IsNumber(ref)) return fabs(ours[0] - ref->valuedouble) / fabs(ref->valuedouble);
    if ((uint32_t)cJSON_GetArraySize(ref) != n) return INFINITY;
    uint32_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ref) {
        mx = fmax(mx, fabs(it->valuedouble));
        err = fmax(err, fabs(ours[i++] - it->valuedouble));
    }
    return err / mx;
}

static void test_parity(void) {
    size_t size;
    char *text = (char *)read_file(fixture_path("v3/v3a.heads.json"), &size);
    CHECK(text != NULL);
    if (!text) return;
    cJSON *doc = cJSON_Parse(text);
    free(text);
    CHECK(doc != NULL);
    needle_model *m;
    CHECK(needle_model_open(fixture_path("v3/v3a.cact"), NULL, &m) == NEEDLE_OK);
    needle_model_info info;
    memset(&info, 0, sizeof info);
    info.size = sizeof info;
    CHECK(needle_model_get_info(m, &info) == NEEDLE_OK);
    CHECK_EQ_INT(info.num_probe_heads, 3);
    static const struct { uint32_t code; const char *key; } heads[3] = {
        {HEAD_CODE_CONTRASTIVE, "embedding"}, {HEAD_CODE_CONFIDENCE, "confidence"}, {3, "router"}};
    double worst[3] = {0, 0, 0};
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "cases")) {
        const cJSON *jt = cJSON_GetObjectItem(c, "tokens");
        size_t n = (size_t)cJSON_GetArraySize(jt), i = 0;
        int32_t *ids = malloc(n * sizeof *ids);
        const cJSON *it;
        cJSON_ArrayForEach(it, jt) ids[i++] = (int32_t)it->valuedouble;
        for (int h = 0; h < 3; h++) {
            const probe_head *ph = model_probe_head(m, heads[h].code);
            CHECK(ph != NULL);
            if (!ph) continue;
            float *out = malloc(ph->out_dim * sizeof *out);
            for (int steps = 0; steps < 2; steps++) {
                CHECK(head_output(m, heads[h].code, ids, n, steps, out) == NEEDLE_OK);
                const double e = rel_error(out, cJSON_GetObjectItem(c, heads[h].key), ph->out_dim);
                CHECK_MSG(e <= TOLERANCE, "case %d %s (%s): error %.3g", n_cases, heads[h].key,
                          steps ? "steps" : "prefill", e);
                if (!(e <= worst[h])) worst[h] = e;
            }
            free(out);
        }
        /* the public call embeds text; the session path over ids must agree with the pool */
        model_session *s, *embedder = NULL;
        CHECK(session_create(m, NULL, &s) == NEEDLE_OK);
        float emb[128];
        CHECK(session_embed_tokens(s, &embedder, ids, n, emb) == NEEDLE_OK);
        CHECK(rel_error(emb, cJSON_GetObjectItem(c, "embedding"), 128) <= TOLERANCE);
        session_free(embedder);
        session_free(s);
        free(ids);
        n_cases++;
    }
    printf("  heads v3a: %d cases, worst error (of the largest reference value): embedding "
           "%.3g, confidence %.3g, router %.3g\n", n_cases, worst[0], worst[1], worst[2]);
    CHECK(n_cases >= 2);
    needle_model_free(m);
    cJSON_Delete(doc);
}

/* needle_session_embed on a Needle 3 file: the head's width, a unit vector, and the same
 * text embedding the same whatever the conversation does. */
static void test_session_embed_v3(void) {
    needle_model *m;
    CHECK(needle_model_open(fixture_path("v3/v3a.cact"), NULL, &m) == NEEDLE_OK);
    needle_session *s;
    CHECK(needle_session_create(m, NULL, &s) == NEEDLE_OK);
    size_t n = 0;
    CHECK(needle_session_embed(s, "hello", NULL, 0, &n) == NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(n, 128);
    float a[128], b[128];
    CHECK(needle_session_embed(s, "What is the weather in Paris today?", a, 128, &n) == NEEDLE_OK);
    int32_t ids[3] = {2, 40, 41};
    CHECK(needle_session_eval(s, ids, 3, NULL, 0) == NEEDLE_OK);
    CHECK(needle_session_embed(s, "What is the weather in Paris today?", b, 128, &n) == NEEDLE_OK);
    CHECK(!memcmp(a, b, sizeof a));
    CHECK(fabs(head_similarity(a, a, 128) - 1.0) < 1e-5);
    needle_session_free(s);
    needle_model_free(m);
}

/* A rung run in place has no heads (not checked against the official subnetwork pooling);
 * a rung exported as its own file has its own. */
static void test_rungs(void) {
    needle_model_params mp = needle_model_default_params();
    mp.depth = 3;
    needle_model *m;
    CHECK(needle_model_open(fixture_path("v3/v3a.cact"), &mp, &m) == NEEDLE_OK);
    needle_session *s;
    CHECK(needle_session_create(m, NULL, &s) == NEEDLE_OK);
    float e[128];
    size_t n = 0;
    CHECK(needle_session_embed(s, "hello", e, 128, &n) == NEEDLE_ERR_STATE);
    needle_session_free(s);
    needle_model_free(m);
    CHECK(needle_model_open(fixture_path("v3/v3a_rung3.cact"), NULL, &m) == NEEDLE_OK);
    CHECK(needle_session_create(m, NULL, &s) == NEEDLE_OK);
    CHECK(needle_session_embed(s, "hello", e, 128, &n) == NEEDLE_OK);
    CHECK(fabs(head_similarity(e, e, 128) - 1.0) < 1e-5);
    needle_session_free(s);
    needle_model_free(m);
}

int main(void) {
    RUN(test_two_stage_matches_direct);
    RUN(test_parity);
    RUN(test_session_embed_v3);
    RUN(test_rungs);
    return test_summary();
}
