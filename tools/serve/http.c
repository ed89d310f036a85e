/* libmicrohttpd glue. One thread per connection (MHD_USE_THREAD_PER_CONNECTION): a request
 * waits for its job on its own thread, and a streamed response's reader blocks there until
 * the worker has decoded more. The socket stays the connection thread's: that thread alone
 * peeks at it to notice a client that went away, and cancels the job. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "serve.h"

struct server {
    serve_config cfg;
    needle_model *m;
    pool *pool;
    struct MHD_Daemon *d;
    char *model_json;   /* GET /model */
    pthread_mutex_t mu;
    long in_flight;     /* requests between their first byte and their completion */
    unsigned long long counter;
    int draining;
    unsigned port;      /* the port bound (--port 0: the one the system chose) */
};

typedef struct conn {
    server *sv;
    struct MHD_Connection *c;
    serve_route route;
    int post;
    double t0;
    buf body;
    int too_large;
    int status;         /* what was answered, for the metrics */
    job *j;
    /* streaming */
    sse_stream sse;
    int sse_init;
    buf out;
    size_t out_pos, consumed;
    int finished;
    char id[48];
} conn;

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

static enum MHD_Result send_text(conn *k, int status, const char *type, const char *text, size_t len,
                                 const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    const enum MHD_Result rc = MHD_queue_response(k->c, (unsigned)status, r);
    MHD_destroy_response(r);
    k->status = status;
    return rc;
}

static enum MHD_Result send_json(conn *k, int status, const char *json) {
    return send_text(k, status, "application/json", json, strlen(json), NULL);
}

static enum MHD_Result send_error(conn *k, int status, const char *code, const char *message) {
    char *body = openai_error_body(status, code, message);
    if (!body) return MHD_NO;
    const enum MHD_Result rc = send_text(k, status, "application/json", body, strlen(body),
                                         status == 503 ? "1" : NULL);
    cJSON_free(body);
    return rc;
}

static serve_route route_of(const char *url) {
    if (!strcmp(url, "/v1/chat/completions")) return ROUTE_CHAT;
    if (!strcmp(url, "/v1/needle/complete") || !strcmp(url, "/complete")) return ROUTE_NEEDLE_COMPLETE;
    if (!strcmp(url, "/reset")) return ROUTE_RESET;
    if (!strcmp(url, "/v1/models")) return ROUTE_MODELS;
    if (!strcmp(url, "/health")) return ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return ROUTE_METRICS;
    if (!strcmp(url, "/") || !strcmp(url, "/index.html") || !strcmp(url, "/model")) return ROUTE_PLAYGROUND;
    if (!strcmp(url, "/try") || !strncmp(url, "/try/", 5)) return ROUTE_TRY;
    return ROUTE_OTHER;
}

/* Compares without stopping at the first difference, so timing tells nothing of the key. */
static int same_secret(const char *a, const char *b) {
    const size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++) diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

