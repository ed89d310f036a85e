/* `needle eval`: the scorer on hand-made pairs with exact metric values (JSON equality,
 * order, extra and missing calls and arguments, refusals, malformed output), the example
 * reader on good and bad lines, then the command end to end on a fixture model: the
 * model's own greedy predictions (taken through the API) are written back as answers, so
 * every metric of the run is known exactly; malformed data fails with the line number. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eval_score.h"
#include "harness.h"
#include "needle.h"

#define CHECK_NEAR(a, b)                                                                 \
    CHECK_MSG(fabs((double)(a) - (double)(b)) < 1e-9, "%s = %.12g, want %.12g", #a,      \
              (double)(a), (double)(b))

static const char *TOOLS =
    "[{\"name\":\"get_weather\",\"description\":\"Current weather for a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":24},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]}},"
    "\"required\":[\"city\"]}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"set_timer\",\"description\":\"Start a timer\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"minutes\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}},"
    "\"required\":[\"minutes\"]}}}]";

static cJSON *tools_json;

static eval_result score(const char *pred, const char *expected) {
    cJSON *p = pred ? cJSON_Parse(pred) : NULL, *e = cJSON_Parse(expected);
    CHECK_MSG(e != NULL, "bad test JSON %s", expected);
    eval_result r = eval_score(p, e, tools_json);
    cJSON_Delete(p);
    cJSON_Delete(e);
    return r;
}

static int equal(const char *a, const char *b) {
    cJSON *x = cJSON_Parse(a), *y = cJSON_Parse(b);
    int eq = x && y && eval_json_equal(x, y);
    cJSON_Delete(x);
    cJSON_Delete(y);
    return eq;
}

static void test_json_equal(void) {
    CHECK(equal("{\"a\":1,\"b\":\"x\"}", "{\"b\":\"x\",\"a\":1}")); /* key order */
    CHECK(equal("2", "2.0") && equal("2", "2e0") && equal("-0.5", "-5e-1"));
    CHECK(!equal("2", "\"2\"") && !equal("1", "true") && !equal("null", "false"));
    CHECK(!equal("\"Lagos\"", "\"lagos\"") && !equal("\"a \"", "\"a\""));
    CHECK(equal("[1,[2,{\"k\":null}]]", "[1.0,[2,{\"k\":null}]]"));
    CHECK(!equal("[1,2]", "[2,1]") && !equal("[1]", "[1,1]"));
    CHECK(!equal("{\"a\":1}", "{\"a\":1,\"b\":2}") && !equal("{\"a\":1}", "{\"A\":1}"));
    CHECK(equal("{}", "{}") && !equal("{}", "[]"));
    CHECK(eval_json_equal(NULL, NULL) && !eval_json_equal(NULL, tools_json));
}

static void test_exact_match(void) {
    /* key order and 2 vs 2.0 do not matter */
    eval_result r = score(
        "[{\"name\":\"get_weather\",\"arguments\":{\"unit\":\"celsius\",\"city\":\"Lagos\"}},"
        "{\"name\":\"set_timer\",\"arguments\":{\"minutes\":2.0}}]",
        "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Lagos\",\"unit\":\"celsius\"}},"
        "{\"name\":\"set_timer\",\"arguments\":{\"minutes\":2}}]");
    CHECK(r.well_formed && r.exact && r.names_match && !r.refused && !r.refusal_expected);
    CHECK_EQ_INT(r.calls_expected, 2);
    CHECK_EQ_INT(r.args_correct, 3);
    CHECK_EQ_INT(r.args_predicted, 3);
    CHECK_EQ_INT(r.args_expected, 3);
    /* a string value differing in case is wrong */
    r = score("[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"lagos\"}}]",
              "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Lagos\"}}]");
    CHECK(r.well_formed && !r.exact && r.names_match);
    CHECK_EQ_INT(r.args_correct, 0);
    CHECK_EQ_INT(r.args_predicted, 1);
}

static void test_wrong_order_extra_missing(void) {
    const char *weather = "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}";
    const char *timer = "{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}}";
    char a[256], b[256];
    /* wrong order: positions pair different names, nothing is correct */
    snprintf(a, sizeof a, "[%s,%s]", timer, weather);
    snprintf(b, sizeof b, "[%s,%s]", weather, timer);
    eval_result r = score(a, b);
    CHECK(r.well_formed && !r.exact && !r.names_match);
    CHECK_EQ_INT(r.args_correct, 0);
    CHECK_EQ_INT(r.args_predicted, 2);
    CHECK_EQ_INT(r.args_expected, 2);
    /* an extra call: the first pairs and is right, the extra costs precision */
    snprintf(a, sizeof a, "[%s,%s]", weather, timer);
    snprintf(b, sizeof b, "[%s]", weather);
    r = score(a, b);
    CHECK(r.well_formed && !r.exact && !r.names_match);
    CHECK_EQ_INT(r.args_correct, 1);
    CHECK_EQ_INT(r.args_predicted, 2);
    CHECK_EQ_INT(r.args_expected, 1);
    /* a missing call costs recall */
    r = score(b, a);
    CHECK(!r.exact && !r.names_match);
    CHECK_EQ_INT(r.args_correct, 1);
    CHECK_EQ_INT(r.args_predicted, 1);
    CHECK_EQ_INT(r.args_expected, 2);
    /* a missing argument: the names match, one of two expected keys is right */
    r = score("[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}]",
              "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"unit\":\"celsius\"}}]");
    CHECK(r.well_formed && !r.exact && r.names_match);
    CHECK_EQ_INT(r.args_correct, 1);
    CHECK_EQ_INT(r.args_predicted, 1);
    CHECK_EQ_INT(r.args_expected, 2);
    /* an extra argument */
    r = score("[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"unit\":\"celsius\"}}]",
              "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}]");
    CHECK(!r.exact && r.names_match);
    CHECK_EQ_INT(r.args_correct, 1);
    CHECK_EQ_INT(r.args_predicted, 2);
    CHECK_EQ_INT(r.args_expected, 1);
}

