/* Every backend operation (backend/backend.h) against the CPU reference.
 *
 * Implementations under test: every compiled-in backend whose probe finds a device here
 * (a backend without a device is skipped with a message), plus the Metal kernels compiled
 * as C through src/backend/metal/metal_compat.h ("metal-c", always), plus the CPU against
 * itself (must be exact; it checks the harness). For each fixture model two sessions are
 * made, one on the CPU ops and one on the ops under test; every op gets the same random
 * inputs in both and the outputs are compared:
 *
 *   |out - ref| <= TOL * max(1, max|ref|)  per op call, with TOL = 1e-4 (float32 with a
 *   different summation order; the ops are at most a few thousand terms deep), except the
 *   int8 KV cache (TOL_INT8 = 2e-2: a rounding tie of the quantizer may flip one level).
 *
 * Then the whole forward pass: prefill and one-token logits within 1e-3 x max|logit| (the
 * parity tolerance) and identical greedy tokens. And every implementation's forward pass
 * against the plain reference forward (reference_forward.c, spec §3 written top to
 * bottom), with full attention and with a window and sinks, within the same 1e-3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"
#include "backend_pair.h"
#include "reference_forward.h"

#define TOL 1e-4
#define TOL_INT8 2e-2
#define TOL_LOGITS 1e-3

#ifdef NEEDLE_TEST_METAL_C
extern const needle_backend_ops nk_backend_ops; /* metal_ops.c over metal_emu.c */
#endif

