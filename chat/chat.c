/* SPDX-License-Identifier: MIT */
/* Chat templates: the public face of the Jinja interpreter (jinja_parse.c, jinja_eval.c) and the
 * context the daemon renders with. */
#include <errno.h>
#include <string.h>

#include "chat/chat.h"
#include "chat/jinja.h"
#include "common/json.h"
#include "common/log.h"

struct chat_template {
        struct jinja_template *tmpl;
        struct jinja_limits limits;
};

static const struct jinja_limits default_limits = {
        .max_steps = 10 * 1000 * 1000,
        .max_output = 16u << 20,
        .max_depth = 100,
        .max_memory = 512u << 20,
};

int chat_template_parse(const char *text, struct chat_template **ret, char *err, size_t err_size) {
        return chat_template_parse_len(text, strlen(text), ret, err, err_size);
}

int chat_template_parse_len(const char *text, size_t len, struct chat_template **ret, char *err,
                            size_t err_size) {
        struct chat_template *t = calloc(1, sizeof(*t));
        if (!t)
                return error_set(err, err_size, ENOMEM, "chat template: out of memory");
        int r = jinja_parse(text, len, &t->tmpl, err, err_size);
        if (r < 0) {
                free(t);
                return r;
        }
        t->limits = default_limits;
        *ret = t;
        return 0;
}

void chat_template_free(struct chat_template *t) {
        if (!t)
                return;
        jinja_template_free(t->tmpl);
        free(t);
}

void chat_template_set_limits(struct chat_template *t, const struct chat_limits *l) {
        t->limits = (struct jinja_limits) {
                .max_steps = l->max_steps ? l->max_steps : default_limits.max_steps,
                .max_output = l->max_output ? l->max_output : default_limits.max_output,
                .max_depth = l->max_depth ? l->max_depth : default_limits.max_depth,
                .max_memory = l->max_memory ? l->max_memory : default_limits.max_memory,
        };
}

int chat_template_render_len(const struct chat_template *t, const struct json_value *context, char **ret,
                             size_t *ret_len, char *err, size_t err_size) {
        return jinja_render(t->tmpl, context, &t->limits, ret, ret_len, err, err_size);
}

int chat_template_render(const struct chat_template *t, const struct json_value *context, char **ret,
                         char *err, size_t err_size) {
        return jinja_render(t->tmpl, context, &t->limits, ret, NULL, err, err_size);
}

/* Deep copy through serialization: json.h has no clone, and contexts are small. */
static struct json_value *json_clone(const struct json_value *v) {
        _cleanup_free_ char *s = json_dump(v, JSON_COMPACT, 0);
        struct json_value *c = NULL;
        if (!s || json_parse(s, strlen(s), "clone", &c, NULL, 0) < 0)
                return NULL;
        return c;
}

static int fix_tool_calls(struct json_value *msg, size_t i, char *err, size_t err_size) {
        struct json_value *calls = json_object_get(msg, "tool_calls");
        if (!calls || json_type(calls) == JSON_NULL)
                return 0;
        if (json_type(calls) != JSON_ARRAY)
                return error_set(err, err_size, EINVAL, "messages[%zu].tool_calls: a list expected", i);
        for (size_t k = 0; k < json_count(calls); k++) {
                struct json_value *tc = json_array_at(calls, k);
                if (json_type(tc) != JSON_OBJECT)
                        return error_set(err, err_size, EINVAL, "messages[%zu].tool_calls[%zu]: an object expected", i, k);
                /* OpenAI's {"function": {"name", "arguments"}} or the flat {"name", "arguments"} */
                struct json_value *fn = json_object_get(tc, "function");
                if (!fn)
                        fn = tc;
                if (json_type(fn) != JSON_OBJECT)
                        continue;
                struct json_value *args = json_object_get(fn, "arguments");
                if (!args || json_type(args) != JSON_STRING)
                        continue;
                struct json_value *parsed = NULL;
                char why[256]; /* not kept: text that is not JSON is no error here */
                int r = json_parse(json_string(args), json_string_len(args), "arguments", &parsed, why,
                                   sizeof why);
                if (r < 0)
                        continue; /* not JSON: templates get the text as is */
                if (json_type(parsed) != JSON_OBJECT) {
                        json_free(parsed);
                        continue;
                }
                r = json_object_set(fn, "arguments", parsed);
                if (r < 0) {
                        json_free(parsed);
                        return error_set(err, err_size, r, "messages[%zu].tool_calls[%zu]: out of memory", i, k);
                }
        }
        return 0;
}

int chat_context_build(const struct json_value *messages, const struct json_value *tools, bool add_generation_prompt,
                       int enable_thinking, const char *bos_token, const char *eos_token, struct json_value **ret,
                       char *err, size_t err_size) {
        _cleanup_(json_freep) struct json_value *ctx = json_new_object();
        if (!ctx)
                return error_set(err, err_size, ENOMEM, "chat context: out of memory");
        if (!messages || json_type(messages) != JSON_ARRAY)
                return error_set(err, err_size, EINVAL, "chat context: messages must be a list");
        struct json_value *msgs = json_clone(messages);
        if (!msgs || json_object_set(ctx, "messages", msgs) < 0) {
                json_free(msgs);
                return error_set(err, err_size, ENOMEM, "chat context: out of memory");
        }
        for (size_t i = 0; i < json_count(msgs); i++) {
                struct json_value *m = json_array_at(msgs, i);
                if (json_type(m) != JSON_OBJECT)
                        return error_set(err, err_size, EINVAL, "messages[%zu]: an object expected", i);
                struct json_value *role = json_object_get(m, "role");
                if (!role || json_type(role) != JSON_STRING)
                        return error_set(err, err_size, EINVAL, "messages[%zu].role: a string expected", i);
                const char *rs = json_string(role);
                if (!streq(rs, "system") && !streq(rs, "user") && !streq(rs, "assistant") && !streq(rs, "tool"))
                        return error_set(err, err_size, EINVAL, "messages[%zu].role: system, user, assistant or tool expected, got '%s'",
                                               i, rs);
                int r = fix_tool_calls(m, i, err, err_size);
                if (r < 0)
                        return r;
        }
        if (tools && json_type(tools) != JSON_NULL) {
                if (json_type(tools) != JSON_ARRAY)
                        return error_set(err, err_size, EINVAL, "chat context: tools must be a list");
                if (json_count(tools) > 0) {
                        struct json_value *tc = json_clone(tools);
                        if (!tc || json_object_set(ctx, "tools", tc) < 0) {
                                json_free(tc);
                                return error_set(err, err_size, ENOMEM, "chat context: out of memory");
                        }
                }
        }
        struct json_value *v;
        if (!(v = json_new_bool(add_generation_prompt)) || json_object_set(ctx, "add_generation_prompt", v) < 0)
                return error_set(err, err_size, ENOMEM, "chat context: out of memory");
        if (enable_thinking >= 0 &&
            (!(v = json_new_bool(enable_thinking > 0)) || json_object_set(ctx, "enable_thinking", v) < 0))
                return error_set(err, err_size, ENOMEM, "chat context: out of memory");
        if (bos_token && (!(v = json_new_string(bos_token, strlen(bos_token))) || json_object_set(ctx, "bos_token", v) < 0))
                return error_set(err, err_size, ENOMEM, "chat context: out of memory");
        if (eos_token && (!(v = json_new_string(eos_token, strlen(eos_token))) || json_object_set(ctx, "eos_token", v) < 0))
                return error_set(err, err_size, ENOMEM, "chat context: out of memory");
        *ret = TAKE_PTR(ctx);
        return 0;
}
