/* bench_peak.c: the float multiply-add peak `needle bench` measures on this machine, and
 * the floating-point work of a Needle 2 forward pass, so that the bench can print every
 * speed as a fraction of what the hardware does.
 *
 * Peak: independent chains of vector FMAs written in inline assembly, so that every chain
 * stays in a register (compiled from intrinsics, GCC kept them in stack slots and the
 * loop measured store-to-load latency, about 40% of the real figure). Enough chains to
 * cover latency x throughput with margin: 24 zmm chains for AVX-512F (32 registers; 4
 * cycles x 2 ports needs 8), 12 ymm chains for AVX2+FMA (16 registers), 24 q-register
 * chains for NEON (4 cycles x 4 pipes on the widest cores needs 16); else plain float
 * multiply and add. The widest ISA the CPU and OS support is the peak; on an AVX-512
 * machine the AVX2 peak (what the kernels use today) is measured too, its tries
 * interleaved with the AVX-512 ones. Each is run on T threads at once for ~15 ms,
 * PEAK_TRIES times; the best flops / wall time counts, so a try that another process
 * interrupted does not. On a busy machine the phases' figures
 * drop and the peak may not, so the fractions are then lower bounds. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "bench_peak.h"
#include "cli.h"

#define PEAK_TRIES 6 /* of ~15 ms each */

typedef double (*fma_rounds_fn)(uint64_t iters);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define HAVE_X86_PEAK 1

/* flops of `iters` rounds of 12 independent 8-lane FMAs (ymm2..ymm13 += ymm0 * ymm1) */
__attribute__((target("avx2,fma"))) static double fma_rounds_avx2(uint64_t iters) {
    if (!iters) return 0.0;
    uint64_t n = iters;
#define Y(i) "vfmadd231ps %%ymm0, %%ymm1, %%ymm" #i "\n\t"
    __asm__ volatile("vxorps %%xmm0, %%xmm0, %%xmm0\n\t"
                     "vxorps %%xmm1, %%xmm1, %%xmm1\n\t"
                     "1:\n\t" Y(2) Y(3) Y(4) Y(5) Y(6) Y(7) Y(8) Y(9) Y(10) Y(11) Y(12) Y(13)
                     "dec %0\n\t"
                     "jnz 1b\n\t"
                     "vzeroupper"
                     : "+r"(n)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "cc");
#undef Y
    return (double)iters * 12 * 16.0;
}

/* flops of `iters` rounds of 24 independent 16-lane FMAs (zmm2..zmm25 += zmm0 * zmm1) */
__attribute__((target("avx512f"))) static double fma_rounds_avx512(uint64_t iters) {
    if (!iters) return 0.0;
    uint64_t n = iters;
#define Z(i) "vfmadd231ps %%zmm0, %%zmm1, %%zmm" #i "\n\t"
    __asm__ volatile("vxorps %%xmm0, %%xmm0, %%xmm0\n\t"
                     "vxorps %%xmm1, %%xmm1, %%xmm1\n\t"
                     "1:\n\t" Z(2) Z(3) Z(4) Z(5) Z(6) Z(7) Z(8) Z(9) Z(10) Z(11) Z(12) Z(13)
                         Z(14) Z(15) Z(16) Z(17) Z(18) Z(19) Z(20) Z(21) Z(22) Z(23) Z(24) Z(25)
                     "dec %0\n\t"
                     "jnz 1b\n\t"
                     "vzeroupper"
                     : "+r"(n)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16",
                       "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24",
                       "xmm25", "cc");
#undef Z
    return (double)iters * 24 * 32.0;
}

/* CPUID and XCR0: AVX2+FMA with the OS saving YMM state (XCR0 bits 1-2); AVX-512F with it
 * also saving the opmask and upper ZMM state (bits 5-7). */
