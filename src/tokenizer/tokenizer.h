/* tokenizer.h: the SentencePiece-BPE tokenizer embedded in a .cact file (spec §1.11, §6).
 *
 * A tokenizer is built from the RAW blob (the last directory record) and is immutable
 * afterwards: every function taking a `const tokenizer *` may run concurrently from
 * several threads. tokenizer_create copies everything it needs, so the blob may be
 * unmapped or freed as soon as it returns.
 *
 * Encoding reproduces the reference encoder (`RefTokenizer.encode`) id for id; decoding
 * reproduces `RefTokenizer.decode` byte for byte. Failures return a negative needle_status
 * and record a message (util/error.h). */
#ifndef NEEDLE_TOKENIZER_H
#define NEEDLE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

enum tokenizer_piece_type {
    TOKENIZER_NORMAL = 0,
    TOKENIZER_UNKNOWN = 1,
    TOKENIZER_CONTROL = 2,
    TOKENIZER_USER_DEFINED = 3,
    TOKENIZER_BYTE = 4
};

/* Parses and validates a RAW tokenizer blob of `size` bytes. `expected_vocab` is the .cact
 * header's vocab, which n_pieces must equal. Never reads outside [blob, blob + size); a
 * malformed blob yields NEEDLE_ERR_FORMAT. The blob is copied: no pointer into it is kept.
 * On success fills *out (free with tokenizer_free); on failure *out is untouched. */
int tokenizer_create(const uint8_t *blob, size_t size, uint32_t expected_vocab, tokenizer **out);

/* NULL is a no-op. */
void tokenizer_free(tokenizer *tok);

uint32_t tokenizer_vocab(const tokenizer *tok);

/* which: 0 pad, 1 eos, 2 bos, 3 unk (ids as stored in the blob); -1 for another `which`. */
int32_t tokenizer_special_id(const tokenizer *tok, int which);

/* The id the encoder emits for the USER_DEFINED marker `text` (NUL-terminated, e.g.
 * "<tool_call>"), or -1 if no USER_DEFINED piece has that text. */
int32_t tokenizer_marker_id(const tokenizer *tok, const char *text);

/* Encodes `len` bytes of UTF-8 (`text` need not be NUL-terminated and may be NULL when len
 * is 0). No BOS is added. NUL bytes or ill-formed UTF-8 -> NEEDLE_ERR_INVALID_UTF8 (the
 * message names the byte offset). *n_ids receives the number of ids; if it exceeds cap,
 * returns NEEDLE_ERR_BUFFER_TOO_SMALL with *n_ids set to the count needed (ids may be NULL
 * when cap is 0). Ids past cap are never written. */
int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, int32_t *ids, size_t cap,
                     size_t *n_ids);

/* As tokenizer_encode, but `dummy_prefix` = 0 encodes a continuation: no U+2581 is
 * prepended even if the tokenizer adds one. Because chat markers split the text into
 * independently merged segments, encoding a conversation piecewise this way from a marker
 * boundary gives exactly the ids of encoding it whole. */
int tokenizer_encode_ex(const tokenizer *tok, const char *text, size_t len, int dummy_prefix,
                        int32_t *ids, size_t cap, size_t *n_ids);

/* Decodes ids into `out` as UTF-8, NUL-terminated (spec §6.4: byte pieces give their byte,
 * control/unknown give nothing, ill-formed bytes become U+FFFD as Python's
 * errors='replace' does, U+2581 becomes a space, one leading space is stripped).
 * *out_len receives the length without the NUL. If cap < *out_len + 1, returns
 * NEEDLE_ERR_BUFFER_TOO_SMALL with *out_len set (and out[0] = '\0' when cap > 0).
 * An id outside [0, vocab) -> NEEDLE_ERR_INVALID_TOKEN. */
int tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n, char *out, size_t cap,
                     size_t *out_len);

/* Piece text as stored (meta-space as U+2581), NUL-terminated, owned by the tokenizer;
 * *len (if non-NULL) gets its byte length. NULL for an invalid id. */
const char *tokenizer_piece(const tokenizer *tok, int32_t id, size_t *len);

/* enum tokenizer_piece_type of the id, or NEEDLE_ERR_INVALID_TOKEN. */
int tokenizer_piece_type(const tokenizer *tok, int32_t id);

/* Piece score (0 for an invalid id). */
float tokenizer_piece_score(const tokenizer *tok, int32_t id);

/* Bytes the token contributes when decoded in the middle of a text: U+2581 -> ' ', a byte
 * piece -> its byte, control/unknown -> nothing, anything else -> its text. The leading-space
 * strip and U+FFFD replacement of tokenizer_decode are not applied, and a U+2581 spelled
 * by three byte pieces stays as those raw bytes. *bytes points into the tokenizer and is
 * NUL-terminated. NEEDLE_ERR_INVALID_TOKEN for a bad id. */
int tokenizer_token_bytes(const tokenizer *tok, int32_t id, const char **bytes, size_t *len);

#endif
