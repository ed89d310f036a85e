/* A Needle 3 ladder rung written as its own file (`needle quantize IN.cact --depth N`).
 *
 * docs/spec/NEEDLE3.md §2.6: depth d keeps the first d layers of the official bisection
 * order (model3_ladder_layers), in file order; the official rung export
 * (finetune.rung -> write_export, cactus-needle 3.2.8) is byte-identical, record by record,
 * to slicing the parent file. So a rung is made without decoding anything: the kept
 * layers' records, the kept rows of the mHC tables and phi matrices (CQ rows: codes and
 * f16 norms), the engram sites of kept layers, the probe-head rows of the embedding cell
 * and the kept layers' cells; the header gets the new layer count, the renumbered global
 * mask and engram sites (kv_window and everything else unchanged, as the official rung
 * file has them). */
#ifndef NEEDLE_EXPORT_RUNG_H
#define NEEDLE_EXPORT_RUNG_H

#include <stdint.h>

#include "export/cact_write.h"
#include "format/cact.h"

/* Fills `w` (cw_init'd) with the depth-`depth` rung of the generation-3 file `in`
 * (2 <= depth <= num_layers; depth == num_layers copies the file). Returns 0 or a
 * negative status with the error message set. */
int cact3_rung(const cact_file *in, uint32_t depth, cact_writer *w);

/* Copies a generation-3 file's header words and codebooks into `w` (records not
 * included): the start of every writer that re-emits a v3 file. */
void cact3_writer_header(const cact_file *in, cact_writer *w);

#endif
