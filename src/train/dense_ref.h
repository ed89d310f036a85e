/* What the Needle 2 and Needle 3 training cores (grad2.c, grad3.c) share, over the
 * including file's `real` (float in the library, double in the finite-difference tests
 * that include a core) and EPS: the A8 fake quantization, the portable dense products with
 * their work sharing, and the ZC norm with its backward. Static functions, included once by
 * each core; not a general header. */
#ifndef NEEDLE_TRAIN_DENSE_REF_H
#define NEEDLE_TRAIN_DENSE_REF_H

#include <math.h>
#include <stdint.h>

/* the float library (the core defines TRAIN_REAL_FLOAT) uses the inference forward's
 * baseline vectors (SSE2, NEON) where they give the scalar loops' bits */
#ifdef TRAIN_REAL_FLOAT
#include "kernels/cpu/lane_math.h"
#endif

/* exp and log where a step makes millions of them (softmax of attention and of the
 * Sinkhorn, the cross-entropy over the vocabulary): in the float core nmath.h's polynomials,
 * inlined where libm's are calls, and the ones the inference forward's Sinkhorn uses
 * (nm_sinkhorn); libm's in the double builds of the finite-difference tests. Arguments are
 * max-subtracted (<= 0) or log-probabilities, sums >= 1, as the polynomials need. */
#define rexp(x) _Generic((real)0, float: nm_exp_poly, default: exp)(x)
#define rlog(x) _Generic((real)0, float: nm_log_poly, default: log)(x)

/* quantize.fake_quant(x, n, 8) in place: symmetric int8 of the n values by their absmax
 * (round half to even, as jnp.round); the backward is the identity (straight-through) */
static void fq8(real *x, uint32_t n) {
    real mx = 0;
    for (uint32_t i = 0; i < n; i++) mx = fabs(x[i]) > mx ? fabs(x[i]) : mx;
    const real sc = mx > 0 ? mx / (real)127 : (real)1;
    for (uint32_t i = 0; i < n; i++) {
        real q = nearbyint(x[i] / sc);
        q = q < -128 ? -128 : q > 127 ? 127 : q;
        x[i] = q * sc;
    }
}

/* The positions row `mk` needs: through its last loss target (mk[t] != 0), at least 2. The
 * rows of a batch are padded to one length (finetune pads every row to the data's longest),
 * and what follows the last target can change nothing: the network is causal (attention, conv
 * taps and engram n-grams look back only) and those positions carry no loss, so their
 * gradients are exact zeros. Running each row at this length gives the same loss and
 * gradients with none of the padding's work. */
static uint32_t row_length(const float *mk, uint32_t T) {
    uint32_t len = T;
    while (len > 2 && mk[len - 1] == 0) len--;
    return len;
}

/* sum of a[c] b[c] in eight partial sums (c mod 8) combined pairwise: eight independent
 * chains the compiler vectorizes, where a plain loop is one chain of n dependent adds (the
 * mHC lanes' backward makes 20 such sums of d per token and layer). A fixed order, so the
 * same bits at every thread count and SIMD level. */
