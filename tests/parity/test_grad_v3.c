/* Gradient parity of the Needle 3 training core (src/train/grad3.c) with jax.grad of the
 * official 3.2.8 code: tests/fixtures/grad_v3/ (tests/reference/make_grad_v3_fixtures.sh).
 * (a) the float base loss: the loss and the gradient of every checkpoint tensor. The
 * tolerance comes from the reference's own float32-vs-float64 distance written beside the
 * fixture (5x NAME.json floor_rel_l2_max_tensor), with a floor of 1e-4 for tensors whose gradient is
 * a sum of few terms. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint.h"
#include "train/grad3.h"
#include "train/lora3.h"
#include "train_check.h"
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
    const double tol = fmax(1e-4, 5 * floor);
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

/* (b) LoRA with CQ straight-through on the merged weights, float activations (a8 = 0),
 * each adapter tensor against 5x the reference's own float32/float64 distance; (c) the
 * exact fine-tuning loss (a8 = 1): A8 rounding flips codes between any two float32
 * implementations, so the whole gradient (every A and B together) is held to 5x the
 * reference's float32/float64 distance of it */
static void check_lora(const char *stem, int a8) {
    char path[512];
    g3_model *m = NULL;
    snprintf(path, sizeof path, "grad_v3/%.100s", stem);
    CHECK_MSG(fx_model(path, &m) == 0, "%s: model: %s", stem, needle_last_error());
    fx_batch b;
    snprintf(path, sizeof path, "grad_v3/%.100s.batch.jsonl", stem);
    CHECK(fx_batch_load(fixture_path(path), &b) == 0);
    train_adapter ad;
    snprintf(path, sizeof path, "grad_v3/%.100s.lora.safetensors", stem);
    const int ad_ok = train_adapter_read(fixture_path(path), &ad) == 0;
    CHECK_MSG(ad_ok, "%s: adapter: %s", stem, needle_last_error());
    if (!ad_ok) b.B = 0;
    fx_file ref;
    snprintf(path, sizeof path, "grad_v3/%.100s.grad_%s.safetensors", stem, a8 ? "quant" : "cqw");
    CHECK(fx_open(path, &ref) == 0);
    if (m) g3_set_fake_quant(m, a8);
    /* the exact loss on 2 threads (the CQ of the merged weights and the products shared
     * among them), the CQ-only one on 1 */
    if (m) CHECK(g3_set_threads(m, a8 ? 2 : 1) == 0);
    if (!m || !b.B || !ref.img) {
        g3_model_free(m);
        fx_batch_free(&b);
        fx_close(&ref);
        return;
    }
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, G3_CQ_GROUP) == 0);
    float **dA = calloc(ad.n, sizeof *dA), **dB = calloc(ad.n, sizeof *dB);
    for (uint32_t i = 0; i < ad.n; i++) {
        dA[i] = calloc(ad.lora[i].a.numel, sizeof **dA);
        dB[i] = calloc(ad.lora[i].b.numel, sizeof **dB);
    }
    double loss = 0;
    CHECK_MSG(g3_lora_loss(m, &ad, &cb, b.ids, b.mask, b.B, b.T, &loss, dA, dB) == 0, "%s: %s", stem,
              needle_last_error());
    const double want = atof(st_meta_get(&ref.st, "loss"));
    CHECK_MSG(fabs(loss - want) <= (a8 ? 1e-4 : 1e-5) * fabs(want), "%s: %s loss %.9g, official %.9g", stem,
              a8 ? "quant" : "cqw", loss, want);
    const double floor = info_number(stem, a8 ? "floor_rel_l2" : "floor_rel_l2_max_tensor", a8 ? "quant" : "cqw");
    const double tol = a8 ? fmax(1e-3, 5 * floor) : fmax(1e-4, 5 * floor);
    double worst = 0, all_num = 0, all_den = 0;
    CHECK_EQ_INT(ref.st.n, 2 * ad.n);
    for (uint32_t i = 0; i < ad.n; i++)
        for (int k = 0; k < 2; k++) {
            const train_tensor *t = k ? &ad.lora[i].b : &ad.lora[i].a;
            const st_tensor *r = st_find(&ref.st, t->name);
            CHECK_MSG(r && r->numel == t->numel, "%s: no reference for %s", stem, t->name);
            if (!r || r->numel != t->numel) continue;
            double num = 0, den = 0;
            const float *g = k ? dB[i] : dA[i];
            for (uint64_t q = 0; q < r->numel; q++) {
                const double d = (double)g[q] - st_get(r, q);
                num += d * d;
                den += (double)st_get(r, q) * st_get(r, q);
            }
            const double rel = sqrt(num / (den > 0 ? den : 1));
            all_num += num, all_den += den;
            CHECK_MSG(a8 || rel <= tol, "%s: d/d %s: relative L2 %.3g > %.3g", stem, t->name, rel, tol);
            worst = rel > worst ? rel : worst;
        }
    const double all = sqrt(all_num / (all_den > 0 ? all_den : 1));
    CHECK_MSG(!a8 || all <= tol, "%s: quant: adapter gradient relative L2 %.3g > %.3g", stem, all, tol);
    printf("  %s %s: loss %.9g (official %.9g), adapter gradient relative L2 %.3g, worst tensor %.3g "
           "(tolerance %.3g %s)\n", stem, a8 ? "quant" : "cqw", loss, want, all, worst, tol, a8 ? "overall" : "per tensor");
    for (uint32_t i = 0; i < ad.n; i++) {
        free(dA[i]);
        free(dB[i]);
    }
    free(dA);
    free(dB);
    train_adapter_release(&ad);
    g3_model_free(m);
    fx_batch_free(&b);
    fx_close(&ref);
}

