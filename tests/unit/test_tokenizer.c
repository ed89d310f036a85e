/* Tokenizer tests: ids against the reference encoder's fixtures, decode round trips, the
 * heap-based BPE against a naive O(n^2) scan on a vocabulary full of score ties, expected
 * ids computed by the reference on a synthetic blob, hostile blobs, and bad arguments.
 * The .cact fixtures are read with a tiny header/directory walk of our own (spec §1.1,
 * §1.3) so this test does not depend on the model loader. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

#define META "\xE2\x96\x81"

/* ---- helpers ---------------------------------------------------------------------- */

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* The RAW tokenizer blob of a .cact image: the last directory record, if its dtype is 4. */
static int find_raw_blob(const uint8_t *d, size_t size, const uint8_t **blob, size_t *n, uint32_t *vocab) {
    if (size < 120 || le32(d) != 0x05E12A83u) return 0;
    uint64_t nt = le32(d + 4), dir = 120 + 4 * (uint64_t)le32(d + 8);
    if (nt == 0 || dir + 44 * nt > size) return 0;
    const uint8_t *rec = d + dir + 44 * (nt - 1);
    uint64_t off = le64(rec + 20), nb = le64(rec + 28);
    if (rec[0] != 4 || off > size || nb > size - off) return 0;
    *blob = d + off;
    *n = (size_t)nb;
    *vocab = le32(d + 20);
    return 1;
}

/* Tokenizer of fixture `cact`, or NULL (a failed check is recorded). */
static tokenizer *fixture_tokenizer(const char *cact) {
    size_t size = 0, n = 0;
    uint8_t *data = read_file(fixture_path(cact), &size);
    const uint8_t *blob = NULL;
    uint32_t vocab = 0;
    tokenizer *tok = NULL;
    CHECK_MSG(data != NULL, "cannot read fixture %s", fixture_path(cact));
    if (!data) return NULL;
    CHECK_MSG(find_raw_blob(data, size, &blob, &n, &vocab), "%s: no RAW tokenizer record", cact);
    if (blob) CHECK_MSG(tokenizer_create(blob, n, vocab, &tok) == 0, "%s: %s", cact, needle_last_error());
    free(data);
    return tok;
}

/* The reference decode of encode(s) is s with U+2581 turned into spaces. */
static char *expected_round_trip(const char *s, size_t len, size_t *out_len) {
    char *r = malloc(len + 1), *w = r;
    for (size_t i = 0; i < len;) {
        int meta = len - i >= 3 && memcmp(s + i, META, 3) == 0;
        *w++ = meta ? ' ' : s[i];
        i += meta ? 3 : 1;
    }
    *w = '\0';
    *out_len = (size_t)(w - r);
    return r;
}

/* Encodes, checks the count query, decodes and checks the round trip. Returns malloc'd ids. */
static int32_t *encode_round_trip(const tokenizer *tok, const char *s, size_t len, size_t *n_ids) {
    size_t n = 0, m = 0, dlen = 0, elen = 0;
    int rc = tokenizer_encode(tok, s, len, NULL, 0, &n);
    CHECK(rc == (n ? NEEDLE_ERR_BUFFER_TOO_SMALL : NEEDLE_OK));
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    CHECK_EQ_INT(tokenizer_encode(tok, s, len, ids, n, &m), 0);
    CHECK_EQ_INT(m, n);
    char *want = expected_round_trip(s, len, &elen);
    char *got = malloc(4 * len + 16);
    CHECK_EQ_INT(tokenizer_decode(tok, ids, n, got, 4 * len + 16, &dlen), 0);
    CHECK_MSG(dlen == elen && memcmp(got, want, elen) == 0 && got[dlen] == '\0', "round trip of \"%.60s\"", s);
    free(want);
    free(got);
    *n_ids = n;
    return ids;
}

/* ---- synthetic blobs -------------------------------------------------------------- */

typedef struct spec_piece {
    const char *text;
    int type;
    float score;
} spec_piece;

/* 21 pieces with many tied scores, a duplicate "ab" (id 18 must win), two markers sharing
 * a prefix, then the 256 byte pieces at ids 21..276. */
