/* Needle 3 files through the exporter library and `needle quantize`:
 *
 * - ladder rungs written as their own files (cact3_rung, `needle quantize --depth`),
 *   byte-identical to the official rung exports committed in tests/fixtures/v3/;
 * - the round trip: `needle export --v3` of the committed export checkpoints, loaded by our
 *   engine, gives the official 3.2.8 forward's logits (of the official file, read back)
 *   within 1e-3 of the largest logit, the same argmax everywhere and the same greedy
 *   continuation (tests/reference/make_export_fixtures_v3.py records them);
 * - re-quantization: CQ4 of a CQ4 file equals the official read_export -> write_export
 *   (size + SHA-256 in manifest_v3.json); CQ3 / CQ2 / mixed maps (no official writer)
 *   load back, keep the probe heads at CQ4, and their error report grows as the width
 *   shrinks. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "export/cact_write.h"
#include "export/export_model_v3.h"
#include "export/requantize.h"
#include "export/rung.h"
#include "export/safetensors.h"
#include "export/spm_model.h"
#include "format/cact.h"
#include "harness.h"
#include "needle.h"
#include "quant/bits_map.h"
#include "quant/cq_codebook.h"
#include "sha256.h"

#define TOLERANCE 1e-3

static const char *export_path(const char *name) {
    static char buf[4][1024];
    static int slot;
    char *b = buf[slot++ % 4];
    snprintf(b, sizeof buf[0], "%s/export/%s", fixture_dir(), name);
    return b;
}

static cJSON *load_json(const char *path) {
    size_t n;
    char *text = (char *)read_file(path, &n);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

/* The rung of `parent` at `depth`, serialized (malloc'd), or NULL with the status. */
static uint8_t *rung_of(const uint8_t *parent, size_t size, uint32_t depth, size_t *out_size, int *status) {
    cact_file in;
    uint8_t *image = NULL;
    *out_size = 0;
    *status = cact_parse(parent, size, &in);
    if (*status) return NULL;
    cact_writer w;
    cw_init(&w);
    *status = cact3_rung(&in, depth, &w);
    if (!*status) *status = cw_serialize(&w, &image, out_size);
    cw_release(&w);
    cact_release(&in);
    return image;
}

static void test_rung_identity(void) {
    const struct {
        const char *parent, *rung;
        uint32_t depth, layers;
    } cases[2] = {{"v3/v3a.cact", "v3/v3a_rung3.cact", 3, 5}, {"v3/v3c.cact", "v3/v3c_rung2.cact", 2, 3}};
    for (int i = 0; i < 2; i++) {
        size_t np, nr, size;
        uint8_t *parent = read_file(fixture_path(cases[i].parent), &np);
        uint8_t *official = read_file(fixture_path(cases[i].rung), &nr);
        CHECK(parent && official);
        if (!parent || !official) {
            free(parent);
            free(official);
            continue;
        }
        int st;
        uint8_t *ours = rung_of(parent, np, cases[i].depth, &size, &st);
        CHECK_MSG(st == 0, "%s at depth %u: %s", cases[i].parent, cases[i].depth, needle_last_error());
        size_t first = 0;
        while (ours && first < size && first < nr && ours[first] == official[first]) first++;
        CHECK_MSG(ours && size == nr && first == nr, "%s: %zu bytes vs official %zu, first difference at %zu",
                  cases[i].rung, size, nr, first);
        free(ours);
        /* the full depth keeps every layer in file order: the parent itself */
        ours = rung_of(parent, np, cases[i].layers, &size, &st);
        CHECK(st == 0 && ours && size == np && !memcmp(ours, parent, np));
        free(ours);
        /* depths outside the ladder */
        CHECK(!rung_of(parent, np, 1, &size, &st) && st < 0 && strstr(needle_last_error(), "depths 2 to"));
        CHECK(!rung_of(parent, np, cases[i].layers + 1, &size, &st) && st < 0);
        free(parent);
        free(official);
    }
    /* a Needle 2 file has no ladder */
    size_t n, size;
    uint8_t *v2 = read_file(fixture_path("tiny_cq4.cact"), &n);
    int st;
    CHECK(v2 && !rung_of(v2, n, 2, &size, &st) && st < 0 && strstr(needle_last_error(), "Needle 3"));
    free(v2);
}

