/* The CPU backend's session runtime (runtime.c), what its operations share: the session
 * state behind backend_ctx.dev, the kernel level chosen once per session, work sharing
 * over the session's pool, each pool thread's scratch, and the KV cache rows.
 *
 * The CPU backend is this folder: runtime.c (this), ops.c (the operations of the Needle 2
 * layer and everything shared, and the table cpu_backend_ops), spanned_attention.c and
 * monarch_mlp.c (the operations of the Needle 3 layer). The ops files include this
 * header and ops.h, never one another. */
#ifndef NEEDLE_BACKEND_CPU_RUNTIME_H
#define NEEDLE_BACKEND_CPU_RUNTIME_H

#include "backend/backend.h"
#include "kernels/cpu/a8.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/lane_wide.h"
#include "kernels/cpu/monarch.h"

/* Scratch of one pool thread (index 0: the caller). */
typedef struct cpu_scratch {
    float *hada;     /* [hada_n] */
    float *lane_old; /* [n_lanes * d] (lane write: a block of columns before it) */
    float *tmp;      /* [max(group, 2*d, 2*kv_dim, cpu_layer3_scratch_floats)] */
} cpu_scratch;

/* The kernel tables of one instruction-set level (kernels/cpu: plain, AVX2, AVX-512,
 * NEON), chosen once per session from its pool's level, so no operation looks a table up
 * by name. */
typedef struct cpu_level {
    const cpu_kernels *cq;              /* CQ products, rotations, attention, dequant */
    const a8_kernels *a8;               /* W·A8 of the same level (used when s->a8) */
    const lane_wide_kernels *lane_wide; /* 4-lane read and write (AVX2/AVX-512), or NULL */
    const monarch_kernels *monarch;     /* row combinations: Monarch MLP, conv taps */
} cpu_level;

/* The tables of the level of `cq` for a model of n_lanes lanes. */
cpu_level cpu_level_of(const cpu_kernels *cq, uint32_t n_lanes);

/* Per-session CPU state: the pool, its kernels and host scratch. */
typedef struct cpu_session {
    cpu_pool *pool;
    cpu_level level;
    int n_threads;     /* the pool's, the caller included */
    cpu_scratch *th;   /* [n_threads] */
    float *th_mem;     /* backs every th[i] */
    float *eng_e;      /* [T * sub] one token's gathered engram rows */
    float *out_rot;    /* [chunk][d padded] rotated final hidden */
} cpu_session;

static inline cpu_session *cs_of(const backend_ctx *s) { return (cpu_session *)s->dev; }

/* Pool thread `thread`'s scratch: at least cpu_layer3_scratch_floats(m) and 2 * kv_dim
 * floats. */
static inline float *cpu_thread_tmp(const backend_ctx *s, int thread) {
    return cs_of(s)->th[thread].tmp;
}

/* Tokens per item of the Monarch MLP (monarch_mlp.c): their rank-8 conditions are
 * computed together. */
#define CPU_MONARCH_TILE 8u

/* Floats of per-thread scratch (cpu_thread_tmp) the Needle 3 ops need. */
static inline size_t cpu_layer3_scratch_floats(const model_weights *m) {
    return 3 * (size_t)m->hada_n + CPU_MONARCH_TILE * MODEL3_COND_RANK + 16;
}

/* ---- the backend ops of session state (backend.h) ------------------------------------ */
int cpu_session_init(backend_ctx *s);
void cpu_session_free(backend_ctx *s);
void *cpu_alloc(backend_ctx *s, size_t bytes);
void cpu_release(backend_ctx *s, void *p);
void cpu_copy(backend_ctx *s, void *dst, const void *src, size_t bytes);
void cpu_thread_stats(const backend_ctx *s, uint64_t *dispatches, double *sync_ms);

/* ---- work sharing ----------------------------------------------------------------------- */

/* One item of a parallel loop; `thread` (0 = the caller) selects the scratch. */
typedef void (*cpu_item_fn)(backend_ctx *s, const void *ctx, uint32_t item, int thread);

/* Runs body(s, ctx, i, thread) once for every i in [0, n) on the session's pool; returns
 * when all items are done. */
void cpu_par_for(backend_ctx *s, uint32_t n, cpu_item_fn body, const void *ctx);

/* x rotated for products with w, or under W·A8 (a QAT point) its quantized row. */
void cpu_act_rotate(const backend_ctx *s, const cq_matrix *w, const float *x, float *out);

/* The n attention output rows o[i * w->cols_pad] rotated in place for the product with w
 * (quantized under W·A8), over the session's pool. */
void cpu_out_rotate(backend_ctx *s, const cq_matrix *w, float *o, uint32_t n);

/* ---- KV cache rows in the session's precision ----------------------------------------- */

/* The uniform layout (backend.h kv_layers): layer `layer`'s `slot`. */
static inline size_t cpu_kv_index(const backend_ctx *s, uint32_t layer, uint32_t slot) {
    return ((size_t)layer * s->kv_slots + slot) * s->m->kv_dim;
}

static inline uint32_t cpu_kv_slot(const backend_ctx *s, uint32_t p) {
    return nm_kv_slot(p, s->n_sinks, s->window);
}

/* Scales of int8 cache row (layer, slot): KV_SCALE_GROUPS(kv_dim) floats. */
static inline float *cpu_kv_row_scales(const backend_ctx *s, int which, uint32_t layer,
                            uint32_t slot) {
    const size_t rows = (size_t)s->m->n_layers * s->kv_slots;
    return s->kv_scales + ((size_t)which * rows + (size_t)layer * s->kv_slots + slot) *
                              KV_SCALE_GROUPS(s->m->kv_dim);
}


/* K (which 0) or V (1) values [off, off + n) of cache row `row`, `width` the row's used
 * width (int8 groups end there). */
void cpu_kv_store(backend_ctx *s, int which, size_t row, uint32_t off, uint32_t n,
                  uint32_t width, const float *x);

/* Layer L's slots of positions [0, n_sink) and [tail0, t] as runs of consecutive slots
 * (at most 3). */
uint32_t cpu_kv_runs(const kv_layer_layout *L, uint32_t n_sink, uint32_t tail0, uint32_t t,
                     attn_run *runs);

#endif
