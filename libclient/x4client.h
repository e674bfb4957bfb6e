/* SPDX-License-Identifier: MIT */
/* libx4client: talk to xing4d over its Unix socket (protocol: proto/README.md).
 *
 * Two ways to use it:
 *   - blocking: x4_client_generate() sends a request and calls your chunk callback for every
 *     piece of output until the request ends; x4_client_stats(), _info(), _health() and the
 *     snapshot calls wait for their reply.
 *   - event loop: x4_client_submit() sends a request and returns its id; poll x4_client_fd() for
 *     POLLIN and call x4_client_dispatch(), which runs the callbacks of whatever arrived.
 *   Both can be mixed: while a blocking call waits, frames of submitted requests are dispatched
 *   to their callbacks.
 *
 * Errors: functions return 0 (or a count) on success and a negative `enum x4_error` on failure;
 * x4_client_last_error() has the one-line message (the server's own text for server errors,
 * e.g. "sampling.top_p: 1.5 is out of range (0, 1]"). A call refused before any I/O says which
 * argument and what was expected ("x4_client_stats: ret is NULL, a struct x4_stats to fill
 * expected"). Calls with no client to keep the message in (a NULL client, the x4_request_*
 * functions) leave it for x4_client_last_error(NULL), per thread.
 *
 * Thread safety: an x4_client is NOT thread-safe. Use one per thread, or serialize every call on
 * one client with your own lock. Callbacks run on the thread that called generate()/dispatch()/a
 * blocking call; they must not call blocking functions of the same client (they may call
 * x4_client_cancel()). Different clients are independent. x4_request objects are plain data: one
 * may be submitted many times, from any thread, as long as it is not modified meanwhile.
 *
 * ABI: libx4client.so.1. Structs below only grow at their end, within their reserved space. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define X4_API __attribute__((visibility("default")))

#define X4_CLIENT_PROTO_MAJOR 1
#define X4_CLIENT_PROTO_MINOR 4
#define X4_DEFAULT_SOCKET "/run/xing4d/xing4d.sock"
/* Environment variable naming the socket when none is given. */
#define X4_SOCKET_ENV "X4_SOCKET"

enum x4_error {
        X4_OK = 0,
        /* sent by the server (Error.code, negated) */
        X4_E_INVALID_ARGUMENT = -1,
        X4_E_NOT_FOUND = -2,
        X4_E_UNAVAILABLE = -3,
        X4_E_TOO_LARGE = -4,
        X4_E_PROTOCOL = -5, /* also from the client: the peer does not speak the protocol */
        X4_E_VERSION_MISMATCH = -6,
        X4_E_INTERNAL = -7,
        X4_E_RESOURCE_EXHAUSTED = -8,
        X4_E_UNIMPLEMENTED = -9,
        X4_E_ALREADY_EXISTS = -10, /* a snapshot of that name exists (create without replace) */
        /* found by the client */
        X4_E_CONNECT = -100,  /* socket missing, refused, or permission denied */
        X4_E_TIMEOUT = -101,  /* connect or response timeout passed */
        X4_E_IO = -102,       /* read/write failed */
        X4_E_CLOSED = -103,   /* the server closed the connection (x4_client_connect() again) */
        X4_E_NOMEM = -104,
        X4_E_USAGE = -105,    /* the API was called wrongly (not connected, NULL argument, ...) */
};

enum x4_channel {
        X4_CHANNEL_CONTENT = 0,
        X4_CHANNEL_REASONING = 1, /* inside <think> ... </think> */
        X4_CHANNEL_TOOL_CALL = 2, /* inside <tool_call> ... </tool_call> */
};

enum x4_finish {
        X4_FINISH_NONE = 0, /* the request ended with an error */
        X4_FINISH_STOP = 1,
        X4_FINISH_LENGTH = 2,
        X4_FINISH_CANCELLED = 3,
        X4_FINISH_TOOL_CALLS = 4,
};

enum x4_health {
        X4_HEALTH_UNKNOWN = 0,
        X4_HEALTH_SERVING = 1,
        X4_HEALTH_LOADING = 2,
        X4_HEALTH_DRAINING = 3,
};

typedef struct x4_client x4_client;
typedef struct x4_request x4_request;

/* ---- one request ---------------------------------------------------------------------------- */

