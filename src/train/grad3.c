/* The Needle 3 forward and backward over full sequences (see grad3.h). Each step names
 * the line of cactus-needle 3.2.8 architecture.py it mirrors; the backward of a step
 * follows its forward in the same block of code. Plain C, sequence by sequence. */
#ifdef G3_REAL
#define G3_GENERIC_PRODUCTS /* another precision (the double copy of the op tests): plain loops */
#endif
#include "train/grad3.h"

#include <math.h>
#include <stdatomic.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/nmath.h"
#include "quant/mt19937.h"
#include "train/tgemm.h"
#include "util/error.h"

typedef G3_REAL real;

#define EPS 1e-6
#define ENGRAM_TAPS 4 /* architecture.ENGRAM_CONV_TAPS */
#define COND_RANK 8   /* architecture.HADA_COND_RANK */
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
    P_QT,
    P_KT,
    P_VT,
    P_QN,
    P_KN,
    P_POST_NORM,
    P_GATE,
    P_PRE_HADA,
    P_W1A,
    P_W1B,
    P_W2A,
    P_W2B,
    P_W3A,
    P_W3B,
    P_D1,
    P_D2,
    P_B2,
    P_D3,
    P_D4,
    P_CONDV,
    P_CONDU,
    P_FIXED /* engram tensors follow: 4 per site */
};
enum { E_TABLE, E_KEY, E_VALUE, E_TAPS, E_COUNT };

struct G3(model) {
    export3_config c;
    uint32_t D, n, L, H, KV, qk, vd, V, OV, taps, N, ba, bb, tables, sub, dil;
    uint32_t *perm1, *perm2;
    G3(tensor) *t;
    uint32_t nt;
    cpu_pool *pool; /* NULL: one thread */
    int a8; /* quant=True: A8 activations and per-head int8 q/K/V, straight-through */
    struct g3_prof *prof; /* a pointer: the const model of the ops still charges its time */
    const tg_level *lv;   /* the SIMD level of the products (tgemm.h) */
    struct g3_scratch *scr;
    struct g3_low_rank *lr; /* [P_WO - P_WQ + 1]: the LoRA factors of q/k/v/gate/out, if routed */
    struct run_ws *ws; /* the loss's work space, kept for the next call of the same T */
    uint32_t ws_T;
    size_t keep_budget; /* bytes of layer activations kept instead of recomputed */
};

/* Transposed operands of the products, grown as needed and kept across calls and steps
 * (no allocation per product). */
struct g3_scratch {
    float *wt, *xt;
    size_t wt_cap, xt_cap;
    const float *xt_of; /* the x whose transpose xt holds (mm_back_reuse reuses it) */
    uint32_t xt_T, xt_in;
    float *lr_buf; /* low_rank_back's operands */
    size_t lr_cap;
};

/* G3(set_low_rank) (grad3.h): a kernel's LoRA factors and where their products go */
struct g3_low_rank {
    const G3_REAL *A, *B; /* [L][in][r], [L][r][out] */
    G3_REAL *gaT, *gb;    /* [L][r][in], [L][r][out] */
    uint32_t r;
};

#ifndef G3_GENERIC_PRODUCTS
static float *scratch_grow(float **p, size_t *cap, size_t n) {
    if (n > *cap) {
        float *q = realloc(*p, n * sizeof *q);
        if (!q) return NULL;
        *p = q, *cap = n;
    }
    return *p;
}
#endif

/* ---- the profile (grad3.h) --------------------------------------------------------------- */

struct g3_prof {
    double sec[G3_PH_COUNT];
    double cpu[G3_PH_COUNT];  /* CPU seconds of every thread of the process */
    double runs[G3_PH_COUNT]; /* pool dispatches */
    double last;              /* when the current phase began */
    double last_cpu;
    uint64_t last_runs;
    int cur;
    int recomp; /* the forward phases are charged to G3_PH_RECOMP */
};

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* every thread's CPU time: what the workers burn (spinning included) while a phase runs */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t pool_runs(const G3(model) * m) {
    uint64_t runs = 0, ns = 0;
    cpu_pool_sync_stats(m->pool, &runs, &ns);
    return runs;
}

int G3(profile_phase)(const G3(model) * m, int phase) {
    if (!m) return G3_PH_OTHER; /* an op called on its own (the op tests) */
    struct g3_prof *p = m->prof;
    if (p->recomp && phase >= G3_PH_F_PROD && phase <= G3_PH_F_ENGRAM) phase = G3_PH_RECOMP;
    const double now = wall_s(), cpu = cpu_s();
    const uint64_t runs = pool_runs(m);
    p->sec[p->cur] += now - p->last;
    p->cpu[p->cur] += cpu - p->last_cpu;
    p->runs[p->cur] += (double)(runs - p->last_runs);
    p->last = now;
    p->last_cpu = cpu;
    p->last_runs = runs;
    const int old = p->cur;
    p->cur = phase;
    return old;
}

void G3(profile_reset)(G3(model) * m) {
    memset(m->prof, 0, sizeof *m->prof);
    m->prof->last = wall_s();
    m->prof->last_cpu = cpu_s();
    m->prof->last_runs = pool_runs(m);
}

const double *G3(profile)(const G3(model) * m) {
    G3(profile_phase)(m, m->prof->cur);
    return m->prof->sec;
}

const double *G3(profile_cpu)(const G3(model) * m) {
    G3(profile_phase)(m, m->prof->cur);
    return m->prof->cpu;
}

const double *G3(profile_runs)(const G3(model) * m) {
    G3(profile_phase)(m, m->prof->cur);
    return m->prof->runs;
}

const char *G3(profile_name)(int phase) {
    static const char *const names[G3_PH_COUNT] = {
        "other (norms, residuals, copies)", "CQ quantize (weights)", "LoRA merge / restore",
        "fwd products", "fwd attention", "fwd Monarch MLP", "fwd mHC lanes", "fwd engram",
        "logits + CE (fwd+bwd)", "recompute (fwd again)", "bwd products", "bwd attention",
        "bwd Monarch MLP", "bwd mHC lanes", "bwd engram", "LoRA dA / dB"};
    return phase >= 0 && phase < G3_PH_COUNT ? names[phase] : "?";
}

static void ws_release(G3(model) * m);
static uint32_t kept_layers(const G3(model) * m, uint32_t T);

void G3(set_fake_quant)(G3(model) * m, int on) { m->a8 = on != 0; }

void G3(set_keep_budget)(G3(model) * m, size_t bytes) {
    if (bytes == m->keep_budget) return;
    m->keep_budget = bytes;
    ws_release(m); /* the work space is laid out for the old budget */
}

uint32_t G3(kept_layers)(const G3(model) * m, uint32_t T) { return T ? kept_layers(m, T) : 0; }

void G3(run_parallel)(const G3(model) * m, void (*fn)(void *arg, int i, int n), void *arg) {
    if (m && m->pool)
        cpu_pool_run(m->pool, fn, arg);
    else
        fn(arg, 0, 1);
}

void G3(run_shared)(const G3(model) * m, void (*fn)(void *arg, int i, int n), void *arg) {
    if (m && m->pool)
        cpu_pool_run_shared(m->pool, fn, arg);
    else
        fn(arg, 0, 1);
}

/* A step runs serial stretches (norms, the head's rows, the engram) between its parallel
 * ones: a worker polling through them burns its core for nothing (measured: 2 threads
 * took ~1.5 CPU-s more per step than 1). Products follow each other within microseconds,
 * so a short poll keeps those hand-offs cheap. NEEDLE_TRAIN_IDLE_US overrides it (for
 * measuring). */
#define G3_IDLE_WAIT_US 100
static int64_t idle_wait_us(void) {
    const char *e = getenv("NEEDLE_TRAIN_IDLE_US");
    return e && *e ? strtoll(e, NULL, 10) : G3_IDLE_WAIT_US;
}

int G3(set_threads)(G3(model) * m, int n) {
    ws_release(m); /* its attention scratch is per thread */
    cpu_pool_free(m->pool);
    m->pool = NULL;
    m->lv = tg_level_best();
    if (n == 1) return 0;
    const int st = cpu_pool_create(n, cpu_kernels_best(), 0, &m->pool);
    if (!st) cpu_pool_set_idle_wait(m->pool, idle_wait_us());
    return st;
}

/* fq8, the portable products (mm_job, mm_worker) and the ZC norm, shared with the other
 * generation's core */
#ifdef G3_REAL_FLOAT
#define TRAIN_REAL_FLOAT 1
#endif
#include "train/dense_ref.h"

#define LW(m, id, l) ((m)->t[id].w + (size_t)(l) * ((m)->t[id].numel / (m)->L))
#define LG(m, id, l) ((m)->t[id].g + (size_t)(l) * ((m)->t[id].numel / (m)->L))
#define ET(m, s, k) (&(m)->t[P_FIXED + (s) * E_COUNT + (k)])
/* the gradient a dense product accumulates into, NULL for a frozen weight or one whose
 * LoRA factors take the low-rank route (low_rank_back) */
#define DW(t) ((t)->frozen ? NULL : (t)->g)
#define LOW_RANK(m, id) ((m)->lr && (m)->lr[(id) - P_WQ].A)
#define LGD(m, id, l) ((m)->t[id].frozen || LOW_RANK(m, id) ? NULL : LG(m, id, l))

/* ---- small dense helpers ------------------------------------------------------------ */

#ifndef G3_GENERIC_PRODUCTS
typedef struct tg_job {
    const tg_level *lv;
    tg_gemm g;
    uint32_t items;
    atomic_uint next; /* the next work item (tgemm.h tg_item) */
} tg_job;

static void tg_worker(void *arg, int i, int n) {
    tg_job *j = arg;
    (void)i, (void)n;
    for (;;) {
        const uint32_t k = atomic_fetch_add_explicit(&j->next, 1u, memory_order_relaxed);
        if (k >= j->items) break;
        tg_item(j->lv, &j->g, k);
    }
}

/* One product on the pool: the threads take work items from a shared counter
 * (cpu_pool_run_shared), so a worker the OS has descheduled on a busy machine leaves
 * its items to the others instead of holding up the product. */
static void run_tg(const G3(model) * m, const tg_gemm *g) {
    tg_job j;
    j.lv = m->lv, j.g = *g, j.items = tg_item_count(g);
    atomic_init(&j.next, 0u);
    if (m->pool && j.items > 1)
        cpu_pool_run_shared(m->pool, tg_worker, &j);
    else if (j.items)
        m->lv->block(g, 0, g->M, 0, g->N);
}

#endif

static void run_job(const G3(model) * m, mm_job *j) {
    if (m && m->pool)
        cpu_pool_run(m->pool, mm_worker, j);
    else
        mm_worker(j, 0, 1);
}

/* y[T][out] = x[T][in] @ W[in][out] */
static void mm(const G3(model) * m, const real *x, const real *W, real *y, uint32_t T, uint32_t in, uint32_t out) {
    const int was = G3(profile_phase)(m, G3_PH_F_PROD);
#ifdef G3_GENERIC_PRODUCTS
    mm_job j = {x, W, NULL, y, NULL, NULL, T, in, out, 0};
    run_job(m, &j);
#else
    const tg_gemm g = {x, W, y, in, out, out, T, out, in, 0};
    run_tg(m, &g);
#endif
    G3(profile_phase)(m, was);
}

/* dx += dy @ W^T (dx may be NULL), dW += x^T @ dy (dW NULL: a frozen weight); same_x: x
 * is unchanged since the previous mm_back on it, whose transpose is still in the scratch
 * (q/k/v/gate share one input, the three mHC projections another) */
static void mm_back_reuse(const G3(model) * m, const real *x, const real *W, const real *dy, real *dx, real *dW,
                      uint32_t T, uint32_t in, uint32_t out, int same_x) {
    const int was = G3(profile_phase)(m, G3_PH_B_PROD);
#ifdef G3_GENERIC_PRODUCTS
    (void)same_x;
    mm_job j = {x, W, dy, NULL, dx, dW, T, in, out, 1};
    run_job(m, &j);
#else
    struct g3_scratch *s = m->scr;
    float *wt = dx ? scratch_grow(&s->wt, &s->wt_cap, (size_t)in * out) : NULL;
    const int have_xt = same_x && s->xt_of == x && s->xt_T == T && s->xt_in == in;
    if (!same_x) s->xt_of = NULL; /* any other product breaks the chain of reuses */
    float *xt = dW ? scratch_grow(&s->xt, &s->xt_cap, (size_t)in * T) : NULL;
    if ((dx && !wt) || (dW && !xt)) { /* no memory for a transpose: the plain loops */
        s->xt_of = NULL;
        mm_job j = {x, W, dy, NULL, dx, dW, T, in, out, 1};
        run_job(m, &j);
    } else {
        if (dx) { /* dx += dy W^T */
            tg_transpose(W, out, wt, in, in, out);
            const tg_gemm g = {dy, wt, dx, out, in, in, T, in, out, 1};
            run_tg(m, &g);
        }
        if (dW) { /* dW += x^T dy */
            if (!have_xt) tg_transpose(x, in, xt, T, T, in);
            s->xt_of = x, s->xt_T = T, s->xt_in = in;
            const tg_gemm g = {xt, dy, dW, T, out, out, in, out, T, 1};
            run_tg(m, &g);
        }
    }
#endif
    G3(profile_phase)(m, was);
}

