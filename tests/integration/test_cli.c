/* The `needle` command-line tool end to end (NEEDLE_CLI names the binary): inspect lists
 * every tensor, tokenize prints the library's ids, logits writes exactly the logits the
 * API computes (prefill and --incremental), generate is deterministic and equals the API's
 * greedy continuation, and bad usage or bad files give the documented exit codes. Help:
 * `needle help` lists every command; `needle CMD --help`, `-h` and `needle help CMD`
 * print the same usage on stdout with exit 0; every option a usage text documents is
 * one the command accepts; an unknown command or option exits 2 with a message that
 * names it and points at `needle help`. */
#include <ctype.h>
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "needle.h"

#ifndef NEEDLE_SOURCE_DIR
#define NEEDLE_SOURCE_DIR "."
#endif

static char model_path[1024];

static int pick_model(void) {
    glob_t g;
    char pattern[1100];
    snprintf(pattern, sizeof pattern, "%s/tiny_*.cact", fixture_dir());
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) return -1;
    snprintf(model_path, sizeof model_path, "%s", g.gl_pathv[0]);
    globfree(&g);
    return 0;
}

static void test_inspect(void) {
    static char out[1 << 17];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s inspect %s", cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK(strstr(out, "embedding") && strstr(out, "layer0.q_proj") && strstr(out, "final_norm"));
    CHECK(strstr(out, "tokenizer"));
    needle_model *m;
    CHECK_EQ_INT(needle_model_open(model_path, NULL, &m), NEEDLE_OK);
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    /* one listing line per tensor: the last index appears */
    char last[32];
    snprintf(last, sizeof last, "\n%5u  ", info.num_tensors - 1);
    CHECK(strstr(out, last) != NULL);
    needle_model_free(m);
}

static void test_tokenize_matches_library(void) {
    static char out[1 << 16];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s tokenize --weights %s 'Hello, world: {\"a\": 1}'", cli_path(),
             model_path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    needle_model *m;
    CHECK_EQ_INT(needle_model_open(model_path, NULL, &m), NEEDLE_OK);
    const char *text = "Hello, world: {\"a\": 1}";
    int32_t ids[256];
    size_t n = 0;
    CHECK_EQ_INT(needle_tokenize(m, text, strlen(text), ids, 256, &n), NEEDLE_OK);
    char expect[4096] = "ids: ";
    size_t len = strlen(expect);
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(expect + len, sizeof expect - len, i ? ",%d" : "%d", ids[i]);
    CHECK_MSG(strstr(out, expect) != NULL, "expected '%s' in:\n%s", expect, out);
    needle_model_free(m);
}

static void test_logits_match_library(void) {
    const int32_t tokens[] = {2, 17, 99, 5, 42, 300, 7};
    const size_t n = sizeof tokens / sizeof tokens[0];
    char path[] = "/tmp/needle_cli_logits_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    needle_model *m;
    CHECK_EQ_INT(needle_model_open(model_path, NULL, &m), NEEDLE_OK);
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    float *ref = malloc(n * info.vocab * sizeof *ref);
    needle_session *s;
    CHECK_EQ_INT(needle_session_create(m, NULL, &s), NEEDLE_OK);
    CHECK_EQ_INT(needle_session_eval(s, tokens, n, ref, n * info.vocab), NEEDLE_OK);
    needle_session_free(s);

    const char *modes[] = {"", " --incremental"};
    for (int k = 0; k < 2; k++) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "%s logits --weights %s --tokens 2,17,99,5,42,300,7 --out %s%s "
                 "2>/dev/null", cli_path(), model_path, path, modes[k]);
        CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
        size_t size = 0;
        float *got = (float *)read_file(path, &size);
        CHECK_EQ_INT(size, n * info.vocab * sizeof(float));
        if (got && size == n * info.vocab * sizeof(float)) {
            double worst = 0;
            for (size_t i = 0; i < n * info.vocab; i++) worst = fmax(worst, fabs(got[i] - ref[i]));
            CHECK_MSG(worst < 1e-4, "cli logits%s differ from the API by %g", modes[k], worst);
        }
        free(got);
    }
    unlink(path);
    free(ref);
    needle_model_free(m);
}

