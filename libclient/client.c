/* SPDX-License-Identifier: MIT */
/* libx4client: one nonblocking AF_UNIX stream socket, the shared length-prefix framing
 * (common/frame.c) and protobuf-c frames. Blocking calls are a poll() loop that dispatches
 * every frame that arrives until the awaited one is there, so submitted requests keep streaming
 * while the caller waits for, say, stats. */
#include "x4client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/escape.h"
#include "common/frame.h"
#include "common/log.h"
#include "common/util.h"
#include "xing4.pb-c.h"

enum pending_kind {
        PENDING_GENERATE,
        PENDING_REPLY, /* stats, info, health, snapshot: one reply frame */
};

struct pending {
        struct pending *next;
        uint64_t id;
        enum pending_kind kind;
        x4_chunk_cb on_chunk;
        x4_done_cb on_done;
        void *userdata;
        bool cancel_sent;
        /* blocking waits */
        bool finished;
        Xing4__Frame *reply;  /* PENDING_REPLY: the reply frame (owned) */
        struct x4_done *done; /* blocking generate: where to copy the end */
};

struct x4_request {
        int prompt; /* 0 none, 1 text, 2 tokens, 3 chat */
        char *text;
        int32_t *tokens;
        size_t n_tokens;
        char **roles, **contents;
        char **reasonings, **tool_calls, **names; /* NULL entries: not given */
        size_t n_messages;
        char *tools_json;
        int thinking; /* -1 unset */
        int add_generation_prompt; /* -1 unset (= true) */
        Xing4__SamplingParams sampling;
        bool has_max_tokens;
        uint32_t max_tokens;
        char **stops;
        size_t n_stops;
        int32_t *stop_ids;
        size_t n_stop_ids;
        char *snapshot;
        bool has_logprobs;
        uint32_t logprobs;
        bool has_thinking_budget;
        int32_t thinking_budget;
        int ignore_eos; /* -1 unset */
        bool no_mtp;
        bool count_only;
        int constraint; /* enum x4_constraint */
        char *constraint_arg; /* the schema's JSON text, or the tool's name (NULL = any tool) */
        bool constraint_lenient;
        bool constraint_or_calls;
};

struct x4_client {
        int fd;
        int connect_ms, response_ms;
        char name[128];
        char path[sizeof(((struct sockaddr_un *) 0)->sun_path)];
        struct frame_decoder *decoder;
        uint32_t max_frame; /* what the server accepts */
        uint64_t next_id;
        struct pending *pending;
        char server_version[64];
        uint32_t server_minor;  /* HelloReply.proto_minor */
        char last_error[512];
        char done_error[512]; /* error text of the last blocking generate */
        char done_stop[256];
        bool broken;
        int broken_code;        /* why it broke (enum x4_error) */
        char broken_error[512]; /* and the message said then */
        x4_progress_cb on_progress;
        /* while connect waits for the HelloReply: the first bytes the peer sent, to tell a peer
         * that does not speak the protocol from a xing4d that closed or refused */
        bool handshaking;
        uint8_t peer_head[16];
        size_t n_peer_head;
        size_t frames_in; /* frames decoded since connect */
};

/* ---- helpers -------------------------------------------------------------------------------- */

/* The message of a call that had no client to keep it in (a NULL client, the x4_request_*
 * functions): x4_client_last_error(NULL) returns it, per thread. */
static _Thread_local char orphan_error[512] = "no client";

_printf_(3, 4) static int fail(x4_client *c, int code, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        if (c)
                vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
        else
                vsnprintf(orphan_error, sizeof orphan_error, fmt, ap);
        va_end(ap);
        return code;
}

/* A call refused for a NULL argument, named as the header names it: "x4_client_stats: ret is
 * NULL, a struct x4_stats to fill expected". */
static int null_arg(x4_client *c, const char *func, const char *name, const char *expected) {
        return fail(c, X4_E_USAGE, "%s: %s is NULL, %s expected", func, name, expected);
}

/* Refuse the call (X4_E_USAGE, the message naming the function and the argument) when `arg` is
 * NULL; `c` keeps the message (NULL: the thread's, see orphan_error). */
#define REQUIRE(c, arg, expected)                                                                  \
        do {                                                                                       \
                if (!(arg))                                                                        \
                        return null_arg((c), __func__, #arg, (expected));                         \
        } while (0)
#define REQUIRE_CLIENT(c) REQUIRE(NULL, c, "a client from x4_client_new()")
#define REQUIRE_REQUEST(r) REQUIRE(NULL, r, "a request from x4_request_new()")

/* The connection is not there to use: never made, or broken by an earlier failure (whose
 * message is repeated, as last_error has moved on since). */
static int not_connected(x4_client *c, const char *func) {
        if (c->fd >= 0 && c->broken)
                return fail(c, X4_E_USAGE, "%s: the connection to %s broke earlier (%s); "
                            "x4_client_connect() again", func, c->path, c->broken_error);
        return fail(c, X4_E_USAGE, "%s: not connected; x4_client_connect() first", func);
}

static char *strdup_or_null(const char *s) {
        return s ? strdup(s) : NULL;
}

static void copy_str(char *dst, size_t size, const char *src) {
        snprintf(dst, size, "%s", src ? src : "");
}

static int error_from_code(int code) {
        if (code >= 1 && code <= 10)
                return -code;
        return X4_E_INTERNAL;
}

X4_API const char *x4_strerror(int e) {
        switch (e) {
        case X4_OK: return "ok";
        case X4_E_INVALID_ARGUMENT: return "invalid argument";
        case X4_E_NOT_FOUND: return "not found";
        case X4_E_UNAVAILABLE: return "unavailable";
        case X4_E_TOO_LARGE: return "too large";
        case X4_E_PROTOCOL: return "protocol error";
        case X4_E_VERSION_MISMATCH: return "protocol version mismatch";
        case X4_E_INTERNAL: return "internal server error";
        case X4_E_RESOURCE_EXHAUSTED: return "resource exhausted";
        case X4_E_UNIMPLEMENTED: return "not implemented";
        case X4_E_ALREADY_EXISTS: return "already exists";
        case X4_E_CONNECT: return "cannot connect";
        case X4_E_TIMEOUT: return "timeout";
        case X4_E_IO: return "I/O error";
        case X4_E_CLOSED: return "connection closed";
        case X4_E_NOMEM: return "out of memory";
        case X4_E_USAGE: return "API misuse";
        default: return "unknown error";
        }
}

/* ---- requests ------------------------------------------------------------------------------- */

X4_API x4_request *x4_request_new(void) {
        x4_request *r = calloc(1, sizeof *r);
        if (!r)
                return NULL;
        Xing4__SamplingParams init = XING4__SAMPLING_PARAMS__INIT;
        r->sampling = init;
        r->thinking = -1;
        r->add_generation_prompt = -1;
        r->ignore_eos = -1;
        return r;
}

static void free_strv(char **v, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(v[i]);
        free(v);
}

X4_API void x4_request_free(x4_request *r) {
        if (!r)
                return;
        free(r->text);
        free(r->tokens);
        free_strv(r->roles, r->n_messages);
        free_strv(r->contents, r->n_messages);
        free_strv(r->reasonings, r->n_messages);
        free_strv(r->tool_calls, r->n_messages);
        free_strv(r->names, r->n_messages);
        free(r->tools_json);
        free_strv(r->stops, r->n_stops);
        free(r->stop_ids);
        free(r->snapshot);
        free(r->constraint_arg);
        free(r);
}

X4_API int x4_request_set_text(x4_request *r, const char *text) {
        REQUIRE_REQUEST(r);
        REQUIRE(NULL, text, "the prompt's text");
        char *t = strdup(text);
        if (!t)
                return fail(NULL, X4_E_NOMEM, "%s: out of memory", __func__);
        free(r->text);
        r->text = t;
        r->prompt = 1;
        return 0;
}

X4_API int x4_request_set_tokens(x4_request *r, const int32_t *ids, size_t n) {
        REQUIRE_REQUEST(r);
        if (!ids && n > 0)
                return fail(NULL, X4_E_USAGE, "%s: ids is NULL with n %zu, %zu token ids expected",
                            __func__, n, n);
        int32_t *t = malloc(n ? n * sizeof *t : 1);
        if (!t)
                return fail(NULL, X4_E_NOMEM, "%s: out of memory", __func__);
        if (n)
                memcpy(t, ids, n * sizeof *t);
        free(r->tokens);
        r->tokens = t;
        r->n_tokens = n;
        r->prompt = 2;
        return 0;
}

static int strv_push(char ***v, size_t *n, const char *s) {
        char *d = strdup(s);
        char **nv = d ? realloc(*v, (*n + 1) * sizeof **v) : NULL;
        if (!nv) {
                free(d);
                return X4_E_NOMEM;
        }
        nv[(*n)++] = d;
        *v = nv;
        return 0;
}

/* Grow v (n entries) by one slot holding a copy of s, or NULL when s is NULL. */
static int optv_push(char ***v, size_t n, const char *s, char **ret) {
        char *d = NULL;
        char **nv;
        if (s && !(d = strdup(s)))
                return X4_E_NOMEM;
        nv = realloc(*v, (n + 1) * sizeof **v);
        if (!nv) {
                free(d);
                return X4_E_NOMEM;
        }
        nv[n] = d;
        *v = nv;
        *ret = d;
        return 0;
}

X4_API int x4_request_add_message_ex(x4_request *r, const char *role, const char *content,
                                     const char *reasoning, const char *tool_calls_json,
                                     const char *name) {
        const char *vals[5] = { role, content ? content : "", reasoning, tool_calls_json, name };
        char ***arrays[5];
        char *made[5] = {};
        REQUIRE_REQUEST(r);
        REQUIRE(NULL, role, "\"system\", \"user\", \"assistant\" or \"tool\"");
        arrays[0] = &r->roles;
        arrays[1] = &r->contents;
        arrays[2] = &r->reasonings;
        arrays[3] = &r->tool_calls;
        arrays[4] = &r->names;
        for (size_t i = 0; i < 5; i++)
                if (optv_push(arrays[i], r->n_messages, vals[i], &made[i]) < 0) {
                        /* the arrays keep n_messages entries: drop what this call added */
                        for (size_t k = 0; k < i; k++)
                                free(made[k]);
                        return fail(NULL, X4_E_NOMEM, "%s: out of memory", __func__);
                }
        r->n_messages++;
        r->prompt = 3;
        return 0;
}

X4_API int x4_request_add_message(x4_request *r, const char *role, const char *content) {
        REQUIRE(NULL, content, "the message's text (x4_request_add_message_ex takes NULL as \"\")");
        return x4_request_add_message_ex(r, role, content, NULL, NULL, NULL);
}

X4_API int x4_request_set_tools_json(x4_request *r, const char *tools_json) {
        REQUIRE_REQUEST(r);
        char *t = strdup_or_null(tools_json);
        if (tools_json && !t)
                return fail(NULL, X4_E_NOMEM, "%s: out of memory", __func__);
        free(r->tools_json);
        r->tools_json = t;
        return 0;
}

X4_API int x4_request_set_thinking(x4_request *r, bool enable) {
        REQUIRE_REQUEST(r);
        r->thinking = enable;
        return 0;
}

X4_API int x4_request_set_add_generation_prompt(x4_request *r, bool add) {
        REQUIRE_REQUEST(r);
        r->add_generation_prompt = add;
        return 0;
}

#define SAMPLING_SETTER(field, type)                                                               \
        X4_API int x4_request_set_##field(x4_request *r, type v) {                                 \
                REQUIRE_REQUEST(r);                                                                \
                r->sampling.has_##field = 1;                                                       \
                r->sampling.field = v;                                                             \
                return 0;                                                                          \
        }
