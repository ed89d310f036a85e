/* `needle grad`: the training core's parity probe (issue 32). The loss of a batch over a
 * Needle 3 or Needle 2 checkpoint (or a LoRA adapter on it) and its gradient, written as
 * safetensors under the checkpoint's (or adapter's) tensor names with the loss in the
 * metadata. The generation is the checkpoint's: a Needle 2 checkpoint keeps its config
 * beside it (--config, as `needle export` takes it), an official 3.x one in its metadata. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "export/export_model.h"
#include "export/export_model_v3.h"
#include "export/safetensors.h"
#include "needle.h"
#include "train/cact_base2.h"
#include "train/cact_base3.h"
#include "train/checkpoint.h"
#include "train/grad2.h"
#include "train/grad3.h"
#include "train/lora2.h"
#include "train/lora3.h"

typedef struct batch {
    int32_t *ids;
    float *mask;
    uint32_t B, T;
} batch;

/* --batch: one {"ids": [...], "mask": [...]} per line, every line of one length */
static int read_batch(const cli_command *cmd, const char *path, batch *b) {
    memset(b, 0, sizeof *b);
    size_t size = 0;
    char *text = (char *)cli_read_file(path, &size);
    if (!text) return cli_usage_error(cmd, "cannot read the batch %s", path);
    int rc = 0, line_no = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && !rc; line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        if (strspn(line, " \t\r") == strlen(line)) continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "ids");
        const cJSON *mask = cJSON_GetObjectItemCaseSensitive(j, "mask");
        const int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : -1;
        if (!j || n < 2 || !cJSON_IsArray(mask) || cJSON_GetArraySize(mask) != n) {
            rc = cli_usage_error(cmd, "%s line %d: want {\"ids\": [...], \"mask\": [...]} of one length >= 2",
                                 path, line_no);
        } else if (b->B && (uint32_t)n != b->T) {
            rc = cli_usage_error(cmd, "%s line %d: %d tokens, the lines before have %u (pad to one length)",
                                 path, line_no, n, b->T);
        } else {
            int32_t *ni = realloc(b->ids, (size_t)(b->B + 1) * n * sizeof *ni);
            if (ni) b->ids = ni;
            float *nm = realloc(b->mask, (size_t)(b->B + 1) * n * sizeof *nm);
            if (nm) b->mask = nm;
            if (!ni || !nm) rc = cli_lib_error("batch", NEEDLE_ERR_OUT_OF_MEMORY);
            for (int i = 0; i < n && !rc; i++) {
                const cJSON *id = cJSON_GetArrayItem(ids, i), *mk = cJSON_GetArrayItem(mask, i);
                if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 2147483647.0 ||
                    id->valuedouble != (double)(int32_t)id->valuedouble || !cJSON_IsNumber(mk))
                    rc = cli_usage_error(cmd, "%s line %d: entry %d is not a token id / mask number", path,
                                         line_no, i);
                else {
                    b->ids[(size_t)b->B * n + i] = (int32_t)id->valuedouble;
                    b->mask[(size_t)b->B * n + i] = (float)mk->valuedouble;
                }
            }
            b->T = (uint32_t)n;
            b->B++;
        }
        cJSON_Delete(j);
    }
    free(text);
    if (!rc && !b->B) rc = cli_usage_error(cmd, "%s has no examples", path);
    if (rc) {
        free(b->ids);
        free(b->mask);
        memset(b, 0, sizeof *b);
    }
    return rc;
}

/* The training core of the checkpoint's generation: the same calls on either model. */
typedef struct core {
    g3_model *m3;
    g2_model *m2;
} core;

static void core_fake_quant(core *c, int on) {
    if (c->m3) g3_set_fake_quant(c->m3, on);
    if (c->m2) g2_set_fake_quant(c->m2, on);
}

static int core_cq_weights(core *c, const cq_codebooks *cb) {
    return c->m3 ? g3_cq_weights(c->m3, cb) : g2_cq_weights(c->m2, cb);
}

