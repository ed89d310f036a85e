/* Every CPU kernel level this machine supports (AVX2 on x86-64, NEON on aarch64, where
 * the suite also runs under qemu-user, see scripts/test.sh) against the plain C
 * reference (kernels/cpu/cq_plain.c), and the thread pool against one thread.
 *
 * CQ products: random matrices of every bit width and group size 16..256, odd row
 * counts, padded last groups, 1..40 tokens with strided inputs and outputs, through both
 * the fast (scratch) path and the natural-order path. The tolerance is relative to the
 * row's magnitude sum_k |w_k x_k|, the scale of float rounding in any summation order.
 * fwht, rotate and dequant_row must be bit-identical to the plain versions. The batched,
 * threaded product must equal the single-threaded kernel bit for bit for any thread
 * count, because each row is computed by one thread with the same arithmetic. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cq_test_matrix.h"
#include "harness.h"
#include "kernels/cpu/cpu.h"

static cq_scratch make_scratch(uint32_t cols_pad, uint32_t ntok) {
    cq_scratch sc;
    memset(&sc, 0, sizeof sc);
    sc.cap = cq_scratch_floats(cols_pad, ntok);
    sc.buf = aligned_alloc(64, (sc.cap * sizeof(float) + 63) / 64 * 64);
    return sc;
}

/* The error a level's products may make, relative to the row's magnitude (sum of |w x|):
 * float32 rounding, or at the AMX level the split bf16 products (each term within about
 * 2^-16 of itself, cq_gemm_amx.c). */
static double level_tol(const cpu_kernels *k) {
    return strcmp(k->name, "amx") ? CQ_TEST_TOL : 3.1e-5;
}

/* One shape through kernel level k, with and without scratch, against the plain kernel. */
static void check_matmul(const cpu_kernels *k, uint32_t rows, uint32_t cols, uint32_t group,
                         uint32_t bits, uint32_t ntok) {
    const double tol = level_tol(k);
    test_matrix tm;
    make_matrix(&tm, rows, cols, group, bits);
    const cq_matrix *w = &tm.w;
    const size_t ld_x = w->cols_pad + 3 * (rnd() % 3), ld_y = rows + rnd() % 4;
    float *xr = malloc((size_t)ntok * ld_x * sizeof *xr);
    for (size_t i = 0; i < (size_t)ntok * ld_x; i++) xr[i] = rnd_float();
    float *ref = calloc((size_t)ntok * ld_y, sizeof *ref);
    float *got = calloc((size_t)ntok * ld_y, sizeof *got);
    float *part = calloc((size_t)ntok * ld_y, sizeof *part);
    cq_matmul(w, 0, rows, xr, ld_x, ntok, ref, ld_y);

    cq_scratch sc = make_scratch(w->cols_pad, ntok);
    for (int pass = 0; pass < 2; pass++) { /* 0: fast path with scratch, 1: no scratch */
        cq_scratch *use = pass == 0 ? &sc : NULL;
        sc.valid = 0;
        memset(got, 0, (size_t)ntok * ld_y * sizeof *got);
        k->matmul(w, 0, rows, xr, ld_x, ntok, got, ld_y, use);
        double worst = 0;
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t t = 0; t < ntok; t++) {
                const double mag = cq_magnitude(w, r, xr + t * ld_x);
                const double err = fabs((double)got[t * ld_y + r] - ref[t * ld_y + r]);
                const double rel = err / (mag + 1e-30);
                if (!(rel <= worst)) worst = rel;
            }
        CHECK_MSG(worst <= tol, "%s %s rows=%u cols=%u G=%u bits=%u ntok=%u: error %g", k->name,
                  pass ? "natural" : "fast", rows, cols, group, bits, ntok, worst);

        /* a row range computed alone (reusing the cached layout) equals the full call */
        if (rows > 2) {
            const uint32_t row0 = 1 + rnd() % (rows - 2), nr = 1 + rnd() % (rows - row0);
            k->matmul(w, row0, nr, xr, ld_x, ntok, part, ld_y, use);
            int same = 1;
            for (uint32_t t = 0; t < ntok; t++)
                for (uint32_t i = 0; i < nr; i++)
                    same &= part[t * ld_y + i] == got[t * ld_y + row0 + i];
            CHECK_MSG(same, "%s rows [%u, %u) differ from the full product", k->name, row0,
                      row0 + nr);
        }
    }
    free(sc.buf);
    free(xr);
    free(ref);
    free(got);
    free(part);
    free_matrix(&tm);
}

