/* The envelope's confidence (see confidence.h). */
#include "agent/confidence.h"

#include <math.h>
#include <string.h>

#include "util/clock.h"
#include "util/error.h"

static void pool_cells(void *user, const int32_t *tokens, uint32_t n, uint32_t cell,
                       const float *cells) {
    confidence_state *cs = user;
    if (cs->has_head) head_pool_add(&cs->pool, tokens, n, cell, cells);
    if (cs->tap && cs->tap->fn) cs->tap->fn(cs->tap->user, tokens, n, cell, cells);
}

int confidence_attach(confidence_state *cs, const struct needle_model *m, const session_cells *tap) {
    memset(cs, 0, sizeof *cs);
    cs->tap = tap;
    cs->cells.fn = pool_cells;
    cs->cells.user = cs;
    const probe_head *h = model_probe_head(m, HEAD_CODE_CONFIDENCE);
    if (!h) return NEEDLE_OK;
    int rc;
    const uint32_t d = model_width(m);
    if ((rc = head_pool_init(&cs->pool, h, d)) || (rc = head_pool_init(&cs->base, h, d)) ||
        (rc = head_pool_init(&cs->turn_start, h, d))) {
        confidence_free(cs);
        return rc;
    }
    cs->has_head = 1;
    return NEEDLE_OK;
}

const session_cells *confidence_cells(const confidence_state *cs) {
    return cs->has_head || cs->tap ? &cs->cells : NULL;
}

void confidence_free(confidence_state *cs) {
    head_pool_free(&cs->pool);
    head_pool_free(&cs->base);
    head_pool_free(&cs->turn_start);
    cs->has_head = 0;
}

void confidence_restart(confidence_state *cs) {
    if (cs->has_head) head_pool_clear(&cs->pool);
}

void confidence_pin_base(confidence_state *cs) {
    if (cs->has_head) head_pool_copy(&cs->base, &cs->pool);
}

void confidence_on_reset(confidence_state *cs) {
    if (cs->has_head) head_pool_copy(&cs->pool, &cs->base);
}

void confidence_turn_begin(confidence_state *cs) {
    if (cs->has_head) head_pool_copy(&cs->turn_start, &cs->pool);
    cs->log_prob_sum = 0;
    cs->choices = 0;
}

void confidence_turn_abort(confidence_state *cs) {
    if (cs->has_head) head_pool_copy(&cs->pool, &cs->turn_start);
}

void confidence_add_choice(confidence_state *cs, const float *logits, const uint8_t *allowed,
                           uint32_t vocab, int32_t tok) {
    float mx = logits[tok];
    for (uint32_t v = 0; v < vocab; v++)
        if (allowed[v] && logits[v] > mx) mx = logits[v];
    double sum = 0;
    for (uint32_t v = 0; v < vocab; v++)
        if (allowed[v]) sum += exp((double)logits[v] - mx);
    cs->log_prob_sum += (double)logits[tok] - mx - log(sum);
    cs->choices++;
}

double confidence_value(const confidence_state *cs, needle_session_stats *stats) {
    double value = cs->choices ? exp(cs->log_prob_sum / cs->choices) : 1.0;
    if (cs->has_head) {
        const double t0 = util_clock_ms();
        float logit;
        if (head_pool_output(&cs->pool, &logit) == NEEDLE_OK) {
            const double head = head_confidence_probability(logit);
            if (head < value) value = head;
        }
        stats->heads_ms += util_clock_ms() - t0;
    }
    if (!(value >= 0)) value = 0; /* NaN from non-finite logits */
    return value > 1 ? 1 : value;
}
