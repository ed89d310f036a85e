/* The CPU backend: a dispatch table of CQ kernels and a persistent thread pool.
 *
 * Kernels. `cpu_kernels` is one struct of function pointers per instruction-set level:
 * the plain C reference ("scalar"), AVX2 and AVX-512 on x86-64 and NEON on aarch64 and
 * 32-bit ARM. Every SIMD file is compiled on every architecture and reduces to a stub
 * returning NULL on the others. The AVX2 file uses per-function target attributes and a
 * CPUID probe, so one x86 binary runs everywhere; NEON (AdvSIMD with FMA) is part of every
 * aarch64 CPU, so it needs no probe there, while on 32-bit ARM NEON and VFPv4 are optional
 * and asked of the kernel (getauxval(AT_HWCAP), kernels/cpu/neon.h). The NEON kernels use
 * no other optional extension (in particular not the SDOT/UDOT dot product, which
 * multiplies int8 and so does not apply to float activations). cpu_kernels_best() picks the best level once, which
 * the environment variable NEEDLE_CPU=scalar|avx2|avx512|neon can lower (an unsupported or
 * unknown request falls back to the best supported level). Every SIMD kernel is tested
 * against the plain one (tests/kernels/test_simd.c).
 *
 * Threads. A `cpu_pool` owns n-1 worker threads; the caller of cpu_pool_run is thread
 * 0. Workers spin briefly after each run and then sleep on a condition variable, so
 * back-to-back runs (one per matrix product in decode) do not pay a wake-up. A pool is
 * used by one thread at a time (each session owns one), so sessions never interfere.
 *
 * cpu_matmul runs a batch of CQ products that read the same rotated activations, with
 * rows handed out in chunks through an atomic counter (robust to a busy core). Each row
 * is computed by exactly one thread with the same arithmetic whichever thread it is, so
 * the result does not depend on the thread count. */
#ifndef NEEDLE_KERNELS_CPU_H
#define NEEDLE_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/attn.h"
#include "kernels/cq.h"

/* Per-thread scratch a kernel may use to re-lay out activations (the SIMD kernels
 * permute the rotated activations into the order their weight decoding produces). The
 * owner sets `buf`/`cap` and clears `valid` whenever the activations may have changed;
 * a kernel given NULL or too small a scratch uses a slower path that needs none. */
typedef struct cq_scratch {
    float *buf;   /* 32-byte aligned, `cap` floats */
    size_t cap;
    int valid;    /* buf holds `src` re-laid out as below */
    const float *src;
    size_t src_ld;
    uint32_t src_ntok, src_cols, src_layout;
} cq_scratch;

typedef struct cpu_kernels {
    const char *name; /* "scalar", "avx2", "avx512", "amx", "neon", "simd128" */
    /* In-place unnormalised Walsh-Hadamard transform, n a power of 2 (see fwht()). */
    void (*fwht)(float *x, uint32_t n);
    /* See cq_rotate(). */
    void (*rotate)(const cq_matrix *w, const float *x, float *xr);
    /* See cq_matmul(); `scratch` may be NULL. */
    void (*matmul)(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                   size_t ld_x, uint32_t ntok, float *y, size_t ld_y, cq_scratch *scratch);
    /* See cq_dequant_row(). */
    void (*dequant_row)(const cq_matrix *w, uint32_t r, float *out, float *tmp);
    /* sum_i a[i] * b[i] (the plain version sums in order; others in any order) */
    float (*dot)(const float *a, const float *b, uint32_t n);
    /* y[i] += a * x[i] */
    void (*axpy)(float *y, float a, const float *x, uint32_t n);
    /* The query heads of one K/V head against the cache (kernels/cpu/attn.h). */
    attn_fn attend;
    /* Prefill blocks of tokens (kernels/cpu/attn.h); NULL where the level has none. */
    attn_block_fn attend_block;
    /* Rows of a many-token product's register (or tile) block: the pool hands out rows in
     * multiples of it (0: 12, the AVX2 and AVX-512 tiles' common multiple). */
    uint32_t tile_rows;
    /* Tokens per prefill chunk the level asks for, if more than the session's default
     * (0: the default): a level that prepares each weight panel once per chunk gains
     * from longer ones. */
    uint32_t prefill_chunk;
} cpu_kernels;

extern const cpu_kernels cpu_kernels_scalar;

/* The AVX2+FMA+F16C table, or NULL if this build or this CPU lacks them. */
const cpu_kernels *cpu_kernels_avx2(void);

/* The AVX2 table with AVX-512F many-token products (kernels/cpu/cq_gemm_avx512.c), or
 * NULL if this build or this CPU (or its OS, for the ZMM state) lacks them. */
