/* SPDX-License-Identifier: MIT */
/* Output channel parser (docs/model.md §7 "Model output", "Tool call"). Rules in outparse.h. */
#include "chat/outparse.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "chat/tokenizer.h"

struct buf {
        char *p;
        size_t n, cap;
};

static int buf_put(struct buf *b, const char *s, size_t n) {
        if (b->n + n + 1 > b->cap) {
                size_t cap = MAX(b->cap * 2, b->n + n + 64);
                char *q = realloc(b->p, cap);
                if (!q)
                        return -ENOMEM;
                b->p = q;
                b->cap = cap;
        }
        if (n)
                memcpy(b->p + b->n, s, n);
        b->n += n;
        b->p[b->n] = 0;
        return 0;
}

static void buf_drop_front(struct buf *b, size_t n) {
        memmove(b->p, b->p + n, b->n - n);
        b->n -= n;
        b->p[b->n] = 0;
}

struct outparse {
        const struct tokenizer *t;
        struct outparse_config c;
        char **stop_strings; /* copies */
        char **tool_names;   /* copies, c.n_tool_names of them */
        struct json_value **tool_params; /* copies of c.tool_parameters (entries may be NULL) */
        int32_t *stop_ids;
        size_t max_stop_len;

        int32_t id_think, id_end_think, id_tool_call, id_end_tool_call;
        int32_t turn_end[8];

        enum outparse_channel channel; /* REASONING or CONTENT */
        bool in_tool;
        bool stopped;
        bool held_nl;        /* reasoning: one trailing "\n" held back (maybe before </think>) */
        uint64_t n_fed, n_reasoning;
        struct buf pending;  /* channel text that may be the start of a stop string */
        struct buf tool;     /* body of the tool call being read */
        struct buf scratch;
};

void outparse_free(struct outparse *p) {
        if (!p)
                return;
        for (size_t i = 0; i < p->c.n_stop_strings; i++)
                free(p->stop_strings[i]);
        free(p->stop_strings);
        for (size_t i = 0; i < p->c.n_tool_names; i++) {
                free(p->tool_names[i]);
                json_free(p->tool_params ? p->tool_params[i] : NULL);
        }
        free(p->tool_names);
        free(p->tool_params);
        free(p->stop_ids);
        free(p->pending.p);
        free(p->tool.p);
        free(p->scratch.p);
        free(p);
}

