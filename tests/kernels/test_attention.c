/* The attention kernel (kernels/cpu/attn.h) of every level this machine supports against
 * a double-precision reference written here, and every SIMD level against the plain one.
 *
 * Inputs: a random cache of each precision (f32, f16, int8 with a scale per 32 values of
 * the row), heads of 2..136 columns (multiples of 8 and not), heads that start on and
 * off a scale-group boundary, 1..7 query heads, and position lists of one run, of sinks
 * plus a tail, and of a tail that wraps around the ring (three runs), with and without
 * the output gate (arguments up to +-120, where the sigmoid saturates). Scores span from
 * tiny to very large (scaled queries), so the exp of the softmax sees arguments down to
 * far below the float range. Needle 3's V heads of another width than K (attn_kv.v_dim)
 * at their own columns.
 *
 * Tolerances: o is a convex combination of value rows, so errors are measured relative to
 * max |v| (the cache's dequantised values, which both sides read exactly):
 *   TOL + SCORE_TOL * max |score|, with TOL = 2e-5 (float sums over up to 300 positions;
 *   the SIMD exp is within a few ulp) and SCORE_TOL = 1e-6: a score of magnitude S is only
 *   known to about S * hd * 2^-24 in float, and exp turns that absolute error into a
 *   relative error of the weight; both for a level against the double reference and for
 *   a SIMD level against the plain one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/cpu/cpu.h"
#include "needle.h"
#include "util/fp16.h"

#define TOL 2e-5
#define SCORE_TOL 1e-6
#define GROUP 32u

static uint64_t rng_state = 0xD1B54A32D192ED03ULL;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_float(void) { return (float)((int)(rnd() % 20001) - 10000) / 10000.0f; }

/* A cache of `slots` rows of `row` values in one precision, with its float image. */
typedef struct cache {
    int32_t type;
    uint32_t slots, row;
    void *k, *v;
    float *k_scales, *v_scales; /* int8 */
    float *kf, *vf;             /* what the kernel must read: dequantised values */
} cache;

static void fill(cache *c, int which) {
    const size_t n = (size_t)c->slots * c->row;
    const uint32_t groups = (c->row + GROUP - 1) / GROUP;
    float *img = which ? c->vf : c->kf;
    void *dst = which ? c->v : c->k;
    float *scales = which ? c->v_scales : c->k_scales;
    for (size_t i = 0; i < n; i++) {
        const float x = rnd_float() * 2.0f;
        if (c->type == NEEDLE_KV_F32) {
            ((float *)dst)[i] = img[i] = x;
        } else if (c->type == NEEDLE_KV_F16) {
            ((uint16_t *)dst)[i] = f32_to_fp16(x);
            img[i] = fp16_to_f32(((uint16_t *)dst)[i]);
        } else {
            ((int8_t *)dst)[i] = (int8_t)((int)(rnd() % 255) - 127);
        }
    }
    if (c->type == NEEDLE_KV_INT8)
        for (uint32_t s = 0; s < c->slots; s++)
            for (uint32_t g = 0; g < groups; g++) {
                const float sc = 0.001f + (float)(rnd() % 1000) / 20000.0f;
                scales[(size_t)s * groups + g] = sc;
                for (uint32_t j = g * GROUP; j < c->row && j < (g + 1) * GROUP; j++)
                    img[(size_t)s * c->row + j] =
                        (float)((int8_t *)dst)[(size_t)s * c->row + j] * sc;
            }
}

static cache make_cache(int32_t type, uint32_t slots, uint32_t row) {
    cache c = {type, slots, row, NULL, NULL, NULL, NULL, NULL, NULL};
    const size_t n = (size_t)slots * row, groups = (row + GROUP - 1) / GROUP;
    const size_t elem = type == NEEDLE_KV_F32 ? 4 : type == NEEDLE_KV_F16 ? 2 : 1;
    c.k = malloc(n * elem);
    c.v = malloc(n * elem);
    c.kf = malloc(n * sizeof(float));
    c.vf = malloc(n * sizeof(float));
    c.k_scales = malloc(slots * groups * sizeof(float));
    c.v_scales = malloc(slots * groups * sizeof(float));
    fill(&c, 0);
    fill(&c, 1);
    return c;
}

