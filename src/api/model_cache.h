/* model_cache.h: finding a model in the caches other tools fill, by reading the
 * filesystem only (no network: libneedle stays network-free; `needle download`, in
 * src/hub, fills them).
 *
 *   - the Hugging Face hub cache, in huggingface_hub's layout:
 *     $HF_HUB_CACHE, else $HF_HOME/hub, else ${XDG_CACHE_HOME:-~/.cache}/huggingface/hub;
 *     models--ORG--NAME/refs/REVISION holds a commit, snapshots/COMMIT/FILE the file
 *   - the official package's copy (cactus-needle): ~/.cache/cactus-needle/FOLDER/VERSION/FILE
 *     (FOLDER v2, v3 or whistle; read, never written)
 *
 * Internal to the library (the default-model rule in default_model.c) and to the hub
 * client (src/hub), which links the static library. */
#ifndef NEEDLE_API_MODEL_CACHE_H
#define NEEDLE_API_MODEL_CACHE_H

#include <stddef.h>

/* The hub cache directory (it need not exist). Returns 0, or -1 if it does not fit in n
 * bytes or no home directory is known. */
int model_cache_hub_dir(char *out, size_t n);

/* models--ORG--NAME for "ORG/NAME" (huggingface_hub's repo_folder_name). Returns 0 or -1. */
int model_cache_repo_folder(const char *repo, char *out, size_t n);

/* The commit a revision stands for: the revision itself when it is 40 hex digits, else
 * the content of <repo folder>/refs/REVISION. Returns 0 or -1 (unknown). */
int model_cache_commit(const char *hub_dir, const char *repo, const char *revision,
                       char commit[41]);

/* snapshots/COMMIT/FILE of `repo` at `revision` if it exists (following its symlink).
 * Returns 0 with the path in out, or -1. */
int model_cache_hub_file(const char *hub_dir, const char *repo, const char *revision,
                         const char *file, char *out, size_t n);

/* The official package's copy of FILE under ~/.cache/cactus-needle/FOLDER/<version>/, the
 * highest version (compared number by number) that holds a readable one. Returns 0 or -1. */
int model_cache_official_file(const char *folder, const char *file, char *out, size_t n);

/* The newest cached official model of a generation (3: Cactus-Compute/needle3 needle3.cact,
 * 2: Cactus-Compute/needle2 needle2.cact): the hub cache's copy at refs/main, else the
 * official package's copy. Returns 0 with the path in out, or -1. */
int model_cache_official_model(int generation, char *out, size_t n);

/* 1 if s is 40 lowercase hex digits (a full commit hash). */
int model_cache_is_commit(const char *s);

#endif
