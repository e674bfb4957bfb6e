/* SPDX-License-Identifier: MIT */
/* Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) ⇄ libx4client.
 *
 * A request becomes the protocol's chat: the system text first, then each message; a user
 * message's tool_result blocks become "tool" messages (named by the tool_use they answer), an
 * assistant's thinking blocks its reasoning and its tool_use blocks its tool calls. Bad values are
 * answered 400 naming the field, in Anthropic's error shape (main.c picks the shape by path).
 *
 * Streaming follows the event sequence the SDKs parse: message_start, ping, then per content
 * block content_block_start / content_block_delta (text_delta, thinking_delta, input_json_delta) /
 * content_block_stop, then message_delta (stop_reason, usage) and message_stop. */
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"
#include "common/macro.h"


/* The text of a string or an array of text blocks; other block types are refused by name. */
/* Blocks the model cannot read, as text it can: an image or a binary document becomes a note that
 * it was there (clients resend the whole history, so refusing one screenshot a tool returned would
 * fail every later turn of the conversation); a text document, a search result its text. 1 when
 * the block was one of those (appended to out), 0 when not, -1 out of memory. */
static int unreadable_block(json_t *b, const char *type, struct sbuf *out) {
        json_t *src = json_object_get(b, "source");
        const char *media = json_string_value(json_object_get(src, "media_type"));
        const char *stype = json_string_value(json_object_get(src, "type"));
        char note[160];
        int n;

        if (streq(type, "image") || streq(type, "document")) {
                json_t *data = json_object_get(src, "data");
                if (streq(type, "document") && streq(stype, "text") && json_is_string(data)) {
                        if (out->len > 0 && sbuf_add(out, "\n", 1) < 0)
                                return -1;
                        return sbuf_add_text(out, json_string_value(data), json_string_length(data)) < 0 ? -1 : 1;
                }
                n = snprintf(note, sizeof note, "[%s omitted%s%.60s: this model reads text only]", type,
                             media ? ": " : "", media ? media : "");
        } else if (streq(type, "search_result")) {
                const char *title = json_string_value(json_object_get(b, "title"));
                json_t *c = json_object_get(b, "content"), *t;
                size_t i;
                if (title && ((out->len > 0 && sbuf_add(out, "\n", 1) < 0) ||
                              sbuf_add_text(out, title, strlen(title)) < 0))
                        return -1;
                json_array_foreach(c, i, t) {
                        json_t *tx = json_object_get(t, "text");
                        if (json_is_string(tx) && ((out->len > 0 && sbuf_add(out, "\n", 1) < 0) ||
                                                   sbuf_add_text(out, json_string_value(tx), json_string_length(tx)) < 0))
                                return -1;
                }
                return 1;
        } else if (streq(type, "container_upload")) {
                n = snprintf(note, sizeof note, "[file upload omitted: this model reads text only]");
        } else if (streq(type, "server_tool_use") || streq(type, "web_search_tool_result") ||
                   streq(type, "web_fetch_tool_result") || streq(type, "code_execution_tool_result") ||
                   streq(type, "mcp_tool_use") || streq(type, "mcp_tool_result")) {
                return 1; /* another server's tool turn: nothing this model ran or can read */
        } else
                return 0;
        if (out->len > 0 && sbuf_add(out, "\n", 1) < 0)
                return -1;
        return sbuf_add(out, note, (size_t) n) < 0 ? -1 : 1;
}

static int blocks_text(json_t *v, const char *param, struct sbuf *out, struct api_error *e) {
        if (json_is_string(v))
                return sbuf_add_text(out, json_string_value(v), json_string_length(v)) < 0 ? OOM(e) : 0;
        if (!json_is_array(v))
                return api_bad(e, param, "a string or an array of text blocks expected, got %s", api_type_name(v));
        size_t i;
        json_t *b;
        json_array_foreach(v, i, b) {
                char p[96];
                snprintf(p, sizeof p, "%s[%zu]", param, i);
                const char *type = json_string_value(json_object_get(b, "type"));
                if (!json_is_object(b) || !type)
                        return api_bad(e, p, "an object with a \"type\" expected");
                if (!streq(type, "text")) {
                        int u = unreadable_block(b, type, out);
                        if (u < 0)
                                return OOM(e);
                        if (u > 0)
                                continue;
                        return api_fail(e, 400, "invalid_request_error", "unsupported_content_type", p,
                                        "%s: content block type \"%s\" is not supported here; the model reads "
                                        "\"text\" blocks (images and documents become a note)", p, type);
                }
                json_t *t = json_object_get(b, "text");
                if (!json_is_string(t))
                        return api_bad(e, p, "\"text\" must be a string");
                if (out->len > 0 && sbuf_add(out, "\n", 1) < 0)
                        return OOM(e);
                if (sbuf_add_text(out, json_string_value(t), json_string_length(t)) < 0)
                        return OOM(e);
        }
        return 0;
}

