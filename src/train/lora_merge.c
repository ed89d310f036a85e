/* The build's checkpoint changes: metadata, adapters, the LoRA merge (see lora_merge.h). */
#include "train/lora_merge.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fp16.h"

int st_metadata_string(const uint8_t *image, size_t size, const char *key, char **out) {
    *out = NULL;
    if (size < 8) return needle_fail(NEEDLE_ERR_FORMAT, "not a safetensors file (%zu bytes)", size);
    const uint64_t n = rd_u64(image);
    if (n > size - 8) return needle_fail(NEEDLE_ERR_FORMAT, "safetensors header runs past the end of the file");
    cJSON *root = cJSON_ParseWithLength((const char *)image + 8, (size_t)n);
    if (!root) return needle_fail(NEEDLE_ERR_FORMAT, "safetensors header is not JSON");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    const cJSON *v = cJSON_IsObject(meta) ? cJSON_GetObjectItemCaseSensitive(meta, key) : NULL;
    int st = 0;
    if (cJSON_IsString(v) && !(*out = strdup(v->valuestring)))
        st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    cJSON_Delete(root);
    return st;
}

int lora_checkpoint_config(const uint8_t *image, size_t size, const char *path, char **config_json) {
    *config_json = NULL;
    char *version = NULL, *text = NULL;
    int st = st_metadata_string(image, size, "format_version", &version);
    if (st) return st;
    const long v = version && *version ? strtol(version, NULL, 10) : -1;
    free(version);
    if (v != LORA_CHECKPOINT_FORMAT_VERSION)
        return needle_fail(NEEDLE_ERR_FORMAT,
                           "%s is not a format-v%d checkpoint (the official Needle 3 checkpoint format: "
                           "format_version and config in the safetensors metadata)",
                           path, LORA_CHECKPOINT_FORMAT_VERSION);
    if ((st = st_metadata_string(image, size, "config", &text))) return st;
    cJSON *cfg = text ? cJSON_Parse(text) : cJSON_CreateObject();
    free(text);
    if (!cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return needle_fail(NEEDLE_ERR_FORMAT, "%s: the config metadata is not a JSON object", path);
    }
    if (cJSON_GetObjectItemCaseSensitive(cfg, "attn_dim") && !cJSON_GetObjectItemCaseSensitive(cfg, "qk_head_dim")) {
        cJSON_Delete(cfg);
        return needle_fail(NEEDLE_ERR_FORMAT,
                           "%s is a Needle 2 checkpoint; needle build makes Needle 3 files (use needle "
                           "export for Needle 2)",
                           path);
    }
    /* TransformerConfig.from_saved: attn_dim is no field (dropped); keys newer than the
     * checkpoint default to "off", not to the class defaults */
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "attn_dim");
    static const char *const zero_keys[] = {"qk_head_dim",  "v_head_dim",        "sliding_window",
                                            "engram_seed_heads", "qkv_conv_taps", "out_vocab"};
    static const char *const empty_keys[] = {"global_layers", "ladder_depths", "ladder_widths", "ladder_order"};
    for (size_t i = 0; i < sizeof zero_keys / sizeof *zero_keys; i++)
        if (!cJSON_GetObjectItemCaseSensitive(cfg, zero_keys[i])) cJSON_AddNumberToObject(cfg, zero_keys[i], 0);
    for (size_t i = 0; i < sizeof empty_keys / sizeof *empty_keys; i++)
        if (!cJSON_GetObjectItemCaseSensitive(cfg, empty_keys[i])) cJSON_AddArrayToObject(cfg, empty_keys[i]);
    *config_json = cJSON_PrintUnformatted(cfg);
    cJSON_Delete(cfg);
    return *config_json ? 0 : needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
}

/* ---- adapters ------------------------------------------------------------------------- */

static int meta_json(const uint8_t *image, size_t size, const char *key, cJSON **out) {
    char *text = NULL;
    *out = NULL;
    const int st = st_metadata_string(image, size, key, &text);
    if (st || !text) return st;
    *out = cJSON_Parse(text);
    free(text);
    if (!*out) return needle_fail(NEEDLE_ERR_FORMAT, "adapter metadata %s is not JSON", key);
    return 0;
}

void lora_adapter_release(lora_adapter *ad) {
    if (!ad) return;
    for (uint32_t i = 0; i < ad->n; i++) free(ad->groups[i].key);
    free(ad->groups);
    free(ad->base);
    st_release(&ad->st);
    memset(ad, 0, sizeof *ad);
}

static int group_of(lora_adapter *ad, const char *key, size_t len, lora_group **out) {
    for (uint32_t i = 0; i < ad->n; i++)
        if (strlen(ad->groups[i].key) == len && !memcmp(ad->groups[i].key, key, len)) {
            *out = &ad->groups[i];
            return 0;
        }
    lora_group *g = realloc(ad->groups, (ad->n + 1) * sizeof *g);
    if (!g) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    ad->groups = g;
    g = &ad->groups[ad->n];
    memset(g, 0, sizeof *g);
    if (!(g->key = malloc(len + 1))) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    memcpy(g->key, key, len);
    g->key[len] = 0;
    ad->n++;
    *out = g;
    return 0;
}

