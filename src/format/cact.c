/* .cact v2 parser and validator (spec §1 and Appendix A).
 *
 * The file names no tensors: position in the directory says what a record is. We
 * therefore rebuild the expected layout from the header geometry (expect_tensor) and hold
 * every record to it, so a file that parses is a file whose every tensor has exactly the
 * shape the forward pass will index it with. All arithmetic on untrusted numbers is done
 * in 64 bits after bounding the factors, so no product can wrap. */
#include "format/cact.h"
#include "format/cact_walk.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fp16.h"

static int fail(const char *fmt_prefix, uint32_t index, const char *what) {
    return needle_fail(NEEDLE_ERR_FORMAT, "%s tensor %u: %s", fmt_prefix, index, what);
}

uint64_t cact_cq_row_bytes(uint64_t cols_pad, uint32_t bits) {
    return bits == CACT_BITS_TERNARY ? cols_pad / 4 : cols_pad * bits / 8;
}

int cact_is_pow2(uint32_t x) { return x && !(x & (x - 1)); }

void cact_expect(cact_expected *e, const char *name, int kind, uint32_t ndim, uint64_t s0,
                         uint64_t s1, uint64_t s2) {
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = kind;
    e->ndim = ndim;
    e->shape[0] = s0;
    e->shape[1] = s1;
    e->shape[2] = s2;
    e->shape[3] = 0;
}

/* The record the layout of §1.9 puts at `index` (index < the probe-head section). */
static void expect_tensor(const cact_file *f, uint32_t index, cact_expected *e) {
    const cact_header *h = &f->h;
    uint64_t d = h->d_model, A = (uint64_t)h->num_heads * h->head_dim;
    uint64_t kvd = (uint64_t)h->num_kv_heads * h->head_dim, n = h->mhc_lanes, L = h->num_layers;
    char name[40];
    if (index == 0) {
        cact_expect(e, "embedding", EXPECT_CQ, 2, h->vocab, d, 0);
        return;
    }
    if (index < f->mhc_base) {
        uint32_t layer = (index - 1) / 14, k = (index - 1) % 14;
        static const char *names[14] = {"norm_in", "q_proj", "k_proj", "v_proj", "q_norm",
                                        "k_norm", "gate_proj", "out_proj", "post_norm",
                                        "attn_gate", "pre_hada", "d1", "d2", "d3"};
        snprintf(name, sizeof name, "layer%u.%s", layer, names[k]);
        switch (k) {
        case 0: case 8: case 10: cact_expect(e, name, EXPECT_FLOAT, 1, d, 0, 0); break;
        case 1: case 6: cact_expect(e, name, EXPECT_CQ, 2, A, d, 0); break;
        case 2: case 3: cact_expect(e, name, EXPECT_CQ, 2, kvd, d, 0); break;
        case 4: case 5: cact_expect(e, name, EXPECT_FLOAT, 1, h->head_dim, 0, 0); break;
        case 7: cact_expect(e, name, EXPECT_CQ, 2, d, A, 0); break;
        case 9: cact_expect(e, name, EXPECT_FLOAT, 1, 1, 0, 0); break;
        default: cact_expect(e, name, EXPECT_FLOAT, 1, h->hada_n, 0, 0); break;
        }
        return;
    }
    if (index < f->engram_base) {
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
    if (index < f->final_norm_index) {
        uint32_t site = (index - f->engram_base) / 4, k = (index - f->engram_base) % 4;
        uint64_t T = h->num_engram_tables, sub = h->engram_sub_dim;
        static const char *names[4] = {"tables", "key_proj", "value_proj", "taps"};
        snprintf(name, sizeof name, "engram%u.%s", site, names[k]);
        if (k == 0) cact_expect(e, name, EXPECT_CQ, 2, T * h->engram_slots, sub, 0);
        else if (k == 3) cact_expect(e, name, EXPECT_FLOAT, 2, h->engram_conv_taps, d, 0);
        else cact_expect(e, name, EXPECT_CQ, 2, d, T * sub, 0);
        return;
    }
    cact_expect(e, "final_norm", EXPECT_FLOAT, 1, d, 0, 0);
}

int cact_read_codebooks(cact_file *f, size_t at) {
    const uint8_t *cb = f->base + at;
    static const int sizes[3] = {4, 8, 16};
    int off = 0;
    for (int b = 2; b <= 4; b++) {
        for (int k = 0; k < sizes[b - 2]; k++) {
            float v = rd_f32(cb + 4 * (off + k));
            if (!isfinite(v))
                return needle_fail(NEEDLE_ERR_FORMAT, "cact: codebook value %d is not finite",
                                   off + k);
            f->codebooks[b][k] = v;
        }
        off += sizes[b - 2];
    }
    return NEEDLE_OK;
}

int cact_check_bounds(const char *who, const cact_bound *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i].value < b[i].lo || b[i].value > b[i].hi)
            return needle_fail(NEEDLE_ERR_FORMAT, "%s: header %s = %u is outside [%u, %u]", who,
                               b[i].name, b[i].value, b[i].lo, b[i].hi);
    return NEEDLE_OK;
}

