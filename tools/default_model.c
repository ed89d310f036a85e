#include "default_model.h"

#include <stdio.h>

int cli_no_weights(void) {
    fprintf(stderr,
            "needle: --weights FILE is required: no default model was found (set NEEDLE_MODEL,\n"
            "        or install the demo model with `cmake --install`, or build from a source\n"
            "        tree that has models/needle-demo.cact)\n");
    return 2;
}
