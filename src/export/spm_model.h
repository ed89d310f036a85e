/* The .cact tokenizer blob (spec §1.11) from a SentencePiece .model file, as the official
 * exporter (export._tokenizer_blob) writes it from sentencepiece's own view of the model.
 *
 * A .model file is a serialized ModelProto (protobuf). Only `pieces` (field 1: piece
 * text, score, type) are needed; every other field is skipped by wire type. Types map as
 * the exporter maps them: CONTROL, UNKNOWN, BYTE kept; a piece spelling one of the 10
 * chat markers becomes USER_DEFINED; everything else (NORMAL, UNUSED, other user-defined
 * pieces) becomes NORMAL. The header always says pad 0, eos 1, bos 2, unk 3,
 * add_dummy_prefix 1, byte_fallback 1, as the exporter writes. */
#ifndef NEEDLE_EXPORT_SPM_MODEL_H
#define NEEDLE_EXPORT_SPM_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* Builds the blob into *blob (malloc'd, *size bytes) and the number of pieces into
 * *n_pieces. Returns 0, or NEEDLE_ERR_FORMAT / NEEDLE_ERR_OUT_OF_MEMORY with a message. */
int spm_tokenizer_blob(const uint8_t *model, size_t size, uint8_t **blob, size_t *blob_size,
                       uint32_t *n_pieces);

/* The Needle 3 blob (cactus-needle 3.2.8): 16 chat markers (v2's 10 + <context>,
 * </context>, <extract>, </extract>, <schema>, </schema>) and add_dummy_prefix taken from
 * the model's normalizer_spec (the official exporter probes it by encoding "a"; the two
 * agree for a model whose normalizer adds the prefix or does not). */
int spm_tokenizer_blob_v3(const uint8_t *model, size_t size, uint8_t **blob, size_t *blob_size,
                          uint32_t *n_pieces);

#endif
