/* SPDX-License-Identifier: MIT */
/* The engine thread (docs/design.md "Threads and flow of one request"): admission against the cache
 * page budget, prompt preparation (chat template, tokenizer), continuous batching (each step is one
 * backend forward holding one decode token of every running request plus at most one prefill chunk
 * of a request being admitted), sampling, output channels, stop conditions, cancellation.
 *
 * It knows nothing of sockets or protobuf. The loop thread talks to it through two queues guarded
 * by one mutex: requests/cancels in (sched_submit, sched_cancel), events out (sched_pop_events),
 * with an eventfd (sched_event_fd) that becomes readable when events are waiting. Every submitted
 * request gets exactly one final event (DONE or ERROR), after which the scheduler no longer
 * touches its cookie. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

struct x4_model;
struct x4_backend;
struct x4_backend_ops;
struct tokenizer;

/* Error codes of ERROR events and sched_validate(); the values are the protocol's ErrorCode. */
enum sched_error {
        SCHED_ERR_INVALID_ARGUMENT = 1,
        SCHED_ERR_NOT_FOUND = 2,
        SCHED_ERR_UNAVAILABLE = 3,
        SCHED_ERR_TOO_LARGE = 4,
        SCHED_ERR_INTERNAL = 7,
        SCHED_ERR_RESOURCE_EXHAUSTED = 8,
        SCHED_ERR_UNIMPLEMENTED = 9,
        SCHED_ERR_ALREADY_EXISTS = 10,
};

/* The values are the protocol's FinishReason / Channel. */
enum sched_finish {
        SCHED_FINISH_STOP = 1,
        SCHED_FINISH_LENGTH = 2,
        SCHED_FINISH_CANCELLED = 3,
        SCHED_FINISH_TOOL_CALLS = 4,
};

enum sched_channel {
        SCHED_CHANNEL_CONTENT = 0,
        SCHED_CHANNEL_REASONING = 1,
        SCHED_CHANNEL_TOOL_CALL = 2,
};

enum sched_prompt {
        SCHED_PROMPT_TOKENS = 0,
        SCHED_PROMPT_TEXT = 1,
        SCHED_PROMPT_CHAT = 2,
};

/* GenerateRequest.constraint (engine/grammar.h says what each allows). */
enum sched_constraint {
        SCHED_CONSTRAINT_NONE = 0,
        SCHED_CONSTRAINT_JSON_OBJECT = 1,
        SCHED_CONSTRAINT_JSON_SCHEMA = 2,
        SCHED_CONSTRAINT_TOOL = 3,
        SCHED_CONSTRAINT_EMPTY = 4, /* a Constraint message with no kind set: refused */
        SCHED_CONSTRAINT_TOOL_CALLS = 5, /* free output, each call the model begins held to the tools */
};

struct sched_message {
        char *role, *content, *reasoning, *tool_calls_json, *name;
};

struct sched_sampling {
        bool has_temperature, has_top_p, has_top_k, has_min_p, has_seed;
        bool has_repetition_penalty, has_presence_penalty, has_frequency_penalty;
        float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
        uint32_t top_k;
        uint64_t seed;
};

/* A request as the loop thread hands it over; everything malloc'ed, owned by the scheduler after
 * a successful sched_submit (freed with sched_request_free). */
struct sched_request {
        void *cookie; /* the server's handle, returned in every event */
        uint64_t id;  /* set by sched_submit: the server-wide request id */
        enum sched_prompt prompt;
        int32_t *tokens;
        uint32_t n_tokens;
        char *text;
        struct sched_message *messages;
        size_t n_messages;
        char *tools_json;
        int enable_thinking; /* -1 unset (= on), 0, 1 */
        bool no_generation_prompt; /* Chat.add_generation_prompt = false: a final assistant
                                    * message is left open and the answer continues it */
        struct sched_sampling sampling;
        bool has_max_tokens;
        uint32_t max_tokens;
        char **stop;
        size_t n_stop;
        int32_t *stop_ids;
        size_t n_stop_ids;
        char *snapshot;        /* resume from this snapshot: its tokens precede the prompt */
        char *snapshot_create; /* not a generation: prefill the prompt, save it under this name */
        bool snapshot_replace; /* ... replacing a snapshot of that name (else ALREADY_EXISTS) */
        uint32_t logprobs;
        bool has_thinking_budget;
        int32_t thinking_budget;
        bool ignore_eos;
        bool no_mtp;   /* no speculative decoding for this request (MTP on in the daemon) */
        bool count_only; /* render and tokenize the prompt, report its size, generate nothing */
        bool echo_ids; /* fill token ids in CHUNK events */
        enum sched_constraint constraint;
        char *constraint_schema; /* JSON_SCHEMA: the schema's JSON text */
        char *constraint_tool;   /* TOOL, TOOL_CALLS: the function's name, NULL: any of tools_json */
        bool constraint_lenient; /* Constraint.lenient: unenforceable keywords ignored */
        bool constraint_or_calls; /* Constraint.or_tool_calls: the JSON or tool calls */
        /* who asked, for stats */
        uint32_t peer_pid, peer_uid;
        char client[64];
};

