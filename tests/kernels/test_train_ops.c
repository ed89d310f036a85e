/* The backward of every Needle 3 op of the training core against finite differences, in
 * double: src/train/grad3.c compiled here a second time with G3_REAL = double. The ops are
 * checked one by one where they stand alone (ZC/RMS norm, the Kronecker product, the
 * dense product) and all together through the loss of the tiny fixture models
 * (tests/fixtures/grad_v3), coordinate by coordinate in every parameter tensor (the
 * largest gradients and a spread of others), which reaches each op's backward: embedding
 * and tied / out_vocab logits, engram with its seed heads and taps, mHC lanes and the
 * Sinkhorn, the norms, q/k norms, RoPE, conv taps, local/global attention, qk != v heads,
 * the gates, the Monarch MLP with its permutations and cond. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define G3_REAL double
#define G3(name) g3d_##name
#include "train/grad3.c"

#include "grad3_fixture.h"
#include "needle.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1;
}

static int close_enough(double an, double fd) { return fabs(an - fd) <= 1e-6 * (fabs(an) + fabs(fd)) + 1e-9; }

static void test_zc_norm(void) {
    enum { N = 7 };
    double x[N], s[N], dy[N], y[N], dx[N] = {0}, ds[N] = {0};
    for (int i = 0; i < N; i++) x[i] = urand(), s[i] = urand(), dy[i] = urand();
    const double r = zc_fwd(x, s, N, y);
    zc_back(x, s, N, r, dy, dx, ds);
    for (int k = 0; k < 2 * N; k++) {
        double *p = k < N ? &x[k] : &s[k - N], keep = *p, lo = 0, hi = 0;
        const double h = 1e-6;
        *p = keep + h;
        zc_fwd(x, s, N, y);
        for (int i = 0; i < N; i++) hi += y[i] * dy[i];
        *p = keep - h;
        zc_fwd(x, s, N, y);
        for (int i = 0; i < N; i++) lo += y[i] * dy[i];
        *p = keep;
        const double fd = (hi - lo) / (2 * h), an = k < N ? dx[k] : ds[k - N];
        CHECK_MSG(close_enough(an, fd), "zc d/d%s[%d]: %.12g vs %.12g", k < N ? "x" : "s", k % N, an, fd);
    }
}

static void test_kron(void) {
    enum { A = 4, Bb = 8 };
    double z[A * Bb], a[A * A], b[Bb * Bb], dO[A * Bb], out[A * Bb], tmp[A * Bb];
    double dz[A * Bb] = {0}, da[A * A] = {0}, db[Bb * Bb] = {0};
    for (int i = 0; i < A * Bb; i++) z[i] = urand(), dO[i] = urand();
    for (int i = 0; i < A * A; i++) a[i] = urand();
    for (int i = 0; i < Bb * Bb; i++) b[i] = urand();
    kron_back(z, a, b, A, Bb, dO, tmp, dz, da, db);
    double *params[3] = {z, a, b}, *grads[3] = {dz, da, db};
    const int sizes[3] = {A * Bb, A * A, Bb * Bb};
    for (int p = 0; p < 3; p++)
        for (int k = 0; k < sizes[p]; k++) {
            double keep = params[p][k], hi = 0, lo = 0;
            const double h = 1e-6;
            params[p][k] = keep + h;
            kron_fwd(z, a, b, A, Bb, tmp, out);
            for (int i = 0; i < A * Bb; i++) hi += out[i] * dO[i];
            params[p][k] = keep - h;
            kron_fwd(z, a, b, A, Bb, tmp, out);
            for (int i = 0; i < A * Bb; i++) lo += out[i] * dO[i];
            params[p][k] = keep;
            const double fd = (hi - lo) / (2 * h);
            CHECK_MSG(close_enough(grads[p][k], fd), "kron param %d [%d]: %.12g vs %.12g", p, k, grads[p][k], fd);
        }
}

static void test_dense(void) {
    enum { T = 3, I = 5, O = 4 };
    double x[T * I], w[I * O], dy[T * O], y[T * O], dx[T * I] = {0}, dw[I * O] = {0};
    for (int i = 0; i < T * I; i++) x[i] = urand();
    for (int i = 0; i < I * O; i++) w[i] = urand();
    for (int i = 0; i < T * O; i++) dy[i] = urand();
    mm_back(NULL, x, w, dy, dx, dw, T, I, O);
    for (int k = 0; k < T * I + I * O; k++) {
        double *p = k < T * I ? &x[k] : &w[k - T * I], keep = *p, hi = 0, lo = 0;
        const double h = 1e-6;
        *p = keep + h;
        mm(NULL, x, w, y, T, I, O);
        for (int i = 0; i < T * O; i++) hi += y[i] * dy[i];
        *p = keep - h;
        mm(NULL, x, w, y, T, I, O);
        for (int i = 0; i < T * O; i++) lo += y[i] * dy[i];
        *p = keep;
        const double fd = (hi - lo) / (2 * h), an = k < T * I ? dx[k] : dw[k - T * I];
        CHECK_MSG(close_enough(an, fd), "dense [%d]: %.12g vs %.12g", k, an, fd);
    }
}

/* every tensor of the model: its 3 largest gradients and 3 others against central
 * differences of the whole loss */