static int conv_push(json_t *conv, const char *role, struct sbuf *text, const char *reasoning, json_t *calls,
                     const char *name) {
        json_t *m = json_pack("{s:s, s:s}", "role", role, "content", text->s ? text->s : "");
        if (!m)
                return -1;
        if (reasoning)
                json_object_set_new(m, "reasoning", json_string(reasoning));
        if (calls && json_array_size(calls) > 0)
                json_object_set(m, "tool_calls", calls);
        if (name)
                json_object_set_new(m, "name", json_string(name));
        free(text->s);
        *text = (struct sbuf) { 0 };
        return json_array_append_new(conv, m);
}

static int refuse_block(const char *type, const char *p, struct api_error *e) {
        return api_bad(e, p, "unknown content block type \"%s\"", type);
}

static int parse_user(json_t *content, size_t i, json_t *conv, json_t *names, struct api_error *e) {
        struct sbuf text = { 0 };
        bool pushed = false; /* a tool result went in as a turn of its own */
        size_t j;
        json_t *b;
        char p[96];
        json_array_foreach(content, j, b) {
                snprintf(p, sizeof p, "messages[%zu].content[%zu]", i, j);
                const char *type = json_string_value(json_object_get(b, "type"));
                if (!json_is_object(b) || !type) {
                        free(text.s);
                        return api_bad(e, p, "an object with a \"type\" expected");
                }
                if (streq(type, "text")) {
                        json_t *t = json_object_get(b, "text");
                        if (!json_is_string(t)) {
                                free(text.s);
                                return api_bad(e, p, "\"text\" must be a string");
                        }
                        if ((text.len > 0 && sbuf_add(&text, "\n", 1) < 0) ||
                            sbuf_add_text(&text, json_string_value(t), json_string_length(t)) < 0) {
                                free(text.s);
                                return OOM(e);
                        }
                } else if (streq(type, "tool_result")) {
                        const char *id = json_string_value(json_object_get(b, "tool_use_id"));
                        if (!id) {
                                free(text.s);
                                snprintf(p, sizeof p, "messages[%zu].content[%zu].tool_use_id", i, j);
                                return api_bad(e, p, "required (the id of the tool_use it answers)");
                        }
                        if (text.s && conv_push(conv, "user", &text, NULL, NULL, NULL) < 0)
                                return OOM(e);
                        struct sbuf out = { 0 };
                        json_t *c = json_object_get(b, "content");
                        json_t *is_error = json_object_get(b, "is_error");
                        if (json_is_true(is_error) && sbuf_add(&out, "Error: ", 7) < 0)
                                return OOM(e);
                        snprintf(p, sizeof p, "messages[%zu].content[%zu].content", i, j);
                        if (c && !json_is_null(c) && blocks_text(c, p, &out, e) < 0) {
                                free(out.s);
                                return -1;
                        }
                        if (conv_push(conv, "tool", &out, NULL, NULL, json_string_value(json_object_get(names, id))) < 0)
                                return OOM(e);
                        pushed = true;
                } else {
                        int u = unreadable_block(b, type, &text);
                        if (u < 0) {
                                free(text.s);
                                return OOM(e);
                        }
                        if (u > 0)
                                continue;
                        free(text.s);
                        return refuse_block(type, p, e);
                }
        }
        /* a turn whose blocks all went (another server's tool results): still a user turn, so the
         * answer is not taken as a continuation of the assistant's last message */
        if ((text.s || !pushed) && conv_push(conv, "user", &text, NULL, NULL, NULL) < 0)
                return OOM(e);
        return 0;
}

