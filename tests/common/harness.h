/* Minimal test harness shared by every tests/test_*.c.
 *
 * A test file defines `static void test_x(void)` functions and a main() that calls
 * RUN(test_x) for each and returns test_summary(). CHECK* record a failure with file and
 * line and keep going, so one run reports every broken case.
 *
 * A test that runs no check fails, unless it called harness_skip() with the reason it
 * could not run (no device, no fixture): then it is counted as skipped, never as passed.
 * An executable whose tests were all skipped exits with HARNESS_SKIP_EXIT, which ctest
 * reports as "Skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt).
 *
 * NEEDLE_TEST_FILTER=a,b runs only the tests whose function name contains "a" or "b"
 * (e.g. the thread-pool tests of test_simd in the ThreadSanitizer build); a filter that
 * selects no test fails. Setup done inside a RUN test is skipped with it, so filter only
 * executables whose tests stand alone. */
#ifndef NEEDLE_TEST_HARNESS_H
#define NEEDLE_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int harness_failures;   /* failed checks in the current test */
extern int harness_checks;

void harness_fail(const char *file, int line, const char *fmt, ...);
void harness_run(const char *name, void (*fn)(void));
/* Marks the running test as skipped, with a reason; checks it ran still count. */
void harness_skip(const char *reason);
#define HARNESS_SKIP_EXIT 77
int test_summary(void);

/* Directory of the committed fixtures (env NEEDLE_FIXTURES, else "tests/fixtures"). */
const char *fixture_dir(void);
/* "<fixture_dir>/<name>" in a static buffer rotated over 8 slots. */
const char *fixture_path(const char *name);
/* Reads a whole file; returns malloc'd bytes (NUL-terminated) or NULL. */
uint8_t *read_file(const char *path, size_t *size);

/* The `needle` CLI to run (env NEEDLE_CLI, else "./needle"). */
const char *cli_path(void);
/* Runs a shell command; returns its exit status (-1 if it did not exit normally) and
 * captures stdout into `out` (NUL-terminated, truncated to cap - 1), or discards it when
 * out is NULL. */
int run_command(const char *cmd, char *out, size_t cap);

#define RUN(fn) harness_run(#fn, fn)
#define CHECK(cond) do { harness_checks++; if (!(cond)) harness_fail(__FILE__, __LINE__, "%s", #cond); } while (0)
#define CHECK_MSG(cond, ...) do { harness_checks++; if (!(cond)) harness_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)
#define CHECK_EQ_INT(a, b) do { long long va_ = (long long)(a), vb_ = (long long)(b); harness_checks++; \
    if (va_ != vb_) harness_fail(__FILE__, __LINE__, "%s == %s (%lld vs %lld)", #a, #b, va_, vb_); } while (0)

#endif
