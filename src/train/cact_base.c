/* A Needle 3 .cact back to an official checkpoint (see cact_base.h): each record read at
 * the place export3_build (src/export/export_model_v3.c, export_common.c) wrote it. */
#include "train/cact_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/mt19937.h"
#include "train/cact_records.h"
#include "util/error.h"
#include "util/fp16.h"

#define ENGRAM_TAPS 4u /* export's ENGRAM_CONV_TAPS */

typedef struct builder {
    const cact_file *f;
    train_checkpoint *ck;
    uint32_t cap;
} builder;

static const cact_tensor *record(const cact_file *f, const char *name) {
    for (uint32_t i = 0; i < f->num_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    needle_fail(NEEDLE_ERR_FORMAT, ".cact has no record %s", name);
    return NULL;
}

/* a zeroed tensor `name` of the given shape, appended to the checkpoint */
static float *add(builder *b, const char *name, uint32_t ndim, uint64_t s0, uint64_t s1,
                  uint64_t s2) {
    train_checkpoint *ck = b->ck;
    if (ck->n == b->cap) {
        const uint32_t cap = b->cap ? 2 * b->cap : 64;
        train_tensor *t = realloc(ck->tensors, cap * sizeof *t);
        if (!t) {
            needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
            return NULL;
        }
        ck->tensors = t;
        b->cap = cap;
    }
    train_tensor *t = &ck->tensors[ck->n];
    memset(t, 0, sizeof *t);
    const uint64_t s[3] = {s0, s1, s2};
    t->ndim = ndim;
    t->numel = 1;
    for (uint32_t k = 0; k < ndim; k++) {
        t->shape[k] = s[k];
        t->numel *= s[k];
    }
    t->name = strdup(name);
    t->data = calloc(t->numel ? t->numel : 1, sizeof(float));
    if (!t->name || !t->data) {
        train_tensor_release(t);
        needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    ck->n++;
    return t->data;
}

/* an FP16 record of n values into dst */
static int fp16_into(const cact_tensor *t, float *dst, uint64_t n) {
    if (!t) return NEEDLE_ERR_FORMAT;
    if (t->dtype != CACT_FP16 || t->nbytes != 2 * n)
        return needle_fail(NEEDLE_ERR_FORMAT, ".cact record %s: want %llu FP16 values", t->name,
                           (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) dst[i] = fp16_to_f32(rd_u16(t->data + 2 * i));
    return 0;
}

/* a CQ record [rows][cols] dequantized as the runtime reads it (cq_dequant_row with the
 * file's codebooks: the base trained on is the network the engine runs) into
 * dst[rows][cols], or with `transpose` into dst[cols][rows] */
static int cq_into(builder *b, const cact_tensor *t, uint32_t rows, uint32_t cols, int transpose,
                   float *dst) {
    if (!t) return NEEDLE_ERR_FORMAT;
    if (t->dtype != CACT_CQ || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return needle_fail(NEEDLE_ERR_FORMAT, ".cact record %s: want a CQ [%u, %u] matrix", t->name,
                           rows, cols);
    if (!transpose) return cact_record_widen(b->f, t, dst, (uint64_t)rows * cols);
    float *m = malloc((size_t)rows * cols * sizeof *m + 1);
    if (!m) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    const int st = cact_record_widen(b->f, t, m, (uint64_t)rows * cols);
    for (uint64_t r = 0; !st && r < rows; r++)
        for (uint64_t c = 0; c < cols; c++) dst[c * rows + r] = m[r * cols + c];
    free(m);
    return st;
}

static const cact_tensor *rec_fmt(const cact_file *f, const char *fmt, unsigned a, const char *s) {
    char name[64];
    snprintf(name, sizeof name, fmt, a, s);
    return record(f, name);
}

static const cact_tensor *head_rec(const cact_file *f, const char *key, const char *part) {
    char name[64];
    snprintf(name, sizeof name, "%s.%s", key, part);
    return record(f, name);
}

/* the probe head `key` (export's add_head) */
static int add_head(builder *b, const char *key, uint32_t code, uint32_t d) {
    const cact_file *f = b->f;
    char name[128];
    const cact_tensor *gain = head_rec(f, key, "gain"), *row_bias = head_rec(f, key, "row_bias");
    const cact_tensor *probes = head_rec(f, key, "probes"), *query = head_rec(f, key, "query");
    const cact_tensor *proj = head_rec(f, key, "proj"), *bias = head_rec(f, key, "bias");
    if (!gain || !row_bias || !probes || !query || !proj || !bias) return NEEDLE_ERR_FORMAT;
    if (gain->ndim != 2 || row_bias->ndim != 3 || query->ndim != 2 || proj->ndim != 2)
        return needle_fail(NEEDLE_ERR_FORMAT, ".cact head %s: unexpected record shapes", key);
    const uint32_t l1 = gain->shape[0], k = gain->shape[1], q = query->shape[0];
    const uint32_t out = proj->shape[0], in = proj->shape[1];
    float *dst;
    int st;
#define ADD(part, nd, s0, s1, s2) \
    (snprintf(name, sizeof name, "%s/%s", key, part), dst = add(b, name, nd, s0, s1, s2))
    if (!ADD("probes", 3, l1, k, d) || (st = cq_into(b, probes, l1 * k, d, 0, dst)))
        return NEEDLE_ERR_FORMAT;
    if (!ADD("gain", 2, l1, k, 0) || (st = fp16_into(gain, dst, (uint64_t)l1 * k)))
        return NEEDLE_ERR_FORMAT;
    if (!ADD("query", 2, q, d, 0) || (st = cq_into(b, query, q, d, 0, dst)))
        return NEEDLE_ERR_FORMAT;
    if (!ADD("row_bias", 3, q, l1, k) || (st = fp16_into(row_bias, dst, (uint64_t)q * l1 * k)))
        return NEEDLE_ERR_FORMAT;
    if (!ADD("proj/kernel", 2, in, out, 0) || (st = cq_into(b, proj, out, in, 1, dst)))
        return NEEDLE_ERR_FORMAT;
    if (!ADD("proj/bias", 1, out, 0, 0) || (st = fp16_into(bias, dst, out)))
        return NEEDLE_ERR_FORMAT;
    if (code == 3) {
        const cact_tensor *cal = head_rec(f, key, "calibration");
        if (!cal || !ADD("calibration", 1, 3, 0, 0) || fp16_into(cal, dst, 3))
            return NEEDLE_ERR_FORMAT;
    }
#undef ADD
    return 0;
}

static char *config_json(const cact3_header *h, uint32_t eheads) {
    char buf[4096];
    int n = snprintf(
        buf, sizeof buf,
        "{\"dtype\": \"float32\", \"vocab_size\": %u, \"out_vocab\": %u, \"d_model\": %u, "
        "\"num_heads\": %u, \"num_kv_heads\": %u, \"num_layers\": %u, \"qk_head_dim\": %u, "
        "\"v_head_dim\": %u, \"max_seq_len\": %u, \"rope_theta\": %.9g, \"mhc_lanes\": %u, "
        "\"sliding_window\": %u, \"qkv_conv_taps\": %u, \"engram_slots\": %u, \"engram_heads\": "
        "%u, "
        "\"engram_seed_heads\": %u, \"kv_window\": %u, \"kv_bits\": %u, \"engram_orders\": [",
        h->vocab, h->out_vocab, h->d_model, h->num_heads, h->num_kv_heads, h->num_layers,
        h->qk_head_dim, h->v_head_dim, h->max_seq_len, (double)h->rope_theta, h->mhc_lanes,
        h->sliding_window, h->qkv_conv_taps, h->engram_slots, eheads, h->engram_seed_heads,
        h->kv_window, h->kv_bits);
    for (uint32_t i = 0; i < h->num_engram_orders; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%u", i ? ", " : "", h->engram_orders[i]);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "], \"engram_layers\": [");
    for (uint32_t i = 0; i < h->num_engram_sites; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%u", i ? ", " : "", h->engram_sites[i]);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "], \"global_layers\": [");
    const uint64_t mask = (uint64_t)h->global_mask_hi << 32 | h->global_mask_lo;
    for (uint32_t i = 0, first = 1; i < 64; i++)
        if (mask >> i & 1) {
            n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%u", first ? "" : ", ", i);
            first = 0;
        }
    snprintf(buf + n, sizeof buf - (size_t)n,
             "], \"ladder_depths\": [], \"ladder_widths\": [], \"ladder_order\": []}");
    return strdup(buf);
}

static int build(builder *b) {
    const cact_file *f = b->f;
    const cact3_header *h = &f->h3;
    const uint32_t L = h->num_layers, d = h->d_model, n = h->mhc_lanes, H = h->num_heads,
                   KV = h->num_kv_heads;
    const uint32_t qk = h->qk_head_dim, vh = h->v_head_dim, taps = h->qkv_conv_taps, N = h->hada_n;
    const uint32_t ba = f->l3.hada_ba, bb = f->l3.hada_bb;
    if (!h->num_engram_orders || h->num_engram_tables % h->num_engram_orders)
        return needle_fail(NEEDLE_ERR_FORMAT, ".cact: %u engram tables over %u orders",
                           h->num_engram_tables, h->num_engram_orders);
    const uint32_t eheads = h->num_engram_tables / h->num_engram_orders, T = h->num_engram_tables;
    const uint32_t sub = h->engram_sub_dim;
    /* the Hadamard permutations: unsplit RandomState(11 / 13) unless the file is a ladder */
    const cact_tensor *p1 = record(f, "hada_p1");
    if (!p1) return NEEDLE_ERR_FORMAT;
    uint32_t *perm = malloc((size_t)N * sizeof *perm + 1);
    if (!perm) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    mt_permutation(11, N, perm);
    int ladder = p1->dtype != CACT_FP32 || p1->nbytes != 4ull * N;
    for (uint32_t i = 0; !ladder && i < N; i++) {
        float v;
        memcpy(&v, p1->data + 4 * i, 4);
        ladder = v != (float)perm[i];
    }
    free(perm);
    if (ladder)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                           "the .cact is a ladder (its Hadamard permutations are split); "
                           "the training core runs no ladder: train from the official checkpoint");
    b->ck->config = config_json(h, eheads);
    if (!b->ck->config) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    float *dst;
    int st;
    if (!(dst = add(b, "embedding/embedding", 2, h->vocab, d, 0))) return NEEDLE_ERR_OUT_OF_MEMORY;
    if ((st = cq_into(b, record(f, "embedding"), h->vocab, d, 0, dst))) return st;

    /* per-layer records stacked into [L, ...] (export's order of parts) */
    static const struct {
        const char *label, *path;
        int kind; /* 0 fp16, 1 CQ kernel stored transposed */
    } parts[] = {
        {"norm_in", "ZCRMSNorm_0/scale", 0},
        {"q_proj", "self_attn/q_proj/kernel", 1},
        {"k_proj", "self_attn/k_proj/kernel", 1},
        {"v_proj", "self_attn/v_proj/kernel", 1},
        {"q_taps", "self_attn/q_taps", 0},
        {"k_taps", "self_attn/k_taps", 0},
        {"v_taps", "self_attn/v_taps", 0},
        {"q_norm", "self_attn/q_norm/scale", 0},
        {"k_norm", "self_attn/k_norm/scale", 0},
        {"gate_proj", "self_attn/gate_proj/kernel", 1},
        {"out_proj", "self_attn/out_proj/kernel", 1},
        {"post_norm", "post_attn_norm/scale", 0},
        {"attn_gate", "attn_gate", 0},
        {"pre_hada", "pre_hada_norm/scale", 0},
        {"d1", "hadamard_mlp/d1", 0},
        {"d2", "hadamard_mlp/d2", 0},
        {"b2", "hadamard_mlp/b2", 0},
        {"d3", "hadamard_mlp/d3", 0},
        {"d4", "hadamard_mlp/d4", 0},
        {"w1a", "hadamard_mlp/w1a", 0},
        {"w1b", "hadamard_mlp/w1b", 0},
        {"w2a", "hadamard_mlp/w2a", 0},
        {"w2b", "hadamard_mlp/w2b", 0},
        {"w3a", "hadamard_mlp/w3a", 0},
        {"w3b", "hadamard_mlp/w3b", 0},
        {"cond_v", "hadamard_mlp/cond_v", 0},
        {"cond_u", "hadamard_mlp/cond_u", 0},
    };
    const cact_tensor *cv0 = record(f, "layer0.cond_v");
    if (!cv0 || cv0->ndim != 2)
        return cv0 ? needle_fail(NEEDLE_ERR_FORMAT, ".cact: layer0.cond_v is not 2-D")
                   : NEEDLE_ERR_FORMAT;
    const uint32_t rank = cv0->shape[1];
    for (size_t k = 0; k < sizeof parts / sizeof *parts; k++) {
        const char *lb = parts[k].label;
        if (!taps && strstr(lb, "_taps")) continue;
        /* the per-layer shape */
        uint64_t s[2] = {0, 0}, in = 0, out = 0;
        uint32_t nd = 1;
        if (!strcmp(lb, "norm_in") || !strcmp(lb, "post_norm") || !strcmp(lb, "pre_hada")) s[0] = d;
        else if (!strcmp(lb, "q_norm") || !strcmp(lb, "k_norm")) s[0] = qk;
        else if (!strcmp(lb, "attn_gate")) nd = 0;
        else if (lb[0] == 'd' || lb[0] == 'b') s[0] = N;
        else if (lb[0] == 'w') {
            nd = 2;
            s[0] = s[1] = lb[2] == 'a' ? ba : bb;
        } else if (!strcmp(lb, "cond_v")) nd = 2, s[0] = d, s[1] = rank;
        else if (!strcmp(lb, "cond_u")) nd = 2, s[0] = rank, s[1] = N;
        else if (!strcmp(lb, "q_taps")) nd = 2, s[0] = taps, s[1] = (uint64_t)H * qk;
        else if (!strcmp(lb, "k_taps")) nd = 2, s[0] = taps, s[1] = (uint64_t)KV * qk;
        else if (!strcmp(lb, "v_taps")) nd = 2, s[0] = taps, s[1] = (uint64_t)KV * vh;
        else if (!strcmp(lb, "q_proj")) in = d, out = (uint64_t)H * qk;
        else if (!strcmp(lb, "k_proj")) in = d, out = (uint64_t)KV * qk;
        else if (!strcmp(lb, "v_proj")) in = d, out = (uint64_t)KV * vh;
        else if (!strcmp(lb, "gate_proj")) in = d, out = (uint64_t)H * vh;
        else if (!strcmp(lb, "out_proj")) in = (uint64_t)H * vh, out = d;
        if (parts[k].kind) nd = 2, s[0] = in, s[1] = out;
        char name[128];
        snprintf(name, sizeof name, "stack/layers/block/%s", parts[k].path);
        if (!(dst = add(b, name, nd + 1, L, s[0], s[1]))) return NEEDLE_ERR_OUT_OF_MEMORY;
        const uint64_t per = (nd == 0 ? 1 : nd == 1 ? s[0] : s[0] * s[1]);
        for (uint32_t l = 0; l < L; l++) {
            const cact_tensor *t = rec_fmt(f, "layer%u.%s", l, lb);
            st = parts[k].kind ? cq_into(b, t, (uint32_t)out, (uint32_t)in, 1, dst + l * per)
                               : fp16_into(t, dst + l * per, per);
            if (st) return st;
        }
    }
    /* mHC: the small records as they are, phi (L*lanes, n*d) back to (L, n*d, lanes) */
    static const char *small[6] = {"mhc_a_pre", "mhc_a_post", "mhc_a_res",
                                   "mhc_b_pre", "mhc_b_post", "mhc_b_res"};
    for (int k = 0; k < 6; k++) {
        char name[64];
        snprintf(name, sizeof name, "stack/%s", small[k]);
        dst = k < 3   ? add(b, name, 1, L, 0, 0)
              : k < 5 ? add(b, name, 2, L, n, 0)
                      : add(b, name, 3, L, n, n);
        if (!dst) return NEEDLE_ERR_OUT_OF_MEMORY;
        if ((st = fp16_into(record(f, small[k]), dst, b->ck->tensors[b->ck->n - 1].numel)))
            return st;
    }
    static const char *phi[3] = {"mhc_phi_pre", "mhc_phi_post", "mhc_phi_res"};
    for (int k = 0; k < 3; k++) {
        const uint64_t lanes = k == 2 ? (uint64_t)n * n : n, nd = (uint64_t)n * d;
        char name[64];
        snprintf(name, sizeof name, "stack/%s", phi[k]);
        if (!(dst = add(b, name, 3, L, nd, lanes))) return NEEDLE_ERR_OUT_OF_MEMORY;
        float *m = malloc((size_t)(L * lanes * nd) * sizeof *m + 1);
        if (!m) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        st = cq_into(b, record(f, phi[k]), (uint32_t)(L * lanes), (uint32_t)nd, 0, m);
        for (uint64_t i = 0; !st && i < L; i++)
            for (uint64_t col = 0; col < nd; col++)
                for (uint64_t l = 0; l < lanes; l++)
                    dst[(i * nd + col) * lanes + l] = m[(i * lanes + l) * nd + col];
        free(m);
        if (st) return st;
    }
    /* the engram sites */
    for (uint32_t s = 0; s < h->num_engram_sites; s++) {
        char name[64];
        snprintf(name, sizeof name, "engrams_%u/embedding", s);
        if (!(dst = add(b, name, 3, T, h->engram_slots, sub))) return NEEDLE_ERR_OUT_OF_MEMORY;
        if ((st = cq_into(b, rec_fmt(f, "engram%u.%s", s, "tables"), T * h->engram_slots, sub, 0,
                          dst)))
            return st;
        static const char *kv[2] = {"key_proj", "value_proj"};
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "engrams_%u/%s/kernel", s, kv[k]);
            if (!(dst = add(b, name, 2, (uint64_t)T * sub, d, 0))) return NEEDLE_ERR_OUT_OF_MEMORY;
            if ((st = cq_into(b, rec_fmt(f, "engram%u.%s", s, kv[k]), d, T * sub, 1, dst)))
                return st;
        }
        snprintf(name, sizeof name, "engrams_%u/taps", s);
        if (!(dst = add(b, name, 2, ENGRAM_TAPS, d, 0))) return NEEDLE_ERR_OUT_OF_MEMORY;
        if ((st = fp16_into(rec_fmt(f, "engram%u.%s", s, "taps"), dst, (uint64_t)ENGRAM_TAPS * d)))
            return st;
    }
    if (!(dst = add(b, "stack/final_norm/scale", 1, d, 0, 0))) return NEEDLE_ERR_OUT_OF_MEMORY;
    if ((st = fp16_into(record(f, "final_norm"), dst, d))) return st;
    /* the probe heads, by the manifest's codes */
    static const char *const head_keys[4] = {NULL, "embedding_head", "confidence_head",
                                             "router_head"};
    for (uint32_t i = 0; i < f->l3.num_heads; i++) {
        const uint32_t code = f->l3.head_codes[i];
        if (code < 1 || code > 3)
            return needle_fail(NEEDLE_ERR_FORMAT, ".cact: unknown probe head code %u", code);
        if ((st = add_head(b, head_keys[code], code, d))) return st;
    }
    return 0;
}

int train_checkpoint_from_cact(const cact_file *f, train_checkpoint *out) {
    memset(out, 0, sizeof *out);
    if (f->generation != 3) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "not a Needle 3 .cact");
    builder b = {.f = f, .ck = out};
    int st;
    out->generation = 3;
    out->format_version = TRAIN_CHECKPOINT_FORMAT;
    out->step = -1;
    out->run = strdup("{}");
    st = out->run ? build(&b) : needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    if (st) train_checkpoint_release(out);
    return st;
}
