/* needle: the command-line tool. This file holds the command table, `needle help` and
 * `needle version`; each command lives in its own file (see cli.h) and uses only the
 * public header.
 *
 *   needle help [COMMAND]       the commands, or one command's usage and options
 *   needle COMMAND --help       the same usage
 *   needle COMMAND [options]    run it: exit 0 success, 1 library/file/data error, 2 bad usage */
#include <stdio.h>
#include <string.h>

#include "chat_input.h"
#include "cli.h"
#include "util/platform.h"

static const cli_command cli_help, cli_version;

static const cli_command *const commands[] = {
    &cli_run, &cli_chat, &cli_eval, &cli_generate, &cli_logits, &cli_tokenize,
    &cli_inspect, &cli_bench, &cli_devices, &cli_embed, &cli_serve, &cli_export, &cli_quantize,
    &cli_build, &cli_encode_data, &cli_finetune, &cli_calibrate, &cli_download, &cli_models, &cli_grad, &cli_help, &cli_version,
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const cli_command *find_command(const char *name) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i]->name, name)) return commands[i];
    return NULL;
}

static void print_overview(FILE *f) {
    fputs("usage: needle COMMAND [options]\n\ncommands:\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    fputs("\n`needle help COMMAND` or `needle COMMAND --help` shows a command's options.\n"
          "Without --weights a command uses the default model: $NEEDLE_MODEL, else the\n"
          "newest cached official needle3, else needle2 (`needle download needle3` fetches\n"
          "it; `needle models` lists them), else the demo model (installed, or\n"
          "models/needle-demo.cact in the source tree).\n"
          "Exit status: 0 success, 1 a library, file or data error, 2 bad usage.\n",
          f);
}

/* Edit distance of two short words, for "did you mean". */
static size_t distance(const char *a, const char *b) {
    size_t row[32], la = strlen(a), lb = strlen(b);
    if (la >= 32 || lb >= 32) return 99;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            const size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static int unknown_command(const char *name) {
    fprintf(stderr, "needle: unknown command '%s'", name);
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (distance(name, commands[i]->name) <= 2) {
            fprintf(stderr, "; did you mean `needle %s`?", commands[i]->name);
            break;
        }
    fprintf(stderr, " (`needle help` lists the commands)\n");
    return 2;
}

static int run_help(const cli_command *self, int argc, char **argv) {
    const char *topic = NULL;
    const cli_option opts[] = {{0}};
    const int st = cli_parse(self, argc, argv, opts, &topic, 1);
    if (st != CLI_GO) return st;
    if (!topic) {
        print_overview(stdout);
        return 0;
    }
    const cli_command *c = find_command(topic);
    if (!c) return unknown_command(topic);
    fputs(c->usage, stdout);
    return 0;
}

static const cli_command cli_help = {
    "help", "the commands, or one command's usage: needle help COMMAND",
    "usage: needle help [COMMAND]\n"
    "\n"
    "Without COMMAND, lists the commands with one line each; with one, prints its usage\n"
    "and options (the same as `needle COMMAND --help`).\n",
    run_help};

static int run_version(const cli_command *self, int argc, char **argv) {
    const cli_option opts[] = {{0}};
    const int st = cli_parse(self, argc, argv, opts, NULL, 0);
    if (st != CLI_GO) return st;
    printf("needle %s\n", needle_version());
#ifndef NEEDLE_BUILD_TYPE
#define NEEDLE_BUILD_TYPE "unknown"
#endif
#ifndef NEEDLE_GIT_COMMIT
#define NEEDLE_GIT_COMMIT ""
#endif
#ifdef __VERSION__
    const char *compiler = __VERSION__;
#else
    const char *compiler = "unknown compiler";
#endif
    printf("build: %s, C compiler %s%s%s\n", NEEDLE_BUILD_TYPE, compiler,
           NEEDLE_GIT_COMMIT[0] ? ", configured at commit " : "", NEEDLE_GIT_COMMIT);
    printf("chat input: %s\n", chat_input_kind());
#ifdef NEEDLE_DOWNLOAD_EXEC
    printf("download: needle-download (libcurl)\n");
#else
    printf("download: cached models only (built without libcurl)\n");
#endif
    /* what this library can run on here: its backends that found a device */
    printf("devices:");
    const int n = needle_device_count();
    for (int i = 0; i < n; i++) {
        needle_device_info d = {.size = sizeof d};
        if (needle_device_get(i, &d) == NEEDLE_OK)
            printf("%s %s (%s)", i ? "," : "", d.backend, d.capability);
    }
    printf("\n");
    return 0;
}

static const cli_command cli_version = {
    "version", "the library version",
    "usage: needle version   (or needle --version)\n"
    "\n"
    "Prints the version of the needle library this tool is linked with, how it was\n"
    "built (and whether `needle chat` edits lines), and the devices its backends find\n"
    "here.\n",
    run_version};

int main(int argc, char **argv) {
    /* Windows: the arguments as UTF-8 (a path or query outside the ANSI code page) */
    if (platform_utf8_args(&argc, &argv) != 0) {
        fprintf(stderr, "needle: cannot read the command line: out of memory\n");
        return 1;
    }
    if (argc < 2) {
        print_overview(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "-h") || !strcmp(name, "--help")) name = "help";
    else if (!strcmp(name, "--version")) name = "version";
    const cli_command *c = find_command(name);
    if (!c) return unknown_command(name);
    return c->run(c, argc, argv);
}
