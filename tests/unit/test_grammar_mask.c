/* grammar_mask on the real Needle 2 vocabulary (tests/data/bpe8192_token_bytes.hex, 8192
 * tokens): at states collected from random walks over realistic tools (unions of objects
 * among them), the trie walk must allow exactly the tokens the brute-force per-token
 * check allows. Also prints the mask
 * time (mean and worst over the collected states); this file asserts no timing, because
 * sanitizer builds are an order of magnitude slower. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "harness.h"
#include "needle.h"

static uint64_t rng = 42;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 11) % n);
}

/* CPU time of this thread, so that the printed timing does not depend on machine load. */
static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static char *data_path(const char *name) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/../data/%s", fixture_dir(), name);
    return path;
}

typedef struct vocab { uint32_t n; char **bytes; size_t *lens; } vocab;

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

static int load_vocab(vocab *v) {
    char *text = (char *)read_file(data_path("bpe8192_token_bytes.hex"), NULL);
    if (!text) return 0;
    v->n = 0;
    v->bytes = malloc(8192 * sizeof *v->bytes);
    v->lens = malloc(8192 * sizeof *v->lens);
    for (char *line = text; *line && v->n < 8192;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (line[0] != '#') {
            v->lens[v->n] = n / 2;
            v->bytes[v->n] = malloc(n / 2 + 1);
            for (size_t i = 0; i < n / 2; i++) v->bytes[v->n][i] = (char)(hexval(line[2 * i]) << 4 | hexval(line[2 * i + 1]));
            v->n++;
        }
        line += n + (end != NULL);
    }
    free(text);
    return 1;
}

static const char *const TOOLS =
    "[{\"name\":\"get_weather\",\"description\":\"Current weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"City\"},\"unit\":{\"type\":\"string\","
    "\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},"
    "\"required\":[\"location\"]}},"
    "{\"name\":\"create_event\",\"parameters\":{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\","
    "\"maxLength\":80},\"date\":{\"type\":\"string\",\"format\":\"date\"},\"start\":{\"type\":\"string\",\"format\":"
    "\"time\"},\"attendees\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"email\"},\"maxItems\":8},"
    "\"priority\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":0,\"maximum\":5},{\"type\":\"null\"}]}},"
    "\"required\":[\"title\",\"date\"]}},"
    "{\"name\":\"set_location\",\"parameters\":{\"type\":\"object\",\"properties\":{\"lat\":{\"type\":\"number\","
    "\"minimum\":-90,\"maximum\":90},\"lon\":{\"type\":\"number\",\"minimum\":-180,\"maximum\":180},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true},\"meta\":{\"type\":\"object\"},"
    "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,5}$\"}},\"required\":[\"lat\",\"lon\"]}},"
    "{\"name\":\"send_message\",\"parameters\":{\"type\":\"object\",\"properties\":{\"to\":{\"type\":\"string\"},"
    "\"body\":{\"type\":\"string\"},\"amount\":{\"type\":\"number\",\"multipleOf\":0.01}},\"required\":[\"to\",\"body\"]}},"
    /* unions of objects: a const discriminator, and required keys (test_grammar_union.c) */
    "{\"name\":\"adopt\",\"parameters\":{\"type\":\"object\",\"properties\":{\"pet\":{\"oneOf\":["
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"cat\"},\"name\":{\"type\":\"string\"},"
    "\"lives\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9}},\"required\":[\"kind\",\"lives\"]},"
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"dog\"},\"name\":{\"type\":\"string\"},"
    "\"breed\":{\"type\":\"string\"}},\"required\":[\"kind\"]}]},\"home\":{\"anyOf\":["
    "{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"street\"]},{\"type\":\"object\",\"properties\":{\"lat\":{\"type\":\"number\"},"
    "\"lon\":{\"type\":\"number\"},\"city\":{\"type\":\"string\"}},\"required\":[\"lat\",\"lon\"]},"
    "{\"type\":\"null\"}]}},\"required\":[\"pet\"]}}]";

#define MAX_STATES 1500

