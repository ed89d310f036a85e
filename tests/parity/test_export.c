/* `needle export` / `needle quantize` internals against the official exporter
 * (cactus-needle 2.0.15, fixtures from tests/reference/make_export_fixtures.py):
 * codebooks, bits maps, byte identity of whole files for every width and several maps on
 * two geometries, re-quantization identity, the CLI, and hostile inputs (truncated,
 * wrong shapes, NaN/Inf, huge dims, corrupt tokenizer models, random mutations). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "export/cact_write.h"
#include "export/export_model.h"
#include "export/export_model_v3.h"
#include "export/requantize.h"
#include "export/safetensors.h"
#include "export/spm_model.h"
#include "format/cact.h"
#include "harness.h"
#include "sha256.h"
#include "needle.h"
#include "quant/bits_map.h"
#include "quant/cq_codebook.h"
#include "quant/cq_quantize.h"

static cq_codebooks g_cb;

static const char *export_path(const char *name) {
    static char buf[4][1024];
    static int slot;
    char *b = buf[slot++ % 4];
    snprintf(b, sizeof buf[0], "%s/export/%s", fixture_dir(), name);
    return b;
}

static void test_codebooks(void) {
    size_t size;
    uint8_t *ref = read_file(fixture_path("tiny_cq4.cact"), &size);
    CHECK(ref && size > 232);
    if (!ref) return;
    float expect[28];
    memcpy(expect, ref + 120, sizeof expect);
    int k = 0;
    for (uint32_t b = 2; b <= 4; b++)
        for (uint32_t i = 0; i < (1u << b); i++, k++)
            CHECK_MSG(memcmp(&g_cb.levels[b][i], &expect[k], 4) == 0, "cb%u[%u] %.9g vs header %.9g", b, i,
                      (double)g_cb.levels[b][i], (double)expect[k]);
    free(ref);
    /* the unit-variance centroids of spec §2.1 */
    double c[4];
    CHECK(cq_lloyd_max_gaussian(2, c) == 0);
    CHECK(fabs(c[0] + 1.50667) < 1e-5 && fabs(c[3] - 1.50993) < 1e-5);
    CHECK(fabsf(g_cb.levels[CQ_TERNARY][2] - 0.10818791f) < 1e-8f && g_cb.levels[CQ_TERNARY][1] == 0.0f);
}

