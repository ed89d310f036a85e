/* Checkpoints and adapters in the official formats (see checkpoint.h). */
#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_canon.h"
#include "util/error.h"
#include "util/json_escape.h"
#include "util/platform.h"
#include "util/strbuf.h"

static int oom(void) { return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory"); }

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* ---- tensors ---------------------------------------------------------------------------- */

void train_tensor_release(train_tensor *t) {
    if (!t) return;
    free(t->name);
    free(t->data);
    memset(t, 0, sizeof *t);
}

int train_tensor_from_st(const st_tensor *src, train_tensor *t) {
    memset(t, 0, sizeof *t);
    t->name = strdup(src->name);
    /* st_parse checked numel * element size against the file, so this cannot overflow */
    t->data = malloc(src->numel ? (size_t)src->numel * sizeof(float) : 1);
    if (!t->name || !t->data) {
        train_tensor_release(t);
        return oom();
    }
    t->ndim = src->ndim;
    memcpy(t->shape, src->shape, sizeof t->shape);
    t->numel = src->numel;
    static const union {
        uint32_t u;
        uint8_t b[4];
    } probe = {1};
    if (src->dtype == ST_F32 && probe.b[0]) /* the file's byte order is the host's */
        memcpy(t->data, src->data, (size_t)src->numel * sizeof(float));
    else
        for (uint64_t i = 0; i < src->numel; i++) t->data[i] = st_get(src, i);
    return 0;
}

static int stage_tensor(st_writer *w, const char *name, const train_tensor *t) {
    return st_writer_add(w, name, ST_F32, t->ndim, t->shape, t->data);
}

/* The file mapped and parsed; *image / *size to unmap after st_release. */
static int open_st(const char *path, const void **image, size_t *size, st_file *f) {
    int st = platform_map_file(path, image, size);
    if (st) return st;
    if ((st = st_parse(*image, *size, f))) {
        platform_unmap_file(*image, *size);
        return needle_fail(st, "%.200s: %s", path, needle_last_error());
    }
    return 0;
}

/* Python's int() of a metadata value as the official reader applies it: "" (or no value)
 * is none (-1); otherwise a decimal integer, else a format error. */
static int parse_int_meta(const char *path, const char *key, const char *text, int64_t *out) {
    *out = -1;
    if (!text || !*text) return 0;
    char *end;
    const long long v = strtoll(text, &end, 10);
    if (*end || end == text || v < 0)
        return needle_fail(NEEDLE_ERR_FORMAT, "%.200s: metadata %s is not a non-negative integer: '%.40s'", path,
                           key, text);
    *out = v;
    return 0;
}

/* ---- checkpoints ---------------------------------------------------------------------- */

void train_checkpoint_release(train_checkpoint *ck) {
    if (!ck) return;
    for (uint32_t i = 0; i < ck->n; i++) train_tensor_release(&ck->tensors[i]);
    free(ck->tensors);
    for (uint32_t i = 0; i < ck->n_optim; i++) train_tensor_release(&ck->optim_tensors[i]);
    free(ck->optim_tensors);
    free(ck->optim);
    free(ck->config);
    free(ck->run);
    memset(ck, 0, sizeof *ck);
}

const train_tensor *train_checkpoint_find(const train_checkpoint *ck, const char *name) {
    for (uint32_t i = 0; i < ck->n; i++)
        if (!strcmp(ck->tensors[i].name, name)) return &ck->tensors[i];
    return NULL;
}

static char *slurp_text(const char *path) {
    const void *data;
    size_t size;
    if (platform_map_file(path, &data, &size)) return NULL;
    char *text = dup_n(data, size);
    platform_unmap_file(data, size);
    if (!text) oom();
    return text;
}

/* The generation the config describes, as the official loader tells them apart: a
 * Needle 2 config has attn_dim and no qk_head_dim. 0 if the text is not a JSON object. */
static int config_generation(const char *text) {
    cJSON *c = cJSON_Parse(text);
    int gen = 0;
    if (cJSON_IsObject(c))
        gen = cJSON_GetObjectItemCaseSensitive(c, "attn_dim") && !cJSON_GetObjectItemCaseSensitive(c, "qk_head_dim")
                  ? 2
                  : 3;
    cJSON_Delete(c);
    return gen;
}

int train_checkpoint_read(const char *path, const char *config_path, int generation, train_checkpoint *out) {
    memset(out, 0, sizeof *out);
    if (generation != 0 && generation != 2 && generation != 3)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "checkpoint: generation %d is not 2 or 3", generation);
    const void *image;
    size_t size;
    st_file f;
    int st = open_st(path, &image, &size, &f);
    if (st) return st;
    const char *cfg_meta = st_meta_get(&f, "config"), *run = st_meta_get(&f, "run");
    if ((st = parse_int_meta(path, "format_version", st_meta_get(&f, "format_version"), &out->format_version)) ||
        (st = parse_int_meta(path, "step", st_meta_get(&f, "step"), &out->step)))
        goto done;
    if (config_path) {
        if (!(out->config = slurp_text(config_path))) {
            st = needle_fail(NEEDLE_ERR_IO, "cannot read the config %.200s: %s", config_path, needle_last_error());
            goto done;
        }
    } else if (!cfg_meta || !*cfg_meta) {
        st = needle_fail(NEEDLE_ERR_FORMAT,
                         "%.200s has no config in its metadata (a Needle 2 checkpoint: give its config JSON)", path);
        goto done;
    } else if (out->format_version != TRAIN_CHECKPOINT_FORMAT) {
        st = needle_fail(NEEDLE_ERR_FORMAT, "%.200s is not a format-v%d checkpoint (format_version %" PRId64 ")", path,
                         TRAIN_CHECKPOINT_FORMAT, out->format_version);
        goto done;
    } else if (!(out->config = strdup(cfg_meta))) {
        st = oom();
        goto done;
    }
    if (!(out->generation = config_generation(out->config))) {
        st = needle_fail(NEEDLE_ERR_FORMAT, "%.200s: the config is not a JSON object",
                         config_path ? config_path : path);
        goto done;
    }
    if (generation) out->generation = generation;
    if (run && *run) {
        cJSON *r = cJSON_Parse(run);
        const int ok = r != NULL;
        cJSON_Delete(r);
        if (!ok) {
            st = needle_fail(NEEDLE_ERR_FORMAT, "%.200s: metadata run is not JSON", path);
            goto done;
        }
    }
    if (!(out->run = strdup(run && *run ? run : "{}"))) {
        st = oom();
        goto done;
    }
    const char *optim = st_meta_get(&f, "optim");
    if (optim && *optim && !(out->optim = strdup(optim))) {
        st = oom();
        goto done;
    }
    out->tensors = calloc(f.n ? f.n : 1, sizeof *out->tensors);
    out->optim_tensors = calloc(f.n ? f.n : 1, sizeof *out->optim_tensors);
    if (!out->tensors || !out->optim_tensors) {
        st = oom();
        goto done;
    }
    for (uint32_t i = 0; i < f.n; i++) {
        const int is_optim = !strncmp(f.tensors[i].name, TRAIN_OPTIM_PREFIX, strlen(TRAIN_OPTIM_PREFIX));
        train_tensor *t = is_optim ? &out->optim_tensors[out->n_optim] : &out->tensors[out->n];
        if ((st = train_tensor_from_st(&f.tensors[i], t))) goto done;
        *(is_optim ? &out->n_optim : &out->n) += 1;
    }
done:
    st_release(&f);
    platform_unmap_file(image, size);
    if (st) train_checkpoint_release(out);
    return st;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The names as the official reader rebuilds its tree from them (unflatten: split on "/",
 * every prefix a dict, every full name a leaf): no empty component, and no full name that
 * is also a prefix of another. */
static int check_tree(char **names, uint32_t n) {
    qsort(names, n, sizeof *names, by_name);
    for (uint32_t i = 0; i < n; i++) {
        const char *s = names[i];
        if (!*s || *s == '/' || s[strlen(s) - 1] == '/' || strstr(s, "//"))
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tensor name '%.120s' has an empty path component", s);
        for (const char *p = strchr(s, '/'); p; p = strchr(p + 1, '/')) {
            char prefix[1024];
            const size_t len = (size_t)(p - s);
            if (len >= sizeof prefix) break;
            memcpy(prefix, s, len);
            prefix[len] = 0;
            const char *key = prefix;
            if (bsearch(&key, names, n, sizeof *names, by_name))
                return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                                   "tensor '%.120s' is also the folder of '%.120s': the official reader cannot rebuild the tree",
                                   prefix, s);
        }
    }
    return 0;
}

