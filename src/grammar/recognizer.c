/* The byte-level recognizer: a pushdown automaton whose stack is grammar_state.frames.
 *
 * Frame 0 is the call array, frame 1 the call object being read, then one frame per
 * value being read. Each frame advances only when the byte is valid for it AND leaves a
 * state from which its value can still be completed; this local "liveness" check (DFA
 * states pruned of dead ends, length tables, number intervals, unseen keys) is what makes
 * the whole recognizer free of dead ends, because every parent can always finish once its
 * child has (see the invariants in schema_ir.h).
 *
 * Values that end on their own last byte (strings, objects, arrays, quoted literals) pop
 * their frame as that byte is read. Numbers and unquoted literals ("1", "true") cannot
 * know they are over until the next byte: a frame that rejects a byte but may end here is
 * popped and the byte is offered to its parent.
 *
 * A frame step must leave the frame untouched when it rejects (the fall-back above reads
 * it); everything else may be scribbled on, because callers step a scratch copy. */
#include "grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

#include "grammar/recognizer.h"
#include "needle.h"
#include "util/error.h"
#include "util/json_escape.h"

static const char CALL_PREFIX_TEXT[] = GRAMMAR_CALL_PREFIX;
static const char CALL_MID_TEXT[] = GRAMMAR_CALL_MID;

grammar_options grammar_default_options(void) {
    grammar_options o = {1, 0};
    return o;
}

uint32_t grammar_tool_count(const grammar *g) { return g ? g->n_tools : 0; }

const char *grammar_tool_name(const grammar *g, uint32_t i) {
    return g && i < g->n_tools ? g->tool_names[i] : NULL;
}

void grammar_state_init(const grammar *g, grammar_state *st) {
    (void)g;
    st->depth = 1;
    st->n_used = 0;
    st->complete = 0;
    st->pad = 0;
    memset(&st->frames[0], 0, sizeof st->frames[0]);
    st->frames[0].kind = GRAM_FR_ROOT;
    st->frames[0].node = GRAM_NONE;
    st->frames[0].phase = ROOT_START;
}

void grammar_state_copy(grammar_state *dst, const grammar_state *src) {
    dst->depth = src->depth;
    dst->n_used = src->n_used;
    dst->complete = src->complete;
    memcpy(dst->frames, src->frames, src->depth * sizeof src->frames[0]);
    memcpy(dst->used, src->used, src->n_used * sizeof src->used[0]);
}

int grammar_is_complete(const grammar *g, const grammar_state *st) {
    (void)g;
    return st->complete != 0;
}

/* ---- shared helpers ------------------------------------------------------------------- */

int gram_lit_narrow(const grammar *g, uint32_t *plo, uint32_t *phi, uint32_t off, uint8_t b) {
    const gram_lit *L = g->lits;
    const uint8_t *B = g->lit_bytes;
    uint32_t lo = *plo, hi = *phi;
    if (lo < hi && L[lo].len == off) lo++; /* the entry that ends here takes no more bytes */
    uint32_t a = lo, z = hi;
    while (a < z) {
        uint32_t m = a + (z - a) / 2;
        if (B[L[m].off + off] < b) a = m + 1;
        else z = m;
    }
    uint32_t first = a;
    z = hi;
    while (a < z) {
        uint32_t m = a + (z - a) / 2;
        if (B[L[m].off + off] <= b) a = m + 1;
        else z = m;
    }
    if (first == a) return 0;
    *plo = first;
    *phi = a;
    return 1;
}

int gram_str_live(const grammar *g, const gram_node *n, uint32_t d, uint32_t len) {
    if (n->u.str.table < 0) return 1;
    const gram_len_table *t = &g->tables[n->u.str.table];
    uint32_t j = n->u.str.min_len > len ? n->u.str.min_len - len : 0;
    uint32_t r = t->next[(size_t)d * (t->k + 1) + j];
    if (r == UINT32_MAX) return 0;
    return n->u.str.max_len == UINT32_MAX || (uint64_t)len + r <= n->u.str.max_len;
}

static int in_used(const grammar_state *st, uint64_t key) {
    for (uint32_t i = 0; i < st->n_used; i++)
        if (st->used[i] == key) return 1;
    return 0;
}

