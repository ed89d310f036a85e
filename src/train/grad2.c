/* The Needle 2 forward and backward over full sequences (see grad2.h). Each step names
 * the line of cactus-needle 2.0.15 architecture.py it mirrors; the backward of a step
 * follows its forward in the same block of code. Plain C, sequence by sequence. The
 * structure (work sharing, lanes, engram, head, loss) follows grad3.c, the Needle 3 core;
 * the block differs: no conv taps, one head width, no sliding window, no q/K/V int8, and
 * the Hadamard MLP (two dense Walsh products) in place of the Monarch MLP. */
#ifdef G2_REAL
#define G2_GENERIC_PRODUCTS /* another precision (the double copy of the op tests): plain loops */
#endif
#include "train/grad2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/nmath.h"
#include "train/tgemm.h"
#include "util/error.h"

typedef G2_REAL real;

#define EPS 1e-6
#define ENGRAM_TAPS 4 /* architecture.ENGRAM_CONV_TAPS */
#define SINKHORN_ITERS 20

/* The tensors the network reads, in one table; the per-layer ones are stacked [L, ...]. */
enum {
    P_EMB,
    P_FINAL,
    P_PHI_PRE,
    P_PHI_POST,
    P_PHI_RES,
    P_B_PRE,
    P_B_POST,
    P_B_RES,
    P_A_PRE,
    P_A_POST,
    P_A_RES,
    P_NORM_IN,
    P_WQ,
    P_WK,
    P_WV,
    P_WG,
    P_WO,
    P_QN,
    P_KN,
    P_POST_NORM,
    P_GATE,
    P_PRE_HADA,
    P_D1,
    P_D2,
    P_D3,
    P_FIXED /* engram tensors follow: 4 per site */
};
enum { E_TABLE, E_KEY, E_VALUE, E_TAPS, E_COUNT };

struct G2(model) {
    export_config c;
    uint32_t D, n, L, H, KV, hd, V, N, tables, sub, dil;
    real *walsh; /* _walsh_matrix(N) [N][N], symmetric */
    G2(tensor) *t;
    uint32_t nt;
    cpu_pool *pool; /* NULL: one thread */
    int a8; /* quant=True: A8 activations, straight-through */
    const tg_level *lv; /* the SIMD level of the products (tgemm.h) */
    struct g2_scratch *scr;
    struct run_ws *ws; /* the loss's work space, kept for the next call of the same T */
    uint32_t ws_T;
};

/* Transposed operands of the products, grown as needed and kept across calls and steps
 * (no allocation per product). */
struct g2_scratch {
    float *wt, *xt;
    size_t wt_cap, xt_cap;
};

#ifndef G2_GENERIC_PRODUCTS
static float *scratch_grow(float **p, size_t *cap, size_t n) {
    if (n > *cap) {
        float *q = realloc(*p, n * sizeof *q);
        if (!q) return NULL;
        *p = q, *cap = n;
    }
    return *p;
}
#endif

void G2(set_fake_quant)(G2(model) * m, int on) { m->a8 = on != 0; }

void G2(run_parallel)(const G2(model) * m, void (*fn)(void *arg, int i, int n), void *arg) {
    if (m->pool)
        cpu_pool_run(m->pool, fn, arg);
    else
        fn(arg, 0, 1);
}

int G2(set_threads)(G2(model) * m, int n) {
    cpu_pool_free(m->pool);
    m->pool = NULL;
    m->lv = tg_level_best();
    return n == 1 ? 0 : cpu_pool_create(n, cpu_kernels_best(), 0, &m->pool);
}

/* fq8, the portable products (mm_job, mm_worker) and the ZC norm, shared with the other
 * generation's core */
#ifdef G2_REAL_FLOAT
#define TRAIN_REAL_FLOAT 1
#endif
#include "train/dense_ref.h"

#define LW(m, id, l) ((m)->t[id].w + (size_t)(l) * ((m)->t[id].numel / (m)->L))
#define LG(m, id, l) ((m)->t[id].g + (size_t)(l) * ((m)->t[id].numel / (m)->L))
#define ET(m, s, k) (&(m)->t[P_FIXED + (s) * E_COUNT + (k)])
/* the gradient a dense product accumulates into, NULL for a frozen weight */
#define DW(t) ((t)->frozen ? NULL : (t)->g)
#define LGD(m, id, l) ((m)->t[id].frozen ? NULL : LG(m, id, l))

/* ---- small dense helpers ------------------------------------------------------------ */

#ifndef G2_GENERIC_PRODUCTS
typedef struct tg_job {
    const tg_level *lv;
    tg_gemm g;
} tg_job;

static void tg_worker(void *arg, int i, int n) {
    const tg_job *j = arg;
    tg_share(j->lv, &j->g, i, n);
}

static void run_tg(const G2(model) * m, const tg_gemm *g) {
    tg_job j = {m->lv, *g};
    if (m->pool)
        cpu_pool_run(m->pool, tg_worker, &j);
    else
        tg_worker(&j, 0, 1);
}

/* C[M][N] (+)= A[M][K] B[K][N] with row strides, on the pool */
static void gemm(const G2(model) * m, const float *A, size_t lda, const float *B, size_t ldb, float *C, size_t ldc,
                 uint32_t M, uint32_t N, uint32_t K, int acc) {
    const tg_gemm g = {A, B, C, lda, ldb, ldc, M, N, K, acc};
    run_tg(m, &g);
}
#endif

static void run_job(const G2(model) * m, mm_job *j) {
    if (m && m->pool)
        cpu_pool_run(m->pool, mm_worker, j);
    else
        mm_worker(j, 0, 1);
}

/* y[T][out] = x[T][in] @ W[in][out] */
static void mm(const G2(model) * m, const real *x, const real *W, real *y, uint32_t T, uint32_t in, uint32_t out) {
#ifdef G2_GENERIC_PRODUCTS
    mm_job j = {x, W, NULL, y, NULL, NULL, T, in, out, 0};
    run_job(m, &j);
#else
    const tg_gemm g = {x, W, y, in, out, out, T, out, in, 0};
    run_tg(m, &g);
#endif
}

/* dx += dy @ W^T (dx may be NULL), dW += x^T @ dy (dW NULL: a frozen weight) */
static void mm_back(const G2(model) * m, const real *x, const real *W, const real *dy, real *dx, real *dW,
                    uint32_t T, uint32_t in, uint32_t out) {
#ifdef G2_GENERIC_PRODUCTS
    mm_job j = {x, W, dy, NULL, dx, dW, T, in, out, 1};
    run_job(m, &j);
#else
    struct g2_scratch *s = m->scr;
    float *wt = dx ? scratch_grow(&s->wt, &s->wt_cap, (size_t)in * out) : NULL;
    float *xt = dW ? scratch_grow(&s->xt, &s->xt_cap, (size_t)in * T) : NULL;
    if ((dx && !wt) || (dW && !xt)) { /* no memory for a transpose: the plain loops */
        mm_job j = {x, W, dy, NULL, dx, dW, T, in, out, 1};
        run_job(m, &j);
        return;
    }
    if (dx) { /* dx += dy W^T */
        tg_transpose(W, out, wt, in, in, out);
        const tg_gemm g = {dy, wt, dx, out, in, in, T, in, out, 1};
        run_tg(m, &g);
    }
    if (dW) { /* dW += x^T dy */
        tg_transpose(x, in, xt, T, T, in);
        const tg_gemm g = {xt, dy, dW, T, out, out, in, out, T, 1};
        run_tg(m, &g);
    }
#endif
}

/* ---- per-sequence work space ---------------------------------------------------------- */

typedef struct seq_ws {
    /* lane step */
    real *nx, *nxr, *hpre, *hpost, *hres, *sk, *u, *y;
    /* block */
    real *x0, *alpha, *ru, *rk, *uu, *ku, *a, *ar;
    real *q, *k, *v, *qn, *kn, *qnr, *knr, *qr, *kr, *P, *o, *gl, *go, *ao;
    real *pn, *pnr, *x1, *m, *mr, *z0, *z1, *h, *hs, *z2;
    real *bo;
    real *prj; /* [T][2n + n*n]: nx @ phi_pre, phi_post, phi_res */
    /* backward */
    real *dys, *dus, *dzs;
    real *d1, *d2, *d3, *d4, *d5, *d6, *d7, *tmp;
    real *rope_c, *rope_s;
    real *k1, *k2; /* [T][max(width, 2n + n*n)] each: transposed k / v, the lane projections */
    real *dPs, *PT; /* [T][T] each: one head's dP / dS and a transpose */
} seq_ws;

/* ---- the layer ---------------------------------------------------------------------- */

typedef struct g2_seq {
    uint32_t T;
    const real *ek, *ev; /* [sites][T][D] */
    real *dek, *dev;
} g2_seq;

static int site_of(const G2(model) * m, uint32_t l) {
    for (uint32_t s = 0; s < m->c.num_sites; s++)
        if (m->c.engram_layers[s] == l) return (int)s;
    return -1;
}

/* The per-token steps of block_fwd, run over the pool in token ranges (each token's
 * outputs are its own rows, computed as with one thread: bit-identical for every count). */
enum { BF_IN, BF_ROPE, BF_SOFTMAX, BF_GATE, BF_NORMS, BF_SILU, BF_OUT };

typedef struct blk_job {
    const G2(model) * m;
    uint32_t l, h;
    const g2_seq *sq;
    seq_ws *w;
    int step;
} blk_job;

