/* The Metal kernels' arithmetic, in the common subset of MSL and C (metal_compat.h).
 *
 * Every kernel is one function nk_<name>(NK_PARAMS) run for gid = 0 .. a->n_items - 1, one
 * GPU thread per item (kernels.metal wraps each in a `kernel`; metal_emu.c runs the same
 * functions in a C loop on Linux). Items are independent within a dispatch; order between
 * dispatches is the host's (metal_ops.c). Buffers are b0..b8 (their meaning is listed per
 * kernel) plus `wf`, the model's widened float tensors, indexed by the offsets o_a..o_d.
 * The arithmetic follows the CPU reference (backend/cpu/ops.c, kernels/cpu/cq_plain.c)
 * operation by operation; only the CPU's SIMD dot products sum in another order. */
#ifndef NEEDLE_METAL_NK_KERNELS_H
#define NEEDLE_METAL_NK_KERNELS_H

#ifndef NK_SINGLE_SOURCE /* the Metal library's single source holds nmath.h before this */
#include "kernels/nmath.h"
#endif

/* A CQ matrix's geometry (its codes, norms and codebook come as buffers). */
typedef struct nk_cq {
    uint rows, cols, cols_pad, group, ngroups, bits, row_bytes, unused;
} nk_cq;

/* The argument block of every kernel: only 4-byte fields, so C and MSL lay it out alike. */
typedef struct nk_args {
    uint n_items;                 /* grid size */
    nk_cq w;                      /* the kernel's matrix (or the rotation's geometry) */
    uint row0, nrows, ntok, ld_x, ld_y;
    uint d, nl, p0, t, my_lane, mix_ld, has_site;
    uint n_tables, n_slots, sub, scr_ld;
    uint taps, dil, ring_n, first;
    uint H, hd, A, kvd, reps;
    uint kv_type, slots, layer, n_layers, n_sinks, window;
    uint N, vocab;
    uint o_a, o_b, o_c, o_d;      /* offsets into wf */
    float f0;                     /* a scalar weight (attn_gate, sqrt(d)) */
    /* Needle 3: q|k|v row widths (H*qk, KV*qk, KV*v), per-head widths, the layer's local
     * window (0: global), its first KV cache row (backend.h kv_layers; n_sinks and window
     * are then the layer's) and the Monarch MLP's tensors (offsets into wf, NK_MONARCH_*) */
    uint wq, wk, wv, qk, vd, lwin, kv_row0;
    uint ow[13];
} nk_args;

#define NK_KV_F32 0u
#define NK_KV_F16 1u
#define NK_KV_I8 2u
#define NK_KV_GROUP 32u
#define NK_MASKED 0xFFFFFFFFu

#define NK_PARAMS                                                                            \
    NK_CONST const nk_args *a, NK_DEVICE uchar *b0, NK_DEVICE uchar *b1, NK_DEVICE uchar *b2, \
        NK_DEVICE uchar *b3, NK_DEVICE uchar *b4, NK_DEVICE uchar *b5, NK_DEVICE uchar *b6,   \
        NK_DEVICE uchar *b7, NK_DEVICE uchar *b8, NK_DEVICE const float *wf, uint gid

#define NK_F(p) ((NK_DEVICE float *)(p))

/* ---- helpers ------------------------------------------------------------------------- */

/* Code k of a packed row (LSB-first streams). */
NK_FN uint nk_code(NK_DEVICE const uchar *row, uint bits, uint k) {
    if (bits == 1u) return ((uint)row[k >> 3] >> (k & 7u)) & 1u; /* Needle 3 binary */
    if (bits == 4u) return ((uint)row[k >> 1] >> ((k & 1u) * 4u)) & 15u;
    if (bits == 3u) {
        NK_DEVICE const uchar *p = row + (k >> 3) * 3u;
        uint word = (uint)p[0] | ((uint)p[1] << 8) | ((uint)p[2] << 16);
        return (word >> (3u * (k & 7u))) & 7u;
    }
    return ((uint)row[k >> 2] >> ((k & 3u) * 2u)) & 3u; /* 2 bits, ternary crumbs */
}

/* xr[0:cols_pad] = per-group H_G [x, 0...] / sqrt(G) (cq_rotate); xr may equal x. */
NK_FN void nk_rotate(nk_cq w, NK_DEVICE const float *x, NK_DEVICE float *xr) {
    const float scale = 1.0f / NK_SQRT((float)w.group);
    if (xr != x)
        for (uint k = 0; k < w.cols; k++) xr[k] = x[k];
    for (uint k = w.cols; k < w.cols_pad; k++) xr[k] = 0.0f;
    for (uint g = 0; g < w.ngroups; g++) {
        NK_DEVICE float *v = xr + g * w.group;
        nm_fwht(v, w.group);
        for (uint k = 0; k < w.group; k++) v[k] *= scale;
    }
}

