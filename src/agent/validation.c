/* The envelope's "validation" (see validation.h): table-driven grounding of argument values
 * in the input, and the negated-request rule. */
#include "agent/validation.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "needle.h"
#include "util/error.h"
#include "util/json_escape.h"
#include "util/utf8.h"

/* ---------------------------------------------------------------------------------------
 * Words: the normalized text, one NUL-terminated word after another */

typedef struct words {
    char *buf;            /* the words, each NUL-terminated */
    size_t len, cap;
    size_t *start;        /* offset of word i in buf */
    uint8_t *clause;      /* word i begins a clause (after , ; : ! ? newline or a full stop) */
    size_t n, n_cap;
    int oom;
} words;

static void words_free(words *w) {
    free(w->buf);
    free(w->start);
    free(w->clause);
    memset(w, 0, sizeof *w);
}

static void put_byte(words *w, char ch) {
    if (w->len + 1 >= w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        char *b = realloc(w->buf, cap);
        if (!b) {
            w->oom = 1;
            return;
        }
        w->buf = b;
        w->cap = cap;
    }
    w->buf[w->len++] = ch;
}

static void begin_word(words *w, int clause) {
    if (w->n == w->n_cap) {
        size_t cap = w->n_cap ? w->n_cap * 2 : 32;
        size_t *s = realloc(w->start, cap * sizeof *s);
        if (s) w->start = s;
        uint8_t *c = realloc(w->clause, cap);
        if (c) w->clause = c;
        if (!s || !c) {
            w->oom = 1;
            return;
        }
        w->n_cap = cap;
    }
    w->start[w->n] = w->len;
    w->clause[w->n] = (uint8_t)clause;
    w->n++;
}

static const char *word_at(const words *w, size_t i) { return w->buf + w->start[i]; }

/* Latin-1 Supplement and Latin Extended-A letters folded to their base letters: ranges of
 * code points and what each folds to (lowercase ASCII). */
static const struct {
    uint32_t lo, hi;
    const char *to;
} FOLD[] = {
    {0xC0, 0xC5, "a"}, {0xC6, 0xC6, "ae"}, {0xC7, 0xC7, "c"}, {0xC8, 0xCB, "e"},
    {0xCC, 0xCF, "i"}, {0xD0, 0xD0, "d"}, {0xD1, 0xD1, "n"}, {0xD2, 0xD6, "o"},
    {0xD8, 0xD8, "o"}, {0xD9, 0xDC, "u"}, {0xDD, 0xDD, "y"}, {0xDE, 0xDE, "th"},
    {0xDF, 0xDF, "ss"}, {0xE0, 0xE5, "a"}, {0xE6, 0xE6, "ae"}, {0xE7, 0xE7, "c"},
    {0xE8, 0xEB, "e"}, {0xEC, 0xEF, "i"}, {0xF0, 0xF0, "d"}, {0xF1, 0xF1, "n"},
    {0xF2, 0xF6, "o"}, {0xF8, 0xF8, "o"}, {0xF9, 0xFC, "u"}, {0xFD, 0xFD, "y"},
    {0xFE, 0xFE, "th"}, {0xFF, 0xFF, "y"}, {0x100, 0x105, "a"}, {0x106, 0x10D, "c"},
    {0x10E, 0x111, "d"}, {0x112, 0x11B, "e"}, {0x11C, 0x123, "g"}, {0x124, 0x127, "h"},
    {0x128, 0x131, "i"}, {0x132, 0x133, "ij"}, {0x134, 0x135, "j"}, {0x136, 0x138, "k"},
    {0x139, 0x142, "l"}, {0x143, 0x14B, "n"}, {0x14C, 0x151, "o"}, {0x152, 0x153, "oe"},
    {0x154, 0x159, "r"}, {0x15A, 0x161, "s"}, {0x162, 0x167, "t"}, {0x168, 0x173, "u"},
    {0x174, 0x175, "w"}, {0x176, 0x178, "y"}, {0x179, 0x17E, "z"}, {0x17F, 0x17F, "s"},
};

static const char *fold_latin(uint32_t cp) {
    for (size_t i = 0; i < sizeof FOLD / sizeof FOLD[0]; i++)
        if (cp >= FOLD[i].lo && cp <= FOLD[i].hi) return FOLD[i].to;
    return NULL;
}

/* Abbreviations whose full stop does not end a clause ("Dr. Patel"). */
static const char *const ABBREVIATIONS[] = {"dr", "mr", "mrs", "ms", "st", "prof", "jr", "sr",
                                            "vs", "etc", "no", "mt", "ft", "approx"};

static int is_abbreviation(const words *w) {
    if (!w->n || w->len == 0 || w->buf[w->len - 1] == 0) return 0;
    const char *last = w->buf + w->start[w->n - 1];
    size_t n = w->len - w->start[w->n - 1];
    if (n == 1) return 1; /* an initial: "J. Smith" */
    for (size_t i = 0; i < sizeof ABBREVIATIONS / sizeof *ABBREVIATIONS; i++)
        if (strlen(ABBREVIATIONS[i]) == n && !memcmp(ABBREVIATIONS[i], last, n)) return 1;
    return 0;
}

