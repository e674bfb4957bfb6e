/* SPDX-License-Identifier: MIT */
/* GGUF reader tests: files are composed byte by byte with a small builder below, so each
 * corruption is one precise edit of an otherwise valid file, and each refusal asserts the text a
 * user would read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf/ggml.h"
#include "gguf/gguf.h"
#include "common/log.h"
#include "common/util.h"

/* ---- byte builder ---- */

struct buf {
        uint8_t *d;
        size_t n, cap;
};

static void put(struct buf *b, const void *p, size_t n) {
        if (b->n + n > b->cap) {
                b->cap = MAX(b->cap * 2, b->n + n + 256);
                b->d = realloc(b->d, b->cap);
                assert_non_null(b->d);
        }
        if (n)
                memcpy(b->d + b->n, p, n);
        b->n += n;
}
static void put_u8(struct buf *b, uint8_t v) {
        put(b, &v, 1);
}
static void put_u16(struct buf *b, uint16_t v) {
        uint8_t x[2] = { (uint8_t) v, (uint8_t) (v >> 8) };
        put(b, x, 2);
}
static void put_u32(struct buf *b, uint32_t v) {
        uint8_t x[4] = { (uint8_t) v, (uint8_t) (v >> 8), (uint8_t) (v >> 16),
                         (uint8_t) (v >> 24) };
        put(b, x, 4);
}
static void put_u64(struct buf *b, uint64_t v) {
        put_u32(b, (uint32_t) v);
        put_u32(b, (uint32_t) (v >> 32));
}
static void put_f32(struct buf *b, float f) {
        uint32_t u;
        memcpy(&u, &f, 4);
        put_u32(b, u);
}
static void put_f64(struct buf *b, double f) {
        uint64_t u;
        memcpy(&u, &f, 8);
        put_u64(b, u);
}
static void put_strn(struct buf *b, const char *s, size_t n) {
        put_u64(b, n);
        put(b, s, n);
}
static void put_str(struct buf *b, const char *s) {
        put_strn(b, s, strlen(s));
}
static void put_header(struct buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
        put(b, "GGUF", 4);
        put_u32(b, version);
        put_u64(b, n_tensors);
        put_u64(b, n_kv);
}
static void put_kv(struct buf *b, const char *key, uint32_t type) {
        put_str(b, key);
        put_u32(b, type);
}
static void put_kv_u32(struct buf *b, const char *key, uint32_t v) {
        put_kv(b, key, GGUF_TYPE_UINT32);
        put_u32(b, v);
}
static void put_kv_str(struct buf *b, const char *key, const char *v) {
        put_kv(b, key, GGUF_TYPE_STRING);
        put_str(b, v);
}
static void put_arr_head(struct buf *b, uint32_t elem_type, uint64_t n) {
        put_u32(b, elem_type);
        put_u64(b, n);
}
static void put_tensor_info(struct buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                            uint32_t type, uint64_t offset) {
        put_str(b, name);
        put_u32(b, n_dims);
        for (uint32_t i = 0; i < n_dims; i++)
                put_u64(b, ne[i]);
        put_u32(b, type);
        put_u64(b, offset);
}
static void pad_to(struct buf *b, size_t align) {
        while (b->n % align)
                put_u8(b, 0);
}
static void put_data(struct buf *b, size_t n) {
        for (size_t i = 0; i < n; i++)
                put_u8(b, (uint8_t) (i * 7 + 3));
}

struct tspec {
        const char *name;
        uint32_t n_dims;
        uint64_t ne[4];
        uint32_t type;
        uint64_t offset;
};

/* A file with one string kv, an optional general.alignment (u32; absent if alignment == 0) and
 * the given tensors, padded, followed by data_bytes of pattern bytes. */
static void build(struct buf *b, uint32_t version, const struct tspec *ts, size_t nt,
                  uint32_t alignment, size_t data_bytes) {
        put_header(b, version, nt, alignment ? 2 : 1);
        put_kv_str(b, "general.architecture", "test");
        if (alignment)
                put_kv_u32(b, "general.alignment", alignment);
        for (size_t i = 0; i < nt; i++)
                put_tensor_info(b, ts[i].name, ts[i].n_dims, ts[i].ne, ts[i].type, ts[i].offset);
        pad_to(b, alignment ? alignment : 32);
        put_data(b, data_bytes);
}

/* Two tensors: F32 [4, 2] (32 B) at 0 and Q8_0 [32] (34 B) at 32. */
static const struct tspec two_tensors[] = {
        { "a.weight", 2, { 4, 2 }, GGML_TYPE_F32, 0 },
        { "b.weight", 1, { 32 }, GGML_TYPE_Q8_0, 32 },
};

/* Parses an exact-size heap copy, so sanitizer builds catch any read past the end. */
static int open_copy(const struct buf *b, struct gguf_file **ret, void **copy) {
        *copy = malloc(b->n ? b->n : 1);
        assert_non_null(*copy);
        if (b->n)
                memcpy(*copy, b->d, b->n);
        return gguf_open_buffer(*copy, b->n, ret);
}

#define assert_contains(haystack, needle)                                                          \
        do {                                                                                       \
                const char *_h = (haystack), *_n = (needle);                                       \
                if (!strstr(_h, _n))                                                               \
                        fail_msg("message \"%s\" does not contain \"%s\"", _h, _n);                \
        } while (0)

/* The file in b must be refused with -err and a message containing each given substring. */
static void expect_refused(struct buf *b, int err, const char *s1, const char *s2) {
        struct gguf_file *f = NULL;
        void *copy;
        int r;

        log_clear_last_error();
        r = open_copy(b, &f, &copy);
        if (r >= 0)
                fail_msg("file accepted, expected refusal with \"%s\"", s1);
        assert_null(f);
        if (r != -err)
                fail_msg("error %d (%s), expected %d; message \"%s\"", r, strerror(-r), -err,
                         log_last_error());
        assert_contains(log_last_error(), s1);
        if (s2)
                assert_contains(log_last_error(), s2);
        free(copy);
        free(b->d);
        memset(b, 0, sizeof(*b));
}

static struct gguf_file *open_ok(const struct buf *b, void **copy) {
        struct gguf_file *f = NULL;
        int r;

        log_clear_last_error();
        r = open_copy(b, &f, copy);
        if (r < 0)
                fail_msg("file refused: %d: %s", r, log_last_error());
        assert_non_null(f);
        return f;
}

/* ---- every value type ---- */