int cact_check_common(const cact_common_fields *c) {
    const char *who = c->who;
    if (c->num_heads % c->num_kv_heads)
        return needle_fail(NEEDLE_ERR_FORMAT, "%s: num_heads %u is not a multiple of "
                           "num_kv_heads %u", who, c->num_heads, c->num_kv_heads);
    if (c->head_dim % 2)
        return needle_fail(NEEDLE_ERR_FORMAT, "%s: %s %u is odd (RoPE needs halves)", who,
                           c->head_dim_name, c->head_dim);
    if (!cact_is_pow2(c->hada_n) || c->hada_n < c->d_model)
        return needle_fail(NEEDLE_ERR_FORMAT, "%s: hada_n %u must be a power of two >= "
                           "d_model %u", who, c->hada_n, c->d_model);
    if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
        return needle_fail(NEEDLE_ERR_FORMAT, "%s: rope_theta %g is not a finite value > 1", who,
                           (double)c->rope_theta);
    if (c->num_engram_sites == 0) return NEEDLE_OK;
    if (c->num_engram_orders == 0)
        return needle_fail(NEEDLE_ERR_FORMAT, "%s: engram sites without n-gram orders", who);
    uint32_t max_order = 0;
    for (uint32_t i = 0; i < c->num_engram_orders; i++) {
        if (c->engram_orders[i] < 1 || c->engram_orders[i] > MAX_ORDER)
            return needle_fail(NEEDLE_ERR_FORMAT, "%s: engram order %u out of range", who,
                               c->engram_orders[i]);
        if (c->engram_orders[i] > max_order) max_order = c->engram_orders[i];
    }
    for (uint32_t i = 0; i < c->num_engram_sites; i++) {
        if (c->engram_sites[i] >= c->num_layers)
            return needle_fail(NEEDLE_ERR_FORMAT, "%s: engram site %u is not a layer "
                               "(num_layers %u)", who, c->engram_sites[i], c->num_layers);
        for (uint32_t j = 0; j < i; j++)
            if (c->engram_sites[j] == c->engram_sites[i])
                return needle_fail(NEEDLE_ERR_FORMAT, "%s: engram site %u listed twice", who,
                                   c->engram_sites[i]);
    }
    if (c->num_engram_tables < 1 || c->num_engram_tables > MAX_TABLES ||
        c->num_engram_tables % c->num_engram_orders)
        return needle_fail(NEEDLE_ERR_FORMAT, "%s: num_engram_tables %u must be a positive "
                           "multiple of num_engram_orders %u (<= %u)", who,
                           c->num_engram_tables, c->num_engram_orders, MAX_TABLES);
    const cact_bound engram[] = {
        {"engram_slots", c->engram_slots, 1, MAX_SLOTS},
        {"engram_sub_dim", c->engram_sub_dim, 1, MAX_D_MODEL},
        {"engram_conv_taps", c->engram_conv_taps, 1, MAX_TAPS},
    };
    const int rc = cact_check_bounds(who, engram, sizeof engram / sizeof engram[0]);
    if (rc) return rc;
    if (c->engram_conv_dilation != max_order)
        return needle_fail(NEEDLE_ERR_FORMAT, "%s: engram_conv_dilation %u != max order %u", who,
                           c->engram_conv_dilation, max_order);
    return NEEDLE_OK;
}

