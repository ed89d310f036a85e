/* eval_data.h: a dataset file in the fine-tuning format (spec §7), read whole and
 * validated line by line, for the commands that score the engine on it (`needle eval`,
 * `needle calibrate`). */
#ifndef NEEDLE_TOOLS_EVAL_DATA_H
#define NEEDLE_TOOLS_EVAL_DATA_H

#include <stddef.h>

#include "eval_score.h"

typedef struct eval_dataset {
    eval_example *ex; /* the examples, in file order */
    long *line;       /* ex[i]'s line in the file, from 1 */
    char **text;      /* with keep_text: each example's line as read; else NULL */
    size_t n, cap;
    long skipped; /* malformed lines skipped (skip_bad) */
} eval_dataset;

/* Reads up to `limit` examples of `path` (0: all), blank lines ignored. A malformed line
 * (or one holding a NUL byte) is reported as "needle: PATH:LINE: reason" on stderr and
 * skipped with skip_bad, else ends the read. Returns 0, or 1 after printing why (the
 * dataset then empty). Zero examples is not an error here: each caller says what it
 * needs. */
int eval_dataset_read(const char *path, long limit, int skip_bad, int keep_text, eval_dataset *d);
void eval_dataset_free(eval_dataset *d);

#endif
