/* The Needle 3 backend operations (backend.h: attention3, monarch_mlp) of every other
 * implementation against the CPU's (backend/cpu_ops3.c), on the v3 fixtures' weights.
 *
 * Implementations under test: the Metal kernels compiled as C ("metal-c", metal_ops.c over
 * metal_emu.c; always, except in a real Metal build) and every compiled-in GPU backend
 * whose probe finds a device (none here: skipped with a message). Each fixture model gets
 * one CPU session and one session on the ops under test; both get the same random inputs:
 *
 *   attention3   chunks of 5, 1, 7, 1, 12 and 1 tokens through every layer in order (the
 *                conv-tap history crosses chunks, local layers slide past their window,
 *                global ones span everything or the session's window and sinks); the
 *                output rows and the KV cache within TOL = 1e-4 x max(1, max|ref|);
 *   monarch_mlp  every layer, 5 tokens and 1, within TOL;
 *   the forward  prefill and one-token steps of 40 tokens within 1e-3 x max|logit| (the
 *                parity tolerance) at every position, 12 identical greedy tokens;
 *   KV types     the backend's session_init refuses an f16/int8 cache for Needle 3.
 * Models: v3a (qk < v, 3 taps, local + global, padding of the Kronecker MLP), v3b (qk > v,
 * 1 tap, 4 lanes), v3c (all local, 2 taps), v3a at depth 3 (a rung: reordered mHC rows).
 * Parity of these implementations with the official forward: test_v3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "harness.h"
#include "model/session.h"
#include "needle.h"

#define TOL 1e-4
#define TOL_LOGITS 1e-3

#ifdef NEEDLE_TEST_METAL_C
extern const needle_backend_ops nk_backend_ops; /* metal_ops.c over metal_emu.c */
#endif

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1DULL) >> 40) / 8388608.0f - 1.0f;
}

static float *rand_vec(size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = scale * frand();
    return v;
}

typedef struct pair {
    const char *name;
    needle_session *ref, *dut;
} pair;

static void put(pair *p, float *ref_buf, float *dut_buf, const float *host, size_t n) {
    p->ref->ops->upload(&p->ref->bk, ref_buf, host, n * sizeof(float));
    p->dut->ops->upload(&p->dut->bk, dut_buf, host, n * sizeof(float));
}

/* n floats of both sessions' buffers within TOL x max(1, max|ref|). */
static void expect_close(pair *p, const void *ref_buf, const void *dut_buf, size_t n,
                         const char *what) {
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    p->ref->ops->download(&p->ref->bk, a, ref_buf, n * sizeof(float));
    p->dut->ops->download(&p->dut->bk, b, dut_buf, n * sizeof(float));
    double mx = 1.0, err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(a[i]));
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]);
        if (!(e <= err)) {
            err = e;
            worst = i;
        }
    }
    CHECK_MSG(err <= TOL * mx, "%s %s: worst |diff| %.3g at %zu (%.9g vs %.9g), limit %.3g",
              p->name, what, err, worst, a[worst], b[worst], TOL * mx);
    free(a);
    free(b);
}

static int open_pair(const needle_model *m, const needle_backend_ops *ops, const char *name,
                     int32_t window, uint32_t sinks, pair *p) {
    needle_session_params sp = needle_session_default_params();
    sp.kv_window = window;
    sp.n_sinks = sinks;
    sp.n_ctx = 96;
    p->name = name;
    p->ref = p->dut = NULL;
    CHECK_EQ_INT(session_create_with_ops(m, &sp, &cpu_backend_ops, &p->ref), NEEDLE_OK);
    CHECK_MSG(session_create_with_ops(m, &sp, ops, &p->dut) == NEEDLE_OK, "%s: session: %s",
              name, needle_last_error());
    if (p->ref && p->dut) return 1;
    needle_session_free(p->ref);
    needle_session_free(p->dut);
    return 0;
}

/* Whether a layer's cache still holds position t after positions [0, end) were stored:
 * a sink, or not yet overwritten by t + window in the ring. */
static int kv_holds(const kv_layer_layout *L, uint32_t t, uint32_t end) {
    return t < L->n_sinks || !L->window || t + L->window >= end;
}

