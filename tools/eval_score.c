/* eval_score.c: reading examples and scoring tool calls for `needle eval` (definitions in
 * eval_score.h). Model-free and allocation-checked: bad data is an error string, never a
 * crash. Recursion (eval_json_equal) is bounded by cJSON's nesting limit. */
#include "eval_score.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && cap) vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- raw text of the "tools" member ---------------------------------------------------- */

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* End of the JSON string starting at p ('"'). The text is already validated by cJSON. */
static const char *skip_string(const char *p) {
    for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && p[1]) p++;
    return *p ? p + 1 : p;
}

/* End of the JSON value starting at p (validated text). */
static const char *skip_value(const char *p) {
    if (*p == '"') return skip_string(p);
    if (*p == '[' || *p == '{') {
        int depth = 0;
        while (*p) {
            if (*p == '"') { p = skip_string(p); continue; }
            if (*p == '[' || *p == '{') depth++;
            else if ((*p == ']' || *p == '}') && --depth == 0) return p + 1;
            p++;
        }
        return p;
    }
    while (*p && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\t' &&
           *p != '\n' && *p != '\r')
        p++;
    return p;
}

/* Copies the text of the first top-level member `key` of the object in `line`, which
 * cJSON has accepted. NULL if absent or out of memory. */
static char *member_text(const char *line, const char *key) {
    const char *p = skip_ws(line);
    if (*p != '{') return NULL;
    p = skip_ws(p + 1);
    while (*p == '"') {
        const char *kend = skip_string(p);
        cJSON *k = cJSON_ParseWithLength(p, (size_t)(kend - p)); /* decodes escapes */
        const int match = k && cJSON_IsString(k) && !strcmp(k->valuestring, key);
        cJSON_Delete(k);
        p = skip_ws(kend);
        if (*p != ':') return NULL;
        p = skip_ws(p + 1);
        const char *vend = skip_value(p);
        if (match) {
            char *out = malloc((size_t)(vend - p) + 1);
            if (out) {
                memcpy(out, p, (size_t)(vend - p));
                out[vend - p] = 0;
            }
            return out;
        }
        p = skip_ws(vend);
        if (*p != ',') return NULL;
        p = skip_ws(p + 1);
    }
    return NULL;
}

/* ---- examples -------------------------------------------------------------------------- */

/* A field that is a JSON value or a string holding one: returns a new parsed copy, or NULL
 * (with err) if neither parses as the wanted kind. */
static cJSON *value_or_string(const cJSON *field, const char *what, int want_array, char *err,
                              size_t cap) {
    cJSON *v = NULL;
    if (cJSON_IsString(field)) {
        v = cJSON_Parse(field->valuestring);
        if (!v) {
            fail(err, cap, "%s: the string does not hold valid JSON", what);
            return NULL;
        }
    } else {
        v = cJSON_Duplicate(field, 1);
        if (!v) {
            fail(err, cap, "out of memory");
            return NULL;
        }
    }
    if (want_array ? !cJSON_IsArray(v) : !cJSON_IsObject(v)) {
        fail(err, cap, "%s: expected %s", what, want_array ? "a JSON array" : "a JSON object");
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}

/* Normalizes the expected calls into [{"name": str, "arguments": object}, ...]. */
static cJSON *normalize_answers(const cJSON *answers, char *err, size_t cap) {
    cJSON *raw = value_or_string(answers, "answers", 1, err, cap);
    if (!raw) return NULL;
    cJSON *out = cJSON_CreateArray();
    int i = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, raw) {
        if (!out) break;
        const cJSON *call = item;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(item, "function");
        if (cJSON_IsObject(item) && !cJSON_HasObjectItem(item, "name") && cJSON_IsObject(fn))
            call = fn; /* OpenAI style {"type":"function","function":{...}} */
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
        if (!cJSON_IsObject(call) || !cJSON_IsString(name)) {
            fail(err, cap, "answers[%d]: expected an object with a string \"name\"", i);
            goto bad;
        }
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
        cJSON *norm_args;
        if (!args || cJSON_IsNull(args)) {
            norm_args = cJSON_CreateObject();
        } else if (cJSON_IsObject(args) || cJSON_IsString(args)) {
            char what[48];
            snprintf(what, sizeof what, "answers[%d].arguments", i);
            if (!(norm_args = value_or_string(args, what, 0, err, cap))) goto bad;
        } else {
            fail(err, cap, "answers[%d].arguments: expected an object", i);
            goto bad;
        }
        cJSON *c = cJSON_CreateObject();
        if (!c || !norm_args || !cJSON_AddStringToObject(c, "name", name->valuestring)) {
            cJSON_Delete(norm_args);
            cJSON_Delete(c);
            fail(err, cap, "out of memory");
            goto bad;
        }
        if (!cJSON_AddItemToObject(c, "arguments", norm_args)) {
            cJSON_Delete(norm_args);
            cJSON_Delete(c);
            fail(err, cap, "out of memory");
            goto bad;
        }
        cJSON_AddItemToArray(out, c);
        i++;
    }
    if (!out) fail(err, cap, "out of memory");
    cJSON_Delete(raw);
    return out;
bad:
    cJSON_Delete(raw);
    cJSON_Delete(out);
    return NULL;
}

