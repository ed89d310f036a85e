/* hub_download.c: hub_download and hub_config_from_env (see hub.h). The cache side
 * (paths, refs, symlinks, the lock, --out copies) is plain POSIX; the network side is
 * libcurl, compiled when the build found it (NEEDLE_HAVE_CURL). Without libcurl, cached
 * files are still found (offline use); anything else is HUB_ERR_NO_CURL. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef NEEDLE_HAVE_CURL
#include <curl/curl.h>
#endif

#include "api/model_cache.h"
#include "hub.h"
#include "hub_sha256.h"
#include "needle.h"
#include "util/platform.h"

#define PATH_CAP 4096

static hub_status fail(hub_status st, char *err, size_t errn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static hub_status fail(hub_status st, char *err, size_t errn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errn, fmt, ap);
    va_end(ap);
    return st;
}

static int fits(int written, size_t n) { return written >= 0 && (size_t)written < n; }

static int env_true(const char *name) {
    const char *v = getenv(name);
    return v && (!strcasecmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") ||
                 !strcasecmp(v, "true"));
}

hub_status hub_config_from_env(hub_config *cfg, char *err, size_t errn) {
    memset(cfg, 0, sizeof *cfg);
    const char *ep = getenv("HF_ENDPOINT");
    if (!ep || !ep[0]) ep = "https://huggingface.co";
    if (!fits(snprintf(cfg->endpoint, sizeof cfg->endpoint, "%s", ep), sizeof cfg->endpoint))
        return fail(HUB_ERR_USAGE, err, errn, "HF_ENDPOINT is too long");
    size_t n = strlen(cfg->endpoint);
    while (n && cfg->endpoint[n - 1] == '/') cfg->endpoint[--n] = 0;
    if (model_cache_hub_dir(cfg->cache, sizeof cfg->cache))
        return fail(HUB_ERR_USAGE, err, errn,
                    "no hub cache directory: set HF_HUB_CACHE or HF_HOME (no HOME either)");
    /* huggingface_hub's order: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, the token file */
    const char *tok = getenv("HF_TOKEN");
    if (!tok || !tok[0]) tok = getenv("HUGGING_FACE_HUB_TOKEN");
    if (tok && tok[0]) {
        snprintf(cfg->token, sizeof cfg->token, "%s", tok);
    } else {
        char path[PATH_CAP];
        const char *home = getenv("HF_HOME"), *tp = getenv("HF_TOKEN_PATH");
        const char *user = getenv("HOME");
        int ok = 0;
        if (tp && tp[0]) ok = fits(snprintf(path, sizeof path, "%s", tp), sizeof path);
        else if (home && home[0]) ok = fits(snprintf(path, sizeof path, "%s/token", home), sizeof path);
        else if (user && user[0])
            ok = fits(snprintf(path, sizeof path, "%s/.cache/huggingface/token", user), sizeof path);
        FILE *f = ok ? fopen(path, "rb") : NULL;
        if (f) {
            const size_t got = fread(cfg->token, 1, sizeof cfg->token - 1, f);
            fclose(f);
            cfg->token[got] = 0;
            cfg->token[strcspn(cfg->token, "\r\n")] = 0;
        }
    }
    /* a token with a line break would inject headers */
    if (strpbrk(cfg->token, "\r\n")) cfg->token[0] = 0;
    cfg->offline = env_true("HF_HUB_OFFLINE") || env_true("TRANSFORMERS_OFFLINE");
    cfg->max_retries = 5;
    cfg->backoff_s = 1.0;
    return HUB_OK;
}

/* ---- cache paths ------------------------------------------------------------------------- */

typedef struct hub_paths {
    char storage[PATH_CAP]; /* <cache>/models--ORG--NAME */
    char folder[512];       /* models--ORG--NAME */
} hub_paths;

