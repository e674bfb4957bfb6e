/* SPDX-License-Identifier: MIT */
/* Jinja subset: values with Python semantics, and the tree-walking renderer. See jinja.h.
 * Behaviour targets Jinja2 3.1 in transformers' ImmutableSandboxedEnvironment: Python str()/repr()
 * printing, default Undefined (prints "", fails on attribute/item access and arithmetic), `and`/`or`
 * returning operands, for-loop bodies scoped per iteration, mutating methods refused. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/jinja.h"
#include "common/json.h"
#include "common/log.h"

enum vtype {
        V_UNDEF,
        V_NONE,
        V_BOOL,
        V_INT,
        V_FLOAT,
        V_STR,
        V_LIST,
        V_TUPLE,
        V_DICT,
        V_NS,
        V_MACRO,
        V_BUILTIN,
        V_METHOD,
        V_LOOP,
};

struct jstr {
        size_t len;
        bool safe; /* markupsafe.Markup (from |safe): `+` with a plain str escapes the other side */
        char s[];
};
struct jlist;
struct jdict;
struct jmacro;
struct jmethod;

typedef struct jv {
        enum vtype t;
        union {
                bool b;
                int64_t i;
                double f;
                struct jstr *s;
                struct jlist *l;
                struct jdict *d;
                struct jmacro *m;
                struct jmethod *meth;
                struct jloop *loop;
                int builtin;
                const char *undef_name;
        };
} jv;

struct jlist {
        size_t n, cap;
        jv *v;
        /* made by a filter that returns a Python generator (map, select*, reject*, items, unique,
         * reverse): iterable, always true, no len(), not JSON serializable, not printable */
        bool gen;
};
struct jdict {
        size_t n, cap;
        jv *k, *v;
};
/* A scope: names point into the template's AST (or are literals), so binding allocates nothing
 * per name; a loop reuses one frame, cleared per iteration. */
struct frame {
        struct frame *parent;
        size_t n, cap;
        const char **names;
        jv *vals;
};
/* loop.* of one iteration, computed on access */
struct jloop {
        struct jlist *items; /* NULL: a range, item k = lo + k * step */
        int64_t lo, step;
        size_t i, len;
};
struct jmacro {
        const struct jnode *node;
        struct frame *scope;
};
struct jmethod {
        jv self;
        const char *name;
};

enum builtin { B_RANGE, B_NAMESPACE, B_DICT, B_RAISE, B_STRFTIME };

struct sbuf {
        char *p;
        size_t len, cap;
};

/* How deep a value's repr, equality and tojson go: past it, an error rather than the process's
 * stack (a template can nest a value as deep as its loops go, and a namespace can hold itself:
 * ns.a = ns; lists and dicts cannot, their mutating methods are refused). */
#define VALUE_MAX_NESTING 512u
_Static_assert(VALUE_MAX_NESTING > JSON_DEPTH_MAX, "a request's JSON must print and compare");

struct rstate {
        struct arena *arena;
        const struct jinja_limits *lim;
        uint64_t steps;
        unsigned depth, nesting;
        /* the lists and dicts whose repr is being printed, outermost first (put_repr) */
        const void *repr_open[VALUE_MAX_NESTING];
        unsigned n_repr_open;
        struct sbuf *out;
        struct jdict globals;
        struct frame *root;
        const struct jnode *at;
        int err;
        char *msg; /* the caller's buffer for the message (error_set, common/log.h) */
        size_t msg_size;
        jmp_buf fail;
};

static const jv UNDEF = {.t = V_UNDEF};
static const jv NONE = {.t = V_NONE};

_printf_(2, 3) static _Noreturn void fail(struct rstate *st, const char *fmt, ...) {
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        if (st->at)
                error_set(st->msg, st->msg_size, st->err ? st->err : EINVAL, "template:%d:%d: %s",
                          st->at->line, st->at->col, buf);
        else
                error_set(st->msg, st->msg_size, st->err ? st->err : EINVAL, "template: %s", buf);
        if (!st->err)
                st->err = EINVAL;
        longjmp(st->fail, 1);
}

static void *ralloc(struct rstate *st, size_t n) {
        void *p = arena_alloc(st->arena, n);
        if (!p) {
                st->err = E2BIG;
                fail(st, "template render exceeded its memory limit of %zu bytes", st->lim->max_memory);
        }
        return p;
}

static void step(struct rstate *st, uint64_t n) {
        st->steps += n;
        if (st->steps > st->lim->max_steps) {
                st->err = E2BIG;
                fail(st, "template render exceeded %" PRIu64 " operations", st->lim->max_steps);
        }
}

/* ---- strings and buffers ---- */

static void sb_put(struct rstate *st, struct sbuf *b, const char *s, size_t n) {
        if (b->len + n + 1 > b->cap) {
                if (b->len + n > st->lim->max_output) {
                        st->err = E2BIG;
                        fail(st, "template render exceeded the output limit of %zu bytes", st->lim->max_output);
                }
                size_t cap = MAX(b->cap * 2, b->len + n + 1);
                cap = MAX(cap, (size_t) 64);
                char *p = ralloc(st, cap);
                if (b->len)
                        memcpy(p, b->p, b->len);
                b->p = p;
                b->cap = cap;
        }
        if (n)
                memcpy(b->p + b->len, s, n);
        b->len += n;
        b->p[b->len] = 0;
}
static void sb_puts(struct rstate *st, struct sbuf *b, const char *s) {
        sb_put(st, b, s, strlen(s));
}

static struct jstr *mkstr_raw(struct rstate *st, const char *s, size_t n) {
        if (n > st->lim->max_output) {
                st->err = E2BIG;
                fail(st, "template render exceeded the output limit of %zu bytes", st->lim->max_output);
        }
        struct jstr *r = ralloc(st, sizeof(*r) + n + 1);
        r->len = n;
        if (n)
                memcpy(r->s, s, n);
        r->s[n] = 0;
        return r;
}
static jv mkstr(struct rstate *st, const char *s, size_t n) {
        return (jv) {.t = V_STR, .s = mkstr_raw(st, s, n)};
}
static jv mkcstr(struct rstate *st, const char *s) {
        return mkstr(st, s, strlen(s));
}
static jv sb_value(struct rstate *st, struct sbuf *b) {
        return mkstr(st, b->p ? b->p : "", b->len);
}
static jv mkint(int64_t i) {
        return (jv) {.t = V_INT, .i = i};
}
static jv mkfloat(double f) {
        return (jv) {.t = V_FLOAT, .f = f};
}
static jv mkbool(bool b) {
        return (jv) {.t = V_BOOL, .b = b};
}

static jv mklist(struct rstate *st, enum vtype t, size_t cap) {
        struct jlist *l = ralloc(st, sizeof(*l));
        if (cap) {
                l->v = ralloc(st, cap * sizeof(jv));
                l->cap = cap;
        }
        return (jv) {.t = t, .l = l};
}
static void list_push(struct rstate *st, struct jlist *l, jv x) {
        if (l->n == l->cap) {
                size_t cap = MAX(l->cap * 2, (size_t) 8);
                jv *v = ralloc(st, cap * sizeof(jv));
                if (l->n)
                        memcpy(v, l->v, l->n * sizeof(jv));
                l->v = v;
                l->cap = cap;
        }
        l->v[l->n++] = x;
}
static jv mkdict(struct rstate *st, enum vtype t) {
        struct jdict *d = ralloc(st, sizeof(*d));
        return (jv) {.t = t, .d = d};
}

static bool is_seq(jv v) {
        return v.t == V_LIST || v.t == V_TUPLE;
}
static bool is_num(jv v) {
        return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL;
}

static const char *type_name(jv v) {
        switch (v.t) {
        case V_UNDEF:
                return "Undefined";
        case V_NONE:
                return "NoneType";
        case V_BOOL:
                return "bool";
        case V_INT:
                return "int";
        case V_FLOAT:
                return "float";
        case V_STR:
                return "str";
        case V_LIST:
                return v.l->gen ? "generator" : "list";
        case V_TUPLE:
                return "tuple";
        case V_DICT:
                return "dict";
        case V_NS:
                return "Namespace";
        case V_MACRO:
                return "Macro";
        case V_BUILTIN:
        case V_METHOD:
                return "builtin_function_or_method";
        case V_LOOP:
                return "LoopContext";
        }
        return "?";
}

static _Noreturn void fail_undefined(struct rstate *st, jv v) {
        if (v.undef_name)
                fail(st, "'%s' is undefined", v.undef_name);
        fail(st, "undefined value used");
}

/* ---- UTF-8 helpers (Python strings index by code point) ---- */

static size_t u8_next(const char *s, size_t len, size_t i) {
        i++;
        while (i < len && ((unsigned char) s[i] & 0xC0) == 0x80)
                i++;
        return i;
}
static size_t u8_count(const char *s, size_t len) {
        size_t n = 0;
        for (size_t i = 0; i < len; i++)
                if (((unsigned char) s[i] & 0xC0) != 0x80)
                        n++;
        return n;
}
static uint32_t u8_decode(const char *s, size_t len, size_t i) {
        unsigned char c = (unsigned char) s[i];
        if (c < 0x80)
                return c;
        int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
        uint32_t cp = c & (0x3F >> extra);
        for (int k = 1; k <= extra && i + (size_t) k < len; k++)
                cp = (cp << 6) | ((unsigned char) s[i + (size_t) k] & 0x3F);
        return cp;
}
/* byte offsets of all code points, plus len at the end */
static size_t *u8_offsets(struct rstate *st, const char *s, size_t len, size_t *n) {
        size_t cnt = u8_count(s, len);
        size_t *o = ralloc(st, (cnt + 1) * sizeof(size_t));
        size_t k = 0;
        for (size_t i = 0; i < len; i = u8_next(s, len, i))
                o[k++] = i;
        o[k] = len;
        *n = cnt;
        return o;
}

