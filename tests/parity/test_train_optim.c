/* The optimizer (src/train/optim.h) against optax: tests/fixtures/train/optim_official.json
 * (tests/reference/make_train_fixtures.sh) is finetune_local's chain
 * (clip_by_global_norm(1.0), adamw(warmup_cosine_decay_schedule)) run by optax 0.2.8 for
 * 12 steps over random params and gradients, clipping on some steps only: the learning
 * rate, params, mu and nu after every step, matched here to 1e-6 relative. Then the state
 * saved in a checkpoint, restored and continued: bit for bit the uninterrupted run, and
 * the file still loads (and runs) in the official code. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "train_check.h"

#define MAXP 3

typedef struct fixture {
    cJSON *root;
    train_adamw_config cfg;
    const char *names[MAXP];
    uint64_t numel[MAXP];
    float *init[MAXP];
} fixture;

static void fill(const cJSON *arr, float *out, uint64_t n) {
    uint64_t k = 0;
    for (const cJSON *x = arr->child; x && k < n; x = x->next) {
        if (cJSON_IsArray(x)) { /* [rows][cols] */
            for (const cJSON *y = x->child; y && k < n; y = y->next) out[k++] = (float)y->valuedouble;
        } else {
            out[k++] = (float)x->valuedouble;
        }
    }
}

static uint64_t count_of(const cJSON *arr) {
    uint64_t n = 0;
    for (const cJSON *x = arr->child; x; x = x->next) n += cJSON_IsArray(x) ? (uint64_t)cJSON_GetArraySize(x) : 1;
    return n;
}

static int load_fixture(fixture *f) {
    memset(f, 0, sizeof *f);
    size_t size;
    char *text = (char *)read_file(fixture_path("train/optim_official.json"), &size);
    if (!text) return -1;
    f->root = cJSON_Parse(text);
    free(text);
    if (!f->root) return -1;
    const double lr = cJSON_GetObjectItem(f->root, "peak_lr")->valuedouble;
    const uint32_t total = (uint32_t)cJSON_GetObjectItem(f->root, "total_steps")->valueint;
    f->cfg = train_adamw_finetune(lr, total);
    const cJSON *init = cJSON_GetObjectItem(f->root, "init");
    int i = 0;
    for (const cJSON *p = init->child; p && i < MAXP; p = p->next, i++) {
        f->names[i] = p->string;
        f->numel[i] = count_of(p);
        f->init[i] = malloc(f->numel[i] * sizeof(float));
        fill(p, f->init[i], f->numel[i]);
    }
    return i == MAXP ? 0 : -1;
}

static void free_fixture(fixture *f) {
    for (int i = 0; i < MAXP; i++) free(f->init[i]);
    cJSON_Delete(f->root);
}

static double rel_err(float got, double want) {
    const double d = fabs((double)got - want), s = fabs(want);
    return s > 1e-30 ? d / s : d;
}

static void test_schedule_and_warmup(void) {
    CHECK_EQ_INT(train_warmup_steps(12), 1);
    CHECK_EQ_INT(train_warmup_steps(2), 1);
    CHECK_EQ_INT(train_warmup_steps(100), 5);
    CHECK_EQ_INT(train_warmup_steps(1000), 50);
    CHECK_EQ_INT(train_warmup_steps(39), 1);
    CHECK_EQ_INT(train_warmup_steps(40), 2);
    fixture f;
    CHECK_EQ_INT(load_fixture(&f), 0);
    CHECK_EQ_INT(f.cfg.warmup_steps, cJSON_GetObjectItem(f.root, "warmup")->valueint);
    int i = 0;
    for (const cJSON *s = cJSON_GetObjectItem(f.root, "steps")->child; s; s = s->next, i++) {
        const double want = cJSON_GetObjectItem(s, "lr")->valuedouble;
        const float got = train_schedule_lr(&f.cfg, (uint32_t)i);
        CHECK_MSG(rel_err(got, want) <= 1e-6, "lr(%d) = %.9g, optax %.9g", i, got, want);
    }
    CHECK_EQ_INT(i, 12);
    /* a longer warm-up (optax's linear part over several steps) and past the end */
    train_adamw_config c = train_adamw_finetune(1e-3, 200);
    CHECK_EQ_INT(c.warmup_steps, 10);
    CHECK(train_schedule_lr(&c, 0) == 0.0f);
    CHECK(fabsf(train_schedule_lr(&c, 5) - 5e-4f) < 1e-9f);
    CHECK(train_schedule_lr(&c, 10) == (float)1e-3);
    CHECK(train_schedule_lr(&c, 200) == 0.0f && train_schedule_lr(&c, 500) == 0.0f);
    free_fixture(&f);
}

