/* SPDX-License-Identifier: MIT */
/* The engine thread on the CPU backend with the tiny fixture model: requests complete with
 * exactly one final event, batching does not change a request's output, cancellation and the end
 * of a request give their pages back, admission respects the page budget, refusals name the
 * field. Events are awaited on the scheduler's eventfd (poll with a deadline), never by sleeping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <poll.h>

#include "../kernels/backend.h"
#include "model/xing4.h"
#include "scheduler.h"
#include "common/log.h"

struct env {
        struct x4_model *model;
        struct x4_backend *backend;
        struct sched *sched;
};

static int setup_with(void **state, uint32_t n_pages, uint32_t page_tokens) {
        struct env *e = calloc(1, sizeof *e);
        struct x4_model_params mp = { .path = X4_FIXTURES "/xing4-tiny-a/model.gguf" };
        struct x4_backend_params bp = { .n_threads = 1, .page_tokens = page_tokens,
                                        .n_pages = n_pages };
        assert_non_null(e);
        assert_int_equal(x4_model_open(&mp, &e->model, NULL, 0), 0);
        assert_int_equal(x4_backend_cpu.create(e->model, &bp, &e->backend, NULL, 0), 0);
        struct sched_params sp = { .model = e->model, .ops = &x4_backend_cpu,
                                   .backend = e->backend, .max_running = 4, .max_waiting = 4,
                                   .prefill_chunk = 5 };
        assert_int_equal(sched_new(&sp, &e->sched), 0);
        assert_int_equal(sched_start(e->sched), 0);
        *state = e;
        return 0;
}

static int setup(void **state) {
        return setup_with(state, 16, 16);
}

static int setup_small(void **state) {
        return setup_with(state, 4, 16); /* 64 positions in all */
}

static int teardown(void **state) {
        struct env *e = *state;
        sched_free(e->sched);
        x4_backend_cpu.destroy(e->backend);
        x4_model_free(e->model);
        free(e);
        return 0;
}

static struct sched_request *tokens_request(const int32_t *ids, uint32_t n, uint32_t max_tokens,
                                            void *cookie) {
        struct sched_request *r = calloc(1, sizeof *r);
        assert_non_null(r);
        r->prompt = SCHED_PROMPT_TOKENS;
        r->tokens = malloc(n * sizeof *ids);
        memcpy(r->tokens, ids, n * sizeof *ids);
        r->n_tokens = n;
        r->has_max_tokens = true;
        r->max_tokens = max_tokens;
        r->sampling.has_temperature = true;
        r->sampling.temperature = 0.0f;
        r->ignore_eos = true;
        r->echo_ids = true;
        r->enable_thinking = -1;
        r->cookie = cookie;
        return r;
}

/* What one request produced. */
struct outcome {
        int32_t ids[256];
        uint32_t n;
        int finals;
        int kind; /* of the final event */
        int finish;
        int code;
        char message[256];
        uint32_t cached; /* Done: prompt tokens reused */
};

/* Wait for events until every outcome in outs[0..n) has its final event. */
static void run_until_final(struct sched *s, struct outcome *outs, size_t n) {
        for (;;) {
                size_t done = 0;
                for (size_t i = 0; i < n; i++)
                        done += outs[i].finals > 0;
                if (done == n)
                        return;
                struct pollfd p = { .fd = sched_event_fd(s), .events = POLLIN };
                assert_true(poll(&p, 1, 60000) == 1); /* a stuck engine fails, not hangs */
                uint64_t v;
                (void) !read(p.fd, &v, sizeof v);
                for (struct sched_event *e = sched_pop_events(s), *next; e; e = next) {
                        struct outcome *o = e->cookie;
                        next = e->next;
                        if (e->kind == SCHED_EVENT_PROGRESS) { /* a long prefill's, not final */
                                sched_event_free(e);
                                continue;
                        }
                        assert_int_equal(o->finals, 0); /* nothing after the final event */
                        if (e->kind == SCHED_EVENT_CHUNK) {
                                for (uint32_t k = 0; k < e->n_tokens && o->n < 256; k++)
                                        o->ids[o->n++] = e->tokens[k];
                        } else {
                                o->finals++;
                                o->kind = e->kind;
                                o->finish = e->finish_reason;
                                o->code = e->code;
                                o->cached = e->cached_tokens;
                                snprintf(o->message, sizeof o->message, "%s",
                                         e->message ? e->message : "");
                        }
                        sched_event_free(e);
                }
        }
}

static const int32_t prompt[] = { 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };

/* ---- the default prefill chunk follows the backend's pass length ------------------------- */