static void free_cache(cache *c) {
    free(c->k);
    free(c->v);
    free(c->kf);
    free(c->vf);
    free(c->k_scales);
    free(c->v_scales);
}

/* The kernel's view of head columns [col0, col0 + hd) of the cache. */
static attn_kv view(const cache *c, uint32_t col0) {
    const size_t elem = c->type == NEEDLE_KV_F32 ? 4 : c->type == NEEDLE_KV_F16 ? 2 : 1;
    attn_kv kv = {.type = c->type,
                  .k = (const char *)c->k + col0 * elem,
                  .v = (const char *)c->v + col0 * elem,
                  .ld = c->row,
                  .k_scales = c->type == NEEDLE_KV_INT8 ? c->k_scales : NULL,
                  .v_scales = c->type == NEEDLE_KV_INT8 ? c->v_scales : NULL,
                  .scales_ld = (c->row + GROUP - 1) / GROUP,
                  .col0 = col0,
                  .group = GROUP};
    return kv;
}

/* Softmax attention in double over the float image of the cache. */
static void reference2(const cache *c, uint32_t col0, uint32_t v_col0, uint32_t vd,
                       const attn_run *runs, uint32_t n_runs, const float *q, uint32_t nq,
                       uint32_t hd, float scale, double *o, double *smax);

static void reference(const cache *c, uint32_t col0, const attn_run *runs, uint32_t n_runs,
                      const float *q, uint32_t nq, uint32_t hd, float scale, double *o,
                      double *smax) {
    reference2(c, col0, col0, hd, runs, n_runs, q, nq, hd, scale, o, smax);
}

/* The same with V heads of vd values starting at column v_col0 (o: [nq][vd]). */
static void reference2(const cache *c, uint32_t col0, uint32_t v_col0, uint32_t vd,
                       const attn_run *runs, uint32_t n_runs, const float *q, uint32_t nq,
                       uint32_t hd, float scale, double *o, double *smax) {
    *smax = 0;
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_runs; r++) n += runs[r].count;
    double *s = malloc(n * sizeof *s);
    for (uint32_t a = 0; a < nq; a++) {
        uint32_t p = 0;
        double mx = -INFINITY;
        for (uint32_t r = 0; r < n_runs; r++)
            for (uint32_t i = 0; i < runs[r].count; i++, p++) {
                const float *k = c->kf + (size_t)(runs[r].slot + i) * c->row + col0;
                double acc = 0;
                for (uint32_t j = 0; j < hd; j++) acc += (double)q[a * hd + j] * k[j];
                s[p] = acc * scale;
                *smax = fmax(*smax, fabs(s[p]));
                if (s[p] > mx) mx = s[p];
            }
        double sum = 0;
        for (p = 0; p < n; p++) sum += s[p] = exp(s[p] - mx);
        for (uint32_t j = 0; j < vd; j++) o[a * vd + j] = 0;
        p = 0;
        for (uint32_t r = 0; r < n_runs; r++)
            for (uint32_t i = 0; i < runs[r].count; i++, p++) {
                const float *v = c->vf + (size_t)(runs[r].slot + i) * c->row + v_col0;
                for (uint32_t j = 0; j < vd; j++) o[a * vd + j] += s[p] / sum * v[j];
            }
    }
    free(s);
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

static const cpu_kernels *levels[4];
static int n_levels;

static void find_levels(void) {
    const char *names[] = {"scalar", "avx2", "avx512", "neon"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const cpu_kernels *k = cpu_kernels_named(names[i]);
        if (k) levels[n_levels++] = k;
        printf("  level %s: %s\n", names[i], k ? "tested" : "not supported here");
    }
}

