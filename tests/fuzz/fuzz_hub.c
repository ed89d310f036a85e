/* libFuzzer target for the hub client's response parsing (src/hub/hub_parse.c): what a
 * server (or anything posing as the hub) sends back must never crash the client nor give
 * it a name that leaves the cache directory.
 *
 * The first byte selects the parser, the rest is its input:
 *   0  response header lines ("HTTP/1.1 302 ...", "X-Linked-Etag: ...", one per '\n'),
 *      then the ETags normalized and the Location resolved against a /resolve URL
 *   1  a model listing (JSON, /api/models/{repo}/revision/{rev})
 *   2  a SPEC as typed on the command line (needle3, ORG/REPO/FILE, checkpoints/NAME)
 *   3  a base URL, '\n', a Location to resolve against it
 * Invariants: header fields are NUL-terminated and numbers are -1 or >= 0; a normalized
 * ETag, a listed file name and a parsed SPEC pass the name checks the cache relies on
 * (no "..", no leading '/'); a resolved Location is an absolute URL (it has an origin);
 * a URL path is percent-encoded to the safe characters. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_text(const char *s, size_t cap) {
    if (!memchr(s, 0, cap)) abort();
}

static void check_name(const char *s) {
    if (strstr(s, "..") || s[0] == '/' || s[0] == '.' || strchr(s, '/')) {
        fprintf(stderr, "a cache name that escapes: %s\n", s);
        abort();
    }
}

static void check_resolved(const char *base, const char *loc) {
    char out[4096];
    if (hub_resolve_location(base, loc, out, sizeof out) != 0) return;
    if (!hub_same_origin(out, out)) {
        fprintf(stderr, "resolved to a URL without origin: %s (base %s, location %s)\n", out,
                base, loc);
        abort();
    }
}

static void headers(const char *text) {
    hub_response r;
    hub_response_reset(&r);
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        const size_t n = nl ? (size_t)(nl - p + 1) : strlen(p);
        hub_response_header(&r, p, n);
        p += n;
    }
    check_text(r.repo_commit, sizeof r.repo_commit);
    check_text(r.linked_etag, sizeof r.linked_etag);
    check_text(r.etag, sizeof r.etag);
    check_text(r.location, sizeof r.location);
    check_text(r.error_code, sizeof r.error_code);
    if (r.linked_size < -1 || r.content_length < -1 || r.range_total < -1 || r.range_start < -1)
        abort();
    if (r.status < 0 || r.status > 999) abort();
    char etag[160];
    if (hub_normalize_etag(r.linked_etag, etag, sizeof etag) == 0) check_name(etag);
    if (hub_normalize_etag(r.etag, etag, sizeof etag) == 0) check_name(etag);
    if (r.location[0])
        check_resolved("https://huggingface.co/org/repo/resolve/main/dir/f.cact?x=1", r.location);
    char enc[8192];
    if (hub_url_path(r.location, enc, sizeof enc) == 0)
        for (const char *c = enc; *c; c++)
            if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~/%", *c))
                abort();
}

static void listing(const char *body, size_t n) {
    char **files;
    char commit[64];
    const int count = hub_parse_listing(body, n, &files, commit);
    if (count < -1) abort();
    check_text(commit, sizeof commit);
    if (commit[0]) check_name(commit);
    for (int i = 0; i < count; i++)
        if (!hub_valid_filename(files[i]) || strstr(files[i], "/../") || files[i][0] == '/')
            abort();
    if (count >= 0) hub_free_list(files, count);
}

static void spec(const char *text) {
    hub_spec s;
    char err[512];
    if (hub_parse_spec(text, &s, err, sizeof err) != HUB_OK) {
        if (!err[0]) abort(); /* a refusal says why */
        return;
    }
    if (!hub_valid_repo(s.repo)) abort();
    if (s.file[0] && !hub_valid_filename(s.file)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 65536) return 0;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0; /* the parsers take C strings; a NUL inside ends the input early */
    switch (data[0] & 3) {
    case 0: headers(text); break;
    case 1: listing((const char *)data + 1, size - 1); break;
    case 2: spec(text); break;
    default: {
        char *nl = strchr(text, '\n');
        if (nl) {
            *nl = 0;
            check_resolved(text, nl + 1);
        }
    }
    }
    free(text);
    return 0;
}
