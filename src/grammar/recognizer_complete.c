/* grammar_complete(): a short continuation that finishes the call array from any state.
 *
 * "No dead ends" promises that some completion exists; a decoder that runs out of tokens
 * also needs to find one, and greedy byte orders do not: "closers first" keeps adding the
 * first letter it tries to an email address forever. Here each frame chooses the byte
 * that brings its own value closest to complete, so every frame finishes in a bounded
 * number of bytes and the whole walk terminates:
 *   strings with a pattern or format follow a shortest path of their DFA to an accepting
 *     state (with minLength/maxLength, the length table's least completion); others
 *     close at once, or pad with 'a' up to minLength or past a used value (uniqueItems);
 *   numbers end as soon as their value is valid, else take the first digit (or '.', '-')
 *     that stays live; the digit caps bound them;
 *   literals, keys and names finish one entry still allowed;
 *   objects add missing required properties, arrays items up to minItems, each with the
 *     first byte the grammar accepts among  " 0-9 - { [  (then any byte); a union of
 *     objects writes a key that commits an alternative (recognizer_union.c);
 *   everything else closes.
 * Every chosen byte is checked with the recognizer, so the result is always accepted. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/recognizer.h"
#include "needle.h"
#include "util/error.h"
#include "util/json_escape.h"

typedef struct dist_cache {
    int32_t dfa;      /* DFA whose distances are in dist, -1 = none yet */
    uint32_t *dist;   /* code points from each state to an accepting one */
} dist_cache;

static int accepts(const grammar *g, const grammar_state *st, uint8_t b) {
    grammar_state tmp;
    grammar_state_copy(&tmp, st);
    return gram_step(g, &tmp, b);
}

/* The first byte of `order` (then any byte) that st accepts; -1 if none (cannot happen:
 * the recognizer has no dead ends). */
static int first_accepted(const grammar *g, const grammar_state *st, const char *order) {
    for (const char *p = order; *p; p++)
        if (accepts(g, st, (uint8_t)*p)) return (uint8_t)*p;
    for (int b = 0; b < 256; b++)
        if (accepts(g, st, (uint8_t)b)) return b;
    return -1;
}

#define VALUE_START "\"0123456789-{["

/* Breadth-first distances (in code points) from every state of d to an accepting state. */
static int dfa_distances(const gram_dfa *d, uint32_t *dist) {
    uint32_t n = d->n_states, nc = d->n_classes;
    uint32_t *count = calloc(n + 1, sizeof *count), *pred = malloc((size_t)n * nc * sizeof *pred + 4);
    uint32_t *queue = malloc((n + 1) * sizeof *queue);
    if (!count || !pred || !queue) {
        free(count), free(pred), free(queue);
        return -1;
    }
    for (size_t e = 0; e < (size_t)n * nc; e++) /* reverse edges in CSR form */
        if (d->trans[e] >= 0) count[d->trans[e] + 1]++;
    for (uint32_t s = 0; s < n; s++) count[s + 1] += count[s];
    for (size_t e = 0; e < (size_t)n * nc; e++)
        if (d->trans[e] >= 0) pred[count[d->trans[e]]++] = (uint32_t)(e / nc);
    for (uint32_t s = n; s > 0; s--) count[s] = count[s - 1]; /* restore the starts */
    count[0] = 0;
    uint32_t head = 0, tail = 0;
    for (uint32_t s = 0; s < n; s++) {
        dist[s] = d->accept[s] ? 0 : UINT32_MAX;
        if (d->accept[s]) queue[tail++] = s;
    }
    while (head < tail) {
        uint32_t s = queue[head++];
        for (uint32_t k = count[s]; k < count[s + 1]; k++)
            if (dist[pred[k]] == UINT32_MAX) dist[pred[k]] = dist[s] + 1, queue[tail++] = pred[k];
    }
    free(count), free(pred), free(queue);
    return 0;
}

/* Spells code point cp inside a JSON string, as json.dumps(ensure_ascii=False) would. */
static size_t spell_cp(uint32_t cp, uint8_t *out) {
    return util_json_escape_cp(cp, 0, (char *)out);
}

/* A code point of [lo, hi) to stand for its class, a letter or digit if there is one;
 * *rank tells how plain it is (lower is plainer). 0 if the class has none to write. */
