/* chat_input.c: see chat_input.h. libedit's own API (histedit.h) rather than its readline
 * emulation: the prompt goes to stderr without global state, and a history lives and dies
 * with the reader. */
#include "chat_input.h"
#include "compat.h"

#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef NEEDLE_HAVE_LIBEDIT
#include <histedit.h>
#include <langinfo.h>
#endif

struct chat_input {
    FILE *in;
    char *line; /* getline's buffer, or a copy of libedit's line */
    size_t cap;
#ifdef NEEDLE_HAVE_LIBEDIT
    EditLine *el; /* NULL: plain getline */
    History *hist;
    const char *prompt;
#endif
};

#ifdef NEEDLE_HAVE_LIBEDIT
static char *show_prompt(EditLine *el) {
    chat_input *ci = NULL;
    el_get(el, EL_CLIENTDATA, &ci);
    return (char *)(ci && ci->prompt ? ci->prompt : "");
}

/* libedit decodes what is typed in the locale's character set; queries are UTF-8, so a
 * locale that is not (the "C" of a bare container) gives way to C.UTF-8 where it exists.
 * Only LC_CTYPE changes: nothing in the tool or the library depends on it. */
static void utf8_ctype(void) {
    const char *loc = setlocale(LC_CTYPE, "");
    const char *cs = loc ? nl_langinfo(CODESET) : "";
    if (strcmp(cs, "UTF-8") && strcmp(cs, "utf8")) setlocale(LC_CTYPE, "C.UTF-8");
}

static int open_editor(chat_input *ci) {
    HistEvent ev;
    utf8_ctype();
    if (!(ci->hist = history_init())) return 0;
    history(ci->hist, &ev, H_SETSIZE, 1000);
    history(ci->hist, &ev, H_SETUNIQUE, 1);
    if (!(ci->el = el_init("needle", ci->in, stderr, stderr))) return 0;
    el_set(ci->el, EL_CLIENTDATA, ci);
    el_set(ci->el, EL_PROMPT, show_prompt);
    el_set(ci->el, EL_EDITOR, "emacs");
    el_set(ci->el, EL_HIST, history, ci->hist);
    el_set(ci->el, EL_SIGNAL, 1); /* the terminal is restored on Ctrl-C or Ctrl-Z */
    el_source(ci->el, NULL);      /* the user's ~/.editrc, if any */
    return 1;
}
#endif

chat_input *chat_input_open(FILE *in) {
    chat_input *ci = calloc(1, sizeof *ci);
    if (!ci) return NULL;
    ci->in = in;
#ifdef NEEDLE_HAVE_LIBEDIT
    if (isatty(fileno(in)) && isatty(fileno(stderr)) && !open_editor(ci)) {
        if (ci->el) el_end(ci->el);
        if (ci->hist) history_end(ci->hist);
        ci->el = NULL;
        ci->hist = NULL;
    }
#endif
    return ci;
}

const char *chat_input_read(chat_input *ci, const char *prompt, size_t *len) {
#ifdef NEEDLE_HAVE_LIBEDIT
    if (ci->el) {
        int n = 0;
        ci->prompt = prompt;
        const char *text = el_gets(ci->el, &n);
        if (!text || n <= 0) return NULL;
        size_t k = (size_t)n;
        if (k + 1 > ci->cap) {
            char *p = realloc(ci->line, k + 1);
            if (!p) return NULL;
            ci->line = p;
            ci->cap = k + 1;
        }
        memcpy(ci->line, text, k);
        ci->line[k] = 0;
        while (k && (ci->line[k - 1] == '\n' || ci->line[k - 1] == '\r')) ci->line[--k] = 0;
        *len = k;
        return ci->line;
    }
#endif
    fputs(prompt, stderr);
    fflush(stderr);
    ssize_t got = getline(&ci->line, &ci->cap, ci->in);
    if (got < 0) return NULL;
    size_t k = (size_t)got;
    while (k && (ci->line[k - 1] == '\n' || ci->line[k - 1] == '\r')) ci->line[--k] = 0;
    *len = k;
    return ci->line;
}

void chat_input_remember(chat_input *ci, const char *line) {
#ifdef NEEDLE_HAVE_LIBEDIT
    HistEvent ev;
    if (ci->el && line[0]) history(ci->hist, &ev, H_ENTER, line);
#else
    (void)ci;
    (void)line;
#endif
}

void chat_input_close(chat_input *ci) {
    if (!ci) return;
#ifdef NEEDLE_HAVE_LIBEDIT
    if (ci->el) el_end(ci->el);
    if (ci->hist) history_end(ci->hist);
#endif
    free(ci->line);
    free(ci);
}

const char *chat_input_kind(void) {
#ifdef NEEDLE_HAVE_LIBEDIT
    return "libedit (on a terminal; plain lines from pipes and files)";
#else
    return "plain lines (built without libedit: no line editing; install libedit-dev and rebuild)";
#endif
}