static void test_every_level_every_shape(void) {
    const uint32_t hds[] = {2, 6, 8, 24, 32, 40, 64, 72, 136};
    const int32_t types[] = {NEEDLE_KV_F32, NEEDLE_KV_F16, NEEDLE_KV_INT8};
    const uint32_t slots = 300;
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
            const uint32_t hd = hds[hi], row = 3 * hd;
            cache c = make_cache(types[ti], slots, row);
            /* heads 1 and 2 of the row: col0 = hd, 2*hd (on or off a scale group) */
            for (uint32_t head = 1; head < 3; head++)
                for (uint32_t nq = 1; nq <= 7; nq += 2) {
                    const uint32_t col0 = head * hd;
                    attn_kv kv = view(&c, col0);
                    kv.cold = head == 1; /* prefetching or not: the same arithmetic */
                    const attn_run one[] = {{0, 1}};
                    const attn_run sinks_tail[] = {{0, 3}, {40, 97}};
                    const attn_run wrapped[] = {{0, 4}, {251, 49}, {4, 190}};
                    const attn_run *lists[] = {one, sinks_tail, wrapped};
                    const uint32_t counts[] = {1, 2, 3};
                    for (int li = 0; li < 3; li++)
                        for (int big = 0; big < 2; big++) {
                            float *q = malloc((size_t)nq * hd * sizeof *q);
                            /* big: scores of hundreds, most softmax weights underflow */
                            for (uint32_t i = 0; i < nq * hd; i++)
                                q[i] = rnd_float() * (big ? 60.0f : 1.0f);
                            const float scale = 1.0f / sqrtf((float)hd);
                            double *ref = malloc((size_t)nq * hd * sizeof *ref);
                            double smax;
                            reference(&c, col0, lists[li], counts[li], q, nq, hd, scale, ref,
                                      &smax);
                            /* the output gate on every other case, with arguments up to
                             * +-120 (the sigmoid saturates; exp must not overflow) */
                            const int gated = (li + big) % 2 == 1;
                            float *gate = malloc((size_t)nq * hd * sizeof *gate);
                            for (uint32_t i = 0; i < nq * hd; i++) {
                                gate[i] = rnd_float() * (i % 7 == 0 ? 120.0f : 4.0f);
                                if (gated) ref[i] *= 1.0 / (1.0 + exp(-(double)gate[i]));
                            }
                            const double vmax = fmax(1.0, max_abs(c.vf, (size_t)slots * row));
                            const double lim = vmax * (TOL + SCORE_TOL * smax);
                            float *plain_o = NULL;
                            for (int L = 0; L < n_levels; L++) {
                                float *w = malloc((size_t)nq * slots * sizeof *w);
                                float *o = malloc((size_t)nq * hd * sizeof *o);
                                float *tmp = malloc(hd * sizeof *tmp);
                                levels[L]->attend(&kv, lists[li], counts[li], q, nq, hd, scale,
                                                  gated ? gate : NULL, w, slots, o, tmp);
                                double err = 0, err_plain = 0;
                                for (uint32_t i = 0; i < nq * hd; i++) {
                                    err = fmax(err, fabs(o[i] - ref[i]));
                                    if (plain_o) err_plain = fmax(err_plain, fabs(o[i] - plain_o[i]));
                                }
                                CHECK_MSG(err <= lim,
                                          "%s kv%d hd %u col0 %u nq %u list %d big %d: |o - "
                                          "ref| %.3g > %.3g", levels[L]->name, types[ti], hd,
                                          col0, nq, li, big, err, lim);
                                CHECK_MSG(err_plain <= lim,
                                          "%s kv%d hd %u col0 %u nq %u list %d: |o - plain| %.3g",
                                          levels[L]->name, types[ti], hd, col0, nq, li, err_plain);
                                if (!plain_o) plain_o = o;
                                else free(o);
                                free(w);
                                free(tmp);
                            }
                            free(plain_o);
                            free(gate);
                            free(ref);
                            free(q);
                        }
                }
            free_cache(&c);
        }
}

/* Needle 3's heads: V rows of another width than K (attn_kv.v_dim), wider and narrower,
 * multiples of 8 and not, the V head at its own column (on and off a scale group), every
 * precision and level, gated and not; against the double reference and the plain kernel
 * with the tolerance above. */