static void split_words(const char *text, words *w) {
    memset(w, 0, sizeof *w);
    if (!text) return;
    const uint8_t *s = (const uint8_t *)text;
    size_t n = strlen(text), i = 0;
    int in_word = 0, clause = 1;
    while (i < n) {
        uint32_t cp = 0;
        size_t bad = 0;
        int k = util_utf8_next(s + i, n - i, &cp, &bad);
        if (k <= 0) { /* invalid byte: a word break */
            i++;
            if (in_word) put_byte(w, 0);
            in_word = 0;
            continue;
        }
        const uint8_t *raw = s + i;
        i += (size_t)k;
        char one[2] = {0, 0};
        const char *add = NULL;
        size_t add_len = 0;
        if (cp < 0x80 && isalnum((int)cp)) {
            one[0] = (char)tolower((int)cp);
            add = one;
            add_len = 1;
        } else if (cp == '\'' || cp == 0x2019 || cp == 0x2018) {
            continue; /* "don't" -> "dont", "Bob's" -> "bobs" */
        } else if (cp >= 0xC0 && cp <= 0x17F && (add = fold_latin(cp))) {
            add_len = strlen(add);
        } else if (cp >= 0x250 && !(cp >= 0x2000 && cp <= 0x2BFF) && !(cp >= 0x3000 && cp <= 0x303F) &&
                   !(cp >= 0xFE30 && cp <= 0xFE4F) && !(cp >= 0xFF00 && cp <= 0xFF0F)) {
            /* other scripts: letters kept as typed (punctuation and symbols break words) */
            add = (const char *)raw;
            add_len = (size_t)k;
        }
        if (add) {
            if (!in_word) begin_word(w, clause);
            for (size_t j = 0; j < add_len; j++) put_byte(w, add[j]);
            in_word = 1;
            clause = 0;
            continue;
        }
        int ends_clause = cp == ',' || cp == ';' || cp == ':' || cp == '!' || cp == '?' ||
                          cp == '\n' || cp == 0x3002 || cp == 0xFF0C;
        if (cp == '.' && !(i < n && isdigit(s[i])) && !(in_word && is_abbreviation(w)))
            ends_clause = 1;
        if (in_word) put_byte(w, 0);
        in_word = 0;
        if (ends_clause) clause = 1;
    }
    if (in_word) put_byte(w, 0);
}

static int word_is(const words *w, size_t i, const char *s) {
    return i < w->n && !strcmp(word_at(w, i), s);
}

static int in_list(const char *word, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(word, list[i])) return 1;
    return 0;
}
#define IN_LIST(word, list) in_list((word), (list), sizeof(list) / sizeof *(list))

/* A crude stem for word forms of enum values: "vacuuming" ~ "vacuum", "rooms" ~ "room". */
static size_t stem_len(const char *s) {
    size_t n = strlen(s);
    if (n > 5 && !strcmp(s + n - 3, "ing")) return n - 3;
    if (n > 4 && !strcmp(s + n - 2, "ed")) return n - 2;
    if (n > 4 && !strcmp(s + n - 2, "es")) return n - 2;
    if (n > 3 && s[n - 1] == 's' && s[n - 2] != 's') return n - 1;
    return n;
}

static int same_word(const char *a, const char *b, int stemmed) {
    if (!strcmp(a, b)) return 1;
    if (!stemmed) return 0;
    size_t la = stem_len(a), lb = stem_len(b);
    return la == lb && la >= 3 && !memcmp(a, b, la);
}

/* Whether the words of `needle` appear in `hay` as a contiguous run. */
static int contains_run(const words *hay, const words *needle, int stemmed) {
    if (!needle->n) return 1;
    for (size_t i = 0; i + needle->n <= hay->n; i++) {
        size_t j = 0;
        while (j < needle->n && same_word(word_at(hay, i + j), word_at(needle, j), stemmed)) j++;
        if (j == needle->n) return 1;
    }
    return 0;
}

/* Whether the words of `text` are written in the input. A value with no word in it
 * ("?!", ",") copies nothing: it is never supported (punctuation is in every JSON result). */
static int contains_text(const words *hay, const char *text, int stemmed) {
    words v;
    split_words(text, &v);
    int found = !v.oom && v.n && contains_run(hay, &v, stemmed);
    words_free(&v);
    return found;
}

/* ---------------------------------------------------------------------------------------
 * Numbers the input writes */

typedef struct numbers {
    double *v;
    size_t n, cap;
} numbers;

static void add_number(numbers *ns, double v) {
    if (!isfinite(v)) return;
    for (size_t i = 0; i < ns->n; i++)
        if (ns->v[i] == v) return;
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? ns->cap * 2 : 32;
        double *p = realloc(ns->v, cap * sizeof *p);
        if (!p) return;
        ns->v = p;
        ns->cap = cap;
    }
    ns->v[ns->n++] = v;
}

static int has_number(const numbers *ns, double v) {
    for (size_t i = 0; i < ns->n; i++)
        if (fabs(ns->v[i] - v) <= 1e-9 * fmax(1.0, fabs(v))) return 1;
    return 0;
}

