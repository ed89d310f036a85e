/* The CUDA backend's device code: helpers and one __global__ kernel per step of the
 * forward pass (see cuda_backend.cu for the host side, the launch shapes and the memory
 * model). Included once, by cuda_backend.cu; not a general header. Blocks have NT threads;
 * the reductions need every thread of the block, so no kernel returns early before one. */
#ifndef NEEDLE_CUDA_KERNELS_CUH
#define NEEDLE_CUDA_KERNELS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/nmath.h"

#define NT 256u     /* threads per block */
#define MM_TOK 8u   /* tokens per matmul block row */
#define MAX_LANES 64u
static_assert(KV_SCALE_GROUP == 32, "k_kv_store gives one warp to each int8 scale group");

/* A CQ matrix with device pointers, passed to kernels by value. */
struct dcq {
    const uint8_t *codes;
    const uint16_t *norms;
    const float *codebook;
    uint32_t rows, cols, cols_pad, group, ngroups, bits, row_bytes;
};

/* ---- device helpers ------------------------------------------------------------------------ */

__device__ __forceinline__ float h2f(uint16_t u) { return __half2float(__ushort_as_half(u)); }

/* Code k of a packed row (LSB-first streams, spec §1.7). */
__device__ __forceinline__ uint32_t cq_code(const uint8_t *row, uint32_t bits, uint32_t k) {
    if (bits == 1) return (row[k >> 3] >> (k & 7u)) & 1u; /* Needle 3 binary */
    if (bits == 4) return (row[k >> 1] >> ((k & 1u) * 4u)) & 15u;
    if (bits == 3) {
        const uint8_t *p = row + (k >> 3) * 3u;
        uint32_t word = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16);
        return (word >> (3u * (k & 7u))) & 7u;
    }
    return (row[k >> 2] >> ((k & 3u) * 2u)) & 3u; /* 2 bits and ternary crumbs */
}

/* Sum over the block (blockDim.x == NT); `red` is NT/32 floats of shared memory. */
__device__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads(); /* the previous call's readers are done with red */
    if ((threadIdx.x & 31u) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < NT / 32 ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) red[0] = t;
    }
    __syncthreads();
    return red[0];
}

__device__ float block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31u) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < NT / 32 ? red[threadIdx.x] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_down_sync(0xffffffffu, t, o));
        if (threadIdx.x == 0) red[0] = t;
    }
    __syncthreads();
    return red[0];
}

/* Unnormalised Walsh-Hadamard transform of every aligned group of `group` values in
 * buf[0:len] (shared memory; group a power of two dividing len). */
__device__ void fwht_groups(float *buf, uint32_t len, uint32_t group) {
    __syncthreads();
    for (uint32_t h = 1; h < group; h <<= 1) {
        for (uint32_t i = threadIdx.x; i < len / 2; i += blockDim.x) {
            uint32_t j = (i / h) * 2 * h + i % h;
            float a = buf[j], b = buf[j + h];
            buf[j] = a + b;
            buf[j + h] = a - b;
        }
        __syncthreads();
    }
}

/* buf[0:cols] holds x: zero-pads to cols_pad, rotates per group (cq_rotate) and writes
 * the result to out[0:cols_pad]. */
__device__ void rotate_out(float *buf, const dcq &w, float *out) {
    for (uint32_t k = w.cols + threadIdx.x; k < w.cols_pad; k += blockDim.x) buf[k] = 0.0f;
    fwht_groups(buf, w.cols_pad, w.group);
    const float scale = 1.0f / sqrtf((float)w.group);
    for (uint32_t k = threadIdx.x; k < w.cols_pad; k += blockDim.x) out[k] = buf[k] * scale;
    __syncthreads();
}

/* Dequantizes row r into buf[0:cols_pad] (shared; only [0:cols] meaningful), unscaled
 * by 1/sqrt(G): the caller multiplies (cq_dequant_row). */
__device__ void dequant_row_shared(const dcq &w, uint32_t r, float *buf) {
    const uint8_t *row = w.codes + (size_t)r * w.row_bytes;
    const uint16_t *norms = w.norms + (size_t)r * w.ngroups;
    for (uint32_t k = threadIdx.x; k < w.cols_pad; k += blockDim.x)
        buf[k] = w.codebook[cq_code(row, w.bits, k)] * h2f(norms[k / w.group]);
    fwht_groups(buf, w.cols_pad, w.group);
}

