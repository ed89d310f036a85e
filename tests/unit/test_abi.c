/* The ABI rules of needle.h: the "Struct sizes" rule on every params and info struct (a
 * caller built against an older, smaller struct works; an uninitialized or newer, larger
 * struct is refused and nothing is read or written), needle_struct_size, the version
 * written once, and when needle_model_open_blob copies the caller's bytes. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"

static needle_model *model;

#define TOOLS "[{\"name\":\"get_weather\",\"description\":\"Weather in a city.\",\"parameters\":" \
              "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"              \
              "\"required\":[\"city\"]}}]"

static void test_version_written_once(void) {
    char expect[64];
    snprintf(expect, sizeof expect, "%d.%d.%d", NEEDLE_VERSION_MAJOR, NEEDLE_VERSION_MINOR,
             NEEDLE_VERSION_PATCH);
    CHECK_MSG(strcmp(needle_version(), expect) == 0, "needle_version() %s, header %s",
              needle_version(), expect);
    CHECK(strcmp(NEEDLE_VERSION_STRING, expect) == 0);
}

static void test_struct_size_table(void) {
    CHECK_EQ_INT(needle_struct_size("needle_model_params"), sizeof(needle_model_params));
    CHECK_EQ_INT(needle_struct_size("needle_model_info"), sizeof(needle_model_info));
    CHECK_EQ_INT(needle_struct_size("needle_tensor_info"), sizeof(needle_tensor_info));
    CHECK_EQ_INT(needle_struct_size("needle_device_info"), sizeof(needle_device_info));
    CHECK_EQ_INT(needle_struct_size("needle_session_params"), sizeof(needle_session_params));
    CHECK_EQ_INT(needle_struct_size("needle_generate_params"), sizeof(needle_generate_params));
    CHECK_EQ_INT(needle_struct_size("needle_complete_params"), sizeof(needle_complete_params));
    CHECK_EQ_INT(needle_struct_size("needle_session_stats"), sizeof(needle_session_stats));
    CHECK_EQ_INT(needle_struct_size("needle_tools_params"), sizeof(needle_tools_params));
    CHECK_EQ_INT(needle_struct_size("needle_callbacks"), sizeof(needle_callbacks));
    CHECK_EQ_INT(needle_struct_size("needle_model"), 0);
    CHECK_EQ_INT(needle_struct_size(NULL), 0);
    /* the size field leads every struct, so its offset is the same in every version */
    CHECK_EQ_INT(offsetof(needle_model_info, size), 0);
    CHECK_EQ_INT(offsetof(needle_complete_params, size), 0);
}

static void test_defaults_carry_size(void) {
    CHECK_EQ_INT(needle_model_default_params().size, sizeof(needle_model_params));
    CHECK_EQ_INT(needle_session_default_params().size, sizeof(needle_session_params));
    CHECK_EQ_INT(needle_generate_default_params().size, sizeof(needle_generate_params));
    CHECK_EQ_INT(needle_complete_default_params().size, sizeof(needle_complete_params));
    CHECK_EQ_INT(needle_tools_default_params().size, sizeof(needle_tools_params));
}

