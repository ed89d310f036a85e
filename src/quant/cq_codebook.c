/* Lloyd-Max codebooks, reproduced step for step from the official quantize.py so that the
 * f32 values match its header bytes. The draws are numpy's legacy RandomState: MT19937
 * seeded by init_genrand(seed), 53-bit doubles from two outputs (a >> 5, b >> 6), and the
 * polar Box-Muller method that returns the second value of each accepted pair first and
 * caches the first. Region means use numpy's pairwise summation (8 accumulators up to
 * 128 values, halves split at multiples of 8 above) because that is how ndarray.mean
 * adds; a different order moves the last bits of the centroids. */
#include "quant/cq_codebook.h"

#include <math.h>
#include <stdlib.h>

#include "quant/mt19937.h"
#include "util/error.h"

#define LM_SAMPLES 400000u
#define LM_ITERS 200
#define TERNARY_LEVEL 1.2240064

static double mt_double(mt19937 *m) {
    const uint32_t a = mt_next(m) >> 5, b = mt_next(m) >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy's pairwise_sum for a contiguous float64 run */
static double pairwise_sum(const double *a, size_t n) {
    if (n < 8) {
        double r = 0.0;
        for (size_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        size_t i;
        for (i = 8; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* first index of sorted x[0..n) whose value is > v (searchsorted "left" puts x == v below
 * the boundary, so a sample equal to a boundary belongs to the lower region) */
static size_t upper_bound(const double *x, size_t n, double v) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (x[mid] > v)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

int cq_lloyd_max_gaussian(uint32_t bits, double *c) {
    if (bits < 2 || bits > 4) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "Lloyd-Max width %u", bits);
    const uint32_t levels = 1u << bits;
    double *x = malloc(LM_SAMPLES * sizeof *x);
    mt19937 *m = malloc(sizeof *m);
    if (!x || !m) {
        free(x);
        free(m);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory for the codebook samples");
    }
    mt_seed(m, 0);
    for (size_t i = 0; i < LM_SAMPLES; i += 2) {
        double x1, x2, r2;
        do {
            x1 = 2.0 * mt_double(m) - 1.0;
            x2 = 2.0 * mt_double(m) - 1.0;
            r2 = x1 * x1 + x2 * x2;
        } while (r2 >= 1.0 || r2 == 0.0);
        const double f = sqrt(-2.0 * log(r2) / r2);
        x[i] = f * x2;
        x[i + 1] = f * x1;
    }
    free(m);
    qsort(x, LM_SAMPLES, sizeof *x, cmp_double);
    for (uint32_t k = 0; k < levels; k++) c[k] = x[(size_t)(((double)k + 0.5) / levels * LM_SAMPLES)];
    for (int it = 0; it < LM_ITERS; it++) {
        double bnd[15];
        for (uint32_t k = 0; k + 1 < levels; k++) bnd[k] = (c[k] + c[k + 1]) / 2.0;
        size_t start = 0;
        for (uint32_t k = 0; k < levels; k++) {
            const size_t end = k + 1 < levels ? upper_bound(x, LM_SAMPLES, bnd[k]) : LM_SAMPLES;
            /* boundaries are built from sorted centroids, so regions are consecutive */
            if (end > start) c[k] = pairwise_sum(x + start, end - start) / (double)(end - start);
            if (end > start) start = end;
        }
    }
    free(x);
    qsort(c, levels, sizeof *c, cmp_double);
    return 0;
}

uint32_t cq_levels(uint32_t bits) {
    if (bits >= 2 && bits <= 4) return 1u << bits;
    return bits == CQ_TERNARY ? 3u : 0u;
}

int cq_codebooks_init(cq_codebooks *cb, uint32_t group) {
    *cb = (cq_codebooks){.group = group};
    const double root = sqrt((double)group);
    for (uint32_t b = 2; b <= 4; b++) {
        double c[16];
        const int st = cq_lloyd_max_gaussian(b, c);
        if (st) return st;
        for (uint32_t k = 0; k < (1u << b); k++) cb->levels[b][k] = (float)(c[k] / root);
    }
    cb->levels[CQ_TERNARY][0] = (float)(-TERNARY_LEVEL / root);
    cb->levels[CQ_TERNARY][1] = 0.0f;
    cb->levels[CQ_TERNARY][2] = (float)(TERNARY_LEVEL / root);
    return 0;
}
