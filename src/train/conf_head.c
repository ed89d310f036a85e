/* Training the Needle 3 confidence head: see conf_head.h. */
#include "train/conf_head.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/heads.h"
#include "util/error.h"

const char *const conf_head_names[CONF_HEAD_TENSORS] = {
    "confidence_head/probes",   "confidence_head/gain",        "confidence_head/query",
    "confidence_head/row_bias", "confidence_head/proj/kernel", "confidence_head/proj/bias"};

size_t conf_head_layout(const conf_head_shape *sh, uint64_t numel[CONF_HEAD_TENSORS]) {
    const uint64_t P = (uint64_t)sh->rows * sh->per_row, Q = sh->queries, d = sh->d;
    const uint64_t n[CONF_HEAD_TENSORS] = {P * d, P, Q * d, Q * P, Q * d, 1};
    size_t total = 0;
    for (int i = 0; i < CONF_HEAD_TENSORS; i++) {
        numel[i] = n[i];
        total += (size_t)n[i];
    }
    return total;
}

/* The six tensors' starts inside theta (or a gradient of the same layout). */
typedef struct head_view {
    float *probes, *gain, *query, *row_bias, *proj, *bias;
} head_view;

static head_view view_of(const conf_head_shape *sh, const float *theta) {
    uint64_t n[CONF_HEAD_TENSORS];
    conf_head_layout(sh, n);
    float *at = (float *)theta;
    head_view v;
    v.probes = at;
    v.gain = v.probes + n[0];
    v.query = v.gain + n[1];
    v.row_bias = v.query + n[2];
    v.proj = v.row_bias + n[3];
    v.bias = v.proj + n[4];
    return v;
}

int conf_head_scratch_init(conf_head_scratch *s, const conf_head_shape *sh, uint32_t max_tokens) {
    memset(s, 0, sizeof *s);
    const size_t P = (size_t)sh->rows * sh->per_row, d = sh->d, Q = sh->queries;
    s->attn = malloc(P * max_tokens * sizeof *s->attn);
    s->da = malloc((size_t)sh->per_row * max_tokens * sizeof *s->da);
    s->m = malloc(P * d * sizeof *s->m);
    s->rhat = malloc(P * d * sizeof *s->rhat);
    s->rms = malloc(P * sizeof *s->rms);
    s->r = malloc(P * d * sizeof *s->r);
    s->w = malloc(Q * P * sizeof *s->w);
    s->pooled = malloc(Q * d * sizeof *s->pooled);
    s->dr = malloc(P * d * sizeof *s->dr);
    s->dm = malloc(P * d * sizeof *s->dm);
    s->row = malloc(d * sizeof *s->row);
    s->max_tokens = max_tokens;
    if (!s->attn || !s->da || !s->m || !s->rhat || !s->rms || !s->r || !s->w || !s->pooled || !s->dr ||
        !s->dm || !s->row) {
        conf_head_scratch_free(s);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "confidence head: out of memory");
    }
    return NEEDLE_OK;
}

void conf_head_scratch_free(conf_head_scratch *s) {
    free(s->attn);
    free(s->da);
    free(s->m);
    free(s->rhat);
    free(s->rms);
    free(s->r);
    free(s->w);
    free(s->pooled);
    free(s->dr);
    free(s->dm);
    free(s->row);
    memset(s, 0, sizeof *s);
}