static void test_v_width_differs(void) {
    const uint32_t shapes[][2] = {{16, 8}, {8, 24}, {40, 32}, {32, 72}, {12, 20}, {64, 48},
                                  {48, 64}, {16, 112}, {96, 32}};
    const int32_t types[] = {NEEDLE_KV_F32, NEEDLE_KV_F16, NEEDLE_KV_INT8};
    const uint32_t slots = 120;
    const attn_run runs[] = {{0, 2}, {70, 50}, {2, 30}};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const uint32_t hd = shapes[si][0], vd = shapes[si][1];
            const uint32_t row = 3 * (hd > vd ? hd : vd);
            cache c = make_cache(types[ti], slots, row);
            for (uint32_t head = 1; head < 3; head++) {
                /* 6: Needle 3's query heads per K/V head (one AVX-512 group) */
                const uint32_t nq = head == 1 ? 6 : 3, col0 = head * hd, v_col0 = head * vd;
                attn_kv kv = view(&c, col0);
                const size_t elem = types[ti] == NEEDLE_KV_F32   ? 4
                                    : types[ti] == NEEDLE_KV_F16 ? 2
                                                                 : 1;
                kv.v = (const char *)c.v + v_col0 * elem;
                kv.v_dim = vd;
                kv.v_col0 = v_col0;
                float *q = malloc((size_t)nq * hd * sizeof *q);
                float *gate = malloc((size_t)nq * vd * sizeof *gate);
                double *ref = malloc((size_t)nq * vd * sizeof *ref);
                for (uint32_t i = 0; i < nq * hd; i++) q[i] = rnd_float() * 3.0f;
                const float scale = 1.0f / sqrtf((float)hd);
                double smax;
                reference2(&c, col0, v_col0, vd, runs, 3, q, nq, hd, scale, ref, &smax);
                const int gated = head == 2;
                for (uint32_t i = 0; i < nq * vd; i++) {
                    gate[i] = rnd_float() * 4.0f;
                    if (gated) ref[i] *= 1.0 / (1.0 + exp(-(double)gate[i]));
                }
                const double vmax = fmax(1.0, max_abs(c.vf, (size_t)slots * row));
                const double lim = vmax * (TOL + SCORE_TOL * smax);
                float *plain_o = NULL;
                for (int L = 0; L < n_levels; L++) {
                    float *w = malloc((size_t)nq * slots * sizeof *w);
                    /* one float past o's end: a kernel writing hd-wide rows would touch it */
                    float *o = malloc(((size_t)nq * vd + 1) * sizeof *o);
                    float *tmp = malloc((hd > vd ? hd : vd) * sizeof *tmp);
                    o[(size_t)nq * vd] = 12345.0f;
                    levels[L]->attend(&kv, runs, 3, q, nq, hd, scale, gated ? gate : NULL, w,
                                      slots, o, tmp);
                    double err = 0, err_plain = 0;
                    for (uint32_t i = 0; i < nq * vd; i++) {
                        err = fmax(err, fabs(o[i] - ref[i]));
                        if (plain_o) err_plain = fmax(err_plain, fabs(o[i] - plain_o[i]));
                    }
                    CHECK_MSG(err <= lim, "%s kv%d qk %u v %u head %u: |o - ref| %.3g > %.3g",
                              levels[L]->name, types[ti], hd, vd, head, err, lim);
                    CHECK_MSG(err_plain <= lim, "%s kv%d qk %u v %u head %u: |o - plain| %.3g",
                              levels[L]->name, types[ti], hd, vd, head, err_plain);
                    CHECK_MSG(o[(size_t)nq * vd] == 12345.0f, "%s: wrote past o",
                              levels[L]->name);
                    if (!plain_o) plain_o = o;
                    else free(o);
                    free(w);
                    free(tmp);
                }
                free(plain_o);
                free(ref);
                free(gate);
                free(q);
            }
            free_cache(&c);
        }
}

/* The same call twice gives the same bits (no state carried between calls), and a
 * kernel reads only the head's own columns: poisoning the neighbours changes nothing. */
static void test_reads_only_its_head(void) {
    const uint32_t hd = 64, row = 3 * hd, slots = 40;
    for (int L = 0; L < n_levels; L++)
        for (int32_t type = NEEDLE_KV_F32; type <= NEEDLE_KV_INT8; type++) {
            cache c = make_cache(type, slots, row);
            const attn_kv kv = view(&c, hd);
            const attn_run runs[] = {{0, slots}};
            float q[2 * 64], w[2 * 40], o1[2 * 64], o2[2 * 64], tmp[64];
            for (uint32_t i = 0; i < 2 * hd; i++) q[i] = rnd_float();
            levels[L]->attend(&kv, runs, 1, q, 2, hd, 0.125f, NULL, w, slots, o1, tmp);
            const size_t elem = type == NEEDLE_KV_F32 ? 4 : type == NEEDLE_KV_F16 ? 2 : 1;
            for (uint32_t s = 0; s < slots; s++) {
                memset((char *)c.k + (size_t)s * row * elem, 0x7f, hd * elem);
                memset((char *)c.v + ((size_t)s * row + 2 * hd) * elem, 0x7f, hd * elem);
            }
            levels[L]->attend(&kv, runs, 1, q, 2, hd, 0.125f, NULL, w, slots, o2, tmp);
            CHECK_MSG(memcmp(o1, o2, sizeof o1) == 0, "%s kv%d: result depends on other heads",
                      levels[L]->name, type);
            free_cache(&c);
        }
}

