/* decimal.h: exact fixed-point decimals for number bounds (compiler.c, recognizer_number.c).
 *
 * Bounded numbers are compared exactly, not through doubles: a value is ip + fp / 1e18
 * with ip the signed floor and fp in [0, 1e18), so every decimal the grammar admits
 * (at most 18 integer and 18 fraction digits) is represented without rounding and the
 * order of gram_fx is the order of the reals. Schema bounds arrive as doubles from cJSON;
 * they are read through their shortest round-trip spelling (what Python's json.dumps
 * wrote in the tools JSON), so "maximum": 0.1 means exactly 0.1. */
#ifndef NEEDLE_GRAMMAR_DECIMAL_H
#define NEEDLE_GRAMMAR_DECIMAL_H

#include <stdint.h>

#define GRAM_FX_ONE 1000000000000000000ull /* 1e18: fraction units per unit */
#define GRAM_FX_MAX_INT 999999999999999999ll /* largest integer part (18 digits) */

typedef struct gram_fx {
    int64_t ip;  /* floor of the value */
    uint64_t fp; /* fraction in units of 1e-18, [0, GRAM_FX_ONE) */
} gram_fx;

int gram_fx_cmp(gram_fx a, gram_fx b);
gram_fx gram_fx_neg(gram_fx a);
/* a + units * 1e-18 and a - units * 1e-18 (units < GRAM_FX_ONE; no overflow checks: callers
 * stay within |value| < 1e18 + 1). */
gram_fx gram_fx_add(gram_fx a, uint64_t units);
gram_fx gram_fx_sub(gram_fx a, uint64_t units);
/* The value -mag or +mag for a magnitude with integer part ip (< 1e18) and fraction fp. */
gram_fx gram_fx_make(int neg, uint64_t ip, uint64_t fp);
/* Largest admitted magnitude, 999999999999999999.999999999999999999. */
gram_fx gram_fx_max(void);

/* Reads v through its shortest decimal spelling, rounded onto the 1e-18 grid (up or down).
 * *exact is set to 1 if no rounding happened. Returns 0, or +1 / -1 if |v| >= 1e18 (then
 * *out is the largest / smallest admitted value). */
int gram_fx_from_double(double v, int round_up, gram_fx *out, int *exact);

/* floor or ceil of v * 10^scale (scale <= 9), saturated to +-1e18. */
int64_t gram_fx_scaled(gram_fx v, int scale, int round_up);

/* multipleOf m = k * 10^-scale exactly (k >= 1, scale <= 9, k < 1e18). Returns 0, or -1
 * if m is not positive or needs more than 9 fraction digits. */
int gram_dec_multiple_of(double m, int64_t *k, int *scale);

/* 10^e for 0 <= e <= 18. */
uint64_t gram_dec_pow10(int e);

#endif
