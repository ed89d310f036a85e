/* numpy's default generator, np.random.default_rng(seed) (SeedSequence -> PCG64 XSL-RR), as
 * far as the official fine-tuner draws from it: cactus-needle 3.2.8 finetune_local seeds
 * one with --seed, takes the held-out split from its first permutation and each epoch's
 * batch order from the next ones (and _score_quantised scores the first n_val of a fresh
 * generator's first permutation: the same examples). Reproducing the draws bit for bit
 * makes our held-out split and batches the official ones for the same data and seed.
 *
 * Portable C11: the 128-bit state is two 64-bit halves. */
#ifndef NEEDLE_TRAIN_NP_PCG64_H
#define NEEDLE_TRAIN_NP_PCG64_H

#include <stdint.h>

typedef struct np_pcg64 {
    uint64_t state_hi, state_lo, inc_hi, inc_lo;
    uint32_t buffered; /* the high half of the last 64-bit draw, when has_buffered */
    int has_buffered;
} np_pcg64;

/* np.random.default_rng(seed) for a non-negative integer seed. */
void np_pcg64_seed(np_pcg64 *g, uint64_t seed);
uint64_t np_pcg64_next64(np_pcg64 *g);
/* numpy's next_uint32: the low half of a 64-bit draw, then its high half */
uint32_t np_pcg64_next32(np_pcg64 *g);
/* a double in [0, 1) from 53 bits (numpy's next_double) */
double np_pcg64_double(np_pcg64 *g);
/* p[0..n) = Generator.permutation(n): arange, then Fisher-Yates from the top drawing each
 * index by masked rejection (random_interval) */
void np_pcg64_permutation(np_pcg64 *g, uint32_t n, uint32_t *p);

#endif