/* the CPU backend, with its caps' pass length replaced (0: its own) and the widest forward noted;
 * with zero_vocab set, a forward that computes nothing and writes zero logits (and hiddens): a
 * 4,096-token pass of the CPU backend takes over a minute under ASan on one thread, and what
 * these tests ask is how wide the scheduler's passes are, not what they compute */
static uint32_t pass_cap, widest_forward, zero_vocab, zero_embd;
static int forward_noting(struct x4_backend *b, const struct x4_batch *batch, float *logits,
                          char *err, size_t err_size) {
        uint32_t n = 0;
        for (uint32_t i = 0; i < batch->n_seqs; i++)
                n += batch->seqs[i].n_tokens;
        widest_forward = n > widest_forward ? n : widest_forward;
        if (!zero_vocab)
                return x4_backend_cpu.forward(b, batch, logits, err, err_size);
        if (logits)
                memset(logits, 0, (size_t) x4_batch_logits_rows(batch) * zero_vocab * sizeof *logits);
        if (batch->hidden)
                memset(batch->hidden, 0,
                       (size_t) x4_batch_hidden_rows(batch) * zero_embd * sizeof *batch->hidden);
        return 0;
}
static void caps_pass(struct x4_backend *b, struct x4_backend_caps *ret) {
        x4_backend_cpu.caps(b, ret);
        if (pass_cap)
                ret->max_batch_tokens = pass_cap;
}

/* The widest forward of one request with a prompt of n tokens (and 2 generated) through a
 * scheduler without --prefill-chunk, on a backend whose pass takes `cap` tokens (compute false:
 * forward_noting's zero logits). */
static uint32_t widest_prefill(uint32_t cap, uint32_t n, bool compute) {
        struct x4_model *model;
        struct x4_backend *backend;
        struct sched *sched;
        struct x4_model_params mp = { .path = X4_FIXTURES "/xing4-tiny-a/model.gguf" };
        struct x4_backend_params bp = { .n_threads = 1, .page_tokens = 16, .n_pages = 512 };
        struct x4_backend_ops ops = x4_backend_cpu;
        ops.forward = forward_noting;
        ops.caps = caps_pass;
        pass_cap = cap;
        widest_forward = 0;
        assert_int_equal(x4_model_open(&mp, &model, NULL, 0), 0);
        assert_int_equal(x4_backend_cpu.create(model, &bp, &backend, NULL, 0), 0);
        zero_vocab = compute ? 0 : x4_model_config(model)->n_vocab;
        zero_embd = x4_model_config(model)->n_embd;
        struct sched_params sp = { .model = model, .ops = &ops, .backend = backend,
                                   .max_running = 2, .max_waiting = 2 };
        assert_int_equal(sched_new(&sp, &sched), 0);
        assert_int_equal(sched_start(sched), 0);
        int32_t *ids = malloc(n * sizeof *ids);
        assert_non_null(ids);
        for (uint32_t i = 0; i < n; i++)
                ids[i] = 5 + (int32_t) (i * 7 % 200);
        struct outcome o;
        memset(&o, 0, sizeof o);
        assert_int_equal(sched_submit(sched, tokens_request(ids, n, 2, &o), NULL), 0);
        run_until_final(sched, &o, 1);
        assert_int_equal(o.kind, SCHED_EVENT_DONE);
        free(ids);
        sched_free(sched);
        x4_backend_cpu.destroy(backend);
        x4_model_free(model);
        return widest_forward;
}

static void test_default_prefill_chunk_follows_the_pass(void **state) {
        (void) state;
        /* a backend whose pass takes 1,500 tokens: a 1,200-token prompt alone in one step (the
         * CUDA backend's passes of up to 4,096; the scheduler's own default was 256) */
        assert_int_equal(widest_prefill(1500, 1200, true), 1200);
        /* the CPU's micro-batch of 256 */
        assert_int_equal(widest_prefill(0, 600, true), 256);
        /* past SCHED_PREFILL_CHUNK_MAX, clamped to it (nothing computed: see forward_noting) */
        assert_int_equal(widest_prefill(1u << 20, SCHED_PREFILL_CHUNK_MAX + 100, false),
                         SCHED_PREFILL_CHUNK_MAX);
}

