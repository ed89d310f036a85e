/* The official fine-tuner's data path in C (see finetune_data.h). */
#include "train/finetune_data.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/json_canon.h"
#include "util/error.h"

/* ---- text helpers ------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* Length of the Python whitespace character (str.isspace) at s, or 0. */
static size_t py_space(const unsigned char *s, size_t n) {
    if (!n) return 0;
    const unsigned c = s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (n >= 2 && c == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n >= 3) {
        const unsigned cp = (c & 0x0fu) << 12 | (s[1] & 0x3fu) << 6 | (s[2] & 0x3fu);
        if ((c & 0xf0u) == 0xe0 && (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
                                    cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000))
            return 3;
    }
    return 0;
}

/* str.strip(): the span of s without leading and trailing Python whitespace */
static void py_strip(const char *s, size_t n, size_t *start, size_t *end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n, k;
    while (a < b && (k = py_space(u + a, b - a))) a += k;
    for (;;) {
        /* a trailing character ends at b: try each width */
        size_t w = 0;
        for (size_t t = 1; t <= 3 && t <= b - a && !w; t++)
            if (py_space(u + b - t, t) == t) w = t;
        if (!w) break;
        b -= w;
    }
    *start = a;
    *end = b;
}

/* ---- JSON spans: members of the line's objects as written ------------------------------ */
/* The line is validated by cJSON first; these walk its text to find a value's bytes, so
 * numbers reach json_canon as written (Python keeps integers exact and re-prints floats). */

typedef struct span {
    const char *p;
    size_t n;
} span;

