/* SPDX-License-Identifier: MIT */
/* Determinism of the CPU backend (docs/design.md "Numerics"): a token's logits are BIT-identical
 * however the prompt is chunked (1, 3, 7, all at once, and across the backend's internal
 * micro-batch boundary), with 1 or 2 threads, whatever the batch-mates, and for decode steps vs
 * the rows of a one-batch prefill (prefill and decode share one absorbed attention code path),
 * for a sequence continued from copied / written-back cache pages, and with each ISA variant of
 * the kernels (portable, AVX2, AVX-512; decode steps on the fused kernels). Plus the refusals,
 * asserted by their messages. Runs on the xing4-tiny-a fixture (X4_TEST_FIXTURE names another
 * folder: xing4-tiny-a-q4km, the same model requantized to Q4_K_M by llama.cpp, puts the user
 * formats' kernels under the same contract), in the fp32 reference numerics or
 * (X4_TEST_CPU_MATH=fast) the fast ones, whose portable definitions stand in for the AVX-512 and
 * BF16-dot kernels in the ISA test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/quant.h"
#include "model/xing4.h"
#include "common/log.h"

#define PAGE_TOKENS 16u /* small pages, so sequences span several (non-contiguous) pages */
#define N_PAGES 64u
#define N_PROMPT 40u
#define N_LONG 300u /* crosses the cpu backend's 256-token micro-batch */

struct fixture {
        struct x4_model *model;
        const struct x4_backend_ops *ops;
        struct x4_backend *b1, *b2; /* 1 and 2 threads */
        uint32_t n_vocab;
        int32_t prompt[N_LONG];
        float *ref;      /* [N_PROMPT][vocab]: 1 thread, one batch */
        float *ref_long; /* [N_LONG][vocab] */
};

/* Pages of "sequence slot" k: interleaved with other slots' pages, in reverse order, so page
 * table lookups are really exercised. Slots 0, 1 and 2 never share a page; slots 3 and 4 reuse
 * pages of the others and are only used while those hold nothing still needed (a sequence
 * writes positions 0.. before it reads them). */
static void slot_pages(uint32_t k, uint32_t *pages, uint32_t n) {
        for (uint32_t i = 0; i < n; i++)
                pages[i] = N_PAGES - 1 - (i * 3 + k);
}

static int feed(struct fixture *f, struct x4_backend *b, const int32_t *tokens, uint32_t n,
                uint32_t pos0, const uint32_t *pages, uint32_t mode, float *out) {
        struct x4_seq seq = { .tokens = tokens, .n_tokens = n, .pos0 = pos0, .pages = pages,
                              .n_pages = DIV_ROUND_UP(pos0 + n, PAGE_TOKENS), .logits = mode };
        struct x4_batch batch = { .seqs = &seq, .n_seqs = 1 };

        return f->ops->forward(b, &batch, out, NULL, 0);
}

/* Prefill tokens[0..n) in chunks of `chunk` with logits for every row into out[n][vocab]. */
static void prefill_chunked(struct fixture *f, struct x4_backend *b, const int32_t *tokens,
                            uint32_t n, uint32_t chunk, uint32_t slot, float *out) {
        uint32_t pages[N_PAGES / 3];

        slot_pages(slot, pages, DIV_ROUND_UP(n, PAGE_TOKENS));
        for (uint32_t p = 0; p < n; p += chunk)
                assert_int_equal(feed(f, b, tokens + p, MIN(chunk, n - p), p, pages, X4_LOGITS_ALL,
                                      out + (size_t) p * f->n_vocab),
                                 0);
}

static void assert_rows_identical(const struct fixture *f, const float *a, const float *b,
                                  uint32_t rows, const char *what) {
        for (uint32_t r = 0; r < rows; r++)
                if (memcmp(a + (size_t) r * f->n_vocab, b + (size_t) r * f->n_vocab,
                           f->n_vocab * sizeof(float)) != 0)
                        fail_msg("%s: row %u differs from the one-batch 1-thread prefill", what, r);
}

