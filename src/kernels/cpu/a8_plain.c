/* Portable W·A8 kernels (see a8.h), the level selection, and the threaded batch driver.
 * Every SIMD level is tested bit for bit against these (tests/kernels/test_a8.c). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/a8.h"
#include "util/fp16.h"

int a8_supported(const cq_matrix *w) {
    return w->group >= 8 && w->group <= A8_MAX_GROUP && w->cols_pad <= A8_MAX_COLS &&
           a8_row_floats(w->cols_pad, w->group) <= w->cols_pad;
}

void a8_planes_of(const cq_matrix *w, a8_planes *out) {
    const uint32_t bits = (w->bits == 2 || w->bits == 5) ? 2 : w->bits;
    const uint32_t levels = 1u << bits;
    memset(out, 0, sizeof *out);
    out->bits = bits;
    out->cb0 = w->codebook[0];
    for (uint32_t S = 1; S < levels; S++) {
        /* f32 levels summed in double: exact, so a symmetric book gives exact zeros */
        double f = 0.0;
        for (uint32_t c = 0; c < levels; c++) {
            const int odd = __builtin_popcount(c & S) & 1;
            f += odd ? -(double)w->codebook[c] : (double)w->codebook[c];
        }
        if (f == 0.0) continue;
        out->sel[out->n] = (uint8_t)S;
        out->coef[out->n] = (float)(-2.0 * f / (double)levels);
        out->n++;
    }
}

float a8_quantize(const float *x, uint32_t cols, uint32_t cols_pad, int16_t *q) {
    float amax = 0.0f;
    for (uint32_t k = 0; k < cols; k++) amax = fmaxf(amax, fabsf(x[k]));
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    for (uint32_t k = 0; k < cols; k++) {
        float v = nearbyintf(x[k] / s); /* the default rounding mode: half to even */
        v = v < -128.0f ? -128.0f : v > 127.0f ? 127.0f : v;
        if (v != v) v = 0.0f; /* a NaN activation (corrupt weights): no undefined cast */
        q[k] = (int16_t)v;
    }
    for (uint32_t k = cols; k < cols_pad; k++) q[k] = 0;
    return s;
}

/* z = H_G q in place (Sylvester order, unnormalised); |z| <= 128 G fits int16. */
static void fwht_i16(int16_t *v, uint32_t n) {
    for (uint32_t h = 1; h < n; h <<= 1)
        for (uint32_t i = 0; i < n; i += 2 * h)
            for (uint32_t j = i; j < i + h; j++) {
                const int32_t a = v[j], b = v[j + h];
                v[j] = (int16_t)(a + b);
                v[j + h] = (int16_t)(a - b);
            }
}

void a8_rotate_natural(const cq_matrix *w, const float *x, float *row) {
    int16_t q[A8_MAX_COLS];
    const uint32_t G = w->group, cols_pad = w->cols_pad;
    int16_t *z = (int16_t *)(void *)(row + a8_row_z_offset(cols_pad, G));
    int32_t *sums = a8_row_sums(row);
    /* x may alias row: quantize everything first (q is the only copy afterwards) */
    const float s = a8_quantize(x, w->cols, cols_pad, q);
    for (uint32_t g = 0; g < w->ngroups; g++) {
        int16_t *zg = z + (size_t)g * G;
        memcpy(zg, q + (size_t)g * G, G * sizeof *zg);
        fwht_i16(zg, G);
        int32_t t = 0;
        for (uint32_t k = 0; k < G; k++) t += zg[k];
        sums[g] = t;
    }
    /* padding zeroed: a row is a function of x alone */
    for (uint32_t g = w->ngroups; g % 8; g++) sums[g] = 0;
    row[0] = s;
    for (int i = 1; i < 8; i++) row[i] = 0.0f;
}

void a8_unpack_codes(const cq_matrix *w, const uint8_t *row, uint32_t k0, uint32_t n,
                         uint8_t *codes) {
    switch (w->bits) {
    case 1: /* Needle 3 binary: 8 codes a byte */
        for (uint32_t k = 0; k < n; k += 8) {
            const uint8_t b = row[(k0 + k) / 8];
            for (uint32_t i = 0; i < 8; i++) codes[k + i] = (b >> i) & 1u;
        }
        break;
    case 2:
    case 5:
        for (uint32_t k = 0; k < n; k += 4) {
            const uint8_t b = row[(k0 + k) / 4];
            codes[k] = b & 3u;
            codes[k + 1] = (b >> 2) & 3u;
            codes[k + 2] = (b >> 4) & 3u;
            codes[k + 3] = b >> 6;
        }
        break;
    case 4:
        for (uint32_t k = 0; k < n; k += 2) {
            const uint8_t b = row[(k0 + k) / 2];
            codes[k] = b & 15u;
            codes[k + 1] = b >> 4;
        }
        break;
    default: /* 3 bits: 8 codes per 3 bytes */
        for (uint32_t k = 0; k < n; k += 8) {
            const uint8_t *p = row + (size_t)(k0 + k) / 8 * 3;
            const uint32_t word = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16);
            for (uint32_t i = 0; i < 8; i++) codes[k + i] = (word >> (3 * i)) & 7u;
        }
        break;
    }
}