static const spec_piece base_pieces[] = {
    {"<pad>", 2, 0}, {"</s>", 2, 0}, {"<s>", 2, 0}, {"<unk>", 1, 0}, {"<m>", 3, 0}, {"<mm>", 3, 0},
    {META, 0, -1}, {"a", 0, -1}, {"b", 0, -1}, {"c", 0, -1}, {"ab", 0, -2}, {"bc", 0, -2},
    {"ca", 0, -2}, {"aa", 0, -2}, {"abc", 0, -3}, {META "a", 0, -2}, {"aaa", 0, -1.5f},
    {"cab", 0, -2}, {"ab", 0, -1.75f}, {"<m", 0, -5}, {"\xC3\xA9", 0, -1}};
#define N_BASE 21
#define BYTE0 21

typedef struct buf {
    uint8_t *p;
    size_t n;
} buf;

static void put(buf *b, const void *src, size_t n) {
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put32(buf *b, uint32_t v) {
    uint8_t u[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, u, 4);
}

static void put_piece(buf *b, const char *text, size_t len, int type, float score) {
    uint32_t s;
    memcpy(&s, &score, 4);
    put32(b, s);
    uint8_t r[3] = {(uint8_t)type, (uint8_t)len, (uint8_t)(len >> 8)};
    put(b, r, 3);
    put(b, text, len);
}

/* Pieces with U+2581 past their start: they disable the encoder's cut before each U+2581. */
static const spec_piece inner_meta[] = {{"c" META "a", 0, -2}, {"b" META, 0, -2.5f}};

/* Serialises the base pieces (plus byte pieces if with_bytes, plus inner_meta after them if
 * with_inner) into a malloc'd blob. */
static buf synth_blob2(int with_bytes, int dummy, int fallback, int with_inner) {
    buf b = {malloc(8192), 0};
    uint32_t n = N_BASE + (with_bytes ? 256 : 0) + (with_inner ? 2 : 0);
    put32(&b, n);
    for (uint32_t k = 0; k < 4; k++) put32(&b, k);
    uint8_t flags[4] = {(uint8_t)dummy, (uint8_t)fallback, 0, 0};
    put(&b, flags, 4);
    for (int i = 0; i < N_BASE; i++)
        put_piece(&b, base_pieces[i].text, strlen(base_pieces[i].text), base_pieces[i].type, base_pieces[i].score);
    for (int v = 0; with_bytes && v < 256; v++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", v);
        put_piece(&b, name, 6, 4, 0);
    }
    for (int i = 0; with_inner && i < 2; i++)
        put_piece(&b, inner_meta[i].text, strlen(inner_meta[i].text), inner_meta[i].type, inner_meta[i].score);
    return b;
}

static buf synth_blob(int with_bytes, int dummy, int fallback) { return synth_blob2(with_bytes, dummy, fallback, 0); }

static tokenizer *synth_tokenizer2(int with_bytes, int dummy, int fallback, int with_inner) {
    buf b = synth_blob2(with_bytes, dummy, fallback, with_inner);
    tokenizer *tok = NULL;
    CHECK_MSG(tokenizer_create(b.p, b.n, le32(b.p), &tok) == 0, "%s", needle_last_error());
    free(b.p);
    return tok;
}

static tokenizer *synth_tokenizer(int with_bytes, int dummy, int fallback) {
    return synth_tokenizer2(with_bytes, dummy, fallback, 0);
}

/* ---- reference fixtures ----------------------------------------------------------- */

/* A case whose text holds U+0000 (cJSON cuts the C string there): the reference encodes
 * it, we reject it by design. Detected from the reference ids, whose decoding is the text
 * (U+2581 aside); returns 1 after checking the rejection. */
static int nul_case(const tokenizer *tok, const char *visible, const cJSON *want) {
    size_t n = (size_t)cJSON_GetArraySize(want), len = 0, vis = strlen(visible), k = 0;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    const cJSON *v;
    cJSON_ArrayForEach(v, want) ids[k++] = (int32_t)v->valueint;
    char *text = malloc(64 * n + 16);
    int is_nul = tokenizer_decode(tok, ids, n, text, 64 * n + 16, &len) == 0 && strlen(text) < len;
    if (is_nul) {
        size_t got = 0;
        CHECK_MSG(vis < len && memcmp(text, visible, vis) == 0 && text[vis] == '\0', "NUL case \"%s\"", visible);
        CHECK_EQ_INT(tokenizer_encode(tok, text, len, ids, n, &got), NEEDLE_ERR_INVALID_UTF8);
    }
    free(ids);
    free(text);
    return is_nul;
}

static void check_cases_file(const char *name) {
    size_t size = 0;
    char *json = (char *)read_file(fixture_path(name), &size);
    CHECK_MSG(json != NULL, "missing fixture %s", fixture_path(name));
    if (!json) return;
    cJSON *root = cJSON_Parse(json);
    free(json);
    const cJSON *cact = cJSON_GetObjectItemCaseSensitive(root, "cact");
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    CHECK_MSG(cJSON_IsString(cact) && cJSON_IsArray(cases), "%s: bad layout", name);
    tokenizer *tok = cJSON_IsString(cact) && cJSON_IsArray(cases) ? fixture_tokenizer(cact->valuestring) : NULL;
    int n_cases = 0, bad = 0, n_nul = 0;
    const cJSON *c;
    const cJSON *list = tok ? cases : NULL;
    cJSON_ArrayForEach(c, list) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(c, "text");
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "ids");
        CHECK(cJSON_IsString(text) && cJSON_IsArray(want));
        if (!cJSON_IsString(text) || !cJSON_IsArray(want)) continue;
        size_t n = 0, len = strlen(text->valuestring);
        if (nul_case(tok, text->valuestring, want)) {
            n_nul++;
            continue;
        }
        int32_t *ids = encode_round_trip(tok, text->valuestring, len, &n);
        int same = n == (size_t)cJSON_GetArraySize(want);
        for (size_t i = 0; same && i < n; i++)
            same = ids[i] == cJSON_GetArrayItem(want, (int)i)->valueint;
        if (!same && bad++ < 5) CHECK_MSG(0, "%s: ids differ for \"%.80s\"", name, text->valuestring);
        free(ids);
        n_cases++;
    }
    CHECK_MSG(bad == 0, "%s: %d of %d cases differ", name, bad, n_cases);
    if (n_nul) printf("     %s: %d case(s) with NUL, rejected by design\n", name, n_nul);
    CHECK_MSG(!tok || n_cases > 0, "%s: no cases", name);
    tokenizer_free(tok);
    cJSON_Delete(root);
}

