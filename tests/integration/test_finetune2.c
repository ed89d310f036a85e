/* `needle finetune` and `needle build` on a Needle 2 model (issue 33, the 2.0.15 descriptor):
 * the tiny Needle 2 archive tests/fixtures/tiny_cq4.cact (d 96, 4 layers, its own 512-piece
 * tokenizer) as the base, and a small repeated dataset written here.
 *
 *   - a LoRA run from the .cact alone (dequantized to a Needle 2 checkpoint with its config
 *     in the metadata): the validation loss falls; the .cact it builds is the bytes `needle
 *     build` writes from the adapter (with the checkpoint named and with the adapter's
 *     `base`); its held-out score is `needle eval`'s on that file; the build keeps the
 *     base's tokenizer and kv_window;
 *   - --max-steps k, then --resume: the adapter and state are the straight run's bytes
 *     (LoRA, and --full float);
 *   - a Needle 2 checkpoint without config metadata plus --config (as `needle export`
 *     takes one): the same run; without --config a message naming it;
 *   - bad input: --layers on a Needle 2 build, --config with a Needle 3 base.
 * About 15 s on 2 cores (Release). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "train/checkpoint.h"

static char tmpdir[64];
static char data_path[256];
static const char *base_cact;

static const char *tmp(const char *name) {
    static char slots[8][512];
    static int at;
    char *s = slots[at++ % 8];
    snprintf(s, 512, "%s/%s", tmpdir, name);
    return s;
}

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    uint8_t *x = read_file(a, &na), *y = read_file(b, &nb);
    const int same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

static const char *after(const char *text, const char *label) {
    const char *p = strstr(text, label);
    return p ? p + strlen(label) : NULL;
}

static int setup(void) {
    static const char *const lines[] = {
        "{\"query\": \"timer 5\", \"tools\": [{\"name\": \"timer\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"m\": {\"type\": \"integer\"}}}}], \"answers\": [{\"name\": "
        "\"timer\", \"arguments\": {\"m\": 5}}]}",
        "{\"query\": \"call mom\", \"tools\": [{\"name\": \"call\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"who\": {\"type\": \"string\"}}}}], \"answers\": [{\"name\": "
        "\"call\", \"arguments\": {\"who\": \"mom\"}}]}",
        "{\"query\": \"timer 9\", \"tools\": [{\"name\": \"timer\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"m\": {\"type\": \"integer\"}}}}], \"answers\": [{\"name\": "
        "\"timer\", \"arguments\": {\"m\": 9}}]}",
        "{\"query\": \"hi\", \"tools\": [{\"name\": \"call\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"who\": {\"type\": \"string\"}}}}], \"answers\": []}",
    };
    snprintf(data_path, sizeof data_path, "%s/data.jsonl", tmpdir);
    FILE *f = fopen(data_path, "w");
    if (!f) return -1;
    for (int r = 0; r < 4; r++)
        for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) fprintf(f, "%s\n", lines[i]);
    fclose(f);
    return 0;
}

/* 16 lines, batch 4, 3 epochs: 4 held out, 12 trained, 3 steps an epoch, 9 steps */
#define RUN_ARGS "--max-len 128 -t 2 --batch-size 4 --epochs 3 --lr 1e-2 --lora-rank 4 --val-split 0.25 --seed 0"

static int finetune(const char *args, char *out, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' finetune -w '%s' %s 2>&1", cli_path(), base_cact, args);
    return run_command(cmd, out, cap);
}

static char run_a[1 << 16];

