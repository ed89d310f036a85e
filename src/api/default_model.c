/* Where the default model lives: $NEEDLE_MODEL, else the newest cached official Needle 3,
 * else Needle 2 (the hub cache and the official package's cache, see model_cache.h; both
 * filled by `needle download`, huggingface_hub or cactus-needle), else the demo model
 * (models/needle-demo.cact, trained by train/), which stands in for the real weights so
 * that the CLI, the official ABI and the Python package do their job on a machine that
 * has downloaded nothing. The build passes two demo paths: the installed copy and the
 * source tree's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_cache.h"
#include "needle.h"
#include "util/platform.h"

#ifndef NEEDLE_INSTALLED_MODEL
#define NEEDLE_INSTALLED_MODEL ""
#endif
#ifndef NEEDLE_SOURCE_MODEL
#define NEEDLE_SOURCE_MODEL ""
#endif

static const char *const demo_models[] = {NEEDLE_INSTALLED_MODEL, NEEDLE_SOURCE_MODEL};
#define N_DEMO (sizeof demo_models / sizeof demo_models[0])

static int readable(const char *path) { return platform_readable(path); }

const char *needle_default_model_path(void) {
    const char *env = getenv("NEEDLE_MODEL");
    if (env && env[0]) return env;
    /* per thread: a call on one thread never rewrites the string another is reading */
    static _Thread_local char cached[4096];
    if (model_cache_official_model(3, cached, sizeof cached) == 0 ||
        model_cache_official_model(2, cached, sizeof cached) == 0)
        return cached;
    for (size_t i = 0; i < N_DEMO; i++)
        if (readable(demo_models[i])) return demo_models[i];
    return NULL;
}

const char *needle_default_model_candidate(int index) {
    if (index < 0 || (size_t)index >= N_DEMO || !demo_models[index][0]) return NULL;
    return demo_models[index];
}

const char *needle_default_tools_path(void) {
    /* each candidate model path with ".cact" replaced: models/needle-demo.tools.json */
    static const char suffix[] = ".tools.json";
    static char tools[N_DEMO][4096];
    for (size_t i = 0; i < N_DEMO; i++) {
        const size_t n = strlen(demo_models[i]);
        if (n < 5 || n - 5 + sizeof suffix > sizeof tools[i]) continue;
        snprintf(tools[i], sizeof tools[i], "%.*s%s", (int)(n - 5), demo_models[i], suffix);
        if (readable(tools[i])) return tools[i];
    }
    return NULL;
}
