/* hub_parse.c: the hub client's pure parts: SPECs, names, response headers, redirects and
 * listings (see hub.h). No I/O: tests/fuzz/fuzz_hub.c feeds these arbitrary bytes. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hub.h"

const char *hub_status_name(hub_status st) {
    switch (st) {
    case HUB_OK: return "ok";
    case HUB_ERR_USAGE: return "usage";
    case HUB_ERR_NO_CURL: return "no-curl";
    case HUB_ERR_OFFLINE: return "offline";
    case HUB_ERR_AUTH: return "auth";
    case HUB_ERR_REPO_NOT_FOUND: return "repo-not-found";
    case HUB_ERR_FILE_NOT_FOUND: return "file-not-found";
    case HUB_ERR_REVISION: return "revision-not-found";
    case HUB_ERR_AMBIGUOUS: return "ambiguous";
    case HUB_ERR_NETWORK: return "network";
    case HUB_ERR_PROTOCOL: return "protocol";
    case HUB_ERR_CHECKSUM: return "checksum";
    case HUB_ERR_DISK: return "disk";
    }
    return "unknown";
}

static hub_status fail(hub_status st, char *err, size_t errn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static hub_status fail(hub_status st, char *err, size_t errn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errn) vsnprintf(err, errn, fmt, ap);
    va_end(ap);
    return st;
}

static int name_char(char c) {
    return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

int hub_valid_component(const char *s, int slash_ok) {
    if (!s[0] || s[0] == '.' || strstr(s, "..")) return 0;
    for (const char *p = s; *p; p++)
        if (!name_char(*p) && !(slash_ok && *p == '/' && p[1] && p[1] != '/' && p[1] != '.'))
            return 0;
    return 1;
}

/* one half of ORG/NAME */
static int repo_part(const char *s, size_t n) {
    if (n == 0 || n > 96) return 0;
    for (size_t i = 0; i < n; i++)
        if (!name_char(s[i])) return 0;
    if (s[0] == '-' || s[0] == '.' || s[n - 1] == '-' || s[n - 1] == '.') return 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '.' && s[i + 1] == '.') return 0;
    /* "--" would make models--ORG--NAME ambiguous; the hub refuses it too */
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '-' && s[i + 1] == '-') return 0;
    return 1;
}

int hub_valid_repo(const char *repo) {
    const char *slash = strchr(repo, '/');
    if (!slash || strchr(slash + 1, '/')) return 0;
    return repo_part(repo, (size_t)(slash - repo)) && repo_part(slash + 1, strlen(slash + 1));
}

int hub_valid_filename(const char *file) {
    if (!file[0] || file[0] == '/' || strlen(file) >= 1024) return 0;
    const char *p = file;
    while (*p) {
        const char *end = strchr(p, '/');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)p[i] < 0x20 || p[i] == '\\' || p[i] == 0x7f) return 0;
        p += n;
        if (*p == '/') p++;
        if (end && !*p) return 0; /* a trailing slash */
    }
    return 1;
}

hub_status hub_parse_spec(const char *spec, hub_spec *out, char *err, size_t errn) {
    memset(out, 0, sizeof *out);
    if (strlen(spec) >= sizeof out->text)
        return fail(HUB_ERR_USAGE, err, errn, "the SPEC is too long");
    snprintf(out->text, sizeof out->text, "%s", spec);
    static const struct { const char *name, *repo, *file, *official; } named[] = {
        {"needle3", "Cactus-Compute/needle3", "needle3.cact", "v3"},
        {"needle2", "Cactus-Compute/needle2", "needle2.cact", "v2"},
        {"whistle", "Cactus-Compute/whistle", "whistle.cact", "whistle"},
    };
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (!strcmp(spec, named[i].name)) {
            snprintf(out->repo, sizeof out->repo, "%s", named[i].repo);
            snprintf(out->file, sizeof out->file, "%s", named[i].file);
            snprintf(out->official, sizeof out->official, "%s", named[i].official);
            return HUB_OK;
        }
    if (!strncmp(spec, "checkpoints/", 12)) {
        const char *name = spec + 12;
        if (!name[0] || strchr(name, '/') || !hub_valid_filename(name))
            return fail(HUB_ERR_USAGE, err, errn,
                        "'%s': checkpoints/NAME takes a file name (checkpoints/needle3.safetensors)",
                        spec);
        /* a checkpoint lives in its generation's repo: needle2's for needle2*, else needle3's */
        snprintf(out->repo, sizeof out->repo, "Cactus-Compute/%s",
                 strncmp(name, "needle2", 7) ? "needle3" : "needle2");
        snprintf(out->file, sizeof out->file, "checkpoints/%s", name);
        return HUB_OK;
    }
    const char *s1 = strchr(spec, '/');
    const char *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
    const size_t repo_len = s2 ? (size_t)(s2 - spec) : strlen(spec);
    if (!s1 || repo_len >= sizeof out->repo)
        return fail(HUB_ERR_USAGE, err, errn,
                    "'%s' is not a model: use needle3, needle2, whistle, checkpoints/NAME, "
                    "ORG/REPO or ORG/REPO/FILE", spec);
    memcpy(out->repo, spec, repo_len);
    out->repo[repo_len] = 0;
    if (!hub_valid_repo(out->repo))
        return fail(HUB_ERR_USAGE, err, errn, "'%s' is not a repository name (ORG/REPO)",
                    out->repo);
    if (s2) {
        if (!hub_valid_filename(s2 + 1))
            return fail(HUB_ERR_USAGE, err, errn, "'%s' is not a file name inside a repository",
                        s2 + 1);
        snprintf(out->file, sizeof out->file, "%s", s2 + 1);
    }
    return HUB_OK;
}

