/* The Metal backend's host side, split in two:
 *   metal_ops.c     the operations of backend/backend.h as sequences of kernel dispatches
 *                   (shared: the same file drives the GPU on macOS and the C build of the
 *                   kernels on Linux);
 *   the device layer, below: metal_backend.m (Objective-C, Metal) on macOS, or
 *                   metal_emu.c (runs nk_kernels.h in C loops) in tests/kernels/test_backend_ops.c.
 * Every pointer metal_ops.c hands the device layer is a host-visible address: session
 * memory from nk_dev_alloc (shared-storage buffers on Apple GPUs), the model's mapped
 * image, its float arena or its codebooks; the device layer maps each to a buffer and an
 * offset. Memory written by the host is only touched after nk_dev_sync. */
#ifndef NEEDLE_METAL_OPS_H
#define NEEDLE_METAL_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/metal/metal_compat.h"
#include "backend/metal/nk_kernels.h"

enum nk_kernel_id {
#define NK_ID(name) NK_K_##name,
    NK_KERNEL_LIST(NK_ID)
#undef NK_ID
    NK_K_COUNT
};

#define NK_BUFFERS 9 /* b0..b8; wf is passed separately */

/* ---- the device layer ------------------------------------------------------------------- */
int nk_dev_model_load(const model_weights *m, void **device_weights);
void nk_dev_model_unload(void *device_weights);
int nk_dev_session_init(backend_ctx *s, void **dev);
void nk_dev_session_free(backend_ctx *s, void *dev);
void *nk_dev_alloc(void *dev, size_t bytes);       /* zeroed, host-visible */
void nk_dev_release(void *dev, void *p);
/* Queues kernel `id` over a->n_items threads with buffers buf[0..8] (NULL = unused) and
 * the float arena wf. */
void nk_dev_dispatch(void *dev, const model_weights *m, int id, const nk_args *a,
                     void *const buf[NK_BUFFERS], const float *wf);
/* Waits for everything queued; 0 or a negative needle_status for a device error. */
int nk_dev_sync(void *dev);

/* The operations (metal_ops.c). */
extern const needle_backend_ops nk_backend_ops;

#endif
