/* SPDX-License-Identifier: MIT */
/* JSON (RFC 8259): a strict recursive-descent parser with line/column errors and a serializer
 * whose output matches CPython's json.dumps byte for byte (chat templates' tojson must render
 * exactly what the model saw in training, and HF renders with Python). */
#include "common/json.h"

#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"


struct json_member {
        char *key;
        size_t key_len;
        struct json_value *value;
};

struct json_value {
        enum json_type type;
        union {
                bool b;
                int64_t i;
                double d;
                struct {
                        char *s;
                        size_t len;
                } str;
                struct {
                        struct json_value **items;
                        size_t n, cap;
                } arr;
                struct {
                        struct json_member *m;
                        size_t n, cap;
                } obj;
        };
};

/* Numbers are read and written in the C locale whatever the process's locale says. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void) {
        c_locale = newlocale(LC_ALL_MASK, "C", (locale_t) 0);
}

static locale_t get_c_locale(void) {
        pthread_once(&c_locale_once, c_locale_init);
        return c_locale;
}

/* ---- values ---- */

static struct json_value *json_new(enum json_type type) {
        struct json_value *v = calloc(1, sizeof *v);
        if (v)
                v->type = type;
        return v;
}

struct json_value *json_new_null(void) {
        return json_new(JSON_NULL);
}

struct json_value *json_new_bool(bool b) {
        struct json_value *v = json_new(JSON_BOOL);
        if (v)
                v->b = b;
        return v;
}

struct json_value *json_new_int(int64_t i) {
        struct json_value *v = json_new(JSON_INT);
        if (v)
                v->i = i;
        return v;
}

struct json_value *json_new_double(double d) {
        struct json_value *v = json_new(JSON_DOUBLE);
        if (v)
                v->d = d;
        return v;
}

static struct json_value *json_new_string_take(char *s, size_t len) {
        struct json_value *v = json_new(JSON_STRING);
        if (!v) {
                free(s);
                return NULL;
        }
        v->str.s = s;
        v->str.len = len;
        return v;
}

struct json_value *json_new_string(const char *s, size_t len) {
        char *copy = malloc(len + 1);
        if (!copy)
                return NULL;
        if (len)
                memcpy(copy, s, len);
        copy[len] = 0;
        return json_new_string_take(copy, len);
}

struct json_value *json_new_array(void) {
        return json_new(JSON_ARRAY);
}

struct json_value *json_new_object(void) {
        return json_new(JSON_OBJECT);
}

void json_free(struct json_value *v) {
        if (!v)
                return;
        switch (v->type) {
        case JSON_STRING:
                free(v->str.s);
                break;
        case JSON_ARRAY:
                for (size_t i = 0; i < v->arr.n; i++)
                        json_free(v->arr.items[i]);
                free(v->arr.items);
                break;
        case JSON_OBJECT:
                for (size_t i = 0; i < v->obj.n; i++) {
                        free(v->obj.m[i].key);
                        json_free(v->obj.m[i].value);
                }
                free(v->obj.m);
                break;
        default:
                break;
        }
        free(v);
}

int json_array_append(struct json_value *arr, struct json_value *v) {
        if (!v)
                return -ENOMEM;
        if (!arr || arr->type != JSON_ARRAY) {
                json_free(v);
                return -EINVAL;
        }
        if (arr->arr.n == arr->arr.cap) {
                size_t cap = arr->arr.cap ? arr->arr.cap * 2 : 4;
                struct json_value **items = reallocarray(arr->arr.items, cap, sizeof *items);
                if (!items) {
                        json_free(v);
                        return -ENOMEM;
                }
                arr->arr.items = items;
                arr->arr.cap = cap;
        }
        arr->arr.items[arr->arr.n++] = v;
        return 0;
}

static struct json_member *object_find(const struct json_value *obj, const char *key, size_t len) {
        for (size_t i = 0; i < obj->obj.n; i++)
                if (obj->obj.m[i].key_len == len && memcmp(obj->obj.m[i].key, key, len) == 0)
                        return &obj->obj.m[i];
        return NULL;
}

/* Takes ownership of key (malloc'ed, NUL-terminated) and v, also on failure. A duplicate key keeps
 * its first position and takes the new value (Python's dict semantics). */
