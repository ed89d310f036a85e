/* A safetensors file (https://github.com/huggingface/safetensors, format: u64 header
 * length N, N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
 * then the data) read into a validated list of tensors.
 *
 * st_parse() checks everything before a tensor is touched: the header length against the
 * file, the JSON, each dtype (F32, F16 and BF16 are read; others are refused by name),
 * shape products and byte sizes against overflow, offsets inside the data section, and
 * `__metadata__` (a JSON object of string values, as the format defines it, no key twice).
 * Tensor data pointers point into the caller's image (which must outlive the st_file).
 *
 * st_writer writes one: F32 / F16 / BF16 tensors from float arrays, string metadata. The
 * layout is the one huggingface's safetensors writes (and so reads without complaint):
 * `__metadata__` first, tensors in data order, the data packed without gaps, widest
 * dtype first so every tensor starts on a multiple of its element size, the header
 * padded with spaces to a multiple of 8 bytes. The file appears whole or not at all: it
 * is written to a temporary name beside PATH and renamed over PATH only after every byte
 * reached the file system (a full disk or an I/O error leaves PATH untouched). */
#ifndef NEEDLE_EXPORT_SAFETENSORS_H
#define NEEDLE_EXPORT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

typedef enum st_dtype { ST_F32 = 1, ST_F16, ST_BF16 } st_dtype;

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    uint32_t ndim;
    uint64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    const uint8_t *data; /* numel elements, little-endian */
} st_tensor;

typedef struct st_meta {
    char *key;
    char *value; /* NUL-terminated (a value holding NUL is refused) */
} st_meta;

typedef struct st_file {
    st_tensor *tensors;
    uint32_t n;
    st_meta *meta; /* the `__metadata__` entries, in file order */
    uint32_t n_meta;
} st_file;

/* Returns 0, or NEEDLE_ERR_FORMAT / NEEDLE_ERR_OUT_OF_MEMORY with a message. */
int st_parse(const uint8_t *image, size_t size, st_file *out);
void st_release(st_file *f);

/* The tensor called `name`, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);

/* Element i as float (exact for every dtype read). */
float st_get(const st_tensor *t, uint64_t i);

/* The metadata value of `key`, or NULL when the file has none. */
const char *st_meta_get(const st_file *f, const char *key);

/* ---- writing ------------------------------------------------------------------------ */

typedef struct st_wtensor {
    char *name;
    st_dtype dtype; /* as stored; the source is always float */
    uint32_t ndim;
    uint64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    const float *data; /* borrowed until st_writer_write returns */
} st_wtensor;

typedef struct st_writer {
    st_wtensor *tensors;
    uint32_t n, cap;
    st_meta *meta;
    uint32_t n_meta, cap_meta;
} st_writer;

void st_writer_init(st_writer *w);
void st_writer_release(st_writer *w);

/* Adds tensor `name` (copied) of `ndim` dims (0: a scalar) from `data` (numel floats,
 * borrowed: it must stay valid until st_writer_write), stored as `dtype` (F16 and BF16 by
 * round-to-nearest-even). A name used twice, an empty one or "__metadata__" is
 * NEEDLE_ERR_INVALID_ARGUMENT. */
int st_writer_add(st_writer *w, const char *name, st_dtype dtype, uint32_t ndim, const uint64_t *shape,
                  const float *data);

/* Sets metadata `key` to `value` (both copied; a second call for a key replaces it). */
int st_writer_meta(st_writer *w, const char *key, const char *value);

/* Writes the file (atomically, see above). NEEDLE_ERR_IO with the system's reason. */
int st_writer_write(const st_writer *w, const char *path);

#endif
