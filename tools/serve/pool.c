/* The session pool: N workers, each owning one session of the shared model, fed from a
 * bounded FIFO. A worker keeps the tools prefix of its last job; a queued job whose key
 * (system + canonical tools) matches a free worker's goes to it first, so requests that
 * share their tools skip the prefix prefill (the prefix cache). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "serve.h"

/* How far down the queue a free worker looks for a job with its own prefix. Bounded, so
 * a job with other tools waits at most this many turns. */
#define AFFINITY_WINDOW 8

typedef struct worker {
    pool *p;
    needle_session *s;
    uint64_t key;
    int has_key;
    /* the system text and tools behind key: a hash match is confirmed byte for byte, so a
     * crafted collision cannot borrow another request's prefix */
    char *system, *tools;
    char *envelope; /* [ENVELOPE_CAP] */
    pthread_t thread;
} worker;

#define ENVELOPE_CAP (1u << 20)

struct pool {
    needle_model *m;
    serve_config cfg;
    worker *w;
    long n, started;
    job **q; /* ring of cfg.queue */
    long head, len;
    long busy;
    int stopping;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

double serve_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int serve_peer_closed(int fd) {
    if (fd < 0) return 0;
    char c;
    const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

job *job_new(void) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->params = needle_complete_default_params();
    j->refs = 1;
    return j;
}

void job_release(job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    const int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    free(j->system);
    free(j->tools);
    for (size_t i = 0; i < j->n_turns; i++) {
        free(j->turns[i].text);
        free(j->turns[i].calls);
    }
    free(j->turns);
    free(j->envelope);
    free(j->error);
    free(j->error_code);
    buf_free(&j->pieces);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static void job_fail(job *j, int status, const char *code, const char *message) {
    j->http_status = status;
    free(j->error_code);
    free(j->error);
    j->error_code = strdup(code);
    j->error = strdup(message);
}

/* The session's callbacks: stream call pieces to the connection, stop when it is gone. */
static int on_token(void *user, int32_t kind, int32_t token, const char *text, size_t len) {
    (void)token;
    job *j = user;
    if (j->stream && kind == NEEDLE_PIECE_CALLS) {
        pthread_mutex_lock(&j->mu);
        buf_put(&j->pieces, text, len);
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
    return JOB_CANCELLED(j);
}

static int on_prefill(void *user, uint32_t done, uint32_t total) {
    job *j = user;
    if (done == total) j->prefilled_tokens += total; /* a prefill call finished */
    return JOB_CANCELLED(j);
}

/* What a library failure while preparing the conversation means for the client. */
static void fail_from_status(job *j, int rc, const char *what) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %s", what, needle_last_error());
    if (rc == NEEDLE_ERR_CANCELLED)
        job_fail(j, serve_now_ms() > j->deadline_ms ? 504 : 499, "cancelled",
                 serve_now_ms() > j->deadline_ms ? "the request timed out" : "client closed");
    else if (rc == NEEDLE_ERR_CONTEXT_FULL) job_fail(j, 400, "context_length_exceeded", msg);
    else if (rc == NEEDLE_ERR_JSON || rc == NEEDLE_ERR_SCHEMA || rc == NEEDLE_ERR_INVALID_UTF8 ||
             rc == NEEDLE_ERR_INVALID_ARGUMENT)
        job_fail(j, 400, "invalid_request_error", msg);
    else job_fail(j, 500, "internal_error", msg);
}

static int holds_prefix(const worker *w, const job *j) {
    return w->has_key && w->key == j->key && !strcmp(w->system, j->system) &&
           !strcmp(w->tools, j->tools);
}

static void run_job(worker *w, job *j) {
    const double t0 = serve_now_ms();
    j->queue_ms = t0 - j->submitted_ms;
    if (JOB_CANCELLED(j) || t0 > j->deadline_ms) {
        job_fail(j, t0 > j->deadline_ms ? 504 : 499, "cancelled",
                 t0 > j->deadline_ms ? "the request timed out in the queue" : "client closed");
        return;
    }
    needle_session_stats before = {.size = sizeof before}, after = {.size = sizeof after};
    needle_session_get_stats(w->s, &before);
    const needle_callbacks cb = {sizeof cb, j, on_prefill, on_token};
    needle_session_set_callbacks(w->s, &cb);
    int rc = NEEDLE_OK;
    if (holds_prefix(w, j)) {
        needle_session_reset(w->s);
        j->cache_hit = 1;
        j->cached_tokens = needle_session_prefix_length(w->s);
    } else {
        w->has_key = 0;
        free(w->system);
        free(w->tools);
        w->system = w->tools = NULL;
        rc = needle_session_set_tools(w->s, j->system, j->tools);
        if (rc) fail_from_status(j, rc, "tools");
        else if ((w->system = strdup(j->system)) && (w->tools = strdup(j->tools))) {
            w->key = j->key;
            w->has_key = 1;
        }
    }
    for (size_t i = 0; rc == NEEDLE_OK && i + 1 < j->n_turns; i++) {
        rc = needle_session_append_turn(w->s, j->turns[i].text, j->turns[i].turn,
                                        j->turns[i].calls);
        if (rc) fail_from_status(j, rc, "messages");
    }
    if (rc == NEEDLE_OK) {
        const serve_turn *t = &j->turns[j->n_turns - 1];
        needle_complete_params p = j->params;
        p.turn = t->turn;
        size_t len = 0;
        rc = needle_session_complete(w->s, t->text, &p, w->envelope, ENVELOPE_CAP, &len);
        if (rc) fail_from_status(j, rc, "complete");
        else if (!(j->envelope = strdup(w->envelope))) job_fail(j, 500, "internal_error", "out of memory");
    }
    needle_session_set_callbacks(w->s, NULL);
    needle_session_get_stats(w->s, &after);
    j->completion_tokens = after.decode_steps - before.decode_steps;
    /* the prompt's length, not the work done: the same request gives the same count with
     * or without the prefix cache (OpenAI's usage; the saving is cached_tokens) */
    j->prompt_tokens = j->prefilled_tokens + j->cached_tokens;
    j->run_ms = serve_now_ms() - t0;
}

/* The next job for w: the oldest within the affinity window that has w's prefix, else the
 * oldest. Called with the pool's lock held and p->len > 0. */
static job *take(pool *p, const worker *w) {
    long pick = 0;
    if (w->has_key)
        for (long i = 0; i < p->len && i < AFFINITY_WINDOW; i++)
            if (p->q[(p->head + i) % p->cfg.queue]->key == w->key) {
                pick = i;
                break;
            }
    job *j = p->q[(p->head + pick) % p->cfg.queue];
    for (long i = pick; i > 0; i--)
        p->q[(p->head + i) % p->cfg.queue] = p->q[(p->head + i - 1) % p->cfg.queue];
    p->head = (p->head + 1) % p->cfg.queue;
    p->len--;
    return j;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    pool *p = w->p;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->len && !p->stopping) pthread_cond_wait(&p->cv, &p->mu);
        if (!p->len) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        job *j = take(p, w);
        p->busy++;
        pthread_mutex_unlock(&p->mu);

        pthread_mutex_lock(&j->mu);
        j->state = JOB_RUNNING;
        pthread_mutex_unlock(&j->mu);
        run_job(w, j);
        metrics_job(j);
        pthread_mutex_lock(&j->mu);
        j->state = JOB_DONE;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        job_release(j);

        pthread_mutex_lock(&p->mu);
        p->busy--;
        pthread_mutex_unlock(&p->mu);
    }
}

