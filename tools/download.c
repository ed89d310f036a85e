/* download.c: `needle download` (a model from the Hugging Face Hub into the cache that
 * huggingface_hub shares) and `needle models` (what the caches hold, and the default).
 * The protocol and the cache live in the hub client library, src/hub (hub.h).
 *
 * `needle download` runs in the needle-download executable (tools/download_main.c), the
 * one linked with libcurl (needle_hub_net); `needle` itself links the network-free build
 * of the library (needle_hub) and execs needle-download (NEEDLE_DOWNLOAD_EXEC). A build
 * without libcurl has no needle-download: then `needle download` runs here and finds
 * cached files only. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "hub/hub.h"
#include "util/platform.h"

static int run_download(const cli_command *self, int argc, char **argv) {
#ifdef NEEDLE_DOWNLOAD_EXEC
    /* the network client (libcurl and its TLS chain) lives in needle-download */
    (void)self, (void)argc;
    return cli_exec_helper("needle-download", "download", argv);
#endif
    const char *spec_arg = NULL, *out = NULL, *revision = NULL;
    int force = 0, json = 0;
    const cli_option opts[] = {
        {"--out", "-o", CLI_TEXT, &out, 0, 0, NULL},
        {"--revision", NULL, CLI_TEXT, &revision, 0, 0, NULL},
        {"--force", NULL, CLI_FLAG, &force, 0, 0, NULL},
        {"--json", NULL, CLI_FLAG, &json, 0, 0, NULL},
        {0}};
    const int st = cli_parse(self, argc, argv, opts, &spec_arg, 1);
    if (st != CLI_GO) return st;
    if (!spec_arg) return cli_usage_error(self, "which model? (needle3, needle2, whistle, ...)");
    char err[2048];
    hub_spec spec;
    if (hub_parse_spec(spec_arg, &spec, err, sizeof err)) return cli_usage_error(self, "%s", err);
    hub_config cfg;
    if (hub_config_from_env(&cfg, err, sizeof err)) {
        fprintf(stderr, "needle download: %s\n", err);
        return 1;
    }
    cfg.progress = isatty(STDERR_FILENO);
    hub_result res;
    const hub_status hs = hub_download(&cfg, &spec, revision, force, out, &res, err, sizeof err);
    if (hs == HUB_ERR_USAGE) return cli_usage_error(self, "%s", err);
    if (hs) {
        fprintf(stderr, "needle download: %s\n", err);
        return 1;
    }
    if (json) {
        printf("{\"repo\": ");
        cli_json_string(stdout, res.repo);
        printf(", \"file\": ");
        cli_json_string(stdout, res.file);
        printf(", \"revision\": ");
        cli_json_string(stdout, res.revision);
        printf(", \"commit\": ");
        cli_json_string(stdout, res.commit);
        printf(", \"path\": ");
        cli_json_string(stdout, res.path);
        printf(", \"out\": ");
        if (res.out_path[0]) cli_json_string(stdout, res.out_path);
        else printf("null");
        printf(", \"size\": %llu, \"downloaded\": %s, \"resumed\": %s, \"source\": ",
               (unsigned long long)res.size, res.downloaded ? "true" : "false",
               res.resumed ? "true" : "false");
        cli_json_string(stdout, res.source);
        printf("}\n");
    } else {
        /* the path alone on stdout, for $(needle download needle3) */
        printf("%s\n", res.out_path[0] ? res.out_path : res.path);
        if (isatty(STDERR_FILENO))
            fprintf(stderr, "%s/%s (%s%s%.12s): %s, %llu bytes\n", res.repo, res.file,
                    res.commit[0] ? res.revision : "the official package's cache",
                    res.commit[0] ? " = " : "", res.commit,
                    res.downloaded ? (res.resumed ? "downloaded (resumed)" : "downloaded")
                                   : "already cached",
                    (unsigned long long)res.size);
    }
    return 0;
}

