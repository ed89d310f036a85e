/* schema_diff.h: the differential schema fuzzer, shared by the ctest driver
 * (test_grammar_diff.c) and the libFuzzer target (fuzz/fuzz_schema_diff.c).
 *
 * One round: a random tools JSON (schemas built from every keyword the compiler knows,
 * contradictory combinations included: enum/const beside type, bounds, lengths,
 * patterns, formats, multipleOf, not, allOf, anyOf, oneOf, dependentRequired, type lists),
 * compiled; a refusal must be a NEEDLE_ERR_SCHEMA naming the tool and a path. An accepted
 * grammar is walked several times byte by byte from the start, each step picking among
 * the bytes it accepts at random or adversarially (the same byte again, a closing byte,
 * a digit, a multi-byte piece, UTF-8), a dead end (no byte accepted, array incomplete) is
 * a finding; at a random point grammar_complete writes the rest. The finished call array
 * must parse as JSON and every call's arguments must satisfy its tool's parameters
 * according to schema_check.c, a validator that shares no code with the compiler. */
#ifndef NEEDLE_TESTS_SCHEMA_DIFF_H
#define NEEDLE_TESTS_SCHEMA_DIFF_H

#include <stddef.h>
#include <stdint.h>

/* Random choices: bytes of `data` first (what libFuzzer mutates), then a xorshift stream
 * seeded from them and `seed`. */
typedef struct diff_rng {
    const uint8_t *data;
    size_t len, pos;
    uint64_t s;
} diff_rng;

void diff_rng_init(diff_rng *r, const uint8_t *data, size_t len, uint64_t seed);
uint32_t diff_rand(diff_rng *r, uint32_t n); /* uniform in [0, n), n >= 1 */

typedef struct diff_stats {
    unsigned long rounds, refused, walks, calls, bytes;
    /* accepted tools whose text holds "not" / "dependentRequired" (beside enum/const or not) */
    unsigned long accepted_not, accepted_dependent;
} diff_stats;

/* One round (see above) with `walks` walks. Returns 0, or -1 with the finding, the tools
 * JSON and the text in msg. */
int diff_round(diff_rng *r, int walks, diff_stats *st, char *msg, size_t cap);

#endif
