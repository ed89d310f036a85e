/* The CUDA backend: the operations of backend/backend.h as CUDA kernels.
 *
 * Weights: the validated .cact image is uploaded once per model in its packed CQ form
 * (codes, fp16 group norms) together with the widened float arena and the codebooks;
 * ops receive the model's host views (cq_matrix, layer_weights) and translate their
 * pointers by offset into the device copies (dev_ptr). Nothing is dequantized ahead.
 *
 * Session memory (ops->alloc) is device memory: activations, KV cache and engram ring stay
 * on the GPU across tokens; per chunk only token ids, engram slots and RoPE angles go up
 * and the logits come down. All work of a session runs in order on its own stream.
 *
 * Kernels (one block of NT threads unless said otherwise):
 *   k_matmul      CQ products in the rotated domain: a warp per weight row, codes decoded
 *                 on the fly, MM_TOK tokens per block row (grid.y), warp-shuffle sums.
 *   rotations and the Hadamard MLP: Walsh-Hadamard butterflies in shared memory.
 *   k_attend      one block per query head: scores over the KV cache (f32/f16/int8) into
 *                 global scratch, block max/sum, then one thread per output channel.
 *   k_lane_write  lanes + log-space Sinkhorn (one thread, n <= 64) + the lane mix.
 *   k_argmax      first maximal logit per token.
 *   Needle 3 (cuda_kernels3.cuh): the conv taps (a block per token, then the history
 *                 ring), k_attend3 (attend_head, shared with k_attend, over the f32 cache, qk != v, local spans), and
 *                 k_monarch (a block per token, the Kronecker products in shared memory;
 *                 the permutations uploaded with the weights).
 * Reductions run in a different order than the CPU, so results agree to float rounding
 * (tests/kernels/test_backend_ops.c states the tolerances).
 *
 * Errors: kernels launch asynchronously; a failure is remembered in the session and
 * reported by ops->finish at the end of the forward pass (NEEDLE_ERR_BACKEND).
 * Not done: CUDA graphs for the decode step (one token = about 12 launches per layer). */
#include <cuda_runtime.h>
#include <math.h>
#include <new>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "backend/backend.h"
#include "util/error.h"
}

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_kernels3.cuh"

static_assert(COND_RANK == MODEL3_COND_RANK, "k_monarch's rank is the model's");

/* ---- weights on the device ------------------------------------------------------------- */

struct cuda_weights {
    uint8_t *image;       /* device copy of the validated .cact bytes */
    float *arena;         /* device copy of the widened float tensors */
    float *codebooks;     /* [6][16] */
    uint32_t *perms;      /* Needle 3: the Monarch permutations [2][hada_n], else NULL */
    const uint8_t *host_image;
    size_t image_size;
    const float *host_arena;
    size_t arena_floats;
};

static const cuda_weights *weights_of(const backend_ctx *s) {
    return (const cuda_weights *)s->device_weights;
}

/* The device address of host weight pointer p (inside the image or the float arena). */
static const void *dev_ptr(const cuda_weights *w, const void *p) {
    const uint8_t *b = (const uint8_t *)p;
    if (b >= w->host_image && b < w->host_image + w->image_size)
        return w->image + (b - w->host_image);
    const float *f = (const float *)p;
    if (f >= w->host_arena && f < w->host_arena + w->arena_floats)
        return w->arena + (f - w->host_arena);
    return NULL;
}

static const float *devf(const backend_ctx *s, const float *p) {
    return (const float *)dev_ptr(weights_of(s), p);
}

static dcq to_dcq(const backend_ctx *s, const cq_matrix *m) {
    const cuda_weights *w = weights_of(s);
    dcq d;
    d.codes = (const uint8_t *)dev_ptr(w, m->codes);
    d.norms = (const uint16_t *)dev_ptr(w, m->norms);
    d.codebook = w->codebooks + 16 * m->bits;
    d.rows = m->rows;
    d.cols = m->cols;
    d.cols_pad = m->cols_pad;
    d.group = m->group;
    d.ngroups = m->ngroups;
    d.bits = m->bits;
    d.row_bytes = m->row_bytes;
    return d;
}

