#include "quant/mt19937.h"

void mt_seed(mt19937 *m, uint32_t seed) {
    m->s[0] = seed;
    for (int i = 1; i < 624; i++) m->s[i] = 1812433253u * (m->s[i - 1] ^ (m->s[i - 1] >> 30)) + (uint32_t)i;
    m->i = 624;
}

uint32_t mt_next(mt19937 *m) {
    if (m->i >= 624) {
        for (int k = 0; k < 624; k++) {
            const uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
            m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        m->i = 0;
    }
    uint32_t y = m->s[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

void mt_permutation(uint32_t seed, uint32_t n, uint32_t *p) {
    mt19937 m;
    mt_seed(&m, seed);
    for (uint32_t i = 0; i < n; i++) p[i] = i;
    for (uint32_t i = n - 1; i >= 1 && n > 1; i--) {
        uint32_t mask = i; /* the smallest all-ones mask covering i */
        mask |= mask >> 1;
        mask |= mask >> 2;
        mask |= mask >> 4;
        mask |= mask >> 8;
        mask |= mask >> 16;
        uint32_t j;
        while ((j = mt_next(&m) & mask) > i) {
        }
        const uint32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}
