/* compiler.h: state of one grammar_compile() run, shared by compiler.c (tools,
 * containers, unions) and compiler_scalar.c (strings, numbers, enum/const literals).
 *
 * Nodes and literals live in arrays of the grammar under construction that grow by
 * realloc, so builders refer to nodes by index and never keep a gram_node pointer across a
 * call that may add nodes. Error messages name the tool and the JSON path of the schema
 * being compiled ("parameters.properties.unit.enum"). */
#ifndef NEEDLE_GRAMMAR_SCHEMA_BUILD_H
#define NEEDLE_GRAMMAR_SCHEMA_BUILD_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/schema_ir.h"

/* $refs are inlined: a chain deeper than this, or more expansions than this in one tool
 * (refs used many times at many levels multiply), is refused rather than exhausting memory. */
enum { GRAM_MAX_REF_DEPTH = 32, GRAM_MAX_REF_EXPANSIONS = 4096 };

typedef struct gram_builder {
    grammar *g;
    uint32_t cap_nodes, cap_lits, cap_bytes, cap_props, cap_picks, cap_dfas, cap_tables, cap_deps;
    uint32_t n_bytes, n_props, n_picks, n_deps;
    const char *tool;   /* name of the tool being compiled, for messages */
    char path[512];     /* JSON path of the schema being compiled */
    size_t path_len;
    uint32_t any;       /* node admitting any JSON value, GRAM_NONE until first needed */
    uint32_t free_str;  /* string node without constraints */
    const cJSON *ref_root;                      /* the tool's parameters: where "#" points */
    const cJSON *refs[GRAM_MAX_REF_DEPTH];      /* $ref targets being expanded (recursion check) */
    uint32_t n_refs, ref_expansions;
} gram_builder;

/* Value-context flags for gram_build_schema: GRAM_CTX_UNIQUE_ITEM, the items of a
 * uniqueItems array; GRAM_CTX_HASHED, a part of an object or array item of one (every
 * value there needs a canonical key: numbers are tracked exactly, free-form values and
 * nested uniqueItems are refused). */
enum { GRAM_CTX_UNIQUE_ITEM = 1, GRAM_CTX_HASHED = 2 };

/* NEEDLE_ERR_SCHEMA with "tool \"T\": PATH: message". */
int gram_fail(gram_builder *b, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int gram_oom(gram_builder *b); /* NEEDLE_ERR_OUT_OF_MEMORY */

/* Appends ".seg" (or "[i]" when seg is NULL) to the path; returns the old length for
 * gram_path_pop. */
size_t gram_path_push(gram_builder *b, const char *seg, long index);
void gram_path_pop(gram_builder *b, size_t len);

/* New zeroed node of `kind`; returns its index or GRAM_NONE on OOM. */
uint32_t gram_new_node(gram_builder *b, int kind);
/* Reserves n entries of the literal table / property table; returns the first index. */
int gram_push_lit(gram_builder *b, const uint8_t *bytes, size_t len, uint32_t member);
int gram_push_props(gram_builder *b, uint32_t n, uint32_t *first);
/* Sorts lits[first, first + n) by bytes (stable). */
void gram_sort_lits(grammar *g, uint32_t first, uint32_t n);

/* A non-negative integer keyword (minLength, maxItems, ...); *v untouched if absent. */
int gram_get_count(gram_builder *b, const cJSON *s, const char *name, uint32_t *v);

/* Compiles one schema into *node; *depth receives the frames it needs. */
int gram_build_schema(gram_builder *b, const cJSON *s, int ctx, uint32_t *node, int *depth);

/* Sets set[c] = 1 for every byte c a value of node can start with (compiler.c). */
void gram_first_bytes(const gram_builder *b, uint32_t node, uint8_t *set);
/* Fills the pick table of union `node` from alternatives that must start differently
 * (compiler.c). */
int gram_set_picks(gram_builder *b, uint32_t node, const uint32_t *alts, uint32_t n);

/* compiler_union.c: the union of built alternatives (nested unions flattened, two or more
 * objects made one object union); and whether values of node may be an object union. */
int gram_make_union(gram_builder *b, const uint32_t *alts, uint32_t n, uint32_t *out);
int gram_has_object_union(const gram_builder *b, uint32_t node);
/* compiler_union.c: one GRAM_NODE_OBJ_UNION of n >= 2 object nodes; origin[a] is the
 * index of objs[a] in its anyOf/oneOf, for messages. Refuses alternatives that cannot be
 * told apart (see the file). */
int gram_build_object_union(gram_builder *b, const uint32_t *objs, const uint32_t *origin, uint32_t n,
                            uint32_t *out);

/* compiler.c: the schema a local $ref ("#/$defs/A") points at in the tool's parameters;
 * NULL (after gram_fail) if it is not local or points at nothing. */
const cJSON *gram_resolve_ref(gram_builder *b, const char *ref);

/* compiler_enum.c: JSON Schema validation of value v against schema s, for enum/const
 * values (skip: "enum" or "const", the keyword whose values are checked, or NULL).
 * Returns 1 if s admits v, 0 if not (the first reason in why, "it is above maximum 10"),
 * or a negative status if s is refused (gram_fail called). */
int gram_value_admits(gram_builder *b, const cJSON *s, const cJSON *v, const char *skip, char *why, size_t why_len);

/* compiler_union.c: 1 if no value the grammar writes for object node a is valid, as JSON
 * Schema reads it (undeclared keys allowed unless additionalProperties is false, which
 * closed_c says of c's schema), against object node c: c requires a key a never writes,
 * c is closed and a always writes a key c lacks, or a always writes a key with literal
 * values c never takes there. 0 when that cannot be shown. For oneOf. */
int gram_objects_exclusive(const gram_builder *b, uint32_t a, uint32_t c, int closed_c);

/* compiler_allof.c: the schema s with its allOf merged into one schema (*out, owned by
 * the caller) that admits the values every entry and s's other keywords admit; refused
 * (gram_fail) where the entries' values for a keyword differ and no intersection rule
 * applies. */
int gram_merge_all_of(gram_builder *b, const cJSON *s, cJSON **out);

/* compiler_scalar.c */
int gram_build_string(gram_builder *b, const cJSON *s, int ctx, uint32_t *node);
int gram_build_number(gram_builder *b, const cJSON *s, int integer, int ctx, uint32_t *node);
int gram_build_literal(gram_builder *b, const cJSON *s, uint32_t *node);
/* Makes number node id any number of the JSON-safe range, |x| <= 2^53, in at most
 * GRAM_NUM_DIGIT_BUDGET digits: what a schema without bounds (or a free value) gets. */
void gram_unbounded_number(gram_builder *b, uint32_t id);
int gram_build_fixed_literal(gram_builder *b, const char *const *words, uint32_t n, uint32_t *node);
/* Appends the JSON spelling of string s (UTF-8, validated) to the literal bytes: raw
 * non-ASCII (ascii = 0) or \uXXXX escapes (ascii = 1), as Python's json.dumps with
 * ensure_ascii False / True. Returns the entry length, or -1 if s is not valid UTF-8. */
long gram_spell_string(gram_builder *b, const char *s, int ascii);
/* Distinct values a node admits, saturated at UINT32_MAX (for uniqueItems). */
uint32_t gram_node_domain(const gram_builder *b, uint32_t node);

#endif