static int parse_assistant(json_t *content, size_t i, json_t *conv, json_t *names, struct api_error *e) {
        struct sbuf text = { 0 }, reasoning = { 0 };
        _cleanup_(json_decrefp) json_t *calls = json_array();
        size_t j;
        json_t *b;
        char p[96];
        int ret = 0;
        json_array_foreach(content, j, b) {
                snprintf(p, sizeof p, "messages[%zu].content[%zu]", i, j);
                const char *type = json_string_value(json_object_get(b, "type"));
                if (!json_is_object(b) || !type) {
                        ret = api_bad(e, p, "an object with a \"type\" expected");
                        break;
                }
                if (streq(type, "text") || streq(type, "thinking")) {
                        bool th = streq(type, "thinking");
                        json_t *t = json_object_get(b, th ? "thinking" : "text");
                        struct sbuf *to = th ? &reasoning : &text;
                        if (!json_is_string(t)) {
                                ret = api_bad(e, p, "\"%s\" must be a string", th ? "thinking" : "text");
                                break;
                        }
                        if ((to->len > 0 && sbuf_add(to, "\n", 1) < 0) ||
                            sbuf_add_text(to, json_string_value(t), json_string_length(t)) < 0) {
                                ret = OOM(e);
                                break;
                        }
                } else if (streq(type, "redacted_thinking")) {
                        continue; /* encrypted by another server: nothing this model can read */
                } else if (unreadable_block(b, type, &text) != 0) {
                        continue; /* a server tool's turn, or a note (out of memory: the text is short) */
                } else if (streq(type, "tool_use")) {
                        const char *id = json_string_value(json_object_get(b, "id"));
                        const char *name = json_string_value(json_object_get(b, "name"));
                        json_t *input = json_object_get(b, "input");
                        if (!id || !name) {
                                ret = api_bad(e, p, "a tool_use block needs \"id\" and \"name\" strings");
                                break;
                        }
                        if (input && !json_is_null(input) && !json_is_object(input)) {
                                snprintf(p, sizeof p, "messages[%zu].content[%zu].input", i, j);
                                ret = api_bad(e, p, "an object expected, got %s", api_type_name(input));
                                break;
                        }
                        char *args = input && !json_is_null(input) ? json_dumps(input, JSON_COMPACT) : strdup("{}");
                        if (!args || json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                                                                           "function", "function", "name", name,
                                                                           "arguments", args)) < 0 ||
                            json_object_set_new(names, id, json_string(name)) < 0) {
                                free(args);
                                ret = OOM(e);
                                break;
                        }
                        free(args);
                } else {
                        ret = refuse_block(type, p, e);
                        break;
                }
        }
        if (ret == 0 && json_array_size(calls) > API_MAX_TOOL_CALLS) {
                snprintf(p, sizeof p, "messages[%zu].content", i);
                ret = api_bad(e, p, "at most %d tool_use blocks per message", API_MAX_TOOL_CALLS);
        }
        if (ret == 0 && conv_push(conv, "assistant", &text, reasoning.s, calls, NULL) < 0)
                ret = OOM(e);
        free(text.s);
        free(reasoning.s);
        return ret;
}

/* The input schemas Anthropic publishes for its client tools (bash_*, text_editor_*), which a
 * request names by type alone; NULL for any other type. */
static json_t *client_tool_schema(const char *type) {
        if (strncmp(type, "bash_", 5) == 0)
                return json_pack("{s:s, s:{s:s, s:{s:{s:s, s:s}, s:{s:s, s:s}}}}", "description",
                                 "Run a command in a persistent bash shell; restart: true restarts the shell.",
                                 "input_schema", "type", "object", "properties", "command", "type", "string",
                                 "description", "The bash command to run", "restart", "type", "boolean",
                                 "description", "Restart the shell");
        if (strncmp(type, "text_editor_", 12) == 0)
                return json_pack("{s:s, s:{s:s, s:{s:{s:s, s:[s,s,s,s,s]}, s:{s:s}, s:{s:s}, s:{s:s}, s:{s:s}, "
                                 "s:{s:s}, s:{s:s, s:{s:s}}}, s:[s,s]}}",
                                 "description",
                                 "View, create and edit text files: view a file or folder (view_range: [start, "
                                 "end] lines), create a file (file_text), replace old_str by new_str exactly once "
                                 "(str_replace), insert new_str after line insert_line (insert), undo_edit.",
                                 "input_schema", "type", "object", "properties", "command", "type", "string", "enum",
                                 "view", "create", "str_replace", "insert", "undo_edit", "path", "type", "string",
                                 "file_text", "type", "string", "old_str", "type", "string", "new_str", "type",
                                 "string", "insert_line", "type", "integer", "view_range", "type", "array", "items",
                                 "type", "integer", "required", "command", "path");
        return NULL;
}

