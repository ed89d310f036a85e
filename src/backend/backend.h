/* Backends (STYLE.md item 4): one struct of function pointers per compute backend, a
 * static table of the backends compiled into this library, and the selection rule.
 *
 * Selection, first match wins:
 *   1. an explicit name (needle_model_params.backend), NULL or "" meaning auto;
 *   2. env NEEDLE_BACKEND = cpu | cuda | metal;
 *   3. env JAX_PLATFORM_NAME = cpu | gpu | cuda | metal (gpu means cuda);
 *   4. the first compiled-in backend whose probe finds a device; CPU is last.
 * A forced backend that is unknown, not compiled in, or without a device is an error
 * (NEEDLE_ERR_BACKEND, message naming the available ones), never a silent fallback.
 *
 * Only the CPU backend exists in this tree; "cuda" and "metal" table entries are compiled
 * only with NEEDLE_CUDA / NEEDLE_METAL. Kernels are still expressed as cpu_kernels: the
 * hook is where a device backend will hand over its own table. */
#ifndef NEEDLE_BACKEND_BACKEND_H
#define NEEDLE_BACKEND_BACKEND_H

#include "kernels/cpu/cpu.h"
#include "needle.h"

typedef struct needle_backend_impl {
    const char *name;                /* "cpu", "cuda", "metal" */
    int (*probe)(void);              /* 1 if usable here (a device was found), else 0 */
    int (*device_count)(void);       /* devices of this backend (0 if none) */
    /* fills out (backend, name, memory, units, capability; is_default is left 0) */
    int (*device_info)(int index, needle_device_info *out);
    const cpu_kernels *(*kernels)(void); /* kernel table sessions use */
} needle_backend_impl;

/* The compiled-in backends in probe order (CPU last); `*n` receives the count. */
const needle_backend_impl *const *backend_table(size_t *n);

/* The compiled-in backend called `name` (case-insensitive), or NULL. */
const needle_backend_impl *backend_find(const char *name);

/* Applies the selection rule above. On success stores the backend in *out and returns
 * NEEDLE_OK; otherwise returns NEEDLE_ERR_BACKEND with a message (needle_last_error). */
int backend_select(const char *explicit_name, const needle_backend_impl **out);

#endif
