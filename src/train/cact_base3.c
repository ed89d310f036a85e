/* A Needle 3 .cact read into the Needle 3 training core (see cact_base3.h): the official
 * checkpoint the file came from (cact_base.c, the one reader of a v3 .cact as a training
 * base), then the g3 model over a borrowed view of its tensors. */
#include "train/cact_base3.h"

#include <stdlib.h>
#include <string.h>

#include "format/cact.h"
#include "train/cact_base.h"
#include "train/checkpoint.h"
#include "util/error.h"

int cact_base_generation(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    const uint32_t tag = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    return tag == CACT3_TAG ? 3 : tag == CACT_TAG ? 2 : 0;
}

/* The checkpoint's tensors as a parsed safetensors file (F32, little-endian as every
 * target of ours; names and values borrowed: free only v->tensors). */
static int st_view(const train_checkpoint *ck, st_file *v) {
    memset(v, 0, sizeof *v);
    v->tensors = calloc(ck->n ? ck->n : 1, sizeof *v->tensors);
    if (!v->tensors) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    for (uint32_t i = 0; i < ck->n; i++) {
        const train_tensor *t = &ck->tensors[i];
        st_tensor *s = &v->tensors[i];
        s->name = t->name;
        s->dtype = ST_F32;
        s->ndim = t->ndim;
        memcpy(s->shape, t->shape, sizeof s->shape);
        s->numel = t->numel;
        s->data = (const uint8_t *)t->data;
    }
    v->n = ck->n;
    return 0;
}

int g3_model_from_cact(const uint8_t *data, size_t size, export3_config *cfg_out, g3_model **out) {
    *out = NULL;
    cact_file f;
    int st = cact_parse(data, size, &f);
    if (st) return st;
    if (f.generation != 3) {
        cact_release(&f);
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "a Needle 2 .cact is not a Needle 3 base");
    }
    train_checkpoint ck;
    st = train_checkpoint_from_cact(&f, &ck);
    cact_release(&f);
    if (st) return st;
    export3_config c;
    st_file view = {0};
    st = export3_config_parse(ck.config, strlen(ck.config), &c);
    if (!st) st = st_view(&ck, &view);
    if (!st) st = g3_model_from_checkpoint(&c, &view, out);
    free(view.tensors);
    train_checkpoint_release(&ck);
    if (!st && cfg_out) *cfg_out = c;
    return st;
}
