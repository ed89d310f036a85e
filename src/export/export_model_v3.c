/* Needle 3 checkpoint -> .cact v3 records, following export._tensors / _pack_cact of
 * cactus-needle 3.2.8 (see export_model_v3.h). */
#include "export/export_model_v3.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export/export_common.h"
#include "quant/mt19937.h"
#include "util/error.h"

#define ENGRAM_SUB_DIM 128u
#define HEAD_BITS 4u
#define KV_BUDGET_BYTES (11ll * 1024 * 1024 + 512 * 1024)
#define KV_GROUP 32ll
#define KV_WINDOW_MIN 160ll

/* ---- config ------------------------------------------------------------------------- */

static int u32_of(const cJSON *j, const char *key, uint32_t *v) {
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0) || j->valuedouble > 4294967295.0 ||
        j->valuedouble != floor(j->valuedouble))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: %s must be an integer in [0, 2^32)", key);
    *v = (uint32_t)j->valuedouble;
    return 0;
}

static int list_of(const cJSON *j, const char *key, uint32_t *v, uint32_t *n, uint32_t cap) {
    if (!cJSON_IsArray(j)) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: %s must be a list", key);
    const int len = cJSON_GetArraySize(j);
    if (len < 0 || (uint32_t)len > cap)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: %s has %d entries (at most %u)", key, len,
                           cap);
    for (int i = 0; i < len; i++) {
        const int st = u32_of(cJSON_GetArrayItem(j, i), key, &v[i]);
        if (st) return st;
    }
    *n = (uint32_t)len;
    return 0;
}

int export3_config_parse(const char *json, size_t len, export3_config *c) {
    *c = (export3_config){.vocab_size = 16384,
                          .d_model = 768,
                          .num_heads = 12,
                          .num_kv_heads = 2,
                          .num_layers = 20,
                          .qk_head_dim = 48,
                          .v_head_dim = 64,
                          .max_seq_len = 4096,
                          .rope_theta = 100000.0,
                          .engram_orders = {2, 3},
                          .num_orders = 2,
                          .engram_slots = 18432,
                          .engram_layers = {3, 7, 11, 15, 19},
                          .num_sites = 5,
                          .global_layers = {4, 9, 14, 19},
                          .num_global = 4,
                          .sliding_window = 1024,
                          .mhc_lanes = 4,
                          .qkv_conv_taps = 3,
                          .kv_bits = 8};
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return needle_fail(NEEDLE_ERR_JSON, "config: not a JSON object");
    }
    uint32_t attn_dim = 0, n_ladder = 0, ladder[64];
    const struct {
        const char *key;
        uint32_t *v;
    } ints[] = {
        {"vocab_size", &c->vocab_size},
        {"out_vocab", &c->out_vocab},
        {"d_model", &c->d_model},
        {"num_heads", &c->num_heads},
        {"num_kv_heads", &c->num_kv_heads},
        {"num_layers", &c->num_layers},
        {"qk_head_dim", &c->qk_head_dim},
        {"v_head_dim", &c->v_head_dim},
        {"max_seq_len", &c->max_seq_len},
        {"engram_heads", &c->engram_heads},
        {"engram_slots", &c->engram_slots},
        {"engram_seed_heads", &c->engram_seed_heads},
        {"sliding_window", &c->sliding_window},
        {"mhc_lanes", &c->mhc_lanes},
        {"qkv_conv_taps", &c->qkv_conv_taps},
        {"kv_window", &c->kv_window},
        {"kv_bits", &c->kv_bits},
        {"attn_dim", &attn_dim},
    };
    int st = 0;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !st; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, ints[i].key);
        if (j && !cJSON_IsNull(j)) st = u32_of(j, ints[i].key, ints[i].v);
    }
    const cJSON *j;
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "engram_orders")))
        st = list_of(j, "engram_orders", c->engram_orders, &c->num_orders, 8);
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "engram_layers")))
        st = list_of(j, "engram_layers", c->engram_layers, &c->num_sites, 32);
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "global_layers")))
        st = list_of(j, "global_layers", c->global_layers, &c->num_global, 80);
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "ladder_widths")))
        st = list_of(j, "ladder_widths", ladder, &n_ladder, 64);
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "rope_theta"))) {
        if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || fabs(j->valuedouble) > 3.4e38)
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: rope_theta must be a float32 number");
        else
            c->rope_theta = j->valuedouble;
    }
    c->ladder_split = n_ladder > 0;
    if (!st && attn_dim) {
        /* TransformerConfig.__init__: a legacy attn_dim sets what was not given */
        if (!c->num_heads)
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: num_heads must be positive");
        else {
            if (!cJSON_GetObjectItemCaseSensitive(root, "qk_head_dim"))
                c->qk_head_dim = attn_dim / c->num_heads;
            if (!cJSON_GetObjectItemCaseSensitive(root, "v_head_dim"))
                c->v_head_dim = attn_dim / c->num_heads;
            if (!cJSON_GetObjectItemCaseSensitive(root, "sliding_window")) c->sliding_window = 0;
            if (!cJSON_GetObjectItemCaseSensitive(root, "global_layers")) c->num_global = 0;
        }
    }
    cJSON_Delete(root);
    if (!st && c->num_heads) {
        /* head_dims(): 0 falls back to d_model / num_heads */
        if (!c->qk_head_dim) c->qk_head_dim = c->d_model / c->num_heads;
        if (!c->v_head_dim) c->v_head_dim = c->d_model / c->num_heads;
    }
    return st;
}

