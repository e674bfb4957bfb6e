/* SPDX-License-Identifier: MIT */
#include "gguf/gguf_writer.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "gguf/ggml.h"

/* A metadata pair is kept serialized (key string, u32 type, value) exactly as it goes into the
 * file, so the header is a concatenation and its size is known without a second pass. */
struct writer_kv {
        char *key;
        uint8_t *bytes;
        size_t size;
};

struct writer_tensor {
        char *name;
        uint32_t type;
        uint32_t n_dims;
        uint64_t ne[GGUF_MAX_DIMS];
        uint64_t size;
        uint64_t offset; /* relative to the data section */
};

struct gguf_writer {
        uint32_t alignment;
        struct writer_kv *kvs;
        size_t n_kvs, cap_kvs;
        struct writer_tensor *tensors;
        size_t n_tensors, cap_tensors;
        uint64_t data_size; /* end of the last tensor, relative to the data section */
        uint64_t tensor_info_size;
};

/* A growable byte buffer for one value. */
struct buf {
        uint8_t *p;
        size_t n, cap;
        bool oom;
};

static void buf_put(struct buf *b, const void *data, size_t n) {
        if (b->oom)
                return;
        if (b->n + n > b->cap) {
                size_t cap = MAX(b->cap * 2, b->n + n + 64);
                uint8_t *p = realloc(b->p, cap);
                if (!p) {
                        b->oom = true;
                        return;
                }
                b->p = p;
                b->cap = cap;
        }
        memcpy(b->p + b->n, data, n);
        b->n += n;
}

/* GGUF is little-endian; so is every machine we build for (x86-64, aarch64). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF writer assumes little-endian");

static void buf_u32(struct buf *b, uint32_t v) {
        buf_put(b, &v, 4);
}
static void buf_u64(struct buf *b, uint64_t v) {
        buf_put(b, &v, 8);
}
static void buf_str(struct buf *b, const char *s, size_t len) {
        buf_u64(b, len);
        buf_put(b, s, len);
}

int gguf_writer_new(struct gguf_writer **ret) {
        struct gguf_writer *w = calloc(1, sizeof *w);

        if (!w)
                return -ENOMEM;
        w->alignment = GGUF_DEFAULT_ALIGNMENT;
        *ret = w;
        return 0;
}

void gguf_writer_free(struct gguf_writer *w) {
        if (!w)
                return;
        for (size_t i = 0; i < w->n_kvs; i++) {
                free(w->kvs[i].key);
                free(w->kvs[i].bytes);
        }
        for (size_t i = 0; i < w->n_tensors; i++)
                free(w->tensors[i].name);
        free(w->kvs);
        free(w->tensors);
        free(w);
}

static size_t kv_find(const struct gguf_writer *w, const char *key) {
        for (size_t i = 0; i < w->n_kvs; i++)
                if (streq(w->kvs[i].key, key))
                        return i;
        return SIZE_MAX;
}

/* Takes the value bytes (type + payload) and prefixes the key. */
static int kv_add(struct gguf_writer *w, const char *key, uint32_t type, struct buf *value) {
        struct buf b = {};
        size_t klen;

        if (!key || !*key) {
                free(value->p);
                return log_error_errno(EINVAL, "gguf writer: empty metadata key");
        }
        if (kv_find(w, key) != SIZE_MAX) {
                free(value->p);
                return log_error_errno(EEXIST, "gguf writer: key %s added twice", key);
        }
        if (value->oom)
                return -ENOMEM;
        klen = strlen(key);
        buf_str(&b, key, klen);
        buf_u32(&b, type);
        buf_put(&b, value->p, value->n);
        free(value->p);
        if (b.oom)
                return -ENOMEM;

        if (w->n_kvs == w->cap_kvs) {
                size_t cap = MAX(16u, w->cap_kvs * 2);
                struct writer_kv *k = realloc(w->kvs, cap * sizeof *k);
                if (!k) {
                        free(b.p);
                        return -ENOMEM;
                }
                w->kvs = k;
                w->cap_kvs = cap;
        }
        w->kvs[w->n_kvs] = (struct writer_kv){ .key = strdup(key), .bytes = b.p, .size = b.n };
        if (!w->kvs[w->n_kvs].key) {
                free(b.p);
                return -ENOMEM;
        }
        w->n_kvs++;
        return 0;
}

