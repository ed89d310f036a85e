/* Needle 3 per-layer KV layout: a local (sliding-window) layer keeps a ring of exactly its
 * window's rows (position t in slot t % window), a global layer the session's sinks and
 * window or the whole context (backend.h kv_layers, session.c kv_cache_alloc).
 *
 * - Layout and size: every layer's rows are what its kind asks, and the bytes the session
 *   reports (needle_session_get_stats kv_bytes) are the sum over the layers computed here
 *   from the model info, less than the uniform layout's.
 * - Same results: on prompts several times longer than the local windows, the logits at
 *   every position, by one prefill and by one-token steps, are bit-identical to those of
 *   the uniform layout (the CPU ops with kv_per_layer off), in f32, f16 and int8, with 1
 *   and 4 threads, with and without a session window and sinks. A wrong slot for any
 *   position a local layer reads changes them.
 * - Checkpoints: a local ring row is overwritten by position t + window, so a checkpoint
 *   (turn rollback, the tools-prefix base of needle_session_reset) must carry the rows a
 *   restore needs: going back after more than a window of positions and re-running gives
 *   the same logits as the first time, bit for bit; on the CPU in every KV precision, and
 *   through the Metal kernels compiled as C (metal_ops.c over metal_emu.c), whose cache
 *   is laid out the same way. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "harness.h"
#include "model/model.h"
#include "model/session.h"
#include "needle.h"

static const char *const fixtures[] = {"v3a", "v3b", "v3c", "v3d"};
static const int32_t kv_types[] = {NEEDLE_KV_F32, NEEDLE_KV_F16, NEEDLE_KV_INT8};

#ifdef NEEDLE_TEST_METAL_C
extern const needle_backend_ops nk_backend_ops; /* metal_ops.c over metal_emu.c */
#endif

/* The uniform layout over the same CPU ops. */
static needle_backend_ops uniform_ops;

/* The first case's prompt of a fixture (load_cases in test_v3_kv.c reads the rest). */
static int32_t *load_prompt(const char *name, uint32_t *n) {
    char rel[256];
    snprintf(rel, sizeof rel, "v3/%s.json", name);
    size_t size;
    char *text = (char *)read_file(fixture_path(rel), &size);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    *n = 0;
    if (!j) return NULL;
    const cJSON *toks = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "cases"), 0),
                                            "tokens");
    *n = (uint32_t)cJSON_GetArraySize(toks);
    int32_t *out = malloc((*n ? *n : 1) * sizeof *out);
    for (uint32_t i = 0; out && i < *n; i++) out[i] = cJSON_GetArrayItem(toks, (int)i)->valueint;
    cJSON_Delete(j);
    return out;
}

static needle_model *open_model(const char *name, int32_t threads) {
    char rel[256];
    snprintf(rel, sizeof rel, "v3/%s.cact", name);
    needle_model_params mp = needle_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = threads;
    needle_model *m = NULL;
    CHECK_MSG(needle_model_open(fixture_path(rel), &mp, &m) == NEEDLE_OK, "%s: %s", name,
              needle_last_error());
    return m;
}

static model_session *open_session(const needle_model *m, const needle_backend_ops *ops,
                                    int32_t kv, int32_t window, uint32_t sinks) {
    needle_session_params sp = needle_session_default_params();
    sp.kv_type = kv;
    sp.kv_window = window;
    sp.n_sinks = sinks;
    model_session *s = NULL;
    CHECK_MSG(session_create_with_ops(m, &sp, ops, &s) == NEEDLE_OK, "session kv %d: %s", kv,
              needle_last_error());
    return s;
}

/* Logits [n][vocab] of tokens[0..n) from position 0 of s, by one prefill or one-token steps. */
static float *run_logits(model_session *s, const int32_t *tokens, uint32_t n, uint32_t vocab,
                         int steps) {
    float *out = malloc((size_t)n * vocab * sizeof *out);
    int rc = NEEDLE_OK;
    if (!steps) rc = session_eval(s, tokens, n, out, (size_t)n * vocab, NULL);
    for (uint32_t p = 0; steps && p < n && rc == NEEDLE_OK; p++)
        rc = session_eval(s, tokens + p, 1, out + (size_t)p * vocab, vocab, NULL);
    CHECK_MSG(rc == NEEDLE_OK, "eval: %s", needle_last_error());
    if (rc == NEEDLE_OK) return out;
    free(out);
    return NULL;
}

/* The largest local window of the model (0 if every layer is global). */
static uint32_t local_window(const needle_model_info *info) {
    for (uint32_t l = 0; l < info->num_layers; l++)
        if (!(info->global_layers >> l & 1)) return info->sliding_window;
    return 0;
}

