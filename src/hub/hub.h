/* hub.h: a client of the Hugging Face Hub's file protocol (needle_hub, a static library
 * outside libneedle that the CLI links; libcurl, optional at build time).
 *
 * It fetches files as huggingface_hub's hf_hub_download does, into the same cache:
 *   HEAD {endpoint}/{repo}/resolve/{revision}/{file}  (redirects on the same origin
 *        followed; X-Repo-Commit, X-Linked-Etag or ETag, X-Linked-Size read from the
 *        last answer, whose Location, when it leaves the origin, is the download URL)
 *   GET  that URL (Authorization only on the hub's own origin), Range: bytes=N- to resume
 *   <cache>/models--ORG--NAME/blobs/<etag>              the bytes (the SHA-256 for LFS files)
 *   <cache>/models--ORG--NAME/snapshots/<commit>/<file>  a relative symlink to the blob
 *   <cache>/models--ORG--NAME/refs/<revision>           the commit, when revision is a name
 *   <cache>/.locks/models--ORG--NAME/<etag>.lock        flock(2): one writer per blob
 *   <cache>/models--ORG--NAME/.no_exist/<commit>/<file> a file the hub said is missing
 * A file enters blobs/ only whole: it is written to blobs/<etag>.incomplete (kept for the
 * next run to resume), checked (size, and SHA-256 when the ETag is one), then renamed.
 *
 * The environment (hub_config_from_env): HF_ENDPOINT, HF_HUB_CACHE / HF_HOME, HF_TOKEN (or
 * HUGGING_FACE_HUB_TOKEN, else the file $HF_HOME/token), HF_HUB_OFFLINE. The token is
 * sent, never printed: no message of this library contains it. */
#ifndef NEEDLE_HUB_H
#define NEEDLE_HUB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- results --------------------------------------------------------------------------- */

typedef enum hub_status {
    HUB_OK = 0,
    HUB_ERR_USAGE,          /* a bad SPEC, repo or file name */
    HUB_ERR_NO_CURL,        /* this build has no libcurl */
    HUB_ERR_OFFLINE,        /* HF_HUB_OFFLINE=1 and the file is not cached */
    HUB_ERR_AUTH,           /* 401/403: gated or private */
    HUB_ERR_REPO_NOT_FOUND, /* 404 RepoNotFound */
    HUB_ERR_FILE_NOT_FOUND, /* 404 EntryNotFound (or a listing without the file) */
    HUB_ERR_REVISION,       /* 404 RevisionNotFound */
    HUB_ERR_AMBIGUOUS,      /* ORG/REPO holds several .cact files (or none) */
    HUB_ERR_NETWORK,        /* connection failures, 429/5xx after the retries */
    HUB_ERR_PROTOCOL,       /* an answer that is not the hub's (no X-Repo-Commit, bad ETag) */
    HUB_ERR_CHECKSUM,       /* the body's SHA-256 (or size) is not the linked ETag's */
    HUB_ERR_DISK,           /* disk full, or the cache or --out not writable */
} hub_status;

const char *hub_status_name(hub_status st);

/* ---- configuration ----------------------------------------------------------------------- */

typedef struct hub_config {
    char endpoint[1024]; /* no trailing slash */
    char cache[4096];    /* the hub cache directory */
    char token[1024];    /* "" = anonymous */
    int offline;         /* HF_HUB_OFFLINE */
    int progress;        /* draw a progress bar on stderr */
    int max_retries;     /* per request, on 429/5xx/connection loss without progress */
    double backoff_s;    /* the first wait; doubled each retry, at most 8 s */
} hub_config;

/* Fills *cfg from the environment; progress off. Returns HUB_OK, or HUB_ERR_USAGE with a
 * message in err when no cache directory can be named (no HOME, too long). */
hub_status hub_config_from_env(hub_config *cfg, char *err, size_t errn);

/* ---- what to fetch --------------------------------------------------------------------- */

typedef struct hub_spec {
    char repo[256];      /* ORG/NAME */
    char file[1024];     /* path inside the repo; "" = the repo's one .cact (listing) */
    char official[16];   /* "v3", "v2", "whistle": the official package's cache folder to
                            read too; "" for others */
    char text[1300];     /* the SPEC as given, for messages ("run `needle download TEXT`") */
} hub_spec;

/* needle2 | needle3 | whistle | checkpoints/NAME (Cactus-Compute/needle3, or needle2 when
 * NAME starts with "needle2") | ORG/REPO | ORG/REPO/FILE. Returns HUB_OK or HUB_ERR_USAGE
 * with a message. */
hub_status hub_parse_spec(const char *spec, hub_spec *out, char *err, size_t errn);

/* 1 if `repo` is ORG/NAME with the hub's characters (letters, digits, - _ .; no "..",
 * no leading or trailing - or .). */
int hub_valid_repo(const char *repo);
/* 1 if `file` is a relative path inside a repo: no empty, "." or ".." component, no
 * leading '/', no backslash or control byte. */
