/* build.h: the image `needle build` writes, for the commands that build in memory
 * (`needle finetune` scores the very file it would write). */
#ifndef NEEDLE_TOOLS_BUILD_H
#define NEEDLE_TOOLS_BUILD_H

#include <stddef.h>
#include <stdint.h>

#include "quant/bits_map.h"
#include "train/checkpoint.h"

typedef struct build_job {
    const char *ckpt_path, *out_path;
    const uint8_t *ckpt_image; /* ckpt_path's bytes when the caller has read them (NULL: read) */
    size_t ckpt_size;
    int generation;               /* 2 or 3 (0: 3); the base archive's */
    const char *config_json;      /* Needle 2: the config when the checkpoint's metadata has
                                   * none (NULL: its `config`) */
    const train_adapter *adapter; /* NULL: none */
    long layers;                  /* 0: the checkpoint's depth */
    const bits_map *bits;
    const uint8_t *tokenizer; /* the base archive's tokenizer tensor */
    size_t tokenizer_size;
    int no_confidence;        /* the confidence head dropped whatever the rule (`needle
                               * calibrate`; no adapter) */
    int quiet;
} build_job;

/* The checkpoint with the adapter merged, cut to the rung and exported (official build):
 * *image (malloc'd) and *size. Returns 0, or 1 after printing the error.
 * Needle 2 (2.0.15 build_main): merged, nothing dropped, no rungs, exported by `needle
 * export`'s code (export_build) with the base archive's tokenizer and the KV-budget window
 * capped by the config's kv_window. */
int build_image(const build_job *job, uint8_t **image, size_t *size);

#endif
