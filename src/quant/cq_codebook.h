/* The CQ codebooks as the official exporter computes them (spec §2.1-2.2).
 *
 * b = 2, 3, 4: Lloyd-Max centroids of 400000 standard normal draws from numpy's legacy
 * RandomState(0).randn (MT19937 + the polar Gaussian), 200 iterations, sorted, divided by
 * sqrt(G) in double and rounded to float. Ternary: {-c, 0, +c} / sqrt(G), c = 1.2240064.
 * Every step (the draws, the sort, numpy's pairwise summation of each region's mean)
 * follows the reference so the float values come out bit-identical to the file header
 * the official exporter writes. */
#ifndef NEEDLE_QUANT_CQ_CODEBOOK_H
#define NEEDLE_QUANT_CQ_CODEBOOK_H

#include <stdint.h>

#define CQ_TERNARY 5u /* record width of the 3-level codebook (spec §1.3) */

typedef struct cq_codebooks {
    uint32_t group;
    float levels[6][16]; /* [2], [3], [4]: 2^b sorted levels; [5]: ternary {-c, 0, +c};
                          * [1]: Needle 3 binary, set only to decode (cact_requantize) */
} cq_codebooks;

/* Fills every codebook for group size `group` (a power of two). Returns 0, or a negative
 * needle_status (out of memory) with the thread's message set. Takes ~0.1 s. */
int cq_codebooks_init(cq_codebooks *cb, uint32_t group);

/* Number of levels of record width `bits` (2, 3, 4 or CQ_TERNARY); 0 for other values. */
uint32_t cq_levels(uint32_t bits);

/* Unit-variance Lloyd-Max centroids (before the 1/sqrt(G) scale) for b in {2,3,4},
 * ascending, into out[2^b]. Exposed for tests. Returns 0 or a negative status. */
int cq_lloyd_max_gaussian(uint32_t bits, double *out);

#endif
