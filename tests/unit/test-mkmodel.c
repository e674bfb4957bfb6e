/* SPDX-License-Identifier: MIT */
/* x4-mkmodel: the presets load through x4_model_open, are deterministic (seed, not threads,
 * decides the bytes), carry the documented weight statistics and vocabulary invariants, and the
 * `full` preset's table is the release's (docs/model.md §2.4), checked on a sparse --header-only file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cpu/quant.h"
#include "gguf/ggml.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/mkmodel.h"
#include "chat/tokenizer.h"
#include "model/xing4.h"
#include "common/log.h"

struct tmpdir {
        char dir[128], gguf[160], config[160];
};

static void tmp_make(struct tmpdir *t) {
        snprintf(t->dir, sizeof t->dir, "/tmp/x4-test-mkmodel-XXXXXX");
        assert_non_null(mkdtemp(t->dir));
        snprintf(t->gguf, sizeof t->gguf, "%s/model.gguf", t->dir);
        snprintf(t->config, sizeof t->config, "%s/config.json", t->dir);
}

static void tmp_remove(struct tmpdir *t) {
        unlink(t->gguf);
        unlink(t->config);
        assert_int_equal(rmdir(t->dir), 0);
}

static void write_preset(const char *preset, uint64_t seed, unsigned threads, bool header_only,
                         struct tmpdir *t) {
        struct x4_mkmodel_shape s;
        struct x4_mkmodel_options o = { .out = t->gguf, .seed = seed, .threads = threads,
                                        .header_only = header_only };

        assert_int_equal(x4_mkmodel_preset(preset, &s), 0);
        assert_int_equal(x4_mkmodel_write(&s, &o), 0);
}

/* 64-bit FNV-1a of a file from `offset` on */
static uint64_t file_hash_from(const char *path, uint64_t offset) {
        uint64_t h = 0xcbf29ce484222325ull;
        uint8_t buf[1 << 16];
        ssize_t n;
        int fd = open(path, O_RDONLY | O_CLOEXEC);

        assert_true(fd >= 0);
        assert_true(lseek(fd, (off_t) offset, SEEK_SET) == (off_t) offset);
        while ((n = read(fd, buf, sizeof buf)) > 0)
                for (ssize_t i = 0; i < n; i++)
                        h = (h ^ buf[i]) * 0x100000001b3ull;
        assert_int_equal(n, 0);
        close(fd);
        return h;
}

static uint64_t file_hash(const char *path) {
        return file_hash_from(path, 0);
}

static int open_model(const char *path, struct x4_model **ret) {
        struct x4_model_params p = { .path = path };
        log_clear_last_error();
        return x4_model_open(&p, ret, NULL, 0);
}

/* ---- tiny --------------------------------------------------------------------------------- */

static void test_tiny_loads_and_matches_fixture(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        _cleanup_(gguf_closep) struct gguf_file *fx = NULL;
        char fixture[4096];
        const char *fxdir = getenv("X4_FIXTURES");
        const struct gguf_file *g;
        struct tmpdir t;

        (void) state;
        tmp_make(&t);
        write_preset("tiny", 1, 2, false, &t);
        assert_int_equal(open_model(t.gguf, &m), 0);
        /* nothing to report: no unknown tensor, no missing NextN */
        assert_string_equal(log_last_error(), "");
        assert_string_equal(x4_model_config_source(m), t.config);
        assert_int_equal(x4_model_config(m)->n_layer, 3);
        assert_int_equal(x4_model_config(m)->n_dense, 1);
        assert_int_equal(x4_model_config(m)->n_vocab, 512);
        assert_float_equal(x4_model_config(m)->hc_clamp, 30, 0);

        /* the fixture's table exactly: names, order, types, shapes */
        snprintf(fixture, sizeof fixture, "%s/xing4-tiny-a/model.gguf", fxdir ? fxdir : X4_FIXTURES);
        assert_int_equal(gguf_open(fixture, &fx), 0);
        g = x4_model_gguf(m);
        assert_int_equal(gguf_tensor_count(g), gguf_tensor_count(fx));
        for (size_t i = 0; i < gguf_tensor_count(g); i++) {
                const struct gguf_tensor *a = gguf_tensor_at(g, i), *b = gguf_tensor_at(fx, i);
                assert_string_equal(a->name, b->name);
                assert_int_equal(a->type, b->type);
                assert_memory_equal(a->ne, b->ne, sizeof a->ne);
        }
        tmp_remove(&t);
}

/* FNV-1a 64 of the tensor data of `x4-mkmodel --preset tiny --seed 1` */
#define PINNED_TINY_SEED1_DATA_HASH 0xfdba00e093bf63aaull

static void test_deterministic(void **state) {
        struct tmpdir a, b, c;
        uint64_t ha, hb, hc;

        (void) state;
        tmp_make(&a);
        tmp_make(&b);
        tmp_make(&c);
        /* the seed decides the bytes, not the thread count */
        write_preset("tiny", 42, 1, false, &a);
        write_preset("tiny", 42, 3, false, &b);
        write_preset("tiny", 43, 2, false, &c);
        ha = file_hash(a.gguf);
        hb = file_hash(b.gguf);
        hc = file_hash(c.gguf);
        assert_true(ha == hb);
        assert_true(ha != hc);
        /* and the weights are pinned: `x4-mkmodel --preset tiny --seed 1` has the same tensor
         * data on every machine and build (no libm transcendentals, no FMA contraction). Only the
         * data section is hashed: the header carries the chat template, which has its own owner.
         * A deliberate change to the generator updates this number and says so in
         * tools/README.md. */
        struct tmpdir d;
        _cleanup_(gguf_closep) struct gguf_file *f = NULL;
        tmp_make(&d);
        write_preset("tiny", 1, 2, false, &d);
        assert_int_equal(gguf_open(d.gguf, &f), 0);
        assert_true(file_hash_from(d.gguf, gguf_data_offset(f)) == PINNED_TINY_SEED1_DATA_HASH);
        tmp_remove(&d);
        assert_true(file_hash(a.config) == file_hash(c.config));
        tmp_remove(&a);
        tmp_remove(&b);
        tmp_remove(&c);
}

/* ---- weight statistics (tools/README.md) ------------------------------------------------ */