static int object_set_take(struct json_value *obj, char *key, size_t len, struct json_value *v) {
        struct json_member *m = object_find(obj, key, len);

        if (m) {
                free(key);
                json_free(m->value);
                m->value = v;
                return 0;
        }
        if (obj->obj.n == obj->obj.cap) {
                size_t cap = obj->obj.cap ? obj->obj.cap * 2 : 4;
                struct json_member *ms = reallocarray(obj->obj.m, cap, sizeof *ms);
                if (!ms) {
                        free(key);
                        json_free(v);
                        return -ENOMEM;
                }
                obj->obj.m = ms;
                obj->obj.cap = cap;
        }
        obj->obj.m[obj->obj.n++] = (struct json_member) { key, len, v };
        return 0;
}

int json_object_set(struct json_value *obj, const char *key, struct json_value *v) {
        if (!v)
                return -ENOMEM;
        if (!obj || obj->type != JSON_OBJECT || !key) {
                json_free(v);
                return -EINVAL;
        }
        char *k = strdup(key);
        if (!k) {
                json_free(v);
                return -ENOMEM;
        }
        return object_set_take(obj, k, strlen(k), v);
}

enum json_type json_type(const struct json_value *v) {
        return v ? v->type : JSON_NULL;
}

bool json_bool(const struct json_value *v) {
        return v && v->type == JSON_BOOL && v->b;
}

int64_t json_int(const struct json_value *v) {
        return v && v->type == JSON_INT ? v->i : 0;
}

double json_number(const struct json_value *v) {
        if (!v)
                return 0;
        if (v->type == JSON_INT)
                return (double) v->i;
        if (v->type == JSON_DOUBLE)
                return v->d;
        return 0;
}

const char *json_string(const struct json_value *v) {
        return v && v->type == JSON_STRING ? v->str.s : NULL;
}

size_t json_string_len(const struct json_value *v) {
        return v && v->type == JSON_STRING ? v->str.len : 0;
}

size_t json_count(const struct json_value *v) {
        if (!v)
                return 0;
        if (v->type == JSON_ARRAY)
                return v->arr.n;
        if (v->type == JSON_OBJECT)
                return v->obj.n;
        return 0;
}

struct json_value *json_array_at(const struct json_value *v, size_t i) {
        if (!v || v->type != JSON_ARRAY || i >= v->arr.n)
                return NULL;
        return v->arr.items[i];
}

const char *json_object_key_at(const struct json_value *v, size_t i) {
        if (!v || v->type != JSON_OBJECT || i >= v->obj.n)
                return NULL;
        return v->obj.m[i].key;
}

struct json_value *json_object_value_at(const struct json_value *v, size_t i) {
        if (!v || v->type != JSON_OBJECT || i >= v->obj.n)
                return NULL;
        return v->obj.m[i].value;
}

struct json_value *json_object_get(const struct json_value *v, const char *key) {
        if (!v || v->type != JSON_OBJECT || !key)
                return NULL;
        struct json_member *m = object_find(v, key, strlen(key));
        return m ? m->value : NULL;
}

/* ---- UTF-8 ---- */

/* Decodes one scalar value at s (n bytes available). Returns its length (1..4), or 0 for an
 * invalid sequence: overlong forms, surrogates, > U+10FFFF, truncated (RFC 3629). */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *ret) {
        uint32_t c;
        size_t len;

        if (n == 0)
                return 0;
        if (s[0] < 0x80) {
                *ret = s[0];
                return 1;
        }
        if (s[0] >= 0xc2 && s[0] <= 0xdf) {
                len = 2;
                c = s[0] & 0x1f;
        } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
                len = 3;
                c = s[0] & 0x0f;
        } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
                len = 4;
                c = s[0] & 0x07;
        } else
                return 0;
        if (n < len)
                return 0;
        for (size_t i = 1; i < len; i++) {
                if ((s[i] & 0xc0) != 0x80)
                        return 0;
                c = (c << 6) | (s[i] & 0x3f);
        }
        if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10ffff)) ||
            (c >= 0xd800 && c <= 0xdfff))
                return 0;
        *ret = c;
        return len;
}

