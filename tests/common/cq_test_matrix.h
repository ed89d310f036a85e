/* Random CQ matrices for the kernel tests that compare a fast product with the plain one
 * (test_simd, test_cq_decode): a seedable xorshift stream, matrices with random codes,
 * norms and codebook, and the tolerance scale of a row's product. */
#ifndef NEEDLE_TESTS_CQ_TEST_MATRIX_H
#define NEEDLE_TESTS_CQ_TEST_MATRIX_H

#include <stdint.h>

#include "kernels/cq.h"

/* Kernel results may differ from the plain product by float rounding in another order:
 * the tolerance is relative to the row's magnitude (cq_magnitude); observed ~1e-7. */
#define CQ_TEST_TOL 2e-6

/* Each test picks its own stream. */
void rnd_seed(uint64_t seed);
uint32_t rnd(void);
float rnd_float(void); /* uniform in [-1, 1], steps of 1e-4 */

typedef struct test_matrix {
    cq_matrix w;
    uint8_t *codes;
    uint16_t *norms;
    float codebook[16];
} test_matrix;

/* Random codes (any bit pattern is a valid index stream), norms and codebook. The code
 * buffer is allocated to the exact size so that ASan catches any read past the end. */
void make_matrix(test_matrix *tm, uint32_t rows, uint32_t cols, uint32_t group, uint32_t bits);
void free_matrix(test_matrix *tm);

/* sum_k |w_k x_k| for row r and token vector x (rotated domain, unscaled levels). */
double cq_magnitude(const cq_matrix *w, uint32_t r, const float *x);

#endif
