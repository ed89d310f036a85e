/* The training-data encoder against the official fine-tuner of cactus-needle 3.2.8:
 * tests/fixtures/finetune/expected.json (tests/reference/make_finetune_data_fixtures.py)
 * holds, for data.jsonl at two --max-len caps, the official rendered prompt and target,
 * ids and loss mask of every example and the fitted sequence length; ours must be the
 * same, through the library and through `needle encode-data`. Then the reports (line
 * numbers of skipped lines and warnings) and the refusals. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "train/finetune_data.h"

static needle_model *model;
static char tmpdir[64];

typedef struct seen {
    char text[8192];
    size_t n;
} seen;

static void collect(void *user, uint32_t line, int severity, const char *msg) {
    seen *s = user;
    s->n += (size_t)snprintf(s->text + s->n, sizeof s->text - s->n, "%u:%d:%s\n", line, severity, msg);
    if (s->n >= sizeof s->text) s->n = sizeof s->text - 1;
}

/* the i-th line of the data (1-based), malloc'd without its line break */
static char *line_of(const char *text, uint32_t want) {
    const char *p = text;
    for (uint32_t line = 1; *p; line++) {
        const char *e = p;
        while (*e && *e != '\n' && *e != '\r') e++;
        if (line == want) return strndup(p, (size_t)(e - p));
        p = *e == '\r' && e[1] == '\n' ? e + 2 : e + (*e != 0);
    }
    return NULL;
}

static void test_official_parity(void) {
    size_t n, size;
    char *json = (char *)read_file(fixture_path("finetune/expected.json"), &n);
    char *text = (char *)read_file(fixture_path("finetune/data.jsonl"), &size);
    cJSON *exp = json ? cJSON_Parse(json) : NULL;
    CHECK(exp && text);
    const cJSON *cap;
    int caps = 0;
    cJSON_ArrayForEach(cap, cJSON_GetObjectItemCaseSensitive(exp, "caps")) {
        seen s = {0};
        ft_data d;
        const int st = ft_data_load(model, text, size, (uint32_t)atoi(cap->string), collect, &s, &d);
        CHECK_MSG(st == 0, "cap %s: %s", cap->string, needle_last_error());
        if (st) continue;
        caps++;
        const cJSON *examples = cJSON_GetObjectItemCaseSensitive(cap, "examples");
        CHECK_EQ_INT(d.seq_len, (int)cJSON_GetObjectItemCaseSensitive(cap, "max_len")->valuedouble);
        CHECK_EQ_INT(d.n, cJSON_GetArraySize(examples));
        CHECK_EQ_INT(d.skipped, 2);
        int32_t *ids = malloc(d.seq_len * sizeof *ids);
        uint8_t *mask = malloc(d.seq_len);
        for (uint32_t i = 0; i < d.n && i < (uint32_t)cJSON_GetArraySize(examples); i++) {
            const cJSON *x = cJSON_GetArrayItem(examples, (int)i);
            const cJSON *xi = cJSON_GetObjectItemCaseSensitive(x, "ids"), *xm = cJSON_GetObjectItemCaseSensitive(x, "mask");
            const uint32_t xn = (uint32_t)cJSON_GetObjectItemCaseSensitive(x, "n")->valuedouble;
            ft_data_row(&d, i, ids, mask);
            int same = 1;
            for (uint32_t k = 0; k < d.seq_len && same; k++) {
                const int want_id = k < xn ? (int)cJSON_GetArrayItem(xi, (int)k)->valuedouble : 0;
                const int want_mask = k < xn ? (int)cJSON_GetArrayItem(xm, (int)k)->valuedouble : 0;
                same = ids[k] == want_id && mask[k] == want_mask;
                CHECK_MSG(same, "cap %s, example %u (line %u): position %u: id %d mask %d, official %d %d", cap->string,
                          i, d.ex[i].line, k, ids[k], mask[k], want_id, want_mask);
            }
            /* the rendered text itself */
            char *line = line_of(text, d.ex[i].line), why[256];
            ft_rendered r;
            CHECK(line && ft_render_line(line, strlen(line), &r, why, sizeof why) == 1);
            CHECK_MSG(r.prompt && !strcmp(r.prompt, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "prompt"))),
                      "line %u: prompt %s", d.ex[i].line, r.prompt ? r.prompt : "(none)");
            CHECK_MSG(r.target && !strcmp(r.target, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "target"))),
                      "line %u: target %s", d.ex[i].line, r.target ? r.target : "(none)");
            ft_rendered_free(&r);
            free(line);
        }
        /* reports: the skipped chat lines, the unknown tool, the call its schema refuses */
        CHECK_MSG(strstr(s.text, "17:2:skipped") && strstr(s.text, "18:2:skipped"), "%s", s.text);
        CHECK_MSG(strstr(s.text, "25:1:call 1 names the tool \"launch_rocket\""), "%s", s.text);
        CHECK_MSG(strstr(s.text, "26:1:the calls are not admitted") && strstr(s.text, "16:1:the calls are not admitted"),
                  "%s", s.text);
        if (!strcmp(cap->string, "128")) CHECK_MSG(strstr(s.text, "27:1:") && strstr(s.text, "cut there"), "%s", s.text);
        free(ids);
        free(mask);
        ft_data_free(&d);
    }
    CHECK(caps == 2);
    cJSON_Delete(exp);
    free(json);
    free(text);
}

