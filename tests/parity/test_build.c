/* `needle build` against the official cactus-needle 3.2.8 build: tests/fixtures/build/
 * (tests/reference/make_build_fixtures.py) holds a random checkpoint and adapter in the
 * official formats, an adapter the official `needle finetune` trained, and the SHA-256 of
 * what the official build wrote for each case (an adapter merged, a ladder rung, both,
 * and the two cases that copy the base archive);
 * our build of the same inputs must be the same bytes. Then the refusals: each a clear
 * message and a non-zero status, nothing written. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "sha256.h"
#include "train/checkpoint.h"
#include "train/lora_merge.h"
#include "train_check.h"

static char tmpdir[64];

static int run_build(const char *args, const char *out_name, char *out, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' build -w v3/v3c.cact %s -o '%s/%s' 2>&1", fixture_dir(), cli_path(),
             args, tmpdir, out_name);
    return run_command(cmd, out, cap);
}

static void test_official_cases(void) {
    size_t n;
    char *text = (char *)read_file(fixture_path("build/manifest.json"), &n);
    cJSON *m = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(m, "cases");
    CHECK(cJSON_GetArraySize(cases) == 6);
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *layers = cJSON_GetObjectItemCaseSensitive(c, "layers");
        char args[512], out[4096], path[256], hex[65];
        /* "lora": true for the random adapter, or the file of another (finetuned.safetensors:
         * trained by the official `needle finetune`) */
        const cJSON *lora = cJSON_GetObjectItemCaseSensitive(c, "lora");
        const char *adapter = cJSON_IsString(lora) ? lora->valuestring : cJSON_IsTrue(lora) ? "lora.safetensors" : NULL;
        snprintf(args, sizeof args, "build/ckpt.safetensors");
        if (adapter) snprintf(args + strlen(args), sizeof args - strlen(args), " --lora build/%s", adapter);
        if (cJSON_IsNumber(layers))
            snprintf(args + strlen(args), sizeof args - strlen(args), " --layers %d", layers->valueint);
        snprintf(path, sizeof path, "%s.cact", c->string);
        const int rc = run_build(args, path, out, sizeof out);
        CHECK_MSG(rc == 0, "%s: exit %d: %s", c->string, rc, out);
        snprintf(path, sizeof path, "%s/%s.cact", tmpdir, c->string);
        uint8_t *data = read_file(path, &n);
        CHECK_MSG(data != NULL, "%s: nothing written", c->string);
        if (!data) continue;
        sha256_hex(data, n, hex);
        free(data);
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "sha256"));
        CHECK_MSG(want && !strcmp(hex, want), "%s: %zu bytes, sha256 %s, the official build's %s", c->string, n, hex,
                  want ? want : "?");
        if (adapter)
            CHECK_MSG(strstr(out, "dropped") != NULL, "%s: the confidence head drop is not reported: %s", c->string, out);
    }
    cJSON_Delete(m);
}

/* every width class of the merge's summation (1, 2 and 4 accumulators, a tail chain)
 * against a float64 reference: within rounding, and exactly the accumulator order */
static void test_matmul_orders(void) {
    enum { IN = 3, R = 6 };
    static const uint64_t widths[] = {64, 32, 48};
    for (size_t w = 0; w < 3; w++) {
        const uint64_t out = widths[w];
        float a[IN * R], *b = malloc(R * out * sizeof *b), *got = malloc(IN * out * sizeof *got);
        for (int i = 0; i < IN * R; i++) a[i] = (float)((i * 37 % 19) - 9) / 7.0f;
        for (uint64_t i = 0; i < R * out; i++) b[i] = (float)((int)(i * 53 % 23) - 11) / 13.0f;
        lora_matmul(a, b, 1, IN, R, out, got);
        for (int i = 0; i < IN; i++)
            for (uint64_t j = 0; j < out; j++) {
                double ref = 0;
                for (int k = 0; k < R; k++) ref += (double)a[i * R + k] * b[k * out + j];
                CHECK_MSG(got[i * out + j] - ref < 1e-5 && ref - got[i * out + j] < 1e-5, "width %llu: %g vs %g",
                          (unsigned long long)out, got[i * out + j], ref);
            }
        free(b);
        free(got);
    }
}

/* without a checkpoint, the official build takes the adapter's "base" when that file
 * exists (relative to where it runs) */
