/* `needle finetune` end to end on a tiny Needle 3 model (issue 33): the build fixture's
 * random checkpoint (tests/fixtures/build/ckpt.safetensors, made by the official code)
 * with its ladder split turned off (the training core has no ladder), the v3c archive's
 * tokenizer, and a small repeated dataset written here.
 *
 *   - numpy's default_rng permutations (the official split and batch order), against
 *     values numpy 2.x printed;
 *   - a LoRA run: the validation loss falls, the .cact it builds is the bytes `needle
 *     build` writes from the adapter, and its held-out score is `needle eval`'s on that
 *     file;
 *   - --max-steps k, then --resume: the adapter and state are the bytes of the straight
 *     run (LoRA and --full), and Ctrl-C saves a state that --resume continues;
 *   - a .cact alone as the base (dequantized), built again by `needle build` to the same bytes;
 *   - bad input: a clear message and a non-zero status.
 * About 30 s on 2 cores (Release). */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifndef _WIN32
#include <sys/wait.h>
#endif

#include "harness.h"
#include "train/checkpoint.h"
#include "train/np_pcg64.h"

static char tmpdir[64];
static char base_path[256], data_path[256];

static const char *tmp(const char *name) {
    static char slots[8][512];
    static int at;
    char *s = slots[at++ % 8];
    snprintf(s, 512, "%s/%s", tmpdir, name);
    return s;
}

/* np.random.default_rng(seed): permutation(37), permutation(5), random_raw() (numpy 2.x) */
static void test_numpy_permutation(void) {
    static const struct {
        uint64_t seed;
        uint32_t p37[37], p5[5];
        uint64_t raw;
    } want[] = {
        {0,
         {4,  34, 20, 18, 2,  3,  35, 24, 11, 36, 1, 0,  22, 30, 21, 10, 32, 9, 6,
          26, 19, 23, 8,  16, 27, 12, 28, 13, 7,  5, 17, 25, 14, 29, 33, 15, 31},
         {0, 4, 1, 2, 3},
         12646017539498340653ull},
        {1,
         {6,  7,  24, 9,  0,  30, 15, 3, 25, 16, 36, 17, 1, 11, 28, 22, 23, 34, 20,
          27, 33, 31, 14, 21, 35, 26, 2, 29, 12, 10, 19, 4, 5,  8,  32, 18, 13},
         {3, 4, 1, 0, 2},
         2963506490802106905ull},
        {42,
         {27, 18, 26, 5, 4, 23, 36, 7,  25, 32, 10, 22, 20, 34, 16, 6, 24, 29, 28,
          9,  30, 19, 3, 0, 15, 17, 31, 12, 21, 11, 14, 35, 2,  33, 1, 13, 8},
         {2, 3, 0, 4, 1},
         14358641161718733232ull},
        {123456789012ull,
         {24, 0,  8,  11, 15, 31, 13, 3, 19, 32, 27, 16, 5,  9,  34, 22, 23, 12, 17,
          4,  14, 28, 10, 2,  1,  29, 6, 7,  33, 20, 35, 26, 36, 21, 30, 18, 25},
         {4, 2, 1, 0, 3},
         1694239333633985625ull},
    };
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        np_pcg64 g;
        np_pcg64_seed(&g, want[k].seed);
        uint32_t p[37];
        np_pcg64_permutation(&g, 37, p);
        CHECK_MSG(!memcmp(p, want[k].p37, sizeof want[k].p37), "seed %llu: permutation(37)",
                  (unsigned long long)want[k].seed);
        np_pcg64_permutation(&g, 5, p);
        CHECK_MSG(!memcmp(p, want[k].p5, sizeof want[k].p5), "seed %llu: permutation(5)",
                  (unsigned long long)want[k].seed);
        CHECK(np_pcg64_next64(&g) == want[k].raw);
    }
}

