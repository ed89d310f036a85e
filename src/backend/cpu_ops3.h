/* The CPU backend's Needle 3 operations (cpu_ops3.c); see backend.h (attention3,
 * monarch_mlp) for what they compute. Declared for the CPU ops table in cpu_ops.c, with
 * what cpu_ops.c shares with them: its work sharing over the session's pool and the
 * pool threads' scratch. */
#ifndef NEEDLE_BACKEND_CPU_OPS3_H
#define NEEDLE_BACKEND_CPU_OPS3_H

#include "backend/backend.h"
#include "kernels/cpu/cpu.h"

void cpu_attention3(backend_ctx *s, uint32_t layer, uint32_t p0, uint32_t n,
                    const float *rope_cs, float *q, float *k, float *v, const float *gate,
                    float *o);
void cpu_monarch_mlp(backend_ctx *s, uint32_t layer, uint32_t n, const float *h, float *out);
/* cpu_ops.c: x rotated for products with w, or under W·A8 its quantized row. */
void cpu_act_rotate(const backend_ctx *s, const cq_matrix *w, const float *x, float *out);
/* cpu_ops.c: the n attention output rows o[i * w->cols_pad] rotated in place for the
 * product with w (quantized under W·A8), over the session's pool. */
void cpu_out_rotate(backend_ctx *s, const cq_matrix *w, float *o, uint32_t n);

/* cpu_ops.c: K (which 0) or V (1) values [off, off + n) of cache row `row`, `width` the
 * row's used width (int8 groups end there). */
void cpu_kv_store(backend_ctx *s, int which, size_t row, uint32_t off, uint32_t n,
                  uint32_t width, const float *x);
/* cpu_ops.c: layer L's slots of positions [0, n_sink) and [tail0, t] as runs of
 * consecutive slots (at most 3). */
uint32_t cpu_kv_runs(const kv_layer_layout *L, uint32_t n_sink, uint32_t tail0, uint32_t t,
                     attn_run *runs);

/* Floats of per-thread scratch (cpu_thread_tmp) the Needle 3 ops need. */
static inline size_t cpu_ops3_scratch_floats(const model_weights *m) {
    return 3 * (size_t)m->hada_n + 16;
}

/* One item of a parallel loop; `thread` (0 = the caller) selects the scratch. */
typedef void (*cpu_item_fn)(backend_ctx *s, const void *ctx, uint32_t item, int thread);

/* Runs body(s, ctx, i, thread) for every i in [0, n) on the session's pool (cpu_ops.c). */
void cpu_par_for(backend_ctx *s, uint32_t n, cpu_item_fn body, const void *ctx);

/* Pool thread `thread`'s scratch: at least cpu_ops3_scratch_floats(m) and 2 * kv_dim
 * floats. */
float *cpu_thread_tmp(const backend_ctx *s, int thread);

/* The kernel level of the session's pool. */
const cpu_kernels *cpu_session_kernels(const backend_ctx *s);

#endif
