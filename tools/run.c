/* run.c: tool calling from the command line: `needle run` (one turn, prints the JSON
 * envelope) and `needle chat` (an interactive conversation on one session). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "chat_input.h"
#include "cli.h"
#include "util/platform.h"

/* What run and chat take. */
typedef struct agent_options {
    const char *weights, *tools, *system;
    int weights_defaulted; /* no --weights: the default model is used */
    long n_new;
    int n_new_set;
    double temperature;
    unsigned long long seed;
    int seed_given;
    int stats;
    double min_confidence;
    const char *tool_index;
    long top_k, retrieval_threshold;
    int top_k_set, threshold_set;
    int date;              /* --date: the 3.x date fact in front of the system prompt */
    cli_session_options session;
} agent_options;

#define AGENT_OPTIONS(o)                                                            \
    {"--weights", "-w", CLI_TEXT, &(o)->weights, 0, 0, NULL},                        \
    {"--tools", NULL, CLI_TEXT, &(o)->tools, 0, 0, NULL},                            \
    {"--system", NULL, CLI_TEXT, &(o)->system, 0, 0, NULL},                          \
    {"--max-new-tokens", "-n", CLI_LONG, &(o)->n_new, 1, 1L << 24, &(o)->n_new_set}, \
    {"--temperature", NULL, CLI_REAL, &(o)->temperature, 0, 0, NULL},                \
    {"--seed", NULL, CLI_U64, &(o)->seed, 0, 0, &(o)->seed_given},                   \
    {"--stats", NULL, CLI_FLAG, &(o)->stats, 0, 0, NULL},                            \
    {"--min-confidence", NULL, CLI_REAL, &(o)->min_confidence, 0, 0, NULL},          \
    {"--tool-index", NULL, CLI_TEXT, &(o)->tool_index, 0, 0, NULL},                  \
    {"--top-k", NULL, CLI_LONG, &(o)->top_k, 1, 64, &(o)->top_k_set},                \
    {"--retrieval-threshold", NULL, CLI_LONG, &(o)->retrieval_threshold, 0, 1L << 30, \
     &(o)->threshold_set},                                                           \
    {"--date", NULL, CLI_FLAG, &(o)->date, 0, 0, NULL},                              \
    CLI_SESSION_OPTIONS(&(o)->session)

#define AGENT_OPTIONS_HELP                                                                  \
    CLI_WEIGHTS_HELP                                                                        \
    "  --tools TOOLS           the tools: a JSON array of tool schemas (or one tool\n"      \
    "                          object), inline or a file's path (default, with the\n"    \
    "                          default model: the demo model's own tool list)\n"         \
    "  --system TEXT           system prompt (default: none)\n"                             \
    "  -n, --max-new-tokens N  token budget of a turn, at least 1 (default 256)\n"          \
    "  --temperature T         sampling temperature (default 0: greedy)\n"                  \
    "  --seed S                sampling seed (default: a fresh one, printed on stderr)\n"  \
    "  --stats                 after each turn, forward vs grammar time on stderr\n"       \
    "  --min-confidence C      calls whose confidence is below C are not returned as\n"   \
    "                          calls: \"type\":\"low_confidence\", \"suppressed_calls\"\n" \
    "                          (default 0: never)\n"                                      \
    "  --retrieval-threshold N with more than N tools (default 5), a model with a\n"     \
    "                          retrieval head shows each conversation only the tools\n"   \
    "                          closest to its first query\n"                             \
    "  --top-k K               how many tools retrieval keeps (1-64, default 5)\n"        \
    "  --tool-index FILE       cache of the tool embeddings (made or refreshed as needed)\n" \
    "  --date                  put today's date fact in front of the system prompt as\n"   \
    "                          cactus-needle 3.x does ('date: 2026-12-03 Thu 22:40; ...')\n" \
    CLI_SESSION_OPTIONS_HELP                                                                \
    "  -h, --help              this text\n"

/* TOOLS is inline JSON when it starts with '[' or '{' (after blanks), else a file path.
 * A file may begin with a UTF-8 byte order mark (dropped). A single tool object is taken
 * as a list of one. Returns the text (malloc'd), or NULL after printing why. */
