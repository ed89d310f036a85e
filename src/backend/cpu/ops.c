/* The CPU backend's operations (backend.h): plain C float32 over host memory, CQ products
 * through the session's thread pool and the dispatch table of kernels/cpu. This is the
 * reference: every other backend is tested against these (tests/kernels/test_backend_ops.c), and
 * the arithmetic is exactly that of the original single-file forward pass.
 *
 * Threads. Besides the CQ products, the per-token ops of a prefill chunk (lane norm, read
 * and write, attention residual, Hadamard MLP, the logits rotation) and the K/V heads of
 * a chunk's attention are shared among the pool's threads by cpu_par_for (runtime.c).
 * Every item is computed by one thread with the same arithmetic whichever thread it is,
 * using that thread's own scratch (cpu_scratch), so results do not depend on the thread
 * count.
 * Attention goes token by token within a K/V head (token i's K/V is stored before token
 * i attends, and a later token's store may overwrite a ring slot an earlier token still
 * reads), the heads side by side: one dispatch per layer and chunk, not per token. */
#include <math.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/runtime.h"
#include "kernels/cpu/lane_math.h"
#include "util/fp16.h"

/* ---- operations ------------------------------------------------------------------------ */

static void cpu_embed(backend_ctx *s, const int32_t *tokens, uint32_t n,
                      float *lanes) {
    const model_weights *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t d = m->d, nl = m->n_lanes;
    const float emb_scale = (float)sqrt((double)d);
    for (uint32_t i = 0; i < n; i++) {
        float *X = lanes + (size_t)i * nl * d;
        c->level.cq->dequant_row(&m->embedding, (uint32_t)tokens[i], X, c->th[0].tmp);
        for (uint32_t k = 0; k < d; k++) X[k] *= emb_scale;
        for (uint32_t r = 1; r < nl; r++) memcpy(X + (size_t)r * d, X, d * sizeof *X);
    }
}

static void cpu_matmul_op(backend_ctx *s, const float *xr, size_t ld_x,
                          uint32_t ntok, const cq_job *jobs, uint32_t njobs) {
    cpu_matmul(cs_of(s)->pool, xr, ld_x, ntok, jobs, njobs);
}

static void cpu_matmul_a8_op(backend_ctx *s, const float *xr, size_t ld_x, uint32_t ntok,
                             const cq_job *jobs, uint32_t njobs) {
    a8_matmul_pool(cs_of(s)->pool, cs_of(s)->level.a8, xr, ld_x, ntok, jobs, njobs);
}

static void cpu_engram_gather(backend_ctx *s, const engram_site *es,
                              const uint32_t *slots, uint32_t n, float *er) {
    const model_weights *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t ecols = es->key_proj.cols_pad;
    for (uint32_t i = 0; i < n; i++) {
        float *e = c->eng_e;
        for (uint32_t j = 0; j < m->n_tables; j++) {
            float *dst = e + (size_t)j * m->sub_dim;
            const uint32_t slot = slots[(size_t)i * m->n_tables + j];
            if (slot == ENGRAM_MASKED) memset(dst, 0, m->sub_dim * sizeof *dst);
            else c->level.cq->dequant_row(&es->tables, j * m->slots + slot, dst, c->th[0].tmp);
        }
        cpu_act_rotate(s, &es->key_proj, e, er + (size_t)i * ecols);
    }
}

static void cpu_engram_conv(backend_ctx *s, const engram_site *es, float *ring,
                            const float *vhat, uint32_t p0, uint32_t n, float *ev) {
    const model_weights *m = s->m;
    const uint32_t d = m->d;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t t = p0 + i;
        memcpy(ring + (size_t)(t % s->ev_ring) * d, vhat + (size_t)i * d, d * sizeof(float));
        float *out = ev + (size_t)i * d;
        memset(out, 0, d * sizeof *out);
        for (uint32_t tap = 0; tap < m->taps; tap++) {
            uint32_t back = tap * m->dilation;
            if (back > t) break;
            const float *src = ring + (size_t)((t - back) % s->ev_ring) * d;
            const float *w = es->taps + (size_t)tap * d;
            for (uint32_t k = 0; k < d; k++) out[k] += w[k] * src[k];
        }
    }
}

typedef struct lane_norm_args {
    const float *lanes;
    float *nx;
    uint32_t n;
} lane_norm_args;

