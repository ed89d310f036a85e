/* W·A8 kernels and mode (src/kernels/cpu/a8.h): quantization exactly as spec §5.3, the
 * integer Walsh-Hadamard rows, the parity-plane products against a direct double-precision
 * sum, every kernel level bit-identical to the portable one (every bit width, odd shapes,
 * padded groups, several tokens), bit-identical logits across thread counts, the session
 * option, NEEDLE_A8 and their errors. Parity with the QAT reference: test_a8_parity.c. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kernels/cpu/a8.h"
#include "needle.h"
#include "util/fp16.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rnd_f(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; }

static void test_quantize_rule(void) {
    /* absmax 127 -> s = 1: x/s are the values themselves; ties go to even */
    const float x[] = {127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.49f, -127.0f, 0.0f};
    const int16_t want[] = {127, 2, 4, -2, 0, 0, 1, -127, 0, 0, 0};
    int16_t q[64];
    float s = a8_quantize(x, 9, 11, q);
    CHECK(s == 1.0f);
    for (int i = 0; i < 11; i++) CHECK_MSG(q[i] == want[i], "q[%d] = %d, want %d", i, q[i], want[i]);
    /* a zero row: s = 1, all zero */
    const float zero[4] = {0};
    CHECK(a8_quantize(zero, 4, 4, q) == 1.0f);
    CHECK(q[0] == 0 && q[3] == 0);
    /* a NaN (only corrupt weights make one) quantizes to 0, the rest as usual */
    const float bad[3] = {NAN, 127.0f, -3.0f};
    a8_quantize(bad, 3, 3, q);
    CHECK(q[0] == 0 && q[1] == 127 && q[2] == -3);
    /* s = absmax / 127 in f32 and x / s, not x * (1 / s) */
    float y[64];
    for (int i = 0; i < 64; i++) y[i] = rnd_f() * 3.0f;
    s = a8_quantize(y, 64, 64, q);
    float amax = 0;
    for (int i = 0; i < 64; i++) amax = fmaxf(amax, fabsf(y[i]));
    CHECK(s == amax / 127.0f);
    for (int i = 0; i < 64; i++) CHECK(q[i] == (int16_t)nearbyintf(y[i] / s));
}

/* A random CQ matrix; codebook kinds: 0 symmetric, 1 arbitrary, 2 ternary {0, c, 0, -c}. */
typedef struct test_matrix {
    cq_matrix w;
    uint8_t *codes;
    uint16_t *norms;
    float cb[16];
} test_matrix;

static void make_matrix(test_matrix *t, uint32_t rows, uint32_t cols, uint32_t group,
                        uint32_t bits, int book) {
    memset(t, 0, sizeof *t);
    cq_matrix *w = &t->w;
    w->rows = rows;
    w->cols = cols;
    w->group = group;
    w->cols_pad = (cols + group - 1) / group * group;
    w->ngroups = w->cols_pad / group;
    w->bits = bits;
    const uint32_t code_bits = bits == 5 ? 2 : bits;
    w->row_bytes = w->cols_pad * code_bits / 8;
    t->codes = malloc((size_t)rows * w->row_bytes + 1);
    t->norms = malloc((size_t)rows * w->ngroups * sizeof *t->norms + 2);
    for (size_t i = 0; i < (size_t)rows * w->row_bytes; i++) t->codes[i] = (uint8_t)rnd();
    for (size_t i = 0; i < (size_t)rows * w->ngroups; i++)
        t->norms[i] = f32_to_fp16(0.2f + (float)(rnd() % 1000) / 500.0f);
    const uint32_t levels = 1u << code_bits;
    if (bits == 5) book = 2;
    for (uint32_t c = 0; c < 16; c++) t->cb[c] = 0.0f;
    if (book == 2) {
        t->cb[1] = 1.2240064f / sqrtf((float)group);
        t->cb[3] = -t->cb[1];
    } else {
        for (uint32_t c = 0; c < levels; c++) t->cb[c] = rnd_f() / sqrtf((float)group);
        if (book == 0)
            for (uint32_t c = 0; c < levels / 2; c++) {
                /* ascending, cb[~c] = -cb[c] */
                t->cb[levels / 2 + c] = 0.1f + 0.3f * (float)c;
                t->cb[levels / 2 - 1 - c] = -t->cb[levels / 2 + c];
            }
    }
    w->codes = t->codes;
    w->norms = t->norms;
    w->codebook = t->cb;
}

static void free_matrix(test_matrix *t) {
    free(t->codes);
    free(t->norms);
}

