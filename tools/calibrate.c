/* `needle calibrate`: trains a Needle 3 checkpoint's confidence head on what the engine
 * answers (src/train/conf_head.h), so that a model fine-tuned or trained here reports a
 * confidence fitted to it instead of none (the official build drops the head of a tuned
 * network: its fine-tuning never trains it).
 *
 *   1. The checkpoint is built in memory as `needle build` builds it, without its
 *      confidence head (the envelope's confidence is then the decoding's alone).
 *   2. Every example of DATA.jsonl (needle eval's format) runs as one fresh greedy query
 *      turn; its answer is scored exact or not (eval_score.h), and the cells the confidence
 *      head pools over BOS + prompt + completion are kept (bfloat16), handed over by the
 *      conversation as the forward pass makes them (conf_head_cells_attach).
 *   3. A seeded share of the examples is held out; the head is trained on the rest by
 *      binary cross-entropy of its logit against exact (AdamW as `needle finetune`,
 *      warm-up and cosine, clip 1.0), the trunk frozen.
 *   4. The checkpoint is written again with the head replaced and `needle_calibrate` in
 *      its run metadata, which makes `needle build` keep the head. With --build-out the
 *      calibrated checkpoint is built and the held-out examples scored through that file
 *      by `needle eval`, whose confidence table is the number that ships.
 * The answers do not depend on the head (confidence changes no decoding choice), so the
 * labels are the trunk's. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "build.h"
#include "cli.h"
#include "compat.h"
#include "eval_data.h"
#include "eval_score.h"
#include "export/cact_write.h"
#include "train/conf_head.h"
#include "train/lora_merge.h"
#include "train/optim.h"
#include "util/platform.h"

#define CAL_ENVELOPE (1 << 20)

/* ---- examples ----------------------------------------------------------------------------- */

typedef struct cal_example {
    uint16_t *cells; /* [rows][T][d] */
    uint32_t T;
    int exact;
    double decoding; /* the envelope's confidence without a head: the decoding's */
    long line;
    uint32_t src; /* its index among the examples read */
} cal_example;

typedef struct cal_options {
    const char *ckpt, *data, *weights, *out, *build_out;
    long epochs, batch, limit, n_new, threads;
    double lr, val_split;
    unsigned long long seed;
    int n_new_set;
} cal_options;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

/* The training loss of one answer with head logit y, and its derivative in y (*dy): the
 * cross-entropy of what the engine will report, min(sigmoid(y), decoding), against exact,
 * plus HEAD_WEIGHT times the head's own cross-entropy. The first term reaches the head only
 * where it is the smaller (it can only lower the confidence: a veto on answers the
 * decoding was sure of and got wrong); the second keeps a gradient everywhere, so a head
 * above the decoding still learns which answers to veto. (Trained alone, the head ranked
 * the answers worse than the decoding's confidence does: on cycle 1's held-out answers AUC
 * 0.74 against 0.87, and the minimum followed the head.) */
#define HEAD_WEIGHT 0.1

static double engine_loss(float y, const cal_example *e, double *dy) {
    const double head = 1.0 / (1.0 + exp(-(double)y)), label = e->exact;
    double p = head < e->decoding ? head : e->decoding;
    p = p < 1e-6 ? 1e-6 : p > 1 - 1e-6 ? 1 - 1e-6 : p;
    const double loss = -(label * log(p) + (1 - label) * log(1 - p)) +
                        HEAD_WEIGHT * (softplus(y) - label * y);
    *dy = (head < e->decoding ? head - label : 0) + HEAD_WEIGHT * (head - label);
    return loss;
}

/* What a confidence tells apart over some examples (eval_score.h's calibration: the least
 * confident fifth's error ratio, what a perfect ranking would reach, the ROC AUC), and
 * the head's mean cross-entropy there. */
typedef struct head_score {
    double loss;
    eval_calibration cal;
} head_score;

