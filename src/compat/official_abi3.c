/* libneedle3 (include/needle3.h): the cactus-needle 3.x engine ABI over libneedle's public
 * API, as its ctypes client calls it (NEEDLE3.md §4). Built into its own shared library
 * because needle_complete's signature differs from the 2.x ABI of libneedle; it links the
 * static libneedle, whose 2.x ABI object is then never pulled in.
 *
 * One process-global model and conversation behind a mutex, as in the 2.x ABI
 * (src/compat/official_abi2.c): the official engine is not re-entrant either. */

#include <pthread.h>
#include <stdio.h>

#include "needle.h"
#include "needle3.h"
#include "util/error.h"

static pthread_mutex_t abi_lock = PTHREAD_MUTEX_INITIALIZER;
static needle_model *abi_model;
static needle_session *abi_session;

static void drop_session(void) {
    needle_session_free(abi_session);
    abi_session = NULL;
}

/* A session on the loaded model. A sliding window keeps the KV cache bounded however long
 * the conversation, so the client's endless conversation gets a practically unbounded
 * position budget; without a window the header's max_seq_len applies. */
static int new_session(needle_session **out) {
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(abi_model, &info);
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = info.kv_window ? (1u << 20) : 0;
    return needle_session_create(abi_model, &sp, out);
}

int needle_load(const unsigned char *cact, unsigned long long n) {
    if (!cact || n == 0) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "needle_load: empty image");
    needle_model *m;
    int rc = needle_model_open_blob(cact, (size_t)n, NULL, &m);
    if (rc) return rc;
    pthread_mutex_lock(&abi_lock);
    drop_session();
    needle_model_free(abi_model);
    abi_model = m;
    pthread_mutex_unlock(&abi_lock);
    return NEEDLE_OK;
}

int needle_init(const char *system, const char *tools_json, const char *tool_index_path) {
    pthread_mutex_lock(&abi_lock);
    drop_session();
    int rc;
    if (!abi_model) {
        /* generation 3 has no built-in weights */
        rc = needle_fail(NEEDLE_ERR_STATE, "needle_init: call needle_load first (Needle 3 "
                         "has no built-in weights)");
    } else if ((rc = new_session(&abi_session)) == NEEDLE_OK) {
        /* retrieval with the defaults (more than 5 tools, top 5); the index file caches the
         * tool embeddings across processes */
        needle_tools_params tp = needle_tools_default_params();
        tp.tool_index_path = tool_index_path && *tool_index_path ? tool_index_path : NULL;
        rc = needle_session_set_tools_ex(abi_session, system ? system : "",
                                         tools_json ? tools_json : "[]", &tp);
        if (rc == NEEDLE_OK) rc = (int)needle_session_position(abi_session);
        else drop_session();
    }
    pthread_mutex_unlock(&abi_lock);
    return rc;
}

/* The message of a failure into the caller's buffer (the client shows it), then rc. */
static int fail_into(int rc, char *out, int cap) {
    if (out && cap > 0) snprintf(out, (size_t)cap, "%s", needle_last_error());
    return rc;
}

int needle_complete(const char *input, const float *pcm, int samples, int max_new_tokens,
                    char *out, int cap) {
    if (!input || !out || cap <= 0)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "needle_complete: NULL text or buffer");
    if (pcm || samples)
        return fail_into(needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "needle_complete: audio "
                                          "input is not supported (no speech model)"), out, cap);
    pthread_mutex_lock(&abi_lock);
    int rc;
    if (!abi_session) {
        rc = needle_fail(NEEDLE_ERR_STATE, "needle_complete: call needle_load, then "
                              "needle_init first");
    } else {
        needle_complete_params p = needle_complete_default_params();
        p.max_new_tokens = max_new_tokens > 0 ? max_new_tokens : 256;
        size_t len = 0;
        rc = needle_session_complete(abi_session, input, &p, out, (size_t)cap, &len);
    }
    pthread_mutex_unlock(&abi_lock);
    return rc < 0 ? fail_into(rc, out, cap) : 0;
}

int needle_embed(const char *input, const float *pcm, int samples, float *out, int cap) {
    if (!input || cap < 0 || (cap && !out))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "needle_embed: NULL text or buffer");
    if (pcm || samples)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "needle_embed: audio input is not "
                                "supported (no speech model)");
    pthread_mutex_lock(&abi_lock);
    int rc;
    needle_session *s = abi_session, *own = NULL;
    if (!abi_model) {
        rc = needle_fail(NEEDLE_ERR_STATE, "needle_embed: call needle_load first");
    } else if (s || (rc = new_session(&own)) == NEEDLE_OK) {
        /* the embedding runs in the session's own embedder: the conversation is untouched */
        size_t n = 0;
        rc = needle_session_embed(s ? s : own, input, out, out ? (size_t)cap : 0, &n);
        if (!out && rc == NEEDLE_ERR_BUFFER_TOO_SMALL) rc = (int)n; /* the size query */
        else if (rc == NEEDLE_OK) rc = (int)n;
        needle_session_free(own);
    }
    pthread_mutex_unlock(&abi_lock);
    return rc;
}

void needle_reset(void) {
    pthread_mutex_lock(&abi_lock);
    if (abi_session) needle_session_reset(abi_session);
    pthread_mutex_unlock(&abi_lock);
}

int needle_models(void) { return 1; }
