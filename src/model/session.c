/* Session lifetime, evaluation and generation over the forward pass (see session.h). */
#include "model/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/error.h"
#include "util/struct_size.h"

#define DEFAULT_CHUNK 32u

needle_session_params session_default_params(void) {
    needle_session_params p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    p.n_ctx = 0;
    p.kv_window = -1;
    p.n_sinks = 0;
    p.kv_type = NEEDLE_KV_F32;
    p.activations = NEEDLE_ACT_DEFAULT;
    return p;
}

needle_generate_params needle_generate_default_params(void) {
    needle_generate_params p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    p.max_new_tokens = 0;
    p.temperature = 0.0f;
    p.seed = 0;
    return p;
}

/* Backend memory for `n` floats (zeroed); sets *failed on failure. */
static float *alloc_floats(model_session *s, size_t n, int *failed) {
    float *p = s->ops->alloc(&s->bk, (n ? n : 1) * sizeof(float));
    if (!p) *failed = 1;
    return p;
}

void session_free(model_session *s) {
    if (!s) return;
    if (s->ops) {
        float **bufs[] = {&s->bk.kv_scales, &s->bk.scores, &s->ev_hist, &s->lanes, &s->nx, &s->mix,
                          &s->u, &s->bx, &s->h, &s->hr, &s->x2, &s->q, &s->k, &s->v,
                          &s->gate, &s->o, &s->attn, &s->eng_er, &s->eng_k, &s->eng_v,
                          &s->eng_vhat};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) s->ops->release(&s->bk, *bufs[i]);
        s->ops->release(&s->bk, s->bk.k_cache);
        s->ops->release(&s->bk, s->bk.v_cache);
        s->ops->session_free(&s->bk);
    }
    free(s->kv_layers);
    free(s->logits);
    free(s->rope_cs);
    free(s->eng_slots);
    free(s->cell_lanes);
    free(s->cell_mean);
    session_checkpoint_free(&s->base);
    free(s);
}

/* Floats of the attention's conv-tap history: per layer conv_taps rows of q|k|v. */
static size_t qkv_hist_floats(const needle_model *m) {
    if (!m->w.conv_taps) return 0;
    const size_t row = (size_t)m->w.n_heads * m->w.qk_dim +
                       (size_t)m->w.n_kv_heads * (m->w.qk_dim + m->w.v_dim);
    return (size_t)m->w.n_layers * m->w.conv_taps * row;
}

/* KV slots per layer: pinned sinks plus the window ring, or the whole context. */
static uint32_t kv_slots_for(uint32_t window, uint32_t n_sinks, uint32_t n_ctx) {
    uint64_t slots = window ? (uint64_t)n_sinks + window : n_ctx;
    return slots > n_ctx ? n_ctx : (uint32_t)slots;
}

/* Bytes of one cache row of K or V (with its int8 scales). */
static size_t kv_row_bytes(const backend_ctx *b) {
    const size_t elem = b->kv_type == NEEDLE_KV_F32 ? 4 : b->kv_type == NEEDLE_KV_F16 ? 2 : 1;
    size_t row = b->m->kv_dim * elem;
    if (b->kv_type == NEEDLE_KV_INT8) row += KV_SCALE_GROUPS(b->m->kv_dim) * sizeof(float);
    return row;
}

/* The layers' rows for `slots` slots per global layer with `n_sinks` sinks (backend.h
 * kv_layers). A Needle 3 local layer only ever reads its last `window` positions, so
 * where the backend addresses rows by layer it gets a ring of just that many (position
 * t in slot t % window, no sinks); every other layer the session's sinks and window.
 * Returns the rows of all layers. */
static size_t kv_layout(const model_session *s, uint32_t slots, uint32_t n_sinks,
                        kv_layer_layout *out) {
    const model_weights *w = &s->m->w;
    size_t rows = 0;
    for (uint32_t l = 0; l < w->n_layers; l++) {
        const uint32_t local =
            s->ops->kv_per_layer && w->traits.attention == MODEL_ATTN_SPANNED
                ? w->layers3[l].window
                : 0;
        out[l].row0 = rows;
        if (local) {
            out[l].slots = local < s->n_ctx ? local : s->n_ctx;
            out[l].n_sinks = 0;
            out[l].window = local;
        } else {
            out[l].slots = slots;
            out[l].n_sinks = n_sinks;
            out[l].window = s->bk.window;
        }
        rows += out[l].slots;
    }
    return rows;
}

