/* needle: the command-line tool. Uses only the public header.
 *
 *   needle inspect FILE
 *   needle tokenize --weights FILE "text"
 *   needle generate --weights FILE --prompt TEXT [-n N] [--temperature T --seed S]
 *   needle logits --weights FILE --tokens 2,17,99 --out logits.f32 [--incremental] [--sink N]
 *   needle run --weights FILE --tools TOOLS [--system TEXT] [-n N] [--temperature T --seed S] QUERY
 *   needle chat --weights FILE --tools TOOLS [--system TEXT]
 *   needle eval --weights FILE [-n N] [--limit N] [--json] [--verbose] DATA.jsonl  (eval.c)
 *
 * Exit status: 0 on success, 1 on a library error (message on stderr), 2 on bad usage. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "eval.h"
#include "default_model.h"
#include "needle.h"

static const char *usage_text =
    "usage: needle <command> [options]\n"
    "\n"
    "commands:\n"
    "  inspect FILE                       header, geometry and every tensor of a .cact file\n"
    "  tokenize --weights FILE TEXT       token ids and pieces of TEXT\n"
    "  generate --weights FILE --prompt TEXT [-n N] [--temperature T] [--seed S]\n"
    "                                     continue a prompt (BOS is prepended)\n"
    "  logits --weights FILE --tokens IDS --out FILE [--incremental] [--sink N]\n"
    "                                     float32 [n_tokens][vocab] logits after every token\n"
    "  bench --weights FILE [--prompt-len N] [--gen N] [--threads N] [--runs N] [--json]\n"
    "                                     load time, time to first token, prefill and decode\n"
    "                                     tok/s (medians), peak RSS\n"
    "  run --weights FILE --tools TOOLS [--system TEXT] [-n N] [--temperature T --seed S] QUERY\n"
    "                                     one tool-calling turn; prints the JSON envelope\n"
    "  chat --weights FILE --tools TOOLS [--system TEXT]\n"
    "                                     interactive: each line is a query or, after a call,\n"
    "                                     the tool result; /reset, /query TEXT, /result JSON, /quit\n"
    "  eval --weights FILE [-n N] [--limit N] [--skip-bad] [--json] [--verbose] DATA.jsonl\n"
    "                                     score the engine on a dataset in the fine-tuning\n"
    "                                     format (JSONL: query, tools, answers, system?);\n"
    "                                     a progress bar on stderr when it is a terminal\n"
    "  devices [--json]                   compute devices found, and the default backend\n"
    "                                     (NEEDLE_BACKEND / JAX_PLATFORM_NAME honoured)\n"
    "\n"
    "TOOLS is a JSON array of tool schemas, inline or the path of a file holding one.\n"
    "\n"
    "common options:\n"
    "  --kv f32|f16|int8                  KV cache precision (default f32)\n"
    "  --window N                         sliding window (default: the file's kv_window)\n"
    "  --stats                            run/chat: print forward vs grammar time to stderr\n"
    "  --ctx N                            positions per conversation (default: the file's\n"
    "                                     max_seq_len; run/chat/eval with a window: unbounded)\n"
    "\n"
    "eval metrics (each example is one fresh greedy query turn):\n"
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
    "  --limit N: first N examples; --skip-bad: count and skip malformed lines instead of\n"
    "  failing; --verbose: every mismatch (query, expected, predicted) on stderr; --json: one\n"
    "  JSON object on stdout\n";

static int usage(const char *msg) {
    if (msg) fprintf(stderr, "needle: %s\n\n", msg);
    fputs(usage_text, stderr);
    return 2;
}

static int lib_error(const char *what, int rc) {
    const char *msg = needle_last_error();
    fprintf(stderr, "needle: %s: %s%s%s\n", what, needle_status_string(rc), *msg ? ": " : "", msg);
    return 1;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct options {
    const char *weights, *prompt, *tokens, *out, *text, *tools, *system;
    long n_new;
    int n_new_set;
    int stats;
    double temperature;
    unsigned long long seed;
    int incremental;
    long sinks;
    long window;
    long n_ctx;
    int kv_type;
    int weights_defaulted; /* no --weights: the default model (default_model.h) is used */
} options;

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Parses options after the command word. Returns 0, or 2 after printing usage. */
static int parse_options(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->n_new = 32;
    o->window = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE() do { if (!val) return usage("missing value after an option"); i++; } while (0)
        if (!strcmp(a, "--weights") || !strcmp(a, "-w")) { NEED_VALUE(); o->weights = val; }
        else if (!strcmp(a, "--prompt") || !strcmp(a, "-p")) { NEED_VALUE(); o->prompt = val; }
        else if (!strcmp(a, "--tokens")) { NEED_VALUE(); o->tokens = val; }
        else if (!strcmp(a, "--tools")) { NEED_VALUE(); o->tools = val; }
        else if (!strcmp(a, "--system")) { NEED_VALUE(); o->system = val; }
        else if (!strcmp(a, "--out") || !strcmp(a, "-o")) { NEED_VALUE(); o->out = val; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens")) {
            NEED_VALUE();
            if (parse_long(val, 0, 1 << 24, &o->n_new)) return usage("bad -n value");
            o->n_new_set = 1;
        } else if (!strcmp(a, "--temperature")) {
            NEED_VALUE();
            char *end;
            o->temperature = strtod(val, &end);
            if (end == val || *end || !(o->temperature >= 0)) return usage("bad --temperature");
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE();
            char *end;
            o->seed = strtoull(val, &end, 10);
            if (end == val || *end) return usage("bad --seed");
        } else if (!strcmp(a, "--stats")) {
            o->stats = 1;
        } else if (!strcmp(a, "--incremental")) {
            o->incremental = 1;
        } else if (!strcmp(a, "--sink")) {
            NEED_VALUE();
            if (parse_long(val, 0, 1 << 24, &o->sinks)) return usage("bad --sink value");
        } else if (!strcmp(a, "--ctx")) {
            NEED_VALUE();
            if (parse_long(val, 1, 1 << 24, &o->n_ctx)) return usage("bad --ctx value");
        } else if (!strcmp(a, "--window")) {
            NEED_VALUE();
            if (parse_long(val, 0, 1 << 24, &o->window)) return usage("bad --window value");
        } else if (!strcmp(a, "--kv")) {
            NEED_VALUE();
            if (!strcmp(val, "f32")) o->kv_type = NEEDLE_KV_F32;
            else if (!strcmp(val, "f16")) o->kv_type = NEEDLE_KV_F16;
            else if (!strcmp(val, "int8")) o->kv_type = NEEDLE_KV_INT8;
            else return usage("--kv takes f32, f16 or int8");
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "needle: unknown option %s\n", a);
            return 2;
        } else if (!o->text) {
            o->text = a;
        } else {
            return usage("too many arguments");
        }
