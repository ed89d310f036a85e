/* Portability between Metal Shading Language and C11 for the Metal kernels.
 *
 * The kernels' arithmetic (nk_kernels.h) is written once in the common subset of MSL and
 * C: scalar code, explicit address spaces through the NK_* macros, 32-bit `uint` indices
 * (`ulong` where a KV-cache offset may pass 2^32), math through NK_* wrappers. Under the
 * Metal compiler (__METAL_VERSION__ defined) the macros expand to MSL; anywhere else to C,
 * so the very same functions are compiled and tested on Linux against the CPU backend
 * (metal_emu.c, tests/kernels/test_backend_ops.c). The Metal library must be built without fast
 * math (MTLCompileOptions.mathMode = safe) for the two to agree to float rounding. */
#ifndef NEEDLE_METAL_COMPAT_H
#define NEEDLE_METAL_COMPAT_H

#ifdef __METAL_VERSION__

#include <metal_stdlib>
using namespace metal;

#define NK_DEVICE device   /* buffers */
#define NK_CONST constant  /* the argument block */
#define NK_FN static inline
typedef char nk_i8;

#define NK_EXP(x) exp(x)
#define NK_LOG(x) log(x)
#define NK_SQRT(x) sqrt(x)
#define NK_FABS(x) fabs(x)
#define NK_FMAX(a, b) fmax((a), (b))
#define NK_RINT(x) rint(x)
#define NK_HALF_TO_FLOAT(u) float(as_type<half>((ushort)(u)))
#define NK_FLOAT_TO_HALF(f) as_type<ushort>(half(f)) /* round to nearest even */

#else /* C */

#include <math.h>
#include <stdint.h>

#include "util/fp16.h"

#define NK_DEVICE
#define NK_CONST
#define NK_FN static inline
typedef uint32_t uint;
typedef uint64_t ulong;
typedef uint8_t uchar;
typedef uint16_t ushort;
typedef int8_t nk_i8;

#define NK_EXP(x) expf(x)
#define NK_LOG(x) logf(x)
#define NK_SQRT(x) sqrtf(x)
#define NK_FABS(x) fabsf(x)
#define NK_FMAX(a, b) fmaxf((a), (b))
#define NK_RINT(x) rintf(x)
#define NK_HALF_TO_FLOAT(u) fp16_to_f32((uint16_t)(u))
#define NK_FLOAT_TO_HALF(f) f32_to_fp16(f)

#endif

#endif