static const cpu_kernels *levels[7];
static int n_levels;

static void find_levels(void) {
    n_levels = 0;
    const char *names[] = {"scalar", "avx2", "avx512", "amx", "neon", "simd128"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const cpu_kernels *k = cpu_kernels_named(names[i]);
        if (k) levels[n_levels++] = k;
        else printf("  (level %s not supported here; its tests are skipped)\n", names[i]);
    }
}

static void test_dispatch(void) {
    CHECK(cpu_kernels_best() != NULL);
    CHECK(cpu_kernels_named("scalar") == &cpu_kernels_scalar);
    CHECK(cpu_kernels_named("no-such-level") == NULL);
    CHECK(cpu_kernels_named(NULL) == NULL);
    for (int i = 0; i < n_levels; i++) {
        const cpu_kernels *k = levels[i];
        CHECK(k->name && k->fwht && k->rotate && k->matmul && k->dequant_row && k->dot &&
              k->axpy);
    }
    printf("  best level here: %s\n", cpu_kernels_best()->name);
}

/* The avx512 level is the AVX2 table with its own many-token products and one-token
 * attention (attn_avx512, defined on x86 only, hence compared by difference); the W·A8 and
 * Needle 3 tables of the session fall back to their AVX2 levels for it. Its products
 * are checked with every level in the tests below, here also on prefill-sized shapes
 * whose rows and tokens leave partial 4 x 6 tiles. */
static void test_avx512_level(void) {
    const cpu_kernels *k = cpu_kernels_avx512(), *base = cpu_kernels_avx2();
    if (!k) {
        harness_skip("this CPU (or its OS) has no AVX-512F");
        return;
    }
    CHECK(base != NULL);
    if (!base) return;
    CHECK(!strcmp(k->name, "avx512") && cpu_kernels_named("avx512") == k);
    CHECK(k->matmul != base->matmul && k->rotate == base->rotate && k->fwht == base->fwht &&
          k->dequant_row == base->dequant_row && k->dot == base->dot &&
          k->axpy == base->axpy && k->attend != base->attend); /* its own: attn_avx512 */
    const uint32_t rows[] = {37, 64, 130}, toks[] = {2, 6, 97, 256};
    for (size_t r = 0; r < 3; r++)
        for (size_t t = 0; t < 4; t++) {
            check_matmul(k, rows[r], 512, 128, 2, toks[t]);
            check_matmul(k, rows[r], 512, 64, 4, toks[t]);
            check_matmul(k, rows[r], 500, 128, 5, toks[t]);
        }
}

/* The amx level is the AVX-512 table with its many-token products on the tile unit:
 * checked against the plain kernel on shapes that leave partial 16-row panels and
 * 16-token blocks (odd token counts, one block or an odd number of them), widths that are
 * not a multiple of 32 (which take the AVX-512 products), and a prefill chunk of 128. */
static void test_amx_level(void) {
    const cpu_kernels *k = cpu_kernels_amx(), *base = cpu_kernels_avx512();
    if (!k) {
        harness_skip("this CPU (or its OS) has no AMX-BF16 tile unit");
        return;
    }
    CHECK(base != NULL);
    if (!base) return;
    CHECK(!strcmp(k->name, "amx") && cpu_kernels_named("amx") == k);
    CHECK(!strcmp(cpu_kernels_vector_level(k), "avx512"));
    CHECK(k->matmul != base->matmul && k->rotate == base->rotate && k->fwht == base->fwht &&
          k->dequant_row == base->dequant_row && k->dot == base->dot &&
          k->axpy == base->axpy && k->attend == base->attend &&
          k->attend_block == base->attend_block);
    CHECK(k->tile_rows == 16 && k->prefill_chunk == 128);
    const uint32_t rows[] = {5, 16, 37, 130}, toks[] = {2, 15, 17, 33, 97, 128};
    for (size_t r = 0; r < 4; r++)
        for (size_t t = 0; t < 6; t++) {
            check_matmul(k, rows[r], 512, 128, 2, toks[t]);
            check_matmul(k, rows[r], 512, 64, 4, toks[t]);
            check_matmul(k, rows[r], 500, 128, 5, toks[t]);
            check_matmul(k, rows[r], 240, 16, 4, toks[t]); /* 240: not a multiple of 32 */
        }
}

