#include "default_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef NEEDLE_INSTALLED_MODEL
#define NEEDLE_INSTALLED_MODEL ""
#endif
#ifndef NEEDLE_SOURCE_MODEL
#define NEEDLE_SOURCE_MODEL ""
#endif
#define DEMO_TOOLS_SUFFIX ".tools.json"

static const char *first_readable(const char *a, const char *b) {
    if (a[0] && access(a, R_OK) == 0) return a;
    if (b[0] && access(b, R_OK) == 0) return b;
    return NULL;
}

const char *cli_default_weights(void) {
    const char *env = getenv("NEEDLE_MODEL");
    if (env && env[0]) return env;
    return first_readable(NEEDLE_INSTALLED_MODEL, NEEDLE_SOURCE_MODEL);
}

const char *cli_default_tools(void) {
    /* the model path with ".cact" replaced: models/needle-demo.tools.json */
    static char buf[2][4096];
    const char *paths[2] = {NEEDLE_INSTALLED_MODEL, NEEDLE_SOURCE_MODEL};
    for (int i = 0; i < 2; i++) {
        const size_t n = strlen(paths[i]);
        if (n < 5 || n + sizeof DEMO_TOOLS_SUFFIX > sizeof buf[i]) continue;
        snprintf(buf[i], sizeof buf[i], "%.*s%s", (int)(n - 5), paths[i], DEMO_TOOLS_SUFFIX);
    }
    return first_readable(buf[0], buf[1]);
}

int cli_no_weights(void) {
    fprintf(stderr,
            "needle: --weights FILE is required: no default model was found (set NEEDLE_MODEL,\n"
            "        or install the demo model: %s)\n",
            NEEDLE_INSTALLED_MODEL[0] ? NEEDLE_INSTALLED_MODEL : "models/needle-demo.cact");
    return 2;
}