static void test_model_params_sizes(void) {
    needle_model_params p = needle_model_default_params();
    needle_model *m = NULL;
    p.size = 0;
    CHECK_EQ_INT(needle_model_open(fixture_path("tiny_cq4.cact"), &p, &m), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(m == NULL && strstr(needle_last_error(), "needle_model_params") != NULL);
    p.size = sizeof p + 8;
    CHECK_EQ_INT(needle_model_open(fixture_path("tiny_cq4.cact"), &p, &m), NEEDLE_ERR_INVALID_ARGUMENT);
    /* an older caller that knew only n_threads: its garbage beyond is not read, so the
     * backend is the default one even though the field holds a bogus name here */
    p.size = offsetof(needle_model_params, backend);
    p.backend = "no-such-backend";
    CHECK_EQ_INT(needle_model_open(fixture_path("tiny_cq4.cact"), &p, &m), NEEDLE_OK);
    CHECK(m && strcmp(needle_model_backend(m), needle_default_backend()) == 0);
    needle_model_free(m);
    p.size = sizeof p; /* the full struct does read it */
    CHECK_EQ_INT(needle_model_open(fixture_path("tiny_cq4.cact"), &p, &m), NEEDLE_ERR_BACKEND);
}

static void test_session_params_sizes(void) {
    needle_session_params p = needle_session_default_params();
    needle_session *s = NULL;
    p.size = 0;
    CHECK_EQ_INT(needle_session_create(model, &p, &s), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(s == NULL);
    p.size = 2;
    CHECK_EQ_INT(needle_session_create(model, &p, &s), NEEDLE_ERR_INVALID_ARGUMENT);
    p.size = sizeof p + 4;
    CHECK_EQ_INT(needle_session_create(model, &p, &s), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(s == NULL);
    /* a caller built before kv_type existed: an invalid kv_type past its size is ignored
     * (the default F32 applies), while the full struct refuses it */
    p.size = offsetof(needle_session_params, kv_type);
    p.kv_type = 99;
    CHECK_EQ_INT(needle_session_create(model, &p, &s), NEEDLE_OK);
    needle_session_free(s);
    s = NULL;
    p.size = sizeof p;
    CHECK_EQ_INT(needle_session_create(model, &p, &s), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(s == NULL);
}

static void test_generate_params_sizes(void) {
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(model, NULL, &s), NEEDLE_OK);
    if (!s) return;
    const int32_t prompt[] = {NEEDLE_TOKEN_BOS, 10, 11};
    int32_t out[8];
    size_t n = 0;
    needle_generate_params g = needle_generate_default_params();
    g.max_new_tokens = 4;
    g.size = 0;
    CHECK_EQ_INT(needle_session_generate(s, prompt, 3, &g, out, 8, &n), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(needle_session_position(s), 0); /* refused before any work */
    g.size = sizeof g + 1;
    CHECK_EQ_INT(needle_session_generate(s, prompt, 3, &g, out, 8, &n), NEEDLE_ERR_INVALID_ARGUMENT);
    /* an older caller that knew only max_new_tokens: a negative temperature past its size is
     * not read (greedy default), while the full struct refuses it */
    g.size = offsetof(needle_generate_params, temperature);
    g.temperature = -1.0f;
    CHECK_EQ_INT(needle_session_generate(s, prompt, 3, &g, out, 8, &n), NEEDLE_OK);
    CHECK(n >= 1 && n <= 4);
    needle_session_reset(s);
    g.size = sizeof g;
    CHECK_EQ_INT(needle_session_generate(s, prompt, 3, &g, out, 8, &n), NEEDLE_ERR_INVALID_ARGUMENT);
    needle_session_free(s);
}

static void test_complete_params_sizes(void) {
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 4096; /* the tiny tokenizer spends ~200 tokens on the tools */
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(model, &sp, &s), NEEDLE_OK);
    if (!s) return;
    CHECK_MSG(needle_session_set_tools(s, NULL, TOOLS) == NEEDLE_OK, "%s", needle_last_error());
    static char out[1 << 16];
    size_t len = 0;
    needle_complete_params p = needle_complete_default_params();
    p.size = 0;
    CHECK_EQ_INT(needle_session_complete(s, "weather in Oslo", &p, out, sizeof out, &len),
                 NEEDLE_ERR_INVALID_ARGUMENT);
    p.size = sizeof p + 16;
    CHECK_EQ_INT(needle_session_complete(s, "weather in Oslo", &p, out, sizeof out, &len),
                 NEEDLE_ERR_INVALID_ARGUMENT);
    /* an older caller that knew only the token caps: a negative temperature past its
     * size is not read (greedy default), while the full struct refuses it */
    p.size = offsetof(needle_complete_params, temperature);
    p.max_new_tokens = 48;
    p.temperature = -1.0f;
    CHECK_EQ_INT(needle_session_complete(s, "weather in Oslo", &p, out, sizeof out, &len), NEEDLE_OK);
    CHECK(len > 0 && strstr(out, "\"success\"") != NULL);
    p.size = sizeof p;
    CHECK_EQ_INT(needle_session_complete(s, "weather in Oslo", &p, out, sizeof out, &len),
                 NEEDLE_ERR_INVALID_ARGUMENT);

    needle_session_stats full = {.size = sizeof full};
    CHECK_EQ_INT(needle_session_get_stats(s, &full), NEEDLE_OK);
    CHECK(full.tokens_evaluated > 0 && full.forward_ms > 0.0);
    /* an older, smaller stats struct is filled up to its size and not beyond */
    unsigned char buf[sizeof(needle_session_stats) + 16];
    memset(buf, 0xAB, sizeof buf);
    const uint32_t small = (uint32_t)offsetof(needle_session_stats, grammar_ms);
    memcpy(buf, &small, sizeof small);
    CHECK_EQ_INT(needle_session_get_stats(s, (needle_session_stats *)(void *)buf), NEEDLE_OK);
    uint64_t tokens;
    memcpy(&tokens, buf + offsetof(needle_session_stats, tokens_evaluated), sizeof tokens);
    CHECK_EQ_INT(tokens, full.tokens_evaluated);
    int untouched = 1;
    for (size_t i = small; i < sizeof buf; i++) untouched &= buf[i] == 0xAB;
    CHECK_MSG(untouched, "get_stats wrote past the caller's size");
    needle_session_stats zero = {.size = 0};
    CHECK_EQ_INT(needle_session_get_stats(s, &zero), NEEDLE_ERR_INVALID_ARGUMENT);
    needle_session_free(s);
}

static void test_tools_params_sizes(void) {
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 4096;
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(model, &sp, &s), NEEDLE_OK);
    if (!s) return;
    needle_tools_params tp = needle_tools_default_params();
    tp.size = 0;
    CHECK_EQ_INT(needle_session_set_tools_ex(s, NULL, TOOLS, &tp), NEEDLE_ERR_INVALID_ARGUMENT);
    tp.size = sizeof tp + 8;
    CHECK_EQ_INT(needle_session_set_tools_ex(s, NULL, TOOLS, &tp), NEEDLE_ERR_INVALID_ARGUMENT);
    /* an older caller without tool_index_path: the bogus path past its size is not read */
    tp.size = (uint32_t)offsetof(needle_tools_params, tool_index_path);
    tp.tool_index_path = "/nonexistent/dir/index";
    CHECK_EQ_INT(needle_session_set_tools_ex(s, NULL, TOOLS, &tp), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_set_tools_ex(s, NULL, TOOLS, NULL), NEEDLE_OK);
    needle_session_free(s);
}

static void test_info_structs_sizes(void) {
    needle_model_info info = {.size = sizeof info};
    CHECK_EQ_INT(needle_model_get_info(model, &info), NEEDLE_OK);
    CHECK(info.size == sizeof info && info.vocab > 0 && info.num_layers > 0);

    /* an older struct that ended before vocab */
    unsigned char buf[sizeof(needle_model_info) + 8];
    memset(buf, 0xCD, sizeof buf);
    const uint32_t small = (uint32_t)offsetof(needle_model_info, vocab);
    memcpy(buf, &small, sizeof small);
    CHECK_EQ_INT(needle_model_get_info(model, (needle_model_info *)(void *)buf), NEEDLE_OK);
    uint32_t n_tensors, size_after;
    memcpy(&n_tensors, buf + offsetof(needle_model_info, num_tensors), sizeof n_tensors);
    memcpy(&size_after, buf, sizeof size_after);
    CHECK_EQ_INT(n_tensors, info.num_tensors);
    CHECK_EQ_INT(size_after, small); /* size is left as the caller set it */
    int untouched = 1;
    for (size_t i = small; i < sizeof buf; i++) untouched &= buf[i] == 0xCD;
    CHECK_MSG(untouched, "get_info wrote past the caller's size");

    needle_model_info bad = {.size = 0};
    CHECK_EQ_INT(needle_model_get_info(model, &bad), NEEDLE_ERR_INVALID_ARGUMENT);
    bad.size = sizeof bad + 4;
    CHECK_EQ_INT(needle_model_get_info(model, &bad), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(bad.vocab, 0); /* nothing written */

    needle_tensor_info t = {.size = sizeof t};
    CHECK_EQ_INT(needle_model_get_tensor(model, 0, &t), NEEDLE_OK);
    CHECK(t.name != NULL && t.ndim >= 1);
    needle_tensor_info t0 = {.size = 0};
    CHECK_EQ_INT(needle_model_get_tensor(model, 0, &t0), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(t0.name == NULL);

    needle_device_info d = {.size = sizeof d};
    CHECK_EQ_INT(needle_device_get(0, &d), NEEDLE_OK);
    CHECK(strcmp(d.backend, "cpu") == 0 && d.compute_units >= 1);
    needle_device_info d_old = {.size = (uint32_t)offsetof(needle_device_info, memory_bytes)};
    CHECK_EQ_INT(needle_device_get(0, &d_old), NEEDLE_OK);
    CHECK(strcmp(d_old.backend, "cpu") == 0 && d_old.compute_units == 0);
    needle_device_info d_big = {.size = sizeof d_big + 1};
    CHECK_EQ_INT(needle_device_get(0, &d_big), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK(d_big.backend[0] == '\0');
}

/* Decodes row 0 of tensor 0 (the CQ embedding) into `out` (cap floats). */
static int decode_first(const needle_model *m, float *out, size_t cap) {
    size_t n = 0;
    return needle_model_decode_tensor(m, 0, out, cap, &n);
}

/* needle.h: an aligned blob is used in place, a misaligned one is copied at open. Shown
 * by changing a code byte of tensor 0 in the caller's buffer after the open. */
static void test_blob_copy_rule(void) {
    size_t size = 0;
    uint8_t *file = read_file(fixture_path("tiny_cq4.cact"), &size);
    CHECK(file != NULL);
    if (!file) return;
    needle_model *ref = NULL;
    CHECK_EQ_INT(needle_model_open_blob(file, size, NULL, &ref), NEEDLE_OK);
    needle_tensor_info t = {.size = sizeof t};
    CHECK_EQ_INT(needle_model_get_tensor(ref, 0, &t), NEEDLE_OK);
    CHECK(t.dtype == NEEDLE_DTYPE_CQ && t.offset < size);
    size_t n = 0;
    needle_model_decode_tensor(ref, 0, NULL, 0, &n);
    float *before = malloc(n * sizeof *before), *after = malloc(n * sizeof *after);
    uint8_t *buf = aligned_alloc(64, (size + 64 + 63) / 64 * 64);
    CHECK(before && after && buf && n > 0);
    if (!before || !after || !buf || t.dtype != NEEDLE_DTYPE_CQ) goto done;
    CHECK_EQ_INT(decode_first(ref, before, n), NEEDLE_OK);

    for (int misaligned = 0; misaligned <= 1; misaligned++) {
        uint8_t *image = buf + misaligned; /* buf is 64-aligned: +1 is not */
        memcpy(image, file, size);
        needle_model *m = NULL;
        CHECK_EQ_INT(needle_model_open_blob(image, size, NULL, &m), NEEDLE_OK);
        if (!m) continue;
        image[t.offset] ^= 0xFF; /* the first codes of row 0 */
        CHECK_EQ_INT(decode_first(m, after, n), NEEDLE_OK);
        const int changed = memcmp(before, after, n * sizeof *after) != 0;
        if (misaligned)
            CHECK_MSG(!changed, "a misaligned blob must be copied at open");
        else
            CHECK_MSG(changed, "an aligned blob must be used in place");
        needle_model_free(m);
    }
done:
    needle_model_free(ref);
    free(before);
    free(after);
    free(buf);
    free(file);
}

int main(void) {
    RUN(test_version_written_once);
    RUN(test_struct_size_table);
    RUN(test_defaults_carry_size);
    RUN(test_model_params_sizes);
    if (needle_model_open(fixture_path("tiny_cq4.cact"), NULL, &model) != NEEDLE_OK) {
        fprintf(stderr, "cannot open tiny_cq4.cact: %s\n", needle_last_error());
        return 1;
    }
    RUN(test_session_params_sizes);
    RUN(test_generate_params_sizes);
    RUN(test_complete_params_sizes);
    RUN(test_tools_params_sizes);
    RUN(test_info_structs_sizes);
    RUN(test_blob_copy_rule);
    needle_model_free(model);
    return test_summary();
}