SAMPLING_SETTER(temperature, float)
SAMPLING_SETTER(top_p, float)
SAMPLING_SETTER(top_k, uint32_t)
SAMPLING_SETTER(min_p, float)
SAMPLING_SETTER(seed, uint64_t)
SAMPLING_SETTER(repetition_penalty, float)
SAMPLING_SETTER(presence_penalty, float)
SAMPLING_SETTER(frequency_penalty, float)

X4_API int x4_request_set_max_tokens(x4_request *r, uint32_t n) {
        REQUIRE_REQUEST(r);
        r->has_max_tokens = true;
        r->max_tokens = n;
        return 0;
}

X4_API int x4_request_add_stop(x4_request *r, const char *stop) {
        REQUIRE_REQUEST(r);
        REQUIRE(NULL, stop, "the stop string");
        if (strv_push(&r->stops, &r->n_stops, stop) < 0)
                return fail(NULL, X4_E_NOMEM, "%s: out of memory", __func__);
        return 0;
}

X4_API int x4_request_add_stop_id(x4_request *r, int32_t id) {
        REQUIRE_REQUEST(r);
        int32_t *n = realloc(r->stop_ids, (r->n_stop_ids + 1) * sizeof *n);
        if (!n)
                return fail(NULL, X4_E_NOMEM, "%s: out of memory", __func__);
        n[r->n_stop_ids++] = id;
        r->stop_ids = n;
        return 0;
}

X4_API int x4_request_set_snapshot(x4_request *r, const char *name) {
        REQUIRE_REQUEST(r);
        char *s = strdup_or_null(name);
        if (name && !s)
                return fail(NULL, X4_E_NOMEM, "%s: out of memory", __func__);
        free(r->snapshot);
        r->snapshot = s;
        return 0;
}

X4_API int x4_request_set_logprobs(x4_request *r, uint32_t top_n) {
        REQUIRE_REQUEST(r);
        r->has_logprobs = true;
        r->logprobs = top_n;
        return 0;
}

X4_API int x4_request_set_thinking_budget(x4_request *r, int32_t tokens) {
        REQUIRE_REQUEST(r);
        r->has_thinking_budget = true;
        r->thinking_budget = tokens;
        return 0;
}

X4_API int x4_request_set_no_mtp(x4_request *r, bool no_mtp) {
        REQUIRE_REQUEST(r);
        r->no_mtp = no_mtp;
        return 0;
}

X4_API int x4_request_set_constraint_lenient(x4_request *r, bool lenient) {
        REQUIRE_REQUEST(r);
        r->constraint_lenient = lenient;
        return 0;
}

X4_API int x4_request_set_constraint_or_tool_calls(x4_request *r, bool on) {
        REQUIRE_REQUEST(r);
        r->constraint_or_calls = on;
        return 0;
}

X4_API int x4_request_set_count_only(x4_request *r, bool count_only) {
        REQUIRE_REQUEST(r);
        r->count_only = count_only;
        return 0;
}

X4_API int x4_request_set_ignore_eos(x4_request *r, bool ignore) {
        REQUIRE_REQUEST(r);
        r->ignore_eos = ignore;
        return 0;
}

X4_API int x4_request_set_constraint(x4_request *r, int kind, const char *arg) {
        REQUIRE_REQUEST(r);
        if (kind < X4_CONSTRAINT_NONE || kind > X4_CONSTRAINT_TOOL_CALLS)
                return fail(NULL, X4_E_USAGE, "%s: kind %d is not an enum x4_constraint (%d to %d)",
                            __func__, kind, X4_CONSTRAINT_NONE, X4_CONSTRAINT_TOOL_CALLS);
        if (kind == X4_CONSTRAINT_JSON_SCHEMA && !arg)
                return null_arg(NULL, __func__, "arg",
                                "the JSON Schema's text with X4_CONSTRAINT_JSON_SCHEMA");
        char *a = NULL;
        if ((kind == X4_CONSTRAINT_JSON_SCHEMA || kind == X4_CONSTRAINT_TOOL || kind == X4_CONSTRAINT_TOOL_CALLS) &&
            arg && !(a = strdup(arg)))
                return fail(NULL, X4_E_NOMEM, "%s: out of memory", __func__);
        free(r->constraint_arg);
        r->constraint = kind;
        r->constraint_arg = a;
        return 0;
}

/* The protobuf view of a request's prompt; points into r (nothing to free but the arrays). */
struct chat_view {
        Xing4__Chat chat;
        Xing4__ChatMessage *msgs;
        Xing4__ChatMessage **msgp;
        Xing4__TokenIds ids;
};