int train_checkpoint_stage(st_writer *w, const train_checkpoint *ck) {
    const char *run = ck->run ? ck->run : "{}";
    if (!ck->config || config_generation(ck->config) == 0)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "checkpoint: the config is not a JSON object");
    cJSON *r = cJSON_Parse(run);
    const int run_ok = r != NULL;
    cJSON_Delete(r);
    if (!run_ok) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "checkpoint: run is not JSON");
    const uint32_t total = ck->n + ck->n_optim;
    char **names = malloc((total ? total : 1) * sizeof *names);
    if (!names) return oom();
    for (uint32_t i = 0; i < ck->n; i++) names[i] = ck->tensors[i].name;
    for (uint32_t i = 0; i < ck->n_optim; i++) names[ck->n + i] = ck->optim_tensors[i].name;
    int st = check_tree(names, total);
    free(names);
    for (uint32_t i = 0; !st && i < ck->n; i++) {
        if (!strncmp(ck->tensors[i].name, TRAIN_OPTIM_PREFIX, strlen(TRAIN_OPTIM_PREFIX)))
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "parameter '%.120s' is named like optimizer state (%s)",
                             ck->tensors[i].name, TRAIN_OPTIM_PREFIX);
        else
            st = stage_tensor(w, ck->tensors[i].name, &ck->tensors[i]);
    }
    for (uint32_t i = 0; !st && i < ck->n_optim; i++) {
        if (strncmp(ck->optim_tensors[i].name, TRAIN_OPTIM_PREFIX, strlen(TRAIN_OPTIM_PREFIX)))
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "optimizer tensor '%.120s' is not under %s",
                             ck->optim_tensors[i].name, TRAIN_OPTIM_PREFIX);
        else
            st = stage_tensor(w, ck->optim_tensors[i].name, &ck->optim_tensors[i]);
    }
    char fv[24] = "", step[24] = "";
    if (ck->format_version >= 0) snprintf(fv, sizeof fv, "%" PRId64, ck->format_version);
    if (ck->step >= 0) snprintf(step, sizeof step, "%" PRId64, ck->step);
    /* the official writer's keys, in its order */
    if (!st) st = st_writer_meta(w, "format_version", fv);
    if (!st) st = st_writer_meta(w, "config", ck->config);
    if (!st) st = st_writer_meta(w, "step", step);
    if (!st) st = st_writer_meta(w, "run", run);
    if (!st && ck->optim) st = st_writer_meta(w, "optim", ck->optim);
    return st;
}

