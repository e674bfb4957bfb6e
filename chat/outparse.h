/* SPDX-License-Identifier: MIT */
/* Output channels of one generation (docs/model.md §7): reasoning / content / tool calls, and when the
 * turn ends. One parser per request; the scheduler feeds it every sampled token (id + the text
 * the streaming detokenizer produced for it) and forwards the events it emits.
 *
 * Rules:
 * - thinking on: output starts in the reasoning channel; `</think>` ends it and the rest is
 *   content. The one `\n` right before `</think>` is template structure: it is held back and
 *   dropped (emitted only if reasoning goes on or the output ends without `</think>`).
 *   thinking off: output starts in content. `<think>` as the very first output token (nothing
 *   emitted yet) enters reasoning; elsewhere it is ignored, as is a `</think>` in content.
 * - tool calls (content channel only): `<tool_call>NAME<param_key>K</param_key><param_value>V
 *   </param_value>…</tool_call>` (a value that parses as a JSON number, bool, null, object or
 *   array is typed when the tool's schema for K allows that type (tool_parameters; no schema:
 *   always), anything else is the raw string: a string property's "42" stays "42") or
 *   `<tool_call>{"name": …, "arguments":
 *   {…}}</tool_call>`. Back to back calls are separate events. A call that does not parse, or
 *   names a tool the caller did not offer (tool_names), is content text (its markers included),
 *   never an error. A call cut off by the end of the turn
 *   or by another `<tool_call>` counts only in the JSON form (it is self-delimiting).
 * - the turn ends (finish reason "stop") on `<_end>` and the turn-ending specials `<_user>`
 *   `<_bot>` `<_system>` `<_start>` `<_pad>` `<tool_response>` `</tool_response>`, on a
 *   caller's stop id, and on a caller's stop string. Stop strings are matched in the text of the
 *   reasoning and content channels (not inside a tool call, not across `</think>`); text that
 *   could be the start of a stop string is held back until it is known not to be; on a match the
 *   text before it is emitted, the stop string and everything after are not. Stop tokens and
 *   strings emit no text of their own.
 * - thinking budget: after `budget` tokens in reasoning, outparse_should_force_end_think() says
 *   the caller must feed `</think>` next (instead of sampling); generation continues in content.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

struct tokenizer;
struct json_value;

enum outparse_channel {
        OUTPARSE_REASONING,
        OUTPARSE_CONTENT,
        OUTPARSE_TOOL_CALL,
};

enum outparse_event_type {
        OUTPARSE_EVENT_TEXT,      /* channel + text delta (reasoning or content) */
        OUTPARSE_EVENT_TOOL_CALL, /* a finished tool call: name + JSON arguments */
        OUTPARSE_EVENT_STOP,      /* the turn ended: finish_reason; nothing follows */
};

struct outparse_event {
        enum outparse_event_type type;
        enum outparse_channel channel;
        const char *text; /* TEXT: delta, UTF-8, not NUL-terminated */
        size_t len;
        const char *tool_name;      /* TOOL_CALL, NUL-terminated */
        const char *tool_arguments; /* TOOL_CALL: a JSON object, json_dump() default style */
        const char *finish_reason;  /* STOP: "stop", or what outparse_finish() was given */
        int32_t stop_id;            /* STOP: the token that ended the turn, -1 if none */
        const char *stop_string;    /* STOP: the stop string that matched, NULL if none */
};

/* Events are valid only during the call. A negative return aborts the feed with that error. */
typedef int (*outparse_emit_t)(const struct outparse_event *ev, void *userdata);

struct outparse_config {
        bool thinking;           /* the prompt ended in `<think>\n`: output starts in reasoning */
        int64_t thinking_budget; /* reasoning tokens before `</think>` is forced; < 0: none */
        const char *const *stop_strings; /* non-empty UTF-8 strings */
        size_t n_stop_strings;
        const int32_t *stop_ids;
        size_t n_stop_ids;
        bool no_tool_calls; /* `<tool_call>` is text */
        /* n_tool_names > 0: the offered tools; a call of any other name is content text, as a
         * call that does not parse is (a chat request's model never gets to call a tool it was
         * not given) */
        const char *const *tool_names;
        size_t n_tool_names;
        /* NULL, or n_tool_names entries (each NULL or a tool's `parameters` JSON Schema, copied):
         * what types the values of a native call of that tool take */
        const struct json_value *const *tool_parameters;
        outparse_emit_t emit;
        void *userdata;
};

struct outparse;

/* The tokenizer gives the ids of the specials (a vocab without them has no such rules). An empty
 * stop string is -EINVAL; the reason goes to err (error_set(), common/log.h: NULL, 0 logs it). */
int outparse_new(const struct tokenizer *t, const struct outparse_config *c, struct outparse **ret,
                 char *err, size_t err_size);
void outparse_free(struct outparse *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct outparse *, outparse_free);

/* One generated token: its id and the text the streaming detokenizer gave for it (with
 * TOKENIZER_DECODE_SKIP_SPECIALS or not: the text of specials is not used). After the STOP
 * event further feeds are ignored (return 0). */
int outparse_feed(struct outparse *p, int32_t id, const char *text, size_t len);
/* Text that belongs to no new token: what tokenizer_stream_flush() returns at the end of the
 * output (bytes of an unfinished character, as U+FFFD). Call it before outparse_finish(). */
int outparse_feed_text(struct outparse *p, const char *text, size_t len);
/* Generation ended for another reason (e.g. "length", "cancelled"): emit everything held back
 * (an unfinished tool call as content text; with "length" in a request that offered tools, the
 * output budget ran out inside it: dropped unless its JSON form is complete) and a STOP event with this reason. No-op after a
 * STOP. */
int outparse_finish(struct outparse *p, const char *finish_reason);

bool outparse_stopped(const struct outparse *p);
enum outparse_channel outparse_channel(const struct outparse *p);
/* True while in reasoning with the budget spent: the caller feeds `</think>` next. */
bool outparse_should_force_end_think(const struct outparse *p);
/* The id to feed then (`</think>`), -ENOENT if the vocab has none. */
int32_t outparse_end_think_id(const struct outparse *p);
uint64_t outparse_reasoning_tokens(const struct outparse *p);
