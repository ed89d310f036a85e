/* The device layer of metal_ops.h in plain C, for Linux: "session memory" is host memory
 * and a dispatch runs the kernel function of nk_kernels.h for gid = 0 .. n_items - 1 in a
 * loop, which is what the GPU runs one thread per item. Built only into
 * tests/kernels/test_backend_ops.c ("metal-c"), where it is compared with the CPU backend, so the
 * Metal kernels' arithmetic is tested on machines without Metal. */
#include <stdlib.h>

#include "backend/metal/metal_ops.h"
#include "util/error.h"

typedef void (*nk_kernel_fn)(const nk_args *a, uchar *b0, uchar *b1, uchar *b2, uchar *b3,
                             uchar *b4, uchar *b5, uchar *b6, uchar *b7, uchar *b8,
                             const float *wf, uint gid);

static const nk_kernel_fn kernels[NK_K_COUNT] = {
#define NK_FN_ENTRY(name) nk_##name,
    NK_KERNEL_LIST(NK_FN_ENTRY)
#undef NK_FN_ENTRY
};

static int dummy_state;

int nk_dev_model_load(const model_weights *m, void **device_weights) {
    (void)m; /* the kernels read the host weights directly */
    *device_weights = NULL;
    return NEEDLE_OK;
}

void nk_dev_model_unload(void *device_weights) { (void)device_weights; }

int nk_dev_session_init(backend_ctx *s, void **dev) {
    (void)s;
    *dev = &dummy_state;
    return NEEDLE_OK;
}

void nk_dev_session_free(backend_ctx *s, void *dev) {
    (void)s;
    (void)dev;
}

void *nk_dev_alloc(void *dev, size_t bytes) {
    (void)dev;
    return calloc(bytes ? bytes : 1, 1);
}

void nk_dev_release(void *dev, void *p) {
    (void)dev;
    free(p);
}

void nk_dev_dispatch(void *dev, const model_weights *m, int id, const nk_args *a,
                     void *const buf[NK_BUFFERS], const float *wf) {
    (void)dev;
    (void)m;
    uchar *b[NK_BUFFERS];
    for (int i = 0; i < NK_BUFFERS; i++) b[i] = (uchar *)buf[i];
    for (uint gid = 0; gid < a->n_items; gid++)
        kernels[id](a, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], wf, gid);
}

int nk_dev_sync(void *dev) {
    (void)dev;
    return NEEDLE_OK;
}