static void test_lora_cq_weights(void) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) check_lora(MODELS[i], 0);
}

static void test_lora_exact_finetune_loss(void) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) check_lora(MODELS[i], 1);
}

/* needle grad end to end: the float and the --lora --quant-weights gradients files against
 * the fixtures, then bad input refused with a clear message and status 2 / 1 */
static void test_cli(void) {
    const char *dir = train_tmpdir();
    char cmd[4096], out[4096], gpath[1024];
    snprintf(gpath, sizeof gpath, "%s/g.safetensors", dir);
    snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s --batch %s --out %s --json", cli_path(),
             fixture_path("grad_v3/g3a.params.safetensors"), fixture_path("grad_v3/g3a.batch.jsonl"), gpath);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "\"loss\": ") != NULL, "--json: %s", out);
    fx_file got, ref;
    char gname[1100];
    snprintf(gname, sizeof gname, "%s", gpath);
    size_t size = 0;
    got.img = read_file(gname, &size);
    CHECK(got.img && st_parse(got.img, size, &got.st) == 0);
    CHECK(fx_open("grad_v3/g3a.grad_float.safetensors", &ref) == 0);
    if (got.img && ref.img) {
        CHECK(fabs(atof(st_meta_get(&got.st, "loss")) - atof(st_meta_get(&ref.st, "loss"))) < 1e-4);
        for (uint32_t i = 0; i < ref.st.n; i++) {
            const st_tensor *r = &ref.st.tensors[i], *g = st_find(&got.st, r->name);
            CHECK_MSG(g && g->numel == r->numel, "needle grad: no %s", r->name);
            if (!g || g->numel != r->numel) continue;
            float *v = malloc(g->numel * sizeof *v);
            for (uint64_t q = 0; q < g->numel; q++) v[q] = st_get(g, q);
            CHECK_MSG(fx_rel_l2(v, r, r->numel) < 1e-3, "needle grad: %s", r->name);
            free(v);
        }
    }
    fx_close(&got);
    fx_close(&ref);
    snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s --lora %s --quant-weights --batch %s --out %s", cli_path(),
             fixture_path("grad_v3/g3a.params.safetensors"), fixture_path("grad_v3/g3a.lora.safetensors"),
             fixture_path("grad_v3/g3a.batch.jsonl"), gpath);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
    got.img = read_file(gname, &size);
    CHECK(got.img && st_parse(got.img, size, &got.st) == 0);
    CHECK(fx_open("grad_v3/g3a.grad_cqw.safetensors", &ref) == 0);
    if (got.img && ref.img) {
        CHECK_EQ_INT(got.st.n, ref.st.n);
        CHECK(fabs(atof(st_meta_get(&got.st, "loss")) - atof(st_meta_get(&ref.st, "loss"))) < 1e-4);
    }
    fx_close(&got);
    fx_close(&ref);
    /* bad input */
    char bad[1100];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", dir);
    const char *cases[] = {"{\"ids\": [1, 2, 3], \"mask\": [0, 1]}\n",
                           "{\"ids\": [1, 2, 3], \"mask\": [0, 1, 1]}\n{\"ids\": [1, 2], \"mask\": [0, 1]}\n",
                           "{\"ids\": [1, 99999, 3], \"mask\": [0, 1, 1]}\n", "not json\n", ""};
    const int want_rc[] = {2, 2, 1, 2, 2};
    for (int c = 0; c < 5; c++) {
        FILE *f = fopen(bad, "w");
        fputs(cases[c], f);
        fclose(f);
        snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s --batch %s --out %s 2>/dev/null", cli_path(),
                 fixture_path("grad_v3/g3a.params.safetensors"), bad, gpath);
        CHECK_MSG(run_command(cmd, NULL, 0) == want_rc[c], "bad batch %d", c);
    }
    snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s/none.safetensors --batch %s --out %s 2>/dev/null",
             cli_path(), dir, fixture_path("grad_v3/g3a.batch.jsonl"), gpath);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 1);
    snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s --batch %s --out %s 2>/dev/null", cli_path(),
             fixture_path("grad_v3/g3a.lora.safetensors"), fixture_path("grad_v3/g3a.batch.jsonl"), gpath);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 1); /* an adapter is not a checkpoint */
    train_tmpdir_remove(dir);
}