#undef NEED_VALUE
    }
    if (!o->weights) {
        o->weights = needle_default_model_path();
        o->weights_defaulted = o->weights != NULL;
    }
    return 0;
}

static int open_model(const options *o, needle_model **m) {
    if (!o->weights) return cli_no_weights();
    int rc = needle_model_open(o->weights, NULL, m);
    return rc ? lib_error(o->weights, rc) : 0;
}

static const char *dtype_name(int dtype) {
    switch (dtype) {
    case NEEDLE_DTYPE_FP16: return "FP16";
    case NEEDLE_DTYPE_FP32: return "FP32";
    case NEEDLE_DTYPE_CQ: return "CQ";
    case NEEDLE_DTYPE_RAW: return "RAW";
    default: return "?";
    }
}

static int cmd_inspect(const options *o) {
    const char *path = o->text ? o->text : o->weights;
    if (!path) return usage("inspect needs a FILE");
    double t0 = now_ms();
    needle_model *m;
    int rc = needle_model_open(path, NULL, &m);
    if (rc) return lib_error(path, rc);
    double t1 = now_ms();
    needle_model_info in = {.size = sizeof in};
    needle_model_get_info(m, &in);
    printf("file            %s (%" PRIu64 " bytes, loaded in %.2f ms)\n", path, in.file_size, t1 - t0);
    printf("tensors         %u\n", in.num_tensors);
    printf("vocab           %u\n", in.vocab);
    printf("d_model         %u\n", in.d_model);
    printf("layers          %u\n", in.num_layers);
    printf("heads           %u query / %u kv, head_dim %u\n", in.num_heads, in.num_kv_heads, in.head_dim);
    printf("hada_n          %u\n", in.hada_n);
    printf("mhc_lanes       %u\n", in.mhc_lanes);
    printf("max_seq_len     %u\n", in.max_seq_len);
    printf("kv_window       %u\n", in.kv_window);
    printf("kv_bits         %u\n", in.kv_bits);
    printf("rope_theta      %g\n", (double)in.rope_theta);
    printf("engram          %u sites [", in.num_engram_sites);
    for (uint32_t i = 0; i < in.num_engram_sites; i++) printf(i ? ", %u" : "%u", in.engram_sites[i]);
    printf("], orders [");
    for (uint32_t i = 0; i < in.num_engram_orders; i++) printf(i ? ", %u" : "%u", in.engram_orders[i]);
    printf("], %u tables x %u slots x %u, %u taps, dilation %u\n", in.num_engram_tables,
           in.engram_slots, in.engram_sub_dim, in.engram_conv_taps, in.engram_conv_dilation);
    printf("cq group        %u\n", in.group_size);
    printf("tokenizer       %s\n", in.has_tokenizer ? "yes" : "no");
    printf("probe heads     %u", in.num_probe_heads);
    for (uint32_t i = 0; i < in.num_probe_heads; i++)
        printf(i ? ", %s" : " (%s", in.probe_head_codes[i] == 1 ? "contrastive" : "confidence");
    printf(in.num_probe_heads ? ")\n" : "\n");
    printf("\n%5s  %-26s %-5s %-20s %5s %10s %12s\n", "index", "name", "dtype", "shape", "bits",
           "bytes", "offset");
    for (uint32_t i = 0; i < in.num_tensors; i++) {
        needle_tensor_info t = {.size = sizeof t};
        needle_model_get_tensor(m, i, &t);
        char shape[64] = "";
        size_t len = 0;
        for (uint32_t k = 0; k < t.ndim; k++)
            len += (size_t)snprintf(shape + len, sizeof shape - len, k ? "x%u" : "%u", t.shape[k]);
        if (t.ndim == 0) snprintf(shape, sizeof shape, "-");
        char bits[8] = "-";
        if (t.dtype == NEEDLE_DTYPE_CQ) {
            if (t.bits == 5) snprintf(bits, sizeof bits, "1.58");
            else snprintf(bits, sizeof bits, "%u", t.bits);
        }
        printf("%5u  %-26s %-5s %-20s %5s %10" PRIu64 " %12" PRIu64 "\n", i, t.name,
               dtype_name(t.dtype), shape, bits, t.nbytes, t.offset);
    }
    needle_model_free(m);
    return 0;
}

