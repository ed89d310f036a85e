/* compiler_union.c: the unions of anyOf/oneOf and type lists (gram_make_union), and those
 * with two or more object alternatives (pydantic's Union[ModelA, ModelB]), compiled into
 * one GRAM_NODE_OBJ_UNION node (schema_ir.h).
 *
 * The first byte of every alternative is "{", so the pick table of an ordinary union cannot
 * choose. Instead the recognizer reads one object over the keys of all alternatives and
 * keeps the set of alternatives still possible ("live"); each key narrows it to the
 * alternatives that declare the key, and a discriminator value narrows it to one. When one
 * alternative is left the frame becomes an ordinary object frame of that alternative
 * (the "commit"). Before the commit a key is admitted only if its value can be read
 * without knowing the alternative:
 *   - one live alternative declares it (reading it commits that one);
 *   - it is the discriminator (its value is a literal of all alternatives' values, whose
 *     member is the alternative);
 *   - the live alternatives that declare it give it equal compiled schemas;
 *   - their schemas for it differ but start with different bytes (split): the value's
 *     first byte then keeps the alternatives whose schema it starts.
 *
 * A union is accepted when its alternatives can be told apart and produced:
 *   const  a property every alternative declares whose schema is a literal (const, enum,
 *          Literal[...]) and whose values differ between any two alternatives; or
 *   keys   for any two alternatives, one requires a property the other does not declare;
 * and, checked over every set of alternatives that can be live before a commit
 * (check_reachable), the object can always go on and every alternative can be written.
 * That keeps the recognizer free of dead ends. (It closes an object before a commit only
 * when exactly one alternative is complete, so that oneOf holds: with the keys plan two
 * never are, with the const plan the discriminator can always be written instead.) Anything else is refused with a message
 * naming the alternatives (by their index in the anyOf/oneOf) or the key. */
#include <stdlib.h>
#include <string.h>

#include "grammar/compiler.h"

static int lit_equal(const grammar *g, uint32_t i, uint32_t j) {
    const gram_lit *x = &g->lits[i], *y = &g->lits[j];
    return x->len == y->len && !memcmp(g->lit_bytes + x->off, g->lit_bytes + y->off, x->len);
}

static int dfa_equal(const gram_dfa *x, const gram_dfa *y) {
    size_t nt = (size_t)x->n_states * x->n_classes;
    return x->n_states == y->n_states && x->n_classes == y->n_classes &&
           !memcmp(x->bounds, y->bounds, (x->n_classes + 1) * sizeof *x->bounds) &&
           !memcmp(x->trans, y->trans, nt * sizeof *x->trans) &&
           !memcmp(x->accept, y->accept, x->n_states * sizeof *x->accept) &&
           !memcmp(x->ascii_class, y->ascii_class, sizeof x->ascii_class);
}

/* Whether two compiled nodes admit the same values in the same way (structurally equal).
 * Conservative: 0 may be said of equivalent nodes, never 1 of different ones. */
/* Same dependentRequired (both objects have n_props properties). */
static int deps_equal(const grammar *g, const gram_node *a, const gram_node *c) {
    if (a->u.obj.deps == GRAM_NONE || c->u.obj.deps == GRAM_NONE) return a->u.obj.deps == c->u.obj.deps;
    return !memcmp(g->dep_masks + a->u.obj.deps, g->dep_masks + c->u.obj.deps,
                   a->u.obj.n_props * sizeof(uint64_t));
}

