/* The official fine-tuning optimizer, computed as optax 0.2.8 computes it in float32
 * (docs/spec/TRAINING.md): cactus-needle 3.2.8 finetune_local uses
 *
 *   optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))
 *   schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total)
 *   warmup   = min(max(1, total // 20), total - 1)
 *
 * One step, for every parameter p with gradient g (n = updates applied before this one):
 *   norm = sqrt(sum of every g^2);  g = norm < clip ? g : g / norm * clip
 *   mu = (1 - b1) g + b1 mu;  nu = (1 - b2) g^2 + b2 nu
 *   u  = (mu / (1 - b1^(n+1))) / (sqrt(nu / (1 - b2^(n+1))) + eps) + weight_decay p
 *   p  = p + (-lr(n)) u
 * with adamw's defaults b1 0.9, b2 0.999, eps 1e-8, weight decay 1e-4 on every parameter
 * (finetune passes no mask). lr(n): linear from init to peak over `warmup` steps, then
 * cosine from peak to end over total - warmup steps (optax's join of the two).
 *
 * The state (count, mu, nu) is saved inside a checkpoint: tensors optim/mu/<name> and
 * optim/nu/<name>, and the `optim` metadata (the count and the hyperparameters as JSON).
 * Restoring it and going on gives bit for bit what an uninterrupted run gives. */
#ifndef NEEDLE_TRAIN_OPTIM_H
#define NEEDLE_TRAIN_OPTIM_H

#include <stdint.h>

#include "train/checkpoint.h"

/* The hyperparameters are doubles, as the Python floats optax is given: each is rounded
 * to float32 where optax's float32 arithmetic meets it, and 1 - b1 is taken before that
 * rounding, as Python does (1 - 0.9 in double, then float32, is not 1 - 0.9f). */
typedef struct train_adamw_config {
    double init_lr, peak_lr, end_lr; /* the schedule: finetune uses 0, --lr, 0 */
    uint32_t warmup_steps;           /* linear warm-up steps (> 0) */
    uint32_t total_steps;            /* the schedule's decay_steps (> warmup_steps) */
    double b1, b2, eps, weight_decay;
    double clip_norm; /* global-norm clip; 0: none */
} train_adamw_config;

/* finetune_local's warm-up for `total_steps` updates: min(max(1, total / 20), total - 1). */
uint32_t train_warmup_steps(uint32_t total_steps);

/* finetune_local's optimizer for `total_steps` updates (>= 2) at peak rate `lr`. */
train_adamw_config train_adamw_finetune(double lr, uint32_t total_steps);

/* The learning rate of update `count` (0-based), as optax's schedule gives it in float32. */
float train_schedule_lr(const train_adamw_config *c, uint32_t count);

typedef struct train_optim {
    train_adamw_config cfg;
    uint32_t count; /* updates applied */
    uint32_t n;     /* parameter tensors */
    char **names;
    uint64_t *numel;
    float **mu, **nu;
} train_optim;

/* State for `n` parameter tensors (names and sizes; names are copied), zero moments.
 * NEEDLE_ERR_INVALID_ARGUMENT for a config optax would refuse (warmup 0 or >= total,
 * b1/b2 outside [0, 1), negative eps/decay/clip) or a name used twice. */
int train_optim_init(train_optim *o, const train_adamw_config *cfg, uint32_t n, const char *const *names,
                     const uint64_t *numel);
void train_optim_release(train_optim *o);

typedef struct train_step_info {
    float lr;          /* the learning rate used */
    float global_norm; /* of the gradients, before clipping */
    int clipped;       /* 1 if the gradients were scaled down */
} train_step_info;

/* One update: params[i] (numel[i] floats) in place from grads[i] (left unchanged).
 * `info` may be NULL. Single-threaded, deterministic. The parameters' order is the order
 * the global norm adds their sums of squares in: optax's is the tree's (paths sorted
 * component by component), which init's order should follow to match it to the bit. */
int train_optim_step(train_optim *o, float *const *params, const float *const *grads, train_step_info *info);

/* Copies the state into `ck` (replacing any optimizer state it had): what
 * train_checkpoint_write then saves with the parameters. */
int train_optim_save(const train_optim *o, train_checkpoint *ck);

/* Restores count, moments and hyperparameters from `ck` into `o`, which was initialized
 * for the same parameters (same names and sizes; NEEDLE_ERR_FORMAT otherwise, or when
 * `ck` has no optimizer state). */
int train_optim_restore(train_optim *o, const train_checkpoint *ck);

#endif