static void build_all_types(struct buf *b) {
        put_header(b, 3, 0, 22);
        put_kv(b, "u8", GGUF_TYPE_UINT8);
        put_u8(b, 200);
        put_kv(b, "i8", GGUF_TYPE_INT8);
        put_u8(b, (uint8_t) -5);
        put_kv(b, "u16", GGUF_TYPE_UINT16);
        put_u16(b, 60000);
        put_kv(b, "i16", GGUF_TYPE_INT16);
        put_u16(b, (uint16_t) -30000);
        put_kv(b, "u32", GGUF_TYPE_UINT32);
        put_u32(b, 4000000000u);
        put_kv(b, "i32", GGUF_TYPE_INT32);
        put_u32(b, (uint32_t) -2000000000);
        put_kv(b, "f32", GGUF_TYPE_FLOAT32);
        put_f32(b, 1.5f);
        put_kv(b, "bool.t", GGUF_TYPE_BOOL);
        put_u8(b, 1);
        put_kv(b, "bool.f", GGUF_TYPE_BOOL);
        put_u8(b, 0);
        put_kv_str(b, "str", "h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x98\x80");
        put_kv_str(b, "str.empty", "");
        put_kv(b, "u64", GGUF_TYPE_UINT64);
        put_u64(b, UINT64_MAX);
        put_kv(b, "i64", GGUF_TYPE_INT64);
        put_u64(b, (uint64_t) INT64_MIN);
        put_kv(b, "f64", GGUF_TYPE_FLOAT64);
        put_f64(b, -0.125);
        /* arrays */
        put_kv(b, "arr.u8", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_UINT8, 3);
        put_u8(b, 1);
        put_u8(b, 2);
        put_u8(b, 255);
        put_kv(b, "arr.i16", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_INT16, 2);
        put_u16(b, (uint16_t) -7);
        put_u16(b, 7);
        put_kv(b, "arr.f32", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_FLOAT32, 2);
        put_f32(b, 0.25f);
        put_f32(b, -3.0f);
        put_kv(b, "arr.bool", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_BOOL, 2);
        put_u8(b, 0);
        put_u8(b, 1);
        put_kv(b, "arr.str", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_STRING, 3);
        put_str(b, "a");
        put_str(b, "");
        put_str(b, "\xc3\xbc");
        put_kv(b, "arr.empty", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_STRING, 0);
        /* [[1, 2], [], [3]] of int32 */
        put_kv(b, "arr.nested", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_ARRAY, 3);
        put_arr_head(b, GGUF_TYPE_INT32, 2);
        put_u32(b, 1);
        put_u32(b, 2);
        put_arr_head(b, GGUF_TYPE_INT32, 0);
        put_arr_head(b, GGUF_TYPE_INT32, 1);
        put_u32(b, 3);
        /* [[["x", "yz"]], [[]]]: three levels, strings at the bottom */
        put_kv(b, "arr.deep", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_ARRAY, 2);
        put_arr_head(b, GGUF_TYPE_ARRAY, 1);
        put_arr_head(b, GGUF_TYPE_STRING, 2);
        put_str(b, "x");
        put_str(b, "yz");
        put_arr_head(b, GGUF_TYPE_ARRAY, 1);
        put_arr_head(b, GGUF_TYPE_STRING, 0);
}

static void assert_str(struct gguf_string s, const char *expect) {
        assert_int_equal(s.len, strlen(expect));
        if (s.len)
                assert_memory_equal(s.data, expect, s.len);
}