int outparse_new(const struct tokenizer *t, const struct outparse_config *c, struct outparse **ret,
                 char *err, size_t err_size) {
        _cleanup_(outparse_freep) struct outparse *p = calloc(1, sizeof(*p));
        if (!p)
                return error_set(err, err_size, ENOMEM, "output parser: out of memory");
        if (!c->emit)
                return error_set(err, err_size, EINVAL, "outparse: no emit callback, one expected");
        p->t = t;
        p->c = *c;
        p->c.n_stop_strings = 0;
        p->stop_strings = calloc(c->n_stop_strings + 1, sizeof(char *));
        p->stop_ids = calloc(c->n_stop_ids + 1, sizeof(int32_t));
        if (!p->stop_strings || !p->stop_ids)
                return error_set(err, err_size, ENOMEM, "output parser: out of memory");
        for (size_t i = 0; i < c->n_stop_strings; i++) {
                if (!c->stop_strings[i] || !c->stop_strings[i][0])
                        return error_set(err, err_size, EINVAL, "stop string %zu is empty, non-empty text expected", i);
                p->stop_strings[i] = strdup(c->stop_strings[i]);
                if (!p->stop_strings[i])
                        return error_set(err, err_size, ENOMEM, "output parser: out of memory");
                p->c.n_stop_strings = i + 1;
                p->max_stop_len = MAX(p->max_stop_len, strlen(c->stop_strings[i]));
        }
        if (c->n_stop_ids)
                memcpy(p->stop_ids, c->stop_ids, c->n_stop_ids * sizeof(int32_t));
        p->c.stop_strings = NULL;
        p->c.stop_ids = NULL;
        p->c.n_tool_names = 0;
        p->c.tool_names = NULL;
        p->c.tool_parameters = NULL;
        if (c->n_tool_names) {
                p->tool_names = calloc(c->n_tool_names, sizeof(char *));
                p->tool_params = calloc(c->n_tool_names, sizeof(struct json_value *));
                if (!p->tool_names || !p->tool_params)
                        return error_set(err, err_size, ENOMEM, "output parser: out of memory");
                for (size_t i = 0; i < c->n_tool_names; i++) {
                        p->tool_names[i] = strdup(c->tool_names[i] ? c->tool_names[i] : "");
                        if (!p->tool_names[i])
                                return error_set(err, err_size, ENOMEM, "output parser: out of memory");
                        p->c.n_tool_names = i + 1;
                        const struct json_value *sv = c->tool_parameters ? c->tool_parameters[i] : NULL;
                        if (!sv)
                                continue;
                        /* a copy (json.h has none): through its text */
                        _cleanup_free_ char *txt = json_dump(sv, JSON_COMPACT, 0);
                        if (!txt || json_parse(txt, strlen(txt), "tool parameters", &p->tool_params[i], NULL, 0) < 0)
                                return error_set(err, err_size, ENOMEM, "output parser: out of memory");
                }
        }

        p->id_think = tokenizer_special_id(t, TOKENIZER_SPECIAL_THINK);
        p->id_end_think = tokenizer_special_id(t, TOKENIZER_SPECIAL_END_THINK);
        p->id_tool_call = tokenizer_special_id(t, TOKENIZER_SPECIAL_TOOL_CALL);
        p->id_end_tool_call = tokenizer_special_id(t, TOKENIZER_SPECIAL_END_TOOL_CALL);
        /* docs/model.md §7: `<_end>` stops; parsers also end the turn on these */
        static const enum tokenizer_special ends[8] = {
                TOKENIZER_SPECIAL_END,  TOKENIZER_SPECIAL_USER,          TOKENIZER_SPECIAL_BOT,
                TOKENIZER_SPECIAL_SYSTEM, TOKENIZER_SPECIAL_START,       TOKENIZER_SPECIAL_PAD,
                TOKENIZER_SPECIAL_TOOL_RESPONSE, TOKENIZER_SPECIAL_END_TOOL_RESPONSE,
        };
        for (size_t i = 0; i < ELEMENTSOF(ends); i++)
                p->turn_end[i] = tokenizer_special_id(t, ends[i]);
        p->channel = c->thinking ? OUTPARSE_REASONING : OUTPARSE_CONTENT;
        *ret = TAKE_PTR(p);
        return 0;
}

bool outparse_stopped(const struct outparse *p) {
        return p->stopped;
}

enum outparse_channel outparse_channel(const struct outparse *p) {
        return p->in_tool ? OUTPARSE_TOOL_CALL : p->channel;
}

bool outparse_should_force_end_think(const struct outparse *p) {
        return !p->stopped && p->channel == OUTPARSE_REASONING && p->c.thinking_budget >= 0 &&
               p->n_reasoning >= (uint64_t) p->c.thinking_budget && p->id_end_think >= 0;
}

int32_t outparse_end_think_id(const struct outparse *p) {
        return p->id_end_think;
}

uint64_t outparse_reasoning_tokens(const struct outparse *p) {
        return p->n_reasoning;
}

/* ---- emitting ---------------------------------------------------------------------------- */

static int emit_text(struct outparse *p, enum outparse_channel ch, const char *s, size_t n) {
        if (n == 0)
                return 0;
        struct outparse_event ev = { .type = OUTPARSE_EVENT_TEXT, .channel = ch, .text = s, .len = n,
                                     .stop_id = -1 };
        return p->c.emit(&ev, p->c.userdata);
}