static int cmd_tokenize(const options *o) {
    if (!o->text) return usage("tokenize needs TEXT");
    needle_model *m;
    int rc = open_model(o, &m);
    if (rc) return rc;
    size_t n = 0, len = strlen(o->text);
    rc = needle_tokenize(m, o->text, len, NULL, 0, &n);
    int32_t *ids = NULL;
    if (rc == NEEDLE_ERR_BUFFER_TOO_SMALL || rc == NEEDLE_OK) {
        ids = malloc((n ? n : 1) * sizeof *ids);
        rc = ids ? needle_tokenize(m, o->text, len, ids, n, &n) : NEEDLE_ERR_OUT_OF_MEMORY;
    }
    if (rc) {
        free(ids);
        needle_model_free(m);
        return lib_error("tokenize", rc);
    }
    printf("%zu tokens\n", n);
    for (size_t i = 0; i < n; i++) {
        const char *piece;
        size_t plen;
        needle_token_piece(m, ids[i], &piece, &plen);
        printf("%6d  %.*s\n", ids[i], (int)plen, piece);
    }
    printf("ids: ");
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    needle_model_free(m);
    return 0;
}

static int make_session(const needle_model *m, const options *o, needle_session **s) {
    needle_session_params sp = needle_session_default_params();
    sp.kv_window = (int32_t)o->window;
    sp.n_ctx = (uint32_t)o->n_ctx;
    sp.n_sinks = (uint32_t)o->sinks;
    sp.kv_type = o->kv_type;
    int rc = needle_session_create(m, &sp, s);
    return rc ? lib_error("session", rc) : 0;
}