static bool py_space(uint32_t c) {
        return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
               (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- printing (Python str() and repr()) ---- */

static void put_float(struct rstate *st, struct sbuf *b, double f) {
        if (isnan(f)) {
                sb_puts(st, b, "nan");
                return;
        }
        if (isinf(f)) {
                sb_puts(st, b, f > 0 ? "inf" : "-inf");
                return;
        }
        char buf[64];
        int prec;
        for (prec = 1; prec <= 17; prec++) {
                snprintf(buf, sizeof(buf), "%.*e", prec - 1, f);
                if (strtod(buf, NULL) == f)
                        break;
        }
        /* buf = [-]d.ddde[+-]XX : split into digits and exponent */
        char digits[32];
        size_t nd = 0;
        const char *q = buf;
        bool neg = false;
        if (*q == '-') {
                neg = true;
                q++;
        }
        for (; *q && *q != 'e'; q++)
                if (*q != '.')
                        digits[nd++] = *q;
        int exp10 = atoi(q + 1);
        while (nd > 1 && digits[nd - 1] == '0')
                nd--;
        digits[nd] = 0;
        int decpt = exp10 + 1;
        char out[64];
        size_t o = 0;
        if (neg)
                out[o++] = '-';
        if (decpt > -4 && decpt <= 16) {
                if (decpt <= 0) {
                        out[o++] = '0';
                        out[o++] = '.';
                        for (int k = 0; k < -decpt; k++)
                                out[o++] = '0';
                        memcpy(out + o, digits, nd);
                        o += nd;
                } else {
                        for (int k = 0; k < decpt; k++)
                                out[o++] = (size_t) k < nd ? digits[k] : '0';
                        out[o++] = '.';
                        if ((size_t) decpt < nd) {
                                memcpy(out + o, digits + decpt, nd - (size_t) decpt);
                                o += nd - (size_t) decpt;
                        } else
                                out[o++] = '0';
                }
                out[o] = 0;
        } else {
                out[o++] = digits[0];
                if (nd > 1) {
                        out[o++] = '.';
                        memcpy(out + o, digits + 1, nd - 1);
                        o += nd - 1;
                }
                snprintf(out + o, sizeof(out) - o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        }
        sb_puts(st, b, out);
}

static void put_repr(struct rstate *st, struct sbuf *b, jv v);

static void put_str_repr(struct rstate *st, struct sbuf *b, const char *s, size_t len) {
        bool has_sq = memchr(s, '\'', len) != NULL, has_dq = memchr(s, '"', len) != NULL;
        char q = has_sq && !has_dq ? '"' : '\'';
        sb_put(st, b, &q, 1);
        for (size_t i = 0; i < len;) {
                unsigned char c = (unsigned char) s[i];
                size_t nx = u8_next(s, len, i);
                uint32_t cp = u8_decode(s, len, i);
                char esc[16];
                if (c == '\\')
                        sb_puts(st, b, "\\\\");
                else if (c == (unsigned char) q) {
                        esc[0] = '\\';
                        esc[1] = q;
                        sb_put(st, b, esc, 2);
                } else if (c == '\n')
                        sb_puts(st, b, "\\n");
                else if (c == '\r')
                        sb_puts(st, b, "\\r");
                else if (c == '\t')
                        sb_puts(st, b, "\\t");
                else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0xA0) || cp == 0xAD) {
                        snprintf(esc, sizeof(esc), "\\x%02x", cp);
                        sb_puts(st, b, esc);
                } else if ((cp >= 0x200B && cp <= 0x200F) || cp == 0x2028 || cp == 0x2029 || (cp >= 0x202A && cp <= 0x202E) ||
                           (cp >= 0x2060 && cp <= 0x2064) || cp == 0xFEFF) {
                        snprintf(esc, sizeof(esc), "\\u%04x", cp);
                        sb_puts(st, b, esc);
                } else
                        sb_put(st, b, s + i, nx - i);
                i = nx;
        }
        sb_put(st, b, &q, 1);
}

/* Python str() */
static void put_str(struct rstate *st, struct sbuf *b, jv v) {
        switch (v.t) {
        case V_UNDEF:
                return;
        case V_STR:
                sb_put(st, b, v.s->s, v.s->len);
                return;
        default:
                put_repr(st, b, v);
        }
}

/* Whether the list or dict c is being printed by an enclosing put_repr; else notes it as open
 * (put_repr drops it when printed). Python prints a container inside itself as [...] or {...}. */
static bool put_repr_open(struct rstate *st, const void *c) {
        for (unsigned i = 0; i < st->n_repr_open; i++)
                if (st->repr_open[i] == c)
                        return true;
        if (st->n_repr_open == VALUE_MAX_NESTING)
                fail(st, "printing a value nested more than %u deep", VALUE_MAX_NESTING);
        st->repr_open[st->n_repr_open++] = c;
        return false;
}

static void put_repr(struct rstate *st, struct sbuf *b, jv v) {
        char buf[32];
        step(st, 1);
        switch (v.t) {
        case V_UNDEF:
                return;
        case V_NONE:
                sb_puts(st, b, "None");
                return;
        case V_BOOL:
                sb_puts(st, b, v.b ? "True" : "False");
                return;
        case V_INT:
                snprintf(buf, sizeof(buf), "%" PRId64, v.i);
                sb_puts(st, b, buf);
                return;
        case V_FLOAT:
                put_float(st, b, v.f);
                return;
        case V_STR:
                put_str_repr(st, b, v.s->s, v.s->len);
                return;
        case V_LIST:
        case V_TUPLE:
                if (v.l->gen)
                        fail(st, "unsupported construct: printing a generator (add '|list')");
                if (put_repr_open(st, v.l)) {
                        sb_puts(st, b, v.t == V_LIST ? "[...]" : "(...)");
                        return;
                }
                sb_puts(st, b, v.t == V_LIST ? "[" : "(");
                for (size_t i = 0; i < v.l->n; i++) {
                        if (i)
                                sb_puts(st, b, ", ");
                        put_repr(st, b, v.l->v[i]);
                }
                if (v.t == V_TUPLE && v.l->n == 1)
                        sb_puts(st, b, ",");
                sb_puts(st, b, v.t == V_LIST ? "]" : ")");
                st->n_repr_open--;
                return;
        case V_DICT:
        case V_NS:
                if (put_repr_open(st, v.d)) {
                        sb_puts(st, b, v.t == V_NS ? "<Namespace {...}>" : "{...}");
                        return;
                }
                sb_puts(st, b, v.t == V_NS ? "<Namespace {" : "{");
                for (size_t i = 0; i < v.d->n; i++) {
                        if (i)
                                sb_puts(st, b, ", ");
                        put_repr(st, b, v.d->k[i]);
                        sb_puts(st, b, ": ");
                        put_repr(st, b, v.d->v[i]);
                }
                sb_puts(st, b, v.t == V_NS ? "}>" : "}");
                st->n_repr_open--;
                return;
        case V_MACRO:
                sb_puts(st, b, "<Macro '");
                sb_puts(st, b, v.m->node->str);
                sb_puts(st, b, "'>");
                return;
        case V_BUILTIN:
        case V_METHOD:
                sb_puts(st, b, "<built-in function>");
                return;
        case V_LOOP:
                fail(st, "unsupported construct: printing the loop object");
        }
}

static struct jstr *to_str(struct rstate *st, jv v) {
        if (v.t == V_STR)
                return v.s;
        struct sbuf b = {};
        put_str(st, &b, v);
        return mkstr_raw(st, b.p ? b.p : "", b.len);
}

/* ---- truth, equality, ordering ---- */

static bool truthy(jv v) {
        switch (v.t) {
        case V_UNDEF:
        case V_NONE:
                return false;
        case V_BOOL:
                return v.b;
        case V_INT:
                return v.i != 0;
        case V_FLOAT:
                return v.f != 0.0;
        case V_STR:
                return v.s->len > 0;
        case V_LIST:
        case V_TUPLE:
                return v.l->gen || v.l->n > 0;
        case V_DICT:
                return v.d->n > 0;
        default:
                return true;
        }
}

static double num_f(jv v) {
        return v.t == V_FLOAT ? v.f : v.t == V_INT ? (double) v.i : (double) v.b;
}
static int64_t num_i(jv v) {
        return v.t == V_INT ? v.i : (int64_t) v.b;
}

static bool dict_find(struct rstate *st, struct jdict *d, jv k, size_t *idx);

static bool jv_eq_in(struct rstate *st, jv a, jv b, unsigned depth);
static bool jv_eq(struct rstate *st, jv a, jv b) {
        return jv_eq_in(st, a, b, 0);
}

/* Python's ==: containers equal element by element, a container identical to its counterpart
 * equal without a look inside (Python's identity shortcut); namespaces compare by identity, so
 * only deep values recurse, and past VALUE_MAX_NESTING that is an error (Python: RecursionError
 * past its own limit). */
static bool jv_eq_in(struct rstate *st, jv a, jv b, unsigned depth) {
        if (depth > VALUE_MAX_NESTING)
                fail(st, "comparing values nested more than %u deep", VALUE_MAX_NESTING);
        if (is_num(a) && is_num(b)) {
                if (a.t != V_FLOAT && b.t != V_FLOAT)
                        return num_i(a) == num_i(b);
                return num_f(a) == num_f(b);
        }
        if (a.t != b.t) {
                return false;
        }
        switch (a.t) {
        case V_UNDEF:
        case V_NONE:
                return true;
        case V_STR:
                return a.s->len == b.s->len && memcmp(a.s->s, b.s->s, a.s->len) == 0;
        case V_LIST:
        case V_TUPLE:
                if (a.l->gen || b.l->gen)
                        return a.l == b.l;
                if (a.l == b.l)
                        return true;
                if (a.l->n != b.l->n)
                        return false;
                step(st, 1);
                for (size_t i = 0; i < a.l->n; i++)
                        if (!jv_eq_in(st, a.l->v[i], b.l->v[i], depth + 1))
                                return false;
                return true;
        case V_DICT:
                if (a.d == b.d)
                        return true;
                if (a.d->n != b.d->n)
                        return false;
                step(st, 1);
                for (size_t i = 0; i < a.d->n; i++) {
                        size_t j;
                        if (!dict_find(st, b.d, a.d->k[i], &j) || !jv_eq_in(st, a.d->v[i], b.d->v[j], depth + 1))
                                return false;
                }
                return true;
        case V_NS:
                return a.d == b.d;
        case V_MACRO:
                return a.m == b.m;
        case V_BUILTIN:
                return a.builtin == b.builtin;
        default:
                return false;
        }
}

static int jv_cmp(struct rstate *st, jv a, jv b, const char *op) {
        if (is_num(a) && is_num(b)) {
                if (a.t != V_FLOAT && b.t != V_FLOAT)
                        return (num_i(a) > num_i(b)) - (num_i(a) < num_i(b));
                double x = num_f(a), y = num_f(b);
                return (x > y) - (x < y);
        }
        if (a.t == V_STR && b.t == V_STR) {
                size_t n = MIN(a.s->len, b.s->len);
                int c = memcmp(a.s->s, b.s->s, n);
                if (c)
                        return c < 0 ? -1 : 1;
                return (a.s->len > b.s->len) - (a.s->len < b.s->len);
        }
        if (a.t == b.t && is_seq(a)) {
                for (size_t i = 0; i < MIN(a.l->n, b.l->n); i++)
                        if (!jv_eq(st, a.l->v[i], b.l->v[i]))
                                return jv_cmp(st, a.l->v[i], b.l->v[i], op);
                return (a.l->n > b.l->n) - (a.l->n < b.l->n);
        }
        if (a.t == V_UNDEF)
                fail_undefined(st, a);
        if (b.t == V_UNDEF)
                fail_undefined(st, b);
        fail(st, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a), type_name(b));
}

/* ---- dicts ---- */

static bool dict_find(struct rstate *st, struct jdict *d, jv k, size_t *idx) {
        for (size_t i = 0; i < d->n; i++)
                if (jv_eq(st, d->k[i], k)) {
                        *idx = i;
                        return true;
                }
        return false;
}
static bool dict_get_c(struct jdict *d, const char *key, jv *ret) {
        size_t kl = strlen(key);
        for (size_t i = 0; i < d->n; i++)
                if (d->k[i].t == V_STR && d->k[i].s->len == kl && memcmp(d->k[i].s->s, key, kl) == 0) {
                        *ret = d->v[i];
                        return true;
                }
        return false;
}
static void dict_set(struct rstate *st, struct jdict *d, jv k, jv v) {
        size_t i;
        if (dict_find(st, d, k, &i)) {
                d->v[i] = v;
                return;
        }
        if (d->n == d->cap) {
                size_t cap = MAX(d->cap * 2, (size_t) 8);
                jv *nk = ralloc(st, cap * sizeof(jv)), *nv = ralloc(st, cap * sizeof(jv));
                if (d->n) {
                        memcpy(nk, d->k, d->n * sizeof(jv));
                        memcpy(nv, d->v, d->n * sizeof(jv));
                }
                d->k = nk;
                d->v = nv;
                d->cap = cap;
        }
        d->k[d->n] = k;
        d->v[d->n] = v;
        d->n++;
}
static void dict_set_c(struct rstate *st, struct jdict *d, const char *k, jv v) {
        dict_set(st, d, mkcstr(st, k), v);
}

/* ---- JSON conversion ---- */

static jv from_json(struct rstate *st, const struct json_value *j) {
        step(st, 1);
        switch (json_type(j)) {
        case JSON_NULL:
                return NONE;
        case JSON_BOOL:
                return mkbool(json_bool(j));
        case JSON_INT:
                return mkint(json_int(j));
        case JSON_DOUBLE:
                return mkfloat(json_number(j));
        case JSON_STRING:
                return mkstr(st, json_string(j), json_string_len(j));
        case JSON_ARRAY: {
                size_t n = json_count(j);
                jv l = mklist(st, V_LIST, n);
                for (size_t i = 0; i < n; i++)
                        list_push(st, l.l, from_json(st, json_array_at(j, i)));
                return l;
        }
        case JSON_OBJECT: {
                size_t n = json_count(j);
                jv d = mkdict(st, V_DICT);
                for (size_t i = 0; i < n; i++)
                        dict_set(st, d.d, mkcstr(st, json_object_key_at(j, i)), from_json(st, json_object_value_at(j, i)));
                return d;
        }
        }
        return NONE;
}

static void check_jsonable(struct rstate *st, jv v, unsigned depth) {
        step(st, 1);
        if (depth > VALUE_MAX_NESTING)
                fail(st, "tojson: value nested more than %u deep", VALUE_MAX_NESTING);
        switch (v.t) {
        case V_NONE:
        case V_BOOL:
        case V_INT:
        case V_FLOAT:
        case V_STR:
                return;
        case V_LIST:
        case V_TUPLE:
                if (v.l->gen)
                        fail(st, "tojson: Object of type generator is not JSON serializable");
                for (size_t i = 0; i < v.l->n; i++)
                        check_jsonable(st, v.l->v[i], depth + 1);
                return;
        case V_DICT:
                for (size_t i = 0; i < v.d->n; i++) {
                        jv k = v.d->k[i];
                        if (!(k.t == V_STR || k.t == V_INT || k.t == V_FLOAT || k.t == V_BOOL || k.t == V_NONE))
                                fail(st, "tojson: keys must be str, int, float, bool or None, not %s", type_name(k));
                        check_jsonable(st, v.d->v[i], depth + 1);
                }
                return;
        case V_UNDEF:
                fail(st, "tojson: Object of type Undefined is not JSON serializable");
        default:
                fail(st, "tojson: Object of type %s is not JSON serializable", type_name(v));
        }
}

static struct json_value *to_json(struct rstate *st, jv v) {
        switch (v.t) {
        case V_NONE:
                return json_new_null();
        case V_BOOL:
                return json_new_bool(v.b);
        case V_INT:
                return json_new_int(v.i);
        case V_FLOAT:
                return json_new_double(v.f);
        case V_STR:
                return json_new_string(v.s->s, v.s->len);
        case V_LIST:
        case V_TUPLE: {
                struct json_value *a = json_new_array();
                for (size_t i = 0; a && i < v.l->n; i++) {
                        struct json_value *x = to_json(st, v.l->v[i]);
                        if (!x || json_array_append(a, x) < 0) {
                                json_free(x);
                                json_free(a);
                                return NULL;
                        }
                }
                return a;
        }
        case V_DICT: {
                struct json_value *o = json_new_object();
                for (size_t i = 0; o && i < v.d->n; i++) {
                        jv k = v.d->k[i];
                        struct sbuf kb = {};
                        if (k.t == V_STR)
                                sb_put(st, &kb, k.s->s, k.s->len);
                        else if (k.t == V_BOOL)
                                sb_puts(st, &kb, k.b ? "true" : "false");
                        else if (k.t == V_NONE)
                                sb_puts(st, &kb, "null");
                        else
                                put_repr(st, &kb, k);
                        struct json_value *x = to_json(st, v.d->v[i]);
                        if (!x || json_object_set(o, kb.p ? kb.p : "", x) < 0) {
                                json_free(x);
                                json_free(o);
                                return NULL;
                        }
                }
                return o;
        }
        default:
                return NULL;
        }
}

static jv do_tojson(struct rstate *st, jv v, bool ensure_ascii, int indent, bool compact, bool sort_keys) {
        check_jsonable(st, v, 0);
        struct json_value *j = to_json(st, v);
        if (!j) {
                st->err = ENOMEM;
                fail(st, "tojson: out of memory");
        }
        unsigned flags = (ensure_ascii ? JSON_ASCII : 0) | (compact ? JSON_COMPACT : 0) | (sort_keys ? JSON_SORT_KEYS : 0);
        /* json.dumps(indent=0) breaks lines without indenting; json_dump has no such mode, so
         * dump with indent 1 and drop the indentation (JSON text has no raw newline in strings) */
        char *s = json_dump(j, flags, indent == 0 ? 1 : indent < 0 ? 0 : indent);
        if (s && indent == 0) {
                char *w = s;
                for (const char *r = s; *r; r++) {
                        *w++ = *r;
                        if (*r == '\n')
                                while (r[1] == ' ')
                                        r++;
                }
                *w = 0;
        }
        json_free(j);
        if (!s) {
                st->err = ENOMEM;
                fail(st, "tojson: out of memory");
        }
        jv r;
        size_t n = strlen(s);
        if (n > st->lim->max_output) {
                free(s);
                st->err = E2BIG;
                fail(st, "template render exceeded the output limit of %zu bytes", st->lim->max_output);
        }
        r = mkstr(st, s, n);
        free(s);
        return r;
}

/* ---- frames ---- */

static struct frame *push_frame(struct rstate *st, struct frame *parent) {
        struct frame *f = ralloc(st, sizeof(*f));
        f->parent = parent;
        return f;
}

static void frame_set(struct rstate *st, struct frame *f, const char *name, jv v) {
        for (size_t i = 0; i < f->n; i++)
                if (streq(f->names[i], name)) {
                        f->vals[i] = v;
                        return;
                }
        if (f->n == f->cap) {
                size_t cap = MAX(f->cap * 2, (size_t) 4);
                const char **nn = ralloc(st, cap * sizeof(*nn));
                jv *nv = ralloc(st, cap * sizeof(jv));
                if (f->n) {
                        memcpy(nn, f->names, f->n * sizeof(*nn));
                        memcpy(nv, f->vals, f->n * sizeof(jv));
                }
                f->names = nn;
                f->vals = nv;
                f->cap = cap;
        }
        f->names[f->n] = name;
        f->vals[f->n] = v;
        f->n++;
}

static jv lookup(struct rstate *st, struct frame *f, const char *name) {
        jv r;
        for (; f; f = f->parent)
                for (size_t i = 0; i < f->n; i++)
                        if (streq(f->names[i], name))
                                return f->vals[i];
        if (dict_get_c(&st->globals, name, &r))
                return r;
        static const char *const builtins[] = {
                [B_RANGE] = "range", [B_NAMESPACE] = "namespace", [B_DICT] = "dict",
                [B_RAISE] = "raise_exception", [B_STRFTIME] = "strftime_now",
        };
        for (size_t i = 0; i < ELEMENTSOF(builtins); i++)
                if (streq(builtins[i], name))
                        return (jv) {.t = V_BUILTIN, .builtin = (int) i};
        return (jv) {.t = V_UNDEF, .undef_name = name};
}

/* ---- attribute and item access ---- */

static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "pop", "popitem", "setdefault",
                                           "update", "clear", "copy", NULL};
static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                          "upper", "lower", "replace", "find", "rfind", "count", "title",
                                          "capitalize", "format", "join", "splitlines", "isdigit", "isalpha",
                                          "isalnum", "isspace", "isupper", "islower", "index", "rindex", NULL};