/* engram: x + sigmoid(<rms_unit(x), rms_unit(ek)> / sqrt(D)) * ev; the block's input norm */
static void bf_in_tok(const blk_job *j, uint32_t t) {
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t T = j->sq->T, D = m->D;
    const int site = site_of(m, j->l);
    const real *ut = w->u + (size_t)t * D;
    real *xt = w->x0 + (size_t)t * D;
    if (site < 0) {
        memcpy(xt, ut, D * sizeof *xt);
    } else {
        const real *ek = j->sq->ek + ((size_t)site * T + t) * D, *ev = j->sq->ev + ((size_t)site * T + t) * D;
        w->ru[t] = zc_fwd(ut, NULL, D, w->uu + (size_t)t * D);
        w->rk[t] = zc_fwd(ek, NULL, D, w->ku + (size_t)t * D);
        real dot = 0;
        for (uint32_t i = 0; i < D; i++) dot += w->uu[(size_t)t * D + i] * w->ku[(size_t)t * D + i];
        const real al = sigm(dot / sqrt((real)D));
        w->alpha[t] = al;
        for (uint32_t i = 0; i < D; i++) xt[i] = ut[i] + al * ev[i];
    }
    w->ar[t] = zc_fwd(xt, LW(m, P_NORM_IN, j->l), D, w->a + (size_t)t * D);
    if (m->a8) fq8(w->a + (size_t)t * D, D); /* MultiHeadAttention: x = _aq(x, quant) */
}

/* q_norm / k_norm per head, RoPE (rotate-half) */
static void bf_rope_tok(const blk_job *j, uint32_t t) {
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t H = m->H, KV = m->KV, hd = m->hd, Q = H * hd, K = KV * hd, half = hd / 2;
    const real *c = w->rope_c + (size_t)t * half, *sn = w->rope_s + (size_t)t * half;
    for (uint32_t h = 0; h < H + KV; h++) {
        const int isq = h < H;
        const uint32_t hh = isq ? h : h - H;
        const size_t off = isq ? (size_t)t * Q + hh * hd : (size_t)t * K + hh * hd;
        real *nn = (isq ? w->qn : w->kn) + off, *rr = (isq ? w->qr : w->kr) + off;
        const real r = zc_fwd((isq ? w->q : w->k) + off, LW(m, isq ? P_QN : P_KN, j->l), hd, nn);
        if (isq)
            w->qnr[(size_t)t * H + hh] = r;
        else
            w->knr[(size_t)t * KV + hh] = r;
        for (uint32_t i = 0; i < half; i++) {
            rr[i] = nn[i] * c[i] - nn[i + half] * sn[i];
            rr[i + half] = nn[i + half] * c[i] + nn[i] * sn[i];
        }
    }
}

/* row t of head h's scores (q k / sqrt(hd), computed over the whole row) -> causal softmax */
static void bf_softmax_tok(const blk_job *j, uint32_t t) {
    const uint32_t T = j->sq->T;
    const real sc = (real)1 / sqrt((real)j->m->hd);
    real *P = j->w->P + ((size_t)j->h * T + t) * T;
    real mx = -INFINITY;
    for (uint32_t s = 0; s < T; s++) {
        if (s > t) {
            P[s] = 0;
            continue;
        }
        P[s] *= sc;
        if (P[s] > mx) mx = P[s];
    }
    const real z = exp_sum(P, t + 1, mx, P);
    for (uint32_t s = 0; s <= t; s++) P[s] /= z;
}

/* the attention's gate: out = o * sigmoid(gate_proj x), A8 */
static void bf_gate_tok(const blk_job *j, uint32_t t) {
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t Q = m->H * m->hd;
    for (size_t i = (size_t)t * Q; i < (size_t)(t + 1) * Q; i++) w->go[i] = w->o[i] * sigm(w->gl[i]);
    if (m->a8) fq8(w->go + (size_t)t * Q, Q); /* out = _aq(out, quant) */
}

/* post_attn_norm, gated residual, pre_hada_norm, the MLP's first scale and padding */
static void bf_norms_tok(const blk_job *j, uint32_t t) {
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t D = m->D, N = m->N, l = j->l;
    const real gate = sigm(LW(m, P_GATE, l)[0]), *d1 = LW(m, P_D1, l);
    w->pnr[t] = zc_fwd(w->ao + (size_t)t * D, LW(m, P_POST_NORM, l), D, w->pn + (size_t)t * D);
    for (uint32_t i = 0; i < D; i++)
        w->x1[(size_t)t * D + i] = w->x0[(size_t)t * D + i] + gate * w->pn[(size_t)t * D + i];
    w->mr[t] = zc_fwd(w->x1 + (size_t)t * D, LW(m, P_PRE_HADA, l), D, w->m + (size_t)t * D);
    for (uint32_t i = 0; i < N; i++) w->z0[(size_t)t * N + i] = i < D ? d1[i] * w->m[(size_t)t * D + i] : 0;
}

static void bf_worker(void *arg, int i, int n) {
    const blk_job *j = arg;
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t D = m->D, N = m->N;
    uint32_t lo, hi;
    range_of(j->sq->T, i, n, &lo, &hi);
    for (uint32_t t = lo; t < hi; t++) switch (j->step) {
        case BF_IN:
            bf_in_tok(j, t);
            break;
        case BF_ROPE:
            bf_rope_tok(j, t);
            break;
        case BF_SOFTMAX:
            bf_softmax_tok(j, t);
            break;
        case BF_GATE:
            bf_gate_tok(j, t);
            break;
        case BF_NORMS:
            bf_norms_tok(j, t);
            break;
        case BF_SILU: {
            const real *d2 = LW(m, P_D2, j->l);
            for (size_t k = (size_t)t * N; k < (size_t)(t + 1) * N; k++) {
                w->h[k] = d2[k % N] * w->z1[k];
                w->hs[k] = w->h[k] * sigm(w->h[k]);
            }
            break;
        }
        default: { /* BF_OUT: out = x1 + (d3 z)[:D] */
            const real *d3 = LW(m, P_D3, j->l);
            for (uint32_t k = 0; k < D; k++)
                w->bo[(size_t)t * D + k] = w->x1[(size_t)t * D + k] + d3[k] * w->z2[(size_t)t * N + k];
        }
    }
}

static void run_bf(const G2(model) * m, blk_job *j, int step) {
    j->step = step;
    G2(run_parallel)(m, bf_worker, j);
}

/* Block.__call__ on u[T][D] into w->bo (the block's output), keeping its intermediates. */
static void block_fwd(const G2(model) * m, uint32_t l, const g2_seq *sq, seq_ws *w) {
    const uint32_t T = sq->T, D = m->D, H = m->H, KV = m->KV, hd = m->hd, N = m->N;
    const uint32_t Q = H * hd, K = KV * hd;
    blk_job j = {m, l, 0, sq, w, 0};
    run_bf(m, &j, BF_IN); /* engram, input norm */
    /* MultiHeadAttention: q/k/v, q_norm / k_norm per head, RoPE (rotate-half) */
    mm(m, w->a, LW(m, P_WQ, l), w->q, T, D, Q);
    mm(m, w->a, LW(m, P_WK, l), w->k, T, D, K);
    mm(m, w->a, LW(m, P_WV, l), w->v, T, D, K);
    run_bf(m, &j, BF_ROPE);
    /* dot_product_attention: softmax(q k / sqrt(hd)) v, causal, KV heads shared in groups */
#ifndef G2_GENERIC_PRODUCTS
    /* per head: S = q k^T and o = P v as products over the whole sequence (the entries
     * above the diagonal are computed and then set to 0) */
    for (uint32_t h = 0; h < H; h++) {
        const uint32_t g = h / (H / KV);
        real *Ph = w->P + (size_t)h * T * T;
        if (h % (H / KV) == 0) tg_transpose(w->kr + g * hd, K, w->k1, T, T, hd); /* k^T [hd][T] */
        gemm(m, w->qr + h * hd, Q, w->k1, T, Ph, T, T, T, hd, 0);
        j.h = h;
        run_bf(m, &j, BF_SOFTMAX);
        gemm(m, Ph, T, w->v + g * hd, K, w->o + h * hd, Q, T, hd, T, 0);
    }
#else
    const real sc = (real)1 / sqrt((real)hd);
    for (uint32_t h = 0; h < H; h++) {
        const uint32_t g = h / (H / KV);
        for (uint32_t t = 0; t < T; t++) {
            real *P = w->P + ((size_t)h * T + t) * T;
            real mx = -INFINITY;
            for (uint32_t s = 0; s < T; s++) {
                if (s > t) {
                    P[s] = 0;
                    continue;
                }
                real d = 0;
                for (uint32_t i = 0; i < hd; i++)
                    d += w->qr[(size_t)t * Q + h * hd + i] * w->kr[(size_t)s * K + g * hd + i];
                P[s] = d * sc;
                if (P[s] > mx) mx = P[s];
            }
            const real z = exp_sum(P, t + 1, mx, P);
            for (uint32_t s = 0; s <= t; s++) P[s] /= z;
            real *ot = w->o + (size_t)t * Q + h * hd;
            for (uint32_t i = 0; i < hd; i++) ot[i] = 0;
            for (uint32_t s = 0; s <= t; s++)
                for (uint32_t i = 0; i < hd; i++) ot[i] += P[s] * w->v[(size_t)s * K + g * hd + i];
        }
    }
#endif
    mm(m, w->a, LW(m, P_WG, l), w->gl, T, D, Q);
    run_bf(m, &j, BF_GATE);
    mm(m, w->go, LW(m, P_WO, l), w->ao, T, Q, D);
    /* post_attn_norm, gated residual, pre_hada_norm; HadamardMLP: z = pad(x); z = (d1 z) @ H;
     * z = silu(d2 z) @ H; out = (d3 z)[:D] */
    run_bf(m, &j, BF_NORMS);
    mm(m, w->z0, m->walsh, w->z1, T, N, N);
    run_bf(m, &j, BF_SILU);
    mm(m, w->hs, m->walsh, w->z2, T, N, N);
    run_bf(m, &j, BF_OUT);
}

