/* SPDX-License-Identifier: MIT */
/* xing4-http: OpenAI's HTTP API on one side, xing4d's protocol (libx4client) on the other.
 *
 * One thread, one libevent loop: evhttp serves the clients; each daemon socket is one multiplexed
 * libx4client connection whose fd sits in the same loop (x4_client_dispatch() on readable). A
 * request's life: parse + check (openai.c) → pick a daemon (least loaded, prefix affinity) →
 * x4_client_submit() → chunks become SSE events or are gathered → Done/Error ends the HTTP reply.
 * A client that goes away (evhttp's close callback) gets its request cancelled in the daemon.
 *
 * Job lifetime: a job is freed only in its on_done callback, which libx4client calls exactly once
 * per submitted request (also when the daemon connection breaks), or, for a request sent again
 * (truncation "auto"), in on_truncate_retry; the HTTP side just drops its evhttp_request pointer
 * when the reply is complete or the client is gone. */
#include <errno.h>
#include <fcntl.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <fnmatch.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bridge.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/util.h"

#define BRIDGE_VERSION "0.1.0"
#define MAX_SOCKETS 16
#define DEFAULT_CONFIG "/etc/xing4d/xing4-http.conf"
/* unsent SSE bytes of one client before its generation is cancelled (~30k chunks of ~250 B): a
 * daemon older than protocol 1.6 cannot pause it (STREAM_PAUSE_HIGH) */
#define STREAM_BACKLOG_MAX (8u << 20)
/* Back-pressure: a stream's generation is paused in the daemon (x4_client_pause) while more than
 * STREAM_PAUSE_HIGH bytes wait for its client, and resumed once they drain to STREAM_PAUSE_LOW.
 * The daemon connection is shared by every request, so it is not the socket that stops. */
#define STREAM_PAUSE_HIGH (256u << 10)
#define STREAM_PAUSE_LOW (64u << 10)

/* ---- configuration ------------------------------------------------------------------------------- */

struct config {
        char listen[256];               /* HOST:PORT */
        char *sockets[MAX_SOCKETS];
        size_t n_sockets;
        char api_key_file[512];
        char model_name[128];           /* "" = the daemon's model name */
        size_t max_body;                /* bytes of a request body */
        unsigned max_concurrent;        /* generations in flight before 429 */
        int timeout_s;                  /* header/body read and write inactivity */
        int connect_timeout_ms;         /* daemon connect + handshake */
        int retry_after_s;
        char *cors_origins[32];         /* Origins whose browser requests are served */
        size_t n_cors;
        char *aliases[32];              /* model-alias patterns */
        size_t n_aliases;
        bool aliases_set;               /* the default table was replaced */
        size_t store_entries, store_bytes;
        int store_retention_s;
        int sse_keepalive_s;            /* stream: a keep-alive comment this often until output */
        int drain_timeout_s;            /* SIGTERM: the time generations in flight get to finish */
};

struct backend {
        char *path;
        x4_client *c;
        struct event *ev;
        unsigned inflight;
        int64_t last_fail_ms;
        char last_error[256];
        char model_name[128];
        char fingerprint[80];
};

struct job {
        struct job *prev, *next;
        /* the response's "id" and the handle of DELETE /v1/requests/{id}: "chatcmpl-" or "cmpl-" and
         * 128 random bits in hex, so a client cannot guess (and cancel) another's generation */
        char idstr[48];
        int key;                        /* index in api_keys of the key that started it, -1 = none */
        const char *endpoint;
        struct backend *be;
        uint64_t rid;                   /* libx4client's id on be->c */
        struct evhttp_request *req;     /* NULL once answered or the client is gone */
        struct evhttp_connection *conn;
        struct event *watch;            /* EV_CLOSED on the client's socket */
        enum api_kind kind;
        bool stream, include_usage;
        unsigned top_logprobs;
        bool logprobs;                  /* asked for */
        bool headers_sent, role_sent;
        bool submitting, done_early;
        struct x4_done early;           /* on_done that ran inside x4_client_submit() */
        struct api_result res;
        size_t n_calls;
        char model[128];                /* the model name answered */
        json_t *echo, *conv;            /* responses: the request's settings, its conversation */
        json_t *input;                  /* responses: its input as sent (stored for input_items) */
        bool store;
        struct ev_stream ev;            /* messages, responses: the event stream's state */
        double t_start, t_last;
        bool got_first;
        uint32_t tokens;                /* tokens generated so far */
        int64_t created;
        struct event *tick;             /* stream: headers, then keep-alives while nothing is sent */
        bool wrote;                     /* stream: bytes went out since the last tick */
        bool paused;                    /* stream: paused in the daemon until its client reads */
        struct evbuffer *drain_buf;     /* stream: the client's output, watched (on_client_drain) */
        struct evbuffer_cb_entry *drain_cb;
        bool one_call, no_calls;        /* see struct api_request */
        bool cut;                       /* one_call: the first call ended the answer (on_chunk) */
        /* responses, truncation "auto": the body, parsed again with more of the conversation left
         * out after each refusal of a prompt too long (truncate_retry) */
        char *body;
        size_t body_len, drop;
        unsigned attempts;
};

#define MAX_API_KEYS 64

/* The bridge's state, all of it: one instance, read and written on the one libevent thread. */
static struct bridge {
        struct config cfg;
        /* The keys of api-key-file, one per line: each client (or team) can get its own, and only
         * the key a generation was started with may cancel it. */
        char *api_keys[MAX_API_KEYS];
        size_t n_api_keys;
        struct backend backends[MAX_SOCKETS]; /* the daemons, one per socket */
        size_t n_backends;
        struct event_base *base;
        char served_model[128];
        int64_t started_unix;
        struct job *jobs; /* the generations in flight */
        unsigned n_jobs;
        /* SIGTERM: no new generations; exit when the running ones are answered or the grace time
         * ends */
        bool draining;
        /* generation replies handed to evhttp but not yet written out: exiting earlier would cut
         * them */
        unsigned replies_unsent;
        /* accept() failing (EMFILE...): the listener is off until accept_resume fires */
        struct evconnlistener *listener;
        struct event *accept_resume;
        double accept_warned_ms;        /* the last warning about it (now_ms) */
        unsigned accept_failures;       /* failures since that warning */
        unsigned accept_shed;           /* connections answered 503 and closed since that warning */
        int spare_fd;                   /* held open to be given up at the descriptor limit (shed_pending) */
} br = {
        .cfg = {
                .listen = "127.0.0.1:8000",
                .max_body = 4u << 20,
                .max_concurrent = 64,
                .timeout_s = 60,
                .connect_timeout_ms = 3000,
                .retry_after_s = 1,
                .store_entries = 256,
                .store_bytes = 64u << 20,
                .store_retention_s = 3600,
                .sse_keepalive_s = 10,
                .drain_timeout_s = 30,
        },
        .served_model = "xing4",
        .spare_fd = -1,
};

/* Agents send their own model names (Claude Code: claude-sonnet-4-5, claude-haiku-...): served by
 * the one model unless model-alias replaces this table. */
static const char *const default_aliases[] = { "claude-*" };

static int config_set(const char *key, const char *value, const char *where) {
        char *end;
        /* an empty socket was kept as a daemon at "" (every request then 503), an empty listen
         * address was reported as if --listen had been given */
        if ((streq(key, "socket") || streq(key, "listen")) && !*value)
                return log_error_errno(EINVAL, "%s: %s: empty value", where, key);
        if (streq(key, "listen"))
                snprintf(br.cfg.listen, sizeof br.cfg.listen, "%s", value);
        else if (streq(key, "socket")) {
                if (br.cfg.n_sockets >= MAX_SOCKETS)
                        return log_error_errno(E2BIG, "%s: socket: at most %d daemon sockets", where, MAX_SOCKETS);
                br.cfg.sockets[br.cfg.n_sockets++] = strdup(value);
        } else if (streq(key, "api-key-file"))
                snprintf(br.cfg.api_key_file, sizeof br.cfg.api_key_file, "%s", value);
        else if (streq(key, "model-name"))
                snprintf(br.cfg.model_name, sizeof br.cfg.model_name, "%s", value);
        else if (streq(key, "cors-origin") || streq(key, "model-alias")) {
                bool cors = streq(key, "cors-origin");
                char **list = cors ? br.cfg.cors_origins : br.cfg.aliases;
                size_t *n = cors ? &br.cfg.n_cors : &br.cfg.n_aliases;
                if (!cors && !br.cfg.aliases_set) {
                        br.cfg.aliases_set = true; /* the first one replaces the default table */
                        *n = 0;
                }
                if (!cors && streq(value, "none"))
                        return 0;
                if (!*value)
                        return log_error_errno(EINVAL, "%s: %s: empty value", where, key);
                if (cors && !streq(value, "*") && strncmp(value, "http://", 7) != 0 && strncmp(value, "https://", 8) != 0)
                        return log_error_errno(EINVAL, "%s: cors-origin \"%s\": an origin like https://app.example:8443 "
                                               "(scheme://host[:port], no path) or * expected", where, value);
                if (cors && strchr(value + (value[0] == 'h' ? 8 : 0), '/'))
                        return log_error_errno(EINVAL, "%s: cors-origin \"%s\": an origin has no path", where, value);
                if (*n >= 32)
                        return log_error_errno(E2BIG, "%s: %s: at most 32", where, key);
                list[(*n)++] = strdup(value);
        } else {
                static const char *const numeric[] = { "max-body-bytes", "max-concurrent", "timeout",
                                                       "connect-timeout-ms", "retry-after", "response-store",
                                                       "response-store-bytes", "response-retention",
                                                       "sse-keepalive", "drain-timeout" };
                bool known = false;
                for (size_t i = 0; i < ELEMENTSOF(numeric); i++)
                        known = known || streq(key, numeric[i]);
                if (!known)
                        return log_error_errno(EINVAL, "%s: unknown setting \"%s\"", where, key);
                errno = 0;
                long long v = strtoll(value, &end, 10);
                long long lo = streq(key, "response-store") ? 0 : 1;
                if (errno || end == value || *end || v < lo || v > INT_MAX)
                        return log_error_errno(EINVAL, "%s: %s: \"%s\" is not a %s integer", where, key, value,
                                               lo ? "positive" : "non-negative");
                if (streq(key, "max-body-bytes"))
                        br.cfg.max_body = (size_t) v;
                else if (streq(key, "max-concurrent"))
                        br.cfg.max_concurrent = (unsigned) v;
                else if (streq(key, "timeout"))
                        br.cfg.timeout_s = (int) v;
                else if (streq(key, "connect-timeout-ms"))
                        br.cfg.connect_timeout_ms = (int) v;
                else if (streq(key, "retry-after"))
                        br.cfg.retry_after_s = (int) v;
                else if (streq(key, "response-store"))
                        br.cfg.store_entries = (size_t) v;
                else if (streq(key, "response-store-bytes"))
                        br.cfg.store_bytes = (size_t) v;
                else if (streq(key, "response-retention"))
                        br.cfg.store_retention_s = (int) v;
                else if (streq(key, "sse-keepalive"))
                        br.cfg.sse_keepalive_s = (int) v;
                else if (streq(key, "drain-timeout"))
                        br.cfg.drain_timeout_s = (int) v;
                else
                        return log_error_errno(EINVAL, "%s: unknown setting \"%s\"", where, key);
        }
        return 0;
}

/* Whether fgets() left part of this line unread (the buffer was full before its end): a line
 * exactly filling the buffer is whole when the newline or the end of the file comes next. */
static bool line_cut(FILE *f, const char *line) {
        if (strchr(line, '\n'))
                return false;
        int c = getc(f);
        return c != EOF && c != '\n';
}

