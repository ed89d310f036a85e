/* Portable reference kernels for CQ matrices (see kernels/cq.h). Every SIMD or GPU
 * kernel is tested against these. */
#include <math.h>
#include <string.h>

#include "kernels/cq.h"
#include "kernels/nmath.h"
#include "util/fp16.h"

void fwht(float *x, uint32_t n) { nm_fwht(x, n); }

void cq_rotate(const cq_matrix *w, const float *x, float *xr) {
    const float scale = 1.0f / sqrtf((float)w->group);
    if (xr != x) memcpy(xr, x, w->cols * sizeof *xr);
    memset(xr + w->cols, 0, (w->cols_pad - w->cols) * sizeof *xr);
    for (uint32_t g = 0; g < w->ngroups; g++) {
        float *v = xr + (size_t)g * w->group;
        fwht(v, w->group);
        for (uint32_t k = 0; k < w->group; k++) v[k] *= scale;
    }
}

void cq_group_levels(const cq_matrix *w, uint32_t r, uint32_t g, float *out) {
    const uint8_t *row = w->codes + (size_t)r * w->row_bytes;
    const float *cb = w->codebook;
    const uint32_t G = w->group;
    switch (w->bits) {
    case 1: { /* Needle 3 binary: 8 codes a byte, LSB first */
        const uint8_t *p = row + (size_t)g * G / 8;
        for (uint32_t k = 0; k < G; k += 8) {
            uint8_t b = *p++;
            for (uint32_t i = 0; i < 8; i++) out[k + i] = cb[(b >> i) & 1];
        }
        break;
    }
    case 2:
    case 5: {
        const uint8_t *p = row + (size_t)g * G / 4;
        for (uint32_t k = 0; k < G; k += 4) {
            uint8_t b = *p++;
            out[k] = cb[b & 3];
            out[k + 1] = cb[(b >> 2) & 3];
            out[k + 2] = cb[(b >> 4) & 3];
            out[k + 3] = cb[b >> 6];
        }
        break;
    }
    case 4: {
        const uint8_t *p = row + (size_t)g * G / 2;
        for (uint32_t k = 0; k < G; k += 2) {
            uint8_t b = *p++;
            out[k] = cb[b & 15];
            out[k + 1] = cb[b >> 4];
        }
        break;
    }
    default: { /* 3 bits: 8 indices per 3 bytes */
        const uint8_t *p = row + (size_t)g * G * 3 / 8;
        for (uint32_t k = 0; k < G; k += 8, p += 3) {
            uint32_t word = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16);
            for (uint32_t i = 0; i < 8; i++) out[k + i] = cb[(word >> (3 * i)) & 7];
        }
        break;
    }
    }
}

void cq_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr, size_t ld_x,
               uint32_t ntok, float *y, size_t ld_y) {
    float levels[4096];
    const uint32_t G = w->group;
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        for (uint32_t t = 0; t < ntok; t++) y[t * ld_y + (r - row0)] = 0.0f;
        for (uint32_t g = 0; g < w->ngroups; g++) {
            cq_group_levels(w, r, g, levels);
            const float norm = fp16_to_f32(norms[g]);
            for (uint32_t t = 0; t < ntok; t++) {
                const float *x = xr + t * ld_x + (size_t)g * G;
                float acc = 0.0f;
                for (uint32_t k = 0; k < G; k++) acc += levels[k] * x[k];
                y[t * ld_y + (r - row0)] += norm * acc;
            }
        }
    }
}

void cq_dequant_row(const cq_matrix *w, uint32_t r, float *out, float *tmp) {
    const uint32_t G = w->group;
    const float scale = 1.0f / sqrtf((float)G);
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    for (uint32_t g = 0; g < w->ngroups; g++) {
        cq_group_levels(w, r, g, tmp);
        const float norm = fp16_to_f32(norms[g]);
        for (uint32_t k = 0; k < G; k++) tmp[k] *= norm;
        fwht(tmp, G);
        uint32_t start = g * G, n = G;
        if (start + n > w->cols) n = w->cols - start;
        for (uint32_t k = 0; k < n; k++) out[start + k] = tmp[k] * scale;
    }
}
