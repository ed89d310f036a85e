/* Grammar property tests.
 *
 * Random schemas (seeded PRNG) are compiled, then random walks pick among the allowed
 * bytes (or allowed tokens of a synthetic vocabulary) until the call array is complete.
 * Every walk must end (a bias towards closing bytes after a soft length bounds it), never
 * reach a state with nothing allowed, and produce text that cJSON parses, that is compact
 * and valid UTF-8, that names declared tools, and that satisfies the schema according to
 * the small validator below, written independently of the grammar (its own pattern and
 * format checkers, double arithmetic, cJSON_Compare for enums and uniqueness). Along the
 * byte walks, grammar_complete must finish the array from many intermediate states with
 * text that passes the same checks. Token walks also compare every mask with the
 * brute-force per-token check. The real vocabulary is exercised in test_grammar_mask.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "harness.h"
#include "needle.h"

/* Sizes of the runs (override with -D for a longer soak). */
#ifndef WALK_SCHEMAS
#define WALK_SCHEMAS 200
#endif
#ifndef TOKEN_SCHEMAS
#define TOKEN_SCHEMAS 60
#endif
#ifndef WALK_SEED
#define WALK_SEED 12345
#endif

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return n ? (uint32_t)((rng >> 11) % n) : 0;
}

/* ---- independent checkers ------------------------------------------------------------ */

/* Code points of a UTF-8 string (cJSON already decoded the escapes); -1 if ill-formed. */
static int utf8_cps(const char *s, uint32_t *cp, int cap) {
    int n = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        uint32_t c = *p, v;
        int k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!k) return -1;
        v = k == 1 ? c : c & (0xFF >> (k + 1));
        for (int i = 1; i < k; i++) {
            if ((p[i] & 0xC0) != 0x80) return -1;
            v = v << 6 | (p[i] & 0x3F);
        }
        if ((k == 2 && v < 0x80) || (k == 3 && v < 0x800) || (k == 4 && v < 0x10000) || v > 0x10FFFF ||
            (v >= 0xD800 && v <= 0xDFFF))
            return -1;
        if (n < cap) cp[n] = v;
        n++;
        p += k;
    }
    return n;
}

static int valid_utf8(const char *s, size_t len) {
    char *z = malloc(len + 1);
    memcpy(z, s, len);
    z[len] = 0;
    int ok = strlen(z) == len && utf8_cps(z, NULL, 0) >= 0;
    free(z);
    return ok;
}