static double tensor_std(const struct gguf_tensor *t, double *mean_ret, size_t max_values) {
        size_t n = (size_t) MIN(t->n_elements, (uint64_t) max_values);
        float *v;
        double s = 0, s2 = 0;

        n -= n % 256;
        if (n == 0)
                n = (size_t) t->n_elements;
        v = malloc(n * sizeof *v);
        assert_non_null(v);
        assert_int_equal(quant_dequantize_row(t->type, t->data, v, n), 0);
        for (size_t i = 0; i < n; i++) {
                s += v[i];
                s2 += (double) v[i] * v[i];
        }
        free(v);
        if (mean_ret)
                *mean_ret = s / (double) n;
        return sqrt(s2 / (double) n - (s / (double) n) * (s / (double) n));
}

static void test_weight_statistics(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        const struct x4_weights *w;
        const struct x4_layer_weights *L;
        struct tmpdir t;
        double mean, sd;
        const double H = 256;

        (void) state;
        tmp_make(&t);
        write_preset("tiny", 5, 2, false, &t);
        assert_int_equal(open_model(t.gguf, &m), 0);
        w = x4_model_weights(m);
        L = &w->layers[1];

        /* matrices: element std 1/sqrt(fan_in) within 15% (unit-variance in, unit-variance out) */
        sd = tensor_std(L->attn_q_a, &mean, 1 << 20);
        assert_float_equal(sd, 1 / sqrt(H), 0.15 / sqrt(H));
        sd = tensor_std(L->ffn_gate_exps, &mean, 1 << 20); /* IQ4_NL random blocks */
        assert_float_equal(sd, 1 / sqrt(H), 0.15 / sqrt(H));
        sd = tensor_std(L->ffn_down_exps, &mean, 1 << 20); /* fan_in 64 */
        assert_float_equal(sd, 1 / 8.0, 0.15 / 8.0);
        sd = tensor_std(w->output, &mean, 1 << 20); /* Q6_K, logits std ~2 */
        assert_float_equal(sd, 2 / sqrt(H), 0.3 / sqrt(H));
        sd = tensor_std(w->token_embd, &mean, 1 << 20);
        assert_float_equal(sd, 1.0, 0.05);
        sd = tensor_std(L->hc_attn_fn, &mean, 1 << 20);
        assert_float_equal(sd, 0.05, 0.005);
        sd = tensor_std(L->ffn_gate_inp, &mean, 1 << 20); /* router 1.6/sqrt(H) */
        assert_float_equal(sd, 1.6 / sqrt(H), 0.15 * 1.6 / sqrt(H));

        /* norms 1 ± 0.05, hc_scale (0.75, 1.25, -0.6) ± 10%, exp_probs_b a permutation of
         * linspace(-0.08, 0.08) */
        const float *norm = L->attn_norm->data;
        for (int i = 0; i < 256; i++)
                assert_true(norm[i] >= 0.95f && norm[i] <= 1.05f);
        const float *sc = L->hc_ffn_scale->data;
        assert_float_equal(sc[0], 0.75, 0.075 + 1e-6);
        assert_float_equal(sc[1], 1.25, 0.125 + 1e-6);
        assert_float_equal(sc[2], -0.6, 0.06 + 1e-6);
        const float *bias = L->exp_probs_b->data;
        float sorted[8];
        memcpy(sorted, bias, sizeof sorted);
        bool moved = false;
        for (int i = 0; i < 8; i++) {
                moved |= fabsf(bias[i] - (float) (-0.08 + 0.16 * i / 7)) > 1e-7f;
                for (int k = i + 1; k < 8; k++)
                        if (sorted[k] < sorted[i]) {
                                float x = sorted[i];
                                sorted[i] = sorted[k];
                                sorted[k] = x;
                        }
        }
        for (int i = 0; i < 8; i++)
                assert_float_equal(sorted[i], -0.08 + 0.16 * i / 7, 1e-7);
        assert_true(moved); /* shuffled */

        /* routing is varied (docs/model.md §5 selection: top-k of sigmoid(W f) + b): over 512 random
         * unit-variance inputs every one of the 8 experts is chosen, none hogs the top-2 */
        {
                const float *router = L->ffn_gate_inp->data;
                unsigned picked[8] = {};
                uint64_t seed = 12345;
                for (int tok = 0; tok < 512; tok++) {
                        double f[256], score[8];
                        for (int k = 0; k < 256; k++) {
                                /* Box-Muller from a 64-bit LCG */
                                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                                double u1 = ((seed >> 11) + 1) * 0x1.0p-53;
                                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                                double u2 = (seed >> 11) * 0x1.0p-53;
                                f[k] = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
                        }
                        for (int e = 0; e < 8; e++) {
                                double z = 0;
                                for (int k = 0; k < 256; k++)
                                        z += router[e * 256 + k] * f[k];
                                score[e] = 1 / (1 + exp(-z)) + bias[e];
                        }
                        for (int pick = 0; pick < 2; pick++) {
                                int best = -1;
                                for (int e = 0; e < 8; e++)
                                        if (score[e] > -1 && (best < 0 || score[e] > score[best]))
                                                best = e;
                                picked[best]++;
                                score[best] = -2;
                        }
                }
                for (int e = 0; e < 8; e++)
                        assert_true(picked[e] >= 1024 / 8 / 3 && picked[e] <= 1024 / 8 * 3);
        }
        tmp_remove(&t);
}

/* ---- demo --------------------------------------------------------------------------------- */

