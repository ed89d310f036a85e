/* A Needle 2 .cact read into the Needle 2 training core (see cact_base2.h). */
#include "train/cact_base2.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/cact.h"
#include "train/cact_records.h"
#include "util/error.h"

/* The records of one layer in the file (§1.9) and the tensor each goes to ("" : none) */
static const char *const LAYER_RECORDS[14] = {
    "stack/layers/block/ZCRMSNorm_0/scale",
    "stack/layers/block/self_attn/q_proj/kernel",
    "stack/layers/block/self_attn/k_proj/kernel",
    "stack/layers/block/self_attn/v_proj/kernel",
    "stack/layers/block/self_attn/q_norm/scale",
    "stack/layers/block/self_attn/k_norm/scale",
    "stack/layers/block/self_attn/gate_proj/kernel",
    "stack/layers/block/self_attn/out_proj/kernel",
    "stack/layers/block/post_attn_norm/scale",
    "stack/layers/block/attn_gate",
    "stack/layers/block/pre_hada_norm/scale",
    "stack/layers/block/hadamard_mlp/d1",
    "stack/layers/block/hadamard_mlp/d2",
    "stack/layers/block/hadamard_mlp/d3",
};
static const char *const MHC_RECORDS[9] = {
    "stack/mhc_a_pre", "stack/mhc_a_post", "stack/mhc_a_res", "stack/mhc_b_pre", "stack/mhc_b_post",
    "stack/mhc_b_res", "stack/mhc_phi_pre", "stack/mhc_phi_post", "stack/mhc_phi_res",
};

int g2_model_from_cact(const uint8_t *data, size_t size, export_config *cfg_out, g2_model **out) {
    *out = NULL;
    cact_file f;
    int st = cact_parse(data, size, &f);
    if (st) return st;
    if (f.generation != 2) {
        cact_release(&f);
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "a Needle 3 .cact is not a Needle 2 base");
    }
    const cact_header *h = &f.h;
    export_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = h->vocab, c.d_model = h->d_model, c.num_heads = h->num_heads, c.num_kv_heads = h->num_kv_heads;
    c.attn_dim = h->num_heads * h->head_dim, c.num_layers = h->num_layers, c.max_seq_len = h->max_seq_len;
    c.rope_theta = h->rope_theta, c.mhc_lanes = h->mhc_lanes, c.engram_slots = h->engram_slots;
    c.num_orders = h->num_engram_orders;
    for (uint32_t i = 0; i < c.num_orders && i < 4; i++) c.engram_orders[i] = h->engram_orders[i];
    c.engram_heads = c.num_orders ? h->num_engram_tables / c.num_orders : 0;
    c.num_sites = h->num_engram_sites;
    for (uint32_t i = 0; i < c.num_sites && i < 4; i++) c.engram_layers[i] = h->engram_sites[i];
    c.kv_window = h->kv_window, c.kv_bits = h->kv_bits;
    g2_model *m = NULL;
    if ((st = g2_model_from_checkpoint(&c, NULL, &m))) {
        cact_release(&f);
        return st;
    }
    const uint32_t L = c.num_layers;
    /* the embedding (record 0), the layers, the mHC section, the engram sites, the final norm */
    g2_tensor *emb = g2_find(m, "embedding/embedding");
    st = cact_record_load(&f, 0, emb->w, emb->numel, 0, 1);
    for (uint32_t l = 0; l < L && !st; l++)
        for (uint32_t j = 0; j < 14 && !st; j++) {
            g2_tensor *t = g2_find(m, LAYER_RECORDS[j]);
            const uint64_t per = t->numel / L;
            /* the kernels are [out][in] in the file, [in][out] in the tree */
            const int kernel = j == 1 || j == 2 || j == 3 || j == 6 || j == 7;
            st = cact_record_load(&f, 1 + 14 * l + j, t->w + l * per, per, kernel, 1);
        }
    for (uint32_t j = 0; j < 9 && !st; j++) {
        g2_tensor *t = g2_find(m, MHC_RECORDS[j]);
        /* phi: [L*m][n*d] in the file, [L][n*d][m] in the tree */
        st = cact_record_load(&f, f.mhc_base + j, t->w, t->numel, j >= 6, j >= 6 ? L : 1);
    }
    static const char *const ENGRAM[4] = {"embedding", "key_proj/kernel", "value_proj/kernel", "taps"};
    for (uint32_t s = 0; s < c.num_sites && !st; s++)
        for (uint32_t k = 0; k < 4 && !st; k++) {
            char name[64];
            snprintf(name, sizeof name, "engrams_%u/%s", s, ENGRAM[k]);
            g2_tensor *t = g2_find(m, name);
            st = cact_record_load(&f, f.engram_base + 4 * s + k, t->w, t->numel, k == 1 || k == 2, 1);
        }
    if (!st) {
        g2_tensor *t = g2_find(m, "stack/final_norm/scale");
        st = cact_record_load(&f, f.final_norm_index, t->w, t->numel, 0, 1);
    }
    cact_release(&f);
    if (st) {
        g2_model_free(m);
        return st;
    }
    if (cfg_out) *cfg_out = c;
    *out = m;
    return 0;
}

static cJSON *u32_list(const uint32_t *v, uint32_t n) {
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

char *g2_config_json(const export_config *c) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    const struct {
        const char *key;
        uint32_t v;
    } fields[] = {{"vocab_size", c->vocab_size},     {"d_model", c->d_model},
                  {"attn_dim", c->attn_dim},         {"num_heads", c->num_heads},
                  {"num_kv_heads", c->num_kv_heads}, {"num_layers", c->num_layers},
                  {"max_seq_len", c->max_seq_len},   {"engram_heads", c->engram_heads},
                  {"engram_slots", c->engram_slots}, {"mhc_lanes", c->mhc_lanes},
                  {"kv_window", c->kv_window},       {"kv_bits", c->kv_bits}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        cJSON_AddNumberToObject(j, fields[i].key, fields[i].v);
    /* a float32 value: its double prints back to the same float */
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddItemToObject(j, "engram_orders", u32_list(c->engram_orders, c->num_orders));
    cJSON_AddItemToObject(j, "engram_layers", u32_list(c->engram_layers, c->num_sites));
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return text;
}

int train_checkpoint_from_cact2(const uint8_t *data, size_t size, train_checkpoint *out) {
    memset(out, 0, sizeof *out);
    export_config cfg;
    g2_model *m = NULL;
    int st = g2_model_from_cact(data, size, &cfg, &m);
    if (st) return st;
    out->generation = 2;
    out->format_version = TRAIN_CHECKPOINT_FORMAT;
    out->step = -1;
    out->config = g2_config_json(&cfg);
    out->run = strdup("{}");
    const uint32_t n = g2_tensor_count(m);
    out->tensors = calloc(n ? n : 1, sizeof *out->tensors);
    if (!out->config || !out->run || !out->tensors) st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    for (uint32_t i = 0; !st && i < n; i++) {
        const g2_tensor *t = g2_tensor_at(m, i);
        train_tensor *d = &out->tensors[out->n];
        d->name = strdup(t->name);
        d->data = malloc(t->numel ? t->numel * sizeof(float) : 1);
        out->n++;
        if (!d->name || !d->data) {
            st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        d->ndim = t->ndim;
        for (uint32_t k = 0; k < t->ndim; k++) d->shape[k] = t->shape[k];
        d->numel = t->numel;
        memcpy(d->data, t->w, t->numel * sizeof(float));
    }
    g2_model_free(m);
    if (st) train_checkpoint_release(out);
    return st;
}
