/* The `needle` command-line tool end to end (NEEDLE_CLI names the binary): inspect lists
 * every tensor, tokenize prints the library's ids, logits writes exactly the logits the
 * API computes (prefill and --incremental), generate is deterministic and equals the API's
 * greedy continuation, and bad usage or bad files give the documented exit codes. */
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "needle.h"

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

static void test_fixture_present(void) {
    CHECK_MSG(pick_model() == 0, "no tiny_*.cact fixture in %s", fixture_dir());
}

int main(void) {
    RUN(test_fixture_present);
    if (!model_path[0]) return test_summary();
    RUN(test_inspect);
    RUN(test_tokenize_matches_library);
    RUN(test_logits_match_library);
    RUN(test_generate_deterministic);
    RUN(test_errors_and_usage);
    return test_summary();
}