static int cmd_generate(const options *o) {
    const char *prompt = o->prompt ? o->prompt : o->text;
    if (!prompt) return usage("generate needs --prompt TEXT");
    double t0 = now_ms();
    needle_model *m;
    int rc = open_model(o, &m);
    if (rc) return rc;
    double t_load = now_ms() - t0;
    needle_session *s = NULL;
    if ((rc = make_session(m, o, &s))) {
        needle_model_free(m);
        return rc;
    }
    size_t len = strlen(prompt), n = 0;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    int32_t *ids = malloc((len + 2) * 4 * sizeof *ids + (size_t)o->n_new * sizeof *ids + 64);
    int32_t *gen = NULL;
    char *text = NULL;
    if (!ids) { rc = NEEDLE_ERR_OUT_OF_MEMORY; goto done; }
    ids[0] = NEEDLE_TOKEN_BOS;
    /* UTF-8 text never encodes to more ids than 4 per byte (byte fallback) */
    rc = needle_tokenize(m, prompt, len, ids + 1, (len + 1) * 4, &n);
    if (rc) { lib_error("tokenize", rc); goto done; }
    gen = malloc(((size_t)o->n_new + 1) * sizeof *gen);
    if (!gen) { rc = NEEDLE_ERR_OUT_OF_MEMORY; goto done; }
    needle_generate_params gp = needle_generate_default_params();
    gp.max_new_tokens = (uint32_t)o->n_new;
    gp.temperature = (float)o->temperature;
    gp.seed = o->seed;
    size_t n_gen = 0;
    double t1 = now_ms();
    rc = needle_session_generate(s, ids, n + 1, &gp, gen, (size_t)o->n_new + 1, &n_gen);
    double t_gen = now_ms() - t1;
    if (rc && rc != NEEDLE_ERR_BUFFER_TOO_SMALL) { lib_error("generate", rc); goto done; }
    size_t tlen = 0;
    needle_detokenize(m, gen, n_gen, NULL, 0, &tlen);
    text = malloc(tlen + 1);
    if (!text) { rc = NEEDLE_ERR_OUT_OF_MEMORY; goto done; }
    rc = needle_detokenize(m, gen, n_gen, text, tlen + 1, &tlen);
    if (rc) { lib_error("detokenize", rc); goto done; }
    printf("%s\n", text);
    fprintf(stderr, "[%zu prompt tokens, %zu generated; load %.1f ms, prefill+decode %.1f ms]\n",
            n + 1, n_gen, t_load, t_gen);
    fprintf(stderr, "ids:");
    for (size_t i = 0; i < n_gen; i++) fprintf(stderr, " %d", gen[i]);
    fprintf(stderr, "\n");
done:
    free(ids);
    free(gen);
    free(text);
    needle_session_free(s);
    needle_model_free(m);
    if (rc == NEEDLE_ERR_OUT_OF_MEMORY) fprintf(stderr, "needle: out of memory\n");
    return rc ? 1 : 0;
}

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
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < INT32_MIN || v > INT32_MAX) return -1;
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return *n ? 0 : -1;
}

