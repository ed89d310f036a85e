/* libFuzzer target for the pattern compiler (src/grammar/regex.c).
 *
 * Input: two bytes of parameters, then the pattern (UTF-8, need not be valid). Any pattern
 * must compile to a DFA or be refused with a message. A compiled DFA is checked against
 * the invariants regex.h states (state 0 exists, transitions in range, every state can
 * reach an accepting one, classes partition the code points), and the length table for a
 * minLength/maxLength taken from the parameter bytes is built and checked for
 * consistency with the DFA's accepting states. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/regex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what) {
    fprintf(stderr, "invariant violated: %s\n", what);
    abort();
}

static void check_dfa(const gram_dfa *d) {
    if (d->n_states == 0 || d->n_states > GRAM_REGEX_MAX_STATES) fail("state count");
    if (d->n_classes == 0 || d->bounds[0] != 0 || d->bounds[d->n_classes] != 0x110000) fail("class bounds");
    for (uint32_t c = 0; c < d->n_classes; c++)
        if (d->bounds[c] >= d->bounds[c + 1]) fail("classes not increasing");
    for (uint32_t cp = 0; cp < 128; cp++)
        if (d->ascii_class[cp] != gram_regex_class(d, cp)) fail("ascii class table");
    /* every state reaches an accepting state: a search back from the accepting ones over
     * the transitions reversed (predecessor lists threaded through pred_next), linear in
     * the transitions (a sweep to a fixpoint was quadratic on long chains of states and
     * took a third of the target's time) */
    const size_t n_edges = (size_t)d->n_states * d->n_classes;
    uint8_t *live = calloc(d->n_states, 1);
    int64_t *pred_head = malloc(d->n_states * sizeof *pred_head), *pred_next = malloc(n_edges * sizeof *pred_next);
    uint32_t *stack = malloc(d->n_states * sizeof *stack);
    if (!live || !pred_head || !pred_next || !stack) {
        free(live), free(pred_head), free(pred_next), free(stack);
        return;
    }
    for (uint32_t s = 0; s < d->n_states; s++) pred_head[s] = -1;
    for (size_t e = 0; e < n_edges; e++) { /* edge e = s * n_classes + c, from s */
        const int32_t t = d->trans[e];
        if (t < -1 || t >= (int32_t)d->n_states) fail("transition out of range");
        if (t >= 0) pred_next[e] = pred_head[t], pred_head[t] = (int64_t)e;
    }
    size_t sp = 0;
    for (uint32_t s = 0; s < d->n_states; s++)
        if (d->accept[s]) live[s] = 1, stack[sp++] = s;
    while (sp) {
        const uint32_t t = stack[--sp];
        for (int64_t e = pred_head[t]; e >= 0; e = pred_next[e]) {
            const uint32_t s = (uint32_t)((size_t)e / d->n_classes);
            if (!live[s]) live[s] = 1, stack[sp++] = s;
        }
    }
    free(pred_head), free(pred_next), free(stack);
    for (uint32_t s = 0; s < d->n_states; s++)
        if (!live[s]) fail("dead state");
    free(live);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint32_t min_len = data[0] & 15;
    uint32_t max_len = (data[1] & 15) == 15 ? UINT32_MAX : min_len + (data[1] & 15);
    gram_dfa d;
    char err[256];
    err[0] = 0;
    int rc = gram_regex_compile((const char *)data + 2, size - 2, &d, err, sizeof err);
    if (rc != 0) {
        if (rc == -1 && !err[0]) fail("refusal without a message");
        return 0;
    }
    check_dfa(&d);
    uint32_t *next = NULL, k = 0;
    if (gram_regex_length_table(&d, min_len, max_len, &next, &k, err, sizeof err) == 0) {
        /* next[s][j] is the least completion length >= j: at least j, never decreasing in
         * j, and from an accepting state the empty completion gives next[s][0] = 0 */
        for (uint32_t s = 0; s < d.n_states; s++) {
            const uint32_t *row = next + (size_t)s * (k + 1);
            if (d.accept[s] && row[0] != 0) fail("accepting state without the empty completion");
            for (uint32_t j = 0; j <= k; j++) {
                if (row[j] != UINT32_MAX && row[j] < j) fail("completion shorter than asked");
                if (j && row[j] < row[j - 1]) fail("length table decreasing");
            }
        }
        free(next);
    }
    gram_regex_free(&d);
    return 0;
}
