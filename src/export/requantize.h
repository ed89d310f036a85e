/* Re-quantizing a loaded .cact (either generation) to another bits map (`needle quantize`).
 *
 * Each CQ record is decoded as the official reader decodes it (export.read_export), then
 * quantized again with the width the map gives its name, exactly as the official
 * exporter would quantize those decoded weights; so the result is byte-identical to
 * read_export -> parameter tree -> write_export with the new map. FP16 records (norms,
 * diagonals, probe heads) and the RAW tokenizer are copied unchanged, as are the header
 * fields; the codebook section is the exporter's. Needle 3: the probe heads' CQ records
 * are re-quantized at CQ4 whatever the map (the 3.2.8 exporter's HEAD_BITS). */
#ifndef NEEDLE_EXPORT_REQUANTIZE_H
#define NEEDLE_EXPORT_REQUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#include "export/cact_write.h"
#include "export/export_model.h"
#include "format/cact.h"
#include "quant/bits_map.h"

/* Fills `w` (cw_init'd). progress may be NULL; its rel_error is ||W_new - W_in|| / ||W_in||
 * for CQ records (W_in: the input's decoded weights). Returns 0 or a negative status. */
int cact_requantize(const cact_file *in, const bits_map *map, export_progress_fn progress, void *user,
                    cact_writer *w);

/* The same from a .cact image: parses it (cact_parse) first. */
int cact_requantize_image(const uint8_t *image, size_t size, const bits_map *map, export_progress_fn progress,
                          void *user, cact_writer *w);

/* 0 if `image` parses with the engine's own loader (cact_parse), else its status and
 * message: the tools check a file before writing it. */
int cact_check_image(const uint8_t *image, size_t size);

#endif
