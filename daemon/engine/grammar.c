/* SPDX-License-Identifier: MIT */
/* Constrained decoding (what is allowed: grammar.h).
 *
 * The schema becomes a graph of nodes (object, array, string, number, literal set, anyOf, any
 * value; for a forced tool call in the model's syntax: the call, a tool's parameters, raw text). A matcher thread is a stack of frames, one per open value; a byte moves the top frame
 * or pushes / pops one. anyOf forks threads at the first byte of the value; the matcher state is
 * the set of live threads (deduplicated).
 *
 * The mask walks the vocabulary's trie depth first with the thread set, pruning a subtree as soon
 * as no thread survives its prefix. Inside a free string almost every token is allowed, and what
 * a token does there is known before any walk: a "clean" token (valid UTF-8 without `"`, `\` or
 * a control byte) stays in the string, so the mask starts from the precomputed clean set; any
 * other token leaves the string as it was up to its first such byte, so only its suffix from
 * there is walked, in a second trie of those suffixes (short: most start with `"` and punctuation),
 * not in the full trie. Below that, a trie node whose tokens are all clean after the bytes already taken is
 * taken whole while every thread is in a string body. Masks are cached by the exact thread set, so
 * a repeated state (the next token of a string, a number) costs a hash and a copy. */
#include "grammar.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/tokenizer.h"
#include "common/json.h"
#include "common/log.h"

/* ---- compiled grammar ------------------------------------------------------------------------ */

enum gkind {
        GK_ANY,     /* any JSON value: becomes one of the builtins at its first byte */
        GK_OBJECT,
        GK_ARRAY,
        GK_STRING,
        GK_NUMBER,
        GK_INTEGER,
        GK_LITERAL, /* one of a sorted set of JSON texts */
        GK_ANYOF,
        GK_REF,     /* resolved when pushed */
        /* the forced tool call in the model's own syntax (docs/model.md §7):
         * NAME<param_key>K</param_key><param_value>V</param_value>… */
        GK_CALL,    /* the name (a literal pushed above it), then the frame becomes its GK_PARAMS */
        GK_PARAMS,  /* one tool's key / value pairs */
        GK_RAW,     /* raw text up to its end marker (a string value, a free key), marker included */
};

/* The native call's markup: plain text pieces (user-defined in the release's vocabulary), so the
 * matcher takes them byte by byte like any text. */
#define PARAM_KEY "<param_key>"
#define PARAM_KEY_END "</param_key>"
#define PARAM_VALUE "<param_value>"
#define PARAM_VALUE_END "</param_value>"
/* GK_RAW's end marker, by its node's `a`: a value's, or a free key's (then the value opens) */
static const char *const RAW_END[2] = { PARAM_VALUE_END, PARAM_KEY_END PARAM_VALUE };

/* builtin nodes, at these indices of every grammar */
enum {
        N_ANY,
        N_ANY_OBJECT, /* free keys, any values */
        N_ANY_ARRAY,
        N_STRING,
        N_NUMBER,
        N_TFN, /* true / false / null */
        N_BUILTIN,
};

#define INF_LEN (UINT32_MAX / 4)

struct gstr {
        char *s;
        uint32_t len;
};

struct gnode {
        uint8_t kind;
        bool native;    /* a native call's value that ends with its own `</param_value>` (raw
                         * text, a literal of raw strings); other values are JSON, the marker after */
        uint32_t a, n;  /* object, params: keys[a..a+n) sorted; literal: lits[a..a+n); anyOf:
                         * list[a..a+n); raw: its end marker is RAW_END[a] */
        uint64_t required; /* object: bit k = the k-th declared property is required; params: the
                            * k-th key in sorted order */
        int32_t extra;  /* object without properties (and params): node of the values of free keys,
                         * -1: closed */
        uint32_t decl;  /* object: list[decl..decl+n) = sorted index of the i-th declared key */
        uint32_t tools; /* call: list[tools + k] = GK_PARAMS node of name k */
        int32_t items;          /* array; call: the names' literal; params: the free keys' GK_RAW */
        uint32_t min_items, max_items; /* raw: min_items = bytes of text at least */
        int32_t target;         /* ref */
        uint32_t min_len;       /* bytes of the shortest value */
        uint32_t best;          /* anyOf: the branch that gave min_len first (no cycle through it) */
        uint32_t min_depth;     /* frames the shallowest value needs (a scalar: 1) */
};

struct grammar {
        struct gnode *nodes;
        uint32_t n_nodes, cap_nodes;
        struct gstr *keys; /* escaped property names, with quotes */
        int32_t *key_node;
        uint32_t n_keys, cap_keys;
        struct gstr *lits;
        uint32_t n_lits, cap_lits;
        uint32_t *list;
        uint32_t n_list, cap_list;
        int32_t root;
        int32_t pre[2], post[2]; /* special tokens around the JSON (tool call), -1 none */
        uint32_t n_pre, n_post;
        uint32_t max_min_len;    /* largest min_len of any node, for the closing margin */
        int32_t raw_value;       /* native call: the GK_RAW node of a string value */
        bool lazy;               /* GRAMMAR_TOOL_CALLS: free output, each call from `<tool_call>` on
                                  * held to the grammar */
        int32_t answer;          /* GRAMMAR_OR_TOOL_CALLS: the JSON answer's root, the alternative
                                  * to calls (root) at the output's first token; -1 none */
};

static int grow_array(void **p, uint32_t *cap, uint32_t need, size_t elem) {
        if (need <= *cap)
                return 0;
        uint32_t c = MAX(*cap * 2, MAX(need, 16u));
        void *q = realloc(*p, (size_t) c * elem);
        if (!q)
                return -ENOMEM;
        *p = q;
        *cap = c;
        return 0;
}

static int32_t node_new(struct grammar *g, enum gkind kind) {
        if (g->n_nodes >= 1u << 24 || grow_array((void **) &g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes) < 0)
                return -ENOMEM;
        g->nodes[g->n_nodes] = (struct gnode){ .kind = kind, .extra = -1, .items = -1, .target = -1,
                                               .max_items = UINT32_MAX };
        return (int32_t) g->n_nodes++;
}

static int list_push(struct grammar *g, uint32_t v) {
        if (grow_array((void **) &g->list, &g->cap_list, g->n_list + 1, sizeof *g->list) < 0)
                return -ENOMEM;
        g->list[g->n_list++] = v;
        return 0;
}

static int gstr_cmp(const struct gstr *a, const struct gstr *b) {
        int c = memcmp(a->s, b->s, MIN(a->len, b->len));
        return c ? c : (a->len > b->len) - (a->len < b->len);
}

static int gstr_qcmp(const void *x, const void *y) {
        return gstr_cmp(x, y);
}

void grammar_free(struct grammar *g) {
        if (!g)
                return;
        for (uint32_t i = 0; i < g->n_keys; i++)
                free(g->keys[i].s);
        for (uint32_t i = 0; i < g->n_lits; i++)
                free(g->lits[i].s);
        free(g->keys);
        free(g->key_node);
        free(g->lits);
        free(g->list);
        free(g->nodes);
        free(g);
}

/* Literal set node from JSON texts (taken). Sorted, duplicates dropped. */
static int32_t literal_node(struct grammar *g, struct gstr *texts, uint32_t n) {
        qsort(texts, n, sizeof *texts, gstr_qcmp);
        int32_t id = node_new(g, GK_LITERAL);
        if (id < 0)
                goto fail;
        g->nodes[id].a = g->n_lits;
        for (uint32_t i = 0; i < n; i++) {
                if (g->nodes[id].n > 0 && gstr_cmp(&g->lits[g->n_lits - 1], &texts[i]) == 0) {
                        free(texts[i].s);
                        texts[i].s = NULL;
                        continue;
                }
                if (grow_array((void **) &g->lits, &g->cap_lits, g->n_lits + 1, sizeof *g->lits) < 0) {
                        id = -ENOMEM;
                        goto fail;
                }
                g->lits[g->n_lits++] = texts[i];
                texts[i].s = NULL;
                g->nodes[id].n++;
        }
        return id;
fail:
        for (uint32_t i = 0; i < n; i++)
                free(texts[i].s);
        return id;
}

static int32_t literal_node_of(struct grammar *g, const char *const *words, uint32_t n) {
        struct gstr t[8];
        for (uint32_t i = 0; i < n; i++) {
                t[i].s = strdup(words[i]);
                t[i].len = (uint32_t) strlen(words[i]);
                if (!t[i].s) {
                        for (uint32_t k = 0; k < i; k++)
                                free(t[k].s);
                        return -ENOMEM;
                }
        }
        return literal_node(g, t, n);
}

static int grammar_init(struct grammar **ret) {
        _cleanup_(grammar_freep) struct grammar *g = calloc(1, sizeof *g);
        if (!g)
                return -ENOMEM;
        g->pre[0] = g->pre[1] = g->post[0] = g->post[1] = -1;
        g->raw_value = -1;
        g->answer = -1;
        static const enum gkind kinds[] = { GK_ANY, GK_OBJECT, GK_ARRAY, GK_STRING, GK_NUMBER };
        for (size_t i = 0; i < ELEMENTSOF(kinds); i++)
                if (node_new(g, kinds[i]) < 0)
                        return -ENOMEM;
        g->nodes[N_ANY_OBJECT].extra = N_ANY;
        g->nodes[N_ANY_ARRAY].items = N_ANY;
        static const char *const tfn[] = { "true", "false", "null" };
        if (literal_node_of(g, tfn, 3) != N_TFN)
                return -ENOMEM;
        *ret = TAKE_PTR(g);
        return 0;
}

/* ---- schema compiler ------------------------------------------------------------------------- */

struct compiler {
        struct grammar *g;
        const struct json_value *root;
        char *err;
        size_t err_size;
        /* $defs already compiled: name pointer (into the root document) -> node */
        const struct json_value **def_v;
        int32_t *def_node;
        uint32_t n_defs, cap_defs;
        int32_t root_node; /* the node "#" refers to (reserved before compiling the root) */
        unsigned depth;
        /* GRAMMAR_LENIENT: keywords the grammar cannot enforce (pattern, bounds, formats, not,
         * if/then/else) are ignored rather than refused, oneOf is read as anyOf and allOf of
         * several as its first: the output keeps the schema's structure */
        bool lenient;
};