static int check_header(cact_file *f) {
    const uint8_t *p = f->base;
    cact_header *h = &f->h;
    uint32_t *fields = &h->tag;
    /* The header is 29 u32 fields followed by one f32, in struct order. */
    for (int i = 0; i < 29; i++) fields[i] = rd_u32(p + 4 * i);
    h->rope_theta = rd_f32(p + 116);

    if (h->tag == CACT_TAG_V1)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact: old format tag 0x%08X (20-byte header) is "
                           "not supported; re-export with a Needle 2 exporter", h->tag);
    if (h->tag != CACT_TAG)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact: bad tag 0x%08X (expected 0x%08X for Needle 2 "
                           "or 0x%08X for Needle 3): not a Needle .cact file", h->tag,
                           CACT_TAG, CACT3_TAG);
    if (h->codebook_len != CACT_CODEBOOK_LEN)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact: codebook_len %u (expected %u)",
                           h->codebook_len, CACT_CODEBOOK_LEN);
    const cact_bound bounds[] = {
        {"vocab", h->vocab, 1, MAX_VOCAB},
        {"d_model", h->d_model, 1, MAX_D_MODEL},
        {"num_layers", h->num_layers, 1, MAX_LAYERS},
        {"num_heads", h->num_heads, 1, MAX_HEADS},
        {"num_kv_heads", h->num_kv_heads, 1, MAX_HEADS},
        {"head_dim", h->head_dim, 2, MAX_HEAD_DIM},
        {"max_seq_len", h->max_seq_len, 1, MAX_SEQ_LEN},
        {"hada_n", h->hada_n, 1, 2 * MAX_D_MODEL},
        {"mhc_lanes", h->mhc_lanes, 1, MAX_LANES},
        {"num_engram_orders", h->num_engram_orders, 0, 4},
        {"num_engram_sites", h->num_engram_sites, 0, 4},
        {"kv_window", h->kv_window, 0, MAX_SEQ_LEN},
    };
    int rc = cact_check_bounds("cact", bounds, sizeof bounds / sizeof bounds[0]);
    if (rc) return rc;
    const cact_common_fields common = {
        .who = "cact", .head_dim_name = "head_dim", .num_heads = h->num_heads,
        .num_kv_heads = h->num_kv_heads, .head_dim = h->head_dim, .hada_n = h->hada_n,
        .d_model = h->d_model, .num_layers = h->num_layers, .rope_theta = h->rope_theta,
        .num_engram_orders = h->num_engram_orders, .num_engram_sites = h->num_engram_sites,
        .num_engram_tables = h->num_engram_tables, .engram_slots = h->engram_slots,
        .engram_sub_dim = h->engram_sub_dim, .engram_conv_taps = h->engram_conv_taps,
        .engram_conv_dilation = h->engram_conv_dilation, .engram_orders = h->engram_orders,
        .engram_sites = h->engram_sites};
    rc = cact_check_common(&common);
    if (rc) return rc;
    return cact_read_codebooks(f, CACT_HEADER_BYTES);
}