static int parse_tools(json_t *root, struct api_request *r, bool *send, json_t **out, struct api_error *e) {
        json_t *tools, *list;
        size_t i;
        json_t *t;
        if (api_tools_begin(root, "an array of {name, description, input_schema} expected", &tools, out, e) < 0)
                return -1;
        if (!tools)
                return 0;
        list = *out;
        json_array_foreach(tools, i, t) {
                char p[64];
                snprintf(p, sizeof p, "tools[%zu]", i);
                if (!json_is_object(t))
                        return api_bad(e, p, "an object expected");
                const char *type = json_string_value(json_object_get(t, "type"));
                json_t *name = json_object_get(t, "name");
                json_t *schema = json_object_get(t, "input_schema");
                json_t *desc = json_object_get(t, "description");
                _cleanup_(json_decrefp) json_t *builtin = NULL;
                if (type && !streq(type, "custom")) {
                        /* Anthropic-defined client tools (the client runs them; the API only
                         * knows their schema): given to the model with that schema */
                        builtin = client_tool_schema(type);
                        snprintf(p, sizeof p, "tools[%zu].type", i);
                        if (!builtin)
                                return api_fail(e, 400, "invalid_request_error", "unsupported_tool", p,
                                                "%s: \"%s\" is not a tool xing4d can offer: server tools (web search, "
                                                "web fetch, code execution) run on Anthropic's servers and computer use "
                                                "needs screenshots; client tools are {name, description, input_schema}, "
                                                "and bash_* and text_editor_* are understood", p, type);
                        schema = json_object_get(builtin, "input_schema");
                        if (!desc || json_is_null(desc))
                                desc = json_object_get(builtin, "description");
                }
                if (!json_is_string(name) || json_string_length(name) == 0) {
                        snprintf(p, sizeof p, "tools[%zu].name", i);
                        return api_bad(e, p, "required (a non-empty string)");
                }
                if (!json_is_object(schema)) {
                        snprintf(p, sizeof p, "tools[%zu].input_schema", i);
                        return api_bad(e, p, "required (a JSON Schema object)");
                }
                if (desc && !json_is_null(desc) && !json_is_string(desc)) {
                        snprintf(p, sizeof p, "tools[%zu].description", i);
                        return api_bad(e, p, "a string expected, got %s", api_type_name(desc));
                }
                json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
                if (fn && json_is_string(desc))
                        json_object_set(fn, "description", desc);
                /* strict (structured outputs): the daemon holds the input to the schema exactly */
                if (fn && json_is_true(json_object_get(t, "strict")))
                        json_object_set_new(fn, "strict", json_true());
                if (!fn || json_array_append_new(list, json_pack("{s:s, s:o}", "type", "function", "function", fn)) < 0)
                        return OOM(e);
        }
        (void) r;
        *send = json_array_size(list) > 0;
        return 0;
}

static int parse_tool_choice(json_t *root, json_t *tools, bool *send, struct api_request *r, struct api_error *e) {
        json_t *tc = json_object_get(root, "tool_choice");
        if (!tc || json_is_null(tc))
                return 0;
        if (!json_is_object(tc))
                return api_bad(e, "tool_choice", "an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"} "
                               "expected, got %s", api_type_name(tc));
        const char *type = json_string_value(json_object_get(tc, "type"));
        json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
        if (dp && !json_is_null(dp) && !json_is_boolean(dp))
                return api_bad(e, "tool_choice.disable_parallel_tool_use", "true or false expected");
        r->one_call = json_is_true(dp); /* at most one tool_use block (main.c:on_chunk) */
        if (streq(type, "auto"))
                return 0;
        if (streq(type, "none")) {
                /* the tools stay in the prompt, a call is answered as text (api_call_text) */
                r->no_calls = true;
                return 0;
        }
        if (!streq(type, "any") && !streq(type, "tool"))
                return api_bad(e, "tool_choice.type", "\"auto\", \"any\", \"tool\" or \"none\" expected");
        if (!*send)
                return api_bad(e, "tool_choice", "\"%s\" forces a tool call and needs a non-empty \"tools\"", type);
        const char *name = NULL;
        if (streq(type, "tool")) {
                name = json_string_value(json_object_get(tc, "name"));
                if (!name || !*name)
                        return api_bad(e, "tool_choice.name", "required with \"type\": \"tool\"");
                if (api_tool_named(tools, name, "tool_choice.name", e) < 0)
                        return -1;
        }
        return api_force_tool(r, name, e);
}