static int adapter_tensors(lora_adapter *ad) {
    for (uint32_t i = 0; i < ad->st.n; i++) {
        const st_tensor *t = &ad->st.tensors[i];
        if (!strcmp(t->name, "rows")) continue; /* a Whistle adapter's new embedding rows */
        const char *slash = strrchr(t->name, '/');
        if (strncmp(t->name, "lora/", 5) || !slash || slash - t->name <= 5 || (strcmp(slash, "/A") && strcmp(slash, "/B")))
            return needle_fail(NEEDLE_ERR_FORMAT, "adapter tensor %s is not lora/<path>/A or lora/<path>/B", t->name);
        lora_group *g = NULL;
        int st = group_of(ad, t->name + 5, (size_t)(slash - t->name - 5), &g);
        if (st) return st;
        const st_tensor **slot = slash[1] == 'A' ? &g->a : &g->b;
        if (*slot) return needle_fail(NEEDLE_ERR_FORMAT, "adapter tensor %s appears twice", t->name);
        *slot = t;
    }
    for (uint32_t i = 0; i < ad->n; i++) {
        const lora_group *g = &ad->groups[i];
        if (!g->a || !g->b)
            return needle_fail(NEEDLE_ERR_FORMAT, "adapter: %s has %s but no %s", g->key, g->a ? "A" : "B",
                               g->a ? "B" : "A");
        const uint32_t nd = g->a->ndim;
        int ok = nd >= 2 && g->b->ndim == nd && g->a->shape[nd - 1] == g->b->shape[nd - 2];
        for (uint32_t k = 0; ok && k + 2 < nd; k++) ok = g->a->shape[k] == g->b->shape[k];
        if (!ok) return needle_fail(NEEDLE_ERR_FORMAT, "adapter: %s: A and B shapes do not multiply", g->key);
    }
    return 0;
}