static void mm_back(const G3(model) * m, const real *x, const real *W, const real *dy, real *dx, real *dW,
                    uint32_t T, uint32_t in, uint32_t out) {
    mm_back_reuse(m, x, W, dy, dx, dW, T, in, out, 0);
}

/* The low-rank route of adapted kernel `id` at layer l (G3(set_low_rank)): instead of
 * dW += x^T dy (2 T in out flops), gaT += (dy B^T)^T x and gb += (x A)^T dy (4 T r (in +
 * out)): the only uses of dW are dW B^T and A^T dW. Operands with r rows or columns are
 * transposed, never x or dy. No-op for a kernel not routed. */
static void low_rank_back(const G3(model) * m, uint32_t id, uint32_t l, const real *x, const real *dy, uint32_t T,
                          uint32_t in, uint32_t out) {
    if (!LOW_RANK(m, id)) return;
    const struct g3_low_rank *q = &m->lr[id - P_WQ];
    const uint32_t r = q->r;
    const real *A = q->A + (size_t)l * in * r, *Bm = q->B + (size_t)l * r * out;
    real *gaT = q->gaT + (size_t)l * r * in, *gb = q->gb + (size_t)l * r * out;
    const int was = G3(profile_phase)(m, G3_PH_B_PROD);
#ifdef G3_GENERIC_PRODUCTS
    for (uint32_t t = 0; t < T; t++) {
        const real *xt = x + (size_t)t * in, *dyt = dy + (size_t)t * out;
        for (uint32_t k = 0; k < r; k++) {
            real u = 0, xa = 0;
            for (uint32_t o = 0; o < out; o++) u += dyt[o] * Bm[(size_t)k * out + o];
            for (uint32_t i = 0; i < in; i++) xa += xt[i] * A[(size_t)i * r + k];
            for (uint32_t i = 0; i < in; i++) gaT[(size_t)k * in + i] += u * xt[i];
            for (uint32_t o = 0; o < out; o++) gb[(size_t)k * out + o] += xa * dyt[o];
        }
    }
#else
    struct g3_scratch *s = m->scr;
    float *bt = scratch_grow(&s->lr_buf, &s->lr_cap, (size_t)out * r + 2 * (size_t)T * r);
    if (!bt) { /* no memory for the operands: the same sums as plain loops */
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t k = 0; k < r; k++) {
                float u = 0, xa = 0;
                for (uint32_t o = 0; o < out; o++) u += dy[(size_t)t * out + o] * Bm[(size_t)k * out + o];
                for (uint32_t i = 0; i < in; i++) xa += x[(size_t)t * in + i] * A[(size_t)i * r + k];
                for (uint32_t i = 0; i < in; i++) gaT[(size_t)k * in + i] += u * x[(size_t)t * in + i];
                for (uint32_t o = 0; o < out; o++) gb[(size_t)k * out + o] += xa * dy[(size_t)t * out + o];
            }
    } else {
        float *u = bt + (size_t)out * r, *ut = u + (size_t)T * r;
        tg_transpose(Bm, out, bt, r, r, out); /* bt [out][r] */
        const tg_gemm g1 = {dy, bt, u, out, r, r, T, r, out, 0}; /* u = dy B^T [T][r] */
        run_tg(m, &g1);
        tg_transpose(u, r, ut, T, T, r);
        const tg_gemm g2 = {ut, x, gaT, T, in, in, r, in, T, 1}; /* gaT += u^T x */
        run_tg(m, &g2);
        const tg_gemm g3 = {x, A, u, in, r, r, T, r, in, 0}; /* u = x A [T][r] */
        run_tg(m, &g3);
        tg_transpose(u, r, ut, T, T, r);
        const tg_gemm g4 = {ut, dy, gb, T, out, out, r, out, T, 1}; /* gb += (x A)^T dy */
        run_tg(m, &g4);
    }
#endif
    G3(profile_phase)(m, was);
}

#ifdef G3_GENERIC_PRODUCTS
/* One token's _kron_apply and its backward: the oracle of the op test (test_train_ops),
 * whose model-level checks cover kron_all / kron_back_all below. */
/* architecture._kron_apply: z[a][b] -> A^T z B (A [a][a], B [b][b]) */
static void kron_fwd(const real *z, const real *A, const real *Bm, uint32_t a, uint32_t b, real *tmp,
                     real *out) {
    /* tmp = z B */
    for (uint32_t i = 0; i < a; i++)
        for (uint32_t l = 0; l < b; l++) {
            real s = 0;
            for (uint32_t j = 0; j < b; j++) s += z[i * b + j] * Bm[j * b + l];
            tmp[i * b + l] = s;
        }
    for (uint32_t k = 0; k < a; k++)
        for (uint32_t l = 0; l < b; l++) {
            real s = 0;
            for (uint32_t i = 0; i < a; i++) s += A[i * a + k] * tmp[i * b + l];
            out[k * b + l] = s;
        }
}

/* dz += A dO B^T, dA += (z B) dO^T, dB += (A^T z)^T dO */
static void kron_back(const real *z, const real *A, const real *Bm, uint32_t a, uint32_t b, const real *dO,
                      real *tmp, real *dz, real *dA, real *dB) {
    /* tmp = z B */
    for (uint32_t i = 0; i < a; i++)
        for (uint32_t l = 0; l < b; l++) {
            real s = 0;
            for (uint32_t j = 0; j < b; j++) s += z[i * b + j] * Bm[j * b + l];
            tmp[i * b + l] = s;
        }
    for (uint32_t i = 0; i < a; i++)
        for (uint32_t k = 0; k < a; k++) {
            real s = 0;
            for (uint32_t l = 0; l < b; l++) s += tmp[i * b + l] * dO[k * b + l];
            dA[i * a + k] += s;
        }
    /* tmp = A^T z */
    for (uint32_t k = 0; k < a; k++)
        for (uint32_t j = 0; j < b; j++) {
            real s = 0;
            for (uint32_t i = 0; i < a; i++) s += A[i * a + k] * z[i * b + j];
            tmp[k * b + j] = s;
        }
    for (uint32_t j = 0; j < b; j++)
        for (uint32_t l = 0; l < b; l++) {
            real s = 0;
            for (uint32_t k = 0; k < a; k++) s += tmp[k * b + j] * dO[k * b + l];
            dB[j * b + l] += s;
        }
    /* dz = A dO B^T: tmp = dO B^T, then A tmp */
    for (uint32_t k = 0; k < a; k++)
        for (uint32_t j = 0; j < b; j++) {
            real s = 0;
            for (uint32_t l = 0; l < b; l++) s += dO[k * b + l] * Bm[j * b + l];
            tmp[k * b + j] = s;
        }
    for (uint32_t i = 0; i < a; i++)
        for (uint32_t j = 0; j < b; j++) {
            real s = 0;
            for (uint32_t k = 0; k < a; k++) s += A[i * a + k] * tmp[k * b + j];
            dz[i * b + j] += s;
        }
}

#endif

/* ---- per-sequence work space ---------------------------------------------------------- */

typedef struct seq_ws {
    /* lane step */
    real *nx, *nxr, *hpre, *hpost, *hres, *sk, *u, *y;
    /* block */
    real *x0, *alpha, *ru, *rk, *uu, *ku, *a, *ar;
    real *ql, *kl, *vl, *qc, *kc, *v, *qn, *kn, *qnr, *knr, *qr, *kr, *P, *o, *gl, *go, *ao;
    real *pn, *pnr, *x1, *m, *mr, *cs, *csm, *cond, *z0, *z1, *z1p, *h, *hs, *z2, *z2p, *z3, *z4;
    real *bo;
    real *prj; /* [T][2n + n*n]: nx @ phi_pre, phi_post, phi_res */
    /* backward */
    real *dys, *dus, *dzs;
    real *d1, *d2, *d3, *d4, *d5, *d6, *d7, *tmp;
    real *rope_c, *rope_s;
    real *k1, *k2, *k3, *k4; /* [T][N] each: the Kronecker products of all tokens */
    real *dPs, *PT;          /* [threads][T][T] each: one head's dP / dS and a transpose per thread */
    real *dvh, *dkh;         /* [H][T][vd], [H][T][qk]: each head's part of dv, dk */
} seq_ws;

/* fn(ctx, i0, i1) over [0, n) in chunks of `chunk` that the pool's threads take from a
 * shared counter (a descheduled worker leaves its chunks to the others). Each index's
 * arithmetic is the same whoever runs it, so the result does not depend on the thread
 * count; the per-token loops of the Monarch MLP run this way instead of on one thread
 * while the other waits. */
typedef struct range_job {
    void (*fn)(void *ctx, uint32_t i0, uint32_t i1);
    void *ctx;
    uint32_t n, chunk;
    atomic_uint next;
} range_job;

static void range_worker(void *arg, int i, int n) {
    range_job *j = arg;
    (void)i, (void)n;
    for (;;) {
        const uint32_t c = atomic_fetch_add_explicit(&j->next, 1u, memory_order_relaxed);
        if ((uint64_t)c * j->chunk >= j->n) break;
        const uint32_t i0 = c * j->chunk, i1 = j->n - i0 < j->chunk ? j->n : i0 + j->chunk;
        j->fn(j->ctx, i0, i1);
    }
}

static void run_ranges(const G3(model) * m, uint32_t n, uint32_t chunk, void (*fn)(void *ctx, uint32_t i0, uint32_t i1),
                       void *ctx) {
    if (!m || !m->pool || n <= chunk) {
        fn(ctx, 0, n);
        return;
    }
    range_job j;
    j.fn = fn, j.ctx = ctx, j.n = n, j.chunk = chunk;
    atomic_init(&j.next, 0u);
    G3(run_shared)(m, range_worker, &j);
}

#define RANGE_TOKENS 16 /* tokens per chunk of a per-token loop */
#define RANGE_COLS 64   /* columns per chunk of a column sum */

typedef struct transpose_ctx {
    const real *src;
    real *dst;
    uint32_t r, c;
} transpose_ctx;

static void transpose_range(void *ctx, uint32_t t0, uint32_t t1) {
    const transpose_ctx *x = ctx;
    const uint32_t r = x->r, c = x->c;
    for (uint32_t t = t0; t < t1; t++) {
        const real *s = x->src + (size_t)t * r * c;
        real *d = x->dst + (size_t)t * r * c;
        for (uint32_t i = 0; i < r; i++)
            for (uint32_t j = 0; j < c; j++) d[(size_t)j * r + i] = s[(size_t)i * c + j];
    }
}

/* src [T][r][c] -> dst [T][c][r], tokens over the pool */
static void tok_transpose(const G3(model) * m, const real *src, real *dst, uint32_t T, uint32_t r, uint32_t c) {
    transpose_ctx x = {src, dst, r, c};
    run_ranges(m, T, RANGE_TOKENS, transpose_range, &x);
}

typedef struct colsum_ctx {
    const real *p;
    size_t ld;
    uint32_t T;
    real *g;
} colsum_ctx;

static void colsum_range(void *ctx, uint32_t j0, uint32_t j1) {
    const colsum_ctx *x = ctx;
    for (uint32_t t = 0; t < x->T; t++)
        for (uint32_t j = j0; j < j1; j++) x->g[j] += x->p[(size_t)t * x->ld + j];
}

/* g[j] += p[t][j] for t = 0, 1, ..., T-1 in that order, columns over the pool: the sums a
 * per-token loop accumulating into g made, with the terms computed apart (in parallel) */
static void col_sum(const G3(model) * m, const real *p, size_t ld, uint32_t T, uint32_t ncols, real *g) {
    colsum_ctx x = {p, ld, T, g};
    run_ranges(m, ncols, RANGE_COLS, colsum_range, &x);
}

static void mm(const G3(model) * m, const real *x, const real *W, real *y, uint32_t T, uint32_t in, uint32_t out);
static void mm_back(const G3(model) * m, const real *x, const real *W, const real *dy, real *dx, real *dW,
                    uint32_t T, uint32_t in, uint32_t out);

/* _kron_apply for every token: out_t = A^T z_t B (z, out [T][a][b]) as two products over
 * all tokens: z B on the T*a rows, then (z B)_t^T A on the T*b rows of the per-token
 * transposes. k1, k2: [T][a*b] scratch. */
static void kron_all(const G3(model) * m, const real *z, const real *A, const real *Bm, uint32_t T, real *out,
                     real *k1, real *k2) {
    const uint32_t a = m->ba, b = m->bb;
    mm(m, z, Bm, k1, T * a, b, b);
    tok_transpose(m, k1, k2, T, a, b);
    mm(m, k2, A, k1, T * b, a, a);
    tok_transpose(m, k1, out, T, b, a);
}

/* Backward of kron_all: dz += A dO_t B^T, dA += sum_t (z_t B) dO_t^T, dB += sum_t
 * (A^T z_t)^T dO_t, as four products over all tokens (scratch w->k1..k4) */
