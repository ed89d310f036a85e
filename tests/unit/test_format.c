/* Loader robustness (spec §1, Appendix A), through the public API only.
 *
 * Covers: every committed fixture opens by path, by aligned blob and by misaligned blob,
 * with tensor shapes that match the header geometry and tensors that decode; truncation
 * at every byte of header + codebooks + directory and at a few hundred points of the data
 * region; every byte of the header and of selected directory records set to x^0xFF, 0x00
 * and 0x7F (each either a clean error or a model that still evaluates); hand-picked
 * hostile values (each a clean NEEDLE_ERR_FORMAT with a message); a file whose tokenizer
 * record is dropped; and bad paths.
 *
 * Mutated images are opened with needle_model_open_blob from an exact-size, 64-aligned
 * heap copy, so AddressSanitizer flags any read past the end of the image. The mutation
 * tests run on the smallest tests/fixtures/tiny_*.cact that has probe heads and a
 * tokenizer (else the smallest tiny_*.cact). */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "needle.h"
#include "util/fp16.h"

#define HEADER_BYTES 120u
#define RECORD_BYTES 44u
#define DIR_OFFSET (HEADER_BYTES + 4u * 28u) /* 232 */

/* header field offsets (§1.1) */
enum {
    H_TAG = 0, H_NUM_TENSORS = 4, H_CODEBOOK_LEN = 8, H_KV_WINDOW = 12, H_VOCAB = 20,
    H_D_MODEL = 24, H_NUM_LAYERS = 36, H_HEAD_DIM = 40, H_HADA_N = 48,
    H_NUM_SITES = 96, H_SITES = 100
};
/* directory record field offsets (§1.3) */
enum { R_DTYPE = 0, R_NDIM = 1, R_SHAPE = 4, R_OFFSET = 20, R_NBYTES = 28, R_GROUP = 36, R_BITS = 40 };

/* ---- the fixture under test ----------------------------------------------------------- */

static char g_path[1024];
static uint8_t *g_pristine; /* the fixture as read */
static uint8_t *g_work;     /* the image the mutation tests edit (undo log below) */
static size_t g_size;
static needle_model_info g_info = {.size = sizeof g_info};
static uint32_t g_mhc_base, g_engram_base, g_final_norm, g_manifest; /* directory indices */
static uint32_t g_data_start;                                          /* first blob offset */

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }
static size_t rec_off(uint32_t index) { return DIR_OFFSET + (size_t)RECORD_BYTES * index; }

/* Undo log: every poke() remembers the bytes it overwrote; undo() restores them all. */
typedef struct undo_entry { size_t off; unsigned width; uint8_t old[8]; } undo_entry;
static undo_entry g_undo[64];
static int g_n_undo;

static void poke(size_t off, unsigned width, uint64_t value) {
    if (g_n_undo == 64 || off + width > g_size) abort(); /* test bug */
    undo_entry *u = &g_undo[g_n_undo++];
    u->off = off;
    u->width = width;
    memcpy(u->old, g_work + off, width);
    for (unsigned i = 0; i < width; i++) g_work[off + i] = (uint8_t)(value >> (8 * i));
}
static void poke_rec(uint32_t index, unsigned field, unsigned width, uint64_t value) {
    poke(rec_off(index) + field, width, value);
}
static void undo(void) {
    while (g_n_undo > 0) {
        undo_entry *u = &g_undo[--g_n_undo];
        memcpy(g_work + u->off, u->old, u->width);
    }
}

/* ---- opening images ----------------------------------------------------------------- */

/* Opens img[0:size] from an exact-size 64-aligned heap copy. On success the caller owns
 * *m and *buf (free the model first). Checks the constructor contract: *out untouched on
 * failure, a non-empty message on failure. */
static int open_copy(const uint8_t *img, size_t size, needle_model **m, uint8_t **buf) {
    void *p = NULL;
    if (posix_memalign(&p, 64, size ? size : 1) != 0) abort();
    if (size) memcpy(p, img, size);
    needle_model *sentinel = (needle_model *)&sentinel, *out = sentinel;
    needle_model_params mp = needle_model_default_params();
    mp.n_threads = 1; /* hundreds of short-lived sessions: no worker threads needed */
    int rc = needle_model_open_blob(p, size, &mp, &out);
    if (rc == NEEDLE_OK) {
        *m = out;
        *buf = p;
    } else {
        CHECK_MSG(out == sentinel, "failed open (rc %d) wrote *out", rc);
        CHECK_MSG(needle_last_error()[0] != '\0', "rc %d with an empty needle_last_error()", rc);
        *m = NULL;
        *buf = NULL;
        free(p);
    }
    return rc;
}

/* Expects the image to be rejected with `want`; `substr` (if non-NULL) must appear in the
 * message. */
static void expect_reject(const uint8_t *img, size_t size, int want, const char *substr,
                          const char *what) {
    needle_model *m;
    uint8_t *buf;
    int rc = open_copy(img, size, &m, &buf);
    const char *msg = needle_last_error();
    CHECK_MSG(rc == want, "%s: rc %d (%s), expected %d", what, rc, msg, want);
    if (rc != NEEDLE_OK && substr)
        CHECK_MSG(strstr(msg, substr) != NULL, "%s: message \"%s\" lacks \"%s\"", what, msg, substr);
    needle_model_free(m);
    free(buf);
}

/* Undoes the pending pokes after checking that g_work is rejected as a FORMAT error. */
static void reject_work(const char *substr, const char *what) {
    expect_reject(g_work, g_size, NEEDLE_ERR_FORMAT, substr, what);
    undo();
}

/* A few tokens through a short session of a model that validated: session creation and
 * eval must succeed and leave readable (finite or not) logits. Returns the eval status. */
static int smoke_eval(const needle_model *m, const char *what) {
    needle_model_info info = {.size = sizeof info};
    CHECK(needle_model_get_info(m, &info) == NEEDLE_OK);
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 32;
    needle_session *s = NULL;
    int rc = needle_session_create(m, &sp, &s);
    CHECK_MSG(rc == NEEDLE_OK, "%s: session_create rc %d (%s)", what, rc, needle_last_error());
    if (rc) return rc;
    const int32_t v = (int32_t)info.vocab;
    const int32_t toks[4] = {NEEDLE_TOKEN_BOS % v, 17 % v, v - 1, 5 % v};
    float *logits = malloc(3 * (size_t)info.vocab * sizeof *logits);
    rc = needle_session_eval(s, toks, 3, logits, 3 * (size_t)info.vocab);
    if (rc == NEEDLE_OK) rc = needle_session_eval(s, toks + 3, 1, NULL, 0);
    CHECK_MSG(rc == NEEDLE_OK, "%s: eval rc %d (%s)", what, rc, needle_last_error());
    if (rc == NEEDLE_OK) {
        const float *last = needle_session_logits(s);
        CHECK(last != NULL);
        volatile float sink = 0.0f; /* finite or not, every logit must be readable */
        for (uint32_t i = 0; last && i < info.vocab; i++) sink += last[i] + logits[i];
        (void)sink;
        CHECK_EQ_INT(needle_session_position(s), 4);
    }
    free(logits);
    needle_session_free(s);
    return rc;
}