static void test_bits_map(void) {
    bits_map m;
    char c[BITS_MAP_MAX_KEY];
    const char *canon[][2] = {
        {"layer07.q_proj", "attn.q_proj"},
        {"engrams_1/embedding", "engram1.tables"},
        {"engram0", "engram0."},
        {"stack/layers/block/self_attn/k_proj/kernel", "attn.k_proj"},
        {"embedding/embedding", "embedding"},
        {"stack/mhc_phi_res", "mhc_phi_res"},
        {"layerX.q", "layerX.q"},
        {"engram", "engram"},
    };
    for (size_t i = 0; i < sizeof canon / sizeof canon[0]; i++) {
        CHECK(bits_map_canonical(canon[i][0], c, sizeof c) == 0);
        CHECK_MSG(!strcmp(c, canon[i][1]), "%s -> %s, expected %s", canon[i][0], c, canon[i][1]);
    }
    CHECK(bits_map_parse("default=2,attn=3,attn.q_proj=4, engram = 1.58 ,", &m) == 0);
    CHECK_EQ_INT(bits_map_lookup(&m, "layer03.q_proj"), 4);
    CHECK_EQ_INT(bits_map_lookup(&m, "layer03.k_proj"), 3);
    CHECK_EQ_INT(bits_map_lookup(&m, "engram1.tables"), CQ_TERNARY);
    CHECK_EQ_INT(bits_map_lookup(&m, "embedding"), 2);
    CHECK(bits_map_parse("default=4,attn=3,attn=2", &m) == 0); /* a repeated key: the last width */
    CHECK_EQ_INT(bits_map_lookup(&m, "layer00.v_proj"), 2);
    CHECK(bits_map_parse("3", &m) == 0 && m.default_bits == 3 && m.n == 0);
    CHECK(bits_map_parse("1.58", &m) == 0 && m.default_bits == CQ_TERNARY);
    const char *bad[] = {"embedding=4", "default=5", "default=2.5", "default=2,attn",
                         "default=x",   "",          "default=1",   "default=-2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(bits_map_parse(bad[i], &m) != 0, "'%s' accepted", bad[i]);
}

/* exports a checkpoint through the library; returns the image (malloc'd) or NULL */
static uint8_t *export_image(const uint8_t *ck_image, size_t ck_size, const char *config_json,
                             const char *bits, int with_tokenizer, size_t *size, int *status) {
    *size = 0;
    *status = 0;
    st_file ck;
    export_config cfg;
    bits_map map;
    int st = st_parse(ck_image, ck_size, &ck);
    if (st) {
        *status = st;
        return NULL;
    }
    uint8_t *image = NULL, *tok = NULL;
    size_t tok_size = 0;
    uint32_t pieces = 0;
    st = export_config_parse(config_json, strlen(config_json), &cfg);
    if (!st) st = bits_map_parse(bits, &map);
    if (!st && with_tokenizer) {
        size_t msize;
        uint8_t *model = read_file(fixture_path("tiny_bpe512.model"), &msize);
        st = model ? spm_tokenizer_blob(model, msize, &tok, &tok_size, &pieces) : -1;
        free(model);
    }
    if (!st) {
        cact_writer w;
        cw_init(&w);
        const export_options opt = {.bits = &map,
                                    .kv_window = export_effective_kv_window(&cfg),
                                    .tokenizer = tok,
                                    .tokenizer_size = tok_size,
                                    .tokenizer_pieces = pieces};
        st = export_build(&ck, &cfg, &g_cb, &opt, &w);
        if (!st) st = cw_serialize(&w, &image, size);
        cw_release(&w);
    }
    free(tok);
    st_release(&ck);
    *status = st;
    return image;
}

static void compare_files(const char *what, const uint8_t *got, size_t got_size, const char *ref_path) {
    size_t ref_size;
    uint8_t *ref = read_file(ref_path, &ref_size);
    CHECK_MSG(ref != NULL, "%s: cannot read %s", what, ref_path);
    if (!ref || !got) {
        free(ref);
        return;
    }
    size_t first = 0;
    while (first < got_size && first < ref_size && got[first] == ref[first]) first++;
    CHECK_MSG(got_size == ref_size && first == ref_size,
              "%s: %zu bytes vs official %zu, first difference at %zu", what, got_size, ref_size, first);
    free(ref);
}

/* our image against the official output recorded in a manifest entry (size + SHA-256);
 * on a mismatch, the official file from tests/reference/work/export-official/ (when the
 * generator ran here) locates the first differing byte */
static void compare_digest(const char *what, const uint8_t *got, size_t got_size, const cJSON *entry,
                           const char *name) {
    const cJSON *digest = cJSON_GetObjectItem(entry, "sha256"), *bytes = cJSON_GetObjectItem(entry, "bytes");
    CHECK_MSG(cJSON_IsString(digest) && cJSON_IsNumber(bytes), "%s: manifest entry lacks sha256/bytes", what);
    if (!got || !cJSON_IsString(digest) || !cJSON_IsNumber(bytes)) return;
    char hex[65];
    sha256_hex(got, got_size, hex);
    const int same = got_size == (size_t)bytes->valuedouble && !strcmp(hex, digest->valuestring);
    CHECK_MSG(same, "%s: %zu bytes, sha256 %s; official %.0f bytes, %s", what, got_size, hex, bytes->valuedouble,
              digest->valuestring);
    if (!same) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/reference/work/export-official/%s", NEEDLE_SOURCE_DIR, name);
        if (access(path, R_OK) == 0) compare_files(what, got, got_size, path);
    }
}

/* the manifest (manifest.json or manifest_v3.json), parsed */
static cJSON *load_manifest(const char *name) {
    char *text = (char *)read_file(export_path(name), &(size_t){0});
    cJSON *m = text ? cJSON_Parse(text) : NULL;
    free(text);
    return m;
}

static char *read_text(const char *path) {
    size_t n;
    return (char *)read_file(path, &n);
}