/* tmp[0:cols_pad] = row r before the final 1/sqrt(G): per group H_G (norm * levels). */
NK_FN void nk_dequant_raw(nk_cq w, NK_DEVICE const uchar *codes, NK_DEVICE const uchar *norms,
                          NK_DEVICE const uchar *codebook, uint r, NK_DEVICE float *tmp) {
    NK_DEVICE const uchar *row = codes + (ulong)r * w.row_bytes;
    NK_DEVICE const ushort *nr = (NK_DEVICE const ushort *)norms + (ulong)r * w.ngroups;
    NK_DEVICE const float *cb = (NK_DEVICE const float *)codebook;
    for (uint g = 0; g < w.ngroups; g++) {
        const float norm = NK_HALF_TO_FLOAT(nr[g]);
        NK_DEVICE float *v = tmp + g * w.group;
        for (uint k = 0; k < w.group; k++) v[k] = cb[nk_code(row, w.bits, g * w.group + k)] * norm;
        nm_fwht(v, w.group);
    }
}

/* ---- KV cache ---------------------------------------------------------------------------- */

NK_FN uint nk_kv_slot(NK_CONST const nk_args *a, uint p) {
    return nm_kv_slot(p, a->n_sinks, a->window);
}

NK_FN ulong nk_kv_row(NK_CONST const nk_args *a, uint slot) {
    return ((ulong)a->layer * a->slots + slot) * a->kvd;
}

/* Needle 3: the cache row of a slot of the layer whose rows start at kv_row0. */
NK_FN ulong nk_kv_row3(NK_CONST const nk_args *a, uint slot) {
    return ((ulong)a->kv_row0 + slot) * a->kvd;
}

NK_FN NK_DEVICE float *nk_kv_scales(NK_CONST const nk_args *a, NK_DEVICE uchar *scales,
                                    uint which, uint slot) {
    const uint groups = (a->kvd + NK_KV_GROUP - 1u) / NK_KV_GROUP;
    const ulong rows = (ulong)a->n_layers * a->slots;
    return NK_F(scales) + ((ulong)which * rows + (ulong)a->layer * a->slots + slot) * groups;
}

