/* The plain attention kernel (see attn.h): the reference the SIMD kernels are tested
 * against, in exactly the arithmetic of the original per-head loop of the CPU backend. */
#include <string.h>

#include "kernels/cpu/attn.h"
#include "kernels/nmath.h"
#include "needle.h"
#include "util/fp16.h"

/* Row `slot` of this head's K (which = 0) or V (1) as floats: a pointer into the cache
 * for f32, else converted into buf [hd]. */
static const float *row_of(const attn_kv *kv, int which, uint32_t slot, uint32_t hd,
                           uint32_t col0, float *buf) {
    const size_t at = (size_t)slot * kv->ld;
    const void *base = which ? kv->v : kv->k;
    if (kv->type == NEEDLE_KV_F32) return (const float *)base + at;
    if (kv->type == NEEDLE_KV_F16) {
        const uint16_t *src = (const uint16_t *)base + at;
        for (uint32_t i = 0; i < hd; i++) buf[i] = fp16_to_f32(src[i]);
    } else {
        const int8_t *src = (const int8_t *)base + at;
        const float *sc = (which ? kv->v_scales : kv->k_scales) + (size_t)slot * kv->scales_ld;
        for (uint32_t i = 0; i < hd; i++) buf[i] = (float)src[i] * sc[(col0 + i) / kv->group];
    }
    return buf;
}

void attn_plain(const attn_kv *kv, const attn_run *runs, uint32_t n_runs, const float *q,
                uint32_t nq, uint32_t hd, float scale, const float *gate, float *w, size_t ld_w,
                float *o, float *tmp) {
    const uint32_t vd = attn_v_dim(kv, hd), v_col0 = attn_v_col0(kv);
    for (uint32_t a = 0; a < nq; a++) {
        const float *qa = q + (size_t)a * hd;
        float *wa = w + (size_t)a * ld_w;
        uint32_t n = 0;
        for (uint32_t r = 0; r < n_runs; r++)
            for (uint32_t i = 0; i < runs[r].count; i++) {
                const float *kr = row_of(kv, 0, runs[r].slot + i, hd, kv->col0, tmp);
                float acc = 0.0f;
                for (uint32_t j = 0; j < hd; j++) acc += qa[j] * kr[j];
                wa[n++] = acc * scale;
            }
        const float sum = nm_softmax_exp(wa, n);
        float *oa = o + (size_t)a * vd;
        memset(oa, 0, vd * sizeof *oa);
        n = 0;
        for (uint32_t r = 0; r < n_runs; r++)
            for (uint32_t i = 0; i < runs[r].count; i++, n++) {
                const float *vr = row_of(kv, 1, runs[r].slot + i, vd, v_col0, tmp);
                const float c = wa[n] / sum;
                for (uint32_t j = 0; j < vd; j++) oa[j] += c * vr[j];
            }
        if (gate)
            for (uint32_t j = 0; j < vd; j++) oa[j] *= nm_sigmoid(gate[(size_t)a * vd + j]);
    }
}