static size_t utf8_encode(uint32_t c, char *out) {
        if (c < 0x80) {
                out[0] = (char) c;
                return 1;
        }
        if (c < 0x800) {
                out[0] = (char) (0xc0 | (c >> 6));
                out[1] = (char) (0x80 | (c & 0x3f));
                return 2;
        }
        if (c < 0x10000) {
                out[0] = (char) (0xe0 | (c >> 12));
                out[1] = (char) (0x80 | ((c >> 6) & 0x3f));
                out[2] = (char) (0x80 | (c & 0x3f));
                return 3;
        }
        out[0] = (char) (0xf0 | (c >> 18));
        out[1] = (char) (0x80 | ((c >> 12) & 0x3f));
        out[2] = (char) (0x80 | ((c >> 6) & 0x3f));
        out[3] = (char) (0x80 | (c & 0x3f));
        return 4;
}

/* ---- parser ---- */

struct parser {
        const char *text;
        size_t len, pos;
        const char *what;
        char *err;
        size_t err_size;
};

/* Fails with "<what>: line L column C: <why>" for byte offset at; columns count characters (UTF-8
 * lead bytes), both 1-based, like an editor shows them. */
_printf_(3, 4) static int parse_error(struct parser *p, size_t at, const char *fmt, ...) {
        char why[256];
        unsigned line = 1, column = 1;
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);

        for (size_t i = 0; i < at && i < p->len; i++) {
                unsigned char c = (unsigned char) p->text[i];
                if (c == '\n') {
                        line++;
                        column = 1;
                } else if ((c & 0xc0) != 0x80)
                        column++;
        }
        return error_set(p->err, p->err_size, EBADMSG, "%s: line %u column %u: %s", p->what, line, column,
                         why);
}

static void skip_ws(struct parser *p) {
        while (p->pos < p->len) {
                char c = p->text[p->pos];
                if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
                        break;
                p->pos++;
        }
}

/* Describes the byte at pos for messages: "'x'", "end of input", "byte 0xC3". */
static const char *describe(struct parser *p, size_t at, char buf[static 16]) {
        if (at >= p->len)
                return "end of input";
        unsigned char c = (unsigned char) p->text[at];
        if (c >= 0x20 && c < 0x7f)
                snprintf(buf, 16, "'%c'", c);
        else
                snprintf(buf, 16, "byte 0x%02X", c);
        return buf;
}

static int hex4(const char *s, uint32_t *ret) {
        uint32_t v = 0;
        for (int i = 0; i < 4; i++) {
                char c = s[i];
                v <<= 4;
                if (c >= '0' && c <= '9')
                        v |= (uint32_t) (c - '0');
                else if (c >= 'a' && c <= 'f')
                        v |= (uint32_t) (c - 'a' + 10);
                else if (c >= 'A' && c <= 'F')
                        v |= (uint32_t) (c - 'A' + 10);
                else
                        return -EINVAL;
        }
        *ret = v;
        return 0;
}

/* At the opening quote. Decoded text never grows (an escape is at least as long as its UTF-8),
 * so one buffer of the raw length suffices. */