/* Last stage: reasoning holds back one trailing "\n" (it may be the structural one before
 * `</think>`); content goes straight out. */
static int downstream(struct outparse *p, const char *s, size_t n) {
        int r;
        if (n == 0)
                return 0;
        if (p->channel != OUTPARSE_REASONING)
                return emit_text(p, p->channel, s, n);
        p->scratch.n = 0;
        if (p->held_nl && (r = buf_put(&p->scratch, "\n", 1)) < 0)
                return r;
        if ((r = buf_put(&p->scratch, s, n)) < 0)
                return r;
        p->held_nl = p->scratch.p[p->scratch.n - 1] == '\n';
        return emit_text(p, OUTPARSE_REASONING, p->scratch.p, p->scratch.n - p->held_nl);
}

static int flush_held_nl(struct outparse *p, bool keep) {
        if (!p->held_nl)
                return 0;
        p->held_nl = false;
        return keep ? emit_text(p, OUTPARSE_REASONING, "\n", 1) : 0;
}

static int flush_pending(struct outparse *p) {
        int r = downstream(p, p->pending.p, p->pending.n);
        p->pending.n = 0;
        return r;
}

static int emit_stop(struct outparse *p, const char *reason, int32_t id, const char *stop_string) {
        p->stopped = true;
        struct outparse_event ev = { .type = OUTPARSE_EVENT_STOP, .channel = p->channel,
                                     .finish_reason = reason, .stop_id = id, .stop_string = stop_string };
        return p->c.emit(&ev, p->c.userdata);
}

/* Channel text, through the stop-string matcher. Returns 1 when a stop string ended the turn. */
static int channel_text(struct outparse *p, const char *s, size_t n) {
        int r;
        if (p->c.n_stop_strings == 0)
                return downstream(p, s, n);
        if ((r = buf_put(&p->pending, s, n)) < 0)
                return r;

        /* the earliest full match wins */
        size_t best = SIZE_MAX, which = 0;
        for (size_t k = 0; k < p->c.n_stop_strings; k++) {
                const char *m = memmem(p->pending.p, p->pending.n, p->stop_strings[k], strlen(p->stop_strings[k]));
                if (m && (size_t) (m - p->pending.p) < best) {
                        best = (size_t) (m - p->pending.p);
                        which = k;
                }
        }
        if (best != SIZE_MAX) {
                if ((r = downstream(p, p->pending.p, best)) < 0)
                        return r;
                p->pending.n = 0;
                if ((r = flush_held_nl(p, true)) < 0)
                        return r;
                r = emit_stop(p, "stop", -1, p->stop_strings[which]);
                return r < 0 ? r : 1;
        }

        /* hold back the longest suffix that is a prefix of a stop string */
        size_t hold = 0;
        for (size_t k = 0; k < p->c.n_stop_strings; k++) {
                size_t sl = strlen(p->stop_strings[k]);
                for (size_t l = MIN(sl - 1, p->pending.n); l > hold; l--)
                        if (memcmp(p->pending.p + p->pending.n - l, p->stop_strings[k], l) == 0) {
                                hold = l;
                                break;
                        }
        }
        size_t out = p->pending.n - hold;
        if ((r = downstream(p, p->pending.p, out)) < 0)
                return r;
        buf_drop_front(&p->pending, out);
        return 0;
}

/* ---- tool calls -------------------------------------------------------------------------- */

/* A JSON syntax check (RFC 8259 grammar, no semantics), so that json_parse() only builds values
 * for text that is JSON: a string parameter like `tomorrow` is the common case, not an error. */