/* What scalar frame f (st's top frame) must avoid (recognizer.h, gram_used): the earlier
 * items of its unique array, or, as the last property of an object item, the values that
 * would complete a repeat of one. Else nothing. */
static gram_used used_for(const grammar *g, const grammar_state *st, const grammar_frame *f) {
    gram_used u = {st->used, 0, 0, 0, 0, 0};
    if (f->flags & GRAM_FF_UNIQUE) {
        u.n = st->n_used;
    } else if ((f->flags & GRAM_FF_HASH) && f > st->frames) {
        const grammar_frame *p = f - 1;
        if (p->kind == GRAM_FR_OBJECT && (p->flags & GRAM_FF_UNIQUE) && p->phase == OBJ_VALUE) {
            const gram_node *n = &g->nodes[p->node];
            const uint64_t all = n->u.obj.n_props == 64 ? ~0ull : (1ull << n->u.obj.n_props) - 1;
            if ((p->u.lit.seen & all) == all) {
                u.n = st->n_used;
                u.item = 1;
                u.base = p->u.lit.hash;
                u.prop_salt = p->u.lit.item + 1ull;
                u.node_salt = f->node + 1ull;
            }
        }
    }
    return u;
}

/* Some entry of [lo, hi) is a member u does not rule out. */
static int lit_range_has_unused(const grammar *g, const gram_used *u, uint32_t lo, uint32_t hi) {
    if (hi - lo > 2 * u->n) return 1; /* pigeonhole: a member has at most 2 spellings */
    for (uint32_t i = lo; i < hi; i++)
        if (!gram_used_has(u, g->lits[i].member)) return 1;
    return 0;
}

/* Some key entry of [lo, hi) names a property not yet seen. */
static int key_range_has_unseen(const grammar *g, uint32_t lo, uint32_t hi, uint64_t seen) {
    for (uint32_t i = lo; i < hi; i++)
        if (!(seen >> g->lits[i].member & 1)) return 1;
    return 0;
}

/* ---- strings -------------------------------------------------------------------------- */

static int str_range_ok(const grammar *g, const gram_node *n, const grammar_frame *f, uint32_t lo,
                        uint32_t hi) {
    uint32_t len = f->u.str.len;
    if (lo > hi || len >= n->u.str.max_len) return 0;
    if (n->u.str.dfa < 0) return 1;
    const gram_dfa *d = &g->dfas[n->u.str.dfa];
    const int32_t *row = d->trans + (size_t)f->u.str.dfa * d->n_classes;
    for (uint32_t c = gram_regex_class(d, lo), c1 = gram_regex_class(d, hi); c <= c1; c++)
        if (row[c] >= 0 && gram_str_live(g, n, (uint32_t)row[c], len + 1)) return 1;
    return 0;
}

/* Any code point a JSON escape can produce (all but the surrogates). */
static int str_any_ok(const grammar *g, const gram_node *n, const grammar_frame *f) {
    return str_range_ok(g, n, f, 0, 0xD7FF) || str_range_ok(g, n, f, 0xE000, 0x10FFFF);
}

static int str_take(const grammar *g, const gram_node *n, grammar_frame *f, uint32_t cp) {
    uint32_t len = f->u.str.len;
    if (len >= n->u.str.max_len) return ST_REJECT;
    if (n->u.str.dfa >= 0) {
        const gram_dfa *d = &g->dfas[n->u.str.dfa];
        int32_t t = d->trans[(size_t)f->u.str.dfa * d->n_classes + gram_regex_class(d, cp)];
        if (t < 0 || !gram_str_live(g, n, (uint32_t)t, len + 1)) return ST_REJECT;
        f->u.str.dfa = (uint32_t)t;
    }
    f->u.str.len = len + 1;
    if (f->flags & (GRAM_FF_UNIQUE | GRAM_FF_HASH)) f->u.str.hash = gram_mix(f->u.str.hash, cp);
    f->phase = STR_BODY;
    return ST_OK;
}

static int hex_value(uint8_t b) {
    return b >= '0' && b <= '9' ? b - '0' : b >= 'a' && b <= 'f' ? b - 'a' + 10
         : b >= 'A' && b <= 'F' ? b - 'A' + 10 : -1;
}

