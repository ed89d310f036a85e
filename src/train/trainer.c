/* The fine-tuning loop (see trainer.h). */
#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export/export_model.h"
#include "export/export_model_v3.h"
#include "train/grad2.h"
#include "train/grad3.h"
#include "train/lora2.h"
#include "train/lora3.h"
#include "train/np_pcg64.h"
#include "train/optim.h"
#include "util/clock.h"
#include "util/error.h"

/* ---- the Needle 3 descriptor ------------------------------------------------------------ */

/* The model and, in a LoRA run, its prepared state (g3_lora_prepare: the frozen CQ leaves
 * quantized once, so each step re-quantizes only the adapted kernels). */
typedef struct g3_handle {
    g3_model *m;
    g3_lora_prep *prep;
} g3_handle;
#define G3M(h) (((g3_handle *)(h))->m)

static int g3d_from_checkpoint(const char *config_json, const st_file *ckpt, void **model) {
    export3_config cfg;
    int st = export3_config_parse(config_json, strlen(config_json), &cfg);
    if (st) return st;
    g3_handle *h = calloc(1, sizeof *h);
    if (!h) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    st = g3_model_from_checkpoint(&cfg, ckpt, &h->m);
    if (st) {
        free(h);
        return st;
    }
    *model = h;
    return 0;
}
static void g3d_free(void *h) {
    if (!h) return;
    g3_lora_finish(((g3_handle *)h)->prep);
    g3_model_free(G3M(h));
    free(h);
}
static uint32_t g3d_count(void *h) { return g3_tensor_count(G3M(h)); }
static void g3d_tensor(void *h, uint32_t i, train_param *out) {
    g3_tensor *t = g3_tensor_at(G3M(h), i);
    out->name = t->name;
    out->ndim = t->ndim;
    out->shape = t->shape;
    out->numel = t->numel;
    out->w = t->w;
    out->g = t->g;
}
static void g3d_set_frozen(void *h, uint32_t i, int frozen) { g3_tensor_at(G3M(h), i)->frozen = frozen; }
static int g3d_loss(void *h, const int32_t *ids, const float *mask, uint32_t B, uint32_t T,
                    int grads, double *loss) {
    return g3_loss(G3M(h), ids, mask, B, T, grads, loss);
}
static int g3d_lora_loss(void *h, const train_adapter *ad, const cq_codebooks *cb,
                         const int32_t *ids, const float *mask, uint32_t B, uint32_t T,
                         double *loss, float **dA, float **dB) {
    g3_handle *g = h;
    /* prepared with the same codebooks (the loop passes the same every step) */
    if (g->prep) return g3_lora_step(g->prep, ad, ids, mask, B, T, loss, dA, dB);
    return g3_lora_loss(g->m, ad, cb, ids, mask, B, T, loss, dA, dB);
}
static int g3d_prepare(void *h, const train_adapter *ad, const cq_codebooks *cb) {
    g3_handle *g = h;
    if (!ad) return 0; /* full-parameter training: every tensor changes, nothing to keep */
    g3_lora_finish(g->prep);
    g->prep = NULL;
    return g3_lora_prepare(g->m, ad, cb, &g->prep);
}
static int g3d_cq_weights(void *h, const cq_codebooks *cb) { return g3_cq_weights(G3M(h), cb); }
static void g3d_set_quant(void *h, int on) { g3_set_fake_quant(G3M(h), on); }
static int g3d_set_threads(void *h, int n) { return g3_set_threads(G3M(h), n); }

static const train_generation generation3 = {
    .generation = 3,
    .from_checkpoint = g3d_from_checkpoint,
    .free = g3d_free,
    .tensor_count = g3d_count,
    .tensor = g3d_tensor,
    .set_frozen = g3d_set_frozen,
    .loss = g3d_loss,
    .lora_loss = g3d_lora_loss,
    .cq_weights = g3d_cq_weights,
    .set_quant = g3d_set_quant,
    .set_threads = g3d_set_threads,
    .prepare = g3d_prepare,
};

/* ---- the Needle 2 descriptor ------------------------------------------------------------ */

