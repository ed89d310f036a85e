/* What the .cact readers of both generations share (format/ internal, not for other
 * layers): the bounds on header values, the directory walk, the codebooks, and checking
 * one record against the shape the layout expects at its position.
 *
 * The walk (cact_read_directory) validates what every record must satisfy whatever it
 * is (dtype, 64-byte alignment, bounds inside the image, RAW only last); the per-position
 * check (cact_check_record) then holds it to its exact shape, dtype class and size. */
#ifndef NEEDLE_FORMAT_CACT_WALK_H
#define NEEDLE_FORMAT_CACT_WALK_H

#include "format/cact.h"

/* Bounds on geometry values. They are far above any Needle configuration and exist so
 * that products of header fields stay well inside 64 bits and buffer sizes derived from
 * them stay allocatable. */
#define MAX_VOCAB (1u << 22)
#define MAX_D_MODEL (1u << 15)
#define MAX_LAYERS 1024u
#define MAX_HEADS 1024u
#define MAX_HEAD_DIM 4096u
#define MAX_SEQ_LEN (1u << 22)
#define MAX_LANES 64u
#define MAX_SLOTS (1u << 26)
#define MAX_TABLES 256u
#define MAX_TAPS 16u
#define MAX_ORDER 16u
#define MAX_GROUP 4096u

enum cact_expect_kind { EXPECT_FLOAT, EXPECT_CQ };

/* The record a layout puts at one position: its name, dtype class and exact shape. */
typedef struct cact_expected {
    char name[40];
    int kind;
    uint32_t ndim;
    uint64_t shape[4];
} cact_expected;

int cact_is_pow2(uint32_t x);

/* A header value and the range it must lie in. */
typedef struct cact_bound {
    const char *name;
    uint32_t value, lo, hi;
} cact_bound;

/* The header fields both generations check the same way; `who` ("cact", "cact3") and
 * `head_dim_name` go into the messages. */
typedef struct cact_common_fields {
    const char *who, *head_dim_name;
    uint32_t num_heads, num_kv_heads, head_dim, hada_n, d_model, num_layers;
    float rope_theta;
    uint32_t num_engram_orders, num_engram_sites, num_engram_tables, engram_slots,
        engram_sub_dim, engram_conv_taps, engram_conv_dilation;
    const uint32_t *engram_orders, *engram_sites;
} cact_common_fields;

/* 0, or NEEDLE_ERR_FORMAT naming the first value outside its range. */
int cact_check_bounds(const char *who, const cact_bound *b, size_t n);
/* Head grouping, RoPE halves, the Hadamard size, rope_theta and the engram geometry. */
int cact_check_common(const cact_common_fields *c);
void cact_expect(cact_expected *e, const char *name, int kind, uint32_t ndim, uint64_t s0,
                 uint64_t s1, uint64_t s2);
/* 0, or NEEDLE_ERR_FORMAT naming the record. Sets f->group from the first CQ record and
 * the record's name on success. */
int cact_check_record(cact_file *f, uint32_t i, const cact_expected *e);
/* The 28 codebook floats at byte `at` (the caller checked they lie inside the image). */
int cact_read_codebooks(cact_file *f, size_t at);
/* Fills f->tensors[0, f->num_tensors) from the records at [dir, dir_end). */
int cact_read_directory(cact_file *f, uint64_t dir, uint64_t dir_end);
/* The analytic ternary (and, in Needle 3, binary) levels, once f->group is known. */
void cact_set_analytic_levels(cact_file *f);

/* The Needle 3 reader (cact3.c), reached from cact_parse by the tag. */
int cact3_parse(const uint8_t *data, size_t size, cact_file *out);

#endif