static const char *ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static const char *skip_value(const char *p, const char *e) {
    p = ws(p, e);
    if (p >= e) return e;
    if (*p == '"') {
        for (p++; p < e && *p != '"'; p++)
            if (*p == '\\') p++;
        return p < e ? p + 1 : e;
    }
    if (*p == '{' || *p == '[') {
        int depth = 0;
        for (; p < e; p++) {
            if (*p == '"') {
                p = skip_value(p, e) - 1;
            } else if (*p == '{' || *p == '[') {
                depth++;
            } else if (*p == '}' || *p == ']') {
                if (--depth == 0) return p + 1;
            }
        }
        return e;
    }
    while (p < e && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') p++;
    return p;
}

static char kind_of(span v) { return v.n ? v.p[0] : 0; }

static int key_is(span k, const char *key) {
    /* k is a JSON string token; keys with escapes are decoded first */
    if (!memchr(k.p, '\\', k.n)) return k.n == strlen(key) + 2 && !memcmp(k.p + 1, key, k.n - 2);
    cJSON *j = cJSON_ParseWithLength(k.p, k.n);
    const int eq = cJSON_IsString(j) && !strcmp(j->valuestring, key);
    cJSON_Delete(j);
    return eq;
}

/* obj[key] (the last one, as json.loads keeps); 0 when absent or obj is no object */
static int member(span obj, const char *key, span *out) {
    if (kind_of(obj) != '{') return 0;
    const char *p = obj.p + 1, *e = obj.p + obj.n;
    int found = 0;
    for (;;) {
        p = ws(p, e);
        if (p >= e || *p != '"') break;
        const char *k = p;
        p = skip_value(p, e);
        const span ks = {k, (size_t)(p - k)};
        p = ws(p, e);
        if (p >= e || *p != ':') break;
        const char *v = ws(p + 1, e);
        p = skip_value(v, e);
        if (key_is(ks, key)) {
            *out = (span){v, (size_t)(p - v)};
            found = 1;
        }
        p = ws(p, e);
        if (p >= e || *p != ',') break;
        p++;
    }
    return found;
}

/* the elements of an array, one at a time: *at starts at 0 */
static int element(span arr, size_t *at, span *out) {
    const char *e = arr.p + arr.n, *p = ws(arr.p + (*at ? *at : 1), e);
    if (p < e && *p == ',') p = ws(p + 1, e);
    if (p >= e || *p == ']') return 0;
    const char *end = skip_value(p, e);
    *out = (span){p, (size_t)(end - p)};
    *at = (size_t)(end - arr.p);
    return 1;
}

/* Python truthiness of a JSON value */
static int truthy(span v) {
    const char k = kind_of(v);
    if (k == 'n' || k == 'f') return 0;
    if (k == '"') return v.n > 2;
    if (k == '{' || k == '[') {
        const char *p = ws(v.p + 1, v.p + v.n);
        return p < v.p + v.n && *p != '}' && *p != ']';
    }
    if (k == 't') return 1;
    /* numbers: zero is falsy */
    for (size_t i = 0; i < v.n && v.p[i] != 'e' && v.p[i] != 'E'; i++)
        if (v.p[i] >= '1' && v.p[i] <= '9') return 1;
    return 0;
}

/* a JSON string's decoded text (malloc'd), or NULL: not a string or holds a NUL (cJSON
 * would stop the decoded text there) */
static char *string_of(span v) {
    if (kind_of(v) != '"') return NULL;
    for (size_t i = 0; i + 6 <= v.n; i++)
        if (v.p[i] == '\\') {
            if (!memcmp(v.p + i, "\\u0000", 6)) return NULL;
            i++;
        }
    cJSON *j = cJSON_ParseWithLength(v.p, v.n);
    char *s = cJSON_IsString(j) ? strdup(j->valuestring) : NULL;
    cJSON_Delete(j);
    return s;
}

static int canon_into(sbuf *b, const char *text, size_t len) {
    char *out;
    size_t n;
    const int st = grammar_json_canon(text, len, &out, &n);
    if (st) return st;
    sb_add(b, out, n);
    free(out);
    return 0;
}

/* ---- rendering ------------------------------------------------------------------------- */

#define FAIL(...)                                                                                          \
    do {                                                                                                   \
        snprintf(why, cap, __VA_ARGS__);                                                                   \
        st = NEEDLE_ERR_INVALID_ARGUMENT;                                                                  \
        goto done;                                                                                         \
    } while (0)

typedef struct example {
    span query, tools, answers, reasoning, system;
    int has_tools, has_answers, has_reasoning, has_system;
    /* chat format: converted here */
    char *query_text, *system_text;
    sbuf tools_json, answers_json;
    int chat;
} example;

/* from_chat: 1 converted, 0 not single-turn chat (skipped), < 0 error */
static int from_chat(span line, example *x, char *why, size_t cap) {
    span messages, turns[2], m, role, v;
    int st = 0, n_turns = 0;
    if (!member(line, "messages", &messages) || kind_of(messages) != '[') {
        snprintf(why, cap, "neither query/answers nor single-turn chat format");
        return 0;
    }
    size_t at = 0;
    int first_system = 1;
    while (element(messages, &at, &m)) {
        if (kind_of(m) != '{') FAIL("a message is not an object");
        const int has_role = member(m, "role", &role);
        char *r = has_role ? string_of(role) : NULL;
        const int system = r && !strcmp(r, "system");
        free(r);
        if (system) {
            if (first_system && member(m, "content", &v) && truthy(v)) {
                if (!(x->system_text = string_of(v))) FAIL("the system message's content is not text");
            }
            first_system = 0;
            continue;
        }
        if (n_turns < 2) turns[n_turns] = m;
        n_turns++;
    }
    char *r0 = NULL, *r1 = NULL;
    if (n_turns == 2) {
        if (member(turns[0], "role", &role)) r0 = string_of(role);
        if (member(turns[1], "role", &role)) r1 = string_of(role);
    }
    const int single = n_turns == 2 && r0 && !strcmp(r0, "user") && r1 && !strcmp(r1, "assistant");
    free(r0);
    free(r1);
    if (!single) {
        snprintf(why, cap, "chat format with other than one user turn answered by one assistant turn");
        return 0;
    }
    x->chat = 1;
    /* answers: [{"name": function.name, "arguments": function.arguments}] */
    span calls, call, fn, name, args;
    sb_str(&x->answers_json, "[");
    if (member(turns[1], "tool_calls", &calls) && truthy(calls)) {
        if (kind_of(calls) != '[') FAIL("tool_calls is not a list");
        size_t ai = 0;
        int k = 0;
        while (element(calls, &ai, &call)) {
            if (kind_of(call) != '{') FAIL("a tool call is not an object");
            if (!member(call, "function", &fn) || !truthy(fn)) fn = call;
            if (kind_of(fn) != '{') FAIL("a tool call's function is not an object");
            sb_str(&x->answers_json, k++ ? ",{\"name\":" : "{\"name\":");
            if (member(fn, "name", &name)) {
                if ((st = canon_into(&x->answers_json, name.p, name.n))) FAIL("a call's name: %s", needle_last_error());
            } else {
                sb_str(&x->answers_json, "null");
            }
            sb_str(&x->answers_json, ",\"arguments\":");
            if (!member(fn, "arguments", &args)) {
                sb_str(&x->answers_json, "{}");
            } else if (kind_of(args) == '"') {
                char *text = string_of(args);
                if (!text) FAIL("a call's arguments string holds a NUL");
                size_t a, b;
                py_strip(text, strlen(text), &a, &b);
                if (a == b)
                    sb_str(&x->answers_json, "{}");
                else if ((st = canon_into(&x->answers_json, text, strlen(text)))) {
                    free(text);
                    FAIL("a call's arguments string is not JSON: %s", needle_last_error());
                }
                free(text);
            } else if ((st = canon_into(&x->answers_json, args.p, args.n))) {
                FAIL("a call's arguments: %s", needle_last_error());
            }
            sb_str(&x->answers_json, "}");
        }
    }
    sb_str(&x->answers_json, "]");
    /* tools: each {"type":"function","function":{...}} unwrapped */
    span tools, t, f;
    sb_str(&x->tools_json, "[");
    if (member(line, "tools", &tools) && truthy(tools)) {
        if (kind_of(tools) != '[') FAIL("chat format: tools is not a list");
        size_t ti = 0;
        int k = 0;
        while (element(tools, &ti, &t)) {
            if (k++) sb_str(&x->tools_json, ",");
            const span use = kind_of(t) == '{' && member(t, "function", &f) ? f : t;
            if ((st = canon_into(&x->tools_json, use.p, use.n))) FAIL("a tool: %s", needle_last_error());
        }
    }
    sb_str(&x->tools_json, "]");
    /* query: the user turn's content or "" */
    if (member(turns[0], "content", &v) && truthy(v)) {
        if (!(x->query_text = string_of(v))) FAIL("the user message's content is not text");
    } else if (!(x->query_text = strdup(""))) {
        FAIL("out of memory");
    }
    st = 1;
done:
    return st;
}

static void example_free(example *x) {
    free(x->query_text);
    free(x->system_text);
    free(x->tools_json.p);
    free(x->answers_json.p);
}

/* text of an optional string field: (value or "").strip(); NULL result means error */
static int stripped(span v, int present, const char *what, char **out, char *why, size_t cap) {
    *out = NULL;
    if (!present || !truthy(v)) {
        *out = strdup("");
        return *out ? 0 : NEEDLE_ERR_OUT_OF_MEMORY;
    }
    char *s = string_of(v);
    if (!s) {
        snprintf(why, cap, "%s is not text", what);
        return NEEDLE_ERR_INVALID_ARGUMENT;
    }
    size_t a, b;
    py_strip(s, strlen(s), &a, &b);
    memmove(s, s + a, b - a);
    s[b - a] = 0;
    *out = s;
    return 0;
}

void ft_rendered_free(ft_rendered *r) {
    if (!r) return;
    free(r->prompt);
    free(r->target);
    free(r->tools);
    free(r->answers);
    memset(r, 0, sizeof *r);
}

int ft_render_line(const char *text, size_t len, ft_rendered *out, char *why, size_t cap) {
    memset(out, 0, sizeof *out);
    size_t a, b;
    py_strip(text, len, &a, &b);
    if (a == b) {
        snprintf(why, cap, "blank");
        return 0;
    }
    const span line = {text + a, b - a};
    cJSON *root = cJSON_ParseWithLength(line.p, line.n);
    const int object = cJSON_IsObject(root);
    cJSON_Delete(root);
    if (!root) {
        snprintf(why, cap, "not JSON");
        return NEEDLE_ERR_JSON;
    }
    if (!object) {
        snprintf(why, cap, "not a JSON object");
        return NEEDLE_ERR_JSON;
    }
    example x;
    memset(&x, 0, sizeof x);
    char *reasoning = NULL, *system = NULL, *query = NULL;
    sbuf tools = {0}, answers = {0}, prompt = {0}, target = {0};
    int st = 0;
    span v;
    if (!member(line, "query", &v)) {
        st = from_chat(line, &x, why, cap);
        if (st <= 0) goto done;
        query = x.query_text;
        x.query_text = NULL;
        sb_add(&tools, x.tools_json.p, x.tools_json.n);
        sb_add(&answers, x.answers_json.p, x.answers_json.n);
        system = x.system_text ? x.system_text : strdup("");
        x.system_text = NULL;
        if (!system) FAIL("out of memory");
        size_t s0, s1;
        py_strip(system, strlen(system), &s0, &s1);
        memmove(system, system + s0, s1 - s0);
        system[s1 - s0] = 0;
        reasoning = strdup("");
    } else {
        if (!(query = string_of(v))) FAIL("query is not text");
        span t, ans;
        if (!member(line, "tools", &t)) {
            sb_str(&tools, "[]");
        } else if (kind_of(t) == '"') {
            char *s = string_of(t);
            if (!s) FAIL("tools holds a NUL");
            sb_str(&tools, s);
            free(s);
        } else if ((st = canon_into(&tools, t.p, t.n))) {
            FAIL("tools: %s", needle_last_error());
        }
        if (!member(line, "answers", &ans) && !member(line, "function_calls", &ans)) {
            sb_str(&answers, "[]");
        } else if (kind_of(ans) == '"') {
            char *s = string_of(ans);
            if (!s) FAIL("answers holds a NUL");
            sb_str(&answers, s);
            free(s);
        } else if ((st = canon_into(&answers, ans.p, ans.n))) {
            FAIL("answers: %s", needle_last_error());
        }
        span r, s;
        const int hr = member(line, "reasoning", &r), hs = member(line, "system", &s);
        if ((st = stripped(r, hr, "reasoning", &reasoning, why, cap)) ||
            (st = stripped(s, hs, "system", &system, why, cap)))
            goto done;
    }
    if (!reasoning) FAIL("out of memory");
    if (*system) {
        sb_str(&prompt, "<|im_start|>system\n");
        sb_str(&prompt, system);
        sb_str(&prompt, "<|im_end|>\n");
    }
    sb_str(&prompt, "<|im_start|>user\n<tools>");
    sb_add(&prompt, tools.p ? tools.p : "", tools.n);
    sb_str(&prompt, "</tools>\n");
    sb_str(&prompt, query);
    sb_str(&prompt, "<|im_end|>\n<|im_start|>assistant\n");
    if (*reasoning) {
        sb_str(&target, "<think>\n");
        sb_str(&target, reasoning);
        sb_str(&target, "\n</think>\n");
    }
    sb_str(&target, "<tool_call>");
    sb_add(&target, answers.p ? answers.p : "", answers.n);
    sb_str(&target, "</tool_call><|im_end|>");
    if (prompt.oom || target.oom || tools.oom || answers.oom) FAIL("out of memory");
    out->prompt = prompt.p;
    out->target = target.p;
    out->tools = tools.p;
    out->answers = answers.p;
    prompt.p = target.p = tools.p = answers.p = NULL;
    st = 1;
done:
    example_free(&x);
    free(query);
    free(reasoning);
    free(system);
    free(tools.p);
    free(answers.p);
    free(prompt.p);
    free(target.p);
    return st;
}

/* ---- checks the official fine-tuner does not make (warnings) -------------------------- */

static void report_f(ft_report_fn report, void *user, uint32_t line, int severity, const char *fmt, ...)
    NEEDLE_PRINTF(5, 6);
static void report_f(ft_report_fn report, void *user, uint32_t line, int severity, const char *fmt, ...) {
    if (!report) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    report(user, line, severity, msg);
}

/* the calls against the line's tools; returns the number of warnings */
static uint32_t check_calls(const ft_rendered *r, uint32_t line, ft_report_fn report, void *user) {
    grammar *g = NULL;
    if (grammar_compile(r->tools, strlen(r->tools), NULL, &g) != NEEDLE_OK) {
        report_f(report, user, line, FT_WARNING, "its tools do not compile to a grammar (%s); calls not checked",
                 needle_last_error());
        return 1;
    }
    uint32_t warnings = 0;
    cJSON *calls = cJSON_Parse(r->answers);
    if (!cJSON_IsArray(calls)) {
        report_f(report, user, line, FT_WARNING, "the answers are not a JSON list of calls");
        warnings++;
    } else {
        const cJSON *c;
        int k = 0;
        cJSON_ArrayForEach(c, calls) {
            const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "name"));
            int known = 0;
            for (uint32_t i = 0; name && i < grammar_tool_count(g) && !known; i++)
                known = !strcmp(grammar_tool_name(g, i), name);
            if (!known) {
                report_f(report, user, line, FT_WARNING, "call %d names the tool \"%s\", which the line's tools do not have",
                         k + 1, name ? name : "(no name)");
                warnings++;
            }
            k++;
        }
        /* the compact form (answers given as a string keep their own spacing) through the
         * grammar the engine decodes with: what it admits is what the model can answer */
        char *compact = NULL;
        size_t n = 0;
        if (!warnings && grammar_json_canon(r->answers, strlen(r->answers), &compact, &n) == NEEDLE_OK) {
            grammar_state s;
            grammar_state_init(g, &s);
            size_t at = 0;
            while (at < n && grammar_accept_byte(g, &s, (uint8_t)compact[at])) at++;
            if (at < n || !grammar_is_complete(g, &s)) {
                report_f(report, user, line, FT_WARNING,
                         "the calls are not admitted by the tools' schemas (the engine's grammar stops at byte "
                         "%zu: \"%.40s\")",
                         at, compact + (at > 20 ? at - 20 : 0));
                warnings++;
            }
        }
        free(compact);
    }
    cJSON_Delete(calls);
    grammar_free(g);
    return warnings;
}

