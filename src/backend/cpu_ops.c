/* The CPU backend's operations (backend.h): plain C float32 over host memory, CQ products
 * through the session's thread pool and the dispatch table of kernels/cpu. This is the
 * reference: every other backend is tested against these (tests/test_backend_ops.c), and
 * the arithmetic is exactly that of the original single-file forward pass. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/session.h"
#include "util/error.h"
#include "util/fp16.h"

/* Per-session CPU state: the pool, its kernels and host scratch. */
typedef struct cpu_session {
    cpu_pool *pool;
    const cpu_kernels *kern;
    float *eng_e;    /* [T * sub] one token's gathered engram rows */
    float *hada;     /* [hada_n] */
    float *lane_old; /* [n*d] lanes before the write-back */
    float *tmp;      /* [max(group, 2*d, 2*kv_dim)] */
    float *out_rot;  /* [chunk][d padded] rotated final hidden */
} cpu_session;

static cpu_session *cs_of(const struct needle_session *s) { return (cpu_session *)s->dev; }

static float sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }

static float mean_square(const float *x, uint32_t n) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    return ss / (float)n;
}

/* ZC(x; s) = (1 + s) * x / sqrt(mean(x^2) + 1e-6); out may alias x. */
static void zc_norm(const float *x, const float *s, uint32_t n, float *out) {
    const float rms = sqrtf(mean_square(x, n) + 1e-6f);
    for (uint32_t i = 0; i < n; i++) out[i] = (1.0f + s[i]) * x[i] / rms;
}

/* rms_unit(x) = x / sqrt(mean(x^2) + 1e-6); out may alias x. */
static void rms_unit(const float *x, uint32_t n, float *out) {
    const float inv = 1.0f / sqrtf(mean_square(x, n) + 1e-6f);
    for (uint32_t i = 0; i < n; i++) out[i] = x[i] * inv;
}

static void rope(float *z, uint32_t hd, const float *cs) {
    const uint32_t half = hd / 2;
    const float *c = cs, *sn = cs + half;
    for (uint32_t j = 0; j < half; j++) {
        float a = z[j], b = z[j + half];
        z[j] = a * c[j] - b * sn[j];
        z[j + half] = b * c[j] + a * sn[j];
    }
}

/* Log-space Sinkhorn, 20 rounds of row then column normalisation (§3.4). */
static void sinkhorn(float *lg, uint32_t n) {
    for (int it = 0; it < 20; it++) {
        for (uint32_t r = 0; r < n; r++) {
            float mx = lg[r * n];
            for (uint32_t c = 1; c < n; c++) mx = fmaxf(mx, lg[r * n + c]);
            float sum = 0.0f;
            for (uint32_t c = 0; c < n; c++) sum += expf(lg[r * n + c] - mx);
            float lse = mx + logf(sum);
            for (uint32_t c = 0; c < n; c++) lg[r * n + c] -= lse;
        }
        for (uint32_t c = 0; c < n; c++) {
            float mx = lg[c];
            for (uint32_t r = 1; r < n; r++) mx = fmaxf(mx, lg[r * n + c]);
            float sum = 0.0f;
            for (uint32_t r = 0; r < n; r++) sum += expf(lg[r * n + c] - mx);
            float lse = mx + logf(sum);
            for (uint32_t r = 0; r < n; r++) lg[r * n + c] -= lse;
        }
    }
    for (uint32_t k = 0; k < n * n; k++) lg[k] = expf(lg[k]);
}

/* ---- session state -------------------------------------------------------------------- */

static void *cpu_alloc(struct needle_session *s, size_t bytes) {
    (void)s;
    return calloc(bytes ? bytes : 1, 1);
}

static void cpu_release(struct needle_session *s, void *p) {
    (void)s;
    free(p);
}