/* ---- session state ------------------------------------------------------------------------ */

struct cuda_session {
    cudaStream_t stream;
    cudaError_t error;  /* first error since the last finish */
    float *e;           /* [chunk][T*sub padded] gathered engram rows */
    float *rope;        /* [chunk][head_dim] */
    uint32_t *slots;    /* [chunk][T] */
    int32_t *tokens;    /* [chunk] */
    float *out_rot;     /* [chunk][d padded] */
    float *logits;      /* [chunk][vocab] */
    int32_t *argmax;    /* [chunk] */
    float *tapped;      /* Needle 3 with conv taps: [chunk][H*qk + KV*qk + KV*v] */
};

static cuda_session *cs_of(const backend_ctx *s) { return (cuda_session *)s->dev; }

static void note(backend_ctx *s, cudaError_t e) {
    cuda_session *c = cs_of(s);
    if (e != cudaSuccess && c->error == cudaSuccess) c->error = e;
}

static void after_launch(backend_ctx *s) { note(s, cudaGetLastError()); }

/* ---- ops ------------------------------------------------------------------------------------- */

static size_t fbytes(uint32_t n) { return (size_t)n * sizeof(float); }

static void cu_upload(backend_ctx *s, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    note(s, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cs_of(s)->stream));
}

static void cu_download(backend_ctx *s, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    note(s, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cs_of(s)->stream));
    note(s, cudaStreamSynchronize(cs_of(s)->stream));
}

static void *cu_alloc(backend_ctx *s, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    if (cudaMemsetAsync(p, 0, bytes ? bytes : 1, cs_of(s)->stream) != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_release(backend_ctx *s, void *p) {
    if (!p) return;
    cudaStreamSynchronize(cs_of(s)->stream);
    cudaFree(p);
}

static void cu_session_free(backend_ctx *s) {
    cuda_session *c = cs_of(s);
    if (!c) return;
    cudaStreamSynchronize(c->stream);
    void *bufs[] = {c->e, c->rope, c->slots, c->tokens, c->out_rot, c->logits, c->argmax,
                    c->tapped};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    cudaStreamDestroy(c->stream);
    delete c;
    s->dev = NULL;
}

static int cu_session_init(backend_ctx *s) {
    const model_weights *m = s->m;
    if (!s->device_weights)
        return needle_fail(NEEDLE_ERR_BACKEND, "cuda: the model's weights are not on the device");
    if (m->n_lanes > MAX_LANES)
        return needle_fail(NEEDLE_ERR_BACKEND, "cuda: %u lanes exceed %u", m->n_lanes, MAX_LANES);
    /* k_attend3 reads f32 rows */
    if (m->traits.attention == MODEL_ATTN_SPANNED && s->kv_type != NEEDLE_KV_F32)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "cuda: Needle 3 sessions keep an f32 KV "
                           "cache (kv_type %d is not supported on CUDA)", s->kv_type);
    cuda_session *c = new (std::nothrow) cuda_session();
    if (!c) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "cuda: out of memory");
    s->dev = c;
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
        delete c;
        s->dev = NULL;
        return needle_fail(NEEDLE_ERR_BACKEND, "cuda: cannot create a stream");
    }
    const size_t C = s->chunk;
    const size_t e_ld = m->n_sites ? m->sites[0].key_proj.cols_pad : 1;
    c->e = (float *)cu_alloc(s, C * e_ld * sizeof(float));
    c->rope = (float *)cu_alloc(s, C * m->head_dim * sizeof(float));
    c->slots = (uint32_t *)cu_alloc(s, C * (m->n_sites ? m->n_tables : 1) * sizeof(uint32_t));
    c->tokens = (int32_t *)cu_alloc(s, C * sizeof(int32_t));
    c->out_rot = (float *)cu_alloc(s, C * m->embedding.cols_pad * sizeof(float));
    c->logits = (float *)cu_alloc(s, C * m->vocab * sizeof(float));
    c->argmax = (int32_t *)cu_alloc(s, C * sizeof(int32_t));
    int tapped_failed = 0;
    if (m->conv_taps) {
        const size_t row = (size_t)m->n_heads * m->qk_dim +
                           (size_t)m->n_kv_heads * (m->qk_dim + m->v_dim);
        c->tapped = (float *)cu_alloc(s, C * row * sizeof(float));
        tapped_failed = !c->tapped;
    }
    if (!c->e || !c->rope || !c->slots || !c->tokens || !c->out_rot || !c->logits || !c->argmax ||
        tapped_failed) {
        cu_session_free(s);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "cuda: out of device memory for a session");
    }
    return NEEDLE_OK;
}