/* INI: [xing4-http] section, key = value, # or ; comments. A missing default file is fine. */
static int config_load(const char *path, bool required) {
        _cleanup_fclose_ FILE *f = fopen(path, "re");
        char line[1024], where[600];
        bool in_section = false;
        unsigned lineno = 0;
        if (!f) {
                if (!required && errno == ENOENT)
                        return 0;
                return log_error_errno(errno, "%s: cannot open the config file: %m", path);
        }
        while (fgets(line, sizeof line, f)) {
                lineno++;
                snprintf(where, sizeof where, "%s:%u", path, lineno);
                /* a line that does not fit would be read as two (its tail taken for a setting) */
                if (line_cut(f, line))
                        return log_error_errno(E2BIG, "%s: line longer than %zu bytes", where, sizeof line - 1);
                char *s = strip(line);
                if (!*s || *s == '#' || *s == ';')
                        continue;
                if (*s == '[') {
                        in_section = streq(s, "[xing4-http]");
                        if (!in_section)
                                return log_error_errno(EINVAL, "%s: section %s: [xing4-http] expected", where, s);
                        continue;
                }
                char *eq = strchr(s, '=');
                if (!eq)
                        return log_error_errno(EINVAL, "%s: \"%s\": key = value expected", where, s);
                if (!in_section)
                        return log_error_errno(EINVAL, "%s: setting before the [xing4-http] section", where);
                *eq = 0;
                int r = config_set(strip(s), strip(eq + 1), where);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* ---- daemons ------------------------------------------------------------------------------------- */


static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void backend_drop(struct backend *be) {
        if (be->ev) {
                event_free(be->ev);
                be->ev = NULL;
        }
        if (be->c) {
                x4_client_free(be->c);
                be->c = NULL;
        }
}

static void backend_readable(evutil_socket_t fd, short what, void *arg) {
        struct backend *be = arg;
        int r = x4_client_dispatch(be->c);
        if (r < 0) {
                /* every pending request has had its on_done with the error already */
                snprintf(be->last_error, sizeof be->last_error, "%s", x4_client_last_error(be->c));
                log_warning("%s: daemon connection lost: %s", be->path, be->last_error);
                be->last_fail_ms = now_ms();
                backend_drop(be);
        }
}

static void on_progress(uint64_t request_id, uint32_t done_tokens, uint32_t total_tokens, void *arg);

/* Connect (and handshake) if not connected. A daemon that failed within the last second is not
 * retried, so a flood of requests to a dead socket does not stall the loop on connects. */
static int backend_ensure(struct backend *be) {
        if (be->c)
                return 0;
        if (be->last_fail_ms && now_ms() - be->last_fail_ms < 1000)
                return X4_E_CONNECT;
        x4_client *c = NULL;
        int r = x4_client_new(&c);
        if (r < 0)
                return r;
        x4_client_set_name(c, "xing4-http " BRIDGE_VERSION);
        x4_client_set_progress_cb(c, on_progress);
        /* blocking calls here (health, stats, info) must not stall the loop for long */
        x4_client_set_timeouts(c, br.cfg.connect_timeout_ms, br.cfg.connect_timeout_ms);
        r = x4_client_connect(c, be->path);
        if (r < 0) {
                snprintf(be->last_error, sizeof be->last_error, "%s", x4_client_last_error(c));
                x4_client_free(c);
                be->last_fail_ms = now_ms();
                return r;
        }
        struct x4_info info;
        if (x4_client_info(c, &info) == 0) {
                snprintf(be->model_name, sizeof be->model_name, "%s", info.model_name);
                snprintf(be->fingerprint, sizeof be->fingerprint, "%s", info.model_fingerprint);
        }
        be->c = c;
        be->ev = event_new(br.base, x4_client_fd(c), EV_READ | EV_PERSIST, backend_readable, be);
        if (!be->ev || event_add(be->ev, NULL) < 0) {
                backend_drop(be);
                return X4_E_NOMEM;
        }
        be->last_fail_ms = 0;
        be->last_error[0] = 0;

        log_info("%s: connected to %s", be->path, x4_client_server_version(c));
        return 0;
}

static uint64_t hash_bytes(const char *s, size_t n) {
        uint64_t h = 14695981039346656037ull; /* FNV-1a */
        for (size_t i = 0; i < n; i++)
                h = (h ^ (unsigned char) s[i]) * 1099511628211ull;
        return h;
}

/* Least loaded daemon; the one the prompt's opening bytes hash to wins ties and near-ties (one
 * request of slack), since it probably holds that prefix in its cache. */
static struct backend *backend_pick(const char *key, size_t key_len) {
        struct backend *best = NULL;
        size_t pref = br.n_backends > 1 && key ? hash_bytes(key, key_len) % br.n_backends : 0;
        for (size_t i = 0; i < br.n_backends; i++) {
                struct backend *be = &br.backends[i];
                if (!be->c && be->last_fail_ms && now_ms() - be->last_fail_ms < 1000)
                        continue;
                if (!best || be->inflight < best->inflight)
                        best = be;
        }
        if (best && br.n_backends > 1) {
                struct backend *p = &br.backends[pref];
                if ((p->c || !p->last_fail_ms || now_ms() - p->last_fail_ms >= 1000) &&
                    p->inflight <= best->inflight + 1)
                        best = p;
        }
        return best ? best : &br.backends[pref];
}

/* ---- HTTP helpers -------------------------------------------------------------------------------- */

/* The reply to a HEAD request: the GET's headers with the Content-Length its body would have, and
 * no body (RFC 9110 9.3.2). libevent 2.1 sends the body of a HEAD reply without a Content-Length,
 * which a keep-alive client reads as the start of its next response. */
static void head_strip(struct evhttp_request *req) {
        if (evhttp_request_get_command(req) != EVHTTP_REQ_HEAD)
                return;
        struct evbuffer *b = evhttp_request_get_output_buffer(req);
        char v[24];
        snprintf(v, sizeof v, "%zu", evbuffer_get_length(b));
        struct evkeyvalq *out = evhttp_request_get_output_headers(req);
        evhttp_remove_header(out, "Content-Length");
        evhttp_add_header(out, "Content-Length", v);
        evbuffer_drain(b, evbuffer_get_length(b));
}

static void send_json(struct evhttp_request *req, int status, json_t *j, const char *endpoint) {
        char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
        json_decref(j);
        struct evbuffer *b = evhttp_request_get_output_buffer(req);
        if (s) {
                evbuffer_add(b, s, strlen(s));
                evbuffer_add(b, "\n", 1);
                free(s);
        }
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
        const char *reason = status == 200 ? "OK" : status == 400 ? "Bad Request" : status == 401 ? "Unauthorized"
                : status == 403 ? "Forbidden" : status == 404 ? "Not Found" : status == 405 ? "Method Not Allowed"
                : status == 413 ? "Payload Too Large" : status == 415 ? "Unsupported Media Type"
                : status == 429 ? "Too Many Requests" : status == 499 ? "Request Cancelled"
                : status == 503 ? "Service Unavailable" : "Error";
        head_strip(req);
        evhttp_send_reply(req, status, reason, NULL);
        metrics_count_request(endpoint, status);
}

/* The request's path: the request-target up to '?' or '#'. Not evhttp's parsed path: it reads a
 * target starting "//" ("//v1/chat/completions", what a base URL with a trailing slash joined to
 * "/v1/..." gives) as an authority and drops the first segment. An absolute-form target
 * ("http://host/v1/...") takes the parsed path. */
static const char *request_path(struct evhttp_request *req, char *buf, size_t size) {
        const char *raw = evhttp_request_get_uri(req);
        if (!raw || raw[0] != '/') {
                const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
                const char *p = uri ? evhttp_uri_get_path(uri) : NULL;
                return p && *p ? p : "/";
        }
        size_t n = strcspn(raw, "?#");
        if (n >= size)
                n = size - 1;
        memcpy(buf, raw, n);
        buf[n] = 0;
        return buf;
}

/* Which error shape the request answers in: Anthropic's on its paths, and for a client that says
 * it speaks Anthropic's API (anthropic-version) on the shared ones (/v1/models). */
static enum api_flavor flavor_of(struct evhttp_request *req) {
        char buf[512], path[512];
        const char *raw = request_path(req, buf, sizeof buf);
        size_t n = 0;
        for (const char *p = raw; *p && n < sizeof path - 1; p++) /* "/v1//messages" too */
                if (!(*p == '/' && n > 0 && path[n - 1] == '/'))
                        path[n++] = *p;
        path[n] = 0;
        if (strncmp(path, "/v1/messages", 12) == 0)
                return FLAVOR_ANTHROPIC;
        if (strncmp(path, "/v1/models", 10) == 0 &&
            evhttp_find_header(evhttp_request_get_input_headers(req), "anthropic-version"))
                return FLAVOR_ANTHROPIC;
        return FLAVOR_OPENAI;
}

static void send_error(struct evhttp_request *req, const struct api_error *e, const char *endpoint) {
        if (e->retry_after > 0) {
                char v[16];
                snprintf(v, sizeof v, "%d", e->retry_after);
                evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", v);
        }
        log_debug("%s: %d %s", endpoint, e->status, e->message);
        json_t *j = api_error_json(e, flavor_of(req));
        if (!j)
                log_error("%s: cannot encode the error \"%s\"", endpoint, e->message);
        send_json(req, e->status, j, endpoint);
}

/* ---- generations --------------------------------------------------------------------------------- */



static void maybe_exit_drained(void) {
        if (br.draining && br.n_jobs == 0 && br.replies_unsent == 0)
                event_base_loopexit(br.base, NULL);
}

static void on_reply_sent(struct evhttp_request *req, void *arg) {
        br.replies_unsent--;
        maybe_exit_drained();
}

static void job_unlink(struct job *j) {
        if (j->prev)
                j->prev->next = j->next;
        else
                br.jobs = j->next;
        if (j->next)
                j->next->prev = j->prev;
        br.n_jobs--;
}

static void job_free(struct job *j) {
        if (j->tick)
                event_free(j->tick);
        free(j->body);
        api_result_done(&j->res);
        json_decref(j->echo);
        json_decref(j->conv);
        json_decref(j->input);
        ev_stream_done(&j->ev);
        free(j);
}

/* The HTTP side is done with this job (reply sent): stop listening for its connection's close. */
static void job_unwatch(struct job *j) {
        if (j->watch) {
                event_free(j->watch);
                j->watch = NULL;
        }
}

static void job_undrain(struct job *j) {
        if (j->drain_cb) {
                evbuffer_remove_cb_entry(j->drain_buf, j->drain_cb);
                j->drain_cb = NULL;
                j->drain_buf = NULL;
        }
}

static void job_release_http(struct job *j) {
        job_unwatch(j);
        job_undrain(j);
        if (j->conn)
                evhttp_connection_set_closecb(j->conn, NULL, NULL);
        j->req = NULL;
        j->conn = NULL;
}

static void on_client_close(struct evhttp_connection *conn, void *arg) {
        struct job *j = arg;
        job_unwatch(j);
        job_undrain(j);
        j->req = NULL;
        j->conn = NULL;
        br.replies_unsent--; /* its reply will never be sent */
        evhttp_connection_set_closecb(conn, NULL, NULL);
        log_info("%s: client went away, cancelling its request", j->idstr);
        if (j->be->c)
                (void) x4_client_cancel(j->be->c, j->rid); /* may run on_done: j is gone after this */
}

/* libevent 2.1's evhttp stops reading a connection while its request is being answered, so it
 * would only notice a vanished client at the next write (never, for a non-streaming request that
 * is still generating). An EV_CLOSED watch (EPOLLRDHUP) on the socket sees the hang-up at once;
 * freeing the connection then runs on_client_close(), which cancels the generation. */
static void on_peer_closed(evutil_socket_t fd, short what, void *arg) {
        struct job *j = arg;
        job_unwatch(j);
        if (j->conn)
                evhttp_connection_free(j->conn); /* j may be freed from here on */
}

static void job_watch(struct job *j) {
        struct bufferevent *bev = evhttp_connection_get_bufferevent(j->conn);
        evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
        if (fd < 0 || !(event_base_get_features(br.base) & EV_FEATURE_EARLY_CLOSE))
                return; /* then only a failed write tells (streaming) */
        j->watch = event_new(br.base, fd, EV_CLOSED, on_peer_closed, j);
        if (j->watch && event_add(j->watch, NULL) < 0)
                job_unwatch(j);
}

/* Messages and Responses: collect everything (their final events quote it) and stream the API's
 * events. */
static int ev_chunk(struct job *j, const struct x4_chunk *c) {
        bool call = c->channel == X4_CHANNEL_TOOL_CALL && c->tool_name;
        if (j->kind == API_COUNT_TOKENS)
                return 0;
        if (call)
                api_result_add_call(&j->res, c->tool_name, c->tool_arguments_json);
        else if (c->text_len && c->channel != X4_CHANNEL_TOOL_CALL)
                api_result_add_text(&j->res, c->channel == X4_CHANNEL_REASONING, c->text, c->text_len);
        if (!j->stream || (!call && !(c->text_len && c->channel != X4_CHANNEL_TOOL_CALL)))
                return 0;
        if (!j->headers_sent) {
                sse_start(j->req);
                j->headers_sent = true;
        }
        struct evbuffer *b = evbuffer_new();
        if (!b)
                return 0;
        ev_stream_chunk(&j->ev, c, b);
        j->wrote = j->wrote || evbuffer_get_length(b) > 0;
        sse_send_buffer(j->req, b);
        evbuffer_free(b);
        return 0;
}

/* OpenAI's system_fingerprint: what answered, stable while that does. "fp_xing4d_" and 10 hex
 * digits of an FNV-1a hash of the served model name and the daemon's model fingerprint (its
 * file's identity, from Info; empty when the daemon did not say), so daemons serving the same
 * file answer the same. */
static void system_fingerprint(const struct job *j, char *buf, size_t size) {
        char what[sizeof br.served_model + sizeof j->be->fingerprint + 1];
        int n = snprintf(what, sizeof what, "%s\n%s", br.served_model, j->be ? j->be->fingerprint : "");
        snprintf(buf, size, "fp_xing4d_%010llx",
                 (unsigned long long) (hash_bytes(what, n > 0 ? (size_t) n : 0) & 0xFFFFFFFFFFull));
}

/* A chat or completions object as it goes out: with its system_fingerprint, and in a stream that
 * ends with the usage chunk (stream_options.include_usage) "usage": null on every other chunk, as
 * OpenAI's have. */
static json_t *openai_object(const struct job *j, json_t *o) {
        char fp[32];
        if (!o)
                return NULL;
        system_fingerprint(j, fp, sizeof fp);
        json_object_set_new(o, "system_fingerprint", json_string(fp));
        if (j->stream && j->include_usage && !json_object_get(o, "usage"))
                json_object_set_new(o, "usage", json_null());
        return o;
}

/* One streamed chunk (chat or completions; steals delta and logprobs). */
static void send_chunk(struct job *j, json_t *delta, const char *finish_reason, json_t *logprobs) {
        sse_send_json(j->req, openai_object(j, api_chunk_json(j->kind, j->idstr, j->created, br.served_model, delta,
                                                              finish_reason, logprobs)));
}

static void stream_begin(struct job *j) {
        if (!j->headers_sent) {
                sse_start(j->req);
                j->headers_sent = true;
        }
        if (j->kind == API_CHAT && !j->role_sent) {
                j->role_sent = true;
                send_chunk(j, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, NULL);
        }
}

/* A streamed request's 200 and its headers wait for a sign that the daemon took the prompt: its
 * first chunk, or a prefill progress frame (the prompt was tokenized, fit the context and is
 * being computed), so a refusal (a prompt over the context, a bad setting) keeps its HTTP status,
 * which clients act on (OpenAI's 400 context_length_exceeded, Anthropic's "prompt is too long"),
 * however long tokenizing took. Without either within sse-keepalive seconds (a request queued
 * behind others) they go out anyway, with a `: keep-alive` comment then and every sse-keepalive
 * seconds until the first token: proxies drop a connection that stays silent for 60-100 s. */
/* The headers (and for Responses its response.created: the client learns the response's id while
 * the prompt is queued or prefilled, and can cancel it). */
static void stream_headers(struct job *j) {
        if (j->headers_sent)
                return;
        sse_start(j->req);
        j->headers_sent = true;
        if (j->kind == API_RESPONSES) {
                struct evbuffer *b = evbuffer_new();
                if (b) {
                        ev_stream_start(&j->ev, b);
                        sse_send_buffer(j->req, b);
                        evbuffer_free(b);
                }
        }
}

static void on_stream_tick(evutil_socket_t fd, short what, void *arg) {
        struct job *j = arg;
        if (!j->req)
                return;
        /* also while tokens come that show nothing yet (a tool call being written, a held-back
         * stop-string prefix): minutes of silence for the client and its proxies otherwise */
        if (!j->headers_sent) {
                stream_headers(j);
                sse_keepalive(j->req);
        } else if (!j->wrote)
                sse_keepalive(j->req);
        j->wrote = false;
        struct timeval tv = { br.cfg.sse_keepalive_s, 0 };
        evtimer_add(j->tick, &tv);
}

/* The daemon prefills the prompt: it was accepted, so a streamed request's headers can go. */
static void on_progress(uint64_t request_id, uint32_t done_tokens, uint32_t total_tokens, void *arg) {
        struct job *j = arg;
        (void) request_id, (void) done_tokens, (void) total_tokens;
        if (j && j->req && j->stream && !j->headers_sent && !j->got_first) {
                stream_headers(j);
                j->wrote = true;
        }
}

/* A finished tool call as OpenAI streams it: a first delta naming the call, then the arguments in
 * fragments (the daemon reports a call once it is complete, so the fragments follow each other). */
static void stream_tool_call(struct job *j, const char *name, const char *args) {
        char cid[64];
        size_t idx = j->n_calls++;
        api_call_id(cid, sizeof cid, "call_", j->idstr, idx);
        json_t *d = json_pack("{s:[{s:I, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", (json_int_t) idx, "id",
                              cid, "type", "function", "function", "name", name, "arguments", "");
        send_chunk(j, d, NULL, NULL);
        size_t n = strlen(args), off = 0;
        while (off < n) {
                size_t k = n - off < 24 ? n - off : 24;
                while (off + k < n && ((unsigned char) args[off + k] & 0xC0) == 0x80)
                        k++; /* never split a UTF-8 sequence */
                d = json_pack("{s:[{s:I, s:{s:s%}}]}", "tool_calls", "index", (json_int_t) idx, "function",
                              "arguments", args + off, k);
                send_chunk(j, d, NULL, NULL);
                off += k;
        }
}

/* One chunk to the client: an SSE event, or gathered for the whole answer. Nonzero: cancel. */
static int chunk_out(struct job *j, const struct x4_chunk *c) {
        j->tokens += c->n_token_ids;
        if (c->n_token_ids > 0) {
                double t = now_s();
                if (!j->got_first) {
                        metrics_observe_ttft(t - j->t_start);
                        j->got_first = true;
                } else
                        metrics_observe_token_latency(t - j->t_last);
                j->t_last = t;
        }
        bool call = c->channel == X4_CHANNEL_TOOL_CALL && c->tool_name;
        /* a token came: the prompt was taken, the headers may go (its text may be held back) */
        if (j->stream && !j->headers_sent && c->n_token_ids > 0) {
                stream_headers(j);
                j->wrote = true;
        }
        if (c->prompt_tokens) {
                j->ev.prompt_tokens = c->prompt_tokens;
                j->ev.cached_tokens = c->cached_tokens <= c->prompt_tokens ? c->cached_tokens : c->prompt_tokens;
        }
        if (j->kind == API_MESSAGES || j->kind == API_RESPONSES || j->kind == API_COUNT_TOKENS) {
                struct bufferevent *bev = j->stream ? evhttp_connection_get_bufferevent(j->conn) : NULL;
                if (bev && evbuffer_get_length(bufferevent_get_output(bev)) > STREAM_BACKLOG_MAX) {
                        log_warning("%s: client is not reading (%zu bytes unsent), cancelling", j->idstr,
                                    evbuffer_get_length(bufferevent_get_output(bev)));
                        return 1;
                }
                return ev_chunk(j, c);
        }
        if (!j->stream) {
                if (j->kind == API_COMPLETION) {
                        if (c->text_len)
                                api_result_add_text(&j->res, false, c->text, c->text_len);
                } else if (call)
                        api_result_add_call(&j->res, c->tool_name, c->tool_arguments_json);
                else if (c->text_len && c->channel != X4_CHANNEL_TOOL_CALL)
                        api_result_add_text(&j->res, c->channel == X4_CHANNEL_REASONING, c->text, c->text_len);
                /* chat: logprobs.content covers the answer's tokens, as OpenAI's (reasoning and
                 * tool-call tokens are not content, nor are special ones: api_chunk_logprobs) */
                if ((j->res.logprobs || c->n_logprobs) &&
                    (j->kind != API_CHAT || c->channel == X4_CHANNEL_CONTENT))
                        api_result_add_logprobs(&j->res, j->kind, c, j->top_logprobs);
                return 0;
        }
        /* a client that does not read: stop generating rather than buffer without bound */
        struct bufferevent *bev = evhttp_connection_get_bufferevent(j->conn);
        if (bev && evbuffer_get_length(bufferevent_get_output(bev)) > STREAM_BACKLOG_MAX) {
                log_warning("%s: client is not reading (%zu bytes unsent), cancelling", j->idstr,
                            evbuffer_get_length(bufferevent_get_output(bev)));
                return 1;
        }
        json_t *lp = j->kind == API_CHAT && (c->channel != X4_CHANNEL_CONTENT || !j->logprobs) ? NULL :
                     api_chunk_logprobs(j->kind, c, j->top_logprobs, &j->res);
        if (!c->text_len && !call && !lp)
                return 0;
        stream_begin(j);
        j->wrote = true;
        if (j->kind == API_COMPLETION) {
                send_chunk(j, json_stringn(c->text, c->text_len), NULL, lp);
                return 0;
        }
        if (call) {
                json_decref(lp);
                stream_tool_call(j, c->tool_name, c->tool_arguments_json ? c->tool_arguments_json : "{}");
                return 0;
        }
        if (c->channel == X4_CHANNEL_TOOL_CALL) {
                json_decref(lp); /* the call's raw text: it arrives parsed when the call ends */
                return 0;
        }
        json_t *d;
        if (c->channel == X4_CHANNEL_REASONING)
                d = json_pack("{s:s%, s:s%}", "reasoning_content", c->text, c->text_len, "reasoning", c->text,
                              c->text_len);
        else
                d = json_pack("{s:s%}", "content", c->text, c->text_len);
        send_chunk(j, d, NULL, lp);
        return 0;
}

/* The client's output drained: a paused generation goes on once it is down to STREAM_PAUSE_LOW. */
static void on_client_drain(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg) {
        struct job *j = arg;
        if (!j->paused || info->n_deleted == 0 || evbuffer_get_length(buf) > STREAM_PAUSE_LOW)
                return;
        j->paused = false;
        log_debug("%s: the client reads again, resuming its generation", j->idstr);
        if (j->be->c)
                (void) x4_client_pause(j->be->c, j->rid, false);
}

/* After a chunk of a stream went out: pause the generation while its client does not keep up, so
 * neither the bridge nor the daemon buffers the rest of the answer. */
static void stream_backpressure(struct job *j) {
        if (!j->stream || j->paused || !j->conn || !j->be->c)
                return;
        struct bufferevent *bev = evhttp_connection_get_bufferevent(j->conn);
        struct evbuffer *out = bev ? bufferevent_get_output(bev) : NULL;
        if (!out || evbuffer_get_length(out) <= STREAM_PAUSE_HIGH)
                return;
        if (!j->drain_cb) {
                if (!(j->drain_cb = evbuffer_add_cb(out, on_client_drain, j)))
                        return;
                j->drain_buf = out;
        }
        if (x4_client_pause(j->be->c, j->rid, true) == 0) {
                j->paused = true;
                log_debug("%s: client is not keeping up (%zu bytes unsent), pausing its generation", j->idstr,
                          evbuffer_get_length(out));
        }
}

/* parallel_tool_calls false: the answer ends with its first complete call. The daemon has no
 * setting for it (a grammar for "one call, then the end of the turn" would have to know the
 * model's call syntax), so the bridge cancels the generation there: nothing the model writes after
 * the call reaches the client, the few tokens made before the Cancel arrives are not sent, and
 * the answer ends as a call does (finish_reason tool_calls, stop_reason tool_use; on_done). */
static int on_chunk(const struct x4_chunk *c, void *arg) {
        struct job *j = arg;
        if (!j->req)
                return 1; /* client gone: make sure the daemon stops */
        if (j->cut)
                return 0; /* after the one call: its Cancel is on the way */
        bool call = c->channel == X4_CHANNEL_TOOL_CALL && c->tool_name;
        if (call && j->no_calls) {
                /* tool_choice "none": the call as the text it stands for (api_call_text) */
                _cleanup_free_ char *text = api_call_text(c->tool_name, c->tool_arguments_json);
                if (!text)
                        return 0;
                struct x4_chunk t = *c;
                t.channel = X4_CHANNEL_CONTENT;
                t.text = text;
                t.text_len = strlen(text);
                t.tool_name = t.tool_arguments_json = NULL;
                return chunk_out(j, &t);
        }
        int r = chunk_out(j, c);
        if (r == 0 && j->req)
                stream_backpressure(j);
        if (r == 0 && call && j->one_call && j->kind != API_COUNT_TOKENS) {
                j->cut = true;
                return 1;
        }
        return r;
}

/* A generation cut short by a shutdown (the daemon's grace period, or this bridge's drain window,
 * ran out): 503 with Retry-After, which the SDKs retry, since the request itself was fine. */
static void shutdown_error(struct api_error *e, const struct job *j, const char *who, uint32_t tokens) {
        api_fail(e, 503, "server_error", "shutting_down", NULL,
                 "request %s: the generation was cut short after %u tokens because %s is shutting down (its "
                 "grace period for requests in flight ran out); the answer is incomplete: retry it", j->idstr,
                 tokens, who);
        e->retry_after = br.cfg.retry_after_s;
}

/* The error a failed or cancelled request answers with: the daemon's refusal; for a cancel by the
 * daemon shutting down a 503 (shutdown_error); for a cancel from elsewhere (DELETE
 * /v1/requests/ID, x4ctl cancel) a 499, which SDKs do not retry, saying the answer is incomplete.
 * A daemon that does not tell the two cancels apart (Done.server_shutdown) gets the 499. */
static void done_error(struct api_error *e, const struct job *j, const struct x4_done *d) {
        if (d->status != X4_OK)
                api_error_from_x4(e, j->kind, d->status, d->error_message);
        else if (d->server_shutdown)
                shutdown_error(e, j, "the daemon", d->completion_tokens);
        else
                api_fail(e, 499, j->kind == API_MESSAGES ? "api_error" : "server_error", "request_cancelled",
                         NULL,
                         "request %s: the generation was cancelled after %u tokens (by DELETE "
                         "/v1/requests/ID or x4ctl cancel); the answer is incomplete",
                         j->idstr, d->completion_tokens);
}

/* The answer of a request that failed: its HTTP status, or once a stream has started (too late for
 * a status) an error event that ends it, in the API's form. */
static void job_answer_error(struct job *j, const struct api_error *e) {
        if (!j->headers_sent)
                return send_error(j->req, e, j->endpoint);
        if (j->kind == API_CHAT || j->kind == API_COMPLETION)
                sse_send_json(j->req, api_error_json(e, FLAVOR_OPENAI));
        else {
                struct evbuffer *b = evbuffer_new();
                if (b) {
                        ev_stream_error(&j->ev, e, b);
                        sse_send_buffer(j->req, b);
                        evbuffer_free(b);
                }
        }
        evhttp_send_reply_end(j->req);
        metrics_count_request(j->endpoint, e->status);
}

/* Messages, count_tokens and Responses. */
static void ev_answer(struct job *j, const struct x4_done *d) {
        /* Messages has no status for it; a Responses stream would end with response.completed,
         * which Codex and the Agents SDK take as a finished answer (a non-streamed response says
         * "cancelled" in its status) */
        bool cancelled = d->finish_reason == X4_FINISH_CANCELLED &&
                         (j->kind == API_MESSAGES || (j->kind == API_RESPONSES && j->stream));
        if (d->status != X4_OK || cancelled) {
                struct api_error e;
                /* cut short from elsewhere: an empty end_turn would read as "nothing to say" to
                 * an agent, which then ends its turn */
                done_error(&e, j, d);
                return job_answer_error(j, &e);
        }
        if (j->kind == API_COUNT_TOKENS)
                return send_json(j->req, 200, json_pack("{s:I}", "input_tokens", (json_int_t) d->prompt_tokens),
                                 j->endpoint);
        if (j->kind == API_RESPONSES && j->store && d->finish_reason != X4_FINISH_CANCELLED)
                rs_store_put(j->idstr, j->key, j->conv, &j->res,
                             rs_response_json(j->idstr, j->created, j->model, j->echo, j->ev.reasoning_out, &j->res,
                                              d), j->input);
        if (!j->stream) {
                json_t *r = j->kind == API_MESSAGES ? am_response_json(j->idstr, j->model, &j->res, d)
                        : rs_response_json(j->idstr, j->created, j->model, j->echo, j->ev.reasoning_out, &j->res,
                                           d);
                return send_json(j->req, 200, r, j->endpoint);
        }
        if (!j->headers_sent) {
                sse_start(j->req);
                j->headers_sent = true;
        }
        struct evbuffer *b = evbuffer_new();
        if (b) {
                ev_stream_finish(&j->ev, d, b);
                sse_send_buffer(j->req, b);
                evbuffer_free(b);
        }
        evhttp_send_reply_end(j->req);
        metrics_count_request(j->endpoint, 200);
}

static void job_answer(struct job *j, const struct x4_done *d) {
        if (j->kind == API_MESSAGES || j->kind == API_RESPONSES || j->kind == API_COUNT_TOKENS)
                return ev_answer(j, d);
        if (d->status != X4_OK || d->finish_reason == X4_FINISH_CANCELLED) {
                struct api_error e;
                /* OpenAI's finish_reason has no "cancelled" (typed clients fail to parse one) and
                 * no value that says "cut short by someone else" */
                done_error(&e, j, d);
                return job_answer_error(j, &e);
        }
        bool had_calls = j->stream ? j->n_calls > 0 : j->res.n_calls > 0;
        if (j->stream) {
                stream_begin(j);
                send_chunk(j, j->kind == API_CHAT ? json_object() : json_string(""),
                           api_finish_reason(d->finish_reason, had_calls), NULL);
                if (j->include_usage)
                        sse_send_json(j->req, openai_object(j, api_usage_chunk_json(j->kind, j->idstr, j->created,
                                                                                    br.served_model, d)));
                sse_finish(j->req);
                metrics_count_request(j->endpoint, 200);
        } else
                send_json(j->req, 200,
                          openai_object(j, api_response_json(j->kind, j->idstr, j->created, br.served_model, &j->res, d)),
                          j->endpoint);
}

static void on_done(const struct x4_done *d, void *arg);

/* Submit j's request to the least loaded daemon (a broken connection is dropped and tried once
 * more); <0 with *why when it could not be sent. */
static int job_submit(struct job *j, struct api_request *ar, const char **why) {
        int r = X4_E_CONNECT;
        *why = "";
        for (int attempt = 0; attempt < 2; attempt++) {
                struct backend *be = backend_pick(ar->affinity_key, ar->affinity_len);
                j->be = be;
                r = backend_ensure(be);
                if (r < 0) {
                        *why = be->last_error;
                        continue;
                }
                j->submitting = true;
                j->done_early = false;
                r = x4_client_submit(be->c, ar->req, on_chunk, on_done, j, &j->rid);
                j->submitting = false;
                if (r >= 0)
                        break;
                *why = x4_client_last_error(be->c);
                if (r == X4_E_TOO_LARGE || r == X4_E_NOMEM)
                        break;
                /* the connection is broken: drop it and try a fresh one */
                snprintf(be->last_error, sizeof be->last_error, "%s", *why);
                *why = be->last_error;
                backend_drop(be);
        }
        return r;
}

/* truncation "auto": the prompt bytes to shed that a refusal of a prompt over the context says, 0
 * when it is no such refusal. A refusal in tokens is turned into bytes at the conversation's
 * average (instructions and tools counted), with a tenth to spare; one before tokenizing names
 * the bytes. Later attempts shed twice as much each, so a poor estimate costs few attempts. */
static uint64_t truncate_excess(const struct job *j, const char *msg, unsigned attempt) {
        unsigned n, limit;
        unsigned long long bytes, most;
        char what[16];
        uint64_t excess = 0;
        if (!msg)
                return 0;
        if (sscanf(msg, "prompt of %u tokens leaves no room for output in the context limit of %u", &n, &limit) == 2 &&
            n >= limit && n > 0) {
                uint64_t total = json_string_length(json_object_get(j->echo, "instructions"));
                size_t i;
                json_t *m;
                json_array_foreach(j->conv, i, m)
                        total += rs_message_bytes(m);
                _cleanup_free_ char *tools = json_dumps(json_object_get(j->echo, "tools"), JSON_COMPACT);
                total += tools ? strlen(tools) : 0;
                excess = (uint64_t) (n - limit + 1) * total / n * 11 / 10 + 1;
        } else if (sscanf(msg, "prompt.%15[a-z]: %llu bytes cannot fit the context limit of %u tokens (at most %llu",
                          what, &bytes, &limit, &most) == 4 && bytes > most)
                excess = bytes - most;
        return attempt > 2 && excess ? excess << (attempt > 12 ? 10 : attempt - 2) : excess;
}

static void on_truncate_retry(evutil_socket_t fd, short what, void *arg);

/* A prompt over the context with truncation "auto": true when the request is being sent again with
 * more of its oldest units left out (on_truncate_retry, from the loop: not from inside
 * libx4client's callback); false when nothing is left to leave out, and the refusal is the answer. */
static bool truncate_retry(struct job *j, const struct x4_done *d) {
        if (!j->body || !j->req || d->status != X4_E_TOO_LARGE || j->got_first || j->res.n_calls ||
            j->res.content_len || j->res.reasoning_len)
                return false;
        uint64_t excess = truncate_excess(j, d->error_message, j->attempts);
        size_t more = excess ? rs_truncate_plan(j->conv, excess) : 0;
        struct timeval now = { 0, 0 };
        if (more == 0 || event_base_once(br.base, -1, EV_TIMEOUT, on_truncate_retry, j, &now) < 0)
                return false;
        log_info("%s: %s; truncation \"auto\": leaving out %zu more of the oldest conversation items", j->idstr,
                 d->error_message, more);
        j->drop += more;
        j->attempts++;
        j->be->inflight--;
        return true;
}

static void on_truncate_retry(evutil_socket_t fd, short what, void *arg) {
        struct job *j = arg;
        struct api_error e = { 0 };
        (void) fd, (void) what;
        if (j->req) {
                struct api_request ar;
                struct api_config ac = { .model_id = br.served_model, .aliases = br.cfg.aliases,
                                         .n_aliases = br.cfg.n_aliases, .key = j->key, .drop_units = j->drop };
                if (api_parse_request(j->kind, j->body, j->body_len, &ac, &ar, &e) == 0) {
                        const char *why;
                        json_decref(j->conv);
                        j->conv = TAKE_PTR(ar.conv); /* what is stored is what the model saw */
                        int r = job_submit(j, &ar, &why);
                        api_request_done(&ar);
                        if (r >= 0) {
                                j->be->inflight++;
                                return;
                        }
                        api_error_from_x4(&e, j->kind, r, why);
                }
                job_answer_error(j, &e);
                job_release_http(j);
        }
        job_unlink(j);
        job_free(j);
        maybe_exit_drained();
}

static void on_done(const struct x4_done *done, void *arg) {
        struct job *j = arg;
        if (j->submitting) {
                /* the connection broke while sending: the submitter answers */
                j->done_early = true;
                j->early = *done;
                return;
        }
        struct x4_done dd = *done;
        const struct x4_done *d = &dd;
        if (j->cut && dd.status == X4_OK)
                dd.finish_reason = X4_FINISH_TOOL_CALLS; /* ended by its one call (on_chunk) */
        else if (j->no_calls && dd.finish_reason == X4_FINISH_TOOL_CALLS)
                dd.finish_reason = X4_FINISH_STOP; /* its calls were answered as text */
        if (truncate_retry(j, d))
                return;
        if (d->status == X4_OK && j->kind != API_COUNT_TOKENS) /* a count computes nothing */
                metrics_add_tokens(d->prompt_tokens, d->completion_tokens, d->cached_tokens);
        if (d->finish_reason == X4_FINISH_CANCELLED)
                metrics_count_cancelled();
        if (j->req) {
                job_answer(j, d);
                job_release_http(j);
        }
        j->be->inflight--;
        job_unlink(j);
        job_free(j);
        maybe_exit_drained();
}

/* PREFIX-<32 hex digits> from getrandom(): 128 bits a client cannot guess from its own ids. */
static int make_request_id(char *buf, size_t size, const char *prefix) {
        uint8_t rnd[16];
        size_t got = 0;
        while (got < sizeof rnd) {
                ssize_t n = getrandom(rnd + got, sizeof rnd - got, 0);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return n < 0 ? -errno : -EIO; /* the caller says so */
                got += (size_t) n;
        }
        int k = snprintf(buf, size, "%s", prefix);
        for (size_t i = 0; i < sizeof rnd && k > 0 && (size_t) k + 2 < size; i++)
                k += snprintf(buf + k, size - (size_t) k, "%02x", rnd[i]);
        return 0;
}

static void handle_generate(struct evhttp_request *req, enum api_kind kind, int key, const char *endpoint) {
        struct api_error e = { 0 };
        struct evbuffer *in = evhttp_request_get_input_buffer(req);
        size_t len = evbuffer_get_length(in);
        if (len > br.cfg.max_body) {
                api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "request body of %zu bytes exceeds this server's limit of %zu bytes (max-body-bytes)",
                         len, br.cfg.max_body);
                return send_error(req, &e, endpoint);
        }
        if (br.draining) {
                api_fail(&e, 503, "server_error", "shutting_down",
                         NULL, "xing4-http is shutting down; retry against another instance");
                e.retry_after = br.cfg.retry_after_s;
                return send_error(req, &e, endpoint);
        }
        if (br.n_jobs >= br.cfg.max_concurrent) {
                api_fail(&e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                         "%u requests are in flight, the limit of this server (max-concurrent); retry later",
                         br.n_jobs);
                e.retry_after = br.cfg.retry_after_s;
                return send_error(req, &e, endpoint);
        }
        const char *body = (const char *) evbuffer_pullup(in, -1);
        struct api_request ar;
        struct api_config ac = { .model_id = br.served_model, .aliases = br.cfg.aliases, .n_aliases = br.cfg.n_aliases,
                                 .key = key };
        if (api_parse_request(kind, body ? body : "", len, &ac, &ar, &e) < 0)
                return send_error(req, &e, endpoint);

        struct job *j = calloc(1, sizeof *j);
        if (!j) {
                api_request_done(&ar);
                api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
                return send_error(req, &e, endpoint);
        }
        static const char *const prefixes[] = { [API_CHAT] = "chatcmpl-", [API_COMPLETION] = "cmpl-",
                                                [API_MESSAGES] = "msg_", [API_COUNT_TOKENS] = "count_",
                                                [API_RESPONSES] = "resp_" };
        int rid = make_request_id(j->idstr, sizeof j->idstr, prefixes[kind]);
        if (rid < 0) {
                api_request_done(&ar);
                free(j);
                api_fail(&e, 500, "server_error", "internal_error", NULL,
                         "cannot draw a random request id: getrandom: %s", strerror(-rid));
                return send_error(req, &e, endpoint);
        }
        j->key = key;
        j->endpoint = endpoint;
        j->kind = kind;
        j->stream = ar.stream;
        j->include_usage = ar.include_usage;
        j->top_logprobs = ar.top_logprobs;
        j->logprobs = ar.logprobs;
        /* chat: logprobs asked for are a list, empty when no answer token came (all reasoning) */
        if (kind == API_CHAT && ar.logprobs && !j->res.logprobs)
                j->res.logprobs = json_array();
        j->created = time(NULL);
        j->t_start = now_s();
        snprintf(j->model, sizeof j->model, "%s", ar.model ? ar.model : br.served_model);
        j->echo = TAKE_PTR(ar.echo);
        j->conv = TAKE_PTR(ar.conv);
        j->input = TAKE_PTR(ar.input);
        j->store = ar.store;
        ev_stream_init(&j->ev, kind, j->idstr, j->model, j->created, j->echo, &j->res);
        j->ev.reasoning_out = ar.reasoning_out;

        j->one_call = ar.one_call;
        j->no_calls = ar.no_calls;
        if (ar.truncate && kind == API_RESPONSES) {
                if (!(j->body = malloc(len + 1))) {
                        api_request_done(&ar);
                        job_free(j);
                        api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
                        return send_error(req, &e, endpoint);
                }
                memcpy(j->body, body ? body : "", len);
                j->body_len = len;
        }

        const char *why;
        int r = job_submit(j, &ar, &why);
        api_request_done(&ar);
        if (r < 0) {
                api_error_from_x4(&e, kind, r, why);
                job_free(j);
                return send_error(req, &e, endpoint);
        }
        if (j->stream && !j->done_early && (j->tick = evtimer_new(br.base, on_stream_tick, j))) {
                struct timeval tv = { br.cfg.sse_keepalive_s, 0 };
                evtimer_add(j->tick, &tv);
        }
        j->be->inflight++;
        j->req = req;
        /* the SDKs show it as the request id (Anthropic's request-id, OpenAI's x-request-id): the
         * id DELETE /v1/requests/ID cancels */
        evhttp_add_header(evhttp_request_get_output_headers(req),
                          kind == API_MESSAGES || kind == API_COUNT_TOKENS ? "request-id" : "x-request-id",
                          j->idstr);
        j->conn = evhttp_request_get_connection(req);
        evhttp_connection_set_closecb(j->conn, on_client_close, j);
        evhttp_request_set_on_complete_cb(req, on_reply_sent, NULL);
        br.replies_unsent++;
        job_watch(j);
        j->next = br.jobs;
        if (br.jobs)
                br.jobs->prev = j;
        br.jobs = j;
        br.n_jobs++;
}

/* Equal strings, in time that depends on their lengths only (not on where they first differ). */
static bool secret_equal(const char *a, const char *b) {
        size_t n = strlen(a), m = strlen(b);
        unsigned char diff = n != m;
        for (size_t i = 0; i < n; i++)
                diff |= (unsigned char) a[i] ^ (unsigned char) (i < m ? b[i] : 0);
        return diff == 0;
}

/* DELETE /v1/requests/{id}: id is exactly the "id" this bridge answered the generation with. With
 * API keys configured only the key that started it may cancel it; to any other the generation
 * does not exist (404), so ids cannot be probed with a second key either. */
static void handle_cancel(struct evhttp_request *req, const char *id, int key) {
        struct api_error e;
        for (struct job *j = br.jobs; j; j = j->next) {
                if (!secret_equal(j->idstr, id) || j->key != key)
                        continue;
                char idcopy[48];
                snprintf(idcopy, sizeof idcopy, "%s", j->idstr);
                log_info("%s: cancelled by DELETE", idcopy);
                if (j->be->c)
                        (void) x4_client_cancel(j->be->c, j->rid); /* may free j */
                send_json(req, 200, json_pack("{s:s, s:s, s:b}", "id", idcopy, "object", "request.cancel", "cancelled",
                                              1), "cancel");
                return;
        }
        api_fail(&e, 404, "invalid_request_error", "not_found", "id",
                 "request \"%.200s\" is not in flight on this server%s", id,
                 br.n_api_keys > 1 ? " under this API key" : "");
        send_error(req, &e, "cancel");
}

/* One model in both APIs' shapes: OpenAI's (id, object, created, owned_by) and Anthropic's (type,
 * display_name, created_at in RFC 3339), so either SDK's models.list/retrieve reads it. */
static json_t *model_object(const char *id) {
        char when[32] = "1970-01-01T00:00:00Z";
        struct tm tm;
        time_t t = br.started_unix;
        if (gmtime_r(&t, &tm))
                strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        return json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:s}", "id", id, "object", "model", "created",
                         (json_int_t) br.started_unix, "owned_by", "xing4d", "type", "model", "display_name", id,
                         "created_at", when);
}

