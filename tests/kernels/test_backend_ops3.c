/* The Needle 3 backend operations (backend.h: attention3, monarch_mlp) of every other
 * implementation against the CPU's (backend/cpu/spanned_attention.c, monarch_mlp.c), on the v3 fixtures' weights.
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

#include "backend_pair.h"
#include "harness.h"
#include "needle.h"

#define TOL 1e-4
#define TOL_LOGITS 1e-3

#ifdef NEEDLE_TEST_METAL_C
extern const needle_backend_ops nk_backend_ops; /* metal_ops.c over metal_emu.c */
#endif

static int open_pair(const needle_model *m, const needle_backend_ops *ops, const char *name,
                     int32_t window, uint32_t sinks, pair *p) {
    needle_session_params sp = needle_session_default_params();
    sp.kv_window = window;
    sp.n_sinks = sinks;
    sp.n_ctx = 96;
    return bp_open(m, ops, name, &sp, TOL, p);
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
    model_session *r = p.ref, *d = p.dut;
    const model_weights *w = &m->w;
    /* the buffers both sessions hold (a CPU level may take longer chunks: cpu_kernels) */
    const uint32_t C = r->bk.chunk < d->bk.chunk ? r->bk.chunk : d->bk.chunk;
    const uint32_t qk = w->qk_dim, vd = w->v_dim;
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
            float *q = bp_rand_vec((size_t)cn * Wq, 2.0f), *kk = bp_rand_vec((size_t)cn * Wk, 2.0f);
            float *v = bp_rand_vec((size_t)cn * Wv, 2.0f), *g = bp_rand_vec((size_t)cn * Wg, 3.0f);
            bp_put(&p, r->q, d->q, q, (size_t)cn * Wq);
            bp_put(&p, r->k, d->k, kk, (size_t)cn * Wk);
            bp_put(&p, r->v, d->v, v, (size_t)cn * Wv);
            bp_put(&p, r->gate, d->gate, g, (size_t)cn * Wg);
            r->ops->attention3(&r->bk, li, p0, cn, cs, r->q, r->k, r->v, r->gate, r->o);
            d->ops->attention3(&d->bk, li, p0, cn, cs, d->q, d->k, d->v, d->gate, d->o);
            snprintf(what, sizeof what, "attention3 (layer %u %s, p0 %u, n %u)", li,
                     w->layers3[li].window ? "local" : "global", p0, cn);
            bp_expect_close(&p, r->o, d->o, (size_t)cn * w->layers[li].out_proj.cols_pad, what);
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
            bp_expect_close(&p, (float *)r->bk.k_cache + ar, (float *)d->bk.k_cache + ad,
                         w->kv_dim, what);
            snprintf(what, sizeof what, "attention3 (V cache, layer %u position %u)", li, t);
            bp_expect_close(&p, (float *)r->bk.v_cache + ar, (float *)d->bk.v_cache + ad,
                         w->kv_dim, what);
        }
    free(cs);
    bp_close(&p);
}

static void test_monarch_on(const needle_model *m, const needle_backend_ops *ops,
                            const char *name) {
    pair p;
    if (!open_pair(m, ops, name, -1, 0, &p)) return;
    model_session *r = p.ref, *d = p.dut;
    const uint32_t D = m->w.d;
    char what[96];
    const uint32_t counts[] = {5, 1};
    for (size_t c = 0; c < 2; c++) {
        float *h = bp_rand_vec((size_t)counts[c] * D, 2.0f);
        bp_put(&p, r->h, d->h, h, (size_t)counts[c] * D);
        for (uint32_t li = 0; li < m->w.n_layers; li++) {
            r->ops->monarch_mlp(&r->bk, li, counts[c], r->h, r->attn);
            d->ops->monarch_mlp(&d->bk, li, counts[c], d->h, d->attn);
            snprintf(what, sizeof what, "monarch_mlp (layer %u, n %u)", li, counts[c]);
            bp_expect_close(&p, r->attn, d->attn, (size_t)counts[c] * D, what);
        }
        free(h);
    }
    bp_close(&p);
}

static void test_forward_on(const needle_model *m, const needle_backend_ops *ops,
                            const char *name) {
    pair p;
    if (!open_pair(m, ops, name, -1, 0, &p)) return;
    model_session *r = p.ref, *d = p.dut;
    enum { N_TOK = 40 };
    const uint32_t V = m->w.vocab, cols = m->w.out_vocab;
    int32_t toks[N_TOK];
    for (uint32_t i = 0; i < N_TOK; i++) toks[i] = (int32_t)((i * 7919u + 13u) % cols);
    float *lr = malloc((size_t)N_TOK * V * sizeof *lr), *ld = malloc((size_t)N_TOK * V * sizeof *ld);
    CHECK_EQ_INT(session_eval(r, toks, N_TOK, lr, (size_t)N_TOK * V, NULL), NEEDLE_OK);
    CHECK_EQ_INT(session_eval(d, toks, N_TOK, ld, (size_t)N_TOK * V, NULL), NEEDLE_OK);
    const double prefill = bp_worst_rel(lr, ld, N_TOK, V, cols);
    CHECK_MSG(prefill <= TOL_LOGITS, "%s prefill: worst relative logit error %.3g", name,
              prefill);
    bp_expect_same_greedy(&p, 12);
    /* one-token steps from the reset state: the conv-tap and engram rings restart */
    session_reset(d);
    for (uint32_t t = 0; t < N_TOK; t++)
        CHECK_EQ_INT(session_eval(d, toks + t, 1, ld + (size_t)t * V, V, NULL), NEEDLE_OK);
    const double steps = bp_worst_rel(lr, ld, N_TOK, V, cols);
    CHECK_MSG(steps <= TOL_LOGITS, "%s steps: worst relative logit error %.3g", name, steps);
    printf("  %s: forward vs cpu, worst relative logit error prefill %.2e, steps %.2e\n", name,
           prefill, steps);
    free(lr);
    free(ld);
    bp_close(&p);
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
        needle_model *m = bp_model_open(models[k].file, models[k].depth, ops);
        if (!m) continue;
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
        bp_model_close(m, ops);
    }
}

static void test_metal_kernels_as_c(void) {
#ifdef NEEDLE_TEST_METAL_C
    run_impl(&nk_backend_ops, "metal-c");
#else
    harness_skip("the Metal kernels as C are not built (NEEDLE_METAL build)");
#endif
}

static int has_v3_ops(const needle_backend_impl *impl) {
    CHECK_MSG(impl->ops->attention3 && impl->ops->monarch_mlp, "%s has no Needle 3 ops",
              impl->name);
    return impl->ops->attention3 && impl->ops->monarch_mlp;
}

static void test_compiled_backends(void) { bp_run_compiled_backends(run_impl, has_v3_ops); }

int main(void) {
    bp_seed(0x9E3779B97F4A7C15ULL);
    RUN(test_metal_kernels_as_c);
    RUN(test_compiled_backends);
    return test_summary();
}
