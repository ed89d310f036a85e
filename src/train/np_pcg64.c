/* numpy's SeedSequence and PCG64 (see np_pcg64.h); the constants are numpy's. */
#include "train/np_pcg64.h"

/* SeedSequence's hash constants (numpy/random/bit_generator.pyx) */
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_MULT_L 0xca01f9ddu
#define SS_MIX_MULT_R 0x4973f715u
#define SS_XSHIFT 16
#define SS_POOL 4

/* PCG's 128-bit multiplier */
#define PCG_MULT_HI 2549297995355413924ull
#define PCG_MULT_LO 4865540595714422341ull

static uint32_t hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_XSHIFT;
    return value;
}

static uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_MULT_L * x - SS_MIX_MULT_R * y;
    r ^= r >> SS_XSHIFT;
    return r;
}

/* SeedSequence(seed).generate_state(4, uint64), as four 64-bit words */
static void seed_sequence_state(uint64_t seed, uint64_t words[4]) {
    uint32_t entropy[2];
    uint32_t n_entropy = 0;
    /* _int_to_uint32_array: 32-bit words from the low end; 0 is one word */
    do {
        entropy[n_entropy++] = (uint32_t)seed;
        seed >>= 32;
    } while (seed);
    uint32_t pool[SS_POOL];
    uint32_t hash_const = SS_INIT_A;
    for (uint32_t i = 0; i < SS_POOL; i++)
        pool[i] = hashmix(i < n_entropy ? entropy[i] : 0, &hash_const);
    for (uint32_t src = 0; src < SS_POOL; src++)
        for (uint32_t dst = 0; dst < SS_POOL; dst++)
            if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], &hash_const));
    /* entropy beyond the pool size: none for a seed below 2^128 */
    uint32_t out[8];
    uint32_t hb = SS_INIT_B;
    for (uint32_t i = 0; i < 8; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hb;
        hb *= SS_MULT_B;
        v *= hb;
        v ^= v >> SS_XSHIFT;
        out[i] = v;
    }
    for (uint32_t i = 0; i < 4; i++)
        words[i] = (uint64_t)out[2 * i] | (uint64_t)out[2 * i + 1] << 32;
}

/* (hi:lo) = (hi:lo) * (PCG_MULT) + (inc) modulo 2^128 */
static void pcg_step(np_pcg64 *g) {
    const uint64_t a = g->state_lo, b = PCG_MULT_LO;
    /* 64 x 64 -> 128 of the low halves, from 32-bit pieces */
    const uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
    const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    const uint64_t lo = (p00 & 0xffffffffu) | mid << 32;
    uint64_t hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
    hi += g->state_hi * PCG_MULT_LO + g->state_lo * PCG_MULT_HI;
    const uint64_t new_lo = lo + g->inc_lo;
    hi += g->inc_hi + (new_lo < lo);
    g->state_lo = new_lo;
    g->state_hi = hi;
}

void np_pcg64_seed(np_pcg64 *g, uint64_t seed) {
    uint64_t w[4];
    seed_sequence_state(seed, w);
    /* pcg64_set_seed: state = (w0:w1), increment = ((w2:w3) << 1) | 1 */
    g->inc_hi = w[2] << 1 | w[3] >> 63;
    g->inc_lo = w[3] << 1 | 1u;
    g->state_hi = g->state_lo = 0;
    pcg_step(g);
    const uint64_t lo = g->state_lo + w[1];
    g->state_hi += w[0] + (lo < g->state_lo);
    g->state_lo = lo;
    pcg_step(g);
    g->has_buffered = 0;
    g->buffered = 0;
}

uint64_t np_pcg64_next64(np_pcg64 *g) {
    pcg_step(g);
    /* XSL-RR: xor the halves, rotate right by the top 6 bits */
    const uint64_t x = g->state_hi ^ g->state_lo;
    const unsigned rot = (unsigned)(g->state_hi >> 58);
    return rot ? x >> rot | x << (64 - rot) : x;
}

uint32_t np_pcg64_next32(np_pcg64 *g) {
    if (g->has_buffered) {
        g->has_buffered = 0;
        return g->buffered;
    }
    const uint64_t v = np_pcg64_next64(g);
    g->has_buffered = 1;
    g->buffered = (uint32_t)(v >> 32);
    return (uint32_t)v;
}

double np_pcg64_double(np_pcg64 *g) {
    return (double)(np_pcg64_next64(g) >> 11) * (1.0 / 9007199254740992.0);
}

void np_pcg64_permutation(np_pcg64 *g, uint32_t n, uint32_t *p) {
    for (uint32_t i = 0; i < n; i++) p[i] = i;
    for (uint32_t i = n; i-- > 1;) {
        uint32_t mask = i;
        mask |= mask >> 1;
        mask |= mask >> 2;
        mask |= mask >> 4;
        mask |= mask >> 8;
        mask |= mask >> 16;
        uint32_t j;
        while ((j = np_pcg64_next32(g) & mask) > i) {}
        const uint32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}