/* GET /v1/responses/ID: the stored response (store: true, the default, kept --response-retention
 * seconds); DELETE: drop it. Only the API key that made it sees it. */
static void handle_stored_response(struct evhttp_request *req, enum evhttp_cmd_type m, const char *id, int key) {
        struct api_error e;
        if (m == EVHTTP_REQ_DELETE) {
                if (rs_store_delete(id, key))
                        return send_json(req, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response",
                                                             "deleted", 1), "response");
        } else {
                json_t *r = rs_store_response(id, key);
                if (r)
                        return send_json(req, 200, json_incref(r), "response");
        }
        api_fail(&e, 404, "invalid_request_error", "not_found", NULL,
                 "response %s: not found (not stored: store false, expired after --response-retention, "
                 "deleted, or made with another API key)", id);
        send_error(req, &e, "response");
}

/* GET /v1/responses/ID/input_items: the stored response's input items (as sent, with ids), a list
 * page as OpenAI's: ?order=desc (the default, newest first) or asc, ?limit=1..100 (20), ?after=ITEM
 * (the items past that one). */
static void handle_input_items(struct evhttp_request *req, const char *id, int key) {
        struct api_error e;
        json_t *items = rs_store_input(id, key);
        if (!items) {
                api_fail(&e, 404, "invalid_request_error", "not_found", NULL,
                         "response %s: not found (not stored: store false, expired after --response-retention, "
                         "deleted, or made with another API key)", id);
                return send_error(req, &e, "response");
        }
        struct evkeyvalq q = { 0 }; /* empty; evhttp_parse_query_str() sets it up */
        const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
        if (query && evhttp_parse_query_str(query, &q) < 0) {
                api_fail(&e, 400, "invalid_request_error", "invalid_value", NULL, "the query string does not parse");
                return send_error(req, &e, "response");
        }
        const char *order = evhttp_find_header(&q, "order"), *limit_s = evhttp_find_header(&q, "limit");
        const char *after = evhttp_find_header(&q, "after");
        char *end = NULL;
        long limit = limit_s ? strtol(limit_s, &end, 10) : 20;
        if (order && !streq(order, "asc") && !streq(order, "desc"))
                api_fail(&e, 400, "invalid_request_error", "invalid_value", "order",
                         "order: \"asc\" or \"desc\" expected, got \"%.40s\"", order);
        else if (limit_s && (!*limit_s || *end || limit < 1 || limit > 100))
                api_fail(&e, 400, "invalid_request_error", "invalid_value", "limit",
                         "limit: an integer from 1 to 100 expected, got \"%.40s\"", limit_s);
        else
                e.status = 0;
        if (e.status) {
                evhttp_clear_headers(&q);
                return send_error(req, &e, "response");
        }
        bool asc = order && streq(order, "asc");
        size_t n = json_array_size(items), start = 0;
        json_t *data = json_array();
        /* position k of the page order is item asc ? k : n - 1 - k */
        for (size_t k = 0; after && k < n; k++) {
                const char *iid = json_string_value(json_object_get(json_array_get(items, asc ? k : n - 1 - k), "id"));
                if (iid && streq(iid, after)) {
                        start = k + 1;
                        break;
                }
        }
        for (size_t k = start; k < n && json_array_size(data) < (size_t) limit; k++)
                json_array_append(data, json_array_get(items, asc ? k : n - 1 - k));
        size_t got = json_array_size(data);
        json_t *first = got ? json_object_get(json_array_get(data, 0), "id") : NULL;
        json_t *last = got ? json_object_get(json_array_get(data, got - 1), "id") : NULL;
        evhttp_clear_headers(&q);
        send_json(req, 200,
                  json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", data, "first_id", first, "last_id",
                            last, "has_more", start + got < n),
                  "response");
}

