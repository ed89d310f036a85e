/* W·A8 against the official QAT forward: the checks both model generations share (see
 * qat_check.h). */
#include "qat_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

void qat_case_alloc(qat_case *qc) {
    qc->seq = malloc(qc->n_seq * sizeof *qc->seq);
    qc->greedy = malloc(qc->n_greedy * sizeof *qc->greedy);
    qc->round_margin = malloc(qc->n_seq * sizeof *qc->round_margin);
}

void qat_case_free(qat_case *qc) {
    free(qc->seq);
    free(qc->greedy);
    free(qc->round_margin);
    free(qc->ref);
}

double qat_row_error(const float *a, const float *ref, uint32_t n) {
    double mx = 0, err = 0;
    for (uint32_t v = 0; v < n; v++) {
        mx = fmax(mx, fabs(ref[v]));
        err = fmax(err, fabs((double)a[v] - ref[v]));
    }
    const double rel = mx > 0 ? err / mx : err;
    return rel == rel ? rel : INFINITY;
}

int qat_argmax(const float *x, uint32_t n) {
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int)i;
    return best;
}

/* (top1 - top2) / max|x| */
static double top_gap(const float *x, uint32_t n) {
    double a = -INFINITY, b = -INFINITY, mx = 0;
    for (uint32_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(x[i]));
        if (x[i] > a) {
            b = a;
            a = x[i];
        } else if (x[i] > b) {
            b = x[i];
        }
    }
    return mx > 0 ? (a - b) / mx : 0;
}

static needle_session_params case_params(const qat_case *qc, int32_t act) {
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = (uint32_t)qc->n_seq + 2;
    sp.kv_window = qc->window;
    sp.n_sinks = qc->sinks;
    sp.activations = act;
    return sp;
}

/* The [n_seq][vocab] rows by one prefill (steps = 0) or one token per eval. */
static int session_rows(needle_model *m, const qat_case *qc, int32_t act, int steps,
                        uint32_t vocab, float *out) {
    const needle_session_params sp = case_params(qc, act);
    needle_session *s;
    int rc = needle_session_create(m, &sp, &s);
    if (rc) return rc;
    if (!steps) rc = needle_session_eval(s, qc->seq, qc->n_seq, out, qc->n_seq * vocab);
    for (size_t i = 0; steps && !rc && i < qc->n_seq; i++)
        rc = needle_session_eval(s, qc->seq + i, 1, out + i * vocab, vocab);
    needle_session_free(s);
    return rc;
}

static void check_rows(const char *name, int k, const char *how, const qat_case *qc,
                       const float *a8, uint32_t vocab, const qat_limits *lim, qat_stats *st,
                       int record) {
    size_t flip = qc->n_seq;
    for (size_t p = 0; p < qc->n_seq; p++) {
        const double e = qat_row_error(a8 + p * vocab, qc->ref + p * qc->cols, qc->cols);
        if (e > lim->flip_error) {
            flip = p;
            break;
        }
        if (record && e > st->worst_before) st->worst_before = e;
    }
    const size_t len = strlen(st->flips);
    if (flip < qc->n_seq) {
        CHECK_MSG(qc->round_margin[flip] < lim->flip_margin, "%s case %d %s: first flip at row "
                  "%zu, where the reference's rounding margin is %.3g steps (>= %g)", name, k,
                  how, flip, qc->round_margin[flip], lim->flip_margin);
        if (record)
            snprintf(st->flips + len, sizeof st->flips - len, " %zu(%.1e)", flip,
                     qc->round_margin[flip]);
    } else if (record) {
        snprintf(st->flips + len, sizeof st->flips - len, " -");
    }
    for (size_t p = 0; p < qc->n_seq; p++) {
        const float *ref = qc->ref + p * qc->cols;
        const int ours = qat_argmax(a8 + p * vocab, qc->cols), theirs = qat_argmax(ref, qc->cols);
        CHECK_MSG(ours == theirs || top_gap(ref, qc->cols) < lim->gap, "%s case %d %s row %zu: "
                  "argmax %d vs %d with a reference gap of %.3f", name, k, how, p, ours, theirs,
                  top_gap(ref, qc->cols));
        if (record) st->argmax_same += (size_t)(ours == theirs);
    }
}

void qat_check_case(needle_model *m, const char *name, int k, const qat_case *qc,
                    uint32_t vocab, int steps, const qat_limits *lim, qat_stats *st) {
    float *a8 = malloc(qc->n_seq * vocab * sizeof *a8);
    float *f32 = malloc(qc->n_seq * vocab * sizeof *f32);
    CHECK_EQ_INT(session_rows(m, qc, NEEDLE_ACT_A8, 0, vocab, a8), NEEDLE_OK);
    check_rows(name, k, "prefill", qc, a8, vocab, lim, st, 1);
    CHECK_EQ_INT(session_rows(m, qc, NEEDLE_ACT_F32, 0, vocab, f32), NEEDLE_OK);
    for (size_t p = 0; p < qc->n_seq; p++) {
        st->mean_a8 += qat_row_error(a8 + p * vocab, qc->ref + p * qc->cols, qc->cols);
        st->mean_f32 += qat_row_error(f32 + p * vocab, qc->ref + p * qc->cols, qc->cols);
    }
    st->rows += qc->n_seq;
    if (steps) {
        CHECK_EQ_INT(session_rows(m, qc, NEEDLE_ACT_A8, 1, vocab, a8), NEEDLE_OK);
        check_rows(name, k, "one-token steps", qc, a8, vocab, lim, st, 0);
    }
    /* free-running greedy from the prompt */
    const needle_session_params sp = case_params(qc, NEEDLE_ACT_A8);
    needle_session *s;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_eval(s, qc->seq, qc->n_prompt, NULL, 0), NEEDLE_OK);
    size_t same = 0;
    for (size_t i = 0; i < qc->n_greedy; i++) {
        int32_t next = qat_argmax(needle_session_logits(s), qc->cols);
        if (next != qc->greedy[i]) break;
        same++;
        if (i + 1 < qc->n_greedy) CHECK_EQ_INT(needle_session_eval(s, &next, 1, NULL, 0), NEEDLE_OK);
    }
    needle_session_free(s);
    st->greedy_same += same;
    st->greedy_total += qc->n_greedy;
    st->cases++;
    free(a8);
    free(f32);
}

void qat_finish_model(const char *name, qat_stats *st, const qat_limits *lim) {
    st->mean_a8 /= (double)(st->rows ? st->rows : 1);
    st->mean_f32 /= (double)(st->rows ? st->rows : 1);
    CHECK_MSG(st->mean_a8 < lim->closer * st->mean_f32, "%s: A8's mean relative error against "
              "the QAT reference is not below %g x the float engine's (%.3g vs %.3g)", name,
              lim->closer, st->mean_a8, st->mean_f32);
    CHECK_MSG(st->greedy_same * 10 >= st->greedy_total * 8, "%s: A8 greedy agrees with the QAT "
              "greedy on only %zu of %zu tokens", name, st->greedy_same, st->greedy_total);
    printf("  %s: %d cases, first flip row(margin):%s; worst error before a flip %.1e; mean "
           "error A8 %.1e vs float %.1e; argmax %zu/%zu rows; greedy %zu/%zu\n", name,
           st->cases, st->flips, st->worst_before, st->mean_a8, st->mean_f32, st->argmax_same,
           st->rows, st->greedy_same, st->greedy_total);
}
