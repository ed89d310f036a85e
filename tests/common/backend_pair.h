/* What test_backend_ops.c (Needle 2) and test_backend_ops3.c (Needle 3) share to compare a
 * backend's operations with the CPU's: a pair of sessions on one model, one on the CPU ops
 * and one on the ops under test ("dut"), fed the same inputs, compared within a tolerance;
 * the whole-forward comparison; the model set-up a device backend needs; and the loop over
 * the compiled-in GPU backends. */
#ifndef NEEDLE_TESTS_BACKEND_PAIR_H
#define NEEDLE_TESTS_BACKEND_PAIR_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/session.h"
#include "needle.h"

typedef struct pair {
    const char *name; /* the implementation and case under test, for messages */
    model_session *ref, *dut;
    double tol; /* |out - ref| <= tol x max(1, max|ref|) per op call */
} pair;

/* Uniform in [-1, 1) from a fixed xorshift sequence; bp_seed restarts it. */
void bp_seed(uint64_t seed);
float bp_frand(void);
/* n values scale * bp_frand(), malloc'd (at least one element) */
float *bp_rand_vec(size_t n, float scale);

/* Sessions with `sp` on the CPU ops and on `ops`; 1 if both exist (else both freed, a
 * failed check recorded, 0). */
int bp_open(const needle_model *m, const needle_backend_ops *ops, const char *name,
            const needle_session_params *sp, double tol, pair *p);
void bp_close(pair *p);

/* Uploads the same n host floats into a buffer of each session. */
void bp_put(pair *p, void *ref_buf, void *dut_buf, const float *host, size_t n);
/* Checks n floats of both sessions' buffers within the pair's tolerance; `what` names the
 * op. */
void bp_expect_close(pair *p, const void *ref_buf, const void *dut_buf, size_t n,
                     const char *what);

/* Worst over n rows (stride `ld`) of max_v |a - b| / max_v |a| over the first `cols`. */
double bp_worst_rel(const float *a, const float *b, uint32_t n, size_t ld, uint32_t cols);
/* Greedy tokens from both sessions' current logits, `steps` of them, fed back to both;
 * checks they agree. */
void bp_expect_same_greedy(pair *p, int steps);

/* Opens a fixture model on the CPU (`depth` 0: the whole ladder) and, if `ops` has its own
 * weights, loads them onto it. NULL on failure (a failed check recorded). */
needle_model *bp_model_open(const char *fixture, int32_t depth, const needle_backend_ops *ops);
void bp_model_close(needle_model *m, const needle_backend_ops *ops);

/* run(ops, name) for every compiled-in backend other than the CPU whose probe finds a
 * device, if `accept` (may be NULL) takes it; skips the test when none ran. */
void bp_run_compiled_backends(void (*run)(const needle_backend_ops *, const char *),
                              int (*accept)(const needle_backend_impl *));

#endif