static int core_loss(core *c, const batch *b, double *loss) {
    return c->m3 ? g3_loss(c->m3, b->ids, b->mask, b->B, b->T, 1, loss)
                 : g2_loss(c->m2, b->ids, b->mask, b->B, b->T, 1, loss);
}

static int core_lora_loss(core *c, const train_adapter *ad, const cq_codebooks *cb, const batch *b, double *loss,
                          float **dA, float **dB) {
    return c->m3 ? g3_lora_loss(c->m3, ad, cb, b->ids, b->mask, b->B, b->T, loss, dA, dB)
                 : g2_lora_loss(c->m2, ad, cb, b->ids, b->mask, b->B, b->T, loss, dA, dB);
}

/* the gradient of the tensor called `name`, NULL when the loss does not read it */
static float *core_grad(core *c, const char *name, uint64_t numel) {
    if (c->m3) {
        const g3_tensor *t = g3_find(c->m3, name);
        return t && t->numel == numel ? t->g : NULL;
    }
    const g2_tensor *t = g2_find(c->m2, name);
    return t && t->numel == numel ? t->g : NULL;
}

static uint32_t core_count(const core *c) { return c->m3 ? g3_tensor_count(c->m3) : g2_tensor_count(c->m2); }

/* tensor i's name, shape and gradient as an output tensor (pointing into the model) */
static void core_tensor(core *c, uint32_t i, train_tensor *t) {
    const char *name;
    const uint64_t *shape;
    if (c->m3) {
        g3_tensor *g = g3_tensor_at(c->m3, i);
        name = g->name, shape = g->shape, t->ndim = g->ndim, t->numel = g->numel, t->data = g->g;
    } else {
        g2_tensor *g = g2_tensor_at(c->m2, i);
        name = g->name, shape = g->shape, t->ndim = g->ndim, t->numel = g->numel, t->data = g->g;
    }
    t->name = (char *)name;
    memset(t->shape, 0, sizeof t->shape);
    for (uint32_t k = 0; k < t->ndim && k < 4; k++) t->shape[k] = shape[k];
}

static void core_free(core *c) {
    g3_model_free(c->m3);
    g2_model_free(c->m2);
    memset(c, 0, sizeof *c);
}

/* A TransformerConfig with a field only Needle 3 has (the official 3.x loader's test is
 * qk_head_dim; the others cannot appear in a Needle 2 config either). */
static int is_v3_config(const char *text, size_t len) {
    cJSON *j = cJSON_ParseWithLength(text, len);
    static const char *const keys[] = {"qk_head_dim", "v_head_dim", "out_vocab", "sliding_window",
                                       "global_layers", "qkv_conv_taps", "engram_seed_heads", "ladder_widths"};
    int v3 = 0;
    for (size_t i = 0; j && i < sizeof keys / sizeof keys[0]; i++) v3 |= cJSON_GetObjectItemCaseSensitive(j, keys[i]) != NULL;
    cJSON_Delete(j);
    return v3;
}