static int chat_view_init(struct chat_view *v, const x4_request *r) {
        Xing4__Chat chat = XING4__CHAT__INIT;
        Xing4__TokenIds ids = XING4__TOKEN_IDS__INIT;
        v->chat = chat;
        v->ids = ids;
        v->msgs = NULL;
        v->msgp = NULL;
        if (r->prompt == 2) {
                v->ids.n_ids = r->n_tokens;
                v->ids.ids = r->tokens;
        } else if (r->prompt == 3) {
                v->msgs = calloc(r->n_messages, sizeof *v->msgs);
                v->msgp = calloc(r->n_messages, sizeof *v->msgp);
                if (!v->msgs || !v->msgp)
                        return X4_E_NOMEM;
                for (size_t i = 0; i < r->n_messages; i++) {
                        Xing4__ChatMessage m = XING4__CHAT_MESSAGE__INIT;
                        m.role = r->roles[i];
                        m.content = r->contents[i];
                        m.reasoning = r->reasonings[i];
                        m.tool_calls_json = r->tool_calls[i];
                        m.name = r->names[i];
                        v->msgs[i] = m;
                        v->msgp[i] = &v->msgs[i];
                }
                v->chat.n_messages = r->n_messages;
                v->chat.messages = v->msgp;
                v->chat.tools_json = r->tools_json;
                if (r->thinking >= 0) {
                        v->chat.has_enable_thinking = 1;
                        v->chat.enable_thinking = r->thinking;
                }
                if (r->add_generation_prompt >= 0) {
                        v->chat.has_add_generation_prompt = 1;
                        v->chat.add_generation_prompt = r->add_generation_prompt;
                }
        }
        return 0;
}

static void chat_view_done(struct chat_view *v) {
        free(v->msgs);
        free(v->msgp);
}

/* ---- connection ----------------------------------------------------------------------------- */

X4_API int x4_client_new(x4_client **ret) {
        REQUIRE(NULL, ret, "a place for the new client");
        x4_client *c = calloc(1, sizeof *c);
        if (!c)
                return fail(NULL, X4_E_NOMEM, "%s: out of memory", __func__);
        c->fd = -1;
        c->connect_ms = 30000;
        c->response_ms = 300000;
        c->next_id = 1;
        snprintf(c->name, sizeof c->name, "libx4client");
        /* the framing code logs through the library's private copy of log.c; keep it off the
         * host program's stderr (errors reach the caller through x4_client_last_error()) */
        log_set_max_level(LOG_CRIT);
        *ret = c;
        return 0;
}

static void pending_free(struct pending *p) {
        if (p->reply)
                xing4__frame__free_unpacked(p->reply, NULL);
        free(p);
}

static struct pending *pending_find(x4_client *c, uint64_t id, struct pending ***link) {
        for (struct pending **l = &c->pending; *l; l = &(*l)->next)
                if ((*l)->id == id) {
                        if (link)
                                *link = l;
                        return *l;
                }
        return NULL;
}

static void pending_unlink(x4_client *c, struct pending *p) {
        struct pending **l;
        if (pending_find(c, p->id, &l))
                *l = p->next;
}

/* A generate request ended: tell its owner, drop it (unless a blocking wait holds it). */
static void finish_generate(x4_client *c, struct pending *p, struct x4_done *d) {
        if (p->done) {
                /* blocking: copy strings into the client so they outlive the frame */
                copy_str(c->done_error, sizeof c->done_error, d->error_message);
                copy_str(c->done_stop, sizeof c->done_stop, d->stop);
                *p->done = *d;
                p->done->error_message = d->error_message ? c->done_error : NULL;
                p->done->stop = d->stop ? c->done_stop : NULL;
        }
        if (p->on_done)
                p->on_done(d, p->userdata);
        p->finished = true;
        if (!p->done) {
                pending_unlink(c, p);
                pending_free(p);
        }
}

static void fail_all(x4_client *c, int code) {
        struct pending *p = c->pending, *next;
        for (; p; p = next) {
                next = p->next;
                if (p->finished)
                        continue;
                if (p->kind == PENDING_GENERATE) {
                        struct x4_done d = { .request_id = p->id, .status = code,
                                             .error_message = c->last_error };
                        finish_generate(c, p, &d);
                } else
                        p->finished = true;
        }
}

/* Close the socket and forget the connection's requests (a broken connection has ended them
 * all already): the client is as x4_client_new() left it, its settings kept. */
static void disconnect(x4_client *c) {
        while (c->pending) {
                struct pending *p = c->pending;
                c->pending = p->next;
                pending_free(p);
        }
        if (c->fd >= 0)
                close(c->fd);
        c->fd = -1;
        frame_decoder_free(c->decoder);
        c->decoder = NULL;
        c->broken = false;
        c->handshaking = false;
}

X4_API void x4_client_free(x4_client *c) {
        if (!c)
                return;
        disconnect(c);
        free(c);
}

X4_API int x4_client_set_timeouts(x4_client *c, int connect_ms, int response_ms) {
        REQUIRE_CLIENT(c);
        if (connect_ms < -1 || response_ms < -1)
                return fail(c, X4_E_USAGE, "%s: %s %d is out of range: milliseconds >= 0, or -1 "
                            "for no limit, expected", __func__,
                            connect_ms < -1 ? "connect_ms" : "response_ms",
                            connect_ms < -1 ? connect_ms : response_ms);
        c->connect_ms = connect_ms;
        c->response_ms = response_ms;
        return 0;
}

X4_API int x4_client_set_progress_cb(x4_client *c, x4_progress_cb cb) {
        REQUIRE_CLIENT(c);
        c->on_progress = cb;
        return 0;
}

X4_API int x4_client_set_name(x4_client *c, const char *name) {
        REQUIRE_CLIENT(c);
        REQUIRE(c, name, "the name to send in Hello");
        copy_str(c->name, sizeof c->name, name);
        return 0;
}

X4_API const char *x4_client_last_error(const x4_client *c) {
        return c ? c->last_error : orphan_error;
}

X4_API const char *x4_client_server_version(const x4_client *c) {
        return c ? c->server_version : "";
}

X4_API uint32_t x4_client_max_frame(const x4_client *c) {
        return c ? c->max_frame : 0;
}

X4_API int x4_client_fd(const x4_client *c) {
        return c ? c->fd : -1;
}

X4_API size_t x4_client_pending(const x4_client *c) {
        size_t n = 0;
        if (!c)
                return 0;
        for (struct pending *p = c->pending; p; p = p->next)
                if (p->kind == PENDING_GENERATE && !p->finished)
                        n++;
        return n;
}

/* Wait for fd readiness; timeout_ms -1 = forever. 1 ready, 0 timeout, <0 error. */
static int wait_fd(int fd, short events, int timeout_ms) {
        struct pollfd pfd = { .fd = fd, .events = events };
        for (;;) {
                int r = poll(&pfd, 1, timeout_ms);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0)
                        return -errno;
                return r;
        }
}

static int break_connection(x4_client *c, int code) {
        c->broken = true;
        c->broken_code = code;
        copy_str(c->broken_error, sizeof c->broken_error, c->last_error);
        fail_all(c, code);
        return code;
}

/* The peer's first bytes, as text for a message: 'HTTP/1.1 400 Bad'. */
static const char *peer_head_text(const x4_client *c, char *buf, size_t size) {
        char esc[96];
        cescape((const char *) c->peer_head, c->n_peer_head, esc, sizeof esc);
        snprintf(buf, size, "'%s'%s", esc, c->n_peer_head == sizeof c->peer_head ? "..." : "");
        return buf;
}

/* The handshake failed on what the peer sent (bytes that are no xing4d frame, or a close after
 * them): it is not xing4d. */
static int not_xing4d(x4_client *c) {
        char head[128];
        bool http = c->n_peer_head >= 5 && memcmp(c->peer_head, "HTTP/", 5) == 0;
        fail(c, X4_E_PROTOCOL, "%s: the peer does not speak the xing4d protocol: it answered the "
             "Hello handshake with %s, not a xing4d frame%s", c->path,
             peer_head_text(c, head, sizeof head),
             http ? " (an HTTP server: is this the bridge's or another service's socket?)" : "");
        return break_connection(c, X4_E_PROTOCOL);
}

/* The peer ended the connection: reset = closed before reading all we sent (ECONNRESET, EPIPE),
 * else an orderly close. After the handshake that is the server's doing. During it, xing4d either
 * answers Hello or says why it refuses: a peer that read the Hello and closed without a word does
 * not speak the protocol; one that did not even read it may be xing4d exiting. */
