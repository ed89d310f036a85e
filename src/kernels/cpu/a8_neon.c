/* NEON W·A8 kernels (see a8.h) on little-endian aarch64: the plane sums of 2-bit rows
 * (CQ2, ternary crumbs) on 8 int16 lanes. 3- and 4-bit rows take the plain per-code
 * kernel: with a general code book 4 bits need all 15 planes, more work than per-code sums.
 *
 * For 8 columns, the 16 code bits are duplicated into every 16-bit lane and vtst against
 * a per-lane selector gives one all-ones/zero mask per code bit; their XOR is the third
 * plane, and the int16 activations ANDed with a plane mask are pairwise added into int32
 * (vpadalq). Exact sums and the plain kernel's fmaf combination: bit-identical to the
 * scalar level. Activation rows are in natural order (the plain rotate). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/a8.h"
#include "util/fp16.h"
#include "kernels/cpu/neon.h"

#if NEEDLE_NEON

static const uint16_t sel2[2][8] = {{1 << 0, 1 << 2, 1 << 4, 1 << 6, 1 << 8, 1 << 10, 1 << 12, 1 << 14},
                                    {1 << 1, 1 << 3, 1 << 5, 1 << 7, 1 << 9, 1 << 11, 1 << 13, 1 << 15}};

/* Parity masks par[S] (S = 1..3) of the 8 2-bit columns whose codes start at p. */
static inline void plane_masks(const uint8_t *p, uint16x8_t par[4]) {
    uint16_t w;
    memcpy(&w, p, 2);
    const uint16x8_t v = vdupq_n_u16(w);
    par[1] = vtstq_u16(v, vld1q_u16(sel2[0]));
    par[2] = vtstq_u16(v, vld1q_u16(sel2[1]));
    par[3] = veorq_u16(par[1], par[2]);
}

static void neon_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *rows,
                        size_t ld, uint32_t ntok, float *y, size_t ld_y) {
    const uint32_t G = w->group;
    if ((w->bits != 2 && w->bits != 5) || G % 8) {
        a8_matmul_natural(w, row0, nrows, rows, ld, ntok, y, ld_y);
        return;
    }
    a8_planes P;
    a8_planes_of(w, &P);
    const size_t zoff = a8_row_z_offset(w->cols_pad, G);
    const float rsg = 1.0f / sqrtf((float)G);
    const uint32_t nb = G / 8, np = P.n;
    uint16x8_t masks[3 * (A8_MAX_GROUP / 8)];
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *crow = w->codes + (size_t)r * w->row_bytes;
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        for (uint32_t t = 0; t < ntok; t++) y[t * ld_y + (r - row0)] = 0.0f;
        for (uint32_t g = 0; g < w->ngroups; g++) {
            const uint8_t *cg = crow + (size_t)g * G / 4;
            for (uint32_t b = 0; b < nb; b++) {
                uint16x8_t par[4];
                plane_masks(cg + b * 2, par);
                for (uint32_t p = 0; p < np; p++) masks[p * nb + b] = par[P.sel[p]];
            }
            const float norm = fp16_to_f32(norms[g]);
            for (uint32_t t = 0; t < ntok; t++) {
                const float *xr = rows + t * ld;
                const int16_t *zg = (const int16_t *)(const void *)(xr + zoff) + (size_t)g * G;
                float d = P.cb0 * (float)a8_row_sums_c(xr)[g];
                for (uint32_t p = 0; p < np; p++) {
                    int32x4_t acc = vdupq_n_s32(0);
                    for (uint32_t b = 0; b < nb; b++) {
                        const int16x8_t z = vld1q_s16(zg + 8 * b);
                        const int16x8_t m = vreinterpretq_s16_u16(masks[p * nb + b]);
                        acc = vpadalq_s16(acc, vandq_s16(z, m));
                    }
                    d = fmaf(P.coef[p], (float)vaddvq_s32(acc), d);
                }
                float *yt = y + t * ld_y + (r - row0);
                *yt = fmaf(norm, d, *yt);
            }
        }
        for (uint32_t t = 0; t < ntok; t++) {
            const float st = a8_row_scale(rows + t * ld) * rsg;
            y[t * ld_y + (r - row0)] *= st;
        }
    }
}

static const a8_kernels table = {
    .name = "neon",
    .rotate = a8_rotate_natural,
    .matmul = neon_matmul,
};

const a8_kernels *a8_kernels_neon(void) { return cpu_kernels_neon() ? &table : NULL; }

#else

const a8_kernels *a8_kernels_neon(void) { return NULL; }

#endif