/* the loss and every gradient bit-identical with 1, 2 and 3 threads (g3a, A8 forward on
 * so the rounding-sensitive path is covered too) */
static void test_threads_bit_identical(void) {
    g3_model *m = NULL;
    fx_batch b;
    CHECK(fx_model("grad_v3/g3a", &m) == 0);
    CHECK(fx_batch_load(fixture_path("grad_v3/g3a.batch.jsonl"), &b) == 0);
    if (!m || !b.B) {
        g3_model_free(m);
        return;
    }
    g3_set_fake_quant(m, 1);
    uint64_t total = 0;
    for (uint32_t i = 0; i < g3_tensor_count(m); i++) total += g3_tensor_at(m, i)->numel;
    float *first = malloc(total * sizeof *first);
    double loss1 = 0;
    for (int threads = 1; threads <= 3; threads++) {
        CHECK(g3_set_threads(m, threads) == 0);
        double loss = 0;
        CHECK(g3_loss(m, b.ids, b.mask, b.B, b.T, 1, &loss) == 0);
        uint64_t off = 0, differ = 0;
        for (uint32_t i = 0; i < g3_tensor_count(m); i++) {
            const g3_tensor *t = g3_tensor_at(m, i);
            if (threads == 1)
                memcpy(first + off, t->g, t->numel * sizeof *first);
            else
                differ += memcmp(first + off, t->g, t->numel * sizeof *first) != 0;
            off += t->numel;
        }
        if (threads == 1) loss1 = loss;
        CHECK_MSG(loss == loss1 && differ == 0, "%d threads: loss %.9g vs %.9g, %llu tensors differ", threads, loss,
                  loss1, (unsigned long long)differ);
    }
    free(first);
    g3_model_free(m);
    fx_batch_free(&b);
}

/* The g3a model, its batch and its LoRA adapter, each load checked; 0 (the model freed)
 * if any is missing. */
static int open_lora_case(g3_model **m, fx_batch *b, train_adapter *ad) {
    *m = NULL;
    CHECK(fx_model("grad_v3/g3a", m) == 0);
    CHECK(fx_batch_load(fixture_path("grad_v3/g3a.batch.jsonl"), b) == 0);
    const int ad_ok = train_adapter_read(fixture_path("grad_v3/g3a.lora.safetensors"), ad) == 0;
    CHECK(ad_ok);
    if (!*m || !b->B || !ad_ok) {
        g3_model_free(*m);
        return 0;
    }
    return 1;
}

/* The prepared LoRA run (g3_lora_prepare / g3_lora_step / g3_lora_finish: the frozen CQ
 * leaves quantized once, the work space kept) gives bit for bit what g3_lora_loss gives on
 * the original base, over two steps with the adapter changed between them; finish puts
 * the adapted kernels back; an adapter path the model lacks is refused. */
