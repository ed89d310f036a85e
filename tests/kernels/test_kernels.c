/* CPU kernels against definitions written straight from the spec, in double precision:
 * the Walsh-Hadamard transform against the Sylvester matrix, fp16 conversion over all
 * 65536 values, and CQ products/dequantization for every bit width on odd shapes (padded
 * groups, several tokens with strides) against explicit dequantize-then-dot. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/cact.h"
#include "harness.h"
#include "kernels/cq.h"
#include "kernels/nmath.h"
#include "util/fp16.h"

static uint64_t rng_state = 0x1234567887654321ULL;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_float(void) { return (float)((int)(rnd() % 20001) - 10000) / 10000.0f; }

static int sylvester(uint32_t i, uint32_t j) { return __builtin_popcount(i & j) & 1 ? -1 : 1; }

static void test_fwht_matches_sylvester_matrix(void) {
    const uint32_t sizes[] = {1, 2, 16, 64, 128, 512};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint32_t n = sizes[s];
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        for (uint32_t i = 0; i < n; i++) x[i] = y[i] = rnd_float();
        fwht(y, n);
        double worst = 0;
        for (uint32_t i = 0; i < n; i++) {
            double acc = 0;
            for (uint32_t j = 0; j < n; j++) acc += sylvester(i, j) * (double)x[j];
            worst = fmax(worst, fabs(acc - y[i]));
        }
        CHECK_MSG(worst < 1e-4 * sqrt((double)n), "fwht n=%u error %g", n, worst);
        free(x);
        free(y);
    }
}

static void test_fp16_roundtrip_all_values(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (f32_to_fp16(f) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(fp16_to_f32(0x3C00) == 1.0f);
    CHECK(fp16_to_f32(0xC000) == -2.0f);
    CHECK(fp16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    CHECK(f32_to_fp16(65520.0f) == 0x7C00);           /* rounds to infinity */
    CHECK(f32_to_fp16(1.0f + ldexpf(1.0f, -11)) == 0x3C00); /* tie to even */
}

typedef struct test_matrix {
    cq_matrix w;
    uint8_t *codes;
    uint16_t *norms;
    float codebook[16];
} test_matrix;

/* Random CQ matrix; stores codes through the LSB-first stream definition of §1.6. */
static void make_matrix(test_matrix *tm, uint32_t rows, uint32_t cols, uint32_t group,
                        uint32_t bits) {
    cq_matrix *w = &tm->w;
    w->rows = rows;
    w->cols = cols;
    w->group = group;
    w->cols_pad = (cols + group - 1) / group * group;
    w->ngroups = w->cols_pad / group;
    w->bits = bits;
    w->row_bytes = (uint32_t)cact_cq_row_bytes(w->cols_pad, bits);
    tm->codes = calloc((size_t)rows * w->row_bytes, 1);
    tm->norms = malloc((size_t)rows * w->ngroups * sizeof *tm->norms);
    const uint32_t width = bits == 5 ? 2 : bits;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t k = 0; k < w->cols_pad; k++) {
            uint32_t code = rnd() % (1u << width);
            if (bits == 5 && code == 2) code = 3; /* crumb 2 is never written */
            uint64_t bit = (uint64_t)k * width;
            for (uint32_t b = 0; b < width; b++)
                if (code >> b & 1)
                    tm->codes[(size_t)r * w->row_bytes + (bit + b) / 8] |= (uint8_t)(1u << ((bit + b) % 8));
        }
    for (size_t i = 0; i < (size_t)rows * w->ngroups; i++)
        tm->norms[i] = f32_to_fp16(0.5f + (float)(rnd() % 1000) / 500.0f);
    for (int i = 0; i < 16; i++) tm->codebook[i] = rnd_float() / sqrtf((float)group);
    w->codes = tm->codes;
    w->norms = tm->norms;
    w->codebook = tm->codebook;
}

static uint32_t code_at(const test_matrix *tm, uint32_t r, uint32_t k) {
    const uint32_t width = tm->w.bits == 5 ? 2 : tm->w.bits;
    uint64_t bit = (uint64_t)k * width;
    uint32_t code = 0;
    for (uint32_t b = 0; b < width; b++)
        code |= (uint32_t)((tm->codes[(size_t)r * tm->w.row_bytes + (bit + b) / 8] >> ((bit + b) % 8)) & 1) << b;
    return code;
}

