/* schema_ir.h: the compiled form of a tools JSON, data only. The compiler (compiler.c,
 * compiler_scalar.c) writes it, the recognizer (recognizer*.c, token_trie.c) reads it;
 * nothing here knows about recognizer frames or compiler state.
 *
 * A grammar is a graph of nodes addressed by index; every array below is owned by the
 * grammar and immutable after compilation. Invariants the compiler establishes and the
 * recognizer relies on:
 *   - every node admits at least one value (impossible schemas are refused), so a value
 *     slot can always be filled;
 *   - the alternatives of a union start with disjoint bytes, so the first byte of a value
 *     picks one alternative and no parallel simulation is needed; the one exception is a
 *     union of objects (GRAM_NODE_OBJ_UNION, compiler_union.c), read as one object over
 *     the keys of all its alternatives until a key or a discriminator value commits one;
 *   - literal sets are sorted by bytes (memcmp order, shorter first), so the entries that
 *     share a prefix form one contiguous range;
 *   - declared nesting fits in GRAMMAR_MAX_DEPTH frames. */
#ifndef NEEDLE_GRAMMAR_SCHEMA_IR_H
#define NEEDLE_GRAMMAR_SCHEMA_IR_H

#include <stdint.h>

#include "grammar/decimal.h"
#include "grammar/grammar.h"
#include "grammar/regex.h"

#define GRAM_MAX_PROPS 64 /* properties per object: the seen set is one uint64 */
#define GRAM_NONE UINT32_MAX
#define GRAM_MAX_OBJ_ALTS 32 /* object alternatives of a union: the live set is one uint32 */

enum gram_node_kind { GRAM_NODE_STRING = 1, GRAM_NODE_NUMBER, GRAM_NODE_LITERAL, GRAM_NODE_OBJECT, GRAM_NODE_ARRAY, GRAM_NODE_UNION,
                     GRAM_NODE_OBJ_UNION };

/* Every number node keeps to |x| <= 2^53, the integers a double holds exactly (larger
 * ones reach a JSON consumer changed), and one without bounds to this many digits in
 * all (integer + fraction): a model that loops on digits ends its number there. */
#define GRAM_JSON_SAFE_INT 9007199254740992ll
#define GRAM_NUM_DIGIT_BUDGET 17

enum gram_num_mode {
    GRAM_NUM_FREE = 0, /* any JSON number (lowercase exponent); nothing tracked (unused by
                          the compiler since every number is bounded; kept for the syntax) */
    GRAM_NUM_EXACT,    /* bounded or unique: no exponent, <= 18 integer and fraction digits,
                     value tracked exactly as a decimal with 18 fraction digits; digits != 0:
                     at most that many digits in all (unbounded numbers) */
    GRAM_NUM_SCALED    /* integer, multipleOf, or a unique item: value * 10^scale tracked as an
                     int64, with at most `digits` digits in all (integer part + scale) */
};