static int peer_closed(x4_client *c, bool reset) {
        if (!c->handshaking || c->frames_in > 0)
                fail(c, X4_E_CLOSED, "%s: server closed the connection", c->path);
        else if (c->n_peer_head > 0)
                return not_xing4d(c);
        else if (!reset) {
                fail(c, X4_E_PROTOCOL, "%s: the peer does not speak the xing4d protocol: it read the "
                     "Hello handshake and closed the connection without answering (xing4d answers "
                     "it, or says why it refuses)", c->path);
                return break_connection(c, X4_E_PROTOCOL);
        } else
                fail(c, X4_E_CLOSED, "%s: the peer closed the connection without reading the Hello "
                     "handshake: xing4d exiting, or a program that does not speak the xing4d "
                     "protocol", c->path);
        return break_connection(c, X4_E_CLOSED);
}

/* Send one frame; blocks (bounded by the response timeout) while the socket buffer is full. */
static int send_frame(x4_client *c, const Xing4__Frame *f) {
        size_t n = xing4__frame__get_packed_size(f);
        uint8_t *buf;
        size_t off = 0;

        if (c->fd < 0 || c->broken)
                return not_connected(c, "send");
        if (c->max_frame && n > c->max_frame)
                return fail(c, X4_E_TOO_LARGE,
                            "request of %zu bytes exceeds the server's frame limit of %u bytes", n,
                            c->max_frame);
        buf = malloc(FRAME_HEADER_SIZE + n);
        if (!buf)
                return fail(c, X4_E_NOMEM, "out of memory packing a %zu-byte frame", n);
        (void) frame_encode_header(n, FRAME_MAX_LIMIT, buf);
        xing4__frame__pack(f, buf + FRAME_HEADER_SIZE);
        n += FRAME_HEADER_SIZE;
        while (off < n) {
                ssize_t w = send(c->fd, buf + off, n - off, MSG_NOSIGNAL);
                if (w >= 0) {
                        off += (size_t) w;
                        continue;
                }
                if (errno == EINTR)
                        continue;
                if (errno == EAGAIN) {
                        int r = wait_fd(c->fd, POLLOUT, c->response_ms);
                        if (r > 0)
                                continue;
                        free(buf);
                        if (r == 0) {
                                fail(c, X4_E_TIMEOUT, "%s: server did not read a request within %d ms",
                                     c->path, c->response_ms);
                                return break_connection(c, X4_E_TIMEOUT);
                        }
                        errno = -r;
                }
                int e = errno;
                free(buf);
                if (e == EPIPE || e == ECONNRESET)
                        return peer_closed(c, true);
                fail(c, X4_E_IO, "%s: write failed: %s", c->path, strerror(e));
                return break_connection(c, X4_E_IO);
        }
        free(buf);
        return 0;
}

static void handle_chunk(x4_client *c, struct pending *p, const Xing4__TokenChunk *tc,
                         uint64_t id) {
        struct x4_token_logprob *lps = NULL;
        struct x4_top_logprob *tops = NULL;
        size_t n_top_total = 0;

        if (!p->on_chunk || p->cancel_sent)
                return;
        for (size_t i = 0; i < tc->n_logprobs; i++)
                n_top_total += tc->logprobs[i]->n_top;
        if (tc->n_logprobs) {
                lps = calloc(tc->n_logprobs, sizeof *lps);
                tops = calloc(n_top_total ? n_top_total : 1, sizeof *tops);
                if (!lps || !tops) {
                        free(lps);
                        free(tops);
                        lps = NULL;
                        tops = NULL;
                } else {
                        size_t k = 0;
                        for (size_t i = 0; i < tc->n_logprobs; i++) {
                                const Xing4__TokenLogprob *l = tc->logprobs[i];
                                lps[i].token_id = l->token_id;
                                lps[i].logprob = l->logprob;
                                lps[i].top = tops + k;
                                lps[i].n_top = l->n_top;
                                for (size_t j = 0; j < l->n_top; j++, k++) {
                                        tops[k].token_id = l->top[j]->token_id;
                                        tops[k].logprob = l->top[j]->logprob;
                                        tops[k].text = l->top[j]->text;
                                }
                        }
                }
        }
        struct x4_chunk ch = {
                .request_id = id,
                .text = tc->text ? tc->text : "",
                .text_len = tc->text ? strlen(tc->text) : 0,
                .token_ids = tc->token_ids,
                .n_token_ids = tc->n_token_ids,
                .channel = tc->has_channel ? (int) tc->channel : X4_CHANNEL_CONTENT,
                .logprobs = lps,
                .n_logprobs = lps ? tc->n_logprobs : 0,
                .tool_name = tc->tool_call ? tc->tool_call->name : NULL,
                .tool_arguments_json = tc->tool_call ? tc->tool_call->arguments_json : NULL,
                .prompt_tokens = tc->has_prompt_tokens ? tc->prompt_tokens : 0,
                .cached_tokens = tc->has_cached_tokens ? tc->cached_tokens : 0,
        };
        if (p->on_chunk(&ch, p->userdata) != 0)
                (void) x4_client_cancel(c, id);
        free(lps);
        free(tops);
}

/* One frame from the server. Returns <0 on a fatal protocol error. */
static int handle_frame(x4_client *c, Xing4__Frame *f) {
        uint64_t id = f->has_request_id ? f->request_id : 0;
        struct pending *p = pending_find(c, id, NULL);

        if (!p || p->finished) {
                if (f->body_case == XING4__FRAME__BODY_ERROR) {
                        /* connection-level error: the server closes after it */
                        const Xing4__Error *e = f->error;
                        int code = error_from_code(e->has_code ? (int) e->code : 0);
                        fail(c, code, "%s", e->message ? e->message : "server error");
                        xing4__frame__free_unpacked(f, NULL);
                        return break_connection(c, code);
                }
                /* a late frame of a request we already finished: ignore */
                xing4__frame__free_unpacked(f, NULL);
                return 0;
        }

        if (p->kind == PENDING_REPLY) {
                if (f->body_case == XING4__FRAME__BODY_PROGRESS) {
                        /* progress is not the reply a blocking call waits for */
                        xing4__frame__free_unpacked(f, NULL);
                        return 0;
                }
                if (p->reply)
                        xing4__frame__free_unpacked(p->reply, NULL);
                p->reply = f;
                p->finished = true;
                return 0;
        }

        switch (f->body_case) {
        case XING4__FRAME__BODY_CHUNK:
                handle_chunk(c, p, f->chunk, id);
                break;
        case XING4__FRAME__BODY_DONE: {
                const Xing4__Done *dn = f->done;
                struct x4_done d = { .request_id = id, .status = X4_OK };
                d.finish_reason = dn->has_finish_reason ? (int) dn->finish_reason : X4_FINISH_STOP;
                d.stop = dn->stop;
                d.server_request_id = dn->server_request_id;
                d.server_shutdown = dn->has_server_shutdown && dn->server_shutdown;
                if (dn->usage) {
                        d.prompt_tokens = dn->usage->prompt_tokens;
                        d.cached_tokens = dn->usage->cached_tokens;
                        d.completion_tokens = dn->usage->completion_tokens;
                        d.reasoning_tokens = dn->usage->reasoning_tokens;
                }
                if (dn->timings) {
                        d.queue_ms = dn->timings->queue_ms;
                        d.prefill_ms = dn->timings->prefill_ms;
                        d.decode_ms = dn->timings->decode_ms;
                        d.total_ms = dn->timings->total_ms;
                }
                finish_generate(c, p, &d);
                break;
        }
        case XING4__FRAME__BODY_ERROR: {
                const Xing4__Error *e = f->error;
                struct x4_done d = { .request_id = id };
                d.status = error_from_code(e->has_code ? (int) e->code : 0);
                d.error_message = e->message ? e->message : "server error";
                fail(c, d.status, "%s", d.error_message);
                finish_generate(c, p, &d);
                break;
        }
        case XING4__FRAME__BODY_PROGRESS:
                if (c->on_progress && f->progress)
                        c->on_progress(id, f->progress->done_tokens, f->progress->total_tokens,
                                       p->userdata);
                break;
        default:
                break; /* a newer server's body we do not know: ignore (add-only protocol) */
        }
        xing4__frame__free_unpacked(f, NULL);
        return 0;
}

