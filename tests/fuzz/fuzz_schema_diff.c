/* libFuzzer target: the differential schema fuzzer (tests/common/schema_diff.c) steered by the
 * input. The input's bytes are the random choices (then a stream seeded from them): which
 * keywords a schema gets, the values of its enums, which byte or piece each walk step
 * takes and where the walk stops. A refusal must name the tool and the path; an accepted
 * schema must never trap a walk, and every completed call must satisfy its schema by the
 * independent validator of tests/common/schema_check.c. A finding aborts with its tools JSON and
 * text on stderr. */
#include <locale.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "schema_diff.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    static char msg[16384];
    if (!init) {
        setlocale(LC_ALL, "C.UTF-8"); /* the validator's POSIX regex over UTF-8 code points */
        init = 1;
    }
    diff_rng r;
    diff_rng_init(&r, data, size, 0);
    diff_stats st = {0};
    if (diff_round(&r, 3, &st, msg, sizeof msg)) {
        fprintf(stderr, "invariant: %s\n", msg);
        abort();
    }
    return 0;
}