/* Params element by element (relative 1e-6); mu and nu tensor by tensor, as the
 * relative L2 error (1e-6): a moment that nearly cancels (0.1 g + 0.9 mu ~ 0) shows a
 * last-bit difference of the global norm (XLA's float32 summation order against ours) as
 * a large relative error of that one element, which says nothing about the optimizer. */
static void check_tree_close(const cJSON *want, const char *const *names, float *const *got, const uint64_t *numel,
                             const char *what, int step, int elementwise, double *worst) {
    for (int i = 0; i < MAXP; i++) {
        const cJSON *w = cJSON_GetObjectItem(want, names[i]);
        float *ref = malloc(numel[i] * sizeof(float));
        fill(w, ref, numel[i]);
        double d2 = 0, r2 = 0;
        for (uint64_t k = 0; k < numel[i]; k++) {
            const double d = (double)got[i][k] - ref[k];
            d2 += d * d;
            r2 += (double)ref[k] * ref[k];
            if (!elementwise) continue;
            const double e = rel_err(got[i][k], ref[k]);
            if (e > *worst) *worst = e;
            CHECK_MSG(e <= 1e-6, "step %d %s %s[%llu]: %.9g vs optax %.9g", step, what, names[i],
                      (unsigned long long)k, got[i][k], ref[k]);
        }
        if (!elementwise) {
            const double e = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
            if (e > *worst) *worst = e;
            CHECK_MSG(e <= 1e-6, "step %d %s %s: relative L2 error %.3g", step, what, names[i], e);
        }
        free(ref);
    }
}

static void test_matches_optax(void) {
    fixture f;
    CHECK_EQ_INT(load_fixture(&f), 0);
    train_optim o;
    CHECK_EQ_INT(train_optim_init(&o, &f.cfg, MAXP, f.names, f.numel), 0);
    float *params[MAXP], *grads[MAXP];
    for (int i = 0; i < MAXP; i++) {
        params[i] = malloc(f.numel[i] * sizeof(float));
        grads[i] = malloc(f.numel[i] * sizeof(float));
        memcpy(params[i], f.init[i], f.numel[i] * sizeof(float));
    }
    int step = 0, n_clipped = 0;
    double worst_p = 0, worst_m = 0, worst_v = 0;
    for (const cJSON *s = cJSON_GetObjectItem(f.root, "steps")->child; s; s = s->next, step++) {
        const cJSON *g = cJSON_GetObjectItem(s, "grads");
        for (int i = 0; i < MAXP; i++) fill(cJSON_GetObjectItem(g, f.names[i]), grads[i], f.numel[i]);
        train_step_info info;
        CHECK_EQ_INT(train_optim_step(&o, params, (const float *const *)grads, &info), 0);
        const double norm = cJSON_GetObjectItem(s, "global_norm")->valuedouble;
        CHECK_MSG(rel_err(info.global_norm, norm) <= 1e-6, "step %d norm %.9g vs %.9g", step, info.global_norm, norm);
        CHECK_EQ_INT(info.clipped, norm >= 1.0);
        n_clipped += info.clipped;
        CHECK_EQ_INT(o.count, cJSON_GetObjectItem(s, "count")->valueint);
        check_tree_close(cJSON_GetObjectItem(s, "params"), f.names, params, f.numel, "param", step, 1, &worst_p);
        check_tree_close(cJSON_GetObjectItem(s, "mu"), f.names, o.mu, f.numel, "mu", step, 0, &worst_m);
        check_tree_close(cJSON_GetObjectItem(s, "nu"), f.names, o.nu, f.numel, "nu", step, 0, &worst_v);
    }
    CHECK_EQ_INT(step, 12);
    /* clipping acted on some steps, not all */
    CHECK(n_clipped >= 2 && n_clipped <= 10);
    printf("  optax match: worst relative error params %.3g (element), mu %.3g, nu %.3g (L2); %d of 12 steps clipped\n", worst_p,
           worst_m, worst_v, n_clipped);
    for (int i = 0; i < MAXP; i++) {
        free(params[i]);
        free(grads[i]);
    }
    train_optim_release(&o);
    free_fixture(&f);
}

/* A deterministic gradient for parameter tensor i, element k, at step s (some steps
 * large enough to clip). */
