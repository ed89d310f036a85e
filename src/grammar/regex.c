/* Pattern -> AST -> Thompson NFA -> DFA (subset construction) over code-point classes
 * (see regex.h for the subset). Everything is built at schema compile time; the DFA is
 * then pruned of dead states so that the recognizer can treat "has a transition" as "can
 * still match", which is what keeps it free of dead ends. Sizes are capped (NFA states,
 * DFA states, repetition counts) so a hostile pattern fails with a message instead of
 * exhausting memory. */
#include "grammar/regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/utf8.h"

#define CP_END 0x110000u
#define MAX_NFA 60000
#define MAX_REPEAT 1000

typedef struct range { uint32_t lo, hi; } range; /* inclusive */

/* growable array of T */
#define VEC(T) struct { T *v; size_t n, cap; }
#define VEC_PUSH(vec, x, oom)                                                     \
    do {                                                                          \
        if ((vec).n == (vec).cap) {                                               \
            size_t c_ = (vec).cap ? (vec).cap * 2 : 16;                           \
            void *p_ = realloc((vec).v, c_ * sizeof *(vec).v);                    \
            if (!p_) { oom; }                                                     \
            else { (vec).v = p_; (vec).cap = c_; }                                \
        }                                                                         \
        if ((vec).n < (vec).cap) (vec).v[(vec).n++] = (x);                        \
    } while (0)

enum { AX_SET, AX_CAT, AX_ALT, AX_REP, AX_EMPTY };
typedef struct ast { int type, a, b, min, max; uint32_t set_first, set_n; } ast;

enum { NS_EPS, NS_SET, NS_MATCH };
typedef struct nstate { int type, out1, out2; uint32_t set_first, set_n; } nstate;

typedef struct rx {
    const char *p, *end;
    int depth;
    int oom;
    char *err;
    size_t err_len;
    VEC(range) ranges; /* sets are slices of this pool, sorted and merged */
    VEC(ast) nodes;
    VEC(nstate) nfa;
} rx;