/* Tokens per lane-norm item: the wide kernels norm several at once (their sums of squares
 * are latency-bound chains that interleave). */
static uint32_t lane_norm_group(const backend_ctx *s) {
    return cs_of(s)->level.lane_wide ? LANE_NORM_BATCH : 1;
}

static void lane_norm_tokens(backend_ctx *s, const void *ctx, uint32_t g, int thread) {
    (void)thread;
    const lane_norm_args *a = ctx;
    const model_weights *m = s->m;
    const lane_wide_kernels *wide = cs_of(s)->level.lane_wide;
    const uint32_t nd = m->n_lanes * m->d, ld = m->phi_pre.cols_pad, group = lane_norm_group(s);
    const uint32_t t0 = g * group, count = a->n - t0 < group ? a->n - t0 : group;
    if (wide) wide->rms_unit_rows(a->lanes + (size_t)t0 * nd, nd, nd, count,
                                  a->nx + (size_t)t0 * ld, ld);
    for (uint32_t i = t0; i < t0 + count; i++) {
        float *out = a->nx + (size_t)i * ld;
        if (!wide) nm_rms_unit(a->lanes + (size_t)i * nd, nd, out);
        /* where the model quantizes the phi products' input (a QAT point of Needle 3, not
         * of Needle 2) */
        if (m->traits.phi_a8) cpu_act_rotate(s, &m->phi_pre, out, out);
        else cs_of(s)->level.cq->rotate(&m->phi_pre, out, out);
    }
}

static void cpu_lane_norm(backend_ctx *s, const float *lanes, uint32_t n, float *nx) {
    const lane_norm_args a = {lanes, nx, n};
    const uint32_t group = lane_norm_group(s);
    cpu_par_for(s, (n + group - 1) / group, lane_norm_tokens, &a);
}

typedef struct lane_read_args {
    uint32_t li;
    const float *lanes, *mix_all, *ek_all, *ev_all;
    float *u_all, *bx_all, *h_all, *hr;
} lane_read_args;

static void lane_read_token(backend_ctx *s, const void *ctx, uint32_t i, int thread) {
    const lane_read_args *a = ctx;
    const model_weights *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t li = a->li;
    const layer_weights *l = &m->layers[li];
    const uint32_t d = m->d, nl = m->n_lanes, nd = nl * d, mix_ld = 2 * nl + nl * nl;
    const uint32_t h_ld = l->q_proj.cols_pad, my_lane = li % nl;
    const float *mix = a->mix_all + (size_t)i * mix_ld;
    const float *X = a->lanes + (size_t)i * nd;
    float *u = a->u_all + (size_t)i * d, *bx = a->bx_all + (size_t)i * d;
    float w[64]; /* n_lanes <= 64 (model load) */
    for (uint32_t r = 0; r < nl; r++)
        w[r] = nm_sigmoid(m->a_pre[li] * mix[r] + m->b_pre[li * nl + r] +
                          nm_lane_pre_offset(r, my_lane));
    if (c->level.lane_wide) {
        c->level.lane_wide->read4(X, w, d, u, bx);
    } else {
        memset(u, 0, d * sizeof *u);
        for (uint32_t r = 0; r < nl; r++)
            for (uint32_t k = 0; k < d; k++) u[k] += w[r] * X[(size_t)r * d + k];
        memcpy(bx, u, d * sizeof *bx);
    }
    if (a->ek_all) {
        const float *ek = a->ek_all + (size_t)i * d, *ev = a->ev_all + (size_t)i * d;
        float *ru = c->th[thread].tmp, *rk = c->th[thread].tmp + d;
        nm_rms_unit(u, d, ru);
        nm_rms_unit(ek, d, rk);
        float dot = 0.0f;
        for (uint32_t k = 0; k < d; k++) dot += ru[k] * rk[k];
        float alpha = nm_sigmoid(dot / sqrtf((float)d));
        for (uint32_t k = 0; k < d; k++) bx[k] += alpha * ev[k];
    }
    float *h = a->h_all + (size_t)i * d;
    nm_zc_norm(bx, l->norm_in, d, h);
    cpu_act_rotate(s, &l->q_proj, h, a->hr + (size_t)i * h_ld);
}

