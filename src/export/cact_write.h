/* Writing a .cact v2 file (spec §1): header, the 28 codebook floats, the 44-byte directory,
 * then every blob at the next 64-byte boundary (zero gaps, nothing after the last blob),
 * exactly the layout the official exporter (export._pack_cact) produces.
 *
 * The writer owns the blobs added to it. It knows nothing of tensor meaning: callers add
 * records in the positional order of §1.9. */
#ifndef NEEDLE_EXPORT_CACT_WRITE_H
#define NEEDLE_EXPORT_CACT_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "format/cact.h"

typedef struct cw_tensor {
    char name[40]; /* the exporter's label, e.g. "layer03.q_proj" (for reports only) */
    uint8_t dtype; /* enum cact_dtype */
    uint8_t ndim;
    uint32_t shape[4];
    uint32_t group, bits;
    uint8_t *blob; /* owned, nbytes */
    uint64_t nbytes;
} cw_tensor;

#define CACT_TAG_V3 0x05E12A84u
#define CACT_V3_HEADER_WORDS 49u /* 48 u32 + the f32 rope_theta: 196 bytes */

typedef struct cact_writer {
    cact_header h; /* v2: every field but tag, num_tensors and codebook_len (set on write) */
    /* v3 (Needle 3, cactus-needle 3.2.8) when set: the 49 header words, of which tag,
     * num_tensors and codebook_len (words 0-2) are filled on write */
    int v3;
    uint32_t v3_header[CACT_V3_HEADER_WORDS];
    float codebook[CACT_CODEBOOK_LEN];
    cw_tensor *tensors;
    uint32_t n, cap;
} cact_writer;

void cw_init(cact_writer *w);
void cw_release(cact_writer *w);

/* Appends a record; takes ownership of `blob` (malloc'd) even on failure. Returns 0 or
 * NEEDLE_ERR_OUT_OF_MEMORY. */
int cw_add(cact_writer *w, const char *name, uint8_t dtype, uint8_t ndim, const uint32_t *shape,
           uint32_t group, uint32_t bits, uint8_t *blob, uint64_t nbytes);

/* Total file size, or 0 on overflow. */
uint64_t cw_file_size(const cact_writer *w);

/* Lays the file out into a malloc'd image (*out, *size). Returns 0 or a negative status. */
int cw_serialize(const cact_writer *w, uint8_t **out, size_t *size);

#endif
