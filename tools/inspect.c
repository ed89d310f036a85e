/* inspect.c: `needle inspect` (a .cact file's header, geometry and tensors) and
 * `needle tokenize` (the tokenizer stored in it). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *dtype_name(int dtype) {
    switch (dtype) {
    case NEEDLE_DTYPE_FP16: return "FP16";
    case NEEDLE_DTYPE_FP32: return "FP32";
    case NEEDLE_DTYPE_CQ: return "CQ";
    case NEEDLE_DTYPE_RAW: return "RAW";
    default: return "?";
    }
}

static void print_info(const char *path, const needle_model_info *in, double load_ms) {
    printf("file            %s (%" PRIu64 " bytes, loaded in %.2f ms)\n", path, in->file_size,
           load_ms);
    printf("tensors         %u\n", in->num_tensors);
    printf("vocab           %u\n", in->vocab);
    printf("d_model         %u\n", in->d_model);
    printf("layers          %u\n", in->num_layers);
    printf("heads           %u query / %u kv, head_dim %u\n", in->num_heads, in->num_kv_heads,
           in->head_dim);
    printf("hada_n          %u\n", in->hada_n);
    printf("mhc_lanes       %u\n", in->mhc_lanes);
    printf("max_seq_len     %u\n", in->max_seq_len);
    printf("kv_window       %u\n", in->kv_window);
    printf("kv_bits         %u\n", in->kv_bits);
    printf("rope_theta      %g\n", (double)in->rope_theta);
    printf("engram          %u sites [", in->num_engram_sites);
    /* engram_sites holds 4; a Needle 3 file may have up to 16 sites */
    for (uint32_t i = 0; i < in->num_engram_sites && i < 16; i++)
        printf(i ? ", %u" : "%u", in->engram_sites_all[i]);
    printf("], orders [");
    for (uint32_t i = 0; i < in->num_engram_orders; i++)
        printf(i ? ", %u" : "%u", in->engram_orders[i]);
    printf("], %u tables x %u slots x %u, %u taps, dilation %u\n", in->num_engram_tables,
           in->engram_slots, in->engram_sub_dim, in->engram_conv_taps, in->engram_conv_dilation);
    printf("cq group        %u\n", in->group_size);
    printf("tokenizer       %s\n", in->has_tokenizer ? "yes" : "no");
    printf("probe heads     %u", in->num_probe_heads);
    for (uint32_t i = 0; i < in->num_probe_heads; i++)
        printf(i ? ", %s" : " (%s", in->probe_head_codes[i] == 1   ? "contrastive"
                                    : in->probe_head_codes[i] == 2 ? "confidence"
                                                                   : "router");
    printf(in->num_probe_heads ? ")\n" : "\n");
    if (in->generation != 3) return;
    printf("generation      3 (Needle 3)\n");
    printf("out_vocab       %u\n", in->out_vocab);
    printf("head dims       qk %u, v %u\n", in->qk_head_dim, in->v_head_dim);
    printf("attention       sliding window %u, global layers [", in->sliding_window);
    for (uint32_t i = 0, k = 0; i < 64; i++)
        if (in->global_layers >> i & 1) printf(k++ ? ", %u" : "%u", i);
    printf("], %u conv taps on q/k/v\n", in->qkv_conv_taps);
    printf("engram seeds    %u heads (0: the heads per order)\n", in->engram_seed_heads);
    printf("layers run      %u of %u in the file\n", in->num_layers, in->file_layers);
}

/* The ladder of a Needle 3 file: the file layers each rung (--depth) runs. */
static void print_rungs(const char *path, const needle_model_info *in) {
    if (in->generation != 3 || in->file_layers < 2) return;
    printf("ladder          depth: file layers run\n");
    for (uint32_t depth = 2; depth <= in->file_layers; depth++) {
        needle_model_params mp = needle_model_default_params();
        mp.depth = (int32_t)depth;
        needle_model *r;
        if (needle_model_open(path, &mp, &r) != NEEDLE_OK) return;
        needle_model_info ri = {.size = sizeof ri};
        needle_model_get_info(r, &ri);
        needle_model_free(r);
        printf("  %3u:", depth);
        for (uint32_t i = 0; i < 64; i++)
            if (ri.layers_run >> i & 1) printf(" %u", i);
        printf("\n");
    }
}