int am_parse(json_t *root, bool count_only, struct api_request *r, struct api_error *e) {
        json_int_t iv;
        bool set;
        /* MCP servers Anthropic's API connects to (the mcp-client beta) are server tools like web
         * search, refused by name too: ignoring them would answer without the tools asked for */
        json_t *mcp = json_object_get(root, "mcp_servers");
        if (mcp && !json_is_null(mcp) && !(json_is_array(mcp) && json_array_size(mcp) == 0))
                return api_fail(e, 400, "invalid_request_error", "unsupported_parameter", "mcp_servers",
                                "mcp_servers: remote MCP servers are connected by Anthropic's servers and are not "
                                "supported by xing4d; run the MCP client on your side and pass its tools as "
                                "client tools {name, description, input_schema}");
        if (!count_only) {
                if (api_get_bool(root, "stream", &r->stream, e) < 0)
                        return -1;
                if (api_get_int(root, "max_tokens", 1, UINT32_MAX, &iv, &set, e) < 0)
                        return -1;
                if (!set)
                        return api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "max_tokens",
                                        "max_tokens: required (the most tokens to generate, thinking included)");
                x4_request_set_max_tokens(r->req, (uint32_t) iv);
                static const struct api_sampling_param params[] = {
                        { "temperature", 0, 1, false, x4_request_set_temperature },
                        { "top_p", 0, 1, true, x4_request_set_top_p },
                };
                if (api_get_sampling(root, params, sizeof params / sizeof params[0], r->req, e) < 0 ||
                    api_get_top_k(root, r->req, e) < 0)
                        return -1;
                json_t *stop = json_object_get(root, "stop_sequences");
                if (stop && !json_is_null(stop)) {
                        size_t i;
                        json_t *s;
                        if (!json_is_array(stop))
                                return api_bad(e, "stop_sequences", "an array of strings expected, got %s",
                                               api_type_name(stop));
                        json_array_foreach(stop, i, s) {
                                if (!json_is_string(s) || json_string_length(s) == 0 ||
                                    strlen(json_string_value(s)) != json_string_length(s))
                                        return api_bad(e, "stop_sequences", "entry %zu: a non-empty string expected", i);
                                if (x4_request_add_stop(r->req, json_string_value(s)) < 0)
                                        return OOM(e);
                        }
                }
        } else {
                /* the prompt's size is what the daemon reports once it has rendered and tokenized
                 * it (count_only, protocol 1.4: nothing generated, no context check); a 1.3
                 * daemon ignores that and generates one token */
                x4_request_set_count_only(r->req, true);
                x4_request_set_max_tokens(r->req, 1);
                x4_request_set_temperature(r->req, 0);
        }
        if (api_check_metadata(root, e) < 0)
                return -1;

        /* thinking: off unless asked for (the API's default), with its budget */
        r->thinking = false;
        json_t *th = json_object_get(root, "thinking");
        if (th && !json_is_null(th)) {
                if (!json_is_object(th))
                        return api_bad(e, "thinking", "an object {\"type\": \"enabled\", \"budget_tokens\": N} expected");
                const char *type = json_string_value(json_object_get(th, "type"));
                if (streq(type, "enabled")) {
                        r->thinking = true;
                        if (api_get_int(th, "budget_tokens", 1, INT32_MAX, &iv, &set, e) < 0) {
                                snprintf(e->param, sizeof e->param, "thinking.budget_tokens");
                                return -1;
                        }
                        if (!set)
                                return api_bad(e, "thinking.budget_tokens", "required with \"type\": \"enabled\"");
                        x4_request_set_thinking_budget(r->req, (int32_t) iv);
                } else if (streq(type, "adaptive")) {
                        r->thinking = true; /* the model decides how long: no budget */
                } else if (!streq(type, "disabled"))
                        return api_bad(e, "thinking.type", "\"enabled\", \"adaptive\" or \"disabled\" expected");
        }
        x4_request_set_thinking(r->req, r->thinking);

        _cleanup_(json_decrefp) json_t *conv = json_array();
        _cleanup_(json_decrefp) json_t *names = json_object();
        if (!conv || !names)
                return OOM(e);
        json_t *sys = json_object_get(root, "system");
        if (sys && !json_is_null(sys)) {
                struct sbuf text = { 0 };
                if (blocks_text(sys, "system", &text, e) < 0) {
                        free(text.s);
                        return -1;
                }
                if (conv_push(conv, "system", &text, NULL, NULL, NULL) < 0)
                        return OOM(e);
        }
        json_t *msgs;
        if (api_get_messages(root, &msgs, e) < 0)
                return -1;
        size_t i;
        json_t *m;
        json_array_foreach(msgs, i, m) {
                char p[64];
                snprintf(p, sizeof p, "messages[%zu].role", i);
                const char *role = json_string_value(json_object_get(m, "role"));
                if (!json_is_object(m) || !role)
                        return api_bad(e, p, "required (\"user\" or \"assistant\")");
                bool user = streq(role, "user");
                if (!user && !streq(role, "assistant"))
                        return api_bad(e, p, "\"%s\": \"user\" or \"assistant\" expected (the system text goes in "
                                       "\"system\")", role);
                json_t *content = json_object_get(m, "content");
                snprintf(p, sizeof p, "messages[%zu].content", i);
                if (json_is_string(content)) {
                        struct sbuf text = { 0 };
                        if (sbuf_add_text(&text, json_string_value(content), json_string_length(content)) < 0 ||
                            conv_push(conv, role, &text, NULL, NULL, NULL) < 0) {
                                free(text.s);
                                return OOM(e);
                        }
                        continue;
                }
                if (!json_is_array(content))
                        return api_bad(e, p, "a string or an array of content blocks expected, got %s",
                                       content ? api_type_name(content) : "nothing");
                if ((user ? parse_user(content, i, conv, names, e) : parse_assistant(content, i, conv, names, e)) < 0)
                        return -1;
        }
        json_t *tools = NULL;
        bool send = false;
        int ret = parse_tools(root, r, &send, &tools, e);
        if (ret == 0)
                ret = parse_tool_choice(root, tools, &send, r, e);
        if (ret == 0 && send) {
                char *s = json_dumps(tools, JSON_COMPACT);
                ret = !s || x4_request_set_tools_json(r->req, s) < 0 ? OOM(e) : 0;
                free(s);
        }
        json_decref(tools);
        if (ret < 0)
                return -1;
        /* structured outputs: {"type": "json_schema", "schema": {...}} */
        json_t *of = json_object_get(root, "output_format");
        const char *of_name = "output_format";
        json_t *oc = json_object_get(root, "output_config");
        if (oc && !json_is_null(oc) && !json_is_object(oc))
                return api_bad(e, "output_config", "an object expected, got %s", api_type_name(oc));
        json_t *ocf = json_object_get(oc, "format");
        if (ocf && !json_is_null(ocf)) { /* the released field; the beta one is output_format */
                of = ocf;
                of_name = "output_config.format";
        }
        if (of && !json_is_null(of)) {
                const char *type = json_string_value(json_object_get(of, "type"));
                json_t *schema = json_object_get(of, "schema");
                char sp[40];
                snprintf(sp, sizeof sp, "%s.schema", of_name);
                if (!json_is_object(of) || !streq(type, "json_schema"))
                        return api_bad(e, of_name, "{\"type\": \"json_schema\", \"schema\": {...}} expected");
                if (!json_is_object(schema))
                        return api_bad(e, sp, "a JSON Schema object expected");
                if (r->forced_tool)
                        return api_bad(e, of_name, "a JSON answer cannot be combined with a forced tool call "
                                       "(tool_choice)");
                char *s = json_dumps(schema, JSON_COMPACT);
                ret = !s || x4_request_set_constraint(r->req, X4_CONSTRAINT_JSON_SCHEMA, s) < 0 ? OOM(e) : 0;
                free(s);
                if (ret < 0)
                        return -1;
        }
        /* an assistant message with text last is a prefill: the answer continues it, and holds
         * only the new text (the daemon leaves that message open, with no generation prompt) */
        json_t *fin = json_array_get(conv, json_array_size(conv) - 1);
        bool prefill = fin && streq(json_string_value(json_object_get(fin, "role")), "assistant") &&
                       !json_object_get(fin, "tool_calls") && json_string_length(json_object_get(fin, "content")) > 0;
        if (prefill) {
                /* a constrained answer is checked from its first token: after a prefill it would
                 * have to start over (a second "{") */
                if (r->forced_tool || (of && !json_is_null(of)))
                        return api_bad(e, "messages", "a final assistant message (prefill) cannot be combined with "
                                       "%s", r->forced_tool ? "a forced tool call (tool_choice)" : "output_format");
                x4_request_set_add_generation_prompt(r->req, false);
        }
        /* tool_choice auto (the default with tools): calls the model makes are held to the tools'
         * syntax; not after a prefill, which may have begun a call the mask did not see */
        if (send && !r->forced_tool && !r->no_calls && !prefill &&
            api_auto_tools(r, of && !json_is_null(of), e) < 0)
                return -1;
        return api_add_conversation(r, conv, e);
}

