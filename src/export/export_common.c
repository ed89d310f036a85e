/* Helpers shared by the Needle 2 and Needle 3 checkpoint exporters (see export_common.h). */
#include "export/export_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/cq_quantize.h"
#include "util/error.h"
#include "util/fp16.h"

const st_tensor *ex_need(const export_ctx *x, const char *name, uint32_t ndim,
                         const uint64_t *shape) {
    const st_tensor *t = st_find(x->ck, name);
    if (!t) {
        needle_fail(NEEDLE_ERR_FORMAT, "checkpoint has no tensor '%s'", name);
        return NULL;
    }
    int ok = t->ndim == ndim;
    for (uint32_t i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[128] = "", want[128] = "";
        for (uint32_t i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "",
                     (unsigned long long)t->shape[i]);
        for (uint32_t i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%llu", i ? ", " : "",
                     (unsigned long long)shape[i]);
        needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s' has shape [%s], the config needs [%s]", name,
                    got, want);
        return NULL;
    }
    return t;
}

void ex_report(export_ctx *x, double rel) {
    if (x->opt->progress)
        x->opt->progress(x->opt->user, x->w->n - 1, x->count, &x->w->tensors[x->w->n - 1], rel);
}

/* quantizes mat[rows][cols] (freed here) into a CQ record */
int ex_add_cq(export_ctx *x, const char *label, float *mat, uint64_t rows, uint64_t cols) {
    return ex_add_cq_bits(x, label, mat, rows, cols, 0);
}

int ex_add_cq_bits(export_ctx *x, const char *label, float *mat, uint64_t rows, uint64_t cols,
                   uint32_t bits) {
    if (!bits) bits = bits_map_lookup(x->opt->bits, label);
    const uint64_t nbytes = cq_blob_bytes(rows, cols, bits, x->cb->group);
    uint8_t *blob = nbytes ? malloc((size_t)nbytes) : NULL;
    if (!blob) {
        free(mat);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory for a %llu x %llu CQ blob", label,
                           (unsigned long long)rows, (unsigned long long)cols);
    }
    double err = 0, ref = 0;
    int st = cq_quantize_matrix(x->cb, mat, (uint32_t)rows, (uint32_t)cols, bits, blob, &err, &ref);
    free(mat);
    if (st) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", needle_last_error());
        free(blob);
        return needle_fail(st, "%s: %s", label, msg);
    }
    const uint32_t shape[2] = {(uint32_t)rows, (uint32_t)cols};
    st = cw_add(x->w, label, CACT_CQ, 2, shape, x->cb->group, bits, blob, nbytes);
    if (st) return st;
    ex_report(x, ref > 0 ? sqrt(err / ref) : 0.0);
    return 0;
}

/* values[0 .. prod(shape)) as an FP16 record */
int ex_add_fp16_values(export_ctx *x, const char *label, const float *values, uint8_t ndim,
                       const uint32_t *shape) {
    uint64_t n = 1;
    for (uint8_t i = 0; i < ndim; i++) n *= shape[i];
    uint8_t *blob = malloc(n ? (size_t)(2 * n) : 1);
    if (!blob) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", label);
    for (uint64_t i = 0; i < n; i++) {
        const float v = values ? values[i] : 0.0f;
        const uint16_t h = f32_to_fp16(v);
        if (!isfinite(v) || (h & 0x7c00u) == 0x7c00u) {
            free(blob);
            return needle_fail(NEEDLE_ERR_FORMAT, "%s: value %g at %llu is not finite in f16", label,
                               (double)v, (unsigned long long)i);
        }
        blob[2 * i] = (uint8_t)(h & 0xff);
        blob[2 * i + 1] = (uint8_t)(h >> 8);
    }
    const int st = cw_add(x->w, label, CACT_FP16, ndim, shape, 0, 0, blob, 2 * n);
    if (st) return st;
    ex_report(x, -1.0);
    return 0;
}

/* the values of t from element `first` on (t NULL: zeros) as an FP16 record */
int ex_add_fp16(export_ctx *x, const char *label, const st_tensor *t, uint64_t first, uint8_t ndim,
                const uint32_t *shape) {
    uint64_t n = 1;
    for (uint8_t i = 0; i < ndim; i++) n *= shape[i];
    if (!t) return ex_add_fp16_values(x, label, NULL, ndim, shape);
    float *v = malloc(n ? (size_t)n * sizeof *v : 1);
    if (!v) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", label);
    for (uint64_t i = 0; i < n; i++) v[i] = st_get(t, first + i);
    const int st = ex_add_fp16_values(x, label, v, ndim, shape);
    free(v);
    return st;
}

float *ex_alloc_mat(const char *label, uint64_t rows, uint64_t cols) {
    if (cols && rows > SIZE_MAX / sizeof(float) / cols) {
        needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: %llu x %llu is too large", label, (unsigned long long)rows,
                    (unsigned long long)cols);
        return NULL;
    }
    const size_t count = (size_t)(rows * cols);
    float *m = malloc(count ? count * sizeof *m : 1);
    if (!m) needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", label);
    return m;
}

/* rows of t[first .. first + rows*cols) as is */
int ex_add_cq_direct(export_ctx *x, const char *label, const st_tensor *t, uint64_t first,
                     uint64_t rows, uint64_t cols) {
    return ex_add_cq_direct_bits(x, label, t, first, rows, cols, 0);
}