static int cerr(struct compiler *c, const char *path, const char *fmt, ...) _printf_(3, 4);
static int cerr(struct compiler *c, const char *path, const char *fmt, ...) {
        va_list ap;
        int k = snprintf(c->err, c->err_size, "%s%s", path[0] ? path : "", path[0] ? ": " : "");
        if (k < 0 || (size_t) k >= c->err_size)
                return -EINVAL;
        va_start(ap, fmt);
        vsnprintf(c->err + k, c->err_size - (size_t) k, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

static int32_t compile_node(struct compiler *c, const struct json_value *s, const char *path);

static void subpath(char *buf, size_t size, const char *path, const char *fmt, ...) _printf_(4, 5);
static void subpath(char *buf, size_t size, const char *path, const char *fmt, ...) {
        va_list ap;
        int k = snprintf(buf, size, "%s%s", path, path[0] ? "." : "");
        if (k < 0 || (size_t) k >= size)
                return;
        va_start(ap, fmt);
        vsnprintf(buf + k, size - (size_t) k, fmt, ap);
        va_end(ap);
}

static const char *const IGNORED[] = {
        "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
        "readOnly", "writeOnly", "$defs", "definitions", "strict",
};
static const char *const HANDLED[] = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
        "enum", "const", "anyOf", "allOf", "$ref", "nullable",
};

static bool in_list(const char *k, const char *const *list, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (streq(k, list[i]))
                        return true;
        return false;
}

static int get_count(struct compiler *c, const struct json_value *s, const char *key,
                     const char *path, uint32_t *ret) {
        const struct json_value *v = json_object_get(s, key);
        if (!v)
                return 0;
        if (json_type(v) != JSON_INT || json_int(v) < 0 || json_int(v) > UINT32_MAX - 1)
                return cerr(c, path, "%s must be a non-negative integer", key);
        *ret = (uint32_t) json_int(v);
        return 1;
}

static int32_t compile_object(struct compiler *c, const struct json_value *s, const char *path) {
        struct grammar *g = c->g;
        const struct json_value *props = json_object_get(s, "properties");
        const struct json_value *req = json_object_get(s, "required");
        const struct json_value *addl = json_object_get(s, "additionalProperties");
        char sub[512];

        if (props && json_type(props) != JSON_OBJECT)
                return cerr(c, path, "properties must be an object");
        if (req && json_type(req) != JSON_ARRAY)
                return cerr(c, path, "required must be an array of property names");
        if (addl && json_type(addl) != JSON_BOOL && json_type(addl) != JSON_OBJECT)
                return cerr(c, path, "additionalProperties must be a boolean or a schema");
        size_t np = json_count(props);
        if (np > GRAMMAR_MAX_PROPERTIES)
                return cerr(c, path, "%zu properties, at most %d supported", np, GRAMMAR_MAX_PROPERTIES);
        int32_t id = node_new(g, GK_OBJECT);
        if (id < 0)
                return id;
        if (np == 0) {
                /* no listed properties: free keys unless additionalProperties is false */
                if (req && json_count(req) > 0)
                        return cerr(c, path, "required names '%s', which properties does not list",
                                    json_string(json_array_at(req, 0)) ? json_string(json_array_at(req, 0)) : "?");
                if (!addl || (json_type(addl) == JSON_BOOL && json_bool(addl)))
                        g->nodes[id].extra = N_ANY;
                else if (json_type(addl) == JSON_OBJECT) {
                        subpath(sub, sizeof sub, path, "additionalProperties");
                        int32_t e = compile_node(c, addl, sub);
                        if (e < 0)
                                return e;
                        g->nodes[id].extra = e;
                }
                g->nodes[id].min_len = 2;
                return id;
        }
        /* listed properties: keys sorted by their escaped text, declaration order in list */
        struct { struct gstr k; int32_t node; uint32_t decl; } *tmp = calloc(np, sizeof *tmp);
        if (!tmp)
                return -ENOMEM;
        int r = 0;
        for (size_t i = 0; i < np; i++) {
                const char *name = json_object_key_at(props, i);
                struct json_value *nv = json_new_string(name, strlen(name));
                char *esc = nv ? json_dump(nv, JSON_COMPACT, 0) : NULL;
                json_free(nv);
                if (!esc) {
                        r = -ENOMEM;
                        break;
                }
                tmp[i].k = (struct gstr){ esc, (uint32_t) strlen(esc) };
                if (tmp[i].k.len > 4096) { /* the matcher counts key bytes in 16 bits */
                        r = cerr(c, path, "property name %zu is %u bytes long, at most 4096 supported",
                                 i, tmp[i].k.len);
                        break;
                }
                tmp[i].decl = (uint32_t) i;
                subpath(sub, sizeof sub, path, "properties.%s", name);
                tmp[i].node = compile_node(c, json_object_value_at(props, i), sub);
                if (tmp[i].node < 0) {
                        r = tmp[i].node;
                        break;
                }
        }
        if (r < 0) {
                for (size_t i = 0; i < np; i++)
                        free(tmp[i].k.s);
                free(tmp);
                return r;
        }
        /* sort (insertion: at most 64) */
        for (size_t i = 1; i < np; i++)
                for (size_t k = i; k > 0 && gstr_cmp(&tmp[k - 1].k, &tmp[k].k) > 0; k--) {
                        __typeof__(*tmp) t = tmp[k];
                        tmp[k] = tmp[k - 1];
                        tmp[k - 1] = t;
                }
        uint32_t a = g->n_keys; /* after the properties' own objects took theirs */
        if (grow_array((void **) &g->keys, &g->cap_keys, g->n_keys + (uint32_t) np, sizeof *g->keys) < 0 ||
            !(g->key_node = realloc(g->key_node, (size_t) g->cap_keys * sizeof *g->key_node))) {
                for (size_t i = 0; i < np; i++)
                        free(tmp[i].k.s);
                free(tmp);
                return -ENOMEM;
        }
        uint32_t decl_of[GRAMMAR_MAX_PROPERTIES];
        for (size_t i = 0; i < np; i++) {
                g->keys[a + i] = tmp[i].k;
                g->key_node[a + i] = tmp[i].node;
                decl_of[tmp[i].decl] = (uint32_t) i;
        }
        g->n_keys += (uint32_t) np;
        free(tmp);
        struct gnode *o = &g->nodes[id];
        o->a = a;
        o->n = (uint32_t) np;
        o->decl = g->n_list;
        for (size_t i = 0; i < np; i++)
                if (list_push(g, decl_of[i]) < 0)
                        return -ENOMEM;
        for (size_t i = 0; i < json_count(req); i++) {
                const struct json_value *rn = json_array_at(req, i);
                if (json_type(rn) != JSON_STRING)
                        return cerr(c, path, "required[%zu] must be a property name", i);
                uint32_t k;
                for (k = 0; k < np; k++)
                        if (streq(json_object_key_at(props, k), json_string(rn)))
                                break;
                if (k == np)
                        return cerr(c, path, "required names '%s', which properties does not list",
                                    json_string(rn));
                g->nodes[id].required |= 1ull << k; /* by declaration order */
        }
        return id;
}

static int32_t compile_typed(struct compiler *c, const struct json_value *s, const char *type,
                             const char *path) {
        struct grammar *g = c->g;
        if (streq(type, "object"))
                return compile_object(c, s, path);
        if (streq(type, "array")) {
                const struct json_value *items = json_object_get(s, "items");
                char sub[512];
                uint32_t mn = 0, mx = UINT32_MAX;
                int r;
                if ((r = get_count(c, s, "minItems", path, &mn)) < 0 ||
                    (r = get_count(c, s, "maxItems", path, &mx)) < 0)
                        return r;
                if (mn > mx)
                        return cerr(c, path, "minItems %u is larger than maxItems %u", mn, mx);
                if (mn > 1024)
                        return cerr(c, path, "minItems %u: at most 1024 supported", mn);
                int32_t it = N_ANY;
                if (items && json_type(items) == JSON_OBJECT) {
                        subpath(sub, sizeof sub, path, "items");
                        it = compile_node(c, items, sub);
                        if (it < 0)
                                return it;
                } else if (items && json_type(items) == JSON_BOOL && !json_bool(items))
                        mx = 0;
                else if (items && json_type(items) != JSON_BOOL)
                        return cerr(c, path, "items must be a schema (tuple arrays are not supported)");
                if (mn > mx)
                        return cerr(c, path, "minItems %u but items is false", mn);
                int32_t id = node_new(g, GK_ARRAY);
                if (id < 0)
                        return id;
                g->nodes[id].items = it;
                g->nodes[id].min_items = mn;
                g->nodes[id].max_items = mx;
                return id;
        }
        if (streq(type, "string"))
                return N_STRING;
        if (streq(type, "number"))
                return N_NUMBER;
        if (streq(type, "integer"))
                return node_new(g, GK_INTEGER);
        if (streq(type, "boolean")) {
                static const char *const tf[] = { "true", "false" };
                return literal_node_of(g, tf, 2);
        }
        if (streq(type, "null")) {
                static const char *const nu[] = { "null" };
                return literal_node_of(g, nu, 1);
        }
        return cerr(c, path, "type '%s' is not one of object, array, string, number, integer, "
                    "boolean, null", type);
}

static int32_t compile_ref(struct compiler *c, const char *ref, const char *path) {
        if (streq(ref, "#"))
                return c->root_node;
        const char *name = NULL;
        const struct json_value *defs = NULL;
        if (strncmp(ref, "#/$defs/", 8) == 0) {
                name = ref + 8;
                defs = json_object_get(c->root, "$defs");
        } else if (strncmp(ref, "#/definitions/", 14) == 0) {
                name = ref + 14;
                defs = json_object_get(c->root, "definitions");
        } else
                return cerr(c, path, "$ref '%s': only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are supported", ref);
        const struct json_value *d = json_object_get(defs, name);
        if (!d || json_type(d) != JSON_OBJECT)
                return cerr(c, path, "$ref '%s': no such definition", ref);
        for (uint32_t i = 0; i < c->n_defs; i++)
                if (c->def_v[i] == d)
                        return c->def_node[i];
        /* a ref node first, so a definition that refers to itself finds it */
        int32_t id = node_new(c->g, GK_REF);
        if (id < 0)
                return id;
        if (grow_array((void **) &c->def_v, &c->cap_defs, c->n_defs + 1, sizeof *c->def_v) < 0 ||
            !(c->def_node = realloc(c->def_node, (size_t) c->cap_defs * sizeof *c->def_node)))
                return -ENOMEM;
        c->def_v[c->n_defs] = d;
        c->def_node[c->n_defs++] = id;
        char sub[512];
        snprintf(sub, sizeof sub, "%s", ref + 2);
        int32_t t = compile_node(c, d, sub);
        if (t < 0)
                return t;
        c->g->nodes[id].target = t;
        return id;
}

/* JSON text can hold numbers a double cannot (1e999): such an enum value would dump as Infinity. */
static bool all_finite(const struct json_value *v) {
        if (json_type(v) == JSON_DOUBLE)
                return isfinite(json_number(v));
        for (size_t i = 0; (json_type(v) == JSON_ARRAY || json_type(v) == JSON_OBJECT) && i < json_count(v); i++)
                if (!all_finite(json_type(v) == JSON_ARRAY ? json_array_at(v, i) : json_object_value_at(v, i)))
                        return false;
        return true;
}

/* The largest magnitude an integer of MAX_INT_DIGITS digits can have: 10^15 - 1 (< 2^53). */
#define INT_DIGITS_BOUND 999999999999999.0

static int32_t compile_inner(struct compiler *c, const struct json_value *s, const char *path) {
        struct grammar *g = c->g;
        char sub[512];

        if (json_type(s) == JSON_BOOL) {
                if (json_bool(s))
                        return N_ANY;
                return cerr(c, path, "the schema false allows no value");
        }
        if (json_type(s) != JSON_OBJECT)
                return cerr(c, path, "a schema must be an object or a boolean");
        for (size_t i = 0; i < json_count(s); i++) {
                const char *k = json_object_key_at(s, i);
                if (in_list(k, IGNORED, ELEMENTSOF(IGNORED)) || in_list(k, HANDLED, ELEMENTSOF(HANDLED)) ||
                    strncmp(k, "x-", 2) == 0)
                        continue;
                /* bounds every generated integer meets (at most MAX_INT_DIGITS digits): zod's
                 * .int() writes the safe-integer range ±(2^53 - 1) on every integer */
                if (c->lenient)
                        continue;
                if (streq(k, "minimum") || streq(k, "maximum")) {
                        const struct json_value *ty = json_object_get(s, "type");
                        const struct json_value *b = json_object_value_at(s, i);
                        bool num = json_type(b) == JSON_INT || json_type(b) == JSON_DOUBLE;
                        double lim = INT_DIGITS_BOUND, x = num ? json_number(b) : 0;
                        if (ty && json_type(ty) == JSON_STRING && streq(json_string(ty), "integer") &&
                            num && (streq(k, "minimum") ? x <= -lim : x >= lim))
                                continue;
                        return cerr(c, path, "keyword '%s' is supported only on an integer and only as "
                                    "loose as %s%.0f (which every generated integer meets); a tighter "
                                    "bound is not enforced", k, streq(k, "minimum") ? "-" : "", lim);
                }
                /* a format's grammar (email, date-time, uri, uuid, ...) is not in the mask: a strict
                 * schema's answer could break it, as it could a pattern */
                if (streq(k, "format"))
                        return cerr(c, path, "keyword 'format' (\"%s\") is not enforced: the answer "
                                    "could break it; leave it out, or send the schema as non-strict "
                                    "(Constraint.lenient) to have it ignored",
                                    json_type(json_object_value_at(s, i)) == JSON_STRING
                                            ? json_string(json_object_value_at(s, i)) : "?");
                return cerr(c, path, "keyword '%s' is not supported (supported: type, properties, "
                            "required, additionalProperties, items, minItems, maxItems, enum, const, "
                            "anyOf, $ref, $defs)", k);
        }
        const struct json_value *v;
        /* lenient: beside a structure of its own (type, properties, items, enum, const), an allOf
         * or a oneOf adds rules to it (if/then, `required` alternatives): ignored, not taken as
         * the value's whole schema */
        bool own = c->lenient && (json_object_get(s, "type") || json_object_get(s, "properties") ||
                                  json_object_get(s, "items") || json_object_get(s, "enum") ||
                                  json_object_get(s, "const"));
        if ((v = json_object_get(s, "$ref"))) {
                if (json_type(v) != JSON_STRING)
                        return cerr(c, path, "$ref must be a string");
                return compile_ref(c, json_string(v), path);
        }
        if (!own && (v = json_object_get(s, "allOf"))) {
                if (json_type(v) != JSON_ARRAY || json_count(v) == 0 || (json_count(v) != 1 && !c->lenient))
                        return cerr(c, path, "allOf is supported with exactly one schema");
                subpath(sub, sizeof sub, path, "allOf[0]");
                return compile_node(c, json_array_at(v, 0), sub);
        }
        const struct json_value *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
        if (en || cn) {
                if (en && (json_type(en) != JSON_ARRAY || json_count(en) == 0))
                        return cerr(c, path, "enum must be a non-empty array");
                uint32_t n = en ? (uint32_t) json_count(en) : 1;
                if (n > 65535)
                        return cerr(c, path, "enum has %u values, at most 65535 supported", n);
                for (uint32_t i = 0; i < n; i++)
                        if (!all_finite(en ? json_array_at(en, i) : cn))
                                return cerr(c, path, "%s holds a number out of the double range",
                                            en ? "enum" : "const");
                struct gstr *t = calloc(n, sizeof *t);
                if (!t)
                        return -ENOMEM;
                for (uint32_t i = 0; i < n; i++) {
                        t[i].s = json_dump(en ? json_array_at(en, i) : cn, JSON_COMPACT, 0);
                        if (!t[i].s) {
                                for (uint32_t k = 0; k < i; k++)
                                        free(t[k].s);
                                free(t);
                                return -ENOMEM;
                        }
                        t[i].len = (uint32_t) strlen(t[i].s);
                }
                for (uint32_t i = 0; i < n; i++)
                        if (t[i].len > 60000) { /* literal bytes are counted in 16 bits */
                                for (uint32_t k = 0; k < n; k++)
                                        free(t[k].s);
                                free(t);
                                return cerr(c, path, "%s value %u is longer than 60000 bytes", en ? "enum" : "const", i);
                        }
                int32_t id = literal_node(g, t, n);
                free(t);
                return id;
        }
        if ((v = json_object_get(s, "anyOf")) || (c->lenient && !own && (v = json_object_get(s, "oneOf")))) {
                if (json_type(v) != JSON_ARRAY || json_count(v) == 0)
                        return cerr(c, path, "anyOf must be a non-empty array of schemas");
                if (json_count(v) > 256)
                        return cerr(c, path, "anyOf has %zu schemas, at most 256 supported", json_count(v));
                int32_t br[256];
                for (size_t i = 0; i < json_count(v); i++) {
                        subpath(sub, sizeof sub, path, "anyOf[%zu]", i);
                        br[i] = compile_node(c, json_array_at(v, i), sub);
                        if (br[i] < 0)
                                return br[i];
                }
                int32_t id = node_new(g, GK_ANYOF);
                if (id < 0)
                        return id;
                g->nodes[id].a = g->n_list;
                g->nodes[id].n = (uint32_t) json_count(v);
                for (size_t i = 0; i < json_count(v); i++)
                        if (list_push(g, (uint32_t) br[i]) < 0)
                                return -ENOMEM;
                return id;
        }
        const struct json_value *type = json_object_get(s, "type");
        if (!type) {
                /* no type: what the structural keywords say, else anything */
                if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
                    json_object_get(s, "required"))
                        return compile_object(c, s, path);
                if (json_object_get(s, "items"))
                        return compile_typed(c, s, "array", path);
                return N_ANY;
        }
        if (json_type(type) == JSON_STRING)
                return compile_typed(c, s, json_string(type), path);
        if (json_type(type) != JSON_ARRAY || json_count(type) == 0 || json_count(type) > 7)
                return cerr(c, path, "type must be a type name or a non-empty array of them");
        if (json_count(type) == 1) {
                const char *tn = json_string(json_array_at(type, 0));
                return compile_typed(c, s, tn ? tn : "", path);
        }
        int32_t br[7];
        for (size_t i = 0; i < json_count(type); i++) {
                const char *tn = json_string(json_array_at(type, i));
                br[i] = compile_typed(c, s, tn ? tn : "", path);
                if (br[i] < 0)
                        return br[i];
        }
        int32_t id = node_new(g, GK_ANYOF);
        if (id < 0)
                return id;
        g->nodes[id].a = g->n_list;
        g->nodes[id].n = (uint32_t) json_count(type);
        for (size_t i = 0; i < json_count(type); i++)
                if (list_push(g, (uint32_t) br[i]) < 0)
                        return -ENOMEM;
        return id;
}

static int32_t compile_node(struct compiler *c, const struct json_value *s, const char *path) {
        if (++c->depth > 64) {
                c->depth--;
                return cerr(c, path, "schema nested more than 64 deep");
        }
        int32_t id = compile_inner(c, s, path);
        const struct json_value *nl = json_type(s) == JSON_OBJECT ? json_object_get(s, "nullable") : NULL;
        if (id >= 0 && nl && json_type(nl) == JSON_BOOL && json_bool(nl)) {
                static const char *const nu[] = { "null" };
                int32_t n = literal_node_of(c->g, nu, 1);
                int32_t u = n >= 0 ? node_new(c->g, GK_ANYOF) : n;
                if (u < 0)
                        id = u;
                else {
                        c->g->nodes[u].a = c->g->n_list;
                        c->g->nodes[u].n = 2;
                        id = list_push(c->g, (uint32_t) id) < 0 || list_push(c->g, (uint32_t) n) < 0 ? -ENOMEM : u;
                }
        }
        c->depth--;
        return id;
}

static uint32_t resolve(const struct grammar *g, int32_t id) {
        for (int i = 0; i < 64 && g->nodes[id].kind == GK_REF; i++)
                id = g->nodes[id].target;
        return (uint32_t) id;
}

static uint32_t add_len(uint32_t a, uint32_t b) {
        return a >= INF_LEN || b >= INF_LEN || a + b >= INF_LEN ? INF_LEN : a + b;
}

/* A native call parameter's value: its own end marker, or `</param_value>` after the JSON. */
static uint32_t value_len(const struct grammar *g, int32_t id) {
        const struct gnode *v = &g->nodes[resolve(g, id)];
        return add_len(v->min_len, v->native ? 0 : (uint32_t) strlen(PARAM_VALUE_END));
}

/* min_len of every node, to a fixpoint (recursive schemas) */
static void compute_min_len(struct grammar *g) {
        for (uint32_t i = 0; i < g->n_nodes; i++)
                g->nodes[i].min_len = INF_LEN;
        for (bool changed = true; changed;) {
                changed = false;
                for (uint32_t i = 0; i < g->n_nodes; i++) {
                        struct gnode *n = &g->nodes[i];
                        uint32_t l = INF_LEN;
                        switch (n->kind) {
                        case GK_ANY:
                        case GK_NUMBER:
                        case GK_INTEGER:
                                l = 1;
                                break;
                        case GK_STRING:
                                l = 2;
                                break;
                        case GK_LITERAL:
                                for (uint32_t k = 0; k < n->n; k++)
                                        l = MIN(l, g->lits[n->a + k].len);
                                break;
                        case GK_ANYOF:
                                for (uint32_t k = 0; k < n->n; k++)
                                        if (g->nodes[g->list[n->a + k]].min_len < l) {
                                                l = g->nodes[g->list[n->a + k]].min_len;
                                                if (l < n->min_len)
                                                        n->best = g->list[n->a + k];
                                        }
                                break;
                        case GK_REF:
                                l = g->nodes[n->target].min_len;
                                break;
                        case GK_ARRAY: {
                                uint32_t it = g->nodes[n->items].min_len;
                                l = 2;
                                for (uint32_t k = 0; k < n->min_items; k++)
                                        l = add_len(l, add_len(it, k > 0));
                                break;
                        }
                        case GK_RAW:
                                l = (uint32_t) strlen(RAW_END[n->a]) + n->min_items;
                                break;
                        case GK_PARAMS:
                                l = 0;
                                for (uint32_t k = 0; k < n->n; k++)
                                        if (n->required >> k & 1)
                                                l = add_len(l, add_len(g->keys[n->a + k].len,
                                                                       value_len(g, g->key_node[n->a + k])));
                                break;
                        case GK_CALL: {
                                const struct gnode *names = &g->nodes[n->items];
                                for (uint32_t k = 0; k < names->n; k++)
                                        l = MIN(l, add_len(g->lits[names->a + k].len,
                                                           g->nodes[g->list[n->tools + k]].min_len));
                                break;
                        }
                        case GK_OBJECT:
                                l = 2;
                                for (uint32_t k = 0, m = 0; k < n->n; k++) {
                                        uint32_t s = g->list[n->decl + k];
                                        if (!(n->required >> k & 1))
                                                continue;
                                        uint32_t v = g->nodes[g->key_node[n->a + s]].min_len;
                                        l = add_len(l, add_len(g->keys[n->a + s].len + 1 + (m++ > 0), v));
                                }
                                break;
                        }
                        if (l < n->min_len) {
                                n->min_len = l;
                                changed = true;
                        }
                }
        }
        /* min_depth likewise: nesting is capped at GRAMMAR_MAX_DEPTH, so the matcher only opens
         * a value whose shallowest completion still fits (no dead end at the cap) */
        for (uint32_t i = 0; i < g->n_nodes; i++)
                g->nodes[i].min_depth = INF_LEN;
        for (bool changed = true; changed;) {
                changed = false;
                for (uint32_t i = 0; i < g->n_nodes; i++) {
                        struct gnode *n = &g->nodes[i];
                        uint32_t d = INF_LEN;
                        switch (n->kind) {
                        case GK_ANY:
                        case GK_NUMBER:
                        case GK_INTEGER:
                        case GK_STRING:
                        case GK_LITERAL:
                        case GK_RAW:
                                d = 1;
                                break;
                        case GK_PARAMS:
                                d = 1;
                                for (uint32_t k = 0; k < n->n; k++)
                                        if (n->required >> k & 1)
                                                d = MAX(d, add_len(g->nodes[g->key_node[n->a + k]].min_depth, 1));
                                break;
                        case GK_CALL:
                                d = 2; /* the name's literal above the call */
                                for (uint32_t k = 0; k < g->nodes[n->items].n; k++)
                                        d = MAX(d, g->nodes[g->list[n->tools + k]].min_depth);
                                break;
                        case GK_ANYOF:
                                for (uint32_t k = 0; k < n->n; k++)
                                        d = MIN(d, g->nodes[g->list[n->a + k]].min_depth);
                                break;
                        case GK_REF:
                                d = g->nodes[n->target].min_depth;
                                break;
                        case GK_ARRAY:
                                d = n->min_items ? add_len(g->nodes[n->items].min_depth, 1) : 1;
                                break;
                        case GK_OBJECT:
                                d = 1;
                                for (uint32_t k = 0; k < n->n; k++) {
                                        uint32_t s = g->list[n->decl + k];
                                        uint32_t v = g->nodes[g->key_node[n->a + s]].min_depth;
                                        if (n->required >> k & 1)
                                                d = MAX(d, add_len(v, 1));
                                }
                                break;
                        }
                        if (d < n->min_depth) {
                                n->min_depth = d;
                                changed = true;
                        }
                }
        }
        g->max_min_len = 0;
        for (uint32_t i = 0; i < g->n_nodes; i++)
                if (g->nodes[i].min_len < INF_LEN)
                        g->max_min_len = MAX(g->max_min_len, g->nodes[i].min_len);
}

