/* The Needle 2 architecture (spec §3): its layer over forward.c's shared steps, its
 * session rules, and its descriptor (arch.h). */
#include "model/session.h"
#include "util/clock.h"
#include "util/error.h"

/* One layer over the chunk (§3.4-3.7): lane mixing, the lane read, RoPE attention, the
 * residual, the Hadamard MLP and the lane write. */
static void needle2_layer(struct model_session *s, uint32_t li, uint32_t p0, uint32_t n) {
    const needle_backend_ops *ops = s->ops;
    forward_mix_lanes(s, li, n);
    forward_read_lanes(s, li, n);
    forward_project_qkvg(s, li, n);
    TIMED(attention_ms,
          ops->attention(&s->bk, li, p0, n, s->rope_cs, s->q, s->k, s->v, s->gate, s->o));
    forward_project_out(s, li, n);
    forward_attention_residual(s, li, n);
    TIMED(hadamard_ms, ops->hadamard_mlp(&s->bk, li, n, s->h, s->attn));
    forward_write_lanes(s, li, n);
}

/* By default the file's KV window (spec §3.6); every KV type and W·A8 are supported. */
static int needle2_session_check(const needle_model *m, int32_t kv_window, int a8,
                                 uint32_t *window) {
    (void)a8;
    *window = kv_window < 0 ? m->info.kv_window : (uint32_t)kv_window;
    return NEEDLE_OK;
}

/* Needle 2 binds nothing beyond the shared fields model_unbind frees. */
static void needle2_unbind(struct needle_model *m) { (void)m; }

const model_arch model_arch_needle2 = {
    .generation = 2,
    .name = "Needle 2",
    .bind = model2_bind,
    .unbind = needle2_unbind,
    .layer = needle2_layer,
    .session_check = needle2_session_check,
};