static int mkdirs(const char *path) {
    char tmp[PATH_CAP];
    if (!fits(snprintf(tmp, sizeof tmp, "%s", path), sizeof tmp)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (platform_mkdir(tmp) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (platform_mkdir(tmp) != 0 && errno != EEXIST) return -1;
    struct stat st;
    if (stat(tmp, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static hub_status disk_error(char *err, size_t errn, const char *what, const char *path, int e) {
    int full = e == ENOSPC || e == EFBIG;
#ifdef EDQUOT /* not on Windows */
    full = full || e == EDQUOT;
#endif
    if (full)
        return fail(HUB_ERR_DISK, err, errn, "disk full writing %s: %s", path, strerror(e));
    return fail(HUB_ERR_DISK, err, errn,
                "cannot %s %s: %s (the cache must be writable: set HF_HUB_CACHE or HF_HOME to "
                "a writable folder)", what, path, strerror(e));
}

#ifdef NEEDLE_HAVE_CURL /* what only a download writes */
static int parent_dirs(const char *path) {
    char dir[PATH_CAP];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = 0;
    return mkdirs(dir);
}

/* refs/<revision> = commit, written whole (a temporary file renamed over it), and only
 * when it changes: a read-only cache that already knows the ref is not an error */
static int write_ref(const hub_paths *p, const char *revision, const char *commit) {
    if (!strcmp(revision, commit)) return 0;
    char ref[PATH_CAP], tmp[PATH_CAP], cur[64] = {0};
    if (!fits(snprintf(ref, sizeof ref, "%s/refs/%s", p->storage, revision), sizeof ref) ||
        !fits(snprintf(tmp, sizeof tmp, "%s.%ld.tmp", ref, (long)getpid()), sizeof tmp)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    FILE *f = fopen(ref, "rb");
    if (f) {
        const size_t got = fread(cur, 1, sizeof cur - 1, f);
        fclose(f);
        cur[got] = 0;
        if (!strcmp(cur, commit)) return 0;
    }
    if (parent_dirs(ref)) return -1;
    f = fopen(tmp, "wb");
    if (!f) return -1;
    const int bad = fputs(commit, f) < 0;
    if (fclose(f) != 0 || bad || rename(tmp, ref) != 0) {
        const int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

static void cachedir_tag(const char *cache) {
    /* the Cache Directory Tagging Standard file huggingface_hub writes, word for word,
     * so that backup tools skip the cache whichever client created it */
    char path[PATH_CAP];
    if (!fits(snprintf(path, sizeof path, "%s/CACHEDIR.TAG", cache), sizeof path) ||
        access(path, F_OK) == 0)
        return;
    FILE *f = fopen(path, "wx");
    if (!f) return;
    fputs("Signature: 8a477f597d28d172789f06886806bc55\n"
          "# This file is a cache directory tag created by huggingface_hub.\n"
          "# For information about cache directory tags, see:\n"
          "#\thttps://bford.info/cachedir/\n", f);
    fclose(f);
}

/* snapshots/<commit>/<file> -> ../../(../ per folder of file)blobs/<etag>, put in place by
 * a rename so that a reader never sees a missing or half-made link */
static int make_pointer(const char *pointer, const char *file, const char *etag) {
    char target[PATH_CAP] = "../../", tmp[PATH_CAP];
    for (const char *s = file; *s; s++)
        if (*s == '/' && strlen(target) + 3 < sizeof target) strcat(target, "../");
    if (!fits(snprintf(target + strlen(target), sizeof target - strlen(target), "blobs/%s", etag),
              sizeof target - strlen(target)) ||
        !fits(snprintf(tmp, sizeof tmp, "%s.%ld.tmp", pointer, (long)getpid()), sizeof tmp)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if (parent_dirs(pointer)) return -1;
    unlink(tmp);
    if (symlink(target, tmp) != 0) return -1;
    if (rename(tmp, pointer) != 0) {
        const int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

#endif

static int file_size(const char *path, uint64_t *size) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    *size = (uint64_t)st.st_size;
    return 0;
}

/* Copies src to dir/<basename of file> through a temporary file; the result's path in out. */
static hub_status copy_out(const char *src, const char *dir, const char *file, char *out,
                           size_t outn, char *err, size_t errn) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char tmp[PATH_CAP];
    if (!fits(snprintf(out, outn, "%s/%s", dir, base), outn) ||
        !fits(snprintf(tmp, sizeof tmp, "%s.%ld.incomplete", out, (long)getpid()), sizeof tmp))
        return fail(HUB_ERR_USAGE, err, errn, "--out %s: path too long", dir);
    if (mkdirs(dir)) return disk_error(err, errn, "create", dir, errno);
    FILE *in = fopen(src, "rb");
    if (!in) return fail(HUB_ERR_DISK, err, errn, "cannot read %s: %s", src, strerror(errno));
    FILE *o = fopen(tmp, "wb");
    if (!o) {
        const int e = errno;
        fclose(in);
        return disk_error(err, errn, "write", tmp, e);
    }
    unsigned char buf[1 << 14];
    size_t got;
    int e = 0;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, got, o) != got) {
            e = errno ? errno : EIO;
            break;
        }
    if (!e && ferror(in)) e = EIO;
    fclose(in);
    if (fclose(o) != 0 && !e) e = errno;
    if (!e && rename(tmp, out) != 0) e = errno;
    if (e) {
        unlink(tmp);
        return disk_error(err, errn, "write", out, e);
    }
    return HUB_OK;
}

/* The cached file for spec at revision: the hub cache, then the official package's. */
static int cached_lookup(const hub_config *cfg, const hub_spec *spec, const char *file,
                         const char *revision, hub_result *res) {
    char commit[41];
    if (model_cache_hub_file(cfg->cache, spec->repo, revision, file, res->path,
                             sizeof res->path) == 0 &&
        model_cache_commit(cfg->cache, spec->repo, revision, commit) == 0) {
        snprintf(res->commit, sizeof res->commit, "%s", commit);
        res->source = "hub-cache";
        return 0;
    }
    if (spec->official[0] && !strcmp(revision, "main") &&
        model_cache_official_file(spec->official, file, res->path, sizeof res->path) == 0) {
        res->commit[0] = 0;
        res->source = "official-cache";
        return 0;
    }
    return -1;
}

/* The .cact files at the top of the snapshot a revision points at (offline listing; the
 * official repos keep theirs at the root). Returns the count, names in *files. */
static int cached_cact_files(const hub_config *cfg, const hub_spec *spec, const char *revision,
                             char ***files) {
    char commit[41], folder[512], dir[PATH_CAP];
    *files = NULL;
    if (model_cache_commit(cfg->cache, spec->repo, revision, commit) ||
        model_cache_repo_folder(spec->repo, folder, sizeof folder) ||
        !fits(snprintf(dir, sizeof dir, "%s/%s/snapshots/%s", cfg->cache, folder, commit),
              sizeof dir))
        return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    char **out = NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".cact") || e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 4;
            char **grown = realloc(out, (size_t)cap * sizeof *grown);
            if (!grown) break;
            out = grown;
        }
        if (!(out[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    *files = out;
    return n;
}

/* ---- the network (libcurl) ----------------------------------------------------------------- */

#ifdef NEEDLE_HAVE_CURL

typedef struct transfer {
    const hub_config *cfg;
    hub_response resp;
    /* body to memory (listings) */
    char *mem;
    size_t mem_len, mem_cap;
    /* body to a file (downloads) */
    int fd;
    uint64_t offset;     /* bytes in the file: the Range start, then what was written */
    uint64_t requested;  /* the Range start of this request */
    int body_started;
    int write_errno;
    uint64_t received;   /* bytes of this request's body written */
    /* progress */
    const char *label;
    uint64_t total;      /* expected size, 0 unknown */
    double start_ms, last_draw_ms;
    uint64_t start_bytes;
} transfer;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static size_t on_header(char *data, size_t size, size_t n, void *user) {
    transfer *t = user;
    hub_response_header(&t->resp, data, size * n);
    return size * n;
}

static size_t on_body_mem(char *data, size_t size, size_t n, void *user) {
    transfer *t = user;
    const size_t len = size * n;
    if (t->mem_len + len + 1 > t->mem_cap) {
        size_t cap = t->mem_cap ? t->mem_cap : 4096;
        while (cap < t->mem_len + len + 1) cap *= 2;
        /* a listing is small; anything larger than 64 MiB is not one */
        if (cap > (64u << 20)) return 0;
        char *grown = realloc(t->mem, cap);
        if (!grown) return 0;
        t->mem = grown;
        t->mem_cap = cap;
    }
    memcpy(t->mem + t->mem_len, data, len);
    t->mem_len += len;
    t->mem[t->mem_len] = 0;
    return len;
}

static size_t on_body_file(char *data, size_t size, size_t n, void *user) {
    transfer *t = user;
    const size_t len = size * n;
    if (!t->body_started) {
        t->body_started = 1;
        const long st = t->resp.status;
        if (st == 206 && t->resp.range_start >= 0 && (uint64_t)t->resp.range_start == t->requested) {
            /* the resumed part: append */
        } else if (st == 200) {
            /* the whole body (a server that ignores Range): start the file over */
            if (ftruncate(t->fd, 0) != 0 || lseek(t->fd, 0, SEEK_SET) != 0) {
                t->write_errno = errno;
                return 0;
            }
            t->offset = 0;
        } else {
            t->body_started = 2; /* an error page or a mismatched range: not file bytes */
        }
    }
    if (t->body_started == 2) return len;
    size_t done = 0;
    while (done < len) {
        const ssize_t w = write(t->fd, data + done, len - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            t->write_errno = errno;
            return 0;
        }
        done += (size_t)w;
    }
    t->offset += len;
    t->received += len;
    return len;
}

static void human(double bytes, char *out, size_t n) {
    static const char *unit[] = {"B", "kB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1000 && u < 4) bytes /= 1000, u++;
    snprintf(out, n, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
}

static void draw_progress(transfer *t, int final) {
    const double now = now_ms();
    if (!final && now - t->last_draw_ms < 100) return;
    t->last_draw_ms = now;
    const double secs = (now - t->start_ms) / 1e3;
    const double rate = secs > 0.05 ? (double)(t->offset - t->start_bytes) / secs : 0;
    char have[32], total[32], speed[32], eta[32] = "--:--";
    human((double)t->offset, have, sizeof have);
    human((double)t->total, total, sizeof total);
    human(rate, speed, sizeof speed);
    const int width = 24;
    int fill = 0, pct = 0;
    if (t->total) {
        pct = (int)(100.0 * (double)t->offset / (double)t->total);
        if (pct > 100) pct = 100;
        fill = width * pct / 100;
        if (rate > 0 && t->offset <= t->total) {
            const long left = (long)((double)(t->total - t->offset) / rate + 0.5);
            snprintf(eta, sizeof eta, "%ld:%02ld", left / 60, left % 60);
        }
    }
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r\033[K%s [%s] %3d%% %s/%s %s/s ETA %s", t->label, bar, pct, have,
            t->total ? total : "?", speed, eta);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    transfer *t = user;
    if (t->cfg->progress && t->body_started == 1) draw_progress(t, 0);
    return 0;
}

/* One request. method "HEAD" or "GET"; auth: send the token; to_file: the body goes to
 * t->fd from t->offset (Range when > 0), else to memory. Returns the curl code; the
 * response's headers are in t->resp (the last response of a redirect chain). */
static CURLcode request(transfer *t, const char *method, const char *url, int auth,
                        int follow, int to_file) {
    CURL *c = curl_easy_init();
    if (!c) return CURLE_FAILED_INIT;
    struct curl_slist *h = NULL;
    char line[1200];
    if (auth && t->cfg->token[0]) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", t->cfg->token);
        h = curl_slist_append(h, line);
    }
    /* the real size, uncompressed, as huggingface_hub asks */
    h = curl_slist_append(h, "Accept-Encoding: identity");
    char range[64];
    if (to_file && t->offset > 0) {
        snprintf(range, sizeof range, "Range: bytes=%llu-", (unsigned long long)t->offset);
        h = curl_slist_append(h, range);
    }
    char ua[96];
    snprintf(ua, sizeof ua, "needle/%s; hf_hub-protocol", needle_version());
    hub_response_reset(&t->resp);
    t->requested = t->offset;
    t->body_started = 0;
    t->received = 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_USERAGENT, ua);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    /* a stalled transfer (under 1 byte/s for 30 s) counts as a lost connection */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    /* only http(s), also after a redirect */
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, t);
    if (!strcmp(method, "HEAD")) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_file ? on_body_file : on_body_mem);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, t);
    if (to_file) {
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, t);
    }
    const CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return rc;
}

static int retryable_status(long st) { return st == 429 || st == 408 || (st >= 500 && st <= 599); }

static int retryable_curl(CURLcode rc) {
    return rc == CURLE_COULDNT_CONNECT || rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR ||
           rc == CURLE_SEND_ERROR || rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_GOT_NOTHING ||
           rc == CURLE_COULDNT_RESOLVE_HOST;
}

static void backoff(const hub_config *cfg, int attempt, const hub_response *r) {
    double wait = cfg->backoff_s;
    for (int i = 1; i < attempt && wait < 8; i++) wait *= 2;
    if (wait > 8) wait = 8;
    /* the server's Retry-After wins, within reason */
    if (r->retry_after >= 0) wait = r->retry_after > 30 ? 30 : r->retry_after;
    sleep_s(wait);
}

/* The message for an error status of the hub (HEAD, listing). */
static hub_status http_error(const hub_config *cfg, const hub_spec *spec, const char *file,
                             const char *revision, const hub_response *r, char *err,
                             size_t errn) {
    const char *code = r->error_code;
    const char *what = file && file[0] ? file : "(listing)";
    if (!strcmp(code, "RepoNotFound"))
        return fail(HUB_ERR_REPO_NOT_FOUND, err, errn,
                    "repository %s not found on %s (HTTP %ld)%s", spec->repo, cfg->endpoint,
                    r->status,
                    cfg->token[0] ? "" : "; if it is private or gated, set HF_TOKEN");
    if (!strcmp(code, "RevisionNotFound"))
        return fail(HUB_ERR_REVISION, err, errn, "revision '%s' not found in %s (HTTP %ld)",
                    revision, spec->repo, r->status);
    if (!strcmp(code, "EntryNotFound"))
        return fail(HUB_ERR_FILE_NOT_FOUND, err, errn, "file %s not found in %s at %s (HTTP %ld)",
                    what, spec->repo, revision, r->status);
    if (r->status == 401 || r->status == 403 || !strcmp(code, "GatedRepo"))
        return fail(HUB_ERR_AUTH, err, errn,
                    "%s is gated or private (HTTP %ld): %s", spec->repo, r->status,
                    cfg->token[0] ? "the token in HF_TOKEN was refused (does it have access? "
                                    "accept the repo's conditions on its hub page)"
                                  : "set HF_TOKEN to a token with access");
    if (r->status == 404)
        return fail(HUB_ERR_FILE_NOT_FOUND, err, errn, "%s/%s not found (HTTP 404)", spec->repo,
                    what);
    if (retryable_status(r->status))
        return fail(HUB_ERR_NETWORK, err, errn, "%s answered HTTP %ld after %d tries",
                    cfg->endpoint, r->status, cfg->max_retries + 1);
    return fail(HUB_ERR_PROTOCOL, err, errn, "%s answered HTTP %ld for %s/%s", cfg->endpoint,
                r->status, spec->repo, what);
}

/* A request with up to `retries` retries on 429/5xx and lost connections (HEAD, listings). */
static CURLcode request_retrying(transfer *t, const char *method, const char *url, int auth,
                                 int retries) {
    CURLcode rc = CURLE_OK;
    for (int attempt = 0;; attempt++) {
        t->mem_len = 0;
        rc = request(t, method, url, auth, 0, 0);
        const int again = rc != CURLE_OK ? retryable_curl(rc) : retryable_status(t->resp.status);
        if (!again || attempt >= retries) return rc;
        backoff(t->cfg, attempt + 1, &t->resp);
    }
}

typedef struct file_meta {
    char url[2048];      /* where the bytes are (the redirect target off the hub) */
    int auth;            /* send the token to it (the hub's own origin) */
    char commit[64];
    char etag[160];
    int64_t size;        /* -1 unknown */
} file_meta;

/* HEAD /resolve, following redirects on the hub's origin (a renamed repo) and stopping at
 * one that leaves it (the CDN), as huggingface_hub's get_hf_file_metadata; each request
 * retried up to `retries` times. Returns HUB_OK, HUB_ERR_NETWORK (the caller may fall back
 * to the cache) or another error; for a missing file (EntryNotFound) m->commit is the
 * commit the hub named, if any. */
static hub_status head_file(const hub_config *cfg, const hub_spec *spec, const char *file,
                            const char *revision, int retries, file_meta *m, char *err,
                            size_t errn) {
    char path[1200], rev[600], url[2048];
    if (hub_url_path(file, path, sizeof path) || hub_url_quote(revision, rev, sizeof rev, 0) ||
        !fits(snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", cfg->endpoint, spec->repo, rev,
                       path), sizeof url))
        return fail(HUB_ERR_USAGE, err, errn, "the URL for %s/%s is too long", spec->repo, file);
    transfer t = {.cfg = cfg, .fd = -1};
    for (int hop = 0;; hop++) {
        const CURLcode rc = request_retrying(&t, "HEAD", url, 1, retries);
        if (rc != CURLE_OK) {
            free(t.mem);
            return fail(HUB_ERR_NETWORK, err, errn, "cannot reach %s: %s", cfg->endpoint,
                        curl_easy_strerror(rc));
        }
        const long st = t.resp.status;
        if (st >= 300 && st < 400 && t.resp.location[0]) {
            char target[2048];
            if (hub_resolve_location(url, t.resp.location, target, sizeof target)) {
                free(t.mem);
                return fail(HUB_ERR_PROTOCOL, err, errn, "bad redirect from %s", cfg->endpoint);
            }
            if (hub_same_origin(url, target) && hop < 10) {
                snprintf(url, sizeof url, "%s", target);
                continue;
            }
            /* off the hub: the metadata is on this answer; the bytes are at target */
            snprintf(m->url, sizeof m->url, "%s", target);
            m->auth = hub_same_origin(url, target);
        } else if (st >= 200 && st < 300) {
            snprintf(m->url, sizeof m->url, "%s", url);
            m->auth = 1;
        } else {
            free(t.mem);
            if (st >= 300 && st < 400)
                return fail(HUB_ERR_PROTOCOL, err, errn, "HTTP %ld without a Location", st);
            const hub_status e = http_error(cfg, spec, file, revision, &t.resp, err, errn);
            if (e == HUB_ERR_FILE_NOT_FOUND && hub_valid_component(t.resp.repo_commit, 0))
                snprintf(m->commit, sizeof m->commit, "%s", t.resp.repo_commit);
            return e;
        }
        break;
    }
    free(t.mem);
    if (!t.resp.repo_commit[0] || !hub_valid_component(t.resp.repo_commit, 0))
        return fail(HUB_ERR_PROTOCOL, err, errn,
                    "%s sent no valid X-Repo-Commit for %s/%s: is HF_ENDPOINT a hub?",
                    cfg->endpoint, spec->repo, file);
    snprintf(m->commit, sizeof m->commit, "%s", t.resp.repo_commit);
    const char *etag = t.resp.linked_etag[0] ? t.resp.linked_etag : t.resp.etag;
    if (!etag[0] || hub_normalize_etag(etag, m->etag, sizeof m->etag))
        return fail(HUB_ERR_PROTOCOL, err, errn, "%s sent no usable ETag for %s/%s",
                    cfg->endpoint, spec->repo, file);
    const int redirected = t.resp.status >= 300 && t.resp.status < 400;
    m->size = t.resp.linked_size >= 0 ? t.resp.linked_size
              : redirected            ? -1
                                      : t.resp.content_length;
    return HUB_OK;
}

/* The repo's file names at revision (the model-info API, as huggingface_hub's model_info). */
static hub_status list_files(const hub_config *cfg, const hub_spec *spec, const char *revision,
                             char ***files, int *n, char *err, size_t errn) {
    char rev[600], url[2048];
    if (hub_url_quote(revision, rev, sizeof rev, 0) ||
        !fits(snprintf(url, sizeof url, "%s/api/models/%s/revision/%s", cfg->endpoint,
                       spec->repo, rev), sizeof url))
        return fail(HUB_ERR_USAGE, err, errn, "the listing URL for %s is too long", spec->repo);
    transfer t = {.cfg = cfg, .fd = -1};
    const CURLcode rc = request_retrying(&t, "GET", url, 1, cfg->max_retries);
    hub_status st = HUB_OK;
    if (rc != CURLE_OK)
        st = fail(HUB_ERR_NETWORK, err, errn, "cannot reach %s: %s", cfg->endpoint,
                  curl_easy_strerror(rc));
    else if (t.resp.status != 200)
        st = http_error(cfg, spec, NULL, revision, &t.resp, err, errn);
    else {
        char commit[64];
        *n = hub_parse_listing(t.mem ? t.mem : "", t.mem_len, files, commit);
        if (*n < 0)
            st = fail(HUB_ERR_PROTOCOL, err, errn, "%s sent a listing of %s that is not one",
                      cfg->endpoint, spec->repo);
    }
    free(t.mem);
    return st;
}

/* The GET into blobs/<etag>.incomplete, resumed from what it holds (an earlier run's
 * part included), with retries while the transfer makes progress. */
static hub_status fetch_blob(const hub_config *cfg, const file_meta *m, const char *incomplete,
                             const char *label, int force, hub_result *res, char *err,
                             size_t errn) {
    const int fd = open(incomplete, O_WRONLY | O_CREAT | (force ? O_TRUNC : 0), 0666);
    if (fd < 0) return disk_error(err, errn, "write", incomplete, errno);
    struct stat st;
    fstat(fd, &st);
    transfer t = {.cfg = cfg, .fd = fd, .offset = (uint64_t)st.st_size, .label = label,
                  .total = m->size > 0 ? (uint64_t)m->size : 0};
    if (m->size >= 0 && t.offset > (uint64_t)m->size) {
        /* longer than the file: not a part of it */
        if (ftruncate(fd, 0) != 0) {
            close(fd);
            return disk_error(err, errn, "write", incomplete, errno);
        }
        t.offset = 0;
    }
    lseek(fd, (off_t)t.offset, SEEK_SET);
    if (t.offset > 0) res->resumed = 1;
    t.start_ms = t.last_draw_ms = now_ms();
    t.start_bytes = t.offset;
    hub_status out = HUB_OK;
    int failures = 0;
    while (m->size < 0 || t.offset < (uint64_t)m->size) {
        const CURLcode rc = request(&t, "GET", m->url, m->auth, 1, 1);
        if (t.write_errno) {
            const int e = t.write_errno;
            close(fd);
            /* a full disk: give the space back rather than keep a part nobody can finish */
            unlink(incomplete);
            return disk_error(err, errn, "write", incomplete, e);
        }
        const long code = t.resp.status;
        if (rc == CURLE_OK && (code == 200 || code == 206) && t.body_started != 2) {
            if (m->size < 0) break; /* no size announced: the body as sent */
            if (t.offset >= (uint64_t)m->size) break;
        } else if (rc == CURLE_OK && code == 416 && t.offset > 0) {
            /* our part is not a prefix the server knows: start over */
            if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) {
                const int e = errno;
                close(fd);
                return disk_error(err, errn, "write", incomplete, e);
            }
            t.offset = 0;
            res->resumed = 0;
            continue;
        } else if (rc == CURLE_OK && !retryable_status(code)) {
            out = fail(code == 401 || code == 403 ? HUB_ERR_AUTH : HUB_ERR_NETWORK, err, errn,
                       "downloading %s: HTTP %ld", label, code);
            break;
        }
        /* lost connection, 429 or 5xx: retry; a try that brought bytes resets the count */
        if (t.received > 0) failures = 0;
        if (t.offset > 0) res->resumed = 1;
        if (++failures > cfg->max_retries) {
            out = fail(HUB_ERR_NETWORK, err, errn,
                       "downloading %s: %s after %d tries (%llu bytes kept in %s; run again to "
                       "resume)", label,
                       rc != CURLE_OK ? curl_easy_strerror(rc) : "the server kept failing",
                       failures, (unsigned long long)t.offset, incomplete);
            break;
        }
        if (cfg->progress) fprintf(stderr, "\r\033[K");
        backoff(cfg, failures, &t.resp);
    }
    if (cfg->progress && out == HUB_OK) draw_progress(&t, 1);
    else if (cfg->progress) fprintf(stderr, "\r\033[K");
    if (fsync(fd) != 0 && out == HUB_OK && errno != EINVAL)
        out = disk_error(err, errn, "write", incomplete, errno);
    if (close(fd) != 0 && out == HUB_OK) out = disk_error(err, errn, "write", incomplete, errno);
    if (out == HUB_OK) res->downloaded = 1;
    return out;
}

static void mark_no_exist(const hub_paths *p, const char *revision, const char *commit,
                          const char *file) {
    char path[PATH_CAP];
    if (!fits(snprintf(path, sizeof path, "%s/.no_exist/%s/%s", p->storage, commit, file),
              sizeof path) ||
        parent_dirs(path) != 0)
        return;
    const int fd = open(path, O_WRONLY | O_CREAT, 0666);
    if (fd >= 0) close(fd);
    write_ref(p, revision, commit);
}

static hub_status network_download(const hub_config *cfg, const hub_spec *spec,
                                   const char *file, const char *revision, int force,
                                   const file_meta *m, const hub_paths *p, hub_result *res,
                                   char *err, size_t errn) {
    char blob[PATH_CAP], pointer[PATH_CAP], incomplete[PATH_CAP], lock[PATH_CAP];
    if (!fits(snprintf(blob, sizeof blob, "%s/blobs/%s", p->storage, m->etag), sizeof blob) ||
        !fits(snprintf(pointer, sizeof pointer, "%s/snapshots/%s/%s", p->storage, m->commit, file),
              sizeof pointer) ||
        !fits(snprintf(incomplete, sizeof incomplete, "%s.incomplete", blob), sizeof incomplete) ||
        !fits(snprintf(lock, sizeof lock, "%s/.locks/%s/%s.lock", cfg->cache, p->folder, m->etag),
              sizeof lock))
        return fail(HUB_ERR_USAGE, err, errn, "cache paths too long under %s", cfg->cache);
    snprintf(res->commit, sizeof res->commit, "%s", m->commit);
    snprintf(res->path, sizeof res->path, "%s", pointer);
    res->source = "hub-cache";
    if (!force && access(pointer, R_OK) == 0) {
        /* known already: record the ref (best effort: the cache may be read-only) */
        write_ref(p, revision, m->commit);
        return HUB_OK;
    }
    if (mkdirs(cfg->cache)) return disk_error(err, errn, "create", cfg->cache, errno);
    char dir[PATH_CAP];
    if (!fits(snprintf(dir, sizeof dir, "%s/blobs", p->storage), sizeof dir) || mkdirs(dir))
        return disk_error(err, errn, "create", dir, errno);
    cachedir_tag(cfg->cache);
    if (write_ref(p, revision, m->commit))
        return disk_error(err, errn, "write the refs of", p->storage, errno);
    if (parent_dirs(lock)) return disk_error(err, errn, "create", lock, errno);
    const int lfd = open(lock, O_RDWR | O_CREAT, 0666);
    if (lfd < 0) return disk_error(err, errn, "create", lock, errno);
    if (flock(lfd, LOCK_EX | LOCK_NB) != 0) {
        /* another process (ours or huggingface_hub's) is fetching this blob: wait for it */
        if (cfg->progress) fprintf(stderr, "waiting for another download of %s ...\n", file);
        while (flock(lfd, LOCK_EX) != 0 && errno == EINTR) {}
    }
    hub_status st = HUB_OK;
    if (force || access(blob, R_OK) != 0) {
        st = fetch_blob(cfg, m, incomplete, file, force, res, err, errn);
        uint64_t size = 0;
        if (st == HUB_OK && file_size(incomplete, &size) == 0 && m->size >= 0 &&
            size != (uint64_t)m->size) {
            unlink(incomplete);
            st = fail(HUB_ERR_CHECKSUM, err, errn, "%s: got %llu bytes, the hub announced %lld",
                      file, (unsigned long long)size, (long long)m->size);
        }
        /* an LFS file's ETag is its SHA-256: nothing else enters the cache under it */
        int lfs = strlen(m->etag) == 64;
        for (const char *c = m->etag; lfs && *c; c++)
            lfs = (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f');
        if (st == HUB_OK && lfs) {
            char got[65];
            if (hub_sha256_file(incomplete, got) != 0)
                st = fail(HUB_ERR_DISK, err, errn, "cannot read back %s: %s", incomplete,
                          strerror(errno));
            else if (strcmp(got, m->etag)) {
                unlink(incomplete);
                st = fail(HUB_ERR_CHECKSUM, err, errn,
                          "%s: checksum mismatch: sha256 of the download is %s, the hub's is %s "
                          "(the file was deleted; run again)", file, got, m->etag);
            }
        }
        if (st == HUB_OK) {
            /* the permissions a new file gets here, as huggingface_hub's _chmod_and_move */
            const mode_t mask = umask(0);
            umask(mask);
            chmod(incomplete, 0666 & ~mask);
            if (rename(incomplete, blob) != 0) st = disk_error(err, errn, "write", blob, errno);
        }
    }
    if (st == HUB_OK && make_pointer(pointer, file, m->etag) != 0)
        st = disk_error(err, errn, "write", pointer, errno);
    flock(lfd, LOCK_UN);
    close(lfd);
    return st;
}

#endif /* NEEDLE_HAVE_CURL */

/* ---- hub_download ------------------------------------------------------------------------- */

static hub_status offline_result(const hub_config *cfg, const hub_spec *spec, const char *file,
                                 const char *revision, const char *why, hub_result *res,
                                 char *err, size_t errn) {
    if (cached_lookup(cfg, spec, file, revision, res) == 0) return HUB_OK;
    return fail(HUB_ERR_OFFLINE, err, errn,
                "%s and %s/%s (revision %s) is not in the cache %s: run `needle download "
                "%s` with the network on", why, spec->repo, file, revision, cfg->cache,
                spec->text[0] ? spec->text : spec->repo);
}

/* The one .cact among names, or an error listing what is there. */
static hub_status pick_cact(const hub_spec *spec, char **names, int n, char *file, size_t filen,
                            char *err, size_t errn) {
    int found = -1, count = 0;
    char list[1024] = "";
    for (int i = 0; i < n; i++) {
        const size_t len = strlen(names[i]);
        if (len < 5 || strcmp(names[i] + len - 5, ".cact")) continue;
        if (count++ == 0) found = i;
        if (strlen(list) + len + 3 < sizeof list) {
            if (list[0]) strcat(list, ", ");
            strcat(list, names[i]);
        }
    }
    if (count == 1) {
        snprintf(file, filen, "%s", names[found]);
        return HUB_OK;
    }
    if (count == 0)
        return fail(HUB_ERR_AMBIGUOUS, err, errn,
                    "%s holds no .cact file: name the file, ORG/REPO/FILE", spec->repo);
    return fail(HUB_ERR_AMBIGUOUS, err, errn,
                "%s holds %d .cact files (%s): name one, e.g. %s/%s", spec->repo, count, list,
                spec->repo, names[found]);
}

hub_status hub_download(const hub_config *cfg, const hub_spec *spec, const char *revision,
                        int force, const char *out_dir, hub_result *res, char *err,
                        size_t errn) {
    memset(res, 0, sizeof *res);
    err[0] = 0;
    if (!revision || !revision[0]) revision = "main";
    if (!hub_valid_repo(spec->repo))
        return fail(HUB_ERR_USAGE, err, errn, "'%s' is not a repository name", spec->repo);
    if (!hub_valid_component(revision, 1) || strlen(revision) >= sizeof res->revision)
        return fail(HUB_ERR_USAGE, err, errn, "'%s' is not a revision name", revision);
    hub_paths p;
    if (model_cache_repo_folder(spec->repo, p.folder, sizeof p.folder) ||
        !fits(snprintf(p.storage, sizeof p.storage, "%s/%s", cfg->cache, p.folder),
              sizeof p.storage))
        return fail(HUB_ERR_USAGE, err, errn, "the cache path %s is too long", cfg->cache);
    snprintf(res->repo, sizeof res->repo, "%s", spec->repo);
    snprintf(res->revision, sizeof res->revision, "%s", revision);
    char file[1024];
    snprintf(file, sizeof file, "%s", spec->file);
    hub_status st = HUB_OK;

    if (!file[0]) {
        /* ORG/REPO: its one .cact, from the listing (or, offline, the cached snapshot) */
        char **names = NULL;
        int n = 0;
        if (cfg->offline) {
            n = cached_cact_files(cfg, spec, revision, &names);
            if (n == 0)
                return fail(HUB_ERR_OFFLINE, err, errn,
                            "HF_HUB_OFFLINE=1 and nothing of %s (revision %s) is in the cache "
                            "%s: run `needle download %s` with the network on", spec->repo,
                            revision, cfg->cache, spec->text[0] ? spec->text : spec->repo);
        } else {
#ifdef NEEDLE_HAVE_CURL
            st = list_files(cfg, spec, revision, &names, &n, err, errn);
#else
            st = fail(HUB_ERR_NO_CURL, err, errn,
                      "built without libcurl: `needle download` cannot reach the hub (install "
                      "libcurl4-openssl-dev and rebuild)");
#endif
            if (st) return st;
        }
        st = pick_cact(spec, names, n, file, sizeof file, err, errn);
        hub_free_list(names, n);
        if (st) return st;
    }
    snprintf(res->file, sizeof res->file, "%s", file);

    if (cfg->offline) {
        st = offline_result(cfg, spec, file, revision, "HF_HUB_OFFLINE=1", res, err, errn);
    } else if (!force && model_cache_is_commit(revision) &&
               cached_lookup(cfg, spec, file, revision, res) == 0) {
        /* a commit never changes: no need to ask */
    } else {
#ifdef NEEDLE_HAVE_CURL
        file_meta m;
        memset(&m, 0, sizeof m);
        /* as huggingface_hub: with a cached copy, one try and then the copy (a machine
         * without network does not wait through the retries); without, the retries */
        hub_result cached;
        const int have_cached = !force && cached_lookup(cfg, spec, file, revision, &cached) == 0;
        st = head_file(cfg, spec, file, revision, have_cached ? 0 : cfg->max_retries, &m, err,
                       errn);
        if (st == HUB_ERR_NETWORK && have_cached) {
            snprintf(res->path, sizeof res->path, "%s", cached.path);
            snprintf(res->commit, sizeof res->commit, "%s", cached.commit);
            res->source = cached.source;
            if (cfg->progress)
                fprintf(stderr, "needle download: %s; using the cached copy\n", err);
            st = HUB_OK;
        } else if (st == HUB_ERR_NETWORK) {
            const size_t len = strlen(err);
            snprintf(err + len, errn - len, " (and %s/%s is not cached)", spec->repo, file);
        } else if (st == HUB_ERR_FILE_NOT_FOUND && m.commit[0]) {
            /* remembered as huggingface_hub does: .no_exist/<commit>/<file>, and the ref */
            mark_no_exist(&p, revision, m.commit, file);
        } else if (st == HUB_OK) {
            st = network_download(cfg, spec, file, revision, force, &m, &p, res, err, errn);
        }
#else
        if (cached_lookup(cfg, spec, file, revision, res) == 0 && !force) st = HUB_OK;
        else
            st = fail(HUB_ERR_NO_CURL, err, errn,
                      "built without libcurl: `needle download` cannot reach the hub, and "
                      "%s/%s is not cached (install libcurl4-openssl-dev and rebuild)",
                      spec->repo, file);
#endif
    }
    if (st) return st;
    if (file_size(res->path, &res->size) != 0)
        return fail(HUB_ERR_DISK, err, errn, "cannot read %s: %s", res->path, strerror(errno));
    if (out_dir) return copy_out(res->path, out_dir, file, res->out_path, sizeof res->out_path,
                                 err, errn);
    return HUB_OK;
}

/* ---- what the caches hold -------------------------------------------------------------------- */

typedef struct cached_list {
    hub_cached *items;
    int n, cap;
} cached_list;

static hub_cached *cached_add(cached_list *l) {
    if (l->n == l->cap) {
        const int cap = l->cap ? 2 * l->cap : 8;
        hub_cached *grown = realloc(l->items, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        l->items = grown;
        l->cap = cap;
    }
    hub_cached *c = &l->items[l->n++];
    memset(c, 0, sizeof *c);
    return c;
}

/* the names in refs/ (one level: main, v1; nested refs/pr/1 are not models' defaults)
 * that hold commit, joined by commas */
static void refs_of(const char *storage, const char *commit, char *out, size_t n) {
    char dir[PATH_CAP];
    out[0] = 0;
    if (!fits(snprintf(dir, sizeof dir, "%s/refs", storage), sizeof dir)) return;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_CAP], buf[64] = {0};
        if (!fits(snprintf(path, sizeof path, "%s/%s", dir, e->d_name), sizeof path)) continue;
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        const size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = 0;
        buf[strcspn(buf, "\r\n")] = 0;
        if (strcmp(buf, commit) || strlen(out) + strlen(e->d_name) + 2 > n) continue;
        if (out[0]) strcat(out, ",");
        strcat(out, e->d_name);
    }
    closedir(d);
}

/* .cact files under dir (relative names from rel), depth levels down */
static int scan_cact(cached_list *l, const char *dir, const char *rel, int depth,
                     const hub_cached *proto) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_CAP], name[1024];
        if (!fits(snprintf(path, sizeof path, "%s/%s", dir, e->d_name), sizeof path) ||
            !fits(snprintf(name, sizeof name, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name),
                  sizeof name))
            continue;
        struct stat st;
        if (stat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            if (depth > 0) rc = scan_cact(l, path, name, depth - 1, proto);
            continue;
        }
        const size_t len = strlen(e->d_name);
        if (!S_ISREG(st.st_mode) || len < 6 || strcmp(e->d_name + len - 5, ".cact")) continue;
        hub_cached *c = cached_add(l);
        if (!c) return -1;
        *c = *proto;
        snprintf(c->path, sizeof c->path, "%s", path);
        const int w = snprintf(c->name, sizeof c->name, "%s/%s",
                               proto->repo[0] ? proto->repo : proto->name, name);
        if (!fits(w, sizeof c->name)) {
            l->n--;
            continue;
        }
        c->size = (uint64_t)st.st_size;
        c->mtime = platform_link_mtime(path);
    }
    closedir(d);
    return rc;
}

