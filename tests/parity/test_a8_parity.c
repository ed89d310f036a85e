/* W·A8 parity with the official QAT forward (tests/reference/make_a8_fixtures.py: the flax
 * model with quant=True on the float fixtures' models and prompts, fixtures in
 * tests/fixtures/a8/). The checks (qat_check.h): every row before the first rounding flip
 * within the float parity tolerance (in practice ~1.5e-5, the .q16 resolution), the first
 * flip on a row within FLIP_MARGIN steps of a tie, argmax wherever the reference's gap is
 * clear, A8 closer to the QAT reference than the float engine, greedy >= 80%. Prefill and
 * one-token steps (prefill only for the full-size models). Prints the figures per model. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"
#include "util/fp16.h"

#include "qat_check.h"

static const qat_limits limits = {.flip_error = 1e-3, .flip_margin = 1e-4, .gap = 0.1,
                                  .closer = 1.0};

/* out = a/b; 0 if it does not fit (then out holds a truncated path that names nothing) */
static int join_path(char *out, size_t cap, const char *a, const char *b) {
    const int n = snprintf(out, cap, "%s/%s", a, b);
    return n >= 0 && (size_t)n < cap;
}

static float *read_q16(const char *path, uint32_t n_pos, uint32_t vocab) {
    size_t size;
    uint8_t *b = read_file(path, &size);
    const size_t row = 4 + 2 * (size_t)vocab;
    if (!b || size != 12 + row * n_pos || memcmp(b, "NQ16", 4) || rd_u32(b + 4) != n_pos ||
        rd_u32(b + 8) != vocab) {
        free(b);
        return NULL;
    }
    float *v = malloc((size_t)n_pos * vocab * sizeof *v);
    for (uint32_t p = 0; p < n_pos; p++) {
        const uint8_t *r = b + 12 + row * p;
        const float scale = rd_f32(r);
        for (uint32_t k = 0; k < vocab; k++)
            v[(size_t)p * vocab + k] = (float)(int16_t)rd_u16(r + 4 + 2 * k) * scale;
    }
    free(b);
    return v;
}

static int load_case(const cJSON *c, const char *dir, uint32_t vocab, qat_case *fc) {
    memset(fc, 0, sizeof *fc);
    const cJSON *tokens = cJSON_GetObjectItem(c, "tokens"), *greedy = cJSON_GetObjectItem(c, "greedy");
    const cJSON *margins = cJSON_GetObjectItem(c, "round_margin");
    const cJSON *logits = cJSON_GetObjectItem(c, "logits");
    if (!cJSON_IsArray(tokens) || !cJSON_IsArray(greedy) || !cJSON_IsArray(margins) ||
        !cJSON_IsString(logits))
        return -1;
    fc->n_prompt = (size_t)cJSON_GetArraySize(tokens);
    fc->n_greedy = (size_t)cJSON_GetArraySize(greedy);
    fc->n_seq = fc->n_prompt + fc->n_greedy - 1;
    if ((size_t)cJSON_GetArraySize(margins) != fc->n_seq || fc->n_greedy < 1) return -1;
    fc->cols = vocab;
    qat_case_alloc(fc);
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, tokens) fc->seq[i++] = (int32_t)it->valuedouble;
    i = 0;
    cJSON_ArrayForEach(it, greedy) {
        fc->greedy[i] = (int32_t)it->valuedouble;
        if (i + 1 < fc->n_greedy) fc->seq[fc->n_prompt + i] = fc->greedy[i];
        i++;
    }
    i = 0;
    cJSON_ArrayForEach(it, margins) fc->round_margin[i++] = it->valuedouble;
    const cJSON *sinks = cJSON_GetObjectItem(c, "sinks"), *window = cJSON_GetObjectItem(c, "window");
    if (!cJSON_IsNumber(sinks) || !cJSON_IsNumber(window)) return -1;
    fc->sinks = (uint32_t)sinks->valuedouble;
    fc->window = (int32_t)window->valuedouble;
    char path[2048];
    fc->ref = join_path(path, sizeof path, dir, logits->valuestring)
                  ? read_q16(path, (uint32_t)fc->n_seq, vocab)
                  : NULL;
    return fc->ref ? 0 : -1;
}

static void run_model(const char *dir, const char *file) {
    char path[4096];
    char *text = join_path(path, sizeof path, dir, file) ? (char *)read_file(path, NULL) : NULL;
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *cases = doc ? cJSON_GetObjectItem(doc, "cases") : NULL;
    const cJSON *model = doc ? cJSON_GetObjectItem(doc, "model") : NULL;
    CHECK_MSG(cases && cJSON_IsString(model), "%s: not an A8 fixture", path);
    if (!cases || !cJSON_IsString(model)) {
        cJSON_Delete(doc);
        return;
    }
    needle_model *m;
    int rc = join_path(path, sizeof path, dir, model->valuestring)
                 ? needle_model_open(path, NULL, &m)
                 : NEEDLE_ERR_INVALID_ARGUMENT;
    CHECK_MSG(rc == NEEDLE_OK, "%s: %s", path, needle_last_error());
    if (rc == NEEDLE_OK) {
        needle_model_info info = {.size = sizeof info};
        needle_model_get_info(m, &info);
        qat_stats st = {0};
        const int incremental = strncmp(file, "full_", 5) != 0;
        int k = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, cases) {
            qat_case fc;
            const int ok = load_case(c, dir, info.vocab, &fc) == 0;
            CHECK_MSG(ok, "%s case %d: malformed or its logits do not match", file, k);
            if (ok) qat_check_case(m, file, k, &fc, info.vocab, incremental, &limits, &st);
            qat_case_free(&fc);
            k++;
        }
        qat_finish_model(file, &st, &limits);
        needle_model_free(m);
    }
    cJSON_Delete(doc);
}

static void test_qat_parity(void) {
    char dir[1024];
    DIR *d = join_path(dir, sizeof dir, fixture_dir(), "a8") ? opendir(dir) : NULL;
    CHECK_MSG(d != NULL, "no A8 fixtures in %s", dir);
    if (!d) return;
    const char *skip = getenv("NEEDLE_PARITY_SKIP");
    char names[64][256];
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) && n < 64) {
        const size_t len = strlen(ent->d_name);
        if (len < 6 || strcmp(ent->d_name + len - 5, ".json") || len >= sizeof names[0]) continue;
        if (skip && *skip && !strncmp(ent->d_name, skip, strlen(skip))) {
            printf("  %s: skipped (NEEDLE_PARITY_SKIP=%s)\n", ent->d_name, skip);
            continue;
        }
        memcpy(names[n++], ent->d_name, len + 1);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    CHECK_MSG(n >= 10, "expected at least 10 A8 fixtures in %s, found %d", dir, n);
    for (int i = 0; i < n; i++) run_model(dir, names[i]);
}

int main(void) {
    RUN(test_qat_parity);
    return test_summary();
}
