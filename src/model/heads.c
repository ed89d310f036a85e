/* Streaming probe pooling, the Needle 2 heads (see heads.h, spec §4) and the Needle 3
 * heads' second pooling stage (NEEDLE3.md §3). */
#include "model/heads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fp16.h"

const probe_head *model_probe_head(const struct needle_model *m, uint32_t code) {
    for (uint32_t k = 0; k < m->n_probe_heads; k++)
        if (m->probe_heads[k].code == code) return &m->probe_heads[k];
    return NULL;
}

int head_pool_init(head_pool *p, const probe_head *head, uint32_t d) {
    memset(p, 0, sizeof *p);
    p->head = head;
    p->d = d;
    p->num_probes = head->num_probes;
    p->max = malloc(p->num_probes * sizeof *p->max);
    p->sum = malloc(p->num_probes * sizeof *p->sum);
    p->acc = malloc((size_t)p->num_probes * d * sizeof *p->acc);
    if (!p->max || !p->sum || !p->acc) {
        head_pool_free(p);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "probe head: out of memory");
    }
    head_pool_clear(p);
    return NEEDLE_OK;
}

void head_pool_free(head_pool *p) {
    if (!p) return;
    free(p->max);
    free(p->sum);
    free(p->acc);
    p->max = p->sum = p->acc = NULL;
}

void head_pool_clear(head_pool *p) {
    for (uint32_t k = 0; k < p->num_probes; k++) {
        p->max[k] = -INFINITY;
        p->sum[k] = 0;
    }
    memset(p->acc, 0, (size_t)p->num_probes * p->d * sizeof *p->acc);
    p->cells = 0;
}

void head_pool_copy(head_pool *dst, const head_pool *src) {
    memcpy(dst->max, src->max, src->num_probes * sizeof *dst->max);
    memcpy(dst->sum, src->sum, src->num_probes * sizeof *dst->sum);
    memcpy(dst->acc, src->acc, (size_t)src->num_probes * src->d * sizeof *dst->acc);
    dst->cells = src->cells;
}

/* <a, b> over n floats with eight running sums, so the compiler can vectorize it without
 * reassociating (the order is fixed, so results do not depend on the build). */
float head_dot(const float *a, const float *b, uint32_t n) {
    float acc[8] = {0};
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[j + k] * b[j + k];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; j < n; j++) sum += a[j] * b[j];
    return sum;
}

/* Folds one cell c (score already computed) into probe k's online softmax. */
static void pool_one(head_pool *p, uint32_t k, float score, const float *c) {
    const uint32_t d = p->d;
    float *acc = p->acc + (size_t)k * d;
    float w;
    if (score > p->max[k]) {
        /* a new maximum: what was pooled so far shrinks by exp(old - new) */
        const float shrink = expf(p->max[k] - score); /* 0 for the first cell */
        p->sum[k] *= shrink;
        for (uint32_t j = 0; j < d; j++) acc[j] *= shrink;
        p->max[k] = score;
        w = 1.0f;
    } else {
        w = expf(score - p->max[k]);
    }
    p->sum[k] += w;
    for (uint32_t j = 0; j < d; j++) acc[j] += w * c[j];
}

void head_pool_add(head_pool *p, const int32_t *tokens, uint32_t n, uint32_t cell_index,
                   const float *cells) {
    const probe_head *h = p->head;
    const uint32_t d = p->d;
    const float inv_sqrt_d = 1.0f / sqrtf((float)d);
    /* Needle 2: every probe over every cell; Needle 3: the probes of this cell's row */
    uint32_t first = 0, count = p->num_probes;
    if (h->rows) {
        if (cell_index >= h->rows) return;
        first = cell_index * h->per_row;
        count = h->per_row;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] == NEEDLE_TOKEN_PAD) continue;
        const float *c = cells + (size_t)i * d;
        for (uint32_t k = first; k < first + count; k++)
            pool_one(p, k, head_dot(c, h->probes + (size_t)k * d, d) * inv_sqrt_d, c);
        p->cells++;
    }
}

/* Needle 3's second stage (NEEDLE3.md §3): r[l,k] = rms_unit(pooled) * gain, then per
 * query a softmax over the (l, k) of the rows that were run, mixing r into a d-vector;
 * the Q mixes, query-major, are what proj reads. u gets Q * d floats. */
