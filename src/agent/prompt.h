/* The prompt template, the whole of it in this one place (spec §7): the tools as the
 * model was trained on them, their grammar, the static prefix that set_tools caches, the
 * turns, and the 3.x client's date fact. Public: needle_render_prompt and
 * needle_system_with_date (src/api/prompt_api.c) render with these.
 *
 * Template: cactus-needle 2.0.15, finetune.render_example. A conversation is
 *   [BOS] "<|im_start|>system\n" SYSTEM "<|im_end|>\n"        (only if SYSTEM is non-empty)
 *         "<|im_start|>user\n<tools>" TOOLS "</tools>"         <- static prefix, cached
 *         "\n" QUERY "<|im_end|>\n<|im_start|>assistant\n"     <- first turn
 *   assistant: "▁" ["<think>\n" REASONING "\n</think>\n"] "<tool_call>" CALLS "</tool_call><|im_end|>"
 * and, our choice where the package is silent (spec §8.6), later turns continue with
 *   "\n<|im_start|>user\n<tool_result>" RESULT "</tool_result><|im_end|>\n<|im_start|>assistant\n"
 *   "\n<|im_start|>user\n" QUERY "<|im_end|>\n<|im_start|>assistant\n"
 * Every piece after the first starts right after a marker, and markers split the text
 * into independently encoded segments, so encoding piece by piece (without the dummy
 * prefix) gives exactly the ids of encoding the whole conversation at once. The
 * assistant's answer is made of marker ids and the call array (agent/chat.c). */
#ifndef NEEDLE_AGENT_PROMPT_H
#define NEEDLE_AGENT_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/strbuf.h"

/* The tools array as the model was trained on it (Python-compact JSON, OpenAI-style
 * {"type":"function","function":{...}} entries unwrapped), malloc'd into *out. */
int prompt_canonical_tools(const char *tools_json, char **out, size_t *out_len);

/* Encodes text (with the dummy prefix when `dummy`) into a malloc'd id array. */
int prompt_encode_alloc(const tokenizer *tok, const char *text, size_t len, int dummy,
                        int32_t **ids, size_t *n);

/* The grammar of a canonical tools array; with one tool it admits exactly one call. */
int prompt_compile_tools(const char *tools, size_t len, grammar **out);

/* The static prefix of system facts and the canonical tools array, as text (no BOS). */
void prompt_prefix_text(strbuf *out, const char *system, const char *tools, size_t tools_len);

/* [BOS] + the static prefix of system facts and tools, as token ids (malloc'd). */
int prompt_prefix_ids(const struct needle_model *m, const char *system, const char *tools,
                      size_t tools_len, int32_t **ids, size_t *n_ids);

/* Which turn a text is: the conversation's first query (right after the prefix), a later
 * query, or a tool's result (re-serialized when it is JSON, as the training data is). */
typedef enum prompt_turn { PROMPT_FIRST_QUERY, PROMPT_QUERY, PROMPT_TOOL_RESULT } prompt_turn;

/* Appends the turn text that precedes the assistant's answer; 0 or OUT_OF_MEMORY. */
int prompt_render_turn(strbuf *out, const char *text, prompt_turn kind);

/* A local date and time (the weekday is computed from the date). */
typedef struct prompt_time {
    int32_t year, month, day, hour, minute;
} prompt_time;

/* The system facts as cactus-needle 3.x's client sends them with auto_date (3.2.8,
 * _with_date_fact; its rule is the definition): `system` unchanged when it already gives
 * a date: a `date:` key of its own (case-sensitive; not after an ASCII letter, so not the
 * tail of `update:`) or a YYYY-MM-DD stamp (Python's \d: any Unicode decimal digit);
 * the fact "date: YYYY-MM-DD Ddd HH:MM" alone when system is blank (Python's
 * str.isspace); system unchanged when it is a JSON object (its first non-space character
 * is "{"); else the fact, "; " and system. The weekday is English, whatever the locale.
 * NEEDLE_ERR_INVALID_ARGUMENT for a time out of range (years 1000-9999). */
int prompt_system_with_date(strbuf *out, const char *system, const prompt_time *when);

#endif