/* Every anyOf becomes the set of distinct values it can start as: nested anyOfs and the $refs
 * between them are expanded once here, an alternative that leads back to an anyOf already being
 * expanded adds nothing (its values are the ones the other alternatives give). The matcher then
 * forks once per alternative at a value's first byte, never through a chain of anyOfs
 * ({"anyOf":[{"$ref":"#"},{"$ref":"#"},…]} forked 3^16 ways before this). */
static int flatten_anyof(struct grammar *g, char *err, size_t err_size) {
        uint32_t n0 = g->n_nodes, total = 0;
        _cleanup_free_ uint32_t *mark = calloc(n0, sizeof *mark);
        _cleanup_free_ uint32_t *stack = malloc((size_t) n0 * sizeof *stack);
        _cleanup_free_ uint32_t *leaf = malloc(GRAMMAR_MAX_ALTERNATIVES * sizeof *leaf);
        if (!mark || !stack || !leaf)
                return -ENOMEM;
        for (uint32_t i = 0; i < n0; i++) {
                if (g->nodes[i].kind != GK_ANYOF)
                        continue;
                uint32_t sp = 0, nl = 0, stamp = i + 1;
                mark[i] = stamp;
                stack[sp++] = i;
                while (sp) {
                        const struct gnode *u = &g->nodes[stack[--sp]];
                        /* pushed last first, so the alternatives keep their written order */
                        for (uint32_t k = u->n; k-- > 0;) {
                                uint32_t v = resolve(g, (int32_t) g->list[u->a + k]);
                                if (mark[v] == stamp)
                                        continue;
                                mark[v] = stamp;
                                if (g->nodes[v].kind == GK_ANYOF) {
                                        stack[sp++] = v;
                                        continue;
                                }
                                if (nl == GRAMMAR_MAX_ALTERNATIVES) {
                                        snprintf(err, err_size, "anyOf: with its nested anyOf, type "
                                                 "lists and $refs expanded it has more than %d "
                                                 "alternatives, the most supported",
                                                 GRAMMAR_MAX_ALTERNATIVES);
                                        return -EINVAL;
                                }
                                leaf[nl++] = v;
                        }
                }
                if (nl == 0) {
                        snprintf(err, err_size, "anyOf: every alternative refers back to the anyOf "
                                 "itself, so no value satisfies it");
                        return -EINVAL;
                }
                total += nl;
                if (total > 64u * GRAMMAR_MAX_ALTERNATIVES) {
                        snprintf(err, err_size, "anyOf: the schema's anyOfs expand to more than %d "
                                 "alternatives in all, the most supported", 64 * GRAMMAR_MAX_ALTERNATIVES);
                        return -EINVAL;
                }
                g->nodes[i].a = g->n_list;
                g->nodes[i].n = nl;
                for (uint32_t k = 0; k < nl; k++)
                        if (list_push(g, leaf[k]) < 0)
                                return -ENOMEM;
        }
        return 0;
}

/* Does the literal hold a string value? */
static bool literal_has_string(const struct grammar *g, const struct gnode *n) {
        for (uint32_t k = 0; k < n->n; k++)
                if (g->lits[n->a + k].s[0] == '"')
                        return true;
        return false;
}

/* The values of literal nodes lit[0..n) as a native literal: a string as its raw characters,
 * anything else as its JSON text (the template's `tojson`), each followed by `</param_value>`. */
static int32_t native_literal(struct grammar *g, const uint32_t *lit, uint32_t n, const char *where,
                              char *err, size_t err_size) {
        uint32_t total = 0;
        for (uint32_t i = 0; i < n; i++)
                total += g->nodes[lit[i]].n;
        struct gstr *t = calloc(total, sizeof *t);
        if (!t)
                return -ENOMEM;
        uint32_t m = 0;
        int r = 0;
        for (uint32_t i = 0; i < n && r >= 0; i++)
                for (uint32_t k = 0; k < g->nodes[lit[i]].n && r >= 0; k++) {
                        const struct gstr *l = &g->lits[g->nodes[lit[i]].a + k];
                        _cleanup_(json_freep) struct json_value *v = NULL;
                        const char *text = l->s;
                        size_t len = l->len;
                        if (l->s[0] == '"') {
                                if (json_parse(l->s, l->len, "enum value", &v, NULL, 0) < 0) {
                                        r = -ENOMEM; /* our own json_dump: only memory can fail it */
                                        break;
                                }
                                text = json_string(v);
                                len = json_string_len(v);
                                if (strlen(text) != len || strstr(text, PARAM_VALUE_END)) {
                                        snprintf(err, err_size, "%s: the value %s cannot be written in the "
                                                 "model's tool-call syntax (it holds a NUL or '"
                                                 PARAM_VALUE_END "')", where, l->s);
                                        r = -EINVAL;
                                        break;
                                }
                        }
                        if (asprintf(&t[m].s, "%.*s" PARAM_VALUE_END, (int) len, text) < 0) {
                                t[m].s = NULL;
                                r = -ENOMEM;
                                break;
                        }
                        t[m++].len = (uint32_t) (len + strlen(PARAM_VALUE_END));
                }
        if (r < 0) {
                for (uint32_t k = 0; k < m; k++)
                        free(t[k].s);
                free(t);
                return r;
        }
        int32_t id = literal_node(g, t, m);
        free(t);
        if (id >= 0)
                g->nodes[id].native = true;
        return id;
}

/* A parameter's value in the native call: raw text where the schema allows any string (a string
 * value is written raw, so nothing tells "1" from 1; the output parser types it by the schema),
 * a native literal for enum / const (and an anyOf of them), its JSON value otherwise (then
 * `</param_value>`). An anyOf that mixes string literals with other schemas takes raw text. */
static int32_t native_value(struct grammar *g, int32_t id, const char *where, char *err, size_t err_size) {
        uint32_t r = resolve(g, id);
        const struct gnode n = g->nodes[r]; /* a copy: node_new moves the nodes */
        bool lits_only = true, strings = false;
        switch (n.kind) {
        case GK_STRING:
        case GK_ANY:
                return g->raw_value;
        case GK_LITERAL:
                return native_literal(g, &r, 1, where, err, err_size);
        case GK_ANYOF:
                for (uint32_t k = 0; k < n.n; k++) {
                        const struct gnode *b = &g->nodes[g->list[n.a + k]];
                        if (b->kind == GK_STRING || b->kind == GK_ANY)
                                return g->raw_value;
                        if (b->kind != GK_LITERAL)
                                lits_only = false;
                        else if (literal_has_string(g, b))
                                strings = true;
                }
                if (lits_only)
                        return native_literal(g, g->list + n.a, n.n, where, err, err_size);
                return strings ? g->raw_value : id;
        default:
                return id;
        }
}

/* The native call's values, once the anyOfs are flat (compile_tool built them as JSON nodes). */
static int native_values(struct grammar *g, char *err, size_t err_size) {
        if (g->nodes[g->root].kind != GK_CALL)
                return 0;
        const uint32_t names = (uint32_t) g->nodes[g->root].items, tools = g->nodes[g->root].tools;
        for (uint32_t t = 0; t < g->nodes[names].n; t++) {
                const uint32_t p = g->list[tools + t];
                const struct gstr *name = &g->lits[g->nodes[names].a + t];
                char where[512];
                for (uint32_t k = 0; k < g->nodes[p].n; k++) {
                        const struct gstr *key = &g->keys[g->nodes[p].a + k];
                        /* the key text between `<param_key>` and `</param_key>` */
                        size_t kl = key->len - strlen(PARAM_KEY PARAM_KEY_END PARAM_VALUE);
                        snprintf(where, sizeof where, "tool '%.*s' parameter '%.*s'", (int) name->len, name->s,
                                 (int) kl, key->s + strlen(PARAM_KEY));
                        int32_t v = native_value(g, g->key_node[g->nodes[p].a + k], where, err, err_size);
                        if (v < 0)
                                return v;
                        g->key_node[g->nodes[p].a + k] = v;
                }
                if (g->nodes[p].extra >= 0) {
                        snprintf(where, sizeof where, "tool '%.*s' additionalProperties", (int) name->len, name->s);
                        int32_t v = native_value(g, g->nodes[p].extra, where, err, err_size);
                        if (v < 0)
                                return v;
                        g->nodes[p].extra = v;
                }
        }
        return 0;
}

static int finish_grammar(struct grammar *g, char *err, size_t err_size) {
        for (uint32_t i = 0; i < g->n_nodes; i++)
                if (g->nodes[i].kind == GK_REF) {
                        int32_t t = (int32_t) i;
                        for (int k = 0; k < 64 && g->nodes[t].kind == GK_REF; k++)
                                t = g->nodes[t].target;
                        if (t < 0 || g->nodes[t].kind == GK_REF) {
                                snprintf(err, err_size, "$ref: a definition that is only a reference to itself");
                                return -EINVAL;
                        }
                }
        int r = flatten_anyof(g, err, err_size);
        if (r < 0 || (r = native_values(g, err, err_size)) < 0)
                return r;
        compute_min_len(g);
        if (g->nodes[g->root].min_len >= INF_LEN) {
                snprintf(err, err_size, "no finite JSON value satisfies this schema (a required "
                         "property or item refers back to itself)");
                return -EINVAL;
        }
        if (g->nodes[g->root].min_depth > GRAMMAR_MAX_DEPTH) {
                snprintf(err, err_size, "every value of this schema nests deeper than %d levels, "
                         "the most supported", GRAMMAR_MAX_DEPTH);
                return -EINVAL;
        }
        return 0;
}

static int compile_root(struct compiler *c, const struct json_value *s, const char *path) {
        c->root = s;
        /* "#" refers to the root: a ref node filled in after */
        c->root_node = node_new(c->g, GK_REF);
        if (c->root_node < 0)
                return c->root_node;
        int32_t r = compile_node(c, s, path);
        if (r < 0)
                return r;
        c->g->nodes[c->root_node].target = r;
        return r;
}

static int compile_schema(const char *json, size_t len, unsigned flags, struct grammar **ret, char *err,
                          size_t err_size) {
        _cleanup_(grammar_freep) struct grammar *g = NULL;
        _cleanup_(json_freep) struct json_value *s = NULL;
        int r;

        err[0] = 0;
        char why[512];
        if (json_parse(json, len, "json_schema", &s, why, sizeof why) < 0) {
                snprintf(err, err_size, "not valid JSON: %s", why);
                return -EINVAL;
        }
        if ((r = grammar_init(&g)) < 0)
                return r;
        struct compiler c = { .g = g, .err = err, .err_size = err_size, .lenient = flags & GRAMMAR_LENIENT };
        int32_t root = compile_root(&c, s, "");
        free(c.def_v);
        free(c.def_node);
        if (root < 0) {
                if (root == -ENOMEM)
                        snprintf(err, err_size, "out of memory");
                return root == -ENOMEM ? -ENOMEM : -EINVAL;
        }
        g->root = root;
        if ((r = finish_grammar(g, err, err_size)) < 0)
                return r;
        *ret = TAKE_PTR(g);
        return 0;
}

int grammar_compile_schema(const char *json, size_t len, struct grammar **ret, char *err, size_t err_size) {
        return compile_schema(json, len, 0, ret, err, err_size);
}

int grammar_compile_json_object(struct grammar **ret) {
        _cleanup_(grammar_freep) struct grammar *g = NULL;
        char err[64];
        int r = grammar_init(&g);
        if (r < 0)
                return r;
        g->root = N_ANY_OBJECT;
        if ((r = finish_grammar(g, err, sizeof err)) < 0)
                return r;
        *ret = TAKE_PTR(g);
        return 0;
}

/* Why a tool name cannot be written in the native call syntax, NULL if it can: the output parser
 * (chat/outparse.c) reads the name as the text before `<param_key>`, trimmed, without markup or a
 * line break, and a body starting with `{` as the JSON form. */
static const char *native_name_problem(const char *s) {
        size_t l = strlen(s);
        if (s[0] == '{')
                return "it starts with '{', which reads as the JSON form";
        if (s[0] == ' ' || s[l - 1] == ' ')
                return "it starts or ends with a space";
        for (size_t i = 0; i < l; i++)
                if (s[i] == '<' || s[i] == '>' || (uint8_t) s[i] < 0x20)
                        return "it holds '<', '>' or a control character";
        return NULL;
}

/* The GK_PARAMS node of one tool from its compiled arguments object (properties, or free keys):
 * keys as `<param_key>K</param_key><param_value>`, sorted; the values stay the properties' JSON
 * nodes until native_values() makes them native (the anyOfs must be flat first). */
static int32_t params_node(struct compiler *c, int32_t args, const char *path) {
        struct grammar *g = c->g;
        uint32_t r0 = resolve(g, args);
        /* a schema of any value (`true`): any arguments object */
        const struct gnode o = g->nodes[g->nodes[r0].kind == GK_ANY ? N_ANY_OBJECT : r0]; /* a copy: node_new moves the nodes */
        int32_t id = node_new(g, GK_PARAMS);
        if (id < 0 || o.n == 0) {
                if (id < 0 || o.extra < 0)
                        return id;
                /* free keys: raw text without '<', then the value of additionalProperties */
                int32_t rk = node_new(g, GK_RAW);
                if (rk < 0)
                        return rk;
                g->nodes[rk].a = 1;
                g->nodes[rk].min_items = 1;
                g->nodes[rk].native = true;
                g->nodes[id].items = rk;
                g->nodes[id].extra = o.extra;
                return id;
        }
        struct { struct gstr k; int32_t node; bool required; } tmp[GRAMMAR_MAX_PROPERTIES] = { 0 };
        int r = 0;
        for (uint32_t s = 0; s < o.n && r >= 0; s++) {
                _cleanup_(json_freep) struct json_value *kv = NULL;
                if (json_parse(g->keys[o.a + s].s, g->keys[o.a + s].len, "property name", &kv, NULL, 0) < 0) {
                        r = -ENOMEM; /* our own json_dump of a string: only memory can fail it */
                        break;
                }
                const char *k = json_string(kv);
                size_t kl = json_string_len(kv);
                if (kl == 0 || strlen(k) != kl || strstr(k, PARAM_KEY_END))
                        r = cerr(c, path, "property %s cannot be written in the model's tool-call syntax "
                                 "(an empty name, or one holding a NUL or '" PARAM_KEY_END "')",
                                 g->keys[o.a + s].s);
                else if (asprintf(&tmp[s].k.s, PARAM_KEY "%s" PARAM_KEY_END PARAM_VALUE, k) < 0) {
                        tmp[s].k.s = NULL;
                        r = -ENOMEM;
                } else {
                        tmp[s].k.len = (uint32_t) strlen(tmp[s].k.s);
                        tmp[s].node = g->key_node[o.a + s];
                }
        }
        for (uint32_t k = 0; k < o.n; k++)
                if (o.required >> k & 1)
                        tmp[g->list[o.decl + k]].required = true;
        /* sort (insertion: at most 64) */
        for (uint32_t i = 1; i < o.n && r >= 0; i++)
                for (uint32_t k = i; k > 0 && gstr_cmp(&tmp[k - 1].k, &tmp[k].k) > 0; k--) {
                        __typeof__(*tmp) x = tmp[k];
                        tmp[k] = tmp[k - 1];
                        tmp[k - 1] = x;
                }
        if (r >= 0 && (grow_array((void **) &g->keys, &g->cap_keys, g->n_keys + o.n, sizeof *g->keys) < 0 ||
                       !(g->key_node = realloc(g->key_node, (size_t) g->cap_keys * sizeof *g->key_node))))
                r = -ENOMEM;
        if (r < 0) {
                for (uint32_t s = 0; s < o.n; s++)
                        free(tmp[s].k.s);
                return r;
        }
        g->nodes[id].a = g->n_keys;
        g->nodes[id].n = o.n;
        for (uint32_t s = 0; s < o.n; s++) {
                g->keys[g->n_keys] = tmp[s].k;
                g->key_node[g->n_keys++] = tmp[s].node;
                if (tmp[s].required)
                        g->nodes[id].required |= 1ull << s;
        }
        return id;
}

/* answer: with GRAMMAR_OR_TOOL_CALLS, the JSON answer's schema (NULL: any object), compiled into
 * the same grammar as g->answer (already checked on its own: its errors name the schema). */
/* A tool marked strict (OpenAI's "strict": true, in `function` or beside it) */
static bool tool_marked_strict(const struct json_value *tv, const struct json_value *fn) {
        const struct json_value *st = json_object_get(fn, "strict") ? json_object_get(fn, "strict")
                                                                   : json_object_get(tv, "strict");
        return st && json_type(st) == JSON_BOOL && json_bool(st);
}

