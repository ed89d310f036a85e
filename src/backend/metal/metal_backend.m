/* The Metal device layer (metal_ops.h) and the "metal" backend entry, macOS only
 * (-DNEEDLE_METAL=ON, ARC). NOT YET COMPILED OR RUN ON APPLE HARDWARE: written and
 * reviewed on Linux; the kernels' arithmetic it runs is tested there as C (metal-c).
 *
 * Process-wide: the system default device, the library compiled once from the embedded
 * source (metal_compat.h + nk_kernels.h + kernels.metal, fast math off) and one compute
 * pipeline per kernel. Per model: the .cact image (wrapped without a copy when it is a
 * page-aligned mapping), the float arena and the codebooks as shared buffers. Per
 * session: a command queue, the command buffer being encoded, and every buffer
 * nk_dev_alloc handed out (shared storage: the host reads and writes their contents after
 * nk_dev_sync). A pointer from metal_ops.c is mapped to (buffer, offset) by searching the
 * session's buffers, then the model's. */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <string.h>
#include <unistd.h>

#include "backend/metal/metal_ops.h"
#include "metal_source.h" /* generated: nk_metal_source */
#include "util/error.h"

/* ---- process-wide device and pipelines ------------------------------------------------ */

static id<MTLDevice> g_device;
static id<MTLComputePipelineState> g_pipes[NK_K_COUNT];
static char g_init_error[256];
static dispatch_once_t g_once;

static const char *const kernel_names[NK_K_COUNT] = {
#define NK_NAME(name) "k_" #name,
    NK_KERNEL_LIST(NK_NAME)
#undef NK_NAME
};

static void init_device(void) {
    @autoreleasepool {
        id<MTLDevice> dev = MTLCreateSystemDefaultDevice();
        if (!dev) {
            snprintf(g_init_error, sizeof g_init_error, "no Metal device");
            return;
        }
        MTLCompileOptions *opt = [MTLCompileOptions new];
        opt.fastMathEnabled = NO; /* agree with the CPU to float rounding */
        NSError *err = nil;
        NSString *src = [NSString stringWithUTF8String:nk_metal_source];
        id<MTLLibrary> lib = [dev newLibraryWithSource:src options:opt error:&err];
        if (!lib) {
            snprintf(g_init_error, sizeof g_init_error, "Metal kernels do not compile: %s",
                     err ? err.localizedDescription.UTF8String : "unknown error");
            return;
        }
        for (int i = 0; i < NK_K_COUNT; i++) {
            id<MTLFunction> fn = [lib newFunctionWithName:@(kernel_names[i])];
            id<MTLComputePipelineState> p =
                fn ? [dev newComputePipelineStateWithFunction:fn error:&err] : nil;
            if (!p) {
                snprintf(g_init_error, sizeof g_init_error, "Metal pipeline %s: %s",
                         kernel_names[i], err ? err.localizedDescription.UTF8String : "missing");
                return;
            }
            g_pipes[i] = p;
        }
        g_device = dev; /* only once everything is ready */
    }
}

static id<MTLDevice> device(void) {
    dispatch_once(&g_once, ^{ init_device(); });
    return g_device;
}

/* ---- per-model weights -------------------------------------------------------------------- */

@interface NKWeights : NSObject {
@public
    id<MTLBuffer> image, arena, codebooks;
    const uint8_t *host_image;
    size_t image_size;
    const float *host_arena;
    size_t arena_bytes;
    const float *host_codebooks;
}
@end
@implementation NKWeights
@end