static char *load_tools(const char *arg) {
    const char *p = arg;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    char *text = NULL;
    if (*p == '[' || *p == '{') {
        text = strdup(p);
        if (!text) fprintf(stderr, "needle: out of memory\n");
    } else {
        struct stat st;
        if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode)) {
            fprintf(stderr, "needle: --tools %s is a directory; give a JSON file or inline JSON\n",
                    arg);
            return NULL;
        }
        FILE *f = platform_fopen(arg, "rb");
        if (!f) {
            fprintf(stderr, "needle: cannot open tools file %s: %s\n", arg, strerror(errno));
            return NULL;
        }
        size_t cap = 4096, len = 0, got;
        text = malloc(cap);
        while (text && (got = fread(text + len, 1, cap - len - 1, f)) > 0) {
            len += got;
            if (len + 1 == cap) {
                char *bigger = realloc(text, cap *= 2);
                if (!bigger) free(text);
                text = bigger;
            }
        }
        fclose(f);
        if (!text) {
            fprintf(stderr, "needle: out of memory reading %s\n", arg);
            return NULL;
        }
        text[len] = 0;
        if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) memmove(text, text + 3, len - 2);
    }
    if (!text) return NULL;
    const char *q = text;
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
    if (*q == '{') { /* one tool: the list of it */
        const size_t n = strlen(text);
        char *list = malloc(n + 3);
        if (!list) {
            free(text);
            fprintf(stderr, "needle: out of memory\n");
            return NULL;
        }
        list[0] = '[';
        memcpy(list + 1, text, n);
        list[n + 1] = ']';
        list[n + 2] = 0;
        free(text);
        text = list;
    }
    return text;
}

/* The system prompt with the local date fact in front (needle_system_with_date: the rule
 * of cactus-needle 3.x's client). Returns malloc'd text, or NULL with the error set. */
static char *with_date_fact(const char *system) {
    const time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm)) return NULL;
    size_t len = 0;
    needle_system_with_date(system, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                            tm.tm_min, NULL, 0, &len);
    char *out = malloc(len + 1);
    if (out && needle_system_with_date(system, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                                       tm.tm_hour, tm.tm_min, out, len + 1, &len) != NEEDLE_OK) {
        free(out);
        out = NULL;
    }
    return out;
}

/* Settles the options' defaults (the sampling seed, the default model), then opens the
 * model and a session bound to the tools. Returns 0, or the exit status after printing
 * the error. */
static int open_agent(const cli_command *self, agent_options *o, needle_model **m,
                      needle_session **s) {
    *m = NULL;
    *s = NULL;
    o->seed = cli_sampling_seed(o->seed, o->seed_given, o->temperature);
    o->weights_defaulted = cli_default_weights(&o->weights);
    /* the model first: without one, a missing --tools is not the problem to report */
    if (!o->weights) return cli_no_weights();
    const char *tools_arg = o->tools;
    /* the demo model's own tool list is the default for the demo model, taken by default
     * or named with --weights (not for another model that happens to be the default) */
    if (!tools_arg && cli_is_demo_model(o->weights)) tools_arg = needle_default_tools_path();
    if (!tools_arg) return cli_usage_error(self, "--tools TOOLS is required");
    char *tools = load_tools(tools_arg);
    if (!tools) return 1;
    int rc = needle_model_open(o->weights, NULL, m);
    if (rc) rc = cli_lib_error(o->weights, rc);
    cli_session_options so = o->session;
    if (rc == 0 && !so.n_ctx) {
        /* as the official ABI: a sliding window bounds memory, so positions need no cap */
        needle_model_info info = {.size = sizeof info};
        needle_model_get_info(*m, &info);
        /* (Needle 3 sessions attend over the whole context: max_seq_len bounds it) */
        if (info.kv_window && so.window != 0 && info.generation != 3) so.n_ctx = 1 << 20;
    }
    if (rc == 0) rc = cli_session_create(*m, &so, s);
    if (rc == 0) cli_show_progress(*s);
    if (rc == 0) {
        char *system = o->date ? with_date_fact(o->system ? o->system : "")
                               : strdup(o->system ? o->system : "");
        needle_tools_params tp = needle_tools_default_params();
        if (o->top_k_set) tp.top_k = (uint32_t)o->top_k;
        if (o->threshold_set) tp.retrieval_threshold = (uint32_t)o->retrieval_threshold;
        tp.tool_index_path = o->tool_index;
        const int st = system ? needle_session_set_tools_ex(*s, system, tools, &tp)
                              : NEEDLE_ERR_OUT_OF_MEMORY;
        free(system);
        if (st) rc = cli_lib_error("tools", st);
    }
    free(tools);
    if (rc) {
        needle_session_free(*s);
        needle_model_free(*m);
        *s = NULL;
        *m = NULL;
    }
    return rc;
}

/* Runs one turn and prints its envelope. The envelope of one turn is bounded by the
 * generated tokens (max_new_tokens) and the reasoning; 1 MiB holds any of them. */
