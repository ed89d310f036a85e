/* libFuzzer target for the schema compiler and the recognizer (src/grammar/).
 *
 * Input: a tools JSON, optionally followed by a NUL byte and call-array text. Any tools
 * JSON must compile or fail with a status. When it compiles, the text after the NUL is fed
 * byte by byte until the first refusal; from the state reached the recognizer's
 * invariants are checked:
 *   - grammar_complete finishes the array (no dead ends), and the bytes read plus the
 *     completion parse as a JSON array;
 *   - the token mask agrees with grammar_accept_bytes for every token of a small
 *     vocabulary (every single byte and a few multi-byte pieces).
 * A violated invariant aborts (a finding), as a sanitizer report would. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "needle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TEXT 4096

static const char *const PIECES[] = {"\"", "\":", "\",\"", "{\"", "\"}", "[]", "[{", "}]", "}}]",
                                     "{\"name\":", ",\"arguments\":", "true", "false", "null",
                                     "\\u00e9", "\\ud83d\\ude00", "\xc3\xa9", "\xf0\x9f\x98\x80",
                                     "12", "-0.5", "1e+5", "abc", " ", ",", ":"};
#define N_PIECES (sizeof PIECES / sizeof PIECES[0])
#define N_TOKENS (256 + N_PIECES)

static grammar_trie *vocab_trie(const char *tok[N_TOKENS], size_t len[N_TOKENS]) {
    static grammar_trie *trie;
    static char single[256];
    static const char *toks[N_TOKENS];
    static size_t lens[N_TOKENS];
    if (!trie) {
        for (int i = 0; i < 256; i++) {
            single[i] = (char)i;
            toks[i] = &single[i];
            lens[i] = 1;
        }
        for (size_t i = 0; i < N_PIECES; i++) {
            toks[256 + i] = PIECES[i];
            lens[256 + i] = strlen(PIECES[i]);
        }
        if (grammar_trie_build(toks, lens, N_TOKENS, &trie) != NEEDLE_OK) abort();
    }
    memcpy(tok, toks, sizeof toks);
    memcpy(len, lens, sizeof lens);
    return trie;
}

static void check_state(const grammar *g, const grammar_state *st, const char *read, size_t n_read) {
    static char text[MAX_TEXT + 65536];
    size_t n_done = 0;
    memcpy(text, read, n_read);
    int rc = grammar_complete(g, st, text + n_read, sizeof text - n_read - 1, &n_done);
    if (rc == NEEDLE_ERR_BUFFER_TOO_SMALL) return; /* a legitimately long completion */
    if (rc != NEEDLE_OK) {
        fprintf(stderr, "grammar_complete failed: %d %s\n", rc, needle_last_error());
        abort();
    }
    grammar_state end;
    grammar_state_copy(&end, st);
    if (!grammar_accept_bytes(g, &end, text + n_read, n_done) || !grammar_is_complete(g, &end)) {
        fprintf(stderr, "completion refused or incomplete\n");
        abort();
    }
    text[n_read + n_done] = 0;
    cJSON *v = cJSON_Parse(text);
    if (!cJSON_IsArray(v)) {
        fprintf(stderr, "completed text is not a JSON array: %s\n", text);
        abort();
    }
    cJSON_Delete(v);

    const char *tok[N_TOKENS];
    size_t len[N_TOKENS];
    grammar_trie *trie = vocab_trie(tok, len);
    static uint8_t allowed[N_TOKENS];
    uint32_t n_allowed = grammar_mask(g, st, trie, allowed), count = 0;
    for (uint32_t i = 0; i < N_TOKENS; i++) {
        grammar_state probe;
        grammar_state_copy(&probe, st);
        int ok = grammar_accept_bytes(g, &probe, tok[i], len[i]);
        if (ok != allowed[i]) {
            fprintf(stderr, "mask says %d, accept_bytes says %d for token %u\n", allowed[i], ok, i);
            abort();
        }
        count += (uint32_t)ok;
    }
    if (count != n_allowed) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t tools_len = nul ? (size_t)(nul - data) : size;
    grammar *g = NULL;
    if (grammar_compile((const char *)data, tools_len, NULL, &g) != NEEDLE_OK) return 0;
    grammar_state st;
    grammar_state_init(g, &st);
    const char *text = nul ? (const char *)nul + 1 : "";
    size_t n_text = nul ? size - tools_len - 1 : 0, n_read = 0;
    if (n_text > MAX_TEXT) n_text = MAX_TEXT;
    while (n_read < n_text && grammar_accept_byte(g, &st, (uint8_t)text[n_read])) n_read++;
    check_state(g, &st, text, n_read);
    grammar_free(g);
    return 0;
}
