/* Number frames of the recognizer (see schema_ir.h for the three modes).
 *
 * Syntax is JSON's, compact, with a lowercase exponent only (Python never writes 'E'):
 *   -?(0|[1-9][0-9]*)(\.[0-9]+)?(e[+-]?[0-9]+)?
 * GRAM_NUM_FREE accepts exactly that. GRAM_NUM_EXACT drops the exponent and caps integer and
 * fraction digits at 18; GRAM_NUM_SCALED (integers, multipleOf, unique items) allows at most
 * `scale` fraction digits (then only zeros) and digits - scale integer digits, and no
 * fraction at all for type integer.
 *
 * Liveness: a bounded number accepts a byte only if some completion of the new prefix is
 * in range (and a multiple of the step, and not yet used in a unique array). The set of
 * values reachable from a prefix is a union of at most 19 intervals:
 *   "-"            [-MAX, 0]
 *   "0"            [0, 1)                           (integers: {0})
 *   N (c digits)   [N*10^j, (N+1)*10^j) for j = 0 .. 18 - c   (more digits, a fraction)
 *   N. / N.ddd     [N.ddd, N.ddd + 10^-f)           (more fraction digits)
 * negated after a minus sign. The interval ends are exact on the value grid (1e-18, or
 * 10^-scale), so "nonempty intersection" is an exact test, not a float approximation. */
#include <string.h>

#include "grammar/recognizer.h"

enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_ZEROS, N_E, N_ESIGN, N_EXP };


static uint64_t gram_fx_key(gram_fx v) { return gram_mix(gram_mix(0, (uint64_t)v.ip), v.fp); }

int gram_num_started(const grammar_frame *f) { return f->phase != N_START; }

/* ---- syntax ----------------------------------------------------------------------------- */

static int max_int_digits(const gram_node *n) {
    return n->u.num.mode == GRAM_NUM_SCALED ? n->u.num.digits - n->u.num.scale : n->u.num.mode == GRAM_NUM_EXACT ? 18 : 255;
}

/* An EXACT node with a digit budget (unbounded numbers, whose range [-2^53, 2^53] needs
 * at most 16 integer digits, so "." always has a digit left): no digit past it. */
static int exact_budget_spent(const gram_node *n, const grammar_frame *t) {
    return n->u.num.mode == GRAM_NUM_EXACT && n->u.num.digits && t->u.num.idig + t->u.num.fdig >= n->u.num.digits;
}

static int frac_allowed(const gram_node *n) {
    return n->u.num.mode != GRAM_NUM_SCALED || n->u.num.allow_frac;
}

/* Advances t by b according to the syntax and digit caps only. */
static int advance(const gram_node *n, grammar_frame *t, uint8_t b) {
    int digit = b >= '0' && b <= '9', d = b - '0';
    int mode = n->u.num.mode, scale = n->u.num.scale;
    switch (t->phase) {
    case N_START:
    case N_MINUS:
        if (b == '-' && t->phase == N_START) {
            t->u.num.neg = 1;
            t->phase = N_MINUS;
            return 1;
        }
        if (!digit) return 0;
        t->phase = d ? N_INT : N_ZERO;
        t->u.num.ip = (uint64_t)d;
        t->u.num.idig = 1;
        return 1;
    case N_ZERO:
    case N_INT:
        if (digit && t->phase == N_INT) {
            if (t->u.num.idig >= max_int_digits(n) || exact_budget_spent(n, t)) return 0;
            if (mode != GRAM_NUM_FREE) t->u.num.ip = t->u.num.ip * 10 + (uint64_t)d;
            t->u.num.idig++;
            return 1;
        }
        if (b == '.' && frac_allowed(n)) {
            t->phase = N_DOT;
            return 1;
        }
        if (b == 'e' && mode == GRAM_NUM_FREE) {
            t->phase = N_E;
            return 1;
        }
        return 0;
    case N_DOT:
    case N_FRAC:
        if (digit) {
            if (mode == GRAM_NUM_SCALED && t->u.num.fdig >= scale) {
                if (d) return 0; /* past the step's precision only zeros keep the value */
                t->phase = N_ZEROS;
                t->u.num.fdig++;
                return 1;
            }
            if (mode == GRAM_NUM_EXACT) {
                if (t->u.num.fdig >= 18 || exact_budget_spent(n, t)) return 0;
                t->u.num.fp += (uint64_t)d * gram_dec_pow10(17 - t->u.num.fdig);
            } else if (mode == GRAM_NUM_SCALED) {
                t->u.num.fp = t->u.num.fp * 10 + (uint64_t)d;
            }
            t->phase = N_FRAC;
            t->u.num.fdig++;
            return 1;
        }
        if (b == 'e' && mode == GRAM_NUM_FREE && t->phase == N_FRAC) {
            t->phase = N_E;
            return 1;
        }
        return 0;
    case N_ZEROS:
        if (b != '0' || t->u.num.fdig >= 18) return 0;
        t->u.num.fdig++;
        return 1;
    case N_E:
    case N_ESIGN:
    case N_EXP:
        if ((b == '+' || b == '-') && t->phase == N_E) {
            t->phase = N_ESIGN;
            return 1;
        }
        if (!digit) return 0;
        t->phase = N_EXP;
        return 1;
    default: return 0;
    }
}