int cact_check_record(cact_file *f, uint32_t i, const cact_expected *e) {
    cact_tensor *t = &f->tensors[i];
    if (t->ndim != e->ndim) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s has ndim %u, expected %u", e->name, t->ndim, e->ndim);
        return fail("cact:", i, msg);
    }
    for (uint32_t k = 0; k < 4; k++) {
        uint64_t want = k < e->ndim ? e->shape[k] : 0;
        if (t->shape[k] != want) {
            char msg[128];
            snprintf(msg, sizeof msg, "%s shape[%u] = %u, expected %llu", e->name, k,
                     t->shape[k], (unsigned long long)want);
            return fail("cact:", i, msg);
        }
    }
    uint64_t nbytes;
    if (e->kind == EXPECT_FLOAT) {
        if (t->dtype != CACT_FP16 && t->dtype != CACT_FP32) {
            char msg[96];
            snprintf(msg, sizeof msg, "%s has dtype %u, expected FP16 or FP32", e->name, t->dtype);
            return fail("cact:", i, msg);
        }
        uint64_t count = 1;
        for (uint32_t k = 0; k < e->ndim; k++) count *= e->shape[k];
        nbytes = count * (t->dtype == CACT_FP16 ? 2u : 4u);
    } else {
        if (t->dtype != CACT_CQ) {
            char msg[96];
            snprintf(msg, sizeof msg, "%s has dtype %u, expected CQ", e->name, t->dtype);
            return fail("cact:", i, msg);
        }
        if (f->generation == 3 && (t->bits < 1 || t->bits > 5))
            return fail("cact3:", i, "CQ bits must be 1 (binary), 2, 3, 4 or 5 (ternary)");
        if (f->generation != 3 && (t->bits < 2 || t->bits > 5))
            return fail("cact:", i, "CQ bits must be 2, 3, 4 or 5 (ternary)");
        if (!cact_is_pow2(t->group) || t->group < 16 || t->group > MAX_GROUP)
            return fail("cact:", i, "CQ group size must be a power of two in [16, 4096]");
        if (f->group && t->group != f->group)
            return fail("cact:", i, "CQ group size differs from the file's other CQ tensors");
        f->group = t->group;
        uint64_t rows = e->shape[0], cols = e->shape[1];
        uint64_t cols_pad = (cols + t->group - 1) / t->group * t->group;
        nbytes = rows * cact_cq_row_bytes(cols_pad, t->bits) + 2 * rows * (cols_pad / t->group);
    }
    if (t->nbytes != nbytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s has %llu bytes, its shape needs %llu", e->name,
                 (unsigned long long)t->nbytes, (unsigned long long)nbytes);
        return fail("cact:", i, msg);
    }
    snprintf(t->name, sizeof t->name, "%s", e->name);
    return NEEDLE_OK;
}

