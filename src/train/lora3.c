/* LoRA and CQ straight-through over the Needle 3 training core (see lora3.h). */
#include "train/lora3.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "train/cq_ste.h"
#include "train/tgemm.h"
#include "util/error.h"

/* [lead][in][out] grouped along `in` (a kernel or mHC phi: _reduces_second_last) */
static int cq_second_last(const g3_model *m, const cq_codebooks *cb, float *w, uint64_t lead, uint32_t in,
                          uint32_t out) {
    int st = 0;
    for (uint64_t l = 0; l < lead && !st; l++)
        st = g3_cq_fake_quant(m, cb, G3_CQ_WEIGHT_BITS, w + l * in * out, out, in, 1, out);
    return st;
}

/* rows x cols grouped along cols (the embeddings) */
static int cq_rows(const g3_model *m, const cq_codebooks *cb, float *w, uint32_t rows, uint32_t cols) {
    return g3_cq_fake_quant(m, cb, G3_CQ_WEIGHT_BITS, w, rows, cols, cols, 1);
}

static int ends_with(const char *s, const char *suffix) {
    const size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int g3_cq_weights(g3_model *m, const cq_codebooks *cb) {
    for (uint32_t i = 0; i < g3_tensor_count(m); i++) {
        g3_tensor *t = g3_tensor_at(m, i);
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

/* ---- the prepared run (lora3.h) ------------------------------------------------------- */

struct g3_lora_prep {
    g3_model *m;
    const cq_codebooks *cb;
    uint32_t n;            /* adapted kernels */
    g3_tensor **kern;      /* the adapted kernels of m, in the adapter's order */
    float **base;          /* their base values */
    int *was_frozen;       /* every tensor's flag before prepare */
    float *bt, *at;        /* transposed B and A of one layer (the dA / dB products) */
    size_t bt_cap, at_cap;
    float **gaT, **gb;     /* per kernel on the core's low-rank route (g3_set_low_rank), else NULL */
};

static int is_cq_leaf(const g3_tensor *t) {
    if (t->ndim < 2 || !t->numel) return 0;
    const char *last = strrchr(t->name, '/');
    last = last ? last + 1 : t->name;
    return !strcmp(last, "kernel") || !strncmp(last, "mhc_phi", 7) || ends_with(t->name, "embedding");
}

static int cq_leaf(g3_model *m, const cq_codebooks *cb, g3_tensor *t) {
    const uint32_t in = (uint32_t)t->shape[t->ndim - 2], out = (uint32_t)t->shape[t->ndim - 1];
    const char *last = strrchr(t->name, '/');
    last = last ? last + 1 : t->name;
    if (!strcmp(last, "kernel") || !strncmp(last, "mhc_phi", 7))
        return cq_second_last(m, cb, t->w, t->numel / ((uint64_t)in * out), in, out);
    if (ends_with(t->name, "embedding")) return cq_rows(m, cb, t->w, (uint32_t)(t->numel / out), out);
    return 0;
}

void g3_lora_finish(g3_lora_prep *p) {
    if (!p) return;
    for (uint32_t k = 0; k < p->n; k++)
        if (p->kern && p->kern[k] && p->base && p->base[k])
            memcpy(p->kern[k]->w, p->base[k], p->kern[k]->numel * sizeof(float));
    for (uint32_t i = 0; p->was_frozen && i < g3_tensor_count(p->m); i++)
        g3_tensor_at(p->m, i)->frozen = p->was_frozen[i];
    for (uint32_t k = 0; p->kern && k < p->n; k++) {
        if (p->kern[k]) g3_set_low_rank(p->m, p->kern[k], NULL, NULL, 0, NULL, NULL);
        if (p->gaT) free(p->gaT[k]);
        if (p->gb) free(p->gb[k]);
    }
    free(p->gaT);
    free(p->gb);
    for (uint32_t k = 0; p->base && k < p->n; k++) free(p->base[k]);
    free(p->base);
    free(p->kern);
    free(p->was_frozen);
    free(p->bt);
    free(p->at);
    free(p);
}

int g3_lora_prepare(g3_model *m, const train_adapter *ad, const cq_codebooks *cb, g3_lora_prep **out) {
    *out = NULL;
    g3_lora_prep *p = calloc(1, sizeof *p);
    const uint32_t nt = g3_tensor_count(m);
    if (!p) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    p->m = m, p->cb = cb, p->n = ad->n;
    p->kern = calloc(ad->n ? ad->n : 1, sizeof *p->kern);
    p->base = calloc(ad->n ? ad->n : 1, sizeof *p->base);
    p->was_frozen = calloc(nt, sizeof *p->was_frozen);
    p->gaT = calloc(ad->n ? ad->n : 1, sizeof *p->gaT);
    p->gb = calloc(ad->n ? ad->n : 1, sizeof *p->gb);
    if (!p->kern || !p->base || !p->was_frozen || !p->gaT || !p->gb) {
        free(p->was_frozen), p->was_frozen = NULL;
        g3_lora_finish(p);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (uint32_t i = 0; i < nt; i++) p->was_frozen[i] = g3_tensor_at(m, i)->frozen;
    int st = 0;
    for (uint32_t k = 0; k < ad->n && !st; k++) {
        const train_lora *lo = &ad->lora[k];
        g3_tensor *t = g3_find(m, lo->path);
        const uint32_t nd = lo->a.ndim;
        if (!t || nd < 2 || t->ndim != nd || lo->b.ndim != nd) {
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: %s is not a kernel of the model", lo->path);
            break;
        }
        const uint64_t in = lo->a.shape[nd - 2], r = lo->a.shape[nd - 1], out_ = lo->b.shape[nd - 1];
        if (t->shape[nd - 2] != in || t->shape[nd - 1] != out_ || t->numel / (in * out_) != lo->a.numel / (in * r) ||
            lo->b.numel / (r * out_) != lo->a.numel / (in * r)) {
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
        /* the core's low-rank route where it has one for this kernel (set per step) */
        if (!st) {
            const uint64_t lead = t->numel / (in * out_);
            p->gaT[k] = malloc(lead * r * in * sizeof(float));
            p->gb[k] = malloc(lead * r * out_ * sizeof(float));
            if (!p->gaT[k] || !p->gb[k]) st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
            const int route = st ? 0 : g3_set_low_rank(m, t, lo->a.data, lo->b.data, (uint32_t)r, p->gaT[k], p->gb[k]);
            if (route < 0) st = route;
            if (route != 1) { /* not a kernel the core routes: dW and the products below */
                free(p->gaT[k]), free(p->gb[k]);
                p->gaT[k] = p->gb[k] = NULL;
            }
        }
    }
    if (st) {
        g3_lora_finish(p);
        return st;
    }
    /* the frozen CQ leaves, once */
    const int was = g3_profile_phase(m, G3_PH_QUANT);
    for (uint32_t i = 0; i < nt && cb && !st; i++) {
        g3_tensor *t = g3_tensor_at(m, i);
        int adapted = 0;
        for (uint32_t k = 0; k < p->n; k++) adapted |= p->kern[k] == t;
        if (!adapted && is_cq_leaf(t)) st = cq_leaf(m, cb, t);
    }
    g3_profile_phase(m, was);
    for (uint32_t i = 0; i < nt; i++) g3_tensor_at(m, i)->frozen = 1;
    for (uint32_t k = 0; k < p->n; k++) p->kern[k]->frozen = 0;
    if (st) {
        g3_lora_finish(p);
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

static void product(const g3_model *m, const float *A, const float *B, float *C, uint32_t M, uint32_t N, uint32_t K) {
    ab_job j = {tg_level_best(), {A, B, C, K, N, N, M, N, K, 0}};
    g3_run_parallel(m, ab_worker, &j);
}

/* The merge W = W0 + scale * (A @ B) of every row of a stacked kernel, rows taken
 * MERGE_ROWS at a time from a shared counter. Each element is the sum over q in order
 * (s = s + a * b, no contraction in this library) kept in W's row while it is summed,
 * with q outside the columns so the columns vectorize. */
#define MERGE_ROWS 32
typedef struct merge_job {
    const float *A, *Bm, *W0; /* [lead][in][r], [lead][r][out], [lead][in][out] */
    float *W;
    uint64_t in, r, out;
    float scale;
    uint64_t rows; /* lead * in */
    atomic_uint next;
} merge_job;

TG_CLONES static void merge_worker(void *arg, int i, int n) {
    merge_job *j = arg;
    (void)i, (void)n;
    const uint64_t in = j->in, r = j->r, out = j->out;
    for (;;) {
        const uint64_t r0 = (uint64_t)atomic_fetch_add_explicit(&j->next, 1u, memory_order_relaxed) * MERGE_ROWS;
        if (r0 >= j->rows) break;
        const uint64_t r1 = j->rows - r0 < MERGE_ROWS ? j->rows : r0 + MERGE_ROWS;
        for (uint64_t row = r0; row < r1; row++) {
            const uint64_t l = row / in, ii = row % in;
            const float *a = j->A + (l * in + ii) * r, *Bm = j->Bm + l * r * out, *w0 = j->W0 + row * out;
            float *w = j->W + row * out;
            for (uint64_t o = 0; o < out; o++) w[o] = 0;
            for (uint64_t q = 0; q < r; q++) {
                const float aq = a[q], *b = Bm + q * out;
                for (uint64_t o = 0; o < out; o++) w[o] = w[o] + aq * b[o];
            }
            for (uint64_t o = 0; o < out; o++) w[o] = w0[o] + j->scale * w[o];
        }
    }
}

int g3_lora_step(g3_lora_prep *p, const train_adapter *ad, const int32_t *ids, const float *mask, uint32_t B,
                 uint32_t T, double *loss, float **dA, float **dB) {
    *loss = 0;
    g3_model *m = p->m;
    if (ad->n != p->n) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: not the one prepared");
    const int was = g3_profile_phase(m, G3_PH_MERGE);
    int st = 0;
    /* merge: W = W0 + scale * A @ B per leading index, then CQ of the adapted kernels */
    for (uint32_t k = 0; k < ad->n; k++) {
        const train_lora *lo = &ad->lora[k];
        g3_tensor *t = p->kern[k];
        const uint32_t nd = lo->a.ndim;
        const uint64_t in = lo->a.shape[nd - 2], r = lo->a.shape[nd - 1], out = lo->b.shape[nd - 1];
        merge_job j = {lo->a.data, lo->b.data, p->base[k], t->w, in, r, out, (float)ad->scale,
                       t->numel / (in * out) * in, 0};
        atomic_init(&j.next, 0u);
        g3_run_shared(m, merge_worker, &j);
    }
    g3_profile_phase(m, G3_PH_QUANT);
    for (uint32_t k = 0; k < ad->n && p->cb && !st; k++) st = cq_leaf(m, p->cb, p->kern[k]);
    g3_profile_phase(m, G3_PH_OTHER);
    for (uint32_t k = 0; k < ad->n && !st; k++) /* A and B may have moved since the last step */
        if (p->gaT[k]) {
            const train_lora *lo = &ad->lora[k];
            st = g3_set_low_rank(m, p->kern[k], lo->a.data, lo->b.data, (uint32_t)lo->a.shape[lo->a.ndim - 1],
                                 p->gaT[k], p->gb[k]) == 1
                     ? 0
                     : needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: %s: low-rank route refused", lo->path);
        }
    if (!st) st = g3_loss(m, ids, mask, B, T, 1, loss);
    g3_profile_phase(m, G3_PH_LORA_AB);
    /* dA = scale * G B^T, dB = scale * A^T G, per leading index */
    for (uint32_t k = 0; k < ad->n && !st; k++) {
        const train_lora *lo = &ad->lora[k];
        const g3_tensor *t = p->kern[k];
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
        if (p->gaT[k]) { /* the core summed the factors' products: dA = scale gaT^T, dB = scale gb */
            for (uint64_t l = 0; l < lead; l++) {
                float *gA = dA[k] + l * in * r, *gB = dB[k] + l * r * out;
                const float *gaT = p->gaT[k] + l * r * in, *gb = p->gb[k] + l * r * out;
                tg_transpose(gaT, in, gA, r, r, in);
                for (size_t q = 0; q < (size_t)in * r; q++) gA[q] *= sc;
                for (size_t q = 0; q < (size_t)r * out; q++) gB[q] = gb[q] * sc;
            }
            continue;
        }
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
    g3_profile_phase(m, was);
    return st;
}

/* One step on its own: prepare, step, finish, and the frozen CQ leaves put back. */
int g3_lora_loss(g3_model *m, const train_adapter *ad, const cq_codebooks *cb, const int32_t *ids,
                 const float *mask, uint32_t B, uint32_t T, double *loss, float **dA, float **dB) {
    *loss = 0;
    const uint32_t nt = g3_tensor_count(m);
    float **saved = calloc(nt, sizeof *saved);
    if (!saved) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    int st = 0;
    const int was = g3_profile_phase(m, G3_PH_MERGE);
    for (uint32_t i = 0; i < nt && cb && !st; i++) { /* prepare quantizes these in place */
        g3_tensor *t = g3_tensor_at(m, i);
        if (!is_cq_leaf(t)) continue;
        saved[i] = malloc(t->numel * sizeof *saved[i]);
        if (!saved[i])
            st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        else
            memcpy(saved[i], t->w, t->numel * sizeof *t->w);
    }
    g3_lora_prep *p = NULL;
    if (!st) st = g3_lora_prepare(m, ad, cb, &p);
    if (!st) st = g3_lora_step(p, ad, ids, mask, B, T, loss, dA, dB);
    g3_lora_finish(p);
    g3_profile_phase(m, G3_PH_MERGE);
    for (uint32_t i = 0; i < nt; i++) {
        g3_tensor *t = g3_tensor_at(m, i);
        if (saved[i]) memcpy(t->w, saved[i], t->numel * sizeof *t->w);
        free(saved[i]);
    }
    free(saved);
    g3_profile_phase(m, was);
    return st;
}
