/* Probe heads (spec §4): attention pooling over the forward's per-layer cells, and the
 * Needle 2 contrastive (retrieval) and confidence heads on top of it.
 *
 * Cells (§4.1): for every token, cell 0 is the scaled embedding and cell i (1..L) the mean
 * of the lanes after layer i-1. The forward pass hands them over as they are computed
 * (a run's session_cells), so pooling needs no second pass and no cell storage: each
 * probe keeps an online softmax (running max, running sum, a d-vector accumulator), which
 * gives the softmax over all cells jointly whatever order they arrive in. Tokens equal to
 * PAD (id 0) are skipped.
 *
 * A head_pool is small (P * (d + 2) floats) and plain data, so a layer above can copy it
 * to save and restore the pooling state along with a session checkpoint.
 *
 * Generations: a Needle 2 head pools every probe over all cells jointly (one stage). A
 * Needle 3 head (NEEDLE3.md §3, bound by heads3.c) pools probe (l, k) over the tokens of
 * cell l only (the same online softmax, fed only the cells whose index is l), then
 * head_pool_output mixes the (L+1) K results per query in a second stage. */
#ifndef NEEDLE_MODEL_HEADS_H
#define NEEDLE_MODEL_HEADS_H

#include <stdint.h>

#include "model/model.h"

#define HEAD_CODE_CONTRASTIVE 1u
#define HEAD_CODE_CONFIDENCE 2u
#define HEAD_EMBED_DIM 128u /* the Needle 2 contrastive head's output */

typedef struct head_pool {
    const probe_head *head;
    uint32_t d, num_probes;
    float *max;            /* [P] running max score */
    float *sum;            /* [P] running sum of exp(score - max) */
    float *acc;            /* [P][d] running sum of exp(score - max) * cell */
    uint64_t cells;        /* cells pooled so far */
} head_pool;

/* The model's head with `code`, or NULL when the file has none. */
const probe_head *model_probe_head(const struct needle_model *m, uint32_t code);

/* Allocates an empty pool for `head`. 0 or NEEDLE_ERR_OUT_OF_MEMORY. */
int head_pool_init(head_pool *p, const probe_head *head, uint32_t d);
void head_pool_free(head_pool *p);
void head_pool_clear(head_pool *p);
/* dst (initialised for the same head) := src. */
void head_pool_copy(head_pool *dst, const head_pool *src);

/* Pools cell `cell_index` (0..L, see above) of n tokens: cells is host [n][d];
 * tokens[i] == 0 (PAD) skipped. Needle 2 pools every cell alike. */
void head_pool_add(head_pool *p, const int32_t *tokens, uint32_t n, uint32_t cell_index,
                   const float *cells);

/* The head's output from the cells pooled so far: proj . concat_k(pooled_k) + bias, and,
 * for the contrastive head, divided by sqrt(sum y^2 + 1e-12) (§4.3). out has head->out_dim
 * floats. NEEDLE_ERR_STATE when no cell was pooled yet. */
int head_pool_output(const head_pool *p, float *out);

/* <a, b> over n floats in eight partial sums, a fixed order: what the pooling's scores use
 * (shared with the head's training, train/conf_head.c). */
float head_dot(const float *a, const float *b, uint32_t n);

/* The confidence head's logit mapped to [0, 1] (a sigmoid; spec §4.3 leaves it open). */
float head_confidence_probability(float logit);

/* Cosine of two unit vectors of n floats (the contrastive similarity, §4.3). */
float head_similarity(const float *a, const float *b, uint32_t n);

#endif