static int is_digit(uint32_t c) { return c >= '0' && c <= '9'; }
static int is_lower(uint32_t c) { return c >= 'a' && c <= 'z'; }
static int is_upper(uint32_t c) { return c >= 'A' && c <= 'Z'; }
static int is_word(uint32_t c) { return is_digit(c) || is_lower(c) || is_upper(c) || c == '_'; }
static int is_hex(uint32_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static int is_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

/* Pattern checkers: each returns 1 if the whole string c[0, n) matches. */
static int p_lower25(const uint32_t *c, int n) {
    for (int i = 0; i < n; i++) if (!is_lower(c[i])) return 0;
    return n >= 2 && n <= 5;
}
static int p_abcd(const uint32_t *c, int n) {
    if (n < 2 || n % 2) return 0;
    for (int i = 0; i < n; i += 2)
        if (!((c[i] == 'a' && c[i + 1] == 'b') || (c[i] == 'c' && c[i + 1] == 'd'))) return 0;
    return 1;
}
static int p_phone(const uint32_t *c, int n) {
    if (n != 8) return 0;
    for (int i = 0; i < 8; i++) if (i == 3 ? c[i] != '-' : !is_digit(c[i])) return 0;
    return 1;
}
static int p_cap(const uint32_t *c, int n) {
    if (n < 1 || !is_upper(c[0])) return 0;
    for (int i = 1; i < n; i++) if (!is_lower(c[i])) return 0;
    return 1;
}
static int p_xyz(const uint32_t *c, int n) {
    int i = 0;
    if (i < n && c[i] == 'x') i++;
    while (i < n && c[i] == 'y') i++;
    return i == n - 1 && c[i] == 'z';
}
static int p_noquote(const uint32_t *c, int n) {
    for (int i = 0; i < n; i++) if (c[i] == '"' || c[i] == '\\') return 0;
    return n <= 3;
}
static int p_eacute(const uint32_t *c, int n) {
    if (n == 1 && c[0] == 0xFC) return 1;
    for (int i = 0; i < n; i++) if (c[i] != 0xE9) return 0;
    return n >= 1;
}
static int p_foobar(const uint32_t *c, int n) {
    if (n != 3 && n != 6) return 0;
    int ok = (c[0] == 'f' && c[1] == 'o' && c[2] == 'o') || (c[0] == 'b' && c[1] == 'a' && c[2] == 'r');
    return ok && (n == 3 || (c[3] == 'b' && c[4] == 'a' && c[5] == 'z'));
}
static int p_hex8(const uint32_t *c, int n) {
    for (int i = 0; i < n; i++) if (!is_digit(c[i]) && !(c[i] >= 'a' && c[i] <= 'f')) return 0;
    return n == 8;
}
static int p_dot14(const uint32_t *c, int n) {
    for (int i = 0; i < n; i++) if (c[i] == '\n' || c[i] == '\r' || c[i] == 0x2028 || c[i] == 0x2029) return 0;
    return n >= 1 && n <= 4;
}
static int p_word(const uint32_t *c, int n) {
    for (int i = 0; i < n; i++) if (!is_word(c[i])) return 0;
    return n >= 1;
}
static int p_abc(const uint32_t *c, int n) { return n == 1 && c[0] >= 'a' && c[0] <= 'c'; }
static int p_space(const uint32_t *c, int n) {
    return (n == 1 && !is_space(c[0])) || (n == 2 && is_space(c[0]) && !is_space(c[1]));
}
static int p_greek(const uint32_t *c, int n) {
    for (int i = 0; i < n; i++) if (c[i] < 0x3B1 || c[i] > 0x3C9) return 0;
    return n >= 1 && n <= 3;
}
static int p_money(const uint32_t *c, int n) {
    int i = 1;
    if (n < 2 || c[0] != '$') return 0;
    while (i < n && is_digit(c[i])) i++;
    if (i == 1) return 0;
    return i == n || (i + 3 == n && c[i] == '.' && is_digit(c[i + 1]) && is_digit(c[i + 2]));
}
static int p_user(const uint32_t *c, int n) {
    for (int i = 0; i < n; i++) if (!is_lower(c[i]) && !is_digit(c[i]) && c[i] != '_') return 0;
    return n >= 3 && n <= 16;
}

static const struct { const char *pattern; int (*check)(const uint32_t *, int); int min_len; } PATTERNS[] = {
    {"[a-z]{2,5}", p_lower25, 2}, {"(ab|cd)+", p_abcd, 2}, {"\\d{3}-\\d{4}", p_phone, 8},
    {"[A-Z][a-z]*", p_cap, 1}, {"x?y*z", p_xyz, 1}, {"[^\"\\\\]{0,3}", p_noquote, 0},
    {"\xc3\xa9+|\xc3\xbc", p_eacute, 1}, {"(foo|bar)(baz)?", p_foobar, 3}, {"[0-9a-f]{8}", p_hex8, 8},
    {".{1,4}", p_dot14, 1}, {"\\w+", p_word, 1}, {"a|b|c", p_abc, 1}, {"\\s?\\S", p_space, 1},
    {"[\xce\xb1-\xcf\x89]{1,3}", p_greek, 1}, {"\\$\\d+(\\.\\d\\d)?", p_money, 2}, {"^[a-z0-9_]{3,16}$", p_user, 3},
};
#define N_PATTERNS (int)(sizeof PATTERNS / sizeof PATTERNS[0])

static int digits(const uint32_t *c, int n) {
    for (int i = 0; i < n; i++) if (!is_digit(c[i])) return 0;
    return 1;
}
static int num2(const uint32_t *c) { return (int)(c[0] - '0') * 10 + (int)(c[1] - '0'); }

static int f_date(const uint32_t *c, int n) {
    if (n != 10 || c[4] != '-' || c[7] != '-' || !digits(c, 4) || !digits(c + 5, 2) || !digits(c + 8, 2)) return 0;
    return num2(c + 5) >= 1 && num2(c + 5) <= 12 && num2(c + 8) >= 1 && num2(c + 8) <= 31;
}
/* RFC 3339 full-time: HH:MM:SS(.f{1,9})?(Z|z|+HH:MM|-HH:MM) */
static int f_time(const uint32_t *c, int n) {
    if (n < 9 || !digits(c, 2) || c[2] != ':' || !digits(c + 3, 2) || c[5] != ':' || !digits(c + 6, 2) ||
        num2(c) > 23 || num2(c + 3) > 59 || num2(c + 6) > 59)
        return 0;
    int i = 8;
    if (c[i] == '.') {
        int k = 0;
        while (i + 1 + k < n && is_digit(c[i + 1 + k])) k++;
        if (k < 1 || k > 9) return 0;
        i += 1 + k;
    }
    if (n - i == 1) return c[i] == 'Z' || c[i] == 'z';
    return n - i == 6 && (c[i] == '+' || c[i] == '-') && digits(c + i + 1, 2) && c[i + 3] == ':' &&
           digits(c + i + 4, 2) && num2(c + i + 1) <= 23 && num2(c + i + 4) <= 59;
}
static int f_datetime(const uint32_t *c, int n) {
    return n > 11 && f_date(c, 10) && (c[10] == 'T' || c[10] == 't') && f_time(c + 11, n - 11);
}
static int f_email(const uint32_t *c, int n) {
    int at = -1, i;
    for (i = 0; i < n; i++) if (c[i] == '@') { at = i; break; }
    if (at < 1) return 0;
    for (i = 0; i < at; i++)
        if (!(is_word(c[i]) && c[i] != '_') && !strchr("._%+-", (int)c[i])) return 0;
    int dots = 0, label = 0;
    for (i = at + 1; i < n; i++) {
        if (c[i] == '.') {
            if (!label) return 0;
            dots++;
            label = 0;
        } else if ((is_word(c[i]) && c[i] != '_') || c[i] == '-') {
            label++;
        } else {
            return 0;
        }
    }
    return dots >= 1 && label > 0 && c[at + 1] != '.';
}
static int f_uri(const uint32_t *c, int n) {
    int i = 0;
    if (n < 1 || !(is_lower(c[0]) || is_upper(c[0]))) return 0;
    for (i = 1; i < n && c[i] != ':'; i++)
        if (!(is_word(c[i]) && c[i] != '_') && c[i] != '+' && c[i] != '.' && c[i] != '-') return 0;
    if (i >= n - 1) return 0;
    for (i++; i < n; i++)
        if (!(is_word(c[i]) && c[i] != '_') && !strchr("._~:/?#[]@!$&'()*+,;=%-", (int)c[i])) return 0;
    return 1;
}
static int f_uuid(const uint32_t *c, int n) {
    if (n != 36) return 0;
    for (int i = 0; i < 36; i++)
        if (i == 8 || i == 13 || i == 18 || i == 23 ? c[i] != '-' : !is_hex(c[i])) return 0;
    return 1;
}
static int f_ipv4(const uint32_t *c, int n) {
    int parts = 0, i = 0;
    while (i < n) {
        int k = 0, v = 0;
        while (i + k < n && is_digit(c[i + k])) v = v * 10 + (int)(c[i + k] - '0'), k++;
        if (k < 1 || k > 3 || v > 255 || (k > 1 && c[i] == '0')) return 0;
        parts++;
        i += k;
        if (i < n && (c[i] != '.' || parts == 4)) return 0;
        if (i < n) i++;
        else break;
    }
    return parts == 4 && c[n - 1] != '.';
}
static const struct { const char *name; int (*check)(const uint32_t *, int); } FORMATS[] = {
    {"date", f_date}, {"time", f_time}, {"date-time", f_datetime}, {"email", f_email},
    {"uri", f_uri}, {"uuid", f_uuid}, {"ipv4", f_ipv4},
};

/* ---- the validator --------------------------------------------------------------------- */

static const cJSON *kw(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k); }

