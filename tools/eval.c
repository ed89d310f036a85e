/* eval.c: `needle eval`, the engine over a dataset in the fine-tuning format (spec §7).
 *
 * The whole file is read and validated before the model is opened, so a bad line fails
 * fast with its line number. Each example then runs as one fresh greedy query turn: the
 * session bound to its tools and system (a few are kept, least recently used replaced,
 * so a dataset with one tool set prefills it once) is reset to the cached prefix, and
 * needle_session_complete() is timed. A turn that fails (set_tools rejects the tools, the
 * envelope reports success: false) counts as a turn error and scores as a missing
 * prediction. Scoring lives in eval_score.c; the metrics are defined in eval_score.h.
 * Uses only the public header. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "compat.h"
#include "eval_data.h"
#include "eval_score.h"
#include "util/platform.h"

#define EVAL_SESSIONS 4        /* distinct tools+system sessions kept warm */
#define EVAL_ENVELOPE (1 << 20) /* one turn's envelope: bounded by max_new_tokens */

typedef struct eval_options {
    const char *weights, *data;
    long n_new, limit, n_ctx, window;
    int n_new_set, skip_bad, json, verbose, kv_type;
} eval_options;

/* Returns CLI_GO or the exit status (see cli_parse). */
static int parse_eval_options(const cli_command *self, int argc, char **argv, eval_options *o) {
    memset(o, 0, sizeof *o);
    o->window = -1;
    const cli_option opts[] = {
        {"--weights", "-w", CLI_TEXT, &o->weights, 0, 0, NULL},
        {"--max-new-tokens", "-n", CLI_LONG, &o->n_new, 1, 1L << 24, &o->n_new_set},
        {"--limit", NULL, CLI_LONG, &o->limit, 1, 1L << 24, NULL},
        {"--skip-bad", NULL, CLI_FLAG, &o->skip_bad, 0, 0, NULL},
        {"--json", NULL, CLI_FLAG, &o->json, 0, 0, NULL},
        {"--verbose", "-v", CLI_FLAG, &o->verbose, 0, 0, NULL},
        {"--kv", NULL, CLI_KV, &o->kv_type, 0, 0, NULL},
        {"--window", NULL, CLI_LONG, &o->window, 0, 1L << 24, NULL},
        {"--ctx", NULL, CLI_LONG, &o->n_ctx, 1, 1L << 24, NULL},
        {0}};
    const int st = cli_parse(self, argc, argv, opts, &o->data, 1);
    if (st != CLI_GO) return st;
    cli_default_weights(&o->weights);
    if (!o->weights) return cli_no_weights();
    if (!o->data) return cli_usage_error(self, "needs the DATA.jsonl to score");
    return CLI_GO;
}

/* ---- sessions, one per tools+system, least recently used replaced --------------------- */

typedef struct session_slot {
    needle_session *s;
    const char *tools, *system; /* borrowed from the dataset; NULL = not bound */
    unsigned long used;
} session_slot;

/* The session for `ex`, reset to its cached prefix; NULL (message in err) when the tools
 * cannot be bound or the session cannot be made. */
static needle_session *session_for(session_slot *slots, const needle_model *m,
                                   const needle_session_params *sp, const eval_example *ex,
                                   unsigned long tick, char *err, size_t cap) {
    session_slot *pick = NULL;
    for (int i = 0; i < EVAL_SESSIONS; i++) {
        session_slot *sl = &slots[i];
        if (sl->tools && !strcmp(sl->tools, ex->tools_text) && !strcmp(sl->system, ex->system)) {
            sl->used = tick;
            needle_session_reset(sl->s);
            return sl->s;
        }
        if (!pick || !sl->s || (pick->s && sl->used < pick->used)) pick = sl;
    }
    int rc = NEEDLE_OK;
    if (!pick->s) rc = needle_session_create(m, sp, &pick->s);
    pick->tools = pick->system = NULL;
    if (rc == NEEDLE_OK) rc = needle_session_set_tools(pick->s, ex->system, ex->tools_text);
    if (rc != NEEDLE_OK) {
        snprintf(err, cap, "%s: %s", needle_status_string(rc), needle_last_error());
        return NULL;
    }
    pick->tools = ex->tools_text;
    pick->system = ex->system;
    pick->used = tick;
    return pick->s;
}

/* ---- output -------------------------------------------------------------------------- */

static void progress(size_t done, size_t total, const eval_metrics *m, double sum_ms) {
    const int width = 30, fill = (int)(width * done / total);
    fprintf(stderr, "\r[");
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %zu/%zu  exact %.3f  mean %.0f ms", done, total,
            m->examples ? (double)m->exact / (double)m->examples : 0.0,
            m->n_latency ? sum_ms / (double)m->n_latency : 0.0);
    fflush(stderr);
}

