/* The Needle 2 forward pass (spec §3), plain C, float32, over a chunk of tokens.
 *
 * Read top to bottom it follows the spec: embedding (§3.2), engram memory from token ids
 * (§3.3), then per layer the multi-lane hyper-connection around the block (§3.4), the
 * block with attention and the Hadamard MLP (§3.5-3.7), and the tied logits (§3.8).
 * Matrix products go through cpu_matmul over the whole chunk, products that read the same
 * activations in one batch, with rows shared among the session's threads; everything
 * order-dependent (KV ring, engram conv ring) is done token by token inside the chunk.
 * CQ kernels come from the session's dispatch table `s->kern` (kernels/cpu/cpu.h). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "model/session.h"
#include "util/error.h"
#include "util/fp16.h"

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

/* ---- engram memory (§3.3) --------------------------------------------------------- */

/* Token at absolute position t - back, for a chunk starting at p0 (0 before the start). */
static int32_t token_back(const struct needle_session *s, const int32_t *tokens, uint32_t p0,
                          uint32_t t, uint32_t back) {
    if (back > t) return 0;
    uint32_t p = t - back;
    if (p >= p0) return tokens[p - p0];
    return s->history[p % SESSION_HISTORY];
}

static void engram_chunk(struct needle_session *s, const int32_t *tokens, uint32_t p0,
                         uint32_t n) {
    const struct needle_model *m = s->m;
    const uint32_t heads = m->n_tables / m->n_orders, d = m->d;
    for (uint32_t site = 0; site < m->n_sites; site++) {
        const engram_site *es = &m->sites[site];
        const uint32_t ecols = es->key_proj.cols_pad;
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t t = p0 + i;
            float *e = s->eng_e; /* [T * sub] for this token */
            for (uint32_t a = 0; a < m->n_orders; a++) {
                const uint32_t order = m->orders[a];
                for (uint32_t hh = 0; hh < heads; hh++) {
                    const uint32_t j = a * heads + hh;
                    float *dst = e + (size_t)j * m->sub_dim;
                    if (t + 1 < order) { /* the n-gram's oldest token does not exist */
                        memset(dst, 0, m->sub_dim * sizeof *dst);
                        continue;
                    }
                    uint32_t acc = 0x9E3779B9u * (j + 1);
                    for (uint32_t back = 0; back < order; back++)
                        acc = (acc ^ (uint32_t)token_back(s, tokens, p0, t, back)) * 0x01000193u;
                    acc ^= acc >> 15;
                    uint32_t slot = acc % m->slots;
                    s->kern->dequant_row(&es->tables, j * m->slots + slot, dst, s->tmp);
                }
            }
            s->kern->rotate(&es->key_proj, e, s->eng_er + (size_t)i * ecols);
        }
        float *ek = s->eng_k + (size_t)site * s->chunk * d;
        const cq_job kv[] = {{&es->key_proj, 0, d, ek, d}, {&es->value_proj, 0, d, s->eng_vhat, d}};
        cpu_matmul(s->pool, s->eng_er, ecols, n, kv, 2);
        /* depthwise causal conv over pre-conv values at offsets 0, dil, 2*dil, ... */
        float *ring = s->ev_hist + (size_t)site * s->ev_ring * d;
        float *ev = s->eng_v + (size_t)site * s->chunk * d;
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t t = p0 + i;
            memcpy(ring + (size_t)(t % s->ev_ring) * d, s->eng_vhat + (size_t)i * d,
                   d * sizeof(float));
            float *out = ev + (size_t)i * d;
            memset(out, 0, d * sizeof *out);
            for (uint32_t tap = 0; tap < m->taps; tap++) {
                uint32_t back = tap * m->dilation;
                if (back > t) break;
                const float *src = ring + (size_t)((t - back) % s->ev_ring) * d;
                const float *w = es->taps + (size_t)tap * d;
                for (uint32_t c = 0; c < d; c++) out[c] += w[c] * src[c];
            }
        }
    }
}

/* ---- attention for one token (§3.6) --------------------------------------------- */