/* NULL when out of memory. A request has one prompt: text, token ids, or chat messages (the last
 * setter called wins). Strings are copied. Setters return 0, X4_E_NOMEM or X4_E_USAGE (a NULL
 * argument, or a value out of the enum; the request is left unchanged then), with the message in
 * x4_client_last_error(NULL). */
X4_API x4_request *x4_request_new(void);
X4_API void x4_request_free(x4_request *r);
X4_API int x4_request_set_text(x4_request *r, const char *text);
X4_API int x4_request_set_tokens(x4_request *r, const int32_t *ids, size_t n);
/* Appends a chat message (role: "system", "user", "assistant", "tool") and makes this a chat
 * request, rendered with the model's chat template by the server. */
X4_API int x4_request_add_message(x4_request *r, const char *role, const char *content);
/* The same with the fields an OpenAI history carries (each may be NULL): an assistant's earlier
 * reasoning and its tool calls (a JSON array of {"name", "arguments"} or OpenAI's
 * {"id", "type", "function": {...}} objects, parsed by the server; a bad one is refused naming
 * prompt.chat.messages[i].tool_calls_json), a tool message's tool name. content NULL = "". */
X4_API int x4_request_add_message_ex(x4_request *r, const char *role, const char *content,
                                     const char *reasoning, const char *tool_calls_json,
                                     const char *name);
X4_API int x4_request_set_tools_json(x4_request *r, const char *tools_json);
X4_API int x4_request_set_thinking(x4_request *r, bool enable);
/* Chat requests: false leaves out the template's generation prompt; a final assistant message
 * with text is then left open and the answer continues it (an assistant prefill: the answer
 * holds only the new text). Default true. */
X4_API int x4_request_set_add_generation_prompt(x4_request *r, bool add);
X4_API int x4_request_set_temperature(x4_request *r, float v);
X4_API int x4_request_set_top_p(x4_request *r, float v);
X4_API int x4_request_set_top_k(x4_request *r, uint32_t v);
X4_API int x4_request_set_min_p(x4_request *r, float v);
X4_API int x4_request_set_seed(x4_request *r, uint64_t v);
X4_API int x4_request_set_repetition_penalty(x4_request *r, float v);
X4_API int x4_request_set_presence_penalty(x4_request *r, float v);
X4_API int x4_request_set_frequency_penalty(x4_request *r, float v);
X4_API int x4_request_set_max_tokens(x4_request *r, uint32_t n);
X4_API int x4_request_add_stop(x4_request *r, const char *stop);
X4_API int x4_request_add_stop_id(x4_request *r, int32_t id);
X4_API int x4_request_set_snapshot(x4_request *r, const char *name);
X4_API int x4_request_set_logprobs(x4_request *r, uint32_t top_n);
X4_API int x4_request_set_thinking_budget(x4_request *r, int32_t tokens);
X4_API int x4_request_set_ignore_eos(x4_request *r, bool ignore);
/* No speculative decoding (MTP) for this request (protocol 1.2; the output is the same). */
X4_API int x4_request_set_no_mtp(x4_request *r, bool no_mtp);
/* Count the prompt only (protocol 1.4): the done's prompt_tokens is its size in tokens (a prompt
 * over the context included), nothing is generated or cached. A 1.3 server ignores it: check
 * x4_client_server_info's minor, or keep max_tokens small. */
X4_API int x4_request_set_count_only(x4_request *r, bool count_only);

/* Constrained decoding of the answer (GenerateRequest.constraint, protocol 1.1): after the
 * reasoning, when thinking is on, the output is any JSON object (X4_CONSTRAINT_JSON_OBJECT, arg
 * ignored), valid against the JSON Schema given as JSON text in arg (X4_CONSTRAINT_JSON_SCHEMA),
 * or a call of the tool named arg among the request's tools (X4_CONSTRAINT_TOOL; arg NULL or "":
 * any of them). X4_CONSTRAINT_NONE clears it. The server checks the schema and the name; a daemon
 * older than 1.1 ignores the field. */
enum x4_constraint {
        X4_CONSTRAINT_NONE = 0,
        X4_CONSTRAINT_JSON_OBJECT = 1,
        X4_CONSTRAINT_JSON_SCHEMA = 2,
        X4_CONSTRAINT_TOOL = 3,
        /* the answer is free; each call the model begins is held to the named tool's (arg) or
         * any tool's native syntax up to its end, any number of calls (protocol 1.6; an older
         * server refuses the request) */
        X4_CONSTRAINT_TOOL_CALLS = 4,
};
X4_API int x4_request_set_constraint(x4_request *r, int kind, const char *arg);
/* The constraint's schema keywords the mask cannot enforce (value bounds, pattern, formats, ...)
 * are ignored instead of refused (protocol 1.4; Constraint.lenient): for schemas written to
 * validate rather than to generate. A 1.3 server refuses them as before. */