static void test_fixture_tiny(void) { check_cases_file("tokenizer_cases_tiny.json"); }
static void test_fixture_full(void) { check_cases_file("tokenizer_cases_full.json"); }

/* ---- synthetic vocabulary --------------------------------------------------------- */

typedef struct expect {
    const char *text;
    int32_t ids[8];
    size_t n;
} expect;

static void check_expect(const tokenizer *tok, const expect *e, size_t count) {
    for (size_t i = 0; i < count; i++) {
        size_t n = 0;
        int32_t *ids = encode_round_trip(tok, e[i].text, strlen(e[i].text), &n);
        int same = n == e[i].n;
        for (size_t k = 0; same && k < n; k++) same = ids[k] == e[i].ids[k];
        CHECK_MSG(same, "ids of \"%s\"", e[i].text);
        free(ids);
    }
}

/* Expected ids were computed by the reference RefTokenizer on the same synthetic blobs. */
static void test_synthetic_reference(void) {
    static const expect with_prefix[] = {
        {"abcabc", {6, 18, 17, 9}, 4}, {"aaaa", {15, 16}, 2}, {"aaaaa", {15, 16, 7}, 3},
        {"cabab", {6, 17, 18}, 3}, {"a b c", {15, 6, 8, 6, 9}, 5}, {"<m><mm><m", {6, 4, 5, 19}, 4},
        {"<mmm>", {6, 19, 130, 130, 83}, 5}, {"x<m>y\xC3\xA9", {6, 141, 4, 142, 20}, 5},
        {" aa", {6, 15, 7}, 3}, {"bcab", {6, 11, 18}, 3}, {"abcaab", {6, 18, 12, 18}, 4},
        {"<m", {6, 19}, 2}, {"caaab", {6, 12, 7, 18}, 4}, {"", {0}, 0}};
    static const expect bare[] = { /* no dummy prefix, no byte fallback: OOV -> unk (3) */
        {"abcabc", {18, 17, 9}, 3}, {"aaaa", {16, 7}, 2}, {"aaaaa", {16, 13}, 2}, {"cabab", {17, 18}, 2},
        {"a b c", {7, 6, 8, 6, 9}, 5}, {"<m><mm><m", {4, 5, 19}, 3}, {"<mmm>", {19, 3, 3, 3}, 4},
        {" aa", {15, 7}, 2}, {"caaab", {12, 7, 18}, 3}};
    static const expect inner[] = { /* merges across a space: "c\u2581a" is id 277 */
        {"c a", {6, 277}, 2}, {"abc abc", {6, 14, 6, 14}, 4}, {"b a", {6, 8, 15}, 3},
        {"cab ab c a", {6, 17, 6, 18, 6, 277}, 6}, {" c  a", {6, 6, 9, 6, 15}, 5}};
    tokenizer *tok = synth_tokenizer(1, 1, 1);
    if (tok) check_expect(tok, with_prefix, sizeof with_prefix / sizeof *with_prefix);
    tokenizer_free(tok);
    tok = synth_tokenizer2(1, 1, 1, 1);
    if (tok) check_expect(tok, inner, sizeof inner / sizeof *inner);
    tokenizer_free(tok);
    tok = synth_tokenizer(0, 0, 0);
    if (tok) {
        size_t n = 0;
        int32_t ids[8];
        /* "x<m>y\u00e9" does not round-trip through unk, so only its ids are checked */
        CHECK_EQ_INT(tokenizer_encode(tok, "x<m>y\xC3\xA9", 7, ids, 8, &n), 0);
        CHECK(n == 4 && ids[0] == 3 && ids[1] == 4 && ids[2] == 3 && ids[3] == 20);
        for (size_t i = 0; i < sizeof bare / sizeof *bare; i++) {
            CHECK_EQ_INT(tokenizer_encode(tok, bare[i].text, strlen(bare[i].text), ids, 8, &n), 0);
            int same = n == bare[i].n;
            for (size_t k = 0; same && k < n; k++) same = ids[k] == bare[i].ids[k];
            CHECK_MSG(same, "bare ids of \"%s\"", bare[i].text);
        }
    }
    tokenizer_free(tok);
}