/* ---- headers ------------------------------------------------------------------------------ */

void hub_response_reset(hub_response *r) {
    memset(r, 0, sizeof *r);
    r->linked_size = r->content_length = r->range_total = r->range_start = -1;
    r->retry_after = -1;
}

static int parse_i64(const char *s, size_t n, int64_t *out) {
    if (n == 0 || n > 18) return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

static void set_text(char *field, size_t cap, const char *v, size_t n) {
    if (n >= cap) return; /* too long to be what it claims: leave it unset */
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)v[i] < 0x20 && v[i] != '\t') return;
    memcpy(field, v, n);
    field[n] = 0;
}

void hub_response_header(hub_response *r, const char *line, size_t n) {
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
    if (n >= 5 && !memcmp(line, "HTTP/", 5)) {
        /* a new response: "HTTP/1.1 302 Found", "HTTP/2 200" */
        hub_response_reset(r);
        size_t i = 5;
        while (i < n && line[i] != ' ') i++;
        while (i < n && line[i] == ' ') i++;
        int64_t code;
        size_t j = i;
        while (j < n && line[j] >= '0' && line[j] <= '9') j++;
        if (j - i == 3 && parse_i64(line + i, 3, &code) == 0) r->status = (long)code;
        return;
    }
    const char *colon = memchr(line, ':', n);
    if (!colon) return;
    const size_t name_len = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vn = n - name_len - 1;
    while (vn && (*v == ' ' || *v == '\t')) v++, vn--;
    while (vn && (v[vn - 1] == ' ' || v[vn - 1] == '\t')) vn--;
#define IS(name) (name_len == sizeof(name) - 1 && !strncasecmp(line, name, name_len))
    if (IS("X-Repo-Commit")) set_text(r->repo_commit, sizeof r->repo_commit, v, vn);
    else if (IS("X-Linked-Etag")) set_text(r->linked_etag, sizeof r->linked_etag, v, vn);
    else if (IS("ETag")) set_text(r->etag, sizeof r->etag, v, vn);
    else if (IS("Location")) set_text(r->location, sizeof r->location, v, vn);
    else if (IS("X-Error-Code")) set_text(r->error_code, sizeof r->error_code, v, vn);
    else if (IS("Content-Encoding"))
        set_text(r->content_encoding, sizeof r->content_encoding, v, vn);
    else if (IS("X-Linked-Size")) {
        if (parse_i64(v, vn, &r->linked_size)) r->linked_size = -1;
    } else if (IS("Content-Length")) {
        if (parse_i64(v, vn, &r->content_length)) r->content_length = -1;
    } else if (IS("Retry-After")) {
        int64_t s;
        /* seconds only; an HTTP date is rare on the hub and falls back to our backoff */
        r->retry_after = parse_i64(v, vn, &s) == 0 ? (double)s : -1;
    } else if (IS("Content-Range")) {
        /* bytes START-END/TOTAL */
        if (vn > 6 && !strncasecmp(v, "bytes ", 6)) {
            const char *dash = memchr(v + 6, '-', vn - 6);
            const char *slash = memchr(v + 6, '/', vn - 6);
            int64_t a, total;
            if (dash && slash && dash < slash &&
                parse_i64(v + 6, (size_t)(dash - v - 6), &a) == 0 &&
                parse_i64(slash + 1, (size_t)(v + vn - slash - 1), &total) == 0) {
                r->range_start = a;
                r->range_total = total;
            }
        }
    }
#undef IS
}

