/* SPDX-License-Identifier: MIT */
/* The seam's forward and page contract (kernels/backend.h): x4_batch_check and x4_page_check give
 * one code and one message per kind of bad input, and the CPU backend refuses exactly with them
 * (the CUDA backend calls the same functions first; tests/gpu asserts its messages). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "model/xing4.h"
#include "common/log.h"

static const struct x4_batch_limits LIM = { .n_vocab = 512, .n_pages = 4, .page_tokens = 16 };

struct bad_case {
        const char *what;
        struct x4_seq seq;
        bool no_logits;
        int code;
        const char *msg;
};

static const int32_t toks_ok[3] = { 1, 2, 3 };
static const int32_t toks_vocab[3] = { 1, 512, 3 };
static const int32_t toks_neg[1] = { -7 };
static const uint32_t pages_ok[4] = { 0, 1, 2, 3 };
static const uint32_t pages_bad[2] = { 1, 4 };

static const struct bad_case CASES[] = {
        { "token id = vocab size", { toks_vocab, 3, 0, pages_ok, 1, X4_LOGITS_LAST }, false, -EINVAL,
          "sequence 1 token 1: id 512 outside the vocabulary, expected 0..511" },
        { "negative token id", { toks_neg, 1, 0, pages_ok, 1, X4_LOGITS_LAST }, false, -EINVAL,
          "sequence 1 token 0: id -7 outside the vocabulary, expected 0..511" },
        { "no tokens", { toks_ok, 0, 0, pages_ok, 1, X4_LOGITS_LAST }, false, -EINVAL,
          "sequence 1: n_tokens is 0, at least 1 expected" },
        { "logits mode 3", { toks_ok, 3, 0, pages_ok, 1, 3 }, false, -EINVAL,
          "sequence 1: logits mode 3, expected 0..2" },
        { "more prompt tokens than tokens", { toks_ok, 3, 0, pages_ok, 1, X4_LOGITS_LAST, X4_LOGITS_NONE, 4 },
          false, -EINVAL, "sequence 1: prompt_tokens 4, expected at most n_tokens (3)" },
        { "rows but no buffer", { toks_ok, 3, 0, pages_ok, 1, X4_LOGITS_ALL }, true, -EINVAL,
          "sequence 0: logits requested but no output buffer" },
        { "positions past the page table", { toks_ok, 3, 15, pages_ok, 1, X4_LOGITS_LAST }, false,
          -ERANGE, "sequence 1: positions up to 17 need 2 pages of 16 tokens, its page table has 1" },
        { "no page table", { toks_ok, 3, 0, NULL, 0, X4_LOGITS_LAST }, false, -ERANGE,
          "sequence 1: positions up to 2 need 1 pages of 16 tokens, its page table has 0" },
        { "page beyond the cache", { toks_ok, 3, 16, pages_bad, 2, X4_LOGITS_LAST }, false, -ERANGE,
          "sequence 1: page table entry 1 is page 4, the cache has 4 pages (0..3)" },
};

/* sequence 0 is always valid (its logits NONE unless the case is about the buffer) */
static int check_case(const struct bad_case *c, char *msg, size_t n) {
        float out[1];
        struct x4_seq seqs[2] = { { toks_ok, 2, 0, pages_ok, 1, X4_LOGITS_NONE }, c->seq };
        struct x4_batch b = { .seqs = seqs, .n_seqs = 2 };

        if (c->no_logits) {
                seqs[0] = c->seq;
                b.n_seqs = 1;
        }
        return x4_batch_check(&b, c->no_logits ? NULL : out, &LIM, msg, n);
}

static void test_batch_check_table(void **state) {
        char msg[256];

        (void) state;
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
                msg[0] = 0;
                int r = check_case(&CASES[i], msg, sizeof msg);
                print_message("%s -> %d %s\n", CASES[i].what, r, msg);
                assert_int_equal(r, CASES[i].code);
                assert_string_equal(msg, CASES[i].msg);
        }
        /* the empty batch, and a valid one */
        struct x4_batch empty = { .seqs = NULL, .n_seqs = 0 };
        assert_int_equal(x4_batch_check(&empty, NULL, &LIM, msg, sizeof msg), -EINVAL);
        assert_string_equal(msg, "batch has no sequences, at least 1 expected");
        /* the page boundary: positions 14..16 need a second page, 13..15 fit the first */
        struct x4_seq ok = { toks_ok, 3, 14, pages_ok, 1, X4_LOGITS_LAST };
        float out[1];
        assert_int_equal(x4_batch_check(&(struct x4_batch){ &ok, 1 }, out, &LIM, msg, sizeof msg),
                         -ERANGE);
        ok.pos0 = 13;
        assert_int_equal(x4_batch_check(&(struct x4_batch){ &ok, 1 }, out, &LIM, msg, sizeof msg), 0);
}

static void test_page_check(void **state) {
        char msg[160];

        (void) state;
        assert_int_equal(x4_page_check(3, 4, "read of", msg, sizeof msg), 0);
        assert_int_equal(x4_page_check(4, 4, "copy to", msg, sizeof msg), -ERANGE);
        assert_string_equal(msg, "copy to cache page 4: out of range, the cache has 4 pages (0..3)");
}