static int cmd_logits(const options *o) {
    if (!o->tokens || !o->out) return usage("logits needs --tokens IDS and --out FILE");
    int32_t *ids = NULL;
    size_t n = 0;
    if (parse_token_list(o->tokens, &ids, &n)) {
        free(ids);
        return usage("--tokens takes comma-separated integers, e.g. 2,17,99");
    }
    needle_model *m;
    int rc = open_model(o, &m);
    if (rc) { free(ids); return rc; }
    needle_session *s = NULL;
    float *logits = NULL;
    if ((rc = make_session(m, o, &s))) goto done;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    logits = malloc(n * info.vocab * sizeof *logits);
    if (!logits) { rc = lib_error("logits", NEEDLE_ERR_OUT_OF_MEMORY); goto done; }
    if (o->incremental) {
        for (size_t i = 0; i < n && !rc; i++)
            rc = needle_session_eval(s, ids + i, 1, logits + i * info.vocab, info.vocab);
    } else {
        rc = needle_session_eval(s, ids, n, logits, n * info.vocab);
    }
    if (rc) { rc = lib_error("eval", rc); goto done; }
    FILE *f = fopen(o->out, "wb");
    if (!f || fwrite(logits, sizeof *logits, n * info.vocab, f) != n * info.vocab) {
        fprintf(stderr, "needle: cannot write %s: %s\n", o->out, strerror(errno));
        if (f) fclose(f);
        rc = 1;
        goto done;
    }
    if (fclose(f) != 0) { fprintf(stderr, "needle: cannot write %s\n", o->out); rc = 1; goto done; }
    fprintf(stderr, "wrote %zu x %u float32 logits to %s\n", n, info.vocab, o->out);
done:
    free(ids);
    free(logits);
    needle_session_free(s);
    needle_model_free(m);
    return rc ? 1 : 0;
}

/* TOOLS is inline JSON when it starts with '[' (after blanks), else a file path. */
static char *load_tools(const char *arg) {
    const char *p = arg;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (*p == '[') return strdup(arg);
    char *text = NULL;
    FILE *f = fopen(arg, "rb");
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
            if (!bigger) { free(text); text = NULL; }
            else text = bigger;
        }
    }
    fclose(f);
    if (text) text[len] = 0;
    return text;
}

/* Opens the model and a session bound to the tools; prints errors. */
static int open_agent(const options *o, needle_model **m, needle_session **s) {
    *m = NULL;
    *s = NULL;
    const char *tools_arg = o->tools;
    /* the demo model's own tool list is the default only for the default model */
    if (!tools_arg && o->weights_defaulted && !getenv("NEEDLE_MODEL"))
        tools_arg = needle_default_tools_path();
    if (!tools_arg) return usage("--tools TOOLS is required");
    char *tools = load_tools(tools_arg);
    if (!tools) return 1;
    int rc = open_model(o, m);
    options with_ctx = *o;
    if (rc == 0 && !o->n_ctx) {
        /* as the official ABI: a sliding window bounds memory, so positions need no cap */
        needle_model_info info = {.size = sizeof info};
        needle_model_get_info(*m, &info);
        if (info.kv_window && o->window != 0) with_ctx.n_ctx = 1 << 20;
    }
    if (rc == 0) rc = make_session(*m, &with_ctx, s);
    if (rc == 0) {
        int st = needle_session_set_tools(*s, o->system ? o->system : "", tools);
        if (st) rc = lib_error("tools", st);
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
static int complete_and_print(needle_session *s, const options *o, const char *text, int turn) {
    needle_complete_params p = needle_complete_default_params();
    if (o->n_new_set) p.max_new_tokens = (int32_t)o->n_new;
    p.temperature = (float)o->temperature;
    p.seed = o->seed;
    p.turn = turn;
    size_t cap = 1 << 20, len = 0;
    char *out = malloc(cap);
    if (!out) return lib_error("complete", NEEDLE_ERR_OUT_OF_MEMORY);
    int rc = needle_session_complete(s, text, &p, out, cap, &len);
    if (rc == NEEDLE_OK) printf("%s\n", out);
    if (rc == NEEDLE_OK && o->stats) {
        needle_session_stats st = {.size = sizeof st};
        needle_session_get_stats(s, &st);
        fprintf(stderr, "[stats] %llu tokens evaluated, %llu decode steps; forward %.1f ms, "
                "grammar masks %.1f ms (%.3f ms per decode step)\n",
                (unsigned long long)st.tokens_evaluated, (unsigned long long)st.decode_steps,
                st.forward_ms, st.grammar_ms,
                st.decode_steps ? st.grammar_ms / (double)st.decode_steps : 0.0);
    }
    free(out);
    fflush(stdout);
    return rc ? lib_error("complete", rc) : 0;
}

static int cmd_run(const options *o) {
    if (!o->text) return usage("run needs a QUERY");
    needle_model *m;
    needle_session *s;
    int rc = open_agent(o, &m, &s);
    if (rc) return rc;
    rc = complete_and_print(s, o, o->text, NEEDLE_TURN_QUERY);
    needle_session_free(s);
    needle_model_free(m);
    return rc;
}

static int cmd_chat(const options *o) {
    needle_model *m;
    needle_session *s;
    int rc = open_agent(o, &m, &s);
    if (rc) return rc;
    char line[65536];
    fprintf(stderr, "needle chat: type a query; after a call, type the tool result. "
                    "/reset, /query TEXT, /result JSON, /quit\n");
    while (fputs("> ", stderr), fgets(line, sizeof line, stdin)) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            needle_session_reset(s);
            fprintf(stderr, "(conversation reset to the tools prefix)\n");
            continue;
        }
        int turn = NEEDLE_TURN_AUTO;
        const char *text = line;
        if (!strncmp(line, "/query ", 7)) { turn = NEEDLE_TURN_QUERY; text = line + 7; }
        else if (!strncmp(line, "/result ", 8)) { turn = NEEDLE_TURN_TOOL_RESULT; text = line + 8; }
        complete_and_print(s, o, text, turn);
    }
    needle_session_free(s);
    needle_model_free(m);
    return 0;
}