static void attend(struct needle_session *s, uint32_t layer, uint32_t t, const float *q,
                   float *o) {
    const struct needle_model *m = s->m;
    const uint32_t hd = m->head_dim, reps = m->n_heads / m->n_kv_heads;
    const float inv_scale = 1.0f / sqrtf((float)hd);
    /* positions attended: sinks [0, min(n_sinks, t+1)), then the window tail */
    uint32_t first = s->n_sinks;
    if (s->window && t + 1 > s->window && t + 1 - s->window > first) first = t + 1 - s->window;
    uint32_t n_sink = s->n_sinks < t + 1 ? s->n_sinks : t + 1;
    float *kbuf = s->tmp, *vbuf = s->tmp + m->kv_dim;
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
                float dot = s->kern->dot(qa, kr, hd) * inv_scale;
                s->scores[n_pos++] = dot;
                mx = fmaxf(mx, dot);
            }
        }
        float sum = 0.0f;
        for (uint32_t k = 0; k < n_pos; k++) {
            s->scores[k] = expf(s->scores[k] - mx);
            sum += s->scores[k];
        }
        float *oa = o + (size_t)a * hd;
        uint32_t k = 0;
        for (uint32_t pass = 0; pass < 2; pass++) {
            uint32_t p_begin = pass ? (first > n_sink ? first : n_sink) : 0;
            uint32_t p_end = pass ? t + 1 : n_sink;
            for (uint32_t p = p_begin; p < p_end; p++, k++) {
                const float *vr = kv_load(s, 1, layer, kv_slot(s, p), vbuf) + (size_t)b * hd;
                s->kern->axpy(oa, s->scores[k] / sum, vr, hd);
            }
        }
    }
}

/* ---- Hadamard MLP (§3.7) -------------------------------------------------------- */

static void hadamard_mlp(const struct needle_session *s, const layer_weights *l, const float *h,
                         float *z, float *out) {
    const struct needle_model *m = s->m;
    const uint32_t N = m->hada_n, d = m->d;
    const float scale = 1.0f / sqrtf((float)N);
    for (uint32_t i = 0; i < N; i++) z[i] = i < d ? l->d1[i] * h[i] : 0.0f;
    s->kern->fwht(z, N);
    for (uint32_t i = 0; i < N; i++) {
        float a = l->d2[i] * (z[i] * scale);
        z[i] = a * sigmoidf(a);
    }
    s->kern->fwht(z, N);
    for (uint32_t i = 0; i < d; i++) out[i] = l->d3[i] * (z[i] * scale);
}

/* ---- one layer over the chunk (§3.4, §3.5) -------------------------------------- */