static void handle_models(struct evhttp_request *req) {
        json_t *m = model_object(br.served_model);
        /* what the daemons actually load (general.name and fingerprint), for humans */
        for (size_t i = 0; i < br.n_backends; i++)
                if (br.backends[i].model_name[0]) {
                        json_object_set_new(m, "xing4d_model", json_string(br.backends[i].model_name));
                        json_object_set_new(m, "xing4d_fingerprint", json_string(br.backends[i].fingerprint));
                        break;
                }
        /* has_more/first_id/last_id: Anthropic's list page (its SDK pages on them) */
        send_json(req, 200,
                  json_pack("{s:s, s:[o], s:b, s:s, s:s}", "object", "list", "data", m, "has_more", 0, "first_id",
                            br.served_model, "last_id", br.served_model),
                  "models");
}

/* 200 when at least one daemon serves; 503 (with Retry-After) while they load or are unreachable. */
static void handle_health(struct evhttp_request *req, bool ready) {
        json_t *list = json_array();
        unsigned serving = 0, loading = 0;
        for (size_t i = 0; i < br.n_backends; i++) {
                struct backend *be = &br.backends[i];
                const char *state = "unreachable";
                char detail[256] = "";
                int st = 0;
                if (backend_ensure(be) == 0 && x4_client_health(be->c, &st, detail, sizeof detail) == 0) {
                        state = st == X4_HEALTH_SERVING ? "serving" : st == X4_HEALTH_LOADING ? "loading"
                                : st == X4_HEALTH_DRAINING ? "draining" : "unknown";
                        serving += st == X4_HEALTH_SERVING;
                        loading += st == X4_HEALTH_LOADING;
                } else
                        snprintf(detail, sizeof detail, "%s", be->last_error);
                json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:I}", "socket", be->path, "state", state,
                                                      "detail", detail, "in_flight", (json_int_t) be->inflight));
        }
        bool ok = serving > 0 && !br.draining && (!ready || br.n_jobs < br.cfg.max_concurrent);
        const char *status = ok ? "ok" : br.draining ? "draining" : serving ? "busy" : loading ? "loading" : "unavailable";
        if (!ok)
                evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        send_json(req, ok ? 200 : 503, json_pack("{s:s, s:o}", "status", status, "daemons", list),
                  ready ? "ready" : "health");
}

