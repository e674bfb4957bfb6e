/* SPDX-License-Identifier: MIT */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <systemd/sd-daemon.h>

#include "scheduler.h"
#include "common/escape.h"
#include "common/frame.h"
#include "common/log.h"
#include "common/util.h"
#include "xing4.pb-c.h"

/* Back-pressure (docs/design.md): a connection whose unsent output passes output_high_water (8 MiB by
 * default) is no longer read and its requests are paused in the engine (pages kept, no decode
 * steps); both resume once the output has drained to half of it. */
#define OUTPUT_HIGH_WATER_DEFAULT (8u << 20)

/* Unfinished frames: each connection's decoder holds a buffer of the announced size (up to
 * --max-frame) while the body arrives. Frames up to SMALL_FRAME are always admitted (at most
 * max-connections x 64 KiB); larger ones count against max-pending-bytes across all connections,
 * so many slow senders cannot make the daemon hold max-connections x max-frame. */
#define SMALL_FRAME (64u << 10)
#define MAX_PENDING_DEFAULT ((uint64_t) 256 << 20)

struct conn;

/* A generation request in flight, owned by the loop thread. It outlives its connection (conn set
 * to NULL) until the scheduler's final event for it arrives. */
struct sreq {
        struct sreq *next;
        struct conn *conn;
        uint64_t client_id;
        uint64_t server_id;
        bool client_paused; /* paused by its client (Pause), whatever the connection's output */
};

/* A finished request's token sequence, kept for SnapshotRequest.from_request. */
#define FINISHED_KEPT 4
struct finished {
        uint64_t client_id;
        int32_t *tokens;
        uint32_t n;
};

struct conn {
        struct conn *next;
        struct finished finished[FINISHED_KEPT]; /* ring of the last finished requests */
        unsigned n_finished;
        struct server *server;
        struct bufferevent *bev;
        struct frame_decoder *decoder;
        struct sreq *reqs;
        struct event *ev_hello; /* the Hello deadline, until hello_done */
        bool hello_done;
        bool closing; /* flush the output, then free */
        bool paused;  /* its requests are paused: the client is not reading */
        uint32_t held; /* bytes of an unfinished large frame counted in server.pending_bytes */
        double last_active; /* when bytes last arrived (or it was accepted) */
        char refused[256];  /* why a frame was refused (max-pending-bytes) */
        pid_t pid;
        uid_t uid;
        char client[64];
        unsigned id;
};

/* At most one warning per interval for an event a client can repeat at will (refused
 * connections, accept() failures): the rest are counted and reported with the next one. */
#define RATELIMIT_MS 5000.0
struct ratelimit {
        double last_ms;
        unsigned suppressed;
};

static bool ratelimit_pass(struct ratelimit *rl, double now) {
        if (rl->last_ms != 0 && now - rl->last_ms < RATELIMIT_MS) {
                rl->suppressed++;
                return false;
        }
        rl->last_ms = now;
        return true;
}

struct server {
        struct server_params p;
        struct event_base *base;
        struct evconnlistener *listener;
        struct event *ev_sched, *ev_term, *ev_int, *ev_hup, *ev_grace, *ev_watchdog;
        struct event *ev_accept_resume; /* re-enables the listener after accept() failed */
        int spare_fd;                   /* given up at the descriptor limit to answer waiting clients */
        unsigned shed;                  /* clients answered so since the last accept() warning */
        struct ratelimit rl_refused, rl_accept, rl_evicted, rl_pending;
        struct event *ev_idle; /* the idle-timeout sweep */
        uint64_t pending_bytes; /* sum of conn.held */
        uint64_t evicted;       /* idle connections closed to make room */
        struct conn *conns;
        unsigned n_conns, next_conn_id;
        unsigned n_reqs; /* sreqs alive, orphans included */
        bool draining, exiting;
        bool cancelling_all; /* the grace period is over: requests end cancelled by the shutdown */
        double t_start;
};

/* ---- sending -------------------------------------------------------------------------------- */

static void send_frame(struct conn *c, const Xing4__Frame *f) {
        size_t n = xing4__frame__get_packed_size(f);
        uint8_t stackbuf[4096], *buf = stackbuf;

        if (c->closing && !c->bev)
                return;
        if (n + FRAME_HEADER_SIZE > sizeof stackbuf) {
                buf = malloc(n + FRAME_HEADER_SIZE);
                if (!buf) {
                        log_error("connection %u: out of memory sending a %zu-byte frame", c->id, n);
                        return;
                }
        }
        (void) frame_encode_header(n, FRAME_MAX_LIMIT, buf);
        xing4__frame__pack(f, buf + FRAME_HEADER_SIZE);
        if (bufferevent_write(c->bev, buf, n + FRAME_HEADER_SIZE) < 0)
                log_error("connection %u: cannot queue a %zu-byte frame", c->id, n);
        if (buf != stackbuf)
                free(buf);
}

/* The reply envelope, for every frame the daemon sends on a connection: request_id and one body,
 * `body` being the message of body_case. */
static void send_reply(struct conn *c, uint64_t request_id, Xing4__Frame__BodyCase body_case,
                       void *body) {
        Xing4__Frame f = XING4__FRAME__INIT;

        f.has_request_id = 1;
        f.request_id = request_id;
        f.body_case = body_case;
        switch (body_case) {
        case XING4__FRAME__BODY_ERROR: f.error = body; break;
        case XING4__FRAME__BODY_HELLO_REPLY: f.hello_reply = body; break;
        case XING4__FRAME__BODY_CANCEL: f.cancel = body; break;
        case XING4__FRAME__BODY_STATS_REPLY: f.stats_reply = body; break;
        case XING4__FRAME__BODY_INFO_REPLY: f.info_reply = body; break;
        case XING4__FRAME__BODY_HEALTH_REPLY: f.health_reply = body; break;
        case XING4__FRAME__BODY_SNAPSHOT_REPLY: f.snapshot_reply = body; break;
        case XING4__FRAME__BODY_CHUNK: f.chunk = body; break;
        case XING4__FRAME__BODY_DONE: f.done = body; break;
        case XING4__FRAME__BODY_PROGRESS: f.progress = body; break;
        default:
                log_error("connection %u: frame body %d is not a reply", c->id, (int) body_case);
                return;
        }
        send_frame(c, &f);
}

/* An Error frame for the client's request_id (0: about the connection), logged. In the log
 * "request N" is always the server's id (the one x4ctl stats shows and x4ctl cancel takes); a
 * client's own id is "client request N on connection C", so the two never read alike.
 * server_id: the request's, once the scheduler took it (0: it never got one); how = "refused",
 * "failed" or "cancelled", what became of it. */
static void error_reply(struct conn *c, uint64_t client_id, uint64_t server_id, int code,
                        const char *how, const char *raw) {
        char msg[1024];
        /* messages quote what the client sent (names, roles, stop strings): escaped once here,
         * for the log (no forged lines) and the wire (Error.message must be valid UTF-8) */
        cescape(raw, strlen(raw), msg, sizeof msg);

        Xing4__Error e = XING4__ERROR__INIT;
        e.has_code = 1;
        e.code = (Xing4__ErrorCode) code;
        e.message = msg;
        if (server_id)
                log_info("request %llu (client request %llu on connection %u, pid %d) %s: %s",
                         (unsigned long long) server_id, (unsigned long long) client_id, c->id,
                         (int) c->pid, how, msg);
        else if (client_id)
                log_info("client request %llu on connection %u (pid %d) %s: %s",
                         (unsigned long long) client_id, c->id, (int) c->pid, how, msg);
        else
                log_info("connection %u (pid %d): error: %s", c->id, (int) c->pid, msg);
        send_reply(c, client_id, XING4__FRAME__BODY_ERROR, &e);
}