/* ZC(x; s) of n values in shared buf, in place; red: reduction scratch. */
__device__ void zc_shared(float *buf, const float *scale, uint32_t n, float *red) {
    float ss = 0.0f;
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) ss += buf[k] * buf[k];
    ss = block_sum(ss, red);
    const float rms = sqrtf(ss / (float)n + NM_NORM_EPS);
    for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) buf[k] = (1.0f + scale[k]) * buf[k] / rms;
    __syncthreads();
}

/* ---- kernels ------------------------------------------------------------------------------- */

__global__ void k_matmul(dcq w, uint32_t row0, uint32_t nrows, const float *xr, size_t ld_x,
                         uint32_t ntok, float *y, size_t ld_y) {
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31u;
    if (warp >= nrows) return; /* whole warps leave together */
    const uint32_t r = row0 + warp, t0 = blockIdx.y * MM_TOK, G = w.group;
    const uint8_t *row = w.codes + (size_t)r * w.row_bytes;
    const uint16_t *norms = w.norms + (size_t)r * w.ngroups;
    float acc[MM_TOK];
#pragma unroll
    for (uint32_t j = 0; j < MM_TOK; j++) acc[j] = 0.0f;
    for (uint32_t g = 0; g < w.ngroups; g++) {
        float part[MM_TOK];
#pragma unroll
        for (uint32_t j = 0; j < MM_TOK; j++) part[j] = 0.0f;
        for (uint32_t k = g * G + lane; k < (g + 1) * G; k += 32) {
            const float lv = w.codebook[cq_code(row, w.bits, k)];
#pragma unroll
            for (uint32_t j = 0; j < MM_TOK; j++)
                if (t0 + j < ntok) part[j] += lv * xr[(size_t)(t0 + j) * ld_x + k];
        }
        const float nrm = h2f(norms[g]);
#pragma unroll
        for (uint32_t j = 0; j < MM_TOK; j++) acc[j] += nrm * part[j];
    }
#pragma unroll
    for (uint32_t j = 0; j < MM_TOK; j++) {
        float v = acc[j];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0 && t0 + j < ntok) y[(size_t)(t0 + j) * ld_y + warp] = v;
    }
}

/* grid: n tokens */
__global__ void k_embed(dcq emb, const int32_t *tokens, uint32_t d, uint32_t nl, float *lanes) {
    extern __shared__ float sh[];
    dequant_row_shared(emb, (uint32_t)tokens[blockIdx.x], sh);
    const float scale = 1.0f / sqrtf((float)emb.group), emb_scale = sqrtf((float)d);
    float *X = lanes + (size_t)blockIdx.x * nl * d;
    for (uint32_t k = threadIdx.x; k < d; k += blockDim.x) {
        const float v = (sh[k] * scale) * emb_scale;
        for (uint32_t r = 0; r < nl; r++) X[(size_t)r * d + k] = v;
    }
}

/* grid: (n tokens, T tables): e[i][j*sub : (j+1)*sub] = table row or zeros */
__global__ void k_engram_gather(dcq tables, const uint32_t *slots, uint32_t n_tables,
                                uint32_t n_slots, uint32_t sub, float *e, uint32_t e_ld) {
    extern __shared__ float sh[];
    const uint32_t i = blockIdx.x, j = blockIdx.y, slot = slots[(size_t)i * n_tables + j];
    float *dst = e + (size_t)i * e_ld + (size_t)j * sub;
    if (slot == ENGRAM_MASKED) {
        for (uint32_t k = threadIdx.x; k < sub; k += blockDim.x) dst[k] = 0.0f;
        return;
    }
    dequant_row_shared(tables, j * n_slots + slot, sh);
    const float scale = 1.0f / sqrtf((float)tables.group);
    for (uint32_t k = threadIdx.x; k < sub; k += blockDim.x) dst[k] = sh[k] * scale;
}

/* grid: n tokens: out[i] = rotate_w(x[i][0:w.cols]) */
__global__ void k_rotate(dcq w, const float *x, size_t ld_in, float *out, size_t ld_out) {
    extern __shared__ float sh[];
    const float *src = x + (size_t)blockIdx.x * ld_in;
    for (uint32_t k = threadIdx.x; k < w.cols; k += blockDim.x) sh[k] = src[k];
    rotate_out(sh, w, out + (size_t)blockIdx.x * ld_out);
}