enum { DIM_NONE, DIM_TIME, DIM_LENGTH, DIM_MASS, DIM_VOLUME, DIM_PERCENT, DIM_PM, DIM_AM };

/* Unit words: a quantity written in one is also written in every other unit of its
 * dimension (the canonical units, factor != 0, are the ones converted to). */
static const struct {
    const char *word;
    int dim;
    double factor;   /* in the dimension's base unit */
    int canonical;   /* converted to */
} UNITS[] = {
    {"second", DIM_TIME, 1, 1}, {"seconds", DIM_TIME, 1, 0}, {"sec", DIM_TIME, 1, 0},
    {"secs", DIM_TIME, 1, 0}, {"s", DIM_TIME, 1, 0}, {"minute", DIM_TIME, 60, 1},
    {"minutes", DIM_TIME, 60, 0}, {"min", DIM_TIME, 60, 0}, {"mins", DIM_TIME, 60, 0},
    {"hour", DIM_TIME, 3600, 1}, {"hours", DIM_TIME, 3600, 0}, {"hr", DIM_TIME, 3600, 0},
    {"hrs", DIM_TIME, 3600, 0}, {"h", DIM_TIME, 3600, 0}, {"day", DIM_TIME, 86400, 1},
    {"days", DIM_TIME, 86400, 0}, {"week", DIM_TIME, 604800, 1}, {"weeks", DIM_TIME, 604800, 0},
    {"ms", DIM_TIME, 0.001, 1}, {"millisecond", DIM_TIME, 0.001, 0},
    {"milliseconds", DIM_TIME, 0.001, 0},
    {"mm", DIM_LENGTH, 0.001, 1}, {"cm", DIM_LENGTH, 0.01, 1}, {"m", DIM_LENGTH, 1, 1},
    {"meter", DIM_LENGTH, 1, 0}, {"meters", DIM_LENGTH, 1, 0}, {"metre", DIM_LENGTH, 1, 0},
    {"metres", DIM_LENGTH, 1, 0}, {"km", DIM_LENGTH, 1000, 1}, {"kilometer", DIM_LENGTH, 1000, 0},
    {"kilometers", DIM_LENGTH, 1000, 0}, {"kilometres", DIM_LENGTH, 1000, 0},
    {"mg", DIM_MASS, 0.001, 1}, {"g", DIM_MASS, 1, 1}, {"gram", DIM_MASS, 1, 0},
    {"grams", DIM_MASS, 1, 0}, {"kg", DIM_MASS, 1000, 1}, {"kilo", DIM_MASS, 1000, 0},
    {"kilos", DIM_MASS, 1000, 0}, {"kilogram", DIM_MASS, 1000, 0},
    {"kilograms", DIM_MASS, 1000, 0},
    {"ml", DIM_VOLUME, 1, 1}, {"milliliter", DIM_VOLUME, 1, 0}, {"milliliters", DIM_VOLUME, 1, 0},
    {"millilitre", DIM_VOLUME, 1, 0}, {"millilitres", DIM_VOLUME, 1, 0}, {"l", DIM_VOLUME, 1000, 1},
    {"liter", DIM_VOLUME, 1000, 0}, {"liters", DIM_VOLUME, 1000, 0}, {"litre", DIM_VOLUME, 1000, 0},
    {"litres", DIM_VOLUME, 1000, 0},
    {"percent", DIM_PERCENT, 1, 0}, {"per", DIM_PERCENT, 1, 0}, {"pm", DIM_PM, 1, 0},
    {"am", DIM_AM, 1, 0},
};

static int unit_of(const char *word) {
    for (size_t i = 0; i < sizeof UNITS / sizeof *UNITS; i++)
        if (!strcmp(word, UNITS[i].word)) return (int)i;
    return -1;
}

/* value written with unit u: every form a tool may take it in */
static void add_quantity(numbers *ns, double value, int u) {
    add_number(ns, value);
    if (u < 0) return;
    const int dim = UNITS[u].dim;
    if (dim == DIM_PERCENT) {
        add_number(ns, value / 100.0);
    } else if (dim == DIM_PM) {
        if (value >= 1 && value < 12) add_number(ns, value + 12);
    } else if (dim == DIM_AM) {
        if (value == 12) add_number(ns, 0);
    } else {
        const double base = value * UNITS[u].factor;
        for (size_t i = 0; i < sizeof UNITS / sizeof *UNITS; i++)
            if (UNITS[i].dim == dim && UNITS[i].canonical) add_number(ns, base / UNITS[i].factor);
    }
}

static const char *const SMALL[] = {"zero", "one", "two", "three", "four", "five", "six",
                                    "seven", "eight", "nine", "ten", "eleven", "twelve",
                                    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
                                    "eighteen", "nineteen"};
static const char *const TENS[] = {"twenty", "thirty", "forty", "fifty", "sixty", "seventy",
                                   "eighty", "ninety"};
static const char *const ORDINALS[] = {"zeroth", "first", "second", "third", "fourth", "fifth",
                                       "sixth", "seventh", "eighth", "ninth", "tenth",
                                       "eleventh", "twelfth", "thirteenth", "fourteenth",
                                       "fifteenth", "sixteenth", "seventeenth", "eighteenth",
                                       "nineteenth"};