/* one export through the library, checked against a file or a manifest digest */
static void export_and_compare(const char *ckpt, const char *config_name, const char *bits, const char *ref_file,
                               const cJSON *entry, const char *entry_name) {
    size_t ck_size, size = 0;
    uint8_t *ck = read_file(export_path(ckpt), &ck_size);
    char *config = read_text(export_path(config_name));
    CHECK(ck && config);
    int st = -1;
    uint8_t *image = ck && config ? export_image(ck, ck_size, config, bits, 1, &size, &st) : NULL;
    CHECK_MSG(st == 0, "%s [%s]: %s", ckpt, bits, needle_last_error());
    char what[256];
    snprintf(what, sizeof what, "%s with %s", ckpt, bits);
    if (ref_file) compare_files(what, image, size, ref_file);
    else compare_digest(what, image, size, entry, entry_name);
    free(image);
    free(ck);
    free(config);
}

static void test_export_identity(void) {
    char hex[65];
    sha256_hex((const uint8_t *)"abc", 3, hex); /* FIPS 180-4 example */
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    sha256_hex((const uint8_t *)"", 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    /* the parity fixtures the checkpoints were made for, byte by byte */
    export_and_compare("tiny.safetensors", "tiny.config.json", "default=2,embedding=4,mhc_phi=4",
                       fixture_path("tiny_mixed.cact"), NULL, NULL);
    export_and_compare("tinyb.safetensors", "tinyb.config.json", "default=2,embedding=4,mhc_phi=4",
                       fixture_path("tinyb_mixed.cact"), NULL, NULL);
    /* every width and the other maps, by digest */
    cJSON *manifest = load_manifest("manifest.json");
    CHECK(manifest != NULL);
    int n = 0;
    for (const cJSON *e = manifest ? manifest->child : NULL; e; e = e->next) {
        const cJSON *ck = cJSON_GetObjectItem(e, "checkpoint");
        if (!ck) continue;
        export_and_compare(ck->valuestring, cJSON_GetObjectItem(e, "config")->valuestring,
                           cJSON_GetObjectItem(e, "bits")->valuestring, NULL, e, e->string);
        n++;
    }
    CHECK(n >= 8);
    cJSON_Delete(manifest);
}

static void test_requantize_identity(void) {
    cJSON *manifest = load_manifest("manifest.json");
    CHECK(manifest != NULL);
    int n = 0;
    for (cJSON *e = manifest ? manifest->child : NULL; e; e = e->next) {
        const cJSON *src = cJSON_GetObjectItem(e, "source");
        if (!src) continue;
        n++;
        size_t size;
        uint8_t *in_image = read_file(fixture_path(src->valuestring), &size);
        cact_file in;
        CHECK(in_image && cact_parse(in_image, size, &in) == 0);
        bits_map map;
        CHECK(bits_map_parse(cJSON_GetObjectItem(e, "bits")->valuestring, &map) == 0);
        cact_writer w;
        cw_init(&w);
        uint8_t *out = NULL;
        size_t out_size = 0;
        CHECK_MSG(cact_requantize(&in, &map, NULL, NULL, &w) == 0, "%s", needle_last_error());
        CHECK(cw_serialize(&w, &out, &out_size) == 0);
        compare_digest(e->string, out, out_size, e, e->string);
        free(out);
        cw_release(&w);
        cact_release(&in);
        free(in_image);
    }
    CHECK(n >= 3);
    cJSON_Delete(manifest);
}

/* export -> load -> logits: the exported tiny / tinyb models run every recorded case of
 * the parity fixtures within 1e-3 of the official forward's largest logit */
static void test_round_trip(void) {
    const char *geoms[2][2] = {{"tiny", "tiny_mixed"}, {"tinyb", "tinyb_mixed"}};
    for (int g = 0; g < 2; g++) {
        char name[64];
        size_t ck_size, size = 0;
        snprintf(name, sizeof name, "%s.safetensors", geoms[g][0]);
        uint8_t *ck = read_file(export_path(name), &ck_size);
        snprintf(name, sizeof name, "%s.config.json", geoms[g][0]);
        char *config = read_text(export_path(name));
        int st = -1;
        uint8_t *image = ck && config ? export_image(ck, ck_size, config, "default=2,embedding=4,mhc_phi=4", 1,
                                                     &size, &st)
                                      : NULL;
        CHECK(st == 0 && image);
        needle_model *m = NULL;
        CHECK(image && needle_model_open_blob(image, size, NULL, &m) == NEEDLE_OK);
        snprintf(name, sizeof name, "%s.json", geoms[g][1]);
        char *cases_text = read_text(fixture_path(name));
        cJSON *doc = cases_text ? cJSON_Parse(cases_text) : NULL;
        CHECK(doc != NULL);
        const cJSON *cases = doc ? cJSON_GetObjectItem(doc, "cases") : NULL;
        int n_cases = 0;
        for (const cJSON *c = cases ? cases->child : NULL; c; c = c->next) {
            if (!m) break;
            const cJSON *toks = cJSON_GetObjectItem(c, "tokens"), *t;
            const size_t n = (size_t)cJSON_GetArraySize(toks);
            int32_t *ids = malloc(n * sizeof *ids);
            size_t k = 0;
            cJSON_ArrayForEach(t, toks) ids[k++] = (int32_t)t->valuedouble;
            /* the .q16 rows: f32 scale then vocab int16 per position */
            size_t qsize;
            char qpath[1100];
            snprintf(qpath, sizeof qpath, "%s", fixture_path(cJSON_GetObjectItem(c, "logits")->valuestring));
            uint8_t *q = read_file(qpath, &qsize);
            const uint32_t vocab = q ? (uint32_t)(q[8] | q[9] << 8) : 0;
            CHECK(q && qsize == 12 + (size_t)n * (4 + 2 * vocab));
            needle_session_params sp = needle_session_default_params();
            sp.n_ctx = (uint32_t)n + 1;
            sp.kv_window = (int32_t)cJSON_GetObjectItem(c, "window")->valuedouble;
            sp.n_sinks = (uint32_t)cJSON_GetObjectItem(c, "sinks")->valuedouble;
            needle_session *s = NULL;
            float *logits = malloc(n * vocab * sizeof *logits + 1);
            if (q && qsize == 12 + (size_t)n * (4 + 2 * vocab) && needle_session_create(m, &sp, &s) == NEEDLE_OK &&
                needle_session_eval(s, ids, n, logits, n * vocab) == NEEDLE_OK) {
                double worst = 0;
                for (size_t p = 0; p < n; p++) {
                    const uint8_t *row = q + 12 + p * (4 + 2 * (size_t)vocab);
                    float scale;
                    memcpy(&scale, row, 4);
                    double top = 0, err = 0;
                    for (uint32_t v = 0; v < vocab; v++) {
                        const double ref = (int16_t)(row[4 + 2 * v] | row[5 + 2 * v] << 8) * (double)scale;
                        top = fmax(top, fabs(ref));
                        err = fmax(err, fabs(logits[p * vocab + v] - ref));
                    }
                    worst = fmax(worst, err / fmax(top, 1e-30));
                }
                CHECK_MSG(worst <= 1e-3, "%s case %d: worst relative logit error %.3g", geoms[g][1], n_cases, worst);
            } else {
                CHECK_MSG(0, "%s case %d did not run: %s", geoms[g][1], n_cases, needle_last_error());
            }
            needle_session_free(s);
            free(logits);
            free(q);
            free(ids);
            n_cases++;
        }
        CHECK(n_cases >= 5);
        cJSON_Delete(doc);
        free(cases_text);
        needle_model_free(m);
        free(image);
        free(ck);
        free(config);
    }
}

/* Needle 3: the official 3.2.8 exporter's CQ4 output for two geometries (checkpoints
 * stored as F16 and as BF16) */
static void test_export_v3_identity(void) {
    const char *geoms[2] = {"a", "b"};
    cJSON *manifest = load_manifest("manifest_v3.json");
    CHECK(manifest != NULL);
    size_t msize;
    uint8_t *model = read_file(fixture_path("tiny_bpe512.model"), &msize), *tok = NULL;
    size_t tok_size = 0;
    uint32_t pieces = 0;
    CHECK(model && spm_tokenizer_blob_v3(model, msize, &tok, &tok_size, &pieces) == 0);
    free(model);
    for (int g = 0; g < 2; g++) {
        char name[64];
        size_t ck_size, size = 0;
        snprintf(name, sizeof name, "v3_%s.safetensors", geoms[g]);
        uint8_t *ck = read_file(export_path(name), &ck_size);
        snprintf(name, sizeof name, "v3_%s.config.json", geoms[g]);
        char *config = read_text(export_path(name));
        CHECK(ck && config);
        if (!ck || !config) {
            free(ck);
            free(config);
            continue;
        }
        st_file f;
        export3_config cfg;
        bits_map map;
        CHECK(st_parse(ck, ck_size, &f) == 0);
        CHECK(export3_config_parse(config, strlen(config), &cfg) == 0);
        CHECK(bits_map_parse("4", &map) == 0);
        cact_writer w;
        cw_init(&w);
        const export_options opt = {.bits = &map,
                                    .kv_window = export3_effective_kv_window(&cfg),
                                    .tokenizer = tok,
                                    .tokenizer_size = tok_size,
                                    .tokenizer_pieces = pieces};
        uint8_t *image = NULL;
        CHECK_MSG(export3_build(&f, &cfg, &g_cb, &opt, &w) == 0, "v3_%s: %s", geoms[g], needle_last_error());
        CHECK(cw_serialize(&w, &image, &size) == 0);
        snprintf(name, sizeof name, "v3_%s.cact", geoms[g]);
        compare_digest(name, image, size, cJSON_GetObjectItem(manifest, name), name);
        free(image);
        cw_release(&w);
        /* a config the checkpoint does not match */
        export3_config bad = cfg;
        bad.qk_head_dim += 8;
        cw_init(&w);
        CHECK(export3_build(&f, &bad, &g_cb, &opt, &w) < 0 && strstr(needle_last_error(), "shape"));
        cw_release(&w);
        bad = cfg;
        bad.num_layers = 65;
        cw_init(&w);
        CHECK(export3_build(&f, &bad, &g_cb, &opt, &w) < 0 && strstr(needle_last_error(), "64 layers"));
        cw_release(&w);
        st_release(&f);
        free(ck);
        free(config);
    }
    free(tok);
    cJSON_Delete(manifest);
}

/* the full-size geometry, when its (uncommitted) checkpoint was generated */
#if defined(__SANITIZE_ADDRESS__)
#define EXPORT_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EXPORT_UNDER_ASAN 1
#endif
#endif

static void test_export_full(void) {
#ifdef EXPORT_UNDER_ASAN
    /* 50 M weights through the instrumented quantizer take well over ctest's 600 s */
    harness_skip("the full-size export is not run under AddressSanitizer");
    return;
#endif
    char ck_path[1024];
    snprintf(ck_path, sizeof ck_path, "%s/tests/reference/work/export/full.safetensors", NEEDLE_SOURCE_DIR);
    if (access(ck_path, R_OK) != 0) {
        harness_skip("no tests/reference/work/export/full.safetensors (make_export_fixtures.sh --full)");
        return;
    }
    size_t ck_size, size = 0, msize, tok_size = 0;
    uint8_t *ck = read_file(ck_path, &ck_size);
    char cfg_path[1100];
    snprintf(cfg_path, sizeof cfg_path, "%s/tests/reference/work/export/full.config.json", NEEDLE_SOURCE_DIR);
    char *config = read_text(cfg_path);
    CHECK(ck && config);
    if (!ck || !config) {
        free(ck);
        free(config);
        return;
    }
    st_file f;
    export_config cfg;
    bits_map map;
    CHECK(st_parse(ck, ck_size, &f) == 0);
    CHECK(export_config_parse(config, strlen(config), &cfg) == 0);
    CHECK(bits_map_parse("default=2,embedding=4,mhc_phi=4", &map) == 0);
    /* the full models' tokenizer, where make_fixtures.py takes it from */
    uint8_t *model = read_file("/work/shared/models/needle-bpe8192.model", &msize), *tok = NULL;
    uint32_t pieces = 0;
    if (!model) {
        harness_skip("no /work/shared/models/needle-bpe8192.model (the full models' tokenizer)");
        st_release(&f);
        free(ck);
        free(config);
        return;
    }
    CHECK(spm_tokenizer_blob(model, msize, &tok, &tok_size, &pieces) == 0);
    cact_writer w;
    cw_init(&w);
    const export_options opt = {.bits = &map,
                                .kv_window = export_effective_kv_window(&cfg),
                                .tokenizer = tok,
                                .tokenizer_size = tok_size,
                                .tokenizer_pieces = pieces};
    uint8_t *image = NULL;
    CHECK_MSG(export_build(&f, &cfg, &g_cb, &opt, &w) == 0, "%s", needle_last_error());
    CHECK(cw_serialize(&w, &image, &size) == 0);
    /* the official output rerun on this machine (make_export_fixtures.sh --full), not the
     * committed fixture: the exporter's rounding depends on the BLAS kernel numpy uses */
    snprintf(cfg_path, sizeof cfg_path, "%s/tests/reference/work/export/full_mixed.cact", NEEDLE_SOURCE_DIR);
    compare_files("full_mixed", image, size, cfg_path);
    free(image);
    cw_release(&w);
    st_release(&f);
    free(tok);
    free(model);
    free(ck);
    free(config);
}

/* ---- hostile inputs ------------------------------------------------------------------ */

static uint8_t *g_ck;
static size_t g_ck_size;
static char *g_config;

/* exports a modified checkpoint/config and expects failure with `needle` in the message */
static void expect_fail(const char *what, const uint8_t *ck, size_t ck_size, const char *config,
                        const char *needle) {
    size_t size;
    int st;
    uint8_t *image = export_image(ck, ck_size, config, "default=2", 0, &size, &st);
    CHECK_MSG(st < 0 && !image, "%s: accepted", what);
    CHECK_MSG(!needle || strstr(needle_last_error(), needle), "%s: message '%s' lacks '%s'", what,
              needle_last_error(), needle);
    free(image);
}

static char *find_bytes(uint8_t *hay, size_t n, const char *what) {
    const size_t len = strlen(what);
    for (size_t i = 0; i + len <= n; i++)
        if (!memcmp(hay + i, what, len)) return (char *)hay + i;
    return NULL;
}

/* byte offset of element 0 of tensor `name` in g_ck */
static size_t tensor_offset(const char *name) {
    st_file f;
    if (st_parse(g_ck, g_ck_size, &f)) return 0;
    const st_tensor *t = st_find(&f, name);
    const size_t off = t ? (size_t)(t->data - g_ck) : 0;
    st_release(&f);
    return off;
}

static void test_hostile_checkpoints(void) {
    g_ck = read_file(export_path("tiny.safetensors"), &g_ck_size);
    g_config = read_text(export_path("tiny.config.json"));
    CHECK(g_ck && g_config);
    if (!g_ck || !g_config) return;
    uint8_t *copy = malloc(g_ck_size);
    /* truncated anywhere: header, JSON, data */
    const size_t cuts[] = {0, 4, 8, 9, 100, 4000, g_ck_size / 2, g_ck_size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "truncated to %zu bytes", cuts[i]);
        expect_fail(what, g_ck, cuts[i], g_config, "safetensors");
    }
    /* a header length past the end */
    memcpy(copy, g_ck, g_ck_size);
    copy[7] = 0x7f;
    expect_fail("huge header length", copy, g_ck_size, g_config, "header length");
    /* NaN and Inf in a CQ matrix and in an FP16 tensor */
    const float bad[] = {NAN, INFINITY, 1e30f};
    const char *where[] = {"embedding/embedding", "stack/layers/block/self_attn/q_proj/kernel",
                           "stack/final_norm/scale"};
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < 3; j++) {
            memcpy(copy, g_ck, g_ck_size);
            memcpy(copy + tensor_offset(where[j]) + 4 * 5, &bad[i], 4);
            char what[128];
            snprintf(what, sizeof what, "%g in %s", (double)bad[i], where[j]);
            expect_fail(what, copy, g_ck_size, g_config, NULL);
        }
    /* wrong shapes: the config disagrees with the tensors */
    const char *configs[][2] = {
        {"{\"vocab_size\": 512, \"d_model\": 100, \"num_heads\": 4, \"num_kv_heads\": 2, \"num_layers\": 4, "
         "\"max_seq_len\": 128, \"mhc_lanes\": 2, \"engram_slots\": 64, \"engram_layers\": [1]}",
         "shape"},
        {"{\"vocab_size\": 4000000000, \"d_model\": 96, \"num_heads\": 4, \"num_kv_heads\": 2, "
         "\"num_layers\": 4, "
         "\"max_seq_len\": 128, \"mhc_lanes\": 2, \"engram_slots\": 64, \"engram_layers\": [1]}",
         "shape"},
        {"{\"vocab_size\": 512, \"d_model\": 96, \"num_heads\": 4, \"num_kv_heads\": 2, \"num_layers\": 5, "
         "\"max_seq_len\": 128, \"mhc_lanes\": 2, \"engram_slots\": 64, \"engram_layers\": [1]}",
         "shape"},
        {"{\"vocab_size\": 512, \"d_model\": 96, \"num_heads\": 5, \"num_kv_heads\": 2, \"num_layers\": 4}",
         "multiple"},
        {"{\"vocab_size\": 512, \"d_model\": 96, \"num_heads\": 4, \"num_kv_heads\": 2, \"num_layers\": 4, "
         "\"max_seq_len\": 128, \"mhc_lanes\": 2, \"engram_slots\": 64, \"engram_layers\": [1,2,3,4,5]}",
         "engram"},
        {"{\"vocab_size\": -3}", "integer"},
        {"[1, 2]", "JSON object"},
        {"{\"d_model\": 96.5}", "integer"},
    };
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        expect_fail(configs[i][0], g_ck, g_ck_size, configs[i][0], configs[i][1]);
    /* a tensor missing: rename one in the header (same length) */
    memcpy(copy, g_ck, g_ck_size);
    char *hit = find_bytes(copy, g_ck_size, "final_norm");
    CHECK(hit != NULL);
    if (hit) memcpy(hit, "final_norX", 10);
    expect_fail("no final_norm", copy, g_ck_size, g_config, "final_norm");
    /* an unsupported dtype */
    memcpy(copy, g_ck, g_ck_size);
    hit = find_bytes(copy, g_ck_size, "\"F32\"");
    if (hit) memcpy(hit, "\"I32\"", 5);
    expect_fail("I32 tensor", copy, g_ck_size, g_config, "dtype");
    /* random byte mutations of the header: refused or exported, never a crash (ASan) */
    uint32_t rng = 12345;
    const uint64_t hlen = g_ck[0] | (uint64_t)g_ck[1] << 8 | (uint64_t)g_ck[2] << 16;
    for (int round = 0; round < 16; round++) {
        memcpy(copy, g_ck, g_ck_size);
        for (int k = 0; k < 4; k++) {
            rng = rng * 1103515245u + 12345u;
            const size_t at = 8 + (rng >> 8) % hlen;
            rng = rng * 1103515245u + 12345u;
            copy[at] = (uint8_t)(rng >> 16);
        }
        size_t size;
        int st;
        uint8_t *image = export_image(copy, g_ck_size, g_config, "default=2", 0, &size, &st);
        CHECK(st == 0 || (st < 0 && needle_last_error()[0]));
        free(image);
    }
    free(copy);
    free(g_ck);
    free(g_config);
}