/* Dynamic shared memory for a vector of n floats; kernels needing more than the default
 * 48 KiB are opted in at model load. */
static size_t smem(uint32_t n) { return (size_t)n * sizeof(float); }

static void cu_embed(backend_ctx *s, const int32_t *tokens, uint32_t n, float *lanes) {
    cuda_session *c = cs_of(s);
    const model_weights *m = s->m;
    cu_upload(s, c->tokens, tokens, n * sizeof(int32_t));
    dcq emb = to_dcq(s, &m->embedding);
    k_embed<<<n, NT, smem(emb.cols_pad), c->stream>>>(emb, c->tokens, m->d, m->n_lanes, lanes);
    after_launch(s);
}

static void cu_matmul(backend_ctx *s, const float *xr, size_t ld_x, uint32_t ntok,
                      const cq_job *jobs, uint32_t njobs) {
    cuda_session *c = cs_of(s);
    for (uint32_t j = 0; j < njobs; j++) {
        dcq w = to_dcq(s, jobs[j].w);
        const uint32_t warps_per_block = NT / 32;
        dim3 grid((jobs[j].nrows + warps_per_block - 1) / warps_per_block, (ntok + MM_TOK - 1) / MM_TOK);
        k_matmul<<<grid, NT, 0, c->stream>>>(w, jobs[j].row0, jobs[j].nrows, xr, ld_x, ntok,
                                             jobs[j].y, jobs[j].ld_y);
        after_launch(s);
    }
}

static void cu_engram_gather(backend_ctx *s, const engram_site *es,
                             const uint32_t *slots, uint32_t n, float *er) {
    cuda_session *c = cs_of(s);
    const model_weights *m = s->m;
    cu_upload(s, c->slots, slots, (size_t)n * m->n_tables * sizeof(uint32_t));
    dcq tables = to_dcq(s, &es->tables), key = to_dcq(s, &es->key_proj);
    dim3 grid(n, m->n_tables);
    k_engram_gather<<<grid, NT, smem(tables.cols_pad), c->stream>>>(
        tables, c->slots, m->n_tables, m->slots, m->sub_dim, c->e, key.cols_pad);
    after_launch(s);
    k_rotate<<<n, NT, smem(key.cols_pad), c->stream>>>(key, c->e, key.cols_pad, er, key.cols_pad);
    after_launch(s);
}

static void cu_engram_conv(backend_ctx *s, const engram_site *es, float *ring,
                           const float *vhat, uint32_t p0, uint32_t n, float *ev) {
    cuda_session *c = cs_of(s);
    const model_weights *m = s->m;
    k_engram_conv<<<n, NT, 0, c->stream>>>(devf(s, es->taps), m->taps, m->dilation, ring,
                                           s->ev_ring, vhat, p0, m->d, ev);
    after_launch(s);
    const uint32_t keep = n < s->ev_ring ? n : s->ev_ring;
    k_ring_store<<<keep, NT, 0, c->stream>>>(ring, s->ev_ring, vhat, p0, n - keep, m->d);
    after_launch(s);
}

static void cu_lane_norm(backend_ctx *s, const float *lanes, uint32_t n, float *nx) {
    const model_weights *m = s->m;
    dcq phi = to_dcq(s, &m->phi_pre);
    k_lane_norm<<<n, NT, smem(phi.cols_pad), cs_of(s)->stream>>>(phi, lanes, m->n_lanes * m->d, nx);
    after_launch(s);
}