/* The per-token steps of block_back, run over the pool: the BB_ steps in token ranges (each
 * token's rows its own), the BC_ steps in column ranges (a parameter's gradient summed over
 * the tokens in order, each column by one thread): bit-identical for every thread count. */
enum { BB_SOFTMAX, BB_GATE, BB_NORMS, BB_ROPE, BB_NORM_IN, BB_ENGRAM, BC_D3, BC_D2, BC_D1, BC_NORMS, BC_QK, BC_NORM_IN };

typedef struct bb_job {
    G2(model) * m;
    uint32_t l, h;
    const g2_seq *sq;
    seq_ws *w;
    const real *dbo;
    real *du, *dx1, *dm, *dz0, *dz1, *dz2, *dhs, *dao, *dx0, *dpn, *dgo, *dO, *dgl, *dqr, *dkr, *dq, *dk, *da;
    int step;
} bb_job;

#define COL_BLOCK 16 /* columns per pass over the tokens (the sums over t stay in order) */

/* ds[i] += dy[r][i] x[r][i] rr[r] over rows r in order, for i in [c0, c1): the scale's
 * gradient of zc_back, summed as zc_back sums it row by row */
static void ds_cols(const real *dy, const real *x, const real *rr, uint32_t rows, uint32_t width, real *ds,
                    uint32_t c0, uint32_t c1) {
    for (uint32_t jb = c0; jb < c1; jb += COL_BLOCK) {
        const uint32_t je = jb + COL_BLOCK < c1 ? jb + COL_BLOCK : c1;
        for (uint32_t r = 0; r < rows; r++) {
            const real *dyr = dy + (size_t)r * width, *xr = x + (size_t)r * width;
            for (uint32_t i = jb; i < je; i++) ds[i] += dyr[i] * xr[i] * rr[r];
        }
    }
}

/* the Hadamard MLP's elementwise backward for columns [c0, c1) of every token */
static void bc_mlp(const bb_job *j, uint32_t c0, uint32_t c1) {
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t T = j->sq->T, D = m->D, N = m->N, l = j->l;
    for (uint32_t jb = c0; jb < c1; jb += COL_BLOCK) {
        const uint32_t je = jb + COL_BLOCK < c1 ? jb + COL_BLOCK : c1;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t c = jb; c < je; c++) {
                const size_t k = (size_t)t * N + c;
                if (j->step == BC_D3) { /* out = x1 + (d3 z2)[:D] */
                    const real g = c < D ? j->dbo[(size_t)t * D + c] : 0;
                    if (c < D) LG(m, P_D3, l)[c] += g * w->z2[k];
                    j->dz2[k] = c < D ? g * LW(m, P_D3, l)[c] : 0;
                } else if (j->step == BC_D2) { /* hs = silu(d2 z1) */
                    const real hv = w->h[k], sg = sigm(hv);
                    const real dh = j->dhs[k] * (sg + hv * sg * (1 - sg));
                    LG(m, P_D2, l)[c] += dh * w->z1[k];
                    j->dz1[k] = dh * LW(m, P_D2, l)[c];
                } else { /* BC_D1: z0 = pad(d1 m), c < D */
                    LG(m, P_D1, l)[c] += j->dz0[k] * w->m[(size_t)t * D + c];
                    j->dm[(size_t)t * D + c] += j->dz0[k] * LW(m, P_D1, l)[c];
                }
            }
    }
}

static void bb_tok(const bb_job *j, uint32_t t) {
    G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t T = j->sq->T, D = m->D, H = m->H, KV = m->KV, hd = m->hd, Q = H * hd, K = KV * hd, l = j->l;
    switch (j->step) {
    case BB_SOFTMAX: { /* row t of head h: dS = P (dP - <dP, P>) / sqrt(hd), 0 above the diagonal */
        const real sc = (real)1 / sqrt((real)hd);
        const real *P = w->P + ((size_t)j->h * T + t) * T;
        real *d = w->dPs + (size_t)t * T;
        real sum = 0;
        for (uint32_t s = 0; s <= t; s++) sum += d[s] * P[s];
        for (uint32_t s = 0; s < T; s++) d[s] = s > t ? 0 : P[s] * (d[s] - sum) * sc;
        break;
    }
    case BB_GATE: /* out = o * sigmoid(gl) */
        for (size_t i = (size_t)t * Q; i < (size_t)(t + 1) * Q; i++) {
            const real sg = sigm(w->gl[i]);
            j->dO[i] = j->dgo[i] * sg;
            j->dgl[i] = j->dgo[i] * w->o[i] * sg * (1 - sg);
        }
        break;
    case BB_NORMS: { /* pre_hada_norm, gated residual, post_attn_norm: the inputs' part */
        const real gate = sigm(LW(m, P_GATE, l)[0]);
        real *dx1 = j->dx1 + (size_t)t * D, *dpn = j->dpn + (size_t)t * D;
        zc_back(w->x1 + (size_t)t * D, LW(m, P_PRE_HADA, l), D, w->mr[t], j->dm + (size_t)t * D, dx1, NULL);
        for (uint32_t i = 0; i < D; i++) {
            j->dx0[(size_t)t * D + i] = dx1[i];
            dpn[i] = dx1[i] * gate;
        }
        zc_back(w->ao + (size_t)t * D, LW(m, P_POST_NORM, l), D, w->pnr[t], dpn, j->dao + (size_t)t * D, NULL);
        break;
    }
    case BB_ROPE: { /* RoPE and q/k norms back to the projections; dn kept for BC_QK */
        const uint32_t half = hd / 2;
        const real *c = w->rope_c + (size_t)t * half, *sn = w->rope_s + (size_t)t * half;
        for (uint32_t h = 0; h < H + KV; h++) {
            const int isq = h < H;
            const uint32_t hh = isq ? h : h - H;
            const size_t off = isq ? (size_t)t * Q + hh * hd : (size_t)t * K + hh * hd;
            const real *dr = (isq ? j->dqr : j->dkr) + off;
            real *dn = (isq ? w->k2 : w->k1) + off;
            for (uint32_t i = 0; i < half; i++) {
                dn[i] = dr[i] * c[i] + dr[i + half] * sn[i];
                dn[i + half] = -dr[i] * sn[i] + dr[i + half] * c[i];
            }
            zc_back((isq ? w->q : w->k) + off, LW(m, isq ? P_QN : P_KN, l), hd,
                    isq ? w->qnr[(size_t)t * H + hh] : w->knr[(size_t)t * KV + hh], dn, (isq ? j->dq : j->dk) + off,
                    NULL);
        }
        break;
    }
    case BB_NORM_IN:
        zc_back(w->x0 + (size_t)t * D, LW(m, P_NORM_IN, l), D, w->ar[t], j->da + (size_t)t * D,
                j->dx0 + (size_t)t * D, NULL);
        break;
    default: { /* BB_ENGRAM */
        const int site = site_of(m, l);
        const real *g = j->dx0 + (size_t)t * D;
        real *du = j->du + (size_t)t * D;
        for (uint32_t i = 0; i < D; i++) du[i] += g[i];
        if (site < 0) break;
        const g2_seq *sq = j->sq;
        const size_t eo = ((size_t)site * T + t) * D;
        const real *ev = sq->ev + eo, al = w->alpha[t];
        real dal = 0;
        for (uint32_t i = 0; i < D; i++) {
            dal += g[i] * ev[i];
            sq->dev[eo + i] += al * g[i];
        }
        const real dz = dal * al * (1 - al) / sqrt((real)D);
        real *duu = w->k1 + (size_t)t * D, *dku = w->k2 + (size_t)t * D;
        for (uint32_t i = 0; i < D; i++) {
            duu[i] = dz * w->ku[(size_t)t * D + i];
            dku[i] = dz * w->uu[(size_t)t * D + i];
        }
        zc_back(w->u + (size_t)t * D, NULL, D, w->ru[t], duu, du, NULL);
        zc_back(sq->ek + eo, NULL, D, w->rk[t], dku, sq->dek + eo, NULL);
    }
    }
}

static void bb_worker(void *arg, int i, int n) {
    const bb_job *j = arg;
    G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t T = j->sq->T, D = m->D, H = m->H, KV = m->KV, hd = m->hd, l = j->l;
    uint32_t lo, hi;
    if (j->step < BC_D3) {
        range_of(T, i, n, &lo, &hi);
        for (uint32_t t = lo; t < hi; t++) bb_tok(j, t);
        return;
    }
    switch (j->step) {
    case BC_D3:
    case BC_D2:
        range_of(m->N, i, n, &lo, &hi);
        bc_mlp(j, lo, hi);
        break;
    case BC_D1:
        range_of(D, i, n, &lo, &hi);
        bc_mlp(j, lo, hi);
        break;
    case BC_NORMS:
        range_of(D, i, n, &lo, &hi);
        ds_cols(j->dm, w->x1, w->mr, T, D, LG(m, P_PRE_HADA, l), lo, hi);
        ds_cols(j->dpn, w->ao, w->pnr, T, D, LG(m, P_POST_NORM, l), lo, hi);
        break;
    case BC_QK:
        range_of(hd, i, n, &lo, &hi);
        ds_cols(w->k2, w->q, w->qnr, T * H, hd, LG(m, P_QN, l), lo, hi);
        ds_cols(w->k1, w->k, w->knr, T * KV, hd, LG(m, P_KN, l), lo, hi);
        break;
    default: /* BC_NORM_IN */
        range_of(D, i, n, &lo, &hi);
        ds_cols(j->da, w->x0, w->ar, T, D, LG(m, P_NORM_IN, l), lo, hi);
    }
}

static void run_bb(const G2(model) * m, bb_job *j, int step) {
    j->step = step;
    G2(run_parallel)(m, bb_worker, j);
}

