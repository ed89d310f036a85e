/* The export tests' digests, by the hub client's SHA-256 (src/hub/hub_sha256.c, the one
 * that checks downloads), so the tree has one implementation of it. */
#include "sha256.h"

#include "hub/hub_sha256.h"

void sha256_hex(const uint8_t *data, size_t len, char hex[65]) {
    hub_sha256 s;
    hub_sha256_init(&s);
    hub_sha256_update(&s, data, len);
    hub_sha256_hex(&s, hex);
}
