/* The training core's products (src/train/tgemm.h) at every SIMD level this machine (or
 * emulator) has, against the portable fmaf loop: bit-identical by construction (one
 * fused multiply-add chain per element in k order), checked on odd shapes with row
 * strides wider than the rows, both store and accumulate, every split among 1..5
 * threads, and the blocked transpose. The batched CQ fake quantization (train/cq_ste.h)
 * against the quantizer's own quantize + dequantize, bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"
#include "quant/cq_quantize.h"
#include "train/cq_ste.h"
#include "train/tgemm.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* shapes: tails of every vector width (1..33 columns), row tails of the 6-row tiles, the
 * 96-row cache block and the 48 x 128 work items crossed, K of 1 and long chains, K across
 * the 256-row packed chunks of B (tgemm_x86.c: parked accumulators) */
static const uint32_t SHAPES[][3] = {{1, 1, 1},   {5, 7, 3},    {6, 16, 9},   {7, 17, 31},
                                     {13, 33, 64}, {97, 40, 5}, {100, 47, 37}, {2, 130, 33}, {13, 8, 768},
                                     {100, 260, 17}, {13, 40, 600}, {100, 47, 513}, {7, 33, 256}};

static void check_level(const tg_level *lv) {
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
        const uint32_t M = SHAPES[s][0], N = SHAPES[s][1], K = SHAPES[s][2];
        const size_t lda = K + 3, ldb = N + 5, ldc = N + 2;
        float *A = malloc(M * lda * sizeof *A), *B = malloc(K * ldb * sizeof *B);
        float *C0 = malloc(M * ldc * sizeof *C0), *C1 = malloc(M * ldc * sizeof *C1);
        float *Ci = malloc(M * ldc * sizeof *Ci);
        for (size_t i = 0; i < M * lda; i++) A[i] = rnd();
        for (size_t i = 0; i < K * ldb; i++) B[i] = rnd();
        for (size_t i = 0; i < M * ldc; i++) Ci[i] = rnd(); /* the padding must survive */
        for (int acc = 0; acc < 2; acc++) {
            memcpy(C0, Ci, M * ldc * sizeof *C0);
            tg_gemm g = {A, B, C0, lda, ldb, ldc, M, N, K, acc};
            tg_level_portable.block(&g, 0, M, 0, N);
            for (int nt = 1; nt <= 5; nt++) {
                memcpy(C1, Ci, M * ldc * sizeof *C1);
                g.C = C1;
                for (int i = 0; i < nt; i++) tg_share(lv, &g, i, nt);
                size_t differ = 0, first = 0;
                for (size_t i = 0; i < M * ldc; i++)
                    if (memcmp(&C0[i], &C1[i], sizeof *C0) && !differ++) first = i;
                CHECK_MSG(differ == 0, "%s %ux%ux%u acc %d, %d threads: %zu floats differ, first [%zu] %.9g vs %.9g",
                          lv->name, M, N, K, acc, nt, differ, first, differ ? C1[first] : 0.0, differ ? C0[first] : 0.0);
            }
            /* the work items (tg_item), taken last to first as a shared counter might hand them out */
            memcpy(C1, Ci, M * ldc * sizeof *C1);
            g.C = C1;
            const uint32_t items = tg_item_count(&g);
            CHECK_EQ_INT((int)items, (int)(((M + TG_ITEM_ROWS - 1) / TG_ITEM_ROWS) * ((N + TG_ITEM_COLS - 1) / TG_ITEM_COLS)));
            for (uint32_t k = items; k-- > 0;) tg_item(lv, &g, k);
            CHECK_MSG(memcmp(C0, C1, M * ldc * sizeof *C0) == 0, "%s %ux%ux%u acc %d: the work items differ",
                      lv->name, M, N, K, acc);
        }
        /* the oracle itself against a double sum (the fmaf chain is within K ulps of it) */
        if (strcmp(lv->name, "scalar")) {
            free(A), free(B), free(C0), free(C1), free(Ci);
            continue;
        }
        tg_gemm g = {A, B, C0, lda, ldb, ldc, M, N, K, 0};
        tg_level_portable.block(&g, 0, M, 0, N);
        double worst = 0;
        for (uint32_t m = 0; m < M; m++)
            for (uint32_t n = 0; n < N; n++) {
                double d = 0, mag = 0;
                for (uint32_t k = 0; k < K; k++) {
                    d += (double)A[m * lda + k] * B[k * ldb + n];
                    mag += fabs((double)A[m * lda + k] * B[k * ldb + n]);
                }
                const double e = fabs(C0[m * ldc + n] - d) / (mag > 0 ? mag : 1);
                worst = e > worst ? e : worst;
            }
        CHECK_MSG(worst < 1e-6 * (K > 8 ? K / 8.0 : 1.0), "portable %ux%ux%u: relative error %.3g", M, N, K, worst);
        free(A), free(B), free(C0), free(C1), free(Ci);
    }
}

static void test_levels(void) {
    const char *names[] = {"scalar", "avx2", "avx512", "neon"};
    int ran = 0;
    for (int i = 0; i < 4; i++) {
        const tg_level *lv = tg_level_named(names[i]);
        if (!lv) continue;
        printf("  level %s\n", lv->name);
        check_level(lv);
        ran++;
    }
    CHECK(ran >= 1);
    CHECK(tg_level_named("nope") == NULL);
    CHECK(tg_level_best() != NULL);
}