/* Random byte walks (uniform over allowed bytes, closing after 120 bytes); every state on
 * the way is kept. */
static uint32_t collect_states(const grammar *g, grammar_state *states, uint32_t cap) {
    uint32_t n = 0;
    while (n < cap) {
        grammar_state st;
        grammar_state_init(g, &st);
        size_t len = 0;
        while (!grammar_is_complete(g, &st) && n < cap) {
            states[n++] = st;
            int cand[256], k = 0, closers = 0;
            for (int b = 0; b < 256; b++) {
                grammar_state tmp = st;
                if (!grammar_accept_byte(g, &tmp, (uint8_t)b)) continue;
                int closer = b == '"' || b == '}' || b == ']';
                if (len > 120 && closer && !closers) k = 0, closers = 1;
                if (!closers || closer) cand[k++] = b;
            }
            CHECK(k > 0);
            if (!k) return n;
            grammar_accept_byte(g, &st, (uint8_t)cand[rnd((uint32_t)k)]);
            len++;
        }
    }
    return n;
}

static void test_real_vocab(void) {
    vocab v;
    if (!load_vocab(&v)) {
        CHECK_MSG(0, "missing %s", data_path("bpe8192_token_bytes.hex"));
        return;
    }
    CHECK_EQ_INT(v.n, 8192);
    grammar_trie *trie = NULL;
    double t0 = now_us();
    CHECK(grammar_trie_build((const char *const *)v.bytes, v.lens, v.n, &trie) == NEEDLE_OK);
    double build_us = now_us() - t0;
    grammar *g = NULL;
    CHECK(grammar_compile(TOOLS, strlen(TOOLS), NULL, &g) == NEEDLE_OK);
    if (!trie || !g) return;
    grammar_state *states = malloc(MAX_STATES * sizeof *states);
    uint32_t n = collect_states(g, states, MAX_STATES);
    uint8_t *allowed = malloc(v.n);
    int mismatches = 0;
    uint64_t total_allowed = 0;
    double brute_us = 0;
    uint32_t brute_n = 0;
    for (uint32_t i = 0; i < n; i += 3) { /* mask versus brute force */
        uint32_t count = grammar_mask(g, &states[i], trie, allowed), brute = 0;
        total_allowed += count;
        double b0 = now_us();
        for (uint32_t t = 0; t < v.n; t++) {
            grammar_state tmp;
            grammar_state_copy(&tmp, &states[i]);
            int ok = v.lens[t] > 0 && grammar_accept_bytes(g, &tmp, v.bytes[t], v.lens[t]);
            brute += (uint32_t)ok;
            if (ok != allowed[t] && mismatches++ < 5) CHECK_MSG(0, "state %u token %u: mask %d brute %d", i, t, allowed[t], ok);
        }
        brute_us += now_us() - b0;
        brute_n++;
        CHECK_EQ_INT(count, brute);
        CHECK(count > 0); /* single bytes are tokens too, so something is always allowed */
    }
    double sum = 0, worst = 0;
    for (int pass = 0; pass < 2; pass++) /* timing: every state, second pass measured */
        for (uint32_t i = 0; i < n; i++) {
            double m0 = now_us();
            grammar_mask(g, &states[i], trie, allowed);
            double dt = now_us() - m0;
            if (pass) {
                sum += dt;
                if (dt > worst) worst = dt;
            }
        }
    printf("     vocab %u tokens, trie built in %.0f us; %u states (mean %.0f tokens allowed)\n", v.n, build_us, n,
           (double)total_allowed / (brute_n ? brute_n : 1));
    printf("     grammar_mask: %.1f us mean, %.1f us worst; brute force: %.1f us mean\n", sum / n, worst,
           brute_us / (brute_n ? brute_n : 1));
    free(allowed);
    free(states);
    grammar_free(g);
    grammar_trie_free(trie);
    for (uint32_t t = 0; t < v.n; t++) free(v.bytes[t]);
    free(v.bytes);
    free(v.lens);
}

int main(void) {
    RUN(test_real_vocab);
    return test_summary();
}
