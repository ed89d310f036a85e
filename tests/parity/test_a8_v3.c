/* W·A8 on Needle 3 against the official QAT forward (tests/reference/make_a8_v3_fixtures.py:
 * the 3.2.8 flax model with quant=True at the file's kv_bits, on the Needle 3 fixtures'
 * weights and prompts; fixtures in tests/fixtures/v3/a8/), with the checks of
 * qat_check.h by prefill and by one-token steps; also the refusals (kv_bits other than 8).
 * Prints the figures. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"
#include "util/fp16.h"

#include "qat_check.h"

/* flip_error: the float32 fixtures agree with the engine to ~1e-6 x max|logit| (float
 * parity is 5e-7 to 1e-6 on these models) and a flip moves its row by 1e-5 or more.
 * closer: A8's mean error against the QAT model is 0.007-0.04 of the float engine's on
 * these models; leaving out one quantization point (e.g. the query heads) gives 0.5-0.8. */
static const qat_limits limits = {.flip_error = 1e-5, .flip_margin = 1e-4, .gap = 0.1,
                                  .closer = 0.2};

static int ints(const cJSON *a, int32_t *out, size_t n) {
    if (!cJSON_IsArray(a) || (size_t)cJSON_GetArraySize(a) != n) return -1;
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) out[i++] = (int32_t)it->valuedouble;
    return 0;
}

static int load_case(const cJSON *c, uint32_t cols, qat_case *qc) {
    memset(qc, 0, sizeof *qc);
    const cJSON *tokens = cJSON_GetObjectItem(c, "tokens"), *greedy = cJSON_GetObjectItem(c, "greedy");
    const cJSON *margins = cJSON_GetObjectItem(c, "round_margin"), *prompt = cJSON_GetObjectItem(c, "prompt");
    const cJSON *logits = cJSON_GetObjectItem(c, "logits");
    if (!cJSON_IsArray(tokens) || !cJSON_IsArray(greedy) || !cJSON_IsArray(margins) ||
        !cJSON_IsNumber(prompt) || !cJSON_IsString(logits))
        return -1;
    qc->n_seq = (size_t)cJSON_GetArraySize(tokens);
    qc->n_greedy = (size_t)cJSON_GetArraySize(greedy);
    qc->n_prompt = (size_t)prompt->valuedouble;
    qc->cols = cols;
    if (qc->n_greedy < 1 || qc->n_prompt + qc->n_greedy - 1 != qc->n_seq ||
        (size_t)cJSON_GetArraySize(margins) != qc->n_seq)
        return -1;
    const needle_session_params defaults = needle_session_default_params();
    qc->sinks = defaults.n_sinks;
    qc->window = defaults.kv_window;
    qat_case_alloc(qc);
    if (ints(tokens, qc->seq, qc->n_seq) || ints(greedy, qc->greedy, qc->n_greedy)) return -1;
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, margins) qc->round_margin[i++] = it->valuedouble;
    char rel[512];
    snprintf(rel, sizeof rel, "v3/a8/%s", logits->valuestring);
    size_t size;
    uint8_t *b = read_file(fixture_path(rel), &size);
    if (!b || size != qc->n_seq * cols * 4) {
        free(b);
        return -1;
    }
    qc->ref = malloc(size);
    for (size_t k = 0; k < qc->n_seq * cols; k++) qc->ref[k] = rd_f32(b + 4 * k);
    free(b);
    return 0;
}

static void run_model(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "v3/a8/%s.json", name);
    char *text = (char *)read_file(fixture_path(rel), NULL);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *cases = doc ? cJSON_GetObjectItem(doc, "cases") : NULL;
    CHECK_MSG(cJSON_IsArray(cases), "%s: missing or not an A8 fixture", rel);
    needle_model *m = NULL;
    snprintf(rel, sizeof rel, "v3/%s.cact", name);
    const int rc = cases ? needle_model_open(fixture_path(rel), NULL, &m) : NEEDLE_ERR_IO;
    CHECK_MSG(!cases || rc == NEEDLE_OK, "%s: %s", rel, needle_last_error());
    if (rc == NEEDLE_OK) {
        needle_model_info info = {.size = sizeof info};
        CHECK_EQ_INT(needle_model_get_info(m, &info), NEEDLE_OK);
        qat_stats st = {0};
        int k = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, cases) {
            qat_case qc;
            const int ok = load_case(c, info.out_vocab, &qc) == 0;
            CHECK_MSG(ok, "%s case %d: malformed, or its logits are not [rows][out_vocab]", name, k);
            if (ok) qat_check_case(m, name, k, &qc, info.vocab, 1, &limits, &st);
            qat_case_free(&qc);
            k++;
        }
        qat_finish_model(name, &st, &limits);
    }
    needle_model_free(m);
    cJSON_Delete(doc);
}

static void test_qat_parity(void) {
    run_model("v3a"); /* mixed CQ2/CQ4, conv taps, local + global layers, out_vocab */
    run_model("v3b"); /* engram seed heads, qk > v, 4 lanes */
    run_model("v3c"); /* all-local, no engram */
    run_model("v3d"); /* binary, ternary, CQ2-4 records */
}

/* W·A8 is only the 8-bit KV numerics: a file made for a CQ KV cache is refused, not run
 * with the wrong quantization. */
static void test_other_kv_bits_refused(void) {
    size_t size;
    uint8_t *img = read_file(fixture_path("v3/v3c.cact"), &size);
    CHECK(img != NULL);
    if (!img) return;
    img[16] = 4; /* header word 4: kv_bits */
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open_blob(img, size, NULL, &m), NEEDLE_OK);
    needle_session_params sp = needle_session_default_params();
    sp.activations = NEEDLE_ACT_A8;
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(s == NULL && strstr(needle_last_error(), "kv_bits 4") != NULL);
    sp.activations = NEEDLE_ACT_F32; /* the float engine runs it as before */
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    needle_session_free(s);
    needle_model_free(m);
    free(img);
}

int main(void) {
    RUN(test_qat_parity);
    RUN(test_other_kv_bits_refused);
    return test_summary();
}
