/* The 4-lane mHC ops (§3.4) in AVX2 and AVX-512 vectors: the Sinkhorn of several tokens
 * at once, several tokens to a vector, and the lane rewrite in one pass over the lanes.
 *
 * Also the lane read's weighted sum, the lane norm of several tokens at once and the
 * Hadamard MLP's gate (the same exp, over wider vectors). All give
 * exactly the bits of the portable code (nm_sinkhorn, nm_rms_unit, and the loops of
 * backend/cpu/ops.c): the same multiplies and adds in the same order, no fma, so a token's
 * lanes do not depend on the kernel level's batch, the chunking or the thread count
 * (tests/kernels/test_lanes.c compares them bit for bit). */
#ifndef NEEDLE_KERNELS_CPU_LANE_WIDE_H
#define NEEDLE_KERNELS_CPU_LANE_WIDE_H

#include <stddef.h>
#include <stdint.h>

/* The most tokens one sinkhorn4 call takes, over every level. */
#define LANE_WIDE_MAX_BATCH 16

typedef struct lane_wide_kernels {
    const char *name;       /* "avx2", "avx512" */
    uint32_t sinkhorn_batch; /* tokens per sinkhorn4 call that fill the vectors */
    /* nm_sinkhorn(P + 16 j, 4) for j < count (count <= sinkhorn_batch) */
    void (*sinkhorn4)(float *P, uint32_t count);
    /* The lanes X ([4][d]) rewritten in place: X'[r][k] = hpost[r] * y[k] + sum over c of
     * P[4 r + c] * X[c][k], accumulated in the order c = 0..3. */
    void (*rewrite4)(float *X, const float *y, const float *P, const float *hpost, uint32_t d);
    /* The lane read: u[k] = bx[k] = sum over r of w[r] * X[r][k], summed from 0 in the
     * order r = 0..3 (X is [4][d]). */
    void (*read4)(const float *X, const float *w, uint32_t d, float *u, float *bx);
    /* nm_rms_unit of `count` (<= LANE_NORM_BATCH) rows of n floats: row t from x + t * ld_x
     * to out + t * ld_out. Each row's sum of squares is a chain of dependent adds in the
     * fixed order of nm_mean_square; the rows' chains run interleaved. */
    void (*rms_unit_rows)(const float *x, size_t ld_x, uint32_t n, uint32_t count, float *out,
                          size_t ld_out);
    /* The Hadamard MLP's gate (§3.7), lane_hada_gate of kernels/cpu/lane_math.h */
    void (*hada_gate)(float *z, const float *d2, float scale, uint32_t n);
} lane_wide_kernels;

/* The most rows one rms_unit_rows call takes. */
#define LANE_NORM_BATCH 4

/* The table of kernel level `name` ("avx2", "avx512") when this build and this CPU have
 * it, else NULL (the caller keeps the portable code: scalar, NEON, other lane counts). */
const lane_wide_kernels *lane_wide_kernels_named(const char *name);

#endif