static void test_lora_run(void) {
    char args[1024];
    snprintf(args, sizeof args, "%s '%s' -o '%s'", RUN_ARGS, data_path, tmp("a.safetensors"));
    const int rc = finetune(args, run_a, sizeof run_a);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, run_a);
    CHECK_MSG(strstr(run_a, "16 examples  seq_len 128  holdout 4"), "%s", run_a);
    CHECK_MSG(strstr(run_a, "9 steps  3 epochs  5 trained tensors"), "%s", run_a);
    /* the dequantized base is a Needle 2 checkpoint with its config */
    train_checkpoint ck;
    CHECK(train_checkpoint_read(tmp("a.base.safetensors"), NULL, 2, &ck) == 0);
    CHECK(ck.config && strstr(ck.config, "\"d_model\":96"));
    train_checkpoint_release(&ck);
    const char *e1 = after(run_a, "epoch     1/3"), *e3 = after(run_a, "epoch     3/3");
    const char *v1 = e1 ? strstr(e1, "val ") : NULL, *v3 = e3 ? strstr(e3, "val ") : NULL;
    CHECK_MSG(v1 && v3, "%s", run_a);
    /* (a LoRA of rank 4 on the attention of a random network moves its loss a little: 6.215
     * -> 6.199 here; the --full run below shows the loop learning) */
    if (v1 && v3)
        CHECK_MSG(atof(v3 + 4) < atof(v1 + 4) - 0.005, "val %g -> %g", atof(v1 + 4), atof(v3 + 4));
    /* the built file is `needle build`'s, from the checkpoint named or the adapter's base */
    char cmd[4096], out[1 << 14];
    snprintf(cmd, sizeof cmd, "'%s' build '%s' --lora '%s' -w '%s' -o '%s' -q 2>&1", cli_path(),
             tmp("a.base.safetensors"), tmp("a.safetensors"), base_cact, tmp("rebuilt.cact"));
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "%s", out);
    CHECK_MSG(same_file(tmp("a.cact"), tmp("rebuilt.cact")), "the built file differs from needle build's");
    snprintf(cmd, sizeof cmd, "'%s' build --lora '%s' -w '%s' -o '%s' -q 2>&1", cli_path(),
             tmp("a.safetensors"), base_cact, tmp("rebuilt2.cact"));
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "%s", out);
    CHECK(same_file(tmp("a.cact"), tmp("rebuilt2.cact")));
    /* the merge changed the weights, the base's tokenizer and kv_window are kept */
    CHECK(!same_file(tmp("a.cact"), base_cact));
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' 2>&1", cli_path(), tmp("a.cact"));
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0 && strstr(out, "tokenizer       yes") &&
                  strstr(out, "kv_window       16") && strstr(out, "vocab           512"),
              "%s", out);
    /* the printed score is `needle eval`'s on the written file */
    snprintf(cmd, sizeof cmd, "'%s' eval -w '%s' '%s' 2>&1", cli_path(), tmp("a.cact"), tmp("a.heldout.jsonl"));
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "%s", out);
    const char *mine = after(run_a, "exact match"), *theirs = after(out, "exact match");
    CHECK_MSG(mine && theirs, "finetune:\n%s\neval:\n%s", run_a, out);
    if (mine && theirs) {
        const size_t len = strcspn(mine, "\n");
        CHECK_MSG(len == strcspn(theirs, "\n") && !strncmp(mine, theirs, len), "finetune %.*s, eval %.*s",
                  (int)len, mine, (int)strcspn(theirs, "\n"), theirs);
    }
    train_adapter ad;
    CHECK(train_adapter_read(tmp("a.safetensors"), &ad) == 0);
    CHECK_EQ_INT(ad.rank, 4);
    CHECK(ad.scale == 8.0);
    CHECK_EQ_INT(ad.n, 5);
    for (uint32_t i = 0; i < ad.n; i++) CHECK(!strncmp(ad.lora[i].path, "stack/layers/block/self_attn/", 29));
    train_adapter_release(&ad);
}

static void test_lora_resume(void) {
    char args[1024], out[1 << 16];
    /* the same base path as run a's (the adapter records it) */
    snprintf(args, sizeof args, "%s '%s' -c '%s' -o '%s' --max-steps 5 --no-score", RUN_ARGS, data_path,
             tmp("a.base.safetensors"), tmp("b.safetensors"));
    int rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "stopped   at step 5/9"), "exit %d: %s", rc, out);
    snprintf(args, sizeof args, "%s '%s' -c '%s' -o '%s' --resume --no-score", RUN_ARGS, data_path,
             tmp("a.base.safetensors"), tmp("b.safetensors"));
    rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "resumed   from step 5/9"), "exit %d: %s", rc, out);
    CHECK_MSG(same_file(tmp("a.safetensors"), tmp("b.safetensors")), "adapter after 5 + resume 4 != 9 straight");
    CHECK_MSG(same_file(tmp("a.state.safetensors"), tmp("b.state.safetensors")), "state differs");
}