static void test_hostile_tokenizer(void) {
    size_t size;
    uint8_t *model = read_file(fixture_path("tiny_bpe512.model"), &size), *blob = NULL;
    CHECK(model != NULL);
    if (!model) return;
    size_t bsize;
    uint32_t pieces;
    CHECK(spm_tokenizer_blob(model, size, &blob, &bsize, &pieces) == 0 && pieces == 512);
    /* the blob the official exporter embedded in tiny_cq4.cact */
    size_t csize;
    uint8_t *cact = read_file(fixture_path("tiny_cq4.cact"), &csize);
    cact_file f;
    CHECK(cact && cact_parse(cact, csize, &f) == 0);
    if (cact && f.tokenizer_index >= 0) {
        const cact_tensor *t = &f.tensors[f.tokenizer_index];
        CHECK(t->nbytes == bsize && memcmp(t->data, blob, bsize) == 0);
        cact_release(&f);
    }
    free(cact);
    free(blob);
    const size_t cuts[] = {1, 2, 3, 50, size / 2, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        blob = NULL;
        const int st = spm_tokenizer_blob(model, cuts[i], &blob, &bsize, &pieces);
        /* a cut can land on a field boundary and still be a (shorter) valid model */
        CHECK(st < 0 ? blob == NULL : pieces < 512);
        free(blob);
    }
    const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    CHECK(spm_tokenizer_blob(garbage, sizeof garbage, &blob, &bsize, &pieces) < 0);
    const uint8_t group[] = {0x0b, 0x0c}; /* a protobuf group: refused */
    CHECK(spm_tokenizer_blob(group, sizeof group, &blob, &bsize, &pieces) < 0);
    free(model);
}

