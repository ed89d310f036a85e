/* The .cact container (spec §1): header, codebooks, tensor directory, data blobs, in two
 * generations told apart by the tag: Needle 2 (CACT_TAG, 120-byte header, v2 layout) and
 * Needle 3 (CACT3_TAG, 196-byte header, cact3_header and the v3 layout of
 * docs/spec/NEEDLE3.md §1). cact_file.generation says which was read.
 *
 * cact_parse() validates a whole image before anything reads a tensor: header geometry,
 * codebooks, every directory record (dtype, shape against the positional layout of §1.9,
 * size against shape/bits/group, 64-byte alignment, bounds, integer overflow) and the
 * probe-head section. After it succeeds, every `data` pointer may be read for `nbytes`
 * bytes without further checks; that is the invariant the rest of the engine relies on.
 * The parser never copies tensor data: records point into the caller's image, which must
 * outlive the cact_file. */
#ifndef NEEDLE_FORMAT_CACT_H
#define NEEDLE_FORMAT_CACT_H

#include <stddef.h>
#include <stdint.h>

#define CACT_TAG 0x05E12A83u
#define CACT_TAG_V1 0x05E12A82u
#define CACT3_TAG 0x05E12A84u
#define CACT3_HEADER_BYTES 196u
#define CACT3_MAX_LAYERS 64u /* the global mask holds 64 layers */
#define CACT3_MAX_SITES 16u
#define CACT3_COND_RANK 8u   /* the Monarch MLP's conditioning rank (HADA_COND_RANK) */
#define CACT_HEADER_BYTES 120u
#define CACT_RECORD_BYTES 44u
#define CACT_ALIGN 64u
#define CACT_CODEBOOK_LEN 28u
#define CACT_BITS_TERNARY 5u
#define CACT_TERNARY_LEVEL 1.2240064f /* unit-variance 3-level Lloyd-Max point, §2.2 */
#define CACT3_BITS_BINARY 1u /* Needle 3 only: 8 codes a byte, levels {-1, +1} sqrt(2/pi)/sqrt(G) */

enum cact_dtype { CACT_FP16 = 1, CACT_FP32 = 2, CACT_CQ = 3, CACT_RAW = 4 };

typedef struct cact_header {
    uint32_t tag, num_tensors, codebook_len, kv_window, kv_bits, vocab, d_model, num_heads,
        num_kv_heads, num_layers, head_dim, max_seq_len, hada_n, mhc_lanes, engram_slots,
        engram_sub_dim, num_engram_tables, engram_conv_taps, engram_conv_dilation,
        num_engram_orders, engram_orders[4], num_engram_sites, engram_sites[4];
    float rope_theta;
} cact_header;

/* The Needle 3 header: 48 u32 fields then rope_theta, in file order. */
typedef struct cact3_header {
    uint32_t tag, num_tensors, codebook_len, kv_window, kv_bits, vocab, out_vocab, d_model,
        num_heads, num_kv_heads, num_layers, qk_head_dim, v_head_dim, max_seq_len, hada_n,
        mhc_lanes, sliding_window, global_mask_lo, global_mask_hi, qkv_conv_taps,
        engram_slots, engram_sub_dim, num_engram_tables, engram_conv_taps,
        engram_conv_dilation, engram_seed_heads, num_engram_orders, engram_orders[4],
        num_engram_sites, engram_sites[16];
    float rope_theta;
} cact3_header;

/* Positions of the Needle 3 sections in the directory (validated by cact3_parse). */
typedef struct cact3_layout {
    uint32_t layer_stride;   /* records per layer: 24, or 27 with conv taps */
    uint32_t hada_ba, hada_bb; /* Kronecker factor sizes, ba * bb = hada_n */
    uint32_t perm_index;     /* hada_p1; hada_p2 follows */
    uint32_t heads_index;    /* the heads manifest, or 0 when the file has no heads */
    uint32_t num_heads;      /* probe heads (v3 layout: 6 records, 7 for the router) */
    uint32_t head_codes[3];
} cact3_layout;

typedef struct cact_tensor {
    char name[40];     /* positional name from §1.9, e.g. "layer3.q_proj" */
    uint8_t dtype;     /* enum cact_dtype */
    uint8_t ndim;
    uint32_t shape[4];
    uint64_t offset;
    uint64_t nbytes;
    uint32_t group;    /* CQ only */
    uint32_t bits;     /* CQ only: 2, 3, 4 or 5 (ternary); Needle 3 also 1 (binary) */
    const uint8_t *data;
} cact_tensor;

/* Probe heads (§1.10): triples of probes [P][d], proj [out][P*d], bias [out]. */
typedef struct cact_probe_head {
    uint32_t code; /* 1 contrastive, 2 confidence */
    uint32_t probes_index, proj_index, bias_index;
    uint32_t num_probes, out_dim;
} cact_probe_head;

#define CACT_MAX_PROBE_HEADS 8

typedef struct cact_file {
    const uint8_t *base;
    size_t size;
    uint32_t generation;    /* 2 or 3 */
    cact_header h;          /* generation 2 */
    cact3_header h3;        /* generation 3 */
    cact3_layout l3;        /* generation 3 */
    float codebooks[6][16]; /* [bits] -> levels; [5] = ternary {-c, 0, +c}/sqrt(G);
                             * [1] = binary (Needle 3) {-b, +b}/sqrt(G), b = sqrt(2/pi) */
    uint32_t group;         /* the CQ group size shared by the file's CQ tensors (0: none) */
    cact_tensor *tensors;   /* num_tensors records, malloc'd */
    uint32_t num_tensors;
    int32_t tokenizer_index; /* index of the RAW record, -1 if absent */
    uint32_t num_probe_heads;
    cact_probe_head probe_heads[CACT_MAX_PROBE_HEADS];
    /* positional indices of the fixed sections (both generations) */
    uint32_t mhc_base, engram_base, final_norm_index;
} cact_file;

/* Parses and validates an image. On failure returns a negative needle_status with the
 * thread's error message set, and leaves `out` zeroed. */
int cact_parse(const uint8_t *data, size_t size, cact_file *out);
void cact_release(cact_file *f);

/* Derived sizes of one CQ record (validated by cact_parse). */
uint64_t cact_cq_row_bytes(uint64_t cols_pad, uint32_t bits);

#endif
