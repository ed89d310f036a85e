/* hub_sha256.h: SHA-256 (FIPS 180-4) of a file, to check a download against the LFS
 * ETag the hub links to it. */
#ifndef NEEDLE_HUB_SHA256_H
#define NEEDLE_HUB_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct hub_sha256 {
    uint32_t h[8];
    uint64_t total;
    uint8_t block[64];
    size_t fill;
} hub_sha256;

void hub_sha256_init(hub_sha256 *s);
void hub_sha256_update(hub_sha256 *s, const void *data, size_t n);
void hub_sha256_hex(hub_sha256 *s, char hex[65]);
/* The digest of a whole file; 0, or -1 with errno set. */
int hub_sha256_file(const char *path, char hex[65]);

#endif
