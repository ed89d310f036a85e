/* grammar.h: schema-constrained decoding of the tool-call array (spec §7.1, §7.4).
 *
 * After "<tool_call>" the model writes ANSWERS_JSON, a JSON array of calls, then
 * "</tool_call>". grammar_compile() turns the tools JSON into a byte-level recognizer for
 * the surface the model was trained on (Python json.dumps with separators (",", ":")):
 *
 *   "[" [ CALL { "," CALL } ] "]"
 *   CALL = {"name":"<declared name>","arguments":<object valid for that tool>}
 *
 * - No whitespace anywhere outside strings; keys "name" then "arguments", nothing else.
 * - "[]" (the refusal) is admitted unless options.allow_empty = 0; options.single_call
 *   admits at most one call (single_call = 1 with allow_empty = 0: exactly one call, the
 *   extraction case of one declared tool).
 * - Strings: raw UTF-8 (validated: no overlongs, surrogates or bytes past U+10FFFF) or
 *   escapes \" \\ \/ \b \f \n \r \t \uXXXX (either hex case; surrogate pairs must pair);
 *   raw control characters are refused. Lengths count code points.
 * - Numbers: -?(0|[1-9][0-9]*)(.[0-9]+)?(e[+-]?[0-9]+)?, lowercase e only, as Python
 *   writes them; bounded numbers drop the exponent and keep at most 18 integer and 18
 *   fraction digits, integers at most 18 digits, items of unique arrays 15 significant
 *   digits (see recognizer_number.c, compiler.c).
 * - Objects: declared properties in any order, each at most once, no unknown keys,
 *   required ones before "}". Keys, names, enum and const values are matched on their
 *   spelling: strings raw or \u-escaped (ensure_ascii False or True), integral numbers as
 *   "1" or "1.0".
 * The JSON Schema subset is described in compiler.c, the pattern subset in regex.h.
 *
 * Invariants, checked by the tests:
 *   - no dead ends: from every accepted prefix some continuation reaches a complete array,
 *     so a decoder that only picks allowed tokens always finishes (or hits max tokens);
 *   - everything accepted and complete parses as JSON, names declared tools and satisfies
 *     their schemas (within the subset).
 *
 * Threads: a grammar and a grammar_trie are immutable after construction and may be shared
 * by any number of threads. A grammar_state belongs to one decode; it is a plain
 * fixed-size struct without pointers, so it may be copied by assignment or memcpy
 * (grammar_state_copy copies only the used part). Failures return a negative
 * needle_status with a message (util/error.h); nothing here prints. Unless stated, g and
 * st must not be NULL. */
#ifndef NEEDLE_GRAMMAR_GRAMMAR_H
#define NEEDLE_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

/* Frames on the recognizer stack: root array, call object, then one per nested value. A
 * schema that needs more is refused at compile time; free-form values ("type":"object"
 * without properties, arrays without items, schemas without a type) stop opening
 * containers when the stack is full but can always close with a scalar. */
#define GRAMMAR_MAX_DEPTH 32
/* Values remembered for uniqueItems; a unique array holds at most this many items. */
#define GRAMMAR_MAX_UNIQUE 64

typedef struct grammar grammar;

typedef struct grammar_options {
    int32_t allow_empty; /* 1: "[]" is admitted (default 1) */
    int32_t single_call; /* 1: at most one call in the array (default 0) */
} grammar_options;

grammar_options grammar_default_options(void);

/* One level of the recognizer stack. Opaque to callers; 40 bytes. */
typedef struct grammar_frame {
    uint32_t node; /* compiled schema node (schema_ir.h) */
    uint8_t kind, phase, flags, aux;
    union {
        struct { uint32_t len, dfa, acc; uint16_t hs; uint8_t blo, bhi; uint64_t hash; } str;
        struct { uint64_t ip, fp; uint8_t neg, idig, fdig; } num;
        struct { uint32_t lo, hi, off, item; uint64_t seen, hash; } lit;
        struct { uint32_t count; uint64_t hash; } arr;
        struct { uint32_t lo, hi, off, key; uint64_t seen, live; } ou; /* object union, keys merged */
    } u;
} grammar_frame;

/* Per-decode cursor. Only frames[0, depth) and used[0, n_used) are meaningful. */
typedef struct grammar_state {
    uint32_t depth;
    uint32_t n_used;   /* values of the innermost uniqueItems array seen so far */
    uint32_t complete; /* the closing "]" has been read */
    uint32_t pad;
    grammar_frame frames[GRAMMAR_MAX_DEPTH];
    uint64_t used[GRAMMAR_MAX_UNIQUE];
} grammar_state;

/* Compiles a tools JSON array (`len` bytes, need not be NUL-terminated). Each entry is
 * {"name", "description"?, "parameters"?} or {"type":"function","function":{...}}.
 * Malformed JSON -> NEEDLE_ERR_JSON; an invalid, impossible or unsupported schema ->
 * NEEDLE_ERR_SCHEMA with a message naming the tool and the JSON path. opt may be NULL
 * (defaults). On success *out owns the grammar (free with grammar_free). */