/* the build fixture's checkpoint without its ladder split, and the data */
static int setup(void) {
    train_checkpoint ck;
    if (train_checkpoint_read(fixture_path("build/ckpt.safetensors"), NULL, 3, &ck)) return -1;
    cJSON *c = cJSON_Parse(ck.config);
    cJSON_ReplaceItemInObjectCaseSensitive(c, "ladder_widths", cJSON_CreateArray());
    free(ck.config);
    ck.config = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    snprintf(base_path, sizeof base_path, "%s/base.safetensors", tmpdir);
    const int st = train_checkpoint_write(base_path, &ck);
    train_checkpoint_release(&ck);
    if (st) return -1;
    static const char *const lines[] = {
        "{\"query\": \"timer 5\", \"tools\": [{\"name\": \"timer\", \"parameters\": {\"type\": "
        "\"object\", "
        "\"properties\": {\"m\": {\"type\": \"integer\"}}}}], \"answers\": [{\"name\": \"timer\", "
        "\"arguments\": "
        "{\"m\": 5}}]}",
        "{\"query\": \"call mom\", \"tools\": [{\"name\": \"call\", \"parameters\": {\"type\": "
        "\"object\", "
        "\"properties\": {\"who\": {\"type\": \"string\"}}}}], \"answers\": [{\"name\": \"call\", "
        "\"arguments\": "
        "{\"who\": \"mom\"}}]}",
        /* chat format */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"timer 9\"}, {\"role\": \"assistant\", "
        "\"tool_calls\": "
        "[{\"type\": \"function\", \"function\": {\"name\": \"timer\", \"arguments\": "
        "\"{\\\"m\\\": 9}\"}}]}], "
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"timer\", \"parameters\": "
        "{\"type\": "
        "\"object\", \"properties\": {\"m\": {\"type\": \"integer\"}}}}}]}",
        "{\"query\": \"hi\", \"tools\": [{\"name\": \"call\", \"parameters\": {\"type\": "
        "\"object\", "
        "\"properties\": {\"who\": {\"type\": \"string\"}}}}], \"answers\": []}",
    };
    snprintf(data_path, sizeof data_path, "%s/data.jsonl", tmpdir);
    FILE *f = fopen(data_path, "w");
    if (!f) return -1;
    for (int r = 0; r < 4; r++)
        for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) fprintf(f, "%s\n", lines[i]);
    fclose(f);
    return 0;
}

/* `needle finetune` on the tiny base with `args`; 2>&1 */
static int finetune(const char *args, char *out, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' finetune -c '%s' -w '%s' --max-len 128 -t 2 %s 2>&1",
             cli_path(), base_path, fixture_path("v3/v3c.cact"), args);
    return run_command(cmd, out, cap);
}

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    uint8_t *x = read_file(a, &na), *y = read_file(b, &nb);
    const int same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

/* the value after `label` on its line of `text`, or NULL */
static const char *after(const char *text, const char *label) {
    const char *p = strstr(text, label);
    return p ? p + strlen(label) : NULL;
}

static char run_a[1 << 16];

/* 16 lines, batch 4, 3 epochs: 4 held out, 12 trained, 3 steps an epoch, 9 steps */
#define RUN_ARGS "--batch-size 4 --epochs 3 --lr 1e-2 --lora-rank 4 --val-split 0.25 --seed 0"