static int parse_string(struct parser *p, char **ret, size_t *ret_len) {
        size_t start = p->pos++, end = p->pos;

        while (end < p->len && p->text[end] != '"')
                end += p->text[end] == '\\' ? 2 : 1;
        if (end >= p->len)
                return parse_error(p, start, "unterminated string");

        _cleanup_free_ char *buf = malloc(end - p->pos + 1);
        if (!buf)
                return error_set(p->err, p->err_size, ENOMEM, "%s: out of memory", p->what);
        size_t n = 0;

        while (p->pos < end) {
                unsigned char c = (unsigned char) p->text[p->pos];
                if (c == '\\') {
                        size_t at = p->pos;
                        char e = p->text[p->pos + 1];
                        p->pos += 2;
                        switch (e) {
                        case '"':
                        case '\\':
                        case '/':
                                buf[n++] = e;
                                break;
                        case 'b':
                                buf[n++] = '\b';
                                break;
                        case 'f':
                                buf[n++] = '\f';
                                break;
                        case 'n':
                                buf[n++] = '\n';
                                break;
                        case 'r':
                                buf[n++] = '\r';
                                break;
                        case 't':
                                buf[n++] = '\t';
                                break;
                        case 'u': {
                                uint32_t u, lo;
                                if (end - p->pos < 4 || hex4(p->text + p->pos, &u) < 0)
                                        return parse_error(p, at, "invalid \\u escape: 4 hex digits expected");
                                p->pos += 4;
                                if (u >= 0xdc00 && u <= 0xdfff)
                                        return parse_error(p, at, "lone low surrogate \\u%04x", u);
                                if (u >= 0xd800 && u <= 0xdbff) {
                                        if (end - p->pos < 6 || p->text[p->pos] != '\\' ||
                                            p->text[p->pos + 1] != 'u' ||
                                            hex4(p->text + p->pos + 2, &lo) < 0 || lo < 0xdc00 ||
                                            lo > 0xdfff)
                                                return parse_error(p, at, "lone high surrogate \\u%04x: a \\udc00-\\udfff escape must follow", u);
                                        p->pos += 6;
                                        u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                                }
                                n += utf8_encode(u, buf + n);
                                break;
                        }
                        default: {
                                char d[16];
                                return parse_error(p, at, "invalid escape: %s after '\\'",
                                                   describe(p, at + 1, d));
                        }
                        }
                } else if (c < 0x20) {
                        return parse_error(p, p->pos,
                                           "control character U+%04X in string: must be escaped", c);
                } else if (c < 0x80) {
                        buf[n++] = (char) c;
                        p->pos++;
                } else {
                        uint32_t u;
                        size_t l = utf8_decode((const unsigned char *) p->text + p->pos,
                                               end - p->pos, &u);
                        if (l == 0)
                                return parse_error(p, p->pos, "invalid UTF-8 (byte 0x%02X)", c);
                        memcpy(buf + n, p->text + p->pos, l);
                        n += l;
                        p->pos += l;
                }
        }
        p->pos = end + 1;
        buf[n] = 0;
        *ret = TAKE_PTR(buf);
        *ret_len = n;
        return 0;
}

static bool is_digit(char c) {
        return c >= '0' && c <= '9';
}

static int parse_number(struct parser *p, struct json_value **ret) {
        size_t start = p->pos, i = p->pos;
        bool integral = true;
        char d[16];

        if (i < p->len && p->text[i] == '-')
                i++;
        if (i >= p->len || !is_digit(p->text[i]))
                return parse_error(p, i, "invalid number: digit expected, got %s", describe(p, i, d));
        if (p->text[i] == '0') {
                i++;
                if (i < p->len && is_digit(p->text[i]))
                        return parse_error(p, start, "invalid number: leading zero");
        } else
                while (i < p->len && is_digit(p->text[i]))
                        i++;
        if (i < p->len && p->text[i] == '.') {
                integral = false;
                i++;
                if (i >= p->len || !is_digit(p->text[i]))
                        return parse_error(p, i, "invalid number: digit expected after '.', got %s",
                                           describe(p, i, d));
                while (i < p->len && is_digit(p->text[i]))
                        i++;
        }
        if (i < p->len && (p->text[i] == 'e' || p->text[i] == 'E')) {
                integral = false;
                i++;
                if (i < p->len && (p->text[i] == '+' || p->text[i] == '-'))
                        i++;
                if (i >= p->len || !is_digit(p->text[i]))
                        return parse_error(p, i, "invalid number: exponent digit expected, got %s",
                                           describe(p, i, d));
                while (i < p->len && is_digit(p->text[i]))
                        i++;
        }
        p->pos = i;

        if (integral) {
                bool neg = p->text[start] == '-';
                uint64_t mag = 0, limit = neg ? (uint64_t) INT64_MAX + 1 : (uint64_t) INT64_MAX;
                bool fits = true;
                for (size_t k = start + neg; k < i; k++) {
                        unsigned dig = (unsigned) (p->text[k] - '0');
                        if (mag > (limit - dig) / 10) {
                                fits = false;
                                break;
                        }
                        mag = mag * 10 + dig;
                }
                if (fits) {
                        int64_t v = neg ? (mag == (uint64_t) INT64_MAX + 1 ? INT64_MIN : -(int64_t) mag)
                                        : (int64_t) mag;
                        *ret = json_new_int(v);
                        return *ret ? 0 : error_set(p->err, p->err_size, ENOMEM, "%s: out of memory", p->what);
                }
        }

        /* The text is not NUL-terminated: strtod gets a terminated copy. Out-of-range values
         * become ±inf or ±0 like Python's float(). */
        char small[64];
        _cleanup_free_ char *big = NULL;
        char *s = small;
        size_t n = i - start;
        if (n >= sizeof small) {
                s = big = malloc(n + 1);
                if (!big)
                        return error_set(p->err, p->err_size, ENOMEM, "%s: out of memory", p->what);
        }
        memcpy(s, p->text + start, n);
        s[n] = 0;
        *ret = json_new_double(strtod_l(s, NULL, get_c_locale()));
        return *ret ? 0 : error_set(p->err, p->err_size, ENOMEM, "%s: out of memory", p->what);
}

