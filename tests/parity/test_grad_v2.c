/* Gradient parity of the Needle 2 training core (src/train/grad2.c, lora2.c) with jax.grad
 * of the official 2.0.15 code: tests/fixtures/grad_v2/ (tests/reference/make_grad_v2_fixtures.sh).
 * (a) the float base loss: the loss and the gradient of every checkpoint tensor. The
 * tolerance comes from the reference's own float32-vs-float64 distance written beside the
 * fixture (5x NAME.json floor_rel_l2_max_tensor), with a floor of 1e-4 for tensors whose gradient is
 * a sum of few terms. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/cact_base2.h"
#include "train/cact_base3.h"
#include "train/checkpoint.h"
#include "train/grad2.h"
#include "train/grad3.h"
#include "train/lora2.h"
#include "train/lora3.h"
#include "train_check.h"
#include "grad2_fixture.h"
#include "needle.h"
#include "util/fp16.h"

static const char *const MODELS[] = {"g2a", "g2b"};

/* NAME.json's number at key/sub */
static double info_number(const char *stem, const char *key, const char *sub) {
    char name[256];
    snprintf(name, sizeof name, "grad_v2/%.100s.json", stem);
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
    g2_model *m = NULL;
    snprintf(path, sizeof path, "grad_v2/%.100s", stem);
    CHECK_MSG(fx_model(path, &m) == 0, "%s: model: %s", stem, needle_last_error());
    fx_batch b;
    snprintf(path, sizeof path, "grad_v2/%.100s.batch.jsonl", stem);
    CHECK_MSG(fx_batch_load(fixture_path(path), &b) == 0, "%s: batch", stem);
    fx_file ref;
    snprintf(path, sizeof path, "grad_v2/%.100s.grad_float.safetensors", stem);
    CHECK_MSG(fx_open(path, &ref) == 0, "%s: reference gradients", stem);
    if (!m || !b.B || !ref.img) {
        g2_model_free(m);
        fx_batch_free(&b);
        fx_close(&ref);
        return;
    }
    double loss = 0;
    CHECK_MSG(g2_loss(m, b.ids, b.mask, b.B, b.T, 1, &loss) == 0, "%s: %s", stem, needle_last_error());
    const double want = atof(st_meta_get(&ref.st, "loss"));
    CHECK_MSG(fabs(loss - want) <= 1e-5 * fabs(want), "%s: loss %.9g, official %.9g", stem, loss, want);
    const double floor = info_number(stem, "floor_rel_l2_max_tensor", "float");
    CHECK_MSG(floor == floor && floor < 1e-2, "%s: no measured floor", stem);
    const double tol = fmax(1e-4, 5 * floor);
    double worst = 0;
    const char *worst_name = "";
    CHECK_EQ_INT(ref.st.n, m ? g2_tensor_count(m) : 0);
    for (uint32_t i = 0; i < ref.st.n; i++) {
        const st_tensor *r = &ref.st.tensors[i];
        g2_tensor *t = g2_find(m, r->name);
        CHECK_MSG(t && t->numel == r->numel, "%s: gradient %s missing or of another size", stem, r->name);
        if (!t || t->numel != r->numel) continue;
        const double d = fx_rel_l2(t->g, r, r->numel);
        CHECK_MSG(d <= tol, "%s: d/d %s: relative L2 %.3g > %.3g", stem, r->name, d, tol);
        if (d > worst) worst = d, worst_name = r->name;
    }
    printf("  %s float: loss %.9g (official %.9g), worst gradient %s at %.3g (tolerance %.3g)\n", stem, loss,
           want, worst_name, worst, tol);
    g2_model_free(m);
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
    g2_model *m = NULL;
    snprintf(path, sizeof path, "grad_v2/%.100s", stem);
    CHECK_MSG(fx_model(path, &m) == 0, "%s: model: %s", stem, needle_last_error());
    fx_batch b;
    snprintf(path, sizeof path, "grad_v2/%.100s.batch.jsonl", stem);
    CHECK(fx_batch_load(fixture_path(path), &b) == 0);
    train_adapter ad;
    snprintf(path, sizeof path, "grad_v2/%.100s.lora.safetensors", stem);
    const int ad_ok = train_adapter_read(fixture_path(path), &ad) == 0;
    CHECK_MSG(ad_ok, "%s: adapter: %s", stem, needle_last_error());
    if (!ad_ok) b.B = 0;
    fx_file ref;
    snprintf(path, sizeof path, "grad_v2/%.100s.grad_%s.safetensors", stem, a8 ? "quant" : "cqw");
    CHECK(fx_open(path, &ref) == 0);
    if (m) g2_set_fake_quant(m, a8);
    /* the exact loss on 2 threads (the CQ of the merged weights and the products shared
     * among them), the CQ-only one on 1 */
    if (m) CHECK(g2_set_threads(m, a8 ? 2 : 1) == 0);
    if (!m || !b.B || !ref.img) {
        g2_model_free(m);
        fx_batch_free(&b);
        fx_close(&ref);
        return;
    }
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, G2_CQ_GROUP) == 0);
    float **dA = calloc(ad.n, sizeof *dA), **dB = calloc(ad.n, sizeof *dB);
    for (uint32_t i = 0; i < ad.n; i++) {
        dA[i] = calloc(ad.lora[i].a.numel, sizeof **dA);
        dB[i] = calloc(ad.lora[i].b.numel, sizeof **dB);
    }
    double loss = 0;
    CHECK_MSG(g2_lora_loss(m, &ad, &cb, b.ids, b.mask, b.B, b.T, &loss, dA, dB) == 0, "%s: %s", stem,
              needle_last_error());
    const double want = atof(st_meta_get(&ref.st, "loss"));
    CHECK_MSG(fabs(loss - want) <= (a8 ? 1e-4 : 1e-5) * fabs(want), "%s: %s loss %.9g, official %.9g", stem,
              a8 ? "quant" : "cqw", loss, want);
    const double floor = info_number(stem, a8 ? "floor_rel_l2" : "floor_rel_l2_max_tensor", a8 ? "quant" : "cqw");
    /* the reference's own float32-vs-float64 distance of the exact loss is 2e-5 (g2a) and
     * 5e-7 (g2b) here (NAME.json): held to 5x that, at least 2e-4 */
    const double tol = a8 ? fmax(2e-4, 5 * floor) : fmax(1e-4, 5 * floor);
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
    g2_model_free(m);
    fx_batch_free(&b);
    fx_close(&ref);
}