static int str_step(const grammar *g, const grammar_state *st, grammar_frame *f, uint8_t b) {
    const gram_node *n = &g->nodes[f->node];
    int h;
    switch (f->phase) {
    case STR_OPEN:
        if (b != '"') return ST_REJECT;
        f->phase = STR_BODY;
        return ST_OK;
    case STR_BODY:
        if (b == '"') {
            if (n->u.str.dfa >= 0 && !g->dfas[n->u.str.dfa].accept[f->u.str.dfa]) return ST_REJECT;
            if (f->u.str.len < n->u.str.min_len) return ST_REJECT;
            if ((f->flags & GRAM_FF_UNIQUE) && in_used(st, gram_mix(f->u.str.hash, f->u.str.len)))
                return ST_REJECT;
            return ST_DONE;
        }
        if (b == '\\') {
            if (!str_any_ok(g, n, f)) return ST_REJECT;
            f->phase = STR_ESC;
            return ST_OK;
        }
        if (b < 0x20) return ST_REJECT; /* raw control characters are not JSON */
        if (b < 0x80) return str_take(g, n, f, b);
        {
            uint32_t lo, hi, need;
            uint8_t blo = 0x80, bhi = 0xBF;
            if (b >= 0xC2 && b <= 0xDF) {
                need = 1, lo = (uint32_t)(b & 0x1F) << 6, hi = lo | 0x3F;
            } else if (b >= 0xE0 && b <= 0xEF) {
                need = 2, lo = (uint32_t)(b & 0x0F) << 12, hi = lo | 0xFFF;
                if (b == 0xE0) blo = 0xA0, lo = 0x800;
                if (b == 0xED) bhi = 0x9F, hi = 0xD7FF;
            } else if (b >= 0xF0 && b <= 0xF4) {
                need = 3, lo = (uint32_t)(b & 0x07) << 18, hi = lo | 0x3FFFF;
                if (b == 0xF0) blo = 0x90, lo = 0x10000;
                if (b == 0xF4) bhi = 0x8F, hi = 0x10FFFF;
            } else {
                return ST_REJECT;
            }
            if (!str_range_ok(g, n, f, lo, hi)) return ST_REJECT;
            f->phase = STR_UTF8;
            f->aux = (uint8_t)need;
            f->u.str.acc = b & (need == 1 ? 0x1F : need == 2 ? 0x0F : 0x07);
            f->u.str.blo = blo;
            f->u.str.bhi = bhi;
            return ST_OK;
        }
    case STR_UTF8: {
        if (b < f->u.str.blo || b > f->u.str.bhi) return ST_REJECT;
        uint32_t acc = f->u.str.acc << 6 | (b & 0x3F), need = f->aux - 1u;
        if (!need) return str_take(g, n, f, acc);
        uint32_t lo = acc << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
        if (!str_range_ok(g, n, f, lo, hi)) return ST_REJECT;
        f->u.str.acc = acc;
        f->aux = (uint8_t)need;
        f->u.str.blo = 0x80;
        f->u.str.bhi = 0xBF;
        return ST_OK;
    }
    case STR_ESC: {
        if (b == 'u') { /* any code point is reachable, and one was live when '\' was read */
            f->phase = STR_U;
            f->aux = 0;
            f->u.str.acc = 0;
            return ST_OK;
        }
        const int cp = json_simple_escape(b);
        if (cp < 0) return ST_REJECT;
        return str_take(g, n, f, (uint32_t)cp);
    }
    case STR_U: {
        if ((h = hex_value(b)) < 0) return ST_REJECT;
        uint32_t v = f->u.str.acc * 16 + (uint32_t)h, k = f->aux + 1u;
        if (k < 4) { /* code points still reachable: v's BMP range, surrogate pairs expanded */
            uint32_t rem = 4 * (4 - k), lo = v << rem, hi = lo | ((1u << rem) - 1);
            uint32_t sl = lo > 0xD800 ? lo : 0xD800, sh = hi < 0xDBFF ? hi : 0xDBFF;
            int ok = str_range_ok(g, n, f, lo, hi < 0xD7FF ? hi : 0xD7FF) ||
                     str_range_ok(g, n, f, lo > 0xE000 ? lo : 0xE000, hi) ||
                     (sl <= sh && str_range_ok(g, n, f, 0x10000 + ((sl - 0xD800) << 10),
                                               0x10000 + ((sh - 0xD800) << 10) + 0x3FF));
            if (!ok) return ST_REJECT;
            f->u.str.acc = v;
            f->aux = (uint8_t)k;
            return ST_OK;
        }
        if (v >= 0xDC00 && v <= 0xDFFF) return ST_REJECT; /* lone low surrogate */
        if (v >= 0xD800) {
            if (v <= 0xDBFF) {
                uint32_t base = 0x10000 + ((v - 0xD800) << 10);
                if (!str_range_ok(g, n, f, base, base + 0x3FF)) return ST_REJECT;
                f->u.str.hs = (uint16_t)v;
                f->phase = STR_LOW0;
                return ST_OK;
            }
        }
        return str_take(g, n, f, v);
    }
    case STR_LOW0:
        if (b != '\\') return ST_REJECT;
        f->phase = STR_LOW1;
        return ST_OK;
    case STR_LOW1:
        if (b != 'u') return ST_REJECT;
        f->phase = STR_LOWU;
        f->aux = 0;
        f->u.str.acc = 0;
        return ST_OK;
    case STR_LOWU: {
        if ((h = hex_value(b)) < 0) return ST_REJECT;
        uint32_t v = f->u.str.acc * 16 + (uint32_t)h, k = f->aux + 1u;
        uint32_t rem = 4 * (4 - k), lo = v << rem, hi = lo | ((1u << rem) - 1);
        if (lo < 0xDC00) lo = 0xDC00;
        if (hi > 0xDFFF) hi = 0xDFFF;
        if (lo > hi) return ST_REJECT;
        uint32_t base = 0x10000 + ((uint32_t)(f->u.str.hs - 0xD800) << 10) - 0xDC00;
        if (k == 4) return str_take(g, n, f, base + v);
        if (!str_range_ok(g, n, f, base + lo, base + hi)) return ST_REJECT;
        f->u.str.acc = v;
        f->aux = (uint8_t)k;
        return ST_OK;
    }
    default: return ST_REJECT;
    }
}