/* grid: n tokens; reads the ring as it was before this chunk (positions < p0) */
__global__ void k_engram_conv(const float *taps, uint32_t n_taps, uint32_t dil, const float *ring,
                              uint32_t ring_n, const float *vhat, uint32_t p0, uint32_t d,
                              float *ev) {
    const uint32_t i = blockIdx.x, t = p0 + i;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) {
        float out = 0.0f;
        for (uint32_t tap = 0; tap < n_taps; tap++) {
            const uint32_t back = tap * dil;
            if (back > t) break;
            const uint32_t p = t - back;
            const float src = p >= p0 ? vhat[(size_t)(p - p0) * d + c]
                                      : ring[(size_t)(p % ring_n) * d + c];
            out += taps[(size_t)tap * d + c] * src;
        }
        ev[(size_t)i * d + c] = out;
    }
}

/* grid: the last min(n, ring) tokens of the chunk: ring[t % ring] = vhat[i] */
__global__ void k_ring_store(float *ring, uint32_t ring_n, const float *vhat, uint32_t p0,
                             uint32_t first, uint32_t d) {
    const uint32_t i = first + blockIdx.x, t = p0 + i;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x)
        ring[(size_t)(t % ring_n) * d + c] = vhat[(size_t)i * d + c];
}

/* grid: n tokens: nx = rotate_phi(rms_unit(lanes)) */
__global__ void k_lane_norm(dcq phi, const float *lanes, uint32_t nd, float *nx) {
    extern __shared__ float sh[];
    __shared__ float red[NT / 32];
    const float *X = lanes + (size_t)blockIdx.x * nd;
    float ss = 0.0f;
    for (uint32_t k = threadIdx.x; k < nd; k += blockDim.x) {
        sh[k] = X[k];
        ss += X[k] * X[k];
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)nd + NM_NORM_EPS);
    for (uint32_t k = threadIdx.x; k < nd; k += blockDim.x) sh[k] *= inv;
    __syncthreads();
    rotate_out(sh, phi, nx + (size_t)blockIdx.x * phi.cols_pad);
}

struct lane_read_args {
    const float *a_pre, *b_pre, *norm_in; /* a_pre: this layer's scalar, b_pre: [n] */
    uint32_t d, nl, my_lane, mix_ld;
    int has_site;
};

/* grid: n tokens */
__global__ void k_lane_read(lane_read_args a, dcq wq, const float *lanes, const float *mix_all,
                            const float *ek_all, const float *ev_all, float *u_all,
                            float *bx_all, float *hr) {
    extern __shared__ float sh[]; /* [wq.cols_pad] */
    __shared__ float red[NT / 32];
    __shared__ float w[MAX_LANES];
    const uint32_t i = blockIdx.x, d = a.d;
    const float *mix = mix_all + (size_t)i * a.mix_ld, *X = lanes + (size_t)i * a.nl * d;
    if (threadIdx.x < a.nl) {
        const uint32_t r = threadIdx.x;
        w[r] = nm_sigmoid(a.a_pre[0] * mix[r] + a.b_pre[r] + nm_lane_pre_offset(r, a.my_lane));
    }
    __syncthreads();
    float *u = u_all + (size_t)i * d, *bx = bx_all + (size_t)i * d;
    float su = 0.0f;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t r = 0; r < a.nl; r++) acc += w[r] * X[(size_t)r * d + c];
        u[c] = acc;
        sh[c] = acc;
        su += acc * acc;
    }
    if (a.has_site) {
        const float *ek = ek_all + (size_t)i * d, *ev = ev_all + (size_t)i * d;
        float sk = 0.0f;
        for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) sk += ek[c] * ek[c];
        su = block_sum(su, red);
        sk = block_sum(sk, red);
        const float iu = 1.0f / sqrtf(su / (float)d + NM_NORM_EPS);
        const float ik = 1.0f / sqrtf(sk / (float)d + NM_NORM_EPS);
        float dot = 0.0f;
        for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) dot += (sh[c] * iu) * (ek[c] * ik);
        dot = block_sum(dot, red);
        const float alpha = nm_sigmoid(dot / sqrtf((float)d));
        for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) sh[c] += alpha * ev[c];
    }
    __syncthreads();
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) bx[c] = sh[c];
    zc_shared(sh, a.norm_in, d, red);
    rotate_out(sh, wq, hr + (size_t)i * wq.cols_pad);
}

