/* The CPU's Monarch MLP of the Needle 3 layer (backend.h: monarch_mlp), float32 over
 * host memory, following the official forward (docs/spec/NEEDLE3.md §2): one item per
 * tile of CPU_MONARCH_TILE tokens over the session's pool, each token computed by one
 * thread with the same arithmetic whichever it is and whatever tile holds it (the
 * kernels' combine_rows computes every row as combine would); the row combinations are
 * the session level's monarch kernels. */
#include "backend/cpu/ops.h"
#include "backend/cpu/runtime.h"
#include "kernels/cpu/lane_math.h"

/* ---- the Monarch MLP ------------------------------------------------------------------ */

/* z := vec(a^T reshape(z, ba, bb) b) (row-major), a [ba][ba], b [bb][bb]; tmp [ba*bb]:
 * two small matrix products of whole rows (contiguous vector work); each output sums its
 * terms in index order in the plain kernel. */
static void kron_apply(const monarch_kernels *vk, float *z, const float *a, uint32_t ba,
                       const float *b, uint32_t bb, float *tmp) {
    vk->combine_rows(tmp, bb, z, bb, 1, b, bb, bb, ba);  /* tmp row i = z row i times b */
    vk->combine_rows(z, bb, a, 1, ba, tmp, ba, bb, ba); /* z row k = (column k of a) tmp */
}

/* dst[i] = src[perm[i]] */
static void gather(float *dst, const float *src, const uint32_t *perm, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) dst[i] = src[perm[i]];
}

/* The gate in place: y[i] = v * sigmoid(v), v = d2[i] * (1 + c[i]) * y[i] + b2[i], with
 * sigmoid(v) = 1 / (1 + nm_exp_poly(-v)) (within about an ulp of expf). lane_math.h's
 * 4-wide exp gives the scalar's bits, so every kernel level computes the same values;
 * it is several times cheaper than a libm expf call per element. */
static void monarch_gate(float *y, const float *c, const float *d2, const float *b2,
                         uint32_t n) {
    uint32_t i = 0;
#ifdef LANE_MATH_SIMD
    const lv4 one = LV_SET(1.0f);
    for (; i + 4 <= n; i += 4) {
        const lv4 v = LV_ADD(LV_MUL(LV_MUL(LV_LOAD(d2 + i), LV_ADD(one, LV_LOAD(c + i))),
                                    LV_LOAD(y + i)),
                             LV_LOAD(b2 + i));
        LV_STORE(y + i, LV_MUL(v, LV_DIV(one, LV_ADD(one, lv_exp(LV_NEG(v))))));
    }
#endif
    for (; i < n; i++) {
        const float v = d2[i] * (1.0f + c[i]) * y[i] + b2[i];
        y[i] = v * (1.0f / (1.0f + nm_exp_poly(-v)));
    }
}

typedef struct monarch_args {
    uint32_t li, n, tile; /* tile: tokens per item, at most CPU_MONARCH_TILE */
    const float *h_all;
    float *out_all;
} monarch_args;

/* One token's MLP from h to out, given its normalised condition weights sm (rank). */
static void monarch_one(const model_weights *m, uint32_t li, const monarch_kernels *vk,
                        const float *h, const float *sm, float *out, float *z) {
    const layer_weights *l = &m->layers[li];
    const layer3_weights *l3 = &m->layers3[li];
    const uint32_t N = m->hada_n, d = m->d, ba = m->hada_ba, bb = m->hada_bb;
    float *y = z + N, *tmp = y + N;
    for (uint32_t i = 0; i < N; i++) z[i] = i < d ? l->d1[i] * h[i] : 0.0f;
    kron_apply(vk, z, l3->w1a, ba, l3->w1b, bb, tmp);
    gather(y, z, m->perm1, N);
    vk->combine(tmp, sm, 1, l3->cond_u, MODEL3_COND_RANK, N);
    monarch_gate(y, tmp, l->d2, l3->b2, N);
    kron_apply(vk, y, l3->w2a, ba, l3->w2b, bb, tmp);
    gather(z, y, m->perm2, N);
    for (uint32_t i = 0; i < N; i++) z[i] *= l->d3[i];
    kron_apply(vk, z, l3->w3a, ba, l3->w3b, bb, tmp);
    for (uint32_t i = 0; i < d; i++) out[i] = l3->d4[i] * z[i];
}

/* Tokens [item * tile, ...): their conditions cond = 1 + softmax(h cond_v)
 * cond_u (the softmax over the rank axis) start with the tile's h cond_v products side by
 * side (each a 768-term chain, independent across tokens), then each token's MLP. */
static void monarch_tile(backend_ctx *s, const void *ctx, uint32_t item, int thread) {
    const monarch_args *x = ctx;
    const model_weights *m = s->m;
    const layer3_weights *l3 = &m->layers3[x->li];
    const monarch_kernels *vk = cs_of(s)->level.monarch;
    const uint32_t N = m->hada_n, d = m->d, R = MODEL3_COND_RANK;
    const uint32_t t0 = item * x->tile, count = x->n - t0 < x->tile ? x->n - t0 : x->tile;
    float *z = cpu_thread_tmp(s, thread), *sm = z + 3 * (size_t)N;
    const float *h = x->h_all + (size_t)t0 * d;
    vk->combine_rows(sm, R, h, d, 1, l3->cond_v, d, R, count);
    for (uint32_t t = 0; t < count; t++) {
        float *smt = sm + (size_t)t * R;
        const float sum = nm_softmax_exp(smt, R);
        for (uint32_t r = 0; r < R; r++) smt[r] /= sum;
        monarch_one(m, x->li, vk, h + (size_t)t * d, smt, x->out_all + (size_t)(t0 + t) * d, z);
    }
}

void cpu_monarch_mlp(backend_ctx *s, uint32_t li, uint32_t n, const float *h_all,
                     float *out_all) {
    /* whole tiles where there are tokens enough for every thread, else smaller ones so a
     * short chunk still spreads over the pool */
    uint32_t tile = n / (uint32_t)cs_of(s)->n_threads;
    tile = tile < 1 ? 1 : tile > CPU_MONARCH_TILE ? CPU_MONARCH_TILE : tile;
    const monarch_args a = {li, n, tile, h_all, out_all};
    cpu_par_for(s, (n + tile - 1) / tile, monarch_tile, &a);
}
