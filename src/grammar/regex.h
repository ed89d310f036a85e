/* regex.h: JSON Schema "pattern" and "format" compiled to a DFA over code points.
 *
 * Supported pattern subset (ECMA-262 syntax, always a FULL match: the string must match
 * the whole pattern, as if wrapped in ^(?:...)$; this is stricter than the search
 * semantics of JSON Schema, so every string the grammar admits also satisfies the
 * search):
 *   literals (any code point, UTF-8 in the pattern); escaped metacharacters \. \\ \/ \-
 *   \( \) \[ \] \{ \} \| \? \* \+ \^ \$; \t \n \r \f \v \0 \xHH \uHHHH;
 *   classes \d \D \w \W \s \S (ECMA definitions) and "." (anything but line terminators);
 *   bracket classes [a-z0-9_] and negated [^...], with escapes and \d \w \s inside;
 *   groups ( ) and (?: ); alternation |; quantifiers ? * + {m} {m,} {m,n} (m, n <= 1000),
 *   lazy forms (*? etc.) accepted with the same meaning;
 *   ^ at the start and $ at the end of a top-level alternative (no-ops: full match).
 * Refused with a message: backreferences, lookaround, named groups, \b \B, flags, anchors
 * elsewhere, and patterns whose DFA exceeds GRAM_REGEX_MAX_STATES.
 *
 * Formats are built-in patterns over the same engine: date, time, date-time, email, uri,
 * uuid, ipv4 (see regex.c for the exact definitions).
 *
 * Invariants of a compiled DFA: state 0 is the start; every state can still reach an
 * accepting state (transitions into dead states are -1); classes partition
 * [0, 0x110000) into intervals. */
#ifndef NEEDLE_GRAMMAR_REGEX_H
#define NEEDLE_GRAMMAR_REGEX_H

#include <stddef.h>
#include <stdint.h>

#define GRAM_REGEX_MAX_STATES 4096

typedef struct gram_dfa {
    uint32_t n_states;
    uint32_t n_classes;
    uint32_t *bounds; /* n_classes + 1 entries: class c is [bounds[c], bounds[c + 1]) */
    int32_t *trans;   /* [state * n_classes + class]: next state, -1 = no match possible */
    uint8_t *accept;  /* [state] */
    uint8_t ascii_class[128];
} gram_dfa;

/* Status of the functions below: 0 ok; -1 unsupported or impossible (message in err);
 * -2 out of memory. */

/* Compiles `len` bytes of pattern (UTF-8). *out is zeroed on failure. */
int gram_regex_compile(const char *pattern, size_t len, gram_dfa *out, char *err, size_t err_len);

/* Compiles a built-in format. Returns 1 (and leaves *out zeroed) for an unknown format. */
int gram_regex_compile_format(const char *format, gram_dfa *out, char *err, size_t err_len);

/* Class of code point cp (< 0x110000). */
static inline uint32_t gram_regex_class(const gram_dfa *d, uint32_t cp) {
    if (cp < 128) return d->ascii_class[cp];
    uint32_t lo = 0, hi = d->n_classes; /* last class whose start is <= cp */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (d->bounds[mid] <= cp) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* For strings that also carry minLength/maxLength: *next receives a malloc'd table of
 * n_states * (*k + 1) entries, next[s * (k + 1) + j] = the least length >= j of a
 * completion from state s that ends in an accepting state (UINT32_MAX if none). Lengths
 * above k are not needed: k = max_len if bounded, else min_len + n_states (a longer
 * completion can be pumped down into that window). */
int gram_regex_length_table(const gram_dfa *d, uint32_t min_len, uint32_t max_len, uint32_t **next,
                       uint32_t *k, char *err, size_t err_len);

void gram_regex_free(gram_dfa *d);

#endif
