/* The Metal backend's operations (backend.h) as dispatches of the kernels in nk_kernels.h
 * through the device layer (metal_ops.h). Shared by the real Metal build (macOS) and the
 * C build of the kernels that tests/kernels/test_backend_ops.c checks against the CPU on Linux.
 *
 * Order: the device layer runs dispatches in the order they are queued. Host-visible
 * staging buffers (token ids, engram slots, RoPE angles, logits) are only written or read
 * after nk_dev_sync; RoPE angles are uploaded once per chunk, not once per layer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/metal/metal_ops.h"
#include "util/error.h"

typedef struct nk_session {
    void *dev;          /* the device layer's state */
    uint32_t scr_ld;    /* scratch floats per token */
    float *scratch;     /* [chunk][scr_ld] */
    float *e;           /* [chunk][key_proj cols_pad] gathered engram rows */
    int32_t *tokens;    /* [chunk] */
    uint32_t *slots;    /* [chunk][T] */
    float *rope;        /* [chunk][head_dim] */
    float *out_rot;     /* [chunk][embedding cols_pad] */
    float *logits;      /* [chunk][vocab] */
    int32_t *argmax;    /* [chunk] */
    uint32_t *perms;    /* Needle 3: the Monarch permutations [2][hada_n], else NULL */
    const float *rope_src; /* the host angles last uploaded, with their position */
    uint32_t rope_p0, rope_n;
    int error;          /* first device error, reported by finish */
} nk_session;

_Static_assert(NK_COND_RANK == MODEL3_COND_RANK, "nk_monarch's rank is the model's");

static nk_session *ns_of(const backend_ctx *s) { return (nk_session *)s->dev; }

static nk_cq to_nk(const cq_matrix *w) {
    nk_cq c;
    c.rows = w->rows;
    c.cols = w->cols;
    c.cols_pad = w->cols_pad;
    c.group = w->group;
    c.ngroups = w->ngroups;
    c.bits = w->bits;
    c.row_bytes = w->row_bytes;
    c.unused = 0;
    return c;
}

/* Offset of a float tensor of the model's arena (the kernels' `wf`). */
static uint32_t wf_off(const backend_ctx *s, const float *p) {
    return (uint32_t)(p - s->m->arena);
}

static void run(backend_ctx *s, int id, nk_args *a, uint32_t n_items, void *b0,
                void *b1, void *b2, void *b3, void *b4, void *b5, void *b6, void *b7) {
    if (!n_items) return;
    a->n_items = n_items;
    void *const buf[NK_BUFFERS] = {b0, b1, b2, b3, b4, b5, b6, b7, NULL};
    nk_dev_dispatch(ns_of(s)->dev, s->m, id, a, buf, s->m->arena);
}

static void sync_now(backend_ctx *s) {
    nk_session *ns = ns_of(s);
    int rc = nk_dev_sync(ns->dev);
    if (rc && !ns->error) ns->error = rc;
}

static nk_args args0(void) {
    nk_args a;
    memset(&a, 0, sizeof a);
    return a;
}

/* A CQ matrix's buffers: codes, norms, codebook (host-visible addresses). */
#define CQ_BUFS(w) (void *)(w)->codes, (void *)(w)->norms, (void *)(w)->codebook

/* ---- session state ----------------------------------------------------------------------- */

static void *mt_alloc(backend_ctx *s, size_t bytes) {
    return nk_dev_alloc(ns_of(s)->dev, bytes);
}

static void mt_release(backend_ctx *s, void *p) {
    if (p) nk_dev_release(ns_of(s)->dev, p);
}

static void mt_upload(backend_ctx *s, void *dst, const void *src, size_t bytes) {
    sync_now(s);
    if (bytes) memcpy(dst, src, bytes);
}

static void mt_download(backend_ctx *s, void *dst, const void *src, size_t bytes) {
    sync_now(s);
    if (bytes) memcpy(dst, src, bytes);
}

static void mt_session_free(backend_ctx *s) {
    nk_session *ns = ns_of(s);
    if (!ns) return;
    if (ns->dev) {
        void *bufs[] = {ns->scratch, ns->e, ns->tokens, ns->slots, ns->rope, ns->out_rot,
                        ns->logits, ns->argmax, ns->perms};
        nk_dev_sync(ns->dev);
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) nk_dev_release(ns->dev, bufs[i]);
        nk_dev_session_free(s, ns->dev);
    }
    free(ns);
    s->dev = NULL;
}

static uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

static int mt_session_init(backend_ctx *s) {
    const model_weights *m = s->m;
    /* nk_attend3 reads f32 rows */
    if (m->traits.attention == MODEL_ATTN_SPANNED && s->kv_type != NEEDLE_KV_F32)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "metal: Needle 3 sessions keep an f32 "
                           "KV cache (kv_type %d is not supported on Metal)", s->kv_type);
    nk_session *ns = calloc(1, sizeof *ns);
    if (!ns) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "metal: out of memory");
    s->dev = ns;
    int rc = nk_dev_session_init(s, &ns->dev);
    if (rc) {
        free(ns);
        s->dev = NULL;
        return rc;
    }
    /* per-token scratch: the widest dequantized row, the engram tables of one token, the
     * Hadamard vector, the lane write's P, hpost and old lanes */
    const uint32_t nl = m->n_lanes, nd = nl * m->d;
    uint32_t scr = max_u32(m->embedding.cols_pad, m->hada_n);
    scr = max_u32(scr, nl * nl + nl + nd);
    if (m->n_sites) scr = max_u32(scr, m->n_tables * m->sites[0].tables.cols_pad);
    /* the tapped q|k|v row; the Monarch MLP's z, y, tmp and conditioning weights */
    if (m->traits.attention == MODEL_ATTN_SPANNED)
        scr = max_u32(scr, m->n_heads * m->qk_dim + m->n_kv_heads * (m->qk_dim + m->v_dim));
    if (m->traits.mlp == MODEL_MLP_MONARCH) scr = max_u32(scr, 3 * m->hada_n + MODEL3_COND_RANK);
    ns->scr_ld = scr;
    const size_t C = s->chunk;
    const size_t e_ld = m->n_sites ? m->sites[0].key_proj.cols_pad : 1;
    ns->scratch = nk_dev_alloc(ns->dev, C * scr * sizeof(float));
    ns->e = nk_dev_alloc(ns->dev, C * e_ld * sizeof(float));
    ns->tokens = nk_dev_alloc(ns->dev, C * sizeof(int32_t));
    ns->slots = nk_dev_alloc(ns->dev, C * (m->n_sites ? m->n_tables : 1) * sizeof(uint32_t));
    ns->rope = nk_dev_alloc(ns->dev, C * m->head_dim * sizeof(float));
    ns->out_rot = nk_dev_alloc(ns->dev, C * m->embedding.cols_pad * sizeof(float));
    ns->logits = nk_dev_alloc(ns->dev, C * m->vocab * sizeof(float));
    ns->argmax = nk_dev_alloc(ns->dev, C * sizeof(int32_t));
    /* the kernels read the permutations from a buffer (the model's copy is host memory) */
    int perms_failed = 0;
    if (m->traits.mlp == MODEL_MLP_MONARCH) {
        ns->perms = nk_dev_alloc(ns->dev, 2 * (size_t)m->hada_n * sizeof(uint32_t));
        if (ns->perms) {
            memcpy(ns->perms, m->perm1, m->hada_n * sizeof(uint32_t));
            memcpy(ns->perms + m->hada_n, m->perm2, m->hada_n * sizeof(uint32_t));
        } else {
            perms_failed = 1;
        }
    }
    if (!ns->scratch || !ns->e || !ns->tokens || !ns->slots || !ns->rope || !ns->out_rot ||
        !ns->logits || !ns->argmax || perms_failed) {
        mt_session_free(s);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "metal: out of memory for a session");
    }
    return NEEDLE_OK;
}

/* ---- operations ------------------------------------------------------------------------- */

static void mt_embed(backend_ctx *s, const int32_t *tokens, uint32_t n, float *lanes) {
    nk_session *ns = ns_of(s);
    const model_weights *m = s->m;
    mt_upload(s, ns->tokens, tokens, n * sizeof(int32_t));
    nk_args a = args0();
    a.w = to_nk(&m->embedding);
    a.d = m->d;
    a.nl = m->n_lanes;
    a.scr_ld = ns->scr_ld;
    a.f0 = (float)sqrt((double)m->d);
    run(s, NK_K_embed, &a, n, CQ_BUFS(&m->embedding), ns->tokens, lanes, ns->scratch, NULL, NULL);
}

