/* SPDX-License-Identifier: MIT */
/* libx4client through its public header only, without a daemon: every call refused before any
 * I/O names the argument in x4_client_last_error() (not the previous error's text), and a peer
 * on the socket that is not xing4d (an HTTP server, one that reads the Hello and closes, one that
 * sends garbage or stays silent) is said as such, apart from a xing4d that closed. The peers are
 * threads behind a listening socket in a scratch folder. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "x4client.h"

#define assert_contains(hay, needle)                                                               \
        do {                                                                                       \
                const char *h_ = (hay);                                                            \
                if (!strstr(h_, (needle)))                                                         \
                        fail_msg("'%s' does not contain '%s'", h_, (needle));                      \
        } while (0)

/* ---- NULL and out-of-range arguments ---------------------------------------------------------- */

static void test_request_setters_name_the_argument(void **state) {
        x4_request *r = x4_request_new();
        assert_non_null(r);

        assert_int_equal(x4_request_set_text(NULL, "x"), X4_E_USAGE);
        assert_string_equal(x4_client_last_error(NULL),
                            "x4_request_set_text: r is NULL, a request from x4_request_new() expected");
        assert_int_equal(x4_request_set_text(r, NULL), X4_E_USAGE);
        assert_string_equal(x4_client_last_error(NULL),
                            "x4_request_set_text: text is NULL, the prompt's text expected");
        assert_int_equal(x4_request_set_tokens(r, NULL, 3), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_request_set_tokens: ids is NULL with n 3");
        assert_int_equal(x4_request_add_message(r, "user", NULL), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_request_add_message: content is NULL");
        assert_int_equal(x4_request_add_message_ex(r, NULL, "hi", NULL, NULL, NULL), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_request_add_message_ex: role is NULL");
        assert_int_equal(x4_request_add_stop(r, NULL), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_request_add_stop: stop is NULL");
        assert_int_equal(x4_request_set_temperature(NULL, 0.5f), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_request_set_temperature: r is NULL");
        /* it returned -EINVAL, which is no enum x4_error */
        assert_int_equal(x4_request_set_no_mtp(NULL, true), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_request_set_no_mtp: r is NULL");
        assert_int_equal(x4_request_set_constraint(r, 7, NULL), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL),
                        "x4_request_set_constraint: kind 7 is not an enum x4_constraint (0 to 4)");
        assert_int_equal(x4_request_set_constraint(r, X4_CONSTRAINT_JSON_SCHEMA, NULL), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_request_set_constraint: arg is NULL, the JSON Schema");
        /* what succeeds is not refused */
        assert_int_equal(x4_request_set_text(r, "hello"), 0);
        assert_int_equal(x4_request_set_no_mtp(r, true), 0);
        x4_request_free(r);
}

static void test_client_calls_name_the_argument(void **state) {
        x4_client *c;
        x4_request *r = x4_request_new();
        struct x4_done d = { .status = 12345 };
        char detail[8];

        assert_int_equal(x4_client_new(NULL), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_client_new: ret is NULL");
        assert_int_equal(x4_client_stats(NULL, NULL), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_client_stats: c is NULL, a client from x4_client_new()");
        assert_int_equal(x4_client_new(&c), 0);
        assert_int_equal(x4_request_set_text(r, "hi"), 0);

        /* an earlier error's text must not stay: each refusal below says its own */
        assert_int_equal(x4_client_stats(c, &(struct x4_stats){ 0 }), X4_E_USAGE);
        assert_string_equal(x4_client_last_error(c), "x4_client_stats: not connected; x4_client_connect() first");
#define REFUSED(call, text)                                                                        \
        do {                                                                                       \
                assert_int_equal((call), X4_E_USAGE);                                              \
                assert_contains(x4_client_last_error(c), (text));                                  \
        } while (0)
        REFUSED(x4_client_stats(c, NULL), "x4_client_stats: ret is NULL, a struct x4_stats to fill expected");
        REFUSED(x4_client_info(c, NULL), "x4_client_info: ret is NULL, a struct x4_info to fill expected");
        REFUSED(x4_client_health(c, NULL, detail, sizeof detail), "x4_client_health: status is NULL");
        REFUSED(x4_client_requests(c, NULL, &(size_t){ 0 }), "x4_client_requests: ret is NULL");
        REFUSED(x4_client_requests(c, &(struct x4_request_state *){ NULL }, NULL), "x4_client_requests: n is NULL");
        REFUSED(x4_client_snapshot_list(c, NULL, &(size_t){ 0 }), "x4_client_snapshot_list: ret is NULL");
        REFUSED(x4_client_snapshot_list(c, &(struct x4_snapshot_info *){ NULL }, NULL),
                "x4_client_snapshot_list: n is NULL");
        REFUSED(x4_client_snapshot_drop(c, NULL), "x4_client_snapshot_drop: name is NULL, the snapshot's name expected");
        REFUSED(x4_client_snapshot_create(c, NULL, r, 0, NULL), "x4_client_snapshot_create_flags: name is NULL");
        REFUSED(x4_client_snapshot_create_flags(c, "s", r, 0, 4, NULL),
                "x4_client_snapshot_create_flags: flags 0x4 has bits other than X4_SNAPSHOT_REPLACE");
        REFUSED(x4_client_submit(c, NULL, NULL, NULL, NULL, NULL), "x4_client_submit: req is NULL");
        REFUSED(x4_client_generate(c, NULL, NULL, NULL, &d), "x4_client_generate: req is NULL");
        assert_int_equal(d.status, X4_E_USAGE);
        REFUSED(x4_client_set_name(c, NULL), "x4_client_set_name: name is NULL");
        REFUSED(x4_client_set_timeouts(c, -2, 0),
                "x4_client_set_timeouts: connect_ms -2 is out of range: milliseconds >= 0, or -1 for no limit");
        REFUSED(x4_client_set_timeouts(c, 0, -5), "x4_client_set_timeouts: response_ms -5 is out of range");
        /* refused for the connection, not an argument: named too */
        REFUSED(x4_client_submit(c, r, NULL, NULL, NULL, NULL), "x4_client_submit: not connected");
        REFUSED(x4_client_generate(c, r, NULL, NULL, NULL), "x4_client_generate: not connected");
        REFUSED(x4_client_dispatch(c), "x4_client_dispatch: not connected");
        REFUSED(x4_client_snapshot_drop(c, "s"), "x4_client_snapshot_drop: not connected");
#undef REFUSED
        /* a NULL client's calls leave their message for x4_client_last_error(NULL) */
        assert_int_equal(x4_client_connect(NULL, "/nonexistent"), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_client_connect: c is NULL");
        assert_int_equal(x4_client_set_progress_cb(NULL, NULL), X4_E_USAGE);
        assert_contains(x4_client_last_error(NULL), "x4_client_set_progress_cb: c is NULL");
        x4_request_free(r);
        x4_client_free(c);
}

/* ---- peers that are not xing4d ---------------------------------------------------------------- */

/* A HelloReply {proto_major 1, proto_minor 4} as request 0's frame, length-prefixed. */
static const char hello_reply[] = "\0\0\0\x08\x08\x00\x5a\x04\x08\x01\x10\x04";
#define HELLO_REPLY_LEN 12

enum peer_kind {
        PEER_READ_CLOSE,   /* reads the Hello, closes */
        PEER_ANSWER_CLOSE, /* reads the Hello, writes `answer`, closes */
        PEER_READ_SILENT,  /* reads the Hello, says nothing until the client goes */
        PEER_CLOSE_UNREAD, /* accepts and closes without reading */
        PEER_XING4D_THEN,  /* answers Hello as xing4d, reads the next frame, writes `answer`, closes */
};

struct peer {
        char dir[64];
        char path[108];
        int listen_fd;
        enum peer_kind kind;
        const char *answer;
        size_t answer_len;
        pthread_t thread;
};

static void *peer_main(void *arg) {
        struct peer *p = arg;
        char buf[4096];
        int fd = accept(p->listen_fd, NULL, NULL);
        if (fd < 0)
                return NULL;
        if (p->kind != PEER_CLOSE_UNREAD)
                (void) !read(fd, buf, sizeof buf);
        if (p->kind == PEER_XING4D_THEN) {
                (void) !write(fd, hello_reply, HELLO_REPLY_LEN);
                (void) !read(fd, buf, sizeof buf);
        }
        if (p->kind == PEER_ANSWER_CLOSE || p->kind == PEER_XING4D_THEN)
                (void) !write(fd, p->answer, p->answer_len);
        if (p->kind == PEER_READ_SILENT)
                while (read(fd, buf, sizeof buf) > 0)
                        ;
        close(fd);
        return NULL;
}

static void peer_start(struct peer *p, enum peer_kind kind, const char *answer, size_t answer_len) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(p->dir, sizeof p->dir, "/tmp/x4-test-client-XXXXXX");
        assert_non_null(mkdtemp(p->dir));
        snprintf(p->path, sizeof p->path, "%s/peer.sock", p->dir);
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", p->path);
        p->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(p->listen_fd >= 0);
        assert_int_equal(bind(p->listen_fd, (struct sockaddr *) &sa, sizeof sa), 0);
        assert_int_equal(listen(p->listen_fd, 4), 0);
        p->kind = kind;
        p->answer = answer;
        p->answer_len = answer_len;
        assert_int_equal(pthread_create(&p->thread, NULL, peer_main, p), 0);
}

static void peer_stop(struct peer *p) {
        pthread_join(p->thread, NULL);
        close(p->listen_fd);
        unlink(p->path);
        rmdir(p->dir);
}

/* Connect to a peer of `kind`; returns the result, the message in msg. */
static int connect_to(enum peer_kind kind, const char *answer, size_t answer_len, char *msg,
                      size_t msg_size, char *path, size_t path_size) {
        struct peer p;
        x4_client *c;
        peer_start(&p, kind, answer, answer_len);
        assert_int_equal(x4_client_new(&c), 0);
        assert_int_equal(x4_client_set_timeouts(c, 300, 2000), 0);
        int r = x4_client_connect(c, p.path);
        snprintf(msg, msg_size, "%s", x4_client_last_error(c));
        snprintf(path, path_size, "%s", p.path);
        assert_int_equal(x4_client_fd(c), -1); /* a failed connect keeps no socket */
        x4_client_free(c);
        peer_stop(&p);
        return r;
}

static void test_peer_that_reads_and_closes(void **state) {
        char msg[512], path[108], want[700];
        int r = connect_to(PEER_READ_CLOSE, NULL, 0, msg, sizeof msg, path, sizeof path);
        assert_int_equal(r, X4_E_PROTOCOL);
        snprintf(want, sizeof want, "%s: the peer does not speak the xing4d protocol: it read the Hello "
                 "handshake and closed the connection without answering", path);
        assert_contains(msg, want);
}

static void test_http_server(void **state) {
        static const char http[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        char msg[512], path[108], want[700];
        int r = connect_to(PEER_ANSWER_CLOSE, http, sizeof http - 1, msg, sizeof msg, path, sizeof path);
        assert_int_equal(r, X4_E_PROTOCOL);
        snprintf(want, sizeof want, "%s: the peer does not speak the xing4d protocol: it answered the "
                 "Hello handshake with 'HTTP/1.1 400 Bad'..., not a xing4d frame (an HTTP server", path);
        assert_contains(msg, want);
}

static void test_garbage_answers(void **state) {
        char msg[512], path[108];
        /* a frame header that fits, then too few bytes and a close */
        int r = connect_to(PEER_ANSWER_CLOSE, "\0\0\0\x08" "abc", 7, msg, sizeof msg, path, sizeof path);
        assert_int_equal(r, X4_E_PROTOCOL);
        assert_contains(msg, "does not speak the xing4d protocol: it answered the Hello handshake with "
                             "'\\x00\\x00\\x00\\x08abc', not a xing4d frame");
        /* a whole frame whose payload is no protobuf Frame */
        r = connect_to(PEER_ANSWER_CLOSE, "\0\0\0\x03\xff\xff\xff", 7, msg, sizeof msg, path, sizeof path);
        assert_int_equal(r, X4_E_PROTOCOL);
        assert_contains(msg, "does not speak the xing4d protocol: it answered the Hello handshake with "
                             "'\\x00\\x00\\x00\\x03\\xff\\xff\\xff'");
        /* a xing4d frame, but a HealthReply where the HelloReply belongs */
        r = connect_to(PEER_ANSWER_CLOSE, "\0\0\0\x05\x08\x00\xba\x01\x00", 9, msg, sizeof msg, path,
                       sizeof path);
        assert_int_equal(r, X4_E_PROTOCOL);
        assert_contains(msg, "does not speak the xing4d protocol: it answered the Hello handshake with "
                             "frame body 23, not a HelloReply");
}

static void test_silent_reader_and_unread_close(void **state) {
        char msg[512], path[108];
        int r = connect_to(PEER_READ_SILENT, NULL, 0, msg, sizeof msg, path, sizeof path);
        assert_int_equal(r, X4_E_TIMEOUT);
        assert_contains(msg, ": the peer read the Hello handshake but sent nothing back within 300 ms: it "
                             "does not speak the xing4d protocol");
        /* closed without reading: xing4d exiting looks the same, so not "does not speak" */
        r = connect_to(PEER_CLOSE_UNREAD, NULL, 0, msg, sizeof msg, path, sizeof path);
        assert_int_equal(r, X4_E_CLOSED);
        assert_contains(msg, ": the peer closed the connection without reading the Hello handshake: "
                             "xing4d exiting, or a program that does not speak the xing4d protocol");
}

/* Connect c to a peer that answers Hello as xing4d, then the next frame with `answer` and a
 * close; x4_client_stats() must fail with `code` and the message "PATH: `said`". */
static void stats_after_handshake(x4_client *c, const char *answer, size_t answer_len, int code,
                                  const char *said) {
        struct peer p;
        struct x4_stats s;
        char want[300];
        peer_start(&p, PEER_XING4D_THEN, answer, answer_len);
        assert_int_equal(x4_client_connect(c, p.path), 0);
        assert_int_equal(x4_client_stats(c, &s), code);
        snprintf(want, sizeof want, "%s: %s", p.path, said);
        assert_string_equal(x4_client_last_error(c), want);
        peer_stop(&p);
}

/* After a good handshake a close is the server's, and a protocol error stays one (it was
 * reported as "server closed the connection"); the broken client connects again. */
static void test_after_the_handshake(void **state) {
        x4_client *c;
        struct x4_stats s;

        assert_int_equal(x4_client_new(&c), 0);
        assert_int_equal(x4_client_set_timeouts(c, 2000, 2000), 0);
        stats_after_handshake(c, "", 0, X4_E_CLOSED, "server closed the connection");
        /* the broken connection is named by later calls, and a new connect is allowed */
        assert_int_equal(x4_client_stats(c, &s), X4_E_USAGE);
        assert_contains(x4_client_last_error(c), "x4_client_stats: the connection to ");
        assert_contains(x4_client_last_error(c), "broke earlier (");
        stats_after_handshake(c, "\0\0\0\x02\xff\xff", 6, X4_E_PROTOCOL,
                              "undecodable frame of 2 bytes from the server");
        x4_client_free(c);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_request_setters_name_the_argument),
                cmocka_unit_test(test_client_calls_name_the_argument),
                cmocka_unit_test(test_peer_that_reads_and_closes),
                cmocka_unit_test(test_http_server),
                cmocka_unit_test(test_garbage_answers),
                cmocka_unit_test(test_silent_reader_and_unread_close),
                cmocka_unit_test(test_after_the_handshake),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