uint32_t export3_effective_kv_window(const export3_config *c) {
    const long long kd = (long long)c->num_kv_heads * c->qk_head_dim,
                    vd = (long long)c->num_kv_heads * c->v_head_dim;
    const long long d = c->d_model, L = c->num_layers, sites = c->num_sites;
    const long long per_layer = kd + vd + (kd / KV_GROUP + vd / KV_GROUP) * 4;
    const long long per_site = d + (d / KV_GROUP) * 4;
    long long window;
    if (c->sliding_window) {
        const long long n_global = c->num_global;
        const long long local = c->sliding_window < c->max_seq_len ? c->sliding_window : c->max_seq_len;
        const long long fixed = ((L - n_global) * per_layer + sites * per_site) * local;
        if (n_global == 0) {
            window =
                fixed <= KV_BUDGET_BYTES ? c->max_seq_len : (local > KV_WINDOW_MIN ? local : KV_WINDOW_MIN);
        } else {
            /* Python floor division (the budget left may be negative) */
            long long num = KV_BUDGET_BYTES - fixed, den = n_global * per_layer;
            long long q = den ? num / den : 0;
            if (den && (num % den) && ((num < 0) != (den < 0))) q--;
            long long rows = q / KV_GROUP;
            if ((q % KV_GROUP) && q < 0) rows--;
            rows *= KV_GROUP;
            if (rows > c->max_seq_len) rows = c->max_seq_len;
            window = rows > KV_WINDOW_MIN ? rows : KV_WINDOW_MIN;
        }
    } else {
        const long long per_pos = L * per_layer + sites * per_site;
        window = per_pos ? KV_BUDGET_BYTES / per_pos / KV_GROUP * KV_GROUP : c->max_seq_len;
        if (window > c->max_seq_len) window = c->max_seq_len;
        if (window < KV_WINDOW_MIN) window = KV_WINDOW_MIN;
    }
    if (c->kv_window && c->kv_window < window) window = c->kv_window;
    return (uint32_t)window;
}

/* ---- numpy's legacy RandomState(seed).permutation(n) -------------------------------- */

/* out[0..n) = offset + RandomState(seed).permutation(n), as floats (the file stores them so) */
static int legacy_permutation(uint32_t seed, uint32_t n, uint32_t offset, float *out) {
    uint32_t *p = malloc((size_t)n * sizeof *p + 1);
    if (!p) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    mt_permutation(seed, n, p);
    for (uint32_t i = 0; i < n; i++) out[i] = (float)(p[i] + offset);
    free(p);
    return 0;
}

