/* eval_score.h: the model-free half of `needle eval`: reading one example of the
 * fine-tuning data format (spec §7) and scoring predicted tool calls against the
 * expected ones. No engine calls here, so tests/unit/test_eval.c checks every metric on
 * hand-made pairs.
 *
 * An example is one JSON object per line:
 *   query    string (required)
 *   tools    JSON array of tool schemas, or a string holding one (required)
 *   answers  array of {"name": str, "arguments": {...}}, or a string holding one;
 *            "function_calls" is accepted as an alias. [] means "refuse".
 *   system   string (optional)
 *   reasoning, any other key: ignored
 * In expected calls, "arguments" may be missing or null (= {}) or a string holding a JSON
 * object (OpenAI style).
 * A single-turn chat-format line ({messages: [system?, user, assistant with tool_calls],
 * tools: OpenAI form}, no query) is read as the official fine-tuner's from_chat reads it;
 * its tools text is then the unwrapped tools as cJSON prints them.
 *
 * Metrics (per example, then accumulated; see eval_metrics_summary for the ratios):
 *   well-formed     the prediction is a JSON array whose every element is an object with a
 *                   string "name" naming a declared tool and an object "arguments". A
 *                   prediction that is not well-formed (or missing: the turn failed) scores
 *                   as wrong everywhere: no exact match, no name match, no correct or
 *                   predicted arguments, and it is not a refusal.
 *   exact match     same number of calls, in the same order, same names, arguments equal
 *                   as JSON values (eval_json_equal).
 *   name match      the ordered list of called names equals the expected list.
 *   arguments       micro-averaged over (call, key, value) items. Calls are paired by
 *                   position (i-th predicted with i-th expected) when their names match;
 *                   an expected key is correct if the paired prediction has the key with a
 *                   JSON-equal value. predicted = keys over all predicted calls, expected =
 *                   keys over all expected calls. precision = correct / predicted (1 when
 *                   nothing was predicted), recall = correct / expected (1 when nothing was
 *                   expected), F1 = 2PR / (P + R) (0 when P + R = 0).
 *   refusal         over examples expecting []: correct when the prediction is a
 *                   well-formed []. A false refusal is a well-formed [] where calls were
 *                   expected.
 *   latency         per example whose turn ran, in ms; mean, p50 and p95 (nearest rank);
 *                   -1 (n/a) when no turn ran.
 *
 * Categories, from the expected answers alone (no extra fields in the data): single call
 * (one expected), multi-call (two or more), refusal ([]), and non-ASCII: some string in
 * the expected arguments holds a character outside ASCII (an example is in one of the
 * first three and may also be non-ASCII). Each has its own exact match, tool-name
 * accuracy and argument F1, as above over its examples. Non-ASCII values copied: over
 * the expected (call, key) values holding such a character, the fraction that the paired
 * predicted call has equal (argument recall restricted to them). Token limit: examples
 * whose turn the token budget had to end (eval.c sets hit_limit from the session's
 * budget_endings); such an answer is cut, whatever it scores. */
#ifndef NEEDLE_TOOLS_EVAL_SCORE_H
#define NEEDLE_TOOLS_EVAL_SCORE_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* One parsed example. Everything is owned by the struct (eval_example_free). */
typedef struct eval_example {
    char *query;
    char *system;     /* "" when absent */
    char *tools_text; /* the tools exactly as written in the data (the array's own text, or
                       * the string's content): what set_tools gets, and the session key */
    cJSON *tools;     /* the parsed tools array */
    cJSON *expected;  /* array of {"name": str, "arguments": object}, normalized */
} eval_example;

/* Parses one JSONL line (NUL-terminated). Returns 0 and fills *out, or -1 with a one-line
 * reason in err (e.g. "answers: expected an array of calls") and *out zeroed. The tools
 * text is kept verbatim because the engine re-serializes it as in training, where "1.0"
 * and "1" differ; a cJSON round trip would lose that. */
int eval_example_parse(const char *line, eval_example *out, char *err, size_t errcap);
void eval_example_free(eval_example *ex);

/* JSON value equality: same type; numbers by value (2 == 2.0); strings byte for byte;
 * arrays element by element in order; objects with the same key set (key order ignored)
 * and equal values per key. NULL equals only NULL. */
int eval_json_equal(const cJSON *a, const cJSON *b);

/* 1 if `pred` is a well-formed call array for `tools` (see above). NULL is not. Tool names
 * come from each entry's "name" or, OpenAI style, "function"."name". */
int eval_well_formed(const cJSON *pred, const cJSON *tools);

/* What one example scored. */
typedef struct eval_result {
    int well_formed, exact, names_match;
    int refusal_expected;    /* expected [] */
    int refused;             /* well-formed [] predicted */
    int calls_expected;
    int args_correct, args_predicted, args_expected;
    int non_ascii;           /* some expected string value holds a non-ASCII character */
    int non_ascii_values, non_ascii_copied; /* such (call, key) values; copied exactly */
    int hit_limit;           /* set by the caller: the token budget ended the turn */
} eval_result;

