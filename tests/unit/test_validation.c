/* The envelope's "validation" (agent/validation.h), in both directions:
 * 1. negation: negated requests in several phrasings ("don't", "do not", "never", "no need
 *    to", "stop ... from", with fillers and a subject first, curly apostrophes) are flagged;
 *    requests that merely hold a negative word ("it's not done yet, set a timer"), a cue
 *    over a non-action ("don't forget to"), a mode named "do not disturb", or a negated
 *    clause beside an imperative one are not.
 * 2. ungrounded: strings copied from the input (case, spacing, punctuation, diacritics as
 *    typed either way), numbers in digits, words, units and clock forms, enum values said
 *    or said by a synonym, booleans, defaults, consts, dates and times are grounded;
 *    invented strings, numbers and enum values are flagged with their tool.path, nested
 *    paths and array indices included; the system facts count as input, the auto date
 *    fact does not.
 * 3. needle_validate_calls (the public entry), a real envelope on the demo model and the
 *    CLI's envelope carry it, and every failure envelope has type "error". */
#include <stdlib.h>
#include <string.h>

#include "agent/validation.h"
#include "harness.h"
#include "needle.h"

#ifndef NEEDLE_SOURCE_DIR
#define NEEDLE_SOURCE_DIR "."
#endif

static void test_negated_phrasings(void) {
    static const char *const negated[] = {
        "don't turn on the study lights",
        "Don\xE2\x80\x99t turn on the study lights",
        "do not close the living room blinds",
        "never run the vacuum while I am on a call",
        "please don't set a timer for 20 minutes",
        "I don't want the lights on",
        "no need to turn the fan on",
        "there's no need to set an alarm",
        "stop the vacuum from cleaning the bedroom",
        "let's not play any music",
        "don't pause the song, I love this part",
        "never dismiss notifications from Dr. Patel",
        "don't log the 15.40 i spent on transport",
        "do not turn on the lights and the fan",
        "DO NOT CALL MOM",
        "you shouldn't send that email",
        "do not, under any circumstances, close the blinds",
        "never, ever play Baby Shark again",
    };
    for (size_t i = 0; i < sizeof negated / sizeof *negated; i++)
        CHECK_MSG(validation_negated(negated[i]), "not flagged: %s", negated[i]);
}

static void test_not_negated_phrasings(void) {
    static const char *const plain[] = {
        "it's not done yet, set a timer for 5 minutes",
        "set a timer for 5 minutes, it's not done yet",
        "don't forget to set an alarm for 7",
        "don't worry, just turn on the lights",
        "turn on do not disturb",
        "turn off the lights but don't close the blinds",
        "turn off the lights, don't close the blinds",
        "stop the robot vacuum",
        "remind me not to eat late",
        "play something that is not jazz",
        "I can't find my phone, make it ring",
        "never mind the lights, set the thermostat to 20",
        "",
    };
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        CHECK_MSG(!validation_negated(plain[i]), "flagged: %s", plain[i]);
    CHECK(!validation_negated(NULL));
}

static const char *TOOLS =
    "[{\"name\":\"control_lights\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"room\":{\"type\":\"string\",\"enum\":[\"kitchen\",\"living_room\",\"bedroom\"]},"
    "\"action\":{\"type\":\"string\",\"enum\":[\"on\",\"off\",\"dim\"]},"
    "\"brightness\":{\"type\":\"integer\"},\"color\":{\"type\":\"string\"},"
    "\"fade\":{\"type\":\"boolean\"},\"mode\":{\"type\":\"string\",\"default\":\"normal\"},"
    "\"kind\":{\"type\":\"string\",\"const\":\"light\"}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"send\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"to\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"body\":{\"type\":\"string\"},\"when\":{\"type\":\"string\",\"format\":\"date-time\"},"
    "\"meta\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"seconds\":{\"type\":\"number\"}}}}}}},"
    "{\"name\":\"timer\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"seconds\":{\"type\":\"integer\"},\"minutes\":{\"type\":\"number\"},"
    "\"hour\":{\"type\":\"integer\"},\"grams\":{\"type\":\"number\"},"
    "\"ratio\":{\"type\":\"number\"},\"at\":{\"type\":\"string\"}}}}]";

/* The "ungrounded" array of calls against system + text, as JSON text. */
static void ungrounded_of(const char *system, const char *text, const char *calls, char *out,
                          size_t cap) {
    strbuf b = {0};
    validation_write(TOOLS, system, text, 1, calls, &b);
    const char *u = b.data ? strstr(b.data, "\"ungrounded\":") : NULL;
    const char *end = u ? strstr(u, "],\"negation\"") : NULL;
    if (u && end && (size_t)(end - u) < cap) {
        size_t n = (size_t)(end - u) - 13 + 1;
        memcpy(out, u + 13, n);
        out[n] = 0;
    } else {
        snprintf(out, cap, "<no ungrounded array: %s>", b.data ? b.data : "(null)");
    }
    free(b.data);
}