static int rx_fail(rx *r, const char *fmt, ...) {
    if (r->err && r->err_len && !r->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---- parsing ------------------------------------------------------------------------ */

static int peek_cp(const rx *r, uint32_t *cp, int *n) {
    size_t left = (size_t)(r->end - r->p);
    if (!left) return 0;
    int len = util_utf8_next((const uint8_t *)r->p, left, cp, NULL);
    if (len <= 0) return -1;
    *n = len;
    return 1;
}

static int next_cp(rx *r, uint32_t *cp) {
    int n, st = peek_cp(r, cp, &n);
    if (st < 0) return rx_fail(r, "pattern is not valid UTF-8");
    if (st == 0) return rx_fail(r, "pattern ends unexpectedly");
    r->p += n;
    return 0;
}

static int at(const rx *r, char c) { return r->p < r->end && *r->p == c; }

/* A node of the pattern's syntax tree (the grammar builder's nodes are gram_new_node). */
static int ast_new(rx *r, int type, int a, int b) {
    ast x = {type, a, b, 0, 0, 0, 0};
    VEC_PUSH(r->nodes, x, r->oom = 1);
    return r->oom ? -1 : (int)r->nodes.n - 1;
}

static int cmp_range(const void *x, const void *y) {
    const range *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Sorts and merges tmp[0, n), optionally complements it, and stores it as a set node. */
static int set_node(rx *r, range *tmp, size_t n, int negate) {
    qsort(tmp, n, sizeof *tmp, cmp_range);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && tmp[i].lo <= tmp[m - 1].hi + 1) {
            if (tmp[i].hi > tmp[m - 1].hi) tmp[m - 1].hi = tmp[i].hi;
        } else {
            tmp[m++] = tmp[i];
        }
    }
    int id = ast_new(r, AX_SET, 0, 0);
    if (id < 0) return -1;
    uint32_t first = (uint32_t)r->ranges.n, next = 0;
    for (size_t i = 0; i <= m; i++) {
        range x;
        if (negate) {
            uint32_t stop = i < m ? tmp[i].lo : CP_END;
            if (stop <= next) { next = i < m ? tmp[i].hi + 1 : next; continue; }
            x.lo = next;
            x.hi = stop - 1;
            if (i < m) next = tmp[i].hi + 1;
        } else {
            if (i == m) break;
            x = tmp[i];
        }
        VEC_PUSH(r->ranges, x, r->oom = 1);
    }
    if (r->oom) return -1;
    r->nodes.v[id].set_first = first;
    r->nodes.v[id].set_n = (uint32_t)r->ranges.n - first;
    return id;
}

typedef struct rbuf { range v[64]; size_t n; } rbuf;

static int rb_add(rx *r, rbuf *b, uint32_t lo, uint32_t hi) {
    if (b->n == sizeof b->v / sizeof b->v[0]) return rx_fail(r, "character class too complex");
    b->v[b->n].lo = lo;
    b->v[b->n].hi = hi;
    b->n++;
    return 0;
}

/* Adds the ranges of \d \w \s (or their complements) to b. */
static int add_class_escape(rx *r, rbuf *b, char c) {
    static const range digit[] = {{'0', '9'}};
    static const range word[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const range space[] = {{9, 13}, {32, 32}, {0xA0, 0xA0}, {0x1680, 0x1680},
                                  {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                  {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    const range *set;
    size_t n;
    switch (c | 0x20) {
    case 'd': set = digit; n = 1; break;
    case 'w': set = word; n = 4; break;
    default: set = space; n = sizeof space / sizeof space[0]; break;
    }
    if (c >= 'a') {
        for (size_t i = 0; i < n; i++)
            if (rb_add(r, b, set[i].lo, set[i].hi)) return -1;
        return 0;
    }
    uint32_t next = 0; /* complement */
    for (size_t i = 0; i < n; i++) {
        if (set[i].lo > next && rb_add(r, b, next, set[i].lo - 1)) return -1;
        next = set[i].hi + 1;
    }
    return rb_add(r, b, next, CP_END - 1);
}

static int hex_digits(rx *r, int n, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < n; i++) {
        if (r->p >= r->end) return rx_fail(r, "truncated hex escape in pattern");
        char c = *r->p++;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return rx_fail(r, "bad hex escape in pattern");
        *v = *v * 16 + (uint32_t)d;
    }
    if (*v >= 0xD800 && *v <= 0xDFFF) return rx_fail(r, "surrogate escape in pattern");
    return 0;
}

/* After a backslash. Returns 1 with *cp for a single character, 2 when a class escape was
 * added to b, -1 on error. */
static int parse_escape(rx *r, rbuf *b, int in_class, uint32_t *cp) {
    if (r->p >= r->end) return rx_fail(r, "pattern ends with a backslash");
    char c = *r->p;
    if (strchr("dDwWsS", c) && c) {
        r->p++;
        return add_class_escape(r, b, c) ? -1 : 2;
    }
    switch (c) {
    case 't': r->p++; *cp = '\t'; return 1;
    case 'n': r->p++; *cp = '\n'; return 1;
    case 'r': r->p++; *cp = '\r'; return 1;
    case 'f': r->p++; *cp = '\f'; return 1;
    case 'v': r->p++; *cp = '\v'; return 1;
    case '0': r->p++; *cp = 0; return 1;
    case 'x': r->p++; return hex_digits(r, 2, cp) ? -1 : 1;
    case 'u': r->p++; return hex_digits(r, 4, cp) ? -1 : 1;
    case 'b':
        if (in_class) { r->p++; *cp = '\b'; return 1; }
        return rx_fail(r, "word boundary \\b is not supported in patterns");
    default: break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9'))
        return rx_fail(r, "escape \\%c is not supported in patterns", c);
    if (next_cp(r, cp)) return -1; /* escaped punctuation or other character: itself */
    return 1;
}

static int parse_class(rx *r) {
    rbuf b = {.n = 0};
    int negate = 0;
    if (at(r, '^')) negate = 1, r->p++;
    for (int first = 1;; first = 0) {
        if (r->p >= r->end) return rx_fail(r, "unterminated [ in pattern");
        if (*r->p == ']') {
            r->p++;
            break;
        }
        (void)first;
        uint32_t lo, hi;
        int kind = 1;
        if (*r->p == '\\') {
            r->p++;
            kind = parse_escape(r, &b, 1, &lo);
            if (kind < 0) return -1;
            if (kind == 2) continue;
        } else if (next_cp(r, &lo)) {
            return -1;
        }
        hi = lo;
        if (at(r, '-') && r->end - r->p > 1 && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                rbuf dummy = {.n = 0};
                int k2 = parse_escape(r, &dummy, 1, &hi);
                if (k2 < 0) return -1;
                if (k2 == 2) return rx_fail(r, "class escape used as a range end in pattern");
            } else if (next_cp(r, &hi)) {
                return -1;
            }
            if (hi < lo) return rx_fail(r, "range out of order in character class");
        }
        if (rb_add(r, &b, lo, hi)) return -1;
    }
    return set_node(r, b.v, b.n, negate);
}

static int parse_alt(rx *r);

static int parse_atom(rx *r, int at_alt_start) {
    char c = *r->p;
    rbuf b = {.n = 0};
    uint32_t cp;
    switch (c) {
    case '(': {
        r->p++;
        if (at(r, '?')) {
            if (r->end - r->p >= 2 && r->p[1] == ':') r->p += 2;
            else return rx_fail(r, "lookaround and named groups are not supported in patterns");
        }
        r->depth++;
        int inner = parse_alt(r);
        r->depth--;
        if (inner < 0) return -1;
        if (!at(r, ')')) return rx_fail(r, "missing ) in pattern");
        r->p++;
        return inner;
    }
    case '[': r->p++; return parse_class(r);
    case '.':
        r->p++;
        rb_add(r, &b, '\n', '\n');
        rb_add(r, &b, '\r', '\r');
        rb_add(r, &b, 0x2028, 0x2029);
        return set_node(r, b.v, b.n, 1);
    case '^':
        if (r->depth == 0 && at_alt_start) { r->p++; return ast_new(r, AX_EMPTY, 0, 0); }
        return rx_fail(r, "^ is only supported at the start of the pattern");
    case '$':
        if (r->depth == 0 && (r->p + 1 == r->end || r->p[1] == '|')) {
            r->p++;
            return ast_new(r, AX_EMPTY, 0, 0);
        }
        return rx_fail(r, "$ is only supported at the end of the pattern");
    case '*': case '+': case '?':
        return rx_fail(r, "quantifier %c without anything to repeat in pattern", c);
    case '\\': {
        r->p++;
        int kind = parse_escape(r, &b, 0, &cp);
        if (kind < 0) return -1;
        if (kind == 2) return set_node(r, b.v, b.n, 0);
        break;
    }
    default:
        if (next_cp(r, &cp)) return -1;
    }
    range one = {cp, cp};
    return set_node(r, &one, 1, 0);
}

static int parse_number(rx *r, int *v) {
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return 0;
    long x = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        x = x * 10 + (*r->p++ - '0');
        if (x > MAX_REPEAT) x = MAX_REPEAT + 1;
    }
    *v = (int)x;
    return 1;
}

/* Reads a quantifier at r->p if there is one: 1 with min/max (-1 = unbounded), else 0. */
static int parse_quant(rx *r, int *min, int *max) {
    if (r->p >= r->end) return 0;
    char c = *r->p;
    if (c == '?' || c == '*' || c == '+') {
        r->p++;
        *min = c == '+';
        *max = c == '?' ? 1 : -1;
        return 1;
    }
    if (c != '{') return 0;
    const char *save = r->p;
    r->p++;
    if (!parse_number(r, min)) { r->p = save; return 0; }
    *max = *min;
    if (at(r, ',')) {
        r->p++;
        if (!parse_number(r, max)) *max = -1;
    }
    if (!at(r, '}')) { r->p = save; return 0; } /* not a quantifier: a literal '{' */
    r->p++;
    return 1;
}

static int parse_repeat(rx *r, int at_alt_start) {
    int atom = parse_atom(r, at_alt_start);
    if (atom < 0) return -1;
    int min, max;
    if (!parse_quant(r, &min, &max)) return atom;
    if (min > MAX_REPEAT || max > MAX_REPEAT)
        return rx_fail(r, "repetition count above %d in pattern", MAX_REPEAT);
    if (max >= 0 && max < min) return rx_fail(r, "repetition {m,n} with n < m in pattern");
    if (at(r, '?')) r->p++; /* lazy: same language */
    int dummy_min, dummy_max;
    const char *save = r->p;
    if (parse_quant(r, &dummy_min, &dummy_max)) {
        r->p = save;
        return rx_fail(r, "nested quantifier in pattern");
    }
    int id = ast_new(r, AX_REP, atom, 0);
    if (id < 0) return -1;
    r->nodes.v[id].min = min;
    r->nodes.v[id].max = max;
    return id;
}

static int parse_cat(rx *r) {
    int node = -1;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        int item = parse_repeat(r, node < 0);
        if (item < 0) return -1;
        node = node < 0 ? item : ast_new(r, AX_CAT, node, item);
        if (node < 0) return -1;
    }
    return node < 0 ? ast_new(r, AX_EMPTY, 0, 0) : node;
}

static int parse_alt(rx *r) {
    int left = parse_cat(r);
    while (left >= 0 && at(r, '|')) {
        r->p++;
        int right = parse_cat(r);
        if (right < 0) return -1;
        left = ast_new(r, AX_ALT, left, right);
    }
    return left;
}

/* ---- NFA ------------------------------------------------------------------------------ */

typedef struct frag { int start, end; } frag;

static int nfa_new(rx *r, int type) {
    if (r->nfa.n >= MAX_NFA) return rx_fail(r, "pattern too large (repetitions expand beyond %d states)", MAX_NFA);
    nstate s = {type, -1, -1, 0, 0};
    VEC_PUSH(r->nfa, s, r->oom = 1);
    return r->oom ? -1 : (int)r->nfa.n - 1;
}

static int emit(rx *r, int node, frag *out);

static int emit_star(rx *r, int child, frag *out) {
    frag body;
    int s = nfa_new(r, NS_EPS), e = nfa_new(r, NS_EPS);
    if (s < 0 || e < 0 || emit(r, child, &body)) return -1;
    r->nfa.v[s].out1 = body.start;
    r->nfa.v[s].out2 = e;
    r->nfa.v[body.end].out1 = s;
    out->start = s;
    out->end = e;
    return 0;
}

static int emit(rx *r, int node, frag *out) {
    ast x = r->nodes.v[node];
    frag a, b;
    switch (x.type) {
    case AX_SET: {
        int s = nfa_new(r, NS_SET), e = nfa_new(r, NS_EPS);
        if (s < 0 || e < 0) return -1;
        r->nfa.v[s].out1 = e;
        r->nfa.v[s].set_first = x.set_first;
        r->nfa.v[s].set_n = x.set_n;
        out->start = s;
        out->end = e;
        return 0;
    }
    case AX_EMPTY: {
        int s = nfa_new(r, NS_EPS);
        if (s < 0) return -1;
        out->start = out->end = s;
        return 0;
    }
    case AX_CAT:
        if (emit(r, x.a, &a) || emit(r, x.b, &b)) return -1;
        r->nfa.v[a.end].out1 = b.start;
        out->start = a.start;
        out->end = b.end;
        return 0;
    case AX_ALT: {
        int s = nfa_new(r, NS_EPS), e = nfa_new(r, NS_EPS);
        if (s < 0 || e < 0 || emit(r, x.a, &a) || emit(r, x.b, &b)) return -1;
        r->nfa.v[s].out1 = a.start;
        r->nfa.v[s].out2 = b.start;
        r->nfa.v[a.end].out1 = e;
        r->nfa.v[b.end].out1 = e;
        out->start = s;
        out->end = e;
        return 0;
    }
    default: { /* AX_REP: min copies, then a star or nested optional copies */
        int s = nfa_new(r, NS_EPS);
        if (s < 0) return -1;
        frag cur = {s, s};
        for (int i = 0; i < x.min; i++) {
            frag f;
            if (emit(r, x.a, &f)) return -1;
            r->nfa.v[cur.end].out1 = f.start;
            cur.end = f.end;
        }
        if (x.max < 0) {
            frag f;
            if (emit_star(r, x.a, &f)) return -1;
            r->nfa.v[cur.end].out1 = f.start;
            cur.end = f.end;
        } else if (x.max > x.min) {
            /* x{0,k} as (x(x(...)?)?)?: every skip jumps straight to the end, so epsilon
             * closures stay small however large k is */
            int e = nfa_new(r, NS_EPS);
            if (e < 0) return -1;
            for (int i = x.min; i < x.max; i++) {
                int split = nfa_new(r, NS_EPS);
                frag f;
                if (split < 0 || emit(r, x.a, &f)) return -1;
                r->nfa.v[cur.end].out1 = split;
                r->nfa.v[split].out1 = f.start;
                r->nfa.v[split].out2 = e;
                cur.end = f.end;
            }
            r->nfa.v[cur.end].out1 = e;
            cur.end = e;
        }
        *out = cur;
        return 0;
    }
    }
}

/* ---- DFA (subset construction) -------------------------------------------------------- */

typedef struct subsets {
    VEC(int) pool;        /* concatenated sorted NFA state lists */
    VEC(uint32_t) first;  /* list i is pool[first[i], first[i + 1]) */
    uint32_t *table;      /* open addressing: index + 1 */
    size_t table_cap;
} subsets;

static uint64_t hash_list(const int *v, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint32_t)v[i]) * 1099511628211ull;
    return h;
}

