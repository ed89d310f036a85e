/* Backend selection (src/backend, needle.h "Backends and devices"): the default is the
 * first compiled-in backend that finds a device (the CPU without a GPU); NEEDLE_BACKEND, JAX_PLATFORM_NAME and needle_model_params.backend force one; a
 * forced backend that is unknown, not built in or without a device fails the open with
 * NEEDLE_ERR_BACKEND and a message naming the available ones (never a silent fallback);
 * the device listing; `needle devices`. Env vars are set in-process. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "harness.h"
#include "needle.h"

/* Whether backend `name` is compiled in / compiled in and finds a device here. The
 * expectations below depend on the build (-DNEEDLE_CUDA, -DNEEDLE_METAL) and the machine. */
static int built(const char *name) { return backend_find(name) != NULL; }

static int usable(const char *name) {
    const needle_backend_impl *b = backend_find(name);
    return b && b->probe() && b->device_count() > 0;
}

/* The backend auto selection picks here: the first compiled-in one with a device. */
static const char *auto_backend(void) {
    size_t n = 0;
    const needle_backend_impl *const *t = backend_table(&n);
    for (size_t i = 0; i < n; i++)
        if (t[i]->probe() && t[i]->device_count() > 0) return t[i]->name;
    return "none";
}

static void clear_env(void) {
    unsetenv("NEEDLE_BACKEND");
    unsetenv("JAX_PLATFORMS");
    unsetenv("JAX_PLATFORM_NAME");
}

/* Opens the tiny fixture with `backend` (NULL = default params); returns the status and
 * stores the model's backend name (or "") in `name`. */
static int open_with(const char *backend, char *name, size_t cap) {
    needle_model_params p = needle_model_default_params();
    p.backend = backend;
    needle_model *m = NULL;
    int rc = needle_model_open(fixture_path("tiny_cq2.cact"), &p, &m);
    name[0] = '\0';
    if (rc == NEEDLE_OK) {
        const char *b = needle_model_backend(m);
        snprintf(name, cap, "%s", b ? b : "(null)");
        /* sessions take their kernels from the model's backend */
        needle_session *s = NULL;
        CHECK_EQ_INT(needle_session_create(m, NULL, &s), NEEDLE_OK);
        int32_t tok[2] = {NEEDLE_TOKEN_BOS, 5};
        CHECK_EQ_INT(needle_session_eval(s, tok, 2, NULL, 0), NEEDLE_OK);
        CHECK(needle_session_logits(s) != NULL);
        needle_session_free(s);
        needle_model_free(m);
    } else {
        CHECK(m == NULL);
    }
    return rc;
}

/* The open fails with NEEDLE_ERR_BACKEND and a message holding every `needles` string. */
static void expect_backend_error(const char *backend, const char *what) {
    char name[32];
    int rc = open_with(backend, name, sizeof name);
    CHECK_MSG(rc == NEEDLE_ERR_BACKEND, "%s: status %d", what, rc);
    const char *msg = needle_last_error();
    CHECK_MSG(strstr(msg, "available: ") != NULL && strstr(msg, "cpu") != NULL,
              "%s: message '%s'", what, msg);
}

static void test_default_is_first_usable(void) {
    clear_env();
    const char *want = auto_backend();
    if (!usable("cuda") && !usable("metal")) CHECK(!strcmp(want, "cpu"));
    char name[32];
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    CHECK_MSG(!strcmp(name, want), "backend '%s'", name);
    CHECK_EQ_INT(open_with("", name, sizeof name), NEEDLE_OK);
    CHECK_MSG(!strcmp(name, want), "backend '%s'", name);
    /* NULL params are the defaults */
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open(fixture_path("tiny_cq2.cact"), NULL, &m), NEEDLE_OK);
    const char *b = needle_model_backend(m);
    CHECK(b && !strcmp(b, want));
    needle_model_free(m);
    CHECK(needle_model_backend(NULL) == NULL);
    b = needle_default_backend();
    CHECK(b && !strcmp(b, want));
}

