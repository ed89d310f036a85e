/* Parity with the official JAX reference (tests/reference/make_fixtures.py).
 *
 * For every tests/fixtures/<model>.json: the decoded tensors match the official reader's
 * checksums; for every case the logits after every position match the reference within
 * 1e-3 x max|logit| of that position, both by one prefill and by one-token steps; and the
 * greedy continuation is identical. Prints the worst relative error per fixture, the
 * figure the parity claim rests on.
 *
 * NEEDLE_PARITY_DIR may name an extra directory of fixtures (the full-size CQ2/CQ4 models
 * the script writes to tests/reference/work/ without committing them). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"
#include "util/fp16.h"

#define TOLERANCE 1e-3

typedef struct q16_logits {
    uint32_t n_pos, vocab;
    float *values; /* [n_pos][vocab] */
} q16_logits;

static int read_q16(const char *path, q16_logits *out) {
    size_t size;
    uint8_t *b = read_file(path, &size);
    if (!b) return -1;
    if (size < 12 || memcmp(b, "NQ16", 4)) { free(b); return -1; }
    out->n_pos = rd_u32(b + 4);
    out->vocab = rd_u32(b + 8);
    size_t row = 4 + 2 * (size_t)out->vocab;
    if (size != 12 + row * out->n_pos) { free(b); return -1; }
    out->values = malloc((size_t)out->n_pos * out->vocab * sizeof(float) + 1);
    for (uint32_t p = 0; p < out->n_pos; p++) {
        const uint8_t *r = b + 12 + row * p;
        float scale = rd_f32(r);
        for (uint32_t v = 0; v < out->vocab; v++)
            out->values[(size_t)p * out->vocab + v] = (float)(int16_t)rd_u16(r + 4 + 2 * v) * scale;
    }
    free(b);
    return 0;
}

/* Worst |ours - ref| / max|ref| over the positions. */
static double worst_error(const float *ours, const float *ref, uint32_t n_pos, uint32_t vocab) {
    double worst = 0;
    for (uint32_t p = 0; p < n_pos; p++) {
        const float *a = ours + (size_t)p * vocab, *b = ref + (size_t)p * vocab;
        double mx = 0, err = 0;
        for (uint32_t v = 0; v < vocab; v++) {
            mx = fmax(mx, fabs(b[v]));
            err = fmax(err, fabs((double)a[v] - b[v]));
        }
        double rel = mx > 0 ? err / mx : err;
        if (!(rel <= worst)) worst = rel; /* NaN propagates as a failure */
    }
    return worst;
}

static int argmax(const float *x, uint32_t n) {
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int)i;
    return best;
}

static int32_t *json_ids(const cJSON *arr, size_t *n) {
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) ids[i++] = (int32_t)it->valuedouble;
    return ids;
}

static void check_tensors(needle_model *m, const cJSON *tensors, const char *name) {
    const cJSON *t;
    int bad = 0, checked = 0;
    cJSON_ArrayForEach(t, tensors) {
        uint32_t index = (uint32_t)cJSON_GetObjectItem(t, "index")->valuedouble;
        size_t count = (size_t)cJSON_GetObjectItem(t, "count")->valuedouble, n = 0;
        float *vals = malloc(count * sizeof *vals + 1);
        int rc = needle_model_decode_tensor(m, index, vals, count, &n);
        CHECK_MSG(rc == NEEDLE_OK && n == count, "%s tensor %u: decode rc %d, %zu values vs %zu",
                  name, index, rc, n, count);
        if (rc == NEEDLE_OK && n == count) {
            double sum = 0, sum_abs = 0;
            for (size_t k = 0; k < n; k++) { sum += vals[k]; sum_abs += fabs(vals[k]); }
            double ref_sum = cJSON_GetObjectItem(t, "sum")->valuedouble;
            double ref_abs = cJSON_GetObjectItem(t, "sum_abs")->valuedouble;
            /* float32 decode in a different summation order: relative to the mass */
            double tol = 1e-5 * ref_abs + 1e-6;
            if (fabs(sum - ref_sum) > tol || fabs(sum_abs - ref_abs) > tol) bad++;
            CHECK_MSG(fabs(sum - ref_sum) <= tol && fabs(sum_abs - ref_abs) <= tol,
                      "%s tensor %u: sum %.9g vs %.9g, sum_abs %.9g vs %.9g", name, index, sum,
                      ref_sum, sum_abs, ref_abs);
            const cJSON *first = cJSON_GetObjectItem(t, "first"), *f;
            size_t k = 0;
            cJSON_ArrayForEach(f, first) {
                CHECK_MSG(fabs(vals[k] - f->valuedouble) <= 1e-6 * fmax(1.0, fabs(f->valuedouble)),
                          "%s tensor %u value %zu: %.9g vs %.9g", name, index, k, vals[k],
                          f->valuedouble);
                k++;
            }
            checked++;
        }
        free(vals);
    }
    printf("  %s: %d tensors match the official reader's decode (%d off)\n", name, checked, bad);
}

