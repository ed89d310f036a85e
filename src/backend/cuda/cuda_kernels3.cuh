/* The CUDA backend's Needle 3 kernels (backend.h: attention3, monarch_mlp), following the
 * CPU reference (backend/cpu/spanned_attention.c, monarch_mlp.c) step by step. Included once, by cuda_backend.cu, after
 * cuda_kernels.cuh (its helpers, NT, block_sum); not a general header. Norms and RoPE of
 * q and k, and the gate with the rotation for out_proj, are Needle 2's kernels with the
 * Needle 3 row widths (cuda_backend.cu). The KV cache of a Needle 3 session is f32. */
#ifndef NEEDLE_CUDA_KERNELS3_CUH
#define NEEDLE_CUDA_KERNELS3_CUH

/* The conv taps of one layer over a chunk of n tokens at positions p0 + i. */
struct conv3_args {
    const float *q_taps, *k_taps, *v_taps; /* [taps][wq], [taps][wk], [taps][wv] */
    float *q, *k, *v;                      /* this chunk's raw rows [n][wq|wk|wv] */
    float *hist;                           /* this layer's ring [ring][wq + wk + wv] */
    float *tapped;                         /* [n][wq + wk + wv] */
    uint32_t wq, wk, wv, taps, lwin, ring, p0;
};

/* Raw q|k|v value c of position p: this chunk's rows for p >= p0, else the ring. */
__device__ __forceinline__ float qkv_raw(const conv3_args &a, uint32_t p, uint32_t c) {
    if (p >= a.p0) {
        const size_t i = p - a.p0;
        if (c < a.wq) return a.q[i * a.wq + c];
        if (c < a.wq + a.wk) return a.k[i * a.wk + (c - a.wq)];
        return a.v[i * a.wv + (c - a.wq - a.wk)];
    }
    return a.hist[(size_t)(p % a.ring) * (a.wq + a.wk + a.wv) + c];
}

/* grid: n tokens: tapped[i][c] = sum_{j < taps, j <= t, j < lwin} taps[j][c] raw(t - j),
 * in j order */
__global__ void k_qkv_conv(conv3_args a) {
    const uint32_t row = a.wq + a.wk + a.wv, i = blockIdx.x, t = a.p0 + i;
    for (uint32_t c = threadIdx.x; c < row; c += blockDim.x) {
        const float *taps = a.q_taps;
        uint32_t w = a.wq, cc = c;
        if (c >= a.wq + a.wk) {
            taps = a.v_taps;
            w = a.wv;
            cc = c - a.wq - a.wk;
        } else if (c >= a.wq) {
            taps = a.k_taps;
            w = a.wk;
            cc = c - a.wq;
        }
        float out = 0.0f;
        for (uint32_t j = 0; j < a.taps && j <= t && (a.lwin == 0 || j < a.lwin); j++)
            out += taps[(size_t)j * w + cc] * qkv_raw(a, t - j, c);
        a.tapped[(size_t)i * row + c] = out;
    }
}

/* grid: the last min(n, ring) tokens from `first`: ring[t % ring] = raw row of token i */
__global__ void k_qkv_ring_store(conv3_args a, uint32_t first) {
    const uint32_t row = a.wq + a.wk + a.wv, i = first + blockIdx.x, t = a.p0 + i;
    for (uint32_t c = threadIdx.x; c < row; c += blockDim.x)
        a.hist[(size_t)(t % a.ring) * row + c] = qkv_raw(a, t, c);
}

/* grid: n tokens: q, k, v := tapped */
__global__ void k_qkv_take(conv3_args a) {
    const uint32_t row = a.wq + a.wk + a.wv, i = blockIdx.x;
    for (uint32_t c = threadIdx.x; c < row; c += blockDim.x) {
        const float x = a.tapped[(size_t)i * row + c];
        if (c < a.wq) a.q[(size_t)i * a.wq + c] = x;
        else if (c < a.wq + a.wk) a.k[(size_t)i * a.wk + (c - a.wq)] = x;
        else a.v[(size_t)i * a.wv + (c - a.wq - a.wk)] = x;
    }
}

/* The f32 KV cache of a Needle 3 session and the span of one layer. */
struct kv3_args {
    float *k_cache, *v_cache; /* [layer][slot][kvd] */
    uint32_t kvd, slots, layer, n_sinks, window, lwin, qk, vd, wk, wv;
};

__device__ __forceinline__ size_t kv3_row(const kv3_args &a, uint32_t p) {
    return ((size_t)a.layer * a.slots + nm_kv_slot(p, a.n_sinks, a.window)) * a.kvd;
}

/* grid: 1: stores K (wk values) and V (wv values) of position t */
__global__ void k_kv_store3(kv3_args a, const float *k, const float *v, uint32_t t) {
    const size_t at = kv3_row(a, t);
    for (uint32_t c = threadIdx.x; c < a.wk; c += blockDim.x) a.k_cache[at + c] = k[c];
    for (uint32_t c = threadIdx.x; c < a.wv; c += blockDim.x) a.v_cache[at + c] = v[c];
}