static void test_generate_deterministic(void) {
    static char a[8192], b[8192];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s generate --weights %s --prompt 'call the weather tool' -n 12 "
             "2>&1", cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, a, sizeof a), 0);
    CHECK_EQ_INT(run_command(cmd, b, sizeof b), 0);
    /* the ids line is printed on stderr and is timing-free */
    const char *ia = strstr(a, "ids:"), *ib = strstr(b, "ids:");
    CHECK(ia && ib && !strcmp(ia, ib));
    snprintf(cmd, sizeof cmd, "%s generate --weights %s --prompt 'x' -n 8 --temperature 0.8 "
             "--seed 7 2>&1", cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, a, sizeof a), 0);
    CHECK_EQ_INT(run_command(cmd, b, sizeof b), 0);
    ia = strstr(a, "ids:");
    ib = strstr(b, "ids:");
    CHECK(ia && ib && !strcmp(ia, ib));
}

static void test_errors_and_usage(void) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s 2>/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 2);
    snprintf(cmd, sizeof cmd, "%s frobnicate 2>/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 2);
    snprintf(cmd, sizeof cmd, "%s logits --weights %s --tokens 2,x --out /dev/null 2>/dev/null",
             cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 2);
    snprintf(cmd, sizeof cmd, "%s inspect /nonexistent.cact 2>/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 1);
    static char out[4096];
    snprintf(cmd, sizeof cmd, "%s inspect %s/README.md 2>&1", cli_path(), fixture_dir());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 1);
    CHECK(strstr(out, "tag") != NULL); /* the message says why */
    snprintf(cmd, sizeof cmd, "%s logits --weights %s --tokens 2,999999 --out /dev/null 2>&1",
             cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 1);
    CHECK(strstr(out, "999999") != NULL);
}

/* Every command the CLI has; `needle help` must list exactly these. */
static const char *const COMMANDS[] = {"run",     "chat",    "eval",   "generate",
                                       "logits",  "tokenize", "inspect", "bench",
                                       "devices", "embed",   "serve",   "help",    "version", "export", "quantize",
                                       "download", "models",  "grad", "build", "encode-data", "finetune",
                                       "calibrate"};
#define N_COMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])

/* The line after `line`, or NULL after the last one. */
static const char *next_line(const char *line) {
    const char *nl = strchr(line, '\n');
    return nl ? nl + 1 : NULL;
}

