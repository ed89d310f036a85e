/* chat.completion responses and their streamed form (SSE chat.completion.chunk events):
 * the call array the engine decodes arrives a few bytes at a time, and a small scanner
 * turns it into OpenAI's tool_calls deltas: a call's header (index, id, name) once its name
 * is complete, then its arguments' JSON text as it grows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "serve.h"

int openai_job_error(const job *j, char **code, char **message) {
    if (j->http_status) {
        *code = strdup(j->error_code ? j->error_code : "error");
        *message = strdup(j->error ? j->error : "error");
        return j->http_status;
    }
    if (j->chat_kind == CHAT_NONE) return 0;
    cJSON *env = cJSON_Parse(j->envelope ? j->envelope : "");
    if (!env) {
        *code = strdup("internal_error");
        *message = strdup("the engine's envelope did not parse");
        return 500;
    }
    int status = 0;
    const char *ec = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(env, "error_code"));
    const char *err = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(env, "error"));
    const cJSON *cut = cJSON_GetObjectItemCaseSensitive(env, "input_truncated");
    if (cut) { /* the engine answered only the end of the input: the client's to shorten */
        char msg[200];
        snprintf(msg, sizeof msg, "the last message (%.0f tokens) is longer than the model's attention window "
                 "(%.0f positions)", cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(cut, "tokens")),
                 cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(cut, "window")));
        *code = strdup("context_length_exceeded");
        *message = strdup(msg);
        cJSON_Delete(env);
        return 400;
    }
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(env, "success")) && ec &&
        strcmp(ec, "max_tokens") != 0) {
        /* never a silent truncation: a prompt over the context is the client's to shorten */
        status = !strcmp(ec, "context_full") || !strcmp(ec, "invalid_input") ? 400 : 500;
        *code = strdup(!strcmp(ec, "context_full") ? "context_length_exceeded" : ec);
        *message = strdup(err ? err : ec);
    }
    cJSON_Delete(env);
    return status;
}

static const char *finish_reason(const cJSON *env, int n_calls, int kind) {
    if (env && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(env, "success"))) return "length";
    return kind == CHAT_TOOLS && n_calls > 0 ? "tool_calls" : "stop";
}

static void add_usage(cJSON *root, const job *j) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)j->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(j->prompt_tokens + j->completion_tokens));
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens",
                            (double)j->cached_tokens);
}

char *openai_chat_response(const job *j, const char *model, const char *id) {
    cJSON *env = j->envelope ? cJSON_Parse(j->envelope) : NULL;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(env, "function_calls");
    const int n_calls = cJSON_GetArraySize(calls);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", id);
    cJSON_AddStringToObject(root, "object", "chat.completion");
    cJSON_AddNumberToObject(root, "created", (double)time(NULL));
    cJSON_AddStringToObject(root, "model", model);
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    cJSON *msg = cJSON_AddObjectToObject(choice, "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    if (j->chat_kind == CHAT_TOOLS && n_calls > 0) {
        cJSON_AddNullToObject(msg, "content");
        cJSON *tc = cJSON_AddArrayToObject(msg, "tool_calls");
        int i = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, calls) {
            char call_id[80];
            snprintf(call_id, sizeof call_id, "call_%s_%d", id + (strncmp(id, "chatcmpl-", 9) ? 0 : 9), i++);
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "id", call_id);
            cJSON_AddStringToObject(t, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(t, "function");
            cJSON_AddStringToObject(fn, "name", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "name")));
            char *args = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "arguments"));
            cJSON_AddStringToObject(fn, "arguments", args ? args : "{}");
            cJSON_free(args);
            cJSON_AddItemToArray(tc, t);
        }
    } else if (j->chat_kind == CHAT_CONTENT && n_calls > 0) {
        char *args = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 0), "arguments"));
        cJSON_AddStringToObject(msg, "content", args ? args : "");
        cJSON_free(args);
    } else {
        cJSON_AddStringToObject(msg, "content", "");
    }
    cJSON_AddStringToObject(choice, "finish_reason", finish_reason(env, n_calls, j->chat_kind));
    add_usage(root, j);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    cJSON_Delete(env);
    return text;
}