static void print_json_compact(FILE *f, const cJSON *v) {
    char *s = v ? cJSON_PrintUnformatted(v) : NULL;
    fputs(s ? s : "null", f);
    free(s);
}

static void print_mismatch(const eval_example *ex, long line, const cJSON *pred, const char *turn_error,
                           int hit_limit) {
    fprintf(stderr, "line %ld: %s%s\n  expected:  ", line, ex->query,
            hit_limit ? "  (the token budget ended it)" : "");
    print_json_compact(stderr, ex->expected);
    fprintf(stderr, "\n  predicted: ");
    if (turn_error) fprintf(stderr, "(turn error: %s)", turn_error);
    else print_json_compact(stderr, pred);
    fputc('\n', stderr);
}

static void print_ratio(const char *label, double v, long num, long den) {
    if (v < 0) printf("%-20s n/a\n", label);
    else printf("%-20s %.4f  (%ld/%ld)\n", label, v, num, den);
}

/* Whether the envelope's confidence separates right from wrong (eval_metrics_calibration). */
static void print_calibration(eval_metrics *m) {
    const eval_calibration c = eval_metrics_calibration(m);
    if (!c.examples) {
        printf("%-20s n/a (no turn with a confidence)\n", "confidence");
        return;
    }
    printf("%-20s least confident fifth (<= %.3f): %ld errors of %ld; the rest: %ld of %ld; ",
           "confidence", c.low_confidence_max, c.low_errors, c.low_examples, c.rest_errors,
           c.rest_examples);
    if (c.error_ratio < 0) printf("error ratio n/a");
    else printf("error ratio %.2f", c.error_ratio);
    if (c.best_error_ratio >= 0) printf(" (a perfect ranking: %.2f)", c.best_error_ratio);
    if (c.auc >= 0) printf("; AUC %.3f", c.auc);
    printf("\n");
    for (int b = 0; b < EVAL_CONF_BINS; b++) {
        if (!c.bin_examples[b]) continue;
        printf("%-20s [%.2f, %.2f%c %4ld turns, exact %.4f\n", "", eval_confidence_edges[b],
               eval_confidence_edges[b + 1], b + 1 == EVAL_CONF_BINS ? ']' : ')', c.bin_examples[b],
               (double)c.bin_exact[b] / (double)c.bin_examples[b]);
    }
}

static void print_table(const eval_options *o, eval_metrics *m, long skipped) {
    const eval_summary s = eval_metrics_summary(m);
    printf("%-20s %s\n", "model", o->weights);
    printf("%-20s %s\n", "data", o->data);
    printf("%-20s %ld (%ld calls expected; %ld lines skipped)\n", "examples", m->examples,
           m->calls_expected, skipped);
    print_ratio("exact match", s.exact_match, m->exact, m->examples);
    print_ratio("tool-name accuracy", s.tool_name_accuracy, m->names_match, m->examples);
    print_ratio("argument precision", s.arg_precision, m->args_correct, m->args_predicted);
    print_ratio("argument recall", s.arg_recall, m->args_correct, m->args_expected);
    printf("%-20s %.4f\n", "argument F1", s.arg_f1);
    print_ratio("refusal accuracy", s.refusal_accuracy, m->refusals_correct, m->refusal_examples);
    printf("%-20s %ld\n", "false refusals", m->false_refusals);
    print_ratio("well-formed rate", s.well_formed_rate, m->well_formed, m->examples);
    if (s.latency_mean_ms < 0) printf("%-20s n/a (no turn ran)\n", "latency");
    else printf("%-20s mean %.1f ms, p50 %.1f ms, p95 %.1f ms\n", "latency", s.latency_mean_ms,
                s.latency_p50_ms, s.latency_p95_ms);
    printf("%-20s %ld\n", "turn errors", m->turn_errors);
    printf("%-20s %ld\n", "token limit reached", m->limit_hits);
    print_ratio("non-ASCII copied", m->non_ascii_values ? (double)m->non_ascii_copied /
                                                              (double)m->non_ascii_values
                                                        : -1,
                m->non_ascii_copied, m->non_ascii_values);
    print_calibration(m);
    static const char *const labels[EVAL_CATEGORIES] = {"single call", "multi-call (2+)",
                                                        "refusal ([])", "non-ASCII values"};
    printf("\n%-20s %8s %8s %8s %8s\n", "by category", "examples", "exact", "names", "arg F1");
    for (int i = 0; i < EVAL_CATEGORIES; i++) {
        const eval_category_summary c = eval_category_summarize(&m->cat[i]);
        printf("%-20s %8ld", labels[i], m->cat[i].examples);
        const double v[3] = {c.exact_match, c.tool_name_accuracy, c.arg_f1};
        for (int k = 0; k < 3; k++) {
            if (v[k] < 0) printf(" %8s", "n/a");
            else printf(" %8.4f", v[k]);
        }
        putchar('\n');
    }
}