X4_API int x4_request_set_constraint_lenient(x4_request *r, bool lenient);
/* With X4_CONSTRAINT_JSON_OBJECT / _JSON_SCHEMA: the answer may instead be tool calls of the
 * request's tools, chosen at its first token (protocol 1.6; Constraint.or_tool_calls). A 1.5
 * server ignores it and gives the JSON. */
X4_API int x4_request_set_constraint_or_tool_calls(x4_request *r, bool on);

/* ---- what comes back ------------------------------------------------------------------------ */

struct x4_top_logprob {
        int32_t token_id;
        float logprob;
        const char *text; /* may be NULL */
};

struct x4_token_logprob {
        int32_t token_id;
        float logprob;
        const struct x4_top_logprob *top;
        size_t n_top;
};

/* One piece of output. Pointers are valid during the callback only. */
struct x4_chunk {
        uint64_t request_id;
        const char *text; /* UTF-8, NUL-terminated, never splits a code point */
        size_t text_len;
        const int32_t *token_ids;
        size_t n_token_ids;
        int channel; /* enum x4_channel */
        const struct x4_token_logprob *logprobs;
        size_t n_logprobs;
        /* a finished tool call (channel X4_CHANNEL_TOOL_CALL), else NULL */
        const char *tool_name;
        const char *tool_arguments_json;
        /* the request's first chunk from a server of protocol minor 3+: the prompt's size
         * (snapshot and cached tokens included) and how many of them came from a snapshot or the
         * prefix cache, as Done reports them; 0 and 0 on later chunks */
        uint32_t prompt_tokens;
        uint32_t cached_tokens;
};

/* How a request ended. Strings are valid during the done callback, or for x4_client_generate()
 * until the next call on the client. */
struct x4_done {
        uint64_t request_id;
        int status;        /* X4_OK, or the enum x4_error the request failed with */
        int finish_reason; /* enum x4_finish */
        const char *stop;  /* the stop string that matched, or NULL */
        const char *error_message; /* when status != X4_OK */
        uint32_t prompt_tokens;
        uint32_t cached_tokens;
        uint32_t completion_tokens;
        uint32_t reasoning_tokens;
        double queue_ms, prefill_ms, decode_ms, total_ms;
        uint64_t server_request_id; /* the id `x4ctl stats` shows and `x4ctl cancel` takes */
        /* taken from reserved[] (same offsets before): finish_reason X4_FINISH_CANCELLED by the server shutting
         * down (its grace period over), not by a Cancel: worth sending again elsewhere or later.
         * Always false from servers that do not say (Done.server_shutdown). */
        uint32_t server_shutdown;
        uint32_t reserved_pad;
        uint64_t reserved[7];
};

/* Return nonzero to cancel the request (a Cancel is sent; the request still ends with a done). */
typedef int (*x4_chunk_cb)(const struct x4_chunk *chunk, void *userdata);
typedef void (*x4_done_cb)(const struct x4_done *done, void *userdata);

/* Prefill progress of a long prompt: done_tokens of total_tokens are in the cache. The server
 * (1.1+) sends it a few times a second for prompts that take more than about a second; userdata
 * is the one given with the request (x4_client_generate / x4_client_submit). */
typedef void (*x4_progress_cb)(uint64_t request_id, uint32_t done_tokens, uint32_t total_tokens,
                               void *userdata);

/* ---- the connection ------------------------------------------------------------------------- */

X4_API int x4_client_new(x4_client **ret);
/* Closes the connection; requests in flight are abandoned (the server cancels them). */
X4_API void x4_client_free(x4_client *c);
/* connect_ms bounds connect + handshake; response_ms bounds each wait for the next frame while a
 * blocking call waits (the server streams at least one frame per generated token, so this is an
 * inactivity limit, not a limit on a whole generation). -1 = wait forever. Defaults: 30000 ms and
 * 300000 ms (a long prompt's prefill on a CPU sends nothing for a while). */
X4_API int x4_client_set_timeouts(x4_client *c, int connect_ms, int response_ms);
/* Called for every request of this client whose prefill reports progress (NULL: none, the
 * default). Since 1.1. */
