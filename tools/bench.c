/* bench.c: `needle bench`, the engine's speed on one model: load time, time to first
 * token, prefill and greedy-decode tokens per second (medians over runs), peak RSS,
 * where the forward time goes (needle_session_stats' per-operation profile), and the
 * achieved GFLOP/s of each phase and of the matrix products and attention beside the
 * machine's measured FMA peak (bench_peak.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_peak.h"
#include "compat.h"
#include "cli.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The operations of needle_session_stats' profile, in the order bench prints them. */
#define PROFILE_OPS 9
static const char *const profile_names[PROFILE_OPS] = {
    "matmul", "attention", "mhc", "hadamard", "engram", "logits", "embed", "sync", "other"};

/* prof[k] += the profile of (b - a); "other" is the forward time no operation accounts for
 * (RoPE angles, bookkeeping). */
static void profile_add(double *prof, const needle_session_stats *a,
                        const needle_session_stats *b) {
    const double v[PROFILE_OPS - 1] = {
        b->matmul_ms - a->matmul_ms, b->attention_ms - a->attention_ms, b->mhc_ms - a->mhc_ms,
        b->hadamard_ms - a->hadamard_ms, b->engram_ms - a->engram_ms,
        b->logits_ms - a->logits_ms, b->embed_ms - a->embed_ms, b->sync_ms - a->sync_ms};
    double sum = 0;
    for (int k = 0; k < PROFILE_OPS - 1; k++) {
        prof[k] += v[k];
        sum += v[k];
    }
    const double other = (b->forward_ms - a->forward_ms) - sum;
    prof[PROFILE_OPS - 1] += other > 0 ? other : 0;
}

/* Prefill of a synthetic prompt (BOS + fixed pseudo-random ids), then greedy decode of
 * --gen tokens one at a time, repeated --runs times on one session (reset between runs);
 * reports medians. */
