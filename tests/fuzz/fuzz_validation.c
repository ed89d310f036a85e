/* libFuzzer target for the envelope's validation (src/agent/validation.c).
 *
 * Input: tools JSON, NUL, call array JSON, NUL, the turn's text, NUL, the system facts
 * (missing parts are empty). validation_write must give, as a query and as a tool result,
 * a JSON object {"ungrounded": [strings...], "negation": bool} whose negation is false for
 * a tool result and equal to validation_negated(text) for a query. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "agent/validation.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const char *tools, const char *calls, const char *text, const char *system,
                  int is_query) {
    strbuf b = {0};
    validation_write(tools, system, text, is_query, calls, &b);
    if (b.oom) {
        free(b.data);
        return;
    }
    cJSON *v = b.data ? cJSON_Parse(b.data) : NULL;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(v, "ungrounded");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(v, "negation");
    int ok = cJSON_IsArray(u) && cJSON_IsBool(n) && cJSON_GetArraySize(v) == 2;
    const cJSON *p;
    cJSON_ArrayForEach(p, u) ok = ok && cJSON_IsString(p);
    if (ok && cJSON_IsTrue(n) != (is_query && validation_negated(text))) ok = 0;
    if (!ok) {
        fprintf(stderr, "bad validation object: %s\n", b.data ? b.data : "(null)");
        abort();
    }
    cJSON_Delete(v);
    free(b.data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 4);
    if (!buf) return 0;
    memcpy(buf, data, size);
    memset(buf + size, 0, 4);
    /* four NUL-separated parts; the buffer's trailing NULs make every part a string */
    const char *part[4];
    const char *p = buf;
    for (int i = 0; i < 4; i++) {
        part[i] = p;
        if (p < buf + size) p += strlen(p) + 1;
    }
    check(part[0], part[1], part[2], part[3], 1);
    check(part[0], part[1], part[2], part[3], 0);
    free(buf);
    return 0;
}
