/* eval_data.c: see eval_data.h. */
#include "eval_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compat.h"
#include "util/platform.h"

void eval_dataset_free(eval_dataset *d) {
    for (size_t i = 0; i < d->n; i++) {
        eval_example_free(&d->ex[i]);
        if (d->text) free(d->text[i]);
    }
    free(d->ex);
    free(d->line);
    free(d->text);
    memset(d, 0, sizeof *d);
}

static int blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return 0;
    return 1;
}

/* room for one more example; 0, or 1 when out of memory */
static int grow(eval_dataset *d, int keep_text) {
    if (d->n < d->cap) return 0;
    const size_t cap = d->cap ? 2 * d->cap : 64;
    eval_example *ex = realloc(d->ex, cap * sizeof *ex);
    if (ex) d->ex = ex;
    long *line = realloc(d->line, cap * sizeof *line);
    if (line) d->line = line;
    char **text = keep_text ? realloc(d->text, cap * sizeof *text) : NULL;
    if (text) d->text = text;
    if (!ex || !line || (keep_text && !text)) return 1;
    d->cap = cap;
    return 0;
}

int eval_dataset_read(const char *path, long limit, int skip_bad, int keep_text, eval_dataset *d) {
    memset(d, 0, sizeof *d);
    FILE *f = platform_fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "needle: cannot open %s: %s\n", path, strerror(errno));
        return 1;
    }
    char *buf = NULL, err[256];
    size_t buf_cap = 0;
    ssize_t got;
    long lineno = 0;
    int rc = 0;
    while ((!limit || (long)d->n < limit) && (got = getline(&buf, &buf_cap, f)) >= 0) {
        lineno++;
        if (blank(buf)) continue;
        eval_example ex;
        int bad;
        if (strlen(buf) != (size_t)got) bad = snprintf(err, sizeof err, "holds a NUL byte") > 0;
        else bad = eval_example_parse(buf, &ex, err, sizeof err) != 0;
        if (bad) {
            fprintf(stderr, "needle: %s:%ld: %s%s\n", path, lineno, err, skip_bad ? " (skipped)" : "");
            if (skip_bad) {
                d->skipped++;
                continue;
            }
            rc = 1;
            break;
        }
        char *text = NULL;
        if (grow(d, keep_text) || (keep_text && !(text = strdup(buf)))) {
            eval_example_free(&ex);
            fprintf(stderr, "needle: out of memory reading %s\n", path);
            rc = 1;
            break;
        }
        d->ex[d->n] = ex;
        d->line[d->n] = lineno;
        if (keep_text) d->text[d->n] = text;
        d->n++;
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "needle: cannot read %s: %s\n", path, strerror(errno));
        rc = 1;
    }
    free(buf);
    fclose(f);
    if (rc) eval_dataset_free(d);
    return rc;
}
