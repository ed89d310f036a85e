/* See harness.h. Prints one line per test and a closing "N passed, N failed" line. */
#include "harness.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#if !defined(__wasi__) && !defined(_WIN32)
#include <sys/wait.h>
#endif

int harness_failures;
int harness_checks;
static int tests_passed, tests_failed, tests_skipped, tests_filtered;
static const char *skip_reason; /* set by harness_skip() inside the running test */

void harness_skip(const char *reason) { skip_reason = reason; }

void harness_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    harness_failures++;
    if (harness_failures > 20) return; /* keep logs readable */
    fprintf(stderr, "  FAIL %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* Whether NEEDLE_TEST_FILTER (comma-separated substrings) is unset or names `name`. */
static int selected(const char *name) {
    const char *f = getenv("NEEDLE_TEST_FILTER");
    if (!f || !*f) return 1;
    while (*f) {
        const size_t len = strcspn(f, ",");
        for (const char *p = name; len && *p; p++)
            if (!strncmp(p, f, len)) return 1;
        f += len + (f[len] == ',');
    }
    return 0;
}

void harness_run(const char *name, void (*fn)(void)) {
    if (!selected(name)) {
        tests_filtered++;
        printf("---- %s (not selected by NEEDLE_TEST_FILTER)\n", name);
        return;
    }
    harness_failures = 0;
    harness_checks = 0;
    skip_reason = NULL;
    fn();
    if (!harness_failures && skip_reason) {
        tests_skipped++;
        printf("skip %s: %s (%d checks)\n", name, skip_reason, harness_checks);
    } else if (!harness_failures && harness_checks == 0) {
        /* a test that checked nothing proved nothing: it must say why (harness_skip) */
        tests_failed++;
        printf("FAIL %s (0 checks and no skip reason)\n", name);
    } else if (harness_failures) {
        tests_failed++;
        printf("FAIL %s (%d of %d checks failed)\n", name, harness_failures, harness_checks);
    } else {
        tests_passed++;
        printf("ok   %s (%d checks)\n", name, harness_checks);
    }
    fflush(stdout);
}

int test_summary(void) {
    printf("%d passed, %d failed, %d skipped", tests_passed, tests_failed, tests_skipped);
    if (tests_filtered) printf(", %d not selected", tests_filtered);
    printf("\n");
    if (tests_failed) return 1;
    if (tests_filtered && !tests_passed && !tests_skipped) {
        printf("NEEDLE_TEST_FILTER=%s selected no test\n", getenv("NEEDLE_TEST_FILTER"));
        return 1;
    }
    /* Nothing ran but skips: the whole executable is reported as skipped to ctest. */
    return tests_passed == 0 && tests_skipped > 0 ? HARNESS_SKIP_EXIT : 0;
}

const char *fixture_dir(void) {
    const char *d = getenv("NEEDLE_FIXTURES");
    return d && *d ? d : "tests/fixtures";
}

const char *fixture_path(const char *name) {
    static char slots[8][1024];
    static int next;
    char *p = slots[next++ & 7];
    snprintf(p, sizeof slots[0], "%s/%s", fixture_dir(), name);
    return p;
}

uint8_t *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0) { fclose(f); return NULL; }
    rewind(f);
    uint8_t *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = 0; if (size) *size = (size_t)n; }
    return buf;
}

const char *cli_path(void) {
    const char *p = getenv("NEEDLE_CLI");
    return p && *p ? p : "./needle";
}

int run_command(const char *cmd, char *out, size_t cap) {
#ifdef __wasi__
    /* WASI has no processes: a test that runs the CLI fails here, visibly (the WASI build
     * runs the CLI from ctest instead, tests/platform/wasi.cmake) */
    (void)cmd;
    if (out && cap) out[0] = 0;
    return -1;
#else
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = 0;
    if (out && cap) {
        n = fread(out, 1, cap - 1, p);
        out[n] = 0;
    }
    /* Read to the end whatever did not fit: a child blocked on a full pipe would never
     * exit, and pclose would wait for it forever. */
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int status = pclose(p);
#ifdef _WIN32
    return status; /* the command's exit code itself */
#else
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
#endif
#endif
}