/* The CPU backend refuses every case with the same code and message, and keeps working. */
static void test_cpu_backend_agrees(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        struct x4_backend *b = NULL;
        char path[4096];
        const char *env = getenv("X4_FIXTURES");

        (void) state;
        snprintf(path, sizeof path, "%s/xing4-tiny-a/model.gguf", env && *env ? env : X4_FIXTURES);
        struct x4_model_params mp = { .path = path };
        assert_int_equal(x4_model_open(&mp, &m, NULL, 0), 0);
        struct x4_backend_params bp = { .n_threads = 1, .n_pages = LIM.n_pages,
                                        .page_tokens = LIM.page_tokens, .cache_type = X4_CACHE_F32 };
        /* create's refusal comes back as a value too */
        char why[256] = "";
        struct x4_backend_params bad = bp;
        bad.page_tokens = 0;
        assert_int_equal(x4_backend_cpu.create(m, &bad, &b, why, sizeof why), -EINVAL);
        assert_null(b);
        assert_string_equal(why, "cpu backend: page_tokens is 0, at least 1 expected");
        struct x4_backend_ops const *ops = NULL;
        assert_int_equal(x4_backend_get("tpu", &ops, why, sizeof why), -EINVAL);
        assert_string_equal(why, "unknown device 'tpu': expected cpu or cuda");
        assert_int_equal(x4_backend_cpu.create(m, &bp, &b, NULL, 0), 0);
        assert_int_equal(x4_model_config(m)->n_vocab, LIM.n_vocab);

        float *out = malloc(4 * LIM.n_vocab * sizeof(float));
        assert_non_null(out);
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
                struct x4_seq seqs[2] = { { toks_ok, 2, 0, pages_ok, 1, X4_LOGITS_NONE },
                                          CASES[i].seq };
                struct x4_batch bt = { .seqs = seqs, .n_seqs = 2 };
                if (CASES[i].no_logits) {
                        seqs[0] = CASES[i].seq;
                        bt.n_seqs = 1;
                }
                char err[256] = "";
                int r = x4_backend_cpu.forward(b, &bt, CASES[i].no_logits ? NULL : out, err, sizeof err);
                assert_int_equal(r, CASES[i].code);
                assert_string_equal(err, CASES[i].msg);
        }
        /* without a buffer the message is logged */
        assert_int_equal(x4_backend_cpu.page_read(b, 4, out, NULL, 0), -ERANGE);
        assert_string_equal(log_last_error(),
                            "read of cache page 4: out of range, the cache has 4 pages (0..3)");
        char err[256] = "";
        assert_int_equal(x4_backend_cpu.page_copy(b, 0, 9, err, sizeof err), -ERANGE);
        assert_string_equal(err, "copy from cache page 9: out of range, the cache has 4 pages (0..3)");
        /* still serving */
        struct x4_seq ok = { toks_ok, 3, 0, pages_ok, 1, X4_LOGITS_LAST };
        assert_int_equal(x4_backend_cpu.forward(b, &(struct x4_batch){ &ok, 1 }, out, NULL, 0), 0);
        x4_backend_cpu.destroy(b);
        free(out);
}

/* x4_host_alloc / x4_host_grow: a backend's own host allocator serves the output buffers when it
 * has one (the CUDA backend's page-locked memory), malloc when it has none (the CPU backend);
 * growing keeps the rows already written and frees through the same allocator. */
struct fake_host {
        unsigned allocs, frees;
};
static struct fake_host fake_host_state;

static void *fake_host_alloc(struct x4_backend *b, size_t bytes) {
        (void) b;
        fake_host_state.allocs++;
        return malloc(bytes);
}

static void fake_host_free(struct x4_backend *b, void *p) {
        (void) b;
        fake_host_state.frees++;
        free(p);
}

static void test_host_buffers(void **state) {
        (void) state;
        /* no allocator: malloc, and x4_host_free of NULL is nothing */
        float *p = NULL;
        size_t cap = 0;
        float *r = x4_host_grow(&x4_backend_cpu, NULL, &p, &cap, 4);
        assert_non_null(p);
        assert_ptr_equal(r, p);
        assert_int_equal(cap, 4);
        for (int i = 0; i < 4; i++)
                p[i] = (float) i + 0.5f;
        float *kept = p;
        assert_ptr_equal(x4_host_grow(&x4_backend_cpu, NULL, &p, &cap, 3), kept); /* big enough: kept */
        assert_int_equal(cap, 4);
        assert_non_null(x4_host_grow(&x4_backend_cpu, NULL, &p, &cap, 1000));
        assert_int_equal(cap, 1000);
        for (int i = 0; i < 4; i++)
                assert_true(p[i] == (float) i + 0.5f);
        x4_host_free(&x4_backend_cpu, NULL, p);
        x4_host_free(&x4_backend_cpu, NULL, NULL);
        /* an impossible size is refused and leaves the buffer as it was */
        p = NULL;
        cap = 0;
        assert_null(x4_host_grow(&x4_backend_cpu, NULL, &p, &cap, SIZE_MAX / 2));
        assert_null(p);
        assert_int_equal(cap, 0);

        /* a backend's own allocator: every buffer from it and back to it */
        struct x4_backend_ops ops = x4_backend_cpu;
        ops.host_alloc = fake_host_alloc;
        ops.host_free = fake_host_free;
        fake_host_state = (struct fake_host){ 0 };
        assert_non_null(x4_host_grow(&ops, NULL, &p, &cap, 8));
        p[7] = 7.0f;
        assert_non_null(x4_host_grow(&ops, NULL, &p, &cap, 64));
        assert_true(p[7] == 7.0f);
        x4_host_free(&ops, NULL, p);
        assert_int_equal(fake_host_state.allocs, 2);
        assert_int_equal(fake_host_state.frees, 2);
        void *q = x4_host_alloc(&ops, NULL, 16);
        assert_non_null(q);
        x4_host_free(&ops, NULL, q);
        assert_int_equal(fake_host_state.allocs, 3);
        assert_int_equal(fake_host_state.frees, 3);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_batch_check_table),
                cmocka_unit_test(test_page_check),
                cmocka_unit_test(test_cpu_backend_agrees),
                cmocka_unit_test(test_host_buffers),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