/* grid: (n tokens, H + KV heads): ZC norm and RoPE of each head, in place */
__global__ void k_qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm,
                               const float *rope, uint32_t H, uint32_t hd, uint32_t A,
                               uint32_t kvd) {
    extern __shared__ float sh[]; /* [hd] */
    __shared__ float red[NT / 32];
    const uint32_t i = blockIdx.x, head = blockIdx.y;
    float *z = head < H ? q + (size_t)i * A + (size_t)head * hd
                        : k + (size_t)i * kvd + (size_t)(head - H) * hd;
    const float *scale = head < H ? q_norm : k_norm;
    for (uint32_t c = threadIdx.x; c < hd; c += blockDim.x) sh[c] = z[c];
    zc_shared(sh, scale, hd, red);
    const uint32_t half = hd / 2;
    const float *cs = rope + (size_t)i * hd;
    for (uint32_t j = threadIdx.x; j < half; j += blockDim.x) {
        const nm_pair r = nm_rope_pair(sh[j], sh[j + half], cs[j], cs[half + j]);
        z[j] = r.a;
        z[j + half] = r.b;
    }
}

struct kv_args {
    void *k_cache, *v_cache;
    float *scales;          /* int8: [2][layer][slot][groups] */
    uint32_t kv_type, kvd, slots, layer, n_layers, n_sinks, window;
};

__device__ __forceinline__ uint32_t kv_slot_d(const kv_args &a, uint32_t p) {
    return nm_kv_slot(p, a.n_sinks, a.window);
}

__device__ __forceinline__ float kv_get(const kv_args &a, int which, uint32_t slot, uint32_t c) {
    const size_t at = ((size_t)a.layer * a.slots + slot) * a.kvd + c;
    const void *base = which ? a.v_cache : a.k_cache;
    if (a.kv_type == NEEDLE_KV_F32) return ((const float *)base)[at];
    if (a.kv_type == NEEDLE_KV_F16) return h2f(((const uint16_t *)base)[at]);
    const uint32_t groups = (a.kvd + KV_SCALE_GROUP - 1) / KV_SCALE_GROUP;
    const size_t rows = (size_t)a.n_layers * a.slots;
    const float *sc = a.scales + ((size_t)which * rows + (size_t)a.layer * a.slots + slot) * groups;
    return (float)((const int8_t *)base)[at] * sc[c / KV_SCALE_GROUP];
}

/* grid: 2 (k, v): stores row x of position t; one warp per int8 scale group */
__global__ void k_kv_store(kv_args a, const float *k, const float *v, uint32_t t) {
    const int which = blockIdx.x;
    const float *x = which ? v : k;
    const uint32_t slot = kv_slot_d(a, t);
    const size_t at = ((size_t)a.layer * a.slots + slot) * a.kvd;
    void *base = which ? a.v_cache : a.k_cache;
    if (a.kv_type == NEEDLE_KV_F32) {
        for (uint32_t c = threadIdx.x; c < a.kvd; c += blockDim.x) ((float *)base)[at + c] = x[c];
    } else if (a.kv_type == NEEDLE_KV_F16) {
        for (uint32_t c = threadIdx.x; c < a.kvd; c += blockDim.x)
            ((uint16_t *)base)[at + c] = __half_as_ushort(__float2half_rn(x[c]));
    } else {
        const uint32_t groups = (a.kvd + KV_SCALE_GROUP - 1) / KV_SCALE_GROUP;
        const size_t rows = (size_t)a.n_layers * a.slots;
        float *sc = a.scales + ((size_t)which * rows + (size_t)a.layer * a.slots + slot) * groups;
        const uint32_t lane = threadIdx.x & 31u;
        for (uint32_t g = threadIdx.x >> 5; g < groups; g += blockDim.x >> 5) {
            const uint32_t c = g * KV_SCALE_GROUP + lane; /* KV_SCALE_GROUP == 32 */
            const float xv = c < a.kvd ? x[c] : 0.0f;
            float amax = fabsf(xv);
            for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
            if (lane == 0) sc[g] = scale;
            if (c < a.kvd) ((int8_t *)base)[at + c] = (int8_t)__float2int_rn(xv / scale);
        }
    }
}

