/* The 4-lane mHC write (§3.4) in AVX2 and AVX-512 vectors: the Sinkhorn of several tokens
 * at once, several tokens to a vector, and the lane rewrite in one pass over the lanes.
 *
 * Both give exactly the bits of the portable code (nm_sinkhorn, and the rewrite loop of
 * backend/cpu_ops.c): the same multiplies and adds in the same order, no fma, so a token's
 * lanes do not depend on the kernel level's batch, the chunking or the thread count
 * (tests/test_lanes.c compares them bit for bit). */
#ifndef NEEDLE_KERNELS_CPU_LANE_WIDE_H
#define NEEDLE_KERNELS_CPU_LANE_WIDE_H

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
} lane_wide_kernels;

/* The table of kernel level `name` ("avx2", "avx512") when this build and this CPU have
 * it, else NULL (the caller keeps the portable code: scalar, NEON, other lane counts). */
const lane_wide_kernels *lane_wide_kernels_named(const char *name);

#endif
