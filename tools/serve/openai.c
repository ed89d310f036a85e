/* OpenAI chat.completions over the engine's turns.
 *
 * Request mapping: system (and developer) messages become the engine's system text; the
 * tools (both shapes: {"type": "function", "function": {...}} and bare {name, ...}) its
 * tools; the rest of the messages a conversation replayed turn by turn: each user message
 * (consecutive ones joined) or run of tool messages is a turn, and the assistant message
 * after it the answer to replay (needle_session_append_turn). The last turn, a user or tool
 * message, is the one answered. tool_choice: "auto", "none" (answered without the model:
 * no calls), "required" (exactly one call), or a named function (the tools narrowed to
 * it, which makes it an extraction). response_format json_schema is an extraction with
 * the schema as the one tool's parameters; its arguments are the message content. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

uint64_t openai_hash(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

char *openai_error_body(int status, const char *code, const char *message) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    const char *type = status == 401   ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 429 || status == 503 ? "server_overloaded"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNullToObject(e, "param");
    cJSON_AddStringToObject(e, "code", code);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* Deepest nesting of arrays and objects in JSON text (strings skipped). */
static long json_depth(const char *s, size_t n) {
    long depth = 0, max = 0;
    int in_str = 0, esc = 0;
    for (size_t i = 0; i < n; i++) {
        const char c = s[i];
        if (in_str) {
            if (esc) esc = 0;
            else if (c == '\\') esc = 1;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max) max = depth;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return max;
}

typedef struct parse_error {
    int *status;
    char **code, **message;
} parse_error;

static job *fail(parse_error *pe, job *j, cJSON *root, int status, const char *code,
                 const char *fmt, const char *arg) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    *pe->status = status;
    *pe->code = strdup(code);
    *pe->message = strdup(msg);
    job_release(j);
    cJSON_Delete(root);
    return NULL;
}

/* A message's content as text: a string, or the text parts of an array of parts. NULL when
 * it is neither (or null). */
static char *content_text(const cJSON *content) {
    if (cJSON_IsString(content)) return strdup(content->valuestring);
    if (!cJSON_IsArray(content)) return NULL;
    buf b = {0};
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(part, "text"));
        if (!t) {
            buf_free(&b);
            return NULL;
        }
        if (b.len) buf_puts(&b, "\n");
        buf_puts(&b, t);
    }
    if (!b.data) buf_puts(&b, "");
    if (b.oom) {
        buf_free(&b);
        return NULL;
    }
    return b.data;
}

/* The common request fields: sampling and the token cap. */
static const char *read_sampling(const cJSON *root, const serve_config *cfg, job *j) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens");
    if (!mt || cJSON_IsNull(mt)) mt = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
    if (mt && !cJSON_IsNull(mt)) {
        if (!cJSON_IsNumber(mt) || mt->valuedouble < 1 || mt->valuedouble > (double)cfg->max_tokens)
            return "max_tokens must be an integer from 1 to the server's --max-tokens";
        j->params.max_new_tokens = (int32_t)mt->valuedouble;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "temperature");
    if (t && !cJSON_IsNull(t)) {
        if (!cJSON_IsNumber(t) || !(t->valuedouble >= 0) || t->valuedouble > 2)
            return "temperature must be a number from 0 to 2";
        j->params.temperature = (float)t->valuedouble;
    }
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (seed && !cJSON_IsNull(seed)) {
        if (!cJSON_IsNumber(seed) || seed->valuedouble < 0 || seed->valuedouble > 9.007199254740992e15)
            return "seed must be a non-negative integer";
        j->params.seed = (uint64_t)seed->valuedouble;
    }
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "n");
    if (n && !cJSON_IsNull(n) && !(cJSON_IsNumber(n) && n->valuedouble == 1))
        return "only n = 1 is supported";
    return NULL;
}

static int add_turn(job *j, char *text, int32_t turn) {
    serve_turn *t = realloc(j->turns, (j->n_turns + 1) * sizeof *t);
    if (!t) {
        free(text);
        return -1;
    }
    j->turns = t;
    t[j->n_turns].text = text;
    t[j->n_turns].turn = turn;
    t[j->n_turns].calls = NULL;
    j->n_turns++;
    return 0;
}

