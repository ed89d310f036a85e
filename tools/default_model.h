/* Where the CLI finds a model and tools when none is named on the command line.
 *
 * The demo model (models/needle-demo.cact, trained by train/) is the default, so that
 * `needle run "…"` works right after a build. Lookup order: the NEEDLE_MODEL
 * environment variable; the installed copy (<prefix>/share/needle/); the source tree
 * the binary was built from. The demo's tool list sits next to it and is the default
 * --tools, but only when the model is the default one too. */
#ifndef NEEDLE_TOOLS_DEFAULT_MODEL_H
#define NEEDLE_TOOLS_DEFAULT_MODEL_H

/* A readable default model path, or NULL if there is none. */
const char *cli_default_weights(void);

/* The demo model's tool list, or NULL if it is missing. */
const char *cli_default_tools(void);

/* Prints why no model could be found (for a missing --weights) and returns 2. */
int cli_no_weights(void);

#endif