static int type_ok(const cJSON *v, const char *t) {
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    return 0;
}

static int validate(const cJSON *v, const cJSON *s);

static int validate_string(const cJSON *v, const cJSON *s) {
    static uint32_t cp[4096];
    int n = utf8_cps(v->valuestring, cp, 4096);
    const cJSON *x;
    if (n < 0 || n > 4096) return 0;
    if ((x = kw(s, "minLength")) && n < x->valuedouble) return 0;
    if ((x = kw(s, "maxLength")) && n > x->valuedouble) return 0;
    if ((x = kw(s, "pattern"))) {
        int found = 0;
        for (int i = 0; i < N_PATTERNS; i++)
            if (!strcmp(PATTERNS[i].pattern, x->valuestring)) found = 1, n = PATTERNS[i].check(cp, n) ? n : -1;
        if (!found || n < 0) return 0;
    }
    if ((x = kw(s, "format")))
        for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++)
            if (!strcmp(FORMATS[i].name, x->valuestring) && !FORMATS[i].check(cp, n)) return 0;
    return 1;
}

static int validate_number(const cJSON *v, const cJSON *s) {
    double d = v->valuedouble;
    const cJSON *x, *emin = kw(s, "exclusiveMinimum"), *emax = kw(s, "exclusiveMaximum");
    if ((x = kw(s, "minimum")) && (cJSON_IsTrue(emin) ? d <= x->valuedouble : d < x->valuedouble)) return 0;
    if ((x = kw(s, "maximum")) && (cJSON_IsTrue(emax) ? d >= x->valuedouble : d > x->valuedouble)) return 0;
    if (cJSON_IsNumber(emin) && d <= emin->valuedouble) return 0;
    if (cJSON_IsNumber(emax) && d >= emax->valuedouble) return 0;
    if ((x = kw(s, "multipleOf"))) {
        double q = d / x->valuedouble;
        if (fabs(q - round(q)) > 1e-9 * fmax(1, fabs(q))) return 0;
    }
    return 1;
}

static int validate_object(const cJSON *v, const cJSON *s) {
    const cJSON *props = kw(s, "properties"), *req = kw(s, "required"), *addl = kw(s, "additionalProperties");
    for (const cJSON *c = v->child; c; c = c->next) {
        for (const cJSON *d = v->child; props && d != c; d = d->next) /* free-form: not tracked */
            if (!strcmp(c->string, d->string)) return 0; /* duplicate key */
        const cJSON *ps = props ? kw(props, c->string) : NULL;
        if (ps && !validate(c, ps)) return 0;
        if (!ps && (props || cJSON_IsFalse(addl))) return 0; /* declared objects: no unknown keys */
    }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!kw(v, r->valuestring)) return 0;
    return 1;
}

static int validate_array(const cJSON *v, const cJSON *s) {
    const cJSON *items = kw(s, "items"), *x;
    int n = cJSON_GetArraySize(v);
    if ((x = kw(s, "minItems")) && n < x->valuedouble) return 0;
    if ((x = kw(s, "maxItems")) && n > x->valuedouble) return 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        if (items && !validate(c, items)) return 0;
        if (cJSON_IsTrue(kw(s, "uniqueItems")))
            for (const cJSON *d = v->child; d != c; d = d->next)
                if (cJSON_Compare(c, d, 1)) return 0;
    }
    return 1;
}