/* cactus-needle 2.0.15 finetune_local runs the loop of 3.2.8 (the same template, _encode,
 * fit_max_len buckets, default_rng split and per-epoch permutations, min(int(n * split),
 * n - 1) held out, warm-up min(max(1, total // 20), total - 1), cosine to 0, clip 1.0,
 * AdamW defaults, mean of the held-out batches' losses). Where it differs, the loop
 * follows 2.0.15 through this descriptor or needs nothing:
 *   - the loss: grad2/lora2 (CQ W4 STE + A8 with no K/V quantization: its
 *     configure_deploy(kv_bits=8) turns K/V quantization off; grad2.h);
 *   - LoRA targets: 2.0.15 also requires a `stack` path component; every g2 kernel under
 *     layers/ is under stack/, so train_is_lora_target picks the same kernels;
 *   - its data reader skips lines without `query` (it has no chat format); ours converts
 *     single-turn chat lines as 3.2.8 does (a superset: an official file reads the same);
 *   - its adapter is a pickle ({lora, scale, base, rank, qat_bits, qat_bits_map, seed});
 *     ours is the safetensors adapter of 3.2.8 (train/checkpoint.h), no pickle written;
 *   - no resume, no periodic saves, no Ctrl-C save there: ours as for Needle 3. */
static int g2d_from_checkpoint(const char *config_json, const st_file *ckpt, void **model) {
    export_config cfg;
    int st = export_config_parse(config_json, strlen(config_json), &cfg);
    if (st) return st;
    if (cfg.weight_bits[0])
        /* finetune_local then fake-quantizes by the mixed map (cq_ste_mixed_params) */
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                           "the config has weight_bits \"%s\": the Needle 2 trainer does the CQ W4 "
                           "default only",
                           cfg.weight_bits);
    return g2_model_from_checkpoint(&cfg, ckpt, (g2_model **)model);
}
static void g2d_free(void *m) { g2_model_free(m); }
static uint32_t g2d_count(void *m) { return g2_tensor_count(m); }
static void g2d_tensor(void *m, uint32_t i, train_param *out) {
    g2_tensor *t = g2_tensor_at(m, i);
    out->name = t->name;
    out->ndim = t->ndim;
    out->shape = t->shape;
    out->numel = t->numel;
    out->w = t->w;
    out->g = t->g;
}
static void g2d_set_frozen(void *m, uint32_t i, int frozen) { g2_tensor_at(m, i)->frozen = frozen; }
static int g2d_loss(void *m, const int32_t *ids, const float *mask, uint32_t B, uint32_t T,
                    int grads, double *loss) {
    return g2_loss(m, ids, mask, B, T, grads, loss);
}
static int g2d_lora_loss(void *m, const train_adapter *ad, const cq_codebooks *cb,
                         const int32_t *ids, const float *mask, uint32_t B, uint32_t T,
                         double *loss, float **dA, float **dB) {
    return g2_lora_loss(m, ad, cb, ids, mask, B, T, loss, dA, dB);
}
static int g2d_cq_weights(void *m, const cq_codebooks *cb) { return g2_cq_weights(m, cb); }
static void g2d_set_quant(void *m, int on) { g2_set_fake_quant(m, on); }
static int g2d_set_threads(void *m, int n) { return g2_set_threads(m, n); }

static const train_generation generation2 = {
    .generation = 2,
    .from_checkpoint = g2d_from_checkpoint,
    .free = g2d_free,
    .tensor_count = g2d_count,
    .tensor = g2d_tensor,
    .set_frozen = g2d_set_frozen,
    .loss = g2d_loss,
    .lora_loss = g2d_lora_loss,
    .cq_weights = g2d_cq_weights,
    .set_quant = g2d_set_quant,
    .set_threads = g2d_set_threads,
    .prepare = NULL, /* lora2 has no prepared form: every step quantizes the merged tree */
};

const train_generation *train_generation_for(int generation) {
    return generation == 3 ? &generation3 : generation == 2 ? &generation2 : NULL;
}

/* ---- helpers -------------------------------------------------------------------------------- */

static int has_component(const char *path, const char *comp) {
    const size_t n = strlen(comp);
    for (const char *p = path; p; p = strchr(p, '/')) {
        if (*p == '/') p++;
        if (!strncmp(p, comp, n) && (p[n] == '/' || p[n] == 0)) return 1;
    }
    return 0;
}

int train_is_lora_target(const char *name, const float *w, uint64_t numel) {
    static const char *const targets[] = {"q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"};
    const char *last = strrchr(name, '/');
    if (!last || strcmp(last + 1, "kernel") || !has_component(name, "layers")) return 0;
    int hit = 0;
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++)
        hit |= has_component(name, targets[i]);
    if (!hit) return 0;
    for (uint64_t i = 0; i < numel; i++)
        if (fabsf(w[i]) > 1e-6f) return 1;
    return 0;
}

/* The order optax's tree walk visits the paths in: component by component (a component
 * that is a prefix of another sorts first). */
static int path_compare(const char *a, const char *b) {
    for (;; a++, b++) {
        const unsigned ca = *a == 0 ? 0u : *a == '/' ? 1u : (unsigned char)*a + 1u;
        const unsigned cb = *b == 0 ? 0u : *b == '/' ? 1u : (unsigned char)*b + 1u;
        if (ca != cb) return ca < cb ? -1 : 1;
        if (!ca) return 0;
    }
}