/* ---- frames --------------------------------------------------------------------------- */

static int frame_step(const grammar *g, grammar_state *st, grammar_frame *f, uint8_t b);

/* Canonical key of a complete value: equal JSON values give equal keys (strings by code
 * points, numbers by value, literals by member, objects by their members in any order,
 * arrays by their items in order), different ones differ but for 64-bit hash collisions.
 * Parts of objects and arrays are keyed with their node, so that values of different
 * alternatives of a union never meet. */
static uint64_t frame_key(const grammar *g, const grammar_frame *f) {
    switch (f->kind) {
    case GRAM_FR_STRING: return gram_mix(f->u.str.hash, f->u.str.len);
    case GRAM_FR_LITERAL: return g->lits[f->u.lit.lo].member;
    case GRAM_FR_NUMBER: return gram_num_key(&g->nodes[f->node], f);
    case GRAM_FR_OBJECT: return gram_mix(GRAM_OBJECT_KEY_TAG, f->u.lit.hash);
    case GRAM_FR_ARRAY: return gram_mix(gram_mix(0x6172726179000000ull, f->u.arr.hash), f->u.arr.count);
    default: return 0;
    }
}

/* An object or array item of a unique array that repeats an earlier item. */
static int repeats_used(const grammar *g, const grammar_state *st, const grammar_frame *f) {
    return (f->flags & GRAM_FF_UNIQUE) && in_used(st, frame_key(g, f));
}

