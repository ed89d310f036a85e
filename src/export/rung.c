/* A ladder rung of a Needle 3 file, sliced record by record (see rung.h). */
#include "export/rung.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/error.h"

/* word positions in the 196-byte header (cact3_header order) */
enum { W_NUM_LAYERS = 10, W_MASK_LO = 17, W_MASK_HI = 18, W_NUM_SITES = 31, W_SITES = 32, W_ROPE = 48 };

void cact3_writer_header(const cact_file *in, cact_writer *w) {
    w->v3 = 1;
    memcpy(w->v3_header, &in->h3.tag, 48 * sizeof(uint32_t));
    memcpy(&w->v3_header[W_ROPE], &in->h3.rope_theta, sizeof(uint32_t));
    for (uint32_t b = 2, k = 0; b <= 4; b++)
        for (uint32_t i = 0; i < (1u << b); i++) w->codebook[k++] = in->codebooks[b][i];
}

static int copy_record(cact_writer *w, const cact_tensor *t, const char *name) {
    uint8_t *blob = malloc(t->nbytes ? (size_t)t->nbytes : 1);
    if (!blob) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
    if (t->nbytes) memcpy(blob, t->data, (size_t)t->nbytes);
    return cw_add(w, name ? name : t->name, t->dtype, t->ndim, t->shape, t->group, t->bits, blob, t->nbytes);
}

/* A float record viewed as [outer][shape[ax]][inner], keeping the `n` indices `keep` of
 * axis `ax` (in that order). */
static int slice_float(cact_writer *w, const cact_tensor *t, uint32_t ax, const uint32_t *keep, uint32_t n) {
    uint64_t outer = 1, inner = 1, count = 1;
    for (uint32_t k = 0; k < t->ndim; k++) {
        count *= t->shape[k];
        if (k < ax) outer *= t->shape[k];
        if (k > ax) inner *= t->shape[k];
    }
    const uint64_t es = count ? t->nbytes / count : 0, span = inner * es, axis = t->shape[ax];
    const uint64_t nbytes = outer * n * span;
    uint8_t *blob = malloc(nbytes ? (size_t)nbytes : 1), *p = blob;
    if (!blob) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
    for (uint64_t o = 0; o < outer; o++)
        for (uint32_t i = 0; i < n; i++, p += span)
            memcpy(p, t->data + (o * axis + keep[i]) * span, (size_t)span);
    uint32_t shape[4];
    memcpy(shape, t->shape, sizeof shape);
    shape[ax] = n;
    return cw_add(w, t->name, t->dtype, t->ndim, shape, t->group, t->bits, blob, nbytes);
}

/* The CQ rows `rows[0, n)` of a CQ record: their packed codes, then their f16 group norms,
 * the two sections of a CQ blob. */
static int slice_cq_rows(cact_writer *w, const cact_tensor *t, const uint32_t *rows, uint32_t n) {
    const uint64_t pad = ((uint64_t)t->shape[1] + t->group - 1) / t->group * t->group;
    const uint64_t rb = cact_cq_row_bytes(pad, t->bits), nb = 2 * (pad / t->group);
    const uint64_t nbytes = (uint64_t)n * (rb + nb);
    uint8_t *blob = malloc(nbytes ? (size_t)nbytes : 1);
    if (!blob) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
    const uint8_t *norms = t->data + (uint64_t)t->shape[0] * rb;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(blob + i * rb, t->data + rows[i] * rb, (size_t)rb);
        memcpy(blob + n * rb + i * nb, norms + rows[i] * nb, (size_t)nb);
    }
    const uint32_t shape[4] = {n, t->shape[1], 0, 0};
    return cw_add(w, t->name, t->dtype, t->ndim, shape, t->group, t->bits, blob, nbytes);
}

/* The CQ rows of the kept blocks of a record whose rows are `per` consecutive rows per
 * block (layer or head cell). */
static int slice_cq_blocks(cact_writer *w, const cact_tensor *t, const uint32_t *blocks, uint32_t n, uint32_t per) {
    uint32_t *rows = malloc((size_t)n * per * sizeof *rows + 1);
    if (!rows) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < per; j++) rows[i * per + j] = blocks[i] * per + j;
    const int st = slice_cq_rows(w, t, rows, n * per);
    free(rows);
    return st;
}

