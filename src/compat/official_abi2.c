/* The official engine's C ABI (spec §8.2), as the cactus-needle ctypes client calls it:
 * needle_load / needle_init / needle_complete / needle_reset over one process-global model
 * and session, serialized by a mutex (the official engine is not re-entrant either).
 *
 * needle_load keeps a pointer to the caller's bytes when they are 64-byte aligned (the
 * Python client keeps them alive for the life of the process) and copies them otherwise
 * (needle_model_open_blob). Without needle_load, needle_init loads
 * needle_default_model_path(), else ./models/needle-demo.cact: our stand-in for the
 * official engine's built-in weights. */
#include <pthread.h>

#include "needle2.h"
#include "util/error.h"

static pthread_mutex_t abi_lock = PTHREAD_MUTEX_INITIALIZER;
static needle_model *abi_model;
static needle_session *abi_session;

static void drop_session(void) {
    needle_session_free(abi_session);
    abi_session = NULL;
}

int needle_load(const char *blob, uint64_t size) {
    if (!blob || size == 0) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "needle_load: empty image");
    needle_model *m;
    int rc = needle_model_open_blob(blob, (size_t)size, NULL, &m);
    if (rc) return rc;
    pthread_mutex_lock(&abi_lock);
    drop_session();
    needle_model_free(abi_model);
    abi_model = m;
    pthread_mutex_unlock(&abi_lock);
    return NEEDLE_OK;
}

static int default_model(void) {
    if (abi_model) return NEEDLE_OK;
    const char *path = needle_default_model_path();
    return needle_model_open(path ? path : "models/needle-demo.cact", NULL, &abi_model);
}

int needle_init(const char *system, const char *tools_json, const char *tool_index_path) {
    pthread_mutex_lock(&abi_lock);
    int rc = default_model();
    if (rc == NEEDLE_OK) {
        drop_session();
        /* A sliding window keeps the KV cache bounded however long the conversation, so
         * the official client's endless conversation gets a practically unbounded
         * position budget; without a window the header's max_seq_len applies. */
        needle_model_info info = {.size = sizeof info};
        needle_model_get_info(abi_model, &info);
        needle_session_params sp = needle_session_default_params();
        sp.n_ctx = info.kv_window ? (1u << 20) : 0;
        rc = needle_session_create(abi_model, &sp, &abi_session);
    }
    /* retrieval with the defaults (more than 5 tools, top 5); the index file caches the
     * tool embeddings across processes */
    needle_tools_params tp = needle_tools_default_params();
    tp.tool_index_path = tool_index_path && *tool_index_path ? tool_index_path : NULL;
    if (rc == NEEDLE_OK) rc = needle_session_set_tools_ex(abi_session, system ? system : "",
                                                           tools_json ? tools_json : "[]", &tp);
    if (rc != NEEDLE_OK) drop_session();
    pthread_mutex_unlock(&abi_lock);
    return rc;
}

int needle_complete(const char *text, int max_new_tokens, char *out, int out_size) {
    if (!text || !out || out_size <= 0)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "needle_complete: NULL text or buffer");
    pthread_mutex_lock(&abi_lock);
    int rc;
    if (!abi_session) {
        rc = needle_fail(NEEDLE_ERR_STATE, "needle_complete: call needle_init first");
    } else {
        needle_complete_params p = needle_complete_default_params();
        p.max_new_tokens = max_new_tokens > 0 ? max_new_tokens : 256;
        size_t len = 0;
        rc = needle_session_complete(abi_session, text, &p, out, (size_t)out_size, &len);
    }
    pthread_mutex_unlock(&abi_lock);
    return rc < 0 ? rc : 0;
}

void needle_reset(void) {
    pthread_mutex_lock(&abi_lock);
    needle_session_reset(abi_session);
    pthread_mutex_unlock(&abi_lock);
}