/* A scratch with room for fewer decoded rows than cq_scratch_floats() asks (2 to 13:
 * smaller panels, pairs instead of 3- or 4-row tiles) changes no result by a bit: every
 * (row, token) pair keeps its one accumulator whichever tile computes it. */
static void test_matmul_small_scratch_same_bits(void) {
    const uint32_t rows = 41, cols = 512, ntok = 23;
    const uint32_t bits[] = {2, 4, 5}, groups[] = {128, 64, 128};
    for (int li = 0; li < n_levels; li++)
        for (size_t b = 0; b < 3; b++) {
            const cpu_kernels *k = levels[li];
            /* the AMX level needs room for its token tiles and takes the AVX-512 products
             * (another sum) without it; sessions always give it cq_scratch_floats() */
            if (!strcmp(k->name, "amx")) continue;
            test_matrix tm;
            make_matrix(&tm, rows, cols, groups[b], bits[b]);
            const cq_matrix *w = &tm.w;
            float *xr = malloc((size_t)ntok * w->cols_pad * sizeof *xr);
            for (size_t i = 0; i < (size_t)ntok * w->cols_pad; i++) xr[i] = rnd_float();
            float *ref = calloc((size_t)ntok * rows, sizeof *ref);
            float *got = calloc((size_t)ntok * rows, sizeof *got);
            cq_scratch sc = make_scratch(w->cols_pad, ntok);
            k->matmul(w, 0, rows, xr, w->cols_pad, ntok, ref, rows, &sc);
            int same = 1;
            for (uint32_t extra = 2; extra <= 13; extra++) {
                sc.valid = 0;
                sc.cap = ((size_t)ntok + extra) * w->cols_pad + 16;
                memset(got, 0, (size_t)ntok * rows * sizeof *got);
                for (uint32_t r = 0; r < rows; r += 12) /* the pool's many-token chunks */
                    k->matmul(w, r, rows - r < 12 ? rows - r : 12, xr, w->cols_pad, ntok,
                              got + r, rows, &sc);
                same &= !memcmp(ref, got, (size_t)ntok * rows * sizeof *got);
            }
            CHECK_MSG(same, "%s bits=%u: a smaller scratch changed the products", k->name,
                      bits[b]);
            free(sc.buf);
            free(xr);
            free(ref);
            free(got);
            free_matrix(&tm);
        }
}

/* A token's many-token products do not depend on how many tokens share the call (how
 * the tokens fall into tiles: the AVX-512 level's 6- and 4-token tiles), bit for bit:
 * the first n tokens of a 32-token product (the forward's chunk) against a product of
 * those n alone, n = 2..31. One token goes to the decode kernels, a different sum. */
static void test_matmul_token_count_same_bits(void) {
    const uint32_t rows = 29, cols = 384, full = 32;
    for (int li = 0; li < n_levels; li++) {
        const cpu_kernels *k = levels[li];
        test_matrix tm;
        make_matrix(&tm, rows, cols, 128, 2);
        const cq_matrix *w = &tm.w;
        float *xr = malloc((size_t)full * w->cols_pad * sizeof *xr);
        for (size_t i = 0; i < (size_t)full * w->cols_pad; i++) xr[i] = rnd_float();
        float *ref = calloc((size_t)full * rows, sizeof *ref);
        float *got = calloc((size_t)full * rows, sizeof *got);
        cq_scratch sc = make_scratch(w->cols_pad, full);
        k->matmul(w, 0, rows, xr, w->cols_pad, full, ref, rows, &sc);
        int same = 1;
        for (uint32_t n = 2; n < full; n++) {
            sc.valid = 0;
            k->matmul(w, 0, rows, xr, w->cols_pad, n, got, rows, &sc);
            if (memcmp(ref, got, (size_t)n * rows * sizeof *got)) {
                same = 0;
                printf("  %s: %u tokens differ from the first %u of %u\n", k->name, n, n, full);
                break;
            }
        }
        CHECK_MSG(same, "%s: a token's products depend on the token count", k->name);
        free(sc.buf);
        free(xr);
        free(ref);
        free(got);
        free_matrix(&tm);
    }
}