static int nodes_equal(const grammar *g, uint32_t x, uint32_t y, int depth) {
    if (x == y) return 1;
    if (x == GRAM_NONE || y == GRAM_NONE || depth > GRAMMAR_MAX_DEPTH) return 0;
    const gram_node *a = &g->nodes[x], *c = &g->nodes[y];
    if (a->kind != c->kind) return 0;
    switch (a->kind) {
    case GRAM_NODE_STRING:
        if (a->u.str.min_len != c->u.str.min_len || a->u.str.max_len != c->u.str.max_len ||
            (a->u.str.dfa < 0) != (c->u.str.dfa < 0) || (a->u.str.table < 0) != (c->u.str.table < 0))
            return 0;
        return a->u.str.dfa < 0 || dfa_equal(&g->dfas[a->u.str.dfa], &g->dfas[c->u.str.dfa]);
    case GRAM_NODE_NUMBER: return !memcmp(&a->u.num, &c->u.num, sizeof a->u.num); /* nodes start zeroed */
    case GRAM_NODE_LITERAL:
        if (a->u.lit.count != c->u.lit.count || a->u.lit.n_members != c->u.lit.n_members) return 0;
        for (uint32_t i = 0; i < a->u.lit.count; i++)
            if (!lit_equal(g, a->u.lit.first + i, c->u.lit.first + i) ||
                g->lits[a->u.lit.first + i].member != g->lits[c->u.lit.first + i].member)
                return 0;
        return 1;
    case GRAM_NODE_OBJECT:
        if (a->u.obj.n_props != c->u.obj.n_props || a->u.obj.count != c->u.obj.count ||
            a->u.obj.required != c->u.obj.required || !deps_equal(g, a, c) ||
            !nodes_equal(g, a->u.obj.free_value, c->u.obj.free_value, depth + 1) ||
            (a->u.obj.free_value != GRAM_NONE && !nodes_equal(g, a->u.obj.free_key, c->u.obj.free_key, depth + 1)))
            return 0;
        for (uint32_t i = 0; i < a->u.obj.count; i++)
            if (!lit_equal(g, a->u.obj.first + i, c->u.obj.first + i) ||
                g->lits[a->u.obj.first + i].member != g->lits[c->u.obj.first + i].member)
                return 0;
        for (uint32_t p = 0; p < a->u.obj.n_props; p++)
            if (!nodes_equal(g, g->prop_nodes[a->u.obj.props + p], g->prop_nodes[c->u.obj.props + p], depth + 1))
                return 0;
        return 1;
    case GRAM_NODE_ARRAY:
        return a->u.arr.min == c->u.arr.min && a->u.arr.max == c->u.arr.max && a->u.arr.unique == c->u.arr.unique &&
               nodes_equal(g, a->u.arr.items, c->u.arr.items, depth + 1);
    case GRAM_NODE_UNION:
        for (int b = 0; b < 256; b++) {
            uint32_t p = g->picks[a->u.uni.pick + b], q = g->picks[c->u.uni.pick + b];
            if ((p == 0) != (q == 0) || (p && !nodes_equal(g, p - 1, q - 1, depth + 1))) return 0;
        }
        return 1;
    default: return 0;
    }
}

/* Appends a copy of literal entry i with a new member (the bytes are copied first: the
 * table they live in may move while growing). */
static int copy_lit(gram_builder *b, uint32_t i, uint32_t member) {
    const gram_lit e = b->g->lits[i];
    uint8_t *tmp = malloc(e.len + 1u);
    if (!tmp) return -1;
    memcpy(tmp, b->g->lit_bytes + e.off, e.len);
    int rc = gram_push_lit(b, tmp, e.len, member);
    free(tmp);
    return rc;
}

static int lits_disjoint(const grammar *g, const gram_node *x, const gram_node *y) {
    for (uint32_t i = 0; i < x->u.lit.count; i++)
        for (uint32_t j = 0; j < y->u.lit.count; j++)
            if (lit_equal(g, x->u.lit.first + i, y->u.lit.first + j)) return 0;
    return 1;
}

enum { OU_MAX_SETS = 1024 }; /* live sets check_reachable visits at most */

typedef struct ou_plan {
    uint32_t n, n_keys, disc;
    uint32_t alts[GRAM_MAX_OBJ_ALTS];
    uint32_t has[GRAM_MAX_PROPS];
    uint32_t map[GRAM_MAX_OBJ_ALTS * GRAM_MAX_PROPS]; /* [a * n_keys + k], as in the node's table */
    uint32_t cls[GRAM_MAX_OBJ_ALTS * GRAM_MAX_PROPS];
    uint32_t split[GRAM_MAX_PROPS]; /* union node over key k's differing schemas, or GRAM_NONE */
    uint32_t key_lit[GRAM_MAX_PROPS]; /* an entry spelling the key, for messages */
} ou_plan;

static uint32_t prop_node(const grammar *g, const ou_plan *pl, uint32_t a, uint32_t k) {
    return g->prop_nodes[g->nodes[pl->alts[a]].u.obj.props + pl->map[a * pl->n_keys + k]];
}

