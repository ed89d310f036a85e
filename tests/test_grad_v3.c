/* Gradient parity of the Needle 3 training core (src/train/grad3.c) with jax.grad of the
 * official 3.2.8 code: tests/fixtures/grad_v3/ (tests/reference/make_grad_v3_fixtures.sh).
 * (a) the float base loss: the loss and the gradient of every checkpoint tensor. The
 * tolerance comes from the reference's own float32-vs-float64 distance written beside the
 * fixture (NAME.json floor_rel_l2_max_tensor), with a floor for tensors whose gradient is
 * a sum of few terms. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/grad3.h"
#include "grad3_fixture.h"
#include "needle.h"

static const char *const MODELS[] = {"g3a", "g3b"};

/* NAME.json's number at key/sub */
static double info_number(const char *stem, const char *key, const char *sub) {
    char name[256];
    snprintf(name, sizeof name, "grad_v3/%.100s.json", stem);
    size_t size = 0;
    char *text = (char *)read_file(fixture_path(name), &size);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (sub) v = cJSON_GetObjectItemCaseSensitive(v, sub);
    const double out = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    cJSON_Delete(j);
    free(text);
    return out;
}

static void check_float(const char *stem) {
    char path[512];
    g3_model *m = NULL;
    snprintf(path, sizeof path, "grad_v3/%.100s", stem);
    CHECK_MSG(fx_model(path, &m) == 0, "%s: model: %s", stem, needle_last_error());
    fx_batch b;
    snprintf(path, sizeof path, "grad_v3/%.100s.batch.jsonl", stem);
    CHECK_MSG(fx_batch_load(fixture_path(path), &b) == 0, "%s: batch", stem);
    fx_file ref;
    snprintf(path, sizeof path, "grad_v3/%.100s.grad_float.safetensors", stem);
    CHECK_MSG(fx_open(path, &ref) == 0, "%s: reference gradients", stem);
    if (!m || !b.B || !ref.img) {
        g3_model_free(m);
        fx_batch_free(&b);
        fx_close(&ref);
        return;
    }
    double loss = 0;
    CHECK_MSG(g3_loss(m, b.ids, b.mask, b.B, b.T, 1, &loss) == 0, "%s: %s", stem, needle_last_error());
    const double want = atof(st_meta_get(&ref.st, "loss"));
    CHECK_MSG(fabs(loss - want) <= 1e-5 * fabs(want), "%s: loss %.9g, official %.9g", stem, loss, want);
    const double floor = info_number(stem, "floor_rel_l2_max_tensor", "float");
    CHECK_MSG(floor == floor && floor < 1e-2, "%s: no measured floor", stem);
    const double tol = fmax(1e-4, 20 * floor);
    double worst = 0;
    const char *worst_name = "";
    CHECK_EQ_INT(ref.st.n, g3_tensor_count(m) - (m && !g3_find(m, "stack/layers/block/self_attn/q_taps")->numel ? 3 : 0));
    for (uint32_t i = 0; i < ref.st.n; i++) {
        const st_tensor *r = &ref.st.tensors[i];
        g3_tensor *t = g3_find(m, r->name);
        CHECK_MSG(t && t->numel == r->numel, "%s: gradient %s missing or of another size", stem, r->name);
        if (!t || t->numel != r->numel) continue;
        const double d = fx_rel_l2(t->g, r, r->numel);
        CHECK_MSG(d <= tol, "%s: d/d %s: relative L2 %.3g > %.3g", stem, r->name, d, tol);
        if (d > worst) worst = d, worst_name = r->name;
    }
    printf("  %s float: loss %.9g (official %.9g), worst gradient %s at %.3g (tolerance %.3g)\n", stem, loss,
           want, worst_name, worst, tol);
    g3_model_free(m);
    fx_batch_free(&b);
    fx_close(&ref);
}

static void test_float_gradients(void) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) check_float(MODELS[i]);
}

int main(void) {
    RUN(test_float_gradients);
    return test_summary();
}