static const char *const TENS_ORDINAL[] = {"twentieth", "thirtieth"};

/* The value of a number word (units, teens, ordinals), or -1. */
static double small_word(const char *w) {
    for (size_t i = 0; i < sizeof SMALL / sizeof *SMALL; i++)
        if (!strcmp(w, SMALL[i])) return (double)i;
    for (size_t i = 1; i < sizeof ORDINALS / sizeof *ORDINALS; i++)
        if (!strcmp(w, ORDINALS[i])) return (double)i;
    if (!strcmp(w, "noon")) return 12;
    if (!strcmp(w, "midnight")) return 0;
    return -1;
}

static double tens_word(const char *w) {
    for (size_t i = 0; i < sizeof TENS / sizeof *TENS; i++)
        if (!strcmp(w, TENS[i])) return 20.0 + 10.0 * (double)i;
    for (size_t i = 0; i < sizeof TENS_ORDINAL / sizeof *TENS_ORDINAL; i++)
        if (!strcmp(w, TENS_ORDINAL[i])) return 20.0 + 10.0 * (double)i;
    return -1;
}

/* Numbers written in words: "twenty five", "one hundred and fifty", "two thousand",
 * "a dozen", "half an hour", "a couple of", each with the unit word after it. */
static void word_numbers(const words *w, numbers *ns) {
    for (size_t i = 0; i < w->n;) {
        const char *t = word_at(w, i);
        double total = 0, group = 0;
        size_t j = i;
        int any = 0;
        for (;;) {
            if (j >= w->n) break;
            const char *x = word_at(w, j);
            double v;
            if ((v = tens_word(x)) >= 0) {
                group += v;
                if (j + 1 < w->n && (v = small_word(word_at(w, j + 1))) >= 0 && v < 10) {
                    group += v;
                    j++;
                }
            } else if ((v = small_word(x)) >= 0) {
                group += v;
            } else if (!strcmp(x, "dozen")) {
                group = (group ? group : 1) * 12;
            } else if (!strcmp(x, "hundred")) {
                group = (group ? group : 1) * 100;
            } else if (!strcmp(x, "thousand")) {
                total += (group ? group : 1) * 1000;
                group = 0;
            } else if (!strcmp(x, "and") && any && j + 1 < w->n &&
                       (small_word(word_at(w, j + 1)) >= 0 || tens_word(word_at(w, j + 1)) >= 0)) {
                j++;
                continue;
            } else {
                break;
            }
            any = 1;
            j++;
        }
        if (any) {
            int u = j < w->n ? unit_of(word_at(w, j)) : -1;
            add_quantity(ns, total + group, u);
            i = j;
            continue;
        }
        /* "a"/"an" before a unit or "dozen"/"hundred" is one; "half"/"quarter" a fraction;
         * "a couple (of)" two */
        double frac = !strcmp(t, "half") ? 0.5 : !strcmp(t, "quarter") ? 0.25 : -1;
        if (frac > 0) {
            size_t k = i + 1;
            if (word_is(w, k, "an") || word_is(w, k, "a")) k++;
            if (word_is(w, k, "of") && (word_is(w, k + 1, "an") || word_is(w, k + 1, "a"))) k += 2;
            add_quantity(ns, frac, k < w->n ? unit_of(word_at(w, k)) : -1);
        } else if ((!strcmp(t, "a") || !strcmp(t, "an")) && i + 1 < w->n) {
            int u = unit_of(word_at(w, i + 1));
            if (u >= 0 && UNITS[u].dim != DIM_PM && UNITS[u].dim != DIM_AM) add_quantity(ns, 1, u);
            if (word_is(w, i + 1, "couple")) add_number(ns, 2);
        }
        i++;
    }
}

/* Numbers written in digits: "-3", "1,500", "2.5", "25%", "5pm", "5th", "9:15pm", each with
 * the unit word right after it (attached or after spaces). */
static void digit_numbers(const char *text, numbers *ns) {
    const char *p = text;
    while (*p) {
        if (!isdigit((unsigned char)*p)) {
            p++;
            continue;
        }
        const char *start = p;
        int negative = p > text && p[-1] == '-' &&
                       (p - 1 == text || !isalnum((unsigned char)p[-2]));
        double v = 0;
        while (isdigit((unsigned char)*p)) v = v * 10 + (*p++ - '0');
        /* thousands groups after a lead of 1-3 digits: "1,500", "12,000,000" */
        if (p - start <= 3)
            while (p[0] == ',' && isdigit((unsigned char)p[1]) && isdigit((unsigned char)p[2]) &&
                   isdigit((unsigned char)p[3]) && !isdigit((unsigned char)p[4])) {
                v = v * 1000 + (p[1] - '0') * 100 + (p[2] - '0') * 10 + (p[3] - '0');
                p += 4;
            }
        if (p[0] == '.' && isdigit((unsigned char)p[1])) {
            double scale = 0.1;
            p++;
            while (isdigit((unsigned char)*p)) {
                v += (*p++ - '0') * scale;
                scale /= 10;
            }
        }
        if (negative) add_number(ns, -v);
        /* the unit: "%" or a word, attached or after spaces ("p.m." read as "pm") */
        const char *q = p;
        while (*q == ' ') q++;
        int u = -1;
        if (*q == '%') {
            u = unit_of("percent");
        } else {
            char word[16];
            size_t n = 0, m = 0;
            while (n < sizeof word - 1 && (isalpha((unsigned char)q[n]) || q[n] == '.')) {
                if (q[n] != '.') word[m++] = (char)tolower((unsigned char)q[n]);
                n++;
            }
            word[m] = 0;
            if (!isalpha((unsigned char)q[n])) u = unit_of(word);
        }
        add_quantity(ns, v, u);
    }
}

