/* The Mersenne Twister MT19937 as numpy's legacy RandomState seeds and draws it. The
 * exporters reproduce two numpy draws bit for bit: the Lloyd-Max codebooks' Gaussian
 * samples (cq_codebook.c) and Needle 3's Hadamard permutations (export_model_v3.c, and the
 * training core's forward, src/train/grad3.c). */
#ifndef NEEDLE_QUANT_MT19937_H
#define NEEDLE_QUANT_MT19937_H

#include <stdint.h>

typedef struct mt19937 {
    uint32_t s[624];
    int i;
} mt19937;

/* init_genrand(seed): what RandomState(seed) does for a 32-bit integer seed */
void mt_seed(mt19937 *m, uint32_t seed);
/* the next tempered 32-bit output */
uint32_t mt_next(mt19937 *m);
/* p[0..n) = RandomState(seed).permutation(n): arange, then the legacy Fisher-Yates shuffle
 * drawing each index by masked rejection (random_interval) */
void mt_permutation(uint32_t seed, uint32_t n, uint32_t *p);

#endif
