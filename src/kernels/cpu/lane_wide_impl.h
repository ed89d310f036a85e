/* Body of the lane_wide kernels for one vector width, included by lane_wide_x86.c with:
 * WV / WI (float / integer vector), WIDTH (floats per vector), WFN (the target attribute),
 * WNAME(x) (the width's name for x) and the WV_ / WI_ operations. Every vector holds
 * WIDTH / 4 tokens, one 4-float row each, so a 128-bit part of a vector is the vector of
 * kernels/cpu/lane_math.h and every step below is that file's, element for element. */

#define WTOK (WIDTH / 4) /* tokens per vector */

/* nm_exp_poly, WIDTH at a time (lane_math.h's lv_exp) */
static inline WFN WV WNAME(exp)(WV x) {
    const WV lo = WV_SET(NM_EXP_LO);
    const WV x0 = x;
    x = WV_MIN(x, WV_SET(NM_EXP_HI));
    x = WV_MAX(x, lo);
    const WV t = WV_ADD(WV_MUL(x, WV_SET(NM_LOG2E)), WV_SET(NM_ROUND_MAGIC));
    const WV n = WV_SUB(t, WV_SET(NM_ROUND_MAGIC));
    WV r = WV_SUB(x, WV_MUL(n, WV_SET(NM_LN2_HI)));
    r = WV_SUB(r, WV_MUL(n, WV_SET(NM_LN2_LO)));
    const WV r2 = WV_MUL(r, r);
    const WV r4 = WV_MUL(r2, r2);
    const WV a = WV_ADD(WV_MUL(WV_SET(1.9875691500e-4f), r), WV_SET(1.3981999507e-3f));
    const WV b = WV_ADD(WV_MUL(WV_SET(8.3334519073e-3f), r), WV_SET(4.1665795894e-2f));
    const WV c = WV_ADD(WV_MUL(WV_SET(1.6666665459e-1f), r), WV_SET(5.0000001201e-1f));
    WV p = WV_ADD(WV_MUL(a, r4), WV_ADD(WV_MUL(b, r2), c));
    p = WV_ADD(WV_ADD(WV_MUL(p, r2), r), WV_SET(1.0f));
    const WI k = WI_SUB(WV_BITS(t), WV_BITS(WV_SET(NM_ROUND_MAGIC)));
    const WV scale = WV_FLOAT(WI_SHL(WI_ADD(k, WI_SET(127)), 23));
    return WV_MUL(p, WV_ZERO_IF_LT(x0, lo, scale)); /* 0 below NM_EXP_LO */
}

/* nm_log_poly, WIDTH at a time (lane_math.h's lv_log) */
static inline WFN WV WNAME(log)(WV x) {
    const WI bits = WV_BITS(x);
    WV e = WI_TO_FLOAT(WI_SUB(WI_SHR(bits, 23), WI_SET(126)));
    WV m = WV_FLOAT(WI_OR(WI_AND(bits, WI_SET(0x007fffffu)), WI_SET(0x3f000000u)));
    const WV half = WV_SET(NM_SQRT_HALF);
    e = WV_SELECT_LT(m, half, WV_SUB(e, WV_SET(1.0f)), e);
    m = WV_SELECT_LT(m, half, WV_ADD(m, m), m);
    const WV f = WV_SUB(m, WV_SET(1.0f));
    const WV z = WV_MUL(f, f);
    const WV z2 = WV_MUL(z, z);
    const WV p01 = WV_ADD(WV_MUL(WV_SET(7.0376836292e-2f), f), WV_SET(-1.1514610310e-1f));
    const WV p23 = WV_ADD(WV_MUL(WV_SET(1.1676998740e-1f), f), WV_SET(-1.2420140846e-1f));
    const WV p45 = WV_ADD(WV_MUL(WV_SET(1.4249322787e-1f), f), WV_SET(-1.6668057665e-1f));
    const WV p67 = WV_ADD(WV_MUL(WV_SET(2.0000714765e-1f), f), WV_SET(-2.4999993993e-1f));
    WV y = WV_ADD(WV_MUL(WV_ADD(WV_MUL(p01, z), p23), z2), WV_ADD(WV_MUL(p45, z), p67));
    y = WV_ADD(WV_MUL(y, f), WV_SET(3.3333331174e-1f));
    y = WV_MUL(y, WV_MUL(f, z));
    y = WV_ADD(y, WV_MUL(e, WV_SET(NM_LN2_LO)));
    y = WV_SUB(y, WV_MUL(z, WV_SET(0.5f)));
    return WV_ADD(WV_ADD(f, y), WV_MUL(e, WV_SET(NM_LN2_HI)));
}

