/* Batched CQ fake quantization (see cq_ste.h). */
#include "train/cq_ste.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/tgemm.h"
#include "util/error.h"
#include "util/fp16.h"

#define CHUNK_LINES 1024 /* lines per pass: 4 buffers of 1024 x pad floats */
#define MAX_GROUP 1024u

/* numpy's float32 pairwise sum, as the quantizer computes a group's squared norm */
static float pairwise_sum(const float *a, uint32_t n) {
    if (n < 8) {
        float r = 0.0f;
        for (uint32_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        uint32_t i;
        for (i = 8; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    uint32_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* the nearest level, ties to the lower one (searchsorted left, clamped to [1, n-1]); the
 * first level not below u found by a bisection without branches (the levels ascend; a
 * branch per halving mispredicts on half the values) */
static uint32_t nearest(const float *cb, uint32_t n, float u) {
    const float *base = cb;
    uint32_t len = n;
    while (len > 1) {
        const uint32_t half = len / 2;
        base = base[half] < u ? base + half : base;
        len -= half;
    }
    uint32_t pos = (uint32_t)(base - cb) + (*base < u);
    pos = pos < 1 ? 1 : pos > n - 1 ? n - 1 : pos;
    return pos - (uint32_t)(fabsf(u - cb[pos - 1]) <= fabsf(u - cb[pos])); /* a flag, not a branch */
}

typedef struct fq_job {
    const tg_level *lv;
    tg_gemm g;
    int single; /* one group per line: 8-wide chains added in turn */
    uint32_t G;
    /* the per-group step */
    const float *rot, *levels;
    float *scaled;
    uint32_t nlev;
    uint64_t groups;
    int64_t bad; /* the first group whose norm is beyond float16, else -1 (per thread) */
    int64_t bad_t[64];
    int step;
} fq_job;

static void rotate_share(fq_job *j, int i, int n) {
    if (!j->single) {
        tg_share(j->lv, &j->g, i, n);
        return;
    }
    /* the quantizer's single-group order: t = chain over 8 k, out = out + t */
    tg_gemm g = j->g;
    g.accumulate = 1;
    g.K = 8;
    for (uint32_t k0 = 0; k0 < j->G; k0 += 8) {
        g.A = j->g.A + k0;
        g.B = j->g.B + (size_t)k0 * j->g.ldb;
        tg_share(j->lv, &g, i, n);
    }
}

static void group_share(fq_job *j, int i, int n) {
    const uint64_t lo = j->groups * (uint64_t)i / (uint64_t)n, hi = j->groups * (uint64_t)(i + 1) / (uint64_t)n;
    const uint32_t G = j->G;
    float sq[MAX_GROUP];
    int64_t bad = -1;
    for (uint64_t q = lo; q < hi; q++) {
        const float *rot = j->rot + q * G;
        float *s = j->scaled + q * G;
        for (uint32_t k = 0; k < G; k++) sq[k] = rot[k] * rot[k];
        const float norm = sqrtf(pairwise_sum(sq, G));
        if (!isfinite(norm) || norm > 65504.0f) {
            if (bad < 0) bad = (int64_t)q;
            memset(s, 0, G * sizeof *s);
            continue;
        }
        const float denom = norm > 1e-12f ? norm : 1e-12f;
        const float nf = fp16_to_f32(f32_to_fp16(norm));
        for (uint32_t k = 0; k < G; k++) s[k] = j->levels[nearest(j->levels, j->nlev, rot[k] / denom)] * nf;
    }
    j->bad_t[i] = bad;
}

static void fq_worker(void *arg, int i, int n) {
    fq_job *j = arg;
    if (j->step == 0)
        rotate_share(j, i, n);
    else if (i < 64) /* the groups in at most 64 shares: one report slot each */
        group_share(j, i, n < 64 ? n : 64);
}

static void run_g3(const void *core, void (*fn)(void *arg, int i, int n), void *arg) {
    g3_run_parallel(core, fn, arg);
}

int g3_cq_fake_quant(const g3_model *m, const cq_codebooks *cb, uint32_t bits, float *w, uint64_t lines,
                     uint32_t cols, uint64_t line_stride, uint64_t col_stride) {
    return train_cq_fake_quant(run_g3, m, cb, bits, w, lines, cols, line_stride, col_stride);
}

int train_cq_fake_quant(train_run_fn run, const void *m, const cq_codebooks *cb, uint32_t bits, float *w,
                        uint64_t lines, uint32_t cols, uint64_t line_stride, uint64_t col_stride) {
    const uint32_t G = cb->group, nlev = cq_levels(bits);
    if (!nlev || !G || G > MAX_GROUP || (G & (G - 1)) || G % 8)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "CQ width %u / group %u not supported", bits, G);
    if (!lines || !cols) return 0;
    const uint32_t pad = (uint32_t)(((uint64_t)cols + G - 1) / G * G), ngroups = pad / G;
    const uint64_t chunk = lines < CHUNK_LINES ? lines : CHUNK_LINES;
    float *hm = malloc((size_t)G * G * sizeof *hm);
    float *buf = malloc((size_t)chunk * pad * 3 * sizeof *buf);
    if (!hm || !buf) {
        free(hm);
        free(buf);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    /* the quantizer's H: +-1/sqrt(G) rounded once from double, Sylvester signs */
    const float h = (float)(1.0 / sqrt((double)G));
    for (uint32_t k = 0; k < G; k++)
        for (uint32_t jj = 0; jj < G; jj++) hm[k * G + jj] = (__builtin_popcount(k & jj) & 1) ? -h : h;
    float *x = buf, *rot = buf + chunk * pad, *scaled = rot + chunk * pad;
    const tg_level *lv = tg_level_best();
    int st = 0;
    for (uint64_t r0 = 0; r0 < lines && !st; r0 += chunk) {
        const uint64_t nl = lines - r0 < chunk ? lines - r0 : chunk;
        if (line_stride == 1 && col_stride != 1) { /* lines are columns: a blocked transpose */
            tg_transpose(w + r0, col_stride, x, pad, cols, (uint32_t)nl);
            for (uint64_t r = 0; r < nl && !st; r++) {
                const float *dst = x + r * pad;
                for (uint32_t c = 0; c < cols && !st; c++)
                    if (!isfinite(dst[c]))
                        st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "value %g at line %llu column %u is not finite",
                                         (double)dst[c], (unsigned long long)(r0 + r), c);
                memset(x + r * pad + cols, 0, (pad - cols) * sizeof *x);
            }
        } else
            for (uint64_t r = 0; r < nl && !st; r++) {
                const float *src = w + (r0 + r) * line_stride;
                float *dst = x + r * pad;
                for (uint32_t c = 0; c < cols; c++) {
                    dst[c] = src[(uint64_t)c * col_stride];
                    if (!isfinite(dst[c]))
                        st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "value %g at line %llu column %u is not finite",
                                         (double)dst[c], (unsigned long long)(r0 + r), c);
                }
                memset(dst + cols, 0, (pad - cols) * sizeof *dst);
            }
        if (st) break;
        const uint64_t groups = nl * ngroups;
        fq_job j;
        memset(&j, 0, sizeof j);
        j.lv = lv, j.G = G, j.single = ngroups == 1, j.levels = cb->levels[bits], j.nlev = nlev;
        j.groups = groups, j.rot = rot, j.scaled = scaled;
        /* rot = groups @ H; with a single group per line C starts at 0 and takes the 8-chains */
        const tg_gemm rg = {x, hm, rot, G, G, G, (uint32_t)groups, G, G, 0};
        j.g = rg;
        if (j.single) memset(rot, 0, groups * G * sizeof *rot);
        j.step = 0;
        run(m, fq_worker, &j);
        for (int i = 0; i < 64; i++) j.bad_t[i] = -1;
        j.step = 1;
        run(m, fq_worker, &j);
        int64_t bad = -1;
        for (int i = 0; i < 64; i++)
            if (j.bad_t[i] >= 0 && (bad < 0 || j.bad_t[i] < bad)) bad = j.bad_t[i];
        if (bad >= 0) {
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "line %llu group %llu has a norm beyond f16 (the weights "
                             "are too large)", (unsigned long long)(r0 + (uint64_t)bad / ngroups),
                             (unsigned long long)((uint64_t)bad % ngroups));
            break;
        }
        /* deq = scaled @ H, into x */
        const tg_gemm dg = {scaled, hm, x, G, G, G, (uint32_t)groups, G, G, 0};
        j.g = dg;
        if (j.single) memset(x, 0, groups * G * sizeof *x);
        j.step = 0;
        run(m, fq_worker, &j);
        if (line_stride == 1 && col_stride != 1)
            tg_transpose(x, pad, w + r0, col_stride, (uint32_t)nl, cols);
        else
            for (uint64_t r = 0; r < nl; r++) {
                float *dst = w + (r0 + r) * line_stride;
                const float *src = x + r * pad;
                for (uint32_t c = 0; c < cols; c++) dst[(uint64_t)c * col_stride] = src[c];
            }
    }
    free(hm);
    free(buf);
    return st;
}