static int run_grad(const cli_command *cmd, int argc, char **argv) {
    const char *ckpt_path = NULL, *weights_path = NULL, *config_path = NULL, *lora_path = NULL, *batch_path = NULL, *out_path = NULL;
    int quant_weights = 0, quant = 0, json = 0;
    const cli_option opts[] = {
        {"--checkpoint", "-c", CLI_TEXT, &ckpt_path, 0, 0, NULL},
        {"--config", NULL, CLI_TEXT, &config_path, 0, 0, NULL},
        {"--weights", "-w", CLI_TEXT, &weights_path, 0, 0, NULL},
        {"--lora", NULL, CLI_TEXT, &lora_path, 0, 0, NULL},
        {"--quant-weights", NULL, CLI_FLAG, &quant_weights, 0, 0, NULL},
        {"--quant", NULL, CLI_FLAG, &quant, 0, 0, NULL},
        {"--batch", NULL, CLI_TEXT, &batch_path, 0, 0, NULL},
        {"--out", "-o", CLI_TEXT, &out_path, 0, 0, NULL},
        {"--json", NULL, CLI_FLAG, &json, 0, 0, NULL},
        {NULL, NULL, CLI_FLAG, NULL, 0, 0, NULL},
    };
    int rc = cli_parse(cmd, argc, argv, opts, NULL, 0);
    if (rc != CLI_GO) return rc;
    if (!ckpt_path == !weights_path) return cli_usage_error(cmd, "give --checkpoint or --weights (one of them)");
    if (weights_path && config_path) return cli_usage_error(cmd, "--config goes with --checkpoint (a .cact has its config)");
    if (!batch_path) return cli_usage_error(cmd, "--batch is required");
    if (!out_path) return cli_usage_error(cmd, "--out is required");
    if (quant_weights && quant) return cli_usage_error(cmd, "give --quant or --quant-weights, not both");
    quant_weights |= quant; /* --quant is CQ straight-through and A8 / int8 K/V */

    batch b;
    if ((rc = read_batch(cmd, batch_path, &b))) return rc;
    size_t size = 0;
    const char *base_path = weights_path ? weights_path : ckpt_path;
    uint8_t *img = cli_read_file(base_path, &size);
    int st_parsed = 0;
    st_file st;
    memset(&st, 0, sizeof st);
    core m = {NULL, NULL};
    char *cfg_text = NULL;
    train_adapter ad;
    memset(&ad, 0, sizeof ad);
    int have_ad = 0, s = 0;
    float **dA = NULL, **dB = NULL;
    double loss = 0;
    rc = 1;
    if (!img) {
        fprintf(stderr, "needle grad: cannot read %s\n", base_path);
        goto done;
    }
    if (weights_path) {
        /* a .cact base: its records dequantized as the runtime reads them */
        const int gen = cact_base_generation(img, size);
        if (!gen) {
            fprintf(stderr, "needle grad: %s is not a .cact file\n", weights_path);
            goto done;
        }
        if ((s = gen == 3 ? g3_model_from_cact(img, size, NULL, &m.m3) : g2_model_from_cact(img, size, NULL, &m.m2))) {
            cli_lib_error(weights_path, s);
            goto done;
        }
    } else if ((s = st_parse(img, size, &st))) {
        cli_lib_error(ckpt_path, s);
        goto done;
    } else {
        st_parsed = 1;
    }
    const char *cj = st_parsed ? st_meta_get(&st, "config") : NULL;
    if (weights_path) {
        /* the model is made */
    } else if (config_path) {
        /* Needle 2: the TransformerConfig beside the checkpoint */
        size_t cfg_size = 0;
        export_config cfg2;
        cfg_text = (char *)cli_read_file(config_path, &cfg_size);
        if (!cfg_text) {
            fprintf(stderr, "needle grad: cannot read the config %s\n", config_path);
            goto done;
        }
        if (is_v3_config(cfg_text, cfg_size) || st_find(&st, "stack/layers/block/hadamard_mlp/w1a")) {
            /* the Needle 2 core would read the Needle 2 subset of a Needle 3 tree and
             * compute another network */
            fprintf(stderr, "needle grad: %s is a Needle 3 %s: give the official 3.x checkpoint alone (its config "
                            "is in its metadata)\n", is_v3_config(cfg_text, cfg_size) ? config_path : ckpt_path,
                    is_v3_config(cfg_text, cfg_size) ? "config" : "checkpoint");
            goto done;
        }
        if ((s = export_config_parse(cfg_text, cfg_size, &cfg2)) || (s = g2_model_from_checkpoint(&cfg2, &st, &m.m2))) {
            cli_lib_error(config_path, s);
            goto done;
        }
        if (quant_weights && cfg2.weight_bits[0]) {
            /* finetune_local then quantizes by the config's mixed bits map, which the
             * training core does not do */
            fprintf(stderr, "needle grad: %s has a weight_bits map (%s); --quant / --quant-weights support the "
                            "W4 default only\n", config_path, cfg2.weight_bits);
            goto done;
        }
    } else {
        export3_config cfg;
        if (!cj) {
            fprintf(stderr, "needle grad: %s has no `config` metadata: an official 3.x checkpoint has; a Needle 2 "
                            "checkpoint needs --config CONFIG.json\n", ckpt_path);
            goto done;
        }
        if ((s = export3_config_parse(cj, strlen(cj), &cfg)) || (s = g3_model_from_checkpoint(&cfg, &st, &m.m3))) {
            cli_lib_error(ckpt_path, s);
            goto done;
        }
    }
    core_fake_quant(&m, quant);
    cq_codebooks cb;
    if (quant_weights && (s = cq_codebooks_init(&cb, G3_CQ_GROUP))) {
        cli_lib_error("codebooks", s);
        goto done;
    }
    if (lora_path) {
        if ((s = train_adapter_read(lora_path, &ad))) {
            cli_lib_error(lora_path, s);
            goto done;
        }
        have_ad = 1;
        dA = calloc(ad.n ? ad.n : 1, sizeof *dA);
        dB = calloc(ad.n ? ad.n : 1, sizeof *dB);
        for (uint32_t i = 0; dA && dB && i < ad.n; i++) {
            dA[i] = calloc(ad.lora[i].a.numel, sizeof **dA);
            dB[i] = calloc(ad.lora[i].b.numel, sizeof **dB);
            if (!dA[i] || !dB[i]) break;
        }
        if ((s = core_lora_loss(&m, &ad, quant_weights ? &cb : NULL, &b, &loss, dA, dB))) {
            cli_lib_error("grad", s);
            goto done;
        }
    } else if ((quant_weights && (s = core_cq_weights(&m, &cb))) || (s = core_loss(&m, &b, &loss))) {
        /* without an adapter the quantized weights replace the base: their gradient is the
         * straight-through gradient of the base */
        cli_lib_error("grad", s);
        goto done;
    }
    /* the output: gradients under the input's names, loss in the metadata */
    char loss_text[64];
    snprintf(loss_text, sizeof loss_text, "%.9g", (double)(float)loss);
    const char *meta[] = {"loss", loss_text, NULL};
    uint32_t n_out = have_ad ? 2 * ad.n : weights_path ? core_count(&m) : st.n;
    train_tensor *out = calloc(n_out ? n_out : 1, sizeof *out);
    char **names = calloc(n_out ? n_out : 1, sizeof *names);
    float *zeros = NULL;
    if (!out || !names) {
        free(out);
        free(names);
        cli_lib_error("grad", NEEDLE_ERR_OUT_OF_MEMORY);
        goto done;
    }
    if (have_ad) {
        for (uint32_t i = 0; i < ad.n; i++)
            for (int k = 0; k < 2; k++) {
                const train_tensor *src = k ? &ad.lora[i].b : &ad.lora[i].a;
                train_tensor *t = &out[2 * i + k];
                *t = *src;
                t->name = src->name;
                t->data = k ? dB[i] : dA[i];
            }
    } else if (weights_path) {
        /* every tensor of the network under its tree name */
        /* (a Needle 3 model without conv taps has empty tap tensors: not written) */
        uint32_t k = 0;
        for (uint32_t i = 0; i < n_out; i++) {
            core_tensor(&m, i, &out[k]);
            k += out[k].numel != 0;
        }
        n_out = k;
    } else {
        uint64_t biggest = 0;
        for (uint32_t i = 0; i < st.n; i++) biggest = st.tensors[i].numel > biggest ? st.tensors[i].numel : biggest;
        zeros = calloc(biggest ? biggest : 1, sizeof *zeros);
        for (uint32_t i = 0; i < st.n; i++) {
            const st_tensor *src = &st.tensors[i];
            float *g = core_grad(&m, src->name, src->numel);
            train_tensor *t = &out[i];
            t->name = src->name;
            t->ndim = src->ndim;
            memcpy(t->shape, src->shape, sizeof t->shape);
            t->numel = src->numel;
            /* a tensor the LM loss does not reach (the probe heads) has gradient 0 */
            t->data = g ? g : zeros;
        }
    }
    if (!zeros && !have_ad && !weights_path) { /* the zeros of tensors the loss does not reach */
        s = NEEDLE_ERR_OUT_OF_MEMORY;
    } else {
        s = train_write_tensors(out_path, out, n_out, meta);
    }
    free(out);
    free(names);
    free(zeros);
    if (s) {
        cli_lib_error(out_path, s);
        goto done;
    }
    if (json)
        printf("{\"loss\": %.9g, \"tensors\": %u, \"batch\": %u, \"tokens\": %u}\n", (double)(float)loss, n_out,
               b.B, b.T);
    rc = 0;
done:
    if (dA && dB)
        for (uint32_t i = 0; i < ad.n; i++) {
            free(dA[i]);
            free(dB[i]);
        }
    free(dA);
    free(dB);
    if (have_ad) train_adapter_release(&ad);
    core_free(&m);
    free(cfg_text);
    if (st_parsed) st_release(&st);
    free(img);
    free(b.ids);
    free(b.mask);
    return rc;
}