static void test_lora_cq_weights(void) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) check_lora(MODELS[i], 0);
}

static void test_lora_exact_finetune_loss(void) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) check_lora(MODELS[i], 1);
}

/* the gradients file of `needle grad` against a reference fixture: same tensors, each
 * within tol (relative L2), and the loss */
static void check_grad_file(const char *gpath, const char *ref_name, double tol) {
    fx_file got, ref;
    size_t size = 0;
    memset(&got, 0, sizeof got);
    got.img = read_file(gpath, &size);
    CHECK(got.img && st_parse(got.img, size, &got.st) == 0);
    CHECK(fx_open(ref_name, &ref) == 0);
    if (got.img && ref.img) {
        CHECK_EQ_INT(got.st.n, ref.st.n);
        const double lg = atof(st_meta_get(&got.st, "loss")), lr = atof(st_meta_get(&ref.st, "loss"));
        CHECK_MSG(fabs(lg - lr) <= 1e-4 * fabs(lr), "%s: loss %.9g vs %.9g", ref_name, lg, lr);
        for (uint32_t i = 0; i < ref.st.n; i++) {
            const st_tensor *r = &ref.st.tensors[i], *g = st_find(&got.st, r->name);
            CHECK_MSG(g && g->numel == r->numel, "needle grad: no %s", r->name);
            if (!g || g->numel != r->numel) continue;
            float *v = malloc(g->numel * sizeof *v);
            for (uint64_t q = 0; q < g->numel; q++) v[q] = st_get(g, q);
            const double d = fx_rel_l2(v, r, r->numel);
            CHECK_MSG(d < tol, "needle grad vs %s: %s at %.3g", ref_name, r->name, d);
            free(v);
        }
    }
    fx_close(&got);
    fx_close(&ref);
}

/* needle grad end to end on a Needle 2 checkpoint (--config): the float gradients and the
 * --lora --quant (exact fine-tuning loss) gradients files against the fixtures, then bad
 * input refused with a clear message and status 2 / 1 */
