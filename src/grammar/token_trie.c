/* token_trie.c: the vocabulary as a byte trie, and grammar_mask over it.
 *
 * The trie is stored flat in preorder: node i has the byte on the edge into it, its depth
 * (1 for children of the root) and skip[i], the index just past its subtree. A depth-first
 * walk is then a single loop over i: the state for node i is its parent's state (kept in
 * stack[depth - 1], because every node between the parent and i lies deeper) stepped by
 * byte[i]; if the byte is rejected the walk jumps to skip[i], pruning every token that
 * shares the prefix. Each distinct prefix of the vocabulary is stepped at most once.
 *
 * Inside string values nearly every token is allowed, so stepping the whole trie would be
 * the common, slowest case. "Plain" tokens (complete UTF-8 code points, none of them a
 * quote, backslash or control character) keep a plain string going and are allowed there
 * exactly when they fit its maxLength; they are marked from a list sorted by length, and
 * subtrees holding only plain tokens are skipped, leaving the walk to the few tokens that
 * close the string, escape, or end inside a UTF-8 sequence. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/recognizer.h"
#include "needle.h"
#include "util/error.h"
#include "util/utf8.h"

struct grammar_trie {
    uint32_t n_tokens, n_nodes, max_depth;
    uint8_t *byte;       /* [node] */
    uint16_t *depth;     /* [node] */
    uint32_t *skip;      /* [node] */
    uint32_t *tok_first; /* [node + 1]: tokens ending at node are toks[tok_first[i], tok_first[i + 1]) */
    uint32_t *toks;
    /* plain tokens (see the top comment) */
    uint32_t n_plain;
    uint32_t *plain_ids, *plain_cps; /* sorted by code points */
    uint8_t *plain_mask;             /* [token]: 1 if plain */
    uint8_t *all_plain;              /* [node]: every token in the subtree is plain */
    uint32_t *max_cps;               /* [node]: most code points of a token in the subtree */
    /* the vocabulary itself, for the fallback check when no scratch memory is available */
    uint8_t *bytes;
    size_t *offs;        /* [token + 1] */
};

typedef struct sort_ctx { const char *const *b; const size_t *n; } sort_ctx;

static int tok_less(const sort_ctx *c, uint32_t x, uint32_t y) {
    size_t n = c->n[x] < c->n[y] ? c->n[x] : c->n[y];
    int r = memcmp(c->b[x], c->b[y], n);
    if (r) return r < 0;
    if (c->n[x] != c->n[y]) return c->n[x] < c->n[y];
    return x < y;
}

static void sort_ids(const sort_ctx *c, uint32_t *v, uint32_t *tmp, uint32_t n) {
    for (uint32_t w = 1; w < n; w *= 2) { /* bottom-up merge sort */
        for (uint32_t lo = 0; lo < n; lo += 2 * w) {
            uint32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            uint32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = tok_less(c, v[j], v[i]) ? v[j++] : v[i++];
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof *v);
    }
}

void grammar_trie_free(grammar_trie *t) {
    if (!t) return;
    free(t->byte);
    free(t->depth);
    free(t->skip);
    free(t->tok_first);
    free(t->toks);
    free(t->bytes);
    free(t->offs);
    free(t->plain_ids);
    free(t->plain_cps);
    free(t->plain_mask);
    free(t->all_plain);
    free(t->max_cps);
    free(t);
}

/* Code points of a plain token, or -1 if it is not plain. */
static long plain_cps(const uint8_t *s, size_t n) {
    long cps = 0;
    for (size_t i = 0; i < n; cps++) {
        uint32_t v;
        int k = util_utf8_next(s + i, n - i, &v, NULL);
        if (k <= 0 || v < 0x20 || v == '"' || v == '\\') return -1;
        i += (size_t)k;
    }
    return cps;
}

/* Fills the plain-token tables; parent[i] is node i's parent (UINT32_MAX for the root's
 * children). */
