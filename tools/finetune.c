/* `needle finetune`: the official `needle finetune` of cactus-needle 3.2.8 (LoRA on an
 * official Needle 3 checkpoint) and of 2.0.15 (Needle 2: the base .cact's generation picks
 * the descriptor) in C, over the training loop of src/train/trainer.h, and
 * then what the official does not: the adapter is built into the .cact `needle build`
 * would write (same code path, tools/build.c) and the held-out split is scored through
 * the engine on that file by `needle eval`'s own code, so the number printed is the
 * number the shipped file gets. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "build.h"
#include "cli.h"
#include "compat.h"
#include "train/cact_base.h"
#include "train/cact_base2.h"
#include "train/trainer.h"
#include "util/platform.h"

static volatile sig_atomic_t stop_requested;

static void on_sigint(int sig) {
    (void)sig;
    stop_requested = 1;
}

typedef struct progress_state {
    int tty;
    const char *data_path;
    double tokens, seconds; /* over this run's steps, for tok/s and the ETA */
    uint32_t steps;
    int line_open;
    int data_error;  /* a data line was reported as an error (its message said it all) */
    double start_ms; /* the command's start: the first step line says how long it took */
} progress_state;

static void report(void *user, uint32_t line, int severity, const char *msg) {
    progress_state *p = user;
    const char *kind = severity == FT_ERROR     ? "error"
                       : severity == FT_SKIPPED ? "skipped"
                                                : "warning";
    p->data_error |= severity == FT_ERROR;
    fprintf(stderr, "needle: %s:%u: %s: %s\n", p->data_path, line, kind, msg);
}

static void end_line(progress_state *p) {
    if (p->line_open) {
        printf("\n");
        p->line_open = 0;
    }
}

static void on_event(void *user, const train_event *e) {
    progress_state *p = user;
    switch (e->kind) {
    case TRAIN_EVENT_DATA:
        printf("  %-9s %u examples  seq_len %u  holdout %u\n", "data", e->examples, e->seq_len,
               e->n_val);
        printf("  %-9s %u steps  %u epochs  %u trained tensors\n", "schedule", e->total_steps,
               e->epochs, e->targets);
        break;
    case TRAIN_EVENT_RESUMED:
        printf("  %-9s from step %u/%u\n", "resumed", e->step, e->total_steps);
        break;
    case TRAIN_EVENT_STEP: {
        if (p->steps == 0) {
            end_line(p);
            printf("  %-9s first step done %.1f s after the start (%.1f s of it the step)\n",
                   "time", (cli_now_ms() - p->start_ms) / 1000, e->step_seconds);
        }
        p->tokens += e->tokens;
        p->seconds += e->step_seconds;
        p->steps++;
        const double tps = p->seconds > 0 ? p->tokens / p->seconds : 0;
        const double per_step = p->seconds / p->steps;
        const double eta = per_step * (double)(e->total_steps - e->step);
        const int m = (int)(eta / 60), s = (int)eta % 60;
        if (p->tty) {
            printf("\r  %-9s %u/%u  loss %.4f  %.0f tok/s  ETA %dm%02ds\033[K", "step", e->step,
                   e->total_steps, e->loss, tps, m, s);
            p->line_open = 1;
        } else {
            printf("  %-9s %u/%u  loss %.4f  lr %.3g  %.1f tok/s  %.2f s  ETA %dm%02ds\n", "step",
                   e->step, e->total_steps, e->loss, e->lr, tps, e->step_seconds, m, s);
        }
        break;
    }
    case TRAIN_EVENT_EPOCH:
        end_line(p);
        if (e->val_loss >= 0)
            printf("  %-9s %u/%u  loss %.4f  val %.4f\n", "epoch", e->epoch, e->epochs, e->loss,
                   e->val_loss);
        else printf("  %-9s %u/%u  loss %.4f\n", "epoch", e->epoch, e->epochs, e->loss);
        break;
    case TRAIN_EVENT_CHECKPOINT:
        end_line(p);
        printf("  %-9s step %u  %s\n", "saved", e->step, e->path);
        break;
    default: break;
    }
    fflush(stdout);
}

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* path with its .safetensors suffix replaced by `suffix` */
static char *sibling(const char *path, const char *suffix) {
    const size_t n = strlen(path) - (ends_with(path, ".safetensors") ? strlen(".safetensors") : 0);
    char *s = malloc(n + strlen(suffix) + 1);
    if (s) {
        memcpy(s, path, n);
        strcpy(s + n, suffix);
    }
    return s;
}

