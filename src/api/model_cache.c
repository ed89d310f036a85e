/* model_cache.c: see model_cache.h. Paths are built with snprintf into caller buffers;
 * anything that does not fit is "not found", never truncated into another path. */
#include "model_cache.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/platform.h"

static int fits(int written, size_t n) { return written >= 0 && (size_t)written < n; }

static int nonempty_env(const char *name, const char **out) {
    const char *v = getenv(name);
    if (!v || !v[0]) return 0;
    *out = v;
    return 1;
}

int model_cache_hub_dir(char *out, size_t n) {
    const char *v;
    /* huggingface_hub's order: HF_HUB_CACHE, the older HUGGINGFACE_HUB_CACHE, HF_HOME/hub,
     * then XDG_CACHE_HOME or ~/.cache */
    if (nonempty_env("HF_HUB_CACHE", &v) || nonempty_env("HUGGINGFACE_HUB_CACHE", &v))
        return fits(snprintf(out, n, "%s", v), n) ? 0 : -1;
    if (nonempty_env("HF_HOME", &v)) return fits(snprintf(out, n, "%s/hub", v), n) ? 0 : -1;
    if (nonempty_env("XDG_CACHE_HOME", &v))
        return fits(snprintf(out, n, "%s/huggingface/hub", v), n) ? 0 : -1;
    if (nonempty_env("HOME", &v))
        return fits(snprintf(out, n, "%s/.cache/huggingface/hub", v), n) ? 0 : -1;
    return -1;
}

int model_cache_is_commit(const char *s) {
    size_t i = 0;
    for (; s[i]; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return i == 40;
}

int model_cache_repo_folder(const char *repo, char *out, size_t n) {
    const char *slash = strchr(repo, '/');
    if (!slash || slash == repo || !slash[1] || strchr(slash + 1, '/')) return -1;
    return fits(snprintf(out, n, "models--%.*s--%s", (int)(slash - repo), repo, slash + 1), n)
               ? 0 : -1;
}

int model_cache_commit(const char *hub_dir, const char *repo, const char *revision,
                       char commit[41]) {
    if (model_cache_is_commit(revision)) {
        memcpy(commit, revision, 41);
        return 0;
    }
    char folder[512], ref[4096];
    if (model_cache_repo_folder(repo, folder, sizeof folder) ||
        strstr(revision, "..") || !revision[0] ||
        !fits(snprintf(ref, sizeof ref, "%s/%s/refs/%s", hub_dir, folder, revision), sizeof ref))
        return -1;
    FILE *f = platform_fopen(ref, "rb");
    if (!f) return -1;
    char buf[64] = {0};
    const size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    /* huggingface_hub writes the bare hash; tolerate a trailing newline from other tools */
    buf[got] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    if (!model_cache_is_commit(buf)) return -1;
    memcpy(commit, buf, 41);
    return 0;
}

int model_cache_hub_file(const char *hub_dir, const char *repo, const char *revision,
                         const char *file, char *out, size_t n) {
    char commit[41], folder[512];
    if (strstr(file, "..") || file[0] == '/' || model_cache_repo_folder(repo, folder, sizeof folder) ||
        model_cache_commit(hub_dir, repo, revision, commit))
        return -1;
    if (!fits(snprintf(out, n, "%s/%s/snapshots/%s/%s", hub_dir, folder, commit, file), n))
        return -1;
    return platform_readable(out) ? 0 : -1;
}

/* "3.10.2" > "3.9.0": numeric fields compared in turn; 1 if a is newer than b */
static int version_newer(const char *a, const char *b) {
    while (*a || *b) {
        char *ea, *eb;
        const unsigned long va = strtoul(a, &ea, 10), vb = strtoul(b, &eb, 10);
        if (va != vb) return va > vb;
        if (ea == a || eb == b) return strcmp(a, b) > 0;
        a = *ea ? ea + 1 : ea;
        b = *eb ? eb + 1 : eb;
    }
    return 0;
}

int model_cache_official_file(const char *folder, const char *file, char *out, size_t n) {
    const char *home;
    char dir[4096];
    if (!nonempty_env("HOME", &home) ||
        !fits(snprintf(dir, sizeof dir, "%s/.cache/cactus-needle/%s", home, folder), sizeof dir))
        return -1;
    DIR *d = opendir(dir);
    if (!d) return -1;
    char best[256] = "";
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof best) continue;
        char path[4096];
        if (!fits(snprintf(path, sizeof path, "%s/%s/%s", dir, e->d_name, file), sizeof path) ||
            !platform_readable(path))
            continue;
        if (!best[0] || version_newer(e->d_name, best)) snprintf(best, sizeof best, "%s", e->d_name);
    }
    closedir(d);
    if (!best[0]) return -1;
    return fits(snprintf(out, n, "%s/%s/%s", dir, best, file), n) ? 0 : -1;
}

/* Without refs/main (a download pinned to a commit), the snapshot holding `file` that was
 * written last. */
static int newest_snapshot_file(const char *hub_dir, const char *repo, const char *file,
                                char *out, size_t n) {
    char folder[512], snaps[4096];
    if (model_cache_repo_folder(repo, folder, sizeof folder) ||
        !fits(snprintf(snaps, sizeof snaps, "%s/%s/snapshots", hub_dir, folder), sizeof snaps))
        return -1;
    DIR *d = opendir(snaps);
    if (!d) return -1;
    struct dirent *e;
    double best_time = -1;
    int found = -1;
    while ((e = readdir(d)) != NULL) {
        char path[4096];
        if (!model_cache_is_commit(e->d_name) ||
            !fits(snprintf(path, sizeof path, "%s/%s/%s", snaps, e->d_name, file), sizeof path) ||
            !platform_readable(path))
            continue;
        const double t = platform_link_mtime(path);
        if (t < 0) continue;
        if (t > best_time && fits(snprintf(out, n, "%s", path), n)) {
            best_time = t;
            found = 0;
        }
    }
    closedir(d);
    return found;
}

/* Where each generation's official model is published and cached. */
static const struct official_model {
    int generation;
    const char *repo, *file, *folder;
} official_models[] = {
    {2, "Cactus-Compute/needle2", "needle2.cact", "v2"},
    {3, "Cactus-Compute/needle3", "needle3.cact", "v3"},
};

int model_cache_official_model(int generation, char *out, size_t n) {
    const struct official_model *o = NULL;
    for (size_t i = 0; i < sizeof official_models / sizeof official_models[0]; i++)
        if (official_models[i].generation == generation) o = &official_models[i];
    if (!o) return -1;
    const char *repo = o->repo, *file = o->file, *folder = o->folder;
    char hub[4096];
    if (model_cache_hub_dir(hub, sizeof hub) == 0 &&
        (model_cache_hub_file(hub, repo, "main", file, out, n) == 0 ||
         newest_snapshot_file(hub, repo, file, out, n) == 0))
        return 0;
    return model_cache_official_file(folder, file, out, n);
}
