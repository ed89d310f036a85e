/* The Needle 3 .cact reader (docs/spec/NEEDLE3.md §1; the official writer is
 * cactus-needle 3.2.8 model/export.py).
 *
 * Same container as Needle 2 (codebooks, 44-byte records, 64-byte aligned blobs), a
 * 196-byte header and a different positional layout: per layer 24 records (27 with the
 * q/k/v conv taps), the 9 mHC records, the two Monarch permutations, 4 per engram site,
 * final_norm, the optional probe heads, then the RAW tokenizer. As for v2, the layout is
 * rebuilt from the header (expect3) and every record held to it, so after cact3_parse
 * succeeds each tensor has exactly the shape the forward pass indexes it with, and the
 * permutations are checked to be permutations. A Whistle (speech) file has the same tag
 * plus an audio section; it is recognised and refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/cact.h"
#include "format/cact_walk.h"
#include "util/error.h"
#include "util/fp16.h"

#define AUDIO_MANIFEST_MAGIC 3246.0f
#define AUDIO_MANIFEST_LEN 13u
#define MAX_HEAD_PROBES 64u
#define MAX_HEAD_OUT 4096u

static uint32_t bit_length(uint32_t x) {
    uint32_t n = 0;
    while (x) {
        n++;
        x >>= 1;
    }
    return n;
}

/* The record of the v3 layout at `index` (index <= final_norm_index). */
static void expect3(const cact_file *f, uint32_t index, cact_expected *e) {
    const cact3_header *h = &f->h3;
    const uint64_t d = h->d_model, N = h->hada_n, T = h->qkv_conv_taps;
    const uint64_t qd = (uint64_t)h->num_heads * h->qk_head_dim;
    const uint64_t kd = (uint64_t)h->num_kv_heads * h->qk_head_dim;
    const uint64_t vd = (uint64_t)h->num_kv_heads * h->v_head_dim;
    const uint64_t od = (uint64_t)h->num_heads * h->v_head_dim;
    const uint64_t L = h->num_layers, n = h->mhc_lanes;
    const uint64_t ba = f->l3.hada_ba, bb = f->l3.hada_bb;
    char name[40];
    if (index == 0) {
        cact_expect(e, "embedding", EXPECT_CQ, 2, h->vocab, d, 0);
        return;
    }
    if (index < f->mhc_base) {
        const uint32_t layer = (index - 1) / f->l3.layer_stride;
        uint32_t k = (index - 1) % f->l3.layer_stride;
        /* without taps, positions 4.. of the 27-record list shift down by three */
        if (!T && k >= 4) k += 3;
        static const char *names[27] = {
            "norm_in", "q_proj", "k_proj", "v_proj", "q_taps", "k_taps", "v_taps",
            "q_norm", "k_norm", "gate_proj", "out_proj", "post_norm", "attn_gate",
            "pre_hada", "d1", "d2", "b2", "d3", "d4", "w1a", "w1b", "w2a", "w2b", "w3a",
            "w3b", "cond_v", "cond_u"};
        snprintf(name, sizeof name, "layer%u.%s", layer, names[k]);
        switch (k) {
        case 0: case 11: case 13: cact_expect(e, name, EXPECT_FLOAT, 1, d, 0, 0); break;
        case 1: cact_expect(e, name, EXPECT_CQ, 2, qd, d, 0); break;
        case 2: cact_expect(e, name, EXPECT_CQ, 2, kd, d, 0); break;
        case 3: cact_expect(e, name, EXPECT_CQ, 2, vd, d, 0); break;
        case 4: cact_expect(e, name, EXPECT_FLOAT, 2, T, qd, 0); break;
        case 5: cact_expect(e, name, EXPECT_FLOAT, 2, T, kd, 0); break;
        case 6: cact_expect(e, name, EXPECT_FLOAT, 2, T, vd, 0); break;
        case 7: case 8: cact_expect(e, name, EXPECT_FLOAT, 1, h->qk_head_dim, 0, 0); break;
        case 9: cact_expect(e, name, EXPECT_CQ, 2, od, d, 0); break;
        case 10: cact_expect(e, name, EXPECT_CQ, 2, d, od, 0); break;
        case 12: cact_expect(e, name, EXPECT_FLOAT, 1, 1, 0, 0); break;
        case 19: case 21: case 23: cact_expect(e, name, EXPECT_FLOAT, 2, ba, ba, 0); break;
        case 20: case 22: case 24: cact_expect(e, name, EXPECT_FLOAT, 2, bb, bb, 0); break;
        case 25: cact_expect(e, name, EXPECT_FLOAT, 2, d, CACT3_COND_RANK, 0); break;
        case 26: cact_expect(e, name, EXPECT_FLOAT, 2, CACT3_COND_RANK, N, 0); break;
        default: cact_expect(e, name, EXPECT_FLOAT, 1, N, 0, 0); break; /* d1 d2 b2 d3 d4 */
        }
        return;
    }
    if (index < f->l3.perm_index) {
        switch (index - f->mhc_base) {
        case 0: cact_expect(e, "mhc_a_pre", EXPECT_FLOAT, 1, L, 0, 0); break;
        case 1: cact_expect(e, "mhc_a_post", EXPECT_FLOAT, 1, L, 0, 0); break;
        case 2: cact_expect(e, "mhc_a_res", EXPECT_FLOAT, 1, L, 0, 0); break;
        case 3: cact_expect(e, "mhc_b_pre", EXPECT_FLOAT, 2, L, n, 0); break;
        case 4: cact_expect(e, "mhc_b_post", EXPECT_FLOAT, 2, L, n, 0); break;
        case 5: cact_expect(e, "mhc_b_res", EXPECT_FLOAT, 3, L, n, n); break;
        case 6: cact_expect(e, "mhc_phi_pre", EXPECT_CQ, 2, L * n, n * d, 0); break;
        case 7: cact_expect(e, "mhc_phi_post", EXPECT_CQ, 2, L * n, n * d, 0); break;
        default: cact_expect(e, "mhc_phi_res", EXPECT_CQ, 2, L * n * n, n * d, 0); break;
        }
        return;
    }
    if (index < f->engram_base) {
        cact_expect(e, index == f->l3.perm_index ? "hada_p1" : "hada_p2", EXPECT_FLOAT, 1, N,
                    0, 0);
        return;
    }
    if (index < f->final_norm_index) {
        const uint32_t site = (index - f->engram_base) / 4, k = (index - f->engram_base) % 4;
        const uint64_t Tb = h->num_engram_tables, sub = h->engram_sub_dim;
        static const char *names[4] = {"tables", "key_proj", "value_proj", "taps"};
        snprintf(name, sizeof name, "engram%u.%s", site, names[k]);
        if (k == 0) cact_expect(e, name, EXPECT_CQ, 2, Tb * h->engram_slots, sub, 0);
        else if (k == 3) cact_expect(e, name, EXPECT_FLOAT, 2, h->engram_conv_taps, d, 0);
        else cact_expect(e, name, EXPECT_CQ, 2, d, Tb * sub, 0);
        return;
    }
    cact_expect(e, "final_norm", EXPECT_FLOAT, 1, d, 0, 0);
}

