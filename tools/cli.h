/* cli.h: what the `needle` commands share (tools/cli.c): the command table entry, a
 * table-driven option parser that knows --help, errors that point at `needle help CMD`,
 * the default model, session options, the clock and JSON string output.
 *
 * Every command lives in its own tools/<command>.c (a small group shares one: inspect +
 * tokenize, generate + logits, run + chat) and exports one `cli_command`; tools/needle.c
 * holds the table and dispatches. Commands use only the public header (needle.h).
 *
 * Exit status of every command: 0 success (and after --help), 1 a library, file or data
 * error (message on stderr), 2 bad usage (message on stderr naming what is wrong and the
 * `needle help CMD` to read). */
#ifndef NEEDLE_TOOLS_CLI_H
#define NEEDLE_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "needle.h"

typedef struct cli_command cli_command;
struct cli_command {
    const char *name;
    const char *summary; /* one line for `needle help` */
    const char *usage;   /* the full usage text: `needle help NAME`, `needle NAME --help` */
    /* argv[0] is "needle", argv[1] the command name; returns the exit status */
    int (*run)(const cli_command *self, int argc, char **argv);
};

/* The commands (each defined in its tools/<file>.c; tools/needle.c lists them). */
extern const cli_command cli_inspect, cli_tokenize, cli_generate, cli_logits, cli_run,
    cli_chat, cli_eval, cli_bench, cli_devices, cli_embed, cli_serve;
/* `needle export` / `needle quantize` (tools/export.c; they link the internal export
 * library, see the file's header) */
extern const cli_command cli_export, cli_quantize, cli_build, cli_encode_data;
/* `needle download` / `needle models` (tools/download.c; the hub client library, src/hub) */
extern const cli_command cli_download, cli_models;
/* `needle grad` (tools/grad.c; the training core library, src/train) */
extern const cli_command cli_grad;
/* `needle finetune` (tools/finetune.c; the training loop, src/train/trainer.h) */
extern const cli_command cli_finetune;
/* `needle calibrate` (tools/calibrate.c; the confidence head, src/train/conf_head.h) */
extern const cli_command cli_calibrate;

/* ---- options --------------------------------------------------------------------------- */

typedef enum cli_kind {
    CLI_FLAG,   /* int: set to 1 */
    CLI_TEXT,   /* const char *: the argument itself */
    CLI_LONG,   /* long in [lo, hi] */
    CLI_REAL,   /* double >= 0 */
    CLI_U64,    /* unsigned long long */
    CLI_KV,     /* int: NEEDLE_KV_F32 / F16 / INT8 from f32 / f16 / int8 */
} cli_kind;

typedef struct cli_option {
    const char *name;  /* "--weights" */
    const char *alias; /* "-w", or NULL */
    cli_kind kind;
    void *target;
    long lo, hi;       /* CLI_LONG bounds */
    int *given;        /* if not NULL, set to 1 when the option appears */
} cli_option;

/* Returned by cli_parse when the command should go on. */
#define CLI_GO (-1)

/* Exit statuses: 0 success, 1 a library error (message on stderr), 2 a usage error or no
 * model, 3 a turn that failed inside its envelope ("success": false, printed). */
#define CLI_EXIT_TURN_FAILED 3

/* Parses argv[2..argc) against `opts` (terminated by an entry with name NULL). -h and
 * --help print the command's usage on stdout. Arguments that are not options fill
 * positional[0..n_positional) in order; "--" ends the options; "-" alone is positional.
 * Returns CLI_GO, or the exit status to return at once: 0 after --help, 2 after a usage
 * error (an unknown option, a missing or bad value, one argument too many), reported by
 * cli_usage_error. */
int cli_parse(const cli_command *cmd, int argc, char **argv, const cli_option *opts,
              const char **positional, int n_positional);

