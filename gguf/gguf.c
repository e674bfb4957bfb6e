/* SPDX-License-Identifier: MIT */
/* GGUF reader (docs/model.md §2.1). One pass over the header, the metadata and the tensor table, checking
 * every length and count against the bytes that are left before touching memory, then a check of
 * the data section (bounds, alignment, overlaps).
 *
 * Memory: the file (or caller buffer) is never copied. Keys and tensor names are copied once into
 * an arena (NUL-terminated); arrays of strings / arrays get one offset index each, also from the
 * arena, so a 131072-token vocabulary is one 1 MiB allocation, not 131072. The kv and tensor
 * tables grow by doubling as entries are actually parsed, so a corrupt count cannot make us
 * allocate more than the file can describe. Name lookups go through open-addressing hash tables. */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "gguf/ggml.h"

/* The GGUF format caps key length at 65535 bytes; we hold tensor names to the same bound. */
#define GGUF_MAX_NAME_LEN 65535u
/* Arrays of arrays of ...: deeper than this is refused (no real file nests more than 2). */
#define GGUF_MAX_ARRAY_DEPTH 8
#define GGUF_MAX_ALIGNMENT (UINT64_C(1) << 20)
#define GGUF_HEADER_SIZE 24u /* magic, u32 version, u64 tensor count, u64 kv count */
/* Smallest encodings, used to refuse counts that cannot fit in the bytes left: a kv is a key
 * length (8) + >= 1 key byte + value type (4) + >= 1 value byte; a tensor info is a name length (8)
 * + >= 1 name byte + n_dims (4) + >= 1 dim (8) + type (4) + offset (8). */
#define GGUF_MIN_KV_SIZE 14u
#define GGUF_MIN_TENSOR_INFO_SIZE 33u
#define GGUF_MIN_STRING_SIZE 8u
#define GGUF_MIN_ARRAY_SIZE 12u

/* ---- a bump arena for names and array indices, freed with the file ---- */

struct arena_block {
        struct arena_block *next;
        size_t used, cap;
        max_align_t data[];
};

struct arena {
        struct arena_block *head;
};

static void *arena_alloc(struct arena *a, size_t size) {
        size_t need = (size + 15) & ~(size_t) 15;
        struct arena_block *b = a->head;

        if (need < size)
                return NULL;
        if (!b || b->cap - b->used < need) {
                size_t cap = MAX(need, (size_t) 64 * 1024);
                b = malloc(sizeof(struct arena_block) + cap);
                if (!b)
                        return NULL;
                b->used = 0;
                b->cap = cap;
                /* a big one-off request gets its own block behind the current one, so the
                 * current block's free space is not wasted */
                if (a->head && need > (size_t) 64 * 1024) {
                        b->next = a->head->next;
                        a->head->next = b;
                } else {
                        b->next = a->head;
                        a->head = b;
                }
        }
        void *p = (char *) b->data + b->used;
        b->used += need;
        return p;
}

static void arena_free(struct arena *a) {
        while (a->head) {
                struct arena_block *n = a->head->next;
                free(a->head);
                a->head = n;
        }
}

/* ---- the file ---- */

struct name_table {
        uint32_t *slots; /* entry index + 1; 0 = empty */
        size_t mask;
};

struct gguf_file {
        char *path;
        const uint8_t *base;
        uint64_t size;
        void *map;
        size_t map_size;

        uint32_t version;
        uint64_t alignment;
        uint64_t data_offset;

        struct gguf_kv *kvs;
        size_t n_kv, cap_kv;
        struct gguf_tensor *tensors;
        size_t n_tensors, cap_tensors;

        struct name_table kv_names, tensor_names;
        struct arena arena;
};

static inline uint16_t rd16(const uint8_t *p) {
        return (uint16_t) (p[0] | (uint16_t) p[1] << 8);
}
static inline uint32_t rd32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
               (uint32_t) p[3] << 24;
}
static inline uint64_t rd64(const uint8_t *p) {
        return (uint64_t) rd32(p) | (uint64_t) rd32(p + 4) << 32;
}

static uint64_t fnv1a(const char *s) {
        uint64_t h = UINT64_C(0xcbf29ce484222325);
        for (; *s; s++) {
                h ^= (uint8_t) *s;
                h *= UINT64_C(0x100000001b3);
        }
        return h;
}

static const char *const value_type_names[GGUF_TYPE_COUNT] = {
        [GGUF_TYPE_UINT8] = "uint8",     [GGUF_TYPE_INT8] = "int8",
        [GGUF_TYPE_UINT16] = "uint16",   [GGUF_TYPE_INT16] = "int16",
        [GGUF_TYPE_UINT32] = "uint32",   [GGUF_TYPE_INT32] = "int32",
        [GGUF_TYPE_FLOAT32] = "float32", [GGUF_TYPE_BOOL] = "bool",
        [GGUF_TYPE_STRING] = "string",   [GGUF_TYPE_ARRAY] = "array",
        [GGUF_TYPE_UINT64] = "uint64",   [GGUF_TYPE_INT64] = "int64",
        [GGUF_TYPE_FLOAT64] = "float64",
};

const char *gguf_value_type_name(uint32_t type) {
        static _Thread_local char buf[32];

        if (type < GGUF_TYPE_COUNT)
                return value_type_names[type];
        snprintf(buf, sizeof buf, "type#%" PRIu32, type);
        return buf;
}

uint32_t gguf_value_type_size(uint32_t type) {
        switch (type) {
        case GGUF_TYPE_UINT8:
        case GGUF_TYPE_INT8:
        case GGUF_TYPE_BOOL:
                return 1;
        case GGUF_TYPE_UINT16:
        case GGUF_TYPE_INT16:
                return 2;
        case GGUF_TYPE_UINT32:
        case GGUF_TYPE_INT32:
        case GGUF_TYPE_FLOAT32:
                return 4;
        case GGUF_TYPE_UINT64:
        case GGUF_TYPE_INT64:
        case GGUF_TYPE_FLOAT64:
                return 8;
        default:
                return 0;
        }
}

static bool type_is_unsigned(uint32_t t) {
        return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
               t == GGUF_TYPE_UINT64;
}
static bool type_is_signed(uint32_t t) {
        return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
               t == GGUF_TYPE_INT64;
}
static bool type_is_float(uint32_t t) {
        return t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64;
}

