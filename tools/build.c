/* build.c: `needle build`, the official `needle build` of cactus-needle 3.2.8
 * (model/build.py) in C (and of 2.0.15 for a Needle 2 base: build_image_v2): an official Needle 3 checkpoint, optionally with a LoRA adapter
 * merged into it and cut to an N-layer ladder rung, exported as CQ4 with the base
 * archive's tokenizer and the KV-budget window; byte-identical to the official build of
 * the same inputs (tests/parity/test_build.c, fixtures from tests/reference/make_build_fixtures).
 *
 * Where the official build downloads "the published base archive" (for its tokenizer,
 * and as the output when there is nothing to merge or cut), this one takes it from
 * --weights, by default the cached needle3 (`needle download needle3`). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "build.h"
#include "cli.h"
#include "export/cact_write.h"
#include "export/export_model.h"
#include "export/export_model_v3.h"
#include "export/requantize.h"
#include "export/rung.h"
#include "quant/bits_map.h"
#include "train/lora_merge.h"

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* the rung's config (finetune.rung -> architecture.ladder_config) as far as the KV window
 * reads it: depth, kept global layers and engram sites, taken from the sliced header */
static uint32_t rung_kv_window(export3_config cfg, const cact_writer *w) {
    const uint64_t mask = (uint64_t)w->v3_header[18] << 32 | w->v3_header[17];
    cfg.num_layers = w->v3_header[10];
    cfg.num_global = (uint32_t)__builtin_popcountll(mask);
    cfg.num_sites = w->v3_header[31];
    return export3_effective_kv_window(&cfg);
}

/* A failure reading a safetensors input (cli_lib_error would call it a .cact problem). */
static int input_error(const char *path) {
    fprintf(stderr, "needle: %s: %s\n", path, needle_last_error());
    return 1;
}

static uint32_t tokenizer_pieces(const build_job *job) {
    return job->tokenizer_size >= 4 ? (uint32_t)job->tokenizer[0] | (uint32_t)job->tokenizer[1] << 8 |
                                          (uint32_t)job->tokenizer[2] << 16 | (uint32_t)job->tokenizer[3] << 24
                                    : 0;
}

/* Needle 2: checkpoint (+ adapter) -> merged view -> export_build -> checked image */
static int build_image_v2(const build_job *job, uint8_t **image, size_t *size) {
    if (job->layers) {
        fprintf(stderr, "needle: --layers: a Needle 2 model has no ladder rungs (2.0.15's build has no --layers)\n");
        return 1;
    }
    size_t ck_size;
    uint8_t *ck_image = cli_read_file(job->ckpt_path, &ck_size);
    if (!ck_image) return 1;
    st_file ck = {0};
    lora_view view = {0};
    cact_writer w;
    cw_init(&w);
    export_config cfg;
    cq_codebooks cb;
    int rc = 1, st;
    const char *cj = NULL;
    if ((st = st_parse(ck_image, ck_size, &ck))) {
        rc = input_error(job->ckpt_path);
        goto done;
    }
    cj = job->config_json ? job->config_json : st_meta_get(&ck, "config");
    if (!cj) {
        fprintf(stderr, "needle: %s has no `config` metadata: give the Needle 2 config with --config CONFIG.json\n",
                job->ckpt_path);
        goto done;
    }
    if ((st = export_config_parse(cj, strlen(cj), &cfg)) || (st = lora_view_build_v2(&ck, job->adapter, &view))) {
        rc = input_error(job->ckpt_path);
        goto done;
    }
    if (job->adapter && !job->quiet)
        printf("  %-9s %u weight groups  scale %g\n", "merged", job->adapter->n, job->adapter->scale);
    if ((st = cq_codebooks_init(&cb, 128))) {
        rc = cli_lib_error("codebooks", st);
        goto done;
    }
    const export_options opt = {.bits = job->bits,
                                .kv_window = export_effective_kv_window(&cfg),
                                .tokenizer = job->tokenizer,
                                .tokenizer_size = job->tokenizer_size,
                                .tokenizer_pieces = tokenizer_pieces(job)};
    if ((st = export_build(&view.st, &cfg, &cb, &opt, &w)) || (st = cw_serialize(&w, image, size))) {
        rc = input_error(job->ckpt_path);
        goto done;
    }
    if ((st = cact_check_image(*image, *size))) {
        free(*image);
        *image = NULL;
        rc = cli_lib_error("the file to write does not load (nothing written)", st);
        goto done;
    }
    rc = 0;
done:
    cw_release(&w);
    lora_view_release(&view);
    st_release(&ck);
    free(ck_image);
    return rc;
}

/* Whether `image` is a checkpoint `needle finetune --full` or `needle calibrate` wrote: its
 * weights are what the build is for, so it is exported, not answered with a copy of the
 * base archive (the official build has no such checkpoint; its own are the base's). */