int nk_dev_model_load(const model_weights *m, void **device_weights) {
    *device_weights = NULL;
    id<MTLDevice> dev = device();
    if (!dev) return needle_fail(NEEDLE_ERR_BACKEND, "metal: %s", g_init_error);
    NKWeights *w = [NKWeights new];
    const size_t page = (size_t)getpagesize();
    w->host_image = m->image;
    w->image_size = m->image_size;
    w->host_arena = m->arena;
    w->arena_bytes = (m->arena_floats ? m->arena_floats : 1) * sizeof(float);
    w->host_codebooks = m->codebooks;
    /* a page-aligned mapping can be wrapped in place (its last page is mapped whole) */
    if (m->image_mapped && ((uintptr_t)m->image % page) == 0) {
        size_t len = (m->image_size + page - 1) / page * page;
        w->image = [dev newBufferWithBytesNoCopy:(void *)m->image
                                          length:len
                                         options:MTLResourceStorageModeShared
                                     deallocator:nil];
    }
    if (!w->image)
        w->image = [dev newBufferWithBytes:m->image length:m->image_size
                                   options:MTLResourceStorageModeShared];
    w->arena = [dev newBufferWithBytes:m->arena length:w->arena_bytes
                               options:MTLResourceStorageModeShared];
    w->codebooks = [dev newBufferWithBytes:m->codebooks
                                    length:m->codebooks_bytes
                                   options:MTLResourceStorageModeShared];
    if (!w->image || !w->arena || !w->codebooks)
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "metal: cannot place the weights (%zu "
                           "bytes)", m->image_size);
    *device_weights = (__bridge_retained void *)w;
    return NEEDLE_OK;
}

void nk_dev_model_unload(void *device_weights) {
    if (!device_weights) return;
    NKWeights *w = (__bridge_transfer NKWeights *)device_weights;
    (void)w; /* released at the end of scope */
}

/* ---- per-session state ---------------------------------------------------------------------- */

@interface NKSession : NSObject {
@public
    id<MTLCommandQueue> queue;
    id<MTLCommandBuffer> cmd;
    id<MTLComputeCommandEncoder> enc;
    NSMutableArray<id<MTLBuffer>> *buffers; /* everything nk_dev_alloc handed out */
    id<MTLBuffer> dummy;                    /* bound where a kernel takes no buffer */
    void *device_weights;                   /* the model's NKWeights */
    int error;
}
@end
@implementation NKSession
@end

int nk_dev_session_init(backend_ctx *s, void **dev_out) {
    id<MTLDevice> dev = device();
    if (!dev) return needle_fail(NEEDLE_ERR_BACKEND, "metal: %s", g_init_error);
    if (!s->device_weights)
        return needle_fail(NEEDLE_ERR_BACKEND, "metal: the model's weights are not loaded");
    NKSession *S = [NKSession new];
    S->queue = [dev newCommandQueue];
    S->buffers = [NSMutableArray new];
    S->dummy = [dev newBufferWithLength:16 options:MTLResourceStorageModeShared];
    S->device_weights = s->device_weights;
    if (!S->queue || !S->dummy) return needle_fail(NEEDLE_ERR_BACKEND, "metal: no command queue");
    *dev_out = (__bridge_retained void *)S;
    return NEEDLE_OK;
}

void nk_dev_session_free(backend_ctx *s, void *dev) {
    (void)s;
    NKSession *S = (__bridge_transfer NKSession *)dev;
    nk_dev_sync((__bridge void *)S);
    (void)S; /* buffers, queue and pipelines references go with it */
}

void *nk_dev_alloc(void *dev, size_t bytes) {
    NKSession *S = (__bridge NKSession *)dev;
    id<MTLBuffer> b = [device() newBufferWithLength:(bytes ? bytes : 16)
                                            options:MTLResourceStorageModeShared];
    if (!b) return NULL;
    memset(b.contents, 0, b.length);
    [S->buffers addObject:b];
    return b.contents;
}

void nk_dev_release(void *dev, void *p) {
    NKSession *S = (__bridge NKSession *)dev;
    nk_dev_sync(dev); /* the GPU may still read it */
    for (NSUInteger i = 0; i < S->buffers.count; i++)
        if (S->buffers[i].contents == p) {
            [S->buffers removeObjectAtIndex:i];
            return;
        }
}

