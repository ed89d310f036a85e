/* See train_check.h. */
#include "train_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *train_official_python(void) {
    static char path[4096];
    const char *env = getenv("PYTHON_V3");
    if (env && *env) return access(env, X_OK) == 0 ? env : NULL;
    snprintf(path, sizeof path, "%s/tests/reference/.venv3/bin/python", NEEDLE_SOURCE_DIR);
    return access(path, X_OK) == 0 ? path : NULL;
}

cJSON *train_official_read(const char *mode, const char *path) { return train_official_read_arg(mode, path, ""); }

cJSON *train_official_read_arg(const char *mode, const char *path, const char *arg) {
    const char *py = train_official_python();
    if (!py) return NULL;
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "JAX_PLATFORMS=cpu NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1 '%s' '%s/tests/reference/check_train_files.py' %s '%s' %s",
             py, NEEDLE_SOURCE_DIR, mode, path, arg);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t n = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += got;
        if (cap - n < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    const int rc = pclose(p);
    if (!buf) return NULL;
    buf[n] = 0;
    cJSON *j = rc == 0 ? cJSON_Parse(buf) : NULL;
    free(buf);
    return j;
}

const char *train_tmpdir(void) {
    static char dir[512];
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/needle_train_XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(dir);
}

void train_tmpdir_remove(const char *dir) {
    char cmd[600];
    if (!dir || !strstr(dir, "needle_train_")) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}
