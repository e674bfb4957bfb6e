/* SPDX-License-Identifier: MIT */
/* A small program linked against libx4client only (x4client.h), driven by test_client.py.
 *   client-test SOCKET blocking N_TOKENS       greedy generate from token ids, print ids + done
 *   client-test SOCKET concurrent K N_TOKENS   K requests at once through the event-loop API
 *   client-test SOCKET cancel-after M          long request, cancelled from the chunk callback
 *                                              after M chunks
 *   client-test SOCKET bad-top-p               a refused request: prints the error code + text
 *   client-test SOCKET tool-history JSON|-     chat with an assistant tool call (JSON, or none
 *                                              for -) and the tool's named answer
 * Output: one line per fact, "key value", parsed by the test. Exit 0 when the calls behaved. */
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "x4client.h"

static const int32_t prompt[] = { 5, 6, 7, 8, 9 };

struct collect {
        int32_t ids[4096];
        size_t n;
        int chunks;
        int cancel_after;
        int done;
        struct x4_done last;
};

static int on_chunk(const struct x4_chunk *ch, void *userdata) {
        struct collect *c = userdata;
        for (size_t i = 0; i < ch->n_token_ids && c->n < 4096; i++)
                c->ids[c->n++] = ch->token_ids[i];
        c->chunks++;
        return c->cancel_after > 0 && c->chunks >= c->cancel_after;
}

static void on_done(const struct x4_done *d, void *userdata) {
        struct collect *c = userdata;
        c->done++;
        c->last = *d;
        c->last.stop = NULL;
        c->last.error_message = NULL;
}

static void print_ids(const char *key, const struct collect *c) {
        printf("%s", key);
        for (size_t i = 0; i < c->n; i++)
                printf("%s%" PRId32, i ? "," : " ", c->ids[i]);
        printf("\n");
}

static x4_request *greedy(uint32_t max_tokens) {
        x4_request *r = x4_request_new();
        if (!r)
                return NULL;
        x4_request_set_tokens(r, prompt, sizeof prompt / sizeof prompt[0]);
        x4_request_set_temperature(r, 0.0f);
        x4_request_set_max_tokens(r, max_tokens);
        return r;
}

