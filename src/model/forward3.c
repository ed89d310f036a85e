/* One Needle 3 layer over a chunk (docs/spec/NEEDLE3.md §2; the official definition is
 * cactus-needle 3.2.8 model/architecture.py), called from the shared chunk loop in
 * forward.c, which also does the embedding, the engram memory and the logits.
 *
 * Read against the reference: the lanes are read as in Needle 2 (lane_read: the engram
 * term, then ZC(x; norm_in) rotated for the q/k/v products); q, k, v, gate are four CQ
 * products of different widths (q, k: heads x qk_dim; v: kv heads x v_dim; gate: heads x
 * v_dim); attention3 applies the conv taps, norms, RoPE, the layer's span and the gate;
 * out_proj; the attention residual as in Needle 2; the Monarch MLP; the lane write.
 * Under W·A8 the inputs of the phi, q/k/v/gate and out_proj products are A8 rows (the
 * official quant=True points; attention3 quantizes the heads).
 * The mHC phi rows are those of the file layer this layer runs (a ladder rung skips
 * layers; everything else is already in rung order in m->w). */
#include <math.h>
#include <string.h>

#include "model/session.h"
#include "util/clock.h"

void forward3_layer_chunk(struct needle_session *s, uint32_t li, uint32_t p0, uint32_t n) {
    const struct needle_model *m = s->m;
    const needle_backend_ops *ops = s->ops;
    const layer_weights *l = &m->w.layers[li];
    const uint32_t d = m->w.d, nl = m->w.n_lanes, mix_ld = 2 * nl + nl * nl;
    const uint32_t H = m->w.n_heads, KV = m->w.n_kv_heads, qk = m->w.qk_dim, vd = m->w.v_dim;
    const uint32_t fl = m->w.file_layer[li];
    const int site = model_site_of(m, li);

    TIMED(mhc_ms, ops->lane_norm(&s->bk, s->lanes, n, s->nx));
    const cq_job phi[] = {{&m->w.phi_pre, fl * nl, nl, s->mix, mix_ld},
                          {&m->w.phi_post, fl * nl, nl, s->mix + nl, mix_ld},
                          {&m->w.phi_res, fl * nl * nl, nl * nl, s->mix + 2 * nl, mix_ld}};
    TIMED(matmul_ms, forward_act_matmul(s, s->nx, m->w.phi_pre.cols_pad, n, phi, 3));

    const float *ek = site >= 0 ? s->eng_k + (size_t)site * s->bk.chunk * d : NULL;
    const float *ev = site >= 0 ? s->eng_v + (size_t)site * s->bk.chunk * d : NULL;
    TIMED(mhc_ms,
          ops->lane_read(&s->bk, li, n, s->lanes, s->mix, ek, ev, s->u, s->bx, s->h, s->hr));

    const cq_job qkvg[] = {{&l->q_proj, 0, H * qk, s->q, H * qk},
                           {&l->k_proj, 0, KV * qk, s->k, KV * qk},
                           {&l->v_proj, 0, KV * vd, s->v, KV * vd},
                           {&l->gate_proj, 0, H * vd, s->gate, H * vd}};
    TIMED(matmul_ms, forward_act_matmul(s, s->hr, l->q_proj.cols_pad, n, qkvg, 4));
    TIMED(attention_ms,
          ops->attention3(&s->bk, li, p0, n, s->rope_cs, s->q, s->k, s->v, s->gate, s->o));
    const cq_job out[] = {{&l->out_proj, 0, d, s->attn, d}};
    TIMED(matmul_ms, forward_act_matmul(s, s->o, l->out_proj.cols_pad, n, out, 1));

    TIMED(attention_ms, ops->attn_residual(&s->bk, li, n, s->attn, s->bx, s->x2, s->h));
    TIMED(hadamard_ms, ops->monarch_mlp(&s->bk, li, n, s->h, s->attn));
    TIMED(mhc_ms, ops->lane_write(&s->bk, li, n, s->mix, s->x2, s->attn, s->u, s->lanes));
}

void forward3_mask_input_only(const struct needle_model *m, float *logits, uint32_t count) {
    const uint32_t V = m->w.vocab, out = m->w.out_vocab;
    if (out >= V) return;
    for (uint32_t i = 0; i < count; i++)
        for (uint32_t v = out; v < V; v++) logits[(size_t)i * V + v] = -INFINITY;
}
