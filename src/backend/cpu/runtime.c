/* The CPU backend's session runtime (runtime.h): the per-session state and its kernel
 * level, work sharing over the pool, host memory, the KV cache rows. */
#include "backend/cpu/runtime.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fp16.h"
#include "util/platform.h"

cpu_level cpu_level_of(const cpu_kernels *cq, uint32_t n_lanes) {
    cpu_level l = {.cq = cq};
    const char *vector = cpu_kernels_vector_level(cq);
    l.a8 = a8_kernels_named(vector);
    if (!l.a8) l.a8 = &a8_kernels_scalar;
    /* the AVX2/AVX-512 lane ops (their 4-lane write and read need n_lanes 4) */
    l.lane_wide = n_lanes == 4 ? lane_wide_kernels_named(vector) : NULL;
    l.monarch = monarch_kernels_named(vector);
    if (!l.monarch) l.monarch = &monarch_kernels_scalar;
    return l;
}

/* Rotates x for products with w, or under W·A8 (a QAT point) writes its quantized row
 */
void cpu_act_rotate(const backend_ctx *s, const cq_matrix *w, const float *x, float *out) {
    const cpu_session *c = cs_of(s);
    if (s->a8) c->level.a8->rotate(w, x, out);
    else c->level.cq->rotate(w, x, out);
}

/* ---- work sharing over the pool ---------------------------------------------------- */

typedef struct par_loop {
    backend_ctx *s;
    const void *ctx;
    cpu_item_fn body;
    uint32_t n;
    atomic_uint next; /* the next item not yet taken */
} par_loop;

static void par_worker(void *arg, int thread, int n_threads) {
    (void)n_threads;
    par_loop *L = arg;
    for (;;) {
        const uint32_t i = atomic_fetch_add_explicit(&L->next, 1, memory_order_relaxed);
        if (i >= L->n) break;
        L->body(L->s, L->ctx, i, thread);
    }
}

/* Items are taken from a shared counter by the pool's threads; a single item runs on the
 * caller (a dispatch costs more than one token's vector work). */
void cpu_par_for(backend_ctx *s, uint32_t n, cpu_item_fn body, const void *ctx) {
    cpu_session *c = cs_of(s);
    if (n < 2 || c->n_threads < 2) {
        for (uint32_t i = 0; i < n; i++) body(s, ctx, i, 0);
        return;
    }
    par_loop L = {.s = s, .ctx = ctx, .body = body, .n = n};
    atomic_init(&L.next, 0);
    cpu_pool_run_shared(c->pool, par_worker, &L);
}

/* ---- session state -------------------------------------------------------------------- */

void *cpu_alloc(backend_ctx *s, size_t bytes) {
    (void)s;
    return calloc(bytes ? bytes : 1, 1);
}

void cpu_release(backend_ctx *s, void *p) {
    (void)s;
    free(p);
}

void cpu_copy(backend_ctx *s, void *dst, const void *src, size_t bytes) {
    (void)s;
    if (bytes) memcpy(dst, src, bytes);
}

void cpu_session_free(backend_ctx *s) {
    cpu_session *c = cs_of(s);
    if (!c) return;
    free(c->eng_e);
    free(c->th);
    platform_aligned_free(c->th_mem);
    free(c->out_rot);
    cpu_pool_free(c->pool);
    free(c);
    s->dev = NULL;
}

/* One cpu_scratch per pool thread, each starting on its own 64-byte line; `tmp` floats of
 * c->th[i].tmp. Returns 0, or -1 when out of memory. */
static int thread_scratch_alloc(cpu_session *c, const model_weights *m, size_t tmp) {
    c->n_threads = cpu_pool_threads(c->pool);
    const size_t lane = (size_t)m->n_lanes * m->d;
    const size_t per = (m->hada_n + lane + tmp + 15) / 16 * 16;
    const size_t bytes = (size_t)c->n_threads * per * sizeof(float);
    c->th = calloc((size_t)c->n_threads, sizeof *c->th);
    c->th_mem = platform_aligned_alloc(64, bytes);
    if (!c->th || !c->th_mem) return -1;
    memset(c->th_mem, 0, bytes);
    for (int i = 0; i < c->n_threads; i++) {
        float *base = c->th_mem + (size_t)i * per;
        c->th[i].hada = base;
        c->th[i].lane_old = base + m->hada_n;
        c->th[i].tmp = base + m->hada_n + lane;
    }
    return 0;
}

