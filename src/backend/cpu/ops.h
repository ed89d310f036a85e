/* The CPU operations of the Needle 3 layer (backend.h attention3, monarch_mlp), for the
 * table in ops.c: spanned_attention.c and monarch_mlp.c. */
#ifndef NEEDLE_BACKEND_CPU_OPS_H
#define NEEDLE_BACKEND_CPU_OPS_H

#include "backend/backend.h"

void cpu_attention3(backend_ctx *s, uint32_t layer, uint32_t p0, uint32_t n,
                    const float *rope_cs, float *q, float *k, float *v, const float *gate,
                    float *o);
void cpu_monarch_mlp(backend_ctx *s, uint32_t layer, uint32_t n, const float *h, float *out);

#endif