/* exports v3_<geom> at `bits` with the tokenizer of the official export */
static uint8_t *export_v3(const char *geom, const char *bits, const cq_codebooks *cb, size_t *size) {
    char name[64];
    size_t ck_size;
    snprintf(name, sizeof name, "v3_%s.safetensors", geom);
    uint8_t *ck = read_file(export_path(name), &ck_size), *image = NULL;
    snprintf(name, sizeof name, "v3_%s.config.json", geom);
    char *config = (char *)read_file(export_path(name), &(size_t){0});
    st_file f;
    export3_config cfg;
    bits_map map;
    size_t msize, tok_size = 0;
    uint8_t *model = read_file(fixture_path("tiny_bpe512.model"), &msize), *tok = NULL;
    uint32_t pieces = 0;
    int st = model ? spm_tokenizer_blob_v3(model, msize, &tok, &tok_size, &pieces) : -1;
    free(model);
    if (!st) st = ck && config ? st_parse(ck, ck_size, &f) : -1;
    if (!st) {
        if (!(st = export3_config_parse(config, strlen(config), &cfg)) && !(st = bits_map_parse(bits, &map))) {
            cact_writer w;
            cw_init(&w);
            const export_options opt = {.bits = &map,
                                        .kv_window = export3_effective_kv_window(&cfg),
                                        .tokenizer = tok,
                                        .tokenizer_size = tok_size,
                                        .tokenizer_pieces = pieces};
            if (!(st = export3_build(&f, &cfg, cb, &opt, &w))) st = cw_serialize(&w, &image, size);
            cw_release(&w);
        }
        st_release(&f);
    }
    CHECK_MSG(st == 0 && image, "v3_%s at %s: %s", geom, bits, needle_last_error());
    free(tok);
    free(ck);
    free(config);
    return image;
}

/* Worst |ours - reference| / max|reference| over every position of every case of
 * export/v3_<geom>.json, for the model in `image`; checks argmax and greedy as it goes.
 * Returns -1 when nothing ran. */
static double logit_error(const char *geom, const uint8_t *image, size_t size, int exact_argmax) {
    char name[64];
    snprintf(name, sizeof name, "v3_%s.json", geom);
    cJSON *doc = load_json(export_path(name));
    needle_model *m = NULL;
    CHECK(doc != NULL);
    CHECK_MSG(image && needle_model_open_blob(image, size, NULL, &m) == NEEDLE_OK, "v3_%s: %s", geom,
              needle_last_error());
    double worst = -1;
    const cJSON *cases = doc ? cJSON_GetObjectItem(doc, "cases") : NULL, *c;
    int n_cases = 0;
    needle_model_info info = {.size = sizeof info};
    if (m) CHECK_EQ_INT(needle_model_get_info(m, &info), NEEDLE_OK);
    cJSON_ArrayForEach(c, cases) {
        if (!m) break;
        const cJSON *toks = cJSON_GetObjectItem(c, "tokens"), *t;
        const uint32_t n = (uint32_t)cJSON_GetArraySize(toks), cols = (uint32_t)cJSON_GetObjectItem(c, "cols")->valuedouble;
        const uint32_t V = info.vocab;
        CHECK_EQ_INT(cols, info.out_vocab);
        int32_t *ids = malloc(n * sizeof *ids);
        uint32_t k = 0;
        cJSON_ArrayForEach(t, toks) ids[k++] = (int32_t)t->valuedouble;
        size_t ref_size;
        float *ref = (float *)read_file(export_path(cJSON_GetObjectItem(c, "logits")->valuestring), &ref_size);
        float *logits = malloc(((size_t)n + 1) * V * sizeof *logits);
        needle_session_params sp = needle_session_default_params();
        needle_session *s = NULL;
        CHECK(ref && ref_size == (size_t)n * cols * sizeof(float) && cols <= V);
        if (ref && ref_size == (size_t)n * cols * sizeof(float) && cols <= V &&
            needle_session_create(m, &sp, &s) == NEEDLE_OK &&
            needle_session_eval(s, ids, n, logits, (size_t)n * V) == NEEDLE_OK) {
            const cJSON *argmax = cJSON_GetObjectItem(c, "argmax");
            for (uint32_t p = 0; p < n; p++) {
                double top = 0, err = 0;
                uint32_t best = 0;
                for (uint32_t v = 0; v < cols; v++) {
                    const double r = ref[(size_t)p * cols + v], o = logits[(size_t)p * V + v];
                    top = fmax(top, fabs(r));
                    err = fmax(err, fabs(o - r));
                    if (o > logits[(size_t)p * V + best]) best = v;
                }
                worst = fmax(worst, err / fmax(top, 1e-30));
                if (exact_argmax)
                    CHECK_EQ_INT((int)best, (int)cJSON_GetArrayItem(argmax, (int)p)->valuedouble);
            }
            if (exact_argmax) {
                /* the greedy continuation, one token at a time from the prompt's last logits */
                const cJSON *greedy = cJSON_GetObjectItem(c, "greedy"), *g;
                const float *row = logits + (size_t)(n - 1) * V;
                cJSON_ArrayForEach(g, greedy) {
                    int32_t next = 0;
                    for (uint32_t v = 1; v < cols; v++)
                        if (row[v] > row[next]) next = (int32_t)v;
                    CHECK_EQ_INT(next, (int)g->valuedouble);
                    if (needle_session_eval(s, &next, 1, logits, V) != NEEDLE_OK) break;
                    row = logits;
                }
            }
        } else {
            CHECK_MSG(0, "v3_%s case %d did not run: %s", geom, n_cases, needle_last_error());
        }
        needle_session_free(s);
        free(logits);
        free(ref);
        free(ids);
        n_cases++;
    }
    CHECK(n_cases >= 2);
    needle_model_free(m);
    cJSON_Delete(doc);
    return worst;
}