/* A single-turn chat-format line ({messages: [system?, user, assistant with tool_calls],
 * tools: OpenAI form}) as the example the official fine-tuner makes of it (finetune.from_chat):
 * the query is the user turn, the answers the assistant's tool calls (string arguments
 * parsed, "" meaning {}), the tools unwrapped from {"type": "function", "function": ...},
 * the system the first system turn. Returns the example as JSON text (malloc'd) or NULL
 * with the reason in err. */
static char *from_chat(const cJSON *obj, char *err, size_t cap) {
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(obj, "messages");
    const cJSON *user = NULL, *assistant = NULL, *system = NULL, *m;
    int turns = 0;
    cJSON_ArrayForEach(m, messages) {
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        if (role && !strcmp(role, "system")) {
            if (!system) system = m;
            continue;
        }
        turns++;
        if (turns == 1 && role && !strcmp(role, "user")) user = m;
        if (turns == 2 && role && !strcmp(role, "assistant")) assistant = m;
    }
    if (turns != 2 || !user || !assistant) {
        fail(err, cap, "chat format: not one user turn answered by one assistant turn (the official "
                       "fine-tuner skips such lines)");
        return NULL;
    }
    cJSON *ex = cJSON_CreateObject(), *answers = cJSON_AddArrayToObject(ex, "answers");
    cJSON *tools = cJSON_AddArrayToObject(ex, "tools");
    const char *content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(user, "content"));
    cJSON_AddStringToObject(ex, "query", content ? content : "");
    const char *sys = system ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(system, "content")) : NULL;
    if (sys && *sys) cJSON_AddStringToObject(ex, "system", sys);
    const cJSON *call;
    char *text = NULL;
    cJSON_ArrayForEach(call, cJSON_GetObjectItemCaseSensitive(assistant, "tool_calls")) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        if (!cJSON_IsObject(fn)) fn = call;
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *one = cJSON_CreateObject(), *parsed = NULL;
        cJSON_AddItemToObject(one, "name", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(fn, "name"), 1));
        if (cJSON_IsString(args)) {
            const char *a = args->valuestring;
            while (*a == ' ' || *a == '\t' || *a == '\n' || *a == '\r') a++;
            parsed = *a ? cJSON_Parse(args->valuestring) : cJSON_CreateObject();
            if (!parsed) {
                cJSON_Delete(one);
                fail(err, cap, "chat format: tool call arguments are not JSON");
                goto done;
            }
        } else {
            parsed = args ? cJSON_Duplicate(args, 1) : cJSON_CreateObject();
        }
        cJSON_AddItemToObject(one, "arguments", parsed);
        cJSON_AddItemToArray(answers, one);
    }
    const cJSON *tool;
    cJSON_ArrayForEach(tool, cJSON_GetObjectItemCaseSensitive(obj, "tools")) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        cJSON_AddItemToArray(tools, cJSON_Duplicate(cJSON_IsObject(fn) ? fn : tool, 1));
    }
    text = cJSON_PrintUnformatted(ex);
    if (!text) fail(err, cap, "out of memory");