void sched_request_free(struct sched_request *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct sched_request *, sched_request_free);

enum sched_event_kind {
        SCHED_EVENT_CHUNK,
        SCHED_EVENT_DONE,
        SCHED_EVENT_ERROR,
        SCHED_EVENT_SNAPSHOT, /* final event of a snapshot_create request */
        SCHED_EVENT_PROGRESS, /* a long prefill's progress (done_tokens of total_tokens) */
};

/* A saved snapshot (state_dir/NAME.x4snap). */
struct sched_snapshot_info {
        char name[72];
        uint32_t n_tokens;
        uint64_t bytes;
        uint64_t created_unix;
};

struct sched_top_logprob {
        int32_t token_id;
        float logprob;
        char *text; /* the token's decoded text (specials included); NULL without a tokenizer */
};

struct sched_logprob {
        int32_t token_id;
        float logprob;
        struct sched_top_logprob *top;
        uint32_t n_top;
};

struct sched_event {
        struct sched_event *next;
        enum sched_event_kind kind;
        void *cookie;
        uint64_t id;
        /* CHUNK */
        char *text;
        size_t text_len;
        int32_t *tokens;
        uint32_t n_tokens;
        int channel;
        struct sched_logprob *logprobs;
        uint32_t n_logprobs;
        char *tool_name;      /* a finished tool call (channel TOOL_CALL) */
        char *tool_arguments; /* its JSON object */
        bool first;           /* the request's first chunk: prompt_tokens and cached_tokens set */
        /* DONE */
        int finish_reason;
        int32_t *sequence; /* prompt (snapshot tokens included) + output ids, for from_request */
        uint32_t n_sequence;
        char *stop; /* matched stop string */
        uint32_t prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens;
        double queue_ms, prefill_ms, decode_ms, total_ms;
        /* ERROR */
        int code; /* enum sched_error */
        char *message;
        bool cancelled; /* the request was cancelled (a snapshot create ends with an Error then) */
        /* SNAPSHOT */
        struct sched_snapshot_info snapshot;
        /* PROGRESS */
        uint32_t done_tokens, total_tokens;
};

void sched_event_free(struct sched_event *e); /* frees one event (not its next) */

#define SCHED_NO_QUEUE UINT32_MAX

struct sched_params {
        const struct x4_model *model;
        const struct x4_backend_ops *ops;
        struct x4_backend *backend;
        const struct tokenizer *tokenizer; /* NULL: token-id prompts only */
        uint32_t max_running;   /* requests decoding at once (default 16) */
        uint32_t max_waiting;   /* queued beyond that before UNAVAILABLE (0: the default 256;
                                 * SCHED_NO_QUEUE: none, a request finds a free slot or is refused) */
        uint32_t max_tokens_default; /* when a request sets none (default 1024) */
        uint32_t max_tokens_limit;   /* ceiling on any request's max_tokens (0: none) */
        uint32_t prefill_chunk; /* most prompt tokens of one request per step (0: the backend's
                                 * pass length, clamped to SCHED_PREFILL_CHUNK_MIN..MAX) */
        uint32_t prefill_budget; /* prompt tokens per step while others decode (0: adaptive) */
        uint32_t max_stop;      /* stop strings per request (default 16) */
        uint32_t max_messages;  /* chat messages per request (default 4096) */
        uint32_t max_snapshots; /* snapshot files in state_dir (default 64) */
        uint64_t max_snapshot_bytes; /* their total size (default 64 GiB) */
        uint64_t snapshot_chunk; /* cache bytes a snapshot being created copies out at a time
                                  * (default 64 MiB): the disk write runs on the prep thread */
        const char *state_dir;  /* snapshots live here; NULL: snapshots unavailable */
        bool prefix_off;        /* no automatic prefix reuse */
        /* MTP speculative decoding: the backend was created with mtp (x4_backend_params.mtp);
         * drafts per step and request, 1..SCHED_MTP_DRAFT_MAX (0: off) */
        uint32_t mtp_draft;
        /* sampled requests (temperature > 0): false = rejection sampling of the drafts (the
         * output follows the distribution of MTP off); true = a draft is the argmax and is kept
         * when it is the token the request's sampler draws (the output is MTP off's, seed for
         * seed, at lower acceptance) */
        bool mtp_match;
        uint32_t prefix_pages;  /* most pages the prefix store keeps (0: up to the whole cache;
                                 * stored pages are evicted LRU when admission needs them) */
};

#define SCHED_MTP_DRAFT_MAX 3u
/* the default --prefill-chunk follows the backend's pass length within these */
#define SCHED_PREFILL_CHUNK_MIN 256u
#define SCHED_PREFILL_CHUNK_MAX 4096u