static void test_round_trip(void) {
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, 128) == 0);
    const char *geoms[2] = {"a", "b"};
    for (int g = 0; g < 2; g++) {
        size_t size = 0;
        uint8_t *image = export_v3(geoms[g], "4", &cb, &size);
        const double worst = logit_error(geoms[g], image, size, 1);
        CHECK_MSG(worst >= 0 && worst <= TOLERANCE, "v3_%s: worst relative logit error %.3g", geoms[g], worst);
        printf("  v3_%s export -> load: worst |ours - official| / max|logit| = %.2g\n", geoms[g], worst);
        free(image);
    }
}

static double total_rel_error(const cact_writer *w, const double *rel) {
    double sum = 0;
    for (uint32_t i = 0; i < w->n; i++)
        if (rel[i] >= 0) sum += rel[i] * rel[i];
    return sqrt(sum);
}

typedef struct rel_log {
    double rel[1024];
} rel_log;

static void on_tensor(void *user, uint32_t index, uint32_t count, const cw_tensor *t, double rel) {
    (void)count;
    (void)t;
    if (index < 1024) ((rel_log *)user)->rel[index] = rel;
}

static void test_requantize(void) {
    cq_codebooks cb;
    CHECK(cq_codebooks_init(&cb, 128) == 0);
    cJSON *manifest = load_json(export_path("manifest_v3.json"));
    CHECK(manifest != NULL);
    const char *geoms[2] = {"a", "b"};
    for (int g = 0; g < 2; g++) {
        size_t size = 0;
        uint8_t *image = export_v3(geoms[g], "4", &cb, &size);
        char name[64];
        snprintf(name, sizeof name, "v3_%s.cact", geoms[g]);
        const cJSON *entry = cJSON_GetObjectItem(cJSON_GetObjectItem(manifest, name), "requantized");
        CHECK_MSG(entry != NULL, "%s: no requantized entry in manifest_v3.json", name);
        uint8_t *with_tok = image; /* the tokenizer is copied, as write_export re-packs it */
        const size_t with_tok_size = size;
        const char *maps[4] = {"4", "3", "2", "default=2,embedding=4,mhc_phi=4"};
        double totals[4] = {0};
        for (int k = 0; k < 4; k++) {
            bits_map map;
            CHECK(bits_map_parse(maps[k], &map) == 0);
            cact_writer w;
            cw_init(&w);
            rel_log log;
            for (int i = 0; i < 1024; i++) log.rel[i] = -1;
            uint8_t *out = NULL;
            size_t out_size = 0;
            CHECK_MSG(with_tok && cact_requantize_image(with_tok, with_tok_size, &map, on_tensor, &log, &w) == 0,
                      "%s at %s: %s", name, maps[k], needle_last_error());
            CHECK(cw_serialize(&w, &out, &out_size) == 0);
            CHECK_MSG(out && cact_check_image(out, out_size) == 0, "%s at %s: %s", name, maps[k], needle_last_error());
            totals[k] = total_rel_error(&w, log.rel);
            if (k == 0 && entry && out) {
                char hex[65];
                sha256_hex(out, out_size, hex);
                const cJSON *digest = cJSON_GetObjectItem(entry, "sha256"), *bytes = cJSON_GetObjectItem(entry, "bytes");
                CHECK_MSG(cJSON_IsString(digest) && cJSON_IsNumber(bytes) && out_size == (size_t)bytes->valuedouble &&
                              !strcmp(hex, digest->valuestring),
                          "%s re-quantized at CQ4: %zu bytes, %s; official %s", name, out_size, hex,
                          cJSON_IsString(digest) ? digest->valuestring : "?");
            }
            /* the probe heads stay CQ4 whatever the map */
            uint32_t heads = 0;
            for (uint32_t i = 0; i < w.n; i++)
                if (strstr(w.tensors[i].name, "_head.") && w.tensors[i].dtype == CACT_CQ) {
                    CHECK_EQ_INT(w.tensors[i].bits, 4);
                    heads++;
                }
            CHECK(heads > 0);
            if (out) {
                const double worst = logit_error(geoms[g], out, out_size, 0);
                printf("  %s re-quantized to %s: error report %.3f, logits vs official %.2g\n", name, maps[k],
                       totals[k], worst);
                CHECK(worst >= 0);
            }
            free(out);
            cw_release(&w);
        }
        /* fewer bits, more error; the mixed map lies between CQ2 and CQ4 */
        CHECK_MSG(totals[0] < totals[1] && totals[1] < totals[2], "%s: errors %.3f %.3f %.3f", name, totals[0],
                  totals[1], totals[2]);
        CHECK(totals[3] > totals[0] && totals[3] < totals[2]);
        free(image);
    }
    cJSON_Delete(manifest);
}