static int validate(const cJSON *v, const cJSON *s) {
    const cJSON *x;
    if (cJSON_IsTrue(s)) return 1;
    if ((x = kw(s, "const"))) return cJSON_Compare(v, x, 1);
    if ((x = kw(s, "enum"))) {
        for (const cJSON *e = x->child; e; e = e->next)
            if (cJSON_Compare(v, e, 1)) return 1;
        return 0;
    }
    if ((x = kw(s, "anyOf")) || (x = kw(s, "oneOf"))) {
        int hits = 0;
        for (const cJSON *a = x->child; a; a = a->next) hits += validate(v, a);
        return kw(s, "oneOf") ? hits == 1 : hits >= 1;
    }
    if ((x = kw(s, "type"))) {
        int ok = cJSON_IsNull(v) && cJSON_IsTrue(kw(s, "nullable"));
        if (cJSON_IsString(x)) ok |= type_ok(v, x->valuestring);
        for (const cJSON *t = cJSON_IsArray(x) ? x->child : NULL; t; t = t->next) ok |= type_ok(v, t->valuestring);
        if (!ok) return 0;
    }
    if (cJSON_IsString(v)) return validate_string(v, s);
    if (cJSON_IsNumber(v)) return validate_number(v, s);
    if (cJSON_IsObject(v)) return validate_object(v, s);
    if (cJSON_IsArray(v)) return validate_array(v, s);
    return 1;
}

/* The whole output: compact, UTF-8, an array of {"name","arguments"} with valid arguments. */
static int validate_output(const char *text, size_t len, const cJSON *tools, char *why, size_t wlen) {
    if (!valid_utf8(text, len)) return snprintf(why, wlen, "not UTF-8"), 0;
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str && c == '\\') i++;
        else if (c == '"') in_str = !in_str;
        else if (!in_str && (c == ' ' || c == '\n' || c == '\t' || c == '\r')) return snprintf(why, wlen, "space"), 0;
    }
    /* cJSON stores strings NUL-terminated, so "\u0000" would cut a value short: check
     * U+0001 in its place (same length, same classes in every pattern and format here) */
    char *copy = malloc(len + 1);
    memcpy(copy, text, len);
    copy[len] = 0;
    for (char *z = copy; (z = strstr(z, "\\u0000")) != NULL; z += 6)
        if (z == copy || z[-1] != '\\') z[5] = '1';
    cJSON *doc = cJSON_ParseWithLength(copy, len);
    free(copy);
    int ok = cJSON_IsArray(doc);
    if (!ok) snprintf(why, wlen, "not a JSON array");
    for (const cJSON *call = ok ? doc->child : NULL; call && ok; call = call->next) {
        const cJSON *name = call->child, *args = name ? name->next : NULL;
        ok = cJSON_IsObject(call) && name && !strcmp(name->string, "name") && cJSON_IsString(name) && args &&
             !strcmp(args->string, "arguments") && !args->next;
        const cJSON *tool = NULL;
        for (const cJSON *t = tools->child; ok && t; t = t->next)
            if (!strcmp(kw(t, "name")->valuestring, name->valuestring)) tool = t;
        if (ok && !tool) ok = 0, snprintf(why, wlen, "undeclared name");
        else if (ok && !validate(args, kw(tool, "parameters"))) ok = 0, snprintf(why, wlen, "arguments invalid");
        else if (!ok) snprintf(why, wlen, "call shape");
    }
    cJSON_Delete(doc);
    return ok;
}


/* ---- random schemas ------------------------------------------------------------------- */

static cJSON *obj_with_type(const char *type) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", type);
    return s;
}

static double pick_decimal(void) {
    static const double scale[] = {1, 10, 100, 1000};
    return (double)((int)rnd(20001) - 10000) / scale[rnd(4)];
}

static const char *const STRINGS[] = {"a", "b\xc3\xa9", "", "q\"t", "line\nbreak", "\xf0\x9f\x98\x80", "red",
                                      "x y", "\\", "caf\xc3\xa9", "1"};
#define N_STRINGS (sizeof STRINGS / sizeof STRINGS[0])

static cJSON *gen_string(int unique) {
    cJSON *s = obj_with_type("string");
    uint32_t r = unique ? rnd(4) : rnd(11);
    if (r < 4) {
        if (rnd(2)) cJSON_AddNumberToObject(s, "minLength", rnd(4));
        if (!unique && rnd(2)) cJSON_AddNumberToObject(s, "maxLength", 3 + rnd(6));
    } else if (r < 7) {
        int i = (int)rnd(N_PATTERNS);
        cJSON_AddStringToObject(s, "pattern", PATTERNS[i].pattern);
        if (rnd(3) == 0) cJSON_AddNumberToObject(s, "maxLength", PATTERNS[i].min_len + rnd(5));
        if (rnd(3) == 0) cJSON_AddNumberToObject(s, "minLength", PATTERNS[i].min_len + rnd(3));
    } else if (r < 10) {
        cJSON_AddStringToObject(s, "format", FORMATS[rnd(sizeof FORMATS / sizeof FORMATS[0])].name);
    } else {
        cJSON *e = cJSON_AddArrayToObject(s, "enum");
        for (uint32_t i = 0, n = 1 + rnd(4); i < n; i++) cJSON_AddItemToArray(e, cJSON_CreateString(STRINGS[rnd(N_STRINGS)]));
    }
    return s;
}