static int kv_add_scalar(struct gguf_writer *w, const char *key, uint32_t type, const void *v,
                         size_t n) {
        struct buf b = {};

        buf_put(&b, v, n);
        return kv_add(w, key, type, &b);
}

int gguf_writer_add_u8(struct gguf_writer *w, const char *key, uint8_t v) {
        return kv_add_scalar(w, key, GGUF_TYPE_UINT8, &v, 1);
}
int gguf_writer_add_i8(struct gguf_writer *w, const char *key, int8_t v) {
        return kv_add_scalar(w, key, GGUF_TYPE_INT8, &v, 1);
}
int gguf_writer_add_u16(struct gguf_writer *w, const char *key, uint16_t v) {
        return kv_add_scalar(w, key, GGUF_TYPE_UINT16, &v, 2);
}
int gguf_writer_add_i16(struct gguf_writer *w, const char *key, int16_t v) {
        return kv_add_scalar(w, key, GGUF_TYPE_INT16, &v, 2);
}
int gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v) {
        return kv_add_scalar(w, key, GGUF_TYPE_UINT32, &v, 4);
}
int gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v) {
        return kv_add_scalar(w, key, GGUF_TYPE_INT32, &v, 4);
}
int gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v) {
        return kv_add_scalar(w, key, GGUF_TYPE_UINT64, &v, 8);
}
int gguf_writer_add_i64(struct gguf_writer *w, const char *key, int64_t v) {
        return kv_add_scalar(w, key, GGUF_TYPE_INT64, &v, 8);
}
int gguf_writer_add_f32(struct gguf_writer *w, const char *key, float v) {
        return kv_add_scalar(w, key, GGUF_TYPE_FLOAT32, &v, 4);
}
int gguf_writer_add_f64(struct gguf_writer *w, const char *key, double v) {
        return kv_add_scalar(w, key, GGUF_TYPE_FLOAT64, &v, 8);
}
int gguf_writer_add_bool(struct gguf_writer *w, const char *key, bool v) {
        uint8_t b = v;
        return kv_add_scalar(w, key, GGUF_TYPE_BOOL, &b, 1);
}

int gguf_writer_add_string_len(struct gguf_writer *w, const char *key, const char *v, size_t len) {
        struct buf b = {};

        buf_str(&b, v, len);
        return kv_add(w, key, GGUF_TYPE_STRING, &b);
}

int gguf_writer_add_string(struct gguf_writer *w, const char *key, const char *v) {
        return gguf_writer_add_string_len(w, key, v, strlen(v));
}

int gguf_writer_add_array(struct gguf_writer *w, const char *key, uint32_t elem_type,
                          const void *data, uint64_t n) {
        size_t es = gguf_value_type_size(elem_type);
        struct buf b = {};
        uint64_t bytes;

        if (es == 0)
                return log_error_errno(EINVAL, "gguf writer: %s: array element type %u is not a scalar",
                                       key, elem_type);
        if (!mul_u64_ok(n, es, &bytes) || bytes > SIZE_MAX)
                return -EOVERFLOW;
        buf_u32(&b, elem_type);
        buf_u64(&b, n);
        buf_put(&b, data, bytes);
        return kv_add(w, key, GGUF_TYPE_ARRAY, &b);
}

int gguf_writer_add_string_array(struct gguf_writer *w, const char *key, const char *const *v,
                                 uint64_t n) {
        struct buf b = {};

        buf_u32(&b, GGUF_TYPE_STRING);
        buf_u64(&b, n);
        for (uint64_t i = 0; i < n; i++)
                buf_str(&b, v[i], strlen(v[i]));
        return kv_add(w, key, GGUF_TYPE_ARRAY, &b);
}

int gguf_writer_remove_kv(struct gguf_writer *w, const char *key) {
        size_t i = kv_find(w, key);

        if (i == SIZE_MAX)
                return -ENOENT;
        free(w->kvs[i].key);
        free(w->kvs[i].bytes);
        memmove(&w->kvs[i], &w->kvs[i + 1], (w->n_kvs - i - 1) * sizeof *w->kvs);
        w->n_kvs--;
        return 0;
}

