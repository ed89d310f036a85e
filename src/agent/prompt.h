/* Prompt pieces of a conversation (agent/chat.c): the tools as the model was trained on
 * them, their grammar, and the static prefix that set_tools caches.
 *
 * Template (cactus-needle 2.0.15, finetune.render_example; the whole of it is described at
 * the top of chat.c): [BOS] "<|im_start|>system\n" SYSTEM "<|im_end|>\n" (only if SYSTEM
 * is non-empty) "<|im_start|>user\n<tools>" TOOLS "</tools>". */
#ifndef NEEDLE_AGENT_PROMPT_H
#define NEEDLE_AGENT_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* The tools array as the model was trained on it (Python-compact JSON, OpenAI-style
 * {"type":"function","function":{...}} entries unwrapped), malloc'd into *out. */
int prompt_canonical_tools(const char *tools_json, char **out, size_t *out_len);

/* Encodes text (with the dummy prefix when `dummy`) into a malloc'd id array. */
int prompt_encode_alloc(const tokenizer *tok, const char *text, size_t len, int dummy,
                        int32_t **ids, size_t *n);

/* The grammar of a canonical tools array; with one tool it admits exactly one call. */
int prompt_compile_tools(const char *tools, size_t len, grammar **out);

/* [BOS] + the static prefix of system facts and tools, as token ids (malloc'd). */
int prompt_prefix_ids(const struct needle_model *m, const char *system, const char *tools,
                      size_t tools_len, int32_t **ids, size_t *n_ids);

#endif