void a8_matmul_natural(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *rows,
                       size_t ld, uint32_t ntok, float *y, size_t ld_y) {
    a8_planes P;
    a8_planes_of(w, &P);
    const uint32_t G = w->group;
    const size_t zoff = a8_row_z_offset(w->cols_pad, G);
    const float rsg = 1.0f / sqrtf((float)G);
    const uint32_t levels = 1u << P.bits;
    uint8_t codes[A8_MAX_GROUP];
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *crow = w->codes + (size_t)r * w->row_bytes;
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        /* y accumulates in place: the same fmaf sequence as a register accumulator */
        for (uint32_t t = 0; t < ntok; t++) y[t * ld_y + (r - row0)] = 0.0f;
        for (uint32_t g = 0; g < w->ngroups; g++) {
            a8_unpack_codes(w, crow, g * G, G, codes);
            const float norm = fp16_to_f32(norms[g]);
            for (uint32_t t = 0; t < ntok; t++) {
                const float *xr = rows + t * ld;
                const int16_t *zg = (const int16_t *)(const void *)(xr + zoff) + (size_t)g * G;
                const int32_t T = a8_row_sums_c(xr)[g];
                /* per-code sums, then their Walsh transform W_S = T - 2 Q_S gives every
                 * parity plane at once */
                int32_t W4[4][16] = {{0}}, W[16];
                for (uint32_t k = 0; k < G; k += 4) /* 4 tables: no store-load chains */
                    for (uint32_t i = 0; i < 4; i++) W4[i][codes[k + i]] += zg[k + i];
                for (uint32_t c = 0; c < 16; c++) W[c] = W4[0][c] + W4[1][c] + W4[2][c] + W4[3][c];
                for (uint32_t h = 1; h < levels; h <<= 1)
                    for (uint32_t i = 0; i < levels; i += 2 * h)
                        for (uint32_t j = i; j < i + h; j++) {
                            const int32_t a = W[j], b = W[j + h];
                            W[j] = a + b;
                            W[j + h] = a - b;
                        }
                float d = P.cb0 * (float)T;
                for (uint32_t p = 0; p < P.n; p++)
                    d = fmaf(P.coef[p], (float)((T - W[P.sel[p]]) / 2), d);
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

const a8_kernels a8_kernels_scalar = {
    .name = "scalar",
    .rotate = a8_rotate_natural,
    .matmul = a8_matmul_natural,
};

const a8_kernels *a8_kernels_named(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "scalar")) return &a8_kernels_scalar;
    if (!strcmp(name, "avx2")) return a8_kernels_avx2();
    if (!strcmp(name, "avx512")) {
        /* the float avx512 level needs only AVX-512F: without VNNI its A8 products are AVX2's */
        const a8_kernels *k = a8_kernels_avx512();
        return k ? k : a8_kernels_avx2();
    }
    if (!strcmp(name, "neon")) return a8_kernels_neon();
    return NULL;
}

/* ---- the threaded batch ------------------------------------------------------------- */

#define A8_MAX_JOBS 16
#define A8_CHUNK_WORK 32768u

typedef struct a8_batch {
    const a8_kernels *k;
    const float *rows;
    size_t ld;
    uint32_t ntok, njobs;
    const cq_job *jobs;
    uint32_t chunk_rows[A8_MAX_JOBS];
    uint32_t first_chunk[A8_MAX_JOBS + 1];
    atomic_uint next;
} a8_batch;

static void a8_worker(void *arg, int i, int n) {
    (void)i;
    (void)n;
    a8_batch *b = arg;
    const uint32_t total = b->first_chunk[b->njobs];
    uint32_t j = 0;
    for (;;) {
        const uint32_t c = atomic_fetch_add_explicit(&b->next, 1, memory_order_relaxed);
        if (c >= total) break;
        while (c >= b->first_chunk[j + 1]) j++;
        const cq_job *job = &b->jobs[j];
        const uint32_t r = (c - b->first_chunk[j]) * b->chunk_rows[j];
        const uint32_t nr = job->nrows - r < b->chunk_rows[j] ? job->nrows - r : b->chunk_rows[j];
        b->k->matmul(job->w, job->row0 + r, nr, b->rows, b->ld, b->ntok, job->y + r, job->ld_y);
    }
}

void a8_matmul_pool(cpu_pool *pool, const a8_kernels *k, const float *rows, size_t ld,
                    uint32_t ntok, const cq_job *jobs, uint32_t njobs) {
    for (uint32_t j0 = 0; j0 < njobs; j0 += A8_MAX_JOBS) {
        a8_batch b;
        b.k = k;
        b.rows = rows;
        b.ld = ld;
        b.ntok = ntok;
        b.jobs = jobs + j0;
        b.njobs = njobs - j0 < A8_MAX_JOBS ? njobs - j0 : A8_MAX_JOBS;
        b.first_chunk[0] = 0;
        for (uint32_t j = 0; j < b.njobs; j++) {
            const uint64_t row_work = (uint64_t)b.jobs[j].w->cols_pad * (ntok ? ntok : 1);
            uint64_t nr = A8_CHUNK_WORK / (row_work ? row_work : 1);
            nr = nr < 4 ? 4 : (nr + 3) / 4 * 4;
            if (nr > b.jobs[j].nrows) nr = b.jobs[j].nrows ? b.jobs[j].nrows : 1;
            b.chunk_rows[j] = (uint32_t)nr;
            b.first_chunk[j + 1] =
                b.first_chunk[j] + (b.jobs[j].nrows + (uint32_t)nr - 1) / (uint32_t)nr;
        }
        atomic_init(&b.next, 0);
        if (cpu_pool_threads(pool) < 2 || b.first_chunk[b.njobs] < 2)
            a8_worker(&b, 0, 1);
        else
            cpu_pool_run_shared(pool, a8_worker, &b);
    }
}