typedef struct slot {
    const char *name;
    float *w, *g;
    uint64_t numel;
} slot;

static int slot_compare(const void *a, const void *b) {
    return path_compare(((const slot *)a)->name, ((const slot *)b)->name);
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- the run ---------------------------------------------------------------------------------- */

typedef struct run {
    const train_options *o;
    void *model;
    st_file base;
    char *config;
    ft_data data;
    int quant;
    uint32_t n, n_val, count, spe, total, T;
    uint32_t *rows;  /* data rows: [0, n_val) held out, then the training rows */
    uint32_t *order; /* this epoch's permutation of the training rows */
    np_pcg64 rng;
    int32_t *ids;
    float *mask;
    uint8_t *mask8;
    cq_codebooks cb;
    /* LoRA */
    train_adapter ad;
    float **dA, **dB;
    uint32_t n_grads; /* entries of dA and dB (ad moves to the result at the end) */
    /* full: the parameters (the model's, or a float master copy under quant) */
    uint32_t np;
    float **master;
    /* the optimizer's view, in optax's order */
    slot *slots;
    uint32_t n_slots;
    train_optim opt;
    int opt_ready;
    uint64_t digest;
} run;

static int oom(void) { return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory"); }

/* rows i0.. of `which` (count rows) into the batch buffers; returns their tokens (without
 * the padding, which the cores do not run: train/dense_ref.h row_length) */
static uint32_t fill_batch(run *r, const uint32_t *which, uint32_t B) {
    uint32_t tokens = 0;
    for (uint32_t b = 0; b < B; b++) {
        const uint32_t n = r->data.ex[which[b]].n;
        tokens += n < r->T ? n : r->T;
        ft_data_row(&r->data, which[b], r->ids + (size_t)b * r->T, r->mask8 + (size_t)b * r->T);
        for (uint32_t t = 0; t < r->T; t++)
            r->mask[(size_t)b * r->T + t] = r->mask8[(size_t)b * r->T + t];
    }
    return tokens;
}

/* the loss (and with grads, the gradient into the optimizer's slots) of the batch */
static int batch_loss(run *r, uint32_t B, int grads, double *loss) {
    const train_generation *g = r->o->gen;
    if (!r->o->full)
        return g->lora_loss(r->model, &r->ad, r->quant ? &r->cb : NULL, r->ids, r->mask, B, r->T,
                            loss, r->dA, r->dB);
    if (r->master) {
        /* CQ straight-through: the quantized copy runs, its gradient updates the master */
        for (uint32_t i = 0; i < r->np; i++) {
            train_param p;
            g->tensor(r->model, i, &p);
            memcpy(p.w, r->master[i], p.numel * sizeof *p.w);
        }
        const int st = g->cq_weights(r->model, &r->cb);
        if (st) return st;
    }
    return g->loss(r->model, r->ids, r->mask, B, r->T, grads, loss);
}

static char *run_json(const run *r, uint32_t step) {
    const train_options *o = r->o;
    char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"needle_finetune\": {\"step\": %u, \"total_steps\": %u, \"seed\": %" PRIu64
             ", \"epochs\": %u, "
             "\"batch_size\": %u, \"lr\": %.17g, \"lora_rank\": %u, \"lora_alpha\": %.17g, "
             "\"val_split\": %.17g, "
             "\"max_len\": %u, \"full\": %d, \"quant\": %d, \"examples\": %u, \"seq_len\": %u, "
             "\"data_digest\": \"%016" PRIx64 "\"}}",
             step, r->total, o->seed, o->epochs, o->batch_size, o->lr, o->full ? 0u : o->lora_rank,
             o->full ? 0.0 : o->lora_alpha, o->val_split, o->max_len, o->full, r->quant, r->n, r->T,
             r->digest);
    return strdup(buf);
}

/* frees what train_optim_save put into a staged checkpoint whose tensors we own */
static void release_staged(train_checkpoint *ck) {
    for (uint32_t i = 0; i < ck->n_optim; i++) train_tensor_release(&ck->optim_tensors[i]);
    free(ck->optim_tensors);
    free(ck->optim);
    free(ck->run);
    free(ck->tensors);
    memset(ck, 0, sizeof *ck);
}

/* the adapter, the state, or the full checkpoint, at `step` */
static int save(run *r, uint32_t step) {
    const train_options *o = r->o;
    train_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    ck.generation = o->gen->generation;
    ck.format_version = TRAIN_CHECKPOINT_FORMAT;
    ck.config = r->config;
    ck.step = step;
    ck.run = run_json(r, step);
    int st = ck.run ? 0 : oom();
    if (!st && !o->full) {
        st = train_adapter_write(o->out_path, &r->ad);
        ck.tensors = calloc(2 * (size_t)r->ad.n + 1, sizeof *ck.tensors);
        if (!st && !ck.tensors) st = oom();
        for (uint32_t i = 0; !st && i < r->ad.n; i++) {
            ck.tensors[ck.n++] = r->ad.lora[i].a;
            ck.tensors[ck.n++] = r->ad.lora[i].b;
        }
    } else if (!st) {
        /* every tensor of the base, the trained ones with their values now */
        ck.tensors = calloc((size_t)r->base.n + 1, sizeof *ck.tensors);
        if (!ck.tensors) st = oom();
        for (uint32_t i = 0; !st && i < r->base.n; i++) {
            const st_tensor *src = &r->base.tensors[i];
            if (!strncmp(src->name, TRAIN_OPTIM_PREFIX, strlen(TRAIN_OPTIM_PREFIX))) continue;
            train_tensor *t = &ck.tensors[ck.n];
            const slot *hit = NULL;
            for (uint32_t k = 0; k < r->n_slots && !hit; k++)
                if (!strcmp(r->slots[k].name, src->name)) hit = &r->slots[k];
            if (hit) {
                t->name = (char *)src->name;
                t->ndim = src->ndim;
                memcpy(t->shape, src->shape, sizeof t->shape);
                t->numel = src->numel;
                t->data = hit->w;
            } else {
                /* an untrained tensor (a probe head): as the base has it, widened to F32
                 * (its copy is freed after the write) */
                train_tensor copy;
                if ((st = train_tensor_from_st(src, &copy))) break;
                free(copy.name);
                *t = copy;
                t->name = (char *)src->name;
            }
            ck.n++;
        }
    }
    if (!st) st = train_optim_save(&r->opt, &ck);
    if (!st) st = train_checkpoint_write(o->full ? o->out_path : o->state_path, &ck);
    if (o->full)
        for (uint32_t i = 0; i < ck.n; i++) {
            int mine = 0;
            for (uint32_t k = 0; k < r->n_slots && !mine; k++)
                mine = ck.tensors[i].data == r->slots[k].w;
            if (!mine) free(ck.tensors[i].data);
        }
    ck.config = NULL;
    release_staged(&ck);
    return st;
}

static int restore(run *r, uint32_t *step) {
    const train_options *o = r->o;
    const char *path = o->full ? o->out_path : o->state_path;
    train_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    int st = train_checkpoint_read(path, NULL, o->gen->generation, &ck);
    if (st) return st;
    cJSON *j = cJSON_Parse(ck.run);
    const cJSON *ft = cJSON_GetObjectItemCaseSensitive(j, "needle_finetune");
    char *want = run_json(r, 0);
    cJSON *w = want ? cJSON_Parse(want) : NULL;
    const cJSON *wft = cJSON_GetObjectItemCaseSensitive(w, "needle_finetune");
    if (!ft || !wft || ck.step < 0 || !ck.optim) {
        st = needle_fail(NEEDLE_ERR_FORMAT,
                         "%s is not a needle finetune state (no step, settings or optimizer state)",
                         path);
    } else {
        /* every setting that shapes the run must be the same */
        for (const cJSON *it = wft->child; it && !st; it = it->next) {
            if (!strcmp(it->string, "step")) continue;
            const cJSON *have = cJSON_GetObjectItemCaseSensitive(ft, it->string);
            if (!have || !cJSON_Compare(have, it, 1)) {
                char *a = have ? cJSON_PrintUnformatted(have) : NULL,
                     *b = cJSON_PrintUnformatted(it);
                st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                                 "--resume: %s was made with %s %s, this run has %s (same data and "
                                 "settings needed)",
                                 path, it->string, a ? a : "(none)", b ? b : "?");
                free(a);
                free(b);
            }
        }
    }
    if (!st && (uint64_t)ck.step > r->total)
        st = needle_fail(NEEDLE_ERR_FORMAT, "%s: step %" PRId64 " is past the run's %u steps", path,
                         ck.step, r->total);
    /* the parameters */
    for (uint32_t k = 0; k < r->n_slots && !st; k++) {
        const train_tensor *t = train_checkpoint_find(&ck, r->slots[k].name);
        if (!t || t->numel != r->slots[k].numel)
            st = needle_fail(NEEDLE_ERR_FORMAT, "%s: no tensor %s of the expected size", path,
                             r->slots[k].name);
        else memcpy(r->slots[k].w, t->data, t->numel * sizeof(float));
    }
    if (!st) st = train_optim_restore(&r->opt, &ck);
    if (!st && r->opt.count != (uint32_t)ck.step)
        st = needle_fail(NEEDLE_ERR_FORMAT, "%s: optimizer count %u != step %" PRId64, path,
                         r->opt.count, ck.step);
    if (!st) *step = (uint32_t)ck.step;
    cJSON_Delete(j);
    cJSON_Delete(w);
    free(want);
    train_checkpoint_release(&ck);
    return st;
}

