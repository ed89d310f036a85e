/* The backend table, the CPU backend entry, the selection rule (backend.h) and the public
 * device queries of needle.h. */
#include "backend/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/error.h"
#include "util/platform.h"
#include "util/struct_size.h"

/* ------------------------------------------------------------------------------------ */
/* CPU                                                                                   */

static char cpu_model_name[128];
static pthread_once_t cpu_name_once = PTHREAD_ONCE_INIT;

static void trim_copy(char *dst, size_t cap, const char *src) {
    while (*src == ' ' || *src == '\t') src++;
    size_t n = strlen(src);
    while (n && (src[n - 1] == '\n' || src[n - 1] == '\r' || src[n - 1] == ' ' || src[n - 1] == '\t'))
        n--;
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void read_cpu_name(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            char *colon = strchr(line, ':');
            if (!colon) continue;
            size_t klen = (size_t)(colon - line);
            while (klen && (line[klen - 1] == ' ' || line[klen - 1] == '\t')) klen--;
            /* x86: "model name"; some ARM kernels: "Model" or "Hardware" */
            if ((klen == 10 && !strncmp(line, "model name", 10)) ||
                (klen == 5 && !strncmp(line, "Model", 5)) ||
                (klen == 8 && !strncmp(line, "Hardware", 8))) {
                trim_copy(cpu_model_name, sizeof cpu_model_name, colon + 1);
                if (cpu_model_name[0]) break;
            }
        }
        fclose(f);
    }
    if (!cpu_model_name[0]) {
        char machine[64];
        platform_machine_name(machine, sizeof machine);
        trim_copy(cpu_model_name, sizeof cpu_model_name, machine);
    }
    if (!cpu_model_name[0]) trim_copy(cpu_model_name, sizeof cpu_model_name, "cpu");
}

static int cpu_probe(void) { return 1; }
static int cpu_device_count(void) { return 1; }

static int cpu_device_info(int index, needle_device_info *out) {
    if (index != 0 || !out) return NEEDLE_ERR_INVALID_ARGUMENT;
    pthread_once(&cpu_name_once, read_cpu_name);
    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "cpu");
    snprintf(out->name, sizeof out->name, "%s", cpu_model_name);
    out->memory_bytes = platform_memory_bytes();
    out->compute_units = platform_cpu_count();
    snprintf(out->capability, sizeof out->capability, "%s", cpu_kernels_best()->name);
    return NEEDLE_OK;
}

static const needle_backend_impl cpu_backend = {
    .name = "cpu",
    .probe = cpu_probe,
    .device_count = cpu_device_count,
    .device_info = cpu_device_info,
    .ops = &cpu_backend_ops,
};

/* ------------------------------------------------------------------------------------ */
/* The table                                                                             */

#ifdef NEEDLE_CUDA
extern const needle_backend_impl cuda_backend;
#endif
#ifdef NEEDLE_METAL
extern const needle_backend_impl metal_backend;
#endif

static const needle_backend_impl *const table[] = {
#ifdef NEEDLE_CUDA
    &cuda_backend,
#endif
#ifdef NEEDLE_METAL
    &metal_backend,
#endif
    &cpu_backend, /* always last: the fallback of auto selection */
};

#define N_BACKENDS (sizeof table / sizeof table[0])

/* Every backend name the project knows, built in or not. */
static const char *const known[] = {"cpu", "cuda", "metal"};

const needle_backend_impl *const *backend_table(size_t *n) {
    if (n) *n = N_BACKENDS;
    return table;
}

const needle_backend_impl *backend_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (!strcasecmp(table[i]->name, name)) return table[i];
    return NULL;
}

/* "cpu" or "cuda, cpu": the compiled-in backends that find a device. */
static void available_list(char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_BACKENDS; i++) {
        if (!table[i]->probe()) continue;
        int w = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", table[i]->name);
        if (w < 0 || (size_t)w >= cap - used) break;
        used += (size_t)w;
    }
    if (!used) snprintf(buf, cap, "none");
}