#define EXPECT(system, text, calls, want)                                          \
    do {                                                                           \
        char got_[512];                                                            \
        ungrounded_of(system, text, calls, got_, sizeof got_);                     \
        CHECK_MSG(!strcmp(got_, want), "%s | %s -> %s, want %s", text, calls, got_, want); \
    } while (0)

static void test_grounded_values(void) {
    /* strings: case, spacing, punctuation, diacritics either way */
    EXPECT(NULL, "Set the LIGHTS to   Warm White please", "[{\"name\":\"control_lights\",\"arguments\":{\"color\":\"warm white\"}}]", "[]");
    EXPECT(NULL, "text Tomas that I'm late", "[{\"name\":\"send\",\"arguments\":{\"to\":[\"Tom\xC3\xA1s\"],\"body\":\"I'm late\"}}]", "[]");
    EXPECT(NULL, "text Tom\xC3\xA1s: running late!", "[{\"name\":\"send\",\"arguments\":{\"to\":[\"tomas\"],\"body\":\"running late\"}}]", "[]");
    EXPECT(NULL, "email nadia@osei.dev, call 917-555-0188", "[{\"name\":\"send\",\"arguments\":{\"to\":[\"nadia@osei.dev\",\"917-555-0188\"]}}]", "[]");
    /* enums: the value, a word form, underscores as spaces, synonyms */
    EXPECT(NULL, "turn on the kitchen lights", "[{\"name\":\"control_lights\",\"arguments\":{\"room\":\"kitchen\",\"action\":\"on\"}}]", "[]");
    EXPECT(NULL, "dim the living room lights", "[{\"name\":\"control_lights\",\"arguments\":{\"room\":\"living_room\",\"action\":\"dim\"}}]", "[]");
    EXPECT(NULL, "enable the bedroom lamp", "[{\"name\":\"control_lights\",\"arguments\":{\"room\":\"bedroom\",\"action\":\"on\"}}]", "[]");
    EXPECT(NULL, "shut off the kitchen", "[{\"name\":\"control_lights\",\"arguments\":{\"room\":\"kitchen\",\"action\":\"off\"}}]", "[]");
    /* numbers: digits, separators, words, units, clock forms, percent */
    EXPECT(NULL, "brightness 35 percent", "[{\"name\":\"control_lights\",\"arguments\":{\"brightness\":35}}]", "[]");
    EXPECT(NULL, "a timer for twenty five minutes", "[{\"name\":\"timer\",\"arguments\":{\"minutes\":25,\"seconds\":1500}}]", "[]");
    EXPECT(NULL, "timer: 1,500 seconds", "[{\"name\":\"timer\",\"arguments\":{\"seconds\":1500,\"minutes\":25}}]", "[]");
    EXPECT(NULL, "half an hour", "[{\"name\":\"timer\",\"arguments\":{\"minutes\":30,\"seconds\":1800}}]", "[]");
    EXPECT(NULL, "wake me at 5pm", "[{\"name\":\"timer\",\"arguments\":{\"hour\":17}}]", "[]");
    EXPECT(NULL, "wake me at 9:15 p.m.", "[{\"name\":\"timer\",\"arguments\":{\"hour\":21}}]", "[]");
    EXPECT(NULL, "1.5 kg of flour", "[{\"name\":\"timer\",\"arguments\":{\"grams\":1500}}]", "[]");
    EXPECT(NULL, "a dozen eggs, 25% off", "[{\"name\":\"timer\",\"arguments\":{\"seconds\":12,\"ratio\":0.25}}]", "[]");
    EXPECT(NULL, "set it to -3", "[{\"name\":\"timer\",\"arguments\":{\"seconds\":-3}}]", "[]");
    EXPECT(NULL, "one hundred and fifty", "[{\"name\":\"timer\",\"arguments\":{\"seconds\":150}}]", "[]");
    /* exempt: booleans, defaults, consts, formats and clock / ISO shapes, null */
    EXPECT(NULL, "lights", "[{\"name\":\"control_lights\",\"arguments\":{\"fade\":true,\"mode\":\"normal\",\"kind\":\"light\"}}]", "[]");
    EXPECT(NULL, "send it tomorrow", "[{\"name\":\"send\",\"arguments\":{\"when\":\"2026-12-07T09:00:00\"}},{\"name\":\"timer\",\"arguments\":{\"at\":\"17:30\",\"minutes\":null}}]", "[]");
    /* the system facts are input */
    EXPECT("user: Ada Lovelace; city: Z\xC3\xBCrich", "message me", "[{\"name\":\"send\",\"arguments\":{\"to\":[\"Ada Lovelace\"],\"meta\":{\"city\":\"Zurich\"}}}]", "[]");
}

