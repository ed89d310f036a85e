// The Metal kernels: one `kernel` per function of nk_kernels.h, one thread per item.
//
// The arithmetic is in nk_kernels.h, written in the common subset of MSL and C
// (metal_compat.h), so it is compiled and tested as C on Linux (tests/kernels/test_backend_ops.c,
// "metal-c"). This file only binds buffers: the argument block at index 0, b0..b8 at
// 1..9, the model's float tensors at 10. The host (metal_backend.m) compiles the three
// files as one source, embedded at build time, with fast math off.
#ifndef NK_SINGLE_SOURCE
#include "metal_compat.h"
#include "nk_kernels.h"
#endif

#define NK_METAL_KERNEL(name)                                                              \
    kernel void k_##name(constant nk_args *a [[buffer(0)]], device uchar *b0 [[buffer(1)]], \
                         device uchar *b1 [[buffer(2)]], device uchar *b2 [[buffer(3)]],    \
                         device uchar *b3 [[buffer(4)]], device uchar *b4 [[buffer(5)]],    \
                         device uchar *b5 [[buffer(6)]], device uchar *b6 [[buffer(7)]],    \
                         device uchar *b7 [[buffer(8)]], device uchar *b8 [[buffer(9)]],    \
                         device const float *wf [[buffer(10)]],                             \
                         uint gid [[thread_position_in_grid]]) {                            \
        if (gid < a->n_items) nk_##name(a, b0, b1, b2, b3, b4, b5, b6, b7, b8, wf, gid);    \
    }

NK_KERNEL_LIST(NK_METAL_KERNEL)
