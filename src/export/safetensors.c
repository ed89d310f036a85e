/* safetensors reader (see safetensors.h). The header is parsed with cJSON; every number in
 * it must be a non-negative integer that a double holds exactly (below 2^53). */
#include "export/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _WIN32
#include <io.h>
#include <process.h>
#else
#include <unistd.h>
#endif

#include "util/error.h"
#include "util/fp16.h"
#include "util/platform.h"

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
    for (uint32_t i = 0; i < f->n_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    memset(f, 0, sizeof *f);
}

/* `__metadata__`: the format's Option<HashMap<String, String>>, so an object whose values
 * are all strings (JSON null for the whole map reads as none). */
static int parse_metadata(const cJSON *m, st_file *out) {
    if (cJSON_IsNull(m)) return 0;
    if (!cJSON_IsObject(m))
        return needle_fail(NEEDLE_ERR_FORMAT, "safetensors: __metadata__ is not a JSON object");
    uint32_t count = 0;
    for (const cJSON *e = m->child; e; e = e->next) count++;
    if (!count) return 0;
    out->meta = calloc(count, sizeof *out->meta);
    if (!out->meta) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    for (const cJSON *e = m->child; e; e = e->next) {
        if (!cJSON_IsString(e))
            return needle_fail(NEEDLE_ERR_FORMAT, "safetensors: metadata '%.80s' is not a string", e->string);
        if (st_meta_get(out, e->string))
            return needle_fail(NEEDLE_ERR_FORMAT, "safetensors: metadata '%.80s' appears twice", e->string);
        st_meta *kv = &out->meta[out->n_meta];
        kv->key = strdup(e->string);
        kv->value = strdup(e->valuestring);
        if (kv->key) out->n_meta++;
        if (!kv->key || !kv->value) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    return 0;
}

const char *st_meta_get(const st_file *f, const char *key) {
    for (uint32_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[i].key, key)) return f->meta[i].value;
    return NULL;
}

/* Whether the JSON text escapes a NUL (\\u0000), which a C string would silently cut:
 * a backslash run of odd length followed by u0000. Outside strings valid JSON has no
 * backslash, so no lexing is needed. */
static int has_escaped_nul(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') continue;
        size_t run = 0;
        while (i < n && s[i] == '\\') i++, run++;
        if ((run & 1) && n - i >= 5 && !memcmp(s + i, "u0000", 5)) return 1;
    }
    return 0;
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
    if (has_escaped_nul((const char *)image + 8, (size_t)hlen)) {
        cJSON_Delete(root);
        return needle_fail(NEEDLE_ERR_FORMAT, "safetensors: a name or metadata value holds a NUL character");
    }
    int seen_meta = 0;
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
        if (!strcmp(e->string, "__metadata__")) {
            if (seen_meta++) return fail_entry(out, root, e->string, "appears twice");
            const int st = parse_metadata(e, out);
            if (st) {
                cJSON_Delete(root);
                st_release(out);
                return st;
            }
            continue;
        }
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

/* ---- writer --------------------------------------------------------------------------- */

static const char *dtype_name(st_dtype d) { return d == ST_F32 ? "F32" : d == ST_F16 ? "F16" : "BF16"; }
static uint64_t dtype_size(st_dtype d) { return d == ST_F32 ? 4 : 2; }

void st_writer_init(st_writer *w) { memset(w, 0, sizeof *w); }

void st_writer_release(st_writer *w) {
    if (!w) return;
    for (uint32_t i = 0; i < w->n; i++) free(w->tensors[i].name);
    free(w->tensors);
    for (uint32_t i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->meta);
    memset(w, 0, sizeof *w);
}

