/* The Needle 3 default model's tokenizer (train/data/needle3-tok4096.model, made by
 * train/train_tokenizer3.py) through needle's own path: the SentencePiece model turned
 * into a v3 .cact tokenizer blob by the exporter's spm_tokenizer_blob_v3, then the C
 * tokenizer. Checks
 *   - the special pieces sit at the official 3.x ids: pad/eos/bos/unk 0-3, the 16 chat
 *     markers 4-19 in the package's order, the 256 byte pieces 20-275, single digits;
 *   - every text of tests/fixtures/train3/tok4096.cases (rendered training and held-out
 *     examples, the held-out non-ASCII values, the alphabet lines, edge cases) encodes to
 *     the ids SentencePiece gave (tests/reference/make_tok3_cases.py);
 *   - a rendered prompt encoded as the engine does (up to "</tools>" with the dummy
 *     prefix, the rest as a continuation) gives the ids of encoding it whole, as the
 *     model is trained. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "export/spm_model.h"
#include "harness.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

#define MODEL NEEDLE_SOURCE_DIR "/train/data/needle3-tok4096.model"

static const char *const MARKERS[16] = {
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>", "</tools>",
    "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>", "<context>",
    "</context>", "<extract>", "</extract>", "<schema>", "</schema>"};

static tokenizer *tok;

static void test_blob(void) {
    size_t size = 0, blob_size = 0;
    uint8_t *model = read_file(MODEL, &size), *blob = NULL;
    uint32_t pieces = 0;
    CHECK_MSG(model != NULL, "cannot read %s", MODEL);
    if (!model) return;
    CHECK_MSG(spm_tokenizer_blob_v3(model, size, &blob, &blob_size, &pieces) == 0, "%s",
              needle_last_error());
    CHECK_EQ_INT(pieces, 4096);
    if (blob) CHECK_MSG(tokenizer_create(blob, blob_size, pieces, &tok) == 0, "%s", needle_last_error());
    free(blob);
    free(model);
}

static void test_special_ids(void) {
    if (!tok) {
        harness_skip("no tokenizer");
        return;
    }
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(tokenizer_special_id(tok, i), i);
    for (int i = 0; i < 16; i++) {
        CHECK_MSG(tokenizer_marker_id(tok, MARKERS[i]) == 4 + i, "%s at %d", MARKERS[i],
                  tokenizer_marker_id(tok, MARKERS[i]));
        CHECK_EQ_INT(tokenizer_piece_type(tok, 4 + i), TOKENIZER_USER_DEFINED);
    }
    for (int b = 0; b < 256; b++) {
        const char *bytes;
        size_t len;
        CHECK_EQ_INT(tokenizer_piece_type(tok, 20 + b), TOKENIZER_BYTE);
        CHECK(tokenizer_token_bytes(tok, 20 + b, &bytes, &len) == 0 && len == 1 &&
              (uint8_t)bytes[0] == b);
    }
    /* digits are split: no piece holds two digits */
    for (int32_t id = 276; id < 4096; id++) {
        size_t len;
        const char *p = tokenizer_piece(tok, id, &len);
        int digits = 0;
        for (size_t i = 0; p && i < len; i++) digits += p[i] >= '0' && p[i] <= '9';
        CHECK_MSG(digits <= 1, "piece %d '%s' holds %d digits", id, p, digits);
    }
}

static int ids_match(const char *text, const cJSON *want, char *why, size_t cap) {
    size_t n = 0, len = strlen(text), nwant = (size_t)cJSON_GetArraySize(want);
    int32_t *ids = malloc((len + 1) * 4 * sizeof *ids);
    int rc = tokenizer_encode(tok, text, len, ids, (len + 1) * 4, &n);
    int ok = rc == 0 && n == nwant;
    for (size_t i = 0; ok && i < n; i++)
        if (ids[i] != cJSON_GetArrayItem(want, (int)i)->valueint) {
            snprintf(why, cap, "id %zu: %d, SentencePiece %d", i, ids[i],
                     cJSON_GetArrayItem(want, (int)i)->valueint);
            ok = 0;
        }
    if (!ok && rc) snprintf(why, cap, "encode failed: %s", needle_last_error());
    else if (!ok && n != nwant && !why[0]) snprintf(why, cap, "%zu ids, SentencePiece %zu", n, nwant);
    free(ids);
    return ok;
}

static void test_cases(void) {
    if (!tok) {
        harness_skip("no tokenizer");
        return;
    }
    size_t size = 0;
    char *data = (char *)read_file(fixture_path("train3/tok4096.cases"), &size);
    CHECK_MSG(data != NULL, "cannot read %s", fixture_path("train3/tok4096.cases"));
    if (!data) return;
    int cases = 0, prompts = 0;
    for (char *line = data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        cJSON *row = cJSON_Parse(line);
        CHECK_MSG(cJSON_IsArray(row) && cJSON_GetArraySize(row) == 2, "bad case line %d", cases + 1);
        if (!cJSON_IsArray(row)) {
            cJSON_Delete(row);
            break;
        }
        const char *text = cJSON_GetArrayItem(row, 0)->valuestring;
        char why[160] = "";
        CHECK_MSG(ids_match(text, cJSON_GetArrayItem(row, 1), why, sizeof why),
                  "case %d (%.60s...): %s", cases + 1, text, why);
        cases++;
        /* the engine's split of a prompt: [.. </tools>] with the dummy prefix, the rest
         * as a continuation */
        const char *cut = strstr(text, "</tools>");
        if (cut && !strncmp(text, "<|im_start|>", 12)) {
            size_t head = (size_t)(cut - text) + 8, len = strlen(text), n1 = 0, n2 = 0;
            int32_t *a = malloc((len + 1) * 4 * sizeof *a), *b = malloc((len + 1) * 4 * sizeof *b);
            size_t whole = 0;
            CHECK(tokenizer_encode(tok, text, len, a, (len + 1) * 4, &whole) == 0);
            CHECK(tokenizer_encode_ex(tok, text, head, 1, b, (len + 1) * 4, &n1) == 0);
            CHECK(tokenizer_encode_ex(tok, text + head, len - head, 0, b + n1, (len + 1) * 4 - n1, &n2) == 0);
            CHECK_MSG(whole == n1 + n2 && !memcmp(a, b, whole * sizeof *a),
                      "case %d: the engine's split encoding differs from the whole", cases);
            prompts++;
            free(a);
            free(b);
        }
        cJSON_Delete(row);
    }
    CHECK_MSG(cases >= 200, "only %d cases", cases);
    CHECK_MSG(prompts >= 60, "only %d prompts", prompts);
    free(data);
}

int main(void) {
    RUN(test_blob);
    RUN(test_special_ids);
    RUN(test_cases);
    tokenizer_free(tok);
    return test_summary();
}