X4_API int x4_client_set_progress_cb(x4_client *c, x4_progress_cb cb);
/* Name sent in Hello, shown in the server's log ("x4ctl 0.1.0"). */
X4_API int x4_client_set_name(x4_client *c, const char *name);
/* path NULL: $X4_SOCKET, else X4_DEFAULT_SOCKET. Connects and does the Hello handshake. A peer
 * that answers it with bytes that are no xing4d frame (an HTTP server, say), or reads it and
 * closes without a word, is X4_E_PROTOCOL, its message saying the peer at the path does not speak
 * the xing4d protocol; X4_E_CLOSED is left for a peer that closed without reading it (xing4d
 * exiting, say). After the connection broke (X4_E_CLOSED, X4_E_IO, X4_E_PROTOCOL), it may be
 * called again on the same client. */
X4_API int x4_client_connect(x4_client *c, const char *path);
/* The message of the client's last failed call. NULL: the last failed call on this thread that
 * had no client to keep it ("no client" if none). */
X4_API const char *x4_client_last_error(const x4_client *c);
/* A short name for an enum x4_error ("invalid argument", "timeout"). */
X4_API const char *x4_strerror(int error);
/* From the server's HelloReply; "" before connect. */
X4_API const char *x4_client_server_version(const x4_client *c);
X4_API uint32_t x4_client_max_frame(const x4_client *c);

/* Blocking generation: returns when the request has ended. Returns X4_OK when it ended with a
 * Done (any finish reason, including cancelled), else the error (and done->status holds it too).
 * done may be NULL. */
X4_API int x4_client_generate(x4_client *c, const x4_request *req, x4_chunk_cb on_chunk,
                              void *userdata, struct x4_done *done);

/* ---- event-loop use ------------------------------------------------------------------------- */

/* The socket to poll for POLLIN. Nonblocking. -1 before connect. */
X4_API int x4_client_fd(const x4_client *c);
/* Send a request; callbacks run from x4_client_dispatch() (or while a blocking call waits).
 * on_done is called exactly once per submitted request, also when the connection breaks. */
X4_API int x4_client_submit(x4_client *c, const x4_request *req, x4_chunk_cb on_chunk,
                            x4_done_cb on_done, void *userdata, uint64_t *request_id);
/* Read what is available without blocking and run callbacks. Returns the number of frames
 * handled (0: nothing was ready), or an error (X4_E_CLOSED, X4_E_IO, X4_E_PROTOCOL) after which
 * every pending request has had its on_done with that status. */
X4_API int x4_client_dispatch(x4_client *c);
/* Submitted requests that have not ended yet. */
X4_API size_t x4_client_pending(const x4_client *c);
/* Ask the server to stop a request of this client. It ends with finish_reason CANCELLED (or
 * normally, if it finished first). X4_E_NOT_FOUND if the id is not pending here. */
X4_API int x4_client_cancel(x4_client *c, uint64_t request_id);
/* Pause (paused true) or resume a request submitted on this client: the server makes no decode
 * steps for it meanwhile (its cache pages are kept), as it does itself to every request of a client
 * that does not read. For a client relaying the output to a slower reader of its own, without
 * holding up its other requests. May be called from a callback. X4_E_UNIMPLEMENTED from a server
 * older than protocol 1.6; X4_E_NOT_FOUND when the request is not in flight. */
X4_API int x4_client_pause(x4_client *c, uint64_t request_id, bool paused);

/* ---- server state --------------------------------------------------------------------------- */

struct x4_stats {
        uint64_t uptime_ms;
        uint32_t connections;
        uint32_t requests_running;
        uint32_t requests_waiting;
        uint64_t requests_total;
        uint64_t requests_failed;
        uint64_t requests_cancelled;
        uint64_t prompt_tokens_total;
        uint64_t completion_tokens_total;
        double prefill_tok_s;
        double decode_tok_s;
        uint32_t cache_pages_total;
        uint32_t cache_pages_used;
        uint32_t cache_page_tokens;
        uint64_t memory_used;
        uint64_t memory_total;
        uint64_t prefix_hits;
        uint64_t prefix_tokens_reused;
        /* since 1.1, taken from reserved[] (same size, same offsets before): */
        uint64_t prefix_misses;
        uint64_t engine_steps;         /* backend forwards */
        uint64_t engine_steps_batched; /* forwards holding more than one request */
        uint32_t prefix_pages;         /* pages the prefix store keeps (not in cache_pages_used
                                        * unless a request shares them) */
        uint32_t batch_max;            /* most requests one forward held */
        /* since 1.2, taken from reserved[]: MTP draft tokens verified, and accepted */
        uint64_t mtp_drafted_tokens;
        uint64_t mtp_accepted_tokens;
        /* since 1.6, taken from reserved[] (0 from an older server): requests refused (an Error
         * other than internal: invalid, too large, not found, the queue full, draining); those
         * taken and not ended yet; of the refused, those the full queue refused (saturates at
         * UINT32_MAX; the protocol's field is 64-bit). The request counters add up:
         *   requests_total = completed + requests_failed + requests_cancelled + requests_refused
         *                    + requests_in_flight,
         * which gives the requests that ended with Done (completed); x4ctl stats shows it. */
        uint64_t requests_refused;
        uint32_t requests_in_flight;
        uint32_t requests_queue_full;
};

