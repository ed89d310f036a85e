/* AdamW, global-norm clipping and the warm-up + cosine schedule as optax computes them
 * (see optim.h). Built without floating-point contraction (CMakeLists.txt): each float32
 * operation rounds where optax's does, so a*b + c is never fused. */
#include "train/optim.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define PI_F 3.14159265358979323846f

static int oom(void) { return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory"); }

uint32_t train_warmup_steps(uint32_t total_steps) {
    uint32_t w = total_steps / 20;
    if (w < 1) w = 1;
    if (total_steps >= 1 && w > total_steps - 1) w = total_steps - 1;
    return w;
}

train_adamw_config train_adamw_finetune(double lr, uint32_t total_steps) {
    /* optax.adamw's defaults; clip 1.0 as finetune_local chains it */
    return (train_adamw_config){.init_lr = 0.0,
                                .peak_lr = lr,
                                .end_lr = 0.0,
                                .warmup_steps = train_warmup_steps(total_steps),
                                .total_steps = total_steps,
                                .b1 = 0.9,
                                .b2 = 0.999,
                                .eps = 1e-8,
                                .weight_decay = 1e-4,
                                .clip_norm = 1.0};
}

float train_schedule_lr(const train_adamw_config *c, uint32_t count) {
    const uint32_t w = c->warmup_steps;
    if (count < w) {
        /* linear_schedule = polynomial_schedule(power 1): (init - end) * frac + end with
         * frac = 1 - count / steps, the difference taken in double (Python floats) */
        const float frac = 1.0f - (float)count / (float)w;
        return (float)(c->init_lr - c->peak_lr) * frac + (float)c->peak_lr;
    }
    /* cosine_decay_schedule over decay_steps = total - warmup, on count - warmup, clamped */
    const double decay_steps = (double)c->total_steps - (double)w;
    float t = (float)(count - w);
    if (t > (float)decay_steps) t = (float)decay_steps;
    const float cosine = 0.5f * (1.0f + cosf(PI_F * t / (float)decay_steps));
    const double alpha = c->peak_lr == 0.0 ? 0.0 : c->end_lr / c->peak_lr;
    const float decayed = (float)(1.0 - alpha) * cosine + (float)alpha;
    return (float)c->peak_lr * decayed;
}

void train_optim_release(train_optim *o) {
    if (!o) return;
    for (uint32_t i = 0; i < o->n; i++) {
        if (o->names) free(o->names[i]);
        if (o->mu) free(o->mu[i]);
        if (o->nu) free(o->nu[i]);
    }
    free(o->names);
    free(o->numel);
    free(o->mu);
    free(o->nu);
    memset(o, 0, sizeof *o);
}

static int check_config(const train_adamw_config *c) {
    if (c->warmup_steps == 0 || c->warmup_steps >= c->total_steps)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "optimizer: warm-up %u must be in [1, total steps %u)",
                           c->warmup_steps, c->total_steps);
    if (!(c->b1 >= 0 && c->b1 < 1) || !(c->b2 >= 0 && c->b2 < 1))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "optimizer: b1 and b2 must be in [0, 1)");
    if (!(c->eps >= 0) || !(c->weight_decay >= 0) || !(c->clip_norm >= 0) || !isfinite(c->peak_lr) ||
        !isfinite(c->init_lr) || !isfinite(c->end_lr) || !isfinite(c->eps) || !isfinite(c->weight_decay) ||
        !isfinite(c->clip_norm))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                           "optimizer: learning rates must be finite, eps, weight decay and clip finite and >= 0");
    return 0;
}

int train_optim_init(train_optim *o, const train_adamw_config *cfg, uint32_t n, const char *const *names,
                     const uint64_t *numel) {
    memset(o, 0, sizeof *o);
    int st = check_config(cfg);
    if (st) return st;
    o->cfg = *cfg;
    o->names = calloc(n ? n : 1, sizeof *o->names);
    o->numel = calloc(n ? n : 1, sizeof *o->numel);
    o->mu = calloc(n ? n : 1, sizeof *o->mu);
    o->nu = calloc(n ? n : 1, sizeof *o->nu);
    if (!o->names || !o->numel || !o->mu || !o->nu) {
        train_optim_release(o);
        return oom();
    }
    o->n = n;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(names[i], names[j])) {
                train_optim_release(o);
                return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "optimizer: parameter '%.120s' given twice", names[i]);
            }
        if (numel[i] > SIZE_MAX / sizeof(float)) {
            train_optim_release(o);
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "optimizer: parameter '%.120s' is too large", names[i]);
        }
        o->numel[i] = numel[i];
        o->names[i] = strdup(names[i]);
        o->mu[i] = calloc(numel[i] ? (size_t)numel[i] : 1, sizeof(float));
        o->nu[i] = calloc(numel[i] ? (size_t)numel[i] : 1, sizeof(float));
        if (!o->names[i] || !o->mu[i] || !o->nu[i]) {
            train_optim_release(o);
            return oom();
        }
    }
    return 0;
}

