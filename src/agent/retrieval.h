/* Tool retrieval (spec §4.4): with many tools, each conversation renders only the k tools
 * whose contrastive-head embeddings are closest to its first query.
 *
 * What is embedded (the official sources leave it open, spec §8.6 item 6): each tool as
 * [BOS] + its canonical compact JSON (the exact text the prompt renders), the query as
 * [BOS] + its text, both alone from position 0 (model/embed.c). The k best tools by
 * cosine similarity (ties to the earlier tool) are rendered in their declared order.
 *
 * The tool index file (tool_index_path) caches the embeddings, little-endian:
 *   magic "NDLTIDX1", u32 version (1), u32 dim, u32 count, u32 0,
 *   u64 model fingerprint (the model image and the embedding recipe),
 *   count x { u64 fingerprint of the tool's canonical JSON, f32 embedding[dim] }.
 * Loading checks every field, the exact size and that each embedding is finite and of
 * unit length; a file that fails, belongs to another model, or lacks one of the tools is
 * rebuilt (written to PATH.tmp, then renamed over PATH). Tools found in it are not
 * embedded again. */
#ifndef NEEDLE_AGENT_RETRIEVAL_H
#define NEEDLE_AGENT_RETRIEVAL_H

#include <stddef.h>
#include <stdint.h>

#include "model/session.h"

typedef struct tool_index {
    uint32_t count, dim;
    const char **text;  /* [count] pointers into `canon`: each tool's JSON */
    size_t *len;        /* [count] */
    char **name;        /* [count] the tool's "name" (malloc'd) */
    uint64_t *fingerprint; /* [count] */
    float *embedding;   /* [count][dim] */
    char *canon;        /* the canonical tools array text (owned) */
    uint32_t loaded;    /* embeddings found in the index file (the rest were computed) */
} tool_index;

/* Splits the canonical tools array `canon` (taken over, freed with the index) into tools
 * and gets every embedding: from index_path when it holds them, else by embedding in
 * *embedder, a second session beside s (model/embed.c; the file is then rewritten when
 * index_path is given). */
int tool_index_build(tool_index *ix, model_session *s, model_session **embedder, char *canon,
                     size_t canon_len, const char *index_path);
void tool_index_free(tool_index *ix);

/* Chooses the k tools closest to `query`: chosen[0:k] (ascending tool order). */
int tool_index_select(const tool_index *ix, model_session *s, model_session **embedder,
                      const char *query, uint32_t k, uint32_t *chosen);

/* "[" tools chosen[0:k] "]" as the canonical array text (malloc'd) and, in names_json,
 * the JSON array of their names (malloc'd). */
int tool_index_subset(const tool_index *ix, const uint32_t *chosen, uint32_t k, char **tools,
                      size_t *tools_len, char **names_json);

#endif