static int second_stage(const head_pool *p, float *u) {
    const probe_head *h = p->head;
    const uint32_t d = p->d, P = p->num_probes;
    const float inv_sqrt_d = 1.0f / sqrtf((float)d);
    float *r = malloc(((size_t)P * d + P) * sizeof *r);
    if (!r) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "probe head: out of memory");
    float *score = r + (size_t)P * d;
    for (uint32_t k = 0; k < P; k++) {
        float *rk = r + (size_t)k * d;
        if (p->sum[k] == 0) continue; /* no token reached this row (all PAD): left out */
        double sq = 0;
        for (uint32_t j = 0; j < d; j++) {
            rk[j] = p->acc[(size_t)k * d + j] / p->sum[k];
            sq += (double)rk[j] * rk[j];
        }
        const float scale = 1.0f / sqrtf((float)(sq / d) + 1e-6f) * h->gain[k];
        for (uint32_t j = 0; j < d; j++) rk[j] *= scale;
    }
    for (uint32_t q = 0; q < h->queries; q++) {
        const float *query = h->query + (size_t)q * d;
        float mx = -INFINITY;
        for (uint32_t k = 0; k < P; k++) {
            score[k] = -INFINITY;
            if (p->sum[k] == 0) continue;
            score[k] = head_dot(r + (size_t)k * d, query, d) * inv_sqrt_d +
                       h->row_bias[(size_t)q * P + k];
            if (score[k] > mx) mx = score[k];
        }
        double total = 0;
        for (uint32_t k = 0; k < P; k++) {
            score[k] = p->sum[k] == 0 ? 0.0f : expf(score[k] - mx);
            total += score[k];
        }
        float *uq = u + (size_t)q * d;
        memset(uq, 0, d * sizeof *uq);
        for (uint32_t k = 0; k < P; k++) {
            if (score[k] == 0) continue;
            const float w = (float)(score[k] / total);
            for (uint32_t j = 0; j < d; j++) uq[j] += w * r[(size_t)k * d + j];
        }
    }
    free(r);
    return NEEDLE_OK;
}

/* Row o of a projection left in the file (a Needle 2 head), as floats in `row`. */
static const float *widen_row(const probe_head *h, uint32_t o, uint32_t width, float *row) {
    const uint8_t *src = h->proj_file + (size_t)o * width * (h->proj_fp16 ? 2 : 4);
    for (uint32_t j = 0; j < width; j++)
        row[j] = h->proj_fp16 ? fp16_to_f32(rd_u16(src + 2 * (size_t)j)) : rd_f32(src + 4 * (size_t)j);
    return row;
}

int head_pool_output(const head_pool *p, float *out) {
    if (!p->cells) return needle_fail(NEEDLE_ERR_STATE, "probe head: no cells pooled");
    const probe_head *h = p->head;
    const uint32_t d = p->d, width = (h->rows ? h->queries : p->num_probes) * d;
    /* u, then a row of the projection when it is read from the file */
    float *u = malloc((h->proj ? width : 2 * (size_t)width) * sizeof *u);
    if (!u) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "probe head: out of memory");
    if (h->rows) {
        int rc = second_stage(p, u);
        if (rc) {
            free(u);
            return rc;
        }
    } else {
        for (uint32_t k = 0; k < p->num_probes; k++)
            for (uint32_t j = 0; j < d; j++)
                u[(size_t)k * d + j] = p->acc[(size_t)k * d + j] / p->sum[k];
    }
    double sq = 0;
    for (uint32_t o = 0; o < h->out_dim; o++) {
        const float *row = h->proj ? h->proj + (size_t)o * width
                                   : widen_row(h, o, width, u + width);
        double y = 0;
        for (uint32_t j = 0; j < width; j++) y += (double)row[j] * u[j];
        out[o] = (float)y + h->bias[o];
        sq += (double)out[o] * out[o];
    }
    free(u);
    if (h->code == HEAD_CODE_CONTRASTIVE) {
        const float denom = (float)sqrt(sq + 1e-12);
        for (uint32_t o = 0; o < h->out_dim; o++) out[o] /= denom;
    }
    return NEEDLE_OK;
}

float head_confidence_probability(float logit) { return 1.0f / (1.0f + expf(-logit)); }

float head_similarity(const float *a, const float *b, uint32_t n) {
    double s = 0;
    for (uint32_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return (float)s;
}