const cli_command cli_download = {
    "download", "fetch a model from the Hugging Face Hub into its cache: needle download needle3",
    "usage: needle download SPEC [--out DIR] [--revision REV] [--force] [--json]\n"
    "\n"
    "Fetches a model into the Hugging Face hub cache, the one huggingface_hub and the\n"
    "official package use ($HF_HUB_CACHE, else $HF_HOME/hub, else\n"
    "~/.cache/huggingface/hub), and prints its path. What is cached is not fetched again\n"
    "(the hub is still asked which commit REV is, unless REV is a commit or HF_HUB_OFFLINE=1).\n"
    "\n"
    "SPEC:\n"
    "  needle3 | needle2 | whistle   the official models (Cactus-Compute/needle3 needle3.cact,\n"
    "                          ...); needle3 is the default model once cached\n"
    "  checkpoints/NAME        a training checkpoint (checkpoints/needle3.safetensors) from\n"
    "                          Cactus-Compute/needle3, or needle2 when NAME starts with needle2\n"
    "  ORG/REPO                the repo's one .cact file (several: an error listing them)\n"
    "  ORG/REPO/FILE           that file\n"
    "\n"
    "options:\n"
    "  -o, --out DIR           also copy the file into DIR\n"
    "  --revision REV          a branch, tag or commit (default main)\n"
    "  --force                 fetch again even if cached\n"
    "  --json                  print the result as one JSON object (repo, file, revision,\n"
    "                          commit, path, out, size, downloaded, resumed, source)\n"
    "\n"
    "Environment: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (for gated or\n"
    "private repos; sent to the hub only, never printed), HF_HUB_CACHE / HF_HOME,\n"
    "HF_HUB_OFFLINE=1 (no network: cached files only; the official package's copies under\n"
    "~/.cache/cactus-needle/ count too). A broken transfer is retried and resumed (also by\n"
    "the next run); the SHA-256 is checked before the file enters the cache. A progress bar\n"
    "shows on a terminal.\n",
    run_download};

/* ---- needle models ---------------------------------------------------------------------- */

typedef struct model_row {
    char name[1400];
    char path[4096];
    char revision[256];
    const char *source;
    int generation; /* 0: not a model this library opens */
    unsigned long long size;
    int is_default;
} model_row;

static int generation_of(const char *path) {
    needle_model *m;
    if (needle_model_open(path, NULL, &m) != NEEDLE_OK) return 0;
    needle_model_info info = {.size = sizeof info};
    const int g = needle_model_get_info(m, &info) == NEEDLE_OK ? (int)info.generation : 0;
    needle_model_free(m);
    return g;
}

static int add_row(model_row **rows, int *n, const char *name, const char *path,
                   const char *revision, const char *source, unsigned long long size) {
    model_row *grown = realloc(*rows, (size_t)(*n + 1) * sizeof *grown);
    if (!grown) return -1;
    *rows = grown;
    model_row *r = &grown[(*n)++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->path, sizeof r->path, "%s", path);
    snprintf(r->revision, sizeof r->revision, "%s", revision);
    r->source = source;
    r->size = size;
    r->generation = generation_of(path);
    return 0;
}

static unsigned long long size_of(const char *path) {
    FILE *f = platform_fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fclose(f);
    return n > 0 ? (unsigned long long)n : 0;
}