/* The reference scan, literally: one symbol per code point, rescan for the best pair. */
static size_t naive_bpe(const tokenizer *tok, const char *seg, size_t len, int32_t *out) {
    size_t starts[512], n = 0, count = 0;
    for (size_t i = 0; i < len; n++) {
        starts[n] = i;
        i++;
        while (i < len && ((uint8_t)seg[i] & 0xC0) == 0x80) i++;
    }
    starts[n] = len;
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (size_t j = 0; j + 1 < n; j++) {
            int id = -1;
            for (uint32_t p = 0; p < tokenizer_vocab(tok); p++) {
                size_t pl;
                const char *pt = tokenizer_piece(tok, (int32_t)p, &pl);
                if (pl == starts[j + 2] - starts[j] && memcmp(pt, seg + starts[j], pl) == 0) id = (int)p;
            }
            if (id >= 0 && (best < 0 || tokenizer_piece_score(tok, id) > best_score)) {
                best = (int)j;
                best_score = tokenizer_piece_score(tok, id);
            }
        }
        if (best < 0) break;
        memmove(starts + best + 1, starts + best + 2, (n - (size_t)best - 1) * sizeof *starts);
        n--;
    }
    for (size_t j = 0; j < n; j++) {
        int id = -1;
        for (uint32_t p = 0; p < tokenizer_vocab(tok); p++) {
            size_t pl;
            const char *pt = tokenizer_piece(tok, (int32_t)p, &pl);
            if (pl == starts[j + 1] - starts[j] && memcmp(pt, seg + starts[j], pl) == 0) id = (int)p;
        }
        if (id >= 0) out[count++] = id;
        else for (size_t k = starts[j]; k < starts[j + 1]; k++) out[count++] = BYTE0 + (uint8_t)seg[k];
    }
    return count;
}

/* Random strings over a tie-heavy alphabet: the heap encoder must match the naive scan,
 * with and without pieces that merge across a space. */
static void heap_vs_naive(int with_inner) {
    static const char *const atoms[] = {"a", "b", "c", " ", "<m>", "<mm>", "<", "m", ">", "\xC3\xA9", "x"};
    tokenizer *tok = synth_tokenizer2(1, 1, 1, with_inner);
    if (!tok) return;
    uint32_t rng = 12345;
    int mismatches = 0;
    for (int iter = 0; iter < 3000; iter++) {
        char text[128], esc[512];
        size_t tl = 0, el = 0, n = 0, m = 0;
        int32_t got[512], want[512];
        int k = 1 + (int)((rng = rng * 1103515245u + 12345u) >> 16) % 30;
        for (int i = 0; i < k; i++) {
            const char *a = atoms[((rng = rng * 1103515245u + 12345u) >> 16) % 11];
            memcpy(text + tl, a, strlen(a));
            tl += strlen(a);
        }
        memcpy(esc, META, 3);
        el = 3;
        for (size_t i = 0; i < tl; i++) {
            if (text[i] == ' ') {
                memcpy(esc + el, META, 3);
                el += 3;
            } else {
                esc[el++] = text[i];
            }
        }
        /* split at markers, longest first */
        size_t seg = 0;
        for (size_t i = 0; i < el;) {
            size_t ml = el - i >= 4 && memcmp(esc + i, "<mm>", 4) == 0 ? 4
                      : el - i >= 3 && memcmp(esc + i, "<m>", 3) == 0 ? 3 : 0;
            if (!ml) { i++; continue; }
            m += naive_bpe(tok, esc + seg, i - seg, want + m);
            want[m++] = ml == 4 ? 5 : 4;
            i += ml;
            seg = i;
        }
        m += naive_bpe(tok, esc + seg, el - seg, want + m);
        CHECK_EQ_INT(tokenizer_encode(tok, text, tl, got, 512, &n), 0);
        if ((n != m || memcmp(got, want, n * sizeof *got) != 0) && mismatches++ < 3)
            CHECK_MSG(0, "heap and naive differ on \"%.*s\"", (int)tl, text);
    }
    CHECK_EQ_INT(mismatches, 0);
    tokenizer_free(tok);
}

