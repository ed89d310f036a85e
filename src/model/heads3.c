/* Binding the Needle 3 probe heads (NEEDLE3.md §1.5, §3; cactus-needle 3.2.8 ProbeHead.export):
 * after final_norm a manifest of codes (1 embedding, 2 confidence, 3 router), then per head
 * probes [(L+1) K][d], gain [L+1][K], query [Q][d], row_bias [Q][L+1][K], proj [out][Q d],
 * bias [out] (and calibration [3] for the router), validated by cact3_parse.
 *
 * probes, query and proj are CQ in the shipped layout (FP16 in the older one): they are
 * dequantized once here, as the reference reader does, because pooling reads every probe
 * for every cell and the heads are small next to the stack. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/error.h"

typedef struct heads3_state {
    float *floats; /* the dequantized probes | query | proj of every head */
} heads3_state;

static size_t record_floats(const cact_tensor *t) {
    return (size_t)t->shape[0] * (t->ndim > 1 ? t->shape[1] : 1);
}

/* The floats of record `index`: the widened copy, or the CQ rows dequantized into `dst`. */
static int record_values(const struct needle_model *m, uint32_t index, float *dst,
                         const float **out) {
    if (m->fp[index]) {
        *out = m->fp[index];
        return NEEDLE_OK;
    }
    cq_matrix w;
    model_cq_view(m, index, &w);
    float *tmp = malloc(w.group * sizeof *tmp);
    if (!tmp) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model: out of memory");
    for (uint32_t r = 0; r < w.rows; r++) cq_dequant_row(&w, r, dst + (size_t)r * w.cols, tmp);
    free(tmp);
    *out = dst;
    return NEEDLE_OK;
}

int model3_bind_heads(struct needle_model *m) {
    const cact_file *f = &m->file;
    m->n_probe_heads = 0;
    if (!f->l3.heads_index || !f->l3.num_heads) return NEEDLE_OK;
    /* A rung of this file's ladder run in place (needle_model_params.depth) gets no heads:
     * the official rung pools other cells (its subnetwork stream) with rows masked, which
     * no fixture here checks. A rung exported as its own file carries its own heads. */
    if (m->w.n_layers != f->h3.num_layers) return NEEDLE_OK;
    const uint32_t rows = f->h3.num_layers + 1;
    heads3_state *st = calloc(1, sizeof *st);
    if (!st) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model: out of memory");
    m->heads3 = st;
    size_t total = 0;
    for (uint32_t k = 0, at = f->l3.heads_index + 1; k < f->l3.num_heads; k++) {
        for (uint32_t r = 0; r < 6; r += 2) total += record_floats(&f->tensors[at + r]);
        at += f->l3.head_codes[k] == 3 ? 7 : 6;
    }
    st->floats = malloc(total * sizeof *st->floats);
    if (!st->floats) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "model: out of memory");

    float *next = st->floats;
    for (uint32_t k = 0, at = f->l3.heads_index + 1; k < f->l3.num_heads; k++) {
        const uint32_t code = f->l3.head_codes[k];
        probe_head *ph = &m->probe_heads[k];
        memset(ph, 0, sizeof *ph);
        const float *vals[6];
        for (uint32_t r = 0; r < 6; r++) {
            int rc = record_values(m, at + r, next, &vals[r]);
            if (rc) return rc;
            if (vals[r] == next) next += record_floats(&f->tensors[at + r]);
        }
        ph->code = code;
        ph->rows = rows;
        ph->num_probes = (uint32_t)f->tensors[at].shape[0];
        ph->per_row = ph->num_probes / rows;
        ph->queries = (uint32_t)f->tensors[at + 2].shape[0];
        ph->out_dim = (uint32_t)f->tensors[at + 4].shape[0];
        ph->probes = vals[0];
        ph->gain = vals[1];
        ph->query = vals[2];
        ph->row_bias = vals[3];
        ph->proj = vals[4];
        ph->bias = vals[5];
        ph->calibration = code == 3 ? m->fp[at + 6] : NULL;
        at += code == 3 ? 7 : 6;
    }
    m->n_probe_heads = f->l3.num_heads;
    return NEEDLE_OK;
}

void model3_unbind_heads(struct needle_model *m) {
    heads3_state *st = m->heads3;
    if (!st) return;
    free(st->floats);
    free(st);
    m->heads3 = NULL;
    m->n_probe_heads = 0;
}
