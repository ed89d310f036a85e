/* chat_input.c: see chat_input.h. libedit's own API (histedit.h) rather than its readline
 * emulation: the prompt goes to stderr without global state, and a history lives and dies
 * with the reader. */
#include "chat_input.h"

#include <langinfo.h>
#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef NEEDLE_HAVE_LIBEDIT
#include <histedit.h>
#ifdef NEEDLE_LIBEDIT_SONAME
#include <dlfcn.h>
#endif
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
/* The libedit functions chat calls. With NEEDLE_LIBEDIT_SONAME (CMakeLists.txt) the library
 * is loaded the first time a terminal needs it, so that no other command maps it and its
 * dependencies; without it, the linked functions. */
typedef struct editline_api {
    EditLine *(*el_init)(const char *, FILE *, FILE *, FILE *);
    int (*el_set)(EditLine *, int, ...);
    int (*el_get)(EditLine *, int, ...);
    int (*el_source)(EditLine *, const char *);
    const char *(*el_gets)(EditLine *, int *);
    void (*el_end)(EditLine *);
    History *(*history_init)(void);
    int (*history)(History *, HistEvent *, int, ...);
    void (*history_end)(History *);
} editline_api;

static editline_api editline;

#ifdef NEEDLE_LIBEDIT_SONAME
/* dlsym's object pointer into a function pointer without the cast ISO C leaves undefined
 * (POSIX guarantees the representation). */
static int bind_symbol(void *lib, const char *name, void *fn_ptr, size_t size) {
    void *sym = dlsym(lib, name);
    if (!sym || size != sizeof sym) return 0;
    memcpy(fn_ptr, &sym, size);
    return 1;
}
#define BIND(lib, f) bind_symbol(lib, #f, &editline.f, sizeof editline.f)

/* Whether libedit is there to use (loaded once; kept for the process's life). */
static int load_editline(void) {
    static int state; /* 0 not tried, 1 loaded, -1 unavailable */
    if (state) return state > 0;
    state = -1;
    void *lib = dlopen(NEEDLE_LIBEDIT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    if (!(BIND(lib, el_init) && BIND(lib, el_set) && BIND(lib, el_get) &&
          BIND(lib, el_source) && BIND(lib, el_gets) && BIND(lib, el_end) &&
          BIND(lib, history_init) && BIND(lib, history) && BIND(lib, history_end))) {
        dlclose(lib);
        memset(&editline, 0, sizeof editline);
        return 0;
    }
    state = 1;
    return 1;
}
#else
static int load_editline(void) {
    editline = (editline_api){el_init,      el_set,  el_get,     el_source, el_gets,
                              el_end,       history_init, history, history_end};
    return 1;
}
#endif

static char *show_prompt(EditLine *el) {
    chat_input *ci = NULL;
    editline.el_get(el, EL_CLIENTDATA, &ci);
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
    if (!load_editline()) return 0;
    utf8_ctype();
    if (!(ci->hist = editline.history_init())) return 0;
    editline.history(ci->hist, &ev, H_SETSIZE, 1000);
    editline.history(ci->hist, &ev, H_SETUNIQUE, 1);
    if (!(ci->el = editline.el_init("needle", ci->in, stderr, stderr))) return 0;
    editline.el_set(ci->el, EL_CLIENTDATA, ci);
    editline.el_set(ci->el, EL_PROMPT, show_prompt);
    editline.el_set(ci->el, EL_EDITOR, "emacs");
    editline.el_set(ci->el, EL_HIST, editline.history, ci->hist);
    editline.el_set(ci->el, EL_SIGNAL, 1); /* the terminal is restored on Ctrl-C or Ctrl-Z */
    editline.el_source(ci->el, NULL);      /* the user's ~/.editrc, if any */
    return 1;
}
#endif

chat_input *chat_input_open(FILE *in) {
    chat_input *ci = calloc(1, sizeof *ci);
    if (!ci) return NULL;
    ci->in = in;
#ifdef NEEDLE_HAVE_LIBEDIT
    if (isatty(fileno(in)) && isatty(fileno(stderr)) && !open_editor(ci)) {
        if (ci->el) editline.el_end(ci->el);
        if (ci->hist) editline.history_end(ci->hist);
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
        const char *text = editline.el_gets(ci->el, &n);
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
    if (ci->el && line[0]) editline.history(ci->hist, &ev, H_ENTER, line);
#else
    (void)ci;
    (void)line;
#endif
}

void chat_input_close(chat_input *ci) {
    if (!ci) return;
#ifdef NEEDLE_HAVE_LIBEDIT
    if (ci->el) editline.el_end(ci->el);
    if (ci->hist) editline.history_end(ci->hist);
#endif
    free(ci->line);
    free(ci);
}

const char *chat_input_kind(void) {
#if defined(NEEDLE_LIBEDIT_SONAME)
    return "libedit (" NEEDLE_LIBEDIT_SONAME ", loaded on a terminal; plain lines from pipes and "
           "files, or when it cannot be loaded)";
#elif defined(NEEDLE_HAVE_LIBEDIT)
    return "libedit (on a terminal; plain lines from pipes and files)";
#else
    return "plain lines (built without libedit: no line editing; install libedit-dev and rebuild)";
#endif
}