/* Opens g_work: a clean error, or a model that evaluates. Counts the outcomes. */
static int g_rejected, g_accepted;
static void error_or_usable(const char *what) {
    needle_model *m;
    uint8_t *buf;
    int rc = open_copy(g_work, g_size, &m, &buf);
    if (rc == NEEDLE_OK) {
        g_accepted++;
        smoke_eval(m, what);
        needle_model_free(m);
        free(buf);
    } else {
        g_rejected++;
        CHECK_MSG(rc == NEEDLE_ERR_FORMAT, "%s: rc %d (%s), expected FORMAT or OK", what, rc,
                  needle_last_error());
    }
}

/* ---- fixture discovery ---------------------------------------------------------------- */

static int by_size(const void *a, const void *b) {
    struct stat sa, sb;
    const char *pa = *(const char *const *)a, *pb = *(const char *const *)b;
    off_t za = stat(pa, &sa) == 0 ? sa.st_size : 0, zb = stat(pb, &sb) == 0 ? sb.st_size : 0;
    return za < zb ? -1 : za > zb ? 1 : strcmp(pa, pb);
}

/* Picks the smallest tiny_*.cact with probe heads and a tokenizer (else the smallest). */
static int load_fixture(void) {
    char pattern[1100];
    snprintf(pattern, sizeof pattern, "%s/tiny_*.cact", fixture_dir());
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        fprintf(stderr, "no fixture matches %s\n", pattern);
        return 0;
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, by_size);
    snprintf(g_path, sizeof g_path, "%s", g.gl_pathv[0]);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        needle_model *m = NULL;
        needle_model_info info = {.size = sizeof info};
        if (needle_model_open(g.gl_pathv[i], NULL, &m) != NEEDLE_OK) continue;
        needle_model_get_info(m, &info);
        needle_model_free(m);
        if (info.num_probe_heads > 0 && info.has_tokenizer) {
            snprintf(g_path, sizeof g_path, "%s", g.gl_pathv[i]);
            break;
        }
    }
    globfree(&g);

    g_pristine = read_file(g_path, &g_size);
    if (!g_pristine) return 0;
    g_work = malloc(g_size);
    memcpy(g_work, g_pristine, g_size);
    needle_model *m = NULL;
    if (needle_model_open(g_path, NULL, &m) != NEEDLE_OK) {
        fprintf(stderr, "%s: %s\n", g_path, needle_last_error());
        return 0;
    }
    needle_model_get_info(m, &g_info);
    needle_model_free(m);
    g_mhc_base = 1 + 14 * g_info.num_layers;
    g_engram_base = g_mhc_base + 9;
    g_final_norm = g_engram_base + 4 * g_info.num_engram_sites;
    g_manifest = g_final_norm + 1;
    g_data_start = (uint32_t)get_u64(g_pristine + rec_off(0) + R_OFFSET);
    printf("fixture %s: %zu bytes, %u tensors, %u probe heads, tokenizer %d, data from %u\n",
           g_path, g_size, g_info.num_tensors, g_info.num_probe_heads, g_info.has_tokenizer,
           g_data_start);
    return 1;
}

/* ---- 1. valid fixtures ---------------------------------------------------------------- */

static uint64_t prod(const needle_tensor_info *t) {
    uint64_t n = 1;
    for (uint32_t k = 0; k < t->ndim; k++) n *= t->shape[k];
    return n;
}

static void expect_shape(const needle_model *m, uint32_t index, const char *name, uint32_t ndim,
                         uint32_t s0, uint32_t s1, uint32_t s2) {
    needle_tensor_info t = {.size = sizeof t};
    CHECK_EQ_INT(needle_model_get_tensor(m, index, &t), NEEDLE_OK);
    CHECK_MSG(strcmp(t.name, name) == 0, "tensor %u is \"%s\", expected \"%s\"", index, t.name, name);
    const uint32_t want[3] = {s0, s1, s2};
    CHECK_MSG(t.ndim == ndim, "%s: ndim %u, expected %u", name, t.ndim, ndim);
    for (uint32_t k = 0; k < 4; k++)
        CHECK_MSG(t.shape[k] == (k < ndim ? want[k] : 0u), "%s: shape[%u] = %u", name, k, t.shape[k]);
}

/* Geometry from get_info against the shapes of the tensors it implies (§1.9). */
static void check_geometry(const needle_model *m, const needle_model_info *in) {
    const uint32_t d = in->d_model, A = in->num_heads * in->head_dim;
    const uint32_t kvd = in->num_kv_heads * in->head_dim, L = in->num_layers, n = in->mhc_lanes;
    const uint32_t mb = 1 + 14 * L, eb = mb + 9, fin = eb + 4 * in->num_engram_sites;
    expect_shape(m, 0, "embedding", 2, in->vocab, d, 0);
    for (uint32_t l = 0; l < L; l++) {
        char name[40];
        uint32_t b = 1 + 14 * l;
        snprintf(name, sizeof name, "layer%u.q_proj", l);
        expect_shape(m, b + 1, name, 2, A, d, 0);
        snprintf(name, sizeof name, "layer%u.k_proj", l);
        expect_shape(m, b + 2, name, 2, kvd, d, 0);
        snprintf(name, sizeof name, "layer%u.q_norm", l);
        expect_shape(m, b + 4, name, 1, in->head_dim, 0, 0);
        snprintf(name, sizeof name, "layer%u.out_proj", l);
        expect_shape(m, b + 7, name, 2, d, A, 0);
        snprintf(name, sizeof name, "layer%u.attn_gate", l);
        expect_shape(m, b + 9, name, 1, 1, 0, 0);
        snprintf(name, sizeof name, "layer%u.d3", l);
        expect_shape(m, b + 13, name, 1, in->hada_n, 0, 0);
    }
    expect_shape(m, mb + 0, "mhc_a_pre", 1, L, 0, 0);
    expect_shape(m, mb + 5, "mhc_b_res", 3, L, n, n);
    expect_shape(m, mb + 8, "mhc_phi_res", 2, L * n * n, n * d, 0);
    for (uint32_t s = 0; s < in->num_engram_sites; s++) {
        char name[40];
        snprintf(name, sizeof name, "engram%u.tables", s);
        expect_shape(m, eb + 4 * s, name, 2, in->num_engram_tables * in->engram_slots,
                     in->engram_sub_dim, 0);
        snprintf(name, sizeof name, "engram%u.key_proj", s);
        expect_shape(m, eb + 4 * s + 1, name, 2, d, in->num_engram_tables * in->engram_sub_dim, 0);
        snprintf(name, sizeof name, "engram%u.taps", s);
        expect_shape(m, eb + 4 * s + 3, name, 2, in->engram_conv_taps, d, 0);
    }
    expect_shape(m, fin, "final_norm", 1, d, 0, 0);
    uint32_t expect_n = fin + 1 + (in->num_probe_heads ? 1 + 3 * in->num_probe_heads : 0) +
                        (in->has_tokenizer ? 1 : 0);
    CHECK_EQ_INT(in->num_tensors, expect_n);
    if (in->num_probe_heads) expect_shape(m, fin + 1, "heads.manifest", 1, in->num_probe_heads, 0, 0);
    for (uint32_t k = 0; k < in->num_probe_heads; k++)
        CHECK_MSG(in->probe_head_codes[k] == 1 || in->probe_head_codes[k] == 2,
                  "probe head %u code %u", k, in->probe_head_codes[k]);
    if (in->has_tokenizer) {
        needle_tensor_info t = {.size = sizeof t};
        CHECK_EQ_INT(needle_model_get_tensor(m, in->num_tensors - 1, &t), NEEDLE_OK);
        CHECK_EQ_INT(t.dtype, NEEDLE_DTYPE_RAW);
        CHECK(strcmp(t.name, "tokenizer") == 0);
    }
    CHECK(in->head_dim % 2 == 0);
    CHECK(in->hada_n >= d && (in->hada_n & (in->hada_n - 1)) == 0);
    CHECK(in->num_heads % in->num_kv_heads == 0);
}

