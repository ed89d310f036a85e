/* The Needle 3 loader against hostile files (format/cact3.c), built from the committed v3
 * fixtures: truncation at every size class, every header field and directory field set
 * to edge values, random flips of the header and directory, a duplicate in a Monarch
 * permutation, huge counts, and a Whistle (speech) file. Each must either be refused with
 * NEEDLE_ERR_FORMAT (or another error code) and a message, or load into a model that
 * runs; under ASan/UBSan (scripts/test.sh) none may read out of bounds. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "needle.h"
#include "util/fp16.h"

#define HEADER3_BYTES 196u
#define DIR3_OFFSET (HEADER3_BYTES + 4u * 28u)
#define RECORD_BYTES 44u

static uint8_t *g_img;
static size_t g_size;
static int g_rejected, g_accepted;

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int load(void) {
    if (g_img) return 1;
    g_img = read_file(fixture_path("v3/v3a.cact"), &g_size);
    return g_img != NULL;
}

/* Opens a private aligned copy; returns the status. */
static int open_copy(const uint8_t *img, size_t size, needle_model **m, uint8_t **buf) {
    *buf = aligned_alloc(64, (size + 63) / 64 * 64);
    if (!*buf) return NEEDLE_ERR_OUT_OF_MEMORY;
    memcpy(*buf, img, size);
    needle_model_params mp = needle_model_default_params();
    mp.backend = "cpu";
    return needle_model_open_blob(*buf, size, &mp, m);
}

/* The image must be refused with a message, or open and run three tokens. */
static void error_or_usable(const uint8_t *img, size_t size, const char *what) {
    needle_model *m = NULL;
    uint8_t *buf = NULL;
    const int rc = open_copy(img, size, &m, &buf);
    if (rc != NEEDLE_OK) {
        CHECK_MSG(rc < 0 && m == NULL && needle_last_error()[0] != '\0',
                  "%s: status %d without a message", what, rc);
        g_rejected++;
    } else {
        needle_session *s = NULL;
        const int32_t toks[3] = {5, 17, 300};
        if (needle_session_create(m, NULL, &s) == NEEDLE_OK) {
            (void)needle_session_eval(s, toks, 3, NULL, 0);
            needle_session_free(s);
        }
        needle_model_free(m);
        g_accepted++;
    }
    free(buf);
}

static void expect_reject(const uint8_t *img, size_t size, const char *substr, const char *what) {
    needle_model *m = NULL;
    uint8_t *buf = NULL;
    const int rc = open_copy(img, size, &m, &buf);
    CHECK_MSG(rc == NEEDLE_ERR_FORMAT && m == NULL, "%s: status %d (expected a format error)",
              what, rc);
    if (substr)
        CHECK_MSG(strstr(needle_last_error(), substr) != NULL, "%s: message '%s' lacks '%s'",
                  what, needle_last_error(), substr);
    needle_model_free(m);
    free(buf);
}

static void test_pristine_loads(void) {
    if (!load()) {
        harness_skip("no v3 fixture");
        return;
    }
    error_or_usable(g_img, g_size, "pristine");
    CHECK_EQ_INT(g_accepted, 1);
}

static void test_truncation(void) {
    if (!load()) {
        harness_skip("no v3 fixture");
        return;
    }
    /* every prefix shorter than the file cuts the last blob (the tokenizer) */
    const size_t step = g_size / 97 + 1;
    for (size_t n = 0; n < g_size; n += n < DIR3_OFFSET + 4 * RECORD_BYTES ? 7 : step)
        expect_reject(g_img, n, NULL, "truncated");
    expect_reject(g_img, g_size - 1, "outside", "one byte short");
    expect_reject(g_img, 100, "too small", "short header");
}

