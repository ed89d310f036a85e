/* export.c: `needle export` (a Needle 2 or 3 checkpoint -> .cact, byte-identical to the
 * official exporter) and `needle quantize` (a .cact re-quantized to another bits map, or a
 * Needle 3 ladder rung cut out as its own file).
 *
 * Unlike the other commands these use the exporter library needle_export (src/quant,
 * src/export), which is not part of libneedle: writing a model is a tool, not part of the
 * inference API in needle.h. Both commands check that the file they are about
 * to write parses with the engine's own loader before writing it, and write it through a
 * temporary file renamed into place, so a failed run never leaves a partial OUT. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "export/cact_write.h"
#include "export/export_model.h"
#include "export/export_model_v3.h"
#include "export/requantize.h"
#include "export/rung.h"
#include "export/spm_model.h"
#include "quant/bits_map.h"

/* ---- progress and reports ------------------------------------------------------------ */

typedef struct run_state {
    int tty;     /* draw a progress bar on stderr */
    double *rel; /* rel_error per record (-1 for non-CQ) */
    uint32_t n_rel, cap_rel;
} run_state;

static void on_tensor(void *user, uint32_t index, uint32_t count, const cw_tensor *t, double rel) {
    run_state *s = user;
    if (index >= s->cap_rel) {
        const uint32_t cap = s->cap_rel ? 2 * s->cap_rel : 512;
        double *r = realloc(s->rel, cap * sizeof *r);
        if (!r) return; /* the report loses the value; the export itself goes on */
        s->rel = r;
        s->cap_rel = cap;
    }
    s->rel[index] = rel;
    if (index + 1 > s->n_rel) s->n_rel = index + 1;
    if (s->tty) {
        const int width = 30, done = count ? (int)((uint64_t)(index + 1) * width / count) : width;
        fprintf(stderr, "\r[%.*s%*s] %u/%u %-24.24s", done, "==============================", width - done,
                "", index + 1, count, t->name);
        if (index + 1 == count) fputs("\r\033[K", stderr);
        fflush(stderr);
    }
}

static void print_summary(FILE *out, const cact_writer *w, const run_state *s, const char *path,
                          uint64_t bytes, const char *bits, int json, int table) {
    uint64_t qw = 0, qbits = 0;
    double worst = 0;
    const char *worst_name = "";
    for (uint32_t i = 0; i < w->n; i++) {
        const cw_tensor *t = &w->tensors[i];
        if (t->dtype != CACT_CQ) continue;
        const uint64_t n = (uint64_t)t->shape[0] * t->shape[1];
        qw += n;
        qbits += n * (t->bits == CQ_TERNARY ? 158 : 100 * t->bits);
        if (i < s->n_rel && s->rel[i] > worst) {
            worst = s->rel[i];
            worst_name = t->name;
        }
    }
    const double mean_bits = qw ? (double)qbits / 100.0 / (double)qw : 0.0;
    if (json) {
        fprintf(out, "{\"output\": ");
        cli_json_string(out, path);
        fprintf(out, ", \"bytes\": %llu, \"tensors\": %u, \"bits\": ", (unsigned long long)bytes, w->n);
        cli_json_string(out, bits);
        fprintf(out, ", \"kv_window\": %u, \"mean_weight_bits\": %.4f, \"cq\": [",
                w->v3 ? w->v3_header[3] : w->h.kv_window, mean_bits);
        int first = 1;
        for (uint32_t i = 0; i < w->n; i++) {
            const cw_tensor *t = &w->tensors[i];
            if (t->dtype != CACT_CQ) continue;
            fprintf(out,
                    "%s\n  {\"index\": %u, \"name\": \"%s\", \"shape\": [%u, %u], \"bits\": %s, "
                    "\"rel_error\": %.6g}",
                    first ? "" : ",", i, t->name, t->shape[0], t->shape[1], bits_map_width_name(t->bits),
                    i < s->n_rel ? s->rel[i] : -1.0);
            first = 0;
        }
        fprintf(out, "\n]}\n");
        return;
    }
    if (table) {
        fprintf(out, "%5s  %-24s %-13s %5s  %s\n", "index", "tensor", "shape", "bits", "rel. error");
        for (uint32_t i = 0; i < w->n; i++) {
            const cw_tensor *t = &w->tensors[i];
            if (t->dtype != CACT_CQ) continue;
            char shape[32];
            snprintf(shape, sizeof shape, "%ux%u", t->shape[0], t->shape[1]);
            fprintf(out, "%5u  %-24s %-13s %5s  %.4f\n", i, t->name, shape, bits_map_width_name(t->bits),
                    i < s->n_rel ? s->rel[i] : -1.0);
        }
    }
    fprintf(out,
            "wrote %s: %llu bytes, %u tensors, bits %s (%.3f bits per weight), kv_window %u; "
            "largest relative error %.4f (%s)\n",
            path, (unsigned long long)bytes, w->n, bits, mean_bits, w->v3 ? w->v3_header[3] : w->h.kv_window,
            worst, worst_name);
}

