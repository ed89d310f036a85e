/* Backends (STYLE.md item 4): one struct of function pointers per compute backend, a
 * static table of the backends compiled into this library, and the selection rule.
 *
 * Selection, first match wins:
 *   1. an explicit name (needle_model_params.backend), NULL or "" meaning auto;
 *   2. env NEEDLE_BACKEND = cpu | cuda | metal;
 *   3. env JAX_PLATFORMS, a list tried in order (gpu means cuda);
 *   4. env JAX_PLATFORM_NAME = cpu | gpu | cuda | metal (gpu means cuda);
 *   5. the first compiled-in backend whose probe finds a device; CPU is last.
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
 *   - weights are passed as the model's host-side views (backend/weights.h: cq_matrix,
 *     layer_weights, engram_site); a device backend uploads the image once per model
 *     (model_load) and translates.
 * The ops never see the session (model/session.h, a layer above): they get a
 * backend_ctx, the plain context below, which the session fills and owns. Everything an
 * op reads or writes is either in that context or one of its arguments.
 * Row strides ("ld") are in floats. Every op works on `n` tokens of the current chunk in
 * order; per-token results must not depend on the chunk split except through rounding.
 * Every backend is compiled into the library with this header, so there is no version
 * to check: the tables name their fields (designated initializers) and a field a
 * backend does not set is NULL. */
#ifndef NEEDLE_BACKEND_BACKEND_H
#define NEEDLE_BACKEND_BACKEND_H

#include "backend/weights.h"
#include "kernels/cpu/cpu.h"
#include "kernels/nmath.h"
#include "needle.h"

/* Engram slot value meaning "this n-gram does not exist yet": the table row is zeros. */
#define ENGRAM_MASKED 0xFFFFFFFFu

#define KV_SCALE_GROUP 32u
/* int8 scale groups per cache row of `kvd` values (the last group may be partial) */
#define KV_SCALE_GROUPS(kvd) (((kvd) + KV_SCALE_GROUP - 1) / KV_SCALE_GROUP)

/* What the operations of one session work with: the weights, the backend's own state,
 * and the KV cache and engram ring, which live in backend memory.
 *
 * KV cache layout, per layer: `n_sinks` pinned slots for positions [0, n_sinks), then a
 * ring of `window` slots for later positions (nm_kv_slot in kernels/nmath.h); with no
 * window the ring is the whole context. The layers' rows follow one another (kv_layers:
 * a Needle 3 local layer may have a ring of its own window and no sinks). */
typedef struct backend_ctx {
    const model_weights *m;
    void *device_weights; /* the model's ops->model_load result, or NULL */
    void *dev;            /* the backend's per-session state (threads, streams, scratch) */
    uint32_t chunk;       /* tokens per forward chunk: the most any op is given at once */
    int32_t n_threads;    /* CPU threads asked for (0 = NEEDLE_THREADS or the cores) */

    uint32_t window;      /* 0 = full causal attention */
    uint32_t n_sinks;
    uint32_t kv_slots;    /* per global layer (the most any layer has) */
    int32_t kv_type;      /* needle_kv_type */
    void *k_cache, *v_cache; /* [kv_rows][kv_dim] in kv_type, by layer (kv_layers) */
    float *kv_scales;     /* int8 cache: [2][kv_rows][KV_SCALE_GROUPS(kv_dim)] */
    float *scores;        /* [n_heads][kv_slots] attention scratch */

    uint32_t ev_ring;     /* engram ring length: (taps - 1) * dilation + 1 */

    /* W·A8 (spec §5.3): the ops that end at one of the four QAT points (lane_read's hr,
     * attention's o, engram_gather's er, the logits' final hidden) write quantized rows
     * for matmul_a8 instead of rotated floats. Set before session_init. */
    int a8;
    /* the attention's conv taps (model conv_taps > 0; NULL / 0 otherwise) */
    float *qkv_hist;      /* conv taps: raw q|k|v projections of the last `qkv_ring`
                           * positions, [layer][qkv_ring][H*qk + KV*qk + KV*v], ring by
                           * position (lives after the engram ring in the session's
                           * ev_hist, so checkpoints carry it) */
    uint32_t qkv_ring;    /* conv_taps (>= 1) */
    /* Where each layer's rows are: layer l's positions t live in cache rows
     * kv_layers[l].row0 + nm_kv_slot(t, kv_layers[l].n_sinks, kv_layers[l].window), and
     * kv_rows is the sum of the layers' slots (int8 scales: [2][kv_rows][groups]). The
     * uniform layout gives layer l rows [l * kv_slots, (l + 1) * kv_slots) with the
     * session's sinks and window; with ops->kv_per_layer a Needle 3 local layer gets a
     * ring of exactly its own window instead (session.c kv_cache_alloc). Host memory. */
    const struct kv_layer_layout *kv_layers; /* [n_layers] */
    size_t kv_rows;
} backend_ctx;