static void test_generate_and_batch_invariance(void **state) {
        struct env *e = *state;
        struct outcome alone, batch[3];

        memset(&alone, 0, sizeof alone);
        memset(batch, 0, sizeof batch);

        assert_int_equal(sched_submit(e->sched, tokens_request(prompt, 11, 12, &alone), NULL), 0);
        run_until_final(e->sched, &alone, 1);
        assert_int_equal(alone.kind, SCHED_EVENT_DONE);
        assert_int_equal(alone.finish, SCHED_FINISH_LENGTH);
        assert_int_equal(alone.n, 12);
        /* three at once: continuous batching (prefill chunks of 5 interleaved with decode steps)
         * gives each the tokens it gets alone (docs/design.md "Numerics") */
        for (int i = 0; i < 3; i++)
                assert_int_equal(sched_submit(e->sched, tokens_request(prompt, 11, 12, &batch[i]), NULL), 0);
        run_until_final(e->sched, batch, 3);
        for (int i = 0; i < 3; i++) {
                assert_int_equal(batch[i].finals, 1);
                assert_int_equal(batch[i].n, 12);
                assert_memory_equal(batch[i].ids, alone.ids, 12 * sizeof(int32_t));
        }
        struct sched_stats st;
        sched_get_stats(e->sched, &st);
        assert_int_equal(st.pages_used, 0);
        assert_int_equal(st.total, 4);
        assert_int_equal(st.completion_tokens, 48);
        assert_int_equal(sched_in_flight(e->sched), 0);
}

static void test_cancel_frees_pages(void **state) {
        struct env *e = *state;
        struct outcome o;

        memset(&o, 0, sizeof o);
        struct sched_request *r = tokens_request(prompt, 11, 200, &o);

        uint64_t id;
        assert_int_equal(sched_submit(e->sched, r, &id), 0);
        assert_int_equal(sched_cancel(e->sched, id), 0);
        run_until_final(e->sched, &o, 1);
        assert_int_equal(o.kind, SCHED_EVENT_DONE);
        /* cancelled at the first step boundary it reached: well before 200 tokens */
        assert_int_equal(o.finish, SCHED_FINISH_CANCELLED);
        assert_true(o.n < 200);
        struct sched_stats st;
        sched_get_stats(e->sched, &st);
        assert_int_equal(st.pages_used, 0);
        assert_int_equal(st.cancelled, 1);
        assert_int_equal(sched_cancel(e->sched, id), -ENOENT);
}

static void test_page_budget(void **state) {
        struct env *e = *state;
        struct outcome big, a, b;
        struct sched_stats st;

        memset(&big, 0, sizeof big);
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        /* the cache is the context: 4 pages of 16 = 64 positions, so 11 prompt tokens leave room
         * for 53, whatever max_tokens says, and the request ends with LENGTH there */
        assert_int_equal(sched_context_limit(e->sched), 64);
        assert_int_equal(sched_submit(e->sched, tokens_request(prompt, 11, 100, &big), NULL), 0);
        run_until_final(e->sched, &big, 1);
        assert_int_equal(big.kind, SCHED_EVENT_DONE);
        assert_int_equal(big.finish, SCHED_FINISH_LENGTH);
        assert_int_equal(big.n, 53);
        /* two requests of 3 pages each (41 positions): the second waits for the first's pages */
        assert_int_equal(sched_submit(e->sched, tokens_request(prompt, 11, 30, &a), NULL), 0);
        assert_int_equal(sched_submit(e->sched, tokens_request(prompt, 11, 30, &b), NULL), 0);
        run_until_final(e->sched, &a, 1);
        run_until_final(e->sched, &b, 1);
        assert_int_equal(a.n, 30);
        assert_int_equal(b.n, 30);
        assert_memory_equal(a.ids, b.ids, 30 * sizeof(int32_t));
        assert_memory_equal(a.ids, big.ids, 30 * sizeof(int32_t));
        sched_get_stats(e->sched, &st);
        assert_int_equal(st.pages_used, 0);
        assert_int_equal(st.total, 3);
}