static int by_source_and_name(const void *a, const void *b) {
    const hub_cached *x = a, *y = b;
    const int s = strcmp(x->source, y->source);
    return s ? s : strcmp(x->name, y->name);
}

int hub_list_cached(const hub_config *cfg, hub_cached **out) {
    cached_list l = {0};
    *out = NULL;
    DIR *d = opendir(cfg->cache);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "models--", 8)) continue;
        /* models--ORG--NAME: ORG and NAME hold no "--" (hub_valid_repo) */
        const char *sep = strstr(e->d_name + 8, "--");
        if (!sep) continue;
        hub_cached proto = {.source = "hub-cache"};
        if (!fits(snprintf(proto.repo, sizeof proto.repo, "%.*s/%s",
                           (int)(sep - e->d_name - 8), e->d_name + 8, sep + 2),
                  sizeof proto.repo))
            continue;
        char storage[PATH_CAP], snaps[PATH_CAP];
        if (!fits(snprintf(storage, sizeof storage, "%s/%s", cfg->cache, e->d_name), sizeof storage) ||
            !fits(snprintf(snaps, sizeof snaps, "%s/snapshots", storage), sizeof snaps))
            continue;
        DIR *sd = opendir(snaps);
        struct dirent *se;
        while (sd && (se = readdir(sd)) != NULL) {
            if (se->d_name[0] == '.' || strlen(se->d_name) >= sizeof proto.commit) continue;
            char dir[PATH_CAP];
            if (!fits(snprintf(dir, sizeof dir, "%s/%s", snaps, se->d_name), sizeof dir)) continue;
            memcpy(proto.commit, se->d_name, strlen(se->d_name) + 1); /* fits: checked above */
            refs_of(storage, se->d_name, proto.revision, sizeof proto.revision);
            if (!proto.revision[0]) snprintf(proto.revision, sizeof proto.revision, "%s", se->d_name);
            if (scan_cact(&l, dir, "", 2, &proto)) {
                closedir(sd);
                closedir(d);
                free(l.items);
                return -1;
            }
        }
        if (sd) closedir(sd);
    }
    if (d) closedir(d);
    /* the official package's copies: ~/.cache/cactus-needle/{v3,v2,whistle}/VERSION/ */
    const char *home = getenv("HOME");
    static const char *const folders[] = {"v3", "v2", "whistle"};
    for (size_t i = 0; home && home[0] && i < sizeof folders / sizeof folders[0]; i++) {
        char dir[PATH_CAP];
        if (!fits(snprintf(dir, sizeof dir, "%s/.cache/cactus-needle/%s", home, folders[i]),
                  sizeof dir))
            continue;
        DIR *vd = opendir(dir);
        struct dirent *ve;
        while (vd && (ve = readdir(vd)) != NULL) {
            if (ve->d_name[0] == '.') continue;
            hub_cached proto = {.source = "official-cache"};
            char vdir[PATH_CAP];
            if (!fits(snprintf(vdir, sizeof vdir, "%s/%s", dir, ve->d_name), sizeof vdir) ||
                !fits(snprintf(proto.name, sizeof proto.name, "cactus-needle/%s/%s", folders[i],
                               ve->d_name), sizeof proto.name))
                continue;
            snprintf(proto.revision, sizeof proto.revision, "%s", ve->d_name);
            if (scan_cact(&l, vdir, "", 0, &proto)) {
                closedir(vd);
                free(l.items);
                return -1;
            }
        }
        if (vd) closedir(vd);
    }
    /* readdir's order is the filesystem's: a stable listing instead */
    if (l.n > 1) qsort(l.items, (size_t)l.n, sizeof *l.items, by_source_and_name);
    *out = l.items;
    return l.n;
}
