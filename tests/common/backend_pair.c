/* Backend-against-CPU comparisons shared by the backend op tests (see backend_pair.h). */
#include "backend_pair.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static uint64_t rng_state = 0x1234567887654321ULL;

void bp_seed(uint64_t seed) { rng_state = seed; }

float bp_frand(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1DULL) >> 40) / 8388608.0f - 1.0f;
}

float *bp_rand_vec(size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = scale * bp_frand();
    return v;
}

int bp_open(const needle_model *m, const needle_backend_ops *ops, const char *name,
            const needle_session_params *sp, double tol, pair *p) {
    p->name = name;
    p->tol = tol;
    p->ref = p->dut = NULL;
    CHECK_EQ_INT(session_create_with_ops(m, sp, &cpu_backend_ops, &p->ref), NEEDLE_OK);
    CHECK_MSG(session_create_with_ops(m, sp, ops, &p->dut) == NEEDLE_OK, "%s: session: %s",
              name, needle_last_error());
    if (p->ref && p->dut) return 1;
    bp_close(p);
    return 0;
}

void bp_close(pair *p) {
    session_free(p->ref);
    session_free(p->dut);
    p->ref = p->dut = NULL;
}

void bp_put(pair *p, void *ref_buf, void *dut_buf, const float *host, size_t n) {
    p->ref->ops->upload(&p->ref->bk, ref_buf, host, n * sizeof(float));
    p->dut->ops->upload(&p->dut->bk, dut_buf, host, n * sizeof(float));
}

void bp_expect_close(pair *p, const void *ref_buf, const void *dut_buf, size_t n,
                     const char *what) {
    float *a = malloc((n ? n : 1) * sizeof *a), *b = malloc((n ? n : 1) * sizeof *b);
    p->ref->ops->download(&p->ref->bk, a, ref_buf, n * sizeof(float));
    p->dut->ops->download(&p->dut->bk, b, dut_buf, n * sizeof(float));
    double mx = 1.0, err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(a[i]));
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]);
        if (!(e <= err)) { /* a NaN is the worst */
            err = e;
            worst = i;
        }
    }
    CHECK_MSG(err <= p->tol * mx, "%s %s: worst |diff| %.3g at %zu (%.9g vs %.9g), limit %.3g",
              p->name, what, err, worst, a[worst], b[worst], p->tol * mx);
    free(a);
    free(b);
}

double bp_worst_rel(const float *a, const float *b, uint32_t n, size_t ld, uint32_t cols) {
    double worst = 0.0;
    for (uint32_t t = 0; t < n; t++) {
        double mx = 0.0, err = 0.0;
        for (uint32_t v = 0; v < cols; v++) {
            mx = fmax(mx, fabs(a[(size_t)t * ld + v]));
            err = fmax(err, fabs((double)a[(size_t)t * ld + v] - b[(size_t)t * ld + v]));
        }
        const double rel = mx > 0 ? err / mx : err;
        if (!(rel <= worst)) worst = rel;
    }
    return worst;
}

void bp_expect_same_greedy(pair *p, int steps) {
    const uint32_t V = p->ref->m->w.vocab;
    for (int step = 0; step < steps; step++) {
        const int32_t a = session_pick_token(session_logits(p->ref), NULL, V, 0.0f, NULL);
        const int32_t b = session_pick_token(session_logits(p->dut), NULL, V, 0.0f, NULL);
        CHECK_MSG(a == b, "%s greedy step %d: %d vs cpu %d", p->name, step, b, a);
        if (a != b) break;
        CHECK_EQ_INT(session_eval(p->ref, &a, 1, NULL, 0, NULL), NEEDLE_OK);
        CHECK_EQ_INT(session_eval(p->dut, &a, 1, NULL, 0, NULL), NEEDLE_OK);
    }
}

needle_model *bp_model_open(const char *fixture, int32_t depth, const needle_backend_ops *ops) {
    needle_model *m = NULL;
    needle_model_params mp = needle_model_default_params();
    mp.backend = "cpu"; /* the ops under test are given explicitly */
    mp.n_threads = 2;
    mp.depth = depth;
    CHECK_MSG(needle_model_open(fixture_path(fixture), &mp, &m) == NEEDLE_OK, "%s: %s", fixture,
              needle_last_error());
    if (m && ops->model_load) {
        const int rc = ops->model_load(&m->w, &m->device_weights);
        CHECK_MSG(rc == NEEDLE_OK, "%s: model_load: %s", fixture, needle_last_error());
        if (rc != NEEDLE_OK) {
            needle_model_free(m);
            return NULL;
        }
    }
    return m;
}

void bp_model_close(needle_model *m, const needle_backend_ops *ops) {
    if (m && ops->model_unload && m->device_weights) {
        ops->model_unload(m->device_weights);
        m->device_weights = NULL;
    }
    needle_model_free(m);
}

void bp_run_compiled_backends(void (*run)(const needle_backend_ops *, const char *),
                              int (*accept)(const needle_backend_impl *)) {
    size_t n = 0, ran = 0, without_device = 0;
    const needle_backend_impl *const *table = backend_table(&n);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(table[i]->name, "cpu")) continue;
        if (!table[i]->probe() || table[i]->device_count() <= 0) {
            printf("  %s: compiled in, but no device on this machine\n", table[i]->name);
            without_device++;
            continue;
        }
        if (!accept || accept(table[i])) run(table[i]->ops, table[i]->name);
        ran++;
    }
    if (!ran) harness_skip(without_device ? "GPU backend compiled in, no device here"
                                          : "no GPU backend compiled in");
}
