/* safetensors (src/export/safetensors.h): the `__metadata__` map read and validated, the
 * writer (round trip of every dtype, a scalar, an empty tensor, metadata that needs JSON
 * escaping), files written by huggingface's safetensors read back (fixture), ours read by
 * it (with the reference venv; skipped without), and a failed write (a file-size limit
 * standing in for a full disk) that leaves neither PATH nor a temporary file behind. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "export/safetensors.h"
#include "harness.h"
#include "needle.h"
#include "train_check.h"
#include "util/fp16.h"

static uint8_t *image_of(const char *path, size_t *size) { return read_file(path, size); }

static void test_official_fixture(void) {
    size_t size;
    uint8_t *img = image_of(fixture_path("train/st_official.safetensors"), &size);
    CHECK(img != NULL);
    if (!img) return;
    st_file f;
    CHECK_EQ_INT(st_parse(img, size, &f), 0);
    CHECK_EQ_INT(f.n, 5);
    CHECK_EQ_INT(f.n_meta, 3);
    CHECK(st_meta_get(&f, "format_version") && !strcmp(st_meta_get(&f, "format_version"), "2"));
    CHECK(st_meta_get(&f, "blank") && !strcmp(st_meta_get(&f, "blank"), ""));
    const char *cfg = st_meta_get(&f, "config");
    /* json.dumps escapes non-ASCII: the value is the JSON text, \u escapes and all */
    CHECK(cfg && !strcmp(cfg, "{\"q\": \"say \\\"hi\\\"\\n\", \"u\": \"\\u017c\\u00f3\\u0142\\u0107 \\ud83d\\ude0a\"}"));
    CHECK(st_meta_get(&f, "missing") == NULL);
    const st_tensor *k = st_find(&f, "a/b/kernel");
    CHECK(k && k->dtype == ST_F32 && k->ndim == 2 && k->shape[0] == 3 && k->shape[1] == 4);
    for (uint64_t i = 0; k && i < 12; i++) CHECK(st_get(k, i) == (float)i * 0.375f - 2.0f);
    const st_tensor *h = st_find(&f, "half");
    const float hv[5] = {0, 1.5f, -2.25f, 65504.0f, 0x1p-24f};
    CHECK(h && h->dtype == ST_F16 && h->numel == 5);
    for (uint64_t i = 0; h && i < 5; i++) CHECK(st_get(h, i) == hv[i]);
    const st_tensor *b = st_find(&f, "brain");
    const float bv[4] = {1, -0.5f, 3.140625f, 0x1p100f};
    CHECK(b && b->dtype == ST_BF16 && b->numel == 4);
    for (uint64_t i = 0; b && i < 4; i++) CHECK(st_get(b, i) == bv[i]);
    const st_tensor *s = st_find(&f, "scalar");
    CHECK(s && s->ndim == 0 && s->numel == 1 && st_get(s, 0) == 7.25f);
    const st_tensor *e = st_find(&f, "empty");
    CHECK(e && e->ndim == 2 && e->numel == 0);
    st_release(&f);
    free(img);
}

/* What every written file shares: a tensor of each dtype, a scalar, an empty tensor. */
static const float kvals[6] = {1.0f, -2.5f, 3.0e-3f, 65520.0f /* rounds to inf in F16 */, -0.0f, 1e-7f};
static const float scalar_val = -7.125f;
static const char *meta_text = "{\"q\": \"a \\\"quote\\\"\\n\", \"u\": \"żółć 😊\"}";

static int write_sample(const char *path) {
    st_writer w;
    st_writer_init(&w);
    const uint64_t s23[2] = {2, 3}, s0[2] = {0, 5};
    int st = st_writer_add(&w, "layers/q_proj/kernel", ST_F32, 2, s23, kvals);
    if (!st) st = st_writer_add(&w, "half", ST_F16, 2, s23, kvals);
    if (!st) st = st_writer_add(&w, "brain", ST_BF16, 2, s23, kvals);
    if (!st) st = st_writer_add(&w, "scalar", ST_F32, 0, NULL, &scalar_val);
    if (!st) st = st_writer_add(&w, "empty", ST_F32, 2, s0, NULL);
    if (!st) st = st_writer_meta(&w, "config", "placeholder");
    if (!st) st = st_writer_meta(&w, "config", meta_text); /* replaces */
    if (!st) st = st_writer_meta(&w, "step", "");
    if (!st) st = st_writer_write(&w, path);
    st_writer_release(&w);
    return st;
}

static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
    memcpy(&x, &u, 4);
    return x;
}

