/* `needle serve`: the command. Options, the model, the session pool, the HTTP daemon; the
 * main thread then waits for SIGTERM or SIGINT and drains: no new connections, the
 * requests in flight finish (up to the request timeout), then exit 0.
 *
 * The server runs in its own executable, needle-serve (this file with serve_main.c), so
 * that only it loads libmicrohttpd and its TLS chain (gnutls, nettle, gmp, p11-kit: ~3 MB
 * resident); in `needle` (NEEDLE_SERVE_EXEC) the command checks the options, then replaces
 * itself with needle-serve from its own folder: same pid, signals and exit status. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cli.h"
#include "serve.h"

#if defined(NEEDLE_HAVE_HTTP) && !defined(NEEDLE_SERVE_EXEC)

/* The demo model's tools for the playground, when serving the demo model. */
static char *read_small_file(const char *path) {
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) return NULL;
    buf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0 && b.len < (1u << 20)) buf_put(&b, chunk, n);
    fclose(f);
    if (b.oom) buf_free(&b);
    return b.data;
}
#endif /* NEEDLE_HAVE_HTTP && !NEEDLE_SERVE_EXEC */

#ifdef NEEDLE_SERVE_EXEC
/* Runs needle-serve in place of this process with the same arguments (cli_exec_helper:
 * the one beside this executable, else the one on PATH). Returns only on failure. */
static int exec_server(char **argv) { return cli_exec_helper("needle-serve", "serve", argv); }
#endif

