/* SPDX-License-Identifier: MIT */
/* The Xing4 chat format (docs/model.md §7): the built-in Jinja template and a direct C renderer producing
 * the same bytes. The choices where the spec is silent are listed in chat_xing4.h; change both
 * renderers together (test-chat checks they agree). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "chat/chat_xing4.h"
#include "common/json.h"
#include "common/log.h"

/* Written from docs/model.md §7's two rendered examples; `-` on every tag so the output is exactly the
 * literal strings below whatever trim_blocks/lstrip_blocks are set to. */
const char chat_xing4_template[] =
        "{#- Xing4 chat format (xing4-model spec section 7), xing4d built-in template. -#}\n"
        "{%- macro visible_text(content) -%}\n"
        "{%- if content is string -%}{{ content }}\n"
        "{%- elif content is none or content is not defined -%}\n"
        "{%- elif content is iterable and content is not mapping -%}\n"
        "{%- for part in content -%}\n"
        "{%- if part is string -%}{{ part }}\n"
        "{%- elif part is mapping and part.type == 'text' -%}{{ part.text }}\n"
        "{%- endif -%}\n"
        "{%- endfor -%}\n"
        "{%- else -%}{{ raise_exception('message content must be a string, null or a list of "
        "parts') }}\n"
        "{%- endif -%}\n"
        "{%- endmacro -%}\n"
        "{%- macro render_tool_calls(tool_calls) -%}\n"
        "{%- for tc in tool_calls -%}\n"
        "{%- set fn = tc.function if tc.function is defined else tc -%}\n"
        "{%- if fn.arguments is mapping -%}\n"
        "<tool_call>{{ fn.name }}\n"
        "{%- for k, v in fn.arguments.items() -%}\n"
        "<param_key>{{ k }}</param_key><param_value>{{ v if v is string else v | tojson }}"
        "</param_value>\n"
        "{%- endfor -%}\n"
        "</tool_call>\n"
        "{%- else -%}\n"
        "<tool_call>{\"name\": {{ fn.name | tojson }}, \"arguments\": "
        "{{ fn.arguments if fn.arguments is string else '{}' }}}</tool_call>\n"
        "{%- endif -%}\n"
        "{%- endfor -%}\n"
        "{%- endmacro -%}\n"
        "{%- set ns = namespace(system='') -%}\n"
        "{%- if messages and messages[0].role == 'system' -%}\n"
        "{%- set ns.system = visible_text(messages[0].content) -%}\n"
        "{%- endif -%}\n"
        "<_system>{{ ns.system }}\n"
        "{%- if tools -%}\n"
        "{%- if ns.system -%}{{ '\\n\\n' }}{%- endif -%}\n"
        "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query. "
        "The available functions are:\\n<tools>\\n' -}}\n"
        "{%- for tool in tools -%}{{ tool | tojson }}{{ '\\n' }}{%- endfor -%}\n"
        "{{- '</tools>\\n\\nTo call a function, write "
        "<tool_call>NAME<param_key>KEY</param_key><param_value>VALUE</param_value></tool_call> "
        "with string values written raw and other values as JSON; several calls go back to back. "
        "Results come back as <tool_response>RESULT</tool_response>.' -}}\n"
        "{%- endif -%}\n"
        "{%- for message in messages -%}\n"
        "{%- if message.role == 'system' -%}\n"
        "{%- if not loop.first -%}<_system>{{ visible_text(message.content) }}{%- endif -%}\n"
        "{%- elif message.role == 'user' -%}\n"
        "<_user>{{ visible_text(message.content) }}\n"
        "{%- elif message.role == 'assistant' -%}\n"
        "<_bot></think>{{ visible_text(message.content) }}\n"
        "{%- if message.tool_calls -%}{{ render_tool_calls(message.tool_calls) }}{%- endif -%}\n"
        "{{- '<_end>\\n' -}}\n"
        "{%- elif message.role == 'tool' -%}\n"
        "{%- if loop.first or loop.previtem.role != 'tool' -%}<_user>{%- endif -%}\n"
        "<tool_response>{{ visible_text(message.content) }}</tool_response>\n"
        "{%- else -%}\n"
        "{{- raise_exception('unsupported message role: ' ~ message.role) -}}\n"
        "{%- endif -%}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}\n"
        "{%- if enable_thinking is defined and not enable_thinking -%}<_bot></think>\n"
        "{%- else -%}<_bot><think>{{ '\\n' }}\n"
        "{%- endif -%}\n"
        "{%- endif -%}\n";

/* A growing output buffer; on OOM it remembers the failure and the caller checks once. */
struct outbuf {
        char *data;
        size_t len, cap;
        bool oom;
        char *err; /* the caller's message buffer (error_set, common/log.h) */
        size_t err_size;
};

