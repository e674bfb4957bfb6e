/* SPDX-License-Identifier: MIT */
/* xing4-http internals: the OpenAI JSON ⇄ libx4client mapping (openai.c), Server-Sent Events
 * framing (sse.c) and the Prometheus counters (metrics.c). main.c owns the event loop, the HTTP
 * routes and the daemon connections. Everything runs on the one libevent thread. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "x4client.h"

struct evhttp_request;
struct evbuffer;

/* ---- an error answered to the HTTP client in the API's shape ----------------------------------- */

/* Which API's error shape a path answers in: OpenAI's {"error":{"message","type","param","code"}}
 * or Anthropic's {"type":"error","error":{"type","message"}} (/v1/messages...). */
enum api_flavor {
        FLAVOR_OPENAI,
        FLAVOR_ANTHROPIC,
};

struct api_error {
        int status;          /* HTTP status */
        const char *type;    /* "invalid_request_error", "server_error", ... */
        const char *code;    /* may be NULL */
        char param[64];      /* the request field at fault, "" = null */
        char message[512];
        int retry_after;     /* seconds, 0 = no Retry-After header */
};

/* Fill e and return -1 (so parsers can `return api_fail(...)`). */
int api_fail(struct api_error *e, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The 500 of an allocation that failed. */
#define OOM(e) api_fail(e, 500, "server_error", NULL, NULL, "out of memory")
/* The error object in the flavor's shape (new reference). */
json_t *api_error_json(const struct api_error *e, enum api_flavor flavor);
/* Anthropic's error type for an HTTP status ("invalid_request_error", "not_found_error", ...). */
const char *api_anthropic_error_type(int status);

/* ---- a parsed OpenAI request ------------------------------------------------------------------- */

enum api_kind {
        API_CHAT,          /* POST /v1/chat/completions */
        API_COMPLETION,    /* POST /v1/completions */
        API_MESSAGES,      /* POST /v1/messages (anthropic.c) */
        API_COUNT_TOKENS,  /* POST /v1/messages/count_tokens: a 1-token generation, its prompt size */
        API_RESPONSES,     /* POST /v1/responses (responses.c) */
};

/* Map a libx4client error (status + message) to the HTTP error a client should see, with param the
 * request field the daemon's refusal is about, in `kind`'s names, where it names one. */
void api_error_from_x4(struct api_error *e, enum api_kind kind, int x4_status, const char *message);

/* What the parsers need from the configuration. */
struct api_config {
        const char *model_id;       /* the id /v1/models lists */
        char *const *aliases;       /* fnmatch(3) patterns of other names served by it */
        size_t n_aliases;
        int key;                    /* the API key the request came with (stored responses are its) */
        size_t drop_units;          /* responses, truncation "auto": the oldest conversation units
                                     * (rs_truncate_plan) left out of this attempt */
};

struct api_request {
        enum api_kind kind;
        x4_request *req;          /* what goes to the daemon */
        bool stream;
        bool include_usage;       /* stream_options.include_usage */
        bool logprobs;
        unsigned top_logprobs;
        bool thinking;            /* reasoning channel expected */
        bool forced_tool;         /* the answer must be a tool call (tool_choice) */
        /* parallel_tool_calls: false (Anthropic: tool_choice.disable_parallel_tool_use): the
         * answer ends at its first complete call (main.c:on_chunk cancels the rest) */
        bool one_call;
        /* tool_choice "none": the tools stay in the prompt (as vLLM and Anthropic keep them), and
         * a call the model writes anyway is answered as the text it stands for (api_call_text) */
        bool no_calls;
        char *affinity_key;       /* the prompt's opening bytes, for prefix-affinity routing */
        size_t affinity_len;
        char *model;              /* the model name answered (messages, responses: as requested) */
        /* responses: */
        json_t *conv;             /* the conversation so far (protocol-shaped messages) to store */
        json_t *echo;             /* the request's settings echoed in the response object */
        json_t *input;            /* the request's input, as sent (GET /v1/responses/ID/input_items) */
        bool store;
        bool truncate;            /* truncation "auto": a prompt over the context loses old units */
        unsigned reasoning_out;   /* RS_SUMMARY | RS_ENCRYPTED: what the reasoning items carry */
};

/* Responses: what a reasoning output item carries besides its text (content): the text as its
 * summary too (reasoning.summary; the bridge has no summarizer), and encrypted_content (include
 * "reasoning.encrypted_content": the text, restorable from a later request's input). */
#define RS_SUMMARY 1u
#define RS_ENCRYPTED 2u

/* Caps on one chat request's shape, answered with a 400 naming them. A 4 MiB body could otherwise
 * carry ~100k messages or calls; 4096 messages is far past any context the model has, and 256
 * calls per turn far past what a model emits in one turn. */
#define API_MAX_MESSAGES 4096
#define API_MAX_TOOL_CALLS 256

void api_request_done(struct api_request *r);
/* Parse a chat (/v1/chat/completions) or completion (/v1/completions) body. model_id is the id
 * /v1/models lists. On failure: -1 and e filled (status 400/404). */
int api_parse_request(enum api_kind kind, const char *body, size_t len, const struct api_config *cfg,
                      struct api_request *out, struct api_error *e);

/* ---- helpers shared by the parsers (openai.c) ----------------------------------------------------- */

/* 400 invalid_value naming param ("param: message"). */
int api_bad(struct api_error *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int api_unsupported(struct api_error *e, const char *param, const char *what);
const char *api_type_name(const json_t *v);
int api_get_number(json_t *o, const char *key, double lo, double hi, bool lo_open, double *v, bool *set,
                   struct api_error *e);
int api_get_int(json_t *o, const char *key, json_int_t lo, json_int_t hi, json_int_t *v, bool *set,
                struct api_error *e);
int api_get_bool(json_t *o, const char *key, bool *v, struct api_error *e);
/* A float sampling parameter of a request body: its key, range (see api_get_number) and the
 * x4_request setter it goes to. api_get_sampling reads each one of the table in order (the first
 * bad one is the 400) and sets those present; 0 or -1 with e filled. */
struct api_sampling_param {
        const char *key;
        double lo, hi;
        bool lo_open;
        int (*set)(x4_request *r, float v);
};
int api_get_sampling(json_t *o, const struct api_sampling_param *p, size_t n, x4_request *req,
                     struct api_error *e);
/* The body's "tools", for a mapper that rewrites them into the daemon's form: 0 with *tools and
 * *out NULL when absent or null; 0 with *tools the array and *out a new empty one to fill; -1
 * with e filled when it is not an array (`expected` says what one is) or out of memory. */
int api_tools_begin(json_t *root, const char *expected, json_t **tools, json_t **out, struct api_error *e);
/* A tool_choice that names a tool: 0 when `tools` (the daemon's form, [{type: "function",
 * function: {name, ...}}], NULL for none) has one named `name`; -1 with a 400 on `param` when not. */
int api_tool_named(json_t *tools, const char *name, const char *param, struct api_error *e);
/* A tool_choice that forces a call: marks the request and constrains it to a call of `name` (any
 * tool when NULL); 0, or -1 with e filled. */
int api_force_tool(struct api_request *r, const char *name, struct api_error *e);
/* Tools offered under tool_choice auto: the answer is free, each call the model begins is held
 * to the native syntax of one of the tools (constraint.tool_calls; lenient, but the daemon holds
 * a tool marked "strict": true to its schema exactly). With a JSON answer (response_format, its
 * constraint already set): that JSON or tool calls (constraint.or_tool_calls). 0, or -1 with e
 * filled. */
int api_auto_tools(struct api_request *r, bool json_answer, struct api_error *e);
/* The body's "messages": 0 with *msgs a non-empty array of at most API_MAX_MESSAGES entries
 * (not yet checked one by one), or -1 with e filled. */
int api_get_messages(json_t *root, json_t **msgs, struct api_error *e);
/* The body's "metadata", accepted and not used: 0 when absent, null or an object, else -1 with e
 * filled. */
int api_check_metadata(json_t *root, struct api_error *e);
/* The body's "top_k" (an integer in [0, 2^30]) to the request when present; 0, or -1 with e filled. */
int api_get_top_k(json_t *o, x4_request *req, struct api_error *e);
/* The parsed body (JSON object; \u0000 allowed in strings), or NULL with e filled. */
json_t *api_load_body(const char *body, size_t len, struct api_error *e);
/* root.model checked against the served id and the aliases (404 model_not_found otherwise); *name
 * is the requested name (borrowed from root). */
int api_check_model(json_t *root, const struct api_config *cfg, bool required, const char **name,
                    struct api_error *e);
/* A tool-call id of at most 40 characters (OpenAI refuses longer ones when a history is replayed):
 * prefix + 24 hex digits of the response id's random part + "_" + index. */
void api_call_id(char *buf, size_t size, const char *prefix, const char *response_id, size_t index);
/* The conversation (an array of {role, content, reasoning?, tool_calls?, name?} objects, the
 * protocol's ChatMessage fields; tool_calls in OpenAI's array shape) appended to r->req. */
int api_add_conversation(struct api_request *r, json_t *conv, struct api_error *e);
void api_affinity_add(struct api_request *r, const char *s, size_t n);
/* An answer format (type "text", "json_object" or "json_schema" with js = {name, schema, strict})
 * as r's constraint; param and js_param name the fields in errors. */
int api_parse_format(const char *type, json_t *fmt, json_t *js, const char *param, const char *js_param,
                     struct api_request *r, struct api_error *e);

/* A growing string. */
struct sbuf {
        char *s;
        size_t len, cap;
};
int sbuf_add(struct sbuf *b, const char *s, size_t n);
/* The same for text going to the model as a C string: U+0000 becomes U+FFFD (the protocol's
 * strings end at the first NUL, which would cut the message there). */
int sbuf_add_text(struct sbuf *b, const char *s, size_t n);

/* ---- Anthropic Messages (anthropic.c) and OpenAI Responses (responses.c) -------------------------- */

int am_parse(json_t *root, bool count_only, struct api_request *r, struct api_error *e);
int rs_parse(json_t *root, const struct api_config *cfg, struct api_request *r, struct api_error *e);
/* truncation "auto": how many more of conv's oldest units (a message other than a system one,
 * with the tool results after it) must go to shed about `excess` prompt bytes; at least 1, and
 * 0 when only the last unit is left. */
size_t rs_truncate_plan(json_t *conv, uint64_t excess);
/* The text of one conversation message as the daemon counts a prompt's bytes. */
uint64_t rs_message_bytes(json_t *m);
/* A tool call written as text (tool_choice "none"): the JSON call syntax the model's parsers
 * read (docs/model.md §7); malloc'ed, NULL when out of memory. */
char *api_call_text(const char *name, const char *args);

/* ---- the answer being built ---------------------------------------------------------------------- */

struct tool_call_out {
        char *name;
        char *arguments;
};

/* What a request has produced so far (non-streaming: all of it; streaming: counters only). */
struct api_result {
        char *content, *reasoning;
        size_t content_len, reasoning_len, content_cap, reasoning_cap;
        struct tool_call_out *calls;
        size_t n_calls;
        json_t *logprobs;         /* chat: array of token entries; completions: the object */
        size_t text_offset;       /* completions: characters of output so far (logprobs.text_offset) */
        json_t *lp_pending;       /* chat: entries of content tokens no text has shown yet */
};

void api_result_done(struct api_result *r);
int api_result_add_text(struct api_result *r, bool reasoning, const char *text, size_t len);
int api_result_add_call(struct api_result *r, const char *name, const char *args);
/* Append the logprobs of one chunk (chat shape or completion shape), top_n alternatives each (the
 * daemon is asked for at least one, to learn each token's text). Chat: only the content's tokens
 * (api_chunk_logprobs). */
void api_result_add_logprobs(struct api_result *r, enum api_kind kind, const struct x4_chunk *c,
                             unsigned top_n);

const char *api_finish_reason(int x4_finish, bool had_tool_calls);
json_t *api_usage_json(const struct x4_done *d);
/* The whole non-streaming response (chat and completions). */
json_t *api_response_json(enum api_kind kind, const char *id, int64_t created, const char *model,
                          const struct api_result *res, const struct x4_done *d);
/* One streaming chunk with one choice: delta (chat) or text (completions); steals delta. */
json_t *api_chunk_json(enum api_kind kind, const char *id, int64_t created, const char *model,
                       json_t *delta, const char *finish_reason, json_t *logprobs);
/* The usage-only chunk (stream_options.include_usage): empty choices. */
json_t *api_usage_chunk_json(enum api_kind kind, const char *id, int64_t created, const char *model,
                             const struct x4_done *d);
/* The logprobs value of one chunk in streaming form (NULL when none); r->text_offset: characters
 * of output before the chunk (completions' text_offset), advanced past it. Chat: as OpenAI's, the
 * tokens of logprobs.content join to exactly the content: a content chunk's tokens without text
 * (special tokens such as </think>, text held back as a possible stop string) wait in
 * r->lp_pending, and go out with the chunk whose text they turn out to be part of. */
json_t *api_chunk_logprobs(enum api_kind kind, const struct x4_chunk *c, unsigned top_n, struct api_result *r);

/* The non-streaming answers of the other APIs. */
json_t *am_response_json(const char *id, const char *model, const struct api_result *res, const struct x4_done *d);
json_t *rs_response_json(const char *id, int64_t created, const char *model, json_t *echo, unsigned reasoning_out,
                         const struct api_result *res, const struct x4_done *d);

/* A stream of named events (Anthropic Messages, OpenAI Responses): each chunk's events are
 * appended to an evbuffer as SSE bytes. The caller adds each chunk's text to res first, so the
 * stream can quote whole items when they end. */
struct ev_stream {
        enum api_kind kind;
        const char *id, *model;
        int64_t created;
        json_t *echo;                /* responses: the request's settings */
        struct api_result *res;
        int open;                    /* the block/item open now: 0 none, 1 reasoning, 2 text */
        size_t open_start;           /* where its text starts in res->reasoning / res->content */
        unsigned index;              /* anthropic: next content block index; responses: output_index */
        unsigned seq;                /* responses: sequence_number */
        size_t n_calls;
        bool started;
        bool cut;                    /* responses: the output ended inside the open item */
        uint32_t prompt_tokens;      /* from the first chunk (protocol minor 3), for message_start */
        uint32_t cached_tokens;
        json_t *output;              /* responses: the finished output items */
        unsigned reasoning_out;      /* responses: RS_SUMMARY | RS_ENCRYPTED */
};
void ev_stream_init(struct ev_stream *s, enum api_kind kind, const char *id, const char *model, int64_t created,
                    json_t *echo, struct api_result *res);
void ev_stream_done(struct ev_stream *s);
/* The opening events (message_start + ping; response.created + response.in_progress). */
void ev_stream_start(struct ev_stream *s, struct evbuffer *out);
/* One chunk (already added to res); tool calls come whole (name, arguments). */
void ev_stream_chunk(struct ev_stream *s, const struct x4_chunk *c, struct evbuffer *out);
/* The closing events after a Done. */
void ev_stream_finish(struct ev_stream *s, const struct x4_done *d, struct evbuffer *out);
/* An error after the stream started. */
void ev_stream_error(struct ev_stream *s, const struct api_error *e, struct evbuffer *out);

void am_stream_start(struct ev_stream *s, struct evbuffer *out);
void am_stream_chunk(struct ev_stream *s, const struct x4_chunk *c, struct evbuffer *out);
void am_stream_finish(struct ev_stream *s, const struct x4_done *d, struct evbuffer *out);
void am_stream_error(struct ev_stream *s, const struct api_error *e, struct evbuffer *out);
void rs_stream_start(struct ev_stream *s, struct evbuffer *out);
void rs_stream_chunk(struct ev_stream *s, const struct x4_chunk *c, struct evbuffer *out);
void rs_stream_finish(struct ev_stream *s, const struct x4_done *d, struct evbuffer *out);
void rs_stream_error(struct ev_stream *s, const struct api_error *e, struct evbuffer *out);

/* The bounded store of /v1/responses conversations for previous_response_id (responses.c). */
void rs_store_configure(size_t max_entries, size_t max_bytes, int retention_s);
/* The conversation stored under id by the same API key (borrowed), or NULL. */
json_t *rs_store_get(const char *id, int key);
/* Stores conv + the answer under id for key; steals nothing. */
/* response: the answered response object, kept for GET /v1/responses/ID (the store takes it);
 * input: the request's input as sent (a string or an array of items; borrowed) */
void rs_store_put(const char *id, int key, json_t *conv, const struct api_result *res, json_t *response,
                  json_t *input);
json_t *rs_store_response(const char *id, int key);
/* The input items of a stored response, OpenAI's items with ids (borrowed), or NULL. */
json_t *rs_store_input(const char *id, int key);
bool rs_store_delete(const char *id, int key);
void rs_store_clear(void);

/* ---- Server-Sent Events -------------------------------------------------------------------------- */

/* Start the event stream: 200, text/event-stream, chunked. */
void sse_start(struct evhttp_request *req);
/* "data: <compact json>\n\n" as one chunk; steals j. */
void sse_send_json(struct evhttp_request *req, json_t *j);
/* "data: [DONE]\n\n", then the end of the chunked reply. */
void sse_finish(struct evhttp_request *req);
/* `: keep-alive` comment event, sent while a long prompt prefills (nothing else to send). */
void sse_keepalive(struct evhttp_request *req);
/* Append one event's bytes to buf (exposed for tests of the framing). */
int sse_format(struct evbuffer *buf, const char *data, size_t len);
/* "event: NAME\ndata: <compact json>\n\n"; steals j. */
int sse_format_event(struct evbuffer *buf, const char *event, json_t *j);
/* Hand buf's bytes to the client as one chunk. */
void sse_send_buffer(struct evhttp_request *req, struct evbuffer *buf);

/* ---- metrics ------------------------------------------------------------------------------------- */

void metrics_count_request(const char *endpoint, int status);
void metrics_add_tokens(uint64_t prompt, uint64_t completion, uint64_t cached);
void metrics_observe_ttft(double seconds);
void metrics_observe_token_latency(double seconds);
void metrics_count_cancelled(void);
/* Prometheus text exposition format 0.0.4 of the bridge's own counters. */
void metrics_render(struct evbuffer *out);
/* Helpers for main.c's per-daemon gauges. */
void metrics_label_escape(struct evbuffer *out, const char *value);