static void cpu_lane_read(backend_ctx *s, uint32_t li, uint32_t n, const float *lanes,
                          const float *mix_all, const float *ek_all, const float *ev_all,
                          float *u_all, float *bx_all, float *h_all, float *hr) {
    const lane_read_args a = {li, lanes, mix_all, ek_all, ev_all, u_all, bx_all, h_all, hr};
    cpu_par_for(s, n, lane_read_token, &a);
}

/* The attention of a chunk of tokens, one item per range of K/V heads. */
typedef struct attend_args {
    uint32_t layer, p0, n;
    uint32_t kv_per_item; /* K/V heads per item */
    const float *rope_cs; /* [n][head_dim] cos | sin */
    float *q, *k;         /* [n][A], [n][kv_dim]: normalised and rotated in place */
    const float *v, *gate;
    float *o;             /* [n][o_ld] */
    size_t o_ld;
} attend_args;

/* Token i's K rows of heads [b0, b1) ZC-normed and rotated, then its K and V rows of those
 * heads stored in the cache; its query heads of those K/V heads normed and rotated. */
static void store_kv_rows(backend_ctx *s, const attend_args *x, uint32_t i, uint32_t b0,
                          uint32_t b1) {
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[x->layer];
    const uint32_t hd = m->head_dim, reps = m->n_heads / m->n_kv_heads, kvd = m->kv_dim;
    const uint32_t t = x->p0 + i, slot = cpu_kv_slot(s, t);
    const float *cs = x->rope_cs + (size_t)i * hd;
    float *k = x->k + (size_t)i * kvd;
    for (uint32_t b = b0; b < b1; b++) {
        nm_zc_norm(k + b * hd, l->k_norm, hd, k + b * hd);
        nm_rope(k + b * hd, hd, cs);
        float *qb = x->q + (size_t)i * m->attn_dim + (size_t)b * reps * hd;
        for (uint32_t a = 0; a < reps; a++) {
            nm_zc_norm(qb + a * hd, l->q_norm, hd, qb + a * hd);
            nm_rope(qb + a * hd, hd, cs);
        }
    }
    const size_t row = s->kv_layers[x->layer].row0 + slot;
    cpu_kv_store(s, 0, row, b0 * hd, (b1 - b0) * hd, kvd, k + b0 * hd);
    cpu_kv_store(s, 1, row, b0 * hd, (b1 - b0) * hd, kvd, x->v + (size_t)i * kvd + b0 * hd);
}

/* Token i's attention for K/V heads [b0, b1) with the one-token kernel (its K/V stored,
 * its queries rotated); kv: the session's view, its head fields set here. */
static void attend_token(backend_ctx *s, const attend_args *x, attn_kv *kv, uint32_t i,
                         uint32_t b0, uint32_t b1, int thread) {
    const model_weights *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t hd = m->head_dim, reps = m->n_heads / m->n_kv_heads, A = m->attn_dim;
    const size_t elem = s->kv_type == NEEDLE_KV_F32 ? 4 : s->kv_type == NEEDLE_KV_F16 ? 2 : 1;
    const uint32_t t = x->p0 + i;
    attn_run runs[3];
    const nm_span span = nm_attention_span(t, s->n_sinks, s->window);
    const uint32_t n_runs = cpu_kv_runs(&s->kv_layers[x->layer], span.n_sink, span.tail0, t,
                                        runs);
    for (uint32_t b = b0; b < b1; b++) {
        const float *qb = x->q + (size_t)i * A + (size_t)b * reps * hd;
        float *ob = x->o + (size_t)i * x->o_ld + (size_t)b * reps * hd;
        const float *gb = x->gate + (size_t)i * A + (size_t)b * reps * hd;
        const size_t head0 = cpu_kv_index(s, x->layer, 0) + (size_t)b * hd;
        kv->k = (const char *)s->k_cache + head0 * elem;
        kv->v = (const char *)s->v_cache + head0 * elem;
        kv->col0 = b * hd;
        c->level.cq->attend(kv, runs, n_runs, qb, reps, hd, 1.0f / sqrtf((float)hd), gb,
                        s->scores + (size_t)b * reps * s->kv_slots, s->kv_slots, ob,
                        c->th[thread].tmp);
    }
}

/* Whether the nt tokens from position t0 can attend as one block (attn.h): the level has
 * a block kernel, and every position up to the last token's sits in the slot of its own
 * index (the ring has not wrapped), so token t's keys are slots [0, t]. Depends only on
 * the positions, never on the thread. */
