/* The CPU backend's Needle 3 operations (cpu_ops3.c); see backend.h (attention3,
 * monarch_mlp) for what they compute. Declared for the CPU ops table in cpu_ops.c. */
#ifndef NEEDLE_BACKEND_CPU_OPS3_H
#define NEEDLE_BACKEND_CPU_OPS3_H

#include "backend/backend.h"

void cpu_attention3(backend_ctx *s, uint32_t layer, uint32_t p0, uint32_t n,
                    const float *rope_cs, float *q, float *k, float *v, const float *gate,
                    float *o);
void cpu_monarch_mlp(backend_ctx *s, uint32_t layer, uint32_t n, const float *h, float *out);
/* cpu_ops.c: x rotated for products with w, or under W·A8 its quantized row. */
void cpu_act_rotate(const backend_ctx *s, const cq_matrix *w, const float *x, float *out);

#endif
