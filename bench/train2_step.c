/* needle-train2-bench: tokens per second of one Needle 2 training step (loss, gradient and
 * the AdamW update as optax computes it) on the training core (src/train/grad2.c), with a
 * .cact's weights as the base (records dequantized as the runtime reads them), and the
 * fraction of the machine's FMA peak (tools/bench_peak.c) its dense products reach.
 *
 *   needle-train2-bench [--weights M.cact] [--lora R] [--batch B] [--tokens T]
 *                       [--threads N] [--quant] [--steps S]
 *
 * Default: models/needle-demo.cact (the demo geometry), full-parameter training (every
 * tensor), float numerics, batch 4 x 256, 2 steps, each timed alone. --lora R: a rank-R adapter on the official targets
 * (A ~ N(0, 1) / R, B small and non-zero), only A and B updated, run as `needle finetune`
 * would: g2_lora_prepare once (timed alone), then g2_lora_step per step; --quant: the exact 2.0.15
 * fine-tuning numerics (CQ W4 straight-through on the merged weights, A8). Random token ids.
 * Figures only, no assertion. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_peak.h"
#include "cli.h"
#include "needle.h"
#include "quant/cq_codebook.h"
#include "train/cact_base2.h"
#include "train/checkpoint.h"
#include "train/grad2.h"
#include "train/lora2.h"
#include "train/optim.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 33;
}
static float gauss(float sd) { /* sum of 4 uniforms: close enough to a normal here */
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)(next() & 0xFFFFFF) / 16777216.0f - 0.5f;
    return s * 1.7320508f * sd;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* tools/bench_peak.c times its loops with the CLI's clock (tools/cli.c, not linked here) */
double cli_now_ms(void) { return now() * 1e3; }