static int setup(void **state) {
        struct fixture *f = calloc(1, sizeof *f);
        const char *env = getenv("X4_FIXTURES"), *name = getenv("X4_TEST_FIXTURE");
        char path[4096];
        uint32_t rng = 12345;

        assert_non_null(f);
        snprintf(path, sizeof path, "%s/%s/model.gguf", env && *env ? env : X4_FIXTURES,
                 name && *name ? name : "xing4-tiny-a");
        struct x4_model_params mp = { .path = path };
        assert_int_equal(x4_model_open(&mp, &f->model, NULL, 0), 0);
        f->n_vocab = x4_model_config(f->model)->n_vocab;
        assert_int_equal(x4_backend_get("cpu", &f->ops, NULL, 0), 0);
        /* X4_TEST_CPU_MATH=fast (meson's cpu-invariance-fast): the same bits contract for the
         * fast numerics */
        const char *math = getenv("X4_TEST_CPU_MATH");
        struct x4_backend_params bp = { .n_threads = 1, .page_tokens = PAGE_TOKENS,
                                        .n_pages = N_PAGES, .cache_type = X4_CACHE_F32,
                                        .cpu_math = math && !strcmp(math, "fast") ? X4_CPU_MATH_FAST :
                                                                                    X4_CPU_MATH_FP32 };
        assert_int_equal(f->ops->create(f->model, &bp, &f->b1, NULL, 0), 0);
        bp.n_threads = 2;
        assert_int_equal(f->ops->create(f->model, &bp, &f->b2, NULL, 0), 0);

        for (uint32_t i = 0; i < N_LONG; i++) {
                rng = rng * 1103515245u + 12345u;
                f->prompt[i] = (int32_t) ((rng >> 8) % f->n_vocab);
        }
        f->ref = malloc((size_t) N_PROMPT * f->n_vocab * sizeof(float));
        f->ref_long = malloc((size_t) N_LONG * f->n_vocab * sizeof(float));
        assert_non_null(f->ref);
        assert_non_null(f->ref_long);
        prefill_chunked(f, f->b1, f->prompt, N_PROMPT, N_PROMPT, 0, f->ref);
        prefill_chunked(f, f->b1, f->prompt, N_LONG, N_LONG, 0, f->ref_long);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        struct fixture *f = *state;

        f->ops->destroy(f->b1);
        f->ops->destroy(f->b2);
        x4_model_free(f->model);
        free(f->ref);
        free(f->ref_long);
        free(f);
        return 0;
}

static void test_chunking(void **state) {
        struct fixture *f = *state;
        _cleanup_free_ float *out = malloc((size_t) N_LONG * f->n_vocab * sizeof(float));
        static const uint32_t chunks[] = { 1, 3, 7, N_PROMPT };
        char what[64];

        assert_non_null(out);
        for (size_t i = 0; i < ELEMENTSOF(chunks); i++) {
                memset(out, 0, (size_t) N_PROMPT * f->n_vocab * sizeof(float));
                prefill_chunked(f, f->b1, f->prompt, N_PROMPT, chunks[i], 1, out);
                snprintf(what, sizeof what, "chunks of %u", chunks[i]);
                assert_rows_identical(f, f->ref, out, N_PROMPT, what);
        }
        /* 300 tokens at once cross the 256-token micro-batch; chunks of 7 never align with it */
        prefill_chunked(f, f->b1, f->prompt, N_LONG, 7, 1, out);
        assert_rows_identical(f, f->ref_long, out, N_LONG, "300 tokens in chunks of 7");
}

static void test_threads(void **state) {
        struct fixture *f = *state;
        _cleanup_free_ float *out = malloc((size_t) N_LONG * f->n_vocab * sizeof(float));

        assert_non_null(out);
        prefill_chunked(f, f->b2, f->prompt, N_PROMPT, N_PROMPT, 2, out);
        assert_rows_identical(f, f->ref, out, N_PROMPT, "2 threads, one batch");
        prefill_chunked(f, f->b2, f->prompt, N_PROMPT, 3, 2, out);
        assert_rows_identical(f, f->ref, out, N_PROMPT, "2 threads, chunks of 3");
        prefill_chunked(f, f->b2, f->prompt, N_LONG, N_LONG, 2, out);
        assert_rows_identical(f, f->ref_long, out, N_LONG, "2 threads, 300 tokens");
}

/* The sequence under test in the middle of a batch with two others of different lengths, one of
 * them a continuation (pos0 > 0) of an earlier prefill. */