/* ---- the CLI ------------------------------------------------------------------------- */

static void test_cli(void) {
    char cmd[4096], out[1 << 16];
    char tmp[] = "/tmp/needle_export_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(cmd, sizeof cmd,
             "%s export %s --config %s --bits default=4 -t %s -o %s/a.cact --json 2>/dev/null", cli_path(),
             export_path("tiny.safetensors"), export_path("tiny.config.json"),
             fixture_path("tiny_bpe512.model"), tmp);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    cJSON *j = cJSON_Parse(out);
    CHECK_MSG(j != NULL, "not JSON: %.200s", out);
    if (j) {
        CHECK(cJSON_GetObjectItem(j, "tensors") && cJSON_GetObjectItem(j, "tensors")->valueint == 79);
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, "cq")) == 1 + 5 * 4 + 3 + 3);
        cJSON_Delete(j);
    }
    snprintf(cmd, sizeof cmd, "%s/a.cact", tmp);
    size_t size;
    uint8_t *got = read_file(cmd, &size);
    cJSON *manifest = load_manifest("manifest.json");
    CHECK(manifest != NULL);
    compare_digest("needle export default=4", got, size, cJSON_GetObjectItem(manifest, "tiny_cq4.cact"),
                   "tiny_cq4.cact");
    free(got);
    /* quantize: the released-model map from a CQ4 file, with a table */
    snprintf(cmd, sizeof cmd,
             "%s quantize %s --bits default=2,embedding=4,mhc_phi=4 -o %s/b.cact 2>/dev/null", cli_path(),
             fixture_path("tinyb_cq4.cact"), tmp);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK(strstr(out, "layer2.q_proj") && strstr(out, "wrote"));
    snprintf(cmd, sizeof cmd, "%s/b.cact", tmp);
    got = read_file(cmd, &size);
    compare_digest("needle quantize", got, size, cJSON_GetObjectItem(manifest, "requant_tinyb_cq4.cact"),
                   "requant_tinyb_cq4.cact");
    cJSON_Delete(manifest);
    free(got);
    /* usage errors exit 2, bad data exits 1 and writes nothing */
    const char *usage[] = {"export", "export x.safetensors", "quantize x.cact -o y",
                           "quantize x --bits 5 -o y"};
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", cli_path(), usage[i]);
        CHECK_MSG(run_command(cmd, NULL, 0) == 2, "%s", usage[i]);
    }
    snprintf(cmd, sizeof cmd, "%s export %s --config %s -o %s/c.cact 2>/dev/null", cli_path(),
             export_path("tiny.safetensors"), export_path("tinyb.config.json"), tmp);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 1);
    snprintf(cmd, sizeof cmd, "%s/c.cact", tmp);
    CHECK(access(cmd, F_OK) != 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
}

int main(void) {
    if (cq_codebooks_init(&g_cb, 128) != 0) {
        fprintf(stderr, "codebooks: %s\n", needle_last_error());
        return 1;
    }
    RUN(test_codebooks);
    RUN(test_bits_map);
    RUN(test_export_identity);
    RUN(test_requantize_identity);
    RUN(test_round_trip);
    RUN(test_export_v3_identity);
    RUN(test_export_full);
    RUN(test_hostile_checkpoints);
    RUN(test_hostile_tokenizer);
    RUN(test_cli);
    return test_summary();
}
