/* The architecture descriptor and the traits (issue 28 item 1; src/model/arch.h,
 * backend/weights.h model_traits), on a Needle 2 and a Needle 3 fixture:
 *
 * - model_arch_for maps the file tags 2 and 3 to their descriptors and nothing else; a
 *   bound model carries its file's descriptor and the traits its layers compute.
 * - The forward pass's one chunk loop runs every layer through m->arch->layer (a counting
 *   stand-in that calls the real layer sees n_layers calls per chunk, and the logits are
 *   bit-identical to the real descriptor's).
 * - A backend is judged by the ops the traits call for: without attention3 or monarch_mlp
 *   a Needle 3 session is refused with NEEDLE_ERR_BACKEND naming the architecture, a
 *   Needle 2 one is not.
 * - Each architecture's session rule: Needle 3 defaults to no KV window and refuses one
 *   shorter than a local layer's span; Needle 2 takes the file's window.
 * - The logits request is an argument of session_forward: skip leaves no logits, rows
 *   leaves exactly those ids' values of a full run and -inf elsewhere. */
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "harness.h"
#include "model/model.h"
#include "model/session.h"
#include "needle.h"

static needle_model *open_fixture(const char *rel) {
    needle_model_params mp = needle_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = 1;
    needle_model *m = NULL;
    CHECK_MSG(needle_model_open(fixture_path(rel), &mp, &m) == NEEDLE_OK, "%s: %s", rel,
              needle_last_error());
    return m;
}

static model_session *open_session(needle_model *m, const needle_backend_ops *ops,
                                    int32_t window, int *rc) {
    needle_session_params sp = needle_session_default_params();
    sp.kv_window = window;
    model_session *s = NULL;
    *rc = session_create_with_ops(m, &sp, ops, &s);
    return s;
}

static void test_descriptor_table(void) {
    CHECK(model_arch_for(2) == &model_arch_needle2);
    CHECK(model_arch_for(3) == &model_arch_needle3);
    CHECK(model_arch_for(0) == NULL);
    CHECK(model_arch_for(4) == NULL);
    CHECK_EQ_INT(model_arch_needle2.generation, 2);
    CHECK_EQ_INT(model_arch_needle3.generation, 3);
}

static void test_traits(void) {
    needle_model *m2 = open_fixture("tiny_cq2.cact"), *m3 = open_fixture("v3/v3a.cact");
    if (!m2 || !m3) return;
    CHECK(m2->arch == &model_arch_needle2);
    CHECK_EQ_INT(m2->w.traits.mlp, MODEL_MLP_HADAMARD);
    CHECK_EQ_INT(m2->w.traits.attention, MODEL_ATTN_ROPE);
    CHECK_EQ_INT(m2->w.traits.phi_a8, 0);
    CHECK_EQ_INT(m2->w.traits.heads_a8, 0);
    CHECK(m3->arch == &model_arch_needle3);
    CHECK_EQ_INT(m3->w.traits.mlp, MODEL_MLP_MONARCH);
    CHECK_EQ_INT(m3->w.traits.attention, MODEL_ATTN_SPANNED);
    CHECK_EQ_INT(m3->w.traits.phi_a8, 1);
    CHECK_EQ_INT(m3->w.traits.heads_a8, 1);
    needle_model_free(m2);
    needle_model_free(m3);
}

static const model_arch *real_arch;
static uint32_t layer_calls;

static void counting_layer(struct model_session *s, uint32_t li, uint32_t p0, uint32_t n) {
    layer_calls++;
    real_arch->layer(s, li, p0, n);
}

static void test_layer_through_descriptor(void) {
    static const char *const files[] = {"tiny_cq2.cact", "v3/v3a.cact"};
    const int32_t tokens[] = {1, 5, 9, 14, 3, 7, 2, 11};
    const uint32_t n = sizeof tokens / sizeof tokens[0];
    for (size_t f = 0; f < 2; f++) {
        needle_model *m = open_fixture(files[f]);
        if (!m) return;
        int rc;
        model_session *ref = open_session(m, &cpu_backend_ops, -1, &rc);
        CHECK_EQ_INT(rc, NEEDLE_OK);
        CHECK_EQ_INT(session_forward(ref, tokens, n, NULL, NULL, NULL), NEEDLE_OK);

        real_arch = m->arch;
        model_arch counting = *m->arch;
        counting.layer = counting_layer;
        m->arch = &counting;
        layer_calls = 0;
        model_session *s = open_session(m, &cpu_backend_ops, -1, &rc);
        CHECK_EQ_INT(rc, NEEDLE_OK);
        CHECK_EQ_INT(session_forward(s, tokens, n, NULL, NULL, NULL), NEEDLE_OK);
        const uint32_t chunks = (n + s->bk.chunk - 1) / s->bk.chunk;
        CHECK_EQ_INT(layer_calls, chunks * m->w.n_layers);
        CHECK_MSG(!memcmp(s->logits, ref->logits, m->w.vocab * sizeof(float)),
                  "%s: logits differ through the descriptor", files[f]);
        session_free(s);
        session_free(ref);
        m->arch = real_arch;
        needle_model_free(m);
    }
}

