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

/* The nearest level of u = rot / denom, times nf, for a whole group (below). AVX-512F and AVX2 for
 * codebooks of at most 16 levels (W4 and below: all of them in one register): the count
 * of levels below u by 16-lane compares, both neighbours by a permute. Every step is an
 * exactly rounded IEEE operation (divide, compare, subtract, absolute value, multiply),
 * so the lanes give what the scalar loop gives, bit for bit. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_NEAREST512 1
__attribute__((target("avx512f"))) static void nearest512(const float *rot, float denom, float nf,
                                                          const float *levels, uint32_t nlev, uint32_t G, float *s) {
    const __m512 lv = _mm512_maskz_loadu_ps((__mmask16)((1u << nlev) - 1), levels);
    const __m512i one = _mm512_set1_epi32(1), top = _mm512_set1_epi32((int)nlev - 1);
    const __m512 vd = _mm512_set1_ps(denom), vn = _mm512_set1_ps(nf);
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
    for (uint32_t k = 0; k < G; k += 16) {
        const __mmask16 km = G - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (G - k)) - 1);
        const __m512 u = _mm512_div_ps(_mm512_maskz_loadu_ps(km, rot + k), vd);
        __m512i pos = _mm512_setzero_si512();
        for (uint32_t l = 0; l < nlev; l++) {
            const __mmask16 below = _mm512_cmp_ps_mask(_mm512_set1_ps(levels[l]), u, _CMP_LT_OQ);
            pos = _mm512_mask_add_epi32(pos, below, pos, one);
        }
        const __m512i p = _mm512_min_epi32(_mm512_max_epi32(pos, one), top);
        const __m512 lo = _mm512_permutexvar_ps(_mm512_sub_epi32(p, one), lv), hi = _mm512_permutexvar_ps(p, lv);
        const __m512 dlo = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_sub_ps(u, lo)), abs_mask));
        const __m512 dhi = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_sub_ps(u, hi)), abs_mask));
        const __m512 q = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(dlo, dhi, _CMP_LE_OQ), hi, lo);
        _mm512_mask_storeu_ps(s + k, km, _mm512_mul_ps(q, vn));
    }
}

/* The same with AVX2 (8 lanes, two 8-level halves of the codebook picked by a blend) */
__attribute__((target("avx2"))) static void nearest256(const float *rot, float denom, float nf,
                                                       const float *levels, uint32_t nlev, uint32_t G, float *s) {
    float lvp[16] = {0};
    memcpy(lvp, levels, nlev * sizeof *levels);
    const __m256 lv0 = _mm256_loadu_ps(lvp), lv1 = _mm256_loadu_ps(lvp + 8);
    const __m256i one = _mm256_set1_epi32(1), top = _mm256_set1_epi32((int)nlev - 1), seven = _mm256_set1_epi32(7);
    const __m256 vd = _mm256_set1_ps(denom), vn = _mm256_set1_ps(nf);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (uint32_t k = 0; k < G; k += 8) { /* G is a multiple of 8 (train_cq_fake_quant) */
        const __m256 u = _mm256_div_ps(_mm256_loadu_ps(rot + k), vd);
        __m256i pos = _mm256_setzero_si256();
        for (uint32_t l = 0; l < nlev; l++) /* a true compare is -1: subtract it */
            pos = _mm256_sub_epi32(pos, _mm256_castps_si256(_mm256_cmp_ps(_mm256_set1_ps(levels[l]), u, _CMP_LT_OQ)));
        const __m256i p = _mm256_min_epi32(_mm256_max_epi32(pos, one), top), pm = _mm256_sub_epi32(p, one);
        const __m256 lo = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lv0, pm), _mm256_permutevar8x32_ps(lv1, pm),
                                           _mm256_castsi256_ps(_mm256_cmpgt_epi32(pm, seven)));
        const __m256 hi = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lv0, p), _mm256_permutevar8x32_ps(lv1, p),
                                           _mm256_castsi256_ps(_mm256_cmpgt_epi32(p, seven)));
        const __m256 dlo = _mm256_and_ps(_mm256_sub_ps(u, lo), abs_mask);
        const __m256 dhi = _mm256_and_ps(_mm256_sub_ps(u, hi), abs_mask);
        const __m256 q = _mm256_blendv_ps(hi, lo, _mm256_cmp_ps(dlo, dhi, _CMP_LE_OQ));
        _mm256_storeu_ps(s + k, _mm256_mul_ps(q, vn));
    }
}
#else
#define HAVE_NEAREST512 0
#endif

typedef struct fq_job {
    const tg_level *lv;
    int nearest512; /* nearest512 above (the AVX-512 level and at most 16 levels) */
    int nearest256; /* nearest256 (the AVX2 level and at most 16 levels) */
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
        /* the nearest level, ties to the lower one (searchsorted left, clamped to [1, n-1]),
         * for the whole group without branches (it vectorizes): in the ascending levels the
         * first one not below u is at the count of levels below u */
#if HAVE_NEAREST512
        if (j->nearest512) {
            nearest512(rot, denom, nf, j->levels, j->nlev, G, s);
            continue;
        }
        if (j->nearest256) {
            nearest256(rot, denom, nf, j->levels, j->nlev, G, s);
            continue;
        }
#endif
        float u[MAX_GROUP];
        uint32_t pos[MAX_GROUP];
        for (uint32_t k = 0; k < G; k++) u[k] = rot[k] / denom, pos[k] = 0;
        for (uint32_t l = 0; l < j->nlev; l++) {
            const float lv = j->levels[l];
            for (uint32_t k = 0; k < G; k++) pos[k] += lv < u[k];
        }
        const uint32_t top = j->nlev - 1;
        for (uint32_t k = 0; k < G; k++) {
            const uint32_t p = pos[k] < 1 ? 1 : pos[k] > top ? top : pos[k];
            const float below = j->levels[p - 1], above = j->levels[p];
            s[k] = (fabsf(u[k] - below) <= fabsf(u[k] - above) ? below : above) * nf;
        }
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
        /* lines along the columns of a row-major matrix (a kernel grouped along its input
         * axis): a blocked transpose instead of one strided column per line */
        const int by_column = line_stride == 1 && col_stride != 1;
        if (by_column) tg_transpose(w + r0, col_stride, x, pad, cols, (uint32_t)nl);
        for (uint64_t r = 0; r < nl && !st; r++) {
            const float *src = w + (r0 + r) * line_stride;
            float *dst = x + r * pad;
            for (uint32_t c = 0; c < cols; c++) {
                if (!by_column) dst[c] = src[(uint64_t)c * col_stride];
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
        j.nearest512 = HAVE_NEAREST512 && nlev >= 2 && nlev <= 16 && !strcmp(lv->name, "avx512");
        j.nearest256 = HAVE_NEAREST512 && nlev >= 2 && nlev <= 16 && !strcmp(lv->name, "avx2");
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
        if (by_column) {
            tg_transpose(x, pad, w + r0, col_stride, (uint32_t)nl, cols);
            continue;
        }
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
