/* The browser page at /try: the engine compiled to WebAssembly runs the query in the tab,
 * so the server only hands out files. The page, its JS and needle-web.wasm come from the
 * browser build's folder (--web, default <datadir>/needle/web/: a cross build of its own,
 * cmake/toolchain-wasm32-wasi.cmake, so it is read at run time rather than embedded in
 * this binary); the demo model and its tools from where the library finds the demo model
 * (installed, else the source tree). Only the names below are served: a URL never becomes
 * a path. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "serve.h"

typedef struct try_file {
    const char *url, *name, *type;
} try_file;

static const try_file TRY_FILES[] = {
    {"/try", "try.html", "text/html; charset=utf-8"},
    {"/try/", "try.html", "text/html; charset=utf-8"},
    {"/try/try.js", "try.js", "text/javascript; charset=utf-8"},
    {"/try/try_worker.js", "try_worker.js", "text/javascript; charset=utf-8"},
    {"/try/wasi_host.js", "wasi_host.js", "text/javascript; charset=utf-8"},
    {"/try/needle-web.wasm", "needle-web.wasm", "application/wasm"},
    /* name NULL: from the demo model's place, not the web folder */
    {"/try/needle-demo.cact", NULL, "application/octet-stream"},
    {"/try/needle-demo.tools.json", NULL, "application/json"},
};

static int respond_text(struct MHD_Connection *c, int status, const char *text, int *answered) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)(uintptr_t)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
    const enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    *answered = status;
    return rc;
}

static int respond_file(struct MHD_Connection *c, const char *path, const char *type, int *answered) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        char text[1200];
        snprintf(text, sizeof text, "cannot read %s: %s\n", path,
                 fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return respond_text(c, 404, text, answered);
    }
    /* the response owns fd from here (closed with it) */
    struct MHD_Response *r = MHD_create_response_from_fd((size_t)st.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    /* a rebuilt module or page is picked up on reload */
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    const enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    *answered = 200;
    return rc;
}

static const char *readable(const char *path) {
    return path && access(path, R_OK) == 0 ? path : NULL;
}

/* The demo model the page loads: the installed copy, else the source tree's. */
static const char *demo_model(void) {
    for (int i = 0; needle_default_model_candidate(i); i++)
        if (readable(needle_default_model_candidate(i))) return needle_default_model_candidate(i);
    return NULL;
}

int serve_try_available(const serve_config *cfg) {
    char path[1024];
    snprintf(path, sizeof path, "%s/needle-web.wasm", cfg->web_dir);
    return readable(path) != NULL;
}

int serve_try(struct MHD_Connection *c, const serve_config *cfg, const char *url, int *answered) {
    const try_file *f = NULL;
    for (size_t i = 0; i < sizeof TRY_FILES / sizeof TRY_FILES[0]; i++)
        if (!strcmp(url, TRY_FILES[i].url)) f = &TRY_FILES[i];
    if (!f) return respond_text(c, 404, "no such file under /try/\n", answered);
    if (!serve_try_available(cfg)) {
        char text[1600];
        snprintf(text, sizeof text,
                 "404: the browser build of needle is not installed (no needle-web.wasm in %s).\n"
                 "Build it with the WebAssembly toolchain (README, \"Try it in the browser\"):\n"
                 "  cmake -S . -B build-wasi -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-wasm32-wasi.cmake "
                 "-DNEEDLE_CJSON_SOURCE=$(scripts/cjson-source.sh build-wasi)\n"
                 "  cmake --build build-wasi --target needle_web\n"
                 "then run `needle serve --web build-wasi/web`, or install it under this "
                 "needle's prefix (cmake --install build-wasi).\n", cfg->web_dir);
        return respond_text(c, 404, text, answered);
    }
    if (f->name) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", cfg->web_dir, f->name);
        return respond_file(c, path, f->type, answered);
    }
    const char *path = strstr(f->url, ".cact") ? demo_model() : readable(needle_default_tools_path());
    if (!path)
        return respond_text(c, 404, "the demo model (models/needle-demo.cact and its tools) is "
                                    "not installed beside this needle\n", answered);
    return respond_file(c, path, f->type, answered);
}