typedef struct kv_layer_layout {
    size_t row0;      /* first cache row of the layer */
    uint32_t slots;   /* its rows */
    uint32_t n_sinks; /* its pinned positions, then a ring of `window` (0: no ring) */
    uint32_t window;
} kv_layer_layout;

typedef struct needle_backend_ops {
    /* ---- weights, once per model (optional: NULL when the ops read host weights) ---- */
    /* 0 or a negative needle_status; *device_weights is what backend_ctx carries */
    int (*model_load)(const model_weights *m, void **device_weights);
    void (*model_unload)(void *device_weights); /* NULL is a no-op */

    /* ---- session state ---------------------------------------------------------------- */
    /* Called first, with m, device_weights, chunk and n_threads set; sets s->dev
     * (threads, streams, scratch sized by s->chunk), and may raise s->chunk where its
     * kernels want more tokens at once. 0 or a negative needle_status.
     * session_free releases it (NULL s->dev is a no-op). */
    int (*session_init)(backend_ctx *s);
    void (*session_free)(backend_ctx *s);
    void *(*alloc)(backend_ctx *s, size_t bytes); /* zeroed; NULL on failure */
    void (*release)(backend_ctx *s, void *p);     /* NULL is a no-op */
    void (*upload)(backend_ctx *s, void *dst, const void *host_src, size_t bytes);
    void (*download)(backend_ctx *s, void *host_dst, const void *src, size_t bytes);

    /* ---- the operations of spec §3 -------------------------------------------------------- */
    /* §3.2: lanes[i][r] = sqrt(d) * Deq(embedding)[tokens[i]] for every lane r.
     * tokens: host [n]; lanes: [n][n_lanes][d]. */
    void (*embed)(backend_ctx *s, const int32_t *tokens, uint32_t n, float *lanes);

    /* One batch of CQ products over the same rotated activations xr [ntok][ld_x]; the
     * jobs' y point into backend memory (see cpu_matmul). */
    void (*matmul)(backend_ctx *s, const float *xr, size_t ld_x, uint32_t ntok,
                   const cq_job *jobs, uint32_t njobs);

    /* §3.3 gather: e = concat_j Deq(tables)[j*slots + slot[i][j]] (zeros for
     * ENGRAM_MASKED), rotated for key_proj into er[i] (ld key_proj.cols_pad).
     * slots: host [n][n_tables]. */
    void (*engram_gather)(backend_ctx *s, const engram_site *es,
                          const uint32_t *slots, uint32_t n, float *er);

    /* §3.3 conv: for token i at t = p0 + i, ring[t % ev_ring] = vhat[i], then
     * ev[i] = sum_tap taps[tap] * ring[(t - tap*dil) % ev_ring] over taps with
     * tap*dil <= t. ring: [ev_ring][d]; vhat, ev: [n][d]. */
    void (*engram_conv)(backend_ctx *s, const engram_site *es, float *ring,
                        const float *vhat, uint32_t p0, uint32_t n, float *ev);

    /* §3.4: nx[i] = rotate_{phi_pre}(rms_unit(vec(lanes[i]))), ld phi_pre.cols_pad. */
    void (*lane_norm)(backend_ctx *s, const float *lanes, uint32_t n, float *nx);

    /* §3.4-3.5 lane read: u = sum_r hpre[r] * X[r] from mix[i] ([n][2n+n*n]: pre, post,
     * res projections); bx = u + alpha * ev (engram site) or u; hr[i] = rotate_{q_proj}(
     * ZC(bx; norm_in)) (ld q_proj.cols_pad). ek, ev: [n][d] or NULL without a site;
     * u, bx: [n][d]; h: [n][d] scratch the op may use, unspecified afterwards. */
    void (*lane_read)(backend_ctx *s, uint32_t layer, uint32_t n, const float *lanes,
                      const float *mix, const float *ek, const float *ev, float *u, float *bx,
                      float *h, float *hr);

    /* §3.6 for tokens at t = p0 + i, in order: q/k ZC norm and RoPE (rope_cs: host
     * [n][head_dim] = cos | sin), append k, v to the KV cache, attend over the window and
     * sinks, o *= sigmoid(gate), o[i] rotated for out_proj (ld out_proj.cols_pad).
     * q, gate: [n][A]; k, v: [n][kv_dim] (q, k are overwritten). */
    void (*attention)(backend_ctx *s, uint32_t layer, uint32_t p0, uint32_t n,
                      const float *rope_cs, float *q, float *k, const float *v,
                      const float *gate, float *o);

    /* §3.5: attn := ZC(attn; post_norm); x = bx + sigmoid(attn_gate) * attn;
     * h = ZC(x; pre_hada). All [n][d]. */
    void (*attn_residual)(backend_ctx *s, uint32_t layer, uint32_t n, float *attn,
                          const float *bx, float *x, float *h);

    /* §3.7: out[i] = HadamardMLP(h[i]); [n][d]; out may not alias h. */
    void (*hadamard_mlp)(backend_ctx *s, uint32_t layer, uint32_t n, const float *h,
                         float *out);

    /* §3.4 lane write: y = x + mlp - u (written to mlp), hpost, P = Sinkhorn(res logits),
     * lanes[i][r] = sum_c P[r][c] * lanes[i][c] + hpost[r] * y. */
    void (*lane_write)(backend_ctx *s, uint32_t layer, uint32_t n, const float *mix,
                       const float *x, float *mlp, const float *u, float *lanes);

    /* §3.8 for lanes[0:count]: out (host [count][vocab]) = tied logits of ZC(mean lanes;
     * final_norm); argmax (host [count], optional): the first maximal id. */
    void (*logits)(backend_ctx *s, const float *lanes, uint32_t count, float *out,
                   int32_t *argmax);

    /* Optional: waits for the queued work; 0 or a negative needle_status (with a message)
     * for a device error seen since the last call. Called at the end of each forward. */
    int (*finish)(backend_ctx *s);

    /* Optional (NULL: no W·A8 mode): like matmul, over the quantized rows the ops write
     * when s->a8 is set (xr [ntok][ld_x], the backend's own row format). */
    void (*matmul_a8)(backend_ctx *s, const float *xr, size_t ld_x, uint32_t ntok,
                      const cq_job *jobs, uint32_t njobs);
    /* ---- Needle 3 (optional: NULL where this backend cannot run a Needle 3 model) ---- */
    /* For tokens at t = p0 + i, in order (NEEDLE3.md §2.1-2.2): the causal conv taps over
     * the raw projections (earlier positions from s->qkv_hist, which this op keeps), per
     * head ZC norm and RoPE of q and k (rope_cs: host [n][qk_dim] = cos | sin), K and V
     * into the cache (rows of kv_dim in kv_type, K using KV*qk and V KV*v of them; int8:
     * scale groups from column 0, the last ending at that used width), attention of a
     * local layer over its last
     * `window` positions, of a global one over the sinks and the session's window (or the
     * whole context), scores scaled by 1/sqrt(qk_dim); o *= sigmoid(gate), o rotated for
     * out_proj (ld out_proj.cols_pad). q: [n][H*qk], k: [n][KV*qk], v: [n][KV*v],
     * gate: [n][H*v]; q, k, v are overwritten. */
    void (*attention3)(backend_ctx *s, uint32_t layer, uint32_t p0, uint32_t n,
                       const float *rope_cs, float *q, float *k, float *v, const float *gate,
                       float *o);
    /* The Monarch MLP: out[i] = (d4 * K3(d3 * K2(silu(d2 * cond * K1(d1 * pad(h))[p1] +
     * b2))[p2]))[:d] with cond = 1 + softmax(h cond_v) cond_u. h, out: [n][d]. */
    void (*monarch_mlp)(backend_ctx *s, uint32_t layer, uint32_t n, const float *h,
                        float *out);
    /* Optional: the logits of the one token lanes[0] for the ids rows[0..n_rows) only
     * (ascending, distinct): out (host [vocab]) gets exactly the values `logits` computes
     * for those ids and -INFINITY for every other id. NULL: the caller uses `logits`. */
    void (*logits_rows)(backend_ctx *s, const float *lanes, const int32_t *rows,
                        uint32_t n_rows, float *out);

    /* Optional: the session's thread hand-offs so far (dispatches to worker threads and
     * the milliseconds they cost the caller beyond its own share of the work). */
    void (*thread_stats)(const backend_ctx *s, uint64_t *dispatches, double *sync_ms);

    /* 1: the Needle 3 ops address the cache by backend_ctx.kv_layers, so a session gives
     * each local (sliding-window) layer only its window's slots; 0: the uniform layout. */
    int kv_per_layer;
} needle_backend_ops;

typedef struct needle_backend_impl {
    const char *name;                /* "cpu", "cuda", "metal" */
    int (*probe)(void);              /* 1 if usable here (a device was found), else 0 */
    int (*device_count)(void);       /* devices of this backend (0 if none) */
    /* fills out (backend, name, memory, units, capability; is_default is left 0) */
    int (*device_info)(int index, needle_device_info *out);
    const needle_backend_ops *ops;   /* what sessions of a model on this backend call */
} needle_backend_impl;

/* The CPU operations (backend/cpu/ops.c): the reference every other backend is tested
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