/* Every record: name, bounds, alignment, CQ fields; decode (when `decode`) with values
 * checked against the raw FP16 bytes, and the buffer-too-small path. */
static void inspect_tensors(const needle_model *m, const uint8_t *img, int decode) {
    needle_model_info in = {.size = sizeof in};
    needle_model_get_info(m, &in);
    for (uint32_t i = 0; i < in.num_tensors; i++) {
        needle_tensor_info t = {.size = sizeof t};
        CHECK_EQ_INT(needle_model_get_tensor(m, i, &t), NEEDLE_OK);
        CHECK_MSG(t.name && t.name[0], "tensor %u has no name", i);
        CHECK_MSG(t.offset % 64 == 0 && t.offset <= in.file_size &&
                      t.nbytes <= in.file_size - t.offset, "tensor %u (%s) out of bounds", i, t.name);
        CHECK_MSG(t.ndim <= 4, "tensor %u ndim %u", i, t.ndim);
        if (t.dtype == NEEDLE_DTYPE_CQ) {
            CHECK_MSG(t.ndim == 2 && t.group_size == in.group_size, "%s: CQ ndim/group", t.name);
            CHECK_MSG(t.bits >= 2 && t.bits <= 5, "%s: bits %u", t.name, t.bits);
        } else {
            CHECK_MSG(t.group_size == 0 && t.bits == 0, "%s: group/bits on a non-CQ record", t.name);
            if (t.dtype == NEEDLE_DTYPE_FP16) CHECK_EQ_INT(t.nbytes, 2 * prod(&t));
            if (t.dtype == NEEDLE_DTYPE_FP32) CHECK_EQ_INT(t.nbytes, 4 * prod(&t));
        }
        size_t n = 12345;
        if (t.dtype == NEEDLE_DTYPE_RAW) {
            CHECK_EQ_INT(needle_model_decode_tensor(m, i, NULL, 0, &n), NEEDLE_ERR_INVALID_ARGUMENT);
            continue;
        }
        /* size query, then a buffer one short (exact heap block: ASan sees any overrun) */
        CHECK_EQ_INT(needle_model_decode_tensor(m, i, NULL, 0, &n), NEEDLE_ERR_BUFFER_TOO_SMALL);
        CHECK_MSG(n == prod(&t), "%s: query gave %zu values, shape has %llu", t.name, n,
                  (unsigned long long)prod(&t));
        if (!decode) continue;
        float *small = malloc((n - 1 ? n - 1 : 1) * sizeof *small);
        size_t n2 = 0;
        CHECK_EQ_INT(needle_model_decode_tensor(m, i, small, n - 1, &n2), NEEDLE_ERR_BUFFER_TOO_SMALL);
        CHECK_EQ_INT(n2, n);
        CHECK(needle_last_error()[0] != '\0');
        free(small);
        float *vals = malloc(n * sizeof *vals);
        CHECK_EQ_INT(needle_model_decode_tensor(m, i, vals, n, &n2), NEEDLE_OK);
        CHECK_EQ_INT(n2, n);
        size_t bad = 0;
        for (size_t k = 0; k < n; k++) {
            float want = vals[k];
            if (t.dtype == NEEDLE_DTYPE_FP16) want = fp16_to_f32(rd_u16(img + t.offset + 2 * k));
            if (t.dtype == NEEDLE_DTYPE_FP32) want = rd_f32(img + t.offset + 4 * k);
            if (!isfinite(vals[k]) || memcmp(&want, &vals[k], sizeof want) != 0) bad++;
        }
        CHECK_MSG(bad == 0, "%s: %zu of %zu decoded values non-finite or not the stored ones",
                  t.name, bad, n);
        free(vals);
    }
    needle_tensor_info t = {.size = sizeof t};
    size_t n;
    CHECK_EQ_INT(needle_model_get_tensor(m, in.num_tensors, &t), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(needle_model_decode_tensor(m, in.num_tensors, NULL, 0, &n), NEEDLE_ERR_INVALID_ARGUMENT);
}

/* Last-token logits of a fixed short sequence (caller frees). */
static float *short_logits(const needle_model *m) {
    needle_model_info in = {.size = sizeof in};
    needle_model_get_info(m, &in);
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 16;
    needle_session *s = NULL;
    if (needle_session_create(m, &sp, &s) != NEEDLE_OK) return NULL;
    const int32_t v = (int32_t)in.vocab, toks[3] = {NEEDLE_TOKEN_BOS % v, 40 % v, 7 % v};
    float *out = NULL;
    if (needle_session_eval(s, toks, 3, NULL, 0) == NEEDLE_OK) {
        out = malloc(in.vocab * sizeof *out);
        memcpy(out, needle_session_logits(s), in.vocab * sizeof *out);
    }
    needle_session_free(s);
    return out;
}

static void test_valid_fixtures(void) {
    char pattern[1100];
    snprintf(pattern, sizeof pattern, "%s/*.cact", fixture_dir());
    glob_t g;
    CHECK_MSG(glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0, "no fixtures in %s", fixture_dir());
    for (size_t f = 0; f < g.gl_pathc; f++) {
        const char *path = g.gl_pathv[f];
        size_t size = 0;
        uint8_t *img = read_file(path, &size);
        CHECK_MSG(img != NULL, "cannot read %s", path);
        if (!img) continue;
        const int small = size < (4u << 20); /* decode everything only in the tiny models */

        needle_model *by_path = NULL, *aligned = NULL, *misaligned = NULL;
        needle_model_params mp = needle_model_default_params();
        mp.n_threads = 1;
        int rc = needle_model_open(path, &mp, &by_path);
        CHECK_MSG(rc == NEEDLE_OK, "%s: %s", path, needle_last_error());
        if (rc) { free(img); continue; }
        CHECK(needle_last_error()[0] == '\0');
        needle_model_info in = {.size = sizeof in};
        CHECK_EQ_INT(needle_model_get_info(by_path, &in), NEEDLE_OK);
        CHECK_EQ_INT(in.file_size, size);
        check_geometry(by_path, &in);
        inspect_tensors(by_path, img, small);

        /* blob at a 64-aligned address (used in place) and at malloc + 1 (copied) */
        uint8_t *abuf = NULL;
        CHECK_EQ_INT(open_copy(img, size, &aligned, &abuf), NEEDLE_OK);
        uint8_t *raw = malloc(size + 1);
        memcpy(raw + 1, img, size);
        CHECK_EQ_INT(needle_model_open_blob(raw + 1, size, NULL, &misaligned), NEEDLE_OK);
        needle_model_info in2 = {.size = sizeof in2};
        if (aligned && misaligned) {
            CHECK_EQ_INT(needle_model_get_info(misaligned, &in2), NEEDLE_OK);
            CHECK(memcmp(&in, &in2, sizeof in) == 0);
            if (small) inspect_tensors(misaligned, img, 1);
            float *a = short_logits(by_path), *b = short_logits(aligned), *c = short_logits(misaligned);
            CHECK(a && b && c);
            if (a && b && c)
                CHECK_MSG(!memcmp(a, b, in.vocab * sizeof *a) && !memcmp(a, c, in.vocab * sizeof *a),
                          "%s: logits differ between path, aligned and misaligned blob", path);
            free(a);
            free(b);
            free(c);
        }
        needle_model_free(misaligned);
        needle_model_free(aligned);
        needle_model_free(by_path);
        free(raw);
        free(abuf);
        free(img);
    }
    globfree(&g);
}

/* ---- 2. truncation -------------------------------------------------------------------- */

static void test_truncation(void) {
    /* every prefix through the directory and the alignment gap before the first blob */
    size_t failures = 0;
    for (size_t len = 0; len <= g_data_start && len < g_size; len++) {
        needle_model *m;
        uint8_t *buf;
        int rc = open_copy(g_pristine, len, &m, &buf);
        if (rc != NEEDLE_ERR_FORMAT && failures++ < 5)
            CHECK_MSG(0, "prefix of %zu bytes: rc %d (%s)", len, rc, needle_last_error());
        needle_model_free(m);
        free(buf);
    }
    CHECK_EQ_INT(failures, 0);
    /* ~300 points spread over the data region, plus the last few bytes */
    size_t span = g_size - g_data_start, tried = 0;
    for (size_t k = 1; k <= 300; k++) {
        size_t len = g_data_start + span * k / 301 + k % 7;
        if (len >= g_size) continue;
        expect_reject(g_pristine, len, NEEDLE_ERR_FORMAT, NULL, "data-region truncation");
        tried++;
    }
    for (size_t cut = 1; cut <= 3; cut++)
        expect_reject(g_pristine, g_size - cut, NEEDLE_ERR_FORMAT, "truncated", "size - cut");
    printf("  %u header/directory prefixes, %zu data-region prefixes rejected\n",
           g_data_start + 1, tried + 3);
}

/* ---- 3. corruption -------------------------------------------------------------------- */

/* Each byte in [off, off + len) set to x^0xFF, 0x00 and 0x7F in turn. */
static void corrupt_bytes(size_t off, size_t len, const char *what) {
    for (size_t i = off; i < off + len; i++) {
        const uint8_t orig = g_pristine[i];
        const uint8_t values[3] = {(uint8_t)(orig ^ 0xFF), 0x00, 0x7F};
        for (int v = 0; v < 3; v++) {
            if (values[v] == orig) continue;
            char label[96];
            snprintf(label, sizeof label, "%s byte %zu = 0x%02X", what, i - off, values[v]);
            poke(i, 1, values[v]);
            error_or_usable(label);
            undo();
        }
    }
}

static void test_corrupt_header(void) {
    g_rejected = g_accepted = 0;
    corrupt_bytes(0, HEADER_BYTES, "header");
    printf("  header: %d rejected, %d accepted and evaluated\n", g_rejected, g_accepted);
    CHECK(g_rejected > 0);
    /* codebook values are free: any finite value is a valid (if odd) file */
    g_rejected = g_accepted = 0;
    corrupt_bytes(HEADER_BYTES, 8, "codebook");
    corrupt_bytes(HEADER_BYTES + 4 * 27, 4, "codebook");
    printf("  codebooks: %d rejected, %d accepted and evaluated\n", g_rejected, g_accepted);
}

static void test_corrupt_directory(void) {
    uint32_t pick[16], n = 0;
    const uint32_t nt = g_info.num_tensors;
    pick[n++] = 0;                       /* embedding */
    pick[n++] = 1 + 14 + 0;              /* layer1.norm_in (FP16) */
    pick[n++] = 1 + 14 + 1;              /* layer1.q_proj (CQ) */
    pick[n++] = 1 + 14 + 9;              /* layer1.attn_gate */
    pick[n++] = g_mhc_base + 5;          /* mhc_b_res (3-d) */
    pick[n++] = g_mhc_base + 8;          /* mhc_phi_res */
    if (g_info.num_engram_sites) {
        pick[n++] = g_engram_base;       /* engram0.tables */
        pick[n++] = g_engram_base + 3;   /* engram0.taps */
    }
    pick[n++] = g_final_norm;
    if (g_info.num_probe_heads) {
        pick[n++] = g_manifest;          /* heads.manifest */
        pick[n++] = g_manifest + 1;      /* first head's probes */
        pick[n++] = g_manifest + 2;      /* first head's proj */
    }
    if (g_info.has_tokenizer) pick[n++] = nt - 1; /* RAW */
    for (uint32_t k = 0; k < n; k++) {
        char what[48];
        snprintf(what, sizeof what, "record %u", pick[k]);
        g_rejected = g_accepted = 0;
        corrupt_bytes(rec_off(pick[k]), RECORD_BYTES, what);
        printf("  record %3u: %3d rejected, %2d accepted and evaluated\n", pick[k], g_rejected,
               g_accepted);
    }
}

/* 1-3 random bytes of header + codebooks + directory set to random values, seeded. */
static void test_random_mutations(void) {
    uint64_t x = 0x9E3779B97F4A7C15ull;
    g_rejected = g_accepted = 0;
    for (int iter = 0; iter < 200; iter++) {
        int count = 1 + iter % 3;
        for (int k = 0; k < count; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            poke((size_t)(x % g_data_start), 1, (x >> 32) & 0xFF);
        }
        char what[48];
        snprintf(what, sizeof what, "random mutation %d", iter);
        error_or_usable(what);
        undo();
    }
    printf("  %d rejected, %d accepted and evaluated\n", g_rejected, g_accepted);
}

/* ---- 4. hostile values ---------------------------------------------------------------- */

static void test_hostile_header(void) {
    const uint32_t nt = g_info.num_tensors;
    poke(H_NUM_TENSORS, 4, 0);
    reject_work("tensors", "num_tensors 0");
    poke(H_NUM_TENSORS, 4, 1);
    reject_work("tensors", "num_tensors 1");
    poke(H_NUM_TENSORS, 4, 0xFFFFFFFFu);
    reject_work("directory", "num_tensors 0xFFFFFFFF");
    poke(H_NUM_TENSORS, 4, nt + 1); /* one record more: the directory runs into the data */
    reject_work(NULL, "num_tensors + 1");

    poke(H_TAG, 4, 0x05E12A82u);
    reject_work("old format", "v1 tag");
    poke(H_TAG, 4, 0x832AE105u);
    reject_work("tag", "byte-swapped tag");
    const uint32_t cb_lens[] = {0, 27, 29, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof cb_lens / sizeof *cb_lens; i++) {
        poke(H_CODEBOOK_LEN, 4, cb_lens[i]);
        reject_work("codebook_len", "codebook_len");
    }
    poke(H_HADA_N, 4, g_info.hada_n + g_info.hada_n / 2);
    reject_work("hada_n", "hada_n not a power of two");
    poke(H_HADA_N, 4, g_info.hada_n / 2);
    reject_work("hada_n", "hada_n < d_model");
    poke(H_HADA_N, 4, g_info.hada_n * 2);
    reject_work("d1", "hada_n doubled (d1/d2/d3 too short)");
    poke(H_HEAD_DIM, 4, g_info.head_dim + 1);
    reject_work("odd", "odd head_dim");
    poke(H_HEAD_DIM, 4, 0);
    reject_work("head_dim", "head_dim 0");
    poke(H_VOCAB, 4, 0);
    reject_work("vocab", "vocab 0");
    poke(H_VOCAB, 4, 0xFFFFFFFFu);
    reject_work("vocab", "vocab 0xFFFFFFFF");
    poke(H_D_MODEL, 4, 0xFFFFFFFFu);
    reject_work("d_model", "d_model 0xFFFFFFFF");
    poke(H_NUM_LAYERS, 4, 0xFFFFFFFFu);
    reject_work("num_layers", "num_layers 0xFFFFFFFF");
    poke(H_NUM_LAYERS, 4, g_info.num_layers + 1);
    reject_work(NULL, "num_layers + 1");
    poke(H_KV_WINDOW, 4, 0xFFFFFFFFu);
    reject_work("kv_window", "kv_window 0xFFFFFFFF");
    poke(116, 4, 0x7FC00000u); /* NaN */
    reject_work("rope_theta", "rope_theta NaN");
    poke(116, 4, 0x3F800000u); /* 1.0 */
    reject_work("rope_theta", "rope_theta 1");
    poke(HEADER_BYTES + 4 * 5, 4, 0x7F800000u); /* +inf in cb3 */
    reject_work("codebook", "infinite codebook value");

    if (g_info.num_engram_sites) {
        poke(H_SITES, 4, g_info.num_layers);
        reject_work("engram site", "engram site = num_layers");
        poke(H_SITES, 4, 0xFFFFFFFFu);
        reject_work("engram site", "engram site 0xFFFFFFFF");
        poke(H_NUM_SITES, 4, 5);
        reject_work("num_engram_sites", "5 engram sites");
        if (g_info.num_engram_sites < 4) {
            /* one more site, listing an existing layer twice */
            poke(H_NUM_SITES, 4, g_info.num_engram_sites + 1);
            poke(H_SITES + 4 * g_info.num_engram_sites, 4, g_info.engram_sites[0]);
            reject_work("twice", "duplicate engram site");
        }
        poke(76, 4, 0); /* orders without ... */
        reject_work("orders", "engram sites without orders");
        poke(72, 4, g_info.engram_conv_dilation + 1);
        reject_work("dilation", "dilation != max order");
        poke(64, 4, g_info.num_engram_tables + 1);
        reject_work("num_engram_tables", "tables not a multiple of orders");
        poke(56, 4, 0);
        reject_work("engram_slots", "engram_slots 0");
        poke(68, 4, 0);
        reject_work("engram_conv_taps", "engram_conv_taps 0");
    }
}

static void test_hostile_records(void) {
    const uint32_t cq = 1 + 14 + 1, fp = 1 + 14 + 0; /* layer1.q_proj, layer1.norm_in */
    const uint32_t nt = g_info.num_tensors;
    const uint32_t recs[3] = {0, cq, fp};
    for (int r = 0; r < 3; r++) {
        for (unsigned k = 0; k < 4; k++) {
            poke_rec(recs[r], R_SHAPE + 4 * k, 4, 0xFFFFFFFFu);
            reject_work("shape", "shape 0xFFFFFFFF");
        }
        poke_rec(recs[r], R_OFFSET, 8, ~(uint64_t)63);
        reject_work("outside", "offset 2^64-64");
        poke_rec(recs[r], R_NBYTES, 8, ~(uint64_t)0);
        reject_work("outside", "nbytes 2^64-1");
        poke_rec(recs[r], R_OFFSET, 8, ~(uint64_t)63);
        poke_rec(recs[r], R_NBYTES, 8, 64);
        reject_work("outside", "offset 2^64-64 + 64 bytes (wraps)");
        poke_rec(recs[r], R_OFFSET, 8, get_u64(g_pristine + rec_off(recs[r]) + R_OFFSET) + 1);
        reject_work("aligned", "offset + 1");
        poke_rec(recs[r], R_OFFSET, 8, get_u64(g_pristine + rec_off(recs[r]) + R_OFFSET) + 32);
        reject_work("aligned", "offset + 32");
        poke_rec(recs[r], R_OFFSET, 8, 0);
        reject_work("outside", "offset 0 (overlaps the header)");
        poke_rec(recs[r], R_OFFSET, 8, 192);
        reject_work("outside", "offset 192 (overlaps the directory)");
        poke_rec(recs[r], R_OFFSET, 8, (g_size + 63) / 64 * 64);
        reject_work("outside", "offset past the end");
        poke_rec(recs[r], R_NBYTES, 8, get_u64(g_pristine + rec_off(recs[r]) + R_NBYTES) + 1);
        reject_work("bytes", "nbytes + 1");
        poke_rec(recs[r], R_NBYTES, 8, 0);
        reject_work("bytes", "nbytes 0");
        const uint8_t dtypes[3] = {0, 9, 5};
        for (int i = 0; i < 3; i++) {
            poke_rec(recs[r], R_DTYPE, 1, dtypes[i]);
            reject_work("dtype", "unknown dtype");
        }
        poke_rec(recs[r], R_DTYPE, 1, recs[r] == fp ? NEEDLE_DTYPE_CQ : NEEDLE_DTYPE_FP16);
        reject_work(NULL, "dtype swapped CQ <-> FP16");
        poke_rec(recs[r], R_NDIM, 1, 5);
        reject_work("ndim", "ndim 5");
        poke_rec(recs[r], R_NDIM, 1, 0xFF);
        reject_work("ndim", "ndim 255");
    }
    /* CQ bits and group */
    const uint32_t bad_bits[] = {0, 1, 6, 255, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof bad_bits / sizeof *bad_bits; i++) {
        poke_rec(cq, R_BITS, 4, bad_bits[i]);
        reject_work("bits", "CQ bits");
    }
    const uint32_t bad_groups[] = {0, 3, 7, 8, 1u << 31, 0xFFFFFFFFu, g_info.group_size * 2};
    for (size_t i = 0; i < sizeof bad_groups / sizeof *bad_groups; i++) {
        poke_rec(cq, R_GROUP, 4, bad_groups[i]);
        reject_work("group", "CQ group");
    }
    poke_rec(fp, R_GROUP, 4, 128);
    reject_work("group", "group on an FP16 record");
    poke_rec(fp, R_BITS, 4, 4);
    reject_work("bits", "bits on an FP16 record");

    if (g_info.has_tokenizer) {
        const uint32_t raw = nt - 1;
        poke_rec(nt - 2, R_DTYPE, 1, NEEDLE_DTYPE_RAW);
        poke_rec(nt - 2, R_NDIM, 1, 0);
        reject_work("RAW", "RAW record not last");
        poke_rec(raw, R_DTYPE, 1, NEEDLE_DTYPE_FP16);
        reject_work(NULL, "tokenizer record not RAW");
        for (unsigned k = 0; k < 4; k++) {
            poke_rec(raw, R_SHAPE + 4 * k, 4, 0xFFFFFFFFu);
            reject_work("RAW", "RAW record with a shape");
        }
        poke_rec(raw, R_NDIM, 1, 1);
        reject_work("RAW", "RAW record with ndim 1");
        poke_rec(raw, R_GROUP, 4, 128);
        reject_work("RAW", "RAW record with a group");
        poke_rec(raw, R_BITS, 4, 4);
        reject_work("RAW", "RAW record with bits");
        poke_rec(raw, R_NBYTES, 8, 0);
        reject_work(NULL, "empty tokenizer blob");
        poke_rec(raw, R_NBYTES, 8, 23);
        reject_work(NULL, "tokenizer blob shorter than its header");
        poke_rec(raw, R_NBYTES, 8, get_u64(g_pristine + rec_off(raw) + R_NBYTES) - 1);
        reject_work(NULL, "tokenizer blob one byte short");
    }
}

static void test_hostile_probe_heads(void) {
    const uint32_t nt = g_info.num_tensors;
    if (!g_info.num_probe_heads) {
        printf("  (fixture has no probe heads: skipped)\n");
        return;
    }
    /* drop records from the end: extra = 1 + 3k - j is not a manifest plus triples */
    const int tok = g_info.has_tokenizer ? 1 : 0;
    poke(H_NUM_TENSORS, 4, nt - tok - 1);
    reject_work("probe-head", "extra = 1 + 3k - 1");
    poke(H_NUM_TENSORS, 4, nt - tok - 2);
    reject_work("probe-head", "extra = 1 + 3k - 2");
    if (g_info.num_probe_heads >= 1) {
        poke(H_NUM_TENSORS, 4, nt - tok - 3); /* a whole triple fewer than the manifest lists */
        reject_work("manifest", "one triple fewer than the manifest");
    }

    /* manifest codes (FP16 blob) */
    needle_tensor_info t = {.size = sizeof t};
    needle_model *m = NULL;
    uint8_t *buf = NULL;
    if (open_copy(g_pristine, g_size, &m, &buf) != NEEDLE_OK) return;
    CHECK_EQ_INT(needle_model_get_tensor(m, g_manifest, &t), NEEDLE_OK);
    needle_model_free(m);
    free(buf);
    CHECK_EQ_INT(t.dtype, NEEDLE_DTYPE_FP16);
    if (t.dtype != NEEDLE_DTYPE_FP16) return;
    const uint16_t codes[] = {0x0000 /* 0 */, 0x4200 /* 3 */, 0x3E00 /* 1.5 */, 0xBC00 /* -1 */,
                              0x7E00 /* NaN */, 0x7C00 /* inf */, 0x3C01 /* 1.000977 */};
    for (uint32_t k = 0; k < g_info.num_probe_heads; k++)
        for (size_t c = 0; c < sizeof codes / sizeof *codes; c++) {
            poke(t.offset + 2 * k, 2, codes[c]);
            reject_work("code", "probe manifest code");
        }
    /* swapping the two codes makes each triple's shape wrong for its kind */
    if (g_info.num_probe_heads == 2 && g_info.probe_head_codes[0] != g_info.probe_head_codes[1]) {
        poke(t.offset, 2, g_info.probe_head_codes[1] == 1 ? 0x3C00 : 0x4000);
        poke(t.offset + 2, 2, g_info.probe_head_codes[0] == 1 ? 0x3C00 : 0x4000);
        error_or_usable("swapped probe codes");
        undo();
    }
    /* a probes tensor with P = 0 */
    poke_rec(g_manifest + 1, R_SHAPE, 4, 0);
    reject_work(NULL, "probe head with 0 probes");
    poke_rec(g_manifest + 2, R_SHAPE, 4, 0xFFFFFFFFu);
    reject_work(NULL, "probe head out_dim 0xFFFFFFFF");
}

/* ---- 5. no tokenizer ------------------------------------------------------------------ */

static void test_no_tokenizer(void) {
    if (!g_info.has_tokenizer) {
        printf("  (fixture has no tokenizer: skipped)\n");
        return;
    }
    poke(H_NUM_TENSORS, 4, g_info.num_tensors - 1);
    needle_model *m;
    uint8_t *buf;
    int rc = open_copy(g_work, g_size, &m, &buf);
    undo();
    CHECK_MSG(rc == NEEDLE_OK, "without RAW record: %s", needle_last_error());
    if (rc) return;
    needle_model_info in = {.size = sizeof in};
    CHECK_EQ_INT(needle_model_get_info(m, &in), NEEDLE_OK);
    CHECK_EQ_INT(in.has_tokenizer, 0);
    CHECK_EQ_INT(in.num_tensors, g_info.num_tensors - 1);
    CHECK_EQ_INT(in.num_probe_heads, g_info.num_probe_heads);
    int32_t ids[8];
    size_t n = 99;
    CHECK_EQ_INT(needle_tokenize(m, "hello", 5, ids, 8, &n), NEEDLE_ERR_NO_TOKENIZER);
    CHECK(strstr(needle_last_error(), "tokenizer") != NULL);
    char text[16];
    const int32_t one = 5;
    CHECK_EQ_INT(needle_detokenize(m, &one, 1, text, sizeof text, &n), NEEDLE_ERR_NO_TOKENIZER);
    const char *piece;
    CHECK_EQ_INT(needle_token_piece(m, 5, &piece, &n), NEEDLE_ERR_NO_TOKENIZER);
    CHECK_EQ_INT(smoke_eval(m, "no tokenizer"), NEEDLE_OK);
    /* same logits as the file with its tokenizer */
    needle_model *full;
    uint8_t *fbuf;
    if (open_copy(g_pristine, g_size, &full, &fbuf) == NEEDLE_OK) {
        float *a = short_logits(m), *b = short_logits(full);
        CHECK(a && b && !memcmp(a, b, in.vocab * sizeof *a));
        free(a);
        free(b);
        needle_model_free(full);
        free(fbuf);
    }
    needle_model_free(m);
    free(buf);
}

/* ---- 5b. rebuilt images: FP32 records, no engram sites ------------------------------- */

/* A copy of the pristine image with `room` zero bytes appended at a 64-aligned offset
 * (*room_off). The caller frees it. */
static uint8_t *grown_copy(size_t room, size_t *size, size_t *room_off) {
    *room_off = (g_size + 63) / 64 * 64;
    *size = *room_off + room;
    uint8_t *img = calloc(1, *size);
    memcpy(img, g_pristine, g_size);
    return img;
}

static void put_u(uint8_t *p, unsigned width, uint64_t v) {
    for (unsigned i = 0; i < width; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* FP16 records rewritten as FP32 (§1.3 allows it; the exporter never writes it) with the
 * same values, appended after the last blob: the model must give identical logits. */
static void test_fp32_records(void) {
    uint32_t idx[4], n = 0;
    idx[n++] = 1;                         /* layer0.norm_in */
    idx[n++] = g_mhc_base + 5;            /* mhc_b_res */
    idx[n++] = g_final_norm;
    if (g_info.num_probe_heads) idx[n++] = g_manifest;
    size_t room = 0;
    for (uint32_t k = 0; k < n; k++)
        room += (2 * get_u64(g_pristine + rec_off(idx[k]) + R_NBYTES) + 63) / 64 * 64;
    size_t size, at;
    uint8_t *img = grown_copy(room, &size, &at);
    for (uint32_t k = 0; k < n; k++) {
        uint8_t *r = img + rec_off(idx[k]);
        CHECK_EQ_INT(r[R_DTYPE], NEEDLE_DTYPE_FP16);
        uint64_t off = get_u64(r + R_OFFSET), count = get_u64(r + R_NBYTES) / 2;
        for (uint64_t i = 0; i < count; i++) {
            const float f = fp16_to_f32(rd_u16(img + off + 2 * i));
            uint32_t bits;
            memcpy(&bits, &f, 4);
            put_u(img + at + 4 * i, 4, bits);
        }
        r[R_DTYPE] = NEEDLE_DTYPE_FP32;
        put_u(r + R_OFFSET, 8, at);
        put_u(r + R_NBYTES, 8, 4 * count);
        at += (4 * count + 63) / 64 * 64;
    }
    needle_model *m = NULL, *ref = NULL;
    uint8_t *buf = NULL, *rbuf = NULL;
    int rc = open_copy(img, size, &m, &buf);
    CHECK_MSG(rc == NEEDLE_OK, "FP32 records: %s", needle_last_error());
    if (rc == NEEDLE_OK && open_copy(g_pristine, g_size, &ref, &rbuf) == NEEDLE_OK) {
        needle_model_info in = {.size = sizeof in};
        needle_model_get_info(m, &in);
        CHECK_EQ_INT(in.num_probe_heads, g_info.num_probe_heads);
        for (uint32_t k = 0; k < n; k++) {
            needle_tensor_info t = {.size = sizeof t};
            size_t cnt = 0, cnt2 = 0;
            CHECK_EQ_INT(needle_model_get_tensor(m, idx[k], &t), NEEDLE_OK);
            CHECK_EQ_INT(t.dtype, NEEDLE_DTYPE_FP32);
            needle_model_decode_tensor(m, idx[k], NULL, 0, &cnt);
            float *a = malloc(cnt * sizeof *a), *b = malloc(cnt * sizeof *b);
            CHECK_EQ_INT(needle_model_decode_tensor(m, idx[k], a, cnt, &cnt), NEEDLE_OK);
            CHECK_EQ_INT(needle_model_decode_tensor(ref, idx[k], b, cnt, &cnt2), NEEDLE_OK);
            CHECK(cnt == cnt2 && memcmp(a, b, cnt * sizeof *a) == 0);
            free(a);
            free(b);
        }
        float *a = short_logits(m), *b = short_logits(ref);
        CHECK(a && b && memcmp(a, b, g_info.vocab * sizeof *a) == 0);
        free(a);
        free(b);
    }
    needle_model_free(m);
    needle_model_free(ref);
    free(buf);
    free(rbuf);
    free(img);
}

/* The engram records dropped and num_engram_sites set to 0: a valid engram-free model.
 * Its other engram fields then describe nothing, so any values must be harmless. */
static void test_no_engram(void) {
    const uint32_t S = g_info.num_engram_sites;
    if (!S) {
        printf("  (fixture has no engram sites: skipped)\n");
        return;
    }
    uint8_t *img = malloc(g_size);
    memcpy(img, g_pristine, g_size);
    const size_t from = rec_off(g_engram_base + 4 * S), to = rec_off(g_engram_base);
    memmove(img + to, img + from, rec_off(g_info.num_tensors) - from);
    put_u(img + H_NUM_TENSORS, 4, g_info.num_tensors - 4 * S);
    put_u(img + H_NUM_SITES, 4, 0);
    for (int k = 0; k < 4; k++) put_u(img + H_SITES + 4 * k, 4, 0);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) /* tables, slots, sub_dim, taps, dilation: nothing uses them now */
            for (unsigned off = 56; off <= 72; off += 4) put_u(img + off, 4, 0xFFFFFFFFu);
        needle_model *m;
        uint8_t *buf;
        int rc = open_copy(img, g_size, &m, &buf);
        CHECK_MSG(rc == NEEDLE_OK || (pass == 1 && rc == NEEDLE_ERR_FORMAT),
                  "engram-free model (pass %d): rc %d (%s)", pass, rc, needle_last_error());
        if (rc == NEEDLE_OK) {
            needle_model_info in = {.size = sizeof in};
            needle_model_get_info(m, &in);
            CHECK_EQ_INT(in.num_engram_sites, 0);
            CHECK_EQ_INT(in.num_tensors, g_info.num_tensors - 4 * S);
            CHECK_EQ_INT(in.has_tokenizer, g_info.has_tokenizer);
            smoke_eval(m, pass ? "engram-free, garbage engram fields" : "engram-free");
            needle_model_free(m);
            free(buf);
        }
    }
    free(img);
}

/* ---- 6. paths ------------------------------------------------------------------------- */

static void expect_open_path_fails(const char *path, int want1, int want2, const char *what) {
    needle_model *sentinel = (needle_model *)&sentinel, *m = sentinel;
    int rc = needle_model_open(path, NULL, &m);
    CHECK_MSG(rc == want1 || rc == want2, "%s: rc %d (%s)", what, rc, needle_last_error());
    CHECK_MSG(needle_last_error()[0] != '\0', "%s: empty message", what);
    CHECK(m == sentinel);
    if (rc == NEEDLE_OK) needle_model_free(m);
}

static char *temp_file(const uint8_t *data, size_t n) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/needle_test_format_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    if (n && write(fd, data, n) != (ssize_t)n) { close(fd); unlink(path); return NULL; }
    close(fd);
    return path;
}