static void test_refusals(void) {
    eval_result r = score("[]", "[]");
    CHECK(r.well_formed && r.exact && r.names_match && r.refused && r.refusal_expected);
    CHECK_EQ_INT(r.calls_expected, 0);
    r = score("[]", "[{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}}]"); /* false refusal */
    CHECK(r.well_formed && !r.exact && !r.names_match && r.refused && !r.refusal_expected);
    CHECK_EQ_INT(r.args_expected, 1);
    CHECK_EQ_INT(r.args_predicted, 0);
    r = score("[{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}}]", "[]"); /* missed refusal */
    CHECK(r.well_formed && !r.exact && !r.names_match && !r.refused && r.refusal_expected);
    CHECK_EQ_INT(r.args_predicted, 1);
}

static void test_malformed(void) {
    const char *expected = "[{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}}]";
    const char *bad[] = {
        NULL,                                                   /* the turn failed */
        "{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}}", /* not an array */
        "[{\"name\":\"set_timer\"}]",                            /* no arguments */
        "[{\"name\":\"set_timer\",\"arguments\":[5]}]",          /* arguments not an object */
        "[{\"name\":\"set_alarm\",\"arguments\":{\"minutes\":5}}]", /* undeclared tool */
        "[{\"name\":7,\"arguments\":{}}]",                       /* name not a string */
        "[\"set_timer\"]",                                      /* element not an object */
        "[{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}},3]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        eval_result r = score(bad[i], expected);
        CHECK_MSG(!r.well_formed && !r.exact && !r.names_match && !r.refused, "case %zu", i);
        CHECK_EQ_INT(r.args_correct, 0);
        CHECK_EQ_INT(r.args_predicted, 0);
        CHECK_EQ_INT(r.args_expected, 1);
        CHECK_EQ_INT(r.calls_expected, 1);
    }
    eval_result r = score(NULL, "[]"); /* a failed turn is not a refusal */
    CHECK(!r.well_formed && !r.refused && r.refusal_expected && !r.exact);
}

static void test_metrics(void) {
    eval_metrics m;
    eval_metrics_init(&m);
    const char *timer5 = "[{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}}]";
    const char *w2 = "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"unit\":\"celsius\"}}]";
    const char *w1 = "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}]";
    struct { const char *pred, *exp; double ms; } rows[] = {
        {timer5, timer5, 40},  /* exact: 1/1 args */
        {w1, w2, 10},          /* names ok: 1 correct, 1 predicted, 2 expected */
        {"[]", "[]", 30},      /* right refusal */
        {timer5, "[]", 20},    /* missed refusal: 0 correct, 1 predicted */
        {"[]", w1, 50},        /* false refusal: 0 predicted, 1 expected */
        {NULL, timer5, 60},    /* failed turn: 1 expected */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        eval_result r = score(rows[i].pred, rows[i].exp);
        CHECK_EQ_INT(eval_metrics_add(&m, &r, rows[i].ms), 0);
    }
    CHECK_EQ_INT(m.examples, 6);
    CHECK_EQ_INT(m.calls_expected, 4);
    CHECK_EQ_INT(m.exact, 2);
    CHECK_EQ_INT(m.names_match, 3);
    CHECK_EQ_INT(m.well_formed, 5);
    CHECK_EQ_INT(m.args_correct, 2);
    CHECK_EQ_INT(m.args_predicted, 3);
    CHECK_EQ_INT(m.args_expected, 5);
    CHECK_EQ_INT(m.refusal_examples, 2);
    CHECK_EQ_INT(m.refusals_correct, 1);
    CHECK_EQ_INT(m.false_refusals, 1);
    eval_summary s = eval_metrics_summary(&m);
    CHECK_NEAR(s.exact_match, 2.0 / 6);
    CHECK_NEAR(s.tool_name_accuracy, 3.0 / 6);
    CHECK_NEAR(s.well_formed_rate, 5.0 / 6);
    CHECK_NEAR(s.arg_precision, 2.0 / 3);
    CHECK_NEAR(s.arg_recall, 0.4);
    CHECK_NEAR(s.arg_f1, 0.5); /* 2 * (2/3) * 0.4 / (2/3 + 0.4) */
    CHECK_NEAR(s.refusal_accuracy, 0.5);
    CHECK_NEAR(s.latency_mean_ms, 35);
    CHECK_NEAR(s.latency_p50_ms, 30);  /* nearest rank: 3rd of 6 */
    CHECK_NEAR(s.latency_p95_ms, 60);  /* 6th of 6 */
    cJSON *j = eval_metrics_json(&m);
    CHECK(j != NULL);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "arg_recall")), 0.4);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "latency_ms"), "p95")), 60);
    CHECK_EQ_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "false_refusals")), 1);
    cJSON_Delete(j);
    eval_metrics_free(&m);

    /* no refusal examples: refusal accuracy is n/a (null); no arguments anywhere: P=R=F1=1 */
    eval_metrics_init(&m);
    eval_result r = score("[{\"name\":\"get_weather\",\"arguments\":{}}]",
                          "[{\"name\":\"get_weather\",\"arguments\":{}}]");
    eval_metrics_add(&m, &r, 5);
    s = eval_metrics_summary(&m);
    CHECK(s.refusal_accuracy < 0);
    CHECK_NEAR(s.arg_precision, 1);
    CHECK_NEAR(s.arg_recall, 1);
    CHECK_NEAR(s.arg_f1, 1);
    j = eval_metrics_json(&m);
    CHECK(j && cJSON_IsNull(cJSON_GetObjectItem(j, "refusal_accuracy")));
    cJSON_Delete(j);
    /* a turn that never ran has no latency */
    r = score(NULL, "[]");
    CHECK_EQ_INT(eval_metrics_add(&m, &r, -1), 0);
    CHECK_EQ_INT(m.examples, 2);
    CHECK_EQ_INT(m.n_latency, 1);
    s = eval_metrics_summary(&m);
    CHECK_NEAR(s.latency_mean_ms, 5);
    eval_metrics_free(&m);
    eval_metrics_init(&m);
    eval_metrics_add(&m, &r, -1);
    s = eval_metrics_summary(&m);
    CHECK(s.latency_mean_ms < 0 && s.latency_p50_ms < 0 && s.latency_p95_ms < 0);
    j = eval_metrics_json(&m);
    CHECK(j && cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "latency_ms"), "mean")));
    cJSON_Delete(j);
    eval_metrics_free(&m);
}

