/* The forward pass (spec §3) over a chunk of tokens, shared by every backend and every
 * architecture.
 *
 * Read top to bottom it follows the spec: embedding (§3.2), engram memory from token ids
 * (§3.3), then per layer the architecture's layer function (m->arch->layer: layer2.c,
 * layer3.c) over the steps below, the multi-lane hyper-connection around the block
 * (§3.4), the attention products and residual (§3.5-3.6), and the tied logits (§3.8).
 * Every step is an operation of the session's backend (backend/backend.h, `s->ops`);
 * this file only decides the order, the buffers and the host-side integer work (engram
 * hashes, RoPE angles). It never dereferences activation memory, which may be on a
 * device. Matrix products run over the whole chunk, products that read the same
 * activations in one batch; everything order-dependent (KV ring, engram conv ring) is
 * done token by token inside the ops. */
#include <math.h>
#include <string.h>

#include "kernels/nmath.h"
#include "model/session.h"
#include "util/clock.h"
#include "util/error.h"

/* A product over activations that the QAT model quantizes (spec §5.3, points 1-3; in
 * Needle 3 also the mHC phi products). */
void forward_act_matmul(model_session *s, const float *xr, size_t ld_x, uint32_t n,
                       const cq_job *jobs, uint32_t njobs) {
    if (s->bk.a8) s->ops->matmul_a8(&s->bk, xr, ld_x, n, jobs, njobs);
    else s->ops->matmul(&s->bk, xr, ld_x, n, jobs, njobs);
}

/* ---- engram memory (§3.3) --------------------------------------------------------- */

/* Token at absolute position t - back, for a chunk starting at p0 (0 before the start). */
static int32_t token_back(const model_session *s, const int32_t *tokens, uint32_t p0,
                          uint32_t t, uint32_t back) {
    if (back > t) return 0;
    uint32_t p = t - back;
    if (p >= p0) return tokens[p - p0];
    return s->history[p % SESSION_HISTORY];
}

/* slots[i][j]: the table-j row of token p0 + i, or ENGRAM_MASKED before the n-gram's
 * oldest token exists. The same for every site (only the tables differ). */
static void engram_slots(const model_session *s, const int32_t *tokens, uint32_t p0,
                         uint32_t n, uint32_t *slots) {
    const struct needle_model *m = s->m;
    const uint32_t heads = m->w.n_tables / m->w.n_orders;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t t = p0 + i;
        for (uint32_t a = 0; a < m->w.n_orders; a++) {
            const uint32_t order = m->w.orders[a];
            for (uint32_t hh = 0; hh < heads; hh++) {
                const uint32_t j = a * heads + hh;
                uint32_t *slot = slots + (size_t)i * m->w.n_tables + j;
                if (t + 1 < order) {
                    *slot = ENGRAM_MASKED;
                    continue;
                }
                /* the hash seed counts heads with the file's stride (Needle 3 seed heads;
                 * Needle 2: the heads per order, so the seed index is j) */
                uint32_t acc = nm_engram_hash_start(a * m->w.seed_stride + hh);
                for (uint32_t back = 0; back < order; back++)
                    acc = nm_engram_hash_step(acc, (uint32_t)token_back(s, tokens, p0, t, back));
                *slot = nm_engram_hash_slot(acc, m->w.slots);
            }
        }
    }
}

static void engram_chunk(model_session *s, const int32_t *tokens, uint32_t p0,
                         uint32_t n) {
    const struct needle_model *m = s->m;
    const needle_backend_ops *ops = s->ops;
    const uint32_t d = m->w.d;
    TIMED(engram_ms, engram_slots(s, tokens, p0, n, s->eng_slots));
    for (uint32_t site = 0; site < m->w.n_sites; site++) {
        const engram_site *es = &m->w.sites[site];
        TIMED(engram_ms, ops->engram_gather(&s->bk, es, s->eng_slots, n, s->eng_er));
        float *ek = s->eng_k + (size_t)site * s->bk.chunk * d;
        const cq_job kv[] = {{&es->key_proj, 0, d, ek, d}, {&es->value_proj, 0, d, s->eng_vhat, d}};
        TIMED(matmul_ms, forward_act_matmul(s, s->eng_er, es->key_proj.cols_pad, n, kv, 2));
        /* depthwise causal conv over pre-conv values at offsets 0, dil, 2*dil, ... */
        TIMED(engram_ms, ops->engram_conv(&s->bk, es, s->ev_hist + (size_t)site * s->bk.ev_ring * d,
                                          s->eng_vhat, p0, n,
                                          s->eng_v + (size_t)site * s->bk.chunk * d));
    }
}