static int block_fits(const backend_ctx *s, uint32_t layer, uint32_t t0, uint32_t nt) {
    const uint32_t last = t0 + nt - 1;
    if (nt < 2 || !cs_of(s)->level.cq->attend_block || last >= ATTN_BLOCK_MAX_KEYS ||
        cpu_kv_slot(s, last) != last)
        return 0;
    attn_run runs[3];
    const nm_span span = nm_attention_span(last, s->n_sinks, s->window);
    const uint32_t n_runs = cpu_kv_runs(&s->kv_layers[layer], span.n_sink, span.tail0, last,
                                        runs);
    uint32_t p = 0;
    for (uint32_t r = 0; r < n_runs; r++) {
        if (runs[r].slot != p) return 0;
        p += runs[r].count;
    }
    return p == last + 1;
}

/* K/V heads [b0, b1) for every token of the chunk in order (§3.6): k ZC norm and RoPE,
 * append k, v to the cache, then for each query head of those K/V heads q ZC norm and
 * RoPE, softmax over the sinks and the window tail, o = sigmoid(gate) * sum_p w_p v_p.
 * A token's K/V is stored before it attends, and a later token's store (which may
 * overwrite a ring slot an earlier one read) comes after: the order of the original
 * token-by-token loop, kept per K/V head, which is all that a head reads or writes. */
static void attend_kv_heads(backend_ctx *s, const void *ctx, uint32_t item, int thread) {
    const attend_args *x = ctx;
    const model_weights *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t hd = m->head_dim, reps = m->n_heads / m->n_kv_heads, kvd = m->kv_dim;
    const uint32_t A = m->attn_dim;
    const uint32_t b0 = item * x->kv_per_item;
    const uint32_t b1 = b0 + x->kv_per_item < m->n_kv_heads ? b0 + x->kv_per_item : m->n_kv_heads;
    const float inv_scale = 1.0f / sqrtf((float)hd);
    const size_t elem = s->kv_type == NEEDLE_KV_F32 ? 4 : s->kv_type == NEEDLE_KV_F16 ? 2 : 1;
    const int int8 = s->kv_type == NEEDLE_KV_INT8;
    attn_kv kv = {.type = s->kv_type,
                  .ld = kvd,
                  .k_scales = int8 ? cpu_kv_row_scales(s, 0, x->layer, 0) : NULL,
                  .v_scales = int8 ? cpu_kv_row_scales(s, 1, x->layer, 0) : NULL,
                  .scales_ld = KV_SCALE_GROUPS(kvd),
                  .group = KV_SCALE_GROUP,
                  .cold = x->n == 1};
    for (uint32_t i0 = 0; i0 < x->n; i0 += ATTN_BLOCK_T) {
        const uint32_t nt = x->n - i0 < ATTN_BLOCK_T ? x->n - i0 : ATTN_BLOCK_T;
        if (!block_fits(s, x->layer, x->p0 + i0, nt)) {
            for (uint32_t i = i0; i < i0 + nt; i++) {
                store_kv_rows(s, x, i, b0, b1);
                attend_token(s, x, &kv, i, b0, b1, thread);
            }
            continue;
        }
        /* every token's K/V first: a token's keys are the slots up to its own, and the
         * later tokens' (fresh) slots are masked out of its scores */
        for (uint32_t i = i0; i < i0 + nt; i++) store_kv_rows(s, x, i, b0, b1);
        for (uint32_t b = b0; b < b1; b++) {
            const size_t off = (size_t)i0 * A + (size_t)b * reps * hd;
            const size_t head0 = cpu_kv_index(s, x->layer, 0) + (size_t)b * hd;
            kv.k = (const char *)s->k_cache + head0 * elem;
            kv.v = (const char *)s->v_cache + head0 * elem;
            kv.col0 = b * hd;
            if (!c->level.cq->attend_block(&kv, x->p0 + i0, nt, x->q + off, A, reps, hd, inv_scale,
                                       x->gate + off, A,
                                       x->o + (size_t)i0 * x->o_ld + (size_t)b * reps * hd,
                                       x->o_ld, c->th[thread].tmp))
                for (uint32_t i = i0; i < i0 + nt; i++) attend_token(s, x, &kv, i, b, b + 1, thread);
        }
    }
}