/* ---- bench: load time, prefill and decode speed, peak memory ----------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void json_string(const char *str) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)str; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The operations of needle_session_stats' profile, in the order bench prints them. */
#define PROFILE_OPS 9
static const char *const profile_names[PROFILE_OPS] = {
    "matmul", "attention", "mhc", "hadamard", "engram", "logits", "embed", "sync", "other"};

/* prof[k] += the profile of (b - a); "other" is the forward time no operation accounts for
 * (RoPE angles, bookkeeping). */
static void profile_add(double *prof, const needle_session_stats *a,
                        const needle_session_stats *b) {
    const double v[PROFILE_OPS - 1] = {
        b->matmul_ms - a->matmul_ms, b->attention_ms - a->attention_ms, b->mhc_ms - a->mhc_ms,
        b->hadamard_ms - a->hadamard_ms, b->engram_ms - a->engram_ms,
        b->logits_ms - a->logits_ms, b->embed_ms - a->embed_ms, b->sync_ms - a->sync_ms};
    double sum = 0;
    for (int k = 0; k < PROFILE_OPS - 1; k++) {
        prof[k] += v[k];
        sum += v[k];
    }
    const double other = (b->forward_ms - a->forward_ms) - sum;
    prof[PROFILE_OPS - 1] += other > 0 ? other : 0;
}

/* needle bench --weights FILE [--prompt-len N] [--gen N] [--threads N] [--runs N] [--json]
 * Prefill of a synthetic prompt (BOS + fixed pseudo-random ids), then greedy decode of
 * --gen tokens one at a time, repeated --runs times on one session (reset between runs);
 * reports medians. Threads: --threads, else NEEDLE_THREADS, else the online cores. */