/* ---- streaming ------------------------------------------------------------------------------ */

void sse_init(sse_stream *s, const char *id, const char *model, int kind) {
    memset(s, 0, sizeof *s);
    snprintf(s->id, sizeof s->id, "%s", id);
    s->model = model;
    s->created = (long)time(NULL);
    s->kind = kind;
}

void sse_free(sse_stream *s) {
    buf_free(&s->name);
    buf_free(&s->args);
}

/* One chunk event whose delta is `delta` (taken) and finish_reason `finish` (or null). */
static void emit(sse_stream *s, cJSON *delta, const char *finish, buf *out) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", s->id);
    cJSON_AddStringToObject(root, "object", "chat.completion.chunk");
    cJSON_AddNumberToObject(root, "created", (double)s->created);
    cJSON_AddStringToObject(root, "model", s->model);
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    cJSON_AddItemToObject(choice, "delta", delta);
    if (finish) cJSON_AddStringToObject(choice, "finish_reason", finish);
    else cJSON_AddNullToObject(choice, "finish_reason");
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    buf_puts(out, "data: ");
    buf_puts(out, text ? text : "{}");
    buf_puts(out, "\n\n");
    cJSON_free(text);
}

static void emit_role(sse_stream *s, buf *out) {
    if (s->sent_role) return;
    s->sent_role = 1;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "role", "assistant");
    if (s->kind == CHAT_CONTENT) cJSON_AddStringToObject(d, "content", "");
    else cJSON_AddNullToObject(d, "content");
    emit(s, d, NULL, out);
}

/* A tool_calls delta for call `index`: its header when name is given, else arguments. */
static cJSON *tool_delta(sse_stream *s, int index, const char *name, const char *args) {
    cJSON *d = cJSON_CreateObject(), *t = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), t);
    cJSON_AddNumberToObject(t, "index", index);
    cJSON *fn;
    if (name) {
        char call_id[80];
        snprintf(call_id, sizeof call_id, "call_%s_%d", s->id + (strncmp(s->id, "chatcmpl-", 9) ? 0 : 9), index);
        cJSON_AddStringToObject(t, "id", call_id);
        cJSON_AddStringToObject(t, "type", "function");
        fn = cJSON_AddObjectToObject(t, "function");
        cJSON_AddStringToObject(fn, "name", name);
        cJSON_AddStringToObject(fn, "arguments", "");
    } else {
        fn = cJSON_AddObjectToObject(t, "function");
        cJSON_AddStringToObject(fn, "arguments", args);
    }
    return d;
}

/* Bytes of s that end in a complete UTF-8 character (a split one waits for its rest). */
static size_t complete_utf8(const char *b, size_t n) {
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)b[i - 1] & 0xC0) == 0x80) {
        i--;
        back++;
    }
    if (i == 0) return n;
    const unsigned char lead = (unsigned char)b[i - 1];
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return back + 1 < need ? i - 1 : n;
}

static void flush_args(sse_stream *s, buf *out) {
    const size_t n = s->args.len ? complete_utf8(s->args.data, s->args.len) : 0;
    if (!n) return;
    char *text = malloc(n + 1);
    if (!text) return;
    memcpy(text, s->args.data, n);
    text[n] = 0;
    if (s->kind == CHAT_CONTENT) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "content", text);
        emit(s, d, NULL, out);
    } else {
        emit(s, tool_delta(s, s->calls - 1, NULL, text), NULL, out);
    }
    free(text);
    memmove(s->args.data, s->args.data + n, s->args.len - n + 1);
    s->args.len -= n;
}