static void x86_vector_isa(int *avx2, int *avx512) {
    *avx2 = *avx512 = 0;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const unsigned need1 = 1u << 12 | 1u << 27 | 1u << 28; /* FMA OSXSAVE AVX */
    if ((c & need1) != need1 || __get_cpuid_max(0, NULL) < 7) return;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    __cpuid_count(7, 0, a, b, c, d);
    *avx2 = (xlo & 0x6) == 0x6 && (b >> 5 & 1);
    *avx512 = *avx2 && (xlo & 0xe6) == 0xe6 && (b >> 16 & 1);
}
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
/* flops of `iters` rounds of 24 independent 4-lane FMAs (v2..v25 += v0 * v1) */
static double fma_rounds_neon(uint64_t iters) {
    if (!iters) return 0.0;
    uint64_t n = iters;
#define V(i) "fmla v" #i ".4s, v0.4s, v1.4s\n\t"
    __asm__ volatile("movi v0.4s, #0\n\t"
                     "movi v1.4s, #0\n\t"
                     "1:\n\t" V(2) V(3) V(4) V(5) V(6) V(7) V(8) V(9) V(10) V(11) V(12) V(13)
                         V(14) V(15) V(16) V(17) V(18) V(19) V(20) V(21) V(22) V(23) V(24) V(25)
                     "subs %0, %0, #1\n\t"
                     "b.ne 1b\n\t"
                     : "+r"(n)
                     :
                     : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11",
                       "v12", "v13", "v14", "v15", "v16", "v17", "v18", "v19", "v20", "v21",
                       "v22", "v23", "v24", "v25", "cc");
#undef V
    return (double)iters * 24 * 8.0;
}
#endif

#define PLAIN_CHAINS 8
static double fma_rounds_plain(uint64_t iters) {
    volatile float seed = 0.9999f;
    float a[PLAIN_CHAINS];
    const float m = seed, c = 1e-4f;
    for (int i = 0; i < PLAIN_CHAINS; i++) a[i] = 0.001f * (float)i;
    for (uint64_t r = 0; r < iters; r++)
        for (int i = 0; i < PLAIN_CHAINS; i++) a[i] = a[i] * m + c;
    float s = 0;
    for (int i = 0; i < PLAIN_CHAINS; i++) s += a[i];
    volatile float sink = s;
    (void)sink;
    return (double)iters * PLAIN_CHAINS * 2.0;
}

typedef struct peak_job {
    fma_rounds_fn rounds;
    uint64_t iters;
    double flops;
} peak_job;

static void *peak_thread(void *p) {
    peak_job *j = p;
    j->flops = j->rounds(j->iters);
    return NULL;
}

/* Iterations of `rounds` that take ~15 ms, from a short probe. */
static uint64_t try_iters(fma_rounds_fn rounds) {
    uint64_t iters = 1u << 12;
    double t0 = cli_now_ms();
    rounds(iters);
    double ms = cli_now_ms() - t0;
    while (ms < 2.0 && iters < (1ull << 34)) {
        iters <<= 2;
        t0 = cli_now_ms();
        rounds(iters);
        ms = cli_now_ms() - t0;
    }
    return (uint64_t)((double)iters * 15.0 / (ms > 0 ? ms : 1.0)) + 1;
}

/* GFLOP/s of one try: `iters` rounds on each of `threads` threads at once. */
static double one_try(fma_rounds_fn rounds, uint64_t iters, int threads) {
    peak_job jobs[256];
    pthread_t tid[256];
    int started = 1;
    const double t0 = cli_now_ms();
    for (int i = 1; i < threads; i++) {
        jobs[i] = (peak_job){rounds, iters, 0.0};
        if (pthread_create(&tid[i], NULL, peak_thread, &jobs[i]) != 0) break;
        started++;
    }
    jobs[0] = (peak_job){rounds, iters, 0.0};
    peak_thread(&jobs[0]);
    double flops = jobs[0].flops;
    for (int i = 1; i < started; i++) {
        pthread_join(tid[i], NULL);
        flops += jobs[i].flops;
    }
    const double ms = cli_now_ms() - t0;
    return ms > 0 ? flops / (ms * 1e6) : 0.0;
}