static int fail(const char *what) {
    fprintf(stderr, "needle-train2-bench: %s: %s\n", what, needle_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *path = NEEDLE_SOURCE_DIR "/models/needle-demo.cact";
    int B = 4, T = 256, rank = 0, threads = 0, quant = 0, steps = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--weights") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--lora") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quant")) quant = 1;
        else {
            fprintf(stderr, "usage: needle-train2-bench [--weights M.cact] [--lora R] [--batch B] [--tokens T] "
                            "[--threads N] [--quant] [--steps S]\n");
            return 2;
        }
    }
    if (B < 1 || T < 2 || rank < 0 || steps < 1) {
        fprintf(stderr, "needle-train2-bench: --batch >= 1, --tokens >= 2, --lora >= 0, --steps >= 1\n");
        return 2;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "needle-train2-bench: cannot open %s\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *img = size > 0 ? malloc((size_t)size) : NULL;
    const int read_ok = img && fread(img, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    export_config cfg;
    g2_model *m = NULL;
    if (!read_ok) return fprintf(stderr, "needle-train2-bench: cannot read %s\n", path), 1;
    if (g2_model_from_cact(img, (size_t)size, &cfg, &m)) return fail(path);
    free(img);
    if (g2_set_threads(m, threads)) return fail("threads");
    g2_set_fake_quant(m, quant);
    /* the trainable tensors and their gradients: the adapter's A, B or every tensor */
    train_adapter ad;
    memset(&ad, 0, sizeof ad);
    float **dA = NULL, **dB = NULL;
    const char *targets[] = {"q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"};
    const uint32_t np = rank ? 10 : g2_tensor_count(m);
    float **params = calloc(np, sizeof *params), **grads = calloc(np, sizeof *grads);
    const char **names = calloc(np, sizeof *names);
    uint64_t *numel = calloc(np, sizeof *numel), trainable = 0;
    if (rank) {
        ad.n = 5, ad.rank = rank, ad.scale = 2.0;
        ad.lora = calloc(5, sizeof *ad.lora);
        dA = calloc(5, sizeof *dA), dB = calloc(5, sizeof *dB);
        for (int k = 0; k < 5; k++) {
            char name[160];
            snprintf(name, sizeof name, "stack/layers/block/self_attn/%s/kernel", targets[k]);
            const g2_tensor *t = g2_find(m, name);
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
            lo->a.name = malloc(strlen(name) + 8), lo->b.name = malloc(strlen(name) + 8);
            sprintf(lo->a.name, "lora/%s/A", name);
            sprintf(lo->b.name, "lora/%s/B", name);
            params[2 * k] = lo->a.data, grads[2 * k] = dA[k], names[2 * k] = lo->a.name, numel[2 * k] = lo->a.numel;
            params[2 * k + 1] = lo->b.data, grads[2 * k + 1] = dB[k], names[2 * k + 1] = lo->b.name;
            numel[2 * k + 1] = lo->b.numel;
        }
    } else {
        for (uint32_t i = 0; i < np; i++) {
            g2_tensor *t = g2_tensor_at(m, i);
            params[i] = t->w, grads[i] = t->g, names[i] = t->name, numel[i] = t->numel;
        }
    }
    for (uint32_t i = 0; i < np; i++) trainable += numel[i];
    train_optim opt;
    const train_adamw_config oc = train_adamw_finetune(1e-4, (uint32_t)steps + 1);
    if (train_optim_init(&opt, &oc, np, names, numel)) return fail("optimizer");
    int32_t *ids = malloc((size_t)B * T * sizeof *ids);
    float *mask = malloc((size_t)B * T * sizeof *mask);
    for (size_t i = 0; i < (size_t)B * T; i++) {
        ids[i] = 1 + (int32_t)(next() % (cfg.vocab_size - 1));
        mask[i] = 1.0f;
    }
    cq_codebooks cb;
    if (quant && cq_codebooks_init(&cb, G2_CQ_GROUP)) return fail("codebooks");
    /* the dense products of one token: per layer q, k, v, gate, out and the two Walsh
     * products of the Hadamard MLP, per engram site key and value, the tied logits;
     * forward, recomputation and two backward products each (the logits: no recompute) */
    const double D = cfg.d_model, A = cfg.attn_dim, KV = (double)cfg.num_kv_heads * (A / cfg.num_heads);
    uint32_t N = 1;
    while (N < cfg.d_model) N <<= 1;
    const double E = cfg.d_model; /* engram rows: tables * sub = d_model */
    const double layer = D * (A + 2 * KV + A) + A * D + 2.0 * N * N;
    const double engram = cfg.num_sites * 2 * E * D, head = (double)cfg.vocab_size * D;
    const double flop = 2.0 * (4.0 * (cfg.num_layers * layer + engram) + 3.0 * head) * (double)B * (double)T;
    const bench_peak pk = bench_fma_peak(threads > 0 ? threads : 2);
    char thr[32];
    snprintf(thr, sizeof thr, threads > 0 ? "%d thread(s)" : "threads: NEEDLE_THREADS or the cores", threads);
    printf("needle-train2-bench: %s (d %u, %u layers, vocab %u), %s, %s, batch %dx%d, %s\n", path, cfg.d_model,
           cfg.num_layers, cfg.vocab_size, rank ? "LoRA" : "full-parameter", quant ? "CQ W4 STE + A8" : "float", B,
           T, thr);
    printf("  trainable %llu values", (unsigned long long)trainable);
    if (rank) printf(" (rank %d)", rank);
    printf("\n");
    g2_lora_prep *prep = NULL;
    if (rank) {
        const double t0 = now();
        if (g2_lora_prepare(m, &ad, quant ? &cb : NULL, &prep)) return fail("prepare");
        printf("  once per run: the frozen CQ leaves quantized (g2_lora_prepare) %.2f s\n", now() - t0);
    }
    for (int s = 0; s < steps; s++) {
        double loss = 0;
        const double t0 = now();
        int st = rank ? g2_lora_step(prep, &ad, ids, mask, (uint32_t)B, (uint32_t)T, &loss, dA, dB)
                      : g2_loss(m, ids, mask, (uint32_t)B, (uint32_t)T, 1, &loss);
        const double t1 = now();
        train_step_info info;
        if (!st) st = train_optim_step(&opt, params, (const float *const *)grads, &info);
        const double t2 = now();
        if (st) return fail("step");
        printf("  step %d: loss %.4f, loss + gradient %.2f s, update %.3f s: %.1f tok/s; dense products ~%.2f "
               "GFLOP at %.2f GFLOP/s = %.1f%% of the %s FMA peak (%.1f GFLOP/s)\n",
               s + 1, loss, t1 - t0, t2 - t1, (double)B * T / (t2 - t0), flop / 1e9, flop / 1e9 / (t1 - t0),
               100.0 * flop / 1e9 / (t1 - t0) / pk.gflops, pk.isa, pk.gflops);
    }
    g2_lora_finish(prep);
    train_optim_release(&opt);
    for (int k = 0; rank && k < 5; k++) {
        free(dA[k]);
        free(dB[k]);
    }
    free(dA);
    free(dB);
    if (rank) train_adapter_release(&ad);
    free(params);
    free(grads);
    free(names);
    free(numel);
    free(ids);
    free(mask);
    g2_model_free(m);
    return 0;
}