typedef struct gram_node {
    uint8_t kind;
    union {
        struct {
            int32_t dfa;       /* index into g->dfas, -1 = any text */
            int32_t table;     /* index into g->tables, -1 = no length/pattern interplay */
            uint32_t min_len;  /* code points */
            uint32_t max_len;  /* UINT32_MAX = unbounded */
        } str;
        struct {
            uint8_t mode, scale, allow_frac, digits;
            gram_fx lo, hi;        /* GRAM_NUM_EXACT, inclusive, on the 1e-18 grid */
            int64_t slo, shi;    /* GRAM_NUM_SCALED, inclusive, in units of 10^-scale */
            int64_t step;        /* GRAM_NUM_SCALED: value must be a multiple (>= 1) */
        } num;
        struct {
            uint32_t first, count; /* entries g->lits[first, first + count) */
            uint32_t n_members;    /* distinct values (an entry may be a variant spelling) */
        } lit;
        struct {
            uint32_t first, count; /* key entries in g->lits; member = property index */
            uint32_t props;        /* property p's value node is g->prop_nodes[props + p] */
            uint32_t n_props;
            uint64_t required;     /* bit p: property p is required */
            uint32_t deps;         /* dependentRequired: once property p is written, the bits
                                    * of g->dep_masks[deps + p] are required too; GRAM_NONE:
                                    * none (set for every object node) */
            uint32_t free_value;   /* free-form object: node of every value, else GRAM_NONE */
            uint32_t free_key;     /* free-form object: string node for keys */
        } obj;
        struct {
            uint32_t items, min, max; /* max = UINT32_MAX unbounded */
            uint32_t unique;          /* uniqueItems: items are scalars, max is capped */
        } arr;
        struct {
            uint32_t pick; /* g->picks[pick + byte] = alternative node + 1, or 0 */
        } uni;
        struct {
            uint32_t first, count; /* merged key entries in g->lits; member = merged key */
            uint32_t n_alts, n_keys;
            /* g->prop_nodes[table ...]: alts[n_alts] (object nodes), has[n_keys] (bit a: alt a
             * declares key k), split[n_keys] (a union node over key k's value schemas when
             * those that differ start with different bytes, so that the first byte of the
             * value tells them apart; else GRAM_NONE), map[n_alts * n_keys] (property index
             * of key k in alt a, or GRAM_NONE), cls[n_alts * n_keys] (for key k, the least
             * alt whose value schema for k equals alt a's: equal classes, same values) */
            uint32_t table;
            uint32_t disc_key;  /* merged key whose value picks the alternative, or GRAM_NONE */
            uint32_t disc_node; /* literal node of all alternatives' values; member = alt */
        } ou;
    } u;
} gram_node;

typedef struct gram_lit {
    uint32_t off, len; /* bytes g->lit_bytes[off, off + len) */
    uint32_t member;   /* value id within its set (tool, property, enum member) */
} gram_lit;

typedef struct gram_len_table {
    uint32_t *next; /* [state * (k + 1) + j] = least reachable completion length >= j */
    uint32_t k;
} gram_len_table;

struct grammar {
    grammar_options opt;
    gram_node *nodes;
    uint32_t n_nodes;
    gram_lit *lits;
    uint32_t n_lits;
    uint8_t *lit_bytes;
    uint32_t *prop_nodes;
    uint64_t *dep_masks; /* dependentRequired of objects (gram_node.u.obj.deps) */
    uint32_t *picks; /* 256 entries per union */
    gram_dfa *dfas;
    uint32_t n_dfas;
    gram_len_table *tables;
    uint32_t n_tables;
    /* tools */
    uint32_t n_tools;
    char **tool_names;
    uint32_t names_first, names_count; /* literal set of quoted names; member = tool */
    uint32_t *tool_args;               /* node of each tool's arguments object */
};

/* Object unions: whether the value of key k can be read while the alternatives in `live`
 * remain, before one is committed: its declarers among them agree on its schema, or their
 * schemas start with different bytes (split), or it commits one (a single declarer, or the
 * discriminator). has/split/cls: the node's tables. Shared by the compiler's check that a
 * union has no dead end and by the recognizer. */
static inline int gram_ou_readable(const uint32_t *has, const uint32_t *split, const uint32_t *cls,
                                   uint32_t n_keys, uint32_t k, uint32_t disc, uint64_t live) {
    uint64_t d = has[k] & live;
    if (!d) return 0;
    if (!(d & (d - 1)) || k == disc || split[k] != GRAM_NONE) return 1;
    uint32_t c = GRAM_NONE;
    for (uint32_t a = 0; d; a++, d >>= 1) {
        if (!(d & 1)) continue;
        if (c == GRAM_NONE) c = cls[a * n_keys + k];
        else if (cls[a * n_keys + k] != c) return 0;
    }
    return 1;
}

/* The fixed text of a call object around the tool name and its arguments. */
#define GRAMMAR_CALL_PREFIX "{\"name\":"
#define GRAMMAR_CALL_MID ",\"arguments\":"

#endif