typedef enum { BY_HEAD, BY_DECODING, BY_ENGINE } score_source;

/* "0.725" or "n/a" (eval_calibration's -1) */
static const char *num(double v, char *buf) {
    if (v < 0) return "n/a";
    snprintf(buf, 16, "%.3f", v);
    return buf;
}

/* source: the head alone, the decoding's confidence alone, or their minimum (what the
 * engine reports once the head ships). */
static head_score score_head(const conf_head_shape *sh, const float *theta, const cal_example *ex,
                             const uint32_t *idx, uint32_t n, conf_head_scratch *s, score_source source) {
    head_score hs;
    memset(&hs, 0, sizeof hs);
    eval_metrics m;
    eval_metrics_init(&m);
    for (uint32_t i = 0; i < n; i++) {
        const cal_example *e = &ex[idx[i]];
        const float y = conf_head_forward(sh, theta, e->cells, e->T, s);
        double g;
        hs.loss += engine_loss(y, e, &g);
        const double head = 1.0 / (1.0 + exp(-(double)y));
        const double c = source == BY_HEAD ? head : source == BY_DECODING ? e->decoding
                         : head < e->decoding ? head : e->decoding;
        if (eval_metrics_add_confidence(&m, c, e->exact)) break; /* out of memory: fewer counted */
    }
    if (n) hs.loss /= n;
    hs.cal = eval_metrics_calibration(&m);
    eval_metrics_free(&m);
    return hs;
}

/* ---- the command -------------------------------------------------------------------------- */

static int parse_options(const cli_command *self, int argc, char **argv, cal_options *o) {
    memset(o, 0, sizeof *o);
    o->epochs = 20;
    o->batch = 32;
    o->lr = 3e-3;
    o->val_split = 0.2;
    const char *pos[2] = {NULL, NULL};
    const cli_option opts[] = {{"--weights", "-w", CLI_TEXT, &o->weights, 0, 0, NULL},
                               {"--out", "-o", CLI_TEXT, &o->out, 0, 0, NULL},
                               {"--build-out", NULL, CLI_TEXT, &o->build_out, 0, 0, NULL},
                               {"--epochs", NULL, CLI_LONG, &o->epochs, 1, 100000, NULL},
                               {"--batch-size", NULL, CLI_LONG, &o->batch, 1, 1L << 20, NULL},
                               {"--lr", NULL, CLI_REAL, &o->lr, 0, 0, NULL},
                               {"--val-split", NULL, CLI_REAL, &o->val_split, 0, 0, NULL},
                               {"--limit", NULL, CLI_LONG, &o->limit, 1, 1L << 24, NULL},
                               {"--seed", NULL, CLI_U64, &o->seed, 0, 0, NULL},
                               {"--max-new-tokens", "-n", CLI_LONG, &o->n_new, 1, 1L << 24, &o->n_new_set},
                               {"--threads", "-t", CLI_LONG, &o->threads, 1, 1024, NULL},
                               {0}};
    const int st = cli_parse(self, argc, argv, opts, pos, 2);
    if (st != CLI_GO) return st;
    o->ckpt = pos[0];
    o->data = pos[1];
    if (!o->ckpt || !o->data) return cli_usage_error(self, "needs CHECKPOINT.safetensors and DATA.jsonl");
    if (!o->out) return cli_usage_error(self, "pass --out OUT.safetensors (the calibrated checkpoint)");
    if (!strcmp(o->out, o->ckpt)) return cli_usage_error(self, "--out must not be the input checkpoint");
    if (!(o->val_split < 1)) return cli_usage_error(self, "--val-split must be below 1");
    if (!(o->lr > 0)) return cli_usage_error(self, "--lr must be above 0");
    if (!o->weights && !cli_default_weights(&o->weights) && !o->weights) return cli_no_weights();
    return CLI_GO;
}

