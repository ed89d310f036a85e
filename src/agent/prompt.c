/* Prompt pieces of a conversation (see prompt.h). */
#include "agent/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar/json_canon.h"
#include "util/error.h"
#include "util/strbuf.h"
#include "util/utf8.h"

/* Unwraps OpenAI-style entries and returns the tools array as the model was trained on it
 * (Python-compact JSON). Plain arrays are re-serialized straight from the caller's text,
 * which keeps every number exactly as Python would print it. */
int prompt_canonical_tools(const char *tools_json, char **out, size_t *out_len) {
    cJSON *root = cJSON_Parse(tools_json);
    if (!root) return grammar_json_canon(tools_json, strlen(tools_json), out, out_len);
    int wrapped = 0;
    const cJSON *item;
    if (cJSON_IsArray(root))
        cJSON_ArrayForEach(item, root) if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(item, "function"))) wrapped = 1;
    if (!wrapped) {
        cJSON_Delete(root);
        return grammar_json_canon(tools_json, strlen(tools_json), out, out_len);
    }
    cJSON *flat = cJSON_CreateArray();
    cJSON_ArrayForEach(item, root) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(item, "function");
        cJSON_AddItemToArray(flat, cJSON_Duplicate(cJSON_IsObject(fn) ? fn : item, 1));
    }
    char *text = cJSON_PrintUnformatted(flat);
    cJSON_Delete(flat);
    cJSON_Delete(root);
    if (!text) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tools: out of memory");
    int rc = grammar_json_canon(text, strlen(text), out, out_len);
    cJSON_free(text);
    return rc;
}

/* Encodes text into a freshly malloc'd id array. */
int prompt_encode_alloc(const tokenizer *tok, const char *text, size_t len, int dummy,
                        int32_t **ids, size_t *n) {
    size_t need = 0;
    int rc = tokenizer_encode_ex(tok, text, len, dummy, NULL, 0, &need);
    if (rc && rc != NEEDLE_ERR_BUFFER_TOO_SMALL) return rc;
    *ids = malloc((need ? need : 1) * sizeof **ids);
    if (!*ids) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    rc = tokenizer_encode_ex(tok, text, len, dummy, *ids, need, n);
    if (rc) {
        free(*ids);
        *ids = NULL;
    }
    return rc;
}

/* The grammar of a tools array, with the official engine's documented rule: with one
 * declared tool it admits exactly one call of that name (extraction), so no refusal. */
int prompt_compile_tools(const char *tools, size_t len, grammar **out) {
    int rc = grammar_compile(tools, len, NULL, out);
    if (rc || grammar_tool_count(*out) != 1) return rc;
    grammar_options one = grammar_default_options();
    one.allow_empty = 0;
    one.single_call = 1;
    grammar_free(*out);
    *out = NULL;
    return grammar_compile(tools, len, &one, out);
}

void prompt_prefix_text(strbuf *out, const char *system, const char *tools, size_t tools_len) {
    if (*system) {
        strbuf_puts(out, "<|im_start|>system\n");
        strbuf_puts(out, system);
        strbuf_puts(out, "<|im_end|>\n");
    }
    strbuf_puts(out, "<|im_start|>user\n<tools>");
    strbuf_put(out, tools, tools_len);
    strbuf_puts(out, "</tools>");
}

/* [BOS] + the static prefix of system facts and tools, as token ids (malloc'd). */
int prompt_prefix_ids(const struct needle_model *m, const char *system, const char *tools,
                      size_t tools_len, int32_t **ids, size_t *n_ids) {
    strbuf prompt = {0};
    prompt_prefix_text(&prompt, system, tools, tools_len);
    if (prompt.oom) {
        free(prompt.data);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
    }
    int32_t *body;
    size_t n_body;
    int rc = prompt_encode_alloc(model_tokenizer(m), prompt.data, prompt.len, 1, &body, &n_body);
    free(prompt.data);
    if (rc) return rc;
    *ids = malloc((n_body + 1) * sizeof **ids);
    if (!*ids) {
        free(body);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
    }
    (*ids)[0] = NEEDLE_TOKEN_BOS;
    memcpy(*ids + 1, body, n_body * sizeof **ids);
    free(body);
    *n_ids = n_body + 1;
    return NEEDLE_OK;
}

int prompt_render_turn(strbuf *out, const char *text, prompt_turn kind) {
    if (kind == PROMPT_FIRST_QUERY) {
        strbuf_puts(out, "\n");
        strbuf_puts(out, text);
    } else if (kind == PROMPT_TOOL_RESULT) {
        strbuf_puts(out, "\n<|im_start|>user\n<tool_result>");
        /* results that are JSON are re-serialized like the training data; other text is
         * passed through */
        char *canon = NULL;
        size_t canon_len = 0;
        if (grammar_json_canon(text, strlen(text), &canon, &canon_len) == NEEDLE_OK)
            strbuf_put(out, canon, canon_len);
        else
            strbuf_puts(out, text);
        free(canon);
        strbuf_puts(out, "</tool_result>");
    } else {
        strbuf_puts(out, "\n<|im_start|>user\n");
        strbuf_puts(out, text);
    }
    strbuf_puts(out, "<|im_end|>\n<|im_start|>assistant\n");
    return out->oom ? needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory") : NEEDLE_OK;
}

/* ---- the 3.x date fact ------------------------------------------------------------ */

/* Python's str.isspace() (Unicode 14, CPython 3.11): what strip() removes. */
static int py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Python's re \d on str: a Unicode decimal digit (category Nd, Unicode 14), which come in
 * runs of ten; the table holds each run's first and last code point. */