static const char *const LIST_METHODS[] = {"append", "pop", "insert", "extend", "remove", "sort", "reverse",
                                           "clear", "copy", "index", "count", NULL};

static bool in_names(const char *const *names, const char *s) {
        for (; *names; names++)
                if (streq(*names, s))
                        return true;
        return false;
}

static jv mkmethod(struct rstate *st, jv self, const char *name) {
        struct jmethod *m = ralloc(st, sizeof(*m));
        m->self = self;
        m->name = name;
        return (jv) {.t = V_METHOD, .meth = m};
}

static jv get_attr(struct rstate *st, jv obj, const char *name) {
        jv r;
        switch (obj.t) {
        case V_UNDEF:
                if (obj.undef_name)
                        fail(st, "'%s' is undefined (while reading its attribute '%s')", obj.undef_name, name);
                fail(st, "undefined value has no attribute '%s'", name);
        case V_DICT:
                if (in_names(DICT_METHODS, name))
                        return mkmethod(st, obj, name);
                if (dict_get_c(obj.d, name, &r))
                        return r;
                break;
        case V_NS:
                if (dict_get_c(obj.d, name, &r))
                        return r;
                break;
        case V_LOOP: {
                struct jloop *l = obj.loop;
                if (streq(name, "index"))
                        return mkint((int64_t) l->i + 1);
                if (streq(name, "index0"))
                        return mkint((int64_t) l->i);
                if (streq(name, "revindex"))
                        return mkint((int64_t) (l->len - l->i));
                if (streq(name, "revindex0"))
                        return mkint((int64_t) (l->len - l->i - 1));
                if (streq(name, "first"))
                        return mkbool(l->i == 0);
                if (streq(name, "last"))
                        return mkbool(l->i + 1 == l->len);
                if (streq(name, "length"))
                        return mkint((int64_t) l->len);
                if (streq(name, "depth"))
                        return mkint(1);
                if (streq(name, "depth0"))
                        return mkint(0);
                if (streq(name, "previtem") && l->i > 0)
                        return l->items ? l->items->v[l->i - 1] : mkint(l->lo + (int64_t) (l->i - 1) * l->step);
                if (streq(name, "nextitem") && l->i + 1 < l->len)
                        return l->items ? l->items->v[l->i + 1] : mkint(l->lo + (int64_t) (l->i + 1) * l->step);
                if (streq(name, "cycle") || streq(name, "changed"))
                        fail(st, "unsupported construct: loop.%s()", name);
                break;
        }
        case V_STR:
                if (in_names(STR_METHODS, name))
                        return mkmethod(st, obj, name);
                break;
        case V_LIST:
        case V_TUPLE:
                if (in_names(LIST_METHODS, name))
                        return mkmethod(st, obj, name);
                break;
        default:
                break;
        }
        return (jv) {.t = V_UNDEF, .undef_name = name};
}

static bool norm_index(int64_t i, size_t n, size_t *ret) {
        if (i < 0)
                i += (int64_t) n;
        if (i < 0 || (uint64_t) i >= n)
                return false;
        *ret = (size_t) i;
        return true;
}

static jv get_item(struct rstate *st, jv obj, jv key) {
        size_t idx;
        switch (obj.t) {
        case V_UNDEF:
                fail_undefined(st, obj);
        case V_DICT:
        case V_NS:
                if (dict_find(st, obj.d, key, &idx))
                        return obj.d->v[idx];
                break;
        case V_LIST:
        case V_TUPLE:
                if (obj.l->gen)
                        fail(st, "'generator' object is not subscriptable");
                if ((key.t == V_INT || key.t == V_BOOL) && norm_index(num_i(key), obj.l->n, &idx))
                        return obj.l->v[idx];
                break;
        case V_STR:
                if (key.t == V_INT || key.t == V_BOOL) {
                        size_t n;
                        size_t *off = u8_offsets(st, obj.s->s, obj.s->len, &n);
                        if (norm_index(num_i(key), n, &idx))
                                return mkstr(st, obj.s->s + off[idx], off[idx + 1] - off[idx]);
                }
                break;
        default:
                break;
        }
        if (key.t == V_STR && obj.t != V_DICT && obj.t != V_NS)
                return get_attr(st, obj, key.s->s);
        return (jv) {.t = V_UNDEF, .undef_name = key.t == V_STR ? key.s->s : NULL};
}

static int64_t slice_arg(struct rstate *st, jv v, bool *present) {
        *present = v.t != V_NONE && v.t != V_UNDEF;
        if (!*present)
                return 0;
        if (v.t != V_INT && v.t != V_BOOL)
                fail(st, "slice indices must be integers or None, not %s", type_name(v));
        return num_i(v);
}

/* Python slice semantics over n elements: fills idx[] and returns the count. */
static size_t slice_indices(struct rstate *st, size_t n, jv a, jv b, jv c, size_t **ret) {
        bool ha, hb, hc;
        int64_t start = slice_arg(st, a, &ha), stop = slice_arg(st, b, &hb), stp = slice_arg(st, c, &hc);
        if (!hc)
                stp = 1;
        if (stp == 0)
                fail(st, "slice step cannot be zero");
        int64_t len = (int64_t) n;
        if (stp > 0) {
                start = !ha ? 0 : start < 0 ? MAX(start + len, 0) : MIN(start, len);
                stop = !hb ? len : stop < 0 ? MAX(stop + len, 0) : MIN(stop, len);
        } else {
                start = !ha ? len - 1 : start < 0 ? MAX(start + len, -1) : MIN(start, len - 1);
                stop = !hb ? -1 : stop < 0 ? MAX(stop + len, -1) : MIN(stop, len - 1);
        }
        size_t *idx = ralloc(st, (n + 1) * sizeof(size_t));
        size_t k = 0;
        if (stp > 0)
                for (int64_t i = start; i < stop; i += stp)
                        idx[k++] = (size_t) i;
        else
                for (int64_t i = start; i > stop; i += stp)
                        idx[k++] = (size_t) i;
        *ret = idx;
        step(st, k);
        return k;
}

static jv do_slice(struct rstate *st, jv obj, jv a, jv b, jv c) {
        size_t *idx;
        if (obj.t == V_UNDEF)
                fail_undefined(st, obj);
        if (is_seq(obj)) {
                size_t k = slice_indices(st, obj.l->n, a, b, c, &idx);
                jv r = mklist(st, obj.t, k);
                for (size_t i = 0; i < k; i++)
                        list_push(st, r.l, obj.l->v[idx[i]]);
                return r;
        }
        if (obj.t == V_STR) {
                size_t n;
                size_t *off = u8_offsets(st, obj.s->s, obj.s->len, &n);
                size_t k = slice_indices(st, n, a, b, c, &idx);
                struct sbuf sb = {};
                sb_put(st, &sb, "", 0);
                for (size_t i = 0; i < k; i++)
                        sb_put(st, &sb, obj.s->s + off[idx[i]], off[idx[i] + 1] - off[idx[i]]);
                return sb_value(st, &sb);
        }
        fail(st, "'%s' object is not subscriptable", type_name(obj));
}

/* Items of an iterable as a list (dict: keys, str: characters, undefined: nothing). */
static struct jlist *iter_list(struct rstate *st, jv v) {
        switch (v.t) {
        case V_LIST:
        case V_TUPLE:
                return v.l;
        case V_UNDEF:
                return mklist(st, V_LIST, 0).l;
        case V_DICT: {
                jv l = mklist(st, V_LIST, v.d->n);
                for (size_t i = 0; i < v.d->n; i++)
                        list_push(st, l.l, v.d->k[i]);
                return l.l;
        }
        case V_STR: {
                jv l = mklist(st, V_LIST, 0);
                for (size_t i = 0; i < v.s->len;) {
                        size_t nx = u8_next(v.s->s, v.s->len, i);
                        list_push(st, l.l, mkstr(st, v.s->s + i, nx - i));
                        i = nx;
                }
                step(st, l.l->n);
                return l.l;
        }
        default:
                fail(st, "'%s' object is not iterable", type_name(v));
        }
}

/* ---- arithmetic ---- */

/* Python integers are unbounded; ours are not, and a wrong number is worse than an error. */
static _Noreturn void fail_bigint(struct rstate *st) {
        fail(st, "unsupported construct: integer result outside the 64-bit range");
}

/* Markup + str escapes the plain side the way markupsafe.escape does. */
static void put_maybe_escaped(struct rstate *st, struct sbuf *b, const struct jstr *s, bool escape) {
        if (!escape || s->safe) {
                sb_put(st, b, s->s, s->len);
                return;
        }
        for (size_t i = 0; i < s->len; i++) {
                const char *e = NULL;
                switch (s->s[i]) {
                case '&':
                        e = "&amp;";
                        break;
                case '<':
                        e = "&lt;";
                        break;
                case '>':
                        e = "&gt;";
                        break;
                case '\'':
                        e = "&#39;";
                        break;
                case '"':
                        e = "&#34;";
                        break;
                }
                if (e)
                        sb_puts(st, b, e);
                else
                        sb_put(st, b, s->s + i, 1);
        }
}

static jv arith(struct rstate *st, int op, jv a, jv b) {
        if (a.t == V_UNDEF && op != '~')
                fail_undefined(st, a);
        if (b.t == V_UNDEF && op != '~')
                fail_undefined(st, b);
        if (op == '~') {
                struct jstr *x = to_str(st, a), *y = to_str(st, b);
                struct sbuf sb = {};
                sb_put(st, &sb, x->s, x->len);
                sb_put(st, &sb, y->s, y->len);
                return sb_value(st, &sb);
        }
        if (is_num(a) && is_num(b)) {
                bool fl = a.t == V_FLOAT || b.t == V_FLOAT;
                int64_t x = fl ? 0 : num_i(a), y = fl ? 0 : num_i(b), r;
                double fx = num_f(a), fy = num_f(b);
                switch (op) {
                case '+':
                        if (!fl && __builtin_add_overflow(x, y, &r))
                                fail_bigint(st);
                        return fl ? mkfloat(fx + fy) : mkint(r);
                case '-':
                        if (!fl && __builtin_sub_overflow(x, y, &r))
                                fail_bigint(st);
                        return fl ? mkfloat(fx - fy) : mkint(r);
                case '*':
                        if (!fl && __builtin_mul_overflow(x, y, &r))
                                fail_bigint(st);
                        return fl ? mkfloat(fx * fy) : mkint(r);
                case '/':
                        if (fy == 0.0)
                                fail(st, "division by zero");
                        return mkfloat(fx / fy);
                case 'F':
                        if (fy == 0.0)
                                fail(st, "integer division or modulo by zero");
                        if (!fl) {
                                if (x == INT64_MIN && y == -1)
                                        fail_bigint(st);
                                int64_t q = x / y;
                                if ((x % y != 0) && ((x < 0) != (y < 0)))
                                        q--;
                                return mkint(q);
                        }
                        return mkfloat(floor(fx / fy));
                case '%':
                        if (fy == 0.0)
                                fail(st, "integer division or modulo by zero");
                        if (!fl) {
                                if (y == -1)
                                        return mkint(0);
                                int64_t m = x % y;
                                if (m != 0 && ((m < 0) != (y < 0)))
                                        m += y;
                                return mkint(m);
                        } else {
                                double m = fmod(fx, fy);
                                if (m != 0 && ((m < 0) != (fy < 0)))
                                        m += fy;
                                return mkfloat(m);
                        }
                case 'P':
                        if (!fl && y >= 0) {
                                int64_t acc = 1;
                                for (int64_t k = 0; k < y; k++) {
                                        step(st, 1);
                                        if (__builtin_mul_overflow(acc, x, &acc))
                                                fail_bigint(st);
                                }
                                return mkint(acc);
                        }
                        return mkfloat(pow(fx, fy));
                }
        }
        if (op == '+' && a.t == V_STR && b.t == V_STR) {
                struct sbuf sb = {};
                bool safe = a.s->safe || b.s->safe;
                sb_put(st, &sb, "", 0);
                put_maybe_escaped(st, &sb, a.s, safe);
                put_maybe_escaped(st, &sb, b.s, safe);
                jv r = sb_value(st, &sb);
                r.s->safe = safe;
                return r;
        }
        if (op == '+' && is_seq(a) && a.t == b.t) {
                jv r = mklist(st, a.t, a.l->n + b.l->n);
                for (size_t i = 0; i < a.l->n; i++)
                        list_push(st, r.l, a.l->v[i]);
                for (size_t i = 0; i < b.l->n; i++)
                        list_push(st, r.l, b.l->v[i]);
                step(st, r.l->n);
                return r;
        }
        if (op == '*' && ((a.t == V_STR && (b.t == V_INT || b.t == V_BOOL)) || (b.t == V_STR && (a.t == V_INT || a.t == V_BOOL)))) {
                jv s = a.t == V_STR ? a : b;
                int64_t n = num_i(a.t == V_STR ? b : a);
                struct sbuf sb = {};
                sb_put(st, &sb, "", 0);
                if (n > 0 && s.s->len > 0 && (uint64_t) n > st->lim->max_output / s.s->len) {
                        st->err = E2BIG;
                        fail(st, "template render exceeded the output limit of %zu bytes", st->lim->max_output);
                }
                step(st, n > 0 ? (uint64_t) n / 64 + 1 : 1);
                for (int64_t k = 0; k < n; k++)
                        sb_put(st, &sb, s.s->s, s.s->len);
                return sb_value(st, &sb);
        }
        if (op == '*' && ((is_seq(a) && (b.t == V_INT || b.t == V_BOOL)) || (is_seq(b) && (a.t == V_INT || a.t == V_BOOL)))) {
                jv s = is_seq(a) ? a : b;
                int64_t n = num_i(is_seq(a) ? b : a);
                jv r = mklist(st, s.t, 0);
                for (int64_t k = 0; k < n; k++) {
                        step(st, s.l->n + 1);
                        for (size_t i = 0; i < s.l->n; i++)
                                list_push(st, r.l, s.l->v[i]);
                }
                return r;
        }
        if (op == '%' && a.t == V_STR)
                fail(st, "unsupported construct: printf-style string formatting with '%%'");
        static const char *names[128] = {['+'] = "+", ['-'] = "-", ['*'] = "*", ['/'] = "/",
                                         ['F'] = "//", ['%'] = "%", ['P'] = "** or pow()"};
        fail(st, "unsupported operand type(s) for %s: '%s' and '%s'", names[op & 127] ? names[op & 127] : "?",
             type_name(a), type_name(b));
}

static bool contains(struct rstate *st, jv hay, jv needle) {
        switch (hay.t) {
        case V_STR: {
                if (needle.t != V_STR)
                        fail(st, "'in <string>' requires string as left operand, not %s", type_name(needle));
                if (needle.s->len == 0)
                        return true;
                step(st, hay.s->len / 64 + 1);
                return memmem(hay.s->s, hay.s->len, needle.s->s, needle.s->len) != NULL;
        }
        case V_LIST:
        case V_TUPLE:
                step(st, hay.l->n);
                for (size_t i = 0; i < hay.l->n; i++)
                        if (jv_eq(st, hay.l->v[i], needle))
                                return true;
                return false;
        case V_DICT: {
                size_t i;
                step(st, hay.d->n);
                return dict_find(st, hay.d, needle, &i);
        }
        case V_UNDEF:
                return false;
        default:
                fail(st, "argument of type '%s' is not iterable", type_name(hay));
        }
}