static void test_demo_loads_and_tokenizes(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        _cleanup_(tokenizer_freep) struct tokenizer *tok = NULL;
        const char *prompt = "What is the capital of France?";
        _cleanup_free_ int32_t *ids = NULL;
        _cleanup_free_ char *text = NULL;
        const struct x4_config *c;
        struct tmpdir t, t2;
        size_t n;

        (void) state;
        tmp_make(&t);
        write_preset("demo", 1, 2, false, &t);
        assert_int_equal(open_model(t.gguf, &m), 0);
        /* the NextN block is recognised: no warning about unknown or missing tensors */
        assert_string_equal(log_last_error(), "");
        c = x4_model_config(m);
        assert_int_equal(c->n_layer, 4);
        assert_int_equal(c->n_block, 5);
        assert_int_equal(c->n_nextn, 1);
        assert_int_equal(c->n_expert, 16);
        assert_int_equal(c->n_vocab, 4096);
        assert_non_null(gguf_tensor_find(x4_model_gguf(m), "blk.4.nextn.eh_proj.weight"));
        /* the block is in the table for MTP; the trunk is blocks 0..3 */
        assert_true(x4_model_weights(m)->has_nextn);
        assert_non_null(x4_model_weights(m)->nextn.shared_head_head);

        /* a real-looking vocabulary: the demo prompt is word pieces, and decodes back */
        assert_int_equal(tokenizer_load(t.gguf, &tok), 0);
        assert_int_equal(tokenizer_encode(tok, prompt, strlen(prompt), 0, &ids, &n, NULL, 0), 0);
        assert_true(n >= 6 && n <= 8);
        assert_int_equal(tokenizer_decode(tok, ids, n, 0, &text, NULL), 0);
        assert_string_equal(text, prompt);

        /* the weight statistics keep activations O(1): through the CPU reference forward, every
         * logit is finite and each row's std is ~2 (tools/README.md), and the rows differ */
        {
                const struct x4_backend_ops *ops = &x4_backend_cpu;
                struct x4_backend_params bp = { .n_threads = 2, .page_tokens = 16, .n_pages = 1 };
                struct x4_backend *be = NULL;
                const uint32_t page = 0;
                int32_t prompt[12];
                float *logits = malloc(12 * 4096 * sizeof *logits);
                uint32_t distinct = 0, argmax[12];

                assert_non_null(logits);
                for (int k = 0; k < 12; k++)
                        prompt[k] = ids[k % n];
                prompt[11] = 3000;
                struct x4_seq seq = { .tokens = prompt, .n_tokens = 12, .pos0 = 0, .pages = &page,
                                      .n_pages = 1, .logits = X4_LOGITS_ALL };
                struct x4_batch batch = { .seqs = &seq, .n_seqs = 1 };
                assert_int_equal(ops->create(m, &bp, &be, NULL, 0), 0);
                assert_int_equal(ops->forward(be, &batch, logits, NULL, 0), 0);
                for (int row = 0; row < 12; row++) {
                        double sum = 0, sum2 = 0;
                        const float *l = logits + (size_t) row * 4096;
                        argmax[row] = 0;
                        for (int v = 0; v < 4096; v++) {
                                assert_true(isfinite(l[v]));
                                sum += l[v];
                                sum2 += (double) l[v] * l[v];
                                if (l[v] > l[argmax[row]])
                                        argmax[row] = (uint32_t) v;
                        }
                        double sd = sqrt(sum2 / 4096 - (sum / 4096) * (sum / 4096));
                        assert_true(sd > 1.5 && sd < 2.5);
                        bool seen = false;
                        for (int k = 0; k < row; k++)
                                seen |= argmax[k] == argmax[row];
                        distinct += !seen;
                }
                assert_true(distinct >= 4);
                ops->destroy(be);
                free(logits);
        }

        /* deterministic at this size too */
        tmp_make(&t2);
        write_preset("demo", 1, 1, false, &t2);
        assert_true(file_hash(t.gguf) == file_hash(t2.gguf));
        tmp_remove(&t2);
        tmp_remove(&t);
}

/* ---- a user's quantization: the llama.cpp formats beyond the release's ------------------------ */

/* The routed experts a forward chose, per token and layer (the backend's route trace). */
#define UQ_TOKENS 16u
#define UQ_TIE 0.02f /* the first flips seen: margins of 7e-4 to 1e-2 */
struct route_log {
        uint64_t set[UQ_TOKENS][16];  /* [token][layer]: the chosen experts' bits */
        float margin[UQ_TOKENS][16]; /* the last chosen score less the best of the others */
};

static void route_log_add(uint32_t layer, uint32_t token, const float *scores, uint32_t n_expert,
                          const int32_t *selected, uint32_t k, void *userdata) {
        struct route_log *r = userdata;
        float last = INFINITY, other = -INFINITY;
        uint64_t set = 0;

        assert_true(token < UQ_TOKENS && layer < 16 && n_expert <= 64);
        for (uint32_t i = 0; i < k; i++) {
                set |= 1ull << selected[i];
                last = fminf(last, scores[selected[i]]);
        }
        for (uint32_t e = 0; e < n_expert; e++)
                if (!(set >> e & 1))
                        other = fmaxf(other, scores[e]);
        r->set[token][layer] = set;
        r->margin[token][layer] = last - other;
}

/* A demo-shaped model in the formats llama-quantize writes (Q4_K_M-like: Q4_K FFN and head; Q5_0
 * attention; and the others) loads, its matrices have the generated statistics through the CPU's
 * dequantization, and the CPU forward gives finite logits of the usual spread, in both numerics.
 * The fast numerics (the integer products of every quantized format, where the CPU has them) stay
 * within 3e-2 × max|logit| of the reference's for every one-token sequence both route to the same
 * experts. A changed choice moves a random model's logits by up to 20% (top-k routing, not the
 * products), so it is allowed only at a near tie: where a sequence's routes first differ, the
 * reference's last chosen score led the best other by less than UQ_TIE. */