static void emit(const run *r, const train_event *e) {
    if (r->o->progress) r->o->progress(r->o->progress_user, e);
}

/* A = N(0, 1) / r (Box-Muller over PCG64(seed + 1)), B = 0, on every target kernel */
static int init_adapter(run *r) {
    const train_options *o = r->o;
    const train_generation *g = o->gen;
    const uint32_t nt = g->tensor_count(r->model);
    train_adapter *ad = &r->ad;
    ad->lora = calloc(nt ? nt : 1, sizeof *ad->lora);
    if (!ad->lora) return oom();
    ad->scale = o->lora_alpha / (double)o->lora_rank;
    ad->rank = o->lora_rank;
    ad->seed = (int64_t)o->seed;
    ad->has_seed = 1;
    ad->base = strdup(o->base_path ? o->base_path : "");
    if (!ad->base) return oom();
    np_pcg64 init;
    np_pcg64_seed(&init, o->seed + 1);
    for (uint32_t i = 0; i < nt; i++) {
        train_param p;
        g->tensor(r->model, i, &p);
        if (p.ndim < 2 || !train_is_lora_target(p.name, p.w, p.numel)) continue;
        train_lora *lo = &ad->lora[ad->n];
        const size_t nl = strlen(p.name);
        lo->path = strdup(p.name);
        lo->a.name = malloc(nl + 8);
        lo->b.name = malloc(nl + 8);
        if (!lo->path || !lo->a.name || !lo->b.name) {
            ad->n++;
            return oom();
        }
        snprintf(lo->a.name, nl + 8, "lora/%s/A", p.name);
        snprintf(lo->b.name, nl + 8, "lora/%s/B", p.name);
        const uint32_t nd = p.ndim;
        const uint64_t in = p.shape[nd - 2], out = p.shape[nd - 1], lead = p.numel / (in * out);
        lo->a.ndim = lo->b.ndim = nd;
        for (uint32_t d = 0; d + 2 < nd; d++) lo->a.shape[d] = lo->b.shape[d] = p.shape[d];
        lo->a.shape[nd - 2] = in;
        lo->a.shape[nd - 1] = o->lora_rank;
        lo->b.shape[nd - 2] = o->lora_rank;
        lo->b.shape[nd - 1] = out;
        lo->a.numel = lead * in * o->lora_rank;
        lo->b.numel = lead * o->lora_rank * out;
        lo->a.data = malloc(lo->a.numel * sizeof(float));
        lo->b.data = calloc(lo->b.numel, sizeof(float));
        ad->n++;
        if (!lo->a.data || !lo->b.data) return oom();
        for (uint64_t k = 0; k < lo->a.numel; k += 2) {
            double u1 = np_pcg64_double(&init), u2 = np_pcg64_double(&init);
            const double rad = sqrt(-2.0 * log(1.0 - u1)), ang = 6.283185307179586 * u2;
            lo->a.data[k] = (float)(rad * cos(ang)) / (float)o->lora_rank;
            if (k + 1 < lo->a.numel)
                lo->a.data[k + 1] = (float)(rad * sin(ang)) / (float)o->lora_rank;
        }
    }
    if (!ad->n)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "the base has no LoRA target kernels");
    return 0;
}