/* (Re)lays out the KV cache for `slots` positions per global layer and `n_sinks` sinks,
 * growing its buffers (K, V, int8 scales, attention scores) in backend memory when they
 * are too small; on failure the session keeps its old layout and buffers. */
static int kv_cache_alloc(model_session *s, uint32_t slots, uint32_t n_sinks) {
    const struct needle_model *m = s->m;
    const needle_backend_ops *ops = s->ops;
    kv_layer_layout *layers = malloc((m->w.n_layers ? m->w.n_layers : 1) * sizeof *layers);
    if (!layers) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory for a KV layout");
    const size_t rows = kv_layout(s, slots, n_sinks, layers);
    if (rows > s->kv_cap_rows || slots > s->kv_cap_slots) {
        const size_t elems = rows * m->w.kv_dim + 1;
        const int32_t type = s->bk.kv_type;
        const size_t elem = type == NEEDLE_KV_F32 ? 4 : type == NEEDLE_KV_F16 ? 2 : 1;
        const int int8 = type == NEEDLE_KV_INT8;
        void *k = ops->alloc(&s->bk, elems * elem), *v = ops->alloc(&s->bk, elems * elem);
        float *scores = ops->alloc(&s->bk, ((size_t)m->w.n_heads * slots + 1) * sizeof(float));
        float *scales = int8 ? ops->alloc(&s->bk, (2 * rows * KV_SCALE_GROUPS(m->w.kv_dim) + 1) *
                                                      sizeof(float))
                             : NULL;
        if (!k || !v || !scores || (int8 && !scales)) {
            ops->release(&s->bk, k);
            ops->release(&s->bk, v);
            ops->release(&s->bk, scores);
            ops->release(&s->bk, scales);
            free(layers);
            return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory for a KV cache of %u "
                               "positions", slots);
        }
        ops->release(&s->bk, s->bk.k_cache); ops->release(&s->bk, s->bk.v_cache);
        ops->release(&s->bk, s->bk.scores); ops->release(&s->bk, s->bk.kv_scales);
        s->bk.k_cache = k;
        s->bk.v_cache = v;
        s->bk.scores = scores;
        s->bk.kv_scales = scales;
        s->kv_cap_rows = rows;
        s->kv_cap_slots = slots;
    }
    free(s->kv_layers);
    s->kv_layers = layers;
    s->bk.kv_layers = layers;
    s->bk.kv_rows = rows;
    s->bk.kv_slots = slots;
    s->bk.n_sinks = n_sinks;
    return NEEDLE_OK;
}

size_t session_kv_bytes(const model_session *s) {
    return 2 * s->bk.kv_rows * kv_row_bytes(&s->bk);
}

/* needle_session_params.activations (and env NEEDLE_A8 for the default) to a flag. */
static int resolve_activations(int32_t act, const needle_backend_ops *ops, int *a8) {
    if (act < NEEDLE_ACT_DEFAULT || act > NEEDLE_ACT_A8)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: unknown activations %d",
                           act);
    *a8 = act == NEEDLE_ACT_A8;
    if (act == NEEDLE_ACT_DEFAULT) {
        const char *env = getenv("NEEDLE_A8");
        if (env && *env && strcmp(env, "0") && strcmp(env, "1"))
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "NEEDLE_A8=%.40s is not 0 or 1",
                               env);
        *a8 = env && !strcmp(env, "1");
    }
    if (*a8 && !ops->matmul_a8)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: this backend has no "
                           "W·A8 mode (activations = A8 or NEEDLE_A8=1)");
    return NEEDLE_OK;
}

