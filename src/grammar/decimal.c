/* Fixed-point decimals (see decimal.h). Doubles are converted through Python's repr
 * spelling (gram_python_float), which is the shortest string that reads back as the same
 * double, so a bound written "0.1" in the tools JSON is the decimal 0.1. */
#include "grammar/decimal.h"

#include <string.h>

#include "grammar/json_canon.h"

uint64_t gram_dec_pow10(int e) {
    uint64_t p = 1;
    while (e-- > 0) p *= 10;
    return p;
}

int gram_fx_cmp(gram_fx a, gram_fx b) {
    if (a.ip != b.ip) return a.ip < b.ip ? -1 : 1;
    if (a.fp != b.fp) return a.fp < b.fp ? -1 : 1;
    return 0;
}

gram_fx gram_fx_neg(gram_fx a) {
    gram_fx r;
    if (a.fp == 0) {
        r.ip = -a.ip;
        r.fp = 0;
    } else {
        r.ip = -a.ip - 1;
        r.fp = GRAM_FX_ONE - a.fp;
    }
    return r;
}

gram_fx gram_fx_add(gram_fx a, uint64_t units) {
    a.fp += units;
    if (a.fp >= GRAM_FX_ONE) {
        a.fp -= GRAM_FX_ONE;
        a.ip++;
    }
    return a;
}

gram_fx gram_fx_sub(gram_fx a, uint64_t units) {
    if (a.fp >= units) {
        a.fp -= units;
    } else {
        a.fp = a.fp + GRAM_FX_ONE - units;
        a.ip--;
    }
    return a;
}

gram_fx gram_fx_make(int neg, uint64_t ip, uint64_t fp) {
    gram_fx r = {(int64_t)ip, fp};
    return neg ? gram_fx_neg(r) : r;
}

gram_fx gram_fx_max(void) {
    gram_fx r = {GRAM_FX_MAX_INT, GRAM_FX_ONE - 1};
    return r;
}

/* Digits of v's shortest spelling: v = (-1)^neg * 0.d[0]d[1]... * 10^point. */
static int spell(double v, char *d, int *nd, int *point) {
    char text[40];
    gram_python_float(v, text);
    const char *s = text;
    int neg = 0, n = 0, pt = 0, seen_dot = 0;
    if (*s == '-') neg = 1, s++;
    for (; *s && *s != 'e'; s++) {
        if (*s == '.') { seen_dot = 1; continue; }
        if (n == 0 && *s == '0') { /* leading zeros only move the point */
            if (seen_dot) pt--;
            continue;
        }
        d[n++] = *s;
        if (!seen_dot) pt++;
    }
    if (*s == 'e') {
        int e = 0, es = 1;
        s++;
        if (*s == '-') es = -1, s++;
        else if (*s == '+') s++;
        for (; *s; s++) e = e * 10 + (*s - '0');
        pt += es * e;
    }
    while (n > 0 && d[n - 1] == '0') n--;
    *nd = n;
    *point = pt;
    return neg;
}

int gram_fx_from_double(double v, int round_up, gram_fx *out, int *exact) {
    char d[40];
    int nd, pt;
    int neg = spell(v, d, &nd, &pt);
    *exact = 1;
    if (nd == 0) {
        gram_fx z = {0, 0};
        *out = z;
        return 0;
    }
    if (pt > 18) {
        *out = neg ? gram_fx_neg(gram_fx_max()) : gram_fx_max();
        *exact = 0;
        return neg ? -1 : 1;
    }
    uint64_t ip = 0, fp = 0;
    for (int i = 0; i < pt; i++) ip = ip * 10 + (uint64_t)(i < nd ? d[i] - '0' : 0);
    int rest = 0;
    for (int i = 0; i < 18; i++) { /* fraction digit i is d[pt + i] */
        int j = pt + i;
        fp = fp * 10 + (uint64_t)(j >= 0 && j < nd ? d[j] - '0' : 0);
    }
    if (pt + 18 < nd) rest = 1; /* digits beyond the grid (all significant: no trailing 0) */
    if (rest) {
        *exact = 0;
        if (round_up != neg) { /* away from zero in magnitude */
            if (++fp == GRAM_FX_ONE) fp = 0, ip++;
        }
    }
    if (ip > (uint64_t)GRAM_FX_MAX_INT) { /* rounding reached 1e18 */
        *out = neg ? gram_fx_neg(gram_fx_max()) : gram_fx_max();
        return neg ? -1 : 1;
    }
    *out = gram_fx_make(neg, ip, fp);
    return 0;
}

int64_t gram_fx_scaled(gram_fx v, int scale, int round_up) {
    const int64_t sat = (int64_t)GRAM_FX_ONE;
    int64_t lim = (int64_t)gram_dec_pow10(18 - scale);
    if (v.ip >= lim) return sat;
    if (v.ip < -lim) return -sat;
    uint64_t unit = gram_dec_pow10(18 - scale);
    int64_t r = v.ip * (int64_t)gram_dec_pow10(scale) + (int64_t)(v.fp / unit);
    if (round_up && v.fp % unit) r++;
    return r;
}

int gram_dec_multiple_of(double m, int64_t *k, int *scale) {
    if (!(m > 0)) return -1;
    char d[40];
    int nd, pt;
    spell(m, d, &nd, &pt);
    if (nd == 0 || nd > 18) return -1;
    uint64_t digits = 0;
    for (int i = 0; i < nd; i++) digits = digits * 10 + (uint64_t)(d[i] - '0');
    int e = pt - nd; /* m = digits * 10^e */
    if (e >= 0) {
        if (nd + e > 18) return -1;
        *k = (int64_t)(digits * gram_dec_pow10(e));
        *scale = 0;
    } else {
        if (-e > 9) return -1;
        *k = (int64_t)digits;
        *scale = -e;
    }
    return 0;
}