const cpu_kernels *cpu_kernels_avx512(void);

/* The AVX-512 table with its many-token products on the AMX tile unit in split bf16
 * (kernels/cpu/cq_gemm_amx.c), or NULL if this build, this CPU (AMX-TILE, AMX-BF16,
 * AVX512-BF16) or the OS (Linux's permission for the tile data) lacks them. */
const cpu_kernels *cpu_kernels_amx(void);

/* The vector level whose companion tables (lane ops, Monarch and A8 kernels, training
 * products) a level uses: its own name, except "amx", which is AVX-512 but for its CQ
 * products. */
const char *cpu_kernels_vector_level(const cpu_kernels *k);

/* The NEON table where NEEDLE_NEON (kernels/cpu/neon.h) and the CPU has it, else NULL. */
const cpu_kernels *cpu_kernels_neon(void);

/* The WebAssembly SIMD128 table (kernels/cpu/cq_wasm.c) in builds compiled with
 * -msimd128, else NULL. */
const cpu_kernels *cpu_kernels_simd128(void);

/* The best level this CPU supports, lowered by NEEDLE_CPU; never NULL. Thread-safe. */
const cpu_kernels *cpu_kernels_best(void);

/* The level called `name` ("scalar", "avx2", "avx512", "amx", "neon", "simd128"), or NULL if unknown or
 * unsupported here. */
const cpu_kernels *cpu_kernels_named(const char *name);

/* Checks NEEDLE_CPU (scalar, avx2, avx512, amx, neon or simd128, and a level this CPU has) and
 * NEEDLE_THREADS (a positive integer); unset or empty is fine. NEEDLE_OK, or a status with a message
 * (needle_last_error) naming the variable: NEEDLE_ERR_BACKEND for a kernel level,
 * NEEDLE_ERR_INVALID_ARGUMENT for a thread count. Called when a model is opened. */
int cpu_check_env(void);

/* Floats of scratch a kernel needs to take its fast path for `ntok` tokens over matrices
 * of up to `cols_pad` padded columns. */
size_t cq_scratch_floats(uint32_t cols_pad, uint32_t ntok);

/* ---- thread pool ------------------------------------------------------------------- */

typedef struct cpu_pool cpu_pool;

/* n_threads <= 0 picks NEEDLE_THREADS, else the online cores. Every thread gets
 * `scratch_floats` of kernel scratch. Returns 0 or a negative needle_status. */
int cpu_pool_create(int n_threads, const cpu_kernels *kernels, size_t scratch_floats,
                    cpu_pool **out);
void cpu_pool_free(cpu_pool *pool); /* NULL is a no-op */

int cpu_pool_threads(const cpu_pool *pool);
/* How long (microseconds, at least the tight spin) an idle worker polls for the next run
 * before it sleeps; 2000 by default, for decode's back-to-back runs. A caller with serial
 * stretches between runs (training) sets less, so that the workers do not burn a core
 * each while it runs alone. */
void cpu_pool_set_idle_wait(cpu_pool *pool, int64_t us);
const cpu_kernels *cpu_pool_kernels(const cpu_pool *pool);

/* Runs fn(arg, i, n) for i = 0..n-1 on the pool's n threads (i = 0 on the caller) and
 * returns when all have finished. Not reentrant; one caller at a time. */
void cpu_pool_run(cpu_pool *pool, void (*fn)(void *arg, int i, int n), void *arg);

/* The same for a work-sharing fn (each call takes work items from a shared counter until
 * none is left): fn(arg, 0, n) runs on the caller, and each worker calls fn only if it
 * arrives before the caller's call has returned, so a descheduled worker never delays
 * the caller. Returns when every fn call that started has finished. */
void cpu_pool_run_shared(cpu_pool *pool, void (*fn)(void *arg, int i, int n), void *arg);

/* Hand-off counters of the pool: runs dispatched to the workers (0 for a one-thread
 * pool, which never dispatches) and the caller's time spent on them outside its own share
 * of the work: publishing the run, then waiting for the workers to finish theirs. */
void cpu_pool_sync_stats(const cpu_pool *pool, uint64_t *runs, uint64_t *sync_ns);

/* One CQ product of a batch: y[t][r - row0] = <W[r], x_t> for r in [row0, row0+nrows). */
typedef struct cq_job {
    const cq_matrix *w;
    uint32_t row0, nrows;
    float *y;
    size_t ld_y;
} cq_job;

/* Runs every job over the same rotated activations xr ([ntok][ld_x]), sharing rows among
 * the pool's threads. */
void cpu_matmul(cpu_pool *pool, const float *xr, size_t ld_x, uint32_t ntok,
                const cq_job *jobs, uint32_t njobs);

#endif