/* ---- calls: argument binding helper ---- */

struct args {
        jv *pos;
        size_t n_pos;
        const char **kw_names;
        jv *kw;
        size_t n_kw;
};

/* Binds args to the parameter names (positional first, then keywords); missing ones stay
 * UNDEF-with-no-name (callers use defaults). Fails on extra or unknown arguments. */
static void bind(struct rstate *st, const char *what, const struct args *a, const char *const *params, size_t n_params,
                 jv *out) {
        for (size_t i = 0; i < n_params; i++)
                out[i] = (jv) {.t = V_UNDEF};
        if (a->n_pos > n_params)
                fail(st, "%s takes at most %zu argument(s), %zu given", what, n_params, a->n_pos);
        for (size_t i = 0; i < a->n_pos; i++)
                out[i] = a->pos[i];
        for (size_t k = 0; k < a->n_kw; k++) {
                size_t i;
                for (i = 0; i < n_params; i++)
                        if (streq(params[i], a->kw_names[k]))
                                break;
                if (i == n_params)
                        fail(st, "%s got an unexpected keyword argument '%s'", what, a->kw_names[k]);
                out[i] = a->kw[k];
        }
}
static bool given(jv v) {
        return !(v.t == V_UNDEF && !v.undef_name);
}

static struct jstr *arg_str(struct rstate *st, const char *what, jv v) {
        if (v.t != V_STR)
                fail(st, "%s: expected a string argument, got %s", what, type_name(v));
        return v.s;
}

static int64_t arg_int(struct rstate *st, const char *what, jv v) {
        if (v.t != V_INT && v.t != V_BOOL)
                fail(st, "%s: expected an integer argument, got %s", what, type_name(v));
        return num_i(v);
}

/* ---- string methods ---- */

static bool in_chars(const char *chars, size_t n, uint32_t cp) {
        for (size_t i = 0; i < n; i = u8_next(chars, n, i))
                if (u8_decode(chars, n, i) == cp)
                        return true;
        return false;
}

static jv str_strip(struct rstate *st, struct jstr *s, jv chars, bool left, bool right) {
        const char *cs = NULL;
        size_t cn = 0;
        if (chars.t == V_STR) {
                cs = chars.s->s;
                cn = chars.s->len;
        } else if (given(chars) && chars.t != V_NONE)
                fail(st, "strip arg must be None or str");
        size_t a = 0, b = s->len;
        while (left && a < b) {
                uint32_t cp = u8_decode(s->s, s->len, a);
                if (cs ? !in_chars(cs, cn, cp) : !py_space(cp))
                        break;
                a = u8_next(s->s, s->len, a);
        }
        while (right && b > a) {
                size_t k = b - 1;
                while (k > a && ((unsigned char) s->s[k] & 0xC0) == 0x80)
                        k--;
                uint32_t cp = u8_decode(s->s, s->len, k);
                if (cs ? !in_chars(cs, cn, cp) : !py_space(cp))
                        break;
                b = k;
        }
        return mkstr(st, s->s + a, b - a);
}

static jv str_split(struct rstate *st, struct jstr *s, jv sep, jv maxsplit, bool from_right) {
        int64_t maxs = given(maxsplit) ? arg_int(st, "split", maxsplit) : -1;
        jv out = mklist(st, V_LIST, 0);
        step(st, s->len / 16 + 1);
        if (!given(sep) || sep.t == V_NONE) {
                /* whitespace runs */
                struct jlist *parts = out.l;
                if (!from_right) {
                        size_t i = 0;
                        while (i < s->len) {
                                while (i < s->len && py_space(u8_decode(s->s, s->len, i)))
                                        i = u8_next(s->s, s->len, i);
                                if (i >= s->len)
                                        break;
                                if (maxs >= 0 && (int64_t) parts->n == maxs) {
                                        size_t e = s->len;
                                        while (e > i && py_space((unsigned char) s->s[e - 1]))
                                                e--;
                                        list_push(st, parts, mkstr(st, s->s + i, e - i));
                                        break;
                                }
                                size_t j = i;
                                while (j < s->len && !py_space(u8_decode(s->s, s->len, j)))
                                        j = u8_next(s->s, s->len, j);
                                list_push(st, parts, mkstr(st, s->s + i, j - i));
                                i = j;
                        }
                        return out;
                }
                fail(st, "unsupported construct: rsplit() without a separator");
        }
        struct jstr *sp = arg_str(st, "split", sep);
        if (sp->len == 0)
                fail(st, "empty separator");
        if (!from_right) {
                size_t i = 0;
                for (;;) {
                        const char *m = (maxs < 0 || (int64_t) out.l->n < maxs)
                                                ? memmem(s->s + i, s->len - i, sp->s, sp->len)
                                                : NULL;
                        if (!m) {
                                list_push(st, out.l, mkstr(st, s->s + i, s->len - i));
                                return out;
                        }
                        list_push(st, out.l, mkstr(st, s->s + i, (size_t) (m - (s->s + i))));
                        i = (size_t) (m - s->s) + sp->len;
                }
        }
        /* rsplit with separator: collect from the right, then reverse */
        jv rev = mklist(st, V_LIST, 0);
        size_t end = s->len;
        for (;;) {
                const char *m = NULL;
                if (maxs < 0 || (int64_t) rev.l->n < maxs)
                        for (size_t k = end; k >= sp->len; k--)
                                if (memcmp(s->s + k - sp->len, sp->s, sp->len) == 0) {
                                        m = s->s + k - sp->len;
                                        break;
                                }
                if (!m) {
                        list_push(st, rev.l, mkstr(st, s->s, end));
                        break;
                }
                list_push(st, rev.l, mkstr(st, m + sp->len, (size_t) (s->s + end - (m + sp->len))));
                end = (size_t) (m - s->s);
        }
        for (size_t i = rev.l->n; i > 0; i--)
                list_push(st, out.l, rev.l->v[i - 1]);
        return out;
}

static jv str_replace(struct rstate *st, struct jstr *s, struct jstr *old, struct jstr *new, int64_t count) {
        struct sbuf sb = {};
        sb_put(st, &sb, "", 0);
        size_t i = 0;
        int64_t done = 0;
        step(st, s->len / 16 + 1);
        if (old->len == 0) {
                /* Python inserts `new` between every character and at both ends */
                for (;;) {
                        if (count >= 0 && done >= count) {
                                sb_put(st, &sb, s->s + i, s->len - i);
                                break;
                        }
                        sb_put(st, &sb, new->s, new->len);
                        done++;
                        if (i >= s->len)
                                break;
                        size_t nx = u8_next(s->s, s->len, i);
                        sb_put(st, &sb, s->s + i, nx - i);
                        i = nx;
                }
                return sb_value(st, &sb);
        }
        for (;;) {
                const char *m = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
                if (!m) {
                        sb_put(st, &sb, s->s + i, s->len - i);
                        break;
                }
                sb_put(st, &sb, s->s + i, (size_t) (m - (s->s + i)));
                sb_put(st, &sb, new->s, new->len);
                i = (size_t) (m - s->s) + old->len;
                done++;
        }
        return sb_value(st, &sb);
}

static uint32_t cp_upper(uint32_t c) {
        if (c >= 'a' && c <= 'z')
                return c - 32;
        if ((c >= 0xE0 && c <= 0xFE && c != 0xF7))
                return c - 32;
        if (c >= 0x430 && c <= 0x44F)
                return c - 32;
        if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2)
                return c - 32;
        return c;
}
static uint32_t cp_lower(uint32_t c) {
        if (c >= 'A' && c <= 'Z')
                return c + 32;
        if ((c >= 0xC0 && c <= 0xDE && c != 0xD7))
                return c + 32;
        if (c >= 0x410 && c <= 0x42F)
                return c + 32;
        if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2)
                return c + 32;
        return c;
}
static bool cp_alpha(uint32_t c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0xC0;
}

/* mode: 'u' upper, 'l' lower, 't' title, 'c' capitalize */
static jv str_case(struct rstate *st, struct jstr *s, char mode) {
        struct sbuf sb = {};
        sb_put(st, &sb, "", 0);
        bool prev_alpha = false, first = true;
        for (size_t i = 0; i < s->len;) {
                size_t nx = u8_next(s->s, s->len, i);
                uint32_t cp = u8_decode(s->s, s->len, i), r = cp;
                if (mode == 'u')
                        r = cp_upper(cp);
                else if (mode == 'l')
                        r = cp_lower(cp);
                else if (mode == 't')
                        r = prev_alpha ? cp_lower(cp) : cp_upper(cp);
                else
                        r = first ? cp_upper(cp) : cp_lower(cp);
                prev_alpha = cp_alpha(cp);
                first = false;
                if (r == cp)
                        sb_put(st, &sb, s->s + i, nx - i);
                else {
                        char buf[4];
                        size_t o = 0;
                        if (r < 0x80)
                                buf[o++] = (char) r;
                        else if (r < 0x800) {
                                buf[o++] = (char) (0xC0 | (r >> 6));
                                buf[o++] = (char) (0x80 | (r & 0x3F));
                        } else {
                                buf[o++] = (char) (0xE0 | (r >> 12));
                                buf[o++] = (char) (0x80 | ((r >> 6) & 0x3F));
                                buf[o++] = (char) (0x80 | (r & 0x3F));
                        }
                        sb_put(st, &sb, buf, o);
                }
                i = nx;
        }
        step(st, s->len / 16 + 1);
        return sb_value(st, &sb);
}

static bool str_affix(struct rstate *st, struct jstr *s, jv arg, bool suffix) {
        if (is_seq(arg)) {
                for (size_t i = 0; i < arg.l->n; i++)
                        if (str_affix(st, s, arg.l->v[i], suffix))
                                return true;
                return false;
        }
        struct jstr *a = arg_str(st, suffix ? "endswith" : "startswith", arg);
        if (a->len > s->len)
                return false;
        return memcmp(suffix ? s->s + s->len - a->len : s->s, a->s, a->len) == 0;
}

static int64_t str_find(struct jstr *s, struct jstr *sub, bool from_right) {
        if (sub->len > s->len)
                return -1;
        const char *m = NULL;
        if (!from_right)
                m = memmem(s->s, s->len, sub->s, sub->len);
        else
                for (size_t k = s->len - sub->len + 1; k > 0; k--)
                        if (memcmp(s->s + k - 1, sub->s, sub->len) == 0) {
                                m = s->s + k - 1;
                                break;
                        }
        if (!m)
                return -1;
        return (int64_t) u8_count(s->s, (size_t) (m - s->s));
}

static jv call_value(struct rstate *st, jv callee, const struct args *a);
static jv apply_filter(struct rstate *st, const char *name, jv input, const struct args *a);
static bool apply_test(struct rstate *st, const char *name, jv input, const struct args *a);

static jv str_format(struct rstate *st, struct jstr *s, const struct args *a) {
        struct sbuf sb = {};
        sb_put(st, &sb, "", 0);
        size_t auto_idx = 0;
        for (size_t i = 0; i < s->len; i++) {
                char c = s->s[i];
                if (c == '}' && i + 1 < s->len && s->s[i + 1] == '}') {
                        sb_put(st, &sb, "}", 1);
                        i++;
                        continue;
                }
                if (c != '{') {
                        sb_put(st, &sb, &c, 1);
                        continue;
                }
                if (i + 1 < s->len && s->s[i + 1] == '{') {
                        sb_put(st, &sb, "{", 1);
                        i++;
                        continue;
                }
                const char *e = memchr(s->s + i, '}', s->len - i);
                if (!e)
                        fail(st, "format: single '{' encountered in format string");
                size_t fl = (size_t) (e - (s->s + i + 1));
                const char *field = s->s + i + 1;
                if (memchr(field, ':', fl) || memchr(field, '!', fl) || memchr(field, '.', fl) || memchr(field, '[', fl))
                        fail(st, "unsupported construct: format spec in str.format()");
                jv v;
                if (fl == 0) {
                        if (auto_idx >= a->n_pos)
                                fail(st, "format: replacement index %zu out of range", auto_idx);
                        v = a->pos[auto_idx++];
                } else if (field[0] >= '0' && field[0] <= '9') {
                        size_t k = (size_t) strtoul(field, NULL, 10);
                        if (k >= a->n_pos)
                                fail(st, "format: replacement index %zu out of range", k);
                        v = a->pos[k];
                } else {
                        size_t k;
                        for (k = 0; k < a->n_kw; k++)
                                if (strlen(a->kw_names[k]) == fl && memcmp(a->kw_names[k], field, fl) == 0)
                                        break;
                        if (k == a->n_kw)
                                fail(st, "format: missing key '%.*s'", (int) fl, field);
                        v = a->kw[k];
                }
                put_str(st, &sb, v);
                i += fl + 1;
        }
        return sb_value(st, &sb);
}

/* Methods of dict, list/tuple and str values: one function each (or per family sharing an
 * implementation, told apart by name), looked up in METHODS by the value's kind and the name. */
enum method_on { ON_DICT, ON_SEQ, ON_LIST, ON_STR };

typedef jv (*method_fn)(struct rstate *st, const char *name, jv self, const struct args *a,
                        const char *what);

static jv m_dict_view(struct rstate *st, const char *name, jv self, const struct args *a,
                      const char *what) {
        jv p[1];
        bind(st, what, a, NULL, 0, p);
        jv r = mklist(st, V_LIST, self.d->n);
        for (size_t i = 0; i < self.d->n; i++) {
                if (name[0] == 'i') {
                        jv t = mklist(st, V_TUPLE, 2);
                        list_push(st, t.l, self.d->k[i]);
                        list_push(st, t.l, self.d->v[i]);
                        list_push(st, r.l, t);
                } else
                        list_push(st, r.l, name[0] == 'k' ? self.d->k[i] : self.d->v[i]);
        }
        step(st, self.d->n);
        return r;
}

static jv m_dict_get(struct rstate *st, const char *name, jv self, const struct args *a,
                     const char *what) {
        static const char *const ps[] = {"key", "default"};
        jv p[2];
        (void) name;
        bind(st, what, a, ps, 2, p);
        if (!given(p[0]))
                fail(st, "get expected at least 1 argument, got 0");
        size_t i;
        if (dict_find(st, self.d, p[0], &i))
                return self.d->v[i];
        return given(p[1]) ? p[1] : NONE;
}

static jv m_dict_copy(struct rstate *st, const char *name, jv self, const struct args *a,
                      const char *what) {
        (void) name, (void) a, (void) what;
        jv r = mkdict(st, V_DICT);
        for (size_t i = 0; i < self.d->n; i++)
                dict_set(st, r.d, self.d->k[i], self.d->v[i]);
        return r;
}

static jv m_seq_find(struct rstate *st, const char *name, jv self, const struct args *a,
                     const char *what) {
        static const char *const ps[] = {"value"};
        jv p[1];
        bind(st, what, a, ps, 1, p);
        int64_t cnt = 0;
        for (size_t i = 0; i < self.l->n; i++)
                if (jv_eq(st, self.l->v[i], p[0])) {
                        if (name[0] == 'i')
                                return mkint((int64_t) i);
                        cnt++;
                }
        if (name[0] == 'i')
                fail(st, "list.index(x): x not in list");
        return mkint(cnt);
}