static void test_user_quant_types(void **state) {
        static const uint32_t cfg[][3] = { /* attention, FFN, output */
                { GGML_TYPE_Q5_0, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K },
                { GGML_TYPE_Q4_1, GGML_TYPE_Q5_K, GGML_TYPE_IQ4_XS },
                { GGML_TYPE_Q5_1, GGML_TYPE_Q4_0, GGML_TYPE_Q5_K },
                { GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K },
        };
        const size_t V = 4096;

        (void) state;
        for (size_t ci = 0; ci < ELEMENTSOF(cfg); ci++) {
                const char *names[3] = { ggml_type_name(cfg[ci][0]), ggml_type_name(cfg[ci][1]),
                                         ggml_type_name(cfg[ci][2]) };
                _cleanup_(x4_model_freep) struct x4_model *m = NULL;
                _cleanup_free_ float *logits = malloc(2 * UQ_TOKENS * V * sizeof *logits);
                struct route_log routes[2];
                struct x4_mkmodel_shape s;
                struct tmpdir t;
                double mean, sd;

                assert_non_null(logits);
                memset(routes, 0, sizeof routes);
                tmp_make(&t);
                assert_int_equal(x4_mkmodel_preset("demo", &s), 0);
                s.type_attn = cfg[ci][0], s.type_ffn = cfg[ci][1], s.type_output = cfg[ci][2];
                struct x4_mkmodel_options o = { .out = t.gguf, .seed = 3, .threads = 2 };
                assert_int_equal(x4_mkmodel_write(&s, &o), 0);
                assert_int_equal(open_model(t.gguf, &m), 0);
                const struct x4_weights *w = x4_model_weights(m);
                const struct x4_layer_weights *L = &w->layers[1];
                assert_int_equal(L->attn_q_a->type, cfg[ci][0]);
                assert_int_equal(L->ffn_gate_exps->type, cfg[ci][1]);
                assert_int_equal(w->output->type, cfg[ci][2]);
                assert_true(x4_model_config(m)->n_layer <= 16 && x4_model_config(m)->n_expert_used <= 8);
                assert_int_equal(x4_model_config(m)->n_vocab, V);
                /* element std 1/sqrt(fan_in) within 25%, mean near 0 */
                sd = tensor_std(L->attn_q_a, &mean, 1 << 20);
                assert_float_equal(sd, 1 / sqrt(512.0), 0.25 / sqrt(512.0));
                assert_true(fabs(mean) < 0.2 * sd);
                sd = tensor_std(L->ffn_gate_exps, &mean, 1 << 20);
                assert_float_equal(sd, 1 / sqrt(512.0), 0.25 / sqrt(512.0));
                assert_true(fabs(mean) < 0.2 * sd);
                sd = tensor_std(L->ffn_down_exps, &mean, 1 << 20); /* fan_in 256 */
                assert_float_equal(sd, 1 / 16.0, 0.25 / 16.0);

                for (unsigned cm = X4_CPU_MATH_FP32; cm <= X4_CPU_MATH_FAST; cm++) {
                        const struct x4_backend_ops *ops = &x4_backend_cpu;
                        struct x4_backend_params bp = { .n_threads = 2, .page_tokens = 16, .n_pages = UQ_TOKENS,
                                                        .cpu_math = cm, .route_trace = route_log_add,
                                                        .route_trace_userdata = &routes[cm] };
                        struct x4_backend *be = NULL;
                        int32_t tokens[UQ_TOKENS];
                        uint32_t pages[UQ_TOKENS];
                        struct x4_seq seqs[UQ_TOKENS];
                        float *out = logits + cm * UQ_TOKENS * V;

                        for (uint32_t i = 0; i < UQ_TOKENS; i++) {
                                tokens[i] = (int32_t) (77 + 251 * i);
                                pages[i] = i;
                                seqs[i] = (struct x4_seq) { .tokens = tokens + i, .n_tokens = 1, .pages = pages + i,
                                                            .n_pages = 1, .logits = X4_LOGITS_ALL };
                        }
                        struct x4_batch batch = { .seqs = seqs, .n_seqs = UQ_TOKENS };
                        assert_int_equal(ops->create(m, &bp, &be, NULL, 0), 0);
                        assert_int_equal(ops->forward(be, &batch, out, NULL, 0), 0);
                        ops->destroy(be);
                        for (uint32_t row = 0; row < UQ_TOKENS; row++) {
                                double sum = 0, sum2 = 0;
                                const float *l = out + (size_t) row * V;
                                for (size_t v = 0; v < V; v++) {
                                        assert_true(isfinite(l[v]));
                                        sum += l[v];
                                        sum2 += (double) l[v] * l[v];
                                }
                                double rsd = sqrt(sum2 / V - (sum / V) * (sum / V));
                                if (!(rsd > 1.0 && rsd < 3.0))
                                        fail_msg("%s/%s/%s numerics %u row %u: logit std %g, about 2 expected",
                                                 names[0], names[1], names[2], cm, row, rsd);
                        }
                }
                tmp_remove(&t);
                double amax = 0, dmax = 0;
                uint32_t same = 0, n_layer = x4_model_config(m)->n_layer;
                for (uint32_t row = 0; row < UQ_TOKENS; row++) {
                        uint32_t l = 0;
                        while (l < n_layer && routes[0].set[row][l] == routes[1].set[row][l])
                                l++;
                        if (l < n_layer) { /* routed differently from layer l on: a near tie there */
                                if (getenv("X4_TEST_VERBOSE"))
                                        print_message("  token %u: layer %u routed differently, margin %.3g\n", row, l,
                                                      routes[0].margin[row][l]);
                                if (!(routes[0].margin[row][l] < UQ_TIE))
                                        fail_msg("%s/%s/%s token %u: the fast numerics chose other experts at layer %u, "
                                                 "where the reference's margin was %g",
                                                 names[0], names[1], names[2], row, l, routes[0].margin[row][l]);
                                continue;
                        }
                        same++;
                        for (size_t v = 0; v < V; v++) {
                                double r = logits[row * V + v], f = logits[(UQ_TOKENS + row) * V + v];
                                amax = fmax(amax, fabs(r));
                                dmax = fmax(dmax, fabs(f - r));
                        }
                }
                if (getenv("X4_TEST_VERBOSE"))
                        print_message("%s/%s/%s: %u of %u routed alike, fast - fp32 %.3g of max|logit| %.3g\n",
                                      names[0], names[1], names[2], same, UQ_TOKENS, dmax, amax);
                if (same < UQ_TOKENS / 4)
                        fail_msg("%s/%s/%s: only %u of %u tokens routed alike: too few to compare", names[0], names[1],
                                 names[2], same, UQ_TOKENS);
                if (!(dmax <= 3e-2 * amax))
                        fail_msg("%s/%s/%s: the fast numerics are %g from the reference, max|logit| %g", names[0],
                                 names[1], names[2], dmax, amax);
        }
}

/* ---- vocabulary invariants (docs/model.md §7) ------------------------------------------------ */

