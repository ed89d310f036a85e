/* fmaf that is exact everywhere: x*y + z rounded once to float. The exporter reproduces
 * the official bytes only with exactly fused steps (cq_quantize.c's rotation, the LoRA
 * merge). glibc's fmaf is exact, and so is the instruction where the build targets FMA;
 * the Windows C runtime's (mingw-w64) is not: it rounds x*y + z to double and then to
 * float, and that double rounding moved one norm of the tinyb fixture by an ulp under wine.
 * There it is computed in double with round-to-odd (the product of two floats is exact in
 * double; the sum's rounding error is recovered by TwoSum and, when not zero, the sum is
 * moved to its odd neighbour toward the exact value), which makes the final rounding to
 * float correct (Boldo and Melquiond: an odd-rounded result with 2 or more extra bits
 * rounds to nearest exactly). */
#ifndef NEEDLE_QUANT_EXACT_FMA_H
#define NEEDLE_QUANT_EXACT_FMA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float exact_fmaf(float x, float y, float z) {
#if defined(_WIN32) && !defined(__FMA__)
    const double p = (double)x * (double)y, zd = (double)z;
    double s = p + zd;
    if (!isfinite(s)) return (float)s;
    const double bz = s - p, err = (p - (s - bz)) + (zd - bz);
    if (err != 0.0) {
        uint64_t bits;
        memcpy(&bits, &s, sizeof bits);
        if ((bits & 1) == 0) {
            bits = (err > 0) == (s > 0) ? bits + 1 : bits - 1;
            memcpy(&s, &bits, sizeof s);
        }
    }
    return (float)s;
#else
    return fmaf(x, y, z);
#endif
}

#endif