/* Decodes a fixed-size scalar at p into v (v->type already set). */
static void decode_scalar(uint32_t type, const uint8_t *p, struct gguf_value *v) {
        union {
                uint32_t u;
                float f;
        } f32;
        union {
                uint64_t u;
                double f;
        } f64;

        switch (type) {
        case GGUF_TYPE_UINT8:
        case GGUF_TYPE_BOOL:
                v->u64 = p[0];
                break;
        case GGUF_TYPE_INT8:
                v->i64 = (int8_t) p[0];
                break;
        case GGUF_TYPE_UINT16:
                v->u64 = rd16(p);
                break;
        case GGUF_TYPE_INT16:
                v->i64 = (int16_t) rd16(p);
                break;
        case GGUF_TYPE_UINT32:
                v->u64 = rd32(p);
                break;
        case GGUF_TYPE_INT32:
                v->i64 = (int32_t) rd32(p);
                break;
        case GGUF_TYPE_UINT64:
                v->u64 = rd64(p);
                break;
        case GGUF_TYPE_INT64:
                v->i64 = (int64_t) rd64(p);
                break;
        case GGUF_TYPE_FLOAT32:
                f32.u = rd32(p);
                v->f64 = f32.f;
                break;
        case GGUF_TYPE_FLOAT64:
                f64.u = rd64(p);
                v->f64 = f64.f;
                break;
        default:
                break;
        }
}

/* RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
static bool utf8_valid(const uint8_t *s, uint64_t n, uint64_t *bad_at) {
        uint64_t i = 0;

        while (i < n) {
                uint8_t c = s[i];
                uint32_t len, cp;

                /* ASCII runs 8 bytes at a time: the bulk of a vocabulary and a chat template */
                if (c < 0x80 && n - i >= 8) {
                        uint64_t w;
                        memcpy(&w, s + i, 8);
                        if ((w & UINT64_C(0x8080808080808080)) == 0) {
                                i += 8;
                                continue;
                        }
                }
                if (c < 0x80) {
                        i++;
                        continue;
                }
                if (c >= 0xc2 && c <= 0xdf) {
                        len = 2;
                        cp = c & 0x1f;
                } else if (c >= 0xe0 && c <= 0xef) {
                        len = 3;
                        cp = c & 0x0f;
                } else if (c >= 0xf0 && c <= 0xf4) {
                        len = 4;
                        cp = c & 0x07;
                } else
                        goto bad;
                if (n - i < len)
                        goto bad;
                for (uint32_t k = 1; k < len; k++) {
                        if ((s[i + k] & 0xc0) != 0x80)
                                goto bad;
                        cp = cp << 6 | (s[i + k] & 0x3f);
                }
                if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
                    (cp >= 0xd800 && cp <= 0xdfff))
                        goto bad;
                i += len;
        }
        return true;
bad:
        *bad_at = i;
        return false;
}

/* ---- parser ---- */

struct parser {
        struct gguf_file *f;
        uint64_t pos;
};

/* Where in the metadata we are, for messages: "key 'a.b'[3][7]". */
struct where {
        const char *key;
        unsigned depth;
        uint64_t idx[GGUF_MAX_ARRAY_DEPTH + 1];
};

static const char *where_str(const struct where *w, char *buf, size_t size) {
        int n = snprintf(buf, size, "key '%s'", w->key);
        for (unsigned d = 0; d < w->depth && n >= 0 && (size_t) n < size; d++)
                n += snprintf(buf + n, size - n, "[%" PRIu64 "]", w->idx[d]);
        return buf;
}

static uint64_t left(const struct parser *p) {
        return p->f->size - p->pos;
}

static int truncated(const struct parser *p, const char *what, uint64_t need) {
        return log_error_errno(EBADMSG,
                               "%s: truncated: %s at offset %" PRIu64 " needs %" PRIu64
                               " bytes, only %" PRIu64 " left in the file (size %" PRIu64 ")",
                               p->f->path, what, p->pos, need, left(p), p->f->size);
}

enum string_status {
        STRING_OK,
        STRING_TRUNCATED_LENGTH,
        STRING_PAST_END,
        STRING_EMPTY_NAME,
        STRING_NAME_TOO_LONG,
        STRING_NUL_IN_NAME,
        STRING_BAD_UTF8,
};

/* Checks the string at p->pos (u64 length + bytes) without logging or moving: the success path
 * stays free of message formatting, which matters for 131072-token vocabularies. */
static enum string_status string_check(const struct parser *p, bool is_name, uint64_t *len,
                                       uint64_t *bad_at) {
        const uint8_t *s;

        if (left(p) < 8)
                return STRING_TRUNCATED_LENGTH;
        *len = rd64(p->f->base + p->pos);
        if (*len > left(p) - 8)
                return STRING_PAST_END;
        s = p->f->base + p->pos + 8;
        if (is_name) {
                if (*len == 0)
                        return STRING_EMPTY_NAME;
                if (*len > GGUF_MAX_NAME_LEN)
                        return STRING_NAME_TOO_LONG;
                if (memchr(s, 0, *len))
                        return STRING_NUL_IN_NAME;
        }
        if (!utf8_valid(s, *len, bad_at))
                return STRING_BAD_UTF8;
        return STRING_OK;
}

static int string_error(const struct parser *p, enum string_status st, const char *what,
                        uint64_t len, uint64_t bad_at) {
        const char *path = p->f->path;

        switch (st) {
        case STRING_TRUNCATED_LENGTH:
                return truncated(p, what, 8);
        case STRING_PAST_END:
                return log_error_errno(EBADMSG,
                                       "%s: %s: string length %" PRIu64 " at offset %" PRIu64
                                       " extends past the end of the file (%" PRIu64
                                       " bytes left, file size %" PRIu64 ")",
                                       path, what, len, p->pos, left(p) - 8, p->f->size);
        case STRING_EMPTY_NAME:
                return log_error_errno(EBADMSG,
                                       "%s: %s at offset %" PRIu64
                                       " is empty (a non-empty name expected)",
                                       path, what, p->pos);
        case STRING_NAME_TOO_LONG:
                return log_error_errno(EBADMSG,
                                       "%s: %s at offset %" PRIu64 " is %" PRIu64
                                       " bytes long (at most %u expected)",
                                       path, what, p->pos, len, GGUF_MAX_NAME_LEN);
        case STRING_NUL_IN_NAME:
                return log_error_errno(EBADMSG,
                                       "%s: %s at offset %" PRIu64
                                       " contains a NUL byte (a name expected)",
                                       path, what, p->pos);
        case STRING_BAD_UTF8:
                return log_error_errno(EBADMSG,
                                       "%s: %s at offset %" PRIu64
                                       ": invalid UTF-8 at byte %" PRIu64 " (0x%02x) of %" PRIu64,
                                       path, what, p->pos, bad_at,
                                       p->f->base[p->pos + 8 + bad_at], len);
        case STRING_OK:
                break;
        }
        return log_error_errno(EINVAL, "%s: %s: internal error checking a string", path, what);
}