/* Categories from the expected answers, their own ratios, non-ASCII values copied and
 * the token-limit count, in the struct and in the JSON. */
static void test_categories(void) {
    const char *timer5 = "[{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}}]";
    const char *lodz = "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"\xc5\x81\xc3\xb3\x64\xc5\xba\","
                       "\"unit\":\"celsius\"}}]";
    const char *lodz_ascii = "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Lodz\","
                             "\"unit\":\"celsius\"}}]";
    const char *two = "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Z\xc3\xb6\x65\"}},"
                      "{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}}]";
    const char *two_wrong = "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Zoe\"}},"
                            "{\"name\":\"set_timer\",\"arguments\":{\"minutes\":5}}]";
    struct { const char *pred, *exp; int hit_limit; } rows[] = {
        {timer5, timer5, 0},         /* single, exact */
        {lodz, lodz, 0},             /* single + non-ASCII, copied */
        {lodz_ascii, lodz, 1},       /* single + non-ASCII, mangled (and cut by the budget) */
        {two_wrong, two, 0},         /* multi + non-ASCII: names right, the city not copied */
        {two, two, 0},               /* multi + non-ASCII, exact */
        {"[]", "[]", 0},             /* refusal, right */
        {timer5, "[]", 0},           /* refusal, missed */
        {NULL, timer5, 1},           /* single, failed at max_new_tokens */
    };
    eval_metrics m;
    eval_metrics_init(&m);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        eval_result r = score(rows[i].pred, rows[i].exp);
        r.hit_limit = rows[i].hit_limit;
        CHECK_EQ_INT(eval_metrics_add(&m, &r, 1), 0);
    }
    const eval_category *single = &m.cat[EVAL_CAT_SINGLE], *multi = &m.cat[EVAL_CAT_MULTI];
    const eval_category *refusal = &m.cat[EVAL_CAT_REFUSAL], *na = &m.cat[EVAL_CAT_NON_ASCII];
    CHECK_EQ_INT(single->examples, 4);
    CHECK_EQ_INT(single->exact, 2);
    CHECK_EQ_INT(single->names_match, 3);
    CHECK_EQ_INT(single->args_correct, 1 + 2 + 1); /* timer; city, unit; unit */
    CHECK_EQ_INT(single->args_predicted, 5);
    CHECK_EQ_INT(single->args_expected, 6);
    CHECK_EQ_INT(multi->examples, 2);
    CHECK_EQ_INT(multi->exact, 1);
    CHECK_EQ_INT(multi->names_match, 2);
    CHECK_EQ_INT(refusal->examples, 2);
    CHECK_EQ_INT(refusal->exact, 1);
    CHECK_EQ_INT(na->examples, 4);
    CHECK_EQ_INT(na->exact, 2);
    CHECK_EQ_INT(na->names_match, 4);
    CHECK_EQ_INT(m.non_ascii_values, 4);
    CHECK_EQ_INT(m.non_ascii_copied, 2);
    CHECK_EQ_INT(m.limit_hits, 2);
    eval_category_summary c = eval_category_summarize(single);
    CHECK_NEAR(c.exact_match, 0.5);
    CHECK_NEAR(c.tool_name_accuracy, 0.75);
    const double p = 4.0 / 5, rec = 4.0 / 6;
    CHECK_NEAR(c.arg_f1, 2 * p * rec / (p + rec));
    c = eval_category_summarize(refusal); /* no arguments expected, one call predicted */
    CHECK_NEAR(c.arg_f1, 0);
    eval_category empty = {0};
    c = eval_category_summarize(&empty);
    CHECK(c.exact_match < 0 && c.tool_name_accuracy < 0 && c.arg_f1 < 0);
    cJSON *j = eval_metrics_json(&m);
    const cJSON *cats = cJSON_GetObjectItem(j, "categories");
    CHECK(cJSON_GetArraySize(cats) == EVAL_CATEGORIES);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cats, "multi"),
                                                        "exact_match")), 0.5);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cats, "non_ascii"),
                                                        "examples")), 4);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cats, "refusal"),
                                                        "exact_matches")), 1);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "non_ascii_copy_rate")), 0.5);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "token_limit_hits")), 2);
    cJSON_Delete(j);
    eval_metrics_free(&m);
    /* nothing non-ASCII: the rate is null, the category empty */
    eval_metrics_init(&m);
    eval_result r = score(timer5, timer5);
    CHECK(!r.non_ascii && r.non_ascii_values == 0);
    eval_metrics_add(&m, &r, 1);
    j = eval_metrics_json(&m);
    CHECK(j && cJSON_IsNull(cJSON_GetObjectItem(j, "non_ascii_copy_rate")));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "categories"),
                                                               "non_ascii"), "exact_match")));
    cJSON_Delete(j);
    eval_metrics_free(&m);
}