static cJSON *gen_number(int integer, int unique) {
    cJSON *s = obj_with_type(integer ? "integer" : "number");
    double lo = integer ? (double)((int)rnd(201) - 100) : pick_decimal();
    double hi = lo + (rnd(8) == 0 ? 0 : integer ? rnd(unique ? 6 : 60) : fabs(pick_decimal()));
    int bounded = unique || rnd(3);
    if (bounded && rnd(4)) cJSON_AddNumberToObject(s, rnd(3) ? "minimum" : "exclusiveMinimum", lo);
    if (bounded && rnd(4)) cJSON_AddNumberToObject(s, rnd(3) ? "maximum" : "exclusiveMaximum", hi);
    if (rnd(4) == 0) {
        static const double steps[] = {2, 3, 5, 7, 0.5, 0.25, 0.1, 0.01, 0.2};
        cJSON_AddNumberToObject(s, "multipleOf", steps[rnd(integer ? 4 : 9)]);
    }
    return s;
}

static cJSON *gen_enum(void) {
    cJSON *s = cJSON_CreateObject(), *e = cJSON_AddArrayToObject(s, "enum");
    static const char *const values[] = {"\"a\"", "\"b\\u00e9\"", "1", "2.5", "-3", "true", "null",
                                         "{\"k\":1}", "[1,\"x\"]", "\"\"", "1e-05", "12", "0"};
    uint32_t n = 1 + rnd(5);
    for (uint32_t i = 0; i < n; i++) {
        cJSON *v = cJSON_Parse(values[rnd(sizeof values / sizeof values[0])]);
        int dup = 0;
        for (cJSON *c = e->child; c; c = c->next) dup |= cJSON_Compare(c, v, 1);
        if (dup) cJSON_Delete(v);
        else cJSON_AddItemToArray(e, v);
    }
    if (rnd(4) == 0) { /* a lone const instead */
        cJSON *c = cJSON_Duplicate(e->child, 1);
        cJSON_DeleteItemFromObject(s, "enum");
        cJSON_AddItemToObject(s, "const", c);
    }
    return s;
}

static cJSON *gen_schema(int depth, int unique);

static cJSON *gen_unique_item(void) {
    switch (rnd(5)) {
    case 0: return gen_string(1);
    case 1: return gen_number(1, 1);
    case 2: return gen_number(0, 1);
    case 3: return obj_with_type("boolean");
    default: return gen_enum();
    }
}

static const char *const KEYS[] = {"a", "b", "city", "na\xc3\xafve", "x y", "q\"t", "ab", "n1"};

static cJSON *gen_object(int depth) {
    cJSON *s = obj_with_type("object"), *p = cJSON_AddObjectToObject(s, "properties");
    cJSON *req = cJSON_CreateArray();
    uint32_t n = rnd(5);
    for (uint32_t i = 0; i < n; i++) {
        const char *k = KEYS[rnd(sizeof KEYS / sizeof KEYS[0])];
        if (kw(p, k)) continue;
        cJSON_AddItemToObject(p, k, gen_schema(depth - 1, 0));
        if (rnd(2)) cJSON_AddItemToArray(req, cJSON_CreateString(k));
    }
    if (cJSON_GetArraySize(req)) cJSON_AddItemToObject(s, "required", req);
    else cJSON_Delete(req);
    if (rnd(3) == 0) cJSON_AddFalseToObject(s, "additionalProperties");
    return s;
}

/* An object or array item of a unique array, in the shapes the grammar supports there:
 * objects of strings without maxLength/pattern/format and of arrays without maxItems,
 * arrays without maxItems of typed scalars. */
static cJSON *gen_unique_compound(int depth) {
    cJSON *s;
    if (depth <= 0 || rnd(3) == 0) {
        s = obj_with_type("array");
        cJSON_AddItemToObject(s, "items", gen_unique_item());
        if (rnd(2)) cJSON_AddNumberToObject(s, "minItems", rnd(3));
        return s;
    }
    s = obj_with_type("object");
    cJSON *p = cJSON_AddObjectToObject(s, "properties"), *req = cJSON_AddArrayToObject(s, "required");
    for (uint32_t i = 0, n = 1 + rnd(3); i < n; i++) {
        const char *k = KEYS[rnd(sizeof KEYS / sizeof KEYS[0])];
        if (kw(p, k)) continue;
        cJSON_AddItemToObject(p, k, rnd(3) ? obj_with_type("string") : gen_unique_compound(0));
        if (rnd(2)) cJSON_AddItemToArray(req, cJSON_CreateString(k));
    }
    return s;
}

static cJSON *gen_array(int depth) {
    cJSON *s = obj_with_type("array");
    int unique = rnd(4) == 0;
    cJSON_AddItemToObject(s, "items", !unique ? gen_schema(depth - 1, 0)
                                      : rnd(3) ? gen_unique_item() : gen_unique_compound(depth - 1));
    uint32_t min = rnd(unique ? 5 : 3);
    if (min) cJSON_AddNumberToObject(s, "minItems", min);
    if (rnd(2)) cJSON_AddNumberToObject(s, "maxItems", min + rnd(4));
    if (unique) cJSON_AddTrueToObject(s, "uniqueItems");
    return s;
}

/* Set by the union walks: gen_schema then also writes unions of object schemas. */
static int gen_unions, unions_made;

/* anyOf/oneOf of 2-3 random objects, told apart by a const property (pydantic's
 * discriminated union), by a required property of each alternative's own, or left as they
 * come (often refused as ambiguous, which gen_tools counts); sometimes with null too. */