/* The head's shape and starting values from the checkpoint; 1 after printing the error. */
static int read_head(const st_file *ck, const char *path, conf_head_shape *sh, float **theta) {
    const st_tensor *probes = st_find(ck, conf_head_names[0]), *query = st_find(ck, conf_head_names[2]);
    if (!probes || !query || probes->ndim != 3 || query->ndim != 2) {
        fprintf(stderr, "needle: %s has no confidence head (confidence_head/probes [L+1, K, d] and "
                "/query [Q, d]) to train\n", path);
        return 1;
    }
    sh->rows = (uint32_t)probes->shape[0];
    sh->per_row = (uint32_t)probes->shape[1];
    sh->d = (uint32_t)probes->shape[2];
    sh->queries = (uint32_t)query->shape[0];
    uint64_t numel[CONF_HEAD_TENSORS];
    const size_t total = conf_head_layout(sh, numel);
    if (!(*theta = malloc(total * sizeof **theta))) return cli_lib_error("confidence head", NEEDLE_ERR_OUT_OF_MEMORY);
    float *at = *theta;
    for (int i = 0; i < CONF_HEAD_TENSORS; i++) {
        const st_tensor *t = st_find(ck, conf_head_names[i]);
        uint64_t have = 1;
        for (uint32_t k = 0; t && k < t->ndim; k++) have *= t->shape[k];
        if (!t || have != numel[i]) {
            fprintf(stderr, "needle: %s: %s is %s (expected %llu values)\n", path, conf_head_names[i],
                    t ? "of another size" : "missing", (unsigned long long)numel[i]);
            free(*theta);
            *theta = NULL;
            return 1;
        }
        for (uint64_t k = 0; k < numel[i]; k++) at[k] = st_get(t, k);
        at += numel[i];
    }
    return 0;
}

/* Runs every example through the engine: label and cells. Returns 0, or 1 after printing
 * the error. Turns that fail are skipped (counted in *failed). */
static int collect(const cal_options *o, const needle_model *m, const conf_head_shape *sh,
                   const eval_example *exs, const long *lines, uint32_t n, cal_example *out,
                   uint32_t *n_out, uint32_t *failed) {
    conf_head_cells *cells = NULL;
    char *env_text = malloc(CAL_ENVELOPE);
    needle_session *s = NULL;
    int rc = 1;
    *n_out = *failed = 0;
    if (!env_text) {
        cli_lib_error("calibrate", NEEDLE_ERR_OUT_OF_MEMORY);
        goto done;
    }
    needle_session_params sp = needle_session_default_params();
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    if (info.kv_window) sp.n_ctx = 1u << 20; /* as needle eval: the window bounds memory */
    int st = needle_session_create(m, &sp, &s);
    if (!st) st = conf_head_cells_attach(s, sh->rows, sh->d, &cells);
    if (st) {
        cli_lib_error("session", st);
        goto done;
    }
    const int bar = isatty(STDERR_FILENO);
    size_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        const eval_example *ex = &exs[i];
        conf_head_cells_clear(cells);
        size_t len = 0;
        cJSON *env = NULL;
        needle_complete_params p = needle_complete_default_params();
        if (o->n_new_set) p.max_new_tokens = (int32_t)o->n_new;
        p.turn = NEEDLE_TURN_QUERY;
        st = needle_session_set_tools(s, ex->system, ex->tools_text);
        if (!st) st = needle_session_complete(s, ex->query, &p, env_text, CAL_ENVELOPE, &len);
        if (!st) env = cJSON_Parse(env_text);
        const cJSON *calls = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(env, "success"))
                                 ? cJSON_GetObjectItemCaseSensitive(env, "function_calls")
                                 : NULL;
        if (!calls) {
            cJSON_Delete(env);
            (*failed)++;
            continue;
        }
        cal_example *e = &out[*n_out];
        e->exact = eval_score(calls, ex->expected, ex->tools).exact;
        const cJSON *conf = cJSON_GetObjectItemCaseSensitive(env, "confidence");
        e->decoding = cJSON_IsNumber(conf) ? conf->valuedouble : 0;
        cJSON_Delete(env);
        e->line = lines[i];
        e->src = i;
        /* every position of the conversation pooled once, in every row */
        if ((st = conf_head_cells_take(cells, &e->cells, &e->T)) || e->T != needle_session_position(s)) {
            if (!st) {
                free(e->cells);
                e->cells = NULL;
            }
            fprintf(stderr, "needle: %s:%ld: %s (%u cells for %u positions)\n", o->data, lines[i],
                    st ? needle_last_error() : "the head's cells do not cover the conversation once", e->T,
                    needle_session_position(s));
            goto done;
        }
        bytes += (size_t)sh->rows * e->T * sh->d * sizeof *e->cells;
        (*n_out)++;
        if (bar)
            fprintf(stderr, "\r  answered  %u/%u  %.0f MB of cells", i + 1, n, (double)bytes / 1e6);
    }
    if (bar) fprintf(stderr, "\r\033[K");
    rc = 0;