static void test_ops_on(const needle_model *m, const needle_backend_ops *ops, const char *name,
                        int32_t kv_type, int32_t window, uint32_t sinks) {
    needle_session_params sp = needle_session_default_params();
    sp.kv_type = kv_type;
    sp.kv_window = window;
    sp.n_sinks = sinks;
    sp.n_ctx = 96;
    pair p;
    if (!bp_open(m, ops, name, &sp, kv_type == NEEDLE_KV_INT8 ? TOL_INT8 : TOL, &p)) return;
    model_session *r = p.ref, *d = p.dut;
    const uint32_t D = m->w.d, nl = m->w.n_lanes, nd = nl * D, mix_ld = 2 * nl + nl * nl;
    const uint32_t A = m->w.attn_dim, kvd = m->w.kv_dim, hd = m->w.head_dim;
    /* the buffers both sessions hold (a CPU level may take longer chunks: cpu_kernels) */
    const uint32_t C = r->bk.chunk < d->bk.chunk ? r->bk.chunk : d->bk.chunk;
    const uint32_t n = 5; /* tokens per op call */
    char what[96];

    /* embed */
    int32_t toks[5] = {1, 7, (int32_t)m->w.vocab - 1, 42, 3};
    r->ops->embed(&r->bk, toks, n, r->lanes);
    d->ops->embed(&d->bk, toks, n, d->lanes);
    bp_expect_close(&p, r->lanes, d->lanes, (size_t)n * nd, "embed");

    /* lane_norm on random lanes */
    float *lanes = bp_rand_vec((size_t)C * nd, 3.0f);
    bp_put(&p, r->lanes, d->lanes, lanes, (size_t)C * nd);
    r->ops->lane_norm(&r->bk, r->lanes, n, r->nx);
    d->ops->lane_norm(&d->bk, d->lanes, n, d->nx);
    bp_expect_close(&p, r->nx, d->nx, (size_t)n * m->w.phi_pre.cols_pad, "lane_norm");

    /* matmul: a batch of three products over the same activations, and the wide tied one */
    const uint32_t li = m->w.n_layers - 1;
    {
        const cq_job jr[] = {{&m->w.phi_pre, li * nl, nl, r->mix, mix_ld},
                             {&m->w.phi_post, li * nl, nl, r->mix + nl, mix_ld},
                             {&m->w.phi_res, li * nl * nl, nl * nl, r->mix + 2 * nl, mix_ld}};
        const cq_job jd[] = {{&m->w.phi_pre, li * nl, nl, d->mix, mix_ld},
                             {&m->w.phi_post, li * nl, nl, d->mix + nl, mix_ld},
                             {&m->w.phi_res, li * nl * nl, nl * nl, d->mix + 2 * nl, mix_ld}};
        r->ops->matmul(&r->bk, r->nx, m->w.phi_pre.cols_pad, n, jr, 3);
        d->ops->matmul(&d->bk, d->nx, m->w.phi_pre.cols_pad, n, jd, 3);
        bp_expect_close(&p, r->mix, d->mix, (size_t)n * mix_ld, "matmul (mHC batch)");
        const layer_weights *l = &m->w.layers[0];
        float *hr = bp_rand_vec((size_t)C * l->q_proj.cols_pad, 1.0f);
        bp_put(&p, r->hr, d->hr, hr, (size_t)C * l->q_proj.cols_pad);
        const cq_job qr[] = {{&l->q_proj, 0, A, r->q, A}, {&l->k_proj, 0, kvd, r->k, kvd},
                             {&l->v_proj, 0, kvd, r->v, kvd}, {&l->gate_proj, 0, A, r->gate, A}};
        const cq_job qd[] = {{&l->q_proj, 0, A, d->q, A}, {&l->k_proj, 0, kvd, d->k, kvd},
                             {&l->v_proj, 0, kvd, d->v, kvd}, {&l->gate_proj, 0, A, d->gate, A}};
        r->ops->matmul(&r->bk, r->hr, l->q_proj.cols_pad, n, qr, 4);
        d->ops->matmul(&d->bk, d->hr, l->q_proj.cols_pad, n, qd, 4);
        bp_expect_close(&p, r->q, d->q, (size_t)n * A, "matmul (q)");
        bp_expect_close(&p, r->k, d->k, (size_t)n * kvd, "matmul (k)");
        bp_expect_close(&p, r->v, d->v, (size_t)n * kvd, "matmul (v)");
        bp_expect_close(&p, r->gate, d->gate, (size_t)n * A, "matmul (gate)");
        free(hr);
    }

    /* engram gather and conv, every site, two chunks so the ring wraps */
    if (m->w.n_sites) {
        uint32_t *slots = malloc((size_t)n * m->w.n_tables * sizeof *slots);
        for (uint32_t i = 0; i < n * m->w.n_tables; i++)
            slots[i] = i % 3 == 1 ? ENGRAM_MASKED : (uint32_t)(i * 2654435761u) % m->w.slots;
        for (uint32_t site = 0; site < m->w.n_sites; site++) {
            const engram_site *es = &m->w.sites[site];
            r->ops->engram_gather(&r->bk, es, slots, n, r->eng_er);
            d->ops->engram_gather(&d->bk, es, slots, n, d->eng_er);
            snprintf(what, sizeof what, "engram_gather (site %u)", site);
            bp_expect_close(&p, r->eng_er, d->eng_er, (size_t)n * es->key_proj.cols_pad, what);
            for (uint32_t p0 = 0; p0 < 3 * n; p0 += n) {
                float *vhat = bp_rand_vec((size_t)C * D, 2.0f);
                bp_put(&p, r->eng_vhat, d->eng_vhat, vhat, (size_t)C * D);
                float *rr = r->ev_hist + (size_t)site * r->bk.ev_ring * D;
                float *dr = d->ev_hist + (size_t)site * d->bk.ev_ring * D;
                r->ops->engram_conv(&r->bk, es, rr, r->eng_vhat, p0, n, r->eng_v);
                d->ops->engram_conv(&d->bk, es, dr, d->eng_vhat, p0, n, d->eng_v);
                snprintf(what, sizeof what, "engram_conv (site %u, p0 %u)", site, p0);
                bp_expect_close(&p, r->eng_v, d->eng_v, (size_t)n * D, what);
                bp_expect_close(&p, rr, dr, (size_t)r->bk.ev_ring * D, what);
                free(vhat);
            }
        }
        free(slots);
    }

    /* lane_read with and without an engram site */
    float *mix = bp_rand_vec((size_t)C * mix_ld, 2.0f);
    float *ek = bp_rand_vec((size_t)C * D, 1.0f), *ev = bp_rand_vec((size_t)C * D, 1.0f);
    bp_put(&p, r->mix, d->mix, mix, (size_t)C * mix_ld);
    bp_put(&p, r->eng_k, d->eng_k, ek, (size_t)C * D);
    bp_put(&p, r->eng_v, d->eng_v, ev, (size_t)C * D);
    for (int with_site = 0; with_site < 2; with_site++) {
        for (uint32_t layer = 0; layer < 2 && layer < m->w.n_layers; layer++) {
            const uint32_t h_ld = m->w.layers[layer].q_proj.cols_pad;
            r->ops->lane_read(&r->bk, layer, n, r->lanes, r->mix, with_site ? r->eng_k : NULL,
                              with_site ? r->eng_v : NULL, r->u, r->bx, r->h, r->hr);
            d->ops->lane_read(&d->bk, layer, n, d->lanes, d->mix, with_site ? d->eng_k : NULL,
                              with_site ? d->eng_v : NULL, d->u, d->bx, d->h, d->hr);
            snprintf(what, sizeof what, "lane_read (layer %u, site %d)", layer, with_site);
            bp_expect_close(&p, r->u, d->u, (size_t)n * D, what);
            bp_expect_close(&p, r->bx, d->bx, (size_t)n * D, what);
            bp_expect_close(&p, r->hr, d->hr, (size_t)n * h_ld, what);
        }
    }

    /* attention: chunks of 5, 1, 7 and 1 tokens so the window and sinks come into play */
    {
        const uint32_t steps[] = {5, 1, 7, 1, 12, 1};
        uint32_t p0 = 0;
        float *cs = malloc((size_t)C * hd * sizeof *cs);
        for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
            const uint32_t cn = steps[k];
            for (uint32_t i = 0; i < cn; i++)
                for (uint32_t j = 0; j < hd / 2; j++) {
                    float ang = (float)(p0 + i) * m->rope_freq[j];
                    cs[(size_t)i * hd + j] = cosf(ang);
                    cs[(size_t)i * hd + hd / 2 + j] = sinf(ang);
                }
            float *q = bp_rand_vec((size_t)C * A, 2.0f), *kk = bp_rand_vec((size_t)C * kvd, 2.0f);
            float *v = bp_rand_vec((size_t)C * kvd, 2.0f), *g = bp_rand_vec((size_t)C * A, 3.0f);
            bp_put(&p, r->q, d->q, q, (size_t)C * A);
            bp_put(&p, r->k, d->k, kk, (size_t)C * kvd);
            bp_put(&p, r->v, d->v, v, (size_t)C * kvd);
            bp_put(&p, r->gate, d->gate, g, (size_t)C * A);
            for (uint32_t layer = 0; layer < m->w.n_layers; layer += m->w.n_layers - 1) {
                r->ops->attention(&r->bk, layer, p0, cn, cs, r->q, r->k, r->v, r->gate, r->o);
                d->ops->attention(&d->bk, layer, p0, cn, cs, d->q, d->k, d->v, d->gate, d->o);
                snprintf(what, sizeof what, "attention (layer %u, p0 %u, n %u)", layer, p0, cn);
                bp_expect_close(&p, r->o, d->o, (size_t)cn * m->w.layers[layer].out_proj.cols_pad,
                             what);
                bp_put(&p, r->q, d->q, q, (size_t)C * A); /* the op normalises q and k in place */
                bp_put(&p, r->k, d->k, kk, (size_t)C * kvd);
                if (m->w.n_layers == 1) break;
            }
            free(q); free(kk); free(v); free(g);
            p0 += cn;
        }
        free(cs);
    }

    /* attn_residual, hadamard_mlp, lane_write */
    {
        float *a = bp_rand_vec((size_t)C * D, 2.0f), *bx = bp_rand_vec((size_t)C * D, 2.0f);
        float *u = bp_rand_vec((size_t)C * D, 2.0f);
        bp_put(&p, r->attn, d->attn, a, (size_t)C * D);
        bp_put(&p, r->bx, d->bx, bx, (size_t)C * D);
        bp_put(&p, r->u, d->u, u, (size_t)C * D);
        r->ops->attn_residual(&r->bk, li, n, r->attn, r->bx, r->x2, r->h);
        d->ops->attn_residual(&d->bk, li, n, d->attn, d->bx, d->x2, d->h);
        bp_expect_close(&p, r->attn, d->attn, (size_t)n * D, "attn_residual (attn)");
        bp_expect_close(&p, r->x2, d->x2, (size_t)n * D, "attn_residual (x)");
        bp_expect_close(&p, r->h, d->h, (size_t)n * D, "attn_residual (h)");
        r->ops->hadamard_mlp(&r->bk, li, n, r->h, r->attn);
        d->ops->hadamard_mlp(&d->bk, li, n, d->h, d->attn);
        bp_expect_close(&p, r->attn, d->attn, (size_t)n * D, "hadamard_mlp");
        r->ops->lane_write(&r->bk, li, n, r->mix, r->x2, r->attn, r->u, r->lanes);
        d->ops->lane_write(&d->bk, li, n, d->mix, d->x2, d->attn, d->u, d->lanes);
        bp_expect_close(&p, r->attn, d->attn, (size_t)n * D, "lane_write (y)");
        bp_expect_close(&p, r->lanes, d->lanes, (size_t)n * nd, "lane_write (lanes)");
        free(a); free(bx); free(u);
    }

    /* logits and argmax */
    {
        float *lr = malloc((size_t)n * m->w.vocab * sizeof *lr), *ld = malloc((size_t)n * m->w.vocab * sizeof *ld);
        int32_t ar[5], ad[5];
        r->ops->logits(&r->bk, r->lanes, n, lr, ar);
        d->ops->logits(&d->bk, d->lanes, n, ld, ad);
        double mx = 1.0, err = 0.0;
        for (size_t i = 0; i < (size_t)n * m->w.vocab; i++) {
            mx = fmax(mx, fabs(lr[i]));
            err = fmax(err, fabs((double)lr[i] - ld[i]));
        }
        CHECK_MSG(err <= TOL * mx, "%s logits: worst |diff| %.3g (max %.3g)", name, err, mx);
        for (uint32_t i = 0; i < n; i++) {
            /* the reference's argmax is exact; the device's must name a maximal logit */
            CHECK_MSG(ad[i] >= 0 && (uint32_t)ad[i] < m->w.vocab &&
                      ld[(size_t)i * m->w.vocab + ad[i]] >= ld[(size_t)i * m->w.vocab + ar[i]],
                      "%s argmax %u: %d vs %d", name, i, ad[i], ar[i]);
        }
        free(lr);
        free(ld);
    }
    free(lanes); free(mix); free(ek); free(ev);
    bp_close(&p);
}