static void test_heap_matches_naive_scan(void) {
    heap_vs_naive(0);
    heap_vs_naive(1);
}

static void test_accessors(void) {
    tokenizer *tok = synth_tokenizer(1, 1, 1);
    if (!tok) return;
    size_t len = 0;
    const char *b = NULL;
    CHECK_EQ_INT(tokenizer_vocab(tok), N_BASE + 256);
    for (int k = 0; k < 4; k++) CHECK_EQ_INT(tokenizer_special_id(tok, k), k);
    CHECK_EQ_INT(tokenizer_special_id(tok, 4), -1);
    CHECK_EQ_INT(tokenizer_marker_id(tok, "<m>"), 4);
    CHECK_EQ_INT(tokenizer_marker_id(tok, "<mm>"), 5);
    CHECK_EQ_INT(tokenizer_marker_id(tok, "<m"), -1); /* NORMAL, not a marker */
    CHECK_EQ_INT(tokenizer_marker_id(tok, ""), -1);
    CHECK(strcmp(tokenizer_piece(tok, 15, &len), META "a") == 0 && len == 4);
    CHECK(tokenizer_piece(tok, -1, &len) == NULL && len == 0);
    CHECK(tokenizer_piece(tok, N_BASE + 256, NULL) == NULL);
    CHECK_EQ_INT(tokenizer_piece_type(tok, 4), TOKENIZER_USER_DEFINED);
    CHECK_EQ_INT(tokenizer_piece_type(tok, BYTE0 + 7), TOKENIZER_BYTE);
    CHECK_EQ_INT(tokenizer_piece_type(tok, 9999), NEEDLE_ERR_INVALID_TOKEN);
    CHECK(tokenizer_piece_score(tok, 18) == -1.75f);
    CHECK(tokenizer_token_bytes(tok, 15, &b, &len) == 0 && len == 2 && memcmp(b, " a", 2) == 0);
    CHECK(tokenizer_token_bytes(tok, BYTE0 + 0xE2, &b, &len) == 0 && len == 1 && (uint8_t)b[0] == 0xE2);
    CHECK(tokenizer_token_bytes(tok, BYTE0, &b, &len) == 0 && len == 1 && b[0] == 0);
    CHECK(tokenizer_token_bytes(tok, 1, &b, &len) == 0 && len == 0);
    CHECK(tokenizer_token_bytes(tok, 3, &b, &len) == 0 && len == 0);
    CHECK(tokenizer_token_bytes(tok, 4, &b, &len) == 0 && len == 3 && memcmp(b, "<m>", 3) == 0);
    CHECK_EQ_INT(tokenizer_token_bytes(tok, -5, &b, &len), NEEDLE_ERR_INVALID_TOKEN);
    tokenizer_free(tok);
    tokenizer_free(NULL);
}

