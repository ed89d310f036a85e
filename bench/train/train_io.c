/* Times the training core's file and optimizer work on one checkpoint: reading it,
 * AdamW steps over every parameter (finetune's settings, synthetic gradients), and
 * writing it back with the optimizer state. One JSON line on stdout.
 *
 *   cmake --build build --target bench_train_io
 *   build/bench_train_io CHECKPOINT.safetensors [STEPS] [OUT.safetensors]
 *
 * A checkpoint of the released Needle 3 geometry (random values, ~484 MB) is made by
 * tests/reference/make_train_fixtures.sh tests/reference/work/train --only released. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "needle.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "util/platform.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_train_io CHECKPOINT.safetensors [STEPS] [OUT.safetensors]\n");
        return 2;
    }
    const int steps = argc > 2 ? atoi(argv[2]) : 3;
    const char *out = argc > 3 ? argv[3] : NULL;
    if (steps < 1) return fprintf(stderr, "STEPS must be >= 1\n"), 2;
    train_checkpoint ck;
    double t0 = now();
    int st = train_checkpoint_read(argv[1], NULL, 0, &ck);
    const double t_read = now() - t0;
    if (st) return fprintf(stderr, "bench_train_io: %s\n", needle_last_error()), 1;
    uint64_t total = 0;
    const char **names = malloc(ck.n * sizeof *names);
    uint64_t *numel = malloc(ck.n * sizeof *numel);
    float **p = malloc(ck.n * sizeof *p), **g = malloc(ck.n * sizeof *g);
    for (uint32_t i = 0; i < ck.n; i++) {
        names[i] = ck.tensors[i].name;
        numel[i] = ck.tensors[i].numel;
        p[i] = ck.tensors[i].data;
        g[i] = malloc((numel[i] ? numel[i] : 1) * sizeof(float));
        for (uint64_t k = 0; k < numel[i]; k++) g[i][k] = (float)((k * 2654435761u + i) % 1000) * 1e-6f - 5e-4f;
        total += numel[i];
    }
    const train_adamw_config cfg = train_adamw_finetune(1e-3, 1000);
    train_optim o;
    if ((st = train_optim_init(&o, &cfg, ck.n, names, numel)))
        return fprintf(stderr, "bench_train_io: %s\n", needle_last_error()), 1;
    t0 = now();
    for (int s = 0; s < steps; s++) train_optim_step(&o, p, (const float *const *)g, NULL);
    const double t_step = (now() - t0) / steps;
    double t_write = 0;
    if (out) {
        t0 = now();
        st = train_optim_save(&o, &ck);
        if (!st) st = train_checkpoint_write(out, &ck);
        t_write = now() - t0;
        if (st) return fprintf(stderr, "bench_train_io: %s\n", needle_last_error()), 1;
    }
    /* one step reads p, g, mu, nu and writes p, mu, nu: 28 bytes an element */
    printf("{\"tensors\": %u, \"params\": %llu, \"read_s\": %.3f, \"step_s\": %.4f, \"step_gb_per_s\": %.2f, "
           "\"write_with_state_s\": %.3f, \"peak_rss_mb\": %.0f}\n",
           ck.n, (unsigned long long)total, t_read, t_step, 28.0 * (double)total / t_step / 1e9, t_write,
           platform_peak_rss_mb());
    for (uint32_t i = 0; i < ck.n; i++) free(g[i]);
    free(g);
    free(p);
    free(names);
    free(numel);
    train_optim_release(&o);
    train_checkpoint_release(&ck);
    return 0;
}
