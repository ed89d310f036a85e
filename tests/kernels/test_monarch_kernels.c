/* The Needle 3 kernels (kernels/cpu/monarch.h) of every level this machine supports
 * against a double-precision reference written here, and every SIMD level against the
 * plain one.
 *
 * Shapes: combine() over widths 1..67 (under, at and past each vector block: 8, 32, 64
 * columns on AVX2; 4, 16, 32 on NEON), 1..40 rows, coefficient strides 1 and > 1 (the
 * Kronecker product's column of a); the Monarch MLP's shapes (32 x 32 blocks, the rank-8
 * condition over 768 rows, 8 rows of 1024); mul_add() over 1..70 values. Tolerance: each
 * output is a sum of n products of values in [-1, 1]; float summation in any fixed order
 * is within n * 2^-24 of the exact sum of magnitudes, so the limit is
 * 4 * n * 2^-24 * sum |c x| + 1e-30 per output, for a level against the reference and a
 * SIMD level against the plain one alike. The plain level must equal the original loops
 * (a separate multiply and add in index order) bit for bit.
 *
 * combine_rows() (several output rows, strided coefficients) must equal that level's
 * combine() row by row bit for bit, over every column count 1..140 (past each 16-column
 * vector and 64-column block of AVX-512), row counts 1..19 (past its blocks of 8, 6 and 4
 * and their remainders), both coefficient layouts of a Kronecker factor; and AVX-512 must
 * equal AVX2 bit for bit (the same FMA chain per output). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/cpu/monarch.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static float rnd_float(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((int)((rng_state >> 16) % 20001) - 10000) / 10000.0f;
}

static const monarch_kernels *levels[4];
static int n_levels;

static void find_levels(void) {
    const char *names[] = {"scalar", "avx2", "avx512", "neon"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const monarch_kernels *k = monarch_kernels_named(names[i]);
        if (k) levels[n_levels++] = k;
        printf("  level %s: %s\n", names[i], k ? "tested" : "not supported here");
    }
    CHECK(monarch_kernels_named("scalar") == &monarch_kernels_scalar);
    CHECK(monarch_kernels_named("sse9") == NULL && monarch_kernels_named(NULL) == NULL);
}

static float *randoms(size_t n) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = rnd_float();
    return x;
}

/* One combine() shape on every level; out has a guard value past its end. */
static void check_combine(uint32_t n, uint32_t w, size_t c_ld) {
    float *c = randoms((size_t)n * c_ld), *x = randoms((size_t)n * w);
    float *plain = NULL;
    for (int L = 0; L < n_levels; L++) {
        float *out = malloc(((size_t)w + 1) * sizeof *out);
        for (uint32_t l = 0; l <= w; l++) out[l] = 777.0f;
        levels[L]->combine(out, c, c_ld, x, n, w);
        double worst = 0, worst_plain = 0;
        int plain_bits = 1;
        for (uint32_t l = 0; l < w; l++) {
            double exact = 0, mag = 0;
            float loop = 0.0f; /* the original loop's arithmetic */
            for (uint32_t r = 0; r < n; r++) {
                const double p = (double)c[r * c_ld] * x[(size_t)r * w + l];
                exact += p;
                mag += fabs(p);
                const float prod = c[r * c_ld] * x[(size_t)r * w + l];
                loop = loop + prod;
            }
            const double lim = 4.0 * n * ldexp(mag, -24) + 1e-30;
            worst = fmax(worst, fabs(out[l] - exact) / lim);
            if (plain) worst_plain = fmax(worst_plain, fabs(out[l] - plain[l]) / lim);
            if (L == 0 && out[l] != loop) plain_bits = 0;
        }
        CHECK_MSG(worst <= 1.0, "%s combine n %u w %u ld %zu: error %.3g of the limit",
                  levels[L]->name, n, w, c_ld, worst);
        CHECK_MSG(worst_plain <= 1.0, "%s combine n %u w %u: vs plain %.3g of the limit",
                  levels[L]->name, n, w, worst_plain);
        CHECK_MSG(out[w] == 777.0f, "%s combine n %u w %u wrote past out", levels[L]->name, n, w);
        if (L == 0) CHECK_MSG(plain_bits, "plain combine n %u w %u is not the original loop", n, w);
        if (!plain) plain = out;
        else free(out);
    }
    free(plain);
    free(c);
    free(x);
}

static void test_combine_shapes(void) {
    for (uint32_t w = 1; w <= 67; w++)
        for (uint32_t n = 1; n <= 40; n += 13) check_combine(n, w, w % 3 ? 1 : 5);
    check_combine(32, 32, 1);   /* z_i B: a Monarch block row */
    check_combine(32, 32, 32);  /* column k of a over tmp's rows */
    check_combine(768, 8, 1);   /* h cond_v */
    check_combine(8, 1024, 1);  /* softmax cond_u */
    check_combine(24, 136, 24); /* wide rows past two 64-column blocks */
}