static jv m_seq_copy(struct rstate *st, const char *name, jv self, const struct args *a,
                     const char *what) {
        (void) name, (void) a, (void) what;
        return do_slice(st, self, NONE, NONE, NONE);
}

/* Jinja2's ImmutableSandbox refuses only append/reverse/insert/sort/extend/remove on lists; pop
 * and clear go through and mutate, as there */
static jv m_list_pop(struct rstate *st, const char *name, jv self, const struct args *a,
                     const char *what) {
        static const char *const ps[] = {"index"};
        jv p[1];
        (void) name;
        bind(st, what, a, ps, 1, p);
        size_t idx;
        if (self.l->n == 0)
                fail(st, "pop from empty list");
        if (!norm_index(given(p[0]) ? arg_int(st, what, p[0]) : -1, self.l->n, &idx))
                fail(st, "pop index out of range");
        jv r = self.l->v[idx];
        memmove(self.l->v + idx, self.l->v + idx + 1, (self.l->n - idx - 1) * sizeof(jv));
        self.l->n--;
        return r;
}

static jv m_list_clear(struct rstate *st, const char *name, jv self, const struct args *a,
                       const char *what) {
        jv p[1];
        (void) name;
        bind(st, what, a, NULL, 0, p);
        self.l->n = 0;
        return NONE;
}

static jv m_str_strip(struct rstate *st, const char *name, jv self, const struct args *a,
                      const char *what) {
        static const char *const ps[] = {"chars"};
        jv p[1];
        bind(st, what, a, ps, 1, p);
        return str_strip(st, self.s, p[0], name[0] != 'r', name[0] != 'l');
}

static jv m_str_split(struct rstate *st, const char *name, jv self, const struct args *a,
                      const char *what) {
        static const char *const ps[] = {"sep", "maxsplit"};
        jv p[2];
        bind(st, what, a, ps, 2, p);
        return str_split(st, self.s, p[0], p[1], name[0] == 'r');
}

static jv m_str_affix(struct rstate *st, const char *name, jv self, const struct args *a,
                      const char *what) {
        static const char *const ps[] = {"prefix"};
        jv p[1];
        bind(st, what, a, ps, 1, p);
        return mkbool(str_affix(st, self.s, p[0], name[0] == 'e'));
}

static jv m_str_case(struct rstate *st, const char *name, jv self, const struct args *a,
                     const char *what) {
        jv p[1];
        bind(st, what, a, NULL, 0, p);
        return str_case(st, self.s, name[0] == 'c' ? 'c' : name[0] == 't' ? 't' : name[0] == 'u' ? 'u' : 'l');
}

static jv m_str_replace(struct rstate *st, const char *name, jv self, const struct args *a,
                        const char *what) {
        static const char *const ps[] = {"old", "new", "count"};
        jv p[3];
        (void) name;
        bind(st, what, a, ps, 3, p);
        return str_replace(st, self.s, arg_str(st, what, p[0]), arg_str(st, what, p[1]),
                           given(p[2]) ? arg_int(st, what, p[2]) : -1);
}

static jv m_str_find(struct rstate *st, const char *name, jv self, const struct args *a,
                     const char *what) {
        static const char *const ps[] = {"sub"};
        jv p[1];
        bind(st, what, a, ps, 1, p);
        int64_t r = str_find(self.s, arg_str(st, what, p[0]), name[0] == 'r');
        if (r < 0 && strstr(name, "index"))
                fail(st, "substring not found");
        return mkint(r);
}

static jv m_str_count(struct rstate *st, const char *name, jv self, const struct args *a,
                      const char *what) {
        static const char *const ps[] = {"sub"};
        jv p[1];
        struct jstr *s = self.s;
        (void) name;
        bind(st, what, a, ps, 1, p);
        struct jstr *sub = arg_str(st, what, p[0]);
        if (sub->len == 0)
                return mkint((int64_t) u8_count(s->s, s->len) + 1);
        int64_t n = 0;
        for (const char *q = s->s; (q = memmem(q, s->len - (size_t) (q - s->s), sub->s, sub->len)); q += sub->len)
                n++;
        return mkint(n);
}

static jv m_str_format(struct rstate *st, const char *name, jv self, const struct args *a,
                       const char *what) {
        (void) name, (void) what;
        return str_format(st, self.s, a);
}

static jv m_str_join(struct rstate *st, const char *name, jv self, const struct args *a,
                     const char *what) {
        static const char *const ps[] = {"iterable"};
        jv p[1];
        struct jstr *s = self.s;
        (void) name;
        bind(st, what, a, ps, 1, p);
        struct jlist *l = iter_list(st, p[0]);
        struct sbuf sb = {};
        sb_put(st, &sb, "", 0);
        for (size_t i = 0; i < l->n; i++) {
                if (i)
                        sb_put(st, &sb, s->s, s->len);
                sb_put(st, &sb, arg_str(st, what, l->v[i])->s, l->v[i].s->len);
        }
        return sb_value(st, &sb);
}

static jv m_str_splitlines(struct rstate *st, const char *name, jv self, const struct args *a,
                           const char *what) {
        jv p[1];
        struct jstr *s = self.s;
        (void) name;
        bind(st, what, a, NULL, 0, p);
        jv r = mklist(st, V_LIST, 0);
        size_t i = 0, start = 0;
        while (i < s->len) {
                char c = s->s[i];
                if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) {
                        list_push(st, r.l, mkstr(st, s->s + start, i - start));
                        if (c == '\r' && i + 1 < s->len && s->s[i + 1] == '\n')
                                i++;
                        start = ++i;
                } else
                        i++;
        }
        if (start < s->len)
                list_push(st, r.l, mkstr(st, s->s + start, s->len - start));
        return r;
}

/* isdigit, isalpha, isalnum, isspace, isupper, islower */
static jv m_str_is(struct rstate *st, const char *name, jv self, const struct args *a,
                   const char *what) {
        jv p[1];
        struct jstr *s = self.s;
        bind(st, what, a, NULL, 0, p);
        if (s->len == 0)
                return mkbool(false);
        bool cased = false, casing = streq(name, "isupper") || streq(name, "islower");
        for (size_t i = 0; i < s->len; i = u8_next(s->s, s->len, i)) {
                uint32_t c = u8_decode(s->s, s->len, i);
                bool digit = c >= '0' && c <= '9', alpha = cp_alpha(c);
                if (streq(name, "isdigit") && !digit)
                        return mkbool(false);
                if (streq(name, "isalpha") && !alpha)
                        return mkbool(false);
                if (streq(name, "isalnum") && !alpha && !digit)
                        return mkbool(false);
                if (streq(name, "isspace") && !py_space(c))
                        return mkbool(false);
                if (casing && (cp_upper(c) != c || cp_lower(c) != c)) {
                        cased = true;
                        if (name[2] == 'u' ? cp_upper(c) != c : cp_lower(c) != c)
                                return mkbool(false);
                }
        }
        return mkbool(casing ? cased : true);
}

static const struct {
        enum method_on on;
        const char *name;
        method_fn fn;
} METHODS[] = {
        { ON_DICT, "items", m_dict_view },      { ON_DICT, "keys", m_dict_view },
        { ON_DICT, "values", m_dict_view },     { ON_DICT, "get", m_dict_get },
        { ON_DICT, "copy", m_dict_copy },       { ON_SEQ, "index", m_seq_find },
        { ON_SEQ, "count", m_seq_find },        { ON_SEQ, "copy", m_seq_copy },
        { ON_LIST, "pop", m_list_pop },         { ON_LIST, "clear", m_list_clear },
        { ON_STR, "strip", m_str_strip },       { ON_STR, "lstrip", m_str_strip },
        { ON_STR, "rstrip", m_str_strip },      { ON_STR, "split", m_str_split },
        { ON_STR, "rsplit", m_str_split },      { ON_STR, "startswith", m_str_affix },
        { ON_STR, "endswith", m_str_affix },    { ON_STR, "upper", m_str_case },
        { ON_STR, "lower", m_str_case },        { ON_STR, "title", m_str_case },
        { ON_STR, "capitalize", m_str_case },   { ON_STR, "replace", m_str_replace },
        { ON_STR, "find", m_str_find },         { ON_STR, "rfind", m_str_find },
        { ON_STR, "index", m_str_find },        { ON_STR, "rindex", m_str_find },
        { ON_STR, "count", m_str_count },       { ON_STR, "format", m_str_format },
        { ON_STR, "join", m_str_join },         { ON_STR, "splitlines", m_str_splitlines },
        { ON_STR, "isdigit", m_str_is },        { ON_STR, "isalpha", m_str_is },
        { ON_STR, "isalnum", m_str_is },        { ON_STR, "isspace", m_str_is },
        { ON_STR, "isupper", m_str_is },        { ON_STR, "islower", m_str_is },
};

static jv call_method(struct rstate *st, struct jmethod *m, const struct args *a) {
        jv self = m->self;
        const char *name = m->name;
        char what[64];
        snprintf(what, sizeof(what), "%s.%s()", type_name(self), name);
        /* a dict's methods, a list's or tuple's (pop and clear: lists only), else a string's */
        bool dict = self.t == V_DICT, seq = !dict && is_seq(self);
        for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++) {
                enum method_on on = METHODS[i].on;
                bool fits = dict ? on == ON_DICT
                            : seq ? on == ON_SEQ || (on == ON_LIST && self.t == V_LIST)
                                  : on == ON_STR;
                if (fits && streq(name, METHODS[i].name))
                        return METHODS[i].fn(st, name, self, a, what);
        }
        if (dict || seq)
                fail(st, "access to attribute '%s' of '%s' object is unsafe", name, type_name(self));
        fail(st, "unsupported method '%s' of str", name);
}

/* ---- builtins ---- */

static jv call_builtin(struct rstate *st, int b, const struct args *a) {
        jv p[3];
        switch (b) {
        case B_RANGE: {
                static const char *const ps[] = {"start", "stop", "step"};
                if (a->n_kw)
                        fail(st, "range() takes no keyword arguments");
                bind(st, "range()", a, ps, 3, p);
                int64_t lo = 0, hi, sp = 1;
                if (a->n_pos == 0)
                        fail(st, "range expected at least 1 argument, got 0");
                if (a->n_pos == 1)
                        hi = arg_int(st, "range", p[0]);
                else {
                        lo = arg_int(st, "range", p[0]);
                        hi = arg_int(st, "range", p[1]);
                        if (a->n_pos == 3)
                                sp = arg_int(st, "range", p[2]);
                }
                if (sp == 0)
                        fail(st, "range() arg 3 must not be zero");
                jv r = mklist(st, V_LIST, 0);
                for (int64_t i = lo; sp > 0 ? i < hi : i > hi; i += sp) {
                        step(st, 1);
                        list_push(st, r.l, mkint(i));
                        if (__builtin_add_overflow(i, sp, &(int64_t) {0}))
                                break;
                }
                return r;
        }
        case B_NAMESPACE:
        case B_DICT: {
                jv r = mkdict(st, b == B_NAMESPACE ? V_NS : V_DICT);
                if (a->n_pos > 1)
                        fail(st, "%s() takes at most 1 positional argument", b == B_NAMESPACE ? "namespace" : "dict");
                if (a->n_pos == 1) {
                        jv src = a->pos[0];
                        if (src.t == V_DICT || src.t == V_NS) {
                                for (size_t i = 0; i < src.d->n; i++)
                                        dict_set(st, r.d, src.d->k[i], src.d->v[i]);
                        } else if (is_seq(src)) {
                                for (size_t i = 0; i < src.l->n; i++) {
                                        jv it = src.l->v[i];
                                        if (!is_seq(it) || it.l->n != 2)
                                                fail(st, "dictionary update sequence element #%zu has the wrong length", i);
                                        dict_set(st, r.d, it.l->v[0], it.l->v[1]);
                                }
                        } else
                                fail(st, "'%s' object is not iterable", type_name(src));
                }
                for (size_t k = 0; k < a->n_kw; k++)
                        dict_set_c(st, r.d, a->kw_names[k], a->kw[k]);
                return r;
        }
        case B_RAISE: {
                struct sbuf sb = {};
                sb_put(st, &sb, "", 0);
                if (a->n_pos > 0)
                        put_str(st, &sb, a->pos[0]);
                fail(st, "raise_exception: %s", sb.p);
        }
        case B_STRFTIME: {
                static const char *const ps[] = {"format"};
                bind(st, "strftime_now()", a, ps, 1, p);
                struct jstr *fmt = arg_str(st, "strftime_now", p[0]);
                struct tm tm = {};
                const char *fixed = getenv("X4_TEMPLATE_NOW");
                int y, mo, d;
                if (fixed && sscanf(fixed, "%d-%d-%d", &y, &mo, &d) == 3) {
                        tm.tm_year = y - 1900;
                        tm.tm_mon = mo - 1;
                        tm.tm_mday = d;
                        tm.tm_hour = 12;
                        time_t tt = timegm(&tm);
                        gmtime_r(&tt, &tm);
                        tm.tm_hour = 0;
                } else {
                        time_t now = time(NULL);
                        localtime_r(&now, &tm);
                }
                char buf[512];
                size_t n = fmt->len ? strftime(buf, sizeof(buf), fmt->s, &tm) : 0;
                return mkstr(st, buf, n);
        }
        }
        fail(st, "unknown builtin");
}

/* ---- evaluation ---- */

static jv eval(struct rstate *st, struct frame *f, const struct jnode *n);
static int exec_body(struct rstate *st, struct frame *f, struct jnode *const *body, size_t n);

enum { CTRL_NONE, CTRL_BREAK, CTRL_CONTINUE };

static void eval_args(struct rstate *st, struct frame *f, const struct jnode *n, struct args *a) {
        a->n_pos = n->n_kids;
        a->pos = n->n_kids ? ralloc(st, n->n_kids * sizeof(jv)) : NULL;
        for (size_t i = 0; i < n->n_kids; i++)
                a->pos[i] = eval(st, f, n->kids[i]);
        a->n_kw = n->n_kw;
        a->kw_names = n->kw_names;
        a->kw = n->n_kw ? ralloc(st, n->n_kw * sizeof(jv)) : NULL;
        for (size_t i = 0; i < n->n_kw; i++)
                a->kw[i] = eval(st, f, n->kw_vals[i]);
}

static jv call_macro(struct rstate *st, struct jmacro *m, const struct args *a) {
        const struct jnode *def = m->node;
        char what[256];
        snprintf(what, sizeof(what), "macro '%s'", def->str);
        if (st->depth >= st->lim->max_depth) {
                st->err = E2BIG;
                fail(st, "template render exceeded the macro call depth of %u", st->lim->max_depth);
        }
        jv *vals = ralloc(st, (def->n_targets + 1) * sizeof(jv));
        bind(st, what, a, def->targets, def->n_targets, vals);
        struct frame *mf = push_frame(st, m->scope);
        for (size_t i = 0; i < def->n_targets; i++) {
                jv v = vals[i];
                if (!given(v))
                        v = def->kw_vals[i] ? eval(st, mf, def->kw_vals[i])
                                            : (jv) {.t = V_UNDEF, .undef_name = def->targets[i]};
                frame_set(st, mf, def->targets[i], v);
        }
        struct sbuf buf = {}, *saved = st->out;
        sb_put(st, &buf, "", 0);
        st->out = &buf;
        st->depth++;
        const struct jnode *at = st->at;
        exec_body(st, mf, def->kids, def->n_kids);
        st->at = at;
        st->depth--;
        st->out = saved;
        return sb_value(st, &buf);
}

