/* Checkpoints and LoRA adapter files of the training core, in the official formats
 * (docs/spec/TRAINING.md; cactus-needle 3.2.8 needle/model/checkpoints.py), so that a
 * file either side writes the other reads.
 *
 * A checkpoint is a safetensors file: one tensor per parameter, named by its flax tree
 * path joined with "/" (embedding/embedding, layers/attn/q_proj/kernel, ...), and the
 * metadata `format_version` (2 for Needle 3), `config` (the TransformerConfig as JSON),
 * `step` (an integer, or empty) and `run` (JSON). A Needle 2 checkpoint is what
 * `needle export` reads: the same tensor naming, the config in a separate JSON file.
 *
 * An adapter (finetune's write_adapter) holds `lora/<path>/A` ([..., in, rank]) and
 * `lora/<path>/B` ([..., rank, out]) for every adapted kernel <path>, maybe a `rows`
 * tensor, and the metadata `scale`, `base`, `rank`, `seed`, `pieces`, `languages`, each
 * as json.dumps writes the value (null when absent).
 *
 * Every tensor is read into float32 (F16 and BF16 exactly widened) and written as F32.
 * Errors are negative needle_status values with the message recorded (needle_last_error):
 * NEEDLE_ERR_IO, NEEDLE_ERR_FORMAT, NEEDLE_ERR_INVALID_ARGUMENT, NEEDLE_ERR_OUT_OF_MEMORY. */
#ifndef NEEDLE_TRAIN_CHECKPOINT_H
#define NEEDLE_TRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "export/safetensors.h"

/* The format_version of the official 3.x checkpoints (run.CHECKPOINT_FORMAT_VERSION). */
#define TRAIN_CHECKPOINT_FORMAT 2

/* One float32 tensor. In a train_checkpoint / train_adapter the container owns name and
 * data; passed to a writer they are only read. */
typedef struct train_tensor {
    char *name;
    uint32_t ndim; /* 0: a scalar */
    uint64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    float *data;
} train_tensor;

typedef struct train_checkpoint {
    int generation;         /* 3 or 2 (see train_checkpoint_read) */
    int64_t format_version; /* -1: the file has none (a Needle 2 checkpoint) */
    char *config;           /* the config as JSON text (an object) */
    int64_t step;           /* -1: none */
    char *run;              /* JSON text; "{}" when the file has none */
    train_tensor *tensors;  /* the parameters, in file order (mtp_* heads included, which
                             * the official loader drops: a rewrite keeps them) */
    uint32_t n;
    /* The optimizer state saved with the parameters (train/optim.h; the official
     * checkpoints have none): the tensors named under TRAIN_OPTIM_PREFIX and the
     * `optim` metadata (JSON). NULL / 0 when the file has none. */
    char *optim;
    train_tensor *optim_tensors;
    uint32_t n_optim;
} train_checkpoint;

/* Where a checkpoint keeps optimizer tensors: names starting with this are not parameters.
 * The official loader keeps them as an extra "optim" subtree, which its forward pass and
 * exporter never look up. */
#define TRAIN_OPTIM_PREFIX "optim/"

/* Reads the checkpoint at `path`. `config_path` NULL: the config is the file's `config`
 * metadata, and the file must be format_version 2, as the official loader requires. Else
 * the config is that JSON file (a Needle 2 checkpoint, as `needle export --config` takes
 * it) and format_version is whatever the file says. `generation` 2 or 3 says which
 * network the config describes; 0 tells them apart as the official loader does (attn_dim
 * without qk_head_dim: Needle 2), which a Needle 2 config that leaves attn_dim at its
 * default does not show: give 2 for those (as `needle export` needs --v3 for the other). */
int train_checkpoint_read(const char *path, const char *config_path, int generation, train_checkpoint *out);

/* The tensor called `name`, or NULL. */
const train_tensor *train_checkpoint_find(const train_checkpoint *ck, const char *name);

/* Adds the checkpoint's tensors (F32), its optimizer state if any, and its metadata to
 * `w` (the caller may add more before st_writer_write). The names must form a tree the official
 * reader can rebuild: no empty path component, no name that is a prefix directory of
 * another ("a" and "a/b"), else NEEDLE_ERR_INVALID_ARGUMENT. config must be a JSON object
 * and run JSON (NULL: "{}"). The tensors' data must stay valid until the write. */
int train_checkpoint_stage(st_writer *w, const train_checkpoint *ck);

/* train_checkpoint_stage + st_writer_write: the file appears whole or not at all. */
int train_checkpoint_write(const char *path, const train_checkpoint *ck);

void train_checkpoint_release(train_checkpoint *ck);

/* ---- LoRA adapters -------------------------------------------------------------------- */

typedef struct train_lora {
    char *path;     /* the adapted kernel's tree path, e.g. "layers/attn/q_proj/kernel" */
    train_tensor a; /* named lora/<path>/A: [..., in, rank] */
    train_tensor b; /* named lora/<path>/B: [..., rank, out] */
} train_lora;

typedef struct train_adapter {
    train_lora *lora; /* in the file's order */
    uint32_t n;
    double scale;     /* alpha / rank: the merged kernel is W + scale * A @ B */
    char *base;       /* the base checkpoint's path as written (NULL: null) */
    int64_t rank;     /* every A's last and B's second-to-last dimension */
    int64_t seed;
    int has_seed;     /* 0: the file's seed is null */
    char *pieces;     /* JSON text of these metadata (whistle's vocabulary fields), kept */
    char *languages;  /* verbatim; NULL when null or absent */
    train_tensor *rows; /* the `rows` tensor, or NULL */
} train_adapter;

/* Reads an adapter. Refused: a tensor that is neither lora/<path>/A|B nor rows, an A
 * without its B (or the reverse), shapes that do not chain ([..., in, r] @ [..., r, out]
 * with the same leading dimensions and r = rank), a scale that is not a finite number. */
int train_adapter_read(const char *path, train_adapter *out);

/* Writes `ad` as write_adapter does (each metadata value as json.dumps writes it: scale
 * as Python's float repr, base with non-ASCII escaped). Same checks as the reader. */
int train_adapter_write(const char *path, const train_adapter *ad);

/* The LoRA entry for kernel `path`, or NULL. */
const train_lora *train_adapter_find(const train_adapter *ad, const char *path);

void train_adapter_release(train_adapter *ad);

/* ---- any tensors ---------------------------------------------------------------------- */

/* Writes tensors[0..n) (F32, names as given) and the metadata `metadata`: key, value,
 * key, value, ..., NULL (or NULL for none), atomically. For gradients, probes and other
 * outputs that follow no fixed schema. */
int train_write_tensors(const char *path, const train_tensor *tensors, uint32_t n,
                        const char *const *metadata);

/* A copy of an st_file tensor as float32 into `t` (name copied). */
int train_tensor_from_st(const st_tensor *src, train_tensor *t);
void train_tensor_release(train_tensor *t);

#endif