static void mt_matmul(backend_ctx *s, const float *xr, size_t ld_x, uint32_t ntok,
                      const cq_job *jobs, uint32_t njobs) {
    for (uint32_t j = 0; j < njobs; j++) {
        nk_args a = args0();
        a.w = to_nk(jobs[j].w);
        a.row0 = jobs[j].row0;
        a.nrows = jobs[j].nrows;
        a.ntok = ntok;
        a.ld_x = (uint32_t)ld_x;
        a.ld_y = (uint32_t)jobs[j].ld_y;
        run(s, NK_K_matmul, &a, jobs[j].nrows * ntok, CQ_BUFS(jobs[j].w), (void *)xr, jobs[j].y,
            NULL, NULL, NULL);
    }
}

static void mt_engram_gather(backend_ctx *s, const engram_site *es,
                             const uint32_t *slots, uint32_t n, float *er) {
    nk_session *ns = ns_of(s);
    const model_weights *m = s->m;
    mt_upload(s, ns->slots, slots, (size_t)n * m->n_tables * sizeof(uint32_t));
    nk_args a = args0();
    a.w = to_nk(&es->tables);
    a.n_tables = m->n_tables;
    a.n_slots = m->slots;
    a.sub = m->sub_dim;
    a.scr_ld = ns->scr_ld;
    a.ld_y = es->key_proj.cols_pad;
    run(s, NK_K_engram_gather, &a, n * m->n_tables, CQ_BUFS(&es->tables), ns->slots, ns->e,
        ns->scratch, NULL, NULL);
    nk_args r = args0();
    r.w = to_nk(&es->key_proj);
    r.ld_x = r.ld_y = es->key_proj.cols_pad;
    run(s, NK_K_rotate_rows, &r, n, ns->e, er, NULL, NULL, NULL, NULL, NULL, NULL);
}

static void mt_engram_conv(backend_ctx *s, const engram_site *es, float *ring,
                           const float *vhat, uint32_t p0, uint32_t n, float *ev) {
    const model_weights *m = s->m;
    nk_args a = args0();
    a.d = m->d;
    a.p0 = p0;
    a.taps = m->taps;
    a.dil = m->dilation;
    a.ring_n = s->ev_ring;
    a.o_a = wf_off(s, es->taps);
    run(s, NK_K_engram_conv, &a, n * m->d, ring, (void *)vhat, ev, NULL, NULL, NULL, NULL, NULL);
    const uint32_t keep = n < s->ev_ring ? n : s->ev_ring;
    a.first = n - keep;
    run(s, NK_K_ring_store, &a, keep * m->d, ring, (void *)vhat, NULL, NULL, NULL, NULL, NULL,
        NULL);
}

static void mt_lane_norm(backend_ctx *s, const float *lanes, uint32_t n, float *nx) {
    const model_weights *m = s->m;
    nk_args a = args0();
    a.w = to_nk(&m->phi_pre);
    a.d = m->d;
    a.nl = m->n_lanes;
    run(s, NK_K_lane_norm, &a, n, (void *)lanes, nx, NULL, NULL, NULL, NULL, NULL, NULL);
}

static void mt_lane_read(backend_ctx *s, uint32_t li, uint32_t n, const float *lanes,
                         const float *mix, const float *ek, const float *ev, float *u, float *bx,
                         float *h, float *hr) {
    const model_weights *m = s->m;
    const uint32_t nl = m->n_lanes;
    nk_args a = args0();
    a.w = to_nk(&m->layers[li].q_proj);
    a.d = m->d;
    a.nl = nl;
    a.my_lane = li % nl;
    a.mix_ld = 2 * nl + nl * nl;
    a.has_site = ek != NULL;
    a.o_a = wf_off(s, m->a_pre + li);
    a.o_b = wf_off(s, m->b_pre + (size_t)li * nl);
    a.o_c = wf_off(s, m->layers[li].norm_in);
    run(s, NK_K_lane_read, &a, n, (void *)lanes, (void *)mix, (void *)ek, (void *)ev, u, bx, h, hr);
}

