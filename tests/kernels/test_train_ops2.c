/* The backward of every Needle 2 op of the training core against finite differences, in
 * double: src/train/grad2.c compiled here a second time with G2_REAL = double. The ops are
 * checked one by one where they stand alone (ZC/RMS norm, the dense product, the Walsh
 * product of the Hadamard MLP) and all together through the loss of the tiny fixture
 * models (tests/fixtures/grad_v2), coordinate by coordinate in every parameter tensor (the
 * largest gradients and a spread of others), which reaches each op's backward: embedding
 * and tied logits, engram with its taps, mHC lanes and the Sinkhorn, the norms, q/k norms,
 * RoPE, causal GQA attention, the gates, the Hadamard MLP with its padding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define G2_REAL double
#define G2(name) g2d_##name
#include "train/grad2.c"

#include "grad2_fixture.h"
#include "needle.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1;
}

static int close_enough(double an, double fd) { return fabs(an - fd) <= 1e-6 * (fabs(an) + fabs(fd)) + 1e-9; }

/* The ZC norm and its backward (train/dense_ref.h) are shared with the Needle 3 core and
 * checked by finite differences in test_train_ops.c. */

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

/* The Hadamard MLP's Walsh matrix (d_model 40 -> N 64): symmetric and orthogonal to the
 * float32 rounding of its scale (the block's backward multiplies by H for H^T), and the
 * backward of z @ H (mm_back with no weight gradient) against finite differences. */
static void test_walsh(void) {
    export_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 8, c.d_model = 40, c.attn_dim = 32, c.num_heads = 4, c.num_kv_heads = 2, c.num_layers = 1;
    c.rope_theta = 10000, c.engram_orders[0] = 2, c.num_orders = 1, c.engram_heads = 1, c.engram_slots = 5;
    c.mhc_lanes = 2;
    g2d_model *m = NULL;
    CHECK_MSG(g2d_model_from_checkpoint(&c, NULL, &m) == 0, "%s", needle_last_error());
    if (!m) return;
    CHECK_EQ_INT(m->N, 64);
    const uint32_t N = m->N;
    double worst = 0;
    for (uint32_t i = 0; i < N; i++)
        for (uint32_t j = 0; j < N; j++) {
            CHECK(m->walsh[(size_t)i * N + j] == m->walsh[(size_t)j * N + i]);
            double s = 0;
            for (uint32_t k = 0; k < N; k++) s += m->walsh[(size_t)i * N + k] * m->walsh[(size_t)k * N + j];
            worst = fmax(worst, fabs(s - (i == j)));
        }
    CHECK_MSG(worst < 1e-6, "H @ H - I: %.3g", worst);
    enum { T = 2 };
    double z[T * 64], dy[T * 64], y[T * 64], dz[T * 64] = {0};
    for (int i = 0; i < T * 64; i++) z[i] = urand(), dy[i] = urand();
    mm_back(NULL, NULL, m->walsh, dy, dz, NULL, T, N, N);
    for (int k = 0; k < T * 64; k += 7) {
        const double keep = z[k], h = 1e-6;
        double hi = 0, lo = 0;
        z[k] = keep + h;
        mm(NULL, z, m->walsh, y, T, N, N);
        for (int i = 0; i < T * 64; i++) hi += y[i] * dy[i];
        z[k] = keep - h;
        mm(NULL, z, m->walsh, y, T, N, N);
        for (int i = 0; i < T * 64; i++) lo += y[i] * dy[i];
        z[k] = keep;
        CHECK_MSG(close_enough(dz[k], (hi - lo) / (2 * h)), "walsh [%d]", k);
    }
    g2d_model_free(m);
}

/* every tensor of the model: its 3 largest gradients and 3 others against central
 * differences of the whole loss */
static void check_model(const char *stem) {
    char path[512];
    g2d_model *m = NULL;
    snprintf(path, sizeof path, "grad_v2/%.100s", stem);
    CHECK_MSG(fx_model(path, &m) == 0, "%s: %s", stem, needle_last_error());
    fx_batch b;
    snprintf(path, sizeof path, "grad_v2/%.100s.batch.jsonl", stem);
    CHECK(fx_batch_load(fixture_path(path), &b) == 0);
    if (!m || !b.B) {
        g2d_model_free(m);
        return;
    }
    double loss = 0;
    CHECK(g2d_loss(m, b.ids, b.mask, b.B, b.T, 1, &loss) == 0);
    uint32_t checked = 0, tensors = 0;
    for (uint32_t ti = 0; ti < g2d_tensor_count(m); ti++) {
        g2d_tensor *t = g2d_tensor_at(m, ti);
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
            g2d_loss(m, b.ids, b.mask, b.B, b.T, 0, &hi);
            *p = keep - h;
            g2d_loss(m, b.ids, b.mask, b.B, b.T, 0, &lo);
            *p = keep;
            const double fd = (hi - lo) / (2 * h);
            CHECK_MSG(fabs(an[k] - fd) <= 2e-6 * (fabs(an[k]) + fabs(fd)) + 1e-8, "%s: d/d %s[%llu]: %.10g vs %.10g",
                      stem, t->name, (unsigned long long)pick[k], an[k], fd);
            checked++;
        }
    }
    printf("  %s: %u coordinates of %u tensors against finite differences\n", stem, checked, tensors);
    g2d_model_free(m);
    fx_batch_free(&b);
}

static void test_model_gradients(void) {
    check_model("g2a");
    check_model("g2b");
}

int main(void) {
    RUN(test_dense);
    RUN(test_walsh);
    RUN(test_model_gradients);
    return test_summary();
}