static cJSON *gen_object_union(int depth) {
    cJSON *s = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(s, rnd(2) ? "anyOf" : "oneOf");
    uint32_t n = 2 + rnd(2), plan = rnd(3);
    for (uint32_t i = 0; i < n; i++) {
        cJSON *alt = gen_object(depth), *props = cJSON_GetObjectItem(alt, "properties");
        cJSON *req = cJSON_GetObjectItem(alt, "required");
        char key[16];
        int required = rnd(3) != 0;
        if (plan == 0) {
            cJSON *d = cJSON_CreateObject();
            snprintf(key, sizeof key, "k%u", i);
            if (rnd(3) == 0) cJSON_AddNumberToObject(d, "const", i);
            else if (rnd(2)) cJSON_AddStringToObject(d, "const", key);
            else {
                cJSON *e = cJSON_AddArrayToObject(d, "enum");
                cJSON_AddItemToArray(e, cJSON_CreateString(key));
                key[0] = 'q';
                cJSON_AddItemToArray(e, cJSON_CreateString(key));
            }
            cJSON_AddItemToObject(props, "kind", d);
            snprintf(key, sizeof key, "kind");
        } else if (plan == 1) {
            snprintf(key, sizeof key, "own%u", i);
            cJSON_AddItemToObject(props, key, gen_schema(depth - 1, 0));
            required = 1;
        }
        if (plan < 2 && required) {
            if (!req) req = cJSON_AddArrayToObject(alt, "required");
            cJSON_AddItemToArray(req, cJSON_CreateString(key));
        }
        cJSON_AddItemToArray(list, alt);
    }
    if (rnd(4) == 0) cJSON_AddItemToArray(list, obj_with_type("null"));
    unions_made++;
    return s;
}

static cJSON *gen_schema(int depth, int unique) {
    if (unique) return gen_unique_item();
    if (gen_unions && depth > 0 && rnd(3) == 0) return gen_object_union(depth);
    uint32_t r = rnd(depth > 0 ? 16 : 11);
    cJSON *s, *list;
    switch (r) {
    case 0: case 1: case 2: return gen_string(0);
    case 3: case 4: return gen_number(1, 0);
    case 5: return gen_number(0, 0);
    case 6: return obj_with_type("boolean");
    case 7: return rnd(2) ? obj_with_type("null") : cJSON_CreateObject(); /* {}: any value */
    case 8: return gen_enum();
    case 9: /* Optional[X] the pydantic way */
        s = cJSON_CreateObject();
        list = cJSON_AddArrayToObject(s, "anyOf");
        cJSON_AddItemToArray(list, rnd(2) ? gen_string(0) : gen_number(rnd(2), 0));
        cJSON_AddItemToArray(list, obj_with_type("null"));
        cJSON_AddNullToObject(s, "default");
        return s;
    case 10: /* a type list sharing keywords */
        s = gen_number(rnd(2), 0);
        cJSON_DeleteItemFromObject(s, "type");
        list = cJSON_AddArrayToObject(s, "type");
        cJSON_AddItemToArray(list, cJSON_CreateString(rnd(2) ? "integer" : "number"));
        cJSON_AddItemToArray(list, cJSON_CreateString(rnd(2) ? "string" : "boolean"));
        if (rnd(2)) cJSON_AddNumberToObject(s, "maxLength", rnd(5));
        return s;
    case 11: case 12: return gen_object(depth);
    case 13: case 14: return gen_array(depth);
    default: return obj_with_type(rnd(2) ? "object" : "array"); /* free-form */
    }
}

/* Tools JSON with 1-3 tools; NULL if it does not compile (some random schemas are
 * legitimately impossible, e.g. a pattern longer than its maxLength). */
static cJSON *gen_tools(grammar **g, int *rejected) {
    for (;;) {
        cJSON *tools = cJSON_CreateArray();
        uint32_t n = 1 + rnd(3);
        for (uint32_t i = 0; i < n; i++) {
            cJSON *t = cJSON_CreateObject();
            char name[16];
            snprintf(name, sizeof name, i == 1 ? "t\xc3\xa9%u" : "tool%u", i);
            cJSON_AddStringToObject(t, "name", name);
            cJSON *p = gen_object(1 + (int)rnd(3));
            cJSON_AddItemToObject(t, "parameters", p);
            cJSON_AddItemToArray(tools, t);
        }
        char *text = cJSON_PrintUnformatted(tools);
        int rc = grammar_compile(text, strlen(text), NULL, g);
        if (rc == NEEDLE_OK) { /* validate against what was compiled: printing rounds numbers */
            cJSON_Delete(tools);
            tools = cJSON_Parse(text);
            free(text);
            return tools;
        }
        CHECK_MSG(rc == NEEDLE_ERR_SCHEMA, "unexpected status %d: %s", rc, needle_last_error());
        if (rc != NEEDLE_ERR_SCHEMA) {
            fprintf(stderr, "  tools: %s\n", text);
            free(text);
            cJSON_Delete(tools);
            return NULL;
        }
        (*rejected)++;
        free(text);
        cJSON_Delete(tools);
    }
}

/* ---- walks ----------------------------------------------------------------------------- */

/* Picks among allowed bytes: uniformly before `soft` bytes, then preferring bytes that close
 * something and avoiding bytes that open, so that every walk ends. */
