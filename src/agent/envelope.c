/* Envelope serialization (see envelope.h). */
#include "agent/envelope.h"

#include "agent/validation.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "needle.h"
#include "util/error.h"
#include "util/json_escape.h"
#include "util/platform.h"

static void put_number(strbuf *b, double v) {
    char num[64];
    if (!isfinite(v)) v = 0;
    snprintf(num, sizeof num, "%.1f", v);
    strbuf_puts(b, num);
}

static void put_nullable(strbuf *b, const char *s) {
    if (s) util_json_put_string(b, s, strlen(s), 0);
    else strbuf_puts(b, "null");
}

static void render(const envelope *e, strbuf *b) {
    strbuf_puts(b, "{\"type\":");
    /* one type for every failure: callers test "type" before "success" (the official
     * client's loop runs while type is "call"), so a failed turn must never read as one */
    put_nullable(b, !e->success ? "error" : e->type ? e->type : "call");
    strbuf_puts(b, e->success ? ",\"success\":true,\"error\":" : ",\"success\":false,\"error\":");
    put_nullable(b, e->error);
    strbuf_puts(b, ",\"error_code\":");
    put_nullable(b, e->error_code);
    strbuf_puts(b, ",\"function_calls\":");
    strbuf_puts(b, e->calls_json ? e->calls_json : "[]");
    if (e->suppressed_calls) {
        strbuf_puts(b, ",\"suppressed_calls\":");
        strbuf_puts(b, e->suppressed_calls);
    }
    if (e->retrieved_tools) {
        strbuf_puts(b, ",\"retrieved_tools\":");
        strbuf_puts(b, e->retrieved_tools);
    }
    if (e->truncated_window) {
        char t[96];
        snprintf(t, sizeof t, ",\"input_truncated\":{\"tokens\":%u,\"window\":%u}", e->truncated_tokens,
                 e->truncated_window);
        strbuf_puts(b, t);
    }
    strbuf_puts(b, ",\"reasoning\":");
    const char *r = e->reasoning ? e->reasoning : "";
    util_json_put_string(b, r, strlen(r), 0);
    strbuf_puts(b, ",\"confidence\":");
    if (e->has_confidence && isfinite(e->confidence)) {
        char num[32];
        snprintf(num, sizeof num, "%.4f", e->confidence);
        strbuf_puts(b, num);
    } else {
        strbuf_puts(b, "null");
    }
    strbuf_puts(b, ",\"validation\":");
    validation_write(e->tools_json, e->system, e->text, e->is_query,
                     e->suppressed_calls ? e->suppressed_calls : e->calls_json, b);
    strbuf_puts(b, ",\"prefill_tps\":");
    put_number(b, e->prefill_tps);
    strbuf_puts(b, ",\"decode_tps\":");
    put_number(b, e->decode_tps);
    strbuf_puts(b, ",\"peak_ram_mb\":");
    put_number(b, e->peak_ram_mb);
    strbuf_puts(b, "}");
}

int envelope_write(const envelope *e, char *out, size_t cap, size_t *len) {
    strbuf b = {0};
    render(e, &b);
    if (b.oom) {
        free(b.data);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "envelope: out of memory");
    }
    *len = b.len;
    if (b.len + 1 <= cap && out) {
        memcpy(out, b.data, b.len + 1);
        free(b.data);
        return NEEDLE_OK;
    }
    size_t needed = b.len + 1;
    free(b.data);
    envelope small = {e->type, 0, "output buffer too small for the response",
                      "buffer_too_small", "[]", "", 0, 0, 0, 0, 0, NULL, NULL,
                      NULL, NULL, e->text, e->is_query, 0, 0};
    strbuf s = {0};
    render(&small, &s);
    if (out && cap) out[0] = 0;
    if (!s.oom && out && s.len + 1 <= cap) memcpy(out, s.data, s.len + 1);
    free(s.data);
    return needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "the response needs %zu bytes, the buffer "
                       "holds %zu", needed, cap);
}

double envelope_peak_ram_mb(void) { return platform_peak_rss_mb(); }
