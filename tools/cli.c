/* cli.c: the pieces every `needle` command shares (see cli.h). */
#include "cli.h"
#include "util/platform.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int cli_usage_error(const cli_command *cmd, const char *fmt, ...) {
    fprintf(stderr, "needle %s: ", cmd->name);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see `needle help %s`)\n", cmd->name);
    return 2;
}

int cli_lib_error(const char *what, int status) {
    const char *msg = needle_last_error();
    fprintf(stderr, "needle: %s: %s%s%s\n", what, needle_status_string(status),
            *msg ? ": " : "", msg);
    return 1;
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Stores `val` for option `o`; returns 0, or 2 after reporting a bad value. */
static int set_value(const cli_command *cmd, const cli_option *o, const char *val) {
    char *end;
    switch (o->kind) {
    case CLI_TEXT:
        *(const char **)o->target = val;
        return 0;
    case CLI_LONG:
        if (parse_long(val, o->lo, o->hi, (long *)o->target) == 0) return 0;
        return cli_usage_error(cmd, "%s takes an integer from %ld to %ld, not '%s'", o->name,
                               o->lo, o->hi, val);
    case CLI_REAL: {
        const double v = strtod(val, &end);
        if (end != val && !*end && v >= 0) { /* also refuses NaN */
            *(double *)o->target = v;
            return 0;
        }
        return cli_usage_error(cmd, "%s takes a number >= 0, not '%s'", o->name, val);
    }
    case CLI_U64: {
        errno = 0;
        const unsigned long long v = strtoull(val, &end, 10);
        if (!errno && end != val && !*end && val[0] != '-') {
            *(unsigned long long *)o->target = v;
            return 0;
        }
        return cli_usage_error(cmd, "%s takes an unsigned integer, not '%s'", o->name,
                               val);
    }
    case CLI_KV: {
        int *kv = o->target;
        if (!strcmp(val, "f32")) *kv = NEEDLE_KV_F32;
        else if (!strcmp(val, "f16")) *kv = NEEDLE_KV_F16;
        else if (!strcmp(val, "int8")) *kv = NEEDLE_KV_INT8;
        else return cli_usage_error(cmd, "%s takes f32, f16 or int8, not '%s'", o->name, val);
        return 0;
    }
    case CLI_FLAG:
        break;
    }
    return cli_usage_error(cmd, "internal: option %s has no value kind", o->name);
}

int cli_parse(const cli_command *cmd, int argc, char **argv, const cli_option *opts,
              const char **positional, int n_positional) {
    int n_pos = 0, options_done = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (options_done || a[0] != '-' || !a[1]) {
            if (n_pos == n_positional)
                return cli_usage_error(cmd, "unexpected argument '%s'", a);
            positional[n_pos++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            options_done = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(cmd->usage, stdout);
            return 0;
        }
        const cli_option *o = opts;
        while (o->name && strcmp(a, o->name) && !(o->alias && !strcmp(a, o->alias))) o++;
        if (!o->name) return cli_usage_error(cmd, "unknown option '%s'", a);
        if (o->given) *o->given = 1;
        if (o->kind == CLI_FLAG) {
            *(int *)o->target = 1;
            continue;
        }
        if (i + 1 >= argc) return cli_usage_error(cmd, "%s needs a value", a);
        const int rc = set_value(cmd, o, argv[++i]);
        if (rc) return rc;
    }
    return CLI_GO;
}

int cli_no_weights(void) {
    /* the same places needle_default_model_path() looks, in its order */
    const char *env = getenv("NEEDLE_MODEL");
    const char *what[2] = {"the installed demo model", "the source tree's demo model"};
    if (env && env[0]) {
        fprintf(stderr, "needle: no model found: $NEEDLE_MODEL names %s: %s\n"
                        "  (when set, it is the only place looked; give a model with --weights"
                        " FILE)\n", env, strerror(access(env, R_OK) == 0 ? 0 : errno));
        return 2;
    }
    fprintf(stderr, "needle: no model found; give one with --weights FILE or $NEEDLE_MODEL."
                    " Tried:\n  $NEEDLE_MODEL: %s\n", env ? "set but empty" : "not set");
    const char *path;
    for (int i = 0; (path = needle_default_model_candidate(i)) != NULL; i++)
        fprintf(stderr, "  %s, %s: %s\n", i < 2 ? what[i] : "a demo model", path,
                access(path, R_OK) == 0 ? "readable" : strerror(errno));
    return 2;
}

int cli_is_demo_model(const char *path) {
    /* the same file, however it is named (models/needle-demo.cact, an absolute path) */
    struct stat st, demo_st;
    if (stat(path, &st) != 0) return 0;
    const char *demo;
    for (int i = 0; (demo = needle_default_model_candidate(i)) != NULL; i++)
        if (stat(demo, &demo_st) == 0 && demo_st.st_dev == st.st_dev &&
            demo_st.st_ino == st.st_ino)
            return 1;
    return 0;
}

int cli_default_weights(const char **weights) {
    if (*weights) return 0;
    *weights = needle_default_model_path();
    if (!*weights) return 0;
    /* NEEDLE_MODEL is taken as given; one naming no readable file counts as no model */
    if (access(*weights, R_OK) != 0) *weights = NULL;
    if (*weights && isatty(STDERR_FILENO)) {
        /* a person at a terminal learns which model answered, and where the real one is */
        const char *env = getenv("NEEDLE_MODEL");
        if (env && env[0]) fprintf(stderr, "[model: %s, from $NEEDLE_MODEL]\n", *weights);
        else if (cli_is_demo_model(*weights))
            fprintf(stderr, "[model: the small demo model %s; `needle download needle3` fetches "
                            "the real Needle 3, the default once cached]\n", *weights);
        else fprintf(stderr, "[model: %s]\n", *weights);
    }
    return *weights != NULL;
}

int cli_session_create(const needle_model *m, const cli_session_options *so,
                       needle_session **out) {
    needle_session_params sp = needle_session_default_params();
    sp.kv_window = (int32_t)so->window;
    sp.n_ctx = (uint32_t)so->n_ctx;
    sp.n_sinks = (uint32_t)so->sinks;
    sp.kv_type = so->kv_type;
    if (so->a8) sp.activations = NEEDLE_ACT_A8;
    const int rc = needle_session_create(m, &sp, out);
    return rc ? cli_lib_error("session", rc) : 0;
}

int cli_prefill_progress(void *user, uint32_t done, uint32_t total) {
    (void)user;
    if (total < CLI_PROGRESS_MIN_TOKENS) return 0;
    if (done < total) fprintf(stderr, "\r[prefill %u/%u tokens]", done, total);
    else fprintf(stderr, "\r\033[K");
    fflush(stderr);
    return 0;
}

void cli_show_progress(needle_session *s) {
    if (!isatty(STDERR_FILENO)) return;
    needle_callbacks cb = {sizeof cb, NULL, cli_prefill_progress, NULL};
    needle_session_set_callbacks(s, &cb);
}

double cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void cli_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

unsigned long long cli_sampling_seed(unsigned long long seed, int seed_given,
                                     double temperature) {
    if (seed_given || !(temperature > 0)) return seed;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = ((unsigned long long)ts.tv_sec * 1000000007ULL) ^ (unsigned long long)ts.tv_nsec ^
           ((unsigned long long)getpid() << 32);
    fprintf(stderr, "[sampling with --seed %llu]\n", seed);
    return seed;
}

#if defined(NEEDLE_DOWNLOAD_EXEC) || defined(NEEDLE_SERVE_EXEC) /* POSIX exec; not on Windows */
int cli_exec_helper(const char *helper, const char *command, char **argv) {
    char self[4096], path[8192];
    const char *dir_of = NULL;
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        dir_of = self;
    } else if (strchr(argv[0], '/') && strlen(argv[0]) < sizeof self) {
        dir_of = strcpy(self, argv[0]);
    }
    const char *slash = dir_of ? strrchr(dir_of, '/') : NULL;
    fflush(NULL);
    /* never a helper of another build from PATH when this one's folder is known */
    if (slash) {
        snprintf(path, sizeof path, "%.*s/%s", (int)(slash - dir_of), dir_of, helper);
        argv[0] = path;
        execv(path, argv);
    } else {
        argv[0] = (char *)helper;
        execvp(helper, argv);
    }
    fprintf(stderr, "needle %s: cannot run %s: %s (it is the %s executable, built and "
            "installed beside needle)\n", command, argv[0], strerror(errno), helper);
    return 1;
}
#endif

uint8_t *cli_read_file(const char *path, size_t *size) {
    FILE *f = platform_fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "needle: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap + 1);
    while (buf) {
        const size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        uint8_t *nb = cap <= SIZE_MAX / 4 ? realloc(buf, 2 * cap + 1) : NULL;
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    const int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "needle: cannot read %s%s\n", path, buf ? "" : " (out of memory)");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *size = n;
    return buf;
}

int cli_write_file_atomically(const char *path, const uint8_t *data, size_t size) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        fprintf(stderr, "needle: output path too long\n");
        return 1;
    }
    FILE *f = platform_fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "needle: cannot create %s: %s\n", tmp, strerror(errno));
        return 1;
    }
    const int ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok || platform_replace_file(tmp, path) != 0) {
        fprintf(stderr, "needle: cannot write %s: %s\n", path, strerror(errno));
        platform_remove(tmp);
        return 1;
    }
    return 0;
}
