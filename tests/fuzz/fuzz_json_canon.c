/* libFuzzer target for the JSON re-serializer (src/grammar/json_canon.c).
 *
 * Any input must be re-serialized or refused with NEEDLE_ERR_JSON. What it writes must be
 * a fixed point (re-serializing it gives the same bytes) and parse as JSON. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar/json_canon.h"
#include "needle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *out = NULL, *again = NULL;
    size_t n = 0, n_again = 0;
    int rc = grammar_json_canon((const char *)data, size, &out, &n);
    if (rc != NEEDLE_OK) {
        if (rc != NEEDLE_ERR_JSON && rc != NEEDLE_ERR_OUT_OF_MEMORY) abort();
        return 0;
    }
    if (strlen(out) != n) abort(); /* no NUL inside: control characters are escaped */
    if (grammar_json_canon(out, n, &again, &n_again) != NEEDLE_OK || n_again != n || memcmp(out, again, n)) {
        fprintf(stderr, "not a fixed point:\n%s\n%s\n", out, again ? again : "(refused)");
        abort();
    }
    cJSON *v = cJSON_ParseWithLength(out, n);
    if (!v) {
        fprintf(stderr, "output is not JSON: %s\n", out);
        abort();
    }
    cJSON_Delete(v);
    free(out);
    free(again);
    return 0;
}