static int requires(const grammar *g, const ou_plan *pl, uint32_t a, uint32_t k) {
    uint32_t p = pl->map[a * pl->n_keys + k];
    return p != GRAM_NONE && (g->nodes[pl->alts[a]].u.obj.required >> p & 1);
}

/* Merges the key sets: every spelling of every key once, member = merged key index; fills
 * has, map (GRAM_NONE where an alternative lacks the key) and key_lit. */
static int merge_keys(gram_builder *b, ou_plan *pl, uint32_t *first, uint32_t *count) {
    grammar *g = b->g;
    uint32_t merged[2 * GRAM_MAX_PROPS], n_merged = 0;
    uint32_t mkey[2 * GRAM_MAX_PROPS];
    uint32_t key_of[GRAM_MAX_OBJ_ALTS][GRAM_MAX_PROPS]; /* property -> merged key */
    for (uint32_t a = 0; a < pl->n; a++) {
        const gram_node *o = &g->nodes[pl->alts[a]];
        for (uint32_t p = 0; p < GRAM_MAX_PROPS; p++) key_of[a][p] = GRAM_NONE;
        for (uint32_t i = 0; i < o->u.obj.count; i++) {
            uint32_t e = o->u.obj.first + i, p = g->lits[e].member, k = GRAM_NONE;
            for (uint32_t j = 0; j < n_merged && k == GRAM_NONE; j++)
                if (lit_equal(g, merged[j], e)) k = mkey[j];
            if (k == GRAM_NONE) k = key_of[a][p]; /* the other spelling of a key seen */
            if (k == GRAM_NONE) {
                if (pl->n_keys == GRAM_MAX_PROPS)
                    return gram_fail(b, "the object alternatives have more than %d distinct properties", GRAM_MAX_PROPS);
                k = pl->n_keys++;
                pl->has[k] = 0;
                pl->key_lit[k] = e;
            }
            key_of[a][p] = k;
            pl->has[k] |= 1u << a;
            int known = 0;
            for (uint32_t j = 0; j < n_merged; j++) known |= lit_equal(g, merged[j], e);
            if (!known) merged[n_merged] = e, mkey[n_merged++] = k;
        }
    }
    for (uint32_t i = 0; i < pl->n * pl->n_keys; i++) pl->map[i] = GRAM_NONE;
    for (uint32_t a = 0; a < pl->n; a++)
        for (uint32_t p = 0; p < GRAM_MAX_PROPS; p++)
            if (key_of[a][p] != GRAM_NONE) pl->map[a * pl->n_keys + key_of[a][p]] = p;
    *first = g->n_lits;
    for (uint32_t j = 0; j < n_merged; j++)
        if (copy_lit(b, merged[j], mkey[j])) return gram_oom(b);
    *count = n_merged;
    gram_sort_lits(g, *first, n_merged);
    return 0;
}

/* cls: for key k and alternative a, the least alternative whose value schema for k is
 * equal to a's. */
static void value_classes(const grammar *g, ou_plan *pl) {
    const uint32_t nk = pl->n_keys;
    for (uint32_t k = 0; k < nk; k++)
        for (uint32_t a = 0; a < pl->n; a++) {
            uint32_t *c = &pl->cls[a * nk + k];
            *c = GRAM_NONE;
            if (!(pl->has[k] >> a & 1)) continue;
            for (uint32_t x = 0; x <= a && *c == GRAM_NONE; x++)
                if ((pl->has[k] >> x & 1) && (x == a || nodes_equal(g, prop_node(g, pl, x, k), prop_node(g, pl, a, k), 0)))
                    *c = x;
        }
}

/* split: for each key whose declarers' value schemas differ but start with different
 * bytes (a string and an integer, a string and an array, ...), a union node over one
 * schema of each class, so that the value's first byte tells the classes apart. */
