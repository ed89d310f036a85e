/* .cact layout (see cact_write.h). Offsets: the first blob at align64(end of directory),
 * each next one at align64(end of the previous), absolute. */
#include "export/cact_write.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static uint64_t align64(uint64_t x) { return (x + CACT_ALIGN - 1) & ~(uint64_t)(CACT_ALIGN - 1); }

void cw_init(cact_writer *w) { memset(w, 0, sizeof *w); }

void cw_release(cact_writer *w) {
    if (!w) return;
    for (uint32_t i = 0; i < w->n; i++) free(w->tensors[i].blob);
    free(w->tensors);
    memset(w, 0, sizeof *w);
}

int cw_add(cact_writer *w, const char *name, uint8_t dtype, uint8_t ndim, const uint32_t *shape,
           uint32_t group, uint32_t bits, uint8_t *blob, uint64_t nbytes) {
    if (w->n == w->cap) {
        const uint32_t cap = w->cap ? 2 * w->cap : 64;
        cw_tensor *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) {
            free(blob);
            return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory for the tensor list");
        }
        w->tensors = t;
        w->cap = cap;
    }
    cw_tensor *t = &w->tensors[w->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (uint32_t i = 0; i < ndim && i < 4; i++) t->shape[i] = shape[i];
    t->group = group;
    t->bits = bits;
    t->blob = blob;
    t->nbytes = nbytes;
    return 0;
}

static uint64_t header_bytes(const cact_writer *w) {
    return w->v3 ? 4ull * CACT_V3_HEADER_WORDS : CACT_HEADER_BYTES;
}

static uint64_t first_blob(const cact_writer *w) {
    return header_bytes(w) + 4ull * CACT_CODEBOOK_LEN + (uint64_t)CACT_RECORD_BYTES * w->n;
}

uint64_t cw_file_size(const cact_writer *w) {
    uint64_t pos = first_blob(w);
    for (uint32_t i = 0; i < w->n; i++) {
        pos = align64(pos);
        if (w->tensors[i].nbytes > UINT64_MAX / 2 - pos) return 0;
        pos += w->tensors[i].nbytes;
    }
    return pos;
}

static uint8_t *put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}

static uint8_t *put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
    return p + 8;
}

static uint8_t *putf(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return put32(p, u);
}

int cw_serialize(const cact_writer *w, uint8_t **out, size_t *size) {
    *out = NULL;
    *size = 0;
    const uint64_t total = cw_file_size(w);
    if (!total || total > SIZE_MAX)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "the file would be too large");
    uint8_t *buf = calloc(1, (size_t)total);
    if (!buf)
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory for a %llu-byte file",
                           (unsigned long long)total);
    const cact_header *h = &w->h;
    uint8_t *p = buf;
    const uint32_t head[] = {CACT_TAG,
                             w->n,
                             CACT_CODEBOOK_LEN,
                             h->kv_window,
                             h->kv_bits,
                             h->vocab,
                             h->d_model,
                             h->num_heads,
                             h->num_kv_heads,
                             h->num_layers,
                             h->head_dim,
                             h->max_seq_len,
                             h->hada_n,
                             h->mhc_lanes,
                             h->engram_slots,
                             h->engram_sub_dim,
                             h->num_engram_tables,
                             h->engram_conv_taps,
                             h->engram_conv_dilation,
                             h->num_engram_orders,
                             h->engram_orders[0],
                             h->engram_orders[1],
                             h->engram_orders[2],
                             h->engram_orders[3],
                             h->num_engram_sites,
                             h->engram_sites[0],
                             h->engram_sites[1],
                             h->engram_sites[2],
                             h->engram_sites[3]};
    if (w->v3) {
        p = put32(p, CACT_TAG_V3);
        p = put32(p, w->n);
        p = put32(p, CACT_CODEBOOK_LEN);
        for (uint32_t i = 3; i < CACT_V3_HEADER_WORDS; i++) p = put32(p, w->v3_header[i]);
    } else {
        for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) p = put32(p, head[i]);
        p = putf(p, h->rope_theta);
    }
    for (uint32_t i = 0; i < CACT_CODEBOOK_LEN; i++) p = putf(p, w->codebook[i]);
    uint64_t pos = first_blob(w);
    for (uint32_t i = 0; i < w->n; i++) {
        const cw_tensor *t = &w->tensors[i];
        pos = align64(pos);
        p[0] = t->dtype;
        p[1] = t->ndim;
        p[2] = p[3] = 0;
        p += 4;
        for (int k = 0; k < 4; k++) p = put32(p, k < t->ndim ? t->shape[k] : 0);
        p = put64(p, pos);
        p = put64(p, t->nbytes);
        p = put32(p, t->group);
        p = put32(p, t->bits);
        if (t->nbytes) memcpy(buf + pos, t->blob, (size_t)t->nbytes);
        pos += t->nbytes;
    }
    *out = buf;
    *size = (size_t)total;
    return 0;
}