/* The prefill block kernels (attn.h attend_block) of every level that has one: blocks of
 * nt tokens from position n0 (token i over slots [0, n0 + i]), each token against the
 * double reference over its own positions with the tolerance above; ragged blocks (1..16
 * tokens, first positions from 0, so the first token sees one key), 1..3 query heads,
 * every precision, V heads as wide as K and not, strides between tokens wider than a
 * token's heads, gated and not. A kernel writes only the nt tokens' heads, and declines
 * (returns 0, writes nothing) the shapes it does not take: head widths not a multiple of
 * 8, int8 heads off an 8-column boundary, more tokens or keys than a block holds. */
static void check_block(const cpu_kernels *kern, const cache *c, uint32_t hd, uint32_t vd,
                        uint32_t nq, uint32_t n0, uint32_t nt, int gated, float qmag) {
    const uint32_t col0 = hd, v_col0 = vd;
    attn_kv kv = view(c, col0);
    const size_t elem = c->type == NEEDLE_KV_F32 ? 4 : c->type == NEEDLE_KV_F16 ? 2 : 1;
    kv.v = (const char *)c->v + v_col0 * elem;
    kv.v_dim = vd;
    kv.v_col0 = v_col0;
    const size_t ld_q = (size_t)nq * hd + 5, ld_o = (size_t)nq * vd + 3, ld_g = ld_o + 1;
    float *q = malloc((nt + 1) * ld_q * sizeof *q);
    float *gate = malloc((nt + 1) * ld_g * sizeof *gate);
    float *o = malloc((nt + 1) * ld_o * sizeof *o);
    float *scratch = malloc(attn_block_scratch_floats(hd, vd) * sizeof *scratch);
    double *ref = malloc((size_t)nq * vd * sizeof *ref);
    for (size_t i = 0; i < (nt + 1) * ld_q; i++) q[i] = rnd_float() * qmag;
    for (size_t i = 0; i < (nt + 1) * ld_g; i++) gate[i] = rnd_float() * 4.0f;
    for (size_t i = 0; i < (nt + 1) * ld_o; i++) o[i] = 12345.0f;
    const float scale = 1.0f / sqrtf((float)hd);
    const int done = kern->attend_block(&kv, n0, nt, q, ld_q, nq, hd, scale,
                                        gated ? gate : NULL, ld_g, o, ld_o, scratch);
    CHECK_MSG(done == 1, "%s kv%d qk %u v %u: block declined", kern->name, c->type, hd, vd);
    const double vmax = fmax(1.0, max_abs(c->vf, (size_t)c->slots * c->row));
    for (uint32_t i = 0; i < nt && done; i++) {
        const attn_run runs[] = {{0, n0 + i + 1}};
        double smax;
        reference2(c, col0, v_col0, vd, runs, 1, q + i * ld_q, nq, hd, scale, ref, &smax);
        const double lim = vmax * (TOL + SCORE_TOL * smax);
        double err = 0;
        for (uint32_t j = 0; j < nq * vd; j++) {
            const double want = gated ? ref[j] / (1.0 + exp(-(double)gate[i * ld_g + j])) : ref[j];
            err = fmax(err, fabs(o[i * ld_o + j] - want));
        }
        CHECK_MSG(err <= lim, "%s kv%d qk %u v %u nq %u n0 %u nt %u token %u: |o - ref| %.3g "
                  "> %.3g", kern->name, c->type, hd, vd, nq, n0, nt, i, err, lim);
    }
    int untouched = 1;
    for (uint32_t i = 0; i <= nt; i++)
        for (size_t j = i < nt ? (size_t)nq * vd : 0; j < ld_o; j++)
            untouched &= o[i * ld_o + j] == 12345.0f;
    CHECK_MSG(untouched, "%s kv%d qk %u v %u nq %u n0 %u nt %u: wrote outside the tokens' "
              "heads", kern->name, c->type, hd, vd, nq, n0, nt);
    free(ref);
    free(scratch);
    free(o);
    free(gate);
    free(q);
}