/* serializes, checks the image loads, writes it; returns the exit status */
static int finish(cact_writer *w, run_state *s, const char *out_path, const char *bits, int json, int table) {
    uint8_t *image;
    size_t size;
    int st = cw_serialize(w, &image, &size);
    if (st) return cli_lib_error("writing the file", st);
    st = cact_check_image(image, size);
    if (st) {
        free(image);
        return cli_lib_error("the file to write does not load (nothing written)", st);
    }
    const int rc = cli_write_file_atomically(out_path, image, size);
    free(image);
    if (!rc) print_summary(stdout, w, s, out_path, size, bits, json, table);
    return rc;
}

/* ---- needle export ------------------------------------------------------------------- */

static int run_export(const cli_command *self, int argc, char **argv) {
    const char *ckpt_path = NULL, *config_path = NULL, *bits = NULL, *tok_path = NULL, *out_path = NULL;
    long kv_window = -1;
    int json = 0, quiet = 0, v3 = 0;
    const cli_option opts[] = {{"--config", "-c", CLI_TEXT, &config_path, 0, 0, NULL},
                               {"--v3", NULL, CLI_FLAG, &v3, 0, 0, NULL},
                               {"--bits", "-b", CLI_TEXT, &bits, 0, 0, NULL},
                               {"--tokenizer", "-t", CLI_TEXT, &tok_path, 0, 0, NULL},
                               {"--kv-window", NULL, CLI_LONG, &kv_window, 0, 0xffffffffL, NULL},
                               {"--output", "-o", CLI_TEXT, &out_path, 0, 0, NULL},
                               {"--json", NULL, CLI_FLAG, &json, 0, 0, NULL},
                               {"--quiet", "-q", CLI_FLAG, &quiet, 0, 0, NULL},
                               {0}};
    int st = cli_parse(self, argc, argv, opts, &ckpt_path, 1);
    if (st != CLI_GO) return st;
    if (!ckpt_path) return cli_usage_error(self, "which checkpoint? (a .safetensors file)");
    if (!config_path)
        return cli_usage_error(self, "--config FILE is required (the TransformerConfig as JSON)");
    if (!out_path) return cli_usage_error(self, "-o OUT.cact is required");

    size_t cfg_size, ck_size, tok_size = 0;
    uint8_t *cfg_text = cli_read_file(config_path, &cfg_size);
    if (!cfg_text) return 1;
    export_config cfg;
    export3_config cfg3;
    st = v3 ? export3_config_parse((const char *)cfg_text, cfg_size, &cfg3)
            : export_config_parse((const char *)cfg_text, cfg_size, &cfg);
    free(cfg_text);
    if (st) return cli_lib_error(config_path, st);
    if (!bits) bits = !v3 && cfg.weight_bits[0] ? cfg.weight_bits : "4";
    bits_map map;
    if (bits_map_parse(bits, &map)) return cli_usage_error(self, "--bits: %s", needle_last_error());

    uint8_t *tok_model = NULL, *tok_blob = NULL;
    uint32_t pieces = 0;
    if (tok_path) {
        if (!(tok_model = cli_read_file(tok_path, &tok_size))) return 1;
        size_t blob_size;
        st = v3 ? spm_tokenizer_blob_v3(tok_model, tok_size, &tok_blob, &blob_size, &pieces)
                : spm_tokenizer_blob(tok_model, tok_size, &tok_blob, &blob_size, &pieces);
        free(tok_model);
        if (st) return cli_lib_error(tok_path, st);
        tok_size = blob_size;
    }
    uint8_t *ck_image = cli_read_file(ckpt_path, &ck_size);
    if (!ck_image) {
        free(tok_blob);
        return 1;
    }
    st_file ck;
    if ((st = st_parse(ck_image, ck_size, &ck))) {
        free(ck_image);
        free(tok_blob);
        return cli_lib_error(ckpt_path, st);
    }
    cq_codebooks cb;
    run_state rs = {.tty = !quiet && isatty(2)};
    cact_writer w;
    cw_init(&w);
    int rc = 1;
    if ((st = cq_codebooks_init(&cb, 128))) {
        rc = cli_lib_error("codebooks", st);
    } else {
        const uint32_t window = kv_window >= 0 ? (uint32_t)kv_window
                                : v3           ? export3_effective_kv_window(&cfg3)
                                               : export_effective_kv_window(&cfg);
        const export_options opt = {.bits = &map,
                                    .kv_window = window,
                                    .tokenizer = tok_blob,
                                    .tokenizer_size = tok_size,
                                    .tokenizer_pieces = pieces,
                                    .progress = on_tensor,
                                    .user = &rs};
        st = v3 ? export3_build(&ck, &cfg3, &cb, &opt, &w) : export_build(&ck, &cfg, &cb, &opt, &w);
        if (rs.tty) fputs("\r\033[K", stderr);
        rc = st ? cli_lib_error(ckpt_path, st) : finish(&w, &rs, out_path, bits, json, 0);
    }
    cw_release(&w);
    st_release(&ck);
    free(ck_image);
    free(tok_blob);
    free(rs.rel);
    return rc;
}