static int split_keys(gram_builder *b, ou_plan *pl) {
    const uint32_t nk = pl->n_keys;
    for (uint32_t k = 0; k < nk; k++) {
        uint32_t reps[GRAM_MAX_OBJ_ALTS], n_reps = 0;
        uint8_t taken[256] = {0};
        int disjoint = 1;
        pl->split[k] = GRAM_NONE;
        for (uint32_t a = 0; a < pl->n && disjoint; a++) {
            if (!(pl->has[k] >> a & 1) || pl->cls[a * nk + k] != a) continue; /* one per class */
            uint8_t set[256] = {0};
            reps[n_reps++] = prop_node(b->g, pl, a, k);
            gram_first_bytes(b, reps[n_reps - 1], set);
            for (int c = 0; c < 256 && disjoint; c++) {
                disjoint = !(set[c] && taken[c]);
                taken[c] |= set[c];
            }
        }
        if (n_reps < 2 || !disjoint) continue;
        uint32_t u = gram_new_node(b, GRAM_NODE_UNION);
        if (u == GRAM_NONE) return gram_oom(b);
        int rc = gram_set_picks(b, u, reps, n_reps);
        if (rc) return rc;
        pl->split[k] = u;
    }
    return 0;
}

/* Adds the live set `next` (two or more alternatives) to the sets to visit. */
static int add_set(gram_builder *b, uint32_t *sets, uint32_t *n_sets, uint32_t next) {
    uint32_t j = 0;
    while (j < *n_sets && sets[j] != next) j++;
    if (j < *n_sets) return 0;
    if (*n_sets == OU_MAX_SETS)
        return gram_fail(b, "the object alternatives share keys in too many ways to check (more than %d sets "
                            "of alternatives); give them a discriminator", OU_MAX_SETS);
    sets[(*n_sets)++] = next;
    return 0;
}

/* The const plan: the first key every alternative declares as a literal, with values
 * that differ between any two alternatives. GRAM_NONE if there is none. */
static uint32_t find_discriminator(const grammar *g, const ou_plan *pl) {
    const uint32_t all = pl->n == 32 ? UINT32_MAX : (1u << pl->n) - 1;
    for (uint32_t k = 0; k < pl->n_keys; k++) {
        if (pl->has[k] != all) continue;
        int ok = 1;
        for (uint32_t a = 0; a < pl->n && ok; a++) {
            const gram_node *x = &g->nodes[prop_node(g, pl, a, k)];
            ok = x->kind == GRAM_NODE_LITERAL;
            for (uint32_t c = 0; c < a && ok; c++) ok = lits_disjoint(g, x, &g->nodes[prop_node(g, pl, c, k)]);
        }
        if (ok) return k;
    }
    return GRAM_NONE;
}

/* Without a discriminator: for any two alternatives, one requires a key the other does not
 * declare (so no object is valid against both, and oneOf means what it says). */
static int check_apart(gram_builder *b, const ou_plan *pl, const uint32_t *origin) {
    const grammar *g = b->g;
    for (uint32_t a = 0; a < pl->n; a++)
        for (uint32_t c = a + 1; c < pl->n; c++) {
            int apart = 0;
            for (uint32_t k = 0; k < pl->n_keys && !apart; k++)
                apart = (requires(g, pl, a, k) && !(pl->has[k] >> c & 1)) ||
                        (requires(g, pl, c, k) && !(pl->has[k] >> a & 1));
            if (!apart)
                return gram_fail(b, "alternatives [%u] and [%u] are objects that cannot be told apart: neither "
                                    "requires a property the other lacks, and no property has a distinct const "
                                    "value in each (a discriminator, such as a Literal field in pydantic)",
                                 origin[a], origin[c]);
        }
    return 0;
}

/* Walks every set of alternatives the recognizer can be left with before a commit (the
 * live sets) and checks, for each, that the object can always go on: some key moves to a
 * smaller set (or commits), or some live alternative needs only keys readable there and
 * declared by all of the set (it can be finished and closed without a commit). Keys seen
 * in a live set are declared by all of it, so this covers every seen set too. Also checks
 * that every alternative can be produced: committed, or closed in some live set. */