static void test_lora_run(void) {
    char args[1024];
    snprintf(args, sizeof args, "%s '%s' -o '%s'", RUN_ARGS, data_path, tmp("a.safetensors"));
    const int rc = finetune(args, run_a, sizeof run_a);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, run_a);
    CHECK_MSG(strstr(run_a, "16 examples  seq_len 128  holdout 4"), "%s", run_a);
    CHECK_MSG(strstr(run_a, "9 steps"), "%s", run_a);
    /* the official split: default_rng(0).permutation(16)[:4] = [2, 11, 3, 10], data lines 3,
     * 12, 4, 11: chat, "hi", "hi", chat (so `needle eval` reads the chat format too) */
    size_t n;
    char *held = (char *)read_file(tmp("a.heldout.jsonl"), &n);
    CHECK(held != NULL);
    if (held) {
        const char *want[4] = {"\"messages\"", "\"query\": \"hi\"", "\"query\": \"hi\"",
                               "\"messages\""};
        char *save = NULL, *line = strtok_r(held, "\n", &save);
        for (int i = 0; i < 4; i++, line = strtok_r(NULL, "\n", &save))
            CHECK_MSG(line && strstr(line, want[i]), "held-out line %d: %s", i + 1,
                      line ? line : "(none)");
        CHECK(line == NULL);
        free(held);
    }
    /* the validation loss falls over the epochs */
    const char *e1 = after(run_a, "epoch     1/3"), *e3 = after(run_a, "epoch     3/3");
    const char *v1 = e1 ? strstr(e1, "val ") : NULL, *v3 = e3 ? strstr(e3, "val ") : NULL;
    CHECK_MSG(v1 && v3, "%s", run_a);
    if (v1 && v3)
        CHECK_MSG(atof(v3 + 4) < atof(v1 + 4) - 0.1, "val %g -> %g", atof(v1 + 4), atof(v3 + 4));
    /* what was built is what `needle build` makes of the adapter */
    char cmd[4096], out[1 << 14];
    snprintf(cmd, sizeof cmd, "'%s' build '%s' --lora '%s' -w '%s' -o '%s' -q 2>&1", cli_path(),
             base_path, tmp("a.safetensors"), fixture_path("v3/v3c.cact"), tmp("rebuilt.cact"));
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "%s", out);
    CHECK_MSG(same_file(tmp("a.cact"), tmp("rebuilt.cact")),
              "the built file differs from needle build's");
    /* the printed score is `needle eval`'s on the written file */
    snprintf(cmd, sizeof cmd, "'%s' eval -w '%s' '%s' 2>&1", cli_path(), tmp("a.cact"),
             tmp("a.heldout.jsonl"));
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "%s", out);
    const char *mine = after(run_a, "exact match"), *theirs = after(out, "exact match");
    CHECK_MSG(mine && theirs, "finetune:\n%s\neval:\n%s", run_a, out);
    if (mine && theirs) {
        const size_t len = strcspn(mine, "\n");
        CHECK_MSG(len == strcspn(theirs, "\n") && !strncmp(mine, theirs, len),
                  "finetune %.*s, eval %.*s", (int)len, mine, (int)strcspn(theirs, "\n"), theirs);
    }
    /* the adapter is an official one: every target, rank 4, scale alpha / rank */
    train_adapter ad;
    CHECK(train_adapter_read(tmp("a.safetensors"), &ad) == 0);
    CHECK_EQ_INT(ad.rank, 4);
    CHECK(ad.scale == 8.0);
    CHECK_EQ_INT(ad.n, 5);
    train_adapter_release(&ad);
}

static void test_lora_resume(void) {
    char args[1024], out[1 << 16];
    snprintf(args, sizeof args, "%s '%s' -o '%s' --max-steps 5 --no-score", RUN_ARGS, data_path,
             tmp("b.safetensors"));
    int rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "stopped   at step 5/9"), "exit %d: %s", rc, out);
    snprintf(args, sizeof args, "%s '%s' -o '%s' --resume --no-score", RUN_ARGS, data_path,
             tmp("b.safetensors"));
    rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "resumed   from step 5/9"), "exit %d: %s", rc, out);
    CHECK_MSG(same_file(tmp("a.safetensors"), tmp("b.safetensors")),
              "adapter after 5 + resume 4 != 9 straight");
    CHECK_MSG(same_file(tmp("a.state.safetensors"), tmp("b.state.safetensors")), "state differs");
    /* the epoch lines after the resume are the straight run's */
    const char *mine = after(out, "epoch     3/3"), *straight = after(run_a, "epoch     3/3");
    CHECK(mine && straight && !strncmp(mine, straight, strcspn(straight, "\n")));
    /* another setting refuses to resume */
    snprintf(args, sizeof args, "%s '%s' -o '%s' --resume --no-score --lr 2e-2", RUN_ARGS,
             data_path, tmp("b.safetensors"));
    rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "lr"), "exit %d: %s", rc, out);
}

/* the first `lines` lines of the data into `name` (+ `extra` as the last line) */
static const char *data_head(const char *name, int lines, const char *extra) {
    const char *path = tmp(name);
    size_t n;
    char *text = (char *)read_file(data_path, &n);
    FILE *f = fopen(path, "w");
    CHECK(text && f);
    int at = 0;
    for (size_t i = 0; text && f && i < n && at < lines; i++) {
        fputc(text[i], f);
        at += text[i] == '\n';
    }
    if (f && extra) fprintf(f, "%s\n", extra);
    if (f) fclose(f);
    free(text);
    return path;
}