static void check_vocab(uint32_t n_vocab) {
        struct x4_mkmodel_vocab v;
        uint32_t n_normal = 0;

        assert_int_equal(x4_mkmodel_vocab_build(n_vocab, &v), 0);
        assert_int_equal(v.n, n_vocab);
        assert_string_equal(v.pieces[0], "<_unk>");
        assert_int_equal(v.types[0], 2);
        assert_string_equal(v.pieces[1], "<_start>");
        assert_string_equal(v.pieces[2], "<_end>");
        assert_string_equal(v.pieces[3], "<_pad>");
        assert_string_equal(v.pieces[7], "<_observation>");
        assert_string_equal(v.pieces[9], "<think>");
        assert_string_equal(v.pieces[14], "</tool_response>");
        assert_string_equal(v.pieces[23], "<_control9>");
        for (int i = 1; i < 24; i++)
                assert_int_equal(v.types[i], 3);
        for (int i = 24; i < 140; i++)
                assert_int_equal(v.types[i], 4);
        assert_string_equal(v.pieces[24], "0");
        assert_string_equal(v.pieces[140], "<0x00>");
        assert_string_equal(v.pieces[395], "<0xFF>");
        for (int i = 140; i < 396; i++)
                assert_int_equal(v.types[i], 6);
        assert_string_equal(v.pieces[396], "\xe2\x96\x81");

        for (uint32_t i = 396; i < v.n; i++) {
                size_t len = strlen(v.pieces[i]);
                if (v.types[i] != 1)
                        continue;
                /* unique scores, falling with the id */
                assert_float_equal(v.scores[i], -(float) n_normal, 0);
                n_normal++;
                /* a multi-character piece is two shorter NORMAL pieces (BPE reachability) */
                size_t first = 1;
                while (first < len && ((uint8_t) v.pieces[i][first] & 0xc0) == 0x80)
                        first++;
                if (first == len)
                        continue; /* one character */
                bool ok = false;
                for (size_t cut = 1; cut < len && !ok; cut++) {
                        bool left = false, right = false;
                        for (uint32_t k = 396; k < i && !(left && right); k++) {
                                if (v.types[k] != 1)
                                        continue;
                                left |= strlen(v.pieces[k]) == cut && memcmp(v.pieces[k], v.pieces[i], cut) == 0;
                                right |= streq(v.pieces[k], v.pieces[i] + cut);
                        }
                        ok = left && right;
                }
                if (!ok)
                        fail_msg("piece %u \"%s\" is not the merge of two earlier pieces", i, v.pieces[i]);
        }
        /* no padding needed below the word list's capacity */
        assert_int_equal(n_normal, n_vocab - 396 - 0);
        for (uint32_t i = 0; i < v.n; i++)
                for (uint32_t k = i + 1; k < v.n; k++)
                        assert_false(streq(v.pieces[i], v.pieces[k]));
        x4_mkmodel_vocab_free(&v);
}

static void test_vocab(void **state) {
        (void) state;
        check_vocab(512);
        check_vocab(4096);
}

/* ---- full, header only ------------------------------------------------------------------- */

static void test_full_header_only(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        const struct gguf_file *g;
        struct tmpdir t;
        struct stat st;
        uint64_t count[GGML_TYPE_COUNT] = {}, bytes[GGML_TYPE_COUNT] = {};
        uint64_t trunk_n = 0, trunk_b = 0, nextn_n = 0, nextn_b = 0;
        const double GiB = 1024.0 * 1024 * 1024;

        (void) state;
        tmp_make(&t);
        write_preset("full", 1, 0, true, &t);
        assert_int_equal(stat(t.gguf, &st), 0);
        /* 18.72 GiB of tensors + ~3.9 MB of metadata, almost all of it a hole */
        assert_true(st.st_size > 20100000000ll && st.st_size < 20110000000ll);
        assert_true((uint64_t) st.st_blocks * 512 < 64u << 20);

        assert_int_equal(open_model(t.gguf, &m), 0);
        assert_string_equal(log_last_error(), "");
        g = x4_model_gguf(m);
        assert_int_equal(gguf_tensor_count(g), 977);
        for (size_t i = 0; i < gguf_tensor_count(g); i++) {
                const struct gguf_tensor *tt = gguf_tensor_at(g, i);
                count[tt->type]++;
                bytes[tt->type] += tt->size;
                if (strncmp(tt->name, "blk.40.", 7) == 0) {
                        nextn_n++;
                        nextn_b += tt->size;
                } else {
                        trunk_n++;
                        trunk_b += tt->size;
                }
        }
        /* docs/model.md §2.4 type histogram, to the decimals given there */
        assert_int_equal(count[GGML_TYPE_IQ4_NL], 243);
        assert_float_equal(round(bytes[GGML_TYPE_IQ4_NL] / GiB * 1e4) / 1e4, 15.2309, 1e-9);
        assert_int_equal(count[GGML_TYPE_BF16], 327);
        assert_float_equal(round(bytes[GGML_TYPE_BF16] / GiB * 1e4) / 1e4, 3.0959, 1e-9);
        assert_int_equal(count[GGML_TYPE_F32], 406);
        assert_float_equal(round(bytes[GGML_TYPE_F32] / GiB * 1e4) / 1e4, 0.0347, 1e-9);
        assert_int_equal(count[GGML_TYPE_Q6_K], 1);
        assert_float_equal(round(bytes[GGML_TYPE_Q6_K] / GiB * 1e4) / 1e4, 0.3589, 1e-9);
        assert_int_equal(trunk_n, 953);
        assert_float_equal(round(trunk_b / GiB * 1e3) / 1e3, 17.786, 1e-9);
        assert_int_equal(nextn_n, 24);
        assert_float_equal(round(nextn_b / GiB * 1e4) / 1e4, 0.9344, 1e-9);

        /* docs/model.md §7: "▁" at the release's id, the padding before it */
        const struct gguf_value *tokens;
        struct gguf_string gs;
        assert_int_equal(gguf_get_array(g, "tokenizer.ggml.tokens", &tokens), 0);
        assert_int_equal(tokens->arr.n, 131072);
        assert_int_equal(gguf_array_get_string(tokens, 124361, &gs), 0);
        assert_int_equal(gs.len, 3);
        assert_memory_equal(gs.data, "\xe2\x96\x81", 3);
        assert_int_equal(gguf_array_get_string(tokens, 124360, &gs), 0);
        assert_int_equal(gs.len, strlen("<unused124360>"));
        assert_memory_equal(gs.data, "<unused124360>", gs.len);

        /* docs/model.md §1 / §4.1 */
        const struct x4_config *c = x4_model_config(m);
        assert_int_equal(c->n_layer, 40);
        assert_int_equal(c->n_block, 41);
        assert_int_equal(c->n_dense, 2);
        assert_int_equal(c->n_vocab, 131072);
        assert_int_equal(c->qk_nope, 128);
        assert_float_equal(c->attn_scale, 0.14467963, 5e-8);
        assert_int_equal(x4_model_weights(m)->layers[39].ffn_down_exps->ne[2], 64);
        assert_int_equal(x4_model_weights(m)->layers[1].ffn_gate->type, GGML_TYPE_IQ4_NL);
        assert_int_equal(x4_model_weights(m)->output->type, GGML_TYPE_Q6_K);
        x4_model_free(TAKE_PTR(m));
        tmp_remove(&t);
}