int lora_adapter_parse(const uint8_t *image, size_t size, lora_adapter *out) {
    memset(out, 0, sizeof *out);
    int st = st_parse(image, size, &out->st);
    if (st) return st;
    cJSON *scale = NULL, *base = NULL, *languages = NULL;
    if ((st = meta_json(image, size, "scale", &scale)) || (st = meta_json(image, size, "base", &base)) ||
        (st = meta_json(image, size, "languages", &languages)))
        goto done;
    out->whistle = languages && !cJSON_IsNull(languages);
    if (!cJSON_IsNumber(scale) || !isfinite(scale->valuedouble)) {
        st = needle_fail(NEEDLE_ERR_FORMAT, "adapter has no numeric scale in its metadata (not an adapter "
                         "written by needle finetune?)");
        goto done;
    }
    out->scale = scale->valuedouble;
    if (cJSON_IsString(base) && !(out->base = strdup(base->valuestring))) {
        st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    st = adapter_tensors(out);
done:
    cJSON_Delete(scale);
    cJSON_Delete(base);
    cJSON_Delete(languages);
    if (st) lora_adapter_release(out);
    return st;
}

/* ---- the merge ------------------------------------------------------------------------ */

/* XLA's CPU dot (jax 0.10.2, as the pinned reference runs it) sums over the rank with
 * fused multiply-adds in a number of interleaved accumulators that depends on the
 * output width: one when it is a multiple of 64, two ((even + odd) k) for a multiple of
 * 32, otherwise four added as (a0 + a1) + (a2 + a3); k past the last whole round of
 * accumulators is a chain of its own added last. Measured against jnp.matmul on every
 * LoRA shape of the fixtures and of the released geometry (out 96, 128, 576, 768); the
 * tail rule is measured for two accumulators only (ranks that are not a multiple of 4
 * with four accumulators may differ in the last bit). */
void lora_matmul(const st_tensor *a, const st_tensor *b, uint64_t lead, uint64_t in, uint64_t rank,
                 uint64_t outd, float *out) {
    const uint32_t nacc = outd % 64 == 0 ? 1 : outd % 32 == 0 ? 2 : 4;
    const uint64_t main = rank / nacc * nacc;
    float *av = malloc(rank * sizeof *av + 1), *bv = malloc(rank * outd * sizeof *bv + 1);
    for (uint64_t l = 0; l < lead && av && bv; l++) {
        for (uint64_t k = 0; k < rank * outd; k++) bv[k] = st_get(b, (l * rank * outd) + k);
        for (uint64_t i = 0; i < in; i++) {
            for (uint64_t k = 0; k < rank; k++) av[k] = st_get(a, (l * in + i) * rank + k);
            float *row = out + (l * in + i) * outd;
            for (uint64_t j = 0; j < outd; j++) {
                float acc[4] = {0, 0, 0, 0}, tail = 0;
                for (uint64_t k = 0; k < main; k++) acc[k % nacc] = fmaf(av[k], bv[k * outd + j], acc[k % nacc]);
                for (uint64_t k = main; k < rank; k++) tail = fmaf(av[k], bv[k * outd + j], tail);
                float s = nacc == 1 ? acc[0] : nacc == 2 ? acc[0] + acc[1] : (acc[0] + acc[1]) + (acc[2] + acc[3]);
                if (main < rank) s += tail;
                row[j] = s;
            }
        }
    }
    free(av);
    free(bv);
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static void put_elem(st_dtype dt, uint8_t *data, uint64_t i, float v) {
    if (dt == ST_F32) {
        memcpy(data + 4 * i, &v, 4);
        return;
    }
    const uint16_t h = dt == ST_F16 ? f32_to_fp16(v) : f32_to_bf16(v);
    data[2 * i] = (uint8_t)h;
    data[2 * i + 1] = (uint8_t)(h >> 8);
}

/* The value as the tensor's dtype holds it (jax's .astype(W.dtype)). */
static float round_to(st_dtype dt, float v) {
    if (dt == ST_F16) return fp16_to_f32(f32_to_fp16(v));
    if (dt == ST_BF16) {
        const uint32_t u = (uint32_t)f32_to_bf16(v) << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return v;
}

static int merge_group(const st_tensor *w, const lora_group *g, double scale, st_tensor *out, uint8_t **owned) {
    const uint32_t nd = w->ndim;
    int ok = g->a->ndim == nd && w->shape[nd - 2] == g->a->shape[nd - 2] && w->shape[nd - 1] == g->b->shape[nd - 1];
    uint64_t lead = 1;
    for (uint32_t k = 0; ok && k + 2 < nd; k++) {
        ok = w->shape[k] == g->a->shape[k];
        lead *= w->shape[k];
    }
    if (!ok) return needle_fail(NEEDLE_ERR_FORMAT, "adapter: %s: A @ B does not have the kernel's shape", g->key);
    const uint64_t in = w->shape[nd - 2], outd = w->shape[nd - 1], rank = g->a->shape[nd - 1];
    const size_t es = w->dtype == ST_F32 ? 4 : 2;
    float *prod = malloc(w->numel * sizeof *prod + 1);
    uint8_t *data = malloc(w->numel * es + 1);
    if (!prod || !data) {
        free(prod);
        free(data);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", g->key);
    }
    lora_matmul(g->a, g->b, lead, in, rank, outd, prod);
    /* float32(scale) * (A @ B), cast to W's dtype, added in float32 and stored as W's dtype */
    const float s = (float)scale;
    for (uint64_t i = 0; i < w->numel; i++) put_elem(w->dtype, data, i, st_get(w, i) + round_to(w->dtype, s * prod[i]));
    free(prod);
    *out = *w;
    out->data = data;
    *owned = data;
    return 0;
}

void lora_view_release(lora_view *v) {
    if (!v) return;
    for (uint32_t i = 0; i < v->n_owned; i++) free(v->owned[i]);
    free(v->owned);
    free(v->st.tensors); /* the names belong to the checkpoint */
    memset(v, 0, sizeof *v);
}

int lora_view_build(const st_file *ck, const lora_adapter *ad, lora_view *out, int *dropped_confidence) {
    memset(out, 0, sizeof *out);
    *dropped_confidence = 0;
    out->st.tensors = malloc((ck->n + 1) * sizeof *out->st.tensors);
    out->owned = malloc(((ad ? ad->n : 0) + 1) * sizeof *out->owned);
    if (!out->st.tensors || !out->owned) {
        lora_view_release(out);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (uint32_t i = 0; i < ck->n; i++) {
        const st_tensor *t = &ck->tensors[i];
        if (!strncmp(t->name, "mtp_", 4)) continue; /* run.load_checkpoint: training-only heads */
        if (ad && !strncmp(t->name, "confidence_head/", 16)) {
            *dropped_confidence = 1;
            continue;
        }
        out->st.tensors[out->st.n++] = *t;
    }
    for (uint32_t gi = 0; ad && gi < ad->n; gi++) {
        const lora_group *g = &ad->groups[gi];
        st_tensor *w = NULL;
        for (uint32_t i = 0; i < out->st.n && !w; i++)
            if (!strcmp(out->st.tensors[i].name, g->key)) w = &out->st.tensors[i];
        if (!w) {
            lora_view_release(out);
            return needle_fail(NEEDLE_ERR_FORMAT, "the adapter adapts %s, which the checkpoint does not have "
                               "(an adapter for another model?)", g->key);
        }
        const int st = merge_group(w, g, ad->scale, w, &out->owned[out->n_owned]);
        if (st) {
            lora_view_release(out);
            return st;
        }
        out->n_owned++;
    }
    return 0;
}