static void test_attention3_on(const needle_model *m, const needle_backend_ops *ops,
                               const char *name, int32_t window, uint32_t sinks) {
    pair p;
    if (!open_pair(m, ops, name, window, sinks, &p)) return;
    needle_session *r = p.ref, *d = p.dut;
    const model_weights *w = &m->w;
    const uint32_t C = r->bk.chunk, qk = w->qk_dim, vd = w->v_dim;
    const uint32_t Wq = w->n_heads * qk, Wk = w->n_kv_heads * qk, Wv = w->n_kv_heads * vd;
    const uint32_t Wg = w->n_heads * vd;
    const uint32_t steps[] = {5, 1, 7, 1, 12, 1};
    float *cs = malloc((size_t)C * qk * sizeof *cs);
    char what[128];
    uint32_t p0 = 0;
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        const uint32_t cn = steps[k];
        for (uint32_t i = 0; i < cn; i++)
            for (uint32_t j = 0; j < qk / 2; j++) {
                const float ang = (float)(p0 + i) * m->rope_freq[j];
                cs[(size_t)i * qk + j] = cosf(ang);
                cs[(size_t)i * qk + qk / 2 + j] = sinf(ang);
            }
        for (uint32_t li = 0; li < w->n_layers; li++) {
            float *q = rand_vec((size_t)cn * Wq, 2.0f), *kk = rand_vec((size_t)cn * Wk, 2.0f);
            float *v = rand_vec((size_t)cn * Wv, 2.0f), *g = rand_vec((size_t)cn * Wg, 3.0f);
            put(&p, r->q, d->q, q, (size_t)cn * Wq);
            put(&p, r->k, d->k, kk, (size_t)cn * Wk);
            put(&p, r->v, d->v, v, (size_t)cn * Wv);
            put(&p, r->gate, d->gate, g, (size_t)cn * Wg);
            r->ops->attention3(&r->bk, li, p0, cn, cs, r->q, r->k, r->v, r->gate, r->o);
            d->ops->attention3(&d->bk, li, p0, cn, cs, d->q, d->k, d->v, d->gate, d->o);
            snprintf(what, sizeof what, "attention3 (layer %u %s, p0 %u, n %u)", li,
                     w->layers3[li].window ? "local" : "global", p0, cn);
            expect_close(&p, r->o, d->o, (size_t)cn * w->layers[li].out_proj.cols_pad, what);
            free(q);
            free(kk);
            free(v);
            free(g);
        }
        p0 += cn;
    }
    /* the rows of every position each layer still holds, wherever each session's layout
     * (per layer on the CPU, maybe uniform on the other) keeps them */
    for (uint32_t li = 0; li < w->n_layers; li++)
        for (uint32_t t = 0; t < p0; t++) {
            const kv_layer_layout *lr = &r->bk.kv_layers[li], *ld = &d->bk.kv_layers[li];
            if (!kv_holds(lr, t, p0) || !kv_holds(ld, t, p0)) continue;
            const size_t ar = (lr->row0 + nm_kv_slot(t, lr->n_sinks, lr->window)) * w->kv_dim;
            const size_t ad = (ld->row0 + nm_kv_slot(t, ld->n_sinks, ld->window)) * w->kv_dim;
            snprintf(what, sizeof what, "attention3 (K cache, layer %u position %u)", li, t);
            expect_close(&p, (float *)r->bk.k_cache + ar, (float *)d->bk.k_cache + ad,
                         w->kv_dim, what);
            snprintf(what, sizeof what, "attention3 (V cache, layer %u position %u)", li, t);
            expect_close(&p, (float *)r->bk.v_cache + ar, (float *)d->bk.v_cache + ad,
                         w->kv_dim, what);
        }
    free(cs);
    needle_session_free(r);
    needle_session_free(d);
}

