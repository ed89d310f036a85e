/* The CPU's Needle 3 operations (backend.h: attention3, monarch_mlp), plain C float32
 * over host memory, following the official forward (NEEDLE3-NOTES.md §2).
 *
 * Everything else a Needle 3 layer does (lanes, engram, the CQ products, the residual
 * norms, logits) goes through the ops Needle 2 uses. These two run token by token on the
 * calling thread with the kernels' dot/axpy/rotate; the KV cache of a Needle 3 session is
 * f32 (session.c refuses other cache types), K rows holding KV*qk values and V rows KV*v
 * of the kv_dim-wide cache rows. Attention must stay in token order: token i's conv
 * history and K/V are stored before token i reads them. */
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu_ops3.h"
#include "kernels/cpu/a8.h"

/* ---- attention ------------------------------------------------------------------------ */

/* out = sum_{j < taps, j <= t, j < local window} taps[j] * raw(t - j), summed in j order as
 * the reference does; raw rows come from the ring `hist` (row stride `ld`, width `w`). */
static void conv_taps(const float *taps, uint32_t n_taps, uint32_t window, const float *hist,
                      uint32_t ring, size_t ld, uint32_t t, uint32_t w, float *out) {
    memset(out, 0, w * sizeof *out);
    for (uint32_t j = 0; j < n_taps && j <= t && (!window || j < window); j++) {
        const float *src = hist + (size_t)((t - j) % ring) * ld;
        const float *tap = taps + (size_t)j * w;
        for (uint32_t c = 0; c < w; c++) out[c] += tap[c] * src[c];
    }
}

/* W·A8 (official maybe_quant_query, and maybe_quant_kv at kv_bits 8, which session.c
 * requires): each of `heads` rows of `hd` values becomes s·q, its int8 quantization, as
 * the QAT model fake-quantizes them. */
static void a8_fake_quant_heads(float *x, uint32_t heads, uint32_t hd) {
    int16_t q[A8_MAX_COLS]; /* session.c: head dims <= A8_MAX_COLS under W·A8 */
    for (uint32_t h = 0; h < heads; h++) {
        float *row = x + (size_t)h * hd;
        const float scale = a8_quantize(row, hd, hd, q);
        for (uint32_t k = 0; k < hd; k++) row[k] = scale * (float)q[k];
    }
}

