/* LoRA and CQ straight-through over the Needle 2 training core (see lora2.h): the same
 * steps as lora3.c over the g2_ model type (the two cores share no model type). */
#include "train/lora2.h"

#include <stdlib.h>
#include <string.h>

#include "train/cq_ste.h"
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

int g2_lora_loss(g2_model *m, const train_adapter *ad, const cq_codebooks *cb, const int32_t *ids,
                 const float *mask, uint32_t B, uint32_t T, double *loss, float **dA, float **dB) {
    *loss = 0;
    const uint32_t nt = g2_tensor_count(m);
    float **saved = calloc(nt, sizeof *saved);
    if (!saved) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    int st = 0;
    for (uint32_t i = 0; i < nt && !st; i++) {
        g2_tensor *t = g2_tensor_at(m, i);
        if (!t->numel) continue;
        saved[i] = malloc(t->numel * sizeof *saved[i]);
        if (!saved[i])
            st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        else
            memcpy(saved[i], t->w, t->numel * sizeof *t->w);
    }
    /* merge: W + scale * A @ B, per leading index */
    for (uint32_t k = 0; k < ad->n && !st; k++) {
        const train_lora *lo = &ad->lora[k];
        g2_tensor *t = g2_find(m, lo->path);
        const uint32_t nd = lo->a.ndim;
        if (!t || nd < 2 || t->ndim != nd || lo->b.ndim != nd) {
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: %s is not a kernel of the model", lo->path);
            break;
        }
        const uint64_t in = lo->a.shape[nd - 2], r = lo->a.shape[nd - 1], out = lo->b.shape[nd - 1];
        if (t->shape[nd - 2] != in || t->shape[nd - 1] != out || t->numel / (in * out) != lo->a.numel / (in * r)) {
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: %s: A @ B does not have the kernel's shape",
                             lo->path);
            break;
        }
        const uint64_t lead = t->numel / (in * out);
        for (uint64_t l = 0; l < lead; l++) {
            const float *A = lo->a.data + l * in * r, *Bm = lo->b.data + l * r * out;
            float *W = t->w + l * in * out;
            for (uint64_t i = 0; i < in; i++)
                for (uint64_t o = 0; o < out; o++) {
                    float s = 0;
                    for (uint64_t q = 0; q < r; q++) s += A[i * r + q] * Bm[q * out + o];
                    W[i * out + o] += (float)ad->scale * s;
                }
        }
    }
    if (!st && cb) st = g2_cq_weights(m, cb);
    /* only the adapted kernels' gradients are needed: the others are frozen for the call */
    int *was = calloc(nt, sizeof *was);
    if (!was && !st) st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    for (uint32_t i = 0; i < nt && was; i++) {
        g2_tensor *t = g2_tensor_at(m, i);
        was[i] = t->frozen;
        t->frozen = 1;
    }
    for (uint32_t k = 0; k < ad->n && was; k++) {
        g2_tensor *t = g2_find(m, ad->lora[k].path);
        if (t) t->frozen = 0;
    }
    if (!st) st = g2_loss(m, ids, mask, B, T, 1, loss);
    for (uint32_t i = 0; i < nt && was; i++) g2_tensor_at(m, i)->frozen = was[i];
    free(was);
    for (uint32_t k = 0; k < ad->n && !st; k++) {
        const train_lora *lo = &ad->lora[k];
        const g2_tensor *t = g2_find(m, lo->path);
        const uint32_t nd = lo->a.ndim;
        const uint64_t in = lo->a.shape[nd - 2], r = lo->a.shape[nd - 1], out = lo->b.shape[nd - 1];
        const uint64_t lead = t->numel / (in * out);
        const float sc = (float)ad->scale;
        for (uint64_t l = 0; l < lead; l++) {
            const float *A = lo->a.data + l * in * r, *Bm = lo->b.data + l * r * out, *G = t->g + l * in * out;
            float *gA = dA[k] + l * in * r, *gB = dB[k] + l * r * out;
            for (uint64_t i = 0; i < in; i++)
                for (uint64_t q = 0; q < r; q++) {
                    float s = 0;
                    for (uint64_t o = 0; o < out; o++) s += G[i * out + o] * Bm[q * out + o];
                    gA[i * r + q] = sc * s;
                }
            for (uint64_t q = 0; q < r; q++)
                for (uint64_t o = 0; o < out; o++) {
                    float s = 0;
                    for (uint64_t i = 0; i < in; i++) s += A[i * r + q] * G[i * out + o];
                    gB[q * out + o] = sc * s;
                }
        }
    }
    for (uint32_t i = 0; i < nt; i++) {
        g2_tensor *t = g2_tensor_at(m, i);
        if (saved[i]) memcpy(t->w, saved[i], t->numel * sizeof *t->w);
        free(saved[i]);
    }
    free(saved);
    return st;
}