static const char *skip_ws(const char *s, const char *e) {
        while (s < e && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'))
                s++;
        return s;
}

static const char *skip_value(const char *s, const char *e, unsigned depth);

static const char *skip_string(const char *s, const char *e) {
        if (s >= e || *s != '"')
                return NULL;
        for (s++; s < e; s++) {
                unsigned char c = (unsigned char) *s;
                if (c == '"')
                        return s + 1;
                if (c < 0x20)
                        return NULL;
                if (c == '\\') {
                        if (++s >= e)
                                return NULL;
                        if (*s == 'u') {
                                for (int i = 0; i < 4; i++)
                                        if (++s >= e || !strchr("0123456789abcdefABCDEF", *s) || !*s)
                                                return NULL;
                        } else if (!strchr("\"\\/bfnrt", *s) || !*s)
                                return NULL;
                }
        }
        return NULL;
}

static const char *skip_digits(const char *s, const char *e) {
        const char *b = s;
        while (s < e && *s >= '0' && *s <= '9')
                s++;
        return s > b ? s : NULL;
}

static const char *skip_number(const char *s, const char *e) {
        if (s < e && *s == '-')
                s++;
        if (s < e && *s == '0')
                s++;
        else if (!(s = skip_digits(s, e)))
                return NULL;
        if (s < e && *s == '.' && !(s = skip_digits(s + 1, e)))
                return NULL;
        if (s < e && (*s == 'e' || *s == 'E')) {
                s++;
                if (s < e && (*s == '+' || *s == '-'))
                        s++;
                if (!(s = skip_digits(s, e)))
                        return NULL;
        }
        return s;
}

static const char *skip_value(const char *s, const char *e, unsigned depth) {
        if (depth > 200)
                return NULL;
        s = skip_ws(s, e);
        if (s >= e)
                return NULL;
        switch (*s) {
        case '"':
                return skip_string(s, e);
        case '{':
        case '[': {
                char close = *s == '{' ? '}' : ']';
                bool obj = *s == '{';
                s = skip_ws(s + 1, e);
                if (s < e && *s == close)
                        return s + 1;
                for (;;) {
                        if (obj) {
                                s = skip_string(skip_ws(s, e), e);
                                if (!s)
                                        return NULL;
                                s = skip_ws(s, e);
                                if (s >= e || *s != ':')
                                        return NULL;
                                s++;
                        }
                        if (!(s = skip_value(s, e, depth + 1)))
                                return NULL;
                        s = skip_ws(s, e);
                        if (s < e && *s == ',') {
                                s++;
                                continue;
                        }
                        if (s < e && *s == close)
                                return s + 1;
                        return NULL;
                }
        }
        case 't':
                return e - s >= 4 && memcmp(s, "true", 4) == 0 ? s + 4 : NULL;
        case 'f':
                return e - s >= 5 && memcmp(s, "false", 5) == 0 ? s + 5 : NULL;
        case 'n':
                return e - s >= 4 && memcmp(s, "null", 4) == 0 ? s + 4 : NULL;
        default:
                return skip_number(s, e);
        }
}

/* Parse s[0..n) when it is one JSON value (whitespace around allowed); NULL otherwise. */
static struct json_value *parse_json_quiet(const char *s, size_t n) {
        const char *e = s + n, *end = skip_value(s, e, 0);
        struct json_value *v = NULL;
        if (!end || skip_ws(end, e) != e)
                return NULL;
        char why[256]; /* not kept: not JSON means the text stays a string */
        if (json_parse(s, n, "tool call", &v, why, sizeof why) < 0)
                return NULL;
        return v;
}

static const char *find(const char *s, const char *e, const char *needle) {
        return memmem(s, (size_t) (e - s), needle, strlen(needle));
}

static bool starts(const char *s, const char *e, const char *prefix) {
        size_t l = strlen(prefix);
        return (size_t) (e - s) >= l && memcmp(s, prefix, l) == 0;
}

static bool schema_allows(const struct json_value *root, const struct json_value *s, const struct json_value *v,
                          unsigned depth);

/* v's JSON type is type name `name` (an integer is a number too). */
static bool type_is(const char *name, const struct json_value *v) {
        static const char *const names[] = {
                [JSON_NULL] = "null", [JSON_BOOL] = "boolean", [JSON_INT] = "integer", [JSON_DOUBLE] = "number",
                [JSON_STRING] = "string", [JSON_ARRAY] = "array", [JSON_OBJECT] = "object",
        };
        enum json_type t = json_type(v);
        return name && (streq(name, names[t]) || (t == JSON_INT && streq(name, "number")));
}

/* x and v are of one JSON type (numbers all one). */
static bool same_type(const struct json_value *x, const struct json_value *v) {
        enum json_type a = json_type(x), b = json_type(v);
        return a == b || ((a == JSON_INT || a == JSON_DOUBLE) && (b == JSON_INT || b == JSON_DOUBLE));
}

static bool any_allows(const struct json_value *root, const struct json_value *list, const struct json_value *v,
                       unsigned depth) {
        for (size_t i = 0; i < json_count(list); i++)
                if (schema_allows(root, json_array_at(list, i), v, depth + 1))
                        return true;
        return false;
}

/* The schema s (in the document root) allows a value of v's JSON type: by type, enum, const,
 * anyOf / oneOf / allOf, $ref and nullable; values and bounds are not checked. What it does not
 * say (no type, an unknown $ref) allows any type. */
static bool schema_allows(const struct json_value *root, const struct json_value *s, const struct json_value *v,
                          unsigned depth) {
        const struct json_value *x;
        if (depth > 32 || !s || json_type(s) != JSON_OBJECT)
                return true;
        if (json_type(v) == JSON_NULL && (x = json_object_get(s, "nullable")) && json_type(x) == JSON_BOOL &&
            json_bool(x))
                return true;
        if ((x = json_object_get(s, "$ref")) && json_string(x)) {
                const char *ref = json_string(x);
                if (streq(ref, "#"))
                        return schema_allows(root, root, v, depth + 1);
                if (strncmp(ref, "#/$defs/", 8) == 0)
                        return schema_allows(root, json_object_get(json_object_get(root, "$defs"), ref + 8), v, depth + 1);
                if (strncmp(ref, "#/definitions/", 14) == 0)
                        return schema_allows(root, json_object_get(json_object_get(root, "definitions"), ref + 14),
                                             v, depth + 1);
                return true;
        }
        if ((x = json_object_get(s, "const")))
                return same_type(x, v);
        if ((x = json_object_get(s, "enum")) && json_type(x) == JSON_ARRAY) {
                for (size_t i = 0; i < json_count(x); i++)
                        if (same_type(json_array_at(x, i), v))
                                return true;
                return false;
        }
        if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf")))
                if (!any_allows(root, x, v, depth))
                        return false;
        if ((x = json_object_get(s, "allOf")))
                for (size_t i = 0; i < json_count(x); i++)
                        if (!schema_allows(root, json_array_at(x, i), v, depth + 1))
                                return false;
        if ((x = json_object_get(s, "type"))) {
                if (json_type(x) == JSON_STRING)
                        return type_is(json_string(x), v);
                for (size_t i = 0; i < json_count(x); i++)
                        if (type_is(json_string(json_array_at(x, i)), v))
                                return true;
                return json_type(x) != JSON_ARRAY;
        }
        if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
            json_object_get(s, "required"))
                return json_type(v) == JSON_OBJECT;
        if (json_object_get(s, "items"))
                return json_type(v) == JSON_ARRAY;
        return true;
}

