/* needle2.h: the C ABI of the official cactus-needle 2.x engine, which its ctypes client
 * calls (spec §8.2), exported by libneedle beside the API of needle.h and
 * implemented over it (src/compat/official_abi2.c): one process-global model and session
 * guarded by a lock, as the official engine is not re-entrant either. New code wants
 * needle.h's handles; this header is for programs written against the official engine.
 * The 3.x engine ABI reuses these names with other signatures: it is libneedle3
 * (needle3.h), a separate library; link one or the other. */
#ifndef NEEDLE2_H
#define NEEDLE2_H

#include "needle.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads a .cact image as needle_model_open_blob does: a 64-byte aligned image is used in
 * place and must stay valid (the Python client keeps it alive), a misaligned one is
 * copied. Replaces the default model. Returns 0 or a negative status. */
NEEDLE_API int needle_load(const char *blob, uint64_t size);
/* Binds system facts and tools to the default session (loading the model named by
 * NEEDLE_MODEL, or models/needle-demo.cact, if needle_load was never called).
 * tool_index_path (may be NULL) caches the tool embeddings of retrieval. < 0 on failure. */
NEEDLE_API int needle_init(const char *system, const char *tools_json, const char *tool_index_path);
/* One turn into `out` (NUL-terminated envelope). < 0 on failure; never truncated JSON. */
NEEDLE_API int needle_complete(const char *text, int max_new_tokens, char *out, int out_size);
/* Rewinds the default conversation to the cached tools prefix. */
NEEDLE_API void needle_reset(void);

#ifdef __cplusplus
}
#endif

#endif /* NEEDLE2_H */