int pool_create(needle_model *m, const serve_config *cfg, pool **out) {
    pool *p = calloc(1, sizeof *p);
    if (!p) return NEEDLE_ERR_OUT_OF_MEMORY;
    p->m = m;
    p->cfg = *cfg;
    p->n = cfg->parallel;
    p->w = calloc((size_t)p->n, sizeof *p->w);
    p->q = calloc((size_t)cfg->queue, sizeof *p->q);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    int rc = p->w && p->q ? NEEDLE_OK : NEEDLE_ERR_OUT_OF_MEMORY;
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = (uint32_t)cfg->n_ctx;
    for (long i = 0; rc == NEEDLE_OK && i < p->n; i++) {
        worker *w = &p->w[i];
        w->p = p;
        if (!(w->envelope = malloc(ENVELOPE_CAP))) rc = NEEDLE_ERR_OUT_OF_MEMORY;
        else rc = needle_session_create(m, &sp, &w->s);
    }
    for (long i = 0; rc == NEEDLE_OK && i < p->n; i++) {
        if (pthread_create(&p->w[i].thread, NULL, worker_main, &p->w[i])) rc = NEEDLE_ERR_OUT_OF_MEMORY;
        else p->started++;
    }
    if (rc) {
        pool_free(p);
        return rc;
    }
    *out = p;
    return NEEDLE_OK;
}

int pool_submit(pool *p, job *j) {
    pthread_mutex_lock(&p->mu);
    if (p->len >= p->cfg.queue || p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    j->state = JOB_QUEUED;
    pthread_mutex_unlock(&j->mu);
    j->submitted_ms = serve_now_ms();
    p->q[(p->head + p->len) % p->cfg.queue] = j;
    p->len++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void pool_wait(job *j, int fd, int first_piece) {
    pthread_mutex_lock(&j->mu);
    while (j->state != JOB_DONE && !(first_piece && j->pieces.len)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (j->state != JOB_DONE && !JOB_CANCELLED(j) &&
            (serve_now_ms() > j->deadline_ms || serve_peer_closed(fd)))
            JOB_CANCEL(j);
    }
    pthread_mutex_unlock(&j->mu);
}

void pool_stats(pool *p, long *queued, long *busy, long *sessions) {
    pthread_mutex_lock(&p->mu);
    *queued = p->len;
    *busy = p->busy;
    *sessions = p->n;
    pthread_mutex_unlock(&p->mu);
}

void pool_free(pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (long i = 0; i < p->started; i++) pthread_join(p->w[i].thread, NULL);
    for (long i = 0; p->w && i < p->n; i++) {
        needle_session_free(p->w[i].s);
        free(p->w[i].envelope);
        free(p->w[i].system);
        free(p->w[i].tools);
    }
    free(p->w);
    free(p->q);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
