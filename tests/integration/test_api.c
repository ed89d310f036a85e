/* Public API contract (include/needle.h) on a tiny committed fixture.
 *
 * Covers: NULL handles and arguments on every entry point (INVALID_ARGUMENT, *_free(NULL)
 * no-ops, *out untouched on failure); needle_status_string for every code; sessions:
 * CONTEXT_FULL and INVALID_TOKEN leave the session unchanged, BUFFER_TOO_SMALL for short
 * logits buffers, prefill (also chunked past 32 tokens) equal to token-by-token eval,
 * reset; generation: greedy determinism and agreement with argmax, seeded sampling,
 * temperature validation, short output buffers; f16 and int8 KV caches against f32 (the
 * deviation is printed); tokenize/detokenize errors and size reporting; two sessions on
 * one model from two threads against sequential runs; thread-local error messages; logits
 * bit-identical with 1 and 3 pool threads (windowed f32, f16 and int8 caches).
 *
 * Uses the smallest tests/fixtures/tiny_*.cact that has a tokenizer. */
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"
#include "needle.h"

static needle_model *g_model;
static char g_path[1100]; /* the fixture g_model was opened from */
static needle_model_info g_info = {.size = sizeof g_info};
static uint32_t V; /* vocab */

/* ---- helpers -------------------------------------------------------------------------- */

static int by_size(const void *a, const void *b) {
    struct stat sa, sb;
    const char *pa = *(const char *const *)a, *pb = *(const char *const *)b;
    off_t za = stat(pa, &sa) == 0 ? sa.st_size : 0, zb = stat(pb, &sb) == 0 ? sb.st_size : 0;
    return za < zb ? -1 : za > zb ? 1 : strcmp(pa, pb);
}

static int open_fixture(void) {
    char pattern[1100];
    snprintf(pattern, sizeof pattern, "%s/tiny_*.cact", fixture_dir());
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0) return 0;
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, by_size);
    for (size_t i = 0; i < g.gl_pathc && !g_model; i++) {
        needle_model *m = NULL;
        if (needle_model_open(g.gl_pathv[i], NULL, &m) != NEEDLE_OK) continue;
        needle_model_get_info(m, &g_info);
        if (g_info.has_tokenizer) {
            g_model = m;
            snprintf(g_path, sizeof g_path, "%s", g.gl_pathv[i]);
            printf("fixture %s: vocab %u, d_model %u, %u layers, kv_dim %u, kv_window %u\n",
                   g.gl_pathv[i], g_info.vocab, g_info.d_model, g_info.num_layers,
                   g_info.num_kv_heads * g_info.head_dim, g_info.kv_window);
        } else {
            needle_model_free(m);
        }
    }
    globfree(&g);
    V = g_info.vocab;
    return g_model != NULL;
}

/* A fixed pseudo-random token sequence (ids in [4, vocab)), the same on every call. */
static void make_tokens(int32_t *t, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t[i] = (int32_t)(4 + (x >> 8) % (V - 4));
    }
}

static needle_session *new_session_ex(uint32_t n_ctx, int32_t kv_type, int32_t kv_window,
                                      uint32_t n_sinks) {
    needle_session_params p = needle_session_default_params();
    p.n_ctx = n_ctx;
    p.kv_type = kv_type;
    p.kv_window = kv_window;
    p.n_sinks = n_sinks;
    needle_session *s = NULL;
    int rc = needle_session_create(g_model, &p, &s);
    CHECK_MSG(rc == NEEDLE_OK, "session_create(n_ctx %u, kv %d, window %d, sinks %u): %s", n_ctx,
              kv_type, kv_window, n_sinks, needle_last_error());
    return s;
}

/* n_ctx positions, the header's sliding window, no sinks */
static needle_session *new_session(uint32_t n_ctx, int32_t kv_type) {
    return new_session_ex(n_ctx, kv_type, -1, 0);
}

/* [n][V] logits of `toks`, in one eval call (chunk = 0) or in calls of `chunk` tokens. */
static float *eval_logits(needle_session *s, const int32_t *toks, size_t n, size_t chunk) {
    float *out = malloc(n * V * sizeof *out);
    if (chunk == 0) chunk = n;
    for (size_t i = 0; i < n; i += chunk) {
        size_t c = n - i < chunk ? n - i : chunk;
        int rc = needle_session_eval(s, toks + i, c, out + i * V, c * V);
        CHECK_MSG(rc == NEEDLE_OK, "eval at %zu: %s", i, needle_last_error());
        if (rc) { free(out); return NULL; }
    }
    return out;
}

/* max |a - b| / max |a| over n values */
static double rel_dev(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= num)) num = d; /* NaN propagates */
        if (fabs(a[i]) > den) den = fabs(a[i]);
    }
    return den > 0.0 ? num / den : num;
}