static int check_reachable(gram_builder *b, const ou_plan *pl, const uint32_t *origin) {
    const grammar *g = b->g;
    const uint32_t nk = pl->n_keys;
    uint32_t *sets = malloc(OU_MAX_SETS * sizeof *sets), n_sets = 1, produced = 0;
    if (!sets) return gram_oom(b);
    sets[0] = pl->n == 32 ? UINT32_MAX : (1u << pl->n) - 1;
    int rc = 0;
    for (uint32_t i = 0; i < n_sets && !rc; i++) {
        const uint32_t live = sets[i];
        uint64_t common = 0; /* readable keys every live alternative declares */
        int moves = 0;
        for (uint32_t k = 0; k < nk && !rc; k++) {
            if (!gram_ou_readable(pl->has, pl->split, pl->cls, nk, k, pl->disc, live)) continue;
            const uint32_t next = pl->has[k] & live;
            uint32_t agree = 1, first = GRAM_NONE; /* do the declarers agree on the schema? */
            for (uint32_t a = 0; a < pl->n; a++)
                if (next >> a & 1) {
                    if (first == GRAM_NONE) first = pl->cls[a * nk + k];
                    agree &= pl->cls[a * nk + k] == first;
                }
            if (k == pl->disc) { /* the value commits any live alternative */
                produced |= live;
                moves = 1;
            } else if (!agree) { /* split: the value's first byte keeps the declarers of one class */
                moves = 1;
                uint32_t done = 0;
                for (uint32_t a = 0; a < pl->n && !rc; a++) {
                    if (!(next >> a & 1) || (done >> a & 1)) continue;
                    uint32_t sub = 0;
                    for (uint32_t c = 0; c < pl->n; c++)
                        if ((next >> c & 1) && pl->cls[c * nk + k] == pl->cls[a * nk + k]) sub |= 1u << c;
                    done |= sub;
                    if (!(sub & (sub - 1))) produced |= sub;
                    else rc = add_set(b, sets, &n_sets, sub);
                }
            } else if (next == live) {
                common |= 1ull << k;
            } else if (!(next & (next - 1))) {
                produced |= next;
                moves = 1;
            } else {
                moves = 1;
                rc = add_set(b, sets, &n_sets, next);
            }
        }
        int closes = 0;
        for (uint32_t a = 0; a < pl->n && !rc; a++) {
            if (!(live >> a & 1)) continue;
            int ok = 1;
            for (uint32_t k = 0; k < nk && ok; k++) ok = !requires(g, pl, a, k) || (common >> k & 1);
            if (ok) produced |= 1u << a, closes = 1;
        }
        if (!rc && !moves && !closes) {
            uint32_t a = 0;
            while (!(live >> a & 1)) a++;
            rc = gram_fail(b, "alternative [%u] and the others it shares its keys with cannot be finished: "
                              "after the properties they share, none of their required properties has the same "
                              "schema in all of them; give them a discriminator (a const property)", origin[a]);
        }
    }
    for (uint32_t a = 0; a < pl->n && !rc; a++) {
        if (produced >> a & 1) continue;
        uint32_t k = 0;
        while (k < nk && !(requires(g, pl, a, k) && pl->has[k] != 1u << a)) k++;
        const gram_lit *e = &g->lits[pl->key_lit[k < nk ? k : 0]];
        rc = gram_fail(b, "alternative [%u] can never be chosen: the properties that would tell it apart "
                          "(such as %.*s) are shared with other alternatives under different schemas; give it a "
                          "discriminator (a const property) or a required property of its own",
                       origin[a], (int)e->len, (const char *)g->lit_bytes + e->off);
    }
    free(sets);
    return rc;
}

