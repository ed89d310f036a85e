/* libneedle3 (include/needle3.h) as a client sees it: the library is dlopen()ed and its
 * seven symbols looked up, as the official 3.x ctypes client does, then driven on the v3a
 * fixture: the order of calls, needle_init's prefix length, audio refused with a message,
 * the embedding's size query, reset to the cached prefix, bad arguments. (The official
 * client itself drives it in tests/official_client/run3.sh.) */
#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef int (*load_fn)(const unsigned char *, unsigned long long);
typedef int (*init_fn)(const char *, const char *, const char *);
typedef int (*complete_fn)(const char *, const float *, int, int, char *, int);
typedef int (*embed_fn)(const char *, const float *, int, float *, int);
typedef void (*reset_fn)(void);
typedef const char *(*error_fn)(void);
typedef int (*models_fn)(void);

static const char *TOOLS =
    "[{\"name\":\"get_weather\",\"description\":\"weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}]";

#ifdef NEEDLE3_LIB
static unsigned char *kept_image;
#endif

static void test_abi3(void) {
#ifndef NEEDLE3_LIB
    harness_skip("libneedle3 is not built on this platform");
#else
    void *lib = dlopen(NEEDLE3_LIB, RTLD_NOW | RTLD_LOCAL);
    CHECK_MSG(lib != NULL, "dlopen: %s", dlerror());
    if (!lib) return;
    load_fn load = (load_fn)dlsym(lib, "needle_load");
    init_fn init = (init_fn)dlsym(lib, "needle_init");
    complete_fn complete = (complete_fn)dlsym(lib, "needle_complete");
    embed_fn embed = (embed_fn)dlsym(lib, "needle_embed");
    reset_fn reset = (reset_fn)dlsym(lib, "needle_reset");
    error_fn last_error = (error_fn)dlsym(lib, "needle_last_error");
    models_fn models = (models_fn)dlsym(lib, "needle_models");
    CHECK(load && init && complete && embed && reset && last_error && models);
    CHECK(dlsym(lib, "needle_session_create") == NULL); /* libneedle's API stays inside */
    if (!(load && init && complete && embed && reset && last_error && models)) return;

    char out[8192], first[8192];
    CHECK_EQ_INT(models(), 1);
    CHECK(init("", TOOLS, NULL) < 0); /* nothing loaded: no built-in weights */
    CHECK(strstr(last_error(), "needle_load") != NULL);
    CHECK(complete("hi", NULL, 0, 16, out, sizeof out) < 0);
    CHECK(embed("hi", NULL, 0, NULL, 0) < 0);
    CHECK(load(NULL, 0) < 0);
    const unsigned char junk[64] = {1, 2, 3};
    CHECK(load(junk, sizeof junk) < 0);

    size_t size;
    unsigned char *blob = read_file(fixture_path("v3/v3a.cact"), &size);
    CHECK(blob != NULL);
    if (!blob) return;
    CHECK_EQ_INT(load(blob, size), 0);
    const int bare = init("", "[]", NULL), prefix = init("", TOOLS, NULL);
    CHECK(bare > 0 && prefix > bare); /* the tools are part of the cached prefix */
    CHECK(init("", "[not json", NULL) < 0);
    CHECK(complete("hi", NULL, 0, 16, out, sizeof out) < 0); /* the failed init left none */
    CHECK(init("", TOOLS, NULL) == prefix);

    const float pcm[4] = {0};
    CHECK(complete("weather in Oslo", pcm, 4, 32, out, sizeof out) < 0);
    CHECK(strstr(out, "audio") != NULL);
    CHECK(complete(NULL, NULL, 0, 32, out, sizeof out) < 0);
    CHECK(complete("weather in Oslo", NULL, 0, 48, first, sizeof first) == 0);
    cJSON *env = cJSON_Parse(first);
    CHECK(env != NULL);
    const cJSON *conf = cJSON_GetObjectItem(env, "confidence");
    CHECK(cJSON_IsNumber(conf) && conf->valuedouble >= 0 && conf->valuedouble <= 1);
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(env, "success")));
    reset();
    CHECK(complete("weather in Oslo", NULL, 0, 48, out, sizeof out) == 0);
    /* greedy from the same cached prefix: the same calls and confidence (the timings differ) */
    cJSON *again = cJSON_Parse(out);
    CHECK(again != NULL);
    CHECK(cJSON_Compare(cJSON_GetObjectItem(env, "function_calls"),
                        cJSON_GetObjectItem(again, "function_calls"), 1));
    CHECK(cJSON_Compare(conf, cJSON_GetObjectItem(again, "confidence"), 1));
    cJSON_Delete(again);
    cJSON_Delete(env);

    const int dim = embed("hello", NULL, 0, NULL, 0);
    CHECK_EQ_INT(dim, 128);
    float e[128];
    CHECK_EQ_INT(embed("hello", NULL, 0, e, 128), 128);
    double sq = 0;
    for (int i = 0; i < 128; i++) sq += (double)e[i] * e[i];
    CHECK(fabs(sq - 1.0) < 1e-4);
    CHECK(embed("hello", NULL, 0, e, 127) < 0);
    CHECK(embed("hello", pcm, 4, e, 128) < 0);
    CHECK(embed("\xff", NULL, 0, e, 128) < 0);
    /* a reload drops the conversation: needle_init comes again */
    CHECK_EQ_INT(load(blob, size), 0);
    CHECK(complete("hi", NULL, 0, 16, out, sizeof out) < 0);
    CHECK(embed("hello", NULL, 0, e, 128) == 128); /* embeddings need no conversation */
    /* an aligned image is used in place: it stays alive with the model, to the end */
    kept_image = blob;
    /* no dlclose: the process-global model lives as long as the process, as for the
     * official client (unloading would turn it into a leak report under LeakSanitizer) */
#endif
}

int main(void) {
    RUN(test_abi3);
    return test_summary();
}