static void test_lora_prepared_steps(void) {
    g3_model *m;
    fx_batch b;
    train_adapter ad;
    if (!open_lora_case(&m, &b, &ad)) return;
    g3_set_fake_quant(m, 1);
    CHECK(g3_set_threads(m, 2) == 0);
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, G3_CQ_GROUP) == 0);
    uint64_t n_ab = 0;
    for (uint32_t i = 0; i < ad.n; i++) n_ab += ad.lora[i].a.numel + ad.lora[i].b.numel;
    float **dA = calloc(ad.n, sizeof *dA), **dB = calloc(ad.n, sizeof *dB);
    for (uint32_t i = 0; i < ad.n; i++) {
        dA[i] = calloc(ad.lora[i].a.numel, sizeof **dA);
        dB[i] = calloc(ad.lora[i].b.numel, sizeof **dB);
    }
    float *want[2], *a0 = malloc(n_ab * sizeof *a0);
    double want_loss[2];
    want[0] = malloc(n_ab * sizeof(float)), want[1] = malloc(n_ab * sizeof(float));
    const g3_tensor *k0 = g3_find(m, ad.lora[0].path);
    float *kern0 = malloc(k0->numel * sizeof *kern0);
    memcpy(kern0, k0->w, k0->numel * sizeof *kern0);
#define EACH_AB(body)                                                                           \
    do {                                                                                        \
        uint64_t off_ = 0;                                                                      \
        for (uint32_t i = 0; i < ad.n; i++)                                                     \
            for (int k = 0; k < 2; k++) {                                                       \
                train_tensor *t = k ? &ad.lora[i].b : &ad.lora[i].a;                            \
                float *g = k ? dB[i] : dA[i];                                                   \
                (void)g;                                                                        \
                body;                                                                           \
                off_ += t->numel;                                                               \
            }                                                                                   \
    } while (0)
    EACH_AB(memcpy(a0 + off_, t->data, t->numel * sizeof(float)));
    /* step 2's adapter: every A and B moved a little (as an update would) */
#define MOVE_AB() EACH_AB(for (uint64_t q = 0; q < t->numel; q++) t->data[q] += 0.01f * (float)sin((double)(q + off_)))
    for (int step = 0; step < 2; step++) {
        if (step) MOVE_AB();
        CHECK(g3_lora_loss(m, &ad, &cb, b.ids, b.mask, b.B, b.T, &want_loss[step], dA, dB) == 0);
        EACH_AB(memcpy(want[step] + off_, g, t->numel * sizeof(float)));
    }
    EACH_AB(memcpy(t->data, a0 + off_, t->numel * sizeof(float)));
    g3_lora_prep *p = NULL;
    CHECK_MSG(g3_lora_prepare(m, &ad, &cb, &p) == 0, "prepare: %s", needle_last_error());
    for (int step = 0; step < 2 && p; step++) {
        if (step) MOVE_AB();
        double loss = 0;
        CHECK(g3_lora_step(p, &ad, b.ids, b.mask, b.B, b.T, &loss, dA, dB) == 0);
        uint64_t differ = 0;
        EACH_AB(differ += memcmp(want[step] + off_, g, t->numel * sizeof(float)) != 0);
        CHECK_MSG(loss == want_loss[step] && differ == 0, "step %d: loss %.9g vs %.9g, %llu tensors differ", step,
                  loss, want_loss[step], (unsigned long long)differ);
    }
    g3_lora_finish(p);
    CHECK_MSG(memcmp(kern0, k0->w, k0->numel * sizeof *kern0) == 0, "finish did not put %s back", k0->name);
    for (uint32_t i = 0; i < g3_tensor_count(m); i++) CHECK(!g3_tensor_at(m, i)->frozen);
    /* bad input: a path the model does not have */
    char *path0 = ad.lora[0].path;
    ad.lora[0].path = (char *)"stack/layers/block/self_attn/nope/kernel";
    p = NULL;
    CHECK(g3_lora_prepare(m, &ad, &cb, &p) == NEEDLE_ERR_INVALID_ARGUMENT && p == NULL);
    CHECK(strstr(needle_last_error(), "nope") != NULL);
    ad.lora[0].path = path0;
    for (uint32_t i = 0; i < g3_tensor_count(m); i++) CHECK(!g3_tensor_at(m, i)->frozen);
#undef MOVE_AB
#undef EACH_AB
    for (uint32_t i = 0; i < ad.n; i++) {
        free(dA[i]);
        free(dB[i]);
    }
    free(dA);
    free(dB);
    free(want[0]);
    free(want[1]);
    free(a0);
    free(kern0);
    train_adapter_release(&ad);
    g3_model_free(m);
    fx_batch_free(&b);
}