/* Value k of a validated float record. */
static float float_at(const cact_tensor *t, uint64_t k) {
    return t->dtype == CACT_FP16 ? fp16_to_f32(rd_u16(t->data + 2 * k)) : rd_f32(t->data + 4 * k);
}

static int check_header3(cact_file *f) {
    const uint8_t *p = f->base;
    cact3_header *h = &f->h3;
    uint32_t *fields = &h->tag;
    for (int i = 0; i < 48; i++) fields[i] = rd_u32(p + 4 * i);
    h->rope_theta = rd_f32(p + 192);

    if (h->codebook_len != CACT_CODEBOOK_LEN)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact3: codebook_len %u (expected %u)",
                           h->codebook_len, CACT_CODEBOOK_LEN);
    const cact_bound bounds[] = {
        {"vocab", h->vocab, 1, MAX_VOCAB},
        {"out_vocab", h->out_vocab, 0, h->vocab},
        {"d_model", h->d_model, 1, MAX_D_MODEL},
        {"num_layers", h->num_layers, 1, CACT3_MAX_LAYERS},
        {"num_heads", h->num_heads, 1, MAX_HEADS},
        {"num_kv_heads", h->num_kv_heads, 1, MAX_HEADS},
        {"qk_head_dim", h->qk_head_dim, 2, MAX_HEAD_DIM},
        {"v_head_dim", h->v_head_dim, 1, MAX_HEAD_DIM},
        {"max_seq_len", h->max_seq_len, 1, MAX_SEQ_LEN},
        {"hada_n", h->hada_n, 1, 2 * MAX_D_MODEL},
        {"mhc_lanes", h->mhc_lanes, 1, MAX_LANES},
        {"sliding_window", h->sliding_window, 0, MAX_SEQ_LEN},
        {"qkv_conv_taps", h->qkv_conv_taps, 0, MAX_TAPS},
        {"num_engram_orders", h->num_engram_orders, 0, 4},
        {"num_engram_sites", h->num_engram_sites, 0, CACT3_MAX_SITES},
        {"kv_window", h->kv_window, 0, MAX_SEQ_LEN},
    };
    int rc = cact_check_bounds("cact3", bounds, sizeof bounds / sizeof bounds[0]);
    if (rc) return rc;
    const cact_common_fields common = {
        .who = "cact3", .head_dim_name = "qk_head_dim", .num_heads = h->num_heads,
        .num_kv_heads = h->num_kv_heads, .head_dim = h->qk_head_dim, .hada_n = h->hada_n,
        .d_model = h->d_model, .num_layers = h->num_layers, .rope_theta = h->rope_theta,
        .num_engram_orders = h->num_engram_orders, .num_engram_sites = h->num_engram_sites,
        .num_engram_tables = h->num_engram_tables, .engram_slots = h->engram_slots,
        .engram_sub_dim = h->engram_sub_dim, .engram_conv_taps = h->engram_conv_taps,
        .engram_conv_dilation = h->engram_conv_dilation, .engram_orders = h->engram_orders,
        .engram_sites = h->engram_sites};
    rc = cact_check_common(&common);
    if (rc) return rc;
    const uint64_t mask = (uint64_t)h->global_mask_hi << 32 | h->global_mask_lo;
    if (h->num_layers < 64 && mask >> h->num_layers)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact3: global_mask 0x%016llx marks layers past "
                           "num_layers %u", (unsigned long long)mask, h->num_layers);
    if (h->num_engram_sites > 0 && h->engram_seed_heads > MAX_TABLES)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact3: engram_seed_heads %u out of range",
                           h->engram_seed_heads);
    return cact_read_codebooks(f, CACT3_HEADER_BYTES);
}

