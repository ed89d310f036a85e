/* finetune_data.c: `needle encode-data`, fine-tuning data (JSONL) -> the token ids and
 * loss masks the official fine-tuner trains on (src/train/finetune_data.h), one JSON line
 * per example, {"ids": [...], "mask": [...]}, every row the shared sequence length. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "train/finetune_data.h"
#include "util/platform.h"

typedef struct report_ctx {
    const char *path;
    int quiet;
    uint32_t shown;
} report_ctx;

static void on_report(void *user, uint32_t line, int severity, const char *msg) {
    report_ctx *r = user;
    if (r->quiet && severity != FT_ERROR) return;
    static const char *const kind[] = {"", "warning", "skipped", "error"};
    if (severity == FT_SKIPPED) msg += strncmp(msg, "skipped: ", 9) ? 0 : 9;
    fprintf(stderr, "%s:%u: %s: %s\n", r->path, line, kind[severity], msg);
    r->shown++;
}

static int run_encode_data(const cli_command *self, int argc, char **argv) {
    const char *data_path = NULL, *weights = NULL, *out_path = NULL;
    long max_len = 1024;
    int strict = 0, quiet = 0;
    const cli_option opts[] = {{"--weights", "-w", CLI_TEXT, &weights, 0, 0, NULL},
                               {"--max-len", NULL, CLI_LONG, &max_len, 2, 1L << 20, NULL},
                               {"--out", "-o", CLI_TEXT, &out_path, 0, 0, NULL},
                               {"--strict", NULL, CLI_FLAG, &strict, 0, 0, NULL},
                               {"--quiet", "-q", CLI_FLAG, &quiet, 0, 0, NULL},
                               {0}};
    int st = cli_parse(self, argc, argv, opts, &data_path, 1);
    if (st != CLI_GO) return st;
    if (!data_path) return cli_usage_error(self, "which data file? (JSON lines)");
    if (!out_path) return cli_usage_error(self, "--out FILE is required");
    if (!weights && !cli_default_weights(&weights) && !weights) return cli_no_weights();
    size_t size;
    char *text = (char *)cli_read_file(data_path, &size);
    if (!text) return 1;
    needle_model *m = NULL;
    if ((st = needle_model_open(weights, NULL, &m)) != NEEDLE_OK) {
        free(text);
        return cli_lib_error(weights, st);
    }
    report_ctx rc = {data_path, quiet, 0};
    ft_data d;
    st = ft_data_load(m, text, size, (uint32_t)max_len, on_report, &rc, &d);
    free(text);
    if (st) {
        needle_model_free(m);
        fprintf(stderr, "needle: %s: %s (nothing written)\n", data_path, needle_last_error());
        return 1;
    }
    int status = 0;
    if (!d.n) {
        fprintf(stderr, "needle: no usable examples in %s\n", data_path);
        status = 1;
    } else if (strict && (d.warnings || d.skipped)) {
        fprintf(stderr, "needle: --strict: %u warning(s), %u skipped line(s) (nothing written)\n", d.warnings,
                d.skipped);
        status = 1;
    }
    FILE *out = status ? NULL : platform_fopen(out_path, "w");
    if (!status && !out) {
        fprintf(stderr, "needle: cannot create %s: %s\n", out_path, strerror(errno));
        status = 1;
    }
    int32_t *ids = malloc((size_t)d.seq_len * sizeof *ids + 1);
    uint8_t *mask = malloc((size_t)d.seq_len + 1);
    for (uint32_t i = 0; out && ids && mask && i < d.n; i++) {
        ft_data_row(&d, i, ids, mask);
        fputs("{\"ids\": [", out);
        for (uint32_t k = 0; k < d.seq_len; k++) fprintf(out, k ? ", %d" : "%d", ids[k]);
        fputs("], \"mask\": [", out);
        for (uint32_t k = 0; k < d.seq_len; k++) fputs(k ? (mask[k] ? ", 1" : ", 0") : (mask[k] ? "1" : "0"), out);
        fputs("]}\n", out);
    }
    if (out && (!ids || !mask || ferror(out))) status = 1;
    if (out && fclose(out) != 0) status = 1;
    if (out && status) fprintf(stderr, "needle: cannot write %s\n", out_path);
    if (!status && !quiet)
        fprintf(stderr, "%u examples, sequence length %u (--max-len %ld), %u skipped line(s), %u warning(s) -> %s\n",
                d.n, d.seq_len, max_len, d.skipped, d.warnings, out_path);
    free(ids);
    free(mask);
    ft_data_free(&d);
    needle_model_free(m);
    return status;
}

const cli_command cli_encode_data = {
    "encode-data", "fine-tuning data (JSONL) -> token ids and loss masks, as the official fine-tuner",
    "usage: needle encode-data DATA.jsonl [--weights M.cact] [--max-len N] [--strict] --out B.jsonl\n"
    "\n"
    "Reads fine-tuning data as cactus-needle 3.2.8's `needle finetune` does and writes what\n"
    "it trains on, one JSON line per example: {\"ids\": [...], \"mask\": [...]}, every row the\n"
    "same length (the smallest power of two from 128 that holds the longest example,\n"
    "at most --max-len), PAD after the end; mask 1 on the target and EOS only. The\n"
    "input to `needle grad --batch`.\n"
    "\n"
    "A data line is {\"query\", \"tools\", \"answers\" (or \"function_calls\"), \"reasoning\"?,\n"
    "\"system\"?} or single-turn chat format ({\"messages\": [system?, user, assistant with\n"
    "tool_calls], \"tools\": OpenAI-form}); other chat lines are skipped. Reported on stderr\n"
    "as FILE:LINE: a line that is not JSON or cannot be rendered (an error: nothing is\n"
    "written), a skipped line, and what the official fine-tuner trains on unchecked (a\n"
    "warning; the example is kept): a call to a tool the line does not declare, calls\n"
    "the tools' schemas do not admit, an example longer than the sequence length (cut).\n"
    "\n"
    "  -w, --weights FILE      the model whose tokenizer encodes the data (default as in\n"
    "                          `needle run`)\n"
    "  --max-len N             the longest sequence (default 1024, the official)\n"
    "  --strict                refuse the data (exit 1) on any warning or skipped line\n"
    "  -o, --out FILE          where to write the rows, required\n"
    "  -q, --quiet             only errors on stderr\n",
    run_encode_data};