int train_checkpoint_write(const char *path, const train_checkpoint *ck) {
    st_writer w;
    st_writer_init(&w);
    int st = train_checkpoint_stage(&w, ck);
    if (!st) st = st_writer_write(&w, path);
    st_writer_release(&w);
    return st;
}

/* ---- adapters ------------------------------------------------------------------------- */

void train_adapter_release(train_adapter *ad) {
    if (!ad) return;
    for (uint32_t i = 0; i < ad->n; i++) {
        free(ad->lora[i].path);
        train_tensor_release(&ad->lora[i].a);
        train_tensor_release(&ad->lora[i].b);
    }
    free(ad->lora);
    free(ad->base);
    free(ad->pieces);
    free(ad->languages);
    if (ad->rows) train_tensor_release(ad->rows);
    free(ad->rows);
    memset(ad, 0, sizeof *ad);
}

const train_lora *train_adapter_find(const train_adapter *ad, const char *path) {
    for (uint32_t i = 0; i < ad->n; i++)
        if (!strcmp(ad->lora[i].path, path)) return &ad->lora[i];
    return NULL;
}

/* A and B chain: [..., in, r] and [..., r, out] with the same leading dims, r = rank
 * (rank < 0: taken from A). */
static int check_pair(const train_lora *l, int64_t *rank, int status) {
    const train_tensor *a = &l->a, *b = &l->b;
    if (!a->data || !b->data)
        return needle_fail(status, "adapter: lora/%.120s has %s but not %s", l->path, a->data ? "A" : "B",
                           a->data ? "B" : "A");
    if (a->ndim < 2 || a->ndim != b->ndim)
        return needle_fail(status, "adapter: lora/%.120s: A and B need the same rank >= 2 (%u, %u dims)",
                           l->path, a->ndim, b->ndim);
    const uint32_t d = a->ndim;
    for (uint32_t i = 0; i + 2 < d; i++)
        if (a->shape[i] != b->shape[i])
            return needle_fail(status, "adapter: lora/%.120s: A and B differ in leading dimension %u", l->path,
                               i);
    const uint64_t r = a->shape[d - 1];
    if (b->shape[d - 2] != r || r == 0)
        return needle_fail(status, "adapter: lora/%.120s: A [..., %llu] does not chain with B [..., %llu, %llu]",
                           l->path, (unsigned long long)r, (unsigned long long)b->shape[d - 2],
                           (unsigned long long)b->shape[d - 1]);
    if (*rank < 0) *rank = (int64_t)r;
    if ((uint64_t)*rank != r)
        return needle_fail(status, "adapter: lora/%.120s has rank %llu, the adapter %" PRId64, l->path,
                           (unsigned long long)r, *rank);
    return 0;
}