static uint32_t code_of(const cq_matrix *w, uint32_t r, uint32_t k) {
    const uint8_t *row = w->codes + (size_t)r * w->row_bytes;
    if (w->bits == 1) return (row[k / 8] >> (k % 8)) & 1u;
    if (w->bits == 2 || w->bits == 5) return (row[k / 4] >> (2 * (k % 4))) & 3u;
    if (w->bits == 4) return (row[k / 2] >> (4 * (k % 2))) & 15u;
    const uint32_t bit = 3 * k;
    uint32_t v = row[bit / 8] | ((uint32_t)(bit / 8 + 1 < w->row_bytes ? row[bit / 8 + 1] : 0) << 8);
    return (v >> (bit % 8)) & 7u;
}

/* y[t][r] by the definition: s/sqrt(G) sum_g norm_g sum_k cb[code] (H q)_k, in double. */
static void direct(const cq_matrix *w, const float *x, size_t ld_x, uint32_t ntok, double *y,
                   double *mag) {
    int16_t q[4096];
    double z[A8_MAX_GROUP];
    const uint32_t G = w->group;
    for (uint32_t t = 0; t < ntok; t++) {
        const float s = a8_quantize(x + t * ld_x, w->cols, w->cols_pad, q);
        for (uint32_t r = 0; r < w->rows; r++) {
            double acc = 0, m = 0;
            for (uint32_t g = 0; g < w->ngroups; g++) {
                for (uint32_t k = 0; k < G; k++) {
                    double v = 0;
                    for (uint32_t j = 0; j < G; j++)
                        v += (__builtin_popcount(k & j) & 1 ? -1.0 : 1.0) * q[g * G + j];
                    z[k] = v;
                }
                const double norm = fp16_to_f32(w->norms[(size_t)r * w->ngroups + g]);
                for (uint32_t k = 0; k < G; k++) {
                    const double term = norm * w->codebook[code_of(w, r, g * G + k)] * z[k];
                    acc += term;
                    m += fabs(term);
                }
            }
            y[(size_t)t * w->rows + r] = acc * s / sqrt((double)G);
            mag[(size_t)t * w->rows + r] = m * s / sqrt((double)G);
        }
    }
}

/* Runs level k over ntok tokens of x: rotate each into its row, then the product. */
static void run_level(const a8_kernels *k, const cq_matrix *w, const float *x, size_t ld_x,
                      uint32_t ntok, float *rows, float *y) {
    const size_t ld = w->cols_pad + 8; /* an ld larger than cols_pad, as a session's may be */
    for (uint32_t t = 0; t < ntok; t++) k->rotate(w, x + t * ld_x, rows + t * ld);
    k->matmul(w, 0, w->rows, rows, ld, ntok, y, w->rows);
}

static void check_shape(uint32_t rows, uint32_t cols, uint32_t group, uint32_t bits, int book,
                        uint32_t ntok) {
    test_matrix t;
    make_matrix(&t, rows, cols, group, bits, book);
    const cq_matrix *w = &t.w;
    CHECK(a8_supported(w));
    const size_t ld_x = cols + 3;
    float *x = malloc(ntok * ld_x * sizeof *x);
    for (size_t i = 0; i < ntok * ld_x; i++) x[i] = rnd_f() * (1.0f + (float)(i % 7));
    float *rows_buf = malloc(ntok * (w->cols_pad + 8) * sizeof(float));
    float *ys = malloc((size_t)ntok * rows * sizeof *ys), *yk = malloc((size_t)ntok * rows * sizeof *yk);
    double *yd = malloc((size_t)ntok * rows * sizeof *yd), *mag = malloc((size_t)ntok * rows * sizeof *mag);
    run_level(&a8_kernels_scalar, w, x, ld_x, ntok, rows_buf, ys);
    direct(w, x, ld_x, ntok, yd, mag);
    double worst = 0;
    for (size_t i = 0; i < (size_t)ntok * rows; i++) {
        const double rel = fabs(ys[i] - yd[i]) / (mag[i] + 1e-30);
        if (!(rel <= worst)) worst = rel;
    }
    CHECK_MSG(worst < 1e-6, "bits %u book %d %ux%u G%u ntok %u: scalar vs direct %.3g", bits,
              book, rows, cols, group, ntok, worst);
    const char *levels[] = {"avx2", "avx512", "neon"};
    for (int l = 0; l < 3; l++) {
        const a8_kernels *k = a8_kernels_named(levels[l]);
        if (!k) continue;
        run_level(k, w, x, ld_x, ntok, rows_buf, yk);
        CHECK_MSG(!memcmp(ys, yk, (size_t)ntok * rows * sizeof *ys),
                  "%s: bits %u book %d %ux%u G%u ntok %u differs from scalar", k->name, bits,
                  book, rows, cols, group, ntok);
        /* a row range computes the same rows */
        if (rows > 3) {
            k->matmul(w, 2, rows - 3, rows_buf, w->cols_pad + 8, ntok, yk, rows);
            int same = 1;
            for (uint32_t tt = 0; tt < ntok; tt++)
                for (uint32_t r = 0; r < rows - 3; r++)
                    same &= yk[(size_t)tt * rows + r] == ys[(size_t)tt * rows + r + 2];
            CHECK_MSG(same, "%s: a row range differs", k->name);
        }
    }
    free(x);
    free(rows_buf);
    free(ys);
    free(yk);
    free(yd);
    free(mag);
    free_matrix(&t);
}