static void test_help_lists_every_command(void) {
    static char out[1 << 14];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s help", cli_path());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    /* each command on its own line: "  NAME   summary" */
    int listed = 0;
    for (const char *line = out; line && *line; line = next_line(line)) {
        if (strncmp(line, "  ", 2) || !islower((unsigned char)line[2])) continue;
        size_t len = strcspn(line + 2, " \n");
        int known = 0;
        for (size_t i = 0; i < N_COMMANDS; i++)
            known |= strlen(COMMANDS[i]) == len && !strncmp(line + 2, COMMANDS[i], len);
        CHECK_MSG(known, "`needle help` lists an unknown command: %.*s", (int)len, line + 2);
        listed++;
        CHECK_MSG(line[2 + len] == ' ', "command %.*s has no summary", (int)len, line + 2);
    }
    CHECK_EQ_INT(listed, N_COMMANDS);
    /* --help, -h and no command at all show the same list (the last on stderr, exit 2) */
    static char other[1 << 14];
    snprintf(cmd, sizeof cmd, "%s --help", cli_path());
    CHECK_EQ_INT(run_command(cmd, other, sizeof other), 0);
    CHECK(!strcmp(out, other));
    snprintf(cmd, sizeof cmd, "%s -h", cli_path());
    CHECK_EQ_INT(run_command(cmd, other, sizeof other), 0);
    CHECK(!strcmp(out, other));
    snprintf(cmd, sizeof cmd, "%s 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, other, sizeof other), 2);
    CHECK(!strcmp(out, other));
}

/* The options a usage text documents: the leading words of its "  -x, --name VALUE"
 * lines, -h/--help left out. Returns how many were stored. */
static int documented_options(const char *usage, char names[][40], int cap) {
    int n = 0;
    for (const char *line = usage; line && *line; line = next_line(line)) {
        if (strncmp(line, "  -", 3)) continue;
        const char *p = line + 2, *end = strstr(p, "  ");
        const char *eol = strchr(p, '\n');
        if (!end || (eol && eol < end)) end = eol ? eol : p + strlen(p);
        while (p < end) {
            size_t len = strcspn(p, " ,\n");
            if (p + len > end) len = (size_t)(end - p);
            if (*p == '-' && len < 40 && n < cap && strncmp(p, "-h", len) &&
                strncmp(p, "--help", len)) {
                memcpy(names[n], p, len);
                names[n++][len] = 0;
            }
            p += len;
            while (p < end && (*p == ' ' || *p == ',')) p++;
        }
    }
    return n;
}

static void test_every_command_has_help(void) {
    static char help[1 << 14], dash[1 << 14], err[1 << 14];
    char cmd[2048];
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const char *c = COMMANDS[i];
        snprintf(cmd, sizeof cmd, "%s %s --help </dev/null", cli_path(), c);
        CHECK_EQ_INT(run_command(cmd, dash, sizeof dash), 0);
        char want[64];
        snprintf(want, sizeof want, "usage: needle %s", c);
        CHECK_MSG(!strncmp(dash, want, strlen(want)), "`needle %s --help` printed:\n%s", c, dash);
        snprintf(cmd, sizeof cmd, "%s help %s", cli_path(), c);
        CHECK_EQ_INT(run_command(cmd, help, sizeof help), 0);
        CHECK_MSG(!strcmp(help, dash), "`needle help %s` differs from `needle %s --help`", c, c);
        snprintf(cmd, sizeof cmd, "%s %s -h </dev/null", cli_path(), c);
        CHECK_EQ_INT(run_command(cmd, dash, sizeof dash), 0);
        CHECK(!strcmp(help, dash));

        /* every documented option is accepted: followed by an unknown one, a flag lets the
         * parser reach that one, an option with a value takes it as its value; either way
         * the documented option itself is never the one reported unknown (a model that
         * does not exist keeps a command that gets that far from running) */
        char names[32][40];
        const int n = documented_options(help, names, 32);
        for (int k = 0; k < n; k++) {
            snprintf(cmd, sizeof cmd,
                     "NEEDLE_MODEL=/nonexistent.cact %s %s %s --no-such-option </dev/null "
                     "2>&1 >/dev/null", cli_path(), c, names[k]);
            CHECK(run_command(cmd, err, sizeof err) >= 0);
            char bad[64];
            snprintf(bad, sizeof bad, "unknown option '%.39s'", names[k]);
            CHECK_MSG(!strstr(err, bad), "`needle %s` documents %s but refuses it: %s", c,
                      names[k], err);
        }
    }
    /* the options of one command, read back from its help */
    char names[32][40];
    snprintf(cmd, sizeof cmd, "%s help bench", cli_path());
    CHECK_EQ_INT(run_command(cmd, help, sizeof help), 0);
    const int n = documented_options(help, names, 32);
    const char *bench[] = {"-w", "--weights", "--prompt-len", "-n", "--gen", "--threads",
                           "--runs", "--json", "--kv"};
    CHECK_EQ_INT(n, 9);
    for (int k = 0; k < n && k < 9; k++) CHECK_MSG(!strcmp(names[k], bench[k]), "%s", names[k]);
}

