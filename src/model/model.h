/* The loaded model: a validated .cact image bound into typed weights (spec §1.9, §3).
 *
 * Binding happens once at load: CQ tensors become cq_matrix views into the mapped file
 * (no copy), small FP16/FP32 tensors (norms, gates, diagonals, taps, mHC a/b) are widened
 * into one float arena, because the forward pass reads them on every token. After
 * model_bind() succeeds every pointer below is valid and sized by the header geometry. */
#ifndef NEEDLE_MODEL_MODEL_H
#define NEEDLE_MODEL_MODEL_H

#include "format/cact.h"
#include "kernels/cq.h"
#include "needle.h"
#include "tokenizer/tokenizer.h"

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
    cq_matrix tables;              /* [T * slots][sub] */
    cq_matrix key_proj, value_proj; /* [d][T * sub] */
    const float *taps;             /* [taps][d] */
} engram_site;

typedef struct probe_head {
    uint32_t code, num_probes, out_dim;
    const float *probes; /* [P][d] */
    const float *proj;   /* [out][P * d] */
    const float *bias;   /* [out] */
} probe_head;

struct needle_model {
    cact_file file;
    const uint8_t *image;   /* the validated bytes */
    size_t image_size;
    void *mapping;          /* mmap of a file, or NULL */
    void *owned;            /* aligned copy of a misaligned blob, or NULL */
    tokenizer *tok;         /* NULL if the file has no tokenizer */
    needle_model_info info;
    int32_t n_threads;
    const struct needle_backend_impl *backend; /* chosen at open (backend/backend.h) */
    void *device_weights;   /* the backend's copy of the weights (ops->model_load), or NULL */

    /* geometry shortcuts */
    uint32_t d, n_lanes, n_layers, n_heads, n_kv_heads, head_dim, attn_dim, kv_dim, vocab;
    uint32_t hada_n, n_sites, n_tables, slots, sub_dim, taps, dilation, n_orders;
    uint32_t orders[4];
    uint32_t max_order;

    float *arena;            /* widened FP tensors */
    size_t arena_floats;
    const float **fp;        /* [num_tensors] -> widened values (NULL for CQ/RAW) */
    cq_matrix embedding;     /* [vocab][d], tied output */
    layer_weights *layers;   /* [n_layers] */
    const float *a_pre, *a_post, *a_res; /* [L] */
    const float *b_pre, *b_post;         /* [L][n] */
    const float *b_res;                  /* [L][n][n] */
    cq_matrix phi_pre, phi_post;         /* [L*n][n*d] */
    cq_matrix phi_res;                   /* [L*n*n][n*d] */
    engram_site sites[4];
    const float *final_norm;             /* [d] */
    uint32_t n_probe_heads;
    probe_head probe_heads[CACT_MAX_PROBE_HEADS];
    float *rope_freq;                    /* [head_dim / 2] */
};

/* Validates and binds an image that stays valid for the model's life. */
int model_bind(struct needle_model *m, const uint8_t *image, size_t size);
void model_unbind(struct needle_model *m);

/* Engram site index of `layer`, or -1. */
int model_site_of(const struct needle_model *m, uint32_t layer);

/* Fills a cq_matrix view of CQ record `index` (validated by cact_parse). */
void model_cq_view(const struct needle_model *m, uint32_t index, cq_matrix *out);

#endif
