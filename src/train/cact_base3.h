/* A Needle 3 .cact as the base of the training core: the Needle 3 twin of cact_base2.h.
 * The official checkpoint the file came from (train_checkpoint_from_cact, cact_base.h:
 * every record read as the runtime reads it, put back in the flax tree's layout), then the
 * g3 model of it. The config comes from the header. */
#ifndef NEEDLE_TRAIN_CACT_BASE3_H
#define NEEDLE_TRAIN_CACT_BASE3_H

#include <stddef.h>
#include <stdint.h>

#include "export/export_model_v3.h"
#include "train/grad3.h"

/* The model of the .cact image [data, data + size) and its config (cfg may be NULL).
 * A Needle 2 file or a malformed one is refused with a needle error and a message. */
int g3_model_from_cact(const uint8_t *data, size_t size, export3_config *cfg, g3_model **out);

/* Which core a .cact base is for, by its tag: 3 (Needle 3), 2 (Needle 2), or 0 (not a
 * .cact, or too short to say). */
int cact_base_generation(const uint8_t *data, size_t size);

#endif