/* Ends the turn gathered in *pending (its tool results become one JSON array, or the one
 * result itself) as a job turn answered by `calls` (taken; NULL for the turn to answer). */
static int close_turn(job *j, buf *pending, int32_t turn, int tool_results, char *calls) {
    if (turn == NEEDLE_TURN_TOOL_RESULT) buf_puts(pending, "]");
    if (pending->oom) {
        free(calls);
        return -1;
    }
    char *text = pending->data;
    if (tool_results == 1 && turn == NEEDLE_TURN_TOOL_RESULT) {
        text[pending->len - 1] = 0;
        memmove(text, text + 1, pending->len - 1);
    }
    memset(pending, 0, sizeof *pending);
    if (add_turn(j, text, turn)) {
        free(calls);
        return -1;
    }
    j->turns[j->n_turns - 1].calls = calls;
    return 0;
}

/* An assistant message's tool_calls as the engine's call array (malloc'd JSON). */
static char *assistant_calls(const cJSON *msg, const char **why) {
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (!cJSON_IsArray(calls)) calls = NULL;
    cJSON *out = cJSON_CreateArray();
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
        const char *args = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
        cJSON *parsed = args ? cJSON_Parse(args) : NULL;
        if (!name || !cJSON_IsObject(parsed)) {
            *why = "an assistant tool call needs function.name and function.arguments (a JSON "
                   "object as a string)";
            cJSON_Delete(parsed);
            cJSON_Delete(out);
            return NULL;
        }
        cJSON *call = cJSON_CreateObject();
        cJSON_AddStringToObject(call, "name", name);
        cJSON_AddItemToObject(call, "arguments", parsed);
        cJSON_AddItemToArray(out, call);
    }
    char *text = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    return text;
}

/* Keys the prefix cache: the same system text and tools give the same prefix. */
static void set_key(job *j) {
    uint64_t h = openai_hash(OPENAI_HASH_SEED, j->system, strlen(j->system));
    h = openai_hash(h, "\x01", 1);
    j->key = openai_hash(h, j->tools, strlen(j->tools));
}

/* Sets j->tools from the request's tools, tool_choice and response_format. */
static const char *read_tools(const cJSON *root, const serve_config *cfg, job *j, int *kind) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    const char *ftype = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(format, "type"));
    cJSON *use = NULL;
    *kind = CHAT_TOOLS;
    if (format && !cJSON_IsNull(format) && !(ftype && !strcmp(ftype, "text"))) {
        if (tools && !cJSON_IsNull(tools) && cJSON_GetArraySize(tools) > 0)
            return "response_format together with tools is not supported: send one or the other";
        const cJSON *schema = NULL;
        const char *name = "response";
        if (ftype && !strcmp(ftype, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(format, "json_schema");
            schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
            const char *n = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(js, "name"));
            if (n) name = n;
            if (!cJSON_IsObject(schema)) return "response_format.json_schema.schema must be an object";
        } else if (!ftype || strcmp(ftype, "json_object") != 0) {
            return "response_format.type must be text, json_object or json_schema";
        }
        use = cJSON_CreateArray();
        cJSON *tool = cJSON_CreateObject();
        cJSON_AddStringToObject(tool, "name", name);
        cJSON_AddStringToObject(tool, "description", "Answer in this JSON shape.");
        cJSON_AddItemToObject(tool, "parameters",
                              schema ? cJSON_Duplicate(schema, 1)
                                     : cJSON_Parse("{\"type\":\"object\",\"additionalProperties\":true}"));
        cJSON_AddItemToArray(use, tool);
        *kind = CHAT_CONTENT;
    } else {
        if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0)
            return "tools must be a non-empty array (this model only answers with tool calls)";
        if (cJSON_GetArraySize(tools) > cfg->max_tools) return "too many tools for this server";
        use = cJSON_Duplicate(tools, 1);
        const char *mode = cJSON_GetStringValue(choice);
        if (mode && !strcmp(mode, "none")) *kind = CHAT_NONE;
        else if (mode && !strcmp(mode, "required")) j->params.extract = 1;
        else if (mode && strcmp(mode, "auto") != 0) {
            cJSON_Delete(use);
            return "tool_choice must be auto, none, required or {\"type\": \"function\", ...}";
        } else if (cJSON_IsObject(choice)) {
            const char *want = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(choice, "function"), "name"));
            cJSON *only = NULL, *t;
            cJSON_ArrayForEach(t, use) {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
                const char *n = cJSON_GetStringValue(
                    cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(fn) ? fn : t, "name"));
                if (want && n && !strcmp(n, want)) only = t;
            }
            if (!only) {
                cJSON_Delete(use);
                return "tool_choice names a function that is not in tools";
            }
            cJSON *narrowed = cJSON_CreateArray();
            cJSON_AddItemToArray(narrowed, cJSON_Duplicate(only, 1));
            cJSON_Delete(use);
            use = narrowed;
        }
    }
    j->tools = cJSON_PrintUnformatted(use);
    cJSON_Delete(use);
    return j->tools ? NULL : "out of memory";
}