int grammar_compile(const char *tools_json, size_t len, const grammar_options *opt,
                    grammar **out);

/* NULL is a no-op. */
void grammar_free(grammar *g);

uint32_t grammar_tool_count(const grammar *g);
/* Name of tool i as declared (UTF-8, NUL-terminated, owned by g); NULL if out of range. */
const char *grammar_tool_name(const grammar *g, uint32_t i);

/* Sets st to the start of a call array (nothing read yet). Cannot fail. */
void grammar_state_init(const grammar *g, grammar_state *st);

/* Copies the meaningful part of src (faster than a whole-struct copy). */
void grammar_state_copy(grammar_state *dst, const grammar_state *src);

/* 1: byte accepted and st advanced; 0: rejected and st unchanged. */
int grammar_accept_byte(const grammar *g, grammar_state *st, uint8_t byte);

/* All or nothing: 1 if every byte is accepted in turn (st advanced over all of them),
 * else 0 with st unchanged. n = 0 accepts. */
int grammar_accept_bytes(const grammar *g, grammar_state *st, const void *bytes, size_t n);

/* 1 once a whole call array has been read; no byte is accepted after that. */
int grammar_is_complete(const grammar *g, const grammar_state *st);

/* 1-based depth of the innermost frame when it is a string (a value, or the key of a free
 * object) whose opening quote has been read and whose closing quote has not; 0 otherwise.
 * A byte that stays inside the string keeps the depth; the closing quote drops it, and a
 * new string can only start after that, so a run of bytes that keeps one depth throughout
 * stayed in one string (the repetition guard, agent/repeat_guard.h, follows values so). */
uint32_t grammar_string_depth(const grammar *g, const grammar_state *st);

/* The same for a number: 1-based depth of the innermost frame when it is a number that
 * has read its first byte (a number has no closing byte: the byte after it, which the
 * enclosing value reads, drops the depth); 0 otherwise. */
uint32_t grammar_number_depth(const grammar *g, const grammar_state *st);

/* 1 when grammar_string_depth is not 0 and st is between two characters of that string:
 * not inside an escape sequence or a multi-byte UTF-8 character. */
int grammar_string_between_chars(const grammar *g, const grammar_state *st);

/* 1 right after a complete call, where "," (another call) or "]" may follow. */
int grammar_between_calls(const grammar *g, const grammar_state *st);

/* Writes to out a short continuation that takes st to a complete call array (st itself
 * is not changed), for a decoder that must stop: at most cap bytes, length in *n_out.
 * Every open value is finished with little text (required properties, minItems,
 * minLength, shortest matches of patterns and formats, valid numbers) and the walk always
 * terminates, unlike greedy byte orders. NEEDLE_OK; NEEDLE_ERR_BUFFER_TOO_SMALL if cap
 * bytes are not enough (*n_out = cap, out holds a prefix); NEEDLE_ERR_INVALID_ARGUMENT on
 * NULL; NEEDLE_ERR_OUT_OF_MEMORY. Completing an already complete state gives 0 bytes. */
int grammar_complete(const grammar *g, const grammar_state *st, char *out, size_t cap, size_t *n_out);

/* ---- token masks ------------------------------------------------------------------- */

/* A trie over the byte strings of a vocabulary, built once per vocabulary and shared. */
typedef struct grammar_trie grammar_trie;

/* token_bytes[i] / lens[i] are the bytes token i contributes to the text (meta-space
 * already turned into ' ', byte pieces as their byte). Tokens with no bytes are never
 * allowed by grammar_mask: give control and marker tokens ("<tool_call>", EOS) no bytes,
 * so that they cannot slip into a string value, and handle them outside the grammar.
 * Copies what it needs. NEEDLE_ERR_INVALID_ARGUMENT on NULL inputs or a token longer
 * than 65535 bytes; free with grammar_trie_free (NULL is a no-op). */
int grammar_trie_build(const char *const *token_bytes, const size_t *lens, uint32_t n_tokens,
                     grammar_trie **out);
void grammar_trie_free(grammar_trie *t);
uint32_t grammar_trie_size(const grammar_trie *t);

/* Writes allowed[i] = 1 for every token whose bytes can all be accepted from st, 0 for
 * the others (allowed has grammar_trie_size(t) entries): exactly what calling
 * grammar_accept_bytes on a copy of st would say for each token. Walks the trie depth
 * first so a shared prefix is stepped once and a rejected prefix prunes its subtree.
 * Returns the number of allowed tokens (0 for NULL arguments). After completion nothing
 * is allowed: the caller then lets "</tool_call>" through. Allocates scratch memory per
 * call; if that fails it falls back to checking token by token. */
uint32_t grammar_mask(const grammar *g, const grammar_state *st, const grammar_trie *t,
                      uint8_t *allowed);

#endif