/* ---- refusals ----------------------------------------------------------------------------- */

static void test_bad_shapes(void **state) {
        struct x4_mkmodel_shape s;
        struct tmpdir t;
        struct x4_mkmodel_options o = { .seed = 1 };

        (void) state;
        log_clear_last_error();
        assert_int_equal(x4_mkmodel_preset("huge", &s), -EINVAL);
        assert_string_equal(log_last_error(), "mkmodel: unknown preset \"huge\"; tiny, demo or full expected");

        tmp_make(&t);
        o.out = t.gguf;
        assert_int_equal(x4_mkmodel_preset("tiny", &s), 0);
        s.n_dense = 4;
        assert_int_equal(x4_mkmodel_write(&s, &o), -EINVAL);
        assert_string_equal(log_last_error(), "mkmodel: 4 dense blocks, at most the 3 layers expected");

        assert_int_equal(x4_mkmodel_preset("tiny", &s), 0);
        s.n_embd = 200; /* not a whole number of Q6_K blocks (256) */
        assert_int_equal(x4_mkmodel_write(&s, &o), -EINVAL);
        assert_string_equal(log_last_error(), "mkmodel: tensor output.weight: rows of 200 values are not whole "
                                              "Q6_K blocks (256 values); change the shape or the type flags");

        /* a custom shape with other types loads */
        assert_int_equal(x4_mkmodel_preset("tiny", &s), 0);
        s.n_embd = 128, s.n_expert = 4, s.type_ffn = GGML_TYPE_Q8_0, s.type_output = GGML_TYPE_F16,
        s.type_attn = GGML_TYPE_F32;
        assert_int_equal(x4_mkmodel_write(&s, &o), 0);
        {
                _cleanup_(x4_model_freep) struct x4_model *m = NULL;
                assert_int_equal(open_model(t.gguf, &m), 0);
                assert_int_equal(x4_model_config(m)->n_embd, 128);
                assert_int_equal(x4_model_weights(m)->layers[2].ffn_up_exps->type, GGML_TYPE_Q8_0);
        }
        tmp_remove(&t);
}

/* ---- the CLI -------------------------------------------------------------------------------- */

/* Run x4-mkmodel with args; returns the exit status, output (stdout+stderr) in out. */
static int run_cli(const char *args, char *out, size_t size) {
        const char *bdir = getenv("X4_BUILD_DIR");
        char cmd[2048];
        FILE *p;
        size_t n;
        int status;

        if (!bdir)
                skip();
        snprintf(cmd, sizeof cmd, "'%s/tools/x4-mkmodel' %s 2>&1", bdir, args);
        p = popen(cmd, "r");
        assert_non_null(p);
        n = fread(out, 1, size - 1, p);
        out[n] = 0;
        status = pclose(p);
        assert_true(WIFEXITED(status));
        return WEXITSTATUS(status);
}

static void test_cli(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        struct x4_model_params p = {};
        struct tmpdir t;
        char args[1024], out[4096], cfg[256];

        (void) state;
        tmp_make(&t);
        snprintf(cfg, sizeof cfg, "%s/cfg.json", t.dir);
        /* flags override the preset whatever their order; --config-out names the config */
        snprintf(args, sizeof args, "--hidden 512 --preset tiny --experts 4 --seed 9 --threads 2 --quiet "
                 "--out %s --config-out %s", t.gguf, cfg);
        assert_int_equal(run_cli(args, out, sizeof out), 0);
        assert_string_equal(out, "");
        p.path = t.gguf;
        p.config_path = cfg;
        assert_int_equal(x4_model_open(&p, &m, NULL, 0), 0);
        assert_int_equal(x4_model_config(m)->n_embd, 512);
        assert_int_equal(x4_model_config(m)->n_expert, 4);
        assert_int_equal(x4_model_config(m)->n_layer, 3);
        unlink(cfg);

        assert_int_equal(run_cli("--preset huge --out /nonexistent/x.gguf", out, sizeof out), 2);
        assert_non_null(strstr(out, "unknown preset \"huge\"; tiny, demo or full expected"));
        assert_int_equal(run_cli("--hidden 12x --out /nonexistent/x.gguf", out, sizeof out), 2);
        assert_non_null(strstr(out, "--hidden: \"12x\" is not an unsigned 32-bit integer"));
        assert_int_equal(run_cli("--ffn-type Q4_X --out /nonexistent/x.gguf", out, sizeof out), 2);
        assert_non_null(strstr(out, "--ffn-type: unknown type \"Q4_X\""));
        assert_int_equal(run_cli("--ffn-type Q2_K --out /nonexistent/x.gguf", out, sizeof out), 1);
        assert_non_null(strstr(out, "mkmodel: type Q2_K: one of F32, F16, BF16, Q8_0, Q6_K, IQ4_NL, Q4_0"));
        /* the tiny preset's 64-value expert rows cannot hold 256-value blocks */
        assert_int_equal(run_cli("--ffn-type Q4_K --out /nonexistent/x.gguf", out, sizeof out), 1);
        assert_non_null(strstr(out, "tensor blk.1.ffn_down_exps.weight: rows of 64 values are not whole Q4_K blocks (256 values)"));
        assert_int_equal(run_cli("--out /nonexistent/x.gguf", out, sizeof out), 1);
        assert_non_null(strstr(out, "/nonexistent/x.gguf: cannot create: No such file or directory"));
        assert_int_equal(run_cli("--preset tiny", out, sizeof out), 2);
        assert_non_null(strstr(out, "--out FILE.gguf is required"));
        tmp_remove(&t);
}