/* --full (float, or CQ STE + A8 on a float master with --quant): 2 + resume 2 = 4 straight */
static void full_resume(const char *quant, const char *tag) {
    char args[1024], out[1 << 16], a[64], b[64];
    /* 4 lines, no hold-out, batch 2: 2 steps an epoch, 4 steps */
    char common[256];
    snprintf(common, sizeof common,
             "--full %s --batch-size 2 --epochs 2 --lr 1e-3 --val-split 0 --no-score", quant);
    char small[512];
    snprintf(small, sizeof small, "%s", data_head("small.jsonl", 4, NULL));
    snprintf(a, sizeof a, "%s1.safetensors", tag);
    snprintf(b, sizeof b, "%s2.safetensors", tag);
    snprintf(args, sizeof args, "%s '%s' -o '%s'", common, small, tmp(a));
    int rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "4 steps"), "exit %d: %s", rc, out);
    snprintf(args, sizeof args, "%s '%s' -o '%s' --max-steps 2", common, small, tmp(b));
    rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    snprintf(args, sizeof args, "%s '%s' -o '%s' --resume", common, small, tmp(b));
    rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "resumed   from step 2/4"), "exit %d: %s", rc, out);
    CHECK_MSG(same_file(tmp(a), tmp(b)), "full %s: 2 + resume 2 != 4 straight", quant);
    /* an official checkpoint with the optimizer state and the step */
    train_checkpoint ck;
    CHECK(train_checkpoint_read(tmp(a), NULL, 3, &ck) == 0);
    CHECK_EQ_INT(ck.step, 4);
    CHECK(ck.optim && ck.n_optim > 0);
    CHECK(train_checkpoint_find(&ck, "confidence_head/gain") != NULL);
    train_checkpoint_release(&ck);
    snprintf(a, sizeof a, "%s1.cact", tag);
    CHECK(access(tmp(a), R_OK) == 0);
    /* the command finetune names builds the same file: the trained weights, not a copy of
     * the base archive, and no confidence head (trained trunk, untrained head) */
    char cmd[4096], ckpt[64];
    snprintf(ckpt, sizeof ckpt, "%s1.safetensors", tag);
    snprintf(b, sizeof b, "%s1b.cact", tag);
    snprintf(cmd, sizeof cmd, "'%s' build '%s' -w '%s' -o '%s' 2>&1", cli_path(), tmp(ckpt),
             fixture_path("v3/v3c.cact"), tmp(b));
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "dropped   the confidence head"), "exit %d: %s", rc, out);
    CHECK_MSG(same_file(tmp(a), tmp(b)), "full %s: needle build gave another file than finetune", quant);
    CHECK(!same_file(tmp(a), fixture_path("v3/v3c.cact")));
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' 2>&1", cli_path(), tmp(a));
    CHECK(run_command(cmd, out, sizeof out) == 0 && !strstr(out, "confidence_head"));
}

static void test_full_resume(void) {
    full_resume("", "f");
    full_resume("--quant", "q");
    /* the straight-through run trained other weights than the float one */
    CHECK(!same_file(tmp("f1.safetensors"), tmp("q1.safetensors")));
}

/* needle calibrate on the --full run's checkpoint (test_full_resume's f1): twelve queries
 * whose expected answers are the model's own (six) or not (six), so the labels are known;
 * the head's training loss falls, the checkpoint changes only in the head and says it was
 * calibrated, `needle build` keeps the head (a --full checkpoint's head is otherwise
 * dropped) and writes the --build-out bytes, and the held-out part is scored through it. */