static void test_validation_messages(void **state) {
        struct env *e = *state;
        char err[256];
        struct sched_request *r = tokens_request(prompt, 11, 4, NULL);

        r->sampling.has_top_p = true;
        r->sampling.top_p = 0.0f;
        assert_int_equal(sched_validate(e->sched, r, err, sizeof err), SCHED_ERR_INVALID_ARGUMENT);
        assert_string_equal(err, "sampling.top_p: 0 is out of range (0, 1]");
        r->sampling.top_p = 1.0f;
        r->tokens[3] = 512;
        assert_int_equal(sched_validate(e->sched, r, err, sizeof err), SCHED_ERR_INVALID_ARGUMENT);
        assert_string_equal(err, "prompt.tokens[3]: id 512 is out of range [0, 512)");
        r->tokens[3] = 8;
        r->prompt = SCHED_PROMPT_TEXT;
        r->text = strdup("hi");
        /* no tokenizer was given to this scheduler */
        assert_int_equal(sched_validate(e->sched, r, err, sizeof err), SCHED_ERR_INVALID_ARGUMENT);
        assert_string_equal(err, "prompt.text: this model has no tokenizer, send token ids");
        /* the message count is capped before anything else looks at the messages */
        r->prompt = SCHED_PROMPT_CHAT;
        r->n_messages = 4097;
        r->messages = calloc(r->n_messages, sizeof *r->messages);
        assert_non_null(r->messages);
        assert_int_equal(sched_validate(e->sched, r, err, sizeof err), SCHED_ERR_INVALID_ARGUMENT);
        assert_string_equal(err, "prompt.chat.messages: 4097 messages, at most 4096 accepted");
        r->n_messages = 4096; /* at the cap: on to the next check */
        assert_int_equal(sched_validate(e->sched, r, err, sizeof err), SCHED_ERR_INVALID_ARGUMENT);
        assert_string_equal(err, "prompt.chat: this model has no tokenizer, send token ids");
        free(r->messages);
        r->messages = NULL;
        r->n_messages = 0;
        r->prompt = SCHED_PROMPT_TOKENS;
        r->snapshot = strdup("ok-name");
        assert_int_equal(sched_validate(e->sched, r, err, sizeof err), SCHED_ERR_UNAVAILABLE);
        assert_string_equal(err, "snapshot 'ok-name': this daemon has no state directory");
        free(r->snapshot);
        r->snapshot = NULL;
        r->logprobs = 21;
        assert_int_equal(sched_validate(e->sched, r, err, sizeof err), SCHED_ERR_INVALID_ARGUMENT);
        assert_string_equal(err, "logprobs: 21, at most 20 supported");
        r->logprobs = 0;
        /* constrained decoding needs a tokenizer (the mask is over token texts) */
        r->constraint = SCHED_CONSTRAINT_JSON_OBJECT;
        assert_int_equal(sched_validate(e->sched, r, err, sizeof err), SCHED_ERR_INVALID_ARGUMENT);
        assert_string_equal(err, "constraint: this model has no tokenizer, constrained decoding needs one");
        r->constraint = SCHED_CONSTRAINT_NONE;
        assert_int_equal(sched_validate(e->sched, r, err, sizeof err), 0);
        assert_int_equal(sched_snapshot_check_name(".hidden", err, sizeof err),
                         SCHED_ERR_INVALID_ARGUMENT);
        sched_request_free(r);
}

/* One request, run to its end. */
static void run_one(struct sched *s, const int32_t *ids, uint32_t n, uint32_t max_tokens,
                    struct outcome *o) {
        memset(o, 0, sizeof *o);
        assert_int_equal(sched_submit(s, tokens_request(ids, n, max_tokens, o), NULL), 0);
        run_until_final(s, o, 1);
        assert_int_equal(o->kind, SCHED_EVENT_DONE);
        assert_int_equal(o->n, max_tokens);
}

static void test_prefix_reuse_gives_identical_tokens(void **state) {
        struct env *e = *state;
        int32_t a[40], b[40];
        struct outcome cold, warm, head, other;
        struct sched_stats st;

        for (int i = 0; i < 40; i++) {
                a[i] = 5 + (i * 37) % 400;
                b[i] = i < 20 ? a[i] : 5 + (i * 11) % 400; /* shares 1 full page + 4 tokens */
        }
        run_one(e->sched, b, 40, 6, &other); /* b alone, before anything is stored */
        assert_int_equal(other.cached, 0);
        /* a fresh scheduler, so a's run starts from an empty store */
        teardown(state);
        setup(state);
        e = *state;
        run_one(e->sched, a, 40, 6, &cold);
        assert_int_equal(cold.cached, 0);
        /* pages of 16 tokens: 2 full pages of a's prompt come from the store */
        run_one(e->sched, a, 40, 6, &warm);
        assert_int_equal(warm.cached, 32);
        assert_memory_equal(warm.ids, cold.ids, 6 * sizeof *cold.ids);
        /* only the whole shared page is reused; the output is b's own */
        run_one(e->sched, b, 40, 6, &head);
        assert_int_equal(head.cached, 16);
        assert_memory_equal(head.ids, other.ids, 6 * sizeof *other.ids);
        sched_get_stats(e->sched, &st);
        assert_int_equal(st.prefix_hits, 2);
        assert_int_equal(st.prefix_misses, 1);
        assert_int_equal(st.prefix_tokens_reused, 48);
        assert_int_equal(st.pages_used, 0); /* pages only the store keeps are not "used" */
        assert_true(st.prefix_pages >= 2);
}