static int compile_tool(const char *tools_json, const char *name, const struct tokenizer *t, unsigned flags,
                        const char *answer, struct grammar **ret, char *err, size_t err_size) {
        _cleanup_(grammar_freep) struct grammar *g = NULL;
        _cleanup_(json_freep) struct json_value *tools = NULL;
        int r;

        err[0] = 0;
        if (!tools_json || !tools_json[0]) {
                snprintf(err, err_size, "the request has no tools (prompt.chat.tools_json), a tool "
                         "call cannot be forced");
                return -EINVAL;
        }
        char why[512];
        if (json_parse(tools_json, strlen(tools_json), "tools_json", &tools, why, sizeof why) < 0) {
                snprintf(err, err_size, "prompt.chat.tools_json is not valid JSON: %s", why);
                return -EINVAL;
        }
        if (json_type(tools) != JSON_ARRAY || json_count(tools) == 0) {
                snprintf(err, err_size, "prompt.chat.tools_json must be a non-empty array of tools");
                return -EINVAL;
        }
        int32_t open = tokenizer_special_id(t, TOKENIZER_SPECIAL_TOOL_CALL);
        int32_t close = tokenizer_special_id(t, TOKENIZER_SPECIAL_END_TOOL_CALL);
        if (open < 0 || close < 0) {
                snprintf(err, err_size, "this model's vocabulary has no <tool_call> / </tool_call> tokens");
                return -EINVAL;
        }
        if ((r = grammar_init(&g)) < 0)
                return r;
        /* a string value: raw text up to `</param_value>` */
        if ((g->raw_value = node_new(g, GK_RAW)) < 0)
                return g->raw_value;
        g->nodes[g->raw_value].native = true;
        struct compiler c = { .g = g, .err = err, .err_size = err_size, .lenient = flags & GRAMMAR_LENIENT };
        struct gstr names[256];
        int32_t args[256];
        uint32_t n = 0;
        bool found = false;
        size_t avail_len = 0;
        char avail[256] = "";
        for (size_t i = 0; i < json_count(tools); i++) {
                const struct json_value *tv = json_array_at(tools, i);
                const struct json_value *fn = json_object_get(tv, "function") ? json_object_get(tv, "function") : tv;
                const char *tn = json_string(json_object_get(fn, "name"));
                char path[64];
                if (!tn || !tn[0]) {
                        r = cerr(&c, "", "prompt.chat.tools_json[%zu]: no function name", i);
                        goto fail;
                }
                if (avail_len + strlen(tn) + 3 < sizeof avail)
                        avail_len += (size_t) snprintf(avail + avail_len, sizeof avail - avail_len, "%s%s",
                                                       avail_len ? ", " : "", tn);
                if (name && name[0] && !streq(name, tn))
                        continue;
                found = true;
                if (n == ELEMENTSOF(names)) {
                        r = cerr(&c, "", "more than %zu tools", ELEMENTSOF(names));
                        goto fail;
                }
                const char *bad = native_name_problem(tn);
                if (bad) {
                        r = cerr(&c, "", "tools[%zu]: the name '%s' cannot be written in the model's "
                                 "tool-call syntax: %s", i, tn, bad);
                        goto fail;
                }
                snprintf(path, sizeof path, "tools[%zu].parameters", i);
                const struct json_value *params = json_object_get(fn, "parameters");
                /* a tool marked strict (OpenAI's "strict": true) is held to its schema exactly:
                 * lenient or not, a keyword the mask cannot enforce is refused by name */
                bool strict = tool_marked_strict(tv, fn);
                /* beside a JSON answer, lenient is the answer's schema's: tools not marked strict
                 * are lenient, as under tool_choice auto */
                c.lenient = ((flags & GRAMMAR_LENIENT) || (flags & GRAMMAR_OR_TOOL_CALLS)) && !strict;
                if (strict)
                        snprintf(path, sizeof path, "tools[%zu].parameters (strict)", i);
                c.root = params;
                c.root_node = -1;
                int32_t a;
                if (!params) {
                        a = node_new(g, GK_OBJECT); /* no parameters: {} */
                } else {
                        a = compile_root(&c, params, path);
                        if (a >= 0 && json_type(params) == JSON_OBJECT) {
                                /* arguments are an object, whatever the schema says beyond that */
                                uint32_t rs = resolve(g, a);
                                if (g->nodes[rs].kind != GK_OBJECT && g->nodes[rs].kind != GK_ANY) {
                                        r = cerr(&c, path, "the parameters schema must describe an object");
                                        goto fail;
                                }
                                if (g->nodes[rs].kind == GK_ANY)
                                        a = N_ANY_OBJECT;
                        }
                }
                if (a >= 0)
                        a = params_node(&c, a, path);
                if (a < 0) {
                        r = a;
                        goto fail;
                }
                names[n].s = strdup(tn);
                if (!names[n].s) {
                        r = -ENOMEM;
                        goto fail;
                }
                names[n].len = (uint32_t) strlen(names[n].s);
                args[n++] = a;
        }
        if (!found) {
                r = cerr(&c, "", "tool '%s' is not among the request's tools (%s)", name, avail);
                goto fail;
        }
        free(c.def_v);
        free(c.def_node);
        c.def_v = NULL;
        c.def_node = NULL;
        c.n_defs = c.cap_defs = 0;
        if (flags & GRAMMAR_OR_TOOL_CALLS) {
                _cleanup_(json_freep) struct json_value *av = NULL;
                g->answer = N_ANY_OBJECT;
                if (answer && json_parse(answer, strlen(answer), "json_schema", &av, NULL, 0) < 0) {
                        r = cerr(&c, "", "constraint.json_schema: not valid JSON");
                        goto fail;
                }
                if (av) {
                        c.lenient = flags & GRAMMAR_LENIENT;
                        c.root_node = -1;
                        g->answer = compile_root(&c, av, "");
                        c.root = NULL;
                        free(c.def_v);
                        free(c.def_node);
                        c.def_v = NULL;
                        c.def_node = NULL;
                        if (g->answer < 0) {
                                r = g->answer;
                                goto fail;
                        }
                }
        }
        /* the name literal's sorted order decides which parameters go with which name */
        struct gstr sorted[256];
        uint32_t order[256];
        for (uint32_t i = 0; i < n; i++)
                order[i] = i;
        for (uint32_t i = 1; i < n; i++)
                for (uint32_t k = i; k > 0 && gstr_cmp(&names[order[k - 1]], &names[order[k]]) > 0; k--) {
                        uint32_t x = order[k];
                        order[k] = order[k - 1];
                        order[k - 1] = x;
                }
        for (uint32_t i = 0; i < n; i++)
                sorted[i] = names[order[i]];
        for (uint32_t i = 1; i < n; i++)
                if (gstr_cmp(&sorted[i - 1], &sorted[i]) == 0) {
                        r = cerr(&c, "", "prompt.chat.tools_json names '%s' twice", names[order[i]].s);
                        for (uint32_t k = 0; k < n; k++)
                                free(names[k].s);
                        return r;
                }
        int32_t name_node = literal_node(g, sorted, n);
        if (name_node < 0)
                return name_node;
        /* NAME, then that tool's parameters */
        int32_t call = node_new(g, GK_CALL);
        if (call < 0)
                return call;
        g->nodes[call].items = name_node;
        g->nodes[call].tools = g->n_list;
        for (uint32_t i = 0; i < n; i++)
                if (list_push(g, (uint32_t) args[order[i]]) < 0)
                        return -ENOMEM;
        g->root = call;
        g->pre[0] = open;
        g->n_pre = 1;
        g->post[0] = close;
        g->n_post = 1;
        if ((r = finish_grammar(g, err, err_size)) < 0)
                return r;
        *ret = TAKE_PTR(g);
        return 0;
fail:
        for (uint32_t k = 0; k < n; k++)
                free(names[k].s);
        free(c.def_v);
        free(c.def_node);
        if (r == -ENOMEM)
                snprintf(err, err_size, "out of memory");
        return r == -ENOMEM ? r : -EINVAL;
}

int grammar_tools_strict(const char *tools_json) {
        _cleanup_(json_freep) struct json_value *tools = NULL;
        char why[64];
        if (!tools_json || json_parse(tools_json, strlen(tools_json), "tools_json", &tools, why, sizeof why) < 0 ||
            json_type(tools) != JSON_ARRAY || json_count(tools) == 0)
                return -EINVAL;
        for (size_t i = 0; i < json_count(tools); i++) {
                const struct json_value *tv = json_array_at(tools, i);
                if (tool_marked_strict(tv, json_object_get(tv, "function") ? json_object_get(tv, "function") : tv))
                        return 1;
        }
        return 0;
}

int grammar_compile_tool(const char *tools_json, const char *name, const struct tokenizer *t,
                         struct grammar **ret, char *err, size_t err_size) {
        return compile_tool(tools_json, name, t, 0, NULL, ret, err, err_size);
}

int grammar_compile_constraint(enum grammar_kind kind, const char *schema, const char *tools_json,
                               const char *tool_name, const struct tokenizer *t,
                               struct grammar **ret, char *err, size_t err_size) {
        return grammar_compile_constraint_flags(kind, schema, tools_json, tool_name, t, 0, ret, err, err_size);
}

int grammar_compile_constraint_flags(enum grammar_kind kind, const char *schema, const char *tools_json,
                                     const char *tool_name, const struct tokenizer *t, unsigned flags,
                                     struct grammar **ret, char *err, size_t err_size) {
        char msg[512];
        int r;
        if ((flags & GRAMMAR_OR_TOOL_CALLS) && (kind == GRAMMAR_JSON_OBJECT || kind == GRAMMAR_JSON_SCHEMA)) {
                /* the answer's schema on its own first, for its errors; then with the tools */
                struct grammar *alone = NULL;
                r = grammar_compile_constraint_flags(kind, schema, NULL, NULL, t, flags & ~GRAMMAR_OR_TOOL_CALLS,
                                                     &alone, err, err_size);
                grammar_free(alone);
                if (r < 0)
                        return r;
                r = compile_tool(tools_json, NULL, t, flags, kind == GRAMMAR_JSON_SCHEMA ? schema : NULL, ret, msg,
                                 sizeof msg);
                if (r < 0)
                        snprintf(err, err_size, "constraint.or_tool_calls: %s", msg);
                return r;
        }
        switch (kind) {
        case GRAMMAR_JSON_OBJECT:
                r = grammar_compile_json_object(ret);
                if (r < 0)
                        snprintf(err, err_size, "constraint.json_object: out of memory");
                return r;
        case GRAMMAR_JSON_SCHEMA:
                if (!schema || !schema[0]) {
                        snprintf(err, err_size, "constraint.json_schema: empty, a JSON Schema expected");
                        return -EINVAL;
                }
                r = compile_schema(schema, strlen(schema), flags, ret, msg, sizeof msg);
                if (r < 0)
                        snprintf(err, err_size, "constraint.json_schema: %s", msg);
                return r;
        case GRAMMAR_TOOL:
        case GRAMMAR_TOOL_CALLS:
                r = compile_tool(tools_json, tool_name, t, flags & ~GRAMMAR_OR_TOOL_CALLS, NULL, ret, msg, sizeof msg);
                if (r < 0)
                        snprintf(err, err_size, "constraint.%s: %s", kind == GRAMMAR_TOOL ? "tool" : "tool_calls", msg);
                else
                        (*ret)->lazy = kind == GRAMMAR_TOOL_CALLS;
                return r;
        }
        snprintf(err, err_size, "constraint: none of json_object, json_schema, tool, tool_calls is set");
        return -EINVAL;
}

/* ---- matcher threads ------------------------------------------------------------------------- */

enum {
        ST_START = 0, /* the value has not begun (whitespace allowed) */
        /* string */
        S_BODY = 1, S_ESC, S_U,
        /* number */
        NB_MINUS = 1, NB_ZERO, NB_INT, NB_DOT, NB_FRAC, NB_E, NB_ESIGN, NB_EXP,
        /* literal */
        L_IN = 1,
        /* object */
        O_OPEN = 1, O_KEY, O_FKEY, O_COLON, O_VAL, O_AFTER, O_COMMA,
        /* array */
        A_OPEN = 1, A_VAL, A_AFTER, A_COMMA,
        /* native call: the name's literal is open above it */
        C_NAME = 1,
        /* native call's parameters: before a key (or the end), inside a key, inside `<param_key>`
         * of a free key, a free key's raw text open above, a free key's value next, a value open
         * above, inside the `</param_value>` after a JSON value */
        P_NEXT = 1, P_KEY, P_FKEY_OPEN, P_FKEY, P_FVAL, P_VAL, P_VEND,
        /* raw text */
        R_BODY = 1,
};

#define MAX_INT_DIGITS 15 /* also INT_DIGITS_BOUND */
#define MAX_FRAC_DIGITS 16
#define MAX_EXP_DIGITS 3

struct gframe {
        uint32_t node;
        uint8_t st;
        uint8_t need;   /* string: UTF-8 continuation bytes still due */
        uint8_t lo8, hi8; /* string: range of the next continuation byte; \u: flags */
        uint16_t pos;   /* literal / key: bytes matched; number: digits in the part; \u digits;
                         * raw, params: bytes of the end marker / markup matched */
        uint16_t lo, hi; /* literal / key: candidate range (sorted index); object: property */
        uint32_t n;     /* array: items; raw with a minimum: 1 once it has text */
        uint64_t seen;  /* object, params: properties written (sorted index) */
};

struct gthread {
        uint8_t depth, ws, done;
        uint8_t forks; /* anyOf forks within the current byte (0 between bytes) */
        struct gframe f[GRAMMAR_MAX_DEPTH];
};

#define THREAD_BYTES(t) (offsetof(struct gthread, f) + (size_t) (t)->depth * sizeof(struct gframe))

struct tset {
        uint32_t n;
        struct gthread t[GRAMMAR_MAX_THREADS];
};