/* The schema of property key in a tool's parameters (NULL: not known, any type goes). */
static const struct json_value *param_schema(const struct json_value *params, const char *key) {
        const struct json_value *o = params, *ref = json_object_get(params, "$ref");
        if (json_string(ref) && strncmp(json_string(ref), "#/$defs/", 8) == 0)
                o = json_object_get(json_object_get(params, "$defs"), json_string(ref) + 8);
        else if (json_string(ref) && strncmp(json_string(ref), "#/definitions/", 14) == 0)
                o = json_object_get(json_object_get(params, "definitions"), json_string(ref) + 14);
        const struct json_value *s = json_object_get(json_object_get(o, "properties"), key);
        return s ? s : json_object_get(o, "additionalProperties");
}

/* `NAME<param_key>K</param_key><param_value>V</param_value>…` → name, arguments object, the
 * values typed by the tool's parameters schema when p has it. */
static int parse_param_call(const struct outparse *p, const char *s, const char *e, char **ret_name,
                            struct json_value **ret_args) {
        const char *k = find(s, e, "<param_key>");
        const char *ne = k ? k : e;
        const char *ns = skip_ws(s, ne);
        while (ne > ns && (ne[-1] == ' ' || ne[-1] == '\t' || ne[-1] == '\n' || ne[-1] == '\r'))
                ne--;
        if (ne == ns || memchr(ns, '<', (size_t) (ne - ns)) || memchr(ns, '>', (size_t) (ne - ns)) ||
            memchr(ns, '\n', (size_t) (ne - ns)) || memchr(ns, '\0', (size_t) (ne - ns)))
                return -EBADMSG;

        *ret_name = strndup(ns, (size_t) (ne - ns));
        if (!*ret_name)
                return -ENOMEM;
        const struct json_value *params = NULL;
        for (size_t i = 0; i < p->c.n_tool_names; i++)
                if (streq(p->tool_names[i], *ret_name))
                        params = p->tool_params[i];
        _cleanup_(json_freep) struct json_value *args = json_new_object();
        if (!args)
                return -ENOMEM;
        s = k ? k : e;
        for (;;) {
                s = skip_ws(s, e);
                if (s == e)
                        break;
                if (!starts(s, e, "<param_key>"))
                        return -EBADMSG;
                s += strlen("<param_key>");
                const char *ke = find(s, e, "</param_key>");
                if (!ke || ke == s || memchr(s, '\0', (size_t) (ke - s)))
                        return -EBADMSG;
                _cleanup_free_ char *key = strndup(s, (size_t) (ke - s));
                if (!key)
                        return -ENOMEM;
                s = skip_ws(ke + strlen("</param_key>"), e);
                if (!starts(s, e, "<param_value>"))
                        return -EBADMSG;
                s += strlen("<param_value>");
                const char *ve = find(s, e, "</param_value>");
                if (!ve)
                        return -EBADMSG;
                /* typed when it is JSON other than a string of a type the schema allows; else the
                 * raw text is the string */
                struct json_value *v = parse_json_quiet(s, (size_t) (ve - s));
                if (v && (json_type(v) == JSON_STRING ||
                          (params && !schema_allows(params, param_schema(params, key), v, 0)))) {
                        json_free(v);
                        v = NULL;
                }
                if (!v)
                        v = json_new_string(s, (size_t) (ve - s));
                if (!v)
                        return -ENOMEM;
                int r = json_object_set(args, key, v);
                if (r < 0)
                        return r;
                s = ve + strlen("</param_value>");
        }
        *ret_args = TAKE_PTR(args);
        return 0;
}