static void test_value_roundtrip(void **state) {
        struct buf b = { 0 };
        struct gguf_file *f;
        void *copy;
        uint64_t u;
        uint32_t u32;
        int64_t i;
        double d;
        bool t;
        struct gguf_string s;
        const struct gguf_value *a;
        struct gguf_value e, e2;

        (void) state;
        build_all_types(&b);
        f = open_ok(&b, &copy);
        assert_int_equal(gguf_version(f), 3);
        assert_int_equal(gguf_kv_count(f), 22);
        assert_int_equal(gguf_tensor_count(f), 0);
        assert_string_equal(gguf_kv_at(f, 0)->key, "u8");
        assert_string_equal(gguf_kv_at(f, 21)->key, "arr.deep");
        assert_null(gguf_kv_at(f, 22));
        assert_string_equal(gguf_path(f), "<buffer>");

        assert_int_equal(gguf_get_u64(f, "u8", &u), 0);
        assert_int_equal(u, 200);
        assert_int_equal(gguf_get_i64(f, "i8", &i), 0);
        assert_int_equal(i, -5);
        assert_int_equal(gguf_get_u32(f, "u16", &u32), 0);
        assert_int_equal(u32, 60000);
        assert_int_equal(gguf_get_i64(f, "i16", &i), 0);
        assert_int_equal(i, -30000);
        assert_int_equal(gguf_get_u32(f, "u32", &u32), 0);
        assert_int_equal(u32, 4000000000u);
        assert_int_equal(gguf_get_i64(f, "i32", &i), 0);
        assert_int_equal(i, -2000000000);
        assert_int_equal(gguf_get_f64(f, "f32", &d), 0);
        assert_true(d == 1.5);
        assert_int_equal(gguf_get_bool(f, "bool.t", &t), 0);
        assert_true(t);
        assert_int_equal(gguf_get_bool(f, "bool.f", &t), 0);
        assert_false(t);
        assert_int_equal(gguf_get_string(f, "str", &s), 0);
        assert_str(s, "h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x98\x80");
        assert_int_equal(gguf_get_string(f, "str.empty", &s), 0);
        assert_int_equal(s.len, 0);
        assert_int_equal(gguf_get_u64(f, "u64", &u), 0);
        assert_true(u == UINT64_MAX);
        assert_int_equal(gguf_get_i64(f, "i64", &i), 0);
        assert_true(i == INT64_MIN);
        assert_int_equal(gguf_get_f64(f, "f64", &d), 0);
        assert_true(d == -0.125);
        /* integer widths convert where they fit; get_f64 takes integers */
        assert_int_equal(gguf_get_i64(f, "u32", &i), 0);
        assert_int_equal(i, 4000000000);
        assert_int_equal(gguf_get_u64(f, "i8", &u), -ERANGE);
        assert_int_equal(gguf_get_f64(f, "i32", &d), 0);
        assert_true(d == -2e9);
        assert_int_equal(gguf_get_f64(f, "u8", &d), 0);
        assert_true(d == 200.0);

        /* arrays of scalars */
        assert_int_equal(gguf_get_array(f, "arr.u8", &a), 0);
        assert_int_equal(a->arr.elem_type, GGUF_TYPE_UINT8);
        assert_int_equal(a->arr.n, 3);
        assert_int_equal(gguf_array_get_u64(a, 2, &u), 0);
        assert_int_equal(u, 255);
        assert_int_equal(gguf_array_get_f64(a, 0, &d), 0);
        assert_true(d == 1.0);
        assert_int_equal(gguf_get_array(f, "arr.i16", &a), 0);
        assert_int_equal(gguf_array_get_i64(a, 0, &i), 0);
        assert_int_equal(i, -7);
        assert_int_equal(gguf_array_get_u64(a, 0, &u), -ERANGE);
        assert_contains(log_last_error(), "array element 0: value -7 does not fit in uint64");
        assert_int_equal(gguf_array_get_u64(a, 1, &u), 0);
        assert_int_equal(u, 7);
        assert_int_equal(gguf_get_array(f, "arr.f32", &a), 0);
        assert_int_equal(gguf_array_get_f64(a, 1, &d), 0);
        assert_true(d == -3.0);
        assert_int_equal(gguf_array_get_i64(a, 1, &i), -EBADMSG);
        assert_contains(log_last_error(), "file has float32");
        assert_int_equal(gguf_get_array(f, "arr.bool", &a), 0);
        assert_int_equal(gguf_array_get_bool(a, 1, &t), 0);
        assert_true(t);
        assert_int_equal(gguf_array_get_bool(a, 0, &t), 0);
        assert_false(t);
        assert_int_equal(gguf_array_get_bool(a, 2, &t), -ERANGE);
        assert_contains(log_last_error(), "array element 2 out of range (array of 2 bool)");

        /* arrays of strings, empty arrays */
        assert_int_equal(gguf_get_array(f, "arr.str", &a), 0);
        assert_int_equal(a->arr.n, 3);
        assert_int_equal(gguf_array_get_string(a, 0, &s), 0);
        assert_str(s, "a");
        assert_int_equal(gguf_array_get_string(a, 1, &s), 0);
        assert_int_equal(s.len, 0);
        assert_int_equal(gguf_array_get_string(a, 2, &s), 0);
        assert_str(s, "\xc3\xbc");
        assert_int_equal(gguf_array_get_u64(a, 0, &u), -EBADMSG);
        assert_contains(log_last_error(), "file has string");
        assert_int_equal(gguf_get_array(f, "arr.empty", &a), 0);
        assert_int_equal(a->arr.n, 0);
        assert_int_equal(a->arr.elem_type, GGUF_TYPE_STRING);
        assert_int_equal(gguf_array_get_string(a, 0, &s), -ERANGE);

        /* nested arrays */
        assert_int_equal(gguf_get_array(f, "arr.nested", &a), 0);
        assert_int_equal(a->arr.elem_type, GGUF_TYPE_ARRAY);
        assert_int_equal(a->arr.n, 3);
        assert_int_equal(gguf_array_get_array(a, 0, &e), 0);
        assert_int_equal(e.arr.elem_type, GGUF_TYPE_INT32);
        assert_int_equal(e.arr.n, 2);
        assert_int_equal(gguf_array_get_i64(&e, 1, &i), 0);
        assert_int_equal(i, 2);
        assert_int_equal(gguf_array_get_array(a, 1, &e), 0);
        assert_int_equal(e.arr.n, 0);
        assert_int_equal(gguf_array_get_array(a, 2, &e), 0);
        assert_int_equal(e.arr.n, 1);
        assert_int_equal(gguf_array_get_u64(&e, 0, &u), 0);
        assert_int_equal(u, 3);
        assert_int_equal(gguf_array_get_string(a, 0, &s), -EBADMSG);
        assert_contains(log_last_error(), "type string expected, array holds array");

        assert_int_equal(gguf_get_array(f, "arr.deep", &a), 0);
        assert_int_equal(gguf_array_get_array(a, 0, &e), 0);
        assert_int_equal(e.arr.elem_type, GGUF_TYPE_ARRAY);
        assert_int_equal(gguf_array_get_array(&e, 0, &e2), 0);
        assert_int_equal(e2.arr.elem_type, GGUF_TYPE_STRING);
        assert_int_equal(e2.arr.n, 2);
        assert_int_equal(gguf_array_get_string(&e2, 1, &s), 0);
        assert_str(s, "yz");
        assert_int_equal(gguf_array_get_array(a, 1, &e), 0);
        assert_int_equal(gguf_array_get_array(&e, 0, &e2), 0);
        assert_int_equal(e2.arr.n, 0);

        gguf_close(f);
        free(copy);
        free(b.d);
}

static void test_getter_errors(void **state) {
        struct buf b = { 0 };
        struct gguf_file *f;
        void *copy;
        uint64_t u;
        uint32_t u32;
        int64_t i;
        double d;
        bool t;
        struct gguf_string s;
        const struct gguf_value *a;

        (void) state;
        build_all_types(&b);
        f = open_ok(&b, &copy);

        /* absent: -ENOENT and nothing logged */
        log_clear_last_error();
        assert_int_equal(gguf_get_u64(f, "missing", &u), -ENOENT);
        assert_int_equal(gguf_get_u32(f, "missing", &u32), -ENOENT);
        assert_int_equal(gguf_get_i64(f, "missing", &i), -ENOENT);
        assert_int_equal(gguf_get_f64(f, "missing", &d), -ENOENT);
        assert_int_equal(gguf_get_bool(f, "missing", &t), -ENOENT);
        assert_int_equal(gguf_get_string(f, "missing", &s), -ENOENT);
        assert_int_equal(gguf_get_array(f, "missing", &a), -ENOENT);
        assert_null(gguf_kv_find(f, "missing"));
        assert_string_equal(log_last_error(), "");

        /* type mismatches name key, expected and found */
        assert_int_equal(gguf_get_u32(f, "str", &u32), -EBADMSG);
        assert_string_equal(log_last_error(), "str: type uint32 expected (any integer), file has string");
        assert_int_equal(gguf_get_u64(f, "f32", &u), -EBADMSG);
        assert_contains(log_last_error(), "f32: type uint64 expected (any integer), file has float32");
        assert_int_equal(gguf_get_i64(f, "bool.t", &i), -EBADMSG);
        assert_contains(log_last_error(), "bool.t: type int64 expected (any integer), file has bool");
        assert_int_equal(gguf_get_bool(f, "u8", &t), -EBADMSG);
        assert_string_equal(log_last_error(), "u8: type bool expected, file has uint8");
        assert_int_equal(gguf_get_f64(f, "str", &d), -EBADMSG);
        assert_contains(log_last_error(), "str: type float64 expected");
        assert_int_equal(gguf_get_string(f, "u32", &s), -EBADMSG);
        assert_string_equal(log_last_error(), "u32: type string expected, file has uint32");
        assert_int_equal(gguf_get_array(f, "u32", &a), -EBADMSG);
        assert_string_equal(log_last_error(), "u32: type array expected, file has uint32");
        assert_int_equal(gguf_get_u64(f, "arr.u8", &u), -EBADMSG);
        assert_contains(log_last_error(), "file has array");

        assert_string_equal(gguf_value_type_name(GGUF_TYPE_FLOAT64), "float64");
        assert_string_equal(gguf_value_type_name(GGUF_TYPE_ARRAY), "array");
        assert_string_equal(gguf_value_type_name(13), "type#13");

        /* values that do not fit */
        assert_int_equal(gguf_get_u64(f, "i64", &u), -ERANGE);
        assert_string_equal(log_last_error(),
                            "i64: value -9223372036854775808 does not fit in uint64");
        assert_int_equal(gguf_get_u32(f, "u64", &u32), -ERANGE);
        assert_string_equal(log_last_error(),
                            "u64: value 18446744073709551615 does not fit in uint32");
        assert_int_equal(gguf_get_u32(f, "i8", &u32), -ERANGE);
        assert_int_equal(gguf_get_i64(f, "u64", &i), -ERANGE);
        assert_contains(log_last_error(), "does not fit in int64");

        gguf_close(f);
        free(copy);
        free(b.d);
}