/* the optimizer's slots: LoRA A and B, or every parameter; sorted as optax walks them */
static int init_slots(run *r) {
    const train_generation *g = r->o->gen;
    if (!r->o->full) {
        r->slots = calloc(2 * (size_t)r->ad.n, sizeof *r->slots);
        r->dA = calloc(r->ad.n, sizeof *r->dA);
        r->dB = calloc(r->ad.n, sizeof *r->dB);
        if (!r->slots || !r->dA || !r->dB) return oom();
        r->n_grads = r->ad.n;
        for (uint32_t i = 0; i < r->ad.n; i++) {
            train_lora *lo = &r->ad.lora[i];
            r->dA[i] = calloc(lo->a.numel, sizeof(float));
            r->dB[i] = calloc(lo->b.numel, sizeof(float));
            if (!r->dA[i] || !r->dB[i]) return oom();
            r->slots[r->n_slots++] = (slot){lo->a.name, lo->a.data, r->dA[i], lo->a.numel};
            r->slots[r->n_slots++] = (slot){lo->b.name, lo->b.data, r->dB[i], lo->b.numel};
        }
    } else {
        r->np = g->tensor_count(r->model);
        r->slots = calloc(r->np ? r->np : 1, sizeof *r->slots);
        if (!r->slots) return oom();
        if (r->quant) {
            r->master = calloc(r->np ? r->np : 1, sizeof *r->master);
            if (!r->master) return oom();
        }
        for (uint32_t i = 0; i < r->np; i++) {
            train_param p;
            g->tensor(r->model, i, &p);
            g->set_frozen(r->model, i, 0);
            float *w = p.w;
            if (r->master) {
                r->master[i] = malloc(p.numel ? p.numel * sizeof(float) : 1);
                if (!r->master[i]) return oom();
                memcpy(r->master[i], p.w, p.numel * sizeof(float));
                w = r->master[i];
            }
            if (p.numel) r->slots[r->n_slots++] = (slot){p.name, w, p.g, p.numel};
        }
    }
    qsort(r->slots, r->n_slots, sizeof *r->slots, slot_compare);
    const char **names = calloc(r->n_slots, sizeof *names);
    uint64_t *numel = calloc(r->n_slots, sizeof *numel);
    if (!names || !numel) {
        free(names);
        free(numel);
        return oom();
    }
    for (uint32_t k = 0; k < r->n_slots; k++) {
        names[k] = r->slots[k].name;
        numel[k] = r->slots[k].numel;
    }
    const train_adamw_config cfg = train_adamw_finetune(r->o->lr, r->total);
    const int st = train_optim_init(&r->opt, &cfg, r->n_slots, names, numel);
    free(names);
    free(numel);
    r->opt_ready = !st;
    return st;
}