static inline bool is_ws(uint8_t c) {
        return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static void tset_add(struct tset *o, const struct gthread *t) {
        size_t b = THREAD_BYTES(t);
        for (uint32_t i = 0; i < o->n; i++)
                if (o->t[i].depth == t->depth && memcmp(&o->t[i], t, b) == 0)
                        return;
        if (o->n == GRAMMAR_MAX_THREADS)
                return; /* more alternatives than we follow: this one is dropped */
        memcpy(&o->t[o->n++], t, b);
}

static bool push(const struct grammar *g, struct gthread *t, int32_t node) {
        if (t->depth == GRAMMAR_MAX_DEPTH)
                return false;
        struct gframe *f = &t->f[t->depth++];
        memset(f, 0, sizeof *f);
        f->node = resolve(g, node);
        return true;
}

/* The top frame's value is complete: pop it and tell the parent. */
static void pop_done(const struct grammar *g, struct gthread *t) {
        struct gframe child = t->f[--t->depth];
        if (t->depth == 0) {
                t->done = 1;
                return;
        }
        struct gframe *p = &t->f[t->depth - 1];
        const struct gnode *pn = &g->nodes[p->node];
        if (pn->kind == GK_OBJECT) {
                p->st = p->st == O_FKEY ? O_COLON : O_AFTER;
        } else if (pn->kind == GK_ARRAY) {
                p->n++;
                p->st = A_AFTER;
        } else if (pn->kind == GK_CALL) {
                /* the name: the frame goes on as that tool's parameters */
                p->node = g->list[pn->tools + child.lo];
                p->st = P_NEXT;
        } else if (pn->kind == GK_PARAMS) {
                if (p->st == P_FKEY)
                        p->st = P_FVAL;
                else
                        p->st = g->nodes[child.node].native ? P_NEXT : P_VEND;
                p->pos = 0;
        }
}

/* Narrow the sorted candidates strs[lo..hi) (all sharing [0, pos)) to those with byte c at pos.
 * Returns false if none. Candidates of length pos sort first and never match. */
static bool narrow(const struct gstr *strs, uint16_t *lo, uint16_t *hi, uint16_t pos, uint8_t c) {
        uint32_t a = *lo, b = *hi;
        /* lower bound of c */
        uint32_t l = a, h = b;
        while (l < h) {
                uint32_t m = (l + h) / 2;
                int x = strs[m].len > pos ? (uint8_t) strs[m].s[pos] : -1;
                if (x < c)
                        l = m + 1;
                else
                        h = m;
        }
        uint32_t first = l;
        h = b;
        while (l < h) {
                uint32_t m = (l + h) / 2;
                int x = strs[m].len > pos ? (uint8_t) strs[m].s[pos] : -1;
                if (x <= c)
                        l = m + 1;
                else
                        h = m;
        }
        if (first == l)
                return false;
        *lo = (uint16_t) first;
        *hi = (uint16_t) l;
        return true;
}

/* A value of node id can be opened with `depth` frames open below it. */
static inline bool fits(const struct grammar *g, uint32_t depth, int32_t id) {
        return depth + g->nodes[id].min_depth <= GRAMMAR_MAX_DEPTH;
}

/* Some property of keys[lo..hi) is still to be written and its value fits (object frame at
 * depth - 1: its values open at depth). */
static bool obj_any_unseen(const struct grammar *g, const struct gnode *n, const struct gframe *f,
                           uint32_t depth, uint32_t lo, uint32_t hi) {
        for (uint32_t k = lo; k < hi; k++)
                if (!(f->seen >> k & 1) && fits(g, depth, g->key_node[n->a + k]))
                        return true;
        return false;
}

static bool obj_required_done(const struct grammar *g, const struct gnode *n, const struct gframe *f) {
        for (uint32_t k = 0; k < n->n; k++)
                if ((n->required >> k & 1) && !(f->seen >> g->list[n->decl + k] & 1))
                        return false;
        return true;
}

/* Begin a key at its opening quote. */
static bool obj_key_begin(const struct grammar *g, struct gthread *t, struct gframe *f, const struct gnode *n) {
        if (n->n == 0) {
                if (n->extra < 0 || !fits(g, t->depth, n->extra) || !push(g, t, N_STRING))
                        return false;
                f = &t->f[t->depth - 2];
                f->st = O_FKEY;
                t->f[t->depth - 1].st = S_BODY;
                return true;
        }
        f->lo = 0;
        f->hi = (uint16_t) n->n;
        f->pos = 1; /* every key starts with its quote */
        f->st = O_KEY;
        return obj_any_unseen(g, n, f, t->depth, f->lo, f->hi);
}

/* What one byte did to a thread: refused, taken, or to be given to the new top frame (a number
 * or literal ended before it; an array item begins with it). */
enum step_result { STEP_DEAD, STEP_LIVE, STEP_AGAIN };

/* Text byte c in a string or raw frame at a character boundary: ASCII, or the lead byte of a
 * valid UTF-8 character (its continuation bytes are then due: need, lo8..hi8). */
static enum step_result utf8_step(struct gframe *f, uint8_t c) {
        if (c < 0x80)
                return STEP_LIVE;
        f->lo8 = 0x80;
        f->hi8 = 0xbf;
        if (c >= 0xc2 && c <= 0xdf)
                f->need = 1;
        else if (c >= 0xe0 && c <= 0xef) {
                f->need = 2;
                if (c == 0xe0)
                        f->lo8 = 0xa0;
                if (c == 0xed)
                        f->hi8 = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
                f->need = 3;
                if (c == 0xf0)
                        f->lo8 = 0x90;
                if (c == 0xf4)
                        f->hi8 = 0x8f;
        } else
                return STEP_DEAD;
        return STEP_LIVE;
}

/* A continuation byte of the character begun (string and raw frames). */
static enum step_result utf8_continue(struct gframe *f, uint8_t c) {
        if (c < f->lo8 || c > f->hi8)
                return STEP_DEAD;
        f->need--;
        f->lo8 = 0x80;
        f->hi8 = 0xbf;
        return STEP_LIVE;
}

static enum step_result step_string(const struct grammar *g, struct gthread *t, struct gframe *f,
                                   const struct gnode *n, uint8_t c) {
        switch (f->st) {
        case ST_START:
                if (c != '"')
                        return STEP_DEAD;
                f->st = S_BODY;
                return STEP_LIVE;
        case S_BODY:
                if (f->need)
                        return utf8_continue(f, c);
                if (c == '"') {
                        pop_done(g, t);
                        return STEP_LIVE;
                }
                if (c == '\\') {
                        f->st = S_ESC;
                        return STEP_LIVE;
                }
                if (c < 0x20)
                        return STEP_DEAD;
                return utf8_step(f, c);
        case S_ESC:
                if (c == 'u') {
                        f->st = S_U;
                        f->pos = 0;
                        f->lo8 = 2; /* bit 1: all digits zero so far */
                        return STEP_LIVE;
                }
                if (!strchr("\"\\/bfnrt", c) || !c)
                        return STEP_DEAD;
                f->st = S_BODY;
                return STEP_LIVE;
        case S_U: {
                bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
                if (!hex)
                        return STEP_DEAD;
                if (f->pos == 0 && (c == 'd' || c == 'D'))
                        f->lo8 |= 1;
                if (f->pos == 1 && (f->lo8 & 1) && !(c >= '0' && c <= '7'))
                        return STEP_DEAD; /* a surrogate */
                if (c != '0')
                        f->lo8 &= (uint8_t) ~2;
                if (++f->pos == 4) {
                        if (f->lo8 & 2)
                                return STEP_DEAD; /* \u0000 */
                        f->st = S_BODY;
                        f->lo8 = 0;
                        f->pos = 0;
                }
                return STEP_LIVE;
        }
        }
        return STEP_DEAD;
}

static enum step_result step_number(const struct grammar *g, struct gthread *t, struct gframe *f,
                                   const struct gnode *n, uint8_t c) {
        bool dig = c >= '0' && c <= '9', real = n->kind == GK_NUMBER;
        switch (f->st) {
        case ST_START:
                if (c == '-')
                        f->st = NB_MINUS;
                else if (c == '0')
                        f->st = NB_ZERO;
                else if (dig) {
                        f->st = NB_INT;
                        f->pos = 1;
                } else
                        return STEP_DEAD;
                return STEP_LIVE;
        case NB_MINUS:
                if (c == '0')
                        f->st = NB_ZERO;
                else if (dig) {
                        f->st = NB_INT;
                        f->pos = 1;
                } else
                        return STEP_DEAD;
                return STEP_LIVE;
        case NB_ZERO:
        case NB_INT:
                if (dig && f->st == NB_INT && f->pos < MAX_INT_DIGITS) {
                        f->pos++;
                        return STEP_LIVE;
                }
                if (dig)
                        return STEP_DEAD;
                if (real && c == '.') {
                        f->st = NB_DOT;
                        return STEP_LIVE;
                }
                if (real && (c == 'e' || c == 'E')) {
                        f->st = NB_E;
                        return STEP_LIVE;
                }
                break; /* ends: the parent takes c */
        case NB_DOT:
                if (!dig)
                        return STEP_DEAD;
                f->st = NB_FRAC;
                f->pos = 1;
                return STEP_LIVE;
        case NB_FRAC:
                if (dig) {
                        if (f->pos >= MAX_FRAC_DIGITS)
                                return STEP_DEAD;
                        f->pos++;
                        return STEP_LIVE;
                }
                if (c == 'e' || c == 'E') {
                        f->st = NB_E;
                        return STEP_LIVE;
                }
                break;
        case NB_E:
                if (c == '+' || c == '-') {
                        f->st = NB_ESIGN;
                        return STEP_LIVE;
                }
                /* fall through */
        case NB_ESIGN:
                if (!dig)
                        return STEP_DEAD;
                f->st = NB_EXP;
                f->pos = 1;
                return STEP_LIVE;
        case NB_EXP:
                if (dig) {
                        if (f->pos >= MAX_EXP_DIGITS)
                                return STEP_DEAD;
                        f->pos++;
                        return STEP_LIVE;
                }
                break;
        default:
                return STEP_DEAD;
        }
        pop_done(g, t); /* the number ended before c */
        return STEP_AGAIN;
}

static enum step_result step_literal(const struct grammar *g, struct gthread *t, struct gframe *f,
                                   const struct gnode *n, uint8_t c) {
        const struct gstr *L = g->lits + n->a;
        if (f->st == ST_START) {
                f->st = L_IN;
                f->lo = 0;
                f->hi = (uint16_t) n->n;
                f->pos = 0;
        }
        uint16_t lo = f->lo, hi = f->hi;
        if (narrow(L, &lo, &hi, f->pos, c)) {
                f->lo = lo;
                f->hi = hi;
                f->pos++;
                /* complete and nothing longer: done now */
                if (hi - lo == 1 && L[lo].len == f->pos)
                        pop_done(g, t);
                return STEP_LIVE;
        }
        if (L[f->lo].len != f->pos)
                return STEP_DEAD;
        f->hi = f->lo + 1; /* ends as the shortest candidate */
        pop_done(g, t);
        return STEP_AGAIN;
}

/* Whitespace between a value's tokens (or before one): at most GRAMMAR_MAX_WS bytes in a row. */
static enum step_result take_ws(struct gthread *t) {
        if (t->ws >= GRAMMAR_MAX_WS)
                return STEP_DEAD;
        t->ws++;
        return STEP_LIVE;
}

static enum step_result step_object(const struct grammar *g, struct gthread *t, struct gframe *f,
                                   const struct gnode *n, uint8_t c) {
        bool ws = is_ws(c);
        switch (f->st) {
        case ST_START:
                if (c != '{')
                        return STEP_DEAD;
                f->st = O_OPEN;
                return STEP_LIVE;
        case O_OPEN:
        case O_AFTER:
        case O_COMMA:
                if (ws)
                        return take_ws(t);
                if (c == '"' && f->st != O_AFTER)
                        return obj_key_begin(g, t, f, n) ? STEP_LIVE : STEP_DEAD;
                if (c == '}' && f->st != O_COMMA) {
                        if (n->n && !obj_required_done(g, n, f))
                                return STEP_DEAD;
                        pop_done(g, t);
                        return STEP_LIVE;
                }
                if (c == ',' && f->st == O_AFTER) {
                        /* only when a property can follow */
                        if (n->n ? !obj_any_unseen(g, n, f, t->depth, 0, n->n) : !fits(g, t->depth, n->extra))
                                return STEP_DEAD;
                        f->st = O_COMMA;
                        return STEP_LIVE;
                }
                return STEP_DEAD;
        case O_KEY: {
                uint16_t lo = f->lo, hi = f->hi;
                if (!narrow(g->keys + n->a, &lo, &hi, f->pos, c) ||
                    !obj_any_unseen(g, n, f, t->depth, lo, hi))
                        return STEP_DEAD;
                f->lo = lo;
                f->hi = hi;
                f->pos++;
                if (c == '"' && g->keys[n->a + lo].len == f->pos) {
                        f->seen |= 1ull << lo;
                        f->st = O_COLON;
                        f->pos = 0;
                }
                return STEP_LIVE;
        }
        case O_COLON:
                if (ws)
                        return take_ws(t);
                if (c != ':')
                        return STEP_DEAD;
                /* the value: the property's or a free key's */
                int32_t vn = n->n ? g->key_node[n->a + f->lo] : n->extra;
                f->st = O_VAL;
                return push(g, t, vn) ? STEP_LIVE : STEP_DEAD;
        default:
                return STEP_DEAD;
        }
}

static enum step_result step_array(const struct grammar *g, struct gthread *t, struct gframe *f,
                                   const struct gnode *n, uint8_t c) {
        bool ws = is_ws(c);
        switch (f->st) {
        case ST_START:
                if (c != '[')
                        return STEP_DEAD;
                f->st = A_OPEN;
                return STEP_LIVE;
        case A_OPEN:
        case A_AFTER:
        case A_COMMA:
                if (ws)
                        return take_ws(t);
                if (c == ']' && f->st != A_COMMA) {
                        if (f->n < n->min_items)
                                return STEP_DEAD;
                        pop_done(g, t);
                        return STEP_LIVE;
                }
                if (c == ',' && f->st == A_AFTER) {
                        if (f->n >= n->max_items || !fits(g, t->depth, n->items))
                                return STEP_DEAD;
                        f->st = A_COMMA;
                        return STEP_LIVE;
                }
                if (f->st == A_AFTER || f->n >= n->max_items || !fits(g, t->depth, n->items))
                        return STEP_DEAD;
                f->st = A_VAL;
                if (!push(g, t, n->items))
                        return STEP_DEAD;
                return STEP_AGAIN; /* the item takes c */
        default:
                return STEP_DEAD;
        }
}

/* Raw text (valid UTF-8, no NUL) up to its end marker, which ends the frame. A value's text may
 * hold '<' (the marker's only '<' is its first byte, so a '<' that does not go on into the marker
 * was text); a free key's may not. */
static enum step_result step_raw(const struct grammar *g, struct gthread *t, struct gframe *f,
                                 const struct gnode *n, uint8_t c) {
        const char *end = RAW_END[n->a];
        f->st = R_BODY;
        if (f->need)
                return utf8_continue(f, c);
        if (f->pos) {
                if (c == (uint8_t) end[f->pos]) {
                        if (!end[++f->pos])
                                pop_done(g, t);
                        return STEP_LIVE;
                }
                if (n->a)
                        return STEP_DEAD;
                f->pos = 0; /* what matched was text; c is taken afresh */
                f->n = n->min_items > 0;
        }
        if (c == '<') {
                if (f->n < n->min_items)
                        return STEP_DEAD;
                f->pos = 1;
                return STEP_LIVE;
        }
        if (c == 0)
                return STEP_DEAD;
        f->n = n->min_items > 0; /* counted only where a minimum needs it: text keeps the state */
        return utf8_step(f, c);
}

/* The native call before its name: the name's literal takes the byte. */
static enum step_result step_call(const struct grammar *g, struct gthread *t, struct gframe *f,
                                  const struct gnode *n, uint8_t c) {
        if (f->st != ST_START)
                return STEP_DEAD;
        f->st = C_NAME;
        return push(g, t, n->items) ? STEP_AGAIN : STEP_DEAD;
}

/* Markup byte c at position f->pos of text: STEP_LIVE, and true in *done at its last byte. */
static enum step_result markup_byte(struct gframe *f, const char *text, uint8_t c, bool *done) {
        if (c != (uint8_t) text[f->pos])
                return STEP_DEAD;
        *done = !text[++f->pos];
        return STEP_LIVE;
}

/* A tool's parameters: `<param_key>K</param_key><param_value>` (a listed key once each, or any
 * free key), the value, again, until the call closes (grammar_matcher_can_end: every required
 * key written). */
static enum step_result step_params(const struct grammar *g, struct gthread *t, struct gframe *f,
                                    const struct gnode *n, uint8_t c) {
        bool done = false;
        switch (f->st) {
        case P_NEXT:
                if (!n->n) {
                        if (n->extra < 0 || !fits(g, t->depth, n->extra) || c != '<')
                                return STEP_DEAD;
                        f->st = P_FKEY_OPEN;
                        f->pos = 1;
                        return STEP_LIVE;
                }
                f->st = P_KEY;
                f->lo = 0;
                f->hi = (uint16_t) n->n;
                f->pos = 0; /* c is the key's first byte */
                /* fall through */
        case P_KEY: {
                uint16_t lo = f->lo, hi = f->hi;
                if (!narrow(g->keys + n->a, &lo, &hi, f->pos, c) || !obj_any_unseen(g, n, f, t->depth, lo, hi))
                        return STEP_DEAD;
                f->lo = lo;
                f->hi = hi;
                /* the keys end in the same markup, so none is a prefix of another */
                if (g->keys[n->a + lo].len != ++f->pos)
                        return STEP_LIVE;
                f->seen |= 1ull << lo;
                f->st = P_VAL;
                return push(g, t, g->key_node[n->a + lo]) ? STEP_LIVE : STEP_DEAD;
        }
        case P_FKEY_OPEN:
                if (markup_byte(f, PARAM_KEY, c, &done) == STEP_DEAD)
                        return STEP_DEAD;
                if (done) {
                        f->st = P_FKEY;
                        return push(g, t, n->items) ? STEP_LIVE : STEP_DEAD;
                }
                return STEP_LIVE;
        case P_FVAL:
                f->st = P_VAL;
                return push(g, t, n->extra) ? STEP_AGAIN : STEP_DEAD;
        case P_VEND:
                if (markup_byte(f, PARAM_VALUE_END, c, &done) == STEP_DEAD)
                        return STEP_DEAD;
                if (done) {
                        f->st = P_NEXT;
                        f->pos = 0;
                }
                return STEP_LIVE;
        default:
                return STEP_DEAD;
        }
}

static void feed(const struct grammar *g, struct gthread *t, uint8_t c, struct tset *out);

/* One byte for one thread. Returns true if t lives on (the caller keeps it); forks add their own
 * threads to out and return false. */
static bool step(const struct grammar *g, struct gthread *t, uint8_t c, struct tset *out) {
        for (;;) {
                if (t->done)
                        return false;
                struct gframe *f = &t->f[t->depth - 1];
                const struct gnode *n = &g->nodes[f->node];
                bool ws = is_ws(c);

                /* whitespace before a JSON value or the call's name; raw text keeps its own */
                if (f->st == ST_START && ws && !n->native)
                        return take_ws(t) == STEP_LIVE;
                if (!ws)
                        t->ws = 0;
                enum step_result r;
                switch (n->kind) {
                case GK_ANY:
                        f->node = c == '{' ? N_ANY_OBJECT : c == '[' ? N_ANY_ARRAY : c == '"' ? N_STRING
                                : c == '-' || (c >= '0' && c <= '9') ? N_NUMBER : N_TFN;
                        continue;
                case GK_ANYOF: {
                        struct gthread w;
                        /* an anyOf that is its own branch ({"anyOf":[{"$ref":"#"},…]}) */
                        if (t->forks >= 16)
                                return false;
                        for (uint32_t k = 0; k < n->n; k++) {
                                if (!fits(g, t->depth - 1u, (int32_t) g->list[n->a + k]))
                                        continue; /* nests too deep here */
                                memcpy(&w, t, THREAD_BYTES(t));
                                w.forks++;
                                w.f[w.depth - 1].node = resolve(g, (int32_t) g->list[n->a + k]);
                                feed(g, &w, c, out);
                        }
                        return false;
                }
                case GK_STRING:
                        r = step_string(g, t, f, n, c);
                        break;
                case GK_NUMBER:
                case GK_INTEGER:
                        r = step_number(g, t, f, n, c);
                        break;
                case GK_LITERAL:
                        r = step_literal(g, t, f, n, c);
                        break;
                case GK_OBJECT:
                        r = step_object(g, t, f, n, c);
                        break;
                case GK_ARRAY:
                        r = step_array(g, t, f, n, c);
                        break;
                case GK_CALL:
                        r = step_call(g, t, f, n, c);
                        break;
                case GK_PARAMS:
                        r = step_params(g, t, f, n, c);
                        break;
                case GK_RAW:
                        r = step_raw(g, t, f, n, c);
                        break;
                default:
                        return false;
                }
                if (r != STEP_AGAIN)
                        return r == STEP_LIVE;
        }
}

static void feed(const struct grammar *g, struct gthread *t, uint8_t c, struct tset *out) {
        if (step(g, t, c, out)) {
                t->forks = 0;
                tset_add(out, t);
        }
}

static void tset_feed(const struct grammar *g, const struct tset *in, uint8_t c, struct tset *out) {
        struct gthread w;
        out->n = 0;
        for (uint32_t i = 0; i < in->n; i++) {
                memcpy(&w, &in->t[i], THREAD_BYTES(&in->t[i]));
                feed(g, &w, c, out);
        }
}

/* The value of this thread can end now (EOS / `</tool_call>` may follow). */
static bool thread_can_end(const struct grammar *g, const struct gthread *t) {
        if (t->done)
                return true;
        const struct gframe *f = &t->f[0];
        const struct gnode *n = &g->nodes[f->node];
        if (n->kind == GK_CALL && t->depth == 2) {
                /* a whole name that a longer one could still continue, of a tool that needs no
                 * parameter */
                const struct gframe *nf = &t->f[1];
                return nf->st == L_IN && g->lits[g->nodes[nf->node].a + nf->lo].len == nf->pos &&
                       g->nodes[g->list[n->tools + nf->lo]].required == 0;
        }
        if (t->depth != 1)
                return false;
        if (n->kind == GK_PARAMS)
                return f->st == P_NEXT && (n->required & ~f->seen) == 0;
        if (n->kind == GK_NUMBER || n->kind == GK_INTEGER)
                return f->st == NB_ZERO || f->st == NB_INT || f->st == NB_FRAC || f->st == NB_EXP;
        if (n->kind == GK_LITERAL)
                return f->st == L_IN && g->lits[n->a + f->lo].len == f->pos;
        return false;
}

/* ---- shortest completion --------------------------------------------------------------------- */

struct sbuf {
        char *p;
        size_t n, cap;
        bool oom;
};

static void sb_put(struct sbuf *b, const char *s, size_t n) {
        if (b->oom)
                return;
        if (b->n + n + 1 > b->cap) {
                size_t cap = MAX(b->cap * 2, b->n + n + 64);
                char *q = realloc(b->p, cap);
                if (!q) {
                        b->oom = true;
                        return;
                }
                b->p = q;
                b->cap = cap;
        }
        memcpy(b->p + b->n, s, n);
        b->n += n;
        b->p[b->n] = 0;
}

/* text from byte `from` on (the rest of markup begun) */
static void sb_rest(struct sbuf *b, const char *text, size_t from) {
        sb_put(b, &text[from], strlen(text) - from);
}

static void emit_min(const struct grammar *g, int32_t id, struct sbuf *b, unsigned depth);

static void emit_prop(const struct grammar *g, const struct gnode *n, uint32_t s, struct sbuf *b,
                      unsigned depth) {
        sb_put(b, g->keys[n->a + s].s, g->keys[n->a + s].len);
        sb_put(b, ":", 1);
        emit_min(g, g->key_node[n->a + s], b, depth + 1);
}

/* Object from state: properties still required (seen given), then `}`; `first` = no comma
 * before the next property. */
static void emit_obj_rest(const struct grammar *g, const struct gnode *n, uint64_t seen, bool first,
                          struct sbuf *b, unsigned depth) {
        for (uint32_t k = 0; k < n->n; k++) {
                uint32_t s = g->list[n->decl + k];
                if (!(n->required >> k & 1) || (seen >> s & 1))
                        continue;
                if (!first)
                        sb_put(b, ",", 1);
                first = false;
                emit_prop(g, n, s, b, depth);
        }
        sb_put(b, "}", 1);
}

/* A native parameter's shortest value, with `</param_value>` after a JSON one. */
static void emit_value(const struct grammar *g, int32_t id, struct sbuf *b, unsigned depth) {
        emit_min(g, id, b, depth + 1);
        if (!g->nodes[resolve(g, id)].native)
                sb_put(b, PARAM_VALUE_END, strlen(PARAM_VALUE_END));
}

/* A native call's parameters from state: the required keys not yet written, with values. */
static void emit_params_rest(const struct grammar *g, const struct gnode *n, uint64_t seen, struct sbuf *b,
                             unsigned depth) {
        for (uint32_t k = 0; k < n->n; k++)
                if ((n->required >> k & 1) && !(seen >> k & 1)) {
                        sb_put(b, g->keys[n->a + k].s, g->keys[n->a + k].len);
                        emit_value(g, g->key_node[n->a + k], b, depth);
                }
}

/* The shortest of the literal's candidates lo..hi (the first of equals). */
static uint32_t literal_best(const struct grammar *g, const struct gnode *n, uint32_t lo, uint32_t hi) {
        uint32_t best = lo;
        for (uint32_t k = lo; k < hi; k++)
                if (g->lits[n->a + k].len < g->lits[n->a + best].len)
                        best = k;
        return best;
}

static void emit_min(const struct grammar *g, int32_t id, struct sbuf *b, unsigned depth) {
        const struct gnode *n = &g->nodes[resolve(g, id)];
        if (depth > 2 * GRAMMAR_MAX_DEPTH)
                return;
        switch (n->kind) {
        case GK_ANY:
        case GK_NUMBER:
        case GK_INTEGER:
                sb_put(b, "0", 1);
                return;
        case GK_STRING:
                sb_put(b, "\"\"", 2);
                return;
        case GK_LITERAL: {
                uint32_t best = literal_best(g, n, 0, n->n);
                sb_put(b, g->lits[n->a + best].s, g->lits[n->a + best].len);
                return;
        }
        case GK_RAW:
                if (n->min_items)
                        sb_put(b, "a", 1);
                sb_put(b, RAW_END[n->a], strlen(RAW_END[n->a]));
                return;
        case GK_PARAMS:
                emit_params_rest(g, n, 0, b, depth);
                return;
        case GK_CALL: {
                /* the tool whose call is shortest */
                const struct gnode *names = &g->nodes[n->items];
                uint32_t best = 0, bl = INF_LEN;
                for (uint32_t k = 0; k < names->n; k++) {
                        uint32_t l = add_len(g->lits[names->a + k].len, g->nodes[g->list[n->tools + k]].min_len);
                        if (l < bl) {
                                bl = l;
                                best = k;
                        }
                }
                sb_put(b, g->lits[names->a + best].s, g->lits[names->a + best].len);
                emit_min(g, (int32_t) g->list[n->tools + best], b, depth + 1);
                return;
        }
        case GK_ANYOF:
                /* the branch that set min_len: a branch as short that leads back here (an anyOf
                 * holding a $ref to itself) would never end */
                emit_min(g, (int32_t) n->best, b, depth + 1);
                return;
        case GK_ARRAY:
                sb_put(b, "[", 1);
                for (uint32_t k = 0; k < n->min_items; k++) {
                        if (k)
                                sb_put(b, ",", 1);
                        emit_min(g, n->items, b, depth + 1);
                }
                sb_put(b, "]", 1);
                return;
        case GK_OBJECT:
                sb_put(b, "{", 1);
                emit_obj_rest(g, n, 0, true, b, depth);
                return;
        default:
                return;
        }
}

/* Bytes that finish thread t, shortest first choice at every step. */
static void thread_completion(const struct grammar *g, const struct gthread *t, struct sbuf *b) {
        b->n = 0;
        sb_put(b, "", 0);
        if (t->done)
                return;
        for (int i = t->depth - 1; i >= 0; i--) {
                const struct gframe *f = &t->f[i];
                const struct gnode *n = &g->nodes[f->node];
                bool top = i == t->depth - 1;
                uint8_t st = f->st;
                if (st == ST_START) {
                        emit_min(g, (int32_t) f->node, b, 0);
                        continue;
                }
                switch (n->kind) {
                case GK_STRING:
                        if (st == S_BODY)
                                for (unsigned k = 0; k < f->need; k++) {
                                        char x = (char) (k == 0 ? f->lo8 : 0x80);
                                        sb_put(b, &x, 1);
                                }
                        else if (st == S_ESC)
                                sb_put(b, "n", 1);
                        else if (st == S_U)
                                for (unsigned k = f->pos; k < 4; k++)
                                        sb_put(b, "1", 1);
                        sb_put(b, "\"", 1);
                        break;
                case GK_NUMBER:
                case GK_INTEGER:
                        if (st == NB_MINUS || st == NB_DOT || st == NB_E || st == NB_ESIGN)
                                sb_put(b, "0", 1);
                        break;
                case GK_LITERAL: {
                        uint32_t best = literal_best(g, n, f->lo, f->hi);
                        sb_put(b, g->lits[n->a + best].s + f->pos, g->lits[n->a + best].len - f->pos);
                        break;
                }
                case GK_RAW:
                        if (st == R_BODY && f->need)
                                for (unsigned k = 0; k < f->need; k++) {
                                        char x = (char) (k == 0 ? f->lo8 : 0x80);
                                        sb_put(b, &x, 1);
                                }
                        else if (!f->pos && f->n < n->min_items)
                                sb_put(b, "a", 1);
                        sb_rest(b, RAW_END[n->a], f->pos);
                        break;
                case GK_CALL: {
                        /* C_NAME: the name's literal above finishes as its shortest candidate */
                        const struct gframe *nf = &t->f[i + 1];
                        uint32_t best = literal_best(g, &g->nodes[nf->node], nf->lo, nf->hi);
                        emit_min(g, (int32_t) g->list[n->tools + best], b, 0);
                        break;
                }
                case GK_PARAMS: {
                        uint64_t seen = f->seen;
                        if (st == P_KEY) {
                                /* finish this key: a required candidate if any, else the shortest */
                                uint32_t best = UINT32_MAX;
                                for (uint32_t k = f->lo; k < f->hi; k++) {
                                        if (seen >> k & 1)
                                                continue;
                                        bool req = n->required >> k & 1;
                                        if (best == UINT32_MAX || (req && !(n->required >> best & 1)) ||
                                            (req == (bool) (n->required >> best & 1) &&
                                             g->keys[n->a + k].len < g->keys[n->a + best].len))
                                                best = k;
                                }
                                if (best == UINT32_MAX)
                                        break;
                                sb_put(b, g->keys[n->a + best].s + f->pos, g->keys[n->a + best].len - f->pos);
                                emit_value(g, g->key_node[n->a + best], b, 0);
                                seen |= 1ull << best;
                        } else if (st == P_FKEY_OPEN) {
                                sb_rest(b, PARAM_KEY, f->pos);
                                emit_min(g, n->items, b, 0);
                                emit_value(g, n->extra, b, 0);
                        } else if (st == P_FKEY || st == P_FVAL) /* P_FKEY: its key's frame finished above */
                                emit_value(g, n->extra, b, 0);
                        else if (st == P_VAL && !g->nodes[t->f[i + 1].node].native)
                                sb_put(b, PARAM_VALUE_END, strlen(PARAM_VALUE_END));
                        else if (st == P_VEND)
                                sb_rest(b, PARAM_VALUE_END, f->pos);
                        emit_params_rest(g, n, seen, b, 0);
                        break;
                }
                case GK_ARRAY: {
                        uint32_t cnt = f->n;
                        if (st == A_VAL && !top) {
                                cnt++;
                                st = A_AFTER;
                        }
                        if (st == A_COMMA) {
                                emit_min(g, n->items, b, 0);
                                cnt++;
                                st = A_AFTER;
                        }
                        for (; cnt < n->min_items; cnt++) {
                                if (cnt > 0 || st == A_AFTER)
                                        sb_put(b, ",", 1);
                                emit_min(g, n->items, b, 0);
                                st = A_AFTER;
                        }
                        sb_put(b, "]", 1);
                        break;
                }
                case GK_OBJECT: {
                        uint64_t seen = f->seen;
                        if (st == O_FKEY && !top)
                                st = O_COLON;
                        if (st == O_VAL && !top)
                                st = O_AFTER;
                        if (st == O_KEY) {
                                /* finish this key: a required candidate if any, else the shortest */
                                uint32_t best = UINT32_MAX;
                                for (uint32_t k = f->lo; k < f->hi; k++) {
                                        if (seen >> k & 1)
                                                continue;
                                        if (best == UINT32_MAX || g->keys[n->a + k].len < g->keys[n->a + best].len)
                                                best = k;
                                }
                                for (uint32_t d = 0; d < n->n && best != UINT32_MAX; d++) {
                                        uint32_t s = g->list[n->decl + d];
                                        if ((n->required >> d & 1) && s >= f->lo && s < f->hi && !(seen >> s & 1)) {
                                                best = s;
                                                break;
                                        }
                                }
                                if (best == UINT32_MAX)
                                        break;
                                sb_put(b, g->keys[n->a + best].s + f->pos, g->keys[n->a + best].len - f->pos);
                                sb_put(b, ":", 1);
                                emit_min(g, g->key_node[n->a + best], b, 0);
                                seen |= 1ull << best;
                                st = O_AFTER;
                        } else if (st == O_COLON) {
                                sb_put(b, ":", 1);
                                emit_min(g, n->n == 0 ? n->extra : g->key_node[n->a + f->lo], b, 0);
                                st = O_AFTER;
                        }
                        if (st == O_COMMA) {
                                /* a property must follow the comma */
                                bool any = false;
                                for (uint32_t k = 0; k < n->n && !any; k++) {
                                        uint32_t s = g->list[n->decl + k];
                                        if ((n->required >> k & 1) && !(seen >> s & 1))
                                                any = true;
                                }
                                if (n->n == 0) {
                                        sb_put(b, "\"\":", 3);
                                        emit_min(g, n->extra, b, 0);
                                } else if (!any) {
                                        uint32_t best = UINT32_MAX, bl = INF_LEN;
                                        for (uint32_t k = 0; k < n->n; k++) {
                                                uint32_t l = add_len(g->keys[n->a + k].len, g->nodes[g->key_node[n->a + k]].min_len);
                                                if (!(seen >> k & 1) && l < bl) {
                                                        bl = l;
                                                        best = k;
                                                }
                                        }
                                        if (best != UINT32_MAX) {
                                                emit_prop(g, n, best, b, 0);
                                                seen |= 1ull << best;
                                        }
                                }
                                emit_obj_rest(g, n, seen, any, b, 0);
                        } else if (st == O_OPEN)
                                emit_obj_rest(g, n, seen, true, b, 0);
                        else if (st == O_AFTER)
                                emit_obj_rest(g, n, seen, false, b, 0);
                        break;
                }
                default:
                        break;
                }
        }
}

/* ---- vocabulary trie ------------------------------------------------------------------------- */

struct tnode {
        uint32_t child;   /* first child (children are contiguous) */
        uint32_t lo, hi;  /* tokens of the subtree: order[lo..hi) */
        uint16_t n_child;
        uint16_t n_end;   /* tokens ending here: order[lo..lo+n_end) */
        uint8_t byte;
        uint8_t safe;     /* see the file comment */
};

struct grammar_vocab {
        uint32_t n_vocab;
        uint32_t n_words;
        struct tnode *nodes;
        uint32_t n_nodes, cap_nodes;
        int32_t *order;     /* text tokens sorted by their bytes */
        uint32_t n_text;
        uint8_t *bytes;     /* text of token id: bytes[off[id] .. off[id] + len[id]) */
        uint32_t *off;
        uint16_t *len;      /* 0: not a text token */
        uint32_t max_len;
        uint64_t *clean;    /* bitset of the tokens a free string body takes whole from its start */
        /* The tokens that are not clean, by their text from the first byte a string body refuses
         * (the whole text when not valid UTF-8): what such a token does in a string body depends
         * only on that suffix, the part before leaves the string as it was. A trie of those
         * suffixes, its entries mapped to token ids. */
        struct grammar_vocab *suffix;
        /* the same for raw text (a native call's string value): tokens valid UTF-8 without '<' or
         * NUL leave raw text at rest as it was; the others act by their text from the first such
         * byte */
        uint64_t *raw_clean;
        struct grammar_vocab *raw_suffix;
        int32_t *ids;       /* suffix trie: entry -> token id */
        bool shared_bytes;
};

void grammar_vocab_free(struct grammar_vocab *v) {
        if (!v)
                return;
        grammar_vocab_free(v->suffix);
        grammar_vocab_free(v->raw_suffix);
        free(v->raw_clean);
        free(v->ids);
        free(v->nodes);
        free(v->order);
        if (!v->shared_bytes)
                free(v->bytes);
        free(v->off);
        free(v->len);
        free(v->clean);
        free(v);
}

uint32_t grammar_vocab_n(const struct grammar_vocab *v) {
        return v->n_vocab;
}

static int tok_cmp(const void *x, const void *y, void *arg) {
        const struct grammar_vocab *v = arg;
        int32_t a = *(const int32_t *) x, b = *(const int32_t *) y;
        int c = memcmp(v->bytes + v->off[a], v->bytes + v->off[b], MIN(v->len[a], v->len[b]));
        if (c)
                return c;
        if (v->len[a] != v->len[b])
                return v->len[a] < v->len[b] ? -1 : 1;
        return a < b ? -1 : a > b;
}

static bool utf8_valid(const uint8_t *s, size_t n) {
        for (size_t i = 0; i < n;) {
                uint8_t c = s[i];
                size_t k;
                uint8_t lo = 0x80, hi = 0xbf;
                if (c < 0x80) {
                        i++;
                        continue;
                } else if (c >= 0xc2 && c <= 0xdf)
                        k = 1;
                else if (c >= 0xe0 && c <= 0xef) {
                        k = 2;
                        lo = c == 0xe0 ? 0xa0 : 0x80;
                        hi = c == 0xed ? 0x9f : 0xbf;
                } else if (c >= 0xf0 && c <= 0xf4) {
                        k = 3;
                        lo = c == 0xf0 ? 0x90 : 0x80;
                        hi = c == 0xf4 ? 0x8f : 0xbf;
                } else
                        return false;
                if (i + k >= n)
                        return false;
                if (s[i + 1] < lo || s[i + 1] > hi)
                        return false;
                for (size_t j = 2; j <= k; j++)
                        if (s[i + j] < 0x80 || s[i + j] > 0xbf)
                                return false;
                i += k + 1;
        }
        return true;
}

/* A byte a JSON string body does not take as a character of its own (`"`, `\`, control). */
static bool json_refused(uint8_t c) {
        return c == '"' || c == '\\' || c < 0x20;
}

/* A byte raw text does not take as plain text: '<' may begin its end marker, NUL is refused. */
static bool raw_refused(uint8_t c) {
        return c == '<' || c == 0;
}

/* index of the last byte `refused` refuses, -1 if none */
static int last_refused(const uint8_t *s, size_t n, bool (*refused)(uint8_t)) {
        for (size_t i = n; i > 0; i--)
                if (refused(s[i - 1]))
                        return (int) (i - 1);
        return -1;
}

struct build_ret {
        int max_unsafe; /* over the subtree's tokens */
        bool valid;     /* every token of the subtree is valid UTF-8 */
};

/* Node `id` holds order[lo..hi), all sharing bytes [0, depth). */
static int build_node(struct grammar_vocab *v, uint32_t id, uint32_t lo, uint32_t hi, uint32_t depth,
                      const int *unsafe, const bool *valid, struct build_ret *ret) {
        struct build_ret me = { -1, true };
        uint32_t i = lo;
        while (i < hi && v->len[v->order[i]] == depth) {
                me.max_unsafe = MAX(me.max_unsafe, unsafe[v->order[i]]);
                me.valid &= valid[v->order[i]];
                i++;
        }
        v->nodes[id].lo = lo;
        v->nodes[id].hi = hi;
        v->nodes[id].n_end = (uint16_t) MIN(i - lo, 65535u);
        /* count children */
        uint32_t nc = 0;
        for (uint32_t k = i; k < hi;) {
                uint8_t b = v->bytes[v->off[v->order[k]] + depth];
                while (k < hi && v->bytes[v->off[v->order[k]] + depth] == b)
                        k++;
                nc++;
        }
        if (v->n_nodes + nc > v->cap_nodes) {
                uint32_t cap = MAX(v->cap_nodes * 2, v->n_nodes + nc);
                struct tnode *q = realloc(v->nodes, (size_t) cap * sizeof *q);
                if (!q)
                        return -ENOMEM;
                v->nodes = q;
                v->cap_nodes = cap;
        }
        uint32_t first = v->n_nodes;
        v->n_nodes += nc;
        v->nodes[id].child = first;
        v->nodes[id].n_child = (uint16_t) nc;
        uint32_t c = first;
        for (uint32_t k = i; k < hi; c++) {
                uint8_t b = v->bytes[v->off[v->order[k]] + depth];
                uint32_t e = k;
                while (e < hi && v->bytes[v->off[v->order[e]] + depth] == b)
                        e++;
                memset(&v->nodes[c], 0, sizeof v->nodes[c]);
                v->nodes[c].byte = b;
                struct build_ret cr;
                int r = build_node(v, c, k, e, depth + 1, unsafe, valid, &cr);
                if (r < 0)
                        return r;
                /* taken whole before its byte (at depth) is fed: nothing unsafe at or after it */
                v->nodes[c].safe = cr.valid && cr.max_unsafe < (int) depth;
                me.max_unsafe = MAX(me.max_unsafe, cr.max_unsafe);
                me.valid &= cr.valid;
                k = e;
        }
        *ret = me;
        return 0;
}

static int first_refused(const uint8_t *p, size_t n, bool (*refused)(uint8_t)) {
        for (size_t i = 0; i < n; i++)
                if (refused(p[i]))
                        return (int) i;
        return -1;
}

/* The clean tokens of a text body (valid UTF-8, no byte `refused` refuses) as a bitset, and the
 * trie of the others' suffixes from their first refused byte (the whole text when not valid). */
static int build_suffix_trie(struct grammar_vocab *v, const bool *valid, bool (*refused)(uint8_t),
                             uint64_t **ret_clean, struct grammar_vocab **ret) {
        _cleanup_free_ uint64_t *clean = calloc(v->n_words, sizeof *clean);
        if (!clean)
                return -ENOMEM;
        uint32_t n = 0;
        for (uint32_t i = 0; i < v->n_text; i++) {
                int32_t id = v->order[i];
                if (valid[id] && first_refused(v->bytes + v->off[id], v->len[id], refused) < 0)
                        clean[(uint32_t) id >> 6] |= 1ull << ((uint32_t) id & 63);
                else
                        n++;
        }
        _cleanup_(grammar_vocab_freep) struct grammar_vocab *sv = calloc(1, sizeof *sv);
        if (!sv)
                return -ENOMEM;
        sv->n_vocab = v->n_vocab;
        sv->n_words = v->n_words;
        sv->bytes = v->bytes;
        sv->shared_bytes = true;
        sv->off = malloc(MAX(n, 1u) * sizeof *sv->off);
        sv->len = malloc(MAX(n, 1u) * sizeof *sv->len);
        sv->ids = malloc(MAX(n, 1u) * sizeof *sv->ids);
        sv->order = malloc(MAX(n, 1u) * sizeof *sv->order);
        _cleanup_free_ int *unsafe = malloc(MAX(n, 1u) * sizeof *unsafe);
        _cleanup_free_ bool *val = malloc(MAX(n, 1u) * sizeof *val);
        if (!sv->off || !sv->len || !sv->ids || !sv->order || !unsafe || !val)
                return -ENOMEM;
        for (uint32_t i = 0; i < v->n_text; i++) {
                int32_t id = v->order[i];
                const uint8_t *p = v->bytes + v->off[id];
                int u = valid[id] ? first_refused(p, v->len[id], refused) : 0;
                if (u < 0)
                        continue; /* clean */
                uint32_t e = sv->n_text++;
                sv->off[e] = v->off[id] + (uint32_t) u;
                sv->len[e] = (uint16_t) (v->len[id] - u);
                sv->ids[e] = id;
                sv->order[e] = (int32_t) e;
                unsafe[e] = last_refused(p + u, sv->len[e], refused);
                val[e] = utf8_valid(p + u, sv->len[e]);
                sv->max_len = MAX(sv->max_len, sv->len[e]);
        }
        qsort_r(sv->order, sv->n_text, sizeof *sv->order, tok_cmp, sv);
        sv->cap_nodes = 256;
        sv->nodes = calloc(sv->cap_nodes, sizeof *sv->nodes);
        if (!sv->nodes)
                return -ENOMEM;
        sv->n_nodes = 1;
        struct build_ret br;
        int r = build_node(sv, 0, 0, sv->n_text, 0, unsafe, val, &br);
        if (r < 0)
                return r;
        *ret_clean = TAKE_PTR(clean);
        *ret = TAKE_PTR(sv);
        return 0;
}

int grammar_vocab_new(const struct tokenizer *t, struct grammar_vocab **ret) {
        _cleanup_(grammar_vocab_freep) struct grammar_vocab *v = calloc(1, sizeof *v);
        if (!v)
                return -ENOMEM;
        size_t n = tokenizer_n_vocab(t);
        if (n == 0 || n > INT32_MAX)
                return log_error_errno(EINVAL, "grammar: vocabulary of %zu tokens", n);
        v->n_vocab = (uint32_t) n;
        v->n_words = (uint32_t) DIV_ROUND_UP(n, 64);
        v->off = calloc(n, sizeof *v->off);
        v->len = calloc(n, sizeof *v->len);
        v->order = malloc(n * sizeof *v->order);
        size_t total = 0;
        for (size_t i = 0; i < n; i++) {
                size_t l = 0;
                (void) tokenizer_piece(t, (int32_t) i, &l);
                total += l;
        }
        v->bytes = malloc(total + 1);
        _cleanup_free_ int *unsafe = malloc(n * sizeof *unsafe);
        _cleanup_free_ bool *valid = malloc(n * sizeof *valid);
        if (!v->off || !v->len || !v->order || !v->bytes || !unsafe || !valid)
                return -ENOMEM;
        size_t pos = 0;
        for (size_t i = 0; i < n; i++) {
                int type = tokenizer_piece_type(t, (int32_t) i);
                size_t l = 0;
                const char *p = tokenizer_piece(t, (int32_t) i, &l);
                size_t start = pos;
                if (tokenizer_id_special(t, (int32_t) i) >= 0 || type == TOKENIZER_PIECE_CONTROL ||
                    type == TOKENIZER_PIECE_UNKNOWN || !p)
                        continue;
                if (type == TOKENIZER_PIECE_BYTE) {
                        unsigned b;
                        if (l != 6 || sscanf(p, "<0x%02X>", &b) != 1)
                                continue;
                        v->bytes[pos++] = (uint8_t) b;
                } else
                        /* decoded text: `▁` (U+2581, e2 96 81) is a space */
                        for (size_t k = 0; k < l;) {
                                if (k + 3 <= l && memcmp(p + k, "\xe2\x96\x81", 3) == 0) {
                                        v->bytes[pos++] = ' ';
                                        k += 3;
                                } else
                                        v->bytes[pos++] = (uint8_t) p[k++];
                        }
                if (pos == start || pos - start > 65535) {
                        pos = start;
                        continue;
                }
                v->off[i] = (uint32_t) start;
                v->len[i] = (uint16_t) (pos - start);
                v->max_len = MAX(v->max_len, v->len[i]);
                unsafe[i] = last_refused(v->bytes + start, pos - start, json_refused);
                valid[i] = utf8_valid(v->bytes + start, pos - start);
                v->order[v->n_text++] = (int32_t) i;
        }
        qsort_r(v->order, v->n_text, sizeof *v->order, tok_cmp, v);
        v->cap_nodes = 1024;
        v->nodes = calloc(v->cap_nodes, sizeof *v->nodes);
        if (!v->nodes)
                return -ENOMEM;
        v->n_nodes = 1;
        struct build_ret br;
        int r = build_node(v, 0, 0, v->n_text, 0, unsafe, valid, &br);
        if (r < 0)
                return r;
        if ((r = build_suffix_trie(v, valid, json_refused, &v->clean, &v->suffix)) < 0 ||
            (r = build_suffix_trie(v, valid, raw_refused, &v->raw_clean, &v->raw_suffix)) < 0)
                return r;
        *ret = TAKE_PTR(v);
        return 0;
}

/* ---- matcher --------------------------------------------------------------------------------- */

/* PH_FREE (lazy grammars): outside a call, any token; `<tool_call>` starts one (PH_JSON), its
 * `</tool_call>` comes back here */
enum { PH_PRE, PH_JSON, PH_POST, PH_END, PH_FREE };

#define CACHE_SLOTS 16

struct cache_slot {
        uint64_t hash;
        uint32_t key_len;
        uint8_t *key;
        uint64_t *mask;
        int count;
};

struct grammar_matcher {
        const struct grammar *g;
        const struct grammar_vocab *v;
        int32_t end_ids[8];
        uint32_t n_end;
        int phase;
        uint32_t idx; /* PRE / POST: tokens of the phase done */
        bool ended;
        struct tset cur;
        struct tset *level; /* walk scratch: one set per trie depth */
        uint32_t n_level;
        bool walk_free; /* the walk's root state allows the whole-subtree shortcut */
        const struct grammar_vocab *wv; /* the trie walked: the vocabulary's or its suffix trie */
        uint64_t *mask_out;
        uint8_t *key;
        size_t key_cap;
        struct cache_slot cache[CACHE_SLOTS];
        uint32_t cache_next;
        bool no_cache;
        struct sbuf comp;
        uint32_t *comp_tok;     /* comp_tok[i]: fewest tokens that spell comp.p[i..], INF_LEN none */
        size_t comp_tok_cap;
        uint32_t root_tokens;   /* fewest tokens of the shortest complete output (a call's) */
        uint32_t answer_tokens; /* the same for the JSON answer beside calls */
        bool in_call;           /* the threads are a tool call's (GRAMMAR_TOOL*), else JSON */
        uint32_t margin_tokens; /* closing_margin() in tokens */
};

void grammar_matcher_set_cache(struct grammar_matcher *m, bool on) {
        m->no_cache = !on;
}

void grammar_matcher_free(struct grammar_matcher *m) {
        if (!m)
                return;
        for (int i = 0; i < CACHE_SLOTS; i++) {
                free(m->cache[i].key);
                free(m->cache[i].mask);
        }
        free(m->level);
        free(m->key);
        free(m->comp.p);
        free(m->comp_tok);
        free(m);
}

/* The threads at the start of the constrained output (or of a lazy grammar's next call). */
static void matcher_restart(struct grammar_matcher *m) {
        m->cur.n = 1;
        memset(&m->cur.t[0], 0, sizeof m->cur.t[0]);
        push(m->g, &m->cur.t[0], m->in_call || m->g->answer < 0 ? m->g->root : m->g->answer);
}

/* The special tokens after the current threads' output: a call's `</tool_call>`, none after JSON. */
static uint32_t post_of(const struct grammar_matcher *m) {
        return m->in_call ? m->g->n_post : 0;
}

/* A JSON answer beside calls that has not begun (whitespace at most): `<tool_call>` may still
 * come instead. */
static bool answer_open(const struct grammar_matcher *m) {
        if (m->g->answer < 0 || m->in_call || m->phase != PH_JSON)
                return false;
        for (uint32_t i = 0; i < m->cur.n; i++)
                if (m->cur.t[i].done || m->cur.t[i].depth != 1 || m->cur.t[i].f[0].st != ST_START)
                        return false;
        return true;
}

/* The child of trie node `node` by byte c, UINT32_MAX if none. */
static uint32_t trie_child(const struct grammar_vocab *v, uint32_t node, uint8_t c) {
        const struct tnode *nd = &v->nodes[node];
        for (uint32_t k = 0; k < nd->n_child; k++)
                if (v->nodes[nd->child + k].byte == c)
                        return nd->child + k;
        return UINT32_MAX;
}

/* The fewest tokens of the vocabulary that spell s[i..n), for every i, in dp[0..n] (dp[n] = 0;
 * INF_LEN where no sequence of text tokens does). The budget counts tokens, the completions are
 * bytes: markup like `<param_key>` is one user-defined piece of the release's vocabulary, a
 * word a few bytes each. */
static void spell_tokens(const struct grammar_vocab *v, const char *s, size_t n, uint32_t *dp) {
        dp[n] = 0;
        for (size_t i = n; i-- > 0;) {
                uint32_t node = 0, best = INF_LEN;
                for (size_t d = i; d < n; d++) {
                        if ((node = trie_child(v, node, (uint8_t) s[d])) == UINT32_MAX)
                                break;
                        if (v->nodes[node].n_end && dp[d + 1] < INF_LEN)
                                best = MIN(best, dp[d + 1] + 1);
                }
                dp[i] = best;
        }
}

/* Tokens of a text: the fewest that spell it, one a byte when none does. */
static uint32_t text_tokens(struct grammar_matcher *m, const char *s, size_t n) {
        if (n + 1 > m->comp_tok_cap) {
                uint32_t *p = realloc(m->comp_tok, (n + 1) * sizeof *p);
                if (!p)
                        return (uint32_t) MIN(n, (size_t) INF_LEN);
                m->comp_tok = p;
                m->comp_tok_cap = n + 1;
        }
        spell_tokens(m->v, s, n, m->comp_tok);
        return m->comp_tok[0] < INF_LEN ? m->comp_tok[0] : (uint32_t) MIN(n, (size_t) INF_LEN);
}

/* The shortest complete output and the closing margin in tokens (a node's shortest value
 * spelled by the vocabulary: only nodes whose shortest value has more bytes than the largest
 * count so far can give more tokens). */
static int count_tokens(struct grammar_matcher *m) {
        const struct grammar *g = m->g;
        struct sbuf b = { 0 };
        uint32_t most = 0;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                if (g->nodes[i].min_len >= INF_LEN || g->nodes[i].min_len <= most)
                        continue;
                b.n = 0;
                emit_min(g, (int32_t) i, &b, 0);
                if (b.oom)
                        break;
                most = MAX(most, text_tokens(m, b.p ? b.p : "", b.n));
        }
        b.n = 0;
        emit_min(g, g->root, &b, 0);
        m->root_tokens = b.oom ? MIN(g->nodes[g->root].min_len, 4096u) : MIN(text_tokens(m, b.p ? b.p : "", b.n), 4096u);
        if (g->answer >= 0) {
                b.n = 0;
                emit_min(g, g->answer, &b, 0);
                m->answer_tokens = b.oom ? MIN(g->nodes[g->answer].min_len, 4096u)
                                         : MIN(text_tokens(m, b.p ? b.p : "", b.n), 4096u);
        }
        m->margin_tokens = MIN(most, 256u) + 2;
        bool oom = b.oom;
        free(b.p);
        return oom ? -ENOMEM : 0;
}