static int run_bench(const cli_command *self, int argc, char **argv) {
    const char *weights = NULL;
    long prompt_len = 256, gen = 64, threads = 0, runs = 5;
    int json = 0, kv_type = NEEDLE_KV_F32;
    const cli_option opts[] = {
        {"--weights", "-w", CLI_TEXT, &weights, 0, 0, NULL},
        {"--prompt-len", NULL, CLI_LONG, &prompt_len, 1, 1L << 20, NULL},
        {"--gen", "-n", CLI_LONG, &gen, 0, 1L << 20, NULL},
        {"--threads", NULL, CLI_LONG, &threads, 0, 256, NULL},
        {"--runs", NULL, CLI_LONG, &runs, 1, 1000, NULL},
        {"--json", NULL, CLI_FLAG, &json, 0, 0, NULL},
        {"--kv", NULL, CLI_KV, &kv_type, 0, 0, NULL},
        {0}};
    const int st = cli_parse(self, argc, argv, opts, NULL, 0);
    if (st != CLI_GO) return st;
    cli_default_weights(&weights);
    if (!weights) return cli_no_weights();

    needle_model_params mp = needle_model_default_params();
    mp.n_threads = (int32_t)threads;
    double t0 = cli_now_ms();
    needle_model *m;
    int rc = needle_model_open(weights, &mp, &m);
    if (rc) return cli_lib_error(weights, rc);
    const double load_ms = cli_now_ms() - t0;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    if ((uint64_t)prompt_len + (uint64_t)gen > info.max_seq_len) {
        needle_model_free(m);
        return cli_usage_error(self, "--prompt-len + --gen (%ld) exceed the model's context (%u)",
                               prompt_len + gen, info.max_seq_len);
    }
    t0 = cli_now_ms();
    needle_session *s;
    needle_session_params sp = needle_session_default_params();
    sp.kv_type = kv_type;
    if ((rc = needle_session_create(m, &sp, &s))) {
        needle_model_free(m);
        return cli_lib_error("session", rc);
    }
    const double session_ms = cli_now_ms() - t0;
    needle_session_stats kv_stats = {.size = sizeof kv_stats};
    const double kv_mb = needle_session_get_stats(s, &kv_stats) == NEEDLE_OK
                             ? (double)kv_stats.kv_bytes / 1e6 : 0.0;

    int32_t *ids = malloc((size_t)prompt_len * sizeof *ids);
    double *prefill = malloc((size_t)runs * sizeof *prefill);
    double *ttft = malloc((size_t)runs * sizeof *ttft);
    double *decode = malloc((size_t)runs * sizeof *decode);
    if (!ids || !prefill || !ttft || !decode) {
        rc = cli_lib_error("bench", NEEDLE_ERR_OUT_OF_MEMORY);
        goto done;
    }
    uint32_t state = 0x2545F491u;
    for (long i = 0; i < prompt_len; i++) {
        state = state * 1664525u + 1013904223u;
        const uint32_t lo_id = info.vocab > 512 ? 300 : 0;
        ids[i] = i == 0 ? NEEDLE_TOKEN_BOS : (int32_t)(lo_id + (state >> 8) % (info.vocab - lo_id));
    }
    int32_t last = 0;
    /* per-operation profile, summed over the runs: [0] prefill, [1] decode */
    double prof[2][PROFILE_OPS] = {{0}};
    /* thread hand-offs (pool dispatches, their cost to the caller) and forward time */
    double handoffs[2] = {0, 0}, handoff_ms[2] = {0, 0}, phase_ms[2] = {0, 0};
    needle_session_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1},
                         st2 = {.size = sizeof st2};
    for (long r = 0; r < runs; r++) {
        needle_session_reset(s);
        needle_session_get_stats(s, &st0);
        t0 = cli_now_ms();
        if ((rc = needle_session_eval(s, ids, (size_t)prompt_len, NULL, 0))) {
            rc = cli_lib_error("prefill", rc);
            goto done;
        }
        const double t_prefill = cli_now_ms() - t0;
        const float *lg = needle_session_logits(s);
        int32_t tok = 0;
        for (uint32_t v = 1; v < info.vocab; v++)
            if (lg[v] > lg[tok]) tok = (int32_t)v;
        ttft[r] = cli_now_ms() - t0;
        prefill[r] = (double)prompt_len / (t_prefill / 1000.0);
        needle_session_get_stats(s, &st1);
        t0 = cli_now_ms();
        for (long g = 0; g < gen; g++) {
            if ((rc = needle_session_eval(s, &tok, 1, NULL, 0))) {
                rc = cli_lib_error("decode", rc);
                goto done;
            }
            lg = needle_session_logits(s);
            tok = 0;
            for (uint32_t v = 1; v < info.vocab; v++)
                if (lg[v] > lg[tok]) tok = (int32_t)v;
        }
        const double t_decode = cli_now_ms() - t0;
        decode[r] = gen ? (double)gen / (t_decode / 1000.0) : 0.0;
        last = tok;
        needle_session_get_stats(s, &st2);
        profile_add(prof[0], &st0, &st1);
        profile_add(prof[1], &st1, &st2);
        handoffs[0] += (double)(st1.pool_dispatches - st0.pool_dispatches);
        handoffs[1] += (double)(st2.pool_dispatches - st1.pool_dispatches);
        handoff_ms[0] += st1.pool_sync_ms - st0.pool_sync_ms;
        handoff_ms[1] += st2.pool_sync_ms - st1.pool_sync_ms;
        phase_ms[0] += st1.forward_ms - st0.forward_ms;
        phase_ms[1] += st2.forward_ms - st1.forward_ms;
    }
    /* the pool's thread count as the library picks it (cpu_pool_create) */
    long used = threads;
    if (!used) {
        const char *env = getenv("NEEDLE_THREADS");
        used = env && *env ? strtol(env, NULL, 10) : compat_cpu_count();
        if (used < 1) used = 1;
    }
    const bench_peak pk1 = bench_fma_peak(1);
    const bench_peak pk = used > 1 ? bench_fma_peak((int)used) : pk1;
    const double peak = pk.gflops, peak1 = pk1.gflops;
    /* flops of one run's prefill (output projection for the last token only) and decode */
    double fl[2] = {0, 0}, fl_mm[2] = {0, 0}, fl_att[2] = {0, 0};
    for (long i = 0; i < prompt_len + gen; i++) {
        const int phase = i >= prompt_len, logits = phase || i == prompt_len - 1;
        fl[phase] += bench_token_flops(&info, (uint32_t)i, info.kv_window, logits);
        fl_mm[phase] += bench_matmul_flops(&info, 0);
        fl_att[phase] += bench_attention_flops(&info, (uint32_t)i, info.kv_window);
    }
    const double rss_mb = compat_peak_rss_mb();
    const double med_prefill = median(prefill, (int)runs), med_ttft = median(ttft, (int)runs);
    const double med_decode = median(decode, (int)runs);
    /* GFLOP/s = flops / ms / 1e6 */
    const double gf_prefill = med_prefill > 0 ? fl[0] / ((double)prompt_len / med_prefill * 1e3) / 1e6 : 0;
    const double gf_decode = med_decode > 0 && gen ? fl[1] / ((double)gen / med_decode * 1e3) / 1e6 : 0;
    double gf_mm[2], gf_att[2];
    for (int phase = 0; phase < 2; phase++) {
        const double mm_ms = prof[phase][0] / (double)runs, att_ms = prof[phase][1] / (double)runs;
        gf_mm[phase] = mm_ms > 0 ? fl_mm[phase] / mm_ms / 1e6 : 0;
        gf_att[phase] = att_ms > 0 ? fl_att[phase] / att_ms / 1e6 : 0;
    }
    if (json) {
        printf("{\"weights\":");
        cli_json_string(stdout, weights);
        printf(",\"prompt_len\":%ld,\"gen\":%ld,\"runs\":%ld,\"threads\":%ld,"
               "\"load_ms\":%.2f,\"session_ms\":%.2f,\"ttft_ms\":%.2f,\"prefill_tok_s\":%.1f,"
               "\"decode_tok_s\":%.1f,\"peak_rss_mb\":%.1f,\"last_token\":%d",
               prompt_len, gen, runs, threads, load_ms, session_ms, med_ttft,
               med_prefill, med_decode, rss_mb, last);
        printf(",\"kv\":\"%s\"", kv_type == NEEDLE_KV_INT8 ? "int8" : kv_type == NEEDLE_KV_F16 ? "f16" : "f32");
        printf(",\"kv_mb\":%.3f", kv_mb);
        printf(",\"fma_peak_isa\":\"%s\",\"fma_peak_avx2_gflops\":%.2f,"
               "\"fma_peak_avx2_1t_gflops\":%.2f",
               pk.isa, pk.avx2_gflops, pk1.avx2_gflops);
        printf(",\"threads_used\":%ld,\"fma_peak_gflops\":%.2f,\"fma_peak_1t_gflops\":%.2f,"
               "\"prefill_gflops\":%.2f,\"decode_gflops\":%.2f,\"matmul_gflops\":[%.2f,%.2f],"
               "\"attention_gflops\":[%.2f,%.2f]",
               used, peak, peak1, gf_prefill, gf_decode, gf_mm[0], gf_mm[1], gf_att[0], gf_att[1]);
        printf(",\"handoffs_per_token\":[%.2f,%.2f],\"handoff_ms\":[%.3f,%.3f]",
               handoffs[0] / (double)runs / (double)prompt_len,
               gen ? handoffs[1] / (double)runs / (double)gen : 0.0, handoff_ms[0] / (double)runs,
               handoff_ms[1] / (double)runs);
        /* per-operation ms per run (means over the runs) */
        for (int phase = 0; phase < 2; phase++) {
            printf(",\"profile_%s_ms\":{", phase ? "decode" : "prefill");
            for (int k = 0; k < PROFILE_OPS; k++)
                printf("%s\"%s\":%.3f", k ? "," : "", profile_names[k],
                       prof[phase][k] / (double)runs);
            printf("}");
        }
        printf("}\n");
    } else {
        printf("model      %s (%u layers, d %u, vocab %u)\n", weights, info.num_layers,
               info.d_model, info.vocab);
        if (threads) printf("threads    %ld\n", threads);
        else printf("threads    NEEDLE_THREADS or the online cores\n");
        printf("load       %.1f ms (+ session %.1f ms)\n", load_ms, session_ms);
        printf("kv cache   %.2f MB reserved (%u positions)\n", kv_mb, info.max_seq_len);
        printf("ttft       %.1f ms for a %ld-token prompt\n", med_ttft, prompt_len);
        printf("prefill    %.1f tok/s\n", med_prefill);
        printf("decode     %.1f tok/s (%ld tokens)\n", med_decode, gen);
        printf("peak rss   %.1f MiB\n", rss_mb);
        printf("medians of %ld runs\n", runs);
        printf("\nfma peak   %.1f GFLOP/s %s on %ld threads (%.1f on one), measured now\n", peak,
               pk.isa, used, peak1);
        if (pk.avx2_gflops > 0 && strcmp(pk.isa, "AVX2+FMA") != 0)
            printf("           %.1f GFLOP/s AVX2+FMA (%.1f on one): decode attention's width; the\n"
                   "           rest uses AVX-512F unless NEEDLE_CPU=avx2\n",
                   pk.avx2_gflops, pk1.avx2_gflops);
        printf("  %-10s %18s %18s\n", "GFLOP/s", "prefill", "decode");
        printf("  %-10s %10.2f (%4.1f%%) %10.2f (%4.1f%%)\n", "forward", gf_prefill,
               peak > 0 ? 100 * gf_prefill / peak : 0, gf_decode, peak > 0 ? 100 * gf_decode / peak : 0);
        printf("  %-10s %10.2f (%4.1f%%) %10.2f (%4.1f%%)\n", "matmul", gf_mm[0],
               peak > 0 ? 100 * gf_mm[0] / peak : 0, gf_mm[1], peak > 0 ? 100 * gf_mm[1] / peak : 0);
        printf("  %-10s %10.2f (%4.1f%%) %10.2f (%4.1f%%)\n", "attention", gf_att[0],
               peak > 0 ? 100 * gf_att[0] / peak : 0, gf_att[1], peak > 0 ? 100 * gf_att[1] / peak : 0);
        printf("  (forward: every flop of the phase over its wall time; matmul, attention: their\n"
               "   flops over their profiled time; %% of the first FMA peak)\n");
        printf("\nthread hand-off (pool dispatches; their cost to the calling thread beyond its\n"
               "own share of the work: publishing, then waiting for the workers)\n");
        for (int phase = 0; phase < 2; phase++) {
            const double toks = phase ? (double)gen : (double)prompt_len;
            const double n = handoffs[phase] / (double)runs, ms = handoff_ms[phase] / (double)runs;
            printf("  %-8s %8.0f dispatches (%.1f per token), %.2f ms = %.1f us each, %.1f%% of "
                   "the forward time\n", phase ? "decode" : "prefill", n, toks > 0 ? n / toks : 0,
                   ms, n > 0 ? 1000 * ms / n : 0,
                   phase_ms[phase] > 0 ? 100 * handoff_ms[phase] / phase_ms[phase] : 0);
        }
        printf("\nprofile (ms per run, share of the forward pass)\n");
        printf("  %-10s %18s %18s\n", "operation", "prefill", "decode");
        double tot[2] = {0, 0};
        for (int k = 0; k < PROFILE_OPS; k++)
            for (int phase = 0; phase < 2; phase++) tot[phase] += prof[phase][k];
        for (int k = 0; k < PROFILE_OPS; k++) {
            printf("  %-10s", profile_names[k]);
            for (int phase = 0; phase < 2; phase++)
                printf(" %10.2f (%4.1f%%)", prof[phase][k] / (double)runs,
                       tot[phase] > 0 ? 100.0 * prof[phase][k] / tot[phase] : 0.0);
            printf("\n");
        }
    }
