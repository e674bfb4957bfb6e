/* SPDX-License-Identifier: MIT */
/* The CPU backend's route_trace hook (backend.h): what x4-gpu-check parity compares against the
 * CUDA backend's routing to explain logit misses, so it must report exactly what the forward
 * routed. On an x4-mkmodel model written at test time (preset PRESET below):
 *   - one call per MoE layer and new token of a forward, layer ids those of the MoE blocks,
 *     token = index in the batch's concatenated new tokens, counted across the backend's
 *     256-token micro-batches and across sequences of a batch;
 *   - `selected` is the top-k of `scores` in selection order, ties to the lower id (docs/model.md §5);
 *   - a sequence routes the same inside a batch as alone (same scores, bit for bit);
 *   - the logits are bit-identical with and without the hook. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "model/mkmodel.h"
#include "model/xing4.h"
#include "common/log.h"

#define PRESET "demo" /* 16 experts top-4 like the release's 64 top-4; 3 of its 4 blocks MoE */
#define PAGE_TOKENS 16u
#define N_PAGES 48u
#define N_LONG 300u  /* crosses the cpu backend's 256-token micro-batch */
#define N_A 40u      /* batch of two: 40 + 250 tokens, the cut falls inside the second */
#define N_B 250u

struct call {
        uint32_t layer, token;
        float scores[256];
        int32_t sel[16];
};

struct trace {
        struct call *calls;
        size_t n, cap;
        size_t overflow;          /* calls beyond cap */
        uint32_t bad_shape;       /* calls with n_expert / k not the model's */
        uint32_t n_expert, k;
};

struct fixture {
        char dir[64], gguf[128], config[128];
        struct x4_model *model;
        const struct x4_config *cfg;
        const struct x4_backend_ops *ops;
        struct x4_backend *plain, *traced;
        struct trace tr;
        uint32_t n_moe, moe_layers[64];
        int32_t prompt[N_LONG];
};

static void on_route(uint32_t layer, uint32_t token, const float *scores, uint32_t n_expert,
                     const int32_t *selected, uint32_t k, void *userdata) {
        struct trace *t = userdata;
        struct call *c;

        if (n_expert != t->n_expert || k != t->k || n_expert > 256 || k > 16) {
                t->bad_shape++;
                return;
        }
        if (t->n == t->cap) {
                t->overflow++;
                return;
        }
        c = &t->calls[t->n++];
        c->layer = layer;
        c->token = token;
        memcpy(c->scores, scores, n_expert * sizeof(float));
        memcpy(c->sel, selected, k * sizeof(int32_t));
}