int grammar_matcher_new(const struct grammar *g, const struct grammar_vocab *v, const int32_t *end_ids,
                        size_t n_end, struct grammar_matcher **ret) {
        _cleanup_(grammar_matcher_freep) struct grammar_matcher *m = calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        m->g = g;
        m->v = v;
        for (size_t i = 0; i < n_end && m->n_end < ELEMENTSOF(m->end_ids); i++)
                if (end_ids[i] >= 0 && (uint32_t) end_ids[i] < v->n_vocab)
                        m->end_ids[m->n_end++] = end_ids[i];
        m->phase = g->lazy ? PH_FREE : g->n_pre && g->answer < 0 ? PH_PRE : PH_JSON;
        m->in_call = g->n_pre && g->answer < 0;
        matcher_restart(m);
        m->n_level = v->max_len + 2;
        m->level = malloc((size_t) m->n_level * sizeof *m->level);
        if (!m->level || count_tokens(m) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(m);
        return 0;
}

static bool set_can_end(const struct grammar *g, const struct tset *s) {
        for (uint32_t i = 0; i < s->n; i++)
                if (thread_can_end(g, &s->t[i]))
                        return true;
        return false;
}

bool grammar_matcher_can_end(const struct grammar_matcher *m) {
        if (m->phase == PH_END || m->phase == PH_FREE)
                return true;
        return m->phase == PH_JSON && post_of(m) == 0 && set_can_end(m->g, &m->cur);
}

bool grammar_matcher_lazy(const struct grammar_matcher *m) {
        return m->g->lazy;
}

bool grammar_matcher_ended(const struct grammar_matcher *m) {
        return m->ended;
}

static inline void set_bit(uint64_t *mask, int32_t id) {
        mask[(uint32_t) id >> 6] |= 1ull << ((uint32_t) id & 63);
}

static void set_range(const struct grammar_vocab *v, uint64_t *mask, uint32_t lo, uint32_t hi) {
        if (v->ids)
                for (uint32_t i = lo; i < hi; i++)
                        set_bit(mask, v->ids[v->order[i]]);
        else
                for (uint32_t i = lo; i < hi; i++)
                        set_bit(mask, v->order[i]);
}

static bool all_in_string_body(const struct grammar *g, const struct tset *s) {
        for (uint32_t i = 0; i < s->n; i++) {
                const struct gthread *t = &s->t[i];
                if (t->done || t->depth == 0)
                        return false;
                const struct gframe *f = &t->f[t->depth - 1];
                if (g->nodes[f->node].kind != GK_STRING || f->st != S_BODY)
                        return false;
        }
        return s->n > 0;
}

/* Every thread is in raw text that a clean token (valid UTF-8, no '<', no NUL) leaves exactly as
 * it is: at a character boundary, no end marker begun, its minimum of text met. */
static bool all_raw_at_rest(const struct grammar *g, const struct tset *s) {
        for (uint32_t i = 0; i < s->n; i++) {
                const struct gthread *t = &s->t[i];
                if (t->done || t->depth == 0)
                        return false;
                const struct gframe *f = &t->f[t->depth - 1];
                const struct gnode *n = &g->nodes[f->node];
                if (n->kind != GK_RAW || f->need || f->pos || f->n < n->min_items)
                        return false;
        }
        return s->n > 0;
}

/* Visit the children of trie node `node` (depth bytes in), the threads being `in`. */
static void walk(struct grammar_matcher *m, uint32_t node, uint32_t depth, const struct tset *in);

/* One child c of a node: taken whole, pruned, or walked. */
static inline void walk_child(struct grammar_matcher *m, uint32_t ci, uint32_t depth, const struct tset *in,
                              bool free_str, bool plain) {
        const struct grammar_vocab *v = m->wv;
        const struct tnode *c = &v->nodes[ci];
        if (free_str && c->safe) {
                set_range(v, m->mask_out, c->lo, c->hi);
                return;
        }
        const struct tset *next = in;
        /* a plain ASCII byte in a string body at a character boundary changes nothing */
        if (!(plain && c->byte >= 0x20 && c->byte < 0x80 && c->byte != '"' && c->byte != '\\')) {
                struct tset *out = &m->level[depth + 1];
                tset_feed(m->g, in, c->byte, out);
                if (!out->n)
                        return;
                next = out;
        }
        set_range(v, m->mask_out, c->lo, c->lo + c->n_end);
        if (c->n_child)
                walk(m, ci, depth + 1, next);
}

/* Visit the children of trie node `node` (depth bytes in), the threads being `in`. */
static void walk(struct grammar_matcher *m, uint32_t node, uint32_t depth, const struct tset *in) {
        const struct grammar_vocab *v = m->wv;
        const struct tnode *nd = &v->nodes[node];
        bool free_str = m->walk_free && all_in_string_body(m->g, in), plain = free_str;
        for (uint32_t i = 0; plain && i < in->n; i++)
                plain = in->t[i].f[in->t[i].depth - 1].need == 0;
        for (uint32_t k = 0; k < nd->n_child; k++)
                walk_child(m, nd->child + k, depth, in, free_str, plain);
}

static uint64_t fnv(const uint8_t *p, size_t n) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < n; i++)
                h = (h ^ p[i]) * 0x100000001b3ull;
        return h;
}