static void test_needle_backend_env(void) {
    clear_env();
    char name[32];
    setenv("NEEDLE_BACKEND", "cpu", 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    CHECK(!strcmp(name, "cpu"));
    setenv("NEEDLE_BACKEND", "CPU", 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);

    /* a GPU backend: used if it finds a device, else a clear error (never the CPU) */
    const char *gpus[] = {"cuda", "metal"};
    for (size_t g = 0; g < 2; g++) {
        setenv("NEEDLE_BACKEND", gpus[g], 1);
        if (usable(gpus[g])) {
            CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
            CHECK(!strcmp(name, gpus[g]));
            continue;
        }
        expect_backend_error(NULL, gpus[g]);
        char quoted[16];
        snprintf(quoted, sizeof quoted, "\"%s\"", gpus[g]);
        CHECK(strstr(needle_last_error(), quoted) != NULL);
        CHECK(strstr(needle_last_error(), "NEEDLE_BACKEND") != NULL);
        CHECK(strstr(needle_last_error(), built(gpus[g]) ? "found no device"
                                                         : "not built into this library"));
        CHECK(needle_default_backend() == NULL);
        CHECK(strstr(needle_last_error(), "available: ") != NULL);
    }

    setenv("NEEDLE_BACKEND", "tpu", 1);
    expect_backend_error(NULL, "NEEDLE_BACKEND=tpu");
    CHECK(strstr(needle_last_error(), "unknown backend \"tpu\"") != NULL);

    /* the same through the blob entry point */
    setenv("NEEDLE_BACKEND", usable("cuda") ? "tpu" : "cuda", 1);
    size_t size = 0;
    uint8_t *blob = read_file(fixture_path("tiny_cq2.cact"), &size);
    CHECK(blob != NULL);
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open_blob(blob, size, NULL, &m), NEEDLE_ERR_BACKEND);
    CHECK(m == NULL);
    free(blob);
    clear_env();
}

