/* The CPU's attention of the Needle 3 layer (backend.h: attention3), float32 over host
 * memory, following the official forward (docs/spec/NEEDLE3.md §2).
 *
 * Everything else a Needle 3 layer does (lanes, engram, the CQ products, the residual
 * norms, logits) goes through the ops Needle 2 uses (ops.c), the MLP through
 * monarch_mlp.c. The work is shared among the session's pool threads as in ops.c: one
 * item per K/V head (or range of them). Each item is computed by one
 * thread with the same arithmetic whichever it is, so results do not depend on the
 * thread count. The vector work goes through the kernels of the session's level (the
 * attention kernel of kernels/cpu/attn.h with V heads of v_dim values; the row
 * combinations of kernels/cpu/monarch.h).
 *
 * The KV cache is in the session's kv_type (f32, f16, or int8 with a float scale per
 * KV_SCALE_GROUP values of a row, as Needle 2's): K rows hold KV*qk values and V rows
 * KV*v of the kv_dim-wide cache rows, a layer's at s->kv_layers (a local layer's ring
 * holds exactly its window). Within a K/V head attention stays in token order:
 * token i's conv history and K/V are stored before token i reads them, and a later
 * token's store (which may overwrite a ring slot) after. */
#include <math.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/runtime.h"
#include "util/fp16.h"

/* ---- the KV cache ----------------------------------------------------------------------- */

/* W·A8 (official maybe_quant_query, and maybe_quant_kv at kv_bits 8, which session.c
 * requires): each of `heads` rows of `hd` values becomes s·q, its int8 quantization, as
 * the QAT model fake-quantizes them. */
static void a8_fake_quant_heads(float *x, uint32_t heads, uint32_t hd) {
    int16_t q[A8_MAX_COLS]; /* session.c: head dims <= A8_MAX_COLS under W·A8 */
    for (uint32_t h = 0; h < heads; h++) {
        float *row = x + (size_t)h * hd;
        const float scale = a8_quantize(row, hd, hd, q);
        for (uint32_t k = 0; k < hd; k++) row[k] = scale * (float)q[k];
    }
}

/* ---- attention ------------------------------------------------------------------------ */

/* out[c] = sum_{j < taps, j <= t, j < local window} taps[j][c] * raw(t - j)[c], summed in
 * j order as the reference does; raw rows come from the ring `hist` (row stride `ld`),
 * tap rows are `tap_ld` apart; w columns. */
static void conv_taps(const monarch_kernels *vk, const float *taps, size_t tap_ld, uint32_t n_taps,
                      uint32_t window, const float *hist, uint32_t ring, size_t ld, uint32_t t,
                      uint32_t w, float *out) {
    memset(out, 0, w * sizeof *out);
    for (uint32_t j = 0; j < n_taps && j <= t && (!window || j < window); j++)
        vk->mul_add(out, taps + (size_t)j * tap_ld, hist + (size_t)((t - j) % ring) * ld, w);
}

typedef struct attend3_args {
    uint32_t layer, p0, n;
    uint32_t kv_per_item; /* K/V heads per item */
    const float *rope_cs; /* [n][qk] cos | sin */
    float *q, *k, *v;     /* [n][H*qk], [n][KV*qk], [n][KV*v]: tapped, normed in place */
    const float *gate;    /* [n][H*v] */
    float *o;             /* [n][o_ld] */
    size_t o_ld;
} attend3_args;

/* The shared view of one item of attend3_kv_heads: K/V heads [b0, b1) of a layer. */
typedef struct attend3_item {
    const attend3_args *x;
    const layer_weights *l;
    const layer3_weights *l3;
    const kv_layer_layout *L;
    uint32_t b0, b1;
    attn_kv kv; /* the layer's cache view; head fields set per head */
} attend3_item;

/* The span of the token at t: local layers their last `window` positions (no sinks, as
 * the reference has none); global ones the sinks and the session's window, or all. */
static uint32_t attend3_runs(const attend3_item *it, uint32_t t, attn_run runs[3]) {
    uint32_t n_sink, tail0;
    if (it->l3->window) {
        n_sink = 0;
        tail0 = t + 1 > it->l3->window ? t + 1 - it->l3->window : 0;
    } else {
        const nm_span span = nm_attention_span(t, it->L->n_sinks, it->L->window);
        n_sink = span.n_sink;
        tail0 = span.tail0;
    }
    return cpu_kv_runs(it->L, n_sink, tail0, t, runs);
}

/* Token i of the chunk, heads [b0, b1): the conv taps of its q, k, v columns, k ZC norm
 * and RoPE, the K/V store, then q ZC norm and RoPE of those K/V heads' query heads. */