static int build_plain(grammar_trie *t, const uint32_t *parent) {
    uint32_t n = t->n_nodes;
    long *cps = malloc((t->n_tokens + 1) * sizeof *cps);
    t->plain_ids = malloc((t->n_tokens + 1) * sizeof *t->plain_ids);
    t->plain_cps = malloc((t->n_tokens + 1) * sizeof *t->plain_cps);
    t->plain_mask = calloc(t->n_tokens + 1, 1);
    t->all_plain = malloc(n + 1);
    t->max_cps = calloc(n + 1, sizeof *t->max_cps);
    if (!cps || !t->plain_ids || !t->plain_cps || !t->plain_mask || !t->all_plain || !t->max_cps) {
        free(cps);
        return -1;
    }
    uint32_t np = 0, maxc = 0;
    for (uint32_t i = 0; i < t->n_tokens; i++) {
        size_t a = t->offs[i], z = t->offs[i + 1];
        cps[i] = a == z ? -1 : plain_cps(t->bytes + a, z - a);
        if (cps[i] >= 0) np++, t->plain_mask[i] = 1;
        if (cps[i] > (long)maxc) maxc = (uint32_t)cps[i];
    }
    uint32_t *start = calloc(maxc + 2, sizeof *start); /* counting sort by code points */
    if (!start) {
        free(cps);
        return -1;
    }
    for (uint32_t i = 0; i < t->n_tokens; i++)
        if (cps[i] >= 0) start[cps[i] + 1]++;
    for (uint32_t c = 0; c <= maxc; c++) start[c + 1] += start[c];
    for (uint32_t i = 0; i < t->n_tokens; i++) {
        if (cps[i] < 0) continue;
        uint32_t j = start[cps[i]]++;
        t->plain_ids[j] = i;
        t->plain_cps[j] = (uint32_t)cps[i];
    }
    free(start);
    t->n_plain = np;
    for (uint32_t i = 0; i < n; i++) {
        t->all_plain[i] = 1;
        for (uint32_t k = t->tok_first[i]; k < t->tok_first[i + 1]; k++) {
            long c = cps[t->toks[k]];
            if (c < 0) t->all_plain[i] = 0;
            else if ((uint32_t)c > t->max_cps[i]) t->max_cps[i] = (uint32_t)c;
        }
    }
    for (uint32_t i = n; i-- > 0;) { /* children come after their parent in preorder */
        uint32_t p = parent[i];
        if (p == UINT32_MAX) continue;
        t->all_plain[p] &= t->all_plain[i];
        if (t->max_cps[i] > t->max_cps[p]) t->max_cps[p] = t->max_cps[i];
    }
    free(cps);
    return 0;
}

uint32_t grammar_trie_size(const grammar_trie *t) { return t ? t->n_tokens : 0; }

int grammar_trie_build(const char *const *token_bytes, const size_t *lens, uint32_t n_tokens,
                     grammar_trie **out) {
    if (!token_bytes || !lens || !out)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "grammar_trie_build: NULL argument");
    size_t total = 0;
    for (uint32_t i = 0; i < n_tokens; i++) {
        if (lens[i] && !token_bytes[i])
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "grammar_trie_build: token %u has no bytes", i);
        if (lens[i] > UINT16_MAX)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "grammar_trie_build: token %u is too long", i);
        total += lens[i];
    }
    grammar_trie *t = calloc(1, sizeof *t);
    uint32_t *ids = malloc((n_tokens + 1) * sizeof *ids), *tmp = malloc((n_tokens + 1) * sizeof *tmp);
    uint32_t *path = NULL, *parent = NULL;
    if (!t || !ids || !tmp) goto oom;
    t->n_tokens = n_tokens;
    t->byte = malloc(total + 1);
    t->depth = malloc((total + 1) * sizeof *t->depth);
    t->skip = malloc((total + 1) * sizeof *t->skip);
    t->tok_first = calloc(total + 2, sizeof *t->tok_first);
    t->toks = malloc((n_tokens + 1) * sizeof *t->toks);
    t->bytes = malloc(total + 1);
    t->offs = malloc((n_tokens + 1) * sizeof *t->offs);
    if (!t->byte || !t->depth || !t->skip || !t->tok_first || !t->toks || !t->bytes || !t->offs) goto oom;
    size_t off = 0;
    for (uint32_t i = 0; i < n_tokens; i++) {
        t->offs[i] = off;
        if (lens[i]) memcpy(t->bytes + off, token_bytes[i], lens[i]);
        off += lens[i];
    }
    t->offs[n_tokens] = off;
    uint32_t n = 0, maxlen = 0;
    for (uint32_t i = 0; i < n_tokens; i++)
        if (lens[i]) {
            ids[n++] = i;
            if (lens[i] > maxlen) maxlen = (uint32_t)lens[i];
        }
    sort_ctx c = {token_bytes, lens};
    sort_ids(&c, ids, tmp, n);
    path = malloc((maxlen + 1) * sizeof *path); /* path[d] = node at depth d on the current path */
    parent = malloc((total + 1) * sizeof *parent);
    if (!path || !parent) goto oom;
    uint32_t depth = 0, nodes = 0, nt = 0, prev = UINT32_MAX;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t id = ids[k], len = (uint32_t)lens[id], common = 0;
        if (prev != UINT32_MAX) {
            uint32_t pl = (uint32_t)lens[prev];
            while (common < len && common < pl && token_bytes[id][common] == token_bytes[prev][common]) common++;
        }
        while (depth > common) t->skip[path[depth--]] = nodes; /* close finished subtrees */
        /* the parent travels in a local: GCC 12 -O3 (loop distribution) was seen to read
         * path[depth] before the previous iteration had stored it */
        uint32_t up = depth ? path[depth] : UINT32_MAX;
        for (; depth < len; depth++) {
            t->byte[nodes] = (uint8_t)token_bytes[id][depth];
            t->depth[nodes] = (uint16_t)(depth + 1);
            t->tok_first[nodes] = nt;
            parent[nodes] = up;
            path[depth + 1] = up = nodes++;
        }
        t->toks[nt++] = id; /* ends at path[len]; its tokens are consecutive in sorted order */
        prev = id;
    }
    while (depth > 0) t->skip[path[depth--]] = nodes;
    /* tok_first[i] was set when node i was created; its tokens run up to the next node's */
    t->tok_first[nodes] = nt;
    t->n_nodes = nodes;
    t->max_depth = maxlen;
    if (build_plain(t, parent)) goto oom;
    free(ids);
    free(tmp);
    free(path);
    free(parent);
    *out = t;
    return NEEDLE_OK;
