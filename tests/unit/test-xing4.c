/* SPDX-License-Identifier: MIT */
/* x4_model_open: the fixture loads with its config's values; every corruption a user can make
 * (truncated file, wrong type/shape/name, disagreeing or missing config.json, bad metadata) is
 * refused with a message naming the cause. Corrupt models are the fixture rewritten through the
 * GGUF writer with one edit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/ggml.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/mkmodel.h"
#include "model/xing4.h"
#include "common/log.h"

static char fixture_dir[3072], fixture_gguf[4096], fixture_config[4096];

/* ---- helpers ------------------------------------------------------------------------------ */

static char *read_text(const char *path, size_t *len) {
        FILE *f = fopen(path, "re");
        char *buf;
        long n;

        assert_non_null(f);
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        n = ftell(f);
        rewind(f);
        buf = malloc((size_t) n + 1);
        assert_non_null(buf);
        assert_int_equal(fread(buf, 1, (size_t) n, f), (size_t) n);
        buf[n] = 0;
        fclose(f);
        if (len)
                *len = (size_t) n;
        return buf;
}

static void write_bytes(const char *path, const void *data, size_t n) {
        FILE *f = fopen(path, "we");
        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, n, f), n);
        assert_int_equal(fclose(f), 0);
}

/* config.json of the fixture with `from` replaced by `to` (which must occur once). */
static void write_config(const char *path, const char *from, const char *to) {
        _cleanup_free_ char *text = read_text(fixture_config, NULL);
        char *p = from ? strstr(text, from) : NULL;
        FILE *f = fopen(path, "we");

        assert_non_null(f);
        if (from) {
                assert_non_null(p);
                fprintf(f, "%.*s%s%s", (int) (p - text), text, to, p + strlen(from));
        } else
                fputs(text, f);
        assert_int_equal(fclose(f), 0);
}

struct edit {
        const char *drop_key;
        const char *set_u32_key; /* replace this key's value with a u32 */
        uint32_t set_u32;
        const char *set_str_key;
        const char *set_str;
        const char *tensor; /* the tensor the next fields apply to */
        const char *rename;
        int64_t type;       /* -1: keep */
        uint32_t n_dims;    /* 0: keep */
        uint64_t ne[GGUF_MAX_DIMS];
        const char *extra_tensor; /* add an F32 [16] tensor of this name */
        bool drop_tensor;         /* leave `tensor` out */
};

