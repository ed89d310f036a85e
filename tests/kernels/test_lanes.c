/* The in-house exp/log of the Sinkhorn (kernels/nmath.h) against double-precision libm, and
 * the vector Sinkhorn (kernels/cpu/lane_math.h) and the AVX2/AVX-512 lane write
 * (kernels/cpu/lane_wide.h) against the scalar code, bit for bit. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "harness.h"
#include "kernels/cpu/lane_math.h"
#include "kernels/cpu/lane_wide.h"
#include "kernels/nmath.h"

static uint32_t rng_state = 0x12345678u;

static uint32_t rng_next(void) { /* xorshift32: fixed, reproducible inputs */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* |got - want| in units of the float spacing at want (want a normal float's value) */
static double ulp_error(float got, double want) {
    int e;
    frexp(want, &e);
    return fabs((double)got - want) / ldexp(1.0, e - 24);
}

static void test_exp_within_1_5_ulp(void) {
    double worst = 0.0;
    float worst_x = 0.0f;
    /* every 4099th float of [NM_EXP_LO, NM_EXP_HI], both signs (a sweep of every 13th,
     * too slow for the suite, which also runs under qemu: 1.005 ulp) */
    for (uint32_t u = 0; u < 0x7f800000u; u += 4099) {
        for (int sign = 0; sign < 2; sign++) {
            const float x = bits_to_float(u | (sign ? 0x80000000u : 0u));
            if (x < NM_EXP_LO || x > NM_EXP_HI) continue;
            const double err = ulp_error(nm_exp_poly(x), exp((double)x));
            if (err > worst) worst = err, worst_x = x;
        }
    }
    CHECK_MSG(worst <= 1.5, "exp: %.3f ulp at %a", worst, (double)worst_x);
    CHECK(nm_exp_poly(0.0f) == 1.0f);
    CHECK(nm_exp_poly(-0.0f) == 1.0f);
    /* below the normal range it gives 0 (libm would give subnormals), above it saturates */
    CHECK(nm_exp_poly(-88.0f) == 0.0f && nm_exp_poly(-INFINITY) == 0.0f);
    CHECK(nm_exp_poly(100.0f) == nm_exp_poly(NM_EXP_HI) && isfinite(nm_exp_poly(INFINITY)));
}

static void test_log_within_1_ulp(void) {
    double worst = 0.0;
    float worst_x = 0.0f;
    /* every 2053rd positive normal float (every 13th: 0.82 ulp) */
    for (uint32_t u = 0x00800000u; u < 0x7f800000u; u += 2053) {
        const float x = bits_to_float(u);
        const double want = log((double)x);
        if (want == 0.0) continue;
        const double err = ulp_error(nm_log_poly(x), want);
        if (err > worst) worst = err, worst_x = x;
    }
    CHECK_MSG(worst <= 1.0, "log: %.3f ulp at %a", worst, (double)worst_x);
    CHECK(nm_log_poly(1.0f) == 0.0f);
    /* the Sinkhorn's sums lie in [1, n_lanes]: every 16th float of [1, 4] */
    worst = 0.0;
    for (uint32_t u = float_to_bits(1.0f); u <= float_to_bits(4.0f); u += 16) {
        const float x = bits_to_float(u);
        const double want = log((double)x);
        if (want == 0.0) continue;
        const double err = ulp_error(nm_log_poly(x), want);
        if (err > worst) worst = err, worst_x = x;
    }
    CHECK_MSG(worst <= 1.0, "log on [1, 4]: %.3f ulp at %a", worst, (double)worst_x);
}

#ifdef LANE_MATH_SIMD
/* any 32-bit pattern: NaN, infinities, subnormals and negatives give the same bits too */
static void test_vector_exp_log_bit_identical(void) {
    uint32_t mismatches = 0, first_bad = 0;
    for (uint32_t k = 0; k < (1u << 16); k++) {
        float in[4], ve[4], vl[4];
        for (int j = 0; j < 4; j++) {
            uint32_t u = rng_next();
            /* half of them in the range that matters: |x| < 128 */
            if (j & 1) u = (u & 0x80ffffffu) | ((0x3c000000u + (u & 0x03800000u)) & 0x7f800000u);
            in[j] = bits_to_float(u);
        }
        LV_STORE(ve, lv_exp(LV_LOAD(in)));
        LV_STORE(vl, lv_log(LV_LOAD(in)));
        for (int j = 0; j < 4; j++) {
            const int bad = float_to_bits(ve[j]) != float_to_bits(nm_exp_poly(in[j])) ||
                            float_to_bits(vl[j]) != float_to_bits(nm_log_poly(in[j]));
            if (bad && !mismatches++) first_bad = float_to_bits(in[j]);
        }
    }
    CHECK_MSG(mismatches == 0, "%u vector exp/log results differ from scalar, first at 0x%08x",
              mismatches, first_bad);
}
#endif

/* the log-space Sinkhorn in double with libm: the exact answer to compare against */
static void sinkhorn_double(const float *P0, uint32_t n, double *P) {
    for (uint32_t k = 0; k < n * n; k++) P[k] = P0[k];
    for (int it = 0; it < NM_SINKHORN_ROUNDS; it++) {
        for (int pass = 0; pass < 2; pass++)
            for (uint32_t a = 0; a < n; a++) {
                /* pass 0: row a, pass 1: column a */
                const uint32_t stride = pass ? n : 1, base = pass ? a : a * n;
                double m = P[base], sum = 0.0;
                for (uint32_t b = 1; b < n; b++) m = fmax(m, P[base + b * stride]);
                for (uint32_t b = 0; b < n; b++) sum += exp(P[base + b * stride] - m);
                for (uint32_t b = 0; b < n; b++) P[base + b * stride] -= m + log(sum);
            }
    }
    for (uint32_t k = 0; k < n * n; k++) P[k] = exp(P[k]);
}

static void test_sinkhorn_against_double(void) {
    double worst = 0.0;
    for (uint32_t trial = 0; trial < 600; trial++) {
        const uint32_t n = 1 + trial % 6;
        float P[36], P0[36];
        double want[36];
        /* logits up to |12|: the lane mix's a_res * mix + b_res, with room */
        const float span = trial % 3 == 0 ? 24.0f : 6.0f;
        for (uint32_t k = 0; k < n * n; k++)
            P0[k] = P[k] = span * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
        nm_sinkhorn(P, n);
        sinkhorn_double(P0, n, want);
        for (uint32_t k = 0; k < n * n; k++) {
            const double err = fabs((double)P[k] - want[k]);
            if (err > worst) worst = err;
        }
    }
    /* entries lie in [0, 1]; libm's expf/logf in float land within the same bound */
    CHECK_MSG(worst < 2e-6, "Sinkhorn vs double: max |diff| %g", worst);
}

static void test_vector_sinkhorn_bit_identical(void) {
#ifdef LANE_MATH_SIMD
    uint32_t mismatches = 0;
    for (uint32_t trial = 0; trial < 2000; trial++) {
        float a[16], b[16];
        const float span = trial % 4 == 0 ? 40.0f : 8.0f;
        for (int k = 0; k < 16; k++)
            a[k] = b[k] = span * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
        if (trial == 1) /* equal entries, a whole row of them: ties in the max */
            for (int k = 0; k < 16; k++) a[k] = b[k] = k < 4 ? 0.5f : 0.25f * (float)(k % 3);
        nm_sinkhorn(a, 4);
        lane_sinkhorn(b, 4);
        if (memcmp(a, b, sizeof a)) mismatches++;
    }
    CHECK_MSG(mismatches == 0, "%u of 2000 vector Sinkhorns differ from the scalar one",
              mismatches);
    /* several tokens' matrices at once, interleaved: each as alone */
    for (uint32_t count = 1; count <= LANE_SINKHORN_BATCH; count++) {
        float many[16 * LANE_SINKHORN_BATCH], one[16 * LANE_SINKHORN_BATCH];
        for (uint32_t k = 0; k < 16 * count; k++)
            many[k] = one[k] = 10.0f * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
        lane_sinkhorn4_batch(many, count);
        for (uint32_t j = 0; j < count; j++) nm_sinkhorn(one + 16 * j, 4);
        CHECK_MSG(memcmp(many, one, 16 * count * sizeof *many) == 0, "batch of %u", count);
    }
    /* other lane counts go to the scalar code */
    float c[9], d[9];
    for (int k = 0; k < 9; k++) c[k] = d[k] = 0.3f * (float)k - 1.0f;
    nm_sinkhorn(c, 3);
    lane_sinkhorn(d, 3);
    CHECK(memcmp(c, d, sizeof c) == 0);
#else
    harness_skip("no vector Sinkhorn on this target");
#endif
}

/* The wide kernels of every level this CPU has: a batch of Sinkhorns of any count (up to
 * the level's batch) each as nm_sinkhorn alone, over spans that reach the exp clamps; the
 * lane rewrite as the portable loop writes it (hpost * y, then + P[r][c] * old lane c in
 * order), on widths with and without a tail. */
static void test_wide_lane_write_bit_identical(void) {
    const char *levels[] = {"avx2", "avx512"};
    int tested = 0;
    for (size_t lv = 0; lv < sizeof levels / sizeof *levels; lv++) {
        const lane_wide_kernels *w = lane_wide_kernels_named(levels[lv]);
        if (!w) continue;
        tested++;
        CHECK(w->sinkhorn_batch >= 1 && w->sinkhorn_batch <= LANE_WIDE_MAX_BATCH);
        const float spans[] = {10.0f, 60.0f, 400.0f};
        for (uint32_t count = 1; count <= w->sinkhorn_batch; count++) {
            for (size_t sp = 0; sp < sizeof spans / sizeof *spans; sp++) {
                float many[16 * LANE_WIDE_MAX_BATCH], one[16 * LANE_WIDE_MAX_BATCH];
                for (uint32_t k = 0; k < 16 * count; k++)
                    many[k] = one[k] =
                        spans[sp] * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
                w->sinkhorn4(many, count);
                for (uint32_t j = 0; j < count; j++) nm_sinkhorn(one + 16 * j, 4);
                CHECK_MSG(memcmp(many, one, 16 * count * sizeof *many) == 0,
                          "%s: batch of %u, span %g", w->name, count, (double)spans[sp]);
            }
        }
        const uint32_t widths[] = {1, 5, 16, 37, 512};
        for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
            const uint32_t d = widths[wi];
            float X[4 * 512], want[4 * 512], y[512], P[16], hpost[4];
            for (uint32_t k = 0; k < 4 * d; k++)
                X[k] = 4.0f * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
            for (uint32_t k = 0; k < d; k++)
                y[k] = 2.0f * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
            for (int k = 0; k < 16; k++) P[k] = (float)(rng_next() >> 8) / 16777216.0f;
            for (int r = 0; r < 4; r++) hpost[r] = 2.0f * (float)(rng_next() >> 8) / 16777216.0f;
            for (int r = 0; r < 4; r++)
                for (uint32_t k = 0; k < d; k++) {
                    float acc = hpost[r] * y[k];
                    for (int c = 0; c < 4; c++) acc += P[4 * r + c] * X[(size_t)c * d + k];
                    want[(size_t)r * d + k] = acc;
                }
            w->rewrite4(X, y, P, hpost, d);
            CHECK_MSG(memcmp(X, want, 4 * d * sizeof *X) == 0, "%s: rewrite of width %u",
                      w->name, d);
        }
    }
    if (!tested) harness_skip("no AVX2 or AVX-512 lane kernels on this build or CPU");
}