/* hada_p1/p2 must be permutations of [0, N): they index activation vectors. */
static int check_permutation(cact_file *f, uint32_t index) {
    const cact_tensor *t = &f->tensors[index];
    const uint32_t N = f->h3.hada_n;
    uint8_t *seen = calloc(N, 1);
    if (!seen) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "cact3: out of memory");
    int rc = NEEDLE_OK;
    for (uint32_t i = 0; i < N && rc == NEEDLE_OK; i++) {
        const float v = float_at(t, i);
        if (!(v >= 0.0f && v < (float)N) || v != floorf(v) || seen[(uint32_t)v]++)
            rc = needle_fail(NEEDLE_ERR_FORMAT, "cact3: tensor %u (%s) is not a permutation "
                             "of [0, %u): entry %u is %g", index, t->name, N, i, (double)v);
    }
    free(seen);
    return rc;
}

/* The probe-head section after final_norm: a manifest of codes (1 embedding, 2
 * confidence, 3 router, in that order), then per head probes, gain, query, row_bias,
 * proj, bias (+ calibration for the router). Consumes exactly `count` records. */
static int check_heads3(cact_file *f, uint32_t first, uint32_t count) {
    if (count == 0) return NEEDLE_OK;
    const uint64_t d = f->h3.d_model, L1 = (uint64_t)f->h3.num_layers + 1;
    const cact_tensor *m = &f->tensors[first];
    if (m->ndim != 1 || m->shape[0] < 1 || m->shape[0] > 3)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact3: %u records after final_norm, but record "
                           "%u is not a heads manifest of 1 to 3 codes", count, first);
    const uint32_t heads = m->shape[0];
    cact_expected e;
    cact_expect(&e, "heads.manifest", EXPECT_FLOAT, 1, heads, 0, 0);
    int rc = cact_check_record(f, first, &e);
    if (rc) return rc;
    uint32_t at = first + 1, prev = 0;
    static const char *kinds[4] = {"", "embedding", "confidence", "router"};
    for (uint32_t k = 0; k < heads; k++) {
        const float codef = float_at(m, k);
        const uint32_t code = codef == 1.0f ? 1 : codef == 2.0f ? 2 : codef == 3.0f ? 3 : 0;
        if (!code || code <= prev)
            return needle_fail(NEEDLE_ERR_FORMAT, "cact3: probe head %u has code %g (expected "
                               "1, 2, 3 in increasing order)", k, (double)codef);
        prev = code;
        const uint32_t need = code == 3 ? 7 : 6;
        if (at + need > first + count)
            return needle_fail(NEEDLE_ERR_FORMAT, "cact3: the %s head needs %u records, %u "
                               "remain", kinds[code], need, first + count - at);
        const cact_tensor *probes = &f->tensors[at], *query = &f->tensors[at + 2];
        const cact_tensor *proj = &f->tensors[at + 4];
        const uint64_t kp = probes->shape[0] / L1, q = query->shape[0], out = proj->shape[0];
        if (kp < 1 || kp > MAX_HEAD_PROBES || q < 1 || q > MAX_HEAD_PROBES || out < 1 ||
            out > MAX_HEAD_OUT || (code == 2 && out != 1) || (code == 3 && out != 3))
            return needle_fail(NEEDLE_ERR_FORMAT, "cact3: the %s head's shapes are out of "
                               "range", kinds[code]);
        char name[40];
        const struct { const char *what; int kind; uint32_t ndim; uint64_t s0, s1, s2; } rec[7] = {
            {"probes", EXPECT_CQ, 2, L1 * kp, d, 0}, {"gain", EXPECT_FLOAT, 2, L1, kp, 0},
            {"query", EXPECT_CQ, 2, q, d, 0}, {"row_bias", EXPECT_FLOAT, 3, q, L1, kp},
            {"proj", EXPECT_CQ, 2, out, q * d, 0}, {"bias", EXPECT_FLOAT, 1, out, 0, 0},
            {"calibration", EXPECT_FLOAT, 1, 3, 0, 0}};
        for (uint32_t r = 0; r < need; r++) {
            snprintf(name, sizeof name, "%s_head.%s", kinds[code], rec[r].what);
            cact_expect(&e, name, rec[r].kind, rec[r].ndim, rec[r].s0, rec[r].s1, rec[r].s2);
            if ((rc = cact_check_record(f, at + r, &e))) return rc;
        }
        f->l3.head_codes[k] = code;
        at += need;
    }
    if (at != first + count)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact3: %u records after the probe heads",
                           first + count - at);
    f->l3.heads_index = first;
    f->l3.num_heads = heads;
    return NEEDLE_OK;
}