/* ---- answers ------------------------------------------------------------------------------------- */

static const char *stop_reason(const struct x4_done *d, bool had_calls) {
        switch (d->finish_reason) {
        case X4_FINISH_LENGTH:
                return "max_tokens";
        case X4_FINISH_TOOL_CALLS:
                return "tool_use";
        default:
                if (had_calls)
                        return "tool_use";
                return d->stop ? "stop_sequence" : "end_turn";
        }
}

static json_t *usage_json(const struct x4_done *d) {
        uint32_t cached = d->cached_tokens <= d->prompt_tokens ? d->cached_tokens : d->prompt_tokens;
        return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", (json_int_t) (d->prompt_tokens - cached),
                         "cache_creation_input_tokens", (json_int_t) 0, "cache_read_input_tokens", (json_int_t) cached,
                         "output_tokens", (json_int_t) d->completion_tokens);
}

static json_t *input_of(const char *args) {
        json_t *in = args ? json_loads(args, 0, NULL) : NULL;
        if (in && json_is_object(in))
                return in;
        json_decref(in);
        return json_object();
}

/* A thinking block's signature: Anthropic's is an opaque token clients keep and send back (some
 * treat a block without one as unusable); here a digest of the text (FNV-1a), which the bridge
 * neither checks nor needs: thinking sent back is read as text. */