/* the held-out lines of the data, verbatim, in the split's order */
static int write_heldout(const char *path, const char *data, size_t len, const uint32_t *lines,
                         uint32_t n) {
    const char **starts = NULL;
    size_t *lens = NULL;
    uint32_t n_lines = 0, cap = 0;
    for (size_t i = 0; i <= len;) {
        size_t j = i;
        while (j < len && data[j] != '\n') j++;
        if (n_lines == cap) {
            cap = cap ? 2 * cap : 256;
            const char **ns = realloc(starts, cap * sizeof *ns);
            if (ns) starts = ns;
            size_t *nl = realloc(lens, cap * sizeof *nl);
            if (nl) lens = nl;
            if (!ns || !nl) {
                free(starts);
                free(lens);
                return cli_lib_error("held-out split", NEEDLE_ERR_OUT_OF_MEMORY);
            }
        }
        starts[n_lines] = data + i;
        lens[n_lines++] = j - i;
        i = j + 1;
    }
    size_t total = 0;
    for (uint32_t k = 0; k < n; k++) total += (lines[k] <= n_lines ? lens[lines[k] - 1] : 0) + 1;
    uint8_t *out = malloc(total ? total : 1);
    size_t at = 0;
    for (uint32_t k = 0; out && k < n; k++) {
        if (lines[k] > n_lines) continue;
        size_t l = lens[lines[k] - 1];
        if (l && starts[lines[k] - 1][l - 1] == '\r') l--;
        memcpy(out + at, starts[lines[k] - 1], l);
        at += l;
        out[at++] = '\n';
    }
    free(starts);
    free(lens);
    if (!out) return cli_lib_error("held-out split", NEEDLE_ERR_OUT_OF_MEMORY);
    const int rc = cli_write_file_atomically(path, out, at);
    free(out);
    return rc;
}