static int add_permutation(export_ctx *x, const char *label, uint32_t seed, uint32_t n, int split) {
    float *v = malloc((size_t)n * sizeof *v);
    uint8_t *blob = malloc((size_t)n * 4);
    if (!v || !blob) {
        free(v);
        free(blob);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    int st = split ? legacy_permutation(seed, n / 2, 0, v) : legacy_permutation(seed, n, 0, v);
    if (!st && split) st = legacy_permutation(seed + 977, n / 2, n / 2, v + n / 2);
    if (st) {
        free(v);
        free(blob);
        return st;
    }
    for (uint32_t i = 0; i < n; i++) memcpy(blob + 4 * i, &v[i], 4);
    free(v);
    const uint32_t shape[1] = {n};
    st = cw_add(x->w, label, CACT_FP32, 1, shape, 0, 0, blob, 4ull * n);
    if (!st) ex_report(x, -1.0);
    return st;
}

/* ---- building ----------------------------------------------------------------------- */

/* slice i of a stacked per-layer tensor [L, ...] as an FP16 record of shape [...] */
static int add_layer_fp16(export_ctx *x, const char *label, const st_tensor *t, uint64_t i) {
    uint32_t shape[4];
    uint64_t per = 1;
    for (uint32_t k = 1; k < t->ndim; k++) {
        shape[k - 1] = (uint32_t)t->shape[k];
        per *= t->shape[k];
    }
    return ex_add_fp16(x, label, t, i * per, (uint8_t)(t->ndim - 1), shape);
}

static const struct {
    const char *key;
    uint32_t code;
} HEADS3[3] = {{"embedding_head", 1}, {"confidence_head", 2}, {"router_head", 3}};

static int add_head(export_ctx *x, const char *key, uint32_t code, uint64_t d) {
    char nm[128], label[40];
    const st_tensor *probes, *gain, *query, *row_bias, *kernel, *bias, *cal;
#define GET(var, part) (snprintf(nm, sizeof nm, "%s/%s", key, part), (var) = st_find(x->ck, nm))
    if (!GET(probes, "probes") || probes->ndim != 3 || probes->shape[2] != d || !probes->shape[0] ||
        !probes->shape[1])
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s/probes' must be [L+1, k, %llu]", key,
                           (unsigned long long)d);
    const uint64_t l1 = probes->shape[0], k = probes->shape[1];
    if (!GET(gain, "gain") || gain->ndim != 2 || gain->shape[0] != l1 || gain->shape[1] != k)
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s/gain' must be [%llu, %llu]", key,
                           (unsigned long long)l1, (unsigned long long)k);
    if (!GET(query, "query") || query->ndim != 2 || query->shape[1] != d || !query->shape[0])
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s/query' must be [q, %llu]", key,
                           (unsigned long long)d);
    const uint64_t q = query->shape[0];
    if (!GET(row_bias, "row_bias") || row_bias->ndim != 3 || row_bias->shape[0] != q ||
        row_bias->shape[1] != l1 || row_bias->shape[2] != k)
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s/row_bias' must be [%llu, %llu, %llu]",
                           key, (unsigned long long)q, (unsigned long long)l1, (unsigned long long)k);
    if (!GET(kernel, "proj/kernel") || kernel->ndim != 2 || !kernel->shape[0] || !kernel->shape[1] ||
        kernel->shape[0] > UINT32_MAX || kernel->shape[1] > UINT32_MAX)
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s/proj/kernel' must be [in, out]", key);
    const uint64_t out = kernel->shape[1];
    if (GET(bias, "proj/bias") && (bias->ndim != 1 || bias->shape[0] != out))
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s' must be [%llu]", nm,
                           (unsigned long long)out);
    GET(cal, "calibration");
#undef GET
    int st;
    snprintf(label, sizeof label, "%s.probes", key);
    if ((st = ex_add_cq_direct_bits(x, label, probes, 0, l1 * k, d, HEAD_BITS))) return st;
    snprintf(label, sizeof label, "%s.gain", key);
    const uint32_t sg[2] = {(uint32_t)l1, (uint32_t)k};
    if ((st = ex_add_fp16(x, label, gain, 0, 2, sg))) return st;
    snprintf(label, sizeof label, "%s.query", key);
    if ((st = ex_add_cq_direct_bits(x, label, query, 0, q, d, HEAD_BITS))) return st;
    snprintf(label, sizeof label, "%s.row_bias", key);
    const uint32_t sr[3] = {(uint32_t)q, (uint32_t)l1, (uint32_t)k};
    if ((st = ex_add_fp16(x, label, row_bias, 0, 3, sr))) return st;
    snprintf(label, sizeof label, "%s.proj", key);
    float *m = ex_alloc_mat(label, out, kernel->shape[0]);
    if (!m) return NEEDLE_ERR_OUT_OF_MEMORY;
    for (uint64_t r = 0; r < kernel->shape[0]; r++)
        for (uint64_t o = 0; o < out; o++) m[o * kernel->shape[0] + r] = st_get(kernel, r * out + o);
    if ((st = ex_add_cq_bits(x, label, m, out, kernel->shape[0], HEAD_BITS))) return st;
    snprintf(label, sizeof label, "%s.bias", key);
    const uint32_t sb[1] = {(uint32_t)out};
    if ((st = ex_add_fp16(x, label, bias, 0, 1, sb))) return st; /* no bias: zeros */
    if (code == 3) {
        /* RouterHead.export: the checkpoint's calibration, else its initial value */
        snprintf(label, sizeof label, "%s.calibration", key);
        const uint32_t sc[1] = {3};
        if (cal) {
            if (cal->numel != 3)
                return needle_fail(NEEDLE_ERR_FORMAT, "'%s/calibration' must hold 3 values", key);
            return ex_add_fp16(x, label, cal, 0, 1, sc);
        }
        const float init[3] = {0.90f, 0.00f, 0.60f};
        return ex_add_fp16_values(x, label, init, 1, sc);
    }
    return 0;
}