done:
    free(ids);
    free(prefill);
    free(ttft);
    free(decode);
    needle_session_free(s);
    needle_model_free(m);
    return rc ? 1 : 0;
}

const cli_command cli_bench = {
    "bench", "load time, time to first token, prefill and decode tok/s, peak RSS",
    "usage: needle bench [--weights FILE] [options]\n"
    "\n"
    "Times the model on a synthetic prompt (BOS + fixed pseudo-random ids): load, session\n"
    "creation, prefill (and the first token), then greedy decode one token at a time;\n"
    "repeated --runs times on one session, reset between runs. Prints the medians, the\n"
    "peak RSS, a per-operation profile of prefill and decode, and the achieved GFLOP/s\n"
    "(whole phase, matrix products, attention) beside the machine's FMA peak, the\n"
    "percentages against it.\n"
    "\n"
    "The peak: independent chains of vector FMAs in assembly (every chain in a register,\n"
    "more chains than latency x throughput needs) in the widest vector ISA the CPU and OS\n"
    "support, which it names (AVX-512F, AVX2+FMA, NEON, else scalar), run on the same\n"
    "threads; the best of six ~15 ms tries. On an AVX-512 CPU it also prints the AVX2+FMA\n"
    "peak: at the avx512 kernel level the CQ products, prefill attention and lane ops\n"
    "use AVX-512F, decode attention AVX2+FMA; NEEDLE_CPU=avx2 keeps all on AVX2 (JSON:\n"
    "fma_peak_isa, fma_peak_gflops, fma_peak_avx2_gflops, and *_1t_* for one thread).\n"
    "On a busy machine the phases slow down more than the peak, so the fractions are\n"
    "lower bounds.\n"
    "\n"
    "options:\n"
    CLI_WEIGHTS_HELP
    "  --prompt-len N          prompt tokens (default 256)\n"
    "  -n, --gen N             tokens to decode (default 64)\n"
    "  --threads N             pool threads (default 0: $NEEDLE_THREADS, else the online\n"
    "                          cores)\n"
    "  --runs N                repetitions (default 5)\n"
    "  --json                  one JSON object on stdout instead of the table\n"
    "  --kv f32|f16|int8       KV cache precision (default f32)\n"
    "  -h, --help              this text\n",
    run_bench};