done:
    cJSON_Delete(ex);
    return text;
}

int eval_example_parse(const char *line, eval_example *out, char *err, size_t cap) {
    memset(out, 0, sizeof *out);
    const char *end = NULL;
    cJSON *obj = cJSON_ParseWithOpts(line, &end, 1);
    if (!obj) {
        const long col = end && end >= line ? (long)(end - line) + 1 : 0;
        return fail(err, cap, "not valid JSON (near column %ld)", col);
    }
    int rc = -1;
    const cJSON *query = cJSON_GetObjectItemCaseSensitive(obj, "query");
    const cJSON *system = cJSON_GetObjectItemCaseSensitive(obj, "system");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(obj, "tools");
    const cJSON *answers = cJSON_GetObjectItemCaseSensitive(obj, "answers");
    if (!answers) answers = cJSON_GetObjectItemCaseSensitive(obj, "function_calls");
    if (!cJSON_IsObject(obj)) { fail(err, cap, "expected a JSON object"); goto done; }
    if (!query && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(obj, "messages"))) {
        char *converted = from_chat(obj, err, cap);
        if (converted) rc = eval_example_parse(converted, out, err, cap);
        free(converted);
        cJSON_Delete(obj);
        return rc;
    }
    if (!cJSON_IsString(query)) { fail(err, cap, "query: missing or not a string"); goto done; }
    if (system && !cJSON_IsNull(system) && !cJSON_IsString(system)) {
        fail(err, cap, "system: not a string");
        goto done;
    }
    if (!tools) { fail(err, cap, "tools: missing"); goto done; }
    if (!answers) { fail(err, cap, "answers: missing (or \"function_calls\")"); goto done; }
    if (!cJSON_IsString(tools) && !cJSON_IsArray(tools)) {
        fail(err, cap, "tools: expected a JSON array (or a string holding one)");
        goto done;
    }
    if (!cJSON_IsString(answers) && !cJSON_IsArray(answers)) {
        fail(err, cap, "answers: expected an array of calls (or a string holding one)");
        goto done;
    }
    if (!(out->tools = value_or_string(tools, "tools", 1, err, cap))) goto done;
    if (!(out->expected = normalize_answers(answers, err, cap))) goto done;
    out->query = strdup(query->valuestring);
    out->system = strdup(cJSON_IsString(system) ? system->valuestring : "");
    out->tools_text =
        cJSON_IsString(tools) ? strdup(tools->valuestring) : member_text(line, "tools");
    if (!out->query || !out->system || !out->tools_text) {
        fail(err, cap, "out of memory");
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(obj);
    if (rc) eval_example_free(out);
    return rc;
}

void eval_example_free(eval_example *ex) {
    if (!ex) return;
    free(ex->query);
    free(ex->system);
    free(ex->tools_text);
    cJSON_Delete(ex->tools);
    cJSON_Delete(ex->expected);
    memset(ex, 0, sizeof *ex);
}

/* ---- comparing ------------------------------------------------------------------------- */

int eval_json_equal(const cJSON *a, const cJSON *b) {
    if (!a || !b) return a == b;
    const int ta = a->type & 0xFF, tb = b->type & 0xFF;
    if (ta != tb) return 0;
    switch (ta) {
    case cJSON_False:
    case cJSON_True:
    case cJSON_NULL: return 1;
    case cJSON_Number: return a->valuedouble == b->valuedouble;
    case cJSON_String:
        return a->valuestring && b->valuestring && !strcmp(a->valuestring, b->valuestring);
    case cJSON_Array: {
        const cJSON *x = a->child, *y = b->child;
        for (; x && y; x = x->next, y = y->next)
            if (!eval_json_equal(x, y)) return 0;
        return !x && !y;
    }
    case cJSON_Object: {
        if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b)) return 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, a) {
            if (!x->string || !eval_json_equal(x, cJSON_GetObjectItemCaseSensitive(b, x->string)))
                return 0;
        }
        cJSON_ArrayForEach(x, b) { /* duplicate keys could hide a key of b */
            if (!x->string || !cJSON_GetObjectItemCaseSensitive(a, x->string)) return 0;
        }
        return 1;
    }
    default: return 0;
    }
}