/* ---- header ---- */

static void test_versions(void **state) {
        struct buf b = { 0 };
        struct gguf_file *f;
        void *copy;

        (void) state;
        for (uint32_t v = 2; v <= 3; v++) {
                build(&b, v, two_tensors, 2, 0, 66);
                f = open_ok(&b, &copy);
                assert_int_equal(gguf_version(f), v);
                assert_int_equal(gguf_tensor_count(f), 2);
                gguf_close(f);
                free(copy);
                free(b.d);
                memset(&b, 0, sizeof(b));
        }
        build(&b, 1, two_tensors, 2, 0, 66);
        expect_refused(&b, EPROTONOSUPPORT, "<buffer>: GGUF version 1 is not supported",
                       "version 2 or 3 expected");
        build(&b, 4, two_tensors, 2, 0, 66);
        expect_refused(&b, EPROTONOSUPPORT, "GGUF version 4 is not supported", NULL);
        build(&b, 0x03000000, two_tensors, 2, 0, 66);
        expect_refused(&b, EPROTONOSUPPORT, "big-endian GGUF", "little-endian expected");

        build(&b, 3, two_tensors, 2, 0, 66);
        memcpy(b.d, "GGML", 4);
        expect_refused(&b, EBADMSG, "not a GGUF file: magic 47 47 4d 4c", "\"GGUF\" expected");
        put(&b, "GGUF\x03", 5);
        expect_refused(&b, EBADMSG, "file is 5 bytes, too short for a GGUF header (24 bytes)",
                       NULL);
        expect_refused(&b, EBADMSG, "file is 0 bytes", NULL);
}

static void test_alignment(void **state) {
        struct buf b = { 0 };
        struct gguf_file *f;
        void *copy;
        const struct gguf_tensor *t;
        const struct tspec ts64[] = {
                { "a.weight", 2, { 4, 2 }, GGML_TYPE_F32, 0 },
                { "b.weight", 1, { 32 }, GGML_TYPE_Q8_0, 64 },
        };
        const struct tspec ts1[] = {
                { "a.weight", 2, { 4, 2 }, GGML_TYPE_F32, 0 },
                { "b.weight", 1, { 32 }, GGML_TYPE_Q8_0, 33 },
        };

        (void) state;
        /* absent: 32 */
        build(&b, 3, two_tensors, 2, 0, 66);
        f = open_ok(&b, &copy);
        assert_int_equal(gguf_alignment(f), 32);
        assert_int_equal(gguf_data_offset(f) % 32, 0);
        assert_int_equal(gguf_data_offset(f) + 66, gguf_file_size(f));
        t = gguf_tensor_find(f, "b.weight");
        assert_non_null(t);
        assert_ptr_equal(t->data, (const uint8_t *) copy + gguf_data_offset(f) + 32);
        gguf_close(f);
        free(copy);
        free(b.d);
        memset(&b, 0, sizeof(b));

        /* custom 64 */
        build(&b, 3, ts64, 2, 64, 98);
        f = open_ok(&b, &copy);
        assert_int_equal(gguf_alignment(f), 64);
        assert_int_equal(gguf_data_offset(f) % 64, 0);
        assert_int_equal(gguf_tensor_find(f, "b.weight")->offset, 64);
        gguf_close(f);
        free(copy);
        free(b.d);
        memset(&b, 0, sizeof(b));

        /* 1: any offset is aligned */
        build(&b, 3, ts1, 2, 1, 67);
        f = open_ok(&b, &copy);
        assert_int_equal(gguf_alignment(f), 1);
        gguf_close(f);
        free(copy);
        free(b.d);
        memset(&b, 0, sizeof(b));

        /* 32 by default: offset 33 refused */
        build(&b, 3, ts1, 2, 0, 67);
        expect_refused(&b, EBADMSG,
                       "tensor 'b.weight': data offset 33 is not a multiple of the alignment 32",
                       NULL);
        build(&b, 3, ts64, 2, 128, 98);
        expect_refused(&b, EBADMSG, "offset 64 is not a multiple of the alignment 128", NULL);

        /* invalid values */
        build(&b, 3, two_tensors, 2, 48, 66);
        expect_refused(&b, EBADMSG, "general.alignment is 48 (a power of two from 1 to 1048576",
                       NULL);
        build(&b, 3, two_tensors, 2, 2u << 20, 66);
        expect_refused(&b, EBADMSG, "general.alignment is 2097152", NULL);

        put_header(&b, 3, 0, 1);
        put_kv_u32(&b, "general.alignment", 0);
        expect_refused(&b, EBADMSG, "general.alignment is 0 (a power of two", NULL);
        put_header(&b, 3, 0, 1);
        put_kv(&b, "general.alignment", GGUF_TYPE_INT32);
        put_u32(&b, (uint32_t) -32);
        expect_refused(&b, EBADMSG, "general.alignment is -32", NULL);
        put_header(&b, 3, 0, 1);
        put_kv_str(&b, "general.alignment", "32");
        expect_refused(&b, EBADMSG, "general.alignment: an integer expected, file has string",
                       NULL);

        /* other integer widths are accepted */
        put_header(&b, 3, 0, 1);
        put_kv(&b, "general.alignment", GGUF_TYPE_UINT64);
        put_u64(&b, 16);
        f = open_ok(&b, &copy);
        assert_int_equal(gguf_alignment(f), 16);
        gguf_close(f);
        free(copy);
        free(b.d);
}

/* ---- corruptions, one at a time ---- */