static void cu_lane_read(backend_ctx *s, uint32_t li, uint32_t n, const float *lanes,
                         const float *mix, const float *ek, const float *ev, float *u, float *bx,
                         float *h, float *hr) {
    (void)h; /* ZC(bx) stays in the block's shared memory */
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    const uint32_t nl = m->n_lanes;
    lane_read_args a;
    a.a_pre = devf(s, m->a_pre + li);
    a.b_pre = devf(s, m->b_pre + (size_t)li * nl);
    a.norm_in = devf(s, l->norm_in);
    a.d = m->d;
    a.nl = nl;
    a.my_lane = li % nl;
    a.mix_ld = 2 * nl + nl * nl;
    a.has_site = ek != NULL;
    dcq wq = to_dcq(s, &l->q_proj);
    k_lane_read<<<n, NT, smem(wq.cols_pad), cs_of(s)->stream>>>(a, wq, lanes, mix, ek, ev, u, bx, hr);
    after_launch(s);
}

static void cu_attention(backend_ctx *s, uint32_t li, uint32_t p0, uint32_t n,
                         const float *rope_cs, float *q, float *k, const float *v,
                         const float *gate, float *o) {
    cuda_session *c = cs_of(s);
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    const uint32_t hd = m->head_dim, A = m->attn_dim, kvd = m->kv_dim;
    cu_upload(s, c->rope, rope_cs, (size_t)n * hd * sizeof(float));
    dim3 g1(n, m->n_heads + m->n_kv_heads);
    k_qk_norm_rope<<<g1, NT, smem(hd), c->stream>>>(q, k, devf(s, l->q_norm), devf(s, l->k_norm),
                                                    c->rope, m->n_heads, hd, A, kvd);
    after_launch(s);
    kv_args a;
    a.k_cache = s->k_cache;
    a.v_cache = s->v_cache;
    a.scales = s->kv_scales;
    a.kv_type = (uint32_t)s->kv_type;
    a.kvd = kvd;
    a.slots = s->kv_slots;
    a.layer = li;
    a.n_layers = m->n_layers;
    a.n_sinks = s->n_sinks;
    a.window = s->window;
    dcq wo = to_dcq(s, &l->out_proj);
    /* token by token: a later token's store may reuse a ring slot an earlier one reads */
    for (uint32_t i = 0; i < n; i++) {
        k_kv_store<<<2, NT, 0, c->stream>>>(a, k + (size_t)i * kvd, v + (size_t)i * kvd, p0 + i);
        after_launch(s);
        k_attend<<<m->n_heads, NT, 0, c->stream>>>(a, q + (size_t)i * A, p0 + i, hd,
                                                   m->n_heads / m->n_kv_heads, s->scores,
                                                   o + (size_t)i * wo.cols_pad);
        after_launch(s);
    }
    k_gate_rotate<<<n, NT, smem(wo.cols_pad), c->stream>>>(wo, o, gate, A);
    after_launch(s);
}

static void cu_attn_residual(backend_ctx *s, uint32_t li, uint32_t n, float *attn,
                             const float *bx, float *x, float *h) {
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    k_attn_residual<<<n, NT, smem(m->d), cs_of(s)->stream>>>(
        attn, bx, x, h, devf(s, l->post_norm), devf(s, l->pre_hada), l->attn_gate, m->d);
    after_launch(s);
}

static void cu_hadamard_mlp(backend_ctx *s, uint32_t li, uint32_t n, const float *h,
                            float *out) {
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    k_hadamard<<<n, NT, smem(m->hada_n), cs_of(s)->stream>>>(h, out, devf(s, l->d1), devf(s, l->d2),
                                                             devf(s, l->d3), m->d, m->hada_n);
    after_launch(s);
}