/* A shape the block kernel must decline: returns 0 and leaves o alone. */
static void check_declined(const cpu_kernels *kern, const attn_kv *kv, uint32_t n0,
                           uint32_t nt, uint32_t hd, const char *why) {
    const size_t ld = 2 * (size_t)ATTN_BLOCK_MAX_DIM;
    float *q = calloc((nt + 1) * ld, sizeof *q), *o = malloc((nt + 1) * ld * sizeof *o);
    float *scratch = malloc(attn_block_scratch_floats(ATTN_BLOCK_MAX_DIM, ATTN_BLOCK_MAX_DIM) *
                            sizeof *scratch);
    for (size_t i = 0; i < (nt + 1) * ld; i++) o[i] = 12345.0f;
    const int done = kern->attend_block(kv, n0, nt, q, ld, 2, hd, 0.5f, NULL, ld, o, ld, scratch);
    int untouched = 1;
    for (size_t i = 0; i < (nt + 1) * ld; i++) untouched &= o[i] == 12345.0f;
    CHECK_MSG(done == 0 && untouched, "%s: %s not declined", kern->name, why);
    free(scratch);
    free(o);
    free(q);
}

static void test_prefill_blocks(void) {
    const char *names[] = {"avx2", "avx512"};
    int tested = 0;
    for (size_t li = 0; li < sizeof names / sizeof names[0]; li++) {
        const cpu_kernels *kern = cpu_kernels_named(names[li]);
        if (!kern || !kern->attend_block) continue;
        tested = 1;
        const uint32_t shapes[][2] = {{64, 64}, {8, 8}, {24, 24}, {72, 72}, {32, 48}, {16, 8}};
        const uint32_t blocks[][2] = {{0, 16}, {0, 1}, {5, 7}, {40, 9}, {100, 16}, {283, 13}};
        const int32_t types[] = {NEEDLE_KV_F32, NEEDLE_KV_F16, NEEDLE_KV_INT8};
        const uint32_t slots = 300;
        for (size_t ti = 0; ti < 3; ti++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const uint32_t hd = shapes[si][0], vd = shapes[si][1];
                cache c = make_cache(types[ti], slots, 3 * (hd > vd ? hd : vd));
                for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                    const uint32_t nq = 1 + (uint32_t)(bi + si) % 3;
                    /* big: scores of hundreds, most weights underflow */
                    const float qmag = bi == 3 ? 60.0f : 1.0f;
                    check_block(kern, &c, hd, vd, nq, blocks[bi][0], blocks[bi][1],
                                (int)(bi + ti) % 2, qmag);
                }
                free_cache(&c);
            }
        cache c = make_cache(NEEDLE_KV_INT8, 40, 3 * 64);
        attn_kv kv = view(&c, 64);
        check_declined(kern, &kv, 0, ATTN_BLOCK_T + 1, 64, "a block of 17 tokens");
        check_declined(kern, &kv, ATTN_BLOCK_MAX_KEYS - 3, 4, 64, "more keys than a block holds");
        check_declined(kern, &kv, 0, 8, 12, "a head of 12 columns");
        kv = view(&c, 4);
        check_declined(kern, &kv, 0, 8, 64, "an int8 head at column 4");
        free_cache(&c);
        c = make_cache(NEEDLE_KV_F32, 40, 3 * 64);
        kv = view(&c, 6);
        check_declined(kern, &kv, 0, 8, 6, "a head of 6 columns");
        free_cache(&c);
    }
    if (!tested) harness_skip("no kernel level here has a prefill block kernel");
}

int main(void) {
    find_levels();
    RUN(test_every_level_every_shape);
    RUN(test_reads_only_its_head);
    RUN(test_v_width_differs);
    RUN(test_prefill_blocks);
    return test_summary();
}