static void test_cli(void) {
    const char *dir = train_tmpdir();
    char cmd[4096], out[4096], gpath[1024];
    snprintf(gpath, sizeof gpath, "%s/g.safetensors", dir);
    snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s --config %s --batch %s --out %s --json", cli_path(),
             fixture_path("grad_v2/g2a.params.safetensors"), fixture_path("grad_v2/g2a.config.json"),
             fixture_path("grad_v2/g2a.batch.jsonl"), gpath);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "\"loss\": ") != NULL, "--json: %s", out);
    check_grad_file(gpath, "grad_v2/g2a.grad_float.safetensors", 1e-3);
    snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s --config %s --lora %s --quant --batch %s --out %s",
             cli_path(), fixture_path("grad_v2/g2a.params.safetensors"), fixture_path("grad_v2/g2a.config.json"),
             fixture_path("grad_v2/g2a.lora.safetensors"), fixture_path("grad_v2/g2a.batch.jsonl"), gpath);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
    check_grad_file(gpath, "grad_v2/g2a.grad_quant.safetensors", 1e-2);
    /* bad input: a Needle 2 checkpoint without its config, another model's config, a
     * token outside the vocabulary, a missing config file */
    char bad[1100];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", dir);
    FILE *f = fopen(bad, "w");
    fputs("{\"ids\": [1, 99999, 3], \"mask\": [0, 1, 1]}\n", f);
    fclose(f);
    struct {
        const char *config, *batch;
        int rc;
        const char *says;
        const char *checkpoint;
    } cases[] = {
        {NULL, "grad_v2/g2a.batch.jsonl", 1, "--config", NULL},
        {"grad_v2/g2b.config.json", "grad_v2/g2a.batch.jsonl", 1, "shape", NULL},
        {"grad_v2/g2a.config.json", NULL, 1, "vocabulary", NULL},
        {"grad_v2/none.json", "grad_v2/g2a.batch.jsonl", 1, "none.json", NULL},
        /* a Needle 3 checkpoint given a Needle 2 config */
        {"grad_v2/g2a.config.json", "grad_v2/g2a.batch.jsonl", 1, "Needle 3 checkpoint",
         "grad_v3/g3a.params.safetensors"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char cfg[1200] = "";
        if (cases[c].config) snprintf(cfg, sizeof cfg, "--config %s", fixture_path(cases[c].config));
        snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s %s --batch %s --out %s 2>&1", cli_path(),
                 fixture_path(cases[c].checkpoint ? cases[c].checkpoint : "grad_v2/g2a.params.safetensors"), cfg,
                 cases[c].batch ? fixture_path(cases[c].batch) : bad, gpath);
        out[0] = 0;
        CHECK_MSG(run_command(cmd, out, sizeof out) == cases[c].rc, "bad case %zu: %s", c, out);
        CHECK_MSG(strstr(out, cases[c].says) != NULL, "bad case %zu says %s", c, out);
    }
    /* a Needle 3 config (qk_head_dim) given with --config */
    char v3cfg[1100];
    snprintf(v3cfg, sizeof v3cfg, "%s/v3.json", dir);
    f = fopen(v3cfg, "w");
    if (f) {
        fputs("{\"vocab_size\": 64, \"d_model\": 40, \"qk_head_dim\": 8}\n", f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s --config %s --batch %s --out %s 2>&1", cli_path(),
             fixture_path("grad_v2/g2a.params.safetensors"), v3cfg, fixture_path("grad_v2/g2a.batch.jsonl"), gpath);
    out[0] = 0;
    CHECK_MSG(run_command(cmd, out, sizeof out) == 1 && strstr(out, "Needle 3 config"), "v3 config: %s", out);
    train_tmpdir_remove(dir);
}

/* --weights: g2a exported by `needle export --bits 4` and read back as a training base.
 * Every CQ record dequantizes to exactly the CQ W4 of the checkpoint tensor (g2_cq_weights,
 * our byte-exact quantizer: the runtime's reader gives the quantizer's values), every FP16
 * record to the checkpoint value rounded to half; then `needle grad --weights` runs end to
 * end, and a Needle 3 .cact or a non-.cact is refused with a message. */