job *openai_parse_chat(const char *body, size_t len, const serve_config *cfg, int *status,
                       char **code, char **message) {
    parse_error pe = {status, code, message};
    job *j = job_new();
    if (!j) return fail(&pe, NULL, NULL, 500, "internal_error", "out of memory%s", NULL);
    if (json_depth(body, len) > cfg->max_depth)
        return fail(&pe, j, NULL, 400, "invalid_request_error", "the JSON body nests deeper than "
                    "the server's limit%s", NULL);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(root))
        return fail(&pe, j, root, 400, "invalid_request_error", "the body is not a JSON object%s",
                    NULL);
    const char *why = read_sampling(root, cfg, j);
    if (why) return fail(&pe, j, root, 400, "invalid_request_error", "%s", why);
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(root, "stream");
    if (stream && !cJSON_IsNull(stream) && !cJSON_IsBool(stream))
        return fail(&pe, j, root, 400, "invalid_request_error", "stream must be a boolean%s", NULL);
    int kind;
    if ((why = read_tools(root, cfg, j, &kind)))
        return fail(&pe, j, root, 400, "invalid_request_error", "%s", why);
    j->stream = cJSON_IsTrue(stream);
    j->chat_kind = kind;

    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0)
        return fail(&pe, j, root, 400, "invalid_request_error", "messages must be a non-empty "
                    "array%s", NULL);
    if (cJSON_GetArraySize(messages) > cfg->max_messages)
        return fail(&pe, j, root, 400, "invalid_request_error", "too many messages%s", NULL);
    buf system = {0}, pending = {0};
    int32_t pending_turn = -1; /* the turn being gathered */
    int tool_results = 0;
    const cJSON *m;
    why = NULL;
    cJSON_ArrayForEach(m, messages) {
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!role) {
            why = "every message needs a role";
            break;
        }
        if (!strcmp(role, "system") || !strcmp(role, "developer")) {
            char *t = content_text(content);
            if (!t) {
                why = "a system message needs text content";
                break;
            }
            if (system.len) buf_puts(&system, "\n");
            buf_puts(&system, t);
            free(t);
        } else if (!strcmp(role, "user") || !strcmp(role, "tool")) {
            const int32_t turn = role[0] == 'u' ? NEEDLE_TURN_QUERY : NEEDLE_TURN_TOOL_RESULT;
            char *t = content_text(content);
            if (!t) {
                why = "user and tool messages need text content";
                break;
            }
            if (pending_turn == NEEDLE_TURN_QUERY && turn == NEEDLE_TURN_TOOL_RESULT) {
                why = "tool results must follow the assistant message with their calls";
                free(t);
                break;
            }
            if (pending_turn == NEEDLE_TURN_TOOL_RESULT && turn == NEEDLE_TURN_QUERY &&
                close_turn(j, &pending, pending_turn, tool_results, strdup("[]"))) {
                /* results the client answered nothing to: the model's answer was no call */
                why = "out of memory";
                free(t);
                break;
            }
            if (pending_turn == NEEDLE_TURN_TOOL_RESULT && turn == NEEDLE_TURN_QUERY) tool_results = 0;
            /* several tool results answer several calls: one turn holding a JSON array */
            if (turn == NEEDLE_TURN_TOOL_RESULT) {
                buf_puts(&pending, pending.len ? "," : "[");
                cJSON *parsed = cJSON_Parse(t);
                if (parsed) buf_puts(&pending, t);
                else {
                    cJSON *s = cJSON_CreateString(t);
                    char *q = cJSON_PrintUnformatted(s);
                    buf_puts(&pending, q ? q : "\"\"");
                    cJSON_free(q);
                    cJSON_Delete(s);
                }
                cJSON_Delete(parsed);
                tool_results++;
            } else {
                if (pending.len) buf_puts(&pending, "\n");
                buf_puts(&pending, t);
                if (!pending.data) buf_puts(&pending, "");
            }
            free(t);
            pending_turn = turn;
        } else if (!strcmp(role, "assistant")) {
            if (pending_turn < 0) {
                why = "an assistant message must follow a user or tool message";
                break;
            }
            char *calls = assistant_calls(m, &why);
            if (!calls) break;
            if (close_turn(j, &pending, pending_turn, tool_results, calls)) {
                why = "out of memory";
                break;
            }
            pending_turn = -1;
            tool_results = 0;
        } else {
            why = "message roles are system, developer, user, assistant and tool";
            break;
        }
    }
    if (!why && pending_turn < 0) why = "the last message must be a user or tool message";
    if (!why && close_turn(j, &pending, pending_turn, tool_results, NULL)) why = "out of memory";
    buf_free(&pending);
    if (system.oom) why = "out of memory";
    j->system = system.data ? system.data : strdup("");
    if (why) return fail(&pe, j, root, 400, "invalid_request_error", "%s", why);
    cJSON_Delete(root);
    set_key(j);
    return j;
}

