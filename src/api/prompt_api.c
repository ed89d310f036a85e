/* The prompt template's public entry points (needle.h): thin functions over
 * agent/prompt.h, where the template is. */
#include <stdlib.h>
#include <string.h>

#include "agent/prompt.h"
#include "util/error.h"
#include "util/strbuf.h"

/* Copies the rendered text to out[cap] with its NUL; frees it. */
static int write_text(strbuf *text, char *out, size_t cap, size_t *len) {
    if (text->oom) {
        free(text->data);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "prompt: out of memory");
    }
    *len = text->len;
    int rc = NEEDLE_OK;
    if (text->len + 1 > cap)
        rc = needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "prompt: the text is %zu bytes, the "
                         "buffer holds %zu", text->len + 1, cap);
    else {
        if (text->len) memcpy(out, text->data, text->len);
        out[text->len] = 0;
        needle_clear_error();
    }
    free(text->data);
    return rc;
}

int needle_render_prompt(const char *system, const char *tools_json, const char *query,
                         char *out, size_t cap, size_t *len) {
    if (!tools_json || !query || !len || (!out && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "render_prompt: NULL argument");
    char *tools = NULL;
    size_t tools_len = 0;
    int rc = prompt_canonical_tools(tools_json, &tools, &tools_len);
    if (rc) return rc;
    strbuf text = {0};
    prompt_prefix_text(&text, system ? system : "", tools, tools_len);
    free(tools);
    rc = prompt_render_turn(&text, query, PROMPT_FIRST_QUERY);
    if (rc) {
        free(text.data);
        return rc;
    }
    return write_text(&text, out, cap, len);
}

int needle_system_with_date(const char *system, int32_t year, int32_t month, int32_t day,
                            int32_t hour, int32_t minute, char *out, size_t cap, size_t *len) {
    if (!len || (!out && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "system_with_date: NULL argument");
    const prompt_time when = {year, month, day, hour, minute};
    strbuf text = {0};
    int rc = prompt_system_with_date(&text, system ? system : "", &when);
    if (rc) {
        free(text.data);
        return rc;
    }
    return write_text(&text, out, cap, len);
}