static void test_example_parse(void) {
    eval_example ex;
    char err[256];
    /* tools kept verbatim ("1.0" and the spaces), answers normalized */
    const char *line =
        "{\"query\": \"hi\", \"reasoning\": \"r\", \"tools\": [{\"name\": \"f\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\", \"minimum\": 1.0}}}}],"
        " \"answers\": [{\"name\": \"f\", \"arguments\": {\"x\": 2}}, {\"name\": \"f\"}]}\n";
    CHECK_MSG(eval_example_parse(line, &ex, err, sizeof err) == 0, "%s", err);
    CHECK(ex.query && !strcmp(ex.query, "hi") && ex.system && !strcmp(ex.system, ""));
    CHECK_MSG(ex.tools_text && !strcmp(ex.tools_text,
              "[{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": "
              "{\"x\": {\"type\": \"number\", \"minimum\": 1.0}}}}]"), "%s", ex.tools_text);
    CHECK(cJSON_GetArraySize(ex.tools) == 1);
    cJSON *want = cJSON_Parse("[{\"name\":\"f\",\"arguments\":{\"x\":2}},{\"name\":\"f\",\"arguments\":{}}]");
    CHECK(eval_json_equal(ex.expected, want));
    cJSON_Delete(want);
    eval_example_free(&ex);

    /* strings holding JSON, the function_calls alias, OpenAI-style calls, system */
    line = "{\"system\":\"s\",\"query\":\"q\",\"tools\":\"[{\\\"name\\\":\\\"f\\\"}]\","
           "\"function_calls\":\"[{\\\"type\\\":\\\"function\\\",\\\"function\\\":{\\\"name\\\":\\\"f\\\","
           "\\\"arguments\\\":\\\"{\\\\\\\"x\\\\\\\":1}\\\"}}]\"}";
    CHECK_MSG(eval_example_parse(line, &ex, err, sizeof err) == 0, "%s", err);
    CHECK(ex.system && !strcmp(ex.system, "s"));
    CHECK(ex.tools_text && !strcmp(ex.tools_text, "[{\"name\":\"f\"}]"));
    want = cJSON_Parse("[{\"name\":\"f\",\"arguments\":{\"x\":1}}]");
    CHECK_MSG(eval_json_equal(ex.expected, want), "expected normalized calls");
    cJSON_Delete(want);
    eval_example_free(&ex);

    /* single-turn chat format, as the official fine-tuner's from_chat reads it */
    line = "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", "
           "\"content\": \"timer 9\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", "
           "\"function\": {\"name\": \"timer\", \"arguments\": \"{\\\"m\\\": 9}\"}}, {\"name\": \"stop\", "
           "\"arguments\": \"\"}]}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"timer\"}}, "
           "{\"name\": \"stop\"}]}";
    CHECK_MSG(eval_example_parse(line, &ex, err, sizeof err) == 0, "%s", err);
    CHECK(ex.query && !strcmp(ex.query, "timer 9") && ex.system && !strcmp(ex.system, "be brief"));
    CHECK_MSG(ex.tools_text && !strcmp(ex.tools_text, "[{\"name\":\"timer\"},{\"name\":\"stop\"}]"), "%s",
              ex.tools_text);
    want = cJSON_Parse("[{\"name\":\"timer\",\"arguments\":{\"m\":9}},{\"name\":\"stop\",\"arguments\":{}}]");
    CHECK_MSG(eval_json_equal(ex.expected, want), "chat calls");
    cJSON_Delete(want);
    eval_example_free(&ex);
    /* two user turns: not single-turn */
    line = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": "
           "\"b\"}], \"tools\": []}";
    CHECK(eval_example_parse(line, &ex, err, sizeof err) == -1 && strstr(err, "one user turn"));
    eval_example_free(&ex);

    struct { const char *line, *msg; } bad[] = {
        {"{\"query\": \"q\", ", "not valid JSON"},
        {"[1,2]", "expected a JSON object"},
        {"{\"query\":\"q\",\"tools\":[],\"answers\":[]} x", "not valid JSON"},
        {"{\"tools\":[],\"answers\":[]}", "query"},
        {"{\"query\":5,\"tools\":[],\"answers\":[]}", "query"},
        {"{\"query\":\"q\",\"answers\":[]}", "tools: missing"},
        {"{\"query\":\"q\",\"tools\":{\"name\":\"f\"},\"answers\":[]}", "tools"},
        {"{\"query\":\"q\",\"tools\":7,\"answers\":[]}", "tools"},
        {"{\"query\":\"q\",\"tools\":\"{}\",\"answers\":[]}", "tools: expected a JSON array"},
        {"{\"query\":\"q\",\"tools\":\"[oops\",\"answers\":[]}", "tools: the string"},
        {"{\"query\":\"q\",\"tools\":[]}", "answers: missing"},
        {"{\"query\":\"q\",\"tools\":[],\"answers\":{\"name\":\"f\"}}", "answers"},
        {"{\"query\":\"q\",\"tools\":[],\"answers\":3}", "answers"},
        {"{\"query\":\"q\",\"tools\":[],\"answers\":\"nope\"}", "answers: the string"},
        {"{\"query\":\"q\",\"tools\":[],\"answers\":[{\"arguments\":{}}]}", "answers[0]"},
        {"{\"query\":\"q\",\"tools\":[],\"answers\":[\"f\"]}", "answers[0]"},
        {"{\"query\":\"q\",\"tools\":[],\"answers\":[{\"name\":\"f\"},{\"name\":\"f\",\"arguments\":3}]}",
         "answers[1].arguments"},
        {"{\"query\":\"q\",\"tools\":[],\"answers\":[{\"name\":\"f\",\"arguments\":\"[1]\"}]}",
         "answers[0].arguments"},
        {"{\"query\":\"q\",\"system\":3,\"tools\":[],\"answers\":[]}", "system"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK_MSG(eval_example_parse(bad[i].line, &ex, err, sizeof err) == -1, "accepted %s", bad[i].line);
        CHECK_MSG(strstr(err, bad[i].msg) != NULL, "'%s' gave '%s', want '%s'", bad[i].line, err, bad[i].msg);
        CHECK(ex.query == NULL && ex.tools == NULL && ex.expected == NULL);
        eval_example_free(&ex);
    }
}

/* ---- end to end ---------------------------------------------------------------------- */

#define E2E_CTX 4096u /* the tiny fixtures' 128 positions do not hold the tools */
#define E2E_MAX_NEW 160

static char model_path[1024];

/* The model's greedy function_calls for one query, as `needle eval` runs it. */
static cJSON *predict(needle_model *m, const char *system, const char *query) {
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = E2E_CTX;
    needle_session *s = NULL;
    CHECK_EQ_INT(needle_session_create(m, &sp, &s), NEEDLE_OK);
    if (!s) return NULL;
    CHECK_EQ_INT(needle_session_set_tools(s, system, TOOLS), NEEDLE_OK);
    needle_complete_params p = needle_complete_default_params();
    p.max_new_tokens = E2E_MAX_NEW;
    p.turn = NEEDLE_TURN_QUERY;
    static char out[1 << 16];
    size_t len = 0;
    CHECK_EQ_INT(needle_session_complete(s, query, &p, out, sizeof out, &len), NEEDLE_OK);
    needle_session_free(s);
    cJSON *env = cJSON_Parse(out);
    CHECK_MSG(env && cJSON_IsTrue(cJSON_GetObjectItem(env, "success")), "turn failed: %s", out);
    cJSON *calls = cJSON_DetachItemFromObject(env, "function_calls");
    cJSON_Delete(env);
    return calls;
}

static int count_args(const cJSON *calls) {
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) n += cJSON_GetArraySize(cJSON_GetObjectItem(c, "arguments"));
    return n;
}

