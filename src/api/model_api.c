/* Public model and tokenizer entry points (needle.h) over the format/model/tokenizer
 * modules: argument checks, file mapping, and error messages. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "util/error.h"
#include "util/fp16.h"
#include "util/platform.h"
#include "util/struct_size.h"

const char *needle_version(void) { return NEEDLE_VERSION_STRING; }

needle_model_params needle_model_default_params(void) {
    needle_model_params p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    return p;
}

/* A model runs where the backend has the ops its traits call for (model_backend_runs:
 * attention3, monarch_mlp for Needle 3; the CPU, CUDA and Metal all have them, backend.h
 * keeps them optional). A backend without them,
 * chosen automatically, gives way to the CPU; one the caller forced (parameter or
 * environment) is an error, never a silent switch. */
static int backend_that_runs(needle_model *m, const char *asked) {
    const char *env[] = {"NEEDLE_BACKEND", "JAX_PLATFORMS", "JAX_PLATFORM_NAME"};
    int forced = asked && *asked;
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++) {
        const char *v = getenv(env[i]);
        if (v && *v) forced = 1;
    }
    const needle_backend_impl *cpu = backend_find("cpu");
    if (forced || !cpu)
        return needle_fail(NEEDLE_ERR_BACKEND, "the %s backend cannot run %s models yet "
                           "(the CPU backend can)", m->backend->name, m->arch->name);
    m->backend = cpu;
    return NEEDLE_OK;
}

static int finish_open(needle_model *m, const needle_model_params *params, needle_model **out) {
    needle_model_params p = needle_model_default_params();
    int rc = struct_size_in(&p, params, sizeof p, "model_open: needle_model_params");
    if (rc) {
        needle_model_free(m);
        return rc;
    }
    m->n_threads = p.n_threads;
    m->depth = p.depth;
    rc = backend_select(p.backend, &m->backend);
    if (rc) {
        needle_model_free(m);
        return rc;
    }
    rc = model_bind(m, m->image, m->image_size);
    if (!rc && !model_backend_runs(m, m->backend->ops)) rc = backend_that_runs(m, p.backend);
    if (!rc && m->backend->ops->model_load)
        rc = m->backend->ops->model_load(&m->w, &m->device_weights);
    if (rc) {
        needle_model_free(m);
        return rc;
    }
    *out = m;
    needle_clear_error();
    return NEEDLE_OK;
}

int needle_model_open(const char *path, const needle_model_params *params, needle_model **out) {
    if (!path || !out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "model_open: NULL argument");
    const void *map;
    size_t size;
    int rc = platform_map_file(path, &map, &size);
    if (rc) return rc;
    needle_model *m = calloc(1, sizeof *m);
    if (!m) {
        platform_unmap_file(map, size);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model_open: out of memory");
    }
    m->mapping = map;
    m->image = map;
    m->image_size = size;
    return finish_open(m, params, out);
}

int needle_model_open_blob(const void *data, size_t size, const needle_model_params *params,
                           needle_model **out) {
    if (!data || !out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "model_open_blob: NULL argument");
    needle_model *m = calloc(1, sizeof *m);
    if (!m) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model_open_blob: out of memory");
    if ((uintptr_t)data % 64) {
        /* Tensor blobs are 64-aligned relative to the image; kernels read fp16 norms
         * directly, so a misaligned image is copied once into aligned memory. */
        m->owned = platform_aligned_alloc(64, size);
        if (!m->owned) {
            free(m);
            return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model_open_blob: out of memory");
        }
        memcpy(m->owned, data, size);
        m->image = m->owned;
    } else {
        m->image = data;
    }
    m->image_size = size;
    return finish_open(m, params, out);
}

void needle_model_free(needle_model *m) {
    if (!m) return;
    if (m->backend && m->backend->ops->model_unload)
        m->backend->ops->model_unload(m->device_weights);
    model_unbind(m);
    platform_unmap_file(m->mapping, m->image_size);
    platform_aligned_free(m->owned);
    free(m);
}

const char *needle_model_backend(const needle_model *m) {
    return m && m->backend ? m->backend->name : NULL;
}