done:
    needle_session_free(s);
    conf_head_cells_free(cells); /* after the session, which held it */
    free(env_text);
    return rc;
}

/* The input checkpoint with the head replaced and the calibration recorded in `run`. */
static int write_checkpoint(const cal_options *o, const conf_head_shape *sh, const float *theta,
                            uint32_t n_train, uint32_t n_val, double exact_share, head_score val) {
    train_checkpoint ck;
    int st = train_checkpoint_read(o->ckpt, NULL, 3, &ck);
    if (st) return cli_lib_error(o->ckpt, st);
    uint64_t numel[CONF_HEAD_TENSORS];
    conf_head_layout(sh, numel);
    const float *at = theta;
    for (int i = 0; i < CONF_HEAD_TENSORS; i++) {
        train_tensor *t = (train_tensor *)train_checkpoint_find(&ck, conf_head_names[i]);
        if (!t || t->numel != numel[i]) {
            train_checkpoint_release(&ck);
            fprintf(stderr, "needle: %s changed while calibrating (%s)\n", o->ckpt, conf_head_names[i]);
            return 1;
        }
        memcpy(t->data, at, numel[i] * sizeof *at);
        at += numel[i];
    }
    cJSON *run = cJSON_Parse(ck.run ? ck.run : "{}");
    if (!cJSON_IsObject(run)) {
        cJSON_Delete(run);
        run = cJSON_CreateObject();
    }
    cJSON *cal = cJSON_CreateObject();
    cJSON_AddStringToObject(cal, "data", o->data);
    cJSON_AddNumberToObject(cal, "train", n_train);
    cJSON_AddNumberToObject(cal, "val", n_val);
    cJSON_AddNumberToObject(cal, "exact", exact_share);
    cJSON_AddNumberToObject(cal, "epochs", (double)o->epochs);
    cJSON_AddNumberToObject(cal, "lr", o->lr);
    cJSON_AddNumberToObject(cal, "seed", (double)o->seed);
    if (n_val) cJSON_AddNumberToObject(cal, "val_loss", val.loss);
    cJSON_DeleteItemFromObjectCaseSensitive(run, "needle_calibrate");
    cJSON_AddItemToObject(run, "needle_calibrate", cal);
    char *text = cJSON_PrintUnformatted(run);
    cJSON_Delete(run);
    if (!text) {
        train_checkpoint_release(&ck);
        return cli_lib_error("calibrate", NEEDLE_ERR_OUT_OF_MEMORY);
    }
    free(ck.run);
    ck.run = text;
    st = train_checkpoint_write(o->out, &ck);
    train_checkpoint_release(&ck);
    return st ? cli_lib_error(o->out, st) : 0;
}