static void test_bad_counts_and_strings(void **state) {
        struct buf b = { 0 };

        (void) state;
        put_header(&b, 3, 0, UINT64_MAX);
        put_kv_u32(&b, "a", 1);
        expect_refused(&b, EBADMSG, "kv count 18446744073709551615 cannot fit in the 17 bytes left",
                       NULL);
        put_header(&b, 3, 1ull << 40, 1);
        put_kv_u32(&b, "a", 1);
        expect_refused(&b, EBADMSG, "tensor count 1099511627776 cannot fit", NULL);

        /* key length beyond the file */
        put_header(&b, 3, 0, 1);
        put_u64(&b, 1000);
        put(&b, "abcdefghijklmnop", 16);
        expect_refused(&b, EBADMSG, "key #0: string length 1000 at offset 24 extends past the end",
                       NULL);
        put_header(&b, 3, 0, 1);
        put_u64(&b, UINT64_MAX);
        put(&b, "abcdefgh", 8);
        expect_refused(&b, EBADMSG, "string length 18446744073709551615", NULL);
        /* string value length beyond the file */
        put_header(&b, 3, 0, 1);
        put_kv(&b, "name", GGUF_TYPE_STRING);
        put_u64(&b, 50);
        put(&b, "short", 5);
        expect_refused(&b, EBADMSG, "string value of key 'name': string length 50", NULL);
        /* empty key, NUL in key */
        put_header(&b, 3, 0, 1);
        put_kv_u32(&b, "", 1);
        expect_refused(&b, EBADMSG, "key #0 at offset 24 is empty", NULL);
        put_header(&b, 3, 0, 1);
        put_strn(&b, "a\0b", 3);
        put_u32(&b, GGUF_TYPE_UINT8);
        put_u8(&b, 1);
        expect_refused(&b, EBADMSG, "key #0 at offset 24 contains a NUL byte", NULL);

        /* over-long key (GGUF caps keys at 65535 bytes) */
        {
                char *key = malloc(65537);
                assert_non_null(key);
                memset(key, 'k', 65536);
                key[65536] = 0;
                put_header(&b, 3, 0, 1);
                put_kv_u32(&b, key, 1);
                free(key);
                expect_refused(&b, EBADMSG, "key #0 at offset 24 is 65536 bytes long",
                               "(at most 65535 expected)");
        }
        put_header(&b, 3, 1, 0);
        put_tensor_info(&b, "", 1, (const uint64_t[]) { 1 }, GGML_TYPE_F32, 0);
        pad_to(&b, 32);
        put_data(&b, 4);
        expect_refused(&b, EBADMSG, "name of tensor #0 at offset 24 is empty", NULL);

        /* bad UTF-8: key, value, array element, tensor name; overlong and surrogate forms */
        put_header(&b, 3, 0, 1);
        put_kv_u32(&b, "ab\xff", 1);
        expect_refused(&b, EBADMSG, "key #0 at offset 24: invalid UTF-8 at byte 2 (0xff) of 3",
                       NULL);
        put_header(&b, 3, 0, 2);
        put_kv_u32(&b, "ok", 1);
        put_kv_str(&b, "v", "x\xc0\xafy");
        expect_refused(&b, EBADMSG, "string value of key 'v'", "invalid UTF-8 at byte 1 (0xc0)");
        /* long ASCII runs with valid multi-byte characters, then a stray continuation byte */
        put_header(&b, 3, 0, 1);
        put_kv_str(&b, "v", "abcdefghij\xc3\xa9klmnopqrstuvwxyz\xe2\x96\x81" "ABCDEFGHIJKLMNOP\x80" "QRS");
        expect_refused(&b, EBADMSG, "invalid UTF-8 at byte 47 (0x80) of 51", NULL);
        put_header(&b, 3, 0, 1);
        put_kv_str(&b, "v", "\xed\xa0\x80");
        expect_refused(&b, EBADMSG, "invalid UTF-8 at byte 0 (0xed)", NULL);
        put_header(&b, 3, 0, 1);
        put_kv_str(&b, "v", "\xf4\x90\x80\x80"); /* U+110000 */
        expect_refused(&b, EBADMSG, "invalid UTF-8", NULL);
        put_header(&b, 3, 0, 1);
        put_kv_str(&b, "v", "\xe2\x9c"); /* cut sequence */
        expect_refused(&b, EBADMSG, "invalid UTF-8 at byte 0 (0xe2) of 2", NULL);
        put_header(&b, 3, 0, 1);
        put_kv(&b, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
        put_arr_head(&b, GGUF_TYPE_STRING, 3);
        put_str(&b, "a");
        put_str(&b, "b");
        put_str(&b, "\x80");
        expect_refused(&b, EBADMSG, "string key 'tokenizer.ggml.tokens'[2]", "invalid UTF-8");
        put_header(&b, 3, 1, 0);
        put_tensor_info(&b, "w\xfe", 1, (const uint64_t[]) { 1 }, GGML_TYPE_F32, 0);
        pad_to(&b, 32);
        put_data(&b, 4);
        expect_refused(&b, EBADMSG, "name of tensor #0", "invalid UTF-8");

        /* invalid types and bools */
        put_header(&b, 3, 0, 1);
        put_kv(&b, "k", 13);
        put_u8(&b, 0);
        expect_refused(&b, EBADMSG, "key 'k': invalid value type 13 at offset 33 (0..12 expected)",
                       NULL);
        put_header(&b, 3, 0, 1);
        put_kv(&b, "k", GGUF_TYPE_ARRAY);
        put_arr_head(&b, 99, 0);
        expect_refused(&b, EBADMSG, "key 'k': invalid array element type 99", NULL);
        put_header(&b, 3, 0, 1);
        put_kv(&b, "k", GGUF_TYPE_ARRAY);
        put_arr_head(&b, GGUF_TYPE_ARRAY, 1);
        put_arr_head(&b, 0x7fffffff, 0);
        expect_refused(&b, EBADMSG, "key 'k'[0]: invalid array element type 2147483647", NULL);
        put_header(&b, 3, 0, 1);
        put_kv(&b, "k", GGUF_TYPE_BOOL);
        put_u8(&b, 2);
        expect_refused(&b, EBADMSG, "key 'k': bool value 2", "(0 or 1 expected)");
        put_header(&b, 3, 0, 1);
        put_kv(&b, "k", GGUF_TYPE_ARRAY);
        put_arr_head(&b, GGUF_TYPE_BOOL, 3);
        put(&b, "\x01\x00\x05", 3);
        expect_refused(&b, EBADMSG, "key 'k'[2]: bool value 5", NULL);

        /* absurd array counts fail before allocating */
        put_header(&b, 3, 0, 1);
        put_kv(&b, "k", GGUF_TYPE_ARRAY);
        put_arr_head(&b, GGUF_TYPE_STRING, UINT64_MAX / 4);
        put_str(&b, "a");
        expect_refused(&b, EBADMSG, "key 'k': array of 4611686018427387903 string elements",
                       "cannot fit in the 9 bytes left");
        put_header(&b, 3, 0, 1);
        put_kv(&b, "k", GGUF_TYPE_ARRAY);
        put_arr_head(&b, GGUF_TYPE_UINT64, UINT64_MAX / 2);
        expect_refused(&b, EBADMSG, "array of 9223372036854775807 uint64 elements", NULL);

        /* nesting: 8 levels are fine, 9 are refused */
        for (int depth = 8; depth <= 9; depth++) {
                put_header(&b, 3, 0, 1);
                put_kv(&b, "deep", GGUF_TYPE_ARRAY);
                for (int d = 1; d < depth; d++)
                        put_arr_head(&b, GGUF_TYPE_ARRAY, 1);
                put_arr_head(&b, GGUF_TYPE_UINT8, 1);
                put_u8(&b, 42);
                if (depth == 8) {
                        void *copy;
                        struct gguf_file *f = open_ok(&b, &copy);
                        const struct gguf_value *a;
                        struct gguf_value e;
                        uint64_t u;
                        assert_int_equal(gguf_get_array(f, "deep", &a), 0);
                        e = *a;
                        for (int d = 1; d < depth; d++)
                                assert_int_equal(gguf_array_get_array(&e, 0, &e), 0);
                        assert_int_equal(gguf_array_get_u64(&e, 0, &u), 0);
                        assert_int_equal(u, 42);
                        gguf_close(f);
                        free(copy);
                        free(b.d);
                        memset(&b, 0, sizeof(b));
                } else
                        expect_refused(&b, EBADMSG,
                                       "key 'deep'[0][0][0][0][0][0][0][0]: arrays nested deeper "
                                       "than 8 levels",
                                       NULL);
        }

        /* duplicate keys */
        put_header(&b, 3, 0, 3);
        put_kv_u32(&b, "a", 1);
        put_kv_u32(&b, "b", 1);
        put_kv_str(&b, "a", "again");
        expect_refused(&b, EBADMSG, "duplicate key 'a' (entries #0 and #2)", NULL);
}

static void test_bad_tensors(void **state) {
        struct buf b = { 0 };

        (void) state;
        build(&b, 3,
              (const struct tspec[]) { { "w", 2, { 4, 2 }, GGML_TYPE_F32, 0 },
                                       { "w", 1, { 8 }, GGML_TYPE_F32, 32 } },
              2, 0, 64);
        expect_refused(&b, EBADMSG, "duplicate tensor name 'w' (tensors #0 and #1)", NULL);

        build(&b, 3, (const struct tspec[]) { { "w", 0, { 0 }, GGML_TYPE_F32, 0 } }, 1, 0, 64);
        expect_refused(&b, EBADMSG, "tensor 'w': n_dims 0", "(1 to 4 expected)");
        build(&b, 3, (const struct tspec[]) { { "w", 5, { 1, 1, 1, 1 }, GGML_TYPE_F32, 0 } }, 1, 0,
              64);
        expect_refused(&b, EBADMSG, "tensor 'w': n_dims 5", NULL);
        build(&b, 3, (const struct tspec[]) { { "w", 3, { 4, 0, 2 }, GGML_TYPE_F32, 0 } }, 1, 0,
              64);
        expect_refused(&b, EBADMSG, "tensor 'w': dimension 0 in ne[1]", NULL);
        build(&b, 3,
              (const struct tspec[]) {
                      { "w", 3, { 1ull << 32, 1ull << 30, 4 }, GGML_TYPE_F32, 0 } },
              1, 0, 64);
        expect_refused(&b, EOVERFLOW, "tensor 'w': element count overflows at ne[2] = 4", NULL);
        build(&b, 3,
              (const struct tspec[]) { { "w", 2, { 1ull << 40, 1ull << 22 }, GGML_TYPE_F32, 0 } },
              1, 0, 64);
        expect_refused(&b, EOVERFLOW, "tensor 'w': byte size of 4194304 rows of 1099511627776 F32",
                       "overflows 64 bits");
        build(&b, 3, (const struct tspec[]) { { "w", 1, { 32 }, 4, 0 } }, 1, 0, 64);
        expect_refused(&b, EBADMSG, "tensor 'w': unknown ggml type 4", NULL);
        build(&b, 3, (const struct tspec[]) { { "w", 1, { 32 }, 1000, 0 } }, 1, 0, 64);
        expect_refused(&b, EBADMSG, "tensor 'w': unknown ggml type 1000", NULL);
        build(&b, 3, (const struct tspec[]) { { "w", 2, { 33, 2 }, GGML_TYPE_Q8_0, 0 } }, 1, 0,
              128);
        expect_refused(&b, EBADMSG,
                       "tensor 'w': row of ne[0] = 33 values is not a whole number of Q8_0 "
                       "blocks (32 values each)",
                       NULL);
        build(&b, 3, (const struct tspec[]) { { "w", 1, { 255 }, GGML_TYPE_Q6_K, 0 } }, 1, 0, 256);
        expect_refused(&b, EBADMSG, "not a whole number of Q6_K blocks (256 values each)", NULL);

        /* data past the end: one byte short, and an offset that overflows */
        build(&b, 3, two_tensors, 2, 0, 65);
        expect_refused(&b, EBADMSG, "tensor 'b.weight': data [offset 192, size 34] extends past "
                                    "the end of the file (size 225)",
                       NULL);
        build(&b, 3,
              (const struct tspec[]) { { "w", 1, { 8 }, GGML_TYPE_F32, UINT64_MAX - 31 } }, 1, 0,
              32);
        expect_refused(&b, EBADMSG, "tensor 'w': data [offset 18446744073709551584, size 32] "
                                    "extends past the end of the file",
                       NULL);
        /* overlapping (listed out of offset order, so only a sort finds it) */
        build(&b, 3,
              (const struct tspec[]) { { "c", 1, { 8 }, GGML_TYPE_F32, 64 },
                                       { "a", 1, { 16 }, GGML_TYPE_F32, 0 },
                                       { "b", 1, { 8 }, GGML_TYPE_F32, 32 } },
              3, 0, 96);
        expect_refused(&b, EBADMSG, "tensor 'b' data [offset 32, size 32] overlaps tensor 'a' "
                                    "[offset 0, size 64]",
                       NULL);
        /* the data section itself past the end: the padding is missing */
        build(&b, 3, two_tensors, 2, 0, 0);
        b.n -= 1;
        expect_refused(&b, EBADMSG, "data section starts at offset 160 (the tensor table ends at 156, aligned to 32)", "past the end of the file");
}

/* ---- truncation at every byte ---- */

static void build_small_valid(struct buf *b) {
        put_header(b, 3, 2, 6);
        put_kv_str(b, "general.architecture", "xing4_0");
        put_kv_u32(b, "general.alignment", 16);
        put_kv(b, "f", GGUF_TYPE_FLOAT32);
        put_f32(b, 1e-6f);
        put_kv(b, "tokens", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_STRING, 3);
        put_str(b, "<s>");
        put_str(b, "");
        put_str(b, "\xe2\x96\x81the");
        put_kv(b, "nested", GGUF_TYPE_ARRAY);
        put_arr_head(b, GGUF_TYPE_ARRAY, 2);
        put_arr_head(b, GGUF_TYPE_INT16, 1);
        put_u16(b, 9);
        put_arr_head(b, GGUF_TYPE_STRING, 1);
        put_str(b, "z");
        put_kv(b, "b", GGUF_TYPE_BOOL);
        put_u8(b, 1);
        put_tensor_info(b, "x.weight", 2, (const uint64_t[]) { 4, 2 }, GGML_TYPE_BF16, 0);
        put_tensor_info(b, "y.weight", 1, (const uint64_t[]) { 32 }, GGML_TYPE_IQ4_NL, 16);
        pad_to(b, 16);
        put_data(b, 16 + 18);
}

static void test_truncation_every_offset(void **state) {
        struct buf b = { 0 };
        struct gguf_file *f;
        void *copy;

        (void) state;
        build_small_valid(&b);
        f = open_ok(&b, &copy);
        assert_int_equal(gguf_tensor_count(f), 2);
        assert_int_equal(gguf_kv_count(f), 6);
        gguf_close(f);
        free(copy);

        for (size_t n = 0; n < b.n; n++) {
                struct buf prefix = { .d = b.d, .n = n };
                f = NULL;
                log_clear_last_error();
                int r = open_copy(&prefix, &f, &copy);
                if (r >= 0)
                        fail_msg("prefix of %zu of %zu bytes accepted", n, b.n);
                assert_null(f);
                assert_int_equal(r, -EBADMSG);
                if (log_last_error()[0] == 0)
                        fail_msg("prefix of %zu bytes refused without a message", n);
                assert_contains(log_last_error(), "<buffer>: ");
                free(copy);
        }
        /* a cut in the middle of the string array names the element */
        {
                struct buf prefix = { .d = b.d, .n = 24 + (8 + 20 + 4 + 8 + 7) + (8 + 17 + 4 + 4) +
                                                     (8 + 1 + 4 + 4) + (8 + 6 + 4 + 12) + (8 + 3) +
                                                     8 + 8 + 3 };
                f = NULL;
                log_clear_last_error();
                assert_int_equal(open_copy(&prefix, &f, &copy), -EBADMSG);
                assert_contains(log_last_error(), "key 'tokens'[2]");
                free(copy);
        }
        free(b.d);
}

/* ---- real files ---- */

static void test_fixture(void **state) {
        _cleanup_(gguf_closep) struct gguf_file *f = NULL;
        char path[4096];
        const char *dir = getenv("X4_FIXTURES");
        const struct gguf_tensor *t;
        const struct gguf_value *tokens;
        struct gguf_string s;
        uint32_t u32;
        uint64_t prev_end = 0;

        (void) state;
        snprintf(path, sizeof path, "%s/xing4-tiny-a/model.gguf", dir ? dir : X4_FIXTURES);
        log_clear_last_error();
        if (gguf_open(path, &f) < 0)
                fail_msg("%s", log_last_error());
        assert_string_equal(gguf_path(f), path);
        assert_int_equal(gguf_version(f), 3);
        assert_int_equal(gguf_alignment(f), 32);
        assert_int_equal(gguf_kv_count(f), 53);
        assert_int_equal(gguf_tensor_count(f), 70);
        assert_int_equal(gguf_get_string(f, "general.architecture", &s), 0);
        assert_int_equal(s.len, 7);
        assert_memory_equal(s.data, "xing4_0", 7);
        assert_int_equal(gguf_get_u32(f, "general.file_type", &u32), 0);
        assert_int_equal(u32, 25);
        assert_int_equal(gguf_get_u32(f, "xing4_0.block_count", &u32), 0);
        assert_int_equal(u32, 3);

        t = gguf_tensor_find(f, "token_embd.weight");
        assert_non_null(t);
        assert_int_equal(t->type, GGML_TYPE_BF16);
        assert_int_equal(t->n_dims, 2);
        assert_int_equal(t->ne[0], 256);
        assert_int_equal(t->ne[1], 512);
        assert_int_equal(t->size, 256 * 512 * 2);
        t = gguf_tensor_find(f, "output.weight");
        assert_non_null(t);
        assert_int_equal(t->type, GGML_TYPE_Q6_K);
        assert_int_equal(t->size, 512 * 210);
        assert_null(gguf_tensor_find(f, "blk.3.attn_norm.weight"));

        /* the vocabulary: 512 pieces, byte pieces from id 140 (fixture README) */
        assert_int_equal(gguf_get_array(f, "tokenizer.ggml.tokens", &tokens), 0);
        assert_int_equal(tokens->arr.elem_type, GGUF_TYPE_STRING);
        assert_int_equal(tokens->arr.n, 512);
        assert_int_equal(gguf_array_get_string(tokens, 140, &s), 0);
        assert_int_equal(s.len, 6);
        assert_memory_equal(s.data, "<0x00>", 6);

        /* every tensor is found by name, and the data regions tile the data section in order */
        for (size_t i = 0; i < gguf_tensor_count(f); i++) {
                t = gguf_tensor_at(f, i);
                assert_ptr_equal(gguf_tensor_find(f, t->name), t);
                assert_true(t->offset >= prev_end);
                prev_end = t->offset + t->size;
                assert_true(gguf_data_offset(f) + prev_end <= gguf_file_size(f));
        }
}

static void test_open_errors(void **state) {
        struct gguf_file *f = NULL;
        char dir[] = "/tmp/x4-gguf-test-XXXXXX";

        (void) state;
        log_clear_last_error();
        assert_int_equal(gguf_open("/nonexistent-x4/dir/model.gguf", &f), -ENOENT);
        assert_null(f);
        assert_string_equal(log_last_error(), "/nonexistent-x4/dir/model.gguf: cannot open model "
                                              "file: No such file or directory");
        assert_non_null(mkdtemp(dir));
        assert_int_equal(gguf_open(dir, &f), -EBADMSG);
        assert_contains(log_last_error(), "not a regular file");
        assert_int_equal(rmdir(dir), 0);
}

static void test_open_real_file(void **state) {
        struct buf b = { 0 };
        char path[] = "/tmp/x4-gguf-test-XXXXXX";
        _cleanup_(gguf_closep) struct gguf_file *f = NULL;
        const struct gguf_tensor *t;
        int fd;

        (void) state;
        build_small_valid(&b);
        fd = mkstemp(path);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, b.d, b.n), (ssize_t) b.n);
        assert_int_equal(close(fd), 0);

        log_clear_last_error();
        if (gguf_open(path, &f) < 0)
                fail_msg("%s", log_last_error());
        assert_string_equal(gguf_path(f), path);
        assert_int_equal(gguf_file_size(f), b.n);
        assert_int_equal(gguf_alignment(f), 16);
        t = gguf_tensor_find(f, "y.weight");
        assert_non_null(t);
        assert_int_equal(t->type, GGML_TYPE_IQ4_NL);
        assert_int_equal(t->size, 18);
        /* the data is the file's bytes at data_offset + offset */
        assert_memory_equal(t->data, b.d + gguf_data_offset(f) + 16, 18);
        gguf_close(TAKE_PTR(f));

        /* the same file cut short, and empty, name the path */
        assert_int_equal(truncate(path, (off_t) b.n - 1), 0);
        assert_int_equal(gguf_open(path, &f), -EBADMSG);
        assert_contains(log_last_error(), path);
        assert_contains(log_last_error(), "tensor 'y.weight': data [offset");
        assert_int_equal(truncate(path, 0), 0);
        assert_int_equal(gguf_open(path, &f), -EBADMSG);
        assert_contains(log_last_error(), "file is 0 bytes, too short");
        assert_int_equal(unlink(path), 0);
        free(b.d);
}