int hub_normalize_etag(const char *etag, char *out, size_t n) {
    /* as Python's etag.lstrip("W/").strip('"'): every leading W or /, then quotes */
    const char *s = etag;
    while (*s == 'W' || *s == '/') s++;
    size_t len = strlen(s);
    while (len && s[0] == '"') s++, len--;
    while (len && s[len - 1] == '"') len--;
    if (len == 0 || len >= n) return -1;
    memcpy(out, s, len);
    out[len] = 0;
    return hub_valid_component(out, 0) ? 0 : -1;
}

/* ---- URLs ----------------------------------------------------------------------------------- */

/* the length of "scheme://host[:port]" of an absolute URL, or 0 */
static size_t origin_len(const char *url) {
    const char *sep = strstr(url, "://");
    if (!sep || sep == url) return 0;
    for (const char *p = url; p < sep; p++)
        if (!isalnum((unsigned char)*p) && *p != '+' && *p != '-' && *p != '.') return 0;
    const char *host = sep + 3;
    const size_t host_len = strcspn(host, "/?#");
    if (host_len == 0) return 0;
    return (size_t)(host - url) + host_len;
}

int hub_same_origin(const char *a, const char *b) {
    const size_t na = origin_len(a), nb = origin_len(b);
    return na && na == nb && !strncasecmp(a, b, na);
}

int hub_resolve_location(const char *base, const char *location, char *out, size_t n) {
    for (const char *p = location; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f) return -1;
    if (!location[0]) return -1;
    int w;
    if (origin_len(location)) {
        w = snprintf(out, n, "%s", location);
    } else {
        const size_t ol = origin_len(base);
        if (!ol) return -1;
        if (location[0] == '/' && location[1] == '/') {
            /* scheme-relative: the base's scheme */
            const char *sep = strstr(base, "://");
            w = snprintf(out, n, "%.*s:%s", (int)(sep - base), base, location);
        } else if (location[0] == '/') {
            w = snprintf(out, n, "%.*s%s", (int)ol, base, location);
        } else {
            /* relative to the base's directory (its path without the query) */
            const size_t path_end = ol + strcspn(base + ol, "?#");
            size_t dir = path_end;
            while (dir > ol && base[dir - 1] != '/') dir--;
            if (dir == ol) w = snprintf(out, n, "%.*s/%s", (int)ol, base, location);
            else w = snprintf(out, n, "%.*s%s", (int)dir, base, location);
        }
    }
    if (w < 0 || (size_t)w >= n) return -1;
    /* "////x" against http://h/ gives "http:////x": no host, not a URL to fetch */
    return origin_len(out) ? 0 : -1;
}

int hub_url_path(const char *in, char *out, size_t n) { return hub_url_quote(in, out, n, 1); }

int hub_url_quote(const char *in, char *out, size_t n, int keep_slash) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        /* Python's urllib.parse.quote keeps letters, digits, _.-~ and the safe '/' */
        const int keep = isalnum(*p) || *p == '_' || *p == '.' || *p == '-' || *p == '~' ||
                         (*p == '/' && keep_slash);
        if (o + (keep ? 1 : 3) >= n) return -1;
        if (keep) out[o++] = (char)*p;
        else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    if (o >= n) return -1;
    out[o] = 0;
    return 0;
}

/* ---- listings ------------------------------------------------------------------------------ */

void hub_free_list(char **files, int n) {
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
}

int hub_parse_listing(const char *body, size_t n, char ***files, char commit[64]) {
    *files = NULL;
    commit[0] = 0;
    cJSON *root = cJSON_ParseWithLength(body, n);
    if (!root) return -1;
    const cJSON *sib = cJSON_GetObjectItemCaseSensitive(root, "siblings");
    if (!cJSON_IsObject(root) || !cJSON_IsArray(sib)) {
        cJSON_Delete(root);
        return -1;
    }
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(root, "sha");
    if (cJSON_IsString(sha) && strlen(sha->valuestring) < 64 &&
        hub_valid_component(sha->valuestring, 0))
        snprintf(commit, 64, "%s", sha->valuestring);
    const int total = cJSON_GetArraySize(sib);
    char **out = calloc((size_t)total + 1, sizeof *out);
    int count = 0;
    if (!out) {
        cJSON_Delete(root);
        return -1;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, sib) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "rfilename");
        if (!cJSON_IsString(name) || !hub_valid_filename(name->valuestring)) continue;
        out[count] = strdup(name->valuestring);
        if (!out[count]) {
            hub_free_list(out, count);
            cJSON_Delete(root);
            return -1;
        }
        count++;
    }
    cJSON_Delete(root);
    *files = out;
    return count;
}