static void print_tensors(const needle_model *m, uint32_t n) {
    printf("\n%5s  %-26s %-5s %-20s %5s %10s %12s\n", "index", "name", "dtype", "shape", "bits",
           "bytes", "offset");
    for (uint32_t i = 0; i < n; i++) {
        needle_tensor_info t = {.size = sizeof t};
        needle_model_get_tensor(m, i, &t);
        char shape[64] = "";
        size_t len = 0;
        for (uint32_t k = 0; k < t.ndim; k++)
            len += (size_t)snprintf(shape + len, sizeof shape - len, k ? "x%u" : "%u", t.shape[k]);
        if (t.ndim == 0) snprintf(shape, sizeof shape, "-");
        char bits[8] = "-";
        if (t.dtype == NEEDLE_DTYPE_CQ) {
            if (t.bits == 5) snprintf(bits, sizeof bits, "1.58");
            else snprintf(bits, sizeof bits, "%u", t.bits);
        }
        printf("%5u  %-26s %-5s %-20s %5s %10" PRIu64 " %12" PRIu64 "\n", i, t.name,
               dtype_name(t.dtype), shape, bits, t.nbytes, t.offset);
    }
}

static int run_inspect(const cli_command *self, int argc, char **argv) {
    const char *weights = NULL, *file = NULL;
    const cli_option opts[] = {{"--weights", "-w", CLI_TEXT, &weights, 0, 0, NULL}, {0}};
    const int st = cli_parse(self, argc, argv, opts, &file, 1);
    if (st != CLI_GO) return st;
    if (!file) file = weights;
    if (!file && !cli_default_weights(&file))
        return cli_usage_error(self, "needs a FILE (no default model was found)");
    const double t0 = cli_now_ms();
    needle_model *m;
    const int rc = needle_model_open(file, NULL, &m);
    if (rc) return cli_lib_error(file, rc);
    const double load_ms = cli_now_ms() - t0;
    needle_model_info in = {.size = sizeof in};
    needle_model_get_info(m, &in);
    print_info(file, &in, load_ms);
    print_rungs(file, &in);
    print_tensors(m, in.num_tensors);
    needle_model_free(m);
    return 0;
}

const cli_command cli_inspect = {
    "inspect", "header, geometry and every tensor of a .cact file",
    "usage: needle inspect [FILE]\n"
    "\n"
    "Prints the header of a .cact model file (geometry, KV window and bits, engram\n"
    "layout, tokenizer, probe heads) and one line per tensor: name, dtype, shape, bits,\n"
    "bytes and offset.\n"
    "\n"
    "options:\n"
    "  FILE                    the file to read (or --weights FILE; default: the\n"
    "                          default model)\n"
    CLI_WEIGHTS_HELP
    "  -h, --help              this text\n",
    run_inspect};

static int run_tokenize(const cli_command *self, int argc, char **argv) {
    const char *weights = NULL, *text = NULL;
    const cli_option opts[] = {{"--weights", "-w", CLI_TEXT, &weights, 0, 0, NULL}, {0}};
    const int st = cli_parse(self, argc, argv, opts, &text, 1);
    if (st != CLI_GO) return st;
    if (!text) return cli_usage_error(self, "needs the TEXT to tokenize");
    cli_default_weights(&weights);
    if (!weights) return cli_no_weights();
    needle_model *m;
    int rc = needle_model_open(weights, NULL, &m);
    if (rc) return cli_lib_error(weights, rc);
    size_t n = 0;
    const size_t len = strlen(text);
    rc = needle_tokenize(m, text, len, NULL, 0, &n);
    int32_t *ids = NULL;
    if (rc == NEEDLE_ERR_BUFFER_TOO_SMALL || rc == NEEDLE_OK) {
        ids = malloc((n ? n : 1) * sizeof *ids);
        rc = ids ? needle_tokenize(m, text, len, ids, n, &n) : NEEDLE_ERR_OUT_OF_MEMORY;
    }
    if (rc) {
        free(ids);
        needle_model_free(m);
        return cli_lib_error("tokenize", rc);
    }
    printf("%zu tokens\n", n);
    for (size_t i = 0; i < n; i++) {
        const char *piece;
        size_t plen;
        needle_token_piece(m, ids[i], &piece, &plen);
        printf("%6d  %.*s\n", ids[i], (int)plen, piece);
    }
    printf("ids: ");
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    needle_model_free(m);
    return 0;
}

const cli_command cli_tokenize = {
    "tokenize", "token ids and pieces of a text",
    "usage: needle tokenize [--weights FILE] TEXT\n"
    "\n"
    "Encodes TEXT with the model's tokenizer (no BOS is added): one line per token with\n"
    "its id and piece, then the ids comma-separated (the form `needle logits --tokens`\n"
    "takes).\n"
    "\n"
    "options:\n"
    CLI_WEIGHTS_HELP
    "  -h, --help              this text\n",
    run_tokenize};