int session_create_with_ops(const needle_model *m, const needle_session_params *params,
                            const needle_backend_ops *ops, model_session **out) {
    if (!m || !out || !ops)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: NULL argument");
    needle_session_params p = session_default_params();
    int size_rc = struct_size_in(&p, params, sizeof p, "session_create: needle_session_params");
    if (size_rc) return size_rc;
    if (p.kv_type < NEEDLE_KV_F32 || p.kv_type > NEEDLE_KV_INT8)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: unknown kv_type %d",
                           p.kv_type);
    if (p.kv_window < -1)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: kv_window %d < -1",
                           p.kv_window);
    int a8 = 0;
    int act_rc = resolve_activations(p.activations, ops, &a8);
    if (act_rc) return act_rc;
    uint32_t n_ctx = p.n_ctx ? p.n_ctx : m->info.max_seq_len;
    if (n_ctx > (1u << 24))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: n_ctx %u too large",
                           n_ctx);
    uint32_t window = 0;
    int arch_rc = m->arch->session_check(m, p.kv_window, a8, &window);
    if (arch_rc) return arch_rc;
    if (!model_backend_runs(m, ops))
        return needle_fail(NEEDLE_ERR_BACKEND, "session_create: this backend cannot run %s "
                           "models", m->arch->name);
    if (p.n_sinks > n_ctx)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: n_sinks %u exceeds "
                           "n_ctx %u", p.n_sinks, n_ctx);

    model_session *s = calloc(1, sizeof *s);
    if (!s) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "session_create: out of memory");
    s->m = m;
    s->n_ctx = n_ctx;
    s->bk.m = &m->w;
    s->bk.device_weights = m->device_weights;
    s->bk.window = window;
    s->bk.n_sinks = p.n_sinks;
    s->bk.kv_type = p.kv_type;
    s->bk.a8 = a8;
    s->bk.chunk = DEFAULT_CHUNK;
    s->bk.n_threads = m->n_threads;
    int rc = ops->session_init(&s->bk);
    if (rc) {
        free(s);
        return rc;
    }
    s->ops = ops;
    const size_t d = m->w.d, nl = m->w.n_lanes, C = s->bk.chunk;
    const size_t A = m->w.attn_dim, kvd = m->w.kv_dim;
    int failed = kv_cache_alloc(s, kv_slots_for(window, p.n_sinks, n_ctx), p.n_sinks) != NEEDLE_OK;

    size_t h_ld = m->w.layers[0].q_proj.cols_pad, o_ld = m->w.layers[0].out_proj.cols_pad;
    size_t e_ld = m->w.n_sites ? m->w.sites[0].key_proj.cols_pad : 1;
    s->bk.ev_ring = (m->w.taps - 1) * m->w.dilation + 1;
    /* the engram ring, then the Needle 3 conv-tap ring: one block, so checkpoints keep both */
    const size_t eng_floats = m->w.n_sites ? (size_t)m->w.n_sites * s->bk.ev_ring * d : 0;
    const size_t tap_floats = qkv_hist_floats(m);
    if (eng_floats + tap_floats) s->ev_hist = alloc_floats(s, eng_floats + tap_floats, &failed);
    if (tap_floats && s->ev_hist) {
        s->bk.qkv_hist = s->ev_hist + eng_floats;
        s->bk.qkv_ring = m->w.conv_taps;
    }
    s->lanes = alloc_floats(s, C * nl * d, &failed);
    s->nx = alloc_floats(s, C * m->w.phi_pre.cols_pad, &failed);
    s->mix = alloc_floats(s, C * (2 * nl + nl * nl), &failed);
    s->u = alloc_floats(s, C * d, &failed);
    s->bx = alloc_floats(s, C * d, &failed);
    s->h = alloc_floats(s, C * d, &failed);
    s->hr = alloc_floats(s, C * h_ld, &failed);
    s->x2 = alloc_floats(s, C * d, &failed);
    s->q = alloc_floats(s, C * A, &failed);
    s->k = alloc_floats(s, C * kvd, &failed);
    s->v = alloc_floats(s, C * kvd, &failed);
    s->gate = alloc_floats(s, C * A, &failed);
    s->o = alloc_floats(s, C * o_ld, &failed);
    s->attn = alloc_floats(s, C * d, &failed);
    s->eng_er = alloc_floats(s, C * e_ld, &failed);
    s->eng_k = alloc_floats(s, (size_t)m->w.n_sites * C * d, &failed);
    s->eng_v = alloc_floats(s, (size_t)m->w.n_sites * C * d, &failed);
    s->eng_vhat = alloc_floats(s, C * d, &failed);
    /* host memory */
    s->logits = calloc(m->w.vocab, sizeof(float));
    s->rope_cs = calloc(C * m->w.head_dim, sizeof(float));
    /* engram header fields are only validated (and meaningful) when there are sites */
    s->eng_slots = calloc(m->w.n_sites ? C * m->w.n_tables : 1, sizeof(uint32_t));
    s->cell_lanes = malloc(C * nl * d * sizeof(float));
    s->cell_mean = malloc(C * d * sizeof(float));
    if (!s->logits || !s->rope_cs || !s->eng_slots || !s->cell_lanes || !s->cell_mean) failed = 1;
    if (failed) {
        session_free(s);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "session_create: out of memory for the "
                           "KV cache and buffers");
    }
    *out = s;
    needle_clear_error();
    return NEEDLE_OK;
}