/* ---- the steps of a layer (§3.4-3.7), shared by every architecture's layer ---------- */

void forward_mix_lanes(model_session *s, uint32_t phi_layer, uint32_t n) {
    const struct needle_model *m = s->m;
    const uint32_t nl = m->w.n_lanes, mix_ld = 2 * nl + nl * nl;
    TIMED(mhc_ms, s->ops->lane_norm(&s->bk, s->lanes, n, s->nx));
    const cq_job phi[] = {{&m->w.phi_pre, phi_layer * nl, nl, s->mix, mix_ld},
                          {&m->w.phi_post, phi_layer * nl, nl, s->mix + nl, mix_ld},
                          {&m->w.phi_res, phi_layer * nl * nl, nl * nl, s->mix + 2 * nl, mix_ld}};
    /* lane_norm wrote A8 rows under W·A8 only where the model quantizes this product */
    if (m->w.traits.phi_a8)
        TIMED(matmul_ms, forward_act_matmul(s, s->nx, m->w.phi_pre.cols_pad, n, phi, 3));
    else
        TIMED(matmul_ms, s->ops->matmul(&s->bk, s->nx, m->w.phi_pre.cols_pad, n, phi, 3));
}

void forward_read_lanes(model_session *s, uint32_t li, uint32_t n) {
    const struct needle_model *m = s->m;
    const uint32_t d = m->w.d;
    const int site = model_site_of(m, li);
    const float *ek = site >= 0 ? s->eng_k + (size_t)site * s->bk.chunk * d : NULL;
    const float *ev = site >= 0 ? s->eng_v + (size_t)site * s->bk.chunk * d : NULL;
    TIMED(mhc_ms,
          s->ops->lane_read(&s->bk, li, n, s->lanes, s->mix, ek, ev, s->u, s->bx, s->h, s->hr));
}

void forward_project_qkvg(model_session *s, uint32_t li, uint32_t n) {
    const model_weights *w = &s->m->w;
    const layer_weights *l = &w->layers[li];
    const uint32_t H = w->n_heads, KV = w->n_kv_heads, qk = w->qk_dim, vd = w->v_dim;
    const cq_job qkvg[] = {{&l->q_proj, 0, H * qk, s->q, H * qk},
                           {&l->k_proj, 0, KV * qk, s->k, KV * qk},
                           {&l->v_proj, 0, KV * vd, s->v, KV * vd},
                           {&l->gate_proj, 0, H * vd, s->gate, H * vd}};
    TIMED(matmul_ms, forward_act_matmul(s, s->hr, l->q_proj.cols_pad, n, qkvg, 4));
}

void forward_project_out(model_session *s, uint32_t li, uint32_t n) {
    const layer_weights *l = &s->m->w.layers[li];
    const cq_job out[] = {{&l->out_proj, 0, s->m->w.d, s->attn, s->m->w.d}};
    TIMED(matmul_ms, forward_act_matmul(s, s->o, l->out_proj.cols_pad, n, out, 1));
}

void forward_attention_residual(model_session *s, uint32_t li, uint32_t n) {
    TIMED(attention_ms, s->ops->attn_residual(&s->bk, li, n, s->attn, s->bx, s->x2, s->h));
}

void forward_write_lanes(model_session *s, uint32_t li, uint32_t n) {
    TIMED(mhc_ms, s->ops->lane_write(&s->bk, li, n, s->mix, s->x2, s->attn, s->u, s->lanes));
}

void forward_mask_input_only(const struct needle_model *m, float *logits, uint32_t count) {
    const uint32_t V = m->w.vocab, out = m->w.out_vocab;
    if (out >= V) return;
    for (uint32_t i = 0; i < count; i++)
        for (uint32_t v = out; v < V; v++) logits[(size_t)i * V + v] = -INFINITY;
}

/* ---- cells for the probe heads (§4.1) ----------------------------------------------- */

/* Hands cell `cell` of the chunk to the run's receiver `to`: the lanes come to the host (a
 * copy on the CPU, a download on a device), cell 0 is any lane (all equal x0), later cells
 * the lane mean. */