static void cu_lane_write(backend_ctx *s, uint32_t li, uint32_t n, const float *mix,
                          const float *x, float *mlp, const float *u, float *lanes) {
    const model_weights *m = s->m;
    const uint32_t nl = m->n_lanes;
    lane_write_args a;
    a.a_post = devf(s, m->a_post + li);
    a.b_post = devf(s, m->b_post + (size_t)li * nl);
    a.a_res = devf(s, m->a_res + li);
    a.b_res = devf(s, m->b_res + (size_t)li * nl * nl);
    a.d = m->d;
    a.nl = nl;
    a.my_lane = li % nl;
    a.mix_ld = 2 * nl + nl * nl;
    k_lane_write<<<n, NT, 0, cs_of(s)->stream>>>(a, mix, x, mlp, u, lanes);
    after_launch(s);
}

static void cu_logits(backend_ctx *s, const float *lanes, uint32_t count, float *out,
                      int32_t *argmax) {
    cuda_session *c = cs_of(s);
    const model_weights *m = s->m;
    dcq emb = to_dcq(s, &m->embedding);
    k_final<<<count, NT, smem(emb.cols_pad), c->stream>>>(emb, lanes, devf(s, m->final_norm), m->d,
                                                          m->n_lanes, c->out_rot);
    after_launch(s);
    const cq_job tied[] = {{&m->embedding, 0, m->vocab, c->logits, m->vocab}};
    cu_matmul(s, c->out_rot, emb.cols_pad, count, tied, 1);
    if (argmax) {
        k_argmax<<<count, NT, 0, c->stream>>>(c->logits, m->vocab, c->argmax);
        after_launch(s);
    }
    cu_download(s, out, c->logits, (size_t)count * fbytes(m->vocab));
    if (argmax) cu_download(s, argmax, c->argmax, count * sizeof(int32_t));
}

/* ---- Needle 3 -------------------------------------------------------------------------------- */

/* The order of cpu_attention3 as launches: the conv taps of the whole chunk (earlier
 * positions from the history ring, read before this chunk's rows are stored in it), per
 * head norm and RoPE, then token by token the cache store and the attention (a later
 * token's store may reuse a ring slot an earlier one reads), then gate and rotation. */
static void cu_attention3(backend_ctx *s, uint32_t li, uint32_t p0, uint32_t n,
                          const float *rope_cs, float *q, float *k, float *v,
                          const float *gate, float *o) {
    cuda_session *c = cs_of(s);
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    const layer3_weights *l3 = &m->layers3[li];
    const uint32_t H = m->n_heads, KV = m->n_kv_heads, qk = m->qk_dim, vd = m->v_dim;
    const uint32_t Wq = H * qk, Wk = KV * qk, Wv = KV * vd, row = Wq + Wk + Wv;
    cu_upload(s, c->rope, rope_cs, (size_t)n * qk * sizeof(float));
    if (m->conv_taps) {
        conv3_args a;
        a.q_taps = devf(s, l3->q_taps);
        a.k_taps = devf(s, l3->k_taps);
        a.v_taps = devf(s, l3->v_taps);
        a.q = q;
        a.k = k;
        a.v = v;
        a.hist = s->qkv_hist + (size_t)li * s->qkv_ring * row;
        a.tapped = c->tapped;
        a.wq = Wq;
        a.wk = Wk;
        a.wv = Wv;
        a.taps = m->conv_taps;
        a.lwin = l3->window;
        a.ring = s->qkv_ring;
        a.p0 = p0;
        k_qkv_conv<<<n, NT, 0, c->stream>>>(a);
        after_launch(s);
        const uint32_t keep = n < s->qkv_ring ? n : s->qkv_ring;
        k_qkv_ring_store<<<keep, NT, 0, c->stream>>>(a, n - keep);
        after_launch(s);
        k_qkv_take<<<n, NT, 0, c->stream>>>(a);
        after_launch(s);
    }
    dim3 g1(n, H + KV);
    k_qk_norm_rope<<<g1, NT, smem(qk), c->stream>>>(q, k, devf(s, l->q_norm), devf(s, l->k_norm),
                                                    c->rope, H, qk, Wq, Wk);
    after_launch(s);
    kv3_args a;
    a.k_cache = (float *)s->k_cache;
    a.v_cache = (float *)s->v_cache;
    a.kvd = m->kv_dim;
    a.slots = s->kv_slots;
    a.layer = li;
    a.n_sinks = s->n_sinks;
    a.window = s->window;
    a.lwin = l3->window;
    a.qk = qk;
    a.vd = vd;
    a.wk = Wk;
    a.wv = Wv;
    dcq wo = to_dcq(s, &l->out_proj);
    for (uint32_t i = 0; i < n; i++) {
        k_kv_store3<<<1, NT, 0, c->stream>>>(a, k + (size_t)i * Wk, v + (size_t)i * Wv, p0 + i);
        after_launch(s);
        k_attend3<<<H, NT, 0, c->stream>>>(a, q + (size_t)i * Wq, p0 + i, H / KV, s->scores,
                                          o + (size_t)i * wo.cols_pad);
        after_launch(s);
    }
    k_gate_rotate<<<n, NT, smem(wo.cols_pad), c->stream>>>(wo, o, gate, H * vd);
    after_launch(s);
}

