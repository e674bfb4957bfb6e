/* SPDX-License-Identifier: MIT */
/* MTP on the CPU backend (docs/model.md §8, kernels/backend.h): the NextN layer's cache is one more
 * layer in every page only when MTP is on; hidden rows leave the logits as they were; a NextN
 * forward's rows do not depend on how its positions are chunked or batched; a model or a backend
 * without the block refuses MTP naming it. Parity with the float64 reference is tests/oracle. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "common/log.h"
#include "model/mkmodel.h"
#include "model/xing4.h"

#define PAGE_TOKENS 8u
#define N_PAGES 8u
#define N_TOK 21u

struct fixture {
        char dir[64], gguf[128], config[128], gguf0[128], config0[128];
        struct x4_model *model, *model0; /* with / without the NextN block */
        const struct x4_config *cfg;
        int32_t ids[N_TOK];
        uint32_t pages[N_PAGES], pages2[N_PAGES];
};

static int setup(void **state) {
        struct fixture *f = calloc(1, sizeof *f);
        struct x4_mkmodel_shape shape;
        uint32_t rng = 4242;

        assert_non_null(f);
        log_set_max_level(LOG_WARNING);
        snprintf(f->dir, sizeof f->dir, "/tmp/x4-test-mtp-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        snprintf(f->gguf, sizeof f->gguf, "%s/m.gguf", f->dir);
        snprintf(f->config, sizeof f->config, "%s/config.json", f->dir);
        snprintf(f->gguf0, sizeof f->gguf0, "%s/m0.gguf", f->dir);
        snprintf(f->config0, sizeof f->config0, "%s/config0.json", f->dir);
        assert_int_equal(x4_mkmodel_preset("tiny", &shape), 0);
        shape.n_nextn = 1;
        assert_int_equal(x4_mkmodel_write(&shape, &(struct x4_mkmodel_options){ .out = f->gguf,
                                                                                  .seed = 5,
                                                                                  .threads = 1 }),
                         0);
        shape.n_nextn = 0;
        assert_int_equal(x4_mkmodel_write(&shape, &(struct x4_mkmodel_options){
                                                          .out = f->gguf0, .config_out = f->config0,
                                                          .seed = 5, .threads = 1 }),
                         0);
        assert_int_equal(x4_model_open(&(struct x4_model_params){ .path = f->gguf }, &f->model, NULL, 0), 0);
        assert_int_equal(x4_model_open(&(struct x4_model_params){ .path = f->gguf0,
                                                                  .config_path = f->config0 },
                                       &f->model0, NULL, 0),
                         0);
        f->cfg = x4_model_config(f->model);
        assert_true(x4_model_weights(f->model)->has_nextn);
        assert_false(x4_model_weights(f->model0)->has_nextn);
        for (uint32_t i = 0; i < N_TOK; i++) {
                rng = rng * 1103515245u + 12345u;
                f->ids[i] = (int32_t) ((rng >> 8) % f->cfg->n_vocab);
        }
        for (uint32_t i = 0; i < N_PAGES; i++) {
                f->pages[i] = i;
                f->pages2[i] = N_PAGES - 1 - i;
        }
        *state = f;
        return 0;
}

static int teardown(void **state) {
        struct fixture *f = *state;

        x4_model_free(f->model);
        x4_model_free(f->model0);
        unlink(f->gguf);
        unlink(f->config);
        unlink(f->gguf0);
        unlink(f->config0);
        rmdir(f->dir);
        free(f);
        return 0;
}

static struct x4_backend *create(const struct x4_model *m, bool mtp, int expect) {
        struct x4_backend *b = NULL;
        struct x4_backend_params bp = { .n_threads = 2, .page_tokens = PAGE_TOKENS, .n_pages = N_PAGES,
                                        .cache_type = X4_CACHE_F32, .mtp = mtp };

        assert_int_equal(x4_backend_cpu.create(m, &bp, &b, NULL, 0), expect);
        return b;
}

/* Pages grow by exactly one layer with MTP on; a model without the block refuses MTP; a backend
 * created without MTP refuses a NextN forward; caps say which. */
static void test_pages_and_refusals(void **state) {
        struct fixture *f = *state;
        struct x4_backend *off = create(f->model, false, 0), *on = create(f->model, true, 0);
        struct x4_backend_caps caps;
        size_t per_layer = (size_t) PAGE_TOKENS * (f->cfg->kv_lora_rank + f->cfg->qk_rope) * sizeof(float);

        assert_int_equal(x4_backend_cpu.page_bytes(off), f->cfg->n_layer * per_layer);
        assert_int_equal(x4_backend_cpu.page_bytes(on), (f->cfg->n_layer + 1) * per_layer);
        x4_backend_cpu.caps(off, &caps);
        assert_false(caps.mtp);
        x4_backend_cpu.caps(on, &caps);
        assert_true(caps.mtp);

        float h[256] = { 0 }, out[1];
        struct x4_nextn_seq ns = { .seq = { .tokens = f->ids, .n_tokens = 1, .pos0 = 0, .pages = f->pages,
                                            .n_pages = 1, .logits = X4_LOGITS_NONE },
                                   .h = h };
        char err[256];

        /* errors as values: the reason comes back in err, and nothing is logged as an error */
        log_clear_last_error();
        err[0] = 0;
        assert_int_equal(x4_backend_cpu.nextn(off, &(struct x4_nextn_batch){ &ns, 1, NULL }, out, err,
                                              sizeof err),
                         -EOPNOTSUPP);
        assert_string_equal(err, "cpu backend: MTP (NextN forward): the backend was created without "
                                 "MTP (mtp off)");
        assert_string_equal(log_last_error(), "");
        /* NULL, 0: the backend logs the same text instead */
        assert_int_equal(x4_backend_cpu.nextn(off, &(struct x4_nextn_batch){ &ns, 1, NULL }, out, NULL, 0),
                         -EOPNOTSUPP);
        assert_string_equal(log_last_error(), err);
        assert_int_equal(x4_backend_cpu.nextn(on, &(struct x4_nextn_batch){ &ns, 1, NULL }, out, err,
                                              sizeof err),
                         0);
        /* hidden rows asked for with no buffer; a short buffer gets the text truncated */
        ns.seq.hidden = X4_LOGITS_LAST;
        assert_int_equal(x4_backend_cpu.nextn(on, &(struct x4_nextn_batch){ &ns, 1, NULL }, out, err,
                                              sizeof err),
                         -EINVAL);
        assert_string_equal(err, "cpu backend: sequence 0: hidden rows requested but no output buffer");
        assert_int_equal(x4_backend_cpu.nextn(on, &(struct x4_nextn_batch){ &ns, 1, NULL }, out, err, 12),
                         -EINVAL);
        assert_string_equal(err, "cpu backend");
        assert_int_equal(x4_backend_cpu.nextn(on, &(struct x4_nextn_batch){ &ns, 1, NULL }, out, NULL, 0),
                         -EINVAL);
        assert_string_equal(log_last_error(),
                            "cpu backend: sequence 0: hidden rows requested but no output buffer");

        assert_null(create(f->model0, true, -EOPNOTSUPP));
        assert_non_null(strstr(log_last_error(), "MTP needs the model's NextN block"));
        struct x4_backend *plain = create(f->model0, false, 0);
        x4_backend_cpu.destroy(plain);
        x4_backend_cpu.destroy(off);
        x4_backend_cpu.destroy(on);
}

/* Run the trunk over ids (all hidden rows, all logits rows) then the NextN rows of positions
 * 0..N_TOK-2, cut into `chunk`-position pieces; with `mate`, every NextN call carries a second
 * sequence (other pages) in front of it. */
static void run_mtp(struct fixture *f, struct x4_backend *b, uint32_t chunk, bool mate, float *logits,
                    float *hidden, float *draft, float *dhidden) {
        const size_t V = f->cfg->n_vocab, H = f->cfg->n_embd;
        struct x4_seq s = { .tokens = f->ids, .n_tokens = N_TOK, .pos0 = 0, .pages = f->pages,
                            .n_pages = N_PAGES, .logits = X4_LOGITS_ALL, .hidden = X4_LOGITS_ALL };
        assert_int_equal(x4_backend_cpu.forward(b, &(struct x4_batch){ &s, 1, hidden }, logits, NULL, 0), 0);

        float *scratch = malloc((chunk + 2) * V * sizeof(float)), *sh = malloc((chunk + 2) * H * sizeof(float));
        assert_non_null(scratch);
        assert_non_null(sh);
        for (uint32_t t0 = 0; t0 < N_TOK - 1; t0 += chunk) {
                uint32_t n = t0 + chunk <= N_TOK - 1 ? chunk : N_TOK - 1 - t0;
                struct x4_nextn_seq ns[2] = {
                        { .seq = { .tokens = f->ids + 1, .n_tokens = 2, .pos0 = 0, .pages = f->pages2,
                                   .n_pages = N_PAGES, .logits = X4_LOGITS_LAST, .hidden = X4_LOGITS_LAST },
                          .h = hidden },
                        { .seq = { .tokens = f->ids + t0 + 1, .n_tokens = n, .pos0 = t0, .pages = f->pages,
                                   .n_pages = N_PAGES, .logits = X4_LOGITS_ALL, .hidden = X4_LOGITS_ALL },
                          .h = hidden + (size_t) t0 * H },
                };
                struct x4_nextn_batch nb = { .seqs = mate ? ns : ns + 1, .n_seqs = mate ? 2 : 1, .hidden = sh };
                assert_int_equal(x4_backend_cpu.nextn(b, &nb, scratch, NULL, 0), 0);
                memcpy(draft + (size_t) t0 * V, scratch + (mate ? V : 0), n * V * sizeof(float));
                memcpy(dhidden + (size_t) t0 * H, sh + (mate ? H : 0), n * H * sizeof(float));
        }
        free(scratch);
        free(sh);
}

static void test_invariance(void **state) {
        struct fixture *f = *state;
        const size_t V = f->cfg->n_vocab, H = f->cfg->n_embd;
        struct x4_backend *off = create(f->model, false, 0), *on = create(f->model, true, 0);
        float *l0 = malloc(N_TOK * V * sizeof(float)), *l1 = malloc(N_TOK * V * sizeof(float));
        float *h1 = malloc(N_TOK * H * sizeof(float)), *h2 = malloc(N_TOK * H * sizeof(float));
        float *d1 = malloc(N_TOK * V * sizeof(float)), *d2 = malloc(N_TOK * V * sizeof(float));
        float *dh1 = malloc(N_TOK * H * sizeof(float)), *dh2 = malloc(N_TOK * H * sizeof(float));
        assert_true(l0 && l1 && h1 && h2 && d1 && d2 && dh1 && dh2);

        /* the trunk's logits are the same with MTP off and on, hidden rows asked for or not */
        struct x4_seq s = { .tokens = f->ids, .n_tokens = N_TOK, .pos0 = 0, .pages = f->pages,
                            .n_pages = N_PAGES, .logits = X4_LOGITS_ALL };
        assert_int_equal(x4_backend_cpu.forward(off, &(struct x4_batch){ &s, 1, NULL }, l0, NULL, 0), 0);
        run_mtp(f, on, N_TOK, false, l1, h1, d1, dh1);
        assert_memory_equal(l0, l1, N_TOK * V * sizeof(float));

        /* NextN rows: the same bits in one call, in chunks of 3, and with a batch-mate */
        run_mtp(f, on, 3, true, l1, h2, d2, dh2);
        assert_memory_equal(h1, h2, (N_TOK - 1) * H * sizeof(float));
        assert_memory_equal(d1, d2, (N_TOK - 1) * V * sizeof(float));
        assert_memory_equal(dh1, dh2, (N_TOK - 1) * H * sizeof(float));
        run_mtp(f, on, 1, false, l1, h2, d2, dh2);
        assert_memory_equal(d1, d2, (N_TOK - 1) * V * sizeof(float));

        free(l0), free(l1), free(h1), free(h2), free(d1), free(d2), free(dh1), free(dh2);
        x4_backend_cpu.destroy(off);
        x4_backend_cpu.destroy(on);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_pages_and_refusals),
                cmocka_unit_test(test_invariance),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