/* Read once (nonblocking) and handle every complete frame. Returns frames handled, or <0. */
static int read_some(x4_client *c) {
        uint8_t buf[65536];
        ssize_t n;
        int frames = 0;

        if (c->fd < 0 || c->broken)
                return not_connected(c, "read");
        n = recv(c->fd, buf, sizeof buf, 0);
        if (n < 0) {
                if (errno == EAGAIN || errno == EINTR)
                        return 0;
                if (errno == ECONNRESET)
                        return peer_closed(c, true);
                fail(c, X4_E_IO, "%s: read failed: %s", c->path, strerror(errno));
                return break_connection(c, X4_E_IO);
        }
        if (n == 0)
                return peer_closed(c, false);
        if (c->handshaking && c->n_peer_head < sizeof c->peer_head) {
                size_t k = MIN((size_t) n, sizeof c->peer_head - c->n_peer_head);
                memcpy(c->peer_head + c->n_peer_head, buf, k);
                c->n_peer_head += k;
        }
        for (size_t off = 0; off < (size_t) n;) {
                size_t used;
                char err[256];
                int r = frame_decoder_feed(c->decoder, buf + off, (size_t) n - off, &used, err,
                                           sizeof err);
                off += used;
                if (r < 0) {
                        if (c->handshaking && c->frames_in == 0)
                                return not_xing4d(c);
                        fail(c, X4_E_PROTOCOL, "%s: %s", c->path, err);
                        return break_connection(c, X4_E_PROTOCOL);
                }
                if (r == 0)
                        break;
                const uint8_t *payload;
                size_t len;
                frame_decoder_payload(c->decoder, &payload, &len);
                Xing4__Frame *f = xing4__frame__unpack(NULL, len, payload);
                if (!f) {
                        if (c->handshaking && c->frames_in == 0)
                                return not_xing4d(c);
                        fail(c, X4_E_PROTOCOL, "%s: undecodable frame of %zu bytes from the server",
                             c->path, len);
                        return break_connection(c, X4_E_PROTOCOL);
                }
                frames++;
                c->frames_in++;
                r = handle_frame(c, f);
                if (r < 0)
                        return r;
        }
        return frames;
}

X4_API int x4_client_dispatch(x4_client *c) {
        int total = 0;
        REQUIRE_CLIENT(c);
        if (c->fd < 0 || c->broken)
                return not_connected(c, __func__);
        for (;;) {
                int r = read_some(c);
                if (r < 0)
                        return r;
                if (r == 0) {
                        /* nothing more right now? */
                        if (wait_fd(c->fd, POLLIN, 0) <= 0)
                                return total;
                        continue;
                }
                total += r;
        }
}

/* Dispatch until p is finished; timeout_ms is per wait (inactivity). */
static int wait_pending(x4_client *c, struct pending *p, int timeout_ms) {
        while (!p->finished) {
                int r = wait_fd(c->fd, POLLIN, timeout_ms);
                if (r < 0) {
                        fail(c, X4_E_IO, "%s: poll failed: %s", c->path, strerror(-r));
                        return break_connection(c, X4_E_IO);
                }
                if (r == 0) {
                        fail(c, X4_E_TIMEOUT, "%s: no reply from the server within %d ms", c->path,
                             timeout_ms);
                        return X4_E_TIMEOUT;
                }
                r = read_some(c);
                if (r < 0 && !p->finished)
                        return r;
        }
        return 0;
}

static struct pending *pending_new(x4_client *c, enum pending_kind kind) {
        struct pending *p = calloc(1, sizeof *p);
        if (!p)
                return NULL;
        p->id = c->next_id++;
        p->kind = kind;
        p->next = c->pending;
        c->pending = p;
        return p;
}

/* Send a request frame and wait for its single reply; *ret owns the reply frame. */
static int call(x4_client *c, const char *func, Xing4__Frame *f, Xing4__Frame **ret) {
        struct pending *p;
        int r;

        if (c->fd < 0 || c->broken)
                return not_connected(c, func);
        p = pending_new(c, PENDING_REPLY);
        if (!p)
                return fail(c, X4_E_NOMEM, "out of memory");
        f->has_request_id = 1;
        f->request_id = p->id;
        r = send_frame(c, f);
        if (r >= 0)
                r = wait_pending(c, p, c->response_ms);
        if (r >= 0 && !p->reply) /* the connection broke: last_error says how */
                r = c->broken ? c->broken_code
                              : fail(c, X4_E_PROTOCOL, "%s: %s: no reply", c->path, func);
        if (r >= 0 && p->reply->body_case == XING4__FRAME__BODY_ERROR) {
                const Xing4__Error *e = p->reply->error;
                r = fail(c, error_from_code(e->has_code ? (int) e->code : 0), "%s",
                         e->message ? e->message : "server error");
        }
        if (r >= 0) {
                *ret = p->reply;
                p->reply = NULL;
        }
        pending_unlink(c, p);
        pending_free(p);
        return r;
}

/* No HelloReply within the connect timeout. A daemon still loading its model has not accepted the
 * connection: the Hello waits unread in the socket. A peer that read it, or sent something
 * else, is no xing4d (which answers at once). */
static int handshake_timeout(x4_client *c) {
        int unread = -1;
        char head[128];
        if (c->n_peer_head > 0)
                return fail(c, X4_E_PROTOCOL, "%s: the peer does not speak the xing4d protocol: it "
                            "answered the Hello handshake with %s, and no HelloReply within %d ms",
                            c->path, peer_head_text(c, head, sizeof head), c->connect_ms);
        if (ioctl(c->fd, SIOCOUTQ, &unread) == 0 && unread == 0)
                return fail(c, X4_E_TIMEOUT, "%s: the peer read the Hello handshake but sent nothing "
                            "back within %d ms: it does not speak the xing4d protocol (xing4d "
                            "answers at once)", c->path, c->connect_ms);
        return fail(c, X4_E_TIMEOUT, "%s: no handshake reply within %d ms (is the daemon still "
                    "loading its model?)", c->path, c->connect_ms);
}

X4_API int x4_client_connect(x4_client *c, const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd, r;

        REQUIRE_CLIENT(c);
        if (c->fd >= 0 && !c->broken)
                return fail(c, X4_E_USAGE, "%s: already connected to %s", __func__, c->path);
        disconnect(c); /* a broken connection's socket; its requests have ended */
        if (!path)
                path = getenv(X4_SOCKET_ENV);
        if (!path || !*path)
                path = X4_DEFAULT_SOCKET;
        if (strlen(path) >= sizeof sa.sun_path)
                return fail(c, X4_E_CONNECT, "%s: socket path longer than %zu bytes", path,
                            sizeof sa.sun_path - 1);
        memcpy(sa.sun_path, path, strlen(path) + 1);
        copy_str(c->path, sizeof c->path, path);

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return fail(c, X4_E_CONNECT, "socket: %s", strerror(errno));
        int64_t deadline = c->connect_ms < 0 ? -1 : now_ms() + c->connect_ms;
        /* AF_UNIX connect() is immediate unless the listen backlog is full (EAGAIN): retry
         * until the connect timeout */
        while (connect(fd, (struct sockaddr *) &sa, sizeof sa) < 0) {
                int e = errno;
                if (e == EINTR)
                        continue;
                if (e == EAGAIN && (deadline < 0 || now_ms() < deadline)) {
                        struct timespec ts = { 0, 10 * 1000000 };
                        nanosleep(&ts, NULL);
                        continue;
                }
                close(fd);
                if (e == EAGAIN)
                        return fail(c, X4_E_TIMEOUT, "%s: server's listen queue stayed full for %d ms",
                                    path, c->connect_ms);
                return fail(c, X4_E_CONNECT, "%s: cannot connect: %s%s", path, strerror(e),
                            e == EPROTOTYPE ? " (not a stream socket: xing4d listens on one)" : "");
        }
        r = frame_decoder_new(FRAME_MAX_LIMIT, &c->decoder);
        if (r < 0) {
                close(fd);
                return fail(c, X4_E_NOMEM, "out of memory");
        }
        c->fd = fd;
        c->n_peer_head = 0;
        c->frames_in = 0;

        Xing4__Hello hello = XING4__HELLO__INIT;
        hello.has_proto_major = hello.has_proto_minor = 1;
        hello.proto_major = X4_CLIENT_PROTO_MAJOR;
        hello.proto_minor = X4_CLIENT_PROTO_MINOR;
        hello.client = c->name;
        Xing4__Frame f = XING4__FRAME__INIT;
        f.body_case = XING4__FRAME__BODY_HELLO;
        f.hello = &hello;

        /* the handshake is bounded by the connect timeout, not the response one */
        int saved = c->response_ms;
        c->response_ms = deadline < 0 ? -1 : (int) MAX(1, deadline - now_ms());
        Xing4__Frame *reply = NULL;
        struct pending *p = pending_new(c, PENDING_REPLY);
        if (!p) {
                r = fail(c, X4_E_NOMEM, "out of memory");
        } else {
                /* Hello travels as request 0's reply: the server answers with id 0, so route it
                 * through a pending entry with id 0 */
                p->id = 0;
                c->next_id--;
                f.has_request_id = 1;
                f.request_id = 0;
                c->handshaking = true;
                r = send_frame(c, &f);
                if (r >= 0)
                        r = wait_pending(c, p, c->response_ms);
                if (r == X4_E_TIMEOUT)
                        r = handshake_timeout(c);
                if (r >= 0 && !p->reply) /* the connection broke: last_error says how */
                        r = c->broken ? c->broken_code
                                      : fail(c, X4_E_PROTOCOL, "%s: no HelloReply", path);
                if (r >= 0 && p->reply->body_case == XING4__FRAME__BODY_ERROR) {
                        const Xing4__Error *e = p->reply->error;
                        r = fail(c, error_from_code(e->has_code ? (int) e->code : 0), "%s",
                                 e->message ? e->message : "server error");
                } else if (r >= 0 && p->reply->body_case != XING4__FRAME__BODY_HELLO_REPLY)
                        r = fail(c, X4_E_PROTOCOL, "%s: the peer does not speak the xing4d protocol: "
                                 "it answered the Hello handshake with frame body %d, not a "
                                 "HelloReply", path, (int) p->reply->body_case);
                c->handshaking = false;
                if (r >= 0)
                        reply = TAKE_PTR(p->reply);
                pending_unlink(c, p);
                pending_free(p);
        }
        c->response_ms = saved;
        if (r < 0) {
                disconnect(c);
                return r;
        }
        const Xing4__HelloReply *hr = reply->hello_reply;
        copy_str(c->server_version, sizeof c->server_version, hr->server_version);
        c->max_frame = hr->has_max_frame ? hr->max_frame : FRAME_MAX_DEFAULT;
        c->server_minor = hr->has_proto_minor ? hr->proto_minor : 0;
        r = 0;
        if (hr->has_proto_major && hr->proto_major != X4_CLIENT_PROTO_MAJOR)
                r = fail(c, X4_E_VERSION_MISMATCH,
                         "%s: server speaks protocol %u.%u, this client %u.%u", path,
                         hr->proto_major, hr->proto_minor, X4_CLIENT_PROTO_MAJOR,
                         X4_CLIENT_PROTO_MINOR);
        xing4__frame__free_unpacked(reply, NULL);
        if (r < 0)
                disconnect(c);
        return r;
}

