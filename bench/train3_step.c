/* needle-train-bench: tokens per second of whole training steps (forward, backward and the
 * AdamW update) on the training core (src/train), the fraction of the machine's FMA peak
 * (tools/bench_peak.c) its dense products reach, where the time goes (g3_profile) and the
 * peak RSS. Random weights at the scales of a trained model, random tokens, every position
 * in the loss.
 *
 *   needle-train-bench [--batch B] [--tokens T] [--steps S] [--threads N]
 *                      [--rank R] [--float] [--keep-mb M] | --full
 *
 * Default (LoRA): the released Needle 3 geometry (docs/spec/NEEDLE3.md §0: d 768, 20
 * layers, 12/2 heads, qk 48 / v 64, 4 lanes, 3 taps, 5 engram sites of 6 x 18432 x 128,
 * vocab 8192), an adapter of rank R (16) on q/k/v/gate/out, the exact fine-tuning numerics
 * (CQ W4 straight-through on the merged weights, A8 / int8 q/K/V; --float: none), as
 * g3_lora_prepare / g3_lora_step run it: the frozen CQ leaves quantized once (timed
 * apart, as a fine-tuning run pays it once), then per step the merge, the adapted
 * kernels' CQ, loss + gradient, dA / dB and AdamW on the adapter.
 * --full: full-parameter training on the default-model geometry of train/init3.py (d 384,
 * 10 layers, 6/2 heads, vocab 4096, 2 engram sites of 4096 slots) in float, the gradient
 * of every tensor and AdamW on all of them (what train/jax_throughput3.py times in JAX).
 * --keep-mb: the budget of layer activations kept instead of recomputed (g3_set_keep_budget;
 * 0: recompute every layer; default G3_KEEP_DEFAULT).
 * Defaults B 4, T 256, S 3; the figures are the median step. Figures only, no assertion. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_peak.h"
#include "cli.h"
#include "needle.h"
#include "quant/cq_codebook.h"
#include "train/checkpoint.h"
#include "train/grad3.h"
#include "train/lora3.h"
#include "train/optim.h"
#include "util/platform.h"

static const char RELEASED[] =
    "{\"vocab_size\": 8192, \"out_vocab\": 8192, \"d_model\": 768, \"num_heads\": 12, \"num_kv_heads\": 2,"
    " \"num_layers\": 20, \"qk_head_dim\": 48, \"v_head_dim\": 64, \"max_seq_len\": 8192,"
    " \"rope_theta\": 100000.0, \"sliding_window\": 1024, \"global_layers\": [4, 9, 14, 19],"
    " \"qkv_conv_taps\": 3, \"mhc_lanes\": 4, \"engram_orders\": [2, 3], \"engram_slots\": 18432,"
    " \"engram_layers\": [3, 7, 11, 15, 19]}";

/* train/init3.py GEOMETRY (the default model trained from scratch, issue 35) */
static const char DEMO[] =
    "{\"vocab_size\": 4096, \"out_vocab\": 4096, \"d_model\": 384, \"num_heads\": 6, \"num_kv_heads\": 2,"
    " \"num_layers\": 10, \"qk_head_dim\": 48, \"v_head_dim\": 64, \"max_seq_len\": 2048,"
    " \"rope_theta\": 100000.0, \"sliding_window\": 256, \"global_layers\": [4, 9],"
    " \"qkv_conv_taps\": 3, \"mhc_lanes\": 4, \"engram_orders\": [2, 3], \"engram_slots\": 4096,"
    " \"engram_layers\": [3, 7]}";