static int parse_value(struct parser *p, unsigned depth, struct json_value **ret);

/* After an array element or an object member: 0 at ',' and 1 at `close` (either consumed), or
 * the parse error. */
static int after_item(struct parser *p, char close) {
        char d[16];

        skip_ws(p);
        if (p->pos < p->len && (p->text[p->pos] == ',' || p->text[p->pos] == close))
                return p->text[p->pos++] == close;
        return parse_error(p, p->pos, "expected ',' or '%c', got %s", close, describe(p, p->pos, d));
}

static int parse_array(struct parser *p, unsigned depth, struct json_value **ret) {
        _cleanup_(json_freep) struct json_value *arr = json_new_array();
        int r;

        if (!arr)
                return error_set(p->err, p->err_size, ENOMEM, "%s: out of memory", p->what);
        p->pos++; /* [ */
        skip_ws(p);
        if (p->pos < p->len && p->text[p->pos] == ']') {
                p->pos++;
                *ret = TAKE_PTR(arr);
                return 0;
        }
        for (;;) {
                struct json_value *v;
                r = parse_value(p, depth, &v);
                if (r < 0)
                        return r;
                r = json_array_append(arr, v);
                if (r < 0)
                        return error_set(p->err, p->err_size, r, "%s: out of memory", p->what);
                r = after_item(p, ']');
                if (r < 0)
                        return r;
                if (r == 1)
                        break;
        }
        *ret = TAKE_PTR(arr);
        return 0;
}

static int parse_object(struct parser *p, unsigned depth, struct json_value **ret) {
        _cleanup_(json_freep) struct json_value *obj = json_new_object();
        char d[16];
        int r;

        if (!obj)
                return error_set(p->err, p->err_size, ENOMEM, "%s: out of memory", p->what);
        p->pos++; /* { */
        skip_ws(p);
        if (p->pos < p->len && p->text[p->pos] == '}') {
                p->pos++;
                *ret = TAKE_PTR(obj);
                return 0;
        }
        for (;;) {
                _cleanup_free_ char *key = NULL;
                size_t key_len;
                struct json_value *v;

                skip_ws(p);
                if (p->pos >= p->len || p->text[p->pos] != '"')
                        return parse_error(p, p->pos, "expected '\"' to start a member name, got %s",
                                           describe(p, p->pos, d));
                r = parse_string(p, &key, &key_len);
                if (r < 0)
                        return r;
                skip_ws(p);
                if (p->pos >= p->len || p->text[p->pos] != ':')
                        return parse_error(p, p->pos, "expected ':' after member name, got %s",
                                           describe(p, p->pos, d));
                p->pos++;
                r = parse_value(p, depth, &v);
                if (r < 0)
                        return r;
                r = object_set_take(obj, TAKE_PTR(key), key_len, v);
                if (r < 0)
                        return error_set(p->err, p->err_size, r, "%s: out of memory", p->what);
                r = after_item(p, '}');
                if (r < 0)
                        return r;
                if (r == 1)
                        break;
        }
        *ret = TAKE_PTR(obj);
        return 0;
}

static bool match_literal(struct parser *p, const char *lit) {
        size_t n = strlen(lit);
        if (p->len - p->pos < n || memcmp(p->text + p->pos, lit, n) != 0)
                return false;
        p->pos += n;
        return true;
}