/* ---- generation ----------------------------------------------------------------------------- */

static int send_generate(x4_client *c, const x4_request *req, struct pending *p) {
        Xing4__GenerateRequest g = XING4__GENERATE_REQUEST__INIT;
        Xing4__Frame f = XING4__FRAME__INIT;
        struct chat_view v;
        int r;

        if (req->prompt == 0)
                return fail(c, X4_E_USAGE, "request has no prompt: set its text, tokens or messages");
        r = chat_view_init(&v, req);
        if (r < 0) {
                chat_view_done(&v);
                return fail(c, r, "out of memory");
        }
        switch (req->prompt) {
        case 1:
                g.prompt_case = XING4__GENERATE_REQUEST__PROMPT_TEXT;
                g.text = req->text;
                break;
        case 2:
                g.prompt_case = XING4__GENERATE_REQUEST__PROMPT_TOKENS;
                g.tokens = &v.ids;
                break;
        default:
                g.prompt_case = XING4__GENERATE_REQUEST__PROMPT_CHAT;
                g.chat = &v.chat;
                break;
        }
        Xing4__SamplingParams sp = req->sampling;
        if (sp.has_temperature || sp.has_top_p || sp.has_top_k || sp.has_min_p || sp.has_seed ||
            sp.has_repetition_penalty || sp.has_presence_penalty || sp.has_frequency_penalty)
                g.sampling = &sp;
        g.has_max_tokens = req->has_max_tokens;
        g.max_tokens = req->max_tokens;
        g.n_stop = req->n_stops;
        g.stop = req->stops;
        g.n_stop_ids = req->n_stop_ids;
        g.stop_ids = req->stop_ids;
        g.snapshot = req->snapshot;
        g.has_logprobs = req->has_logprobs;
        g.logprobs = req->logprobs;
        g.has_thinking_budget = req->has_thinking_budget;
        g.thinking_budget = req->thinking_budget;
        if (req->count_only) {
                g.has_count_only = 1;
                g.count_only = 1;
        }
        if (req->no_mtp) {
                g.has_no_mtp = 1;
                g.no_mtp = 1;
        }
        if (req->ignore_eos >= 0) {
                g.has_ignore_eos = 1;
                g.ignore_eos = req->ignore_eos;
        }
        Xing4__Constraint cons = XING4__CONSTRAINT__INIT;
        Xing4__ToolChoice tool = XING4__TOOL_CHOICE__INIT;
        switch (req->constraint) {
        case X4_CONSTRAINT_JSON_OBJECT:
                cons.kind_case = XING4__CONSTRAINT__KIND_JSON_OBJECT;
                cons.json_object = 1;
                g.constraint = &cons;
                break;
        case X4_CONSTRAINT_JSON_SCHEMA:
                cons.kind_case = XING4__CONSTRAINT__KIND_JSON_SCHEMA;
                cons.json_schema = req->constraint_arg;
                g.constraint = &cons;
                break;
        case X4_CONSTRAINT_TOOL:
        case X4_CONSTRAINT_TOOL_CALLS:
                tool.name = req->constraint_arg;
                if (req->constraint == X4_CONSTRAINT_TOOL) {
                        cons.kind_case = XING4__CONSTRAINT__KIND_TOOL;
                        cons.tool = &tool;
                } else {
                        cons.kind_case = XING4__CONSTRAINT__KIND_TOOL_CALLS;
                        cons.tool_calls = &tool;
                }
                g.constraint = &cons;
                break;
        default:
                break;
        }
        if (g.constraint && req->constraint_lenient) {
                cons.has_lenient = 1;
                cons.lenient = 1;
        }
        if (g.constraint && req->constraint_or_calls) {
                cons.has_or_tool_calls = 1;
                cons.or_tool_calls = 1;
        }
        f.has_request_id = 1;
        f.request_id = p->id;
        f.body_case = XING4__FRAME__BODY_GENERATE;
        f.generate = &g;
        r = send_frame(c, &f);
        chat_view_done(&v);
        return r;
}

X4_API int x4_client_submit(x4_client *c, const x4_request *req, x4_chunk_cb on_chunk,
                            x4_done_cb on_done, void *userdata, uint64_t *request_id) {
        struct pending *p;
        int r;

        REQUIRE_CLIENT(c);
        REQUIRE(c, req, "a request from x4_request_new()");
        if (c->fd < 0 || c->broken)
                return not_connected(c, __func__);
        p = pending_new(c, PENDING_GENERATE);
        if (!p)
                return fail(c, X4_E_NOMEM, "out of memory");
        p->on_chunk = on_chunk;
        p->on_done = on_done;
        p->userdata = userdata;
        r = send_generate(c, req, p);
        if (r < 0) {
                if (pending_find(c, p->id, NULL)) {
                        pending_unlink(c, p);
                        pending_free(p);
                }
                return r;
        }
        if (request_id)
                *request_id = p->id;
        return 0;
}

X4_API int x4_client_generate(x4_client *c, const x4_request *req, x4_chunk_cb on_chunk,
                              void *userdata, struct x4_done *done) {
        struct x4_done local;
        struct pending *p;
        int r;

        if (!done)
                done = &local;
        memset(done, 0, sizeof *done);
        if (!c)
                return done->status = null_arg(NULL, __func__, "c", "a client from x4_client_new()");
        if (!req)
                return done->status = null_arg(c, __func__, "req", "a request from x4_request_new()");
        if (c->fd < 0 || c->broken)
                return done->status = not_connected(c, __func__);
        p = pending_new(c, PENDING_GENERATE);
        if (!p)
                return done->status = fail(c, X4_E_NOMEM, "out of memory");
        p->on_chunk = on_chunk;
        p->userdata = userdata;
        p->done = done;
        r = send_generate(c, req, p);
        if (r >= 0)
                r = wait_pending(c, p, c->response_ms);
        if (r == X4_E_TIMEOUT && !p->finished) {
                /* stop the server's work; the reply is ignored when it comes */
                (void) x4_client_cancel(c, p->id);
                fail(c, X4_E_TIMEOUT, "%s: no output from the server within %d ms", c->path,
                     c->response_ms);
        }
        if (r >= 0 && p->finished)
                r = done->status;
        if (r < 0 && done->status == X4_OK) {
                done->status = r;
                done->request_id = p->id;
        }
        if (pending_find(c, p->id, NULL)) {
                pending_unlink(c, p);
                pending_free(p);
        }
        return r < 0 ? r : X4_OK;
}