static void cpu_attention(backend_ctx *s, uint32_t li, uint32_t p0, uint32_t n,
                          const float *rope_cs, float *q_all, float *k_all, const float *v_all,
                          const float *gate_all, float *o_all) {
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    /* an int8 head whose columns do not fill whole scale groups shares a group with its
     * neighbour, so its row can only be stored whole: then one item does every head */
    const int split = s->kv_type != NEEDLE_KV_INT8 || m->head_dim % KV_SCALE_GROUP == 0;
    const uint32_t per = split ? 1 : m->n_kv_heads;
    const attend_args a = {li, p0, n, per, rope_cs, q_all, k_all, v_all, gate_all, o_all,
                           l->out_proj.cols_pad};
    cpu_par_for(s, m->n_kv_heads / per, attend_kv_heads, &a);
    cpu_out_rotate(s, &l->out_proj, o_all, n);
}

typedef struct attn_residual_args {
    uint32_t li;
    float *attn;
    const float *bx_all;
    float *x_all, *h_all;
} attn_residual_args;

static void attn_residual_token(backend_ctx *s, const void *ctx, uint32_t i,
                                int thread) {
    (void)thread;
    const attn_residual_args *r = ctx;
    const layer_weights *l = &s->m->layers[r->li];
    const uint32_t d = s->m->d;
    const float gate = nm_sigmoid(l->attn_gate);
    const float *bx = r->bx_all + (size_t)i * d;
    float *a = r->attn + (size_t)i * d, *x = r->x_all + (size_t)i * d;
    nm_zc_norm(a, l->post_norm, d, a);
    for (uint32_t k = 0; k < d; k++) x[k] = bx[k] + gate * a[k];
    nm_zc_norm(x, l->pre_hada, d, r->h_all + (size_t)i * d);
}

static void cpu_attn_residual(backend_ctx *s, uint32_t li, uint32_t n, float *attn,
                              const float *bx_all, float *x_all, float *h_all) {
    const attn_residual_args r = {li, attn, bx_all, x_all, h_all};
    cpu_par_for(s, n, attn_residual_token, &r);
}

typedef struct hadamard_args {
    uint32_t li;
    const float *h_all;
    float *out_all;
} hadamard_args;

static void hadamard_token(backend_ctx *s, const void *ctx, uint32_t t, int thread) {
    const hadamard_args *a = ctx;
    const model_weights *m = s->m;
    const cpu_session *c = cs_of(s);
    const layer_weights *l = &m->layers[a->li];
    const uint32_t N = m->hada_n, d = m->d;
    const float scale = 1.0f / sqrtf((float)N);
    float *z = c->th[thread].hada;
    const float *h = a->h_all + (size_t)t * d;
    float *out = a->out_all + (size_t)t * d;
    for (uint32_t i = 0; i < N; i++) z[i] = i < d ? l->d1[i] * h[i] : 0.0f;
    c->level.cq->fwht(z, N);
    /* v = d2 * z * scale, z = v * sigmoid(v) */
    if (c->level.lane_wide) c->level.lane_wide->hada_gate(z, l->d2, scale, N);
    else lane_hada_gate(z, l->d2, scale, N);
    c->level.cq->fwht(z, N);
    for (uint32_t i = 0; i < d; i++) out[i] = l->d3[i] * (z[i] * scale);
}

static void cpu_hadamard_mlp(backend_ctx *s, uint32_t li, uint32_t n,
                             const float *h_all, float *out_all) {
    const hadamard_args a = {li, h_all, out_all};
    cpu_par_for(s, n, hadamard_token, &a);
}

typedef struct lane_write_args {
    uint32_t li, n;
    const float *mix_all, *x_all;
    float *mlp;
    const float *u_all;
    float *lanes;
} lane_write_args;

/* Tokens per lane-write item: with 4 lanes, a group's Sinkhorns run interleaved (as many
 * as fill the wide kernels' vectors). */
static uint32_t lane_write_group(const backend_ctx *s) {
    const lane_wide_kernels *w = cs_of(s)->level.lane_wide;
    if (w) return w->sinkhorn_batch;
    return s->m->n_lanes == 4 ? LANE_SINKHORN_BATCH : 1;
}

/* Tokens [g * group, ...) of the chunk: y = block output - u, the post weights and the
 * doubly stochastic mix of each, then the lanes rewritten. */