int gguf_writer_set_alignment(struct gguf_writer *w, uint32_t alignment) {
        int r;

        if (alignment == 0 || (alignment & (alignment - 1)) != 0)
                return log_error_errno(EINVAL, "gguf writer: alignment %u is not a power of two",
                                       alignment);
        if (w->n_tensors > 0)
                return log_error_errno(EBUSY, "gguf writer: alignment must be set before tensors");
        (void) gguf_writer_remove_kv(w, "general.alignment");
        w->alignment = alignment;
        if (alignment != GGUF_DEFAULT_ALIGNMENT) {
                r = gguf_writer_add_u32(w, "general.alignment", alignment);
                if (r < 0)
                        return r;
        }
        return 0;
}

static uint64_t align_up(uint64_t x, uint64_t a) {
        return (x + a - 1) / a * a;
}

int gguf_writer_add_tensor_sized(struct gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const uint64_t *ne, uint64_t size) {
        struct writer_tensor *t;
        uint64_t offset, end;

        if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
                return log_error_errno(EINVAL, "gguf writer: tensor %s: %u dimensions, 1..%d expected",
                                       name, n_dims, GGUF_MAX_DIMS);
        if (w->n_tensors == w->cap_tensors) {
                size_t cap = MAX(64u, w->cap_tensors * 2);
                struct writer_tensor *p = realloc(w->tensors, cap * sizeof *p);
                if (!p)
                        return -ENOMEM;
                w->tensors = p;
                w->cap_tensors = cap;
        }
        offset = align_up(w->data_size, w->alignment);
        if (!add_u64_ok(offset, size, &end))
                return -EOVERFLOW;

        t = &w->tensors[w->n_tensors];
        *t = (struct writer_tensor){ .name = strdup(name), .type = type, .n_dims = n_dims,
                                     .size = size, .offset = offset };
        if (!t->name)
                return -ENOMEM;
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
                t->ne[d] = d < n_dims ? ne[d] : 1;
        w->data_size = end;
        /* name + n_dims + ne[] + type + offset */
        w->tensor_info_size += 8 + strlen(name) + 4 + 8ull * n_dims + 4 + 8;
        return (int) w->n_tensors++;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const uint64_t *ne) {
        uint64_t size, n = 1;
        int r;

        if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
                return log_error_errno(EINVAL, "gguf writer: tensor %s: %u dimensions, 1..%d expected",
                                       name, n_dims, GGUF_MAX_DIMS);
        r = ggml_row_bytes(type, ne[0], &size);
        if (r < 0)
                return log_error_errno(r, "gguf writer: tensor %s: type %s cannot hold rows of %llu values",
                                       name, ggml_type_name(type), (unsigned long long) ne[0]);
        for (uint32_t d = 1; d < n_dims; d++)
                if (!mul_u64_ok(n, ne[d], &n))
                        return -EOVERFLOW;
        if (!mul_u64_ok(size, n, &size))
                return -EOVERFLOW;
        return gguf_writer_add_tensor_sized(w, name, type, n_dims, ne, size);
}

size_t gguf_writer_tensor_count(const struct gguf_writer *w) {
        return w->n_tensors;
}
const char *gguf_writer_tensor_name(const struct gguf_writer *w, size_t i) {
        return i < w->n_tensors ? w->tensors[i].name : NULL;
}
uint32_t gguf_writer_tensor_type(const struct gguf_writer *w, size_t i) {
        return i < w->n_tensors ? w->tensors[i].type : UINT32_MAX;
}
uint64_t gguf_writer_tensor_size(const struct gguf_writer *w, size_t i) {
        return i < w->n_tensors ? w->tensors[i].size : 0;
}
const uint64_t *gguf_writer_tensor_ne(const struct gguf_writer *w, size_t i, uint32_t *n_dims) {
        if (i >= w->n_tensors)
                return NULL;
        if (n_dims)
                *n_dims = w->tensors[i].n_dims;
        return w->tensors[i].ne;
}

