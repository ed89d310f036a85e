/* chat_input.h: the line reader of `needle chat`. On a terminal, and when the tool was
 * built with libedit (BSD editline, CMake finds it through pkg-config), lines are edited
 * (cursor keys, Ctrl-A/E, ...) and earlier lines of the session come back with the up
 * arrow or Ctrl-P; otherwise (a pipe, a file, a build without libedit) lines are read
 * whole with getline, of any length. Prompts go to stderr: stdout carries the envelopes. */
#ifndef NEEDLE_TOOLS_CHAT_INPUT_H
#define NEEDLE_TOOLS_CHAT_INPUT_H

#include <stdio.h>

typedef struct chat_input chat_input;

/* A reader of `in` (line editing when in and stderr are terminals and libedit is built
 * in). NULL when out of memory. */
chat_input *chat_input_open(FILE *in);
/* Shows prompt and reads one line, its newline removed. Returns the line (owned by the
 * reader, valid until the next call) and its length in *len; NULL at end of input or on a
 * read error. */
const char *chat_input_read(chat_input *ci, const char *prompt, size_t *len);
/* Remembers line in the session's history (edited readers; a no-op otherwise). */
void chat_input_remember(chat_input *ci, const char *line);
/* NULL is a no-op; restores the terminal. */
void chat_input_close(chat_input *ci);
/* How chat reads lines in this build, for `needle --version`. */
const char *chat_input_kind(void);

#endif