/* Keeping a layer's activations from the forward to the backward (g3_set_keep_budget)
 * instead of recomputing it gives the loss and every gradient bit for bit: no layer
 * kept, the first one only, and all of them (g3a, A8 on, 2 threads); the recompute phase
 * of the profile runs exactly when a layer is not kept. */
static void test_keep_budget_bit_identical(void) {
    g3_model *m = NULL;
    fx_batch b;
    CHECK(fx_model("grad_v3/g3a", &m) == 0);
    CHECK(fx_batch_load(fixture_path("grad_v3/g3a.batch.jsonl"), &b) == 0);
    if (!m || !b.B) {
        g3_model_free(m);
        return;
    }
    g3_set_fake_quant(m, 1);
    CHECK(g3_set_threads(m, 2) == 0);
    size_t one = 1; /* the smallest budget that keeps a layer */
    g3_set_keep_budget(m, 0);
    while (g3_kept_layers(m, b.T) == 0 && one < SIZE_MAX / 2) g3_set_keep_budget(m, one <<= 1);
    const uint32_t layers = g3_kept_layers(m, b.T);
    g3_set_keep_budget(m, G3_KEEP_DEFAULT);
    const uint32_t all = g3_kept_layers(m, b.T);
    CHECK_MSG(layers == 1 && all > 1, "budget %zu keeps %u layers, the default %u", one, layers, all);
    const size_t budgets[3] = {0, one, G3_KEEP_DEFAULT};
    const uint32_t want_kept[3] = {0, 1, all};
    uint64_t total = 0;
    for (uint32_t i = 0; i < g3_tensor_count(m); i++) total += g3_tensor_at(m, i)->numel;
    float *first = malloc(total * sizeof *first);
    double loss0 = 0;
    for (int k = 0; k < 3 && first; k++) {
        g3_set_keep_budget(m, budgets[k]);
        CHECK_EQ_INT((int)g3_kept_layers(m, b.T), (int)want_kept[k]);
        g3_profile_reset(m);
        double loss = 0;
        CHECK(g3_loss(m, b.ids, b.mask, b.B, b.T, 1, &loss) == 0);
        const double recomputed = g3_profile(m)[G3_PH_RECOMP];
        CHECK_MSG(k == 2 ? recomputed == 0 : recomputed > 0, "budget %zu: %g s recomputing", budgets[k],
                  recomputed);
        uint64_t off = 0, differ = 0;
        for (uint32_t i = 0; i < g3_tensor_count(m); i++) {
            const g3_tensor *t = g3_tensor_at(m, i);
            if (k == 0)
                memcpy(first + off, t->g, t->numel * sizeof *first);
            else
                differ += memcmp(first + off, t->g, t->numel * sizeof *first) != 0;
            off += t->numel;
        }
        if (k == 0) loss0 = loss;
        CHECK_MSG(loss == loss0 && differ == 0, "budget %zu: loss %.9g vs %.9g, %llu tensors differ", budgets[k],
                  loss, loss0, (unsigned long long)differ);
    }
    free(first);
    g3_model_free(m);
    fx_batch_free(&b);
}

static void test_float_gradients(void) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) check_float(MODELS[i]);
}

/* The low-rank route of the LoRA gradient (g3_set_low_rank): the q/k/v/gate/out kernels
 * take it and the step never writes their dW (a sentinel in g survives), other
 * tensors are refused it; dA / dB are bit for bit the same at 1 and 3 threads. Their
 * values against jax.grad: test_lora_cq_weights / test_lora_exact_finetune_loss. */