int main(int argc, char **argv) {
        x4_client *c;
        int e;

        if (argc < 3) {
                fprintf(stderr, "usage: client-test SOCKET MODE [ARGS]\n");
                return 2;
        }
        if (x4_client_new(&c) < 0)
                return 1;
        x4_client_set_name(c, "client-test");
        x4_client_set_timeouts(c, 20000, 60000);
        e = x4_client_connect(c, argv[1]);
        if (e < 0) {
                printf("connect %s %s\n", x4_strerror(e), x4_client_last_error(c));
                x4_client_free(c);
                return 1;
        }
        printf("server %s\n", x4_client_server_version(c));
        const char *mode = argv[2];
        int rc = 0;

        if (strcmp(mode, "blocking") == 0 && argc == 4) {
                struct collect col = { 0 };
                struct x4_done d;
                x4_request *r = greedy((uint32_t) atoi(argv[3]));
                e = x4_client_generate(c, r, on_chunk, &col, &d);
                printf("status %d\n", e);
                print_ids("ids", &col);
                printf("finish %d\ncompletion_tokens %u\nprompt_tokens %u\n", d.finish_reason,
                       d.completion_tokens, d.prompt_tokens);
                x4_request_free(r);
                rc = e < 0;
        } else if (strcmp(mode, "concurrent") == 0 && argc == 5) {
                int k = atoi(argv[3]);
                struct collect *cols = calloc((size_t) k, sizeof *cols);
                x4_request *r = greedy((uint32_t) atoi(argv[4]));
                for (int i = 0; i < k; i++) {
                        uint64_t id;
                        e = x4_client_submit(c, r, on_chunk, on_done, &cols[i], &id);
                        if (e < 0) {
                                printf("submit %s\n", x4_client_last_error(c));
                                return 1;
                        }
                }
                printf("pending %zu\n", x4_client_pending(c));
                while (x4_client_pending(c) > 0) {
                        struct pollfd p = { .fd = x4_client_fd(c), .events = POLLIN };
                        if (poll(&p, 1, 60000) <= 0) {
                                printf("poll timeout\n");
                                return 1;
                        }
                        e = x4_client_dispatch(c);
                        if (e < 0) {
                                printf("dispatch %s\n", x4_client_last_error(c));
                                return 1;
                        }
                }
                for (int i = 0; i < k; i++) {
                        char key[32];
                        snprintf(key, sizeof key, "ids%d", i);
                        print_ids(key, &cols[i]);
                        printf("done%d %d %d %u\n", i, cols[i].done, cols[i].last.finish_reason,
                               cols[i].last.completion_tokens);
                }
                x4_request_free(r);
                free(cols);
        } else if (strcmp(mode, "cancel-after") == 0 && argc == 4) {
                struct collect col = { .cancel_after = atoi(argv[3]) };
                struct x4_done d;
                x4_request *r = greedy(1000000);
                x4_request_set_ignore_eos(r, true);
                e = x4_client_generate(c, r, on_chunk, &col, &d);
                printf("status %d\nfinish %d\nchunks %d\ncompletion_tokens %u\n", e,
                       d.finish_reason, col.chunks, d.completion_tokens);
                struct x4_stats s;
                e = x4_client_stats(c, &s);
                printf("stats %d\npages_used %u\ncancelled %" PRIu64 "\nrunning %u\n", e,
                       s.cache_pages_used, s.requests_cancelled, s.requests_running);
                x4_request_free(r);
        } else if (strcmp(mode, "snapshot-from") == 0 && argc == 4) {
                /* generate, snapshot that finished request (prompt + output), resume from it */
                struct collect first = { 0 }, resumed = { 0 }, full = { 0 };
                struct x4_done d;
                struct x4_snapshot_info info;
                x4_request *r = greedy(4);
                x4_request_set_ignore_eos(r, true);
                e = x4_client_generate(c, r, on_chunk, &first, &d);
                printf("first %d %zu\n", e, first.n);
                e = x4_client_snapshot_create(c, argv[3], NULL, d.request_id, &info);
                printf("snapshot %d %s %u\n", e, e < 0 ? x4_client_last_error(c) : info.name,
                       info.n_tokens);
                int32_t next = 42;
                x4_request *r2 = x4_request_new();
                x4_request_set_tokens(r2, &next, 1);
                x4_request_set_snapshot(r2, argv[3]);
                x4_request_set_temperature(r2, 0.0f);
                x4_request_set_max_tokens(r2, 6);
                x4_request_set_ignore_eos(r2, true);
                e = x4_client_generate(c, r2, on_chunk, &resumed, &d);
                printf("resumed %d cached %u prompt %u\n", e, d.cached_tokens, d.prompt_tokens);
                print_ids("resumed_ids", &resumed);
                /* the same sequence sent whole */
                int32_t all[64];
                size_t n = 0;
                for (size_t i = 0; i < sizeof prompt / sizeof prompt[0]; i++)
                        all[n++] = prompt[i];
                for (size_t i = 0; i < first.n; i++)
                        all[n++] = first.ids[i];
                all[n++] = next;
                x4_request *r3 = x4_request_new();
                x4_request_set_tokens(r3, all, n);
                x4_request_set_temperature(r3, 0.0f);
                x4_request_set_max_tokens(r3, 6);
                x4_request_set_ignore_eos(r3, true);
                e = x4_client_generate(c, r3, on_chunk, &full, &d);
                print_ids("full_ids", &full);
                e = x4_client_snapshot_create(c, "x", NULL, 999, &info);
                printf("missing %s\n", x4_client_last_error(c));
                x4_request_free(r);
                x4_request_free(r2);
                x4_request_free(r3);
        } else if (strcmp(mode, "tool-history") == 0 && argc == 4) {
                bool calls = strcmp(argv[3], "-") != 0;
                x4_request *r = x4_request_new();
                struct x4_done d;
                x4_request_add_message(r, "user", "Weather in Paris?");
                x4_request_add_message_ex(r, "assistant", NULL, calls ? "I should look it up." : NULL,
                                          calls ? argv[3] : NULL, NULL);
                x4_request_add_message_ex(r, "tool", "{\"temp_c\": 21}", NULL, NULL,
                                          calls ? "get_weather" : NULL);
                x4_request_set_temperature(r, 0.0f);
                x4_request_set_max_tokens(r, 2);
                e = x4_client_generate(c, r, NULL, NULL, &d);
                printf("status %d\nmessage %s\n", e, e < 0 ? x4_client_last_error(c) : "");
                if (e == 0)
                        printf("prompt_tokens %u\n", d.prompt_tokens);
                x4_request_free(r);
        } else if (strcmp(mode, "bad-top-p") == 0) {
                x4_request *r = greedy(4);
                x4_request_set_top_p(r, 1.5f);
                x4_request_set_temperature(r, 1.0f);
                struct x4_done d;
                e = x4_client_generate(c, r, NULL, NULL, &d);
                printf("status %d %s\nmessage %s\n", e, x4_strerror(e), x4_client_last_error(c));
                /* the connection stays usable after a refused request */
                int st;
                char detail[128];
                printf("health %d\n", x4_client_health(c, &st, detail, sizeof detail));
                x4_request_free(r);
        } else {
                fprintf(stderr, "unknown mode %s\n", mode);
                rc = 2;
        }
        x4_client_free(c);
        return rc;
}