static void test_matmul_every_shape(void) {
    const uint32_t bits[] = {1, 2, 3, 4, 5}; /* 1: Needle 3 binary */
    const uint32_t groups[] = {16, 32, 64, 128, 256};
    const uint32_t toks[] = {1, 2, 3, 4, 5, 8, 13, 40};
    for (int li = 0; li < n_levels; li++)
        for (size_t b = 0; b < 5; b++)
            for (size_t g = 0; g < 5; g++) {
                const uint32_t G = groups[g];
                /* exact groups, a padded last group, a single short group */
                const uint32_t cols[] = {2 * G, 3 * G - 5, G / 2 + 1};
                for (size_t c = 0; c < 3; c++)
                    for (size_t t = 0; t < 8; t++) {
                        const uint32_t rows = 1 + 2 * (rnd() % 20); /* odd */
                        check_matmul(levels[li], rows, cols[c], G, bits[b], toks[t]);
                    }
            }
}

static void test_large_group_and_width(void) {
    /* the widest Needle 2 input (4 lanes x 512) and the largest group the format allows */
    for (int li = 0; li < n_levels; li++) {
        check_matmul(levels[li], 9, 2048, 128, 4, 1);
        check_matmul(levels[li], 9, 2048, 128, 2, 6);
        check_matmul(levels[li], 3, 4096, 4096, 2, 2);
        check_matmul(levels[li], 3, 8192, 4096, 4, 1);
    }
}

static void test_transforms_bit_identical(void) {
    const uint32_t groups[] = {16, 32, 64, 128, 256, 4096};
    for (int li = 0; li < n_levels; li++) {
        const cpu_kernels *k = levels[li];
        for (uint32_t n = 1; n <= 4096; n <<= 1) {
            float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
            for (uint32_t i = 0; i < n; i++) a[i] = b[i] = rnd_float();
            fwht(a, n);
            k->fwht(b, n);
            CHECK_MSG(!memcmp(a, b, n * sizeof *a), "%s fwht n=%u differs", k->name, n);
            free(a);
            free(b);
        }
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
            for (uint32_t bits = 1; bits <= 5; bits++) {
                const uint32_t G = groups[g], cols = 2 * G + G / 2 + 3;
                test_matrix tm;
                make_matrix(&tm, 3, cols, G, bits);
                const cq_matrix *w = &tm.w;
                float *x = malloc(cols * sizeof *x);
                float *r1 = malloc(w->cols_pad * sizeof *r1), *r2 = malloc(w->cols_pad * sizeof *r2);
                float *t1 = malloc(G * sizeof *t1), *t2 = malloc(G * sizeof *t2);
                for (uint32_t i = 0; i < cols; i++) x[i] = rnd_float();
                cq_rotate(w, x, r1);
                k->rotate(w, x, r2);
                CHECK_MSG(!memcmp(r1, r2, w->cols_pad * sizeof *r1), "%s rotate G=%u differs",
                          k->name, G);
                memcpy(r2, x, cols * sizeof *x); /* in place */
                k->rotate(w, r2, r2);
                CHECK_MSG(!memcmp(r1, r2, w->cols_pad * sizeof *r1),
                          "%s in-place rotate G=%u differs", k->name, G);
                for (uint32_t r = 0; r < 3; r++) {
                    cq_dequant_row(w, r, r1, t1);
                    k->dequant_row(w, r, r2, t2);
                    CHECK_MSG(!memcmp(r1, r2, cols * sizeof *r1),
                              "%s dequant_row G=%u bits=%u differs", k->name, G, bits);
                }
                free(x);
                free(r1);
                free(r2);
                free(t1);
                free(t2);
                free_matrix(&tm);
            }
    }
}

