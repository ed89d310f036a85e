/* needle: the command-line tool. Uses only the public header.
 *
 *   needle inspect FILE
 *   needle tokenize --weights FILE "text"
 *   needle generate --weights FILE --prompt TEXT [-n N] [--temperature T --seed S]
 *   needle logits --weights FILE --tokens 2,17,99 --out logits.f32 [--incremental] [--sink N]
 *
 * Exit status: 0 on success, 1 on a library error (message on stderr), 2 on bad usage. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    "\n"
    "common options:\n"
    "  --kv f32|f16|int8                  KV cache precision (default f32)\n"
    "  --window N                         sliding window (default: the file's kv_window)\n";

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
    const char *weights, *prompt, *tokens, *out, *text;
    long n_new;
    double temperature;
    unsigned long long seed;
    int incremental;
    long sinks;
    long window;
    int kv_type;
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
        else if (!strcmp(a, "--out") || !strcmp(a, "-o")) { NEED_VALUE(); o->out = val; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens")) {
            NEED_VALUE();
            if (parse_long(val, 0, 1 << 24, &o->n_new)) return usage("bad -n value");
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
        } else if (!strcmp(a, "--incremental")) {
            o->incremental = 1;
        } else if (!strcmp(a, "--sink")) {
            NEED_VALUE();
            if (parse_long(val, 0, 1 << 24, &o->sinks)) return usage("bad --sink value");
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
    return 0;
}

static int open_model(const options *o, needle_model **m) {
    if (!o->weights) return usage("--weights FILE is required");
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
    needle_model_info in;
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
        needle_tensor_info t;
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
    needle_model_info info;
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
    needle_model_info info;
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
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc) return rc;
    if (!strcmp(cmd, "inspect")) return cmd_inspect(&o);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(&o);
    if (!strcmp(cmd, "generate")) return cmd_generate(&o);
    if (!strcmp(cmd, "logits")) return cmd_logits(&o);
    fprintf(stderr, "needle: unknown command '%s'\n\n", cmd);
    fputs(usage_text, stderr);
    return 2;
}
