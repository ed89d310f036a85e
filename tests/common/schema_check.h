/* schema_check.h: a small JSON Schema validator for the tests, written from the standard
 * (draft 2020-12 validation keywords, draft 4's boolean exclusiveMinimum/Maximum, OpenAPI's
 * "nullable") and independently of the schema compiler (src/grammar/): it shares no code
 * with it, matches "pattern" with the C library's POSIX regex engine (search semantics, as
 * the standard says) and checks formats by hand. The differential schema fuzzer
 * (schema_diff.c) runs every call the recognizer completes through it.
 *
 * Keywords: type, nullable, enum, const, minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum, multipleOf, minLength, maxLength, pattern, format (date, time,
 * date-time, email, uuid, ipv4; others are annotations), items, minItems, maxItems,
 * uniqueItems, properties, required, additionalProperties, dependentRequired,
 * minProperties, maxProperties, allOf, anyOf, oneOf, not, local $ref. Anything else is
 * ignored (the fuzzer only generates these). */
#ifndef NEEDLE_TESTS_SCHEMA_CHECK_H
#define NEEDLE_TESTS_SCHEMA_CHECK_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* 1 if `value` is valid against `schema` ($refs resolve from `root`), else 0 with a
 * reason ("$.v: 50 > maximum 10") in why. */
int schema_check(const cJSON *root, const cJSON *schema, const cJSON *value, char *why, size_t why_len);

#endif