static int parse_value(struct parser *p, unsigned depth, struct json_value **ret) {
        char d[16];
        int r;

        skip_ws(p);
        if (p->pos >= p->len)
                return parse_error(p, p->pos, "expected a value, got end of input");

        char c = p->text[p->pos];
        switch (c) {
        case '{':
        case '[':
                if (depth >= JSON_DEPTH_MAX) { /* valid JSON perhaps, but more than we take */
                        (void) parse_error(p, p->pos, "nesting deeper than %d levels", JSON_DEPTH_MAX);
                        return -E2BIG;
                }
                return c == '{' ? parse_object(p, depth + 1, ret) : parse_array(p, depth + 1, ret);
        case '"': {
                char *s;
                size_t n;
                r = parse_string(p, &s, &n);
                if (r < 0)
                        return r;
                *ret = json_new_string_take(s, n);
                break;
        }
        case 't':
        case 'f':
        case 'n':
                if (match_literal(p, "true"))
                        *ret = json_new_bool(true);
                else if (match_literal(p, "false"))
                        *ret = json_new_bool(false);
                else if (match_literal(p, "null"))
                        *ret = json_new_null();
                else
                        return parse_error(p, p->pos, "expected a value, got %s",
                                           describe(p, p->pos, d));
                break;
        default:
                if (c == '-' || is_digit(c))
                        return parse_number(p, ret);
                return parse_error(p, p->pos, "expected a value, got %s", describe(p, p->pos, d));
        }
        return *ret ? 0 : error_set(p->err, p->err_size, ENOMEM, "%s: out of memory", p->what);
}

int json_parse(const char *text, size_t len, const char *what, struct json_value **ret, char *err,
               size_t err_size) {
        struct parser p = {
                .text = text, .len = len, .what = what ? what : "JSON", .err = err, .err_size = err_size
        };
        _cleanup_(json_freep) struct json_value *v = NULL;
        char d[16];
        int r;

        /* A UTF-8 byte order mark is tolerated at the start (RFC 8259 §8.1 allows ignoring it);
         * editors on some systems write one into config files. */
        if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
                p.pos = 3;
        r = parse_value(&p, 0, &v);
        if (r < 0)
                return r;
        skip_ws(&p);
        if (p.pos < p.len)
                return parse_error(&p, p.pos, "unexpected %s after the value",
                                   describe(&p, p.pos, d));
        *ret = TAKE_PTR(v);
        return 0;
}

int json_parse_file(const char *path, struct json_value **ret, char *err, size_t err_size) {
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        size_t n = 0, cap = 0;
        struct stat st;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return error_set(err, err_size, errno, "%s: cannot open: %s", path, strerror(errno));
        if (fstat(fd, &st) < 0)
                return error_set(err, err_size, errno, "%s: cannot stat: %s", path, strerror(errno));
        if (S_ISDIR(st.st_mode))
                return error_set(err, err_size, EISDIR, "%s: is a directory, a JSON file expected", path);
        cap = st.st_size > 0 ? (size_t) st.st_size + 1 : 4096;
        for (;;) {
                if (n == cap) {
                        char *b = realloc(buf, cap * 2);
                        if (!b)
                                return error_set(err, err_size, ENOMEM, "%s: out of memory", path);
                        buf = b;
                        cap *= 2;
                } else if (!buf) {
                        buf = malloc(cap);
                        if (!buf)
                                return error_set(err, err_size, ENOMEM, "%s: out of memory", path);
                }
                ssize_t k = read(fd, buf + n, cap - n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return error_set(err, err_size, errno, "%s: cannot read: %s", path, strerror(errno));
                }
                if (k == 0)
                        break;
                n += (size_t) k;
        }
        return json_parse(buf ? buf : "", n, path, ret, err, err_size);
}

/* ---- serializer ---- */

struct out {
        char *p;
        size_t n, cap;
        bool oom;
};

static void out_reserve(struct out *o, size_t extra) {
        if (o->oom || o->n + extra < o->cap)
                return;
        size_t cap = o->cap ? o->cap : 256;
        while (o->n + extra >= cap)
                cap *= 2;
        char *p = realloc(o->p, cap);
        if (!p) {
                o->oom = true;
                return;
        }
        o->p = p;
        o->cap = cap;
}