static void test_lora_low_rank_route(void) {
    g3_model *m;
    fx_batch b;
    train_adapter ad;
    if (!open_lora_case(&m, &b, &ad)) return;
    g3_set_fake_quant(m, 1);
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, G3_CQ_GROUP) == 0);
    float dummy = 0;
    CHECK(g3_set_low_rank(m, g3_find(m, "stack/mhc_phi_res"), &dummy, &dummy, 1, &dummy, &dummy) == 0);
    uint64_t n_ab = 0;
    for (uint32_t i = 0; i < ad.n; i++) n_ab += ad.lora[i].a.numel + ad.lora[i].b.numel;
    float **dA = calloc(ad.n, sizeof *dA), **dB = calloc(ad.n, sizeof *dB), *first = malloc(n_ab * sizeof *first);
    for (uint32_t i = 0; i < ad.n; i++) {
        dA[i] = calloc(ad.lora[i].a.numel, sizeof **dA);
        dB[i] = calloc(ad.lora[i].b.numel, sizeof **dB);
    }
    uint32_t routed = 0;
    for (int threads = 1; threads <= 3; threads += 2) {
        CHECK(g3_set_threads(m, threads) == 0);
        for (uint32_t i = 0; i < ad.n; i++) {
            g3_tensor *t = g3_find(m, ad.lora[i].path);
            for (uint64_t q = 0; q < t->numel; q++) t->g[q] = 12345.0f;
        }
        double loss = 0; /* g3_lora_loss: prepare, step, finish, and the base put back */
        CHECK_MSG(g3_lora_loss(m, &ad, &cb, b.ids, b.mask, b.B, b.T, &loss, dA, dB) == 0, "%s",
                  needle_last_error());
        routed = 0;
        for (uint32_t i = 0; i < ad.n; i++) {
            const g3_tensor *t = g3_find(m, ad.lora[i].path);
            uint64_t kept = 0;
            for (uint64_t q = 0; q < t->numel; q++) kept += t->g[q] == 12345.0f;
            routed += kept == t->numel;
        }
        uint64_t off = 0, differ = 0;
        for (uint32_t i = 0; i < ad.n; i++)
            for (int k = 0; k < 2; k++) {
                const uint64_t nn = k ? ad.lora[i].b.numel : ad.lora[i].a.numel;
                const float *g = k ? dB[i] : dA[i];
                if (threads == 1)
                    memcpy(first + off, g, nn * sizeof *g);
                else
                    differ += memcmp(first + off, g, nn * sizeof *g) != 0;
                off += nn;
            }
        CHECK_MSG(differ == 0, "%d threads: %llu adapter tensors differ from 1 thread", threads,
                  (unsigned long long)differ);
    }
    CHECK_MSG(routed == ad.n, "%u of %u adapted kernels took the low-rank route", routed, ad.n);
    for (uint32_t i = 0; i < ad.n; i++) {
        free(dA[i]);
        free(dB[i]);
    }
    free(dA);
    free(dB);
    free(first);
    train_adapter_release(&ad);
    g3_model_free(m);
    fx_batch_free(&b);
}

/* The token-range and column splits of the per-token loops (the Monarch MLP's, the norms',
 * the conv taps'; run_ranges in grad3.c) on a geometry wide and long enough that the splits
 * have several chunks (T 72 > 4 x 16 tokens, N 128 and q 144 > 64 columns): every gradient
 * and the loss bit for bit the same at 1, 2 and 3 threads, float and A8. Random weights,
 * every position in the loss. */
static void test_threads_bit_identical_wide(void) {
    static const char WIDE[] =
        "{\"vocab_size\": 96, \"out_vocab\": 80, \"d_model\": 128, \"num_heads\": 6, \"num_kv_heads\": 2,"
        " \"num_layers\": 2, \"qk_head_dim\": 24, \"v_head_dim\": 16, \"max_seq_len\": 128, \"rope_theta\": 10000.0,"
        " \"sliding_window\": 24, \"global_layers\": [1], \"qkv_conv_taps\": 3, \"mhc_lanes\": 2,"
        " \"engram_orders\": [2], \"engram_slots\": 17, \"engram_layers\": [0]}";
    export3_config cfg;
    g3_model *m = NULL;
    CHECK(export3_config_parse(WIDE, strlen(WIDE), &cfg) == 0 && g3_model_from_checkpoint(&cfg, NULL, &m) == 0);
    if (!m) return;
    uint64_t rng = 0x9E3779B97F4A7C15ull, total = 0;
    for (uint32_t i = 0; i < g3_tensor_count(m); i++) {
        g3_tensor *t = g3_tensor_at(m, i);
        for (uint64_t q = 0; q < t->numel; q++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            t->w[q] = ((float)((rng >> 40) & 0xFFFF) / 65536.0f - 0.5f) * 0.2f;
        }
        total += t->numel;
    }
    enum { B = 2, T = 72 };
    int32_t ids[B * T];
    float mask[B * T];
    for (int i = 0; i < B * T; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((rng >> 33) % 80);
        mask[i] = 1;
    }
    float *first = malloc(total * sizeof *first);
    for (int a8 = 0; a8 <= 1 && first; a8++) {
        g3_set_fake_quant(m, a8);
        double loss1 = 0;
        for (int threads = 1; threads <= 3; threads++) {
            CHECK(g3_set_threads(m, threads) == 0);
            double loss = 0;
            CHECK(g3_loss(m, ids, mask, B, T, 1, &loss) == 0);
            uint64_t off = 0, differ = 0, nonzero = 0;
            for (uint32_t i = 0; i < g3_tensor_count(m); i++) {
                const g3_tensor *t = g3_tensor_at(m, i);
                if (threads == 1)
                    memcpy(first + off, t->g, t->numel * sizeof *first);
                else
                    differ += memcmp(first + off, t->g, t->numel * sizeof *first) != 0;
                for (uint64_t q = 0; q < t->numel; q++) nonzero += t->g[q] != 0;
                off += t->numel;
            }
            if (threads == 1) loss1 = loss;
            CHECK_MSG(isfinite(loss) && nonzero > total / 2, "loss %g, %llu of %llu gradient values non-zero", loss,
                      (unsigned long long)nonzero, (unsigned long long)total);
            CHECK_MSG(loss == loss1 && differ == 0, "a8 %d, %d threads: loss %.9g vs %.9g, %llu tensors differ", a8,
                      threads, loss, loss1, (unsigned long long)differ);
        }
    }
    free(first);
    g3_model_free(m);
}