/* "9:15pm": the hour is the number before the colon, pm applies to it too */
static void clock_numbers(const char *text, numbers *ns) {
    for (const char *p = strchr(text, ':'); p; p = strchr(p + 1, ':')) {
        if (p == text || !isdigit((unsigned char)p[-1]) || !isdigit((unsigned char)p[1]) ||
            !isdigit((unsigned char)p[2]))
            continue;
        const char *h = p;
        while (h > text && isdigit((unsigned char)h[-1])) h--;
        double hour = strtod(h, NULL);
        const char *q = p + 3;
        while (*q == ' ') q++;
        if ((tolower((unsigned char)q[0]) == 'p') && (tolower((unsigned char)q[1]) == 'm' ||
                                                      (q[1] == '.' && tolower((unsigned char)q[2]) == 'm')))
            add_quantity(ns, hour, unit_of("pm"));
    }
}

/* ---------------------------------------------------------------------------------------
 * Enum synonyms: a value is supported when the input says it in one of these words */

static const struct {
    const char *value;
    const char *synonyms; /* '|'-separated phrases */
} SYNONYMS[] = {
    {"on", "turn on|switch on|power on|enable|activate|start"},
    {"off", "turn off|switch off|shut off|power off|disable|deactivate|kill"},
    {"start", "begin|run|launch|kick off|go"},
    {"stop", "halt|end|finish|cancel|quit|turn off"},
    {"open", "raise|lift|pull up|roll up"},
    {"close", "shut|lower|draw|pull down|roll down"},
    {"dim", "lower|darken|dimmer|dimmed"},
    {"dock", "home|charge|charging|base"},
    {"play", "put on|listen|start"},
    {"pause", "hold|freeze"},
    {"resume", "continue|unpause|keep playing"},
    {"next", "skip|forward"},
    {"previous", "back|last|rewind|go back"},
    {"up", "raise|increase|louder|higher|turn up|crank"},
    {"down", "lower|decrease|quieter|softer|turn down|reduce"},
    {"increase", "raise|up|louder|higher|more|boost|turn up"},
    {"decrease", "lower|down|quieter|less|reduce|turn down"},
    {"high", "max|maximum|full|fast|strong|urgent|important"},
    {"low", "min|minimum|slow|gentle|weak"},
    {"medium", "mid|moderate|normal"},
    {"enable", "turn on|switch on|activate|on"},
    {"disable", "turn off|switch off|deactivate|off"},
    {"add", "put|append|insert|include"},
    {"remove", "delete|drop|take off|take out"},
    {"create", "new|make|add|set up"},
    {"delete", "remove|erase|cancel|get rid of"},
    {"heat", "warm|warmer|heating|hot|hotter"},
    {"cool", "cold|colder|cooling|chill"},
    {"celsius", "c|centigrade"},
    {"fahrenheit", "f"},
    {"mute", "silence|quiet"},
    {"lock", "secure"},
    {"unlock", "open"},
    {"monday", "mon"}, {"tuesday", "tue|tues"}, {"wednesday", "wed"}, {"thursday", "thu|thurs"},
    {"friday", "fri"}, {"saturday", "sat"}, {"sunday", "sun"},
};

static int synonym_appears(const words *input, const char *value) {
    for (size_t i = 0; i < sizeof SYNONYMS / sizeof *SYNONYMS; i++) {
        if (strcmp(SYNONYMS[i].value, value)) continue;
        const char *s = SYNONYMS[i].synonyms;
        while (*s) {
            const char *bar = strchr(s, '|');
            size_t n = bar ? (size_t)(bar - s) : strlen(s);
            char phrase[48];
            if (n < sizeof phrase) {
                memcpy(phrase, s, n);
                phrase[n] = 0;
                if (contains_text(input, phrase, 1)) return 1;
            }
            s += n + (bar ? 1 : 0);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Arguments against their schemas */

typedef struct grounding {
    const words *input;
    const numbers *nums;
    const cJSON *root; /* the tool's parameters: where "#/..." refs resolve */
    strbuf *paths;     /* the JSON array's elements so far */
    int n_paths;
} grounding;

static const cJSON *resolve_ref(const cJSON *node, const cJSON *root) {
    for (int hops = 0; hops < 16 && cJSON_IsObject(node); hops++) {
        const char *ref = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(node, "$ref"));
        if (!ref || strncmp(ref, "#/", 2)) return node;
        const cJSON *at = root;
        const char *p = ref + 2;
        while (at && *p) {
            const char *slash = strchr(p, '/');
            size_t n = slash ? (size_t)(slash - p) : strlen(p);
            char key[128];
            if (n >= sizeof key) return NULL;
            memcpy(key, p, n);
            key[n] = 0;
            at = cJSON_GetObjectItemCaseSensitive(at, key);
            p += n + (slash ? 1 : 0);
        }
        node = at;
    }
    return node;
}

static const char *json_kind(const cJSON *v) {
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsNumber(v)) return "number";
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsArray(v)) return "array";
    if (cJSON_IsObject(v)) return "object";
    return "null";
}

