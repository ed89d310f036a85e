/* Weight bits maps ("default=2,embedding=4,mhc_phi=4", spec §5.4) with the official rules
 * (quantize.parse_bits_map / canonical_tensor_name / _bits_for in cactus-needle 2.0.15):
 *   - keys are canonicalized: layerNN. -> attn., engram(s)(_)N(. or /) -> engramN.,
 *     stack/ and /kernel stripped, layers/block/self_attn/ -> attn., embedding/embedding
 *     -> embedding, engramN.embedding -> engramN.tables, / -> .;
 *   - a tensor takes the width of the longest key that prefixes its canonical name, else
 *     the default; `default=` is required; a repeated key keeps its last width;
 *   - widths are 2, 3, 4 or 1.58 (ternary, record width 5). */
#ifndef NEEDLE_QUANT_BITS_MAP_H
#define NEEDLE_QUANT_BITS_MAP_H

#include <stddef.h>
#include <stdint.h>

#define BITS_MAP_MAX_ENTRIES 64
#define BITS_MAP_MAX_KEY 96

typedef struct bits_map {
    uint32_t default_bits; /* record width: 2, 3, 4 or 5 (ternary) */
    uint32_t n;
    struct {
        char key[BITS_MAP_MAX_KEY]; /* canonical */
        uint32_t bits;
    } entries[BITS_MAP_MAX_ENTRIES];
} bits_map;

/* Parses `spec`. A bare width ("4", "1.58") means "default=<width>". Returns 0, or
 * NEEDLE_ERR_INVALID_ARGUMENT with a message naming the bad part. */
int bits_map_parse(const char *spec, bits_map *out);

/* Canonical name of a tensor or key into out[cap]; returns 0, or -1 if it does not fit. */
int bits_map_canonical(const char *name, char *out, size_t cap);

/* Record width for the exporter's tensor `name` (e.g. "layer03.q_proj"). */
uint32_t bits_map_lookup(const bits_map *m, const char *name);

/* "2", "3", "4" or "1.58" for a record width. */
const char *bits_map_width_name(uint32_t bits);

#endif