/* Backward of block_fwd: dbo[T][D] -> du[T][D] (accumulated), parameter gradients. */
static void block_back(G2(model) * m, uint32_t l, const g2_seq *sq, seq_ws *w, const real *dbo, real *du) {
    const uint32_t T = sq->T, D = m->D, H = m->H, KV = m->KV, hd = m->hd, N = m->N;
    const uint32_t Q = H * hd, K = KV * hd;
    bb_job j;
    memset(&j, 0, sizeof j);
    j.m = m, j.l = l, j.sq = sq, j.w = w, j.dbo = dbo, j.du = du;
    real *dx1 = w->d1, *dm = w->d2;
    memcpy(dx1, dbo, (size_t)T * D * sizeof *dx1);
    memset(dm, 0, (size_t)T * D * sizeof *dm);
    /* HadamardMLP (the Walsh matrix is symmetric: the backward of z @ H is dz @ H) */
    real *dz2 = w->d3, *dhs = w->d4, *dz0 = w->d5;
    j.dx1 = dx1, j.dm = dm, j.dz2 = dz2, j.dhs = dhs, j.dz0 = dz0, j.dz1 = dz2; /* dz2 is consumed by dz1 */
    run_bb(m, &j, BC_D3);
#ifdef G2_GENERIC_PRODUCTS
    memset(dhs, 0, (size_t)T * N * sizeof *dhs);
    mm_back(m, NULL, m->walsh, dz2, dhs, NULL, T, N, N);
#else
    mm(m, dz2, m->walsh, dhs, T, N, N); /* dz2 H^T = dz2 H: no transpose */
#endif
    real *dz1 = dz2;
    run_bb(m, &j, BC_D2);
#ifdef G2_GENERIC_PRODUCTS
    memset(dz0, 0, (size_t)T * N * sizeof *dz0);
    mm_back(m, NULL, m->walsh, dz1, dz0, NULL, T, N, N);
#else
    mm(m, dz1, m->walsh, dz0, T, N, N);
#endif
    run_bb(m, &j, BC_D1);
    /* pre_hada_norm, gated residual, post_attn_norm: the inputs per token, the scales per
     * column, the gate's gradient in order */
    const real gate = sigm(LW(m, P_GATE, l)[0]);
    real *dao = w->d3, *dx0 = w->d5;
    memset(dao, 0, (size_t)T * D * sizeof *dao);
    j.dao = dao, j.dx0 = dx0, j.dpn = w->d4; /* dhs is consumed */
    run_bb(m, &j, BB_NORMS);
    run_bb(m, &j, BC_NORMS);
    real dgate = 0;
    for (size_t i = 0; i < (size_t)T * D; i++) dgate += dx1[i] * w->pn[i];
    LG(m, P_GATE, l)[0] += dgate * gate * (1 - gate);
    /* out_proj, gate_proj */
    real *dgo = w->d1; /* dx1 is consumed */
    memset(dgo, 0, (size_t)T * Q * sizeof *dgo);
    real *da = w->d2; /* dm is consumed */
    memset(da, 0, (size_t)T * D * sizeof *da);
    mm_back(m, w->go, LW(m, P_WO, l), dao, dgo, LGD(m, P_WO, l), T, Q, D);
    real *dO = w->d3, *dgl = w->d6;
    j.dgo = dgo, j.dO = dO, j.dgl = dgl;
    run_bb(m, &j, BB_GATE);
    mm_back(m, w->a, LW(m, P_WG, l), dgl, da, LGD(m, P_WG, l), T, D, Q);
    /* attention */
    real *dqr = w->d1, *dkr = w->d6, *dv = w->d7;
    memset(dqr, 0, (size_t)T * Q * sizeof *dqr);
    memset(dkr, 0, (size_t)T * K * sizeof *dkr);
    memset(dv, 0, (size_t)T * K * sizeof *dv);
#ifndef G2_GENERIC_PRODUCTS
    /* per head as products: dP = dO v^T, dv += P^T dO, dS, dq += dS k, dk += dS^T q */
    for (uint32_t h = 0; h < H; h++) {
        const uint32_t g = h / (H / KV);
        const real *Ph = w->P + (size_t)h * T * T;
        if (h % (H / KV) == 0) tg_transpose(w->v + g * hd, K, w->k2, T, T, hd); /* v^T [hd][T] */
        real *dS = w->dPs, *tr = w->PT;
        gemm(m, dO + h * hd, Q, w->k2, T, dS, T, T, T, hd, 0);
        tg_transpose(Ph, T, tr, T, T, T);
        gemm(m, tr, T, dO + h * hd, Q, dv + g * hd, K, T, hd, T, 1);
        j.h = h;
        run_bb(m, &j, BB_SOFTMAX);
        gemm(m, dS, T, w->kr + g * hd, K, dqr + h * hd, Q, T, hd, T, 1);
        tg_transpose(dS, T, tr, T, T, T);
        gemm(m, tr, T, w->qr + h * hd, Q, dkr + g * hd, K, T, hd, T, 1);
    }
#else
    const real sc = (real)1 / sqrt((real)hd);
    real *dP = w->tmp;
    for (uint32_t h = 0; h < H; h++) {
        const uint32_t g = h / (H / KV);
        for (uint32_t t = 0; t < T; t++) {
            const real *P = w->P + ((size_t)h * T + t) * T;
            const real *dot_ = dO + (size_t)t * Q + h * hd;
            real sum = 0;
            for (uint32_t s = 0; s <= t; s++) {
                real d = 0;
                for (uint32_t i = 0; i < hd; i++) {
                    d += dot_[i] * w->v[(size_t)s * K + g * hd + i];
                    dv[(size_t)s * K + g * hd + i] += P[s] * dot_[i];
                }
                dP[s] = d;
                sum += d * P[s];
            }
            for (uint32_t s = 0; s <= t; s++) {
                const real dS = P[s] * (dP[s] - sum) * sc;
                for (uint32_t i = 0; i < hd; i++) {
                    dqr[(size_t)t * Q + h * hd + i] += dS * w->kr[(size_t)s * K + g * hd + i];
                    dkr[(size_t)s * K + g * hd + i] += dS * w->qr[(size_t)t * Q + h * hd + i];
                }
            }
        }
    }
#endif
    /* RoPE and q/k norms back to the projections */
    real *dq = w->d3, *dk = w->d5; /* dO is consumed; dx0 moves from d5 to d4 */
    memcpy(w->d4, dx0, (size_t)T * D * sizeof *dx0);
    dx0 = w->d4;
    memset(dq, 0, (size_t)T * Q * sizeof *dq);
    memset(dk, 0, (size_t)T * K * sizeof *dk);
    j.dqr = dqr, j.dkr = dkr, j.dq = dq, j.dk = dk, j.dx0 = dx0, j.da = da;
    run_bb(m, &j, BB_ROPE);
    run_bb(m, &j, BC_QK);
    mm_back(m, w->a, LW(m, P_WQ, l), dq, da, LGD(m, P_WQ, l), T, D, Q);
    mm_back(m, w->a, LW(m, P_WK, l), dk, da, LGD(m, P_WK, l), T, D, K);
    mm_back(m, w->a, LW(m, P_WV, l), dv, da, LGD(m, P_WV, l), T, D, K);
    /* norm in, then the engram and du += dx0 */
    run_bb(m, &j, BB_NORM_IN);
    run_bb(m, &j, BC_NORM_IN);
    run_bb(m, &j, BB_ENGRAM);
}

/* The per-token steps of the lane step, run over the pool in token ranges: each token's
 * outputs are its own rows, computed with the same operations in the same order whatever
 * the split (the sums over tokens into shared gradients are left to the caller, in token
 * order), so results are bit-identical for every thread count. */
enum { LANE_PRE, LANE_POST, LANE_BACK_WRITE, LANE_BACK_READ, LANE_BACK_NORM };

typedef struct lane_job {
    const G2(model) * m;
    uint32_t l, T;
    seq_ws *w;
    const real *Xin, *dXo;
    real *Xout, *dXi;
    int step;
} lane_job;

/* lane_fwd before the block for token t: hpre, hpost, the Sinkhorn steps, hres, u */
static void lane_pre_tok(const lane_job *j, uint32_t t) {
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t l = j->l, n = m->n, D = m->D, nD = n * D, nn = n * n, own = l % n;
    const real apre = LW(m, P_A_PRE, l)[0], apost = LW(m, P_A_POST, l)[0], ares = LW(m, P_A_RES, l)[0];
    const real *bpre = LW(m, P_B_PRE, l), *bpost = LW(m, P_B_POST, l), *bres = LW(m, P_B_RES, l);
    const real *X = j->Xin + (size_t)t * nD, *prj = w->prj + (size_t)t * (2 * n + nn);
    real *hpre = w->hpre + (size_t)t * n, *hpost = w->hpost + (size_t)t * n;
    for (uint32_t i = 0; i < n; i++) {
        hpre[i] = sigm(apre * prj[i] + bpre[i] + (real)nm_lane_pre_offset(i, own));
        hpost[i] = 2 * sigm(apost * prj[n + i] + bpost[i] + (real)nm_lane_post_offset(i, own));
    }
    /* _sinkhorn: 20 x (rows then columns) in log space, then exp */
    real *sk = w->sk + (size_t)t * (2 * SINKHORN_ITERS + 1) * nn;
    for (uint32_t k = 0; k < nn; k++) sk[k] = ares * prj[2 * n + k] + bres[k];
    real *hres = w->hres + (size_t)t * nn;
    sinkhorn_fwd(sk, n, hres);
    real *u = w->u + (size_t)t * D; /* the sums over i in order, c innermost (it vectorizes) */
    for (uint32_t c = 0; c < D; c++) u[c] = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < D; c++) u[c] += hpre[i] * X[(size_t)i * D + c];
}

