/* A .cact as a training base (train/cact_base.h): the tiny v3 fixtures dequantized into
 * official checkpoints, run by the training core (grad3), give per position the
 * cross-entropy the engine's own forward on the .cact gives (needle_session_eval logits):
 * the dequantization puts every record back where the network reads it. Also: the probe
 * heads come back, the rebuilt config matches the header, and Needle 2 / bad files are
 * refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "export/export_model_v3.h"
#include "format/cact.h"
#include "harness.h"
#include "needle.h"
#include "train/cact_base.h"
#include "train/checkpoint.h"
#include "train/grad3.h"

/* the engine's logits for ids[0..T) -> cross-entropy of ids[t+1] at t, t < T-1 */
static int engine_ce(const char *path, const int32_t *ids, uint32_t T, double *ce) {
    needle_model *m = NULL;
    needle_session *s = NULL;
    if (needle_model_open(path, NULL, &m)) return -1;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    const uint32_t V = info.vocab, OV = info.out_vocab ? info.out_vocab : info.vocab;
    float *logits = malloc((size_t)T * V * sizeof *logits);
    int rc = -1;
    if (logits && !needle_session_create(m, NULL, &s) &&
        !needle_session_eval(s, ids, T, logits, (size_t)T * V)) {
        for (uint32_t t = 0; t + 1 < T; t++) {
            const float *row = logits + (size_t)t * V;
            double mx = -INFINITY, sum = 0;
            for (uint32_t v = 0; v < OV; v++) mx = row[v] > mx ? row[v] : mx;
            for (uint32_t v = 0; v < OV; v++) sum += exp(row[v] - mx);
            ce[t] = mx + log(sum) - row[ids[t + 1]];
        }
        rc = 0;
    }
    free(logits);
    needle_session_free(s);
    needle_model_free(m);
    return rc;
}

static void check_file(const char *name, int want_heads) {
    const char *path = fixture_path(name);
    size_t size;
    uint8_t *img = read_file(path, &size);
    cact_file f;
    CHECK(img && cact_parse(img, size, &f) == 0);
    if (!img) return;
    train_checkpoint ck;
    const int st = train_checkpoint_from_cact(&f, &ck);
    CHECK_MSG(st == 0, "%s: %s", name, needle_last_error());
    if (st) {
        cact_release(&f);
        free(img);
        return;
    }
    CHECK((train_checkpoint_find(&ck, "confidence_head/proj/kernel") != NULL) == want_heads);
    /* the config the header describes */
    export3_config cfg;
    CHECK(export3_config_parse(ck.config, strlen(ck.config), &cfg) == 0);
    CHECK_EQ_INT(cfg.num_layers, f.h3.num_layers);
    CHECK_EQ_INT(cfg.out_vocab, f.h3.out_vocab);
    CHECK_EQ_INT(cfg.num_sites, f.h3.num_engram_sites);
    CHECK_EQ_INT(export3_effective_kv_window(&cfg), f.h3.kv_window);
    /* through a file, as `needle finetune -w` uses it */
    char tmp[256];
    snprintf(tmp, sizeof tmp, "/tmp/needle_cact_base_%d.safetensors", (int)getpid());
    CHECK(train_checkpoint_write(tmp, &ck) == 0);
    size_t ck_size;
    uint8_t *ck_img = read_file(tmp, &ck_size);
    remove(tmp);
    st_file stf;
    CHECK(ck_img && st_parse(ck_img, ck_size, &stf) == 0);
    g3_model *m = NULL;
    CHECK_MSG(g3_model_from_checkpoint(&cfg, &stf, &m) == 0, "%s", needle_last_error());
    /* a sequence of output tokens past the sliding window */
    enum { T = 40 };
    int32_t ids[T];
    const uint32_t ov = cfg.out_vocab ? cfg.out_vocab : cfg.vocab_size;
    for (uint32_t t = 0; t < T; t++) ids[t] = (int32_t)((t * 37u + 11u) % ov);
    double ce_engine[T], worst[2] = {0, 0};
    CHECK(engine_ce(path, ids, T, ce_engine) == 0);
    for (int quant = 0; m && quant < 2; quant++) {
        g3_set_fake_quant(m, quant);
        for (uint32_t t = 0; t + 1 < T; t++) {
            float mask[T] = {0};
            mask[t + 1] = 1;
            double loss = 0;
            CHECK(g3_loss(m, ids, mask, 1, T, 0, &loss) == 0);
            const double d = fabs(loss - ce_engine[t]) / fmax(1.0, fabs(ce_engine[t]));
            worst[quant] = d > worst[quant] ? d : worst[quant];
        }
    }
    printf("  %s: worst relative CE difference vs the engine: float %.2e, A8 %.2e\n", name,
           worst[0], worst[1]);
    /* the engine's session runs float activations and an f32 KV cache: the float forward
     * over the dequantized weights is the engine's to float rounding (measured 5e-7); the
     * A8 forward (the fine-tuning numerics) differs by its activation rounding only */
    CHECK_MSG(worst[0] < 1e-5, "%s: float forward off the engine by %g", name, worst[0]);
    CHECK_MSG(worst[1] < 5e-2, "%s: A8 forward off the engine by %g", name, worst[1]);
    g3_model_free(m);
    st_release(&stf);
    free(ck_img);
    train_checkpoint_release(&ck);
    cact_release(&f);
    free(img);
}

static void test_engine_parity(void) {
    check_file("v3/v3a.cact",
               1); /* probe heads, 3 engram sites, 2-bit kernels, out_vocab < vocab */
    check_file("v3/v3b.cact", 0); /* 4 lanes, seed heads, 3 engram orders */
    check_file("v3/v3d.cact", 0);
}

static void test_refusals(void) {
    size_t size;
    uint8_t *img = read_file(fixture_path("tiny_cq4.cact"), &size);
    cact_file f;
    CHECK(img && cact_parse(img, size, &f) == 0);
    train_checkpoint ck;
    CHECK(train_checkpoint_from_cact(&f, &ck) == NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(strstr(needle_last_error(), "Needle 3") != NULL);
    cact_release(&f);
    free(img);
}

int main(void) {
    RUN(test_engine_parity);
    RUN(test_refusals);
    return test_summary();
}