static void kron_back_all(const G3(model) * m, const real *z, const real *A, const real *Bm, uint32_t T,
                          const real *dO, real *dz, real *dA, real *dB, seq_ws *w) {
    const uint32_t a = m->ba, b = m->bb;
    mm(m, z, Bm, w->k1, T * a, b, b);       /* z B */
    tok_transpose(m, w->k1, w->k2, T, a, b);   /* (z B)^T per token: [T*b][a] */
    tok_transpose(m, dO, w->k3, T, a, b);      /* dO^T per token */
    memset(w->k4, 0, (size_t)T * a * b * sizeof *w->k4);
    mm_back(m, w->k2, A, w->k3, w->k4, dA, T * b, a, a); /* (A dO)^T, dA */
    tok_transpose(m, w->k4, w->k1, T, b, a);   /* A dO: [T*a][b] */
    mm_back(m, z, Bm, w->k1, dz, dB, T * a, b, b);
}

/* ---- the layer ---------------------------------------------------------------------- */

typedef struct g3_seq {
    uint32_t T;
    const real *ek, *ev; /* [sites][T][D] */
    real *dek, *dev;
} g3_seq;

static int site_of(const G3(model) * m, uint32_t l) {
    for (uint32_t s = 0; s < m->c.num_sites; s++)
        if (m->c.engram_layers[s] == l) return (int)s;
    return -1;
}

static int is_global(const G3(model) * m, uint32_t l) {
    for (uint32_t i = 0; i < m->c.num_global; i++)
        if (m->c.global_layers[i] == l) return 1;
    return 0;
}

/* Token-local work of a layer spread over the pool (run_ranges, RANGE_TOKENS positions a
 * chunk); each position's arithmetic is the same whoever runs it. */
typedef struct tok_job {
    const G3(model) * m;
    uint32_t l, T;
    seq_ws *w;
    const real *Xin, *dXo;
    real *Xout;
    const g3_seq *sq;
    int site;
    void (*body)(const struct tok_job *j, uint32_t t);
} tok_job;

static void tok_range(void *ctx, uint32_t t0, uint32_t t1) {
    const tok_job *j = ctx;
    for (uint32_t t = t0; t < t1; t++) j->body(j, t);
}

static void run_tokens(tok_job *j, void (*body)(const tok_job *j, uint32_t t)) {
    j->body = body;
    run_ranges(j->m, j->T, RANGE_TOKENS, tok_range, j);
}

#ifndef G3_GENERIC_PRODUCTS
/* One sequence's attention, a head per work item (see block_fwd / block_back). */
typedef struct attn_job {
    const G3(model) * m;
    seq_ws *w;
    uint32_t T, win;
    real sc;
    const real *dO; /* the backward: dO [T][O] in, dq [T][Q] accumulated */
    real *dqr;
    atomic_uint next;
} attn_job;


/* C = A B on this thread alone */
static void gemm1(const G3(model) * m, const float *A, size_t lda, const float *B, size_t ldb, float *C, size_t ldc,
                  uint32_t M, uint32_t N, uint32_t K, int acc) {
    const tg_gemm g = {A, B, C, lda, ldb, ldc, M, N, K, acc};
    m->lv->block(&g, 0, M, 0, N);
}

/* The causal attention products by blocks of CAUSAL_ROWS rows. A row t of P (and of dS) is
 * 0 past column t, so: CAUSAL_COLS, rows [r0, r1) of a product that makes such rows need
 * columns < r1 only (the masking loops write the rest of each row); CAUSAL_TAIL, a chain
 * over s along such a row stops at r1 (the terms it drops add exact zeros to the sum);
 * CAUSAL_HEAD, a chain over t down a column s >= r0 of such a matrix starts at r0 (the
 * terms before it are +0 products into a sum that is still +0). About half the flops of
 * the full T x T. */
#define CAUSAL_ROWS 48u
enum { CAUSAL_COLS, CAUSAL_TAIL, CAUSAL_HEAD };

static void gemm_causal(const G3(model) * m, int mode, const float *A, size_t lda, const float *B, size_t ldb,
                        float *C, size_t ldc, uint32_t T, uint32_t N, uint32_t K, int acc) {
    for (uint32_t r0 = 0; r0 < T; r0 += CAUSAL_ROWS) {
        const uint32_t r1 = T - r0 < CAUSAL_ROWS ? T : r0 + CAUSAL_ROWS;
        const float *a = A + (size_t)r0 * lda;
        float *c = C + (size_t)r0 * ldc;
        if (mode == CAUSAL_COLS)
            gemm1(m, a, lda, B, ldb, c, ldc, r1 - r0, r1, K, acc);
        else if (mode == CAUSAL_TAIL)
            gemm1(m, a, lda, B, ldb, c, ldc, r1 - r0, N, r1, acc);
        else
            gemm1(m, a + r0, lda, B + (size_t)r0 * ldb, ldb, c, ldc, r1 - r0, N, T - r0, acc);
    }
}