static void test_unknown_command_and_options(void) {
    static char err[1 << 14];
    char cmd[2048];
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const char *c = COMMANDS[i];
        snprintf(cmd, sizeof cmd, "%s %s --frobnicate </dev/null 2>&1 >/dev/null", cli_path(), c);
        CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2);
        char want[64];
        snprintf(want, sizeof want, "`needle help %s`", c);
        CHECK_MSG(strstr(err, "'--frobnicate'") && strstr(err, want), "`needle %s --frobnicate`: %s",
                  c, err);
    }
    snprintf(cmd, sizeof cmd, "%s frobnicate 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "'frobnicate'") && strstr(err, "`needle help`"), "%s", err);
    snprintf(cmd, sizeof cmd, "%s benhc 2>&1 >/dev/null", cli_path()); /* a typo */
    CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "`needle bench`") != NULL, "%s", err);
    snprintf(cmd, sizeof cmd, "%s help frobnicate 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2);
    CHECK(strstr(err, "'frobnicate'") != NULL);
    /* a missing value, a bad value, one argument too many: named, exit 2 */
    snprintf(cmd, sizeof cmd, "%s bench --runs 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "--runs needs a value") != NULL, "%s", err);
    snprintf(cmd, sizeof cmd, "%s bench --runs 0 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "--runs") && strstr(err, "'0'"), "%s", err);
    snprintf(cmd, sizeof cmd, "%s generate --kv f8 x 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "--kv") && strstr(err, "'f8'"), "%s", err);
    snprintf(cmd, sizeof cmd, "%s generate --temperature -1 x 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2);
    snprintf(cmd, sizeof cmd, "%s tokenize one two 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "'two'") != NULL, "%s", err);
    snprintf(cmd, sizeof cmd, "%s run --weights %s 2>&1 >/dev/null", cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, err, sizeof err), 2); /* no QUERY, no --tools */
}

static void test_fixture_present(void) {
    CHECK_MSG(pick_model() == 0, "no tiny_*.cact fixture in %s", fixture_dir());
}

/* Under an emulator (the aarch64 suite under qemu) the demo model's tools prefix takes
 * minutes per CLI run; the tests that need it run in every native build instead. */
static int skip_demo_when_emulated(void) {
    if (!getenv("NEEDLE_EMULATED")) return 0;
    harness_skip("the demo model under emulation is slow; covered by the native builds");
    return 1;
}

/* `needle run` on the demo model (the default): a turn whose envelope says
 * "success": false exits 3, a successful one 0; with no model found the message says so
 * and names where it looked, instead of asking for --tools. */
static void test_run_exit_status_and_missing_model(void) {
    if (skip_demo_when_emulated()) return;
    char cmd[2048];
    static char out[65536];
    const char *demo = NEEDLE_SOURCE_DIR "/models/needle-demo.cact";
    snprintf(cmd, sizeof cmd, "%s run --weights %s --tools %s/models/needle-demo.tools.json "
             "-n 2 'Set a timer for 25 minutes'", cli_path(), demo, NEEDLE_SOURCE_DIR);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 3);
    CHECK_MSG(strstr(out, "\"success\":false") && strstr(out, "\"max_tokens\""),
              "the failed envelope is still printed: %s", out);
    snprintf(cmd, sizeof cmd, "%s run --weights %s --tools %s/models/needle-demo.tools.json "
             "'Set a timer for 25 minutes'", cli_path(), demo, NEEDLE_SOURCE_DIR);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "\"success\":true"), "%s", out);
    snprintf(cmd, sizeof cmd, "NEEDLE_MODEL=/nonexistent/m.cact %s run 'hi' 2>&1", cli_path());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 2);
    CHECK_MSG(strstr(out, "no model found") && strstr(out, "/nonexistent/m.cact") &&
                  !strstr(out, "--tools TOOLS is required"),
              "%s", out);
}

/* The demo model named with --weights (a relative path here) brings its own tool list
 * (models/needle-demo.tools.json), as when it is the default; another model still needs
 * --tools. */
static void test_run_demo_weights_use_demo_tools(void) {
    if (skip_demo_when_emulated()) return;
    char cmd[2048];
    static char out[65536];
    snprintf(cmd, sizeof cmd, "cd %s && %s run --weights models/needle-demo.cact "
             "'Set a timer for 25 minutes'", NEEDLE_SOURCE_DIR, cli_path());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "\"set_timer\"") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd, "%s run --weights %s 'hi' 2>&1", cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 2);
    CHECK_MSG(strstr(out, "--tools TOOLS is required") != NULL, "%s", out);
}

/* --tools takes one tool object as well as a list, skips a UTF-8 byte order mark in a
 * file, and says a directory is a directory (it said "malformed JSON"). */
static void test_run_tools_forms(void) {
    if (skip_demo_when_emulated()) return;
    char cmd[2048], path[256];
    static char out[65536];
    snprintf(path, sizeof path, "/tmp/needle_test_tools_%d.json", (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs("\xEF\xBB\xBF {\"name\":\"set_timer\",\"description\":\"Start a timer\",\"parameters\":"
          "{\"type\":\"object\",\"properties\":{\"minutes\":{\"type\":\"integer\"}},"
          "\"required\":[\"minutes\"]}}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s run --weights %s/models/needle-demo.cact --tools %s "
             "'Set a timer for 25 minutes'", cli_path(), NEEDLE_SOURCE_DIR, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "\"set_timer\"") != NULL, "%s", out); /* one tool: extraction */
    remove(path);
    snprintf(cmd, sizeof cmd, "%s run --weights %s --tools %s 'hi' 2>&1", cli_path(), model_path,
             fixture_dir());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 1);
    CHECK_MSG(strstr(out, "is a directory") != NULL, "%s", out);
}

