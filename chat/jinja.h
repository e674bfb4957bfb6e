/* SPDX-License-Identifier: MIT */
/* Internal to the chat renderer (chat.c): a Jinja2 subset, the part real chat templates use,
 * with the Hugging Face transformers environment fixed in (trim_blocks, lstrip_blocks, loop
 * controls, `generation` blocks rendered as plain bodies, no trailing newline kept).
 *
 * Memory: every node of a parsed template lives in one arena freed with the template; every value
 * made during a render lives in a per-render arena freed when the render returns. Errors unwind
 * with longjmp to the entry point (nothing to free on the way: all of it is in the arenas), which
 * keeps the interpreter free of error plumbing on every one of its few hundred value operations. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_value;

/* A chunked bump allocator with a byte budget. */
struct arena;
struct arena *arena_new(size_t limit);
void arena_free(struct arena *a);
/* NULL when the budget or memory is exhausted. */
void *arena_alloc(struct arena *a, size_t n);

enum jnode_kind {
        /* expressions */
        JN_CONST_NONE,
        JN_CONST_BOOL,
        JN_CONST_INT,
        JN_CONST_FLOAT,
        JN_CONST_STR,
        JN_NAME,
        JN_LIST,
        JN_TUPLE,
        JN_DICT, /* kids: key, value, key, value, ... */
        JN_GETATTR, /* a.str */
        JN_GETITEM, /* a[b] */
        JN_SLICE,   /* a[b:c:d], missing parts NULL */
        JN_CALL,    /* a(kids..., kw...) */
        JN_FILTER,  /* a | str(kids..., kw...); a NULL inside a filter block */
        JN_TEST,    /* a is [not] str(kids...); op = negated */
        JN_NEG,
        JN_POS,
        JN_NOT,
        JN_AND,
        JN_OR,
        JN_BINOP, /* op: one of '+', '-', '*', '/', 'F' (//), '%', 'P' (**), '~' */
        JN_COMPARE, /* kids = operands, ops[] the n-1 operators */
        JN_COND,    /* b if a else c (c may be NULL: undefined) */
        /* statements */
        JN_TEXT,
        JN_OUTPUT,
        JN_IF,       /* if a: kids (body) else: else_kids */
        JN_FOR,      /* for targets in a [if b]: kids else: else_kids */
        JN_SET,      /* targets = a; or (ns.attr) when str set: a ns name, attr str2 */
        JN_SETBLOCK, /* {% set targets[0] %}kids{% endset %} */
        JN_MACRO,    /* str name, params (targets), defaults (kw, NULL = none), kids body */
        JN_BREAK,
        JN_CONTINUE,
        JN_FILTERBLOCK, /* a = filter chain with a NULL innermost input, kids body */
};

enum jcmp { JC_EQ, JC_NE, JC_LT, JC_LE, JC_GT, JC_GE, JC_IN, JC_NOTIN };

struct jnode {
        enum jnode_kind kind;
        int op;
        int line, col;
        struct jnode *a, *b, *c, *d;
        struct jnode **kids;
        size_t n_kids;
        struct jnode **else_kids;
        size_t n_else;
        /* keyword arguments of calls/filters/tests, or macro parameter defaults */
        const char **kw_names;
        struct jnode **kw_vals;
        size_t n_kw;
        /* names: JN_FOR / JN_SET targets, JN_MACRO params */
        const char **targets;
        size_t n_targets;
        int *ops;
        const char *str, *str2;
        size_t len;
        int64_t i;
        double f;
};

struct jinja_template {
        struct arena *arena;
        struct jnode **body;
        size_t n_body;
};

struct jinja_limits {
        uint64_t max_steps;
        size_t max_output;
        unsigned max_depth;
        size_t max_memory;
};

/* Parses a template; errors are -EINVAL with "template:LINE:COL: why" in err (error_set(),
 * common/log.h: NULL, 0 logs it). */
int jinja_parse(const char *text, size_t len, struct jinja_template **ret, char *err, size_t err_size);
void jinja_template_free(struct jinja_template *t);

/* Renders with the members of ctx (a JSON object) as globals. Returns 0 with a malloc'ed,
 * NUL-terminated string, or -EINVAL/-E2BIG/-ENOMEM with the message in err (error_set(),
 * common/log.h: NULL, 0 logs it). */
int jinja_render(const struct jinja_template *t, const struct json_value *ctx,
                 const struct jinja_limits *limits, char **ret, size_t *ret_len, char *err,
                 size_t err_size);