/* Prints "needle CMD: <message> (see `needle help CMD`)" on stderr and returns 2. */
int cli_usage_error(const cli_command *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints "needle: <what>: <status>: <library message>" on stderr and returns 1. */
int cli_lib_error(const char *what, int status);

/* ---- the model ------------------------------------------------------------------------- */

/* The usage text's line for --weights, shared by every command that opens a model. */
#define CLI_WEIGHTS_HELP                                                                 \
    "  -w, --weights FILE      the .cact model (default: $NEEDLE_MODEL, else the newest\n" \
    "                          cached official needle3, else needle2 (`needle download`,\n" \
    "                          `needle models`), else the demo model)\n"

/* *weights, or the default model when it is NULL (needle_default_model_path). Returns 1
 * when the default was taken, 0 when *weights was given or no default exists (then
 * *weights stays NULL). On a terminal (stderr) it says which model was taken, and for
 * the demo model how to get the real one. */
int cli_default_weights(const char **weights);

/* 1 if path is the file of one of the demo-model paths (needle_default_model_candidate),
 * by any name. */
int cli_is_demo_model(const char *path);

/* Prints why no model could be found (for a missing --weights) and returns 2. */
int cli_no_weights(void);

/* ---- session options (generate, logits, run, chat) -------------------------------------- */

typedef struct cli_session_options {
    long window; /* -1: the file's kv_window */
    long n_ctx;  /* 0: the file's max_seq_len */
    long sinks;
    int kv_type;
    int a8; /* 1: W·A8 activations (needle_session_params.activations) */
} cli_session_options;

#define CLI_SESSION_OPTIONS_INIT {.window = -1}

/* The option table entries for *so, to put in a command's cli_option array. */
#define CLI_SESSION_OPTIONS(so)                                                   \
    {"--kv", NULL, CLI_KV, &(so)->kv_type, 0, 0, NULL},                            \
    {"--window", NULL, CLI_LONG, &(so)->window, 0, 1L << 24, NULL},                \
    {"--ctx", NULL, CLI_LONG, &(so)->n_ctx, 1, 1L << 24, NULL},                    \
    {"--sink", NULL, CLI_LONG, &(so)->sinks, 0, 1L << 24, NULL},                  \
    {"--a8", NULL, CLI_FLAG, &(so)->a8, 0, 0, NULL}

#define CLI_SESSION_OPTIONS_HELP                                                         \
    "  --kv f32|f16|int8       KV cache precision (default f32)\n"                       \
    "  --window N              sliding attention window (default: the file's kv_window;\n" \
    "                          0 = none)\n"                                              \
    "  --ctx N                 positions per conversation (default: the file's\n"       \
    "                          max_seq_len; run and chat with a window: unbounded)\n"    \
    "  --sink N                attention sinks kept at the start of the window\n"      \
    "  --a8                    W·A8: int8 activations at the QAT points, integer CQ\n"   \
    "                          products (default: float, or NEEDLE_A8=1)\n"

/* Creates a session with *so applied to the default parameters. Returns 0, or 1 after
 * printing the library's error. */
int cli_session_create(const needle_model *m, const cli_session_options *so,
                       needle_session **out);

/* ---- small shared pieces ----------------------------------------------------------------- */

/* Milliseconds on the monotonic clock (for durations only). */
/* The needle_callbacks.on_prefill of the commands: on a terminal stderr, a prompt of
 * CLI_PROGRESS_MIN_TOKENS or more shows "[prefill done/total tokens]", erased when done. */
#define CLI_PROGRESS_MIN_TOKENS 256u
int cli_prefill_progress(void *user, uint32_t done, uint32_t total);
/* Sets cli_prefill_progress as the session's prefill callback when stderr is a terminal. */
void cli_show_progress(needle_session *s);

double cli_now_ms(void);

/* Runs the executable `helper` (needle-download) in place of this process with the same
 * argv: the one beside this executable (/proc/self/exe, else argv[0] when it is a path),
 * else the one on PATH. Commands whose libraries should not load into every `needle`
 * run this way. Returns 1 after printing why, only on failure. */
int cli_exec_helper(const char *helper, const char *command, char **argv);

/* The sampling seed of a run: `seed` when --seed was given; with temperature > 0 and no
 * --seed, a fresh one (clock and process id), printed on stderr so the sample can be
 * repeated; with greedy decoding (temperature 0) the seed is unused and stays 0. */
unsigned long long cli_sampling_seed(unsigned long long seed, int seed_given,
                                     double temperature);

/* Writes s as a JSON string literal (quotes, backslashes and control bytes escaped). */
void cli_json_string(FILE *f, const char *s);

/* The whole file (pipes too: no seek) with a NUL after it that *size does not count, or
 * NULL after "needle: cannot open|read PATH" on stderr. */
uint8_t *cli_read_file(const char *path, size_t *size);

/* PATH written through a temporary beside it and a rename, so a failed write leaves the
 * old file (or none); 0, or 1 after a message. */
int cli_write_file_atomically(const char *path, const uint8_t *data, size_t size);

#endif
