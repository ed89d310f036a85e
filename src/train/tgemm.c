/* The portable product (the oracle of tgemm.h), the choice of level, the split among
 * threads and the transpose. */
#include "train/tgemm.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define PORTABLE_COLS 64 /* accumulators kept on the stack per pass over k */

static void block_portable(const tg_gemm *g, uint32_t m0, uint32_t m1, uint32_t n0, uint32_t n1) {
    float acc[PORTABLE_COLS];
    for (uint32_t m = m0; m < m1; m++) {
        const float *a = g->A + (size_t)m * g->lda;
        float *c = g->C + (size_t)m * g->ldc;
        for (uint32_t nb = n0; nb < n1; nb += PORTABLE_COLS) {
            const uint32_t w = n1 - nb < PORTABLE_COLS ? n1 - nb : PORTABLE_COLS;
            memset(acc, 0, sizeof acc);
            const float *b = g->B + nb;
            for (uint32_t k = 0; k < g->K; k++, b += g->ldb) {
                const float ak = a[k];
                for (uint32_t j = 0; j < w; j++) acc[j] = fmaf(ak, b[j], acc[j]);
            }
            if (g->accumulate)
                for (uint32_t j = 0; j < w; j++) c[nb + j] += acc[j];
            else
                memcpy(c + nb, acc, w * sizeof *acc);
        }
    }
}

const tg_level tg_level_portable = {"scalar", block_portable};

const tg_level *tg_level_named(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "scalar")) return &tg_level_portable;
    if (!strcmp(name, "avx2")) return tg_level_avx2();
    if (!strcmp(name, "avx512")) return tg_level_avx512();
    if (!strcmp(name, "neon")) return tg_level_neon();
    return NULL;
}

const tg_level *tg_level_best(void) {
    const tg_level *lv = tg_level_named(cpu_kernels_vector_level(cpu_kernels_best()));
    return lv ? lv : &tg_level_portable;
}

#define SHARE_COLS 32 /* columns are handed out in whole vector panels */

void tg_share(const tg_level *lv, const tg_gemm *g, int i, int nthreads) {
    if (!g->M || !g->N) return;
    const uint64_t nt = (uint64_t)nthreads, ii = (uint64_t)i;
    if (g->M >= 8 * nt || g->N <= SHARE_COLS) { /* rows */
        const uint32_t lo = (uint32_t)(g->M * ii / nt), hi = (uint32_t)(g->M * (ii + 1) / nt);
        if (hi > lo) lv->block(g, lo, hi, 0, g->N);
        return;
    }
    const uint64_t panels = (g->N + SHARE_COLS - 1) / SHARE_COLS; /* few rows: column panels */
    const uint32_t lo = (uint32_t)(panels * ii / nt) * SHARE_COLS;
    uint32_t hi = (uint32_t)(panels * (ii + 1) / nt) * SHARE_COLS;
    if (hi > g->N) hi = g->N;
    if (hi > lo) lv->block(g, 0, g->M, lo, hi);
}

uint32_t tg_item_count(const tg_gemm *g) {
    if (!g->M || !g->N) return 0;
    return ((g->M + TG_ITEM_ROWS - 1) / TG_ITEM_ROWS) * ((g->N + TG_ITEM_COLS - 1) / TG_ITEM_COLS);
}

void tg_item(const tg_level *lv, const tg_gemm *g, uint32_t k) {
    const uint32_t cols = (g->N + TG_ITEM_COLS - 1) / TG_ITEM_COLS;
    const uint32_t m0 = k / cols * TG_ITEM_ROWS, n0 = k % cols * TG_ITEM_COLS;
    if (m0 >= g->M) return;
    const uint32_t m1 = g->M - m0 < TG_ITEM_ROWS ? g->M : m0 + TG_ITEM_ROWS;
    const uint32_t n1 = g->N - n0 < TG_ITEM_COLS ? g->N : n0 + TG_ITEM_COLS;
    lv->block(g, m0, m1, n0, n1);
}

/* a tile of source rows and columns stays in L1 both ways; 8, not more: at power-of-two
 * strides a larger tile's destination lines share a few L1 sets and evict each other
 * (512 x 512: 16 is 3x faster than 32, 2048 x 512: 8 is 2x faster than 16) */
#define TR_TILE 8

/* tgemm_x86.c: in 8 x 8 register blocks where the CPU has AVX2 (0: not done) */
int tg_transpose_x86(const float *src, size_t lds, float *dst, size_t ldd, uint32_t rows, uint32_t cols);

void tg_transpose(const float *src, size_t lds, float *dst, size_t ldd, uint32_t rows, uint32_t cols) {
    if (tg_transpose_x86(src, lds, dst, ldd, rows, cols)) return;
    for (uint32_t r0 = 0; r0 < rows; r0 += TR_TILE)
        for (uint32_t c0 = 0; c0 < cols; c0 += TR_TILE) {
            const uint32_t r1 = r0 + TR_TILE < rows ? r0 + TR_TILE : rows;
            const uint32_t c1 = c0 + TR_TILE < cols ? c0 + TR_TILE : cols;
            for (uint32_t r = r0; r < r1; r++)
                for (uint32_t c = c0; c < c1; c++) dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
        }
}
