/* The CPU's Monarch MLP of the Needle 3 layer (backend.h: monarch_mlp), float32 over
 * host memory, following the official forward (docs/spec/NEEDLE3.md §2): one item per
 * token over the session's pool, each computed by one thread with the same arithmetic
 * whichever it is; the row combinations are the session level's monarch kernels. */
#include "backend/cpu/ops.h"
#include "backend/cpu/runtime.h"

/* ---- the Monarch MLP ------------------------------------------------------------------ */

/* z := vec(a^T reshape(z, ba, bb) b) (row-major), a [ba][ba], b [bb][bb]; tmp [ba*bb].
 * Whole rows are combined (contiguous vector work); each output sums its terms in index
 * order in the plain kernel. */
static void kron_apply(const monarch_kernels *vk, float *z, const float *a, uint32_t ba,
                       const float *b, uint32_t bb, float *tmp) {
    for (uint32_t i = 0; i < ba; i++)
        vk->combine(tmp + (size_t)i * bb, z + (size_t)i * bb, 1, b, bb, bb);
    for (uint32_t k = 0; k < ba; k++) vk->combine(z + (size_t)k * bb, a + k, ba, tmp, ba, bb);
}

/* dst[i] = src[perm[i]] */
static void gather(float *dst, const float *src, const uint32_t *perm, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) dst[i] = src[perm[i]];
}

typedef struct monarch_args {
    uint32_t li;
    const float *h_all;
    float *out_all;
} monarch_args;

static void monarch_token(backend_ctx *s, const void *ctx, uint32_t t, int thread) {
    const monarch_args *x = ctx;
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[x->li];
    const layer3_weights *l3 = &m->layers3[x->li];
    const monarch_kernels *vk = cs_of(s)->level.monarch;
    const uint32_t N = m->hada_n, d = m->d, ba = m->hada_ba, bb = m->hada_bb;
    float *z = cpu_thread_tmp(s, thread), *y = z + N, *tmp = y + N, *sm = tmp + N;
    const float *h = x->h_all + (size_t)t * d;
    float *out = x->out_all + (size_t)t * d;
    /* cond = 1 + softmax(h cond_v) cond_u, the softmax over the rank axis */
    vk->combine(sm, h, 1, l3->cond_v, d, MODEL3_COND_RANK);
    const float sum = nm_softmax_exp(sm, MODEL3_COND_RANK);
    for (uint32_t r = 0; r < MODEL3_COND_RANK; r++) sm[r] /= sum;

    for (uint32_t i = 0; i < N; i++) z[i] = i < d ? l->d1[i] * h[i] : 0.0f;
    kron_apply(vk, z, l3->w1a, ba, l3->w1b, bb, tmp);
    gather(y, z, m->perm1, N);
    vk->combine(tmp, sm, 1, l3->cond_u, MODEL3_COND_RANK, N);
    for (uint32_t i = 0; i < N; i++) {
        const float pre = l->d2[i] * (1.0f + tmp[i]) * y[i] + l3->b2[i];
        y[i] = pre * nm_sigmoid(pre);
    }
    kron_apply(vk, y, l3->w2a, ba, l3->w2b, bb, tmp);
    gather(z, y, m->perm2, N);
    for (uint32_t i = 0; i < N; i++) z[i] *= l->d3[i];
    kron_apply(vk, z, l3->w3a, ba, l3->w3b, bb, tmp);
    for (uint32_t i = 0; i < d; i++) out[i] = l3->d4[i] * z[i];
}

void cpu_monarch_mlp(backend_ctx *s, uint32_t li, uint32_t n, const float *h_all,
                     float *out_all) {
    const monarch_args a = {li, h_all, out_all};
    cpu_par_for(s, n, monarch_token, &a);
}
