/* SPDX-License-Identifier: MIT */
/* GGUF v3 writer (docs/model.md §2.1): metadata of every value type (incl. string and numeric arrays), a
 * tensor table, data at aligned offsets.
 *
 * Streaming by design: the writer only holds the metadata. It computes every tensor's file offset
 * up front; the caller writes the header (gguf_writer_write_header) and then the bytes of each
 * tensor at gguf_writer_tensor_file_offset() with pwrite, in any order and from any number of
 * threads, so a 20 GB model never has to be in memory. gguf_writer_finish() sets the file size.
 *
 * Tests use it to craft corrupt models: tensor types are not checked against the ggml table
 * (an unknown type gets the size the caller passes to gguf_writer_add_tensor_sized). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"
#include "gguf/gguf.h"

struct gguf_writer;

int gguf_writer_new(struct gguf_writer **ret);
void gguf_writer_free(struct gguf_writer *w);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct gguf_writer *, gguf_writer_free);

/* Data alignment (a power of two; default GGUF_DEFAULT_ALIGNMENT). Also written as
 * general.alignment (u32) when it differs from the default. Set before adding tensors. */
int gguf_writer_set_alignment(struct gguf_writer *w, uint32_t alignment);

/* Metadata, written in the order added. Keys must be unique (-EEXIST otherwise). */
int gguf_writer_add_u8(struct gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_add_i8(struct gguf_writer *w, const char *key, int8_t v);
int gguf_writer_add_u16(struct gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_add_i16(struct gguf_writer *w, const char *key, int16_t v);
int gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_add_i64(struct gguf_writer *w, const char *key, int64_t v);
int gguf_writer_add_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_add_f64(struct gguf_writer *w, const char *key, double v);
int gguf_writer_add_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_add_string(struct gguf_writer *w, const char *key, const char *v);
int gguf_writer_add_string_len(struct gguf_writer *w, const char *key, const char *v, size_t len);
/* Array of n scalars of elem_type (not STRING/ARRAY), packed little-endian as in the file. */
int gguf_writer_add_array(struct gguf_writer *w, const char *key, uint32_t elem_type,
                          const void *data, uint64_t n);
/* Array of n NUL-terminated strings. */
int gguf_writer_add_string_array(struct gguf_writer *w, const char *key, const char *const *v,
                                 uint64_t n);
/* Remove a key added earlier (tests craft files with a key missing). -ENOENT if absent. */
int gguf_writer_remove_kv(struct gguf_writer *w, const char *key);

/* Add a tensor of n_dims (1..GGUF_MAX_DIMS) with ne[] (ne0 fastest). Its size comes from the ggml
 * type table; -EINVAL for an unknown type or ragged row. Returns the tensor index (>= 0). */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const uint64_t *ne);
/* Same with the byte size given (any type id, for corrupt files). */
int gguf_writer_add_tensor_sized(struct gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const uint64_t *ne, uint64_t size);

size_t gguf_writer_tensor_count(const struct gguf_writer *w);
const char *gguf_writer_tensor_name(const struct gguf_writer *w, size_t i);
uint32_t gguf_writer_tensor_type(const struct gguf_writer *w, size_t i);
uint64_t gguf_writer_tensor_size(const struct gguf_writer *w, size_t i);
/* ne of tensor i (GGUF_MAX_DIMS values; unused dims are 1) and its n_dims. */
const uint64_t *gguf_writer_tensor_ne(const struct gguf_writer *w, size_t i, uint32_t *n_dims);

/* Layout, valid after the last kv/tensor was added. */
uint64_t gguf_writer_header_size(const struct gguf_writer *w); /* bytes before padding */
uint64_t gguf_writer_data_offset(const struct gguf_writer *w); /* file offset of the data */
uint64_t gguf_writer_tensor_file_offset(const struct gguf_writer *w, size_t i);
uint64_t gguf_writer_file_size(const struct gguf_writer *w);

/* Serialize the header (magic .. tensor infos + zero padding to the data offset) into a malloc'ed
 * buffer of gguf_writer_data_offset() bytes. */
int gguf_writer_get_header(const struct gguf_writer *w, void **ret, size_t *ret_size);
/* pwrite the header at offset 0 of fd. */
int gguf_writer_write_header(const struct gguf_writer *w, int fd);
/* ftruncate fd to the full file size (data padding and tensors never written stay zero/sparse). */
int gguf_writer_finish(const struct gguf_writer *w, int fd);

/* pwrite all of buf at offset, retrying short writes. -errno on failure. */
int gguf_pwrite_all(int fd, const void *buf, size_t size, uint64_t offset);

/* Convenience for small files (tests): create `path`, write the header, then for every tensor
 * the `size` bytes pointed to by data[i] (NULL: zeros), and finish. */
int gguf_writer_write_file(const struct gguf_writer *w, const char *path, const void *const *data);
