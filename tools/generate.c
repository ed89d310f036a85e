/* generate.c: the model as a plain language model, without tools: `needle generate`
 * (continue a prompt) and `needle logits` (every position's logits to a file, the form
 * the parity scripts compare). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "util/platform.h"

/* Prints each piece as it is decoded, so a long continuation shows up as it grows. */
static int print_piece(void *user, int32_t kind, int32_t token, const char *text, size_t len) {
    (void)user;
    (void)kind;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static int run_generate(const cli_command *self, int argc, char **argv) {
    const char *weights = NULL, *prompt = NULL, *text = NULL;
    long n_new = 32;
    double temperature = 0;
    unsigned long long seed = 0;
    int seed_given = 0;
    cli_session_options so = CLI_SESSION_OPTIONS_INIT;
    const cli_option opts[] = {
        {"--weights", "-w", CLI_TEXT, &weights, 0, 0, NULL},
        {"--prompt", "-p", CLI_TEXT, &prompt, 0, 0, NULL},
        {"--max-new-tokens", "-n", CLI_LONG, &n_new, 1, 1L << 24, NULL},
        {"--temperature", NULL, CLI_REAL, &temperature, 0, 0, NULL},
        {"--seed", NULL, CLI_U64, &seed, 0, 0, &seed_given},
        CLI_SESSION_OPTIONS(&so),
        {0}};
    const int st = cli_parse(self, argc, argv, opts, &text, 1);
    if (st != CLI_GO) return st;
    if (!prompt) prompt = text;
    if (!prompt) return cli_usage_error(self, "needs --prompt TEXT");
    cli_default_weights(&weights);
    if (!weights) return cli_no_weights();

    const double t0 = cli_now_ms();
    needle_model *m;
    int rc = needle_model_open(weights, NULL, &m);
    if (rc) return cli_lib_error(weights, rc);
    const double t_load = cli_now_ms() - t0;
    needle_session *s = NULL;
    if ((rc = cli_session_create(m, &so, &s))) {
        needle_model_free(m);
        return rc;
    }
    const size_t len = strlen(prompt);
    size_t n = 0;
    /* UTF-8 text never encodes to more ids than 4 per byte (byte fallback) */
    int32_t *ids = malloc((len + 2) * 4 * sizeof *ids);
    int32_t *gen = malloc(((size_t)n_new + 1) * sizeof *gen);
    if (!ids || !gen) { rc = NEEDLE_ERR_OUT_OF_MEMORY; goto done; }
    ids[0] = NEEDLE_TOKEN_BOS;
    rc = needle_tokenize(m, prompt, len, ids + 1, (len + 1) * 4, &n);
    if (rc) { cli_lib_error("tokenize", rc); goto done; }
    needle_generate_params gp = needle_generate_default_params();
    gp.max_new_tokens = (uint32_t)n_new;
    gp.temperature = (float)temperature;
    gp.seed = cli_sampling_seed(seed, seed_given, temperature);
    size_t n_gen = 0;
    needle_callbacks cb = {sizeof cb, NULL,
                           isatty(STDERR_FILENO) ? cli_prefill_progress : NULL, print_piece};
    needle_session_set_callbacks(s, &cb);
    const double t1 = cli_now_ms();
    rc = needle_session_generate(s, ids, n + 1, &gp, gen, (size_t)n_new + 1, &n_gen);
    const double t_gen = cli_now_ms() - t1;
    printf("\n");
    fflush(stdout);
    if (rc && rc != NEEDLE_ERR_BUFFER_TOO_SMALL) { cli_lib_error("generate", rc); goto done; }
    rc = NEEDLE_OK;
    fprintf(stderr, "[%zu prompt tokens, %zu generated; load %.1f ms, prefill+decode %.1f ms]\n",
            n + 1, n_gen, t_load, t_gen);
    fprintf(stderr, "ids:");
    for (size_t i = 0; i < n_gen; i++) fprintf(stderr, " %d", gen[i]);
    fprintf(stderr, "\n");
done:
    free(ids);
    free(gen);
    needle_session_free(s);
    needle_model_free(m);
    if (rc == NEEDLE_ERR_OUT_OF_MEMORY) fprintf(stderr, "needle: out of memory\n");
    return rc ? 1 : 0;
}

const cli_command cli_generate = {
    "generate", "continue a prompt, without tools",
    "usage: needle generate [--weights FILE] --prompt TEXT [options]\n"
    "       needle generate [--weights FILE] [options] TEXT\n"
    "\n"
    "Continues TEXT (BOS is prepended) as a plain language model: prints the generated\n"
    "text on stdout as it is decoded (the tokens' bytes, so invalid UTF-8 passes through\n"
    "as such), then timings and the generated ids on stderr. Greedy unless\n"
    "--temperature is above 0; the same --seed gives the same sample.\n"
    "\n"
    "options:\n"
    CLI_WEIGHTS_HELP
    "  -p, --prompt TEXT       the prompt (or give it as the argument)\n"
    "  -n, --max-new-tokens N  tokens to generate, at least 1 (default 32; fewer when\n"
    "                          EOS or the end of the context comes first)\n"
    "  --temperature T         sampling temperature (default 0: greedy)\n"
    "  --seed S                sampling seed (default: a fresh one, printed on stderr)\n"
    CLI_SESSION_OPTIONS_HELP
    "  -h, --help              this text\n",
    run_generate};

/* "2,17,99" -> ids; returns 0, or -1 on anything else (also an empty list). */
static int parse_token_list(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return -1;
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        const long v = strtol(p, &end, 10);
        if (errno || end == p || v < INT32_MIN || v > INT32_MAX) return -1;
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return *n ? 0 : -1;
}

static int write_logits(const char *path, const float *logits, size_t count) {
    FILE *f = platform_fopen(path, "wb");
    if (!f || fwrite(logits, sizeof *logits, count, f) != count) {
        fprintf(stderr, "needle: cannot write %s: %s\n", path, strerror(errno));
        if (f) fclose(f);
        return 1;
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "needle: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

static int run_logits(const cli_command *self, int argc, char **argv) {
    const char *weights = NULL, *tokens = NULL, *out = NULL;
    int incremental = 0;
    long depth = 0;
    cli_session_options so = CLI_SESSION_OPTIONS_INIT;
    const cli_option opts[] = {
        {"--weights", "-w", CLI_TEXT, &weights, 0, 0, NULL},
        {"--tokens", NULL, CLI_TEXT, &tokens, 0, 0, NULL},
        {"--out", "-o", CLI_TEXT, &out, 0, 0, NULL},
        {"--incremental", NULL, CLI_FLAG, &incremental, 0, 0, NULL},
        {"--depth", NULL, CLI_LONG, &depth, 0, 64, NULL},
        CLI_SESSION_OPTIONS(&so),
        {0}};
    const int st = cli_parse(self, argc, argv, opts, NULL, 0);
    if (st != CLI_GO) return st;
    if (!tokens || !out) return cli_usage_error(self, "needs --tokens IDS and --out FILE");
    int32_t *ids = NULL;
    size_t n = 0;
    if (parse_token_list(tokens, &ids, &n)) {
        free(ids);
        return cli_usage_error(self, "--tokens takes comma-separated integers, e.g. 2,17,99");
    }
    cli_default_weights(&weights);
    if (!weights) {
        free(ids);
        return cli_no_weights();
    }
    needle_model *m;
    needle_model_params mp = needle_model_default_params();
    mp.depth = (int32_t)depth;
    int rc = needle_model_open(weights, &mp, &m);
    if (rc) {
        free(ids);
        return cli_lib_error(weights, rc);
    }
    needle_session *s = NULL;
    float *logits = NULL;
    if ((rc = cli_session_create(m, &so, &s))) goto done;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    logits = malloc(n * info.vocab * sizeof *logits);
    if (!logits) { rc = cli_lib_error("logits", NEEDLE_ERR_OUT_OF_MEMORY); goto done; }
    if (incremental) {
        for (size_t i = 0; i < n && !rc; i++)
            rc = needle_session_eval(s, ids + i, 1, logits + i * info.vocab, info.vocab);
    } else {
        rc = needle_session_eval(s, ids, n, logits, n * info.vocab);
    }
    if (rc) { rc = cli_lib_error("eval", rc); goto done; }
    /* rows of the output head only: a Needle 3 file's ids past out_vocab are input-only */
    for (size_t i = 1; i < n; i++)
        memmove(logits + i * info.out_vocab, logits + i * info.vocab,
                info.out_vocab * sizeof *logits);
    if ((rc = write_logits(out, logits, n * info.out_vocab))) goto done;
    fprintf(stderr, "wrote %zu x %u float32 logits to %s\n", n, info.out_vocab, out);
done:
    free(ids);
    free(logits);
    needle_session_free(s);
    needle_model_free(m);
    return rc ? 1 : 0;
}

const cli_command cli_logits = {
    "logits", "float32 logits after every token, written to a file",
    "usage: needle logits [--weights FILE] --tokens IDS --out FILE [options]\n"
    "\n"
    "Evaluates the token ids IDS (comma-separated, e.g. 2,17,99; BOS is not added) and\n"
    "writes the logits after every position as float32 little-endian [n_tokens][vocab]\n"
    "(Needle 3: [n_tokens][out_vocab], the output head's rows).\n"
    "\n"
    "options:\n"
    CLI_WEIGHTS_HELP
    "  --tokens IDS            the token ids, comma-separated\n"
    "  -o, --out FILE          where to write the logits\n"
    "  --incremental           one token per step instead of one prefill over all\n"
    "  --depth N               Needle 3: run the N-layer rung of the file's ladder\n"
    CLI_SESSION_OPTIONS_HELP
    "  -h, --help              this text\n",
    run_logits};