static void test_calibrate(void) {
    char ckpt[512], model[512], data[512]; /* tmp()'s slots are reused */
    snprintf(ckpt, sizeof ckpt, "%s", tmp("f1.safetensors"));
    snprintf(model, sizeof model, "%s", tmp("f1.cact"));
    snprintf(data, sizeof data, "%s", tmp("cal.jsonl"));
    CHECK_MSG(access(ckpt, R_OK) == 0 && access(model, R_OK) == 0, "test_full_resume's files are missing");
    static const char *const tools[2] = {
        "[{\"name\": \"timer\", \"parameters\": {\"type\": \"object\", \"properties\": {\"m\": {\"type\": "
        "\"integer\"}}}}]",
        "[{\"name\": \"call\", \"parameters\": {\"type\": \"object\", \"properties\": {\"who\": {\"type\": "
        "\"string\"}}}}, {\"name\": \"timer\", \"parameters\": {\"type\": \"object\", \"properties\": {\"m\": "
        "{\"type\": \"integer\"}}}}]"};
    static const char *const queries[12] = {"timer 5",      "call mom",   "timer nine", "call bob now",
                                            "hi",           "set 3",      "ring dad",   "wake me at 7",
                                            "call 5 times", "nothing",    "timer",      "phone anna"};
    FILE *f = fopen(data, "w");
    CHECK(f != NULL);
    if (!f) return;
    char cmd[4096], out[1 << 16];
    for (int i = 0; i < 12; i++) {
        snprintf(cmd, sizeof cmd, "'%s' run -w '%s' --tools '%s' '%s' 2>/dev/null", cli_path(), model,
                 tools[i % 2], queries[i]);
        const int rc = run_command(cmd, out, sizeof out);
        cJSON *env = cJSON_Parse(out);
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(env, "function_calls");
        CHECK_MSG(rc == 0 && cJSON_IsArray(calls), "needle run: exit %d: %s", rc, out);
        char *answer = calls ? cJSON_PrintUnformatted(calls) : NULL;
        /* even lines expect what the model answers, odd lines something else */
        const char *wrong = cJSON_GetArraySize(calls) ? "[]" : "[{\"name\": \"timer\", \"arguments\": {\"m\": 99}}]";
        fprintf(f, "{\"query\": \"%s\", \"tools\": %s, \"answers\": %s}\n", queries[i], tools[i % 2],
                i % 2 == 0 && answer ? answer : wrong);
        free(answer);
        cJSON_Delete(env);
    }
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "'%s' calibrate '%s' '%s' -w '%s' -o '%s' --build-out '%s' --epochs 30 --lr 0.02 --batch-size 4 "
             "--val-split 0.25 -t 2 2>&1",
             cli_path(), ckpt, data, fixture_path("v3/v3c.cact"), tmp("cal.safetensors"), tmp("cal.cact"));
    int rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "12 answers") && strstr(out, "6 exact (50.0%)") &&
                  strstr(out, "9 train / 3 held out") && strstr(out, "held-out examples") &&
                  strstr(out, "confidence "),
              "exit %d: %s", rc, out);
    const char *first = after(out, "epoch     1/30  loss "), *last = after(out, "epoch     30/30  loss ");
    CHECK_MSG(first && last && atof(last) < 0.5 * atof(first), "the head's loss did not fall: %s", out);
    train_checkpoint in, cal;
    CHECK(train_checkpoint_read(ckpt, NULL, 3, &in) == 0);
    CHECK(train_checkpoint_read(tmp("cal.safetensors"), NULL, 3, &cal) == 0);
    CHECK_EQ_INT(in.n, cal.n);
    int head_changed = 0, trunk_changed = 0;
    for (uint32_t i = 0; i < in.n && in.n == cal.n; i++) {
        const int differs = in.tensors[i].numel != cal.tensors[i].numel ||
                            memcmp(in.tensors[i].data, cal.tensors[i].data, in.tensors[i].numel * sizeof(float));
        if (!strncmp(in.tensors[i].name, "confidence_head/", 16)) head_changed |= differs;
        else trunk_changed |= differs;
    }
    CHECK(head_changed && !trunk_changed);
    CHECK(cal.run && strstr(cal.run, "\"needle_calibrate\"") && strstr(cal.run, "\"needle_finetune\""));
    train_checkpoint_release(&in);
    train_checkpoint_release(&cal);
    snprintf(cmd, sizeof cmd, "'%s' build '%s' -w '%s' -o '%s' 2>&1", cli_path(), tmp("cal.safetensors"),
             fixture_path("v3/v3c.cact"), tmp("cal2.cact"));
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && !strstr(out, "dropped"), "exit %d: %s", rc, out);
    CHECK_MSG(same_file(tmp("cal.cact"), tmp("cal2.cact")), "needle build gave another file than --build-out");
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' 2>&1", cli_path(), tmp("cal.cact"));
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0 && strstr(out, "confidence_head.probes"), "%s", out);
    /* refused: an output folder that does not exist (before any answer is computed); the
     * output over the input; a Needle 2 base */
    snprintf(cmd, sizeof cmd, "'%s' calibrate '%s' '%s' -w '%s' -o '%s/none/x.safetensors' 2>&1", cli_path(), ckpt,
             data, fixture_path("v3/v3c.cact"), tmpdir);
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "cannot write") && !strstr(out, "answered"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "'%s' calibrate '%s' '%s' -w '%s' -o '%s' 2>&1", cli_path(), ckpt, data,
             fixture_path("v3/v3c.cact"), ckpt);
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 2 && strstr(out, "must not be the input"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "'%s' calibrate '%s' '%s' -w '%s' -o '%s' 2>&1", cli_path(), ckpt, data,
             fixture_path("tiny_cq4.cact"), tmp("x.safetensors"));
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "Needle 3"), "exit %d: %s", rc, out);
}