/* ---- GRAM_NUM_SCALED --------------------------------------------------------------------------- */

/* Magnitude read so far in units of 10^-scale (phases ZERO, INT, FRAC, ZEROS, DOT). */
static int64_t scaled_mag(const gram_node *n, const grammar_frame *f) {
    int s = n->u.num.scale, fd = f->u.num.fdig < s ? f->u.num.fdig : s;
    if (f->phase == N_ZERO) return 0;
    return (int64_t)(f->u.num.ip * gram_dec_pow10(s) + f->u.num.fp * gram_dec_pow10(s - fd));
}

static int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
static int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

/* Some multiple of step in [x, y] (magnitudes already signed) is in range and unused. */
static int scaled_hit(const gram_node *n, int64_t x, int64_t y, const gram_used *u) {
    if (x < n->u.num.slo) x = n->u.num.slo;
    if (y > n->u.num.shi) y = n->u.num.shi;
    if (x > y) return 0;
    int64_t step = n->u.num.step, a = ceil_div(x, step), z = floor_div(y, step);
    if (a > z) return 0;
    if ((uint64_t)(z - a) >= u->n) return 1; /* more candidates than used values */
    for (int64_t m = a; m <= z; m++)
        if (!gram_used_has(u, (uint64_t)(m * step))) return 1;
    return 0;
}

static int scaled_interval(const gram_node *n, int neg, int64_t lo, int64_t hi, const gram_used *u) {
    return neg ? scaled_hit(n, -hi, -lo, u) : scaled_hit(n, lo, hi, u);
}

static int scaled_live(const gram_node *n, const grammar_frame *f, const gram_used *u) {
    int s = n->u.num.scale, neg = f->u.num.neg;
    int64_t unit = (int64_t)gram_dec_pow10(s), top = (int64_t)gram_dec_pow10(n->u.num.digits) - 1;
    switch (f->phase) {
    case N_START: return 1; /* the node admits some value; unique arrays keep one unused */
    case N_MINUS: return scaled_interval(n, 1, 0, top, u);
    case N_ZERO: return scaled_interval(n, neg, 0, n->u.num.allow_frac ? unit - 1 : 0, u);
    case N_INT: {
        int64_t ip = (int64_t)f->u.num.ip;
        for (int j = 0; j <= n->u.num.digits - s - f->u.num.idig; j++) {
            int64_t p = (int64_t)gram_dec_pow10(j + s);
            int64_t hi = n->u.num.allow_frac || j + s == 0 ? (ip + 1) * p - 1 : (ip + 1) * p - 1;
            if (scaled_interval(n, neg, ip * p, hi, u)) return 1;
        }
        return 0;
    }
    case N_DOT: return scaled_interval(n, neg, scaled_mag(n, f), scaled_mag(n, f) + unit - 1, u);
    case N_FRAC: {
        int64_t v = scaled_mag(n, f), w = (int64_t)gram_dec_pow10(s - f->u.num.fdig);
        return scaled_interval(n, neg, v, v + w - 1, u);
    }
    case N_ZEROS: return scaled_interval(n, neg, scaled_mag(n, f), scaled_mag(n, f), u);
    default: return 0;
    }
}

/* ---- GRAM_NUM_EXACT ------------------------------------------------------------------------------ */

