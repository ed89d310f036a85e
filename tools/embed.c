/* embed.c: `needle embed`: text embeddings from the model's retrieval (contrastive) head,
 * one JSON object per line. */
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "cli.h"
#include "compat.h"

static int print_embedding(needle_session *s, const char *text) {
    /* the width is the model's (128 for Needle 2; a Needle 3 head declares its own) */
    float e[NEEDLE_EMBEDDING_DIM], *out = e;
    size_t n = 0;
    int rc = needle_session_embed(s, text, e, NEEDLE_EMBEDDING_DIM, &n);
    if (rc == NEEDLE_ERR_BUFFER_TOO_SMALL && n > NEEDLE_EMBEDDING_DIM) {
        if (!(out = malloc(n * sizeof *out))) return cli_lib_error("embed", NEEDLE_ERR_OUT_OF_MEMORY);
        rc = needle_session_embed(s, text, out, n, &n);
    }
    if (rc) {
        if (out != e) free(out);
        return cli_lib_error("embed", rc);
    }
    fputs("{\"text\":", stdout);
    cli_json_string(stdout, text);
    fputs(",\"embedding\":[", stdout);
    for (size_t i = 0; i < n; i++) printf(i ? ",%.8g" : "%.8g", (double)out[i]);
    fputs("]}\n", stdout);
    if (out != e) free(out);
    return 0;
}

static int run_embed(const cli_command *self, int argc, char **argv) {
    const char *weights = NULL, *texts[64] = {0};
    cli_session_options so = CLI_SESSION_OPTIONS_INIT;
    const cli_option opts[] = {{"--weights", "-w", CLI_TEXT, &weights, 0, 0, NULL},
                               CLI_SESSION_OPTIONS(&so), {0}};
    const int st = cli_parse(self, argc, argv, opts, texts, 64);
    if (st != CLI_GO) return st;
    cli_default_weights(&weights);
    if (!weights) return cli_no_weights();
    needle_model *m;
    int rc = needle_model_open(weights, NULL, &m);
    if (rc) return cli_lib_error(weights, rc);
    needle_session *s = NULL;
    rc = cli_session_create(m, &so, &s);
    const int from_stdin = !texts[0] || (!strcmp(texts[0], "-") && !texts[1]);
    for (int i = 0; rc == 0 && !from_stdin && i < 64 && texts[i]; i++) rc = print_embedding(s, texts[i]);
    if (rc == 0 && from_stdin) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t got;
        while (rc == 0 && (got = getline(&line, &cap, stdin)) >= 0) {
            size_t n = (size_t)got;
            while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
            rc = print_embedding(s, line);
        }
        free(line);
    }
    fflush(stdout);
    needle_session_free(s);
    needle_model_free(m);
    return rc;
}

const cli_command cli_embed = {
    "embed", "text embeddings from the model's retrieval head (JSON lines)",
    "usage: needle embed [--weights FILE] [options] [TEXT...]\n"
    "\n"
    "Prints, for each TEXT (or, without one or with \"-\", each line of stdin), one line\n"
    "{\"text\": TEXT, \"embedding\": [128 numbers]}: the unit-length embedding of [BOS] +\n"
    "TEXT by the model's contrastive (retrieval) probe head; the dot product of two\n"
    "embeddings is their cosine similarity. Fails (exit 1) on a model without that head.\n"
    "At most 64 TEXT arguments.\n"
    "\n"
    "options:\n"
    CLI_WEIGHTS_HELP
    CLI_SESSION_OPTIONS_HELP
    "  -h, --help              this text\n",
    run_embed};