static void test_monarch_on(const needle_model *m, const needle_backend_ops *ops,
                            const char *name) {
    pair p;
    if (!open_pair(m, ops, name, -1, 0, &p)) return;
    needle_session *r = p.ref, *d = p.dut;
    const uint32_t D = m->w.d;
    char what[96];
    const uint32_t counts[] = {5, 1};
    for (size_t c = 0; c < 2; c++) {
        float *h = rand_vec((size_t)counts[c] * D, 2.0f);
        put(&p, r->h, d->h, h, (size_t)counts[c] * D);
        for (uint32_t li = 0; li < m->w.n_layers; li++) {
            r->ops->monarch_mlp(&r->bk, li, counts[c], r->h, r->attn);
            d->ops->monarch_mlp(&d->bk, li, counts[c], d->h, d->attn);
            snprintf(what, sizeof what, "monarch_mlp (layer %u, n %u)", li, counts[c]);
            expect_close(&p, r->attn, d->attn, (size_t)counts[c] * D, what);
        }
        free(h);
    }
    needle_session_free(r);
    needle_session_free(d);
}

/* Worst over positions of max_v |a - b| / max_v |a| (the first out_vocab ids). */
static double worst_rel(const float *a, const float *b, uint32_t n, uint32_t V, uint32_t cols) {
    double worst = 0.0;
    for (uint32_t t = 0; t < n; t++) {
        double mx = 0.0, err = 0.0;
        for (uint32_t v = 0; v < cols; v++) {
            mx = fmax(mx, fabs(a[(size_t)t * V + v]));
            err = fmax(err, fabs((double)a[(size_t)t * V + v] - b[(size_t)t * V + v]));
        }
        const double rel = mx > 0 ? err / mx : err;
        if (!(rel <= worst)) worst = rel;
    }
    return worst;
}

static void test_forward_on(const needle_model *m, const needle_backend_ops *ops,
                            const char *name) {
    pair p;
    if (!open_pair(m, ops, name, -1, 0, &p)) return;
    needle_session *r = p.ref, *d = p.dut;
    enum { N_TOK = 40 };
    const uint32_t V = m->w.vocab, cols = m->w.out_vocab;
    int32_t toks[N_TOK];
    for (uint32_t i = 0; i < N_TOK; i++) toks[i] = (int32_t)((i * 7919u + 13u) % cols);
    float *lr = malloc((size_t)N_TOK * V * sizeof *lr), *ld = malloc((size_t)N_TOK * V * sizeof *ld);
    CHECK_EQ_INT(needle_session_eval(r, toks, N_TOK, lr, (size_t)N_TOK * V), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_eval(d, toks, N_TOK, ld, (size_t)N_TOK * V), NEEDLE_OK);
    const double prefill = worst_rel(lr, ld, N_TOK, V, cols);
    CHECK_MSG(prefill <= TOL_LOGITS, "%s prefill: worst relative logit error %.3g", name,
              prefill);
    for (int step = 0; step < 12; step++) {
        const int32_t a = session_pick_token(needle_session_logits(r), NULL, V, 0.0f, NULL);
        const int32_t b = session_pick_token(needle_session_logits(d), NULL, V, 0.0f, NULL);
        CHECK_MSG(a == b, "%s greedy step %d: %d vs cpu %d", name, step, b, a);
        if (a != b) break;
        CHECK_EQ_INT(needle_session_eval(r, &a, 1, NULL, 0), NEEDLE_OK);
        CHECK_EQ_INT(needle_session_eval(d, &a, 1, NULL, 0), NEEDLE_OK);
    }
    /* one-token steps from the reset state: the conv-tap and engram rings restart */
    needle_session_reset(d);
    for (uint32_t t = 0; t < N_TOK; t++)
        CHECK_EQ_INT(needle_session_eval(d, toks + t, 1, ld + (size_t)t * V, V), NEEDLE_OK);
    const double steps = worst_rel(lr, ld, N_TOK, V, cols);
    CHECK_MSG(steps <= TOL_LOGITS, "%s steps: worst relative logit error %.3g", name, steps);
    printf("  %s: forward vs cpu, worst relative logit error prefill %.2e, steps %.2e\n", name,
           prefill, steps);
    free(lr);
    free(ld);
    needle_session_free(r);
    needle_session_free(d);
}

/* The ops read an f32 cache: the backend itself refuses a Needle 3 session with another
 * (whatever the session layer allows the CPU). */
