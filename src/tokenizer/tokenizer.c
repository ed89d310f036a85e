/* tokenizer.c: parse the RAW tokenizer blob (spec §1.11, §6.2) and run the reference
 * encoder and decoder (§6.3, §6.4) exactly, but in O(n log n).
 *
 * Invariants after tokenizer_create:
 *   - every piece text is valid UTF-8 and lives, NUL-terminated, in one arena owned by the
 *     tokenizer, followed by its "mid" bytes (what the token adds inside a text);
 *   - the hash table maps a text to the LAST id carrying it, as the reference's dict does;
 *   - pad/eos/bos/unk are < n; scores are not NaN (the reference's strict ">" scan only
 *     defines an order without NaN); USER_DEFINED pieces are non-empty (an empty marker
 *     would make the reference loop forever).
 *
 * Encoding. The reference repeatedly scans the whole symbol list for the pair whose
 * concatenation is a piece with the highest score, taking the leftmost on ties: O(n^2).
 * We keep the symbols in a linked list and every candidate pair in a binary heap ordered
 * by (score desc, left symbol index asc). A symbol keeps the index of its first code
 * point, so index order is sequence order and "smallest index" is "leftmost". Merging
 * only changes the two pairs around the merged symbol; the old entries stay in the heap and
 * are recognised as stale when popped (the left symbol is dead, or the pair it now forms
 * spans a different length). The first live entry popped is therefore exactly the pair the
 * naive scan would pick. Byte offsets fit size_t, so there is no hidden length cap.
 *
 * When no piece holds U+2581 after its first code point (true of SentencePiece vocabularies
 * that split by whitespace), no merge can span the boundary in front of a U+2581; the text
 * is then cut there too. Merges on the two sides never interact, so each side ends as it
 * would in one big run, and the heaps stay word-sized. */
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/utf8.h"

#define HEADER_SIZE 24
#define RECORD_SIZE 7 /* f32 score, u8 type, u16 len: packed */
#define NONE ((size_t)-1)

typedef struct piece {
    const char *text; /* NUL-terminated, in the arena */
    const char *mid;  /* tokenizer_token_bytes view, NUL-terminated, in the arena */
    uint16_t len, mid_len;
    uint8_t type;
    float score;
} piece;

typedef struct marker {
    const char *text;
    size_t len;
    int32_t id;   /* the piece's own id (for the stable order) */
    int32_t emit; /* what the encoder emits: the last id with this text */
} marker;

struct tokenizer {
    uint32_t n;
    int32_t special[4]; /* pad, eos, bos, unk */
    int add_dummy_prefix, byte_fallback;
    int split_at_meta; /* no piece has U+2581 past its start, so no merge crosses "x|▁" */
    piece *pieces;
    char *arena;
    int32_t *slots; /* open addressing, -1 = empty */
    size_t mask;
    size_t max_len; /* longest piece text: longer concatenations need no lookup */
    int32_t byte_id[256];
    marker *markers; /* grouped by first byte, longest first within a group */
    size_t n_markers;
    size_t marker_begin[257]; /* group of byte b: markers[marker_begin[b] .. marker_begin[b+1]) */
};

static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static float rd_f32(const uint8_t *p) {
    uint32_t u = rd_u32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Offset of the first ill-formed (or, if reject_nul, NUL) byte in s[0..n), or NONE. */
static size_t utf8_check(const uint8_t *s, size_t n, int reject_nul) {
    size_t i = 0, bad;
    uint32_t cp;
    while (i < n) {
        int r = util_utf8_next(s + i, n - i, &cp, &bad);
        if (r <= 0 || (reject_nul && cp == 0)) return i;
        i += (size_t)r;
    }
    return NONE;
}

static size_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211u;
    return (size_t)(h ^ h >> 29);
}