static int make_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return 0;
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    struct stat sb;
    if (stat(dir, &sb) == 0) return 0;
    if (platform_mkdir(dir) && errno != EEXIST) {
        fprintf(stderr, "needle: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    return 0;
}

/* the .cact at `path` as a checkpoint at `out`: Needle 3 an official one
 * (train/cact_base.h), Needle 2 ours with the config in the metadata (train/cact_base2.h) */
static int dequantize_base(const char *path, const char *out) {
    size_t size = 0;
    uint8_t *img = cli_read_file(path, &size);
    if (!img) return 1;
    cact_file f;
    int st = cact_parse(img, size, &f);
    if (st) {
        free(img);
        return cli_lib_error(path, st);
    }
    train_checkpoint ck;
    st = f.generation == 2 ? train_checkpoint_from_cact2(img, size, &ck) : train_checkpoint_from_cact(&f, &ck);
    if (!st) {
        st = train_checkpoint_write(out, &ck);
        train_checkpoint_release(&ck);
    }
    cact_release(&f);
    free(img);
    if (st) {
        fprintf(stderr, "needle: %s: %s\n", path, needle_last_error());
        return 1;
    }
    return 0;
}

static int run_finetune(const cli_command *self, int argc, char **argv) {
    const char *data_path = NULL, *ckpt_path = NULL, *weights = NULL, *out_path = NULL,
               *ckpt_dir = "checkpoints", *config_path = NULL;
    const char *build_out = NULL;
    long epochs = 3, batch = 16, rank = 16, max_len = 1024, layers = 0, threads = 0, max_steps = 0;
    double lr = 1e-4, alpha = 32, val_split = 0.1, every = 10;
    unsigned long long seed = 0;
    int resume = 0, full = 0, quant = 0, no_quant = 0, no_score = 0;
    /* the official flags of its LLM data generator: accepted, and --generate refused */
    long generate = 0, workers = 8;
    const char *llm_model = NULL;
    const cli_option opts[] = {{"--checkpoint", "-c", CLI_TEXT, &ckpt_path, 0, 0, NULL},
                               {"--weights", "-w", CLI_TEXT, &weights, 0, 0, NULL},
                               {"--config", NULL, CLI_TEXT, &config_path, 0, 0, NULL},
                               {"--epochs", NULL, CLI_LONG, &epochs, 1, 1000000, NULL},
                               {"--batch-size", NULL, CLI_LONG, &batch, 1, 1 << 20, NULL},
                               {"--lr", NULL, CLI_REAL, &lr, 0, 0, NULL},
                               {"--lora-rank", NULL, CLI_LONG, &rank, 1, 4096, NULL},
                               {"--lora-alpha", NULL, CLI_REAL, &alpha, 0, 0, NULL},
                               {"--max-len", NULL, CLI_LONG, &max_len, 2, 1 << 20, NULL},
                               {"--val-split", NULL, CLI_REAL, &val_split, 0, 0, NULL},
                               {"--seed", NULL, CLI_U64, &seed, 0, 0, NULL},
                               {"--layers", NULL, CLI_LONG, &layers, 2, 1024, NULL},
                               {"--out", "-o", CLI_TEXT, &out_path, 0, 0, NULL},
                               {"--checkpoint-dir", NULL, CLI_TEXT, &ckpt_dir, 0, 0, NULL},
                               {"--resume", NULL, CLI_FLAG, &resume, 0, 0, NULL},
                               {"--full", NULL, CLI_FLAG, &full, 0, 0, NULL},
                               {"--quant", NULL, CLI_FLAG, &quant, 0, 0, NULL},
                               {"--float", NULL, CLI_FLAG, &no_quant, 0, 0, NULL},
                               {"--threads", "-t", CLI_LONG, &threads, 0, 1024, NULL},
                               {"--save-every", NULL, CLI_REAL, &every, 0, 0, NULL},
                               {"--max-steps", NULL, CLI_LONG, &max_steps, 1, 1L << 31, NULL},
                               {"--build-out", NULL, CLI_TEXT, &build_out, 0, 0, NULL},
                               {"--no-score", NULL, CLI_FLAG, &no_score, 0, 0, NULL},
                               {"--generate", NULL, CLI_LONG, &generate, 0, 1L << 30, NULL},
                               {"--model", NULL, CLI_TEXT, &llm_model, 0, 0, NULL},
                               {"--workers", NULL, CLI_LONG, &workers, 1, 1024, NULL},
                               {0}};
    const double start_ms = cli_now_ms();
    int rc = cli_parse(self, argc, argv, opts, &data_path, 1);
    if (rc != CLI_GO) return rc;
    if (!data_path) return cli_usage_error(self, "needs the training data DATA.jsonl");
    (void)workers;
    (void)llm_model;
    if (generate)
        return cli_usage_error(
            self,
            "--generate asks an LLM service for more examples (the official uses "
            "OpenRouter), which this build does not do: bring the data file (train/compose3.py "
            "composes examples from schema templates without an LLM)");
    if (!(lr > 0)) return cli_usage_error(self, "--lr must be > 0");
    if (!(alpha > 0)) return cli_usage_error(self, "--lora-alpha must be > 0");
    if (!(val_split < 1)) return cli_usage_error(self, "--val-split must be in [0, 1)");
    if (quant && no_quant) return cli_usage_error(self, "give --quant or --float, not both");
    if (ckpt_path && ends_with(ckpt_path, ".cact"))
        return cli_usage_error(
            self, "--checkpoint takes the float checkpoint (.safetensors); the .cact goes "
                  "to --weights (its tokenizer encodes the data, and the built file carries it)");
    if (config_path && !ckpt_path)
        return cli_usage_error(self, "--config goes with --checkpoint (a Needle 2 checkpoint; a .cact "
                                     "carries its config)");
    /* the official default base, finetune.DEFAULT_BASE, unless a .cact was named */
    if (!ckpt_path && !weights && access("checkpoints/needle3.safetensors", R_OK) == 0)
        ckpt_path = "checkpoints/needle3.safetensors";
    if (!weights && !cli_default_weights(&weights) && !weights) return cli_no_weights();

    char default_out[4096];
    if (!out_path) {
        snprintf(default_out, sizeof default_out, "%s/%s", ckpt_dir,
                 full ? "needle_full.safetensors" : "needle_lora.safetensors");
        out_path = default_out;
    }
    if (!ends_with(out_path, ".safetensors"))
        return cli_usage_error(self, "--out must be a .safetensors file (got %s)", out_path);
    if (make_parent_dir(out_path)) return 1;
    /* without a checkpoint the .cact is the base: dequantized to an official checkpoint
     * beside the output (the adapter's `base`, what `needle build` merges into) */
    char *dequantized = NULL;
    if (!ckpt_path) {
        if (!(dequantized = sibling(out_path, ".base.safetensors")) ||
            dequantize_base(weights, dequantized)) {
            free(dequantized);
            return 1;
        }
        printf("  %-9s %s dequantized to %s\n", "base", weights, dequantized);
        ckpt_path = dequantized;
    }
    char *state_path = full ? NULL : sibling(out_path, ".state.safetensors");
    char *cact_path = build_out ? strdup(build_out) : sibling(out_path, ".cact");
    char *heldout_path = sibling(out_path, ".heldout.jsonl");
    size_t data_len = 0, base_size = 0, arch_size = 0;
    char *data = (char *)cli_read_file(data_path, &data_len);
    uint8_t *base = data ? cli_read_file(ckpt_path, &base_size) : NULL;
    uint8_t *arch = base ? cli_read_file(weights, &arch_size) : NULL;
    needle_model *tok_model = NULL;
    train_result res;
    memset(&res, 0, sizeof res);
    uint8_t *image = NULL;
    char *config_json = NULL;
    cact_file bf;
    int have_bf = 0;
    rc = 1;
    if (!data || !base || !arch || (!full && !state_path) || !cact_path || !heldout_path) goto done;
    size_t config_size = 0;
    if (config_path && !(config_json = (char *)cli_read_file(config_path, &config_size))) goto done;
    int st = cact_parse(arch, arch_size, &bf);
    if (st) {
        rc = cli_lib_error(weights, st);
        goto done;
    }
    have_bf = 1;
    if ((bf.generation != 3 && bf.generation != 2) || bf.tokenizer_index < 0) {
        fprintf(stderr,
                "needle: %s is not a Needle 2 or 3 .cact with a tokenizer (the base archive of "
                "the checkpoint)\n",
                weights);
        goto done;
    }
    if (config_path && bf.generation != 2) {
        fprintf(stderr,
                "needle: --config is for a Needle 2 checkpoint; %s is Needle 3 (a 3.x checkpoint "
                "has its config in its metadata)\n",
                weights);
        goto done;
    }
    if ((st = needle_model_open(weights, NULL, &tok_model))) {
        rc = cli_lib_error(weights, st);
        goto done;
    }
    printf("  %-9s %s\n  %-9s %s\n", "base", ckpt_path, "tokenizer", weights);
    const int q = no_quant ? 0 : quant ? 1 : -1;
    printf("  %-9s %s\n", "numerics",
           (q < 0 ? !full : q) ? "CQ W4 STE + A8 (matches export)"
                               : "float32 weights and activations");
    if (!full) printf("  %-9s rank %ld  alpha %g\n", "lora", rank, alpha);
    progress_state ps = {
        .tty = isatty(STDOUT_FILENO), .data_path = data_path, .start_ms = start_ms};
    const train_options o = {.gen = train_generation_for(bf.generation),
                             .base_path = ckpt_path,
                             .base_image = base,
                             .base_size = base_size,
                             .config_json = config_json,
                             .tokenizer = tok_model,
                             .data = data,
                             .data_len = data_len,
                             .report = report,
                             .report_user = &ps,
                             .epochs = (uint32_t)epochs,
                             .batch_size = (uint32_t)batch,
                             .lora_rank = (uint32_t)rank,
                             .max_len = (uint32_t)max_len,
                             .lr = lr,
                             .lora_alpha = alpha,
                             .val_split = val_split,
                             .seed = seed,
                             .full = full,
                             .quant = q,
                             .threads = (int)threads,
                             .out_path = out_path,
                             .state_path = state_path,
                             .resume = resume,
                             .checkpoint_minutes = every,
                             .max_steps = (uint32_t)max_steps,
                             .stop = &stop_requested,
                             .progress = on_event,
                             .progress_user = &ps};
    void (*old_handler)(int) = signal(SIGINT, on_sigint);
    st = train_run(&o, &res);
    signal(SIGINT, old_handler == SIG_ERR ? SIG_DFL : old_handler);
    end_line(&ps);
    if (st) {
        if (!ps.data_error) fprintf(stderr, "needle: finetune: %s\n", needle_last_error());
        goto done;
    }
    if (!res.finished) {
        printf("  %-9s at step %u/%u; `needle finetune ... --resume` continues\n", "stopped",
               res.steps, res.total_steps);
        rc = stop_requested ? 130 : 0;
        goto done;
    }
    printf("  %-9s %s\n", full ? "checkpoint" : "adapter", out_path);
    /* what ships: the official build of base + adapter (or the trained checkpoint) */
    bits_map bits;
    if ((st = bits_map_parse("4", &bits))) {
        rc = cli_lib_error("bits", st);
        goto done;
    }
    const cact_tensor *tok = &bf.tensors[bf.tokenizer_index];
    const build_job job = {.ckpt_path = full ? out_path : ckpt_path,
                           .out_path = cact_path,
                           .generation = bf.generation,
                           /* a full run's checkpoint carries the config in its metadata */
                           .config_json = full ? NULL : config_json,
                           .adapter = full ? NULL : &res.adapter,
                           .layers = layers,
                           .bits = &bits,
                           .tokenizer = tok->data,
                           .tokenizer_size = (size_t)tok->nbytes,
                           .quiet = 1};
    size_t image_size = 0;
    if (build_image(&job, &image, &image_size)) goto done;
    if (cli_write_file_atomically(cact_path, image, image_size)) goto done;
    printf("  %-9s %s  %.2f MB  (= needle build %s%s%s -w %s%s%s)\n", "built", cact_path,
           (double)image_size / 1e6, full ? out_path : ckpt_path, full ? "" : " --lora ",
           full ? "" : out_path, weights, config_path && !full ? " --config " : "",
           config_path && !full ? config_path : "");
    if (no_score || !res.n_val) {
        rc = 0;
        goto done;
    }
    if (write_heldout(heldout_path, data, data_len, res.val_lines, res.n_val)) goto done;
    printf("  %-9s %u held-out examples (%s) through the engine on %s:\n", "score", res.n_val,
           heldout_path, cact_path);
    fflush(stdout);
    char *eval_argv[] = {"needle", "eval", "-w", cact_path, heldout_path, NULL};
    rc = cli_eval.run(&cli_eval, 5, eval_argv);
done:
    if (!data) fprintf(stderr, "needle: cannot read %s\n", data_path);
    else if (!base) fprintf(stderr, "needle: cannot read %s\n", ckpt_path);
    else if (!arch) fprintf(stderr, "needle: cannot read %s\n", weights);
    free(image);
    free(config_json);
    train_result_release(&res);
    needle_model_free(tok_model);
    if (have_bf) cact_release(&bf);
    free(arch);
    free(base);
    free(data);
    free(state_path);
    free(cact_path);
    free(heldout_path);
    free(dequantized);
    return rc;
}

const cli_command cli_finetune = {
    "finetune", "fine-tune Needle 2 or 3 on your tools (LoRA or full), build the .cact and score it",
    "usage: needle finetune DATA.jsonl [--checkpoint C.safetensors [--config CONFIG.json]]\n"
    "                       [-w BASE.cact] [--epochs 3]\n"
    "                       [--batch-size 16] [--lr 1e-4] [--lora-rank 16] [--lora-alpha 32]\n"
    "                       [--max-len 1024] [--val-split 0.1] [--seed 0] [--layers N]\n"
    "                       [--out checkpoints/needle_lora.safetensors] [--resume] [--full]\n"
    "\n"
    "The official `needle finetune` (cactus-needle 3.2.8 for a Needle 3 base, 2.0.15 for a\n"
    "Needle 2 one such as the demo model) without Python or JAX: DATA lines\n"
    "{query, tools, answers | function_calls, reasoning?, system?} or single-turn chat format\n"
    "(messages + OpenAI-form tools), rendered and encoded as the official (loss on the\n"
    "target and EOS; one length, the power of two from 128 that holds the longest, capped\n"
    "at --max-len, though each row runs only through its last target: the same loss and\n"
    "gradients without the padding's work); a held-out split (--val-split, drawn as the official draws it from\n"
    "--seed); AdamW with 5% warm-up and cosine decay, clip 1.0; LoRA on the q/k/v/gate/out\n"
    "projections under the official numerics (CQ W4 straight-through + A8) by default.\n"
    "Bad lines are reported as FILE:LINE (malformed: refused; unknown tools, calls their\n"
    "schema refuses, examples cut at --max-len: warned and kept, as the official trains on\n"
    "them).\n"
    "\n"
    "Then, unlike the official: the adapter is built into the .cact `needle build` writes\n"
    "(the same code) and the held-out split is scored through the engine on that file by\n"
    "`needle eval` (exact-call match, grammar, envelope): the number the shipped file gets.\n"
    "\n"
    "  -c, --checkpoint FILE   the official Needle 3 checkpoint to train from (default\n"
    "                          checkpoints/needle3.safetensors when -w is not given, the\n"
    "                          official default)\n"
    "  --config FILE           the Needle 2 TransformerConfig (JSON) of a --checkpoint that\n"
    "                          has no `config` metadata (as `needle export` takes it)\n"
    "  -w, --weights FILE      the base .cact (Needle 2 or 3; its generation picks the\n"
    "                          network): its tokenizer encodes the data and the built\n"
    "                          file carries it (default: $NEEDLE_MODEL, else the cached\n"
    "                          needle3). Without --checkpoint it is also the training base:\n"
    "                          dequantized (every record read as the engine reads it) to OUT's\n"
    "                          .base.safetensors sibling, an official checkpoint\n"
    "  --epochs N              3        --batch-size N   16 (the last batch is the rest)\n"
    "  --lr X                  1e-4     --lora-rank N    16     --lora-alpha X   32\n"
    "  --max-len N             1024     --val-split X    0.1    --seed N         0\n"
    "  --layers N              the built file is the depth-N ladder rung (as needle build)\n"
    "  -o, --out FILE          the adapter (official write_adapter format; default\n"
    "                          checkpoints/needle_lora.safetensors), or with --full the\n"
    "                          checkpoint (checkpoints/needle_full.safetensors)\n"
    "  --checkpoint-dir DIR    where the default --out goes (checkpoints)\n"
    "  --full                  train every parameter (float unless --quant); --out is an\n"
    "                          official 3.x checkpoint with the optimizer state\n"
    "  --quant | --float       force CQ W4 STE + A8, or float32 training\n"
    "  --resume                continue from the saved state, bit for bit (same data and\n"
    "                          settings); LoRA keeps it in OUT's .state.safetensors sibling\n"
    "  --save-every MIN        save the state every MIN minutes (10; 0: only at the end);\n"
    "                          Ctrl-C saves and stops (exit 130)\n"
    "  --max-steps N           stop after N updates in this run (state saved; --resume)\n"
    "  -t, --threads N         threads (default: NEEDLE_THREADS, else the online cores)\n"
    "  --build-out FILE        the built .cact (default: OUT with .cact)\n"
    "  --no-score              build, but do not score the held-out split\n"
    "  --generate N            refused: the official asks an LLM service for N more examples\n"
    "                          (--model, --workers: accepted, used only by --generate)\n"
    "\n"
    "Files: OUT, OUT's .state.safetensors (LoRA), .cact (built) and .heldout.jsonl (the\n"
    "held-out lines, what was scored: `needle eval -w OUT.cact OUT.heldout.jsonl` prints\n"
    "the same numbers). The initial adapter is drawn from --seed by our own generator, not\n"
    "jax.random: the same seed gives another start than the official. Needle 2: the 2.0.15\n"
    "numerics (CQ W4 STE + A8, no int8 K/V); the adapter is this safetensors format (2.0.15\n"
    "writes a pickle, which this build neither writes nor reads); no --layers.\n",
    run_finetune};
