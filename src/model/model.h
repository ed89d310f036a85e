/* The loaded model: a validated .cact image bound into typed weights (spec §1.9, §3).
 *
 * Binding happens once at load into `w` (backend/weights.h): CQ tensors become cq_matrix
 * views into the mapped file (no copy), small FP16/FP32 tensors are widened into one
 * float arena. After model_bind() succeeds every pointer below is valid and sized by the
 * header geometry. */
#ifndef NEEDLE_MODEL_MODEL_H
#define NEEDLE_MODEL_MODEL_H

#include "format/cact.h"
#include "model/arch.h"
#include "backend/weights.h"
#include "kernels/cq.h"
#include "needle.h"
#include "tokenizer/tokenizer.h"

typedef struct probe_head {
    uint32_t code, num_probes, out_dim;
    const float *probes; /* [P][d] */
    const float *proj;   /* [out][P * d] (Needle 3: [out][queries * d]); NULL for Needle 2: */
    const uint8_t *proj_file; /* its FP16 or FP32 values in the file, widened row by row */
    int proj_fp16;
    const float *bias;   /* [out] */
    /* Needle 3 two-stage pooling (NEEDLE3.md §3); rows == 0 for a Needle 2 head.
     * Probe p pools only the cells of row p / per_row; row 0 is the embedding, row l the
     * lane mean after file layer l - 1. */
    uint32_t rows, per_row, queries;
    const float *gain;        /* [rows][per_row] */
    const float *query;       /* [queries][d] */
    const float *row_bias;    /* [queries][rows][per_row] */
    const float *calibration; /* the router's [3], else NULL */
} probe_head;

struct needle_model {
    cact_file file;
    const uint8_t *image;   /* the validated bytes */
    size_t image_size;
    const void *mapping;    /* the file mapped by platform_map_file, or NULL */
    void *owned;            /* aligned copy of a misaligned blob, or NULL */
    tokenizer *tok;         /* NULL if the file has no tokenizer */
    needle_model_info info;
    int32_t n_threads;
    const model_arch *arch; /* the file's architecture (arch.h), chosen once by model_bind */
    const struct needle_backend_impl *backend; /* chosen at open (backend/backend.h) */
    void *device_weights;   /* the backend's copy of the weights (ops->model_load), or NULL */

    model_weights w;         /* geometry and weight views, what the backends read */
    const float **fp;        /* [num_tensors] -> widened values (NULL for CQ/RAW) */
    uint32_t n_probe_heads;
    probe_head probe_heads[CACT_MAX_PROBE_HEADS];
    float *rope_freq;                    /* [head_dim / 2] */
    int32_t depth;                       /* Needle 3 ladder rung asked for (0 = all) */
    void *v3;                            /* Needle 3 binding state (bind3.c), or NULL */
    void *heads3;                        /* Needle 3 head floats (heads3.c), or NULL */
};

/* Validates and binds an image that stays valid for the model's life: parses it, picks
 * m->arch from its generation tag, and runs that architecture's bind. */
int model_bind(struct needle_model *m, const uint8_t *image, size_t size);
void model_unbind(struct needle_model *m);

struct needle_backend_ops;
/* 1 if `ops` has the operations the model's traits call for (attention3, monarch_mlp). */
int model_backend_runs(const struct needle_model *m, const struct needle_backend_ops *ops);

/* Widens the file's FP16/FP32 tensors into m->w.arena / m->fp, `extra` zeroed floats after
 * them; v2_heads leaves Needle 2 head projections in the file (model.c). */
int model_widen_float_tensors(struct needle_model *m, size_t extra, int v2_heads);

/* Needle 2 (bind2.c): binds a parsed file into m->w (spec §1.9) and fills m->info. */
int model2_bind(struct needle_model *m);

/* Needle 3 (bind3.c): binds a parsed file into m->w for the rung m->depth, and fills
 * m->info. model3_unbind frees what it allocated. */
int model3_bind(struct needle_model *m);
/* Floats model3_bind keeps at the end of the model's arena (the mHC scalars in rung
 * order), reserved by the arena's allocation before it runs. */
size_t model3_arena_extra(const cact_file *f);
void model3_unbind(struct needle_model *m);

/* Needle 3 probe heads (heads3.c): the file's heads into m->probe_heads, CQ records
 * dequantized once (they are small); none when a rung of the file is run in place. */
int model3_bind_heads(struct needle_model *m);
void model3_unbind_heads(struct needle_model *m);

/* The first `n` layers of the official ladder order of an `L`-layer model (bisection:
 * 0, L-1, then the midpoint of the widest gap, leftmost first), sorted; n <= L <= 64. */
void model3_ladder_layers(uint32_t L, uint32_t n, uint32_t *out);

/* What the layers above (agent/, api/) read of a model, instead of its fields: the
 * tokenizer (NULL if the file has none), the vocabulary (logit rows), the model width. */
static inline const tokenizer *model_tokenizer(const struct needle_model *m) { return m->tok; }
static inline uint32_t model_vocab(const struct needle_model *m) { return m->w.vocab; }
static inline uint32_t model_width(const struct needle_model *m) { return m->w.d; }
/* The validated .cact bytes, *size of them. */
static inline const uint8_t *model_image(const struct needle_model *m, size_t *size) {
    *size = m->image_size;
    return m->image;
}

/* Engram site index of `layer`, or -1. */
int model_site_of(const struct needle_model *m, uint32_t layer);

/* Fills a cq_matrix view of CQ record `index` (validated by cact_parse). */
void model_cq_view(const struct needle_model *m, uint32_t index, cq_matrix *out);

#endif