/* Rewrite `src` to `dst` through gguf_writer with one edit. */
static void rewrite_gguf(const char *src, const char *dst, const struct edit *e) {
        _cleanup_(gguf_closep) struct gguf_file *f = NULL;
        _cleanup_(gguf_writer_freep) struct gguf_writer *w = NULL;
        const void **data;
        size_t n_tensors;

        assert_int_equal(gguf_open(src, &f), 0);
        assert_int_equal(gguf_writer_new(&w), 0);
        for (size_t i = 0; i < gguf_kv_count(f); i++) {
                const struct gguf_kv *kv = gguf_kv_at(f, i);
                const struct gguf_value *v = &kv->value;
                int r = 0;

                if (streq(kv->key, e->drop_key))
                        continue;
                if (streq(kv->key, e->set_u32_key)) {
                        assert_int_equal(gguf_writer_add_u32(w, kv->key, e->set_u32), 0);
                        continue;
                }
                if (streq(kv->key, e->set_str_key)) {
                        assert_int_equal(gguf_writer_add_string(w, kv->key, e->set_str), 0);
                        continue;
                }
                switch (v->type) {
                case GGUF_TYPE_UINT8: r = gguf_writer_add_u8(w, kv->key, (uint8_t) v->u64); break;
                case GGUF_TYPE_INT8: r = gguf_writer_add_i8(w, kv->key, (int8_t) v->i64); break;
                case GGUF_TYPE_UINT16: r = gguf_writer_add_u16(w, kv->key, (uint16_t) v->u64); break;
                case GGUF_TYPE_INT16: r = gguf_writer_add_i16(w, kv->key, (int16_t) v->i64); break;
                case GGUF_TYPE_UINT32: r = gguf_writer_add_u32(w, kv->key, (uint32_t) v->u64); break;
                case GGUF_TYPE_INT32: r = gguf_writer_add_i32(w, kv->key, (int32_t) v->i64); break;
                case GGUF_TYPE_UINT64: r = gguf_writer_add_u64(w, kv->key, v->u64); break;
                case GGUF_TYPE_INT64: r = gguf_writer_add_i64(w, kv->key, v->i64); break;
                case GGUF_TYPE_FLOAT32: r = gguf_writer_add_f32(w, kv->key, (float) v->f64); break;
                case GGUF_TYPE_FLOAT64: r = gguf_writer_add_f64(w, kv->key, v->f64); break;
                case GGUF_TYPE_BOOL: r = gguf_writer_add_bool(w, kv->key, v->u64 != 0); break;
                case GGUF_TYPE_STRING:
                        r = gguf_writer_add_string_len(w, kv->key, v->str.data, v->str.len);
                        break;
                case GGUF_TYPE_ARRAY:
                        if (v->arr.elem_type == GGUF_TYPE_STRING) {
                                char **s = calloc(v->arr.n, sizeof *s);
                                assert_non_null(s);
                                for (uint64_t k = 0; k < v->arr.n; k++) {
                                        struct gguf_string gs;
                                        assert_int_equal(gguf_array_get_string(v, k, &gs), 0);
                                        s[k] = strndup(gs.data, gs.len);
                                }
                                r = gguf_writer_add_string_array(w, kv->key, (const char *const *) s, v->arr.n);
                                for (uint64_t k = 0; k < v->arr.n; k++)
                                        free(s[k]);
                                free(s);
                        } else
                                r = gguf_writer_add_array(w, kv->key, v->arr.elem_type, v->arr.raw, v->arr.n);
                        break;
                default:
                        fail_msg("unexpected kv type %u", v->type);
                }
                assert_int_equal(r, 0);
        }

        n_tensors = gguf_tensor_count(f);
        data = calloc(n_tensors + 1, sizeof *data);
        assert_non_null(data);
        for (size_t i = 0; i < n_tensors; i++) {
                const struct gguf_tensor *t = gguf_tensor_at(f, i);
                const char *name = t->name;
                uint32_t type = t->type, n_dims = t->n_dims;
                const uint64_t *ne = t->ne;
                int k;

                if (streq(name, e->tensor) && e->drop_tensor)
                        continue;
                if (streq(name, e->tensor)) {
                        if (e->rename)
                                name = e->rename;
                        if (e->type >= 0)
                                type = (uint32_t) e->type;
                        if (e->n_dims) {
                                n_dims = e->n_dims;
                                ne = e->ne;
                        }
                }
                k = gguf_writer_add_tensor(w, name, type, n_dims, ne);
                assert_true(k >= 0);
                /* same byte size: keep the bytes, else zeros */
                data[k] = gguf_writer_tensor_size(w, (size_t) k) == t->size ? t->data : NULL;
        }
        if (e->extra_tensor) {
                const uint64_t ne[1] = { 16 };
                assert_true(gguf_writer_add_tensor(w, e->extra_tensor, GGML_TYPE_F32, 1, ne) >= 0);
        }
        assert_int_equal(gguf_writer_write_file(w, dst, data), 0);
        free(data);
}

/* A fresh temporary folder holding model.gguf (+ config.json unless !with_config). */
struct tmpmodel {
        char dir[256], gguf[300], config[300];
};

static void tmpmodel_make(struct tmpmodel *t, const struct edit *e, bool with_config) {
        snprintf(t->dir, sizeof t->dir, "/tmp/x4-test-xing4-XXXXXX");
        assert_non_null(mkdtemp(t->dir));
        snprintf(t->gguf, sizeof t->gguf, "%s/model.gguf", t->dir);
        snprintf(t->config, sizeof t->config, "%s/config.json", t->dir);
        if (e)
                rewrite_gguf(fixture_gguf, t->gguf, e);
        else {
                size_t n;
                _cleanup_free_ char *bytes = read_text(fixture_gguf, &n);
                write_bytes(t->gguf, bytes, n);
        }
        if (with_config)
                write_config(t->config, NULL, NULL);
}

static void tmpmodel_remove(struct tmpmodel *t) {
        unlink(t->gguf);
        unlink(t->config);
        assert_int_equal(rmdir(t->dir), 0);
}

static int open_model(const char *path, const char *config, const char *tok_dir, bool assume,
                      struct x4_model **ret) {
        struct x4_model_params p = { .path = path, .config_path = config, .tokenizer_dir = tok_dir,
                                     .assume_release_defaults = assume };
        log_clear_last_error();
        return x4_model_open(&p, ret, NULL, 0);
}