typedef struct adam_consts {
    float b1, b2, one_b1, one_b2, bc1, bc2, eps, wd, step, norm, clip;
} adam_consts;

/* One tensor's update, each float32 operation where optax has it. The pointers do not
 * alias, so the compiler vectorizes the loop (optim.c is built with -O3 and
 * -fno-math-errno, which lets sqrtf be the instruction): vector division and square root
 * round exactly as the scalar ones, so the result is the same bits. Specialized four ways
 * so that no test is left in the loop. */
static inline void adam_tensor(float *restrict p, float *restrict mu, float *restrict nu, const float *restrict g,
                               uint64_t n, const adam_consts *kc, int clipped, int decay) {
    const adam_consts k = *kc;
    for (uint64_t i = 0; i < n; i++) {
        const float gk = clipped ? g[i] / k.norm * k.clip : g[i];
        const float m = k.one_b1 * gk + k.b1 * mu[i];
        const float v = k.one_b2 * (gk * gk) + k.b2 * nu[i];
        mu[i] = m;
        nu[i] = v;
        float u = m / k.bc1 / (sqrtf(v / k.bc2) + k.eps);
        if (decay) u = u + k.wd * p[i];
        p[i] = p[i] + k.step * u;
    }
}

#define ADAM_VARIANT(name, clipped, decay)                                                                     \
    static void name(float *restrict p, float *restrict mu, float *restrict nu, const float *restrict g, uint64_t n, \
                     const adam_consts *k) {                                                                   \
        adam_tensor(p, mu, nu, g, n, k, clipped, decay);                                                       \
    }
ADAM_VARIANT(adam_tensor_plain, 0, 0)
ADAM_VARIANT(adam_tensor_decay, 0, 1)
ADAM_VARIANT(adam_tensor_clip, 1, 0)
ADAM_VARIANT(adam_tensor_clip_decay, 1, 1)

int train_optim_step(train_optim *o, float *const *params, const float *const *grads, train_step_info *info) {
    const train_adamw_config *c = &o->cfg;
    if (o->count == UINT32_MAX) return needle_fail(NEEDLE_ERR_STATE, "optimizer: the step counter is exhausted");
    /* optax.tree.norm: each leaf's sum of squares in float32, the leaves' sums added in
     * float32 in tree order, the square root in float32. Each leaf's sum is taken in
     * double and rounded once: XLA's float32 reduction order is its own, so the last bit
     * of a leaf's sum can differ from it either way, and this one does not depend on
     * how the sum is split. */
    float sq = 0.0f;
    for (uint32_t i = 0; i < o->n; i++) {
        /* four partial sums in a fixed order: the same result every run, and four
         * additions in flight instead of one chain */
        double part[4] = {0, 0, 0, 0};
        const float *g = grads[i];
        const uint64_t n = o->numel[i], n4 = n & ~(uint64_t)3;
        for (uint64_t k = 0; k < n4; k += 4)
            for (int j = 0; j < 4; j++) part[j] += (double)g[k + j] * (double)g[k + j];
        for (uint64_t k = n4; k < n; k++) part[k - n4] += (double)g[k] * (double)g[k];
        sq = sq + (float)((part[0] + part[1]) + (part[2] + part[3]));
    }
    const float norm = sqrtf(sq), clip = (float)c->clip_norm;
    const int clipped = c->clip_norm > 0 && !(norm < clip);
    const float lr = train_schedule_lr(c, o->count);
    const uint32_t t = o->count + 1;
    /* Python's (1 - decay) in double, then float32; decay ** count in float32 */
    const float b1 = (float)c->b1, b2 = (float)c->b2, one_b1 = (float)(1.0 - c->b1), one_b2 = (float)(1.0 - c->b2);
    const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    const float eps = (float)c->eps, wd = (float)c->weight_decay, step = -1.0f * lr;
    const adam_consts k = {b1, b2, one_b1, one_b2, bc1, bc2, eps, wd, step, norm, clip};
    /* optax skips a zero weight decay altogether (u + 0 * p is not u when p is inf or nan) */
    const int decay = c->weight_decay != 0.0;
    typedef void (*variant)(float *restrict, float *restrict, float *restrict, const float *restrict, uint64_t,
                            const adam_consts *);
    static const variant variants[2][2] = {{adam_tensor_plain, adam_tensor_decay},
                                           {adam_tensor_clip, adam_tensor_clip_decay}};
    for (uint32_t i = 0; i < o->n; i++)
        variants[clipped][decay](params[i], o->mu[i], o->nu[i], grads[i], o->numel[i], &k);
    o->count = t;
    if (info) *info = (train_step_info){.lr = lr, .global_norm = norm, .clipped = clipped};
    return 0;
}

/* ---- saved inside a checkpoint -------------------------------------------------------- */

static char *moment_name(const char *kind, const char *param) {
    const size_t n = strlen(TRAIN_OPTIM_PREFIX) + strlen(kind) + 1 + strlen(param) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s/%s", TRAIN_OPTIM_PREFIX, kind, param);
    return s;
}