int session_create(const needle_model *m, const needle_session_params *params,
                   model_session **out) {
    if (!m || !out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: NULL argument");
    /* the operations of the backend chosen at model open (backend/backend.h) */
    const needle_backend_ops *ops = m->backend ? m->backend->ops : &cpu_backend_ops;
    return session_create_with_ops(m, params, ops, out);
}

/* Bytes of the engram ring and the Needle 3 conv-tap ring after it (0 without either). */
static size_t engram_ring_bytes(const model_session *s) {
    const struct needle_model *m = s->m;
    return ((size_t)m->w.n_sites * s->bk.ev_ring * m->w.d + qkv_hist_floats(m)) * sizeof(float);
}

/* The rows of positions [*first, *first + *rows) of one layer that a checkpoint at `pos`
 * keeps: those the state at pos attends to, [oldest, pos), that the next `horizon`
 * positions may overwrite (position y's ring slot is reused by y + window). */
static void kv_layer_keep(const kv_layer_layout *L, uint32_t pos, uint32_t horizon,
                          uint32_t *first, uint32_t *rows) {
    const uint32_t window = L->window, sinks = L->n_sinks;
    *first = *rows = 0;
    if (window && pos > sinks && (uint64_t)pos + horizon > window) {
        *first = pos + 1 > window && pos + 1 - window > sinks ? pos + 1 - window : sinks;
        const uint64_t end64 = (uint64_t)pos + horizon - window;
        const uint32_t end = end64 < pos ? (uint32_t)end64 : pos;
        *rows = end > *first ? end - *first : 0;
    }
}

/* Copies the cache rows of positions [first, first + n) of one layer to host (save) or
 * back, advancing *host. Their slots are consecutive but for the wrap of the ring. */
static void kv_copy_rows(model_session *s, uint8_t **host, uint32_t layer, uint32_t first,
                         uint32_t n, int save) {
    const backend_ctx *b = &s->bk;
    const kv_layer_layout *L = &b->kv_layers[layer];
    const uint32_t kvd = b->m->kv_dim, groups = KV_SCALE_GROUPS(kvd);
    const size_t elem = b->kv_type == NEEDLE_KV_F32 ? 4 : b->kv_type == NEEDLE_KV_F16 ? 2 : 1;
    const size_t row = kvd * elem;
    for (uint32_t done = 0; done < n;) {
        const uint32_t slot = nm_kv_slot(first + done, L->n_sinks, L->window);
        uint32_t run = n - done;
        if (L->window && slot + run > L->n_sinks + L->window) run = L->n_sinks + L->window - slot;
        const size_t at = L->row0 + slot;
        for (int which = 0; which < 2; which++) {
            void *cache = (uint8_t *)(which ? b->v_cache : b->k_cache) + at * row;
            if (save) s->ops->download(&s->bk, *host, cache, run * row);
            else s->ops->upload(&s->bk, cache, *host, run * row);
            *host += run * row;
            if (b->kv_type != NEEDLE_KV_INT8) continue;
            float *sc = b->kv_scales + ((size_t)which * b->kv_rows + at) * groups;
            const size_t sb = (size_t)run * groups * sizeof(float);
            if (save) s->ops->download(&s->bk, *host, sc, sb);
            else s->ops->upload(&s->bk, sc, *host, sb);
            *host += sb;
        }
        done += run;
    }
}

/* Copies every layer's kept rows (kv_layer_keep) of a checkpoint at pos to cp->kv or back. */
static void kv_copy_kept(model_session *s, uint8_t *host, uint32_t pos, uint32_t horizon,
                         int save) {
    for (uint32_t l = 0; l < s->m->w.n_layers; l++) {
        uint32_t first, rows;
        kv_layer_keep(&s->bk.kv_layers[l], pos, horizon, &first, &rows);
        if (rows) kv_copy_rows(s, &host, l, first, rows, save);
    }
}

int session_checkpoint_save(model_session *s, session_checkpoint *cp, uint32_t horizon) {
    const size_t bytes = engram_ring_bytes(s);
    if (bytes && !cp->engram) {
        cp->engram = malloc(bytes);
        if (!cp->engram)
            return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "session: out of memory for a checkpoint");
    }
    const uint32_t pos = s->pos;
    size_t rows = 0;
    for (uint32_t l = 0; l < s->m->w.n_layers; l++) {
        uint32_t first, n;
        kv_layer_keep(&s->bk.kv_layers[l], pos, horizon, &first, &n);
        rows += n;
    }
    const size_t kv_bytes = 2 * rows * kv_row_bytes(&s->bk);
    if (kv_bytes > cp->kv_cap) {
        uint8_t *kv = realloc(cp->kv, kv_bytes);
        if (!kv)
            return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "session: out of memory for a checkpoint "
                               "of %zu KV rows", rows);
        cp->kv = kv;
        cp->kv_cap = kv_bytes;
    }
    cp->pos = pos;
    cp->horizon = horizon;
    cp->kv_sinks = s->bk.n_sinks;
    cp->kv_rows = rows;
    memcpy(cp->history, s->history, sizeof cp->history);
    if (bytes) s->ops->download(&s->bk, cp->engram, s->ev_hist, bytes);
    if (rows) kv_copy_kept(s, cp->kv, pos, horizon, 1);
    return NEEDLE_OK;
}

