/* Needle 3 sessions beyond the f32 parity of test_v3: f16 and int8 KV caches, and results
 * that do not depend on the number of threads.
 *
 * KV precision: for every case of the v3a, v3b, v3c fixtures (local sliding-window and
 * global layers, qk != v head dims, conv taps, prompts longer than the local window), the
 * logits at every position of an f16 / int8 session against an f32 session of the same
 * model, as max |logit - f32| / max |logit| over each position, and one prefill against
 * one-token steps of the same precision. The limits are those of Needle 2's KV test
 * (test_api.c test_kv_types), for the same reasons:
 *   f16   2e-3: four fp16 rounding units (2^-11 = 4.9e-4 of a value each);
 *   int8  3e-2: four levels of a 32-value scale group (1/127 = 7.9e-3 of its largest);
 *   prefill vs steps 1e-3, the parity tolerance (last-bit differences that may flip one
 *   cache rounding).
 * Measured here (printed, AVX2 and scalar kernels): f16 at most 5.8e-5, int8 at most
 * 1.8e-3, prefill vs steps at most 5e-6: well inside the limits. Each deviation must also
 * be non-zero (the session really keeps that precision), and the f32 session stays within
 * the parity tolerance of the official reference (the baseline is the right one).
 *
 * Threads: sessions of models opened with 1, 2 and 4 threads give bit-identical logits,
 * by prefill and by steps, in every KV precision (each item of the threaded ops is
 * computed by one thread with the same arithmetic, whichever thread). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"

typedef struct kv_case {
    int32_t *tokens;
    uint32_t n;
    float *ref; /* [n][cols] the official logits */
    uint32_t cols;
} kv_case;

static uint32_t load_cases(const char *name, kv_case *out, uint32_t cap) {
    char rel[256];
    snprintf(rel, sizeof rel, "v3/%s.json", name);
    size_t size;
    char *text = (char *)read_file(fixture_path(rel), &size);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!j) return 0;
    uint32_t n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
        if (n == cap) break;
        kv_case *k = &out[n++];
        const cJSON *toks = cJSON_GetObjectItem(c, "tokens");
        k->n = (uint32_t)cJSON_GetArraySize(toks);
        k->cols = (uint32_t)cJSON_GetObjectItem(c, "cols")->valueint;
        k->tokens = malloc(k->n * sizeof *k->tokens);
        for (uint32_t i = 0; i < k->n; i++)
            k->tokens[i] = cJSON_GetArrayItem(toks, (int)i)->valueint;
        snprintf(rel, sizeof rel, "v3/%s", cJSON_GetObjectItem(c, "logits")->valuestring);
        k->ref = (float *)(void *)read_file(fixture_path(rel), &size);
        if (k->ref && size != (size_t)k->n * k->cols * 4) {
            free(k->ref);
            k->ref = NULL;
        }
    }
    cJSON_Delete(j);
    return n;
}

static needle_model *open_model(const char *name, int32_t threads) {
    char rel[256];
    snprintf(rel, sizeof rel, "v3/%s.cact", name);
    needle_model_params mp = needle_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = threads;
    needle_model *m = NULL;
    CHECK_MSG(needle_model_open(fixture_path(rel), &mp, &m) == NEEDLE_OK, "%s: %s", name,
              needle_last_error());
    return m;
}

/* Logits [n][vocab] of a fresh session of `kv` type, by one prefill or one-token steps. */
static float *eval(needle_model *m, int32_t kv, const kv_case *c, uint32_t vocab, int steps) {
    needle_session_params sp = needle_session_default_params();
    sp.kv_type = kv;
    needle_session *s = NULL;
    CHECK_MSG(needle_session_create(m, &sp, &s) == NEEDLE_OK, "session kv %d: %s", kv,
              needle_last_error());
    if (!s) return NULL;
    float *out = malloc((size_t)c->n * vocab * sizeof *out);
    int rc = NEEDLE_OK;
    if (!steps) rc = needle_session_eval(s, c->tokens, c->n, out, (size_t)c->n * vocab);
    for (uint32_t p = 0; steps && p < c->n && rc == NEEDLE_OK; p++)
        rc = needle_session_eval(s, c->tokens + p, 1, out + (size_t)p * vocab, vocab);
    CHECK_EQ_INT(rc, NEEDLE_OK);
    needle_session_free(s);
    if (rc != NEEDLE_OK) {
        free(out);
        return NULL;
    }
    return out;
}