static void test_paths(void) {
    expect_open_path_fails("/nonexistent/needle/model.cact", NEEDLE_ERR_IO, NEEDLE_ERR_IO, "missing");
    expect_open_path_fails(fixture_dir(), NEEDLE_ERR_IO, NEEDLE_ERR_FORMAT, "directory");
    expect_open_path_fails("", NEEDLE_ERR_IO, NEEDLE_ERR_IO, "empty path");
    char *p = temp_file(NULL, 0);
    CHECK(p != NULL);
    if (p) {
        expect_open_path_fails(p, NEEDLE_ERR_FORMAT, NEEDLE_ERR_IO, "empty file");
        unlink(p);
    }
    p = temp_file(g_pristine, 100);
    if (p) {
        expect_open_path_fails(p, NEEDLE_ERR_FORMAT, NEEDLE_ERR_FORMAT, "100-byte file");
        unlink(p);
    }
    p = temp_file(g_pristine, g_size - 1); /* the mmap path sees truncation too */
    if (p) {
        expect_open_path_fails(p, NEEDLE_ERR_FORMAT, NEEDLE_ERR_FORMAT, "file one byte short");
        unlink(p);
    }
    poke(H_TAG, 4, 0x05E12A82u);
    p = temp_file(g_work, g_size);
    undo();
    if (p) {
        expect_open_path_fails(p, NEEDLE_ERR_FORMAT, NEEDLE_ERR_FORMAT, "v1 file");
        CHECK(strstr(needle_last_error(), "old format") != NULL);
        unlink(p);
    }
    /* blob edge cases */
    needle_model *m = NULL;
    uint8_t byte = 0;
    CHECK_EQ_INT(needle_model_open_blob(&byte, 0, NULL, &m), NEEDLE_ERR_FORMAT);
    CHECK(m == NULL);
    uint8_t *raw = malloc(65);
    memcpy(raw, g_pristine, 65);
    CHECK_EQ_INT(needle_model_open_blob(raw + 1, 0, NULL, &m), NEEDLE_ERR_FORMAT);
    CHECK_EQ_INT(needle_model_open_blob(raw + 1, 64, NULL, &m), NEEDLE_ERR_FORMAT);
    CHECK(m == NULL);
    free(raw);
}

