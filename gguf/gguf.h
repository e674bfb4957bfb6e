/* SPDX-License-Identifier: MIT */
/* GGUF reader (docs/model.md §2.1): versions 2 and 3, every metadata value type including nested arrays,
 * general.alignment, mmap'd tensor data, a tensor table with name lookup.
 *
 * Everything read from the file is checked: offsets and sizes against the file, overlapping
 * tensors, overflow in dimension products, unknown ggml types, bad UTF-8 in keys and strings,
 * absurd counts. Errors are logged (log.h) naming the key or tensor and the expectation, and
 * returned as -errno (-EBADMSG for malformed content, -EPROTONOSUPPORT for GGUF v1 / unknown
 * versions / big-endian files, -EOVERFLOW for shapes whose element count or byte size overflows,
 * -ENOMEM, or open/mmap's errno such as -ENOENT).
 *
 * Limits beyond the format: keys and tensor names are 1..65535 bytes, valid UTF-8, without NUL;
 * string values are valid UTF-8; arrays nest at most 8 levels; bools are 0 or 1; every tensor
 * dimension is >= 1 and the element count fits in 63 bits.
 *
 * The file owns all memory; pointers stay valid until gguf_close(). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

enum gguf_value_type {
        GGUF_TYPE_UINT8 = 0,
        GGUF_TYPE_INT8 = 1,
        GGUF_TYPE_UINT16 = 2,
        GGUF_TYPE_INT16 = 3,
        GGUF_TYPE_UINT32 = 4,
        GGUF_TYPE_INT32 = 5,
        GGUF_TYPE_FLOAT32 = 6,
        GGUF_TYPE_BOOL = 7,
        GGUF_TYPE_STRING = 8,
        GGUF_TYPE_ARRAY = 9,
        GGUF_TYPE_UINT64 = 10,
        GGUF_TYPE_INT64 = 11,
        GGUF_TYPE_FLOAT64 = 12,
        GGUF_TYPE_COUNT = 13,
};

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

struct gguf_string {
        const char *data; /* points into the mapping: NOT NUL-terminated */
        uint64_t len;
};

/* A metadata value. Scalars are decoded; strings point into the mapping; arrays keep their
 * element type and count and are read with gguf_array_*() (nested arrays allowed). */
struct gguf_value {
        uint32_t type; /* enum gguf_value_type */
        union {
                uint64_t u64; /* UINT8/16/32/64, BOOL (0/1) */
                int64_t i64;  /* INT8/16/32/64 */
                double f64;   /* FLOAT32/64 */
                struct gguf_string str;
                struct {
                        uint32_t elem_type;
                        uint64_t n;
                        const void *raw;    /* first element in the mapping */
                        const void *index;  /* reader-private: per-element offsets for strings/arrays */
                } arr;
        };
};

struct gguf_kv {
        const char *key; /* NUL-terminated copy, valid UTF-8 */
        struct gguf_value value;
};

struct gguf_tensor {
        const char *name; /* NUL-terminated copy */
        uint32_t type;    /* enum ggml_type */
        uint32_t n_dims;
        uint64_t ne[GGUF_MAX_DIMS]; /* unused dims are 1 */
        uint64_t n_elements;
        uint64_t offset; /* relative to the data section */
        uint64_t size;   /* bytes */
        const void *data; /* into the mapping */
};

struct gguf_file;

/* mmap the file read-only and parse/validate it. */
int gguf_open(const char *path, struct gguf_file **ret);
/* Parse a caller-owned buffer (fuzzing, tests). The buffer must outlive the handle. */
int gguf_open_buffer(const void *data, size_t size, struct gguf_file **ret);
void gguf_close(struct gguf_file *f);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct gguf_file *, gguf_close);

uint32_t gguf_version(const struct gguf_file *f);
uint64_t gguf_alignment(const struct gguf_file *f);
uint64_t gguf_data_offset(const struct gguf_file *f); /* file offset of the data section */
uint64_t gguf_file_size(const struct gguf_file *f);
const char *gguf_path(const struct gguf_file *f); /* "<buffer>" for gguf_open_buffer */
/* For a reader that keeps its own copy of some tensor data: the mapped file's whole pages within
 * [p, p + n) leave this process's memory (they are read from the file again if touched). Nothing
 * for a gguf_open_buffer handle. */
void gguf_drop_pages(const struct gguf_file *f, const void *p, size_t n);

size_t gguf_kv_count(const struct gguf_file *f);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, size_t i);
const struct gguf_kv *gguf_kv_find(const struct gguf_file *f, const char *key); /* NULL if absent */

/* Typed getters. -ENOENT if the key is absent (nothing logged, so callers decide whether that
 * is an error); -EBADMSG (logged, naming key, expected and found type) on a type mismatch;
 * -ERANGE if the value does not fit. Numeric getters accept any integer width (and, for
 * get_f64, any float or integer). */
int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *ret);
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *ret);
int gguf_get_f64(const struct gguf_file *f, const char *key, double *ret);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *ret);
int gguf_get_string(const struct gguf_file *f, const char *key, struct gguf_string *ret);
/* The value of an array key with its element type and count. */
int gguf_get_array(const struct gguf_file *f, const char *key, const struct gguf_value **ret);

/* Element access for an array value. Same conversions as the kv getters; -EBADMSG (logged) on an
 * element type mismatch, -ERANGE (logged) when i >= arr.n or the value does not fit. The
 * messages say "array element I"; callers that know the key add it. */
int gguf_array_get_u64(const struct gguf_value *arr, uint64_t i, uint64_t *ret);
int gguf_array_get_i64(const struct gguf_value *arr, uint64_t i, int64_t *ret);
int gguf_array_get_f64(const struct gguf_value *arr, uint64_t i, double *ret);
int gguf_array_get_bool(const struct gguf_value *arr, uint64_t i, bool *ret);
int gguf_array_get_string(const struct gguf_value *arr, uint64_t i, struct gguf_string *ret);
/* A nested array element, decoded into *ret. */
int gguf_array_get_array(const struct gguf_value *arr, uint64_t i, struct gguf_value *ret);

size_t gguf_tensor_count(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, size_t i);
const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name);

const char *gguf_value_type_name(uint32_t type);
/* Bytes of one element of a fixed-size value type; 0 for string, array or an unknown type. */
uint32_t gguf_value_type_size(uint32_t type);