/* Pops the top frame (its value is complete) and tells the parent. */
int gram_pop(const grammar *g, grammar_state *st) {
    grammar_frame *c = &st->frames[st->depth - 1];
    uint64_t key = frame_key(g, c);
    uint8_t child_flags = c->flags, child_kind = c->kind;
    uint32_t child_node = c->node;
    st->depth--;
    if (child_kind == GRAM_FR_ARRAY && g->nodes[child_node].u.arr.unique) st->n_used = 0;
    if (!st->depth) {
        st->complete = 1;
        return 1;
    }
    grammar_frame *p = &st->frames[st->depth - 1];
    const uint64_t part = gram_mix(child_node + 1ull, key);
    switch (p->kind) {
    case GRAM_FR_ROOT: p->u.arr.count++; p->phase = ROOT_AFTER; break;
    case GRAM_FR_CALL: p->phase = CALL_CLOSE; break;
    case GRAM_FR_OBJECT:
        if (p->phase == OBJ_KEY) {
            p->phase = OBJ_COLON;
            break;
        }
        p->phase = OBJ_AFTER;
        if (p->flags & (GRAM_FF_UNIQUE | GRAM_FF_HASH)) {
            const gram_node *n = &g->nodes[p->node];
            const uint64_t all = n->u.obj.n_props == 64 ? ~0ull : (1ull << n->u.obj.n_props) - 1;
            p->u.lit.hash += gram_mix(p->u.lit.item + 1ull, part); /* a sum: member order is free */
            /* The last property is in: only "}" can follow, so a repeat must be refused now,
             * at the byte that completed the value (the compiler made that value one that can
             * always go on: a string without maxLength, an array without maxItems). */
            if ((p->u.lit.seen & all) == all && repeats_used(g, st, p)) return 0;
        }
        break;
    case GRAM_FR_OBJ_UNION: gram_union_value_done(g, p, key); break;
    case GRAM_FR_ARRAY:
        if (p->flags & (GRAM_FF_UNIQUE | GRAM_FF_HASH)) p->u.arr.hash = gram_mix(p->u.arr.hash, part);
        p->u.arr.count++;
        p->phase = ARR_AFTER;
        if ((child_flags & GRAM_FF_UNIQUE) && st->n_used < GRAMMAR_MAX_UNIQUE) st->used[st->n_used++] = key;
        break;
    default: break;
    }
    return 1;
}

int gram_push_value(const grammar *g, grammar_state *st, uint32_t node, uint8_t flags, uint8_t b) {
    const gram_node *n = &g->nodes[node];
    if (n->kind == GRAM_NODE_UNION) {
        uint32_t alt = g->picks[n->u.uni.pick + b];
        if (!alt) return 0;
        node = alt - 1;
        n = &g->nodes[node];
    }
    if (st->depth >= GRAMMAR_MAX_DEPTH) return 0;
    grammar_frame *f = &st->frames[st->depth];
    memset(f, 0, sizeof *f);
    f->node = node;
    f->flags = flags;
    switch (n->kind) {
    case GRAM_NODE_STRING: f->kind = GRAM_FR_STRING; break;
    case GRAM_NODE_NUMBER: f->kind = GRAM_FR_NUMBER; break;
    case GRAM_NODE_OBJECT: f->kind = GRAM_FR_OBJECT; break;
    case GRAM_NODE_ARRAY: f->kind = GRAM_FR_ARRAY; break;
    case GRAM_NODE_OBJ_UNION: f->kind = GRAM_FR_OBJ_UNION; break;
    default:
        f->kind = GRAM_FR_LITERAL;
        f->u.lit.lo = n->u.lit.first;
        f->u.lit.hi = n->u.lit.first + n->u.lit.count;
        break;
    }
    st->depth++;
    int r = frame_step(g, st, f, b);
    if (r == ST_REJECT) {
        st->depth--;
        return 0;
    }
    return r == ST_DONE ? gram_pop(g, st) : 1;
}

static int literal_step(const grammar *g, const grammar_state *st, grammar_frame *f, uint8_t b) {
    uint32_t lo = f->u.lit.lo, hi = f->u.lit.hi, off = f->u.lit.off;
    if (!gram_lit_narrow(g, &lo, &hi, off, b)) return ST_REJECT;
    const gram_used u = used_for(g, st, f);
    if (u.n && !lit_range_has_unused(g, &u, lo, hi)) return ST_REJECT;
    if (f->flags & GRAM_FF_DISC) {
        uint32_t i = lo;
        while (i < hi && !gram_union_disc_live(st, g->lits[i].member)) i++;
        if (i == hi) return ST_REJECT;
    }
    f->u.lit.lo = lo;
    f->u.lit.hi = hi;
    f->u.lit.off = ++off;
    return g->lits[lo].len == off && hi == lo + 1 ? ST_DONE : ST_OK;
}