/* Reads a u64-length string at p->pos into *ret and moves past it. On error, logs a message
 * naming the string: the printf-style arguments describe it and are only formatted then. */
#define read_string(p, is_name, ret, ...)                                                                  ({                                                                                                         uint64_t _len = 0, _bad = 0;                                                                       enum string_status _st = string_check((p), (is_name), &_len, &_bad);                               int _r = 0;                                                                                        if (_unlikely_(_st != STRING_OK)) {                                                                        char _what[512];                                                                                   snprintf(_what, sizeof _what, __VA_ARGS__);                                                        _r = string_error((p), _st, _what, _len, _bad);                                            } else {                                                                                                   (ret)->data = (const char *) (p)->f->base + (p)->pos + 8;                                          (ret)->len = _len;                                                                                 (p)->pos += 8 + _len;                                                                      }                                                                                                  _r;                                                                                        })

static int parse_array(struct parser *p, struct where *w, struct gguf_value *v);
static const struct gguf_value *find_value(const struct gguf_file *f, const char *key);
static int value_integer(const struct gguf_value *v, bool *neg, uint64_t *u);

/* Parses one value of `type` (not ARRAY's own tag: that is already consumed) into v. */
static int parse_value(struct parser *p, struct where *w, uint32_t type, struct gguf_value *v) {
        char wb[384], what[448];
        uint32_t sz;

        v->type = type;
        if (type == GGUF_TYPE_STRING) {
                return read_string(p, false, &v->str, "string value of %s",
                                   where_str(w, wb, sizeof wb));
        }
        if (type == GGUF_TYPE_ARRAY)
                return parse_array(p, w, v);

        sz = gguf_value_type_size(type);
        if (sz == 0)
                return log_error_errno(EBADMSG,
                                       "%s: %s: invalid value type %" PRIu32
                                       " at offset %" PRIu64 " (0..12 expected)",
                                       p->f->path, where_str(w, wb, sizeof wb), type, p->pos);
        if (left(p) < sz) {
                snprintf(what, sizeof what, "%s value of %s", value_type_names[type],
                         where_str(w, wb, sizeof wb));
                return truncated(p, what, sz);
        }
        decode_scalar(type, p->f->base + p->pos, v);
        if (type == GGUF_TYPE_BOOL && v->u64 > 1)
                return log_error_errno(EBADMSG,
                                       "%s: %s: bool value %" PRIu64 " at offset %" PRIu64
                                       " (0 or 1 expected)",
                                       p->f->path, where_str(w, wb, sizeof wb), v->u64, p->pos);
        p->pos += sz;
        return 0;
}

/* An array body: u32 element type, u64 count, elements. */
static int parse_array(struct parser *p, struct where *w, struct gguf_value *v) {
        char wb[384], what[448];
        uint32_t et, sz;
        uint64_t n, bytes, min;
        int r;

        v->type = GGUF_TYPE_ARRAY;
        if (w->depth >= GGUF_MAX_ARRAY_DEPTH)
                return log_error_errno(EBADMSG,
                                       "%s: %s: arrays nested deeper than %d levels at offset "
                                       "%" PRIu64,
                                       p->f->path, where_str(w, wb, sizeof wb),
                                       GGUF_MAX_ARRAY_DEPTH, p->pos);
        if (left(p) < 12) {
                snprintf(what, sizeof what, "array header of %s", where_str(w, wb, sizeof wb));
                return truncated(p, what, 12);
        }
        et = rd32(p->f->base + p->pos);
        n = rd64(p->f->base + p->pos + 4);
        if (et >= GGUF_TYPE_COUNT)
                return log_error_errno(EBADMSG,
                                       "%s: %s: invalid array element type %" PRIu32
                                       " at offset %" PRIu64 " (0..12 expected)",
                                       p->f->path, where_str(w, wb, sizeof wb), et, p->pos);
        p->pos += 12;
        v->arr.elem_type = et;
        v->arr.n = n;
        v->arr.raw = p->f->base + p->pos;
        v->arr.index = NULL;

        sz = gguf_value_type_size(et);
        min = sz ? sz : et == GGUF_TYPE_STRING ? GGUF_MIN_STRING_SIZE : GGUF_MIN_ARRAY_SIZE;
        if (!mul_u64_ok(n, min, &bytes) || bytes > left(p))
                return log_error_errno(EBADMSG,
                                       "%s: %s: array of %" PRIu64 " %s elements at offset %" PRIu64
                                       " cannot fit in the %" PRIu64 " bytes left in the file",
                                       p->f->path, where_str(w, wb, sizeof wb), n,
                                       value_type_names[et], p->pos - 12, left(p));
        if (sz) {
                if (et == GGUF_TYPE_BOOL) {
                        const uint8_t *b = p->f->base + p->pos;
                        for (uint64_t i = 0; i < n; i++)
                                if (b[i] > 1) {
                                        w->idx[w->depth] = i;
                                        w->depth++;
                                        where_str(w, wb, sizeof wb);
                                        w->depth--;
                                        return log_error_errno(
                                                EBADMSG,
                                                "%s: %s: bool value %u at offset %" PRIu64
                                                " (0 or 1 expected)",
                                                p->f->path, wb, b[i], p->pos + i);
                                }
                }
                p->pos += bytes;
                return 0;
        }
        if (n == 0)
                return 0;

        w->depth++;
        if (et == GGUF_TYPE_STRING) {
                /* one pointer per element, to its length field: n * 8 <= bytes left */
                const uint8_t **index = arena_alloc(&p->f->arena, n * sizeof(*index));
                if (!index)
                        return log_error_errno(ENOMEM, "%s: out of memory indexing %s",
                                               p->f->path, where_str(w, wb, sizeof wb));
                for (uint64_t i = 0; i < n; i++) {
                        struct gguf_string str = { 0 };
                        w->idx[w->depth - 1] = i;
                        index[i] = p->f->base + p->pos;
                        r = read_string(p, false, &str, "string %s", where_str(w, wb, sizeof wb));
                        if (r < 0)
                                return r;
                }
                v->arr.index = index;
        } else {
                /* arrays of arrays: each element decoded once, n * 40 <= 3.4 * bytes left */
                struct gguf_value *index = arena_alloc(&p->f->arena, n * sizeof(*index));
                if (!index)
                        return log_error_errno(ENOMEM, "%s: out of memory indexing %s",
                                               p->f->path, where_str(w, wb, sizeof wb));
                for (uint64_t i = 0; i < n; i++) {
                        w->idx[w->depth - 1] = i;
                        r = parse_array(p, w, &index[i]);
                        if (r < 0)
                                return r;
                }
                v->arr.index = index;
        }
        w->depth--;
        return 0;
}

