/* needle serve: an OpenAI-compatible HTTP server over one model and a pool of sessions.
 *
 *   serve.c     the command: options, the model, the daemon, SIGTERM drain
 *   http.c      libmicrohttpd glue: bodies, limits, routing, the bearer key, responses
 *   pool.c      N workers, each owning a session; the bounded queue; the prefix cache
 *   openai.c    chat.completions requests -> jobs, envelopes -> responses and SSE chunks
 *   metrics.c   counters, the latency histogram, Prometheus text
 *   buf.c       a growing byte buffer (tools/ use only the public header)
 *   playground/ the page served at "/", embedded at build time (playground_assets.c)
 *   try.c       the browser page at /try: files of the WebAssembly build (web/), read at run time
 *
 * A request becomes a job: the tools, the history to replay, the turn to answer. A worker
 * whose session already holds the job's tools prefix (same system + canonical tools hash)
 * skips its prefill. Sessions keep nothing else between requests, so replicas behind any
 * load balancer scale out. */
#ifndef NEEDLE_TOOLS_SERVE_H
#define NEEDLE_TOOLS_SERVE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "needle.h"

/* ---- buf.c ------------------------------------------------------------------------------ */

typedef struct buf {
    char *data; /* NUL-terminated once anything was appended */
    size_t len, cap;
    int oom;
} buf;

void buf_put(buf *b, const void *data, size_t n);
void buf_puts(buf *b, const char *s);
void buf_printf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_free(buf *b);

/* ---- limits and configuration --------------------------------------------------------------- */

typedef struct serve_config {
    const char *weights, *host, *api_key, *model_name;
    long port, parallel, queue, n_ctx;
    long max_body;     /* bytes of a request body */
    long max_depth;    /* JSON nesting */
    long max_tools;    /* tools per request */
    long max_messages; /* messages per request */
    long max_tokens;   /* cap on max_tokens */
    long timeout_s;    /* per request, queue wait included */
    const char *default_tools; /* JSON text of the demo tools for the playground, or NULL */
    const char *web_dir;       /* the browser build's folder (needle-web.wasm, try.html, ...) */
} serve_config;

/* ---- jobs and the pool (pool.c) ------------------------------------------------------------ */

typedef struct serve_turn {
    char *text;
    int32_t turn;  /* needle_turn */
    char *calls;   /* the assistant's answer to it (history), NULL for the turn to answer */
} serve_turn;

typedef enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE } job_state;

typedef struct job {
    /* the request */
    char *system, *tools;       /* tools: a JSON array */
    uint64_t key;               /* hash of system + canonical tools */
    serve_turn *turns;          /* history (with calls) then the turn to answer */
    size_t n_turns;
    needle_complete_params params;
    int stream;                 /* the connection reads pieces as they come */
    int chat_kind;              /* CHAT_*: what the response holds */
    double submitted_ms;        /* serve_now_ms() at pool_submit */
    double deadline_ms;         /* serve_now_ms() after which the job is cancelled */

    /* the result, written by the worker before JOB_DONE */
    char *envelope;             /* NULL on error */
    int http_status;            /* 0 = fine, else the error status ... */
    char *error, *error_code;   /* ... and its OpenAI-style message and code */
    int cache_hit;
    /* prompt_tokens: the whole prompt (tools prefix, earlier messages, the last one),
     * whatever the prefix cache saved; cached_tokens: those the cache saved;
     * prefilled_tokens: those prefilled for this job (counted by the prefill callback) */
    uint64_t prompt_tokens, completion_tokens, cached_tokens, prefilled_tokens;
    double queue_ms, run_ms;

    /* shared between the worker and the connection, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_state state;
    buf pieces;                 /* CALLS pieces streamed so far */
    int cancel;                 /* set by the connection (closed, timed out): JOB_CANCEL */
    int refs;                   /* the connection and the pool */
} job;

/* The cancel flag crosses threads without the job's lock (the worker polls it per token). */
#define JOB_CANCEL(j) __atomic_store_n(&(j)->cancel, 1, __ATOMIC_RELAXED)
#define JOB_CANCELLED(j) __atomic_load_n(&(j)->cancel, __ATOMIC_RELAXED)

job *job_new(void);
/* Drops one reference; the last one frees the job. */
void job_release(job *j);

typedef struct pool pool;

int pool_create(needle_model *m, const serve_config *cfg, pool **out);
/* Queues j (the pool takes a reference); -1 when the queue is full. */
int pool_submit(pool *p, job *j);
/* Waits until j is done (or, with first_piece, has streamed its first piece). Cancels it
 * when its deadline passes or when the client closes `fd` (the waiting connection's own
 * socket; -1 = do not watch), then waits for the worker to let go. */