static void test_batch_mates(void **state) {
        struct fixture *f = *state;
        const size_t V = f->n_vocab;
        _cleanup_free_ float *out = malloc((size_t) (17 + N_PROMPT + 1) * V * sizeof(float));
        _cleanup_free_ float *alone = malloc(V * sizeof(float));
        int32_t other[64];
        uint32_t pa[N_PAGES / 3], pb[N_PAGES / 3], pc[N_PAGES / 3];

        assert_non_null(out);
        assert_non_null(alone);
        for (uint32_t i = 0; i < ELEMENTSOF(other); i++)
                other[i] = (int32_t) ((i * 37 + 11) % f->n_vocab);
        slot_pages(0, pa, 4);
        slot_pages(1, pb, 4);
        slot_pages(2, pc, 4);

        for (int pass = 0; pass < 2; pass++) {
                struct x4_backend *b = pass ? f->b2 : f->b1;

                /* C: 29 tokens of history, prefilled alone */
                assert_int_equal(feed(f, b, other, 29, 0, pc, X4_LOGITS_NONE, NULL), 0);
                struct x4_seq seqs[3] = {
                        { .tokens = other + 30, .n_tokens = 17, .pos0 = 0, .pages = pb, .n_pages = 2,
                          .logits = X4_LOGITS_ALL },
                        { .tokens = f->prompt, .n_tokens = N_PROMPT, .pos0 = 0, .pages = pa,
                          .n_pages = 3, .logits = X4_LOGITS_ALL },
                        { .tokens = other + 29, .n_tokens = 1, .pos0 = 29, .pages = pc, .n_pages = 2,
                          .logits = X4_LOGITS_LAST },
                };
                struct x4_batch batch = { .seqs = seqs, .n_seqs = 3 };

                assert_int_equal(x4_batch_logits_rows(&batch), 17 + N_PROMPT + 1);
                assert_int_equal(f->ops->forward(b, &batch, out, NULL, 0), 0);
                assert_rows_identical(f, f->ref, out + 17 * V, N_PROMPT,
                                      pass ? "2 threads, between batch-mates" : "between batch-mates");
                /* and the continuation's row equals C decoding that token on its own */
                assert_int_equal(feed(f, b, other + 29, 1, 29, pc, X4_LOGITS_LAST, alone), 0);
                assert_memory_equal(alone, out + (17 + N_PROMPT) * V, V * sizeof(float));
        }
}

/* On 2 threads: the prompt's first n_pre tokens in one forward (last row only), then one token a
 * step up to n, each step's row into out at its position. */
static void prefill_then_decode(struct fixture *f, uint32_t n_pre, uint32_t n, const uint32_t *pages,
                                float *out) {
        assert_int_equal(feed(f, f->b2, f->prompt, n_pre, 0, pages, X4_LOGITS_LAST,
                              out + (size_t) (n_pre - 1) * f->n_vocab),
                         0);
        for (uint32_t p = n_pre; p < n; p++)
                assert_int_equal(feed(f, f->b2, f->prompt + p, 1, p, pages, X4_LOGITS_LAST,
                                      out + (size_t) p * f->n_vocab),
                                 0);
}

static void test_decode_vs_prefill(void **state) {
        struct fixture *f = *state;
        /* 30 tokens of prefill with only the last row, then one token per step like a decoder;
         * then the same at 260-300 positions: with the workers spinning (the -spin run of this
         * test, X4_CPU_SPIN=1) a one-token step's attention is split by head groups there */
        const struct {
                uint32_t slot, n_pre, n;
                const float *ref;
                const char *what;
        } cases[] = {
                { 3, 30, N_PROMPT, f->ref, "decode steps" },
                { 2, 260, N_LONG, f->ref_long, "decode steps at 260-300 positions, 2 threads" },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_free_ float *out = malloc((size_t) cases[i].n * f->n_vocab * sizeof(float));
                uint32_t pages[N_PAGES / 3];

                assert_non_null(out);
                slot_pages(cases[i].slot, pages, DIV_ROUND_UP(cases[i].n, PAGE_TOKENS));
                prefill_then_decode(f, cases[i].n_pre, cases[i].n, pages, out);
                size_t r0 = cases[i].n_pre - 1;
                assert_rows_identical(f, cases[i].ref + r0 * f->n_vocab, out + r0 * f->n_vocab,
                                      cases[i].n - r0, cases[i].what);
        }
}

