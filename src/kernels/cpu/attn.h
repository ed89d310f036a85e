/* The attention kernel of the CPU backend: the query heads that share one K/V head (GQA)
 * against that head's cached keys and values, in the cache's own precision.
 *
 * One call reads every cached K and V row of the head once, whatever the number of
 * query heads, and converts f16 / int8 values on the fly (int8: a float scale per group
 * of `group` values of the full cache row, so the head's first column `col0` tells which
 * scale covers which column). The positions are given as runs of consecutive cache
 * slots (the sinks, then the window tail, which wraps at most once around the ring), in
 * position order.
 *
 * Arithmetic: the plain kernel (attn_plain.c) computes exactly what the original
 * per-head loop did: scores by an in-order dot product, softmax numerators with expf,
 * o += (w / sum) * v in position order. The SIMD kernels sum in their own (fixed) order
 * and use a polynomial exp accurate to a few ulp, so they agree with it to float
 * rounding; the result depends only on the inputs, never on the calling thread. */
#ifndef NEEDLE_KERNELS_CPU_ATTN_H
#define NEEDLE_KERNELS_CPU_ATTN_H

#include <stddef.h>
#include <stdint.h>

/* One K/V head of the cache. */
typedef struct attn_kv {
    int32_t type;           /* NEEDLE_KV_F32, NEEDLE_KV_F16 or NEEDLE_KV_INT8 */
    const void *k, *v;      /* column 0 of this head in cache slot 0: element j of slot r is
                             * ((T *)k)[r * ld + j], T = float, uint16_t (f16) or int8_t */
    size_t ld;              /* elements from one slot to the next */
    const float *k_scales, *v_scales; /* int8: slot r's scale of cache-row group g at
                                       * scales[r * scales_ld + g] */
    size_t scales_ld;
    uint32_t col0;          /* int8: the head's first column in the cache row */
    uint32_t group;         /* int8: values per scale group (a multiple of 8) */
    /* V heads of another width than K (Needle 3's v_head_dim != qk_head_dim): v_dim
     * values per V row, the head's first column v_col0 of the V cache row (int8). 0 (the
     * zero initialiser) means V has K's layout: v_dim = hd, v_col0 = col0. */
    uint32_t v_dim, v_col0;
    /* nonzero: the rows are likely out of cache (a decode step, after every other layer
     * and its weights passed through): the SIMD kernels then prefetch rows ahead, which
     * costs more than it saves on rows that are already in cache (a prefill chunk) */
    uint32_t cold;
} attn_kv;

/* The V width and first V column a kernel uses (see attn_kv.v_dim). */
static inline uint32_t attn_v_dim(const attn_kv *kv, uint32_t hd) {
    return kv->v_dim ? kv->v_dim : hd;
}
static inline uint32_t attn_v_col0(const attn_kv *kv) {
    return kv->v_dim ? kv->v_col0 : kv->col0;
}

/* `count` consecutive cache slots from `slot`. */
typedef struct attn_run {
    uint32_t slot, count;
} attn_run;

/* Attention of nq query heads over one K/V head:
 *   w[a][p] = exp(scale * <q[a], k_p> - max_p(...)), o[a] = sum_p (w[a][p] / sum w[a]) v_p
 * for the positions p of runs[0..n_runs) in order (at least one position), then, when
 * gate is not NULL, o[a][j] *= sigmoid(gate[a][j]) (the output gate, §3.6).
 * q: [nq][hd]; o, gate: [nq][vd], vd = attn_v_dim(kv, hd) (o is overwritten); w: [nq]
 * rows of ld_w floats (ld_w >= positions), scratch left holding the numerators; tmp: at
 * least max(hd, vd) floats of scratch. */
typedef void (*attn_fn)(const attn_kv *kv, const attn_run *runs, uint32_t n_runs,
                        const float *q, uint32_t nq, uint32_t hd, float scale,
                        const float *gate, float *w, size_t ld_w, float *o, float *tmp);

void attn_plain(const attn_kv *kv, const attn_run *runs, uint32_t n_runs, const float *q,
                uint32_t nq, uint32_t hd, float scale, const float *gate, float *w, size_t ld_w,
                float *o, float *tmp);

