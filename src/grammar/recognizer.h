/* recognizer.h: internals of the byte-level recognizer (recognizer.c, recognizer_number.c,
 * recognizer_complete.c, token_trie.c) over the compiled IR of schema_ir.h: the frame
 * kinds and phases of a grammar_state and the stepping helpers the files share. Not used
 * by the compiler. */
#ifndef NEEDLE_GRAMMAR_RECOGNIZER_H
#define NEEDLE_GRAMMAR_RECOGNIZER_H

#include <stdint.h>

#include "grammar/grammar.h"
#include "grammar/schema_ir.h"

/* ---- recognizer frames (recognizer.c) ---------------------------------------------------- */

enum gram_frame_kind { GRAM_FR_ROOT = 1, GRAM_FR_CALL, GRAM_FR_STRING, GRAM_FR_NUMBER, GRAM_FR_LITERAL, GRAM_FR_OBJECT, GRAM_FR_ARRAY,
                      GRAM_FR_OBJ_UNION };
/* GRAM_FF_UNIQUE: an item of a unique array; GRAM_FF_KEY: a key of a free object;
 * GRAM_FF_HASH: a part of an object or array item of a unique array, whose canonical key
 * the enclosing frames fold into the item's key; GRAM_FF_DISC: the discriminator value of
 * an object union (the frame below), whose members are alternatives, only live ones
 * admitted. */
enum gram_frame_flags { GRAM_FF_UNIQUE = 1, GRAM_FF_KEY = 2, GRAM_FF_HASH = 4, GRAM_FF_DISC = 8 };
/* Results of a frame step: rejected; accepted; accepted and the frame's value is complete. */
enum { ST_REJECT = 0, ST_OK = 1, ST_DONE = 2 };
/* phases of each frame kind */
enum { ROOT_START, ROOT_OPEN, ROOT_CALL, ROOT_AFTER, ROOT_NEXT };
enum { CALL_PREFIX, CALL_NAME, CALL_MID, CALL_ARGS, CALL_CLOSE };
enum { OBJ_OPEN, OBJ_FIRST, OBJ_KEY, OBJ_COLON, OBJ_VALUE, OBJ_AFTER, OBJ_NEXT };
enum { ARR_OPEN, ARR_FIRST, ARR_ITEM, ARR_AFTER, ARR_NEXT };
enum { STR_OPEN, STR_BODY, STR_ESC, STR_U, STR_LOW0, STR_LOW1, STR_LOWU, STR_UTF8 };

/* 1 if frame f (numbers and unquoted literals) may end here: its value is complete. */
int gram_frame_can_end(const grammar *g, const grammar_state *st, const grammar_frame *f);
/* Pops the top frame, whose value is complete, and advances its parent. Returns 0 if the
 * parent refuses the value (it completes an object item of a unique array that repeats an
 * earlier item); st is then garbage, as after a refused gram_step. */
int gram_pop(const grammar *g, grammar_state *st);

/* Pushes a frame for a value of `node` whose first byte is b and steps it by b (1 accepted). */
int gram_push_value(const grammar *g, grammar_state *st, uint32_t node, uint8_t flags, uint8_t b);

/* ---- object unions (recognizer_union.c) -------------------------------------------------- */

/* Steps an object-union frame (st's top frame) by b: ST_REJECT, ST_OK or ST_DONE. Once a
 * key or the discriminator leaves one alternative, the frame becomes that alternative's
 * GRAM_FR_OBJECT frame. */
int gram_union_step(const grammar *g, grammar_state *st, grammar_frame *f, uint8_t b);
/* The value of the union frame f is complete; key is the value's frame key (for the
 * discriminator: the member, which is the alternative). */
void gram_union_value_done(const grammar *g, grammar_frame *f, uint64_t key);
/* For a GRAM_FF_DISC literal frame (st's top): 1 if member (an alternative) is still live. */
int gram_union_disc_live(const grammar_state *st, uint32_t member);
/* The next byte grammar_complete writes for a union frame: one that moves it toward a
 * commit or a close; -1 if none. accepts(b) says whether st accepts byte b. */