static int cmp_int(const void *x, const void *y) {
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

/* Epsilon closure of list[0, n) into out (sorted). mark[] uses generation `gen`. */
static size_t closure(const rx *r, int *stack, int *out, size_t n, const int *list,
                      uint32_t *mark, uint32_t gen) {
    size_t sp = 0, m = 0;
    int lo = 0, hi = -1;
    for (size_t i = 0; i < n; i++) stack[sp++] = list[i];
    while (sp) {
        int s = stack[--sp];
        if (s < 0 || mark[s] == gen) continue;
        mark[s] = gen;
        out[m++] = s;
        if (hi < lo) lo = hi = s;
        if (s < lo) lo = s;
        if (s > hi) hi = s;
        if (r->nfa.v[s].type == NS_EPS) {
            stack[sp++] = r->nfa.v[s].out1;
            stack[sp++] = r->nfa.v[s].out2;
        }
    }
    /* Sorted, so that equal sets intern to one DFA state. Most closures are a few states
     * (insertion sort). A bounded repetition such as a{2,500} makes closures of hundreds
     * of states, where the quadratic sort took ~90% of a 0.4 s compile: those are read
     * back in order from mark[] when their ids are dense, else sorted by qsort. */
    if (m > 32 && (size_t)(hi - lo) < 16 * m) {
        size_t k = 0;
        for (int s = lo; s <= hi; s++)
            if (mark[s] == gen) out[k++] = s;
        return m;
    }
    if (m > 32) {
        qsort(out, m, sizeof *out, cmp_int);
        return m;
    }
    for (size_t i = 1; i < m; i++) {
        int v = out[i];
        size_t j = i;
        while (j && out[j - 1] > v) out[j] = out[j - 1], j--;
        out[j] = v;
    }
    return m;
}

/* Index of list in ss (added if new); -1 on OOM, -3 when over the state cap. */
static long intern(subsets *ss, const int *list, size_t n, int *oom) {
    uint64_t h = hash_list(list, n);
    size_t mask = ss->table_cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        uint32_t e = ss->table[i];
        if (!e) {
            size_t id = ss->first.n - 1;
            if (id >= GRAM_REGEX_MAX_STATES) return -3;
            for (size_t k = 0; k < n; k++) VEC_PUSH(ss->pool, list[k], *oom = 1);
            uint32_t end = (uint32_t)ss->pool.n;
            VEC_PUSH(ss->first, end, *oom = 1);
            if (*oom) return -1;
            ss->table[i] = (uint32_t)id + 1;
            return (long)id;
        }
        uint32_t id = e - 1, a = ss->first.v[id], b = ss->first.v[id + 1];
        if (b - a == n && !memcmp(ss->pool.v + a, list, n * sizeof *list)) return id;
    }
}