/* Uploads the chunk's RoPE angles (host [n][head_dim]) unless this chunk's are there. */
static void upload_rope(backend_ctx *s, uint32_t li, uint32_t p0, uint32_t n,
                        const float *rope_cs) {
    nk_session *ns = ns_of(s);
    if (ns->rope_src != rope_cs || ns->rope_p0 != p0 || ns->rope_n != n || li == 0) {
        mt_upload(s, ns->rope, rope_cs, (size_t)n * s->m->head_dim * sizeof(float));
        ns->rope_src = rope_cs;
        ns->rope_p0 = p0;
        ns->rope_n = n;
    }
}

static void mt_attention(backend_ctx *s, uint32_t li, uint32_t p0, uint32_t n,
                         const float *rope_cs, float *q, float *k, const float *v,
                         const float *gate, float *o) {
    nk_session *ns = ns_of(s);
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    const uint32_t hd = m->head_dim, A = m->attn_dim, kvd = m->kv_dim;
    upload_rope(s, li, p0, n, rope_cs);
    nk_args a = args0();
    a.H = m->n_heads;
    a.hd = hd;
    a.A = A;
    a.kvd = kvd;
    a.reps = m->n_heads / m->n_kv_heads;
    a.kv_type = (uint32_t)s->kv_type;
    a.slots = s->kv_slots;
    a.layer = li;
    a.n_layers = m->n_layers;
    a.n_sinks = s->n_sinks;
    a.window = s->window;
    a.o_a = wf_off(s, l->q_norm);
    a.o_b = wf_off(s, l->k_norm);
    run(s, NK_K_qk_norm_rope, &a, n * (m->n_heads + m->n_kv_heads), q, k, ns->rope, NULL, NULL,
        NULL, NULL, NULL);
    const uint32_t o_ld = l->out_proj.cols_pad;
    /* token by token: a later token's store may reuse a ring slot an earlier one reads */
    for (uint32_t i = 0; i < n; i++) {
        a.t = p0 + i;
        run(s, NK_K_kv_store, &a, 2, s->k_cache, s->v_cache, s->kv_scales, k + (size_t)i * kvd,
            (void *)(v + (size_t)i * kvd), NULL, NULL, NULL);
        run(s, NK_K_attend, &a, m->n_heads, s->k_cache, s->v_cache, s->kv_scales,
            q + (size_t)i * A, s->scores, o + (size_t)i * o_ld, NULL, NULL);
    }
    nk_args g = args0();
    g.w = to_nk(&l->out_proj);
    g.A = A;
    run(s, NK_K_gate_rotate, &g, n, o, (void *)gate, NULL, NULL, NULL, NULL, NULL, NULL);
}

static void mt_attn_residual(backend_ctx *s, uint32_t li, uint32_t n, float *attn,
                             const float *bx, float *x, float *h) {
    const layer_weights *l = &s->m->layers[li];
    nk_args a = args0();
    a.d = s->m->d;
    a.o_a = wf_off(s, l->post_norm);
    a.o_b = wf_off(s, l->pre_hada);
    a.f0 = l->attn_gate;
    run(s, NK_K_attn_residual, &a, n, attn, (void *)bx, x, h, NULL, NULL, NULL, NULL);
}

static void mt_hadamard_mlp(backend_ctx *s, uint32_t li, uint32_t n, const float *h,
                            float *out) {
    const layer_weights *l = &s->m->layers[li];
    nk_args a = args0();
    a.d = s->m->d;
    a.N = s->m->hada_n;
    a.scr_ld = ns_of(s)->scr_ld;
    a.o_a = wf_off(s, l->d1);
    a.o_b = wf_off(s, l->d2);
    a.o_c = wf_off(s, l->d3);
    run(s, NK_K_hadamard, &a, n, (void *)h, out, ns_of(s)->scratch, NULL, NULL, NULL, NULL, NULL);
}

static void mt_lane_write(backend_ctx *s, uint32_t li, uint32_t n, const float *mix,
                          const float *x, float *mlp, const float *u, float *lanes) {
    const model_weights *m = s->m;
    const uint32_t nl = m->n_lanes;
    nk_args a = args0();
    a.d = m->d;
    a.nl = nl;
    a.my_lane = li % nl;
    a.mix_ld = 2 * nl + nl * nl;
    a.scr_ld = ns_of(s)->scr_ld;
    a.o_a = wf_off(s, m->a_post + li);
    a.o_b = wf_off(s, m->b_post + (size_t)li * nl);
    a.o_c = wf_off(s, m->a_res + li);
    a.o_d = wf_off(s, m->b_res + (size_t)li * nl * nl);
    run(s, NK_K_lane_write, &a, n, (void *)mix, (void *)x, mlp, (void *)u, lanes,
        ns_of(s)->scratch, NULL, NULL);
}