static int print_json(const eval_options *o, eval_metrics *m, long skipped) {
    cJSON *out = eval_metrics_json(m);
    if (!out || !cJSON_AddStringToObject(out, "weights", o->weights) ||
        !cJSON_AddStringToObject(out, "data", o->data) ||
        !cJSON_AddNumberToObject(out, "skipped_lines", (double)skipped)) {
        cJSON_Delete(out);
        fprintf(stderr, "needle: out of memory\n");
        return 1;
    }
    print_json_compact(stdout, out);
    putchar('\n');
    cJSON_Delete(out);
    return 0;
}

/* ---- the command ----------------------------------------------------------------------- */

/* Runs one example; returns the envelope's function_calls (owned by *env) or NULL with a
 * reason in err. *hit_limit: the token budget ended the turn (a cut answer, or the turn
 * failed at max_new_tokens). */
static const cJSON *run_turn(needle_session *s, const eval_options *o, const char *query,
                             char *buf, cJSON **env, double *ms, int *hit_limit, char *err,
                             size_t cap) {
    needle_complete_params p = needle_complete_default_params();
    if (o->n_new_set) p.max_new_tokens = (int32_t)o->n_new;
    p.turn = NEEDLE_TURN_QUERY;
    size_t len = 0;
    needle_session_stats before = {.size = sizeof before}, after = {.size = sizeof after};
    const int stats = needle_session_get_stats(s, &before) == NEEDLE_OK;
    const double t0 = cli_now_ms();
    const int rc = needle_session_complete(s, query, &p, buf, EVAL_ENVELOPE, &len);
    *ms = cli_now_ms() - t0;
    *hit_limit = stats && needle_session_get_stats(s, &after) == NEEDLE_OK &&
                 after.budget_endings > before.budget_endings;
    *env = NULL;
    if (rc != NEEDLE_OK) {
        snprintf(err, cap, "%s: %s", needle_status_string(rc), needle_last_error());
        return NULL;
    }
    *env = cJSON_Parse(buf);
    if (!*env) {
        snprintf(err, cap, "envelope is not JSON");
        return NULL;
    }
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(*env, "success"))) {
        const char *code =
            cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(*env, "error_code"));
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(*env, "error"));
        snprintf(err, cap, "%s%s%s", code ? code : "failed", msg ? ": " : "", msg ? msg : "");
        return NULL;
    }
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(*env, "function_calls");
    if (!calls) snprintf(err, cap, "envelope has no function_calls");
    return calls;
}

static int run_eval(const cli_command *self, int argc, char **argv) {
    eval_options o;
    int rc = parse_eval_options(self, argc, argv, &o);
    if (rc != CLI_GO) return rc;
    eval_dataset d;
    if (eval_dataset_read(o.data, o.limit, o.skip_bad, 0, &d)) return 1;
    if (d.n == 0) {
        fprintf(stderr, "needle: %s: no examples\n", o.data);
        eval_dataset_free(&d);
        return 1;
    }

    needle_model *m = NULL;
    session_slot slots[EVAL_SESSIONS];
    memset(slots, 0, sizeof slots);
    eval_metrics metrics;
    eval_metrics_init(&metrics);
    char *buf = malloc(EVAL_ENVELOPE);
    if (!buf) {
        fprintf(stderr, "needle: out of memory\n");
        rc = 1;
        goto done;
    }
    if ((rc = needle_model_open(o.weights, NULL, &m)) != NEEDLE_OK) {
        fprintf(stderr, "needle: %s: %s: %s\n", o.weights, needle_status_string(rc),
                needle_last_error());
        rc = 1;
        goto done;
    }
    needle_session_params sp = needle_session_default_params();
    sp.kv_window = (int32_t)o.window;
    sp.n_ctx = (uint32_t)o.n_ctx;
    sp.kv_type = o.kv_type;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    /* as `needle run`: a sliding window bounds memory, so positions need no cap */
    if (!o.n_ctx && info.kv_window && o.window != 0) sp.n_ctx = 1u << 20;

    const int bar = isatty(STDERR_FILENO);
    int errors_reported = 0;
    double sum_ms = 0;
    for (size_t i = 0; i < d.n; i++) {
        const eval_example *e = &d.ex[i];
        char err[512] = "";
        cJSON *env = NULL;
        const cJSON *pred = NULL;
        double ms = -1; /* stays -1 when the turn never ran */
        int hit_limit = 0;
        needle_session *s =
            session_for(slots, m, &sp, e, (unsigned long)i + 1, err, sizeof err);
        if (s) pred = run_turn(s, &o, e->query, buf, &env, &ms, &hit_limit, err, sizeof err);
        eval_result r = eval_score(pred, e->expected, e->tools);
        r.hit_limit = hit_limit;
        if (!pred) metrics.turn_errors++;
        const cJSON *conf = pred ? cJSON_GetObjectItemCaseSensitive(env, "confidence") : NULL;
        if (eval_metrics_add(&metrics, &r, ms) ||
            (cJSON_IsNumber(conf) &&
             eval_metrics_add_confidence(&metrics, conf->valuedouble, r.exact))) {
            fprintf(stderr, "needle: out of memory\n");
            cJSON_Delete(env);
            rc = 1;
            goto done;
        }
        const int first_error = !pred && !o.verbose && !errors_reported++;
        if (bar && (first_error || (o.verbose && !r.exact))) fprintf(stderr, "\r\033[K");
        if (first_error)
            fprintf(stderr, "needle: %s:%ld: turn error: %s (--verbose lists every one)\n",
                    o.data, d.line[i], err);
        if (o.verbose && !r.exact) print_mismatch(e, d.line[i], pred, pred ? NULL : err, hit_limit);
        cJSON_Delete(env);
        if (ms >= 0) sum_ms += ms;
        if (bar) progress(i + 1, d.n, &metrics, sum_ms);
    }
    if (bar) fprintf(stderr, "\r\033[K");
    rc = o.json ? print_json(&o, &metrics, d.skipped) : (print_table(&o, &metrics, d.skipped), 0);
done:
    for (int i = 0; i < EVAL_SESSIONS; i++) needle_session_free(slots[i].s);
    needle_model_free(m);
    free(buf);
    eval_metrics_free(&metrics);
    eval_dataset_free(&d);
    return rc;
}