/* ---- config.json next to another model ------------------------------------------------------ */

static void write_text(const char *path, const char *text) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        assert_int_equal(fputs(text, f) >= 0, 1);
        assert_int_equal(fclose(f), 0);
}

static char *read_text(const char *path) {
        static char buf[1 << 16];
        FILE *f = fopen(path, "r");
        size_t n;
        assert_non_null(f);
        n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        return buf;
}

/* A config.json that x4-mkmodel did not write (the release's, next to a real checkpoint) is not
 * replaced, and nothing is written, unless --force; its own (marked, or an unmarked one from
 * before the marker) is rewritten. */
static void test_config_json_not_replaced(void **state) {
        static const char foreign[] = "{\"model_type\": \"xing4_0\", \"hidden_size\": 3584}\n";
        struct x4_mkmodel_shape s;
        struct x4_mkmodel_options o = { .seed = 1, .threads = 2 };
        struct tmpdir t;
        struct stat st;
        char args[1024], out[4096], legacy[1 << 16];

        (void) state;
        tmp_make(&t);
        o.out = t.gguf;
        assert_int_equal(x4_mkmodel_preset("tiny", &s), 0);

        write_text(t.config, foreign);
        log_clear_last_error();
        assert_int_equal(x4_mkmodel_write(&s, &o), -EEXIST);
        assert_non_null(strstr(log_last_error(), t.config));
        assert_non_null(strstr(log_last_error(), "was not written by x4-mkmodel"));
        assert_string_equal(read_text(t.config), foreign);
        assert_int_equal(stat(t.gguf, &st), -1); /* refused before the model was written */
        assert_int_equal(errno, ENOENT);

        /* the CLI says how to go on, and --force replaces it */
        snprintf(args, sizeof args, "--preset tiny --quiet --threads 2 --out %s", t.gguf);
        assert_int_equal(run_cli(args, out, sizeof out), 1);
        assert_non_null(strstr(out, "--force replaces it"));
        assert_string_equal(read_text(t.config), foreign);
        snprintf(args, sizeof args, "--preset tiny --quiet --threads 2 --force --out %s", t.gguf);
        assert_int_equal(run_cli(args, out, sizeof out), 0);
        assert_non_null(strstr(read_text(t.config), "\"generated_by\": \"x4-mkmodel\""));

        /* its own file is rewritten for another shape (the marked one), and one written before
         * the marker existed (the same bytes without that line) is recognised too */
        s.n_embd = 512;
        assert_int_equal(x4_mkmodel_write(&s, &o), 0);
        assert_non_null(strstr(read_text(t.config), "\"hidden_size\": 512,"));
        snprintf(legacy, sizeof legacy, "%s", read_text(t.config));
        char *m = strstr(legacy, "  \"generated_by\": \"x4-mkmodel\",\n");
        assert_non_null(m);
        memmove(m, m + strlen("  \"generated_by\": \"x4-mkmodel\",\n"),
                strlen(m + strlen("  \"generated_by\": \"x4-mkmodel\",\n")) + 1);
        write_text(t.config, legacy);
        assert_int_equal(x4_mkmodel_write(&s, &o), 0);
        assert_non_null(strstr(read_text(t.config), "\"generated_by\": \"x4-mkmodel\""));
        /* but an edited unmarked file is someone else's */
        legacy[1] = ' ';
        write_text(t.config, legacy);
        assert_int_equal(x4_mkmodel_write(&s, &o), -EEXIST);
        tmp_remove(&t);
}

/* ---- the GGUF writer (gguf/gguf_writer.h), read back by the reader ------------------- */