static int run_models(const cli_command *self, int argc, char **argv) {
    int json = 0;
    const cli_option opts[] = {{"--json", NULL, CLI_FLAG, &json, 0, 0, NULL}, {0}};
    const int st = cli_parse(self, argc, argv, opts, NULL, 0);
    if (st != CLI_GO) return st;
    char err[512];
    hub_config cfg;
    if (hub_config_from_env(&cfg, err, sizeof err)) {
        fprintf(stderr, "needle models: %s\n", err);
        return 1;
    }
    hub_cached *cached;
    const int nc = hub_list_cached(&cfg, &cached);
    if (nc < 0) {
        fprintf(stderr, "needle models: out of memory\n");
        return 1;
    }
    model_row *rows = NULL;
    int n = 0, bad = 0;
    for (int i = 0; i < nc && !bad; i++)
        bad = add_row(&rows, &n, cached[i].name, cached[i].path, cached[i].revision,
                      cached[i].source, (unsigned long long)cached[i].size);
    free(cached);
    const char *env = getenv("NEEDLE_MODEL");
    if (!bad && env && env[0])
        bad = add_row(&rows, &n, "$NEEDLE_MODEL", env, "", "env", size_of(env));
    const char *demo;
    for (int i = 0; !bad && (demo = needle_default_model_candidate(i)) != NULL; i++)
        if (access(demo, R_OK) == 0)
            bad = add_row(&rows, &n, i == 0 ? "demo (installed)" : "demo (source tree)", demo, "",
                          "demo", size_of(demo));
    if (bad) {
        free(rows);
        fprintf(stderr, "needle models: out of memory\n");
        return 1;
    }
    const char *def = needle_default_model_path();
    int has_default = 0;
    /* $NEEDLE_MODEL is the default as such, even when it names a cached file */
    const char *def_source = env && env[0] ? "env" : NULL;
    for (int i = 0; i < n && def; i++)
        if (!strcmp(rows[i].path, def) && !has_default &&
            (!def_source || !strcmp(rows[i].source, def_source)))
            rows[i].is_default = has_default = 1;
    if (json) {
        printf("[");
        for (int i = 0; i < n; i++) {
            printf("%s\n  {\"name\": ", i ? "," : "");
            cli_json_string(stdout, rows[i].name);
            printf(", \"path\": ");
            cli_json_string(stdout, rows[i].path);
            printf(", \"revision\": ");
            cli_json_string(stdout, rows[i].revision);
            printf(", \"size\": %llu, \"generation\": ", rows[i].size);
            if (rows[i].generation) printf("%d", rows[i].generation);
            else printf("null");
            printf(", \"source\": ");
            cli_json_string(stdout, rows[i].source);
            printf(", \"default\": %s}", rows[i].is_default ? "true" : "false");
        }
        printf("%s]\n", n ? "\n" : "");
    } else {
        printf("%-3s %-3s %10s  %-14s %-40s %s\n", "DEF", "GEN", "SIZE", "SOURCE", "NAME",
               "REVISION");
        for (int i = 0; i < n; i++) {
            char gen[8];
            snprintf(gen, sizeof gen, rows[i].generation ? "%d" : "?", rows[i].generation);
            printf("%-3s %-3s %10llu  %-14s %-40s %s\n    %s\n", rows[i].is_default ? "*" : "",
                   gen, rows[i].size, rows[i].source, rows[i].name,
                   rows[i].revision[0] ? rows[i].revision : "-", rows[i].path);
        }
        if (!n) printf("(no model: `needle download needle3` fetches the real one)\n");
        else if (!has_default)
            printf("(no default: $NEEDLE_MODEL names no readable file)\n");
        for (int i = 0; i < n; i++)
            if (rows[i].is_default && !strcmp(rows[i].source, "demo"))
                printf("The default is the small demo model; `needle download needle3` fetches "
                       "the real Needle 3.\n");
        printf("hub cache: %s\n", cfg.cache);
    }
    free(rows);
    return 0;
}

const cli_command cli_models = {
    "models", "the models on this machine (hub cache, official package, demo) and the default",
    "usage: needle models [--json]\n"
    "\n"
    "Lists the .cact models this machine holds: the Hugging Face hub cache (every repo's\n"
    "snapshots: repo, revision, path, size, the generation read from the file), the\n"
    "official package's cache (~/.cache/cactus-needle/), $NEEDLE_MODEL and the bundled\n"
    "demo model, and marks the default (DEF *): --weights > $NEEDLE_MODEL > the newest\n"
    "cached official needle3 > needle2 > the demo model.\n"
    "\n"
    "options:\n"
    "  --json                  a JSON array of {name, path, revision, size, generation,\n"
    "                          source, default}; source is hub-cache, official-cache, env\n"
    "                          or demo; generation is null for a file that does not open\n",
    run_models};
