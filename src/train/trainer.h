/* The fine-tuning loop of `needle finetune` (cactus-needle 3.2.8 finetune_local, in C):
 *
 *   data      ft_data_load (render + _encode + fit_max_len, reports with line numbers)
 *   split     n_val = min(int(n * val_split), n - 1); when n_val > 0 the rows are put in
 *             the order of default_rng(seed).permutation(n), the first n_val held out
 *   batches   each epoch draws permutation(count) from the same generator and takes
 *             batch_size rows at a time (the last batch is the remainder, smaller)
 *   step      loss and gradient, then AdamW (clip 1.0, 5% warm-up + cosine; optim.h)
 *             LoRA (default): rank r, scale alpha / r, on finetune's target kernels, under
 *             the official numerics (CQ W4 straight-through + A8) unless quant is 0;
 *             full: every parameter, float unless quant is 1 (then CQ STE + A8 on a
 *             float master copy)
 *   epoch     validation loss = the mean of the held-out batches' losses
 *   save      every `checkpoint_minutes`, when *stop becomes non-zero (the tools layer
 *             sets it from SIGINT), after `max_steps` steps of this run, and at the end:
 *             LoRA: the adapter (official write_adapter file) at out_path and the resume
 *             state (a checkpoint holding the adapter tensors, the optimizer state, the
 *             step and the run settings) at state_path; full: one official 3.x checkpoint
 *             at out_path with the optimizer state. Every file is written atomically.
 *   resume    the batch order is a function of the seed and the epoch, so the state is
 *             the parameters, the optimizer and the step: replaying the generator to
 *             that step continues bit for bit what an uninterrupted run computes.
 *
 * Where we differ from the official: the adapter's A is drawn from N(0, 1) / r by
 * Box-Muller over PCG64(seed + 1), not jax.random (threefry), so the same seed gives
 * another initial adapter; everything after initialization follows the official. The
 * loop prints nothing: progress goes through a callback.
 *
 * Each network generation plugs in through a train_generation descriptor:
 * train_generation_for(3) (3.2.8 over grad3/lora3) and train_generation_for(2) (2.0.15 over
 * grad2/lora2; what 2.0.15 does differently is listed in trainer.c). */
#ifndef NEEDLE_TRAIN_TRAINER_H
#define NEEDLE_TRAIN_TRAINER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "export/safetensors.h"
#include "needle.h"
#include "quant/cq_codebook.h"
#include "train/checkpoint.h"
#include "train/finetune_data.h"

/* One parameter of a model as the loop sees it. */
typedef struct train_param {
    const char *name;
    uint32_t ndim;
    const uint64_t *shape;
    uint64_t numel;
    float *w, *g;
} train_param;

/* What the loop needs of a generation's training core (the g3_ / g2_ functions). */
typedef struct train_generation {
    int generation;
    /* a model of the checkpoint's config (JSON text) with its tensors */
    int (*from_checkpoint)(const char *config_json, const st_file *ckpt, void **model);
    void (*free)(void *model);
    uint32_t (*tensor_count)(void *model);
    void (*tensor)(void *model, uint32_t i, train_param *out);
    void (*set_frozen)(void *model, uint32_t i, int frozen);
    int (*loss)(void *model, const int32_t *ids, const float *mask, uint32_t B, uint32_t T,
                int grads, double *loss);
    int (*lora_loss)(void *model, const train_adapter *ad, const cq_codebooks *cb,
                     const int32_t *ids, const float *mask, uint32_t B, uint32_t T, double *loss,
                     float **dA, float **dB);
    /* replaces the CQ leaves by their CQ dequantization (straight-through) */
    int (*cq_weights)(void *model, const cq_codebooks *cb);
    void (*set_quant)(void *model, int on);
    int (*set_threads)(void *model, int n);
    /* optional (NULL: none): called once before the first step with what every step will
     * pass (adapter, codebooks), for a core that prepares its frozen leaves once */
    int (*prepare)(void *model, const train_adapter *ad, const cq_codebooks *cb);
} train_generation;

/* The descriptor of generation 2 or 3, or NULL when this build has no training core for it. */
const train_generation *train_generation_for(int generation);

/* finetune's LoRA targets: a kernel under layers/ with a q_proj, k_proj, v_proj, gate_proj
 * or out_proj path component and some |w| > 1e-6 */
int train_is_lora_target(const char *name, const float *w, uint64_t numel);

enum {
    TRAIN_EVENT_DATA = 1,   /* examples, seq_len, n_val, total_steps known */
    TRAIN_EVENT_STEP,       /* one update done */
    TRAIN_EVENT_EPOCH,      /* an epoch ended (val_loss < 0: no held-out split) */
    TRAIN_EVENT_CHECKPOINT, /* files written at `step` */
    TRAIN_EVENT_RESUMED,    /* continuing from `step` */
};

typedef struct train_event {
    int kind;
    uint32_t step, total_steps, epoch, epochs;
    uint32_t examples, seq_len, n_val, targets; /* DATA (targets: LoRA groups or tensors) */
    double loss, val_loss, lr;
    uint32_t batch_rows, tokens; /* STEP: rows, and the tokens of the step's rows (not their padding) */
    double step_seconds, elapsed_seconds;
    const char *path; /* CHECKPOINT */
} train_event;

typedef struct train_options {
    const train_generation *gen;
    const char *base_path;     /* the base checkpoint's path (the adapter's `base`) */
    const uint8_t *base_image; /* its safetensors image and size */
    size_t base_size;
    /* the config (JSON text) when the base's metadata has none (a Needle 2 checkpoint with
     * its config beside it); NULL: the metadata's `config` */
    const char *config_json;
    const needle_model *tokenizer; /* a model whose tokenizer encodes the data */
    const char *data;
    size_t data_len;
    ft_report_fn report;
    void *report_user;
    uint32_t epochs, batch_size, lora_rank, max_len;
    double lr, lora_alpha, val_split;
    uint64_t seed;
    int full;  /* every parameter instead of LoRA */
    int quant; /* -1: the default (LoRA: CQ STE + A8; full: float) */
    int threads;
    const char *out_path, *state_path; /* state_path: LoRA only */
    int resume;
    double checkpoint_minutes; /* <= 0: only at the end, at max_steps and on stop */
    uint32_t max_steps;        /* this run stops after so many updates (0: no limit) */
    volatile sig_atomic_t *stop;
    void (*progress)(void *user, const train_event *e);
    void *progress_user;
} train_options;

typedef struct train_result {
    int finished; /* all steps done (else stopped, state saved) */
    uint32_t steps, total_steps;
    double last_loss, val_loss; /* val_loss < 0: none */
    uint32_t n_val;
    uint32_t *val_lines;   /* the held-out examples' data lines (1-based), n_val of them */
    train_adapter adapter; /* LoRA: the trained adapter (what out_path holds) */
} train_result;

/* Runs (or resumes) a fine-tune. Returns 0 (result filled; check `finished`) or a negative
 * needle status with the message recorded. */
int train_run(const train_options *o, train_result *r);
void train_result_release(train_result *r);

#endif