static void test_adapter_base(void) {
    char cmd[4096], out[4096], path[256], hex[65] = "";
    snprintf(cmd, sizeof cmd, "cd '%s/build' && '%s' build --lora lora.safetensors -w ../v3/v3c.cact -o '%s/base.cact' 2>&1",
             fixture_dir(), cli_path(), tmpdir);
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(path, sizeof path, "%s/base.cact", tmpdir);
    size_t n, size;
    uint8_t *data = read_file(path, &size);
    char *text = (char *)read_file(fixture_path("build/manifest.json"), &n);
    cJSON *m = text ? cJSON_Parse(text) : NULL;
    const cJSON *lora = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "cases"), "lora");
    const char *want = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(lora, "sha256"));
    if (data) sha256_hex(data, size, hex);
    CHECK_MSG(data && want && !strcmp(hex, want), "built from the adapter's base: %s, want %s", hex, want ? want : "?");
    free(data);
    free(text);
    cJSON_Delete(m);
}

/* the float32 bits of jnp.matmul (the official merge's A @ B) on the fixture's LoRA shapes
 * and the released geometry's, inputs from the generator's formula_matrix */
static float *formula_matrix(uint64_t n, uint64_t mult) {
    float *v = malloc(n * sizeof *v + 1);
    for (uint64_t i = 0; v && i < n; i++) {
        const uint64_t h = (i * mult + 12345u) % (1ull << 32);
        v[i] = (float)((double)(h >> 8) / (double)(1u << 24) - 0.5);
    }
    return v;
}

static cJSON *manifest(void) {
    size_t n;
    char *text = (char *)read_file(fixture_path("build/manifest.json"), &n);
    cJSON *m = text ? cJSON_Parse(text) : NULL;
    free(text);
    return m;
}

static void test_matmul_official(void) {
    cJSON *m = manifest();
    const cJSON *c;
    int count = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(m, "matmul")) {
        const uint64_t lead = (uint64_t)cJSON_GetObjectItemCaseSensitive(c, "lead")->valuedouble,
                       in = (uint64_t)cJSON_GetObjectItemCaseSensitive(c, "in")->valuedouble,
                       rank = (uint64_t)cJSON_GetObjectItemCaseSensitive(c, "rank")->valuedouble,
                       out = (uint64_t)cJSON_GetObjectItemCaseSensitive(c, "out")->valuedouble;
        float *a = formula_matrix(lead * in * rank, 2654435761u), *b = formula_matrix(lead * rank * out, 2246822519u);
        float *prod = malloc(lead * in * out * sizeof *prod);
        lora_matmul(a, b, lead, in, rank, out, prod);
        char hex[65];
        sha256_hex((const uint8_t *)prod, lead * in * out * sizeof *prod, hex);
        const int known = rank % 4 == 0 || out % 64 == 0 || out % 32 == 0;
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "sha256"));
        if (known)
            CHECK_MSG(!strcmp(hex, want), "[%llu] %llux%llu @ %llux%llu: not jax's float32 bits",
                      (unsigned long long)lead, (unsigned long long)in, (unsigned long long)rank,
                      (unsigned long long)rank, (unsigned long long)out);
        count += known;
        free(a);
        free(b);
        free(prod);
    }
    CHECK(count >= 12);
    cJSON_Delete(m);
}

/* the merged kernels, in the checkpoint's dtype, equal the official merge_lora's */
static void test_merged_weights(void) {
    cJSON *m = manifest();
    size_t nc;
    uint8_t *ck_image = read_file(fixture_path("build/ckpt.safetensors"), &nc);
    st_file ck;
    train_adapter ad;
    lora_view view;
    int dropped = 0;
    CHECK(ck_image && st_parse(ck_image, nc, &ck) == 0);
    CHECK(train_adapter_read(fixture_path("build/lora.safetensors"), &ad) == 0);
    CHECK(ad.n == 5 && ad.scale == 2.0 && ad.base && !strcmp(ad.base, "ckpt.safetensors") && !ad.languages);
    CHECK(lora_view_build(&ck, &ad, &view, &dropped) == 0 && dropped);
    const cJSON *c;
    int count = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(m, "merged")) {
        const st_tensor *t = st_find(&view.st, c->string);
        CHECK_MSG(t && t->dtype == ST_F16, "%s", c->string);
        if (!t) continue;
        char hex[65];
        sha256_hex(t->data, t->numel * 2, hex);
        CHECK_MSG(!strcmp(hex, cJSON_GetStringValue(c)), "%s: merged weights differ from the official", c->string);
        count++;
    }
    CHECK(count == 5);
    CHECK(st_find(&view.st, "confidence_head/query") == NULL && st_find(&view.st, "embedding_head/query") != NULL);
    lora_view_release(&view);
    train_adapter_release(&ad);
    st_release(&ck);
    free(ck_image);
    cJSON_Delete(m);
}