static void layer_chunk(struct needle_session *s, uint32_t li, uint32_t p0, uint32_t n,
                        const float *rope_cs) {
    const struct needle_model *m = s->m;
    const layer_weights *l = &m->layers[li];
    const uint32_t d = m->d, nl = m->n_lanes, nd = nl * d, hd = m->head_dim;
    const uint32_t nx_ld = m->phi_pre.cols_pad, mix_ld = 2 * nl + nl * nl;
    const uint32_t h_ld = l->q_proj.cols_pad, o_ld = l->out_proj.cols_pad;
    const uint32_t A = m->attn_dim, kvd = m->kv_dim;
    const int site = model_site_of(m, li);

    /* lane mixing weights from the normalised lanes */
    for (uint32_t i = 0; i < n; i++) {
        float *nx = s->nx + (size_t)i * nx_ld;
        rms_unit(s->lanes + (size_t)i * nd, nd, nx);
        s->kern->rotate(&m->phi_pre, nx, nx);
    }
    const cq_job phi[] = {{&m->phi_pre, li * nl, nl, s->mix, mix_ld},
                          {&m->phi_post, li * nl, nl, s->mix + nl, mix_ld},
                          {&m->phi_res, li * nl * nl, nl * nl, s->mix + 2 * nl, mix_ld}};
    cpu_matmul(s->pool, s->nx, nx_ld, n, phi, 3);

    const uint32_t my_lane = li % nl;
    for (uint32_t i = 0; i < n; i++) {
        const float *mix = s->mix + (size_t)i * mix_ld;
        const float *X = s->lanes + (size_t)i * nd;
        float *u = s->u + (size_t)i * d, *bx = s->bx + (size_t)i * d;
        memset(u, 0, d * sizeof *u);
        for (uint32_t r = 0; r < nl; r++) {
            float off = r == my_lane ? 4.0f : -4.0f;
            float w = sigmoidf(m->a_pre[li] * mix[r] + m->b_pre[li * nl + r] + off);
            for (uint32_t c = 0; c < d; c++) u[c] += w * X[(size_t)r * d + c];
        }
        memcpy(bx, u, d * sizeof *bx);
        if (site >= 0) {
            const float *ek = s->eng_k + ((size_t)site * s->chunk + i) * d;
            const float *ev = s->eng_v + ((size_t)site * s->chunk + i) * d;
            float *ru = s->tmp, *rk = s->tmp + d;
            rms_unit(u, d, ru);
            rms_unit(ek, d, rk);
            float dot = 0.0f;
            for (uint32_t c = 0; c < d; c++) dot += ru[c] * rk[c];
            float alpha = sigmoidf(dot / sqrtf((float)d));
            for (uint32_t c = 0; c < d; c++) bx[c] += alpha * ev[c];
        }
        float *h = s->h + (size_t)i * d;
        zc_norm(bx, l->norm_in, d, h);
        s->kern->rotate(&l->q_proj, h, s->hr + (size_t)i * h_ld);
    }

    /* attention projections for the whole chunk */
    const cq_job qkvg[] = {{&l->q_proj, 0, A, s->q, A}, {&l->k_proj, 0, kvd, s->k, kvd},
                           {&l->v_proj, 0, kvd, s->v, kvd}, {&l->gate_proj, 0, A, s->gate, A}};
    cpu_matmul(s->pool, s->hr, h_ld, n, qkvg, 4);

    for (uint32_t i = 0; i < n; i++) {
        const uint32_t t = p0 + i;
        const float *cs = rope_cs + (size_t)i * hd;
        float *q = s->q + (size_t)i * A, *k = s->k + (size_t)i * kvd;
        for (uint32_t a = 0; a < m->n_heads; a++) {
            zc_norm(q + a * hd, l->q_norm, hd, q + a * hd);
            rope(q + a * hd, hd, cs);
        }
        for (uint32_t b = 0; b < m->n_kv_heads; b++) {
            zc_norm(k + b * hd, l->k_norm, hd, k + b * hd);
            rope(k + b * hd, hd, cs);
        }
        kv_store(s, 0, li, kv_slot(s, t), k);
        kv_store(s, 1, li, kv_slot(s, t), s->v + (size_t)i * kvd);
        float *o = s->o + (size_t)i * o_ld;
        attend(s, li, t, q, o);
        const float *g = s->gate + (size_t)i * A;
        for (uint32_t c = 0; c < A; c++) o[c] *= sigmoidf(g[c]);
        s->kern->rotate(&l->out_proj, o, o);
    }
    const cq_job out[] = {{&l->out_proj, 0, d, s->attn, d}};
    cpu_matmul(s->pool, s->o, o_ld, n, out, 1);

    const float gate = sigmoidf(l->attn_gate);
    for (uint32_t i = 0; i < n; i++) {
        const float *bx = s->bx + (size_t)i * d, *u = s->u + (size_t)i * d;
        float *a = s->attn + (size_t)i * d, *x = s->x2 + (size_t)i * d;
        zc_norm(a, l->post_norm, d, a);
        for (uint32_t c = 0; c < d; c++) x[c] = bx[c] + gate * a[c];
        float *h = s->h + (size_t)i * d;
        zc_norm(x, l->pre_hada, d, h);
        hadamard_mlp(s, l, h, s->hada, a); /* a := MLP(h) */
        /* y = block output - u: the engram term rides inside y (§3.4) */
        float *y = a;
        for (uint32_t c = 0; c < d; c++) y[c] = x[c] + a[c] - u[c];

        const float *mix = s->mix + (size_t)i * mix_ld;
        float hpost[64], P[64 * 64];
        for (uint32_t r = 0; r < nl; r++) {
            float off = r == my_lane ? 0.0f : -4.0f;
            hpost[r] = 2.0f * sigmoidf(m->a_post[li] * mix[nl + r] + m->b_post[li * nl + r] + off);
        }
        for (uint32_t k = 0; k < nl * nl; k++)
            P[k] = m->a_res[li] * mix[2 * nl + k] + m->b_res[(size_t)li * nl * nl + k];
        sinkhorn(P, nl);
        float *X = s->lanes + (size_t)i * nd, *old = s->lane_old;
        memcpy(old, X, nd * sizeof *old);
        for (uint32_t r = 0; r < nl; r++) {
            float *dst = X + (size_t)r * d;
            for (uint32_t c = 0; c < d; c++) dst[c] = hpost[r] * y[c];
            for (uint32_t cc = 0; cc < nl; cc++) {
                const float pw = P[r * nl + cc];
                const float *src = old + (size_t)cc * d;
                for (uint32_t c = 0; c < d; c++) dst[c] += pw * src[c];
            }
        }
    }
}