/* ---- the data file ------------------------------------------------------------------- */

static int tokenize(const needle_model *m, const char *text, int32_t **ids, size_t *n) {
    size_t cap = strlen(text) + 16, got = 0;
    for (;;) {
        int32_t *buf = malloc(cap * sizeof *buf);
        if (!buf) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        const int st = needle_tokenize(m, text, strlen(text), buf, cap, &got);
        if (st == NEEDLE_OK) {
            *ids = buf;
            *n = got;
            return 0;
        }
        free(buf);
        if (st != NEEDLE_ERR_BUFFER_TOO_SMALL) return st;
        cap = got;
    }
}

void ft_data_free(ft_data *d) {
    if (!d) return;
    for (uint32_t i = 0; i < d->n; i++) free(d->ex[i].ids);
    free(d->ex);
    memset(d, 0, sizeof *d);
}

static int add_example(const needle_model *m, const ft_rendered *r, uint32_t line, ft_data *d, uint32_t *cap) {
    int32_t *p = NULL, *t = NULL;
    size_t np = 0, nt = 0;
    int st = tokenize(m, r->prompt, &p, &np);
    if (!st) st = tokenize(m, r->target, &t, &nt);
    if (!st && d->n == *cap) {
        const uint32_t nc = *cap ? 2 * *cap : 64;
        ft_example *e = realloc(d->ex, nc * sizeof *e);
        if (!e) st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
        else {
            d->ex = e;
            *cap = nc;
        }
    }
    int32_t *ids = st ? NULL : malloc((np + nt + 2) * sizeof *ids);
    if (!st && !ids) st = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    if (!st) {
        ids[0] = NEEDLE_TOKEN_BOS;
        memcpy(ids + 1, p, np * sizeof *ids);
        memcpy(ids + 1 + np, t, nt * sizeof *ids);
        ids[1 + np + nt] = NEEDLE_TOKEN_EOS;
        d->ex[d->n++] = (ft_example){.line = line, .ids = ids, .n = (uint32_t)(np + nt + 2), .n_prompt = (uint32_t)np};
    }
    free(p);
    free(t);
    return st;
}