static int run_serve(const cli_command *self, int argc, char **argv) {
    serve_config cfg = {.host = "127.0.0.1", .port = 8080, .parallel = 0, .queue = 64,
                        .max_body = 1 << 20, .max_depth = 64, .max_tools = 128,
                        .max_messages = 256, .max_tokens = 1024, .timeout_s = 120};
    long threads = 0;
    const cli_option opts[] = {
        {"--weights", "-w", CLI_TEXT, &cfg.weights, 0, 0, NULL},
        {"--host", NULL, CLI_TEXT, &cfg.host, 0, 0, NULL},
        {"--port", "-p", CLI_LONG, &cfg.port, 0, 65535, NULL},
        {"--parallel", "-j", CLI_LONG, &cfg.parallel, 1, 1024, NULL},
        {"--queue", NULL, CLI_LONG, &cfg.queue, 1, 1 << 16, NULL},
        {"--api-key", NULL, CLI_TEXT, &cfg.api_key, 0, 0, NULL},
        {"--ctx", NULL, CLI_LONG, &cfg.n_ctx, 0, 1L << 24, NULL},
        {"--threads", NULL, CLI_LONG, &threads, 0, 1024, NULL},
        {"--max-body", NULL, CLI_LONG, &cfg.max_body, 1024, 1L << 30, NULL},
        {"--max-tokens", NULL, CLI_LONG, &cfg.max_tokens, 1, 1 << 20, NULL},
        {"--max-tools", NULL, CLI_LONG, &cfg.max_tools, 1, 1 << 16, NULL},
        {"--timeout", NULL, CLI_LONG, &cfg.timeout_s, 1, 86400, NULL},
        {"--model-name", NULL, CLI_TEXT, &cfg.model_name, 0, 0, NULL},
        {"--web", NULL, CLI_TEXT, &cfg.web_dir, 0, 0, NULL},
        {0}};
    const int st = cli_parse(self, argc, argv, opts, NULL, 0);
    if (st != CLI_GO) return st;
#ifndef NEEDLE_HAVE_HTTP
    /* the options are still parsed, so --help and a wrong option behave as in a full build */
    (void)threads;
    fprintf(stderr, "needle serve: this needle was built without HTTP support (libmicrohttpd "
            "was not found when it was configured; install libmicrohttpd-dev and rebuild)\n");
    return 1;
#elif defined(NEEDLE_SERVE_EXEC)
    (void)threads;
    return exec_server(argv);
#else
    const char *key_env = getenv("NEEDLE_API_KEY");
    if (!cfg.api_key && key_env && key_env[0]) cfg.api_key = key_env;
    if (cfg.api_key && !cfg.api_key[0]) cfg.api_key = NULL;
    if (!cfg.web_dir) cfg.web_dir = NEEDLE_INSTALLED_WEB;
    cli_default_weights(&cfg.weights);
    if (!cfg.weights) return cli_no_weights();
    if (!cfg.parallel) {
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        cfg.parallel = cores > 0 ? cores : 1;
    }
    if (!cfg.model_name) {
        const char *slash = strrchr(cfg.weights, '/');
        cfg.model_name = slash ? slash + 1 : cfg.weights;
    }
    /* the demo's tool list goes with the demo model only (the default model may be a
     * cached needle3 now) */
    char *demo_tools = cli_is_demo_model(cfg.weights) ? read_small_file(needle_default_tools_path())
                                                  : NULL;
    cfg.default_tools = demo_tools;

    /* Signals go to the main thread's sigwait alone: block them before any thread starts. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* Sessions run side by side, so each gets one thread unless told otherwise: N sessions
     * sharing every core each would only fight over them. */
    needle_model_params mp = needle_model_default_params();
    mp.n_threads = (int32_t)(threads ? threads : cfg.parallel > 1 ? 1 : 0);
    needle_model *m = NULL;
    int rc = needle_model_open(cfg.weights, &mp, &m);
    if (rc) {
        free(demo_tools);
        return cli_lib_error(cfg.weights, rc);
    }
    if (!cfg.n_ctx) {
        /* With a sliding window (the tools prefix pinned as sinks) positions need no cap
         * from the model; 8192 bounds a request's work. Without one, the file's length. */
        needle_model_info info = {.size = sizeof info};
        needle_model_get_info(m, &info);
        cfg.n_ctx = info.kv_window ? 8192 : info.max_seq_len;
    }
    pool *p = NULL;
    if ((rc = pool_create(m, &cfg, &p))) {
        needle_model_free(m);
        free(demo_tools);
        return cli_lib_error("sessions", rc);
    }
    server *sv = http_start(&cfg, m, p);
    if (!sv) {
        pool_free(p);
        needle_model_free(m);
        free(demo_tools);
        return 1;
    }
    fprintf(stderr, "needle serve: listening on http://%s%s%s:%u (%s, %ld session%s of %ld "
            "positions, queue %ld%s)\n", strchr(cfg.host, ':') ? "[" : "", cfg.host,
            strchr(cfg.host, ':') ? "]" : "", http_port(sv), cfg.model_name, cfg.parallel,
            cfg.parallel == 1 ? "" : "s", cfg.n_ctx, cfg.queue,
            cfg.api_key ? ", API key required" : "");
    if (serve_try_available(&cfg))
        fprintf(stderr, "needle serve: the browser page (the engine in WebAssembly) at /try, from %s\n",
                cfg.web_dir);
    int sig = 0;
    while (sigwait(&stop, &sig) != 0) {}
    fprintf(stderr, "needle serve: %s, draining\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    http_drain(sv, (double)cfg.timeout_s + 5);
    pool_free(p);
    needle_model_free(m);
    free(demo_tools);
    fprintf(stderr, "needle serve: stopped\n");
    return 0;
#endif
}


const cli_command cli_serve = {
    "serve", "an OpenAI-compatible HTTP server with a playground page",
    "usage: needle serve [--weights FILE] [--host ADDR] [--port N] [--parallel N] [options]\n"
    "\n"
    "Serves the model over HTTP: POST /v1/chat/completions (OpenAI's API: tools, tool_choice,\n"
    "response_format, stream), POST /v1/needle/complete (the engine's envelope), GET\n"
    "/v1/models, /health, /metrics (Prometheus) and a playground page at /; at /try a page\n"
    "that runs the demo model in the browser itself (the WebAssembly build, --web). N sessions\n"
    "answer requests side by side; more wait in a bounded queue (full: 503 with\n"
    "Retry-After). SIGTERM or SIGINT finish the requests in flight, then exit 0.\n"
    "See docs/serve.md.\n"
    "\n"
    "options:\n"
    CLI_WEIGHTS_HELP
    "  --host ADDR             address to listen on (default 127.0.0.1; 0.0.0.0 for all)\n"
    "  -p, --port N            port (default 8080; 0 = any free one, printed at start)\n"
    "  -j, --parallel N        sessions, i.e. requests decoded at once (default: cores)\n"
    "  --queue N               requests waiting beyond those (default 64)\n"
    "  --api-key KEY           require 'Authorization: Bearer KEY' (default: $NEEDLE_API_KEY;\n"
    "                          /health and the playground page stay open)\n"
    "  --ctx N                 positions per conversation (default: 8192 for a model with a\n"
    "                          sliding window, else the file's max_seq_len); longer\n"
    "                          requests get 400 context_length_exceeded\n"
    "  --threads N             threads per session (default 1 with several sessions)\n"
    "  --max-body BYTES        largest request body (default 1048576; larger: 413)\n"
    "  --max-tokens N          largest max_tokens a request may ask (default 1024)\n"
    "  --max-tools N           most tools in a request (default 128)\n"
    "  --timeout S             per request, queue included (default 120; then 504)\n"
    "  --model-name NAME       the model id in responses (default: the file name)\n"
    "  --web DIR               the browser build served at /try (needle-web.wasm, try.html,\n"
    "                          try.js, wasi_host.js; default: <datadir>/needle/web)\n"
    "  -h, --help              this text\n",
    run_serve};