static void thinking_signature(const char *text, size_t len, char out[40]) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < len; i++)
                h = (h ^ (uint8_t) text[i]) * 0x100000001b3ull;
        snprintf(out, 40, "xing4d-%016llx", (unsigned long long) h);
}

json_t *am_response_json(const char *id, const char *model, const struct api_result *res, const struct x4_done *d) {
        json_t *content = json_array();
        if (res->reasoning) {
                char sig[40];
                thinking_signature(res->reasoning, res->reasoning_len, sig);
                json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking",
                                                         res->reasoning, res->reasoning_len, "signature", sig));
        }
        if (res->content || (res->n_calls == 0 && !res->reasoning))
                json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text",
                                                         res->content ? res->content : "", res->content_len));
        for (size_t i = 0; i < res->n_calls; i++) {
                char cid[64];
                api_call_id(cid, sizeof cid, "toolu_", id, i);
                json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", cid, "name",
                                                         res->calls[i].name, "input", input_of(res->calls[i].arguments)));
        }
        return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", id, "type", "message", "role", "assistant",
                         "model", model, "content", content, "stop_reason", stop_reason(d, res->n_calls > 0),
                         "stop_sequence", d->stop && d->finish_reason == X4_FINISH_STOP ? json_string(d->stop) : json_null(),
                         "usage", usage_json(d));
}

/* ---- streaming ----------------------------------------------------------------------------------- */

static void ev(struct evbuffer *out, const char *name, json_t *data) {
        sse_format_event(out, name, data);
}

/* message_start goes out with the first output, when the first chunk has told the prompt's size
 * (usage as in the final message_delta: input_tokens not read from the prefix cache). */