static int optim_step(run *r, train_step_info *info) {
    float **params = calloc(r->n_slots, sizeof *params);
    const float **grads = calloc(r->n_slots, sizeof *grads);
    int st = params && grads ? 0 : oom();
    for (uint32_t k = 0; !st && k < r->n_slots; k++) {
        params[k] = r->slots[k].w;
        grads[k] = r->slots[k].g;
    }
    if (!st) st = train_optim_step(&r->opt, params, grads, info);
    free(params);
    free(grads);
    return st;
}

static double validation_loss(run *r) {
    if (!r->n_val) return -1;
    const uint32_t bs = r->o->batch_size;
    double sum = 0;
    uint32_t batches = 0;
    for (uint32_t s = 0; s < r->n_val; s += bs) {
        const uint32_t B = r->n_val - s < bs ? r->n_val - s : bs;
        fill_batch(r, r->rows + s, B);
        double loss = 0;
        if (batch_loss(r, B, 0, &loss)) return NAN;
        sum += (double)(float)loss;
        batches++;
    }
    return sum / batches;
}

/* every id must be one the model embeds, every trained target one it predicts (the
 * official loss would index past its logits): else the data line is named */
static int check_vocab(run *r) {
    cJSON *c = cJSON_Parse(r->config);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, "vocab_size"),
                *ov = cJSON_GetObjectItemCaseSensitive(c, "out_vocab");
    const double vocab = cJSON_IsNumber(v) ? v->valuedouble : 0,
                 out = cJSON_IsNumber(ov) && ov->valuedouble > 0 ? ov->valuedouble : vocab;
    cJSON_Delete(c);
    if (!(vocab > 0)) return 0; /* the core checks what the config does not say */
    for (uint32_t i = 0; i < r->data.n; i++) {
        const ft_example *e = &r->data.ex[i];
        const uint32_t n = e->n < r->T ? e->n : r->T;
        for (uint32_t t = 0; t < n; t++) {
            const double limit = t > e->n_prompt ? out : vocab;
            if ((double)e->ids[t] >= limit) {
                char msg[256];
                snprintf(msg, sizeof msg,
                         "token id %d is past the model's %s (%.0f): the tokenizer does not fit "
                         "the checkpoint",
                         e->ids[t],
                         t > e->n_prompt ? "output vocabulary (out_vocab)" : "vocabulary", limit);
                if (r->o->report) r->o->report(r->o->report_user, e->line, FT_ERROR, msg);
                return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "line %u: %s", e->line, msg);
            }
        }
    }
    return 0;
}

static void run_release(run *r) {
    if (r->model) r->o->gen->free(r->model);
    if (r->dA)
        for (uint32_t i = 0; i < r->n_grads; i++) free(r->dA[i]);
    if (r->dB)
        for (uint32_t i = 0; i < r->n_grads; i++) free(r->dB[i]);
    free(r->dA);
    free(r->dB);
    if (r->master)
        for (uint32_t i = 0; i < r->np; i++) free(r->master[i]);
    free(r->master);
    free(r->slots);
    if (r->opt_ready) train_optim_release(&r->opt);
    free(r->rows);
    free(r->order);
    free(r->ids);
    free(r->mask);
    free(r->mask8);
    free(r->config);
    ft_data_free(&r->data);
    st_release(&r->base);
}