/* Appends s to a growing string. */
static void put(char **buf, size_t *len, const char *s) {
    const size_t n = strlen(s);
    char *b = realloc(*buf, *len + n + 1);
    if (!b) return;
    memcpy(b + *len, s, n + 1);
    *buf = b;
    *len += n;
}

/* `calls` re-written with every call's keys reversed ("arguments" first, argument keys
 * backwards) and integers as "N.0": the same JSON values, different text. */
static char *rewrite_calls(const cJSON *calls) {
    char *buf = NULL, num[64];
    size_t len = 0;
    put(&buf, &len, "[");
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        put(&buf, &len, c == calls->child ? "{\"arguments\":{" : ",{\"arguments\":{");
        const cJSON *args = cJSON_GetObjectItem(c, "arguments");
        const cJSON *last = args->child;
        while (last && last->next) last = last->next;
        for (const cJSON *kv = last; kv; kv = kv == args->child ? NULL : kv->prev) {
            cJSON *tmp = cJSON_CreateString(kv->string);
            char *key = cJSON_PrintUnformatted(tmp);
            cJSON_Delete(tmp);
            put(&buf, &len, key);
            put(&buf, &len, ":");
            free(key);
            if (cJSON_IsNumber(kv) && kv->valuedouble == floor(kv->valuedouble) &&
                fabs(kv->valuedouble) < 1e9) {
                snprintf(num, sizeof num, "%.1f", kv->valuedouble);
                put(&buf, &len, num);
            } else {
                char *v = cJSON_PrintUnformatted(kv);
                put(&buf, &len, v);
                free(v);
            }
            if (kv != args->child) put(&buf, &len, ",");
        }
        char *name = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "name"));
        put(&buf, &len, "},\"name\":");
        put(&buf, &len, name);
        put(&buf, &len, "}");
        free(name);
    }
    put(&buf, &len, "]");
    return buf;
}