static void out_put(struct outbuf *o, const char *s, size_t n) {
        if (o->oom)
                return;
        if (o->len + n + 1 > o->cap) {
                size_t cap = MAX(o->cap * 2, o->len + n + 1);
                cap = MAX(cap, (size_t) 256);
                char *p = realloc(o->data, cap);
                if (!p) {
                        o->oom = true;
                        return;
                }
                o->data = p;
                o->cap = cap;
        }
        memcpy(o->data + o->len, s, n);
        o->len += n;
        o->data[o->len] = 0;
}

static void out_puts(struct outbuf *o, const char *s) {
        out_put(o, s, strlen(s));
}

/* Jinja (Python) truthiness of a JSON value; NULL = undefined = false. */
static bool json_truthy(const struct json_value *v) {
        if (!v)
                return false;
        switch (json_type(v)) {
        case JSON_NULL:
                return false;
        case JSON_BOOL:
                return json_bool(v);
        case JSON_INT:
                return json_int(v) != 0;
        case JSON_DOUBLE:
                return json_number(v) != 0.0;
        case JSON_STRING:
                return json_string_len(v) > 0;
        default:
                return json_count(v) > 0;
        }
}

static const char *member_string(const struct json_value *obj, const char *key) {
        if (!obj || json_type(obj) != JSON_OBJECT)
                return NULL;
        struct json_value *v = json_object_get(obj, key);
        return v && json_type(v) == JSON_STRING ? json_string(v) : NULL;
}

static int put_visible_text(struct outbuf *o, const struct json_value *content) {
        if (!content || json_type(content) == JSON_NULL)
                return 0;
        if (json_type(content) == JSON_STRING) {
                out_put(o, json_string(content), json_string_len(content));
                return 0;
        }
        if (json_type(content) != JSON_ARRAY)
                return error_set(o->err, o->err_size, EINVAL, "message content must be a string, null or a list of parts");
        for (size_t i = 0; i < json_count(content); i++) {
                struct json_value *part = json_array_at(content, i);
                if (json_type(part) == JSON_STRING)
                        out_put(o, json_string(part), json_string_len(part));
                else if (json_type(part) == JSON_OBJECT && streq(member_string(part, "type"), "text")) {
                        struct json_value *text = json_object_get(part, "text");
                        if (!text)
                                continue;
                        if (json_type(text) != JSON_STRING)
                                return error_set(o->err, o->err_size, EINVAL, "content part %zu: text must be a string", i);
                        out_put(o, json_string(text), json_string_len(text));
                }
        }
        return 0;
}

static int put_json(struct outbuf *o, const struct json_value *v) {
        _cleanup_free_ char *s = json_dump(v, 0, 0);
        if (!s)
                return error_set(o->err, o->err_size, ENOMEM, "tojson: out of memory");
        out_puts(o, s);
        return 0;
}

static int put_tool_calls(struct outbuf *o, const struct json_value *calls, size_t msg) {
        if (json_type(calls) != JSON_ARRAY)
                return error_set(o->err, o->err_size, EINVAL, "message %zu: tool_calls must be a list", msg);
        for (size_t i = 0; i < json_count(calls); i++) {
                const struct json_value *tc = json_array_at(calls, i), *fn = tc;
                if (json_type(tc) != JSON_OBJECT)
                        return error_set(o->err, o->err_size, EINVAL, "message %zu: tool call %zu must be an object", msg, i);
                if (json_object_get(tc, "function"))
                        fn = json_object_get(tc, "function");
                struct json_value *name = json_type(fn) == JSON_OBJECT ? json_object_get(fn, "name") : NULL;
                if (!name || json_type(name) != JSON_STRING)
                        return error_set(o->err, o->err_size, EINVAL, "message %zu: tool call %zu: function name must be a string",
                                               msg, i);
                struct json_value *args = json_object_get(fn, "arguments");
                if (args && json_type(args) == JSON_OBJECT) {
                        out_puts(o, "<tool_call>");
                        out_put(o, json_string(name), json_string_len(name));
                        for (size_t k = 0; k < json_count(args); k++) {
                                struct json_value *v = json_object_value_at(args, k);
                                out_puts(o, "<param_key>");
                                out_puts(o, json_object_key_at(args, k));
                                out_puts(o, "</param_key><param_value>");
                                if (json_type(v) == JSON_STRING)
                                        out_put(o, json_string(v), json_string_len(v));
                                else {
                                        int r = put_json(o, v);
                                        if (r < 0)
                                                return r;
                                }
                                out_puts(o, "</param_value>");
                        }
                        out_puts(o, "</tool_call>");
                } else {
                        out_puts(o, "<tool_call>{\"name\": ");
                        int r = put_json(o, name);
                        if (r < 0)
                                return r;
                        out_puts(o, ", \"arguments\": ");
                        if (args && json_type(args) == JSON_STRING)
                                out_put(o, json_string(args), json_string_len(args));
                        else
                                out_puts(o, "{}");
                        out_puts(o, "}</tool_call>");
                }
        }
        return 0;
}