int session_checkpoint_restore(model_session *s, const session_checkpoint *cp) {
    if (cp->pos > s->pos || s->pos - cp->pos > cp->horizon)
        return needle_fail(NEEDLE_ERR_STATE, "session: cannot return to position %u from %u: "
                           "the checkpoint covers %u positions", cp->pos, s->pos, cp->horizon);
    /* its rows were saved for the layout of its sinks (session_configure_sinks re-lays) */
    if (cp->kv_rows && cp->kv_sinks != s->bk.n_sinks)
        return needle_fail(NEEDLE_ERR_STATE, "session: the checkpoint was saved with %u sink "
                           "positions, the session now has %u", cp->kv_sinks, s->bk.n_sinks);
    s->pos = cp->pos;
    s->has_logits = 0;
    memcpy(s->history, cp->history, sizeof s->history);
    const size_t bytes = engram_ring_bytes(s);
    if (bytes) s->ops->upload(&s->bk, s->ev_hist, cp->engram, bytes);
    if (cp->kv_rows) kv_copy_kept(s, cp->kv, cp->pos, cp->horizon, 0);
    return NEEDLE_OK;
}

void session_checkpoint_free(session_checkpoint *cp) {
    if (!cp) return;
    free(cp->engram);
    free(cp->kv);
    memset(cp, 0, sizeof *cp);
}

int session_set_base(model_session *s) {
    int rc = session_checkpoint_save(s, &s->base, UINT32_MAX);
    s->has_base = rc == NEEDLE_OK;
    return rc;
}

const struct needle_model *session_model(const model_session *s) { return s->m; }
uint32_t session_context_length(const model_session *s) { return s->n_ctx; }
uint32_t session_window(const model_session *s) { return s->bk.window; }
needle_session_stats *session_stats(model_session *s) { return &s->stats; }
uint32_t session_position(const model_session *s) { return s->pos; }
const float *session_logits(const model_session *s) { return s->has_logits ? s->logits : NULL; }
float *session_logits_mut(model_session *s) { return s->has_logits ? s->logits : NULL; }

/* The base covers any number of later positions (its KV rows that a window could drop
 * are in the checkpoint), so returning to it only fails when the session was re-laid. */
