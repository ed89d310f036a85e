/* Backends (STYLE.md item 4): one struct of function pointers per compute backend, a
 * static table of the backends compiled into this library, and the selection rule.
 *
 * Selection, first match wins:
 *   1. an explicit name (needle_model_params.backend), NULL or "" meaning auto;
 *   2. env NEEDLE_BACKEND = cpu | cuda | metal;
 *   3. env JAX_PLATFORM_NAME = cpu | gpu | cuda | metal (gpu means cuda);
 *   4. the first compiled-in backend whose probe finds a device; CPU is last.
 * A forced backend that is unknown, not compiled in, or without a device is an error
 * (NEEDLE_ERR_BACKEND, message naming the available ones), never a silent fallback.
 *
 * The forward pass (model/forward.c) is one piece of code shared by every backend; it
 * calls the operations of needle_backend_ops below and never touches activation memory
 * itself. Memory model:
 *   - "backend memory" is what ops->alloc returns: host memory for the CPU, device memory
 *     for CUDA (the pointers are only offset, never dereferenced, by shared code), a
 *     shared MTLBuffer's contents for Metal. Activations, the KV cache and the engram ring
 *     live there, so a device backend keeps them on the device across tokens.
 *   - arguments marked "host" are host memory (token ids, engram slots, RoPE angles, the
 *     logits handed to the caller); a device backend uploads/downloads them itself.
 *   - weights are passed as the model's host-side views (cq_matrix, layer_weights); a
 *     device backend uploads the image once per model (model_load) and translates.
 * Row strides ("ld") are in floats. Every op works on `n` tokens of the current chunk in
 * order; per-token results must not depend on the chunk split except through rounding.
 * Version of this interface: NEEDLE_BACKEND_ABI. */
#ifndef NEEDLE_BACKEND_BACKEND_H
#define NEEDLE_BACKEND_BACKEND_H

#include "kernels/cpu/cpu.h"
#include "model/model.h"
#include "needle.h"

#define NEEDLE_BACKEND_ABI 1

/* Engram slot value meaning "this n-gram does not exist yet": the table row is zeros. */
#define ENGRAM_MASKED 0xFFFFFFFFu

struct needle_session;