static void prepare_token3(backend_ctx *s, const attend3_item *it, uint32_t i) {
    const attend3_args *x = it->x;
    const model_weights *m = s->m;
    const layer_weights *l = it->l;
    const layer3_weights *l3 = it->l3;
    const monarch_kernels *vk = cs_of(s)->level.monarch;
    const uint32_t H = m->n_heads, KV = m->n_kv_heads, qk = m->qk_dim, vd = m->v_dim;
    const uint32_t Wq = H * qk, Wk = KV * qk, Wv = KV * vd, reps = H / KV;
    const uint32_t b0 = it->b0, b1 = it->b1;
    const size_t hist_ld = (size_t)Wq + Wk + Wv;
    float *hist = s->qkv_hist ? s->qkv_hist + (size_t)x->layer * s->qkv_ring * hist_ld : NULL;
    /* this item's columns of q, k, v */
    const uint32_t qc = b0 * reps * qk, qn = (b1 - b0) * reps * qk;
    const uint32_t kc = b0 * qk, kn = (b1 - b0) * qk, vc = b0 * vd, vn = (b1 - b0) * vd;
    const uint32_t t = x->p0 + i;
    float *q = x->q + (size_t)i * Wq, *k = x->k + (size_t)i * Wk;
    float *v = x->v + (size_t)i * Wv;
    if (m->conv_taps) {
        float *row = hist + (size_t)(t % s->qkv_ring) * hist_ld;
        memcpy(row + qc, q + qc, qn * sizeof *q);
        memcpy(row + Wq + kc, k + kc, kn * sizeof *k);
        memcpy(row + Wq + Wk + vc, v + vc, vn * sizeof *v);
        conv_taps(vk, l3->q_taps + qc, Wq, m->conv_taps, l3->window, hist + qc, s->qkv_ring,
                  hist_ld, t, qn, q + qc);
        conv_taps(vk, l3->k_taps + kc, Wk, m->conv_taps, l3->window, hist + Wq + kc,
                  s->qkv_ring, hist_ld, t, kn, k + kc);
        conv_taps(vk, l3->v_taps + vc, Wv, m->conv_taps, l3->window, hist + Wq + Wk + vc,
                  s->qkv_ring, hist_ld, t, vn, v + vc);
    }
    const float *cs = x->rope_cs + (size_t)i * qk;
    for (uint32_t b = b0; b < b1; b++) {
        nm_zc_norm(k + b * qk, l->k_norm, qk, k + b * qk);
        nm_rope(k + b * qk, qk, cs);
    }
    if (s->a8) {
        a8_fake_quant_heads(k + kc, b1 - b0, qk);
        a8_fake_quant_heads(v + vc, b1 - b0, vd);
    }
    const uint32_t slot = nm_kv_slot(t, it->L->n_sinks, it->L->window);
    cpu_kv_store(s, 0, it->L->row0 + slot, kc, kn, Wk, k + kc);
    cpu_kv_store(s, 1, it->L->row0 + slot, vc, vn, Wv, v + vc);
    for (uint32_t b = b0; b < b1; b++) {
        float *qb = q + (size_t)b * reps * qk;
        for (uint32_t a = 0; a < reps; a++) {
            nm_zc_norm(qb + a * qk, l->q_norm, qk, qb + a * qk);
            nm_rope(qb + a * qk, qk, cs);
            if (s->a8) a8_fake_quant_heads(qb + a * qk, 1, qk);
        }
    }
}

/* Points kv at K/V head b of the layer. */
static void kv_head3(const backend_ctx *s, attend3_item *it, uint32_t b) {
    const model_weights *m = s->m;
    const size_t elem = s->kv_type == NEEDLE_KV_F32 ? 4 : s->kv_type == NEEDLE_KV_F16 ? 2 : 1;
    const size_t row0 = (size_t)it->L->row0 * m->kv_dim;
    it->kv.k = (const char *)s->k_cache + (row0 + (size_t)b * m->qk_dim) * elem;
    it->kv.v = (const char *)s->v_cache + (row0 + (size_t)b * m->v_dim) * elem;
    it->kv.col0 = b * m->qk_dim;
    it->kv.v_col0 = b * m->v_dim;
}

/* Token i's attention for K/V heads [b0, b1) with the one-token kernel (prepared). */
static void attend_token3(backend_ctx *s, attend3_item *it, uint32_t i, uint32_t b0,
                          uint32_t b1, int thread) {
    const attend3_args *x = it->x;
    const model_weights *m = s->m;
    const uint32_t H = m->n_heads, qk = m->qk_dim, vd = m->v_dim, reps = H / m->n_kv_heads;
    attn_run runs[3];
    const uint32_t n_runs = attend3_runs(it, x->p0 + i, runs);
    for (uint32_t b = b0; b < b1; b++) {
        kv_head3(s, it, b);
        cs_of(s)->level.cq->attend(&it->kv, runs, n_runs,
                                   x->q + (size_t)i * H * qk + (size_t)b * reps * qk, reps, qk,
                                   1.0f / sqrtf((float)qk),
                                   x->gate + (size_t)i * H * vd + (size_t)b * reps * vd,
                                   s->scores + (size_t)b * reps * s->kv_slots, s->kv_slots,
                                   x->o + (size_t)i * x->o_ld + (size_t)b * reps * vd,
                                   cpu_thread_tmp(s, thread));
    }
}

/* Whether the nt tokens from position t0 can attend as one block (attn.h): the level has
 * a block kernel, and the last token's positions are exactly slots [0, last] (nothing
 * wrapped or slid out yet, so each earlier token's are [0, t] too). Depends only on the
 * positions, never on the thread. */