static int trained_here_image(const uint8_t *image, size_t size) {
    st_file f = {0};
    const int yes = st_parse(image, size, &f) == 0 &&
                    (lora_full_finetune_checkpoint(&f) || lora_calibrated_checkpoint(&f));
    st_release(&f);
    return yes;
}

/* checkpoint (+ adapter) -> merged view -> export (-> rung) -> checked image */
int build_image(const build_job *job, uint8_t **image, size_t *size) {
    if (job->generation == 2) return build_image_v2(job, image, size);
    size_t ck_size = job->ckpt_size;
    uint8_t *ck_read = job->ckpt_image ? NULL : cli_read_file(job->ckpt_path, &ck_size);
    const uint8_t *ck_image = job->ckpt_image ? job->ckpt_image : ck_read;
    if (!ck_image) return 1;
    char *config_json = NULL;
    st_file ck = {0};
    lora_view view = {0};
    cact_writer w, rung;
    cw_init(&w);
    cw_init(&rung);
    export3_config cfg;
    cq_codebooks cb;
    int dropped = 0, rc = 1, st;
    if ((st = st_parse(ck_image, ck_size, &ck)) ||
        (st = lora_checkpoint_config(&ck, job->ckpt_path, &config_json)) ||
        (st = export3_config_parse(config_json, strlen(config_json), &cfg)) ||
        (st = job->no_confidence ? lora_view_build_no_confidence(&ck, &view)
                              : lora_view_build(&ck, job->adapter, &view, &dropped))) {
        rc = input_error(job->ckpt_path);
        goto done;
    }
    if (job->adapter && !job->quiet)
        printf("  %-9s %u weight groups  scale %g\n", "merged", job->adapter->n, job->adapter->scale);
    if (dropped && !job->quiet)
        printf("  %-9s the confidence head; it is not trained locally, so confidence reports None\n", "dropped");
    /* finetune.rung: the built file is no ladder (its Hadamard permutations unsplit) */
    cfg.ladder_split = 0;
    const int cut = job->layers && job->layers != (long)cfg.num_layers;
    if (cut && !(job->layers >= 2 && job->layers < (long)cfg.num_layers)) {
        fprintf(stderr, "needle: --layers must be in [2, %u], got %ld\n", cfg.num_layers, job->layers);
        goto done;
    }
    if (cut && strstr(config_json, "\"ladder_order\":[]") == NULL) {
        fprintf(stderr, "needle: %s is itself a ladder rung (its config has a ladder_order); cutting it "
                "again is not supported (build from the full checkpoint)\n", job->ckpt_path);
        goto done;
    }
    if ((st = cq_codebooks_init(&cb, 128))) {
        rc = cli_lib_error("codebooks", st);
        goto done;
    }
    const uint32_t pieces = tokenizer_pieces(job);
    const export_options opt = {.bits = job->bits,
                                .kv_window = export3_effective_kv_window(&cfg),
                                .tokenizer = job->tokenizer,
                                .tokenizer_size = job->tokenizer_size,
                                .tokenizer_pieces = pieces};
    if ((st = export3_build(&view.st, &cfg, &cb, &opt, &w)) || (st = cw_serialize(&w, image, size))) {
        rc = input_error(job->ckpt_path);
        goto done;
    }
    if (cut) {
        cact_file full;
        if (!(st = cact_parse(*image, *size, &full))) {
            st = cact3_rung(&full, (uint32_t)job->layers, &rung);
            cact_release(&full);
        }
        free(*image);
        *image = NULL;
        if (!st) {
            rung.v3_header[3] = rung_kv_window(cfg, &rung);
            st = cw_serialize(&rung, image, size);
        }
        if (st) {
            rc = cli_lib_error("the ladder rung", st);
            goto done;
        }
    }
    if (!job->quiet) printf("  %-9s %ld layers\n", "depth", cut ? job->layers : (long)cfg.num_layers);
    if ((st = cact_check_image(*image, *size))) {
        free(*image);
        *image = NULL;
        rc = cli_lib_error("the file to write does not load (nothing written)", st);
        goto done;
    }
    rc = 0;
done:
    cw_release(&w);
    cw_release(&rung);
    lora_view_release(&view);
    st_release(&ck);
    free(config_json);
    free(ck_read);
    return rc;
}