/* The reason of the last refused open, as the value x4_model_open hands back */
static char why[1024];
static int open_model_why(const char *path, struct x4_model **ret) {
        struct x4_model_params p = { .path = path };
        why[0] = 0;
        return x4_model_open(&p, ret, why, sizeof why);
}

/* Open `e`-edited fixture with its config and expect a refusal whose message is `want` with
 * "@" standing for the model path. */
static void expect_refusal(const struct edit *e, const char *want) {
        struct tmpmodel t;
        struct x4_model *m = NULL;
        char expected[1024];
        const char *at = strchr(want, '@');
        int r;

        tmpmodel_make(&t, e, true);
        r = open_model_why(t.gguf, &m);
        assert_true(r < 0);
        assert_null(m);
        if (at)
                snprintf(expected, sizeof expected, "%.*s%s%s", (int) (at - want), want, t.gguf, at + 1);
        else
                snprintf(expected, sizeof expected, "%s", want);
        if (!strstr(why, expected))
                fail_msg("err \"%s\"\n does not contain \"%s\"", why, expected);
        tmpmodel_remove(&t);
}

/* ---- the fixture -------------------------------------------------------------------------- */

static void test_fixture_loads(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        const struct x4_config *c;
        const struct x4_weights *w;

        (void) state;
        assert_int_equal(open_model(fixture_gguf, NULL, NULL, false, &m), 0);
        c = x4_model_config(m);
        /* tests/fixtures/xing4-tiny-a/README.md: dims */
        assert_int_equal(c->n_embd, 256);
        assert_int_equal(c->n_layer, 3);
        assert_int_equal(c->n_block, 3);
        assert_int_equal(c->n_nextn, 0);
        assert_int_equal(c->n_dense, 1);
        assert_int_equal(c->n_ff, 256);
        assert_int_equal(c->n_vocab, 512);
        assert_int_equal(c->n_head, 4);
        assert_int_equal(c->q_lora_rank, 64);
        assert_int_equal(c->kv_lora_rank, 64);
        assert_int_equal(c->qk_nope, 32);
        assert_int_equal(c->qk_rope, 16);
        assert_int_equal(c->v_head, 32);
        assert_int_equal(c->n_expert, 8);
        assert_int_equal(c->n_expert_used, 2);
        assert_int_equal(c->n_expert_shared, 1);
        assert_int_equal(c->n_ff_exp, 64);
        assert_int_equal(c->expert_gating, 2);
        assert_true(c->expert_weights_norm);
        assert_float_equal(c->expert_weights_scale, 2.0, 1e-7);
        assert_int_equal(c->hc_mult, 4);
        assert_int_equal(c->hc_sinkhorn_iters, 20);
        assert_float_equal(c->hc_eps, 1e-6, 1e-12);
        assert_float_equal(c->rms_eps, 1e-6, 1e-12);
        /* from config.json: clamp ±30, interleaved rope, mscale 1/1 */
        assert_float_equal(c->hc_clamp, 30.0, 0);
        assert_true(c->rope_interleave);
        assert_float_equal(c->yarn_mscale, 1.0, 0);
        assert_float_equal(c->yarn_mscale_all_dim, 1.0, 0);
        assert_true(c->yarn);
        assert_float_equal(c->yarn_factor, 64.0, 0);
        assert_int_equal(c->yarn_orig_ctx, 4096);
        assert_float_equal(c->rope_freq_base, 10000.0, 0);
        /* docs/model.md §4.1 with key_length_mla 48: 48^-0.5 · (1 + 0.1 ln 64)² = 0.28935926 */
        assert_float_equal(c->attn_scale, pow(48, -0.5) * pow(1 + 0.1 * log(64), 2), 1e-7);
        assert_int_equal(c->bos_id, 1);
        assert_int_equal(c->eos_id, 2);
        assert_int_equal(c->unk_id, 0);
        assert_int_equal(c->pad_id, 3);
        assert_string_equal(x4_model_config_source(m), fixture_config);

        w = x4_model_weights(m);
        assert_non_null(w->token_embd);
        assert_string_equal(w->output->name, "output.weight");
        assert_int_equal(w->output->type, GGML_TYPE_Q6_K);
        /* block 0 dense, 1..2 MoE (first_k_dense_replace 1) */
        assert_non_null(w->layers[0].ffn_gate);
        assert_null(w->layers[0].ffn_gate_exps);
        assert_null(w->layers[1].ffn_gate);
        assert_string_equal(w->layers[2].ffn_down_exps->name, "blk.2.ffn_down_exps.weight");
        assert_string_equal(w->layers[2].attn_k_b->name, "blk.2.attn_k_b.weight");
        assert_int_equal(w->layers[2].attn_k_b->ne[2], 4);
        assert_string_equal(w->layers[1].hc_ffn_scale->name, "blk.1.hc_ffn_scale.weight");
        assert_string_equal(w->layers[1].exp_probs_b->name, "blk.1.exp_probs_b.bias");
        assert_non_null(w->layers[1].ffn_down_shexp);
        assert_null(w->layers[3].attn_norm);
        /* a clean load reports nothing */
        assert_string_equal(log_last_error(), "");
        assert_int_equal(strlen(x4_model_fingerprint(m)), 32);
        assert_int_equal(strspn(x4_model_fingerprint(m), "0123456789abcdef"), 32);
}