static void handle_metrics(struct evhttp_request *req) {
        struct evbuffer *b = evhttp_request_get_output_buffer(req);
        metrics_render(b);
        evbuffer_add_printf(b, "# HELP xing4_http_requests_in_flight Generations in flight through the bridge.\n"
                               "# TYPE xing4_http_requests_in_flight gauge\nxing4_http_requests_in_flight %u\n",
                            br.n_jobs);
        static const char *const names[] = { "xing4_daemon_up", "xing4_daemon_queue_depth",
                                             "xing4_daemon_requests_running", "xing4_daemon_prefix_hits_total",
                                             "xing4_daemon_prefix_tokens_reused_total",
                                             "xing4_daemon_mtp_drafted_tokens_total",
                                             "xing4_daemon_mtp_accepted_tokens_total" };
        static const char *const helps[] = { "1 if the daemon answered its stats on this scrape.",
                                             "Requests waiting for admission in the daemon.",
                                             "Requests running in the daemon.",
                                             "Prompts that reused the daemon's prefix cache.",
                                             "Prompt tokens taken from the daemon's prefix cache.",
                                             "MTP draft tokens the daemon verified (--mtp on).",
                                             "MTP draft tokens the daemon accepted." };
        static const char *const types[] = { "gauge", "gauge", "gauge", "counter", "counter", "counter",
                                             "counter" };
        struct x4_stats st[MAX_SOCKETS];
        bool up[MAX_SOCKETS];
        for (size_t i = 0; i < br.n_backends; i++)
                up[i] = backend_ensure(&br.backends[i]) == 0 && x4_client_stats(br.backends[i].c, &st[i]) == 0;
        for (size_t k = 0; k < ELEMENTSOF(names); k++) {
                evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", names[k], helps[k], names[k], types[k]);
                for (size_t i = 0; i < br.n_backends; i++) {
                        uint64_t v = k == 0 ? up[i] : !up[i] ? 0 : k == 1 ? st[i].requests_waiting
                                : k == 2 ? st[i].requests_running : k == 3 ? st[i].prefix_hits
                                : k == 4 ? st[i].prefix_tokens_reused : k == 5 ? st[i].mtp_drafted_tokens
                                : st[i].mtp_accepted_tokens;
                        if (k > 0 && !up[i])
                                continue;
                        evbuffer_add_printf(b, "%s{socket=\"", names[k]);
                        metrics_label_escape(b, br.backends[i].path);
                        evbuffer_add_printf(b, "\"} %llu\n", (unsigned long long) v);
                }
        }
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                          "text/plain; version=0.0.4; charset=utf-8");
        head_strip(req);
        evhttp_send_reply(req, 200, "OK", NULL);
        metrics_count_request("metrics", 200);
}

