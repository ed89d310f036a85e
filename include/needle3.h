/* libneedle3: the C ABI of the official cactus-needle 3.x engine (NEEDLE3.md §4), as its
 * Python client loads it through NEEDLE3_LIB_PATH, over one process-global Needle 3 model
 * and session guarded by a lock. A separate library from libneedle because needle_complete
 * has another signature here (3.0.x had the 2.x one); link one or the other, not both.
 *
 * Status codes are libneedle's (needle.h): negative on failure, and needle_last_error()
 * then holds a message for the calling thread. Speech (Whistle) is not supported: audio
 * arguments are rejected, and needle_models() reports text only. */
#ifndef NEEDLE3_H
#define NEEDLE3_H

#if defined(__GNUC__) || defined(__clang__)
#define NEEDLE3_API __attribute__((visibility("default")))
#else
#define NEEDLE3_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Loads a Needle 3 .cact image (generation 3 has no built-in weights, so this comes before
 * needle_init). A 64-byte aligned image is used in place and must stay valid (the Python
 * client keeps it alive); a misaligned one is copied. 0, or a negative status. */
NEEDLE3_API int needle_load(const unsigned char *cact, unsigned long long n);
/* Binds system facts and tools (a JSON array; tool_index_path may be NULL) to a fresh
 * conversation. Returns the tokens of the cached prefix (>= 0), or a negative status. */
NEEDLE3_API int needle_init(const char *system, const char *tools_json, const char *tool_index_path);
/* One turn: the envelope, NUL-terminated, into out[0:cap]. pcm must be NULL and samples 0
 * (no speech model). 0, or a negative status with the message also in `out` when it fits. */
NEEDLE3_API int needle_complete(const char *input, const float *pcm, int samples,
                                int max_new_tokens, char *out, int cap);
/* The embedding of `input` by the model's embedding head. With out NULL: its size. Else
 * out[0:cap] receives it and the size is returned. Negative status on failure. */
NEEDLE3_API int needle_embed(const char *input, const float *pcm, int samples, float *out, int cap);
/* Rewinds the conversation to the cached prefix. */
NEEDLE3_API void needle_reset(void);
/* The calling thread's last error message ("" when none). */
NEEDLE3_API const char *needle_last_error(void);
/* The models this engine runs: 1 = text (2 would add speech). */
NEEDLE3_API int needle_models(void);

#ifdef __cplusplus
}
#endif

#endif /* NEEDLE3_H */