static int complete_and_print(needle_session *s, const agent_options *o, const char *text,
                              int turn, int *called) {
    needle_complete_params p = needle_complete_default_params();
    if (o->n_new_set) p.max_new_tokens = (int32_t)o->n_new;
    p.temperature = (float)o->temperature;
    p.seed = o->seed;
    p.turn = turn;
    p.min_confidence = (float)o->min_confidence;
    size_t cap = 1 << 20, len = 0;
    char *out = malloc(cap);
    if (!out) return cli_lib_error("complete", NEEDLE_ERR_OUT_OF_MEMORY);
    const int rc = needle_session_complete(s, text, &p, out, cap, &len);
    if (rc == NEEDLE_OK) printf("%s\n", out);
    /* The envelope is ours and compact: the key appears once, unescaped, so a failed
     * turn (context_full, max_tokens, invalid_input) is told apart without parsing. */
    const int turn_failed = rc == NEEDLE_OK && strstr(out, "\"success\":false") != NULL;
    if (turn_failed || (rc == NEEDLE_OK && strstr(out, "\"input_truncated\":"))) {
        /* said on stderr too: the envelope alone is easy to misread */
        cJSON *env = cJSON_Parse(out);
        const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(env, "error_code"));
        const char *err = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(env, "error"));
        const cJSON *cut = cJSON_GetObjectItemCaseSensitive(env, "input_truncated");
        if (turn_failed)
            fprintf(stderr, "needle: the turn failed (%s): %s\n", code ? code : "?", err ? err : "no error message");
        if (cut)
            fprintf(stderr, "needle: warning: the input (%.0f tokens) is longer than the model's attention window "
                    "(%.0f positions); the answer saw only its end (input_truncated)\n",
                    cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(cut, "tokens")),
                    cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(cut, "window")));
        cJSON_Delete(env);
    }
    /* a successful turn with calls: the engine takes the next AUTO turn as their result */
    if (called) *called = rc == NEEDLE_OK && !turn_failed && strstr(out, "\"function_calls\":[{");
    if (rc == NEEDLE_OK && o->stats) {
        needle_session_stats st = {.size = sizeof st};
        needle_session_get_stats(s, &st);
        fprintf(stderr, "[stats] %llu tokens evaluated, %llu decode steps; forward %.1f ms, "
                "grammar masks %.1f ms (%.3f ms per decode step), probe heads %.2f ms\n",
                (unsigned long long)st.tokens_evaluated, (unsigned long long)st.decode_steps,
                st.forward_ms, st.grammar_ms,
                st.decode_steps ? st.grammar_ms / (double)st.decode_steps : 0.0, st.heads_ms);
    }
    free(out);
    fflush(stdout);
    if (rc) return cli_lib_error("complete", rc);
    return turn_failed ? CLI_EXIT_TURN_FAILED : 0;
}

static int run_run(const cli_command *self, int argc, char **argv) {
    agent_options o = {.session = CLI_SESSION_OPTIONS_INIT};
    const char *query = NULL;
    const cli_option opts[] = {AGENT_OPTIONS(&o), {0}};
    const int st = cli_parse(self, argc, argv, opts, &query, 1);
    if (st != CLI_GO) return st;
    if (!query) return cli_usage_error(self, "needs a QUERY");
    if (!query[strspn(query, " \t\r\n")]) return cli_usage_error(self, "the QUERY is empty");
    needle_model *m;
    needle_session *s;
    int rc = open_agent(self, &o, &m, &s);
    if (rc) return rc;
    rc = complete_and_print(s, &o, query, NEEDLE_TURN_QUERY, NULL);
    needle_session_free(s);
    needle_model_free(m);
    return rc;
}

const cli_command cli_run = {
    "run", "one tool-calling turn; prints the JSON envelope",
    "usage: needle run [--weights FILE] [--tools TOOLS] [options] QUERY\n"
    "\n"
    "Answers QUERY with calls to the given tools, decoded under the tools' grammar, and\n"
    "prints the JSON envelope: {\"success\", \"function_calls\", ...} (see the README's\n"
    "\"Tool calling\"). With neither --weights nor --tools, the demo model answers with\n"
    "its own tools, e.g.  needle run \"Set a timer for 25 minutes\"\n"
    "\n"
    "Exit status: 0 when the turn succeeded, 3 when the envelope says \"success\": false\n"
    "(context_full, max_tokens, invalid_input: the envelope is still printed), 1 on a\n"
    "library error, 2 on a usage error or when no model is found.\n"
    "\n"
    "options:\n"
    AGENT_OPTIONS_HELP,
    run_run};