static void test_stored_pages_give_way_to_admission(void **state) {
        struct env *e = *state; /* 4 pages of 16 tokens */
        int32_t a[40], b[40];
        struct outcome oa, ob, again;
        struct sched_stats st;

        for (int i = 0; i < 40; i++) {
                a[i] = 5 + (i * 7) % 400;
                b[i] = 6 + (i * 13) % 400;
        }
        run_one(e->sched, a, 40, 6, &oa); /* 3 pages; 2 full ones stay in the store */
        sched_get_stats(e->sched, &st);
        assert_int_equal(st.prefix_pages, 2);
        run_one(e->sched, b, 40, 6, &ob); /* needs 3 of 4: one stored page is evicted */
        assert_int_equal(ob.cached, 0);
        run_one(e->sched, a, 40, 6, &again);
        assert_memory_equal(again.ids, oa.ids, 6 * sizeof *oa.ids);
        sched_get_stats(e->sched, &st);
        assert_int_equal(st.pages_used, 0);
        assert_true(st.prefix_pages <= 4);
}

/* Every request is counted once in total and once in how it ended (refused, failed, cancelled,
 * completed) or in flight: the sum holds in every snapshot, and a refusal for a full queue is
 * counted (it was counted nowhere; requests_total counted only admitted requests). */
static void expect_counts(struct sched *s, uint64_t total, uint64_t completed, uint64_t failed,
                          uint64_t cancelled, uint64_t refused, uint64_t queue_full, uint32_t in_flight) {
        struct sched_stats st;
        sched_get_stats(s, &st);
        assert_int_equal(st.total, st.completed + st.failed + st.cancelled + st.refused + st.in_flight);
        assert_int_equal(st.total, total);
        assert_int_equal(st.completed, completed);
        assert_int_equal(st.failed, failed);
        assert_int_equal(st.cancelled, cancelled);
        assert_int_equal(st.refused, refused);
        assert_int_equal(st.queue_full, queue_full);
        assert_int_equal(st.in_flight, in_flight);
}

static void test_request_counts_add_up(void **state) {
        struct env *e = *state; /* 4 running, 4 waiting */
        struct outcome o[9];
        uint64_t ids[8];

        memset(o, 0, sizeof o);
        for (int i = 0; i < 8; i++)
                assert_int_equal(sched_submit(e->sched, tokens_request(prompt, 11, 200, &o[i]), &ids[i]), 0);
        struct sched_request *full = tokens_request(prompt, 11, 200, &o[8]);
        assert_int_equal(sched_submit(e->sched, full, NULL), -EAGAIN);
        sched_request_free(full);
        sched_count_unsubmitted(e->sched, SCHED_ERR_INVALID_ARGUMENT); /* refused by validation */
        sched_count_unsubmitted(e->sched, SCHED_ERR_INTERNAL);         /* out of memory */
        expect_counts(e->sched, 11, 0, 1, 0, 2, 1, 8);
        for (int i = 0; i < 8; i++) /* running or still waiting: cancelled either way */
                assert_int_equal(sched_cancel(e->sched, ids[i]), 0);
        run_until_final(e->sched, o, 8);
        expect_counts(e->sched, 11, 0, 1, 8, 2, 1, 0);
        struct outcome one;
        memset(&one, 0, sizeof one);
        assert_int_equal(sched_submit(e->sched, tokens_request(prompt, 11, 2, &one), NULL), 0);
        run_until_final(e->sched, &one, 1);
        expect_counts(e->sched, 12, 1, 1, 8, 2, 1, 0);
}

static void test_drain_refuses_new_work(void **state) {
        struct env *e = *state;
        struct sched_request *r = tokens_request(prompt, 11, 4, NULL);

        sched_drain(e->sched, false);
        assert_int_equal(sched_submit(e->sched, r, NULL), -ESHUTDOWN);
        sched_request_free(r);
        expect_counts(e->sched, 1, 0, 0, 0, 1, 0, 0); /* counted, as refused */
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_generate_and_batch_invariance, setup, teardown),
                cmocka_unit_test_setup_teardown(test_cancel_frees_pages, setup, teardown),
                cmocka_unit_test_setup_teardown(test_page_budget, setup_small, teardown),
                cmocka_unit_test_setup_teardown(test_validation_messages, setup, teardown),
                cmocka_unit_test_setup_teardown(test_request_counts_add_up, setup, teardown),
                cmocka_unit_test_setup_teardown(test_drain_refuses_new_work, setup, teardown),
                cmocka_unit_test(test_default_prefill_chunk_follows_the_pass),
                cmocka_unit_test_setup_teardown(test_prefix_reuse_gives_identical_tokens, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_stored_pages_give_way_to_admission,
                                                setup_small, teardown),
        };
        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