/* One metadata value as json.loads reads it; NULL when absent or "" (the official
 * reader's none). */
static cJSON *meta_json(const st_file *f, const char *key, int *bad) {
    const char *text = st_meta_get(f, key);
    if (!text || !*text) return NULL;
    cJSON *j = cJSON_Parse(text);
    if (!j) *bad = 1;
    return j;
}

static int read_adapter_meta(const char *path, const st_file *f, train_adapter *out) {
    int bad = 0, st = 0;
    cJSON *scale = meta_json(f, "scale", &bad), *base = meta_json(f, "base", &bad), *rank = meta_json(f, "rank", &bad),
          *seed = meta_json(f, "seed", &bad), *pieces = meta_json(f, "pieces", &bad),
          *langs = meta_json(f, "languages", &bad);
    out->rank = -1;
    if (bad) {
        st = needle_fail(NEEDLE_ERR_FORMAT, "%.200s: a metadata value is not JSON", path);
    } else if (!cJSON_IsNumber(scale) || !isfinite(scale->valuedouble)) {
        st = needle_fail(NEEDLE_ERR_FORMAT, "%.200s: metadata scale is not a finite number", path);
    } else if (base && !cJSON_IsNull(base) && !cJSON_IsString(base)) {
        st = needle_fail(NEEDLE_ERR_FORMAT, "%.200s: metadata base is not a string", path);
    } else if (rank && !cJSON_IsNull(rank) &&
               (!cJSON_IsNumber(rank) || rank->valuedouble < 1 || rank->valuedouble > 1e9 ||
                rank->valuedouble != floor(rank->valuedouble))) {
        st = needle_fail(NEEDLE_ERR_FORMAT, "%.200s: metadata rank is not a positive integer", path);
    } else if (seed && !cJSON_IsNull(seed) &&
               (!cJSON_IsNumber(seed) || fabs(seed->valuedouble) > 9007199254740992.0 ||
                seed->valuedouble != floor(seed->valuedouble))) {
        st = needle_fail(NEEDLE_ERR_FORMAT, "%.200s: metadata seed is not an integer", path);
    } else {
        out->scale = scale->valuedouble;
        if (cJSON_IsNumber(rank)) out->rank = (int64_t)rank->valuedouble;
        if (cJSON_IsNumber(seed)) out->seed = (int64_t)seed->valuedouble, out->has_seed = 1;
        if (cJSON_IsString(base) && !(out->base = strdup(base->valuestring))) st = oom();
        const char *p = st_meta_get(f, "pieces"), *l = st_meta_get(f, "languages");
        if (!st && pieces && !cJSON_IsNull(pieces) && !(out->pieces = strdup(p))) st = oom();
        if (!st && langs && !cJSON_IsNull(langs) && !(out->languages = strdup(l))) st = oom();
    }
    cJSON_Delete(scale);
    cJSON_Delete(base);
    cJSON_Delete(rank);
    cJSON_Delete(seed);
    cJSON_Delete(pieces);
    cJSON_Delete(langs);
    return st;
}