/* lane_fwd after the block for token t: y = block(u) - u, X' = hres X + hpost y */
static void lane_post_tok(const lane_job *j, uint32_t t) {
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t n = m->n, D = m->D, nD = n * D, nn = n * n;
    const real *X = j->Xin + (size_t)t * nD, *hres = w->hres + (size_t)t * nn, *hpost = w->hpost + (size_t)t * n;
    real *y = w->y + (size_t)t * D, *Xo = j->Xout + (size_t)t * nD;
    for (uint32_t c = 0; c < D; c++) y[c] = w->bo[(size_t)t * D + c] - w->u[(size_t)t * D + c];
    for (uint32_t i = 0; i < n; i++) { /* the sums over jj in order, c innermost */
        real *xo = Xo + (size_t)i * D;
        for (uint32_t c = 0; c < D; c++) xo[c] = 0;
        for (uint32_t jj = 0; jj < n; jj++)
            for (uint32_t c = 0; c < D; c++) xo[c] += hres[i * n + jj] * X[(size_t)jj * D + c];
        for (uint32_t c = 0; c < D; c++) xo[c] = xo[c] + hpost[i] * y[c];
    }
}

/* lane_back of the lane write for token t: dX (set), dy, and into dz the unscaled
 * d(post projection) and d(res projection) (the Sinkhorn backward) */
static void lane_back_write_tok(const lane_job *j, uint32_t t) {
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t n = m->n, D = m->D, nD = n * D, nn = n * n;
    const real *X = j->Xin + (size_t)t * nD, *g = j->dXo + (size_t)t * nD, *hres = w->hres + (size_t)t * nn;
    const real *hpost = w->hpost + (size_t)t * n, *y = w->y + (size_t)t * D;
    real *dx = j->dXi + (size_t)t * nD, *dyt = w->dys + (size_t)t * D, *dzt = w->dzs + (size_t)t * (2 * n + nn);
    for (uint32_t c = 0; c < nD; c++) dx[c] = 0;
    for (uint32_t c = 0; c < D; c++) dyt[c] = 0;
    real dh[64] = {0}; /* [n][n]: every entry set below (zeroed for the compiler) */
    for (uint32_t i = 0; i < n; i++) {
        const real dp = dot8(g + (size_t)i * D, y, D);
        for (uint32_t c = 0; c < D; c++) dyt[c] += hpost[i] * g[(size_t)i * D + c];
        const real s = hpost[i] / 2;
        dzt[n + i] = dp * 2 * s * (1 - s);
        for (uint32_t jj = 0; jj < n; jj++) {
            dh[i * n + jj] = dot8(g + (size_t)i * D, X + (size_t)jj * D, D);
            for (uint32_t c = 0; c < D; c++) dx[(size_t)jj * D + c] += hres[i * n + jj] * g[(size_t)i * D + c];
        }
    }
    /* Sinkhorn backward */
    real dS[64];
    sinkhorn_back(w->sk + (size_t)t * (2 * SINKHORN_ITERS + 1) * nn, hres, dh, n, dS);
    memcpy(dzt + 2 * n, dS, nn * sizeof *dS);
}

/* lane_back of the lane read u = hpre . X for token t: dX += hpre du, and into dz the
 * unscaled d(pre projection) */
static void lane_back_read_tok(const lane_job *j, uint32_t t) {
    const G2(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t n = m->n, D = m->D, nD = n * D, nn = n * n;
    const real *X = j->Xin + (size_t)t * nD, *hpre = w->hpre + (size_t)t * n, *dut = w->dus + (size_t)t * D;
    real *dx = j->dXi + (size_t)t * nD, *dzt = w->dzs + (size_t)t * (2 * n + nn);
    for (uint32_t i = 0; i < n; i++) {
        const real dp = dot8(dut, X + (size_t)i * D, D);
        for (uint32_t c = 0; c < D; c++) dx[(size_t)i * D + c] += hpre[i] * dut[c];
        dzt[i] = dp * hpre[i] * (1 - hpre[i]);
    }
}

static void lane_worker(void *arg, int i, int n) {
    const lane_job *j = arg;
    const G2(model) *m = j->m;
    const uint32_t nD = m->n * m->D;
    uint32_t lo, hi;
    range_of(j->T, i, n, &lo, &hi);
    for (uint32_t t = lo; t < hi; t++) switch (j->step) {
        case LANE_PRE:
            lane_pre_tok(j, t);
            break;
        case LANE_POST:
            lane_post_tok(j, t);
            break;
        case LANE_BACK_WRITE:
            lane_back_write_tok(j, t);
            break;
        case LANE_BACK_READ:
            lane_back_read_tok(j, t);
            break;
        default: /* LANE_BACK_NORM: _rms_unit's backward, dnx in d1 */
            zc_back(j->Xin + (size_t)t * nD, NULL, nD, j->w->nxr[t], j->w->d1 + (size_t)t * nD,
                    j->dXi + (size_t)t * nD, NULL);
    }
}

static void run_lane(const G2(model) * m, lane_job *j, int step) {
    j->step = step;
    G2(run_parallel)(m, lane_worker, j);
}

/* Xin[T][n][D] -> Xout; keeps nx, the h's, the Sinkhorn steps, u and y in w. */
static void lane_fwd(const G2(model) * m, uint32_t l, const g2_seq *sq, seq_ws *w, const real *Xin, real *Xout) {
    const uint32_t T = sq->T, n = m->n, D = m->D, nD = n * D, nn = n * n;
    const real *pp = LW(m, P_PHI_PRE, l), *po = LW(m, P_PHI_POST, l), *pr = LW(m, P_PHI_RES, l);
    for (uint32_t t = 0; t < T; t++) /* _rms_unit (2.0.15 applies no A8 here) */
        w->nxr[t] = zc_fwd(Xin + (size_t)t * nD, NULL, nD, w->nx + (size_t)t * nD);
    /* the three projections of every token as products, then side by side in prj */
    real *ppre = w->k1, *ppost = ppre + (size_t)T * n, *pres = ppost + (size_t)T * n;
    mm(m, w->nx, pp, ppre, T, nD, n);
    mm(m, w->nx, po, ppost, T, nD, n);
    mm(m, w->nx, pr, pres, T, nD, nn);
    for (uint32_t t = 0; t < T; t++) {
        real *prj = w->prj + (size_t)t * (2 * n + nn);
        memcpy(prj, ppre + (size_t)t * n, n * sizeof *prj);
        memcpy(prj + n, ppost + (size_t)t * n, n * sizeof *prj);
        memcpy(prj + 2 * n, pres + (size_t)t * nn, nn * sizeof *prj);
    }
    lane_job j = {m, l, T, w, Xin, NULL, Xout, NULL, 0};
    run_lane(m, &j, LANE_PRE);
    block_fwd(m, l, sq, w);
    run_lane(m, &j, LANE_POST);
}

/* Backward of lane_fwd (which must have just run for this layer): dXo -> dXi (overwritten). */
static void lane_back(G2(model) * m, uint32_t l, const g2_seq *sq, seq_ws *w, const real *Xin, const real *dXo,
                      real *dXi) {
    const uint32_t T = sq->T, n = m->n, D = m->D, nD = n * D, nn = n * n;
    const real *pp = LW(m, P_PHI_PRE, l), *po = LW(m, P_PHI_POST, l), *pr = LW(m, P_PHI_RES, l);
    const real apre = LW(m, P_A_PRE, l)[0], apost = LW(m, P_A_POST, l)[0], ares = LW(m, P_A_RES, l)[0];
    real *gpp = LG(m, P_PHI_PRE, l), *gpo = LG(m, P_PHI_POST, l), *gpr = LG(m, P_PHI_RES, l);
    real *gapre = LG(m, P_A_PRE, l), *gapost = LG(m, P_A_POST, l), *gares = LG(m, P_A_RES, l);
    real *gbpre = LG(m, P_B_PRE, l), *gbpost = LG(m, P_B_POST, l), *gbres = LG(m, P_B_RES, l);
    real *dy = w->dys, *du = w->dus;
    real *dz = w->dzs; /* [T][2n + nn]: d(projection) per token */
    lane_job j = {m, l, T, w, Xin, dXo, NULL, dXi, 0};
    /* the lane write: X' = hres X + hpost y, per token; then the gradients of the gates'
     * parameters summed over the tokens in order */
    run_lane(m, &j, LANE_BACK_WRITE);
    for (uint32_t t = 0; t < T; t++) {
        const real *prj = w->prj + (size_t)t * (2 * n + nn);
        real *dzt = dz + (size_t)t * (2 * n + nn);
        for (uint32_t k = 0; k < nn; k++) {
            const real dS = dzt[2 * n + k];
            gbres[k] += dS;
            gares[0] += dS * prj[2 * n + k];
            dzt[2 * n + k] = dS * ares;
        }
        for (uint32_t i = 0; i < n; i++) {
            gbpost[i] += dzt[n + i];
            gapost[0] += dzt[n + i] * prj[n + i];
            dzt[n + i] *= apost;
        }
    }
    /* the block: y = block(u) - u */
    for (size_t i = 0; i < (size_t)T * D; i++) du[i] = -dy[i];
    block_back(m, l, sq, w, dy, du);
    /* the lane read: u = hpre . X, and the projections of nx */
    run_lane(m, &j, LANE_BACK_READ);
    for (uint32_t t = 0; t < T; t++) {
        const real *prj = w->prj + (size_t)t * (2 * n + nn);
        real *dzt = dz + (size_t)t * (2 * n + nn);
        for (uint32_t i = 0; i < n; i++) {
            const real dzp = dzt[i];
            gbpre[i] += dzp;
            gapre[0] += dzp * prj[i];
            dzt[i] = dzp * apre;
        }
    }
    /* the projections' backward for every token as products: dnx [T][nD] in d1 */
    real *dzpre = w->k1, *dzpost = dzpre + (size_t)T * n, *dzres = dzpost + (size_t)T * n, *dnx = w->d1;
    for (uint32_t t = 0; t < T; t++) {
        const real *dzt = dz + (size_t)t * (2 * n + nn);
        memcpy(dzpre + (size_t)t * n, dzt, n * sizeof *dzt);
        memcpy(dzpost + (size_t)t * n, dzt + n, n * sizeof *dzt);
        memcpy(dzres + (size_t)t * nn, dzt + 2 * n, nn * sizeof *dzt);
    }
    memset(dnx, 0, (size_t)T * nD * sizeof *dnx);
    mm_back(m, w->nx, pp, dzpre, dnx, gpp, T, nD, n);
    mm_back(m, w->nx, po, dzpost, dnx, gpo, T, nD, n);
    mm_back(m, w->nx, pr, dzres, dnx, gpr, T, nD, nn);
    run_lane(m, &j, LANE_BACK_NORM);
}

/* ---- engram (Engram.__call__, engram_indices) ----------------------------------------- */

/* The slot of table j at position t, or -1 where the n-gram runs off the start
 * (ngram_ok = 0). */
static int32_t engram_slot(const G2(model) * m, const int32_t *ids, uint32_t t, uint32_t j) {
    const uint32_t heads = m->tables / m->c.num_orders, oi = j / heads, h = j % heads;
    const uint32_t order = m->c.engram_orders[oi];
    if (t + 1 < order) return -1;
    nm_u32 acc = nm_engram_hash_start(oi * heads + h);
    for (uint32_t k = 0; k < order; k++) acc = nm_engram_hash_step(acc, (nm_u32)ids[t - k]);
    return (int32_t)nm_engram_hash_slot(acc, m->c.engram_slots);
}

/* e[T][tables*sub] (the fetched rows) and vl[T][D] (value_proj before the taps) of site s */
static void engram_rows(const G2(model) * m, uint32_t s, const int32_t *ids, uint32_t T, real *e) {
    const uint32_t sub = m->sub, E = m->tables * sub;
    const real *tab = ET(m, s, E_TABLE)->w;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < m->tables; j++) {
            const int32_t slot = engram_slot(m, ids, t, j);
            real *dst = e + (size_t)t * E + (size_t)j * sub;
            if (slot < 0)
                memset(dst, 0, sub * sizeof *dst);
            else
                memcpy(dst, tab + ((size_t)j * m->c.engram_slots + (uint32_t)slot) * sub, sub * sizeof *dst);
        }
    if (m->a8)
        for (uint32_t t = 0; t < T; t++) fq8(e + (size_t)t * E, E); /* e = _aq(e, quant) */
}