_printf_(4, 5) static void send_error(struct conn *c, uint64_t request_id, int code,
                                       const char *fmt, ...) {
        char raw[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(raw, sizeof raw, fmt, ap);
        va_end(ap);
        error_reply(c, request_id, 0, code, "refused", raw);
}

/* The Error for a request (GenerateRequest, SnapshotRequest OP_CREATE) refused before it is
 * handed to the scheduler, which counts it (refused; failed for ERROR_INTERNAL): every request
 * received is in the stats. The protocol's ErrorCode values are enum sched_error's. */
_printf_(4, 5) static void refuse(struct conn *c, uint64_t request_id, int code, const char *fmt,
                                   ...) {
        char raw[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(raw, sizeof raw, fmt, ap);
        va_end(ap);
        sched_count_unsubmitted(c->server->p.sched, code);
        error_reply(c, request_id, 0, code,
                    code == XING4__ERROR_CODE__ERROR_INTERNAL ? "failed" : "refused", raw);
}

/* An Error frame written straight to a socket that has no connection (refused at accept): it
 * is new and empty, so a frame this small fits its buffer; if not, the client just sees EOF. */
static void send_error_fd(int fd, int code, const char *msg) {
        Xing4__Error e = XING4__ERROR__INIT;
        e.has_code = 1;
        e.code = (Xing4__ErrorCode) code;
        e.message = (char *) msg;
        Xing4__Frame f = XING4__FRAME__INIT;
        f.has_request_id = 1;
        f.request_id = 0;
        f.body_case = XING4__FRAME__BODY_ERROR;
        f.error = &e;
        uint8_t buf[512];
        size_t n = xing4__frame__get_packed_size(&f);
        if (n + FRAME_HEADER_SIZE > sizeof buf)
                return;
        (void) frame_encode_header(n, FRAME_MAX_LIMIT, buf);
        xing4__frame__pack(&f, buf + FRAME_HEADER_SIZE);
        (void) send(fd, buf, n + FRAME_HEADER_SIZE, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* ---- connections ---------------------------------------------------------------------------- */

static void maybe_finish_drain(struct server *s);

static void conn_free(struct conn *c) {
        struct server *s = c->server;

        for (struct conn **l = &s->conns; *l; l = &(*l)->next)
                if (*l == c) {
                        *l = c->next;
                        break;
                }
        s->n_conns--;
        s->pending_bytes -= c->held;
        /* its requests are cancelled; their sreqs live on as orphans until the final event */
        for (struct sreq *r = c->reqs, *next; r; r = next) {
                next = r->next;
                r->conn = NULL;
                r->next = NULL;
                (void) sched_cancel(s->p.sched, r->server_id);
        }
        if (c->ev_hello)
                event_free(c->ev_hello);
        if (c->bev)
                bufferevent_free(c->bev);
        for (unsigned i = 0; i < FINISHED_KEPT; i++)
                free(c->finished[i].tokens);
        frame_decoder_free(c->decoder);
        log_debug("connection %u closed", c->id);
        free(c);
        if (s->exiting && !s->conns)
                event_base_loopexit(s->base, NULL);
}

/* Close once the queued output (typically an Error) is written. Only called from within
 * conn_read_cb, which frees the connection itself if nothing is left to write. */
static void conn_close_after_flush(struct conn *c) {
        c->closing = true;
        bufferevent_disable(c->bev, EV_READ);
}

/* The Hello deadline passed: an idle socket would otherwise hold a connection slot forever and,
 * --max-connections of them, lock every other client out. */
static void hello_timeout_cb(evutil_socket_t fd, short what, void *userdata) {
        struct conn *c = userdata;
        if (c->hello_done || c->closing)
                return;
        send_error(c, 0, XING4__ERROR_CODE__ERROR_PROTOCOL,
                   "no Hello within the hello-timeout of %.1f s: closing the connection",
                   c->server->p.hello_timeout_s);
        conn_close_after_flush(c);
        /* the write callback frees it once the Error is out; nothing queued: free now */
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
                conn_free(c);
}

static struct sreq *conn_find(struct conn *c, uint64_t client_id) {
        for (struct sreq *r = c->reqs; r; r = r->next)
                if (r->client_id == client_id)
                        return r;
        return NULL;
}

/* ---- GenerateRequest → sched_request -------------------------------------------------------- */

static char *dup0(const char *s) {
        return s ? strdup(s) : NULL;
}

static int convert_generate(const Xing4__GenerateRequest *g, struct sched_request **ret) {
        _cleanup_(sched_request_freep) struct sched_request *r = calloc(1, sizeof *r);
        if (!r)
                return -ENOMEM;
        r->enable_thinking = -1;
        r->echo_ids = !g->has_echo_token_ids || g->echo_token_ids;
        switch (g->prompt_case) {
        case XING4__GENERATE_REQUEST__PROMPT_TOKENS:
                r->prompt = SCHED_PROMPT_TOKENS;
                r->n_tokens = (uint32_t) g->tokens->n_ids;
                r->tokens = malloc(MAX(g->tokens->n_ids, (size_t) 1) * sizeof *r->tokens);
                if (!r->tokens)
                        return -ENOMEM;
                if (g->tokens->n_ids)
                        memcpy(r->tokens, g->tokens->ids, g->tokens->n_ids * sizeof *r->tokens);
                break;
        case XING4__GENERATE_REQUEST__PROMPT_TEXT:
                r->prompt = SCHED_PROMPT_TEXT;
                r->text = strdup(g->text);
                if (!r->text)
                        return -ENOMEM;
                break;
        case XING4__GENERATE_REQUEST__PROMPT_CHAT: {
                const Xing4__Chat *ch = g->chat;
                r->prompt = SCHED_PROMPT_CHAT;
                r->messages = calloc(MAX(ch->n_messages, (size_t) 1), sizeof *r->messages);
                if (!r->messages)
                        return -ENOMEM;
                r->n_messages = ch->n_messages;
                for (size_t i = 0; i < ch->n_messages; i++) {
                        const Xing4__ChatMessage *m = ch->messages[i];
                        r->messages[i].role = dup0(m->role ? m->role : "");
                        r->messages[i].content = dup0(m->content);
                        r->messages[i].reasoning = dup0(m->reasoning);
                        r->messages[i].tool_calls_json = dup0(m->tool_calls_json);
                        r->messages[i].name = dup0(m->name);
                        if (!r->messages[i].role)
                                return -ENOMEM;
                }
                r->tools_json = dup0(ch->tools_json);
                if (ch->has_enable_thinking)
                        r->enable_thinking = ch->enable_thinking;
                r->no_generation_prompt = ch->has_add_generation_prompt && !ch->add_generation_prompt;
                break;
        }
        default:
                r->prompt = (enum sched_prompt) - 1;
                break;
        }
        if (g->sampling) {
                const Xing4__SamplingParams *sp = g->sampling;
                struct sched_sampling *d = &r->sampling;
                d->has_temperature = sp->has_temperature;
                d->temperature = sp->temperature;
                d->has_top_p = sp->has_top_p;
                d->top_p = sp->top_p;
                d->has_top_k = sp->has_top_k;
                d->top_k = sp->top_k;
                d->has_min_p = sp->has_min_p;
                d->min_p = sp->min_p;
                d->has_seed = sp->has_seed;
                d->seed = sp->seed;
                d->has_repetition_penalty = sp->has_repetition_penalty;
                d->repetition_penalty = sp->repetition_penalty;
                d->has_presence_penalty = sp->has_presence_penalty;
                d->presence_penalty = sp->presence_penalty;
                d->has_frequency_penalty = sp->has_frequency_penalty;
                d->frequency_penalty = sp->frequency_penalty;
        }
        r->has_max_tokens = g->has_max_tokens;
        r->max_tokens = g->max_tokens;
        if (g->n_stop) {
                r->stop = calloc(g->n_stop, sizeof *r->stop);
                if (!r->stop)
                        return -ENOMEM;
                r->n_stop = g->n_stop;
                for (size_t i = 0; i < g->n_stop; i++)
                        if (!(r->stop[i] = strdup(g->stop[i])))
                                return -ENOMEM;
        }
        if (g->n_stop_ids) {
                r->stop_ids = malloc(g->n_stop_ids * sizeof *r->stop_ids);
                if (!r->stop_ids)
                        return -ENOMEM;
                memcpy(r->stop_ids, g->stop_ids, g->n_stop_ids * sizeof *r->stop_ids);
                r->n_stop_ids = g->n_stop_ids;
        }
        r->snapshot = dup0(g->snapshot);
        r->logprobs = g->has_logprobs ? g->logprobs : 0;
        r->has_thinking_budget = g->has_thinking_budget;
        r->thinking_budget = g->thinking_budget;
        r->ignore_eos = g->has_ignore_eos && g->ignore_eos;
        r->no_mtp = g->has_no_mtp && g->no_mtp;
        r->count_only = g->has_count_only && g->count_only;
        if (g->constraint) { /* checked by sched_validate */
                const Xing4__Constraint *k = g->constraint;
                switch (k->kind_case) {
                case XING4__CONSTRAINT__KIND_JSON_OBJECT:
                        r->constraint = k->json_object ? SCHED_CONSTRAINT_JSON_OBJECT : SCHED_CONSTRAINT_NONE;
                        break;
                case XING4__CONSTRAINT__KIND_JSON_SCHEMA:
                        r->constraint = SCHED_CONSTRAINT_JSON_SCHEMA;
                        if (!(r->constraint_schema = strdup(k->json_schema ? k->json_schema : "")))
                                return -ENOMEM;
                        break;
                case XING4__CONSTRAINT__KIND_TOOL:
                case XING4__CONSTRAINT__KIND_TOOL_CALLS: {
                        bool forced = k->kind_case == XING4__CONSTRAINT__KIND_TOOL;
                        const Xing4__ToolChoice *tc = forced ? k->tool : k->tool_calls;
                        r->constraint = forced ? SCHED_CONSTRAINT_TOOL : SCHED_CONSTRAINT_TOOL_CALLS;
                        if (tc && tc->name && tc->name[0] && !(r->constraint_tool = strdup(tc->name)))
                                return -ENOMEM;
                        break;
                }
                default:
                        r->constraint = SCHED_CONSTRAINT_EMPTY;
                        break;
                }
                r->constraint_lenient = k->has_lenient && k->lenient;
                r->constraint_or_calls = k->has_or_tool_calls && k->or_tool_calls;
        }
        *ret = TAKE_PTR(r);
        return 0;
}

/* ---- frame handlers ------------------------------------------------------------------------- */

static void fill_model_info(const struct server *s, Xing4__ModelInfo *m) {
        const struct server_model_info *i = &s->p.model;
        m->architecture = (char *) i->architecture;
        m->name = (char *) i->name;
        m->fingerprint = (char *) i->fingerprint;
        m->has_n_vocab = m->has_n_ctx = m->has_n_layer = m->has_n_embd = 1;
        m->has_n_expert = m->has_n_expert_used = m->has_bos_id = m->has_eos_id = 1;
        m->has_has_tokenizer = 1;
        m->n_vocab = i->n_vocab;
        m->n_ctx = i->n_ctx;
        m->n_layer = i->n_layer;
        m->n_embd = i->n_embd;
        m->n_expert = i->n_expert;
        m->n_expert_used = i->n_expert_used;
        m->bos_id = i->bos_id;
        m->eos_id = i->eos_id;
        m->has_tokenizer = i->has_tokenizer;
}

static void handle_hello(struct conn *c, uint64_t id, const Xing4__Hello *h) {
        struct server *s = c->server;

        if (c->hello_done) {
                send_error(c, id, XING4__ERROR_CODE__ERROR_PROTOCOL,
                           "Hello: already received on this connection");
                return;
        }
        if (!h->has_proto_major || h->proto_major != X4_PROTO_MAJOR) {
                send_error(c, id, XING4__ERROR_CODE__ERROR_VERSION_MISMATCH,
                           "Hello.proto_major: %u, this server speaks protocol %u.%u",
                           h->has_proto_major ? h->proto_major : 0, X4_PROTO_MAJOR, X4_PROTO_MINOR);
                conn_close_after_flush(c);
                return;
        }
        /* shown in the log and in every StatsReply: escaped */
        cescape(h->client ? h->client : "", h->client ? strlen(h->client) : 0, c->client,
                sizeof c->client);
        c->hello_done = true;
        if (c->ev_hello) {
                event_free(c->ev_hello);
                c->ev_hello = NULL;
        }
        log_info("connection %u: pid %d uid %u, client '%s', protocol %u.%u", c->id, (int) c->pid,
                 (unsigned) c->uid, c->client, h->proto_major, h->proto_minor);

        Xing4__ModelInfo m = XING4__MODEL_INFO__INIT;
        fill_model_info(s, &m);
        Xing4__HelloReply hr = XING4__HELLO_REPLY__INIT;
        hr.has_proto_major = hr.has_proto_minor = hr.has_max_frame = 1;
        hr.proto_major = X4_PROTO_MAJOR;
        hr.proto_minor = X4_PROTO_MINOR;
        hr.server_version = (char *) s->p.server_version;
        hr.model = &m;
        hr.max_frame = s->p.max_frame;
        hr.backend = (char *) s->p.model.backend;
        send_reply(c, id, XING4__FRAME__BODY_HELLO_REPLY, &hr);
}

/* Checks shared by everything that becomes a scheduler request (a refusal is counted). */
static bool check_new_request(struct conn *c, uint64_t id, const char *what) {
        if (id == 0) {
                refuse(c, 0, XING4__ERROR_CODE__ERROR_PROTOCOL,
                       "%s: request_id 0 is reserved for connection frames, choose a nonzero id",
                       what);
                return false;
        }
        if (conn_find(c, id)) {
                refuse(c, id, XING4__ERROR_CODE__ERROR_PROTOCOL,
                       "%s: request_id %llu is already in flight on this connection", what,
                       (unsigned long long) id);
                return false;
        }
        if (c->server->draining) {
                refuse(c, id, XING4__ERROR_CODE__ERROR_UNAVAILABLE,
                       "the daemon is shutting down and accepts no new requests");
                return false;
        }
        return true;
}

static void submit_request(struct conn *c, uint64_t id, struct sched_request *r);

static void handle_generate(struct conn *c, uint64_t id, const Xing4__GenerateRequest *g) {
        struct sched_request *r = NULL;

        if (!check_new_request(c, id, "GenerateRequest"))
                return;
        if (convert_generate(g, &r) < 0) {
                refuse(c, id, XING4__ERROR_CODE__ERROR_INTERNAL, "out of memory");
                return;
        }
        submit_request(c, id, r);
}

/* Validate and hand r (owned) to the scheduler; answers errors itself. */
static void submit_request(struct conn *c, uint64_t id, struct sched_request *r) {
        struct server *s = c->server;
        char err[1024];
        int code, ret;

        code = sched_validate(s->p.sched, r, err, sizeof err);
        if (code != 0) {
                refuse(c, id, code, "%s", err);
                sched_request_free(r);
                return;
        }
        struct sreq *q = calloc(1, sizeof *q);
        if (!q) {
                refuse(c, id, XING4__ERROR_CODE__ERROR_INTERNAL, "out of memory");
                sched_request_free(r);
                return;
        }
        r->cookie = q;
        r->peer_pid = (uint32_t) c->pid;
        r->peer_uid = (uint32_t) c->uid;
        memcpy(r->client, c->client, sizeof r->client);
        uint64_t server_id;
        ret = sched_submit(s->p.sched, r, &server_id);
        if (ret < 0) { /* counted by sched_submit */
                free(q);
                sched_request_free(r);
                if (ret == -ESHUTDOWN)
                        send_error(c, id, XING4__ERROR_CODE__ERROR_UNAVAILABLE,
                                   "the daemon is shutting down and accepts no new requests");
                else if (ret == -EAGAIN)
                        send_error(c, id, XING4__ERROR_CODE__ERROR_UNAVAILABLE,
                                   "the request queue is full (%u requests in flight), retry later",
                                   sched_in_flight(s->p.sched));
                else
                        send_error(c, id, XING4__ERROR_CODE__ERROR_INTERNAL,
                                   "cannot queue the request: %s", strerror(-ret));
                return;
        }
        q->conn = c;
        q->client_id = id;
        q->server_id = server_id; /* r belongs to the engine now, maybe already freed */
        q->next = c->reqs;
        c->reqs = q;
        s->n_reqs++;
        if (c->paused)
                (void) sched_pause(s->p.sched, q->server_id, true);
}

static void handle_cancel(struct conn *c, uint64_t id, const Xing4__Cancel *k) {
        struct server *s = c->server;

        if (k->has_server_request_id) {
                if (sched_cancel(s->p.sched, k->server_request_id) < 0) {
                        send_error(c, id, XING4__ERROR_CODE__ERROR_NOT_FOUND,
                                   "Cancel.server_request_id: request %llu is not waiting or "
                                   "running", (unsigned long long) k->server_request_id);
                        return;
                }
                log_info("connection %u (pid %d): cancelled request %llu", c->id, (int) c->pid,
                         (unsigned long long) k->server_request_id);
                Xing4__Cancel echo = XING4__CANCEL__INIT;
                echo.has_server_request_id = 1;
                echo.server_request_id = k->server_request_id;
                send_reply(c, id, XING4__FRAME__BODY_CANCEL, &echo);
                return;
        }
        struct sreq *q = conn_find(c, id);
        if (!q) {
                send_error(c, id, XING4__ERROR_CODE__ERROR_NOT_FOUND,
                           "Cancel: request_id %llu is not in flight on this connection",
                           (unsigned long long) id);
                return;
        }
        (void) sched_cancel(s->p.sched, q->server_id); /* ENOENT: ended already, Done is queued */
}

static void handle_stats(struct conn *c, uint64_t id) {
        struct server *s = c->server;
        struct sched_stats st;
        struct sched_request_state *reqs = NULL;
        size_t n = 0;

        sched_get_stats(s->p.sched, &st);
        (void) sched_get_requests(s->p.sched, &reqs, &n);
        Xing4__StatsReply r = XING4__STATS_REPLY__INIT;
        r.has_uptime_ms = r.has_connections = r.has_requests_running = r.has_requests_waiting = 1;
        r.has_requests_total = r.has_requests_failed = r.has_requests_cancelled = 1;
        r.has_prompt_tokens_total = r.has_completion_tokens_total = 1;
        r.has_prefill_tok_s = r.has_decode_tok_s = 1;
        r.has_cache_pages_total = r.has_cache_pages_used = r.has_cache_page_tokens = 1;
        r.has_memory_used = r.has_memory_total = r.has_prefix_hits = r.has_prefix_tokens_reused = 1;
        r.uptime_ms = (uint64_t) (now_ms() - s->t_start);
        r.connections = s->n_conns;
        r.requests_running = st.running;
        r.requests_waiting = st.waiting;
        r.requests_total = st.total;
        r.requests_failed = st.failed;
        r.requests_cancelled = st.cancelled;
        r.has_requests_completed = r.has_requests_refused = r.has_requests_queue_full = 1;
        r.has_requests_in_flight = 1;
        r.requests_completed = st.completed;
        r.requests_refused = st.refused;
        r.requests_queue_full = st.queue_full;
        r.requests_in_flight = st.in_flight;
        r.prompt_tokens_total = st.prompt_tokens;
        r.completion_tokens_total = st.completion_tokens;
        r.prefill_tok_s = st.prefill_tok_s;
        r.decode_tok_s = st.decode_tok_s;
        r.cache_pages_total = st.pages_total;
        r.cache_pages_used = st.pages_used;
        r.cache_page_tokens = st.page_tokens;
        r.memory_used = st.memory_used;
        r.memory_total = st.memory_total;
        r.prefix_hits = st.prefix_hits;
        r.prefix_tokens_reused = st.prefix_tokens_reused;
        r.has_prefix_pages = r.has_prefix_misses = r.has_engine_steps = 1;
        r.has_engine_steps_batched = r.has_batch_max = 1;
        r.prefix_pages = st.prefix_pages;
        r.prefix_misses = st.prefix_misses;
        r.engine_steps = st.steps;
        r.engine_steps_batched = st.steps_multi;
        r.batch_max = st.batch_max;
        r.has_mtp_drafted_tokens = r.has_mtp_accepted_tokens = 1;
        r.mtp_drafted_tokens = st.mtp_drafted_tokens;
        r.mtp_accepted_tokens = st.mtp_accepted_tokens;
        Xing4__RequestState *states = calloc(MAX(n, (size_t) 1), sizeof *states);
        Xing4__RequestState **ptrs = calloc(MAX(n, (size_t) 1), sizeof *ptrs);
        if (states && ptrs) {
                for (size_t i = 0; i < n; i++) {
                        Xing4__RequestState q = XING4__REQUEST_STATE__INIT;
                        q.has_server_request_id = q.has_running = q.has_prompt_tokens = 1;
                        q.has_prefilled_tokens = q.has_completion_tokens = q.has_age_ms = 1;
                        q.has_peer_pid = q.has_peer_uid = 1;
                        q.server_request_id = reqs[i].id;
                        q.running = reqs[i].running;
                        q.prompt_tokens = reqs[i].prompt_tokens;
                        q.prefilled_tokens = reqs[i].prefilled_tokens;
                        q.completion_tokens = reqs[i].completion_tokens;
                        q.age_ms = reqs[i].age_ms;
                        q.peer_pid = reqs[i].peer_pid;
                        q.peer_uid = reqs[i].peer_uid;
                        q.client = reqs[i].client;
                        q.has_paused = 1;
                        q.paused = reqs[i].paused;
                        states[i] = q;
                        ptrs[i] = &states[i];
                }
                r.n_requests = n;
                r.requests = ptrs;
        }
        send_reply(c, id, XING4__FRAME__BODY_STATS_REPLY, &r);
        free(states);
        free(ptrs);
        free(reqs);
}

static void handle_info(struct conn *c, uint64_t id) {
        struct server *s = c->server;
        struct sched_stats st;

        sched_get_stats(s->p.sched, &st);
        Xing4__ModelInfo m = XING4__MODEL_INFO__INIT;
        fill_model_info(s, &m);
        Xing4__InfoReply r = XING4__INFO_REPLY__INIT;
        r.server_version = (char *) s->p.server_version;
        r.model = &m;
        r.backend = (char *) s->p.model.backend;
        r.model_path = (char *) s->p.model.model_path;
        r.config_source = (char *) s->p.model.config_source;
        r.has_max_frame = r.has_max_tokens_default = r.has_max_running = 1;
        r.has_cache_pages_total = r.has_cache_page_tokens = 1;
        r.max_frame = s->p.max_frame;
        r.max_tokens_default = sched_max_tokens_default(s->p.sched);
        r.max_running = sched_max_running(s->p.sched);
        r.cache_pages_total = st.pages_total;
        r.cache_page_tokens = st.page_tokens;
        send_reply(c, id, XING4__FRAME__BODY_INFO_REPLY, &r);
}

static void handle_health(struct conn *c, uint64_t id) {
        struct server *s = c->server;
        char detail[128];
        Xing4__HealthReply r = XING4__HEALTH_REPLY__INIT;

        r.has_status = 1;
        if (s->draining) {
                r.status = XING4__HEALTH_REPLY__STATUS__STATUS_DRAINING;
                snprintf(detail, sizeof detail, "shutting down, %u requests finishing",
                         sched_in_flight(s->p.sched));
        } else {
                r.status = XING4__HEALTH_REPLY__STATUS__STATUS_SERVING;
                snprintf(detail, sizeof detail, "%s on %s", s->p.model.name, s->p.model.backend);
        }
        r.detail = detail;
        send_reply(c, id, XING4__FRAME__BODY_HEALTH_REPLY, &r);
}

static void send_snapshot_reply(struct conn *c, uint64_t id, const struct sched_snapshot_info *a,
                                size_t n) {
        Xing4__SnapshotInfo *infos = calloc(MAX(n, (size_t) 1), sizeof *infos);
        Xing4__SnapshotInfo **ptrs = calloc(MAX(n, (size_t) 1), sizeof *ptrs);
        Xing4__SnapshotReply r = XING4__SNAPSHOT_REPLY__INIT;
        if (!infos || !ptrs) {
                free(infos);
                free(ptrs);
                send_error(c, id, XING4__ERROR_CODE__ERROR_INTERNAL, "out of memory");
                return;
        }
        for (size_t i = 0; i < n; i++) {
                Xing4__SnapshotInfo x = XING4__SNAPSHOT_INFO__INIT;
                x.name = (char *) a[i].name;
                x.has_n_tokens = x.has_bytes = x.has_created_unix = 1;
                x.n_tokens = a[i].n_tokens;
                x.bytes = a[i].bytes;
                x.created_unix = a[i].created_unix;
                infos[i] = x;
                ptrs[i] = &infos[i];
        }
        r.n_snapshots = n;
        r.snapshots = ptrs;
        send_reply(c, id, XING4__FRAME__BODY_SNAPSHOT_REPLY, &r);
        free(infos);
        free(ptrs);
}

/* Pause: the client's own back-pressure on one request (proto/xing4.proto). */
static void handle_pause(struct conn *c, uint64_t id, const Xing4__Pause *p) {
        struct sreq *q = conn_find(c, id);
        bool paused = p->has_paused && p->paused;
        if (!q || q->client_paused == paused)
                return; /* finished meanwhile, or nothing changes */
        q->client_paused = paused;
        if (!c->paused)
                (void) sched_pause(c->server->p.sched, q->server_id, paused);
        log_debug("connection %u: request %llu %s by its client", c->id, (unsigned long long) q->server_id,
                  paused ? "paused" : "resumed");
}

static void handle_snapshot(struct conn *c, uint64_t id, const Xing4__SnapshotRequest *q) {
        struct server *s = c->server;
        char err[1024];
        int code;

        switch (q->has_op ? q->op : XING4__SNAPSHOT_REQUEST__OP__OP_UNSPECIFIED) {
        case XING4__SNAPSHOT_REQUEST__OP__OP_LIST: {
                struct sched_snapshot_info *a;
                size_t n;
                code = sched_snapshot_list(s->p.sched, &a, &n, err, sizeof err);
                if (code) {
                        send_error(c, id, code, "%s", err);
                        return;
                }
                send_snapshot_reply(c, id, a, n);
                free(a);
                return;
        }
        case XING4__SNAPSHOT_REQUEST__OP__OP_DROP: {
                struct sched_snapshot_info info;
                code = sched_snapshot_drop(s->p.sched, q->name, &info, err, sizeof err);
                if (code) {
                        send_error(c, id, code, "%s", err);
                        return;
                }
                log_info("connection %u (pid %d): dropped snapshot '%s'", c->id, (int) c->pid,
                         info.name);
                send_snapshot_reply(c, id, &info, 1);
                return;
        }
        case XING4__SNAPSHOT_REQUEST__OP__OP_CREATE: {
                Xing4__GenerateRequest g = XING4__GENERATE_REQUEST__INIT;
                Xing4__TokenIds ids = XING4__TOKEN_IDS__INIT;
                struct sched_request *r = NULL;

                if (!check_new_request(c, id, "SnapshotRequest"))
                        return;
                code = sched_snapshot_check_name(q->name, err, sizeof err);
                if (code) {
                        refuse(c, id, code, "%s", err);
                        return;
                }
                switch (q->source_case) {
                case XING4__SNAPSHOT_REQUEST__SOURCE_TEXT:
                        g.prompt_case = XING4__GENERATE_REQUEST__PROMPT_TEXT;
                        g.text = q->text;
                        break;
                case XING4__SNAPSHOT_REQUEST__SOURCE_TOKENS:
                        g.prompt_case = XING4__GENERATE_REQUEST__PROMPT_TOKENS;
                        g.tokens = q->tokens ? q->tokens : &ids;
                        break;
                case XING4__SNAPSHOT_REQUEST__SOURCE_CHAT:
                        /* a chat snapshot is the start of a later conversation: rendered without
                         * the generation prompt, which the request on it adds */
                        if (q->chat && q->chat->has_add_generation_prompt && q->chat->add_generation_prompt) {
                                refuse(c, id, XING4__ERROR_CODE__ERROR_INVALID_ARGUMENT,
                                       "SnapshotRequest.chat.add_generation_prompt: true, but a chat "
                                       "snapshot is its conversation without the generation prompt (a "
                                       "chat request on it adds its own); leave it unset");
                                return;
                        }
                        g.prompt_case = XING4__GENERATE_REQUEST__PROMPT_CHAT;
                        g.chat = q->chat;
                        break;
                case XING4__SNAPSHOT_REQUEST__SOURCE_FROM_REQUEST: {
                        /* re-prefill its prompt + output (its pages were freed when it ended) */
                        const struct finished *fin = NULL;
                        for (unsigned i = 0; i < FINISHED_KEPT; i++)
                                if (c->finished[i].tokens &&
                                    c->finished[i].client_id == q->from_request)
                                        fin = &c->finished[i];
                        if (!fin) {
                                refuse(c, id, XING4__ERROR_CODE__ERROR_NOT_FOUND,
                                       "SnapshotRequest.from_request: request %llu is not one "
                                       "of the last %d finished on this connection",
                                       (unsigned long long) q->from_request, FINISHED_KEPT);
                                return;
                        }
                        g.prompt_case = XING4__GENERATE_REQUEST__PROMPT_TOKENS;
                        ids.n_ids = fin->n;
                        ids.ids = fin->tokens;
                        g.tokens = &ids;
                        break;
                }
                default:
                        refuse(c, id, XING4__ERROR_CODE__ERROR_INVALID_ARGUMENT,
                               "SnapshotRequest.source: none given, text, tokens or chat "
                               "expected");
                        return;
                }
                if (convert_generate(&g, &r) < 0 || !(r->snapshot_create = strdup(q->name))) {
                        sched_request_free(r);
                        refuse(c, id, XING4__ERROR_CODE__ERROR_INTERNAL, "out of memory");
                        return;
                }
                r->snapshot_replace = q->has_replace && q->replace;
                submit_request(c, id, r);
                return;
        }
        default:
                send_error(c, id, XING4__ERROR_CODE__ERROR_INVALID_ARGUMENT,
                           "SnapshotRequest.op: OP_CREATE, OP_LIST or OP_DROP expected");
                return;
        }
}

static const char *body_name(Xing4__Frame__BodyCase b) {
        switch (b) {
        case XING4__FRAME__BODY_HELLO: return "hello";
        case XING4__FRAME__BODY_HELLO_REPLY: return "hello_reply";
        case XING4__FRAME__BODY_GENERATE: return "generate";
        case XING4__FRAME__BODY_CHUNK: return "chunk";
        case XING4__FRAME__BODY_DONE: return "done";
        case XING4__FRAME__BODY_CANCEL: return "cancel";
        case XING4__FRAME__BODY_SNAPSHOT: return "snapshot";
        case XING4__FRAME__BODY_SNAPSHOT_REPLY: return "snapshot_reply";
        case XING4__FRAME__BODY_STATS: return "stats";
        case XING4__FRAME__BODY_STATS_REPLY: return "stats_reply";
        case XING4__FRAME__BODY_INFO: return "info";
        case XING4__FRAME__BODY_INFO_REPLY: return "info_reply";
        case XING4__FRAME__BODY_HEALTH: return "health";
        case XING4__FRAME__BODY_HEALTH_REPLY: return "health_reply";
        case XING4__FRAME__BODY_ERROR: return "error";
        case XING4__FRAME__BODY_PAUSE: return "pause";
        default: return "none";
        }
}

static void handle_payload(struct conn *c, const uint8_t *data, size_t len) {
        Xing4__Frame *f = xing4__frame__unpack(NULL, len, data);
        if (!f) {
                /* framing is intact, so the connection can go on */
                send_error(c, 0, XING4__ERROR_CODE__ERROR_PROTOCOL,
                           "frame of %zu bytes is not a valid xing4.Frame message", len);
                return;
        }
        uint64_t id = f->has_request_id ? f->request_id : 0;

        if (!c->hello_done && f->body_case != XING4__FRAME__BODY_HELLO) {
                send_error(c, id, XING4__ERROR_CODE__ERROR_PROTOCOL,
                           "first frame must be Hello, got '%s'", body_name(f->body_case));
                conn_close_after_flush(c);
                xing4__frame__free_unpacked(f, NULL);
                return;
        }
        switch (f->body_case) {
        case XING4__FRAME__BODY_HELLO:
                handle_hello(c, id, f->hello);
                break;
        case XING4__FRAME__BODY_GENERATE:
                handle_generate(c, id, f->generate);
                break;
        case XING4__FRAME__BODY_CANCEL:
                handle_cancel(c, id, f->cancel);
                break;
        case XING4__FRAME__BODY_STATS:
                handle_stats(c, id);
                break;
        case XING4__FRAME__BODY_INFO:
                handle_info(c, id);
                break;
        case XING4__FRAME__BODY_HEALTH:
                handle_health(c, id);
                break;
        case XING4__FRAME__BODY_SNAPSHOT:
                handle_snapshot(c, id, f->snapshot);
                break;
        case XING4__FRAME__BODY_PAUSE:
                handle_pause(c, id, f->pause);
                break;
        case XING4__FRAME__BODY__NOT_SET:
                send_error(c, id, XING4__ERROR_CODE__ERROR_PROTOCOL,
                           "frame has no body (or one this server does not know)");
                break;
        default:
                send_error(c, id, XING4__ERROR_CODE__ERROR_PROTOCOL,
                           "frame body '%s' is sent by the server, not by clients",
                           body_name(f->body_case));
                break;
        }
        xing4__frame__free_unpacked(f, NULL);
}

/* ---- libevent callbacks --------------------------------------------------------------------- */

/* A header announced len bytes: admit the frame if the unfinished frames of all connections stay
 * within max-pending-bytes. */
static int conn_admit_frame(uint32_t len, void *userdata) {
        struct conn *c = userdata;
        struct server *s = c->server;

        if (len <= SMALL_FRAME)
                return 0;
        if (s->pending_bytes + len > s->p.max_pending_bytes) {
                if (ratelimit_pass(&s->rl_pending, now_ms())) {
                        log_warning("connection %u (pid %d): refusing a frame of %u bytes: %llu bytes "
                                    "of unfinished frames held, limit %llu (%u more refused since "
                                    "the last warning)", c->id, (int) c->pid, len,
                                    (unsigned long long) s->pending_bytes,
                                    (unsigned long long) s->p.max_pending_bytes,
                                    s->rl_pending.suppressed);
                        s->rl_pending.suppressed = 0;
                }
                /* the text of the Error the connection gets */
                snprintf(c->refused, sizeof c->refused,
                         "frame of %u bytes refused: the daemon holds %llu bytes of unfinished "
                         "frames from all connections, limit %llu (max-pending-bytes); retry later",
                         len, (unsigned long long) s->pending_bytes,
                         (unsigned long long) s->p.max_pending_bytes);
                return -ENOBUFS;
        }
        s->pending_bytes += len;
        c->held = len;
        return 0;
}

static void conn_release_frame(struct conn *c) {
        c->server->pending_bytes -= c->held;
        c->held = 0;
        frame_decoder_trim(c->decoder);
}

static void conn_read_cb(struct bufferevent *bev, void *userdata) {
        struct conn *c = userdata;
        struct evbuffer *in = bufferevent_get_input(bev);
        uint8_t buf[16384];

        c->last_active = now_ms();

        while (!c->closing && evbuffer_get_length(in) > 0) {
                int n = evbuffer_remove(in, buf, sizeof buf);
                if (n <= 0)
                        break;
                for (size_t off = 0; off < (size_t) n && !c->closing;) {
                        size_t used;
                        char err[256];
                        int r = frame_decoder_feed(c->decoder, buf + off, (size_t) n - off, &used,
                                                   err, sizeof err);
                        off += used;
                        if (r < 0) {
                                /* the stream lost sync: say why, then hang up (a refusal by
                                 * admit_frame wrote its reason into c->refused) */
                                send_error(c, 0,
                                           r == -EMSGSIZE  ? XING4__ERROR_CODE__ERROR_TOO_LARGE
                                           : r == -ENOBUFS ? XING4__ERROR_CODE__ERROR_RESOURCE_EXHAUSTED
                                                           : XING4__ERROR_CODE__ERROR_PROTOCOL,
                                           "%s", r == -ENOBUFS ? c->refused : err);
                                conn_close_after_flush(c);
                                break;
                        }
                        if (r == 1) {
                                const uint8_t *p;
                                size_t len;
                                frame_decoder_payload(c->decoder, &p, &len);
                                handle_payload(c, p, len);
                                conn_release_frame(c);
                        }
                }
        }
        if (c->closing) {
                if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
                        conn_free(c);
                return;
        }
        /* back-pressure: stop reading while the client does not read our output */
        if (evbuffer_get_length(bufferevent_get_output(bev)) > c->server->p.output_high_water)
                bufferevent_disable(bev, EV_READ);
}

static void conn_set_paused(struct conn *c, bool paused) {
        c->paused = paused;
        for (struct sreq *r = c->reqs; r; r = r->next)
                (void) sched_pause(c->server->p.sched, r->server_id, paused || r->client_paused);
        log_debug("connection %u: requests %s (%zu bytes queued)", c->id,
                  paused ? "paused" : "resumed",
                  evbuffer_get_length(bufferevent_get_output(c->bev)));
}

/* Called whenever the output is at or below half the high-water mark (the write watermark). */
static void conn_write_cb(struct bufferevent *bev, void *userdata) {
        struct conn *c = userdata;
        if (c->closing) {
                if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
                        conn_free(c);
                return;
        }
        if (c->paused)
                conn_set_paused(c, false);
        if (!(bufferevent_get_enabled(bev) & EV_READ))
                bufferevent_enable(bev, EV_READ);
}

static void conn_event_cb(struct bufferevent *bev, short what, void *userdata) {
        struct conn *c = userdata;
        if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
                if (frame_decoder_pending(c->decoder))
                        log_info("connection %u: closed in the middle of a frame (%zu bytes held)",
                                 c->id, frame_decoder_pending(c->decoder));
                conn_free(c);
        }
}

/* Close c now, telling it why: the Error is written straight to the socket (an idle
 * connection has no output queued; if the client does not read, it just sees EOF). */
static void conn_close_now(struct conn *c, int code, const char *msg) {
        log_debug("connection %u (pid %d): closing: %s", c->id, (int) c->pid, msg);
        send_error_fd(bufferevent_getfd(c->bev), code, msg);
        conn_free(c);
}

/* At the connection limit: close the connection idle the longest (nothing in flight), so
 * connections that sit idle -- one local user opening max-connections of them -- cannot lock
 * the others out. Connections with requests in flight are never closed for this. */
static bool evict_idle(struct server *s) {
        struct conn *victim = NULL;
        for (struct conn *c = s->conns; c; c = c->next)
                if (!c->reqs && !c->closing && (!victim || c->last_active < victim->last_active))
                        victim = c;
        if (!victim)
                return false;
        double idle_s = (now_ms() - victim->last_active) / 1e3;
        char msg[192];
        snprintf(msg, sizeof msg, "connection limit of %u reached: closing this connection, idle "
                 "the longest (%.1f s), to serve a new one", s->p.max_connections, idle_s);
        s->evicted++;
        if (ratelimit_pass(&s->rl_evicted, now_ms())) {
                log_warning("connection %u (pid %d uid %u): %s (%u more closed since the last "
                            "warning)", victim->id, (int) victim->pid, (unsigned) victim->uid, msg,
                            s->rl_evicted.suppressed);
                s->rl_evicted.suppressed = 0;
        }
        conn_close_now(victim, XING4__ERROR_CODE__ERROR_RESOURCE_EXHAUSTED, msg);
        return true;
}

/* Every second: close connections idle (nothing in flight, nothing received) past the
 * idle-timeout. */
static void idle_sweep_cb(evutil_socket_t fd, short what, void *userdata) {
        struct server *s = userdata;
        double now = now_ms(), limit = s->p.idle_timeout_s * 1e3;
        for (struct conn *c = s->conns, *next; c; c = next) {
                next = c->next;
                if (c->reqs || c->closing || !c->hello_done || now - c->last_active < limit)
                        continue;
                if (evbuffer_get_length(bufferevent_get_output(c->bev)))
                        continue; /* still writing to it: not idle */
                int unread = 0;
                if (ioctl(bufferevent_getfd(c->bev), FIONREAD, &unread) == 0 && unread > 0)
                        continue; /* a request just arrived, not read yet */
                char msg[160];
                snprintf(msg, sizeof msg, "idle for %.0f s (idle-timeout %.0f s): closing the "
                         "connection", (now - c->last_active) / 1e3, s->p.idle_timeout_s);
                log_debug("connection %u: %s", c->id, msg);
                conn_close_now(c, XING4__ERROR_CODE__ERROR_UNAVAILABLE, msg);
        }
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int socklen, void *userdata) {
        struct server *s = userdata;
        struct ucred cred = { .pid = 0, .uid = (uid_t) -1 };
        socklen_t cl = sizeof cred;

        if (s->exiting) {
                close(fd);
                return;
        }
        if (s->p.max_connections && s->n_conns >= s->p.max_connections)
                (void) evict_idle(s);
        if (s->p.max_connections && s->n_conns >= s->p.max_connections) {
                char msg[128];
                snprintf(msg, sizeof msg, "%u connections open, limit %u", s->n_conns,
                         s->p.max_connections);
                if (ratelimit_pass(&s->rl_refused, now_ms())) {
                        log_warning("refusing a connection: %s (%u more refused since the last "
                                    "warning)", msg, s->rl_refused.suppressed);
                        s->rl_refused.suppressed = 0;
                }
                send_error_fd(fd, XING4__ERROR_CODE__ERROR_RESOURCE_EXHAUSTED, msg);
                /* closing with unread input (a Hello sent right after connect) makes the client's
                 * read fail with ECONNRESET before it sees the Error: discard what is there */
                char junk[4096];
                for (int i = 0; i < 16 && recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0; i++)
                        ;
                close(fd);
                return;
        }
        struct conn *c = calloc(1, sizeof *c);
        if (!c || frame_decoder_new(s->p.max_frame, &c->decoder) < 0) {
                free(c);
                close(fd);
                log_error("out of memory accepting a connection");
                return;
        }
        frame_decoder_set_admit(c->decoder, conn_admit_frame, c);
        c->last_active = now_ms();
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
                c->pid = cred.pid;
                c->uid = cred.uid;
        }
        c->server = s;
        c->id = ++s->next_conn_id;
        c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
        if (!c->bev) {
                frame_decoder_free(c->decoder);
                free(c);
                close(fd);
                return;
        }
        if (s->p.hello_timeout_s > 0) {
                struct timeval tv = { (time_t) s->p.hello_timeout_s,
                                      (suseconds_t) ((s->p.hello_timeout_s -
                                                      (time_t) s->p.hello_timeout_s) * 1e6) };
                c->ev_hello = evtimer_new(s->base, hello_timeout_cb, c);
                if (!c->ev_hello || evtimer_add(c->ev_hello, &tv) < 0) {
                        if (c->ev_hello)
                                event_free(c->ev_hello);
                        bufferevent_free(c->bev);
                        frame_decoder_free(c->decoder);
                        free(c);
                        log_error("out of memory accepting a connection");
                        return;
                }
        }
        bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
        bufferevent_setwatermark(c->bev, EV_WRITE, s->p.output_high_water / 2, 0);
        bufferevent_enable(c->bev, EV_READ | EV_WRITE);
        c->next = s->conns;
        s->conns = c;
        s->n_conns++;
        log_debug("connection %u from pid %d uid %u", c->id, (int) c->pid, (unsigned) c->uid);
}

/* accept() failed (EMFILE/ENFILE/ENOBUFS...): the listening socket stays readable, so a level-
 * triggered listener would call accept() again at once, spinning the loop and logging each time.
 * Stop listening for a second instead (pending clients wait in the backlog) and say so at most
 * once per RATELIMIT_MS. */
#define ACCEPT_PAUSE_MS 1000
#define SHED_MAX 256 /* clients answered at one failure at most */

/* At the descriptor limit the clients waiting in the backlog would wait there with no answer: give
 * up the spare descriptor, accept them one at a time and answer each RESOURCE_EXHAUSTED (as a
 * connection over --max-connections is), then take the spare again. */
static void shed_pending(struct server *s, evutil_socket_t lfd) {
        if (s->spare_fd < 0)
                return;
        close(s->spare_fd);
        s->spare_fd = -1;
        char msg[160];
        snprintf(msg, sizeof msg, "the daemon is at its open file limit (%u connections open); retry later",
                 s->n_conns);
        for (int i = 0; i < SHED_MAX; i++) {
                int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0)
                        break;
                send_error_fd(fd, XING4__ERROR_CODE__ERROR_RESOURCE_EXHAUSTED, msg);
                char junk[4096]; /* a Hello already sent: read, so the close is no reset */
                for (int k = 0; k < 16 && recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0; k++)
                        ;
                close(fd);
                s->shed++;
        }
        s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void accept_error_cb(struct evconnlistener *l, void *userdata) {
        struct server *s = userdata;
        int err = EVUTIL_SOCKET_ERROR();

        if (err == EMFILE || err == ENFILE)
                shed_pending(s, evconnlistener_get_fd(l));
        if (ratelimit_pass(&s->rl_accept, now_ms())) {
                log_warning("accept() failed: %s (%u connections open, %u more failures since the "
                            "last warning, %u waiting clients told so); not accepting for %d ms",
                            strerror(err), s->n_conns, s->rl_accept.suppressed, s->shed, ACCEPT_PAUSE_MS);
                s->rl_accept.suppressed = 0;
                s->shed = 0;
        }
        struct timeval tv = { ACCEPT_PAUSE_MS / 1000, (ACCEPT_PAUSE_MS % 1000) * 1000 };
        if (evconnlistener_disable(l) == 0 && s->ev_accept_resume)
                evtimer_add(s->ev_accept_resume, &tv);
}

static void accept_resume_cb(evutil_socket_t fd, short what, void *userdata) {
        struct server *s = userdata;
        (void) evconnlistener_enable(s->listener);
}

/* ---- scheduler events → frames -------------------------------------------------------------- */

static void deliver(struct server *s, struct sched_event *e) {
        struct sreq *q = e->cookie;
        struct conn *c = q->conn;
        bool final = e->kind != SCHED_EVENT_CHUNK && e->kind != SCHED_EVENT_PROGRESS;

        if (c && !c->closing) {
                if (e->kind == SCHED_EVENT_CHUNK) {
                        Xing4__TokenChunk tc = XING4__TOKEN_CHUNK__INIT;
                        Xing4__TokenLogprob lps[1], *lpp[1];
                        Xing4__TopLogprob tops[32], *topp[32];
                        tc.text = e->text;
                        tc.n_token_ids = e->n_tokens;
                        tc.token_ids = e->tokens;
                        tc.has_channel = e->channel != 0;
                        tc.has_prompt_tokens = tc.has_cached_tokens = e->first;
                        tc.prompt_tokens = e->prompt_tokens;
                        tc.cached_tokens = e->cached_tokens;
                        tc.channel = (Xing4__Channel) e->channel;
                        if (e->n_logprobs) {
                                Xing4__TokenLogprob l = XING4__TOKEN_LOGPROB__INIT;
                                l.has_token_id = l.has_logprob = 1;
                                l.token_id = e->logprobs[0].token_id;
                                l.logprob = e->logprobs[0].logprob;
                                uint32_t nt = MIN(e->logprobs[0].n_top, 32u);
                                for (uint32_t i = 0; i < nt; i++) {
                                        Xing4__TopLogprob t = XING4__TOP_LOGPROB__INIT;
                                        t.has_token_id = t.has_logprob = 1;
                                        t.token_id = e->logprobs[0].top[i].token_id;
                                        t.logprob = e->logprobs[0].top[i].logprob;
                                        t.text = e->logprobs[0].top[i].text;
                                        tops[i] = t;
                                        topp[i] = &tops[i];
                                }
                                l.n_top = nt;
                                l.top = topp;
                                lps[0] = l;
                                lpp[0] = &lps[0];
                                tc.n_logprobs = 1;
                                tc.logprobs = lpp;
                        }
                        Xing4__ToolCall call = XING4__TOOL_CALL__INIT;
                        if (e->tool_name) {
                                call.name = e->tool_name;
                                call.arguments_json = e->tool_arguments;
                                tc.tool_call = &call;
                        }
                        send_reply(c, q->client_id, XING4__FRAME__BODY_CHUNK, &tc);
                } else if (e->kind == SCHED_EVENT_DONE) {
                        Xing4__Usage u = XING4__USAGE__INIT;
                        Xing4__Timings t = XING4__TIMINGS__INIT;
                        Xing4__Done d = XING4__DONE__INIT;
                        u.has_prompt_tokens = u.has_cached_tokens = u.has_completion_tokens = 1;
                        u.has_reasoning_tokens = 1;
                        u.prompt_tokens = e->prompt_tokens;
                        u.cached_tokens = e->cached_tokens;
                        u.completion_tokens = e->completion_tokens;
                        u.reasoning_tokens = e->reasoning_tokens;
                        t.has_queue_ms = t.has_prefill_ms = t.has_decode_ms = t.has_total_ms = 1;
                        t.queue_ms = e->queue_ms;
                        t.prefill_ms = e->prefill_ms;
                        t.decode_ms = e->decode_ms;
                        t.total_ms = e->total_ms;
                        d.has_finish_reason = 1;
                        d.finish_reason = (Xing4__FinishReason) e->finish_reason;
                        d.usage = &u;
                        d.timings = &t;
                        d.stop = e->stop;
                        /* cut short by the shutdown, not by a Cancel: clients may retry elsewhere */
                        d.has_server_shutdown = d.server_shutdown =
                                s->cancelling_all && e->finish_reason == SCHED_FINISH_CANCELLED;
                        d.has_server_request_id = 1;
                        d.server_request_id = e->id;
                        send_reply(c, q->client_id, XING4__FRAME__BODY_DONE, &d);
                        if (e->sequence) {
                                struct finished *slot = &c->finished[c->n_finished++ % FINISHED_KEPT];
                                free(slot->tokens);
                                slot->client_id = q->client_id;
                                slot->tokens = TAKE_PTR(e->sequence);
                                slot->n = e->n_sequence;
                        }
                } else if (e->kind == SCHED_EVENT_PROGRESS) {
                        Xing4__PrefillProgress pp = XING4__PREFILL_PROGRESS__INIT;
                        pp.has_done_tokens = pp.has_total_tokens = 1;
                        pp.done_tokens = e->done_tokens;
                        pp.total_tokens = e->total_tokens;
                        send_reply(c, q->client_id, XING4__FRAME__BODY_PROGRESS, &pp);
                } else if (e->kind == SCHED_EVENT_SNAPSHOT) {
                        send_snapshot_reply(c, q->client_id, &e->snapshot, 1);
                } else {
                        const char *how = e->cancelled ? "cancelled"
                                          : e->code == XING4__ERROR_CODE__ERROR_INTERNAL ? "failed"
                                                                                         : "refused";
                        error_reply(c, q->client_id, q->server_id, e->code, how,
                                    e->message ? e->message : "");
                }
                if (!final && !c->paused &&
                    evbuffer_get_length(bufferevent_get_output(c->bev)) > s->p.output_high_water)
                        conn_set_paused(c, true);
        }
        if (final) {
                if (c)
                        for (struct sreq **l = &c->reqs; *l; l = &(*l)->next)
                                if (*l == q) {
                                        *l = q->next;
                                        break;
                                }
                free(q);
                s->n_reqs--;
        }
}

static void sched_cb(evutil_socket_t fd, short what, void *userdata) {
        struct server *s = userdata;
        uint64_t v;

        if (read(fd, &v, sizeof v) < 0 && errno != EAGAIN)
                log_warning("eventfd read failed: %m");
        for (struct sched_event *e = sched_pop_events(s->p.sched), *next; e; e = next) {
                next = e->next;
                deliver(s, e);
                sched_event_free(e);
        }
        maybe_finish_drain(s);
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

/* Draining and nothing in flight: let every connection flush what is queued (the last Done
 * frames), close them, then leave the loop. A client that does not read gets 5 s. */
static void maybe_finish_drain(struct server *s) {
        if (!s->draining || s->n_reqs > 0)
                return;
        if (!s->exiting) {
                struct timeval tv = { 5, 0 };
                s->exiting = true;
                log_info("all requests ended, stopping");
                event_base_loopexit(s->base, &tv);
                for (struct conn *c = s->conns, *next; c; c = next) {
                        next = c->next;
                        c->closing = true;
                        bufferevent_disable(c->bev, EV_READ);
                        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
                                conn_free(c);
                }
        }
        if (!s->conns)
                event_base_loopexit(s->base, NULL);
}

static void grace_cb(evutil_socket_t fd, short what, void *userdata) {
        struct server *s = userdata;
        log_info("grace period of %.1f s over: cancelling %u running requests", s->p.grace_s,
                 s->n_reqs);
        s->cancelling_all = true;
        sched_drain(s->p.sched, true);
}

/* SIGHUP is the "reload" or "terminal closed" signal; its default action killed the daemon on the
 * spot (requests cut off, the socket file left behind). Nothing here can be re-read while
 * serving, so it is logged and otherwise ignored; SIGTERM stops the daemon. */
static void hup_cb(evutil_socket_t sig, short what, void *userdata) {
        log_info("SIGHUP ignored: the settings and the model are read at start; restart xing4d to apply "
                   "changes (SIGTERM stops it)");
}

static void term_cb(evutil_socket_t sig, short what, void *userdata) {
        struct server *s = userdata;

        if (s->draining) {
                /* a second signal: do not wait for the grace period */
                s->cancelling_all = true;
                sched_drain(s->p.sched, true);
                return;
        }
        s->draining = true;
        (void) sd_notify(0, "STOPPING=1\nSTATUS=draining");
        log_info("signal %d: no new requests, %u in flight get %.1f s to finish", (int) sig,
                 s->n_reqs, s->p.grace_s);
        /* keep accepting: a client that connects now gets a clear UNAVAILABLE ("shutting
         * down") and a draining health status instead of hanging in the listen backlog */
        sched_drain(s->p.sched, false);
        struct timeval tv = { (time_t) s->p.grace_s,
                              (suseconds_t) ((s->p.grace_s - (time_t) s->p.grace_s) * 1e6) };
        s->ev_grace = evtimer_new(s->base, grace_cb, s);
        if (s->ev_grace)
                evtimer_add(s->ev_grace, &tv);
        maybe_finish_drain(s);
}

static void watchdog_cb(evutil_socket_t fd, short what, void *userdata) {
        (void) sd_notify(0, "WATCHDOG=1");
}

int server_new(const struct server_params *params, struct server **ret) {
        struct server *s = calloc(1, sizeof *s);
        uint64_t wd_usec = 0;

        if (!s)
                return log_error_errno(ENOMEM, "server: out of memory");
        s->spare_fd = -1;
        s->p = *params;
        if (!s->p.output_high_water)
                s->p.output_high_water = OUTPUT_HIGH_WATER_DEFAULT;
        s->t_start = now_ms();
        s->base = event_base_new();
        if (!s->base) {
                server_free(s);
                return log_error_errno(ENOMEM, "server: cannot create the event loop");
        }
        if (evutil_make_socket_nonblocking(s->p.listen_fd) < 0) {
                server_free(s);
                return log_error_errno(EINVAL, "server: cannot make the listening socket "
                                               "nonblocking");
        }
        s->listener = evconnlistener_new(s->base, accept_cb, s, LEV_OPT_CLOSE_ON_EXEC, -1,
                                         s->p.listen_fd);
        if (s->listener)
                evconnlistener_set_error_cb(s->listener, accept_error_cb);
        if (!s->p.max_pending_bytes)
                s->p.max_pending_bytes = MAX_PENDING_DEFAULT;
        if (s->p.idle_timeout_s > 0) {
                /* swept once a second: a connection closes within a second of its deadline */
                struct timeval tv = { 1, 0 };
                if (s->p.idle_timeout_s < 4)
                        tv = (struct timeval){ 0, 250000 };
                s->ev_idle = event_new(s->base, -1, EV_PERSIST, idle_sweep_cb, s);
                if (!s->ev_idle || event_add(s->ev_idle, &tv) < 0) {
                        server_free(s);
                        return log_error_errno(ENOMEM, "server: cannot set up the idle timer");
                }
        }
        s->ev_accept_resume = evtimer_new(s->base, accept_resume_cb, s);
        s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        s->ev_sched = event_new(s->base, sched_event_fd(s->p.sched), EV_READ | EV_PERSIST,
                                sched_cb, s);
        s->ev_term = evsignal_new(s->base, SIGTERM, term_cb, s);
        s->ev_int = evsignal_new(s->base, SIGINT, term_cb, s);
        s->ev_hup = evsignal_new(s->base, SIGHUP, hup_cb, s);
        if (!s->listener || !s->ev_accept_resume || !s->ev_sched || !s->ev_term || !s->ev_int || !s->ev_hup ||
            event_add(s->ev_sched, NULL) < 0 || event_add(s->ev_term, NULL) < 0 ||
            event_add(s->ev_int, NULL) < 0 || event_add(s->ev_hup, NULL) < 0) {
                server_free(s);
                return log_error_errno(ENOMEM, "server: cannot set up the event loop");
        }
        if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0) {
                /* ping at half the interval, from the loop: a stuck loop stops the pings */
                struct timeval tv = { (time_t) (wd_usec / 2 / 1000000),
                                      (suseconds_t) (wd_usec / 2 % 1000000) };
                s->ev_watchdog = event_new(s->base, -1, EV_PERSIST, watchdog_cb, s);
                if (s->ev_watchdog)
                        event_add(s->ev_watchdog, &tv);
        }
        *ret = s;
        return 0;
}

int server_run(struct server *s) {
        if (event_base_dispatch(s->base) < 0)
                return log_error_errno(EIO, "server: event loop failed");
        return 0;
}

void server_free(struct server *s) {
        if (!s)
                return;
        while (s->conns)
                conn_free(s->conns);
        if (s->ev_sched)
                event_free(s->ev_sched);
        if (s->ev_term)
                event_free(s->ev_term);
        if (s->ev_int)
                event_free(s->ev_int);
        if (s->ev_hup)
                event_free(s->ev_hup);
        if (s->ev_grace)
                event_free(s->ev_grace);
        if (s->ev_watchdog)
                event_free(s->ev_watchdog);
        if (s->ev_accept_resume)
                event_free(s->ev_accept_resume);
        if (s->spare_fd >= 0)
                close(s->spare_fd);
        if (s->ev_idle)
                event_free(s->ev_idle);
        if (s->listener)
                evconnlistener_free(s->listener);
        if (s->base)
                event_base_free(s->base);
        free(s);
}
