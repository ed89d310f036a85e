/* The Needle 3 training core (issue 32): the official network of cactus-needle 3.2.8
 * (model/architecture.py, SimpleAttentionNetwork.apply over full sequences, no padding
 * mask, as finetune_local calls it) run forward with what the backward needs and
 * differentiated by hand, op by op, for the masked cross-entropy of finetune._loss.
 *
 * Parameters are named tensors, the flax tree paths joined by '/' (the official checkpoint
 * names); each has a gradient buffer of its shape. Memory: the forward keeps the lane
 * stream at each layer boundary (per sequence) and every activation of as many layers as
 * a byte budget holds (g3_set_keep_budget); the backward recomputes the other layers one
 * at a time (activation checkpointing), so activations are O(L*T*n*D + budget + one
 * layer). Keeping or recomputing gives the same bits.
 *
 * Compiled for float (the library) and, by tests/kernels/test_train_ops.c, for double through the
 * G3_REAL / G3 macros (finite differences need double). */
#ifndef NEEDLE_TRAIN_GRAD3_H
#define NEEDLE_TRAIN_GRAD3_H

#include <stddef.h>
#include <stdint.h>

#include "export/export_model_v3.h"

#define G3_MAX_NAME 160

/* The float library by default; a translation unit that defines G3_REAL (double) and
 * G3(name) (a prefix) before including grad3.c gets its own copy at that precision. */
#ifndef G3_REAL
#define G3_REAL float
#define G3_REAL_FLOAT 1 /* the float library: the vector paths of train/dense_ref.h */
#define G3(name) g3_##name
#endif

typedef struct G3(tensor) {
    char name[G3_MAX_NAME];
    uint32_t ndim;
    uint64_t shape[4];
    uint64_t numel;
    G3_REAL *w; /* values */
    G3_REAL *g; /* gradient, same shape */
    int frozen; /* set by the caller: the loss need not compute g of the big tensors (the
                 * dense kernels, the embedding, the engram tables); g is then
                 * unspecified. Small tensors get their gradient anyway. */
} G3(tensor);

typedef struct G3(model) G3(model);

/* A model of config `cfg` whose tensors are read from a parsed official checkpoint
 * (every tensor the network uses must be there with its official shape; probe heads and
 * anything else are ignored), or all zero when ckpt is NULL (for the caller to fill).
 * Returns 0 or a needle error with a message. */
int G3(model_from_checkpoint)(const export3_config *cfg, const st_file *ckpt, G3(model) **out);
void G3(model_free)(G3(model) *m);

/* The parameters in checkpoint order of the network (values and gradients). */
uint32_t G3(tensor_count)(const G3(model) *m);
G3(tensor) *G3(tensor_at)(G3(model) *m, uint32_t i);
G3(tensor) *G3(find)(G3(model) *m, const char *name);

/* on != 0: the forward of quant=True after configure_deploy(act_bits=8, kv_bits=8): A8
 * fake quantization (per row, symmetric int8) of the engram rows, the attention input,
 * the gated attention output, the mHC lane norm and the final hidden state, and per-head
 * int8 of q, k (after RoPE) and v; every one straight-through in the backward. */
void G3(set_fake_quant)(G3(model) * m, int on);

/* The bytes of layer activations the loss may keep from the forward to the backward
 * instead of recomputing those layers (the first layers, as many as fit; 0: recompute
 * every layer). Default G3_KEEP_DEFAULT: at the released geometry all 20 layers of a
 * 256-token sequence (~31 MB each) and 13 of a 1024-token one (~160 MB each), so a
 * 16 x 1024 LoRA step stays under 4 GB. Gradients are bit-identical for every budget. */
#define G3_KEEP_DEFAULT ((size_t)2 << 30)
void G3(set_keep_budget)(G3(model) * m, size_t bytes);
/* How many layers a sequence of length T keeps under the current budget. */
uint32_t G3(kept_layers)(const G3(model) * m, uint32_t T);

/* Threads for the dense products (n <= 0: NEEDLE_THREADS, else the online cores; 1: none).
 * Results are bit-identical for every count. Returns 0 or a negative needle_status. */
int G3(set_threads)(G3(model) * m, int n);