static void test_fingerprint(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *a = NULL, *b = NULL, *c = NULL;
        struct tmpmodel t;

        (void) state;
        assert_int_equal(open_model(fixture_gguf, NULL, NULL, false, &a), 0);
        assert_int_equal(open_model(fixture_gguf, NULL, NULL, false, &b), 0);
        assert_string_equal(x4_model_fingerprint(a), x4_model_fingerprint(b));
        /* same GGUF bytes, another clamp in config.json: another model */
        tmpmodel_make(&t, NULL, false);
        write_config(t.config, "\"mhc_h_res_clamp_min\": -30.0,\n  \"mhc_h_res_clamp_max\": 30.0",
                     "\"mhc_h_res_clamp_min\": -20.0,\n  \"mhc_h_res_clamp_max\": 20.0");
        assert_int_equal(open_model(t.gguf, NULL, NULL, false, &c), 0);
        assert_float_equal(x4_model_config(c)->hc_clamp, 20.0, 0);
        assert_string_not_equal(x4_model_fingerprint(a), x4_model_fingerprint(c));
        tmpmodel_remove(&t);
}

static void test_rope_inv_freq(void **state) {
        /* docs/model.md §4.1, the release: pairs 0..10 unchanged, 23..31 divided by 64, ramp between */
        struct x4_config c = { .qk_rope = 64, .rope_freq_base = 10000, .yarn = true, .yarn_factor = 64,
                               .yarn_orig_ctx = 4096, .yarn_beta_fast = 32, .yarn_beta_slow = 1 };
        float inv[32];

        (void) state;
        x4_config_rope_inv_freq(&c, inv);
        for (int i = 0; i < 32; i++) {
                double f = pow(10000.0, -2.0 * i / 64), ramp = (i - 10) / 13.0;
                ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
                double want = f * (1 - ramp) + f / 64 * ramp;
                assert_float_equal(inv[i], want, 1e-6 * want);
        }
        assert_float_equal(inv[0], 1.0, 0);
        c.yarn = false;
        x4_config_rope_inv_freq(&c, inv);
        assert_float_equal(inv[31], pow(10000.0, -62.0 / 64), 1e-6 * inv[31]);
}

/* ---- corrupt files ------------------------------------------------------------------------ */

static void test_truncated(void **state) {
        struct tmpmodel t;
        struct x4_model *m = NULL;
        _cleanup_free_ char *bytes = NULL;
        size_t n;

        (void) state;
        tmpmodel_make(&t, NULL, true);
        bytes = read_text(fixture_gguf, &n);
        /* the last tensor's data cut short */
        write_bytes(t.gguf, bytes, n - 1000);
        assert_true(open_model(t.gguf, NULL, NULL, false, &m) < 0);
        assert_non_null(strstr(log_last_error(), t.gguf));
        assert_non_null(strstr(log_last_error(), "blk.2.ffn_down_shexp.weight"));
        /* cut inside the metadata */
        write_bytes(t.gguf, bytes, 5000);
        assert_true(open_model(t.gguf, NULL, NULL, false, &m) < 0);
        assert_non_null(strstr(log_last_error(), t.gguf));
        assert_null(m);
        tmpmodel_remove(&t);
}