/* The index in api_keys of the key the request carries ("Authorization: Bearer KEY", or Anthropic's
 * "x-api-key: KEY"); 0 when no keys are configured, -1 when the key is missing or wrong. Every key
 * is compared, so the time does not say which one matched. */
static int key_index(const char *key) {
        int found = -1;
        for (size_t i = 0; key && i < br.n_api_keys; i++)
                if (secret_equal(br.api_keys[i], key))
                        found = (int) i;
        return found;
}

/* The index of the API key the request carries, in "Authorization: Bearer KEY" or "x-api-key:
 * KEY" (either may hold it: the Anthropic SDK sends both when both of its variables are set), -1
 * when neither does; 0 when no keys are configured. */
static int authorized(struct evhttp_request *req) {
        if (br.n_api_keys == 0)
                return 0;
        const struct evkeyvalq *in = evhttp_request_get_input_headers(req);
        const char *h = evhttp_find_header(in, "Authorization");
        int found = -1;
        if (h && strncasecmp(h, "Bearer ", 7) == 0) {
                const char *key = h + 7;
                while (*key == ' ') /* RFC 9110: one or more spaces after the scheme */
                        key++;
                found = key_index(key);
        }
        if (found < 0)
                found = key_index(evhttp_find_header(in, "x-api-key"));
        return found;
}

static bool origin_allowed(const char *origin) {
        for (size_t i = 0; i < br.cfg.n_cors; i++)
                if (streq(br.cfg.cors_origins[i], "*") || strcasecmp(br.cfg.cors_origins[i], origin) == 0)
                        return true;
        return false;
}

/* Browsers send Origin with every cross-origin request (and with POSTs): a web page the user
 * visits must not drive generations on their machine, so only the configured origins are served,
 * and their preflight (OPTIONS) is answered. Returns true when the request was answered here. */
static bool cors(struct evhttp_request *req, enum evhttp_cmd_type m) {
        struct evkeyvalq *in = evhttp_request_get_input_headers(req);
        struct evkeyvalq *out = evhttp_request_get_output_headers(req);
        const char *origin = evhttp_find_header(in, "Origin");
        struct api_error e;
        if (!origin) {
                if (m != EVHTTP_REQ_OPTIONS)
                        return false;
                evhttp_add_header(out, "Allow", "GET, POST, DELETE, OPTIONS");
                evhttp_send_reply(req, 204, "No Content", NULL);
                metrics_count_request("other", 204);
                return true;
        }
        if (!origin_allowed(origin)) {
                api_fail(&e, 403, "permission_error", "origin_not_allowed", NULL,
                         "cross-origin request from Origin \"%.200s\" refused: add it to this server's cors-origin "
                         "setting to let that site's pages use the API", origin);
                send_error(req, &e, "other");
                return true;
        }
        evhttp_add_header(out, "Access-Control-Allow-Origin", origin);
        evhttp_add_header(out, "Vary", "Origin");
        if (m != EVHTTP_REQ_OPTIONS)
                return false;
        const char *want = evhttp_find_header(in, "Access-Control-Request-Headers");
        evhttp_add_header(out, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        evhttp_add_header(out, "Access-Control-Allow-Headers",
                          want && strlen(want) < 1024 && !strpbrk(want, "\r\n") ? want
                                  : "authorization, content-type, x-api-key, anthropic-version, anthropic-beta");
        evhttp_add_header(out, "Access-Control-Max-Age", "600");
        evhttp_send_reply(req, 204, "No Content", NULL);
        metrics_count_request("other", 204);
        return true;
}

/* POST bodies must say they are JSON: a form or text/plain post is what a web page can send
 * cross-origin without a preflight. */
static bool json_content_type(struct evhttp_request *req) {
        const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
        if (!ct)
                return false;
        while (*ct == ' ')
                ct++;
        size_t n = strcspn(ct, "; ");
        return n == 16 && strncasecmp(ct, "application/json", 16) == 0;
}

static void handle_model(struct evhttp_request *req, const char *id) {
        struct api_error e;
        bool known = streq(id, br.served_model);
        for (size_t i = 0; !known && i < br.cfg.n_aliases; i++)
                known = fnmatch(br.cfg.aliases[i], id, 0) == 0;
        if (!known) {
                api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                         "The model \"%.200s\" does not exist; this server serves \"%s\" (GET /v1/models)", id,
                         br.served_model);
                return send_error(req, &e, "models");
        }
        send_json(req, 200, model_object(id), "models");
}