/* A thread set as bytes (the cache key). */
static size_t state_key(struct grammar_matcher *m, const struct tset *set) {
        size_t need = sizeof(uint32_t);
        for (uint32_t i = 0; i < set->n; i++)
                need += THREAD_BYTES(&set->t[i]);
        if (need > m->key_cap) {
                uint8_t *k = realloc(m->key, need);
                if (!k)
                        return 0;
                m->key = k;
                m->key_cap = need;
        }
        size_t p = 0;
        memcpy(m->key, &set->n, sizeof(uint32_t));
        p += sizeof(uint32_t);
        for (uint32_t i = 0; i < set->n; i++) {
                size_t b = THREAD_BYTES(&set->t[i]);
                memcpy(m->key + p, &set->t[i], b);
                p += b;
        }
        return p;
}

static int count_bits(const uint64_t *mask, uint32_t words) {
        int n = 0;
        for (uint32_t i = 0; i < words; i++)
                n += __builtin_popcountll(mask[i]);
        return n;
}

static void mask_ends(struct grammar_matcher *m, uint64_t *mask) {
        for (uint32_t i = 0; i < m->n_end; i++)
                set_bit(mask, m->end_ids[i]);
}

/* Shortest completion over the live threads; returns its thread index. */
static uint32_t best_completion(struct grammar_matcher *m) {
        uint32_t best = 0;
        size_t bl = SIZE_MAX;
        struct sbuf tmp = { 0 };
        for (uint32_t i = 0; i < m->cur.n; i++) {
                thread_completion(m->g, &m->cur.t[i], &tmp);
                if (!tmp.oom && tmp.n < bl) {
                        bl = tmp.n;
                        best = i;
                        m->comp.n = 0;
                        sb_put(&m->comp, tmp.p, tmp.n);
                }
        }
        free(tmp.p);
        return best;
}