static real dot8(const real *a, const real *b, uint32_t n) {
    real s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t c = 0;
#if defined(TRAIN_REAL_FLOAT) && defined(LANE_MATH_SIMD)
    lv4 lo = LV_SET(0), hi = LV_SET(0); /* s[0..3], s[4..7] */
    for (; c + 8 <= n; c += 8) {
        lo = LV_ADD(lo, LV_MUL(LV_LOAD(a + c), LV_LOAD(b + c)));
        hi = LV_ADD(hi, LV_MUL(LV_LOAD(a + c + 4), LV_LOAD(b + c + 4)));
    }
    LV_STORE(s, lo);
    LV_STORE(s + 4, hi);
#endif
    for (; c + 8 <= n; c += 8)
        for (int k = 0; k < 8; k++) s[k] += a[c + k] * b[c + k];
    for (; c < n; c++) s[c & 7] += a[c] * b[c];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* The sum over k < n of exp(x[k] - shift), in k order, each term also stored in out[k] when
 * out is not NULL (it may be x): softmax numerators. The exps in vectors where the float
 * library has them (lane_math.h's lv_exp, nm_exp_poly's bits), the sum as the scalar loop. */
static real exp_sum(const real *x, uint32_t n, real shift, real *out) {
    real z = 0;
    uint32_t k = 0;
#if defined(TRAIN_REAL_FLOAT) && defined(LANE_MATH_SIMD)
    const lv4 m = LV_SET(shift);
    for (; k + 4 <= n; k += 4) {
        real e[4];
        LV_STORE(e, lv_exp(LV_SUB(LV_LOAD(x + k), m)));
        for (int i = 0; i < 4; i++) {
            z += e[i];
            if (out) out[k + i] = e[i];
        }
    }
#endif
    for (; k < n; k++) {
        const real e = rexp(x[k] - shift);
        z += e;
        if (out) out[k] = e;
    }
    return z;
}

/* x[k] = exp(x[k] - shift) for k < n (vectors as exp_sum) */
static void exp_shift(real *x, uint32_t n, real shift) {
    uint32_t k = 0;
#if defined(TRAIN_REAL_FLOAT) && defined(LANE_MATH_SIMD)
    const lv4 m = LV_SET(shift);
    for (; k + 4 <= n; k += 4) LV_STORE(x + k, lv_exp(LV_SUB(LV_LOAD(x + k), m)));
#endif
    for (; k < n; k++) x[k] = rexp(x[k] - shift);
}

/* ---- the Sinkhorn of the mHC lane mix (both generations: SINKHORN_ITERS rounds) ---------- */

/* _sinkhorn in log space: sk[0, nn) holds the logits; each round appends the row-normalized
 * A and the column-normalized S (the backward's inputs: sk grows to (2 rounds + 1) nn);
 * hres = exp(the last). With the float library on 4 lanes, the inference forward's vectors
 * (lane_math.h: nm_exp_poly / nm_log_poly lane by lane, the scalar loops' bits). */
static void sinkhorn_fwd(real *sk, uint32_t n, real *hres) {
    const uint32_t nn = n * n;
#if defined(TRAIN_REAL_FLOAT) && defined(LANE_MATH_SIMD)
    if (n == 4) {
        lv4 v[4];
        for (int r = 0; r < 4; r++) v[r] = LV_LOAD(sk + 4 * r);
        for (int it = 0; it < SINKHORN_ITERS; it++) {
            real *A = sk + (size_t)(2 * it + 1) * nn, *S2 = A + nn;
            lv_transpose(v); /* rows: the columns' vectors reduce across a row */
            lv_normalise(v);
            lv_transpose(v);
            for (int r = 0; r < 4; r++) LV_STORE(A + 4 * r, v[r]);
            lv_normalise(v);
            for (int r = 0; r < 4; r++) LV_STORE(S2 + 4 * r, v[r]);
        }
        for (int r = 0; r < 4; r++) LV_STORE(hres + 4 * r, lv_exp(v[r]));
        return;
    }
#endif
    for (uint32_t it = 0; it < SINKHORN_ITERS; it++) {
        const real *S = sk + (size_t)(2 * it) * nn;
        real *A = sk + (size_t)(2 * it + 1) * nn, *S2 = A + nn;
        for (uint32_t i = 0; i < n; i++) {
            real mx = S[i * n];
            for (uint32_t jj = 1; jj < n; jj++) mx = S[i * n + jj] > mx ? S[i * n + jj] : mx;
            real z = 0;
            for (uint32_t jj = 0; jj < n; jj++) z += rexp(S[i * n + jj] - mx);
            const real lse = mx + rlog(z);
            for (uint32_t jj = 0; jj < n; jj++) A[i * n + jj] = S[i * n + jj] - lse;
        }
        for (uint32_t jj = 0; jj < n; jj++) {
            real mx = A[jj];
            for (uint32_t i = 1; i < n; i++) mx = A[i * n + jj] > mx ? A[i * n + jj] : mx;
            real z = 0;
            for (uint32_t i = 0; i < n; i++) z += rexp(A[i * n + jj] - mx);
            const real lse = mx + rlog(z);
            for (uint32_t i = 0; i < n; i++) S2[i * n + jj] = A[i * n + jj] - lse;
        }
    }
    const real *Sf = sk + (size_t)(2 * SINKHORN_ITERS) * nn;
    for (uint32_t k = 0; k < nn; k++) hres[k] = rexp(Sf[k]);
}

/* Its backward: the logits' gradient dS[nn] from dh, the gradient of hres. The exps of every
 * stored A and S come first, in one pass of independent values (vectors where the forward
 * has them), instead of one at a time inside the dependent rounds. */
static void sinkhorn_back(const real *sk, const real *hres, const real *dh, uint32_t n, real *dS) {
    const uint32_t nn = n * n, count = 2 * SINKHORN_ITERS * nn;
    real ex[2 * SINKHORN_ITERS * 64], dA[64];
    const real *logs = sk + nn; /* A and S of round 0, then of round 1, ... */
    uint32_t k = 0;
#if defined(TRAIN_REAL_FLOAT) && defined(LANE_MATH_SIMD)
    for (; k + 4 <= count; k += 4) LV_STORE(ex + k, lv_exp(LV_LOAD(logs + k)));
#endif
    for (; k < count; k++) ex[k] = rexp(logs[k]);
    for (k = 0; k < nn; k++) dS[k] = dh[k] * hres[k];
    for (int it = SINKHORN_ITERS - 1; it >= 0; it--) {
        const real *eA = ex + (size_t)(2 * it) * nn, *eS2 = eA + nn;
        for (uint32_t jj = 0; jj < n; jj++) {
            real s = 0;
            for (uint32_t i = 0; i < n; i++) s += dS[i * n + jj];
            for (uint32_t i = 0; i < n; i++) dA[i * n + jj] = dS[i * n + jj] - eS2[i * n + jj] * s;
        }
        for (uint32_t i = 0; i < n; i++) {
            real s = 0;
            for (uint32_t jj = 0; jj < n; jj++) s += dA[i * n + jj];
            for (uint32_t jj = 0; jj < n; jj++) dS[i * n + jj] = dA[i * n + jj] - eA[i * n + jj] * s;
        }
    }
}

/* Work sharing over the model's thread pool (cpu_pool_run): items [0, n) cut into one
 * contiguous range per thread. Every output element is computed by one thread with the
 * same operations in the same order as with one thread, so results are bit-identical for
 * every thread count. */
typedef struct mm_job {
    const real *x, *W, *dy;
    real *y, *dx, *dW;
    uint32_t T, in, out;
    int back;
} mm_job;

static void range_of(uint32_t n, int i, int nt, uint32_t *lo, uint32_t *hi) {
    *lo = (uint32_t)((uint64_t)n * (uint32_t)i / (uint32_t)nt);
    *hi = (uint32_t)((uint64_t)n * (uint32_t)(i + 1) / (uint32_t)nt);
}

/* y[t] = x[t] @ W for t in [t0, t1) */
static void mm_rows(const mm_job *j, uint32_t t0, uint32_t t1) {
    for (uint32_t t = t0; t < t1; t++) {
        real *yt = j->y + (size_t)t * j->out;
        for (uint32_t o = 0; o < j->out; o++) yt[o] = 0;
        for (uint32_t i = 0; i < j->in; i++) {
            const real xi = j->x[(size_t)t * j->in + i];
            const real *wr = j->W + (size_t)i * j->out;
            for (uint32_t o = 0; o < j->out; o++) yt[o] += xi * wr[o];
        }
    }
}

/* dx[t] += dy[t] @ W^T for t in [t0, t1) */
static void mm_back_x(const mm_job *j, uint32_t t0, uint32_t t1) {
    for (uint32_t t = t0; t < t1; t++) {
        const real *dyt = j->dy + (size_t)t * j->out;
        for (uint32_t i = 0; i < j->in; i++) {
            const real *wr = j->W + (size_t)i * j->out;
            real acc = 0;
            for (uint32_t o = 0; o < j->out; o++) acc += dyt[o] * wr[o];
            j->dx[(size_t)t * j->in + i] += acc;
        }
    }
}

/* dW[i] += sum over t of x[t][i] dy[t] for i in [i0, i1) */
static void mm_back_w(const mm_job *j, uint32_t i0, uint32_t i1) {
    for (uint32_t t = 0; t < j->T; t++) {
        const real *dyt = j->dy + (size_t)t * j->out;
        for (uint32_t i = i0; i < i1; i++) {
            const real xi = j->x[(size_t)t * j->in + i];
            real *dwr = j->dW + (size_t)i * j->out;
            for (uint32_t o = 0; o < j->out; o++) dwr[o] += xi * dyt[o];
        }
    }
}

static void mm_worker(void *arg, int i, int n) {
    const mm_job *j = arg;
    uint32_t lo, hi;
    range_of(j->T, i, n, &lo, &hi);
    if (!j->back) {
        mm_rows(j, lo, hi);
        return;
    }
    if (j->dx) mm_back_x(j, lo, hi);
    range_of(j->in, i, n, &lo, &hi);
    if (j->dW) mm_back_w(j, lo, hi);
}

static real sigm(real z) { return (real)1 / ((real)1 + rexp(-z)); } /* as lane_hada_gate */

/* y = (1 + s) * x / sqrt(mean(x^2) + eps) over n (s NULL: rms_unit); returns 1/rms */
static real zc_fwd(const real *x, const real *s, uint32_t n, real *y) {
    real ms = 0;
    for (uint32_t i = 0; i < n; i++) ms += x[i] * x[i];
    const real r = (real)1 / sqrt(ms / (real)n + (real)EPS);
    for (uint32_t i = 0; i < n; i++) y[i] = (s ? (real)1 + s[i] : (real)1) * x[i] * r;
    return r;
}

/* dx += d(zc)/dx . dy, ds += d/ds (either may be NULL) */
static void zc_back(const real *x, const real *s, uint32_t n, real r, const real *dy, real *dx, real *ds) {
    real dot = 0;
    for (uint32_t i = 0; i < n; i++) {
        const real g = dy[i] * (s ? (real)1 + s[i] : (real)1);
        dot += g * x[i];
        if (ds) ds[i] += dy[i] * x[i] * r;
    }
    if (!dx) return;
    const real k = dot * r * r * r / (real)n;
    for (uint32_t i = 0; i < n; i++) {
        const real g = dy[i] * (s ? (real)1 + s[i] : (real)1);
        dx[i] += g * r - x[i] * k;
    }
}

#endif
