/* Thread-local last-error message (see error.h). */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

int needle_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void needle_clear_error(void) { last_error[0] = '\0'; }

const char *needle_last_error(void) { return last_error; }

const char *needle_status_string(int status) {
    switch (status) {
    case NEEDLE_OK: return "ok";
    case NEEDLE_ERR_INVALID_ARGUMENT: return "invalid argument";
    case NEEDLE_ERR_IO: return "i/o error";
    case NEEDLE_ERR_FORMAT: return "invalid or unsupported .cact file";
    case NEEDLE_ERR_OUT_OF_MEMORY: return "out of memory";
    case NEEDLE_ERR_NO_TOKENIZER: return "model has no tokenizer";
    case NEEDLE_ERR_INVALID_UTF8: return "invalid UTF-8 text";
    case NEEDLE_ERR_CONTEXT_FULL: return "context full";
    case NEEDLE_ERR_BUFFER_TOO_SMALL: return "output buffer too small";
    case NEEDLE_ERR_INVALID_TOKEN: return "token id out of range";
    case NEEDLE_ERR_JSON: return "malformed JSON";
    case NEEDLE_ERR_SCHEMA: return "unsupported or invalid schema";
    case NEEDLE_ERR_BACKEND: return "backend unavailable";
    case NEEDLE_ERR_STATE: return "invalid state for this call";
    case NEEDLE_ERR_MAX_TOKENS: return "generation stopped at max_new_tokens";
    case NEEDLE_ERR_CANCELLED: return "cancelled by a callback";
    default: return "unknown status";
    }
}