int gram_build_object_union(gram_builder *b, const uint32_t *objs, const uint32_t *origin, uint32_t n,
                            uint32_t *out) {
    grammar *g = b->g;
    if (n > GRAM_MAX_OBJ_ALTS) return gram_fail(b, "a union of more than %d object schemas", GRAM_MAX_OBJ_ALTS);
    ou_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return gram_oom(b);
    int rc = 0;
    pl->n = n;
    pl->disc = GRAM_NONE;
    for (uint32_t a = 0; a < n && !rc; a++) {
        pl->alts[a] = objs[a];
        /* the union's reading (which alternative may still close, compiler_union's dead-end
         * analysis) goes by the required keys alone */
        if (!rc && g->nodes[objs[a]].u.obj.deps != GRAM_NONE)
            rc = gram_fail(b, "alternative [%u] has dependentRequired: not supported in a union of objects", origin[a]);
        if (!rc && g->nodes[objs[a]].u.obj.free_value != GRAM_NONE)
            rc = gram_fail(b, "alternative [%u] is a free-form object (no properties): a union of objects needs "
                              "declared properties in each alternative to tell them apart", origin[a]);
    }
    uint32_t first = 0, count = 0, disc_node = GRAM_NONE, table = 0;
    if (!rc) rc = merge_keys(b, pl, &first, &count);
    if (!rc) value_classes(g, pl);
    if (!rc) rc = split_keys(b, pl);
    if (!rc && (pl->disc = find_discriminator(g, pl)) != GRAM_NONE) {
        uint32_t lit_first = g->n_lits;
        for (uint32_t a = 0; a < n && !rc; a++) {
            const gram_node x = g->nodes[prop_node(g, pl, a, pl->disc)];
            for (uint32_t i = 0; i < x.u.lit.count && !rc; i++)
                if (copy_lit(b, x.u.lit.first + i, a)) rc = gram_oom(b);
        }
        if (!rc && (disc_node = gram_new_node(b, GRAM_NODE_LITERAL)) == GRAM_NONE) rc = gram_oom(b);
        if (!rc) {
            gram_sort_lits(g, lit_first, g->n_lits - lit_first);
            g->nodes[disc_node].u.lit.first = lit_first;
            g->nodes[disc_node].u.lit.count = g->n_lits - lit_first;
            g->nodes[disc_node].u.lit.n_members = n;
        }
    } else if (!rc) {
        rc = check_apart(b, pl, origin);
    }
    if (!rc) rc = check_reachable(b, pl, origin);
    const uint32_t nk = pl->n_keys;
    if (!rc && gram_push_props(b, n + 2 * nk + 2 * n * nk, &table)) rc = gram_oom(b);
    if (!rc) {
        uint32_t *t = g->prop_nodes + table;
        memcpy(t, pl->alts, n * sizeof *t);
        memcpy(t + n, pl->has, nk * sizeof *t);
        memcpy(t + n + nk, pl->split, nk * sizeof *t);
        memcpy(t + n + 2 * nk, pl->map, n * nk * sizeof *t);
        memcpy(t + n + 2 * nk + n * nk, pl->cls, n * nk * sizeof *t);
        uint32_t u = gram_new_node(b, GRAM_NODE_OBJ_UNION);
        if (u == GRAM_NONE) rc = gram_oom(b);
        else {
            gram_node *on = &g->nodes[u];
            on->u.ou.first = first;
            on->u.ou.count = count;
            on->u.ou.n_alts = n;
            on->u.ou.n_keys = nk;
            on->u.ou.table = table;
            on->u.ou.disc_key = pl->disc;
            on->u.ou.disc_node = disc_node;
            *out = u;
        }
    }
    free(pl);
    return rc;
}

/* ---- unions of any alternatives ------------------------------------------------------------ */

/* Union of built alternatives (nested unions are flattened). Two or more objects among
 * them become one object union (above), which takes the "{" of the pick table. */
int gram_make_union(gram_builder *b, const uint32_t *alts, uint32_t n, uint32_t *out) {
    uint32_t flat[64], origin[64], m = 0;
    for (uint32_t i = 0; i < n; i++) {
        const gram_node *a = &b->g->nodes[alts[i]];
        if (a->kind != GRAM_NODE_UNION) {
            if (m == 64) return gram_fail(b, "too many alternatives");
            origin[m] = i;
            flat[m++] = alts[i];
            continue;
        }
        for (int c = 0; c < 256; c++) { /* the distinct alternatives of the inner union */
            uint32_t x = b->g->picks[a->u.uni.pick + c], seen = 0;
            for (uint32_t k = 0; x && k < m; k++) seen |= flat[k] == x - 1;
            if (x && !seen) {
                if (m == 64) return gram_fail(b, "too many alternatives");
                origin[m] = i;
                flat[m++] = x - 1;
            }
        }
    }
    uint32_t objs[GRAM_MAX_OBJ_ALTS], obj_origin[GRAM_MAX_OBJ_ALTS], n_objs = 0, rest = 0;
    for (uint32_t i = 0; i < m; i++) {
        const gram_node *a = &b->g->nodes[flat[i]];
        uint32_t k = a->kind == GRAM_NODE_OBJECT ? 1 : a->kind == GRAM_NODE_OBJ_UNION ? a->u.ou.n_alts : 0;
        if (!k) {
            origin[rest] = origin[i];
            flat[rest++] = flat[i];
            continue;
        }
        if (n_objs + k > GRAM_MAX_OBJ_ALTS)
            return gram_fail(b, "a union of more than %d object schemas", GRAM_MAX_OBJ_ALTS);
        for (uint32_t j = 0; j < k; j++) { /* a nested object union contributes its alternatives */
            objs[n_objs] = k == 1 ? flat[i] : b->g->prop_nodes[a->u.ou.table + j];
            obj_origin[n_objs++] = origin[i];
        }
    }
    if (n_objs == 1) {
        origin[rest] = obj_origin[0];
        flat[rest++] = objs[0];
    } else if (n_objs > 1) {
        int rc = gram_build_object_union(b, objs, obj_origin, n_objs, &flat[rest]);
        if (rc) return rc;
        origin[rest++] = obj_origin[0];
    }
    m = rest;
    if (m == 1) {
        *out = flat[0];
        return 0;
    }
    uint32_t u = gram_new_node(b, GRAM_NODE_UNION);
    if (u == GRAM_NONE) return gram_oom(b);
    int rc = gram_set_picks(b, u, flat, m);
    if (!rc) *out = u;
    return rc;
}