/* The whole forward pass on both, by prefill and by one-token steps, plus greedy tokens. */
static void test_forward_on(const needle_model *m, const needle_backend_ops *ops,
                            const char *name) {
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 80;
    pair p;
    if (!bp_open(m, ops, name, &sp, TOL, &p)) return;
    const uint32_t n_tok = 40, V = m->w.vocab;
    int32_t toks[40];
    for (uint32_t i = 0; i < n_tok; i++) toks[i] = (int32_t)((i * 7919u + 13u) % V);
    toks[0] = NEEDLE_TOKEN_BOS;
    float *lr = malloc((size_t)n_tok * V * sizeof *lr), *ld = malloc((size_t)n_tok * V * sizeof *ld);
    CHECK_EQ_INT(session_eval(p.ref, toks, n_tok, lr, (size_t)n_tok * V, NULL), NEEDLE_OK);
    CHECK_EQ_INT(session_eval(p.dut, toks, n_tok, ld, (size_t)n_tok * V, NULL), NEEDLE_OK);
    const double worst = bp_worst_rel(lr, ld, n_tok, V, V);
    CHECK_MSG(worst <= TOL_LOGITS, "%s forward: worst relative logit error %.3g", name, worst);
    bp_expect_same_greedy(&p, 16); /* greedy continuation, one token at a time */
    printf("  %s: forward worst relative logit error %.2e\n", name, worst);
    free(lr);
    free(ld);
    bp_close(&p);
}