const cli_command cli_export = {
    "export", "write a .cact from a Needle 2 checkpoint (as the official exporter does)",
    "usage: needle export CHECKPOINT.safetensors --config CONFIG.json -o OUT.cact [options]\n"
    "\n"
    "Quantizes a Needle 2 checkpoint and writes the .cact file the official exporter\n"
    "(cactus-needle 2.0.15 write_export) writes for it, byte for byte.\n"
    "\n"
    "CHECKPOINT is the flax parameter tree as safetensors, tensor names the tree paths\n"
    "joined by '/' (embedding/embedding, stack/layers/block/self_attn/q_proj/kernel, ...),\n"
    "F32 (F16/BF16 accepted). train/checkpoint_to_safetensors.py converts a training\n"
    "pickle. CONFIG is the TransformerConfig as JSON (missing fields: the defaults).\n"
    "\n"
    "  -c, --config FILE       the model configuration (JSON), required\n"
    "  --v3                    a Needle 3 checkpoint and config: writes a v3 .cact as\n"
    "                          cactus-needle 3.2.8 does (identical at the default CQ4)\n"
    "  -b, --bits MAP          weight widths: a bits map like default=2,embedding=4,mhc_phi=4\n"
    "                          (longest prefix wins; widths 2, 3, 4, 1.58) or one width;\n"
    "                          default: the config's weight_bits, else 4\n"
    "  -t, --tokenizer FILE    SentencePiece .model to embed (its vocabulary must be the\n"
    "                          config's vocab_size); without it the file has no tokenizer\n"
    "  --kv-window N           the header's kv_window (default: the KV-budget window capped\n"
    "                          by the config's kv_window, as `needle build` writes)\n"
    "  -o, --output FILE       the .cact to write, required\n"
    "  --json                  a JSON summary on stdout (per CQ tensor: bits, error)\n"
    "  -q, --quiet             no progress bar\n",
    run_export};

/* ---- needle quantize ----------------------------------------------------------------- */

/* The depth-`depth` rung of `image` as a new .cact image (malloc'd). */
static int rung_image(const uint8_t *image, size_t size, uint32_t depth, uint8_t **out, size_t *out_size) {
    cact_file in;
    int st = cact_parse(image, size, &in);
    if (st) return st;
    cact_writer w;
    cw_init(&w);
    st = cact3_rung(&in, depth, &w);
    if (!st) st = cw_serialize(&w, out, out_size);
    cw_release(&w);
    cact_release(&in);
    return st;
}