/* `{"name": …, "arguments": {…}}` ("arguments" may also be a string holding a JSON object). */
static int parse_json_call(const char *s, const char *e, char **ret_name, struct json_value **ret_args) {
        _cleanup_(json_freep) struct json_value *v = parse_json_quiet(s, (size_t) (e - s));
        if (!v || json_type(v) != JSON_OBJECT)
                return -EBADMSG;
        struct json_value *name = json_object_get(v, "name");
        if (!name || json_type(name) != JSON_STRING || json_string_len(name) == 0 ||
            strlen(json_string(name)) != json_string_len(name))
                return -EBADMSG;
        struct json_value *a = json_object_get(v, "arguments");
        _cleanup_(json_freep) struct json_value *args = NULL;
        if (!a)
                args = json_new_object();
        else if (json_type(a) == JSON_OBJECT || json_type(a) == JSON_STRING) {
                /* an object is re-parsed from its own text (json.h has no deep copy); a string
                 * must hold a JSON object (OpenAI's arguments style) */
                _cleanup_free_ char *txt = json_type(a) == JSON_OBJECT ? json_dump(a, JSON_COMPACT, 0) : NULL;
                if (json_type(a) == JSON_OBJECT && !txt)
                        return -ENOMEM;
                args = txt ? parse_json_quiet(txt, strlen(txt)) : parse_json_quiet(json_string(a), json_string_len(a));
                if (!args || json_type(args) != JSON_OBJECT)
                        return -EBADMSG;
        } else
                return -EBADMSG;
        if (!args)
                return -ENOMEM;
        *ret_name = strdup(json_string(name));
        if (!*ret_name)
                return -ENOMEM;
        *ret_args = TAKE_PTR(args);
        return 0;
}