static void test_kv_type_on(const needle_model *m, const needle_backend_ops *ops,
                            const char *name) {
    const int32_t types[] = {NEEDLE_KV_F16, NEEDLE_KV_INT8, NEEDLE_KV_F32};
    for (size_t k = 0; k < 3; k++) {
        backend_ctx b;
        memset(&b, 0, sizeof b);
        b.m = &m->w;
        b.device_weights = m->device_weights;
        b.chunk = 16;
        b.kv_type = types[k];
        const int rc = ops->session_init(&b);
        if (types[k] == NEEDLE_KV_F32) {
            CHECK_MSG(rc == NEEDLE_OK && b.dev != NULL, "%s: f32 session: %s", name,
                      needle_last_error());
        } else {
            CHECK_MSG(rc == NEEDLE_ERR_INVALID_ARGUMENT && b.dev == NULL &&
                          strstr(needle_last_error(), "f32") != NULL,
                      "%s: kv_type %d: %d %s", name, types[k], rc, needle_last_error());
        }
        if (b.dev) ops->session_free(&b);
    }
}

static void run_impl(const needle_backend_ops *ops, const char *name) {
    static const struct {
        const char *file;
        int32_t depth;
        int32_t window; /* a session window >= every local window, for the sinks case */
    } models[] = {{"v3/v3a.cact", 0, 10}, {"v3/v3b.cact", 0, 9}, {"v3/v3c.cact", 0, 7},
                  {"v3/v3a.cact", 3, 10}};
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        needle_model *m = NULL;
        needle_model_params mp = needle_model_default_params();
        mp.backend = "cpu"; /* the ops under test are given explicitly */
        mp.depth = models[k].depth;
        CHECK_EQ_INT(needle_model_open(fixture_path(models[k].file), &mp, &m), NEEDLE_OK);
        if (!m) continue;
        struct needle_model *mm = m;
        int loaded = 0;
        if (ops->model_load) {
            CHECK_EQ_INT(ops->model_load(&mm->w, &mm->device_weights), NEEDLE_OK);
            loaded = 1;
        }
        char label[160];
        snprintf(label, sizeof label, "%s/%s@%d", name, models[k].file, models[k].depth);
        test_kv_type_on(m, ops, label);
        snprintf(label, sizeof label, "%s/%s@%d full", name, models[k].file, models[k].depth);
        test_attention3_on(m, ops, label, -1, 0);
        snprintf(label, sizeof label, "%s/%s@%d window %d, 2 sinks", name, models[k].file,
                 models[k].depth, models[k].window);
        test_attention3_on(m, ops, label, models[k].window, 2);
        snprintf(label, sizeof label, "%s/%s@%d", name, models[k].file, models[k].depth);
        test_monarch_on(m, ops, label);
        test_forward_on(m, ops, label);
        if (loaded) {
            ops->model_unload(mm->device_weights);
            mm->device_weights = NULL;
        }
        needle_model_free(m);
    }
}

static void test_metal_kernels_as_c(void) {
#ifdef NEEDLE_TEST_METAL_C
    run_impl(&nk_backend_ops, "metal-c");
#else
    harness_skip("the Metal kernels as C are not built (NEEDLE_METAL build)");
#endif
}

static void test_compiled_backends(void) {
    size_t n = 0, ran = 0, without_device = 0;
    const needle_backend_impl *const *table = backend_table(&n);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(table[i]->name, "cpu")) continue;
        if (!table[i]->probe() || table[i]->device_count() <= 0) {
            printf("  %s: compiled in, but no device on this machine\n", table[i]->name);
            without_device++;
            continue;
        }
        CHECK_MSG(table[i]->ops->attention3 && table[i]->ops->monarch_mlp,
                  "%s has no Needle 3 ops", table[i]->name);
        if (table[i]->ops->attention3 && table[i]->ops->monarch_mlp)
            run_impl(table[i]->ops, table[i]->name);
        ran++;
    }
    if (!ran) harness_skip(without_device ? "GPU backend compiled in, no device here"
                                          : "no GPU backend compiled in");
}

int main(void) {
    RUN(test_metal_kernels_as_c);
    RUN(test_compiled_backends);
    return test_summary();
}