/* lane_math.h's lv_normalise */
static inline WFN void WNAME(normalise)(WV v[4]) {
    const WV m = WV_MAX(WV_MAX(WV_MAX(v[0], v[1]), v[2]), v[3]);
    WV sum = WNAME(exp)(WV_SUB(v[0], m));
    sum = WV_ADD(sum, WNAME(exp)(WV_SUB(v[1], m)));
    sum = WV_ADD(sum, WNAME(exp)(WV_SUB(v[2], m)));
    sum = WV_ADD(sum, WNAME(exp)(WV_SUB(v[3], m)));
    const WV lse = WV_ADD(m, WNAME(log)(sum));
    for (int k = 0; k < 4; k++) v[k] = WV_SUB(v[k], lse);
}

/* _MM_TRANSPOSE4_PS in every 128-bit part */
static inline WFN void WNAME(transpose)(WV v[4]) {
    const WV t0 = WV_UNPACKLO(v[0], v[1]), t1 = WV_UNPACKHI(v[0], v[1]);
    const WV t2 = WV_UNPACKLO(v[2], v[3]), t3 = WV_UNPACKHI(v[2], v[3]);
    v[0] = WV_SHUFFLE(t0, t2, 0x44);
    v[1] = WV_SHUFFLE(t0, t2, 0xEE);
    v[2] = WV_SHUFFLE(t1, t3, 0x44);
    v[3] = WV_SHUFFLE(t1, t3, 0xEE);
}

/* Vector groups interleaved: one Sinkhorn is a chain of dependent steps, and the steps of
 * independent groups fill the time each waits on the one before. */
#ifndef WGROUPS
#define WGROUPS 4
#endif

static WFN void WNAME(sinkhorn4)(float *P, uint32_t count) {
    WV v[WGROUPS][4];
    float buf[4 * WIDTH]; /* row r of the group's tokens: buf[r * WIDTH + 4 * t + c] */
    for (uint32_t g = 0; g < WGROUPS; g++) {
        for (uint32_t t = 0; t < WTOK; t++) {
            const uint32_t tok = g * WTOK + t;
            for (uint32_t k = 0; k < 16; k++) /* padding tokens: zeros, never stored */
                buf[(k / 4) * WIDTH + 4 * t + k % 4] = tok < count ? P[16 * tok + k] : 0.0f;
        }
        for (int r = 0; r < 4; r++) v[g][r] = WV_LOAD(buf + r * WIDTH);
    }
    const uint32_t groups = (count + WTOK - 1) / WTOK;
    for (int it = 0; it < NM_SINKHORN_ROUNDS; it++) {
        for (uint32_t g = 0; g < groups; g++) {
            WNAME(transpose)(v[g]); /* rows: the columns' vectors reduce across a row */
            WNAME(normalise)(v[g]);
        }
        for (uint32_t g = 0; g < groups; g++) {
            WNAME(transpose)(v[g]);
            WNAME(normalise)(v[g]);
        }
    }
    for (uint32_t g = 0; g < groups; g++) {
        for (int r = 0; r < 4; r++) WV_STORE(buf + r * WIDTH, WNAME(exp)(v[g][r]));
        for (uint32_t t = 0; t < WTOK && g * WTOK + t < count; t++)
            for (uint32_t k = 0; k < 16; k++)
                P[16 * (g * WTOK + t) + k] = buf[(k / 4) * WIDTH + 4 * t + k % 4];
    }
}