static void test_layout_and_bytes(void) {
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        needle_model *m = open_model(fixtures[f], 1);
        if (!m) continue;
        needle_model_info info = {.size = sizeof info};
        CHECK_EQ_INT(needle_model_get_info(m, &info), NEEDLE_OK);
        const uint32_t n_ctx = info.max_seq_len, win = info.sliding_window;
        CHECK_MSG(local_window(&info) > 0 && win < n_ctx, "%s has no local layer shorter than "
                  "its context", fixtures[f]);
        const uint32_t kvd = info.num_kv_heads * (info.qk_head_dim > info.v_head_dim
                                                      ? info.qk_head_dim
                                                      : info.v_head_dim);
        const struct { int32_t window; uint32_t sinks; } shapes[] = {{-1, 0},
                                                                     {(int32_t)win + 3, 2}};
        for (size_t sh = 0; sh < 2; sh++)
            for (size_t t = 0; t < 3; t++) {
                model_session *s = open_session(m, &cpu_backend_ops, kv_types[t],
                                                 shapes[sh].window, shapes[sh].sinks);
                model_session *u = open_session(m, &uniform_ops, kv_types[t], shapes[sh].window,
                                                 shapes[sh].sinks);
                if (!s || !u) {
                    session_free(s);
                    session_free(u);
                    continue;
                }
                const uint32_t global_slots =
                    shapes[sh].window < 0 ? n_ctx : shapes[sh].sinks + (uint32_t)shapes[sh].window;
                const size_t elem = t == 0 ? 4 : t == 1 ? 2 : 1;
                const size_t row = kvd * elem + (t == 2 ? (kvd + 31) / 32 * sizeof(float) : 0);
                uint64_t want = 0, rows = 0;
                for (uint32_t l = 0; l < info.num_layers; l++) {
                    const kv_layer_layout *L = &s->bk.kv_layers[l];
                    const int global = info.global_layers >> l & 1;
                    const uint32_t slots = global ? global_slots : win;
                    CHECK_MSG(L->slots == slots && L->row0 == rows &&
                                  L->n_sinks == (global ? shapes[sh].sinks : 0) &&
                                  L->window == (global ? (shapes[sh].window < 0 ? 0u
                                                          : (uint32_t)shapes[sh].window)
                                                       : win),
                              "%s layer %u (%s): slots %u row0 %zu sinks %u window %u",
                              fixtures[f], l, global ? "global" : "local", L->slots, L->row0,
                              L->n_sinks, L->window);
                    rows += slots;
                    want += 2 * (uint64_t)slots * row;
                }
                needle_session_stats st = {.size = sizeof st}, su = {.size = sizeof su};
                CHECK_EQ_INT(session_get_stats(s, &st), NEEDLE_OK);
                CHECK_EQ_INT(session_get_stats(u, &su), NEEDLE_OK);
                CHECK_MSG(st.kv_bytes == want, "%s kv %d: %llu KV bytes reported, %llu per "
                          "layer", fixtures[f], kv_types[t], (unsigned long long)st.kv_bytes,
                          (unsigned long long)want);
                CHECK(su.kv_bytes == 2 * (uint64_t)info.num_layers * global_slots * row);
                CHECK(st.kv_bytes < su.kv_bytes);
                if (sh == 0 && t == 0)
                    printf("  %s: f32 KV cache %llu bytes by layer kind (uniform layout "
                           "%llu)\n", fixtures[f],
                           (unsigned long long)st.kv_bytes, (unsigned long long)su.kv_bytes);
                session_free(s);
                session_free(u);
            }
        needle_model_free(m);
    }
}

static void test_same_as_uniform(void) {
    const int32_t threads[] = {1, 4};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        uint32_t n = 0;
        int32_t *tokens = load_prompt(fixtures[f], &n);
        for (size_t th = 0; tokens && th < 2; th++) {
            needle_model *m = open_model(fixtures[f], threads[th]);
            if (!m) continue;
            needle_model_info info = {.size = sizeof info};
            CHECK_EQ_INT(needle_model_get_info(m, &info), NEEDLE_OK);
            const uint32_t win = local_window(&info);
            CHECK_MSG(win && n >= 4 * win, "%s: prompt of %u tokens, local window %u",
                      fixtures[f], n, win);
            const struct { int32_t window; uint32_t sinks; } shapes[] = {{-1, 0},
                                                                         {(int32_t)win + 3, 2}};
            for (size_t sh = 0; sh < 2; sh++)
                for (size_t t = 0; t < 3; t++)
                    for (int steps = 0; steps < 2; steps++) {
                        model_session *s = open_session(m, &cpu_backend_ops, kv_types[t],
                                                         shapes[sh].window, shapes[sh].sinks);
                        model_session *u = open_session(m, &uniform_ops, kv_types[t],
                                                         shapes[sh].window, shapes[sh].sinks);
                        float *a = s ? run_logits(s, tokens, n, info.vocab, steps) : NULL;
                        float *b = u ? run_logits(u, tokens, n, info.vocab, steps) : NULL;
                        CHECK_MSG(a && b && memcmp(a, b, (size_t)n * info.vocab * sizeof *a) == 0,
                                  "%s threads %d kv %d window %d steps %d: per-layer KV "
                                  "differs from uniform", fixtures[f], threads[th], kv_types[t],
                                  shapes[sh].window, steps);
                        free(a);
                        free(b);
                        session_free(s);
                        session_free(u);
                    }
            needle_model_free(m);
        }
        free(tokens);
    }
}