int ft_data_load(const needle_model *m, const char *text, size_t len, uint32_t max_len, ft_report_fn report,
                 void *user, ft_data *out) {
    memset(out, 0, sizeof *out);
    if (max_len < 2) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "max_len %u: at least 2", max_len);
    uint32_t cap = 0, line = 0;
    int st = 0;
    const char *p = text, *end = text + len;
    while (p < end && !st) {
        /* Python's universal newlines: \n, \r\n and \r end a line */
        const char *e = p;
        while (e < end && *e != '\n' && *e != '\r') e++;
        line++;
        char why[512];
        ft_rendered r;
        const int got = ft_render_line(p, (size_t)(e - p), &r, why, sizeof why);
        if (got < 0) {
            report_f(report, user, line, FT_ERROR, "%s", why);
            st = needle_fail(got, "line %u: %s", line, why);
        } else if (got == 0 && strcmp(why, "blank")) {
            out->skipped++;
            report_f(report, user, line, FT_SKIPPED, "skipped: %s", why);
        } else if (got == 1) {
            out->warnings += check_calls(&r, line, report, user);
            if ((st = add_example(m, &r, line, out, &cap)))
                report_f(report, user, line, FT_ERROR, "cannot tokenize: %s", needle_last_error());
            ft_rendered_free(&r);
        }
        p = e < end && *e == '\r' && e + 1 < end && e[1] == '\n' ? e + 2 : e + (e < end);
    }
    if (st) {
        ft_data_free(out);
        return st;
    }
    /* fit_max_len: the smallest power of two from 128 holding the longest, capped */
    uint32_t longest = 0, bucket = FT_MIN_BUCKET;
    for (uint32_t i = 0; i < out->n; i++)
        if (out->ex[i].n > longest) longest = out->ex[i].n;
    const uint32_t limit = longest < max_len ? longest : max_len;
    while (bucket < limit) bucket *= 2;
    out->seq_len = bucket < max_len ? bucket : max_len;
    for (uint32_t i = 0; i < out->n; i++)
        if (out->ex[i].n > out->seq_len) {
            out->warnings++;
            report_f(report, user, out->ex[i].line, FT_WARNING,
                     "%u tokens, longer than the sequence length %u (--max-len %u): cut there, as the official "
                     "fine-tuner does%s",
                     out->ex[i].n, out->seq_len, max_len,
                     out->ex[i].n_prompt + 1 >= out->seq_len ? " (nothing of its target is left)" : "");
        }
    return 0;
}

void ft_data_row(const ft_data *d, uint32_t i, int32_t *ids, uint8_t *mask) {
    const ft_example *x = &d->ex[i];
    for (uint32_t k = 0; k < d->seq_len; k++) {
        ids[k] = k < x->n ? x->ids[k] : NEEDLE_TOKEN_PAD;
        mask[k] = k < x->n && k >= 1 + x->n_prompt;
    }
}