static void test_kernels_every_width(void) {
    const uint32_t bits[] = {1, 2, 3, 4, 5}; /* 1: Needle 3 binary */
    for (int b = 0; b < 5; b++)
        for (int book = 0; book < 2; book++) {
            check_shape(7, 96, 128, bits[b], book, 1);    /* one padded group */
            check_shape(13, 300, 128, bits[b], book, 3);  /* padded last group, odd rows */
            check_shape(5, 256, 128, bits[b], book, 5);   /* whole groups, several tokens */
            check_shape(9, 40, 32, bits[b], book, 2);     /* smaller groups */
            check_shape(3, 32, 32, bits[b], book, 1);     /* the smallest group a row fits */
            check_shape(11, 190, 64, bits[b], book, 9);   /* two 32-column blocks a group */
            check_shape(6, 48, 16, bits[b], book, 2);     /* a group below the VNNI block */
        }
}

static void test_planes(void) {
    test_matrix t;
    a8_planes P;
    /* symmetric 2-bit: planes b0 and b1 only; ternary: b1 and b0^b1 */
    make_matrix(&t, 1, 128, 128, 2, 0);
    a8_planes_of(&t.w, &P);
    CHECK_EQ_INT((int)P.n, 2);
    CHECK(P.sel[0] == 1 && P.sel[1] == 2);
    free_matrix(&t);
    make_matrix(&t, 1, 128, 128, 5, 2);
    a8_planes_of(&t.w, &P);
    CHECK_EQ_INT((int)P.n, 2);
    CHECK(P.sel[0] == 2 && P.sel[1] == 3 && P.cb0 == 0.0f);
    free_matrix(&t);
    /* symmetric 3- and 4-bit: the odd parities, 4 and 8 planes */
    make_matrix(&t, 1, 128, 128, 3, 0);
    a8_planes_of(&t.w, &P);
    CHECK_EQ_INT((int)P.n, 4);
    free_matrix(&t);
    make_matrix(&t, 1, 128, 128, 4, 0);
    a8_planes_of(&t.w, &P);
    CHECK_EQ_INT((int)P.n, 8);
    free_matrix(&t);
}

static void test_rotate_rows(void) {
    test_matrix t;
    make_matrix(&t, 1, 200, 128, 2, 0);
    float x[256], row[256];
    for (int i = 0; i < 200; i++) x[i] = rnd_f();
    a8_rotate_natural(&t.w, x, row);
    int16_t q[256];
    const float s = a8_quantize(x, 200, 256, q);
    CHECK(a8_row_scale(row) == s);
    const int16_t *z = (const int16_t *)(const void *)(row + a8_row_z_offset(256, 128));
    for (uint32_t g = 0; g < 2; g++) {
        int32_t sum = 0;
        for (uint32_t k = 0; k < 128; k++) {
            int32_t v = 0;
            for (uint32_t j = 0; j < 128; j++)
                v += (__builtin_popcount(k & j) & 1 ? -1 : 1) * q[g * 128 + j];
            CHECK(z[g * 128 + k] == v);
            sum += v;
        }
        CHECK(a8_row_sums_c(row)[g] == sum);
    }
    /* in place: x and the row share memory */
    memcpy(row, x, 200 * sizeof *x);
    float row2[256];
    a8_rotate_natural(&t.w, x, row2);
    a8_rotate_natural(&t.w, row, row);
    CHECK(!memcmp(row, row2, a8_row_floats(256, 128) * sizeof(float)));
    /* a group over 128 or an input too wide for its row is refused */
    t.w.group = 256;
    t.w.ngroups = 1;
    CHECK(!a8_supported(&t.w));
    free_matrix(&t);
}