/* {"query": q, "tools": ..., key: answers, extra} on one line. */
static void write_line(FILE *f, const char *query, int tools_as_string, const char *system,
                       const char *key, const cJSON *answers, int answers_as_string) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "query", query);
    if (tools_as_string) cJSON_AddStringToObject(o, "tools", TOOLS);
    else cJSON_AddItemToObject(o, "tools", cJSON_Parse(TOOLS));
    if (system) cJSON_AddStringToObject(o, "system", system);
    cJSON_AddStringToObject(o, "reasoning", "ignored");
    char *text = cJSON_PrintUnformatted(answers);
    if (answers_as_string) cJSON_AddStringToObject(o, key, text);
    else cJSON_AddItemToObject(o, key, cJSON_Duplicate(answers, 1));
    char *line = cJSON_PrintUnformatted(o);
    fprintf(f, "%s\n", line);
    free(line);
    free(text);
    cJSON_Delete(o);
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    CHECK_MSG(cJSON_IsNumber(v), "no number %s", key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1e300;
}

static void test_cli_end_to_end(void) {
    needle_model *m = NULL;
    CHECK_EQ_INT(needle_model_open(model_path, NULL, &m), NEEDLE_OK);
    if (!m) return;
    /* three queries whose prediction has a call with an argument; system "" except #2 */
    const char *candidates[] = {"What's the weather in Lagos?", "set a timer for 5 minutes",
                                "Is it raining in Paris today, in celsius?",
                                "remind me in 10 minutes", "weather for Tokyo please",
                                "start a 45 minute timer", "how hot is it in Cairo",
                                "timer 3 min", "forecast Berlin fahrenheit"};
    const char *queries[3] = {0};
    cJSON *pred[4] = {0};
    int found = 0;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && found < 3; i++) {
        cJSON *p = predict(m, found == 1 ? "Be brief." : "", candidates[i]);
        if (p && cJSON_GetArraySize(p) > 0 &&
            cJSON_GetArraySize(cJSON_GetObjectItem(p->child, "arguments")) > 0) {
            queries[found] = candidates[i];
            pred[found++] = p;
        } else {
            cJSON_Delete(p);
        }
    }
    CHECK_MSG(found == 3, "only %d candidate queries gave a call with arguments", found);
    const char *off_topic = "tell me a joke about penguins";
    pred[3] = predict(m, "", off_topic);
    needle_model_free(m);
    if (found < 3 || !pred[3]) {
        for (int i = 0; i < 4; i++) cJSON_Delete(pred[i]);
        return;
    }

    /* 1: the prediction spelled differently (a string, keys reversed, 44 as 44.0);
     * 2: answers = prediction, another system; 3: the first argument changed;
     * 4: off topic, answers [] */
    char path[] = "/tmp/needle_eval_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    char *respelled = rewrite_calls(pred[0]);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "query", queries[0]);
    cJSON_AddStringToObject(o, "tools", TOOLS);
    cJSON_AddStringToObject(o, "answers", respelled);
    char *line = cJSON_PrintUnformatted(o);
    fprintf(f, "%s\n", line);
    free(line);
    cJSON_Delete(o);
    fprintf(f, "\n   \n");
    write_line(f, queries[1], 0, "Be brief.", "answers", pred[1], 0);
    cJSON *changed = cJSON_Duplicate(pred[2], 1);
    cJSON *args = cJSON_GetObjectItem(changed->child, "arguments");
    char *first_key = strdup(args->child->string);
    cJSON_ReplaceItemInObjectCaseSensitive(args, first_key, cJSON_CreateString("__never_predicted__"));
    free(first_key);
    write_line(f, queries[2], 1, "", "function_calls", changed, 1);
    cJSON *none = cJSON_CreateArray();
    write_line(f, off_topic, 0, NULL, "answers", none, 0);
    fclose(f);

    const int refused = cJSON_GetArraySize(pred[3]) == 0;
    const int a0 = count_args(pred[0]), a1 = count_args(pred[1]), a2 = count_args(pred[2]);
    const int a3 = count_args(pred[3]);
    const double exact = 2 + refused, names = 3 + refused;
    const double correct = a0 + a1 + a2 - 1, predicted = a0 + a1 + a2 + a3, expected = a0 + a1 + a2;

    static char out[1 << 16];
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s eval --weights %s --ctx %u -n %d --json --verbose %s 2>/dev/null",
             cli_path(), model_path, E2E_CTX, E2E_MAX_NEW, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    cJSON *j = cJSON_Parse(out); /* --verbose goes to stderr: stdout is one JSON object */
    CHECK_MSG(j != NULL, "eval --json printed: %s", out);
    if (j) {
        CHECK_NEAR(num(j, "examples"), 4);
        CHECK_NEAR(num(j, "calls_expected"), cJSON_GetArraySize(pred[0]) +
                   cJSON_GetArraySize(pred[1]) + cJSON_GetArraySize(pred[2]));
        CHECK_NEAR(num(j, "exact_matches"), exact);
        CHECK_NEAR(num(j, "exact_match"), exact / 4);
        CHECK_NEAR(num(j, "name_matches"), names);
        CHECK_NEAR(num(j, "tool_name_accuracy"), names / 4);
        CHECK_NEAR(num(j, "args_correct"), correct);
        CHECK_NEAR(num(j, "args_predicted"), predicted);
        CHECK_NEAR(num(j, "args_expected"), expected);
        const double p = correct / predicted, r = correct / expected;
        CHECK_NEAR(num(j, "arg_precision"), p);
        CHECK_NEAR(num(j, "arg_recall"), r);
        CHECK_NEAR(num(j, "arg_f1"), p + r > 0 ? 2 * p * r / (p + r) : 0);
        CHECK_NEAR(num(j, "refusal_examples"), 1);
        CHECK_NEAR(num(j, "refusal_accuracy"), refused);
        CHECK_NEAR(num(j, "false_refusals"), 0);
        CHECK_NEAR(num(j, "well_formed_rate"), 1);
        CHECK_NEAR(num(j, "turn_errors"), 0);
        CHECK_NEAR(num(j, "skipped_lines"), 0);
        /* the categories partition the examples by their expected answers */
        const cJSON *cats = cJSON_GetObjectItem(j, "categories");
        CHECK_NEAR(num(cJSON_GetObjectItem(cats, "single"), "examples") +
                       num(cJSON_GetObjectItem(cats, "multi"), "examples"), 3);
        CHECK_NEAR(num(cJSON_GetObjectItem(cats, "refusal"), "examples"), 1);
        CHECK_NEAR(num(cJSON_GetObjectItem(cats, "refusal"), "exact_matches"), refused);
        const double limit = num(j, "token_limit_hits");
        CHECK(limit >= 0 && limit <= 4);
        const cJSON *lat = cJSON_GetObjectItem(j, "latency_ms");
        CHECK(num(lat, "mean") > 0 && num(lat, "p50") > 0 && num(lat, "p95") >= num(lat, "p50"));
        /* every turn succeeded, so every one has a confidence: 4 turns, the fifth is 1 */
        const cJSON *cal = cJSON_GetObjectItem(j, "calibration");
        CHECK_NEAR(num(cal, "examples"), 4);
        CHECK_NEAR(num(cal, "low_fifth_examples"), 1);
        CHECK_NEAR(num(cal, "low_fifth_errors") + num(cal, "rest_errors"), 4 - exact);
        const double top = num(cal, "low_fifth_confidence_max");
        CHECK(top >= 0 && top <= 1);
        CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(cal, "bins")), EVAL_CONF_BINS);
    }
    cJSON_Delete(j);

    /* --limit 2; the human table */
    snprintf(cmd, sizeof cmd, "%s eval --weights %s --ctx %u -n %d --json --limit 2 %s 2>/dev/null",
             cli_path(), model_path, E2E_CTX, E2E_MAX_NEW, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    j = cJSON_Parse(out);
    CHECK(j && num(j, "examples") == 2 && num(j, "exact_matches") == 2 && num(j, "arg_f1") == 1);
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "%s eval --weights %s --ctx %u -n %d %s 2>/dev/null", cli_path(),
             model_path, E2E_CTX, E2E_MAX_NEW, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "exact match") && strstr(out, "argument F1") &&
              strstr(out, "refusal accuracy") && strstr(out, "p95") &&
              strstr(out, "least confident fifth"), "table: %s", out);

    unlink(path);
    free(respelled);
    cJSON_Delete(changed);
    cJSON_Delete(none);
    for (int i = 0; i < 4; i++) cJSON_Delete(pred[i]);
}

