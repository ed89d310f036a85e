/* A Needle 3 .cact read into the Needle 3 training core (see cact_base3.h). */
#include "train/cact_base3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/cact.h"
#include "train/cact_records.h"
#include "util/error.h"

/* The 27 records of a layer with conv taps (without them, 4-6 are absent) and the tensor
 * each goes to; the kernels are stored [out][in] */
static const char *const LAYER_RECORDS[27] = {
    "stack/layers/block/ZCRMSNorm_0/scale",
    "stack/layers/block/self_attn/q_proj/kernel",
    "stack/layers/block/self_attn/k_proj/kernel",
    "stack/layers/block/self_attn/v_proj/kernel",
    "stack/layers/block/self_attn/q_taps",
    "stack/layers/block/self_attn/k_taps",
    "stack/layers/block/self_attn/v_taps",
    "stack/layers/block/self_attn/q_norm/scale",
    "stack/layers/block/self_attn/k_norm/scale",
    "stack/layers/block/self_attn/gate_proj/kernel",
    "stack/layers/block/self_attn/out_proj/kernel",
    "stack/layers/block/post_attn_norm/scale",
    "stack/layers/block/attn_gate",
    "stack/layers/block/pre_hada_norm/scale",
    "stack/layers/block/hadamard_mlp/d1",
    "stack/layers/block/hadamard_mlp/d2",
    "stack/layers/block/hadamard_mlp/b2",
    "stack/layers/block/hadamard_mlp/d3",
    "stack/layers/block/hadamard_mlp/d4",
    "stack/layers/block/hadamard_mlp/w1a",
    "stack/layers/block/hadamard_mlp/w1b",
    "stack/layers/block/hadamard_mlp/w2a",
    "stack/layers/block/hadamard_mlp/w2b",
    "stack/layers/block/hadamard_mlp/w3a",
    "stack/layers/block/hadamard_mlp/w3b",
    "stack/layers/block/hadamard_mlp/cond_v",
    "stack/layers/block/hadamard_mlp/cond_u",
};
static const char *const MHC_RECORDS[9] = {
    "stack/mhc_a_pre", "stack/mhc_a_post", "stack/mhc_a_res", "stack/mhc_b_pre", "stack/mhc_b_post",
    "stack/mhc_b_res", "stack/mhc_phi_pre", "stack/mhc_phi_post", "stack/mhc_phi_res",
};

int cact_base_generation(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    const uint32_t tag = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    return tag == CACT3_TAG ? 3 : tag == CACT_TAG ? 2 : 0;
}

int g3_model_from_cact(const uint8_t *data, size_t size, export3_config *cfg_out, g3_model **out) {
    *out = NULL;
    cact_file f;
    int st = cact_parse(data, size, &f);
    if (st) return st;
    if (f.generation != 3) {
        cact_release(&f);
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "a Needle 2 .cact is not a Needle 3 base");
    }
    const cact3_header *h = &f.h3;
    export3_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = h->vocab, c.out_vocab = h->out_vocab, c.d_model = h->d_model, c.num_heads = h->num_heads;
    c.num_kv_heads = h->num_kv_heads, c.num_layers = h->num_layers, c.qk_head_dim = h->qk_head_dim;
    c.v_head_dim = h->v_head_dim, c.max_seq_len = h->max_seq_len, c.rope_theta = h->rope_theta;
    c.num_orders = h->num_engram_orders;
    for (uint32_t i = 0; i < c.num_orders && i < 4; i++) c.engram_orders[i] = h->engram_orders[i];
    c.engram_heads = c.num_orders ? h->num_engram_tables / c.num_orders : 0;
    c.engram_slots = h->engram_slots, c.engram_seed_heads = h->engram_seed_heads;
    c.num_sites = h->num_engram_sites;
    for (uint32_t i = 0; i < c.num_sites && i < CACT3_MAX_SITES; i++) c.engram_layers[i] = h->engram_sites[i];
    for (uint32_t l = 0; l < c.num_layers && l < 64; l++) {
        const uint32_t word = l < 32 ? h->global_mask_lo : h->global_mask_hi;
        if (word >> (l % 32) & 1u) c.global_layers[c.num_global++] = l;
    }
    c.sliding_window = h->sliding_window, c.mhc_lanes = h->mhc_lanes, c.qkv_conv_taps = h->qkv_conv_taps;
    c.kv_window = h->kv_window, c.kv_bits = h->kv_bits;
    g3_model *m = NULL;
    if ((st = g3_model_from_checkpoint(&c, NULL, &m))) {
        cact_release(&f);
        return st;
    }
    const uint32_t L = c.num_layers, stride = f.l3.layer_stride;
    g3_tensor *emb = g3_find(m, "embedding/embedding");
    st = cact_record_load(&f, 0, emb->w, emb->numel, 0, 1);
    for (uint32_t l = 0; l < L && !st; l++)
        for (uint32_t r = 0; r < stride && !st; r++) {
            const uint32_t k = stride == 27 || r < 4 ? r : r + 3; /* no taps: 4.. shift by three */
            g3_tensor *t = g3_find(m, LAYER_RECORDS[k]);
            const uint64_t per = t->numel / L;
            const int kernel = k == 1 || k == 2 || k == 3 || k == 9 || k == 10;
            st = cact_record_load(&f, 1 + stride * l + r, t->w + l * per, per, kernel, 1);
        }
    for (uint32_t j = 0; j < 9 && !st; j++) {
        g3_tensor *t = g3_find(m, MHC_RECORDS[j]);
        st = cact_record_load(&f, f.mhc_base + j, t->w, t->numel, j >= 6, j >= 6 ? L : 1);
    }
    static const char *const ENGRAM[4] = {"embedding", "key_proj/kernel", "value_proj/kernel", "taps"};
    for (uint32_t s = 0; s < c.num_sites && !st; s++)
        for (uint32_t k = 0; k < 4 && !st; k++) {
            char name[64];
            snprintf(name, sizeof name, "engrams_%u/%s", s, ENGRAM[k]);
            g3_tensor *t = g3_find(m, name);
            st = cact_record_load(&f, f.engram_base + 4 * s + k, t->w, t->numel, k == 1 || k == 2, 1);
        }
    if (!st) {
        g3_tensor *t = g3_find(m, "stack/final_norm/scale");
        st = cact_record_load(&f, f.final_norm_index, t->w, t->numel, 0, 1);
    }
    cact_release(&f);
    if (st) {
        g3_model_free(m);
        return st;
    }
    if (cfg_out) *cfg_out = c;
    *out = m;
    return 0;
}