/* The probe-head section (§1.10) sits between final_norm and the optional tokenizer. */
static int check_probe_heads(cact_file *f, uint32_t first, uint32_t count) {
    if (count == 0) return NEEDLE_OK;
    if ((count - 1) % 3 != 0)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact: %u tensors after final_norm do not form a "
                           "probe-head manifest plus triples", count);
    uint32_t heads = (count - 1) / 3;
    if (heads > CACT_MAX_PROBE_HEADS)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact: %u probe heads (at most %u)", heads,
                           CACT_MAX_PROBE_HEADS);
    cact_tensor *m = &f->tensors[first];
    cact_expected e;
    cact_expect(&e, "heads.manifest", EXPECT_FLOAT, 1, heads, 0, 0);
    int rc = cact_check_record(f, first, &e);
    if (rc) return rc;
    uint64_t d = f->h.d_model;
    for (uint32_t k = 0; k < heads; k++) {
        float code = m->dtype == CACT_FP16 ? fp16_to_f32(rd_u16(m->data + 2 * k))
                                           : rd_f32(m->data + 4 * k);
        if (code != 1.0f && code != 2.0f)
            return needle_fail(NEEDLE_ERR_FORMAT, "cact: probe head %u has unknown code %g", k,
                               (double)code);
        uint32_t base = first + 1 + 3 * k;
        cact_tensor *probes = &f->tensors[base], *proj = &f->tensors[base + 1];
        uint64_t P = probes->shape[0], out = proj->shape[0];
        if (P < 1 || P > 64 || out < 1 || out > 4096)
            return fail("cact:", base, "probe head shape out of range");
        char name[40];
        const char *kind = code == 1.0f ? "contrastive" : "confidence";
        snprintf(name, sizeof name, "heads.%s.probes", kind);
        cact_expect(&e, name, EXPECT_FLOAT, 2, P, d, 0);
        if ((rc = cact_check_record(f, base, &e))) return rc;
        snprintf(name, sizeof name, "heads.%s.proj", kind);
        cact_expect(&e, name, EXPECT_FLOAT, 2, out, P * d, 0);
        if ((rc = cact_check_record(f, base + 1, &e))) return rc;
        snprintf(name, sizeof name, "heads.%s.bias", kind);
        cact_expect(&e, name, EXPECT_FLOAT, 1, out, 0, 0);
        if ((rc = cact_check_record(f, base + 2, &e))) return rc;
        cact_probe_head *ph = &f->probe_heads[k];
        ph->code = (uint32_t)code;
        ph->probes_index = base;
        ph->proj_index = base + 1;
        ph->bias_index = base + 2;
        ph->num_probes = (uint32_t)P;
        ph->out_dim = (uint32_t)out;
    }
    f->num_probe_heads = heads;
    return NEEDLE_OK;
}

int cact_read_directory(cact_file *f, uint64_t dir, uint64_t dir_end) {
    int rc;
    for (uint32_t i = 0; i < f->num_tensors; i++) {
        const uint8_t *r = f->base + dir + (uint64_t)CACT_RECORD_BYTES * i;
        cact_tensor *t = &f->tensors[i];
        t->dtype = r[0];
        t->ndim = r[1];
        for (int k = 0; k < 4; k++) t->shape[k] = rd_u32(r + 4 + 4 * k);
        t->offset = rd_u64(r + 20);
        t->nbytes = rd_u64(r + 28);
        t->group = rd_u32(r + 36);
        t->bits = rd_u32(r + 40);
        if (t->dtype < CACT_FP16 || t->dtype > CACT_RAW || t->ndim > 4) {
            rc = fail("cact:", i, "unknown dtype or ndim > 4");
            return rc;
        }
        if (t->offset % CACT_ALIGN) {
            rc = fail("cact:", i, "data offset is not 64-byte aligned");
            return rc;
        }
        if (t->offset < dir_end || t->offset > f->size || t->nbytes > f->size - t->offset) {
            char msg[160];
            snprintf(msg, sizeof msg, "data [%llu, +%llu) lies outside the file's data region "
                     "[%llu, %zu) (truncated or corrupt)", (unsigned long long)t->offset,
                     (unsigned long long)t->nbytes, (unsigned long long)dir_end, f->size);
            rc = fail("cact:", i, msg);
            return rc;
        }
        t->data = f->base + t->offset;
        if (t->dtype == CACT_RAW) {
            if (i != f->num_tensors - 1) {
                rc = fail("cact:", i, "RAW record before the end of the directory");
                return rc;
            }
            if (t->ndim != 0 || t->shape[0] || t->shape[1] || t->shape[2] || t->shape[3] ||
                t->group || t->bits) {
                rc = fail("cact:", i, "RAW record with a shape, group or bits");
                return rc;
            }
            f->tokenizer_index = (int32_t)i;
            snprintf(t->name, sizeof t->name, "tokenizer");
        } else if (t->dtype != CACT_CQ && (t->group || t->bits)) {
            rc = fail("cact:", i, "group/bits set on a non-CQ record");
            return rc;
        }
    }

    return NEEDLE_OK;
}