/* Last id whose text is s[0..n), or -1. */
static int32_t lookup(const tokenizer *tok, const char *s, size_t n) {
    if (n > tok->max_len) return -1;
    for (size_t h = hash_bytes(s, n) & tok->mask;; h = (h + 1) & tok->mask) {
        int32_t id = tok->slots[h];
        if (id < 0) return -1;
        const piece *p = &tok->pieces[id];
        if (p->len == n && memcmp(p->text, s, n) == 0) return id;
    }
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Value of a byte piece "<0xHH>", or -1. The reference reads characters 3-4 only; we insist
 * on the whole shape so that a corrupt name is caught instead of decoding to junk. */
static int byte_piece_value(const char *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static int marker_order(const void *a, const void *b) {
    const marker *x = a, *y = b;
    uint8_t fx = (uint8_t)x->text[0], fy = (uint8_t)y->text[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void tokenizer_free(tokenizer *tok) {
    if (!tok) return;
    free(tok->pieces);
    free(tok->arena);
    free(tok->slots);
    free(tok->markers);
    free(tok);
}

/* Fills the hash table, the byte map and the marker table once every piece is in place. */
static int build_indexes(tokenizer *tok) {
    size_t cap = 16;
    while (cap < 2 * (size_t)tok->n) cap *= 2;
    tok->slots = malloc(cap * sizeof *tok->slots);
    if (!tok->slots) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    memset(tok->slots, 0xFF, cap * sizeof *tok->slots);
    tok->mask = cap - 1;
    for (int32_t b = 0; b < 256; b++) tok->byte_id[b] = -1;
    for (uint32_t i = 0; i < tok->n; i++) {
        const piece *p = &tok->pieces[i];
        size_t h = hash_bytes(p->text, p->len) & tok->mask;
        for (; tok->slots[h] >= 0; h = (h + 1) & tok->mask) {
            const piece *q = &tok->pieces[tok->slots[h]];
            if (q->len == p->len && memcmp(q->text, p->text, p->len) == 0) break;
        }
        tok->slots[h] = (int32_t)i; /* a duplicate text is overwritten: last id wins */
        if (p->type == TOKENIZER_BYTE) tok->byte_id[(uint8_t)p->mid[0]] = (int32_t)i;
        if (p->type == TOKENIZER_USER_DEFINED) tok->n_markers++;
    }
    tok->markers = malloc((tok->n_markers ? tok->n_markers : 1) * sizeof *tok->markers);
    if (!tok->markers) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    size_t k = 0;
    for (uint32_t i = 0; i < tok->n; i++) {
        const piece *p = &tok->pieces[i];
        if (p->type != TOKENIZER_USER_DEFINED) continue;
        tok->markers[k++] = (marker){p->text, p->len, (int32_t)i, lookup(tok, p->text, p->len)};
    }
    /* At one position two matching markers are prefixes of one another, so "longest by code
     * points first" (the reference) and "longest by bytes within the first byte's group"
     * pick the same one. */
    qsort(tok->markers, tok->n_markers, sizeof *tok->markers, marker_order);
    size_t m = 0;
    for (int b = 0; b < 256; b++) {
        tok->marker_begin[b] = m;
        while (m < tok->n_markers && (uint8_t)tok->markers[m].text[0] == b) m++;
    }
    tok->marker_begin[256] = m;
    return NEEDLE_OK;
}

/* Validates record i at blob[*off..] and copies it into the arena at *cursor. */
static int read_piece(tokenizer *tok, uint32_t i, const uint8_t *blob, size_t size, size_t *off,
                      char **cursor) {
    if (size - *off < RECORD_SIZE)
        return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: piece %u record runs past the blob end", i);
    const uint8_t *r = blob + *off;
    float score = rd_f32(r);
    uint8_t type = r[4];
    size_t len = (size_t)r[5] | (size_t)r[6] << 8;
    *off += RECORD_SIZE;
    if (len > size - *off)
        return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: piece %u text (%zu bytes) runs past the blob end",
                           i, len);
    const uint8_t *s = blob + *off;
    *off += len;
    if (isnan(score)) return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: piece %u has a NaN score", i);
    if (type > TOKENIZER_BYTE)
        return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: piece %u has unknown type %u", i, type);
    size_t bad = utf8_check(s, len, 0);
    if (bad != NONE)
        return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: piece %u text is not UTF-8 (byte %zu)", i, bad);
    if (type == TOKENIZER_USER_DEFINED && len == 0)
        return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: piece %u is an empty user-defined marker", i);

    piece *p = &tok->pieces[i];
    char *t = *cursor;
    memcpy(t, s, len);
    t[len] = '\0';
    char *mid = t + len + 1, *w = mid;
    if (type == TOKENIZER_BYTE) {
        int v = byte_piece_value(t, len);
        if (v < 0) return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: byte piece %u is not <0xHH>", i);
        *w++ = (char)v;
    } else if (type != TOKENIZER_CONTROL && type != TOKENIZER_UNKNOWN) {
        for (size_t j = 0; j < len;) {
            if (len - j >= 3 && memcmp(t + j, "\xE2\x96\x81", 3) == 0) {
                *w++ = ' ';
                j += 3;
            } else {
                *w++ = t[j++];
            }
        }
    }
    *w = '\0';
    *p = (piece){t, mid, (uint16_t)len, (uint16_t)(w - mid), type, score};
    for (size_t j = 1; j + 3 <= len && tok->split_at_meta; j++)
        if (memcmp(t + j, "\xE2\x96\x81", 3) == 0) tok->split_at_meta = 0;
    *cursor = w + 1;
    if (len > tok->max_len) tok->max_len = len;
    return NEEDLE_OK;
}

int tokenizer_create(const uint8_t *blob, size_t size, uint32_t expected_vocab, tokenizer **out) {
    if (!out || (!blob && size)) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tokenizer: NULL argument");
    if (size < HEADER_SIZE)
        return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: blob of %zu bytes is shorter than its header", size);
    uint32_t n = rd_u32(blob);
    if (n != expected_vocab)
        return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: %u pieces but the header vocab is %u", n,
                           expected_vocab);
    if (n == 0 || n > INT32_MAX || n > (size - HEADER_SIZE) / RECORD_SIZE)
        return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: %u pieces cannot fit in a %zu-byte blob", n, size);
    tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    tok->n = n;
    static const char *const names[4] = {"pad", "eos", "bos", "unk"};
    for (int k = 0; k < 4; k++) {
        uint32_t id = rd_u32(blob + 4 + 4 * k);
        if (id >= n) {
            tokenizer_free(tok);
            return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: %s id %u is not below %u", names[k], id, n);
        }
        tok->special[k] = (int32_t)id;
    }
    tok->add_dummy_prefix = blob[20] != 0; /* the reference takes any non-zero byte as true */
    tok->byte_fallback = blob[21] != 0;
    tok->split_at_meta = 1;

    /* Each text is stored twice at most (text, mid bytes), each with a NUL. Size by what
     * the blob can hold past the header, not by n records: a hostile early piece may claim
     * the bytes meant for later records, and it is copied before that shows. */
    size_t text_max = size - HEADER_SIZE;
    tok->pieces = malloc((size_t)n * sizeof *tok->pieces);
    tok->arena = text_max <= (SIZE_MAX - 2 * (size_t)n) / 2 ? malloc(2 * text_max + 2 * (size_t)n) : NULL;
    if (!tok->pieces || !tok->arena) {
        tokenizer_free(tok);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
    size_t off = HEADER_SIZE;
    char *cursor = tok->arena;
    int rc = NEEDLE_OK;
    for (uint32_t i = 0; i < n && rc == NEEDLE_OK; i++) rc = read_piece(tok, i, blob, size, &off, &cursor);
    if (rc == NEEDLE_OK && off != size)
        rc = needle_fail(NEEDLE_ERR_FORMAT, "tokenizer: %zu stray bytes after the last piece", size - off);
    if (rc == NEEDLE_OK) rc = build_indexes(tok);
    if (rc != NEEDLE_OK) {
        tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return NEEDLE_OK;
}

uint32_t tokenizer_vocab(const tokenizer *tok) { return tok ? tok->n : 0; }

int32_t tokenizer_special_id(const tokenizer *tok, int which) {
    return tok && which >= 0 && which < 4 ? tok->special[which] : -1;
}

int32_t tokenizer_marker_id(const tokenizer *tok, const char *text) {
    if (!tok || !text || !text[0]) return -1;
    size_t len = strlen(text);
    uint8_t b = (uint8_t)text[0];
    for (size_t k = tok->marker_begin[b]; k < tok->marker_begin[b + 1]; k++)
        if (tok->markers[k].len == len && memcmp(tok->markers[k].text, text, len) == 0)
            return tok->markers[k].emit;
    return -1;
}

static int valid_id(const tokenizer *tok, int32_t id) { return tok && id >= 0 && (uint32_t)id < tok->n; }

const char *tokenizer_piece(const tokenizer *tok, int32_t id, size_t *len) {
    if (len) *len = 0;
    if (!valid_id(tok, id)) return NULL;
    if (len) *len = tok->pieces[id].len;
    return tok->pieces[id].text;
}

int tokenizer_piece_type(const tokenizer *tok, int32_t id) {
    return valid_id(tok, id) ? tok->pieces[id].type : NEEDLE_ERR_INVALID_TOKEN;
}

float tokenizer_piece_score(const tokenizer *tok, int32_t id) {
    return valid_id(tok, id) ? tok->pieces[id].score : 0.0f;
}

int tokenizer_token_bytes(const tokenizer *tok, int32_t id, const char **bytes, size_t *len) {
    if (!valid_id(tok, id) || !bytes || !len)
        return needle_fail(NEEDLE_ERR_INVALID_TOKEN, "tokenizer: token id %d is out of range", (int)id);
    *bytes = tok->pieces[id].mid;
    *len = tok->pieces[id].mid_len;
    return NEEDLE_OK;
}

/* ---- encoder ---------------------------------------------------------------------- */

typedef struct symbol {
    size_t start, len; /* bytes of the escaped text; len 0 = merged away */
    size_t prev, next; /* NONE at the ends */
} symbol;

typedef struct candidate {
    float score;
    size_t left; /* symbol index of the left half */
    size_t len;  /* byte length of the concatenation when it was pushed */
} candidate;

typedef struct encoder {
    const tokenizer *tok;
    const char *esc; /* escaped text: dummy prefix, spaces as U+2581 */
    symbol *syms;
    candidate *heap; /* room for 3 entries per symbol: n-1 initial pairs + 2 per merge */
    size_t n_heap, cap_syms;
    int32_t *ids;
    size_t cap, count;
} encoder;

static void emit(encoder *e, int32_t id) {
    if (e->count < e->cap) e->ids[e->count] = id;
    e->count++;
}

/* The naive scan's choice: higher score, then the smaller (leftmost) index. */
static int better(const candidate *a, const candidate *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(encoder *e, candidate c) {
    size_t i = e->n_heap++;
    while (i > 0 && better(&c, &e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = c;
}

static candidate heap_pop(encoder *e) {
    candidate top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && better(&e->heap[c + 1], &e->heap[c])) c++;
        if (!better(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* Queues the pair (left, left's next) if its concatenation is a piece. */
static void push_pair(encoder *e, size_t left) {
    const symbol *l = &e->syms[left];
    size_t len = l->len + e->syms[l->next].len;
    int32_t id = lookup(e->tok, e->esc + l->start, len);
    if (id >= 0) heap_push(e, (candidate){e->tok->pieces[id].score, left, len});
}

/* Grows the symbol and heap scratch to hold n symbols; the buffers are reused across
 * segments, so memory follows the longest segment, not the whole text. */
static int reserve(encoder *e, size_t n) {
    if (n <= e->cap_syms) return NEEDLE_OK;
    size_t cap = e->cap_syms ? e->cap_syms : 64;
    while (cap < n) cap = cap > SIZE_MAX / 2 ? n : 2 * cap;
    if (cap > SIZE_MAX / (3 * sizeof(candidate)))
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tokenizer: segment of %zu symbols is too long", n);
    symbol *syms = realloc(e->syms, cap * sizeof *syms);
    if (syms) e->syms = syms;
    candidate *heap = realloc(e->heap, 3 * cap * sizeof *heap);
    if (heap) e->heap = heap;
    if (!syms || !heap) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    e->cap_syms = cap;
    return NEEDLE_OK;
}

/* BPE over esc[begin, end), emitting ids (spec §6.3 step 5). */
static int encode_segment(encoder *e, size_t begin, size_t end) {
    const tokenizer *tok = e->tok;
    size_t n_sym = 0;
    uint32_t cp;
    size_t bad;
    for (size_t p = begin; p < end; p++) n_sym += ((uint8_t)e->esc[p] & 0xC0) != 0x80;
    int rc = reserve(e, n_sym);
    if (rc != NEEDLE_OK) return rc;
    n_sym = 0;
    for (size_t p = begin; p < end; n_sym++) {
        size_t l = (size_t)util_utf8_next((const uint8_t *)e->esc + p, end - p, &cp, &bad);
        e->syms[n_sym] = (symbol){p, l, n_sym ? n_sym - 1 : NONE, n_sym + 1};
        p += l;
    }
    if (n_sym == 0) return NEEDLE_OK;
    e->syms[n_sym - 1].next = NONE;
    e->n_heap = 0;
    for (size_t k = 0; k + 1 < n_sym; k++) push_pair(e, k);
    while (e->n_heap) {
        candidate c = heap_pop(e);
        symbol *l = &e->syms[c.left];
        if (l->len == 0 || l->next == NONE || l->len + e->syms[l->next].len != c.len) continue; /* stale */
        symbol *r = &e->syms[l->next];
        l->len += r->len;
        l->next = r->next;
        r->len = 0;
        if (l->next != NONE) e->syms[l->next].prev = c.left;
        if (l->prev != NONE) push_pair(e, l->prev);
        if (l->next != NONE) push_pair(e, c.left);
    }
    for (size_t k = 0; k != NONE; k = e->syms[k].next) {
        const symbol *s = &e->syms[k];
        int32_t id = lookup(tok, e->esc + s->start, s->len);
        if (id >= 0) {
            emit(e, id);
        } else if (!tok->byte_fallback) {
            emit(e, tok->special[3]);
        } else {
            for (size_t j = 0; j < s->len; j++) {
                uint8_t b = (uint8_t)e->esc[s->start + j];
                if (tok->byte_id[b] < 0)
                    return needle_fail(NEEDLE_ERR_FORMAT,
                                       "tokenizer: byte fallback needs <0x%02X>, which the vocabulary lacks", b);
                emit(e, tok->byte_id[b]);
            }
        }
    }
    return NEEDLE_OK;
}

int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, int32_t *ids, size_t cap,
                     size_t *n_ids) {
    return tokenizer_encode_ex(tok, text, len, 1, ids, cap, n_ids);
}

int tokenizer_encode_ex(const tokenizer *tok, const char *text, size_t len, int dummy_prefix,
                        int32_t *ids, size_t cap, size_t *n_ids) {
    if (!tok || !n_ids || (!text && len) || (!ids && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tokenizer_encode: NULL argument");
    *n_ids = 0;
    size_t bad = utf8_check((const uint8_t *)text, len, 1);
    if (bad != NONE)
        return needle_fail(NEEDLE_ERR_INVALID_UTF8, "tokenizer: %s at byte offset %zu",
                           text[bad] ? "invalid UTF-8" : "NUL byte", bad);
    if (len == 0) return NEEDLE_OK; /* no dummy prefix for empty text */
    if (len > (SIZE_MAX - 3) / 3)
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tokenizer: text of %zu bytes is too long", len);

    size_t spaces = 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t prefix = tok->add_dummy_prefix && dummy_prefix ? 3 : 0;
    size_t esc_len = prefix + len + 2 * spaces;
    char *esc = malloc(esc_len);
    if (!esc) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    char *w = esc;
    if (prefix) {
        memcpy(w, "\xE2\x96\x81", 3);
        w += 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w, "\xE2\x96\x81", 3);
            w += 3;
        } else {
            *w++ = text[i];
        }
    }

    encoder e = {tok, esc, NULL, NULL, 0, 0, ids, cap, 0};
    int rc = NEEDLE_OK;
    size_t seg = 0, i = 0;
    uint32_t cp;
    while (i < esc_len && rc == NEEDLE_OK) {
        uint8_t b = (uint8_t)esc[i];
        const marker *hit = NULL;
        for (size_t k = tok->marker_begin[b]; k < tok->marker_begin[b + 1] && !hit; k++) {
            const marker *m = &tok->markers[k];
            if (m->len <= esc_len - i && memcmp(esc + i, m->text, m->len) == 0) hit = m;
        }
        if (hit) {
            rc = encode_segment(&e, seg, i);
            emit(&e, hit->emit);
            i += hit->len;
            seg = i;
        } else if (tok->split_at_meta && i > seg && esc_len - i >= 3 && memcmp(esc + i, "\xE2\x96\x81", 3) == 0) {
            /* Only a speed-up: words then merge in small heaps, in the same order per word. */
            rc = encode_segment(&e, seg, i);
            seg = i;
            i += 3;
        } else {
            i += (size_t)util_utf8_next((const uint8_t *)esc + i, esc_len - i, &cp, &bad);
        }
    }
    if (rc == NEEDLE_OK) rc = encode_segment(&e, seg, esc_len);
    free(esc);
    free(e.syms);
    free(e.heap);
    if (rc != NEEDLE_OK) return rc;
    *n_ids = e.count;
    if (e.count > cap)
        return needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "tokenizer: %zu ids do not fit in %zu", e.count, cap);
    return NEEDLE_OK;
}

/* ---- decoder ---------------------------------------------------------------------- */

typedef struct decoder {
    char *out;
    size_t cap, pos; /* pos counts every byte produced, written or not */
    int strip;       /* the next code point is the first: drop it if it is a space */
    uint8_t pend[4]; /* an unfinished but so far valid UTF-8 sequence */
    size_t n_pend;
} decoder;

static void put_cp(decoder *d, uint32_t cp) {
    if (cp == 0x2581) cp = ' ';
    if (d->strip) {
        d->strip = 0;
        if (cp == ' ') return;
    }
    uint8_t u[4];
    const size_t n = util_utf8_encode(cp, u);
    for (size_t k = 0; k < n; k++, d->pos++)
        if (d->pos < d->cap) d->out[d->pos] = (char)u[k];
}

/* Feeds one byte of the concatenated piece bytes. The pending bytes are always a valid
 * prefix, so a new byte either completes it, extends it, or shows it ill-formed; in the
 * last case one U+FFFD stands for the prefix and the new byte starts afresh. */
static void feed(decoder *d, uint8_t b) {
    uint32_t cp;
    size_t bad;
    d->pend[d->n_pend++] = b;
    while (d->n_pend) {
        int r = util_utf8_next(d->pend, d->n_pend, &cp, &bad);
        if (r < 0) return;
        if (r > 0) {
            put_cp(d, cp);
            d->n_pend = 0;
            return;
        }
        put_cp(d, 0xFFFD);
        memmove(d->pend, d->pend + bad, d->n_pend - bad);
        d->n_pend -= bad;
    }
}

int tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n, char *out, size_t cap,
                     size_t *out_len) {
    if (!tok || !out_len || (!ids && n) || (!out && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "tokenizer_decode: NULL argument");
    *out_len = 0;
    for (size_t i = 0; i < n; i++)
        if (!valid_id(tok, ids[i]))
            return needle_fail(NEEDLE_ERR_INVALID_TOKEN, "tokenizer: token %d at index %zu is not in [0, %u)",
                               (int)ids[i], i, tok->n);
    decoder d = {out, cap, 0, tok->add_dummy_prefix, {0}, 0};
    for (size_t i = 0; i < n; i++) {
        const piece *p = &tok->pieces[ids[i]];
        if (p->type == TOKENIZER_BYTE) {
            feed(&d, (uint8_t)p->mid[0]);
        } else if (p->type != TOKENIZER_CONTROL && p->type != TOKENIZER_UNKNOWN) {
            for (size_t k = 0; k < p->len; k++) feed(&d, (uint8_t)p->text[k]);
        }
    }
    if (d.n_pend) put_cp(&d, 0xFFFD); /* a truncated sequence at the end is one maximal subpart */
    *out_len = d.pos;
    if (d.pos >= cap) {
        if (cap) out[0] = '\0';
        return needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "tokenizer: decoded text needs %zu bytes, have %zu",
                           d.pos + 1, cap);
    }
    out[d.pos] = '\0';
    return NEEDLE_OK;
}