static void cpu_copy(struct needle_session *s, void *dst, const void *src, size_t bytes) {
    (void)s;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_session_free(struct needle_session *s) {
    cpu_session *c = cs_of(s);
    if (!c) return;
    free(c->eng_e);
    free(c->hada);
    free(c->lane_old);
    free(c->tmp);
    free(c->out_rot);
    cpu_pool_free(c->pool);
    free(c);
    s->dev = NULL;
}

static int cpu_session_init(struct needle_session *s) {
    const cpu_kernels *kern = cpu_kernels_best();
    const struct needle_model *m = s->m;
    cpu_session *c = calloc(1, sizeof *c);
    if (!c) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "session: out of memory");
    s->dev = c;
    const size_t d = m->d, kvd = m->kv_dim;
    size_t tmp = m->file.group;
    if (tmp < 2 * d) tmp = 2 * d;
    if (tmp < 2 * kvd) tmp = 2 * kvd;
    /* engram header fields are only validated (and meaningful) when there are sites */
    c->eng_e = calloc(m->n_sites ? (size_t)m->n_tables * m->sub_dim : 1, sizeof(float));
    c->hada = calloc(m->hada_n, sizeof(float));
    c->lane_old = calloc((size_t)m->n_lanes * d, sizeof(float));
    c->tmp = calloc(tmp, sizeof(float));
    c->out_rot = calloc((size_t)s->chunk * m->embedding.cols_pad, sizeof(float));
    /* kernel scratch: activations of a whole chunk for the widest matrix input */
    uint32_t widest = m->embedding.cols_pad;
    const uint32_t ins[] = {m->phi_pre.cols_pad, m->layers[0].q_proj.cols_pad,
                            m->layers[0].out_proj.cols_pad,
                            m->n_sites ? m->sites[0].key_proj.cols_pad : 0};
    for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++)
        if (ins[i] > widest) widest = ins[i];
    if (!c->eng_e || !c->hada || !c->lane_old || !c->tmp || !c->out_rot ||
        cpu_pool_create(s->n_threads, kern, cq_scratch_floats(widest, s->chunk), &c->pool) !=
            NEEDLE_OK) {
        cpu_session_free(s);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "session: out of memory for CPU scratch");
    }
    c->kern = cpu_pool_kernels(c->pool);
    return NEEDLE_OK;
}

/* ---- KV cache access in the session's precision ---------------------------------- */

static size_t kv_index(const struct needle_session *s, uint32_t layer, uint32_t slot) {
    return ((size_t)layer * s->kv_slots + slot) * s->m->kv_dim;
}

static uint32_t kv_slot(const struct needle_session *s, uint32_t p) {
    if (p < s->n_sinks) return p;
    if (s->window) return s->n_sinks + (p - s->n_sinks) % s->window;
    return p;
}

/* Scales of int8 cache row (layer, slot): KV_SCALE_GROUPS(kv_dim) floats. */
static float *kv_row_scales(const struct needle_session *s, int which, uint32_t layer,
                            uint32_t slot) {
    const size_t rows = (size_t)s->m->n_layers * s->kv_slots;
    return s->kv_scales + ((size_t)which * rows + (size_t)layer * s->kv_slots + slot) *
                              KV_SCALE_GROUPS(s->m->kv_dim);
}

static void kv_store(struct needle_session *s, int which, uint32_t layer, uint32_t slot,
                     const float *x) {
    const uint32_t n = s->m->kv_dim;
    size_t at = kv_index(s, layer, slot);
    void *base = which ? s->v_cache : s->k_cache;
    if (s->kv_type == NEEDLE_KV_F32) {
        memcpy((float *)base + at, x, n * sizeof(float));
    } else if (s->kv_type == NEEDLE_KV_F16) {
        uint16_t *dst = (uint16_t *)base + at;
        for (uint32_t i = 0; i < n; i++) dst[i] = f32_to_fp16(x[i]);
    } else {
        int8_t *dst = (int8_t *)base + at;
        float *scales = kv_row_scales(s, which, layer, slot);
        for (uint32_t g = 0; g < KV_SCALE_GROUPS(n); g++) {
            /* groups of KV_SCALE_GROUP values; the last one may be shorter */
            const uint32_t c0 = g * KV_SCALE_GROUP;
            const uint32_t c1 = n - c0 < KV_SCALE_GROUP ? n : c0 + KV_SCALE_GROUP;
            float amax = 0.0f;
            for (uint32_t i = c0; i < c1; i++) amax = fmaxf(amax, fabsf(x[i]));
            float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
            scales[g] = scale;
            for (uint32_t i = c0; i < c1; i++) dst[i] = (int8_t)lrintf(x[i] / scale);
        }
    }
}