static int file_sha(const char *path, char hex[65]) {
    size_t n;
    uint8_t *data = read_file(path, &n);
    if (!data) return 0;
    sha256_hex(data, n, hex);
    free(data);
    return 1;
}

/* An adapter written here (train_adapter_write: the fixture's, rescaled and with other
 * values) built by the official code and by ours: the same bytes. Needs the reference
 * venv (tests/reference/.venv3 or PYTHON_V3); skipped without it. */
static void test_official_builds_our_adapter(void) {
    const char *py = train_official_python();
    if (!py) {
        harness_skip("no reference venv (tests/reference/make_build_fixtures.sh makes it)");
        return;
    }
    train_adapter ad;
    CHECK(train_adapter_read(fixture_path("build/lora.safetensors"), &ad) == 0);
    ad.scale = 3.5;
    for (uint32_t i = 0; i < ad.n; i++)
        for (uint64_t k = 0; k < ad.lora[i].b.numel; k++) ad.lora[i].b.data[k] *= (k % 3 == 0) ? -1.5f : 0.75f;
    char adapter[256], ours[256], official[256], cmd[8192], out[8192], h1[65] = "", h2[65] = "";
    snprintf(adapter, sizeof adapter, "%s/ours.safetensors", tmpdir);
    CHECK(train_adapter_write(adapter, &ad) == 0);
    train_adapter_release(&ad);
    const int layers[] = {0, 2};
    for (int c = 0; c < 2; c++) {
        char extra[32] = "", depth[16] = "";
        if (layers[c]) {
            snprintf(extra, sizeof extra, " --layers %d", layers[c]);
            snprintf(depth, sizeof depth, "%d", layers[c]);
        }
        snprintf(ours, sizeof ours, "%s/ours%d.cact", tmpdir, c);
        snprintf(official, sizeof official, "%s/official%d.cact", tmpdir, c);
        snprintf(cmd, sizeof cmd, "cd '%s' && '%s' build build/ckpt.safetensors --lora '%s'%s -w v3/v3c.cact -o '%s' -q 2>&1",
                 fixture_dir(), cli_path(), adapter, extra, ours);
        CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "ours: %s", out);
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && JAX_PLATFORMS=cpu '%s' ../reference/official_build.py build/ckpt.safetensors '%s' "
                 "v3/v3c.cact '%s' %s 2>&1",
                 fixture_dir(), py, adapter, official, depth);
        CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "official: %s", out);
        CHECK(file_sha(ours, h1) && file_sha(official, h2));
        CHECK_MSG(!strcmp(h1, h2), "layers %d: ours %s, the official build of our adapter %s", layers[c], h1, h2);
    }
}

static void expect_refusal(const char *args, const char *message) {
    char out[4096], path[256];
    const int rc = run_build(args, "refused.cact", out, sizeof out);
    CHECK_MSG(rc != 0 && rc != -1 && rc < 128, "%s: exit %d", args, rc);
    CHECK_MSG(strstr(out, message) != NULL, "%s: wanted \"%s\" in: %s", args, message, out);
    snprintf(path, sizeof path, "%s/refused.cact", tmpdir);
    CHECK_MSG(access(path, F_OK) != 0, "%s: wrote a file", args);
}

static void test_refusals(void) {
    expect_refusal("v3/v3c.cact --lora build/lora.safetensors", "is a .cact file");
    expect_refusal("build/ckpt.safetensors --lora build/ckpt.safetensors", "scale is not a finite number");
    expect_refusal("build/lora.safetensors --lora build/lora.safetensors", "format-v2 checkpoint");
    expect_refusal("build/ckpt.safetensors --lora build/missing.safetensors", "cannot open");
    expect_refusal("build/ckpt.safetensors --layers 9", "--layers must be in [2, 4]");
    expect_refusal("build/ckpt.safetensors --layers 1", "--layers");
    expect_refusal("build/ckpt.safetensors --lora build/lora.safetensors --bits 7", "--bits");
    /* a Needle 2 base (the demo) and no checkpoint: the Needle 2 checkpoint is asked for */
    expect_refusal("--lora build/lora.safetensors -w ../../models/needle-demo.cact", "is a Needle 2 base");
    /* a Needle 3 checkpoint without the official metadata (the export fixtures') */
    expect_refusal("export/v3_a.safetensors --lora build/lora.safetensors", "format-v2 checkpoint");
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/needle_build_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_official_cases);
    RUN(test_adapter_base);
    RUN(test_matmul_orders);
    RUN(test_matmul_official);
    RUN(test_merged_weights);
    RUN(test_official_builds_our_adapter);
    RUN(test_refusals);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    run_command(cmd, NULL, 0);
    return test_summary();
}