static void test_wrong_type(void **state) {
        (void) state;
        /* a norm must be F32 (I32 has the same size, so only the validator can see it) */
        expect_refusal(&(struct edit){ .tensor = "blk.0.ffn_norm.weight", .type = GGML_TYPE_I32 },
                       "@: tensor blk.0.ffn_norm.weight: type I32, F32 expected");
        /* a matrix in a type the engine cannot compute */
        expect_refusal(&(struct edit){ .tensor = "blk.1.attn_k_b.weight", .type = GGML_TYPE_I16 },
                       "@: tensor blk.1.attn_k_b.weight: type I16 cannot be computed by this engine; "
                       "expected one of F32, F16, BF16, Q8_0, Q6_K, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, "
                       "Q5_K, IQ4_XS");
        expect_refusal(&(struct edit){ .tensor = "blk.1.ffn_up_exps.weight", .type = GGML_TYPE_Q2_K },
                       "@: tensor blk.1.ffn_up_exps.weight: type Q2_K cannot be computed");
        /* the router is fp32 math (docs/model.md §5) */
        expect_refusal(&(struct edit){ .tensor = "blk.2.ffn_gate_inp.weight", .type = GGML_TYPE_BF16 },
                       "@: tensor blk.2.ffn_gate_inp.weight: type BF16, F32 expected");
}

static void test_alternative_type_accepted(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        struct tmpmodel t;

        (void) state;
        /* F16 instead of BF16 for an attention matrix is computable: accepted */
        tmpmodel_make(&t, &(struct edit){ .tensor = "blk.1.attn_k_b.weight", .type = GGML_TYPE_F16 }, true);
        assert_int_equal(open_model(t.gguf, NULL, NULL, false, &m), 0);
        assert_int_equal(x4_model_weights(m)->layers[1].attn_k_b->type, GGML_TYPE_F16);
        tmpmodel_remove(&t);
}

static void test_renamed_tensor(void **state) {
        (void) state;
        expect_refusal(&(struct edit){ .tensor = "blk.1.attn_k_b.weight", .rename = "blk.1.attn_kb.weight",
                                       .type = -1 },
                       "@: tensor blk.1.attn_k_b.weight missing");
        expect_refusal(&(struct edit){ .tensor = "output.weight", .rename = "lm_head.weight", .type = -1 },
                       "@: tensor output.weight missing");
}

static void test_wrong_shape(void **state) {
        (void) state;
        /* same element count and size: only the table check can see it */
        expect_refusal(&(struct edit){ .tensor = "blk.1.attn_k_b.weight", .type = -1, .n_dims = 3,
                                       .ne = { 32, 32, 8 } },
                       "@: tensor blk.1.attn_k_b.weight shape [32, 32, 8] expected [32, 64, 4]");
        /* a transposed router (docs/model.md §11.13) */
        expect_refusal(&(struct edit){ .tensor = "blk.2.ffn_gate_inp.weight", .type = -1, .n_dims = 2,
                                       .ne = { 8, 256 } },
                       "@: tensor blk.2.ffn_gate_inp.weight shape [8, 256] expected [256, 8]");
}

static void test_unknown_tensor_warns(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        struct tmpmodel t;
        char want[512];

        (void) state;
        tmpmodel_make(&t, &(struct edit){ .type = -1, .extra_tensor = "blk.0.mystery.weight" }, true);
        assert_int_equal(open_model(t.gguf, NULL, NULL, false, &m), 0);
        snprintf(want, sizeof want, "%s: 1 unknown tensor ignored: blk.0.mystery.weight", t.gguf);
        assert_string_equal(log_last_error(), want);
        tmpmodel_remove(&t);
}