static void test_header_fields(void) {
    if (!load()) {
        harness_skip("no v3 fixture");
        return;
    }
    uint8_t *w = malloc(g_size);
    const uint32_t values[] = {0, 1, 2, 3, 7, 64, 65, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu};
    for (uint32_t field = 1; field < 49; field++) {
        memcpy(w, g_img, g_size);
        const uint32_t orig = rd_u32(g_img + 4 * field);
        for (size_t k = 0; k < sizeof values / sizeof values[0] + 2; k++) {
            const uint32_t v = k < sizeof values / sizeof values[0] ? values[k]
                               : k == sizeof values / sizeof values[0] ? orig + 1 : orig - 1;
            put_u32(w + 4 * field, v);
            char what[64];
            snprintf(what, sizeof what, "header field %u = %u", field, v);
            error_or_usable(w, g_size, what);
        }
    }
    /* specific refusals, each naming what is wrong */
    const struct { uint32_t field, value; const char *msg; } cases[] = {
        {10, 65, "num_layers"},        {6, 385, "out_vocab"},   {11, 15, "odd"},
        {14, 96, "hada_n"},            {17, 1u << 7, "global_mask"},
        {1, 0x7FFFFFFF, "directory"},  {2, 27, "codebook_len"},
        {24, 2, "dilation"},           {31, 17, "num_engram_sites"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(w, g_img, g_size);
        put_u32(w + 4 * cases[i].field, cases[i].value);
        expect_reject(w, g_size, cases[i].msg, cases[i].msg);
    }
    memcpy(w, g_img, g_size);
    put_u32(w + 192, 0x7FC00000u); /* rope_theta NaN */
    expect_reject(w, g_size, "rope_theta", "NaN theta");
    memcpy(w, g_img, g_size);
    put_u32(w + HEADER3_BYTES + 8, 0x7F800000u); /* a codebook value +inf */
    expect_reject(w, g_size, "codebook", "inf codebook");
    free(w);
}

static void test_directory_fields(void) {
    if (!load()) {
        harness_skip("no v3 fixture");
        return;
    }
    const uint32_t n = rd_u32(g_img + 4);
    uint8_t *w = malloc(g_size);
    const uint64_t values[] = {0, 1, 3, 63, 64, 0xFFFFFFFFull, 0x8000000000000000ull,
                               0xFFFFFFFFFFFFFFFFull};
    /* fields: dtype u8 @0, ndim u8 @1, shape u32 @4..16, offset u64 @20, nbytes u64 @28,
     * group u32 @36, bits u32 @40 */
    const struct { unsigned off, width; } fields[] = {{0, 1}, {1, 1}, {4, 4}, {8, 4}, {12, 4},
                                                      {20, 8}, {28, 8}, {36, 4}, {40, 4}};
    for (uint32_t r = 0; r < n; r += (r < 40 ? 1 : 7)) {
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
            for (size_t k = 0; k < sizeof values / sizeof values[0]; k++) {
                memcpy(w, g_img, g_size);
                uint8_t *p = w + DIR3_OFFSET + (size_t)RECORD_BYTES * r + fields[f].off;
                if (fields[f].width == 1) *p = (uint8_t)values[k];
                else if (fields[f].width == 4) put_u32(p, (uint32_t)values[k]);
                else put_u64(p, values[k]);
                char what[64];
                snprintf(what, sizeof what, "record %u field @%u", r, fields[f].off);
                error_or_usable(w, g_size, what);
            }
    }
    free(w);
}

static void test_random_flips(void) {
    if (!load()) {
        harness_skip("no v3 fixture");
        return;
    }
    const uint32_t n = rd_u32(g_img + 4);
    const size_t region = DIR3_OFFSET + (size_t)RECORD_BYTES * n;
    uint8_t *w = malloc(g_size);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 400; i++) {
        memcpy(w, g_img, g_size);
        for (int k = 0; k < 1 + i % 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            w[x % region] ^= (uint8_t)(1u << (x >> 32) % 8);
        }
        error_or_usable(w, g_size, "random flips");
    }
    CHECK(g_rejected > 0);
    free(w);
}

/* Index of the first FP32 record of length N (hada_p1) by walking the directory. */
static uint32_t find_perm(const uint8_t *img) {
    const uint32_t n = rd_u32(img + 4), N = rd_u32(img + 56);
    for (uint32_t r = 0; r < n; r++) {
        const uint8_t *rec = img + DIR3_OFFSET + (size_t)RECORD_BYTES * r;
        if (rec[0] == 2 && rec[1] == 1 && rd_u32(rec + 4) == N) return r;
    }
    return 0;
}

