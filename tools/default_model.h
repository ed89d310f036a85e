/* The CLI's side of the default model: the library finds it (needle_default_model_path,
 * needle_default_tools_path in needle.h); the CLI says what to do when there is none.
 * The demo's tool list is the default --tools only when the model is the default too. */
#ifndef NEEDLE_TOOLS_DEFAULT_MODEL_H
#define NEEDLE_TOOLS_DEFAULT_MODEL_H

/* Prints why no model could be found (for a missing --weights) and returns 2. */
int cli_no_weights(void);

#endif