static int name_table_build(struct name_table *t, size_t n, const char *(*name_of)(void *, size_t),
                            void *userdata, size_t *dup_a, size_t *dup_b) {
        size_t size = 16;

        while (size < n * 2)
                size <<= 1;
        t->slots = calloc(size, sizeof(uint32_t));
        if (!t->slots)
                return -ENOMEM;
        t->mask = size - 1;
        for (size_t i = 0; i < n; i++) {
                const char *name = name_of(userdata, i);
                size_t h = fnv1a(name) & t->mask;
                while (t->slots[h]) {
                        if (streq(name_of(userdata, t->slots[h] - 1), name)) {
                                *dup_a = t->slots[h] - 1;
                                *dup_b = i;
                                return -EEXIST;
                        }
                        h = (h + 1) & t->mask;
                }
                t->slots[h] = (uint32_t) (i + 1);
        }
        return 0;
}

static ssize_t name_table_find(const struct name_table *t, const char *name,
                               const char *(*name_of)(void *, size_t), void *userdata) {
        size_t h;

        if (!t->slots || !name)
                return -1;
        h = fnv1a(name) & t->mask;
        while (t->slots[h]) {
                if (streq(name_of(userdata, t->slots[h] - 1), name))
                        return t->slots[h] - 1;
                h = (h + 1) & t->mask;
        }
        return -1;
}

static const char *kv_name_of(void *userdata, size_t i) {
        return ((struct gguf_file *) userdata)->kvs[i].key;
}
static const char *tensor_name_of(void *userdata, size_t i) {
        return ((struct gguf_file *) userdata)->tensors[i].name;
}

static char *copy_name(struct gguf_file *f, const struct gguf_string *s) {
        char *c = arena_alloc(&f->arena, s->len + 1);
        if (!c)
                return NULL;
        memcpy(c, s->data, s->len);
        c[s->len] = 0;
        return c;
}

static int grow(void **array, size_t *cap, size_t n, size_t elem) {
        if (n < *cap)
                return 0;
        size_t ncap = *cap ? *cap * 2 : 64;
        void *a = reallocarray(*array, ncap, elem);
        if (!a)
                return -ENOMEM;
        *array = a;
        *cap = ncap;
        return 0;
}

static int parse_header(struct parser *p, uint64_t *n_tensors, uint64_t *n_kv) {
        struct gguf_file *f = p->f;
        const uint8_t *b = f->base;
        uint32_t version;

        if (f->size < 4)
                return log_error_errno(EBADMSG,
                                       "%s: file is %" PRIu64
                                       " bytes, too short for a GGUF header (%u bytes)",
                                       f->path, f->size, GGUF_HEADER_SIZE);
        if (memcmp(b, "GGUF", 4) != 0)
                return log_error_errno(EBADMSG,
                                       "%s: not a GGUF file: magic %02x %02x %02x %02x "
                                       "(47 47 55 46 \"GGUF\" expected)",
                                       f->path, b[0], b[1], b[2], b[3]);
        if (f->size < GGUF_HEADER_SIZE)
                return log_error_errno(EBADMSG,
                                       "%s: file is %" PRIu64
                                       " bytes, too short for a GGUF header (%u bytes)",
                                       f->path, f->size, GGUF_HEADER_SIZE);
        version = rd32(b + 4);
        if (version == 1)
                return log_error_errno(EPROTONOSUPPORT,
                                       "%s: GGUF version 1 is not supported (version 2 or 3 "
                                       "expected; re-convert the model with a current converter)",
                                       f->path);
        if (version != 2 && version != 3) {
                if ((version & 0xffff) == 0 && __builtin_bswap32(version) <= 3)
                        return log_error_errno(EPROTONOSUPPORT,
                                               "%s: big-endian GGUF (version field %08" PRIx32
                                               ") is not supported (little-endian expected)",
                                               f->path, version);
                return log_error_errno(EPROTONOSUPPORT,
                                       "%s: GGUF version %" PRIu32
                                       " is not supported (version 2 or 3 expected)",
                                       f->path, version);
        }
        f->version = version;
        *n_tensors = rd64(b + 8);
        *n_kv = rd64(b + 16);
        p->pos = GGUF_HEADER_SIZE;

        /* Fail fast on counts the file cannot hold, before allocating anything. */
        if (*n_kv > left(p) / GGUF_MIN_KV_SIZE)
                return log_error_errno(EBADMSG,
                                       "%s: kv count %" PRIu64 " cannot fit in the %" PRIu64
                                       " bytes left in the file (each kv needs at least %u)",
                                       f->path, *n_kv, left(p), GGUF_MIN_KV_SIZE);
        if (*n_tensors > left(p) / GGUF_MIN_TENSOR_INFO_SIZE)
                return log_error_errno(EBADMSG,
                                       "%s: tensor count %" PRIu64 " cannot fit in the %" PRIu64
                                       " bytes left in the file (each tensor needs at least %u)",
                                       f->path, *n_tensors, left(p), GGUF_MIN_TENSOR_INFO_SIZE);
        if (*n_kv > UINT32_MAX - 1 || *n_tensors > UINT32_MAX - 1)
                return log_error_errno(EBADMSG, "%s: kv count %" PRIu64 " / tensor count %" PRIu64
                                                " too large (at most 2^32-2 supported)",
                                       f->path, *n_kv, *n_tensors);
        return 0;
}