static void test_round_trip(void) {
    const char *dir = train_tmpdir();
    CHECK(dir != NULL);
    if (!dir) return;
    char path[600];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    CHECK_EQ_INT(write_sample(path), 0);
    size_t size;
    uint8_t *img = image_of(path, &size);
    CHECK(img != NULL);
    if (!img) return;
    const uint64_t hlen = rd_u64(img);
    CHECK_EQ_INT(hlen % 8, 0);
    CHECK(img[8] == '{' && (img[8 + hlen - 1] == ' ' || img[8 + hlen - 1] == '}'));
    /* the header starts with the metadata, as huggingface's writer puts it */
    CHECK(!memcmp(img + 8, "{\"__metadata__\":", 16));
    st_file f;
    CHECK_EQ_INT(st_parse(img, size, &f), 0);
    CHECK_EQ_INT(f.n, 5);
    CHECK(st_meta_get(&f, "config") && !strcmp(st_meta_get(&f, "config"), meta_text));
    CHECK(st_meta_get(&f, "step") && !strcmp(st_meta_get(&f, "step"), ""));
    const st_tensor *k = st_find(&f, "layers/q_proj/kernel"), *h = st_find(&f, "half"), *b = st_find(&f, "brain");
    CHECK(k && h && b && k->dtype == ST_F32 && h->dtype == ST_F16 && b->dtype == ST_BF16);
    for (int i = 0; k && h && b && i < 6; i++) {
        CHECK(memcmp(&(float){st_get(k, (uint64_t)i)}, &kvals[i], 4) == 0);
        CHECK(st_get(h, (uint64_t)i) == fp16_to_f32(f32_to_fp16(kvals[i])));
        CHECK(st_get(b, (uint64_t)i) == bf16_round(kvals[i]));
    }
    CHECK(isinf(st_get(h, 3)));
    /* every tensor starts at a multiple of its element size (widest first) */
    const uint8_t *data = img + 8 + hlen;
    for (uint32_t i = 0; i < f.n; i++)
        CHECK_EQ_INT((f.tensors[i].data - data) % (f.tensors[i].dtype == ST_F32 ? 4 : 2), 0);
    const st_tensor *s = st_find(&f, "scalar"), *e = st_find(&f, "empty");
    CHECK(s && s->ndim == 0 && st_get(s, 0) == scalar_val);
    CHECK(e && e->numel == 0 && e->shape[1] == 5);
    st_release(&f);
    free(img);
    /* no temporary file left beside it */
    char cmd[700], out[64];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_EQ_INT(atoi(out), 1);
    train_tmpdir_remove(dir);
}

static void test_read_by_official(void) {
    if (!train_official_python()) {
        harness_skip("no reference venv (tests/reference/make_v3_fixtures.sh or PYTHON_V3)");
        return;
    }
    const char *dir = train_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/ours.safetensors", dir);
    CHECK_EQ_INT(write_sample(path), 0);
    cJSON *j = train_official_read("st", path);
    CHECK(j != NULL);
    if (!j) return;
    const cJSON *meta = cJSON_GetObjectItem(j, "__metadata__"), *ts = cJSON_GetObjectItem(j, "tensors");
    const cJSON *cfg = cJSON_GetObjectItem(meta, "config");
    CHECK(cJSON_IsString(cfg) && !strcmp(cfg->valuestring, meta_text));
    CHECK_EQ_INT(cJSON_GetArraySize(ts), 5);
    const char *names[3] = {"layers/q_proj/kernel", "half", "brain"};
    const char *dtypes[3] = {"float32", "float16", "bfloat16"};
    for (int t = 0; t < 3; t++) {
        const cJSON *e = cJSON_GetObjectItem(ts, names[t]);
        const cJSON *v = cJSON_GetObjectItem(e, "values"), *dt = cJSON_GetObjectItem(e, "dtype");
        CHECK_MSG(cJSON_IsString(dt) && !strcmp(dt->valuestring, dtypes[t]), "%s dtype", names[t]);
        CHECK_EQ_INT(cJSON_GetArraySize(v), 6);
        for (int i = 0; i < 6 && cJSON_GetArraySize(v) == 6; i++) {
            const float want = t == 0 ? kvals[i] : t == 1 ? fp16_to_f32(f32_to_fp16(kvals[i])) : bf16_round(kvals[i]);
            const cJSON *x = cJSON_GetArrayItem(v, i);
            const float got = cJSON_IsString(x) && !strcmp(x->valuestring, "inf") ? INFINITY : (float)x->valuedouble;
            CHECK_MSG(got == want && signbit(got) == signbit(want), "%s[%d]", names[t], i);
        }
    }
    const cJSON *s = cJSON_GetObjectItem(cJSON_GetObjectItem(ts, "scalar"), "shape");
    CHECK(cJSON_IsArray(s) && cJSON_GetArraySize(s) == 0);
    const cJSON *e = cJSON_GetObjectItem(cJSON_GetObjectItem(ts, "empty"), "shape");
    CHECK(cJSON_GetArraySize(e) == 2 && cJSON_GetArrayItem(e, 1)->valuedouble == 5);
    cJSON_Delete(j);
    train_tmpdir_remove(dir);
}

