/* Binding a validated .cact image into typed weights (see model.h). */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"
#include "util/fp16.h"

void model_cq_view(const struct needle_model *m, uint32_t index, cq_matrix *out) {
    const cact_tensor *t = &m->file.tensors[index];
    cq_matrix w;
    w.rows = t->shape[0];
    w.cols = t->shape[1];
    w.group = t->group;
    w.cols_pad = (w.cols + w.group - 1) / w.group * w.group;
    w.ngroups = w.cols_pad / w.group;
    w.bits = t->bits;
    w.row_bytes = (uint32_t)cact_cq_row_bytes(w.cols_pad, w.bits);
    w.codes = t->data;
    /* 64-aligned blob + even byte count (G >= 16) keeps the norms 2-byte aligned */
    w.norms = (const uint16_t *)(const void *)(t->data + (size_t)w.rows * w.row_bytes);
    w.codebook = m->file.codebooks[w.bits];
    *out = w;
}

int model_site_of(const struct needle_model *m, uint32_t layer) {
    for (uint32_t s = 0; s < m->w.n_sites; s++)
        if (m->w.sites[s].layer == layer) return (int)s;
    return -1;
}

/* Whether float tensor i stays in the file instead of the arena: a Needle 2 probe head's
 * projection (the contrastive one is 128 x 2048, 1 MB as floats, more than every other
 * float tensor together) is read once per embedding or confidence query, by the host
 * (heads.c widens it a row at a time), never by a forward pass; copying it would cost every
 * model that resident megabyte, and its file pages, whether or not a head is ever used. */
static int float_kept_in_file(const cact_file *f, uint32_t i, int v2_heads) {
    if (!v2_heads) return 0;
    for (uint32_t k = 0; k < f->num_probe_heads; k++)
        if (f->probe_heads[k].proj_index == i) return 1;
    return 0;
}

/* Widens every FP16/FP32 tensor but the v2 heads' projections (float_kept_in_file) into
 * one arena: they are small (0.03M values for Needle 2) and read on every token. `extra`
 * zeroed floats follow them, for floats the binding derives (Needle 3's rung-ordered mHC
 * scalars): a device backend uploads the arena as one block, so every float an op reads
 * must live in it. */
int model_widen_float_tensors(struct needle_model *m, size_t extra, int v2_heads) {
    const cact_file *f = &m->file;
    size_t total = 0;
    for (uint32_t i = 0; i < f->num_tensors; i++) {
        const cact_tensor *t = &f->tensors[i];
        if (float_kept_in_file(f, i, v2_heads)) continue;
        if (t->dtype == CACT_FP16) total += t->nbytes / 2;
        else if (t->dtype == CACT_FP32) total += t->nbytes / 4;
    }
    total += extra;
    m->w.arena = calloc(total ? total : 1, sizeof(float));
    m->w.arena_floats = total;
    m->fp = calloc(f->num_tensors, sizeof *m->fp);
    if (!m->w.arena || !m->fp) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model: out of memory");
    float *p = m->w.arena;
    for (uint32_t i = 0; i < f->num_tensors; i++) {
        const cact_tensor *t = &f->tensors[i];
        if (float_kept_in_file(f, i, v2_heads)) continue;
        if (t->dtype == CACT_FP16) {
            size_t n = t->nbytes / 2;
            for (size_t k = 0; k < n; k++) p[k] = fp16_to_f32(rd_u16(t->data + 2 * k));
            m->fp[i] = p;
            p += n;
        } else if (t->dtype == CACT_FP32) {
            size_t n = t->nbytes / 4;
            for (size_t k = 0; k < n; k++) p[k] = rd_f32(t->data + 4 * k);
            m->fp[i] = p;
            p += n;
        }
    }
    return NEEDLE_OK;
}

int model_bind(struct needle_model *m, const uint8_t *image, size_t size) {
    int rc = cact_parse(image, size, &m->file);
    if (rc) return rc;
    m->image = image;
    m->image_size = size;
    m->w.image = image;
    m->w.image_size = size;
    m->w.image_mapped = m->mapping != NULL;
    m->w.codebooks = &m->file.codebooks[0][0];
    m->w.codebooks_bytes = sizeof m->file.codebooks;
    m->w.group = m->file.group;
    m->arch = model_arch_for(m->file.generation);
    if (!m->arch) /* cact_parse accepts only the tags of model_arch_for's table */
        return needle_fail(NEEDLE_ERR_FORMAT, "model: no architecture for generation %u",
                           m->file.generation);
    return m->arch->bind(m);
}

const model_arch *model_arch_for(uint32_t generation) {
    static const model_arch *const known[] = {&model_arch_needle2, &model_arch_needle3};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (known[i]->generation == generation) return known[i];
    return NULL;
}

int model_backend_runs(const struct needle_model *m, const needle_backend_ops *ops) {
    const model_traits *t = &m->w.traits;
    if (t->attention == MODEL_ATTN_SPANNED && !ops->attention3) return 0;
    if (t->mlp == MODEL_MLP_MONARCH && !ops->monarch_mlp) return 0;
    return 1;
}

void model_unbind(struct needle_model *m) {
    if (m->arch) m->arch->unbind(m);
    tokenizer_free(m->tok);
    free(m->w.arena);
    free(m->fp);
    free(m->w.layers);
    free(m->rope_freq);
    cact_release(&m->file);
}