int st_writer_add(st_writer *w, const char *name, st_dtype dtype, uint32_t ndim, const uint64_t *shape,
                  const float *data) {
    if (!name || !*name || !strcmp(name, "__metadata__"))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "safetensors: a tensor needs a name (not __metadata__)");
    if (dtype != ST_F32 && dtype != ST_F16 && dtype != ST_BF16)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "safetensors: tensor '%.80s': unknown dtype", name);
    if (ndim > ST_MAX_DIMS)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "safetensors: tensor '%.80s': more than 8 dimensions", name);
    for (uint32_t i = 0; i < w->n; i++)
        if (!strcmp(w->tensors[i].name, name))
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "safetensors: tensor '%.80s' added twice", name);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        /* the same bound as the reader's (and below 2^53, which JSON numbers hold) */
        if (shape[d] && numel > (UINT64_MAX >> 11) / 8 / shape[d])
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "safetensors: tensor '%.80s' is too large", name);
        numel *= shape[d];
    }
    if (numel && !data)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "safetensors: tensor '%.80s' has no data", name);
    if (w->n == w->cap) {
        const uint32_t cap = w->cap ? 2 * w->cap : 16;
        st_wtensor *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        w->tensors = t;
        w->cap = cap;
    }
    st_wtensor *t = &w->tensors[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    t->dtype = dtype;
    t->ndim = ndim;
    for (uint32_t d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->numel = numel;
    t->data = data;
    w->n++;
    return 0;
}

int st_writer_meta(st_writer *w, const char *key, const char *value) {
    if (!key || !value) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "safetensors: metadata needs a key and a value");
    char *v = strdup(value);
    if (!v) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    for (uint32_t i = 0; i < w->n_meta; i++)
        if (!strcmp(w->meta[i].key, key)) {
            free(w->meta[i].value);
            w->meta[i].value = v;
            return 0;
        }
    if (w->n_meta == w->cap_meta) {
        const uint32_t cap = w->cap_meta ? 2 * w->cap_meta : 8;
        st_meta *m = realloc(w->meta, cap * sizeof *m);
        if (!m) {
            free(v);
            return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        }
        w->meta = m;
        w->cap_meta = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    w->meta[w->n_meta++] = (st_meta){k, v};
    return 0;
}

/* Data order: widest element first (so each tensor starts aligned to its element size,
 * the data section itself starting on a multiple of 8), then by name, the order
 * huggingface's writer uses. */
static int by_layout(const void *a, const void *b) {
    const st_wtensor *x = *(const st_wtensor *const *)a, *y = *(const st_wtensor *const *)b;
    const uint64_t sx = dtype_size(x->dtype), sy = dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The header JSON padded with spaces to a multiple of 8 (malloc'd), or NULL. */
static char *header_json(const st_writer *w, const st_wtensor *const *order, size_t *len) {
    cJSON *root = cJSON_CreateObject(), *meta = NULL;
    int ok = root != NULL;
    if (ok && w->n_meta) {
        ok = (meta = cJSON_AddObjectToObject(root, "__metadata__")) != NULL;
        for (uint32_t i = 0; ok && i < w->n_meta; i++)
            ok = cJSON_AddStringToObject(meta, w->meta[i].key, w->meta[i].value) != NULL;
    }
    uint64_t offset = 0;
    for (uint32_t k = 0; ok && k < w->n; k++) {
        const st_wtensor *t = order[k];
        cJSON *e = cJSON_AddObjectToObject(root, t->name), *shape = NULL, *offs = NULL;
        ok = e && cJSON_AddStringToObject(e, "dtype", dtype_name(t->dtype)) &&
             (shape = cJSON_AddArrayToObject(e, "shape")) && (offs = cJSON_AddArrayToObject(e, "data_offsets"));
        for (uint32_t d = 0; ok && d < t->ndim; d++) ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        const uint64_t end = offset + t->numel * dtype_size(t->dtype);
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)end));
        offset = end;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return NULL;
    const size_t n = strlen(text), padded = (n + 7) & ~(size_t)7;
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = 0;
    *len = padded;
    return out;
}

/* One tensor's bytes, little-endian, through a bounded buffer. */
static int write_tensor(FILE *f, const st_wtensor *t) {
    static const union {
        uint32_t u;
        uint8_t b[4];
    } probe = {1};
    if (!t->numel) return 0; /* an empty tensor may have no data pointer */
    if (t->dtype == ST_F32 && probe.b[0]) /* the host's floats are the file's bytes */
        return fwrite(t->data, sizeof(float), (size_t)t->numel, f) == (size_t)t->numel ? 0 : -1;
    uint8_t buf[4096];
    const uint64_t esize = dtype_size(t->dtype), per = sizeof buf / esize;
    for (uint64_t i = 0; i < t->numel; i += per) {
        const uint64_t m = t->numel - i < per ? t->numel - i : per;
        for (uint64_t j = 0; j < m; j++) {
            uint32_t u;
            memcpy(&u, &t->data[i + j], 4);
            uint8_t *p = buf + j * esize;
            if (t->dtype == ST_F16) {
                u = f32_to_fp16(t->data[i + j]);
            } else if (t->dtype == ST_BF16) {
                /* round to nearest even on the dropped 16 bits; NaN stays a (quiet) NaN */
                if ((u & 0x7fffffffu) > 0x7f800000u)
                    u = (u >> 16) | 0x40u;
                else
                    u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            }
            for (uint64_t b = 0; b < esize; b++) p[b] = (uint8_t)(u >> (8 * b));
        }
        if (fwrite(buf, (size_t)esize, (size_t)m, f) != m) return -1;
    }
    return 0;
}

static int sync_file(FILE *f) {
#ifdef _WIN32
    return _commit(_fileno(f));
#else
    return fsync(fileno(f));
#endif
}

int st_writer_write(const st_writer *w, const char *path) {
    const st_wtensor **order = malloc((w->n ? w->n : 1) * sizeof *order);
    if (!order) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    for (uint32_t i = 0; i < w->n; i++) order[i] = &w->tensors[i];
    qsort(order, w->n, sizeof *order, by_layout);
    size_t hlen = 0;
    char *header = header_json(w, order, &hlen);
    if (!header) {
        free(order);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        free(order);
        free(header);
        return needle_fail(NEEDLE_ERR_IO, "%.200s: the path is too long", path);
    }
    FILE *f = platform_fopen(tmp, "wb");
    if (!f) {
        const int e = errno;
        free(order);
        free(header);
        return needle_fail(NEEDLE_ERR_IO, "cannot create %.200s: %s", tmp, strerror(e));
    }
    uint8_t len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen;
    for (uint32_t k = 0; ok && k < w->n; k++) ok = !write_tensor(f, order[k]);
    /* the bytes must be on disk before the rename publishes them: a full disk or an I/O
     * error shows at the flush, the sync or the close at the latest */
    ok = ok && fflush(f) == 0 && sync_file(f) == 0;
    int e = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) ok = 0, e = errno;
    if (ok && platform_replace_file(tmp, path) != 0) ok = 0, e = errno;
    free(order);
    free(header);
    if (!ok) {
        platform_remove(tmp);
        return needle_fail(NEEDLE_ERR_IO, "cannot write %.200s: %s", path, strerror(e ? e : EIO));
    }
    return 0;
}