static int run_build(const cli_command *self, int argc, char **argv) {
    const char *ckpt_path = NULL, *lora_path = NULL, *weights = NULL, *out_path = NULL, *bits = "4";
    const char *config_path = NULL;
    long layers = 0;
    int quiet = 0;
    const cli_option opts[] = {{"--lora", NULL, CLI_TEXT, &lora_path, 0, 0, NULL},
                               {"--config", NULL, CLI_TEXT, &config_path, 0, 0, NULL},
                               {"--layers", NULL, CLI_LONG, &layers, 2, CACT3_MAX_LAYERS, NULL},
                               {"--bits", "-b", CLI_TEXT, &bits, 0, 0, NULL},
                               {"--weights", "-w", CLI_TEXT, &weights, 0, 0, NULL},
                               {"--out", "-o", CLI_TEXT, &out_path, 0, 0, NULL},
                               {"--quiet", "-q", CLI_FLAG, &quiet, 0, 0, NULL},
                               {0}};
    int st = cli_parse(self, argc, argv, opts, &ckpt_path, 1);
    if (st != CLI_GO) return st;
    bits_map map;
    if (bits_map_parse(bits, &map)) return cli_usage_error(self, "--bits: %s", needle_last_error());
    if (ckpt_path && ends_with(ckpt_path, ".cact"))
        return cli_usage_error(self,
                               "%s is a .cact file; the build merges into and cuts the float checkpoint "
                               "(.safetensors), as the official build does: a .cact holds quantized weights, "
                               "and merging there would quantize twice. For a rung of a .cact use `needle "
                               "quantize FILE --depth N`",
                               ckpt_path);
    if (ckpt_path && !ends_with(ckpt_path, ".safetensors"))
        return cli_usage_error(self, "checkpoint must be a .safetensors file (got %s)", ckpt_path);
    if (!weights && !cli_default_weights(&weights) && !weights) return cli_no_weights();

    /* the base archive: its tokenizer, its depth, and the output when nothing changes */
    size_t base_size;
    uint8_t *base = cli_read_file(weights, &base_size);
    if (!base) return 1;
    cact_file bf;
    if ((st = cact_parse(base, base_size, &bf))) {
        free(base);
        return cli_lib_error(weights, st);
    }
    int rc = 1;
    train_adapter adapter;
    memset(&adapter, 0, sizeof adapter);
    uint8_t *image = NULL;
    size_t image_size = 0;
    char *config_json = NULL;
    uint8_t *ckpt = NULL; /* the checkpoint, when reading it decides between export and copy */
    size_t ckpt_size = 0;
    if (bf.generation != 3 && bf.generation != 2) {
        fprintf(stderr, "needle: %s is neither a Needle 2 nor a Needle 3 .cact\n", weights);
        goto done;
    }
    if (config_path && bf.generation != 2) {
        rc = cli_usage_error(self, "--config is for a Needle 2 checkpoint (a Needle 3 one has its config in its "
                             "metadata)");
        goto done;
    }
    size_t config_size = 0;
    if (config_path && !(config_json = (char *)cli_read_file(config_path, &config_size))) goto done;
    if (!quiet) printf("  %-9s %s  %.2f MB\n", "base", weights, (double)base_size / 1e6);
    const int nothing_to_merge = bf.generation == 3 && !lora_path && (!layers || layers == (long)bf.h3.num_layers);
    if (nothing_to_merge && ckpt_path && !(ckpt = cli_read_file(ckpt_path, &ckpt_size))) goto done;
    if (nothing_to_merge && !(ckpt && trained_here_image(ckpt, ckpt_size))) {
        /* as the official build: nothing to merge or cut, the output is the base archive */
        if (!out_path) {
            rc = cli_usage_error(self, "pass --out OUT.cact");
            goto done;
        }
        if (!(rc = cli_write_file_atomically(out_path, base, base_size)) && !quiet)
            printf("  %-9s %s  %.2f MB  the base archive\n", "wrote", out_path, (double)base_size / 1e6);
        goto done;
    }
    if (bf.tokenizer_index < 0) {
        fprintf(stderr, "needle: %s carries no tokenizer\n", weights);
        goto done;
    }
    if (lora_path) {
        if (!ends_with(lora_path, ".safetensors")) {
            rc = cli_usage_error(self, "adapter must be a .safetensors file (got %s)", lora_path);
            goto done;
        }
        if ((st = train_adapter_read(lora_path, &adapter))) {
            rc = input_error(lora_path);
            goto done;
        }
        if (adapter.languages) {
            fprintf(stderr, "needle: %s is a Whistle (speech) adapter, which needle build does not make\n", lora_path);
            goto done;
        }
        /* as the official build: without a checkpoint, the one the adapter was trained on */
        if (!ckpt_path && adapter.base && access(adapter.base, R_OK) == 0) ckpt_path = adapter.base;
    }
    /* the official default, finetune.DEFAULT_BASE (which it downloads when absent) */
    if (!ckpt_path && bf.generation == 3 && access("checkpoints/needle3.safetensors", R_OK) == 0)
        ckpt_path = "checkpoints/needle3.safetensors";
    if (!ckpt_path && bf.generation == 2) {
        rc = cli_usage_error(self, "which checkpoint? (%s is a Needle 2 base: give the Needle 2 checkpoint the "
                             "adapter was trained on; `needle finetune -w BASE.cact` writes it beside the "
                             "adapter as OUT.base.safetensors)", weights);
        goto done;
    }
    if (!ckpt_path) {
        rc = cli_usage_error(self, "which checkpoint? (the official Needle 3 .safetensors checkpoint: "
                             "`needle download checkpoints/needle3.safetensors` fetches it and prints its path)");
        goto done;
    }
    char default_out[4096];
    if (!out_path) {
        const char *slash = strrchr(ckpt_path, '/'), *name = slash ? slash + 1 : ckpt_path;
        const int n = (int)(strlen(name) - strlen(".safetensors"));
        snprintf(default_out, sizeof default_out, "%.*s.cact", n, name);
        out_path = default_out;
    }
    const cact_tensor *tok = &bf.tensors[bf.tokenizer_index];
    const build_job job = {.ckpt_path = ckpt_path,
                           .ckpt_image = ckpt,
                           .ckpt_size = ckpt_size,
                           .out_path = out_path,
                           .generation = bf.generation,
                           .config_json = config_json,
                           .adapter = lora_path ? &adapter : NULL,
                           .layers = layers,
                           .bits = &map,
                           .tokenizer = tok->data,
                           .tokenizer_size = (size_t)tok->nbytes,
                           .quiet = quiet};
    if (build_image(&job, &image, &image_size)) goto done;
    if (!(rc = cli_write_file_atomically(out_path, image, image_size)) && !quiet)
        printf("  %-9s %s  %.2f MB  W%sA8\n", "wrote", out_path, (double)image_size / 1e6, bits);
done:
    free(image);
    free(ckpt);
    free(config_json);
    train_adapter_release(&adapter);
    cact_release(&bf);
    free(base);
    return rc;
}