static int pick_byte(const uint8_t *allowed, size_t len, size_t soft) {
    int cand[256], n = 0;
    if (len >= soft) {
        if (rnd(10)) {
            for (int b = 0; b < 256; b++)
                if (allowed[b] && (b == '"' || b == ']' || b == '}')) cand[n++] = b;
        }
        if (!n)
            for (int b = 0; b < 256; b++)
                if (allowed[b] && b != '[' && b != '{' && b != '\\' && b < 0x80) cand[n++] = b;
    }
    if (!n)
        for (int b = 0; b < 256; b++)
            if (allowed[b]) cand[n++] = b;
    return n ? cand[rnd((uint32_t)n)] : -1;
}

static void allowed_bytes(const grammar *g, const grammar_state *st, uint8_t *allowed) {
    for (int b = 0; b < 256; b++) {
        grammar_state tmp;
        grammar_state_copy(&tmp, st);
        allowed[b] = (uint8_t)grammar_accept_byte(g, &tmp, (uint8_t)b);
    }
}

#define WALK_CAP 20000

static int completions;

/* grammar_complete from the state after prefix[0, len): the completion must be accepted,
 * end the array, and the whole text must satisfy the schemas. */
static void check_completion(const grammar *g, const grammar_state *st, const char *prefix, size_t len,
                             const cJSON *tools) {
    static char text[WALK_CAP + 8192];
    size_t n = 0;
    grammar_state s = *st;
    memcpy(text, prefix, len);
    int rc = grammar_complete(g, st, text + len, 8192, &n);
    completions++;
    text[len + n] = 0;
    CHECK_MSG(rc == NEEDLE_OK, "grammar_complete: %s after %.300s", needle_last_error(), text);
    CHECK_MSG(grammar_accept_bytes(g, &s, text + len, n) && grammar_is_complete(g, &s), "completion refused: %.400s",
              text);
    char why[64] = "";
    int ok = validate_output(text, len + n, tools, why, sizeof why);
    CHECK_MSG(ok, "completed text %s: %.400s", why, text);
    if (!ok) {
        char *t = cJSON_PrintUnformatted(tools);
        fprintf(stderr, "  tools: %.1500s\n", t);
        free(t);
    }
}

/* One byte-level walk; returns its length, or 0 after recording a failure. Every 7th
 * state is also completed with grammar_complete. */
static size_t byte_walk(const grammar *g, char *out, size_t soft, const cJSON *tools) {
    grammar_state st;
    grammar_state_init(g, &st);
    size_t len = 0;
    uint8_t allowed[256];
    while (!grammar_is_complete(g, &st)) {
        if (len % 7 == 3) check_completion(g, &st, out, len, tools);
        allowed_bytes(g, &st, allowed);
        int b = pick_byte(allowed, len, soft);
        if (b < 0 || len + 1 >= WALK_CAP) {
            out[len] = 0;
            CHECK_MSG(0, "%s after %zu bytes: %.300s", b < 0 ? "dead end" : "walk too long", len, out);
            return 0;
        }
        CHECK(grammar_accept_byte(g, &st, (uint8_t)b));
        out[len++] = (char)b;
    }
    out[len] = 0;
    return len;
}

static void byte_walks(uint64_t seed, int n_schemas) {
    static char out[WALK_CAP];
    int rejected = 0, walks = 0;
    size_t total = 0;
    rng = seed;
    for (int i = 0; i < n_schemas; i++) {
        grammar *g = NULL;
        cJSON *tools = gen_tools(&g, &rejected);
        if (!tools) continue;
        for (int w = 0; w < 4; w++) {
            size_t len = byte_walk(g, out, rnd(2) ? 40 : 400, tools);
            char why[64] = "";
            if (len) {
                walks++;
                total += len;
                int ok = validate_output(out, len, tools, why, sizeof why);
                CHECK_MSG(ok, "schema %d: %s\n  output: %.400s", i, why, out);
                if (!ok) {
                    char *t = cJSON_PrintUnformatted(tools);
                    fprintf(stderr, "  tools: %.1500s\n", t);
                    free(t);
                }
            }
        }
        grammar_free(g);
        cJSON_Delete(tools);
    }
    printf("     %d byte walks, %zu bytes, %d completions; %d random tool sets refused as impossible\n", walks,
           total, completions, rejected);
    CHECK(rejected < n_schemas);
}

static void test_random_byte_walks(void) { byte_walks(WALK_SEED, WALK_SCHEMAS); }

/* Unions of objects: outputs must be valid against one alternative (exactly one for
 * oneOf), from walks and from completions of their prefixes. */
static void test_union_byte_walks(void) {
    gen_unions = 1;
    unions_made = 0;
    byte_walks(WALK_SEED + 2, WALK_SCHEMAS / 2);
    printf("     %d object unions generated\n", unions_made);
    CHECK(unions_made > WALK_SCHEMAS / 4);
    gen_unions = 0;
}

/* A synthetic vocabulary: every single byte (so a token walk can always follow the byte
 * walk) plus fragments that cut across JSON structure, escapes and UTF-8 sequences. */