static void test_cli_bad_input(void) {
    char path[] = "/tmp/needle_eval_bad_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"query\":\"q\",\"tools\":[],\"answers\":[]}\n"
               "{\"query\":\"q\",\"tools\":\"not json\",\"answers\":[]}\n"
               "{\"query\":\"q\",\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
               "\"properties\":{\"x\":{\"type\":\"frob\"}}}}],\"answers\":[]}\n");
    fclose(f);
    static char out[1 << 14];
    char cmd[4096];
    /* the line number and the reason, exit 1, nothing on stdout */
    snprintf(cmd, sizeof cmd, "%s eval --weights %s --json %s 2>&1 >/dev/null", cli_path(), model_path, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 1);
    CHECK_MSG(strstr(out, ":2: tools") != NULL, "error was: %s", out);
    snprintf(cmd, sizeof cmd, "%s eval --weights %s --json %s 2>/dev/null", cli_path(), model_path, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 1);
    CHECK_EQ_INT(strlen(out), 0);
    /* --skip-bad counts it; with no tools the model refuses; a schema the engine rejects
     * is a turn error: not well formed, not a refusal, no latency */
    snprintf(cmd, sizeof cmd, "%s eval --weights %s --ctx %u --json --skip-bad %s 2>/dev/null",
             cli_path(), model_path, E2E_CTX, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    cJSON *j = cJSON_Parse(out);
    CHECK_MSG(j != NULL, "%s", out);
    if (j) {
        CHECK_NEAR(num(j, "examples"), 2);
        CHECK_NEAR(num(j, "skipped_lines"), 1);
        CHECK_NEAR(num(j, "turn_errors"), 1);
        CHECK_NEAR(num(j, "well_formed"), 1);
        CHECK_NEAR(num(j, "refusal_examples"), 2);
        CHECK_NEAR(num(j, "refusals_correct"), 1);
        CHECK_NEAR(num(j, "exact_matches"), 1);
        const cJSON *lat = cJSON_GetObjectItem(j, "latency_ms");
        CHECK(num(lat, "p50") == num(lat, "p95")); /* one timed turn */
    }
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "%s eval --weights %s --ctx %u --skip-bad --verbose %s 2>&1 >/dev/null",
             cli_path(), model_path, E2E_CTX, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, ":2:") && strstr(out, "(skipped)") && strstr(out, "line 3: q") &&
              strstr(out, "turn error") && strstr(out, "frob"), "stderr: %s", out);

    /* empty file, missing file, bad weights, usage */
    f = fopen(path, "w");
    fprintf(f, "\n  \n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s eval --weights %s %s 2>&1", cli_path(), model_path, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 1);
    CHECK(strstr(out, "no examples") != NULL);
    snprintf(cmd, sizeof cmd, "%s eval --weights %s /nonexistent/data.jsonl 2>&1", cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 1);
    CHECK(strstr(out, "cannot open") != NULL);
    f = fopen(path, "w");
    fprintf(f, "{\"query\":\"q\",\"tools\":[],\"answers\":[]}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s eval --weights %s/README.md %s 2>/dev/null", cli_path(), fixture_dir(), path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 1);
    snprintf(cmd, sizeof cmd, "%s eval --weights %s 2>/dev/null", cli_path(), model_path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 2);
    /* no --weights: the default model, here a NEEDLE_MODEL that does not exist: "no
     * model found", exit 2 like any missing model */
    snprintf(cmd, sizeof cmd, "NEEDLE_MODEL=/nonexistent.cact %s eval %s 2>/dev/null", cli_path(),
             path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s eval --weights %s --limit 0 %s 2>/dev/null", cli_path(), model_path, path);
    CHECK_EQ_INT(run_command(cmd, out, sizeof out), 2);
    unlink(path);
}