static void check_model(const char *stem) {
    char path[512];
    g3d_model *m = NULL;
    snprintf(path, sizeof path, "grad_v3/%.100s", stem);
    CHECK_MSG(fx_model(path, &m) == 0, "%s: %s", stem, needle_last_error());
    fx_batch b;
    snprintf(path, sizeof path, "grad_v3/%.100s.batch.jsonl", stem);
    CHECK(fx_batch_load(fixture_path(path), &b) == 0);
    if (!m || !b.B) {
        g3d_model_free(m);
        return;
    }
    double loss = 0;
    CHECK(g3d_loss(m, b.ids, b.mask, b.B, b.T, 1, &loss) == 0);
    uint32_t checked = 0, tensors = 0;
    for (uint32_t ti = 0; ti < g3d_tensor_count(m); ti++) {
        g3d_tensor *t = g3d_tensor_at(m, ti);
        if (!t->numel) continue;
        tensors++;
        uint64_t pick[6];
        int np = 0;
        for (int k = 0; k < 3; k++) { /* the largest |g| not picked yet */
            uint64_t best = 0;
            double bv = -1;
            for (uint64_t i = 0; i < t->numel; i++) {
                int taken = 0;
                for (int q = 0; q < np; q++) taken |= pick[q] == i;
                if (!taken && fabs(t->g[i]) > bv) bv = fabs(t->g[i]), best = i;
            }
            pick[np++] = best;
        }
        for (int k = 0; k < 3; k++) pick[np++] = (uint64_t)((k + 0.5) / 3.0 * (double)t->numel) % t->numel;
        double an[6];
        for (int k = 0; k < np; k++) an[k] = t->g[pick[k]];
        for (int k = 0; k < np; k++) {
            double *p = &t->w[pick[k]], keep = *p, hi = 0, lo = 0;
            const double h = 1e-5 * fmax(1.0, fabs(keep));
            *p = keep + h;
            g3d_loss(m, b.ids, b.mask, b.B, b.T, 0, &hi);
            *p = keep - h;
            g3d_loss(m, b.ids, b.mask, b.B, b.T, 0, &lo);
            *p = keep;
            const double fd = (hi - lo) / (2 * h);
            CHECK_MSG(fabs(an[k] - fd) <= 2e-6 * (fabs(an[k]) + fabs(fd)) + 1e-8, "%s: d/d %s[%llu]: %.10g vs %.10g",
                      stem, t->name, (unsigned long long)pick[k], an[k], fd);
            checked++;
        }
    }
    printf("  %s: %u coordinates of %u tensors against finite differences\n", stem, checked, tensors);
    g3d_model_free(m);
    fx_batch_free(&b);
}

static void test_model_gradients(void) {
    check_model("g3a");
    check_model("g3b");
}

int main(void) {
    RUN(test_zc_norm);
    RUN(test_kron);
    RUN(test_dense);
    RUN(test_model_gradients);
    return test_summary();
}