static void test_backend_by_traits(void) {
    needle_model *m2 = open_fixture("tiny_cq2.cact"), *m3 = open_fixture("v3/v3a.cact");
    if (!m2 || !m3) return;
    CHECK(model_backend_runs(m3, &cpu_backend_ops));
    needle_backend_ops no_attention3 = cpu_backend_ops, no_monarch = cpu_backend_ops;
    no_attention3.attention3 = NULL;
    no_monarch.monarch_mlp = NULL;
    const needle_backend_ops *lacking[] = {&no_attention3, &no_monarch};
    for (size_t i = 0; i < 2; i++) {
        CHECK(!model_backend_runs(m3, lacking[i]));
        CHECK(model_backend_runs(m2, lacking[i]));
        int rc;
        model_session *s = open_session(m3, lacking[i], -1, &rc);
        CHECK_EQ_INT(rc, NEEDLE_ERR_BACKEND);
        CHECK(s == NULL);
        CHECK_MSG(strstr(needle_last_error(), "cannot run Needle 3 models") != NULL, "%s",
                  needle_last_error());
        s = open_session(m2, lacking[i], -1, &rc);
        CHECK_EQ_INT(rc, NEEDLE_OK);
        session_free(s);
    }
    needle_model_free(m2);
    needle_model_free(m3);
}

static void test_session_rules(void) {
    needle_model *m2 = open_fixture("tiny_cq2.cact"), *m3 = open_fixture("v3/v3a.cact");
    if (!m2 || !m3) return;
    int rc;
    model_session *s = open_session(m2, &cpu_backend_ops, -1, &rc);
    CHECK_EQ_INT(rc, NEEDLE_OK);
    if (s) CHECK_EQ_INT(session_window(s), m2->info.kv_window);
    session_free(s);
    s = open_session(m3, &cpu_backend_ops, -1, &rc);
    CHECK_EQ_INT(rc, NEEDLE_OK);
    if (s) CHECK_EQ_INT(session_window(s), 0);
    session_free(s);
    uint32_t widest = 0;
    for (uint32_t l = 0; l < m3->w.n_layers; l++)
        if (m3->w.layers3[l].window > widest) widest = m3->w.layers3[l].window;
    CHECK_MSG(widest > 1, "v3a has a local layer");
    s = open_session(m3, &cpu_backend_ops, (int32_t)widest - 1, &rc);
    CHECK_EQ_INT(rc, NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(s == NULL);
    s = open_session(m3, &cpu_backend_ops, (int32_t)widest, &rc);
    CHECK_EQ_INT(rc, NEEDLE_OK);
    session_free(s);
    needle_model_free(m2);
    needle_model_free(m3);
}

static void test_logits_request(void) {
    needle_model *m = open_fixture("tiny_cq2.cact");
    if (!m) return;
    const int32_t tokens[] = {1, 6, 4, 12, 8};
    const uint32_t n = sizeof tokens / sizeof tokens[0];
    int rc;
    model_session *full = open_session(m, &cpu_backend_ops, -1, &rc);
    model_session *part = open_session(m, &cpu_backend_ops, -1, &rc);
    if (!full || !part) return;
    const logits_request skip = {1, NULL, 0};
    /* the same chunks as below: a chunk split may change the rounding */
    CHECK_EQ_INT(session_forward(full, tokens, n - 1, NULL, &skip, NULL), NEEDLE_OK);
    CHECK_EQ_INT(session_forward(full, tokens + n - 1, 1, NULL, NULL, NULL), NEEDLE_OK);
    CHECK(full->has_logits);
    CHECK_EQ_INT(session_forward(part, tokens, n - 1, NULL, &skip, NULL), NEEDLE_OK);
    CHECK(!part->has_logits);
    const int32_t rows[] = {2, 3, 10};
    const logits_request some = {0, rows, 3};
    CHECK_EQ_INT(session_forward(part, tokens + n - 1, 1, NULL, &some, NULL), NEEDLE_OK);
    CHECK(part->has_logits);
    for (uint32_t v = 0, r = 0; v < m->w.vocab; v++) {
        if (r < 3 && rows[r] == (int32_t)v) {
            CHECK_MSG(!memcmp(&part->logits[v], &full->logits[v], sizeof(float)),
                      "id %u: %g vs %g", v, part->logits[v], full->logits[v]);
            r++;
        } else {
            CHECK_MSG(isinf(part->logits[v]) && part->logits[v] < 0, "id %u not masked", v);
        }
    }
    session_free(full);
    session_free(part);
    needle_model_free(m);
}

int main(void) {
    RUN(test_descriptor_table);
    RUN(test_traits);
    RUN(test_layer_through_descriptor);
    RUN(test_backend_by_traits);
    RUN(test_session_rules);
    RUN(test_logits_request);
    return test_summary();
}