/* Whether values of node may be an object union (refused where values are hashed). */
int gram_has_object_union(const gram_builder *b, uint32_t node) {
    const gram_node *n = &b->g->nodes[node];
    if (n->kind == GRAM_NODE_UNION && b->g->picks[n->u.uni.pick + '{'])
        n = &b->g->nodes[b->g->picks[n->u.uni.pick + '{'] - 1];
    return n->kind == GRAM_NODE_OBJ_UNION;
}

/* Property index of the key spelled by literal entry `lit` in object node o, or GRAM_NONE. */
static uint32_t key_of(const grammar *g, const gram_node *o, uint32_t lit) {
    for (uint32_t i = 0; i < o->u.obj.count; i++)
        if (lit_equal(g, o->u.obj.first + i, lit)) return g->lits[o->u.obj.first + i].member;
    return GRAM_NONE;
}

int gram_objects_exclusive(const gram_builder *b, uint32_t a, uint32_t c, int closed_c) {
    const grammar *g = b->g;
    const gram_node *x = &g->nodes[a], *y = &g->nodes[c];
    if (x->kind != GRAM_NODE_OBJECT || y->kind != GRAM_NODE_OBJECT || x->u.obj.free_value != GRAM_NONE) return 0;
    /* c requires a key a never writes (a's values have only declared keys) */
    for (uint32_t i = 0; i < y->u.obj.count; i++) {
        const uint32_t p = g->lits[y->u.obj.first + i].member;
        if ((y->u.obj.required >> p & 1) && key_of(g, x, y->u.obj.first + i) == GRAM_NONE) return 1;
    }
    for (uint32_t i = 0; i < x->u.obj.count; i++) {
        const uint32_t p = g->lits[x->u.obj.first + i].member;
        if (!(x->u.obj.required >> p & 1)) continue;
        const uint32_t q = key_of(g, y, x->u.obj.first + i);
        /* a always writes a key that c, closed, does not declare */
        if (q == GRAM_NONE) {
            if (closed_c && y->u.obj.free_value == GRAM_NONE) return 1;
            continue;
        }
        /* a always writes a key whose literal values c's schema for it never takes */
        const gram_node *u = &g->nodes[g->prop_nodes[x->u.obj.props + p]];
        const gram_node *v = &g->nodes[g->prop_nodes[y->u.obj.props + q]];
        if (u->kind == GRAM_NODE_LITERAL && v->kind == GRAM_NODE_LITERAL && lits_disjoint(g, u, v)) return 1;
    }
    /* Every key of a is declared by c, and one key has disjoint literal values in both (an
     * optional discriminator): in the object union c stays live until that key is read,
     * since no other key of a can rule c out, and the recognizer closes the object before
     * a commit only when exactly one live alternative is complete; so a's object either
     * has the key, with a value c refuses, or lacks a key c requires. */
    int disjoint_key = 0;
    for (uint32_t i = 0; i < x->u.obj.count; i++) {
        const uint32_t p = g->lits[x->u.obj.first + i].member, q = key_of(g, y, x->u.obj.first + i);
        if (q == GRAM_NONE) return 0;
        const gram_node *u = &g->nodes[g->prop_nodes[x->u.obj.props + p]];
        const gram_node *v = &g->nodes[g->prop_nodes[y->u.obj.props + q]];
        if (u->kind == GRAM_NODE_LITERAL && v->kind == GRAM_NODE_LITERAL && lits_disjoint(g, u, v)) disjoint_key = 1;
    }
    return disjoint_key;
}