/* Resolves a forced name; `source` says where it came from (for the message). */
static int force(const char *name, const char *source, const needle_backend_impl **out) {
    char avail[64];
    available_list(avail, sizeof avail);
    int is_known = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcasecmp(known[i], name)) is_known = 1;
    if (!is_known)
        return needle_fail(NEEDLE_ERR_BACKEND, "unknown backend \"%s\"%s (known: cpu, cuda, "
                           "metal; available: %s)", name, source, avail);
    const needle_backend_impl *b = backend_find(name);
    if (!b)
        return needle_fail(NEEDLE_ERR_BACKEND, "backend \"%s\"%s is not built into this "
                           "library (available: %s)", name, source, avail);
    if (!b->probe() || b->device_count() <= 0)
        return needle_fail(NEEDLE_ERR_BACKEND, "backend \"%s\"%s found no device "
                           "(available: %s)", name, source, avail);
    *out = b;
    return NEEDLE_OK;
}

/* JAX_PLATFORMS, JAX's current variable: a comma-separated list tried in order ("cuda,cpu"
 * falls back to the CPU, "cuda" alone does not), "gpu" meaning cuda. */
static int jax_platforms(const char *list, const needle_backend_impl **out) {
    char avail[64];
    available_list(avail, sizeof avail);
    const char *p = list;
    while (*p) {
        const size_t n = strcspn(p, ",");
        char name[16];
        if (n && n < sizeof name) {
            memcpy(name, p, n);
            name[n] = '\0';
            const needle_backend_impl *b = backend_find(!strcasecmp(name, "gpu") ? "cuda" : name);
            if (b && b->probe() && b->device_count() > 0) {
                *out = b;
                return NEEDLE_OK;
            }
        }
        p += n;
        if (*p == ',') p++;
    }
    return needle_fail(NEEDLE_ERR_BACKEND, "JAX_PLATFORMS=%.60s names no usable backend "
                       "(known: cpu, cuda (or gpu), metal; available: %s)", list, avail);
}

int backend_select(const char *explicit_name, const needle_backend_impl **out) {
    /* the CPU's own knobs are checked whatever the backend: a typo must not pass silently */
    int rc = cpu_check_env();
    if (rc) return rc;
    if (explicit_name && *explicit_name) return force(explicit_name, "", out);
    const char *env = getenv("NEEDLE_BACKEND");
    if (env && *env) return force(env, " (from NEEDLE_BACKEND)", out);
    env = getenv("JAX_PLATFORMS");
    if (env && *env) return jax_platforms(env, out);
    env = getenv("JAX_PLATFORM_NAME");
    if (env && *env) {
        char source[96];
        snprintf(source, sizeof source, " (from JAX_PLATFORM_NAME=%.60s)", env);
        return force(!strcasecmp(env, "gpu") ? "cuda" : env, source, out);
    }
    for (size_t i = 0; i < N_BACKENDS; i++) {
        if (table[i]->probe() && table[i]->device_count() > 0) {
            *out = table[i];
            return NEEDLE_OK;
        }
    }
    return needle_fail(NEEDLE_ERR_BACKEND, "no backend found a device");
}

/* ------------------------------------------------------------------------------------ */
/* Public device queries                                                                 */

int needle_device_count(void) {
    int total = 0;
    for (size_t i = 0; i < N_BACKENDS; i++) {
        int n = table[i]->probe() ? table[i]->device_count() : 0;
        if (n > 0) total += n;
    }
    return total;
}

int needle_device_get(int index, needle_device_info *out) {
    if (!out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "device_get: NULL argument");
    if (index < 0) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "device %d out of range", index);
    int base = 0;
    for (size_t i = 0; i < N_BACKENDS; i++) {
        const needle_backend_impl *b = table[i];
        int n = b->probe() ? b->device_count() : 0;
        if (n <= 0) continue;
        if (index < base + n) {
            needle_device_info full;
            memset(&full, 0, sizeof full);
            int rc = b->device_info(index - base, &full);
            if (rc) return needle_fail(rc, "backend %s: cannot describe device %d", b->name,
                                       index - base);
            /* the default device: the first device of the backend a model would pick now */
            const needle_backend_impl *def = NULL;
            full.is_default = backend_select(NULL, &def) == NEEDLE_OK && def == b &&
                              index == base;
            needle_clear_error();
            full.size = sizeof full;
            return struct_size_out(out, &full, sizeof full, "device_get: needle_device_info");
        }
        base += n;
    }
    return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "device %d out of range (%d devices)", index,
                       base);
}

const char *needle_default_backend(void) {
    const needle_backend_impl *b = NULL;
    if (backend_select(NULL, &b) != NEEDLE_OK) return NULL;
    needle_clear_error();
    return b->name;
}
