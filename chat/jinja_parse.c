/* SPDX-License-Identifier: MIT */
/* Jinja subset: arena, lexer (with HF transformers' whitespace setup) and parser. See jinja.h.
 * Precedence follows Jinja2's grammar: condexpr < or < and < not < compare < +,- < ~ < *,/,//,%
 * < ** < unary -,+ < postfix (.a [i] (args)) and filters/tests (|f, is t). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja.h"
#include "common/log.h"

/* ---- arena ---- */

struct arena_chunk {
        struct arena_chunk *next;
        size_t used, size;
        _Alignas(16) unsigned char data[];
};

struct arena {
        struct arena_chunk *head;
        size_t total, limit;
};

struct arena *arena_new(size_t limit) {
        struct arena *a = calloc(1, sizeof(*a));
        if (a)
                a->limit = limit;
        return a;
}

void arena_free(struct arena *a) {
        if (!a)
                return;
        while (a->head) {
                struct arena_chunk *c = a->head;
                a->head = c->next;
                free(c);
        }
        free(a);
}

void *arena_alloc(struct arena *a, size_t n) {
        n = (n + 15) & ~(size_t) 15;
        if (n == 0)
                n = 16;
        struct arena_chunk *c = a->head;
        if (!c || c->size - c->used < n) {
                size_t size = MAX(n, (size_t) 64 * 1024);
                if (a->total + size > a->limit || size < n)
                        return NULL;
                c = malloc(sizeof(*c) + size);
                if (!c)
                        return NULL;
                c->size = size;
                c->used = 0;
                c->next = a->head;
                a->head = c;
                a->total += size;
        }
        void *p = c->data + c->used;
        c->used += n;
        memset(p, 0, n);
        return p;
}

/* ---- lexer ---- */

enum tok_type {
        T_EOF,
        T_TEXT,
        T_VAR_BEGIN,
        T_VAR_END,
        T_BLOCK_BEGIN,
        T_BLOCK_END,
        T_NAME,
        T_INT,
        T_FLOAT,
        T_STRING,
        T_OP,
};

struct token {
        enum tok_type type;
        int line, col;
        const char *s; /* text, name, op, decoded string (arena) */
        size_t len;
        int64_t i;
        double f;
};

struct parser {
        struct arena *arena;
        const char *src;
        size_t n;
        /* line tracking for the lexer */
        size_t line_off, line_start;
        int line;
        struct token *toks;
        size_t n_toks, cap_toks;
        size_t pos;
        unsigned depth;
        char *err; /* the caller's message buffer (error_set, common/log.h) */
        size_t err_size;
        jmp_buf fail;
};

#define PARSE_MAX_DEPTH 200u

