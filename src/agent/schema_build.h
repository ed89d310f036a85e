/* schema_build.h: state of one grammar_compile() run, shared by schema.c (tools,
 * containers, unions) and schema_scalar.c (strings, numbers, enum/const literals).
 *
 * Nodes and literals live in arrays of the grammar under construction that grow by
 * realloc, so builders refer to nodes by index and never keep a gnode pointer across a
 * call that may add nodes. Error messages name the tool and the JSON path of the schema
 * being compiled ("parameters.properties.unit.enum"). */
#ifndef NEEDLE_AGENT_SCHEMA_BUILD_H
#define NEEDLE_AGENT_SCHEMA_BUILD_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/schema.h"

typedef struct builder {
    grammar *g;
    uint32_t cap_nodes, cap_lits, cap_bytes, cap_props, cap_picks, cap_dfas, cap_tables;
    uint32_t n_bytes, n_props, n_picks;
    const char *tool;   /* name of the tool being compiled, for messages */
    char path[512];     /* JSON path of the schema being compiled */
    size_t path_len;
    uint32_t any;       /* node admitting any JSON value, GNONE until first needed */
    uint32_t free_str;  /* string node without constraints */
} builder;

/* Value-context flags for build_schema. */
enum { CTX_UNIQUE_ITEM = 1 };

/* NEEDLE_ERR_SCHEMA with "tool \"T\": PATH: message". */
int bfail(builder *b, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int boom(builder *b); /* NEEDLE_ERR_OUT_OF_MEMORY */

/* Appends ".seg" (or "[i]" when seg is NULL) to the path; returns the old length for
 * path_pop. */
size_t path_push(builder *b, const char *seg, long index);
void path_pop(builder *b, size_t len);

/* New zeroed node of `kind`; returns its index or GNONE on OOM. */
uint32_t new_node(builder *b, int kind);
/* Reserves n entries of the literal table / property table; returns the first index. */
int push_lit(builder *b, const uint8_t *bytes, size_t len, uint32_t member);
int push_props(builder *b, uint32_t n, uint32_t *first);
/* Sorts lits[first, first + n) by bytes (stable). */
void sort_lits(grammar *g, uint32_t first, uint32_t n);

/* A non-negative integer keyword (minLength, maxItems, ...); *v untouched if absent. */
int get_count(builder *b, const cJSON *s, const char *name, uint32_t *v);

/* Compiles one schema into *node; *depth receives the frames it needs. */
int build_schema(builder *b, const cJSON *s, int ctx, uint32_t *node, int *depth);

/* schema_scalar.c */
int build_string(builder *b, const cJSON *s, int ctx, uint32_t *node);
int build_number(builder *b, const cJSON *s, int integer, int ctx, uint32_t *node);
int build_literal(builder *b, const cJSON *s, uint32_t *node);
int build_fixed_literal(builder *b, const char *const *words, uint32_t n, uint32_t *node);
/* Appends the JSON spelling of string s (UTF-8, validated) to the literal bytes: raw
 * non-ASCII (ascii = 0) or \uXXXX escapes (ascii = 1), as Python's json.dumps with
 * ensure_ascii False / True. Returns the entry length, or -1 if s is not valid UTF-8. */
long spell_string(builder *b, const char *s, int ascii);
/* Distinct values a node admits, saturated at UINT32_MAX (for uniqueItems). */
uint32_t node_domain(const builder *b, uint32_t node);

#endif