/* Logits of the whole sequence with `threads` threads under A8. */
static float *a8_logits(const char *model, int threads, const int32_t *tok, size_t n,
                        uint32_t *vocab) {
    needle_model_params mp = needle_model_default_params();
    mp.n_threads = threads;
    needle_model *m;
    if (needle_model_open(fixture_path(model), &mp, &m) != NEEDLE_OK) return NULL;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    *vocab = info.vocab;
    needle_session_params sp = needle_session_default_params();
    sp.activations = NEEDLE_ACT_A8;
    needle_session *s;
    float *out = malloc(n * info.vocab * sizeof *out);
    int rc = needle_session_create(m, &sp, &s);
    if (rc == NEEDLE_OK) {
        rc = needle_session_eval(s, tok, n, out, n * info.vocab);
        needle_session_free(s);
    }
    needle_model_free(m);
    if (rc != NEEDLE_OK) {
        free(out);
        return NULL;
    }
    return out;
}

static void test_threads_bit_identical(void) {
    const char *models[] = {"tiny_cq2.cact", "tinyb_mixed.cact", "tiny_ternary.cact"};
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = i ? (int32_t)(4 + rnd() % 500) : 2;
    for (int k = 0; k < 3; k++) {
        uint32_t V = 0;
        float *one = a8_logits(models[k], 1, tok, 40, &V);
        CHECK_MSG(one != NULL, "%s: %s", models[k], needle_last_error());
        for (int th = 2; th <= 3 && one; th++) {
            float *many = a8_logits(models[k], th, tok, 40, &V);
            CHECK(many != NULL);
            if (many)
                CHECK_MSG(!memcmp(one, many, 40 * (size_t)V * sizeof *one),
                          "%s: %d threads differ from 1", models[k], th);
            free(many);
        }
        free(one);
    }
}

static void test_option_and_env(void) {
    needle_model *m;
    CHECK_EQ_INT(needle_model_open(fixture_path("tiny_cq2.cact"), NULL, &m), NEEDLE_OK);
    needle_session_params sp = needle_session_default_params();
    CHECK_EQ_INT(sp.activations, NEEDLE_ACT_DEFAULT);
    needle_session *s;
    sp.activations = 7;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(strstr(needle_last_error(), "activations") != NULL);
    /* a caller built before the field existed gets the default */
    sp.size = offsetof(needle_session_params, activations);
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    needle_session_free(s);
    sp.size = sizeof sp;
    /* NEEDLE_A8 picks the default; A8 and F32 differ, F32 ignores the variable */
    const int32_t tok[] = {2, 40, 41, 300, 7, 99};
    float a[6 * 512], b[6 * 512], c[6 * 512];
    sp.activations = NEEDLE_ACT_A8;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_eval(s, tok, 6, a, 6 * 512), NEEDLE_OK);
    needle_session_free(s);
    setenv("NEEDLE_A8", "1", 1);
    sp.activations = NEEDLE_ACT_DEFAULT;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_eval(s, tok, 6, b, 6 * 512), NEEDLE_OK);
    needle_session_free(s);
    CHECK(!memcmp(a, b, sizeof a));
    sp.activations = NEEDLE_ACT_F32;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_eval(s, tok, 6, c, 6 * 512), NEEDLE_OK);
    needle_session_free(s);
    CHECK(memcmp(a, c, sizeof a) != 0);
    /* the CLI's --a8 is the same mode */
    char path[] = "/tmp/needle_a8_XXXXXX", cmd[1024];
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        close(fd);
        snprintf(cmd, sizeof cmd, "%s logits --a8 --weights %s --tokens 2,40,41,300,7,99 --out %s "
                 ">/dev/null 2>&1", cli_path(), fixture_path("tiny_cq2.cact"), path);
        CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
        size_t size = 0;
        uint8_t *file = read_file(path, &size);
        CHECK(file && size == sizeof a && !memcmp(file, a, sizeof a));
        free(file);
        unlink(path);
    }
    setenv("NEEDLE_A8", "yes", 1);
    sp.activations = NEEDLE_ACT_DEFAULT;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(strstr(needle_last_error(), "NEEDLE_A8") != NULL);
    setenv("NEEDLE_A8", "0", 1);
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_eval(s, tok, 6, b, 6 * 512), NEEDLE_OK);
    needle_session_free(s);
    CHECK(!memcmp(b, c, sizeof b));
    unsetenv("NEEDLE_A8");
    needle_model_free(m);
}

int main(void) {
    RUN(test_quantize_rule);
    RUN(test_planes);
    RUN(test_rotate_rows);
    RUN(test_kernels_every_width);
    RUN(test_threads_bit_identical);
    RUN(test_option_and_env);
    return test_summary();
}