static void test_mul_add(void) {
    for (uint32_t n = 1; n <= 70; n++) {
        float *a = randoms(n), *b = randoms(n), *init = randoms(n);
        float *plain = NULL;
        for (int L = 0; L < n_levels; L++) {
            float *out = malloc(((size_t)n + 1) * sizeof *out);
            memcpy(out, init, n * sizeof *out);
            out[n] = 777.0f;
            levels[L]->mul_add(out, a, b, n);
            for (uint32_t i = 0; i < n; i++) {
                const double exact = (double)init[i] + (double)a[i] * b[i];
                const double lim =
                    2.0 * ldexp(fabs(init[i]) + fabs((double)a[i] * b[i]), -24) + 1e-30;
                CHECK_MSG(fabs(out[i] - exact) <= lim, "%s mul_add n %u at %u", levels[L]->name,
                          n, i);
                if (L == 0) {
                    const float prod = a[i] * b[i];
                    CHECK_MSG(out[i] == init[i] + prod, "plain mul_add is not the original loop");
                }
                if (plain)
                    CHECK_MSG(fabs(out[i] - plain[i]) <= 2 * lim, "%s mul_add vs plain",
                              levels[L]->name);
            }
            CHECK(out[n] == 777.0f);
            if (!plain) plain = out;
            else free(out);
        }
        free(plain);
        free(a);
        free(b);
        free(init);
    }
}

/* combine_rows of every level against its own combine, row by row, and AVX-512 against
 * AVX2; the output has guard values between and after the rows. */
static void check_combine_rows(uint32_t n, uint32_t w, uint32_t m, size_t c_row, size_t c_ld) {
    const size_t out_ld = (size_t)w + 3, c_len = (size_t)(m - 1) * c_row + (size_t)(n - 1) * c_ld + 1;
    float *c = randoms(c_len), *x = randoms((size_t)n * w);
    float *row = malloc(((size_t)w + 1) * sizeof *row), *avx2 = NULL;
    for (int L = 0; L < n_levels; L++) {
        float *out = malloc((out_ld * m + 1) * sizeof *out);
        for (size_t k = 0; k <= out_ld * m; k++) out[k] = 777.0f;
        levels[L]->combine_rows(out, out_ld, c, c_row, c_ld, x, n, w, m);
        int same = 1, guards = out[out_ld * m] == 777.0f, same_avx2 = 1;
        for (uint32_t i = 0; i < m; i++) {
            levels[L]->combine(row, c + (size_t)i * c_row, c_ld, x, n, w);
            if (memcmp(row, out + (size_t)i * out_ld, w * sizeof *row)) same = 0;
            for (size_t k = w; k < out_ld; k++)
                if (out[(size_t)i * out_ld + k] != 777.0f) guards = 0;
        }
        if (avx2 && !strcmp(levels[L]->name, "avx512"))
            same_avx2 = !memcmp(avx2, out, out_ld * m * sizeof *out);
        CHECK_MSG(same, "%s combine_rows n %u w %u m %u ld %zu/%zu differs from its combine",
                  levels[L]->name, n, w, m, c_row, c_ld);
        CHECK_MSG(guards, "%s combine_rows n %u w %u m %u wrote outside its rows",
                  levels[L]->name, n, w, m);
        CHECK_MSG(same_avx2, "avx512 combine_rows n %u w %u m %u is not AVX2's bits", n, w, m);
        if (!strcmp(levels[L]->name, "avx2")) avx2 = out;
        else free(out);
    }
    free(avx2);
    free(row);
    free(c);
    free(x);
}

static void test_combine_rows_shapes(void) {
    for (uint32_t w = 1; w <= 140; w += (w < 70 ? 1 : 7))
        for (uint32_t m = 1; m <= 19; m += (w % 5 ? 5 : 1)) check_combine_rows(7, w, m, 7, 1);
    for (uint32_t m = 1; m <= 19; m++) {
        check_combine_rows(32, 32, m, 32, 1); /* z b: rows of z against b */
        check_combine_rows(32, 32, m, 1, 32); /* a^T tmp: columns of a against tmp */
        check_combine_rows(768, 8, m, 768, 1); /* a tile's h cond_v */
    }
    check_combine_rows(8, 1024, 1, 8, 1); /* softmax cond_u */
    check_combine_rows(1, 1, 1, 1, 1);
}

int main(void) {
    find_levels();
    RUN(test_combine_shapes);
    RUN(test_combine_rows_shapes);
    RUN(test_mul_add);
    return test_summary();
}