static void scan(sse_stream *s, char c, buf *out) {
    if (s->in_args) {
        buf_put(&s->args, &c, 1);
        if (s->in_str) {
            if (s->esc) s->esc = 0;
            else if (c == '\\') s->esc = 1;
            else if (c == '"') s->in_str = 0;
        } else if (c == '"') {
            s->in_str = 1;
        } else if (c == '{' || c == '[') {
            s->args_depth++;
        } else if ((c == '}' || c == ']') && --s->args_depth == 0) {
            /* the call's arguments are whole: send them before a next call's header */
            s->in_args = 0;
            flush_args(s, out);
        }
        return;
    }
    if (s->in_str) {
        buf *into = s->in_name ? &s->name : NULL;
        if (s->esc) s->esc = 0;
        else if (c == '\\') s->esc = 1;
        else if (c == '"') {
            s->in_str = 0;
            if (s->in_key) {
                s->in_key = 0;
                s->key[s->key_len < sizeof s->key ? s->key_len : sizeof s->key - 1] = 0;
            } else if (s->in_name) {
                s->in_name = 0;
                s->calls++;
                if (s->kind == CHAT_TOOLS)
                    emit(s, tool_delta(s, s->calls - 1, s->name.data ? s->name.data : "", NULL), NULL, out);
            }
            return;
        }
        if (s->in_key && s->key_len < sizeof s->key - 1) s->key[s->key_len++] = c;
        if (into) buf_put(into, &c, 1);
        return;
    }
    switch (c) {
    case '"':
        s->in_str = 1;
        if (s->depth == 2 && s->expect_key) {
            s->in_key = 1;
            s->key_len = 0;
            s->expect_key = 0;
        } else if (s->depth == 2 && s->value_next && !strcmp(s->key, "name")) {
            s->in_name = 1;
            buf_free(&s->name);
            buf_puts(&s->name, "");
        }
        s->value_next = 0;
        break;
    case ':':
        if (s->depth == 2) s->value_next = 1;
        break;
    case ',':
        if (s->depth == 2) s->expect_key = 1;
        s->value_next = 0;
        break;
    case '{':
        if (s->depth == 2 && s->value_next && !strcmp(s->key, "arguments")) {
            s->in_args = 1;
            s->args_depth = 1;
            buf_put(&s->args, &c, 1);
        } else {
            s->depth++;
            if (s->depth == 2) s->expect_key = 1;
        }
        s->value_next = 0;
        break;
    case '[':
        s->depth++;
        s->value_next = 0;
        break;
    case '}':
    case ']':
        s->depth--;
        s->value_next = 0;
        break;
    default: break;
    }
}

void sse_feed(sse_stream *s, const char *bytes, size_t n, buf *out) {
    emit_role(s, out);
    for (size_t i = 0; i < n; i++) scan(s, bytes[i], out);
    flush_args(s, out);
}

void sse_finish(sse_stream *s, const job *j, buf *out) {
    emit_role(s, out);
    char *code = NULL, *message = NULL;
    const int status = openai_job_error(j, &code, &message);
    if (status) {
        /* the status line went out with the first byte: the error travels as an event */
        char *body = openai_error_body(status, code ? code : "error", message ? message : "error");
        buf_puts(out, "data: ");
        buf_puts(out, body ? body : "{}");
        buf_puts(out, "\n\n");
        cJSON_free(body);
    } else {
        cJSON *env = j->envelope ? cJSON_Parse(j->envelope) : NULL;
        const int n_calls = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(env, "function_calls"));
        /* the call array streamed whole: what is left is an argument tail held for UTF-8 */
        if (s->args.len) {
            cJSON *d = s->kind == CHAT_CONTENT ? cJSON_CreateObject()
                                               : tool_delta(s, s->calls - 1, NULL, s->args.data);
            if (s->kind == CHAT_CONTENT) cJSON_AddStringToObject(d, "content", s->args.data);
            emit(s, d, NULL, out);
            s->args.len = 0;
        }
        emit(s, cJSON_CreateObject(), finish_reason(env, n_calls, j->chat_kind), out);
        cJSON_Delete(env);
    }
    free(code);
    free(message);
    buf_puts(out, "data: [DONE]\n\n");
}