void pool_wait(job *j, int fd, int first_piece);
/* Whether the peer of socket fd has closed it (a peek, nothing is consumed). */
int serve_peer_closed(int fd);
void pool_stats(pool *p, long *queued, long *busy, long *sessions);
/* Finishes queued and running jobs, then stops the workers and frees the sessions. */
void pool_free(pool *p);

double serve_now_ms(void);

/* ---- metrics.c ------------------------------------------------------------------------------- */

/* ROUTE_NEEDLE_COMPLETE also answers the official playground's POST /complete, and
 * ROUTE_RESET its POST /reset (nothing to reset: requests share no state). */
typedef enum serve_route {
    ROUTE_CHAT, ROUTE_NEEDLE_COMPLETE, ROUTE_MODELS, ROUTE_HEALTH, ROUTE_METRICS,
    ROUTE_PLAYGROUND, ROUTE_RESET, ROUTE_TRY, ROUTE_OTHER, ROUTE_COUNT
} serve_route;

void metrics_request(serve_route route, int status, double seconds);
void metrics_job(const job *j);
void metrics_write(buf *out, pool *p);

/* ---- openai.c (requests), openai_response.c (responses, SSE) -------------------------------------------------------------------------------- */

/* Reads a chat.completions body into a new job (or fills *status, *code and *message). */
job *openai_parse_chat(const char *body, size_t len, const serve_config *cfg, int *status,
                       char **code, char **message);
/* Reads a /v1/needle/complete body ({"query", "tools", "system", ...}) into a new job. */
job *openai_parse_needle(const char *body, size_t len, const serve_config *cfg, int *status,
                         char **code, char **message);
/* The chat.completion response for a finished job (malloc'd JSON). */
char *openai_chat_response(const job *j, const char *model, const char *id);
/* An OpenAI-style error body (malloc'd JSON). */
char *openai_error_body(int status, const char *code, const char *message);
/* FNV-1a 64 of a byte string, continued from h (start with OPENAI_HASH_SEED). */
#define OPENAI_HASH_SEED 1469598103934665603ULL
uint64_t openai_hash(uint64_t h, const char *s, size_t n);

/* What the response of a chat request is: tool calls, (response_format) the one call's
 * arguments as the message content, or (tool_choice none) nothing, without running. */
enum { CHAT_TOOLS = 0, CHAT_CONTENT = 1, CHAT_NONE = 2 };

/* What a finished job means for the client: 0 when the envelope is an answer (a success,
 * or a turn cut at max_tokens, which is finish_reason "length"), else the HTTP status of
 * the failure with its code and message (malloc'd). */
int openai_job_error(const job *j, char **code, char **message);

/* Turns the streamed call-array bytes into SSE chunks, a piece at a time. */
typedef struct sse_stream {
    char id[48];
    const char *model;
    long created;
    int kind;            /* CHAT_TOOLS or CHAT_CONTENT */
    /* the scanner over the call array: [{"name":"...","arguments":{...}}, ...] */
    int depth, in_str, esc, in_key, expect_key, value_next, in_name, in_args, args_depth;
    char key[16];
    size_t key_len;
    buf name, args;      /* the current call's name; argument bytes not yet sent */
    int calls;           /* calls started so far */
    int sent_role;
} sse_stream;

void sse_init(sse_stream *s, const char *id, const char *model, int kind);
/* Appends the SSE events for `n` more call-array bytes to out. */
void sse_feed(sse_stream *s, const char *bytes, size_t n, buf *out);
/* Appends the final events (finish_reason, usage, or the error) and "data: [DONE]". */
void sse_finish(sse_stream *s, const job *j, buf *out);
void sse_free(sse_stream *s);

/* ---- http.c --------------------------------------------------------------------------------- */

typedef struct server server;

/* Starts listening (cfg->port 0: any free port); NULL with a message on stderr on failure. */
server *http_start(const serve_config *cfg, needle_model *m, pool *p);
/* The port actually bound. */
unsigned http_port(const server *s);
/* Stops accepting, waits up to `grace_s` for the requests in flight, then closes. */
void http_drain(server *s, double grace_s);

/* ---- try.c ------------------------------------------------------------------------------------ */

struct MHD_Connection;
/* Whether cfg->web_dir holds the browser build (needle-web.wasm). */
int serve_try_available(const serve_config *cfg);
/* Answers GET `url` (/try, /try/ or a file under /try/): the file, or a 404 that says what
 * is missing (the browser build, the demo model, or no such file). *answered = the status.
 * Returns libmicrohttpd's MHD_YES / MHD_NO. */
int serve_try(struct MHD_Connection *c, const serve_config *cfg, const char *url, int *answered);

/* ---- playground (generated) ------------------------------------------------------------------ */

extern const unsigned char serve_playground_html[];
extern const size_t serve_playground_html_len;

#endif