static void emit_cells(model_session *s, const session_cells *to, const int32_t *tokens,
                       uint32_t n, uint32_t cell) {
    const uint32_t d = s->m->w.d, nl = s->m->w.n_lanes;
    const double t0 = util_clock_ms();
    s->ops->download(&s->bk, s->cell_lanes, s->lanes, (size_t)n * nl * d * sizeof(float));
    for (uint32_t i = 0; i < n; i++) {
        const float *x = s->cell_lanes + (size_t)i * nl * d;
        float *c = s->cell_mean + (size_t)i * d;
        if (cell == 0) {
            memcpy(c, x, d * sizeof *c);
            continue;
        }
        for (uint32_t j = 0; j < d; j++) {
            float sum = 0;
            for (uint32_t r = 0; r < nl; r++) sum += x[(size_t)r * d + j];
            c[j] = sum / (float)nl;
        }
    }
    to->fn(to->user, tokens, n, cell, s->cell_mean);
    s->stats.heads_ms += util_clock_ms() - t0;
}

/* ---- the chunk loop -------------------------------------------------------------------- */

int session_forward(model_session *s, const int32_t *tokens, uint32_t n,
                    float *all_logits, const logits_request *want, const session_cells *cells) {
    static const logits_request every_id = {0, NULL, 0};
    if (!want) want = &every_id;
    if (cells && !cells->fn) cells = NULL;
    const struct needle_model *m = s->m;
    const needle_backend_ops *ops = s->ops;
    const uint32_t d = m->w.d, nl = m->w.n_lanes, hd = m->w.head_dim;
    for (uint32_t done = 0; done < n;) {
        const uint32_t p0 = s->pos, cn = n - done < s->bk.chunk ? n - done : s->bk.chunk;
        const int32_t *tok = tokens + done;
        /* RoPE angles for this chunk's positions, [i][cos(hd/2) | sin(hd/2)] */
        float *cs = s->rope_cs;
        for (uint32_t i = 0; i < cn; i++) {
            const float tf = (float)(p0 + i);
            for (uint32_t j = 0; j < hd / 2; j++) {
                const float ang = tf * m->rope_freq[j];
                cs[(size_t)i * hd + j] = cosf(ang);
                cs[(size_t)i * hd + hd / 2 + j] = sinf(ang);
            }
        }
        TIMED(embed_ms, ops->embed(&s->bk, tok, cn, s->lanes));
        if (cells) emit_cells(s, cells, tok, cn, 0);
        if (m->w.n_sites) engram_chunk(s, tok, p0, cn);
        for (uint32_t li = 0; li < m->w.n_layers; li++) {
            m->arch->layer(s, li, p0, cn);
            if (cells) emit_cells(s, cells, tok, cn, li + 1);
        }

        for (uint32_t i = 0; i < cn; i++) s->history[(p0 + i) % SESSION_HISTORY] = tok[i];
        s->pos = p0 + cn;
        if (all_logits) {
            TIMED(logits_ms,
                  ops->logits(&s->bk, s->lanes, cn, all_logits + (size_t)done * m->w.vocab, NULL));
            forward_mask_input_only(m, all_logits + (size_t)done * m->w.vocab, cn);
            s->stats.logit_rows += (uint64_t)cn * m->w.vocab;
        }
        if (done + cn == n) {
            if (all_logits) memcpy(s->logits, all_logits + (size_t)(n - 1) * m->w.vocab,
                                   m->w.vocab * sizeof(float));
            else if (!want->skip && want->rows && ops->logits_rows) {
                TIMED(logits_ms, ops->logits_rows(&s->bk, s->lanes + (size_t)(cn - 1) * nl * d,
                                                  want->rows, want->n_rows, s->logits));
                s->stats.logit_rows += want->n_rows;
                forward_mask_input_only(m, s->logits, 1);
            } else if (!want->skip) {
                s->stats.logit_rows += m->w.vocab;
                TIMED(logits_ms,
                      ops->logits(&s->bk, s->lanes + (size_t)(cn - 1) * nl * d, 1, s->logits,
                                  NULL));
                forward_mask_input_only(m, s->logits, 1);
                if (want->rows) /* the subset the caller asked for, from the full product */
                    for (uint32_t v = 0, r = 0; v < m->w.vocab; v++) {
                        if (r < want->n_rows && want->rows[r] == (int32_t)v) r++;
                        else s->logits[v] = -INFINITY;
                    }
            }
        }
        done += cn;
    }
    if (ops->finish) {
        int rc;
        TIMED(sync_ms, rc = ops->finish(&s->bk));
        if (rc) {
            s->has_logits = 0;
            return rc;
        }
    }
    s->has_logits = all_logits || !want->skip;
    return NEEDLE_OK;
}