static void test_ungrounded_values(void) {
    /* invented strings, nested paths and array indices */
    EXPECT(NULL, "play some jazz", "[{\"name\":\"send\",\"arguments\":{\"to\":[\"Mom\",\"jazz\"],\"body\":\"hi\"}}]", "[\"send.to[0]\",\"send.body\"]");
    EXPECT(NULL, "what is the weather", "[{\"name\":\"send\",\"arguments\":{\"meta\":{\"city\":\"Paris\",\"seconds\":30}}}]", "[\"send.meta.city\",\"send.meta.seconds\"]");
    /* invented enum values and numbers */
    EXPECT(NULL, "turn on the lights", "[{\"name\":\"control_lights\",\"arguments\":{\"room\":\"kitchen\",\"action\":\"on\"}}]", "[\"control_lights.room\"]");
    EXPECT(NULL, "dim the bedroom lights to 150 percent", "[{\"name\":\"control_lights\",\"arguments\":{\"room\":\"bedroom\",\"action\":\"dim\",\"brightness\":100}}]", "[\"control_lights.brightness\"]");
    EXPECT(NULL, "a timer for 5 minutes", "[{\"name\":\"timer\",\"arguments\":{\"minutes\":50}}]", "[\"timer.minutes\"]");
    /* a word only inside another word is not the value; partial phrases are not copies */
    EXPECT(NULL, "the scatter plot", "[{\"name\":\"send\",\"arguments\":{\"body\":\"cat\"}}]", "[\"send.body\"]");
    EXPECT(NULL, "tell Bob the build is green", "[{\"name\":\"send\",\"arguments\":{\"body\":\"the build is red\"}}]", "[\"send.body\"]");
    /* a value without words copies nothing, even punctuation the input has; nor does "" */
    EXPECT(NULL, "lights", "[{\"name\":\"control_lights\",\"arguments\":{\"color\":\"\"}}]", "[\"control_lights.color\"]");
    EXPECT(NULL, "what now?!", "[{\"name\":\"send\",\"arguments\":{\"body\":\"?!\",\"to\":[\":{\"]}}]", "[\"send.body\",\"send.to[0]\"]");
    /* the auto date fact grounds no number */
    EXPECT("date: 2026-12-06 Sun 10:12; user: Ada", "set a timer", "[{\"name\":\"timer\",\"arguments\":{\"minutes\":12}}]", "[\"timer.minutes\"]");
    /* several calls: each flagged by its own name */
    EXPECT(NULL, "turn off the kitchen lights", "[{\"name\":\"control_lights\",\"arguments\":{\"room\":\"kitchen\",\"action\":\"off\"}},{\"name\":\"control_lights\",\"arguments\":{\"room\":\"bedroom\",\"action\":\"off\"}}]", "[\"control_lights.room\"]");
}

