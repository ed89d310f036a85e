/* Checkpoint -> .cact records (see export_model.h). The order, labels, transposes and
 * reshapes follow export._tensors line by line; the widths come from the bits map looked
 * up by the exporter's label (layerNN.x, engramS.x, mhc_phi_x, embedding). */
#include "export/export_model.h"

#include "export/export_common.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fp16.h"

#define ENGRAM_SUB_DIM 128u
#define KV_BUDGET_BYTES (11ull * 1024 * 1024 + 512 * 1024)
#define KV_GROUP 32ull
#define KV_WINDOW_MIN 160ull

/* ---- config ------------------------------------------------------------------------- */

static int json_u32(const cJSON *j, const char *key, uint32_t *v) {
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0) || j->valuedouble > 4294967295.0 ||
        j->valuedouble != floor(j->valuedouble))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: %s must be an integer in [0, 2^32)", key);
    *v = (uint32_t)j->valuedouble;
    return 0;
}

static int json_list(const cJSON *j, const char *key, uint32_t *v, uint32_t *n) {
    if (!cJSON_IsArray(j)) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: %s must be a list", key);
    const int len = cJSON_GetArraySize(j);
    if (len > 8)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: %s has %d entries (at most 4 fit a .cact)",
                           key, len);
    for (int i = 0; i < len; i++) {
        const int st = json_u32(cJSON_GetArrayItem(j, i), key, &v[i]);
        if (st) return st;
    }
    *n = (uint32_t)len;
    return 0;
}

int export_config_parse(const char *json, size_t len, export_config *c) {
    *c = (export_config){.vocab_size = 8192,
                         .d_model = 512,
                         .num_heads = 8,
                         .num_kv_heads = 4,
                         .num_layers = 12,
                         .max_seq_len = 2048,
                         .rope_theta = 100000.0,
                         .engram_orders = {2, 3},
                         .num_orders = 2,
                         .engram_slots = 8192,
                         .engram_layers = {2, 15},
                         .num_sites = 2,
                         .mhc_lanes = 4,
                         .kv_bits = 8};
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return needle_fail(NEEDLE_ERR_JSON, "config: not a JSON object");
    }
    const struct {
        const char *key;
        uint32_t *v;
    } ints[] = {
        {"vocab_size", &c->vocab_size},     {"d_model", &c->d_model},
        {"attn_dim", &c->attn_dim},         {"num_heads", &c->num_heads},
        {"num_kv_heads", &c->num_kv_heads}, {"num_layers", &c->num_layers},
        {"max_seq_len", &c->max_seq_len},   {"engram_heads", &c->engram_heads},
        {"engram_slots", &c->engram_slots}, {"mhc_lanes", &c->mhc_lanes},
        {"kv_window", &c->kv_window},       {"kv_bits", &c->kv_bits},
    };
    int st = 0;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !st; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, ints[i].key);
        if (j && !cJSON_IsNull(j)) st = json_u32(j, ints[i].key, ints[i].v);
    }
    const cJSON *j;
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "engram_orders")))
        st = json_list(j, "engram_orders", c->engram_orders, &c->num_orders);
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "engram_layers")))
        st = json_list(j, "engram_layers", c->engram_layers, &c->num_sites);
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "rope_theta"))) {
        if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || fabs(j->valuedouble) > 3.4e38)
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: rope_theta must be a float32 number");
        else
            c->rope_theta = j->valuedouble;
    }
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "weight_bits")) && !cJSON_IsNull(j)) {
        if (!cJSON_IsString(j) || strlen(j->valuestring) >= sizeof c->weight_bits)
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: weight_bits must be a bits map string");
        else
            strcpy(c->weight_bits, j->valuestring);
    }
    cJSON_Delete(root);
    if (!st && !c->attn_dim) c->attn_dim = c->d_model;
    return st;
}

uint32_t export_effective_kv_window(const export_config *c) {
    const uint64_t head_dim = c->num_heads ? c->attn_dim / c->num_heads : 0;
    const uint64_t kv = c->num_kv_heads * head_dim, d = c->d_model;
    const uint64_t per_pos =
        c->num_layers * (2 * kv + 2 * (kv / KV_GROUP) * 4) + c->num_sites * (d + (d / KV_GROUP) * 4);
    uint64_t window = per_pos ? KV_BUDGET_BYTES / per_pos / KV_GROUP * KV_GROUP : c->max_seq_len;
    if (window > c->max_seq_len) window = c->max_seq_len;
    if (window < KV_WINDOW_MIN) window = KV_WINDOW_MIN;
    if (c->kv_window && c->kv_window < window) window = c->kv_window;
    return (uint32_t)window;
}