static const char *tool_name(const cJSON *tool) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(tool, "name"));
    if (name) return name;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
}

static int declared(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const char *n = tool_name(t);
        if (n && !strcmp(n, name)) return 1;
    }
    return 0;
}

int eval_well_formed(const cJSON *pred, const cJSON *tools) {
    if (!cJSON_IsArray(pred)) return 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, pred) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(call, "name"));
        if (!cJSON_IsObject(call) || !name || !declared(tools, name) ||
            !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(call, "arguments")))
            return 0;
    }
    return 1;
}

/* Whether a string inside v (v itself, or any array item or object member value) holds a
 * byte outside ASCII. Recursion is bounded by cJSON's nesting limit. */
static int has_non_ascii(const cJSON *v) {
    if (cJSON_IsString(v)) {
        for (const unsigned char *p = (const unsigned char *)v->valuestring; p && *p; p++)
            if (*p >= 0x80) return 1;
        return 0;
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, v) if (has_non_ascii(c)) return 1;
    return 0;
}

static const char *call_name(const cJSON *call) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(call, "name"));
}

static const cJSON *call_args(const cJSON *call) {
    return cJSON_GetObjectItemCaseSensitive(call, "arguments");
}

eval_result eval_score(const cJSON *pred, const cJSON *expected, const cJSON *tools) {
    eval_result r;
    memset(&r, 0, sizeof r);
    const int n_exp = cJSON_GetArraySize(expected);
    r.calls_expected = n_exp;
    r.refusal_expected = n_exp == 0;
    const cJSON *e, *kv;
    cJSON_ArrayForEach(e, expected) {
        r.args_expected += cJSON_GetArraySize(call_args(e));
        cJSON_ArrayForEach(kv, call_args(e)) r.non_ascii_values += has_non_ascii(kv);
    }
    r.non_ascii = r.non_ascii_values > 0;
    r.well_formed = eval_well_formed(pred, tools);
    if (!r.well_formed) return r;

    const int n_pred = cJSON_GetArraySize(pred);
    r.refused = n_pred == 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, pred) r.args_predicted += cJSON_GetArraySize(call_args(p));
    int names = n_pred == n_exp, exact = names;
    /* walk both lists together: position i pairs the i-th calls */
    for (p = pred->child, e = expected->child; p && e; p = p->next, e = e->next) {
        if (strcmp(call_name(p), call_name(e)) != 0) {
            names = exact = 0;
            continue;
        }
        const cJSON *pa = call_args(p), *ea = call_args(e);
        if (!eval_json_equal(pa, ea)) exact = 0;
        cJSON_ArrayForEach(kv, ea) {
            if (kv->string && eval_json_equal(kv, cJSON_GetObjectItemCaseSensitive(pa, kv->string))) {
                r.args_correct++;
                r.non_ascii_copied += has_non_ascii(kv);
            }
        }
    }
    r.names_match = names;
    r.exact = exact;
    return r;
}

/* ---- accumulating ---------------------------------------------------------------------- */

const char *const eval_category_names[EVAL_CATEGORIES] = {"single", "multi", "refusal",
                                                          "non_ascii"};

void eval_metrics_init(eval_metrics *m) { memset(m, 0, sizeof *m); }

static void category_add(eval_category *c, const eval_result *r) {
    c->examples++;
    c->exact += r->exact;
    c->names_match += r->names_match;
    c->args_correct += r->args_correct;
    c->args_predicted += r->args_predicted;
    c->args_expected += r->args_expected;
}

void eval_metrics_free(eval_metrics *m) {
    if (!m) return;
    free(m->latency_ms);
    free(m->conf);
    memset(m, 0, sizeof *m);
}

