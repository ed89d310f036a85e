/* The Needle 3 architecture (docs/spec/NEEDLE3.md §2; the official definition is
 * cactus-needle 3.2.8 model/architecture.py): its layer over forward.c's shared steps,
 * its session rules, and its descriptor (arch.h).
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
#include "model/session.h"
#include "util/clock.h"
#include "util/error.h"

static void needle3_layer(struct model_session *s, uint32_t li, uint32_t p0, uint32_t n) {
    const needle_backend_ops *ops = s->ops;
    forward_mix_lanes(s, s->m->w.file_layer[li], n);
    forward_read_lanes(s, li, n);
    forward_project_qkvg(s, li, n);
    TIMED(attention_ms,
          ops->attention3(&s->bk, li, p0, n, s->rope_cs, s->q, s->k, s->v, s->gate, s->o));
    forward_project_out(s, li, n);
    forward_attention_residual(s, li, n);
    TIMED(hadamard_ms, ops->monarch_mlp(&s->bk, li, n, s->h, s->attn));
    forward_write_lanes(s, li, n);
}

/* By default the whole context (the reference forward has no KV window; local layers
 * keep their own sliding window inside the cache), and a window that holds every local
 * one. W·A8 also quantizes the query, key and value heads inside attention3, at the
 * file's kv_bits; only 8 (per-head int8, what the exporter writes) is implemented, not
 * the CQ-quantized KV of kv_bits 2-4. */
static int needle3_session_check(const needle_model *m, int32_t kv_window, int a8,
                                 uint32_t *window) {
    *window = kv_window < 0 ? 0 : (uint32_t)kv_window;
    if (a8 && m->info.kv_bits != 8)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: the W·A8 mode "
                           "(activations = A8 or NEEDLE_A8=1) supports Needle 3 files made for "
                           "an 8-bit KV cache; this one has kv_bits %u", m->info.kv_bits);
    for (uint32_t i = 0; i < m->w.n_layers; i++)
        if (*window && m->w.layers3[i].window > *window)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: kv_window %u is "
                               "shorter than the model's local window %u", *window,
                               m->w.layers3[i].window);
    return NEEDLE_OK;
}

const model_arch model_arch_needle3 = {
    .generation = 3,
    .name = "Needle 3",
    .bind = model3_bind,
    .unbind = model3_unbind,
    .layer = needle3_layer,
    .session_check = needle3_session_check,
};