/* The AVX2+FMA+F16C kernel (attn_avx2.c), defined on x86 only and callable only where
 * cpu_kernels_avx2() is non-NULL; the AVX2 table of cq_avx2.c refers to it. */
void attn_avx2(const attn_kv *kv, const attn_run *runs, uint32_t n_runs, const float *q,
               uint32_t nq, uint32_t hd, float scale, const float *gate, float *w, size_t ld_w,
               float *o, float *tmp);

/* The AVX-512F kernel (attn_avx512.c), defined on x86 only and callable only where
 * cpu_kernels_avx512() is non-NULL: f32 and f16 caches with hd and v widths multiples of
 * 16; other shapes go to attn_avx2. */
void attn_avx512(const attn_kv *kv, const attn_run *runs, uint32_t n_runs, const float *q,
                 uint32_t nq, uint32_t hd, float scale, const float *gate, float *w,
                 size_t ld_w, float *o, float *tmp);

/* The NEON kernel (attn_neon.c), defined where kernels/cpu/neon.h says NEEDLE_NEON. */
void attn_neon(const attn_kv *kv, const attn_run *runs, uint32_t n_runs, const float *q,
               uint32_t nq, uint32_t hd, float scale, const float *gate, float *w, size_t ld_w,
               float *o, float *tmp);

/* ---- prefill blocks: the query heads of nt consecutive tokens at once -------------------
 *
 * Token i (0 <= i < nt) of the block attends to cache slots [0, n0 + i] (the positions
 * before it and itself, each in the slot of its own index: a prefill that has not yet
 * wrapped the ring). q: token i's [nq][hd] heads at q + i * ld_q; o and gate likewise with
 * ld_o, ld_g ([nq][vd]); gate may be NULL. Scores and values are computed as small
 * matrix products (a key row converted once for every token and head of the block), so a
 * token's result is not bit-identical to the one-token kernel's, only equal to rounding,
 * and depends only on its own inputs, the cache and the block it belongs to. `scratch`:
 * attn_block_scratch_floats(hd, vd) floats. Returns 1, or 0 without writing anything
 * when the shape is not one it takes (then the one-token kernel must be used). */
#define ATTN_BLOCK_T 16         /* tokens per block */
#define ATTN_BLOCK_MAX_KEYS 512 /* n0 + nt at most */
#define ATTN_BLOCK_MAX_DIM 256  /* hd, vd at most */
#define ATTN_BLOCK_KEY_TILE 32  /* key rows converted to floats at a time */

typedef int (*attn_block_fn)(const attn_kv *kv, uint32_t n0, uint32_t nt, const float *q,
                             size_t ld_q, uint32_t nq, uint32_t hd, float scale,
                             const float *gate, size_t ld_g, float *o, size_t ld_o,
                             float *scratch);

static inline size_t attn_block_scratch_floats(uint32_t hd, uint32_t vd) {
    const size_t wide = hd > vd ? hd : vd;
    /* a pair of heads' scores of every key for the block's tokens, a converted key tile,
     * the pair's queries and outputs side by side per token, the 1/sums */
    return 2 * (size_t)ATTN_BLOCK_MAX_KEYS * ATTN_BLOCK_T + ATTN_BLOCK_KEY_TILE * wide +
           2 * (size_t)ATTN_BLOCK_T * ((size_t)hd + vd) + 2 * ATTN_BLOCK_T;
}

/* The AVX2 block kernel (attn_avx2.c; x86 only, like attn_avx2): 8 tokens per vector, a
 * block of more taken as blocks of 8. */
int attn_block_avx2(const attn_kv *kv, uint32_t n0, uint32_t nt, const float *q, size_t ld_q,
                    uint32_t nq, uint32_t hd, float scale, const float *gate, size_t ld_g,
                    float *o, size_t ld_o, float *scratch);

/* The AVX-512F block kernel (attn_block_avx512.c; x86 only, callable only where
 * cpu_kernels_avx512() is non-NULL): the 16 tokens in one vector. */
int attn_block_avx512(const attn_kv *kv, uint32_t n0, uint32_t nt, const float *q,
                      size_t ld_q, uint32_t nq, uint32_t hd, float scale, const float *gate,
                      size_t ld_g, float *o, size_t ld_o, float *scratch);

#endif