static int cmp_u32(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

/* the class holding code point cp: the last whose lower bound is at most cp */
static uint32_t class_of(const gram_dfa *d, uint32_t cp) {
    uint32_t lo = 0, hi = d->n_classes; /* bounds[lo] <= cp < bounds[hi] */
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (d->bounds[mid] <= cp) lo = mid;
        else hi = mid;
    }
    return lo;
}

static int build_dfa(rx *r, int start, int match, gram_dfa *d) {
    int rc = -2;
    size_t nn = r->nfa.n;
    subsets ss = {0};
    subsets ts = {0}; /* the target lists met so far (a memo of their states, tid) */
    uint32_t *rclass = NULL; /* [range][2]: its first and last class */
    size_t *ccount = NULL, moves_cap = 0;
    int *moves = NULL;
    VEC(long) tid = {0};
    int *stack = malloc(2 * nn * sizeof *stack + 8), *tmp = malloc(nn * sizeof *tmp + 8);
    uint32_t *mark = calloc(nn + 1, sizeof *mark), gen = 0;
    VEC(int32_t) trans = {0};
    /* classes: every range start and end + 1 */
    uint32_t *cuts = malloc((2 * r->ranges.n + 2) * sizeof *cuts);
    if (!stack || !tmp || !mark || !cuts) goto done;
    size_t nc = 0;
    cuts[nc++] = 0;
    for (size_t i = 0; i < r->ranges.n; i++) {
        cuts[nc++] = r->ranges.v[i].lo;
        cuts[nc++] = r->ranges.v[i].hi + 1;
    }
    qsort(cuts, nc, sizeof *cuts, cmp_u32);
    size_t u = 0;
    for (size_t i = 0; i < nc; i++)
        if (cuts[i] < CP_END && (!u || cuts[i] != cuts[u - 1])) cuts[u++] = cuts[i];
    d->n_classes = (uint32_t)u;
    d->bounds = malloc((u + 1) * sizeof *d->bounds);
    if (!d->bounds) goto done;
    memcpy(d->bounds, cuts, u * sizeof *cuts);
    d->bounds[u] = CP_END;
    for (uint32_t cp = 0; cp < 128; cp++) d->ascii_class[cp] = 0;
    for (uint32_t c = 0; c < u; c++)
        for (uint32_t cp = d->bounds[c]; cp < d->bounds[c + 1] && cp < 128; cp++)
            d->ascii_class[cp] = (uint8_t)c;

    ss.table_cap = 2 * GRAM_REGEX_MAX_STATES + 2;
    while (ss.table_cap & (ss.table_cap - 1)) ss.table_cap &= ss.table_cap - 1;
    ss.table_cap *= 2;
    ss.table = calloc(ss.table_cap, sizeof *ss.table);
    ts.table_cap = ss.table_cap;
    ts.table = calloc(ts.table_cap, sizeof *ts.table);
    int oom = 0;
    VEC_PUSH(ss.first, 0u, oom = 1);
    VEC_PUSH(ts.first, 0u, oom = 1);
    if (!ss.table || !ts.table || oom) goto done;
    size_t m = closure(r, stack, tmp, 1, &start, mark, ++gen);
    if (intern(&ss, tmp, m, &oom) < 0) goto done;
    /* Every range is a run of whole classes (the cuts are its ends): its first and last
     * class, found once, so that a state's moves are read off its NFA states' ranges
     * instead of testing every NFA state against every class. */
    rclass = malloc(2 * r->ranges.n * sizeof *rclass + 8);
    ccount = malloc((u + 1) * sizeof *ccount);
    if (!rclass || !ccount) goto done;
    for (size_t i = 0; i < r->ranges.n; i++) {
        rclass[2 * i] = class_of(d, r->ranges.v[i].lo);
        rclass[2 * i + 1] = class_of(d, r->ranges.v[i].hi);
    }
    for (size_t s = 0; s + 1 < ss.first.n; s++) {
        /* the targets of every class at once, in CSR form: class c's are moves[ccount[c]
         * .. ccount[c + 1]), in the order of the state's NFA states (the order a test of
         * each NFA state against the class gives) */
        const uint32_t a = ss.first.v[s], b = ss.first.v[s + 1];
        memset(ccount, 0, (u + 1) * sizeof *ccount);
        size_t total = 0;
        for (uint32_t k = a; k < b; k++) {
            const nstate *ns = &r->nfa.v[ss.pool.v[k]];
            if (ns->type != NS_SET) continue;
            for (uint32_t i = ns->set_first; i < ns->set_first + ns->set_n; i++)
                for (uint32_t c = rclass[2 * i]; c <= rclass[2 * i + 1]; c++) ccount[c + 1]++, total++;
        }
        if (total > moves_cap) {
            free(moves);
            moves_cap = total;
            moves = malloc(moves_cap * sizeof *moves);
            if (!moves) goto done;
        }
        for (uint32_t c = 0; c < u; c++) ccount[c + 1] += ccount[c];
        for (uint32_t k = a; k < b; k++) { /* ccount[c] walks to the end of class c's ... */
            const nstate *ns = &r->nfa.v[ss.pool.v[k]];
            if (ns->type != NS_SET) continue;
            for (uint32_t i = ns->set_first; i < ns->set_first + ns->set_n; i++)
                for (uint32_t c = rclass[2 * i]; c <= rclass[2 * i + 1]; c++) moves[ccount[c]++] = ns->out1;
        }
        for (uint32_t c = u; c > 0; c--) ccount[c] = ccount[c - 1]; /* ... and is moved back */
        ccount[0] = 0;
        /* Neighbouring classes mostly lead to the same NFA states (a class boundary that
         * some other part of the pattern needs): the previous class's target list and state
         * are reused, without a closure and a hash (most of a compile on wide classes). */
        size_t prev_nt = 0;
        const int *prev = NULL;
        long prev_id = -1;
        for (uint32_t c = 0; c < u; c++) {
            const size_t nt = ccount[c + 1] - ccount[c];
            const int *targets = nt ? moves + ccount[c] : NULL; /* moves: NULL while empty */
            long id = -1;
            if (!nt) {
                /* no move on this class */
            } else if (nt == prev_nt && !memcmp(targets, prev, nt * sizeof *targets)) {
                id = prev_id;
            } else {
                prev = targets, prev_nt = nt;
                /* a target list seen before (from another state) has its state already */
                const long key = intern(&ts, targets, nt, &oom); /* -3: the memo is full */
                if (key == -1) goto done;
                if (key >= 0 && (size_t)key < tid.n) {
                    id = tid.v[key];
                } else {
                    m = closure(r, stack, tmp, nt, targets, mark, ++gen);
                    id = intern(&ss, tmp, m, &oom);
                    if (id == -3) {
                        rc = rx_fail(r, "pattern needs more than %d DFA states", GRAM_REGEX_MAX_STATES);
                        goto done;
                    }
                    if (id < 0) goto done;
                    if (key >= 0) VEC_PUSH(tid, id, oom = 1); /* key == tid.n: new */
                    if (oom) goto done;
                }
                prev_id = id;
            }
            VEC_PUSH(trans, (int32_t)id, oom = 1);
            if (oom) goto done;
        }
    }
    size_t ns = ss.first.n - 1;
    uint8_t *acc = calloc(ns, 1), *live = calloc(ns, 1);
    int32_t *remap = malloc(ns * sizeof *remap);
    if (!acc || !live || !remap) { free(acc); free(live); free(remap); goto done; }
    for (size_t s = 0; s < ns; s++)
        for (uint32_t k = ss.first.v[s]; k < ss.first.v[s + 1]; k++)
            if (ss.pool.v[k] == match) acc[s] = live[s] = 1;
    /* Backward reachability of the accepting states, by a search over the reversed
     * transitions (in CSR form): linear in the transitions. (A fixpoint sweep over the
     * states was quadratic on a long literal, a chain of thousands of states that each
     * sweep moved back by one: 94% of a 0.28 s compile.) */
    uint32_t *rfirst = calloc(ns + 1, sizeof *rfirst), *redge = NULL, *queue = NULL;
    size_t n_edges = 0;
    if (rfirst) {
        for (size_t k = 0; k < ns * u; k++)
            if (trans.v[k] >= 0) rfirst[trans.v[k] + 1]++, n_edges++;
        for (size_t t = 0; t < ns; t++) rfirst[t + 1] += rfirst[t];
        redge = malloc((n_edges + 1) * sizeof *redge);
        queue = malloc(ns * sizeof *queue);
    }
    if (!rfirst || !redge || !queue) {
        free(rfirst); free(redge); free(queue);
        free(acc); free(live); free(remap);
        goto done;
    }
    for (size_t k = 0; k < ns * u; k++) /* rfirst[t] walks to the end of t's edges ... */
        if (trans.v[k] >= 0) redge[rfirst[trans.v[k]]++] = (uint32_t)(k / u);
    for (size_t t = ns; t > 0; t--) rfirst[t] = rfirst[t - 1]; /* ... and is moved back */
    rfirst[0] = 0;
    size_t qn = 0;
    for (size_t t = 0; t < ns; t++)
        if (live[t]) queue[qn++] = (uint32_t)t;
    for (size_t qi = 0; qi < qn; qi++) {
        const uint32_t t = queue[qi];
        for (uint32_t e = rfirst[t]; e < rfirst[t + 1]; e++)
            if (!live[redge[e]]) live[redge[e]] = 1, queue[qn++] = redge[e];
    }
    free(rfirst); free(redge); free(queue);
    if (!live[0]) {
        free(acc); free(live); free(remap);
        rc = rx_fail(r, "pattern matches no string");
        goto done;
    }
    uint32_t n_live = 0;
    for (size_t s = 0; s < ns; s++) remap[s] = live[s] ? (int32_t)n_live++ : -1;
    d->n_states = n_live;
    d->trans = malloc((size_t)n_live * u * sizeof *d->trans);
    d->accept = malloc(n_live);
    if (!d->trans || !d->accept) { free(acc); free(live); free(remap); goto done; }
    for (size_t s = 0; s < ns; s++) {
        if (!live[s]) continue;
        d->accept[remap[s]] = acc[s];
        for (uint32_t c = 0; c < u; c++) {
            int32_t t = trans.v[s * u + c];
            d->trans[(size_t)remap[s] * u + c] = t >= 0 ? remap[t] : -1;
        }
    }
    free(acc); free(live); free(remap);
    rc = 0;
done:
    free(stack); free(tmp); free(mark); free(cuts);
    free(ss.pool.v); free(ss.first.v); free(ss.table); free(trans.v);
    free(ts.pool.v); free(ts.first.v); free(ts.table); free(tid.v);
    free(rclass); free(ccount); free(moves);
    return rc;
}