void cpu_attention3(backend_ctx *s, uint32_t li, uint32_t p0, uint32_t n,
                    const float *rope_cs, float *q_all, float *k_all, float *v_all,
                    const float *gate_all, float *o_all) {
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    const layer3_weights *l3 = &m->layers3[li];
    const cpu_kernels *kern = cpu_kernels_best();
    const uint32_t H = m->n_heads, KV = m->n_kv_heads, qk = m->qk_dim, vd = m->v_dim;
    const uint32_t Wq = H * qk, Wk = KV * qk, Wv = KV * vd, reps = H / KV;
    const size_t hist_ld = (size_t)Wq + Wk + Wv;
    const uint32_t o_ld = l->out_proj.cols_pad, window = l3->window;
    const float inv_scale = 1.0f / sqrtf((float)qk);
    float *hist = s->qkv_hist ? s->qkv_hist + (size_t)li * s->qkv_ring * hist_ld : NULL;
    float *tapped = s->scratch3; /* [hist_ld] */
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t t = p0 + i;
        float *q = q_all + (size_t)i * Wq, *k = k_all + (size_t)i * Wk;
        float *v = v_all + (size_t)i * Wv;
        if (m->conv_taps) {
            float *row = hist + (size_t)(t % s->qkv_ring) * hist_ld;
            memcpy(row, q, Wq * sizeof *q);
            memcpy(row + Wq, k, Wk * sizeof *k);
            memcpy(row + Wq + Wk, v, Wv * sizeof *v);
            conv_taps(l3->q_taps, m->conv_taps, window, hist, s->qkv_ring, hist_ld, t, Wq,
                      tapped);
            memcpy(q, tapped, Wq * sizeof *q);
            conv_taps(l3->k_taps, m->conv_taps, window, hist + Wq, s->qkv_ring, hist_ld, t,
                      Wk, tapped);
            memcpy(k, tapped, Wk * sizeof *k);
            conv_taps(l3->v_taps, m->conv_taps, window, hist + Wq + Wk, s->qkv_ring, hist_ld,
                      t, Wv, tapped);
            memcpy(v, tapped, Wv * sizeof *v);
        }
        const float *cs = rope_cs + (size_t)i * qk;
        for (uint32_t b = 0; b < KV; b++) {
            nm_zc_norm(k + b * qk, l->k_norm, qk, k + b * qk);
            nm_rope(k + b * qk, qk, cs);
        }
        if (s->a8) {
            a8_fake_quant_heads(k, KV, qk);
            a8_fake_quant_heads(v, KV, vd);
        }
        const uint32_t slot = nm_kv_slot(t, s->n_sinks, s->window);
        const size_t row_at = ((size_t)li * s->kv_slots + slot) * m->kv_dim;
        memcpy((float *)s->k_cache + row_at, k, Wk * sizeof *k);
        memcpy((float *)s->v_cache + row_at, v, Wv * sizeof *v);

        /* positions attended: a local layer its last `window` (no sinks, as the reference
         * has none); a global one the sinks and the session's window, or everything */
        uint32_t n_sink, tail0;
        if (window) {
            n_sink = 0;
            tail0 = t + 1 > window ? t + 1 - window : 0;
        } else {
            const nm_span span = nm_attention_span(t, s->n_sinks, s->window);
            n_sink = span.n_sink;
            tail0 = span.tail0;
        }
        float *o = o_all + (size_t)i * o_ld;
        for (uint32_t a = 0; a < H; a++) {
            const uint32_t b = a / reps;
            float *qa = q + (size_t)a * qk;
            nm_zc_norm(qa, l->q_norm, qk, qa);
            nm_rope(qa, qk, cs);
            if (s->a8) a8_fake_quant_heads(qa, 1, qk);
            float *scores = s->scores + (size_t)a * s->kv_slots;
            uint32_t n_pos = 0;
            for (uint32_t pass = 0; pass < 2; pass++) {
                const uint32_t p_begin = pass ? tail0 : 0, p_end = pass ? t + 1 : n_sink;
                for (uint32_t p = p_begin; p < p_end; p++) {
                    const size_t at = ((size_t)li * s->kv_slots +
                                       nm_kv_slot(p, s->n_sinks, s->window)) * m->kv_dim;
                    scores[n_pos++] =
                        kern->dot(qa, (const float *)s->k_cache + at + (size_t)b * qk, qk) *
                        inv_scale;
                }
            }
            const float sum = nm_softmax_exp(scores, n_pos);
            float *oa = o + (size_t)a * vd;
            memset(oa, 0, vd * sizeof *oa);
            uint32_t kk = 0;
            for (uint32_t pass = 0; pass < 2; pass++) {
                const uint32_t p_begin = pass ? tail0 : 0, p_end = pass ? t + 1 : n_sink;
                for (uint32_t p = p_begin; p < p_end; p++, kk++) {
                    const size_t at = ((size_t)li * s->kv_slots +
                                       nm_kv_slot(p, s->n_sinks, s->window)) * m->kv_dim;
                    kern->axpy(oa, scores[kk] / sum,
                               (const float *)s->v_cache + at + (size_t)b * vd, vd);
                }
            }
            const float *ga = gate_all + (size_t)i * H * vd + (size_t)a * vd;
            for (uint32_t j = 0; j < vd; j++) oa[j] *= nm_sigmoid(ga[j]);
        }
        cpu_act_rotate(s, &l->out_proj, o, o); /* W·A8: the gated output's QAT point */
    }
}

/* ---- the Monarch MLP ------------------------------------------------------------------ */