/* Pages moved with page_copy / page_read / page_write (prefix store, snapshots) carry a
 * sequence's state exactly: continuing from the copies gives the same bits as continuing the
 * original, and as prefilling the whole prompt at once. */
static void test_pages(void **state) {
        struct fixture *f = *state;
        const size_t V = f->n_vocab;
        _cleanup_free_ float *ref = malloc((N_PROMPT + 1) * V * sizeof(float));
        _cleanup_free_ float *a = malloc(V * sizeof(float)), *b = malloc(V * sizeof(float));
        _cleanup_free_ float *c = malloc(V * sizeof(float));
        size_t bytes = f->ops->page_bytes(f->b2);
        _cleanup_free_ uint8_t *buf = malloc(bytes), *back = malloc(bytes);
        uint32_t pa[N_PAGES / 3], pb[N_PAGES / 3], pc[N_PAGES / 3];
        const uint32_t n_pg = DIV_ROUND_UP(N_PROMPT + 1, PAGE_TOKENS);

        assert_non_null(ref);
        assert_non_null(a);
        assert_non_null(b);
        assert_non_null(c);
        assert_non_null(buf);
        assert_non_null(back);
        /* a page holds every layer's 576-wide rows (here kv_lora 64 + rope 16) of 16 tokens */
        assert_int_equal(bytes, (size_t) x4_model_config(f->model)->n_layer * PAGE_TOKENS * 80 * 4);

        prefill_chunked(f, f->b2, f->prompt, N_PROMPT + 1, N_PROMPT + 1, 4, ref);
        slot_pages(0, pa, n_pg);
        slot_pages(1, pb, n_pg);
        slot_pages(2, pc, n_pg);
        assert_int_equal(feed(f, f->b2, f->prompt, N_PROMPT, 0, pa, X4_LOGITS_NONE, NULL), 0);
        for (uint32_t i = 0; i < DIV_ROUND_UP(N_PROMPT, PAGE_TOKENS); i++) {
                assert_int_equal(f->ops->page_copy(f->b2, pb[i], pa[i], NULL, 0), 0);
                assert_int_equal(f->ops->page_read(f->b2, pa[i], buf, NULL, 0), 0);
                assert_int_equal(f->ops->page_write(f->b2, pc[i], buf, NULL, 0), 0);
                assert_int_equal(f->ops->page_read(f->b2, pc[i], back, NULL, 0), 0);
                assert_memory_equal(buf, back, bytes);
        }
        /* token 40 continued from the original, the copy and the written-back pages */
        assert_int_equal(feed(f, f->b2, f->prompt + N_PROMPT, 1, N_PROMPT, pa, X4_LOGITS_LAST, a), 0);
        assert_int_equal(feed(f, f->b2, f->prompt + N_PROMPT, 1, N_PROMPT, pb, X4_LOGITS_LAST, b), 0);
        assert_int_equal(feed(f, f->b2, f->prompt + N_PROMPT, 1, N_PROMPT, pc, X4_LOGITS_LAST, c), 0);
        assert_memory_equal(a, ref + N_PROMPT * V, V * sizeof(float));
        assert_memory_equal(b, ref + N_PROMPT * V, V * sizeof(float));
        assert_memory_equal(c, ref + N_PROMPT * V, V * sizeof(float));

        /* pages the cache does not have */
        assert_int_equal(f->ops->page_read(f->b2, N_PAGES, buf, NULL, 0), -ERANGE);
        assert_string_equal(log_last_error(),
                            "read of cache page 64: out of range, the cache has 64 pages (0..63)");
        assert_int_equal(f->ops->page_copy(f->b2, 0, N_PAGES + 5, NULL, 0), -ERANGE);
        assert_string_equal(log_last_error(),
                            "copy from cache page 69: out of range, the cache has 64 pages (0..63)");
}

/* The kernels' ISA variants (portable, AVX2, AVX-512: quant.h) follow one summation order, so the
 * whole forward gives the same bits with each of them (on a CPU without AVX-512 / AVX2 the
 * request falls back to the best it has, and the comparison still holds). */