static int run_quantize(const cli_command *self, int argc, char **argv) {
    const char *in_path = NULL, *bits = NULL, *out_path = NULL;
    long depth = 0;
    int json = 0, quiet = 0;
    const cli_option opts[] = {{"--bits", "-b", CLI_TEXT, &bits, 0, 0, NULL},
                               {"--depth", NULL, CLI_LONG, &depth, 2, CACT3_MAX_LAYERS, NULL},
                               {"--output", "-o", CLI_TEXT, &out_path, 0, 0, NULL},
                               {"--json", NULL, CLI_FLAG, &json, 0, 0, NULL},
                               {"--quiet", "-q", CLI_FLAG, &quiet, 0, 0, NULL},
                               {0}};
    int st = cli_parse(self, argc, argv, opts, &in_path, 1);
    if (st != CLI_GO) return st;
    if (!in_path) return cli_usage_error(self, "which .cact file?");
    if (!bits && !depth) return cli_usage_error(self, "--bits MAP or --depth N is required");
    if (!out_path) return cli_usage_error(self, "-o OUT.cact is required");
    bits_map map;
    if (bits && bits_map_parse(bits, &map)) return cli_usage_error(self, "--bits: %s", needle_last_error());
    size_t size;
    uint8_t *image = cli_read_file(in_path, &size);
    if (!image) return 1;
    if (depth) {
        uint8_t *rung;
        size_t rung_size;
        st = rung_image(image, size, (uint32_t)depth, &rung, &rung_size);
        free(image);
        if (st) return cli_lib_error(in_path, st);
        image = rung;
        size = rung_size;
    }
    run_state rs = {.tty = !quiet && isatty(2)};
    int rc;
    if (bits) {
        cact_writer w;
        cw_init(&w);
        st = cact_requantize_image(image, size, &map, on_tensor, &rs, &w);
        if (rs.tty) fputs("\r\033[K", stderr);
        rc = st ? cli_lib_error(in_path, st) : finish(&w, &rs, out_path, bits, json, 1);
        cw_release(&w);
    } else {
        /* the slice is the file: nothing re-quantized, so no error report */
        st = cact_check_image(image, size);
        rc = st ? cli_lib_error("the file to write does not load (nothing written)", st)
                : cli_write_file_atomically(out_path, image, size);
        if (!rc && json) {
            fputs("{\"output\": ", stdout);
            cli_json_string(stdout, out_path);
            printf(", \"bytes\": %zu, \"depth\": %ld}\n", size, depth);
        } else if (!rc) {
            printf("wrote %s: %zu bytes, the depth-%ld rung\n", out_path, size, depth);
        }
    }
    free(image);
    free(rs.rel);
    return rc;
}

const cli_command cli_quantize = {
    "quantize", "re-quantize a .cact to another bits map, with the error per tensor",
    "usage: needle quantize IN.cact [--bits MAP] [--depth N] -o OUT.cact [--json] [-q]\n"
    "\n"
    "Decodes every CQ tensor of IN as the official reader does and quantizes it again\n"
    "with the widths of MAP (as the official exporter would from those weights); FP16\n"
    "tensors, the probe heads and the tokenizer are copied. Prints each CQ tensor's\n"
    "relative error ||W_out - W_in|| / ||W_in|| against IN's weights.\n"
    "\n"
    "  -b, --bits MAP          default=2,embedding=4,mhc_phi=4 (longest prefix wins;\n"
    "                          widths 2, 3, 4, 1.58) or one width. Needle 3: the probe\n"
    "                          heads stay CQ4 (as the official exporter writes them)\n"
    "  --depth N               Needle 3: write the depth-N rung of IN's ladder as its own\n"
    "                          file, byte-identical to the official rung export (sliced,\n"
    "                          not re-quantized; with --bits, the rung is then re-quantized)\n"
    "  -o, --output FILE       the .cact to write, required\n"
    "  --json                  a JSON summary on stdout instead of the table\n"
    "  -q, --quiet             no progress bar\n",
    run_quantize};
