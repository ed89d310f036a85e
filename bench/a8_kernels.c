/* One CQ product over random weights at every kernel level: the float avx2 and avx512 levels and
 * the W·A8 scalar, avx2 and avx512 levels (src/kernels/cpu/a8.h). Prints µs per call
 * (median of 7 rounds) and weights per second. Speed only: test_a8 checks the results.
 *
 *   bench_a8_kernels ROWS COLS BITS [NTOK]     (group 128; BITS 2, 4 or 5 = ternary)
 *
 * e.g. `768 768 2` (a Needle 3 attention projection), `8192 768 4` (Needle 3 logits). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/a8.h"
#include "kernels/cpu/cpu.h"
#include "util/fp16.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint32_t rng = 12345u;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s ROWS COLS BITS [NTOK]\n", argv[0]);
        return 2;
    }
    const long rows_l = strtol(argv[1], NULL, 10), cols_l = strtol(argv[2], NULL, 10);
    const long bits_l = strtol(argv[3], NULL, 10), ntok_l = argc > 4 ? strtol(argv[4], NULL, 10) : 1;
    const uint32_t G = 128;
    if (rows_l < 1 || rows_l > 1 << 20 || cols_l < 1 || cols_l > (long)A8_MAX_COLS ||
        !(bits_l == 2 || bits_l == 3 || bits_l == 4 || bits_l == 5) || ntok_l < 1 || ntok_l > 256) {
        fprintf(stderr, "%s: ROWS 1..1048576, COLS 1..%u, BITS 2-5, NTOK 1..256\n", argv[0],
                A8_MAX_COLS);
        return 2;
    }
    const uint32_t rows = (uint32_t)rows_l, cols = (uint32_t)cols_l, bits = (uint32_t)bits_l,
                   ntok = (uint32_t)ntok_l;
    cq_matrix w = {0};
    w.rows = rows;
    w.cols = cols;
    w.group = G;
    w.cols_pad = (cols + G - 1) / G * G;
    w.ngroups = w.cols_pad / G;
    w.bits = bits;
    w.row_bytes = w.cols_pad * (bits == 5 ? 2 : bits) / 8;
    uint8_t *codes = malloc((size_t)rows * w.row_bytes + 64);
    uint16_t *norms = malloc((size_t)rows * w.ngroups * sizeof *norms);
    const size_t ld = w.cols_pad + 16;
    float *x = malloc(ntok * ld * sizeof *x);
    float *a8_rows = malloc(ntok * ld * sizeof *a8_rows);
    float *xr = malloc(ntok * ld * sizeof *xr);
    float *y = malloc((size_t)rows * ntok * sizeof *y);
    const size_t cap = cq_scratch_floats(w.cols_pad, ntok);
    float *sbuf = malloc((cap + 16) * sizeof *sbuf);
    if (!codes || !norms || !x || !a8_rows || !xr || !y || !sbuf) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        return 1;
    }
    for (size_t i = 0; i < (size_t)rows * w.row_bytes; i++) codes[i] = (uint8_t)rnd();
    if (bits == 5) /* ternary: field value 2 is never written */
        for (size_t i = 0; i < (size_t)rows * w.row_bytes; i++)
            for (int k = 0; k < 8; k += 2)
                if (((codes[i] >> k) & 3u) == 2u) codes[i] ^= (uint8_t)(1u << k);
    for (size_t i = 0; i < (size_t)rows * w.ngroups; i++)
        norms[i] = f32_to_fp16(0.5f + (float)(rnd() % 100) / 100.0f);
    float cb[16];
    for (int i = 0; i < 16; i++) cb[i] = ((float)(rnd() % 2001) - 1000.0f) / 1000.0f / sqrtf((float)G);
    w.codes = codes;
    w.norms = norms;
    w.codebook = cb;
    for (size_t i = 0; i < ntok * ld; i++) x[i] = ((float)(rnd() % 2001) - 1000.0f) / 500.0f;
    /* 32-byte aligned scratch, as cq_scratch asks */
    float *sal = (float *)(void *)(((uintptr_t)sbuf + 31) & ~(uintptr_t)31);
    cq_scratch sc = {.buf = sal, .cap = cap};
    const char *names[] = {"float avx2", "float avx512", "A8 scalar", "A8 avx2", "A8 avx512"};
    for (int k = -1; k < 4; k++) {
        /* k < 1: the float levels (k -1: avx2, 0: avx512); k >= 1: the W·A8 levels */
        const cpu_kernels *fk = k == -1 ? cpu_kernels_avx2() : k == 0 ? cpu_kernels_avx512() : NULL;
        const a8_kernels *ak = k == 1 ? &a8_kernels_scalar : k == 2 ? a8_kernels_named("avx2")
                             : k == 3 ? a8_kernels_named("avx512") : NULL;
        if (k < 1 && !fk) continue;
        if (k > 0 && !ak) continue;
        for (uint32_t t = 0; t < ntok; t++) {
            if (k < 1) fk->rotate(&w, x + t * ld, xr + t * ld);
            else ak->rotate(&w, x + t * ld, a8_rows + t * ld);
        }
        double ts[7];
        const int reps = k == 1 ? 1 : 10;
        for (int r = 0; r < 7; r++) {
            const double t0 = now_s();
            for (int i = 0; i < reps; i++) {
                if (k < 1) {
                    sc.valid = 0; /* as a session does for new activations */
                    fk->matmul(&w, 0, rows, xr, ld, ntok, y, rows, &sc);
                } else {
                    ak->matmul(&w, 0, rows, a8_rows, ld, ntok, y, rows);
                }
            }
            ts[r] = (now_s() - t0) / reps;
        }
        qsort(ts, 7, sizeof ts[0], cmp_double);
        printf("%-13s %ux%u bits %u ntok %u: %9.1f us  %6.2f Gweight/s  (%s)\n", names[k + 1], rows,
               cols, bits, ntok, ts[3] * 1e6, (double)rows * cols * ntok / ts[3] / 1e9,
               k < 1 ? fk->name : ak->name);
    }
    free(codes);
    free(norms);
    free(x);
    free(a8_rows);
    free(xr);
    free(y);
    free(sbuf);
    return 0;
}
