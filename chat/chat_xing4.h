/* SPDX-License-Identifier: MIT */
/* The Xing4 chat format (docs/model.md §7), as a Jinja template for GGUFs without tokenizer.chat_template
 * and as a direct C renderer that produces the same bytes without the interpreter.
 *
 * Choices where the spec is silent (UNCERTAIN U8), kept identical in both renderers:
 * - the prompt always starts with `<_system>`; a leading system message's text follows it with
 *   NO trailing newline (`<_system>{content}<_user>...`); later system messages render as
 *   `<_system>{content}` in place.
 * - tools are listed in the system turn, after the system text (separated by "\n\n" when there is
 *   system text): a "# Tools" header, one `tojson` line per tool inside <tools>...</tools>, and one
 *   sentence describing the call syntax.
 * - past assistant turns: `<_bot></think>{content}{tool calls}<_end>\n`; reasoning is dropped.
 *   A call whose arguments are an object renders as
 *   `<tool_call>NAME<param_key>K</param_key><param_value>V</param_value>...</tool_call>` (string
 *   values raw, others tojson); arguments given as a string (OpenAI's JSON text) render as
 *   `<tool_call>{"name": NAME, "arguments": TEXT}</tool_call>`, the form parsers also accept.
 * - tool results: a run of consecutive `tool` messages is one `<_user>` turn holding
 *   `<tool_response>{content}</tool_response>` per result, back to back.
 * - generation prompt: `<_bot><think>\n`, or `<_bot></think>` when enable_thinking is defined and
 *   false.
 * - content may be a string, null/absent, or a list of parts (text parts concatenated, other parts
 *   skipped); any other content type or an unknown role is an error. */
#pragma once

struct json_value;

extern const char chat_xing4_template[];

/* Renders context (an object: messages, tools, add_generation_prompt, enable_thinking) in the
 * Xing4 format without Jinja. Same bytes as chat_xing4_template rendered by chat.c. Returns 0 and a
 * malloc'ed string, or -EINVAL with a message naming the offending message/field in err
 * (error_set(), common/log.h: NULL, 0 logs it). */
int chat_xing4_render(const struct json_value *context, char **ret, char *err, size_t err_size);