int cact3_parse(const uint8_t *data, size_t size, cact_file *out) {
    memset(out, 0, sizeof *out);
    if (size < CACT3_HEADER_BYTES + 4 * CACT_CODEBOOK_LEN)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact3: file is %zu bytes, too small for a "
                           "Needle 3 header (truncated?)", size);
    cact_file f;
    memset(&f, 0, sizeof f);
    f.generation = 3;
    f.base = data;
    f.size = size;
    f.tokenizer_index = -1;
    int rc = check_header3(&f);
    if (rc) return rc;
    const cact3_header *h = &f.h3;

    const uint64_t dir = CACT3_HEADER_BYTES + 4ull * h->codebook_len;
    const uint64_t dir_end = dir + (uint64_t)CACT_RECORD_BYTES * h->num_tensors;
    if (dir_end > size)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact3: directory of %u records ends at byte "
                           "%llu past the end of the %zu-byte file (truncated?)",
                           h->num_tensors, (unsigned long long)dir_end, size);
    f.l3.layer_stride = h->qkv_conv_taps ? 27 : 24;
    f.l3.hada_ba = 1u << (bit_length(h->hada_n - 1) / 2);
    f.l3.hada_bb = h->hada_n / f.l3.hada_ba;
    f.mhc_base = 1 + f.l3.layer_stride * h->num_layers;
    f.l3.perm_index = f.mhc_base + 9;
    f.engram_base = f.l3.perm_index + 2;
    f.final_norm_index = f.engram_base + 4 * h->num_engram_sites;
    const uint32_t base_count = f.final_norm_index + 1;
    if (h->num_tensors < base_count)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact3: %u tensors, the geometry needs at least "
                           "%u", h->num_tensors, base_count);

    f.num_tensors = h->num_tensors;
    f.tensors = calloc(h->num_tensors, sizeof *f.tensors);
    if (!f.tensors) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "cact3: out of memory");
    if ((rc = cact_read_directory(&f, dir, dir_end))) goto error;

    /* A Whistle file carries an FP32 audio manifest (13 values, the first 3246) between
     * the text model and the tokenizer; say so rather than report a layout error. */
    for (uint32_t i = base_count; i < f.num_tensors; i++) {
        const cact_tensor *t = &f.tensors[i];
        if (t->dtype == CACT_FP32 && t->ndim == 1 && t->shape[0] == AUDIO_MANIFEST_LEN &&
            t->nbytes == 4 * AUDIO_MANIFEST_LEN && rd_f32(t->data) == AUDIO_MANIFEST_MAGIC) {
            rc = needle_fail(NEEDLE_ERR_FORMAT, "cact3: this is a Whistle (speech) model "
                             "(audio section at tensor %u); needle runs Needle text models "
                             "only", i);
            goto error;
        }
    }
    for (uint32_t i = 0; i < base_count; i++) {
        cact_expected e;
        expect3(&f, i, &e);
        if ((rc = cact_check_record(&f, i, &e))) goto error;
    }
    if ((rc = check_permutation(&f, f.l3.perm_index)) ||
        (rc = check_permutation(&f, f.l3.perm_index + 1)))
        goto error;
    const uint32_t extra = h->num_tensors - base_count - (f.tokenizer_index >= 0 ? 1u : 0u);
    if ((rc = check_heads3(&f, base_count, extra))) goto error;

    cact_set_analytic_levels(&f);
    *out = f;
    needle_clear_error();
    return NEEDLE_OK;

error:
    free(f.tensors);
    return rc;
}