/* Replacement of ill-formed bytes; expectations from Python's decode(errors='replace'). */
static void test_decode_replacement(void) {
    static const struct {
        int32_t ids[8];
        size_t n;
        const char *want;
    } cases[] = {
#define B(x) (BYTE0 + (x))
        {{B(0xE0), B(0x80)}, 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{B(0xF0), B(0x90), B(0x80), B(0x41)}, 4, "\xEF\xBF\xBD" "A"},
        {{B(0xED), B(0xA0), B(0x80)}, 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{B(0xC0), B(0xAF)}, 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{B(0xF4), B(0x90), B(0x80), B(0x80)}, 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{B(0xE2), B(0x96), B(0x81)}, 3, ""},
        {{B(0x41), B(0xE2), B(0x96), B(0x81), B(0x42)}, 5, "A B"},
        {{B(0x20), 7}, 2, "a"},
        {{0, 1, 2, 3, 6, 7, 4, 5}, 8, "a<m><mm>"},
        {{B(0xF0), B(0x9F), B(0x98)}, 3, "\xEF\xBF\xBD"},
        {{B(0xF0), B(0x9F), B(0x98), 7}, 4, "\xEF\xBF\xBD" "a"},
        {{B(0xE2), 6}, 2, "\xEF\xBF\xBD "},
        {{6, 6, 7}, 3, " a"},
        {{B(0xFF), B(0xFE), B(0x80)}, 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{B(0xC3), 20}, 2, "\xEF\xBF\xBD\xC3\xA9"},
        {{B(0xF1), B(0x80), B(0x80), B(0xC3), B(0xA9)}, 5, "\xEF\xBF\xBD\xC3\xA9"},
        {{3, 6, 7}, 3, "a"},
        {{0}, 0, ""},
#undef B
    };
    tokenizer *tok = synth_tokenizer(1, 1, 1);
    if (!tok) return;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[64];
        size_t len = 99;
        CHECK_EQ_INT(tokenizer_decode(tok, cases[i].ids, cases[i].n, out, sizeof out, &len), 0);
        CHECK_MSG(len == strlen(cases[i].want) && strcmp(out, cases[i].want) == 0, "decode case %zu", i);
    }
    int32_t nul[2] = {BYTE0, 7}; /* a <0x00> piece decodes to a NUL byte inside the text */
    char out[8];
    size_t len = 0;
    CHECK(tokenizer_decode(tok, nul, 2, out, sizeof out, &len) == 0 && len == 2 && out[0] == 0 && out[1] == 'a');
    tokenizer_free(tok);
}

