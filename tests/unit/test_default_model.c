/* The default-model rule of needle_default_model_path(): $NEEDLE_MODEL > the newest cached
 * official Needle 3 (hub cache at refs/main, else its newest snapshot, else the official
 * package's copy) > the same for Needle 2 > the demo model. The caches are built here in
 * a temporary folder, in huggingface_hub's layout (refs/main, snapshots/<commit>/ symlinks
 * into blobs/) and cactus-needle's (~/.cache/cactus-needle/v3/<version>/); the rule only
 * reads the filesystem, so plain files stand in for models. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/model_cache.h"
#include "harness.h"
#include "needle.h"

static char root[256];

static void put(const char *rel, const char *text) {
    char path[1024], dir[1100];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(dir, sizeof dir, "mkdir -p \"$(dirname '%s')\"", path);
    CHECK(system(dir) == 0);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void link_to(const char *rel, const char *target) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    unlink(path);
    CHECK(symlink(target, path) == 0);
}

static const char *under(const char *rel) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    return path;
}

static int is_default(const char *rel) {
    const char *m = needle_default_model_path();
    const int same = m && !strcmp(m, under(rel));
    if (!same) fprintf(stderr, "  default %s, expected %s\n", m ? m : "(none)", under(rel));
    return same;
}

#define C3 "3333333333333333333333333333333333333333"
#define C3B "3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b"
#define C2 "2222222222222222222222222222222222222222"
#define N3 "hub/models--Cactus-Compute--needle3"
#define N2 "hub/models--Cactus-Compute--needle2"

static void test_rule_order(void) {
    snprintf(root, sizeof root, "/tmp/needle_default_model_%d", (int)getpid());
    char env[300];
    snprintf(env, sizeof env, "%s/hub", root);
    setenv("HF_HUB_CACHE", env, 1);
    snprintf(env, sizeof env, "%s/home", root);
    setenv("HOME", env, 1);
    unsetenv("NEEDLE_MODEL");
    const char *m = needle_default_model_path();
    CHECK_MSG(m && strstr(m, "needle-demo.cact"), "an empty cache: the demo (%s)", m ? m : "-");

    /* the official package's Needle 2 (the highest version), then the hub's */
    put("home/.cache/cactus-needle/v2/2.0.4/needle2.cact", "n2 official");
    put("home/.cache/cactus-needle/v2/2.0.10/needle2.cact", "n2 official newer");
    put("home/.cache/cactus-needle/v2/2.0.9/other.bin", "not a model");
    CHECK(is_default("home/.cache/cactus-needle/v2/2.0.10/needle2.cact"));
    put(N2 "/blobs/b2", "n2");
    put(N2 "/refs/main", C2);
    put(N2 "/snapshots/" C2 "/.keep", "");
    link_to(N2 "/snapshots/" C2 "/needle2.cact", "../../blobs/b2");
    CHECK(is_default(N2 "/snapshots/" C2 "/needle2.cact"));

    /* Needle 3 beats Needle 2: the official package's copy first */
    put("home/.cache/cactus-needle/v3/3.3.3/needle3.cact", "n3 official");
    CHECK(is_default("home/.cache/cactus-needle/v3/3.3.3/needle3.cact"));
    /* a hub snapshot without refs/main (a download pinned to a commit): the newest */
    put(N3 "/blobs/b3", "n3");
    put(N3 "/snapshots/" C3 "/.keep", "");
    link_to(N3 "/snapshots/" C3 "/needle3.cact", "../../blobs/b3");
    CHECK(is_default(N3 "/snapshots/" C3 "/needle3.cact"));
    sleep(1); /* a later mtime for the second snapshot's link, whatever the fs resolution */
    put(N3 "/snapshots/" C3B "/.keep", "");
    link_to(N3 "/snapshots/" C3B "/needle3.cact", "../../blobs/b3");
    CHECK(is_default(N3 "/snapshots/" C3B "/needle3.cact"));
    /* refs/main names the commit to use, newest or not; a trailing newline is tolerated */
    put(N3 "/refs/main", C3 "\n");
    CHECK(is_default(N3 "/snapshots/" C3 "/needle3.cact"));
    /* a dangling link (its blob deleted) is not a model: the next snapshot */
    unlink(under(N3 "/snapshots/" C3 "/needle3.cact"));
    link_to(N3 "/snapshots/" C3 "/needle3.cact", "../../blobs/missing");
    CHECK(is_default(N3 "/snapshots/" C3B "/needle3.cact"));

    /* NEEDLE_MODEL beats every cache; HF_HOME/hub is the cache when HF_HUB_CACHE is unset */
    setenv("NEEDLE_MODEL", "/elsewhere/mine.cact", 1);
    m = needle_default_model_path();
    CHECK(m && !strcmp(m, "/elsewhere/mine.cact"));
    unsetenv("NEEDLE_MODEL");
    unsetenv("HF_HUB_CACHE");
    setenv("HF_HOME", root, 1);
    CHECK(is_default(N3 "/snapshots/" C3B "/needle3.cact"));
    char dir[1024];
    CHECK(model_cache_hub_dir(dir, sizeof dir) == 0 && !strcmp(dir, under("hub")));
    unsetenv("HF_HOME");
    CHECK(model_cache_hub_dir(dir, sizeof dir) == 0 &&
          !strcmp(dir, under("home/.cache/huggingface/hub")));
    setenv("XDG_CACHE_HOME", under("xdg"), 1);
    CHECK(model_cache_hub_dir(dir, sizeof dir) == 0 && !strcmp(dir, under("xdg/huggingface/hub")));
    unsetenv("XDG_CACHE_HOME");
    /* bad refs are no commit */
    put(N3 "/refs/bad", "../../../../etc/passwd");
    char commit[41];
    setenv("HF_HUB_CACHE", under("hub"), 1);
    CHECK(model_cache_commit(under("hub"), "Cactus-Compute/needle3", "bad", commit) != 0);
    CHECK(model_cache_commit(under("hub"), "Cactus-Compute/needle3", "../x", commit) != 0);
    CHECK(model_cache_commit(under("hub"), "Cactus-Compute/needle3", "main", commit) == 0 &&
          !strcmp(commit, C3));

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}

int main(void) {
    RUN(test_rule_order);
    return test_summary();
}