static int setup(void **state) {
        struct fixture *f = calloc(1, sizeof *f);
        struct x4_mkmodel_shape shape;
        uint32_t rng = 777;

        assert_non_null(f);
        log_set_max_level(LOG_WARNING);
        snprintf(f->dir, sizeof f->dir, "/tmp/x4-test-route-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        snprintf(f->gguf, sizeof f->gguf, "%s/model.gguf", f->dir);
        snprintf(f->config, sizeof f->config, "%s/config.json", f->dir);
        assert_int_equal(x4_mkmodel_preset(PRESET, &shape), 0);
        assert_int_equal(x4_mkmodel_write(&shape, &(struct x4_mkmodel_options){ .out = f->gguf,
                                                                                  .seed = 11,
                                                                                  .threads = 1 }),
                         0);
        assert_int_equal(x4_model_open(&(struct x4_model_params){ .path = f->gguf }, &f->model, NULL, 0), 0);
        f->cfg = x4_model_config(f->model);
        for (uint32_t l = 0; l < f->cfg->n_layer; l++)
                if (x4_model_weights(f->model)->layers[l].ffn_gate_inp)
                        f->moe_layers[f->n_moe++] = l;
        assert_true(f->n_moe > 0 && f->n_moe < f->cfg->n_layer); /* dense blocks are skipped */

        f->tr.n_expert = f->cfg->n_expert;
        f->tr.k = f->cfg->n_expert_used;
        f->tr.cap = (size_t) f->n_moe * (N_LONG + 8);
        f->tr.calls = calloc(f->tr.cap, sizeof *f->tr.calls);
        assert_non_null(f->tr.calls);

        assert_int_equal(x4_backend_get("cpu", &f->ops, NULL, 0), 0);
        struct x4_backend_params bp = { .n_threads = 2, .page_tokens = PAGE_TOKENS,
                                        .n_pages = N_PAGES, .cache_type = X4_CACHE_F32 };
        assert_int_equal(f->ops->create(f->model, &bp, &f->plain, NULL, 0), 0);
        bp.route_trace = on_route;
        bp.route_trace_userdata = &f->tr;
        assert_int_equal(f->ops->create(f->model, &bp, &f->traced, NULL, 0), 0);

        for (uint32_t i = 0; i < N_LONG; i++) {
                rng = rng * 1103515245u + 12345u;
                f->prompt[i] = (int32_t) ((rng >> 8) % f->cfg->n_vocab);
        }
        *state = f;
        return 0;
}

static int teardown(void **state) {
        struct fixture *f = *state;

        f->ops->destroy(f->plain);
        f->ops->destroy(f->traced);
        x4_model_free(f->model);
        unlink(f->gguf);
        unlink(f->config);
        rmdir(f->dir);
        free(f->tr.calls);
        free(f);
        return 0;
}

static void trace_reset(struct trace *t) {
        t->n = 0;
        t->overflow = 0;
        t->bad_shape = 0;
}

/* Pages of sequence slot s: slot 0 uses pages 0.., slot 1 pages 24.. */
static void slot_pages(uint32_t s, uint32_t *pages, uint32_t n) {
        for (uint32_t i = 0; i < n; i++)
                pages[i] = s * (N_PAGES / 2) + i;
}

/* Both backends on the same batch; the logits must be bit-identical (rows: n_rows). */
static void forward_both(struct fixture *f, const struct x4_batch *batch, size_t n_rows) {
        size_t bytes = n_rows * f->cfg->n_vocab * sizeof(float);
        _cleanup_free_ float *a = malloc(bytes), *b = malloc(bytes);

        assert_non_null(a);
        assert_non_null(b);
        memset(a, 0, bytes);
        memset(b, 0xff, bytes);
        trace_reset(&f->tr);
        assert_int_equal(f->ops->forward(f->plain, batch, a, NULL, 0), 0);
        assert_int_equal(f->ops->forward(f->traced, batch, b, NULL, 0), 0);
        for (size_t r = 0; r < n_rows; r++)
                if (memcmp(a + r * f->cfg->n_vocab, b + r * f->cfg->n_vocab,
                           f->cfg->n_vocab * sizeof(float)) != 0)
                        fail_msg("logits row %zu differs with the route_trace hook set", r);
}

/* Every (MoE layer, token < n_tokens) exactly once, in the order the backend promises (per layer
 * tokens ascending: micro-batches run in batch order), and each selection the top-k of its scores
 * in descending order with ties to the lower id. */
static void check_calls(const struct fixture *f, uint32_t n_tokens) {
        const struct trace *t = &f->tr;
        const uint32_t E = f->cfg->n_expert, K = f->cfg->n_expert_used;
        _cleanup_free_ uint8_t *seen = calloc((size_t) f->cfg->n_layer * n_tokens, 1);
        int64_t last[64];

        assert_non_null(seen);
        assert_int_equal(t->bad_shape, 0);
        assert_int_equal(t->overflow, 0);
        assert_int_equal(t->n, (size_t) f->n_moe * n_tokens);
        for (uint32_t l = 0; l < 64; l++)
                last[l] = -1;
        for (size_t i = 0; i < t->n; i++) {
                const struct call *c = &t->calls[i];
                bool is_moe = false, taken[256] = { false };

                for (uint32_t m = 0; m < f->n_moe; m++)
                        is_moe |= f->moe_layers[m] == c->layer;
                if (!is_moe)
                        fail_msg("call %zu: layer %u is not an MoE block", i, c->layer);
                if (c->token >= n_tokens)
                        fail_msg("call %zu: token %u of a %u-token batch", i, c->token, n_tokens);
                if (seen[(size_t) c->layer * n_tokens + c->token]++)
                        fail_msg("layer %u token %u traced twice", c->layer, c->token);
                if ((int64_t) c->token <= last[c->layer])
                        fail_msg("layer %u: token %u after token %" PRId64, c->layer, c->token,
                                 last[c->layer]);
                last[c->layer] = c->token;

                /* the reference top-k: largest first, strict > keeps the lower id on ties */
                for (uint32_t k = 0; k < K; k++) {
                        int32_t best = -1;

                        for (uint32_t e = 0; e < E; e++)
                                if (!taken[e] && (best < 0 || c->scores[e] > c->scores[best]))
                                        best = (int32_t) e;
                        taken[best] = true;
                        if (c->sel[k] != best)
                                fail_msg("layer %u token %u: selected[%u] = %d, top-k of the scores "
                                         "says %d (%.9g vs %.9g)",
                                         c->layer, c->token, k, c->sel[k], best,
                                         c->sel[k] >= 0 && (uint32_t) c->sel[k] < E ?
                                                 c->scores[c->sel[k]] : -1.0f,
                                         c->scores[best]);
                }
        }
}

static const struct call *find_call(const struct trace *t, uint32_t layer, uint32_t token) {
        for (size_t i = 0; i < t->n; i++)
                if (t->calls[i].layer == layer && t->calls[i].token == token)
                        return &t->calls[i];
        return NULL;
}

/* 300 tokens in one call: two micro-batches (256 + 44), tokens 0..299 */
static void test_long_prompt(void **state) {
        struct fixture *f = *state;
        uint32_t pages[N_PAGES / 2];

        slot_pages(0, pages, DIV_ROUND_UP(N_LONG, PAGE_TOKENS));
        struct x4_seq s = { .tokens = f->prompt, .n_tokens = N_LONG, .pages = pages,
                            .n_pages = DIV_ROUND_UP(N_LONG, PAGE_TOKENS), .logits = X4_LOGITS_ALL };
        forward_both(f, &(struct x4_batch){ .seqs = &s, .n_seqs = 1 }, N_LONG);
        check_calls(f, N_LONG);
        /* the routing varies (mkmodel promises varied routing): not one fixed set for all */
        const struct call *c0 = find_call(&f->tr, f->moe_layers[0], 0);
        bool varied = false;
        for (uint32_t t = 1; t < N_LONG && !varied; t++)
                varied = memcmp(find_call(&f->tr, f->moe_layers[0], t)->sel, c0->sel,
                                f->cfg->n_expert_used * sizeof(int32_t)) != 0;
        assert_true(varied);

        /* then one decode step: one call per MoE layer, token 0 */
        struct x4_seq d = { .tokens = f->prompt + 7, .n_tokens = 1, .pos0 = N_LONG, .pages = pages,
                            .n_pages = DIV_ROUND_UP(N_LONG + 1, PAGE_TOKENS),
                            .logits = X4_LOGITS_LAST };
        forward_both(f, &(struct x4_batch){ .seqs = &d, .n_seqs = 1 }, 1);
        check_calls(f, 1);
}

/* Two sequences in one batch (40 + 250 tokens, the micro-batch cut inside the second): tokens
 * 0..289 in batch order, and the second sequence's token i (batch token 40 + i) routes exactly as
 * token i of that sequence alone. */
static void test_two_sequences(void **state) {
        struct fixture *f = *state;
        const uint32_t E = f->cfg->n_expert, K = f->cfg->n_expert_used;
        uint32_t pa[N_PAGES / 2], pb[N_PAGES / 2];
        _cleanup_free_ struct call *alone = NULL;
        size_t n_alone;

        slot_pages(0, pa, DIV_ROUND_UP(N_A, PAGE_TOKENS));
        slot_pages(1, pb, DIV_ROUND_UP(N_B, PAGE_TOKENS));
        struct x4_seq seqs[2] = {
                { .tokens = f->prompt, .n_tokens = N_A, .pages = pa,
                  .n_pages = DIV_ROUND_UP(N_A, PAGE_TOKENS), .logits = X4_LOGITS_ALL },
                { .tokens = f->prompt + N_A, .n_tokens = N_B, .pages = pb,
                  .n_pages = DIV_ROUND_UP(N_B, PAGE_TOKENS), .logits = X4_LOGITS_LAST },
        };

        /* the second sequence alone first */
        forward_both(f, &(struct x4_batch){ .seqs = &seqs[1], .n_seqs = 1 }, 1);
        check_calls(f, N_B);
        n_alone = f->tr.n;
        alone = malloc(n_alone * sizeof *alone);
        assert_non_null(alone);
        memcpy(alone, f->tr.calls, n_alone * sizeof *alone);

        forward_both(f, &(struct x4_batch){ .seqs = seqs, .n_seqs = 2 }, N_A + 1);
        check_calls(f, N_A + N_B);
        for (size_t i = 0; i < n_alone; i++) {
                const struct call *a = &alone[i];
                const struct call *b = find_call(&f->tr, a->layer, N_A + a->token);

                assert_non_null(b);
                if (memcmp(a->scores, b->scores, E * sizeof(float)) != 0 ||
                    memcmp(a->sel, b->sel, K * sizeof(int32_t)) != 0)
                        fail_msg("layer %u: sequence token %u routes differently as batch token %u",
                                 a->layer, a->token, N_A + a->token);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_long_prompt),
                cmocka_unit_test(test_two_sequences),
        };

        return cmocka_run_group_tests(tests, setup, teardown);
}