/* The best of PEAK_TRIES tries of each of n kinds of rounds on `threads` threads, the
 * kinds' tries interleaved so that all see the same conditions (a clock or a neighbour's
 * load that changes during the calibration would otherwise favour one of them). */
static void peaks_of(const fma_rounds_fn *rounds, int n, int threads, double *best) {
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    uint64_t iters[2];
    for (int k = 0; k < n; k++) {
        iters[k] = try_iters(rounds[k]);
        best[k] = 0.0;
    }
    for (int attempt = 0; attempt < PEAK_TRIES; attempt++)
        for (int k = 0; k < n; k++) {
            const double g = one_try(rounds[k], iters[k], threads);
            if (g > best[k]) best[k] = g;
        }
}

bench_peak bench_fma_peak(int threads) {
    bench_peak p = {0.0, "scalar", 0.0};
    double best[2] = {0.0, 0.0};
#if defined(HAVE_X86_PEAK)
    int avx2, avx512;
    x86_vector_isa(&avx2, &avx512);
    if (avx512) {
        const fma_rounds_fn both[2] = {fma_rounds_avx512, fma_rounds_avx2};
        peaks_of(both, 2, threads, best);
        return (bench_peak){best[0], "AVX-512F", best[1]};
    }
    if (avx2) {
        const fma_rounds_fn one[1] = {fma_rounds_avx2};
        peaks_of(one, 1, threads, best);
        return (bench_peak){best[0], "AVX2+FMA", best[0]};
    }
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    const fma_rounds_fn one[1] = {fma_rounds_neon};
    peaks_of(one, 1, threads, best);
    return (bench_peak){best[0], "NEON", 0.0};
#endif
    const fma_rounds_fn plain[1] = {fma_rounds_plain};
    peaks_of(plain, 1, threads, best);
    p.gflops = best[0];
    return p;
}

/* Multiply-adds of one token's matrix products: per layer q, k, v, gate, out and the
 * lane-mixing rows; per engram site the key and value projections. */
static double layer_macs(const needle_model_info *in) {
    const double d = in->d_model, A = (double)in->num_heads * in->head_dim;
    const double kvd = (double)in->num_kv_heads * in->head_dim, nl = in->mhc_lanes;
    const double per_layer = 3 * A * d + 2 * kvd * d + (2 * nl + nl * nl) * nl * d;
    const double engram = 2.0 * in->num_engram_sites * d *
                          ((double)in->num_engram_tables * in->engram_sub_dim);
    return per_layer * in->num_layers + engram;
}

double bench_token_flops(const needle_model_info *in, uint32_t pos, uint32_t window,
                         int with_logits) {
    double fl = 2.0 * layer_macs(in);
    /* two unnormalised Walsh-Hadamard transforms per layer: n log2 n additions each */
    double lg = 0;
    for (uint32_t n = in->hada_n; n > 1; n >>= 1) lg += 1;
    fl += 2.0 * in->hada_n * lg * in->num_layers;
    /* attention: q.k and w*v over the positions this token sees */
    const double seen = window && pos + 1 > window ? window : pos + 1.0;
    fl += 4.0 * in->num_heads * in->head_dim * seen * in->num_layers;
    if (with_logits) fl += 2.0 * in->vocab * in->d_model;
    return fl;
}

double bench_attention_flops(const needle_model_info *in, uint32_t pos, uint32_t window) {
    const double seen = window && pos + 1 > window ? window : pos + 1.0;
    return 4.0 * in->num_heads * in->head_dim * seen * in->num_layers;
}

double bench_matmul_flops(const needle_model_info *in, int with_logits) {
    return 2.0 * layer_macs(in) + (with_logits ? 2.0 * in->vocab * in->d_model : 0.0);
}
