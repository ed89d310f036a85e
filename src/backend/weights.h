/* The model as the backends see it: geometry and typed weight views (spec §1.9, §3).
 *
 * Why here and not in model/: the layer order is kernels < backend < model, so the types
 * the backend operations take must live at or below backend/. model/model.c fills one
 * model_weights per loaded model (model_bind) and owns everything it points to; a backend
 * only reads it. Every pointer is valid and sized by the geometry once model_bind has
 * succeeded. CQ tensors are views into the validated image (no copy); small FP16/FP32
 * tensors (norms, gates, diagonals, taps, mHC a/b) are widened into `arena`, because the
 * forward pass reads them on every token and a device backend uploads the arena once. */
#ifndef NEEDLE_BACKEND_WEIGHTS_H
#define NEEDLE_BACKEND_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cq.h"

#define MODEL_MAX_SITES 16u /* Needle 2 files hold 4, Needle 3 files 16 */
#define MODEL_MAX_ORDERS 4u

typedef struct layer_weights {
    const float *norm_in, *post_norm, *pre_hada; /* [d] ZC offsets (gain is 1 + s) */
    const float *q_norm, *k_norm;                /* [head_dim] */
    const float *d1, *d2, *d3;                   /* [hada_n] */
    float attn_gate;                             /* pre-sigmoid scalar */
    cq_matrix q_proj, gate_proj;                 /* [A][d] */
    cq_matrix k_proj, v_proj;                    /* [kvd][d] */
    cq_matrix out_proj;                          /* [d][A] */
} layer_weights;

#define MODEL3_COND_RANK 8u /* rank of the Monarch MLP's conditioning (cond_v, cond_u) */

/* What a Needle 3 layer adds (docs/spec/NEEDLE3.md §2): causal conv taps on the raw q/k/v
 * projections, the attention span, and the Monarch MLP's trained factors. */
typedef struct layer3_weights {
    const float *q_taps, *k_taps, *v_taps; /* [conv_taps][H*qk], [..][KV*qk], [..][KV*v]; NULL
                                             * without taps */
    const float *b2, *d4;                  /* [hada_n] (d1, d2, d3 are in layer_weights) */
    const float *w1a, *w2a, *w3a;          /* [ba][ba] */
    const float *w1b, *w2b, *w3b;          /* [bb][bb] */
    const float *cond_v;                   /* [d][8] */
    const float *cond_u;                   /* [8][hada_n] */
    uint32_t window;                       /* 0: global (full causal), else the local width */
} layer3_weights;

typedef struct engram_site {
    uint32_t layer;
    cq_matrix tables;               /* [T * slots][sub] */
    cq_matrix key_proj, value_proj; /* [d][T * sub] */
    const float *taps;              /* [taps][d] */
} engram_site;

/* What the layers of a model compute, recorded at bind time (model/bind2.c, bind3.c):
 * ops, sessions and backends test these, never which generation a file is, so a new
 * architecture states what it shares with the old ones instead of adding branches. */
typedef enum model_mlp_kind {
    MODEL_MLP_HADAMARD, /* ops->hadamard_mlp (spec §3.7) */
    MODEL_MLP_MONARCH,  /* ops->monarch_mlp: Kronecker factors, perm1/perm2, conditioning */
} model_mlp_kind;

typedef enum model_attention_kind {
    MODEL_ATTN_ROPE,    /* ops->attention: one head width, the session's window (spec §3.6) */
    MODEL_ATTN_SPANNED, /* ops->attention3: conv taps, q/k and v widths, each layer its own
                         * span (layers3[l].window) */
} model_attention_kind;

typedef struct model_traits {
    model_mlp_kind mlp;
    model_attention_kind attention;
    int phi_a8;   /* under W·A8 the mHC phi products read quantized rows (a QAT point) */
    int heads_a8; /* under W·A8 the attention quantizes its q/k/v heads (kv_bits 8) */
} model_traits;

typedef struct model_weights {
    model_traits traits;
    /* geometry */
    uint32_t d, n_lanes, n_layers, n_heads, n_kv_heads, head_dim, attn_dim, kv_dim, vocab;
    uint32_t hada_n, n_sites, n_tables, slots, sub_dim, taps, dilation, n_orders;
    uint32_t orders[MODEL_MAX_ORDERS];
    uint32_t max_order;
    uint32_t group;                      /* the CQ group size of every CQ tensor */

    cq_matrix embedding;                 /* [vocab][d], tied output */
    layer_weights *layers;               /* [n_layers] */
    const float *a_pre, *a_post, *a_res; /* [L] */
    const float *b_pre, *b_post;         /* [L][n] */
    const float *b_res;                  /* [L][n][n] */
    cq_matrix phi_pre, phi_post;         /* [L*n][n*d] */
    cq_matrix phi_res;                   /* [L*n*n][n*d] */
    engram_site sites[MODEL_MAX_SITES];
    const float *final_norm;             /* [d] */

    /* Needle 3. Needle 2 sets qk_dim = v_dim = head_dim, out_vocab = vocab and leaves
     * the rest zero. For Needle 3 head_dim = qk_dim, and attn_dim / kv_dim are the widest
     * of the q|gate and k|v rows (buffer and cache row sizes). `layers` and `sites` are
     * those of the rung being run (model depth). */
    uint32_t qk_dim, v_dim;              /* per-head widths of q/k and of v/gate/o */
    uint32_t out_vocab;                  /* logits rows; later embedding rows are input-only */
    uint32_t conv_taps;                  /* q/k/v causal conv taps (0 = none) */
    uint32_t hada_ba, hada_bb;           /* Kronecker factor sizes, ba * bb = hada_n */
    uint32_t seed_stride;                /* engram hash: seed index = order * stride + head */
    const uint32_t *perm1, *perm2;       /* [hada_n] Monarch gathers z'[i] = z[perm[i]] */
    layer3_weights *layers3;             /* [n_layers] */
    const uint32_t *file_layer;          /* [n_layers] the file's layer each one runs: its
                                          * rows of mhc_phi_* (a ladder rung skips some) */

    /* what a device backend uploads once per model (ops->model_load) */
    const uint8_t *image;                /* the validated .cact bytes the views point into */
    size_t image_size;
    int image_mapped;                    /* 1: image is a page-aligned mmap of a file */
    const float *codebooks;              /* [6][16] levels, the file's codebooks */
    size_t codebooks_bytes;
    float *arena;                        /* widened FP tensors, owned by the model */
    size_t arena_floats;
} model_weights;

#endif
