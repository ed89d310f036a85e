/* SentencePiece ModelProto -> .cact tokenizer blob (see spm_model.h). A minimal protobuf
 * wire reader: varints of at most 10 bytes, length-delimited fields checked against the
 * remaining bytes, fixed32/fixed64 skipped, groups refused. */
#include "export/spm_model.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fp16.h"

enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER_DEFINED = 4, SP_UNUSED = 5, SP_BYTE = 6 };
enum { TK_NORMAL = 0, TK_UNKNOWN = 1, TK_CONTROL = 2, TK_USER_DEFINED = 3, TK_BYTE = 4 };

static const char *const chat_markers[] = {
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tools>",
    "</tools>",
    "<tool_call>",
    "</tool_call>",
    "<tool_result>",
    "</tool_result>",
    /* Needle 3 only */
    "<context>",
    "</context>",
    "<extract>",
    "</extract>",
    "<schema>",
    "</schema>",
};
#define V2_MARKERS 10u
#define V3_MARKERS 16u

typedef struct reader {
    const uint8_t *p, *end;
} reader;

static int varint(reader *r, uint64_t *v) {
    *v = 0;
    for (int i = 0; i < 10; i++) {
        if (r->p >= r->end) return -1;
        const uint8_t b = *r->p++;
        *v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) return 0;
    }
    return -1;
}

/* reads one field header and its value: a varint into *value, a fixed32/64 or a
 * length-delimited payload as the bounds in *payload */
static int field(reader *r, uint32_t *num, uint32_t *wire, uint64_t *value, reader *payload) {
    uint64_t key;
    if (varint(r, &key)) return -1;
    *num = (uint32_t)(key >> 3);
    *wire = (uint32_t)(key & 7);
    *value = 0;
    payload->p = payload->end = r->p;
    switch (*wire) {
    case 0: return varint(r, value);
    case 1:
    case 5: {
        const size_t w = *wire == 1 ? 8 : 4;
        if ((size_t)(r->end - r->p) < w) return -1;
        payload->end = r->p + w;
        r->p += w;
        return 0;
    }
    case 2: {
        uint64_t len;
        if (varint(r, &len) || len > (uint64_t)(r->end - r->p)) return -1;
        payload->p = r->p;
        payload->end = r->p + len;
        r->p += len;
        return 0;
    }
    default: return -1; /* groups (3, 4) and reserved types */
    }
}

typedef struct piece {
    const uint8_t *text;
    size_t len;
    float score;
    uint32_t type;
} piece;

static int parse_piece(reader m, piece *pc) {
    pc->text = (const uint8_t *)"";
    pc->len = 0;
    pc->score = 0.0f;
    pc->type = SP_NORMAL;
    while (m.p < m.end) {
        uint32_t num, wire;
        uint64_t value;
        reader pl;
        if (field(&m, &num, &wire, &value, &pl)) return -1;
        if (num == 1 && wire == 2) {
            pc->text = pl.p;
            pc->len = (size_t)(pl.end - pl.p);
        } else if (num == 2 && wire == 5) {
            pc->score = rd_f32(pl.p);
        } else if (num == 3 && wire == 0) {
            pc->type = (uint32_t)value;
        }
    }
    return 0;
}

static uint8_t blob_type(const piece *pc, uint32_t n_markers) {
    if (pc->type == SP_CONTROL) return TK_CONTROL;
    if (pc->type == SP_UNKNOWN) return TK_UNKNOWN;
    if (pc->type == SP_BYTE) return TK_BYTE;
    for (size_t i = 0; i < n_markers; i++)
        if (pc->len == strlen(chat_markers[i]) && !memcmp(pc->text, chat_markers[i], pc->len))
            return TK_USER_DEFINED;
    return TK_NORMAL;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* NormalizerSpec (ModelProto field 3) field 3: add_dummy_prefix, default true */
static int dummy_prefix(reader spec) {
    int dummy = 1;
    while (spec.p < spec.end) {
        uint32_t num, wire;
        uint64_t value;
        reader pl;
        if (field(&spec, &num, &wire, &value, &pl)) return -1;
        if (num == 3 && wire == 0) dummy = value != 0;
    }
    return dummy;
}

static int build_blob(const uint8_t *model, size_t size, uint8_t **blob, size_t *blob_size,
                      uint32_t *n_pieces, uint32_t n_markers) {
    *blob = NULL;
    *blob_size = 0;
    *n_pieces = 0;
    /* pass 1: count pieces and bytes, validating the structure */
    reader r = {model, model + size};
    uint64_t n = 0, bytes = 24;
    int dummy = 1;
    while (r.p < r.end) {
        uint32_t num, wire;
        uint64_t value;
        reader pl;
        if (field(&r, &num, &wire, &value, &pl))
            return needle_fail(NEEDLE_ERR_FORMAT,
                               "tokenizer model: not a SentencePiece model (bad protobuf at byte %zu)",
                               (size_t)(r.p - model));
        if (num == 3 && wire == 2 && (dummy = dummy_prefix(pl)) < 0)
            return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer model: malformed normalizer_spec");
        if (num != 1) continue;
        piece pc;
        if (wire != 2 || parse_piece(pl, &pc))
            return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer model: piece %llu is malformed",
                               (unsigned long long)n);
        if (pc.len > 0xffff)
            return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer model: piece %llu is longer than 65535 bytes",
                               (unsigned long long)n);
        n++;
        bytes += 7 + pc.len;
    }
    if (n == 0 || n > UINT32_MAX) return needle_fail(NEEDLE_ERR_FORMAT, "tokenizer model: no pieces");
    uint8_t *out = malloc((size_t)bytes);
    if (!out) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory for the tokenizer blob");
    put_u32(out, (uint32_t)n);
    put_u32(out + 4, 0);
    put_u32(out + 8, 1);
    put_u32(out + 12, 2);
    put_u32(out + 16, 3);
    /* v2's exporter always writes 1; v3's follows the model */
    out[20] = n_markers == V2_MARKERS ? 1 : (uint8_t)dummy;
    out[21] = 1;
    out[22] = out[23] = 0;
    uint8_t *w = out + 24;
    r = (reader){model, model + size};
    while (r.p < r.end) {
        uint32_t num, wire;
        uint64_t value;
        reader pl;
        if (field(&r, &num, &wire, &value, &pl)) break; /* validated by pass 1 */
        if (num != 1) continue;
        piece pc;
        parse_piece(pl, &pc);
        uint32_t sbits;
        memcpy(&sbits, &pc.score, sizeof sbits);
        put_u32(w, sbits);
        w[4] = blob_type(&pc, n_markers);
        w[5] = (uint8_t)(pc.len & 0xff);
        w[6] = (uint8_t)(pc.len >> 8);
        memcpy(w + 7, pc.text, pc.len);
        w += 7 + pc.len;
    }
    *blob = out;
    *blob_size = (size_t)bytes;
    *n_pieces = (uint32_t)n;
    return 0;
}

int spm_tokenizer_blob(const uint8_t *model, size_t size, uint8_t **blob, size_t *blob_size,
                       uint32_t *n_pieces) {
    return build_blob(model, size, blob, blob_size, n_pieces, V2_MARKERS);
}

int spm_tokenizer_blob_v3(const uint8_t *model, size_t size, uint8_t **blob, size_t *blob_size,
                          uint32_t *n_pieces) {
    return build_blob(model, size, blob, blob_size, n_pieces, V3_MARKERS);
}