/* Scores `pred` (NULL when the turn produced nothing usable) against `expected` (a
 * normalized call array, as in eval_example). */
eval_result eval_score(const cJSON *pred, const cJSON *expected, const cJSON *tools);

enum { EVAL_CAT_SINGLE, EVAL_CAT_MULTI, EVAL_CAT_REFUSAL, EVAL_CAT_NON_ASCII, EVAL_CATEGORIES };

/* Totals of one category (see "Categories" above). */
typedef struct eval_category {
    long examples, exact, names_match;
    long args_correct, args_predicted, args_expected;
} eval_category;

/* Names of the categories, as the JSON output spells them ("single", ...). */
extern const char *const eval_category_names[EVAL_CATEGORIES];

/* Running totals over a dataset. Latencies are kept for the percentiles. */
typedef struct eval_metrics {
    long examples, calls_expected;
    long exact, names_match, well_formed;
    long args_correct, args_predicted, args_expected;
    long refusal_examples, refusals_correct, false_refusals;
    long turn_errors; /* turns that failed inside the engine (set_tools, complete, envelope) */
    eval_category cat[EVAL_CATEGORIES];
    long non_ascii_values, non_ascii_copied;
    long limit_hits;  /* examples whose turn the token budget ended */
    double *latency_ms;
    size_t n_latency, cap_latency;
    struct eval_confidence *conf; /* per successful turn, for the calibration */
    size_t n_conf, cap_conf;
} eval_metrics;

/* One successful turn's envelope "confidence" and whether its calls were exact. */
typedef struct eval_confidence {
    double confidence;
    int exact;
    size_t order; /* arrival: ties of confidence keep it */
} eval_confidence;

void eval_metrics_init(eval_metrics *m);
void eval_metrics_free(eval_metrics *m);
/* Adds one scored example and its latency; a negative latency (the turn never ran, e.g.
 * the tools were rejected) is left out of the latency figures. Returns -1 if out of
 * memory (nothing added). */
int eval_metrics_add(eval_metrics *m, const eval_result *r, double latency_ms);

/* Adds a successful turn's confidence (the envelope's, in [0, 1]) and whether it was exact.
 * Returns -1 if out of memory (nothing added). */
int eval_metrics_add_confidence(eval_metrics *m, double confidence, int exact);

/* Does confidence separate right from wrong? Over the turns with a confidence: the least
 * confident fifth (n/5 rounded to nearest, at least one of two or more; ties in arrival
 * order) against the rest, and the turns by fixed confidence bins. error_ratio = the fifth's
 * error rate / the rest's, -1 when the rest has no error or either part is empty (issue 35's
 * target: >= 3). */
#define EVAL_CONF_BINS 6
extern const double eval_confidence_edges[EVAL_CONF_BINS + 1]; /* 0, .5, .7, .8, .9, .95, 1 */
typedef struct eval_calibration {
    long examples;
    long low_examples, low_errors, rest_examples, rest_errors;
    double low_confidence_max; /* the fifth's highest confidence (-1 when empty) */
    double error_ratio;
    /* error_ratio bounds it: the ratio a perfect ranking would give with these errors (all
     * in the fifth if they fill it): -1 when it is unbounded (no error left for the rest) */
    double best_error_ratio;
    /* the probability that a random exact turn has a higher confidence than a random
     * wrong one (ties count half; ROC AUC): 0.5 is no separation, 1 perfect, whatever the
     * accuracy; -1 without both kinds */
    double auc;
    long bin_examples[EVAL_CONF_BINS], bin_exact[EVAL_CONF_BINS];
} eval_calibration;

/* Sorts the confidences in place. The error ratio depends on the accuracy (at 63% errors
 * even a perfect ranking reaches only 1.86): best_error_ratio and auc say how much of it
 * the confidence achieved. */
eval_calibration eval_metrics_calibration(eval_metrics *m);

/* The ratios. A ratio over an empty set is reported as -1 (printed "n/a" / null). */
typedef struct eval_summary {
    double exact_match, tool_name_accuracy, well_formed_rate;
    double arg_precision, arg_recall, arg_f1;
    double refusal_accuracy; /* -1 when no example expects [] */
    double latency_mean_ms, latency_p50_ms, latency_p95_ms;
} eval_summary;

/* The ratios of one category: exact match, tool-name accuracy (-1 when it is empty) and
 * argument F1, defined as for the whole set. */
typedef struct eval_category_summary {
    double exact_match, tool_name_accuracy, arg_f1;
} eval_category_summary;

eval_category_summary eval_category_summarize(const eval_category *c);

/* Sorts the latencies in place (percentiles). */
eval_summary eval_metrics_summary(eval_metrics *m);

/* The metrics as one JSON object (caller frees with cJSON_Delete); NULL if out of memory. */
cJSON *eval_metrics_json(eval_metrics *m);

#endif
