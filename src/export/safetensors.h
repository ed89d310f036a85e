/* A safetensors file (https://github.com/huggingface/safetensors, format: u64 header
 * length N, N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
 * then the data) read into a validated list of tensors.
 *
 * st_parse() checks everything before a tensor is touched: the header length against the
 * file, the JSON, each dtype (F32, F16 and BF16 are read; others are refused by name),
 * shape products and byte sizes against overflow, offsets inside the data section.
 * Tensor data pointers point into the caller's image (which must outlive the st_file). */
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

typedef struct st_file {
    st_tensor *tensors;
    uint32_t n;
} st_file;

/* Returns 0, or NEEDLE_ERR_FORMAT / NEEDLE_ERR_OUT_OF_MEMORY with a message. */
int st_parse(const uint8_t *image, size_t size, st_file *out);
void st_release(st_file *f);

/* The tensor called `name`, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);

/* Element i as float (exact for every dtype read). */
float st_get(const st_tensor *t, uint64_t i);

#endif