static void out_mem(struct out *o, const char *s, size_t n) {
        out_reserve(o, n);
        if (o->oom)
                return;
        memcpy(o->p + o->n, s, n);
        o->n += n;
}

static void out_str(struct out *o, const char *s) {
        out_mem(o, s, strlen(s));
}

static void out_char(struct out *o, char c) {
        out_mem(o, &c, 1);
}

static void out_u4(struct out *o, uint32_t u) {
        static const char hex[] = "0123456789abcdef";
        char b[6] = { '\\', 'u', hex[(u >> 12) & 15], hex[(u >> 8) & 15], hex[(u >> 4) & 15],
                      hex[u & 15] };
        out_mem(o, b, 6);
}

/* Python's json string encoder: \" \\ \n \r \t \b \f, other C0 controls as \u00xx; with
 * ensure_ascii (JSON_ASCII) also DEL and everything non-ASCII as \uxxxx (astral characters as a
 * surrogate pair), lowercase hex. Invalid UTF-8 (possible only through json_new_string) is written
 * as U+FFFD so the output is always valid. */
static void dump_string(struct out *o, const char *s, size_t len, bool ascii) {
        const unsigned char *u = (const unsigned char *) s;

        out_char(o, '"');
        for (size_t i = 0; i < len;) {
                unsigned char c = u[i];
                if (c < 0x80) {
                        i++;
                        switch (c) {
                        case '"':
                                out_str(o, "\\\"");
                                break;
                        case '\\':
                                out_str(o, "\\\\");
                                break;
                        case '\n':
                                out_str(o, "\\n");
                                break;
                        case '\r':
                                out_str(o, "\\r");
                                break;
                        case '\t':
                                out_str(o, "\\t");
                                break;
                        case '\b':
                                out_str(o, "\\b");
                                break;
                        case '\f':
                                out_str(o, "\\f");
                                break;
                        default:
                                if (c < 0x20 || (c == 0x7f && ascii))
                                        out_u4(o, c);
                                else
                                        out_char(o, (char) c);
                        }
                        continue;
                }
                uint32_t cp;
                size_t l = utf8_decode(u + i, len - i, &cp);
                if (l == 0) {
                        cp = 0xfffd;
                        l = 1;
                }
                if (!ascii) {
                        char b[4];
                        out_mem(o, b, utf8_encode(cp, b));
                } else if (cp >= 0x10000) {
                        cp -= 0x10000;
                        out_u4(o, 0xd800 + (cp >> 10));
                        out_u4(o, 0xdc00 + (cp & 0x3ff));
                } else
                        out_u4(o, cp);
                i += l;
        }
        out_char(o, '"');
}

/* Python's repr(float): the shortest digit string that reads back to the same double, written
 * fixed when the decimal exponent is in [-4, 16), else as d.ddde±XX; integral values get ".0". */
