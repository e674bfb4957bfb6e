/* SPDX-License-Identifier: MIT */
/* A small JSON (RFC 8259) value tree: parse with line/column errors, build, serialize.
 * Objects keep insertion order (chat templates iterate them; tojson must be byte-exact).
 * Used for config.json, x4-template contexts and the chat renderer's tojson. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

enum json_type {
        JSON_NULL,
        JSON_BOOL,
        JSON_INT,    /* integers that fit int64 */
        JSON_DOUBLE, /* everything else numeric */
        JSON_STRING,
        JSON_ARRAY,
        JSON_OBJECT,
};

struct json_value;

#define JSON_DEPTH_MAX 256

/* Parse UTF-8 text (must be valid UTF-8; surrogate escapes paired). On error returns -EBADMSG
 * and writes "<what>: line L column C: <why>" into err (error_set(), common/log.h; what = name, e.g. the path; columns count characters,
 * both 1-based). Depth limited to JSON_DEPTH_MAX: deeper arrays and objects are refused with
 * -E2BIG, same message (the text may be valid JSON; it is more than this parser takes).
 * Strict RFC 8259: no NaN/Infinity literals, no trailing commas, no comments; a leading UTF-8 BOM is skipped. Integers outside int64 and numbers with a
 * fraction or exponent become JSON_DOUBLE (strtod in the C locale; overflow gives ±inf like
 * Python's float()). Duplicate keys: the last value wins at the first key's position.
 * json_parse_file says "<path>: cannot open: <strerror>" and returns -errno when it can't read. */
int json_parse(const char *text, size_t len, const char *what, struct json_value **ret, char *err,
               size_t err_size);
int json_parse_file(const char *path, struct json_value **ret, char *err, size_t err_size);
void json_free(struct json_value *v);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct json_value *, json_free);

/* Accessors accept NULL (e.g. a missing json_object_get result) and values of the wrong type:
 * they answer JSON_NULL / false / 0 / NULL / 0 then. json_int is 0 for a DOUBLE. */
enum json_type json_type(const struct json_value *v);
bool json_bool(const struct json_value *v);
int64_t json_int(const struct json_value *v);
double json_number(const struct json_value *v); /* INT or DOUBLE as double */
const char *json_string(const struct json_value *v); /* NUL-terminated (may contain NUL: see len) */
size_t json_string_len(const struct json_value *v);
size_t json_count(const struct json_value *v); /* array elements / object members */
struct json_value *json_array_at(const struct json_value *v, size_t i);
const char *json_object_key_at(const struct json_value *v, size_t i);
struct json_value *json_object_value_at(const struct json_value *v, size_t i);
struct json_value *json_object_get(const struct json_value *v, const char *key); /* NULL if absent */

/* Builders (return NULL on OOM). Containers take ownership of added values, also when they fail
 * (the value is freed then), so `json_array_append(a, json_new_int(1))` needs no check of the inner
 * call: a NULL value gives -ENOMEM, a non-container -EINVAL. Strings are copied; they should be
 * UTF-8 (json_dump writes invalid bytes as U+FFFD). */
struct json_value *json_new_null(void);
struct json_value *json_new_bool(bool b);
struct json_value *json_new_int(int64_t i);
struct json_value *json_new_double(double d);
struct json_value *json_new_string(const char *s, size_t len);
struct json_value *json_new_array(void);
struct json_value *json_new_object(void);
int json_array_append(struct json_value *arr, struct json_value *v);
int json_object_set(struct json_value *obj, const char *key, struct json_value *v); /* replaces */

/* Serialize, byte-exact with CPython's json.dumps. flags: JSON_COMPACT (no spaces) or Python
 * json.dumps style ", " / ": " separators (the default, what HF's tojson produces), JSON_ASCII
 * escapes non-ASCII (and DEL) as \uxxxx like ensure_ascii=True, JSON_SORT_KEYS (code point order).
 * indent > 0 pretty-prints like json.dumps(indent=N) (item separator "," then); indent <= 0 is one
 * line. Doubles print like repr(float) (inf/nan as Infinity/NaN, as Python does). Returns a
 * malloc'ed string, NULL on OOM. */
#define JSON_COMPACT 1u
#define JSON_ASCII 2u
#define JSON_SORT_KEYS 4u
char *json_dump(const struct json_value *v, unsigned flags, int indent);
