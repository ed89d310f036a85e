/* The Needle 2 forward pass of spec §3 in one plain function: the oracle of
 * tests/kernels/test_backend_ops.c.
 *
 * Read top to bottom it is the spec: token by token, each through every layer; float32;
 * no chunks, no threads, no backend, no ring buffers (the whole K/V history and engram
 * value history are kept, and the attention window is applied by position). It shares
 * with the engine only what is defined once: the weight views (backend/weights.h), the
 * CQ product of kernels/cq.h (y = W x: rotate x, then codebook dot products) and the
 * scalar math of kernels/nmath.h. Everything the backends compose differently (the
 * chunking, the KV ring and its precisions, the engram ring, the lane and mix layouts,
 * the batching of products) is written here the plain way. */
#include "reference_forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cq.h"
#include "kernels/nmath.h"

/* y[0:nrows] = W[row0 : row0 + nrows] x; xr: W.cols_pad floats of scratch. */
static void matvec(const cq_matrix *W, uint32_t row0, uint32_t nrows, const float *x, float *xr,
                   float *y) {
    cq_rotate(W, x, xr);
    cq_matmul(W, row0, nrows, xr, 0, 1, y, 0);
}

static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

int reference_forward(const struct model_weights *m, const float *rope_freq,
                      const int32_t *tokens, uint32_t n, uint32_t window, uint32_t n_sinks,
                      float *logits) {
    const uint32_t d = m->d, nl = m->n_lanes, L = m->n_layers, hd = m->head_dim;
    const uint32_t H = m->n_heads, KV = m->n_kv_heads, A = m->attn_dim, kvd = m->kv_dim;
    const uint32_t N = m->hada_n, V = m->vocab, T = m->n_tables, sub = m->sub_dim;
    const uint32_t heads_per_order = m->n_sites ? T / m->n_orders : 0;
    size_t widest = m->phi_pre.cols_pad;
    if (m->embedding.cols_pad > widest) widest = m->embedding.cols_pad;
    if (m->layers[0].q_proj.cols_pad > widest) widest = m->layers[0].q_proj.cols_pad;
    if (m->layers[0].out_proj.cols_pad > widest) widest = m->layers[0].out_proj.cols_pad;
    if (m->n_sites && m->sites[0].key_proj.cols_pad > widest)
        widest = m->sites[0].key_proj.cols_pad;

    float *X = zeros((size_t)nl * d), *old = zeros((size_t)nl * d), *xr = zeros(widest);
    float *nx = zeros(widest), *mix = zeros(2 * nl + nl * nl), *P = zeros(nl * nl);
    float *u = zeros(d), *bx = zeros(d), *h = zeros(d), *x2 = zeros(d), *y = zeros(d);
    float *q = zeros(A), *gate = zeros(A), *o = zeros(A), *attn = zeros(d);
    float *z = zeros(N), *e = zeros((size_t)T * sub + 1), *tmp = zeros(m->group);
    float *ek = zeros((size_t)m->n_sites * d), *ev = zeros((size_t)m->n_sites * d);
    float *K = zeros((size_t)L * n * kvd), *Vc = zeros((size_t)L * n * kvd);
    float *vhat = zeros((size_t)m->n_sites * n * d), *scores = zeros(n), *cs = zeros(hd);
    float *xbar = zeros(d), hpost[64];
    int rc = 0;
    if (!X || !old || !xr || !nx || !mix || !P || !u || !bx || !h || !x2 || !y || !q ||
        !gate || !o || !attn || !z || !e || !tmp || !ek || !ev || !K || !Vc || !vhat ||
        !scores || !cs || !xbar || nl > 64) {
        rc = -1;
        goto out;
    }

    for (uint32_t t = 0; t < n; t++) {
        /* §3.2 embedding: every lane starts as sqrt(d) * E[token] */
        cq_dequant_row(&m->embedding, (uint32_t)tokens[t], X, tmp);
        for (uint32_t k = 0; k < d; k++) X[k] *= (float)sqrt((double)d);
        for (uint32_t r = 1; r < nl; r++) memcpy(X + (size_t)r * d, X, d * sizeof *X);

        /* §3.3 engram memory: hashed n-grams -> table rows -> key and value, then a
         * causal depthwise conv over the values */
        for (uint32_t site = 0; site < m->n_sites; site++) {
            const engram_site *es = &m->sites[site];
            for (uint32_t a = 0; a < m->n_orders; a++)
                for (uint32_t hh = 0; hh < heads_per_order; hh++) {
                    const uint32_t j = a * heads_per_order + hh, order = m->orders[a];
                    float *dst = e + (size_t)j * sub;
                    if (t + 1 < order) {
                        memset(dst, 0, sub * sizeof *dst);
                        continue;
                    }
                    uint32_t acc = nm_engram_hash_start(j);
                    for (uint32_t back = 0; back < order; back++)
                        acc = nm_engram_hash_step(acc, (uint32_t)tokens[t - back]);
                    const uint32_t slot = nm_engram_hash_slot(acc, m->slots);
                    cq_dequant_row(&es->tables, j * m->slots + slot, dst, tmp);
                }
            float *vh = vhat + ((size_t)site * n + t) * d;
            matvec(&es->key_proj, 0, d, e, xr, ek + (size_t)site * d);
            matvec(&es->value_proj, 0, d, e, xr, vh);
            float *evs = ev + (size_t)site * d;
            memset(evs, 0, d * sizeof *evs);
            for (uint32_t tap = 0; tap < m->taps && tap * m->dilation <= t; tap++) {
                const float *src = vhat + ((size_t)site * n + t - tap * m->dilation) * d;
                for (uint32_t k = 0; k < d; k++) evs[k] += es->taps[(size_t)tap * d + k] * src[k];
            }
        }

        /* RoPE angles of position t */
        for (uint32_t j = 0; j < hd / 2; j++) {
            cs[j] = cosf((float)t * rope_freq[j]);
            cs[hd / 2 + j] = sinf((float)t * rope_freq[j]);
        }

        for (uint32_t li = 0; li < L; li++) {
            const layer_weights *l = &m->layers[li];
            const uint32_t own = li % nl;
            int site = -1;
            for (uint32_t s = 0; s < m->n_sites; s++)
                if (m->sites[s].layer == li) site = (int)s;

            /* §3.4 mixing weights from the normalised lanes: pre [nl], post [nl], res [nl*nl] */
            nm_rms_unit(X, nl * d, nx);
            matvec(&m->phi_pre, li * nl, nl, nx, xr, mix);
            matvec(&m->phi_post, li * nl, nl, nx, xr, mix + nl);
            matvec(&m->phi_res, li * nl * nl, nl * nl, nx, xr, mix + 2 * nl);

            /* §3.4 lane read: u = sum_r sigmoid(pre_r) X_r; §3.3 engram gate into bx */
            memset(u, 0, d * sizeof *u);
            for (uint32_t r = 0; r < nl; r++) {
                const float w = nm_sigmoid(m->a_pre[li] * mix[r] + m->b_pre[li * nl + r] +
                                           nm_lane_pre_offset(r, own));
                for (uint32_t k = 0; k < d; k++) u[k] += w * X[(size_t)r * d + k];
            }
            memcpy(bx, u, d * sizeof *bx);
            if (site >= 0) {
                const float *eks = ek + (size_t)site * d, *evs = ev + (size_t)site * d;
                const float iu = nm_rms_inv(u, d), ik = nm_rms_inv(eks, d);
                float dot = 0.0f;
                for (uint32_t k = 0; k < d; k++) dot += (u[k] * iu) * (eks[k] * ik);
                const float alpha = nm_sigmoid(dot / sqrtf((float)d));
                for (uint32_t k = 0; k < d; k++) bx[k] += alpha * evs[k];
            }

            /* §3.6 attention: projections, q/k norm and RoPE, softmax over the sinks and
             * the window, sigmoid output gate, output projection */
            nm_zc_norm(bx, l->norm_in, d, h);
            float *kt = K + ((size_t)li * n + t) * kvd, *vt = Vc + ((size_t)li * n + t) * kvd;
            matvec(&l->q_proj, 0, A, h, xr, q);
            matvec(&l->k_proj, 0, kvd, h, xr, kt);
            matvec(&l->v_proj, 0, kvd, h, xr, vt);
            matvec(&l->gate_proj, 0, A, h, xr, gate);
            for (uint32_t b = 0; b < KV; b++) {
                nm_zc_norm(kt + b * hd, l->k_norm, hd, kt + b * hd);
                nm_rope(kt + b * hd, hd, cs);
            }
            const nm_span span = nm_attention_span(t, n_sinks, window);
            for (uint32_t a = 0; a < H; a++) {
                float *qa = q + a * hd, *oa = o + a * hd;
                const uint32_t b = a / (H / KV);
                nm_zc_norm(qa, l->q_norm, hd, qa);
                nm_rope(qa, hd, cs);
                uint32_t np = 0;
                for (uint32_t p = 0; p <= t; p++) {
                    if (p >= span.n_sink && p < span.tail0) continue;
                    const float *kp = K + ((size_t)li * n + p) * kvd + b * hd;
                    float dot = 0.0f;
                    for (uint32_t c = 0; c < hd; c++) dot += qa[c] * kp[c];
                    scores[np++] = dot / sqrtf((float)hd);
                }
                const float sum = nm_softmax_exp(scores, np);
                memset(oa, 0, hd * sizeof *oa);
                np = 0;
                for (uint32_t p = 0; p <= t; p++) {
                    if (p >= span.n_sink && p < span.tail0) continue;
                    const float *vp = Vc + ((size_t)li * n + p) * kvd + b * hd;
                    const float w = scores[np++] / sum;
                    for (uint32_t c = 0; c < hd; c++) oa[c] += w * vp[c];
                }
                for (uint32_t c = 0; c < hd; c++) oa[c] *= nm_sigmoid(gate[a * hd + c]);
            }
            matvec(&l->out_proj, 0, d, o, xr, attn);

            /* §3.5 residual: x = bx + sigmoid(g) * ZC(attn), h = ZC(x) */
            nm_zc_norm(attn, l->post_norm, d, attn);
            for (uint32_t k = 0; k < d; k++) x2[k] = bx[k] + nm_sigmoid(l->attn_gate) * attn[k];
            nm_zc_norm(x2, l->pre_hada, d, h);

            /* §3.7 Hadamard MLP: D3 H silu(D2 H D1 h), 1/sqrt(N) after each transform */
            const float sN = 1.0f / sqrtf((float)N);
            for (uint32_t i = 0; i < N; i++) z[i] = i < d ? l->d1[i] * h[i] : 0.0f;
            nm_fwht(z, N);
            for (uint32_t i = 0; i < N; i++) {
                const float v = l->d2[i] * (z[i] * sN);
                z[i] = v * nm_sigmoid(v);
            }
            nm_fwht(z, N);

            /* §3.4 lane write: y = x + mlp - u; lanes = Sinkhorn(res) lanes + hpost y */
            for (uint32_t k = 0; k < d; k++) y[k] = x2[k] + l->d3[k] * (z[k] * sN) - u[k];
            for (uint32_t r = 0; r < nl; r++)
                hpost[r] = NM_LANE_POST_GAIN *
                           nm_sigmoid(m->a_post[li] * mix[nl + r] + m->b_post[li * nl + r] +
                                      nm_lane_post_offset(r, own));
            for (uint32_t k = 0; k < nl * nl; k++)
                P[k] = m->a_res[li] * mix[2 * nl + k] + m->b_res[(size_t)li * nl * nl + k];
            nm_sinkhorn(P, nl);
            memcpy(old, X, (size_t)nl * d * sizeof *old);
            for (uint32_t r = 0; r < nl; r++)
                for (uint32_t k = 0; k < d; k++) {
                    float acc = hpost[r] * y[k];
                    for (uint32_t c = 0; c < nl; c++) acc += P[r * nl + c] * old[(size_t)c * d + k];
                    X[(size_t)r * d + k] = acc;
                }
        }

        /* §3.8 tied logits of ZC(mean of the lanes; final_norm) */
        for (uint32_t k = 0; k < d; k++) {
            float acc = 0.0f;
            for (uint32_t r = 0; r < nl; r++) acc += X[(size_t)r * d + k];
            xbar[k] = acc / (float)nl;
        }
        nm_zc_norm(xbar, m->final_norm, d, xbar);
        matvec(&m->embedding, 0, V, xbar, xr, logits + (size_t)t * V);
    }

out:
    free(X); free(old); free(xr); free(nx); free(mix); free(P); free(u); free(bx); free(h);
    free(x2); free(y); free(q); free(gate); free(o); free(attn); free(z); free(e); free(tmp);
    free(ek); free(ev); free(K); free(Vc); free(vhat); free(scores); free(cs); free(xbar);
    return rc;
}
