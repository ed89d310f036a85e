/* The build's checkpoint changes: metadata, adapters, the LoRA merge (see lora_merge.h). */
#include "train/lora_merge.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/exact_fma.h"
#include "util/error.h"
#include "util/fp16.h"

int lora_checkpoint_config(const st_file *ck, const char *path, char **config_json) {
    *config_json = NULL;
    const char *version = st_meta_get(ck, "format_version"), *text = st_meta_get(ck, "config");
    const long v = version && *version ? strtol(version, NULL, 10) : -1;
    if (v != TRAIN_CHECKPOINT_FORMAT)
        return needle_fail(NEEDLE_ERR_FORMAT,
                           "%s is not a format-v%d checkpoint (the official Needle 3 checkpoint format: "
                           "format_version and config in the safetensors metadata)",
                           path, TRAIN_CHECKPOINT_FORMAT);
    cJSON *cfg = text ? cJSON_Parse(text) : cJSON_CreateObject();
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

/* ---- the merge ------------------------------------------------------------------------ */

/* XLA's CPU dot (jax 0.10.2, as the pinned reference runs it) sums over the rank with
 * fused multiply-adds in a number of interleaved accumulators that depends on the
 * output width: one when it is a multiple of 64, two ((even + odd) k) for a multiple of
 * 32, otherwise four added as (a0 + a1) + (a2 + a3); k past the last whole round of
 * accumulators is a chain of its own added last. Measured against jnp.matmul on every
 * LoRA shape of the fixtures and of the released geometry (out 96, 128, 576, 768); the
 * tail rule is measured for two accumulators only (ranks that are not a multiple of 4
 * with four accumulators may differ in the last bit). */
void lora_matmul(const float *a, const float *b, uint64_t lead, uint64_t in, uint64_t rank, uint64_t outd,
                 float *out) {
    const uint32_t nacc = outd % 64 == 0 ? 1 : outd % 32 == 0 ? 2 : 4;
    const uint64_t main = rank / nacc * nacc;
    for (uint64_t l = 0; l < lead; l++) {
        const float *bv = b + l * rank * outd;
        for (uint64_t i = 0; i < in; i++) {
            const float *av = a + (l * in + i) * rank;
            float *row = out + (l * in + i) * outd;
            for (uint64_t j = 0; j < outd; j++) {
                float acc[4] = {0, 0, 0, 0}, tail = 0;
                for (uint64_t k = 0; k < main; k++) acc[k % nacc] = exact_fmaf(av[k], bv[k * outd + j], acc[k % nacc]);
                for (uint64_t k = main; k < rank; k++) tail = exact_fmaf(av[k], bv[k * outd + j], tail);
                float s = nacc == 1 ? acc[0] : nacc == 2 ? acc[0] + acc[1] : (acc[0] + acc[1]) + (acc[2] + acc[3]);
                if (main < rank) s += tail;
                row[j] = s;
            }
        }
    }
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

static int merge_group(const st_tensor *w, const train_lora *g, double scale, st_tensor *out, uint8_t **owned) {
    const uint32_t nd = w->ndim;
    int ok = nd >= 2 && g->a.ndim == nd && w->shape[nd - 2] == g->a.shape[nd - 2] &&
             w->shape[nd - 1] == g->b.shape[nd - 1];
    uint64_t lead = 1;
    for (uint32_t k = 0; ok && k + 2 < nd; k++) {
        ok = w->shape[k] == g->a.shape[k];
        lead *= w->shape[k];
    }
    if (!ok) return needle_fail(NEEDLE_ERR_FORMAT, "adapter: %s: A @ B does not have the kernel's shape", g->path);
    const uint64_t in = w->shape[nd - 2], outd = w->shape[nd - 1], rank = g->a.shape[nd - 1];
    const size_t es = w->dtype == ST_F32 ? 4 : 2;
    float *prod = malloc(w->numel * sizeof *prod + 1);
    uint8_t *data = malloc(w->numel * es + 1);
    if (!prod || !data) {
        free(prod);
        free(data);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "%s: out of memory", g->path);
    }
    lora_matmul(g->a.data, g->b.data, lead, in, rank, outd, prod);
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

int lora_full_finetune_checkpoint(const st_file *ck) {
    const char *run = st_meta_get(ck, "run");
    cJSON *j = run ? cJSON_Parse(run) : NULL;
    const cJSON *full =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "needle_finetune"), "full");
    const int yes = cJSON_IsNumber(full) && full->valuedouble != 0;
    cJSON_Delete(j);
    return yes;
}

int lora_calibrated_checkpoint(const st_file *ck) {
    const char *run = st_meta_get(ck, "run");
    cJSON *j = run ? cJSON_Parse(run) : NULL;
    const int yes = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "needle_calibrate"));
    cJSON_Delete(j);
    return yes;
}

/* drop: 0 never, 1 by the build's rule (an adapter merged, or a --full checkpoint that
 * `needle calibrate` did not write), 2 always */
static int view_build(const st_file *ck, const train_adapter *ad, int drop, lora_view *out,
                      int *dropped_confidence) {
    memset(out, 0, sizeof *out);
    *dropped_confidence = 0;
    const int drop_confidence =
        drop == 2 || (drop == 1 && (ad || (lora_full_finetune_checkpoint(ck) && !lora_calibrated_checkpoint(ck))));
    out->st.tensors = malloc((ck->n + 1) * sizeof *out->st.tensors);
    out->owned = malloc(((ad ? ad->n : 0) + 1) * sizeof *out->owned);
    if (!out->st.tensors || !out->owned) {
        lora_view_release(out);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (uint32_t i = 0; i < ck->n; i++) {
        const st_tensor *t = &ck->tensors[i];
        if (!strncmp(t->name, "mtp_", 4)) continue; /* run.load_checkpoint: training-only heads */
        if (drop_confidence && !strncmp(t->name, "confidence_head/", 16)) {
            *dropped_confidence = 1;
            continue;
        }
        out->st.tensors[out->st.n++] = *t;
    }
    for (uint32_t gi = 0; ad && gi < ad->n; gi++) {
        const train_lora *g = &ad->lora[gi];
        st_tensor *w = NULL;
        for (uint32_t i = 0; i < out->st.n && !w; i++)
            if (!strcmp(out->st.tensors[i].name, g->path)) w = &out->st.tensors[i];
        if (!w) {
            lora_view_release(out);
            return needle_fail(NEEDLE_ERR_FORMAT, "the adapter adapts %s, which the checkpoint does not have "
                               "(an adapter for another model?)", g->path);
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

int lora_view_build(const st_file *ck, const train_adapter *ad, lora_view *out, int *dropped_confidence) {
    return view_build(ck, ad, 1, out, dropped_confidence);
}

int lora_view_build_no_confidence(const st_file *ck, lora_view *out) {
    int dropped = 0;
    return view_build(ck, NULL, 2, out, &dropped);
}

int lora_view_build_v2(const st_file *ck, const train_adapter *ad, lora_view *out) {
    int dropped = 0;
    return view_build(ck, ad, 0, out, &dropped);
}