/* The session's prefill logits against the reference forward (f32 cache). */
static void test_reference_on(const needle_model *m, const needle_backend_ops *ops,
                              const char *name, int32_t window, uint32_t sinks) {
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 80;
    sp.kv_window = window;
    sp.n_sinks = sinks;
    model_session *s = NULL;
    CHECK_EQ_INT(session_create_with_ops(m, &sp, ops, &s), NEEDLE_OK);
    if (!s) return;
    enum { N_TOK = 40 };
    const uint32_t V = m->w.vocab;
    int32_t toks[N_TOK];
    for (uint32_t i = 0; i < N_TOK; i++) toks[i] = (int32_t)((i * 7919u + 13u) % V);
    toks[0] = NEEDLE_TOKEN_BOS;
    float *got = malloc((size_t)N_TOK * V * sizeof *got);
    float *want = malloc((size_t)N_TOK * V * sizeof *want);
    CHECK_EQ_INT(session_eval(s, toks, N_TOK, got, (size_t)N_TOK * V, NULL), NEEDLE_OK);
    CHECK_EQ_INT(reference_forward(&m->w, m->rope_freq, toks, N_TOK, (uint32_t)window, sinks,
                                   want), 0);
    const double worst = bp_worst_rel(want, got, N_TOK, V, V);
    CHECK_MSG(worst <= TOL_LOGITS, "%s vs the reference forward: worst relative logit error "
              "%.3g", name, worst);
    printf("  %s: vs the reference forward %.2e\n", name, worst);
    free(got);
    free(want);
    session_free(s);
}