static int pick_cp(uint32_t lo, uint32_t hi, uint32_t *cp, uint32_t *rank) {
    static const char nice[] = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-_.@:/ ";
    for (const char *p = nice; *p; p++)
        if ((uint32_t)*p >= lo && (uint32_t)*p < hi) return *cp = (uint32_t)*p, *rank = (uint32_t)(p - nice), 1;
    for (uint32_t c = lo; c < hi; c++) {
        if (c >= 0xD800 && c <= 0xDFFF) { /* surrogates cannot be written */
            c = 0xDFFF;
            continue;
        }
        return *cp = c, *rank = 1000, 1;
    }
    return 0;
}

/* Bytes that move a string frame one code point closer to its end (or close it). */
static int string_choice(const grammar *g, const grammar_state *st, dist_cache *dc, uint8_t *seq, size_t *n) {
    const grammar_frame *f = &st->frames[st->depth - 1];
    const gram_node *node = &g->nodes[f->node];
    int b = -1;
    switch (f->phase) {
    case STR_BODY: break;
    case STR_ESC: seq[0] = 'u'; *n = 1; return 0;
    case STR_LOW0: seq[0] = '\\'; *n = 1; return 0;
    case STR_LOW1: seq[0] = 'u'; *n = 1; return 0;
    case STR_U:
    case STR_LOWU: b = first_accepted(g, st, "0123456789abcdef"); break;
    default: { /* inside a UTF-8 sequence */
        b = -1;
        for (int c = f->u.str.blo; c <= f->u.str.bhi && b < 0; c++)
            if (accepts(g, st, (uint8_t)c)) b = c;
    }
    }
    if (f->phase != STR_BODY) {
        if (b < 0) return -1;
        seq[0] = (uint8_t)b;
        *n = 1;
        return 0;
    }
    if (node->u.str.dfa < 0) { /* close, or pad: minLength, or a value already used */
        if ((b = first_accepted(g, st, "\"abcdefghijklmnopqrstuvwxyz")) < 0) return -1;
        seq[0] = (uint8_t)b;
        *n = 1;
        return 0;
    }
    const gram_dfa *d = &g->dfas[node->u.str.dfa];
    uint32_t s = f->u.str.dfa, len = f->u.str.len, min = node->u.str.min_len;
    if (d->accept[s] && len >= min) {
        seq[0] = '"';
        *n = 1;
        return 0;
    }
    const gram_len_table *t = node->u.str.table >= 0 ? &g->tables[node->u.str.table] : NULL;
    if (!t && dc->dfa != node->u.str.dfa) {
        free(dc->dist);
        dc->dfa = -1;
        if (!(dc->dist = malloc(d->n_states * sizeof *dc->dist)) || dfa_distances(d, dc->dist)) return -2;
        dc->dfa = node->u.str.dfa;
    }
    uint32_t best = UINT32_MAX, best_rank = 0, best_cp = 0; /* fewest code points left, then plainest */
    for (uint32_t c = 0; c < d->n_classes; c++) {
        int32_t to = d->trans[(size_t)s * d->n_classes + c];
        uint32_t cp, rem, rank;
        if (to < 0 || !gram_str_live(g, node, (uint32_t)to, len + 1)) continue;
        if (t) rem = t->next[(size_t)to * (t->k + 1) + (min > len + 1 ? min - len - 1 : 0)];
        else rem = dc->dist[to];
        if ((rem < best || (rem == best && best_rank > 0)) && pick_cp(d->bounds[c], d->bounds[c + 1], &cp, &rank) &&
            (rem < best || rank < best_rank))
            best = rem, best_rank = rank, best_cp = cp;
    }
    if (best == UINT32_MAX) return -1;
    *n = spell_cp(best_cp, seq);
    return 0;
}