static int block_fits3(const backend_ctx *s, const attend3_item *it, uint32_t t0, uint32_t nt) {
    const uint32_t last = t0 + nt - 1;
    if (nt < 2 || !cs_of(s)->level.cq->attend_block || last >= ATTN_BLOCK_MAX_KEYS ||
        nm_kv_slot(last, it->L->n_sinks, it->L->window) != last)
        return 0;
    attn_run runs[3];
    const uint32_t n_runs = attend3_runs(it, last, runs);
    uint32_t p = 0;
    for (uint32_t r = 0; r < n_runs; r++) {
        if (runs[r].slot != p) return 0;
        p += runs[r].count;
    }
    return p == last + 1;
}

/* K/V heads [b0, b1) of every token of the chunk in order (prepare_token3, then the
 * attention over the layer's span with the gate). A prefill block of ATTN_BLOCK_T
 * tokens whose keys have not wrapped the ring is prepared whole and then attends through
 * the level's block kernel (scores and values as small matrix products); otherwise token
 * by token: token i's K/V is stored before it attends, and a later token's store (which
 * may overwrite a ring slot an earlier one read) after. */
static void attend3_kv_heads(backend_ctx *s, const void *ctx, uint32_t item, int thread) {
    const attend3_args *x = ctx;
    const model_weights *m = s->m;
    const cpu_kernels *kern = cs_of(s)->level.cq;
    const uint32_t H = m->n_heads, KV = m->n_kv_heads, qk = m->qk_dim, vd = m->v_dim;
    const uint32_t reps = H / KV;
    const int int8 = s->kv_type == NEEDLE_KV_INT8;
    const kv_layer_layout *L = &s->kv_layers[x->layer];
    const size_t groups = KV_SCALE_GROUPS(m->kv_dim);
    attend3_item it = {
        .x = x,
        .l = &m->layers[x->layer],
        .l3 = &m->layers3[x->layer],
        .L = L,
        .b0 = item * x->kv_per_item,
        .kv = {.type = s->kv_type,
               .ld = m->kv_dim,
               .k_scales = int8 ? s->kv_scales + L->row0 * groups : NULL,
               .v_scales = int8 ? s->kv_scales + (s->kv_rows + L->row0) * groups : NULL,
               .scales_ld = groups,
               .group = KV_SCALE_GROUP,
               .v_dim = vd,
               /* a decode step finds this layer's rows out of cache: prefetch ahead */
               .cold = x->n == 1}};
    it.b1 = it.b0 + x->kv_per_item < KV ? it.b0 + x->kv_per_item : KV;
    for (uint32_t i0 = 0; i0 < x->n; i0 += ATTN_BLOCK_T) {
        const uint32_t nt = x->n - i0 < ATTN_BLOCK_T ? x->n - i0 : ATTN_BLOCK_T;
        if (!block_fits3(s, &it, x->p0 + i0, nt)) {
            for (uint32_t i = i0; i < i0 + nt; i++) {
                prepare_token3(s, &it, i);
                attend_token3(s, &it, i, it.b0, it.b1, thread);
            }
            continue;
        }
        /* every token's K/V first: a token's keys are the slots up to its own, and the
         * later tokens' (fresh) slots are masked out of its scores */
        for (uint32_t i = i0; i < i0 + nt; i++) prepare_token3(s, &it, i);
        for (uint32_t b = it.b0; b < it.b1; b++) {
            kv_head3(s, &it, b);
            if (!kern->attend_block(&it.kv, x->p0 + i0, nt,
                                    x->q + (size_t)i0 * H * qk + (size_t)b * reps * qk, H * qk,
                                    reps, qk, 1.0f / sqrtf((float)qk),
                                    x->gate + (size_t)i0 * H * vd + (size_t)b * reps * vd,
                                    H * vd,
                                    x->o + (size_t)i0 * x->o_ld + (size_t)b * reps * vd,
                                    x->o_ld, cpu_thread_tmp(s, thread)))
                for (uint32_t i = i0; i < i0 + nt; i++) attend_token3(s, &it, i, b, b + 1, thread);
        }
    }
}

void cpu_attention3(backend_ctx *s, uint32_t li, uint32_t p0, uint32_t n,
                    const float *rope_cs, float *q_all, float *k_all, float *v_all,
                    const float *gate_all, float *o_all) {
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    /* int8: a head whose K or V columns do not fill whole scale groups shares a group
     * with its neighbour, so its rows can only be stored whole: then one item does all */
    const int split = s->kv_type != NEEDLE_KV_INT8 ||
                      (m->qk_dim % KV_SCALE_GROUP == 0 && m->v_dim % KV_SCALE_GROUP == 0);
    const uint32_t per = split ? 1 : m->n_kv_heads;
    const attend3_args a = {li, p0, n, per, rope_cs, q_all, k_all, v_all, gate_all, o_all,
                            l->out_proj.cols_pad};
    cpu_par_for(s, m->n_kv_heads / per, attend3_kv_heads, &a);
    cpu_out_rotate(s, &l->out_proj, o_all, n);
}