static void test_bad_input_and_buffers(void) {
    static const struct {
        const char *s;
        size_t len, offset;
    } bad[] = {
        {"ab\x80", 3, 2}, {"\xC0\xAF", 2, 0}, {"x\xC1\xBF", 3, 1}, {"\xE0\x9F\xBF", 3, 0},
        {"\xED\xA0\x80", 3, 0}, {"\xF0\x8F\xBF\xBF", 4, 0}, {"\xF4\x90\x80\x80", 4, 0},
        {"\xF5\x80\x80\x80", 4, 0}, {"ok\xE2\x96", 4, 2}, {"\xC3", 1, 0}, {"a\0b", 3, 1},
        {"\xFF", 1, 0}, {"abc\xF0\x9F\x98", 6, 3}};
    tokenizer *tok = synth_tokenizer(1, 1, 1);
    if (!tok) return;
    int32_t ids[16];
    size_t n = 0;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char where[32];
        snprintf(where, sizeof where, "offset %zu", bad[i].offset);
        CHECK_EQ_INT(tokenizer_encode(tok, bad[i].s, bad[i].len, ids, 16, &n), NEEDLE_ERR_INVALID_UTF8);
        CHECK_MSG(strstr(needle_last_error(), where) != NULL, "case %zu: \"%s\"", i, needle_last_error());
    }
    CHECK(tokenizer_encode(tok, NULL, 0, NULL, 0, &n) == 0 && n == 0);
    CHECK_EQ_INT(tokenizer_encode(tok, NULL, 3, ids, 16, &n), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(tokenizer_encode(tok, "abcabc", 6, NULL, 4, &n), NEEDLE_ERR_INVALID_ARGUMENT);
    /* "abcabc" -> 4 ids: too small buffers report the need and write nothing past cap */
    ids[2] = -77;
    CHECK_EQ_INT(tokenizer_encode(tok, "abcabc", 6, ids, 2, &n), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(n, 4);
    CHECK_EQ_INT(ids[2], -77);
    CHECK(tokenizer_encode(tok, "abcabc", 6, ids, 4, &n) == 0 && n == 4);

    char out[16];
    size_t len = 0;
    int32_t bad_ids[3] = {7, N_BASE + 256, 7};
    CHECK_EQ_INT(tokenizer_decode(tok, bad_ids, 3, out, sizeof out, &len), NEEDLE_ERR_INVALID_TOKEN);
    bad_ids[1] = -1;
    CHECK_EQ_INT(tokenizer_decode(tok, bad_ids, 3, out, sizeof out, &len), NEEDLE_ERR_INVALID_TOKEN);
    CHECK_EQ_INT(tokenizer_decode(tok, NULL, 2, out, sizeof out, &len), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(tokenizer_decode(tok, ids, 4, NULL, 0, &len), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(len, 6);
    CHECK_EQ_INT(tokenizer_decode(tok, ids, 4, out, 6, &len), NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK(len == 6 && out[0] == '\0');
    CHECK(tokenizer_decode(tok, ids, 4, out, 7, &len) == 0 && len == 6 && strcmp(out, "abcabc") == 0);
    tokenizer_free(tok);

    tok = synth_tokenizer(0, 1, 1); /* byte fallback on, but no byte pieces */
    if (!tok) return;
    CHECK(tokenizer_encode(tok, "abc", 3, ids, 16, &n) == 0 && n == 2 && ids[0] == 6 && ids[1] == 14);
    CHECK_EQ_INT(tokenizer_encode(tok, "axb", 3, ids, 16, &n), NEEDLE_ERR_FORMAT);
    tokenizer_free(tok);
}

/* ---- hostile blobs ---------------------------------------------------------------- */

static int create_rc(const uint8_t *p, size_t n, uint32_t vocab) {
    tokenizer *tok = NULL;
    int rc = tokenizer_create(p, n, vocab, &tok);
    CHECK((rc == 0) == (tok != NULL));
    tokenizer_free(tok);
    return rc;
}

/* One hand-made record appended to a valid prefix of base pieces (vocab = count + 1). */
static int one_bad_piece(const char *text, size_t len, int type, float score) {
    buf b = {malloc(1024), 0};
    put32(&b, 8);
    for (uint32_t k = 0; k < 4; k++) put32(&b, k);
    put32(&b, 0x0101);
    for (int i = 0; i < 7; i++)
        put_piece(&b, base_pieces[i].text, strlen(base_pieces[i].text), base_pieces[i].type, base_pieces[i].score);
    put_piece(&b, text, len, type, score);
    int rc = create_rc(b.p, b.n, 8);
    free(b.p);
    return rc;
}

static void test_hostile_blobs(void) {
    buf b = synth_blob(1, 1, 1);
    uint32_t vocab = le32(b.p);
    tokenizer *tok = NULL;
    CHECK_EQ_INT(create_rc(b.p, b.n, vocab), 0);
    int fails = 0;
    for (size_t cut = 0; cut < b.n; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any overread */
        memcpy(copy, b.p, cut);
        fails += create_rc(copy, cut, vocab) == NEEDLE_ERR_FORMAT;
        free(copy);
    }
    CHECK_EQ_INT(fails, b.n);
    CHECK_EQ_INT(create_rc(b.p, b.n, vocab + 1), NEEDLE_ERR_FORMAT); /* header vocab mismatch */
    CHECK_EQ_INT(tokenizer_create(NULL, 10, vocab, &tok), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(tokenizer_create(b.p, b.n, vocab, NULL), NEEDLE_ERR_INVALID_ARGUMENT);

    uint8_t *big = malloc(b.n + 1);
    memcpy(big, b.p, b.n);
    big[b.n] = 0;
    CHECK_EQ_INT(create_rc(big, b.n + 1, vocab), NEEDLE_ERR_FORMAT); /* stray trailing byte */
    const uint32_t counts[] = {0, 0xFFFFFFFFu, 0x80000000u, vocab + 1, vocab - 1};
    for (size_t i = 0; i < 5; i++) {
        memcpy(big, b.p, b.n);
        big[0] = (uint8_t)counts[i], big[1] = (uint8_t)(counts[i] >> 8);
        big[2] = (uint8_t)(counts[i] >> 16), big[3] = (uint8_t)(counts[i] >> 24);
        CHECK_EQ_INT(create_rc(big, b.n, counts[i]), NEEDLE_ERR_FORMAT);
    }
    for (int k = 0; k < 4; k++) { /* special id out of range */
        memcpy(big, b.p, b.n);
        big[4 + 4 * k + 1] = 0x7F;
        CHECK_EQ_INT(create_rc(big, b.n, vocab), NEEDLE_ERR_FORMAT);
    }
    memcpy(big, b.p, b.n);
    big[24 + 5] = 0xFF; /* first piece length runs past the end */
    big[24 + 6] = 0xFF;
    CHECK_EQ_INT(create_rc(big, b.n, vocab), NEEDLE_ERR_FORMAT);
    memcpy(big, b.p, b.n);
    big[24 + 5] = 0xD0; /* first piece swallows the bytes of the later records */
    big[24 + 6] = 0x07;
    CHECK_EQ_INT(create_rc(big, b.n, vocab), NEEDLE_ERR_FORMAT);
    free(big);
    free(b.p);

    float nan;
    uint32_t nan_bits = 0x7FC00000u;
    memcpy(&nan, &nan_bits, 4);
    CHECK_EQ_INT(one_bad_piece("ok", 2, 0, -1), 0); /* the harness itself builds a good blob */
    CHECK_EQ_INT(one_bad_piece("\xFF", 1, 0, -1), NEEDLE_ERR_FORMAT);
    CHECK_EQ_INT(one_bad_piece("a\xC3", 2, 0, -1), NEEDLE_ERR_FORMAT);
    CHECK_EQ_INT(one_bad_piece("\xED\xA0\x80", 3, 0, -1), NEEDLE_ERR_FORMAT);
    CHECK_EQ_INT(one_bad_piece("\xC0\x80", 2, 0, -1), NEEDLE_ERR_FORMAT);
    CHECK_EQ_INT(one_bad_piece("ok", 2, 5, -1), NEEDLE_ERR_FORMAT);
    CHECK_EQ_INT(one_bad_piece("ok", 2, 0, nan), NEEDLE_ERR_FORMAT);
    CHECK_EQ_INT(one_bad_piece("", 0, 3, 0), NEEDLE_ERR_FORMAT); /* empty marker */
    CHECK_EQ_INT(one_bad_piece("", 0, 0, 0), 0);                 /* empty normal piece is harmless */
    CHECK_EQ_INT(one_bad_piece("<0x4A>", 6, 4, 0), 0);
    CHECK_EQ_INT(one_bad_piece("<0xff>", 6, 4, 0), 0);
    static const char *const bad_bytes[] = {"<0xG1>", "<0x4>", "<0x41", "<0x411>", "[0x41]", "<0X41>", "<1x41>", ""};
    for (size_t i = 0; i < sizeof bad_bytes / sizeof *bad_bytes; i++)
        CHECK_EQ_INT(one_bad_piece(bad_bytes[i], strlen(bad_bytes[i]), 4, 0), NEEDLE_ERR_FORMAT);
}

/* ---- size ------------------------------------------------------------------------- */

static void check_big(const tokenizer *tok, int unicode) {
    const size_t target = 200 * 1024;
    static const char *const extra[] = {"\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "\n", "\t", "<m>", META};
    char *s = malloc(target + 8);
    size_t len = 0, n = 0;
    uint32_t rng = 7;
    while (len < target) {
        uint32_t r = (rng = rng * 1664525u + 1013904223u) >> 8;
        if (unicode && r % 7 == 0) {
            const char *e = extra[(r >> 4) % 7];
            memcpy(s + len, e, strlen(e));
            len += strlen(e);
        } else {
            s[len++] = r % 5 == 0 ? ' ' : (char)('a' + (r >> 3) % (unicode ? 26 : 3));
        }
    }
    int32_t *ids = encode_round_trip(tok, s, len, &n);
    CHECK(n > 0 && n <= len + 2);
    free(ids);
    memset(s, 'a', target); /* one long segment: the worst case for the merge loop */
    ids = encode_round_trip(tok, s, target, &n);
    free(ids);
    free(s);
}

static void test_large_input(void) {
    tokenizer *tok = synth_tokenizer(1, 1, 1);
    if (tok) check_big(tok, 0);
    tokenizer_free(tok);
    size_t size = 0;
    char *json = (char *)read_file(fixture_path("tokenizer_cases_full.json"), &size);
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    const cJSON *cact = cJSON_GetObjectItemCaseSensitive(root, "cact");
    CHECK_MSG(cJSON_IsString(cact), "tokenizer_cases_full.json missing or without \"cact\"");
    tok = cJSON_IsString(cact) ? fixture_tokenizer(cact->valuestring) : NULL;
    if (tok) check_big(tok, 1);
    tokenizer_free(tok);
    cJSON_Delete(root);
    free(json);
}

int main(void) {
    RUN(test_fixture_tiny);
    RUN(test_fixture_full);
    RUN(test_synthetic_reference);
    RUN(test_heap_matches_naive_scan);
    RUN(test_accessors);
    RUN(test_decode_replacement);
    RUN(test_bad_input_and_buffers);
    RUN(test_hostile_blobs);
    RUN(test_large_input);
    return test_summary();
}