uint64_t gguf_writer_header_size(const struct gguf_writer *w) {
        uint64_t n = 4 + 4 + 8 + 8 + w->tensor_info_size;

        for (size_t i = 0; i < w->n_kvs; i++)
                n += w->kvs[i].size;
        return n;
}

uint64_t gguf_writer_data_offset(const struct gguf_writer *w) {
        return align_up(gguf_writer_header_size(w), w->alignment);
}

uint64_t gguf_writer_tensor_file_offset(const struct gguf_writer *w, size_t i) {
        return gguf_writer_data_offset(w) + (i < w->n_tensors ? w->tensors[i].offset : 0);
}

uint64_t gguf_writer_file_size(const struct gguf_writer *w) {
        /* The data section is padded to the alignment at the end too, as gguf-py does. */
        return gguf_writer_data_offset(w) + align_up(w->data_size, w->alignment);
}

int gguf_writer_get_header(const struct gguf_writer *w, void **ret, size_t *ret_size) {
        uint64_t data_offset = gguf_writer_data_offset(w);
        struct buf b = {};

        buf_put(&b, "GGUF", 4);
        buf_u32(&b, 3);
        buf_u64(&b, w->n_tensors);
        buf_u64(&b, w->n_kvs);
        for (size_t i = 0; i < w->n_kvs; i++)
                buf_put(&b, w->kvs[i].bytes, w->kvs[i].size);
        for (size_t i = 0; i < w->n_tensors; i++) {
                const struct writer_tensor *t = &w->tensors[i];
                buf_str(&b, t->name, strlen(t->name));
                buf_u32(&b, t->n_dims);
                for (uint32_t d = 0; d < t->n_dims; d++)
                        buf_u64(&b, t->ne[d]);
                buf_u32(&b, t->type);
                buf_u64(&b, t->offset);
        }
        while (!b.oom && b.n < data_offset) {
                static const uint8_t zeros[64];
                buf_put(&b, zeros, MIN(sizeof zeros, data_offset - b.n));
        }
        if (b.oom) {
                free(b.p);
                return -ENOMEM;
        }
        assert(b.n == data_offset);
        *ret = b.p;
        *ret_size = b.n;
        return 0;
}

int gguf_pwrite_all(int fd, const void *buf, size_t size, uint64_t offset) {
        const uint8_t *p = buf;

        while (size > 0) {
                ssize_t n = pwrite(fd, p, size, (off_t) offset);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        return -EIO;
                p += n;
                size -= (size_t) n;
                offset += (uint64_t) n;
        }
        return 0;
}

int gguf_writer_write_header(const struct gguf_writer *w, int fd) {
        _cleanup_free_ void *hdr = NULL;
        size_t size;
        int r;

        r = gguf_writer_get_header(w, &hdr, &size);
        if (r < 0)
                return r;
        r = gguf_pwrite_all(fd, hdr, size, 0);
        if (r < 0)
                return log_error_errno(r, "gguf writer: writing the header (%zu bytes): %s", size,
                                       strerror(-r));
        return 0;
}

int gguf_writer_finish(const struct gguf_writer *w, int fd) {
        uint64_t size = gguf_writer_file_size(w);

        if (ftruncate(fd, (off_t) size) < 0)
                return log_error_errno(errno, "gguf writer: setting the file size to %llu bytes: %m",
                                       (unsigned long long) size);
        return 0;
}

int gguf_writer_write_file(const struct gguf_writer *w, const char *path, const void *const *data) {
        _cleanup_close_ int fd = -1;
        int r;

        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
                return log_error_errno(errno, "%s: cannot create: %m", path);
        r = gguf_writer_write_header(w, fd);
        if (r < 0)
                return r;
        for (size_t i = 0; data && i < w->n_tensors; i++) {
                if (!data[i])
                        continue;
                r = gguf_pwrite_all(fd, data[i], w->tensors[i].size,
                                    gguf_writer_tensor_file_offset(w, i));
                if (r < 0)
                        return log_error_errno(r, "%s: writing tensor %s: %s", path,
                                               w->tensors[i].name, strerror(-r));
        }
        r = gguf_writer_finish(w, fd);
        if (r < 0)
                return r;
        return 0;
}