int eval_metrics_add(eval_metrics *m, const eval_result *r, double latency_ms) {
    if (latency_ms >= 0 && m->n_latency == m->cap_latency) {
        const size_t cap = m->cap_latency ? 2 * m->cap_latency : 64;
        double *v = realloc(m->latency_ms, cap * sizeof *v);
        if (!v) return -1;
        m->latency_ms = v;
        m->cap_latency = cap;
    }
    if (latency_ms >= 0) m->latency_ms[m->n_latency++] = latency_ms;
    m->examples++;
    m->calls_expected += r->calls_expected;
    m->exact += r->exact;
    m->names_match += r->names_match;
    m->well_formed += r->well_formed;
    m->args_correct += r->args_correct;
    m->args_predicted += r->args_predicted;
    m->args_expected += r->args_expected;
    category_add(&m->cat[r->calls_expected == 0   ? EVAL_CAT_REFUSAL
                         : r->calls_expected == 1 ? EVAL_CAT_SINGLE
                                                  : EVAL_CAT_MULTI],
                 r);
    if (r->non_ascii) category_add(&m->cat[EVAL_CAT_NON_ASCII], r);
    m->non_ascii_values += r->non_ascii_values;
    m->non_ascii_copied += r->non_ascii_copied;
    m->limit_hits += r->hit_limit;
    if (r->refusal_expected) {
        m->refusal_examples++;
        m->refusals_correct += r->refused;
    } else {
        m->false_refusals += r->refused;
    }
    return 0;
}

int eval_metrics_add_confidence(eval_metrics *m, double confidence, int exact) {
    if (m->n_conf == m->cap_conf) {
        const size_t cap = m->cap_conf ? 2 * m->cap_conf : 64;
        eval_confidence *v = realloc(m->conf, cap * sizeof *v);
        if (!v) return -1;
        m->conf = v;
        m->cap_conf = cap;
    }
    m->conf[m->n_conf] = (eval_confidence){confidence, exact != 0, m->n_conf};
    m->n_conf++;
    return 0;
}

const double eval_confidence_edges[EVAL_CONF_BINS + 1] = {0, 0.5, 0.7, 0.8, 0.9, 0.95, 1};