static int authorized(const server *sv, struct MHD_Connection *c) {
    if (!sv->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    return same_secret(h + 7, sv->cfg.api_key);
}

static void next_id(server *sv, const char *prefix, char *out, size_t cap) {
    pthread_mutex_lock(&sv->mu);
    const unsigned long long n = ++sv->counter;
    pthread_mutex_unlock(&sv->mu);
    snprintf(out, cap, "%s%08llx%08llx", prefix, (unsigned long long)time(NULL) & 0xffffffffULL, n);
}

/* ---- GET endpoints ------------------------------------------------------------------------------ */

static enum MHD_Result get_health(conn *k) {
    long queued, busy, sessions;
    pool_stats(k->sv->pool, &queued, &busy, &sessions);
    char text[256];
    snprintf(text, sizeof text, "{\"status\":\"%s\",\"queue_depth\":%ld,\"sessions_busy\":%ld,"
             "\"sessions\":%ld}", __atomic_load_n(&k->sv->draining, __ATOMIC_RELAXED) ? "draining" : "ok", queued, busy, sessions);
    return send_json(k, 200, text);
}

static enum MHD_Result get_metrics(conn *k) {
    buf b = {0};
    metrics_write(&b, k->sv->pool);
    const enum MHD_Result rc = b.oom ? send_error(k, 500, "internal_error", "out of memory")
                                     : send_text(k, 200, "text/plain; version=0.0.4", b.data, b.len, NULL);
    buf_free(&b);
    return rc;
}

static enum MHD_Result get_models(conn *k) {
    char text[512];
    snprintf(text, sizeof text, "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\","
             "\"created\":0,\"owned_by\":\"needle\"}]}", k->sv->cfg.model_name);
    return send_json(k, 200, text);
}

/* ---- POST endpoints ----------------------------------------------------------------------------- */

static ssize_t stream_reader(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    conn *k = cls;
    job *j = k->j;
    for (;;) {
        if (k->out_pos < k->out.len) {
            size_t n = k->out.len - k->out_pos;
            if (n > max) n = max;
            memcpy(out, k->out.data + k->out_pos, n);
            k->out_pos += n;
            return (ssize_t)n;
        }
        if (k->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        k->out.len = k->out_pos = 0;
        if (k->out.data) k->out.data[0] = 0;
        const int fd = conn_fd(k->c);
        pthread_mutex_lock(&j->mu);
        while (j->pieces.len == k->consumed && j->state != JOB_DONE) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
            if (!JOB_CANCELLED(j) && (serve_now_ms() > j->deadline_ms || serve_peer_closed(fd)))
                JOB_CANCEL(j);
        }
        const int done = j->state == JOB_DONE;
        buf fresh = {0};
        buf_put(&fresh, j->pieces.data + k->consumed, j->pieces.len - k->consumed);
        k->consumed = j->pieces.len;
        pthread_mutex_unlock(&j->mu);
        if (fresh.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (fresh.len) sse_feed(&k->sse, fresh.data, fresh.len, &k->out);
        buf_free(&fresh);
        if (done) {
            sse_finish(&k->sse, j, &k->out);
            k->finished = 1;
        }
        if (k->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static enum MHD_Result post_job(conn *k) {
    server *sv = k->sv;
    int status = 0;
    char *code = NULL, *message = NULL;
    job *j = k->route == ROUTE_CHAT
                 ? openai_parse_chat(k->body.data ? k->body.data : "", k->body.len, &sv->cfg, &status, &code, &message)
                 : openai_parse_needle(k->body.data ? k->body.data : "", k->body.len, &sv->cfg, &status, &code, &message);
    if (!j) {
        const enum MHD_Result rc = send_error(k, status, code ? code : "error", message ? message : "error");
        free(code);
        free(message);
        return rc;
    }
    k->j = j;
    next_id(sv, k->route == ROUTE_CHAT ? "chatcmpl-" : "cmpl-", k->id, sizeof k->id);
    if (j->chat_kind == CHAT_NONE) {
        /* tool_choice "none": this model only answers with calls, so there is nothing to run */
        if (j->stream) {
            sse_init(&k->sse, k->id, sv->cfg.model_name, CHAT_TOOLS);
            sse_finish(&k->sse, j, &k->out);
            sse_free(&k->sse);
            return send_text(k, 200, "text/event-stream", k->out.data, k->out.len, NULL);
        }
        char *text = openai_chat_response(j, sv->cfg.model_name, k->id);
        const enum MHD_Result rc = text ? send_json(k, 200, text) : MHD_NO;
        cJSON_free(text);
        return rc;
    }
    j->deadline_ms = serve_now_ms() + (double)sv->cfg.timeout_s * 1e3;
    if (pool_submit(sv->pool, j))
        return send_error(k, 503, "server_overloaded", "the request queue is full; retry later");
    const int streaming = j->stream && k->route == ROUTE_CHAT;
    /* A stream's status line waits for its first piece, so that a request the engine
     * refuses (tools, context) still gets its 4xx rather than an error event. */
    pool_wait(j, conn_fd(k->c), streaming);
    pthread_mutex_lock(&j->mu);
    const int done = j->state == JOB_DONE;
    pthread_mutex_unlock(&j->mu);
    status = done ? openai_job_error(j, &code, &message) : 0;
    if (status) {
        const enum MHD_Result rc = send_error(k, status, code ? code : "error", message ? message : "error");
        free(code);
        free(message);
        return rc;
    }
    free(code);
    free(message);
    if (streaming) {
        sse_init(&k->sse, k->id, sv->cfg.model_name, j->chat_kind);
        k->sse_init = 1;
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, k, NULL);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        const enum MHD_Result rc = MHD_queue_response(k->c, 200, r);
        MHD_destroy_response(r);
        k->status = 200;
        return rc;
    }
    if (k->route == ROUTE_NEEDLE_COMPLETE) {
        /* the envelope as the engine wrote it, with the server's timings */
        buf b = {0};
        buf_put(&b, j->envelope, strlen(j->envelope) - 1);
        buf_printf(&b, ",\"server\":{\"queue_ms\":%.1f,\"run_ms\":%.1f,\"prefix_cache_hit\":%s,"
                   "\"prompt_tokens\":%llu,\"cached_tokens\":%llu,\"completion_tokens\":%llu}}", j->queue_ms,
                   j->run_ms, j->cache_hit ? "true" : "false", (unsigned long long)j->prompt_tokens,
                   (unsigned long long)j->cached_tokens, (unsigned long long)j->completion_tokens);
        const enum MHD_Result rc = b.oom ? MHD_NO : send_json(k, 200, b.data);
        buf_free(&b);
        return rc;
    }
    char *text = openai_chat_response(j, sv->cfg.model_name, k->id);
    const enum MHD_Result rc = text ? send_json(k, 200, text) : send_error(k, 500, "internal_error", "out of memory");
    cJSON_free(text);
    return rc;
}

/* ---- the request handler --------------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    server *sv = cls;
    conn *k = *con_cls;
    if (!k) {
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        k->sv = sv;
        k->c = c;
        k->t0 = serve_now_ms();
        k->route = route_of(url);
        k->post = !strcmp(method, "POST");
        *con_cls = k;
        pthread_mutex_lock(&sv->mu);
        sv->in_flight++;
        pthread_mutex_unlock(&sv->mu);
        const int wants_post = k->route == ROUTE_CHAT || k->route == ROUTE_NEEDLE_COMPLETE ||
                               k->route == ROUTE_RESET;
        if (k->route == ROUTE_OTHER) return send_error(k, 404, "not_found", "no such endpoint");
        if (wants_post != k->post || (!k->post && strcmp(method, "GET") && strcmp(method, "HEAD")))
            return send_error(k, 405, "method_not_allowed", wants_post ? "use POST" : "use GET");
        /* the pages are open (the browser page runs nothing here: it only fetches files) */
        if (k->route != ROUTE_HEALTH && k->route != ROUTE_PLAYGROUND && k->route != ROUTE_TRY &&
            !authorized(sv, c))
            return send_error(k, 401, "invalid_api_key", "a valid 'Authorization: Bearer KEY' header is required");
        const char *len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (len && strtod(len, NULL) > (double)sv->cfg.max_body)
            return send_error(k, 413, "request_too_large", "the body is larger than the server's --max-body");
        return MHD_YES;
    }
    if (*upload_size) {
        if (k->body.len + *upload_size > (size_t)sv->cfg.max_body) k->too_large = 1;
        else buf_put(&k->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->status) return MHD_YES; /* answered already */
    if (k->too_large) return send_error(k, 413, "request_too_large", "the body is larger than the server's --max-body");
    if (k->body.oom) return send_error(k, 500, "internal_error", "out of memory");
    switch (k->route) {
    case ROUTE_HEALTH: return get_health(k);
    case ROUTE_METRICS: return get_metrics(k);
    case ROUTE_MODELS: return get_models(k);
    case ROUTE_RESET: return send_json(k, 200, "{\"ok\":true}");
    case ROUTE_PLAYGROUND:
        if (!strcmp(url, "/model")) return send_json(k, 200, sv->model_json);
        return send_text(k, 200, "text/html; charset=utf-8", (const char *)serve_playground_html,
                         serve_playground_html_len, NULL);
    case ROUTE_TRY: return (enum MHD_Result)serve_try(c, &sv->cfg, url, &k->status);
    default: return post_job(k);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
    (void)c;
    server *sv = cls;
    conn *k = *con_cls;
    if (!k) return;
    if (k->j) {
        /* a client gone before the end: the worker stops at its next token */
        JOB_CANCEL(k->j);
        job_release(k->j);
    }
    metrics_request(k->route, why == MHD_REQUEST_TERMINATED_COMPLETED_OK ? k->status : 499,
                    (serve_now_ms() - k->t0) / 1e3);
    if (k->sse_init) sse_free(&k->sse);
    buf_free(&k->body);
    buf_free(&k->out);
    free(k);
    *con_cls = NULL;
    pthread_mutex_lock(&sv->mu);
    sv->in_flight--;
    pthread_mutex_unlock(&sv->mu);
}

static char *model_description(const serve_config *cfg, needle_model *m) {
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", cfg->model_name);
    cJSON_AddStringToObject(root, "name", cfg->model_name); /* the official playground's key */
    cJSON_AddStringToObject(root, "backend", needle_model_backend(m));
    cJSON_AddStringToObject(root, "version", needle_version());
    cJSON_AddNumberToObject(root, "vocab", info.vocab);
    cJSON_AddNumberToObject(root, "d_model", info.d_model);
    cJSON_AddNumberToObject(root, "layers", info.num_layers);
    cJSON_AddNumberToObject(root, "max_seq_len", info.max_seq_len);
    cJSON_AddNumberToObject(root, "sessions", (double)cfg->parallel);
    cJSON_AddBoolToObject(root, "api_key_required", cfg->api_key != NULL);
    cJSON *tools = cfg->default_tools ? cJSON_Parse(cfg->default_tools) : NULL;
    if (tools) cJSON_AddItemToObject(root, "tools", tools);
    else cJSON_AddNullToObject(root, "tools");
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* The listening socket is made here, not by libmicrohttpd, so that the server owns its
 * port: SO_REUSEADDR only (a restart binds while old connections sit in TIME_WAIT; on
 * Linux it never lets two sockets listen on one port), never SO_REUSEPORT, with which a
 * second server would bind the same port and split the traffic with the first. A port in
 * use is an error that says so. Returns the socket, or -1 with the message printed. */
static int listen_on(const serve_config *cfg, const struct sockaddr_storage *addr, unsigned *port) {
    const int family = addr->ss_family;
    const socklen_t len = family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int on = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) ||
        (family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on)) ||
        bind(fd, (const struct sockaddr *)addr, len) || listen(fd, SOMAXCONN)) {
        const int e = errno;
        fprintf(stderr, "needle serve: cannot listen on %s:%ld: %s%s\n", cfg->host, cfg->port, strerror(e),
                e == EADDRINUSE ? " (another process is serving on this port; stop it or pick another --port)"
                                : e == EADDRNOTAVAIL ? " (not an address of this machine)" : "");
        if (fd >= 0) close(fd);
        return -1;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    *port = (unsigned)cfg->port;
    if (!getsockname(fd, (struct sockaddr *)&bound, &blen))
        *port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                         : ((struct sockaddr_in *)&bound)->sin_port);
    return fd;
}

server *http_start(const serve_config *cfg, needle_model *m, pool *p) {
    server *sv = calloc(1, sizeof *sv);
    if (!sv) return NULL;
    sv->cfg = *cfg;
    sv->m = m;
    sv->pool = p;
    pthread_mutex_init(&sv->mu, NULL);
    sv->model_json = model_description(cfg, m);
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    if (strchr(cfg->host, ':')) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&addr;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)cfg->port);
        if (inet_pton(AF_INET6, cfg->host, &a6->sin6_addr) != 1) goto bad_host;
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&addr;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)cfg->port);
        if (inet_pton(AF_INET, cfg->host, &a4->sin_addr) != 1) goto bad_host;
    }
    const int fd = listen_on(cfg, &addr, &sv->port);
    if (fd < 0) goto fail;
    sv->d = MHD_start_daemon(flags, (uint16_t)sv->port, NULL, NULL, on_request, sv,
                             MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                             MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv,
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->queue + cfg->parallel + 64),
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(cfg->timeout_s + 30),
                             MHD_OPTION_END);
    if (!sv->d) {
        close(fd);
        fprintf(stderr, "needle serve: cannot start the HTTP server on %s:%ld\n", cfg->host, cfg->port);
        goto fail;
    }
    return sv;
bad_host:
    fprintf(stderr, "needle serve: --host %s is not an IPv4 or IPv6 address\n", cfg->host);
fail:
    free(sv->model_json);
    pthread_mutex_destroy(&sv->mu);
    free(sv);
    return NULL;
}

unsigned http_port(const server *sv) { return sv->port; }

void http_drain(server *sv, double grace_s) {
    __atomic_store_n(&sv->draining, 1, __ATOMIC_RELAXED);
    const MHD_socket listener = MHD_quiesce_daemon(sv->d);
    if (listener != MHD_INVALID_SOCKET) close(listener);
    const double until = serve_now_ms() + grace_s * 1e3;
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        const long n = sv->in_flight;
        pthread_mutex_unlock(&sv->mu);
        if (n == 0 || serve_now_ms() > until) break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(sv->d);
    free(sv->model_json);
    pthread_mutex_destroy(&sv->mu);
    free(sv);
}