int gram_union_complete_byte(const grammar *g, const grammar_state *st,
                             int (*accepts)(const grammar *, const grammar_state *, uint8_t));

/* ---- shared helpers (recognizer.c) ------------------------------------------------------ */

/* Narrows the literal range [*lo, *hi) whose entries share their first `off` bytes to the
 * entries whose byte at `off` is b. Returns 0 (range untouched) if there are none. */
int gram_lit_narrow(const grammar *g, uint32_t *lo, uint32_t *hi, uint32_t off, uint8_t b);

/* 1 if string node n can still be completed from DFA state d after len code points. */
int gram_str_live(const grammar *g, const gram_node *n, uint32_t d, uint32_t len);

/* If the innermost value is a string without pattern or format and st is between code
 * points of its body, returns 1 and the code points it may still take in *budget
 * (UINT32_MAX = unbounded): then exactly the "plain" tokens (complete code points, none a
 * quote, backslash or control character) of at most *budget code points continue it
 * without leaving the string. token_trie.c uses this to skip most of the vocabulary. */
int gram_plain_string_budget(const grammar *g, const grammar_state *st, uint32_t *budget);

/* Steps st by b in place (token_trie.c works on its own copies). Returns 1 if accepted;
 * on 0 the state is garbage. */
int gram_step(const grammar *g, grammar_state *st, uint8_t b);

/* ---- number frames (recognizer_number.c) ------------------------------------------------- */


/* Identity of a finished number for uniqueItems (equal values give equal keys). */
uint64_t gram_num_key(const gram_node *n, const grammar_frame *f);

/* 64-bit mixing used for uniqueness keys. */
static inline uint64_t gram_mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

/* The values a scalar frame must avoid in a unique array: keys[0, n) are the earlier
 * items' keys. For an item itself, a value is used when its key is among them. For the
 * last property of an object item (every other property in, their part of the item's
 * key summed in `base`), a value is used when the item it completes, keyed as frame_key
 * keys objects, is among them: each earlier item rules out at most one value either way,
 * so counting candidates against n stays sound. n = 0: nothing to avoid. */
typedef struct gram_used {
    const uint64_t *keys;
    uint32_t n;
    int item;                      /* keys are object items' keys (the last-property case) */
    uint64_t base, prop_salt, node_salt;
} gram_used;

#define GRAM_OBJECT_KEY_TAG 0x6F626A6563740000ull

static inline int gram_used_has(const gram_used *u, uint64_t key) {
    if (u->item) key = gram_mix(GRAM_OBJECT_KEY_TAG, u->base + gram_mix(u->prop_salt, gram_mix(u->node_salt, key)));
    for (uint32_t i = 0; i < u->n; i++)
        if (u->keys[i] == key) return 1;
    return 0;
}

/* Steps a number frame by b (1 accepted, 0 not), avoiding the values u rules out. */
int gram_num_step(const gram_node *n, grammar_frame *f, uint8_t b, const gram_used *u);
/* 1 if the number read so far is complete, valid and not ruled out (it may end here). */
int gram_num_can_end(const gram_node *n, const grammar_frame *f, const gram_used *u);
/* The properties an object node needs before "}" once those in `seen` were written: its
 * required ones and the dependentRequired of the seen ones. */
static inline uint64_t gram_obj_needed(const grammar *g, const gram_node *n, uint64_t seen) {
    uint64_t r = n->u.obj.required;
    if (n->u.obj.deps != GRAM_NONE)
        for (uint32_t p = 0; p < n->u.obj.n_props; p++)
            if (seen >> p & 1) r |= g->dep_masks[n->u.obj.deps + p];
    return r;
}

/* 1 once the number frame f has read its first byte. */
int gram_num_started(const grammar_frame *f);

#endif