static int write_lines(const char *path, char **texts, const uint32_t *pick, uint32_t n) {
    FILE *f = platform_fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "needle: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    for (uint32_t i = 0; i < n; i++) {
        const char *t = texts[pick[i]];
        const size_t len = strlen(t);
        fwrite(t, 1, len, f);
        if (!len || t[len - 1] != '\n') fputc('\n', f);
    }
    if (fclose(f)) {
        fprintf(stderr, "needle: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

/* 0 when the folder `path` would be written in exists and is writable, else 1 after saying
 * so: checked before the answers are computed, not after. */
static int writable_folder(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    if (access(dir, W_OK) == 0) return 0;
    fprintf(stderr, "needle: cannot write %s: %s: %s\n", path, dir, strerror(errno));
    return 1;
}

static int run_calibrate(const cli_command *self, int argc, char **argv) {
    cal_options o;
    int rc = parse_options(self, argc, argv, &o);
    if (rc != CLI_GO) return rc;
    rc = 1;
    eval_dataset data = {0}; /* the examples as eval reads them, with their lines' text (the held-out file) */
    eval_example *exs = NULL;
    char **texts = NULL;
    long *lines = NULL;
    uint32_t n = 0, n_ex = 0, failed = 0;
    cal_example *ex = NULL;
    uint8_t *base = NULL, *ck_image = NULL, *image = NULL;
    size_t base_size = 0, ck_size = 0, image_size = 0;
    float *theta = NULL, *grad = NULL;
    uint32_t *order = NULL;
    needle_model *m = NULL;
    st_file ck = {0};
    cact_file bf;
    int have_bf = 0, have_optim = 0;
    train_optim opt;
    conf_head_scratch scratch = {0};
    char *heldout = NULL;

    if (writable_folder(o.out) || (o.build_out && writable_folder(o.build_out))) goto done;
    if (eval_dataset_read(o.data, o.limit, 0, 1, &data)) goto done;
    exs = data.ex, texts = data.text, lines = data.line, n = (uint32_t)data.n;
    if (n < 2) {
        fprintf(stderr, "needle: %s: %s\n", o.data, n ? "one example; calibrating needs more" : "no examples");
        goto done;
    }
    if (!(base = cli_read_file(o.weights, &base_size)) || !(ck_image = cli_read_file(o.ckpt, &ck_size))) goto done;
    int st = cact_parse(base, base_size, &bf);
    if (st) {
        cli_lib_error(o.weights, st);
        goto done;
    }
    have_bf = 1;
    if (bf.generation != 3 || bf.tokenizer_index < 0) {
        fprintf(stderr, "needle: %s: calibrate trains the confidence head of Needle 3 (a base .cact with its "
                "tokenizer)\n", o.weights);
        goto done;
    }
    if ((st = st_parse(ck_image, ck_size, &ck))) {
        cli_lib_error(o.ckpt, st);
        goto done;
    }
    conf_head_shape sh;
    if (read_head(&ck, o.ckpt, &sh, &theta)) goto done;

    /* 1. the checkpoint as the build makes it, without its confidence head */
    bits_map bits;
    bits_map_parse("4", &bits);
    const cact_tensor *tok = &bf.tensors[bf.tokenizer_index];
    const build_job job = {.ckpt_path = o.ckpt, .ckpt_image = ck_image, .ckpt_size = ck_size,
                           .generation = 3, .bits = &bits, .tokenizer = tok->data,
                           .tokenizer_size = (size_t)tok->nbytes, .no_confidence = 1, .quiet = 1};
    if (build_image(&job, &image, &image_size)) goto done;
    needle_model_params mp = needle_model_default_params();
    mp.n_threads = (int32_t)o.threads;
    if ((st = needle_model_open_blob(image, image_size, &mp, &m))) {
        cli_lib_error(o.ckpt, st);
        goto done;
    }
    needle_model_info info = {.size = sizeof info};
    needle_model_get_info(m, &info);
    if (info.num_layers + 1 != sh.rows) {
        fprintf(stderr, "needle: %s: the confidence head has %u rows for %u layers\n", o.ckpt, sh.rows,
                info.num_layers);
        goto done;
    }

    /* 2. answers and cells */
    if (!(ex = calloc(n, sizeof *ex))) {
        cli_lib_error("calibrate", NEEDLE_ERR_OUT_OF_MEMORY);
        goto done;
    }
    printf("  %-9s %u examples of %s through the engine (%s without its confidence head)\n", "answer", n,
           o.data, o.ckpt);
    fflush(stdout);
    const double t0 = cli_now_ms();
    if (collect(&o, m, &sh, exs, lines, n, ex, &n_ex, &failed)) goto done;
    uint32_t n_exact = 0, max_t = 1;
    size_t bytes = 0;
    for (uint32_t i = 0; i < n_ex; i++) {
        n_exact += (uint32_t)ex[i].exact;
        if (ex[i].T > max_t) max_t = ex[i].T;
        bytes += (size_t)sh.rows * ex[i].T * sh.d * 2;
    }
    printf("  %-9s %u answers in %.1f s, %u exact (%.1f%%), %u failed turns left out; cells %.0f MB\n",
           "answered", n_ex, (cli_now_ms() - t0) / 1e3, n_exact, n_ex ? 100.0 * n_exact / n_ex : 0.0, failed,
           (double)bytes / 1e6);
    if (n_ex < 2 || n_exact == 0 || n_exact == n_ex) {
        fprintf(stderr, "needle: %s: %s, so there is nothing to tell apart\n", o.data,
                n_ex < 2 ? "fewer than two answers" : n_exact ? "every answer was exact" : "no answer was exact");
        goto done;
    }

    /* 3. the split and the training */
    if (!(order = malloc(n_ex * sizeof *order))) {
        cli_lib_error("calibrate", NEEDLE_ERR_OUT_OF_MEMORY);
        goto done;
    }
    uint64_t rng = o.seed;
    for (uint32_t i = 0; i < n_ex; i++) order[i] = i;
    for (uint32_t i = n_ex - 1; i > 0; i--) {
        const uint32_t j = (uint32_t)(splitmix(&rng) % (i + 1));
        const uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    uint32_t n_val = (uint32_t)(o.val_split * n_ex + 0.5);
    if (n_val >= n_ex) n_val = n_ex - 1;
    const uint32_t n_train = n_ex - n_val, *val = order + n_train;
    const uint32_t batch = (uint32_t)(o.batch < (long)n_train ? o.batch : (long)n_train);
    const uint32_t steps_per_epoch = (n_train + batch - 1) / batch;
    const uint32_t total = (uint32_t)o.epochs * steps_per_epoch < 2 ? 2 : (uint32_t)o.epochs * steps_per_epoch;
    uint64_t numel[CONF_HEAD_TENSORS];
    const size_t n_theta = conf_head_layout(&sh, numel);
    const train_adamw_config cfg = train_adamw_finetune(o.lr, total);
    if ((st = train_optim_init(&opt, &cfg, CONF_HEAD_TENSORS, conf_head_names, numel))) {
        cli_lib_error("calibrate", st);
        goto done;
    }
    have_optim = 1;
    if (!(grad = malloc(n_theta * sizeof *grad)) || (st = conf_head_scratch_init(&scratch, &sh, max_t))) {
        cli_lib_error("calibrate", NEEDLE_ERR_OUT_OF_MEMORY);
        goto done;
    }
    float *params[CONF_HEAD_TENSORS];
    const float *grads[CONF_HEAD_TENSORS];
    for (int i = 0, off = 0; i < CONF_HEAD_TENSORS; off += (int)numel[i], i++) {
        params[i] = theta + off;
        grads[i] = grad + off;
    }
    head_score vs = score_head(&sh, theta, ex, val, n_val, &scratch, BY_HEAD);
    printf("  %-9s %u train / %u held out; %u steps (batch %u, lr %g)", "train", n_train, n_val, total, batch,
           o.lr);
    if (n_val) printf("; held-out loss %.4f before", vs.loss);
    printf("\n");
    uint32_t step = 0;
    for (long e = 0; e < o.epochs; e++) {
        /* a fresh order of the training part every epoch */
        for (uint32_t i = n_train - 1; i > 0; i--) {
            const uint32_t j = (uint32_t)(splitmix(&rng) % (i + 1));
            const uint32_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        double loss = 0;
        for (uint32_t b0 = 0; b0 < n_train; b0 += batch) {
            const uint32_t nb = n_train - b0 < batch ? n_train - b0 : batch;
            memset(grad, 0, n_theta * sizeof *grad);
            for (uint32_t k = 0; k < nb; k++) {
                const cal_example *x = &ex[order[b0 + k]];
                const float y = conf_head_forward(&sh, theta, x->cells, x->T, &scratch);
                double g;
                loss += engine_loss(y, x, &g);
                const float dy = (float)(g / nb);
                conf_head_backward(&sh, theta, x->cells, x->T, dy, &scratch, grad);
            }
            if (step < total && (st = train_optim_step(&opt, params, grads, NULL))) {
                cli_lib_error("calibrate", st);
                goto done;
            }
            step++;
        }
        if (!n_val) {
            printf("  %-9s %ld/%ld  loss %.4f  (nothing held out)\n", "epoch", e + 1, o.epochs, loss / n_train);
            fflush(stdout);
            continue;
        }
        vs = score_head(&sh, theta, ex, val, n_val, &scratch, BY_HEAD);
        char b1[16], b2[16];
        printf("  %-9s %ld/%ld  loss %.4f  held-out loss %.4f  AUC %s  error ratio %s (head alone)\n", "epoch",
               e + 1, o.epochs, loss / n_train, vs.loss, num(vs.cal.auc, b1), num(vs.cal.error_ratio, b2));
        fflush(stdout);
    }

    if (n_val) {
        /* what the head adds to the confidence the engine reported without it */
        static const char *const label[3] = {"the decoding's alone (no head)", "the head alone",
                                             "min(head, decoding): what ships"};
        char b1[16], b2[16];
        printf("  %-9s %u held-out answers: AUC, least confident fifth's error ratio (a perfect ranking: "
               "%s)\n", "compare", n_val, num(vs.cal.best_error_ratio, b1));
        head_score h[3];
        for (int k = 0; k < 3; k++) {
            h[k] = score_head(&sh, theta, ex, val, n_val, &scratch,
                              k == 0 ? BY_DECODING : k == 1 ? BY_HEAD : BY_ENGINE);
            printf("  %-9s %-34s AUC %s  error ratio %s\n", "", label[k], num(h[k].cal.auc, b1),
                   num(h[k].cal.error_ratio, b2));
        }
        if (h[2].cal.auc >= 0 && h[2].cal.auc < h[0].cal.auc)
            printf("  %-9s with the head the confidence ranks these answers worse than without it (AUC): "
                   "build the checkpoint you started from to ship the decoding's alone\n", "note");
    }

    /* 4. the calibrated checkpoint, and what it ships as */
    if (write_checkpoint(&o, &sh, theta, n_train, n_val, (double)n_exact / n_ex, vs)) goto done;
    printf("  %-9s %s  (the confidence head trained; `needle build` keeps it)\n", "wrote", o.out);
    if (!o.build_out) {
        rc = 0;
        goto done;
    }
    free(image);
    image = NULL;
    const build_job out_job = {.ckpt_path = o.out, .generation = 3, .bits = &bits, .tokenizer = tok->data,
                               .tokenizer_size = (size_t)tok->nbytes, .quiet = 1};
    if (build_image(&out_job, &image, &image_size) || cli_write_file_atomically(o.build_out, image, image_size))
        goto done;
    printf("  %-9s %s  %.2f MB  (= needle build %s -w %s)\n", "built", o.build_out, (double)image_size / 1e6,
           o.out, o.weights);
    if (!n_val) {
        rc = 0;
        goto done;
    }
    const size_t hl = strlen(o.build_out) + 16;
    if (!(heldout = malloc(hl))) goto done;
    snprintf(heldout, hl, "%s.heldout.jsonl", o.build_out);
    uint32_t *pick = malloc(n_val * sizeof *pick);
    if (!pick) goto done;
    for (uint32_t v = 0; v < n_val; v++) pick[v] = ex[val[v]].src;
    const uint32_t np = n_val;
    rc = write_lines(heldout, texts, pick, np);
    free(pick);
    if (rc) goto done;
    printf("  %-9s %u held-out examples (%s) through the engine on %s:\n", "score", np, heldout, o.build_out);
    fflush(stdout);
    needle_model_free(m);
    m = NULL;
    char *eval_argv[] = {"needle", "eval", "-w", (char *)o.build_out, heldout, NULL};
    rc = cli_eval.run(&cli_eval, 5, eval_argv);
done:
    needle_model_free(m);
    if (have_optim) train_optim_release(&opt);
    conf_head_scratch_free(&scratch);
    for (uint32_t i = 0; ex && i < n_ex; i++) free(ex[i].cells);
    free(ex);
    eval_dataset_free(&data);
    st_release(&ck);
    if (have_bf) cact_release(&bf);
    free(base);
    free(ck_image);
    free(image);
    free(theta);
    free(grad);
    free(order);
    free(heldout);
    return rc;
}

const cli_command cli_calibrate = {
    "calibrate", "train a Needle 3 checkpoint's confidence head on the engine's answers",
    "usage: needle calibrate CHECKPOINT.safetensors DATA.jsonl -w BASE.cact -o OUT.safetensors [options]\n"
    "\n"
    "Fine-tuning trains the network, never its confidence head, so the official build drops\n"
    "the head of a tuned model and confidence reports None; ours keeps what is left, the\n"
    "decoding's confidence, which ranks answers but is no probability. This command trains\n"
    "the head for the model: the checkpoint is built as `needle build` builds it (with\n"
    "BASE.cact's tokenizer) without its confidence head, every example of DATA.jsonl\n"
    "(needle eval's format; use examples the model was not trained on) runs as one greedy\n"
    "query turn, each answer is scored exact or not and its decoding confidence recorded,\n"
    "and the head learns from the hidden states it pools over the prompt and the answer\n"
    "(the trunk frozen) for what the engine reports, min(head, decoding): the cross-entropy\n"
    "of that minimum against exact, plus a tenth of the head's own (AdamW, warm-up and\n"
    "cosine). On the held-out answers it then compares the decoding alone, the head alone\n"
    "and their minimum (AUC, the least confident fifth's error ratio) and says when the\n"
    "head makes the ranking worse. OUT is the checkpoint with the trained head and\n"
    "`needle_calibrate` in its run metadata; `needle build OUT` keeps the head. The cells of\n"
    "every answer are kept in memory (bfloat16; the size is printed): --limit bounds them.\n"
    "\n"
    "options:\n"
    CLI_WEIGHTS_HELP
    "  -o, --out FILE          the calibrated checkpoint (.safetensors)\n"
    "  --build-out FILE.cact   also build it and score the held-out examples through that file\n"
    "                          (needle eval; they are written to FILE.cact.heldout.jsonl)\n"
    "  --epochs N              passes over the training part (default 20)\n"
    "  --batch-size N          examples per update (default 32)\n"
    "  --lr X                  peak learning rate (default 0.003)\n"
    "  --val-split F           share held out, by a seeded draw (default 0.2)\n"
    "  --limit N               only the first N examples\n"
    "  --seed N                the split's and the order's seed (default 0)\n"
    "  -n, --max-new-tokens N  token budget of a turn (default: the library's)\n"
    "  -t, --threads N         engine threads (default: NEEDLE_THREADS or the cores)\n"
    "  -h, --help              this text\n",
    run_calibrate};