static void engram_fwd(const G2(model) * m, const int32_t *ids, uint32_t T, real *e, real *vl, real *ek, real *ev) {
    const uint32_t D = m->D, E = m->tables * m->sub;
    for (uint32_t s = 0; s < m->c.num_sites; s++) {
        engram_rows(m, s, ids, T, e);
        mm(m, e, ET(m, s, E_KEY)->w, ek + (size_t)s * T * D, T, E, D);
        mm(m, e, ET(m, s, E_VALUE)->w, vl, T, E, D);
        const real *taps = ET(m, s, E_TAPS)->w;
        real *v = ev + (size_t)s * T * D;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t c = 0; c < D; c++) {
                real acc = 0;
                for (uint32_t j = 0; j < ENGRAM_TAPS && j * m->dil <= t; j++)
                    acc += taps[(size_t)j * D + c] * vl[(size_t)(t - j * m->dil) * D + c];
                v[(size_t)t * D + c] = acc;
            }
    }
}

static void engram_back(G2(model) * m, const int32_t *ids, uint32_t T, real *e, real *vl, real *de, real *dvl,
                        const real *dek, const real *dev) {
    const uint32_t D = m->D, E = m->tables * m->sub, sub = m->sub;
    for (uint32_t s = 0; s < m->c.num_sites; s++) {
        engram_rows(m, s, ids, T, e);
        mm(m, e, ET(m, s, E_VALUE)->w, vl, T, E, D);
        const real *taps = ET(m, s, E_TAPS)->w;
        real *gt = ET(m, s, E_TAPS)->g;
        const real *dv = dev + (size_t)s * T * D;
        memset(dvl, 0, (size_t)T * D * sizeof *dvl);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t j = 0; j < ENGRAM_TAPS && j * m->dil <= t; j++)
                for (uint32_t c = 0; c < D; c++) {
                    gt[(size_t)j * D + c] += dv[(size_t)t * D + c] * vl[(size_t)(t - j * m->dil) * D + c];
                    dvl[(size_t)(t - j * m->dil) * D + c] += taps[(size_t)j * D + c] * dv[(size_t)t * D + c];
                }
        memset(de, 0, (size_t)T * E * sizeof *de);
        mm_back(m, e, ET(m, s, E_VALUE)->w, dvl, de, DW(ET(m, s, E_VALUE)), T, E, D);
        mm_back(m, e, ET(m, s, E_KEY)->w, dek + (size_t)s * T * D, de, DW(ET(m, s, E_KEY)), T, E, D);
        real *gtab = ET(m, s, E_TABLE)->g;
        if (ET(m, s, E_TABLE)->frozen) continue;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t j = 0; j < m->tables; j++) {
                const int32_t slot = engram_slot(m, ids, t, j);
                if (slot < 0) continue;
                real *dst = gtab + ((size_t)j * m->c.engram_slots + (uint32_t)slot) * sub;
                const real *src = de + (size_t)t * E + (size_t)j * sub;
                for (uint32_t k = 0; k < sub; k++) dst[k] += src[k];
            }
    }
}

/* ---- the model ------------------------------------------------------------------------- */

static void ws_release(G2(model) * m);

static const char *const FIXED_NAMES[P_FIXED] = {
    "embedding/embedding",
    "stack/final_norm/scale",
    "stack/mhc_phi_pre",
    "stack/mhc_phi_post",
    "stack/mhc_phi_res",
    "stack/mhc_b_pre",
    "stack/mhc_b_post",
    "stack/mhc_b_res",
    "stack/mhc_a_pre",
    "stack/mhc_a_post",
    "stack/mhc_a_res",
    "stack/layers/block/ZCRMSNorm_0/scale",
    "stack/layers/block/self_attn/q_proj/kernel",
    "stack/layers/block/self_attn/k_proj/kernel",
    "stack/layers/block/self_attn/v_proj/kernel",
    "stack/layers/block/self_attn/gate_proj/kernel",
    "stack/layers/block/self_attn/out_proj/kernel",
    "stack/layers/block/self_attn/q_norm/scale",
    "stack/layers/block/self_attn/k_norm/scale",
    "stack/layers/block/post_attn_norm/scale",
    "stack/layers/block/attn_gate",
    "stack/layers/block/pre_hada_norm/scale",
    "stack/layers/block/hadamard_mlp/d1",
    "stack/layers/block/hadamard_mlp/d2",
    "stack/layers/block/hadamard_mlp/d3",
};
static const char *const ENGRAM_NAMES[E_COUNT] = {"embedding", "key_proj/kernel", "value_proj/kernel", "taps"};

static void set_shape(G2(tensor) * t, uint32_t nd, uint64_t a, uint64_t b, uint64_t c) {
    const uint64_t s[3] = {a, b, c};
    t->ndim = nd;
    t->numel = 1;
    for (uint32_t i = 0; i < nd; i++) {
        t->shape[i] = s[i];
        t->numel *= s[i];
    }
}

void G2(model_free)(G2(model) * m) {
    if (!m) return;
    for (uint32_t i = 0; i < m->nt; i++) {
        free(m->t[i].w);
        free(m->t[i].g);
    }
    free(m->t);
    free(m->walsh);
    ws_release(m);
    if (m->scr) {
        free(m->scr->wt);
        free(m->scr->xt);
    }
    free(m->scr);
    cpu_pool_free(m->pool);
    free(m);
}