static int literal_can_end(const grammar *g, const grammar_state *st, const grammar_frame *f) {
    const gram_lit *e = &g->lits[f->u.lit.lo];
    const gram_used u = used_for(g, st, f);
    return e->len == f->u.lit.off && !gram_used_has(&u, e->member) &&
           !((f->flags & GRAM_FF_DISC) && !gram_union_disc_live(st, e->member));
}

static int object_step(const grammar *g, grammar_state *st, grammar_frame *f, uint8_t b) {
    const gram_node *n = &g->nodes[f->node];
    int is_free = n->u.obj.free_value != GRAM_NONE;
    uint64_t all = n->u.obj.n_props == 64 ? ~0ull : (1ull << n->u.obj.n_props) - 1;
    switch (f->phase) {
    case OBJ_OPEN:
        if (b != '{') return ST_REJECT;
        f->phase = OBJ_FIRST;
        return ST_OK;
    case OBJ_FIRST:
    case OBJ_NEXT: /* a key, or "}" right after "{" */
        if (f->phase == OBJ_FIRST && b == '}')
            return (is_free || !n->u.obj.required) && !repeats_used(g, st, f) ? ST_DONE : ST_REJECT;
        if (b != '"') return ST_REJECT;
        if (is_free) {
            uint8_t phase = f->phase;
            f->phase = OBJ_KEY;
            if (gram_push_value(g, st, n->u.obj.free_key, GRAM_FF_KEY, b)) return ST_OK;
            f->phase = phase;
            return ST_REJECT;
        } else {
            uint32_t lo = n->u.obj.first, hi = lo + n->u.obj.count;
            if (!gram_lit_narrow(g, &lo, &hi, 0, b) || !key_range_has_unseen(g, lo, hi, f->u.lit.seen))
                return ST_REJECT;
            f->u.lit.lo = lo;
            f->u.lit.hi = hi;
            f->u.lit.off = 1;
            f->phase = OBJ_KEY;
            return ST_OK;
        }
    case OBJ_KEY: {
        uint32_t lo = f->u.lit.lo, hi = f->u.lit.hi, off = f->u.lit.off;
        if (!gram_lit_narrow(g, &lo, &hi, off, b) || !key_range_has_unseen(g, lo, hi, f->u.lit.seen))
            return ST_REJECT;
        f->u.lit.lo = lo;
        f->u.lit.hi = hi;
        f->u.lit.off = ++off;
        if (g->lits[lo].len == off) { /* keys are quoted, so a full match is unique */
            uint32_t p = g->lits[lo].member;
            f->u.lit.item = p;
            f->u.lit.seen |= 1ull << p;
            f->phase = OBJ_COLON;
        }
        return ST_OK;
    }
    case OBJ_COLON:
        if (b != ':') return ST_REJECT;
        f->phase = OBJ_VALUE;
        return ST_OK;
    case OBJ_VALUE: {
        uint32_t child = is_free ? n->u.obj.free_value : g->prop_nodes[n->u.obj.props + f->u.lit.item];
        uint8_t flags = f->flags & (GRAM_FF_UNIQUE | GRAM_FF_HASH) ? GRAM_FF_HASH : 0;
        return gram_push_value(g, st, child, flags, b) ? ST_OK : ST_REJECT;
    }
    case OBJ_AFTER:
        if (b == ',') {
            if (!is_free && (f->u.lit.seen & all) == all) return ST_REJECT;
            f->phase = OBJ_NEXT;
            return ST_OK;
        }
        if (b == '}')
            return (gram_obj_needed(g, n, f->u.lit.seen) & ~f->u.lit.seen) || repeats_used(g, st, f) ? ST_REJECT
                                                                                                  : ST_DONE;
        return ST_REJECT;
    default: return ST_REJECT;
    }
}