/* W[r][j] = (H_G (norm * c))[j], computed with the explicit matrix, in double. */
static void dense_row(const test_matrix *tm, uint32_t r, double *out) {
    const cq_matrix *w = &tm->w;
    const double scale = 1.0 / sqrt((double)w->group);
    for (uint32_t g = 0; g < w->ngroups; g++) {
        double norm = fp16_to_f32(tm->norms[(size_t)r * w->ngroups + g]);
        for (uint32_t j = 0; j < w->group; j++) {
            double acc = 0;
            for (uint32_t k = 0; k < w->group; k++)
                acc += sylvester(j, k) * norm * tm->codebook[code_at(tm, r, g * w->group + k)];
            uint32_t col = g * w->group + j;
            if (col < w->cols) out[col] = acc * scale;
        }
    }
}

static void check_shape(uint32_t rows, uint32_t cols, uint32_t group, uint32_t bits) {
    test_matrix tm;
    make_matrix(&tm, rows, cols, group, bits);
    const cq_matrix *w = &tm.w;
    const uint32_t ntok = 3, ld_x = w->cols_pad + 5, ld_y = rows + 3;
    float *x = malloc((size_t)ntok * cols * sizeof *x);
    float *xr = calloc((size_t)ntok * ld_x, sizeof *xr);
    float *y = calloc((size_t)ntok * ld_y, sizeof *y);
    double *dense = malloc(cols * sizeof *dense);
    float *row = malloc(cols * sizeof *row), *tmp = malloc(group * sizeof *tmp);
    for (uint32_t i = 0; i < ntok * cols; i++) x[i] = rnd_float();
    for (uint32_t t = 0; t < ntok; t++) cq_rotate(w, x + (size_t)t * cols, xr + (size_t)t * ld_x);
    /* a row range that does not start at 0 */
    const uint32_t row0 = rows > 2 ? 1 : 0, nrows = rows - row0;
    cq_matmul(w, row0, nrows, xr, ld_x, ntok, y, ld_y);
    double worst_dot = 0, worst_row = 0;
    for (uint32_t r = row0; r < rows; r++) {
        dense_row(&tm, r, dense);
        cq_dequant_row(w, r, row, tmp);
        double mag = 0;
        for (uint32_t c = 0; c < cols; c++) {
            worst_row = fmax(worst_row, fabs(row[c] - dense[c]));
            mag += fabs(dense[c]);
        }
        for (uint32_t t = 0; t < ntok; t++) {
            double ref = 0;
            for (uint32_t c = 0; c < cols; c++) ref += dense[c] * x[(size_t)t * cols + c];
            worst_dot = fmax(worst_dot, fabs(ref - y[(size_t)t * ld_y + (r - row0)]) / (mag + 1e-9));
        }
    }
    CHECK_MSG(worst_row < 1e-5, "dequant rows=%u cols=%u G=%u bits=%u: error %g", rows, cols,
              group, bits, worst_row);
    CHECK_MSG(worst_dot < 1e-5, "matmul rows=%u cols=%u G=%u bits=%u: error %g", rows, cols,
              group, bits, worst_dot);
    free(x); free(xr); free(y); free(dense); free(row); free(tmp);
    free(tm.codes); free(tm.norms);
}

static void test_cq_kernels_all_bit_widths(void) {
    const uint32_t bits[] = {1, 2, 3, 4, 5}; /* 1: Needle 3 binary */
    for (size_t b = 0; b < 5; b++) {
        check_shape(7, 200, 128, bits[b]);  /* padded last group */
        check_shape(5, 96, 128, bits[b]);   /* a single padded group */
        check_shape(3, 256, 64, bits[b]);   /* several exact groups */
        check_shape(9, 48, 16, bits[b]);    /* smallest group size */
        check_shape(1, 1, 16, bits[b]);     /* one column */
    }
}

