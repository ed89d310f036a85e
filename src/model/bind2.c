/* Needle 2 binding: the tensor layout of spec §1.9 into m->w and m->info (see model.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/error.h"


static void fill_info2(struct needle_model *m) {
    const cact_header *h = &m->file.h;
    needle_model_info *info = &m->info;
    memset(info, 0, sizeof *info);
    info->file_size = m->image_size;
    info->num_tensors = h->num_tensors;
    info->vocab = h->vocab;
    info->d_model = h->d_model;
    info->num_layers = h->num_layers;
    info->num_heads = h->num_heads;
    info->num_kv_heads = h->num_kv_heads;
    info->head_dim = h->head_dim;
    info->max_seq_len = h->max_seq_len;
    info->kv_window = h->kv_window;
    info->kv_bits = h->kv_bits;
    info->hada_n = h->hada_n;
    info->mhc_lanes = h->mhc_lanes;
    info->engram_slots = h->engram_slots;
    info->engram_sub_dim = h->engram_sub_dim;
    info->num_engram_tables = h->num_engram_tables;
    info->engram_conv_taps = h->engram_conv_taps;
    info->engram_conv_dilation = h->engram_conv_dilation;
    info->num_engram_orders = h->num_engram_orders;
    info->num_engram_sites = h->num_engram_sites;
    for (int i = 0; i < 4; i++) {
        info->engram_orders[i] = h->engram_orders[i];
        info->engram_sites[i] = h->engram_sites[i];
    }
    info->rope_theta = h->rope_theta;
    info->group_size = m->file.group;
    info->has_tokenizer = m->file.tokenizer_index >= 0;
    info->num_probe_heads = m->file.num_probe_heads;
    for (uint32_t k = 0; k < m->file.num_probe_heads; k++)
        info->probe_head_codes[k] = m->file.probe_heads[k].code;
    info->generation = 2;
    info->out_vocab = h->vocab;
    info->qk_head_dim = info->v_head_dim = h->head_dim;
    info->file_layers = h->num_layers;
    info->layers_run = h->num_layers >= 64 ? ~0ull : (1ull << h->num_layers) - 1;
    for (uint32_t i = 0; i < h->num_engram_sites; i++) info->engram_sites_all[i] = h->engram_sites[i];
}

/* Needle 2: the layout of spec §1.9 into m->w. */
int model2_bind(struct needle_model *m) {
    int rc;
    const cact_header *h = &m->file.h;
    const cact_file *f = &m->file;
    if (m->depth)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "model: depth %d asked for, but a "
                           "Needle 2 file has no ladder of depths", m->depth);
    /* the Hadamard MLP, RoPE attention over the session's window; the phi products and
     * the attention heads stay float under W·A8 (spec §5.3) */
    m->w.traits = (model_traits){MODEL_MLP_HADAMARD, MODEL_ATTN_ROPE, 0, 0};

    m->w.d = h->d_model;
    m->w.n_lanes = h->mhc_lanes;
    m->w.n_layers = h->num_layers;
    m->w.n_heads = h->num_heads;
    m->w.n_kv_heads = h->num_kv_heads;
    m->w.head_dim = h->head_dim;
    m->w.qk_dim = m->w.v_dim = h->head_dim;
    m->w.attn_dim = h->num_heads * h->head_dim;
    m->w.kv_dim = h->num_kv_heads * h->head_dim;
    m->w.vocab = h->vocab;
    m->w.out_vocab = h->vocab;
    m->w.hada_n = h->hada_n;
    m->w.n_sites = h->num_engram_sites;
    m->w.n_tables = h->num_engram_tables;
    m->w.slots = h->engram_slots;
    m->w.sub_dim = h->engram_sub_dim;
    m->w.taps = h->engram_conv_taps;
    m->w.dilation = h->engram_conv_dilation;
    m->w.n_orders = h->num_engram_orders;
    m->w.max_order = 1;
    for (uint32_t i = 0; i < m->w.n_orders; i++) {
        m->w.orders[i] = h->engram_orders[i];
        if (m->w.orders[i] > m->w.max_order) m->w.max_order = m->w.orders[i];
    }
    if (m->w.n_orders) m->w.seed_stride = m->w.n_tables / m->w.n_orders;

    if ((rc = model_widen_float_tensors(m, 0, 1))) return rc;
    m->w.layers = calloc(m->w.n_layers, sizeof *m->w.layers);
    m->rope_freq = malloc(m->w.head_dim / 2 * sizeof *m->rope_freq);
    if (!m->w.layers || !m->rope_freq)
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model: out of memory");

    model_cq_view(m, 0, &m->w.embedding);
    for (uint32_t i = 0; i < m->w.n_layers; i++) {
        uint32_t b = 1 + 14 * i;
        layer_weights *l = &m->w.layers[i];
        l->norm_in = m->fp[b + 0];
        model_cq_view(m, b + 1, &l->q_proj);
        model_cq_view(m, b + 2, &l->k_proj);
        model_cq_view(m, b + 3, &l->v_proj);
        l->q_norm = m->fp[b + 4];
        l->k_norm = m->fp[b + 5];
        model_cq_view(m, b + 6, &l->gate_proj);
        model_cq_view(m, b + 7, &l->out_proj);
        l->post_norm = m->fp[b + 8];
        l->attn_gate = m->fp[b + 9][0];
        l->pre_hada = m->fp[b + 10];
        l->d1 = m->fp[b + 11];
        l->d2 = m->fp[b + 12];
        l->d3 = m->fp[b + 13];
    }
    uint32_t mb = f->mhc_base;
    m->w.a_pre = m->fp[mb + 0];
    m->w.a_post = m->fp[mb + 1];
    m->w.a_res = m->fp[mb + 2];
    m->w.b_pre = m->fp[mb + 3];
    m->w.b_post = m->fp[mb + 4];
    m->w.b_res = m->fp[mb + 5];
    model_cq_view(m, mb + 6, &m->w.phi_pre);
    model_cq_view(m, mb + 7, &m->w.phi_post);
    model_cq_view(m, mb + 8, &m->w.phi_res);
    for (uint32_t s = 0; s < m->w.n_sites; s++) {
        uint32_t b = f->engram_base + 4 * s;
        engram_site *site = &m->w.sites[s];
        site->layer = h->engram_sites[s];
        model_cq_view(m, b + 0, &site->tables);
        model_cq_view(m, b + 1, &site->key_proj);
        model_cq_view(m, b + 2, &site->value_proj);
        site->taps = m->fp[b + 3];
    }
    m->w.final_norm = m->fp[f->final_norm_index];
    m->n_probe_heads = f->num_probe_heads;
    for (uint32_t k = 0; k < f->num_probe_heads; k++) {
        const cact_probe_head *src = &f->probe_heads[k];
        probe_head *ph = &m->probe_heads[k];
        ph->code = src->code;
        ph->num_probes = src->num_probes;
        ph->out_dim = src->out_dim;
        ph->probes = m->fp[src->probes_index];
        ph->proj = NULL; /* left in the file: float_kept_in_file */
        ph->proj_file = f->tensors[src->proj_index].data;
        ph->proj_fp16 = f->tensors[src->proj_index].dtype == CACT_FP16;
        ph->bias = m->fp[src->bias_index];
    }

    /* RoPE inverse frequencies exactly as the reference computes them in float32:
     * 1 / theta^(2j/hd). */
    for (uint32_t j = 0; j < m->w.head_dim / 2; j++) {
        float expo = (float)(2 * j) / (float)m->w.head_dim;
        m->rope_freq[j] = 1.0f / powf(h->rope_theta, expo);
    }

    if (f->tokenizer_index >= 0) {
        const cact_tensor *t = &f->tensors[f->tokenizer_index];
        if ((rc = tokenizer_create(t->data, (size_t)t->nbytes, h->vocab, &m->tok))) return rc;
    }
    fill_info2(m);
    return NEEDLE_OK;
}

