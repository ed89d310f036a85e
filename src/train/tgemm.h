/* The dense products of the training core: C = A B or C += A B on row-major float
 * matrices, one kernel for the forward x W, the backward dX = dY W^T (W transposed once
 * by the caller) and dW += X^T dY (X transposed once), and the output head.
 *
 * Arithmetic, the same at every level: each C[m][n] is one chain of fused multiply-adds
 * over k = 0 .. K-1 in order, starting from 0 (s = fmaf(A[m][k], B[k][n], s)), then
 * stored (C = s) or added (C = C + s). The SIMD levels run that chain in one vector lane
 * per column n, so every level gives bit for bit what the portable one (fmaf, the oracle)
 * gives, and so does every tiling and thread split.
 *
 * Levels: portable C (tgemm.c), AVX2+FMA and AVX-512F (tgemm_x86.c, per-function target
 * attributes and a CPUID probe), NEON (tgemm_neon.c, every aarch64 CPU). The level follows
 * the engine's kernel table (cpu_kernels_best(): the best this CPU has, NEEDLE_CPU lowers
 * it); tg_level_named picks one by name for the tests. */
#ifndef NEEDLE_TRAIN_TGEMM_H
#define NEEDLE_TRAIN_TGEMM_H

#include <stddef.h>
#include <stdint.h>

typedef struct tg_gemm {
    const float *A; /* [M][K], row stride lda */
    const float *B; /* [K][N], row stride ldb */
    float *C;       /* [M][N], row stride ldc */
    size_t lda, ldb, ldc;
    uint32_t M, N, K;
    int accumulate; /* 0: C = A B; 1: C += A B */
} tg_gemm;

/* Computes the block rows [m0, m1) x columns [n0, n1) of C. */
typedef void (*tg_block_fn)(const tg_gemm *g, uint32_t m0, uint32_t m1, uint32_t n0, uint32_t n1);

typedef struct tg_level {
    const char *name; /* "scalar", "avx2", "avx512", "neon" */
    tg_block_fn block;
} tg_level;

extern const tg_level tg_level_portable;
const tg_level *tg_level_avx2(void);   /* NULL if this build or CPU lacks AVX2+FMA */
const tg_level *tg_level_avx512(void); /* NULL if this build or CPU lacks AVX-512F */
const tg_level *tg_level_neon(void);   /* NULL off aarch64 */

/* The level named like the engine's kernel levels, NULL if unknown or unsupported here. */
const tg_level *tg_level_named(const char *name);
/* The level of the engine's best kernel table (NEEDLE_CPU lowers it), else portable. */
const tg_level *tg_level_best(void);

/* The work one of `nthreads` threads does for share `i` of g: disjoint blocks of C whose
 * union is C. Every element's arithmetic is fixed (above), so the split is free. */
void tg_share(const tg_level *lv, const tg_gemm *g, int i, int nthreads);

/* The product cut into work items for threads that take them from a shared counter (a
 * thread the OS has descheduled then delays no one): blocks of TG_ITEM_ROWS rows x
 * TG_ITEM_COLS columns of C, row blocks outermost. Item k computes its block of C; the
 * items partition C, and every element's arithmetic is fixed (above), so which thread
 * takes which item does not change a bit. */
#define TG_ITEM_ROWS 48u  /* 8 register tiles of 6 rows */
#define TG_ITEM_COLS 128u /* 4 AVX-512 (8 AVX2) column panels */
uint32_t tg_item_count(const tg_gemm *g);
void tg_item(const tg_level *lv, const tg_gemm *g, uint32_t k);

/* The per-token loops of the training cores (norms, gates, lanes, softmaxes, the LoRA
 * merge) are compiled twice, for the baseline ISA and for AVX2, and the copy for this CPU
 * is picked once at load (an ifunc): the same element-wise operations in wider vectors
 * (the library is built with -ffp-contract=off, so no multiply-add is fused; sums stay in
 * their written order), so the same bits either way (measured: the released-geometry LoRA
 * step ~10% faster on an AVX2 core). ELF x86-64 with GCC or clang only, and not under
 * ThreadSanitizer: the loader runs an ifunc's resolver before the TSan runtime is up, and
 * the instrumented resolver crashed the program at load. */
#if defined(__SANITIZE_THREAD__)
#define TG_NO_CLONES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TG_NO_CLONES 1
#endif
#endif
#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__)) && !defined(TG_NO_CLONES)
#define TG_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TG_CLONES
#endif

/* dst[c][r] = src[r][c] for an r x c matrix (row strides as given) */
void tg_transpose(const float *src, size_t lds, float *dst, size_t ldd, uint32_t rows, uint32_t cols);

#endif