/* The schema a value was written against: refs followed; of a union's members, the first
 * whose type fits the value. */
static const cJSON *schema_for(const cJSON *node, const cJSON *value, const cJSON *root) {
    node = resolve_ref(node, root);
    if (!cJSON_IsObject(node)) return NULL;
    const cJSON *alts = cJSON_GetObjectItemCaseSensitive(node, "anyOf");
    if (!alts) alts = cJSON_GetObjectItemCaseSensitive(node, "oneOf");
    if (!cJSON_IsArray(alts)) return node;
    const char *kind = json_kind(value);
    const cJSON *alt, *fallback = NULL;
    cJSON_ArrayForEach(alt, alts) {
        const cJSON *a = resolve_ref(alt, root);
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "type"));
        if (!t) {
            if (!fallback) fallback = a;
            continue;
        }
        if (!strcmp(t, kind) || (!strcmp(t, "integer") && !strcmp(kind, "number"))) return a;
    }
    return fallback ? fallback : node;
}

static int same_scalar(const cJSON *a, const cJSON *b) {
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b)) return a->valuedouble == b->valuedouble;
    if (cJSON_IsString(a) && cJSON_IsString(b)) return !strcmp(a->valuestring, b->valuestring);
    return 0;
}

/* "2024-05-01...", "17:30", "5:30pm": resolved by the model, not copied */
static int looks_temporal(const char *s) {
    if (isdigit((unsigned char)s[0]) && isdigit((unsigned char)s[1]) && isdigit((unsigned char)s[2]) &&
        isdigit((unsigned char)s[3]) && s[4] == '-' && isdigit((unsigned char)s[5]))
        return 1;
    size_t d = 0;
    while (isdigit((unsigned char)s[d])) d++;
    return (d == 1 || d == 2) && s[d] == ':' && isdigit((unsigned char)s[d + 1]) &&
           isdigit((unsigned char)s[d + 2]);
}

static int enum_value_supported(const grounding *g, const cJSON *value) {
    if (cJSON_IsNumber(value)) return has_number(g->nums, value->valuedouble);
    if (!cJSON_IsString(value)) return 1;
    if (contains_text(g->input, value->valuestring, 1)) return 1;
    words v;
    split_words(value->valuestring, &v);
    /* a one-word value ("on") or its phrase ("living_room") through the synonym table */
    int found = 0;
    if (!v.oom && v.n) {
        strbuf joined = {0};
        for (size_t i = 0; i < v.n; i++) {
            if (i) strbuf_puts(&joined, " ");
            strbuf_puts(&joined, word_at(&v, i));
        }
        found = !joined.oom && synonym_appears(g->input, joined.data);
        free(joined.data);
    }
    words_free(&v);
    return found;
}

static int value_supported(const grounding *g, const cJSON *schema, const cJSON *value) {
    if (cJSON_IsBool(value) || cJSON_IsNull(value)) return 1;
    const cJSON *def = schema ? cJSON_GetObjectItemCaseSensitive(schema, "default") : NULL;
    if (def && same_scalar(def, value)) return 1;
    if (schema && cJSON_GetObjectItemCaseSensitive(schema, "const")) return 1;
    const cJSON *en = schema ? cJSON_GetObjectItemCaseSensitive(schema, "enum") : NULL;
    if (cJSON_IsArray(en)) {
        if (cJSON_GetArraySize(en) <= 1) return 1;
        return enum_value_supported(g, value);
    }
    if (cJSON_IsNumber(value)) return has_number(g->nums, value->valuedouble);
    if (!cJSON_IsString(value)) return 1;
    const char *s = value->valuestring;
    const char *fmt = schema ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(schema, "format")) : NULL;
    if (fmt && (!strcmp(fmt, "date") || !strcmp(fmt, "date-time") || !strcmp(fmt, "time") ||
                !strcmp(fmt, "duration")))
        return 1;
    if (looks_temporal(s)) return 1;
    return contains_text(g->input, s, 0);
}

static void flag(grounding *g, const char *path) {
    if (g->n_paths++) strbuf_puts(g->paths, ",");
    util_json_put_string(g->paths, path, strlen(path), 0);
}