static void test_cact_base(void) {
    const char *dir = train_tmpdir();
    char cmd[4096], out[4096], cact[1024], gpath[1024];
    snprintf(cact, sizeof cact, "%s/g2a.cact", dir);
    snprintf(gpath, sizeof gpath, "%s/g.safetensors", dir);
    snprintf(cmd, sizeof cmd, "%s export %s --config %s --bits 4 -o %s >/dev/null", cli_path(),
             fixture_path("grad_v2/g2a.params.safetensors"), fixture_path("grad_v2/g2a.config.json"), cact);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
    size_t size = 0;
    uint8_t *img = read_file(cact, &size);
    g2_model *fromc = NULL, *ref = NULL;
    export_config cfg;
    CHECK_MSG(img && g2_model_from_cact(img, size, &cfg, &fromc) == 0, "%s", needle_last_error());
    CHECK(fx_model("grad_v2/g2a", &ref) == 0);
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, G2_CQ_GROUP) == 0);
    if (fromc && ref) {
        CHECK_EQ_INT(cfg.num_layers, 3);
        CHECK_EQ_INT(cfg.attn_dim, 32);
        CHECK(g2_cq_weights(ref, &cb) == 0);
        uint32_t cq = 0, half = 0;
        double worst_cq = 0;
        for (uint32_t i = 0; i < g2_tensor_count(ref); i++) {
            const g2_tensor *r = g2_tensor_at(ref, i), *c = g2_find(fromc, r->name);
            CHECK_MSG(c && c->numel == r->numel, "%s missing", r->name);
            if (!c || c->numel != r->numel) continue;
            const int is_cq = r->ndim >= 2 && (strstr(r->name, "kernel") || strstr(r->name, "embedding") ||
                                               strstr(r->name, "mhc_phi"));
            /* the runtime's reader rotates back with a fast Walsh transform, the
             * quantizer with its matrix: the same values up to float rounding */
            double worst = 0, big = 0;
            for (uint64_t k = 0; k < r->numel; k++) {
                const float want = is_cq ? r->w[k] : fp16_to_f32(f32_to_fp16(r->w[k]));
                worst = fmax(worst, fabs((double)want - c->w[k]));
                big = fmax(big, fabs((double)want));
            }
            CHECK_MSG(is_cq ? worst <= 1e-6 * big : worst == 0, "%s: differs from the %s by %.3g (of %.3g)",
                      r->name, is_cq ? "CQ W4 of the checkpoint" : "checkpoint in half precision", worst, big);
            if (is_cq) worst_cq = fmax(worst_cq, worst / big);
            is_cq ? cq++ : half++;
        }
        printf("  g2a.cact: %u CQ tensors within %.3g (relative to their largest value) of the checkpoint's "
               "CQ W4, %u half tensors equal to its half rounding\n", cq, worst_cq, half);
    }
    g2_model_free(fromc);
    g2_model_free(ref);
    free(img);
    /* end to end: the loss over the .cact equals the one over the checkpoint with its
     * weights quantized up to the half rounding of the small tensors */
    snprintf(cmd, sizeof cmd, "%s grad --weights %s --lora %s --batch %s --out %s --json", cli_path(), cact,
             fixture_path("grad_v2/g2a.lora.safetensors"), fixture_path("grad_v2/g2a.batch.jsonl"), gpath);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    const char *at = strstr(out, "\"loss\": ");
    const double lw = at ? atof(at + 8) : 0;
    snprintf(cmd, sizeof cmd, "%s grad --checkpoint %s --config %s --lora %s --quant-weights --batch %s --out %s --json",
             cli_path(), fixture_path("grad_v2/g2a.params.safetensors"), fixture_path("grad_v2/g2a.config.json"),
             fixture_path("grad_v2/g2a.lora.safetensors"), fixture_path("grad_v2/g2a.batch.jsonl"), gpath);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    at = strstr(out, "\"loss\": ");
    const double lc = at ? atof(at + 8) : 0;
    CHECK_MSG(lw > 0 && fabs(lw - lc) < 1e-3 * lc, "--weights loss %.9g, --checkpoint --quant-weights %.9g", lw, lc);
    /* refused: not a .cact, a cut .cact, --config with --weights (a usage error) */
    char cut[1100];
    snprintf(cut, sizeof cut, "%s/cut.cact", dir);
    img = read_file(cact, &size);
    FILE *f = fopen(cut, "wb");
    if (f && img) fwrite(img, 1, size / 2, f);
    if (f) fclose(f);
    free(img);
    const char *refuse[][3] = {{fixture_path("grad_v2/g2a.params.safetensors"), "", "not a .cact"},
                               {cut, "", cut},
                               {cact, "--config x.json", "--config"}};
    const int refuse_rc[] = {1, 1, 2};
    for (int c = 0; c < 3; c++) {
        snprintf(cmd, sizeof cmd, "%s grad --weights %s %s --batch %s --out %s 2>&1", cli_path(), refuse[c][0],
                 refuse[c][1], fixture_path("grad_v2/g2a.batch.jsonl"), gpath);
        out[0] = 0;
        CHECK_MSG(run_command(cmd, out, sizeof out) == refuse_rc[c] && strstr(out, refuse[c][2]),
                  "--weights case %d: %s", c, out);
    }
    train_tmpdir_remove(dir);
}

