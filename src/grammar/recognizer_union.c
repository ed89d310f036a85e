/* recognizer_union.c: frames of object unions (GRAM_NODE_OBJ_UNION, compiler_union.c).
 *
 * The frame reads one object over the merged keys of all alternatives and keeps in
 * u.ou.live the alternatives the text read so far is still valid against; u.ou.seen holds
 * merged keys. Every key narrows live to its declarers; the discriminator's value (a
 * literal whose member is the alternative) narrows it to one. With one alternative left
 * the frame "commits": it becomes that alternative's GRAM_FR_OBJECT frame, seen keys
 * translated to its property indices, and reads on as any object.
 *
 * Before the commit only keys whose value can be read are admitted (gram_ou_readable; a
 * split key's first value byte narrows live to the alternatives of one schema), "}" only
 * when exactly one live alternative has all its required keys, and "," only when some key
 * is still admissible. The compiler's conditions make one of them always possible, so the
 * frame, like every other, has no dead ends. */
#include "grammar/grammar.h"

#include "grammar/recognizer.h"

/* The node's table in g->prop_nodes (schema_ir.h). */
typedef struct ou_view {
    const gram_node *n;
    const uint32_t *alts, *has, *split, *map, *cls;
} ou_view;

static ou_view view(const grammar *g, const grammar_frame *f) {
    ou_view v;
    v.n = &g->nodes[f->node];
    uint32_t na = v.n->u.ou.n_alts, nk = v.n->u.ou.n_keys;
    v.alts = g->prop_nodes + v.n->u.ou.table;
    v.has = v.alts + na;
    v.split = v.has + nk;
    v.map = v.split + nk;
    v.cls = v.map + na * nk;
    return v;
}

static int one_bit(uint64_t x) { return x && !(x & (x - 1)); }

static int admissible(const ou_view *v, const grammar_frame *f, uint32_t k) {
    return !(f->u.ou.seen >> k & 1) &&
           gram_ou_readable(v->has, v->split, v->cls, v->n->u.ou.n_keys, k, v->n->u.ou.disc_key, f->u.ou.live);
}

static void commit(const ou_view *v, grammar_frame *f);

static uint32_t prop_node(const grammar *g, const ou_view *v, uint32_t a, uint32_t k) {
    return g->prop_nodes[g->nodes[v->alts[a]].u.obj.props + v->map[a * v->n->u.ou.n_keys + k]];
}

/* Reads the first byte b of key k's value (live holds only k's declarers). When they
 * disagree on its schema (a split key), b picks one schema, and live keeps the
 * alternatives with that one; one left commits it. The frame is untouched on rejection. */
static int start_value(const grammar *g, grammar_state *st, grammar_frame *f, const ou_view *v, uint32_t k,
                       uint8_t b) {
    const uint32_t nk = v->n->u.ou.n_keys;
    uint64_t live = f->u.ou.live;
    uint32_t a = 0, cls = GRAM_NONE, agree = 1;
    for (uint32_t c = 0; c < v->n->u.ou.n_alts; c++)
        if (live >> c & 1) {
            if (cls == GRAM_NONE) a = c, cls = v->cls[c * nk + k];
            agree &= v->cls[c * nk + k] == cls;
        }
    if (!agree) {
        const gram_node *u = &g->nodes[v->split[k]];
        uint32_t pick = g->picks[u->u.uni.pick + b];
        if (!pick) return 0;
        for (cls = 0; cls < v->n->u.ou.n_alts; cls++) /* the class whose schema b starts */
            if ((v->has[k] >> cls & 1) && v->cls[cls * nk + k] == cls && prop_node(g, v, cls, k) == pick - 1) break;
        uint64_t keep = 0;
        for (uint32_t c = 0; c < v->n->u.ou.n_alts; c++)
            if ((live >> c & 1) && v->cls[c * nk + k] == cls) keep |= 1ull << c;
        if (!keep) return 0;
        live = keep;
        while (!(live >> a & 1)) a++;
    }
    if (!gram_push_value(g, st, prop_node(g, v, a, k), 0, b)) return 0;
    if (f->kind == GRAM_FR_OBJ_UNION && live != f->u.ou.live) {
        f->u.ou.live = live;
        if (one_bit(live)) commit(v, f);
    }
    return 1;
}

