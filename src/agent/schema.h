/* schema.h: the compiled form of a tools JSON, shared by the compiler (schema.c,
 * schema_value.c) and the recognizer (grammar.c, grammar_value.c).
 *
 * A grammar is a graph of nodes addressed by index; every array below is owned by the
 * grammar and immutable after compilation. Invariants the compiler establishes and the
 * recognizer relies on:
 *   - every node admits at least one value (impossible schemas are refused), so a value
 *     slot can always be filled;
 *   - the alternatives of a union start with disjoint bytes, so the first byte of a value
 *     picks one alternative and no parallel simulation is needed;
 *   - literal sets are sorted by bytes (memcmp order, shorter first), so the entries that
 *     share a prefix form one contiguous range;
 *   - declared nesting fits in GRAMMAR_MAX_DEPTH frames. */
#ifndef NEEDLE_AGENT_SCHEMA_H
#define NEEDLE_AGENT_SCHEMA_H

#include <stdint.h>

#include "agent/decimal.h"
#include "agent/grammar.h"
#include "agent/regex.h"

#define GRAMMAR_MAX_PROPS 64 /* properties per object: the seen set is one uint64 */
#define GNONE UINT32_MAX

enum gnode_kind { GN_STRING = 1, GN_NUMBER, GN_LITERAL, GN_OBJECT, GN_ARRAY, GN_UNION };

enum num_mode {
    NUM_FREE = 0, /* any JSON number (lowercase exponent); nothing tracked */
    NUM_EXACT,    /* bounded or unique: no exponent, <= 18 integer and fraction digits,
                     value tracked exactly as a decimal with 18 fraction digits */
    NUM_SCALED    /* integer, multipleOf, or a unique item: value * 10^scale tracked as an
                     int64, with at most `digits` digits in all (integer part + scale) */
};

typedef struct gnode {
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
            fxnum lo, hi;        /* NUM_EXACT, inclusive, on the 1e-18 grid */
            int64_t slo, shi;    /* NUM_SCALED, inclusive, in units of 10^-scale */
            int64_t step;        /* NUM_SCALED: value must be a multiple (>= 1) */
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
            uint32_t free_value;   /* free-form object: node of every value, else GNONE */
            uint32_t free_key;     /* free-form object: string node for keys */
        } obj;
        struct {
            uint32_t items, min, max; /* max = UINT32_MAX unbounded */
            uint32_t unique;          /* uniqueItems: items are scalars, max is capped */
        } arr;
        struct {
            uint32_t pick; /* g->picks[pick + byte] = alternative node + 1, or 0 */
        } uni;
    } u;
} gnode;

typedef struct glit {
    uint32_t off, len; /* bytes g->lit_bytes[off, off + len) */
    uint32_t member;   /* value id within its set (tool, property, enum member) */
} glit;

typedef struct glen_table {
    uint32_t *next; /* [state * (k + 1) + j] = least reachable completion length >= j */
    uint32_t k;
} glen_table;

struct grammar {
    grammar_options opt;
    gnode *nodes;
    uint32_t n_nodes;
    glit *lits;
    uint32_t n_lits;
    uint8_t *lit_bytes;
    uint32_t *prop_nodes;
    uint32_t *picks; /* 256 entries per union */
    regex_dfa *dfas;
    uint32_t n_dfas;
    glen_table *tables;
    uint32_t n_tables;
    /* tools */
    uint32_t n_tools;
    char **tool_names;
    uint32_t names_first, names_count; /* literal set of quoted names; member = tool */
    uint32_t *tool_args;               /* node of each tool's arguments object */
};

/* ---- recognizer frames (grammar.c) ---------------------------------------------------- */

enum frame_kind { FR_ROOT = 1, FR_CALL, FR_STRING, FR_NUMBER, FR_LITERAL, FR_OBJECT, FR_ARRAY };
enum frame_flags { FF_UNIQUE = 1, FF_KEY = 2 }; /* item of a unique array; key of a free object */
/* phases of each frame kind */
enum { RT_START, RT_OPEN, RT_CALL, RT_AFTER, RT_NEXT };
enum { C_PREFIX, C_NAME, C_MID, C_ARGS, C_CLOSE };
enum { O_OPEN, O_FIRST, O_KEY, O_COLON, O_VALUE, O_AFTER, O_NEXT };
enum { A_OPEN, A_FIRST, A_ITEM, A_AFTER, A_NEXT };
enum { S_OPEN, S_BODY, S_ESC, S_U, S_LOW0, S_LOW1, S_LOWU, S_UTF8 };

#define GRAMMAR_CALL_PREFIX "{\"name\":"
#define GRAMMAR_CALL_MID ",\"arguments\":"

/* 1 if frame f (numbers and unquoted literals) may end here: its value is complete. */
int grammar_frame_can_end(const grammar *g, const grammar_state *st, const grammar_frame *f);
/* Pops the top frame, whose value is complete, and advances its parent. */
int grammar_pop(const grammar *g, grammar_state *st);

/* ---- shared helpers (grammar.c) ------------------------------------------------------ */

/* Narrows the literal range [*lo, *hi) whose entries share their first `off` bytes to the
 * entries whose byte at `off` is b. Returns 0 (range untouched) if there are none. */
int glit_narrow(const grammar *g, uint32_t *lo, uint32_t *hi, uint32_t off, uint8_t b);

/* 1 if string node n can still be completed from DFA state d after len code points. */
int gstr_live(const grammar *g, const gnode *n, uint32_t d, uint32_t len);

/* If the innermost value is a string without pattern or format and st is between code
 * points of its body, returns 1 and the code points it may still take in *budget
 * (UINT32_MAX = unbounded): then exactly the "plain" tokens (complete code points, none a
 * quote, backslash or control character) of at most *budget code points continue it
 * without leaving the string. token_trie.c uses this to skip most of the vocabulary. */
int grammar_plain_string_budget(const grammar *g, const grammar_state *st, uint32_t *budget);

/* Steps st by b in place (token_trie.c works on its own copies). Returns 1 if accepted;
 * on 0 the state is garbage. */
int grammar_step(const grammar *g, grammar_state *st, uint8_t b);

/* ---- number frames (grammar_number.c) ------------------------------------------------- */

/* Steps a number frame by b (1 accepted, 0 not). used/n_used: values already in the
 * enclosing unique array (n_used = 0 otherwise). */
int gnum_step(const gnode *n, grammar_frame *f, uint8_t b, const uint64_t *used, uint32_t n_used);
/* 1 if the number read so far is complete and valid (it may end here). */
int gnum_can_end(const gnode *n, const grammar_frame *f, const uint64_t *used, uint32_t n_used);
/* Identity of a finished number for uniqueItems (equal values give equal keys). */
uint64_t gnum_key(const gnode *n, const grammar_frame *f);

/* 64-bit mixing used for uniqueness keys. */
static inline uint64_t gmix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

#endif
