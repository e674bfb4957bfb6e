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

/* ---- an error answered to the HTTP client in OpenAI's shape ------------------------------------ */

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
/* The error object {"error":{"message","type","param","code"}} (new reference). */
json_t *api_error_json(const struct api_error *e);
/* Map a libx4client error (status + message) to the HTTP error a client should see. */
void api_error_from_x4(struct api_error *e, int x4_status, const char *message);

/* ---- a parsed OpenAI request ------------------------------------------------------------------- */

enum api_kind {
        API_CHAT,
        API_COMPLETION,
};

struct api_request {
        enum api_kind kind;
        x4_request *req;          /* what goes to the daemon */
        bool stream;
        bool include_usage;       /* stream_options.include_usage */
        bool logprobs;
        unsigned top_logprobs;
        bool thinking;            /* reasoning channel expected (chat only) */
        char *affinity_key;       /* the prompt's opening bytes, for prefix-affinity routing */
        size_t affinity_len;
};

/* Caps on one chat request's shape, answered with a 400 naming them. A 4 MiB body could otherwise
 * carry ~100k messages or calls; 4096 messages is far past any context the model has, and 256
 * calls per turn far past what a model emits in one turn. */
#define API_MAX_MESSAGES 4096
#define API_MAX_TOOL_CALLS 256

void api_request_done(struct api_request *r);
/* Parse a chat (/v1/chat/completions) or completion (/v1/completions) body. model_id is the id
 * /v1/models lists. On failure: -1 and e filled (status 400/404). */
int api_parse_request(enum api_kind kind, const char *body, size_t len, const char *model_id,
                      struct api_request *out, struct api_error *e);

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
};

void api_result_done(struct api_result *r);
int api_result_add_text(struct api_result *r, bool reasoning, const char *text, size_t len);
int api_result_add_call(struct api_result *r, const char *name, const char *args);
/* Append the logprobs of one chunk (chat shape or completion shape), top_n alternatives each (the
 * daemon is asked for at least one, to learn each token's text). */
void api_result_add_logprobs(struct api_result *r, enum api_kind kind, const struct x4_chunk *c,
                             unsigned top_n);

const char *api_finish_reason(int x4_finish, bool had_tool_calls);
json_t *api_usage_json(const struct x4_done *d);
/* The whole non-streaming response. */
json_t *api_response_json(enum api_kind kind, const char *id, int64_t created, const char *model,
                          const struct api_result *res, const struct x4_done *d);
/* One streaming chunk with one choice: delta (chat) or text (completions); steals delta. */
json_t *api_chunk_json(enum api_kind kind, const char *id, int64_t created, const char *model,
                       json_t *delta, const char *finish_reason, json_t *logprobs);
/* The usage-only chunk (stream_options.include_usage): empty choices. */
json_t *api_usage_chunk_json(enum api_kind kind, const char *id, int64_t created, const char *model,
                             const struct x4_done *d);
/* The logprobs value of one chunk in streaming form (NULL when none). */
json_t *api_chunk_logprobs(enum api_kind kind, const struct x4_chunk *c, unsigned top_n);

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
