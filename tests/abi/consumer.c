/* A program outside the needle tree, built against an installed libneedle (by
 * tests/abi/install_test.sh): the header and the library it links agree on the version
 * and the struct layouts, and the library runs. */
#include <stdio.h>
#include <string.h>

#include <needle.h>

int main(void) {
    char header[32];
    snprintf(header, sizeof header, "%d.%d.%d", NEEDLE_VERSION_MAJOR, NEEDLE_VERSION_MINOR,
             NEEDLE_VERSION_PATCH);
    if (strcmp(header, needle_version()) != 0) {
        fprintf(stderr, "header %s, library %s\n", header, needle_version());
        return 1;
    }
    if (needle_struct_size("needle_device_info") != sizeof(needle_device_info)) {
        fprintf(stderr, "needle_device_info layout differs\n");
        return 1;
    }
    needle_device_info d = {.size = sizeof d};
    if (needle_device_count() < 1 || needle_device_get(0, &d) != NEEDLE_OK) {
        fprintf(stderr, "no device: %s\n", needle_last_error());
        return 1;
    }
    printf("needle %s on %s\n", needle_version(), d.backend);
    return 0;
}