static int py_digit(uint32_t cp) {
    static const uint32_t runs[][2] = {
        {0x30, 0x39}, {0x660, 0x669}, {0x6F0, 0x6F9}, {0x7C0, 0x7C9}, {0x966, 0x96F},
        {0x9E6, 0x9EF}, {0xA66, 0xA6F}, {0xAE6, 0xAEF}, {0xB66, 0xB6F}, {0xBE6, 0xBEF},
        {0xC66, 0xC6F}, {0xCE6, 0xCEF}, {0xD66, 0xD6F}, {0xDE6, 0xDEF}, {0xE50, 0xE59},
        {0xED0, 0xED9}, {0xF20, 0xF29}, {0x1040, 0x1049}, {0x1090, 0x1099}, {0x17E0, 0x17E9},
        {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19D9}, {0x1A80, 0x1A89},
        {0x1A90, 0x1A99}, {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49},
        {0x1C50, 0x1C59}, {0xA620, 0xA629}, {0xA8D0, 0xA8D9}, {0xA900, 0xA909},
        {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9},
        {0xFF10, 0xFF19}, {0x104A0, 0x104A9}, {0x10D30, 0x10D39}, {0x11066, 0x1106F},
        {0x110F0, 0x110F9}, {0x11136, 0x1113F}, {0x111D0, 0x111D9}, {0x112F0, 0x112F9},
        {0x11450, 0x11459}, {0x114D0, 0x114D9}, {0x11650, 0x11659}, {0x116C0, 0x116C9},
        {0x11730, 0x11739}, {0x118E0, 0x118E9}, {0x11950, 0x11959}, {0x11C50, 0x11C59},
        {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9}, {0x16A60, 0x16A69}, {0x16AC0, 0x16AC9},
        {0x16B50, 0x16B59}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149}, {0x1E2F0, 0x1E2F9},
        {0x1E950, 0x1E959}, {0x1FBF0, 0x1FBF9}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        if (cp >= runs[i][0] && cp <= runs[i][1]) return 1;
    return 0;
}

/* The text's code points (a byte that is not well-formed UTF-8 counts as one code point
 * that is neither a space nor a digit), malloc'd; NULL when out of memory. */
static uint32_t *code_points(const char *text, size_t *n) {
    const size_t len = strlen(text);
    uint32_t *cps = malloc((len + 1) * sizeof *cps);
    if (!cps) return NULL;
    *n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp = 0xFFFD;
        const int k = util_utf8_next((const uint8_t *)text + i, len - i, &cp, NULL);
        if (k <= 0) cp = 0xFFFD;
        cps[(*n)++] = cp;
        i += k > 0 ? (size_t)k : 1;
    }
    return cps;
}

/* Whether system gives a date already: a `date:` key not after an ASCII letter, or
 * \d{4}-\d{2}-\d{2}. */
static int gives_date(const char *system, const uint32_t *cps, size_t n) {
    for (const char *p = strstr(system, "date:"); p; p = strstr(p + 1, "date:")) {
        const char before = p > system ? p[-1] : 0;
        if (!((before >= 'A' && before <= 'Z') || (before >= 'a' && before <= 'z'))) return 1;
    }
    static const char stamp[] = "dddd-dd-dd";
    for (size_t i = 0; i + 10 <= n; i++) {
        size_t k = 0;
        while (k < 10 && (stamp[k] == '-' ? cps[i + k] == '-' : py_digit(cps[i + k]))) k++;
        if (k == 10) return 1;
    }
    return 0;
}

/* 0 = Sunday (Sakamoto's method, proleptic Gregorian calendar, as Python's datetime). */
static int weekday(int32_t y, int32_t m, int32_t d) {
    static const int t[] = {0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4};
    if (m < 3) y -= 1;
    return (y + y / 4 - y / 100 + y / 400 + t[m - 1] + d) % 7;
}

static int valid_time(const prompt_time *w) {
    static const int32_t days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (w->year < 1000 || w->year > 9999 || w->month < 1 || w->month > 12 || w->hour < 0 ||
        w->hour > 23 || w->minute < 0 || w->minute > 59 || w->day < 1)
        return 0;
    const int leap = (w->year % 4 == 0 && w->year % 100 != 0) || w->year % 400 == 0;
    return w->day <= days[w->month - 1] + (w->month == 2 && leap);
}

int prompt_system_with_date(strbuf *out, const char *system, const prompt_time *when) {
    if (!valid_time(when))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "date fact: %d-%d-%d %d:%d is not a "
                           "local date and time of years 1000-9999", when->year, when->month,
                           when->day, when->hour, when->minute);
    size_t n = 0;
    uint32_t *cps = code_points(system, &n);
    if (!cps) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "date fact: out of memory");
    size_t lead = 0;
    while (lead < n && py_space(cps[lead])) lead++;
    const int given = gives_date(system, cps, n), blank = lead == n;
    const int json_object = !blank && cps[lead] == '{';
    free(cps);
    if (given || json_object) {
        strbuf_puts(out, system);
    } else {
        static const char *const names[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
        char fact[48];
        snprintf(fact, sizeof fact, "date: %04d-%02d-%02d %s %02d:%02d", (int)when->year,
                 (int)when->month, (int)when->day,
                 names[weekday(when->year, when->month, when->day)], (int)when->hour,
                 (int)when->minute);
        strbuf_puts(out, fact);
        if (!blank) {
            strbuf_puts(out, "; ");
            strbuf_puts(out, system);
        }
    }
    return out->oom ? needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "date fact: out of memory")
                    : NEEDLE_OK;
}
