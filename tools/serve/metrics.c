/* Process-wide counters for /metrics (Prometheus text format 0.0.4). */
#include <pthread.h>
#include <string.h>

#include "serve.h"

static const double BUCKETS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
#define N_BUCKETS (sizeof BUCKETS / sizeof BUCKETS[0])

static const char *const ROUTE_NAMES[ROUTE_COUNT] = {
    "/v1/chat/completions", "/v1/needle/complete", "/v1/models", "/health", "/metrics", "/",
    "/reset", "/try", "other"};

static struct {
    pthread_mutex_t mu;
    unsigned long long requests[ROUTE_COUNT][6]; /* by status class 1xx..5xx, [0] unused */
    unsigned long long bucket[ROUTE_COUNT][N_BUCKETS + 1];
    double seconds_sum[ROUTE_COUNT];
    unsigned long long prefix_hits, prefix_misses, jobs, jobs_failed;
    unsigned long long prompt_tokens, completion_tokens;
    double run_seconds, queue_seconds;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

void metrics_request(serve_route route, int status, double seconds) {
    if (route < 0 || route >= ROUTE_COUNT) route = ROUTE_OTHER;
    const int cls = status >= 100 && status < 600 ? status / 100 : 5;
    pthread_mutex_lock(&M.mu);
    M.requests[route][cls]++;
    size_t b = 0;
    while (b < N_BUCKETS && seconds > BUCKETS[b]) b++;
    M.bucket[route][b]++;
    M.seconds_sum[route] += seconds;
    pthread_mutex_unlock(&M.mu);
}

void metrics_job(const job *j) {
    pthread_mutex_lock(&M.mu);
    M.jobs++;
    if (j->http_status) M.jobs_failed++;
    if (j->cache_hit) M.prefix_hits++;
    else if (!j->http_status || j->run_ms > 0) M.prefix_misses++;
    M.prompt_tokens += j->prompt_tokens;
    M.completion_tokens += j->completion_tokens;
    M.run_seconds += j->run_ms / 1e3;
    M.queue_seconds += j->queue_ms / 1e3;
    pthread_mutex_unlock(&M.mu);
}

void metrics_write(buf *out, pool *p) {
    long queued = 0, busy = 0, sessions = 0;
    if (p) pool_stats(p, &queued, &busy, &sessions);
    pthread_mutex_lock(&M.mu);
    buf_puts(out, "# HELP needle_requests_total HTTP requests by route and status class.\n"
                  "# TYPE needle_requests_total counter\n");
    for (int r = 0; r < ROUTE_COUNT; r++)
        for (int c = 1; c < 6; c++)
            if (M.requests[r][c])
                buf_printf(out, "needle_requests_total{route=\"%s\",code=\"%dxx\"} %llu\n",
                           ROUTE_NAMES[r], c, M.requests[r][c]);
    buf_puts(out, "# HELP needle_request_seconds Request latency, first byte in to last byte out.\n"
                  "# TYPE needle_request_seconds histogram\n");
    for (int r = 0; r < ROUTE_COUNT; r++) {
        unsigned long long total = 0;
        for (size_t b = 0; b <= N_BUCKETS; b++) total += M.bucket[r][b];
        if (!total) continue;
        unsigned long long cum = 0;
        for (size_t b = 0; b < N_BUCKETS; b++) {
            cum += M.bucket[r][b];
            buf_printf(out, "needle_request_seconds_bucket{route=\"%s\",le=\"%g\"} %llu\n",
                       ROUTE_NAMES[r], BUCKETS[b], cum);
        }
        buf_printf(out, "needle_request_seconds_bucket{route=\"%s\",le=\"+Inf\"} %llu\n",
                   ROUTE_NAMES[r], total);
        buf_printf(out, "needle_request_seconds_sum{route=\"%s\"} %.6f\n", ROUTE_NAMES[r],
                   M.seconds_sum[r]);
        buf_printf(out, "needle_request_seconds_count{route=\"%s\"} %llu\n", ROUTE_NAMES[r], total);
    }
    const unsigned long long lookups = M.prefix_hits + M.prefix_misses;
    buf_printf(out,
               "# HELP needle_prefix_cache_hits_total Turns whose tools prefix was already prefilled.\n"
               "# TYPE needle_prefix_cache_hits_total counter\n"
               "needle_prefix_cache_hits_total %llu\n"
               "# TYPE needle_prefix_cache_misses_total counter\n"
               "needle_prefix_cache_misses_total %llu\n"
               "# HELP needle_prefix_cache_hit_ratio Hits over lookups since start.\n"
               "# TYPE needle_prefix_cache_hit_ratio gauge\n"
               "needle_prefix_cache_hit_ratio %.4f\n",
               M.prefix_hits, M.prefix_misses, lookups ? (double)M.prefix_hits / (double)lookups : 0.0);
    buf_printf(out,
               "# TYPE needle_jobs_total counter\nneedle_jobs_total %llu\n"
               "# TYPE needle_jobs_failed_total counter\nneedle_jobs_failed_total %llu\n"
               "# TYPE needle_prompt_tokens_total counter\nneedle_prompt_tokens_total %llu\n"
               "# TYPE needle_completion_tokens_total counter\nneedle_completion_tokens_total %llu\n"
               "# HELP needle_run_seconds_total Time sessions spent on jobs (tokens/s = rate of "
               "tokens over rate of this).\n"
               "# TYPE needle_run_seconds_total counter\nneedle_run_seconds_total %.6f\n"
               "# TYPE needle_queue_seconds_total counter\nneedle_queue_seconds_total %.6f\n"
               "# HELP needle_completion_tokens_per_second Completion tokens over session time, "
               "since start.\n"
               "# TYPE needle_completion_tokens_per_second gauge\n"
               "needle_completion_tokens_per_second %.2f\n",
               M.jobs, M.jobs_failed, M.prompt_tokens, M.completion_tokens, M.run_seconds,
               M.queue_seconds, M.run_seconds > 0 ? (double)M.completion_tokens / M.run_seconds : 0.0);
    pthread_mutex_unlock(&M.mu);
    buf_printf(out,
               "# TYPE needle_queue_depth gauge\nneedle_queue_depth %ld\n"
               "# TYPE needle_sessions_busy gauge\nneedle_sessions_busy %ld\n"
               "# TYPE needle_sessions gauge\nneedle_sessions %ld\n",
               queued, busy, sessions);
}