/* Shared memory of k_monarch: z, y, tmp and the conditioning weights. */
static size_t monarch_smem(const model_weights *m) { return smem(3 * m->hada_n + COND_RANK); }

static void cu_monarch_mlp(backend_ctx *s, uint32_t li, uint32_t n, const float *h,
                           float *out) {
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    const layer3_weights *l3 = &m->layers3[li];
    const cuda_weights *w = weights_of(s);
    monarch_args a;
    a.d1 = devf(s, l->d1);
    a.d2 = devf(s, l->d2);
    a.d3 = devf(s, l->d3);
    a.b2 = devf(s, l3->b2);
    a.d4 = devf(s, l3->d4);
    a.w1a = devf(s, l3->w1a);
    a.w2a = devf(s, l3->w2a);
    a.w3a = devf(s, l3->w3a);
    a.w1b = devf(s, l3->w1b);
    a.w2b = devf(s, l3->w2b);
    a.w3b = devf(s, l3->w3b);
    a.cond_v = devf(s, l3->cond_v);
    a.cond_u = devf(s, l3->cond_u);
    a.perm1 = w->perms;
    a.perm2 = w->perms + m->hada_n;
    a.d = m->d;
    a.N = m->hada_n;
    a.ba = m->hada_ba;
    a.bb = m->hada_bb;
    k_monarch<<<n, NT, monarch_smem(m), cs_of(s)->stream>>>(a, h, out);
    after_launch(s);
}

static int cu_finish(backend_ctx *s) {
    cuda_session *c = cs_of(s);
    note(s, cudaStreamSynchronize(c->stream));
    cudaError_t e = c->error;
    c->error = cudaSuccess;
    if (e != cudaSuccess)
        return needle_fail(NEEDLE_ERR_BACKEND, "cuda: %s", cudaGetErrorString(e));
    return NEEDLE_OK;
}

/* ---- model weights ------------------------------------------------------------------------------ */

static void cu_model_unload(void *device_weights) {
    cuda_weights *w = (cuda_weights *)device_weights;
    if (!w) return;
    cudaFree(w->image);
    cudaFree(w->arena);
    cudaFree(w->codebooks);
    cudaFree(w->perms);
    delete w;
}

