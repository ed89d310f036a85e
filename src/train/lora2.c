/* LoRA and CQ straight-through over the Needle 2 training core (see lora2.h): the same
 * steps as lora3.c over the g2_ model type (the two cores share no model type). */
#include "train/lora2.h"

#include <stdlib.h>
#include <string.h>

#include "train/cq_ste.h"
#include "train/tgemm.h"
#include "util/error.h"

/* CQ fake quantization on the model's threads (train/cq_ste.h, shared with lora3.c) */
static void run_g2(const void *core, void (*fn)(void *arg, int i, int n), void *arg) {
    g2_run_parallel(core, fn, arg);
}

/* [lead][in][out] grouped along `in` (a kernel or mHC phi: _reduces_second_last) */
static int cq_second_last(const g2_model *m, const cq_codebooks *cb, float *w, uint64_t lead, uint32_t in,
                          uint32_t out) {
    int st = 0;
    for (uint64_t l = 0; l < lead && !st; l++)
        st = train_cq_fake_quant(run_g2, m, cb, G2_CQ_WEIGHT_BITS, w + l * in * out, out, in, 1, out);
    return st;
}

/* rows x cols grouped along cols (the embeddings) */
static int cq_rows(const g2_model *m, const cq_codebooks *cb, float *w, uint32_t rows, uint32_t cols) {
    return train_cq_fake_quant(run_g2, m, cb, G2_CQ_WEIGHT_BITS, w, rows, cols, cols, 1);
}

