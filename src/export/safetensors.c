/* safetensors reader (see safetensors.h). The header is parsed with cJSON; every number in
 * it must be a non-negative integer that a double holds exactly (below 2^53). */
#include "export/safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fp16.h"

#define ST_MAX_HEADER (100u << 20)

static int as_u64(const cJSON *j, uint64_t *v) {
    if (!cJSON_IsNumber(j)) return -1;
    const double d = j->valuedouble;
    if (!(d >= 0) || d >= 9007199254740992.0 || d != floor(d)) return -1;
    *v = (uint64_t)d;
    return 0;
}

void st_release(st_file *f) {
    if (!f) return;
    for (uint32_t i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    f->tensors = NULL;
    f->n = 0;
}

static int fail_entry(st_file *f, cJSON *root, const char *name, const char *what) {
    needle_fail(NEEDLE_ERR_FORMAT, "safetensors: tensor '%.80s': %s", name, what);
    cJSON_Delete(root);
    st_release(f);
    return NEEDLE_ERR_FORMAT;
}

int st_parse(const uint8_t *image, size_t size, st_file *out) {
    memset(out, 0, sizeof *out);
    if (size < 8) return needle_fail(NEEDLE_ERR_FORMAT, "safetensors: file of %zu bytes is too short", size);
    const uint64_t hlen = rd_u64(image);
    if (hlen > ST_MAX_HEADER || hlen > size - 8)
        return needle_fail(NEEDLE_ERR_FORMAT,
                           "safetensors: header length %llu does not fit the file (%zu bytes)",
                           (unsigned long long)hlen, size);
    cJSON *root = cJSON_ParseWithLength((const char *)image + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return needle_fail(NEEDLE_ERR_FORMAT, "safetensors: the header is not a JSON object");
    }
    const uint8_t *data = image + 8 + hlen;
    const uint64_t data_size = size - 8 - hlen;
    uint32_t count = 0;
    for (cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__")) count++;
    out->tensors = calloc(count ? count : 1, sizeof *out->tensors);
    if (!out->tensors) {
        cJSON_Delete(root);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        st_tensor *t = &out->tensors[out->n];
        if (st_find(out, e->string)) return fail_entry(out, root, e->string, "appears twice");
        t->name = strdup(e->string);
        if (!t->name) {
            cJSON_Delete(root);
            st_release(out);
            return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        }
        out->n++;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
            return fail_entry(out, root, e->string, "needs dtype, shape and data_offsets");
        uint64_t esize;
        if (!strcmp(dt->valuestring, "F32"))
            t->dtype = ST_F32, esize = 4;
        else if (!strcmp(dt->valuestring, "F16"))
            t->dtype = ST_F16, esize = 2;
        else if (!strcmp(dt->valuestring, "BF16"))
            t->dtype = ST_BF16, esize = 2;
        else
            return fail_entry(out, root, e->string, "dtype is not F32, F16 or BF16");
        const int nd = cJSON_GetArraySize(shape);
        if (nd > ST_MAX_DIMS) return fail_entry(out, root, e->string, "more than 8 dimensions");
        t->ndim = (uint32_t)nd;
        uint64_t numel = 1;
        for (int d = 0; d < nd; d++) {
            if (as_u64(cJSON_GetArrayItem(shape, d), &t->shape[d]))
                return fail_entry(out, root, e->string, "a shape entry is not a non-negative integer");
            if (t->shape[d] && numel > UINT64_MAX / 8 / t->shape[d])
                return fail_entry(out, root, e->string, "the shape is too large");
            numel *= t->shape[d];
        }
        t->numel = numel;
        uint64_t b, en;
        if (cJSON_GetArraySize(offs) != 2 || as_u64(cJSON_GetArrayItem(offs, 0), &b) ||
            as_u64(cJSON_GetArrayItem(offs, 1), &en) || en < b)
            return fail_entry(out, root, e->string, "bad data_offsets");
        if (en > data_size)
            return fail_entry(out, root, e->string, "data_offsets run past the end of the file");
        if (en - b != numel * esize)
            return fail_entry(out, root, e->string, "byte size does not match the shape");
        t->data = data + b;
    }
    cJSON_Delete(root);
    return 0;
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (uint32_t i = 0; i < f->n; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

float st_get(const st_tensor *t, uint64_t i) {
    switch (t->dtype) {
    case ST_F32: return rd_f32(t->data + 4 * i);
    case ST_F16: return fp16_to_f32(rd_u16(t->data + 2 * i));
    case ST_BF16: {
        const uint32_t u = (uint32_t)rd_u16(t->data + 2 * i) << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    }
    return 0.0f;
}