static int parse_kvs(struct parser *p, uint64_t n_kv) {
        struct gguf_file *f = p->f;
        char what[96];
        int r;

        for (uint64_t i = 0; i < n_kv; i++) {
                struct gguf_string key = { 0 };
                struct gguf_kv *kv;
                struct where w = { 0 };
                uint32_t type;

                r = read_string(p, true, &key, "key #%" PRIu64, i);
                if (r < 0)
                        return r;
                if (grow((void **) &f->kvs, &f->cap_kv, f->n_kv, sizeof(*f->kvs)) < 0)
                        return log_error_errno(ENOMEM, "%s: out of memory reading key #%" PRIu64,
                                               f->path, i);
                kv = &f->kvs[f->n_kv];
                memset(kv, 0, sizeof(*kv));
                kv->key = copy_name(f, &key);
                if (!kv->key)
                        return log_error_errno(ENOMEM, "%s: out of memory reading key #%" PRIu64,
                                               f->path, i);
                f->n_kv++;
                w.key = kv->key;
                if (left(p) < 4) {
                        snprintf(what, sizeof what, "value type of key #%" PRIu64, i);
                        return truncated(p, what, 4);
                }
                type = rd32(f->base + p->pos);
                if (type >= GGUF_TYPE_COUNT)
                        return log_error_errno(EBADMSG,
                                               "%s: key '%s': invalid value type %" PRIu32
                                               " at offset %" PRIu64 " (0..12 expected)",
                                               f->path, kv->key, type, p->pos);
                p->pos += 4;
                r = parse_value(p, &w, type, &kv->value);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int parse_alignment(struct gguf_file *f) {
        const struct gguf_value *v = find_value(f, "general.alignment");
        bool neg;
        uint64_t a;

        if (!v) {
                f->alignment = GGUF_DEFAULT_ALIGNMENT;
                return 0;
        }
        if (value_integer(v, &neg, &a) < 0)
                return log_error_errno(EBADMSG,
                                       "%s: general.alignment: an integer expected, file has %s",
                                       f->path, gguf_value_type_name(v->type));
        if (neg)
                return log_error_errno(EBADMSG,
                                       "%s: general.alignment is %" PRId64
                                       " (a power of two from 1 to %" PRIu64 " expected)",
                                       f->path, (int64_t) a, GGUF_MAX_ALIGNMENT);
        if (a == 0 || (a & (a - 1)) != 0 || a > GGUF_MAX_ALIGNMENT)
                return log_error_errno(EBADMSG,
                                       "%s: general.alignment is %" PRIu64
                                       " (a power of two from 1 to %" PRIu64 " expected)",
                                       f->path, a, GGUF_MAX_ALIGNMENT);
        f->alignment = a;
        return 0;
}

static int parse_tensor_infos(struct parser *p, uint64_t n_tensors) {
        struct gguf_file *f = p->f;
        char what[128];
        int r;

        for (uint64_t i = 0; i < n_tensors; i++) {
                struct gguf_string name = { 0 };
                struct gguf_tensor *t;
                const struct ggml_type_info *ti;
                uint64_t nrows, row;

                r = read_string(p, true, &name, "name of tensor #%" PRIu64, i);
                if (r < 0)
                        return r;
                if (grow((void **) &f->tensors, &f->cap_tensors, f->n_tensors,
                         sizeof(*f->tensors)) < 0)
                        return log_error_errno(ENOMEM,
                                               "%s: out of memory reading tensor #%" PRIu64,
                                               f->path, i);
                t = &f->tensors[f->n_tensors];
                memset(t, 0, sizeof(*t));
                t->name = copy_name(f, &name);
                if (!t->name)
                        return log_error_errno(ENOMEM,
                                               "%s: out of memory reading tensor #%" PRIu64,
                                               f->path, i);
                f->n_tensors++;

                if (left(p) < 4) {
                        snprintf(what, sizeof what, "n_dims of tensor '%s'", t->name);
                        return truncated(p, what, 4);
                }
                t->n_dims = rd32(f->base + p->pos);
                if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
                        return log_error_errno(EBADMSG,
                                               "%s: tensor '%s': n_dims %" PRIu32
                                               " at offset %" PRIu64 " (1 to %d expected)",
                                               f->path, t->name, t->n_dims, p->pos,
                                               GGUF_MAX_DIMS);
                p->pos += 4;
                if (left(p) < (uint64_t) 8 * t->n_dims + 12) {
                        snprintf(what, sizeof what, "shape, type and offset of tensor '%s'",
                                 t->name);
                        return truncated(p, what, (uint64_t) 8 * t->n_dims + 12);
                }
                t->n_elements = 1;
                for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
                        if (d >= t->n_dims) {
                                t->ne[d] = 1;
                                continue;
                        }
                        t->ne[d] = rd64(f->base + p->pos);
                        p->pos += 8;
                        if (t->ne[d] == 0)
                                return log_error_errno(EBADMSG,
                                                       "%s: tensor '%s': dimension 0 in ne[%" PRIu32
                                                       "] (every dimension must be >= 1)",
                                                       f->path, t->name, d);
                        if (!mul_u64_ok(t->n_elements, t->ne[d], &t->n_elements) ||
                            t->n_elements > (uint64_t) INT64_MAX)
                                return log_error_errno(
                                        EOVERFLOW,
                                        "%s: tensor '%s': element count overflows at ne[%" PRIu32
                                        "] = %" PRIu64 " (ne[0..%" PRIu32
                                        "] product must fit in 63 bits)",
                                        f->path, t->name, d, t->ne[d], d);
                }
                t->type = rd32(f->base + p->pos);
                t->offset = rd64(f->base + p->pos + 4);
                ti = ggml_type_get(t->type);
                if (!ti)
                        return log_error_errno(EBADMSG,
                                               "%s: tensor '%s': unknown ggml type %" PRIu32
                                               " at offset %" PRIu64,
                                               f->path, t->name, t->type, p->pos);
                p->pos += 12;
                if (t->ne[0] % ti->block_size != 0)
                        return log_error_errno(EBADMSG,
                                               "%s: tensor '%s': row of ne[0] = %" PRIu64
                                               " values is not a whole number of %s blocks (%" PRIu32
                                               " values each)",
                                               f->path, t->name, t->ne[0], ti->name,
                                               ti->block_size);
                r = ggml_row_bytes(t->type, t->ne[0], &row);
                nrows = t->n_elements / t->ne[0];
                if (r < 0 || !mul_u64_ok(row, nrows, &t->size))
                        return log_error_errno(EOVERFLOW,
                                               "%s: tensor '%s': byte size of %" PRIu64
                                               " rows of %" PRIu64 " %s values overflows 64 bits",
                                               f->path, t->name, nrows, t->ne[0], ti->name);
                if (t->offset % f->alignment != 0)
                        return log_error_errno(EBADMSG,
                                               "%s: tensor '%s': data offset %" PRIu64
                                               " is not a multiple of the alignment %" PRIu64,
                                               f->path, t->name, t->offset, f->alignment);
        }
        return 0;
}

static int cmp_by_offset(const void *a, const void *b, void *userdata) {
        const struct gguf_tensor *ts = userdata;
        uint64_t x = ts[*(const uint32_t *) a].offset, y = ts[*(const uint32_t *) b].offset;
        return x < y ? -1 : x > y;
}

static int check_data(struct gguf_file *f, uint64_t end_of_infos) {
        _cleanup_free_ uint32_t *order = NULL;
        uint64_t data_offset;

        /* data starts at the next multiple of the alignment; 2^20 alignment on an end below
         * 2^64 - 2^20 cannot overflow because end_of_infos <= file size */
        data_offset = (end_of_infos + f->alignment - 1) / f->alignment * f->alignment;
        if (f->n_tensors == 0) {
                /* no data section needed; writers may omit the padding */
                f->data_offset = MIN(data_offset, f->size);
                return 0;
        }
        if (data_offset > f->size)
                return log_error_errno(EBADMSG,
                                       "%s: data section starts at offset %" PRIu64
                                       " (the tensor table ends at %" PRIu64
                                       ", aligned to %" PRIu64 ") past the end of the file "
                                       "(size %" PRIu64 ")",
                                       f->path, data_offset, end_of_infos, f->alignment, f->size);
        f->data_offset = data_offset;

        for (size_t i = 0; i < f->n_tensors; i++) {
                struct gguf_tensor *t = &f->tensors[i];
                uint64_t start, end;

                if (!add_u64_ok(data_offset, t->offset, &start) ||
                    !add_u64_ok(start, t->size, &end) || end > f->size)
                        return log_error_errno(
                                EBADMSG,
                                "%s: tensor '%s': data [offset %" PRIu64 ", size %" PRIu64
                                "] extends past the end of the file (size %" PRIu64 ")",
                                f->path, t->name,
                                t->offset > UINT64_MAX - data_offset ? t->offset : start,
                                t->size, f->size);
                t->data = f->base + start;
        }

        order = malloc(f->n_tensors * sizeof(*order));
        if (!order)
                return log_error_errno(ENOMEM, "%s: out of memory sorting tensors", f->path);
        for (size_t i = 0; i < f->n_tensors; i++)
                order[i] = (uint32_t) i;
        qsort_r(order, f->n_tensors, sizeof(*order), cmp_by_offset, f->tensors);
        for (size_t i = 1; i < f->n_tensors; i++) {
                const struct gguf_tensor *a = &f->tensors[order[i - 1]], *b = &f->tensors[order[i]];
                if (a->offset + a->size > b->offset)
                        return log_error_errno(
                                EBADMSG,
                                "%s: tensor '%s' data [offset %" PRIu64 ", size %" PRIu64
                                "] overlaps tensor '%s' [offset %" PRIu64 ", size %" PRIu64
                                "] (offsets relative to the data section at %" PRIu64 ")",
                                f->path, b->name, b->offset, b->size, a->name, a->offset, a->size,
                                data_offset);
        }
        return 0;
}

static int parse(struct gguf_file *f) {
        struct parser p = { .f = f };
        uint64_t n_tensors = 0, n_kv = 0;
        size_t a, b;
        int r;

        r = parse_header(&p, &n_tensors, &n_kv);
        if (r < 0)
                return r;
        r = parse_kvs(&p, n_kv);
        if (r < 0)
                return r;
        r = name_table_build(&f->kv_names, f->n_kv, kv_name_of, f, &a, &b);
        if (r == -EEXIST)
                return log_error_errno(EBADMSG, "%s: duplicate key '%s' (entries #%zu and #%zu)",
                                       f->path, f->kvs[b].key, a, b);
        if (r < 0)
                return log_error_errno(r, "%s: out of memory indexing keys", f->path);
        r = parse_alignment(f);
        if (r < 0)
                return r;
        r = parse_tensor_infos(&p, n_tensors);
        if (r < 0)
                return r;
        r = name_table_build(&f->tensor_names, f->n_tensors, tensor_name_of, f, &a, &b);
        if (r == -EEXIST)
                return log_error_errno(EBADMSG,
                                       "%s: duplicate tensor name '%s' (tensors #%zu and #%zu)",
                                       f->path, f->tensors[b].name, a, b);
        if (r < 0)
                return log_error_errno(r, "%s: out of memory indexing tensors", f->path);
        return check_data(f, p.pos);
}

static int file_new(const char *path, struct gguf_file **ret) {
        struct gguf_file *f = calloc(1, sizeof(*f));
        if (!f)
                return -ENOMEM;
        f->path = strdup(path);
        if (!f->path) {
                free(f);
                return -ENOMEM;
        }
        *ret = f;
        return 0;
}

int gguf_open_buffer(const void *data, size_t size, struct gguf_file **ret) {
        _cleanup_(gguf_closep) struct gguf_file *f = NULL;
        int r;

        if (!ret || (!data && size > 0))
                return -EINVAL;
        r = file_new("<buffer>", &f);
        if (r < 0)
                return log_error_errno(r, "<buffer>: out of memory");
        f->base = data ? data : (const uint8_t *) "";
        f->size = size;
        r = parse(f);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(f);
        return 0;
}

int gguf_open(const char *path, struct gguf_file **ret) {
        _cleanup_(gguf_closep) struct gguf_file *f = NULL;
        _cleanup_close_ int fd = -1;
        struct stat st;
        int r;

        if (!path || !ret)
                return -EINVAL;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return log_error_errno(errno, "%s: cannot open model file: %s", path,
                                       strerror(errno));
        if (fstat(fd, &st) < 0)
                return log_error_errno(errno, "%s: cannot stat model file: %s", path,
                                       strerror(errno));
        if (!S_ISREG(st.st_mode))
                return log_error_errno(EBADMSG, "%s: not a regular file (a GGUF file expected)",
                                       path);
        r = file_new(path, &f);
        if (r < 0)
                return log_error_errno(r, "%s: out of memory", path);
        f->size = (uint64_t) st.st_size;
        if (st.st_size > 0) {
                if ((uint64_t) st.st_size > SIZE_MAX)
                        return log_error_errno(EFBIG, "%s: file of %" PRIu64
                                                      " bytes is too large to map",
                                               path, f->size);
                f->map = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
                if (f->map == MAP_FAILED) {
                        f->map = NULL;
                        return log_error_errno(errno, "%s: cannot mmap %" PRIu64 " bytes: %s",
                                               path, f->size, strerror(errno));
                }
                f->map_size = (size_t) st.st_size;
                f->base = f->map;
        } else
                f->base = (const uint8_t *) "";
        r = parse(f);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(f);
        return 0;
}

void gguf_close(struct gguf_file *f) {
        if (!f)
                return;
        if (f->map)
                munmap(f->map, f->map_size);
        free(f->kv_names.slots);
        free(f->tensor_names.slots);
        free(f->kvs);
        free(f->tensors);
        arena_free(&f->arena);
        free(f->path);
        free(f);
}

/* ---- accessors ---- */

uint32_t gguf_version(const struct gguf_file *f) {
        return f->version;
}
uint64_t gguf_alignment(const struct gguf_file *f) {
        return f->alignment;
}
uint64_t gguf_data_offset(const struct gguf_file *f) {
        return f->data_offset;
}
uint64_t gguf_file_size(const struct gguf_file *f) {
        return f->size;
}
void gguf_drop_pages(const struct gguf_file *f, const void *p, size_t n) {
        long page = sysconf(_SC_PAGESIZE);
        uintptr_t a, e, lo, hi;

        if (!f->map || page <= 0 || n == 0)
                return;
        lo = (uintptr_t) f->map;
        hi = lo + f->map_size;
        a = MAX((uintptr_t) p, lo);
        e = MIN((uintptr_t) p + n, hi);
        a = (a + (uintptr_t) page - 1) & ~((uintptr_t) page - 1);
        e &= ~((uintptr_t) page - 1);
        if (a < e) /* a read-only private mapping: its pages are clean, so this only forgets them */
                (void) madvise((void *) a, e - a, MADV_DONTNEED);
}

const char *gguf_path(const struct gguf_file *f) {
        return f->path;
}

size_t gguf_kv_count(const struct gguf_file *f) {
        return f->n_kv;
}
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, size_t i) {
        return i < f->n_kv ? &f->kvs[i] : NULL;
}
const struct gguf_kv *gguf_kv_find(const struct gguf_file *f, const char *key) {
        ssize_t i = name_table_find(&f->kv_names, key, kv_name_of, (void *) f);
        return i < 0 ? NULL : &f->kvs[i];
}