/* The generate request request_id in flight on c, or NULL with X4_E_NOT_FOUND said. */
static struct pending *generate_in_flight(x4_client *c, uint64_t request_id) {
        struct pending *p = pending_find(c, request_id, NULL);
        if (!p || p->kind != PENDING_GENERATE || p->finished) {
                (void) fail(c, X4_E_NOT_FOUND, "request %llu is not in flight on this connection",
                            (unsigned long long) request_id);
                return NULL;
        }
        return p;
}

X4_API int x4_client_cancel(x4_client *c, uint64_t request_id) {
        struct pending *p;
        REQUIRE_CLIENT(c);
        if (!(p = generate_in_flight(c, request_id)))
                return X4_E_NOT_FOUND;
        if (p->cancel_sent)
                return 0;
        Xing4__Cancel cancel = XING4__CANCEL__INIT;
        Xing4__Frame f = XING4__FRAME__INIT;
        f.has_request_id = 1;
        f.request_id = request_id;
        f.body_case = XING4__FRAME__BODY_CANCEL;
        f.cancel = &cancel;
        int r = send_frame(c, &f);
        if (r >= 0)
                p->cancel_sent = true;
        return r;
}

X4_API int x4_client_pause(x4_client *c, uint64_t request_id, bool paused) {
        REQUIRE_CLIENT(c);
        if (!generate_in_flight(c, request_id))
                return X4_E_NOT_FOUND;
        if (c->server_minor < 6)
                return fail(c, X4_E_UNIMPLEMENTED, "x4_client_pause: the server speaks protocol 1.%u; pausing "
                            "one request needs 1.6", c->server_minor);
        Xing4__Pause pause = XING4__PAUSE__INIT;
        Xing4__Frame f = XING4__FRAME__INIT;
        f.has_request_id = 1;
        f.request_id = request_id;
        f.body_case = XING4__FRAME__BODY_PAUSE;
        pause.has_paused = 1;
        pause.paused = paused;
        f.pause = &pause;
        return send_frame(c, &f);
}

/* ---- stats, info, health, snapshots --------------------------------------------------------- */

static void frame_unpacked_free(Xing4__Frame *f) {
        if (f)
                xing4__frame__free_unpacked(f, NULL);
}
DEFINE_TRIVIAL_CLEANUP_FUNC(Xing4__Frame *, frame_unpacked_free);

/* One request/reply exchange, what every call below is made of: the frame whose body is
 * `body_case` with `body` (the message of that case) goes out, the reply comes back (an Error
 * frame becomes the call's error, see call()) and must carry `want`. The reply is the caller's
 * to read and free: `_cleanup_(frame_unpacked_freep) Xing4__Frame *reply = NULL;`. */
static int rpc(x4_client *c, const char *func, Xing4__Frame__BodyCase body_case, void *body,
               Xing4__Frame__BodyCase want, Xing4__Frame **ret) {
        Xing4__Frame f = XING4__FRAME__INIT, *reply = NULL;
        int r;

        f.body_case = body_case;
        switch (body_case) {
        case XING4__FRAME__BODY_STATS: f.stats = body; break;
        case XING4__FRAME__BODY_CANCEL: f.cancel = body; break;
        case XING4__FRAME__BODY_INFO: f.info = body; break;
        case XING4__FRAME__BODY_HEALTH: f.health = body; break;
        case XING4__FRAME__BODY_SNAPSHOT: f.snapshot = body; break;
        default: return fail(c, X4_E_USAGE, "frame body %d is not a request", (int) body_case);
        }
        r = call(c, func, &f, &reply);
        if (r < 0)
                return r;
        if (reply->body_case != want) {
                int got = (int) reply->body_case;
                xing4__frame__free_unpacked(reply, NULL);
                return fail(c, X4_E_PROTOCOL, "server answered with frame body %d, expected %d", got,
                            (int) want);
        }
        *ret = reply;
        return 0;
}

static int stats_call(x4_client *c, const char *func, Xing4__Frame **ret) {
        Xing4__StatsRequest req = XING4__STATS_REQUEST__INIT;
        return rpc(c, func, XING4__FRAME__BODY_STATS, &req, XING4__FRAME__BODY_STATS_REPLY, ret);
}

X4_API int x4_client_stats(x4_client *c, struct x4_stats *ret) {
        _cleanup_(frame_unpacked_freep) Xing4__Frame *reply = NULL;

        REQUIRE_CLIENT(c);
        REQUIRE(c, ret, "a struct x4_stats to fill");
        int r = stats_call(c, __func__, &reply);
        if (r < 0)
                return r;
        const Xing4__StatsReply *s = reply->stats_reply;
        memset(ret, 0, sizeof *ret);
        ret->uptime_ms = s->uptime_ms;
        ret->connections = s->connections;
        ret->requests_running = s->requests_running;
        ret->requests_waiting = s->requests_waiting;
        ret->requests_total = s->requests_total;
        ret->requests_failed = s->requests_failed;
        ret->requests_cancelled = s->requests_cancelled;
        ret->prompt_tokens_total = s->prompt_tokens_total;
        ret->completion_tokens_total = s->completion_tokens_total;
        ret->prefill_tok_s = s->prefill_tok_s;
        ret->decode_tok_s = s->decode_tok_s;
        ret->cache_pages_total = s->cache_pages_total;
        ret->cache_pages_used = s->cache_pages_used;
        ret->cache_page_tokens = s->cache_page_tokens;
        ret->memory_used = s->memory_used;
        ret->memory_total = s->memory_total;
        ret->prefix_hits = s->prefix_hits;
        ret->prefix_tokens_reused = s->prefix_tokens_reused;
        ret->prefix_misses = s->prefix_misses;
        ret->engine_steps = s->engine_steps;
        ret->engine_steps_batched = s->engine_steps_batched;
        ret->prefix_pages = s->prefix_pages;
        ret->batch_max = s->batch_max;
        ret->mtp_drafted_tokens = s->mtp_drafted_tokens;
        ret->mtp_accepted_tokens = s->mtp_accepted_tokens;
        ret->requests_refused = s->requests_refused;
        ret->requests_in_flight = s->requests_in_flight;
        ret->requests_queue_full = (uint32_t) MIN(s->requests_queue_full, (uint64_t) UINT32_MAX);
        return 0;
}

X4_API int x4_client_requests(x4_client *c, struct x4_request_state **ret, size_t *n) {
        _cleanup_(frame_unpacked_freep) Xing4__Frame *reply = NULL;

        REQUIRE_CLIENT(c);
        REQUIRE(c, ret, "a place for the array of struct x4_request_state");
        REQUIRE(c, n, "a place for the number of requests");
        int r = stats_call(c, __func__, &reply);
        if (r < 0)
                return r;
        const Xing4__StatsReply *s = reply->stats_reply;
        struct x4_request_state *a = calloc(s->n_requests ? s->n_requests : 1, sizeof *a);
        if (!a)
                return fail(c, X4_E_NOMEM, "out of memory");
        for (size_t i = 0; i < s->n_requests; i++) {
                const Xing4__RequestState *q = s->requests[i];
                a[i].server_request_id = q->server_request_id;
                a[i].running = q->running;
                a[i].prompt_tokens = q->prompt_tokens;
                a[i].prefilled_tokens = q->prefilled_tokens;
                a[i].completion_tokens = q->completion_tokens;
                a[i].age_ms = q->age_ms;
                a[i].peer_pid = q->peer_pid;
                a[i].peer_uid = q->peer_uid;
                copy_str(a[i].client, sizeof a[i].client, q->client);
                a[i].paused = q->paused;
        }
        *n = s->n_requests;
        *ret = a;
        return 0;
}