/* Returns a float view of cached row (layer, slot); `buf` holds kv_dim floats when the
 * cache is not f32. */
static const float *kv_load(const struct needle_session *s, int which, uint32_t layer,
                            uint32_t slot, float *buf) {
    const uint32_t n = s->m->kv_dim;
    size_t at = kv_index(s, layer, slot);
    const void *base = which ? s->v_cache : s->k_cache;
    if (s->kv_type == NEEDLE_KV_F32) return (const float *)base + at;
    if (s->kv_type == NEEDLE_KV_F16) {
        const uint16_t *src = (const uint16_t *)base + at;
        for (uint32_t i = 0; i < n; i++) buf[i] = fp16_to_f32(src[i]);
    } else {
        const int8_t *src = (const int8_t *)base + at;
        const float *scales = kv_row_scales(s, which, layer, slot);
        for (uint32_t i = 0; i < n; i++) buf[i] = (float)src[i] * scales[i / KV_SCALE_GROUP];
    }
    return buf;
}

/* ---- operations ------------------------------------------------------------------------ */

static void cpu_embed(struct needle_session *s, const int32_t *tokens, uint32_t n,
                      float *lanes) {
    const struct needle_model *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t d = m->d, nl = m->n_lanes;
    const float emb_scale = (float)sqrt((double)d);
    for (uint32_t i = 0; i < n; i++) {
        float *X = lanes + (size_t)i * nl * d;
        c->kern->dequant_row(&m->embedding, (uint32_t)tokens[i], X, c->tmp);
        for (uint32_t k = 0; k < d; k++) X[k] *= emb_scale;
        for (uint32_t r = 1; r < nl; r++) memcpy(X + (size_t)r * d, X, d * sizeof *X);
    }
}

static void cpu_matmul_op(struct needle_session *s, const float *xr, size_t ld_x,
                          uint32_t ntok, const cq_job *jobs, uint32_t njobs) {
    cpu_matmul(cs_of(s)->pool, xr, ld_x, ntok, jobs, njobs);
}

static void cpu_engram_gather(struct needle_session *s, const engram_site *es,
                              const uint32_t *slots, uint32_t n, float *er) {
    const struct needle_model *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t ecols = es->key_proj.cols_pad;
    for (uint32_t i = 0; i < n; i++) {
        float *e = c->eng_e;
        for (uint32_t j = 0; j < m->n_tables; j++) {
            float *dst = e + (size_t)j * m->sub_dim;
            const uint32_t slot = slots[(size_t)i * m->n_tables + j];
            if (slot == ENGRAM_MASKED) memset(dst, 0, m->sub_dim * sizeof *dst);
            else c->kern->dequant_row(&es->tables, j * m->slots + slot, dst, c->tmp);
        }
        c->kern->rotate(&es->key_proj, e, er + (size_t)i * ecols);
    }
}

static void cpu_engram_conv(struct needle_session *s, const engram_site *es, float *ring,
                            const float *vhat, uint32_t p0, uint32_t n, float *ev) {
    const struct needle_model *m = s->m;
    const uint32_t d = m->d;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t t = p0 + i;
        memcpy(ring + (size_t)(t % s->ev_ring) * d, vhat + (size_t)i * d, d * sizeof(float));
        float *out = ev + (size_t)i * d;
        memset(out, 0, d * sizeof *out);
        for (uint32_t tap = 0; tap < m->taps; tap++) {
            uint32_t back = tap * m->dilation;
            if (back > t) break;
            const float *src = ring + (size_t)((t - back) % s->ev_ring) * d;
            const float *w = es->taps + (size_t)tap * d;
            for (uint32_t k = 0; k < d; k++) out[k] += w[k] * src[k];
        }
    }
}

