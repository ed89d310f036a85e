/* The AVX-512F one-token CQ products (kernels/cpu/cq_decode_avx512.c) against the plain
 * reference: every bit width, every group size 16..256, odd row counts, padded last
 * groups, with a scratch (re-laid-out activations), a scratch too small and none; each
 * row computed alone must equal the same row in a longer call (rows are paired). The
 * tolerance is relative to the row's magnitude sum_k |w_k x_k|, as in test_simd.c. The
 * code arrays are allocated to their exact size, so ASan sees any read past the end
 * (the 1- and 3-bit decoders load 4 bytes where they need 2 or 3). Skipped where the CPU
 * (or the build) has no AVX-512F. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cq_test_matrix.h"
#include "harness.h"
#include "kernels/cpu/cq_decode_avx512.h"

static void check_shape(uint32_t rows, uint32_t cols, uint32_t group, uint32_t bits) {
    test_matrix tm;
    make_matrix(&tm, rows, cols, group, bits);
    const cq_matrix *w = &tm.w;
    float *xr = malloc((w->cols_pad + 1) * sizeof *xr);
    float *x = xr + 1; /* unaligned on purpose: the column-order path takes any alignment */
    for (uint32_t i = 0; i < w->cols_pad; i++) x[i] = i < cols ? rnd_float() : 0.0f;
    float *ref = malloc(rows * sizeof *ref), *got = malloc(rows * sizeof *got);
    float *part = malloc(rows * sizeof *part);
    cq_matmul(w, 0, rows, x, w->cols_pad, 1, ref, rows);

    cq_scratch sc;
    memset(&sc, 0, sizeof sc);
    sc.cap = cq_scratch_floats(w->cols_pad, 1);
    sc.buf = aligned_alloc(64, (sc.cap * sizeof(float) + 63) / 64 * 64);
    for (int pass = 0; pass < 3; pass++) { /* scratch, a scratch too small, none */
        cq_scratch small = sc;
        small.cap = w->cols_pad + 15;
        cq_scratch *use = pass == 0 ? &sc : pass == 1 ? &small : NULL;
        sc.valid = small.valid = 0;
        for (uint32_t r = 0; r < rows; r++) got[r] = NAN;
        CHECK(cq_decode_avx512(w, 0, rows, x, got, use) == 1);
        double worst = 0;
        for (uint32_t r = 0; r < rows; r++) {
            const double rel = fabs((double)got[r] - ref[r]) / (cq_magnitude(w, r, x) + 1e-30);
            if (!(rel <= worst)) worst = rel;
        }
        CHECK_MSG(worst <= CQ_TEST_TOL, "pass %d rows=%u cols=%u G=%u bits=%u: error %g", pass, rows,
                  cols, group, bits, worst);
        int alone_same = 1; /* a row alone equals the row paired with its neighbour */
        for (uint32_t r = 0; r < rows; r++) {
            float one = NAN;
            CHECK(cq_decode_avx512(w, r, 1, x, &one, use) == 1);
            alone_same &= one == got[r];
        }
        CHECK_MSG(alone_same, "pass %d bits=%u G=%u: a row alone differs from the full product",
                  pass, bits, group);
        if (rows > 2) { /* reuses the cached layout when there is one */
            const uint32_t row0 = 1 + rnd() % (rows - 2), nr = 1 + rnd() % (rows - row0);
            CHECK(cq_decode_avx512(w, row0, nr, x, part, use) == 1);
            int same = 1;
            for (uint32_t i = 0; i < nr; i++) same &= part[i] == got[row0 + i];
            CHECK_MSG(same, "pass %d bits=%u G=%u: rows [%u, %u) differ from the full product",
                      pass, bits, group, row0, row0 + nr);
        }
    }
    free(sc.buf);
    free(xr);
    free(ref);
    free(got);
    free(part);
    free_matrix(&tm);
}

static void test_every_shape(void) {
    if (!cq_decode_avx512_supported()) {
        harness_skip("no AVX-512F on this CPU or in this build");
        return;
    }
    const uint32_t bits[] = {1, 2, 3, 4, 5}; /* 1: Needle 3 binary, 5: ternary */
    const uint32_t groups[] = {16, 32, 64, 128, 256};
    for (size_t b = 0; b < 5; b++)
        for (size_t g = 0; g < 5; g++) {
            const uint32_t G = groups[g];
            const uint32_t cols[] = {2 * G, 3 * G - 5, G / 2 + 1, 4 * G};
            for (size_t c = 0; c < 4; c++) check_shape(1 + 2 * (rnd() % 12), cols[c], G, bits[b]);
        }
    /* the widest Needle 2 inputs and the largest group the format allows */
    check_shape(9, 2048, 128, 4);
    check_shape(7, 2048, 128, 2);
    check_shape(3, 8192, 4096, 4);
}

/* The scratch cache must follow the activations: a new vector at a new address, and the
 * owner's invalidation when the same buffer is rewritten. */
static void test_scratch_follows_activations(void) {
    if (!cq_decode_avx512_supported()) {
        harness_skip("no AVX-512F on this CPU or in this build");
        return;
    }
    const uint32_t widths[] = {2, 4};
    for (size_t b = 0; b < 2; b++) {
        test_matrix tm;
        make_matrix(&tm, 5, 256, 128, widths[b]);
        const cq_matrix *w = &tm.w;
        float *x1 = malloc(256 * sizeof *x1), *x2 = malloc(256 * sizeof *x2);
        for (int i = 0; i < 256; i++) x1[i] = rnd_float(), x2[i] = rnd_float();
        cq_scratch sc;
        memset(&sc, 0, sizeof sc);
        sc.cap = cq_scratch_floats(256, 1);
        sc.buf = aligned_alloc(64, (sc.cap * sizeof(float) + 63) / 64 * 64);
        float fresh[5], cached[5], ref[5];
        CHECK(cq_decode_avx512(w, 0, 5, x1, fresh, &sc) == 1);
        CHECK(cq_decode_avx512(w, 0, 5, x2, cached, &sc) == 1); /* other address */
        cq_matmul(w, 0, 5, x2, 256, 1, ref, 5);
        for (int r = 0; r < 5; r++) CHECK(fabsf(cached[r] - ref[r]) <= 1e-4f * (1 + fabsf(ref[r])));
        memcpy(x2, x1, 256 * sizeof *x1); /* same address, new values, owner invalidates */
        sc.valid = 0;
        CHECK(cq_decode_avx512(w, 0, 5, x2, cached, &sc) == 1);
        for (int r = 0; r < 5; r++) CHECK(cached[r] == fresh[r]);
        free(sc.buf);
        free(x1);
        free(x2);
        free_matrix(&tm);
    }
}

static void test_declines_small_groups(void) {
    if (!cq_decode_avx512_supported()) {
        harness_skip("no AVX-512F on this CPU or in this build");
        return;
    }
    test_matrix tm;
    make_matrix(&tm, 3, 24, 8, 4); /* groups of 8: not a multiple of 16 */
    float x[24] = {0}, y[3] = {7, 7, 7};
    CHECK(cq_decode_avx512(&tm.w, 0, 3, x, y, NULL) == 0);
    CHECK(y[0] == 7 && y[1] == 7 && y[2] == 7);
    free_matrix(&tm);
}

int main(void) {
    rnd_seed(0x2545F4914F6CDD1DULL);
    RUN(test_every_shape);
    RUN(test_scratch_follows_activations);
    RUN(test_declines_small_groups);
    return test_summary();
}