static int array_step(const grammar *g, grammar_state *st, grammar_frame *f, uint8_t b) {
    const gram_node *n = &g->nodes[f->node];
    uint8_t flags = n->u.arr.unique                                   ? GRAM_FF_UNIQUE
                    : f->flags & (GRAM_FF_UNIQUE | GRAM_FF_HASH) ? GRAM_FF_HASH
                                                                  : 0;
    switch (f->phase) {
    case ARR_OPEN:
        if (b != '[') return ST_REJECT;
        if (n->u.arr.unique) st->n_used = 0;
        f->phase = ARR_FIRST;
        return ST_OK;
    case ARR_FIRST:
    case ARR_NEXT: /* an item, or "]" right after "[" */
        if (f->phase == ARR_FIRST && b == ']') return n->u.arr.min == 0 && !repeats_used(g, st, f) ? ST_DONE : ST_REJECT;
        if (f->u.arr.count >= n->u.arr.max) return ST_REJECT; /* maxItems 0 */
        f->phase = ARR_ITEM;
        if (gram_push_value(g, st, n->u.arr.items, flags, b)) return ST_OK;
        f->phase = f->u.arr.count ? ARR_NEXT : ARR_FIRST;
        return ST_REJECT;
    case ARR_AFTER:
        if (b == ',') {
            if (f->u.arr.count >= n->u.arr.max) return ST_REJECT;
            f->phase = ARR_NEXT;
            return ST_OK;
        }
        if (b == ']') return f->u.arr.count >= n->u.arr.min && !repeats_used(g, st, f) ? ST_DONE : ST_REJECT;
        return ST_REJECT;
    default: return ST_REJECT;
    }
}

static int call_step(const grammar *g, grammar_state *st, grammar_frame *f, uint8_t b) {
    switch (f->phase) {
    case CALL_PREFIX:
        if ((char)b != CALL_PREFIX_TEXT[f->u.lit.off]) return ST_REJECT;
        if (++f->u.lit.off == sizeof CALL_PREFIX_TEXT - 1) {
            f->phase = CALL_NAME;
            f->u.lit.lo = g->names_first;
            f->u.lit.hi = g->names_first + g->names_count;
            f->u.lit.off = 0;
        }
        return ST_OK;
    case CALL_NAME: {
        uint32_t lo = f->u.lit.lo, hi = f->u.lit.hi, off = f->u.lit.off;
        if (!gram_lit_narrow(g, &lo, &hi, off, b)) return ST_REJECT;
        f->u.lit.lo = lo;
        f->u.lit.hi = hi;
        f->u.lit.off = ++off;
        if (g->lits[lo].len == off) {
            f->u.lit.item = g->lits[lo].member;
            f->u.lit.off = 0;
            f->phase = CALL_MID;
        }
        return ST_OK;
    }
    case CALL_MID:
        if ((char)b != CALL_MID_TEXT[f->u.lit.off]) return ST_REJECT;
        if (++f->u.lit.off == sizeof CALL_MID_TEXT - 1) f->phase = CALL_ARGS;
        return ST_OK;
    case CALL_ARGS:
        return gram_push_value(g, st, g->tool_args[f->u.lit.item], 0, b) ? ST_OK : ST_REJECT;
    case CALL_CLOSE:
        return b == '}' ? ST_DONE : ST_REJECT;
    default: return ST_REJECT;
    }
}

static int push_call(grammar_state *st, const grammar *g, uint8_t b) {
    if (b != '{' || !g->n_tools || st->depth >= GRAMMAR_MAX_DEPTH) return 0;
    grammar_frame *f = &st->frames[st->depth++];
    memset(f, 0, sizeof *f);
    f->kind = GRAM_FR_CALL;
    f->node = GRAM_NONE;
    f->phase = CALL_PREFIX;
    f->u.lit.off = 1;
    return 1;
}

static int root_step(const grammar *g, grammar_state *st, grammar_frame *f, uint8_t b) {
    switch (f->phase) {
    case ROOT_START:
        if (b != '[') return ST_REJECT;
        f->phase = ROOT_OPEN;
        return ST_OK;
    case ROOT_OPEN:
    case ROOT_NEXT: /* a call, or "]" right after "[" */
        if (f->phase == ROOT_OPEN && b == ']') return g->opt.allow_empty ? ST_DONE : ST_REJECT;
        if (!push_call(st, g, b)) return ST_REJECT;
        f->phase = ROOT_CALL;
        return ST_OK;
    case ROOT_AFTER:
        if (b == ',' && !g->opt.single_call) {
            f->phase = ROOT_NEXT;
            return ST_OK;
        }
        return b == ']' ? ST_DONE : ST_REJECT;
    default: return ST_REJECT;
    }
}

