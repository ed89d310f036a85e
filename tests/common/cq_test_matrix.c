/* See cq_test_matrix.h. */
#include "cq_test_matrix.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/cact.h"
#include "util/fp16.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

void rnd_seed(uint64_t seed) { rng_state = seed; }

uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

float rnd_float(void) { return (float)((int)(rnd() % 20001) - 10000) / 10000.0f; }

void make_matrix(test_matrix *tm, uint32_t rows, uint32_t cols, uint32_t group, uint32_t bits) {
    cq_matrix *w = &tm->w;
    memset(tm, 0, sizeof *tm);
    w->rows = rows;
    w->cols = cols;
    w->group = group;
    w->cols_pad = (cols + group - 1) / group * group;
    w->ngroups = w->cols_pad / group;
    w->bits = bits;
    w->row_bytes = (uint32_t)cact_cq_row_bytes(w->cols_pad, bits);
    const size_t nb = (size_t)rows * w->row_bytes, nn = (size_t)rows * w->ngroups;
    tm->codes = malloc(nb ? nb : 1);
    tm->norms = malloc((nn ? nn : 1) * sizeof *tm->norms);
    for (size_t i = 0; i < nb; i++) tm->codes[i] = (uint8_t)rnd();
    for (size_t i = 0; i < nn; i++) tm->norms[i] = f32_to_fp16(0.25f + (float)(rnd() % 1000) / 250.0f);
    for (int i = 0; i < 16; i++) tm->codebook[i] = rnd_float() / sqrtf((float)group);
    w->codes = tm->codes;
    w->norms = tm->norms;
    w->codebook = tm->codebook;
}

void free_matrix(test_matrix *tm) {
    free(tm->codes);
    free(tm->norms);
}

double cq_magnitude(const cq_matrix *w, uint32_t r, const float *x) {
    float *lv = malloc(w->group * sizeof *lv);
    double mag = 0;
    for (uint32_t g = 0; g < w->ngroups; g++) {
        cq_group_levels(w, r, g, lv);
        const double nrm = fabs(fp16_to_f32(w->norms[(size_t)r * w->ngroups + g]));
        for (uint32_t k = 0; k < w->group; k++) mag += nrm * fabs((double)lv[k] * x[g * w->group + k]);
    }
    free(lv);
    return mag;
}