int export3_build(const st_file *ck, const export3_config *c, const cq_codebooks *cb,
                  const export_options *opt, cact_writer *w) {
    if (!c->vocab_size || !c->d_model || !c->num_heads || !c->num_kv_heads || !c->num_layers ||
        !c->mhc_lanes || !c->engram_slots || !c->max_seq_len || !c->qk_head_dim || !c->v_head_dim)
        return needle_fail(
            NEEDLE_ERR_INVALID_ARGUMENT,
            "config: vocab_size, d_model, heads, layers, head dims, mhc_lanes, engram_slots and "
            "max_seq_len must be positive");
    if (c->num_layers > 64)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: a v3 .cact holds at most 64 layers");
    if (c->num_sites > 16)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: a v3 .cact holds at most 16 engram sites");
    if (!c->num_orders || c->num_orders > 4)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: a .cact holds 1 to 4 engram_orders");
    if (c->out_vocab > c->vocab_size)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: out_vocab %u exceeds vocab_size %u",
                           c->out_vocab, c->vocab_size);
    if (c->d_model > (1u << 24))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: d_model is too large");
    uint64_t gmask = 0;
    for (uint32_t i = 0; i < c->num_global; i++) {
        if (c->global_layers[i] >= 64)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: global layer %u past the 64-layer mask",
                               c->global_layers[i]);
        gmask |= 1ull << c->global_layers[i];
    }
    if (opt->tokenizer && opt->tokenizer_pieces > c->vocab_size)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tokenizer vocab %u > exported vocab %u",
                           opt->tokenizer_pieces, c->vocab_size);
    const uint64_t d = c->d_model, L = c->num_layers, n = c->mhc_lanes, H = c->num_heads,
                   KV = c->num_kv_heads;
    const uint64_t qk = c->qk_head_dim, vh = c->v_head_dim, taps = c->qkv_conv_taps;
    uint32_t eheads = c->engram_heads;
    if (!eheads) {
        eheads = c->d_model / (c->num_orders * ENGRAM_SUB_DIM);
        if (!eheads) eheads = 1;
    }
    const uint64_t sub = d / ((uint64_t)c->num_orders * eheads), T = (uint64_t)c->num_orders * eheads;
    if (!sub) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: engram sub-dimension is 0");
    uint32_t N = 1, bits_n = 0;
    while (N < d) N <<= 1;
    for (uint32_t v = N - 1; v; v >>= 1) bits_n++;
    const uint32_t ba = 1u << (bits_n / 2), bb = N / ba;
    uint32_t max_order = 0;
    for (uint32_t i = 0; i < c->num_orders; i++)
        if (c->engram_orders[i] > max_order) max_order = c->engram_orders[i];

    w->v3 = 1;
    uint32_t *hw = w->v3_header;
    memset(hw, 0, sizeof w->v3_header);
    const uint32_t fields[] = {0,
                               0,
                               0,
                               opt->kv_window,
                               c->kv_bits ? c->kv_bits : 8,
                               c->vocab_size,
                               c->out_vocab,
                               c->d_model,
                               c->num_heads,
                               c->num_kv_heads,
                               c->num_layers,
                               c->qk_head_dim,
                               c->v_head_dim,
                               c->max_seq_len,
                               N,
                               c->mhc_lanes,
                               c->sliding_window,
                               (uint32_t)(gmask & 0xffffffffu),
                               (uint32_t)(gmask >> 32),
                               c->qkv_conv_taps,
                               c->engram_slots,
                               (uint32_t)sub,
                               (uint32_t)T,
                               ENGRAM_CONV_TAPS,
                               max_order,
                               c->engram_seed_heads,
                               c->num_orders};
    memcpy(hw, fields, sizeof fields);
    for (uint32_t i = 0; i < c->num_orders; i++) hw[27 + i] = c->engram_orders[i];
    hw[31] = c->num_sites;
    for (uint32_t i = 0; i < c->num_sites; i++) hw[32 + i] = c->engram_layers[i];
    const float theta = (float)c->rope_theta;
    memcpy(&hw[48], &theta, 4);
    for (uint32_t b = 2, k = 0; b <= 4; b++)
        for (uint32_t i = 0; i < (1u << b); i++) w->codebook[k++] = cb->levels[b][i];

    export_ctx x = {ck, cb, opt, w, 0};
    uint32_t n_heads = 0, head_records = 0;
    for (int i = 0; i < 3; i++)
        if (ex_has_prefix_tensor(ck, HEADS3[i].key)) {
            n_heads++;
            head_records += 6 + (HEADS3[i].code == 3);
        }
    x.count = (uint32_t)(1 + L * (24 + (taps ? 3 : 0)) + 9 + 2 + 4 * c->num_sites + 1 +
                         (n_heads ? 1 + head_records : 0) + (opt->tokenizer ? 1 : 0));

    const st_tensor *t;
    char label[40], nm[128];
    int st;
