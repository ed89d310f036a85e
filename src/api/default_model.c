/* Where the default model lives. The demo model (models/needle-demo.cact, trained by
 * train/) stands in for the official engine's built-in weights, so that the CLI, the
 * official ABI and the Python package do their job with no model named. The build
 * passes two candidate paths: the installed copy and the source tree's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