uint32_t G2(tensor_count)(const G2(model) * m) { return m->nt; }
G2(tensor) * G2(tensor_at)(G2(model) * m, uint32_t i) { return i < m->nt ? &m->t[i] : NULL; }
G2(tensor) * G2(find)(G2(model) * m, const char *name) {
    for (uint32_t i = 0; i < m->nt; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

int G2(model_from_checkpoint)(const export_config *cfg, const st_file *ckpt, G2(model) * *out) {
    *out = NULL;
    G2(model) *m = calloc(1, sizeof *m);
    if (!m) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    m->c = *cfg;
    const export_config *c = cfg;
    const uint32_t attn = c->attn_dim ? c->attn_dim : c->d_model;
    m->D = c->d_model, m->n = c->mhc_lanes, m->L = c->num_layers, m->H = c->num_heads, m->KV = c->num_kv_heads;
    m->hd = m->H ? attn / m->H : 0, m->V = c->vocab_size;
    /* lanes <= 8: the Sinkhorn backward keeps n*n values on the stack */
    if (!m->D || !m->n || !m->L || !m->H || !m->KV || m->H % m->KV || attn % m->H || m->hd % 2 || !m->V ||
        m->n > 8 || c->num_orders == 0 || m->D > (1u << 20)) {
        free(m);
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train: unsupported Needle 2 geometry (d_model %u, "
                           "attn_dim %u, heads %u/%u, lanes %u, engram orders %u)", c->d_model, attn,
                           c->num_heads, c->num_kv_heads, c->mhc_lanes, c->num_orders);
    }
    for (uint32_t s = 0; s < c->num_sites; s++)
        if (c->engram_layers[s] >= c->num_layers) {
            free(m);
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train: engram layer %u beyond num_layers %u",
                               c->engram_layers[s], c->num_layers);
        }
    uint32_t N = 1;
    while (N < m->D) N <<= 1; /* 1 << (d_model - 1).bit_length() */
    m->N = N;
    /* engram_geometry */
    const uint32_t heads = c->engram_heads ? c->engram_heads
                                           : (m->D / (c->num_orders * 128) ? m->D / (c->num_orders * 128) : 1);
    m->tables = c->num_orders * heads;
    m->sub = m->D / (c->num_orders * heads);
    if (!m->sub) {
        free(m);
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train: d_model %u leaves no engram sub-dimension for %u "
                           "orders x %u heads", c->d_model, c->num_orders, heads);
    }
    m->dil = 0;
    for (uint32_t i = 0; i < c->num_orders; i++) m->dil = c->engram_orders[i] > m->dil ? c->engram_orders[i] : m->dil;
    m->walsh = malloc((size_t)N * N * sizeof *m->walsh);
    m->scr = calloc(1, sizeof *m->scr);
    m->lv = tg_level_best();
    m->nt = P_FIXED + E_COUNT * c->num_sites;
    m->t = calloc(m->nt, sizeof *m->t);
    if (!m->walsh || !m->t || !m->scr) {
        G2(model_free)(m);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    /* _walsh_matrix: Sylvester's H (entry sign = (-1)^popcount(i & j)) / sqrt(N), the
     * scale rounded to float32 as the official float32 array holds it */
    const real hscale = (real)(float)(1.0 / sqrt((double)N));
    for (uint32_t i = 0; i < N; i++)
        for (uint32_t j = 0; j < N; j++) {
            uint32_t b = i & j, par = 0;
            while (b) {
                par ^= b & 1u;
                b >>= 1;
            }
            m->walsh[(size_t)i * N + j] = par ? -hscale : hscale;
        }
    const uint32_t L = m->L, D = m->D, n = m->n, Q = m->H * m->hd, K = m->KV * m->hd;
    G2(tensor) *t = m->t;
    set_shape(&t[P_EMB], 2, m->V, D, 0);
    set_shape(&t[P_FINAL], 1, D, 0, 0);
    set_shape(&t[P_PHI_PRE], 3, L, (uint64_t)n * D, n);
    set_shape(&t[P_PHI_POST], 3, L, (uint64_t)n * D, n);
    set_shape(&t[P_PHI_RES], 3, L, (uint64_t)n * D, (uint64_t)n * n);
    set_shape(&t[P_B_PRE], 2, L, n, 0);
    set_shape(&t[P_B_POST], 2, L, n, 0);
    set_shape(&t[P_B_RES], 3, L, n, n);
    set_shape(&t[P_A_PRE], 1, L, 0, 0);
    set_shape(&t[P_A_POST], 1, L, 0, 0);
    set_shape(&t[P_A_RES], 1, L, 0, 0);
    set_shape(&t[P_NORM_IN], 2, L, D, 0);
    set_shape(&t[P_WQ], 3, L, D, Q);
    set_shape(&t[P_WK], 3, L, D, K);
    set_shape(&t[P_WV], 3, L, D, K);
    set_shape(&t[P_WG], 3, L, D, Q);
    set_shape(&t[P_WO], 3, L, Q, D);
    set_shape(&t[P_QN], 2, L, m->hd, 0);
    set_shape(&t[P_KN], 2, L, m->hd, 0);
    set_shape(&t[P_POST_NORM], 2, L, D, 0);
    set_shape(&t[P_GATE], 1, L, 0, 0);
    set_shape(&t[P_PRE_HADA], 2, L, D, 0);
    for (uint32_t i = P_D1; i <= P_D3; i++) set_shape(&t[i], 2, L, N, 0);
    for (uint32_t i = 0; i < P_FIXED; i++) snprintf(t[i].name, G2_MAX_NAME, "%s", FIXED_NAMES[i]);
    for (uint32_t s = 0; s < c->num_sites; s++) {
        G2(tensor) *e = &t[P_FIXED + s * E_COUNT];
        set_shape(&e[E_TABLE], 3, m->tables, c->engram_slots, m->sub);
        set_shape(&e[E_KEY], 2, (uint64_t)m->tables * m->sub, D, 0);
        set_shape(&e[E_VALUE], 2, (uint64_t)m->tables * m->sub, D, 0);
        set_shape(&e[E_TAPS], 2, ENGRAM_TAPS, D, 0);
        for (uint32_t k = 0; k < E_COUNT; k++)
            snprintf(e[k].name, G2_MAX_NAME, "engrams_%u/%s", s, ENGRAM_NAMES[k]);
    }
    for (uint32_t i = 0; i < m->nt; i++) {
        G2(tensor) *ti = &t[i];
        const st_tensor *src = ckpt ? st_find(ckpt, ti->name) : NULL;
        int ok = !ckpt || (src && src->ndim == ti->ndim && src->numel == ti->numel);
        for (uint32_t k = 0; ok && src && k < ti->ndim; k++) ok = src->shape[k] == ti->shape[k];
        if (!ok) {
            const int st = needle_fail(NEEDLE_ERR_FORMAT, src ? "checkpoint tensor %s has the wrong shape "
                                                             "for its config" : "checkpoint has no tensor %s",
                                       ti->name);
            G2(model_free)(m);
            return st;
        }
        ti->w = calloc(ti->numel, sizeof *ti->w);
        ti->g = calloc(ti->numel, sizeof *ti->g);
        if (!ti->w || !ti->g) {
            G2(model_free)(m);
            return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        }
        for (uint64_t k = 0; src && k < ti->numel; k++) ti->w[k] = (real)st_get(src, k);
    }
    *out = m;
    return 0;
}

/* ---- work space and the loss ----------------------------------------------------------- */

/* The tensors whose gradient a frozen flag skips (the big ones: DW / LGD above and the
 * head and embedding rows); the others get theirs whatever the flag says. */
static int frozen_skipped(uint32_t i) {
    if (i == P_EMB || (i >= P_WQ && i <= P_WO)) return 1;
    if (i < P_FIXED) return 0;
    const uint32_t k = (i - P_FIXED) % E_COUNT;
    return k == E_TABLE || k == E_KEY || k == E_VALUE;
}

typedef struct run_ws {
    seq_ws w;
    real *e, *vl, *de, *dvl, *ek, *ev, *dek, *dev, *Xs, *dXa, *dXb, *logits, *xf, *xn, *dxn, *dxf;
    real *et;   /* [D][V]: the head's rows transposed, for logits = xn E^T as one product */
    real *rrow; /* [T]: 1/rms of final_norm per loss row */
    real *block; /* every buffer above lives in this one allocation */
    uint32_t *rowt; /* [T]: the positions in the loss (mask of the next token != 0) */
} run_ws;

#define HEAD_ROWS 64 /* loss rows per logits product: [64][V] */

static void ws_release(G2(model) * m) {
    if (m->ws) free(m->ws->block), free(m->ws->rowt);
    free(m->ws);
    m->ws = NULL;
    m->ws_T = 0;
}

static int ws_alloc(const G2(model) * m, uint32_t T, run_ws *r) {
    const uint32_t D = m->D, n = m->n, nD = n * D, nn = n * n, H = m->H, KV = m->KV;
    const uint32_t Q = H * m->hd, K = KV * m->hd, N = m->N;
    const uint32_t E = m->tables * m->sub, S = m->c.num_sites, pj = 2 * n + nn;
    uint32_t MX = D;
    const uint32_t cand[] = {Q, K, N, nD};
    for (uint32_t i = 0; i < 4; i++) MX = cand[i] > MX ? cand[i] : MX;
    const size_t TD = (size_t)T * D, TN = (size_t)T * N, dsz = (size_t)T * MX + 2 * (size_t)D;
    const size_t kw = (size_t)T * (MX > pj ? MX : pj);
    struct {
        real **p;
        size_t n;
    } f[] = {
        {&r->w.nx, (size_t)T * nD}, {&r->w.nxr, T}, {&r->w.hpre, (size_t)T * n}, {&r->w.hpost, (size_t)T * n},
        {&r->w.hres, (size_t)T * nn}, {&r->w.sk, (size_t)T * (2 * SINKHORN_ITERS + 1) * nn}, {&r->w.u, TD},
        {&r->w.y, TD}, {&r->w.prj, (size_t)T * pj}, {&r->w.x0, TD}, {&r->w.alpha, T}, {&r->w.ru, T},
        {&r->w.rk, T}, {&r->w.uu, TD}, {&r->w.ku, TD}, {&r->w.a, TD}, {&r->w.ar, T},
        {&r->w.q, (size_t)T * Q}, {&r->w.k, (size_t)T * K}, {&r->w.v, (size_t)T * K},
        {&r->w.qn, (size_t)T * Q}, {&r->w.kn, (size_t)T * K}, {&r->w.qnr, (size_t)T * H},
        {&r->w.knr, (size_t)T * KV}, {&r->w.qr, (size_t)T * Q}, {&r->w.kr, (size_t)T * K},
        {&r->w.P, (size_t)H * T * T}, {&r->w.o, (size_t)T * Q}, {&r->w.gl, (size_t)T * Q},
        {&r->w.go, (size_t)T * Q}, {&r->w.ao, TD}, {&r->w.pn, TD}, {&r->w.pnr, T}, {&r->w.x1, TD},
        {&r->w.m, TD}, {&r->w.mr, T}, {&r->w.z0, TN}, {&r->w.z1, TN}, {&r->w.h, TN}, {&r->w.hs, TN},
        {&r->w.z2, TN}, {&r->w.bo, TD},
        {&r->w.dys, TD}, {&r->w.dus, TD}, {&r->w.dzs, (size_t)T * pj}, {&r->w.d1, dsz}, {&r->w.d2, dsz},
        {&r->w.d3, dsz}, {&r->w.d4, dsz}, {&r->w.d5, dsz}, {&r->w.d6, dsz}, {&r->w.d7, dsz},
        {&r->w.tmp, dsz + T}, {&r->w.rope_c, (size_t)T * (m->hd / 2)}, {&r->w.rope_s, (size_t)T * (m->hd / 2)},
        {&r->w.k1, kw}, {&r->w.k2, kw}, {&r->w.dPs, (size_t)T * T}, {&r->w.PT, (size_t)T * T},
        {&r->e, (size_t)T * E}, {&r->vl, TD}, {&r->de, (size_t)T * E}, {&r->dvl, TD}, {&r->ek, S * TD},
        {&r->ev, S * TD}, {&r->dek, S * TD}, {&r->dev, S * TD}, {&r->Xs, (size_t)(m->L + 1) * T * nD},
        {&r->dXa, (size_t)T * nD}, {&r->dXb, (size_t)T * nD}, {&r->logits, (size_t)HEAD_ROWS * m->V},
        {&r->xf, TD}, {&r->xn, TD}, {&r->dxn, (size_t)HEAD_ROWS * D}, {&r->dxf, D}, {&r->et, (size_t)D * m->V},
        {&r->rrow, T},
    };
    const size_t nf = sizeof f / sizeof f[0];
    size_t total = 0;
    for (size_t i = 0; i < nf; i++) total += f[i].n + 1;
    r->block = calloc(total, sizeof *r->block);
    r->rowt = calloc(T, sizeof *r->rowt);
    if (!r->block || !r->rowt) {
        free(r->block);
        free(r->rowt);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "train: out of memory for T = %u", T);
    }
    size_t off = 0;
    for (size_t i = 0; i < nf; i++) {
        *f[i].p = r->block + off;
        off += f[i].n + 1;
    }
    return 0;
}