/* fn(arg, i, n) for i in [0, n) on the model's n threads (n = 1 without a pool or m NULL) */
void G3(run_parallel)(const G3(model) * m, void (*fn)(void *arg, int i, int n), void *arg);
/* fn(arg, i, n) on the caller and on every thread that joins before the caller's call
 * returns (cpu_pool_run_shared): for fn that takes its work from a shared counter until
 * none is left, so a descheduled thread delays no one. i: a distinct index < n. */
void G3(run_shared)(const G3(model) * m, void (*fn)(void *arg, int i, int n), void *arg);

/* The low-rank route of a LoRA gradient. For a stacked kernel t = W[L][in][out] adapted as
 * W0 + scale A B (A [L][in][r], B [L][r][out]), the loss then sums, instead of t->g,
 * gaT[l] = sum over tokens of (dy B_l^T)^T x ([L][r][in]) and gb[l] = (x A_l)^T dy
 * ([L][r][out]), x and dy the kernel's input and output gradient: dA_l = scale gaT_l^T and
 * dB_l = scale gb_l, the same sums as scale dW B^T and scale A^T dW reordered, without
 * dW's 2 T in out flops. t->g is then unspecified. Returns 1 if t takes the route (q, k, v,
 * gate and out_proj kernels), 0 if not (its t->g is computed as before), < 0 on error.
 * A NULL clears the route. The pointers must stay valid while it is set. */
int G3(set_low_rank)(G3(model) *m, const G3(tensor) *t, const G3_REAL *A, const G3_REAL *B, uint32_t r,
                     G3_REAL *gaT, G3_REAL *gb);

/* loss = sum over b, t < T-1 of mask[b][t+1] * CE(logits[b][t], ids[b][t+1]) divided by
 * max(sum mask[:, 1:], 1); with grads != 0 every tensor's g is overwritten with dloss/dw.
 * ids: [B][T] token ids (< out_vocab or vocab), mask: [B][T]. The call's work space stays
 * in m for the next call of the same T (a new T replaces it; g3_model_free frees it). */
int G3(loss)(G3(model) *m, const int32_t *ids, const float *mask, uint32_t B, uint32_t T, int grads,
            double *loss);

/* Where a step's time goes: wall seconds per phase since the last reset, each moment
 * charged to exactly one phase (the products inside the attention, the MLP or the engram
 * are charged to the products). The forward run again by the backward (recomputation)
 * is one phase of its own. Costs three clock reads per switch, so it is always on. */
enum {
    G3_PH_OTHER,    /* norms, residuals, masks, copies: what no other phase names */
    G3_PH_QUANT,    /* CQ quantize + dequantize of the weights (lora3) */
    G3_PH_MERGE,    /* W + scale A B, and putting the base back (lora3) */
    G3_PH_F_PROD,   /* forward dense products x W */
    G3_PH_F_ATTN,   /* forward attention, conv taps, q/k norms, RoPE */
    G3_PH_F_MLP,    /* forward Monarch (Hadamard) MLP without its cond_v product */
    G3_PH_F_LANE,   /* forward mHC lanes: projections, Sinkhorn, lane mix */
    G3_PH_F_ENGRAM, /* engram rows, hashing, taps (its products are products) */
    G3_PH_HEAD,     /* logits, cross-entropy and their backward */
    G3_PH_RECOMP,   /* the per-layer forward again inside the backward */
    G3_PH_B_PROD,   /* backward products: dX = dY W^T, dW = X^T dY */
    G3_PH_B_ATTN,
    G3_PH_B_MLP,
    G3_PH_B_LANE,
    G3_PH_B_ENGRAM,
    G3_PH_LORA_AB, /* dA = s dW B^T, dB = s A^T dW (lora3) */
    G3_PH_COUNT
};
void G3(profile_reset)(G3(model) * m);
/* Charges the time since the last switch to the current phase, makes `phase` current and
 * returns the previous one (to switch back to). */
int G3(profile_phase)(const G3(model) * m, int phase);
/* Seconds per phase (G3_PH_COUNT of them), charged up to now. */
const double *G3(profile)(const G3(model) * m);
/* CPU seconds of all the process's threads per phase (a worker's spinning shows here and
 * not in the wall time), and the thread-pool dispatches per phase, over the same span. */
const double *G3(profile_cpu)(const G3(model) * m);
const double *G3(profile_runs)(const G3(model) * m);
const char *G3(profile_name)(int phase);

#endif