static void mt_logits(backend_ctx *s, const float *lanes, uint32_t count, float *out,
                      int32_t *argmax) {
    nk_session *ns = ns_of(s);
    const model_weights *m = s->m;
    nk_args a = args0();
    a.w = to_nk(&m->embedding);
    a.d = m->d;
    a.nl = m->n_lanes;
    a.scr_ld = ns->scr_ld;
    a.o_a = wf_off(s, m->final_norm);
    run(s, NK_K_final, &a, count, (void *)lanes, ns->out_rot, ns->scratch, NULL, NULL, NULL, NULL,
        NULL);
    const cq_job tied[] = {{&m->embedding, 0, m->vocab, ns->logits, m->vocab}};
    mt_matmul(s, ns->out_rot, m->embedding.cols_pad, count, tied, 1);
    if (argmax) {
        nk_args b = args0();
        b.vocab = m->vocab;
        run(s, NK_K_argmax, &b, count, ns->logits, ns->argmax, NULL, NULL, NULL, NULL, NULL, NULL);
    }
    mt_download(s, out, ns->logits, (size_t)count * m->vocab * sizeof(float));
    if (argmax) memcpy(argmax, ns->argmax, count * sizeof(int32_t));
}

/* ---- Needle 3 ------------------------------------------------------------------------- */

/* The order of cpu_attention3, split into dispatches: the conv taps of the whole chunk
 * (reading earlier positions from the history ring before this chunk's rows are stored
 * in it), per-head norm and RoPE, then token by token the cache store and the attention
 * (a later token's store may reuse a ring slot an earlier one reads), then the gate and
 * the rotation for out_proj. */
static void mt_attention3(backend_ctx *s, uint32_t li, uint32_t p0, uint32_t n,
                          const float *rope_cs, float *q, float *k, float *v,
                          const float *gate, float *o) {
    nk_session *ns = ns_of(s);
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    const layer3_weights *l3 = &m->layers3[li];
    const uint32_t H = m->n_heads, KV = m->n_kv_heads, qk = m->qk_dim, vd = m->v_dim;
    const uint32_t Wq = H * qk, Wk = KV * qk, Wv = KV * vd, row = Wq + Wk + Wv;
    upload_rope(s, li, p0, n, rope_cs);
    nk_args a = args0();
    a.wq = Wq;
    a.wk = Wk;
    a.wv = Wv;
    a.qk = qk;
    a.vd = vd;
    a.lwin = l3->window;
    a.p0 = p0;
    if (m->conv_taps) {
        float *hist = s->qkv_hist + (size_t)li * s->qkv_ring * row;
        a.taps = m->conv_taps;
        a.ring_n = s->qkv_ring;
        a.scr_ld = ns->scr_ld;
        a.o_a = wf_off(s, l3->q_taps);
        a.o_b = wf_off(s, l3->k_taps);
        a.o_c = wf_off(s, l3->v_taps);
        run(s, NK_K_qkv_conv, &a, n * row, q, k, v, hist, ns->scratch, NULL, NULL, NULL);
        const uint32_t keep = n < s->qkv_ring ? n : s->qkv_ring;
        a.first = n - keep;
        run(s, NK_K_qkv_ring_store, &a, keep * row, q, k, v, hist, NULL, NULL, NULL, NULL);
        run(s, NK_K_qkv_take, &a, n * row, q, k, v, NULL, ns->scratch, NULL, NULL, NULL);
    }
    /* the Needle 2 kernel with q rows of H*qk and k rows of KV*qk */
    nk_args r = args0();
    r.H = H;
    r.hd = qk;
    r.A = Wq;
    r.kvd = Wk;
    r.o_a = wf_off(s, l->q_norm);
    r.o_b = wf_off(s, l->k_norm);
    run(s, NK_K_qk_norm_rope, &r, n * (H + KV), q, k, ns->rope, NULL, NULL, NULL, NULL, NULL);

    a.reps = H / KV;
    a.kvd = m->kv_dim;
    a.slots = s->kv_slots;
    a.layer = li;
    a.n_layers = m->n_layers;
    /* the layer's own rows (a local layer: a ring of its window, kv_per_layer below) */
    const kv_layer_layout *L = &s->kv_layers[li];
    a.kv_row0 = (uint32_t)L->row0;
    a.n_sinks = L->n_sinks;
    a.window = L->window;
    const uint32_t o_ld = l->out_proj.cols_pad;
    for (uint32_t i = 0; i < n; i++) {
        a.t = p0 + i;
        run(s, NK_K_kv_store3, &a, Wk + Wv, s->k_cache, s->v_cache, NULL, k + (size_t)i * Wk,
            v + (size_t)i * Wv, NULL, NULL, NULL);
        run(s, NK_K_attend3, &a, H, s->k_cache, s->v_cache, NULL, q + (size_t)i * Wq, s->scores,
            o + (size_t)i * o_ld, NULL, NULL);
    }
    nk_args g = args0();
    g.w = to_nk(&l->out_proj);
    g.A = H * vd;
    run(s, NK_K_gate_rotate, &g, n, o, (void *)gate, NULL, NULL, NULL, NULL, NULL, NULL);
}