static int cmp_u32(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

#define TRY(expr)                                                                                          \
    do {                                                                                                   \
        if ((st = (expr))) return st;                                                                      \
    } while (0)

int cact3_rung(const cact_file *in, uint32_t depth, cact_writer *w) {
    if (in->generation != 3)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "a ladder rung needs a Needle 3 file (this one is "
                           "generation %u)", in->generation);
    const cact3_header *h = &in->h3;
    const uint32_t L = h->num_layers, n = h->mhc_lanes;
    if (depth < 2 || depth > L)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "depth %u: the file's ladder has depths 2 to %u", depth,
                           L);
    uint32_t keep[CACT3_MAX_LAYERS], cells[CACT3_MAX_LAYERS + 1], new_of[CACT3_MAX_LAYERS];
    model3_ladder_layers(L, depth, keep);
    qsort(keep, depth, sizeof keep[0], cmp_u32);
    for (uint32_t l = 0; l < L; l++) new_of[l] = UINT32_MAX;
    cells[0] = 0;
    for (uint32_t i = 0; i < depth; i++) {
        new_of[keep[i]] = i;
        cells[i + 1] = keep[i] + 1;
    }

    cact3_writer_header(in, w);
    uint32_t *hw = w->v3_header;
    hw[W_NUM_LAYERS] = depth;
    uint64_t mask = (uint64_t)h->global_mask_hi << 32 | h->global_mask_lo, new_mask = 0;
    for (uint32_t l = 0; l < L; l++)
        if (mask >> l & 1 && new_of[l] != UINT32_MAX) new_mask |= 1ull << new_of[l];
    hw[W_MASK_LO] = (uint32_t)new_mask;
    hw[W_MASK_HI] = (uint32_t)(new_mask >> 32);
    uint32_t sites = 0;
    for (uint32_t s = 0; s < CACT3_MAX_SITES; s++) hw[W_SITES + s] = 0;
    for (uint32_t s = 0; s < h->num_engram_sites; s++)
        if (new_of[h->engram_sites[s]] != UINT32_MAX) hw[W_SITES + sites++] = new_of[h->engram_sites[s]];
    hw[W_NUM_SITES] = sites;

    int st;
    const uint32_t stride = in->l3.layer_stride;
    TRY(copy_record(w, &in->tensors[0], NULL));
    for (uint32_t i = 0; i < depth; i++)
        for (uint32_t k = 0; k < stride; k++) {
            const cact_tensor *t = &in->tensors[1 + keep[i] * stride + k];
            const char *dot = strchr(t->name, '.');
            char name[40];
            snprintf(name, sizeof name, "layer%u%s", i, dot ? dot : "");
            TRY(copy_record(w, t, name));
        }
    const cact_tensor *mhc = &in->tensors[in->mhc_base];
    for (uint32_t k = 0; k < 6; k++) TRY(slice_float(w, &mhc[k], 0, keep, depth));
    TRY(slice_cq_blocks(w, &mhc[6], keep, depth, n));
    TRY(slice_cq_blocks(w, &mhc[7], keep, depth, n));
    TRY(slice_cq_blocks(w, &mhc[8], keep, depth, n * n));
    TRY(copy_record(w, &in->tensors[in->l3.perm_index], NULL));
    TRY(copy_record(w, &in->tensors[in->l3.perm_index + 1], NULL));
    for (uint32_t s = 0; s < h->num_engram_sites; s++)
        if (new_of[h->engram_sites[s]] != UINT32_MAX)
            for (uint32_t k = 0; k < 4; k++) TRY(copy_record(w, &in->tensors[in->engram_base + 4 * s + k], NULL));
    TRY(copy_record(w, &in->tensors[in->final_norm_index], NULL));
    if (in->l3.num_heads) {
        uint32_t at = in->l3.heads_index;
        TRY(copy_record(w, &in->tensors[at++], NULL)); /* the manifest */
        for (uint32_t k = 0; k < in->l3.num_heads; k++) {
            const cact_tensor *r = &in->tensors[at];
            const uint32_t kp = r[0].shape[0] / (L + 1), need = in->l3.head_codes[k] == 3 ? 7 : 6;
            TRY(slice_cq_blocks(w, &r[0], cells, depth + 1, kp)); /* probes [cell * kp + k][d] */
            TRY(slice_float(w, &r[1], 0, cells, depth + 1));      /* gain [cell][kp] */
            TRY(copy_record(w, &r[2], NULL));                     /* query */
            TRY(slice_float(w, &r[3], 1, cells, depth + 1));      /* row_bias [q][cell][kp] */
            for (uint32_t j = 4; j < need; j++) TRY(copy_record(w, &r[j], NULL));
            at += need;
        }
    }
    if (in->tokenizer_index >= 0) TRY(copy_record(w, &in->tensors[in->tokenizer_index], NULL));
    return 0;
}