static void cpu_lane_norm(struct needle_session *s, const float *lanes, uint32_t n, float *nx) {
    const struct needle_model *m = s->m;
    const uint32_t nd = m->n_lanes * m->d, ld = m->phi_pre.cols_pad;
    for (uint32_t i = 0; i < n; i++) {
        float *out = nx + (size_t)i * ld;
        rms_unit(lanes + (size_t)i * nd, nd, out);
        cs_of(s)->kern->rotate(&m->phi_pre, out, out);
    }
}

static void cpu_lane_read(struct needle_session *s, uint32_t li, uint32_t n, const float *lanes,
                          const float *mix_all, const float *ek_all, const float *ev_all,
                          float *u_all, float *bx_all, float *hr) {
    const struct needle_model *m = s->m;
    const cpu_session *c = cs_of(s);
    const layer_weights *l = &m->layers[li];
    const uint32_t d = m->d, nl = m->n_lanes, nd = nl * d, mix_ld = 2 * nl + nl * nl;
    const uint32_t h_ld = l->q_proj.cols_pad, my_lane = li % nl;
    for (uint32_t i = 0; i < n; i++) {
        const float *mix = mix_all + (size_t)i * mix_ld;
        const float *X = lanes + (size_t)i * nd;
        float *u = u_all + (size_t)i * d, *bx = bx_all + (size_t)i * d;
        memset(u, 0, d * sizeof *u);
        for (uint32_t r = 0; r < nl; r++) {
            float off = r == my_lane ? 4.0f : -4.0f;
            float w = sigmoidf(m->a_pre[li] * mix[r] + m->b_pre[li * nl + r] + off);
            for (uint32_t k = 0; k < d; k++) u[k] += w * X[(size_t)r * d + k];
        }
        memcpy(bx, u, d * sizeof *bx);
        if (ek_all) {
            const float *ek = ek_all + (size_t)i * d, *ev = ev_all + (size_t)i * d;
            float *ru = c->tmp, *rk = c->tmp + d;
            rms_unit(u, d, ru);
            rms_unit(ek, d, rk);
            float dot = 0.0f;
            for (uint32_t k = 0; k < d; k++) dot += ru[k] * rk[k];
            float alpha = sigmoidf(dot / sqrtf((float)d));
            for (uint32_t k = 0; k < d; k++) bx[k] += alpha * ev[k];
        }
        float *h = s->h + (size_t)i * d;
        zc_norm(bx, l->norm_in, d, h);
        c->kern->rotate(&l->q_proj, h, hr + (size_t)i * h_ld);
    }
}

/* Attention of one token at position t over the cache (§3.6). */
static void attend(struct needle_session *s, uint32_t layer, uint32_t t, const float *q,
                   float *o) {
    const struct needle_model *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t hd = m->head_dim, reps = m->n_heads / m->n_kv_heads;
    const float inv_scale = 1.0f / sqrtf((float)hd);
    /* positions attended: sinks [0, min(n_sinks, t+1)), then the window tail */
    uint32_t first = s->n_sinks;
    if (s->window && t + 1 > s->window && t + 1 - s->window > first) first = t + 1 - s->window;
    uint32_t n_sink = s->n_sinks < t + 1 ? s->n_sinks : t + 1;
    float *kbuf = c->tmp, *vbuf = c->tmp + m->kv_dim, *scores = s->scores;
    memset(o, 0, m->attn_dim * sizeof *o);
    for (uint32_t a = 0; a < m->n_heads; a++) {
        const uint32_t b = a / reps;
        const float *qa = q + (size_t)a * hd;
        uint32_t n_pos = 0;
        float mx = -INFINITY;
        for (uint32_t pass = 0; pass < 2; pass++) {
            uint32_t p_begin = pass ? (first > n_sink ? first : n_sink) : 0;
            uint32_t p_end = pass ? t + 1 : n_sink;
            for (uint32_t p = p_begin; p < p_end; p++) {
                const float *kr = kv_load(s, 0, layer, kv_slot(s, p), kbuf) + (size_t)b * hd;
                float dot = c->kern->dot(qa, kr, hd) * inv_scale;
                scores[n_pos++] = dot;
                mx = fmaxf(mx, dot);
            }
        }
        float sum = 0.0f;
        for (uint32_t k = 0; k < n_pos; k++) {
            scores[k] = expf(scores[k] - mx);
            sum += scores[k];
        }
        float *oa = o + (size_t)a * hd;
        uint32_t k = 0;
        for (uint32_t pass = 0; pass < 2; pass++) {
            uint32_t p_begin = pass ? (first > n_sink ? first : n_sink) : 0;
            uint32_t p_end = pass ? t + 1 : n_sink;
            for (uint32_t p = p_begin; p < p_end; p++, k++) {
                const float *vr = kv_load(s, 1, layer, kv_slot(s, p), vbuf) + (size_t)b * hd;
                c->kern->axpy(oa, scores[k] / sum, vr, hd);
            }
        }
    }
}