static void test_gguf_writer_roundtrip(void **state) {
        _cleanup_(gguf_writer_freep) struct gguf_writer *w = NULL;
        _cleanup_(gguf_closep) struct gguf_file *f = NULL;
        const char *strs[3] = { "a", "", "\xe2\x96\x81x" };
        const float fa[3] = { 1.5f, -2.0f, 0.25f };
        const int32_t ia[2] = { -7, 9 };
        const uint64_t ne1[1] = { 64 }, ne2[2] = { 64, 3 }, ne3[3] = { 32, 2, 2 };
        const struct gguf_value *arr;
        struct gguf_string gs;
        struct tmpdir t;
        uint64_t u;
        int64_t i;
        double d;
        bool b;
        float data1[64];
        uint8_t data2[64 / 32 * 18 * 3];

        (void) state;
        tmp_make(&t);
        assert_int_equal(gguf_writer_new(&w), 0);
        assert_int_equal(gguf_writer_set_alignment(w, 64), 0);
        assert_int_equal(gguf_writer_add_u8(w, "k.u8", 200), 0);
        assert_int_equal(gguf_writer_add_i8(w, "k.i8", -100), 0);
        assert_int_equal(gguf_writer_add_u16(w, "k.u16", 60000), 0);
        assert_int_equal(gguf_writer_add_i16(w, "k.i16", -30000), 0);
        assert_int_equal(gguf_writer_add_u32(w, "k.u32", 4000000000u), 0);
        assert_int_equal(gguf_writer_add_i32(w, "k.i32", -2000000000), 0);
        assert_int_equal(gguf_writer_add_u64(w, "k.u64", UINT64_MAX - 1), 0);
        assert_int_equal(gguf_writer_add_i64(w, "k.i64", INT64_MIN + 1), 0);
        assert_int_equal(gguf_writer_add_f32(w, "k.f32", 0.1f), 0);
        assert_int_equal(gguf_writer_add_f64(w, "k.f64", 0.1), 0);
        assert_int_equal(gguf_writer_add_bool(w, "k.bool", true), 0);
        assert_int_equal(gguf_writer_add_string(w, "k.str", "hello"), 0);
        assert_int_equal(gguf_writer_add_string_array(w, "k.strs", strs, 3), 0);
        assert_int_equal(gguf_writer_add_array(w, "k.f32s", GGUF_TYPE_FLOAT32, fa, 3), 0);
        assert_int_equal(gguf_writer_add_array(w, "k.i32s", GGUF_TYPE_INT32, ia, 2), 0);
        assert_int_equal(gguf_writer_add_u32(w, "k.gone", 1), 0);
        assert_int_equal(gguf_writer_remove_kv(w, "k.gone"), 0);
        assert_int_equal(gguf_writer_remove_kv(w, "k.gone"), -ENOENT);
        log_clear_last_error();
        assert_int_equal(gguf_writer_add_u32(w, "k.u8", 1), -EEXIST);
        assert_string_equal(log_last_error(), "gguf writer: key k.u8 added twice");

        assert_int_equal(gguf_writer_add_tensor(w, "t.f32", GGML_TYPE_F32, 1, ne1), 0);
        assert_int_equal(gguf_writer_add_tensor(w, "t.iq4", GGML_TYPE_IQ4_NL, 2, ne2), 1);
        assert_int_equal(gguf_writer_add_tensor(w, "t.bf16", GGML_TYPE_BF16, 3, ne3), 2);
        assert_int_equal(gguf_writer_add_tensor(w, "t.bad", GGML_TYPE_Q6_K, 1, ne1), -EINVAL);
        assert_string_equal(log_last_error(), "gguf writer: tensor t.bad: type Q6_K cannot hold rows of 64 values");
        assert_int_equal(gguf_writer_set_alignment(w, 32), -EBUSY);
        assert_int_equal(gguf_writer_tensor_size(w, 1), 3 * 2 * 18);
        for (size_t k = 0; k < 3; k++)
                assert_int_equal(gguf_writer_tensor_file_offset(w, k) % 64, 0);

        for (int k = 0; k < 64; k++)
                data1[k] = (float) k;
        memset(data2, 0x5a, sizeof data2);
        assert_int_equal(gguf_writer_write_file(w, t.gguf, (const void *[]){ data1, data2, NULL }), 0);

        assert_int_equal(gguf_open(t.gguf, &f), 0);
        assert_int_equal(gguf_version(f), 3);
        assert_int_equal(gguf_alignment(f), 64);
        assert_int_equal(gguf_data_offset(f), gguf_writer_data_offset(w));
        assert_int_equal(gguf_file_size(f), gguf_writer_file_size(w));
        assert_int_equal(gguf_kv_count(f), 16); /* 15 + general.alignment */
        assert_int_equal(gguf_get_u64(f, "k.u8", &u), 0);
        assert_int_equal(u, 200);
        assert_int_equal(gguf_get_i64(f, "k.i8", &i), 0);
        assert_int_equal(i, -100);
        assert_int_equal(gguf_get_u64(f, "k.u16", &u), 0);
        assert_int_equal(u, 60000);
        assert_int_equal(gguf_get_i64(f, "k.i16", &i), 0);
        assert_int_equal(i, -30000);
        assert_int_equal(gguf_get_u64(f, "k.u32", &u), 0);
        assert_int_equal(u, 4000000000u);
        assert_int_equal(gguf_get_i64(f, "k.i32", &i), 0);
        assert_int_equal(i, -2000000000);
        assert_int_equal(gguf_get_u64(f, "k.u64", &u), 0);
        assert_true(u == UINT64_MAX - 1);
        assert_int_equal(gguf_get_i64(f, "k.i64", &i), 0);
        assert_true(i == INT64_MIN + 1);
        assert_int_equal(gguf_get_f64(f, "k.f32", &d), 0);
        assert_true(d == (double) 0.1f);
        assert_int_equal(gguf_get_f64(f, "k.f64", &d), 0);
        assert_true(d == 0.1);
        assert_int_equal(gguf_get_bool(f, "k.bool", &b), 0);
        assert_true(b);
        assert_int_equal(gguf_get_string(f, "k.str", &gs), 0);
        assert_int_equal(gs.len, 5);
        assert_memory_equal(gs.data, "hello", 5);
        assert_int_equal(gguf_get_array(f, "k.strs", &arr), 0);
        assert_int_equal(arr->arr.n, 3);
        for (uint64_t k = 0; k < 3; k++) {
                assert_int_equal(gguf_array_get_string(arr, k, &gs), 0);
                assert_int_equal(gs.len, strlen(strs[k]));
                assert_memory_equal(gs.data, strs[k], gs.len);
        }
        assert_int_equal(gguf_get_array(f, "k.f32s", &arr), 0);
        assert_int_equal(gguf_array_get_f64(arr, 2, &d), 0);
        assert_true(d == 0.25);
        assert_int_equal(gguf_get_array(f, "k.i32s", &arr), 0);
        assert_int_equal(gguf_array_get_i64(arr, 0, &i), 0);
        assert_int_equal(i, -7);
        assert_null(gguf_kv_find(f, "k.gone"));

        assert_int_equal(gguf_tensor_count(f), 3);
        const struct gguf_tensor *t0 = gguf_tensor_find(f, "t.f32"), *t1 = gguf_tensor_find(f, "t.iq4"),
                                 *t2 = gguf_tensor_find(f, "t.bf16");
        assert_memory_equal(t0->data, data1, sizeof data1);
        assert_int_equal(t1->ne[1], 3);
        assert_memory_equal(t1->data, data2, sizeof data2);
        assert_int_equal(t2->n_dims, 3);
        assert_int_equal(t2->ne[2], 2);
        assert_int_equal(t2->size, 32 * 2 * 2 * 2);
        for (uint64_t k = 0; k < t2->size; k++) /* never written: zeros */
                assert_int_equal(((const uint8_t *) t2->data)[k], 0);
        tmp_remove(&t);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_tiny_loads_and_matches_fixture),
                cmocka_unit_test(test_deterministic),
                cmocka_unit_test(test_weight_statistics),
                cmocka_unit_test(test_demo_loads_and_tokenizes),
                cmocka_unit_test(test_user_quant_types),
                cmocka_unit_test(test_vocab),
                cmocka_unit_test(test_full_header_only),
                cmocka_unit_test(test_bad_shapes),
                cmocka_unit_test(test_cli),
                cmocka_unit_test(test_config_json_not_replaced),
                cmocka_unit_test(test_gguf_writer_roundtrip),
        };

        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