static WFN void WNAME(rewrite4)(float *X, const float *y, const float *P, const float *hpost,
                                uint32_t d) {
    float *X0 = X, *X1 = X + d, *X2 = X + 2 * (size_t)d, *X3 = X + 3 * (size_t)d;
    float *rows[4] = {X0, X1, X2, X3};
    uint32_t k = 0;
    for (; k + WIDTH <= d; k += WIDTH) {
        const WV o0 = WV_LOAD(X0 + k), o1 = WV_LOAD(X1 + k), o2 = WV_LOAD(X2 + k),
                 o3 = WV_LOAD(X3 + k), yv = WV_LOAD(y + k);
        for (int r = 0; r < 4; r++) {
            WV acc = WV_MUL(WV_SET(hpost[r]), yv);
            acc = WV_ADD(acc, WV_MUL(WV_SET(P[4 * r + 0]), o0));
            acc = WV_ADD(acc, WV_MUL(WV_SET(P[4 * r + 1]), o1));
            acc = WV_ADD(acc, WV_MUL(WV_SET(P[4 * r + 2]), o2));
            acc = WV_ADD(acc, WV_MUL(WV_SET(P[4 * r + 3]), o3));
            WV_STORE(rows[r] + k, acc);
        }
    }
    for (; k < d; k++) {
        const float o[4] = {X0[k], X1[k], X2[k], X3[k]};
        for (int r = 0; r < 4; r++) {
            float acc = hpost[r] * y[k];
            for (int c = 0; c < 4; c++) acc += P[4 * r + c] * o[c];
            rows[r][k] = acc;
        }
    }
}

/* u = bx = sum over r of w[r] * X[r], accumulated from 0 in the order r = 0..3 */
static WFN void WNAME(read4)(const float *X, const float *w, uint32_t d, float *u, float *bx) {
    const float *X0 = X, *X1 = X + d, *X2 = X + 2 * (size_t)d, *X3 = X + 3 * (size_t)d;
    const WV w0 = WV_SET(w[0]), w1 = WV_SET(w[1]), w2 = WV_SET(w[2]), w3 = WV_SET(w[3]);
    uint32_t k = 0;
    for (; k + WIDTH <= d; k += WIDTH) {
        WV acc = WV_ADD(WV_SET(0.0f), WV_MUL(w0, WV_LOAD(X0 + k)));
        acc = WV_ADD(acc, WV_MUL(w1, WV_LOAD(X1 + k)));
        acc = WV_ADD(acc, WV_MUL(w2, WV_LOAD(X2 + k)));
        acc = WV_ADD(acc, WV_MUL(w3, WV_LOAD(X3 + k)));
        WV_STORE(u + k, acc);
        WV_STORE(bx + k, acc);
    }
    for (; k < d; k++) {
        float acc = 0.0f;
        acc += w[0] * X0[k];
        acc += w[1] * X1[k];
        acc += w[2] * X2[k];
        acc += w[3] * X3[k];
        u[k] = bx[k] = acc;
    }
}

/* lane_math.h's lane_hada_gate: v = d2[i] * (z[i] * scale), z[i] = v / (1 + exp(-v)) */
static WFN void WNAME(hada_gate)(float *z, const float *d2, float scale, uint32_t n) {
    const WV one = WV_SET(1.0f), sc = WV_SET(scale);
    uint32_t i = 0;
    for (; i + WIDTH <= n; i += WIDTH) {
        const WV v = WV_MUL(WV_LOAD(d2 + i), WV_MUL(WV_LOAD(z + i), sc));
        const WV sig = WV_DIV(one, WV_ADD(one, WNAME(exp)(WV_NEG(v))));
        WV_STORE(z + i, WV_MUL(v, sig));
    }
    for (; i < n; i++) {
        const float v = d2[i] * (z[i] * scale);
        const float sig = 1.0f / (1.0f + nm_exp_poly(-v));
        z[i] = v * sig;
    }
}

#undef WTOK
#undef WGROUPS
