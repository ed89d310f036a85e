/* Binding a validated Needle 3 file (format/cact3.c) into m->w, for the whole stack or one
 * rung of its ladder (docs/spec/NEEDLE3.md §2.6).
 *
 * The engine's shared ops read the Needle 2 fields of model_weights (embedding, the lane
 * and engram weights, the projections of layer_weights); the Needle 3 additions are in
 * layer3_weights and the generation-3 block of model_weights. A rung keeps the first
 * `depth` layers of the bisection order, sorted: layer views point at the file's tensors
 * (nothing is copied but the tiny per-layer mHC scalars, gathered into rung order so that
 * the ops index them by position); sites of dropped layers are dropped, global layers
 * and sites renumbered, and the lane offsets follow the new positions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/error.h"
#include "util/fp16.h"

typedef struct model3_state {
    layer3_weights *layers3;
    uint32_t *file_layer;
    uint32_t *perms;    /* [2][hada_n] */
    float *mhc;         /* rung-ordered a_pre | a_post | a_res | b_pre | b_post | b_res, in
                         * the tail of the model's arena (model3_arena_extra) so that a
                         * device backend finds them in its copy of the arena */
} model3_state;

void model3_ladder_layers(uint32_t L, uint32_t n, uint32_t *out) {
    uint32_t sel[CACT3_MAX_LAYERS], count = 0;
    uint8_t taken[CACT3_MAX_LAYERS] = {0};
    if (L == 1) {
        out[0] = 0;
        return;
    }
    sel[count++] = 0;
    sel[count++] = L - 1;
    taken[0] = taken[L - 1] = 1;
    while (count < L) {
        /* the widest gap between consecutive taken layers, the leftmost on ties */
        uint32_t best_l = 0, best_gap = 0, left = 0;
        for (uint32_t i = 1; i < L; i++) {
            if (!taken[i]) continue;
            if (i - left > best_gap) {
                best_gap = i - left;
                best_l = left;
            }
            left = i;
        }
        const uint32_t mid = best_l + best_gap / 2;
        taken[mid] = 1;
        sel[count++] = mid;
    }
    memset(taken, 0, sizeof taken);
    for (uint32_t i = 0; i < n; i++) taken[sel[i]] = 1;
    for (uint32_t i = 0, k = 0; i < L; i++)
        if (taken[i]) out[k++] = i;
}

static void fill_info3(struct needle_model *m, const uint32_t *site_layers, uint64_t gmask) {
    const cact3_header *h = &m->file.h3;
    needle_model_info *info = &m->info;
    memset(info, 0, sizeof *info);
    info->file_size = m->image_size;
    info->num_tensors = h->num_tensors;
    info->vocab = h->vocab;
    info->d_model = h->d_model;
    info->num_layers = m->w.n_layers;
    info->num_heads = h->num_heads;
    info->num_kv_heads = h->num_kv_heads;
    info->head_dim = h->qk_head_dim;
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
    for (int i = 0; i < 4; i++) info->engram_orders[i] = h->engram_orders[i];
    info->num_engram_sites = m->w.n_sites;
    for (uint32_t i = 0; i < m->w.n_sites; i++) {
        if (i < 4) info->engram_sites[i] = site_layers[i];
        info->engram_sites_all[i] = site_layers[i];
    }
    info->rope_theta = h->rope_theta;
    info->group_size = m->file.group;
    info->has_tokenizer = m->file.tokenizer_index >= 0;
    info->num_probe_heads = m->n_probe_heads;
    for (uint32_t k = 0; k < m->n_probe_heads; k++)
        info->probe_head_codes[k] = m->probe_heads[k].code;
    info->generation = 3;
    info->out_vocab = m->w.out_vocab;
    info->qk_head_dim = h->qk_head_dim;
    info->v_head_dim = h->v_head_dim;
    info->sliding_window = h->sliding_window;
    info->global_layers = gmask;
    info->qkv_conv_taps = h->qkv_conv_taps;
    info->engram_seed_heads = h->engram_seed_heads;
    info->file_layers = h->num_layers;
    for (uint32_t i = 0; i < m->w.n_layers; i++) info->layers_run |= 1ull << m->w.file_layer[i];
}

size_t model3_arena_extra(const cact_file *f) {
    const uint32_t nl = f->h3.mhc_lanes;
    return (size_t)f->h3.num_layers * (3 + 2 * nl + nl * nl);
}