/* The lane read's weighted sum (from 0, lanes in order), the lane norm of several rows at
 * once (nm_rms_unit of each), on widths with and without a tail, row counts 1..batch, and
 * the Hadamard gate as lane_hada_gate. */
static void test_wide_lane_read_norm_gate_bit_identical(void) {
    const char *levels[] = {"avx2", "avx512"};
    int tested = 0;
    for (size_t lv = 0; lv < sizeof levels / sizeof *levels; lv++) {
        const lane_wide_kernels *w = lane_wide_kernels_named(levels[lv]);
        if (!w) continue;
        tested++;
        const uint32_t widths[] = {1, 7, 8, 21, 512};
        for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
            const uint32_t d = widths[wi];
            float X[4 * 512], u[512], bx[512], want[512], wts[4];
            for (uint32_t k = 0; k < 4 * d; k++)
                X[k] = 4.0f * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
            for (int r = 0; r < 4; r++) wts[r] = (float)(rng_next() >> 8) / 16777216.0f;
            for (uint32_t k = 0; k < d; k++) {
                float acc = 0.0f;
                for (int r = 0; r < 4; r++) acc += wts[r] * X[(size_t)r * d + k];
                want[k] = acc;
            }
            w->read4(X, wts, d, u, bx);
            CHECK_MSG(memcmp(u, want, d * sizeof *u) == 0 && memcmp(bx, want, d * sizeof *bx) == 0,
                      "%s: read of width %u", w->name, d);
        }
        const uint32_t lengths[] = {3, 8, 203, 2048};
        static float rows[LANE_NORM_BATCH * 2056], got[LANE_NORM_BATCH * 2056], one[2056];
        for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
            const uint32_t n = lengths[li];
            const size_t ld_x = n + 3, ld_out = n + 5; /* strides other than n */
            for (uint32_t count = 1; count <= LANE_NORM_BATCH; count++) {
                for (size_t k = 0; k < count * ld_x; k++)
                    rows[k] = 6.0f * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
                w->rms_unit_rows(rows, ld_x, n, count, got, ld_out);
                uint32_t bad = 0;
                for (uint32_t t = 0; t < count; t++) {
                    nm_rms_unit(rows + t * ld_x, n, one);
                    if (memcmp(one, got + t * ld_out, n * sizeof *one)) bad++;
                }
                CHECK_MSG(bad == 0, "%s: norm of %u rows of %u: %u differ", w->name, count, n,
                          bad);
            }
        }
        /* the gate, |v| up to 200: past both exp clamps */
        const uint32_t gate_lengths[] = {1, 13, 64, 1024};
        for (size_t gi = 0; gi < sizeof gate_lengths / sizeof *gate_lengths; gi++) {
            const uint32_t n = gate_lengths[gi];
            static float z[1024], zw[1024], d2[1024];
            for (uint32_t k = 0; k < n; k++) {
                z[k] = zw[k] = 400.0f * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
                d2[k] = 2.0f * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
            }
            lane_hada_gate(z, d2, 0.03125f, n);
            w->hada_gate(zw, d2, 0.03125f, n);
            CHECK_MSG(memcmp(z, zw, n * sizeof *z) == 0, "%s: gate of %u", w->name, n);
        }
    }
    if (!tested) harness_skip("no AVX2 or AVX-512 lane kernels on this build or CPU");
}