/* Bytes that bring the innermost open value closer to complete. */
static int choose(const grammar *g, const grammar_state *st, dist_cache *dc, uint8_t *seq, size_t *n) {
    const grammar_frame *f = &st->frames[st->depth - 1];
    const gram_node *node = f->node != GRAM_NONE ? &g->nodes[f->node] : NULL;
    int b = -1;
    *n = 1;
    switch (f->kind) {
    case GRAM_FR_STRING: return string_choice(g, st, dc, seq, n);
    case GRAM_FR_NUMBER:
    case GRAM_FR_LITERAL:
        if (gram_frame_can_end(g, st, f)) { /* done: the parent's byte will end it */
            grammar_state up;
            grammar_state_copy(&up, st);
            gram_pop(g, &up);
            return choose(g, &up, dc, seq, n);
        }
        if (f->kind == GRAM_FR_NUMBER) {
            b = first_accepted(g, st, "0123456789.-");
        } else { /* the next byte of an entry still allowed */
            for (uint32_t i = f->u.lit.lo; i < f->u.lit.hi && b < 0; i++) {
                const gram_lit *e = &g->lits[i];
                if (e->len > f->u.lit.off && accepts(g, st, g->lit_bytes[e->off + f->u.lit.off]))
                    b = g->lit_bytes[e->off + f->u.lit.off];
            }
        }
        break;
    case GRAM_FR_OBJECT: {
        uint64_t missing = gram_obj_needed(g, node, f->u.lit.seen) & ~f->u.lit.seen;
        switch (f->phase) {
        case OBJ_OPEN: b = '{'; break;
        /* "}" may be refused as a repeat in a unique array: then one more property */
        case OBJ_FIRST: b = missing || !accepts(g, st, '}') ? '"' : '}'; break;
        case OBJ_AFTER: b = missing || !accepts(g, st, '}') ? ',' : '}'; break;
        case OBJ_NEXT: b = '"'; break;
        case OBJ_COLON: b = ':'; break;
        case OBJ_KEY: /* finish a key, a required one if any is missing */
            for (int pass = 0; pass < 2 && b < 0; pass++)
                for (uint32_t i = f->u.lit.lo; i < f->u.lit.hi && b < 0; i++) {
                    const gram_lit *e = &g->lits[i];
                    uint64_t bit = 1ull << e->member;
                    if (!(f->u.lit.seen & bit) && (pass || (missing & bit)) && e->len > f->u.lit.off)
                        b = g->lit_bytes[e->off + f->u.lit.off];
                }
            break;
        default: b = first_accepted(g, st, VALUE_START); break;
        }
        break;
    }
    case GRAM_FR_OBJ_UNION:
        b = f->phase == OBJ_VALUE ? first_accepted(g, st, VALUE_START) : gram_union_complete_byte(g, st, accepts);
        break;
    case GRAM_FR_ARRAY:
        switch (f->phase) {
        case ARR_OPEN: b = '['; break;
        /* "]" may be refused as a repeat in a unique array: then one more item */
        case ARR_AFTER: b = f->u.arr.count >= node->u.arr.min && accepts(g, st, ']') ? ']' : ','; break;
        case ARR_FIRST:
            b = !node->u.arr.min && accepts(g, st, ']') ? ']' : first_accepted(g, st, VALUE_START);
            break;
        default: b = first_accepted(g, st, VALUE_START); break;
        }
        break;
    case GRAM_FR_CALL:
        switch (f->phase) {
        case CALL_PREFIX: b = (uint8_t)GRAMMAR_CALL_PREFIX[f->u.lit.off]; break;
        case CALL_MID: b = (uint8_t)GRAMMAR_CALL_MID[f->u.lit.off]; break;
        case CALL_NAME: b = g->lit_bytes[g->lits[f->u.lit.lo].off + f->u.lit.off]; break;
        case CALL_ARGS: b = '{'; break;
        default: b = '}'; break;
        }
        break;
    default: /* root */
        switch (f->phase) {
        case ROOT_START: b = '['; break;
        case ROOT_OPEN: b = g->opt.allow_empty ? ']' : '{'; break;
        case ROOT_NEXT: b = '{'; break;
        default: b = ']'; break;
        }
        break;
    }
    if (b < 0) return -1;
    seq[0] = (uint8_t)b;
    return 0;
}

int grammar_complete(const grammar *g, const grammar_state *st, char *out, size_t cap, size_t *n_out) {
    if (!g || !st || (!out && cap) || !n_out)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "grammar_complete: NULL argument");
    grammar_state s;
    grammar_state_copy(&s, st);
    dist_cache dc = {-1, NULL};
    size_t n = 0;
    int rc = NEEDLE_OK;
    while (!s.complete && rc == NEEDLE_OK) {
        uint8_t seq[UTIL_JSON_ESCAPE_MAX];
        size_t k = 0;
        int c = s.depth ? choose(g, &s, &dc, seq, &k) : -1;
        if (c == -2) rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "grammar_complete: out of memory");
        else if (c < 0) rc = needle_fail(NEEDLE_ERR_STATE, "grammar_complete: no continuation (grammar bug)");
        for (size_t i = 0; i < k && rc == NEEDLE_OK; i++) {
            if (n == cap) rc = needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "grammar_complete: completion exceeds %zu bytes", cap);
            else if (!grammar_accept_byte(g, &s, seq[i])) rc = needle_fail(NEEDLE_ERR_STATE, "grammar_complete: byte refused (grammar bug)");
            else out[n++] = (char)seq[i];
        }
    }
    free(dc.dist);
    *n_out = n;
    return rc;
}