static jv call_value(struct rstate *st, jv callee, const struct args *a) {
        switch (callee.t) {
        case V_MACRO:
                return call_macro(st, callee.m, a);
        case V_BUILTIN:
                return call_builtin(st, callee.builtin, a);
        case V_METHOD:
                return call_method(st, callee.meth, a);
        case V_UNDEF:
                if (callee.undef_name)
                        fail(st, "'%s' is undefined (called as a function)", callee.undef_name);
                fail(st, "undefined value called as a function");
        default:
                fail(st, "'%s' object is not callable", type_name(callee));
        }
}

static bool test_node(struct rstate *st, struct frame *f, const struct jnode *n, jv input) {
        struct args a = {};
        eval_args(st, f, n, &a);
        bool r = apply_test(st, n->str, input, &a);
        return n->op ? !r : r;
}

static jv eval_node(struct rstate *st, struct frame *f, const struct jnode *n) {
        step(st, 1);
        st->at = n;
        switch (n->kind) {
        case JN_CONST_NONE:
                return NONE;
        case JN_CONST_BOOL:
                return mkbool(n->i != 0);
        case JN_CONST_INT:
                return mkint(n->i);
        case JN_CONST_FLOAT:
                return mkfloat(n->f);
        case JN_CONST_STR:
                return mkstr(st, n->str, n->len);
        case JN_NAME:
                return lookup(st, f, n->str);
        case JN_LIST:
        case JN_TUPLE: {
                jv l = mklist(st, n->kind == JN_LIST ? V_LIST : V_TUPLE, n->n_kids);
                for (size_t i = 0; i < n->n_kids; i++)
                        list_push(st, l.l, eval(st, f, n->kids[i]));
                return l;
        }
        case JN_DICT: {
                jv d = mkdict(st, V_DICT);
                for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
                        jv k = eval(st, f, n->kids[i]);
                        if (k.t == V_LIST || k.t == V_DICT || k.t == V_UNDEF) {
                                st->at = n->kids[i];
                                fail(st, "unhashable type: '%s'", type_name(k));
                        }
                        dict_set(st, d.d, k, eval(st, f, n->kids[i + 1]));
                }
                return d;
        }
        case JN_GETATTR: {
                jv o = eval(st, f, n->a);
                st->at = n;
                return get_attr(st, o, n->str);
        }
        case JN_GETITEM: {
                jv o = eval(st, f, n->a), k = eval(st, f, n->b);
                st->at = n;
                return get_item(st, o, k);
        }
        case JN_SLICE: {
                jv o = eval(st, f, n->a);
                jv a = n->b ? eval(st, f, n->b) : NONE, b = n->c ? eval(st, f, n->c) : NONE,
                   c = n->d ? eval(st, f, n->d) : NONE;
                st->at = n;
                return do_slice(st, o, a, b, c);
        }
        case JN_CALL: {
                jv callee = eval(st, f, n->a);
                struct args a = {};
                eval_args(st, f, n, &a);
                st->at = n;
                return call_value(st, callee, &a);
        }
        case JN_FILTER: {
                jv in = eval(st, f, n->a);
                struct args a = {};
                eval_args(st, f, n, &a);
                st->at = n;
                return apply_filter(st, n->str, in, &a);
        }
        case JN_TEST: {
                jv in = eval(st, f, n->a);
                bool r = test_node(st, f, n, in);
                return mkbool(r);
        }
        case JN_NEG:
        case JN_POS: {
                jv v = eval(st, f, n->a);
                st->at = n;
                if (v.t == V_UNDEF)
                        fail_undefined(st, v);
                if (!is_num(v))
                        fail(st, "bad operand type for unary %c: '%s'", n->kind == JN_NEG ? '-' : '+', type_name(v));
                if (n->kind == JN_POS)
                        return v.t == V_BOOL ? mkint(v.b) : v;
                if (v.t == V_FLOAT)
                        return mkfloat(-v.f);
                if (num_i(v) == INT64_MIN)
                        fail_bigint(st);
                return mkint(-num_i(v));
        }
        case JN_NOT:
                return mkbool(!truthy(eval(st, f, n->a)));
        case JN_AND: {
                jv l = eval(st, f, n->a);
                return truthy(l) ? eval(st, f, n->b) : l;
        }
        case JN_OR: {
                jv l = eval(st, f, n->a);
                return truthy(l) ? l : eval(st, f, n->b);
        }
        case JN_BINOP: {
                jv l = eval(st, f, n->a), r = eval(st, f, n->b);
                st->at = n;
                return arith(st, n->op, l, r);
        }
        case JN_COMPARE: {
                jv l = eval(st, f, n->kids[0]);
                for (size_t i = 1; i < n->n_kids; i++) {
                        jv r = eval(st, f, n->kids[i]);
                        st->at = n;
                        bool ok;
                        switch (n->ops[i - 1]) {
                        case JC_EQ:
                                ok = jv_eq(st, l, r);
                                break;
                        case JC_NE:
                                ok = !jv_eq(st, l, r);
                                break;
                        case JC_LT:
                                ok = jv_cmp(st, l, r, "<") < 0;
                                break;
                        case JC_LE:
                                ok = jv_cmp(st, l, r, "<=") <= 0;
                                break;
                        case JC_GT:
                                ok = jv_cmp(st, l, r, ">") > 0;
                                break;
                        case JC_GE:
                                ok = jv_cmp(st, l, r, ">=") >= 0;
                                break;
                        case JC_IN:
                                ok = contains(st, r, l);
                                break;
                        default:
                                ok = !contains(st, r, l);
                                break;
                        }
                        if (!ok)
                                return mkbool(false);
                        l = r;
                }
                return mkbool(true);
        }
        case JN_COND:
                if (truthy(eval(st, f, n->a)))
                        return eval(st, f, n->b);
                return n->c ? eval(st, f, n->c) : UNDEF;
        default:
                fail(st, "internal error: statement node in an expression");
        }
}

/* C recursion bound: statement and expression nesting (each bounded by the parser) compound
 * through macro calls; this keeps the stack use of one render under a few MB. */
#define RENDER_MAX_NESTING 3000u

static jv eval(struct rstate *st, struct frame *f, const struct jnode *n) {
        if (++st->nesting > RENDER_MAX_NESTING) {
                st->err = E2BIG;
                fail(st, "template render exceeded the nesting depth of %u", RENDER_MAX_NESTING);
        }
        jv r = eval_node(st, f, n);
        st->nesting--;
        return r;
}

static void assign(struct rstate *st, struct frame *f, const struct jnode *n, const char *const *targets, size_t nt,
                   jv v) {
        if (nt == 1) {
                frame_set(st, f, targets[0], v);
                return;
        }
        struct jlist *l;
        if (is_seq(v))
                l = v.l;
        else if (v.t == V_DICT || v.t == V_STR)
                l = iter_list(st, v);
        else
                fail(st, "cannot unpack non-iterable %s object", type_name(v));
        if (l->n != nt) {
                st->at = n;
                fail(st, "%s values to unpack (expected %zu, got %zu)", l->n > nt ? "too many" : "not enough", nt, l->n);
        }
        for (size_t i = 0; i < nt; i++)
                frame_set(st, f, targets[i], l->v[i]);
}

/* `for i in range(...)` without a filter iterates without building the list */
static bool lazy_range(struct rstate *st, struct frame *f, const struct jnode *n, struct jloop *l) {
        const struct jnode *c = n->a;
        if (n->b || c->kind != JN_CALL || c->a->kind != JN_NAME || c->n_kw || c->n_kids < 1 || c->n_kids > 3)
                return false;
        jv fn = lookup(st, f, c->a->str);
        if (fn.t != V_BUILTIN || fn.builtin != B_RANGE)
                return false;
        int64_t a[3];
        for (size_t i = 0; i < c->n_kids; i++)
                a[i] = arg_int(st, "range", eval(st, f, c->kids[i]));
        st->at = c;
        int64_t lo = c->n_kids == 1 ? 0 : a[0], hi = c->n_kids == 1 ? a[0] : a[1], sp = c->n_kids == 3 ? a[2] : 1;
        if (sp == 0)
                fail(st, "range() arg 3 must not be zero");
        __int128 cnt = 0;
        if (sp > 0 && hi > lo)
                cnt = ((__int128) hi - lo + sp - 1) / sp;
        else if (sp < 0 && hi < lo)
                cnt = ((__int128) lo - hi - sp - 1) / -sp;
        *l = (struct jloop) {.lo = lo, .step = sp, .len = (size_t) MIN(cnt, (__int128) SIZE_MAX / 2)};
        return true;
}

static int exec_for(struct rstate *st, struct frame *f, const struct jnode *n) {
        struct jloop proto = {};
        if (!lazy_range(st, f, n, &proto)) {
                jv it = eval(st, f, n->a);
                st->at = n;
                if (it.t == V_NONE || is_num(it))
                        fail(st, "'%s' object is not iterable", type_name(it));
                struct jlist *items = iter_list(st, it);
                if (n->b) {
                        /* `for x in xs if cond`: filter first, loop variables count the kept items */
                        jv kept = mklist(st, V_LIST, 0);
                        struct frame *tf = push_frame(st, f);
                        for (size_t i = 0; i < items->n; i++) {
                                tf->n = 0;
                                assign(st, tf, n, n->targets, n->n_targets, items->v[i]);
                                if (truthy(eval(st, tf, n->b)))
                                        list_push(st, kept.l, items->v[i]);
                        }
                        items = kept.l;
                }
                proto.items = items;
                proto.len = items->n;
        }
        size_t len = proto.len;
        struct frame *lf = push_frame(st, f);
        for (size_t i = 0; i < len; i++) {
                step(st, 1);
                struct jloop *loop = ralloc(st, sizeof(*loop));
                *loop = proto;
                loop->i = i;
                lf->n = 0; /* a fresh scope per iteration, as in Jinja2 */
                frame_set(st, lf, "loop", (jv) {.t = V_LOOP, .loop = loop});
                jv item = proto.items ? proto.items->v[i] : mkint(proto.lo + (int64_t) i * proto.step);
                assign(st, lf, n, n->targets, n->n_targets, item);
                int c = exec_body(st, lf, n->kids, n->n_kids);
                if (c == CTRL_BREAK)
                        break;
        }
        if (len == 0)
                return exec_body(st, f, n->else_kids, n->n_else);
        return CTRL_NONE;
}

static int exec_body_inner(struct rstate *st, struct frame *f, struct jnode *const *body, size_t count);

static int exec_body(struct rstate *st, struct frame *f, struct jnode *const *body, size_t count) {
        if (++st->nesting > RENDER_MAX_NESTING) {
                st->err = E2BIG;
                fail(st, "template render exceeded the nesting depth of %u", RENDER_MAX_NESTING);
        }
        int r = exec_body_inner(st, f, body, count);
        st->nesting--;
        return r;
}

static int exec_body_inner(struct rstate *st, struct frame *f, struct jnode *const *body, size_t count) {
        for (size_t i = 0; i < count; i++) {
                const struct jnode *n = body[i];
                step(st, 1);
                st->at = n;
                switch (n->kind) {
                case JN_TEXT:
                        sb_put(st, st->out, n->str, n->len);
                        break;
                case JN_OUTPUT: {
                        jv v = eval(st, f, n->a);
                        put_str(st, st->out, v);
                        break;
                }
                case JN_IF: {
                        int c;
                        if (!n->a || truthy(eval(st, f, n->a)))
                                c = exec_body(st, f, n->kids, n->n_kids);
                        else
                                c = exec_body(st, f, n->else_kids, n->n_else);
                        if (c != CTRL_NONE)
                                return c;
                        break;
                }
                case JN_FOR: {
                        int c = exec_for(st, f, n);
                        if (c != CTRL_NONE)
                                return c;
                        break;
                }
                case JN_SET: {
                        jv v = eval(st, f, n->a);
                        st->at = n;
                        if (n->str) {
                                jv ns = lookup(st, f, n->str);
                                if (ns.t != V_NS)
                                        fail(st, "cannot assign attribute on non-namespace object '%s'", n->str);
                                dict_set_c(st, ns.d, n->str2, v);
                        } else
                                assign(st, f, n, n->targets, n->n_targets, v);
                        break;
                }
                case JN_SETBLOCK: {
                        struct sbuf buf = {}, *saved = st->out;
                        sb_put(st, &buf, "", 0);
                        st->out = &buf;
                        int c = exec_body(st, f, n->kids, n->n_kids);
                        st->out = saved;
                        frame_set(st, f, n->targets[0], sb_value(st, &buf));
                        if (c != CTRL_NONE)
                                return c;
                        break;
                }
                case JN_MACRO: {
                        struct jmacro *m = ralloc(st, sizeof(*m));
                        m->node = n;
                        m->scope = f;
                        frame_set(st, f, n->str, (jv) {.t = V_MACRO, .m = m});
                        break;
                }
                case JN_BREAK:
                        return CTRL_BREAK;
                case JN_CONTINUE:
                        return CTRL_CONTINUE;
                case JN_FILTERBLOCK: {
                        struct sbuf buf = {}, *saved = st->out;
                        sb_put(st, &buf, "", 0);
                        st->out = &buf;
                        int c = exec_body(st, f, n->kids, n->n_kids);
                        st->out = saved;
                        jv v = sb_value(st, &buf);
                        /* apply the chain innermost first */
                        const struct jnode *chain[64];
                        size_t nc = 0;
                        for (const struct jnode *k = n->a; k && nc < ELEMENTSOF(chain); k = k->a)
                                chain[nc++] = k;
                        for (size_t k = nc; k > 0; k--) {
                                struct args a = {};
                                eval_args(st, f, chain[k - 1], &a);
                                st->at = chain[k - 1];
                                v = apply_filter(st, chain[k - 1]->str, v, &a);
                        }
                        put_str(st, st->out, v);
                        if (c != CTRL_NONE)
                                return c;
                        break;
                }
                default:
                        put_str(st, st->out, eval(st, f, n));
                }
        }
        return CTRL_NONE;
}

/* ---- filters ---- */

static jv attr_path(struct rstate *st, jv item, jv attribute) {
        if (attribute.t == V_INT)
                return get_item(st, item, attribute);
        struct jstr *path = arg_str(st, "attribute", attribute);
        const char *s = path->s;
        jv cur = item;
        for (;;) {
                const char *dot = strchr(s, '.');
                size_t len = dot ? (size_t) (dot - s) : strlen(s);
                char *part = ralloc(st, len + 1);
                memcpy(part, s, len);
                bool digits = len > 0;
                for (size_t i = 0; i < len; i++)
                        digits = digits && part[i] >= '0' && part[i] <= '9';
                cur = digits ? get_item(st, cur, mkint(strtoll(part, NULL, 10))) : get_item(st, cur, mkcstr(st, part));
                if (!dot)
                        return cur;
                s = dot + 1;
        }
}

static jv sort_key(struct rstate *st, jv v, bool case_sensitive) {
        if (!case_sensitive && v.t == V_STR)
                return str_case(st, v.s, 'l');
        return v;
}

