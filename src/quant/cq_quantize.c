/* CQ quantize / dequantize with the official exporter's rounding (see cq_quantize.h).
 * H_G = S_G / sqrt(G) in float32, where 1/sqrt(G) is computed in double and rounded once,
 * as numpy does for `H / np.sqrt(G)` (the float64 scalar promotes the division). */
#include "quant/cq_quantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/exact_fma.h"
#include "util/error.h"
#include "util/fp16.h"

#define CQ_MAX_GROUP 1024u

static float hadamard_scale(uint32_t group) { return (float)(1.0 / sqrt((double)group)); }

/* hm[k*G + j] = H[k][j] = +-h (Sylvester sign: parity of popcount(k & j)) */
static float *hadamard_matrix(uint32_t group) {
    float *hm = malloc((size_t)group * group * sizeof *hm);
    if (!hm) return NULL;
    const float h = hadamard_scale(group);
    for (uint32_t k = 0; k < group; k++)
        for (uint32_t j = 0; j < group; j++) hm[k * group + j] = (__builtin_popcount(k & j) & 1) ? -h : h;
    return hm;
}

/* out[j] = sum_k in[k] * H[k][j] in the order of the BLAS kernel the exporter reaches.
 * The loops run over j innermost so they vectorize; exact_fmaf keeps each step fused, which
 * is what makes the result exact (an FMA-capable clone is picked at run time on x86). */
/* Not under the sanitizers: the clone's ifunc resolver runs while the program is being
 * relocated, before the sanitizer runtime is up (under ThreadSanitizer it crashed every
 * program linking the exporter at start-up). */
/* ELF only: the clones are chosen by an ifunc, which PE (Windows) does not have. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
static void
rotate_group(const float *in, float *out, uint32_t group, const float *hm, int single) {
    for (uint32_t j = 0; j < group; j++) out[j] = 0.0f;
    if (single) {
        float t[CQ_MAX_GROUP];
        for (uint32_t k0 = 0; k0 < group; k0 += 8) {
            for (uint32_t j = 0; j < group; j++) t[j] = 0.0f;
            for (uint32_t k = k0; k < k0 + 8; k++)
                for (uint32_t j = 0; j < group; j++) t[j] = exact_fmaf(in[k], hm[k * group + j], t[j]);
            for (uint32_t j = 0; j < group; j++) out[j] = out[j] + t[j];
        }
    } else {
        for (uint32_t k = 0; k < group; k++)
            for (uint32_t j = 0; j < group; j++) out[j] = exact_fmaf(in[k], hm[k * group + j], out[j]);
    }
}

/* numpy float32 pairwise sum (8 accumulators for n <= 128, halves above) */
static float pairwise_sum_f32(const float *a, uint32_t n) {
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
    return pairwise_sum_f32(a, n2) + pairwise_sum_f32(a + n2, n - n2);
}

/* nearest level, ties to the lower index: searchsorted left, clamped to [1, n-1] */
static uint32_t nearest(const float *cb, uint32_t n, float u) {
    uint32_t pos = 0;
    while (pos < n && cb[pos] < u) pos++;
    if (pos < 1) pos = 1;
    if (pos > n - 1) pos = n - 1;
    return fabsf(u - cb[pos - 1]) <= fabsf(u - cb[pos]) ? pos - 1 : pos;
}

static uint64_t row_bytes(uint64_t cols_pad, uint32_t bits) {
    return bits == CQ_TERNARY ? cols_pad / 4 : cols_pad * bits / 8;
}

uint64_t cq_blob_bytes(uint64_t rows, uint64_t cols, uint32_t bits, uint32_t group) {
    if (!group || !cq_levels(bits) || cols > UINT32_MAX || rows > UINT32_MAX) return 0;
    const uint64_t pad = (cols + group - 1) / group * group;
    const uint64_t per_row = row_bytes(pad, bits) + 2 * (pad / group);
    if (per_row && rows > UINT64_MAX / per_row) return 0;
    return rows * per_row;
}

/* packs index k of a row at stream bits [k*w, (k+1)*w), LSB first */
static void put_code(uint8_t *row, uint64_t k, uint32_t width, uint32_t code) {
    const uint64_t bit = k * width;
    const uint32_t v = code << (bit % 8);
    row[bit / 8] |= (uint8_t)v;
    if ((bit % 8) + width > 8) row[bit / 8 + 1] |= (uint8_t)(v >> 8);
}

static uint32_t get_code(const uint8_t *row, uint64_t k, uint32_t width) {
    const uint64_t bit = k * width;
    uint32_t v = row[bit / 8] >> (bit % 8);
    if ((bit % 8) + width > 8) v |= (uint32_t)row[bit / 8 + 1] << (8 - bit % 8);
    return v & ((1u << width) - 1);
}