static void walk(grounding *g, const cJSON *node, const cJSON *value, strbuf *path, int depth) {
    if (depth > 32) return;
    const cJSON *schema = node ? schema_for(node, value, g->root) : NULL;
    const size_t mark = path->len;
    if (cJSON_IsObject(value)) {
        const cJSON *props = schema ? cJSON_GetObjectItemCaseSensitive(schema, "properties") : NULL;
        const cJSON *child;
        cJSON_ArrayForEach(child, value) {
            strbuf_puts(path, ".");
            strbuf_puts(path, child->string);
            walk(g, props ? cJSON_GetObjectItemCaseSensitive(props, child->string) : NULL, child, path,
                 depth + 1);
            path->len = mark;
            if (path->data) path->data[mark] = 0;
        }
    } else if (cJSON_IsArray(value)) {
        const cJSON *items = schema ? cJSON_GetObjectItemCaseSensitive(schema, "items") : NULL;
        const cJSON *child;
        int i = 0;
        cJSON_ArrayForEach(child, value) {
            char idx[24];
            snprintf(idx, sizeof idx, "[%d]", i++);
            strbuf_puts(path, idx);
            walk(g, items, child, path, depth + 1);
            path->len = mark;
            if (path->data) path->data[mark] = 0;
        }
    } else if (!value_supported(g, schema, value) && !path->oom) {
        flag(g, path->data);
    }
}

static const cJSON *tool_named(const cJSON *tools, const char *name) {
    const cJSON *entry;
    cJSON_ArrayForEach(entry, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(entry, "function");
        const cJSON *t = cJSON_IsObject(f) ? f : entry; /* OpenAI-style or bare */
        const char *n = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "name"));
        if (n && !strcmp(n, name)) return t;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------
 * Negation */

/* skipped before a cue: discourse fillers and a subject */
static const char *const FILLERS[] = {"please", "pls", "just", "and", "but", "so", "then", "also",
                                      "oh", "ok", "okay", "hey", "um", "uh", "actually", "now",
                                      "i", "we", "you", "really", "instead", "well", "no",
                                      "sorry", "wait", "hmm"};
/* a cue over these is not a negated request: "don't forget to", "don't worry" */
static const char *const NON_ACTIONS[] = {"forget", "worry", "hesitate", "know", "think", "mind",
                                          "care", "understand", "mean", "disturb", "panic",
                                          "fail", "miss"};
/* a clause beginning with these is not an imperative request */
static const char *const NOT_IMPERATIVE[] = {
    "i", "im", "ive", "id", "ill", "we", "were", "weve", "you", "youre", "they", "theyre", "he",
    "she", "it", "its", "this", "that", "thats", "these", "those", "there", "theres", "the",
    "a", "an", "my", "your", "our", "his", "her", "their", "some", "any", "no", "not",
    "while", "when", "whenever", "if", "because", "since", "until", "as", "though",
    "although", "for", "in", "on", "at", "to", "of", "with", "without", "from", "by",
    "after", "before", "maybe", "thanks", "thank", "cheers", "which", "who", "what", "yet",
    "again", "today", "tonight", "tomorrow", "later", "or", "nor", "thx", "ty", "lol",
    "under", "over", "about", "into", "onto", "unless", "even", "ever", "only", "anyway",
    "anymore", "not", "never", "whatever", "whichever"};

/* The length of the negation cue at word i (0: none). */
static size_t cue_at(const words *w, size_t i) {
    static const char *const ONE[] = {"dont", "doesnt", "never", "shouldnt", "mustnt", "didnt"};
    static const char *const TWO_FIRST[] = {"do", "does", "should", "must", "lets", "did"};
    if (i >= w->n) return 0;
    if (IN_LIST(word_at(w, i), ONE)) return 1;
    if (IN_LIST(word_at(w, i), TWO_FIRST) && word_is(w, i + 1, "not")) return 2;
    if (word_is(w, i, "let") && word_is(w, i + 1, "us") && word_is(w, i + 2, "not")) return 3;
    size_t k = i;
    if (word_is(w, k, "theres")) k++;
    else if (word_is(w, k, "there") && word_is(w, k + 1, "is")) k += 2;
    if (word_is(w, k, "no") && word_is(w, k + 1, "need") && word_is(w, k + 2, "to")) return k + 3 - i;
    return 0;
}

int validation_negated(const char *query) {
    words w;
    split_words(query, &w);
    if (w.oom) {
        words_free(&w);
        return 0;
    }
    int negated = 0, imperative = 0;
    int pending = 0; /* a cue ended its clause before its verb: "do not, under any ..., close" */
    for (size_t at = 0; at < w.n;) {
        size_t end = at + 1;
        while (end < w.n && !w.clause[end] && !word_is(&w, end, "but") && !word_is(&w, end, "then"))
            end++;
        size_t i = at;
        /* skip fillers, but a clause that is only "no" and fillers is not an imperative */
        size_t cue = 0;
        while (i < end && !(cue = cue_at(&w, i)) && IN_LIST(word_at(&w, i), FILLERS)) i++;
        if (i < end && !cue) cue = cue_at(&w, i);
        if (cue) {
            size_t v = i + cue;
            while (v < end && (word_is(&w, v, "ever") || word_is(&w, v, "even") ||
                               word_is(&w, v, "please") || word_is(&w, v, "you") ||
                               word_is(&w, v, "just")))
                v++;
            if (v >= end) negated = pending = 1;
            else if (!IN_LIST(word_at(&w, v), NON_ACTIONS)) negated = 1;
        } else if (i < end && (word_is(&w, i, "stop") || word_is(&w, i, "keep") ||
                               word_is(&w, i, "prevent"))) {
            int from = 0;
            for (size_t k = i + 1; k < end; k++) from |= word_is(&w, k, "from");
            if (from) negated = 1;
            else imperative = 1;
        } else if (i < end) {
            const char *first = word_at(&w, at);
            const char *lead = word_at(&w, i);
            /* an imperative: no subject first ("I love this part" is a statement), not a
             * determiner, subordinator or number */
            if (!IN_LIST(first, NOT_IMPERATIVE) && !IN_LIST(lead, NOT_IMPERATIVE) &&
                !isdigit((unsigned char)lead[0]) && small_word(lead) < 0 && tens_word(lead) < 0) {
                /* the verb a dangling cue was waiting for is negated, not a new request */
                if (pending) pending = 0;
                else imperative = 1;
            }
        }
        at = end;
    }
    words_free(&w);
    return negated && !imperative;
}

