#include "util/struct_size.h"

#include <stdint.h>
#include <string.h>

#include "util/error.h"

static int check_size(uint32_t size, size_t full, const char *what) {
    if (size < sizeof(uint32_t) || size > full)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                           "%s: struct size %u outside %zu..%zu (set size = sizeof, or "
                           "start from the *_default_params() values)", what, size,
                           sizeof(uint32_t), full);
    return NEEDLE_OK;
}

int struct_size_in(void *dst, const void *src, size_t full, const char *what) {
    uint32_t size = (uint32_t)full;
    if (src) {
        memcpy(&size, src, sizeof size);
        int rc = check_size(size, full, what);
        if (rc) return rc;
        memcpy(dst, src, size);
    }
    size = (uint32_t)full;
    memcpy(dst, &size, sizeof size);
    return NEEDLE_OK;
}

int struct_size_out(void *out, const void *full, size_t full_size, const char *what) {
    uint32_t size;
    memcpy(&size, out, sizeof size);
    int rc = check_size(size, full_size, what);
    if (rc) return rc;
    memcpy((char *)out + sizeof size, (const char *)full + sizeof size, size - sizeof size);
    return NEEDLE_OK;
}
