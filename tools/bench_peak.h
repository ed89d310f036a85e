/* bench_peak.h: the machine's measured FMA peak and the flop counts of a Needle 2 forward
 * pass, for `needle bench` (tools/bench.c). */
#ifndef NEEDLE_TOOLS_BENCH_PEAK_H
#define NEEDLE_TOOLS_BENCH_PEAK_H

#include <stdint.h>

#include "needle.h"

/* The machine's float FMA peak on `threads` threads at once (see bench_peak.c). */
typedef struct bench_peak {
    double gflops;      /* GFLOP/s of the widest vector ISA the CPU and OS support */
    const char *isa;    /* that ISA: "AVX-512F", "AVX2+FMA", "NEON" or "scalar" */
    double avx2_gflops; /* x86 with AVX2: its peak (what the kernels use today; below
                         * gflops where AVX-512F is there); 0 elsewhere */
} bench_peak;

bench_peak bench_fma_peak(int threads);

/* Flops of one token at position `pos` (attention over min(pos + 1, window) positions,
 * window 0 = all), with or without the tied output projection. */
double bench_token_flops(const needle_model_info *info, uint32_t pos, uint32_t window,
                         int with_logits);

/* The parts of that: attention (q.k and w*v) alone, and the matrix products alone (the
 * per-layer and engram projections, plus the output projection if with_logits). */
double bench_attention_flops(const needle_model_info *info, uint32_t pos, uint32_t window);
double bench_matmul_flops(const needle_model_info *info, int with_logits);

#endif