/* ---- building ----------------------------------------------------------------------- */

static const char *const HEAD_KEYS[2] = {"contrastive_head", "confidence_head"};

static int check_geometry(const export_config *c) {
    if (!c->vocab_size || !c->d_model || !c->num_heads || !c->num_kv_heads || !c->num_layers ||
        !c->mhc_lanes || !c->engram_slots || !c->max_seq_len)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                           "config: vocab_size, d_model, num_heads, num_kv_heads, num_layers, "
                           "mhc_lanes, engram_slots and max_seq_len must be positive");
    if (c->attn_dim % c->num_heads)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                           "config: attn_dim %u is not a multiple of num_heads %u", c->attn_dim,
                           c->num_heads);
    if (!c->num_orders || c->num_orders > 4 || c->num_sites > 4)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                           "config: a .cact holds 1 to 4 engram_orders and at most 4 engram_layers");
    if (c->d_model > (1u << 30))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: d_model %u is too large", c->d_model);
    return 0;
}

int export_build(const st_file *ck, const export_config *c, const cq_codebooks *cb, const export_options *opt,
                 cact_writer *w) {
    int st = check_geometry(c);
    if (st) return st;
    const uint64_t d = c->d_model, L = c->num_layers, n = c->mhc_lanes, A = c->attn_dim;
    const uint64_t hd = A / c->num_heads, kvd = c->num_kv_heads * hd;
    uint32_t heads = c->engram_heads;
    if (!heads) {
        heads = c->d_model / (c->num_orders * ENGRAM_SUB_DIM);
        if (!heads) heads = 1;
    }
    const uint64_t sub = d / ((uint64_t)c->num_orders * heads), T = (uint64_t)c->num_orders * heads;
    if (!sub) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "config: engram sub-dimension is 0");
    uint32_t hada = 1;
    while (hada < d) hada <<= 1;
    uint32_t max_order = 0;
    for (uint32_t i = 0; i < c->num_orders; i++)
        if (c->engram_orders[i] > max_order) max_order = c->engram_orders[i];

    cact_header *h = &w->h;
    *h = (cact_header){.kv_window = opt->kv_window,
                       .kv_bits = c->kv_bits ? c->kv_bits : 8,
                       .vocab = c->vocab_size,
                       .d_model = c->d_model,
                       .num_heads = c->num_heads,
                       .num_kv_heads = c->num_kv_heads,
                       .num_layers = c->num_layers,
                       .head_dim = (uint32_t)hd,
                       .max_seq_len = c->max_seq_len,
                       .hada_n = hada,
                       .mhc_lanes = c->mhc_lanes,
                       .engram_slots = c->engram_slots,
                       .engram_sub_dim = (uint32_t)sub,
                       .num_engram_tables = (uint32_t)T,
                       .engram_conv_taps = ENGRAM_CONV_TAPS,
                       .engram_conv_dilation = max_order,
                       .num_engram_orders = c->num_orders,
                       .num_engram_sites = c->num_sites,
                       .rope_theta = (float)c->rope_theta};
    for (uint32_t i = 0; i < c->num_orders; i++) h->engram_orders[i] = c->engram_orders[i];
    for (uint32_t i = 0; i < c->num_sites; i++) h->engram_sites[i] = c->engram_layers[i];
    for (uint32_t b = 2, k = 0; b <= 4; b++)
        for (uint32_t i = 0; i < (1u << b); i++) w->codebook[k++] = cb->levels[b][i];

    export_ctx x = {ck, cb, opt, w, 0};
    uint32_t n_heads = 0;
    for (int i = 0; i < 2; i++) n_heads += (uint32_t)ex_has_prefix_tensor(ck, HEAD_KEYS[i]);
    x.count = (uint32_t)(1 + 14 * L + 9 + 4 * c->num_sites + 1 + (n_heads ? 1 + 3 * n_heads : 0) +
                         (opt->tokenizer ? 1 : 0));
    if (opt->tokenizer && opt->tokenizer_pieces != c->vocab_size)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tokenizer vocab %u != config %u",
                           opt->tokenizer_pieces, c->vocab_size);

    const st_tensor *t;
    char label[40];