static void run_impl(const needle_backend_ops *ops, const char *name) {
    const char *models[] = {"tiny_mixed.cact", "tinyb_mixed.cact", "tinyb_ternary.cact",
                            "full_mixed.cact"};
    /* NEEDLE_PARITY_SKIP=full_ (set under emulators, as for test_parity) leaves out the
     * full-size model: minutes under qemu, checked by the native and CUDA builds */
    const char *skip = getenv("NEEDLE_PARITY_SKIP");
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        if (skip && *skip && strncmp(models[k], skip, strlen(skip)) == 0) {
            printf("  %s/%s: skipped (NEEDLE_PARITY_SKIP=%s)\n", name, models[k], skip);
            continue;
        }
        needle_model *m = bp_model_open(models[k], 0, ops);
        if (!m) continue;
        char label[128];
        const int32_t kv[] = {NEEDLE_KV_F32, NEEDLE_KV_F16, NEEDLE_KV_INT8};
        for (size_t t = 0; t < 3; t++) {
            /* no window; a window of 6 with 2 sinks */
            snprintf(label, sizeof label, "%s/%s kv%zu full", name, models[k], t);
            test_ops_on(m, ops, label, kv[t], 0, 0);
            snprintf(label, sizeof label, "%s/%s kv%zu window", name, models[k], t);
            test_ops_on(m, ops, label, kv[t], 6, 2);
        }
        snprintf(label, sizeof label, "%s/%s", name, models[k]);
        test_forward_on(m, ops, label);
        snprintf(label, sizeof label, "%s/%s full", name, models[k]);
        test_reference_on(m, ops, label, 0, 0);
        snprintf(label, sizeof label, "%s/%s window 6, 2 sinks", name, models[k]);
        test_reference_on(m, ops, label, 6, 2);
        bp_model_close(m, ops);
    }
}

static void test_cpu_against_itself(void) { run_impl(&cpu_backend_ops, "cpu"); }

static void test_compiled_backends(void) { bp_run_compiled_backends(run_impl, NULL); }

static void test_metal_kernels_as_c(void) {
#ifdef NEEDLE_TEST_METAL_C
    run_impl(&nk_backend_ops, "metal-c");
#else
    harness_skip("the Metal kernels as C are not built (NEEDLE_METAL build)");
#endif
}

int main(void) {
    bp_seed(0x1234567887654321ULL);
    RUN(test_cpu_against_itself);
    RUN(test_compiled_backends);
    RUN(test_metal_kernels_as_c);
    return test_summary();
}