/* ---- output (§3.8) ---------------------------------------------------------------- */

/* Logits of chunk positions [i0, i0 + count) into out[count][vocab]. */
static void logits_for(struct needle_session *s, uint32_t i0, uint32_t count, float *out) {
    const struct needle_model *m = s->m;
    const uint32_t d = m->d, nl = m->n_lanes, ld = m->embedding.cols_pad;
    for (uint32_t i = 0; i < count; i++) {
        const float *X = s->lanes + (size_t)(i0 + i) * nl * d;
        float *xbar = s->tmp;
        for (uint32_t c = 0; c < d; c++) {
            float acc = 0.0f;
            for (uint32_t r = 0; r < nl; r++) acc += X[(size_t)r * d + c];
            xbar[c] = acc / (float)nl;
        }
        zc_norm(xbar, m->final_norm, d, xbar);
        s->kern->rotate(&m->embedding, xbar, s->out_rot + (size_t)i * ld);
    }
    const cq_job tied[] = {{&m->embedding, 0, m->vocab, out, m->vocab}};
    cpu_matmul(s->pool, s->out_rot, ld, count, tied, 1);
}

int session_forward(struct needle_session *s, const int32_t *tokens, uint32_t n,
                    float *all_logits) {
    const struct needle_model *m = s->m;
    const uint32_t d = m->d, nl = m->n_lanes, hd = m->head_dim;
    const float emb_scale = (float)sqrt((double)d);
    for (uint32_t done = 0; done < n;) {
        const uint32_t p0 = s->pos, cn = n - done < s->chunk ? n - done : s->chunk;
        const int32_t *tok = tokens + done;
        /* RoPE angles for this chunk's positions, [i][cos(hd/2) | sin(hd/2)] */
        float *cs = s->rope_cs;
        for (uint32_t i = 0; i < cn; i++) {
            const float tf = (float)(p0 + i);
            for (uint32_t j = 0; j < hd / 2; j++) {
                const float ang = tf * m->rope_freq[j];
                cs[(size_t)i * hd + j] = cosf(ang);
                cs[(size_t)i * hd + hd / 2 + j] = sinf(ang);
            }
        }
        for (uint32_t i = 0; i < cn; i++) {
            float *X = s->lanes + (size_t)i * nl * d;
            s->kern->dequant_row(&m->embedding, (uint32_t)tok[i], X, s->tmp);
            for (uint32_t c = 0; c < d; c++) X[c] *= emb_scale;
            for (uint32_t r = 1; r < nl; r++) memcpy(X + (size_t)r * d, X, d * sizeof *X);
        }
        if (m->n_sites) engram_chunk(s, tok, p0, cn);
        for (uint32_t li = 0; li < m->n_layers; li++) layer_chunk(s, li, p0, cn, cs);

        for (uint32_t i = 0; i < cn; i++) s->history[(p0 + i) % SESSION_HISTORY] = tok[i];
        s->pos = p0 + cn;
        if (all_logits) logits_for(s, 0, cn, all_logits + (size_t)done * m->vocab);
        if (done + cn == n) {
            if (all_logits) memcpy(s->logits, all_logits + (size_t)(n - 1) * m->vocab,
                                   m->vocab * sizeof(float));
            else if (!s->skip_logits) logits_for(s, cn - 1, 1, s->logits);
        }
        done += cn;
    }
    s->has_logits = all_logits || !s->skip_logits;
    return NEEDLE_OK;
}