static void check_case(needle_model *m, const cJSON *c, const char *dir, const char *name,
                       int case_index, double *worst_prefill, double *worst_incremental) {
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    size_t n_tok, n_greedy;
    int32_t *tokens = json_ids(cJSON_GetObjectItem(c, "tokens"), &n_tok);
    int32_t *greedy = json_ids(cJSON_GetObjectItem(c, "greedy"), &n_greedy);
    const cJSON *sinks = cJSON_GetObjectItem(c, "sinks");
    const cJSON *window = cJSON_GetObjectItem(c, "window");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, cJSON_GetObjectItem(c, "logits")->valuestring);
    q16_logits ref;
    if (read_q16(path, &ref) != 0 || ref.vocab != info.vocab || ref.n_pos != n_tok) {
        CHECK_MSG(0, "%s case %d: cannot read %s or it does not match the case", name,
                  case_index, path);
        free(tokens);
        free(greedy);
        return;
    }

    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = (uint32_t)(n_tok + n_greedy + 1);
    sp.kv_window = window ? (int32_t)window->valuedouble : -1;
    sp.n_sinks = sinks ? (uint32_t)sinks->valuedouble : 0;
    float *logits = malloc(n_tok * info.vocab * sizeof *logits);

    /* one prefill over the whole prompt */
    needle_session *s;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_eval(s, tokens, n_tok, logits, n_tok * info.vocab), NEEDLE_OK);
    double e = worst_error(logits, ref.values, ref.n_pos, ref.vocab);
    CHECK_MSG(e <= TOLERANCE, "%s case %d prefill: worst relative error %.3g", name, case_index, e);
    if (!(e <= *worst_prefill)) *worst_prefill = e;

    /* greedy continuation from the prefilled state */
    for (size_t i = 0; i < n_greedy; i++) {
        int32_t next = argmax(needle_session_logits(s), info.vocab);
        CHECK_MSG(next == greedy[i], "%s case %d greedy step %zu: %d vs reference %d", name,
                  case_index, i, next, greedy[i]);
        if (next != greedy[i]) break;
        CHECK_EQ_INT(needle_session_eval(s, &next, 1, NULL, 0), NEEDLE_OK);
    }
    needle_session_free(s);

    /* the same through one-token steps */
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    for (size_t i = 0; i < n_tok; i++)
        CHECK_EQ_INT(needle_session_eval(s, tokens + i, 1, logits + i * info.vocab, info.vocab),
                     NEEDLE_OK);
    e = worst_error(logits, ref.values, ref.n_pos, ref.vocab);
    CHECK_MSG(e <= TOLERANCE, "%s case %d incremental: worst relative error %.3g", name,
              case_index, e);
    if (!(e <= *worst_incremental)) *worst_incremental = e;
    needle_session_free(s);

    free(logits);
    free(ref.values);
    free(tokens);
    free(greedy);
}

/* Runs every fixture in `dir` except those whose name starts with NEEDLE_PARITY_SKIP (set
 * by tests/CMakeLists.txt for the full-size model under an emulator, where it takes many
 * minutes). Returns the number of models run. */
static int run_fixture_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    const char *skip = getenv("NEEDLE_PARITY_SKIP");
    int models = 0;
    struct dirent *ent;
    char **names = NULL;
    size_t n_names = 0;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        if (len > 5 && !strcmp(ent->d_name + len - 5, ".json") &&
            skip && *skip && !strncmp(ent->d_name, skip, strlen(skip))) {
            printf("  %s: skipped (NEEDLE_PARITY_SKIP=%s)\n", ent->d_name, skip);
            continue;
        }
        if (len > 5 && !strcmp(ent->d_name + len - 5, ".json") &&
            strncmp(ent->d_name, "tokenizer", 9)) {
            names = realloc(names, (n_names + 1) * sizeof *names);
            names[n_names++] = strdup(ent->d_name);
        }
    }
    closedir(d);
    for (size_t k = 0; k < n_names; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        char *text = (char *)read_file(path, NULL);
        cJSON *doc = text ? cJSON_Parse(text) : NULL;
        free(text);
        const cJSON *cases = doc ? cJSON_GetObjectItem(doc, "cases") : NULL;
        const cJSON *model = doc ? cJSON_GetObjectItem(doc, "model") : NULL;
        if (!cases || !cJSON_IsString(model)) {
            cJSON_Delete(doc);
            free(names[k]);
            continue;
        }
        snprintf(path, sizeof path, "%s/%s", dir, model->valuestring);
        needle_model *m;
        int rc = needle_model_open(path, NULL, &m);
        CHECK_MSG(rc == NEEDLE_OK, "%s: %s", path, needle_last_error());
        if (rc == NEEDLE_OK) {
            models++;
            check_tensors(m, cJSON_GetObjectItem(doc, "tensors"), model->valuestring);
            double wp = 0, wi = 0;
            int i = 0;
            const cJSON *c;
            cJSON_ArrayForEach(c, cases) check_case(m, c, dir, model->valuestring, i++, &wp, &wi);
            printf("  %s: %d cases, worst relative logit error %.2e (prefill), %.2e "
                   "(incremental)\n", model->valuestring, i, wp, wi);
            needle_model_free(m);
        }
        cJSON_Delete(doc);
        free(names[k]);
    }
    free(names);
    return models;
}

static void test_fixture_parity(void) {
    int models = run_fixture_dir(fixture_dir());
    CHECK_MSG(models >= 4, "expected at least 4 parity fixtures in %s, found %d", fixture_dir(),
              models);
    const char *extra = getenv("NEEDLE_PARITY_DIR");
    if (extra && *extra) run_fixture_dir(extra);
}

int main(void) {
    RUN(test_fixture_parity);
    return test_summary();
}