/* Needle 3's rows for attend_head: KV group b, keys qk wide, values vd wide. */
struct kv3_head {
    kv3_args a;
    uint32_t koff, voff;
    __device__ float key_dot(uint32_t p, const float *q) const {
        const float *kr = a.k_cache + kv3_row(a, p) + koff;
        float dot = 0.0f;
        for (uint32_t c = 0; c < a.qk; c++) dot += q[c] * kr[c];
        return dot;
    }
    __device__ float value(uint32_t p, uint32_t c) const { return a.v_cache[kv3_row(a, p) + voff + c]; }
};

/* grid: H query heads; the token at position t over its layer's span (a local layer: its
 * last lwin positions; a global one: the sinks and the session's window). scores:
 * [H][slots] scratch; o: this token's row, head a at a * vd. */
__global__ void k_attend3(kv3_args a, const float *q, uint32_t t, uint32_t reps,
                          float *scores, float *o) {
    __shared__ float red[NT / 32];
    const uint32_t head = blockIdx.x, b = head / reps;
    uint32_t n_sink = 0, tail0 = t + 1 > a.lwin ? t + 1 - a.lwin : 0;
    if (a.lwin == 0) {
        const nm_span span = nm_attention_span(t, a.n_sinks, a.window);
        n_sink = span.n_sink;
        tail0 = span.tail0;
    }
    const kv3_head kv = {a, b * a.qk, b * a.vd};
    attend_head(kv, q + (size_t)head * a.qk, 1.0f / sqrtf((float)a.qk), n_sink, tail0, t, a.vd,
                scores + (size_t)head * a.slots, o + (size_t)head * a.vd, red);
}

#define COND_RANK 8u /* MODEL3_COND_RANK */

/* One layer's Monarch MLP (device pointers). */
struct monarch_args {
    const float *d1, *d2, *d3, *b2, *d4;  /* [N] */
    const float *w1a, *w2a, *w3a;         /* [ba][ba] */
    const float *w1b, *w2b, *w3b;         /* [bb][bb] */
    const float *cond_v, *cond_u;         /* [d][8], [8][N] */
    const uint32_t *perm1, *perm2;        /* [N] */
    uint32_t d, N, ba, bb;
};

/* z := vec(A^T reshape(z, ba, bb) B) in shared memory; tmp [ba*bb] shared. Each output
 * sums its terms in the order of cpu/monarch_mlp.c's kron_apply. z must be complete (a barrier
 * since it was written); ends with a barrier. */
__device__ void kron_shared(float *z, const float *A, uint32_t ba, const float *B, uint32_t bb,
                            float *tmp) {
    const uint32_t n = ba * bb;
    for (uint32_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
        const uint32_t i = idx / bb, l = idx % bb;
        float acc = 0.0f;
        for (uint32_t j = 0; j < bb; j++) acc += z[i * bb + j] * B[(size_t)j * bb + l];
        tmp[idx] = acc;
    }
    __syncthreads();
    for (uint32_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
        const uint32_t k = idx / bb, l = idx % bb;
        float acc = 0.0f;
        for (uint32_t i = 0; i < ba; i++) acc += A[(size_t)i * ba + k] * tmp[i * bb + l];
        z[idx] = acc;
    }
    __syncthreads();
}

/* grid: n tokens; z, y, tmp ([N] each) and the conditioning weights in shared memory */
__global__ void k_monarch(monarch_args a, const float *h_all, float *out_all) {
    extern __shared__ float sh[]; /* [3N + COND_RANK] */
    __shared__ float red[NT / 32];
    const uint32_t N = a.N, d = a.d;
    float *z = sh, *y = z + N, *tmp = y + N, *sm = tmp + N;
    const float *h = h_all + (size_t)blockIdx.x * d;
    float *out = out_all + (size_t)blockIdx.x * d;
    for (uint32_t r = 0; r < COND_RANK; r++) {
        float part = 0.0f;
        for (uint32_t k = threadIdx.x; k < d; k += blockDim.x)
            part += h[k] * a.cond_v[(size_t)k * COND_RANK + r];
        part = block_sum(part, red);
        if (threadIdx.x == 0) sm[r] = part;
    }
    for (uint32_t i = threadIdx.x; i < N; i += blockDim.x) z[i] = i < d ? a.d1[i] * h[i] : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        const float sum = nm_softmax_exp(sm, COND_RANK);
        for (uint32_t r = 0; r < COND_RANK; r++) sm[r] /= sum;
    }
    kron_shared(z, a.w1a, a.ba, a.w1b, a.bb, tmp); /* its barriers also publish sm */
    for (uint32_t i = threadIdx.x; i < N; i += blockDim.x) {
        float c = 0.0f;
        for (uint32_t r = 0; r < COND_RANK; r++) c += sm[r] * a.cond_u[(size_t)r * N + i];
        const float pre = a.d2[i] * (1.0f + c) * z[a.perm1[i]] + a.b2[i];
        y[i] = pre * nm_sigmoid(pre);
    }
    __syncthreads();
    kron_shared(y, a.w2a, a.ba, a.w2b, a.bb, tmp);
    for (uint32_t i = threadIdx.x; i < N; i += blockDim.x) z[i] = y[a.perm2[i]] * a.d3[i];
    __syncthreads();
    kron_shared(z, a.w3a, a.ba, a.w3b, a.bb, tmp);
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) out[i] = a.d4[i] * z[i];
}

#endif