static void test_dot(void) {
    float a[301], b[301];
    for (int i = 0; i < 301; i++) {
        a[i] = rnd_float();
        b[i] = rnd_float();
    }
    for (int li = 0; li < n_levels; li++)
        for (uint32_t n = 0; n <= 301; n += n < 40 ? 1 : 37) {
            double ref = 0, mag = 0;
            for (uint32_t i = 0; i < n; i++) {
                ref += (double)a[i] * b[i];
                mag += fabs((double)a[i] * b[i]);
            }
            const float got = levels[li]->dot(a, b, n);
            CHECK_MSG(fabs(got - ref) <= 1e-6 * mag + 1e-30, "%s dot n=%u: %g vs %g",
                      levels[li]->name, n, got, ref);
            float y[301], y0[301];
            for (uint32_t i = 0; i < n; i++) y[i] = y0[i] = rnd_float();
            levels[li]->axpy(y, 0.37f, a, n);
            int ok = 1;
            for (uint32_t i = 0; i < n; i++) {
                const double want = y0[i] + 0.37 * (double)a[i];
                ok &= fabs(y[i] - want) <= 1e-6 * (fabs(y0[i]) + fabs(0.37 * a[i]));
            }
            CHECK_MSG(ok, "%s axpy n=%u", levels[li]->name, n);
        }
}

/* ---- thread pool ------------------------------------------------------------------- */

typedef struct count_arg {
    atomic_int calls[8];
    atomic_int total;
} count_arg;

static void count_fn(void *p, int i, int n) {
    count_arg *a = p;
    if (i >= 0 && i < 8 && n <= 8) atomic_fetch_add(&a->calls[i], 1);
    atomic_fetch_add(&a->total, 1);
}

