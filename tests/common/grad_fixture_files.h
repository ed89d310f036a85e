/* What tests/common/grad3_fixture.h and grad2_fixture.h share: the gradient fixtures' files
 * (safetensors checkpoints and gradients, batch JSONL) read from the fixture directory. */
#ifndef NEEDLE_TESTS_GRAD_FIXTURE_FILES_H
#define NEEDLE_TESTS_GRAD_FIXTURE_FILES_H

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "export/safetensors.h"
#include "harness.h"

typedef struct fx_file {
    uint8_t *img;
    st_file st;
} fx_file;

/* A safetensors file of the fixture directory, parsed; 0 on success. */
static inline int fx_open(const char *name, fx_file *f) {
    size_t size = 0;
    memset(f, 0, sizeof *f);
    f->img = read_file(fixture_path(name), &size);
    if (!f->img) return -1;
    if (st_parse(f->img, size, &f->st)) {
        free(f->img);
        f->img = NULL;
        return -1;
    }
    return 0;
}

static inline void fx_close(fx_file *f) {
    if (f->img) st_release(&f->st);
    free(f->img);
    f->img = NULL;
}

typedef struct fx_batch {
    int32_t *ids;
    float *mask;
    uint32_t B, T;
} fx_batch;

/* NAME.batch.jsonl: {"ids": [...], "mask": [...]} per line, one length */
static inline int fx_batch_load(const char *path, fx_batch *b) {
    memset(b, 0, sizeof *b);
    size_t size = 0;
    char *text = (char *)read_file(path, &size);
    if (!text) return -1;
    int rc = 0;
    for (char *line = strtok(text, "\n"); line && !rc; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "ids");
        const cJSON *mask = cJSON_GetObjectItemCaseSensitive(j, "mask");
        const int n = cJSON_GetArraySize(ids);
        if (!cJSON_IsArray(ids) || !cJSON_IsArray(mask) || n < 2 || n != cJSON_GetArraySize(mask) ||
            (b->B && (uint32_t)n != b->T)) {
            rc = -1;
        } else {
            b->T = (uint32_t)n;
            b->ids = realloc(b->ids, (size_t)(b->B + 1) * n * sizeof *b->ids);
            b->mask = realloc(b->mask, (size_t)(b->B + 1) * n * sizeof *b->mask);
            for (int i = 0; i < n; i++) {
                b->ids[(size_t)b->B * n + i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
                b->mask[(size_t)b->B * n + i] = (float)cJSON_GetArrayItem(mask, i)->valuedouble;
            }
            b->B++;
        }
        cJSON_Delete(j);
    }
    free(text);
    return rc || !b->B ? -1 : 0;
}

/* `b` with `extra` more positions at the end of every row: ids drawn from [1, vocab) by a
 * fixed LCG, mask 0 (padding that is not the pad id, so a core that read it would show) */
static inline int fx_batch_pad(const fx_batch *b, uint32_t extra, uint32_t vocab, fx_batch *out) {
    out->B = b->B, out->T = b->T + extra;
    out->ids = malloc((size_t)out->B * out->T * sizeof *out->ids);
    out->mask = calloc((size_t)out->B * out->T, sizeof *out->mask);
    if (!out->ids || !out->mask || vocab < 2) return -1;
    uint32_t x = 12345;
    for (uint32_t r = 0; r < b->B; r++)
        for (uint32_t t = 0; t < out->T; t++) {
            x = x * 1103515245u + 12345u;
            const size_t o = (size_t)r * out->T + t, i = (size_t)r * b->T + t;
            out->ids[o] = t < b->T ? b->ids[i] : (int32_t)(1 + (x >> 8) % (vocab - 1));
            if (t < b->T) out->mask[o] = b->mask[i];
        }
    return 0;
}

static inline void fx_batch_free(fx_batch *b) {
    free(b->ids);
    free(b->mask);
}

#endif