/* The buffer holding host-visible address p and the offset of p in it; nil if none. */
static id<MTLBuffer> resolve(NKSession *S, const void *p, NSUInteger *offset) {
    const uint8_t *b = (const uint8_t *)p;
    for (id<MTLBuffer> buf in S->buffers) {
        const uint8_t *base = (const uint8_t *)buf.contents;
        if (b >= base && b < base + buf.length) {
            *offset = (NSUInteger)(b - base);
            return buf;
        }
    }
    NKWeights *w = (__bridge NKWeights *)S->device_weights;
    if (b >= w->host_image && b < w->host_image + w->image_size) {
        *offset = (NSUInteger)(b - w->host_image);
        return w->image;
    }
    const uint8_t *arena = (const uint8_t *)w->host_arena;
    if (b >= arena && b < arena + w->arena_bytes) {
        *offset = (NSUInteger)(b - arena);
        return w->arena;
    }
    const uint8_t *cb = (const uint8_t *)w->host_codebooks;
    if (b >= cb && b < cb + w->codebooks.length) {
        *offset = (NSUInteger)(b - cb);
        return w->codebooks;
    }
    return nil;
}

void nk_dev_dispatch(void *dev, const model_weights *m, int id, const nk_args *a,
                     void *const buf[NK_BUFFERS], const float *wf) {
    (void)m;
    NKSession *S = (__bridge NKSession *)dev;
    if (S->error) return;
    if (!S->enc) {
        S->cmd = [S->queue commandBuffer];
        S->enc = [S->cmd computeCommandEncoder]; /* serial: dispatches run in order */
    }
    id<MTLComputePipelineState> p = g_pipes[id];
    [S->enc setComputePipelineState:p];
    [S->enc setBytes:a length:sizeof *a atIndex:0];
    for (int i = 0; i <= NK_BUFFERS; i++) {
        const void *ptr = i < NK_BUFFERS ? buf[i] : (const void *)wf;
        NSUInteger off = 0;
        id<MTLBuffer> b = ptr ? resolve(S, ptr, &off) : S->dummy;
        if (!b) {
            S->error = needle_fail(NEEDLE_ERR_BACKEND, "metal: kernel %s: argument %d is not "
                                   "in a Metal buffer", kernel_names[id], i);
            return;
        }
        [S->enc setBuffer:b offset:off atIndex:(NSUInteger)i + 1];
    }
    NSUInteger width = p.maxTotalThreadsPerThreadgroup < 256 ? p.maxTotalThreadsPerThreadgroup : 256;
    if (width > a->n_items) width = a->n_items;
    NSUInteger groups = (a->n_items + width - 1) / width; /* kernels ignore gid >= n_items */
    [S->enc dispatchThreadgroups:MTLSizeMake(groups, 1, 1)
           threadsPerThreadgroup:MTLSizeMake(width, 1, 1)];
}

int nk_dev_sync(void *dev) {
    NKSession *S = (__bridge NKSession *)dev;
    if (S->enc) {
        [S->enc endEncoding];
        [S->cmd commit];
        [S->cmd waitUntilCompleted];
        if (S->cmd.status == MTLCommandBufferStatusError && !S->error)
            S->error = needle_fail(NEEDLE_ERR_BACKEND, "metal: %s",
                                   S->cmd.error.localizedDescription.UTF8String);
        S->enc = nil;
        S->cmd = nil;
    }
    int rc = S->error;
    S->error = 0;
    return rc;
}

/* ---- probe and device info --------------------------------------------------------------------- */

static int mtl_probe(void) { return device() != nil; }

static int mtl_device_count(void) { return mtl_probe() ? 1 : 0; }

static int mtl_device_info(int index, needle_device_info *out) {
    id<MTLDevice> dev = device();
    if (!out || index != 0 || !dev) return NEEDLE_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "metal");
    snprintf(out->name, sizeof out->name, "%s", dev.name.UTF8String);
    out->memory_bytes = dev.recommendedMaxWorkingSetSize;
    out->compute_units = 0; /* Metal does not report GPU core counts */
    snprintf(out->capability, sizeof out->capability, "%s",
             [dev supportsFamily:MTLGPUFamilyMetal3] ? "metal3" : "metal");
    return NEEDLE_OK;
}

const needle_backend_impl metal_backend = {
    .name = "metal",
    .probe = mtl_probe,
    .device_count = mtl_device_count,
    .device_info = mtl_device_info,
    .ops = &nk_backend_ops,
};