static float grad_at(uint32_t s, uint32_t i, uint64_t k) {
    uint64_t x = (uint64_t)s * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull ^ k * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    const float u = (float)(x >> 40) / (float)(1u << 24) - 0.5f;
    return u * (s % 3 == 1 ? 0.2f : 0.002f);
}

/* `steps` updates on the checkpoint's parameters, starting at update `from`. */
static void run_steps(train_optim *o, train_checkpoint *ck, uint32_t from, uint32_t steps) {
    float **p = malloc(ck->n * sizeof *p), **g = malloc(ck->n * sizeof *g);
    for (uint32_t i = 0; i < ck->n; i++) {
        p[i] = ck->tensors[i].data;
        g[i] = malloc((ck->tensors[i].numel ? ck->tensors[i].numel : 1) * sizeof(float));
    }
    for (uint32_t s = from; s < from + steps; s++) {
        for (uint32_t i = 0; i < ck->n; i++)
            for (uint64_t k = 0; k < ck->tensors[i].numel; k++) g[i][k] = grad_at(s, i, k);
        CHECK_EQ_INT(train_optim_step(o, p, (const float *const *)g, NULL), 0);
    }
    for (uint32_t i = 0; i < ck->n; i++) free(g[i]);
    free(p);
    free(g);
}

static int init_for(train_optim *o, const train_checkpoint *ck, const train_adamw_config *cfg) {
    const char **names = malloc(ck->n * sizeof *names);
    uint64_t *numel = malloc(ck->n * sizeof *numel);
    for (uint32_t i = 0; i < ck->n; i++) names[i] = ck->tensors[i].name, numel[i] = ck->tensors[i].numel;
    const int st = train_optim_init(o, cfg, ck->n, names, numel);
    free(names);
    free(numel);
    return st;
}