/* Sampling without --seed draws a fresh seed and says which; --seed repeats a sample; an
 * empty query and -n 0 are usage errors (an empty query used to be answered with a call,
 * and -n 0 meant 1 token in generate and 256 in run). */
static void test_seed_budget_and_empty_query(void) {
    char cmd[2048];
    static char a[65536], b[65536];
    snprintf(cmd, sizeof cmd, "%s generate --weights %s -n 8 --temperature 0.9 Hello 2>&1 "
             ">/dev/null", cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, a, sizeof a), 0);
    const char *said = strstr(a, "[sampling with --seed ");
    CHECK_MSG(said != NULL, "%s", a);
    if (said) {
        const unsigned long long seed = strtoull(said + strlen("[sampling with --seed "), NULL, 10);
        snprintf(cmd, sizeof cmd, "%s generate --weights %s -n 8 --temperature 0.9 --seed %llu "
                 "Hello 2>/dev/null", cli_path(), model_path, seed);
        CHECK_EQ_INT(run_command(cmd, a, sizeof a), 0);
        CHECK_EQ_INT(run_command(cmd, b, sizeof b), 0);
        CHECK(!strcmp(a, b));
    }
    snprintf(cmd, sizeof cmd, "%s generate --weights %s -n 4 Hello 2>&1", cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, a, sizeof a), 0);
    CHECK_MSG(!strstr(a, "sampling with"), "greedy needs no seed: %s", a);
    const char *bad[] = {"generate -n 0 Hello", "run -n 0 hi", "run ''", "run '  '"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --weights %s 2>&1", cli_path(), bad[i], model_path);
        CHECK_MSG(run_command(cmd, a, sizeof a) == 2, "%s: %s", bad[i], a);
    }
}

/* needle chat: /help and unknown commands stay out of the conversation, the prompt says
 * whether a query or a tool result is expected, /query alone goes back to queries, and a
 * line longer than 64 KiB is one turn (it used to be cut into several). */