static void test_bad_permutation(void) {
    if (!load()) {
        harness_skip("no v3 fixture");
        return;
    }
    const uint32_t r = find_perm(g_img);
    CHECK(r > 0);
    if (!r) return;
    uint8_t *w = malloc(g_size);
    const uint64_t off = rd_u64(g_img + DIR3_OFFSET + (size_t)RECORD_BYTES * r + 20);
    const float bad[] = {-1.0f, 128.0f, 0.5f, 1e30f};
    for (size_t k = 0; k < 5; k++) {
        memcpy(w, g_img, g_size);
        float v;
        if (k < 4) v = bad[k];
        else memcpy(&v, w + off + 4, 4); /* entry 0 := entry 1: a duplicate */
        memcpy(w + off, &v, 4);
        expect_reject(w, g_size, "permutation", "bad permutation");
    }
    free(w);
}

/* A Whistle file: the text model plus an FP32 audio manifest (13 values, first 3246)
 * before the tokenizer. Built from v3c (no heads) by inserting one record. */
static void test_whistle_refused(void) {
    size_t size;
    uint8_t *src = read_file(fixture_path("v3/v3c.cact"), &size);
    if (!src) {
        harness_skip("no v3c fixture");
        return;
    }
    const uint32_t n = rd_u32(src + 4);
    const size_t out_size = size + 256;
    uint8_t *w = calloc(1, out_size);
    memcpy(w, src, DIR3_OFFSET);
    put_u32(w + 4, n + 1);
    const uint64_t shift = 64; /* one more record: blobs move by one alignment step */
    for (uint32_t r = 0; r < n; r++) {
        const uint8_t *rec = src + DIR3_OFFSET + (size_t)RECORD_BYTES * r;
        const uint32_t at = r + 1 == n ? r + 1 : r; /* the tokenizer moves after the audio */
        uint8_t *dst = w + DIR3_OFFSET + (size_t)RECORD_BYTES * at;
        memcpy(dst, rec, RECORD_BYTES);
        put_u64(dst + 20, rd_u64(rec + 20) + shift);
    }
    const size_t first_blob = rd_u64(src + DIR3_OFFSET + 20);
    memcpy(w + first_blob + shift, src + first_blob, size - first_blob);
    const size_t audio_off = (size + shift + 63) / 64 * 64;
    uint8_t *rec = w + DIR3_OFFSET + (size_t)RECORD_BYTES * (n - 1);
    memset(rec, 0, RECORD_BYTES);
    rec[0] = 2;
    rec[1] = 1;
    put_u32(rec + 4, 13);
    put_u64(rec + 20, audio_off);
    put_u64(rec + 28, 52);
    const float magic = 3246.0f;
    memcpy(w + audio_off, &magic, 4);
    CHECK(audio_off + 52 <= out_size);
    expect_reject(w, audio_off + 52, "Whistle", "whistle");
    free(w);
    free(src);
}

/* The image must open and evaluate three tokens with finite logits. */
static void expect_usable(const uint8_t *img, size_t size, uint32_t record) {
    needle_model *m = NULL;
    needle_session *s = NULL;
    uint8_t *buf = NULL;
    int rc = open_copy(img, size, &m, &buf);
    CHECK_MSG(rc == NEEDLE_OK, "record %u: a defined code stream was refused: %s", record,
              needle_last_error());
    if (rc == NEEDLE_OK) rc = needle_session_create(m, NULL, &s);
    const int32_t toks[3] = {5, 17, 300};
    if (rc == NEEDLE_OK) rc = needle_session_eval(s, toks, 3, NULL, 0);
    CHECK_MSG(rc == NEEDLE_OK, "record %u: eval failed: %s", record, needle_last_error());
    const float *logits = rc == NEEDLE_OK ? needle_session_logits(s) : NULL;
    int finite = logits != NULL;
    for (int i = 0; logits && i < 384; i++) finite &= isfinite(logits[i]) != 0; /* v3d: vocab 384 */
    CHECK_MSG(finite, "record %u: non-finite logits", record);
    needle_session_free(s);
    needle_model_free(m);
    free(buf);
}

