/* eval.h: `needle eval`, the dataset evaluation command (tools/eval.c). */
#ifndef NEEDLE_TOOLS_EVAL_H
#define NEEDLE_TOOLS_EVAL_H

/* needle eval --weights FILE [options] DATA.jsonl; argv[1] is "eval". Returns the exit
 * status: 0 done, 1 engine or data error (message on stderr), 2 bad usage. */
int cmd_eval(int argc, char **argv);

#endif