/* the Hadamard MLP's gate: every element as the scalar formula gives it (odd lengths: the
 * vector part then a tail), and within a few ulp of v * sigmoid(v) in double */
static void test_hada_gate(void) {
    float z[203], d2[203], got[203];
    double worst = 0.0;
    uint32_t mismatches = 0;
    for (uint32_t n = 1; n <= 203; n += 101 - (n % 4)) {
        for (uint32_t i = 0; i < n; i++) {
            z[i] = got[i] = 60.0f * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
            d2[i] = 2.0f * ((float)(rng_next() >> 8) / 16777216.0f);
        }
        const float scale = 0.125f;
        lane_hada_gate(got, d2, scale, n);
        for (uint32_t i = 0; i < n; i++) {
            const float v = d2[i] * (z[i] * scale);
            const float want = v * (1.0f / (1.0f + nm_exp_poly(-v)));
            if (float_to_bits(got[i]) != float_to_bits(want)) mismatches++;
            const double exact = (double)v / (1.0 + exp(-(double)v));
            const double err = fabs((double)got[i] - exact) / fmax(fabs(exact), 1e-30);
            if (err > worst) worst = err;
        }
    }
    CHECK_MSG(mismatches == 0, "%u gate values differ from the scalar formula", mismatches);
    CHECK_MSG(worst < 4.0 * 0x1p-24, "gate: relative error %g", worst);
}