int gram_regex_compile(const char *pattern, size_t len, gram_dfa *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    if (err && err_len) err[0] = 0;
    rx r = {0};
    r.p = pattern;
    r.end = pattern + len;
    r.err = err;
    r.err_len = err_len;
    int rc = -1;
    int root = parse_alt(&r);
    if (root >= 0 && r.p != r.end) root = rx_fail(&r, "unbalanced ) in pattern");
    frag f;
    int match;
    if (root >= 0 && !emit(&r, root, &f) && (match = nfa_new(&r, NS_MATCH)) >= 0) {
        r.nfa.v[f.end].out1 = match;
        rc = build_dfa(&r, f.start, match, out);
    }
    if (r.oom) rc = -2;
    if (rc) gram_regex_free(out);
    free(r.ranges.v);
    free(r.nodes.v);
    free(r.nfa.v);
    return rc;
}

/* Years 0001-9999; days valid for their month; February stops at 28 (29 would need the
 * year's leap rule) */
#define RX_DATE "(000[1-9]|00[1-9][0-9]|0[1-9][0-9][0-9]|[1-9][0-9][0-9][0-9])-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
/* RFC 3339 full-time, as JSON Schema's "time" means: seconds and a UTC offset required */
#define RX_TIME "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?" \
                "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
/* RFC 3986 pieces: a path segment character, and a reg-name host character */
#define RX_URI_SEG "([A-Za-z0-9._~:@!$&'()*+,;=-]|%[0-9A-Fa-f][0-9A-Fa-f])"
#define RX_URI_HOST "([A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f][0-9A-Fa-f])*"
#define RX_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"

