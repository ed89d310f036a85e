/* The response envelope (spec §8.3) and its error codes.
 *
 * Every turn ends in one JSON object, success or not, so that callers (the official Python
 * client among them) always get parseable JSON:
 *   {"type":"call"|"respond","success":bool,"error":null|str,"error_code":null|str,
 *    "function_calls":[{"name":..,"arguments":{..}}],"reasoning":str,"confidence":num|null,
 *    "validation":{"ungrounded":[..],"negation":bool},
 *    "prefill_tps":num,"decode_tps":num,"peak_ram_mb":num}
 * plus, only when they apply, "suppressed_calls" (type "low_confidence": the calls not to
 * execute), "retrieved_tools" (the names of the tools retrieval rendered this turn) and
 * "input_truncated": {"tokens": N, "window": W} (the turn's N tokens are more than the
 * sliding window's W positions: the model did not see the start of the input).
 * "confidence" is a number in [0, 1] on every successful turn, null on failures.
 * "validation" is in every envelope (agent/validation.h), on the calls shown (the
 * suppressed ones for "low_confidence"). A failed turn's "type" is always "error", whatever
 * failed; its error_code tells which. 
 * error_code values (documented in the README), all produced by agent/chat.c:
 * "context_full", "max_tokens", "invalid_input", "internal". (A session without tools is
 * not a turn-level failure: needle_session_complete returns NEEDLE_ERR_STATE.) */
#ifndef NEEDLE_AGENT_ENVELOPE_H
#define NEEDLE_AGENT_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#include "util/strbuf.h"

typedef struct envelope {
    const char *type;           /* "call", "respond" or "low_confidence"; written as "error"
                                   whenever success is 0 */
    int success;
    const char *error;          /* NULL on success */
    const char *error_code;     /* NULL on success */
    const char *calls_json;     /* the validated call array, e.g. "[]"; NULL -> "[]" */
    const char *reasoning;      /* UTF-8, may be NULL */
    double prefill_tps, decode_tps, peak_ram_mb;
    int has_confidence;
    double confidence;          /* [0, 1], written when has_confidence */
    const char *suppressed_calls; /* JSON array or NULL (key left out) */
    const char *retrieved_tools;  /* JSON array of names or NULL (key left out) */
    /* what "validation" (agent/validation.h) is computed from: the tools JSON, the system
     * facts, the turn's text (each may be NULL) and whether that text is a query */
    const char *tools_json, *system, *text;
    int is_query;
    /* a turn of truncated_tokens tokens past the sliding window of truncated_window
     * positions: "input_truncated": {"tokens", "window"} (key left out while 0) */
    uint32_t truncated_tokens, truncated_window;
} envelope;

/* Writes the envelope, NUL-terminated, into out. *len receives the length without the NUL.
 * If it does not fit, returns NEEDLE_ERR_BUFFER_TOO_SMALL with *len = the size needed - 1
 * and writes instead, when it fits, a short envelope with error_code "buffer_too_small",
 * else an empty string (never truncated JSON). */
int envelope_write(const envelope *e, char *out, size_t cap, size_t *len);

/* Peak resident set size of the process in MiB (getrusage). */
double envelope_peak_ram_mb(void);

#endif
