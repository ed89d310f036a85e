/* Re-serializes JSON text the way the Needle 2 fine-tuning data was written.
 *
 * cactus-needle 2.0.15 (finetune.render_example) renders tools and answers with Python's
 * json.dumps(obj, separators=(",", ":"), ensure_ascii=False) after json.loads: compact,
 * key order kept, non-ASCII characters left as UTF-8, control characters escaped, integers
 * kept as written, other numbers in Python's shortest float repr ("1.0", "1e-05",
 * "1.5e+16"). grammar_json_canon() reproduces that byte for byte so the prompt matches what the
 * model saw in training, whatever spacing or escaping the caller used. Duplicate object
 * keys are rejected (Python would silently keep the last value). */
#ifndef NEEDLE_GRAMMAR_JSON_CANON_H
#define NEEDLE_GRAMMAR_JSON_CANON_H

#include <stddef.h>

/* On success returns NEEDLE_OK and a malloc'd NUL-terminated string in *out (length in
 * *out_len). Malformed JSON or invalid UTF-8 -> NEEDLE_ERR_JSON with the byte offset. */
int grammar_json_canon(const char *text, size_t len, char **out, size_t *out_len);

/* Appends Python's repr() of a finite double (shortest round-trip) to buf; returns the
 * length written (buf needs 32 bytes). */
size_t gram_python_float(double v, char *buf);

#endif