/* Every CQ record kind of v3d.cact (binary bits 1, CQ2-4, ternary bits 5): widths the
 * format does not define are refused, a width that does not match the record's size is
 * refused, any code stream of a defined width (ternary crumb 2, which the exporter never
 * writes, included) loads and runs, and truncation inside any blob is refused. A Needle 2
 * file may not use bits 1 (binary is a Needle 3 record). */
static void test_record_kinds(void) {
    size_t size;
    uint8_t *src = read_file(fixture_path("v3/v3d.cact"), &size);
    if (!src) {
        harness_skip("no v3d fixture");
        return;
    }
    uint8_t *w = malloc(size);
    const uint32_t n = rd_u32(src + 4);
    uint32_t seen[6] = {0};
    for (uint32_t r = 0; r < n; r++) {
        const uint8_t *rec = src + DIR3_OFFSET + (size_t)RECORD_BYTES * r;
        if (rec[0] != 3) continue; /* CQ records only */
        const uint32_t bits = rd_u32(rec + 40);
        CHECK(bits >= 1 && bits <= 5);
        if (bits < 1 || bits > 5) continue;
        seen[bits]++;
        const uint32_t bad[] = {0, 6, 7, 0xFFFFFFFFu};
        for (size_t k = 0; k < 4; k++) {
            memcpy(w, src, size);
            put_u32(w + DIR3_OFFSET + (size_t)RECORD_BYTES * r + 40, bad[k]);
            expect_reject(w, size, "bits", "undefined CQ width");
        }
        /* binary <-> 4 bits changes the code bytes per row 4x: the size check refuses */
        memcpy(w, src, size);
        put_u32(w + DIR3_OFFSET + (size_t)RECORD_BYTES * r + 40, bits == 1 ? 4 : 1);
        expect_reject(w, size, "bytes", "width against size");
        /* every code byte 0xAA (binary 0/1 alternating, ternary crumb 2) or 0xFF */
        const uint64_t off = rd_u64(rec + 20), rows = rd_u32(rec + 4), cols = rd_u32(rec + 8);
        const uint64_t G = rd_u32(rec + 36), pad = (cols + G - 1) / G * G;
        const uint64_t code_bytes = rows * (bits == 5 ? pad / 4 : pad * bits / 8);
        for (int v = 0; v < 2; v++) {
            memcpy(w, src, size);
            memset(w + off, v ? 0xFF : 0xAA, (size_t)code_bytes);
            expect_usable(w, size, r);
        }
        /* cut inside this blob */
        const uint64_t nbytes = rd_u64(rec + 28);
        expect_reject(src, (size_t)(off + nbytes / 2), NULL, "truncated blob");
    }
    for (uint32_t b = 1; b <= 5; b++) CHECK_MSG(seen[b] > 0, "v3d has no bits-%u record", b);
    free(w);
    free(src);

    uint8_t *v2 = read_file(fixture_path("tiny_cq4.cact"), &size);
    CHECK(v2 != NULL);
    if (!v2) return;
    /* record 0 (the embedding, CQ) of the 120-byte-header Needle 2 directory */
    uint8_t *bits0 = v2 + 120 + 4 * 28 + 40;
    CHECK_EQ_INT((int)rd_u32(bits0), 4);
    put_u32(bits0, 1);
    expect_reject(v2, size, "bits must be 2, 3, 4 or 5", "binary in a Needle 2 file");
    free(v2);
}

static void test_summary_counts(void) {
    printf("  hostile v3 images: %d refused, %d loaded and ran\n", g_rejected, g_accepted);
    CHECK(g_rejected > 100);
}

int main(void) {
    RUN(test_pristine_loads);
    RUN(test_truncation);
    RUN(test_header_fields);
    RUN(test_directory_fields);
    RUN(test_random_flips);
    RUN(test_bad_permutation);
    RUN(test_whistle_refused);
    RUN(test_record_kinds);
    RUN(test_summary_counts);
    free(g_img);
    return test_summary();
}