typedef struct needle_backend_ops {
    /* ---- weights, once per model (optional: NULL when the ops read host weights) ---- */
    int (*model_load)(struct needle_model *m);    /* sets m->device_weights */
    void (*model_unload)(struct needle_model *m); /* NULL device_weights is a no-op */

    /* ---- session state ---------------------------------------------------------------- */
    /* Called first; sets s->dev (threads, streams, scratch sized by s->chunk). 0 or a
     * negative needle_status. session_free releases it (NULL s->dev is a no-op). */
    int (*session_init)(struct needle_session *s);
    void (*session_free)(struct needle_session *s);
    void *(*alloc)(struct needle_session *s, size_t bytes); /* zeroed; NULL on failure */
    void (*release)(struct needle_session *s, void *p);     /* NULL is a no-op */
    void (*upload)(struct needle_session *s, void *dst, const void *host_src, size_t bytes);
    void (*download)(struct needle_session *s, void *host_dst, const void *src, size_t bytes);

    /* ---- the operations of spec §3 -------------------------------------------------------- */
    /* §3.2: lanes[i][r] = sqrt(d) * Deq(embedding)[tokens[i]] for every lane r.
     * tokens: host [n]; lanes: [n][n_lanes][d]. */
    void (*embed)(struct needle_session *s, const int32_t *tokens, uint32_t n, float *lanes);

    /* One batch of CQ products over the same rotated activations xr [ntok][ld_x]; the
     * jobs' y point into backend memory (see cpu_matmul). */
    void (*matmul)(struct needle_session *s, const float *xr, size_t ld_x, uint32_t ntok,
                   const cq_job *jobs, uint32_t njobs);

    /* §3.3 gather: e = concat_j Deq(tables)[j*slots + slot[i][j]] (zeros for
     * ENGRAM_MASKED), rotated for key_proj into er[i] (ld key_proj.cols_pad).
     * slots: host [n][n_tables]. */
    void (*engram_gather)(struct needle_session *s, const engram_site *es,
                          const uint32_t *slots, uint32_t n, float *er);

    /* §3.3 conv: for token i at t = p0 + i, ring[t % ev_ring] = vhat[i], then
     * ev[i] = sum_tap taps[tap] * ring[(t - tap*dil) % ev_ring] over taps with
     * tap*dil <= t. ring: [ev_ring][d]; vhat, ev: [n][d]. */
    void (*engram_conv)(struct needle_session *s, const engram_site *es, float *ring,
                        const float *vhat, uint32_t p0, uint32_t n, float *ev);

    /* §3.4: nx[i] = rotate_{phi_pre}(rms_unit(vec(lanes[i]))), ld phi_pre.cols_pad. */
    void (*lane_norm)(struct needle_session *s, const float *lanes, uint32_t n, float *nx);

    /* §3.4-3.5 lane read: u = sum_r hpre[r] * X[r] from mix[i] ([n][2n+n*n]: pre, post,
     * res projections); bx = u + alpha * ev (engram site) or u; hr[i] = rotate_{q_proj}(
     * ZC(bx; norm_in)) (ld q_proj.cols_pad). ek, ev: [n][d] or NULL without a site. */
    void (*lane_read)(struct needle_session *s, uint32_t layer, uint32_t n, const float *lanes,
                      const float *mix, const float *ek, const float *ev, float *u, float *bx,
                      float *hr);

    /* §3.6 for tokens at t = p0 + i, in order: q/k ZC norm and RoPE (rope_cs: host
     * [n][head_dim] = cos | sin), append k, v to the KV cache, attend over the window and
     * sinks, o *= sigmoid(gate), o[i] rotated for out_proj (ld out_proj.cols_pad).
     * q, gate: [n][A]; k, v: [n][kv_dim] (q, k are overwritten). */
    void (*attention)(struct needle_session *s, uint32_t layer, uint32_t p0, uint32_t n,
                      const float *rope_cs, float *q, float *k, const float *v,
                      const float *gate, float *o);

    /* §3.5: attn := ZC(attn; post_norm); x = bx + sigmoid(attn_gate) * attn;
     * h = ZC(x; pre_hada). All [n][d]. */
    void (*attn_residual)(struct needle_session *s, uint32_t layer, uint32_t n, float *attn,
                          const float *bx, float *x, float *h);

    /* §3.7: out[i] = HadamardMLP(h[i]); [n][d]; out may not alias h. */
    void (*hadamard_mlp)(struct needle_session *s, uint32_t layer, uint32_t n, const float *h,
                         float *out);

    /* §3.4 lane write: y = x + mlp - u (written to mlp), hpost, P = Sinkhorn(res logits),
     * lanes[i][r] = sum_c P[r][c] * lanes[i][c] + hpost[r] * y. */
    void (*lane_write)(struct needle_session *s, uint32_t layer, uint32_t n, const float *mix,
                       const float *x, float *mlp, const float *u, float *lanes);

    /* §3.8 for lanes[0:count]: out (host [count][vocab]) = tied logits of ZC(mean lanes;
     * final_norm); argmax (host [count], optional): the first maximal id. */
    void (*logits)(struct needle_session *s, const float *lanes, uint32_t count, float *out,
                   int32_t *argmax);

    /* Optional: waits for the queued work; 0 or a negative needle_status (with a message)
     * for a device error seen since the last call. Called at the end of each forward. */
    int (*finish)(struct needle_session *s);
} needle_backend_ops;

typedef struct needle_backend_impl {
    const char *name;                /* "cpu", "cuda", "metal" */
    int (*probe)(void);              /* 1 if usable here (a device was found), else 0 */
    int (*device_count)(void);       /* devices of this backend (0 if none) */
    /* fills out (backend, name, memory, units, capability; is_default is left 0) */
    int (*device_info)(int index, needle_device_info *out);
    const needle_backend_ops *ops;   /* what sessions of a model on this backend call */
} needle_backend_impl;

/* The CPU operations (backend/cpu_ops.c): the reference every other backend is tested
 * against. */
extern const needle_backend_ops cpu_backend_ops;

/* The compiled-in backends in probe order (CPU last); `*n` receives the count. */
const needle_backend_impl *const *backend_table(size_t *n);

/* The compiled-in backend called `name` (case-insensitive), or NULL. */
const needle_backend_impl *backend_find(const char *name);

/* Applies the selection rule above. On success stores the backend in *out and returns
 * NEEDLE_OK; otherwise returns NEEDLE_ERR_BACKEND with a message (needle_last_error). */
int backend_select(const char *explicit_name, const needle_backend_impl **out);

#endif