/* ---- scale: the real file's shape ---- */

static void test_scale(void **state) {
        struct buf b = { 0 };
        struct gguf_file *f;
        void *copy;
        char name[64];
        const struct gguf_value *tokens;
        struct gguf_string s;
        double t0, open_ms, find_ms;
        const size_t n_tensors = 977, n_vocab = 131072, n_keys = 100000;

        (void) state;
        /* 977 tensors and a 131072-piece vocabulary (docs/model.md §2.4, §2.3) */
        put_header(&b, 3, n_tensors, 3);
        put_kv_str(&b, "general.architecture", "xing4_0");
        put_kv(&b, "tokenizer.ggml.scores", GGUF_TYPE_ARRAY);
        put_arr_head(&b, GGUF_TYPE_FLOAT32, n_vocab);
        for (size_t i = 0; i < n_vocab; i++)
                put_f32(&b, -(float) i);
        put_kv(&b, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
        put_arr_head(&b, GGUF_TYPE_STRING, n_vocab);
        for (size_t i = 0; i < n_vocab; i++) {
                snprintf(name, sizeof name, "\xe2\x96\x81tok%zu", i);
                put_str(&b, name);
        }
        for (size_t i = 0; i < n_tensors; i++) {
                snprintf(name, sizeof name, "blk.%zu.ffn_up_exps.weight", i);
                put_tensor_info(&b, name, 1, (const uint64_t[]) { 8 }, GGML_TYPE_F32, i * 32);
        }
        pad_to(&b, 32);
        put_data(&b, n_tensors * 32);

        t0 = now_ms();
        f = open_ok(&b, &copy);
        open_ms = now_ms() - t0;
        t0 = now_ms();
        for (int rep = 0; rep < 10; rep++)
                for (size_t i = 0; i < n_tensors; i++) {
                        snprintf(name, sizeof name, "blk.%zu.ffn_up_exps.weight", i);
                        const struct gguf_tensor *t = gguf_tensor_find(f, name);
                        assert_non_null(t);
                        assert_int_equal(t->offset, i * 32);
                }
        find_ms = now_ms() - t0;
        assert_int_equal(gguf_get_array(f, "tokenizer.ggml.tokens", &tokens), 0);
        assert_int_equal(gguf_array_get_string(tokens, n_vocab - 1, &s), 0);
        assert_int_equal(s.len, strlen("\xe2\x96\x81tok131071"));
        assert_memory_equal(s.data, "\xe2\x96\x81tok131071", s.len);
        /* what the tokenizer does at load: every piece and score through the element getters */
        {
                const struct gguf_value *scores;
                uint64_t bytes = 0;
                double d, sum = 0;
                t0 = now_ms();
                assert_int_equal(gguf_get_array(f, "tokenizer.ggml.scores", &scores), 0);
                for (size_t i = 0; i < n_vocab; i++) {
                        assert_int_equal(gguf_array_get_string(tokens, i, &s), 0);
                        bytes += s.len;
                        assert_int_equal(gguf_array_get_f64(scores, i, &d), 0);
                        sum += d;
                }
                print_message("131072 pieces + scores read in %.2f ms\n", now_ms() - t0);
                assert_true(now_ms() - t0 < 500.0);
                assert_true(sum == -(double) n_vocab * (n_vocab - 1) / 2);
                assert_true(bytes > 3 * n_vocab);
        }
        print_message("977 tensors + 131072 tokens (%zu bytes): open %.2f ms, 9770 finds %.2f ms\n",
                      b.n, open_ms, find_ms);
        /* Milliseconds, not seconds: ~6 ms / 2 ms unloaded at -O2 (~40 ms under ASan). The bounds
         * leave room for a loaded CI machine and sanitizers; quadratic work would take seconds. */
        assert_true(open_ms < 500.0);
        assert_true(find_ms < 500.0);
        gguf_close(f);
        free(copy);
        free(b.d);
        memset(&b, 0, sizeof(b));

        /* 100k keys */
        put_header(&b, 3, 0, n_keys);
        for (size_t i = 0; i < n_keys; i++) {
                snprintf(name, sizeof name, "key.%zu", i);
                put_kv_u32(&b, name, (uint32_t) i);
        }
        t0 = now_ms();
        f = open_ok(&b, &copy);
        open_ms = now_ms() - t0;
        t0 = now_ms();
        for (size_t i = 0; i < n_keys; i++) {
                uint32_t v;
                snprintf(name, sizeof name, "key.%zu", i);
                assert_int_equal(gguf_get_u32(f, name, &v), 0);
                assert_int_equal(v, i);
        }
        find_ms = now_ms() - t0;
        print_message("100000 keys: open %.2f ms, 100000 gets %.2f ms\n", open_ms, find_ms);
        assert_true(open_ms < 1000.0);
        assert_true(find_ms < 1000.0);
        gguf_close(f);
        free(copy);
        free(b.d);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_value_roundtrip),
                cmocka_unit_test(test_getter_errors),
                cmocka_unit_test(test_versions),
                cmocka_unit_test(test_alignment),
                cmocka_unit_test(test_bad_counts_and_strings),
                cmocka_unit_test(test_bad_tensors),
                cmocka_unit_test(test_truncation_every_offset),
                cmocka_unit_test(test_fixture),
                cmocka_unit_test(test_open_errors),
                cmocka_unit_test(test_open_real_file),
                cmocka_unit_test(test_scale),
        };

        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