static void test_chat_commands_and_modes(void) {
    if (skip_demo_when_emulated()) return;
    char cmd[4096], path[256];
    static char out[1 << 17], err[1 << 16];
    snprintf(path, sizeof path, "/tmp/needle_test_chat_%d.txt", (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs("/help\n/bogus\nSet a timer for 25 minutes\n{\"ok\": true}\n/query\n", f);
    for (int i = 0; i < 7000; i++) fputs("timer ten ", f); /* ~70 KB, one query */
    fputs("\n/quit\nthis line is never read\n", f); /* (over the context: one failed turn) */
    fclose(f);
    const char *demo = NEEDLE_SOURCE_DIR "/models/needle-demo";
    snprintf(cmd, sizeof cmd, "%s chat --weights %s.cact --tools %s.tools.json --ctx 4096 "
             "< %s 2>%s.err", cli_path(), demo, demo, path, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    int envelopes = 0;
    for (const char *p = out; (p = strstr(p, "{\"type\":")); p++) envelopes++;
    CHECK_MSG(envelopes == 3, "3 turns expected, got %d: %.300s", envelopes, out);
    CHECK_MSG(strstr(out, "\"context_full\"") != NULL, "the long line: %.300s", out);
    char err_path[300];
    snprintf(err_path, sizeof err_path, "%s.err", path);
    size_t n = 0;
    uint8_t *e = read_file(err_path, &n);
    snprintf(err, sizeof err, "%s", e ? (const char *)e : "");
    free(e);
    CHECK_MSG(strstr(err, "/result JSON") != NULL, "no /help text: %s", err);
    CHECK_MSG(strstr(err, "unknown command /bogus") != NULL, "%s", err);
    CHECK_MSG(strstr(err, "result> ") != NULL, "no result prompt after a call: %s", err);
    remove(path);
    remove(err_path);
}

/* needle chat after a call: a JSON line is the tool's result, any other line a new query
 * (chat says so), where it used to be taken as the result whatever it was. */
static void test_chat_tells_a_result_from_a_query(void) {
    if (skip_demo_when_emulated()) return;
    char cmd[4096], path[256];
    static char out[1 << 16], err[1 << 14];
    snprintf(path, sizeof path, "/tmp/needle_test_chat2_%d.txt", (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs("Set a timer for 25 minutes\nWhat's the weather in Paris?\n"
          "{\"temp_c\": 24, \"sky\": \"sunny\"}\n", f);
    fclose(f);
    const char *demo = NEEDLE_SOURCE_DIR "/models/needle-demo";
    snprintf(cmd, sizeof cmd, "%s chat --weights %s.cact --tools %s.tools.json --ctx 4096 "
             "< %s 2>%s.err", cli_path(), demo, demo, path, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    char err_path[300];
    snprintf(err_path, sizeof err_path, "%s.err", path);
    size_t n = 0;
    uint8_t *e = read_file(err_path, &n);
    snprintf(err, sizeof err, "%s", e ? (const char *)e : "");
    free(e);
    /* the question after the timer call is a query: answered by a get_weather call */
    const char *second = strstr(out, "{\"type\":");
    second = second ? strstr(second + 1, "{\"type\":") : NULL;
    CHECK_MSG(second && strstr(second, "\"get_weather\"") && strstr(second, "Paris"),
              "the second line was not a query: %.600s", out);
    const char *note = strstr(err, "not JSON, so not a tool result: sent as a new query");
    CHECK_MSG(note != NULL, "chat did not say so: %s", err);
    CHECK_MSG(note && !strstr(note + 1, "not JSON, so not a tool result"),
              "the JSON result was taken as a query too: %s", err);
    int envelopes = 0;
    for (const char *p = out; (p = strstr(p, "{\"type\":")); p++) envelopes++;
    CHECK_EQ_INT(envelopes, 3);
    remove(path);
    remove(err_path);
}

/* needle --version: the library version, how the tool was built, the devices found. */
static void test_version_build_info(void) {
    char cmd[1024];
    static char out[8192];
    snprintf(cmd, sizeof cmd, "%s --version", cli_path());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    char first[64];
    snprintf(first, sizeof first, "needle %s\n", needle_version());
    CHECK_MSG(!strncmp(out, first, strlen(first)), "%s", out);
    CHECK_MSG(strstr(out, "\nbuild: ") != NULL, "%s", out);
    const char *devices = strstr(out, "\ndevices: ");
    CHECK_MSG(devices && strstr(devices, " cpu ("), "the CPU is always a device: %s", out);
}

/* `needle serve` runs the needle-serve executable beside needle, so that needle itself
 * never loads libmicrohttpd (with its TLS chain, ~3 MB resident in every command): the
 * dynamic loader's log (glibc's LD_DEBUG=libs) names it for needle-serve only, and a needle
 * without its needle-serve says so and exits 1 instead of serving. */
static void test_serve_is_its_own_executable(void) {
    char helper[1100], cmd[4096];
    snprintf(helper, sizeof helper, "%s-serve", cli_path());
    if (access(helper, X_OK) != 0) {
        harness_skip("no needle-serve beside needle (built without libmicrohttpd)");
        return;
    }
    static char out[65536];
    snprintf(cmd, sizeof cmd, "LD_DEBUG=libs %s --help 2>&1 >/dev/null", helper);
    run_command(cmd, out, sizeof out);
    if (!strstr(out, "find library=")) {
        harness_skip("the dynamic loader has no LD_DEBUG=libs log (not glibc)");
        return;
    }
    CHECK_MSG(strstr(out, "libmicrohttpd") != NULL, "needle-serve: %.2000s", out);
    snprintf(cmd, sizeof cmd, "LD_DEBUG=libs %s version 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "libmicrohttpd") == NULL, "needle loads it: %.2000s", out);

    /* a model that does not exist: a needle that served by itself would fail on it at once
     * (rather than listen forever), with a message that does not name needle-serve */
    char dir[] = "/tmp/needle_lone_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK_MSG(0, "mkdtemp failed");
        return;
    }
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/needle' && '%s/needle' serve --port 0 -w /nonexistent.cact "
             "2>&1", cli_path(), dir, dir);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 1);
    CHECK_MSG(strstr(out, "needle-serve") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ_INT(run_command(cmd, NULL, 0), 0);
}

/* `needle download` runs the needle-download executable beside needle, which alone links
 * libcurl (and its TLS chain): as for needle-serve, the loader's log names libcurl for
 * needle-download only. */
static void test_download_is_its_own_executable(void) {
    char helper[1100], cmd[4096];
    static char out[65536];
    snprintf(helper, sizeof helper, "%s-download", cli_path());
    snprintf(cmd, sizeof cmd, "%s version", cli_path());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    if (access(helper, X_OK) != 0) {
        CHECK_MSG(strstr(out, "download: cached models only") != NULL, "%s", out);
        harness_skip("no needle-download beside needle (built without libcurl)");
        return;
    }
    CHECK_MSG(strstr(out, "download: needle-download (libcurl)") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd, "LD_DEBUG=libs %s --help 2>&1 >/dev/null", helper);
    run_command(cmd, out, sizeof out);
    if (!strstr(out, "find library=")) {
        harness_skip("the dynamic loader has no LD_DEBUG=libs log (not glibc)");
        return;
    }
    CHECK_MSG(strstr(out, "libcurl") != NULL, "needle-download: %.2000s", out);
    snprintf(cmd, sizeof cmd, "LD_DEBUG=libs %s models 2>&1 >/dev/null", cli_path());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "libcurl") == NULL, "needle loads it: %.2000s", out);
    /* needle download reaches it: its usage comes back through needle */
    snprintf(cmd, sizeof cmd, "%s download --help", cli_path());
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "usage: needle download SPEC") != NULL, "%s", out);
}

/* The JSON field `key` of `json` as a number, or -1 when missing. */
static double json_number(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *at = strstr(json, pat);
    return at ? strtod(at + strlen(pat), NULL) : -1.0;
}

/* `needle bench` measures the FMA peak on the threads it was given and reports the
 * achieved GFLOP/s of both phases (their size is machine-dependent: only present and
 * positive is checked). */
static void test_bench_reports_peak_and_gflops(void) {
    static char out[1 << 14];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s bench --weights %s --prompt-len 6 --gen 3 --runs 1 --threads 2 --json",
             cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(json_number(out, "threads_used") == 2.0, "%s", out);
    const char *keys[] = {"fma_peak_gflops", "fma_peak_1t_gflops", "prefill_gflops", "decode_gflops"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        CHECK_MSG(json_number(out, keys[i]) > 0.0, "%s missing or not positive: %s", keys[i], out);
    CHECK_MSG(strstr(out, "\"matmul_gflops\":[") && strstr(out, "\"attention_gflops\":["), "%s", out);
    /* the peak names its ISA; an AVX2 peak, where there is one, is at most the ISA's
     * (both measured as the best of several tries: allow a little noise) */
    CHECK_MSG(strstr(out, "\"fma_peak_isa\":\"AVX-512F\"") || strstr(out, "\"fma_peak_isa\":\"AVX2+FMA\"") ||
                  strstr(out, "\"fma_peak_isa\":\"NEON\"") || strstr(out, "\"fma_peak_isa\":\"scalar\""),
              "%s", out);
    CHECK_MSG(json_number(out, "fma_peak_avx2_gflops") >= 0.0, "%s", out);
    CHECK_MSG(json_number(out, "fma_peak_avx2_gflops") <= 1.25 * json_number(out, "fma_peak_gflops"),
              "%s", out);
    /* two threads: the prefill's products are handed to the worker */
    const char *h = strstr(out, "\"handoffs_per_token\":[");
    CHECK_MSG(h && strtod(h + strlen("\"handoffs_per_token\":["), NULL) > 0.0, "%s", out);
}

/* `needle bench` reports the KV cache its session reserves: on a Needle 3 file with local
 * layers, what the library's session stats say (each local layer only its window). */
static void test_bench_reports_kv_size(void) {
    static char out[1 << 14];
    char cmd[2048];
    const char *v3 = fixture_path("v3/v3a.cact");
    snprintf(cmd, sizeof cmd, "%s bench --weights %s --prompt-len 6 --gen 2 --runs 1 --json",
             cli_path(), v3);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    needle_model *m = NULL;
    needle_session *s = NULL;
    needle_session_stats st = {.size = sizeof st};
    CHECK_EQ_INT(needle_model_open(v3, NULL, &m), NEEDLE_OK);
    if (m) CHECK_EQ_INT(needle_session_create(m, NULL, &s), NEEDLE_OK);
    if (s) CHECK_EQ_INT(needle_session_get_stats(s, &st), NEEDLE_OK);
    CHECK_MSG(st.kv_bytes > 0 && fabs(json_number(out, "kv_mb") - (double)st.kv_bytes / 1e6) < 6e-4,
              "kv_mb vs %llu bytes: %s", (unsigned long long)st.kv_bytes, out);
    needle_session_free(s);
    needle_model_free(m);
}

/* Issue 31: a query longer than the demo model's attention window (1024 positions; with
 * the window the context is unbounded) is answered from its end, so the envelope flags it
 * ("input_truncated") and the CLI says so on stderr: never a silent success. */
static void test_overlong_query_is_flagged(void) {
    static char out[1 << 16];
    /* ~1,200 tokens of query (past the demo's 1,024-position window) and one tool: enough
     * to cross the window, small enough for the suite under qemu-user (a 5,700-token query
     * with the demo's 27 tools took minutes there) */
    char path[] = "/tmp/needle_long_query_XXXXXX", tools[] = "/tmp/needle_one_tool_XXXXXX";
    char cmd[2048];
    const int fd = mkstemp(path), tfd = mkstemp(tools);
    CHECK(fd >= 0 && tfd >= 0);
    if (fd < 0 || tfd < 0) return;
    FILE *f = fdopen(fd, "w");
    for (int i = 0; f && i < 320; i++) fprintf(f, "word%d ", i % 50);
    if (f) fclose(f);
    FILE *t = fdopen(tfd, "w");
    if (t) {
        fputs("[{\"name\":\"set_timer\",\"description\":\"Set a timer\",\"parameters\":"
              "{\"type\":\"object\",\"properties\":{\"minutes\":{\"type\":\"integer\"}},"
              "\"required\":[\"minutes\"]}}]", t);
        fclose(t);
    }
    snprintf(cmd, sizeof cmd, "%s run --weights '%s/models/needle-demo.cact' --tools '%s' "
             "-n 24 \"$(cat %s)\" 2>&1", cli_path(), NEEDLE_SOURCE_DIR, tools, path);
    const int status = run_command(cmd, out, sizeof out);
    CHECK_MSG(status == 0 || status == 3, "exit %d: %.600s", status, out);
    CHECK_MSG(strstr(out, "\"input_truncated\":{\"tokens\":") && strstr(out, "\"window\":1024}"), "%.600s", out);
    CHECK_MSG(strstr(out, "needle: warning: the input (") && strstr(out, "attention window (1024 positions)"),
              "%.600s", out);
    /* a query that fits has no flag */
    snprintf(cmd, sizeof cmd, "%s run --weights '%s/models/needle-demo.cact' --tools '%s' "
             "-n 24 'Set a timer for 5 minutes' 2>&1", cli_path(), NEEDLE_SOURCE_DIR, tools);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(!strstr(out, "input_truncated") && !strstr(out, "warning"), "%.600s", out);
    remove(path);
    remove(tools);
}

int main(void) {
    RUN(test_help_lists_every_command);
    RUN(test_overlong_query_is_flagged);
    RUN(test_version_build_info);
    RUN(test_serve_is_its_own_executable);
    RUN(test_download_is_its_own_executable);
    RUN(test_every_command_has_help);
    RUN(test_fixture_present);
    if (!model_path[0]) return test_summary();
    RUN(test_inspect);
    RUN(test_tokenize_matches_library);
    RUN(test_logits_match_library);
    RUN(test_generate_deterministic);
    RUN(test_errors_and_usage);
    RUN(test_unknown_command_and_options);
    RUN(test_run_exit_status_and_missing_model);
    RUN(test_run_tools_forms);
    RUN(test_run_demo_weights_use_demo_tools);
    RUN(test_seed_budget_and_empty_query);
    RUN(test_chat_commands_and_modes);
    RUN(test_chat_tells_a_result_from_a_query);
    RUN(test_bench_reports_peak_and_gflops);
    RUN(test_bench_reports_kv_size);
    return test_summary();
}