int train_run(const train_options *o, train_result *res) {
    memset(res, 0, sizeof *res);
    res->val_loss = -1;
    if (!o->gen || !o->base_image || !o->tokenizer || !o->data || !o->out_path ||
        (!o->full && !o->state_path))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train_run: missing input");
    if (!o->epochs || !o->batch_size || o->max_len < 2 || !(o->lr > 0) ||
        !(o->val_split >= 0 && o->val_split < 1) ||
        (!o->full && (!o->lora_rank || !(o->lora_alpha > 0))))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                           "train_run: epochs, batch size, rank > 0, max_len >= 2, lr and alpha > "
                           "0, val_split in [0, 1)");
    run r;
    memset(&r, 0, sizeof r);
    r.o = o;
    r.quant = o->quant < 0 ? !o->full : o->quant != 0;
    const train_generation *g = o->gen;
    int st = st_parse(o->base_image, o->base_size, &r.base);
    const char *cj = st ? NULL : o->config_json ? o->config_json : st_meta_get(&r.base, "config");
    if (!st && !cj)
        st = needle_fail(NEEDLE_ERR_FORMAT,
                         "%s has no `config` metadata (an official 3.x checkpoint has it; a "
                         "Needle 2 checkpoint needs its config: --config CONFIG.json)",
                         o->base_path ? o->base_path : "the base");
    if (!st && !(r.config = strdup(cj))) st = oom();
    if (!st) st = g->from_checkpoint(r.config, &r.base, &r.model);
    if (!st && o->threads >= 0) st = g->set_threads(r.model, o->threads);
    if (!st)
        st = ft_data_load(o->tokenizer, o->data, o->data_len, o->max_len, o->report, o->report_user,
                          &r.data);
    if (st) {
        run_release(&r);
        return st;
    }
    r.n = r.data.n;
    r.T = r.data.seq_len;
    if (!st) st = check_vocab(&r);
    if (st) {
        run_release(&r);
        return st;
    }
    if (!r.n) {
        run_release(&r);
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "no usable examples in the data");
    }
    /* n_val = min(int(n * val_split), n - 1), as Python computes it */
    const double want_val = floor((double)r.n * o->val_split);
    r.n_val = want_val > (double)(r.n - 1) ? r.n - 1 : (uint32_t)want_val;
    r.count = r.n - r.n_val;
    r.spe = (r.count + o->batch_size - 1) / o->batch_size;
    const uint64_t total = (uint64_t)o->epochs * r.spe;
    if (total < 2 || total > UINT32_MAX) {
        run_release(&r);
        return needle_fail(
            NEEDLE_ERR_INVALID_ARGUMENT,
            "%" PRIu64
            " training steps (%u examples after the held-out %u, batch %u, %u epochs): the "
            "schedule needs at least 2",
            total, r.count, r.n_val, o->batch_size, o->epochs);
    }
    r.total = (uint32_t)total;
    const uint32_t bmax = o->batch_size < r.n ? o->batch_size : r.n;
    r.rows = malloc(r.n * sizeof *r.rows);
    r.order = malloc(r.count * sizeof *r.order);
    r.ids = malloc((size_t)bmax * r.T * sizeof *r.ids);
    r.mask = malloc((size_t)bmax * r.T * sizeof *r.mask);
    r.mask8 = malloc((size_t)bmax * r.T);
    if (!r.rows || !r.order || !r.ids || !r.mask || !r.mask8) st = oom();
    /* the data's identity for --resume: every row's ids and mask */
    r.digest = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; !st && i < r.n; i++) {
        fill_batch(&r, &i, 1);
        r.digest = fnv1a(r.digest, r.ids, (size_t)r.T * sizeof *r.ids);
        r.digest = fnv1a(r.digest, r.mask8, r.T);
    }
    /* the split: default_rng(seed).permutation(n) when anything is held out */
    np_pcg64_seed(&r.rng, o->seed);
    if (!st) {
        if (r.n_val) np_pcg64_permutation(&r.rng, r.n, r.rows);
        else
            for (uint32_t i = 0; i < r.n; i++) r.rows[i] = i;
    }
    if (!st && r.quant)
        st = cq_codebooks_init(&r.cb, g->generation == 2 ? G2_CQ_GROUP : G3_CQ_GROUP);
    if (!st) g->set_quant(r.model, r.quant);
    if (!st && !o->full) st = init_adapter(&r);
    if (!st) st = init_slots(&r);
    uint32_t step = 0;
    if (!st && o->resume) {
        st = restore(&r, &step);
        if (!st)
            emit(&r,
                 &(train_event){.kind = TRAIN_EVENT_RESUMED, .step = step, .total_steps = r.total});
    }
    if (!st && g->prepare) st = g->prepare(r.model, o->full ? NULL : &r.ad, r.quant ? &r.cb : NULL);
    if (!st)
        emit(&r, &(train_event){.kind = TRAIN_EVENT_DATA,
                                .examples = r.n,
                                .seq_len = r.T,
                                .n_val = r.n_val,
                                .total_steps = r.total,
                                .epochs = o->epochs,
                                .targets = o->full ? r.n_slots : r.ad.n});
    const double t0 = util_clock_ms();
    double last_save = t0, last_loss = NAN;
    uint32_t done_here = 0;
    int stopped = 0;
    /* replay the generator to the step's epoch: one permutation per epoch begun */
    const uint32_t first_epoch = step / r.spe;
    for (uint32_t e = 0; !st && e < first_epoch; e++)
        np_pcg64_permutation(&r.rng, r.count, r.order);
    for (uint32_t e = first_epoch; !st && !stopped && e < o->epochs; e++) {
        np_pcg64_permutation(&r.rng, r.count, r.order);
        for (uint32_t b = step - e * r.spe; !st && b < r.spe; b++) {
            if ((o->stop && *o->stop) || (o->max_steps && done_here >= o->max_steps)) {
                stopped = 1;
                break;
            }
            const uint32_t start = b * o->batch_size;
            const uint32_t B = r.count - start < o->batch_size ? r.count - start : o->batch_size;
            uint32_t *which = r.order + start;
            for (uint32_t k = 0; k < B; k++) which[k] = r.rows[r.n_val + which[k]];
            const uint32_t tokens = fill_batch(&r, which, B);
            const double ts = util_clock_ms();
            double loss = 0;
            train_step_info info;
            st = batch_loss(&r, B, 1, &loss);
            if (!st) st = optim_step(&r, &info);
            if (st) break;
            step++;
            done_here++;
            last_loss = (double)(float)loss;
            const double now = util_clock_ms();
            emit(&r, &(train_event){.kind = TRAIN_EVENT_STEP,
                                    .step = step,
                                    .total_steps = r.total,
                                    .epoch = e + 1,
                                    .epochs = o->epochs,
                                    .loss = last_loss,
                                    .lr = info.lr,
                                    .batch_rows = B,
                                    .tokens = tokens,
                                    .step_seconds = (now - ts) / 1000,
                                    .elapsed_seconds = (now - t0) / 1000});
            if (o->checkpoint_minutes > 0 && now - last_save >= o->checkpoint_minutes * 60000 &&
                step < r.total) {
                if ((st = save(&r, step))) break;
                last_save = util_clock_ms();
                emit(&r, &(train_event){.kind = TRAIN_EVENT_CHECKPOINT,
                                        .step = step,
                                        .total_steps = r.total,
                                        .path = o->full ? o->out_path : o->state_path});
            }
        }
        if (st || stopped) break;
        const double val = validation_loss(&r);
        if (isnan(val))
            st = needle_fail(NEEDLE_ERR_STATE, "the validation loss failed: %s",
                             needle_last_error());
        res->val_loss = val;
        emit(&r, &(train_event){.kind = TRAIN_EVENT_EPOCH,
                                .step = step,
                                .total_steps = r.total,
                                .epoch = e + 1,
                                .epochs = o->epochs,
                                .loss = last_loss,
                                .val_loss = val});
    }
    if (!st) {
        st = save(&r, step);
        if (!st)
            emit(&r, &(train_event){.kind = TRAIN_EVENT_CHECKPOINT,
                                    .step = step,
                                    .total_steps = r.total,
                                    .path = o->full ? o->out_path : o->state_path});
    }
    if (!st) {
        res->finished = step == r.total;
        res->steps = step;
        res->total_steps = r.total;
        res->last_loss = last_loss;
        res->n_val = r.n_val;
        res->val_lines = malloc((r.n_val ? r.n_val : 1) * sizeof *res->val_lines);
        if (!res->val_lines) st = oom();
        for (uint32_t i = 0; !st && i < r.n_val; i++) res->val_lines[i] = r.data.ex[r.rows[i]].line;
        if (!st && !o->full) {
            res->adapter = r.ad;
            memset(&r.ad, 0, sizeof r.ad);
        }
    }
    run_release(&r);
    train_adapter_release(&r.ad);
    if (st) train_result_release(res);
    return st;
}

void train_result_release(train_result *r) {
    free(r->val_lines);
    train_adapter_release(&r->adapter);
    memset(r, 0, sizeof *r);
    r->val_loss = -1;
}