static void test_bad_metadata(void **state) {
        (void) state;
        expect_refusal(&(struct edit){ .drop_key = "xing4_0.expert_count", .type = -1 },
                       "@: key xing4_0.expert_count missing");
        expect_refusal(&(struct edit){ .set_u32_key = "xing4_0.attention.head_count_kv", .set_u32 = 4, .type = -1 },
                       "@: key xing4_0.attention.head_count_kv is 4, 1 expected");
        expect_refusal(&(struct edit){ .set_u32_key = "xing4_0.attention.key_length", .set_u32 = 192, .type = -1 },
                       "@: key xing4_0.attention.key_length is 192, kv_lora_rank + rope dims = 80 expected");
        expect_refusal(&(struct edit){ .set_u32_key = "xing4_0.hyper_connection.count", .set_u32 = 2, .type = -1 },
                       "@: key xing4_0.hyper_connection.count is 2, 4 expected");
        expect_refusal(&(struct edit){ .set_str_key = "general.architecture", .set_str = "deepseek2", .type = -1 },
                       "@: general.architecture is \"deepseek2\", \"xing4_0\" expected");
        /* a block count that config.json does not share is caught before the table */
        expect_refusal(&(struct edit){ .set_u32_key = "xing4_0.block_count", .set_u32 = 4, .type = -1 },
                       "says num_hidden_layers 3 but @ says xing4_0.block_count - xing4_0.nextn_predict_layers 4");
        /* a block count that the table does not fill (no config.json to disagree): blk.3 missing */
        {
                struct tmpmodel t;
                struct x4_model *m = NULL;
                char want[512];

                tmpmodel_make(&t, &(struct edit){ .set_u32_key = "xing4_0.block_count", .set_u32 = 4,
                                                  .type = -1 }, false);
                assert_true(open_model(t.gguf, NULL, NULL, true, &m) < 0);
                snprintf(want, sizeof want, "%s: tensor blk.3.hc_attn_fn.weight missing", t.gguf);
                assert_string_equal(log_last_error(), want);
                tmpmodel_remove(&t);
        }
}

/* ---- config.json ------------------------------------------------------------------------ */

static void expect_config_refusal(const char *from, const char *to, const char *want_after_path) {
        struct tmpmodel t;
        struct x4_model *m = NULL;
        char want[1024];

        tmpmodel_make(&t, NULL, false);
        write_config(t.config, from, to);
        assert_true(open_model(t.gguf, NULL, NULL, false, &m) < 0);
        snprintf(want, sizeof want, "config.json (%s)%s", t.config, want_after_path);
        /* "@" in want_after_path: the gguf path */
        char *at = strchr(want, '@');
        if (at) {
                char tail[512];
                snprintf(tail, sizeof tail, "%s", at + 1);
                snprintf(at, sizeof want - (size_t) (at - want), "%s%s", t.gguf, tail);
        }
        if (!strstr(log_last_error(), want))
                fail_msg("message \"%s\"\n does not contain \"%s\"", log_last_error(), want);
        tmpmodel_remove(&t);
}

static void test_config_disagrees(void **state) {
        (void) state;
        expect_config_refusal("\"hidden_size\": 256", "\"hidden_size\": 4096",
                              " says hidden_size 4096 but @ says xing4_0.embedding_length 256");
        expect_config_refusal("\"num_hidden_layers\": 3", "\"num_hidden_layers\": 4",
                              " says num_hidden_layers 4 but @ says xing4_0.block_count - "
                              "xing4_0.nextn_predict_layers 3");
        expect_config_refusal("\"rope_theta\": 10000.0", "\"rope_theta\": 50000.0",
                              " says rope_theta 50000 but @ says xing4_0.rope.freq_base 10000");
        expect_config_refusal("\"beta_fast\": 32.0", "\"beta_fast\": 16.0",
                              " says rope_scaling.beta_fast 16 but @ says xing4_0.rope.scaling.yarn_beta_fast 32");
        expect_config_refusal("\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\"",
                              " says scoring_func \"softmax\" but @ says xing4_0.expert_gating_func 2 (sigmoid)");
        expect_config_refusal("\"norm_topk_prob\": true", "\"norm_topk_prob\": false",
                              " says norm_topk_prob 0 but @ says xing4_0.expert_weights_norm 1");
        expect_config_refusal("\"mscale_all_dim\": 1.0", "\"mscale_all_dim\": 0.707",
                              " says rope_scaling.mscale_all_dim 0.707 (log multiplier 0.0707) but @ says "
                              "xing4_0.rope.scaling.yarn_log_multiplier 0.1");
        /* an asymmetric comb clamp cannot be the symmetric clamp of docs/model.md §3.1 */
        expect_config_refusal("\"mhc_h_res_clamp_min\": -30.0", "\"mhc_h_res_clamp_min\": -20.0",
                              ": comb clamp [-20, 30] (mhc_h_res_clamp_min/max): a symmetric range -c..+c "
                              "with c > 0 expected");
        expect_config_refusal("\"mhc_h_res_clamp_min\": -30.0,", "",
                              ": only one of mhc_h_res_clamp_min/max is set");
        expect_config_refusal("\"rope_interleave\": true", "\"rope_interleave\": \"yes\"",
                              ": rope_interleave: true or false expected");
        /* the half-split rope layout is not implemented: refused at open, not computed wrongly */
        expect_config_refusal("\"rope_interleave\": true", "\"rope_interleave\": false",
                              ": rope_interleave false is not supported (this engine implements the "
                              "interleaved layout of the release, docs/model.md §4.1)");
}