static int range_admissible(const grammar *g, const ou_view *v, const grammar_frame *f, uint32_t lo, uint32_t hi) {
    for (uint32_t i = lo; i < hi; i++)
        if (admissible(v, f, g->lits[i].member)) return 1;
    return 0;
}

static int any_admissible(const ou_view *v, const grammar_frame *f) {
    for (uint32_t k = 0; k < v->n->u.ou.n_keys; k++)
        if (admissible(v, f, k)) return 1;
    return 0;
}

/* Exactly one live alternative has all its required keys among the seen ones: "}" then
 * ends an object valid against that one only (live alternatives declare every seen key).
 * Two (an optional discriminator not written) would make a oneOf invalid; the
 * discriminator can always be written instead. */
static int can_close(const grammar *g, const ou_view *v, const grammar_frame *f) {
    uint32_t nk = v->n->u.ou.n_keys, satisfied = 0;
    for (uint32_t a = 0; a < v->n->u.ou.n_alts && satisfied < 2; a++) {
        if (!(f->u.ou.live >> a & 1)) continue;
        uint64_t req = g->nodes[v->alts[a]].u.obj.required;
        int ok = 1;
        for (uint32_t k = 0; k < nk && ok; k++) {
            uint32_t p = v->map[a * nk + k];
            ok = p == GRAM_NONE || !(req >> p & 1) || (f->u.ou.seen >> k & 1);
        }
        satisfied += (uint32_t)ok;
    }
    return satisfied == 1;
}

/* Turns f into the object frame of the one live alternative. Keys already seen are in
 * that alternative (live only ever keeps declarers) and their values were valid for it. */
static void commit(const ou_view *v, grammar_frame *f) {
    uint32_t a = 0, nk = v->n->u.ou.n_keys;
    while (!(f->u.ou.live >> a & 1)) a++;
    uint64_t seen = 0;
    for (uint32_t k = 0; k < nk; k++)
        if (f->u.ou.seen >> k & 1) seen |= 1ull << v->map[a * nk + k];
    uint32_t item = f->u.ou.key < nk ? v->map[a * nk + f->u.ou.key] : 0;
    f->node = v->alts[a];
    f->kind = GRAM_FR_OBJECT;
    f->u.lit.lo = f->u.lit.hi = f->u.lit.off = 0;
    f->u.lit.item = item;
    f->u.lit.seen = seen;
    f->u.lit.hash = 0;
}