_printf_(4, 5) static _Noreturn void parse_fail(struct parser *p, int line, int col, const char *fmt, ...) {
        char buf[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        error_set(p->err, p->err_size, EINVAL, "template:%d:%d: %s", line, col, buf);
        longjmp(p->fail, 1);
}

static void *palloc(struct parser *p, size_t n) {
        void *r = arena_alloc(p->arena, n);
        if (!r) {
                error_set(p->err, p->err_size, ENOMEM, "template: out of memory while parsing");
                longjmp(p->fail, 2);
        }
        return r;
}

static void linecol(struct parser *p, size_t off, int *line, int *col) {
        /* offsets only move forward during lexing */
        for (; p->line_off < off && p->line_off < p->n; p->line_off++)
                if (p->src[p->line_off] == '\n') {
                        p->line++;
                        p->line_start = p->line_off + 1;
                }
        *line = p->line;
        *col = (int) (off - p->line_start) + 1;
}

static struct token *push_tok(struct parser *p, enum tok_type type, size_t off) {
        if (p->n_toks == p->cap_toks) {
                size_t cap = MAX(p->cap_toks * 2, (size_t) 256);
                struct token *t = palloc(p, cap * sizeof(*t));
                if (p->n_toks)
                        memcpy(t, p->toks, p->n_toks * sizeof(*t));
                p->toks = t;
                p->cap_toks = cap;
        }
        struct token *t = &p->toks[p->n_toks++];
        *t = (struct token) {.type = type};
        linecol(p, off, &t->line, &t->col);
        return t;
}

static bool is_space(char c) {
        return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
static bool is_ident_start(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(char c) {
        return c >= '0' && c <= '9';
}
static bool is_ident(char c) {
        return is_ident_start(c) || is_digit(c);
}

static void put_utf8(char *out, size_t *o, uint32_t cp) {
        if (cp < 0x80)
                out[(*o)++] = (char) cp;
        else if (cp < 0x800) {
                out[(*o)++] = (char) (0xC0 | (cp >> 6));
                out[(*o)++] = (char) (0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
                out[(*o)++] = (char) (0xE0 | (cp >> 12));
                out[(*o)++] = (char) (0x80 | ((cp >> 6) & 0x3F));
                out[(*o)++] = (char) (0x80 | (cp & 0x3F));
        } else {
                out[(*o)++] = (char) (0xF0 | (cp >> 18));
                out[(*o)++] = (char) (0x80 | ((cp >> 12) & 0x3F));
                out[(*o)++] = (char) (0x80 | ((cp >> 6) & 0x3F));
                out[(*o)++] = (char) (0x80 | (cp & 0x3F));
        }
}

static int hexval(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

/* A string literal starting at src[i] (the quote). Python unicode-escape semantics, which is
 * what Jinja2 applies to literals: unknown escapes keep their backslash. Returns the end. */
static size_t lex_string(struct parser *p, size_t i, struct token *t) {
        char q = p->src[i];
        size_t j = i + 1;
        while (j < p->n && p->src[j] != q) {
                if (p->src[j] == '\\' && j + 1 < p->n)
                        j++;
                j++;
        }
        if (j >= p->n)
                parse_fail(p, t->line, t->col, "unterminated string literal");
        char *out = palloc(p, (j - i) * 2 + 1);
        size_t o = 0;
        for (size_t k = i + 1; k < j; k++) {
                char c = p->src[k];
                if (c != '\\') {
                        out[o++] = c;
                        continue;
                }
                char e = p->src[++k];
                int nd = 0;
                switch (e) {
                case '\n':
                        break;
                case '\\':
                case '\'':
                case '"':
                        out[o++] = e;
                        break;
                case 'n':
                        out[o++] = '\n';
                        break;
                case 't':
                        out[o++] = '\t';
                        break;
                case 'r':
                        out[o++] = '\r';
                        break;
                case 'a':
                        out[o++] = '\a';
                        break;
                case 'b':
                        out[o++] = '\b';
                        break;
                case 'f':
                        out[o++] = '\f';
                        break;
                case 'v':
                        out[o++] = '\v';
                        break;
                case 'x':
                        nd = 2;
                        break;
                case 'u':
                        nd = 4;
                        break;
                case 'U':
                        nd = 8;
                        break;
                default:
                        if (e >= '0' && e <= '7') {
                                uint32_t v = 0;
                                int m = 0;
                                while (m < 3 && k < j && p->src[k] >= '0' && p->src[k] <= '7') {
                                        v = v * 8 + (uint32_t) (p->src[k] - '0');
                                        k++;
                                        m++;
                                }
                                k--;
                                put_utf8(out, &o, v);
                        } else {
                                out[o++] = '\\';
                                out[o++] = e;
                        }
                }
                if (nd) {
                        uint32_t v = 0;
                        for (int m = 0; m < nd; m++) {
                                int h = k + 1 + (size_t) m < j ? hexval(p->src[k + 1 + m]) : -1;
                                if (h < 0)
                                        parse_fail(p, t->line, t->col, "truncated \\%c escape in string literal", e);
                                v = v * 16 + (uint32_t) h;
                        }
                        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                                parse_fail(p, t->line, t->col, "invalid code point escape in string literal");
                        put_utf8(out, &o, v);
                        k += (size_t) nd;
                }
        }
        out[o] = 0;
        t->s = out;
        t->len = o;
        return j + 1;
}

static const char *const ops2[] = {"**", "//", "==", "!=", "<=", ">="};
static const char ops1[] = "+-*/%~<>=()[]{},.:|;";

/* Tokenizes the inside of a {{ }} or {% %} starting at i; returns the offset after the end marker
 * and sets *strip_after when it was "-}}"/"-%}". */
static size_t lex_tag(struct parser *p, size_t i, bool block, int tline, int tcol, bool *strip_after) {
        unsigned balance = 0;
        for (;;) {
                while (i < p->n && is_space(p->src[i]))
                        i++;
                if (i >= p->n)
                        parse_fail(p, tline, tcol, "unterminated %s", block ? "block tag '{%'" : "expression '{{'");
                const char *s = p->src + i;
                size_t rest = p->n - i;
                if (balance == 0) {
                        const char *end = block ? "%}" : "}}";
                        if (rest >= 3 && (s[0] == '-' || (block && s[0] == '+')) && memcmp(s + 1, end, 2) == 0) {
                                *strip_after = s[0] == '-';
                                push_tok(p, block ? T_BLOCK_END : T_VAR_END, i);
                                return i + 3;
                        }
                        if (rest >= 2 && memcmp(s, end, 2) == 0) {
                                *strip_after = false;
                                push_tok(p, block ? T_BLOCK_END : T_VAR_END, i);
                                return i + 2;
                        }
                }
                char c = s[0];
                if (is_ident_start(c)) {
                        size_t j = i;
                        while (j < p->n && is_ident(p->src[j]))
                                j++;
                        struct token *t = push_tok(p, T_NAME, i);
                        t->s = s;
                        t->len = j - i;
                        i = j;
                } else if (is_digit(c)) {
                        size_t j = i;
                        bool fl = false;
                        while (j < p->n && (is_digit(p->src[j]) || p->src[j] == '_'))
                                j++;
                        if (j + 1 < p->n && p->src[j] == '.' && is_digit(p->src[j + 1])) {
                                fl = true;
                                j++;
                                while (j < p->n && (is_digit(p->src[j]) || p->src[j] == '_'))
                                        j++;
                        }
                        if (j < p->n && (p->src[j] == 'e' || p->src[j] == 'E')) {
                                size_t k = j + 1;
                                if (k < p->n && (p->src[k] == '+' || p->src[k] == '-'))
                                        k++;
                                if (k < p->n && is_digit(p->src[k])) {
                                        fl = true;
                                        j = k;
                                        while (j < p->n && is_digit(p->src[j]))
                                                j++;
                                }
                        }
                        char buf[128];
                        size_t m = 0;
                        for (size_t k = i; k < j && m < sizeof(buf) - 1; k++)
                                if (p->src[k] != '_')
                                        buf[m++] = p->src[k];
                        buf[m] = 0;
                        struct token *t = push_tok(p, fl ? T_FLOAT : T_INT, i);
                        if (fl)
                                t->f = strtod(buf, NULL);
                        else {
                                errno = 0;
                                t->i = strtoll(buf, NULL, 10);
                                if (errno == ERANGE)
                                        parse_fail(p, t->line, t->col, "integer literal %s too large", buf);
                        }
                        i = j;
                } else if (c == '\'' || c == '"') {
                        struct token *t = push_tok(p, T_STRING, i);
                        i = lex_string(p, i, t);
                } else {
                        size_t len = 0;
                        for (size_t k = 0; k < ELEMENTSOF(ops2); k++)
                                if (rest >= 2 && memcmp(s, ops2[k], 2) == 0)
                                        len = 2;
                        if (!len && c && strchr(ops1, c))
                                len = 1;
                        struct token *t = push_tok(p, T_OP, i);
                        if (!len)
                                parse_fail(p, t->line, t->col, "unexpected character '%c'", c);
                        t->s = s;
                        t->len = len;
                        if (len == 1 && (c == '(' || c == '[' || c == '{'))
                                balance++;
                        else if (len == 1 && (c == ')' || c == ']' || c == '}')) {
                                if (balance == 0)
                                        parse_fail(p, t->line, t->col, "unexpected '%c'", c);
                                balance--;
                        }
                        i += len;
                }
        }
}

static void lex(struct parser *p) {
        size_t pos = 0;
        bool strip_next = false, trim_next = false;
        while (pos <= p->n) {
                /* next tag start */
                size_t tag = pos;
                while (tag + 1 < p->n &&
                       !(p->src[tag] == '{' && (p->src[tag + 1] == '{' || p->src[tag + 1] == '%' || p->src[tag + 1] == '#')))
                        tag++;
                if (tag + 1 >= p->n)
                        tag = p->n;
                size_t ts = pos, te = tag;
                if (strip_next)
                        while (ts < te && is_space(p->src[ts]))
                                ts++;
                else if (trim_next && ts < te && p->src[ts] == '\n')
                        ts++;
                if (tag < p->n) {
                        char kind = p->src[tag + 1];
                        char mod = tag + 2 < p->n ? p->src[tag + 2] : 0;
                        if (mod == '-')
                                while (te > ts && is_space(p->src[te - 1]))
                                        te--;
                        else if (mod != '+' && (kind == '%' || kind == '#')) {
                                /* lstrip_blocks: drop spaces/tabs between a line start and the tag */
                                size_t k = te;
                                while (k > ts && (p->src[k - 1] == ' ' || p->src[k - 1] == '\t'))
                                        k--;
                                if (k == 0 || p->src[k - 1] == '\n')
                                        te = k;
                        }
                }
                if (te > ts) {
                        struct token *t = push_tok(p, T_TEXT, ts);
                        t->s = p->src + ts;
                        t->len = te - ts;
                }
                if (tag >= p->n)
                        break;
                char kind = p->src[tag + 1];
                char mod = tag + 2 < p->n ? p->src[tag + 2] : 0;
                int line, col;
                linecol(p, tag, &line, &col);
                size_t inner = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
                if (kind == '#') {
                        const char *e = NULL;
                        for (size_t k = inner; k + 1 < p->n; k++)
                                if (p->src[k] == '#' && p->src[k + 1] == '}') {
                                        e = p->src + k;
                                        break;
                                }
                        if (!e)
                                parse_fail(p, line, col, "unterminated comment '{#'");
                        size_t end = (size_t) (e - p->src);
                        strip_next = end > inner && p->src[end - 1] == '-';
                        trim_next = true;
                        pos = end + 2;
                        continue;
                }
                push_tok(p, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, tag);
                bool strip = false;
                pos = lex_tag(p, inner, kind == '%', line, col, &strip);
                strip_next = strip;
                trim_next = kind == '%';
        }
        push_tok(p, T_EOF, p->n);
}

/* ---- parser ---- */

static struct token *cur(struct parser *p) {
        return &p->toks[p->pos];
}
static struct token *peek(struct parser *p, size_t k) {
        size_t i = MIN(p->pos + k, p->n_toks - 1);
        return &p->toks[i];
}

static bool tok_is_op(const struct token *t, const char *op) {
        return t->type == T_OP && t->len == strlen(op) && memcmp(t->s, op, t->len) == 0;
}
static bool tok_is_name(const struct token *t, const char *name) {
        return t->type == T_NAME && t->len == strlen(name) && memcmp(t->s, name, t->len) == 0;
}

static const char *tok_desc(struct parser *p, const struct token *t) {
        switch (t->type) {
        case T_EOF:
                return "end of template";
        case T_TEXT:
                return "template text";
        case T_VAR_BEGIN:
                return "'{{'";
        case T_VAR_END:
                return "'}}'";
        case T_BLOCK_BEGIN:
                return "'{%'";
        case T_BLOCK_END:
                return "'%}'";
        case T_INT:
        case T_FLOAT:
                return "number";
        case T_STRING:
                return "string";
        default: {
                char *s = palloc(p, t->len + 3);
                snprintf(s, t->len + 3, "'%.*s'", (int) t->len, t->s);
                return s;
        }
        }
}

static bool skip_op(struct parser *p, const char *op) {
        if (tok_is_op(cur(p), op)) {
                p->pos++;
                return true;
        }
        return false;
}
static bool skip_name(struct parser *p, const char *name) {
        if (tok_is_name(cur(p), name)) {
                p->pos++;
                return true;
        }
        return false;
}

static void expect_op(struct parser *p, const char *op) {
        struct token *t = cur(p);
        if (!skip_op(p, op))
                parse_fail(p, t->line, t->col, "expected '%s', got %s", op, tok_desc(p, t));
}

static void expect_type(struct parser *p, enum tok_type type, const char *what) {
        struct token *t = cur(p);
        if (t->type != type)
                parse_fail(p, t->line, t->col, "expected %s, got %s", what, tok_desc(p, t));
        p->pos++;
}

static const char *tok_str(struct parser *p, const struct token *t) {
        char *s = palloc(p, t->len + 1);
        memcpy(s, t->s, t->len);
        s[t->len] = 0;
        return s;
}

static const char *expect_name(struct parser *p) {
        struct token *t = cur(p);
        if (t->type != T_NAME)
                parse_fail(p, t->line, t->col, "expected a name, got %s", tok_desc(p, t));
        p->pos++;
        return tok_str(p, t);
}

static struct jnode *mknode(struct parser *p, enum jnode_kind kind, const struct token *at) {
        struct jnode *n = palloc(p, sizeof(*n));
        n->kind = kind;
        n->line = at->line;
        n->col = at->col;
        return n;
}

/* Room for one more of n elements of elem bytes at v (cap of them): v itself, or a copy twice as
 * large (at least 8) in the arena. */
static void *vec_room(struct parser *p, void *v, size_t n, size_t *cap, size_t elem) {
        if (n < *cap)
                return v;
        size_t c = MAX(*cap * 2, (size_t) 8);
        void *nv = palloc(p, c * elem);
        if (n)
                memcpy(nv, v, n * elem);
        *cap = c;
        return nv;
}

/* Growable lists of node pointers and of names, in the arena. */
struct nvec {
        struct jnode **v;
        size_t n, cap;
};
static void nvec_push(struct parser *p, struct nvec *v, struct jnode *x) {
        v->v = vec_room(p, v->v, v->n, &v->cap, sizeof *v->v);
        v->v[v->n++] = x;
}
struct svec {
        const char **v;
        size_t n, cap;
};
static void svec_push(struct parser *p, struct svec *v, const char *x) {
        v->v = vec_room(p, v->v, v->n, &v->cap, sizeof *v->v);
        v->v[v->n++] = x;
}

static void enter(struct parser *p) {
        if (++p->depth > PARSE_MAX_DEPTH) {
                struct token *t = cur(p);
                parse_fail(p, t->line, t->col, "expression nested deeper than %u levels", PARSE_MAX_DEPTH);
        }
}

static struct jnode *parse_expr(struct parser *p, bool with_condexpr);
static struct jnode *parse_unary(struct parser *p, bool with_filter);
static struct jnode *parse_primary(struct parser *p);

/* A tuple or a single expression (Jinja's parse_tuple). */
static struct jnode *parse_tuple(struct parser *p, bool with_condexpr, bool explicit_parens) {
        struct token *at = cur(p);
        struct nvec items = {};
        bool is_tuple = false;
        for (;;) {
                if (items.n > 0) {
                        if (!skip_op(p, ","))
                                break;
                        is_tuple = true;
                }
                struct token *t = cur(p);
                if (t->type == T_VAR_END || t->type == T_BLOCK_END || tok_is_op(t, ")") ||
                    (items.n > 0 && tok_is_name(t, "in")) || (items.n == 0 && explicit_parens && tok_is_op(t, ")")))
                        break;
                nvec_push(p, &items, parse_expr(p, with_condexpr));
        }
        if (!is_tuple && items.n == 1)
                return items.v[0];
        if (items.n == 0 && !explicit_parens)
                parse_fail(p, at->line, at->col, "expected an expression, got %s", tok_desc(p, at));
        struct jnode *n = mknode(p, JN_TUPLE, at);
        n->kids = items.v;
        n->n_kids = items.n;
        return n;
}

static void parse_call_args(struct parser *p, struct jnode *n) {
        struct nvec args = {}, kwv = {};
        struct svec kwn = {};
        expect_op(p, "(");
        while (!tok_is_op(cur(p), ")")) {
                if (args.n + kwn.n > 0)
                        expect_op(p, ",");
                if (tok_is_op(cur(p), ")"))
                        break;
                struct token *t = cur(p);
                if (tok_is_op(t, "*") || tok_is_op(t, "**"))
                        parse_fail(p, t->line, t->col, "unsupported construct '*args'/'**kwargs' in a call");
                if (t->type == T_NAME && tok_is_op(peek(p, 1), "=")) {
                        svec_push(p, &kwn, tok_str(p, t));
                        p->pos += 2;
                        nvec_push(p, &kwv, parse_expr(p, true));
                } else {
                        if (kwn.n > 0)
                                parse_fail(p, t->line, t->col, "positional argument after keyword argument");
                        nvec_push(p, &args, parse_expr(p, true));
                }
        }
        expect_op(p, ")");
        n->kids = args.v;
        n->n_kids = args.n;
        n->kw_names = kwn.v;
        n->kw_vals = kwv.v;
        n->n_kw = kwn.n;
}

static struct jnode *parse_subscript(struct parser *p, struct jnode *node) {
        struct token *t = cur(p);
        if (skip_op(p, ".")) {
                struct token *a = cur(p);
                if (a->type == T_NAME) {
                        p->pos++;
                        struct jnode *n = mknode(p, JN_GETATTR, t);
                        n->a = node;
                        n->str = tok_str(p, a);
                        return n;
                }
                if (a->type == T_INT) {
                        p->pos++;
                        struct jnode *n = mknode(p, JN_GETITEM, t);
                        n->a = node;
                        n->b = mknode(p, JN_CONST_INT, a);
                        n->b->i = a->i;
                        return n;
                }
                parse_fail(p, a->line, a->col, "expected an attribute name after '.', got %s", tok_desc(p, a));
        }
        expect_op(p, "[");
        struct jnode *parts[3] = {};
        bool slice = false;
        for (int k = 0; k < 3; k++) {
                if (!tok_is_op(cur(p), ":") && !tok_is_op(cur(p), "]"))
                        parts[k] = parse_expr(p, true);
                if (k < 2 && skip_op(p, ":"))
                        slice = true;
                else
                        break;
        }
        if (tok_is_op(cur(p), ","))
                parse_fail(p, cur(p)->line, cur(p)->col, "unsupported construct: tuple subscript");
        expect_op(p, "]");
        if (!slice) {
                if (!parts[0])
                        parse_fail(p, t->line, t->col, "expected an expression inside '[]'");
                struct jnode *n = mknode(p, JN_GETITEM, t);
                n->a = node;
                n->b = parts[0];
                return n;
        }
        struct jnode *n = mknode(p, JN_SLICE, t);
        n->a = node;
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
        return n;
}

static struct jnode *parse_postfix(struct parser *p, struct jnode *node) {
        for (;;) {
                struct token *t = cur(p);
                if (tok_is_op(t, ".") || tok_is_op(t, "["))
                        node = parse_subscript(p, node);
                else if (tok_is_op(t, "(")) {
                        struct jnode *n = mknode(p, JN_CALL, t);
                        n->a = node;
                        parse_call_args(p, n);
                        node = n;
                } else
                        return node;
        }
}

static struct jnode *parse_filter(struct parser *p, struct jnode *input) {
        struct token *t = cur(p);
        struct jnode *n = mknode(p, JN_FILTER, t);
        n->a = input;
        n->str = expect_name(p);
        if (tok_is_op(cur(p), "."))
                parse_fail(p, t->line, t->col, "unsupported construct: dotted filter name");
        /* Unknown filter names fail when reached, not here: Jinja2 3.x compiles filters inside
         * conditionals lazily, and real templates carry ones their engine never reaches. */
        if (tok_is_op(cur(p), "("))
                parse_call_args(p, n);
        return n;
}

static struct jnode *parse_test(struct parser *p, struct jnode *input) {
        struct token *t = cur(p);
        struct jnode *n = mknode(p, JN_TEST, t);
        n->a = input;
        n->op = skip_name(p, "not");
        n->str = expect_name(p);

        struct token *a = cur(p);
        if (tok_is_op(a, "("))
                parse_call_args(p, n);
        else if ((a->type == T_NAME || a->type == T_STRING || a->type == T_INT || a->type == T_FLOAT ||
                  tok_is_op(a, "[") || tok_is_op(a, "{")) &&
                 !tok_is_name(a, "else") && !tok_is_name(a, "or") && !tok_is_name(a, "and")) {
                if (tok_is_name(a, "is"))
                        parse_fail(p, a->line, a->col, "chained 'is' tests are not supported");
                struct jnode **arg = palloc(p, sizeof(*arg));
                arg[0] = parse_postfix(p, parse_primary(p));
                n->kids = arg;
                n->n_kids = 1;
        }
        return n;
}

static struct jnode *parse_filter_expr(struct parser *p, struct jnode *node) {
        for (;;) {
                struct token *t = cur(p);
                if (skip_op(p, "|"))
                        node = parse_filter(p, node);
                else if (skip_name(p, "is"))
                        node = parse_test(p, node);
                else if (tok_is_op(t, "(")) {
                        struct jnode *n = mknode(p, JN_CALL, t);
                        n->a = node;
                        parse_call_args(p, n);
                        node = n;
                } else
                        return node;
        }
}

static struct jnode *parse_primary(struct parser *p) {
        struct token *t = cur(p);
        enter(p);
        struct jnode *n = NULL;
        switch (t->type) {
        case T_NAME:
                p->pos++;
                if (tok_is_name(t, "true") || tok_is_name(t, "True") || tok_is_name(t, "false") ||
                    tok_is_name(t, "False")) {
                        n = mknode(p, JN_CONST_BOOL, t);
                        n->i = t->s[0] == 't' || t->s[0] == 'T';
                } else if (tok_is_name(t, "none") || tok_is_name(t, "None"))
                        n = mknode(p, JN_CONST_NONE, t);
                else {
                        n = mknode(p, JN_NAME, t);
                        n->str = tok_str(p, t);
                }
                break;
        case T_STRING: {
                /* adjacent literals concatenate */
                size_t total = 0, k = p->pos;
                while (p->toks[k].type == T_STRING)
                        total += p->toks[k++].len;
                char *s = palloc(p, total + 1);
                size_t o = 0;
                while (cur(p)->type == T_STRING) {
                        memcpy(s + o, cur(p)->s, cur(p)->len);
                        o += cur(p)->len;
                        p->pos++;
                }
                n = mknode(p, JN_CONST_STR, t);
                n->str = s;
                n->len = o;
                break;
        }
        case T_INT:
                p->pos++;
                n = mknode(p, JN_CONST_INT, t);
                n->i = t->i;
                break;
        case T_FLOAT:
                p->pos++;
                n = mknode(p, JN_CONST_FLOAT, t);
                n->f = t->f;
                break;
        case T_OP:
                if (skip_op(p, "(")) {
                        n = parse_tuple(p, true, true);
                        expect_op(p, ")");
                } else if (skip_op(p, "[")) {
                        struct nvec items = {};
                        while (!tok_is_op(cur(p), "]")) {
                                if (items.n)
                                        expect_op(p, ",");
                                if (tok_is_op(cur(p), "]"))
                                        break;
                                nvec_push(p, &items, parse_expr(p, true));
                        }
                        expect_op(p, "]");
                        n = mknode(p, JN_LIST, t);
                        n->kids = items.v;
                        n->n_kids = items.n;
                } else if (skip_op(p, "{")) {
                        struct nvec items = {};
                        while (!tok_is_op(cur(p), "}")) {
                                if (items.n)
                                        expect_op(p, ",");
                                if (tok_is_op(cur(p), "}"))
                                        break;
                                nvec_push(p, &items, parse_expr(p, true));
                                expect_op(p, ":");
                                nvec_push(p, &items, parse_expr(p, true));
                        }
                        expect_op(p, "}");
                        n = mknode(p, JN_DICT, t);
                        n->kids = items.v;
                        n->n_kids = items.n;
                }
                break;
        default:
                break;
        }
        if (!n)
                parse_fail(p, t->line, t->col, "unexpected %s in expression", tok_desc(p, t));
        p->depth--;
        return n;
}

static struct jnode *parse_unary(struct parser *p, bool with_filter) {
        struct token *t = cur(p);
        struct jnode *n;
        enter(p);
        if (skip_op(p, "-")) {
                n = mknode(p, JN_NEG, t);
                n->a = parse_unary(p, false);
        } else if (skip_op(p, "+")) {
                n = mknode(p, JN_POS, t);
                n->a = parse_unary(p, false);
        } else
                n = parse_postfix(p, parse_primary(p));
        if (with_filter)
                n = parse_filter_expr(p, n);
        p->depth--;
        return n;
}

static struct jnode *binop(struct parser *p, const struct token *t, int op, struct jnode *l, struct jnode *r) {
        struct jnode *n = mknode(p, JN_BINOP, t);
        n->op = op;
        n->a = l;
        n->b = r;
        return n;
}

static struct jnode *parse_pow(struct parser *p) {
        struct jnode *l = parse_unary(p, true);
        for (struct token *t; (t = cur(p)), skip_op(p, "**");)
                l = binop(p, t, 'P', l, parse_unary(p, true));
        return l;
}

static struct jnode *parse_math2(struct parser *p) {
        struct jnode *l = parse_pow(p);
        for (;;) {
                struct token *t = cur(p);
                int op = tok_is_op(t, "*") ? '*' : tok_is_op(t, "/") ? '/' : tok_is_op(t, "//") ? 'F' : tok_is_op(t, "%") ? '%' : 0;
                if (!op)
                        return l;
                p->pos++;
                l = binop(p, t, op, l, parse_pow(p));
        }
}

static struct jnode *parse_concat(struct parser *p) {
        struct jnode *l = parse_math2(p);
        for (struct token *t; (t = cur(p)), skip_op(p, "~");)
                l = binop(p, t, '~', l, parse_math2(p));
        return l;
}

static struct jnode *parse_math1(struct parser *p) {
        struct jnode *l = parse_concat(p);
        for (;;) {
                struct token *t = cur(p);
                int op = tok_is_op(t, "+") ? '+' : tok_is_op(t, "-") ? '-' : 0;
                if (!op)
                        return l;
                p->pos++;
                l = binop(p, t, op, l, parse_concat(p));
        }
}

static struct jnode *parse_compare(struct parser *p) {
        struct token *at = cur(p);
        struct jnode *first = parse_math1(p);
        struct nvec operands = {};
        int ops[64];
        size_t n_ops = 0;
        nvec_push(p, &operands, first);
        for (;;) {
                struct token *t = cur(p);
                int op = -1;
                if (tok_is_op(t, "=="))
                        op = JC_EQ;
                else if (tok_is_op(t, "!="))
                        op = JC_NE;
                else if (tok_is_op(t, "<"))
                        op = JC_LT;
                else if (tok_is_op(t, "<="))
                        op = JC_LE;
                else if (tok_is_op(t, ">"))
                        op = JC_GT;
                else if (tok_is_op(t, ">="))
                        op = JC_GE;
                else if (tok_is_name(t, "in"))
                        op = JC_IN;
                else if (tok_is_name(t, "not") && tok_is_name(peek(p, 1), "in")) {
                        op = JC_NOTIN;
                        p->pos++;
                }
                if (op < 0)
                        break;
                p->pos++;
                if (n_ops == ELEMENTSOF(ops))
                        parse_fail(p, t->line, t->col, "comparison chain too long");
                ops[n_ops++] = op;
                nvec_push(p, &operands, parse_math1(p));
        }
        if (n_ops == 0)
                return first;
        struct jnode *n = mknode(p, JN_COMPARE, at);
        n->kids = operands.v;
        n->n_kids = operands.n;
        n->ops = palloc(p, n_ops * sizeof(int));
        memcpy(n->ops, ops, n_ops * sizeof(int));
        return n;
}

static struct jnode *parse_not(struct parser *p) {
        struct token *t = cur(p);
        if (skip_name(p, "not")) {
                enter(p);
                struct jnode *n = mknode(p, JN_NOT, t);
                n->a = parse_not(p);
                p->depth--;
                return n;
        }
        return parse_compare(p);
}

static struct jnode *parse_and(struct parser *p) {
        struct jnode *l = parse_not(p);
        for (struct token *t; (t = cur(p)), skip_name(p, "and");) {
                struct jnode *n = mknode(p, JN_AND, t);
                n->a = l;
                n->b = parse_not(p);
                l = n;
        }
        return l;
}

static struct jnode *parse_or(struct parser *p) {
        struct jnode *l = parse_and(p);
        for (struct token *t; (t = cur(p)), skip_name(p, "or");) {
                struct jnode *n = mknode(p, JN_OR, t);
                n->a = l;
                n->b = parse_and(p);
                l = n;
        }
        return l;
}

static struct jnode *parse_expr(struct parser *p, bool with_condexpr) {
        enter(p);
        struct jnode *e = parse_or(p);
        if (with_condexpr)
                for (struct token *t; (t = cur(p)), skip_name(p, "if");) {
                        struct jnode *n = mknode(p, JN_COND, t);
                        n->b = e;
                        n->a = parse_or(p);
                        if (skip_name(p, "else"))
                                n->c = parse_expr(p, true);
                        e = n;
                }
        p->depth--;
        return e;
}

/* ---- statements ---- */

static void parse_body(struct parser *p, const char *const *ends, struct nvec *out);

static void expect_block_end(struct parser *p) {
        expect_type(p, T_BLOCK_END, "'%}'");
}

/* Consumes "{% NAME" of an end tag found by parse_body, returns the name. */
static const char *end_tag(struct parser *p) {
        p->pos++; /* T_BLOCK_BEGIN */
        return expect_name(p);
}

static const char *const ENDS_IF[] = {"elif", "else", "endif", NULL};
static const char *const ENDS_ENDIF[] = {"endif", NULL};
static const char *const ENDS_FOR[] = {"else", "endfor", NULL};
static const char *const ENDS_ENDFOR[] = {"endfor", NULL};
static const char *const ENDS_SET[] = {"endset", NULL};
static const char *const ENDS_MACRO[] = {"endmacro", NULL};
static const char *const ENDS_FILTER[] = {"endfilter", NULL};
static const char *const ENDS_GENERATION[] = {"endgeneration", NULL};

static struct jnode *parse_if(struct parser *p, const struct token *at) {
        struct jnode *n = mknode(p, JN_IF, at);
        n->a = parse_tuple(p, true, false);
        expect_block_end(p);
        struct nvec body = {};
        parse_body(p, ENDS_IF, &body);
        n->kids = body.v;
        n->n_kids = body.n;
        struct token *t = peek(p, 1);
        const char *e = end_tag(p);
        if (streq(e, "elif")) {
                n->else_kids = palloc(p, sizeof(struct jnode *));
                n->else_kids[0] = parse_if(p, t);
                n->n_else = 1;
                return n;
        }
        if (streq(e, "else")) {
                expect_block_end(p);
                struct nvec eb = {};
                parse_body(p, ENDS_ENDIF, &eb);
                n->else_kids = eb.v;
                n->n_else = eb.n;
                end_tag(p);
        }
        expect_block_end(p);
        return n;
}

static void parse_targets(struct parser *p, struct svec *names) {
        bool paren = skip_op(p, "(");
        do {
                svec_push(p, names, expect_name(p));
        } while (skip_op(p, ","));
        if (paren)
                expect_op(p, ")");
}

static struct jnode *parse_for(struct parser *p, const struct token *at) {
        struct jnode *n = mknode(p, JN_FOR, at);
        struct svec names = {};
        parse_targets(p, &names);
        n->targets = names.v;
        n->n_targets = names.n;
        struct token *t = cur(p);
        if (!skip_name(p, "in"))
                parse_fail(p, t->line, t->col, "expected 'in' in for loop, got %s", tok_desc(p, t));
        n->a = parse_tuple(p, false, false);
        if (skip_name(p, "if"))
                n->b = parse_expr(p, true);
        t = cur(p);
        if (tok_is_name(t, "recursive"))
                parse_fail(p, t->line, t->col, "unsupported construct: recursive for loop");
        expect_block_end(p);
        struct nvec body = {};
        parse_body(p, ENDS_FOR, &body);
        n->kids = body.v;
        n->n_kids = body.n;
        if (streq(end_tag(p), "else")) {
                expect_block_end(p);
                struct nvec eb = {};
                parse_body(p, ENDS_ENDFOR, &eb);
                n->else_kids = eb.v;
                n->n_else = eb.n;
                end_tag(p);
        }
        expect_block_end(p);
        return n;
}

static struct jnode *parse_set(struct parser *p, const struct token *at) {
        struct token *t = cur(p);
        if (t->type == T_NAME && tok_is_op(peek(p, 1), ".")) {
                struct jnode *n = mknode(p, JN_SET, at);
                n->str = expect_name(p);
                p->pos++;
                n->str2 = expect_name(p);
                expect_op(p, "=");
                n->a = parse_tuple(p, true, false);
                expect_block_end(p);
                return n;
        }
        struct svec names = {};
        parse_targets(p, &names);
        if (skip_op(p, "=")) {
                struct jnode *n = mknode(p, JN_SET, at);
                n->targets = names.v;
                n->n_targets = names.n;
                n->a = parse_tuple(p, true, false);
                expect_block_end(p);
                return n;
        }
        t = cur(p);
        if (names.n != 1)
                parse_fail(p, t->line, t->col, "expected '=' after the names of a set");
        if (tok_is_op(t, "|"))
                parse_fail(p, t->line, t->col, "unsupported construct: filter on a block set");
        expect_block_end(p);
        struct jnode *n = mknode(p, JN_SETBLOCK, at);
        n->targets = names.v;
        n->n_targets = 1;
        struct nvec body = {};
        parse_body(p, ENDS_SET, &body);
        n->kids = body.v;
        n->n_kids = body.n;
        end_tag(p);
        expect_block_end(p);
        return n;
}

static struct jnode *parse_macro(struct parser *p, const struct token *at) {
        struct jnode *n = mknode(p, JN_MACRO, at);
        n->str = expect_name(p);
        struct svec names = {};
        struct nvec defs = {};
        expect_op(p, "(");
        while (!tok_is_op(cur(p), ")")) {
                if (names.n)
                        expect_op(p, ",");
                if (tok_is_op(cur(p), ")"))
                        break;
                struct token *t = cur(p);
                const char *name = expect_name(p);
                struct jnode *def = NULL;
                if (skip_op(p, "="))
                        def = parse_expr(p, true);
                else if (defs.n && defs.v[defs.n - 1])
                        parse_fail(p, t->line, t->col, "macro parameter '%s' without default after one with a default", name);
                svec_push(p, &names, name);
                nvec_push(p, &defs, def);
        }
        expect_op(p, ")");
        expect_block_end(p);
        n->targets = names.v;
        n->n_targets = names.n;
        n->kw_vals = defs.v;
        n->n_kw = defs.n;
        struct nvec body = {};
        parse_body(p, ENDS_MACRO, &body);
        n->kids = body.v;
        n->n_kids = body.n;
        end_tag(p);
        if (cur(p)->type == T_NAME)
                p->pos++;
        expect_block_end(p);
        return n;
}

static struct jnode *parse_statement(struct parser *p) {
        struct token *begin = cur(p);
        p->pos++;
        struct token *t = cur(p);
        if (t->type != T_NAME)
                parse_fail(p, t->line, t->col, "expected a tag name after '{%%', got %s", tok_desc(p, t));
        const char *name = tok_str(p, t);
        p->pos++;
        enter(p);
        struct jnode *n = NULL;
        if (streq(name, "if"))
                n = parse_if(p, t);
        else if (streq(name, "for"))
                n = parse_for(p, t);
        else if (streq(name, "set"))
                n = parse_set(p, t);
        else if (streq(name, "macro"))
                n = parse_macro(p, t);
        else if (streq(name, "break") || streq(name, "continue")) {
                n = mknode(p, name[0] == 'b' ? JN_BREAK : JN_CONTINUE, t);
                expect_block_end(p);
        } else if (streq(name, "filter")) {
                n = mknode(p, JN_FILTERBLOCK, t);
                struct jnode *chain = NULL;
                do
                        chain = parse_filter(p, chain);
                while (skip_op(p, "|"));
                n->a = chain;
                expect_block_end(p);
                struct nvec body = {};
                parse_body(p, ENDS_FILTER, &body);
                n->kids = body.v;
                n->n_kids = body.n;
                end_tag(p);
                expect_block_end(p);
        } else if (streq(name, "generation")) {
                /* transformers' AssistantTracker: outside mask tracking the body renders as is */
                n = mknode(p, JN_IF, t);
                expect_block_end(p);
                struct nvec body = {};
                parse_body(p, ENDS_GENERATION, &body);
                n->kids = body.v;
                n->n_kids = body.n;
                end_tag(p);
                expect_block_end(p);
        } else if (streq(name, "call") || streq(name, "raw") || streq(name, "include") || streq(name, "import") ||
                   streq(name, "from") || streq(name, "extends") || streq(name, "block") || streq(name, "with") ||
                   streq(name, "autoescape") || streq(name, "do"))
                parse_fail(p, t->line, t->col, "unsupported tag '%s'", name);
        else
                parse_fail(p, t->line, t->col, "unknown tag '%s'", name);
        (void) begin;
        p->depth--;
        return n;
}

static void parse_body(struct parser *p, const char *const *ends, struct nvec *out) {
        for (;;) {
                struct token *t = cur(p);
                switch (t->type) {
                case T_EOF:
                        if (ends) {
                                const char *const *last = ends;
                                while (last[1])
                                        last++;
                                parse_fail(p, t->line, t->col, "unexpected end of template, expected '%s'", *last);
                        }
                        return;
                case T_TEXT: {
                        struct jnode *n = mknode(p, JN_TEXT, t);
                        n->str = t->s;
                        n->len = t->len;
                        nvec_push(p, out, n);
                        p->pos++;
                        break;
                }
                case T_VAR_BEGIN: {
                        p->pos++;
                        struct jnode *n = mknode(p, JN_OUTPUT, t);
                        n->a = parse_tuple(p, true, false);
                        expect_type(p, T_VAR_END, "'}}'");
                        nvec_push(p, out, n);
                        break;
                }
                case T_BLOCK_BEGIN: {
                        struct token *name = peek(p, 1);
                        if (name->type == T_NAME && ends)
                                for (const char *const *e = ends; *e; e++)
                                        if (tok_is_name(name, *e))
                                                return;
                        if (name->type == T_NAME && name->len > 3 && memcmp(name->s, "end", 3) == 0)
                                parse_fail(p, name->line, name->col, "unexpected '%.*s'%s%s%s", (int) name->len, name->s,
                                           ends ? ", expected '" : "", ends ? ends[0] : "", ends ? "'" : "");
                        if (name->type == T_NAME && (tok_is_name(name, "elif") || tok_is_name(name, "else")))
                                parse_fail(p, name->line, name->col, "unexpected '%.*s'", (int) name->len, name->s);
                        nvec_push(p, out, parse_statement(p));
                        break;
                }
                default:
                        parse_fail(p, t->line, t->col, "unexpected %s", tok_desc(p, t));
                }
        }
}

int jinja_parse(const char *text, size_t len, struct jinja_template **ret, char *err, size_t err_size) {
        struct jinja_template *t = calloc(1, sizeof(*t));
        if (!t)
                return error_set(err, err_size, ENOMEM, "template: out of memory");
        t->arena = arena_new((size_t) 1 << 30);
        if (!t->arena) {
                free(t);
                return error_set(err, err_size, ENOMEM, "template: out of memory");
        }
        struct parser *p = calloc(1, sizeof(*p));
        if (!p) {
                jinja_template_free(t);
                return error_set(err, err_size, ENOMEM, "template: out of memory");
        }
        p->arena = t->arena;
        p->err = err;
        p->err_size = err_size;
        p->line = 1;
        if (setjmp(p->fail)) {
                free(p);
                jinja_template_free(t);
                return -EINVAL;
        }
        /* Jinja2 normalizes newlines to \n and drops one trailing newline (keep_trailing_newline
         * is off in transformers). */
        char *src = palloc(p, len + 1);
        size_t n = 0;
        for (size_t i = 0; i < len; i++) {
                if (text[i] == '\r') {
                        src[n++] = '\n';
                        if (i + 1 < len && text[i + 1] == '\n')
                                i++;
                } else
                        src[n++] = text[i];
        }
        if (n > 0 && src[n - 1] == '\n')
                n--;
        src[n] = 0;
        p->src = src;
        p->n = n;
        lex(p);
        struct nvec body = {};
        parse_body(p, NULL, &body);
        t->body = body.v;
        t->n_body = body.n;
        free(p);
        *ret = t;
        return 0;
}

void jinja_template_free(struct jinja_template *t) {
        if (!t)
                return;
        arena_free(t->arena);
        free(t);
}