job *openai_parse_needle(const char *body, size_t len, const serve_config *cfg, int *status,
                         char **code, char **message) {
    parse_error pe = {status, code, message};
    job *j = job_new();
    if (!j) return fail(&pe, NULL, NULL, 500, "internal_error", "out of memory%s", NULL);
    if (json_depth(body, len) > cfg->max_depth)
        return fail(&pe, j, NULL, 400, "invalid_request_error", "the JSON body nests deeper than "
                    "the server's limit%s", NULL);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(root))
        return fail(&pe, j, root, 400, "invalid_request_error", "the body is not a JSON object%s",
                    NULL);
    const char *why = read_sampling(root, cfg, j);
    if (why) return fail(&pe, j, root, 400, "invalid_request_error", "%s", why);
    const char *query = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "query"));
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *system = cJSON_GetObjectItemCaseSensitive(root, "system");
    /* the official playground sends the tools as JSON text */
    cJSON *parsed_tools = cJSON_IsString(tools) ? cJSON_Parse(tools->valuestring) : NULL;
    if (parsed_tools) {
        cJSON_ReplaceItemInObjectCaseSensitive(root, "tools", parsed_tools);
        tools = parsed_tools;
    }
    if (!query) return fail(&pe, j, root, 400, "invalid_request_error", "query must be a string%s", NULL);
    if (system && !cJSON_IsNull(system) && !cJSON_IsString(system))
        return fail(&pe, j, root, 400, "invalid_request_error", "system must be a string%s", NULL);
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0)
        return fail(&pe, j, root, 400, "invalid_request_error", "tools must be a non-empty array%s",
                    NULL);
    if (cJSON_GetArraySize(tools) > cfg->max_tools)
        return fail(&pe, j, root, 400, "invalid_request_error", "too many tools for this server%s",
                    NULL);
    j->tools = cJSON_PrintUnformatted(tools);
    j->system = strdup(cJSON_IsString(system) ? system->valuestring : "");
    char *text = strdup(query);
    cJSON_Delete(root);
    if (!text || !j->tools || !j->system) {
        free(text);
        return fail(&pe, j, NULL, 500, "internal_error", "out of memory%s", NULL);
    }
    if (add_turn(j, text, NEEDLE_TURN_QUERY)) /* frees text */
        return fail(&pe, j, NULL, 500, "internal_error", "out of memory%s", NULL);
    set_key(j);
    return j;
}