static void cpu_attention(struct needle_session *s, uint32_t li, uint32_t p0, uint32_t n,
                          const float *rope_cs, float *q_all, float *k_all, const float *v_all,
                          const float *gate_all, float *o_all) {
    const struct needle_model *m = s->m;
    const layer_weights *l = &m->layers[li];
    const uint32_t hd = m->head_dim, A = m->attn_dim, kvd = m->kv_dim;
    const uint32_t o_ld = l->out_proj.cols_pad;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t t = p0 + i;
        const float *cs = rope_cs + (size_t)i * hd;
        float *q = q_all + (size_t)i * A, *k = k_all + (size_t)i * kvd;
        for (uint32_t a = 0; a < m->n_heads; a++) {
            zc_norm(q + a * hd, l->q_norm, hd, q + a * hd);
            rope(q + a * hd, hd, cs);
        }
        for (uint32_t b = 0; b < m->n_kv_heads; b++) {
            zc_norm(k + b * hd, l->k_norm, hd, k + b * hd);
            rope(k + b * hd, hd, cs);
        }
        kv_store(s, 0, li, kv_slot(s, t), k);
        kv_store(s, 1, li, kv_slot(s, t), v_all + (size_t)i * kvd);
        float *o = o_all + (size_t)i * o_ld;
        attend(s, li, t, q, o);
        const float *g = gate_all + (size_t)i * A;
        for (uint32_t k2 = 0; k2 < A; k2++) o[k2] *= sigmoidf(g[k2]);
        cs_of(s)->kern->rotate(&l->out_proj, o, o);
    }
}

static void cpu_attn_residual(struct needle_session *s, uint32_t li, uint32_t n, float *attn,
                              const float *bx_all, float *x_all, float *h_all) {
    const struct needle_model *m = s->m;
    const layer_weights *l = &m->layers[li];
    const uint32_t d = m->d;
    const float gate = sigmoidf(l->attn_gate);
    for (uint32_t i = 0; i < n; i++) {
        const float *bx = bx_all + (size_t)i * d;
        float *a = attn + (size_t)i * d, *x = x_all + (size_t)i * d;
        zc_norm(a, l->post_norm, d, a);
        for (uint32_t k = 0; k < d; k++) x[k] = bx[k] + gate * a[k];
        zc_norm(x, l->pre_hada, d, h_all + (size_t)i * d);
    }
}

static void cpu_hadamard_mlp(struct needle_session *s, uint32_t li, uint32_t n,
                             const float *h_all, float *out_all) {
    const struct needle_model *m = s->m;
    const cpu_session *c = cs_of(s);
    const layer_weights *l = &m->layers[li];
    const uint32_t N = m->hada_n, d = m->d;
    const float scale = 1.0f / sqrtf((float)N);
    float *z = c->hada;
    for (uint32_t t = 0; t < n; t++) {
        const float *h = h_all + (size_t)t * d;
        float *out = out_all + (size_t)t * d;
        for (uint32_t i = 0; i < N; i++) z[i] = i < d ? l->d1[i] * h[i] : 0.0f;
        c->kern->fwht(z, N);
        for (uint32_t i = 0; i < N; i++) {
            float a = l->d2[i] * (z[i] * scale);
            z[i] = a * sigmoidf(a);
        }
        c->kern->fwht(z, N);
        for (uint32_t i = 0; i < d; i++) out[i] = l->d3[i] * (z[i] * scale);
    }
}