/* The calibration: the least confident fifth against the rest, ties kept in arrival order,
 * and the fixed bins (a confidence of exactly an edge falls in the upper bin, 1 in the
 * last). */
static void test_calibration(void) {
    eval_metrics m;
    eval_metrics_init(&m);
    eval_calibration c = eval_metrics_calibration(&m);
    CHECK(c.examples == 0 && c.error_ratio < 0 && c.low_confidence_max < 0);
    /* 10 turns: the two least confident (0.3 and the first 0.5) wrong, one wrong of the rest */
    const struct { double conf; int exact; } turns[] = {
        {0.99, 1}, {0.5, 0}, {0.3, 0}, {0.5, 1}, {0.95, 1},
        {0.9, 0},  {0.8, 1}, {0.7, 1}, {1.0, 1}, {0.96, 1}};
    for (int i = 0; i < 10; i++) CHECK_EQ_INT(eval_metrics_add_confidence(&m, turns[i].conf, turns[i].exact), 0);
    c = eval_metrics_calibration(&m);
    CHECK_EQ_INT(c.examples, 10);
    CHECK_EQ_INT(c.low_examples, 2);
    CHECK_EQ_INT(c.low_errors, 2); /* 0.3, then the 0.5 that came first (wrong) */
    CHECK_NEAR(c.low_confidence_max, 0.5);
    CHECK_EQ_INT(c.rest_examples, 8);
    CHECK_EQ_INT(c.rest_errors, 1);
    CHECK_NEAR(c.error_ratio, (2.0 / 2) / (1.0 / 8));
    CHECK_NEAR(c.best_error_ratio, 8); /* 3 errors: 2 fill the fifth, 1 of 8 left */
    /* 7 exact x 3 wrong pairs: 0.99, 0.95, 1.0, 0.96 beat all 3; 0.8 and 0.7 beat 2; the
     * exact 0.5 beats 0.3 and ties the wrong 0.5 */
    CHECK_NEAR(c.auc, (4 * 3 + 2 * 2 + 1.5) / 21.0);
    /* bins [0,.5) [.5,.7) [.7,.8) [.8,.9) [.9,.95) [.95,1] */
    const long want_n[EVAL_CONF_BINS] = {1, 2, 1, 1, 1, 4}, want_exact[EVAL_CONF_BINS] = {0, 1, 1, 1, 0, 4};
    for (int b = 0; b < EVAL_CONF_BINS; b++) {
        CHECK_EQ_INT(c.bin_examples[b], want_n[b]);
        CHECK_EQ_INT(c.bin_exact[b], want_exact[b]);
    }
    cJSON *j = eval_metrics_json(&m);
    const cJSON *cal = cJSON_GetObjectItem(j, "calibration");
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(cal, "error_ratio")), 8);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cal, "bins"), 5),
                                                         "exact_matches")), 4);
    cJSON_Delete(j);
    eval_metrics_free(&m);
    /* no error outside the fifth: the ratio is undefined (null), not infinite */
    eval_metrics_init(&m);
    for (int i = 0; i < 5; i++) eval_metrics_add_confidence(&m, 0.1 * i, i != 0);
    c = eval_metrics_calibration(&m);
    CHECK(c.low_examples == 1 && c.low_errors == 1 && c.rest_errors == 0 && c.error_ratio < 0);
    CHECK(c.best_error_ratio < 0);
    CHECK_NEAR(c.auc, 1); /* the one wrong turn is the least confident */
    j = eval_metrics_json(&m);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "calibration"), "error_ratio")));
    cJSON_Delete(j);
    eval_metrics_free(&m);
}

int main(void) {
    tools_json = cJSON_Parse(TOOLS);
    snprintf(model_path, sizeof model_path, "%s", fixture_path("tiny_cq4.cact"));
    RUN(test_json_equal);
    RUN(test_exact_match);
    RUN(test_wrong_order_extra_missing);
    RUN(test_refusals);
    RUN(test_malformed);
    RUN(test_metrics);
    RUN(test_categories);
    RUN(test_calibration);
    RUN(test_example_parse);
    RUN(test_cli_end_to_end);
    RUN(test_cli_bad_input);
    cJSON_Delete(tools_json);
    return test_summary();
}