static void test_pool_runs_every_thread_once(void) {
    for (int n = 1; n <= 4; n++) {
        cpu_pool *pool;
        CHECK_EQ_INT(cpu_pool_create(n, NULL, 0, &pool), 0);
        if (!pool) continue;
        CHECK_EQ_INT(cpu_pool_threads(pool), n);
        count_arg a;
        memset(&a, 0, sizeof a);
        const int runs = 3000;
        for (int r = 0; r < runs; r++) {
            cpu_pool_run(pool, count_fn, &a);
            if (r % 1000 == 999) { /* let the workers fall asleep */
                struct timespec ts = {0, 20 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        }
        CHECK_EQ_INT(atomic_load(&a.total), runs * n);
        for (int i = 0; i < n; i++) CHECK_EQ_INT(atomic_load(&a.calls[i]), runs);
        cpu_pool_free(pool);
    }
    cpu_pool_free(NULL);
}

typedef struct share_arg {
    atomic_int next;
    int items;
    unsigned char *done; /* [items] */
    atomic_int dup;
} share_arg;

static void share_fn(void *p, int i, int n) {
    (void)i;
    (void)n;
    share_arg *a = p;
    for (int k; (k = atomic_fetch_add(&a->next, 1)) < a->items;)
        if (a->done[k]++) atomic_fetch_add(&a->dup, 1);
}

static void test_pool_shared_runs_take_every_item_once(void) {
    for (int n = 1; n <= 4; n++) {
        cpu_pool *pool;
        CHECK_EQ_INT(cpu_pool_create(n, NULL, 0, &pool), 0);
        if (!pool) continue;
        unsigned char done[64];
        int missing = 0, dup = 0;
        for (int r = 0; r < 3000; r++) {
            share_arg a;
            atomic_init(&a.next, 0);
            atomic_init(&a.dup, 0);
            a.items = 1 + r % 64;
            a.done = done;
            memset(done, 0, sizeof done);
            cpu_pool_run_shared(pool, share_fn, &a);
            for (int k = 0; k < a.items; k++) missing += !done[k];
            dup += atomic_load(&a.dup);
            if (r % 1000 == 999) { /* let the workers fall asleep */
                struct timespec ts = {0, 20 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            if (r % 7 == 0) { /* interleave all-threads runs */
                count_arg c;
                memset(&c, 0, sizeof c);
                cpu_pool_run(pool, count_fn, &c);
                CHECK_EQ_INT(atomic_load(&c.total), n);
            }
        }
        CHECK_EQ_INT(missing, 0);
        CHECK_EQ_INT(dup, 0);
        cpu_pool_free(pool);
    }
}

static void test_threaded_matmul_equals_one_thread(void) {
    for (int li = 0; li < n_levels; li++) {
        const cpu_kernels *k = levels[li];
        /* 20 jobs (more than one internal batch) of mixed widths and groups over one input */
        enum { NJOBS = 20 };
        test_matrix tm[NJOBS];
        uint32_t cols = 1000, ntoks[] = {1, 7, 32};
        for (int j = 0; j < NJOBS; j++) {
            const uint32_t bits = 1 + (uint32_t)j % 5, G = 64u << (j % 3);
            make_matrix(&tm[j], 1 + rnd() % 300, cols, G, bits);
        }
        for (size_t ti = 0; ti < 3; ti++) {
            const uint32_t ntok = ntoks[ti];
            const size_t ld_x = 1024 + 8; /* covers every cols_pad above */
            float *xr = malloc(ntok * ld_x * sizeof *xr);
            for (size_t i = 0; i < ntok * ld_x; i++) xr[i] = rnd_float();
            float *ref[NJOBS], *got[NJOBS];
            cq_job jobs[NJOBS];
            cq_scratch sc = make_scratch(1024, ntok);
            for (int j = 0; j < NJOBS; j++) {
                const cq_matrix *w = &tm[j].w;
                ref[j] = calloc((size_t)ntok * w->rows, sizeof(float));
                got[j] = calloc((size_t)ntok * w->rows, sizeof(float));
                sc.valid = 0;
                k->matmul(w, 0, w->rows, xr, ld_x, ntok, ref[j], w->rows, &sc);
                jobs[j] = (cq_job){w, 0, w->rows, got[j], w->rows};
            }
            for (int n = 1; n <= 4; n++) {
                cpu_pool *pool;
                if (cpu_pool_create(n, k, cq_scratch_floats(1024, ntok), &pool)) {
                    CHECK(0);
                    continue;
                }
                for (int rep = 0; rep < 2; rep++) {
                    for (int j = 0; j < NJOBS; j++)
                        memset(got[j], 0xff, (size_t)ntok * tm[j].w.rows * sizeof(float));
                    cpu_matmul(pool, xr, ld_x, ntok, jobs, NJOBS);
                    for (int j = 0; j < NJOBS; j++)
                        CHECK_MSG(!memcmp(ref[j], got[j], (size_t)ntok * tm[j].w.rows * sizeof(float)),
                                  "%s threads=%d ntok=%u job %d differs", k->name, n, ntok, j);
                }
                cpu_pool_free(pool);
            }
            for (int j = 0; j < NJOBS; j++) {
                free(ref[j]);
                free(got[j]);
            }
            free(sc.buf);
            free(xr);
        }
        for (int j = 0; j < NJOBS; j++) free_matrix(&tm[j]);
    }
}

int main(void) {
    rnd_seed(0x9E3779B97F4A7C15ULL);
    find_levels();
    RUN(test_dispatch);
    RUN(test_avx512_level);
    RUN(test_amx_level);
    RUN(test_matmul_small_scratch_same_bits);
    RUN(test_matmul_token_count_same_bits);
    RUN(test_transforms_bit_identical);
    RUN(test_dot);
    RUN(test_matmul_every_shape);
    RUN(test_large_group_and_width);
    RUN(test_pool_runs_every_thread_once);
    RUN(test_pool_shared_runs_take_every_item_once);
    RUN(test_threaded_matmul_equals_one_thread);
    return test_summary();
}