static void test_jax_platform_env(void) {
    clear_env();
    char name[32];
    setenv("JAX_PLATFORM_NAME", "cpu", 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    CHECK(!strcmp(name, "cpu"));
    CHECK(needle_default_backend() && !strcmp(needle_default_backend(), "cpu"));

    setenv("JAX_PLATFORM_NAME", "gpu", 1);
    if (usable("cuda")) {
        CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
        CHECK(!strcmp(name, "cuda"));
    } else {
        expect_backend_error(NULL, "JAX_PLATFORM_NAME=gpu");
        CHECK(strstr(needle_last_error(), "\"cuda\"") != NULL);
        CHECK(strstr(needle_last_error(), "JAX_PLATFORM_NAME=gpu") != NULL);
    }

    /* NEEDLE_BACKEND wins over JAX_PLATFORM_NAME */
    setenv("NEEDLE_BACKEND", "cpu", 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    clear_env();
}

/* JAX_PLATFORMS (JAX's current name) is a list tried in order; it comes after
 * NEEDLE_BACKEND and before JAX_PLATFORM_NAME. */
static void test_jax_platforms_env(void) {
    clear_env();
    char name[32];
    setenv("JAX_PLATFORMS", "cpu", 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    CHECK(!strcmp(name, "cpu"));
    setenv("JAX_PLATFORMS", "cuda,cpu", 1); /* falls back like JAX does */
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    CHECK(!strcmp(name, usable("cuda") ? "cuda" : "cpu"));
    setenv("JAX_PLATFORMS", "tpu", 1);
    expect_backend_error(NULL, "JAX_PLATFORMS=tpu");
    CHECK(strstr(needle_last_error(), "JAX_PLATFORMS=tpu") != NULL);
    if (!usable("cuda")) {
        setenv("JAX_PLATFORMS", "gpu", 1);
        expect_backend_error(NULL, "JAX_PLATFORMS=gpu");
    }
    setenv("JAX_PLATFORM_NAME", "tpu", 1); /* JAX_PLATFORMS wins over the old name */
    setenv("JAX_PLATFORMS", "cpu", 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    setenv("NEEDLE_BACKEND", "cpu", 1); /* and NEEDLE_BACKEND over both */
    setenv("JAX_PLATFORMS", "tpu", 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    clear_env();
}

/* Bad NEEDLE_CPU / NEEDLE_THREADS values fail the open with a message naming them, as a
 * bad NEEDLE_BACKEND does, instead of being ignored. */
static void test_cpu_env_is_checked(void) {
    clear_env();
    const char *cpu = getenv("NEEDLE_CPU"), *threads = getenv("NEEDLE_THREADS");
    char *saved_cpu = cpu ? strdup(cpu) : NULL, *saved_threads = threads ? strdup(threads) : NULL;
    char name[32];
    const struct { const char *var, *value; int status; } cases[] = {
        {"NEEDLE_CPU", "avx1024", NEEDLE_ERR_BACKEND},
        {"NEEDLE_CPU", "Scalar ", NEEDLE_ERR_BACKEND},
        {"NEEDLE_THREADS", "four", NEEDLE_ERR_INVALID_ARGUMENT},
        {"NEEDLE_THREADS", "0", NEEDLE_ERR_INVALID_ARGUMENT},
        {"NEEDLE_THREADS", "-2", NEEDLE_ERR_INVALID_ARGUMENT},
        {"NEEDLE_THREADS", "3x", NEEDLE_ERR_INVALID_ARGUMENT},
    };
    unsetenv("NEEDLE_CPU");
    unsetenv("NEEDLE_THREADS");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv(cases[i].var, cases[i].value, 1);
        CHECK_EQ_INT(open_with(NULL, name, sizeof name), cases[i].status);
        CHECK_MSG(strstr(needle_last_error(), cases[i].var) != NULL, "%s=%s: '%s'",
                  cases[i].var, cases[i].value, needle_last_error());
        unsetenv(cases[i].var);
    }
    /* a level this machine lacks (NEON on x86-64, AVX2 on ARM) is refused too */
    const char *other = cpu_kernels_named("avx2") ? "neon" : "avx2";
    setenv("NEEDLE_CPU", other, 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_ERR_BACKEND);
    setenv("NEEDLE_CPU", "scalar", 1);
    setenv("NEEDLE_THREADS", "2", 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    setenv("NEEDLE_CPU", "", 1); /* empty = unset */
    setenv("NEEDLE_THREADS", "", 1);
    CHECK_EQ_INT(open_with(NULL, name, sizeof name), NEEDLE_OK);
    if (saved_cpu) setenv("NEEDLE_CPU", saved_cpu, 1); else unsetenv("NEEDLE_CPU");
    if (saved_threads) setenv("NEEDLE_THREADS", saved_threads, 1); else unsetenv("NEEDLE_THREADS");
    free(saved_cpu);
    free(saved_threads);
}

static void test_explicit_overrides_env(void) {
    clear_env();
    char name[32];
    setenv("NEEDLE_BACKEND", "cuda", 1);
    setenv("JAX_PLATFORM_NAME", "gpu", 1);
    CHECK_EQ_INT(open_with("cpu", name, sizeof name), NEEDLE_OK);
    CHECK(!strcmp(name, "cpu"));
    clear_env();
    setenv("NEEDLE_BACKEND", "cpu", 1);
    if (!usable("cuda")) {
        expect_backend_error("cuda", "params.backend=cuda");
        CHECK(strstr(needle_last_error(), built("cuda") ? "found no device"
                                                        : "not built into this library") != NULL);
    }
    if (!usable("metal")) expect_backend_error("metal", "params.backend=metal");
    expect_backend_error("tpu", "params.backend=tpu");
    clear_env();
}

static void test_devices(void) {
    clear_env();
    int n = needle_device_count();
    CHECK(n >= 1);
    int defaults = 0, cpus = 0;
    for (int i = 0; i < n; i++) {
        needle_device_info d = {.size = sizeof d};
        CHECK_EQ_INT(needle_device_get(i, &d), NEEDLE_OK);
        CHECK(d.name[0] != '\0');
        CHECK(d.capability[0] != '\0');
        defaults += d.is_default;
        if (!strcmp(d.backend, "cpu")) {
            cpus++;
            CHECK(d.is_default == !strcmp(auto_backend(), "cpu"));
            CHECK(d.compute_units >= 1);
            CHECK(d.memory_bytes > 0);
            CHECK(!strcmp(d.capability, "scalar") || !strcmp(d.capability, "avx2") ||
                  !strcmp(d.capability, "avx512") || !strcmp(d.capability, "amx") ||
                  !strcmp(d.capability, "neon") ||
                  !strcmp(d.capability, "simd128"));
        }
    }
    CHECK_EQ_INT(defaults, 1);
    CHECK_EQ_INT(cpus, 1);
    needle_device_info d = {.size = sizeof d};
    CHECK_EQ_INT(needle_device_get(n, &d), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(needle_device_get(-1, &d), NEEDLE_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(needle_device_get(0, NULL), NEEDLE_ERR_INVALID_ARGUMENT);
    /* with an unusable forced backend nothing is the default, and the listing still works */
    setenv("NEEDLE_BACKEND", "tpu", 1);
    CHECK_EQ_INT(needle_device_get(0, &d), NEEDLE_OK);
    CHECK_EQ_INT(d.is_default, 0);
    clear_env();
}

/* `needle devices` end to end (NEEDLE_CLI names the binary; skipped without it). */
static void test_cli_devices(void) {
    clear_env();
    const char *cli = getenv("NEEDLE_CLI");
    if (!cli || !*cli) return;
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' devices --json 2>&1", cli);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    CHECK_EQ_INT(pclose(p), 0);
    char want[64];
    snprintf(want, sizeof want, "\"default_backend\":\"%s\"", auto_backend());
    CHECK_MSG(strstr(out, "\"backend\":\"cpu\"") && strstr(out, "\"default\":true") &&
              strstr(out, want), "output: %s", out);

    if (usable("metal")) return;
    snprintf(cmd, sizeof cmd, "NEEDLE_BACKEND=metal '%s' devices 2>&1", cli);
    p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    CHECK(pclose(p) != 0);
    CHECK_MSG(strstr(out, "\"metal\"") && strstr(out, "available: "), "output: %s", out);
}

int main(void) {
    RUN(test_default_is_first_usable);
    RUN(test_needle_backend_env);
    RUN(test_jax_platform_env);
    RUN(test_jax_platforms_env);
    RUN(test_cpu_env_is_checked);
    RUN(test_explicit_overrides_env);
    RUN(test_devices);
    RUN(test_cli_devices);
    return test_summary();
}