size_t gguf_tensor_count(const struct gguf_file *f) {
        return f->n_tensors;
}
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, size_t i) {
        return i < f->n_tensors ? &f->tensors[i] : NULL;
}
const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name) {
        ssize_t i = name_table_find(&f->tensor_names, name, tensor_name_of, (void *) f);
        return i < 0 ? NULL : &f->tensors[i];
}

/* ---- typed getters ---- */

/* A value's integer as (negative?, magnitude-as-two's-complement). -EBADMSG if not an integer. */
static int value_integer(const struct gguf_value *v, bool *neg, uint64_t *u) {
        if (type_is_unsigned(v->type)) {
                *neg = false;
                *u = v->u64;
                return 0;
        }
        if (type_is_signed(v->type)) {
                *neg = v->i64 < 0;
                *u = (uint64_t) v->i64;
                return 0;
        }
        return -EBADMSG;
}

/* What a getter message names: the key, or "array element I" (formatted only on error, so the
 * per-element getters the tokenizer calls 131072 times stay cheap). */
#define SUBJECT(key, idx)                                                                          \
        ((key) ? (key) : (snprintf(_subject, sizeof _subject, "array element %" PRIu64, (idx)),    \
                          _subject))

static int value_to_u64(const struct gguf_value *v, uint64_t max, const char *key, uint64_t idx,
                        const char *target, uint64_t *ret) {
        char _subject[48];
        bool neg;
        uint64_t u;

        if (value_integer(v, &neg, &u) < 0)
                return log_error_errno(EBADMSG, "%s: type %s expected (any integer), file has %s",
                                       SUBJECT(key, idx), target, gguf_value_type_name(v->type));
        if (neg)
                return log_error_errno(ERANGE, "%s: value %" PRId64 " does not fit in %s",
                                       SUBJECT(key, idx), (int64_t) u, target);
        if (u > max)
                return log_error_errno(ERANGE, "%s: value %" PRIu64 " does not fit in %s",
                                       SUBJECT(key, idx), u, target);
        *ret = u;
        return 0;
}