/* --weights with a Needle 3 .cact: g3a (tests/fixtures/grad_v3) exported by `needle export
 * --v3 --bits 4` and read back: CQ records equal to the checkpoint's CQ W4 up to float
 * rounding, FP16 records to its half rounding; `needle grad --weights` runs on it. */
static void test_cact_base_v3(void) {
    const char *dir = train_tmpdir();
    char cmd[4096], out[4096], cact[1024], cfgp[1024], gpath[1024];
    snprintf(cact, sizeof cact, "%s/g3a.cact", dir);
    snprintf(cfgp, sizeof cfgp, "%s/g3a.config.json", dir);
    snprintf(gpath, sizeof gpath, "%s/g.safetensors", dir);
    fx_file ck;
    CHECK(fx_open("grad_v3/g3a.params.safetensors", &ck) == 0);
    const char *cj = ck.img ? st_meta_get(&ck.st, "config") : NULL;
    CHECK(cj != NULL);
    FILE *f = fopen(cfgp, "w");
    if (f && cj) fputs(cj, f);
    if (f) fclose(f);
    export3_config cfg3;
    CHECK(cj && export3_config_parse(cj, strlen(cj), &cfg3) == 0);
    g3_model *ref = NULL, *fromc = NULL;
    CHECK(cj && g3_model_from_checkpoint(&cfg3, &ck.st, &ref) == 0);
    fx_close(&ck);
    snprintf(cmd, sizeof cmd, "%s export --v3 %s --config %s --bits 4 -o %s >/dev/null", cli_path(),
             fixture_path("grad_v3/g3a.params.safetensors"), cfgp, cact);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
    size_t size = 0;
    uint8_t *img = read_file(cact, &size);
    CHECK(img && cact_base_generation(img, size) == 3);
    CHECK_MSG(img && g3_model_from_cact(img, size, NULL, &fromc) == 0, "%s", needle_last_error());
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, G3_CQ_GROUP) == 0);
    if (ref && fromc) {
        CHECK(g3_cq_weights(ref, &cb) == 0);
        uint32_t cq = 0, half = 0;
        double worst_cq = 0;
        for (uint32_t i = 0; i < g3_tensor_count(ref); i++) {
            const g3_tensor *r = g3_tensor_at(ref, i), *c = g3_find(fromc, r->name);
            CHECK_MSG(c && c->numel == r->numel, "%s missing", r->name);
            if (!c || c->numel != r->numel || !r->numel) continue;
            const char *last = strrchr(r->name, '/');
            last = last ? last + 1 : r->name;
            const int is_cq = r->ndim >= 2 && (!strcmp(last, "kernel") || !strcmp(last, "embedding") ||
                                               !strncmp(last, "mhc_phi", 7));
            double worst = 0, big = 0;
            for (uint64_t k = 0; k < r->numel; k++) {
                const float want = is_cq ? r->w[k] : fp16_to_f32(f32_to_fp16(r->w[k]));
                worst = fmax(worst, fabs((double)want - c->w[k]));
                big = fmax(big, fabs((double)want));
            }
            CHECK_MSG(is_cq ? worst <= 1e-6 * big : worst == 0, "%s: differs from the %s by %.3g (of %.3g)",
                      r->name, is_cq ? "CQ W4 of the checkpoint" : "checkpoint in half precision", worst, big);
            if (is_cq) worst_cq = fmax(worst_cq, worst / big);
            is_cq ? cq++ : half++;
        }
        printf("  g3a.cact: %u CQ tensors within %.3g (relative) of the checkpoint's CQ W4, %u half tensors equal "
               "to its half rounding\n", cq, worst_cq, half);
    }
    g3_model_free(ref);
    g3_model_free(fromc);
    free(img);
    snprintf(cmd, sizeof cmd, "%s grad --weights %s --lora %s --quant --batch %s --out %s --json", cli_path(), cact,
             fixture_path("grad_v3/g3a.lora.safetensors"), fixture_path("grad_v3/g3a.batch.jsonl"), gpath);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "\"tensors\": ") != NULL, "%s", out);
    train_tmpdir_remove(dir);
}

