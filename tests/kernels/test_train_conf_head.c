/* The confidence head's training math (src/train/conf_head.c, `needle calibrate`):
 *   - its forward is the engine's head (model/heads.c, the two-stage pooling that the v3a
 *     fixture's parity cases check against the official code): the v3a file's confidence
 *     head on random cells, pooled by the engine and by conf_head_forward;
 *   - its backward against central differences of the forward, coordinate by coordinate
 *     in all six tensors, on a small random head;
 *   - bfloat16 storage rounds to nearest even. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/heads.h"
#include "needle.h"
#include "train/conf_head.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1);
}

static void test_bf16(void) {
    CHECK(conf_head_bf16(1.0f) == 0x3f80);
    CHECK(conf_head_f32(conf_head_bf16(-2.5f)) == -2.5f);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-8 up */
    CHECK(conf_head_f32(conf_head_bf16(1.0f + 1.0f / 256)) == 1.0f);
    CHECK(conf_head_f32(conf_head_bf16(1.0f + 3.0f / 256)) == 1.0f + 1.0f / 64);
    CHECK(isnan(conf_head_f32(conf_head_bf16(NAN))));
    CHECK(isinf(conf_head_f32(conf_head_bf16(INFINITY))));
}

/* the engine's pooling and conf_head_forward on the same (bfloat16-exact) cells */
static void test_forward_is_the_engines(void) {
    needle_model *m = NULL;
    CHECK(needle_model_open(fixture_path("v3/v3a.cact"), NULL, &m) == NEEDLE_OK);
    if (!m) return;
    const probe_head *h = model_probe_head(m, HEAD_CODE_CONFIDENCE);
    CHECK(h != NULL && h->rows > 1 && h->out_dim == 1);
    if (!h) {
        needle_model_free(m);
        return;
    }
    const uint32_t d = model_width(m);
    const conf_head_shape sh = {h->rows, h->per_row, h->queries, d};
    uint64_t numel[CONF_HEAD_TENSORS];
    const size_t n_theta = conf_head_layout(&sh, numel);
    CHECK(numel[0] == (uint64_t)h->num_probes * d);
    float *theta = malloc(n_theta * sizeof *theta);
    const float *src[CONF_HEAD_TENSORS] = {h->probes, h->gain, h->query, h->row_bias, h->proj, h->bias};
    for (int i = 0, off = 0; i < CONF_HEAD_TENSORS; off += (int)numel[i], i++)
        memcpy(theta + off, src[i], numel[i] * sizeof *theta);
    enum { T = 13 };
    uint16_t *cells = malloc((size_t)sh.rows * T * d * sizeof *cells);
    float *row = malloc((size_t)T * d * sizeof *row);
    int32_t tokens[T];
    for (uint32_t t = 0; t < T; t++) tokens[t] = 5 + (int32_t)t;
    head_pool pool;
    CHECK(head_pool_init(&pool, h, d) == NEEDLE_OK);
    for (uint32_t l = 0; l < sh.rows; l++) {
        for (size_t i = 0; i < (size_t)T * d; i++) {
            cells[(size_t)l * T * d + i] = conf_head_bf16(3 * urand());
            row[i] = conf_head_f32(cells[(size_t)l * T * d + i]);
        }
        head_pool_add(&pool, tokens, T, l, row);
    }
    float engine = 0;
    CHECK(head_pool_output(&pool, &engine) == NEEDLE_OK);
    conf_head_scratch s;
    CHECK(conf_head_scratch_init(&s, &sh, T) == NEEDLE_OK);
    const float ours = conf_head_forward(&sh, theta, cells, T, &s);
    CHECK_MSG(fabsf(ours - engine) <= 1e-4f * (1 + fabsf(engine)), "head logit: ours %.7g, engine %.7g", ours,
              engine);
    conf_head_scratch_free(&s);
    head_pool_free(&pool);
    free(theta);
    free(cells);
    free(row);
    needle_model_free(m);
}

static void test_backward(void) {
    const conf_head_shape sh = {3, 2, 2, 16};
    enum { T = 7 };
    uint64_t numel[CONF_HEAD_TENSORS];
    const size_t n = conf_head_layout(&sh, numel);
    float *theta = malloc(n * sizeof *theta), *grad = calloc(n, sizeof *grad);
    for (size_t i = 0; i < n; i++) theta[i] = 0.7f * urand();
    uint16_t cells[3 * T * 16];
    for (size_t i = 0; i < sizeof cells / sizeof *cells; i++) cells[i] = conf_head_bf16(2 * urand());
    conf_head_scratch s;
    CHECK(conf_head_scratch_init(&s, &sh, T) == NEEDLE_OK);
    conf_head_forward(&sh, theta, cells, T, &s);
    const float dy = 0.8f;
    conf_head_backward(&sh, theta, cells, T, dy, &s, grad);
    /* twice accumulates: the gradient is added, not stored */
    float *twice = calloc(n, sizeof *twice);
    conf_head_backward(&sh, theta, cells, T, dy, &s, twice);
    conf_head_backward(&sh, theta, cells, T, dy, &s, twice);
    for (size_t i = 0; i < n; i++) CHECK_MSG(fabsf(twice[i] - 2 * grad[i]) <= 1e-6f * (1 + fabsf(grad[i])), "[%zu]", i);
    size_t at = 0;
    for (int t = 0; t < CONF_HEAD_TENSORS; t++) {
        double worst = 0;
        for (uint64_t k = 0; k < numel[t]; k++) {
            float *p = &theta[at + k];
            const float keep = *p, h = 1e-2f;
            *p = keep + h;
            const double hi = conf_head_forward(&sh, theta, cells, T, &s);
            *p = keep - h;
            const double lo = conf_head_forward(&sh, theta, cells, T, &s);
            *p = keep;
            const double fd = dy * (hi - lo) / (2 * h), an = grad[at + k];
            const double err = fabs(an - fd) / (fabs(an) + fabs(fd) + 5e-3);
            if (err > worst) worst = err;
            CHECK_MSG(err < 2e-2, "%s[%llu]: analytic %.7g, differences %.7g", conf_head_names[t],
                      (unsigned long long)k, an, fd);
        }
        at += numel[t];
        printf("  %-28s worst relative difference %.2e\n", conf_head_names[t], worst);
    }
    conf_head_scratch_free(&s);
    free(theta);
    free(grad);
    free(twice);
}

int main(void) {
    RUN(test_bf16);
    RUN(test_forward_is_the_engines);
    RUN(test_backward);
    return test_summary();
}