/* The shared scalar math (kernels/nmath.h) against its definitions. */
static void test_nmath_properties(void) {
    /* Sinkhorn: columns exactly normalised (the last step), rows after 20 rounds close to
     * it for logits in the range the lane mix produces (|P| <= 2.2 here) */
    for (uint32_t n = 1; n <= 6; n++) {
        float P[36];
        for (uint32_t k = 0; k < n * n; k++) P[k] = 0.2f * ((float)((k * 7919u) % 23u) - 11.0f);
        nm_sinkhorn(P, n);
        for (uint32_t i = 0; i < n; i++) {
            float row = 0.0f, col = 0.0f;
            for (uint32_t j = 0; j < n; j++) {
                row += P[i * n + j];
                col += P[j * n + i];
                CHECK(P[i * n + j] >= 0.0f);
            }
            CHECK_MSG(fabsf(row - 1.0f) < 1e-3f && fabsf(col - 1.0f) < 1e-5f,
                      "n %u line %u: row sum %g, column sum %g", n, i, row, col);
        }
    }
    /* softmax numerators: the largest is exp(0) = 1, and they sum to the returned value */
    float x[5] = {3.0f, -1.0f, 7.5f, 7.5f, 0.0f}, sum = 0.0f;
    const float total = nm_softmax_exp(x, 5);
    for (int k = 0; k < 5; k++) sum += x[k];
    CHECK(x[2] == 1.0f && x[3] == 1.0f && fabsf(total - sum) < 1e-6f);
    /* rms_unit has mean square 1 (up to eps); ZC with zero offsets is the same */
    float v[8] = {1, -2, 3, -4, 5, -6, 7, -8}, u[8], z[8], zero[8] = {0};
    nm_rms_unit(v, 8, u);
    nm_zc_norm(v, zero, 8, z);
    CHECK(fabsf(nm_mean_square(u, 8) - 1.0f) < 1e-5f);
    for (int k = 0; k < 8; k++) CHECK(fabsf(u[k] - z[k]) < 1e-6f);
    /* RoPE is a rotation: norms kept, and by angle 0 the identity */
    const float c = cosf(0.7f), sn = sinf(0.7f);
    const nm_pair r = nm_rope_pair(3.0f, 4.0f, c, sn);
    CHECK(fabsf(r.a * r.a + r.b * r.b - 25.0f) < 1e-4f);
    const nm_pair id = nm_rope_pair(3.0f, 4.0f, 1.0f, 0.0f);
    CHECK(id.a == 3.0f && id.b == 4.0f);
    /* KV layout: sinks keep their slot, ring slots repeat every `window` positions, and
     * the span holds min(t + 1, sinks + window) positions, the newest being t */
    for (uint32_t sinks = 0; sinks < 4; sinks++)
        for (uint32_t window = 0; window < 6; window++)
            for (uint32_t t = 0; t < 40; t++) {
                const uint32_t slot = nm_kv_slot(t, sinks, window);
                if (t < sinks || !window) CHECK_EQ_INT(slot, t);
                else CHECK(slot >= sinks && slot < sinks + window &&
                           nm_kv_slot(t + window, sinks, window) == slot);
                const nm_span sp = nm_attention_span(t, sinks, window);
                const uint32_t n = sp.n_sink + (sp.tail0 <= t ? t + 1 - sp.tail0 : 0);
                const uint32_t want = !window || t + 1 < sinks + window ? t + 1 : sinks + window;
                CHECK_MSG(n == want, "sinks %u window %u t %u: %u positions", sinks, window, t, n);
            }
    /* lane offsets and the engram hash follow the spec's constants */
    CHECK(nm_lane_pre_offset(2, 2) == NM_LANE_PRE_OWN);
    CHECK(nm_lane_pre_offset(1, 2) == NM_LANE_PRE_OTHER);
    CHECK(nm_lane_post_offset(0, 0) == NM_LANE_POST_OWN);
    CHECK(nm_lane_post_offset(3, 0) == NM_LANE_POST_OTHER);
    uint32_t acc = nm_engram_hash_step(nm_engram_hash_start(2), 77u);
    CHECK_EQ_INT(acc, (NM_ENGRAM_SEED * 3u ^ 77u) * NM_ENGRAM_PRIME);
    CHECK(nm_engram_hash_slot(acc, 1000u) == ((acc ^ (acc >> NM_ENGRAM_SHIFT)) % 1000u));
}

int main(void) {
    RUN(test_fwht_matches_sylvester_matrix);
    RUN(test_nmath_properties);
    RUN(test_fp16_roundtrip_all_values);
    RUN(test_cq_kernels_all_bit_widths);
    return test_summary();
}