int hub_valid_filename(const char *file);
/* 1 if `s` can name a cache entry (an ETag, a commit, a revision): [A-Za-z0-9._-]+ (and
 * '/' for a revision when slash_ok), not starting with '.', no "..". */
int hub_valid_component(const char *s, int slash_ok);

/* ---- results of a download ------------------------------------------------------------- */

typedef struct hub_result {
    char repo[256];
    char file[1024];
    char revision[256];
    char commit[64];     /* "" for the official package's cache */
    char path[4096];     /* snapshots/<commit>/<file>, or the official cache's copy */
    char out_path[4096]; /* the copy made for --out, or "" */
    uint64_t size;
    int downloaded;      /* 1: bytes came over the network in this call */
    int resumed;         /* 1: the transfer resumed a partial file (Range) */
    const char *source;  /* "hub-cache" or "official-cache" */
} hub_result;

/* Fetches spec at `revision` (NULL = "main") into the cache unless it is there already
 * (force: fetch again), then copies it into out_dir when that is not NULL. Returns
 * HUB_OK with *res filled, or an error with a one-line message in err. */
hub_status hub_download(const hub_config *cfg, const hub_spec *spec, const char *revision,
                        int force, const char *out_dir, hub_result *res, char *err,
                        size_t errn);

/* ---- what the caches hold (needle models) ------------------------------------------------ */

typedef struct hub_cached {
    char name[1300];     /* ORG/NAME/FILE, or cactus-needle/FOLDER/VERSION/FILE */
    char repo[256];      /* "" for the official package's cache */
    char revision[256];  /* the refs naming this snapshot ("main", "main,v1"), else the
                            commit; the official cache's version folder */
    char commit[64];
    char path[4096];
    uint64_t size;
    double mtime;        /* of the snapshot entry (when it was cached) */
    const char *source;  /* "hub-cache" or "official-cache" */
} hub_cached;

/* The .cact files in the hub cache (snapshots of every models--* repo, three folders
 * deep) and in the official package's cache (~/.cache/cactus-needle/FOLDER/VERSION/).
 * Sorted by source (hub-cache first), then name. Returns the count with a malloc'ed array
 * in *out (free()), or -1 when out of memory. */
int hub_list_cached(const hub_config *cfg, hub_cached **out);

/* ---- response parsing (hub_parse.c; no network, fuzzed by tests/fuzz/fuzz_hub.c) ------ */

typedef struct hub_response {
    long status;             /* of the last status line */
    char repo_commit[64];    /* X-Repo-Commit */
    char linked_etag[160];   /* X-Linked-Etag */
    char etag[160];          /* ETag */
    char location[2048];     /* Location */
    char error_code[64];     /* X-Error-Code: RepoNotFound, EntryNotFound, GatedRepo, ... */
    char content_encoding[32];
    int64_t linked_size;     /* X-Linked-Size, -1 if absent */
    int64_t content_length;  /* Content-Length, -1 if absent */
    int64_t range_total;     /* the total of Content-Range: bytes A-B/TOTAL, -1 if absent */
    int64_t range_start;     /* A of Content-Range, -1 if absent */
    double retry_after;      /* Retry-After in seconds, -1 if absent */
} hub_response;

void hub_response_reset(hub_response *r);
/* One header line as libcurl hands it over ("Name: value\r\n", or a status line, which
 * starts a new response: on redirects and 100-continue several come in one transfer).
 * Values that do not fit their field, or bad numbers, leave the field unset. */
void hub_response_header(hub_response *r, const char *line, size_t n);

/* The ETag as a cache name: W/ and quotes removed (huggingface_hub's _normalize_etag).
 * Returns 0, or -1 if the result is empty or not a valid cache component. */
int hub_normalize_etag(const char *etag, char *out, size_t n);

/* The absolute URL a Location names relative to `base` (RFC 3986 reference resolution for
 * the forms servers send: absolute, //host/..., /path, relative path). Returns 0 or -1. */
int hub_resolve_location(const char *base, const char *location, char *out, size_t n);
/* 1 if a and b have the same scheme://host[:port] (case-insensitive scheme and host). */
int hub_same_origin(const char *a, const char *b);

/* The file names of a model listing (GET /api/models/{repo}/revision/{rev}: an object
 * whose "siblings" is an array of {"rfilename": ...}). Returns the count (0 or more) with
 * a malloc'ed array of malloc'ed names in *files (hub_free_list), or -1 if the body is not
 * such a listing. Names failing hub_valid_filename are skipped. Also the listing's "sha"
 * (the commit) in commit when it is a valid one, else "". */
int hub_parse_listing(const char *body, size_t n, char ***files, char commit[64]);
void hub_free_list(char **files, int n);

/* Percent-encodes a path for a URL, keeping '/' (as huggingface_hub's quote(filename)).
 * Returns 0, or -1 if it does not fit in n bytes. */
int hub_url_path(const char *in, char *out, size_t n);
/* The same, '/' encoded too unless keep_slash (a revision: quote(revision, safe="")). */
int hub_url_quote(const char *in, char *out, size_t n, int keep_slash);

#endif
