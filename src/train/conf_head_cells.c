/* The cells of a turn for `needle calibrate` (conf_head.h): a receiver the conversation
 * hands every pooled cell to (api_session_set_cells_tap), kept as bfloat16 per row. */
#include <stdlib.h>
#include <string.h>

#include "api/session.h"
#include "train/conf_head.h"
#include "util/error.h"

struct conf_head_cells {
    session_cells receiver; /* {keep, this}: what the session holds */
    uint32_t rows, d;
    uint16_t **buf; /* [rows] -> [cap][d] */
    uint32_t *len;  /* [rows] tokens kept */
    uint32_t cap;
    int oom;
};

static void keep(void *user, const int32_t *tokens, uint32_t n, uint32_t cell, const float *cells) {
    conf_head_cells *c = user;
    if (cell >= c->rows || c->oom) return;
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] == NEEDLE_TOKEN_PAD) continue;
        if (c->len[cell] == c->cap) {
            const uint32_t cap = c->cap ? 2 * c->cap : 512;
            for (uint32_t r = 0; r < c->rows; r++) {
                uint16_t *nb = realloc(c->buf[r], (size_t)cap * c->d * sizeof *nb);
                if (!nb) {
                    c->oom = 1;
                    return;
                }
                c->buf[r] = nb;
            }
            c->cap = cap;
        }
        uint16_t *dst = c->buf[cell] + (size_t)c->len[cell]++ * c->d;
        for (uint32_t j = 0; j < c->d; j++) dst[j] = conf_head_bf16(cells[(size_t)i * c->d + j]);
    }
}

int conf_head_cells_attach(needle_session *s, uint32_t rows, uint32_t d, conf_head_cells **out) {
    *out = NULL;
    if (!s || !rows || !d) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "confidence cells: bad arguments");
    conf_head_cells *c = calloc(1, sizeof *c);
    if (c) {
        c->buf = calloc(rows, sizeof *c->buf);
        c->len = calloc(rows, sizeof *c->len);
    }
    if (!c || !c->buf || !c->len) {
        conf_head_cells_free(c);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "confidence cells: out of memory");
    }
    c->rows = rows;
    c->d = d;
    c->receiver.fn = keep;
    c->receiver.user = c;
    api_session_set_cells_tap(s, &c->receiver);
    *out = c;
    return NEEDLE_OK;
}

void conf_head_cells_clear(conf_head_cells *c) {
    memset(c->len, 0, c->rows * sizeof *c->len);
    c->oom = 0;
}

int conf_head_cells_take(conf_head_cells *c, uint16_t **cells, uint32_t *T) {
    *cells = NULL;
    *T = 0;
    if (c->oom) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "confidence cells: out of memory");
    const uint32_t n = c->len[0];
    for (uint32_t r = 1; r < c->rows; r++)
        if (c->len[r] != n)
            return needle_fail(NEEDLE_ERR_STATE, "confidence cells: row %u got %u tokens, row 0 %u", r,
                               c->len[r], n);
    if (!n) return needle_fail(NEEDLE_ERR_STATE, "confidence cells: no token was pooled");
    uint16_t *out = malloc((size_t)c->rows * n * c->d * sizeof *out);
    if (!out) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "confidence cells: out of memory");
    for (uint32_t r = 0; r < c->rows; r++)
        memcpy(out + (size_t)r * n * c->d, c->buf[r], (size_t)n * c->d * sizeof *out);
    *cells = out;
    *T = n;
    return NEEDLE_OK;
}

void conf_head_cells_free(conf_head_cells *c) {
    if (!c) return;
    for (uint32_t r = 0; c->buf && r < c->rows; r++) free(c->buf[r]);
    free(c->buf);
    free(c->len);
    free(c);
}