void session_reset(model_session *s) {
    if (!s->has_base || session_checkpoint_restore(s, &s->base) != NEEDLE_OK) {
        s->has_base = 0;
        s->pos = 0;
        s->has_logits = 0;
    }
}

/* session_forward with its bookkeeping (stats, timing). */
static int run_forward(model_session *s, const int32_t *tokens, uint32_t n, float *all_logits,
                       const logits_request *want, const session_cells *cells) {
    double t0 = util_clock_ms();
    int rc = session_forward(s, tokens, n, all_logits, want, cells);
    s->stats.forward_ms += util_clock_ms() - t0;
    if (rc == NEEDLE_OK) s->stats.tokens_evaluated += n;
    s->stats.forward_calls++;
    return rc;
}

int session_run(model_session *s, const int32_t *tokens, uint32_t n, float *all_logits,
                int want_logits, const session_cells *cells) {
    const logits_request want = {!want_logits && !all_logits, NULL, 0};
    return run_forward(s, tokens, n, all_logits, &want, cells);
}

int session_run_rows(model_session *s, const int32_t *tokens, uint32_t n, const int32_t *rows,
                     uint32_t n_rows, const session_cells *cells) {
    const logits_request want = {0, rows, n_rows};
    return run_forward(s, tokens, n, NULL, &want, cells);
}

int session_prefill(model_session *s, const int32_t *tokens, uint32_t n, int want_logits,
                    const needle_callbacks *cb, const session_cells *cells) {
    if (!cb || !cb->on_prefill) return session_run(s, tokens, n, NULL, want_logits, cells);
    const uint32_t step = s->bk.chunk ? s->bk.chunk : n;
    for (uint32_t done = 0; done < n;) {
        const uint32_t cn = n - done < step ? n - done : step;
        /* only the last chunk's logits can be wanted */
        int rc = session_run(s, tokens + done, cn, NULL, done + cn == n && want_logits, cells);
        if (rc) return rc;
        done += cn;
        if (cb->on_prefill(cb->user, done, n))
            return needle_fail(NEEDLE_ERR_CANCELLED, "prefill cancelled by the callback after "
                               "%u of %u tokens", done, n);
    }
    return NEEDLE_OK;
}

int session_emit(const needle_callbacks *cb, int32_t kind, int32_t token, const char *text,
                 size_t len) {
    if (!cb || !cb->on_token || !len) return NEEDLE_OK;
    if (cb->on_token(cb->user, kind, token, text, len))
        return needle_fail(NEEDLE_ERR_CANCELLED, "decoding cancelled by the callback");
    return NEEDLE_OK;
}

int session_configure_sinks(model_session *s, uint32_t n_sinks) {
    if (n_sinks > s->n_ctx)
        return needle_fail(NEEDLE_ERR_CONTEXT_FULL, "%u sink positions exceed the %u-position "
                           "context", n_sinks, s->n_ctx);
    int rc = kv_cache_alloc(s, kv_slots_for(s->bk.window, n_sinks, s->n_ctx), n_sinks);
    if (rc) return rc;
    s->pos = 0;
    s->has_logits = 0;
    s->has_base = 0;
    return NEEDLE_OK;
}

static int check_tokens(const model_session *s, const int32_t *tokens, size_t n) {
    if (n > s->n_ctx - s->pos)
        return needle_fail(NEEDLE_ERR_CONTEXT_FULL, "%zu tokens do not fit: position %u of a "
                           "%u-position context", n, s->pos, s->n_ctx);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= s->m->w.vocab)
            return needle_fail(NEEDLE_ERR_INVALID_TOKEN, "token %d at index %zu is outside "
                               "[0, %u)", tokens[i], i, s->m->w.vocab);
    return NEEDLE_OK;
}

int session_eval(model_session *s, const int32_t *tokens, size_t n, float *logits, size_t cap,
                 const session_cells *cells) {
    if (!tokens && n)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_eval: NULL argument");
    if (n == 0) return NEEDLE_OK;
    int rc = check_tokens(s, tokens, n);
    if (rc) return rc;
    if (logits && cap / s->m->w.vocab < n)
        return needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "session_eval: logits buffer holds %zu "
                           "floats, %zu needed", cap, n * (size_t)s->m->w.vocab);
    rc = session_run(s, tokens, (uint32_t)n, logits, 1, cells);
    if (rc == NEEDLE_OK) needle_clear_error();
    return rc;
}