static char **synthetic_vocab(uint32_t *n_out, size_t **lens_out) {
    static const char *const frags[] = {
        "{\"", "\":\"", "\",\"", "\":", "},{\"", "\"}", "\"]", "]}", "}]", "[{\"name\":\"", "\",\"arguments\":{",
        "\"arguments\"", "true", "false", "null", "nul", "-1", "0.", "1.5", "e+", "e-0", "12", "00", "\\u00",
        "\\ud83d", "\\ude00", "\\n", "\\\"", "\xc3\xa9", "\xc3", "\xa9", "\xf0\x9f", "\x98\x80", "tool", "city",
        "na\xc3\xafve", "q\\\"t", "x y", " ", "2024-", "-01", "T10:", ":00", "Z\"", "@", ".com", "http://",
        "abc", "ab", "cd", "foo", "baz", "\"\"", "[]", "{}", "[1,", ",\"", "\xce\xb1", "$1", ".25"};
    uint32_t nf = sizeof frags / sizeof frags[0], n = 256 + nf + 900, k = 0;
    char **v = malloc(n * sizeof *v);
    size_t *lens = malloc(n * sizeof *lens);
    for (int b = 0; b < 256; b++) {
        v[k] = malloc(2);
        v[k][0] = (char)b;
        lens[k++] = 1;
    }
    for (uint32_t i = 0; i < nf; i++) {
        v[k] = strdup(frags[i]);
        lens[k++] = strlen(frags[i]);
    }
    while (k < n) { /* two or three fragments glued together */
        char buf[128] = "";
        for (uint32_t j = 0, m = 2 + rnd(2); j < m; j++) strcat(buf, frags[rnd(nf)]);
        v[k] = strdup(buf);
        lens[k++] = strlen(buf);
    }
    *n_out = n;
    *lens_out = lens;
    return v;
}

static void token_walks(uint64_t seed, int n_schemas) {
    rng = seed;
    uint32_t n_tok;
    size_t *lens;
    char **vocab = synthetic_vocab(&n_tok, &lens);
    grammar_trie *trie = NULL;
    CHECK(grammar_trie_build((const char *const *)vocab, lens, n_tok, &trie) == NEEDLE_OK);
    if (!trie) return;
    CHECK_EQ_INT(grammar_trie_size(trie), n_tok);
    uint8_t *allowed = malloc(n_tok);
    static char out[WALK_CAP];
    int rejected = 0, walks = 0, masks = 0, mismatches = 0;
    for (int i = 0; i < n_schemas; i++) {
        grammar *g = NULL;
        cJSON *tools = gen_tools(&g, &rejected);
        if (!tools) continue;
        for (int w = 0; w < 3; w++) {
            grammar_state st;
            grammar_state_init(g, &st);
            size_t len = 0;
            int failed = 0;
            while (!grammar_is_complete(g, &st) && !failed) {
                uint32_t count = grammar_mask(g, &st, trie, allowed), brute = 0;
                masks++;
                for (uint32_t t = 0; t < n_tok; t++) { /* the brute-force check */
                    grammar_state tmp;
                    grammar_state_copy(&tmp, &st);
                    int ok = grammar_accept_bytes(g, &tmp, vocab[t], lens[t]);
                    brute += (uint32_t)ok;
                    if (ok != allowed[t] && mismatches++ < 5)
                        CHECK_MSG(0, "mask says %d, brute force %d for token %u after %.200s", allowed[t], ok, t, out);
                }
                CHECK_EQ_INT(count, brute);
                if (!count || len + 64 >= WALK_CAP) {
                    out[len] = 0;
                    CHECK_MSG(0, "token walk stuck after %zu bytes: %.300s", len, out);
                    failed = 1;
                    break;
                }
                uint32_t pick = 0;
                if (len < 300 && rnd(4)) { /* any allowed token */
                    uint32_t r = rnd(count);
                    for (pick = 0; pick < n_tok; pick++)
                        if (allowed[pick] && !r--) break;
                } else { /* steer with the byte policy through the single-byte tokens */
                    uint8_t ab[256];
                    allowed_bytes(g, &st, ab);
                    pick = (uint32_t)pick_byte(ab, len, 300);
                }
                CHECK(grammar_accept_bytes(g, &st, vocab[pick], lens[pick]));
                memcpy(out + len, vocab[pick], lens[pick]);
                len += lens[pick];
                out[len] = 0;
            }
            if (failed) continue;
            walks++;
            char why[64] = "";
            int ok = validate_output(out, len, tools, why, sizeof why);
            CHECK_MSG(ok, "%s: %.400s", why, out);
            if (!ok) {
                char *t = cJSON_PrintUnformatted(tools);
                fprintf(stderr, "  tools: %.1500s\n", t);
                free(t);
            }
            CHECK_EQ_INT(grammar_mask(g, &st, trie, allowed), 0); /* nothing after the end */
        }
        grammar_free(g);
        cJSON_Delete(tools);
    }
    printf("     %d token walks, %d masks checked against brute force\n", walks, masks);
    free(allowed);
    grammar_trie_free(trie);
    for (uint32_t t = 0; t < n_tok; t++) free(vocab[t]);
    free(vocab);
    free(lens);
}

static void test_random_token_walks(void) { token_walks(WALK_SEED + 1, TOKEN_SCHEMAS); }

static void test_union_token_walks(void) {
    gen_unions = 1;
    token_walks(WALK_SEED + 3, TOKEN_SCHEMAS / 2);
    gen_unions = 0;
}

int main(void) {
    RUN(test_random_byte_walks);
    RUN(test_random_token_walks);
    RUN(test_union_byte_walks);
    RUN(test_union_token_walks);
    return test_summary();
}