int gram_union_step(const grammar *g, grammar_state *st, grammar_frame *f, uint8_t b) {
    const ou_view v = view(g, f);
    const gram_node *n = v.n;
    switch (f->phase) {
    case OBJ_OPEN:
        if (b != '{') return ST_REJECT;
        f->u.ou.live = (1ull << n->u.ou.n_alts) - 1; /* n_alts <= GRAM_MAX_OBJ_ALTS = 32 */
        f->u.ou.seen = 0;
        f->u.ou.key = GRAM_NONE;
        f->phase = OBJ_FIRST;
        return ST_OK;
    case OBJ_FIRST:
    case OBJ_NEXT: {
        if (f->phase == OBJ_FIRST && b == '}') return can_close(g, &v, f) ? ST_DONE : ST_REJECT;
        uint32_t lo = n->u.ou.first, hi = lo + n->u.ou.count;
        if (!gram_lit_narrow(g, &lo, &hi, 0, b) || !range_admissible(g, &v, f, lo, hi)) return ST_REJECT;
        f->u.ou.lo = lo;
        f->u.ou.hi = hi;
        f->u.ou.off = 1;
        f->phase = OBJ_KEY;
        return ST_OK;
    }
    case OBJ_KEY: {
        uint32_t lo = f->u.ou.lo, hi = f->u.ou.hi, off = f->u.ou.off;
        if (!gram_lit_narrow(g, &lo, &hi, off, b) || !range_admissible(g, &v, f, lo, hi)) return ST_REJECT;
        f->u.ou.lo = lo;
        f->u.ou.hi = hi;
        f->u.ou.off = ++off;
        if (g->lits[lo].len == off) { /* keys are quoted: a full match is the only one */
            uint32_t k = g->lits[lo].member;
            f->u.ou.key = k;
            f->u.ou.seen |= 1ull << k;
            f->u.ou.live &= v.has[k];
            f->phase = OBJ_COLON;
            if (one_bit(f->u.ou.live)) commit(&v, f);
        }
        return ST_OK;
    }
    case OBJ_COLON:
        if (b != ':') return ST_REJECT;
        f->phase = OBJ_VALUE;
        return ST_OK;
    case OBJ_VALUE: {
        uint32_t k = f->u.ou.key;
        int ok = k == n->u.ou.disc_key ? gram_push_value(g, st, n->u.ou.disc_node, GRAM_FF_DISC, b)
                                       : start_value(g, st, f, &v, k, b);
        return ok ? ST_OK : ST_REJECT;
    }
    case OBJ_AFTER:
        if (b == ',') {
            if (!any_admissible(&v, f)) return ST_REJECT;
            f->phase = OBJ_NEXT;
            return ST_OK;
        }
        if (b == '}') return can_close(g, &v, f) ? ST_DONE : ST_REJECT;
        return ST_REJECT;
    default: return ST_REJECT;
    }
}

void gram_union_value_done(const grammar *g, grammar_frame *f, uint64_t key) {
    const ou_view v = view(g, f);
    f->phase = OBJ_AFTER;
    if (f->u.ou.key != v.n->u.ou.disc_key) return;
    f->u.ou.live &= 1ull << key; /* the literal's member is the alternative */
    f->u.ou.key = GRAM_NONE;
    commit(&v, f);
}

int gram_union_disc_live(const grammar_state *st, uint32_t member) {
    const grammar_frame *p = &st->frames[st->depth - 2];
    return p->kind == GRAM_FR_OBJ_UNION && member < 64 && (p->u.ou.live >> member & 1);
}

int gram_union_complete_byte(const grammar *g, const grammar_state *st,
                             int (*accepts)(const grammar *, const grammar_state *, uint8_t)) {
    const grammar_frame *f = &st->frames[st->depth - 1];
    const ou_view v = view(g, f);
    switch (f->phase) {
    case OBJ_OPEN: return '{';
    case OBJ_FIRST: return accepts(g, st, '}') ? '}' : '"';
    case OBJ_AFTER: return accepts(g, st, '}') ? '}' : ',';
    case OBJ_NEXT: return '"';
    case OBJ_COLON: return ':';
    case OBJ_KEY:
        /* a key that commits (the discriminator, or one declared by one live alternative)
         * first: every key read either commits or is one more seen key, so this ends */
        for (int pass = 0; pass < 2; pass++)
            for (uint32_t i = f->u.ou.lo; i < f->u.ou.hi; i++) {
                const gram_lit *e = &g->lits[i];
                uint32_t k = e->member;
                int commits = k == v.n->u.ou.disc_key || one_bit(v.has[k] & f->u.ou.live);
                if (e->len > f->u.ou.off && admissible(&v, f, k) && (pass || commits) &&
                    accepts(g, st, g->lit_bytes[e->off + f->u.ou.off]))
                    return g->lit_bytes[e->off + f->u.ou.off];
            }
        return -1;
    default: return -1;
    }
}