int G2(loss)(G2(model) * m, const int32_t *ids, const float *mask, uint32_t B, uint32_t T, int grads,
             double *loss) {
    *loss = 0;
    if (!B || T < 2) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train: a batch needs B >= 1 and T >= 2");
    for (size_t i = 0; i < (size_t)B * T; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= m->V)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train: token id %d outside the vocabulary (%u)",
                               ids[i], m->V);
    double msum = 0;
    for (uint32_t b = 0; b < B; b++)
        for (uint32_t t = 1; t < T; t++) msum += mask[(size_t)b * T + t];
    const real denom = (real)(msum > 1 ? msum : 1);
    if (!m->ws || m->ws_T != T) { /* a new length: a new work space (kept for the next call) */
        ws_release(m);
        m->ws = calloc(1, sizeof *m->ws);
        m->ws_T = 0;
        if (!m->ws) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        const int st = ws_alloc(m, T, m->ws);
        if (st) {
            free(m->ws);
            m->ws = NULL;
            return st;
        }
        m->ws_T = T;
    }
    run_ws r = *m->ws;
    if (grads)
        for (uint32_t i = 0; i < m->nt; i++)
            if (m->t[i].g && !(m->t[i].frozen && frozen_skipped(i)))
                memset(m->t[i].g, 0, m->t[i].numel * sizeof *m->t[i].g);
    const uint32_t D = m->D, n = m->n, nD = n * D, half = m->hd / 2, L = m->L;
    /* precompute_rope_freqs in float32 as the reference */
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t i = 0; i < half; i++) {
            const float inv = 1.0f / powf((float)m->c.rope_theta, (float)(2 * i) / (float)m->hd);
            const float ang = (float)t * inv;
            r.w.rope_c[(size_t)t * half + i] = (real)cosf(ang);
            r.w.rope_s[(size_t)t * half + i] = (real)sinf(ang);
        }
    /* the head's rows transposed once per call (the weights do not change within it) */
    for (uint32_t v0 = 0; v0 < m->V; v0 += 32)
        for (uint32_t c0 = 0; c0 < D; c0 += 32)
            for (uint32_t v = v0; v < v0 + 32 && v < m->V; v++)
                for (uint32_t c = c0; c < c0 + 32 && c < D; c++)
                    r.et[(size_t)c * m->V + v] = m->t[P_EMB].w[(size_t)v * D + c];
    const real escale = sqrt((real)D);
    double total = 0;
    for (uint32_t b = 0; b < B; b++) {
        const int32_t *tok = ids + (size_t)b * T;
        const float *mk = mask + (size_t)b * T;
        const uint32_t Tr = row_length(mk, T); /* the row without its padding */
        g2_seq sq = {Tr, r.ek, r.ev, r.dek, r.dev};
        engram_fwd(m, tok, Tr, r.e, r.vl, r.ek, r.ev);
        for (uint32_t t = 0; t < Tr; t++)
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t c = 0; c < D; c++)
                    r.Xs[(size_t)t * nD + (size_t)i * D + c] = m->t[P_EMB].w[(size_t)tok[t] * D + c] * escale;
        for (uint32_t l = 0; l < L; l++)
            lane_fwd(m, l, &sq, &r.w, r.Xs + (size_t)l * Tr * nD, r.Xs + (size_t)(l + 1) * Tr * nD);
        /* mean over lanes, final_norm, tied logits, masked cross-entropy */
        const real *XL = r.Xs + (size_t)L * Tr * nD;
        real *dX = r.dXa;
        memset(dX, 0, (size_t)Tr * nD * sizeof *dX);
        /* the loss rows, then their logits HEAD_ROWS at a time as products over the pool */
        uint32_t nr = 0;
        for (uint32_t t = 0; t + 1 < Tr; t++)
            if (mk[t + 1] != 0) r.rowt[nr++] = t;
        for (uint32_t k = 0; k < nr; k++) {
            const uint32_t t = r.rowt[k];
            real *xf = r.xf + (size_t)k * D, *xn = r.xn + (size_t)k * D;
            for (uint32_t c = 0; c < D; c++) {
                real s = 0;
                for (uint32_t i = 0; i < n; i++) s += XL[(size_t)t * nD + (size_t)i * D + c];
                xf[c] = s / (real)n;
            }
            r.rrow[k] = zc_fwd(xf, m->t[P_FINAL].w, D, xn);
            if (m->a8) fq8(xn, D); /* logits = _aq(x, quant) @ head.T */
        }
        const uint32_t V = m->V;
        const real *Emb = m->t[P_EMB].w;
        for (uint32_t k0 = 0; k0 < nr; k0 += HEAD_ROWS) {
            const uint32_t R = nr - k0 < HEAD_ROWS ? nr - k0 : HEAD_ROWS;
            const real *xn = r.xn + (size_t)k0 * D;
            mm(m, xn, r.et, r.logits, R, D, V);
            for (uint32_t k = 0; k < R; k++) {
                const uint32_t t = r.rowt[k0 + k], tgt = (uint32_t)tok[t + 1];
                const real wgt = (real)mk[t + 1];
                real *lg = r.logits + (size_t)k * V;
                real mx = -INFINITY;
                for (uint32_t v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
                const real z = exp_sum(lg, V, mx, NULL);
                const real lse = mx + rlog(z);
                total += (double)(wgt * (lse - lg[tgt]));
                if (!grads) continue;
                exp_shift(lg, V, lse); /* dloss/dlogit */
                for (uint32_t v = 0; v < V; v++) lg[v] = (lg[v] - (v == tgt ? 1 : 0)) * wgt / denom;
            }
            if (!grads) continue;
            mm(m, r.logits, Emb, r.dxn, R, V, D); /* dxn = g E */
            if (!m->t[P_EMB].frozen) /* dE += g^T xn */
                mm_back(m, r.logits, Emb, xn, NULL, m->t[P_EMB].g, R, V, D);
            for (uint32_t k = 0; k < R; k++) {
                const uint32_t t = r.rowt[k0 + k];
                memset(r.dxf, 0, D * sizeof *r.dxf);
                zc_back(r.xf + (size_t)(k0 + k) * D, m->t[P_FINAL].w, D, r.rrow[k0 + k], r.dxn + (size_t)k * D,
                        r.dxf, m->t[P_FINAL].g);
                for (uint32_t i = 0; i < n; i++)
                    for (uint32_t c = 0; c < D; c++) dX[(size_t)t * nD + (size_t)i * D + c] = r.dxf[c] / (real)n;
            }
        }
        if (!grads) continue;
        memset(r.dek, 0, (size_t)m->c.num_sites * Tr * D * sizeof *r.dek);
        memset(r.dev, 0, (size_t)m->c.num_sites * Tr * D * sizeof *r.dev);
        for (uint32_t l = L; l-- > 0;) {
            const real *Xin = r.Xs + (size_t)l * Tr * nD;
            lane_fwd(m, l, &sq, &r.w, Xin, r.Xs + (size_t)(l + 1) * Tr * nD); /* recompute */
            real *dXi = dX == r.dXa ? r.dXb : r.dXa;
            lane_back(m, l, &sq, &r.w, Xin, dX, dXi);
            dX = dXi;
        }
        for (uint32_t t = 0; t < Tr && !m->t[P_EMB].frozen; t++) {
            real *ge = m->t[P_EMB].g + (size_t)tok[t] * D;
            for (uint32_t c = 0; c < D; c++) {
                real s = 0;
                for (uint32_t i = 0; i < n; i++) s += dX[(size_t)t * nD + (size_t)i * D + c];
                ge[c] += s * escale;
            }
        }
        engram_back(m, tok, Tr, r.e, r.vl, r.de, r.dvl, r.dek, r.dev);
    }
    *loss = total / (double)denom;
    return 0;
}