/* ---------------------------------------------------------------------------------------
 * The object */

/* The system facts without the date fact ("date: 2026-12-06 Sun 10:12", which auto_date
 * puts there): its numbers and weekday support no argument; a date argument is checked
 * against the input's years by the Python package, as the official does. */
static void put_without_date_fact(strbuf *b, const char *system) {
    const char *p = system;
    for (const char *f = strstr(p, "date:"); f; f = strstr(f + 1, "date:")) {
        if (f > system && isalpha((unsigned char)f[-1])) continue; /* "update:" */
        const char *q = f + 5;
        while (*q == ' ') q++;
        int iso = 1; /* stops at the first mismatch: the string may end before 10 bytes */
        for (int k = 0; k < 10 && iso; k++)
            iso = (k == 4 || k == 7) ? q[k] == '-' : isdigit((unsigned char)q[k]) != 0;
        if (!iso) continue;
        q += 10;
        if (q[0] == ' ' && isalpha((unsigned char)q[1]) && isalpha((unsigned char)q[2]) &&
            isalpha((unsigned char)q[3]) && !isalpha((unsigned char)q[4]))
            q += 4;
        if (q[0] == ' ' && isdigit((unsigned char)q[1]) && isdigit((unsigned char)q[2]) && q[3] == ':' &&
            isdigit((unsigned char)q[4]) && isdigit((unsigned char)q[5]))
            q += 6;
        strbuf_put(b, p, (size_t)(f - p));
        strbuf_puts(b, " ");
        p = q;
        f = q - 1;
    }
    strbuf_puts(b, p);
}

void validation_write(const char *tools_json, const char *system, const char *text,
                      int is_query, const char *calls_json, strbuf *out) {
    strbuf paths = {0};
    int n_paths = 0;
    cJSON *calls = calls_json ? cJSON_Parse(calls_json) : NULL;
    cJSON *tools = tools_json && cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0
                       ? cJSON_Parse(tools_json)
                       : NULL;
    if (cJSON_IsArray(calls) && cJSON_IsArray(tools)) {
        /* the input: the system facts, then the turn's text */
        strbuf in = {0};
        if (system) put_without_date_fact(&in, system);
        strbuf_puts(&in, "\n");
        if (text) strbuf_puts(&in, text);
        words input;
        numbers nums = {0};
        split_words(in.data ? in.data : "", &input);
        if (in.data) {
            digit_numbers(in.data, &nums);
            clock_numbers(in.data, &nums);
        }
        word_numbers(&input, &nums);
        const cJSON *call;
        cJSON_ArrayForEach(call, calls) {
            const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(call, "name"));
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
            const cJSON *tool = name ? tool_named(tools, name) : NULL;
            if (!tool || !cJSON_IsObject(args)) continue;
            const cJSON *params = cJSON_GetObjectItemCaseSensitive(tool, "parameters");
            grounding g = {&input, &nums, params, &paths, n_paths};
            strbuf path = {0};
            strbuf_puts(&path, name);
            walk(&g, params, args, &path, 0);
            n_paths = g.n_paths;
            free(path.data);
        }
        words_free(&input);
        free(nums.v);
        free(in.data);
    }
    cJSON_Delete(calls);
    cJSON_Delete(tools);
    strbuf_puts(out, "{\"ungrounded\":[");
    if (paths.data) strbuf_puts(out, paths.data);
    strbuf_puts(out, is_query && validation_negated(text) ? "],\"negation\":true}"
                                                         : "],\"negation\":false}");
    if (paths.oom) out->oom = 1;
    free(paths.data);
}

int needle_validate_calls(const char *tools_json, const char *system, const char *text,
                          int32_t turn, const char *calls_json, char *out, size_t cap,
                          size_t *len) {
    if (!calls_json || !len || (!out && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "validate_calls: NULL argument");
    strbuf b = {0};
    validation_write(tools_json, system, text, turn == NEEDLE_TURN_QUERY, calls_json, &b);
    if (b.oom) {
        free(b.data);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "validate_calls: out of memory");
    }
    *len = b.len;
    if (b.len + 1 > cap) {
        free(b.data);
        return needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "validate_calls: the result needs %zu "
                           "bytes, the buffer holds %zu", *len + 1, cap);
    }
    memcpy(out, b.data, b.len + 1);
    free(b.data);
    needle_clear_error();
    return NEEDLE_OK;
}