const cli_command cli_build = {
    "build", "merge a LoRA adapter into a Needle 2 or 3 checkpoint and write the .cact (official build)",
    "usage: needle build [CHECKPOINT.safetensors] [--lora ADAPTER.safetensors] [--layers N]\n"
    "                    [--weights BASE.cact] [--config CONFIG.json] [--bits 4] --out OUT.cact\n"
    "\n"
    "What the official `needle build` (cactus-needle 3.2.8) writes, byte for byte: the\n"
    "checkpoint (the official format: config and format_version in the safetensors\n"
    "metadata) with the adapter merged (W += scale * A @ B, in float32 as jax does it),\n"
    "cut to the N-layer ladder rung, quantized to CQ4, with the base archive's tokenizer\n"
    "and the KV-budget window. A merged adapter drops the confidence head (it is not\n"
    "trained by fine-tuning; confidence then reports None). With neither --lora nor\n"
    "--layers (or --layers equal to the base's depth) the output is a copy of the base\n"
    "archive, as the official build does, except from a checkpoint `needle finetune\n"
    "--full` wrote (ours; no official counterpart): that one is exported, without its\n"
    "confidence head (the trunk was trained, the head was not).\n"
    "\n"
    "Needle 2 (the base archive is a Needle 2 .cact, e.g. the demo model; 2.0.15's build):\n"
    "the checkpoint (config in its metadata, as `needle finetune -w` writes it, or --config)\n"
    "with the adapter merged, exported by `needle export`'s code (byte-identical to the\n"
    "official write_export) with the base's tokenizer and the KV-budget window capped by the\n"
    "config's kv_window; every head kept (2.0.15 drops none); no --layers.\n"
    "\n"
    "A .cact is not accepted as CHECKPOINT: the merge needs the float weights (merging\n"
    "into CQ weights would quantize twice); `needle quantize FILE --depth N` cuts a rung\n"
    "of a .cact.\n"
    "\n"
    "  CHECKPOINT              the float checkpoint (default: the adapter's base when\n"
    "                          that file exists, else checkpoints/needle3.safetensors)\n"
    "  --lora FILE             an adapter in the official format (needle finetune's)\n"
    "  --layers N              the depth-N rung of the ladder (2 .. the checkpoint's depth)\n"
    "  --config FILE           Needle 2: the TransformerConfig (JSON) of a checkpoint without\n"
    "                          `config` metadata\n"
    "  -w, --weights FILE      the base .cact whose tokenizer the output carries (the\n"
    "                          official build downloads the published needle3; default:\n"
    "                          $NEEDLE_MODEL, else the newest cached needle3)\n"
    "  -b, --bits MAP          weight widths (default 4, the official; 2, or a bits map as\n"
    "                          in `needle export`, have no official reference)\n"
    "  -o, --out FILE          the .cact to write (default: CHECKPOINT's name with .cact)\n"
    "  -q, --quiet             print nothing on success\n",
    run_build};
