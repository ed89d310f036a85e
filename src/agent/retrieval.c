/* Tool retrieval and the tool index file (see retrieval.h). */
#include "agent/retrieval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/heads.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/json_escape.h"
#include "util/strbuf.h"
#include "util/platform.h"

#define INDEX_MAGIC "NDLTIDX1"
#define INDEX_VERSION 1u
#define INDEX_HEADER 32u
/* Changes whenever what is embedded changes (retrieval.h), so old files are rebuilt. */
#define EMBED_RECIPE 0x4e44424f53534a31ull /* BOS + compact JSON, from position 0 */

static uint64_t fnv1a(const void *data, size_t n, uint64_t h) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The whole image, 8 bytes at a time (a 14 MB model in a few ms): embeddings depend on
 * every weight. */
static uint64_t model_fingerprint(const struct needle_model *m) {
    uint64_t h = 0xcbf29ce484222325ull ^ EMBED_RECIPE;
    size_t size, i = 0;
    const uint8_t *image = model_image(m, &size);
    for (; i + 8 <= size; i += 8) {
        uint64_t w;
        memcpy(&w, image + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    return fnv1a(image + i, size - i, h ^ size);
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

/* The top-level elements of a compact JSON array (the re-serializer's output). */
static int split_tools(tool_index *ix) {
    const char *t = ix->canon;
    size_t n = strlen(t), cap = 16;
    if (n < 2 || t[0] != '[' || t[n - 1] != ']')
        return needle_fail(NEEDLE_ERR_SCHEMA, "tools: not a JSON array");
    ix->text = malloc(cap * sizeof *ix->text);
    ix->len = malloc(cap * sizeof *ix->len);
    if (!ix->text || !ix->len) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tools: out of memory");
    int depth = 0, in_str = 0;
    size_t start = 1;
    for (size_t i = 1; i < n - 1; i++) {
        const char ch = t[i];
        int sep = 0;
        if (in_str) {
            if (ch == '\\') i++;
            else if (ch == '"') in_str = 0;
        } else if (ch == '"') {
            in_str = 1;
        } else if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            depth--;
        } else if (ch == ',' && depth == 0) {
            sep = 1;
        }
        if (sep || i >= n - 2) {
            const size_t end = sep ? i : n - 1;
            if (ix->count == cap) {
                cap *= 2;
                const char **nt = realloc(ix->text, cap * sizeof *nt);
                if (nt) ix->text = nt;
                size_t *nl = realloc(ix->len, cap * sizeof *nl);
                if (nl) ix->len = nl;
                if (!nt || !nl) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tools: out of memory");
            }
            ix->text[ix->count] = t + start;
            ix->len[ix->count] = end - start;
            ix->count++;
            start = i + 1;
        }
    }
    return NEEDLE_OK;
}

/* [BOS] + text[0:len] encoded as a prompt is, embedded (the rule of model/embed.c). */
static int embed_text(model_session *s, model_session **embedder, const char *text, size_t len,
                      float *out) {
    const tokenizer *tok = model_tokenizer(session_model(s));
    size_t need = 0;
    int rc = tokenizer_encode_ex(tok, text, len, 1, NULL, 0, &need);
    if (rc && rc != NEEDLE_ERR_BUFFER_TOO_SMALL) return rc;
    int32_t *ids = malloc((need + 1) * sizeof *ids);
    if (!ids) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "retrieval: out of memory");
    ids[0] = NEEDLE_TOKEN_BOS;
    size_t n = 0;
    rc = tokenizer_encode_ex(tok, text, len, 1, ids + 1, need, &n);
    if (rc == NEEDLE_OK) rc = session_embed_tokens(s, embedder, ids, n + 1, out);
    free(ids);
    return rc;
}

/* Takes what the file at path holds for these tools; returns how many were found (0 for
 * a missing, damaged or foreign file: it is rebuilt). done[i] marks tool i found. */
static uint32_t load_index(tool_index *ix, const char *path, uint64_t model_fp, uint8_t *done,
                           uint32_t *file_count) {
    FILE *f = platform_fopen(path, "rb");
    if (!f) return 0;
    uint8_t head[INDEX_HEADER + 8];
    uint32_t found = 0;
    if (fread(head, 1, sizeof head, f) != sizeof head || memcmp(head, INDEX_MAGIC, 8) ||
        get_u32(head + 8) != INDEX_VERSION || get_u32(head + 12) != ix->dim ||
        get_u32(head + 20) != 0 || get_u64(head + 24) != model_fp) {
        fclose(f);
        return 0;
    }
    const uint32_t count = get_u32(head + 16);
    *file_count = count;
    const size_t rec = 8 + 4 * (size_t)ix->dim;
    if (fseek(f, 0, SEEK_END) != 0 || ftell(f) < 0 ||
        (size_t)ftell(f) != INDEX_HEADER + 8 + (size_t)count * rec || count > (1u << 24) ||
        fseek(f, INDEX_HEADER + 8, SEEK_SET) != 0) {
        fclose(f);
        return 0;
    }
    uint8_t *r = malloc(rec);
    float *e = malloc(ix->dim * sizeof *e);
    for (uint32_t k = 0; r && e && k < count; k++) {
        if (fread(r, 1, rec, f) != rec) break;
        double norm = 0;
        int finite = 1;
        for (uint32_t j = 0; j < ix->dim; j++) {
            uint32_t bits = get_u32(r + 8 + 4 * j);
            memcpy(&e[j], &bits, 4);
            finite &= isfinite(e[j]) != 0;
            norm += (double)e[j] * e[j];
        }
        if (!finite || fabs(norm - 1.0) > 1e-3) { /* damaged: rebuild everything */
            memset(done, 0, ix->count);
            found = 0;
            break;
        }
        const uint64_t fp = get_u64(r);
        for (uint32_t i = 0; i < ix->count; i++)
            if (!done[i] && ix->fingerprint[i] == fp) {
                memcpy(ix->embedding + (size_t)i * ix->dim, e, ix->dim * sizeof *e);
                done[i] = 1;
                found++;
            }
    }
    free(r);
    free(e);
    fclose(f);
    return found;
}

static int save_index(const tool_index *ix, const char *path, uint64_t model_fp) {
    const size_t rec = 8 + 4 * (size_t)ix->dim;
    const size_t size = INDEX_HEADER + 8 + (size_t)ix->count * rec;
    uint8_t *b = calloc(1, size);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!b || !tmp) {
        free(b);
        free(tmp);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tool index: out of memory");
    }
    memcpy(b, INDEX_MAGIC, 8);
    put_u32(b + 8, INDEX_VERSION);
    put_u32(b + 12, ix->dim);
    put_u32(b + 16, ix->count);
    put_u64(b + 24, model_fp);
    /* bytes 32..39: reserved (0), so the records start 8-aligned */
    for (uint32_t i = 0; i < ix->count; i++) {
        uint8_t *r = b + INDEX_HEADER + 8 + (size_t)i * rec;
        put_u64(r, ix->fingerprint[i]);
        for (uint32_t j = 0; j < ix->dim; j++) {
            uint32_t bits;
            memcpy(&bits, ix->embedding + (size_t)i * ix->dim + j, 4);
            put_u32(r + 8 + 4 * j, bits);
        }
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = platform_fopen(tmp, "wb");
    int ok = f && fwrite(b, 1, size, f) == size;
    if (f) ok &= fclose(f) == 0;
    if (ok) ok = platform_replace_file(tmp, path) == 0;
    if (!ok) platform_remove(tmp);
    free(b);
    free(tmp);
    return ok ? NEEDLE_OK
              : needle_fail(NEEDLE_ERR_IO, "tool index: cannot write %s", path);
}

int tool_index_build(tool_index *ix, model_session *s, model_session **embedder, char *canon,
                     size_t canon_len, const char *index_path) {
    (void)canon_len;
    memset(ix, 0, sizeof *ix);
    ix->canon = canon;
    ix->dim = HEAD_EMBED_DIM;
    /* the index format and the query buffer are 128-d; a Needle 3 file may declare another
     * embedding width */
    const probe_head *head = model_probe_head(session_model(s), HEAD_CODE_CONTRASTIVE);
    if (head && head->out_dim != HEAD_EMBED_DIM)
        return needle_fail(NEEDLE_ERR_FORMAT, "retrieval: the embedding head has %u "
                           "outputs, tool retrieval needs %u", head->out_dim, HEAD_EMBED_DIM);
    int rc = split_tools(ix);
    if (rc) return rc;
    ix->name = calloc(ix->count, sizeof *ix->name);
    ix->fingerprint = malloc(ix->count * sizeof *ix->fingerprint);
    ix->embedding = malloc((size_t)ix->count * ix->dim * sizeof *ix->embedding);
    uint8_t *done = calloc(ix->count, 1);
    if (!ix->name || !ix->fingerprint || !ix->embedding || !done) {
        free(done);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "retrieval: out of memory");
    }
    for (uint32_t i = 0; i < ix->count && !rc; i++) {
        ix->fingerprint[i] = fnv1a(ix->text[i], ix->len[i], 0xcbf29ce484222325ull);
        cJSON *tool = cJSON_ParseWithLength(ix->text[i], ix->len[i]);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(tool, "name");
        ix->name[i] = strdup(cJSON_IsString(name) ? name->valuestring : "");
        cJSON_Delete(tool);
        if (!ix->name[i]) rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "retrieval: out of memory");
    }
    const uint64_t model_fp = index_path ? model_fingerprint(session_model(s)) : 0;
    uint32_t file_count = 0;
    if (!rc && index_path) ix->loaded = load_index(ix, index_path, model_fp, done, &file_count);
    for (uint32_t i = 0; i < ix->count && !rc; i++)
        if (!done[i])
            rc = embed_text(s, embedder, ix->text[i], ix->len[i],
                            ix->embedding + (size_t)i * ix->dim);
    free(done);
    /* the file holds exactly the current tools, or it is written again */
    if (!rc && index_path && (ix->loaded != ix->count || file_count != ix->count))
        rc = save_index(ix, index_path, model_fp);
    return rc;
}