static void mt_monarch_mlp(backend_ctx *s, uint32_t li, uint32_t n, const float *h,
                           float *out) {
    nk_session *ns = ns_of(s);
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    const layer3_weights *l3 = &m->layers3[li];
    nk_args a = args0();
    a.d = m->d;
    a.N = m->hada_n;
    a.hd = m->hada_ba;
    a.reps = m->hada_bb;
    a.scr_ld = ns->scr_ld;
    a.ow[NK_MONARCH_D1] = wf_off(s, l->d1);
    a.ow[NK_MONARCH_D2] = wf_off(s, l->d2);
    a.ow[NK_MONARCH_D3] = wf_off(s, l->d3);
    a.ow[NK_MONARCH_B2] = wf_off(s, l3->b2);
    a.ow[NK_MONARCH_D4] = wf_off(s, l3->d4);
    a.ow[NK_MONARCH_W1A] = wf_off(s, l3->w1a);
    a.ow[NK_MONARCH_W1B] = wf_off(s, l3->w1b);
    a.ow[NK_MONARCH_W2A] = wf_off(s, l3->w2a);
    a.ow[NK_MONARCH_W2B] = wf_off(s, l3->w2b);
    a.ow[NK_MONARCH_W3A] = wf_off(s, l3->w3a);
    a.ow[NK_MONARCH_W3B] = wf_off(s, l3->w3b);
    a.ow[NK_MONARCH_COND_V] = wf_off(s, l3->cond_v);
    a.ow[NK_MONARCH_COND_U] = wf_off(s, l3->cond_u);
    run(s, NK_K_monarch, &a, n, (void *)h, out, ns->scratch, ns->perms, NULL, NULL, NULL, NULL);
}

static int mt_finish(backend_ctx *s) {
    nk_session *ns = ns_of(s);
    sync_now(s);
    int rc = ns->error;
    ns->error = 0;
    return rc;
}

const needle_backend_ops nk_backend_ops = {
    .model_load = nk_dev_model_load,
    .model_unload = nk_dev_model_unload,
    .session_init = mt_session_init,
    .session_free = mt_session_free,
    .alloc = mt_alloc,
    .release = mt_release,
    .upload = mt_upload,
    .download = mt_download,
    .embed = mt_embed,
    .matmul = mt_matmul,
    .engram_gather = mt_engram_gather,
    .engram_conv = mt_engram_conv,
    .lane_norm = mt_lane_norm,
    .lane_read = mt_lane_read,
    .attention = mt_attention,
    .attn_residual = mt_attn_residual,
    .hadamard_mlp = mt_hadamard_mlp,
    .lane_write = mt_lane_write,
    .logits = mt_logits,
    .finish = mt_finish,
    .attention3 = mt_attention3,
    .monarch_mlp = mt_monarch_mlp,
    .kv_per_layer = 1, /* nk_kv_store3 / nk_attend3 address rows by kv_row0 */
};