/* A model file past 4 GiB (sparse: no disk space used). A 64-bit build maps it and finds
 * no header (zeros); a 32-bit build (armv7) cannot map it whole and must say so, not wrap
 * the 64-bit size to a prefix and read that as the model. */
static void test_file_past_4gib(void) {
    char *p = temp_file(NULL, 0);
    CHECK(p != NULL);
    if (!p) return;
    const off_t big = (off_t)((1ull << 32) + 4096);
    int fd = open(p, O_WRONLY);
    const int sized = fd >= 0 && ftruncate(fd, big) == 0;
    if (fd >= 0) close(fd);
    CHECK_MSG(sized, "cannot make a sparse %lld-byte file: %s", (long long)big, strerror(errno));
    if (sized) {
        needle_model *sentinel = (needle_model *)&sentinel, *m = sentinel;
        const int rc = needle_model_open(p, NULL, &m);
        CHECK(m == sentinel);
        if (sizeof(size_t) < 8) {
            CHECK_EQ_INT(rc, NEEDLE_ERR_IO);
            CHECK_MSG(strstr(needle_last_error(), "address space") != NULL, "message: %s",
                      needle_last_error());
        } else {
            CHECK_EQ_INT(rc, NEEDLE_ERR_FORMAT);
        }
    }
    unlink(p);
}

/* RUN with the CPU seconds of each test, to keep an eye on the suite's cost under ASan. */
#define TIMED_RUN(fn) do { clock_t c0_ = clock(); RUN(fn); \
    printf("     %.1f s\n", (double)(clock() - c0_) / CLOCKS_PER_SEC); } while (0)

int main(void) {
    if (!load_fixture()) {
        fprintf(stderr, "test_format: no usable tests/fixtures/tiny_*.cact\n");
        return 1;
    }
    TIMED_RUN(test_valid_fixtures);
    TIMED_RUN(test_truncation);
    TIMED_RUN(test_corrupt_header);
    TIMED_RUN(test_corrupt_directory);
    TIMED_RUN(test_random_mutations);
    TIMED_RUN(test_hostile_header);
    TIMED_RUN(test_hostile_records);
    TIMED_RUN(test_hostile_probe_heads);
    TIMED_RUN(test_no_tokenizer);
    TIMED_RUN(test_fp32_records);
    TIMED_RUN(test_no_engram);
    TIMED_RUN(test_paths);
    TIMED_RUN(test_file_past_4gib);
    free(g_pristine);
    free(g_work);
    return test_summary();
}
