/* Training the Needle 3 confidence head (`needle calibrate`): the probe head that scores a
 * completion (docs/spec/NEEDLE3.md §3; cactus-needle 3.2.8 ProbeHead / probe_pool), fitted to
 * whether the engine's answers were right, with the trunk frozen.
 *
 * The official fine-tuning never reaches the head (its loss is the language model's), so
 * its build drops the head of a tuned network and confidence reports None. Here the head
 * is trained after the trunk: the engine answers examples, each answer is scored exact or
 * not, and the head learns P(exact) from the cells the forward pass made over BOS + prompt
 * + completion (what it pools when it runs in the engine), by binary cross-entropy on its
 * logit. The trunk does not change, so the cells of an example are computed once and kept
 * (bfloat16, [rows][T][d]), and training the head is cheap.
 *
 * For one example with cells c[l][t] (l = 0..L, the rows of §3), the head computes
 *   s[l,k,t] = <c[l][t], probes[l,k]> / sqrt(d);  a = softmax over t
 *   m[l,k]   = sum_t a[l,k,t] c[l][t];  r[l,k] = m / sqrt(mean(m^2) + 1e-6) * gain[l,k]
 *   u[q,l,k] = <r[l,k], query[q]> / sqrt(d) + row_bias[q,l,k];  w = softmax over (l,k)
 *   pooled[q] = sum_(l,k) w[q,l,k] r[l,k];  y = <proj, pooled (q-major)> + bias
 * in float32, as model/heads.c computes it in the engine (tested against it). The
 * parameters are one flat vector in the order of conf_head_params' names; proj is the
 * checkpoint's kernel [Q d, 1] read flat. */
#ifndef NEEDLE_TRAIN_CONF_HEAD_H
#define NEEDLE_TRAIN_CONF_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include "needle.h"

#define CONF_HEAD_TENSORS 6

typedef struct conf_head_shape {
    uint32_t rows; /* L + 1 */
    uint32_t per_row, queries, d;
} conf_head_shape;

/* The checkpoint names of the six parameter tensors (confidence_head/probes, ...), in
 * the flat vector's order, and their sizes for `sh`; returns the total. */
extern const char *const conf_head_names[CONF_HEAD_TENSORS];
size_t conf_head_layout(const conf_head_shape *sh, uint64_t numel[CONF_HEAD_TENSORS]);

/* Scratch for one example of up to max_tokens tokens (conf_head_scratch_free). */
typedef struct conf_head_scratch {
    float *attn;   /* [rows per_row][T] the stage-1 softmax */
    float *m;      /* [P][d] pooled cells before the norm */
    float *rhat;   /* [P][d] after the norm, before the gain */
    float *rms;    /* [P] the norm's divisor */
    float *r;      /* [P][d] */
    float *w;      /* [Q][P] the stage-2 softmax */
    float *pooled; /* [Q][d] */
    float *da;     /* [per_row][T] */
    float *dr, *dm, *row; /* [P][d], [P][d], [d] */
    uint32_t max_tokens;
} conf_head_scratch;

int conf_head_scratch_init(conf_head_scratch *s, const conf_head_shape *sh, uint32_t max_tokens);
void conf_head_scratch_free(conf_head_scratch *s);

/* The head's logit for one example's cells (bfloat16 [rows][T][d]), leaving in `s` what
 * the backward needs. T >= 1. */
float conf_head_forward(const conf_head_shape *sh, const float *theta, const uint16_t *cells,
                        uint32_t T, conf_head_scratch *s);

/* Adds dL/dtheta to grad for dL/dlogit = dy, after conf_head_forward on the same example
 * (s as it left it). */
void conf_head_backward(const conf_head_shape *sh, const float *theta, const uint16_t *cells,
                        uint32_t T, float dy, conf_head_scratch *s, float *grad);

/* ---- the cells of a turn, from a session (conf_head_cells.c) ---------------------------- */

typedef struct conf_head_cells conf_head_cells;

/* From the session's next needle_session_set_tools on, every cell a confidence head would
 * pool (whether the model has one or not) is also kept here, rows = L + 1
 * cells of d floats per token (PAD skipped, as the pooling skips it). Free it after the
 * session: the conversation keeps the receiver. */
int conf_head_cells_attach(needle_session *s, uint32_t rows, uint32_t d, conf_head_cells **out);
void conf_head_cells_clear(conf_head_cells *c);
/* The cells since the last clear as a malloc'd bfloat16 [rows][T][d] and T. Returns
 * NEEDLE_ERR_STATE (with a message) when no token came or the rows got different
 * numbers of tokens, NEEDLE_ERR_OUT_OF_MEMORY when keeping or copying them failed. */
int conf_head_cells_take(conf_head_cells *c, uint16_t **cells, uint32_t *T);
void conf_head_cells_free(conf_head_cells *c);

/* float -> bfloat16 (round to nearest even) and back. */
uint16_t conf_head_bf16(float x);
static inline float conf_head_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}

#endif