const cli_command cli_grad = {
    "grad", "the loss of a batch and its gradient (the training core's parity probe)",
    "usage: needle grad (--checkpoint C.safetensors [--config CONFIG.json] | --weights M.cact)\n"
    "                   [--lora A.safetensors]\n"
    "                   [--quant | --quant-weights] --batch B.jsonl --out G.safetensors [--json]\n"
    "\n"
    "The official fine-tuning loss (masked mean cross-entropy of logits[:, :-1] against\n"
    "ids[:, 1:] with mask[:, 1:], divided by max(mask sum, 1)) over a batch, and its\n"
    "gradient, from the training core (src/train): Needle 3 as cactus-needle 3.2.8 computes\n"
    "it, Needle 2 as 2.0.15 does.\n"
    "\n"
    "  -c, --checkpoint FILE   an official 3.x checkpoint (safetensors, `config` metadata), or\n"
    "                          with --config a Needle 2 checkpoint (safetensors, as `needle\n"
    "                          export` reads it)\n"
    "  --config FILE           the Needle 2 TransformerConfig (JSON): the checkpoint is Needle 2\n"
    "  -w, --weights FILE      a .cact (Needle 2 or 3) as the base instead of a checkpoint: every\n"
    "                          record dequantized as the runtime reads it (the gradients are\n"
    "                          written under the checkpoint names of the flax tree)\n"
    "  --lora FILE             an adapter (write_adapter layout: lora/<path>/A|B, `scale`):\n"
    "                          the loss over W + scale * A @ B, the gradient of every A, B\n"
    "                          (written as lora/<path>/A|B); without it, the base loss and\n"
    "                          the gradient of every checkpoint tensor, under its name\n"
    "                          (0 for tensors the loss does not reach: the probe heads, mtp_*)\n"
    "  --quant                 the exact fine-tuning loss: CQ W4 straight-through on the\n"
    "                          (merged) weights and the forward of quant=True after\n"
    "                          configure_deploy(8, 8): A8 activations (Needle 3 also per-head\n"
    "                          int8 q/K/V; 2.0.15 has no K/V quantization at 8 bits), all\n"
    "                          straight-through\n"
    "  --quant-weights         the CQ W4 straight-through alone (as cq_ste_params), float\n"
    "                          activations\n"
    "  --batch FILE            JSONL, one {\"ids\": [...], \"mask\": [...]} per line, already\n"
    "                          encoded and padded to one length\n"
    "  -o, --out FILE          the gradients (safetensors, F32, metadata `loss`)\n"
    "  --json                  {\"loss\": ...} on stdout\n"
    "\n"
    "A8 rounding makes the --quant loss chaotic at the float32 level (the official code in\n"
    "float32 and float64 differs by ~1e-3 in its gradients); see tests/fixtures/grad_v3 and\n"
    "tests/fixtures/grad_v2.\n",
    run_grad};