static int run_cli(const char *args, char *out, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' encode-data %s 2>&1", fixture_dir(), cli_path(), args);
    return run_command(cmd, out, cap);
}

/* the CLI writes the same rows */
static void test_cli_rows(void) {
    char args[512], out[16384], path[128];
    snprintf(path, sizeof path, "%s/rows.jsonl", tmpdir);
    snprintf(args, sizeof args, "finetune/data.jsonl -w v3/v3c.cact --max-len 128 -o '%s'", path);
    CHECK_MSG(run_cli(args, out, sizeof out) == 0, "%s", out);
    CHECK_MSG(strstr(out, "finetune/data.jsonl:25: warning: call 1 names the tool") && strstr(out, "30 examples"), "%s", out);
    size_t n, en;
    char *rows = (char *)read_file(path, &n), *json = (char *)read_file(fixture_path("finetune/expected.json"), &en);
    cJSON *exp = json ? cJSON_Parse(json) : NULL;
    const cJSON *examples = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(exp, "caps"), "128"), "examples");
    CHECK(rows && cJSON_GetArraySize(examples) == 30);
    int i = 0;
    for (char *p = rows, *e; p && *p; p = e + 1, i++) {
        e = strchr(p, '\n');
        if (!e) break;
        cJSON *row = cJSON_ParseWithLength(p, (size_t)(e - p));
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(row, "ids"), *mask = cJSON_GetObjectItemCaseSensitive(row, "mask");
        const cJSON *x = cJSON_GetArrayItem(examples, i);
        const cJSON *xi = cJSON_GetObjectItemCaseSensitive(x, "ids"), *xm = cJSON_GetObjectItemCaseSensitive(x, "mask");
        CHECK(cJSON_GetArraySize(ids) == 128 && cJSON_GetArraySize(mask) == 128);
        int same = 1;
        for (int k = 0; k < cJSON_GetArraySize(xi) && same; k++)
            same = cJSON_GetArrayItem(ids, k)->valueint == cJSON_GetArrayItem(xi, k)->valueint &&
                   cJSON_GetArrayItem(mask, k)->valueint == cJSON_GetArrayItem(xm, k)->valueint;
        CHECK_MSG(same, "row %d differs from the official", i);
        cJSON_Delete(row);
    }
    CHECK_EQ_INT(i, 30);
    free(rows);
    free(json);
    cJSON_Delete(exp);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void expect_refusal(const char *data, const char *extra, const char *message) {
    char in[128], outp[128], args[512], out[4096];
    snprintf(in, sizeof in, "%s/bad.jsonl", tmpdir);
    snprintf(outp, sizeof outp, "%s/bad.out", tmpdir);
    write_text(in, data);
    remove(outp);
    snprintf(args, sizeof args, "'%s' -w v3/v3c.cact %s -o '%s'", in, extra, outp);
    const int rc = run_cli(args, out, sizeof out);
    CHECK_MSG(rc == 1, "%s: exit %d: %s", data, rc, out);
    CHECK_MSG(strstr(out, message) != NULL, "wanted \"%s\" in: %s", message, out);
    CHECK_MSG(access(outp, F_OK) != 0, "%s: wrote rows", data);
}

static void test_refusals(void) {
    const char *ok = "{\"query\":\"q\",\"tools\":[],\"answers\":[]}\n";
    char two[256];
    snprintf(two, sizeof two, "%s{\"query\": \"q\", \"tools\": [\n", ok);
    expect_refusal(two, "", "bad.jsonl:2: error: not JSON");
    expect_refusal("[1, 2]\n", "", ":1: error: not a JSON object");
    expect_refusal("{\"query\": 5, \"answers\": []}\n", "", ":1: error: query is not text");
    expect_refusal("{\"query\": \"q\", \"reasoning\": [1]}\n", "", "reasoning is not text");
    expect_refusal("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":"
                   "[{\"function\":{\"name\":\"f\",\"arguments\":\"{oops\"}}]}]}\n",
                   "", "arguments string is not JSON");
    expect_refusal("\n\n", "", "no usable examples");
    expect_refusal("{\"query\":\"q\",\"tools\":[{\"name\":\"a\"}],\"answers\":[{\"name\":\"b\",\"arguments\":{}}]}\n",
                   "--strict", "--strict: 1 warning");
    expect_refusal("\xff\xfe{}\n", "", "error");
}

int main(void) {
    if (needle_model_open(fixture_path("v3/v3c.cact"), NULL, &model) != NEEDLE_OK) {
        fprintf(stderr, "cannot open v3c.cact: %s\n", needle_last_error());
        return 1;
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/needle_ftdata_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_official_parity);
    RUN(test_cli_rows);
    RUN(test_refusals);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    run_command(cmd, NULL, 0);
    needle_model_free(model);
    return test_summary();
}