int chat_xing4_render(const struct json_value *context, char **ret, char *err, size_t err_size) {
        struct outbuf o = { .err = err, .err_size = err_size };
        int r;

        if (!context || json_type(context) != JSON_OBJECT)
                return error_set(err, err_size, EINVAL, "chat context must be a JSON object");
        struct json_value *messages = json_object_get(context, "messages");
        struct json_value *tools = json_object_get(context, "tools");
        size_t n = 0;
        if (json_truthy(messages)) {
                if (json_type(messages) != JSON_ARRAY)
                        return error_set(err, err_size, EINVAL, "chat context: messages must be a list");
                n = json_count(messages);
        }
        for (size_t i = 0; i < n; i++)
                if (json_type(json_array_at(messages, i)) != JSON_OBJECT)
                        return error_set(err, err_size, EINVAL, "message %zu must be an object", i);

        out_puts(&o, "<_system>");
        bool system_text = false;
        if (n > 0 && streq(member_string(json_array_at(messages, 0), "role"), "system")) {
                size_t before = o.len;
                r = put_visible_text(&o, json_object_get(json_array_at(messages, 0), "content"));
                if (r < 0)
                        goto fail;
                system_text = o.len > before;
        }
        if (json_truthy(tools)) {
                if (json_type(tools) != JSON_ARRAY) {
                        r = error_set(err, err_size, EINVAL, "chat context: tools must be a list");
                        goto fail;
                }
                if (system_text)
                        out_puts(&o, "\n\n");
                out_puts(&o, "# Tools\n\nYou may call one or more functions to assist with the user query. "
                             "The available functions are:\n<tools>\n");
                for (size_t i = 0; i < json_count(tools); i++) {
                        r = put_json(&o, json_array_at(tools, i));
                        if (r < 0)
                                goto fail;
                        out_puts(&o, "\n");
                }
                out_puts(&o, "</tools>\n\nTo call a function, write "
                             "<tool_call>NAME<param_key>KEY</param_key><param_value>VALUE</param_value></tool_call> "
                             "with string values written raw and other values as JSON; several calls go back to "
                             "back. Results come back as <tool_response>RESULT</tool_response>.");
        }
        for (size_t i = 0; i < n; i++) {
                struct json_value *m = json_array_at(messages, i);
                const char *role = member_string(m, "role");
                struct json_value *content = json_object_get(m, "content");
                if (streq(role, "system")) {
                        if (i > 0) {
                                out_puts(&o, "<_system>");
                                r = put_visible_text(&o, content);
                        } else
                                r = 0;
                } else if (streq(role, "user")) {
                        out_puts(&o, "<_user>");
                        r = put_visible_text(&o, content);
                } else if (streq(role, "assistant")) {
                        out_puts(&o, "<_bot></think>");
                        r = put_visible_text(&o, content);
                        struct json_value *calls = json_object_get(m, "tool_calls");
                        if (r >= 0 && json_truthy(calls))
                                r = put_tool_calls(&o, calls, i);
                        out_puts(&o, "<_end>\n");
                } else if (streq(role, "tool")) {
                        if (i == 0 || !streq(member_string(json_array_at(messages, i - 1), "role"), "tool"))
                                out_puts(&o, "<_user>");
                        out_puts(&o, "<tool_response>");
                        r = put_visible_text(&o, content);
                        out_puts(&o, "</tool_response>");
                } else
                        r = error_set(err, err_size, EINVAL, "unsupported message role: %s", role ? role : "");
                if (r < 0)
                        goto fail;
        }
        if (json_truthy(json_object_get(context, "add_generation_prompt"))) {
                struct json_value *thinking = json_object_get(context, "enable_thinking");
                if (thinking && !json_truthy(thinking))
                        out_puts(&o, "<_bot></think>");
                else
                        out_puts(&o, "<_bot><think>\n");
        }
        if (o.oom) {
                r = error_set(err, err_size, ENOMEM, "chat render: out of memory");
                goto fail;
        }
        if (!o.data)
                out_puts(&o, "");
        *ret = o.data;
        return 0;
fail:
        free(o.data);
        return r;
}