/* xorshift64* : small, seedable, identical on every platform */
static uint64_t rng_next(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

int32_t session_pick_token(const float *logits, const uint8_t *allowed, uint32_t vocab,
                           float temperature, uint64_t *rng) {
    int32_t best = -1;
    for (uint32_t v = 0; v < vocab; v++)
        if ((!allowed || allowed[v]) && (best < 0 || logits[v] > logits[best])) best = (int32_t)v;
    if (best < 0 || temperature <= 0.0f) return best;
    const float mx = logits[best];
    double total = 0.0;
    for (uint32_t v = 0; v < vocab; v++)
        if (!allowed || allowed[v]) total += exp((double)(logits[v] - mx) / temperature);
    double r = (double)(rng_next(rng) >> 11) * (1.0 / 9007199254740992.0) * total;
    for (uint32_t v = 0; v < vocab; v++) {
        if (allowed && !allowed[v]) continue;
        r -= exp((double)(logits[v] - mx) / temperature);
        if (r < 0.0) return (int32_t)v;
    }
    return best;
}

int session_generate(model_session *s, const int32_t *prompt, size_t n_prompt,
                     const needle_generate_params *params, const needle_callbacks *cb,
                     const session_cells *cells, int32_t *out, size_t cap, size_t *n_out) {
    if ((!prompt && n_prompt) || (!out && cap) || !n_out)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_generate: NULL argument");
    needle_generate_params p = needle_generate_default_params();
    int size_rc = struct_size_in(&p, params, sizeof p,
                                 "session_generate: needle_generate_params");
    if (size_rc) return size_rc;
    if (!(p.temperature >= 0.0f) || !isfinite(p.temperature))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_generate: temperature must "
                           "be a finite value >= 0");
    *n_out = 0;
    int rc = check_tokens(s, prompt, n_prompt);
    if (rc) return rc;
    if (n_prompt && (rc = session_prefill(s, prompt, (uint32_t)n_prompt, 1, cb, cells))) return rc;
    if (!s->has_logits)
        return needle_fail(NEEDLE_ERR_STATE, "session_generate: nothing evaluated yet; give a "
                           "prompt");
    uint64_t rng = p.seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    size_t produced = 0;
    int strip_done = 0;
    while (p.max_new_tokens == 0 || produced < p.max_new_tokens) {
        int32_t tok = session_pick_token(s->logits, NULL, s->m->w.vocab, p.temperature, &rng);
        if (tok == NEEDLE_TOKEN_EOS) break;
        if (produced >= cap) {
            *n_out = produced;
            return needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "session_generate: output holds %zu "
                               "tokens", cap);
        }
        out[produced++] = tok;
        if (cb && cb->on_token) {
            const char *text = "";
            size_t len = 0;
            if (s->m->tok) tokenizer_token_bytes(s->m->tok, tok, &text, &len);
            /* as needle_detokenize: the text's first space is the dummy prefix */
            if (!strip_done && len) {
                strip_done = 1;
                if (text[0] == ' ') {
                    text++;
                    len--;
                }
            }
            if ((rc = session_emit(cb, NEEDLE_PIECE_TEXT, tok, text, len))) break;
        }
        if (s->pos >= s->n_ctx) break;
        if ((rc = session_run(s, &tok, 1, NULL, 1, cells))) break;
    }
    *n_out = produced;
    if (rc == NEEDLE_OK) needle_clear_error();
    return rc;
}

int session_get_stats(const model_session *s, needle_session_stats *out) {
    if (!out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "get_stats: NULL argument");
    needle_session_stats full = s->stats;
    if (s->ops->thread_stats) s->ops->thread_stats(&s->bk, &full.pool_dispatches, &full.pool_sync_ms);
    full.kv_bytes = session_kv_bytes(s);
    full.size = sizeof full;
    return struct_size_out(out, &full, sizeof full, "get_stats: needle_session_stats");
}