#define NEED(var, name, nd, ...)                                                  \
    do {                                                                          \
        const uint64_t shp_[] = {__VA_ARGS__};                                    \
        if (!((var) = ex_need(&x, (name), (nd), shp_))) return NEEDLE_ERR_FORMAT; \
    } while (0)
#define TRY(e)                                                                                               \
    do {                                                                                                     \
        if ((st = (e))) return st;                                                                           \
    } while (0)

    NEED(t, "embedding/embedding", 2, c->vocab_size, d);
    TRY(ex_add_cq_direct(&x, "embedding", t, 0, c->vocab_size, d));

    const char *B = "stack/layers/block/";
    const st_tensor *norm_in, *qk[6], *qn, *kn, *post, *gate, *pre, *dg[3];
    char nm[128];
    snprintf(nm, sizeof nm, "%sZCRMSNorm_0/scale", B);
    NEED(norm_in, nm, 2, L, d);
    static const char *proj[5] = {"q_proj", "k_proj", "v_proj", "gate_proj", "out_proj"};
    const uint64_t pin[5] = {d, d, d, d, A}, pout[5] = {A, kvd, kvd, A, d};
    for (int k = 0; k < 5; k++) {
        snprintf(nm, sizeof nm, "%sself_attn/%s/kernel", B, proj[k]);
        NEED(qk[k], nm, 3, L, pin[k], pout[k]);
    }
    snprintf(nm, sizeof nm, "%sself_attn/q_norm/scale", B);
    NEED(qn, nm, 2, L, hd);
    snprintf(nm, sizeof nm, "%sself_attn/k_norm/scale", B);
    NEED(kn, nm, 2, L, hd);
    snprintf(nm, sizeof nm, "%spost_attn_norm/scale", B);
    NEED(post, nm, 2, L, d);
    snprintf(nm, sizeof nm, "%sattn_gate", B);
    if (!(gate = st_find(ck, nm)) || gate->numel != L || gate->ndim < 1 || gate->shape[0] != L)
        return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s' must hold one value per layer (%llu)",
                           nm, (unsigned long long)L);
    snprintf(nm, sizeof nm, "%spre_hada_norm/scale", B);
    NEED(pre, nm, 2, L, d);
    for (int k = 0; k < 3; k++) {
        snprintf(nm, sizeof nm, "%shadamard_mlp/d%d", B, k + 1);
        NEED(dg[k], nm, 2, L, hada);
    }
    const uint32_t sd[1] = {(uint32_t)d}, shd[1] = {(uint32_t)hd}, sone[1] = {1}, sh[1] = {hada};
    for (uint64_t i = 0; i < L; i++) {
#define LABEL(s) (snprintf(label, sizeof label, "layer%02llu.%s", (unsigned long long)i, (s)), label)
        TRY(ex_add_fp16(&x, LABEL("norm_in"), norm_in, i * d, 1, sd));
        TRY(ex_add_cq_kernel(&x, LABEL("q_proj"), qk[0], i * d * A, d, A));
        TRY(ex_add_cq_kernel(&x, LABEL("k_proj"), qk[1], i * d * kvd, d, kvd));
        TRY(ex_add_cq_kernel(&x, LABEL("v_proj"), qk[2], i * d * kvd, d, kvd));
        TRY(ex_add_fp16(&x, LABEL("q_norm"), qn, i * hd, 1, shd));
        TRY(ex_add_fp16(&x, LABEL("k_norm"), kn, i * hd, 1, shd));
        TRY(ex_add_cq_kernel(&x, LABEL("gate_proj"), qk[3], i * d * A, d, A));
        TRY(ex_add_cq_kernel(&x, LABEL("out_proj"), qk[4], i * A * d, A, d));
        TRY(ex_add_fp16(&x, LABEL("post_norm"), post, i * d, 1, sd));
        TRY(ex_add_fp16(&x, LABEL("attn_gate"), gate, i, 1, sone));
        TRY(ex_add_fp16(&x, LABEL("pre_hada"), pre, i * d, 1, sd));
        TRY(ex_add_fp16(&x, LABEL("d1"), dg[0], i * hada, 1, sh));
        TRY(ex_add_fp16(&x, LABEL("d2"), dg[1], i * hada, 1, sh));
        TRY(ex_add_fp16(&x, LABEL("d3"), dg[2], i * hada, 1, sh));
#undef LABEL
    }

    TRY(ex_add_mhc_records(&x, L, n, d));

    for (uint32_t s = 0; s < c->num_sites; s++)
        TRY(ex_add_engram_site(&x, s, T, c->engram_slots, sub, d));

    NEED(t, "stack/final_norm/scale", 1, d);
    TRY(ex_add_fp16(&x, "final_norm", t, 0, 1, sd));

    if (n_heads) {
        /* the manifest: one code per head present, 1 contrastive, 2 confidence */
        uint8_t *blob = malloc(2 * n_heads);
        if (!blob) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        uint32_t m = 0;
        for (int i = 0; i < 2; i++)
            if (ex_has_prefix_tensor(ck, HEAD_KEYS[i])) {
                const uint16_t code = f32_to_fp16((float)(i + 1));
                blob[2 * m] = (uint8_t)(code & 0xff);
                blob[2 * m + 1] = (uint8_t)(code >> 8);
                m++;
            }
        const uint32_t sm[1] = {n_heads};
        TRY(cw_add(w, "heads.manifest", CACT_FP16, 1, sm, 0, 0, blob, 2 * n_heads));
        ex_report(&x, -1.0);
        for (int i = 0; i < 2; i++) {
            if (!ex_has_prefix_tensor(ck, HEAD_KEYS[i])) continue;
            snprintf(nm, sizeof nm, "%s/probes", HEAD_KEYS[i]);
            const st_tensor *probes = st_find(ck, nm);
            if (!probes || probes->ndim != 2 || probes->shape[1] != d || !probes->shape[0] ||
                probes->shape[0] * d > UINT32_MAX)
                return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s' must be [P, %llu], P > 0", nm,
                                   (unsigned long long)d);
            const uint64_t P = probes->shape[0];
            snprintf(nm, sizeof nm, "%s/proj/kernel", HEAD_KEYS[i]);
            const st_tensor *kernel = st_find(ck, nm);
            if (!kernel || kernel->ndim != 2 || kernel->shape[0] != P * d || !kernel->shape[1] ||
                kernel->shape[1] > UINT32_MAX)
                return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s' must be [%llu, out], out > 0",
                                   nm, (unsigned long long)(P * d));
            const uint64_t out = kernel->shape[1];
            snprintf(nm, sizeof nm, "%s/proj/bias", HEAD_KEYS[i]);
            const st_tensor *bias = st_find(ck, nm);
            if (bias && (bias->ndim != 1 || bias->shape[0] != out))
                return needle_fail(NEEDLE_ERR_FORMAT, "checkpoint tensor '%s' must be [%llu]", nm,
                                   (unsigned long long)out);
            snprintf(label, sizeof label, "%s.probes", HEAD_KEYS[i]);
            const uint32_t sp[2] = {(uint32_t)P, (uint32_t)d};
            TRY(ex_add_fp16(&x, label, probes, 0, 2, sp));
            /* the kernel transposed to [out, P*d] */
            float *mt = ex_alloc_mat(label, out, P * d);
            if (!mt) return NEEDLE_ERR_OUT_OF_MEMORY;
            for (uint64_t r = 0; r < P * d; r++)
                for (uint64_t o = 0; o < out; o++) mt[o * P * d + r] = st_get(kernel, r * out + o);
            snprintf(label, sizeof label, "%s.proj", HEAD_KEYS[i]);
            const uint32_t sproj[2] = {(uint32_t)out, (uint32_t)(P * d)};
            st = ex_add_fp16_values(&x, label, mt, 2, sproj);
            free(mt);
            if (st) return st;
            snprintf(label, sizeof label, "%s.bias", HEAD_KEYS[i]);
            const uint32_t sb[1] = {(uint32_t)out};
            TRY(ex_add_fp16(&x, label, bias, 0, 1,
                            sb)); /* no bias: zeros, as the exporter writes */
        }
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
    return 0;
}