int train_adapter_read(const char *path, train_adapter *out) {
    memset(out, 0, sizeof *out);
    const void *image;
    size_t size;
    st_file f;
    int st = open_st(path, &image, &size, &f);
    if (st) return st;
    if ((st = read_adapter_meta(path, &f, out))) goto done;
    out->lora = calloc(f.n ? f.n : 1, sizeof *out->lora);
    if (!out->lora) {
        st = oom();
        goto done;
    }
    for (uint32_t i = 0; i < f.n; i++) {
        const st_tensor *t = &f.tensors[i];
        const size_t len = strlen(t->name);
        if (!strcmp(t->name, "rows")) {
            if (!(out->rows = calloc(1, sizeof *out->rows))) {
                st = oom();
                goto done;
            }
            if ((st = train_tensor_from_st(t, out->rows))) goto done;
            continue;
        }
        if (len < 8 || strncmp(t->name, "lora/", 5) || t->name[len - 2] != '/' ||
            (t->name[len - 1] != 'A' && t->name[len - 1] != 'B')) {
            st = needle_fail(NEEDLE_ERR_FORMAT, "%.200s: tensor '%.120s' is neither lora/<path>/A|B nor rows", path,
                             t->name);
            goto done;
        }
        char *kpath = dup_n(t->name + 5, len - 7);
        if (!kpath) {
            st = oom();
            goto done;
        }
        train_lora *l = (train_lora *)train_adapter_find(out, kpath);
        if (l) {
            free(kpath);
        } else {
            l = &out->lora[out->n++];
            l->path = kpath;
        }
        train_tensor *slot = t->name[len - 1] == 'A' ? &l->a : &l->b;
        if ((st = train_tensor_from_st(t, slot))) goto done;
    }
    for (uint32_t i = 0; i < out->n; i++)
        if ((st = check_pair(&out->lora[i], &out->rank, NEEDLE_ERR_FORMAT))) goto done;
done:
    st_release(&f);
    platform_unmap_file(image, size);
    if (st) train_adapter_release(out);
    return st;
}

int train_adapter_write(const char *path, const train_adapter *ad) {
    if (!isfinite(ad->scale)) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: scale is not finite");
    int64_t rank = ad->rank > 0 ? ad->rank : -1;
    int st = 0;
    for (uint32_t i = 0; i < ad->n && !st; i++) st = check_pair(&ad->lora[i], &rank, NEEDLE_ERR_INVALID_ARGUMENT);
    st_writer w;
    st_writer_init(&w);
    strbuf name = {0};
    for (uint32_t i = 0; i < ad->n && !st; i++)
        for (int m = 0; m < 2 && !st; m++) {
            name.len = 0;
            strbuf_puts(&name, "lora/");
            strbuf_puts(&name, ad->lora[i].path);
            strbuf_puts(&name, m ? "/B" : "/A");
            st = name.oom ? oom() : stage_tensor(&w, name.data, m ? &ad->lora[i].b : &ad->lora[i].a);
        }
    free(name.data);
    if (!st && ad->rows) st = stage_tensor(&w, "rows", ad->rows);
    /* json.dumps of each field, in write_adapter's order */
    char num[40];
    if (!st) {
        num[gram_python_float(ad->scale, num)] = 0;
        st = st_writer_meta(&w, "scale", num);
    }
    if (!st) {
        strbuf b = {0};
        if (ad->base)
            util_json_put_string(&b, ad->base, strlen(ad->base), 1);
        else
            strbuf_puts(&b, "null");
        st = b.oom ? oom() : st_writer_meta(&w, "base", b.data);
        free(b.data);
    }
    if (!st) {
        if (rank > 0)
            snprintf(num, sizeof num, "%" PRId64, rank);
        else
            strcpy(num, "null");
        st = st_writer_meta(&w, "rank", num);
    }
    if (!st) {
        if (ad->has_seed)
            snprintf(num, sizeof num, "%" PRId64, ad->seed);
        else
            strcpy(num, "null");
        st = st_writer_meta(&w, "seed", num);
    }
    for (int k = 0; k < 2 && !st; k++) {
        const char *text = k ? ad->languages : ad->pieces;
        cJSON *j = text ? cJSON_Parse(text) : NULL;
        if (text && !j) st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "adapter: %s is not JSON", k ? "languages" : "pieces");
        cJSON_Delete(j);
    }
    if (!st) st = st_writer_meta(&w, "pieces", ad->pieces ? ad->pieces : "null");
    if (!st) st = st_writer_meta(&w, "languages", ad->languages ? ad->languages : "null");
    if (!st) st = st_writer_write(&w, path);
    st_writer_release(&w);
    return st;
}

/* ---- any tensors ---------------------------------------------------------------------- */

int train_write_tensors(const char *path, const train_tensor *tensors, uint32_t n, const char *const *metadata) {
    st_writer w;
    st_writer_init(&w);
    int st = 0;
    for (uint32_t i = 0; i < n && !st; i++) st = stage_tensor(&w, tensors[i].name, &tensors[i]);
    for (const char *const *kv = metadata; !st && kv && kv[0]; kv += 2) {
        if (!kv[1]) {
            st = needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "metadata '%.80s' has no value", kv[0]);
            break;
        }
        st = st_writer_meta(&w, kv[0], kv[1]);
    }
    if (!st) st = st_writer_write(&w, path);
    st_writer_release(&w);
    return st;
}