static void lane_write_tokens(backend_ctx *s, const void *ctx, uint32_t g, int thread) {
    const lane_write_args *a = ctx;
    const model_weights *m = s->m;
    const uint32_t li = a->li;
    const uint32_t d = m->d, nl = m->n_lanes, nd = nl * d, mix_ld = 2 * nl + nl * nl;
    const uint32_t my_lane = li % nl, group = lane_write_group(s);
    const lane_wide_kernels *wide = cs_of(s)->level.lane_wide;
    const uint32_t t0 = g * group, count = a->n - t0 < group ? a->n - t0 : group;
    float hpost[LANE_WIDE_MAX_BATCH][64], P[64 * 64]; /* group > 1 only for 4 lanes */
    for (uint32_t j = 0; j < count; j++) {
        const uint32_t i = t0 + j;
        const float *x = a->x_all + (size_t)i * d, *u = a->u_all + (size_t)i * d;
        /* y = block output - u: the engram term rides inside y (§3.4) */
        float *y = a->mlp + (size_t)i * d;
        for (uint32_t k = 0; k < d; k++) y[k] = x[k] + y[k] - u[k];
        const float *mix = a->mix_all + (size_t)i * mix_ld;
        for (uint32_t r = 0; r < nl; r++) {
            hpost[j][r] = NM_LANE_POST_GAIN * nm_sigmoid(m->a_post[li] * mix[nl + r] +
                                                         m->b_post[li * nl + r] +
                                                         nm_lane_post_offset(r, my_lane));
        }
        float *Pj = P + (size_t)j * nl * nl;
        for (uint32_t k = 0; k < nl * nl; k++)
            Pj[k] = m->a_res[li] * mix[2 * nl + k] + m->b_res[(size_t)li * nl * nl + k];
    }
    /* one token (decode) has no other to interleave with: the 4-wide chain is as short */
    if (wide && count > 1) wide->sinkhorn4(P, count);
    else if (group > 1) lane_sinkhorn4_batch(P, count);
    else lane_sinkhorn(P, nl);
    for (uint32_t j = 0; j < count; j++) {
        const uint32_t i = t0 + j;
        const float *y = a->mlp + (size_t)i * d, *Pj = P + (size_t)j * nl * nl;
        if (wide) {
            wide->rewrite4(a->lanes + (size_t)i * nd, y, Pj, hpost[j], d);
            continue;
        }
        /* lane r, column k: hpost[r] * y[k] + sum over c of P[r][c] * old lane c, column
         * k. A column's new values need only its old ones, so the lanes are rewritten a
         * block of columns at a time from a copy of that block (one pass over the lanes) */
        float *X = a->lanes + (size_t)i * nd, *old = cs_of(s)->th[thread].lane_old;
        enum { BLOCK = 64 };
        const uint32_t stride = d < BLOCK ? d : BLOCK; /* old holds n_lanes * d floats */
        for (uint32_t k0 = 0; k0 < d; k0 += BLOCK) {
            const uint32_t nk = d - k0 < BLOCK ? d - k0 : BLOCK;
            const float *yb = y + k0; /* pointers, not k0 + k: 32-bit sums kept GCC scalar */
            for (uint32_t cc = 0; cc < nl; cc++) {
                const float *src = X + (size_t)cc * d + k0;
                float *keep = old + (size_t)cc * stride;
                for (uint32_t k = 0; k < nk; k++) keep[k] = src[k];
            }
            for (uint32_t r = 0; r < nl; r++) {
                float *dst = X + (size_t)r * d + k0;
                for (uint32_t k = 0; k < nk; k++) dst[k] = hpost[j][r] * yb[k];
                for (uint32_t cc = 0; cc < nl; cc++) {
                    const float pw = Pj[r * nl + cc];
                    const float *src = old + (size_t)cc * stride;
                    for (uint32_t k = 0; k < nk; k++) dst[k] += pw * src[k];
                }
            }
        }
    }
}

static void cpu_lane_write(backend_ctx *s, uint32_t li, uint32_t n,
                           const float *mix_all, const float *x_all, float *mlp,
                           const float *u_all, float *lanes) {
    const lane_write_args a = {li, n, mix_all, x_all, mlp, u_all, lanes};
    const uint32_t group = lane_write_group(s);
    cpu_par_for(s, (n + group - 1) / group, lane_write_tokens, &a);
}