static uint64_t rng = 0x243F6A8885A308D3ull;
static float gauss(float sd) { /* sum of 4 uniforms: close enough to a normal for weights */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        s += (float)((rng >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
    }
    return s * 1.7320508f * sd;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void) { /* CPU seconds of every thread: what a busy shared machine does not inflate */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* tools/bench_peak.c times its loops with the CLI's clock (tools/cli.c, not linked here) */
double cli_now_ms(void) { return now() * 1e3; }

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(const char *what) {
    fprintf(stderr, "needle-train-bench: %s: %s\n", what, needle_last_error());
    return 1;
}

int main(int argc, char **argv) {
    int B = 4, T = 256, rank = 16, threads = 0, fl = 0, full = 0, steps = 3;
    long keep_mb = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--keep-mb") && i + 1 < argc) keep_mb = atol(argv[++i]);
        else if (!strcmp(argv[i], "--float")) fl = 1;
        else if (!strcmp(argv[i], "--full")) full = 1;
        else {
            fprintf(stderr, "usage: needle-train-bench [--batch B] [--tokens T] [--steps S] [--threads N] "
                            "[--rank R] [--float] [--keep-mb M] | --full\n");
            return 2;
        }
    }
    if (B < 1 || T < 2 || rank < 1 || steps < 1 || steps > 1000 || keep_mb < -1) {
        fprintf(stderr, "needle-train-bench: --batch >= 1, --tokens >= 2, --rank >= 1, --steps 1..1000, --keep-mb >= 0\n");
        return 2;
    }
    if (full) fl = 1;
    export3_config cfg;
    g3_model *m = NULL;
    const char *geo = full ? DEMO : RELEASED;
    if (export3_config_parse(geo, strlen(geo), &cfg)) return fail("config");
    if (g3_model_from_checkpoint(&cfg, NULL, &m) || g3_set_threads(m, threads)) return fail("model");
    if (keep_mb >= 0) g3_set_keep_budget(m, (size_t)keep_mb << 20);
    const uint32_t kept = g3_kept_layers(m, (uint32_t)T);
    /* weights at the scales of a trained model (stddev 0.02, norms and gates near 0,
     * taps near identity, Hadamard factors orthogonal-ish, mHC residual mix near n I) */
    const uint32_t lanes = cfg.mhc_lanes;
    for (uint32_t i = 0; i < g3_tensor_count(m); i++) {
        g3_tensor *t = g3_tensor_at(m, i);
        const char *last = strrchr(t->name, '/');
        last = last ? last + 1 : t->name;
        float sd = 0.02f;
        if (!strcmp(last, "w1a") || !strcmp(last, "w1b") || !strcmp(last, "w2a") || !strcmp(last, "w2b") ||
            !strcmp(last, "w3a") || !strcmp(last, "w3b"))
            sd = 1.0f / 5.0f;
        for (uint64_t k = 0; k < t->numel; k++) t->w[k] = gauss(sd);
        if (!strcmp(last, "d1") || !strcmp(last, "d2") || !strcmp(last, "d3") || !strncmp(last, "mhc_a_", 6))
            for (uint64_t k = 0; k < t->numel; k++) t->w[k] += 1.0f;
        if (!strcmp(last, "mhc_b_res"))
            for (uint64_t k = 0; k < t->numel; k++) t->w[k] += (k % (lanes + 1) == 0) ? (float)lanes : 0.0f;
    }
    /* the adapter: every q/k/v/gate/out kernel, A ~ N(0, 1) / r, B small and non-zero */
    const char *targets[] = {"q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"};
    train_adapter ad;
    memset(&ad, 0, sizeof ad);
    float **dA = NULL, **dB = NULL;
    if (!full) {
        ad.n = 5;
        ad.rank = rank;
        ad.scale = 2.0;
        ad.lora = calloc(5, sizeof *ad.lora);
        dA = calloc(5, sizeof *dA), dB = calloc(5, sizeof *dB);
        for (int k = 0; k < 5; k++) {
            char name[160];
            snprintf(name, sizeof name, "stack/layers/block/self_attn/%s/kernel", targets[k]);
            const g3_tensor *t = g3_find(m, name);
            train_lora *lo = &ad.lora[k];
            lo->path = strdup(name);
            lo->a.ndim = lo->b.ndim = 3;
            lo->a.shape[0] = lo->b.shape[0] = t->shape[0];
            lo->a.shape[1] = t->shape[1], lo->a.shape[2] = (uint64_t)rank;
            lo->b.shape[1] = (uint64_t)rank, lo->b.shape[2] = t->shape[2];
            lo->a.numel = t->shape[0] * t->shape[1] * (uint64_t)rank;
            lo->b.numel = t->shape[0] * (uint64_t)rank * t->shape[2];
            lo->a.data = malloc(lo->a.numel * sizeof(float));
            lo->b.data = malloc(lo->b.numel * sizeof(float));
            for (uint64_t q = 0; q < lo->a.numel; q++) lo->a.data[q] = gauss(1.0f / (float)rank);
            for (uint64_t q = 0; q < lo->b.numel; q++) lo->b.data[q] = gauss(0.001f);
            dA[k] = malloc(lo->a.numel * sizeof(float));
            dB[k] = malloc(lo->b.numel * sizeof(float));
        }
    }
    /* the optimizer's parameters: the adapter's A and B, or every tensor */
    const uint32_t np = full ? g3_tensor_count(m) : 2 * ad.n;
    char **names = calloc(np, sizeof *names);
    uint64_t *numel = calloc(np, sizeof *numel);
    float **params = calloc(np, sizeof *params), **grads = calloc(np, sizeof *grads);
    uint32_t used = 0;
    for (uint32_t i = 0; i < np; i++) {
        char name[200];
        if (full) {
            g3_tensor *t = g3_tensor_at(m, i);
            if (!t->numel) continue; /* no conv taps */
            snprintf(name, sizeof name, "%s", t->name);
            numel[used] = t->numel, params[used] = t->w, grads[used] = t->g;
        } else {
            train_lora *lo = &ad.lora[i / 2];
            snprintf(name, sizeof name, "lora/%s/%s", lo->path, i % 2 ? "B" : "A");
            numel[used] = i % 2 ? lo->b.numel : lo->a.numel;
            params[used] = i % 2 ? lo->b.data : lo->a.data;
            grads[used] = i % 2 ? dB[i / 2] : dA[i / 2];
        }
        names[used++] = strdup(name);
    }
    train_optim opt;
    const train_adamw_config oc = train_adamw_finetune(1e-4, 1000);
    if (train_optim_init(&opt, &oc, used, (const char *const *)names, numel)) return fail("optimizer");
    int32_t *ids = malloc((size_t)B * T * sizeof *ids);
    float *mask = malloc((size_t)B * T * sizeof *mask);
    for (size_t i = 0; i < (size_t)B * T; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 1 + (int32_t)((rng >> 33) % (cfg.vocab_size - 1));
        mask[i] = 1.0f;
    }
    cq_codebooks cb;
    if (cq_codebooks_init(&cb, G3_CQ_GROUP)) return 1;
    g3_set_fake_quant(m, !fl);
    g3_lora_prep *prep = NULL;
    double t_prep = 0;
    if (!full) {
        const double t0 = now();
        if (g3_lora_prepare(m, &ad, fl ? NULL : &cb, &prep)) return fail("prepare");
        t_prep = now() - t0;
    }
    double *secs = calloc((size_t)steps, sizeof *secs), *cpus = calloc((size_t)steps, sizeof *cpus), loss = 0,
           t_opt = 0;
    double prof[G3_PH_COUNT] = {0}, prof_cpu[G3_PH_COUNT] = {0}, prof_runs[G3_PH_COUNT] = {0};
    for (int s = 0; s < steps; s++) {
        g3_profile_reset(m);
        const double c0 = cpu_now();
        const double t0 = now();
        if (full ? g3_loss(m, ids, mask, (uint32_t)B, (uint32_t)T, 1, &loss)
                 : g3_lora_step(prep, &ad, ids, mask, (uint32_t)B, (uint32_t)T, &loss, dA, dB))
            return fail("step");
        const double t1 = now();
        if (train_optim_step(&opt, params, (const float *const *)grads, NULL)) return fail("update");
        secs[s] = now() - t0;
        cpus[s] = cpu_now() - c0;
        t_opt = now() - t1;
        const double *p = g3_profile(m);
        memcpy(prof, p, sizeof prof);
        memcpy(prof_cpu, g3_profile_cpu(m), sizeof prof_cpu);
        memcpy(prof_runs, g3_profile_runs(m), sizeof prof_runs);
        printf("  step %d: loss %.4f, %.2f s wall, %.2f s CPU\n", s + 1, loss, secs[s], cpus[s]);
    }
    double sorted[1000];
    memcpy(sorted, secs, (size_t)steps * sizeof *secs);
    qsort(sorted, (size_t)steps, sizeof *sorted, cmp_double);
    const double med = sorted[steps / 2];
    memcpy(sorted, cpus, (size_t)steps * sizeof *cpus);
    qsort(sorted, (size_t)steps, sizeof *sorted, cmp_double);
    const double med_cpu = sorted[steps / 2];
    memcpy(sorted, secs, (size_t)steps * sizeof *secs);
    qsort(sorted, (size_t)steps, sizeof *sorted, cmp_double);
    /* the dense products of one step: per layer q, k, v, gate (D x (Q+K+V+O)) and out
     * (O x D) forward, recomputed (the layers not kept), dX and dW; per engram site key and value (E x D each)
     * forward, value again in the backward, dX, and dW when trained; the logits (OV x D)
     * forward, dX, and dW when trained; LoRA: no dW of the layer kernels but the low-rank
     * route's four products of 2 x r x (in + out) per token (g3_set_low_rank), and the merge
     * (in x r x out) */
    const double D = cfg.d_model, H = cfg.num_heads, KV = cfg.num_kv_heads, qk = cfg.qk_head_dim,
                 vd = cfg.v_head_dim, L = cfg.num_layers;
    const double Q = H * qk, K = KV * qk, V = KV * vd, O = H * vd;
    const uint32_t heads_e = cfg.engram_heads ? cfg.engram_heads
                                              : ((uint32_t)D / (cfg.num_orders * 128) ? (uint32_t)D / (cfg.num_orders * 128) : 1);
    const double E = (double)((uint32_t)D / (cfg.num_orders * heads_e) * cfg.num_orders * heads_e);
    const double OV = cfg.out_vocab ? cfg.out_vocab : cfg.vocab_size;
    const double layer = D * (Q + K + V + O) + O * D, engram = cfg.num_sites * 2.0 * E * D, head = OV * D;
    const double tok = (double)B * T, rows = (double)B * (T - 1);
    double mac = ((full ? 3.0 : 2.0) * L + (L - kept)) * layer * tok + (full ? 3.5 : 2.5) * engram * tok +
                 (full ? 3.0 : 2.0) * head * rows;
    if (!full) mac += L * rank * layer + L * tok * 2.0 * rank * (5.0 * D + Q + K + V + 2.0 * O);
    const double flop = 2.0 * mac;
    const bench_peak pk = bench_fma_peak(threads > 0 ? threads : 2);
    if (full)
        printf("needle-train-bench: full-parameter training, train/init3.py geometry (d %u, %u layers), float, "
               "batch %dx%d, %d thread(s), %d step(s)\n", cfg.d_model, cfg.num_layers, B, T, threads, steps);
    else
        printf("needle-train-bench: released Needle 3 geometry, LoRA r=%d, %s, batch %dx%d, %d thread(s), %d step(s)\n",
               rank, fl ? "float" : "CQ W4 STE + A8 + int8 K/V", B, T, threads, steps);
    printf("  layers whose activations are kept (not recomputed): %u of %u\n", kept, cfg.num_layers);
    if (!full) printf("  once per run: the frozen CQ leaves quantized (g3_lora_prepare) %.2f s\n", t_prep);
    printf("  step (forward + backward + AdamW on %u tensors): median %.2f s (min %.2f, max %.2f), %.1f tok/s\n", used,
           med, sorted[0], sorted[steps - 1], tok / med);
    printf("  CPU time per step (all threads): median %.2f s = %.1f tok per CPU-second\n", med_cpu, tok / med_cpu);
    printf("  dense products ~%.1f GFLOP per step: %.2f GFLOP/s = %.1f%% of the %s FMA peak (%.1f GFLOP/s)\n",
           flop / 1e9, flop / 1e9 / med, 100.0 * flop / 1e9 / med / pk.gflops, pk.isa, pk.gflops);
    printf("  peak RSS %.0f MiB\n", platform_peak_rss_mb());
    printf("  profile of the last step (wall s, %% of it; CPU s of all threads; pool dispatches):\n");
    double in_prof = 0;
    for (int p = 0; p < G3_PH_COUNT; p++) in_prof += prof[p];
    for (int p = 0; p < G3_PH_COUNT; p++)
        if (prof[p] > 0.0005)
            printf("    %-34s %8.3f  %5.1f%%  %8.3f  %7.0f\n", g3_profile_name(p), prof[p],
                   100.0 * prof[p] / secs[steps - 1], prof_cpu[p], prof_runs[p]);
    printf("    %-34s %8.3f  %5.1f%%\n", "AdamW update", t_opt, 100.0 * t_opt / secs[steps - 1]);
    (void)in_prof;
    g3_lora_finish(prep);
    train_optim_release(&opt);
    for (uint32_t i = 0; i < used; i++) free(names[i]);
    free(names), free(numel), free(params), free(grads), free(secs), free(cpus);
    for (uint32_t k = 0; k < ad.n; k++) {
        free(dA[k]);
        free(dB[k]);
    }
    free(dA);
    free(dB);
    if (!full) train_adapter_release(&ad);
    free(ids);
    free(mask);
    g3_model_free(m);
    return 0;
}
