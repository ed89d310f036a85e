/* bench_peak.h: the machine's measured FMA peak and the flop counts of a Needle 2 forward
 * pass, for `needle bench` (tools/bench.c). */
#ifndef NEEDLE_TOOLS_BENCH_PEAK_H
#define NEEDLE_TOOLS_BENCH_PEAK_H

#include <stdint.h>

#include "needle.h"

/* GFLOP/s of float multiply-add chains run on `threads` threads at once: the best of four
 * ~25 ms tries. */
double bench_fma_peak_gflops(int threads);

/* Flops of one token at position `pos` (attention over min(pos + 1, window) positions,
 * window 0 = all), with or without the tied output projection. */
double bench_token_flops(const needle_model_info *info, uint32_t pos, uint32_t window,
                         int with_logits);

/* The parts of that: attention (q.k and w*v) alone, and the matrix products alone (the
 * per-layer and engram projections, plus the output projection if with_logits). */
double bench_attention_flops(const needle_model_info *info, uint32_t pos, uint32_t window);
double bench_matmul_flops(const needle_model_info *info, int with_logits);

#endif