/* out_rot[i] = rotate_{embedding}(ZC(mean of the lanes of token i; final_norm)) */
static void final_hidden_token(backend_ctx *s, const void *ctx, uint32_t i,
                               int thread) {
    const float *lanes = ctx;
    const model_weights *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t d = m->d, nl = m->n_lanes;
    const float *X = lanes + (size_t)i * nl * d;
    float *xbar = c->th[thread].tmp;
    for (uint32_t k = 0; k < d; k++) {
        float acc = 0.0f;
        for (uint32_t r = 0; r < nl; r++) acc += X[(size_t)r * d + k];
        xbar[k] = acc / (float)nl;
    }
    nm_zc_norm(xbar, m->final_norm, d, xbar);
    cpu_act_rotate(s, &m->embedding, xbar, c->out_rot + (size_t)i * m->embedding.cols_pad);
}

static void cpu_logits(backend_ctx *s, const float *lanes, uint32_t count, float *out,
                       int32_t *argmax) {
    const model_weights *m = s->m;
    const cpu_session *c = cs_of(s);
    cpu_par_for(s, count, final_hidden_token, lanes);
    /* rows [0, out_vocab) of the embedding are the output head (all of it for Needle 2) */
    const cq_job tied[] = {{&m->embedding, 0, m->out_vocab, out, m->vocab}};
    if (s->a8) a8_matmul_pool(c->pool, c->level.a8, c->out_rot, m->embedding.cols_pad, count, tied, 1);
    else cpu_matmul(c->pool, c->out_rot, m->embedding.cols_pad, count, tied, 1);
    if (argmax)
        for (uint32_t i = 0; i < count; i++) {
            const float *row = out + (size_t)i * m->vocab;
            int32_t best = 0;
            for (uint32_t v = 1; v < m->out_vocab; v++)
                if (row[v] > row[best]) best = (int32_t)v;
            argmax[i] = best;
        }
}

/* One product per run of consecutive ids, RUNS_PER_BATCH runs to a batch (a dispatch);
 * the caller keeps the ids few and clustered enough for that to beat the whole product. */
#define RUNS_PER_BATCH 64

static void cpu_logits_rows(backend_ctx *s, const float *lanes, const int32_t *rows,
                            uint32_t n_rows, float *out) {
    const model_weights *m = s->m;
    const cpu_session *c = cs_of(s);
    final_hidden_token(s, lanes, 0, 0);
    for (uint32_t v = 0; v < m->vocab; v++) out[v] = -INFINITY;
    cq_job jobs[RUNS_PER_BATCH];
    for (uint32_t i = 0; i < n_rows;) {
        uint32_t nj = 0;
        while (i < n_rows && nj < RUNS_PER_BATCH) {
            uint32_t j = i + 1;
            while (j < n_rows && rows[j] == rows[j - 1] + 1) j++;
            jobs[nj++] = (cq_job){&m->embedding, (uint32_t)rows[i], j - i, out + rows[i], m->vocab};
            i = j;
        }
        if (s->a8) a8_matmul_pool(c->pool, c->level.a8, c->out_rot, m->embedding.cols_pad, 1, jobs, nj);
        else cpu_matmul(c->pool, c->out_rot, m->embedding.cols_pad, 1, jobs, nj);
    }
}

const needle_backend_ops cpu_backend_ops = {
    .model_load = NULL,
    .model_unload = NULL,
    .session_init = cpu_session_init,
    .session_free = cpu_session_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .embed = cpu_embed,
    .matmul = cpu_matmul_op,
    .engram_gather = cpu_engram_gather,
    .engram_conv = cpu_engram_conv,
    .lane_norm = cpu_lane_norm,
    .lane_read = cpu_lane_read,
    .attention = cpu_attention,
    .attn_residual = cpu_attn_residual,
    .hadamard_mlp = cpu_hadamard_mlp,
    .lane_write = cpu_lane_write,
    .logits = cpu_logits,
    .matmul_a8 = cpu_matmul_a8_op,
    .attention3 = cpu_attention3,
    .monarch_mlp = cpu_monarch_mlp,
    .logits_rows = cpu_logits_rows,
    .thread_stats = cpu_thread_stats,
    .kv_per_layer = 1,
};