static void sort_values(struct rstate *st, jv *keys, jv *vals, size_t n, bool reverse) {
        /* stable insertion sort (lists in templates are short; steps are counted) */
        for (size_t i = 1; i < n; i++) {
                jv k = keys[i], v = vals[i];
                size_t j = i;
                while (j > 0) {
                        step(st, 1);
                        int c = jv_cmp(st, keys[j - 1], k, "<");
                        if (reverse ? c >= 0 : c <= 0)
                                break;
                        keys[j] = keys[j - 1];
                        vals[j] = vals[j - 1];
                        j--;
                }
                keys[j] = k;
                vals[j] = v;
        }
}

static const char *const KNOWN_FILTERS[] = {
        "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
        "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "items", "join",
        "last", "length", "list", "lower", "map", "max", "min", "pprint", "random", "reject", "rejectattr",
        "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort", "string", "striptags",
        "sum", "title", "tojson", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount",
        "wordwrap", "xmlattr", NULL};

static jv select_common(struct rstate *st, jv input, const struct args *a, bool by_attr, bool keep) {
        jv r = mklist(st, V_LIST, 0);
        r.l->gen = true;
        if (!truthy(input))
                return r;
        struct jlist *l = iter_list(st, input);
        size_t first_arg = by_attr ? 1 : 0;
        if (by_attr && a->n_pos < 1)
                fail(st, "%s: missing attribute name", keep ? "selectattr" : "rejectattr");
        const char *test = a->n_pos > first_arg ? arg_str(st, "test name", a->pos[first_arg])->s : NULL;
        struct args ta = {.pos = a->n_pos ? a->pos + MIN(a->n_pos, first_arg + 1) : NULL, .n_pos = a->n_pos > first_arg + 1 ? a->n_pos - first_arg - 1 : 0};
        for (size_t i = 0; i < l->n; i++) {
                step(st, 1);
                jv v = by_attr ? attr_path(st, l->v[i], a->pos[0]) : l->v[i];
                bool ok = test ? apply_test(st, test, v, &ta) : truthy(v);
                if (ok == keep)
                        list_push(st, r.l, l->v[i]);
        }
        return r;
}

/* Jinja filters by name, one function each (the subset real templates use; KNOWN_FILTERS lists
 * the ones refused by name). */
typedef jv (*filter_fn)(struct rstate *st, const char *name, jv in, const struct args *a,
                        const char *what);

static jv filter_tojson(struct rstate *st, const char *name, jv in, const struct args *a,
                        const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
        bind(st, what, a, ps, 4, p);
        int indent = -1;
        if (given(p[1]) && p[1].t != V_NONE) {
                int64_t ind = arg_int(st, what, p[1]);
                if (ind > 1000)
                        fail(st, "unsupported construct: tojson indent %" PRId64 " (at most 1000)", ind);
                indent = ind < 0 ? 0 : (int) ind; /* json.dumps: a negative indent indents by "" */
        }
        bool compact = false;
        if (given(p[2]) && p[2].t != V_NONE) {
                jv s = p[2];
                if (!is_seq(s) || s.l->n != 2 || s.l->v[0].t != V_STR || s.l->v[1].t != V_STR)
                        fail(st, "tojson: separators must be a pair of strings");
                const char *x = s.l->v[0].s->s, *y = s.l->v[1].s->s;
                if (streq(x, ",") && streq(y, ":"))
                        compact = true;
                else if (!(streq(y, ": ") && (streq(x, ", ") || (streq(x, ",") && indent >= 0))))
                        fail(st, "unsupported tojson separators ('%s', '%s')", x, y);
        }
        return do_tojson(st, in, given(p[0]) && truthy(p[0]), indent, compact, given(p[3]) && truthy(p[3]));
}

static jv filter_length(struct rstate *st, const char *name, jv in, const struct args *a,
                        const char *what) {
        jv p[6];
        (void) name;
        bind(st, what, a, NULL, 0, p);
        switch (in.t) {
        case V_UNDEF:
                return mkint(0);
        case V_STR:
                return mkint((int64_t) u8_count(in.s->s, in.s->len));
        case V_LIST:
        case V_TUPLE:
                if (in.l->gen)
                        fail(st, "object of type 'generator' has no len()");
                return mkint((int64_t) in.l->n);
        case V_DICT:
                return mkint((int64_t) in.d->n);
        default:
                fail(st, "object of type '%s' has no len()", type_name(in));
        }
}

static jv filter_trim(struct rstate *st, const char *name, jv in, const struct args *a,
                      const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"chars"};
        bind(st, what, a, ps, 1, p);
        return str_strip(st, to_str(st, in), p[0], true, true);
}

static jv filter_default(struct rstate *st, const char *name, jv in, const struct args *a,
                         const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"default_value", "boolean"};
        bind(st, what, a, ps, 2, p);
        jv def = given(p[0]) ? p[0] : mkstr(st, "", 0);
        if (in.t == V_UNDEF || (given(p[1]) && truthy(p[1]) && !truthy(in)))
                return def;
        return in;
}

static jv filter_string(struct rstate *st, const char *name, jv in, const struct args *a,
                        const char *what) {
        jv p[6];
        bind(st, what, a, NULL, 0, p);
        struct jstr *s = to_str(st, in);
        if (name[1] == 'a' && !s->safe) {
                s = mkstr_raw(st, s->s, s->len);
                s->safe = true;
        }
        return (jv) {.t = V_STR, .s = s};
}

static jv filter_title(struct rstate *st, const char *name, jv in, const struct args *a,
                       const char *what) {
        jv p[6];
        (void) name;
        /* Jinja2's do_title: after each run of [-\\s({[<], first char upper, rest lower */
        bind(st, what, a, NULL, 0, p);
        struct jstr *s = str_case(st, to_str(st, in), 'l').s;
        struct sbuf sb = {};
        sb_put(st, &sb, "", 0);
        bool start = true;
        for (size_t i = 0; i < s->len;) {
                size_t nx = u8_next(s->s, s->len, i);
                uint32_t cp = u8_decode(s->s, s->len, i);
                bool sep = py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
                if (start && !sep) {
                        struct jstr *one = str_case(st, mkstr_raw(st, s->s + i, nx - i), 'u').s;
                        sb_put(st, &sb, one->s, one->len);
                } else
                        sb_put(st, &sb, s->s + i, nx - i);
                start = sep;
                i = nx;
        }
        return sb_value(st, &sb);
}

static jv filter_upper(struct rstate *st, const char *name, jv in, const struct args *a,
                       const char *what) {
        jv p[6];
        bind(st, what, a, NULL, 0, p);
        return str_case(st, to_str(st, in), name[0] == 'c' ? 'c' : name[0] == 't' ? 't' : name[0] == 'u' ? 'u' : 'l');
}

static jv filter_join(struct rstate *st, const char *name, jv in, const struct args *a,
                      const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"d", "attribute"};
        bind(st, what, a, ps, 2, p);
        struct jstr *sep = given(p[0]) ? to_str(st, p[0]) : mkstr_raw(st, "", 0);
        struct jlist *l = iter_list(st, in);
        struct sbuf sb = {};
        sb_put(st, &sb, "", 0);
        for (size_t i = 0; i < l->n; i++) {
                if (i)
                        sb_put(st, &sb, sep->s, sep->len);
                put_str(st, &sb, given(p[1]) ? attr_path(st, l->v[i], p[1]) : l->v[i]);
        }
        return sb_value(st, &sb);
}

static jv filter_items(struct rstate *st, const char *name, jv in, const struct args *a,
                       const char *what) {
        jv p[6];
        bind(st, what, a, NULL, 0, p);
        if (in.t == V_UNDEF) {
                jv r = mklist(st, V_LIST, 0);
                r.l->gen = true;
                return r;
        }
        if (in.t != V_DICT)
                fail(st, "items: can only get item pairs from a mapping, got %s", type_name(in));
        struct jmethod m = {.self = in, .name = "items"};
        struct args none = {};
        jv r = call_method(st, &m, &none);
        r.l->gen = true;
        return r;
}

static jv filter_replace(struct rstate *st, const char *name, jv in, const struct args *a,
                         const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"old", "new", "count"};
        bind(st, what, a, ps, 3, p);
        return str_replace(st, to_str(st, in), to_str(st, p[0]), to_str(st, p[1]),
                           given(p[2]) && p[2].t != V_NONE ? arg_int(st, what, p[2]) : -1);
}

static jv filter_list(struct rstate *st, const char *name, jv in, const struct args *a,
                      const char *what) {
        jv p[6];
        (void) name;
        bind(st, what, a, NULL, 0, p);
        struct jlist *l = iter_list(st, in);
        jv r = mklist(st, V_LIST, l->n);
        for (size_t i = 0; i < l->n; i++)
                list_push(st, r.l, l->v[i]);
        return r;
}

static jv filter_first(struct rstate *st, const char *name, jv in, const struct args *a,
                       const char *what) {
        jv p[6];
        bind(st, what, a, NULL, 0, p);
        struct jlist *l = iter_list(st, in);
        if (l->n == 0)
                return UNDEF;
        return name[0] == 'f' ? l->v[0] : l->v[l->n - 1];
}

static jv filter_dictsort(struct rstate *st, const char *name, jv in, const struct args *a,
                          const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"case_sensitive", "by", "reverse"};
        bind(st, what, a, ps, 3, p);
        if (in.t == V_UNDEF)
                fail_undefined(st, in);
        if (in.t != V_DICT)
                fail(st, "dictsort: expected a mapping, got %s", type_name(in));
        bool by_value = given(p[1]) && p[1].t == V_STR && streq(p[1].s->s, "value");
        if (given(p[1]) && !by_value && !(p[1].t == V_STR && streq(p[1].s->s, "key")))
                fail(st, "You can only sort by either \"key\" or \"value\"");
        size_t n = in.d->n;
        jv *keys = ralloc(st, (n + 1) * sizeof(jv)), *vals = ralloc(st, (n + 1) * sizeof(jv));
        for (size_t i = 0; i < n; i++) {
                jv t = mklist(st, V_TUPLE, 2);
                list_push(st, t.l, in.d->k[i]);
                list_push(st, t.l, in.d->v[i]);
                vals[i] = t;
                keys[i] = sort_key(st, by_value ? in.d->v[i] : in.d->k[i], given(p[0]) && truthy(p[0]));
        }
        sort_values(st, keys, vals, n, given(p[2]) && truthy(p[2]));
        jv r = mklist(st, V_LIST, n);
        for (size_t i = 0; i < n; i++)
                list_push(st, r.l, vals[i]);
        return r;
}

static jv filter_sort(struct rstate *st, const char *name, jv in, const struct args *a,
                      const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"reverse", "case_sensitive", "attribute"};
        bind(st, what, a, ps, 3, p);
        struct jlist *l = iter_list(st, in);
        size_t n = l->n;
        jv *keys = ralloc(st, (n + 1) * sizeof(jv)), *vals = ralloc(st, (n + 1) * sizeof(jv));
        for (size_t i = 0; i < n; i++) {
                vals[i] = l->v[i];
                keys[i] = sort_key(st, given(p[2]) ? attr_path(st, l->v[i], p[2]) : l->v[i], given(p[1]) && truthy(p[1]));
        }
        sort_values(st, keys, vals, n, given(p[0]) && truthy(p[0]));
        jv r = mklist(st, V_LIST, n);
        for (size_t i = 0; i < n; i++)
                list_push(st, r.l, vals[i]);
        return r;
}

static jv filter_selectattr(struct rstate *st, const char *name, jv in, const struct args *a,
                            const char *what) {
        (void) what;
        return select_common(st, in, a, true, name[0] == 's');
}

static jv filter_select(struct rstate *st, const char *name, jv in, const struct args *a,
                        const char *what) {
        (void) what;
        return select_common(st, in, a, false, name[0] == 's');
}

static jv filter_map(struct rstate *st, const char *name, jv in, const struct args *a,
                     const char *what) {
        jv p[6];
        struct jlist *l = truthy(in) ? iter_list(st, in) : mklist(st, V_LIST, 0).l;
        jv r = mklist(st, V_LIST, l->n);
        r.l->gen = true;
        if (a->n_pos == 0) {
                static const char *const ps[] = {"attribute", "default"};
                bind(st, what, a, ps, 2, p);
                if (!given(p[0]))
                        fail(st, "map: expected a filter name or attribute=");
                for (size_t i = 0; i < l->n; i++) {
                        jv v = attr_path(st, l->v[i], p[0]);
                        if (v.t == V_UNDEF && given(p[1]))
                                v = p[1];
                        list_push(st, r.l, v);
                }
                return r;
        }
        const char *fname = arg_str(st, what, a->pos[0])->s;
        struct args fa = {.pos = a->n_pos > 1 ? a->pos + 1 : NULL, .n_pos = a->n_pos - 1, .kw_names = a->kw_names, .kw = a->kw, .n_kw = a->n_kw};
        if (!in_names(KNOWN_FILTERS, fname))
                fail(st, "no filter named '%s'", fname);
        for (size_t i = 0; i < l->n; i++)
                list_push(st, r.l, apply_filter(st, fname, l->v[i], &fa));
        return r;
}

static jv filter_indent(struct rstate *st, const char *name, jv in, const struct args *a,
                        const char *what) {
        jv p[6];
        static const char *const ps[] = {"width", "first", "blank"};
        bind(st, what, a, ps, 3, p);
        struct jstr *ind;
        if (given(p[0]) && p[0].t == V_STR)
                ind = p[0].s;
        else {
                int64_t w = given(p[0]) ? arg_int(st, what, p[0]) : 4;
                struct sbuf sb = {};
                sb_put(st, &sb, "", 0);
                for (int64_t k = 0; k < w; k++) {
                        step(st, 1);
                        sb_put(st, &sb, " ", 1);
                }
                ind = mkstr_raw(st, sb.p, sb.len);
        }
        struct jstr *s = to_str(st, in);
        struct sbuf t = {};
        sb_put(st, &t, s->s, s->len);
        sb_put(st, &t, "\n", 1);
        struct jmethod m = {.self = sb_value(st, &t), .name = "splitlines"};
        struct args none = {};
        struct jlist *lines = call_method(st, &m, &none).l;
        bool blank = given(p[2]) && truthy(p[2]);
        struct sbuf o = {};
        sb_put(st, &o, "", 0);
        if (given(p[1]) && truthy(p[1]))
                sb_put(st, &o, ind->s, ind->len);
        for (size_t i = 0; i < lines->n; i++) {
                struct jstr *ln = lines->v[i].s;
                if (i > 0) {
                        sb_put(st, &o, "\n", 1);
                        if (blank || ln->len > 0)
                                sb_put(st, &o, ind->s, ind->len);
                }
                sb_put(st, &o, ln->s, ln->len);
        }
        return sb_value(st, &o);
}