/* Some grid point of [x, y] is in range and unused. */
static int exact_hit(const gram_node *n, gram_fx x, gram_fx y, const gram_used *u) {
    if (gram_fx_cmp(x, n->u.num.lo) < 0) x = n->u.num.lo;
    if (gram_fx_cmp(y, n->u.num.hi) > 0) y = n->u.num.hi;
    if (gram_fx_cmp(x, y) > 0) return 0;
    if (!u->n || y.ip - x.ip >= 2) return 1;
    uint64_t span = (uint64_t)(y.ip - x.ip) * GRAM_FX_ONE + y.fp - x.fp; /* grid steps */
    if (span >= u->n) return 1;
    for (uint64_t i = 0; i <= span; i++, x = gram_fx_add(x, 1))
        if (!gram_used_has(u, gram_fx_key(x))) return 1;
    return 0;
}

/* Magnitude interval [lo, hi] (non-negative), negated after a minus sign. */
static int exact_interval(const gram_node *n, int neg, gram_fx lo, gram_fx hi, const gram_used *u) {
    return neg ? exact_hit(n, gram_fx_neg(hi), gram_fx_neg(lo), u) : exact_hit(n, lo, hi, u);
}

static int exact_live(const gram_node *n, const grammar_frame *f, const gram_used *u) {
    int neg = f->u.num.neg;
    gram_fx zero = {0, 0}, below_one = {0, GRAM_FX_ONE - 1};
    switch (f->phase) {
    case N_START: return 1;
    case N_MINUS: return exact_interval(n, 1, zero, gram_fx_max(), u);
    case N_ZERO: return exact_interval(n, neg, zero, below_one, u);
    case N_INT:
        for (int j = 0; j <= 18 - f->u.num.idig; j++) {
            uint64_t p = gram_dec_pow10(j);
            gram_fx lo = {(int64_t)(f->u.num.ip * p), 0}, hi = {(int64_t)((f->u.num.ip + 1) * p - 1), GRAM_FX_ONE - 1};
            if (exact_interval(n, neg, lo, hi, u)) return 1;
        }
        return 0;
    case N_DOT:
    case N_FRAC: {
        gram_fx lo = {(int64_t)f->u.num.ip, f->u.num.fp};
        gram_fx hi = gram_fx_add(lo, gram_dec_pow10(18 - f->u.num.fdig) - 1);
        return exact_interval(n, neg, lo, hi, u);
    }
    default: return 0;
    }
}

static gram_fx exact_value(const grammar_frame *f) {
    return gram_fx_make(f->u.num.neg, f->phase == N_ZERO ? 0 : f->u.num.ip, f->u.num.fp);
}

/* ---- entry points ------------------------------------------------------------------------- */

int gram_num_step(const gram_node *n, grammar_frame *f, uint8_t b, const gram_used *u) {
    grammar_frame t = *f;
    if (!advance(n, &t, b)) return 0;
    if (n->u.num.mode == GRAM_NUM_SCALED && !scaled_live(n, &t, u)) return 0;
    if (n->u.num.mode == GRAM_NUM_EXACT && !exact_live(n, &t, u)) return 0;
    *f = t;
    return 1;
}

int gram_num_can_end(const gram_node *n, const grammar_frame *f, const gram_used *u) {
    int ph = f->phase;
    switch (n->u.num.mode) {
    case GRAM_NUM_FREE: return ph == N_ZERO || ph == N_INT || ph == N_FRAC || ph == N_EXP;
    case GRAM_NUM_EXACT: {
        if (ph != N_ZERO && ph != N_INT && ph != N_FRAC) return 0;
        gram_fx v = exact_value(f);
        if (gram_fx_cmp(v, n->u.num.lo) < 0 || gram_fx_cmp(v, n->u.num.hi) > 0) return 0;
        return !gram_used_has(u, gram_fx_key(v));
    }
    default: {
        if (ph != N_ZERO && ph != N_INT && ph != N_FRAC && ph != N_ZEROS) return 0;
        int64_t v = scaled_mag(n, f);
        if (f->u.num.neg) v = -v;
        if (v < n->u.num.slo || v > n->u.num.shi || v % n->u.num.step) return 0;
        return !gram_used_has(u, (uint64_t)v);
    }
    }
}

uint64_t gram_num_key(const gram_node *n, const grammar_frame *f) {
    if (n->u.num.mode == GRAM_NUM_EXACT) return gram_fx_key(exact_value(f));
    if (n->u.num.mode == GRAM_NUM_SCALED) {
        int64_t v = scaled_mag(n, f);
        return (uint64_t)(f->u.num.neg ? -v : v);
    }
    return 0;
}