static void route(struct evhttp_request *req, void *arg) {
        char pathbuf[2048];
        const char *path = request_path(req, pathbuf, sizeof pathbuf);
        enum evhttp_cmd_type m = evhttp_request_get_command(req);
        struct api_error e;
        /* a base URL written with a trailing slash ("http://host:8000/v1/") joined by a client that
         * adds its own gives "/v1//chat/completions"; and "/v1/models/" is the same resource: repeated
         * slashes are collapsed and a trailing one dropped */
        char norm[1024];
        if (strstr(path, "//") || (path[0] && path[1] && path[strlen(path) - 1] == '/')) {
                size_t n = 0;
                for (const char *p = path; *p && n < sizeof norm - 1; p++)
                        if (!(*p == '/' && n > 0 && norm[n - 1] == '/'))
                                norm[n++] = *p;
                while (n > 1 && norm[n - 1] == '/')
                        n--;
                norm[n] = 0;
                path = norm;
        }
        /* RFC 9112 6.3: Content-Length headers that disagree make the message's length unknowable
         * (libevent reads the first one): a request smuggled behind it must not be served */
        const char *clen = NULL;
        for (struct evkeyval *h = evhttp_request_get_input_headers(req)->tqh_first; h; h = h->next.tqe_next) {
                if (strcasecmp(h->key, "Content-Length") != 0)
                        continue;
                if (clen && !streq(clen, h->value)) {
                        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
                        api_fail(&e, 400, "invalid_request_error", "invalid_request", NULL,
                                 "Content-Length headers disagree (\"%.20s\" and \"%.20s\"): send one", clen,
                                 h->value);
                        return send_error(req, &e, "other");
                }
                clen = h->value;
        }
        if (cors(req, m))
                return;
        /* HEAD is GET without the body (head_strip leaves it out): load balancers and uptime checks
         * probe with it, and RFC 9110 asks every GET resource to answer it */
        if (streq(path, "/health") || streq(path, "/ready") || streq(path, "/metrics")) {
                if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD) {
                        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
                        api_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s: only GET", path);
                        return send_error(req, &e, "other");
                }
                if (streq(path, "/metrics"))
                        return handle_metrics(req);
                return handle_health(req, streq(path, "/ready"));
        }
        int key = authorized(req);
        if (key < 0) {
                evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
                api_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                         "missing or wrong API key: send \"Authorization: Bearer KEY\" (or \"x-api-key: KEY\") "
                         "with a key in this server's api-key-file");
                return send_error(req, &e, "unauthorized");
        }
        const char *endpoint = NULL;
        enum api_kind kind = API_CHAT;
        enum evhttp_cmd_type want = EVHTTP_REQ_POST;
        if (streq(path, "/v1/chat/completions"))
                endpoint = "chat", kind = API_CHAT;
        else if (streq(path, "/v1/completions"))
                endpoint = "completions", kind = API_COMPLETION;
        else if (streq(path, "/v1/messages"))
                endpoint = "messages", kind = API_MESSAGES;
        else if (streq(path, "/v1/messages/count_tokens"))
                endpoint = "count_tokens", kind = API_COUNT_TOKENS;
        else if (streq(path, "/v1/responses"))
                endpoint = "responses", kind = API_RESPONSES;
        else if (streq(path, "/v1/embeddings"))
                endpoint = "embeddings";
        else if (streq(path, "/v1/models") || (strncmp(path, "/v1/models/", 11) == 0 && path[11]))
                endpoint = "models", want = EVHTTP_REQ_GET;
        else if (strncmp(path, "/v1/requests/", 13) == 0 && path[13])
                endpoint = "cancel", want = EVHTTP_REQ_DELETE;
        else if (strncmp(path, "/v1/responses/", 14) == 0 && path[14] && !strchr(path + 14, '/'))
                endpoint = "response", want = m == EVHTTP_REQ_DELETE ? EVHTTP_REQ_DELETE : EVHTTP_REQ_GET;
        else if (strncmp(path, "/v1/responses/", 14) == 0 && path[14] != '/' && strchr(path + 14, '/') &&
                 streq(strchr(path + 14, '/'), "/input_items"))
                endpoint = "input_items", want = EVHTTP_REQ_GET;
        if (!endpoint) {
                api_fail(&e, 404, "invalid_request_error", "unknown_url", NULL, "Unknown request URL: %s %s",
                         m == EVHTTP_REQ_GET ? "GET" : m == EVHTTP_REQ_POST ? "POST" : m == EVHTTP_REQ_DELETE ? "DELETE"
                         : m == EVHTTP_REQ_HEAD ? "HEAD" : m == EVHTTP_REQ_PUT ? "PUT" : "OPTIONS",
                         path);
                return send_error(req, &e, "other");
        }
        if (m != want && !(m == EVHTTP_REQ_HEAD && want == EVHTTP_REQ_GET)) {
                evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
                                  want == EVHTTP_REQ_GET ? "GET, HEAD" : want == EVHTTP_REQ_POST ? "POST" : "DELETE");
                api_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s: only %s", path,
                         want == EVHTTP_REQ_GET ? "GET" : want == EVHTTP_REQ_POST ? "POST" : "DELETE");
                return send_error(req, &e, endpoint);
        }
        if (m == EVHTTP_REQ_POST && !json_content_type(req)) {
                const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
                api_fail(&e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                         "Content-Type %s%.100s%s is not accepted: send the body as JSON with \"Content-Type: "
                         "application/json\"", ct ? "\"" : "", ct ? ct : "missing", ct ? "\"" : "");
                return send_error(req, &e, endpoint);
        }
        if (streq(endpoint, "embeddings")) {
                api_fail(&e, 400, "invalid_request_error", "embeddings_unsupported", "model",
                         "/v1/embeddings: xing4d's model has no embedding output; this server generates text only "
                         "(chat/completions, completions, responses, messages)");
                return send_error(req, &e, endpoint);
        }
        if (streq(endpoint, "models"))
                return path[10] == '/' ? handle_model(req, path + 11) : handle_models(req);
        if (streq(endpoint, "cancel"))
                return handle_cancel(req, path + 13, key);
        if (streq(endpoint, "response"))
                return handle_stored_response(req, m, path + 14, key);
        if (streq(endpoint, "input_items")) {
                char id[128];
                snprintf(id, sizeof id, "%.*s", (int) (strchr(path + 14, '/') - (path + 14)), path + 14);
                return handle_input_items(req, id, key);
        }
        handle_generate(req, kind, key, endpoint);
}

/* libevent refuses some requests before route() sees them -- a body over the hard cap (a larger
 * Content-Length is refused before a byte of it is read), a malformed request line or header --
 * and answers them with evhttp_send_error(), an HTML page. This definition takes the library's
 * place (libevent calls it through its PLT, so the executable's symbol is the one bound) and
 * answers in JSON instead. The path is unknown by then (libevent has dropped the URI), so the
 * error carries both APIs' fields: OpenAI's SDK reads error.message/type/code, Anthropic's
 * type = "error" and error.type/message. Nothing else in this program calls it. */
__attribute__((visibility("default"))) void evhttp_send_error(struct evhttp_request *req, int error,
                                                        const char *reason) {
        char msg[256];
        const char *code = "invalid_request", *type = "invalid_request_error";
        if (error == 413) {
                snprintf(msg, sizeof msg, "request body exceeds this server's limit of %zu bytes (max-body-bytes)",
                         br.cfg.max_body);
                code = "request_too_large";
                type = "request_too_large";
        } else if (error == 400)
                snprintf(msg, sizeof msg, "malformed HTTP request (request line, headers or chunked body)");
        else
                snprintf(msg, sizeof msg, "%s", reason ? reason : "HTTP error");
        struct evbuffer *b = evbuffer_new();
        json_t *j = json_pack("{s:s, s:{s:s, s:s, s:n, s:s}}", "type", "error", "error", "message", msg, "type", type,
                              "param", "code", code);
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (b && s) {
                evbuffer_add(b, s, strlen(s));
                evbuffer_add(b, "\n", 1);
        }
        free(s);
        struct evkeyvalq *out = evhttp_request_get_output_headers(req);
        evhttp_add_header(out, "Connection", "close");
        evhttp_add_header(out, "Content-Type", "application/json");
        /* a request line that did not parse leaves the version 0.0, which libevent would echo in the
         * status line ("HTTP/0.0 400"): answer in the version this server speaks */
        if (req->major != 1 || req->minor > 1) {
                req->major = 1;
                req->minor = 1;
        }
        evhttp_send_reply(req, error, error == 413 ? "Payload Too Large" : reason ? reason : "Bad Request", b);
        if (b)
                evbuffer_free(b);
        metrics_count_request("other", error);
}

/* ---- main ---------------------------------------------------------------------------------------- */

/* accept() failed (EMFILE at the descriptor limit, ENFILE, ENOBUFS): the listening socket stays
 * readable, so libevent would call accept() again at once, spinning the loop and logging each
 * failure. As xing4d (daemon/server.c:accept_error_cb) and nginx do: stop accepting for a while
 * (pending clients wait in the backlog; connections that close meanwhile free descriptors), and
 * say so at most once a minute with the count of failures since. */
#define ACCEPT_PAUSE_MS 500
#define ACCEPT_WARN_MS 60000
#define SHED_MAX 256 /* connections shed at one failure at most */

/* At the descriptor limit the clients waiting in the backlog would wait there unanswered (a
 * health check too, whose connect succeeds and whose request then hangs): give up the spare
 * descriptor, accept them one at a time and answer each a 503 with Retry-After (the OpenAI error
 * shape, "Connection: close"), then take the spare again. Their requests, if already sent, are
 * read and dropped first so the close is not a reset that could discard the answer. */
static void shed_pending(evutil_socket_t lfd) {
        static const char body[] = "{\"error\":{\"message\":\"xing4-http is at its limit of open connections "
                                   "(descriptors); retry later\",\"type\":\"server_error\",\"param\":null,"
                                   "\"code\":\"too_many_connections\"}}\n";
        char reply[512];
        int n = snprintf(reply, sizeof reply,
                         "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: %d\r\n"
                         "Connection: close\r\nContent-Length: %zu\r\n\r\n%s",
                         br.cfg.retry_after_s, sizeof body - 1, body);
        if (br.spare_fd < 0)
                return;
        close(br.spare_fd);
        br.spare_fd = -1;
        for (int i = 0; i < SHED_MAX; i++) {
                int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0)
                        break;
                char drain[4096];
                (void) recv(fd, drain, sizeof drain, MSG_DONTWAIT);
                (void) send(fd, reply, (size_t) n, MSG_NOSIGNAL | MSG_DONTWAIT);
                (void) shutdown(fd, SHUT_WR);
                close(fd);
                br.accept_shed++;
        }
        br.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void on_accept_error(struct evconnlistener *l, void *arg) {
        int err = EVUTIL_SOCKET_ERROR();
        (void) arg;
        br.accept_failures++;
        if (err == EMFILE || err == ENFILE)
                shed_pending(evconnlistener_get_fd(l));
        if (!br.accept_warned_ms || now_ms() - br.accept_warned_ms >= ACCEPT_WARN_MS) {
                struct rlimit rl;
                char limit[32] = "?";
                if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
                        snprintf(limit, sizeof limit, "%llu", (unsigned long long) rl.rlim_cur);
                log_warning("accept() failed: %s (descriptor limit %s, %u generations in flight, %u failures); "
                            "answering waiting clients 503 (%u so far) and not accepting connections for %d ms at "
                            "a time until it succeeds", strerror(err), limit, br.n_jobs, br.accept_failures,
                            br.accept_shed, ACCEPT_PAUSE_MS);
                br.accept_warned_ms = now_ms();
                br.accept_failures = 0;
                br.accept_shed = 0;
        }
        struct timeval tv = { 0, ACCEPT_PAUSE_MS * 1000 };
        if (br.accept_resume && evconnlistener_disable(l) == 0)
                evtimer_add(br.accept_resume, &tv);
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg) {
        (void) fd, (void) what, (void) arg;
        if (br.listener)
                (void) evconnlistener_enable(br.listener);
}

/* The drain window is over: the generations still in flight end with the error of a shutdown (an
 * error event, then the end of the chunked body, for a stream; a 503 otherwise) rather than being
 * cut mid-transfer, and are cancelled in the daemon; the loop ends once those answers are out. */