/* z := vec(a^T reshape(z, ba, bb) b) (row-major), a [ba][ba], b [bb][bb]; tmp [ba*bb].
 * Rows are accumulated whole (contiguous, vectorizable inner loops); each output still
 * sums its terms in index order. */
static void kron_apply(float *z, const float *a, uint32_t ba, const float *b, uint32_t bb,
                       float *tmp) {
    for (uint32_t i = 0; i < ba; i++) {
        float *t = tmp + (size_t)i * bb;
        memset(t, 0, bb * sizeof *t);
        for (uint32_t j = 0; j < bb; j++) {
            const float zij = z[(size_t)i * bb + j];
            const float *bj = b + (size_t)j * bb;
            for (uint32_t l = 0; l < bb; l++) t[l] += zij * bj[l];
        }
    }
    for (uint32_t k = 0; k < ba; k++) {
        float *o = z + (size_t)k * bb;
        memset(o, 0, bb * sizeof *o);
        for (uint32_t i = 0; i < ba; i++) {
            const float aik = a[(size_t)i * ba + k];
            const float *t = tmp + (size_t)i * bb;
            for (uint32_t l = 0; l < bb; l++) o[l] += aik * t[l];
        }
    }
}

/* dst[i] = src[perm[i]] */
static void gather(float *dst, const float *src, const uint32_t *perm, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) dst[i] = src[perm[i]];
}

void cpu_monarch_mlp(backend_ctx *s, uint32_t li, uint32_t n, const float *h_all,
                     float *out_all) {
    const model_weights *m = s->m;
    const layer_weights *l = &m->layers[li];
    const layer3_weights *l3 = &m->layers3[li];
    const uint32_t N = m->hada_n, d = m->d, ba = m->hada_ba, bb = m->hada_bb;
    float *z = s->scratch3, *y = z + N, *tmp = y + N, *sm = tmp + N;
    for (uint32_t t = 0; t < n; t++) {
        const float *h = h_all + (size_t)t * d;
        float *out = out_all + (size_t)t * d;
        /* cond = 1 + softmax(h cond_v) cond_u, the softmax over the rank axis */
        for (uint32_t r = 0; r < MODEL3_COND_RANK; r++) sm[r] = 0.0f;
        for (uint32_t k = 0; k < d; k++) {
            const float hk = h[k], *v = l3->cond_v + (size_t)k * MODEL3_COND_RANK;
            for (uint32_t r = 0; r < MODEL3_COND_RANK; r++) sm[r] += hk * v[r];
        }
        const float sum = nm_softmax_exp(sm, MODEL3_COND_RANK);
        for (uint32_t r = 0; r < MODEL3_COND_RANK; r++) sm[r] /= sum;

        for (uint32_t i = 0; i < N; i++) z[i] = i < d ? l->d1[i] * h[i] : 0.0f;
        kron_apply(z, l3->w1a, ba, l3->w1b, bb, tmp);
        gather(y, z, m->perm1, N);
        /* tmp := softmax . cond_u, rank by rank (contiguous rows) */
        memset(tmp, 0, N * sizeof *tmp);
        for (uint32_t r = 0; r < MODEL3_COND_RANK; r++) {
            const float w = sm[r], *u = l3->cond_u + (size_t)r * N;
            for (uint32_t i = 0; i < N; i++) tmp[i] += w * u[i];
        }
        for (uint32_t i = 0; i < N; i++) {
            const float pre = l->d2[i] * (1.0f + tmp[i]) * y[i] + l3->b2[i];
            y[i] = pre * nm_sigmoid(pre);
        }
        kron_apply(y, l3->w2a, ba, l3->w2b, bb, tmp);
        gather(z, y, m->perm2, N);
        for (uint32_t i = 0; i < N; i++) z[i] *= l->d3[i];
        kron_apply(z, l3->w3a, ba, l3->w3b, bb, tmp);
        for (uint32_t i = 0; i < d; i++) out[i] = l3->d4[i] * z[i];
    }
}
