/* bench_peak.c: the float multiply-add peak `needle bench` measures on this machine, and
 * the floating-point work of a Needle 2 forward pass, so that the bench can print every
 * speed as a fraction of what the hardware does.
 *
 * Peak: independent chains of vector FMAs (ten accumulators, more than latency x
 * throughput on current cores), AVX2+FMA on x86-64 CPUs that have it, NEON on aarch64,
 * else plain float multiply and add (2 flops per lane), run on T threads at once for
 * about 25 ms, four times; the best flops / wall time. On a busy machine the phases'
 * figures drop and the peak may not, so the fractions are then lower bounds. */
#include <pthread.h>
#include <stdint.h>

#include "bench_peak.h"
#include "cli.h"

#define CHAINS 10
#define PEAK_TRIES 4 /* of ~25 ms each */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_PEAK 1
/* flops of `iters` rounds of CHAINS 8-lane FMAs */
__attribute__((target("avx2,fma"))) static double fma_rounds_avx2(uint64_t iters) {
    __m256 a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps(0.001f * (float)i);
    const __m256 m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
    for (uint64_t r = 0; r < iters; r++) {
        for (int i = 0; i < CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
        __asm__ volatile("" : "+x"(a[0]), "+x"(a[3]), "+x"(a[6]), "+x"(a[9]));
    }
    __m256 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm256_add_ps(s, a[i]);
    volatile float sink = _mm256_cvtss_f32(s);
    (void)sink;
    return (double)iters * CHAINS * 16.0;
}
#elif defined(__aarch64__)
#include <arm_neon.h>
static double fma_rounds_neon(uint64_t iters) {
    float32x4_t a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = vdupq_n_f32(0.001f * (float)i);
    const float32x4_t m = vdupq_n_f32(0.9999f), c = vdupq_n_f32(1e-4f);
    for (uint64_t r = 0; r < iters; r++) {
        for (int i = 0; i < CHAINS; i++) a[i] = vfmaq_f32(c, a[i], m);
        __asm__ volatile("" : "+w"(a[0]), "+w"(a[3]), "+w"(a[6]), "+w"(a[9]));
    }
    float32x4_t s = a[0];
    for (int i = 1; i < CHAINS; i++) s = vaddq_f32(s, a[i]);
    volatile float sink = vgetq_lane_f32(s, 0);
    (void)sink;
    return (double)iters * CHAINS * 8.0;
}
#endif

static double fma_rounds_plain(uint64_t iters) {
    volatile float seed = 0.9999f;
    float a[CHAINS];
    const float m = seed, c = 1e-4f;
    for (int i = 0; i < CHAINS; i++) a[i] = 0.001f * (float)i;
    for (uint64_t r = 0; r < iters; r++)
        for (int i = 0; i < CHAINS; i++) a[i] = a[i] * m + c;
    float s = 0;
    for (int i = 0; i < CHAINS; i++) s += a[i];
    volatile float sink = s;
    (void)sink;
    return (double)iters * CHAINS * 2.0;
}

static double fma_rounds(uint64_t iters) {
#if defined(HAVE_AVX2_PEAK)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return fma_rounds_avx2(iters);
#elif defined(__aarch64__)
    return fma_rounds_neon(iters);
#endif
    return fma_rounds_plain(iters);
}

typedef struct peak_job {
    uint64_t iters;
    double flops;
} peak_job;

static void *peak_thread(void *p) {
    peak_job *j = p;
    j->flops = fma_rounds(j->iters);
    return NULL;
}

double bench_fma_peak_gflops(int threads) {
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    /* size the run to ~50 ms from a short probe */
    uint64_t iters = 1u << 14;
    double t0 = cli_now_ms();
    fma_rounds(iters);
    double ms = cli_now_ms() - t0;
    while (ms < 5.0 && iters < (1ull << 34)) {
        iters <<= 2;
        t0 = cli_now_ms();
        fma_rounds(iters);
        ms = cli_now_ms() - t0;
    }
    iters = (uint64_t)((double)iters * 25.0 / (ms > 0 ? ms : 1.0)) + 1;
    /* the best of a few tries: what the hardware does when this process has the cores */
    double best = 0.0;
    for (int attempt = 0; attempt < PEAK_TRIES; attempt++) {
        peak_job jobs[256];
        pthread_t tid[256];
        int started = 1;
        t0 = cli_now_ms();
        for (int i = 1; i < threads; i++) {
            jobs[i].iters = iters;
            jobs[i].flops = 0;
            if (pthread_create(&tid[i], NULL, peak_thread, &jobs[i]) != 0) break;
            started++;
        }
        jobs[0].iters = iters;
        peak_thread(&jobs[0]);
        double flops = jobs[0].flops;
        for (int i = 1; i < started; i++) {
            pthread_join(tid[i], NULL);
            flops += jobs[i].flops;
        }
        ms = cli_now_ms() - t0;
        const double gflops = ms > 0 ? flops / (ms * 1e6) : 0.0;
        if (gflops > best) best = gflops;
    }
    return best;
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