oom:
    free(ids);
    free(tmp);
    free(path);
    free(parent);
    grammar_trie_free(t);
    return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "grammar_trie_build: out of memory");
}

/* Slow path: every token from scratch (used only if the walk cannot get memory). */
static uint32_t mask_each(const grammar *g, const grammar_state *st, const grammar_trie *t, uint8_t *allowed) {
    uint32_t count = 0;
    grammar_state tmp;
    for (uint32_t i = 0; i < t->n_tokens; i++) {
        size_t a = t->offs[i], z = t->offs[i + 1];
        if (a == z) continue;
        grammar_state_copy(&tmp, st);
        size_t k = a;
        while (k < z && gram_step(g, &tmp, t->bytes[k])) k++;
        if (k == z) allowed[i] = 1, count++;
    }
    return count;
}

uint32_t grammar_mask(const grammar *g, const grammar_state *st, const grammar_trie *t, uint8_t *allowed) {
    if (!g || !st || !t || !allowed) return 0;
    uint32_t count = 0, budget = 0;
    int plain = !st->complete && gram_plain_string_budget(g, st, &budget);
    if (plain && t->n_plain && t->plain_cps[t->n_plain - 1] <= budget) { /* every plain token fits */
        memcpy(allowed, t->plain_mask, t->n_tokens);
        count = t->n_plain;
    } else {
        memset(allowed, 0, t->n_tokens);
        for (uint32_t k = 0; plain && k < t->n_plain && t->plain_cps[k] <= budget; k++)
            allowed[t->plain_ids[k]] = 1, count++;
    }
    if (st->complete || !t->n_nodes) return count;
    grammar_state *stack = malloc((t->max_depth + 1) * sizeof *stack);
    if (!stack) {
        memset(allowed, 0, t->n_tokens);
        return mask_each(g, st, t, allowed);
    }
    grammar_state_copy(&stack[0], st);
    for (uint32_t i = 0; i < t->n_nodes;) {
        if (plain && t->all_plain[i] && t->max_cps[i] <= budget) { /* already marked */
            i = t->skip[i];
            continue;
        }
        grammar_state *cur = &stack[t->depth[i]];
        grammar_state_copy(cur, cur - 1);
        if (!gram_step(g, cur, t->byte[i])) {
            i = t->skip[i];
            continue;
        }
        for (uint32_t k = t->tok_first[i]; k < t->tok_first[i + 1]; k++) {
            uint32_t id = t->toks[k];
            count += !allowed[id];
            allowed[id] = 1;
        }
        i++;
    }
    free(stack);
    return count;
}