static int frame_step(const grammar *g, grammar_state *st, grammar_frame *f, uint8_t b) {
    switch (f->kind) {
    case GRAM_FR_STRING: return str_step(g, st, f, b);
    case GRAM_FR_NUMBER: {
        const gram_used u = used_for(g, st, f);
        return gram_num_step(&g->nodes[f->node], f, b, &u);
    }
    case GRAM_FR_LITERAL: return literal_step(g, st, f, b);
    case GRAM_FR_OBJECT: return object_step(g, st, f, b);
    case GRAM_FR_ARRAY: return array_step(g, st, f, b);
    case GRAM_FR_OBJ_UNION: return gram_union_step(g, st, f, b);
    case GRAM_FR_CALL: return call_step(g, st, f, b);
    case GRAM_FR_ROOT: return root_step(g, st, f, b);
    default: return ST_REJECT;
    }
}

int gram_frame_can_end(const grammar *g, const grammar_state *st, const grammar_frame *f) {
    if (f->kind == GRAM_FR_NUMBER) {
        const gram_used u = used_for(g, st, f);
        return gram_num_can_end(&g->nodes[f->node], f, &u);
    }
    if (f->kind == GRAM_FR_LITERAL) return literal_can_end(g, st, f);
    return 0;
}

/* Steps st in place; on rejection st is left in an unspecified state. */
static int step(const grammar *g, grammar_state *st, uint8_t b) {
    while (st->depth) {
        grammar_frame *f = &st->frames[st->depth - 1];
        int r = frame_step(g, st, f, b);
        if (r == ST_OK) return 1;
        if (r == ST_DONE) return gram_pop(g, st);
        if (!gram_frame_can_end(g, st, f) || !gram_pop(g, st)) return 0;
    }
    return 0;
}

int gram_step(const grammar *g, grammar_state *st, uint8_t b) { return step(g, st, b); }

int gram_plain_string_budget(const grammar *g, const grammar_state *st, uint32_t *budget) {
    if (!st->depth || st->complete) return 0;
    const grammar_frame *f = &st->frames[st->depth - 1];
    if (f->kind != GRAM_FR_STRING || f->phase != STR_BODY) return 0;
    const gram_node *n = &g->nodes[f->node];
    if (n->u.str.dfa >= 0) return 0;
    *budget = n->u.str.max_len == UINT32_MAX ? UINT32_MAX : n->u.str.max_len - f->u.str.len;
    return 1;
}

uint32_t grammar_string_depth(const grammar *g, const grammar_state *st) {
    (void)g;
    if (!st->depth || st->complete) return 0;
    const grammar_frame *f = &st->frames[st->depth - 1];
    return f->kind == GRAM_FR_STRING && f->phase != STR_OPEN ? st->depth : 0;
}

uint32_t grammar_number_depth(const grammar *g, const grammar_state *st) {
    (void)g;
    if (!st->depth || st->complete) return 0;
    const grammar_frame *f = &st->frames[st->depth - 1];
    return f->kind == GRAM_FR_NUMBER && gram_num_started(f) ? st->depth : 0;
}

int grammar_string_between_chars(const grammar *g, const grammar_state *st) {
    return grammar_string_depth(g, st) && st->frames[st->depth - 1].phase == STR_BODY;
}

int grammar_between_calls(const grammar *g, const grammar_state *st) {
    (void)g;
    return st->depth == 1 && !st->complete && st->frames[0].phase == ROOT_AFTER;
}

int grammar_accept_byte(const grammar *g, grammar_state *st, uint8_t byte) {
    grammar_state tmp;
    grammar_state_copy(&tmp, st);
    if (!step(g, &tmp, byte)) return 0;
    grammar_state_copy(st, &tmp);
    return 1;
}

int grammar_accept_bytes(const grammar *g, grammar_state *st, const void *bytes, size_t n) {
    const uint8_t *p = bytes;
    grammar_state tmp;
    grammar_state_copy(&tmp, st);
    for (size_t i = 0; i < n; i++)
        if (!step(g, &tmp, p[i])) return 0;
    grammar_state_copy(st, &tmp);
    return 1;
}