/* `needle quantize --depth` writes the official rung file; a v2 file is refused and
 * nothing is written; `needle export --v3` writes the official file */
/* Every record kind is decoded as the reader does before re-quantizing: v3d (binary,
 * ternary, CQ2-4 records) re-quantized at CQ4 keeps each CQ tensor within CQ4's error of
 * what the engine decodes from the input (a kind decoded wrongly, e.g. binary as zeros,
 * would be 100% off). */
static void test_requantize_every_record_kind(void) {
    size_t size = 0;
    uint8_t *image = read_file(fixture_path("v3/v3d.cact"), &size);
    CHECK(image != NULL);
    if (!image) return;
    bits_map map;
    CHECK(bits_map_parse("4", &map) == 0);
    cact_writer w;
    cw_init(&w);
    uint8_t *out = NULL;
    size_t out_size = 0;
    CHECK_MSG(cact_requantize_image(image, size, &map, NULL, NULL, &w) == 0, "%s", needle_last_error());
    CHECK(cw_serialize(&w, &out, &out_size) == 0);
    needle_model *a = NULL, *b = NULL;
    CHECK_EQ_INT(needle_model_open_blob(image, size, NULL, &a), NEEDLE_OK);
    CHECK_EQ_INT(out ? needle_model_open_blob(out, out_size, NULL, &b) : -1, NEEDLE_OK);
    needle_model_info info = {.size = sizeof info};
    uint32_t kinds = 0, checked = 0;
    if (a && b && needle_model_get_info(a, &info) == NEEDLE_OK)
        for (uint32_t i = 0; i < info.num_tensors; i++) {
            needle_tensor_info ta = {.size = sizeof ta}, tb = {.size = sizeof tb};
            if (needle_model_get_tensor(a, i, &ta) || needle_model_get_tensor(b, i, &tb) ||
                ta.dtype != NEEDLE_DTYPE_CQ)
                continue;
            CHECK_EQ_INT(tb.bits, 4);
            kinds |= 1u << ta.bits;
            size_t n = 0;
            CHECK_EQ_INT(needle_model_decode_tensor(a, i, NULL, 0, &n), NEEDLE_ERR_BUFFER_TOO_SMALL);
            float *wa = malloc(n * sizeof *wa), *wb = malloc(n * sizeof *wb);
            size_t na = 0, nb = 0;
            CHECK_EQ_INT(needle_model_decode_tensor(a, i, wa, n, &na), NEEDLE_OK);
            CHECK_EQ_INT(needle_model_decode_tensor(b, i, wb, n, &nb), NEEDLE_OK);
            double err = 0, ref = 0;
            for (size_t k = 0; k < n && na == n && nb == n; k++) {
                err += ((double)wb[k] - wa[k]) * ((double)wb[k] - wa[k]);
                ref += (double)wa[k] * wa[k];
            }
            const double rel = ref > 0 ? sqrt(err / ref) : 1.0;
            CHECK_MSG(rel < 0.2, "%s (bits %u) re-quantized at CQ4: relative error %.3f", ta.name,
                      ta.bits, rel);
            checked++;
            free(wa);
            free(wb);
        }
    CHECK_EQ_INT(kinds, (1u << 1) | (1u << 2) | (1u << 3) | (1u << 4) | (1u << 5));
    CHECK(checked >= 5);
    needle_model_free(a);
    needle_model_free(b);
    free(out);
    cw_release(&w);
    free(image);
}