TG_CLONES static void attn_fwd_worker(void *arg, int i, int n) {
    attn_job *j = arg;
    const G3(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t T = j->T, win = j->win, H = m->H, KV = m->KV, qk = m->qk, vd = m->vd;
    const uint32_t Q = H * qk, VV = KV * vd, O = H * vd;
    (void)i, (void)n;
    for (;;) {
        const uint32_t h = atomic_fetch_add_explicit(&j->next, 1u, memory_order_relaxed);
        if (h >= H) break;
        const uint32_t g = h / (H / KV);
        real *Ph = w->P + (size_t)h * T * T;
        gemm_causal(m, CAUSAL_COLS, w->qr + h * qk, Q, w->k1 + (size_t)g * qk * T, T, Ph, T, T, T, qk, 0);
        for (uint32_t t = 0; t < T; t++) {
            real *P = Ph + (size_t)t * T;
            const uint32_t s0 = (win && t + 1 > win) ? t + 1 - win : 0;
            real mx = -INFINITY;
            for (uint32_t s = 0; s < T; s++) {
                if (s < s0 || s > t) {
                    P[s] = 0;
                    continue;
                }
                P[s] *= j->sc;
                if (P[s] > mx) mx = P[s];
            }
            const real z = exp_sum(P + s0, t + 1 - s0, mx, P + s0);
            for (uint32_t s = s0; s <= t; s++) P[s] /= z;
        }
        gemm_causal(m, CAUSAL_TAIL, Ph, T, w->v + g * vd, VV, w->o + h * vd, O, T, vd, T, 0);
    }
}

TG_CLONES static void attn_back_worker(void *arg, int i, int n) {
    attn_job *j = arg;
    const G3(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t T = j->T, win = j->win, H = m->H, KV = m->KV, qk = m->qk, vd = m->vd;
    const uint32_t Q = H * qk, K = KV * qk, O = H * vd;
    (void)n;
    real *dS = w->dPs + (size_t)i * T * T, *tr = w->PT + (size_t)i * T * T; /* this thread's */
    for (;;) {
        const uint32_t h = atomic_fetch_add_explicit(&j->next, 1u, memory_order_relaxed);
        if (h >= H) break;
        const uint32_t g = h / (H / KV);
        const real *Ph = w->P + (size_t)h * T * T, *dO = j->dO + h * vd;
        gemm_causal(m, CAUSAL_COLS, dO, O, w->k2 + (size_t)g * vd * T, T, dS, T, T, T, vd, 0);
        tg_transpose(Ph, T, tr, T, T, T);
        gemm_causal(m, CAUSAL_HEAD, tr, T, dO, O, w->dvh + (size_t)h * T * vd, vd, T, vd, T, 0);
        for (uint32_t t = 0; t < T; t++) {
            const real *P = Ph + (size_t)t * T;
            real *d = dS + (size_t)t * T;
            const uint32_t s0 = (win && t + 1 > win) ? t + 1 - win : 0;
            real sum = 0;
            for (uint32_t s = s0; s <= t; s++) sum += d[s] * P[s];
            for (uint32_t s = 0; s < T; s++) d[s] = (s < s0 || s > t) ? 0 : P[s] * (d[s] - sum) * j->sc;
        }
        gemm_causal(m, CAUSAL_TAIL, dS, T, w->kr + g * qk, K, j->dqr + h * qk, Q, T, qk, T, 1);
        tg_transpose(dS, T, tr, T, T, T);
        gemm_causal(m, CAUSAL_HEAD, tr, T, w->qr + h * qk, Q, w->dkh + (size_t)h * T * qk, qk, T, qk, T, 0);
    }
}
#endif

/* block_fwd's token-local steps (run_tokens) */

/* engram: x + sigmoid(<rms_unit(x), rms_unit(ek)> / sqrt(D)) * ev; then the attention
 * input norm (MultiHeadAttention: x = _aq(x, quant)) */
TG_CLONES static void block_in_tok(const tok_job *j, uint32_t t) {
    const G3(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t T = j->T, D = m->D;
    const int site = j->site;
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
    w->ar[t] = zc_fwd(w->x0 + (size_t)t * D, LW(m, P_NORM_IN, j->l), D, w->a + (size_t)t * D);
    if (m->a8) fq8(w->a + (size_t)t * D, D);
}

/* the conv taps over the projections, q_norm / k_norm per head, RoPE (rotate-half), and
 * the int8 q/K/V of quant=True */
TG_CLONES static void block_qkv_tok(const tok_job *j, uint32_t t) {
    const G3(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t l = j->l, H = m->H, KV = m->KV, qk = m->qk, vd = m->vd;
    const uint32_t Q = H * qk, K = KV * qk, VV = KV * vd;
    const uint32_t nt = m->taps;
    const real *qt = nt ? LW(m, P_QT, l) : NULL, *kt = nt ? LW(m, P_KT, l) : NULL,
               *vt = nt ? LW(m, P_VT, l) : NULL;
    for (uint32_t c = 0; c < Q; c++) {
        real s = nt ? 0 : w->ql[(size_t)t * Q + c];
        for (uint32_t i = 0; i < nt && i <= t; i++) s += qt[i * Q + c] * w->ql[(size_t)(t - i) * Q + c];
        w->qc[(size_t)t * Q + c] = s;
    }
    for (uint32_t c = 0; c < K; c++) {
        real s = nt ? 0 : w->kl[(size_t)t * K + c];
        for (uint32_t i = 0; i < nt && i <= t; i++) s += kt[i * K + c] * w->kl[(size_t)(t - i) * K + c];
        w->kc[(size_t)t * K + c] = s;
    }
    for (uint32_t c = 0; c < VV; c++) {
        real s = nt ? 0 : w->vl[(size_t)t * VV + c];
        for (uint32_t i = 0; i < nt && i <= t; i++) s += vt[i * VV + c] * w->vl[(size_t)(t - i) * VV + c];
        w->v[(size_t)t * VV + c] = s;
    }
    const uint32_t half = qk / 2;
    const real *c = w->rope_c + (size_t)t * half, *sn = w->rope_s + (size_t)t * half;
    for (uint32_t h = 0; h < H + KV; h++) {
        const int isq = h < H;
        const uint32_t hh = isq ? h : h - H;
        const real *src = isq ? w->qc + (size_t)t * Q + hh * qk : w->kc + (size_t)t * K + hh * qk;
        real *nn = isq ? w->qn + (size_t)t * Q + hh * qk : w->kn + (size_t)t * K + hh * qk;
        real *rr = isq ? w->qr + (size_t)t * Q + hh * qk : w->kr + (size_t)t * K + hh * qk;
        const real r = zc_fwd(src, LW(m, isq ? P_QN : P_KN, l), qk, nn);
        if (isq)
            w->qnr[(size_t)t * H + hh] = r;
        else
            w->knr[(size_t)t * KV + hh] = r;
        for (uint32_t i = 0; i < half; i++) {
            rr[i] = nn[i] * c[i] - nn[i + half] * sn[i];
            rr[i + half] = nn[i + half] * c[i] + nn[i] * sn[i];
        }
        if (m->a8) fq8(rr, qk); /* maybe_quant_query / maybe_quant_kv */
    }
    if (m->a8)
        for (uint32_t g = 0; g < KV; g++) fq8(w->v + (size_t)t * VV + g * vd, vd);
}

/* the output gate: out = _aq(o * sigmoid(gate_proj), quant) */
TG_CLONES static void block_gate_tok(const tok_job *j, uint32_t t) {
    const G3(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t O = m->H * m->vd;
    for (size_t i = (size_t)t * O; i < (size_t)(t + 1) * O; i++) w->go[i] = w->o[i] * sigm(w->gl[i]);
    if (m->a8) fq8(w->go + (size_t)t * O, O);
}

/* post_attn_norm, gated residual, pre_hada_norm */
TG_CLONES static void block_resid_tok(const tok_job *j, uint32_t t) {
    const G3(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t l = j->l, D = m->D;
    const real gate = sigm(LW(m, P_GATE, l)[0]);
    w->pnr[t] = zc_fwd(w->ao + (size_t)t * D, LW(m, P_POST_NORM, l), D, w->pn + (size_t)t * D);
    for (uint32_t i = 0; i < D; i++)
        w->x1[(size_t)t * D + i] = w->x0[(size_t)t * D + i] + gate * w->pn[(size_t)t * D + i];
    w->mr[t] = zc_fwd(w->x1 + (size_t)t * D, LW(m, P_PRE_HADA, l), D, w->m + (size_t)t * D);
}

/* The per-token steps of the HadamardMLP (block_fwd, block_back), over token ranges */
typedef struct hada_ctx {
    const G3(model) * m;
    seq_ws *w;
    uint32_t l;
    const real *dbo; /* the backward's input */
} hada_ctx;

/* softmax(m cond_v) and z0 = d1 m (zero-padded to N) */
static void hada_fwd_in(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t D = m->D, N = m->N;
    const real *d1 = LW(m, P_D1, x->l);
    for (uint32_t t = t0; t < t1; t++) {
        real *cs = w->cs + (size_t)t * COND_RANK, *sm = w->csm + (size_t)t * COND_RANK;
        real mx = cs[0], z = 0;
        for (uint32_t r = 1; r < COND_RANK; r++)
            if (cs[r] > mx) mx = cs[r];
        for (uint32_t r = 0; r < COND_RANK; r++) z += (sm[r] = rexp(cs[r] - mx));
        for (uint32_t r = 0; r < COND_RANK; r++) sm[r] /= z;
        for (uint32_t j = 0; j < N; j++) w->z0[(size_t)t * N + j] = j < D ? d1[j] * w->m[(size_t)t * D + j] : 0;
    }
}

/* cond += 1, the first permutation, h = d2 cond z1p + b2, hs = silu(h) */
TG_CLONES static void hada_fwd_act(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t N = m->N;
    const real *d2 = LW(m, P_D2, x->l), *b2 = LW(m, P_B2, x->l);
    for (uint32_t t = t0; t < t1; t++) {
        const real *z1 = w->z1 + (size_t)t * N;
        real *cond = w->cond + (size_t)t * N;
        real *z1p = w->z1p + (size_t)t * N, *h = w->h + (size_t)t * N, *hs = w->hs + (size_t)t * N;
        for (uint32_t j = 0; j < N; j++) cond[j] += 1;
        for (uint32_t j = 0; j < N; j++) z1p[j] = z1[m->perm1[j]];
        for (uint32_t j = 0; j < N; j++) {
            h[j] = d2[j] * cond[j] * z1p[j] + b2[j];
            hs[j] = h[j] * sigm(h[j]);
        }
    }
}

static void hada_fwd_perm2(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t N = m->N;
    const real *d3 = LW(m, P_D3, x->l);
    for (uint32_t t = t0; t < t1; t++)
        for (uint32_t j = 0; j < N; j++) w->z2p[(size_t)t * N + j] = d3[j] * w->z2[(size_t)t * N + m->perm2[j]];
}

static void hada_fwd_out(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t D = m->D, N = m->N;
    const real *d4 = LW(m, P_D4, x->l);
    for (uint32_t t = t0; t < t1; t++)
        for (uint32_t i = 0; i < D; i++)
            w->bo[(size_t)t * D + i] = w->x1[(size_t)t * D + i] + d4[i] * w->z3[(size_t)t * N + i];
}

/* dz3 = d4 dbo (zero-padded to N); k3 = the per-token terms of gd4 */
static void hada_back_out(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t D = m->D, N = m->N;
    const real *d4 = LW(m, P_D4, x->l);
    real *dz3 = w->d3;
    for (uint32_t t = t0; t < t1; t++)
        for (uint32_t j = 0; j < N; j++) {
            const real g = j < D ? x->dbo[(size_t)t * D + j] : 0;
            if (j < D) w->k3[(size_t)t * N + j] = g * w->z3[(size_t)t * N + j];
            dz3[(size_t)t * N + j] = j < D ? g * d4[j] : 0;
        }
}

/* dz2 (d5) from dz2p (d4) through the second permutation; k3 = the terms of gd3 */
TG_CLONES static void hada_back_perm2(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t N = m->N;
    const real *d3 = LW(m, P_D3, x->l);
    for (uint32_t t = t0; t < t1; t++) {
        const real *z2 = w->z2 + (size_t)t * N, *g = w->d4 + (size_t)t * N;
        real *d = w->d5 + (size_t)t * N, *p = w->k3 + (size_t)t * N;
        memset(d, 0, N * sizeof *d);
        for (uint32_t j = 0; j < N; j++) {
            p[j] = g[j] * z2[m->perm2[j]];
            d[m->perm2[j]] += g[j] * d3[j];
        }
    }
}

/* through silu and h = d2 cond z1p + b2: dcond (d5), dz1 (d4) from dhs (d3); k3, k4 = the
 * terms of gb2, gd2 */
TG_CLONES static void hada_back_act(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t N = m->N;
    const real *d2 = LW(m, P_D2, x->l);
    for (uint32_t t = t0; t < t1; t++) {
        const real *h = w->h + (size_t)t * N, *cond = w->cond + (size_t)t * N, *z1p = w->z1p + (size_t)t * N;
        const real *g = w->d3 + (size_t)t * N;
        real *dc = w->d5 + (size_t)t * N, *d = w->d4 + (size_t)t * N;
        real *pb = w->k3 + (size_t)t * N, *pd = w->k4 + (size_t)t * N;
        memset(d, 0, N * sizeof *d);
        for (uint32_t j = 0; j < N; j++) {
            const real sg = sigm(h[j]);
            const real dh = g[j] * (sg + h[j] * sg * (1 - sg));
            pb[j] = dh;
            pd[j] = dh * cond[j] * z1p[j];
            dc[j] = dh * d2[j] * z1p[j];
            d[m->perm1[j]] += dh * d2[j] * cond[j];
        }
    }
}

/* the softmax's backward into dcs (d7) from dsm (d6); dm (d2) += d1 dz0 (d3); k3 = the
 * terms of gd1 */
static void hada_back_in(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t D = m->D, N = m->N;
    const real *d1 = LW(m, P_D1, x->l);
    for (uint32_t t = t0; t < t1; t++) {
        const real *sm = w->csm + (size_t)t * COND_RANK, *ds = w->d6 + (size_t)t * COND_RANK;
        real dot = 0;
        for (uint32_t r = 0; r < COND_RANK; r++) dot += ds[r] * sm[r];
        for (uint32_t r = 0; r < COND_RANK; r++) w->d7[(size_t)t * COND_RANK + r] = sm[r] * (ds[r] - dot);
        for (uint32_t j = 0; j < D; j++) {
            w->k3[(size_t)t * N + j] = w->d3[(size_t)t * N + j] * w->m[(size_t)t * D + j];
            w->d2[(size_t)t * D + j] += w->d3[(size_t)t * N + j] * d1[j];
        }
    }
}

/* pre_hada_norm, gated residual, post_attn_norm backward of tokens [t0, t1): dx1 (d1)
 * += through the norm, dx0 (d5) = dx1, dao (d3) += through post_attn_norm (d4 the scaled
 * input per token); the per-token terms of the two norm scales (k1, k2) and of the gate
 * (k3) for block_back's sums */
static void resid_back_tok(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t D = m->D, l = x->l;
    const real gate = sigm(LW(m, P_GATE, l)[0]);
    for (uint32_t t = t0; t < t1; t++) {
        const size_t o = (size_t)t * D;
        const real *x1 = w->x1 + o, *dm = w->d2 + o, *pn = w->pn + o, *ao = w->ao + o;
        real *dx1 = w->d1 + o, *dx0 = w->d5 + o, *dy = w->d4 + o;
        real *ph = w->k1 + o, *pp = w->k2 + o, *pg = w->k3 + o;
        for (uint32_t i = 0; i < D; i++) ph[i] = dm[i] * x1[i] * w->mr[t];
        zc_back(x1, LW(m, P_PRE_HADA, l), D, w->mr[t], dm, dx1, NULL);
        for (uint32_t i = 0; i < D; i++) {
            pg[i] = dx1[i] * pn[i];
            dx0[i] = dx1[i];
            dy[i] = dx1[i] * gate;
        }
        for (uint32_t i = 0; i < D; i++) pp[i] = dy[i] * ao[i] * w->pnr[t];
        zc_back(ao, LW(m, P_POST_NORM, l), D, w->pnr[t], dy, w->d3 + o, NULL);
    }
}

/* through the output gate: dO (d3) and dgl (d6) from dgo (d1) */
TG_CLONES static void gate_back_tok(void *ctx, uint32_t t0, uint32_t t1) {
    const hada_ctx *x = ctx;
    const size_t O = (size_t)x->m->H * x->m->vd;
    seq_ws *w = x->w;
    for (size_t i = t0 * O; i < t1 * O; i++) {
        const real sg = sigm(w->gl[i]);
        w->d3[i] = w->d1[i] * sg;
        w->d6[i] = w->d1[i] * w->o[i] * sg * (1 - sg);
    }
}

/* The conv taps' backward for columns [c0, c1) of one projection: buf[t - j] += tap_j
 * dc[t] and g_j += dc[t] x[t - j], t and j in the serial loop's order */
typedef struct taps_ctx {
    uint32_t nt, T, C;
    const real *tap, *dc, *x;
    real *buf, *g;
} taps_ctx;

TG_CLONES static void taps_back_cols(void *ctx, uint32_t c0, uint32_t c1) {
    const taps_ctx *x = ctx;
    const uint32_t C = x->C;
    for (uint32_t t = 0; t < x->T; t++)
        for (uint32_t j = 0; j < x->nt && j <= t; j++)
            for (uint32_t c = c0; c < c1; c++) {
                x->buf[(size_t)(t - j) * C + c] += x->tap[j * C + c] * x->dc[(size_t)t * C + c];
                x->g[j * C + c] += x->dc[(size_t)t * C + c] * x->x[(size_t)(t - j) * C + c];
            }
}

typedef struct norm_in_ctx {
    const G3(model) * m;
    seq_ws *w;
    uint32_t l;
    const real *da;
    real *dx0;
} norm_in_ctx;

/* norm_in's backward of tokens [t0, t1): dx0 += through the norm, k1 = the scale's terms */
static void norm_in_back_tok(void *ctx, uint32_t t0, uint32_t t1) {
    const norm_in_ctx *x = ctx;
    const G3(model) *m = x->m;
    seq_ws *w = x->w;
    const uint32_t D = m->D;
    for (uint32_t t = t0; t < t1; t++) {
        const size_t o = (size_t)t * D;
        const real *x0 = w->x0 + o, *dy = x->da + o;
        real *p = w->k1 + o;
        for (uint32_t i = 0; i < D; i++) p[i] = dy[i] * x0[i] * w->ar[t];
        zc_back(x0, LW(m, P_NORM_IN, x->l), D, w->ar[t], dy, x->dx0 + o, NULL);
    }
}

/* Block.__call__ on u[T][D] into w->bo (the block's output), keeping its intermediates. */
static void block_fwd(const G3(model) * m, uint32_t l, const g3_seq *sq, seq_ws *w) {
    const uint32_t T = sq->T, D = m->D, H = m->H, KV = m->KV, qk = m->qk, vd = m->vd, N = m->N;
    const uint32_t Q = H * qk, K = KV * qk, VV = KV * vd, O = H * vd;
    const int site = site_of(m, l);
    G3(profile_phase)(m, G3_PH_OTHER);
    tok_job tj = {.m = m, .l = l, .T = T, .w = w, .sq = sq, .site = site};
    run_tokens(&tj, block_in_tok);
    /* MultiHeadAttention */
    mm(m, w->a, LW(m, P_WQ, l), w->ql, T, D, Q);
    mm(m, w->a, LW(m, P_WK, l), w->kl, T, D, K);
    mm(m, w->a, LW(m, P_WV, l), w->vl, T, D, VV);
    G3(profile_phase)(m, G3_PH_F_ATTN);
    run_tokens(&tj, block_qkv_tok);
    /* softmax(q k / sqrt(qk)) v, causal, local layers within the window */
    const uint32_t win = (m->c.sliding_window && !is_global(m, l)) ? m->c.sliding_window : 0;
    const real sc = (real)1 / sqrt((real)qk);
#ifndef G3_GENERIC_PRODUCTS
    /* per head on one thread each (heads taken from a shared counter): S = q k^T, the
     * softmax, o = P v, as products over the whole sequence (the entries outside the
     * causal window are computed and then set to 0); k^T of every group first */
    for (uint32_t g = 0; g < KV; g++) tg_transpose(w->kr + g * qk, K, w->k1 + (size_t)g * qk * T, T, T, qk);
    attn_job aj = {.m = m, .w = w, .T = T, .win = win, .sc = sc};
    atomic_init(&aj.next, 0u);
    G3(run_shared)(m, attn_fwd_worker, &aj);
#else
    for (uint32_t h = 0; h < H; h++) {
        const uint32_t g = h / (H / KV);
        for (uint32_t t = 0; t < T; t++) {
            real *P = w->P + ((size_t)h * T + t) * T;
            const uint32_t s0 = (win && t + 1 > win) ? t + 1 - win : 0;
            real mx = -INFINITY;
            for (uint32_t s = 0; s < T; s++) {
                if (s < s0 || s > t) {
                    P[s] = 0;
                    continue;
                }
                real d = 0;
                for (uint32_t i = 0; i < qk; i++)
                    d += w->qr[(size_t)t * Q + h * qk + i] * w->kr[(size_t)s * K + g * qk + i];
                P[s] = d * sc;
                if (P[s] > mx) mx = P[s];
            }
            const real z = exp_sum(P + s0, t + 1 - s0, mx, P + s0);
            for (uint32_t s = s0; s <= t; s++) P[s] /= z;
            real *ot = w->o + (size_t)t * O + h * vd;
            for (uint32_t i = 0; i < vd; i++) ot[i] = 0;
            for (uint32_t s = s0; s <= t; s++)
                for (uint32_t i = 0; i < vd; i++) ot[i] += P[s] * w->v[(size_t)s * VV + g * vd + i];
        }
    }
#endif
    G3(profile_phase)(m, G3_PH_OTHER);
    mm(m, w->a, LW(m, P_WG, l), w->gl, T, D, O);
    run_tokens(&tj, block_gate_tok);
    mm(m, w->go, LW(m, P_WO, l), w->ao, T, O, D);
    /* post_attn_norm, gated residual, pre_hada_norm */
    run_tokens(&tj, block_resid_tok);
    G3(profile_phase)(m, G3_PH_F_MLP);
    /* HadamardMLP */
    const real *cv = LW(m, P_CONDV, l), *cu = LW(m, P_CONDU, l);
    mm(m, w->m, cv, w->cs, T, D, COND_RANK);
    hada_ctx hx = {m, w, l, NULL};
    run_ranges(m, T, RANGE_TOKENS, hada_fwd_in, &hx);
    /* cond = 1 + softmax(m cond_v) cond_u; the Kronecker factors of every token at once */
    mm(m, w->csm, cu, w->cond, T, COND_RANK, N);
    kron_all(m, w->z0, LW(m, P_W1A, l), LW(m, P_W1B, l), T, w->z1, w->k1, w->k2);
    run_ranges(m, T, RANGE_TOKENS, hada_fwd_act, &hx);
    kron_all(m, w->hs, LW(m, P_W2A, l), LW(m, P_W2B, l), T, w->z2, w->k1, w->k2);
    run_ranges(m, T, RANGE_TOKENS, hada_fwd_perm2, &hx);
    kron_all(m, w->z2p, LW(m, P_W3A, l), LW(m, P_W3B, l), T, w->z3, w->k1, w->k2);
    run_ranges(m, T, RANGE_TOKENS, hada_fwd_out, &hx);
    G3(profile_phase)(m, G3_PH_OTHER);
}

/* Backward of block_fwd: dbo[T][D] -> du[T][D] (accumulated), parameter gradients. */
static void block_back(G3(model) * m, uint32_t l, const g3_seq *sq, seq_ws *w, const real *dbo, real *du) {
    const uint32_t T = sq->T, D = m->D, H = m->H, KV = m->KV, qk = m->qk, vd = m->vd, N = m->N;
    const uint32_t Q = H * qk, K = KV * qk, VV = KV * vd, O = H * vd;
    const int site = site_of(m, l);
    G3(profile_phase)(m, G3_PH_B_MLP);
    real *dx1 = w->d1, *dm = w->d2;
    memcpy(dx1, dbo, (size_t)T * D * sizeof *dx1);
    memset(dm, 0, (size_t)T * D * sizeof *dm);
    /* HadamardMLP */
    const real *cv = LW(m, P_CONDV, l), *cu = LW(m, P_CONDU, l);
    real *gcu = LG(m, P_CONDU, l);
    /* every token at once: [T][N] gradients in d3..d6, the Kronecker scratch in k1..k4;
     * the per-token terms of the vector gradients (gd4, gd3, gb2, gd2, gd1) go to k3 / k4
     * between the Kronecker steps and are summed over the tokens in order (col_sum) */
    real *dz3 = w->d3, *dz2p = w->d4, *dhs = w->d3, *dz0 = w->d3;
    real *dsm = w->d6; /* [T][COND_RANK] */
    hada_ctx hx = {m, w, l, dbo};
    run_ranges(m, T, RANGE_TOKENS, hada_back_out, &hx);
    col_sum(m, w->k3, N, T, D, LG(m, P_D4, l));
    memset(dz2p, 0, (size_t)T * N * sizeof *dz2p);
    kron_back_all(m, w->z2p, LW(m, P_W3A, l), LW(m, P_W3B, l), T, dz3, dz2p, LG(m, P_W3A, l), LG(m, P_W3B, l), w);
    run_ranges(m, T, RANGE_TOKENS, hada_back_perm2, &hx);
    col_sum(m, w->k3, N, T, N, LG(m, P_D3, l));
    memset(dhs, 0, (size_t)T * N * sizeof *dhs);
    kron_back_all(m, w->hs, LW(m, P_W2A, l), LW(m, P_W2B, l), T, w->d5, dhs, LG(m, P_W2A, l), LG(m, P_W2B, l), w);
    run_ranges(m, T, RANGE_TOKENS, hada_back_act, &hx);
    col_sum(m, w->k3, N, T, N, LG(m, P_B2, l));
    col_sum(m, w->k4, N, T, N, LG(m, P_D2, l));
    /* cond = 1 + softmax(m cond_v) cond_u */
    memset(dsm, 0, (size_t)T * COND_RANK * sizeof *dsm);
    mm_back(m, w->csm, cu, w->d5, dsm, gcu, T, COND_RANK, N);
    memset(dz0, 0, (size_t)T * N * sizeof *dz0);
    kron_back_all(m, w->z0, LW(m, P_W1A, l), LW(m, P_W1B, l), T, w->d4, dz0, LG(m, P_W1A, l), LG(m, P_W1B, l), w);
    run_ranges(m, T, RANGE_TOKENS, hada_back_in, &hx);
    col_sum(m, w->k3, N, T, D, LG(m, P_D1, l));
    mm_back(m, w->m, cv, w->d7, dm, LG(m, P_CONDV, l), T, D, COND_RANK);
    G3(profile_phase)(m, G3_PH_OTHER);
    /* pre_hada_norm, gated residual, post_attn_norm */
    const real gate = sigm(LW(m, P_GATE, l)[0]);
    real *dao = w->d3, *dx0 = w->d5;
    memset(dao, 0, (size_t)T * D * sizeof *dao);
    /* per token over the pool; the terms of the norms' and the gate's gradients (k1, k2,
     * k3) summed in token order afterwards, the sums the serial loop made */
    run_ranges(m, T, RANGE_TOKENS, resid_back_tok, &hx);
    col_sum(m, w->k1, D, T, D, LG(m, P_PRE_HADA, l));
    col_sum(m, w->k2, D, T, D, LG(m, P_POST_NORM, l));
    real dgate = 0;
    for (size_t i = 0; i < (size_t)T * D; i++) dgate += w->k3[i];
    LG(m, P_GATE, l)[0] += dgate * gate * (1 - gate);
    /* out_proj, gate_proj */
    real *dgo = w->d1; /* dx1 is consumed */
    memset(dgo, 0, (size_t)T * O * sizeof *dgo);
    real *da = w->d2; /* dm is consumed */
    memset(da, 0, (size_t)T * D * sizeof *da);
    mm_back(m, w->go, LW(m, P_WO, l), dao, dgo, LGD(m, P_WO, l), T, O, D);
    low_rank_back(m, P_WO, l, w->go, dao, T, O, D);
    real *dO = w->d3, *dgl = w->d6;
    run_ranges(m, T, RANGE_TOKENS, gate_back_tok, &hx);
    mm_back(m, w->a, LW(m, P_WG, l), dgl, da, LGD(m, P_WG, l), T, D, O);
    low_rank_back(m, P_WG, l, w->a, dgl, T, D, O);
    G3(profile_phase)(m, G3_PH_B_ATTN);
    /* attention */
    real *dqr = w->d1, *dkr = w->d6, *dv = w->d7;
    memset(dqr, 0, (size_t)T * Q * sizeof *dqr);
    memset(dkr, 0, (size_t)T * K * sizeof *dkr);
    memset(dv, 0, (size_t)T * VV * sizeof *dv);
    const uint32_t win = (m->c.sliding_window && !is_global(m, l)) ? m->c.sliding_window : 0;
    const real sc = (real)1 / sqrt((real)qk);
#ifndef G3_GENERIC_PRODUCTS
    /* per head on one thread each: dP = dO v^T, dv_h = P^T dO, dS, dq += dS k (the head's
     * own columns), dk_h = dS^T q; then dv += dv_h and dk += dk_h in head order, the sums
     * the accumulating products made one head after another */
    for (uint32_t g = 0; g < KV; g++) tg_transpose(w->v + g * vd, VV, w->k2 + (size_t)g * vd * T, T, T, vd);
    attn_job aj = {.m = m, .w = w, .T = T, .win = win, .sc = sc};
    aj.dO = dO, aj.dqr = dqr;
    atomic_init(&aj.next, 0u);
    G3(run_shared)(m, attn_back_worker, &aj);
    for (uint32_t h = 0; h < H; h++) {
        const uint32_t g = h / (H / KV);
        const real *dvh = w->dvh + (size_t)h * T * vd, *dkh = w->dkh + (size_t)h * T * qk;
        for (uint32_t t = 0; t < T; t++) {
            real *a = dv + (size_t)t * VV + g * vd, *b = dkr + (size_t)t * K + g * qk;
            for (uint32_t i = 0; i < vd; i++) a[i] = a[i] + dvh[(size_t)t * vd + i];
            for (uint32_t i = 0; i < qk; i++) b[i] = b[i] + dkh[(size_t)t * qk + i];
        }
    }
#else
    real *dP = w->tmp;
    for (uint32_t h = 0; h < H; h++) {
        const uint32_t g = h / (H / KV);
        for (uint32_t t = 0; t < T; t++) {
            const real *P = w->P + ((size_t)h * T + t) * T;
            const uint32_t s0 = (win && t + 1 > win) ? t + 1 - win : 0;
            const real *dot_ = dO + (size_t)t * O + h * vd;
            real sum = 0;
            for (uint32_t s = s0; s <= t; s++) {
                real d = 0;
                for (uint32_t i = 0; i < vd; i++) {
                    d += dot_[i] * w->v[(size_t)s * VV + g * vd + i];
                    dv[(size_t)s * VV + g * vd + i] += P[s] * dot_[i];
                }
                dP[s] = d;
                sum += d * P[s];
            }
            for (uint32_t s = s0; s <= t; s++) {
                const real dS = P[s] * (dP[s] - sum) * sc;
                for (uint32_t i = 0; i < qk; i++) {
                    dqr[(size_t)t * Q + h * qk + i] += dS * w->kr[(size_t)s * K + g * qk + i];
                    dkr[(size_t)s * K + g * qk + i] += dS * w->qr[(size_t)t * Q + h * qk + i];
                }
            }
        }
    }
#endif
    /* RoPE and q/k norms back to the tapped projections */
    const uint32_t half = qk / 2;
    real *dqc = w->d3, *dkc = w->d5; /* dO is consumed; dx0 moves from d5 to d4 */
    memcpy(w->d4, dx0, (size_t)T * D * sizeof *dx0);
    dx0 = w->d4;
    memset(dqc, 0, (size_t)T * Q * sizeof *dqc);
    memset(dkc, 0, (size_t)T * K * sizeof *dkc);
    for (uint32_t t = 0; t < T; t++) {
        const real *c = w->rope_c + (size_t)t * half, *sn = w->rope_s + (size_t)t * half;
        for (uint32_t h = 0; h < H + KV; h++) {
            const int isq = h < H;
            const uint32_t hh = isq ? h : h - H;
            const size_t off = isq ? (size_t)t * Q + hh * qk : (size_t)t * K + hh * qk;
            const real *dr = (isq ? dqr : dkr) + off;
            real *dn = w->tmp;
            for (uint32_t i = 0; i < half; i++) {
                dn[i] = dr[i] * c[i] + dr[i + half] * sn[i];
                dn[i + half] = -dr[i] * sn[i] + dr[i + half] * c[i];
            }
            zc_back((isq ? w->qc : w->kc) + off, LW(m, isq ? P_QN : P_KN, l), qk,
                    isq ? w->qnr[(size_t)t * H + hh] : w->knr[(size_t)t * KV + hh], dn, (isq ? dqc : dkc) + off,
                    LG(m, isq ? P_QN : P_KN, l));
        }
    }
    /* conv taps back to the projections */
    const uint32_t nt = m->taps;
    real *bufq = w->d1, *bufk = w->d6;
    memset(bufq, 0, (size_t)T * Q * sizeof *bufq);
    memset(bufk, 0, (size_t)T * K * sizeof *bufk);
    real *bufv = w->tmp;
    memset(bufv, 0, (size_t)T * VV * sizeof *bufv);
    if (nt) {
        /* every column of q, k and v on its own: columns over the pool, each in the
         * serial loop's order */
        taps_ctx tq = {nt, T, Q, LW(m, P_QT, l), dqc, w->ql, bufq, LG(m, P_QT, l)};
        taps_ctx tk = {nt, T, K, LW(m, P_KT, l), dkc, w->kl, bufk, LG(m, P_KT, l)};
        taps_ctx tv = {nt, T, VV, LW(m, P_VT, l), dv, w->vl, bufv, LG(m, P_VT, l)};
        run_ranges(m, Q, RANGE_COLS, taps_back_cols, &tq);
        run_ranges(m, K, RANGE_COLS, taps_back_cols, &tk);
        run_ranges(m, VV, RANGE_COLS, taps_back_cols, &tv);
    } else {
        memcpy(bufq, dqc, (size_t)T * Q * sizeof *bufq);
        memcpy(bufk, dkc, (size_t)T * K * sizeof *bufk);
        memcpy(bufv, dv, (size_t)T * VV * sizeof *bufv);
    }
    G3(profile_phase)(m, G3_PH_OTHER);
    /* w->a is gate_proj's input too (above): its transpose is kept from there */
    mm_back_reuse(m, w->a, LW(m, P_WQ, l), bufq, da, LGD(m, P_WQ, l), T, D, Q, 1);
    mm_back_reuse(m, w->a, LW(m, P_WK, l), bufk, da, LGD(m, P_WK, l), T, D, K, 1);
    mm_back_reuse(m, w->a, LW(m, P_WV, l), bufv, da, LGD(m, P_WV, l), T, D, VV, 1);
    low_rank_back(m, P_WQ, l, w->a, bufq, T, D, Q);
    low_rank_back(m, P_WK, l, w->a, bufk, T, D, K);
    low_rank_back(m, P_WV, l, w->a, bufv, T, D, VV);
    /* norm in: tokens over the pool, the scale's terms (k1) summed in token order */
    norm_in_ctx nx = {m, w, l, da, dx0};
    run_ranges(m, T, RANGE_TOKENS, norm_in_back_tok, &nx);
    col_sum(m, w->k1, D, T, D, LG(m, P_NORM_IN, l));
    /* engram */
    for (uint32_t t = 0; t < T; t++) {
        const real *g = dx0 + (size_t)t * D;
        for (uint32_t i = 0; i < D; i++) du[(size_t)t * D + i] += g[i];
        if (site < 0) continue;
        const size_t eo = ((size_t)site * T + t) * D;
        const real *ev = sq->ev + eo, al = w->alpha[t];
        real dal = 0;
        for (uint32_t i = 0; i < D; i++) {
            dal += g[i] * ev[i];
            sq->dev[eo + i] += al * g[i];
        }
        const real dz = dal * al * (1 - al) / sqrt((real)D);
        real *duu = w->d5, *dku = w->d5 + D;
        for (uint32_t i = 0; i < D; i++) {
            duu[i] = dz * w->ku[(size_t)t * D + i];
            dku[i] = dz * w->uu[(size_t)t * D + i];
        }
        zc_back(w->u + (size_t)t * D, NULL, D, w->ru[t], duu, du + (size_t)t * D, NULL);
        zc_back(sq->ek + eo, NULL, D, w->rk[t], dku, sq->dek + eo, NULL);
    }
}

/* ---- the mHC lane step around the block (_ScanBody.advance) --------------------------- */

/* nx = _aq(_rms_unit(stream), quant) */
TG_CLONES static void lane_norm_tok(const tok_job *j, uint32_t t) {
    const G3(model) *m = j->m;
    const uint32_t nD = m->n * m->D;
    real *nx = j->w->nx + (size_t)t * nD;
    j->w->nxr[t] = zc_fwd(j->Xin + (size_t)t * nD, NULL, nD, nx);
    if (m->a8) fq8(nx, nD);
}

/* the projections side by side in prj, the h's, the Sinkhorn steps and u = hpre . X */
TG_CLONES static void lane_mix_tok(const tok_job *j, uint32_t t) {
    const G3(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t l = j->l, T = j->T, n = m->n, D = m->D, nD = n * D, nn = n * n, own = l % n;
    const real apre = LW(m, P_A_PRE, l)[0], apost = LW(m, P_A_POST, l)[0], ares = LW(m, P_A_RES, l)[0];
    const real *bpre = LW(m, P_B_PRE, l), *bpost = LW(m, P_B_POST, l), *bres = LW(m, P_B_RES, l);
    const real *ppre = w->k1, *ppost = ppre + (size_t)T * n, *pres = ppost + (size_t)T * n;
    const real *X = j->Xin + (size_t)t * nD;
    real *prj = w->prj + (size_t)t * (2 * n + nn);
    memcpy(prj, ppre + (size_t)t * n, n * sizeof *prj);
    memcpy(prj + n, ppost + (size_t)t * n, n * sizeof *prj);
    memcpy(prj + 2 * n, pres + (size_t)t * nn, nn * sizeof *prj);
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

/* the lane write: y = block(u) - u, X' = hres X + hpost y */
TG_CLONES static void lane_write_tok(const tok_job *j, uint32_t t) {
    const G3(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t n = m->n, D = m->D, nD = n * D, nn = n * n;
    const real *X = j->Xin + (size_t)t * nD, *hres = w->hres + (size_t)t * nn, *hpost = w->hpost + (size_t)t * n;
    real *y = w->y + (size_t)t * D, *Xo = j->Xout + (size_t)t * nD;
    for (uint32_t c = 0; c < D; c++) y[c] = w->bo[(size_t)t * D + c] - w->u[(size_t)t * D + c];
    for (uint32_t i = 0; i < n; i++) { /* the sums over j in order, c innermost */
        real *xo = Xo + (size_t)i * D;
        for (uint32_t c = 0; c < D; c++) xo[c] = 0;
        for (uint32_t jj = 0; jj < n; jj++)
            for (uint32_t c = 0; c < D; c++) xo[c] += hres[i * n + jj] * X[(size_t)jj * D + c];
        for (uint32_t c = 0; c < D; c++) xo[c] = xo[c] + hpost[i] * y[c];
    }
}

/* Xin[T][n][D] -> Xout; keeps nx, the h's, the Sinkhorn steps, u and y in w. */
static void lane_fwd(const G3(model) * m, uint32_t l, const g3_seq *sq, seq_ws *w, const real *Xin, real *Xout) {
    const uint32_t T = sq->T, n = m->n, D = m->D, nD = n * D, nn = n * n;
    const real *pp = LW(m, P_PHI_PRE, l), *po = LW(m, P_PHI_POST, l), *pr = LW(m, P_PHI_RES, l);
    G3(profile_phase)(m, G3_PH_F_LANE);
    tok_job j = {.m = m, .l = l, .T = T, .w = w, .Xin = Xin, .Xout = Xout};
    run_tokens(&j, lane_norm_tok);
    /* the three projections of every token as products, then side by side in prj */
    real *ppre = w->k1, *ppost = ppre + (size_t)T * n, *pres = ppost + (size_t)T * n;
    mm(m, w->nx, pp, ppre, T, nD, n);
    mm(m, w->nx, po, ppost, T, nD, n);
    mm(m, w->nx, pr, pres, T, nD, nn);
    run_tokens(&j, lane_mix_tok);
    block_fwd(m, l, sq, w);
    G3(profile_phase)(m, G3_PH_F_LANE);
    run_tokens(&j, lane_write_tok);
    G3(profile_phase)(m, G3_PH_OTHER);
}

/* One token of the lane write's backward: dX (overwritten), dy, and the raw gradients of
 * the post and res projections (the Sinkhorn backward) left in dzs for lane_back's sums. */
TG_CLONES static void lane_write_back_tok(const tok_job *j, uint32_t t) {
    const G3(model) *m = j->m;
    seq_ws *w = j->w;
    const uint32_t n = m->n, D = m->D, nD = n * D, nn = n * n;
    const real *X = j->Xin + (size_t)t * nD, *g = j->dXo + (size_t)t * nD, *hres = w->hres + (size_t)t * nn;
    const real *hpost = w->hpost + (size_t)t * n, *y = w->y + (size_t)t * D;
    real *dx = j->Xout + (size_t)t * nD, *dyt = w->dys + (size_t)t * D, *dzt = w->dzs + (size_t)t * (2 * n + nn);
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
    for (uint32_t k = 0; k < nn; k++) dzt[2 * n + k] = dS[k];
}

/* Backward of lane_fwd (which must have just run for this layer): dXo -> dXi (overwritten). */
static void lane_back(G3(model) * m, uint32_t l, const g3_seq *sq, seq_ws *w, const real *Xin, const real *dXo,
                      real *dXi) {
    const uint32_t T = sq->T, n = m->n, D = m->D, nD = n * D, nn = n * n;
    const real *pp = LW(m, P_PHI_PRE, l), *po = LW(m, P_PHI_POST, l), *pr = LW(m, P_PHI_RES, l);
    const real apre = LW(m, P_A_PRE, l)[0], apost = LW(m, P_A_POST, l)[0], ares = LW(m, P_A_RES, l)[0];
    real *gpp = LG(m, P_PHI_PRE, l), *gpo = LG(m, P_PHI_POST, l), *gpr = LG(m, P_PHI_RES, l);
    real *gapre = LG(m, P_A_PRE, l), *gapost = LG(m, P_A_POST, l), *gares = LG(m, P_A_RES, l);
    real *gbpre = LG(m, P_B_PRE, l), *gbpost = LG(m, P_B_POST, l), *gbres = LG(m, P_B_RES, l);
    real *dy = w->dys, *du = w->dus;
    G3(profile_phase)(m, G3_PH_B_LANE);
    /* the lane write: X' = hres X + hpost y, per token on the pool (lane_write_back_tok),
     * then the parameters' sums over the tokens in order */
    real *dz = w->dzs; /* [T][2n + nn]: d(projection) per token */
    tok_job j = {.m = m, .l = l, .T = T, .w = w, .Xin = Xin, .dXo = dXo, .Xout = dXi};
    run_tokens(&j, lane_write_back_tok);
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
    G3(profile_phase)(m, G3_PH_B_LANE);
    /* the lane read: u = hpre . X, and the projections of nx */
    for (uint32_t t = 0; t < T; t++) {
        const real *X = Xin + (size_t)t * nD, *hpre = w->hpre + (size_t)t * n, *dut = du + (size_t)t * D;
        const real *prj = w->prj + (size_t)t * (2 * n + nn);
        real *dx = dXi + (size_t)t * nD, *dzt = dz + (size_t)t * (2 * n + nn);
        for (uint32_t i = 0; i < n; i++) {
            const real dp = dot8(dut, X + (size_t)i * D, D);
            for (uint32_t c = 0; c < D; c++) dx[(size_t)i * D + c] += hpre[i] * dut[c];
            const real dzp = dp * hpre[i] * (1 - hpre[i]);
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
    mm_back_reuse(m, w->nx, po, dzpost, dnx, gpo, T, nD, n, 1);
    mm_back_reuse(m, w->nx, pr, dzres, dnx, gpr, T, nD, nn, 1);
    for (uint32_t t = 0; t < T; t++)
        zc_back(Xin + (size_t)t * nD, NULL, nD, w->nxr[t], dnx + (size_t)t * nD, dXi + (size_t)t * nD, NULL);
    G3(profile_phase)(m, G3_PH_OTHER);
}

/* ---- engram (Engram.__call__, engram_indices) ----------------------------------------- */

/* The slot of table j at position t, or -1 where the n-gram runs off the start
 * (ngram_ok = 0). */
static int32_t engram_slot(const G3(model) * m, const int32_t *ids, uint32_t t, uint32_t j) {
    const uint32_t heads = m->tables / m->c.num_orders, oi = j / heads, h = j % heads;
    const uint32_t order = m->c.engram_orders[oi];
    if (t + 1 < order) return -1;
    const uint32_t stride = m->c.engram_seed_heads ? m->c.engram_seed_heads : heads;
    nm_u32 acc = nm_engram_hash_start(oi * stride + h);
    for (uint32_t k = 0; k < order; k++) acc = nm_engram_hash_step(acc, (nm_u32)ids[t - k]);
    return (int32_t)nm_engram_hash_slot(acc, m->c.engram_slots);
}

/* e[T][tables*sub] (the fetched rows) and vl[T][D] (value_proj before the taps) of site s */
static void engram_rows(const G3(model) * m, uint32_t s, const int32_t *ids, uint32_t T, real *e) {
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

static void engram_fwd(const G3(model) * m, const int32_t *ids, uint32_t T, real *e, real *vl, real *ek, real *ev) {
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

static void engram_back(G3(model) * m, const int32_t *ids, uint32_t T, real *e, real *vl, real *de, real *dvl,
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
    "stack/layers/block/self_attn/q_taps",
    "stack/layers/block/self_attn/k_taps",
    "stack/layers/block/self_attn/v_taps",
    "stack/layers/block/self_attn/q_norm/scale",
    "stack/layers/block/self_attn/k_norm/scale",
    "stack/layers/block/post_attn_norm/scale",
    "stack/layers/block/attn_gate",
    "stack/layers/block/pre_hada_norm/scale",
    "stack/layers/block/hadamard_mlp/w1a",
    "stack/layers/block/hadamard_mlp/w1b",
    "stack/layers/block/hadamard_mlp/w2a",
    "stack/layers/block/hadamard_mlp/w2b",
    "stack/layers/block/hadamard_mlp/w3a",
    "stack/layers/block/hadamard_mlp/w3b",
    "stack/layers/block/hadamard_mlp/d1",
    "stack/layers/block/hadamard_mlp/d2",
    "stack/layers/block/hadamard_mlp/b2",
    "stack/layers/block/hadamard_mlp/d3",
    "stack/layers/block/hadamard_mlp/d4",
    "stack/layers/block/hadamard_mlp/cond_v",
    "stack/layers/block/hadamard_mlp/cond_u",
};
static const char *const ENGRAM_NAMES[E_COUNT] = {"embedding", "key_proj/kernel", "value_proj/kernel", "taps"};

static int set_shape(G3(tensor) * t, uint32_t nd, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    const uint64_t s[4] = {a, b, c, d};
    t->ndim = nd;
    t->numel = 1;
    for (uint32_t i = 0; i < nd; i++) {
        t->shape[i] = s[i];
        t->numel *= s[i];
    }
    return 0;
}

void G3(model_free)(G3(model) * m) {
    if (!m) return;
    for (uint32_t i = 0; i < m->nt; i++) {
        free(m->t[i].w);
        free(m->t[i].g);
    }
    free(m->t);
    free(m->perm1);
    free(m->perm2);
    free(m->prof);
    ws_release(m);
    if (m->scr) {
        free(m->scr->wt);
        free(m->scr->xt);
        free(m->scr->lr_buf);
    }
    free(m->scr);
    free(m->lr);
    cpu_pool_free(m->pool);
    free(m);
}

uint32_t G3(tensor_count)(const G3(model) * m) { return m->nt; }

int G3(set_low_rank)(G3(model) * m, const G3(tensor) * t, const G3_REAL *A, const G3_REAL *B, uint32_t r,
                     G3_REAL *gaT, G3_REAL *gb) {
    const ptrdiff_t id = t - m->t;
    if (id < P_WQ || id > P_WO || t->ndim != 3 || t->shape[0] != m->L) return 0;
    if (!m->lr) {
        if (!A) return 0;
        m->lr = calloc(P_WO - P_WQ + 1, sizeof *m->lr);
        if (!m->lr) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    struct g3_low_rank *q = &m->lr[id - P_WQ];
    if (!A || !B || !gaT || !gb || !r) {
        memset(q, 0, sizeof *q);
        return 0;
    }
    q->A = A, q->B = B, q->gaT = gaT, q->gb = gb, q->r = r;
    return 1;
}
G3(tensor) * G3(tensor_at)(G3(model) * m, uint32_t i) { return i < m->nt ? &m->t[i] : NULL; }
G3(tensor) * G3(find)(G3(model) * m, const char *name) {
    for (uint32_t i = 0; i < m->nt; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

int G3(model_from_checkpoint)(const export3_config *cfg, const st_file *ckpt, G3(model) * *out) {
    *out = NULL;
    G3(model) *m = calloc(1, sizeof *m);
    if (!m) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    m->c = *cfg;
    const export3_config *c = cfg;
    m->D = c->d_model, m->n = c->mhc_lanes, m->L = c->num_layers, m->H = c->num_heads, m->KV = c->num_kv_heads;
    m->qk = c->qk_head_dim, m->vd = c->v_head_dim, m->V = c->vocab_size;
    m->OV = c->out_vocab ? c->out_vocab : c->vocab_size, m->taps = c->qkv_conv_taps;
    if (!m->D || !m->n || !m->L || !m->H || !m->KV || m->H % m->KV || m->qk % 2 || !m->vd || m->OV > m->V ||
        m->n > 8 || c->num_orders == 0 || c->ladder_split) {
        free(m);
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train: unsupported Needle 3 geometry (d_model %u, "
                           "heads %u/%u, qk %u, lanes %u, ladder widths %u)", c->d_model, c->num_heads,
                           c->num_kv_heads, c->qk_head_dim, c->mhc_lanes, c->ladder_split);
    }
    uint32_t N = 1;
    while (N < m->D) N <<= 1;
    m->N = N;
    uint32_t bits = 0;
    while ((1u << bits) < N) bits++; /* (N-1).bit_length() for N a power of two > 1 */
    m->ba = 1u << (bits / 2), m->bb = N / m->ba;
    /* engram_geometry */
    m->tables = 0, m->sub = 0, m->dil = 0;
    const uint32_t heads = c->engram_heads ? c->engram_heads
                                           : (m->D / (c->num_orders * 128) ? m->D / (c->num_orders * 128) : 1);
    m->tables = c->num_orders * heads;
    m->sub = m->D / (c->num_orders * heads);
    for (uint32_t i = 0; i < c->num_orders; i++) m->dil = c->engram_orders[i] > m->dil ? c->engram_orders[i] : m->dil;
    m->prof = calloc(1, sizeof *m->prof);
    m->scr = calloc(1, sizeof *m->scr);
    m->lv = tg_level_best();
    m->keep_budget = G3_KEEP_DEFAULT;
    m->perm1 = malloc(N * sizeof *m->perm1);
    m->perm2 = malloc(N * sizeof *m->perm2);
    m->nt = P_FIXED + E_COUNT * c->num_sites;
    m->t = calloc(m->nt, sizeof *m->t);
    if (!m->perm1 || !m->perm2 || !m->t || !m->prof || !m->scr) {
        G3(model_free)(m);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    mt_permutation(11, N, m->perm1);
    mt_permutation(13, N, m->perm2);
    const uint32_t L = m->L, D = m->D, n = m->n, H = m->H, KV = m->KV, qk = m->qk, vd = m->vd;
    G3(tensor) *t = m->t;
    set_shape(&t[P_EMB], 2, m->V, D, 0, 0);
    set_shape(&t[P_FINAL], 1, D, 0, 0, 0);
    set_shape(&t[P_PHI_PRE], 3, L, (uint64_t)n * D, n, 0);
    set_shape(&t[P_PHI_POST], 3, L, (uint64_t)n * D, n, 0);
    set_shape(&t[P_PHI_RES], 3, L, (uint64_t)n * D, (uint64_t)n * n, 0);
    set_shape(&t[P_B_PRE], 2, L, n, 0, 0);
    set_shape(&t[P_B_POST], 2, L, n, 0, 0);
    set_shape(&t[P_B_RES], 3, L, n, n, 0);
    set_shape(&t[P_A_PRE], 1, L, 0, 0, 0);
    set_shape(&t[P_A_POST], 1, L, 0, 0, 0);
    set_shape(&t[P_A_RES], 1, L, 0, 0, 0);
    set_shape(&t[P_NORM_IN], 2, L, D, 0, 0);
    set_shape(&t[P_WQ], 3, L, D, (uint64_t)H * qk, 0);
    set_shape(&t[P_WK], 3, L, D, (uint64_t)KV * qk, 0);
    set_shape(&t[P_WV], 3, L, D, (uint64_t)KV * vd, 0);
    set_shape(&t[P_WG], 3, L, D, (uint64_t)H * vd, 0);
    set_shape(&t[P_WO], 3, L, (uint64_t)H * vd, D, 0);
    set_shape(&t[P_QT], 3, L, m->taps, (uint64_t)H * qk, 0);
    set_shape(&t[P_KT], 3, L, m->taps, (uint64_t)KV * qk, 0);
    set_shape(&t[P_VT], 3, L, m->taps, (uint64_t)KV * vd, 0);
    set_shape(&t[P_QN], 2, L, qk, 0, 0);
    set_shape(&t[P_KN], 2, L, qk, 0, 0);
    set_shape(&t[P_POST_NORM], 2, L, D, 0, 0);
    set_shape(&t[P_GATE], 1, L, 0, 0, 0);
    set_shape(&t[P_PRE_HADA], 2, L, D, 0, 0);
    set_shape(&t[P_W1A], 3, L, m->ba, m->ba, 0);
    set_shape(&t[P_W1B], 3, L, m->bb, m->bb, 0);
    set_shape(&t[P_W2A], 3, L, m->ba, m->ba, 0);
    set_shape(&t[P_W2B], 3, L, m->bb, m->bb, 0);
    set_shape(&t[P_W3A], 3, L, m->ba, m->ba, 0);
    set_shape(&t[P_W3B], 3, L, m->bb, m->bb, 0);
    for (uint32_t i = P_D1; i <= P_D4; i++) set_shape(&t[i], 2, L, N, 0, 0);
    set_shape(&t[P_CONDV], 3, L, D, COND_RANK, 0);
    set_shape(&t[P_CONDU], 3, L, COND_RANK, N, 0);
    for (uint32_t i = 0; i < P_FIXED; i++) snprintf(t[i].name, G3_MAX_NAME, "%s", FIXED_NAMES[i]);
    for (uint32_t s = 0; s < c->num_sites; s++) {
        G3(tensor) *e = &t[P_FIXED + s * E_COUNT];
        set_shape(&e[E_TABLE], 3, m->tables, c->engram_slots, m->sub, 0);
        set_shape(&e[E_KEY], 2, (uint64_t)m->tables * m->sub, D, 0, 0);
        set_shape(&e[E_VALUE], 2, (uint64_t)m->tables * m->sub, D, 0, 0);
        set_shape(&e[E_TAPS], 2, ENGRAM_TAPS, D, 0, 0);
        for (uint32_t k = 0; k < E_COUNT; k++)
            snprintf(e[k].name, G3_MAX_NAME, "engrams_%u/%s", s, ENGRAM_NAMES[k]);
    }
    for (uint32_t i = 0; i < m->nt; i++) {
        G3(tensor) *ti = &t[i];
        if (!ti->numel) continue; /* no conv taps */
        const st_tensor *src = ckpt ? st_find(ckpt, ti->name) : NULL;
        int ok = !ckpt || (src && src->ndim == ti->ndim && src->numel == ti->numel);
        for (uint32_t k = 0; ok && src && k < ti->ndim; k++) ok = src->shape[k] == ti->shape[k];
        if (!ok) {
            const int st = needle_fail(NEEDLE_ERR_FORMAT, src ? "checkpoint tensor %s has the wrong shape "
                                                             "for its config" : "checkpoint has no tensor %s",
                                       ti->name);
            G3(model_free)(m);
            return st;
        }
        ti->w = calloc(ti->numel, sizeof *ti->w);
        ti->g = calloc(ti->numel, sizeof *ti->g);
        if (!ti->w || !ti->g) {
            G3(model_free)(m);
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
    real *et;   /* [D][OV]: the head's rows transposed, for logits = xn E^T as one product */
    real *rrow; /* [T]: 1/rms of final_norm per loss row */
    real *block; /* every buffer above lives in this one allocation */
    seq_ws *lw;  /* [L]: layer l's buffers: its own for the kept layers, else the one recomputed */
    uint32_t keep; /* layers [0, keep) keep their activations (kept_layers) */
    uint32_t *rowt; /* [T]: the positions in the loss (mask of the next token != 0) */
} run_ws;

typedef struct ws_field {
    real **p;
    size_t n;
} ws_field;

/* The buffers lane_fwd writes for one layer and lane_back reads back: what keeping a
 * layer's activations keeps (the backward's scratch and the sequence's buffers are
 * shared). Fills f (at most 64 entries) and returns their count. */
static size_t layer_fields(const G3(model) * m, uint32_t T, seq_ws *w, ws_field *f) {
    const uint32_t D = m->D, n = m->n, nD = n * D, nn = n * n, H = m->H, KV = m->KV;
    const uint32_t Q = H * m->qk, K = KV * m->qk, VV = KV * m->vd, O = H * m->vd, N = m->N, pj = 2 * n + nn;
    const size_t TD = (size_t)T * D;
    const ws_field l[] = {
        {&w->nx, (size_t)T * nD}, {&w->nxr, T}, {&w->hpre, (size_t)T * n}, {&w->hpost, (size_t)T * n},
        {&w->hres, (size_t)T * nn}, {&w->sk, (size_t)T * (2 * SINKHORN_ITERS + 1) * nn}, {&w->u, TD},
        {&w->y, TD}, {&w->prj, (size_t)T * pj}, {&w->x0, TD}, {&w->alpha, T}, {&w->ru, T},
        {&w->rk, T}, {&w->uu, TD}, {&w->ku, TD}, {&w->a, TD}, {&w->ar, T},
        {&w->ql, (size_t)T * Q}, {&w->kl, (size_t)T * K}, {&w->vl, (size_t)T * VV},
        {&w->qc, (size_t)T * Q}, {&w->kc, (size_t)T * K}, {&w->v, (size_t)T * VV},
        {&w->qn, (size_t)T * Q}, {&w->kn, (size_t)T * K}, {&w->qnr, (size_t)T * H},
        {&w->knr, (size_t)T * KV}, {&w->qr, (size_t)T * Q}, {&w->kr, (size_t)T * K},
        {&w->P, (size_t)H * T * T}, {&w->o, (size_t)T * O}, {&w->gl, (size_t)T * O},
        {&w->go, (size_t)T * O}, {&w->ao, TD}, {&w->pn, TD}, {&w->pnr, T}, {&w->x1, TD},
        {&w->m, TD}, {&w->mr, T}, {&w->cs, (size_t)T * COND_RANK}, {&w->csm, (size_t)T * COND_RANK},
        {&w->cond, (size_t)T * N}, {&w->z0, (size_t)T * N}, {&w->z1, (size_t)T * N},
        {&w->z1p, (size_t)T * N}, {&w->h, (size_t)T * N}, {&w->hs, (size_t)T * N},
        {&w->z2, (size_t)T * N}, {&w->z2p, (size_t)T * N}, {&w->z3, (size_t)T * N}, {&w->bo, TD},
    };
    const size_t nl = sizeof l / sizeof l[0];
    for (size_t i = 0; i < nl; i++) f[i] = l[i];
    return nl;
}

/* Bytes of one layer's activations at length T (the + 1 per buffer: ws_alloc's spacing). */
static size_t layer_bytes(const G3(model) * m, uint32_t T) {
    seq_ws w;
    ws_field f[64];
    const size_t nf = layer_fields(m, T, &w, f);
    size_t total = 0;
    for (size_t i = 0; i < nf; i++) total += f[i].n + 1;
    return total * sizeof(real);
}

/* How many layers keep their activations from the forward to the backward (not
 * recomputed) within the model's budget: the first ones, as many as fit. */
static uint32_t kept_layers(const G3(model) * m, uint32_t T) {
    const size_t per = layer_bytes(m, T);
    const size_t fit = per ? m->keep_budget / per : 0;
    return fit < m->L ? (uint32_t)fit : m->L;
}

#define HEAD_ROWS 64 /* loss rows per logits product: [64][OV] floats (2 MB at OV 8192) */

static void ws_release(G3(model) * m) {
    if (m->ws) free(m->ws->block), free(m->ws->rowt), free(m->ws->lw);
    free(m->ws);
    m->ws = NULL;
    m->ws_T = 0;
}

static int ws_alloc(const G3(model) * m, uint32_t T, run_ws *r) {
    const uint32_t D = m->D, n = m->n, nD = n * D, nn = n * n, H = m->H, KV = m->KV;
    const uint32_t Q = H * m->qk, K = KV * m->qk, VV = KV * m->vd, O = H * m->vd, N = m->N;
    const uint32_t E = m->tables * m->sub, S = m->c.num_sites, pj = 2 * n + nn;
    uint32_t MX = D;
    const uint32_t cand[] = {Q, K, VV, O, N, nD};
    for (uint32_t i = 0; i < 6; i++) MX = cand[i] > MX ? cand[i] : MX;
    const size_t TD = (size_t)T * D, dsz = (size_t)T * MX + 3 * (size_t)N + 2 * (size_t)D;
    const size_t nthr = m->pool ? (size_t)cpu_pool_threads(m->pool) : 1; /* attention's scratch per thread */
    ws_field f[96];
    size_t nf = 0;
    const ws_field shared[] = {
        {&r->w.dys, TD}, {&r->w.dus, TD}, {&r->w.dzs, (size_t)T * pj}, {&r->w.d1, dsz}, {&r->w.d2, dsz},
        {&r->w.d3, dsz}, {&r->w.d4, dsz}, {&r->w.d5, dsz}, {&r->w.d6, dsz}, {&r->w.d7, dsz},
        {&r->w.tmp, dsz + T}, {&r->w.rope_c, (size_t)T * (m->qk / 2)}, {&r->w.rope_s, (size_t)T * (m->qk / 2)},
        {&r->w.dPs, nthr * T * T}, {&r->w.PT, nthr * T * T}, {&r->w.dvh, (size_t)H * T * m->vd},
        {&r->w.dkh, (size_t)H * T * m->qk}, {&r->w.k1, (size_t)T * MX}, {&r->w.k2, (size_t)T * MX}, {&r->w.k3, (size_t)T * N}, {&r->w.k4, (size_t)T * N},
        {&r->e, (size_t)T * E}, {&r->vl, TD}, {&r->de, (size_t)T * E}, {&r->dvl, TD}, {&r->ek, S * TD},
        {&r->ev, S * TD}, {&r->dek, S * TD}, {&r->dev, S * TD}, {&r->Xs, (size_t)(m->L + 1) * T * nD},
        {&r->dXa, (size_t)T * nD}, {&r->dXb, (size_t)T * nD}, {&r->logits, (size_t)HEAD_ROWS * m->OV}, {&r->xf, TD},
        {&r->xn, TD}, {&r->dxn, (size_t)HEAD_ROWS * D}, {&r->dxf, D}, {&r->et, (size_t)D * m->OV},
        {&r->rrow, T},
    };
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) f[nf++] = shared[i];
    /* one copy of a layer's activations for the layers recomputed (none when all are kept) */
    const uint32_t keep = kept_layers(m, T);
    if (keep < m->L) nf += layer_fields(m, T, &r->w, f + nf);
    size_t total = 0;
    for (size_t i = 0; i < nf; i++) total += f[i].n + 1;
    const size_t per = layer_bytes(m, T) / sizeof(real);
    r->block = calloc(total + (size_t)keep * per, sizeof *r->block);
    r->rowt = calloc(T, sizeof *r->rowt);
    r->lw = calloc(m->L, sizeof *r->lw);
    if (!r->block || !r->rowt || !r->lw) {
        free(r->block);
        free(r->rowt);
        free(r->lw);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "train: out of memory for T = %u", T);
    }
    size_t off = 0;
    for (size_t i = 0; i < nf; i++) {
        *f[i].p = r->block + off;
        off += f[i].n + 1;
    }
    r->keep = keep;
    for (uint32_t l = 0; l < m->L; l++) {
        r->lw[l] = r->w; /* the shared buffers, and the recomputed layer's */
        if (l >= keep) continue;
        ws_field lf[64];
        const size_t nl = layer_fields(m, T, &r->lw[l], lf);
        for (size_t i = 0; i < nl; i++) {
            *lf[i].p = r->block + off;
            off += lf[i].n + 1;
        }
    }
    return 0;
}

/* The masked cross-entropy of logits rows [k0, k1) (row k is position rowt[k]): each row's
 * loss term, and with grads its dloss/dlogit in place of the logits */
#define CE_ROWS 4
typedef struct ce_ctx {
    real *logits;
    const uint32_t *rowt;
    const int32_t *tok;
    const float *mk;
    uint32_t OV;
    real denom;
    int grads;
    double *terms;
} ce_ctx;

TG_CLONES static void ce_rows(void *ctx, uint32_t k0, uint32_t k1) {
    const ce_ctx *x = ctx;
    const uint32_t OV = x->OV;
    for (uint32_t k = k0; k < k1; k++) {
        const uint32_t t = x->rowt[k], tgt = (uint32_t)x->tok[t + 1];
        const real wgt = (real)x->mk[t + 1];
        real *lg = x->logits + (size_t)k * OV;
        real mx = -INFINITY;
        for (uint32_t v = 0; v < OV; v++) mx = lg[v] > mx ? lg[v] : mx;
        const real z = exp_sum(lg, OV, mx, NULL);
        const real lse = mx + rlog(z);
        x->terms[k] = (double)(wgt * (lse - lg[tgt]));
        if (!x->grads) continue;
        exp_shift(lg, OV, lse); /* dloss/dlogit */
        for (uint32_t v = 0; v < OV; v++) lg[v] = (lg[v] - (v == tgt ? 1 : 0)) * wgt / x->denom;
    }
}

int G3(loss)(G3(model) * m, const int32_t *ids, const float *mask, uint32_t B, uint32_t T, int grads,
             double *loss) {
    *loss = 0;
    if (!B || T < 2) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train: a batch needs B >= 1 and T >= 2");
    for (size_t i = 0; i < (size_t)B * T; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= m->V)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train: token id %d outside the vocabulary (%u)",
                               ids[i], m->V);
    double msum = 0;
    for (uint32_t b = 0; b < B; b++)
        for (uint32_t t = 1; t < T; t++) {
            msum += mask[(size_t)b * T + t];
            if (mask[(size_t)b * T + t] != 0 && (uint32_t)ids[(size_t)b * T + t] >= m->OV)
                return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "train: target id %d at [%u][%u] is not "
                                   "an output token (out_vocab %u)", ids[(size_t)b * T + t], b, t, m->OV);
        }
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
            if (m->t[i].g && !(m->t[i].frozen && frozen_skipped(i))) {
                if (i >= P_WQ && i <= P_WO && LOW_RANK(m, i)) { /* its factors' sums instead */
                    const struct g3_low_rank *q = &m->lr[i - P_WQ];
                    const size_t in = m->t[i].shape[1], out = m->t[i].shape[2];
                    memset(q->gaT, 0, (size_t)m->L * q->r * in * sizeof *q->gaT);
                    memset(q->gb, 0, (size_t)m->L * q->r * out * sizeof *q->gb);
                } else
                    memset(m->t[i].g, 0, m->t[i].numel * sizeof *m->t[i].g);
            }
    const uint32_t D = m->D, n = m->n, nD = n * D, half = m->qk / 2, L = m->L;
    /* precompute_rope_freqs in float32 as the reference */
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t i = 0; i < half; i++) {
            const float inv = 1.0f / powf((float)m->c.rope_theta, (float)(2 * i) / (float)m->qk);
            const float ang = (float)t * inv;
            r.w.rope_c[(size_t)t * half + i] = (real)cosf(ang);
            r.w.rope_s[(size_t)t * half + i] = (real)sinf(ang);
        }
    /* the head's rows transposed once per call (the weights do not change within it) */
    for (uint32_t v0 = 0; v0 < m->OV; v0 += 32)
        for (uint32_t c0 = 0; c0 < D; c0 += 32)
            for (uint32_t v = v0; v < v0 + 32 && v < m->OV; v++)
                for (uint32_t c = c0; c < c0 + 32 && c < D; c++)
                    r.et[(size_t)c * m->OV + v] = m->t[P_EMB].w[(size_t)v * D + c];
    const real escale = sqrt((real)D);
    double total = 0;
    for (uint32_t b = 0; b < B; b++) {
        const int32_t *tok = ids + (size_t)b * T;
        const float *mk = mask + (size_t)b * T;
        const uint32_t Tr = row_length(mk, T); /* the row without its padding */
        g3_seq sq = {Tr, r.ek, r.ev, r.dek, r.dev};
        G3(profile_phase)(m, G3_PH_F_ENGRAM);
        engram_fwd(m, tok, Tr, r.e, r.vl, r.ek, r.ev);
        G3(profile_phase)(m, G3_PH_OTHER);
        for (uint32_t t = 0; t < Tr; t++)
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t c = 0; c < D; c++)
                    r.Xs[(size_t)t * nD + (size_t)i * D + c] = m->t[P_EMB].w[(size_t)tok[t] * D + c] * escale;
        for (uint32_t l = 0; l < L; l++)
            lane_fwd(m, l, &sq, &r.lw[l], r.Xs + (size_t)l * Tr * nD, r.Xs + (size_t)(l + 1) * Tr * nD);
        /* mean over lanes, final_norm, tied (out_vocab) logits, masked cross-entropy */
        const real *XL = r.Xs + (size_t)L * Tr * nD;
        real *dX = r.dXa;
        memset(dX, 0, (size_t)Tr * nD * sizeof *dX);
        /* the loss rows, then their logits HEAD_ROWS at a time as products over the pool */
        G3(profile_phase)(m, G3_PH_HEAD);
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
        const uint32_t OV = m->OV;
        const real *Emb = m->t[P_EMB].w;
        for (uint32_t k0 = 0; k0 < nr; k0 += HEAD_ROWS) {
            const uint32_t R = nr - k0 < HEAD_ROWS ? nr - k0 : HEAD_ROWS;
            const real *xn = r.xn + (size_t)k0 * D;
            mm(m, xn, r.et, r.logits, R, D, OV);
            /* the rows' cross-entropy over the pool, their losses summed in row order */
            double terms[HEAD_ROWS];
            ce_ctx ce = {r.logits, r.rowt + k0, tok, mk, OV, denom, grads, terms};
            run_ranges(m, R, CE_ROWS, ce_rows, &ce);
            for (uint32_t k = 0; k < R; k++) total += terms[k];
            if (!grads) continue;
            mm(m, r.logits, Emb, r.dxn, R, OV, D); /* dxn = g E */
            if (!m->t[P_EMB].frozen) /* dE += g^T xn */
                mm_back(m, r.logits, Emb, xn, NULL, m->t[P_EMB].g, R, OV, D);
            for (uint32_t k = 0; k < R; k++) {
                const uint32_t t = r.rowt[k0 + k];
                memset(r.dxf, 0, D * sizeof *r.dxf);
                zc_back(r.xf + (size_t)(k0 + k) * D, m->t[P_FINAL].w, D, r.rrow[k0 + k], r.dxn + (size_t)k * D,
                        r.dxf, m->t[P_FINAL].g);
                for (uint32_t i = 0; i < n; i++)
                    for (uint32_t c = 0; c < D; c++) dX[(size_t)t * nD + (size_t)i * D + c] = r.dxf[c] / (real)n;
            }
        }
        G3(profile_phase)(m, G3_PH_OTHER);
        if (!grads) continue;
        memset(r.dek, 0, (size_t)m->c.num_sites * Tr * D * sizeof *r.dek);
        memset(r.dev, 0, (size_t)m->c.num_sites * Tr * D * sizeof *r.dev);
        for (uint32_t l = L; l-- > 0;) {
            const real *Xin = r.Xs + (size_t)l * Tr * nD;
            if (l >= r.keep) { /* not kept: the layer's forward again (the same bits) */
                m->prof->recomp = 1;
                lane_fwd(m, l, &sq, &r.lw[l], Xin, r.Xs + (size_t)(l + 1) * Tr * nD);
                m->prof->recomp = 0;
            }
            real *dXi = dX == r.dXa ? r.dXb : r.dXa;
            lane_back(m, l, &sq, &r.lw[l], Xin, dX, dXi);
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
        G3(profile_phase)(m, G3_PH_B_ENGRAM);
        engram_back(m, tok, Tr, r.e, r.vl, r.de, r.dvl, r.dek, r.dev);
        G3(profile_phase)(m, G3_PH_OTHER);
    }
    G3(profile_phase)(m, G3_PH_OTHER);
    *loss = total / (double)denom;
    return 0;
}
