/* The Needle 2 training core (issue 32): the official network of cactus-needle 2.0.15
 * (model/architecture.py, SimpleAttentionNetwork.apply over full sequences with no mask,
 * i.e. causal, as finetune_local calls it) run forward with what the backward needs and
 * differentiated by hand, op by op, for the masked cross-entropy of finetune_local.
 * The same shape as grad3.h (the Needle 3 core), so a per-generation caller drives both.
 *
 * Parameters are named tensors, the flax tree paths joined by '/' (the names `needle
 * export` reads a Needle 2 checkpoint by); each has a gradient buffer of its shape.
 * Memory: the forward keeps only the lane stream at each layer boundary (per sequence);
 * the backward recomputes one layer at a time (activation checkpointing).
 *
 * Compiled for float (the library) and, by tests/kernels/test_train_ops2.c, for double through
 * the G2_REAL / G2 macros (finite differences need double). */
#ifndef NEEDLE_TRAIN_GRAD2_H
#define NEEDLE_TRAIN_GRAD2_H

#include <stddef.h>
#include <stdint.h>

#include "export/export_model.h"

#define G2_MAX_NAME 160

/* The float library by default; a translation unit that defines G2_REAL (double) and
 * G2(name) (a prefix) before including grad2.c gets its own copy at that precision. */
#ifndef G2_REAL
#define G2_REAL float
#define G2_REAL_FLOAT 1 /* the float library: the vector paths of train/dense_ref.h */
#define G2(name) g2_##name
#endif

typedef struct G2(tensor) {
    char name[G2_MAX_NAME];
    uint32_t ndim;
    uint64_t shape[4];
    uint64_t numel;
    G2_REAL *w; /* values */
    G2_REAL *g; /* gradient, same shape */
    int frozen; /* set by the caller: the loss need not compute g of the big tensors (the
                 * dense kernels, the embedding, the engram tables); g is then
                 * unspecified. Small tensors get their gradient anyway. */
} G2(tensor);

typedef struct G2(model) G2(model);

/* A model of config `cfg` (export_config_parse of the Needle 2 TransformerConfig) whose
 * tensors are read from a Needle 2 checkpoint (every tensor the network uses must be there
 * with its official shape; mtp_*, probe heads and anything else are ignored), or all zero
 * when ckpt is NULL (for the caller to fill). Returns 0 or a needle error with a message. */
int G2(model_from_checkpoint)(const export_config *cfg, const st_file *ckpt, G2(model) **out);
void G2(model_free)(G2(model) *m);

/* The parameters of the network (values and gradients), in a fixed order. */
uint32_t G2(tensor_count)(const G2(model) *m);
G2(tensor) *G2(tensor_at)(G2(model) *m, uint32_t i);
G2(tensor) *G2(find)(G2(model) *m, const char *name);

/* on != 0: the forward of quant=True after configure_deploy(act_bits=8, kv_bits=8), which
 * in 2.0.15 means A8 fake quantization (per row, symmetric int8) of the engram rows, the
 * attention input, the gated attention output and the final hidden state, each
 * straight-through in the backward; no K/V quantization (2.0.15 turns it off for
 * kv_bits >= 8). */
void G2(set_fake_quant)(G2(model) * m, int on);

/* Threads for the dense products (n <= 0: NEEDLE_THREADS, else the online cores; 1: none).
 * Results are bit-identical for every count. Returns 0 or a negative needle_status. */
int G2(set_threads)(G2(model) * m, int n);

/* fn(arg, i, n) for i in [0, n) on the model's n threads (n = 1 without a pool) */
void G2(run_parallel)(const G2(model) * m, void (*fn)(void *arg, int i, int n), void *arg);

/* loss = sum over b, t < T-1 of mask[b][t+1] * CE(logits[b][t], ids[b][t+1]) divided by
 * max(sum mask[:, 1:], 1); with grads != 0 every tensor's g is overwritten with dloss/dw.
 * ids: [B][T] token ids (< vocab), mask: [B][T]. */
int G2(loss)(G2(model) *m, const int32_t *ids, const float *mask, uint32_t B, uint32_t T, int grads,
            double *loss);

#endif
