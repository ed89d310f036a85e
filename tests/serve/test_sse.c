/* The SSE side of needle serve (tools/serve/openai_response.c): the call array, fed in any
 * split (byte by byte, or whole), becomes chat.completion.chunk events whose tool_calls
 * deltas rebuild the same calls, with braces, quotes and escapes inside strings, several
 * calls, and multi-byte characters split across pieces (every event stays valid JSON). */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "harness.h"
#include "serve.h"

/* The calls (name + arguments text per index) and content rebuilt from SSE text. */
typedef struct rebuilt {
    char names[4][64], args[4][512], content[512], finish[32];
    int n_calls, events, bad_events, done;
} rebuilt;

static void append(char *dst, size_t cap, const char *s) {
    if (s && strlen(dst) + strlen(s) < cap) strcat(dst, s);
}

static void rebuild(const char *sse, rebuilt *r) {
    memset(r, 0, sizeof *r);
    const char *p = sse;
    while ((p = strstr(p, "data: ")) != NULL) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        if (!end) break;
        if (!strncmp(p, "[DONE]", 6)) {
            r->done = 1;
            break;
        }
        cJSON *ev = cJSON_ParseWithLength(p, (size_t)(end - p));
        r->events++;
        const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(ev, "choices"), 0);
        const cJSON *delta = cJSON_GetObjectItem(choice, "delta");
        if (!ev || !delta) r->bad_events++;
        append(r->content, sizeof r->content, cJSON_GetStringValue(cJSON_GetObjectItem(delta, "content")));
        const char *fin = cJSON_GetStringValue(cJSON_GetObjectItem(choice, "finish_reason"));
        if (fin) snprintf(r->finish, sizeof r->finish, "%s", fin);
        const cJSON *tc;
        cJSON_ArrayForEach(tc, cJSON_GetObjectItem(delta, "tool_calls")) {
            const int i = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(tc, "index"));
            if (i < 0 || i >= 4) {
                r->bad_events++;
                continue;
            }
            if (i + 1 > r->n_calls) r->n_calls = i + 1;
            const cJSON *fn = cJSON_GetObjectItem(tc, "function");
            append(r->names[i], sizeof r->names[i], cJSON_GetStringValue(cJSON_GetObjectItem(fn, "name")));
            append(r->args[i], sizeof r->args[i], cJSON_GetStringValue(cJSON_GetObjectItem(fn, "arguments")));
        }
        cJSON_Delete(ev);
        p = end;
    }
}

/* Streams `calls` in pieces of `step` bytes (0: whole) and checks the rebuilt calls. */
static void check_stream(const char *calls, int kind, size_t step) {
    job *j = job_new();
    if (!j) return;
    j->chat_kind = kind;
    char envelope[2048];
    snprintf(envelope, sizeof envelope, "{\"type\":\"call\",\"success\":true,\"function_calls\":%s}", calls);
    j->envelope = strdup(envelope);
    sse_stream s;
    sse_init(&s, "chatcmpl-test", "m", kind);
    buf out = {0};
    const size_t n = strlen(calls);
    for (size_t i = 0; i < n; i += step ? step : n)
        sse_feed(&s, calls + i, step && step < n - i ? step : n - i, &out);
    sse_finish(&s, j, &out);
    rebuilt r;
    rebuild(out.data, &r);
    CHECK_MSG(r.done && r.bad_events == 0 && r.events >= 2, "step %zu: %s", step, out.data);
    cJSON *want = cJSON_Parse(calls);
    const int n_want = cJSON_GetArraySize(want);
    if (kind == CHAT_TOOLS) {
        CHECK_EQ_INT(r.n_calls, n_want);
        for (int i = 0; i < n_want && i < r.n_calls; i++) {
            const cJSON *c = cJSON_GetArrayItem(want, i);
            CHECK_MSG(!strcmp(r.names[i], cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"))),
                      "call %d name %s", i, r.names[i]);
            cJSON *args = cJSON_Parse(r.args[i]);
            CHECK_MSG(args && cJSON_Compare(args, cJSON_GetObjectItem(c, "arguments"), 1),
                      "step %zu call %d arguments %s", step, i, r.args[i]);
            cJSON_Delete(args);
        }
        CHECK(!strcmp(r.finish, n_want ? "tool_calls" : "stop"));
    } else {
        cJSON *args = cJSON_Parse(r.content);
        CHECK_MSG(args && cJSON_Compare(args, cJSON_GetObjectItem(cJSON_GetArrayItem(want, 0), "arguments"), 1),
                  "step %zu content %s", step, r.content);
        cJSON_Delete(args);
        CHECK(!strcmp(r.finish, "stop") && r.n_calls == 0);
    }
    cJSON_Delete(want);
    buf_free(&out);
    sse_free(&s);
    job_release(j);
}

static const char *const CASES[] = {
    "[]",
    "[{\"name\":\"get_weather\",\"arguments\":{\"location\":\"Paris\"}}]",
    "[{\"name\":\"a\",\"arguments\":{\"s\":\"x}{\\\"],\\\\\",\"n\":[1,{\"k\":{}}],\"name\":\"no\"}},"
    "{\"name\":\"b_2\",\"arguments\":{}}]",
    "[{\"name\":\"c\",\"arguments\":{\"city\":\"Z\xC3\xBCrich \xE6\x9D\xB1\xE4\xBA\xAC \xF0\x9F\x98\x80\"}}]",
};

static void test_tool_call_deltas(void) {
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++)
        for (size_t step = 0; step <= 3; step++) check_stream(CASES[c], CHAT_TOOLS, step);
}

static void test_content_deltas(void) {
    for (size_t c = 1; c < sizeof CASES / sizeof CASES[0]; c++)
        if (c != 2) /* one call: response_format gives exactly one */
            for (size_t step = 0; step <= 2; step++) check_stream(CASES[c], CHAT_CONTENT, step);
}

/* A failed job streams an error event, then [DONE]. */
static void test_error_event(void) {
    job *j = job_new();
    if (!j) return;
    j->http_status = 504;
    j->error_code = strdup("cancelled");
    j->error = strdup("the request timed out");
    sse_stream s;
    sse_init(&s, "chatcmpl-x", "m", CHAT_TOOLS);
    buf out = {0};
    sse_finish(&s, j, &out);
    CHECK(out.data && strstr(out.data, "\"code\":\"cancelled\"") && strstr(out.data, "data: [DONE]"));
    buf_free(&out);
    sse_free(&s);
    job_release(j);
}

int main(void) {
    RUN(test_tool_call_deltas);
    RUN(test_content_deltas);
    RUN(test_error_event);
    return test_summary();
}