static void test_save_restore_continue(void) {
    const char *base = fixture_path("train/ckpt_official.safetensors");
    train_checkpoint straight, half, back;
    CHECK_EQ_INT(train_checkpoint_read(base, NULL, 0, &straight), 0);
    CHECK_EQ_INT(train_checkpoint_read(base, NULL, 0, &half), 0);
    const train_adamw_config cfg = train_adamw_finetune(2e-3, 40);
    train_optim a, b, c;
    /* uninterrupted: 40 steps */
    CHECK_EQ_INT(init_for(&a, &straight, &cfg), 0);
    run_steps(&a, &straight, 0, 40);
    /* 17 steps, saved with the parameters, read back into a fresh optimizer, 23 more */
    CHECK_EQ_INT(init_for(&b, &half, &cfg), 0);
    run_steps(&b, &half, 0, 17);
    CHECK_EQ_INT(train_optim_save(&b, &half), 0);
    CHECK_EQ_INT(train_optim_save(&b, &half), 0); /* saving again replaces, no duplicates */
    CHECK_EQ_INT(half.n_optim, 2 * half.n);
    half.step = 17;
    const char *dir = train_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/resume.safetensors", dir);
    CHECK_EQ_INT(train_checkpoint_write(path, &half), 0);
    train_optim_release(&b);
    CHECK_EQ_INT(train_checkpoint_read(path, NULL, 0, &back), 0);
    CHECK_EQ_INT(back.n, straight.n);
    CHECK_EQ_INT(back.n_optim, 2 * back.n);
    CHECK_EQ_INT(back.step, 17);
    /* a fresh optimizer with other hyperparameters: the saved ones replace them */
    const train_adamw_config other = train_adamw_finetune(5e-1, 1000);
    CHECK_EQ_INT(init_for(&c, &back, &other), 0);
    CHECK_EQ_INT(train_optim_restore(&c, &back), 0);
    CHECK_EQ_INT(c.count, 17);
    CHECK(c.cfg.peak_lr == cfg.peak_lr && c.cfg.total_steps == 40 && c.cfg.warmup_steps == cfg.warmup_steps);
    run_steps(&c, &back, 17, 23);
    int same = 1;
    for (uint32_t i = 0; i < straight.n; i++) {
        const train_tensor *t = train_checkpoint_find(&back, straight.tensors[i].name);
        same &= t && !memcmp(t->data, straight.tensors[i].data, t->numel * sizeof(float));
        same &= !memcmp(a.mu[i], c.mu[i], a.numel[i] * sizeof(float)) &&
                !memcmp(a.nu[i], c.nu[i], a.numel[i] * sizeof(float));
    }
    CHECK_MSG(same, "resumed run differs from the uninterrupted one");
    CHECK_EQ_INT(a.count, c.count);
    /* and the parameters moved: the comparison is not vacuous */
    train_checkpoint orig;
    CHECK_EQ_INT(train_checkpoint_read(base, NULL, 0, &orig), 0);
    CHECK(memcmp(orig.tensors[0].data, straight.tensors[0].data, orig.tensors[0].numel * sizeof(float)) != 0);
    train_checkpoint_release(&orig);

    /* the official loader takes the checkpoint with its optimizer state, and its forward
     * pass runs over what it loaded */
    if (!train_official_python()) {
        harness_skip("no reference venv (tests/reference/make_v3_fixtures.sh or PYTHON_V3)");
    } else {
        cJSON *j = train_official_read_arg("checkpoint", path, "apply");
        CHECK(j != NULL);
        CHECK(cJSON_GetObjectItem(j, "step") && cJSON_GetObjectItem(j, "step")->valueint == 17);
        const cJSON *shape = cJSON_GetObjectItem(j, "apply_shape");
        CHECK(cJSON_GetArraySize(shape) == 3 && cJSON_GetArrayItem(shape, 2)->valueint == 48);
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "apply_finite")));
        cJSON_Delete(j);
    }

    /* refusals: no state, another parameter set, damaged metadata */
    train_checkpoint plain;
    CHECK_EQ_INT(train_checkpoint_read(base, NULL, 0, &plain), 0);
    CHECK_EQ_INT(train_optim_restore(&c, &plain), NEEDLE_ERR_FORMAT);
    CHECK(strstr(needle_last_error(), "no optimizer state") != NULL);
    train_optim d;
    const char *one[1] = {"x"};
    const uint64_t n1[1] = {4};
    CHECK_EQ_INT(train_optim_init(&d, &cfg, 1, one, n1), 0);
    CHECK_EQ_INT(train_optim_restore(&d, &back), NEEDLE_ERR_FORMAT);
    train_optim_release(&d);
    char *saved = back.optim;
    back.optim = "{\"kind\": \"adamw\", \"count\": 3}";
    CHECK_EQ_INT(train_optim_restore(&c, &back), NEEDLE_ERR_FORMAT);
    back.optim = "{\"kind\": \"adamw\", \"count\": 1, \"init_lr\": 0, \"peak_lr\": 1, \"end_lr\": 0, \"warmup_steps\": 0, "
                 "\"total_steps\": 4, \"b1\": 0.9, \"b2\": 0.999, \"eps\": 1e-8, \"weight_decay\": 0, \"clip_norm\": 1}";
    CHECK_EQ_INT(train_optim_restore(&c, &back), NEEDLE_ERR_FORMAT);
    back.optim = saved;
    CHECK_EQ_INT(c.count, 40); /* a refused restore changed nothing */
    train_checkpoint_release(&plain);
    train_optim_release(&a);
    train_optim_release(&c);
    train_checkpoint_release(&straight);
    train_checkpoint_release(&half);
    train_checkpoint_release(&back);
    train_tmpdir_remove(dir);
}

/* The optimizer's vectorized loop against the update written out element by element
 * here (ISO C: no contraction in this file either), over tensors whose sizes leave every
 * remainder of a vector, clipped and unclipped, with and without weight decay: the same
 * bits, since vector division and square root round as the scalar ones. */