int model3_bind(struct needle_model *m) {
    const cact_file *f = &m->file;
    const cact3_header *h = &f->h3;
    const uint32_t L = h->num_layers, nl = h->mhc_lanes;
    if (m->depth && (m->depth < 2 || (uint32_t)m->depth > L))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "model: depth %d is not a rung of "
                           "this %u-layer model (2..%u, or 0 for all)", m->depth, L, L);
    int wrc = model_widen_float_tensors(m, model3_arena_extra(f), 0);
    if (wrc) return wrc;
    const uint32_t n = m->depth ? (uint32_t)m->depth : L;
    model3_state *st = calloc(1, sizeof *st);
    if (!st) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model: out of memory");
    m->v3 = st;
    st->layers3 = calloc(n, sizeof *st->layers3);
    st->file_layer = calloc(n, sizeof *st->file_layer);
    st->perms = malloc(2 * (size_t)h->hada_n * sizeof *st->perms);
    /* the reserved tail; a rung uses the first n * (3 + 2nl + nl^2) of its L * (...) */
    st->mhc = m->w.arena + (m->w.arena_floats - model3_arena_extra(f));
    m->w.layers = calloc(n, sizeof *m->w.layers);
    m->rope_freq = malloc(h->qk_head_dim / 2 * sizeof *m->rope_freq);
    if (!st->layers3 || !st->file_layer || !st->perms || !st->mhc || !m->w.layers ||
        !m->rope_freq)
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model: out of memory");
    model3_ladder_layers(L, n, st->file_layer);

    model_weights *w = &m->w;
    /* the Monarch MLP; attention with conv taps, q/k and v widths and per-layer spans;
     * under W·A8 the phi products and the attention heads are quantized (the official
     * quant=True points) */
    w->traits = (model_traits){MODEL_MLP_MONARCH, MODEL_ATTN_SPANNED, 1, 1};
    w->d = h->d_model;
    w->n_lanes = nl;
    w->n_layers = n;
    w->n_heads = h->num_heads;
    w->n_kv_heads = h->num_kv_heads;
    w->qk_dim = h->qk_head_dim;
    w->v_dim = h->v_head_dim;
    w->head_dim = h->qk_head_dim;
    const uint32_t big = w->qk_dim > w->v_dim ? w->qk_dim : w->v_dim;
    w->attn_dim = h->num_heads * big;
    w->kv_dim = h->num_kv_heads * big;
    w->vocab = h->vocab;
    w->out_vocab = h->out_vocab ? h->out_vocab : h->vocab;
    w->hada_n = h->hada_n;
    w->hada_ba = f->l3.hada_ba;
    w->hada_bb = f->l3.hada_bb;
    w->conv_taps = h->qkv_conv_taps;
    w->n_tables = h->num_engram_tables;
    w->slots = h->engram_slots;
    w->sub_dim = h->engram_sub_dim;
    w->taps = h->engram_conv_taps;
    w->dilation = h->engram_conv_dilation;
    w->n_orders = h->num_engram_orders;
    w->max_order = 1;
    for (uint32_t i = 0; i < w->n_orders; i++) {
        w->orders[i] = h->engram_orders[i];
        if (w->orders[i] > w->max_order) w->max_order = w->orders[i];
    }
    if (w->n_orders) {
        const uint32_t heads = w->n_tables / w->n_orders;
        w->seed_stride = h->engram_seed_heads ? h->engram_seed_heads : heads;
    }
    w->layers3 = st->layers3;
    w->file_layer = st->file_layer;

    model_cq_view(m, 0, &w->embedding);
    const uint64_t gmask_file = (uint64_t)h->global_mask_hi << 32 | h->global_mask_lo;
    uint64_t gmask = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t fl = st->file_layer[i];
        const uint32_t b = 1 + f->l3.layer_stride * fl;
        layer_weights *l = &w->layers[i];
        layer3_weights *l3 = &st->layers3[i];
        uint32_t k = b;
        l->norm_in = m->fp[k++];
        model_cq_view(m, k++, &l->q_proj);
        model_cq_view(m, k++, &l->k_proj);
        model_cq_view(m, k++, &l->v_proj);
        if (h->qkv_conv_taps) {
            l3->q_taps = m->fp[k++];
            l3->k_taps = m->fp[k++];
            l3->v_taps = m->fp[k++];
        }
        l->q_norm = m->fp[k++];
        l->k_norm = m->fp[k++];
        model_cq_view(m, k++, &l->gate_proj);
        model_cq_view(m, k++, &l->out_proj);
        l->post_norm = m->fp[k++];
        l->attn_gate = m->fp[k++][0];
        l->pre_hada = m->fp[k++];
        l->d1 = m->fp[k++];
        l->d2 = m->fp[k++];
        l3->b2 = m->fp[k++];
        l->d3 = m->fp[k++];
        l3->d4 = m->fp[k++];
        l3->w1a = m->fp[k++];
        l3->w1b = m->fp[k++];
        l3->w2a = m->fp[k++];
        l3->w2b = m->fp[k++];
        l3->w3a = m->fp[k++];
        l3->w3b = m->fp[k++];
        l3->cond_v = m->fp[k++];
        l3->cond_u = m->fp[k++];
        const int global = (int)(gmask_file >> fl & 1);
        if (global) gmask |= 1ull << i;
        l3->window = global ? 0 : h->sliding_window;
    }

    /* per-layer mHC scalars in rung order; the phi matrices stay in the file and are
     * addressed by file layer (file_layer) */
    const uint32_t mb = f->mhc_base;
    float *p = st->mhc;
    float *a[3], *bv[2], *br;
    for (int j = 0; j < 3; j++) {
        a[j] = p;
        for (uint32_t i = 0; i < n; i++) *p++ = m->fp[mb + j][st->file_layer[i]];
    }
    for (int j = 0; j < 2; j++) {
        bv[j] = p;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t r = 0; r < nl; r++) *p++ = m->fp[mb + 3 + j][st->file_layer[i] * nl + r];
    }
    br = p;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t r = 0; r < nl * nl; r++)
            *p++ = m->fp[mb + 5][(size_t)st->file_layer[i] * nl * nl + r];
    w->a_pre = a[0];
    w->a_post = a[1];
    w->a_res = a[2];
    w->b_pre = bv[0];
    w->b_post = bv[1];
    w->b_res = br;
    model_cq_view(m, mb + 6, &w->phi_pre);
    model_cq_view(m, mb + 7, &w->phi_post);
    model_cq_view(m, mb + 8, &w->phi_res);

    for (uint32_t j = 0; j < 2; j++)
        for (uint32_t i = 0; i < h->hada_n; i++)
            st->perms[(size_t)j * h->hada_n + i] = (uint32_t)m->fp[f->l3.perm_index + j][i];
    w->perm1 = st->perms;
    w->perm2 = st->perms + h->hada_n;

    uint32_t site_layers[CACT3_MAX_SITES];
    w->n_sites = 0;
    for (uint32_t s = 0; s < h->num_engram_sites; s++) {
        int at = -1;
        for (uint32_t i = 0; i < n; i++)
            if (st->file_layer[i] == h->engram_sites[s]) at = (int)i;
        if (at < 0) continue; /* the rung dropped this site's layer */
        const uint32_t b = f->engram_base + 4 * s;
        engram_site *site = &w->sites[w->n_sites];
        site->layer = (uint32_t)at;
        model_cq_view(m, b + 0, &site->tables);
        model_cq_view(m, b + 1, &site->key_proj);
        model_cq_view(m, b + 2, &site->value_proj);
        site->taps = m->fp[b + 3];
        site_layers[w->n_sites++] = (uint32_t)at;
    }
    w->final_norm = m->fp[f->final_norm_index];

    /* RoPE inverse frequencies over qk_head_dim, as the reference computes them in f32 */
    for (uint32_t j = 0; j < w->qk_dim / 2; j++) {
        const float expo = (float)(2 * j) / (float)w->qk_dim;
        m->rope_freq[j] = 1.0f / powf(h->rope_theta, expo);
    }
    if (f->tokenizer_index >= 0) {
        /* The 3.x exporter allows fewer pieces than embedding rows (the rest are
         * input-only codes); ids past the pieces have no text. */
        const cact_tensor *t = &f->tensors[f->tokenizer_index];
        const uint32_t pieces = t->nbytes >= 4 ? rd_u32(t->data) : 0;
        if (pieces > h->vocab)
            return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: %u pieces, more than the header "
                               "vocab %u", pieces, h->vocab);
        int rc = tokenizer_create(t->data, (size_t)t->nbytes, pieces ? pieces : h->vocab,
                                  &m->tok);
        if (rc) return rc;
    }
    const int heads_rc = model3_bind_heads(m);
    if (heads_rc) return heads_rc;
    fill_info3(m, site_layers, gmask);
    return NEEDLE_OK;
}

void model3_unbind(struct needle_model *m) {
    model3_unbind_heads(m);
    model3_state *st = m->v3;
    if (!st) return;
    free(st->layers3);
    free(st->file_layer);
    free(st->perms);
    free(st);
    m->v3 = NULL;
}