static int value_to_i64(const struct gguf_value *v, const char *key, uint64_t idx, int64_t *ret) {
        char _subject[48];
        bool neg;
        uint64_t u;

        if (value_integer(v, &neg, &u) < 0)
                return log_error_errno(EBADMSG,
                                       "%s: type int64 expected (any integer), file has %s",
                                       SUBJECT(key, idx), gguf_value_type_name(v->type));
        if (!neg && u > (uint64_t) INT64_MAX)
                return log_error_errno(ERANGE, "%s: value %" PRIu64 " does not fit in int64",
                                       SUBJECT(key, idx), u);
        *ret = (int64_t) u;
        return 0;
}

static int value_to_f64(const struct gguf_value *v, const char *key, uint64_t idx, double *ret) {
        char _subject[48];

        if (type_is_float(v->type))
                *ret = v->f64;
        else if (type_is_unsigned(v->type))
                *ret = (double) v->u64;
        else if (type_is_signed(v->type))
                *ret = (double) v->i64;
        else
                return log_error_errno(EBADMSG,
                                       "%s: type float64 expected (any float or integer), file "
                                       "has %s",
                                       SUBJECT(key, idx), gguf_value_type_name(v->type));
        return 0;
}

static const struct gguf_value *find_value(const struct gguf_file *f, const char *key) {
        const struct gguf_kv *kv = gguf_kv_find(f, key);
        return kv ? &kv->value : NULL;
}

