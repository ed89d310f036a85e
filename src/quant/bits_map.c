/* Bits maps, following quantize.py's regular expressions one by one (see bits_map.h).
 * Width values follow Python: a value whose float() equals 1.58 is ternary, anything else
 * must be an integer literal (int() accepts surrounding spaces, a sign, leading zeros). */
#include "quant/bits_map.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/cq_codebook.h"
#include "util/error.h"

static int starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* replaces every occurrence of `from` in buf by `to` (to no longer than from) */
static void replace_all(char *buf, const char *from, const char *to) {
    const size_t lf = strlen(from), lt = strlen(to);
    char *p = buf;
    while ((p = strstr(p, from)) != NULL) {
        memmove(p + lt, p + lf, strlen(p + lf) + 1);
        memcpy(p, to, lt);
        p += lt;
    }
}

int bits_map_canonical(const char *name, char *out, size_t cap) {
    char buf[2 * BITS_MAP_MAX_KEY + 16];
    const size_t len = strlen(name);
    if (len >= BITS_MAP_MAX_KEY) return -1;
    /* ^layer\d+\. -> attn. */
    size_t i = 0;
    if (starts(name, "layer")) {
        i = 5;
        while (isdigit((unsigned char)name[i])) i++;
        if (i > 5 && name[i] == '.') {
            snprintf(buf, sizeof buf, "attn.%s", name + i + 1);
        } else {
            snprintf(buf, sizeof buf, "%s", name);
        }
    } else {
        snprintf(buf, sizeof buf, "%s", name);
    }
    /* ^engrams?_?(\d+)[./]? -> engram\1. */
    if (starts(buf, "engram")) {
        size_t j = 6;
        if (buf[j] == 's') j++;
        if (buf[j] == '_') j++;
        const size_t d0 = j;
        while (isdigit((unsigned char)buf[j])) j++;
        if (j > d0) {
            char tmp[sizeof buf];
            const size_t rest = (buf[j] == '.' || buf[j] == '/') ? j + 1 : j;
            snprintf(tmp, sizeof tmp, "engram%.*s.%s", (int)(j - d0), buf + d0, buf + rest);
            memcpy(buf, tmp, sizeof buf);
        }
    }
    if (starts(buf, "stack/")) memmove(buf, buf + 6, strlen(buf + 6) + 1);
    replace_all(buf, "layers/block/self_attn/", "attn.");
    replace_all(buf, "mtp_block/self_attn/", "mtp.");
    const size_t bl = strlen(buf);
    if (bl >= 7 && !strcmp(buf + bl - 7, "/kernel")) buf[bl - 7] = '\0';
    if (!strcmp(buf, "embedding/embedding")) strcpy(buf, "embedding");
    /* ^(engram\d+\.)embedding$ -> \1tables */
    if (starts(buf, "engram")) {
        size_t j = 6;
        while (isdigit((unsigned char)buf[j])) j++;
        if (j > 6 && buf[j] == '.' && !strcmp(buf + j + 1, "embedding")) strcpy(buf + j + 1, "tables");
    }
    for (char *p = buf; *p; p++)
        if (*p == '/') *p = '.';
    if (strlen(buf) >= cap) return -1;
    strcpy(out, buf);
    return 0;
}

static int parse_width(const char *v, uint32_t *bits) {
    char *end;
    errno = 0;
    const double f = strtod(v, &end);
    while (isspace((unsigned char)*end)) end++;
    if (end != v && !*end && !errno && f == 1.58) {
        *bits = CQ_TERNARY;
        return 0;
    }
    const char *p = v;
    while (isspace((unsigned char)*p)) p++;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) return -1;
    errno = 0;
    const long n = strtol(v, &end, 10);
    while (isspace((unsigned char)*end)) end++;
    if (*end || errno) return -1;
    if (n != 2 && n != 3 && n != 4) return -2;
    *bits = (uint32_t)n;
    return 0;
}

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    size_t i = 0;
    while (isspace((unsigned char)s[i])) i++;
    memmove(s, s + i, n - i + 1);
}

int bits_map_parse(const char *spec, bits_map *out) {
    memset(out, 0, sizeof *out);
    if (!spec) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "no bits map");
    /* a bare width is the default */
    if (!strchr(spec, '=') && !strchr(spec, ',')) {
        uint32_t b;
        const int st = parse_width(spec, &b);
        if (st)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "bits '%s': widths are 2, 3, 4 or 1.58", spec);
        out->default_bits = b;
        return 0;
    }
    const char *p = spec;
    while (*p) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char part[256];
        if (len >= sizeof part)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "bits map entry too long: '%.40s...'", p);
        memcpy(part, p, len);
        part[len] = '\0';
        p += len + (comma ? 1 : 0);
        char stripped[256];
        strcpy(stripped, part);
        trim(stripped);
        if (!stripped[0]) continue;
        char *eq = strchr(part, '=');
        if (!eq) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "bits map entry '%s' has no '='", stripped);
        *eq = '\0';
        char *key = part, *val = eq + 1;
        trim(key);
        uint32_t b;
        const int st = parse_width(val, &b);
        if (st == -1)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "bits map entry '%s': '%s' is not a width",
                               stripped, val);
        if (st == -2)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT,
                               "bits map entry '%s': unsupported width (2, 3, 4 or 1.58)", stripped);
        if (!strcmp(key, "default")) {
            out->default_bits = b;
            continue;
        }
        char canon[BITS_MAP_MAX_KEY];
        if (bits_map_canonical(key, canon, sizeof canon))
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "bits map key '%.40s' is too long", key);
        uint32_t i;
        for (i = 0; i < out->n; i++)
            if (!strcmp(out->entries[i].key, canon)) break;
        if (i == out->n) {
            if (out->n == BITS_MAP_MAX_ENTRIES)
                return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "bits map has more than %d entries",
                                   BITS_MAP_MAX_ENTRIES);
            strcpy(out->entries[out->n++].key, canon);
        }
        out->entries[i].bits = b;
    }
    if (!out->default_bits)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "bits map '%s' needs a default=<b> entry", spec);
    return 0;
}

uint32_t bits_map_lookup(const bits_map *m, const char *name) {
    char canon[BITS_MAP_MAX_KEY];
    if (bits_map_canonical(name, canon, sizeof canon)) return m->default_bits;
    size_t best_len = 0;
    uint32_t bits = m->default_bits;
    int found = 0;
    for (uint32_t i = 0; i < m->n; i++) {
        const size_t kl = strlen(m->entries[i].key);
        if (!strncmp(canon, m->entries[i].key, kl) && (!found || kl > best_len)) {
            best_len = kl;
            bits = m->entries[i].bits;
            found = 1;
        }
    }
    return bits;
}

const char *bits_map_width_name(uint32_t bits) {
    switch (bits) {
    case 2: return "2";
    case 3: return "3";
    case 4: return "4";
    case CQ_TERNARY: return "1.58";
    default: return "?";
    }
}