const cli_command cli_eval = {
    "eval", "score the engine on a dataset in the fine-tuning format",
    "usage: needle eval [--weights FILE] [options] DATA.jsonl\n"
    "\n"
    "Runs every example of DATA.jsonl (the fine-tuning format, one JSON object a line:\n"
    "query, tools, answers, optional system; or a single-turn chat-format line, messages\n"
    "+ OpenAI-form tools, read as the official fine-tuner reads it) as one fresh greedy\n"
    "query turn and scores the calls against the answers. The file is checked before the model loads: a bad line\n"
    "stops the run with FILE:LINE and the reason (exit 1). A progress bar goes to stderr\n"
    "when it is a terminal.\n"
    "\n"
    "options:\n"
    CLI_WEIGHTS_HELP
    "  -n, --max-new-tokens N  token budget of a turn (default: the library's)\n"
    "  --limit N               only the first N examples\n"
    "  --skip-bad              report, count and skip malformed lines instead of failing\n"
    "  --json                  one JSON object on stdout instead of the table\n"
    "  -v, --verbose           every mismatch (query, expected, predicted) on stderr\n"
    "  --kv f32|f16|int8       KV cache precision (default f32)\n"
    "  --window N              sliding attention window (default: the file's kv_window;\n"
    "                          0 = none)\n"
    "  --ctx N                 positions per conversation (default: with a window\n"
    "                          unbounded, else the file's max_seq_len)\n"
    "  -h, --help              this text\n"
    "\n"
    "metrics (see also the README, \"Evaluating on a dataset\"):\n"
    "  exact match         same calls in the same order: names equal, arguments equal as JSON\n"
    "                      values (key order ignored, 2 == 2.0, strings byte for byte)\n"
    "  tool-name accuracy  the ordered list of called names equals the expected one\n"
    "  argument P/R/F1     micro-averaged over (call, key, value): calls paired by position\n"
    "                      when names match; a key is correct if present in both with equal\n"
    "                      values; P = correct/predicted keys, R = correct/expected keys\n"
    "  refusal accuracy    over examples expecting [], the fraction predicting []; false\n"
    "                      refusals: [] predicted where calls were expected\n"
    "  well-formed rate    output is an array of {\"name\": a declared tool, \"arguments\": {}}\n"
    "                      (a failed turn is not; it scores as wrong everywhere)\n"
    "  latency             needle_session_complete() per example: mean, p50, p95\n"
    "  token limit reached examples whose turn the token budget ended (a cut answer, or a\n"
    "                      turn that failed at max_new_tokens)\n"
    "  non-ASCII copied    expected argument values holding a non-ASCII character that\n"
    "                      the prediction has equal\n"
    "  confidence          the envelope's confidence against exact match: the least\n"
    "                      confident fifth of the turns against the rest (their error\n"
    "                      rates' ratio, beside the ratio a perfect ranking would reach\n"
    "                      with as many errors), the ROC AUC of confidence for exact\n"
    "                      (0.5: no separation, 1: perfect), exact match by confidence bin\n"
    "  by category         exact, tool names and argument F1 over the examples expecting\n"
    "                      one call, two or more, [] (refusal), and those whose expected\n"
    "                      arguments hold a non-ASCII character (also in one of the others)\n",
    run_eval};