static void on_drain_over(evutil_socket_t fd, short what, void *arg) {
        struct job *next;
        (void) fd, (void) what, (void) arg;
        log_warning("shutdown: the drain window of %d s is over; ending %u generation%s in flight with a "
                    "shutdown error", br.cfg.drain_timeout_s, br.n_jobs, br.n_jobs == 1 ? "" : "s");
        for (struct job *j = br.jobs; j; j = next) {
                next = j->next;
                if (j->req) {
                        struct api_error e;
                        shutdown_error(&e, j, "xing4-http", j->tokens);
                        log_info("%s: shutdown: answered with an error after %u tokens", j->idstr, j->tokens);
                        job_answer_error(j, &e);
                        job_release_http(j);
                }
                if (j->be->c)
                        (void) x4_client_cancel(j->be->c, j->rid); /* may free j */
        }
        /* the answers are written out before maybe_exit_drained() ends the loop; a client that
         * does not read them gets a few seconds */
        struct timeval last = { 5, 0 };
        event_base_loopexit(br.base, &last);
        maybe_exit_drained();
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
        if (br.draining || (br.n_jobs == 0 && br.replies_unsent == 0)) {
                log_info("signal %d: stopping", (int) sig);
                event_base_loopexit(br.base, NULL);
                return;
        }
        /* let the generations in flight finish (a second signal stops at once) */
        br.draining = true;
        log_info("signal %d: draining %u request%s (at most %d s)", (int) sig, br.n_jobs, br.n_jobs == 1 ? "" : "s",
                 br.cfg.drain_timeout_s);
        struct timeval grace = { br.cfg.drain_timeout_s, 0 };
        if (event_base_once(br.base, -1, EV_TIMEOUT, on_drain_over, NULL, &grace) < 0)
                event_base_loopexit(br.base, &grace);
}

/* SIGHUP ("reload", or the terminal closed) would kill the bridge mid-stream by default; nothing is
 * re-read while serving, so it is logged and ignored (SIGTERM stops the bridge). */
static void on_hup(evutil_socket_t sig, short what, void *arg) {
        log_info("SIGHUP ignored: the settings and API keys are read at start; restart xing4-http to apply "
                 "changes (SIGTERM stops it)");
}

/* One key per line; blank lines and # comments are skipped. */
static int read_api_keys(const char *path) {
        _cleanup_fclose_ FILE *f = fopen(path, "re");
        char line[512];
        unsigned lineno = 0;
        if (!f)
                return log_error_errno(errno, "%s: cannot read the API key file: %m", path);
        while (fgets(line, sizeof line, f)) {
                lineno++;
                if (line_cut(f, line))
                        return log_error_errno(E2BIG, "%s:%u: API key longer than %zu bytes", path, lineno,
                                               sizeof line - 1);
                char *k = strip(line);
                if (!*k || *k == '#')
                        continue;
                if (br.n_api_keys >= MAX_API_KEYS)
                        return log_error_errno(E2BIG, "%s:%u: at most %d API keys", path, lineno, MAX_API_KEYS);
                if (!(br.api_keys[br.n_api_keys++] = strdup(k)))
                        return log_error_errno(ENOMEM, "%s: out of memory", path);
        }
        if (br.n_api_keys == 0)
                return log_error_errno(EINVAL, "%s: the API key file is empty", path);
        return 0;
}

static void usage(void) {
        printf("Usage: xing4-http [OPTIONS]\n"
               "OpenAI-compatible HTTP API for xing4d.\n\n"
               "  --config PATH         INI file (default " DEFAULT_CONFIG ", if present)\n"
               "  --listen HOST:PORT    address to serve (default 127.0.0.1:8000; port 0 = any free)\n"
               "  --socket PATH         xing4d socket; repeat for several daemons (default $X4_SOCKET or "
               X4_DEFAULT_SOCKET ")\n"
               "  --api-key-file PATH   require \"Authorization: Bearer KEY\" with a key in PATH (one per line)\n"
               "  --model-name NAME     model id to list and accept (default xing4)\n"
               "  --max-body-bytes N    largest request body (default 4194304)\n"
               "  --max-concurrent N    generations in flight before 429 (default 64)\n"
               "  --timeout S           read/write inactivity timeout of HTTP connections (default 60)\n"
               "  --connect-timeout-ms N  daemon connect + handshake limit (default 3000)\n"
               "  --cors-origin ORIGIN  serve browser requests from this origin (repeatable; default none)\n"
               "  --model-alias GLOB    other model names served by the model (repeatable; default claude-*;\n"
               "                        \"none\" for none)\n"
               "  --response-store N    /v1/responses kept for previous_response_id (default 256, 0 = off)\n"
               "  --response-retention S  seconds a stored response is kept (default 3600)\n"
               "  --version, --help\n");
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "config", required_argument, NULL, 'c' },
                { "listen", required_argument, NULL, 'l' },
                { "socket", required_argument, NULL, 's' },
                { "api-key-file", required_argument, NULL, 'k' },
                { "model-name", required_argument, NULL, 'm' },
                { "max-body-bytes", required_argument, NULL, 'b' },
                { "max-concurrent", required_argument, NULL, 'n' },
                { "timeout", required_argument, NULL, 't' },
                { "connect-timeout-ms", required_argument, NULL, 'T' },
                { "cors-origin", required_argument, NULL, 'O' },
                { "model-alias", required_argument, NULL, 'A' },
                { "response-store", required_argument, NULL, 'S' },
                { "response-retention", required_argument, NULL, 'R' },
                { "version", no_argument, NULL, 'V' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        const char *config_path = NULL;
        int o;
        log_set_ident("xing4-http");
        /* the config file first, so flags override it whatever their order */
        opterr = 0;
        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1)
                if (o == 'c')
                        config_path = optarg;
        if (config_load(config_path ? config_path : DEFAULT_CONFIG, config_path != NULL) < 0)
                return 2;
        bool sockets_from_flags = false;
        optind = 0;
        opterr = 1;
        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                int r = 0;
                switch (o) {
                case 'c':
                        break;
                case 's':
                        if (!sockets_from_flags) {
                                /* flags replace the config file's list */
                                for (size_t i = 0; i < br.cfg.n_sockets; i++)
                                        free(br.cfg.sockets[i]);
                                br.cfg.n_sockets = 0;
                                sockets_from_flags = true;
                        }
                        r = config_set("socket", optarg, "--socket");
                        break;
                case 'l': r = config_set("listen", optarg, "--listen"); break;
                case 'k': r = config_set("api-key-file", optarg, "--api-key-file"); break;
                case 'm': r = config_set("model-name", optarg, "--model-name"); break;
                case 'b': r = config_set("max-body-bytes", optarg, "--max-body-bytes"); break;
                case 'n': r = config_set("max-concurrent", optarg, "--max-concurrent"); break;
                case 't': r = config_set("timeout", optarg, "--timeout"); break;
                case 'T': r = config_set("connect-timeout-ms", optarg, "--connect-timeout-ms"); break;
                case 'O': r = config_set("cors-origin", optarg, "--cors-origin"); break;
                case 'A': r = config_set("model-alias", optarg, "--model-alias"); break;
                case 'S': r = config_set("response-store", optarg, "--response-store"); break;
                case 'R': r = config_set("response-retention", optarg, "--response-retention"); break;
                case 'V':
                        printf("xing4-http " BRIDGE_VERSION "\n");
                        return 0;
                case 'h':
                        usage();
                        return 0;
                default:
                        fprintf(stderr, "xing4-http: see --help\n");
                        return 2;
                }
                if (r < 0)
                        return 2;
        }
        if (optind < argc) {
                log_error("unexpected argument \"%s\"; see --help", argv[optind]);
                return 2;
        }
        if (br.cfg.n_sockets == 0) {
                const char *env = getenv(X4_SOCKET_ENV);
                config_set("socket", env && *env ? env : X4_DEFAULT_SOCKET, "default");
        }
        if (br.cfg.api_key_file[0] && read_api_keys(br.cfg.api_key_file) < 0)
                return 2;
        if (!br.cfg.aliases_set)
                for (size_t i = 0; i < ELEMENTSOF(default_aliases); i++)
                        br.cfg.aliases[br.cfg.n_aliases++] = strdup(default_aliases[i]);
        rs_store_configure(br.cfg.store_entries, br.cfg.store_bytes, br.cfg.store_retention_s);

        char host[256];
        snprintf(host, sizeof host, "%s", br.cfg.listen);
        char *colon = strrchr(host, ':');
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : -1;
        if (!colon || colon == host || !end || *end || colon[1] == 0 || port < 0 || port > 65535) {
                log_error("--listen %s: HOST:PORT expected (e.g. 127.0.0.1:8000)", br.cfg.listen);
                return 2;
        }
        *colon = 0;
        if (host[0] == '[' && host[strlen(host) - 1] == ']') {
                memmove(host, host + 1, strlen(host));
                host[strlen(host) - 1] = 0;
        }

        signal(SIGPIPE, SIG_IGN);
        br.started_unix = time(NULL);
        br.base = event_base_new();
        struct evhttp *http = br.base ? evhttp_new(br.base) : NULL;
        if (!http) {
                log_error("cannot create the event loop");
                return 1;
        }
        br.n_backends = br.cfg.n_sockets;
        for (size_t i = 0; i < br.n_backends; i++)
                br.backends[i].path = br.cfg.sockets[i];
        /* the hard cap protects memory; bodies between max_body and it get an OpenAI-shaped 413 */
        evhttp_set_max_body_size(http, (ev_ssize_t) br.cfg.max_body * 2 + 65536);
        evhttp_set_max_headers_size(http, 64 * 1024);
        evhttp_set_timeout(http, br.cfg.timeout_s);
        evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_DELETE |
                                                 EVHTTP_REQ_HEAD | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PUT);
        evhttp_set_gencb(http, route, NULL);
        errno = 0;
        struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(http, host, (uint16_t) port);
        if (!bs) {
                /* a name that does not resolve leaves errno 0 ("Success") */
                log_error("--listen %s: cannot listen there: %s", br.cfg.listen,
                          errno ? strerror(errno) : "the host does not resolve to a local address");
                return 1;
        }
        br.listener = evhttp_bound_socket_get_listener(bs);
        br.accept_resume = evtimer_new(br.base, on_accept_resume, NULL);
        br.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (br.listener)
                evconnlistener_set_error_cb(br.listener, on_accept_error);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int bound_port = (int) port;
        if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *) &ss, &sl) == 0)
                bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *) &ss)->sin6_port)
                                                      : ntohs(((struct sockaddr_in *) &ss)->sin_port);

        if (br.cfg.model_name[0])
                snprintf(br.served_model, sizeof br.served_model, "%s", br.cfg.model_name);
        for (size_t i = 0; i < br.n_backends; i++)
                (void) backend_ensure(&br.backends[i]); /* fine if not up yet: retried per request */

        struct event *sigint = evsignal_new(br.base, SIGINT, on_signal, NULL);
        struct event *sigterm = evsignal_new(br.base, SIGTERM, on_signal, NULL);
        struct event *sighup = evsignal_new(br.base, SIGHUP, on_hup, NULL);
        event_add(sigint, NULL);
        event_add(sigterm, NULL);
        event_add(sighup, NULL);
        log_info("listening on http://%s%s%s:%d/v1 (model \"%s\", %zu daemon socket%s)", strchr(host, ':') ? "[" : "",
                 host, strchr(host, ':') ? "]" : "", bound_port, br.served_model, br.n_backends,
                 br.n_backends == 1 ? "" : "s");
        event_base_dispatch(br.base);

        for (size_t i = 0; i < br.n_backends; i++)
                backend_drop(&br.backends[i]);
        evhttp_free(http);
        if (br.accept_resume)
                event_free(br.accept_resume);
        event_free(sigint);
        event_free(sigterm);
        event_free(sighup);
        /* libx4client does not call on_done when a client is freed: the jobs left are abandoned */
        while (br.jobs) {
                struct job *j = br.jobs;
                job_unlink(j);
                job_free(j);
        }
        event_base_free(br.base);
        for (size_t i = 0; i < br.cfg.n_sockets; i++)
                free(br.cfg.sockets[i]);
        for (size_t i = 0; i < br.n_api_keys; i++)
                free(br.api_keys[i]);
        for (size_t i = 0; i < br.cfg.n_cors; i++)
                free(br.cfg.cors_origins[i]);
        for (size_t i = 0; i < br.cfg.n_aliases; i++)
                free(br.cfg.aliases[i]);
        rs_store_clear();
        return 0;
}