static void test_cli(void) {
    char tmp[] = "/tmp/needle_export_v3_XXXXXX", cmd[4096], path[256];
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(cmd, sizeof cmd, "%s quantize %s --depth 3 -o %s/r.cact -q >/dev/null", cli_path(),
             fixture_path("v3/v3a.cact"), tmp);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
    snprintf(path, sizeof path, "%s/r.cact", tmp);
    size_t n, nr;
    uint8_t *got = read_file(path, &n), *official = read_file(fixture_path("v3/v3a_rung3.cact"), &nr);
    CHECK(got && official && n == nr && !memcmp(got, official, n));
    free(got);
    free(official);
    snprintf(cmd, sizeof cmd, "%s quantize %s --depth 2 -o %s/v2.cact 2>/dev/null", cli_path(),
             fixture_path("tiny_cq4.cact"), tmp);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 1);
    snprintf(path, sizeof path, "%s/v2.cact", tmp);
    CHECK(access(path, F_OK) != 0);
    snprintf(cmd, sizeof cmd, "%s quantize %s -o %s/x.cact 2>/dev/null", cli_path(), fixture_path("v3/v3a.cact"),
             tmp);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 2); /* neither --bits nor --depth */
    /* `needle export --v3` checks the v3 file with the engine's loader before writing it */
    snprintf(cmd, sizeof cmd, "%s export %s --config %s --v3 -t %s -o %s/e.cact -q >/dev/null", cli_path(),
             export_path("v3_a.safetensors"), export_path("v3_a.config.json"), fixture_path("tiny_bpe512.model"),
             tmp);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
    snprintf(path, sizeof path, "%s/e.cact", tmp);
    got = read_file(path, &n);
    cJSON *manifest = load_json(export_path("manifest_v3.json"));
    const cJSON *digest = cJSON_GetObjectItem(cJSON_GetObjectItem(manifest, "v3_a.cact"), "sha256");
    char hex[65] = "";
    if (got) sha256_hex(got, n, hex);
    CHECK(got && cJSON_IsString(digest) && !strcmp(hex, digest->valuestring));
    cJSON_Delete(manifest);
    free(got);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
}

int main(void) {
    RUN(test_rung_identity);
    RUN(test_round_trip);
    RUN(test_requantize);
    RUN(test_requantize_every_record_kind);
    RUN(test_cli);
    return test_summary();
}