/* The numbers a StatsReply carries. */
struct sched_stats {
        uint32_t running, waiting;
        /* Requests (generations and snapshot creates), counted under one lock so that every
         * snapshot of them adds up: total = completed + failed + cancelled + refused + in_flight.
         * total: every request received, taken or not; completed: ended with Done (stop,
         * length, tool calls; a count; a snapshot saved); cancelled: ended by a cancel or the
         * shutdown, before or after it started; refused: answered with an Error that is not the
         * daemon's fault (invalid, too large, not found, the queue full, draining), before or
         * after it was queued; failed: ended with ERROR_INTERNAL (out of memory, a backend or
         * disk error); queue_full: of the refused, those refused because the queue was full;
         * in_flight: taken, not ended yet (waiting or running, or between the threads) */
        uint64_t total, completed, failed, cancelled, refused, queue_full;
        uint32_t in_flight;
        uint64_t prompt_tokens, completion_tokens;
        double prefill_tok_s, decode_tok_s;
        uint32_t pages_total, pages_used, page_tokens; /* used: by requests (not counting pages
                                                         * only the prefix store keeps) */
        uint64_t memory_used, memory_total;
        uint64_t prefix_hits, prefix_tokens_reused;
        uint64_t prefix_misses;
        uint32_t prefix_pages; /* pages the prefix store holds */
        uint64_t steps, steps_multi; /* backend forwards; those batching > 1 request */
        uint32_t batch_max;          /* most requests one forward held */
        uint64_t preemptions;        /* requests preempted because the cache ran out */
        uint64_t mtp_drafted_tokens, mtp_accepted_tokens; /* MTP drafts verified; accepted */
};

struct sched_request_state {
        uint64_t id;
        bool running;
        bool paused;
        uint32_t prompt_tokens, prefilled_tokens, completion_tokens;
        uint64_t age_ms;
        uint32_t peer_pid, peer_uid;
        char client[64];
};

struct sched;

int sched_new(const struct sched_params *params, struct sched **ret);
/* Stops the engine thread (requests in flight are dropped without events) and frees. */
void sched_free(struct sched *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct sched *, sched_free);

int sched_start(struct sched *s);

/* Context limit: the most positions (prompt + output) one request may use. */
uint32_t sched_context_limit(const struct sched *s);
uint32_t sched_max_tokens_default(const struct sched *s);
uint32_t sched_max_running(const struct sched *s);

/* Check what can be checked before tokenizing (ranges, ids, counts). Returns 0, or an enum
 * sched_error with a one-line message naming the field in err. Read-only: safe from any thread. */
int sched_validate(const struct sched *s, const struct sched_request *r, char *err, size_t err_size);

/* Hand a validated request to the engine. On success the scheduler owns r (it may already be
 * freed when this returns: do not touch it) and *ret_id (may be NULL) is its server id. Returns
 * -EAGAIN (queue full), -ESHUTDOWN (draining) or -ENOMEM without taking it. Either way the
 * request is counted (sched_stats): taken, or refused / failed. */
int sched_submit(struct sched *s, struct sched_request *r, uint64_t *ret_id);
/* Count a request its caller answered with an Error before sched_submit (code an enum
 * sched_error): in total, and in failed for SCHED_ERR_INTERNAL, else in refused. */
void sched_count_unsubmitted(struct sched *s, int code);
/* Cancel by server id: the request ends with DONE{CANCELLED} at the next step boundary.
 * -ENOENT if it is not waiting or running. */
int sched_cancel(struct sched *s, uint64_t id);
/* Back-pressure: a paused request keeps its pages but takes no decode steps until resumed (its
 * client is not reading). -ENOENT if it is not waiting or running. */
int sched_pause(struct sched *s, uint64_t id, bool paused);
/* Stop admitting (submit fails with -ESHUTDOWN); with cancel_all, cancel everything in flight. */
void sched_drain(struct sched *s, bool cancel_all);
/* Requests submitted whose final event has not been popped yet. */
uint32_t sched_in_flight(struct sched *s);

/* eventfd: readable while events wait. Read it (8 bytes) then pop. */
int sched_event_fd(const struct sched *s);
/* Take all pending events, oldest first (a list linked by next); NULL if none. */
struct sched_event *sched_pop_events(struct sched *s);

/* Snapshots on disk (any thread: file operations only). Names: [A-Za-z0-9._-]{1,64}, not
 * starting with '.'. Errors are an enum sched_error with a message in err. */
int sched_snapshot_list(const struct sched *s, struct sched_snapshot_info **ret, size_t *n,
                        char *err, size_t err_size);
int sched_snapshot_drop(const struct sched *s, const char *name, struct sched_snapshot_info *ret,
                        char *err, size_t err_size);
/* 0 if name is a valid snapshot name, else SCHED_ERR_INVALID_ARGUMENT with a message. */
int sched_snapshot_check_name(const char *name, char *err, size_t err_size);

void sched_get_stats(struct sched *s, struct sched_stats *ret);
/* Requests waiting or running now; *ret malloc'ed. */
int sched_get_requests(struct sched *s, struct sched_request_state **ret, size_t *n);