/* Tokens kept beyond the shortest completion before closing starts: one token can open values
 * whose shortest completions add up to about this (a key of a long optional property, an anyOf
 * branch, a nested object), so closing still fits after it. Counted in tokens of the vocabulary,
 * as the budget is: the largest shortest value of any node, spelled in the fewest tokens. */
static uint32_t closing_margin(const struct grammar_matcher *m) {
        return m->margin_tokens;
}

/* What a reasoning before the output leaves it: the shortest complete output in tokens with the
 * special tokens around it and the end, the closing margin, and as much again for the values to
 * be more than their shortest (a forced call that starts closing writes empty strings). A byte
 * a token would reserve the markup of a native call several times over (`<param_key>` is one
 * piece): the reasoning of a 256-token request was cut after a token. */
uint32_t grammar_matcher_reserve(const struct grammar_matcher *m) {
        const struct grammar *g = m->g;
        if (g->lazy) /* the output may be free text: nothing to keep */
                return 0;
        uint32_t out = m->root_tokens + (g->n_pre ? g->n_pre + g->n_post : 0);
        if (g->answer >= 0) /* a call or the JSON: room for either */
                out = MAX(out, m->answer_tokens);
        return out + 1 + 2 * closing_margin(m);
}

/* A value's raw text with its end marker begun (`<`, `</pa`, ...), one thread: a token whose first
 * byte does not go on into the marker acts as from the same text at rest (the bytes matched were
 * text), so only the tokens that begin with the marker's next byte need a walk from here. The
 * frame, or NULL. */
static const struct gframe *raw_marker_begun(const struct grammar *g, const struct tset *s) {
        if (s->n != 1 || s->t[0].done || s->t[0].depth == 0)
                return NULL;
        const struct gframe *f = &s->t[0].f[s->t[0].depth - 1];
        const struct gnode *n = &g->nodes[f->node];
        return n->kind == GK_RAW && n->a == 0 && f->pos && !f->need ? f : NULL;
}

/* The mask of a thread set (mask zeroed), from the cache or a trie walk; cached. */
static int mask_of_set(struct grammar_matcher *m, const struct tset *set, uint64_t *mask) {
        const struct grammar *g = m->g;
        const struct grammar_vocab *v = m->v;
        size_t klen = m->no_cache ? 0 : state_key(m, set);
        uint64_t h = klen ? fnv(m->key, klen) : 0;
        for (int i = 0; klen && i < CACHE_SLOTS; i++) {
                struct cache_slot *s = &m->cache[i];
                if (s->mask && s->hash == h && s->key_len == klen && memcmp(s->key, m->key, klen) == 0) {
                        memcpy(mask, s->mask, v->n_words * sizeof *mask);
                        return s->count;
                }
        }
        const struct gframe *rf = raw_marker_begun(g, set);
        if (rf) {
                struct tset *rest = malloc(sizeof *rest);
                if (!rest)
                        return -ENOMEM;
                memcpy(rest, set, sizeof *rest);
                rest->t[0].f[rest->t[0].depth - 1].pos = 0;
                int r = mask_of_set(m, rest, mask);
                free(rest);
                if (r < 0)
                        return r;
                if (klen) /* the key buffer held the rest's */
                        h = fnv(m->key, klen = state_key(m, set));
                const struct tnode *root = &v->nodes[0];
                uint8_t next = (uint8_t) RAW_END[0][rf->pos];
                for (uint32_t k = 0; k < root->n_child; k++) {
                        const struct tnode *c = &v->nodes[root->child + k];
                        if (c->byte != next)
                                continue;
                        for (uint32_t i = c->lo; i < c->hi; i++)
                                mask[(uint32_t) v->order[i] >> 6] &= ~(1ull << ((uint32_t) v->order[i] & 63));
                        m->level[0] = *set;
                        m->walk_free = false;
                        m->mask_out = mask;
                        m->wv = v;
                        walk_child(m, root->child + k, 0, &m->level[0], false, false);
                }
        } else {
                m->level[0] = *set;
                m->walk_free = true;
                for (uint32_t i = 0; i < set->n; i++) {
                        const struct gthread *t = &set->t[i];
                        if (t->depth && t->f[t->depth - 1].need)
                                m->walk_free = false; /* inside a character: tokens must continue it */
                }
                m->mask_out = mask;
                m->wv = v;
                if (all_raw_at_rest(g, set) && v->raw_suffix) {
                        /* raw text at rest: the clean tokens keep it so, the others act by their suffix */
                        memcpy(mask, v->raw_clean, v->n_words * sizeof *mask);
                        m->wv = v->raw_suffix;
                } else if (m->walk_free && all_in_string_body(g, set) && v->suffix) {
                        /* a string body at a character boundary: the clean tokens stay in it; the
                         * others act by their suffix from the first refused byte */
                        memcpy(mask, v->clean, v->n_words * sizeof *mask);
                        m->wv = v->suffix;
                }
                walk(m, 0, 0, &m->level[0]);
        }
        if (set_can_end(g, set)) {
                if (post_of(m))
                        set_bit(mask, g->post[0]);
                else
                        mask_ends(m, mask);
        }
        int cnt = count_bits(mask, v->n_words);
        if (klen) {
                struct cache_slot *s = &m->cache[m->cache_next];
                m->cache_next = (m->cache_next + 1) % CACHE_SLOTS;
                if (!s->mask)
                        s->mask = malloc(v->n_words * sizeof *s->mask);
                uint8_t *k = realloc(s->key, klen);
                if (k)
                        s->key = k;
                if (s->mask && k) {
                        memcpy(s->mask, mask, v->n_words * sizeof *mask);
                        memcpy(s->key, m->key, klen);
                        s->key_len = (uint32_t) klen;
                        s->hash = h;
                        s->count = cnt;
                } else {
                        free(s->mask);
                        s->mask = NULL;
                }
        }
        return cnt;
}

/* The tokens along the shortest completion m->comp; with a limit, only those after which the
 * rest takes at most limit - 1 tokens (m->comp_tok counted). Returns how many. */
static int mask_along(struct grammar_matcher *m, uint64_t *mask, uint64_t limit) {
        const struct grammar_vocab *v = m->v;
        uint32_t node = 0;
        for (size_t d = 0; d < m->comp.n; d++) {
                if ((node = trie_child(v, node, (uint8_t) m->comp.p[d])) == UINT32_MAX)
                        break;
                if (limit == UINT64_MAX || (m->comp_tok[d + 1] < INF_LEN && 1 + (uint64_t) m->comp_tok[d + 1] <= limit))
                        set_range(v, mask, v->nodes[node].lo, v->nodes[node].lo + v->nodes[node].n_end);
        }
        return count_bits(mask, v->n_words);
}

/* A whole call (`<tool_call>`, its shortest form, `</tool_call>`, the end) fits the budget. */
static bool call_fits(const struct grammar_matcher *m, uint32_t budget) {
        return (uint64_t) budget >= 1 + (uint64_t) m->root_tokens + m->g->n_post + 1;
}

static int mask_now(struct grammar_matcher *m, uint32_t budget, uint64_t *mask);

int grammar_matcher_mask(struct grammar_matcher *m, uint32_t budget, uint64_t *mask) {
        int n = mask_now(m, budget, mask);
        /* beside a JSON answer: a call instead of it (or after a call, another) */
        if (n >= 0 && (answer_open(m) || (m->g->answer >= 0 && m->phase == PH_END && !m->ended)) &&
            call_fits(m, budget) && !grammar_mask_test(mask, m->g->pre[0])) {
                set_bit(mask, m->g->pre[0]);
                n++;
        }
        return n;
}

static int mask_now(struct grammar_matcher *m, uint32_t budget, uint64_t *mask) {
        const struct grammar *g = m->g;
        const struct grammar_vocab *v = m->v;
        memset(mask, 0, v->n_words * sizeof *mask);
        if (m->phase == PH_PRE) {
                set_bit(mask, g->pre[m->idx]);
                return 1;
        }
        if (m->phase == PH_POST) {
                set_bit(mask, g->post[m->idx]);
                return 1;
        }
        if (m->phase == PH_END) {
                mask_ends(m, mask);
                return count_bits(mask, v->n_words);
        }
        if (m->phase == PH_FREE) {
                /* any token; `<tool_call>` only while a whole call still fits */
                memset(mask, 0xff, v->n_words * sizeof *mask);
                if (v->n_vocab % 64)
                        mask[v->n_words - 1] = (1ull << (v->n_vocab % 64)) - 1;
                if (!call_fits(m, budget))
                        mask[(uint32_t) g->pre[0] >> 6] &= ~(1ull << ((uint32_t) g->pre[0] & 63));
                return count_bits(mask, v->n_words);
        }
        bool can_end = set_can_end(g, &m->cur);
        /* closing: near the budget, only along the shortest completion */
        best_completion(m);
        if (m->comp.oom)
                return -ENOMEM;
        uint64_t after = (uint64_t) post_of(m) + 1; /* `</tool_call>`, EOS */
        uint64_t margin = closing_margin(m);
        /* the completion in tokens (never more than its bytes when every byte is a piece): only
         * counted when the budget could be close */
        uint64_t comp_tokens = m->comp.n;
        bool counted = false;
        if ((uint64_t) budget <= m->comp.n + after + margin && m->comp.n > 0) {
                comp_tokens = text_tokens(m, m->comp.p, m->comp.n);
                counted = m->comp_tok_cap > m->comp.n; /* else out of memory: bytes, an upper bound */
        }
        if ((uint64_t) budget <= comp_tokens + after + margin && (m->comp.n > 0 || can_end)) {
                if (m->comp.n == 0) {
                        if (post_of(m))
                                set_bit(mask, g->post[0]);
                        else
                                mask_ends(m, mask);
                        return count_bits(mask, v->n_words);
                }
                /* a token after which the rest can still be spelled within the budget (byte
                 * pieces all along would not fit where the markup's pieces do); when none does,
                 * any along the completion, the shortest way not being enough anyway */
                int cnt = mask_along(m, mask, counted ? (uint64_t) budget - MIN(after, budget) : UINT64_MAX);
                if (cnt == 0 && counted)
                        cnt = mask_along(m, mask, UINT64_MAX);
                if (cnt > 0)
                        return cnt;
                /* the vocabulary cannot spell the completion: fall back to the full mask */
        }

        return mask_of_set(m, &m->cur, mask);
}

static int feed_bytes(struct grammar_matcher *m, const uint8_t *p, size_t n) {
        struct tset *a = &m->level[0], *b = &m->level[1];
        *a = m->cur;
        for (size_t i = 0; i < n; i++) {
                tset_feed(m->g, a, p[i], b);
                if (!b->n)
                        return -EINVAL;
                struct tset *x = a;
                a = b;
                b = x;
        }
        m->cur = *a;
        return 0;
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n) {
        if (m->phase != PH_JSON)
                return -EINVAL;
        return feed_bytes(m, (const uint8_t *) s, n);
}

static bool is_end(const struct grammar_matcher *m, int32_t id) {
        for (uint32_t i = 0; i < m->n_end; i++)
                if (m->end_ids[i] == id)
                        return true;
        return false;
}

int grammar_matcher_accept(struct grammar_matcher *m, int32_t id) {
        const struct grammar *g = m->g;
        const struct grammar_vocab *v = m->v;
        if (id < 0 || (uint32_t) id >= v->n_vocab)
                return -EINVAL;
        switch (m->phase) {
        case PH_PRE:
                if (id != g->pre[m->idx])
                        return -EINVAL;
                if (++m->idx == g->n_pre) {
                        m->phase = PH_JSON;
                        m->idx = 0;
                }
                return 0;
        case PH_POST:
                if (id != g->post[m->idx])
                        return -EINVAL;
                if (++m->idx == g->n_post)
                        m->phase = PH_END;
                return 0;
        case PH_END:
                if (g->answer >= 0 && id == g->pre[0] && !m->ended) { /* another call */
                        m->phase = PH_JSON;
                        matcher_restart(m);
                        return 0;
                }
                if (!is_end(m, id))
                        return -EINVAL;
                m->ended = true;
                return 0;
        case PH_FREE:
                if (id == g->pre[0]) { /* a call begins: held to the grammar to its end */
                        m->phase = PH_JSON;
                        matcher_restart(m);
                } else if (is_end(m, id))
                        m->ended = true;
                return 0;
        default:
                break;
        }
        if (answer_open(m) && id == g->pre[0]) { /* a call instead of the JSON answer */
                m->in_call = true;
                matcher_restart(m);
                return 0;
        }
        if (set_can_end(g, &m->cur)) {
                if (post_of(m) && id == g->post[0]) {
                        m->phase = g->lazy ? PH_FREE : g->n_post > 1 ? PH_POST : PH_END;
                        m->idx = 1;
                        return 0;
                }
                if (!post_of(m) && is_end(m, id)) {
                        m->phase = PH_END;
                        m->ended = true;
                        return 0;
                }
        }
        if (v->len[id] == 0)
                return -EINVAL;
        return feed_bytes(m, v->bytes + v->off[id], v->len[id]);
}

void grammar_mask_apply(const uint64_t *mask, float *logits, uint32_t n_vocab) {
        for (uint32_t w = 0; w < DIV_ROUND_UP(n_vocab, 64); w++) {
                uint64_t keep = mask[w];
                if (keep == UINT64_MAX)
                        continue;
                uint32_t base = w * 64, end = MIN(base + 64, n_vocab);
                if (keep == 0) {
                        for (uint32_t i = base; i < end; i++)
                                logits[i] = -INFINITY;
                        continue;
                }
                for (uint32_t i = base; i < end; i++)
                        if (!(keep >> (i - base) & 1))
                                logits[i] = -INFINITY;
        }
}