/* the norms' sum of squares: element i into partial sum i % 8, the sums added pairwise;
 * the GCC vector form must give exactly that */
static void test_mean_square_order(void) {
    float x[203];
    for (uint32_t i = 0; i < 203; i++)
        x[i] = 8.0f * ((float)(rng_next() >> 8) / 16777216.0f - 0.5f);
    const uint32_t lengths[] = {1, 7, 8, 9, 64, 203};
    for (size_t t = 0; t < sizeof lengths / sizeof *lengths; t++) {
        const uint32_t n = lengths[t];
        float acc[8] = {0};
        double exact = 0.0;
        for (uint32_t i = 0; i < n; i++) {
            const float sq = x[i] * x[i];
            acc[i % 8] += sq;
            exact += (double)x[i] * x[i];
        }
        const float want = (((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                            ((acc[4] + acc[5]) + (acc[6] + acc[7]))) / (float)n;
        const float got = nm_mean_square(x, n);
        CHECK_MSG(float_to_bits(got) == float_to_bits(want), "n %u: %a, want %a", n,
                  (double)got, (double)want);
        CHECK(fabs((double)got - exact / n) < 1e-5 * (exact / n));
    }
}

int main(void) {
    RUN(test_exp_within_1_5_ulp);
    RUN(test_log_within_1_ulp);
#ifdef LANE_MATH_SIMD
    RUN(test_vector_exp_log_bit_identical);
#endif
    RUN(test_sinkhorn_against_double);
    RUN(test_vector_sinkhorn_bit_identical);
    RUN(test_wide_lane_write_bit_identical);
    RUN(test_wide_lane_read_norm_gate_bit_identical);
    RUN(test_hada_gate);
    RUN(test_mean_square_order);
    return test_summary();
}