int gram_regex_compile_format(const char *format, gram_dfa *out, char *err, size_t err_len) {
    /* As JSON Schema validators read them: RFC 3339 full-time (seconds and offset) and
     * date-time with a 'T', days valid for their month (February to 28), RFC 3986 URIs. */
    static const char *const table[][2] = {
        {"date", RX_DATE},
        {"time", RX_TIME},
        {"date-time", RX_DATE "[Tt]" RX_TIME},
        {"email", "[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+"},
        {"uri", "[A-Za-z][A-Za-z0-9+.-]*:(//" RX_URI_HOST "(:[0-9]*)?(/" RX_URI_SEG "*)*|/?"
                RX_URI_SEG "+(/" RX_URI_SEG "*)*)(\\?(" RX_URI_SEG "|[/?])*)?(#(" RX_URI_SEG "|[/?])*)?"},
        {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
        {"ipv4", RX_OCTET "(\\." RX_OCTET "){3}"},
    };
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(format, table[i][0]))
            return gram_regex_compile(table[i][1], strlen(table[i][1]), out, err, err_len);
    return 1;
}

int gram_regex_length_table(const gram_dfa *d, uint32_t min_len, uint32_t max_len, uint32_t **next,
                       uint32_t *k_out, char *err, size_t err_len) {
    uint64_t k = max_len != UINT32_MAX ? max_len : (uint64_t)min_len + d->n_states;
    uint64_t cols = k + 1, n = d->n_states;
    if (n * cols > (1u << 22)) {
        if (err && err_len)
            snprintf(err, err_len, "pattern with length bounds needs a table of %llu entries (limit %u)",
                     (unsigned long long)(n * cols), 1u << 22);
        return -1;
    }
    const uint64_t u = d->n_classes;
    uint8_t *reach = calloc(n * cols, 1);
    uint32_t *nx = malloc(n * cols * sizeof *nx);
    /* the transitions reversed (CSR), and the states reached at length j - 1 and j */
    uint32_t *rfirst = calloc(n + 1, sizeof *rfirst), *redge = malloc((n * u + 1) * sizeof *redge);
    uint32_t *cur = malloc((n + 1) * sizeof *cur), *nxt = malloc((n + 1) * sizeof *nxt);
    if (!reach || !nx || !rfirst || !redge || !cur || !nxt) {
        free(reach); free(nx); free(rfirst); free(redge); free(cur); free(nxt);
        return -2;
    }
    for (uint64_t e = 0; e < n * u; e++)
        if (d->trans[e] >= 0) rfirst[d->trans[e] + 1]++;
    for (uint64_t t = 0; t < n; t++) rfirst[t + 1] += rfirst[t];
    for (uint64_t e = 0; e < n * u; e++)
        if (d->trans[e] >= 0) redge[rfirst[d->trans[e]]++] = (uint32_t)(e / u);
    for (uint64_t t = n; t > 0; t--) rfirst[t] = rfirst[t - 1];
    rfirst[0] = 0;
    /* reach[s][j]: some completion of exactly j code points from s ends in a match. Level
     * j is the predecessors of level j - 1, so each length costs the edges into the states
     * that reach a match in j - 1, not a pass over every state and class (that sweep was
     * 91% of a pattern's compile with length bounds). */
    uint64_t n_cur = 0;
    for (uint64_t s = 0; s < n; s++)
        if ((reach[s * cols] = d->accept[s]) != 0) cur[n_cur++] = (uint32_t)s;
    for (uint64_t j = 1; j < cols && n_cur; j++) {
        uint64_t n_nxt = 0;
        for (uint64_t i = 0; i < n_cur; i++)
            for (uint32_t e = rfirst[cur[i]]; e < rfirst[cur[i] + 1]; e++) {
                uint8_t *r = &reach[(uint64_t)redge[e] * cols + j];
                if (!*r) *r = 1, nxt[n_nxt++] = redge[e];
            }
        uint32_t *swap = cur;
        cur = nxt;
        nxt = swap;
        n_cur = n_nxt;
    }
    free(rfirst); free(redge); free(cur); free(nxt);
    for (uint64_t s = 0; s < n; s++) {
        uint32_t best = UINT32_MAX;
        for (uint64_t j = cols; j-- > 0;) {
            if (reach[s * cols + j]) best = (uint32_t)j;
            nx[s * cols + j] = best;
        }
    }
    free(reach);
    *next = nx;
    *k_out = (uint32_t)k;
    return 0;
}

void gram_regex_free(gram_dfa *d) {
    if (!d) return;
    free(d->bounds);
    free(d->trans);
    free(d->accept);
    memset(d, 0, sizeof *d);
}