/* periodic saves; --layers builds the rung (as `needle build --layers`); a call to an
 * undeclared tool is a warning with its line, the example kept (as the official) */
static void test_saves_layers_warnings(void) {
    char args[1024], out[1 << 16];
    const char *data = data_head("warn.jsonl", 7,
                                 "{\"query\": \"x\", \"tools\": [], \"answers\": [{\"name\": "
                                 "\"nope\", \"arguments\": {}}]}");
    snprintf(args, sizeof args,
             "--batch-size 4 --epochs 1 --val-split 0 --lora-rank 2 --layers 2 --save-every "
             "0.000001 '%s' -o '%s'",
             data, tmp("l.safetensors"));
    const int rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "warn.jsonl:8: warning") && strstr(out, "8 examples"),
              "exit %d: %s", rc, out);
    CHECK_MSG(strstr(out, "saved     step 1 ") && strstr(out, "saved     step 2 "), "%s", out);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' build '%s' --lora '%s' --layers 2 -w '%s' -o '%s' -q 2>&1",
             cli_path(), base_path, tmp("l.safetensors"), fixture_path("v3/v3c.cact"),
             tmp("l2.cact"));
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "%s", out);
    CHECK(same_file(tmp("l.cact"), tmp("l2.cact")));
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' 2>&1", cli_path(), tmp("l.cact"));
    CHECK(run_command(cmd, out, sizeof out) == 0 && strstr(out, "layers          2"));
}

/* a .cact alone as the base: dequantized to an official checkpoint beside the output,
 * which the adapter names and `needle build` merges into (the same bytes as the file
 * finetune built) */
static void test_cact_base(void) {
    char cmd[4096], out[1 << 14], data[512];
    snprintf(data, sizeof data, "%s", data_head("w4.jsonl", 4, NULL)); /* 2 steps */
    snprintf(cmd, sizeof cmd,
             "'%s' finetune -w '%s' --max-len 128 -t 2 --batch-size 2 --epochs 1 --val-split 0 "
             "--lora-rank 2 "
             "-o '%s' '%s' 2>&1",
             cli_path(), fixture_path("v3/v3b.cact"), tmp("w.safetensors"), data);
    int rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "dequantized to"), "exit %d: %s", rc, out);
    train_adapter ad;
    CHECK(train_adapter_read(tmp("w.safetensors"), &ad) == 0);
    CHECK(ad.base && !strcmp(ad.base, tmp("w.base.safetensors")));
    train_adapter_release(&ad);
    snprintf(cmd, sizeof cmd, "'%s' build '%s' --lora '%s' -w '%s' -o '%s' -q 2>&1", cli_path(),
             tmp("w.base.safetensors"), tmp("w.safetensors"), fixture_path("v3/v3b.cact"),
             tmp("w2.cact"));
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    CHECK(same_file(tmp("w.cact"), tmp("w2.cact")));
    /* a tokenizer whose ids the checkpoint does not predict: the line is named */
    snprintf(cmd, sizeof cmd, "'%s' finetune -w '%s' --max-len 128 -o '%s' '%s' 2>&1", cli_path(),
             fixture_path("v3/v3a.cact"), tmp("w3.safetensors"), data_path);
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "data.jsonl:1: error: token id") && strstr(out, "out_vocab"),
              "exit %d: %s", rc, out);
}