static void test_vector_loop_is_scalar_formula(void) {
    const uint64_t sizes[5] = {1, 3, 17, 1000, 4099};
    const char *names[5] = {"a", "b", "c", "d", "e"};
    for (int variant = 0; variant < 4; variant++) {
        train_adamw_config cfg = train_adamw_finetune(3e-3, 20);
        if (variant & 1) cfg.weight_decay = 0;
        train_optim o;
        CHECK_EQ_INT(train_optim_init(&o, &cfg, 5, names, sizes), 0);
        float *p[5], *g[5], *rp[5], *rm[5], *rv[5];
        for (int i = 0; i < 5; i++) {
            p[i] = malloc(sizes[i] * sizeof(float));
            g[i] = malloc(sizes[i] * sizeof(float));
            rp[i] = malloc(sizes[i] * sizeof(float));
            rm[i] = calloc(sizes[i], sizeof(float));
            rv[i] = calloc(sizes[i], sizeof(float));
            for (uint64_t k = 0; k < sizes[i]; k++) p[i][k] = rp[i][k] = grad_at(99, (uint32_t)i, k) * 40.0f;
        }
        int same = 1, clipped_steps = 0;
        for (uint32_t s = 0; s < 6; s++) {
            /* variants 2 and 3: gradients large enough to clip on every step; 0 and 1 never */
            const float gain = variant >= 2 ? 50.0f : 0.01f;
            for (int i = 0; i < 5; i++)
                for (uint64_t k = 0; k < sizes[i]; k++) g[i][k] = grad_at(s, (uint32_t)i, k) * gain;
            train_step_info info;
            CHECK_EQ_INT(train_optim_step(&o, p, (const float *const *)g, &info), 0);
            clipped_steps += info.clipped;
            const float norm = info.global_norm, lr = train_schedule_lr(&cfg, s);
            const float b1 = 0.9f, b2 = 0.999f, one_b1 = (float)(1.0 - 0.9), one_b2 = (float)(1.0 - 0.999);
            const float bc1 = 1.0f - powf(b1, (float)(s + 1)), bc2 = 1.0f - powf(b2, (float)(s + 1));
            for (int i = 0; i < 5; i++)
                for (uint64_t k = 0; k < sizes[i]; k++) {
                    const float gk = info.clipped ? g[i][k] / norm * 1.0f : g[i][k];
                    const float m = one_b1 * gk + b1 * rm[i][k];
                    const float v = one_b2 * (gk * gk) + b2 * rv[i][k];
                    rm[i][k] = m;
                    rv[i][k] = v;
                    float u = m / bc1 / (sqrtf(v / bc2) + 1e-8f);
                    if (!(variant & 1)) u = u + 1e-4f * rp[i][k];
                    rp[i][k] = rp[i][k] + (-1.0f * lr) * u;
                }
            for (int i = 0; i < 5; i++)
                same &= !memcmp(rp[i], p[i], sizes[i] * 4) && !memcmp(rm[i], o.mu[i], sizes[i] * 4) &&
                        !memcmp(rv[i], o.nu[i], sizes[i] * 4);
        }
        CHECK_MSG(same, "variant %d: the optimizer differs from the formula", variant);
        CHECK_EQ_INT(clipped_steps, variant >= 2 ? 6 : 0);
        for (int i = 0; i < 5; i++) {
            free(p[i]);
            free(g[i]);
            free(rp[i]);
            free(rm[i]);
            free(rv[i]);
        }
        train_optim_release(&o);
    }
}

static void test_bad_config(void) {
    train_optim o;
    const char *names[2] = {"a", "a"};
    const uint64_t numel[2] = {2, 2};
    train_adamw_config c = train_adamw_finetune(1e-3, 10);
    CHECK_EQ_INT(train_optim_init(&o, &c, 2, names, numel), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(strstr(needle_last_error(), "given twice") != NULL);
    c.warmup_steps = 10;
    CHECK_EQ_INT(train_optim_init(&o, &c, 1, names, numel), NEEDLE_ERR_INVALID_ARGUMENT);
    c = train_adamw_finetune(1e-3, 1); /* one step leaves no room for warm-up, as in optax */
    CHECK_EQ_INT(train_optim_init(&o, &c, 1, names, numel), NEEDLE_ERR_INVALID_ARGUMENT);
    c = train_adamw_finetune(1e-3, 10);
    c.b2 = 1.0;
    CHECK_EQ_INT(train_optim_init(&o, &c, 1, names, numel), NEEDLE_ERR_INVALID_ARGUMENT);
    c = train_adamw_finetune(NAN, 10);
    CHECK_EQ_INT(train_optim_init(&o, &c, 1, names, numel), NEEDLE_ERR_INVALID_ARGUMENT);
    c = train_adamw_finetune(1e-3, 10);
    c.clip_norm = -1;
    CHECK_EQ_INT(train_optim_init(&o, &c, 1, names, numel), NEEDLE_ERR_INVALID_ARGUMENT);
    /* no clipping and no decay: plain Adam on a zero gradient leaves the parameter */
    c = train_adamw_finetune(1e-3, 10);
    c.clip_norm = 0;
    c.weight_decay = 0;
    CHECK_EQ_INT(train_optim_init(&o, &c, 1, names, numel), 0);
    float p[2] = {1, -2}, g[2] = {0, 0}, *pp = p;
    const float *gg = g;
    for (int s = 0; s < 3; s++) CHECK_EQ_INT(train_optim_step(&o, &pp, &gg, NULL), 0);
    CHECK(p[0] == 1 && p[1] == -2);
    train_optim_release(&o);
}

int main(void) {
    RUN(test_schedule_and_warmup);
    RUN(test_matches_optax);
    RUN(test_save_restore_continue);
    RUN(test_vector_loop_is_scalar_formula);
    RUN(test_bad_config);
    return test_summary();
}
