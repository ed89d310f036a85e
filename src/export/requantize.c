/* .cact -> .cact with another bits map (see requantize.h). */
#include "export/requantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "export/rung.h"
#include "quant/cq_quantize.h"
#include "util/error.h"

int cact_requantize(const cact_file *in, const bits_map *map, export_progress_fn progress, void *user,
                    cact_writer *w) {
    cq_codebooks cb, file_cb;
    int st = cq_codebooks_init(&cb, in->group ? in->group : 128);
    if (st) return st;
    /* decode with the codebooks the input file carries; the ternary levels are not in the
     * file, and the reader computes them as the exporter does; Needle 3's binary levels
     * are analytic too, the loader's */
    file_cb = cb;
    for (uint32_t b = 2; b <= 4; b++)
        for (uint32_t k = 0; k < 16; k++) file_cb.levels[b][k] = in->codebooks[b][k];
    file_cb.levels[CACT3_BITS_BINARY][0] = in->codebooks[CACT3_BITS_BINARY][0];
    file_cb.levels[CACT3_BITS_BINARY][1] = in->codebooks[CACT3_BITS_BINARY][1];
    if (in->generation == 3) cact3_writer_header(in, w);
    else w->h = in->h;
    for (uint32_t b = 2, k = 0; b <= 4; b++)
        for (uint32_t i = 0; i < (1u << b); i++) w->codebook[k++] = cb.levels[b][i];
    /* Needle 3 probe heads are CQ4 whatever the map (the 3.2.8 exporter's HEAD_BITS) */
    const uint32_t first_head = in->generation == 3 && in->l3.num_heads ? in->l3.heads_index : UINT32_MAX;
    for (uint32_t i = 0; i < in->num_tensors; i++) {
        const cact_tensor *t = &in->tensors[i];
        uint8_t *blob;
        uint64_t nbytes = t->nbytes;
        uint32_t bits = t->bits, group = t->group;
        double rel = -1.0;
        if (t->dtype == CACT_CQ) {
            const uint32_t rows = t->shape[0], cols = t->shape[1];
            bits = i > first_head ? 4u : bits_map_lookup(map, t->name);
            group = cb.group;
            nbytes = cq_blob_bytes(rows, cols, bits, group);
            const size_t count = (size_t)rows * cols;
            float *m = malloc(count ? count * sizeof *m : 1);
            blob = nbytes ? malloc((size_t)nbytes) : NULL;
            if (!m || !blob) {
                free(m);
                free(blob);
                return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
            }
            double err = 0, ref = 0;
            st = cq_dequantize_matrix(&file_cb, t->data, rows, cols, t->bits, m);
            if (!st) st = cq_quantize_matrix(&cb, m, rows, cols, bits, blob, &err, &ref);
            free(m);
            if (st) {
                free(blob);
                return st;
            }
            rel = ref > 0 ? sqrt(err / ref) : 0.0;
        } else {
            blob = malloc(nbytes ? (size_t)nbytes : 1);
            if (!blob) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
            if (nbytes) memcpy(blob, t->data, (size_t)nbytes);
        }
        if ((st = cw_add(w, t->name, t->dtype, t->ndim, t->shape, group, bits, blob, nbytes))) return st;
        if (progress) progress(user, i, in->num_tensors, &w->tensors[w->n - 1], rel);
    }
    return 0;
}

int cact_requantize_image(const uint8_t *image, size_t size, const bits_map *map, export_progress_fn progress,
                          void *user, cact_writer *w) {
    cact_file in;
    int st = cact_parse(image, size, &in);
    if (st) return st;
    st = cact_requantize(&in, map, progress, user, w);
    cact_release(&in);
    return st;
}

int cact_check_image(const uint8_t *image, size_t size) {
    cact_file f;
    const int st = cact_parse(image, size, &f);
    if (!st) cact_release(&f);
    return st;
}