#define NEED(var, name, nd, ...)                                                  \
    do {                                                                          \
        const uint64_t shp_[] = {__VA_ARGS__};                                    \
        if (!((var) = ex_need(&x, (name), (nd), shp_))) return NEEDLE_ERR_FORMAT; \
    } while (0)
#define TRY(e)                                                                                               \
    do {                                                                                                     \
        if ((st = (e))) return st;                                                                           \
    } while (0)
#define BLOCK(part) (snprintf(nm, sizeof nm, "stack/layers/block/%s", (part)), nm)

    NEED(t, "embedding/embedding", 2, c->vocab_size, d);
    TRY(ex_add_cq_direct(&x, "embedding", t, 0, c->vocab_size, d));

    enum {
        NORM_IN,
        QP,
        KP,
        VP,
        QT,
        KT,
        VT,
        QN,
        KN,
        GP,
        OP,
        POST,
        GATE,
        PRE,
        D1,
        D2,
        B2,
        D3,
        D4,
        W1A,
        W1B,
        W2A,
        W2B,
        W3A,
        W3B,
        CV,
        CU,
        N_PARTS
    };
    const st_tensor *p[N_PARTS] = {0};
    NEED(p[NORM_IN], BLOCK("ZCRMSNorm_0/scale"), 2, L, d);
    NEED(p[QP], BLOCK("self_attn/q_proj/kernel"), 3, L, d, H * qk);
    NEED(p[KP], BLOCK("self_attn/k_proj/kernel"), 3, L, d, KV * qk);
    NEED(p[VP], BLOCK("self_attn/v_proj/kernel"), 3, L, d, KV * vh);
    if (taps) {
        NEED(p[QT], BLOCK("self_attn/q_taps"), 3, L, taps, H * qk);
        NEED(p[KT], BLOCK("self_attn/k_taps"), 3, L, taps, KV * qk);
        NEED(p[VT], BLOCK("self_attn/v_taps"), 3, L, taps, KV * vh);
    }
    NEED(p[QN], BLOCK("self_attn/q_norm/scale"), 2, L, qk);
    NEED(p[KN], BLOCK("self_attn/k_norm/scale"), 2, L, qk);
    NEED(p[GP], BLOCK("self_attn/gate_proj/kernel"), 3, L, d, H * vh);
    NEED(p[OP], BLOCK("self_attn/out_proj/kernel"), 3, L, H * vh, d);
    NEED(p[POST], BLOCK("post_attn_norm/scale"), 2, L, d);
    if (!(p[GATE] = st_find(ck, BLOCK("attn_gate"))) || p[GATE]->numel != L || p[GATE]->ndim < 1 ||
        p[GATE]->shape[0] != L)
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s' must hold one value per layer", nm);
    NEED(p[PRE], BLOCK("pre_hada_norm/scale"), 2, L, d);
    static const char *diag[5] = {"d1", "d2", "b2", "d3", "d4"};
    for (int k = 0; k < 5; k++) {
        char part[64];
        snprintf(part, sizeof part, "hadamard_mlp/%s", diag[k]);
        NEED(p[D1 + k], BLOCK(part), 2, L, N);
    }
    static const char *mats[6] = {"w1a", "w1b", "w2a", "w2b", "w3a", "w3b"};
    for (int k = 0; k < 6; k++) {
        char part[64];
        snprintf(part, sizeof part, "hadamard_mlp/%s", mats[k]);
        const uint64_t side = (k % 2) ? bb : ba;
        NEED(p[W1A + k], BLOCK(part), 3, L, side, side);
    }
    const st_tensor *cv = st_find(ck, BLOCK("hadamard_mlp/cond_v"));
    if (!cv || cv->ndim != 3 || cv->shape[0] != L || cv->shape[1] != d || !cv->shape[2] ||
        cv->shape[2] > 4096)
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s' must be [%llu, %llu, rank]", nm,
                           (unsigned long long)L, (unsigned long long)d);
    p[CV] = cv;
    NEED(p[CU], BLOCK("hadamard_mlp/cond_u"), 3, L, cv->shape[2], N);

    static const char *names[N_PARTS] = {
        "norm_in", "q_proj", "k_proj",    "v_proj",   "q_taps",    "k_taps",    "v_taps",
        "q_norm",  "k_norm", "gate_proj", "out_proj", "post_norm", "attn_gate", "pre_hada",
        "d1",      "d2",     "b2",        "d3",       "d4",        "w1a",       "w1b",
        "w2a",     "w2b",    "w3a",       "w3b",      "cond_v",    "cond_u"};
    const uint64_t in_of[N_PARTS] = {[QP] = d, [KP] = d, [VP] = d, [GP] = d, [OP] = H * vh};
    const uint64_t out_of[N_PARTS] = {[QP] = H * qk, [KP] = KV * qk, [VP] = KV * vh, [GP] = H * vh, [OP] = d};
    const uint32_t one[1] = {1};
    for (uint64_t i = 0; i < L; i++) {
        for (int k = 0; k < N_PARTS; k++) {
            if (!taps && (k == QT || k == KT || k == VT)) continue;
            snprintf(label, sizeof label, "layer%02llu.%s", (unsigned long long)i, names[k]);
            if (k == QP || k == KP || k == VP || k == GP || k == OP)
                TRY(ex_add_cq_kernel(&x, label, p[k], i * in_of[k] * out_of[k], in_of[k],
                                     out_of[k]));
            else if (k == GATE) TRY(ex_add_fp16(&x, label, p[k], i, 1, one));
            else
                TRY(add_layer_fp16(&x, label, p[k], i));
        }
    }

    TRY(ex_add_mhc_records(&x, L, n, d));
    /* architecture._hada_perms: seeds 11 and 13 */
    TRY(add_permutation(&x, "hada_p1", 11, N, c->ladder_split));
    TRY(add_permutation(&x, "hada_p2", 13, N, c->ladder_split));

    for (uint32_t s = 0; s < c->num_sites; s++)
        TRY(ex_add_engram_site(&x, s, T, c->engram_slots, sub, d));
    NEED(t, "stack/final_norm/scale", 1, d);
    const uint32_t sd[1] = {(uint32_t)d};
    TRY(ex_add_fp16(&x, "final_norm", t, 0, 1, sd));

    if (n_heads) {
        float codes[3];
        uint32_t m = 0;
        for (int i = 0; i < 3; i++)
            if (ex_has_prefix_tensor(ck, HEADS3[i].key)) codes[m++] = (float)HEADS3[i].code;
        const uint32_t sm[1] = {m};
        TRY(ex_add_fp16_values(&x, "heads.manifest", codes, 1, sm));
        for (int i = 0; i < 3; i++)
            if (ex_has_prefix_tensor(ck, HEADS3[i].key))
                TRY(add_head(&x, HEADS3[i].key, HEADS3[i].code, d));
    }
    if (opt->tokenizer) {
        uint8_t *blob = malloc(opt->tokenizer_size ? opt->tokenizer_size : 1);
        if (!blob) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        memcpy(blob, opt->tokenizer, opt->tokenizer_size);
        TRY(cw_add(w, "tokenizer", CACT_RAW, 0, NULL, 0, 0, blob, opt->tokenizer_size));
        ex_report(&x, -1.0);
    }
#undef NEED
#undef TRY
#undef BLOCK
    return 0;
}