int cq_quantize_matrix(const cq_codebooks *cb, const float *w, uint32_t rows, uint32_t cols, uint32_t bits,
                       uint8_t *blob, double *sq_err, double *sq_ref) {
    const uint32_t G = cb->group, n = cq_levels(bits);
    if (!n || !G || G > CQ_MAX_GROUP || (G & (G - 1)) || G % 8)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "CQ width %u / group %u not supported", bits, G);
    const uint64_t pad = ((uint64_t)cols + G - 1) / G * G, ngroups = pad / G;
    const uint64_t rb = row_bytes(pad, bits);
    const uint32_t width = bits == CQ_TERNARY ? 2 : bits;
    const float *levels = cb->levels[bits];
    float *hm = hadamard_matrix(G);
    if (!hm) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    float g[CQ_MAX_GROUP], rot[CQ_MAX_GROUP], sq[CQ_MAX_GROUP], deq[CQ_MAX_GROUP];
    uint32_t idx[CQ_MAX_GROUP];
    double err = 0.0, ref = 0.0;
    memset(blob, 0, (size_t)cq_blob_bytes(rows, cols, bits, G));
    uint8_t *norms = blob + rows * rb;
    for (uint32_t r = 0; r < rows; r++) {
        uint8_t *row = blob + r * rb;
        for (uint64_t gi = 0; gi < ngroups; gi++) {
            for (uint32_t k = 0; k < G; k++) {
                const uint64_t c = gi * G + k;
                g[k] = c < cols ? w[(uint64_t)r * cols + c] : 0.0f;
                if (!isfinite(g[k])) {
                    free(hm);
                    return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                                       "value %g at row %u column %llu is not finite", (double)g[k], r,
                                       (unsigned long long)c);
                }
            }
            rotate_group(g, rot, G, hm, ngroups == 1);
            for (uint32_t k = 0; k < G; k++) sq[k] = rot[k] * rot[k];
            const float norm = sqrtf(pairwise_sum_f32(sq, G));
            if (!isfinite(norm) || norm > 65504.0f) {
                free(hm);
                return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                                   "row %u group %llu has norm %g, beyond f16 (the weights are too large)", r,
                                   (unsigned long long)gi, (double)norm);
            }
            const float denom = norm > 1e-12f ? norm : 1e-12f;
            for (uint32_t k = 0; k < G; k++) {
                idx[k] = nearest(levels, n, rot[k] / denom);
                /* ternary trits 0, 1, 2 are stored as crumbs 3, 0, 1 (sign-extended -1, 0, +1) */
                const uint32_t code = bits == CQ_TERNARY ? (idx[k] == 0 ? 3u : idx[k] - 1) : idx[k];
                put_code(row, gi * G + k, width, code);
            }
            const uint16_t nh = f32_to_fp16(norm);
            norms[((uint64_t)r * ngroups + gi) * 2] = (uint8_t)(nh & 0xff);
            norms[((uint64_t)r * ngroups + gi) * 2 + 1] = (uint8_t)(nh >> 8);
            if (sq_err || sq_ref) {
                const float nf = fp16_to_f32(nh);
                float scaled[CQ_MAX_GROUP];
                for (uint32_t k = 0; k < G; k++) scaled[k] = levels[idx[k]] * nf;
                rotate_group(scaled, deq, G, hm, ngroups == 1);
                for (uint32_t k = 0; k < G && gi * G + k < cols; k++) {
                    const double d = (double)deq[k] - g[k];
                    err += d * d;
                    ref += (double)g[k] * g[k];
                }
            }
        }
    }
    free(hm);
    if (sq_err) *sq_err = err;
    if (sq_ref) *sq_ref = ref;
    return 0;
}

int cq_dequantize_matrix(const cq_codebooks *cb, const uint8_t *blob, uint32_t rows, uint32_t cols,
                         uint32_t bits, float *w) {
    const uint32_t G = cb->group;
    const uint64_t pad = ((uint64_t)cols + G - 1) / G * G, ngroups = pad / G;
    const uint64_t rb = row_bytes(pad, bits);
    const uint32_t width = bits == CQ_TERNARY ? 2 : bits;
    /* bits 1: Needle 3 binary records, decoded only (levels [1] set by the caller) */
    const uint32_t n_levels = bits == 1 ? 2u : cq_levels(bits);
    const float *levels = cb->levels[bits];
    float *hm = hadamard_matrix(G);
    if (!hm) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    const uint8_t *norms = blob + (uint64_t)rows * rb;
    float scaled[CQ_MAX_GROUP], deq[CQ_MAX_GROUP];
    for (uint32_t r = 0; r < rows; r++) {
        const uint8_t *row = blob + r * rb;
        for (uint64_t gi = 0; gi < ngroups; gi++) {
            const uint8_t *np = norms + ((uint64_t)r * ngroups + gi) * 2;
            const float nf = fp16_to_f32((uint16_t)(np[0] | (np[1] << 8)));
            for (uint32_t k = 0; k < G; k++) {
                uint32_t code = get_code(row, gi * G + k, width);
                if (bits == CQ_TERNARY) code = code == 3 ? 0 : code + 1;
                scaled[k] = levels[code < n_levels ? code : 0] * nf;
            }
            rotate_group(scaled, deq, G, hm, ngroups == 1);
            for (uint32_t k = 0; k < G && gi * G + k < cols; k++) w[(uint64_t)r * cols + gi * G + k] = deq[k];
        }
    }
    free(hm);
    return 0;
}