void cact_set_analytic_levels(cact_file *f) {
    if (f->group) {
        /* Ternary levels are analytic (not stored): {-c, 0, +c}/sqrt(G). The table is
         * indexed by the raw 2-bit crumb (codes 3, 0, 1 stand for -c, 0, +c), so ternary
         * rows go through the same kernels as 2-bit rows. Code 2 is never written; it
         * reads as 0 rather than out of range. */
        float level = (float)(CACT_TERNARY_LEVEL / sqrt((double)f->group));
        f->codebooks[CACT_BITS_TERNARY][0] = 0.0f;
        f->codebooks[CACT_BITS_TERNARY][1] = level;
        f->codebooks[CACT_BITS_TERNARY][2] = 0.0f;
        f->codebooks[CACT_BITS_TERNARY][3] = -level;
        /* Needle 3's binary records (bits 1): the 2-level Lloyd-Max points of a unit
         * Gaussian, +-sqrt(2/pi), scaled like every codebook; computed in double and
         * rounded once, as the official float64 numpy codebook is. Code 0 is the negative
         * level (the official codebook is sorted). */
        if (f->generation == 3) {
            double b = sqrt(2.0 / 3.14159265358979323846) / sqrt((double)f->group);
            f->codebooks[CACT3_BITS_BINARY][0] = (float)-b;
            f->codebooks[CACT3_BITS_BINARY][1] = (float)b;
        }
    }
}

int cact_parse(const uint8_t *data, size_t size, cact_file *out) {
    memset(out, 0, sizeof *out);
    if (!data) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "cact: NULL image");
    if (size < CACT_HEADER_BYTES + 4 * CACT_CODEBOOK_LEN)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact: file is %zu bytes, too small for a header "
                           "(truncated?)", size);
    if (rd_u32(data) == CACT3_TAG) return cact3_parse(data, size, out);
    cact_file f;
    memset(&f, 0, sizeof f);
    f.generation = 2;
    f.base = data;
    f.size = size;
    f.tokenizer_index = -1;
    int rc = check_header(&f);
    if (rc) return rc;
    const cact_header *h = &f.h;

    uint64_t dir = CACT_HEADER_BYTES + 4ull * h->codebook_len;
    uint64_t dir_end = dir + (uint64_t)CACT_RECORD_BYTES * h->num_tensors;
    if (dir_end > size)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact: directory of %u records ends at byte %llu "
                           "past the end of the %zu-byte file (truncated?)", h->num_tensors,
                           (unsigned long long)dir_end, size);
    f.mhc_base = 1 + 14 * h->num_layers;
    f.engram_base = f.mhc_base + 9;
    f.final_norm_index = f.engram_base + 4 * h->num_engram_sites;
    uint32_t base_count = f.final_norm_index + 1;
    if (h->num_tensors < base_count)
        return needle_fail(NEEDLE_ERR_FORMAT, "cact: %u tensors, the geometry needs at least %u",
                           h->num_tensors, base_count);

    f.num_tensors = h->num_tensors;
    f.tensors = calloc(h->num_tensors, sizeof *f.tensors);
    if (!f.tensors) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "cact: out of memory");

    if ((rc = cact_read_directory(&f, dir, dir_end))) goto error;

    for (uint32_t i = 0; i < base_count; i++) {
        cact_expected e;
        expect_tensor(&f, i, &e);
        if ((rc = cact_check_record(&f, i, &e))) goto error;
    }
    uint32_t extra = h->num_tensors - base_count - (f.tokenizer_index >= 0 ? 1u : 0u);
    if ((rc = check_probe_heads(&f, base_count, extra))) goto error;

    cact_set_analytic_levels(&f);
    *out = f;
    needle_clear_error();
    return NEEDLE_OK;

error:
    free(f.tensors);
    return rc;
}

void cact_release(cact_file *f) {
    if (!f) return;
    free(f->tensors);
    memset(f, 0, sizeof *f);
}
