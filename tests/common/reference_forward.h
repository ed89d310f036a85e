/* The plain reference forward pass (reference_forward.c), the oracle of the op tests. */
#ifndef NEEDLE_TESTS_REFERENCE_FORWARD_H
#define NEEDLE_TESTS_REFERENCE_FORWARD_H

#include <stdint.h>

#include "backend/weights.h"

/* logits [n][vocab] of tokens[0:n] at positions 0..n-1, attending to the first n_sinks
 * positions and the last `window` (0: every earlier position). rope_freq: [head_dim / 2]
 * (the model's). 0, or -1 when out of memory (or more than 64 lanes). */
int reference_forward(const struct model_weights *m, const float *rope_freq,
                      const int32_t *tokens, uint32_t n, uint32_t window, uint32_t n_sinks,
                      float *logits);

#endif