X4_API int x4_client_cancel_server(x4_client *c, uint64_t server_request_id) {
        Xing4__Cancel cancel = XING4__CANCEL__INIT;
        _cleanup_(frame_unpacked_freep) Xing4__Frame *reply = NULL;

        REQUIRE_CLIENT(c);
        cancel.has_server_request_id = 1;
        cancel.server_request_id = server_request_id;
        return rpc(c, __func__, XING4__FRAME__BODY_CANCEL, &cancel, XING4__FRAME__BODY_CANCEL, &reply);
}

X4_API int x4_client_info(x4_client *c, struct x4_info *ret) {
        Xing4__InfoRequest req = XING4__INFO_REQUEST__INIT;
        _cleanup_(frame_unpacked_freep) Xing4__Frame *reply = NULL;

        REQUIRE_CLIENT(c);
        REQUIRE(c, ret, "a struct x4_info to fill");
        int r = rpc(c, __func__, XING4__FRAME__BODY_INFO, &req, XING4__FRAME__BODY_INFO_REPLY, &reply);
        if (r < 0)
                return r;
        const Xing4__InfoReply *i = reply->info_reply;
        memset(ret, 0, sizeof *ret);
        copy_str(ret->server_version, sizeof ret->server_version, i->server_version);
        copy_str(ret->backend, sizeof ret->backend, i->backend);
        copy_str(ret->model_path, sizeof ret->model_path, i->model_path);
        copy_str(ret->config_source, sizeof ret->config_source, i->config_source);
        if (i->model) {
                const Xing4__ModelInfo *m = i->model;
                copy_str(ret->model_architecture, sizeof ret->model_architecture, m->architecture);
                copy_str(ret->model_name, sizeof ret->model_name, m->name);
                copy_str(ret->model_fingerprint, sizeof ret->model_fingerprint, m->fingerprint);
                ret->n_vocab = m->n_vocab;
                ret->n_ctx = m->n_ctx;
                ret->n_layer = m->n_layer;
                ret->n_embd = m->n_embd;
                ret->n_expert = m->n_expert;
                ret->n_expert_used = m->n_expert_used;
                ret->bos_id = m->bos_id;
                ret->eos_id = m->eos_id;
                ret->has_tokenizer = m->has_tokenizer;
        }
        ret->max_frame = i->max_frame;
        ret->max_tokens_default = i->max_tokens_default;
        ret->max_running = i->max_running;
        ret->cache_pages_total = i->cache_pages_total;
        ret->cache_page_tokens = i->cache_page_tokens;
        return 0;
}

X4_API int x4_client_health(x4_client *c, int *status, char *detail, size_t detail_size) {
        Xing4__HealthRequest req = XING4__HEALTH_REQUEST__INIT;
        _cleanup_(frame_unpacked_freep) Xing4__Frame *reply = NULL;

        REQUIRE_CLIENT(c);
        REQUIRE(c, status, "a place for the enum x4_health");
        int r = rpc(c, __func__, XING4__FRAME__BODY_HEALTH, &req, XING4__FRAME__BODY_HEALTH_REPLY, &reply);
        if (r < 0)
                return r;
        *status = reply->health_reply->has_status ? (int) reply->health_reply->status : 0;
        if (detail && detail_size)
                copy_str(detail, detail_size, reply->health_reply->detail);
        return 0;
}

static void snapshot_info_copy(struct x4_snapshot_info *d, const Xing4__SnapshotInfo *s) {
        memset(d, 0, sizeof *d);
        copy_str(d->name, sizeof d->name, s->name);
        d->n_tokens = s->n_tokens;
        d->bytes = s->bytes;
        d->created_unix = s->created_unix;
}

static int snapshot_call(x4_client *c, const char *func, Xing4__SnapshotRequest *sr,
                         Xing4__Frame **ret) {
        return rpc(c, func, XING4__FRAME__BODY_SNAPSHOT, sr, XING4__FRAME__BODY_SNAPSHOT_REPLY, ret);
}

X4_API int x4_client_snapshot_create(x4_client *c, const char *name, const x4_request *source,
                                     uint64_t from_request, struct x4_snapshot_info *ret) {
        return x4_client_snapshot_create_flags(c, name, source, from_request, 0, ret);
}

X4_API int x4_client_snapshot_create_flags(x4_client *c, const char *name, const x4_request *source,
                                           uint64_t from_request, unsigned flags,
                                           struct x4_snapshot_info *ret) {
        Xing4__SnapshotRequest sr = XING4__SNAPSHOT_REQUEST__INIT;
        _cleanup_(frame_unpacked_freep) Xing4__Frame *reply = NULL;
        struct chat_view v = { 0 };
        int r;

        REQUIRE_CLIENT(c);
        REQUIRE(c, name, "the snapshot's name");
        if (flags & ~X4_SNAPSHOT_REPLACE)
                return fail(c, X4_E_USAGE, "%s: flags 0x%x has bits other than X4_SNAPSHOT_REPLACE "
                            "(0x%x)", __func__, flags, X4_SNAPSHOT_REPLACE);
        sr.has_op = 1;
        sr.op = XING4__SNAPSHOT_REQUEST__OP__OP_CREATE;
        sr.name = (char *) name;
        if (flags & X4_SNAPSHOT_REPLACE)
                sr.has_replace = sr.replace = 1;
        if (source) {
                if (source->prompt == 0)
                        return fail(c, X4_E_USAGE, "%s: source has no prompt: set its text, tokens "
                                    "or messages (or pass NULL and a from_request)", __func__);
                r = chat_view_init(&v, source);
                if (r < 0) {
                        chat_view_done(&v);
                        return fail(c, r, "out of memory");
                }
                if (source->prompt == 1) {
                        sr.source_case = XING4__SNAPSHOT_REQUEST__SOURCE_TEXT;
                        sr.text = source->text;
                } else if (source->prompt == 2) {
                        sr.source_case = XING4__SNAPSHOT_REQUEST__SOURCE_TOKENS;
                        sr.tokens = &v.ids;
                } else {
                        sr.source_case = XING4__SNAPSHOT_REQUEST__SOURCE_CHAT;
                        sr.chat = &v.chat;
                }
        } else {
                sr.source_case = XING4__SNAPSHOT_REQUEST__SOURCE_FROM_REQUEST;
                sr.from_request = from_request;
        }
        r = snapshot_call(c, __func__, &sr, &reply);
        chat_view_done(&v);
        if (r < 0)
                return r;
        if (ret) {
                memset(ret, 0, sizeof *ret);
                if (reply->snapshot_reply->n_snapshots > 0)
                        snapshot_info_copy(ret, reply->snapshot_reply->snapshots[0]);
        }
        return 0;
}

X4_API int x4_client_snapshot_list(x4_client *c, struct x4_snapshot_info **ret, size_t *n) {
        Xing4__SnapshotRequest sr = XING4__SNAPSHOT_REQUEST__INIT;
        _cleanup_(frame_unpacked_freep) Xing4__Frame *reply = NULL;

        REQUIRE_CLIENT(c);
        REQUIRE(c, ret, "a place for the array of struct x4_snapshot_info");
        REQUIRE(c, n, "a place for the number of snapshots");
        sr.has_op = 1;
        sr.op = XING4__SNAPSHOT_REQUEST__OP__OP_LIST;
        int r = snapshot_call(c, __func__, &sr, &reply);
        if (r < 0)
                return r;
        size_t k = reply->snapshot_reply->n_snapshots;
        struct x4_snapshot_info *a = calloc(k ? k : 1, sizeof *a);
        if (!a)
                return fail(c, X4_E_NOMEM, "out of memory");
        for (size_t i = 0; i < k; i++)
                snapshot_info_copy(&a[i], reply->snapshot_reply->snapshots[i]);
        *ret = a;
        *n = k;
        return 0;
}

X4_API int x4_client_snapshot_drop(x4_client *c, const char *name) {
        Xing4__SnapshotRequest sr = XING4__SNAPSHOT_REQUEST__INIT;
        _cleanup_(frame_unpacked_freep) Xing4__Frame *reply = NULL;

        REQUIRE_CLIENT(c);
        REQUIRE(c, name, "the snapshot's name");
        sr.has_op = 1;
        sr.op = XING4__SNAPSHOT_REQUEST__OP__OP_DROP;
        sr.name = (char *) name;
        return snapshot_call(c, __func__, &sr, &reply);
}