int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *ret) {
        const struct gguf_value *v = find_value(f, key);
        return v ? value_to_u64(v, UINT64_MAX, key, 0, "uint64", ret) : -ENOENT;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret) {
        const struct gguf_value *v = find_value(f, key);
        uint64_t u = 0; /* gcc 12 -O3 cannot see that value_to_u64 sets it on success */
        int r;

        if (!v)
                return -ENOENT;
        r = value_to_u64(v, UINT32_MAX, key, 0, "uint32", &u);
        if (r < 0)
                return r;
        *ret = (uint32_t) u;
        return 0;
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *ret) {
        const struct gguf_value *v = find_value(f, key);
        return v ? value_to_i64(v, key, 0, ret) : -ENOENT;
}

int gguf_get_f64(const struct gguf_file *f, const char *key, double *ret) {
        const struct gguf_value *v = find_value(f, key);
        return v ? value_to_f64(v, key, 0, ret) : -ENOENT;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *ret) {
        const struct gguf_value *v = find_value(f, key);

        if (!v)
                return -ENOENT;
        if (v->type != GGUF_TYPE_BOOL)
                return log_error_errno(EBADMSG, "%s: type bool expected, file has %s", key,
                                       gguf_value_type_name(v->type));
        *ret = v->u64 != 0;
        return 0;
}

int gguf_get_string(const struct gguf_file *f, const char *key, struct gguf_string *ret) {
        const struct gguf_value *v = find_value(f, key);

        if (!v)
                return -ENOENT;
        if (v->type != GGUF_TYPE_STRING)
                return log_error_errno(EBADMSG, "%s: type string expected, file has %s", key,
                                       gguf_value_type_name(v->type));
        *ret = v->str;
        return 0;
}

int gguf_get_array(const struct gguf_file *f, const char *key, const struct gguf_value **ret) {
        const struct gguf_value *v = find_value(f, key);

        if (!v)
                return -ENOENT;
        if (v->type != GGUF_TYPE_ARRAY)
                return log_error_errno(EBADMSG, "%s: type array expected, file has %s", key,
                                       gguf_value_type_name(v->type));
        *ret = v;
        return 0;
}

/* ---- array elements ---- */

static int array_check(const struct gguf_value *arr, uint64_t i) {
        if (!arr || arr->type != GGUF_TYPE_ARRAY)
                return log_error_errno(EINVAL, "array element %" PRIu64 ": value is a %s, not an "
                                               "array",
                                       i, arr ? gguf_value_type_name(arr->type) : "NULL");
        if (i >= arr->arr.n)
                return log_error_errno(ERANGE,
                                       "array element %" PRIu64 " out of range (array of %" PRIu64
                                       " %s)",
                                       i, arr->arr.n, gguf_value_type_name(arr->arr.elem_type));
        return 0;
}

/* Decodes fixed-size element i into *v; -EBADMSG (unlogged) if the elements are not scalars. */
static int array_scalar(const struct gguf_value *arr, uint64_t i, struct gguf_value *v) {
        uint32_t sz = gguf_value_type_size(arr->arr.elem_type);

        if (sz == 0)
                return -EBADMSG;
        v->type = arr->arr.elem_type;
        decode_scalar(v->type, (const uint8_t *) arr->arr.raw + i * sz, v);
        return 0;
}

int gguf_array_get_u64(const struct gguf_value *arr, uint64_t i, uint64_t *ret) {
        struct gguf_value v = { .type = arr ? arr->arr.elem_type : 0 };
        int r = array_check(arr, i);

        if (r < 0)
                return r;
        (void) array_scalar(arr, i, &v);
        return value_to_u64(&v, UINT64_MAX, NULL, i, "uint64", ret);
}

int gguf_array_get_i64(const struct gguf_value *arr, uint64_t i, int64_t *ret) {
        struct gguf_value v = { .type = arr ? arr->arr.elem_type : 0 };
        int r = array_check(arr, i);

        if (r < 0)
                return r;
        (void) array_scalar(arr, i, &v);
        return value_to_i64(&v, NULL, i, ret);
}

int gguf_array_get_f64(const struct gguf_value *arr, uint64_t i, double *ret) {
        struct gguf_value v = { .type = arr ? arr->arr.elem_type : 0 };
        int r = array_check(arr, i);

        if (r < 0)
                return r;
        (void) array_scalar(arr, i, &v);
        return value_to_f64(&v, NULL, i, ret);
}

int gguf_array_get_bool(const struct gguf_value *arr, uint64_t i, bool *ret) {
        int r = array_check(arr, i);

        if (r < 0)
                return r;
        if (arr->arr.elem_type != GGUF_TYPE_BOOL)
                return log_error_errno(EBADMSG,
                                       "array element %" PRIu64 ": type bool expected, array "
                                       "holds %s",
                                       i, gguf_value_type_name(arr->arr.elem_type));
        *ret = ((const uint8_t *) arr->arr.raw)[i] != 0;
        return 0;
}

int gguf_array_get_string(const struct gguf_value *arr, uint64_t i, struct gguf_string *ret) {
        const uint8_t *p;
        int r = array_check(arr, i);

        if (r < 0)
                return r;
        if (arr->arr.elem_type != GGUF_TYPE_STRING)
                return log_error_errno(EBADMSG,
                                       "array element %" PRIu64 ": type string expected, array "
                                       "holds %s",
                                       i, gguf_value_type_name(arr->arr.elem_type));
        p = ((const uint8_t *const *) arr->arr.index)[i];
        ret->len = rd64(p);
        ret->data = (const char *) p + 8;
        return 0;
}

int gguf_array_get_array(const struct gguf_value *arr, uint64_t i, struct gguf_value *ret) {
        int r = array_check(arr, i);

        if (r < 0)
                return r;
        if (arr->arr.elem_type != GGUF_TYPE_ARRAY)
                return log_error_errno(EBADMSG,
                                       "array element %" PRIu64 ": type array expected, array "
                                       "holds %s",
                                       i, gguf_value_type_name(arr->arr.elem_type));
        *ret = ((const struct gguf_value *) arr->arr.index)[i];
        return 0;
}
