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

static inline void fx_batch_free(fx_batch *b) {
    free(b->ids);
    free(b->mask);
}

#endif