static int cmd_bench(int argc, char **argv) {
    const char *weights = NULL;
    long prompt_len = 256, gen = 64, threads = 0, runs = 5;
    int json = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        long *target = NULL, lo = 1, hi = 1 << 20;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--weights") || !strcmp(a, "-w")) {
            if (!val) return usage("missing value after --weights");
            weights = val;
            i++;
            continue;
        }
        if (!strcmp(a, "--prompt-len")) target = &prompt_len;
        else if (!strcmp(a, "--gen") || !strcmp(a, "-n")) { target = &gen; lo = 0; }
        else if (!strcmp(a, "--threads")) { target = &threads; lo = 0; hi = 256; }
        else if (!strcmp(a, "--runs")) { target = &runs; hi = 1000; }
        else return usage("bench: unknown option");
        if (!val || parse_long(val, lo, hi, target)) return usage("bench: bad option value");
        i++;
    }
    if (!weights) weights = needle_default_model_path();
    if (!weights) return cli_no_weights();

    needle_model_params mp = needle_model_default_params();
    mp.n_threads = (int32_t)threads;
    double t0 = now_ms();
    needle_model *m;
    int rc = needle_model_open(weights, &mp, &m);
    if (rc) return lib_error(weights, rc);
    const double load_ms = now_ms() - t0;
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    if ((uint64_t)prompt_len + (uint64_t)gen > info.max_seq_len) {
        needle_model_free(m);
        return usage("bench: --prompt-len + --gen exceed the model's context");
    }
    t0 = now_ms();
    needle_session *s;
    if ((rc = needle_session_create(m, NULL, &s))) {
        needle_model_free(m);
        return lib_error("session", rc);
    }
    const double session_ms = now_ms() - t0;

    int32_t *ids = malloc((size_t)prompt_len * sizeof *ids);
    double *prefill = malloc((size_t)runs * sizeof *prefill);
    double *ttft = malloc((size_t)runs * sizeof *ttft);
    double *decode = malloc((size_t)runs * sizeof *decode);
    if (!ids || !prefill || !ttft || !decode) {
        rc = lib_error("bench", NEEDLE_ERR_OUT_OF_MEMORY);
        goto done;
    }
    uint32_t state = 0x2545F491u;
    for (long i = 0; i < prompt_len; i++) {
        state = state * 1664525u + 1013904223u;
        const uint32_t lo_id = info.vocab > 512 ? 300 : 0;
        ids[i] = i == 0 ? NEEDLE_TOKEN_BOS : (int32_t)(lo_id + (state >> 8) % (info.vocab - lo_id));
    }
    int32_t last = 0;
    /* per-operation profile, summed over the runs: [0] prefill, [1] decode */
    double prof[2][PROFILE_OPS] = {{0}};
    needle_session_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1}, st2 = {.size = sizeof st2};
    for (long r = 0; r < runs; r++) {
        needle_session_reset(s);
        needle_session_get_stats(s, &st0);
        t0 = now_ms();
        if ((rc = needle_session_eval(s, ids, (size_t)prompt_len, NULL, 0))) {
            rc = lib_error("prefill", rc);
            goto done;
        }
        const double t_prefill = now_ms() - t0;
        const float *lg = needle_session_logits(s);
        int32_t tok = 0;
        for (uint32_t v = 1; v < info.vocab; v++)
            if (lg[v] > lg[tok]) tok = (int32_t)v;
        ttft[r] = now_ms() - t0;
        prefill[r] = (double)prompt_len / (t_prefill / 1000.0);
        needle_session_get_stats(s, &st1);
        t0 = now_ms();
        for (long g = 0; g < gen; g++) {
            if ((rc = needle_session_eval(s, &tok, 1, NULL, 0))) {
                rc = lib_error("decode", rc);
                goto done;
            }
            lg = needle_session_logits(s);
            tok = 0;
            for (uint32_t v = 1; v < info.vocab; v++)
                if (lg[v] > lg[tok]) tok = (int32_t)v;
        }
        const double t_decode = now_ms() - t0;
        decode[r] = gen ? (double)gen / (t_decode / 1000.0) : 0.0;
        last = tok;
        needle_session_get_stats(s, &st2);
        profile_add(prof[0], &st0, &st1);
        profile_add(prof[1], &st1, &st2);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double rss_mb = (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
    const double med_prefill = median(prefill, (int)runs), med_ttft = median(ttft, (int)runs);
    const double med_decode = median(decode, (int)runs);
    if (json) {
        printf("{\"weights\":");
        json_string(weights);
        printf(",\"prompt_len\":%ld,\"gen\":%ld,\"runs\":%ld,\"threads\":%ld,"
               "\"load_ms\":%.2f,\"session_ms\":%.2f,\"ttft_ms\":%.2f,\"prefill_tok_s\":%.1f,"
               "\"decode_tok_s\":%.1f,\"peak_rss_mb\":%.1f,\"last_token\":%d",
               prompt_len, gen, runs, threads, load_ms, session_ms, med_ttft,
               med_prefill, med_decode, rss_mb, last);
        /* per-operation ms per run (means over the runs) */
        for (int phase = 0; phase < 2; phase++) {
            printf(",\"profile_%s_ms\":{", phase ? "decode" : "prefill");
            for (int k = 0; k < PROFILE_OPS; k++)
                printf("%s\"%s\":%.3f", k ? "," : "", profile_names[k],
                       prof[phase][k] / (double)runs);
            printf("}");
        }
        printf("}\n");
    } else {
        printf("model      %s (%u layers, d %u, vocab %u)\n", weights, info.num_layers,
               info.d_model, info.vocab);
        if (threads) printf("threads    %ld\n", threads);
        else printf("threads    NEEDLE_THREADS or the online cores\n");
        printf("load       %.1f ms (+ session %.1f ms)\n", load_ms, session_ms);
        printf("ttft       %.1f ms for a %ld-token prompt\n", med_ttft, prompt_len);
        printf("prefill    %.1f tok/s\n", med_prefill);
        printf("decode     %.1f tok/s (%ld tokens)\n", med_decode, gen);
        printf("peak rss   %.1f MiB\n", rss_mb);
        printf("medians of %ld runs\n", runs);
        printf("\nprofile (ms per run, share of the forward pass)\n");
        printf("  %-10s %18s %18s\n", "operation", "prefill", "decode");
        double tot[2] = {0, 0};
        for (int k = 0; k < PROFILE_OPS; k++)
            for (int phase = 0; phase < 2; phase++) tot[phase] += prof[phase][k];
        for (int k = 0; k < PROFILE_OPS; k++) {
            printf("  %-10s", profile_names[k]);
            for (int phase = 0; phase < 2; phase++)
                printf(" %10.2f (%4.1f%%)", prof[phase][k] / (double)runs,
                       tot[phase] > 0 ? 100.0 * prof[phase][k] / tot[phase] : 0.0);
            printf("\n");
        }
    }
done:
    free(ids);
    free(prefill);
    free(ttft);
    free(decode);
    needle_session_free(s);
    needle_model_free(m);
    return rc ? 1 : 0;
}

/* needle devices [--json]: one line per device, then the default backend. Exit 1 if the
 * environment forces a backend that cannot be used. */
static int cmd_devices(int argc, char **argv) {
    int json = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else return usage("devices: unknown option");
    }
    const int n = needle_device_count();
    const char *def = needle_default_backend();
    char err[512];
    snprintf(err, sizeof err, "%s", def ? "" : needle_last_error()); /* next calls clear it */
    if (json) printf("{\"devices\":[");
    for (int i = 0; i < n; i++) {
        needle_device_info d = {.size = sizeof d};
        if (needle_device_get(i, &d) != NEEDLE_OK) continue;
        if (json) {
            printf("%s{\"backend\":", i ? "," : "");
            json_string(d.backend);
            printf(",\"name\":");
            json_string(d.name);
            printf(",\"memory_bytes\":%llu,\"compute_units\":%d,\"capability\":",
                   (unsigned long long)d.memory_bytes, (int)d.compute_units);
            json_string(d.capability);
            printf(",\"default\":%s}", d.is_default ? "true" : "false");
        } else {
            printf("%-6s %s  %.1f GiB  %d compute units  %s%s\n", d.backend, d.name,
                   (double)d.memory_bytes / (1024.0 * 1024.0 * 1024.0), (int)d.compute_units,
                   d.capability, d.is_default ? "  (default)" : "");
        }
    }
    if (json) {
        printf("],\"default_backend\":");
        if (def) json_string(def);
        else printf("null");
        if (!def) {
            printf(",\"error\":");
            json_string(err);
        }
        printf("}\n");
    } else if (def) {
        printf("default backend: %s\n", def);
    } else {
        printf("default backend: none\n");
        fprintf(stderr, "needle: %s\n", err);
    }
    return def ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(NULL);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("needle %s\n", needle_version());
        return 0;
    }
    if (!strcmp(cmd, "bench")) return cmd_bench(argc, argv);
    if (!strcmp(cmd, "devices")) return cmd_devices(argc, argv);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc, argv);
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc) return rc;
    if (!strcmp(cmd, "inspect")) return cmd_inspect(&o);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(&o);
    if (!strcmp(cmd, "generate")) return cmd_generate(&o);
    if (!strcmp(cmd, "logits")) return cmd_logits(&o);
    if (!strcmp(cmd, "run")) return cmd_run(&o);
    if (!strcmp(cmd, "chat")) return cmd_chat(&o);
    fprintf(stderr, "needle: unknown command '%s'\n\n", cmd);
    fputs(usage_text, stderr);
    return 2;
}