static void dump_double(struct out *o, double d) {
        char buf[64], digits[32];
        int exp10 = 0;
        size_t nd = 0;

        if (isnan(d)) {
                out_str(o, "NaN");
                return;
        }
        if (isinf(d)) {
                out_str(o, d < 0 ? "-Infinity" : "Infinity");
                return;
        }
        if (signbit(d)) {
                out_char(o, '-');
                d = -d;
        }
        for (int prec = 1; prec <= 17; prec++) {
                snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
                if (prec == 17 || strtod_l(buf, NULL, get_c_locale()) == d)
                        break;
        }
        /* buf is "D[.DDD]e[+-]XX" */
        char *e = strchr(buf, 'e');
        exp10 = atoi(e + 1);
        for (char *c = buf; c < e; c++)
                if (*c != '.')
                        digits[nd++] = *c;
        while (nd > 1 && digits[nd - 1] == '0')
                nd--;
        digits[nd] = 0;

        if (exp10 >= -4 && exp10 < 16) {
                if (exp10 < 0) {
                        out_str(o, "0.");
                        for (int k = 0; k < -exp10 - 1; k++)
                                out_char(o, '0');
                        out_mem(o, digits, nd);
                } else {
                        size_t intlen = (size_t) exp10 + 1;
                        for (size_t k = 0; k < intlen; k++)
                                out_char(o, k < nd ? digits[k] : '0');
                        out_char(o, '.');
                        if (nd > intlen)
                                out_mem(o, digits + intlen, nd - intlen);
                        else
                                out_char(o, '0');
                }
        } else {
                out_char(o, digits[0]);
                if (nd > 1) {
                        out_char(o, '.');
                        out_mem(o, digits + 1, nd - 1);
                }
                snprintf(buf, sizeof buf, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
                out_str(o, buf);
        }
}

static void dump_newline(struct out *o, int indent, unsigned level) {
        out_char(o, '\n');
        size_t n = (size_t) indent * level;
        out_reserve(o, n);
        if (o->oom)
                return;
        memset(o->p + o->n, ' ', n);
        o->n += n;
}

static int member_cmp(const void *a, const void *b) {
        const struct json_member *x = *(const struct json_member *const *) a;
        const struct json_member *y = *(const struct json_member *const *) b;
        int c = memcmp(x->key, y->key, MIN(x->key_len, y->key_len));
        if (c)
                return c;
        return x->key_len < y->key_len ? -1 : x->key_len > y->key_len;
}

static void dump_value(struct out *o, const struct json_value *v, unsigned flags, int indent,
                       unsigned level) {
        bool ascii = flags & JSON_ASCII;
        /* json.dumps: item separator ", " (or "," when compact or indenting), key ": " / ":" */
        const char *item_sep = (flags & JSON_COMPACT) || indent > 0 ? "," : ", ";
        const char *key_sep = (flags & JSON_COMPACT) ? ":" : ": ";
        char buf[32];

        if (o->oom)
                return;
        switch (v->type) {
        case JSON_NULL:
                out_str(o, "null");
                break;
        case JSON_BOOL:
                out_str(o, v->b ? "true" : "false");
                break;
        case JSON_INT:
                snprintf(buf, sizeof buf, "%lld", (long long) v->i);
                out_str(o, buf);
                break;
        case JSON_DOUBLE:
                dump_double(o, v->d);
                break;
        case JSON_STRING:
                dump_string(o, v->str.s, v->str.len, ascii);
                break;
        case JSON_ARRAY:
                if (v->arr.n == 0) {
                        out_str(o, "[]");
                        break;
                }
                out_char(o, '[');
                for (size_t i = 0; i < v->arr.n; i++) {
                        if (i > 0)
                                out_str(o, item_sep);
                        if (indent > 0)
                                dump_newline(o, indent, level + 1);
                        dump_value(o, v->arr.items[i], flags, indent, level + 1);
                }
                if (indent > 0)
                        dump_newline(o, indent, level);
                out_char(o, ']');
                break;
        case JSON_OBJECT: {
                if (v->obj.n == 0) {
                        out_str(o, "{}");
                        break;
                }
                _cleanup_free_ const struct json_member **order = malloc(v->obj.n * sizeof *order);
                if (!order) {
                        o->oom = true;
                        return;
                }
                for (size_t i = 0; i < v->obj.n; i++)
                        order[i] = &v->obj.m[i];
                if (flags & JSON_SORT_KEYS)
                        qsort(order, v->obj.n, sizeof *order, member_cmp);
                out_char(o, '{');
                for (size_t i = 0; i < v->obj.n; i++) {
                        if (i > 0)
                                out_str(o, item_sep);
                        if (indent > 0)
                                dump_newline(o, indent, level + 1);
                        dump_string(o, order[i]->key, order[i]->key_len, ascii);
                        out_str(o, key_sep);
                        dump_value(o, order[i]->value, flags, indent, level + 1);
                }
                if (indent > 0)
                        dump_newline(o, indent, level);
                out_char(o, '}');
                break;
        }
        }
}

char *json_dump(const struct json_value *v, unsigned flags, int indent) {
        struct out o = {};

        if (!v)
                return NULL;
        /* %e and strtod in the C locale: a decimal comma would break the output */
        locale_t old = uselocale(get_c_locale());
        dump_value(&o, v, flags, indent, 0);
        out_char(&o, 0);
        uselocale(old);
        if (o.oom) {
                free(o.p);
                return NULL;
        }
        return o.p;
}