/* The call's body is complete (closed: `</tool_call>` seen). Parsed (and of an offered tool,
 * when the caller named them): a TOOL_CALL event; not: the markers and body as content text. Returns 1 if a stop string in that text ended the turn. */
static int finish_tool(struct outparse *p, bool closed) {
        _cleanup_free_ char *name = NULL;
        _cleanup_(json_freep) struct json_value *args = NULL;
        const char *s = p->tool.p ? p->tool.p : "", *e = s + p->tool.n;
        const char *b = skip_ws(s, e);
        int r;

        p->in_tool = false;
        /* without `</tool_call>` only the self-delimiting JSON form is taken as a call */
        if (b < e && *b == '{')
                r = parse_json_call(s, e, &name, &args);
        else
                r = closed ? parse_param_call(p, s, e, &name, &args) : -EBADMSG;
        if (r == -ENOMEM)
                return r;
        if (r >= 0 && p->c.n_tool_names) {
                bool offered = false;
                for (size_t i = 0; i < p->c.n_tool_names && !offered; i++)
                        offered = streq(p->tool_names[i], name);
                if (!offered)
                        r = -ENOENT; /* a tool the caller did not offer: text, below */
        }
        if (r >= 0) {
                _cleanup_free_ char *txt = json_dump(args, 0, 0);
                if (!txt)
                        return -ENOMEM;
                struct outparse_event ev = { .type = OUTPARSE_EVENT_TOOL_CALL, .channel = OUTPARSE_TOOL_CALL,
                                             .tool_name = name, .tool_arguments = txt, .stop_id = -1 };
                p->tool.n = 0;
                return p->c.emit(&ev, p->c.userdata);
        }
        /* malformed: the user sees what the model wrote */
        /* a copy: channel_text() may run while p->tool is reused; the body may hold NUL bytes */
        size_t blen = p->tool.n;
        _cleanup_free_ char *body = malloc(blen + 1);
        if (!body)
                return -ENOMEM;
        memcpy(body, s, blen);
        p->tool.n = 0;
        if ((r = channel_text(p, "<tool_call>", strlen("<tool_call>"))) != 0)
                return r;
        if ((r = channel_text(p, body, blen)) != 0)
                return r;
        if (closed)
                return channel_text(p, "</tool_call>", strlen("</tool_call>"));
        return 0;
}

/* ---- feeding ----------------------------------------------------------------------------- */

static bool is_turn_end(const struct outparse *p, int32_t id) {
        for (size_t i = 0; i < ELEMENTSOF(p->turn_end); i++)
                if (p->turn_end[i] >= 0 && p->turn_end[i] == id)
                        return true;
        for (size_t i = 0; i < p->c.n_stop_ids; i++)
                if (p->stop_ids[i] == id)
                        return true;
        return false;
}

/* Everything held back goes out (the output ends without `</think>` or a closing marker). */
static int flush_all(struct outparse *p) {
        int r;
        if (p->in_tool && (r = finish_tool(p, false)) != 0)
                return r;
        if ((r = flush_pending(p)) < 0)
                return r;
        return flush_held_nl(p, true);
}