static void test_config_float_tolerance(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        struct tmpmodel t;

        (void) state;
        /* within 1e-6 relative of the GGUF's f32: the same value */
        tmpmodel_make(&t, NULL, false);
        write_config(t.config, "\"rope_theta\": 10000.0", "\"rope_theta\": 10000.005");
        assert_int_equal(open_model(t.gguf, NULL, NULL, false, &m), 0);
        tmpmodel_remove(&t);
}

static void test_config_missing(void **state) {
        struct tmpmodel t, tok;
        struct x4_model *m = NULL;
        char want[1024];

        (void) state;
        tmpmodel_make(&t, NULL, false);
        snprintf(tok.dir, sizeof tok.dir, "/tmp/x4-test-xing4-tok-XXXXXX");
        assert_non_null(mkdtemp(tok.dir));
        assert_int_equal(open_model(t.gguf, NULL, tok.dir, false, &m), -ENOENT);
        snprintf(want, sizeof want, "no config.json found for %s (looked at: %s/config.json, %s/config.json)",
                 t.gguf, tok.dir, t.dir);
        if (!strstr(log_last_error(), want))
                fail_msg("message \"%s\"\n does not contain \"%s\"", log_last_error(), want);
        assert_non_null(strstr(log_last_error(), "--assume-release-defaults"));

        /* an explicit path that does not exist is not silently replaced */
        snprintf(want, sizeof want, "%s/nope.json", tok.dir);
        assert_int_equal(open_model(t.gguf, want, NULL, true, &m), -ENOENT);
        assert_non_null(strstr(log_last_error(), want));
        assert_int_equal(rmdir(tok.dir), 0);
        tmpmodel_remove(&t);
}

static void test_assume_release_defaults(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        struct tmpmodel t;

        (void) state;
        tmpmodel_make(&t, NULL, false);
        assert_int_equal(open_model(t.gguf, NULL, NULL, true, &m), 0);
        assert_string_equal(x4_model_config_source(m), "<release defaults>");
        assert_float_equal(x4_model_config(m)->hc_clamp, X4_RELEASE_HC_CLAMP, 0);
        assert_true(x4_model_config(m)->rope_interleave);
        assert_float_equal(x4_model_config(m)->yarn_mscale_all_dim, 1.0, 0);
        tmpmodel_remove(&t);
}

static void test_config_from_params(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *a = NULL, *b = NULL;
        struct tmpmodel t;

        (void) state;
        tmpmodel_make(&t, NULL, false);
        /* --tokenizer-path folder */
        assert_int_equal(open_model(t.gguf, NULL, fixture_dir, false, &a), 0);
        assert_string_equal(x4_model_config_source(a), fixture_config);
        /* explicit path wins */
        write_config(t.config, NULL, NULL);
        assert_int_equal(open_model(t.gguf, fixture_config, NULL, false, &b), 0);
        assert_string_equal(x4_model_config_source(b), fixture_config);
        tmpmodel_remove(&t);
}

/* ---- NextN (docs/model.md §8): recognised, checked, not loaded ------------------------------ */

struct captured {
        char text[4096];
};

static void capture_sink(int level, const char *message, void *userdata) {
        struct captured *c = userdata;
        if (level <= LOG_WARNING) {
                size_t n = strlen(c->text);
                snprintf(c->text + n, sizeof c->text - n, "%s\n", message);
        }
}

