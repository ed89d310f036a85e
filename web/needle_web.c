/* The engine for a browser tab: a WASI reactor module (no main; the page calls these
 * exports after _initialize) over the public C API. The page owns the bytes: it copies the
 * model into memory from nw_alloc, then nw_load, nw_set_tools and nw_complete per query.
 * One model and one session per module instance, one thread (cmake/toolchain-wasm32-wasi.cmake).
 *
 * Strings cross the boundary as NUL-terminated UTF-8 in the module's memory: the page
 * writes them into nw_alloc'd buffers and reads the returned pointers up to the NUL. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "needle.h"

#define EXPORT(name) __attribute__((export_name(name)))

static needle_model *model;
static needle_session *session;
static void *model_bytes; /* used in place by the model (64-byte aligned), freed after it */
static char *envelope;    /* the last nw_complete's result */
static size_t envelope_cap;
static char message[512];  /* the last failure, for nw_error */

static int fail(int status, const char *what) {
    snprintf(message, sizeof message, "%s: %s (%s)", what, needle_last_error(),
             needle_status_string(status));
    return status;
}

static void unload(void) {
    needle_session_free(session);
    session = NULL;
    needle_model_free(model);
    model = NULL;
    free(model_bytes);
    model_bytes = NULL;
}

/* 64-byte aligned, so a model image written here is used in place (needle_model_open_blob
 * copies a misaligned one: twice the memory). NULL when the memory cannot grow. */
EXPORT("nw_alloc") void *nw_alloc(size_t size) {
    const size_t rounded = (size + 63) & ~(size_t)63;
    if (size == 0 || rounded < size) return NULL;
    return aligned_alloc(64, rounded);
}

EXPORT("nw_free") void nw_free(void *p) { free(p); }

/* Takes the model image in `data` (from nw_alloc, `size` bytes): the module owns it from
 * here, also on failure. Replaces any loaded model. 0 or a negative needle status. */
EXPORT("nw_load") int nw_load(void *data, size_t size) {
    unload();
    model_bytes = data;
    needle_model_params mp = needle_model_default_params();
    mp.n_threads = 1;
    int rc = needle_model_open_blob(data, size, &mp, &model);
    if (rc) {
        fail(rc, "cannot open the model");
        unload();
        return rc;
    }
    needle_session_params sp = needle_session_default_params();
    /* as the CLI: a sliding window bounds the KV cache, so positions need no cap (Needle 3
     * attends over its whole context: max_seq_len, the default, bounds it) */
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(model, &info);
    if (info.kv_window && info.generation != 3) sp.n_ctx = 1u << 20;
    if ((rc = needle_session_create(model, &sp, &session))) {
        fail(rc, "cannot create a session");
        unload();
        return rc;
    }
    return 0;
}

/* The tools (a JSON array) and system facts (may be NULL) of the queries to come. */
EXPORT("nw_set_tools") int nw_set_tools(const char *system, const char *tools_json) {
    if (!session) {
        snprintf(message, sizeof message, "no model: call nw_load first");
        return NEEDLE_ERR_STATE;
    }
    const int rc = needle_session_set_tools(session, system, tools_json);
    return rc ? fail(rc, "cannot set the tools") : 0;
}

/* One query, answered from the tools' prefix (each query stands alone, as on the page):
 * the envelope JSON (valid until the next call), or NULL (nw_error says why). */
EXPORT("nw_complete") const char *nw_complete(const char *text, int max_new_tokens) {
    if (!session) {
        snprintf(message, sizeof message, "no model: call nw_load first");
        return NULL;
    }
    needle_session_reset(session);
    needle_complete_params cp = needle_complete_default_params();
    cp.max_new_tokens = max_new_tokens;
    cp.turn = NEEDLE_TURN_QUERY;
    if (!envelope) {
        if (!(envelope = malloc(4096))) {
            snprintf(message, sizeof message, "out of memory for the envelope");
            return NULL;
        }
        envelope_cap = 4096;
    }
    for (;;) {
        size_t len = 0;
        const int rc = needle_session_complete(session, text, &cp, envelope, envelope_cap, &len);
        if (rc == 0) return envelope;
        if (rc != NEEDLE_ERR_BUFFER_TOO_SMALL) {
            fail(rc, "the query failed");
            return NULL;
        }
        char *grown = realloc(envelope, len + 1);
        if (!grown) {
            snprintf(message, sizeof message, "out of memory for a %zu-byte envelope", len + 1);
            return NULL;
        }
        envelope = grown;
        envelope_cap = len + 1;
    }
}

EXPORT("nw_error") const char *nw_error(void) { return message; }

EXPORT("nw_version") const char *nw_version(void) { return needle_version(); }
