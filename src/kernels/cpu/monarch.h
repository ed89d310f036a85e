/* Kernels of the Needle 3 CPU ops (backend/cpu/spanned_attention.c, monarch_mlp.c): the
 * row combinations that make up the Monarch (Kronecker) MLP's products and its rank-8
 * condition, and the multiply-add of the causal conv taps. One table per instruction-set level, named as the levels of
 * cpu.h (backend/cpu/runtime.c picks the session's level once).
 *
 * Arithmetic: the plain kernels sum each output's terms in index order with a separate
 * multiply and add (what the original loops computed); the SIMD ones use fused
 * multiply-adds in the same order, so they agree with the plain ones to float rounding
 * (tests/kernels/test_monarch_kernels.c) and depend only on their inputs. */
#ifndef NEEDLE_KERNELS_CPU_MONARCH_H
#define NEEDLE_KERNELS_CPU_MONARCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct monarch_kernels {
    const char *name; /* "scalar", "avx2", "avx512", "neon" */
    /* out[l] = sum_{r < n} c[r * c_ld] * x[r * w + l] for l < w (out overwritten, and
     * neither c nor x may overlap it) */
    void (*combine)(float *out, const float *c, size_t c_ld, const float *x, uint32_t n,
                    uint32_t w);
    /* out[i] += a[i] * b[i] for i < n */
    void (*mul_add)(float *out, const float *a, const float *b, uint32_t n);
    /* m rows of combine() at once: out[i * out_ld + l] = sum_{r < n} c[i * c_row + r * c_ld]
     * * x[r * w + l] for i < m, l < w. Each output row is the same arithmetic as combine()
     * of that level on the same row, so whole Kronecker factors (a Monarch block product
     * is 32 rows of 32) can be blocked in registers without changing a bit. */
    void (*combine_rows)(float *out, size_t out_ld, const float *c, size_t c_row, size_t c_ld,
                         const float *x, uint32_t n, uint32_t w, uint32_t m);
} monarch_kernels;

extern const monarch_kernels monarch_kernels_scalar;

/* The AVX2+FMA table (monarch_avx2.c), or NULL where cpu_kernels_avx2() is NULL. */
const monarch_kernels *monarch_kernels_avx2(void);

/* The AVX-512F table (monarch_avx512.c): AVX2's combine and mul_add, and combine_rows
 * blocked over several output rows in zmm registers (bit-identical to AVX2's), or NULL
 * where cpu_kernels_avx512() is NULL. */
const monarch_kernels *monarch_kernels_avx512(void);

/* The AVX2 kernels the AVX-512 table shares (x86 builds only; call only where
 * monarch_kernels_avx2() is non-NULL). */
void monarch_avx2_combine(float *out, const float *c, size_t c_ld, const float *x, uint32_t n,
                          uint32_t w);
void monarch_avx2_mul_add(float *out, const float *a, const float *b, uint32_t n);

/* The NEON table (monarch_neon.c) where the NEON level runs (kernels/cpu/neon.h), else NULL. */
const monarch_kernels *monarch_kernels_neon(void);

/* The table of the level called `name` ("scalar", "avx2", "avx512", "neon"), or NULL if unknown or
 * unsupported here. */
const monarch_kernels *monarch_kernels_named(const char *name);

#endif