void tool_index_free(tool_index *ix) {
    if (!ix) return;
    for (uint32_t i = 0; ix->name && i < ix->count; i++) free(ix->name[i]);
    free(ix->name);
    free(ix->text);
    free(ix->len);
    free(ix->fingerprint);
    free(ix->embedding);
    free(ix->canon);
    memset(ix, 0, sizeof *ix);
}

int tool_index_select(const tool_index *ix, model_session *s, model_session **embedder,
                      const char *query, uint32_t k, uint32_t *chosen) {
    float q[HEAD_EMBED_DIM];
    int rc = embed_text(s, embedder, query, strlen(query), q);
    if (rc) return rc;
    if (k > ix->count) k = ix->count;
    float *score = malloc(ix->count * sizeof *score);
    uint8_t *taken = calloc(ix->count, 1);
    if (!score || !taken) {
        free(score);
        free(taken);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "retrieval: out of memory");
    }
    for (uint32_t i = 0; i < ix->count; i++)
        score[i] = head_similarity(q, ix->embedding + (size_t)i * ix->dim, ix->dim);
    for (uint32_t r = 0; r < k; r++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < ix->count; i++)
            if (!taken[i] && (best == UINT32_MAX || score[i] > score[best])) best = i;
        if (best == UINT32_MAX) break;
        taken[best] = 1;
    }
    for (uint32_t i = 0, n = 0; i < ix->count; i++)
        if (taken[i]) chosen[n++] = i;
    free(score);
    free(taken);
    return NEEDLE_OK;
}

int tool_index_subset(const tool_index *ix, const uint32_t *chosen, uint32_t k, char **tools,
                      size_t *tools_len, char **names_json) {
    strbuf t = {0}, names = {0};
    strbuf_puts(&t, "[");
    strbuf_puts(&names, "[");
    for (uint32_t r = 0; r < k; r++) {
        if (r) {
            strbuf_puts(&t, ",");
            strbuf_puts(&names, ",");
        }
        strbuf_put(&t, ix->text[chosen[r]], ix->len[chosen[r]]);
        util_json_put_string(&names, ix->name[chosen[r]], strlen(ix->name[chosen[r]]), 0);
    }
    strbuf_puts(&t, "]");
    strbuf_puts(&names, "]");
    if (t.oom || names.oom) {
        free(t.data);
        free(names.data);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "retrieval: out of memory");
    }
    *tools = t.data;
    *tools_len = t.len;
    *names_json = names.data;
    return NEEDLE_OK;
}