/* One query head's attention over positions [0, n_sink) and [tail0, t] (softmax of the
 * scaled dot products, then the weighted sum of the values), the same for both
 * generations: KV says how a position's key and value rows are read (Needle 2: the
 * f32/f16/int8 cache of kv_args, Needle 3: the f32 cache of kv3_args with qk != v widths).
 * KV provides key_dot(p, q) (q . key row of position p, in column order) and
 * value(p, c). sc: this head's score row (n_pos floats), o: this head's output row. */
template <class KV>
__device__ void attend_head(const KV &kv, const float *q, float inv_scale, uint32_t n_sink, uint32_t tail0,
                            uint32_t t, uint32_t vd, float *sc, float *o, float *red) {
    const uint32_t n_pos = n_sink + (tail0 <= t ? t + 1 - tail0 : 0);
    float mx = -INFINITY;
    for (uint32_t j = threadIdx.x; j < n_pos; j += blockDim.x) {
        const uint32_t p = j < n_sink ? j : tail0 + (j - n_sink);
        const float dot = kv.key_dot(p, q) * inv_scale;
        sc[j] = dot;
        mx = fmaxf(mx, dot);
    }
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (uint32_t j = threadIdx.x; j < n_pos; j += blockDim.x) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red); /* also orders the writes to sc before the reads below */
    for (uint32_t c = threadIdx.x; c < vd; c += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t j = 0; j < n_pos; j++) {
            const uint32_t p = j < n_sink ? j : tail0 + (j - n_sink);
            acc += (sc[j] / sum) * kv.value(p, c);
        }
        o[c] = acc;
    }
}

/* Needle 2's rows for attend_head: KV group b of the session cache, hd wide. */
struct kv2_head {
    kv_args a;
    uint32_t off, hd;
    __device__ float key_dot(uint32_t p, const float *q) const {
        const uint32_t slot = kv_slot_d(a, p);
        float dot = 0.0f;
        for (uint32_t c = 0; c < hd; c++) dot += q[c] * kv_get(a, 0, slot, off + c);
        return dot;
    }
    __device__ float value(uint32_t p, uint32_t c) const { return kv_get(a, 1, kv_slot_d(a, p), off + c); }
};

/* grid: H query heads; token at position t. scores: [H][slots] scratch. */
__global__ void k_attend(kv_args a, const float *q, uint32_t t, uint32_t hd, uint32_t reps,
                         float *scores, float *o) {
    __shared__ float red[NT / 32];
    const uint32_t head = blockIdx.x;
    const nm_span span = nm_attention_span(t, a.n_sinks, a.window);
    const kv2_head kv = {a, (head / reps) * hd, hd};
    attend_head(kv, q + (size_t)head * hd, 1.0f / sqrtf((float)hd), span.n_sink, span.tail0, t, hd,
                scores + (size_t)head * a.slots, o + (size_t)head * hd, red);
}

/* grid: n tokens: o *= sigmoid(gate), then rotated for out_proj */
__global__ void k_gate_rotate(dcq wo, float *o, const float *gate, uint32_t A) {
    extern __shared__ float sh[];
    const uint32_t i = blockIdx.x;
    float *oi = o + (size_t)i * wo.cols_pad;
    const float *g = gate + (size_t)i * A;
    for (uint32_t c = threadIdx.x; c < A; c += blockDim.x) sh[c] = oi[c] * nm_sigmoid(g[c]);
    rotate_out(sh, wo, oi);
}

/* grid: n tokens */
__global__ void k_attn_residual(float *attn, const float *bx, float *x, float *h,
                                const float *post_norm, const float *pre_hada, float attn_gate,
                                uint32_t d) {
    extern __shared__ float sh[]; /* [d] */
    __shared__ float red[NT / 32];
    const size_t off = (size_t)blockIdx.x * d;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) sh[c] = attn[off + c];
    zc_shared(sh, post_norm, d, red);
    const float gate = nm_sigmoid(attn_gate);
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) {
        attn[off + c] = sh[c];
        const float xv = bx[off + c] + gate * sh[c];
        x[off + c] = xv;
        sh[c] = xv;
    }
    __syncthreads();
    zc_shared(sh, pre_hada, d, red);
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) h[off + c] = sh[c];
}

