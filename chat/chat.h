/* SPDX-License-Identifier: MIT */
/* Chat template rendering: an interpreter for the Jinja2 subset that real chat templates use,
 * configured like Hugging Face transformers renders `tokenizer.chat_template` (trim_blocks,
 * lstrip_blocks, loop controls, raise_exception, strftime_now, tojson = json.dumps(ensure_ascii=
 * False)), so a GGUF's template renders byte-identically to the reference.
 *
 * Parse once at load, render many times. Errors name the place and the construct:
 * "template:12:5: unknown tag 'foo'", "template:3:10: unsupported filter 'xmlattr'",
 * "template:7:3: raise_exception: System role not supported".
 * strftime_now honours X4_TEMPLATE_NOW=YYYY-MM-DD (reproducible tests). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

struct json_value;
struct chat_template;

/* Budgets that bound a render (a template is untrusted input: it comes from the GGUF). */
struct chat_limits {
        uint64_t max_steps;  /* evaluation steps; default 10,000,000 */
        size_t max_output;   /* bytes of output and of any one string; default 16 MiB */
        unsigned max_depth;  /* nested macro calls; default 100 */
        size_t max_memory;   /* bytes allocated by one render; default 512 MiB */
};

/* -EINVAL with "template:L:C: why" in err (error_set(), common/log.h: NULL, 0 logs it) on a syntax
 * error or an unsupported construct. chat_template_parse_len takes text that need not be
 * NUL-terminated. */
int chat_template_parse(const char *text, struct chat_template **ret, char *err, size_t err_size);
int chat_template_parse_len(const char *text, size_t len, struct chat_template **ret, char *err,
                            size_t err_size);
void chat_template_free(struct chat_template *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct chat_template *, chat_template_free);
void chat_template_set_limits(struct chat_template *t, const struct chat_limits *limits);

/* Renders with context's members (a JSON object, or NULL for none) as the template's variables.
 * Returns 0 and a malloc'ed NUL-terminated string; -EINVAL on a template error (undefined
 * attribute, type error, raise_exception: "template:L:C: raise_exception: TEXT"), -E2BIG when a
 * limit was exceeded; the message goes to err (error_set(), common/log.h: NULL, 0 logs it).
 * chat_template_render_len also returns the length (the output holds NUL bytes when the
 * context's strings do). */
int chat_template_render(const struct chat_template *t, const struct json_value *context, char **ret,
                         char *err, size_t err_size);
int chat_template_render_len(const struct chat_template *t, const struct json_value *context, char **ret,
                             size_t *ret_len, char *err, size_t err_size);

/* Builds the context the daemon renders with: {"messages": [...], "tools": [...] (only when
 * tools is a non-empty list), "add_generation_prompt": b, "enable_thinking": b (only when
 * enable_thinking >= 0), "bos_token": ..., "eos_token": ...}. messages/tools are deep-copied; each
 * message must be an object with a string role of system/user/assistant/tool; a tool call's
 * "arguments" given as JSON text is parsed into an object (templates iterate it), and left as
 * text when it does not parse. What is wrong with messages or tools goes to err (error_set(),
 * common/log.h), naming the message: "messages[2].role: a string expected". */
int chat_context_build(const struct json_value *messages, const struct json_value *tools, bool add_generation_prompt,
                       int enable_thinking, const char *bos_token, const char *eos_token, struct json_value **ret,
                       char *err, size_t err_size);