static void release_optim_fields(train_checkpoint *ck) {
    for (uint32_t i = 0; i < ck->n_optim; i++) train_tensor_release(&ck->optim_tensors[i]);
    free(ck->optim_tensors);
    free(ck->optim);
    ck->optim_tensors = NULL;
    ck->optim = NULL;
    ck->n_optim = 0;
}

int train_optim_save(const train_optim *o, train_checkpoint *ck) {
    release_optim_fields(ck);
    const train_adamw_config *c = &o->cfg;
    char meta[1024];
    /* %.17g: every double back exactly */
    snprintf(meta, sizeof meta,
             "{\"kind\": \"adamw\", \"count\": %u, \"init_lr\": %.17g, \"peak_lr\": %.17g, \"end_lr\": %.17g, "
             "\"warmup_steps\": %u, \"total_steps\": %u, \"b1\": %.17g, \"b2\": %.17g, \"eps\": %.17g, "
             "\"weight_decay\": %.17g, \"clip_norm\": %.17g}",
             o->count, c->init_lr, c->peak_lr, c->end_lr, c->warmup_steps, c->total_steps, c->b1, c->b2, c->eps,
             c->weight_decay, c->clip_norm);
    ck->optim = strdup(meta);
    ck->optim_tensors = calloc(2 * (size_t)o->n + 1, sizeof *ck->optim_tensors);
    if (!ck->optim || !ck->optim_tensors) {
        release_optim_fields(ck);
        return oom();
    }
    for (uint32_t i = 0; i < o->n; i++)
        for (int m = 0; m < 2; m++) {
            train_tensor *t = &ck->optim_tensors[ck->n_optim];
            t->name = moment_name(m ? "nu" : "mu", o->names[i]);
            t->data = malloc(o->numel[i] ? (size_t)o->numel[i] * sizeof(float) : 1);
            if (!t->name || !t->data) {
                train_tensor_release(t);
                release_optim_fields(ck);
                return oom();
            }
            ck->n_optim++;
            t->ndim = 1;
            t->shape[0] = t->numel = o->numel[i];
            memcpy(t->data, m ? o->nu[i] : o->mu[i], (size_t)o->numel[i] * sizeof(float));
        }
    return 0;
}

static const train_tensor *find_optim(const train_checkpoint *ck, const char *name) {
    for (uint32_t i = 0; i < ck->n_optim; i++)
        if (!strcmp(ck->optim_tensors[i].name, name)) return &ck->optim_tensors[i];
    return NULL;
}

static int json_double(const cJSON *j, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v)) return -1;
    *out = v->valuedouble;
    return 0;
}

static int json_u32(const cJSON *j, const char *key, uint32_t *out) {
    double d;
    if (json_double(j, key, &d) || !(d >= 0 && d <= 4294967295.0) || d != floor(d)) return -1;
    *out = (uint32_t)d;
    return 0;
}

int train_optim_restore(train_optim *o, const train_checkpoint *ck) {
    if (!ck->optim) return needle_fail(NEEDLE_ERR_FORMAT, "the checkpoint has no optimizer state");
    cJSON *j = cJSON_Parse(ck->optim);
    train_adamw_config c;
    uint32_t count;
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    const int bad = !cJSON_IsString(kind) || strcmp(kind->valuestring, "adamw") || json_u32(j, "count", &count) ||
                    json_double(j, "init_lr", &c.init_lr) || json_double(j, "peak_lr", &c.peak_lr) ||
                    json_double(j, "end_lr", &c.end_lr) || json_u32(j, "warmup_steps", &c.warmup_steps) ||
                    json_u32(j, "total_steps", &c.total_steps) || json_double(j, "b1", &c.b1) ||
                    json_double(j, "b2", &c.b2) || json_double(j, "eps", &c.eps) ||
                    json_double(j, "weight_decay", &c.weight_decay) || json_double(j, "clip_norm", &c.clip_norm);
    cJSON_Delete(j);
    if (bad) return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint: the optim metadata is not an AdamW state");
    if (check_config(&c)) return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint: optim metadata: %s", needle_last_error());
    if (ck->n_optim != 2 * o->n)
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint: optimizer state for %u tensors, the optimizer has %u",
                           ck->n_optim / 2, o->n);
    /* check everything before changing anything */
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < o->n; i++)
            for (int m = 0; m < 2; m++) {
                char *name = moment_name(m ? "nu" : "mu", o->names[i]);
                if (!name) return oom();
                const train_tensor *t = find_optim(ck, name);
                if (!pass && (!t || t->numel != o->numel[i])) {
                    const int st = needle_fail(NEEDLE_ERR_FORMAT, "checkpoint: optimizer tensor %.160s %s", name,
                                               t ? "has another size" : "is missing");
                    free(name);
                    return st;
                }
                if (pass) memcpy(m ? o->nu[i] : o->mu[i], t->data, (size_t)t->numel * sizeof(float));
                free(name);
            }
    o->cfg = c;
    o->count = count;
    return 0;
}
