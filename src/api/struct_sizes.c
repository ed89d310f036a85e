/* needle_struct_size: the library's own sizeof of each public struct, for bindings that
 * copy the layouts of needle.h (the Python package checks its ctypes copies with it). */
#include <string.h>

#include "needle.h"

#define ENTRY(type) {#type, sizeof(type)}

static const struct {
    const char *name;
    size_t size;
} public_structs[] = {
    ENTRY(needle_model_params),    ENTRY(needle_model_info),      ENTRY(needle_tensor_info),
    ENTRY(needle_device_info),     ENTRY(needle_session_params),  ENTRY(needle_generate_params),
    ENTRY(needle_complete_params), ENTRY(needle_session_stats),
    ENTRY(needle_tools_params), ENTRY(needle_callbacks),
};

size_t needle_struct_size(const char *name) {
    if (!name) return 0;
    for (size_t i = 0; i < sizeof public_structs / sizeof public_structs[0]; i++)
        if (strcmp(public_structs[i].name, name) == 0) return public_structs[i].size;
    return 0;
}
