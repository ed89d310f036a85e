/* Fine-tuning data -> token ids and loss masks, exactly as the official fine-tuner of
 * cactus-needle 3.2.8 makes them (model/finetune.py: read_examples, from_chat,
 * render_example, _encode, fit_max_len).
 *
 * A data file is JSON lines. A line is either an example {query, tools, answers |
 * function_calls, reasoning?, system?} or a single-turn chat-format line ({messages:
 * [system?, user, assistant with tool_calls], tools: OpenAI-form}), which is converted to
 * an example; blank lines are ignored, other chat lines (several turns, no assistant) are
 * skipped and reported. An example is rendered with the training template:
 *
 *   prompt = ["<|im_start|>system\n" SYSTEM "<|im_end|>\n"]  (when SYSTEM is not empty)
 *            "<|im_start|>user\n<tools>" TOOLS "</tools>\n" QUERY "<|im_end|>\n"
 *            "<|im_start|>assistant\n"
 *   target = ["<think>\n" REASONING "\n</think>\n"]  (when REASONING is not empty)
 *            "<tool_call>" ANSWERS "</tool_call><|im_end|>"
 *
 * TOOLS and ANSWERS as Python's json.dumps(..., separators=(",", ":"), ensure_ascii=False)
 * writes them (or verbatim when the line gives them as strings); SYSTEM and REASONING
 * stripped of Python whitespace. Prompt and target are tokenized separately; the ids are
 * BOS + prompt + target + EOS and the loss mask is 1 on the target and the EOS only. All
 * examples share one length, the smallest power of two from 128 that holds the longest,
 * capped at max_len; longer examples are cut there (as the official does: reported here).
 *
 * What the official fine-tuner does not check is reported as a warning with the line
 * number and the example kept (as it trains on it): a call naming a tool the line does
 * not declare, calls the tools' schemas do not admit (the engine's grammar), an example
 * longer than max_len. A line that is not JSON or not an object, or whose fields have
 * types the template cannot render (where the official code raises), is an error. */
#ifndef NEEDLE_TRAIN_FINETUNE_DATA_H
#define NEEDLE_TRAIN_FINETUNE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "needle.h"

#define FT_MIN_BUCKET 128u

/* One rendered line (malloc'd strings). */
typedef struct ft_rendered {
    char *prompt, *target;
    char *tools, *answers; /* the JSON as rendered (for the checks) */
} ft_rendered;

/* Renders one line (len bytes, without its line break). Returns 1 with *out filled, 0
 * for a line that is skipped (blank, or chat format that is not one user turn answered
 * by one assistant turn: *why says which), or a negative status with the reason in
 * `why` (cap bytes). */
int ft_render_line(const char *line, size_t len, ft_rendered *out, char *why, size_t cap);
void ft_rendered_free(ft_rendered *r);

typedef struct ft_example {
    uint32_t line;     /* 1-based line in the file */
    int32_t *ids;      /* BOS + prompt + target + EOS, not cut */
    uint32_t n, n_prompt; /* all ids; the prompt's (BOS excluded) */
} ft_example;

typedef struct ft_data {
    ft_example *ex;
    uint32_t n;
    uint32_t seq_len;  /* the shared length (fit_max_len) */
    uint32_t skipped;  /* lines neither examples nor single-turn chat */
    uint32_t warnings; /* reports of severity FT_WARNING */
} ft_data;

enum { FT_WARNING = 1, FT_SKIPPED = 2, FT_ERROR = 3 };
/* Called for every report: line (1-based), severity, message. */
typedef void (*ft_report_fn)(void *user, uint32_t line, int severity, const char *msg);

/* Reads a whole data file (text, len bytes) with the model's tokenizer. max_len >= 2.
 * Returns 0, or a negative status after reporting the failing line as FT_ERROR (the
 * needle_last_error message says which line). */
int ft_data_load(const needle_model *m, const char *text, size_t len, uint32_t max_len, ft_report_fn report,
                 void *user, ft_data *out);
void ft_data_free(ft_data *d);

/* Row i as the official _encode returns it: seq_len ids (cut, then PAD) and its mask. */
void ft_data_row(const ft_data *d, uint32_t i, int32_t *ids, uint8_t *mask);

#endif
