/* SPDX-License-Identifier: MIT */
/* Server-Sent Events the way OpenAI's streaming endpoints frame them: every event is one
 * `data: <json>` line followed by a blank line, the stream ends with `data: [DONE]`. JSON is
 * printed compact, so an event never contains a newline (jansson escapes the ones in strings). */
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

int sse_format(struct evbuffer *buf, const char *data, size_t len) {
        /* a payload with a newline would need one data: line per line; ours never has one */
        if (memchr(data, '\n', len))
                return -1;
        if (evbuffer_add(buf, "data: ", 6) < 0 || evbuffer_add(buf, data, len) < 0 ||
            evbuffer_add(buf, "\n\n", 2) < 0)
                return -1;
        return 0;
}

void sse_start(struct evhttp_request *req) {
        struct evkeyvalq *h = evhttp_request_get_output_headers(req);
        evhttp_add_header(h, "Content-Type", "text/event-stream; charset=utf-8");
        evhttp_add_header(h, "Cache-Control", "no-cache");
        /* reverse proxies (nginx) would otherwise buffer the stream */
        evhttp_add_header(h, "X-Accel-Buffering", "no");
        evhttp_send_reply_start(req, 200, "OK");
}

void sse_keepalive(struct evhttp_request *req) {
        struct evbuffer *b = evbuffer_new();
        /* a comment line: clients ignore it, proxies see the connection is alive */
        if (b && evbuffer_add(b, ": keep-alive\n\n", 14) == 0)
                evhttp_send_reply_chunk(req, b);
        if (b)
                evbuffer_free(b);
}

void sse_send_json(struct evhttp_request *req, json_t *j) {
        char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
        json_decref(j);
        if (!s)
                return;
        struct evbuffer *b = evbuffer_new();
        if (b && sse_format(b, s, strlen(s)) == 0)
                evhttp_send_reply_chunk(req, b);
        if (b)
                evbuffer_free(b);
        free(s);
}

void sse_finish(struct evhttp_request *req) {
        struct evbuffer *b = evbuffer_new();
        if (b) {
                static const char done[] = "[DONE]";
                sse_format(b, done, sizeof done - 1);
                evhttp_send_reply_chunk(req, b);
                evbuffer_free(b);
        }
        evhttp_send_reply_end(req);
}

int sse_format_event(struct evbuffer *buf, const char *event, json_t *j) {
        char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
        json_decref(j);
        if (!s)
                return -1;
        int r = evbuffer_add_printf(buf, "event: %s\n", event) < 0 ? -1 : sse_format(buf, s, strlen(s));
        free(s);
        return r;
}

void sse_send_buffer(struct evhttp_request *req, struct evbuffer *buf) {
        if (evbuffer_get_length(buf) > 0)
                evhttp_send_reply_chunk(req, buf);
}

/* ---- named-event streams: the API's own events (anthropic.c, responses.c) ---------------------- */

void ev_stream_init(struct ev_stream *s, enum api_kind kind, const char *id, const char *model, int64_t created,
                    json_t *echo, struct api_result *res) {
        memset(s, 0, sizeof *s);
        s->kind = kind;
        s->id = id;
        s->model = model;
        s->created = created;
        s->echo = echo;
        s->res = res;
        s->output = json_array();
}

void ev_stream_done(struct ev_stream *s) {
        json_decref(s->output);
        s->output = NULL;
}

void ev_stream_start(struct ev_stream *s, struct evbuffer *out) {
        if (s->started)
                return;
        s->started = true;
        if (s->kind == API_MESSAGES)
                am_stream_start(s, out);
        else
                rs_stream_start(s, out);
}

void ev_stream_chunk(struct ev_stream *s, const struct x4_chunk *c, struct evbuffer *out) {
        ev_stream_start(s, out);
        if (s->kind == API_MESSAGES)
                am_stream_chunk(s, c, out);
        else
                rs_stream_chunk(s, c, out);
}

void ev_stream_finish(struct ev_stream *s, const struct x4_done *d, struct evbuffer *out) {
        if (!s->started) { /* nothing was said: Done tells the prompt's size */
                s->prompt_tokens = d->prompt_tokens;
                s->cached_tokens = d->cached_tokens <= d->prompt_tokens ? d->cached_tokens : d->prompt_tokens;
        }
        ev_stream_start(s, out);
        if (s->kind == API_MESSAGES)
                am_stream_finish(s, d, out);
        else
                rs_stream_finish(s, d, out);
}

void ev_stream_error(struct ev_stream *s, const struct api_error *e, struct evbuffer *out) {
        if (s->kind == API_MESSAGES)
                am_stream_error(s, e, out);
        else {
                ev_stream_start(s, out); /* response.created first, then response.failed */
                rs_stream_error(s, e, out);
        }
}
