/* A model architecture: everything that differs between Needle generations, chosen once
 * per model from the file's generation tag (model_bind, model.c) and reached through
 * m->arch afterwards, so that no code past the binding asks which generation it runs.
 *
 * What the layers compute is recorded in the weights as traits (backend/weights.h
 * model_traits: MLP kind, attention kind, the A8 points) at bind time; the ops, the
 * session and the backends test those. The file format itself is parsed for both tags by
 * cact_parse (format/), below this layer. Adding an architecture: a bind, a layer function
 * over forward.c's shared steps, a session check, and one row of model_arch_for's table. */
#ifndef NEEDLE_MODEL_ARCH_H
#define NEEDLE_MODEL_ARCH_H

#include <stdint.h>

struct needle_model;
struct model_session;

typedef struct model_arch {
    uint32_t generation; /* the file tag it serves (cact_file.generation) */
    const char *name;    /* "Needle 2", for messages */
    /* Binds the parsed file m->file into m->w (traits included), m->info, the probe
     * heads and the tokenizer. 0 or a negative needle_status. */
    int (*bind)(struct needle_model *m);
    /* Frees what bind allocated beyond the shared fields model_unbind frees; safe after a
     * failed bind. */
    void (*unbind)(struct needle_model *m);
    /* One layer `li` over the chunk of n tokens at position p0 (forward.c chunk loop). */
    void (*layer)(struct model_session *s, uint32_t li, uint32_t p0, uint32_t n);
    /* Session creation: the KV window for the asked kv_window (-1: this architecture's
     * default) into *window, and what this architecture refuses (a8: the W·A8 mode). */
    int (*session_check)(const struct needle_model *m, int32_t kv_window, int a8,
                         uint32_t *window);
} model_arch;

extern const model_arch model_arch_needle2; /* layer2.c */
extern const model_arch model_arch_needle3; /* layer3.c */

/* The architecture of files tagged `generation`, or NULL. */
const model_arch *model_arch_for(uint32_t generation);

#endif