/* Worst over positions of max |a - b| / max |b| over the first `cols` ids (b: ld_b wide). */
static double rel_dev(const float *a, size_t ld_a, const float *b, size_t ld_b, uint32_t n,
                      uint32_t cols) {
    double worst = 0;
    for (uint32_t p = 0; p < n; p++) {
        double mx = 0, err = 0;
        for (uint32_t v = 0; v < cols; v++) {
            const double x = a[p * ld_a + v], y = b[p * ld_b + v];
            mx = fmax(mx, fabs(y));
            err = fmax(err, fabs(x - y));
        }
        const double rel = mx > 0 ? err / mx : err;
        if (!(rel <= worst)) worst = rel; /* NaN propagates */
    }
    return worst;
}

static const char *const fixtures[] = {"v3a", "v3b", "v3c"};

static void test_kv_precisions(void) {
    const struct { int32_t type; const char *name; double limit; } kinds[] = {
        {NEEDLE_KV_F16, "f16", 2e-3}, {NEEDLE_KV_INT8, "int8", 3e-2}};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        kv_case cases[4];
        const uint32_t n_cases = load_cases(fixtures[f], cases, 4);
        CHECK_MSG(n_cases > 0, "no cases for %s", fixtures[f]);
        needle_model *m = open_model(fixtures[f], 0);
        needle_model_info info = {.size = sizeof info};
        if (m) CHECK_EQ_INT(needle_model_get_info(m, &info), NEEDLE_OK);
        double worst[2] = {0, 0}, worst_steps[2] = {0, 0};
        for (uint32_t k = 0; m && k < n_cases; k++) {
            const kv_case *c = &cases[k];
            const uint32_t V = info.vocab;
            float *base = eval(m, NEEDLE_KV_F32, c, V, 0);
            CHECK(base != NULL && c->ref != NULL);
            if (base && c->ref)
                CHECK(rel_dev(base, V, c->ref, c->cols, c->n, c->cols) <= 1e-3);
            for (int t = 0; base && t < 2; t++) {
                float *pre = eval(m, kinds[t].type, c, V, 0);
                float *inc = eval(m, kinds[t].type, c, V, 1);
                if (pre && inc) {
                    worst[t] = fmax(worst[t], rel_dev(pre, V, base, V, c->n, c->cols));
                    worst_steps[t] = fmax(worst_steps[t], rel_dev(inc, V, pre, V, c->n, c->cols));
                }
                free(pre);
                free(inc);
            }
            free(base);
        }
        for (int t = 0; m && t < 2; t++) {
            printf("  %s kv %-4s: max |logit - f32| / max |logit| = %.2g (prefill vs steps "
                   "%.2g)\n", fixtures[f], kinds[t].name, worst[t], worst_steps[t]);
            CHECK_MSG(worst[t] > 0, "%s kv %s equals the f32 cache", fixtures[f], kinds[t].name);
            CHECK_MSG(worst[t] < kinds[t].limit, "%s kv %s deviates by %g (limit %g)",
                      fixtures[f], kinds[t].name, worst[t], kinds[t].limit);
            CHECK_MSG(worst_steps[t] < 1e-3, "%s kv %s: prefill vs steps %g", fixtures[f],
                      kinds[t].name, worst_steps[t]);
        }
        needle_model_free(m);
        for (uint32_t k = 0; k < n_cases; k++) {
            free(cases[k].tokens);
            free(cases[k].ref);
        }
    }
}

static void test_thread_counts_bit_identical(void) {
    const int32_t threads[] = {1, 2, 4};
    const int32_t types[] = {NEEDLE_KV_F32, NEEDLE_KV_F16, NEEDLE_KV_INT8};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        kv_case cases[4];
        const uint32_t n_cases = load_cases(fixtures[f], cases, 1);
        CHECK_MSG(n_cases > 0, "no cases for %s", fixtures[f]);
        needle_model *m[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++) m[i] = open_model(fixtures[f], threads[i]);
        needle_model_info info = {.size = sizeof info};
        if (m[0]) CHECK_EQ_INT(needle_model_get_info(m[0], &info), NEEDLE_OK);
        for (int ty = 0; n_cases && m[0] && m[1] && m[2] && ty < 3; ty++)
            for (int steps = 0; steps < 2; steps++) {
                float *one = eval(m[0], types[ty], &cases[0], info.vocab, steps);
                for (int i = 1; one && i < 3; i++) {
                    float *more = eval(m[i], types[ty], &cases[0], info.vocab, steps);
                    CHECK_MSG(more && memcmp(one, more, (size_t)cases[0].n * info.vocab *
                                                           sizeof *one) == 0,
                              "%s kv %d steps %d: %d threads differ from 1", fixtures[f],
                              types[ty], steps, threads[i]);
                    free(more);
                }
                free(one);
            }
        for (int i = 0; i < 3; i++) needle_model_free(m[i]);
        for (uint32_t k = 0; k < n_cases; k++) {
            free(cases[k].tokens);
            free(cases[k].ref);
        }
    }
}

int main(void) {
    RUN(test_kv_precisions);
    RUN(test_thread_counts_bit_identical);
    return test_summary();
}
