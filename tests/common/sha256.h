/* SHA-256 of a buffer as 64 lowercase hex digits (the export tests' digests). */
#ifndef NEEDLE_TESTS_SHA256_H
#define NEEDLE_TESTS_SHA256_H

#include <stddef.h>
#include <stdint.h>

void sha256_hex(const uint8_t *data, size_t len, char hex[65]);

#endif