static int cmp_confidence(const void *a, const void *b) {
    const eval_confidence *x = a, *y = b;
    if (x->confidence != y->confidence) return x->confidence < y->confidence ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

eval_calibration eval_metrics_calibration(eval_metrics *m) {
    eval_calibration c;
    memset(&c, 0, sizeof c);
    c.examples = (long)m->n_conf;
    c.low_confidence_max = -1;
    c.error_ratio = -1;
    if (!m->n_conf) return c;
    qsort(m->conf, m->n_conf, sizeof *m->conf, cmp_confidence);
    size_t low = (m->n_conf + 2) / 5; /* n/5 to nearest */
    if (!low && m->n_conf >= 2) low = 1;
    for (size_t i = 0; i < m->n_conf; i++) {
        const eval_confidence *e = &m->conf[i];
        if (i < low) {
            c.low_examples++;
            c.low_errors += !e->exact;
            c.low_confidence_max = e->confidence;
        } else {
            c.rest_examples++;
            c.rest_errors += !e->exact;
        }
        int b = 0;
        while (b + 1 < EVAL_CONF_BINS && e->confidence >= eval_confidence_edges[b + 1]) b++;
        c.bin_examples[b]++;
        c.bin_exact[b] += e->exact;
    }
    if (c.low_examples && c.rest_examples && c.rest_errors)
        c.error_ratio = ((double)c.low_errors / (double)c.low_examples) /
                        ((double)c.rest_errors / (double)c.rest_examples);
    const long errors = c.low_errors + c.rest_errors;
    c.best_error_ratio = -1;
    if (c.low_examples && c.rest_examples && errors > c.low_examples)
        c.best_error_ratio = 1.0 / ((double)(errors - c.low_examples) / (double)c.rest_examples);
    /* the AUC from the ascending order: each exact turn beats the wrong ones below it, and
     * ties with equal confidence count half */
    c.auc = -1;
    const long exact = (long)m->n_conf - errors;
    if (exact && errors) {
        double wins = 0;
        long wrong_below = 0;
        for (size_t i = 0; i < m->n_conf;) {
            size_t j = i;
            long wrong_here = 0, exact_here = 0;
            for (; j < m->n_conf && m->conf[j].confidence == m->conf[i].confidence; j++) {
                wrong_here += !m->conf[j].exact;
                exact_here += m->conf[j].exact;
            }
            wins += (double)exact_here * ((double)wrong_below + 0.5 * (double)wrong_here);
            wrong_below += wrong_here;
            i = j;
        }
        c.auc = wins / ((double)exact * (double)errors);
    }
    return c;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v: the smallest value with at least p% at or below. */
static double percentile(const double *v, size_t n, double p) {
    if (!n) return -1;
    size_t rank = (size_t)ceil(p / 100.0 * (double)n);
    if (rank < 1) rank = 1;
    return v[rank - 1];
}

static double ratio(long num, long den) { return den ? (double)num / (double)den : -1; }

/* Micro-averaged argument precision, recall and F1 (see eval_score.h). */
static double arg_f1(long correct, long predicted, long expected, double *precision,
                     double *recall) {
    const double p = predicted ? (double)correct / (double)predicted : 1.0;
    const double r = expected ? (double)correct / (double)expected : 1.0;
    if (precision) *precision = p;
    if (recall) *recall = r;
    return p + r > 0 ? 2 * p * r / (p + r) : 0.0;
}

eval_category_summary eval_category_summarize(const eval_category *c) {
    eval_category_summary s;
    s.exact_match = ratio(c->exact, c->examples);
    s.tool_name_accuracy = ratio(c->names_match, c->examples);
    s.arg_f1 = c->examples ? arg_f1(c->args_correct, c->args_predicted, c->args_expected, NULL, NULL)
                           : -1;
    return s;
}

eval_summary eval_metrics_summary(eval_metrics *m) {
    eval_summary s;
    s.exact_match = ratio(m->exact, m->examples);
    s.tool_name_accuracy = ratio(m->names_match, m->examples);
    s.well_formed_rate = ratio(m->well_formed, m->examples);
    s.arg_f1 = arg_f1(m->args_correct, m->args_predicted, m->args_expected, &s.arg_precision,
                      &s.arg_recall);
    s.refusal_accuracy = ratio(m->refusals_correct, m->refusal_examples);
    if (m->n_latency) qsort(m->latency_ms, m->n_latency, sizeof *m->latency_ms, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < m->n_latency; i++) sum += m->latency_ms[i];
    s.latency_mean_ms = m->n_latency ? sum / (double)m->n_latency : -1;
    s.latency_p50_ms = percentile(m->latency_ms, m->n_latency, 50);
    s.latency_p95_ms = percentile(m->latency_ms, m->n_latency, 95);
    return s;
}

/* Adds a ratio, or null for "no data" (-1). */
static int add_ratio(cJSON *o, const char *key, double v) {
    return (v < 0 ? cJSON_AddNullToObject(o, key) : cJSON_AddNumberToObject(o, key, v)) != NULL;
}

/* "categories": {"single": {...}, ...}, each with its counts and ratios. */
static int add_categories(cJSON *o, const eval_metrics *m) {
    cJSON *all = cJSON_AddObjectToObject(o, "categories");
    int ok = all != NULL;
    for (int i = 0; ok && i < EVAL_CATEGORIES; i++) {
        const eval_category *c = &m->cat[i];
        const eval_category_summary s = eval_category_summarize(c);
        cJSON *j = cJSON_AddObjectToObject(all, eval_category_names[i]);
        ok = j && cJSON_AddNumberToObject(j, "examples", (double)c->examples) &&
             cJSON_AddNumberToObject(j, "exact_matches", (double)c->exact) &&
             cJSON_AddNumberToObject(j, "name_matches", (double)c->names_match) &&
             cJSON_AddNumberToObject(j, "args_correct", (double)c->args_correct) &&
             cJSON_AddNumberToObject(j, "args_predicted", (double)c->args_predicted) &&
             cJSON_AddNumberToObject(j, "args_expected", (double)c->args_expected) &&
             add_ratio(j, "exact_match", s.exact_match) &&
             add_ratio(j, "tool_name_accuracy", s.tool_name_accuracy) &&
             add_ratio(j, "arg_f1", s.arg_f1);
    }
    return ok;
}

/* "calibration": the least confident fifth against the rest, and the bins. */
static int add_calibration(cJSON *o, eval_metrics *m) {
    const eval_calibration c = eval_metrics_calibration(m);
    cJSON *j = cJSON_AddObjectToObject(o, "calibration"), *bins = NULL;
    int ok = j && cJSON_AddNumberToObject(j, "examples", (double)c.examples) &&
             cJSON_AddNumberToObject(j, "low_fifth_examples", (double)c.low_examples) &&
             cJSON_AddNumberToObject(j, "low_fifth_errors", (double)c.low_errors) &&
             add_ratio(j, "low_fifth_confidence_max", c.low_confidence_max) &&
             cJSON_AddNumberToObject(j, "rest_examples", (double)c.rest_examples) &&
             cJSON_AddNumberToObject(j, "rest_errors", (double)c.rest_errors) &&
             add_ratio(j, "error_ratio", c.error_ratio) &&
             add_ratio(j, "best_error_ratio", c.best_error_ratio) && add_ratio(j, "auc", c.auc) &&
             (bins = cJSON_AddArrayToObject(j, "bins")) != NULL;
    for (int b = 0; ok && b < EVAL_CONF_BINS; b++) {
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(bins, e) &&
             cJSON_AddNumberToObject(e, "min", eval_confidence_edges[b]) &&
             cJSON_AddNumberToObject(e, "max", eval_confidence_edges[b + 1]) &&
             cJSON_AddNumberToObject(e, "examples", (double)c.bin_examples[b]) &&
             cJSON_AddNumberToObject(e, "exact_matches", (double)c.bin_exact[b]) &&
             add_ratio(e, "exact_match", ratio(c.bin_exact[b], c.bin_examples[b]));
    }
    return ok;
}

cJSON *eval_metrics_json(eval_metrics *m) {
    const eval_summary s = eval_metrics_summary(m);
    cJSON *o = cJSON_CreateObject(), *lat = NULL;
    int ok = o != NULL;
    const struct { const char *key; long v; } counts[] = {
        {"examples", m->examples},
        {"calls_expected", m->calls_expected},
        {"exact_matches", m->exact},
        {"name_matches", m->names_match},
        {"well_formed", m->well_formed},
        {"args_correct", m->args_correct},
        {"args_predicted", m->args_predicted},
        {"args_expected", m->args_expected},
        {"refusal_examples", m->refusal_examples},
        {"refusals_correct", m->refusals_correct},
        {"false_refusals", m->false_refusals},
        {"turn_errors", m->turn_errors},
        {"non_ascii_values", m->non_ascii_values},
        {"non_ascii_copied", m->non_ascii_copied},
        {"token_limit_hits", m->limit_hits},
    };
    for (size_t i = 0; ok && i < sizeof counts / sizeof counts[0]; i++)
        ok = cJSON_AddNumberToObject(o, counts[i].key, (double)counts[i].v) != NULL;
    ok = ok && add_ratio(o, "exact_match", s.exact_match) &&
         add_ratio(o, "tool_name_accuracy", s.tool_name_accuracy) &&
         add_ratio(o, "arg_precision", s.arg_precision) &&
         add_ratio(o, "arg_recall", s.arg_recall) && add_ratio(o, "arg_f1", s.arg_f1) &&
         add_ratio(o, "refusal_accuracy", s.refusal_accuracy) &&
         add_ratio(o, "well_formed_rate", s.well_formed_rate) &&
         add_ratio(o, "non_ascii_copy_rate", ratio(m->non_ascii_copied, m->non_ascii_values)) &&
         add_categories(o, m);
    ok = ok && add_calibration(o, m);
    ok = ok && (lat = cJSON_AddObjectToObject(o, "latency_ms")) != NULL &&
         add_ratio(lat, "mean", s.latency_mean_ms) && add_ratio(lat, "p50", s.latency_p50_ms) &&
         add_ratio(lat, "p95", s.latency_p95_ms);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}