void am_stream_start(struct ev_stream *s, struct evbuffer *out) {
        ev(out, "message_start",
           json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:I, s:i, s:I, s:i}}}", "type", "message_start",
                     "message", "id", s->id, "type", "message", "role", "assistant", "model", s->model, "content",
                     "stop_reason", "stop_sequence", "usage", "input_tokens",
                     (json_int_t) (s->prompt_tokens - s->cached_tokens), "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", (json_int_t) s->cached_tokens, "output_tokens", 0));
        ev(out, "ping", json_pack("{s:s}", "type", "ping"));
}

static void close_block(struct ev_stream *s, struct evbuffer *out) {
        if (!s->open)
                return;
        if (s->open == 1) { /* thinking: its signature last, as Anthropic sends it */
                char sig[40];
                const char *t = s->res && s->res->reasoning ? s->res->reasoning + s->open_start : "";
                size_t n = s->res && s->res->reasoning && s->res->reasoning_len >= s->open_start ?
                                   s->res->reasoning_len - s->open_start : 0;
                thinking_signature(t, n, sig);
                ev(out, "content_block_delta",
                   json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", (int) s->index,
                             "delta", "type", "signature_delta", "signature", sig));
        }
        ev(out, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", (int) s->index));
        s->index++;
        s->open = 0;
}

void am_stream_chunk(struct ev_stream *s, const struct x4_chunk *c, struct evbuffer *out) {
        if (c->channel == X4_CHANNEL_TOOL_CALL) {
                if (!c->tool_name)
                        return; /* the call's raw text: it arrives parsed when the call ends */
                close_block(s, out);
                char cid[64];
                api_call_id(cid, sizeof cid, "toolu_", s->id, s->n_calls++);
                const char *args = c->tool_arguments_json ? c->tool_arguments_json : "{}";
                ev(out, "content_block_start",
                   json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type", "content_block_start", "index",
                             (int) s->index, "content_block", "type", "tool_use", "id", cid, "name", c->tool_name,
                             "input"));
                ev(out, "content_block_delta",
                   json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", (int) s->index,
                             "delta", "type", "input_json_delta", "partial_json", args));
                ev(out, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index",
                                                        (int) s->index));
                s->index++;
                return;
        }
        if (!c->text_len)
                return;
        int want = c->channel == X4_CHANNEL_REASONING ? 1 : 2;
        if (s->open != want) {
                close_block(s, out);
                s->open = want;
                /* where this block's text starts in the result (the signature covers it) */
                if (s->res)
                        s->open_start = want == 1 ? s->res->reasoning_len - c->text_len : s->res->content_len - c->text_len;
                ev(out, "content_block_start",
                   want == 1 ? json_pack("{s:s, s:i, s:{s:s, s:s, s:s}}", "type", "content_block_start", "index",
                                         (int) s->index, "content_block", "type", "thinking", "thinking", "",
                                         "signature", "")
                             : json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index",
                                         (int) s->index, "content_block", "type", "text", "text", ""));
        }
        ev(out, "content_block_delta",
           json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta", "index", (int) s->index, "delta",
                     "type", want == 1 ? "thinking_delta" : "text_delta", want == 1 ? "thinking" : "text", c->text,
                     c->text_len));
}

void am_stream_finish(struct ev_stream *s, const struct x4_done *d, struct evbuffer *out) {
        if (s->index == 0 && !s->open) {
                /* nothing was said (a stop sequence or the end of the turn first): the answer has
                 * one empty text block, as am_response_json gives it, so the SDK's accumulated
                 * message matches the non-streaming one */
                ev(out, "content_block_start",
                   json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", 0, "content_block",
                             "type", "text", "text", ""));
                s->open = 2;
        }
        close_block(s, out);
        ev(out, "message_delta",
           json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason",
                     stop_reason(d, s->n_calls > 0), "stop_sequence",
                     d->stop && d->finish_reason == X4_FINISH_STOP ? json_string(d->stop) : json_null(), "usage",
                     usage_json(d)));
        ev(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

void am_stream_error(struct ev_stream *s, const struct api_error *e, struct evbuffer *out) {
        (void) s;
        ev(out, "error", api_error_json(e, FLAVOR_ANTHROPIC));
}