/* the loss and every gradient bit-identical with 1, 2 and 3 threads (g2a, A8 forward on
 * so the rounding-sensitive path is covered too) */
static void test_threads_bit_identical(void) {
    g2_model *m = NULL;
    fx_batch b;
    CHECK(fx_model("grad_v2/g2a", &m) == 0);
    CHECK(fx_batch_load(fixture_path("grad_v2/g2a.batch.jsonl"), &b) == 0);
    if (!m || !b.B) {
        g2_model_free(m);
        return;
    }
    g2_set_fake_quant(m, 1);
    uint64_t total = 0;
    for (uint32_t i = 0; i < g2_tensor_count(m); i++) total += g2_tensor_at(m, i)->numel;
    float *first = malloc(total * sizeof *first);
    double loss1 = 0;
    for (int threads = 1; threads <= 3; threads++) {
        CHECK(g2_set_threads(m, threads) == 0);
        double loss = 0;
        CHECK(g2_loss(m, b.ids, b.mask, b.B, b.T, 1, &loss) == 0);
        uint64_t off = 0, differ = 0;
        for (uint32_t i = 0; i < g2_tensor_count(m); i++) {
            const g2_tensor *t = g2_tensor_at(m, i);
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
    g2_model_free(m);
    fx_batch_free(&b);
}

/* The prepared LoRA run (g2_lora_prepare / g2_lora_step / g2_lora_finish: the frozen CQ
 * leaves quantized once, the work space kept) gives bit for bit what g2_lora_loss gives on
 * the original base, over two steps with the adapter changed between them; finish puts
 * the adapted kernels back; an adapter path the model lacks is refused. */
static void test_lora_prepared_steps(void) {
    g2_model *m = NULL;
    fx_batch b;
    train_adapter ad;
    CHECK(fx_model("grad_v2/g2a", &m) == 0);
    CHECK(fx_batch_load(fixture_path("grad_v2/g2a.batch.jsonl"), &b) == 0);
    const int ad_ok = train_adapter_read(fixture_path("grad_v2/g2a.lora.safetensors"), &ad) == 0;
    CHECK(ad_ok);
    if (!m || !b.B || !ad_ok) {
        g2_model_free(m);
        return;
    }
    g2_set_fake_quant(m, 1);
    CHECK(g2_set_threads(m, 2) == 0);
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, G2_CQ_GROUP) == 0);
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
    const g2_tensor *k0 = g2_find(m, ad.lora[0].path);
    float *kern0 = malloc(k0->numel * sizeof *kern0);
    memcpy(kern0, k0->w, k0->numel * sizeof *kern0);
    const g2_tensor *emb = g2_find(m, "embedding/embedding");
    float *emb0 = malloc(emb->numel * sizeof *emb0);
    memcpy(emb0, emb->w, emb->numel * sizeof *emb0);
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
        CHECK(g2_lora_loss(m, &ad, &cb, b.ids, b.mask, b.B, b.T, &want_loss[step], dA, dB) == 0);
        EACH_AB(memcpy(want[step] + off_, g, t->numel * sizeof(float)));
    }
    /* g2_lora_loss leaves the base as it was (its CQ leaves included) */
    CHECK(memcmp(emb0, emb->w, emb->numel * sizeof *emb0) == 0);
    CHECK(memcmp(kern0, k0->w, k0->numel * sizeof *kern0) == 0);
    EACH_AB(memcpy(t->data, a0 + off_, t->numel * sizeof(float)));
    g2_lora_prep *p = NULL;
    CHECK_MSG(g2_lora_prepare(m, &ad, &cb, &p) == 0, "prepare: %s", needle_last_error());
    for (int step = 0; step < 2 && p; step++) {
        if (step) MOVE_AB();
        double loss = 0;
        CHECK(g2_lora_step(p, &ad, b.ids, b.mask, b.B, b.T, &loss, dA, dB) == 0);
        uint64_t differ = 0;
        EACH_AB(differ += memcmp(want[step] + off_, g, t->numel * sizeof(float)) != 0);
        CHECK_MSG(loss == want_loss[step] && differ == 0, "step %d: loss %.9g vs %.9g, %llu tensors differ", step,
                  loss, want_loss[step], (unsigned long long)differ);
    }
    g2_lora_finish(p);
    CHECK_MSG(memcmp(kern0, k0->w, k0->numel * sizeof *kern0) == 0, "finish did not put %s back", k0->name);
    for (uint32_t i = 0; i < g2_tensor_count(m); i++) CHECK(!g2_tensor_at(m, i)->frozen);
    /* bad input: a path the model does not have, an adapter that is not the prepared one */
    char *path0 = ad.lora[0].path;
    ad.lora[0].path = (char *)"stack/layers/block/self_attn/nope/kernel";
    p = NULL;
    CHECK(g2_lora_prepare(m, &ad, &cb, &p) == NEEDLE_ERR_INVALID_ARGUMENT && p == NULL);
    CHECK(strstr(needle_last_error(), "nope") != NULL);
    ad.lora[0].path = path0;
    for (uint32_t i = 0; i < g2_tensor_count(m); i++) CHECK(!g2_tensor_at(m, i)->frozen);
    CHECK(g2_lora_prepare(m, &ad, NULL, &p) == 0 && p != NULL);
    if (p) {
        train_adapter fewer = ad;
        fewer.n = ad.n - 1;
        double loss = 0;
        CHECK(g2_lora_step(p, &fewer, b.ids, b.mask, b.B, b.T, &loss, dA, dB) == NEEDLE_ERR_INVALID_ARGUMENT);
        g2_lora_finish(p);
    }
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
    free(emb0);
    train_adapter_release(&ad);
    g2_model_free(m);
    fx_batch_free(&b);
}