static int ends_with(const char *s, const char *suffix) {
    const size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int g2_cq_weights(g2_model *m, const cq_codebooks *cb) {
    for (uint32_t i = 0; i < g2_tensor_count(m); i++) {
        g2_tensor *t = g2_tensor_at(m, i);
        if (t->ndim < 2 || !t->numel) continue;
        const char *last = strrchr(t->name, '/');
        last = last ? last + 1 : t->name;
        const uint32_t in = (uint32_t)t->shape[t->ndim - 2], out = (uint32_t)t->shape[t->ndim - 1];
        int st = 0;
        if (!strcmp(last, "kernel") || !strncmp(last, "mhc_phi", 7))
            st = cq_second_last(m, cb, t->w, t->numel / ((uint64_t)in * out), in, out);
        else if (ends_with(t->name, "embedding"))
            st = cq_rows(m, cb, t->w, (uint32_t)(t->numel / out), out);
        if (st) return st;
    }
    return 0;
}

static float *grow(float **p, size_t *cap, size_t n) {
    if (n > *cap) {
        float *q = realloc(*p, n * sizeof *q);
        if (!q) return NULL;
        *p = q, *cap = n;
    }
    return *p;
}

/* ---- the prepared run (lora2.h) ------------------------------------------------------- */

struct g2_lora_prep {
    g2_model *m;
    const cq_codebooks *cb;
    uint32_t n;            /* adapted kernels */
    g2_tensor **kern;      /* the adapted kernels of m, in the adapter's order */
    float **base;          /* their base values */
    int *was_frozen;       /* every tensor's flag before prepare */
    float *bt, *at;        /* transposed B and A of one layer (the dA / dB products) */
    float *ab;             /* A @ B of one layer (the merge) */
    size_t bt_cap, at_cap, ab_cap;
};

static int is_cq_leaf(const g2_tensor *t) {
    if (t->ndim < 2 || !t->numel) return 0;
    const char *last = strrchr(t->name, '/');
    last = last ? last + 1 : t->name;
    return !strcmp(last, "kernel") || !strncmp(last, "mhc_phi", 7) || ends_with(t->name, "embedding");
}

static int cq_leaf(g2_model *m, const cq_codebooks *cb, g2_tensor *t) {
    const uint32_t in = (uint32_t)t->shape[t->ndim - 2], out = (uint32_t)t->shape[t->ndim - 1];
    const char *last = strrchr(t->name, '/');
    last = last ? last + 1 : t->name;
    if (!strcmp(last, "kernel") || !strncmp(last, "mhc_phi", 7))
        return cq_second_last(m, cb, t->w, t->numel / ((uint64_t)in * out), in, out);
    if (ends_with(t->name, "embedding")) return cq_rows(m, cb, t->w, (uint32_t)(t->numel / out), out);
    return 0;
}

void g2_lora_finish(g2_lora_prep *p) {
    if (!p) return;
    for (uint32_t k = 0; k < p->n; k++)
        if (p->kern && p->kern[k] && p->base && p->base[k])
            memcpy(p->kern[k]->w, p->base[k], p->kern[k]->numel * sizeof(float));
    for (uint32_t i = 0; p->was_frozen && i < g2_tensor_count(p->m); i++)
        g2_tensor_at(p->m, i)->frozen = p->was_frozen[i];
    for (uint32_t k = 0; p->base && k < p->n; k++) free(p->base[k]);
    free(p->base);
    free(p->kern);
    free(p->was_frozen);
    free(p->bt);
    free(p->at);
    free(p->ab);
    free(p);
}

int g2_lora_prepare(g2_model *m, const train_adapter *ad, const cq_codebooks *cb, g2_lora_prep **out) {
    *out = NULL;
    g2_lora_prep *p = calloc(1, sizeof *p);
    const uint32_t nt = g2_tensor_count(m);
    if (!p) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    p->m = m, p->cb = cb, p->n = ad->n;
    p->kern = calloc(ad->n ? ad->n : 1, sizeof *p->kern);
    p->base = calloc(ad->n ? ad->n : 1, sizeof *p->base);
    p->was_frozen = calloc(nt, sizeof *p->was_frozen);
    if (!p->kern || !p->base || !p->was_frozen) {
        free(p->was_frozen), p->was_frozen = NULL;
        g2_lora_finish(p);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (uint32_t i = 0; i < nt; i++) p->was_frozen[i] = g2_tensor_at(m, i)->frozen;
    int st = 0;
    for (uint32_t k = 0; k < ad->n && !st; k++) {
        const train_lora *lo = &ad->lora[k];
        g2_tensor *t = g2_find(m, lo->path);
        const uint32_t nd = lo->a.ndim;
        if (!t || nd < 2 || t->ndim != nd || lo->b.ndim != nd) {
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: %s is not a kernel of the model", lo->path);
            break;
        }
        const uint64_t in = lo->a.shape[nd - 2], r = lo->a.shape[nd - 1], out_ = lo->b.shape[nd - 1];
        if (!r || t->shape[nd - 2] != in || t->shape[nd - 1] != out_ ||
            t->numel / (in * out_) != lo->a.numel / (in * r) || lo->b.numel / (r * out_) != lo->a.numel / (in * r)) {
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: %s: A @ B does not have the kernel's shape",
                             lo->path);
            break;
        }
        for (uint32_t q = 0; q < k; q++)
            if (p->kern[q] == t) st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: %s adapted twice", lo->path);
        p->kern[k] = t;
        p->base[k] = st ? NULL : malloc(t->numel * sizeof(float));
        if (!st && !p->base[k]) st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        if (!st) memcpy(p->base[k], t->w, t->numel * sizeof(float));
    }
    if (st) {
        g2_lora_finish(p);
        return st;
    }
    /* the frozen CQ leaves, once (the engram tables and the embedding are most of it) */
    for (uint32_t i = 0; i < nt && cb && !st; i++) {
        g2_tensor *t = g2_tensor_at(m, i);
        int adapted = 0;
        for (uint32_t k = 0; k < p->n; k++) adapted |= p->kern[k] == t;
        if (!adapted && is_cq_leaf(t)) st = cq_leaf(m, cb, t);
    }
    /* only the adapted kernels' gradients are needed */
    for (uint32_t i = 0; i < nt; i++) g2_tensor_at(m, i)->frozen = 1;
    for (uint32_t k = 0; k < p->n; k++) p->kern[k]->frozen = 0;
    if (st) {
        g2_lora_finish(p);
        return st;
    }
    *out = p;
    return 0;
}

/* The products of the adapter's gradient, C = A B on the model's threads (tgemm.h) */
typedef struct ab_job {
    const tg_level *lv;
    tg_gemm g;
} ab_job;

static void ab_worker(void *arg, int i, int n) {
    const ab_job *j = arg;
    tg_share(j->lv, &j->g, i, n);
}

static void product(const g2_model *m, const float *A, const float *B, float *C, uint32_t M, uint32_t N, uint32_t K) {
    ab_job j = {tg_level_best(), {A, B, C, K, N, N, M, N, K, 0}};
    g2_run_parallel(m, ab_worker, &j);
}

int g2_lora_step(g2_lora_prep *p, const train_adapter *ad, const int32_t *ids, const float *mask, uint32_t B,
                 uint32_t T, double *loss, float **dA, float **dB) {
    *loss = 0;
    g2_model *m = p->m;
    if (ad->n != p->n) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: not the one prepared");
    int st = 0;
    /* merge: W = W0 + scale * (A @ B) per leading index (the product on tgemm), then CQ of
     * the adapted kernels */
    for (uint32_t k = 0; k < ad->n && !st; k++) {
        const train_lora *lo = &ad->lora[k];
        g2_tensor *t = p->kern[k];
        const uint32_t nd = lo->a.ndim;
        const uint32_t in = (uint32_t)lo->a.shape[nd - 2], r = (uint32_t)lo->a.shape[nd - 1],
                       out = (uint32_t)lo->b.shape[nd - 1];
        const uint64_t lead = t->numel / ((uint64_t)in * out);
        float *ab = grow(&p->ab, &p->ab_cap, (size_t)in * out);
        if (!ab) {
            st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        const float sc = (float)ad->scale;
        for (uint64_t l = 0; l < lead; l++) {
            const float *A = lo->a.data + l * in * r, *Bm = lo->b.data + l * r * out, *W0 = p->base[k] + l * in * out;
            float *W = t->w + l * in * out;
            product(m, A, Bm, ab, in, out, r);
            for (size_t q = 0; q < (size_t)in * out; q++) W[q] = W0[q] + sc * ab[q];
        }
    }
    for (uint32_t k = 0; k < ad->n && p->cb && !st; k++) st = cq_leaf(m, p->cb, p->kern[k]);
    if (!st) st = g2_loss(m, ids, mask, B, T, 1, loss);
    /* dA = scale * G B^T, dB = scale * A^T G, per leading index */
    for (uint32_t k = 0; k < ad->n && !st; k++) {
        const train_lora *lo = &ad->lora[k];
        const g2_tensor *t = p->kern[k];
        const uint32_t nd = lo->a.ndim;
        const uint32_t in = (uint32_t)lo->a.shape[nd - 2], r = (uint32_t)lo->a.shape[nd - 1],
                       out = (uint32_t)lo->b.shape[nd - 1];
        const uint64_t lead = t->numel / ((uint64_t)in * out);
        float *bt = grow(&p->bt, &p->bt_cap, (size_t)out * r), *at = grow(&p->at, &p->at_cap, (size_t)r * in);
        if (!bt || !at) {
            st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        const float sc = (float)ad->scale;
        for (uint64_t l = 0; l < lead; l++) {
            const float *A = lo->a.data + l * in * r, *Bm = lo->b.data + l * r * out, *G = t->g + l * in * out;
            float *gA = dA[k] + l * in * r, *gB = dB[k] + l * r * out;
            tg_transpose(Bm, out, bt, r, r, out); /* bt [out][r] */
            product(m, G, bt, gA, in, r, out);
            tg_transpose(A, r, at, in, in, r); /* at [r][in] */
            product(m, at, G, gB, r, out, in);
            for (size_t q = 0; q < (size_t)in * r; q++) gA[q] *= sc;
            for (size_t q = 0; q < (size_t)r * out; q++) gB[q] *= sc;
        }
    }
    return st;
}

/* One step on its own: prepare, step, finish, and the frozen CQ leaves put back. */
int g2_lora_loss(g2_model *m, const train_adapter *ad, const cq_codebooks *cb, const int32_t *ids,
                 const float *mask, uint32_t B, uint32_t T, double *loss, float **dA, float **dB) {
    *loss = 0;
    const uint32_t nt = g2_tensor_count(m);
    float **saved = calloc(nt, sizeof *saved);
    if (!saved) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    int st = 0;
    for (uint32_t i = 0; i < nt && cb && !st; i++) { /* prepare quantizes these in place */
        g2_tensor *t = g2_tensor_at(m, i);
        if (!is_cq_leaf(t)) continue;
        saved[i] = malloc(t->numel * sizeof *saved[i]);
        if (!saved[i])
            st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        else
            memcpy(saved[i], t->w, t->numel * sizeof *t->w);
    }
    g2_lora_prep *p = NULL;
    if (!st) st = g2_lora_prepare(m, ad, cb, &p);
    if (!st) st = g2_lora_step(p, ad, ids, mask, B, T, loss, dA, dB);
    g2_lora_finish(p);
    for (uint32_t i = 0; i < nt; i++) {
        g2_tensor *t = g2_tensor_at(m, i);
        if (saved[i]) memcpy(t->w, saved[i], t->numel * sizeof *t->w);
        free(saved[i]);
    }
    free(saved);
    return st;
}