/* grid: n tokens; the Hadamard MLP with the transform in shared memory */
__global__ void k_hadamard(const float *h, float *out, const float *d1, const float *d2,
                           const float *d3, uint32_t d, uint32_t N) {
    extern __shared__ float z[]; /* [N] */
    const size_t off = (size_t)blockIdx.x * d;
    const float scale = 1.0f / sqrtf((float)N);
    for (uint32_t k = threadIdx.x; k < N; k += blockDim.x) z[k] = k < d ? d1[k] * h[off + k] : 0.0f;
    fwht_groups(z, N, N);
    for (uint32_t k = threadIdx.x; k < N; k += blockDim.x) {
        const float a = d2[k] * (z[k] * scale);
        z[k] = a * nm_sigmoid(a);
    }
    fwht_groups(z, N, N);
    for (uint32_t k = threadIdx.x; k < d; k += blockDim.x) out[off + k] = d3[k] * (z[k] * scale);
}

struct lane_write_args {
    const float *a_post, *b_post, *a_res, *b_res; /* this layer's */
    uint32_t d, nl, my_lane, mix_ld;
};

/* grid: n tokens: y, hpost, Sinkhorn, lane mix */
__global__ void k_lane_write(lane_write_args a, const float *mix_all, const float *x_all,
                             float *mlp, const float *u_all, float *lanes) {
    __shared__ float hpost[MAX_LANES];
    __shared__ float P[MAX_LANES * MAX_LANES];
    const uint32_t i = blockIdx.x, d = a.d, nl = a.nl;
    const float *mix = mix_all + (size_t)i * a.mix_ld;
    if (threadIdx.x == 0) {
        for (uint32_t r = 0; r < nl; r++) {
            hpost[r] = NM_LANE_POST_GAIN *
                       nm_sigmoid(a.a_post[0] * mix[nl + r] + a.b_post[r] +
                                  nm_lane_post_offset(r, a.my_lane));
        }
        for (uint32_t k = 0; k < nl * nl; k++) P[k] = a.a_res[0] * mix[2 * nl + k] + a.b_res[k];
        nm_sinkhorn(P, nl); /* one thread: n <= MAX_LANES */
    }
    __syncthreads();
    const size_t off = (size_t)i * d;
    float *X = lanes + (size_t)i * nl * d;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) {
        const float y = x_all[off + c] + mlp[off + c] - u_all[off + c];
        mlp[off + c] = y;
        float old[MAX_LANES];
        for (uint32_t r = 0; r < nl; r++) old[r] = X[(size_t)r * d + c];
        for (uint32_t r = 0; r < nl; r++) {
            float v = hpost[r] * y;
            for (uint32_t cc = 0; cc < nl; cc++) v += P[r * nl + cc] * old[cc];
            X[(size_t)r * d + c] = v;
        }
    }
}

/* grid: count tokens: ZC(mean of lanes; final_norm), rotated for the embedding */
__global__ void k_final(dcq emb, const float *lanes, const float *final_norm, uint32_t d,
                        uint32_t nl, float *out_rot) {
    extern __shared__ float sh[];
    __shared__ float red[NT / 32];
    const float *X = lanes + (size_t)blockIdx.x * nl * d;
    for (uint32_t c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t r = 0; r < nl; r++) acc += X[(size_t)r * d + c];
        sh[c] = acc / (float)nl;
    }
    __syncthreads();
    zc_shared(sh, final_norm, d, red);
    rotate_out(sh, emb, out_rot + (size_t)blockIdx.x * emb.cols_pad);
}

/* grid: count tokens: the first maximal logit */
__global__ void k_argmax(const float *logits, uint32_t vocab, int32_t *out) {
    __shared__ float bv[NT];
    __shared__ int32_t bi[NT];
    const float *row = logits + (size_t)blockIdx.x * vocab;
    float best = -INFINITY;
    int32_t idx = -1;
    for (uint32_t v = threadIdx.x; v < vocab; v += blockDim.x)
        if (idx < 0 || row[v] > best) { best = row[v]; idx = (int32_t)v; }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = idx;
    __syncthreads();
    for (uint32_t s = NT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = bv[threadIdx.x + s];
            const int32_t oi = bi[threadIdx.x + s];
            if (oi >= 0 && (bi[threadIdx.x] < 0 || ov > bv[threadIdx.x] ||
                            (ov == bv[threadIdx.x] && oi < bi[threadIdx.x]))) {
                bv[threadIdx.x] = ov;
                bi[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = bi[0] < 0 ? 0 : bi[0];
}

#endif