int needle_model_get_info(const needle_model *m, needle_model_info *out) {
    if (!m || !out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "model_get_info: NULL argument");
    needle_model_info full = m->info;
    full.size = sizeof full;
    return struct_size_out(out, &full, sizeof full, "model_get_info: needle_model_info");
}

int needle_model_get_tensor(const needle_model *m, uint32_t index, needle_tensor_info *out) {
    if (!m || !out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "model_get_tensor: NULL argument");
    if (index >= m->file.num_tensors)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tensor %u out of range (%u tensors)",
                           index, m->file.num_tensors);
    const cact_tensor *t = &m->file.tensors[index];
    needle_tensor_info full;
    memset(&full, 0, sizeof full);
    full.size = sizeof full;
    full.name = t->name;
    full.dtype = t->dtype;
    full.ndim = t->ndim;
    memcpy(full.shape, t->shape, sizeof full.shape);
    full.offset = t->offset;
    full.nbytes = t->nbytes;
    full.group_size = t->group;
    full.bits = t->bits;
    return struct_size_out(out, &full, sizeof full, "model_get_tensor: needle_tensor_info");
}

int needle_model_decode_tensor(const needle_model *m, uint32_t index, float *out, size_t cap,
                               size_t *n_values) {
    if (!m || !n_values || (!out && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "model_decode_tensor: NULL argument");
    if (index >= m->file.num_tensors)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tensor %u out of range", index);
    const cact_tensor *t = &m->file.tensors[index];
    if (t->dtype == CACT_RAW)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tensor %u is RAW (not numeric)", index);
    size_t count = 1;
    for (uint32_t k = 0; k < t->ndim; k++) count *= t->shape[k];
    *n_values = count;
    if (cap < count)
        return needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "tensor %u has %zu values, buffer holds "
                           "%zu", index, count, cap);
    if (t->dtype != CACT_CQ && m->fp[index]) {
        memcpy(out, m->fp[index], count * sizeof(float));
        return NEEDLE_OK;
    }
    if (t->dtype != CACT_CQ) { /* a float tensor the model left in the file (model.c) */
        for (size_t k = 0; k < count; k++)
            out[k] = t->dtype == CACT_FP16 ? fp16_to_f32(rd_u16(t->data + 2 * k))
                                           : rd_f32(t->data + 4 * k);
        return NEEDLE_OK;
    }
    cq_matrix w;
    model_cq_view(m, index, &w);
    float *tmp = malloc(w.group * sizeof *tmp);
    if (!tmp) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    for (uint32_t r = 0; r < w.rows; r++) cq_dequant_row(&w, r, out + (size_t)r * w.cols, tmp);
    free(tmp);
    return NEEDLE_OK;
}

static int need_tokenizer(const needle_model *m) {
    if (!m) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "NULL model");
    if (!m->tok) return needle_fail(NEEDLE_ERR_NO_TOKENIZER, "this .cact file has no tokenizer; "
                                    "use token ids");
    return NEEDLE_OK;
}

int needle_tokenize(const needle_model *m, const char *text, size_t len, int32_t *ids,
                    size_t cap, size_t *n_ids) {
    int rc = need_tokenizer(m);
    if (rc) return rc;
    if ((!text && len) || !n_ids || (!ids && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tokenize: NULL argument");
    return tokenizer_encode(m->tok, text ? text : "", len, ids, cap, n_ids);
}

int needle_detokenize(const needle_model *m, const int32_t *ids, size_t n_ids, char *out,
                      size_t cap, size_t *len) {
    int rc = need_tokenizer(m);
    if (rc) return rc;
    if ((!ids && n_ids) || !len || (!out && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "detokenize: NULL argument");
    return tokenizer_decode(m->tok, ids, n_ids, out, cap, len);
}

int needle_token_piece(const needle_model *m, int32_t id, const char **piece, size_t *len) {
    int rc = need_tokenizer(m);
    if (rc) return rc;
    if (!piece || !len) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "token_piece: NULL argument");
    if (id < 0 || (uint32_t)id >= m->w.vocab)
        return needle_fail(NEEDLE_ERR_INVALID_TOKEN, "token %d outside [0, %u)", id, m->w.vocab);
    *piece = tokenizer_piece(m->tok, id, len);
    return NEEDLE_OK;
}