int cpu_session_init(backend_ctx *s) {
    const cpu_kernels *kern = cpu_kernels_best();
    const model_weights *m = s->m;
    /* W·A8 rounds activations to int8 steps, so it keeps float32 products (the AMX
     * level's split bf16 ones move values across those steps' edges: tests/parity's QAT
     * check) */
    if (s->a8 && !strcmp(kern->name, "amx") && cpu_kernels_avx512()) kern = cpu_kernels_avx512();
    if (kern->prefill_chunk > s->chunk) s->chunk = kern->prefill_chunk;
    cpu_session *c = calloc(1, sizeof *c);
    if (!c) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "session: out of memory");
    s->dev = c;
    const size_t d = m->d, kvd = m->kv_dim;
    size_t tmp = m->group;
    if (tmp < 2 * d) tmp = 2 * d;
    if (tmp < 2 * kvd) tmp = 2 * kvd;
    /* the Monarch MLP and the spanned attention keep their vectors in this scratch */
    if ((m->traits.mlp == MODEL_MLP_MONARCH || m->traits.attention == MODEL_ATTN_SPANNED) &&
        tmp < cpu_layer3_scratch_floats(m))
        tmp = cpu_layer3_scratch_floats(m);
    /* prefill attention blocks (attend_kv_heads, attend3_kv_heads) keep their scores in
     * this scratch */
    if (m->traits.attention == MODEL_ATTN_ROPE && kern->attend_block &&
        tmp < attn_block_scratch_floats(m->head_dim, m->head_dim))
        tmp = attn_block_scratch_floats(m->head_dim, m->head_dim);
    if (m->traits.attention == MODEL_ATTN_SPANNED && kern->attend_block &&
        tmp < attn_block_scratch_floats(m->qk_dim, m->v_dim))
        tmp = attn_block_scratch_floats(m->qk_dim, m->v_dim);
    /* engram header fields are only validated (and meaningful) when there are sites */
    c->eng_e = calloc(m->n_sites ? (size_t)m->n_tables * m->sub_dim : 1, sizeof(float));
    c->out_rot = calloc((size_t)s->chunk * m->embedding.cols_pad, sizeof(float));
    /* kernel scratch: activations of a whole chunk for the widest matrix input */
    uint32_t widest = m->embedding.cols_pad;
    const uint32_t ins[] = {m->phi_pre.cols_pad, m->layers[0].q_proj.cols_pad,
                            m->layers[0].out_proj.cols_pad,
                            m->n_sites ? m->sites[0].key_proj.cols_pad : 0};
    for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++)
        if (ins[i] > widest) widest = ins[i];
    if (!c->eng_e || !c->out_rot ||
        cpu_pool_create(s->n_threads, kern, cq_scratch_floats(widest, s->chunk), &c->pool) !=
            NEEDLE_OK ||
        thread_scratch_alloc(c, m, tmp) != 0) {
        cpu_session_free(s);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "session: out of memory for CPU scratch");
    }
    c->level = cpu_level_of(cpu_pool_kernels(c->pool), m->n_lanes);
    if (s->a8) {
        const cq_matrix *act[] = {&m->layers[0].q_proj, &m->layers[0].out_proj, &m->embedding,
                                  m->n_sites ? &m->sites[0].key_proj : &m->embedding,
                                  m->traits.phi_a8 ? &m->phi_pre : &m->embedding};
        for (size_t i = 0; i < sizeof act / sizeof act[0]; i++)
            if (!a8_supported(act[i])) {
                cpu_session_free(s);
                return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session: W·A8 needs CQ "
                                   "groups of 8..%u and inputs of at most %u columns",
                                   A8_MAX_GROUP, A8_MAX_COLS);
            }
        if (m->traits.heads_a8 && (m->qk_dim > A8_MAX_COLS || m->v_dim > A8_MAX_COLS)) {
            cpu_session_free(s);
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session: W·A8 needs head dims "
                               "of at most %u", A8_MAX_COLS);
        }
    }
    return NEEDLE_OK;
}