/* A whole JSON value (what a tool returns), spaces around it allowed. */
static int is_json(const char *text) {
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithOpts(text, &end, 1);
    cJSON_Delete(v);
    return v != NULL;
}

static int run_chat(const cli_command *self, int argc, char **argv) {
    agent_options o = {.session = CLI_SESSION_OPTIONS_INIT};
    const cli_option opts[] = {AGENT_OPTIONS(&o), {0}};
    const int st = cli_parse(self, argc, argv, opts, NULL, 0);
    if (st != CLI_GO) return st;
    needle_model *m;
    needle_session *s;
    int rc = open_agent(self, &o, &m, &s);
    if (rc) return rc;
    /* After a turn with calls the next plain line is their result when it is JSON (what a
     * tool returns); any other line is a new request, and chat says so. The prompt says
     * which kind of line is expected. Lines are edited on a terminal (libedit) and read
     * whole, of any length (chat_input.h). */
    chat_input *in = chat_input_open(stdin);
    if (!in) {
        needle_session_free(s);
        needle_model_free(m);
        return cli_lib_error("chat", NEEDLE_ERR_OUT_OF_MEMORY);
    }
    const char *line;
    size_t n;
    int expect_result = 0;
    fprintf(stderr, "needle chat: type a query; after a call, type the tool result as JSON "
                    "(any other line is a new query). /help lists the commands\n");
    while ((line = chat_input_read(in, expect_result ? "result> " : "query> ", &n))) {
        if (!n) continue;
        chat_input_remember(in, line);
        int turn = expect_result ? NEEDLE_TURN_TOOL_RESULT : NEEDLE_TURN_QUERY;
        int plain = 1; /* not sent by /query or /result */
        const char *text = line;
        if (line[0] == '/' && line[1] == '/') {
            text = line + 1; /* "//x" sends "/x" */
        } else if (line[0] == '/') {
            const size_t w = strcspn(line, " ");
            const char *arg = line[w] ? line + w + 1 : NULL;
            if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
            if (!strcmp(line, "/help")) {
                fprintf(stderr, "  /query [TEXT]   send TEXT as a query; alone: the next line is a query\n"
                                "  /result JSON    send JSON as the result of the last calls\n"
                                "  /reset          forget the conversation (back to the tools prefix)\n"
                                "  /quit, /exit    leave (so does end of input)\n"
                                "  //TEXT          send /TEXT as it is\n");
                continue;
            }
            if (!strcmp(line, "/reset")) {
                needle_session_reset(s);
                expect_result = 0;
                fprintf(stderr, "(conversation reset to the tools prefix)\n");
                continue;
            }
            if (!strncmp(line, "/query", w) && w == 6) {
                expect_result = 0;
                if (!arg || !*arg) continue;
                turn = NEEDLE_TURN_QUERY;
                text = arg;
                plain = 0;
            } else if (!strncmp(line, "/result", w) && w == 7 && arg && *arg) {
                turn = NEEDLE_TURN_TOOL_RESULT;
                text = arg;
                plain = 0;
            } else {
                fprintf(stderr, "unknown command %.*s (/help lists them; //TEXT sends /TEXT)\n",
                        (int)w, line);
                continue;
            }
        }
        if (plain && turn == NEEDLE_TURN_TOOL_RESULT && !is_json(text)) {
            turn = NEEDLE_TURN_QUERY;
            fprintf(stderr, "(not JSON, so not a tool result: sent as a new query; "
                            "/result TEXT sends TEXT as the result)\n");
        }
        int called = 0;
        complete_and_print(s, &o, text, turn, &called);
        expect_result = called;
    }
    chat_input_close(in);
    needle_session_free(s);
    needle_model_free(m);
    return 0;
}

const cli_command cli_chat = {
    "chat", "an interactive tool-calling conversation",
    "usage: needle chat [--weights FILE] [--tools TOOLS] [options]\n"
    "\n"
    "Reads lines from stdin on one session: each line is a query or, after a turn with\n"
    "calls, their result when the line is JSON (the prompt says which is expected: query>\n"
    "or result>; a line that is not JSON is a new query, and chat says so), and each turn's\n"
    "envelope is printed as by `needle run`. Commands: /help, /query [TEXT] (a query;\n"
    "alone: back to queries), /result JSON, /reset (back to the tools prefix), /quit;\n"
    "//TEXT sends /TEXT. Lines of any length are read whole. On a terminal, lines can be\n"
    "edited and earlier ones recalled (up arrow, Ctrl-P) when built with libedit (see\n"
    "needle --version).\n"
    "\n"
    "options:\n"
    AGENT_OPTIONS_HELP,
    run_chat};
