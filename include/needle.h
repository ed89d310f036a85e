/* needle.h: the one public header of libneedle, an inference engine for the Needle 2
 * family of tool-calling models (".cact" files).
 *
 * Two handles:
 *   needle_model    an immutable loaded model (weights stay mapped). Safe to share between
 *                   threads; every session borrows it, so free it after its sessions.
 *   needle_session  one conversation: KV cache, position, scratch buffers. One thread at a
 *                   time per session; different sessions may run concurrently.
 *
 * Conventions:
 *   - Fallible calls return an int: NEEDLE_OK (0) on success, a negative needle_status on
 *     failure. needle_last_error() then holds a message for the calling thread.
 *   - Constructors fill `*out` only on success. Every *_free(NULL) is a no-op.
 *   - Params structs are passed by pointer; NULL means the *_default_params() values.
 *   - Every public struct begins with `uint32_t size` (see "Struct sizes" below).
 *   - The library never prints, exits or aborts.
 */
#ifndef NEEDLE_H
#define NEEDLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the library's exported functions. libneedle is built with hidden visibility and a
 * version script, so these declarations are its whole dynamic ABI (tests/check_exports.sh
 * fails the build's tests if anything else is exported). */
#if defined(_WIN32) && defined(NEEDLE_BUILD_DLL)
/* building libneedle.dll (CMake defines it): these functions, and only these, are its
 * export table; callers reach them through the import library, no dllimport needed */
#define NEEDLE_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define NEEDLE_API __attribute__((visibility("default")))
#else
#define NEEDLE_API
#endif

/* The one place the version is written: CMake, the SONAME (libneedle.so.MAJOR) and the
 * Python package read these lines. The library's ABI stays compatible within a major
 * version (see "Struct sizes" below). */
#define NEEDLE_VERSION_MAJOR 0
#define NEEDLE_VERSION_MINOR 3
#define NEEDLE_VERSION_PATCH 0
/* "major.minor.patch" of the header, derived from the three lines above */
#define NEEDLE_VERSION_STR_(x) #x
#define NEEDLE_VERSION_STR(x) NEEDLE_VERSION_STR_(x)
#define NEEDLE_VERSION_STRING                                                                  \
    NEEDLE_VERSION_STR(NEEDLE_VERSION_MAJOR)                                                   \
    "." NEEDLE_VERSION_STR(NEEDLE_VERSION_MINOR) "." NEEDLE_VERSION_STR(NEEDLE_VERSION_PATCH)

/* "major.minor.patch" of the library actually linked (compare with the macros above,
 * which are the version the caller was compiled against). */
NEEDLE_API const char *needle_version(void);

typedef enum needle_status {
    NEEDLE_OK = 0,
    NEEDLE_ERR_INVALID_ARGUMENT = -1, /* NULL handle, bad parameter value */
    NEEDLE_ERR_IO = -2,               /* cannot open, stat or map a file */
    NEEDLE_ERR_FORMAT = -3,           /* corrupt, truncated or unsupported .cact */
    NEEDLE_ERR_OUT_OF_MEMORY = -4,
    NEEDLE_ERR_NO_TOKENIZER = -5,     /* text call on a model without a tokenizer */
    NEEDLE_ERR_INVALID_UTF8 = -6,     /* input text is not valid UTF-8 (or holds NUL) */
    NEEDLE_ERR_CONTEXT_FULL = -7,     /* tokens do not fit in the session's context */
    NEEDLE_ERR_BUFFER_TOO_SMALL = -8, /* caller's buffer too small; size reported */
    NEEDLE_ERR_INVALID_TOKEN = -9,    /* token id outside [0, vocab) */
    NEEDLE_ERR_JSON = -10,            /* malformed JSON input */
    NEEDLE_ERR_SCHEMA = -11,          /* tool schema invalid or unsupported */
    NEEDLE_ERR_BACKEND = -12,         /* requested backend not built in or no device */
    NEEDLE_ERR_STATE = -13,           /* call not valid in the handle's current state */
    /* Not returned by any function of this version (the value stays reserved): a turn
     * cut by max_new_tokens is reported inside the needle_session_complete envelope
     * ("error_code": "max_tokens"), and needle_session_generate stopping at
     * max_new_tokens is a success. */
    NEEDLE_ERR_MAX_TOKENS = -14,
    NEEDLE_ERR_CANCELLED = -15        /* a needle_callbacks callback asked to stop */
} needle_status;

/* Struct sizes. Every params and info struct begins with `uint32_t size`, the struct's
 * size in bytes as the caller was compiled (sizeof), so that later versions can append
 * fields without breaking programs built against this header:
 *   - params structs (inputs): the *_default_params() functions set size; start from them
 *     and change fields. The library reads the first `size` bytes and takes the defaults
 *     for fields it knows beyond them (a caller built against an older, smaller struct).
 *   - info and stats structs (outputs): set `size = sizeof` before the call, e.g.
 *     `needle_model_info info = {.size = sizeof info};` (or `info.size = sizeof info;`).
 *     The library fills the first `size` bytes
 *     and leaves `size` as it was.
 * A size of 0 (an uninitialized struct), a size below 4 or above the library's own struct
 * (a caller built against a newer header than the library) fails with
 * NEEDLE_ERR_INVALID_ARGUMENT and nothing is read or written. Fields are only ever
 * appended, never reordered or resized, within a major version. */

/* sizeof the named public struct in this library ("needle_model_params",
 * "needle_model_info", ...: every struct of this header), 0 for an unknown name. Lets
 * bindings that copy the layouts (python/needle/_lib.py) check them at load time. */
NEEDLE_API size_t needle_struct_size(const char *name);

/* Static description of a status code; never NULL. */
NEEDLE_API const char *needle_status_string(int status);

/* Message of the last failure on the calling thread ("" if none). The pointer stays valid
 * until the next failing call on this thread. */
NEEDLE_API const char *needle_last_error(void);

/* ------------------------------------------------------------------------------------ */
/* Models                                                                                */

typedef struct needle_model needle_model;

typedef struct needle_model_params {
    uint32_t size; /* sizeof(needle_model_params), see "Struct sizes" */
    int32_t n_threads; /* worker threads for sessions of this model; 0 = NEEDLE_THREADS or cores */
    /* "cpu", "cuda" or "metal"; NULL or "" = auto (see "Backends and devices" below). A
     * forced backend that is unknown, not built in, or without a device fails the open
     * with NEEDLE_ERR_BACKEND; there is no silent fallback. */
    const char *backend;
    /* Needle 3: run the `depth`-layer rung of the file's ladder (the official bisection
     * order, without copying weights); 0 = every layer. Must be 0 or in [2, layers] for a
     * Needle 3 file and 0 for a Needle 2 file (NEEDLE_ERR_INVALID_ARGUMENT otherwise). */
    int32_t depth;
} needle_model_params;

NEEDLE_API needle_model_params needle_model_default_params(void);

/* Maps and validates a .cact file. Every offset, size and shape is checked before use;
 * a bad file yields NEEDLE_ERR_FORMAT (or NEEDLE_ERR_IO) and a message. */
NEEDLE_API int needle_model_open(const char *path, const needle_model_params *params,
                                 needle_model **out);

/* Same, over a caller-owned in-memory image. If `data` is 64-byte aligned (as malloc'd
 * buffers of this size and mmap'd files usually are), the bytes are used in place, not
 * copied: they must stay valid and unchanged until needle_model_free(). Otherwise the
 * kernels cannot read the tensors in place, so the image is copied once into aligned
 * memory owned by the model (`size` more bytes), and the caller's buffer is no longer
 * needed when the call returns. */
NEEDLE_API int needle_model_open_blob(const void *data, size_t size,
                                      const needle_model_params *params, needle_model **out);

/* Frees the model. All its sessions must be freed first. NULL is a no-op. */
NEEDLE_API void needle_model_free(needle_model *model);

/* The model to open when the caller names none (the CLI without --weights, the official
 * ABI's needle_init without needle_load): env NEEDLE_MODEL if set and non-empty, else the
 * newest cached official Needle 3 (Cactus-Compute/needle3 needle3.cact in the Hugging Face
 * hub cache at refs/main, else its newest snapshot, else the official package's copy under
 * ~/.cache/cactus-needle/v3/), else the same for Needle 2, else the installed demo model
 * (<datadir>/needle/needle-demo.cact), else the demo model of the source tree this library
 * was built from; NULL if none of those is readable. The hub cache is $HF_HUB_CACHE, else
 * $HF_HOME/hub, else ~/.cache/huggingface/hub; it is read from the filesystem only (no
 * network). The string is the environment's, static, or per thread (valid until the
 * calling thread's next call). */
NEEDLE_API const char *needle_default_model_path(void);

/* The demo-model paths needle_default_model_path() tries after $NEEDLE_MODEL, in its order
 * (0: the installed copy, 1: this build's source tree), readable or not, so a caller can
 * say where it looked; NULL past the end or where this build has no such path. Static. */
NEEDLE_API const char *needle_default_model_candidate(int index);

/* The demo model's tool list (needle-demo.tools.json beside the installed or source-tree
 * demo model), or NULL if it is missing. It describes the demo model only: pair it with
 * another model at your own risk. Static storage. */
NEEDLE_API const char *needle_default_tools_path(void);

typedef struct needle_model_info {
    uint32_t size; /* sizeof(needle_model_info), see "Struct sizes" */
    uint64_t file_size;
    uint32_t num_tensors;
    uint32_t vocab;
    uint32_t d_model;
    uint32_t num_layers;
    uint32_t num_heads;
    uint32_t num_kv_heads;
    uint32_t head_dim;
    uint32_t max_seq_len;
    uint32_t kv_window; /* header sliding window (positions); 0 = none */
    uint32_t kv_bits;
    uint32_t hada_n;
    uint32_t mhc_lanes;
    uint32_t engram_slots;
    uint32_t engram_sub_dim;
    uint32_t num_engram_tables;
    uint32_t engram_conv_taps;
    uint32_t engram_conv_dilation;
    uint32_t num_engram_orders;
    uint32_t engram_orders[4];
    uint32_t num_engram_sites;
    uint32_t engram_sites[4];
    float rope_theta;
    uint32_t group_size;   /* CQ group size of the file (0 if no CQ tensor) */
    int32_t has_tokenizer; /* 1 if a RAW tokenizer blob is present */
    uint32_t num_probe_heads;
    uint32_t probe_head_codes[8]; /* 1 = contrastive, 2 = confidence, 3 = router (v3) */
    /* Needle 3 (generation 3). For a Needle 2 file: generation 2, out_vocab = vocab,
     * qk_head_dim = v_head_dim = head_dim, file_layers = num_layers, the rest 0. For a
     * Needle 3 file head_dim = qk_head_dim, and num_layers, engram sites and the global
     * layers are those of the rung being run (needle_model_params.depth). kv_window is
     * the header's value; a Needle 3 session attends over its whole context unless given
     * a kv_window (which must hold sliding_window), and keeps an f32 KV cache. The logits
     * a session returns stay [vocab] wide, with -inf from out_vocab on. */
    uint32_t generation;
    uint32_t out_vocab;       /* logit rows; ids >= out_vocab are input-only (-inf logits) */
    uint32_t qk_head_dim;
    uint32_t v_head_dim;
    uint32_t sliding_window;  /* local layers attend to the last sliding_window positions */
    uint64_t global_layers;   /* bit i: layer i attends over the whole context */
    uint32_t qkv_conv_taps;   /* causal conv taps on q, k, v (0 = none) */
    uint32_t engram_seed_heads;
    uint32_t file_layers;     /* layers stored in the file */
    uint32_t engram_sites_all[16]; /* all num_engram_sites sites (engram_sites: the first 4) */
    uint64_t layers_run;      /* bit i: file layer i runs (the rung's layers; all at depth 0) */
} needle_model_info;

NEEDLE_API int needle_model_get_info(const needle_model *model, needle_model_info *out);

typedef enum needle_dtype {
    NEEDLE_DTYPE_FP16 = 1,
    NEEDLE_DTYPE_FP32 = 2,
    NEEDLE_DTYPE_CQ = 3,
    NEEDLE_DTYPE_RAW = 4
} needle_dtype;

typedef struct needle_tensor_info {
    uint32_t size; /* sizeof(needle_tensor_info), see "Struct sizes" */
    const char *name; /* positional name, e.g. "layer3.q_proj"; static storage of the model */
    int32_t dtype;    /* needle_dtype */
    uint32_t ndim;
    uint32_t shape[4];
    uint64_t offset;
    uint64_t nbytes;
    uint32_t group_size;
    uint32_t bits; /* 2, 3, 4, or 5 = ternary, 1 = binary (Needle 3); 0 for non-CQ */
} needle_tensor_info;

NEEDLE_API int needle_model_get_tensor(const needle_model *model, uint32_t index,
                                       needle_tensor_info *out);

/* Dequantizes tensor `index` to float32 in logical row-major order (CQ padding dropped).
 * `n_values` receives the element count; returns NEEDLE_ERR_BUFFER_TOO_SMALL if cap is
 * smaller (call with out = NULL, cap = 0 to query). RAW tensors are not decodable. */
NEEDLE_API int needle_model_decode_tensor(const needle_model *model, uint32_t index, float *out,
                                          size_t cap, size_t *n_values);

/* The backend the model runs on ("cpu", ...); NULL for a NULL model. Static storage. */
NEEDLE_API const char *needle_model_backend(const needle_model *model);

/* ------------------------------------------------------------------------------------ */
/* Backends and devices                                                                  */
/*
 * A backend is chosen when a model is opened, first match wins:
 *   1. needle_model_params.backend, if not NULL or "";
 *   2. env NEEDLE_BACKEND = cpu | cuda | metal;
 *   3. env JAX_PLATFORMS, a comma-separated list: its first usable entry ("gpu" means cuda;
 *      none usable is an error);
 *   4. env JAX_PLATFORM_NAME = cpu | gpu | metal ("gpu" means cuda);
 *   5. the first compiled-in backend that finds a device, CPU last.
 * A model open also fails on a malformed NEEDLE_THREADS (NEEDLE_ERR_INVALID_ARGUMENT) or an
 * unknown or unsupported NEEDLE_CPU kernel level (NEEDLE_ERR_BACKEND).
 * Only "cpu" is built in this version; cuda and metal are compiled only with
 * NEEDLE_CUDA / NEEDLE_METAL. `needle devices` prints the result. */

typedef struct needle_device_info {
    uint32_t size; /* sizeof(needle_device_info), see "Struct sizes" */
    char backend[16];      /* "cpu", "cuda", "metal" */
    char name[128];        /* CPU model name, GPU product name */
    uint64_t memory_bytes; /* physical RAM (CPU) or device memory; 0 if unknown */
    int32_t compute_units; /* online cores (CPU), SMs / GPU cores */
    char capability[32];   /* CPU kernel level ("scalar", "avx2"), compute capability */
    int32_t is_default;    /* 1 for the first device of needle_default_backend() */
} needle_device_info;

/* Devices of every compiled-in backend that finds one (>= 1: the CPU is always there). */
NEEDLE_API int needle_device_count(void);

/* Describes device `index` in [0, needle_device_count()). NEEDLE_ERR_INVALID_ARGUMENT if
 * out of range or out is NULL. */
NEEDLE_API int needle_device_get(int index, needle_device_info *out);

/* The backend a model opened with default params would use now (honours NEEDLE_BACKEND
 * and JAX_PLATFORM_NAME). If the environment forces one that is unknown, not built in or
 * without a device, returns NULL and sets needle_last_error() (the error the model open
 * would report). Static storage. */
NEEDLE_API const char *needle_default_backend(void);

/* ------------------------------------------------------------------------------------ */
/* Tokenizer (needs a model with a tokenizer blob)                                       */

enum {
    NEEDLE_TOKEN_PAD = 0,
    NEEDLE_TOKEN_EOS = 1,
    NEEDLE_TOKEN_BOS = 2,
    NEEDLE_TOKEN_UNK = 3
};

/* Encodes UTF-8 text (len bytes, need not be NUL-terminated; NUL bytes are rejected) the
 * way the reference tokenizer does. No BOS is added. `*n_ids` receives the count; if it
 * exceeds cap, returns NEEDLE_ERR_BUFFER_TOO_SMALL with `*n_ids` = the needed count. */
NEEDLE_API int needle_tokenize(const needle_model *model, const char *text, size_t len,
                               int32_t *ids, size_t cap, size_t *n_ids);

/* Decodes ids to UTF-8 (control pieces skipped, one leading space stripped, invalid bytes
 * replaced by U+FFFD), NUL-terminated. `*len` receives the byte length without the NUL;
 * needs cap >= *len + 1, else NEEDLE_ERR_BUFFER_TOO_SMALL with `*len` set. */
NEEDLE_API int needle_detokenize(const needle_model *model, const int32_t *ids, size_t n_ids,
                                 char *out, size_t cap, size_t *len);

/* The raw piece text of a token (meta-space as U+2581, not NUL-terminated). */
NEEDLE_API int needle_token_piece(const needle_model *model, int32_t id, const char **piece,
                                  size_t *len);

/* ------------------------------------------------------------------------------------ */
/* Sessions: token-level inference with a KV cache                                       */

typedef struct needle_session needle_session;

typedef enum needle_kv_type {
    NEEDLE_KV_F32 = 0,
    NEEDLE_KV_F16 = 1,
    NEEDLE_KV_INT8 = 2
} needle_kv_type;

/* Activation precision of the CQ products (see needle_session_params.activations). */
typedef enum needle_act_type {
    NEEDLE_ACT_DEFAULT = 0, /* env NEEDLE_A8, else F32 */
    NEEDLE_ACT_F32 = 1,     /* float activations: what the reference decoder computes */
    NEEDLE_ACT_A8 = 2       /* int8 activations at the four QAT points (W·A8) */
} needle_act_type;

typedef struct needle_session_params {
    uint32_t size; /* sizeof(needle_session_params), see "Struct sizes" */
    uint32_t n_ctx;     /* maximum positions in the conversation; 0 = header max_seq_len */
    int32_t kv_window;  /* sliding window; -1 = the header's kv_window, 0 = none */
    uint32_t n_sinks;   /* positions pinned as attention sinks (the first n_sinks) */
    int32_t kv_type;    /* needle_kv_type */
    /* needle_act_type: NEEDLE_ACT_A8 runs the QAT activation quantization (spec §5.3) with
     * integer CQ products; NEEDLE_ACT_DEFAULT reads env NEEDLE_A8 (1 = A8, 0 or unset =
     * F32). A8 on a backend or model that cannot run it fails with
     * NEEDLE_ERR_INVALID_ARGUMENT. */
    int32_t activations;
} needle_session_params;

NEEDLE_API needle_session_params needle_session_default_params(void);

/* Allocates every buffer the session will ever use (KV cache sized for the window plus
 * sinks, scratch activations). Later calls allocate nothing per token. */
NEEDLE_API int needle_session_create(const needle_model *model, const needle_session_params *params,
                                     needle_session **out);
NEEDLE_API void needle_session_free(needle_session *session);

/* Runs `n` tokens through the model at the current position and appends them to the
 * cache. If `logits` is non-NULL it receives [n][vocab] float32 logits, one row per
 * token (cap counts floats). The last position's logits are always available through
 * needle_session_logits(). Fails with NEEDLE_ERR_CONTEXT_FULL, leaving the session
 * unchanged, if the tokens do not fit in n_ctx. */
NEEDLE_API int needle_session_eval(needle_session *session, const int32_t *tokens, size_t n,
                                   float *logits, size_t cap);

/* Logits [vocab] after the last evaluated token; NULL before the first eval. */
NEEDLE_API const float *needle_session_logits(const needle_session *session);

/* Tokens evaluated so far (the next absolute position). */
NEEDLE_API uint32_t needle_session_position(const needle_session *session);

/* Forgets the conversation. Without tools: position 0, empty cache. After
 * needle_session_set_tools: back to the end of the tools prefix, which stays cached and
 * bound (to drop the tools, create a new session). */
NEEDLE_API void needle_session_reset(needle_session *session);

typedef struct needle_generate_params {
    uint32_t size; /* sizeof(needle_generate_params), see "Struct sizes" */
    uint32_t max_new_tokens; /* 0 = until EOS or the context is full */
    float temperature;       /* 0 = greedy (argmax, ties to the lowest id) */
    uint64_t seed;           /* sampling seed (same seed, same tokens) */
} needle_generate_params;

NEEDLE_API needle_generate_params needle_generate_default_params(void);

/* Evaluates `prompt` (may be empty when continuing), then generates until EOS (not
 * stored), max_new_tokens, or the context end. Writes up to `cap` ids to `out`;
 * `*n_out` receives the number generated. */
NEEDLE_API int needle_session_generate(needle_session *session, const int32_t *prompt,
                                       size_t n_prompt, const needle_generate_params *params,
                                       int32_t *out, size_t cap, size_t *n_out);

/* ------------------------------------------------------------------------------------ */
/* Tool calling (spec §7-8)                                                              */

/* Binds tools and system facts to the session and makes it a conversation: the tools
 * (a JSON array of {name, description, parameters}, or OpenAI-style
 * {"type":"function","function":{...}} entries) are re-serialized as the model was trained
 * (compact, key order kept), a grammar is compiled from their schemas, and the static
 * prefix (system + tools) is prefilled once; with a sliding window it is pinned as
 * attention sinks. `system` may be NULL or "". Resets the conversation. As in the official
 * engine, a single declared tool means extraction: every turn yields exactly one call of
 * it (no refusal); with several tools "[]" is the refusal.
 * Errors: NEEDLE_ERR_JSON (malformed), NEEDLE_ERR_SCHEMA (invalid or unsupported schema,
 * duplicate names), NEEDLE_ERR_NO_TOKENIZER, NEEDLE_ERR_CONTEXT_FULL (prefix too long). */
NEEDLE_API int needle_session_set_tools(needle_session *session, const char *system,
                                        const char *tools_json);

typedef enum needle_turn {
    NEEDLE_TURN_AUTO = 0,        /* a tool result after a "call" with calls, else a query */
    NEEDLE_TURN_QUERY = 1,       /* a user query */
    NEEDLE_TURN_TOOL_RESULT = 2  /* the result(s) of the calls of the previous turn */
} needle_turn;

typedef struct needle_complete_params {
    uint32_t size; /* sizeof(needle_complete_params), see "Struct sizes" */
    int32_t max_new_tokens;    /* cap on generated tokens; <= 0 means 256 */
    uint32_t max_think_tokens; /* cap on free reasoning tokens; 0 means 64 */
    float temperature;         /* 0 = greedy; sampling always stays inside the grammar */
    uint64_t seed;
    int32_t turn;              /* needle_turn */
    int32_t extract;           /* 1: exactly one call, no refusal (extraction with one tool) */
    /* A successful turn whose calls have an envelope "confidence" below this is answered
     * with "type":"low_confidence": its calls move to "suppressed_calls" and
     * "function_calls" is [] (nothing to execute). 0 (default) never suppresses. */
    float min_confidence;
    /* The repetition guard: a string value whose tail keeps repeating one piece or a
     * cycle of up to 4 pieces (24 tokens of it) is closed there and the call goes on,
     * instead of running to max_new_tokens. 0 (default): on unless the environment
     * variable NEEDLE_REPEAT_GUARD is "0"; 1: on; -1: off. */
    int32_t repeat_guard;
} needle_complete_params;

NEEDLE_API needle_complete_params needle_complete_default_params(void);

/* Runs one turn: renders `text` as a query or tool result, continues the cached
 * conversation, decodes <think>..</think> then a grammar-constrained call array, and
 * writes the response envelope (JSON, spec §8.3) to `out`. Turn-level failures (context
 * full, max_new_tokens reached, invalid text) are reported inside the envelope with
 * "success": false and an "error_code", and return NEEDLE_OK. After such a failure, and
 * after any error status, the conversation is as it was before the call. Returns
 * NEEDLE_ERR_BUFFER_TOO_SMALL if the envelope does not fit (`*len` = bytes needed without
 * the NUL), NEEDLE_ERR_STATE if no tools were set. */
NEEDLE_API int needle_session_complete(needle_session *session, const char *text,
                                       const needle_complete_params *params, char *out, size_t cap,
                                       size_t *len);

/* Tokens of the cached static prefix (0 if no tools were set). */
NEEDLE_API uint32_t needle_session_prefix_length(const needle_session *session);

/* The prompt template (README "Prompt template"; the library holds it in one place).
 * needle_render_prompt writes the text a first turn puts before the model's answer, as
 * needle_session_set_tools and needle_session_complete render it (the model also sees a
 * BOS token first): the system block when `system` is non-empty, the tools re-serialized
 * as in training, the query. needle_system_with_date writes the system facts as the
 * cactus-needle 3.x client sends them with auto_date (3.2.8's rule): `system` unchanged
 * when it already gives a date (a `date:` key, case-sensitive, not the tail of a word
 * like `update:`; or a YYYY-MM-DD stamp in any Unicode decimal digits) or is a JSON
 * object; "date: YYYY-MM-DD Ddd HH:MM" alone when it is blank; else that fact, "; " and
 * `system`. The date and time are the caller's local ones (month 1-12, years 1000-9999;
 * the English weekday is computed). Both write NUL-terminated text to out[cap] with its
 * length in *len; NEEDLE_ERR_BUFFER_TOO_SMALL (*len = bytes needed without the NUL) when
 * it does not fit; NEEDLE_ERR_JSON / NEEDLE_ERR_INVALID_ARGUMENT for bad input. */
NEEDLE_API int needle_render_prompt(const char *system, const char *tools_json,
                                    const char *query, char *out, size_t cap, size_t *len);
NEEDLE_API int needle_system_with_date(const char *system, int32_t year, int32_t month,
                                       int32_t day, int32_t hour, int32_t minute, char *out,
                                       size_t cap, size_t *len);

/* Counters for tests and benchmarks: forward passes run, tokens prefilled. */
typedef struct needle_session_stats {
    uint32_t size; /* sizeof(needle_session_stats), see "Struct sizes" */
    uint64_t tokens_evaluated; /* every token run through the model by this session */
    uint64_t prefix_evaluations; /* times the static prefix was prefilled */
    double grammar_ms;         /* time spent computing grammar masks */
    double forward_ms;         /* time spent in the forward pass */
    uint64_t decode_steps;
    /* Where forward_ms went, by operation (wall time around each backend operation). A
     * device backend queues work asynchronously: there these are queueing times and the
     * wait for the device shows up in sync_ms. */
    double embed_ms;     /* token embedding */
    double matmul_ms;    /* every CQ matrix product (projections, lane mixing, engram keys/values) */
    double engram_ms;    /* engram hashing, table gathers and the causal conv */
    double mhc_ms;       /* multi-lane hyper-connections: lane norm, read, write with Sinkhorn */
    double attention_ms; /* attention over the KV cache and the attention residual */
    double hadamard_ms;  /* the Hadamard MLP */
    double logits_ms;    /* tied output projection */
    double sync_ms;      /* waiting for the backend at the end of a forward pass */
    /* probe heads (confidence, retrieval, embeddings): the forward's cells brought to the
     * host and pooled, inside forward_ms; the head projections */
    double heads_ms;
    /* Decode shortcuts (needle_session_complete: jump-forward, sparse logits) show here. */
    uint64_t forward_calls; /* forward passes run (a chunk of any length counts once) */
    uint64_t logit_rows;    /* output-projection rows computed (vocab per full logits) */
    /* Thread hand-off (CPU): runs handed to the pool's workers, and the time they cost the
     * calling thread beyond its own share (publishing, then waiting for the workers). */
    uint64_t pool_dispatches;
    double pool_sync_ms;
    /* Decoding guards (needle_session_complete): turns the token budget ended (its verified
     * ending took over the call array, or max_new_tokens was reached), and string values
     * the repetition guard closed (needle_complete_params.repeat_guard). */
    uint64_t budget_endings;
    uint64_t repeat_guard_closes;
    /* Bytes the KV cache reserves: K and V rows (int8: with their scales) of every layer.
     * A Needle 3 local layer keeps only its sliding window's rows where the backend
     * supports it (the CPU does); other layers the session's window or whole context. */
    uint64_t kv_bytes;
} needle_session_stats;

NEEDLE_API int needle_session_get_stats(const needle_session *session, needle_session_stats *out);

/* ------------------------------------------------------------------------------------ */
/* Probe heads (spec §4): embeddings and tool retrieval.                                 */
/* Confidence needs no call: every successful envelope carries "confidence" in [0, 1], the */
/* minimum of the confidence head's sigmoid (when the model has that head) over the whole   */
/* context through the call, and the geometric mean of the model's probability of each     */
/* call token it chose (tokens the grammar forced are left out); see README "Confidence".  */

#define NEEDLE_EMBEDDING_DIM 128 /* floats in an embedding of a Needle 2 model */

/* The contrastive head's unit-length embedding of `text` ([BOS] + its tokens, alone from
 * position 0; cosine = dot product) into out[0:cap]. *n_out receives the dimension (also
 * when cap is too small: NEEDLE_ERR_BUFFER_TOO_SMALL, out may be NULL with cap 0). Runs in
 * a second KV cache owned by the session (made on first use), so the conversation is
 * untouched. NEEDLE_ERR_STATE if the model has no contrastive head. */
NEEDLE_API int needle_session_embed(needle_session *session, const char *text, float *out,
                                    size_t cap, size_t *n_out);

typedef struct needle_tools_params {
    uint32_t size; /* sizeof(needle_tools_params), see "Struct sizes" */
    /* Tool retrieval: with more tools than retrieval_threshold (default 5; UINT32_MAX =
     * never) and a model with a contrastive head, each query that starts a conversation
     * renders only the top_k (default 5) tools most similar to it, and the grammar admits
     * only those. */
    uint32_t retrieval_threshold;
    uint32_t top_k;
    /* Optional file caching the tool embeddings (format in README "Tool retrieval"):
     * read when it matches the model and tools, else (re)written. NULL: none. */
    const char *tool_index_path;
} needle_tools_params;

NEEDLE_API needle_tools_params needle_tools_default_params(void);

/* needle_session_set_tools with retrieval options (params NULL = defaults, which is what
 * needle_session_set_tools uses). */
NEEDLE_API int needle_session_set_tools_ex(needle_session *session, const char *system,
                                           const char *tools_json,
                                           const needle_tools_params *params);

/* ------------------------------------------------------------------------------------- */
/* Streaming and progress callbacks                                                      */

/* Which output a streamed piece belongs to. */
typedef enum needle_piece_kind {
    NEEDLE_PIECE_TEXT = 0,      /* needle_session_generate: the continuation */
    NEEDLE_PIECE_REASONING = 1, /* needle_session_complete: text inside <think>..</think> */
    NEEDLE_PIECE_CALLS = 2      /* needle_session_complete: the call array's JSON text */
} needle_piece_kind;

/* Called after each prefill chunk of a prompt (needle_session_set_tools' prefix, the turn
 * text of needle_session_complete, the prompt of needle_session_generate): `done` of
 * `total` tokens evaluated. Return 0 to go on, nonzero to cancel. */
typedef int (*needle_prefill_fn)(void *user, uint32_t done, uint32_t total);

/* Called for each decoded token that adds output, in order, before the next forward pass:
 * `kind` is a needle_piece_kind, `text` the bytes the token adds (`len` of them, not
 * NUL-terminated; a multi-byte character may be split across calls). Concatenated, the
 * TEXT pieces are needle_detokenize of the generated ids (when those decode to valid
 * UTF-8), the CALLS pieces the envelope's "function_calls" text, the REASONING pieces its
 * "reasoning" before the surrounding spaces and newlines are trimmed. Forced markers are
 * not reported. Return 0 to go on, nonzero to cancel. */
typedef int (*needle_token_fn)(void *user, int32_t kind, int32_t token, const char *text,
                               size_t len);

typedef struct needle_callbacks {
    uint32_t size; /* sizeof(needle_callbacks), see "Struct sizes" */
    void *user;    /* passed to both callbacks */
    needle_prefill_fn on_prefill; /* NULL = none */
    needle_token_fn on_token;     /* NULL = none */
} needle_callbacks;

/* Sets the callbacks of the session's later calls (they run on the calling thread, inside
 * the call); NULL removes them. A cancelled call returns NEEDLE_ERR_CANCELLED and leaves
 * the session usable: needle_session_complete rolls the turn back (the conversation is as
 * before the call); needle_session_generate keeps what it evaluated (the prompt chunks run
 * so far, or the prompt and the tokens before the cancelling one: *n_out counts the
 * tokens reported, that one included, as at max_new_tokens);
 * needle_session_set_tools leaves the session without tools, as any failure of it does. */
NEEDLE_API int needle_session_set_callbacks(needle_session *session,
                                            const needle_callbacks *callbacks);

/* Appends a past exchange of the conversation without decoding: `text` as a turn
 * (needle_turn, as in needle_session_complete) followed by the assistant's answer
 * `calls_json` (a JSON call array [{"name": ..., "arguments": {...}}], "[]" for none),
 * written as the model writes its answers (no reasoning). A caller that holds the
 * conversation itself (the HTTP server: every request carries the whole history) replays
 * it with this, then asks for the next answer with needle_session_complete. The calls are
 * taken as given (not checked against the tools). Errors: NEEDLE_ERR_STATE (no tools),
 * NEEDLE_ERR_JSON (calls_json), NEEDLE_ERR_INVALID_UTF8, NEEDLE_ERR_CONTEXT_FULL; after
 * any error the conversation is as it was. */
NEEDLE_API int needle_session_append_turn(needle_session *session, const char *text,
                                          int32_t turn, const char *calls_json);

/* The "validation" object of the response envelope ({"ungrounded": ["NAME.path", ...],
 * "negation": bool}; README "Validation") for the calls `calls_json` (a JSON call array)
 * against the tools `tools_json` (as needle_session_set_tools takes them), the system facts
 * and a turn's text (each may be NULL): what needle_session_complete writes into every
 * envelope, for a caller that judges calls against another input (the Python agent loop
 * checks a follow-up call against the query and the results so far). `turn`:
 * NEEDLE_TURN_QUERY looks for a negated request in `text`, any other value does not.
 * Needs no model. Writes the JSON, NUL-terminated, into out (*len: its length without the
 * NUL). Errors: NEEDLE_ERR_INVALID_ARGUMENT (out, len or calls_json NULL),
 * NEEDLE_ERR_BUFFER_TOO_SMALL (*len = the length needed), NEEDLE_ERR_OUT_OF_MEMORY. */
NEEDLE_API int needle_validate_calls(const char *tools_json, const char *system, const char *text,
                                     int32_t turn, const char *calls_json, char *out, size_t cap,
                                     size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* NEEDLE_H */