static void test_isa_variants(void **state) {
        struct fixture *f = *state;
        _cleanup_free_ float *out = malloc((size_t) N_PROMPT * f->n_vocab * sizeof(float));
        uint32_t pages[N_PAGES / 3];

        assert_non_null(out);
        for (int level = 0; level < 2; level++) {
                char what[64];

                snprintf(what, sizeof what, "%s kernels, chunks of 7", quant_set_simd(level));
                prefill_chunked(f, f->b2, f->prompt, N_PROMPT, 7, 1, out);
                assert_rows_identical(f, f->ref, out, N_PROMPT, what);
                /* decode steps take the fused kernels where the variant has them */
                slot_pages(2, pages, DIV_ROUND_UP(N_PROMPT, PAGE_TOKENS));
                for (uint32_t p = 0; p < N_PROMPT; p++)
                        assert_int_equal(feed(f, f->b1, f->prompt + p, 1, p, pages, X4_LOGITS_LAST,
                                              out + (size_t) p * f->n_vocab),
                                         0);
                snprintf(what, sizeof what, "%s kernels, decode steps", quant_set_simd(level));
                assert_rows_identical(f, f->ref, out, N_PROMPT, what);
        }
        quant_set_simd(2);
}

static void test_errors(void **state) {
        struct fixture *f = *state;
        _cleanup_free_ float *out = malloc(8 * (size_t) f->n_vocab * sizeof(float));
        int32_t bad[3] = { 5, 6, (int32_t) f->n_vocab };
        int32_t neg[1] = { -1 };
        uint32_t pages[4] = { 0, 1, 2, N_PAGES };
        struct x4_seq seqs[2] = {
                { .tokens = f->prompt, .n_tokens = 2, .pos0 = 0, .pages = pages, .n_pages = 1,
                  .logits = X4_LOGITS_LAST },
                { .tokens = bad, .n_tokens = 3, .pos0 = 0, .pages = pages + 1, .n_pages = 1,
                  .logits = X4_LOGITS_LAST },
        };
        struct x4_batch batch = { .seqs = seqs, .n_seqs = 2 };
        char want[128];

        assert_non_null(out);
        /* token id = vocab size, in the second sequence */
        assert_int_equal(f->ops->forward(f->b1, &batch, out, NULL, 0), -EINVAL);
        snprintf(want, sizeof want, "sequence 1 token 2: id %u outside the vocabulary, expected 0..%u",
                 f->n_vocab, f->n_vocab - 1);
        assert_string_equal(log_last_error(), want);

        seqs[1].tokens = neg;
        seqs[1].n_tokens = 1;
        assert_int_equal(f->ops->forward(f->b1, &batch, out, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "sequence 1 token 0: id -1 outside the vocabulary, expected 0..511");

        /* no tokens */
        seqs[1].n_tokens = 0;
        assert_int_equal(f->ops->forward(f->b1, &batch, out, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "sequence 1: n_tokens is 0, at least 1 expected");

        /* positions beyond the sequence's page table: pos 16 needs a second page */
        seqs[1].tokens = f->prompt;
        seqs[1].n_tokens = 2;
        seqs[1].pos0 = PAGE_TOKENS - 1;
        assert_int_equal(f->ops->forward(f->b1, &batch, out, NULL, 0), -ERANGE);
        assert_string_equal(log_last_error(),
                            "sequence 1: positions up to 16 need 2 pages of 16 tokens, its page table has 1");

        /* a page the cache does not have */
        seqs[1].pages = pages + 2;
        seqs[1].n_pages = 2;
        assert_int_equal(f->ops->forward(f->b1, &batch, out, NULL, 0), -ERANGE);
        assert_string_equal(log_last_error(),
                            "sequence 1: page table entry 1 is page 64, the cache has 64 pages (0..63)");

        /* an empty batch */
        batch.n_seqs = 0;
        assert_int_equal(f->ops->forward(f->b1, &batch, out, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "batch has no sequences, at least 1 expected");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_chunking),
                cmocka_unit_test(test_threads),
                cmocka_unit_test(test_batch_mates),
                cmocka_unit_test(test_decode_vs_prefill),
                cmocka_unit_test(test_pages),
                cmocka_unit_test(test_isa_variants),
                cmocka_unit_test(test_errors),
        };

        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, setup, teardown);
}