static void test_transpose(void) {
    const uint32_t R = 45, C = 70;
    float *src = malloc((size_t)R * (C + 1) * sizeof *src), *dst = malloc((size_t)C * (R + 2) * sizeof *dst);
    for (size_t i = 0; i < (size_t)R * (C + 1); i++) src[i] = rnd();
    tg_transpose(src, C + 1, dst, R + 2, R, C);
    size_t bad = 0;
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t c = 0; c < C; c++) bad += dst[(size_t)c * (R + 2) + r] != src[(size_t)r * (C + 1) + c];
    CHECK_MSG(bad == 0, "%zu elements misplaced", bad);
    free(src), free(dst);
}

/* lines x cols, value (r, c) at [r * ls + c * cs]: the fake quantization equals the
 * quantizer's dequantization of its own codes bit for bit, on 1 and 3 threads */
static void check_cq(const g3_model *m, const cq_codebooks *cb, uint32_t bits, uint32_t lines, uint32_t cols,
                     int by_column) {
    const uint64_t ls = by_column ? 1 : cols, cs = by_column ? lines : 1;
    float *w = malloc((size_t)lines * cols * sizeof *w), *row = malloc((size_t)lines * cols * sizeof *row);
    float *want = malloc((size_t)lines * cols * sizeof *want);
    for (size_t i = 0; i < (size_t)lines * cols; i++) w[i] = 0.05f * rnd();
    for (uint32_t c = 0; c < cols && lines > 1; c++) w[1 * ls + c * cs] = 0.0f; /* a zero line: norm 0 */
    for (uint32_t r = 0; r < lines; r++) /* the quantizer's layout: rows of cols */
        for (uint32_t c = 0; c < cols; c++) row[(size_t)r * cols + c] = w[r * ls + c * cs];
    uint8_t *blob = malloc(cq_blob_bytes(lines, cols, bits, cb->group));
    CHECK(cq_quantize_matrix(cb, row, lines, cols, bits, blob, NULL, NULL) == 0);
    CHECK(cq_dequantize_matrix(cb, blob, lines, cols, bits, want) == 0);
    CHECK_MSG(g3_cq_fake_quant(m, cb, bits, w, lines, cols, ls, cs) == 0, "%s", needle_last_error());
    size_t differ = 0;
    for (uint32_t r = 0; r < lines; r++)
        for (uint32_t c = 0; c < cols; c++) differ += memcmp(&w[r * ls + c * cs], &want[(size_t)r * cols + c], 4) != 0;
    CHECK_MSG(differ == 0, "CQ%u %u x %u (%s): %zu values differ from the quantizer's", bits, lines, cols,
              by_column ? "by column" : "by row", differ);
    free(w), free(row), free(want), free(blob);
}

static void test_cq_fake_quant(void) {
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, 128) == 0);
    static const char TINY[] =
        "{\"vocab_size\": 48, \"out_vocab\": 0, \"d_model\": 24, \"num_heads\": 2, \"num_kv_heads\": 1,"
        " \"num_layers\": 1, \"qk_head_dim\": 12, \"v_head_dim\": 8, \"max_seq_len\": 64, \"rope_theta\": 10000.0,"
        " \"sliding_window\": 4, \"global_layers\": [0], \"qkv_conv_taps\": 2, \"mhc_lanes\": 2,"
        " \"engram_orders\": [2], \"engram_slots\": 11, \"engram_layers\": [0]}";
    export3_config cfg;
    g3_model *m = NULL;
    CHECK(export3_config_parse(TINY, strlen(TINY), &cfg) == 0 && g3_model_from_checkpoint(&cfg, NULL, &m) == 0);
    /* one group per line (the 8-chains), exactly one, padded, several */
    static const uint32_t SH[][2] = {{5, 40}, {7, 128}, {3, 200}, {9, 768}, {130, 256}};
    for (int threads = 1; threads <= 3 && m; threads += 2) {
        CHECK(g3_set_threads(m, threads) == 0);
        for (size_t s = 0; s < sizeof SH / sizeof SH[0]; s++)
            for (int byc = 0; byc < 2; byc++) check_cq(m, &cb, 4, SH[s][0], SH[s][1], byc);
    }
    for (uint32_t bits = 2; bits <= 3; bits++) /* fewer levels than a vector's lanes */
        for (int byc = 0; byc < 2; byc++) check_cq(m, &cb, bits, 9, 768, byc);
    check_cq(NULL, &cb, 4, 4, 300, 0); /* no model: one thread */
    /* bad input: a value that is not finite, a group norm beyond float16 */
    float bad[256];
    for (int i = 0; i < 256; i++) bad[i] = 0.01f;
    bad[130] = NAN;
    CHECK(g3_cq_fake_quant(m, &cb, 4, bad, 2, 128, 128, 1) == NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(strstr(needle_last_error(), "line 1 column 2") != NULL);
    bad[130] = 1e5f;
    CHECK(g3_cq_fake_quant(m, &cb, 4, bad, 2, 128, 128, 1) == NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(strstr(needle_last_error(), "beyond f16") != NULL);
    g3_model_free(m);
}

int main(void) {
    RUN(test_levels);
    RUN(test_cq_fake_quant);
    RUN(test_transpose);
    return test_summary();
}