/* Every row runs only through its last loss target (train/dense_ref.h row_length): the same
 * batch with 19 more positions of random tokens under mask 0 gives the same loss and
 * gradients, bit for bit (float and A8). */
static void test_padding_never_runs(void) {
    g3_model *m = NULL;
    fx_batch b, padded = {0};
    CHECK(fx_model("grad_v3/g3a", &m) == 0);
    CHECK(fx_batch_load(fixture_path("grad_v3/g3a.batch.jsonl"), &b) == 0);
    if (!m || !b.B) {
        g3_model_free(m);
        return;
    }
    uint32_t vocab = 2; /* the out vocabulary: the embedding's rows */
    for (uint32_t i = 0; i < b.B * b.T; i++) vocab = (uint32_t)b.ids[i] + 1 > vocab ? (uint32_t)b.ids[i] + 1 : vocab;
    CHECK(fx_batch_pad(&b, 19, vocab, &padded) == 0);
    uint64_t total = 0;
    for (uint32_t i = 0; i < g3_tensor_count(m); i++) total += g3_tensor_at(m, i)->numel;
    float *first = malloc(total * sizeof *first);
    for (int a8 = 0; a8 < 2 && first; a8++) {
        g3_set_fake_quant(m, a8);
        double loss0 = 0, loss1 = 0;
        CHECK(g3_loss(m, b.ids, b.mask, b.B, b.T, 1, &loss0) == 0);
        uint64_t off = 0, differ = 0;
        for (uint32_t i = 0; i < g3_tensor_count(m); i++) {
            memcpy(first + off, g3_tensor_at(m, i)->g, g3_tensor_at(m, i)->numel * sizeof *first);
            off += g3_tensor_at(m, i)->numel;
        }
        CHECK(g3_loss(m, padded.ids, padded.mask, padded.B, padded.T, 1, &loss1) == 0);
        off = 0;
        for (uint32_t i = 0; i < g3_tensor_count(m); i++) {
            const g3_tensor *t = g3_tensor_at(m, i);
            differ += memcmp(first + off, t->g, t->numel * sizeof *first) != 0;
            off += t->numel;
        }
        CHECK_MSG(loss0 == loss1 && differ == 0, "a8 %d: loss %.9g padded %.9g, %llu tensors differ", a8, loss0,
                  loss1, (unsigned long long)differ);
    }
    free(first);
    g3_model_free(m);
    fx_batch_free(&b);
    fx_batch_free(&padded);
}

int main(void) {
    RUN(test_float_gradients);
    RUN(test_lora_cq_weights);
    RUN(test_lora_exact_finetune_loss);
    RUN(test_cli);
    RUN(test_threads_bit_identical);
    RUN(test_padding_never_runs);
    RUN(test_threads_bit_identical_wide);
    RUN(test_lora_prepared_steps);
    RUN(test_lora_low_rank_route);
    RUN(test_keep_budget_bit_identical);
    return test_summary();
}