NK_FN float nk_kv_get(NK_CONST const nk_args *a, NK_DEVICE uchar *base, NK_DEVICE uchar *scales,
                      uint which, uint slot, uint c) {
    const ulong at = nk_kv_row(a, slot) + c;
    if (a->kv_type == NK_KV_F32) return ((NK_DEVICE const float *)base)[at];
    if (a->kv_type == NK_KV_F16) return NK_HALF_TO_FLOAT(((NK_DEVICE const ushort *)base)[at]);
    return (float)((NK_DEVICE const nk_i8 *)base)[at] * nk_kv_scales(a, scales, which, slot)[c / NK_KV_GROUP];
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* b0 codes, b1 norms, b2 codebook, b3 tokens (int), b4 lanes, b5 scratch. gid: token. */
NK_FN void nk_embed(NK_PARAMS) {
    NK_DEVICE float *tmp = NK_F(b5) + (ulong)gid * a->scr_ld;
    const int tok = ((NK_DEVICE const int *)b3)[gid];
    nk_dequant_raw(a->w, b0, b1, b2, (uint)tok, tmp);
    const float scale = 1.0f / NK_SQRT((float)a->w.group);
    NK_DEVICE float *X = NK_F(b4) + (ulong)gid * a->nl * a->d;
    for (uint k = 0; k < a->d; k++) X[k] = (tmp[k] * scale) * a->f0;
    for (uint r = 1; r < a->nl; r++)
        for (uint k = 0; k < a->d; k++) X[r * a->d + k] = X[k];
}

/* b0 codes, b1 norms, b2 codebook, b3 xr [ntok][ld_x], b4 y [ntok][ld_y].
 * gid: t * nrows + row. */
NK_FN void nk_matmul(NK_PARAMS) {
    const nk_cq w = a->w;
    const uint i = gid % a->nrows, t = gid / a->nrows, r = a->row0 + i;
    NK_DEVICE const uchar *row = b0 + (ulong)r * w.row_bytes;
    NK_DEVICE const ushort *nr = (NK_DEVICE const ushort *)b1 + (ulong)r * w.ngroups;
    NK_DEVICE const float *cb = (NK_DEVICE const float *)b2;
    NK_DEVICE const float *x = NK_F(b3) + (ulong)t * a->ld_x;
    float y = 0.0f;
    for (uint g = 0; g < w.ngroups; g++) {
        float acc = 0.0f;
        for (uint k = g * w.group; k < (g + 1u) * w.group; k++) acc += cb[nk_code(row, w.bits, k)] * x[k];
        y += NK_HALF_TO_FLOAT(nr[g]) * acc;
    }
    NK_F(b4)[(ulong)t * a->ld_y + i] = y;
}

/* b0 codes, b1 norms, b2 codebook (tables), b3 slots (uint [n][T]), b4 e [n][ld_y],
 * b5 scratch. gid: i * n_tables + j. */
NK_FN void nk_engram_gather(NK_PARAMS) {
    const uint i = gid / a->n_tables, j = gid % a->n_tables;
    const uint slot = ((NK_DEVICE const uint *)b3)[gid];
    NK_DEVICE float *dst = NK_F(b4) + (ulong)i * a->ld_y + j * a->sub;
    if (slot == NK_MASKED) {
        for (uint k = 0; k < a->sub; k++) dst[k] = 0.0f;
        return;
    }
    NK_DEVICE float *tmp = NK_F(b5) + (ulong)i * a->scr_ld + j * a->w.cols_pad;
    nk_dequant_raw(a->w, b0, b1, b2, j * a->n_slots + slot, tmp);
    const float scale = 1.0f / NK_SQRT((float)a->w.group);
    for (uint k = 0; k < a->sub; k++) dst[k] = tmp[k] * scale;
}

/* b0 x [n][ld_x], b1 out [n][ld_y] = rotate_w(x). gid: token. */
NK_FN void nk_rotate_rows(NK_PARAMS) {
    nk_rotate(a->w, NK_F(b0) + (ulong)gid * a->ld_x, NK_F(b1) + (ulong)gid * a->ld_y);
}

/* b0 ring [ring_n][d] (before this chunk), b1 vhat [n][d], b2 ev [n][d]; taps at wf + o_a.
 * gid: i * d + c. */
NK_FN void nk_engram_conv(NK_PARAMS) {
    const uint i = gid / a->d, c = gid % a->d, t = a->p0 + i;
    NK_DEVICE const float *taps = wf + a->o_a;
    float out = 0.0f;
    for (uint tap = 0; tap < a->taps; tap++) {
        const uint back = tap * a->dil;
        if (back > t) break;
        const uint p = t - back;
        const float src = p >= a->p0 ? NK_F(b1)[(ulong)(p - a->p0) * a->d + c]
                                     : NK_F(b0)[(ulong)(p % a->ring_n) * a->d + c];
        out += taps[tap * a->d + c] * src;
    }
    NK_F(b2)[(ulong)i * a->d + c] = out;
}

/* b0 ring, b1 vhat: ring[t % ring_n] = vhat[i] for i = first + gid / d. */
NK_FN void nk_ring_store(NK_PARAMS) {
    const uint i = a->first + gid / a->d, c = gid % a->d, t = a->p0 + i;
    NK_F(b0)[(ulong)(t % a->ring_n) * a->d + c] = NK_F(b1)[(ulong)i * a->d + c];
}

/* b0 lanes [n][nl*d], b1 nx [n][w.cols_pad] = rotate_w(rms_unit(lanes)). gid: token. */
NK_FN void nk_lane_norm(NK_PARAMS) {
    const uint nd = a->nl * a->d;
    NK_DEVICE const float *X = NK_F(b0) + (ulong)gid * nd;
    NK_DEVICE float *out = NK_F(b1) + (ulong)gid * a->w.cols_pad;
    nm_rms_unit(X, nd, out);
    nk_rotate(a->w, out, out);
}

/* b0 lanes, b1 mix [n][mix_ld], b2 ek, b3 ev (has_site), b4 u, b5 bx, b6 h (scratch),
 * b7 hr [n][w.cols_pad]; wf: o_a a_pre[layer], o_b b_pre[layer], o_c norm_in. gid: token. */
NK_FN void nk_lane_read(NK_PARAMS) {
    const uint d = a->d, nl = a->nl;
    NK_DEVICE const float *mix = NK_F(b1) + (ulong)gid * a->mix_ld;
    NK_DEVICE const float *X = NK_F(b0) + (ulong)gid * nl * d;
    NK_DEVICE float *u = NK_F(b4) + (ulong)gid * d, *bx = NK_F(b5) + (ulong)gid * d;
    for (uint k = 0; k < d; k++) u[k] = 0.0f;
    for (uint r = 0; r < nl; r++) {
        const float wr = nm_sigmoid(wf[a->o_a] * mix[r] + wf[a->o_b + r] +
                                    nm_lane_pre_offset(r, a->my_lane));
        for (uint k = 0; k < d; k++) u[k] += wr * X[r * d + k];
    }
    for (uint k = 0; k < d; k++) bx[k] = u[k];
    if (a->has_site) {
        NK_DEVICE const float *ek = NK_F(b2) + (ulong)gid * d, *ev = NK_F(b3) + (ulong)gid * d;
        const float iu = nm_rms_inv(u, d), ik = nm_rms_inv(ek, d);
        float dot = 0.0f;
        for (uint k = 0; k < d; k++) dot += (u[k] * iu) * (ek[k] * ik);
        const float alpha = nm_sigmoid(dot / NK_SQRT((float)d));
        for (uint k = 0; k < d; k++) bx[k] += alpha * ev[k];
    }
    NK_DEVICE float *h = NK_F(b6) + (ulong)gid * d;
    nm_zc_norm(bx, wf + a->o_c, d, h);
    nk_rotate(a->w, h, NK_F(b7) + (ulong)gid * a->w.cols_pad);
}

/* b0 q [n][A], b1 k [n][kvd], b2 rope [n][hd] (cos | sin); wf: o_a q_norm, o_b k_norm.
 * gid: i * (H + KV) + head; normalises and rotates one head in place. */
NK_FN void nk_qk_norm_rope(NK_PARAMS) {
    const uint heads = a->H + a->kvd / a->hd, i = gid / heads, head = gid % heads;
    const uint hd = a->hd;
    NK_DEVICE float *z = head < a->H ? NK_F(b0) + (ulong)i * a->A + head * hd
                                     : NK_F(b1) + (ulong)i * a->kvd + (head - a->H) * hd;
    nm_zc_norm(z, wf + (head < a->H ? a->o_a : a->o_b), hd, z);
    nm_rope(z, hd, NK_F(b2) + (ulong)i * hd);
}

/* b0 k cache, b1 v cache, b2 int8 scales, b3 k row, b4 v row: stores position t.
 * gid: 0 = k, 1 = v. */
NK_FN void nk_kv_store(NK_PARAMS) {
    NK_DEVICE uchar *base = gid ? b1 : b0;
    NK_DEVICE const float *x = NK_F(gid ? b4 : b3);
    const uint slot = nk_kv_slot(a, a->t);
    const ulong at = nk_kv_row(a, slot);
    const uint n = a->kvd;
    if (a->kv_type == NK_KV_F32) {
        for (uint c = 0; c < n; c++) NK_F(base)[at + c] = x[c];
    } else if (a->kv_type == NK_KV_F16) {
        for (uint c = 0; c < n; c++) ((NK_DEVICE ushort *)base)[at + c] = NK_FLOAT_TO_HALF(x[c]);
    } else {
        NK_DEVICE float *scales = nk_kv_scales(a, b2, gid, slot);
        NK_DEVICE nk_i8 *dst = (NK_DEVICE nk_i8 *)base + at;
        for (uint g = 0; g * NK_KV_GROUP < n; g++) {
            const uint c0 = g * NK_KV_GROUP;
            const uint c1 = n - c0 < NK_KV_GROUP ? n : c0 + NK_KV_GROUP;
            float amax = 0.0f;
            for (uint c = c0; c < c1; c++) amax = NK_FMAX(amax, NK_FABS(x[c]));
            const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
            scales[g] = scale;
            for (uint c = c0; c < c1; c++) dst[c] = (nk_i8)(int)NK_RINT(x[c] / scale);
        }
    }
}

/* b0 k cache, b1 v cache, b2 scales, b3 q row [A], b4 scores [H][slots], b5 o row [A].
 * Attention of the token at position t; gid: query head. */
NK_FN void nk_attend(NK_PARAMS) {
    const uint head = gid, b = head / a->reps, hd = a->hd, t = a->t;
    const float inv_scale = 1.0f / NK_SQRT((float)hd);
    const nm_span span = nm_attention_span(t, a->n_sinks, a->window);
    const uint n_sink = span.n_sink, tail0 = span.tail0;
    NK_DEVICE const float *qa = NK_F(b3) + head * hd;
    NK_DEVICE float *sc = NK_F(b4) + (ulong)head * a->slots;
    uint n_pos = 0;
    for (uint pass = 0; pass < 2u; pass++) {
        const uint p_begin = pass ? tail0 : 0u, p_end = pass ? t + 1u : n_sink;
        for (uint p = p_begin; p < p_end; p++) {
            const uint slot = nk_kv_slot(a, p);
            float dot = 0.0f;
            for (uint c = 0; c < hd; c++) dot += qa[c] * nk_kv_get(a, b0, b2, 0u, slot, b * hd + c);
            sc[n_pos++] = dot * inv_scale;
        }
    }
    const float sum = nm_softmax_exp(sc, n_pos);
    NK_DEVICE float *oa = NK_F(b5) + head * hd;
    for (uint c = 0; c < hd; c++) oa[c] = 0.0f;
    uint k = 0;
    for (uint pass = 0; pass < 2u; pass++) {
        const uint p_begin = pass ? tail0 : 0u, p_end = pass ? t + 1u : n_sink;
        for (uint p = p_begin; p < p_end; p++, k++) {
            const uint slot = nk_kv_slot(a, p);
            const float wgt = sc[k] / sum;
            for (uint c = 0; c < hd; c++) oa[c] += wgt * nk_kv_get(a, b1, b2, 1u, slot, b * hd + c);
        }
    }
}

/* b0 o [n][w.cols_pad], b1 gate [n][A]: o *= sigmoid(gate), rotated in place. gid: token. */
NK_FN void nk_gate_rotate(NK_PARAMS) {
    NK_DEVICE float *o = NK_F(b0) + (ulong)gid * a->w.cols_pad;
    NK_DEVICE const float *g = NK_F(b1) + (ulong)gid * a->A;
    for (uint c = 0; c < a->A; c++) o[c] *= nm_sigmoid(g[c]);
    nk_rotate(a->w, o, o);
}

/* b0 attn, b1 bx, b2 x, b3 h, all [n][d]; wf: o_a post_norm, o_b pre_hada; f0 attn_gate.
 * gid: token. */
NK_FN void nk_attn_residual(NK_PARAMS) {
    const uint d = a->d;
    NK_DEVICE float *at = NK_F(b0) + (ulong)gid * d, *x = NK_F(b2) + (ulong)gid * d;
    NK_DEVICE const float *bx = NK_F(b1) + (ulong)gid * d;
    const float gate = nm_sigmoid(a->f0);
    nm_zc_norm(at, wf + a->o_a, d, at);
    for (uint k = 0; k < d; k++) x[k] = bx[k] + gate * at[k];
    nm_zc_norm(x, wf + a->o_b, d, NK_F(b3) + (ulong)gid * d);
}

/* b0 h [n][d], b1 out [n][d], b2 scratch; wf: o_a d1, o_b d2, o_c d3. gid: token. */
NK_FN void nk_hadamard(NK_PARAMS) {
    const uint N = a->N, d = a->d;
    const float scale = 1.0f / NK_SQRT((float)N);
    NK_DEVICE const float *h = NK_F(b0) + (ulong)gid * d;
    NK_DEVICE float *out = NK_F(b1) + (ulong)gid * d;
    NK_DEVICE float *z = NK_F(b2) + (ulong)gid * a->scr_ld;
    NK_DEVICE const float *d1 = wf + a->o_a, *d2 = wf + a->o_b, *d3 = wf + a->o_c;
    for (uint i = 0; i < N; i++) z[i] = i < d ? d1[i] * h[i] : 0.0f;
    nm_fwht(z, N);
    for (uint i = 0; i < N; i++) {
        const float v = d2[i] * (z[i] * scale);
        z[i] = v * nm_sigmoid(v);
    }
    nm_fwht(z, N);
    for (uint i = 0; i < d; i++) out[i] = d3[i] * (z[i] * scale);
}

/* b0 mix, b1 x, b2 mlp (becomes y), b3 u, b4 lanes, b5 scratch; wf: o_a a_post[layer],
 * o_b b_post[layer], o_c a_res[layer], o_d b_res[layer]. gid: token. */
NK_FN void nk_lane_write(NK_PARAMS) {
    const uint d = a->d, nl = a->nl, nd = nl * d;
    NK_DEVICE const float *x = NK_F(b1) + (ulong)gid * d, *u = NK_F(b3) + (ulong)gid * d;
    NK_DEVICE float *y = NK_F(b2) + (ulong)gid * d;
    for (uint k = 0; k < d; k++) y[k] = x[k] + y[k] - u[k];
    NK_DEVICE const float *mix = NK_F(b0) + (ulong)gid * a->mix_ld;
    NK_DEVICE float *P = NK_F(b5) + (ulong)gid * a->scr_ld, *hpost = P + nl * nl, *old = hpost + nl;
    for (uint r = 0; r < nl; r++) {
        hpost[r] = NM_LANE_POST_GAIN * nm_sigmoid(wf[a->o_a] * mix[nl + r] + wf[a->o_b + r] +
                                                  nm_lane_post_offset(r, a->my_lane));
    }
    for (uint k = 0; k < nl * nl; k++) P[k] = wf[a->o_c] * mix[2u * nl + k] + wf[a->o_d + k];
    nm_sinkhorn(P, nl);
    NK_DEVICE float *X = NK_F(b4) + (ulong)gid * nd;
    for (uint k = 0; k < nd; k++) old[k] = X[k];
    for (uint r = 0; r < nl; r++) {
        NK_DEVICE float *dst = X + r * d;
        for (uint k = 0; k < d; k++) dst[k] = hpost[r] * y[k];
        for (uint cc = 0; cc < nl; cc++) {
            const float pw = P[r * nl + cc];
            for (uint k = 0; k < d; k++) dst[k] += pw * old[cc * d + k];
        }
    }
}

/* b0 lanes, b1 out_rot [n][w.cols_pad], b2 scratch; wf: o_a final_norm. gid: token. */
NK_FN void nk_final(NK_PARAMS) {
    const uint d = a->d, nl = a->nl;
    NK_DEVICE const float *X = NK_F(b0) + (ulong)gid * nl * d;
    NK_DEVICE float *xbar = NK_F(b2) + (ulong)gid * a->scr_ld;
    for (uint k = 0; k < d; k++) {
        float acc = 0.0f;
        for (uint r = 0; r < nl; r++) acc += X[r * d + k];
        xbar[k] = acc / (float)nl;
    }
    nm_zc_norm(xbar, wf + a->o_a, d, xbar);
    nk_rotate(a->w, xbar, NK_F(b1) + (ulong)gid * a->w.cols_pad);
}

/* b0 logits [n][vocab], b1 argmax (int [n]): the first maximal id. gid: token. */
NK_FN void nk_argmax(NK_PARAMS) {
    NK_DEVICE const float *row = NK_F(b0) + (ulong)gid * a->vocab;
    uint best = 0;
    for (uint v = 1; v < a->vocab; v++)
        if (row[v] > row[best]) best = v;
    ((NK_DEVICE int *)b1)[gid] = (int)best;
}

/* ---- Needle 3 (NEEDLE3.md §2; the CPU reference is backend/cpu/spanned_attention.c, monarch_mlp.c) ---------------- */

/* Raw projection value c of the q|k|v row of position p: this chunk's rows (b0 q [n][wq],
 * b1 k [n][wk], b2 v [n][wv]) for p >= p0, else the layer's history ring b3
 * [ring_n][wq+wk+wv] (positions before this chunk). */
NK_FN float nk_qkv_raw(NK_CONST const nk_args *a, NK_DEVICE uchar *b0, NK_DEVICE uchar *b1,
                       NK_DEVICE uchar *b2, NK_DEVICE uchar *b3, uint p, uint c) {
    if (p >= a->p0) {
        const ulong i = p - a->p0;
        if (c < a->wq) return NK_F(b0)[i * a->wq + c];
        if (c < a->wq + a->wk) return NK_F(b1)[i * a->wk + (c - a->wq)];
        return NK_F(b2)[i * a->wv + (c - a->wq - a->wk)];
    }
    return NK_F(b3)[(ulong)(p % a->ring_n) * (a->wq + a->wk + a->wv) + c];
}

/* The causal conv taps: b4 tapped [n][scr_ld] column c = sum_{j < taps, j <= t, j < lwin}
 * taps[j][c] * raw(t - j), in j order; wf: o_a q_taps, o_b k_taps, o_c v_taps.
 * gid: i * (wq + wk + wv) + c. */
NK_FN void nk_qkv_conv(NK_PARAMS) {
    const uint row = a->wq + a->wk + a->wv, i = gid / row, c = gid % row, t = a->p0 + i;
    uint w = a->wq, cc = c, off = a->o_a;
    if (c >= a->wq + a->wk) {
        w = a->wv;
        cc = c - a->wq - a->wk;
        off = a->o_c;
    } else if (c >= a->wq) {
        w = a->wk;
        cc = c - a->wq;
        off = a->o_b;
    }
    float out = 0.0f;
    for (uint j = 0; j < a->taps && j <= t && (a->lwin == 0u || j < a->lwin); j++)
        out += wf[off + j * w + cc] * nk_qkv_raw(a, b0, b1, b2, b3, t - j, c);
    NK_F(b4)[(ulong)i * a->scr_ld + c] = out;
}

/* b0..b2 raw q, k, v, b3 history ring: ring[t % ring_n] = raw row of token
 * i = first + gid / row. */
NK_FN void nk_qkv_ring_store(NK_PARAMS) {
    const uint row = a->wq + a->wk + a->wv, i = a->first + gid / row, c = gid % row;
    NK_F(b3)[(ulong)((a->p0 + i) % a->ring_n) * row + c] =
        nk_qkv_raw(a, b0, b1, b2, b3, a->p0 + i, c);
}

/* b0..b2 q, k, v := b4 tapped [n][scr_ld]. gid: i * (wq + wk + wv) + c. */
NK_FN void nk_qkv_take(NK_PARAMS) {
    const uint row = a->wq + a->wk + a->wv, i = gid / row, c = gid % row;
    const float x = NK_F(b4)[(ulong)i * a->scr_ld + c];
    if (c < a->wq) NK_F(b0)[(ulong)i * a->wq + c] = x;
    else if (c < a->wq + a->wk) NK_F(b1)[(ulong)i * a->wk + (c - a->wq)] = x;
    else NK_F(b2)[(ulong)i * a->wv + (c - a->wq - a->wk)] = x;
}

/* b0 k cache, b1 v cache (f32 rows of kvd), b3 k row [wk], b4 v row [wv]: stores position
 * t. gid: column of k, then of v. */
NK_FN void nk_kv_store3(NK_PARAMS) {
    const ulong at = nk_kv_row3(a, nk_kv_slot(a, a->t));
    if (gid < a->wk) NK_F(b0)[at + gid] = NK_F(b3)[gid];
    else NK_F(b1)[at + (gid - a->wk)] = NK_F(b4)[gid - a->wk];
}

/* b0 k cache, b1 v cache, b3 q row [wq], b4 scores [H][slots], b5 o row: attention of the
 * token at position t over its layer's span (a local layer: its last lwin positions; a
 * global one: the sinks and the session's window). gid: query head. */
NK_FN void nk_attend3(NK_PARAMS) {
    const uint head = gid, b = head / a->reps, qk = a->qk, vd = a->vd, t = a->t;
    const float inv_scale = 1.0f / NK_SQRT((float)qk);
    uint n_sink = 0u, tail0 = t + 1u > a->lwin ? t + 1u - a->lwin : 0u;
    if (a->lwin == 0u) {
        const nm_span span = nm_attention_span(t, a->n_sinks, a->window);
        n_sink = span.n_sink;
        tail0 = span.tail0;
    }
    NK_DEVICE const float *qa = NK_F(b3) + head * qk;
    NK_DEVICE float *sc = NK_F(b4) + (ulong)head * a->slots;
    uint n_pos = 0;
    for (uint pass = 0; pass < 2u; pass++) {
        const uint p_begin = pass ? tail0 : 0u, p_end = pass ? t + 1u : n_sink;
        for (uint p = p_begin; p < p_end; p++) {
            NK_DEVICE const float *kr = NK_F(b0) + nk_kv_row3(a, nk_kv_slot(a, p)) + b * qk;
            float dot = 0.0f;
            for (uint c = 0; c < qk; c++) dot += qa[c] * kr[c];
            sc[n_pos++] = dot * inv_scale;
        }
    }
    const float sum = nm_softmax_exp(sc, n_pos);
    NK_DEVICE float *oa = NK_F(b5) + head * vd;
    for (uint c = 0; c < vd; c++) oa[c] = 0.0f;
    uint k = 0;
    for (uint pass = 0; pass < 2u; pass++) {
        const uint p_begin = pass ? tail0 : 0u, p_end = pass ? t + 1u : n_sink;
        for (uint p = p_begin; p < p_end; p++, k++) {
            NK_DEVICE const float *vr = NK_F(b1) + nk_kv_row3(a, nk_kv_slot(a, p)) + b * vd;
            const float wgt = sc[k] / sum;
            for (uint c = 0; c < vd; c++) oa[c] += wgt * vr[c];
        }
    }
}

/* The Monarch MLP's tensors: offsets into wf, at a->ow[NK_MONARCH_*]. */
#define NK_MONARCH_D1 0u
#define NK_MONARCH_D2 1u
#define NK_MONARCH_D3 2u
#define NK_MONARCH_B2 3u
#define NK_MONARCH_D4 4u
#define NK_MONARCH_W1A 5u
#define NK_MONARCH_W1B 6u
#define NK_MONARCH_W2A 7u
#define NK_MONARCH_W2B 8u
#define NK_MONARCH_W3A 9u
#define NK_MONARCH_W3B 10u
#define NK_MONARCH_COND_V 11u
#define NK_MONARCH_COND_U 12u
#define NK_COND_RANK 8u /* MODEL3_COND_RANK */

/* z := vec(A^T reshape(z, ba, bb) B), A [ba][ba], B [bb][bb]; tmp [ba*bb]. The sums run
 * in the order of cpu/monarch_mlp.c's kron_apply. */
NK_FN void nk_kron(NK_DEVICE float *z, NK_DEVICE const float *A, uint ba,
                   NK_DEVICE const float *B, uint bb, NK_DEVICE float *tmp) {
    for (uint i = 0; i < ba; i++) {
        NK_DEVICE float *t = tmp + i * bb;
        for (uint l = 0; l < bb; l++) t[l] = 0.0f;
        for (uint j = 0; j < bb; j++) {
            const float zij = z[i * bb + j];
            for (uint l = 0; l < bb; l++) t[l] += zij * B[j * bb + l];
        }
    }
    for (uint k = 0; k < ba; k++) {
        NK_DEVICE float *o = z + k * bb;
        for (uint l = 0; l < bb; l++) o[l] = 0.0f;
        for (uint i = 0; i < ba; i++) {
            const float aik = A[i * ba + k];
            for (uint l = 0; l < bb; l++) o[l] += aik * tmp[i * bb + l];
        }
    }
}

/* b0 h [n][d], b1 out [n][d], b2 scratch [n][scr_ld] (3N + 8 used), b3 perms (uint [2][N]);
 * a->hd = ba, a->reps = bb (the Kronecker factor sizes). gid: token. */
NK_FN void nk_monarch(NK_PARAMS) {
    const uint N = a->N, d = a->d, ba = a->hd, bb = a->reps;
    NK_DEVICE const float *h = NK_F(b0) + (ulong)gid * d;
    NK_DEVICE float *out = NK_F(b1) + (ulong)gid * d;
    NK_DEVICE float *z = NK_F(b2) + (ulong)gid * a->scr_ld, *y = z + N, *tmp = y + N;
    NK_DEVICE float *sm = tmp + N;
    NK_DEVICE const uint *perm1 = (NK_DEVICE const uint *)b3, *perm2 = perm1 + N;
    NK_DEVICE const float *cond_v = wf + a->ow[NK_MONARCH_COND_V];
    NK_DEVICE const float *cond_u = wf + a->ow[NK_MONARCH_COND_U];
    NK_DEVICE const float *d1 = wf + a->ow[NK_MONARCH_D1], *d2 = wf + a->ow[NK_MONARCH_D2];
    NK_DEVICE const float *d3 = wf + a->ow[NK_MONARCH_D3], *d4 = wf + a->ow[NK_MONARCH_D4];
    NK_DEVICE const float *bias2 = wf + a->ow[NK_MONARCH_B2];
    for (uint r = 0; r < NK_COND_RANK; r++) sm[r] = 0.0f;
    for (uint k = 0; k < d; k++)
        for (uint r = 0; r < NK_COND_RANK; r++) sm[r] += h[k] * cond_v[k * NK_COND_RANK + r];
    const float sum = nm_softmax_exp(sm, NK_COND_RANK);
    for (uint r = 0; r < NK_COND_RANK; r++) sm[r] /= sum;

    for (uint i = 0; i < N; i++) z[i] = i < d ? d1[i] * h[i] : 0.0f;
    nk_kron(z, wf + a->ow[NK_MONARCH_W1A], ba, wf + a->ow[NK_MONARCH_W1B], bb, tmp);
    for (uint i = 0; i < N; i++) y[i] = z[perm1[i]];
    for (uint i = 0; i < N; i++) tmp[i] = 0.0f;
    for (uint r = 0; r < NK_COND_RANK; r++)
        for (uint i = 0; i < N; i++) tmp[i] += sm[r] * cond_u[r * N + i];
    for (uint i = 0; i < N; i++) {
        const float pre = d2[i] * (1.0f + tmp[i]) * y[i] + bias2[i];
        y[i] = pre * nm_sigmoid(pre);
    }
    nk_kron(y, wf + a->ow[NK_MONARCH_W2A], ba, wf + a->ow[NK_MONARCH_W2B], bb, tmp);
    for (uint i = 0; i < N; i++) z[i] = y[perm2[i]];
    for (uint i = 0; i < N; i++) z[i] *= d3[i];
    nk_kron(z, wf + a->ow[NK_MONARCH_W3A], ba, wf + a->ow[NK_MONARCH_W3B], bb, tmp);
    for (uint i = 0; i < d; i++) out[i] = d4[i] * z[i];
}

/* The kernels, in the order of their ids (metal_ops.h NK_K_*). */
#define NK_KERNEL_LIST(X)                                                                   \
    X(embed) X(matmul) X(engram_gather) X(rotate_rows) X(engram_conv) X(ring_store)         \
    X(lane_norm) X(lane_read) X(qk_norm_rope) X(kv_store) X(attend) X(gate_rotate)          \
    X(attn_residual) X(hadamard) X(lane_write) X(final) X(argmax) X(qkv_conv)              \
    X(qkv_ring_store) X(qkv_take) X(kv_store3) X(attend3) X(monarch)

#endif