static jv filter_int(struct rstate *st, const char *name, jv in, const struct args *a,
                     const char *what) {
        jv p[6];
        static const char *const ps[] = {"default", "base"};
        bind(st, what, a, ps, 2, p);
        bool is_int = name[0] == 'i';
        jv def = given(p[0]) ? p[0] : is_int ? mkint(0) : mkfloat(0.0);
        if (in.t == V_INT)
                return is_int ? in : mkfloat((double) in.i);
        if (in.t == V_BOOL)
                return is_int ? mkint(in.b) : mkfloat(in.b);
        if (in.t == V_FLOAT) {
                if (!is_int)
                        return in;
                if (isnan(in.f) || isinf(in.f) || fabs(in.f) >= 9.2e18)
                        return def;
                return mkint((int64_t) in.f);
        }
        if (in.t == V_STR) {
                struct jstr *s = str_strip(st, in.s, NONE, true, true).s;
                char *end;
                if (s->len == 0)
                        return def;
                errno = 0;
                if (is_int) {
                        long long v = strtoll(s->s, &end, 10);
                        if (*end == 0 && errno == 0)
                                return mkint(v);
                }
                double d = strtod(s->s, &end);
                if (*end != 0 || (s->s[0] != '-' && s->s[0] != '+' && s->s[0] != '.' && (s->s[0] < '0' || s->s[0] > '9') &&
                                  !(strcasecmp(s->s, "inf") == 0 || strcasecmp(s->s, "nan") == 0 || strcasecmp(s->s, "infinity") == 0)))
                        return def;
                if (!is_int)
                        return mkfloat(d);
                if (isnan(d) || isinf(d) || fabs(d) >= 9.2e18)
                        return def;
                return mkint((int64_t) d);
        }
        return def;
}

static jv filter_abs(struct rstate *st, const char *name, jv in, const struct args *a,
                     const char *what) {
        jv p[6];
        (void) name;
        bind(st, what, a, NULL, 0, p);
        if (!is_num(in))
                fail(st, "bad operand type for abs(): '%s'", type_name(in));
        if (in.t == V_FLOAT)
                return mkfloat(fabs(in.f));
        if (num_i(in) == INT64_MIN)
                fail_bigint(st);
        return mkint(num_i(in) < 0 ? -num_i(in) : num_i(in));
}

static jv filter_round(struct rstate *st, const char *name, jv in, const struct args *a,
                       const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"precision", "method"};
        bind(st, what, a, ps, 2, p);
        int64_t prec = given(p[0]) ? arg_int(st, what, p[0]) : 0;
        const char *method = given(p[1]) ? arg_str(st, what, p[1])->s : "common";
        if (!is_num(in))
                fail(st, "round: expected a number, got %s", type_name(in));
        double x = num_f(in), m = pow(10.0, (double) prec);
        if (streq(method, "common")) {
                /* Python's round(): ints stay ints, halves go to even */
                if (in.t != V_FLOAT && prec >= 0)
                        return mkint(num_i(in));
                return mkfloat(nearbyint(x * m) / m);
        }
        if (streq(method, "floor"))
                return mkfloat(floor(x * m) / m);
        if (streq(method, "ceil"))
                return mkfloat(ceil(x * m) / m);
        fail(st, "method must be common, ceil or floor");
}

static jv filter_reverse(struct rstate *st, const char *name, jv in, const struct args *a,
                         const char *what) {
        jv p[6];
        (void) name;
        bind(st, what, a, NULL, 0, p);
        if (in.t == V_STR)
                return do_slice(st, in, NONE, NONE, mkint(-1));
        struct jlist *l = iter_list(st, in);
        jv r = mklist(st, V_LIST, l->n);
        r.l->gen = true;
        for (size_t i = l->n; i > 0; i--)
                list_push(st, r.l, l->v[i - 1]);
        return r;
}

static jv filter_unique(struct rstate *st, const char *name, jv in, const struct args *a,
                        const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"case_sensitive", "attribute"};
        bind(st, what, a, ps, 2, p);
        struct jlist *l = iter_list(st, in);
        jv r = mklist(st, V_LIST, 0), seen = mklist(st, V_LIST, 0);
        r.l->gen = true;
        for (size_t i = 0; i < l->n; i++) {
                jv k = sort_key(st, given(p[1]) ? attr_path(st, l->v[i], p[1]) : l->v[i], given(p[0]) && truthy(p[0]));
                if (contains(st, seen, k))
                        continue;
                list_push(st, seen.l, k);
                list_push(st, r.l, l->v[i]);
        }
        return r;
}

static jv filter_min(struct rstate *st, const char *name, jv in, const struct args *a,
                     const char *what) {
        jv p[6];
        static const char *const ps[] = {"case_sensitive", "attribute"};
        bind(st, what, a, ps, 2, p);
        struct jlist *l = iter_list(st, in);
        if (l->n == 0)
                return UNDEF;
        size_t best = 0;
        jv bk = sort_key(st, given(p[1]) ? attr_path(st, l->v[0], p[1]) : l->v[0], given(p[0]) && truthy(p[0]));
        for (size_t i = 1; i < l->n; i++) {
                jv k = sort_key(st, given(p[1]) ? attr_path(st, l->v[i], p[1]) : l->v[i], given(p[0]) && truthy(p[0]));
                int c = jv_cmp(st, k, bk, "<");
                if (name[1] == 'i' ? c < 0 : c > 0) {
                        best = i;
                        bk = k;
                }
        }
        return l->v[best];
}

static jv filter_sum(struct rstate *st, const char *name, jv in, const struct args *a,
                     const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"attribute", "start"};
        bind(st, what, a, ps, 2, p);
        struct jlist *l = iter_list(st, in);
        jv acc = given(p[1]) ? p[1] : mkint(0);
        for (size_t i = 0; i < l->n; i++)
                acc = arith(st, '+', acc, given(p[0]) ? attr_path(st, l->v[i], p[0]) : l->v[i]);
        return acc;
}

static jv filter_center(struct rstate *st, const char *name, jv in, const struct args *a,
                        const char *what) {
        jv p[6];
        (void) name;
        static const char *const ps[] = {"width"};
        bind(st, what, a, ps, 1, p);
        struct jstr *s = to_str(st, in);
        int64_t w = given(p[0]) ? arg_int(st, what, p[0]) : 80, n = (int64_t) u8_count(s->s, s->len);
        if (w <= n)
                return mkstr(st, s->s, s->len);
        int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
        struct sbuf sb = {};
        for (int64_t k = 0; k < left; k++)
                sb_put(st, &sb, " ", 1);
        sb_put(st, &sb, s->s, s->len);
        for (int64_t k = 0; k < pad - left; k++)
                sb_put(st, &sb, " ", 1);
        step(st, (uint64_t) w);
        return sb_value(st, &sb);
}

static jv filter_wordcount(struct rstate *st, const char *name, jv in, const struct args *a,
                           const char *what) {
        jv p[6];
        (void) name;
        bind(st, what, a, NULL, 0, p);
        struct jstr *s = to_str(st, in);
        int64_t n = 0;
        bool in_word = false;
        for (size_t i = 0; i < s->len; i = u8_next(s->s, s->len, i)) {
                uint32_t c = u8_decode(s->s, s->len, i);
                bool w = cp_alpha(c) || (c >= '0' && c <= '9') || c == '_';
                if (w && !in_word)
                        n++;
                in_word = w;
        }
        return mkint(n);
}

static jv filter_attr(struct rstate *st, const char *name, jv in, const struct args *a,
                      const char *what) {
        jv p[6];
        static const char *const ps[] = {"name"};
        bind(st, what, a, ps, 1, p);
        return get_attr(st, in, arg_str(st, what, p[0])->s);
}

static const struct {
        const char *name;
        filter_fn fn;
} FILTERS[] = {
        { "tojson", filter_tojson },
        { "length", filter_length },
        { "count", filter_length },
        { "trim", filter_trim },
        { "default", filter_default },
        { "d", filter_default },
        { "string", filter_string },
        { "safe", filter_string },
        { "title", filter_title },
        { "upper", filter_upper },
        { "lower", filter_upper },
        { "capitalize", filter_upper },
        { "join", filter_join },
        { "items", filter_items },
        { "replace", filter_replace },
        { "list", filter_list },
        { "first", filter_first },
        { "last", filter_first },
        { "dictsort", filter_dictsort },
        { "sort", filter_sort },
        { "selectattr", filter_selectattr },
        { "rejectattr", filter_selectattr },
        { "select", filter_select },
        { "reject", filter_select },
        { "map", filter_map },
        { "indent", filter_indent },
        { "int", filter_int },
        { "float", filter_int },
        { "abs", filter_abs },
        { "round", filter_round },
        { "reverse", filter_reverse },
        { "unique", filter_unique },
        { "min", filter_min },
        { "max", filter_min },
        { "sum", filter_sum },
        { "center", filter_center },
        { "wordcount", filter_wordcount },
        { "attr", filter_attr },
};

static jv apply_filter(struct rstate *st, const char *name, jv in, const struct args *a) {
        char what[64];
        snprintf(what, sizeof(what), "filter '%s'", name);
        step(st, 1);
        for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
                if (streq(name, FILTERS[i].name))
                        return FILTERS[i].fn(st, name, in, a, what);
        if (in_names(KNOWN_FILTERS, name))
                fail(st, "unsupported filter '%s'", name);
        fail(st, "no filter named '%s'", name);
}

/* ---- tests ---- */

static const char *const KNOWN_TESTS[] = {
        "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter",
        "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping",
        "ne", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper", "==",
        "!=", ">", ">=", "<", "<=", NULL};

static bool apply_test(struct rstate *st, const char *name, jv v, const struct args *a) {
        jv p[1];
        char what[64];
        snprintf(what, sizeof(what), "test '%s'", name);
        step(st, 1);
        if (streq(name, "defined") || streq(name, "undefined")) {
                bind(st, what, a, NULL, 0, p);
                return (v.t == V_UNDEF) == (name[0] == 'u');
        }
        if (streq(name, "none"))
                return v.t == V_NONE;
        if (streq(name, "string"))
                return v.t == V_STR;
        if (streq(name, "mapping"))
                return v.t == V_DICT;
        if (streq(name, "iterable"))
                return v.t == V_STR || is_seq(v) || v.t == V_DICT || v.t == V_UNDEF;
        if (streq(name, "sequence"))
                return v.t == V_STR || is_seq(v) || v.t == V_DICT || v.t == V_UNDEF;
        if (streq(name, "number"))
                return is_num(v);
        if (streq(name, "integer"))
                return v.t == V_INT;
        if (streq(name, "float"))
                return v.t == V_FLOAT;
        if (streq(name, "boolean"))
                return v.t == V_BOOL;
        if (streq(name, "true"))
                return v.t == V_BOOL && v.b;
        if (streq(name, "false"))
                return v.t == V_BOOL && !v.b;
        if (streq(name, "callable"))
                return v.t == V_MACRO || v.t == V_BUILTIN || v.t == V_METHOD;
        if (streq(name, "escaped"))
                return false;
        if (streq(name, "lower") || streq(name, "upper")) {
                if (v.t != V_STR)
                        fail(st, "test '%s': expected a string, got %s", name, type_name(v));
                jv x = str_case(st, v.s, name[0]);
                return jv_eq(st, x, v);
        }
        if (streq(name, "odd") || streq(name, "even") || streq(name, "divisibleby")) {
                if (v.t != V_INT && v.t != V_BOOL)
                        fail(st, "test '%s': expected an integer, got %s", name, type_name(v));
                int64_t x = num_i(v);
                if (name[0] == 'o')
                        return x % 2 != 0;
                if (name[0] == 'e')
                        return x % 2 == 0;
                static const char *const ps[] = {"num"};
                bind(st, what, a, ps, 1, p);
                int64_t d = arg_int(st, what, p[0]);
                if (d == 0)
                        fail(st, "integer division or modulo by zero");
                return d == -1 || x % d == 0;
        }
        static const char *const ps[] = {"other"};
        if (streq(name, "eq") || streq(name, "equalto") || streq(name, "==") || streq(name, "ne") || streq(name, "!=")) {
                bind(st, what, a, ps, 1, p);
                bool eq = jv_eq(st, v, p[0]);
                return name[0] == 'n' || name[0] == '!' ? !eq : eq;
        }
        if (streq(name, "sameas")) {
                bind(st, what, a, ps, 1, p);
                jv o = p[0];
                if (v.t != o.t)
                        return false;
                switch (v.t) {
                case V_NONE:
                case V_UNDEF:
                        return true;
                case V_BOOL:
                        return v.b == o.b;
                case V_INT:
                        return v.i == o.i && v.i >= -5 && v.i <= 256;
                case V_STR:
                        return v.s == o.s;
                case V_LIST:
                case V_TUPLE:
                        return v.l == o.l;
                case V_DICT:
                case V_NS:
                        return v.d == o.d;
                default:
                        return jv_eq(st, v, o);
                }
        }
        if (streq(name, "lt") || streq(name, "lessthan") || streq(name, "<") || streq(name, "le") || streq(name, "<=") ||
            streq(name, "gt") || streq(name, "greaterthan") || streq(name, ">") || streq(name, "ge") || streq(name, ">=")) {
                bind(st, what, a, ps, 1, p);
                int c = jv_cmp(st, v, p[0], name);
                if (streq(name, "lt") || streq(name, "lessthan") || streq(name, "<"))
                        return c < 0;
                if (streq(name, "le") || streq(name, "<="))
                        return c <= 0;
                if (streq(name, "gt") || streq(name, "greaterthan") || streq(name, ">"))
                        return c > 0;
                return c >= 0;
        }
        if (streq(name, "in")) {
                static const char *const pin[] = {"seq"};
                bind(st, what, a, pin, 1, p);
                return contains(st, p[0], v);
        }
        if (streq(name, "filter") || streq(name, "test")) {
                if (v.t != V_STR)
                        return false;
                return in_names(name[0] == 'f' ? KNOWN_FILTERS : KNOWN_TESTS, v.s->s);
        }
        fail(st, "no test named '%s'", name);
}

/* ---- entry ---- */

int jinja_render(const struct jinja_template *t, const struct json_value *ctx, const struct jinja_limits *limits,
                 char **ret, size_t *ret_len, char *err, size_t err_size) {
        struct rstate *st = calloc(1, sizeof(*st));
        if (!st)
                return error_set(err, err_size, ENOMEM, "template render: out of memory");
        st->lim = limits;
        st->msg = err;
        st->msg_size = err_size;
        st->arena = arena_new(limits->max_memory);
        if (!st->arena) {
                free(st);
                return error_set(err, err_size, ENOMEM, "template render: out of memory");
        }
        if (setjmp(st->fail)) {
                int r = -(st->err ? st->err : EINVAL);
                arena_free(st->arena);
                free(st);
                return r;
        }
        if (ctx) {
                if (json_type(ctx) != JSON_OBJECT)
                        fail(st, "context must be a JSON object");
                for (size_t i = 0; i < json_count(ctx); i++)
                        dict_set(st, &st->globals, mkcstr(st, json_object_key_at(ctx, i)),
                                 from_json(st, json_object_value_at(ctx, i)));
        }
        st->steps = 0;
        struct sbuf out = {};
        sb_put(st, &out, "", 0);
        st->out = &out;
        st->root = push_frame(st, NULL);
        exec_body(st, st->root, t->body, t->n_body);
        char *s = malloc(out.len + 1);
        if (!s) {
                st->err = ENOMEM;
                st->at = NULL;
                fail(st, "out of memory copying the output");
        }
        memcpy(s, out.p, out.len + 1);
        if (ret_len)
                *ret_len = out.len;
        *ret = s;
        arena_free(st->arena);
        free(st);
        return 0;
}