int outparse_feed(struct outparse *p, int32_t id, const char *text, size_t len) {
        int r;
        if (p->stopped)
                return 0;
        bool first = p->n_fed++ == 0;

        /* a registered special: its own text, whatever the detokenizer was told */
        if (tokenizer_id_special(p->t, id) >= 0)
                text = tokenizer_piece(p->t, id, &len);

        if (is_turn_end(p, id)) {
                r = flush_all(p);
                if (r != 0)
                        return r < 0 ? r : 0;
                return emit_stop(p, "stop", id, NULL);
        }

        if (p->channel == OUTPARSE_REASONING) {
                if (id == p->id_end_think) {
                        if ((r = flush_pending(p)) < 0)
                                return r;
                        flush_held_nl(p, false); /* docs/model.md §7: the `\n` before `</think>` is structure */
                        p->channel = OUTPARSE_CONTENT;
                        return 0;
                }
                p->n_reasoning++;
                if (id == p->id_think)
                        return 0;
                /* stop strings end the answer, not the thinking before it (a ReAct client's
                 * "\nObservation:" in the reasoning would otherwise leave an empty answer) */
                r = downstream(p, text, len);
                return r < 0 ? r : 0;
        }

        if (p->in_tool) {
                if (id == p->id_end_tool_call) {
                        r = finish_tool(p, true);
                        return r < 0 ? r : 0;
                }
                if (id == p->id_tool_call) {
                        /* a new call before this one closed: this one is malformed */
                        r = finish_tool(p, false);
                        if (r != 0)
                                return r < 0 ? r : 0;
                        p->in_tool = true;
                        return 0;
                }
                return buf_put(&p->tool, text, len);
        }

        if (id == p->id_tool_call && !p->c.no_tool_calls) {
                if ((r = flush_pending(p)) < 0)
                        return r;
                p->in_tool = true;
                p->tool.n = 0;
                return 0;
        }
        if (id == p->id_think) {
                if (first)
                        p->channel = OUTPARSE_REASONING;
                return 0;
        }
        if (id == p->id_end_think)
                return 0;
        r = channel_text(p, text, len);
        return r < 0 ? r : 0;
}

int outparse_feed_text(struct outparse *p, const char *text, size_t len) {
        int r;
        if (p->stopped || len == 0)
                return 0;
        if (p->in_tool)
                return buf_put(&p->tool, text, len);
        /* as outparse_feed: stop strings are matched in the answer only */
        r = p->channel == OUTPARSE_REASONING ? downstream(p, text, len) : channel_text(p, text, len);
        return r < 0 ? r : 0;
}

int outparse_finish(struct outparse *p, const char *finish_reason) {
        if (p->stopped)
                return 0;
        int r;
        /* cut by the output budget inside a call of a request that offered tools: a call
         * complete in its JSON form is still one; the rest of an unfinished call is dropped, not
         * shown as content (an API client would show the model's call syntax to its user, then
         * send it back in the history). Raw text (no tools offered) keeps it as text. */
        if (p->in_tool && finish_reason && streq(finish_reason, "length") && p->c.n_tool_names > 0) {
                const char *s = p->tool.p ? p->tool.p : "", *e = s + p->tool.n, *b = skip_ws(s, e);
                _cleanup_free_ char *name = NULL;
                _cleanup_(json_freep) struct json_value *args = NULL;
                if (b < e && *b == '{') {
                        r = parse_json_call(s, e, &name, &args);
                        if (r == -ENOMEM)
                                return r;
                }
                if (!args) {
                        p->in_tool = false;
                        p->tool.n = 0;
                }
        }
        r = flush_all(p);
        if (r != 0)
                return r < 0 ? r : 0;
        return emit_stop(p, finish_reason ? finish_reason : "stop", -1, NULL);
}