static void test_full_resume(void) {
    char args[1024], out[1 << 16];
    char full[1 << 16];
    snprintf(args, sizeof args, "%s '%s' --full -o '%s' --no-score", RUN_ARGS, data_path, tmp("f.safetensors"));
    int rc = finetune(args, full, sizeof full);
    CHECK_MSG(rc == 0 && strstr(full, "9 steps") && strstr(full, "float32"), "exit %d: %s", rc, full);
    /* every parameter trained: the held-out loss falls from about ln 512 */
    const char *e1 = after(full, "epoch     1/3"), *e3 = after(full, "epoch     3/3");
    const char *v1 = e1 ? strstr(e1, "val ") : NULL, *v3 = e3 ? strstr(e3, "val ") : NULL;
    CHECK_MSG(v1 && v3 && atof(v3 + 4) < atof(v1 + 4) - 1.0, "%s", full);
    snprintf(args, sizeof args, "%s '%s' --full -o '%s' --no-score --max-steps 4", RUN_ARGS, data_path,
             tmp("g.safetensors"));
    rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "stopped   at step 4/9"), "exit %d: %s", rc, out);
    snprintf(args, sizeof args, "%s '%s' --full -o '%s' --no-score --resume", RUN_ARGS, data_path,
             tmp("g.safetensors"));
    rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "resumed   from step 4/9"), "exit %d: %s", rc, out);
    CHECK_MSG(same_file(tmp("f.safetensors"), tmp("g.safetensors")), "full: 4 + resume 5 != 9 straight");
    /* the full checkpoint carries its config: its build loads */
    CHECK(access(tmp("f.cact"), R_OK) == 0);
}

/* a Needle 2 checkpoint as `needle export` takes it: tensors only, the config beside it */
static void test_checkpoint_with_config(void) {
    train_checkpoint ck;
    CHECK(train_checkpoint_read(tmp("a.base.safetensors"), NULL, 2, &ck) == 0);
    CHECK(train_write_tensors(tmp("plain.safetensors"), ck.tensors, ck.n, NULL) == 0);
    FILE *f = fopen(tmp("config.json"), "w");
    CHECK(f != NULL);
    if (f) {
        fputs(ck.config, f);
        fclose(f);
    }
    train_checkpoint_release(&ck);
    char args[2048], out[1 << 16];
    snprintf(args, sizeof args, "%s '%s' -c '%s' --config '%s' -o '%s' --no-score", RUN_ARGS, data_path,
             tmp("plain.safetensors"), tmp("config.json"), tmp("c.safetensors"));
    int rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    /* the same base and settings: the same adapter as the run from the .cact */
    train_adapter a, c;
    CHECK(train_adapter_read(tmp("a.safetensors"), &a) == 0 && train_adapter_read(tmp("c.safetensors"), &c) == 0);
    CHECK(a.n == c.n);
    for (uint32_t i = 0; i < a.n && i < c.n; i++)
        CHECK(!memcmp(a.lora[i].b.data, c.lora[i].b.data, a.lora[i].b.numel * sizeof(float)));
    train_adapter_release(&a);
    train_adapter_release(&c);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' build '%s' --config '%s' --lora '%s' -w '%s' -o '%s' -q 2>&1", cli_path(),
             tmp("plain.safetensors"), tmp("config.json"), tmp("c.safetensors"), base_cact, tmp("c2.cact"));
    CHECK_MSG(run_command(cmd, out, sizeof out) == 0, "%s", out);
    CHECK(same_file(tmp("c.cact"), tmp("c2.cact")));
    CHECK(same_file(tmp("a.cact"), tmp("c2.cact")));
    /* without the config: a message naming --config */
    snprintf(args, sizeof args, "%s '%s' -c '%s' -o '%s' --no-score", RUN_ARGS, data_path, tmp("plain.safetensors"),
             tmp("d.safetensors"));
    rc = finetune(args, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "--config"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "'%s' build '%s' --lora '%s' -w '%s' -o '%s' 2>&1", cli_path(),
             tmp("plain.safetensors"), tmp("c.safetensors"), base_cact, tmp("c3.cact"));
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "--config"), "exit %d: %s", rc, out);
}

static void test_bad_input(void) {
    char cmd[4096], out[1 << 14];
    snprintf(cmd, sizeof cmd, "'%s' build '%s' --lora '%s' -w '%s' --layers 2 -o '%s' 2>&1", cli_path(),
             tmp("a.base.safetensors"), tmp("a.safetensors"), base_cact, tmp("x.cact"));
    int rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "no ladder"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "'%s' finetune '%s' -c '%s' --config '%s' -w '%s' 2>&1", cli_path(), data_path,
             tmp("plain.safetensors"), tmp("config.json"), fixture_path("v3/v3c.cact"));
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "--config is for a Needle 2"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "'%s' finetune '%s' --config '%s' -w '%s' 2>&1", cli_path(), data_path,
             tmp("config.json"), base_cact);
    rc = run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 2 && strstr(out, "--config goes with --checkpoint"), "exit %d: %s", rc, out);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/needle_finetune2_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    base_cact = fixture_path("tiny_cq4.cact");
    if (setup()) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    RUN(test_lora_run);
    RUN(test_lora_resume);
    RUN(test_full_resume);
    RUN(test_checkpoint_with_config);
    RUN(test_bad_input);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (!harness_failures) run_command(cmd, NULL, 0);
    return test_summary();
}
