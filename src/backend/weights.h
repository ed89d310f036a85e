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

#define MODEL_MAX_SITES 4u
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

typedef struct engram_site {
    uint32_t layer;
    cq_matrix tables;               /* [T * slots][sub] */
    cq_matrix key_proj, value_proj; /* [d][T * sub] */
    const float *taps;              /* [taps][d] */
} engram_site;

typedef struct model_weights {
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