static void test_nextn(void **state) {
        struct x4_mkmodel_shape s;
        struct tmpmodel src, t;
        struct x4_model *m = NULL;
        struct captured cap = {};
        char want[1024];

        (void) state;
        /* tiny + one NextN block: blk.3 */
        snprintf(src.dir, sizeof src.dir, "/tmp/x4-test-xing4-XXXXXX");
        assert_non_null(mkdtemp(src.dir));
        snprintf(src.gguf, sizeof src.gguf, "%s/model.gguf", src.dir);
        snprintf(src.config, sizeof src.config, "%s/config.json", src.dir);
        assert_int_equal(x4_mkmodel_preset("tiny", &s), 0);
        s.n_nextn = 1;
        assert_int_equal(x4_mkmodel_write(&s, &(struct x4_mkmodel_options){ .out = src.gguf, .seed = 3 }), 0);

        assert_int_equal(open_model(src.gguf, NULL, NULL, false, &m), 0);
        assert_string_equal(log_last_error(), "");
        assert_int_equal(x4_model_config(m)->n_block, 4);
        assert_int_equal(x4_model_config(m)->n_layer, 3);
        assert_int_equal(x4_model_config(m)->n_nextn, 1);
        /* the block's tensors are in the table after the trunk's, for a backend with MTP on */
        assert_true(x4_model_weights(m)->has_nextn);
        assert_non_null(x4_model_weights(m)->layers[3].attn_q_a);
        assert_non_null(x4_model_weights(m)->nextn.eh_proj);
        assert_null(x4_model_weights(m)->layers[3].hc_attn_fn);
        x4_model_free(m);
        m = NULL;

        /* a missing NextN tensor only disables MTP; the renamed one is reported as unknown */
        snprintf(t.dir, sizeof t.dir, "/tmp/x4-test-xing4-XXXXXX");
        assert_non_null(mkdtemp(t.dir));
        snprintf(t.gguf, sizeof t.gguf, "%s/model.gguf", t.dir);
        snprintf(t.config, sizeof t.config, "%s/config.json", t.dir);
        rewrite_gguf(src.gguf, t.gguf, &(struct edit){ .tensor = "blk.3.nextn.eh_proj.weight",
                                                      .rename = "blk.3.nextn.eh_proj_old.weight", .type = -1 });
        write_config(t.config, "\"num_nextn_predict_layers\": 0", "\"num_nextn_predict_layers\": 1");
        log_set_max_level(LOG_WARNING);
        log_set_sink(capture_sink, &cap);
        assert_int_equal(open_model(t.gguf, NULL, NULL, false, &m), 0);
        log_set_sink(NULL, NULL);
        log_set_max_level(LOG_CRIT);
        snprintf(want, sizeof want,
                 "%s: 1 NextN (MTP) tensor missing, e.g. blk.3.nextn.eh_proj.weight: the model runs without "
                 "speculative decoding\n"
                 "%s: 1 unknown tensor ignored: blk.3.nextn.eh_proj_old.weight\n", t.gguf, t.gguf);
        assert_string_equal(cap.text, want);
        assert_false(x4_model_weights(m)->has_nextn);
        x4_model_free(m);
        m = NULL;

        /* but a present one with a wrong shape is refused */
        rewrite_gguf(src.gguf, t.gguf, &(struct edit){ .tensor = "blk.3.nextn.eh_proj.weight", .type = -1,
                                                      .n_dims = 2, .ne = { 256, 512 } });
        assert_true(open_model(t.gguf, NULL, NULL, false, &m) < 0);
        snprintf(want, sizeof want, "%s: tensor blk.3.nextn.eh_proj.weight shape [256, 512] expected [512, 256]",
                 t.gguf);
        assert_string_equal(log_last_error(), want);
        tmpmodel_remove(&t);
        tmpmodel_remove(&src);
}

int main(void) {
        const char *fx = getenv("X4_FIXTURES");
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fixture_loads),
                cmocka_unit_test(test_fingerprint),
                cmocka_unit_test(test_rope_inv_freq),
                cmocka_unit_test(test_truncated),
                cmocka_unit_test(test_wrong_type),
                cmocka_unit_test(test_alternative_type_accepted),
                cmocka_unit_test(test_renamed_tensor),
                cmocka_unit_test(test_wrong_shape),
                cmocka_unit_test(test_unknown_tensor_warns),
                cmocka_unit_test(test_bad_metadata),
                cmocka_unit_test(test_config_disagrees),
                cmocka_unit_test(test_config_float_tolerance),
                cmocka_unit_test(test_config_missing),
                cmocka_unit_test(test_assume_release_defaults),
                cmocka_unit_test(test_config_from_params),
                cmocka_unit_test(test_nextn),
        };

        snprintf(fixture_dir, sizeof fixture_dir, "%s/xing4-tiny-a", fx ? fx : X4_FIXTURES);
        snprintf(fixture_gguf, sizeof fixture_gguf, "%s/model.gguf", fixture_dir);
        snprintf(fixture_config, sizeof fixture_config, "%s/config.json", fixture_dir);
        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