/* A header with `json` as its text, parsed: the status. */
static int parse_header(const char *json) {
    const size_t n = strlen(json);
    uint8_t *img = calloc(1, 8 + n);
    for (int b = 0; b < 8; b++) img[b] = (uint8_t)((uint64_t)n >> (8 * b));
    memcpy(img + 8, json, n);
    st_file f;
    const int st = st_parse(img, 8 + n, &f);
    if (!st) st_release(&f);
    free(img);
    return st;
}

static void test_bad_metadata(void) {
    CHECK_EQ_INT(parse_header("{\"__metadata__\":{\"a\":\"1\"}}"), 0);
    CHECK_EQ_INT(parse_header("{\"__metadata__\":null}"), 0);
    CHECK_EQ_INT(parse_header("{\"__metadata__\":{\"a\":1}}"), NEEDLE_ERR_FORMAT);
    CHECK(strstr(needle_last_error(), "'a' is not a string") != NULL);
    CHECK_EQ_INT(parse_header("{\"__metadata__\":[\"a\"]}"), NEEDLE_ERR_FORMAT);
    CHECK_EQ_INT(parse_header("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}"), NEEDLE_ERR_FORMAT);
    CHECK(strstr(needle_last_error(), "appears twice") != NULL);
    CHECK_EQ_INT(parse_header("{\"__metadata__\":{},\"__metadata__\":{}}"), NEEDLE_ERR_FORMAT);
    CHECK_EQ_INT(parse_header("{\"__metadata__\":{\"a\":\"x\\u0000y\"}}"), NEEDLE_ERR_FORMAT);
    CHECK(strstr(needle_last_error(), "NUL") != NULL);
    /* an escaped backslash before u0000 is not a NUL */
    CHECK_EQ_INT(parse_header("{\"__metadata__\":{\"a\":\"x\\\\u0000y\"}}"), 0);
    CHECK_EQ_INT(parse_header("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}"), NEEDLE_ERR_FORMAT);
}

static void test_writer_refuses(void) {
    st_writer w;
    st_writer_init(&w);
    const uint64_t s1[1] = {2};
    const float v[2] = {1, 2};
    CHECK_EQ_INT(st_writer_add(&w, "x", ST_F32, 1, s1, v), 0);
    CHECK_EQ_INT(st_writer_add(&w, "x", ST_F32, 1, s1, v), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(st_writer_add(&w, "", ST_F32, 1, s1, v), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(st_writer_add(&w, "__metadata__", ST_F32, 1, s1, v), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(st_writer_add(&w, "y", ST_F32, 1, s1, NULL), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(st_writer_add(&w, "z", ST_F32, 9, s1, v), NEEDLE_ERR_INVALID_ARGUMENT);
    const uint64_t huge[2] = {1ull << 40, 1ull << 20};
    CHECK_EQ_INT(st_writer_add(&w, "h", ST_F32, 2, huge, v), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(st_writer_meta(&w, "k", NULL), NEEDLE_ERR_INVALID_ARGUMENT);
    /* a directory that does not exist: an I/O error naming the path */
    CHECK_EQ_INT(st_writer_write(&w, "/nonexistent-dir/x.safetensors"), NEEDLE_ERR_IO);
    CHECK(strstr(needle_last_error(), "/nonexistent-dir/x.safetensors") != NULL);
    st_writer_release(&w);
}

/* A write that fails half-way (RLIMIT_FSIZE: the kernel refuses bytes past the limit, as
 * a full disk does) returns NEEDLE_ERR_IO, keeps the file that was at PATH and leaves no
 * temporary file. In a child process: the limit is per process. */
static void test_failed_write_is_atomic(void) {
    const char *dir = train_tmpdir();
    CHECK(dir != NULL);
    if (!dir) return;
    char path[600];
    snprintf(path, sizeof path, "%s/keep.safetensors", dir);
    CHECK_EQ_INT(write_sample(path), 0);
    size_t before_size;
    uint8_t *before = read_file(path, &before_size);
    const pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = {4096, 4096};
        if (setrlimit(RLIMIT_FSIZE, &lim)) _exit(3);
        static float big[1 << 14];
        st_writer w;
        st_writer_init(&w);
        const uint64_t shape[1] = {1 << 14};
        if (st_writer_add(&w, "big", ST_F32, 1, shape, big)) _exit(4);
        const int st = st_writer_write(&w, path);
        st_writer_release(&w);
        _exit(st == NEEDLE_ERR_IO && strstr(needle_last_error(), "cannot write") ? 0 : 5);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    size_t after_size;
    uint8_t *after = read_file(path, &after_size);
    CHECK(before && after && before_size == after_size && !memcmp(before, after, after_size));
    free(before);
    free(after);
    char cmd[700], out[64];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_EQ_INT(atoi(out), 1);
    train_tmpdir_remove(dir);
}

int main(void) {
    RUN(test_official_fixture);
    RUN(test_round_trip);
    RUN(test_read_by_official);
    RUN(test_bad_metadata);
    RUN(test_writer_refuses);
    RUN(test_failed_write_is_atomic);
    return test_summary();
}
