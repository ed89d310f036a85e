/* One .cact record read as the runtime reads it (see cact_records.h). */
#include "train/cact_records.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cq.h"
#include "util/error.h"
#include "util/fp16.h"

int cact_record_widen(const cact_file *f, const cact_tensor *t, float *out, uint64_t numel) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
    if (n != numel)
        return needle_fail(NEEDLE_ERR_FORMAT, ".cact record %s has %llu values, the network wants %llu", t->name,
                           (unsigned long long)n, (unsigned long long)numel);
    if (t->dtype == CACT_FP16) {
        for (uint64_t k = 0; k < n; k++) out[k] = fp16_to_f32(rd_u16(t->data + 2 * k));
        return 0;
    }
    if (t->dtype == CACT_FP32) {
        for (uint64_t k = 0; k < n; k++) out[k] = rd_f32(t->data + 4 * k);
        return 0;
    }
    if (t->dtype != CACT_CQ || t->ndim != 2)
        return needle_fail(NEEDLE_ERR_FORMAT, ".cact record %s: not a float or CQ matrix", t->name);
    /* the view model_cq_view builds over a record */
    cq_matrix w;
    w.rows = t->shape[0];
    w.cols = t->shape[1];
    w.group = t->group;
    w.cols_pad = (w.cols + w.group - 1) / w.group * w.group;
    w.ngroups = w.cols_pad / w.group;
    w.bits = t->bits;
    w.row_bytes = (uint32_t)cact_cq_row_bytes(w.cols_pad, w.bits);
    w.codes = t->data;
    w.norms = (const uint16_t *)(const void *)(t->data + (size_t)w.rows * w.row_bytes);
    w.codebook = f->codebooks[w.bits];
    float *tmp = malloc(w.group * sizeof *tmp);
    if (!tmp) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    for (uint32_t r = 0; r < w.rows; r++) cq_dequant_row(&w, r, out + (size_t)r * w.cols, tmp);
    free(tmp);
    return 0;
}

int cact_record_load(const cact_file *f, uint32_t index, float *dst, uint64_t count, int transpose, uint32_t lead) {
    if (index >= f->num_tensors)
        return needle_fail(NEEDLE_ERR_FORMAT, ".cact: record %u missing (%u records)", index, f->num_tensors);
    const cact_tensor *t = &f->tensors[index];
    if (transpose && (t->ndim != 2 || !lead || t->shape[0] % lead))
        return needle_fail(NEEDLE_ERR_FORMAT, ".cact record %s: not a stack of %u matrices", t->name, lead);
    float *buf = malloc((count ? count : 1) * sizeof *buf);
    if (!buf) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    int st = cact_record_widen(f, t, buf, count);
    if (!st && !transpose) {
        memcpy(dst, buf, count * sizeof *buf);
    } else if (!st) {
        const uint64_t rows = t->shape[0] / lead, cols = t->shape[1];
        for (uint32_t l = 0; l < lead; l++)
            for (uint64_t r = 0; r < rows; r++)
                for (uint64_t c = 0; c < cols; c++)
                    dst[(uint64_t)l * rows * cols + c * rows + r] = buf[((uint64_t)l * rows + r) * cols + c];
    }
    free(buf);
    return st;
}