/* ---- KV cache access in the session's precision ---------------------------------- */

/* Stores values [off, off + n) of one token's K (which = 0) or V (1) row, x[0..n), into
 * cache row `row` (backend.h kv_layers); `width` is the row's used width. int8: `off`
 * starts a scale group and the slice ends on a group boundary or at `width`, so the
 * groups it writes are its own (the row's last group may be shorter). */
void cpu_kv_store(backend_ctx *s, int which, size_t row, uint32_t off, uint32_t n,
                  uint32_t width, const float *x) {
    const uint32_t kvd = s->m->kv_dim;
    const size_t at = row * kvd + off;
    void *base = which ? s->v_cache : s->k_cache;
    if (s->kv_type == NEEDLE_KV_F32) {
        memcpy((float *)base + at, x, n * sizeof(float));
    } else if (s->kv_type == NEEDLE_KV_F16) {
        uint16_t *dst = (uint16_t *)base + at;
        for (uint32_t i = 0; i < n; i++) dst[i] = f32_to_fp16(x[i]);
    } else {
        int8_t *dst = (int8_t *)base + at;
        float *scales = s->kv_scales + ((size_t)which * s->kv_rows + row) * KV_SCALE_GROUPS(kvd);
        for (uint32_t c0 = off; c0 < off + n; c0 += KV_SCALE_GROUP) {
            const uint32_t c1 = width - c0 < KV_SCALE_GROUP ? width : c0 + KV_SCALE_GROUP;
            float amax = 0.0f;
            for (uint32_t i = c0; i < c1; i++) amax = fmaxf(amax, fabsf(x[i - off]));
            const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
            scales[c0 / KV_SCALE_GROUP] = scale;
            for (uint32_t i = c0; i < c1; i++) dst[i - off] = (int8_t)lrintf(x[i - off] / scale);
        }
    }
}

/* The slots of layer L of positions [0, n_sink) and [tail0, t] in position order, as
 * runs of consecutive slots: the sinks, then the tail (which wraps around the layer's
 * ring at most once). Returns the number of runs (at most 3). */
uint32_t cpu_kv_runs(const kv_layer_layout *L, uint32_t n_sink, uint32_t tail0, uint32_t t,
                     attn_run *runs) {
    uint32_t nr = 0;
    if (n_sink) runs[nr++] = (attn_run){0, n_sink};
    for (uint32_t p = tail0; p <= t;) {
        const uint32_t slot = nm_kv_slot(p, L->n_sinks, L->window);
        uint32_t run = t + 1 - p;
        if (L->window && slot + run > L->n_sinks + L->window) run = L->n_sinks + L->window - slot;
        runs[nr++] = (attn_run){slot, run};
        p += run;
    }
    return nr;
}

/* ---- shared by the attention ops ----------------------------------------------------- */

typedef struct out_rotate_args {
    const cq_matrix *w;
    float *o;
    size_t o_ld;
} out_rotate_args;

static void out_rotate_token(backend_ctx *s, const void *ctx, uint32_t i, int thread) {
    (void)thread;
    const out_rotate_args *r = ctx;
    float *o = r->o + (size_t)i * r->o_ld;
    cpu_act_rotate(s, r->w, o, o); /* W·A8: the QAT point of the gated attention output */
}

void cpu_out_rotate(backend_ctx *s, const cq_matrix *w, float *o, uint32_t n) {
    const out_rotate_args r = {w, o, w->cols_pad};
    cpu_par_for(s, n, out_rotate_token, &r);
}

void cpu_thread_stats(const backend_ctx *s, uint64_t *dispatches, double *sync_ms) {
    uint64_t ns = 0;
    cpu_pool_sync_stats(cs_of(s)->pool, dispatches, &ns);
    *sync_ms = (double)ns / 1e6;
}
