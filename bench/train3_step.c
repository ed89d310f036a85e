/* needle-train-bench: tokens per second of one LoRA training step's loss and gradient on
 * the training core (src/train) for the released Needle 3 geometry (docs/spec/NEEDLE3.md
 * §0: d 768, 20 layers, 12/2 heads, qk 48 / v 64, 4 lanes, 3 taps, 5 engram sites of
 * 6 x 18432 x 128, vocab 8192) with random weights at the released shapes, and the
 * fraction of the machine's FMA peak (tools/bench_peak.c) the dense products reach.
 *
 *   needle-train-bench [--batch B] [--tokens T] [--rank R] [--threads N] [--float]
 *
 * Default: B 4, T 256, rank 16, the exact fine-tuning numerics (CQ W4 straight-through on
 * the merged weights, A8 / int8 q/K/V); --float: float weights and activations. The
 * adapter update (AdamW) is not part of the step yet. Figures only, no assertion. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_peak.h"
#include "cli.h"
#include "quant/cq_codebook.h"
#include "train/checkpoint.h"
#include "train/grad3.h"
#include "needle.h"
#include "train/lora3.h"

static const char RELEASED[] =
    "{\"vocab_size\": 8192, \"out_vocab\": 8192, \"d_model\": 768, \"num_heads\": 12, \"num_kv_heads\": 2,"
    " \"num_layers\": 20, \"qk_head_dim\": 48, \"v_head_dim\": 64, \"max_seq_len\": 8192,"
    " \"rope_theta\": 100000.0, \"sliding_window\": 1024, \"global_layers\": [4, 9, 14, 19],"
    " \"qkv_conv_taps\": 3, \"mhc_lanes\": 4, \"engram_orders\": [2, 3], \"engram_slots\": 18432,"
    " \"engram_layers\": [3, 7, 11, 15, 19]}";

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

/* tools/bench_peak.c times its loops with the CLI's clock (tools/cli.c, not linked here) */
double cli_now_ms(void) { return now() * 1e3; }

int main(int argc, char **argv) {
    int B = 4, T = 256, rank = 16, threads = 0, fl = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--float")) fl = 1;
        else {
            fprintf(stderr, "usage: needle-train-bench [--batch B] [--tokens T] [--rank R] [--threads N] [--float]\n");
            return 2;
        }
    }
    if (B < 1 || T < 2 || rank < 1) {
        fprintf(stderr, "needle-train-bench: --batch >= 1, --tokens >= 2, --rank >= 1\n");
        return 2;
    }
    export3_config cfg;
    g3_model *m = NULL;
    if (export3_config_parse(RELEASED, strlen(RELEASED), &cfg) || g3_model_from_checkpoint(&cfg, NULL, &m) ||
        g3_set_threads(m, threads)) {
        fprintf(stderr, "needle-train-bench: %s\n", needle_last_error());
        return 1;
    }
    /* weights at the scales of a trained model (stddev 0.02, norms and gates near 0,
     * taps near identity, Hadamard factors orthogonal-ish, mHC residual mix near 4 I) */
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
            for (uint64_t k = 0; k < t->numel; k++) t->w[k] += (k % 5 == 0) ? 4.0f : 0.0f; /* 4 I, n = 4 */
    }
    /* the adapter: every q/k/v/gate/out kernel, A ~ N(0, 1) / r, B small and non-zero */
    const char *targets[] = {"q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"};
    train_adapter ad;
    memset(&ad, 0, sizeof ad);
    ad.n = 5;
    ad.rank = rank;
    ad.scale = 2.0;
    ad.lora = calloc(5, sizeof *ad.lora);
    float **dA = calloc(5, sizeof *dA), **dB = calloc(5, sizeof *dB);
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
    int32_t *ids = malloc((size_t)B * T * sizeof *ids);
    float *mask = malloc((size_t)B * T * sizeof *mask);
    for (size_t i = 0; i < (size_t)B * T; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 1 + (int32_t)((rng >> 33) % 8191);
        mask[i] = 1.0f;
    }
    cq_codebooks cb;
    if (cq_codebooks_init(&cb, G3_CQ_GROUP)) return 1;
    g3_set_fake_quant(m, !fl);
    double loss = 0;
    g3_profile_reset(m);
    const double t0 = now();
    if (g3_lora_loss(m, &ad, fl ? NULL : &cb, ids, mask, (uint32_t)B, (uint32_t)T, &loss, dA, dB)) {
        fprintf(stderr, "needle-train-bench: %s\n", needle_last_error());
        return 1;
    }
    const double secs = now() - t0;
    /* the dense products of one token: per layer q, k, v, gate (D x (Q+K+V+O)) and out
     * (O x D), per engram site key and value (E x D each), the logits (OV x D); forward,
     * recomputation and two backward products each (the logits are not recomputed) */
    const double D = 768, Q = 12 * 48, K = 2 * 48, V = 2 * 64, O = 12 * 64, E = 6 * 128;
    const double layer = D * (Q + K + V + O) + O * D + 4.0 * 3072 * 24, engram = 5 * 2 * E * D, head = 8192 * D;
    const double flop = 2.0 * (4.0 * (20 * layer + engram) + 3.0 * head) * (double)B * (double)T;
    const bench_peak pk = bench_fma_peak(threads > 0 ? threads : 2);
    printf("needle-train-bench: released Needle 3 geometry, LoRA r=%d, %s, batch %dx%d, %d thread(s)\n", rank,
           fl ? "float" : "CQ W4 STE + A8 + int8 K/V", B, T, threads);
    printf("  loss %.4f, step (loss + gradient, no optimizer) %.2f s, %.1f tok/s\n", loss, secs,
           (double)B * T / secs);
    printf("  dense products ~%.1f GFLOP: %.2f GFLOP/s = %.1f%% of the %s FMA peak (%.1f GFLOP/s)\n", flop / 1e9,
           flop / 1e9 / secs, 100.0 * flop / 1e9 / secs / pk.gflops, pk.isa, pk.gflops);
    const double *prof = g3_profile(m);
    printf("  profile of the step (wall s, %% of the step):\n");
    for (int p = 0; p < G3_PH_COUNT; p++)
        if (prof[p] > 0.0005) printf("    %-34s %8.3f  %5.1f%%\n", g3_profile_name(p), prof[p], 100.0 * prof[p] / secs);
    for (int k = 0; k < 5; k++) {
        free(dA[k]);
        free(dB[k]);
    }
    free(dA);
    free(dB);
    train_adapter_release(&ad);
    free(ids);
    free(mask);
    g3_model_free(m);
    return 0;
}