struct x4_info {
        char server_version[64];
        char backend[128];
        char model_architecture[32];
        char model_name[128];
        char model_fingerprint[80];
        char model_path[512];
        char config_source[512];
        uint32_t n_vocab, n_ctx, n_layer, n_embd, n_expert, n_expert_used;
        int32_t bos_id, eos_id;
        bool has_tokenizer;
        uint32_t max_frame;
        uint32_t max_tokens_default;
        uint32_t max_running;
        uint32_t cache_pages_total;
        uint32_t cache_page_tokens;
        uint64_t reserved[8];
};

struct x4_snapshot_info {
        char name[72];
        uint32_t n_tokens;
        uint64_t bytes;
        uint64_t created_unix;
};

struct x4_request_state {
        uint64_t server_request_id;
        bool running; /* false: waiting for admission */
        uint32_t prompt_tokens;
        uint32_t prefilled_tokens;
        uint32_t completion_tokens;
        uint64_t age_ms;
        uint32_t peer_pid, peer_uid;
        char client[64];
        bool paused; /* its client is not reading its output: no decode steps meanwhile */
};

X4_API int x4_client_stats(x4_client *c, struct x4_stats *ret);
/* The requests waiting or running in the daemon now (all connections); *ret is malloc'ed. */
X4_API int x4_client_requests(x4_client *c, struct x4_request_state **ret, size_t *n);
/* Cancel any connection's request by its server id (x4_done.server_request_id, or from
 * x4_client_requests()). X4_E_NOT_FOUND if it is not waiting or running. */
X4_API int x4_client_cancel_server(x4_client *c, uint64_t server_request_id);
X4_API int x4_client_info(x4_client *c, struct x4_info *ret);
/* status: enum x4_health; detail (may be NULL) gets the server's one-line detail. */
X4_API int x4_client_health(x4_client *c, int *status, char *detail, size_t detail_size);

/* Snapshots (the cache state after a prompt, resumed by x4_request_set_snapshot()). The source is
 * the prompt of `source` (text, tokens or chat), or, when source is NULL, the finished request
 * from_request of this connection (its prompt + output). A chat source (protocol 1.5) makes a
 * conversation prefix: its messages (a system message alone will do) rendered without the
 * generation prompt (x4_request_set_add_generation_prompt(source, true) is refused); a chat
 * request on it is rendered as the snapshot's messages followed by its own, whose system message
 * must be absent or the same. Text and tokens make a token prefix that any request's prompt
 * follows (proto/README.md, "snapshot"). */
X4_API int x4_client_snapshot_create(x4_client *c, const char *name, const x4_request *source,
                                     uint64_t from_request, struct x4_snapshot_info *ret);
/* The same with flags: X4_SNAPSHOT_REPLACE replaces a snapshot of that name; without it an
 * existing name is X4_E_ALREADY_EXISTS (as x4_client_snapshot_create) and left untouched. A
 * server older than protocol minor 3 ignores the flag and always replaces. */
#define X4_SNAPSHOT_REPLACE 1u
X4_API int x4_client_snapshot_create_flags(x4_client *c, const char *name, const x4_request *source,
                                           uint64_t from_request, unsigned flags,
                                           struct x4_snapshot_info *ret);
/* *ret is malloc'ed (free() it); *n entries. */
X4_API int x4_client_snapshot_list(x4_client *c, struct x4_snapshot_info **ret, size_t *n);
X4_API int x4_client_snapshot_drop(x4_client *c, const char *name);

#ifdef __cplusplus
}
#endif
