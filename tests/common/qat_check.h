/* The checks of W·A8 against the official QAT forward that test_a8_parity.c (Needle 2) and
 * test_a8_v3.c (Needle 3) share; each test reads its own fixture format into a qat_case.
 *
 * Exact agreement is only possible up to the first rounding flip: the engine's float
 * activations differ from the reference's by float rounding, so an element the reference
 * put within that distance of a .5 tie may round the other way, and from then on that row
 * and every later one (through the KV cache) see a slightly different int8 vector. The
 * fixtures record, per row, the reference's smallest distance to a tie (round_margin, in
 * quantization steps). So, by prefill and by one-token steps:
 *   - every row before the first flip is within `flip_error` x max|logit|; the first row
 *     beyond it must be one whose round_margin is below `flip_margin`: a flip anywhere else
 *     means the quantization is not the reference's;
 *   - the argmax agrees on every row whose top-1/top-2 gap is clear of a flip's effect
 *     (`gap` x max|logit|);
 * and per model (qat_finish_model): A8's mean error against the QAT reference is below
 * `closer` x the float engine's, and greedy decoding from the prompt agrees with the
 * reference's QAT greedy on at least 80% of the tokens (a flip can tip a close step). */
#ifndef NEEDLE_TESTS_QAT_CHECK_H
#define NEEDLE_TESTS_QAT_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "needle.h"

typedef struct qat_case {
    int32_t *seq; /* prompt + greedy[:-1]: the rows of the reference */
    size_t n_prompt, n_seq, n_greedy;
    int32_t *greedy;
    double *round_margin; /* [n_seq] */
    float *ref;           /* [n_seq][cols] */
    uint32_t cols;        /* logits per reference row (out_vocab) */
    uint32_t sinks;       /* session settings the case was made with */
    int32_t window;
} qat_case;

typedef struct qat_limits {
    double flip_error;  /* a row further than this from the reference has seen a flip */
    double flip_margin; /* quantization steps */
    double gap;
    double closer;
} qat_limits;

typedef struct qat_stats {
    int cases;
    char flips[256]; /* "row(margin) ..." per case, prefill */
    double worst_before, mean_a8, mean_f32;
    size_t rows, argmax_same, greedy_same, greedy_total;
} qat_stats;

/* Allocates seq, greedy and round_margin for the sizes already set in `qc`. */
void qat_case_alloc(qat_case *qc);
void qat_case_free(qat_case *qc);

/* max |a - ref| / max |ref| over n logits (INFINITY for NaN) */
double qat_row_error(const float *a, const float *ref, uint32_t n);
int qat_argmax(const float *x, uint32_t n);

/* Every check above on one case of model `m` (vocab: the engine's row width). `steps`:
 * also by one-token steps. Adds the case's figures to `st`. */
void qat_check_case(needle_model *m, const char *name, int k, const qat_case *qc,
                    uint32_t vocab, int steps, const qat_limits *lim, qat_stats *st);

/* The per-model checks over the accumulated `st`, and its line of figures. */
void qat_finish_model(const char *name, qat_stats *st, const qat_limits *lim);

#endif