uint16_t conf_head_bf16(float x) {
    union {
        float f;
        uint32_t u;
    } v = {.f = x};
    if ((v.u & 0x7f800000u) == 0x7f800000u) return (uint16_t)(v.u >> 16 | ((v.u & 0xffff) ? 0x40 : 0));
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static void widen(const uint16_t *src, uint32_t n, float *dst) {
    for (uint32_t i = 0; i < n; i++) dst[i] = conf_head_f32(src[i]);
}

/* x[0..n) := softmax(x) in place */
static void softmax(float *x, uint32_t n) {
    float mx = x[0];
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += x[i] = expf(x[i] - mx);
    const float inv = (float)(1.0 / sum);
    for (uint32_t i = 0; i < n; i++) x[i] *= inv;
}

float conf_head_forward(const conf_head_shape *sh, const float *theta, const uint16_t *cells,
                        uint32_t T, conf_head_scratch *s) {
    const head_view v = view_of(sh, theta);
    const uint32_t K = sh->per_row, d = sh->d, P = sh->rows * K, Q = sh->queries;
    const float inv_sqrt_d = 1.0f / sqrtf((float)d);
    /* stage 1: probe (l, k) attends over the tokens of row l */
    for (uint32_t l = 0; l < sh->rows; l++) {
        const uint16_t *cl = cells + (size_t)l * T * d;
        for (uint32_t t = 0; t < T; t++) {
            widen(cl + (size_t)t * d, d, s->row);
            for (uint32_t k = 0; k < K; k++) {
                const uint32_t j = l * K + k;
                s->attn[(size_t)j * T + t] = head_dot(s->row, v.probes + (size_t)j * d, d) * inv_sqrt_d;
            }
        }
        for (uint32_t k = 0; k < K; k++) {
            const uint32_t j = l * K + k;
            softmax(s->attn + (size_t)j * T, T);
            memset(s->m + (size_t)j * d, 0, d * sizeof *s->m);
        }
        for (uint32_t t = 0; t < T; t++) {
            widen(cl + (size_t)t * d, d, s->row);
            for (uint32_t k = 0; k < K; k++) {
                const uint32_t j = l * K + k;
                const float a = s->attn[(size_t)j * T + t];
                float *m = s->m + (size_t)j * d;
                for (uint32_t i = 0; i < d; i++) m[i] += a * s->row[i];
            }
        }
    }
    for (uint32_t j = 0; j < P; j++) {
        const float *m = s->m + (size_t)j * d;
        float *rhat = s->rhat + (size_t)j * d, *r = s->r + (size_t)j * d;
        double sq = 0;
        for (uint32_t i = 0; i < d; i++) sq += (double)m[i] * m[i];
        s->rms[j] = sqrtf((float)(sq / d) + 1e-6f);
        const float inv = 1.0f / s->rms[j];
        for (uint32_t i = 0; i < d; i++) {
            rhat[i] = m[i] * inv;
            r[i] = rhat[i] * v.gain[j];
        }
    }
    /* stage 2: each query mixes the (l, k) results */
    double y = v.bias[0];
    for (uint32_t q = 0; q < Q; q++) {
        float *w = s->w + (size_t)q * P, *pooled = s->pooled + (size_t)q * d;
        for (uint32_t j = 0; j < P; j++)
            w[j] = head_dot(s->r + (size_t)j * d, v.query + (size_t)q * d, d) * inv_sqrt_d +
                   v.row_bias[(size_t)q * P + j];
        softmax(w, P);
        memset(pooled, 0, d * sizeof *pooled);
        for (uint32_t j = 0; j < P; j++)
            for (uint32_t i = 0; i < d; i++) pooled[i] += w[j] * s->r[(size_t)j * d + i];
        for (uint32_t i = 0; i < d; i++) y += (double)v.proj[(size_t)q * d + i] * pooled[i];
    }
    return (float)y;
}

void conf_head_backward(const conf_head_shape *sh, const float *theta, const uint16_t *cells,
                        uint32_t T, float dy, conf_head_scratch *s, float *grad) {
    const head_view v = view_of(sh, theta), g = view_of(sh, grad);
    const uint32_t K = sh->per_row, d = sh->d, P = sh->rows * K, Q = sh->queries;
    const float inv_sqrt_d = 1.0f / sqrtf((float)d);
    g.bias[0] += dy;
    memset(s->dr, 0, (size_t)P * d * sizeof *s->dr);
    float *dpooled = s->row; /* [d], free until stage 1 */
    for (uint32_t q = 0; q < Q; q++) {
        const float *w = s->w + (size_t)q * P, *pooled = s->pooled + (size_t)q * d;
        const float *proj = v.proj + (size_t)q * d, *query = v.query + (size_t)q * d;
        float *gproj = g.proj + (size_t)q * d, *gquery = g.query + (size_t)q * d;
        for (uint32_t i = 0; i < d; i++) {
            gproj[i] += dy * pooled[i];
            dpooled[i] = dy * proj[i];
        }
        /* the softmax over (l, k): du = w (dw - sum w dw) */
        double wdw = 0;
        float *du = s->dm; /* [P], free until the norm's backward */
        for (uint32_t j = 0; j < P; j++) {
            du[j] = head_dot(dpooled, s->r + (size_t)j * d, d);
            wdw += (double)w[j] * du[j];
        }
        for (uint32_t j = 0; j < P; j++) {
            du[j] = w[j] * (du[j] - (float)wdw);
            g.row_bias[(size_t)q * P + j] += du[j];
            const float *r = s->r + (size_t)j * d;
            float *dr = s->dr + (size_t)j * d;
            const float su = du[j] * inv_sqrt_d;
            for (uint32_t i = 0; i < d; i++) {
                dr[i] += w[j] * dpooled[i] + su * query[i];
                gquery[i] += su * r[i];
            }
        }
    }
    /* r = rhat * gain, rhat = m / rms */
    for (uint32_t j = 0; j < P; j++) {
        const float *dr = s->dr + (size_t)j * d, *rhat = s->rhat + (size_t)j * d;
        float *dm = s->dm + (size_t)j * d;
        g.gain[j] += head_dot(dr, rhat, d);
        double proj = 0;
        for (uint32_t i = 0; i < d; i++) proj += (double)dr[i] * v.gain[j] * rhat[i];
        const float mean = (float)(proj / d), inv = 1.0f / s->rms[j];
        for (uint32_t i = 0; i < d; i++) dm[i] = (dr[i] * v.gain[j] - rhat[i] * mean) * inv;
    }
    /* stage 1: m = sum_t a_t c_t, a = softmax(s), s_t = <c_t, probe> / sqrt(d) */
    for (uint32_t l = 0; l < sh->rows; l++) {
        const uint16_t *cl = cells + (size_t)l * T * d;
        for (uint32_t t = 0; t < T; t++) {
            widen(cl + (size_t)t * d, d, s->row);
            for (uint32_t k = 0; k < K; k++)
                s->da[(size_t)k * T + t] = head_dot(s->dm + (size_t)(l * K + k) * d, s->row, d);
        }
        for (uint32_t k = 0; k < K; k++) {
            const float *a = s->attn + (size_t)(l * K + k) * T;
            float *da = s->da + (size_t)k * T;
            double ada = 0;
            for (uint32_t t = 0; t < T; t++) ada += (double)a[t] * da[t];
            for (uint32_t t = 0; t < T; t++) da[t] = a[t] * (da[t] - (float)ada) * inv_sqrt_d;
        }
        for (uint32_t t = 0; t < T; t++) {
            widen(cl + (size_t)t * d, d, s->row);
            for (uint32_t k = 0; k < K; k++) {
                const float ds = s->da[(size_t)k * T + t];
                float *gp = g.probes + (size_t)(l * K + k) * d;
                for (uint32_t i = 0; i < d; i++) gp[i] += ds * s->row[i];
            }
        }
    }
}