static int cu_model_load(const model_weights *m, void **device_weights) {
    *device_weights = NULL;
    cuda_weights *w = new (std::nothrow) cuda_weights();
    if (!w) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "cuda: out of memory");
    w->host_image = m->image;
    w->image_size = m->image_size;
    w->host_arena = m->arena;
    w->arena_floats = m->arena_floats;
    cudaError_t e = cudaMalloc((void **)&w->image, m->image_size ? m->image_size : 1);
    if (e == cudaSuccess) e = cudaMalloc((void **)&w->arena, fbytes(m->arena_floats ? (uint32_t)m->arena_floats : 1));
    if (e == cudaSuccess) e = cudaMalloc((void **)&w->codebooks, m->codebooks_bytes);
    if (e == cudaSuccess) e = cudaMemcpy(w->image, m->image, m->image_size, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(w->arena, m->arena, m->arena_floats * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(w->codebooks, m->codebooks, m->codebooks_bytes, cudaMemcpyHostToDevice);
    /* kernels whose shared vector may pass the default 48 KiB */
    const size_t big = smem(m->phi_pre.cols_pad);
    if (e == cudaSuccess && big > 48 * 1024)
        e = cudaFuncSetAttribute(k_lane_norm, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)big);
    if (e == cudaSuccess && m->traits.mlp == MODEL_MLP_MONARCH) {
        /* the Monarch permutations: the model's copy is host memory */
        const size_t pbytes = 2 * (size_t)m->hada_n * sizeof(uint32_t);
        e = cudaMalloc((void **)&w->perms, pbytes);
        if (e == cudaSuccess)
            e = cudaMemcpy(w->perms, m->perm1, pbytes / 2, cudaMemcpyHostToDevice);
        if (e == cudaSuccess)
            e = cudaMemcpy(w->perms + m->hada_n, m->perm2, pbytes / 2, cudaMemcpyHostToDevice);
        if (e == cudaSuccess && monarch_smem(m) > 48 * 1024)
            e = cudaFuncSetAttribute(k_monarch, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)monarch_smem(m));
    }
    if (e != cudaSuccess) {
        cu_model_unload(w);
        return needle_fail(NEEDLE_ERR_BACKEND, "cuda: cannot upload the weights (%zu bytes): %s",
                           m->image_size, cudaGetErrorString(e));
    }
    *device_weights = w;
    return NEEDLE_OK;
}

/* ---- probe and device info ------------------------------------------------------------------------ */

static int cu_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

static int cu_probe(void) { return cu_device_count() > 0; }

static int cu_device_info(int index, needle_device_info *out) {
    if (!out || index < 0 || index >= cu_device_count()) return NEEDLE_ERR_INVALID_ARGUMENT;
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return NEEDLE_ERR_BACKEND;
    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "cuda");
    for (size_t k = 0; k + 1 < sizeof out->name && p.name[k]; k++) out->name[k] = p.name[k];
    out->memory_bytes = (uint64_t)p.totalGlobalMem;
    out->compute_units = p.multiProcessorCount;
    snprintf(out->capability, sizeof out->capability, "sm_%d%d", p.major, p.minor);
    return NEEDLE_OK;
}

/* Designated initializers, in the order of needle_backend_ops as C++20 requires (nvcc's
 * C++17 front end and the host compiler accept them as an extension): a field added to
 * the struct is NULL here until CUDA implements it, wherever it is added. */
static const needle_backend_ops cuda_ops = {
    .model_load = cu_model_load,
    .model_unload = cu_model_unload,
    .session_init = cu_session_init,
    .session_free = cu_session_free,
    .alloc = cu_alloc,
    .release = cu_release,
    .upload = cu_upload,
    .download = cu_download,
    .embed = cu_embed,
    .matmul = cu_matmul,
    .engram_gather = cu_engram_gather,
    .engram_conv = cu_engram_conv,
    .lane_norm = cu_lane_norm,
    .lane_read = cu_lane_read,
    .attention = cu_attention,
    .attn_residual = cu_attn_residual,
    .hadamard_mlp = cu_hadamard_mlp,
    .lane_write = cu_lane_write,
    .logits = cu_logits,
    .finish = cu_finish,
    .matmul_a8 = nullptr, /* no W·A8 mode on CUDA */
    .attention3 = cu_attention3,
    .monarch_mlp = cu_monarch_mlp,
    .logits_rows = nullptr, /* the caller masks the full logits */
    .thread_stats = nullptr,
    .kv_per_layer = 0, /* cu_attention3 addresses the uniform layout (layer * kv_slots) */
};

extern "C" const needle_backend_impl cuda_backend = {
    "cuda", cu_probe, cu_device_count, cu_device_info, &cuda_ops,
};