/* How far a prefill may stray from token-by-token decoding (relative to the largest
 * logit): float rounding, or on the CPU's amx level its split bf16 products (each within
 * about 2^-16 of itself; the parity bound is 1e-3). */
static double prefill_tol(void) {
    const int n = needle_device_count();
    for (int i = 0; i < n; i++) {
        needle_device_info d = {.size = sizeof d};
        if (needle_device_get(i, &d) == NEEDLE_OK && !strcmp(d.backend, "cpu"))
            return strcmp(d.capability, "amx") ? 1e-5 : 1e-4;
    }
    return 1e-5;
}

static int32_t argmax(const float *x, uint32_t n) {
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

/* ---- NULL handles and arguments ------------------------------------------------------- */

#define CHECK_INVALID(call) CHECK_EQ_INT((call), NEEDLE_ERR_INVALID_ARGUMENT)

static void test_null_arguments(void) {
    needle_model *sentinel_m = (needle_model *)&sentinel_m, *m = sentinel_m;
    needle_session *sentinel_s = (needle_session *)&sentinel_s, *s = sentinel_s;
    needle_model_info info = {.size = sizeof info};
    needle_tensor_info t = {.size = sizeof t};
    float f[4];
    int32_t ids[4] = {5, 6, 7, 8};
    char text[16];
    size_t n = 0;
    const char *piece = NULL;

    CHECK(strcmp(needle_version(), NEEDLE_VERSION_STRING) == 0);
    CHECK(needle_last_error() != NULL);

    CHECK_INVALID(needle_model_open(NULL, NULL, &m));
    CHECK(strlen(needle_last_error()) > 0);
    CHECK_INVALID(needle_model_open("x.cact", NULL, NULL));
    CHECK_INVALID(needle_model_open_blob(NULL, 1000, NULL, &m));
    CHECK_INVALID(needle_model_open_blob(f, sizeof f, NULL, NULL));
    CHECK(m == sentinel_m);
    needle_model_free(NULL);

    CHECK_INVALID(needle_model_get_info(NULL, &info));
    CHECK_INVALID(needle_model_get_info(g_model, NULL));
    CHECK_INVALID(needle_model_get_tensor(NULL, 0, &t));
    CHECK_INVALID(needle_model_get_tensor(g_model, 0, NULL));
    CHECK_INVALID(needle_model_get_tensor(g_model, UINT32_MAX, &t));
    CHECK_INVALID(needle_model_decode_tensor(NULL, 1, f, 4, &n));
    CHECK_INVALID(needle_model_decode_tensor(g_model, 1, NULL, 4, &n));
    CHECK_INVALID(needle_model_decode_tensor(g_model, 1, f, 4, NULL));
    CHECK_INVALID(needle_model_decode_tensor(g_model, UINT32_MAX, f, 4, &n));

    CHECK_INVALID(needle_tokenize(NULL, "a", 1, ids, 4, &n));
    CHECK_INVALID(needle_tokenize(g_model, NULL, 1, ids, 4, &n));
    CHECK_INVALID(needle_tokenize(g_model, "a", 1, NULL, 4, &n));
    CHECK_INVALID(needle_tokenize(g_model, "a", 1, ids, 4, NULL));
    n = 99;
    CHECK_EQ_INT(needle_tokenize(g_model, NULL, 0, NULL, 0, &n), NEEDLE_OK); /* empty text */
    CHECK_EQ_INT(n, 0);
    CHECK_INVALID(needle_detokenize(NULL, ids, 1, text, sizeof text, &n));
    CHECK_INVALID(needle_detokenize(g_model, NULL, 1, text, sizeof text, &n));
    CHECK_INVALID(needle_detokenize(g_model, ids, 1, NULL, sizeof text, &n));
    CHECK_INVALID(needle_detokenize(g_model, ids, 1, text, sizeof text, NULL));
    CHECK_EQ_INT(needle_detokenize(g_model, NULL, 0, text, sizeof text, &n), NEEDLE_OK);
    CHECK_EQ_INT(n, 0);
    CHECK(text[0] == '\0');
    CHECK_INVALID(needle_token_piece(NULL, 5, &piece, &n));
    CHECK_INVALID(needle_token_piece(g_model, 5, NULL, &n));
    CHECK_INVALID(needle_token_piece(g_model, 5, &piece, NULL));
    CHECK_EQ_INT(needle_token_piece(g_model, -1, &piece, &n), NEEDLE_ERR_INVALID_TOKEN);
    CHECK_EQ_INT(needle_token_piece(g_model, (int32_t)V, &piece, &n), NEEDLE_ERR_INVALID_TOKEN);
    CHECK_EQ_INT(needle_token_piece(g_model, 5, &piece, &n), NEEDLE_OK);
    CHECK(piece != NULL && n > 0);

    needle_session_params sp = needle_session_default_params();
    CHECK_EQ_INT(sp.n_ctx, 0);
    CHECK_EQ_INT(sp.kv_window, -1);
    CHECK_EQ_INT(sp.n_sinks, 0);
    CHECK_EQ_INT(sp.kv_type, NEEDLE_KV_F32);
    CHECK_INVALID(needle_session_create(NULL, &sp, &s));
    CHECK_INVALID(needle_session_create(g_model, &sp, NULL));
    sp.kv_type = 3;
    CHECK_INVALID(needle_session_create(g_model, &sp, &s));
    sp.kv_type = -1;
    CHECK_INVALID(needle_session_create(g_model, &sp, &s));
    sp = needle_session_default_params();
    sp.kv_window = -2;
    CHECK_INVALID(needle_session_create(g_model, &sp, &s));
    sp = needle_session_default_params();
    sp.n_ctx = 8;
    sp.n_sinks = 9;
    CHECK_INVALID(needle_session_create(g_model, &sp, &s));
    sp = needle_session_default_params();
    sp.n_ctx = UINT32_MAX;
    CHECK_EQ_INT(needle_session_create(g_model, &sp, &s) < 0, 1);
    CHECK(s == sentinel_s);
    needle_session_free(NULL);
    needle_session_reset(NULL);
    CHECK_EQ_INT(needle_session_position(NULL), 0);
    CHECK(needle_session_logits(NULL) == NULL);

    s = NULL;
    CHECK_EQ_INT(needle_session_create(g_model, NULL, &s), NEEDLE_OK); /* NULL params = defaults */
    if (!s) return;
    CHECK(needle_session_logits(s) == NULL);
    CHECK_INVALID(needle_session_eval(NULL, ids, 1, NULL, 0));
    CHECK_INVALID(needle_session_eval(s, NULL, 1, NULL, 0));
    CHECK_EQ_INT(needle_session_eval(s, NULL, 0, NULL, 0), NEEDLE_OK); /* nothing to do */
    CHECK_EQ_INT(needle_session_position(s), 0);
    CHECK(needle_session_logits(s) == NULL);

    needle_generate_params gp = needle_generate_default_params();
    CHECK_EQ_INT(gp.max_new_tokens, 0);
    CHECK(gp.temperature == 0.0f);
    int32_t out[4];
    CHECK_INVALID(needle_session_generate(NULL, ids, 1, &gp, out, 4, &n));
    CHECK_INVALID(needle_session_generate(s, NULL, 1, &gp, out, 4, &n));
    CHECK_INVALID(needle_session_generate(s, ids, 1, &gp, NULL, 4, &n));
    CHECK_INVALID(needle_session_generate(s, ids, 1, &gp, out, 4, NULL));
    /* nothing evaluated and no prompt: a state error, not a crash */
    CHECK_EQ_INT(needle_session_generate(s, NULL, 0, &gp, out, 4, &n), NEEDLE_ERR_STATE);
    CHECK_EQ_INT(needle_session_position(s), 0);
    needle_session_free(s);
}

static void test_status_strings(void) {
    static const int codes[] = {
        NEEDLE_OK, NEEDLE_ERR_INVALID_ARGUMENT, NEEDLE_ERR_IO, NEEDLE_ERR_FORMAT,
        NEEDLE_ERR_OUT_OF_MEMORY, NEEDLE_ERR_NO_TOKENIZER, NEEDLE_ERR_INVALID_UTF8,
        NEEDLE_ERR_CONTEXT_FULL, NEEDLE_ERR_BUFFER_TOO_SMALL, NEEDLE_ERR_INVALID_TOKEN,
        NEEDLE_ERR_JSON, NEEDLE_ERR_SCHEMA, NEEDLE_ERR_BACKEND, NEEDLE_ERR_STATE,
        NEEDLE_ERR_MAX_TOKENS, NEEDLE_ERR_CANCELLED};
    const size_t n = sizeof codes / sizeof *codes;
    const char *unknown = needle_status_string(-1000);
    CHECK(unknown != NULL && unknown[0]);
    for (size_t i = 0; i < n; i++) {
        const char *s = needle_status_string(codes[i]);
        CHECK_MSG(s && s[0] && strcmp(s, unknown) != 0, "status %d has no string", codes[i]);
        for (size_t j = 0; j < i; j++)
            CHECK_MSG(strcmp(s, needle_status_string(codes[j])) != 0, "status %d and %d share \"%s\"",
                      codes[i], codes[j], s);
    }
    CHECK_EQ_INT(n, 16); /* every enumerator of needle_status */
    const int odd[] = {1, -16, INT_MIN, INT_MAX};
    for (size_t i = 0; i < 4; i++) CHECK(needle_status_string(odd[i]) != NULL);
}

/* ---- sessions ------------------------------------------------------------------------- */

static void test_context_and_tokens(void) {
    needle_session *s = new_session(8, NEEDLE_KV_F32);
    if (!s) return;
    int32_t t[16];
    make_tokens(t, 16, 1);
    CHECK_EQ_INT(needle_session_eval(s, t, 5, NULL, 0), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_position(s), 5);
    float *before = malloc(V * sizeof *before);
    memcpy(before, needle_session_logits(s), V * sizeof *before);

    /* rejected calls leave position and logits alone */
    CHECK_EQ_INT(needle_session_eval(s, t + 5, 4, NULL, 0), NEEDLE_ERR_CONTEXT_FULL);
    CHECK(strlen(needle_last_error()) > 0);
    int32_t bad[3] = {t[5], -1, t[6]};
    CHECK_EQ_INT(needle_session_eval(s, bad, 3, NULL, 0), NEEDLE_ERR_INVALID_TOKEN);
    bad[1] = (int32_t)V;
    CHECK_EQ_INT(needle_session_eval(s, bad, 3, NULL, 0), NEEDLE_ERR_INVALID_TOKEN);
    bad[1] = INT32_MIN;
    CHECK_EQ_INT(needle_session_eval(s, bad, 3, NULL, 0), NEEDLE_ERR_INVALID_TOKEN);
    float *small = malloc((2 * V - 1) * sizeof *small);
    CHECK_EQ_INT(needle_session_eval(s, t + 5, 2, small, 2 * V - 1), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(needle_session_eval(s, t + 5, 1, small, 0), NEEDLE_ERR_BUFFER_TOO_SMALL);
    free(small);
    CHECK_EQ_INT(needle_session_position(s), 5);
    CHECK(memcmp(before, needle_session_logits(s), V * sizeof *before) == 0);
    int32_t out[4];
    size_t n_out = 0;
    needle_generate_params gp = needle_generate_default_params();
    CHECK_EQ_INT(needle_session_generate(s, t + 5, 4, &gp, out, 4, &n_out), NEEDLE_ERR_CONTEXT_FULL);
    CHECK_EQ_INT(needle_session_position(s), 5);

    /* the rest of the context is still usable, then it is full */
    CHECK_EQ_INT(needle_session_eval(s, t + 5, 3, NULL, 0), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_position(s), 8);
    CHECK_EQ_INT(needle_session_eval(s, t + 8, 1, NULL, 0), NEEDLE_ERR_CONTEXT_FULL);
    CHECK_EQ_INT(needle_session_position(s), 8);
    /* generating at the end of the context stops, without evaluating past it */
    CHECK_EQ_INT(needle_session_generate(s, NULL, 0, &gp, out, 4, &n_out), NEEDLE_OK);
    CHECK(n_out <= 1);
    CHECK_EQ_INT(needle_session_position(s), 8);
    free(before);
    needle_session_free(s);
}

static void test_prefill_matches_incremental(void) {
    enum { N = 45 }; /* > 32: the prefill crosses a forward chunk */
    int32_t t[N];
    make_tokens(t, N, 2);
    needle_session *a = new_session(64, NEEDLE_KV_F32), *b = new_session(64, NEEDLE_KV_F32);
    needle_session *c = new_session(64, NEEDLE_KV_F32);
    if (!a || !b || !c) goto done;
    float *pre = eval_logits(a, t, N, 0), *inc = eval_logits(b, t, N, 1), *mix = eval_logits(c, t, N, 7);
    if (pre && inc && mix) {
        double d1 = rel_dev(inc, pre, (size_t)N * V), d2 = rel_dev(inc, mix, (size_t)N * V);
        printf("  prefill vs token-by-token: %.3g, chunks of 7 vs token-by-token: %.3g (relative)\n",
               d1, d2);
        CHECK_MSG(d1 <= prefill_tol(), "prefill deviates by %g", d1);
        CHECK_MSG(d2 <= prefill_tol(), "chunked eval deviates by %g", d2);
        CHECK(memcmp(needle_session_logits(a), pre + (size_t)(N - 1) * V, V * sizeof(float)) == 0);
        CHECK(memcmp(needle_session_logits(b), inc + (size_t)(N - 1) * V, V * sizeof(float)) == 0);
    }
    /* reset, then the same tokens again: identical logits */
    needle_session_reset(a);
    CHECK_EQ_INT(needle_session_position(a), 0);
    CHECK(needle_session_logits(a) == NULL);
    float *again = eval_logits(a, t, N, 0);
    if (pre && again) CHECK(memcmp(pre, again, (size_t)N * V * sizeof(float)) == 0);
    /* reset after a conversation that wrapped the KV window, then a shorter one */
    needle_session_reset(b);
    float *again_inc = eval_logits(b, t, 10, 1);
    if (inc && again_inc) CHECK(memcmp(inc, again_inc, (size_t)10 * V * sizeof(float)) == 0);
    free(pre);
    free(inc);
    free(mix);
    free(again);
    free(again_inc);
done:
    needle_session_free(a);
    needle_session_free(b);
    needle_session_free(c);

    /* the same with attention sinks, with no window, and with a window of 5 */
    const struct { int32_t window; uint32_t sinks; } cfg[] = {{-1, 4}, {0, 0}, {5, 2}};
    for (int k = 0; k < 3; k++) {
        needle_session *p = new_session_ex(64, NEEDLE_KV_F32, cfg[k].window, cfg[k].sinks);
        needle_session *q = new_session_ex(64, NEEDLE_KV_F32, cfg[k].window, cfg[k].sinks);
        float *lp = p ? eval_logits(p, t, N, 0) : NULL, *lq = q ? eval_logits(q, t, N, 1) : NULL;
        if (lp && lq) {
            double d = rel_dev(lq, lp, (size_t)N * V);
            CHECK_MSG(d <= prefill_tol(), "window %d, sinks %u: prefill deviates by %g", cfg[k].window,
                      cfg[k].sinks, d);
        }
        free(lp);
        free(lq);
        needle_session_free(p);
        needle_session_free(q);
    }
}

/* ---- generation ----------------------------------------------------------------------- */

static int generate(needle_session *s, const int32_t *prompt, size_t n_prompt, float temperature,
                    uint64_t seed, uint32_t max_new, int32_t *out, size_t cap, size_t *n_out) {
    needle_generate_params gp = needle_generate_default_params();
    gp.temperature = temperature;
    gp.seed = seed;
    gp.max_new_tokens = max_new;
    needle_session_reset(s);
    return needle_session_generate(s, prompt, n_prompt, &gp, out, cap, n_out);
}

static void test_generate(void) {
    enum { P = 6, G = 12 };
    int32_t prompt[P], a[G], b[G];
    make_tokens(prompt, P, 3);
    prompt[0] = NEEDLE_TOKEN_BOS;
    needle_session *s = new_session(64, NEEDLE_KV_F32);
    if (!s) return;
    size_t na = 0, nb = 0;

    /* greedy: deterministic, and the argmax of token-by-token logits */
    CHECK_EQ_INT(generate(s, prompt, P, 0.0f, 0, G, a, G, &na), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_position(s), P + na); /* every produced id is evaluated */
    CHECK_EQ_INT(generate(s, prompt, P, 0.0f, 99, G, b, G, &nb), NEEDLE_OK);
    CHECK(na == nb && memcmp(a, b, na * sizeof *a) == 0);
    CHECK_MSG(na > 0, "greedy generation produced nothing");
    needle_session_reset(s);
    CHECK_EQ_INT(needle_session_eval(s, prompt, P, NULL, 0), NEEDLE_OK);
    for (size_t i = 0; i < na; i++) {
        int32_t want = argmax(needle_session_logits(s), V);
        CHECK_MSG(a[i] == want, "greedy token %zu is %d, argmax is %d", i, a[i], want);
        if (needle_session_eval(s, &a[i], 1, NULL, 0) != NEEDLE_OK) break;
    }

    /* seeded sampling: same seed, same tokens; another seed, (very likely) others */
    int32_t c[G];
    size_t nc = 0;
    CHECK_EQ_INT(generate(s, prompt, P, 1.5f, 42, G, a, G, &na), NEEDLE_OK);
    CHECK_EQ_INT(generate(s, prompt, P, 1.5f, 42, G, b, G, &nb), NEEDLE_OK);
    CHECK(na == nb && memcmp(a, b, na * sizeof *a) == 0);
    CHECK_EQ_INT(generate(s, prompt, P, 1.5f, 43, G, c, G, &nc), NEEDLE_OK);
    CHECK_MSG(na != nc || memcmp(a, c, na * sizeof *a) != 0, "seeds 42 and 43 sampled the same %zu tokens", na);

    /* bad temperatures are rejected before anything is evaluated */
    const float bad_t[] = {NAN, -1.0f, -0.0001f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_t / sizeof *bad_t; i++) {
        needle_session_reset(s);
        needle_generate_params gp = needle_generate_default_params();
        gp.temperature = bad_t[i];
        CHECK_EQ_INT(needle_session_generate(s, prompt, P, &gp, a, G, &na), NEEDLE_ERR_INVALID_ARGUMENT);
        CHECK_EQ_INT(needle_session_position(s), 0);
    }

    /* output buffer too small: the ids that fit, and BUFFER_TOO_SMALL (unless EOS first) */
    int32_t greedy[G];
    size_t ng = 0;
    generate(s, prompt, P, 0.0f, 0, G, greedy, G, &ng);
    int32_t *two = malloc(2 * sizeof *two);
    size_t n2 = 99;
    int rc = generate(s, prompt, P, 0.0f, 0, G, two, 2, &n2);
    if (ng > 2) {
        CHECK_EQ_INT(rc, NEEDLE_ERR_BUFFER_TOO_SMALL);
        CHECK_EQ_INT(n2, 2);
        CHECK(two[0] == greedy[0] && two[1] == greedy[1]);
    } else {
        CHECK_EQ_INT(rc, NEEDLE_OK);
    }
    free(two);
    n2 = 99;
    rc = generate(s, prompt, P, 0.0f, 0, G, NULL, 0, &n2);
    CHECK_EQ_INT(rc, ng > 0 ? NEEDLE_ERR_BUFFER_TOO_SMALL : NEEDLE_OK);
    CHECK_EQ_INT(n2, 0);

    /* max_new_tokens 0 = until EOS or the context end; never past n_ctx */
    needle_session *tiny = new_session(P + 3, NEEDLE_KV_F32);
    if (tiny) {
        int32_t out[16];
        size_t n = 0;
        rc = generate(tiny, prompt, P, 0.0f, 0, 0, out, 16, &n);
        CHECK_EQ_INT(rc, NEEDLE_OK);
        CHECK(n <= 4);
        CHECK(needle_session_position(tiny) <= P + 3);
        needle_session_free(tiny);
    }
    needle_session_free(s);
}

/* ---- KV cache precision --------------------------------------------------------------- */

/* Each cache precision against the f32 cache, as max |logit - f32| / max |logit| over 40
 * positions, and prefill against token-by-token evaluation of the same precision.
 *
 * Limits, from the measurement on tiny_cq2 (the same with AVX2 and scalar kernels):
 *   f16   measured 0.0004: one fp16 rounding unit is 2^-11 = 4.9e-4 of a value; the limit
 *         2e-3 is four units (5x the measurement).
 *   int8  measured 0.0090: one level of a 32-value group is 1/127 = 7.9e-3 of its largest
 *         value; the limit 3e-2 is four levels (3.3x the measurement).
 *   prefill vs incremental: measured 3.9e-5 (f16, AVX2), 5.8e-7 (int8), 0 with scalar
 *         kernels; only last-bit differences between the chunked and single-token
 *         kernels, which may flip one cache rounding: limit 1e-3, the parity tolerance. */
static void test_kv_types(void) {
    enum { N = 40 };
    int32_t t[N];
    make_tokens(t, N, 4);
    needle_session *ref = new_session(64, NEEDLE_KV_F32);
    float *base = ref ? eval_logits(ref, t, N, 0) : NULL;
    needle_session_free(ref);
    if (!base) return;
    const struct { int32_t type; const char *name; double limit; } kinds[] = {
        {NEEDLE_KV_F16, "f16", 2e-3}, {NEEDLE_KV_INT8, "int8", 3e-2}};
    for (int k = 0; k < 2; k++) {
        needle_session *s = new_session(64, kinds[k].type);
        if (!s) continue;
        float *pre = eval_logits(s, t, N, 0);
        needle_session_reset(s);
        float *inc = eval_logits(s, t, N, 1);
        if (pre && inc) {
            double d = rel_dev(base, pre, (size_t)N * V), di = rel_dev(pre, inc, (size_t)N * V);
            printf("  kv %-4s: max |logit - f32| / max |logit| = %.4f over %d positions "
                   "(prefill vs incremental %.2g)\n", kinds[k].name, d, N, di);
            CHECK_MSG(d < kinds[k].limit, "kv %s deviates by %g (limit %g)", kinds[k].name, d,
                      kinds[k].limit);
            CHECK_MSG(di < 1e-3, "kv %s: prefill vs incremental %g", kinds[k].name, di);
        }
        free(pre);
        free(inc);
        needle_session_free(s);
    }
    free(base);
}

/* ---- tokenizer ------------------------------------------------------------------------ */

static void test_text(void) {
    static const struct { const char *s; size_t n; } bad[] = {
        {"abc\xC3\x28", 5}, {"\xFF", 1}, {"\xC0\xAF", 2}, {"\xED\xA0\x80", 3},
        {"ok\xF4\x90\x80\x80", 6}, {"\xE2\x82", 2}, {"a\0b", 3}, {"\x80", 1}};
    int32_t ids[64];
    size_t n = 0;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(needle_tokenize(g_model, bad[i].s, bad[i].n, ids, 64, &n) == NEEDLE_ERR_INVALID_UTF8,
                  "bad text %zu accepted", i);
        CHECK(strlen(needle_last_error()) > 0);
    }

    const char *text = "Hello, world! The quick brown fox jumps over the lazy dog. 123 \xC3\xA9t\xC3\xA9 \xF0\x9F\x98\x80";
    const size_t len = strlen(text);
    size_t need = 0;
    CHECK_EQ_INT(needle_tokenize(g_model, text, len, NULL, 0, &need), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK(need > 1 && need <= len + 1);
    if (need < 2 || need > len + 1) return;
    int32_t *exact = malloc(need * sizeof *exact), *one = malloc(sizeof *one);
    n = 0;
    CHECK_EQ_INT(needle_tokenize(g_model, text, len, one, 1, &n), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(n, need);
    CHECK_EQ_INT(needle_tokenize(g_model, text, len, exact, need, &n), NEEDLE_OK);
    CHECK_EQ_INT(n, need);
    for (size_t i = 0; i < n; i++) CHECK(exact[i] >= 0 && (uint32_t)exact[i] < V);

    size_t out_len = 0;
    CHECK_EQ_INT(needle_detokenize(g_model, exact, n, NULL, 0, &out_len), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(out_len, len);
    char *buf = malloc(len + 1);
    size_t l2 = 0;
    CHECK_EQ_INT(needle_detokenize(g_model, exact, n, buf, len, &l2), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(l2, len);
    CHECK(buf[0] == '\0');
    CHECK_EQ_INT(needle_detokenize(g_model, exact, n, buf, len + 1, &l2), NEEDLE_OK);
    CHECK_EQ_INT(l2, len);
    CHECK_MSG(memcmp(buf, text, len) == 0 && buf[len] == '\0', "round trip gave \"%s\"", buf);
    int32_t badid[2] = {exact[0], (int32_t)V};
    CHECK_EQ_INT(needle_detokenize(g_model, badid, 2, buf, len + 1, &l2), NEEDLE_ERR_INVALID_TOKEN);
    badid[1] = -1;
    CHECK_EQ_INT(needle_detokenize(g_model, badid, 2, buf, len + 1, &l2), NEEDLE_ERR_INVALID_TOKEN);
    free(buf);
    free(exact);
    free(one);
}

/* ---- threads -------------------------------------------------------------------------- */

typedef struct job {
    const int32_t *toks;
    size_t n;
    float *logits; /* [n][V] */
    int32_t gen[8];
    size_t n_gen;
    int rc;
    char err_seen[64];
} job;

static void run_job(job *j) {
    needle_session_params p = needle_session_default_params();
    p.n_ctx = 96;
    needle_session *s = NULL;
    j->rc = needle_session_create(g_model, &p, &s);
    if (j->rc) return;
    j->rc = needle_session_eval(s, j->toks, j->n, j->logits, j->n * V);
    if (j->rc == NEEDLE_OK) {
        needle_generate_params gp = needle_generate_default_params();
        gp.max_new_tokens = 8;
        j->rc = needle_session_generate(s, NULL, 0, &gp, j->gen, 8, &j->n_gen);
    }
    /* a failure in this thread sets only this thread's message */
    int32_t bad = -1;
    if (j->rc == NEEDLE_OK && needle_session_eval(s, &bad, 1, NULL, 0) == NEEDLE_ERR_INVALID_TOKEN)
        snprintf(j->err_seen, sizeof j->err_seen, "%s", needle_last_error());
    needle_session_free(s);
}

static void *thread_main(void *arg) {
    run_job(arg);
    return NULL;
}

static void test_threads(void) {
    enum { N = 40 };
    int32_t t1[N], t2[N];
    make_tokens(t1, N, 5);
    make_tokens(t2, N, 6);
    job seq[2] = {{t1, N, malloc(N * V * sizeof(float)), {0}, 0, 0, ""},
                  {t2, N, malloc(N * V * sizeof(float)), {0}, 0, 0, ""}};
    job par[2] = {{t1, N, malloc(N * V * sizeof(float)), {0}, 0, 0, ""},
                  {t2, N, malloc(N * V * sizeof(float)), {0}, 0, 0, ""}};
    run_job(&seq[0]);
    run_job(&seq[1]);
    /* leave a message on the main thread; the workers must not touch it */
    size_t n;
    CHECK_EQ_INT(needle_tokenize(g_model, "\xFF", 1, NULL, 0, &n), NEEDLE_ERR_INVALID_UTF8);
    char main_msg[256];
    snprintf(main_msg, sizeof main_msg, "%s", needle_last_error());

    pthread_t th[2];
    for (int r = 0; r < 3; r++) { /* a few rounds: races show up more often */
        for (int i = 0; i < 2; i++) CHECK_EQ_INT(pthread_create(&th[i], NULL, thread_main, &par[i]), 0);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++) {
            CHECK_MSG(par[i].rc == NEEDLE_OK && seq[i].rc == NEEDLE_OK, "job %d: rc %d / %d", i,
                      par[i].rc, seq[i].rc);
            CHECK_MSG(memcmp(seq[i].logits, par[i].logits, N * V * sizeof(float)) == 0,
                      "round %d job %d: concurrent logits differ (%g)", r, i,
                      rel_dev(seq[i].logits, par[i].logits, (size_t)N * V));
            CHECK(seq[i].n_gen == par[i].n_gen &&
                  memcmp(seq[i].gen, par[i].gen, seq[i].n_gen * sizeof(int32_t)) == 0);
            CHECK(strstr(par[i].err_seen, "-1") != NULL);
        }
    }
    CHECK_MSG(strcmp(main_msg, needle_last_error()) == 0, "main thread message changed to \"%s\"",
              needle_last_error());
    for (int i = 0; i < 2; i++) {
        free(seq[i].logits);
        free(par[i].logits);
    }
}

/* ---- pool threads ------------------------------------------------------------------- */

/* [N + STEPS][V] logits of a prefill of N tokens then STEPS single-token evals, on a model
 * opened with `n_threads` pool threads. */
static float *logits_with_threads(int32_t n_threads, int32_t kv_type, const int32_t *t, size_t N,
                                  size_t steps) {
    needle_model_params mp = needle_model_default_params();
    mp.n_threads = n_threads;
    needle_model *m = NULL;
    int rc = needle_model_open(g_path, &mp, &m);
    CHECK_MSG(rc == NEEDLE_OK, "open %s: %s", g_path, needle_last_error());
    if (rc) return NULL;
    needle_session_params p = needle_session_default_params();
    p.n_ctx = 96;
    p.kv_type = kv_type;
    p.n_sinks = 2; /* sinks and the header's window ring both attended */
    needle_session *s = NULL;
    float *out = malloc((N + steps) * V * sizeof *out);
    rc = needle_session_create(m, &p, &s);
    CHECK_MSG(rc == NEEDLE_OK, "session_create: %s", needle_last_error());
    if (rc == NEEDLE_OK) rc = needle_session_eval(s, t, N, out, N * V);
    for (size_t i = 0; rc == NEEDLE_OK && i < steps; i++)
        rc = needle_session_eval(s, t + N + i, 1, out + (N + i) * V, V);
    CHECK_MSG(rc == NEEDLE_OK, "eval: %s", needle_last_error());
    needle_session_free(s);
    needle_model_free(m);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

/* The ops split tokens (prefill) and query heads (attention) among the pool's threads;
 * every item is computed the same way whichever thread takes it. */
static void test_thread_counts(void) {
    enum { N = 44, STEPS = 4 };
    int32_t t[N + STEPS];
    make_tokens(t, N + STEPS, 7);
    CHECK_MSG(g_info.kv_window > 0 && g_info.kv_window + 2 < N,
              "fixture window %u does not wrap in %d tokens", g_info.kv_window, N);
    const struct { int32_t type; const char *name; } kinds[] = {
        {NEEDLE_KV_F32, "f32"}, {NEEDLE_KV_F16, "f16"}, {NEEDLE_KV_INT8, "int8"}};
    for (int k = 0; k < 3; k++) {
        float *one = logits_with_threads(1, kinds[k].type, t, N, STEPS);
        float *three = logits_with_threads(3, kinds[k].type, t, N, STEPS);
        if (one && three)
            CHECK_MSG(memcmp(one, three, (size_t)(N + STEPS) * V * sizeof(float)) == 0,
                      "kv %s: logits with 1 and 3 threads differ (%g)", kinds[k].name,
                      rel_dev(one, three, (size_t)(N + STEPS) * V));
        free(one);
        free(three);
    }
}

int main(void) {
    if (!open_fixture()) {
        fprintf(stderr, "test_api: no tests/fixtures/tiny_*.cact with a tokenizer\n");
        return 1;
    }
    RUN(test_null_arguments);
    RUN(test_status_strings);
    RUN(test_context_and_tokens);
    RUN(test_prefill_matches_incremental);
    RUN(test_generate);
    RUN(test_kv_types);
    RUN(test_text);
    RUN(test_threads);
    RUN(test_thread_counts);
    needle_model_free(g_model);
    return test_summary();
}