static void test_float_gradients(void) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) check_float(MODELS[i]);
}

/* Every row runs only through its last loss target (train/dense_ref.h row_length): the same
 * batch with 19 more positions of random tokens under mask 0 gives the same loss and
 * gradients, bit for bit (float and A8). */
static void test_padding_never_runs(void) {
    g2_model *m = NULL;
    fx_batch b, padded = {0};
    CHECK(fx_model("grad_v2/g2a", &m) == 0);
    CHECK(fx_batch_load(fixture_path("grad_v2/g2a.batch.jsonl"), &b) == 0);
    if (!m || !b.B) {
        g2_model_free(m);
        return;
    }
    uint32_t vocab = 2; /* the out vocabulary: the embedding's rows */
    for (uint32_t i = 0; i < b.B * b.T; i++) vocab = (uint32_t)b.ids[i] + 1 > vocab ? (uint32_t)b.ids[i] + 1 : vocab;
    CHECK(fx_batch_pad(&b, 19, vocab, &padded) == 0);
    uint64_t total = 0;
    for (uint32_t i = 0; i < g2_tensor_count(m); i++) total += g2_tensor_at(m, i)->numel;
    float *first = malloc(total * sizeof *first);
    for (int a8 = 0; a8 < 2 && first; a8++) {
        g2_set_fake_quant(m, a8);
        double loss0 = 0, loss1 = 0;
        CHECK(g2_loss(m, b.ids, b.mask, b.B, b.T, 1, &loss0) == 0);
        uint64_t off = 0, differ = 0;
        for (uint32_t i = 0; i < g2_tensor_count(m); i++) {
            memcpy(first + off, g2_tensor_at(m, i)->g, g2_tensor_at(m, i)->numel * sizeof *first);
            off += g2_tensor_at(m, i)->numel;
        }
        CHECK(g2_loss(m, padded.ids, padded.mask, padded.B, padded.T, 1, &loss1) == 0);
        off = 0;
        for (uint32_t i = 0; i < g2_tensor_count(m); i++) {
            const g2_tensor *t = g2_tensor_at(m, i);
            differ += memcmp(first + off, t->g, t->numel * sizeof *first) != 0;
            off += t->numel;
        }
        CHECK_MSG(loss0 == loss1 && differ == 0, "a8 %d: loss %.9g padded %.9g, %llu tensors differ", a8, loss0,
                  loss1, (unsigned long long)differ);
    }
    free(first);
    g2_model_free(m);
    fx_batch_free(&b);
    fx_batch_free(&padded);
}

int main(void) {
    RUN(test_float_gradients);
    RUN(test_lora_cq_weights);
    RUN(test_lora_exact_finetune_loss);
    RUN(test_cli);
    RUN(test_cact_base);
    RUN(test_cact_base_v3);
    RUN(test_threads_bit_identical);
    RUN(test_padding_never_runs);
    RUN(test_lora_prepared_steps);
    return test_summary();
}