int ex_add_cq_direct_bits(export_ctx *x, const char *label, const st_tensor *t, uint64_t first,
                          uint64_t rows, uint64_t cols, uint32_t bits) {
    float *m = ex_alloc_mat(label, rows, cols);
    if (!m) return NEEDLE_ERR_OUT_OF_MEMORY;
    for (uint64_t i = 0; i < rows * cols; i++) m[i] = st_get(t, first + i);
    return ex_add_cq_bits(x, label, m, rows, cols, bits);
}

/* a flax kernel slice [in][out] at `first`, stored transposed as [out][in] */
int ex_add_cq_kernel(export_ctx *x, const char *label, const st_tensor *t, uint64_t first,
                     uint64_t in, uint64_t out) {
    float *m = ex_alloc_mat(label, out, in);
    if (!m) return NEEDLE_ERR_OUT_OF_MEMORY;
    for (uint64_t c = 0; c < in; c++)
        for (uint64_t o = 0; o < out; o++) m[o * in + c] = st_get(t, first + c * out + o);
    return ex_add_cq(x, label, m, out, in);
}

int ex_has_prefix_tensor(const st_file *f, const char *key) {
    const size_t n = strlen(key);
    for (uint32_t i = 0; i < f->n; i++)
        if (!strncmp(f->tensors[i].name, key, n) && f->tensors[i].name[n] == '/') return 1;
    return 0;
}

#define NEED(var, name, nd, ...)                                                 \
    do {                                                                         \
        const uint64_t shp_[] = {__VA_ARGS__};                                   \
        if (!((var) = ex_need(x, (name), (nd), shp_))) return NEEDLE_ERR_FORMAT; \
    } while (0)
#define TRY(e)                                                                                \
    do {                                                                                      \
        const int rc_ = (e);                                                                  \
        if (rc_) return rc_;                                                                  \
    } while (0)

int ex_add_mhc_records(export_ctx *x, uint64_t L, uint64_t n, uint64_t d) {
    static const char *small[6] = {"mhc_a_pre", "mhc_a_post", "mhc_a_res",
                                   "mhc_b_pre", "mhc_b_post", "mhc_b_res"};
    const st_tensor *t;
    char nm[64];
    for (int k = 0; k < 6; k++) {
        snprintf(nm, sizeof nm, "stack/%s", small[k]);
        const uint32_t s3[3] = {(uint32_t)L, (uint32_t)n, (uint32_t)n};
        if (k < 3)
            NEED(t, nm, 1, L);
        else if (k < 5)
            NEED(t, nm, 2, L, n);
        else
            NEED(t, nm, 3, L, n, n);
        TRY(ex_add_fp16(x, small[k], t, 0, (uint8_t)(k < 3 ? 1 : k < 5 ? 2 : 3), s3));
    }
    static const char *phi[3] = {"mhc_phi_pre", "mhc_phi_post", "mhc_phi_res"};
    for (int k = 0; k < 3; k++) {
        const uint64_t lanes = k == 2 ? n * n : n, nd = n * d;
        snprintf(nm, sizeof nm, "stack/%s", phi[k]);
        NEED(t, nm, 3, L, nd, lanes);
        float *m = ex_alloc_mat(phi[k], L * lanes, nd);
        if (!m) return NEEDLE_ERR_OUT_OF_MEMORY;
        /* (L, n*d, lanes) -> transpose(0, 2, 1) -> (L*lanes, n*d) */
        for (uint64_t i = 0; i < L; i++)
            for (uint64_t col = 0; col < nd; col++)
                for (uint64_t l = 0; l < lanes; l++)
                    m[(i * lanes + l) * nd + col] = st_get(t, (i * nd + col) * lanes + l);
        TRY(ex_add_cq(x, phi[k], m, L * lanes, nd));
    }
    return NEEDLE_OK;
}

int ex_add_engram_site(export_ctx *x, uint32_t site, uint64_t T, uint64_t slots, uint64_t sub,
                       uint64_t d) {
    const st_tensor *t;
    char nm[64], label[40];
    snprintf(nm, sizeof nm, "engrams_%u/embedding", site);
    NEED(t, nm, 3, T, slots, sub);
    snprintf(label, sizeof label, "engram%u.tables", site);
    TRY(ex_add_cq_direct(x, label, t, 0, T * slots, sub));
    static const char *kv[2] = {"key_proj", "value_proj"};
    for (int k = 0; k < 2; k++) {
        snprintf(nm, sizeof nm, "engrams_%u/%s/kernel", site, kv[k]);
        NEED(t, nm, 2, T * sub, d);
        snprintf(label, sizeof label, "engram%u.%s", site, kv[k]);
        TRY(ex_add_cq_kernel(x, label, t, 0, T * sub, d));
    }
    snprintf(nm, sizeof nm, "engrams_%u/taps", site);
    NEED(t, nm, 2, ENGRAM_CONV_TAPS, d);
    snprintf(label, sizeof label, "engram%u.taps", site);
    const uint32_t st2[2] = {ENGRAM_CONV_TAPS, (uint32_t)d};
    return ex_add_fp16(x, label, t, 0, 2, st2);
}