static void test_public_entry(void) {
    char out[256];
    size_t len = 0;
    const char *calls = "[{\"name\":\"control_lights\",\"arguments\":{\"room\":\"bedroom\"}}]";
    CHECK_EQ_INT(needle_validate_calls(TOOLS, NULL, "don't touch the kitchen", NEEDLE_TURN_QUERY,
                                       calls, out, sizeof out, &len), NEEDLE_OK);
    CHECK_MSG(!strcmp(out, "{\"ungrounded\":[\"control_lights.room\"],\"negation\":true}"), "%s", out);
    CHECK_EQ_INT(len, strlen(out));
    /* a tool result is never a negated request */
    CHECK_EQ_INT(needle_validate_calls(TOOLS, NULL, "don't touch the bedroom",
                                       NEEDLE_TURN_TOOL_RESULT, calls, out, sizeof out, &len), NEEDLE_OK);
    CHECK_MSG(!strcmp(out, "{\"ungrounded\":[],\"negation\":false}"), "%s", out);
    /* malformed calls: nothing to flag, never an error */
    CHECK_EQ_INT(needle_validate_calls(TOOLS, NULL, "x", NEEDLE_TURN_QUERY, "[{", out, sizeof out, &len), NEEDLE_OK);
    CHECK_MSG(!strcmp(out, "{\"ungrounded\":[],\"negation\":false}"), "%s", out);
    CHECK_EQ_INT(needle_validate_calls(TOOLS, NULL, "x", NEEDLE_TURN_QUERY, calls, out, 8, &len),
                 NEEDLE_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_INT(len, strlen("{\"ungrounded\":[\"control_lights.room\"],\"negation\":false}"));
    CHECK_EQ_INT(needle_validate_calls(TOOLS, NULL, "x", 1, NULL, out, sizeof out, &len),
                 NEEDLE_ERR_INVALID_ARGUMENT);
}

static void test_envelopes_on_demo(void) {
    needle_model *m = NULL;
    if (needle_model_open(NEEDLE_SOURCE_DIR "/models/needle-demo.cact", NULL, &m) != NEEDLE_OK) {
        harness_skip("no demo model");
        return;
    }
    size_t tsize = 0;
    char *tools = (char *)read_file(NEEDLE_SOURCE_DIR "/models/needle-demo.tools.json", &tsize);
    needle_session *s = NULL;
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 4096; /* the demo's 27 tools need more than the header window */
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    CHECK(tools != NULL);
    if (!s || !tools) goto out;
    CHECK_EQ_INT(needle_session_set_tools(s, NULL, tools), NEEDLE_OK);
    static char env[16384];
    size_t len = 0;
    needle_complete_params p = needle_complete_default_params();
    p.turn = NEEDLE_TURN_QUERY;
    CHECK_EQ_INT(needle_session_complete(s, "don't turn on the kitchen lights", &p, env, sizeof env, &len), NEEDLE_OK);
    CHECK_MSG(strstr(env, "\"negation\":true") != NULL, "%s", env);
    needle_session_reset(s);
    CHECK_EQ_INT(needle_session_complete(s, "turn on the kitchen lights", &p, env, sizeof env, &len), NEEDLE_OK);
    CHECK_MSG(strstr(env, "\"validation\":{\"ungrounded\":[],\"negation\":false}") != NULL, "%s", env);
    /* a failure, whatever kind, is type "error" (here max_tokens) and still validated */
    needle_session_reset(s);
    p.max_new_tokens = 2;
    CHECK_EQ_INT(needle_session_complete(s, "turn on the kitchen lights", &p, env, sizeof env, &len), NEEDLE_OK);
    CHECK_MSG(strstr(env, "\"type\":\"error\"") && strstr(env, "\"error_code\":\"max_tokens\"") &&
                  strstr(env, "\"validation\":{"), "%s", env);
    /* a tool result after the failure's rollback is a query again: invalid UTF-8 input */
    p.max_new_tokens = 0;
    CHECK_EQ_INT(needle_session_complete(s, "bad \xFF byte", &p, env, sizeof env, &len), NEEDLE_OK);
    CHECK_MSG(strstr(env, "\"type\":\"error\"") && strstr(env, "\"invalid_input\""), "%s", env);
    p.turn = NEEDLE_TURN_TOOL_RESULT;
    CHECK_EQ_INT(needle_session_complete(s, "bad \xFF byte", &p, env, sizeof env, &len), NEEDLE_OK);
    CHECK_MSG(strstr(env, "\"type\":\"error\"") && strstr(env, "\"invalid_input\""), "%s", env);
out:
    free(tools);
    needle_session_free(s);
    needle_model_free(m);
}

/* The CLI prints the engine's envelope, validation included. */
static void test_cli_envelope(void) {
    if (getenv("NEEDLE_EMULATED")) { /* as test_cli: the CLI on the demo under qemu is slow */
        harness_skip("the demo model under emulation is slow; covered by the native builds");
        return;
    }
    char cmd[2048];
    static char out[16384];
    const char *demo = NEEDLE_SOURCE_DIR "/models/needle-demo";
    snprintf(cmd, sizeof cmd, "%s run --weights %s.cact --tools %s.tools.json --ctx 4096 "
             "\"don't turn on the kitchen lights\" 2>/dev/null", cli_path(), demo, demo);
    int rc = run_command(cmd, out, sizeof out);
    if (rc == 127 || strstr(out, "not found")) {
        harness_skip("no needle CLI");
        return;
    }
    CHECK_MSG(rc == 0 && strstr(out, "\"validation\":{\"ungrounded\":[") &&
                  strstr(out, "\"negation\":true}"), "rc %d: %s", rc, out);
}

int main(void) {
    RUN(test_negated_phrasings);
    RUN(test_not_negated_phrasings);
    RUN(test_grounded_values);
    RUN(test_ungrounded_values);
    RUN(test_public_entry);
    RUN(test_envelopes_on_demo);
    RUN(test_cli_envelope);
    return test_summary();
}