static void cpu_lane_write(struct needle_session *s, uint32_t li, uint32_t n,
                           const float *mix_all, const float *x_all, float *mlp,
                           const float *u_all, float *lanes) {
    const struct needle_model *m = s->m;
    const uint32_t d = m->d, nl = m->n_lanes, nd = nl * d, mix_ld = 2 * nl + nl * nl;
    const uint32_t my_lane = li % nl;
    for (uint32_t i = 0; i < n; i++) {
        const float *x = x_all + (size_t)i * d, *u = u_all + (size_t)i * d;
        /* y = block output - u: the engram term rides inside y (§3.4) */
        float *y = mlp + (size_t)i * d;
        for (uint32_t k = 0; k < d; k++) y[k] = x[k] + y[k] - u[k];

        const float *mix = mix_all + (size_t)i * mix_ld;
        float hpost[64], P[64 * 64];
        for (uint32_t r = 0; r < nl; r++) {
            float off = r == my_lane ? 0.0f : -4.0f;
            hpost[r] = 2.0f * sigmoidf(m->a_post[li] * mix[nl + r] + m->b_post[li * nl + r] + off);
        }
        for (uint32_t k = 0; k < nl * nl; k++)
            P[k] = m->a_res[li] * mix[2 * nl + k] + m->b_res[(size_t)li * nl * nl + k];
        sinkhorn(P, nl);
        float *X = lanes + (size_t)i * nd, *old = cs_of(s)->lane_old;
        memcpy(old, X, nd * sizeof *old);
        for (uint32_t r = 0; r < nl; r++) {
            float *dst = X + (size_t)r * d;
            for (uint32_t k = 0; k < d; k++) dst[k] = hpost[r] * y[k];
            for (uint32_t cc = 0; cc < nl; cc++) {
                const float pw = P[r * nl + cc];
                const float *src = old + (size_t)cc * d;
                for (uint32_t k = 0; k < d; k++) dst[k] += pw * src[k];
            }
        }
    }
}

static void cpu_logits(struct needle_session *s, const float *lanes, uint32_t count, float *out,
                       int32_t *argmax) {
    const struct needle_model *m = s->m;
    const cpu_session *c = cs_of(s);
    const uint32_t d = m->d, nl = m->n_lanes, ld = m->embedding.cols_pad;
    for (uint32_t i = 0; i < count; i++) {
        const float *X = lanes + (size_t)i * nl * d;
        float *xbar = c->tmp;
        for (uint32_t k = 0; k < d; k++) {
            float acc = 0.0f;
            for (uint32_t r = 0; r < nl; r++) acc += X[(size_t)r * d + k];
            xbar[k] = acc / (float)nl;
        }
        zc_norm(xbar, m->final_norm, d, xbar);
        c->kern->rotate(&m->embedding, xbar, c->out_rot + (size_t)i * ld);
    }
    const cq_job tied[] = {{&m->embedding, 0, m->vocab, out, m->vocab}};
    cpu_matmul(c->pool, c->out_rot, ld, count, tied, 1);
    if (argmax)
        for (uint32_t i = 0; i < count; i++) {
            const float *row = out + (size_t)i * m->vocab;
            int32_t best = 0;
            for (uint32_t v = 1; v < m->vocab; v++)
                if (row[v] > row[best]) best = (int32_t)v;
            argmax[i] = best;
        }
}

const needle_backend_ops cpu_backend_ops = {
    .model_load = NULL,
    .model_unload = NULL,
    .session_init = cpu_session_init,
    .session_free = cpu_session_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .embed = cpu_embed,
    .matmul = cpu_matmul_op,
    .engram_gather = cpu_engram_gather,
    .engram_conv = cpu_engram_conv,
    .lane_norm = cpu_lane_norm,
    .lane_read = cpu_lane_read,
    .attention = cpu_attention,
    .attn_residual = cpu_attn_residual,
    .hadamard_mlp = cpu_hadamard_mlp,
    .lane_write = cpu_lane_write,
    .logits = cpu_logits,
};
