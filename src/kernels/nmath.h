/* The scalar math of spec §3 written once, for every backend: plain C (the CPU ops, the
 * Metal kernels compiled as C on Linux), CUDA (host and device) and the Metal Shading
 * Language (the file is part of the Metal library's single source, see CMakeLists.txt).
 *
 * Only the common subset of the three languages: scalar code, no includes under Metal,
 * no library calls beyond the NM_* wrappers. Functions are `NM_FN` (static inline, plus
 * __host__ __device__ under nvcc). Integer types are nm_u32. */
#ifndef NEEDLE_KERNELS_NMATH_H
#define NEEDLE_KERNELS_NMATH_H

#if defined(__METAL_VERSION__)
#define NM_FN static inline
typedef uint nm_u32;
#elif defined(__CUDACC__)
#include <stdint.h>
#define NM_FN static inline __host__ __device__
typedef uint32_t nm_u32;
#else
#include <stdint.h>
#define NM_FN static inline
typedef uint32_t nm_u32;
#endif

/* ---- KV cache layout (session.h) ------------------------------------------------------ */

/* The cache slot of absolute position p: `n_sinks` pinned slots for positions [0, n_sinks),
 * then a ring of `window` slots (0 = no window: the ring is the whole context). */
NM_FN nm_u32 nm_kv_slot(nm_u32 p, nm_u32 n_sinks, nm_u32 window) {
    if (p < n_sinks) return p;
    if (window) return n_sinks + (p - n_sinks) % window;
    return p;
}

#endif