#ifndef _WIN32
/* Ctrl-C during training: the state is saved, exit 130, --resume goes on from there */
static void test_interrupt(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        execl(cli_path(), cli_path(), "finetune", "-c", base_path, "-w",
              fixture_path("v3/v3c.cact"), "--max-len", "128", "-t", "1", "--batch-size", "2",
              "--epochs", "50", "--no-score", "-o", tmp("i.safetensors"), data_path, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    char line[1024], all[1 << 14] = "";
    int sent = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strlen(all) + strlen(line) < sizeof all) strcat(all, line);
        if (!sent && strstr(line, "step      2/")) {
            kill(pid, SIGINT);
            sent = 1;
        }
    }
    if (f) fclose(f);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(sent && WIFEXITED(status) && WEXITSTATUS(status) == 130, "status %d: %s", status,
              all);
    CHECK_MSG(strstr(all, "stopped   at step"), "%s", all);
    train_checkpoint ck;
    CHECK(train_checkpoint_read(tmp("i.state.safetensors"), NULL, 3, &ck) == 0);
    CHECK(ck.step >= 2);
    const long step = (long)ck.step;
    train_checkpoint_release(&ck);
    char args[1024], out[1 << 14], want[64];
    snprintf(args, sizeof args,
             "--batch-size 2 --epochs 50 --no-score -o '%s' --resume --max-steps 1 '%s'",
             tmp("i.safetensors"), data_path);
    const int rc = finetune(args, out, sizeof out);
    snprintf(want, sizeof want, "resumed   from step %ld/", step);
    CHECK_MSG(rc == 0 && strstr(out, want), "exit %d: %s", rc, out);
}
#endif

static void expect_error(const char *args, int want_rc, const char *want) {
    char out[1 << 14];
    const int rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == want_rc && strstr(out, want), "%s: exit %d (want %d, \"%s\"): %s", args, rc,
              want_rc, want, out);
}

static void test_bad_input(void) {
    char bad[512], args[1024];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", tmpdir);
    FILE *f = fopen(bad, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(
        f,
        "{\"query\": \"a\", \"tools\": [], \"answers\": []}\n\n{\"query\": \"b\", \"tools\": [\n");
    fclose(f);
    snprintf(args, sizeof args, "'%s' -o '%s'", bad, tmp("x.safetensors"));
    expect_error(args, 1, "bad.jsonl:3");
    snprintf(args, sizeof args, "'%s' -o '%s'", "/nonexistent.jsonl", tmp("x.safetensors"));
    expect_error(args, 1, "cannot read /nonexistent.jsonl");
    f = fopen(bad, "w");
    if (f) fclose(f);
    snprintf(args, sizeof args, "'%s' -o '%s'", bad, tmp("x.safetensors"));
    expect_error(args, 1, "no usable examples");
    snprintf(args, sizeof args, "'%s' --val-split 1.5", data_path);
    expect_error(args, 2, "--val-split");
    snprintf(args, sizeof args, "'%s' --generate 100 --workers 4", data_path);
    expect_error(args, 2, "LLM");
    snprintf(args, sizeof args, "'%s' --lr 0", data_path);
    expect_error(args, 2, "--lr");
    snprintf(args, sizeof args, "'%s' -o '%s'", data_path, tmp("x.cact"));
    expect_error(args, 2, ".safetensors");
    snprintf(args, sizeof args, "'%s' --resume -o '%s'", data_path, tmp("none.safetensors"));
    expect_error(args, 1, "none.state.safetensors");
    /* one step in all: the schedule needs two */
    snprintf(args, sizeof args, "'%s' --epochs 1 --batch-size 64 -o '%s'", data_path,
             tmp("x.safetensors"));
    expect_error(args, 1, "at least 2");
    /* a .cact as the training checkpoint */
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' finetune -c '%s' '%s' 2>&1", cli_path(),
             fixture_path("v3/v3c.cact"), data_path);
    const int rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 2 && strstr(out, "--weights"), "exit %d: %s", rc, out);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/needle_finetune_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_numpy_permutation);
    if (setup()) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    RUN(test_lora_run);
    RUN(test_lora_resume);
    RUN(test_full_resume);
    RUN(test_calibrate);
    RUN(test_saves_layers_warnings);
    RUN(test_cact_base);
#ifndef _WIN32
    RUN(test_interrupt);
#endif
    RUN(test_bad_input);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (!harness_failures) run_command(cmd, NULL, 0);
    return test_summary();
}