/* From a checkpoint at `at` (horizon: the rest of the prompt), the rest's logits by steps,
 * twice with a restore between, and once more after needle_session_reset to a base pinned
 * at `at`: all three equal a fresh session's run of the same prefill and steps. */
static void checkpoint_round(needle_model *m, const needle_backend_ops *ops,
                             const needle_model_info *info, int32_t kv, const int32_t *tokens,
                             uint32_t n, uint32_t at, const char *name) {
    const uint32_t V = info->vocab, rest = n - at;
    model_session *fresh = open_session(m, ops, kv, -1, 0);
    model_session *s = open_session(m, ops, kv, -1, 0);
    /* the same split as below (a prefill of `at` then steps: a prefill's last bits may
     * differ from steps') */
    float *want = malloc((size_t)rest * V * sizeof *want);
    if (!fresh || session_eval(fresh, tokens, at, NULL, 0, NULL) != NEEDLE_OK) {
        free(want);
        want = NULL;
    }
    for (uint32_t p = 0; want && p < rest; p++)
        CHECK_EQ_INT(session_eval(fresh, tokens + at + p, 1, want + (size_t)p * V, V, NULL),
                     NEEDLE_OK);
    float *got = malloc((size_t)rest * V * sizeof *got);
    session_checkpoint cp;
    memset(&cp, 0, sizeof cp);
    if (s && want && got && session_eval(s, tokens, at, NULL, 0, NULL) == NEEDLE_OK) {
        CHECK_EQ_INT(session_checkpoint_save(s, &cp, rest), NEEDLE_OK);
        CHECK_EQ_INT(session_set_base(s), NEEDLE_OK);
        for (int round = 0; round < 3; round++) {
            if (round == 1) CHECK_EQ_INT(session_checkpoint_restore(s, &cp), NEEDLE_OK);
            if (round == 2) session_reset(s);
            CHECK_EQ_INT(session_position(s), at);
            int rc = NEEDLE_OK;
            for (uint32_t p = 0; p < rest && rc == NEEDLE_OK; p++)
                rc = session_eval(s, tokens + at + p, 1, got + (size_t)p * V, V, NULL);
            CHECK_EQ_INT(rc, NEEDLE_OK);
            CHECK_MSG(memcmp(got, want, (size_t)rest * V * sizeof *got) == 0,
                      "%s kv %d: checkpoint at %u, round %d: logits differ", name, kv, at, round);
        }
        /* one position past its horizon the checkpoint cannot be restored */
        if (session_position(s) < info->max_seq_len) {
            CHECK_EQ_INT(session_eval(s, tokens, 1, NULL, 0, NULL), NEEDLE_OK);
            CHECK_EQ_INT(session_checkpoint_restore(s, &cp), NEEDLE_ERR_STATE);
        }
    } else {
        CHECK_MSG(0, "%s: setup failed: %s", name, needle_last_error());
    }
    session_checkpoint_free(&cp);
    free(want);
    free(got);
    session_free(s);
    session_free(fresh);
}

static void test_checkpoints(void) {
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        uint32_t n = 0;
        int32_t *tokens = load_prompt(fixtures[f], &n);
        needle_model *m = tokens ? open_model(fixtures[f], 2) : NULL;
        if (!m) {
            free(tokens);
            continue;
        }
        needle_model_info info = {.size = sizeof info};
        CHECK_EQ_INT(needle_model_get_info(m, &info), NEEDLE_OK);
        const uint32_t win = local_window(&info);
        /* past the window, and with more than two windows still to come */
        const uint32_t at = win + 3;
        CHECK_MSG(win && n > at + 2 * win, "%s: prompt of %u tokens, local window %u",
                  fixtures[f], n, win);
        for (size_t t = 0; win && n > at + 2 * win && t < 3; t++)
            checkpoint_round(m, &cpu_backend_ops, &info, kv_types[t], tokens, n, at, fixtures[f]);
#ifdef NEEDLE_TEST_METAL_C
        /* the Metal kernels compiled as C lay the cache out per layer too (f32 only) */
        if (win && n > at + 2 * win) {
            char name[64];
            snprintf(name, sizeof name, "metal-c %s", fixtures[f]);
            checkpoint_round(m, &nk_backend_ops, &info, NEEDLE_KV_F32, tokens, n, at, name);
            model_session *c = open_session(m, &cpu_backend_ops, NEEDLE_KV_F32, -1, 0);
            model_session *g = open_session(m, &nk_backend_ops, NEEDLE_KV_F32, -1, 0);
            CHECK(c && g && session_kv_bytes(c) == session_kv_bytes(g));
            session_free(c);
            session_free(g);
        }
#endif
        needle_model_free(m);
        free(tokens);
    }
}

int main(void) {
    uniform_ops = cpu_backend_ops;
    uniform_ops.kv_per_layer = 0;
    RUN(test_layout_and_bytes);
    RUN(test_same_as_uniform);
    RUN(test_checkpoints);
    return test_summary();
}
