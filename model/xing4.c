/* SPDX-License-Identifier: MIT */
/* The Xing4 model description: docs/model.md §2.2 metadata, config.json cross-check, docs/model.md §2.4 tensor table.
 *
 * Everything that can be wrong in a file is refused with a message naming the file, the key or
 * tensor, what was found and what was expected. */
#include "model/xing4.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/json.h"
#include "common/log.h"
#include "gguf/ggml.h"

struct x4_model {
        struct gguf_file *gguf;
        char *path;
        struct x4_config cfg;
        struct x4_weights w;
        char *config_source;
        char fingerprint[33];
};

/* ---- docs/model.md §2.2: GGUF metadata ---------------------------------------------------- */

#define ARCH "xing4_0"

static int get_u32_key(struct gguf_file *f, const char *path, const char *key, uint32_t *ret) {
        uint64_t v;
        int r;

        r = gguf_get_u64(f, key, &v);
        if (r == -ENOENT)
                return log_error_errno(ENOENT, "%s: key %s missing", path, key);
        if (r < 0)
                return log_error_errno(r, "%s: key %s: an unsigned integer expected", path, key);
        if (v > UINT32_MAX)
                return log_error_errno(ERANGE, "%s: key %s: %llu is out of range", path, key,
                                       (unsigned long long) v);
        *ret = (uint32_t) v;
        return 0;
}

static int get_f32_key(struct gguf_file *f, const char *path, const char *key, float *ret) {
        double v;
        int r;

        r = gguf_get_f64(f, key, &v);
        if (r == -ENOENT)
                return log_error_errno(ENOENT, "%s: key %s missing", path, key);
        if (r < 0)
                return log_error_errno(r, "%s: key %s: a number expected", path, key);
        if (!isfinite(v))
                return log_error_errno(ERANGE, "%s: key %s: %g is not finite", path, key, v);
        *ret = (float) v;
        return 0;
}

static int get_bool_key(struct gguf_file *f, const char *path, const char *key, bool *ret) {
        uint64_t u;
        int r;

        r = gguf_get_bool(f, key, ret);
        if (r == -ENOENT)
                return log_error_errno(ENOENT, "%s: key %s missing", path, key);
        if (r < 0) {
                /* some writers store flags as integers */
                if (gguf_get_u64(f, key, &u) >= 0 && u <= 1) {
                        *ret = u;
                        return 0;
                }
                return log_error_errno(r, "%s: key %s: a bool expected", path, key);
        }
        return 0;
}

static int get_string_key(struct gguf_file *f, const char *path, const char *key, char *buf,
                          size_t size) {
        struct gguf_string s;
        int r;

        r = gguf_get_string(f, key, &s);
        if (r == -ENOENT)
                return log_error_errno(ENOENT, "%s: key %s missing", path, key);
        if (r < 0)
                return log_error_errno(r, "%s: key %s: a string expected", path, key);
        snprintf(buf, size, "%.*s", (int) MIN(s.len, (uint64_t) size - 1), s.data);
        return 0;
}

static int get_token_id(struct gguf_file *f, const char *path, const char *key, int32_t def,
                        uint32_t n_vocab, int32_t *ret) {
        uint64_t v;
        int r;

        r = gguf_get_u64(f, key, &v);
        if (r == -ENOENT) {
                *ret = def;
                return 0;
        }
        if (r < 0)
                return log_error_errno(r, "%s: key %s: an unsigned integer expected", path, key);
        if (v >= n_vocab)
                return log_error_errno(ERANGE, "%s: key %s: token id %llu is outside the vocabulary (%u)",
                                       path, key, (unsigned long long) v, n_vocab);
        *ret = (int32_t) v;
        return 0;
}

static int read_gguf_config(struct gguf_file *f, const char *path, struct x4_config *c) {
        char s[64];
        uint32_t key_length, value_length, key_length_mla, head_count_kv, group_count, group_used;
        int r;

        r = get_string_key(f, path, "general.architecture", s, sizeof s);
        if (r < 0)
                return r;
        if (!streq(s, ARCH))
                return log_error_errno(EMEDIUMTYPE, "%s: general.architecture is \"%s\", \"" ARCH
                                       "\" expected (this daemon serves Xing4.0 models only)", path, s);
        if (gguf_tensor_count(f) == 0) /* e.g. a tokenizer-only file (vocabulary, no weights) */
                return log_error_errno(EMEDIUMTYPE, "%s: holds no tensors (a vocabulary or metadata-only GGUF?): "
                                       "a Xing4.0 model file with its weights expected", path);

        struct {
                const char *key;
                uint32_t *v;
        } u32s[] = {
                { ARCH ".block_count", &c->n_block },
                { ARCH ".context_length", &c->n_ctx_train },
                { ARCH ".embedding_length", &c->n_embd },
                { ARCH ".feed_forward_length", &c->n_ff },
                { ARCH ".vocab_size", &c->n_vocab },
                { ARCH ".attention.head_count", &c->n_head },
                { ARCH ".attention.head_count_kv", &head_count_kv },
                { ARCH ".attention.key_length", &key_length },
                { ARCH ".attention.value_length", &value_length },
                { ARCH ".attention.key_length_mla", &key_length_mla },
                { ARCH ".attention.value_length_mla", &c->v_head },
                { ARCH ".attention.q_lora_rank", &c->q_lora_rank },
                { ARCH ".attention.kv_lora_rank", &c->kv_lora_rank },
                { ARCH ".rope.dimension_count", &c->qk_rope },
                { ARCH ".rope.scaling.original_context_length", &c->yarn_orig_ctx },
                { ARCH ".expert_count", &c->n_expert },
                { ARCH ".expert_used_count", &c->n_expert_used },
                { ARCH ".expert_shared_count", &c->n_expert_shared },
                { ARCH ".expert_feed_forward_length", &c->n_ff_exp },
                { ARCH ".expert_gating_func", &c->expert_gating },
                { ARCH ".expert_group_count", &group_count },
                { ARCH ".expert_group_used_count", &group_used },
                { ARCH ".leading_dense_block_count", &c->n_dense },
                { ARCH ".nextn_predict_layers", &c->n_nextn },
                { ARCH ".hyper_connection.count", &c->hc_mult },
                { ARCH ".hyper_connection.sinkhorn_iterations", &c->hc_sinkhorn_iters },
        };
        for (size_t i = 0; i < ELEMENTSOF(u32s); i++) {
                r = get_u32_key(f, path, u32s[i].key, u32s[i].v);
                if (r < 0)
                        return r;
        }

        struct {
                const char *key;
                float *v;
        } f32s[] = {
                { ARCH ".attention.layer_norm_rms_epsilon", &c->rms_eps },
                { ARCH ".rope.freq_base", &c->rope_freq_base },
                { ARCH ".rope.scaling.factor", &c->yarn_factor },
                { ARCH ".rope.scaling.yarn_beta_fast", &c->yarn_beta_fast },
                { ARCH ".rope.scaling.yarn_beta_slow", &c->yarn_beta_slow },
                { ARCH ".rope.scaling.yarn_log_multiplier", &c->yarn_log_mul },
                { ARCH ".expert_weights_scale", &c->expert_weights_scale },
                { ARCH ".hyper_connection.epsilon", &c->hc_eps },
        };
        for (size_t i = 0; i < ELEMENTSOF(f32s); i++) {
                r = get_f32_key(f, path, f32s[i].key, f32s[i].v);
                if (r < 0)
                        return r;
        }

        r = get_bool_key(f, path, ARCH ".expert_weights_norm", &c->expert_weights_norm);
        if (r < 0)
                return r;
        r = get_string_key(f, path, ARCH ".rope.scaling.type", s, sizeof s);
        if (r < 0)
                return r;
        if (streq(s, "yarn"))
                c->yarn = true;
        else if (streq(s, "none"))
                c->yarn = false;
        else
                return log_error_errno(EOPNOTSUPP, "%s: key " ARCH ".rope.scaling.type is \"%s\", "
                                       "\"yarn\" or \"none\" expected", path, s);

        /* Sanity (docs/model.md §1, §2.2). Each check names the key and the value it must have. */
#define REQUIRE(cond, ...)                                                                         \
        do {                                                                                       \
                if (!(cond))                                                                       \
                        return log_error_errno(EBADMSG, __VA_ARGS__);                              \
        } while (0)
        struct {
                const char *key;
                uint32_t v;
        } positive[] = {
                { ARCH ".block_count", c->n_block },
                { ARCH ".embedding_length", c->n_embd },
                { ARCH ".vocab_size", c->n_vocab },
                { ARCH ".attention.head_count", c->n_head },
                { ARCH ".attention.q_lora_rank", c->q_lora_rank },
                { ARCH ".attention.kv_lora_rank", c->kv_lora_rank },
                { ARCH ".attention.value_length_mla", c->v_head },
                { ARCH ".rope.dimension_count", c->qk_rope },
                { ARCH ".expert_count", c->n_expert },
                { ARCH ".expert_used_count", c->n_expert_used },
                { ARCH ".expert_feed_forward_length", c->n_ff_exp },
                { ARCH ".hyper_connection.sinkhorn_iterations", c->hc_sinkhorn_iters },
        };
        for (size_t i = 0; i < ELEMENTSOF(positive); i++)
                REQUIRE(positive[i].v > 0, "%s: key %s is 0, a positive value expected", path,
                        positive[i].key);
        REQUIRE(c->n_nextn < c->n_block,
                "%s: key " ARCH ".nextn_predict_layers is %u, less than " ARCH ".block_count (%u) expected",
                path, c->n_nextn, c->n_block);
        c->n_layer = c->n_block - c->n_nextn;
        REQUIRE(c->n_layer <= X4_MAX_LAYERS, "%s: %u trunk blocks, at most %d supported", path,
                c->n_layer, X4_MAX_LAYERS);
        REQUIRE(c->n_dense <= c->n_layer,
                "%s: key " ARCH ".leading_dense_block_count is %u, at most the %u trunk blocks expected",
                path, c->n_dense, c->n_layer);
        REQUIRE(c->n_dense == 0 || c->n_ff > 0,
                "%s: key " ARCH ".feed_forward_length is 0 but there are %u dense blocks", path,
                c->n_dense);
        REQUIRE(head_count_kv == 1,
                "%s: key " ARCH ".attention.head_count_kv is %u, 1 expected (absorbed MLA view)", path,
                head_count_kv);
        REQUIRE(c->qk_rope % 2 == 0, "%s: key " ARCH ".rope.dimension_count is %u, an even number expected",
                path, c->qk_rope);
        REQUIRE(key_length_mla > c->qk_rope,
                "%s: key " ARCH ".attention.key_length_mla is %u, more than " ARCH
                ".rope.dimension_count (%u) expected",
                path, key_length_mla, c->qk_rope);
        c->qk_nope = key_length_mla - c->qk_rope;
        REQUIRE(key_length == c->kv_lora_rank + c->qk_rope,
                "%s: key " ARCH ".attention.key_length is %u, kv_lora_rank + rope dims = %u expected",
                path, key_length, c->kv_lora_rank + c->qk_rope);
        REQUIRE(value_length == c->kv_lora_rank,
                "%s: key " ARCH ".attention.value_length is %u, kv_lora_rank = %u expected", path,
                value_length, c->kv_lora_rank);
        REQUIRE(c->hc_mult == X4_HC_MAX,
                "%s: key " ARCH ".hyper_connection.count is %u, %d expected", path, c->hc_mult, X4_HC_MAX);
        REQUIRE(c->n_expert_used <= c->n_expert,
                "%s: key " ARCH ".expert_used_count is %u, at most expert_count (%u) expected", path,
                c->n_expert_used, c->n_expert);
        REQUIRE(c->expert_gating == 1 || c->expert_gating == 2,
                "%s: key " ARCH ".expert_gating_func is %u, 1 (softmax) or 2 (sigmoid) expected", path,
                c->expert_gating);
        REQUIRE(group_count == 1 && group_used == 1,
                "%s: keys " ARCH ".expert_group_count/expert_group_used_count are %u/%u, 1/1 expected "
                "(group-limited routing is not implemented)",
                path, group_count, group_used);
        REQUIRE(c->rms_eps > 0, "%s: key " ARCH ".attention.layer_norm_rms_epsilon is %g, > 0 expected",
                path, c->rms_eps);
        REQUIRE(c->hc_eps >= 0, "%s: key " ARCH ".hyper_connection.epsilon is %g, >= 0 expected", path,
                c->hc_eps);
        REQUIRE(c->rope_freq_base > 1, "%s: key " ARCH ".rope.freq_base is %g, > 1 expected", path,
                c->rope_freq_base);
        REQUIRE(!c->yarn || (c->yarn_factor >= 1 && c->yarn_orig_ctx > 0 && c->yarn_beta_fast > 0 &&
                             c->yarn_beta_slow > 0),
                "%s: YaRN keys " ARCH ".rope.scaling.*: factor %g (>= 1 expected), original_context_length "
                "%u, beta_fast %g, beta_slow %g (> 0 expected)",
                path, c->yarn_factor, c->yarn_orig_ctx, c->yarn_beta_fast, c->yarn_beta_slow);
#undef REQUIRE

        r = get_token_id(f, path, "tokenizer.ggml.bos_token_id", 1, c->n_vocab, &c->bos_id);
        if (r >= 0)
                r = get_token_id(f, path, "tokenizer.ggml.eos_token_id", 2, c->n_vocab, &c->eos_id);
        if (r >= 0)
                r = get_token_id(f, path, "tokenizer.ggml.unknown_token_id", 0, c->n_vocab, &c->unk_id);
        if (r >= 0)
                r = get_token_id(f, path, "tokenizer.ggml.padding_token_id", 3, c->n_vocab, &c->pad_id);
        return r;
}

/* docs/model.md §4.1: softmax scale = key_length_mla^-0.5 · m², m = 1 + yarn_log_multiplier · ln(factor). */
static void derive(struct x4_config *c) {
        double m = 1.0;

        if (c->yarn && c->yarn_factor > 1)
                m = 1.0 + (double) c->yarn_log_mul * log((double) c->yarn_factor);
        c->attn_scale = (float) (pow((double) (c->qk_nope + c->qk_rope), -0.5) * m * m);
}

void x4_config_rope_inv_freq(const struct x4_config *c, float *inv_freq) {
        const double d = c->qk_rope, base = c->rope_freq_base;
        double low = 0, high = 0;

        if (c->yarn) {
                /* correction range in pair indices, truncated (docs/model.md §4.1: 10..23 for the release) */
                low = floor(d * log(c->yarn_orig_ctx / (c->yarn_beta_fast * 2 * M_PI)) / (2 * log(base)));
                high = ceil(d * log(c->yarn_orig_ctx / (c->yarn_beta_slow * 2 * M_PI)) / (2 * log(base)));
                low = MAX(low, 0.0);
                high = MIN(high, d - 1);
                if (high <= low)
                        high = low + 0.001; /* avoid a zero-width ramp */
        }
        for (uint32_t i = 0; i < c->qk_rope / 2; i++) {
                double f = pow(base, -2.0 * i / d);
                if (c->yarn) {
                        double ramp = ((double) i - low) / (high - low);
                        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
                        f = f * (1 - ramp) + f / c->yarn_factor * ramp;
                }
                inv_freq[i] = (float) f;
        }
}

/* ---- config.json ----------------------------------------------------------------------------- */

static bool float_close(double a, double b) {
        return fabs(a - b) <= 1e-6 * MAX(fabs(a), fabs(b));
}

static int json_get_number(const struct json_value *root, const char *cfg_path, const char *key,
                           const char *subkey, bool *found, double *ret) {
        const struct json_value *v = json_object_get(root, key);

        *found = false;
        if (v && subkey) {
                if (json_type(v) == JSON_NULL)
                        return 0;
                if (json_type(v) != JSON_OBJECT)
                        return log_error_errno(EBADMSG, "config.json (%s): %s is not an object", cfg_path,
                                               key);
                v = json_object_get(v, subkey);
        }
        if (!v || json_type(v) == JSON_NULL)
                return 0;
        if (json_type(v) == JSON_BOOL) {
                *ret = json_bool(v);
        } else if (json_type(v) == JSON_INT || json_type(v) == JSON_DOUBLE) {
                *ret = json_number(v);
        } else
                return log_error_errno(EBADMSG, "config.json (%s): %s%s%s is not a number", cfg_path, key,
                                       subkey ? "." : "", subkey ?: "");
        *found = true;
        return 0;
}

/* A key both files carry: config.json key (optionally one level deep), the GGUF's value and the
 * GGUF key it came from. */
struct cross {
        const char *key, *subkey;
        double gguf;
        const char *gguf_key;
        bool is_float;
};

static int read_config_json(struct x4_model *m, const char *cfg_path, const char *gguf_path) {
        _cleanup_(json_freep) struct json_value *root = NULL;
        struct x4_config *c = &m->cfg;
        bool found, found2;
        double v, v2;
        int r;

        char why[512];
        r = json_parse_file(cfg_path, &root, why, sizeof why);
        if (r < 0)
                return log_error_errno(r, "config.json (%s): cannot be read or parsed: %s", cfg_path, why);
        if (json_type(root) != JSON_OBJECT)
                return log_error_errno(EBADMSG, "config.json (%s): a JSON object expected", cfg_path);

        const struct cross cross[] = {
                { "hidden_size", NULL, c->n_embd, ARCH ".embedding_length", false },
                { "num_hidden_layers", NULL, c->n_layer,
                  ARCH ".block_count - " ARCH ".nextn_predict_layers", false },
                { "num_nextn_predict_layers", NULL, c->n_nextn, ARCH ".nextn_predict_layers", false },
                { "first_k_dense_replace", NULL, c->n_dense, ARCH ".leading_dense_block_count", false },
                { "intermediate_size", NULL, c->n_ff, ARCH ".feed_forward_length", false },
                { "moe_intermediate_size", NULL, c->n_ff_exp, ARCH ".expert_feed_forward_length", false },
                { "n_routed_experts", NULL, c->n_expert, ARCH ".expert_count", false },
                { "num_experts_per_tok", NULL, c->n_expert_used, ARCH ".expert_used_count", false },
                { "n_shared_experts", NULL, c->n_expert_shared, ARCH ".expert_shared_count", false },
                { "num_attention_heads", NULL, c->n_head, ARCH ".attention.head_count", false },
                { "q_lora_rank", NULL, c->q_lora_rank, ARCH ".attention.q_lora_rank", false },
                { "kv_lora_rank", NULL, c->kv_lora_rank, ARCH ".attention.kv_lora_rank", false },
                { "qk_nope_head_dim", NULL, c->qk_nope,
                  ARCH ".attention.key_length_mla - " ARCH ".rope.dimension_count", false },
                { "qk_rope_head_dim", NULL, c->qk_rope, ARCH ".rope.dimension_count", false },
                { "v_head_dim", NULL, c->v_head, ARCH ".attention.value_length_mla", false },
                { "rms_norm_eps", NULL, c->rms_eps, ARCH ".attention.layer_norm_rms_epsilon", true },
                { "rope_theta", NULL, c->rope_freq_base, ARCH ".rope.freq_base", true },
                { "rope_scaling", "factor", c->yarn_factor, ARCH ".rope.scaling.factor", true },
                { "rope_scaling", "original_max_position_embeddings", c->yarn_orig_ctx,
                  ARCH ".rope.scaling.original_context_length", false },
                { "rope_scaling", "beta_fast", c->yarn_beta_fast, ARCH ".rope.scaling.yarn_beta_fast", true },
                { "rope_scaling", "beta_slow", c->yarn_beta_slow, ARCH ".rope.scaling.yarn_beta_slow", true },
                { "max_position_embeddings", NULL, c->n_ctx_train, ARCH ".context_length", false },
                { "vocab_size", NULL, c->n_vocab, ARCH ".vocab_size", false },
                { "hc_mult", NULL, c->hc_mult, ARCH ".hyper_connection.count", false },
                { "hc_sinkhorn_iters", NULL, c->hc_sinkhorn_iters, ARCH ".hyper_connection.sinkhorn_iterations",
                  false },
                { "hc_eps", NULL, c->hc_eps, ARCH ".hyper_connection.epsilon", true },
                { "routed_scaling_factor", NULL, c->expert_weights_scale, ARCH ".expert_weights_scale", true },
                { "norm_topk_prob", NULL, c->expert_weights_norm, ARCH ".expert_weights_norm", false },
        };
        for (size_t i = 0; i < ELEMENTSOF(cross); i++) {
                const struct cross *x = &cross[i];
                bool same;

                r = json_get_number(root, cfg_path, x->key, x->subkey, &found, &v);
                if (r < 0)
                        return r;
                if (!found)
                        continue;
                same = x->is_float ? float_close(v, x->gguf) : v == x->gguf;
                if (!same)
                        return log_error_errno(EBADMSG, "config.json (%s) says %s%s%s %.9g but %s says %s %.9g",
                                               cfg_path, x->key, x->subkey ? "." : "", x->subkey ?: "", v,
                                               gguf_path, x->gguf_key, x->gguf);
        }

        const struct json_value *sf = json_object_get(root, "scoring_func");
        if (sf && json_type(sf) == JSON_STRING) {
                const char *want = c->expert_gating == 2 ? "sigmoid" : "softmax";
                if (!streq(json_string(sf), want))
                        return log_error_errno(EBADMSG, "config.json (%s) says scoring_func \"%s\" but %s says "
                                               ARCH ".expert_gating_func %u (%s)",
                                               cfg_path, json_string(sf), gguf_path, c->expert_gating, want);
        }

        /* Values the GGUF does not carry (docs/model.md §2.2 "Not in the GGUF"). */
        r = json_get_number(root, cfg_path, "mhc_h_res_clamp_min", NULL, &found, &v);
        if (r < 0)
                return r;
        r = json_get_number(root, cfg_path, "mhc_h_res_clamp_max", NULL, &found2, &v2);
        if (r < 0)
                return r;
        if (found && found2) {
                if (!(v2 > 0) || !float_close(v, -v2))
                        return log_error_errno(EBADMSG, "config.json (%s): comb clamp [%g, %g] "
                                               "(mhc_h_res_clamp_min/max): a symmetric range -c..+c with c > 0 expected",
                                               cfg_path, v, v2);
                c->hc_clamp = (float) v2;
        } else if (found || found2)
                return log_error_errno(EBADMSG, "config.json (%s): only one of mhc_h_res_clamp_min/max "
                                       "is set; both (-c and +c) expected", cfg_path);
        else if (m->cfg.hc_clamp == 0)
                return log_error_errno(EBADMSG, "config.json (%s): mhc_h_res_clamp_min/max missing (the comb "
                                       "clamp is not in the GGUF); add them, or pass --assume-release-defaults "
                                       "to use the release's ±%g", cfg_path, X4_RELEASE_HC_CLAMP);

        const struct json_value *ri = json_object_get(root, "rope_interleave");
        if (ri && json_type(ri) == JSON_BOOL) {
                c->rope_interleave = json_bool(ri);
                /* both backends rotate adjacent pairs (x[2i], x[2i+1]); the half-split layout
                 * would load fine and then compute wrong attention scores, so it is refused */
                if (!c->rope_interleave)
                        return log_error_errno(EOPNOTSUPP,
                                               "config.json (%s): rope_interleave false is not supported "
                                               "(this engine implements the interleaved layout of the "
                                               "release, docs/model.md §4.1)",
                                               cfg_path);
        } else if (ri)
                return log_error_errno(EBADMSG, "config.json (%s): rope_interleave: true or false expected",
                                       cfg_path);
        else
                log_info("config.json (%s): rope_interleave missing, using %s", cfg_path,
                         c->rope_interleave ? "true" : "false");

        r = json_get_number(root, cfg_path, "rope_scaling", "mscale", &found, &v);
        if (r < 0)
                return r;
        if (found)
                c->yarn_mscale = (float) v;
        r = json_get_number(root, cfg_path, "rope_scaling", "mscale_all_dim", &found, &v);
        if (r < 0)
                return r;
        if (found) {
                c->yarn_mscale_all_dim = (float) v;
                /* the converter writes yarn_log_multiplier = 0.1 · mscale_all_dim */
                if (c->yarn && !float_close(0.1 * v, c->yarn_log_mul))
                        return log_error_errno(EBADMSG, "config.json (%s) says rope_scaling.mscale_all_dim %g "
                                               "(log multiplier %g) but %s says " ARCH
                                               ".rope.scaling.yarn_log_multiplier %g",
                                               cfg_path, v, 0.1 * v, gguf_path, c->yarn_log_mul);
        }
        return 0;
}

static bool file_exists(const char *p) {
        struct stat st;
        return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int find_and_read_config(struct x4_model *m, const struct x4_model_params *p) {
        char tried[3][4096];
        size_t n_tried = 0;

        /* release values first, overwritten by what the file says; hc_clamp 0 = "not known yet" */
        m->cfg.rope_interleave = X4_RELEASE_ROPE_INTERLEAVE;
        m->cfg.yarn_mscale = X4_RELEASE_YARN_MSCALE;
        m->cfg.yarn_mscale_all_dim = X4_RELEASE_YARN_MSCALE_ALL_DIM;
        m->cfg.hc_clamp = p->assume_release_defaults ? X4_RELEASE_HC_CLAMP : 0;

        if (p->config_path) {
                struct stat st;
                /* the file, or a folder holding it (packaging/deb/xing4d.conf says both) */
                if (stat(p->config_path, &st) == 0 && S_ISDIR(st.st_mode)) {
                        snprintf(tried[n_tried++], sizeof tried[0], "%s/config.json", p->config_path);
                        if (!file_exists(tried[0]))
                                return log_error_errno(ENOENT, "config.json: the folder %s holds no config.json",
                                                       p->config_path);
                } else if (!file_exists(p->config_path))
                        return log_error_errno(ENOENT, "config.json %s: no such file", p->config_path);
                else
                        snprintf(tried[n_tried++], sizeof tried[0], "%s", p->config_path);
        } else {
                _cleanup_free_ char *copy = strdup(p->path);
                if (!copy)
                        return -ENOMEM;
                if (p->tokenizer_dir) {
                        /* a folder asked for by name: a typo would fall back to the model's silently */
                        struct stat st;
                        if (stat(p->tokenizer_dir, &st) < 0 || !S_ISDIR(st.st_mode))
                                return log_error_errno(ENOENT, "tokenizer path %s: no such folder (it should hold "
                                                       "the model's config.json)", p->tokenizer_dir);
                        snprintf(tried[n_tried++], sizeof tried[0], "%s/config.json", p->tokenizer_dir);
                }
                snprintf(tried[n_tried], sizeof tried[0], "%s/config.json", dirname(copy));
                if (n_tried == 0 || !streq(tried[0], tried[n_tried]))
                        n_tried++;
        }
        for (size_t i = 0; i < n_tried; i++) {
                if (!file_exists(tried[i]))
                        continue;
                m->config_source = strdup(tried[i]);
                if (!m->config_source)
                        return -ENOMEM;
                return read_config_json(m, tried[i], p->path);
        }

        if (!p->assume_release_defaults)
                return log_error_errno(ENOENT, "no config.json found for %s (looked at: %s%s%s); it holds "
                                       "values the GGUF lacks (comb clamp, rope_interleave, YaRN mscale). Put the "
                                       "model's config.json there, or pass --assume-release-defaults to use the "
                                       "Xing4.0 release values (clamp ±%g, rope_interleave true, mscale 1)",
                                       p->path, tried[0], n_tried > 1 ? ", " : "", n_tried > 1 ? tried[1] : "",
                                       X4_RELEASE_HC_CLAMP);
        m->config_source = strdup("<release defaults>");
        if (!m->config_source)
                return -ENOMEM;
        log_info("%s: no config.json found, assuming the Xing4.0 release values (comb clamp ±%g, "
                 "rope_interleave true, YaRN mscale 1/1) as asked (--assume-release-defaults)",
                 p->path, X4_RELEASE_HC_CLAMP);
        return 0;
}

/* ---- docs/model.md §2.4: the tensor table -------------------------------------------------- */

enum tclass {
        TC_MATRIX, /* what the CPU backend computes: the release's types and the llama.cpp
                    * quantizations a user may make of it (Q4_0 ... IQ4_XS, kernels/cpu/quant.c) */
        TC_F32,    /* norms, router, hc_base/scale, exp_probs_b: fp32 math (docs/model.md §5, §9) */
};

static const uint32_t matrix_types[] = { GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16,
                                         GGML_TYPE_Q8_0, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
                                         GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                                         GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                         GGML_TYPE_IQ4_XS };

struct expect {
        char name[80];
        uint32_t n_dims;
        uint64_t ne[GGUF_MAX_DIMS];
        enum tclass cls;
        const struct gguf_tensor **slot; /* NULL for NextN tensors (recognised, not loaded) */
        bool nextn;
};

struct expect_list {
        struct expect *v;
        size_t n, cap;
};

static int expect_add(struct expect_list *l, const struct gguf_tensor **slot, bool nextn,
                      enum tclass cls, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                      const char *fmt, ...) _printf_(9, 10);

static int expect_add(struct expect_list *l, const struct gguf_tensor **slot, bool nextn,
                      enum tclass cls, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                      const char *fmt, ...) {
        struct expect *e;
        va_list ap;

        if (l->n == l->cap) {
                size_t cap = MAX(256u, l->cap * 2);
                struct expect *v = realloc(l->v, cap * sizeof *v);
                if (!v)
                        return -ENOMEM;
                l->v = v;
                l->cap = cap;
        }
        e = &l->v[l->n++];
        *e = (struct expect){ .n_dims = n_dims, .ne = { ne0, ne1, ne2, 1 }, .cls = cls,
                              .slot = slot, .nextn = nextn };
        for (uint32_t d = n_dims; d < GGUF_MAX_DIMS; d++)
                e->ne[d] = 1;
        va_start(ap, fmt);
        vsnprintf(e->name, sizeof e->name, fmt, ap);
        va_end(ap);
        return 0;
}

/* The docs/model.md §2.4 table for this config. */
static int build_expected(const struct x4_config *c, struct x4_weights *w, struct expect_list *l) {
        const uint64_t H = c->n_embd, hc = c->hc_mult, n_hc = hc * (2 + hc); /* 24 = 4 + 4 + 16 */
        const uint64_t nh = c->n_head, qk = c->qk_nope + c->qk_rope;
        const uint64_t sh = (uint64_t) c->n_ff_exp * c->n_expert_shared;
        int r = 0;

#define ADD(slot, nextn, cls, nd, a, b, cc, ...)                                                   \
        do {                                                                                       \
                r = expect_add(l, slot, nextn, cls, nd, a, b, cc, __VA_ARGS__);                    \
                if (r < 0)                                                                         \
                        return r;                                                                  \
        } while (0)

        ADD(&w->token_embd, false, TC_MATRIX, 2, H, c->n_vocab, 1, "token_embd.weight");
        ADD(&w->output_norm, false, TC_F32, 1, H, 1, 1, "output_norm.weight");
        ADD(&w->output, false, TC_MATRIX, 2, H, c->n_vocab, 1, "output.weight");

        for (uint32_t i = 0; i < c->n_block; i++) {
                bool nextn = i >= c->n_layer;
                /* the first NextN block's tensors get slots too (MTP); later ones are only checked */
                struct x4_layer_weights *L = i <= c->n_layer ? &w->layers[i] : NULL;
                struct x4_nextn_weights *N = i == c->n_layer ? &w->nextn : NULL;
#define S(field) (L ? &L->field : NULL)
                if (!nextn) {
                        ADD(S(hc_attn_fn), false, TC_MATRIX, 2, hc * H, n_hc, 1, "blk.%u.hc_attn_fn.weight", i);
                        ADD(S(hc_attn_base), false, TC_F32, 1, n_hc, 1, 1, "blk.%u.hc_attn_base.weight", i);
                        ADD(S(hc_attn_scale), false, TC_F32, 1, 3, 1, 1, "blk.%u.hc_attn_scale.weight", i);
                        ADD(S(hc_ffn_fn), false, TC_MATRIX, 2, hc * H, n_hc, 1, "blk.%u.hc_ffn_fn.weight", i);
                        ADD(S(hc_ffn_base), false, TC_F32, 1, n_hc, 1, 1, "blk.%u.hc_ffn_base.weight", i);
                        ADD(S(hc_ffn_scale), false, TC_F32, 1, 3, 1, 1, "blk.%u.hc_ffn_scale.weight", i);
                }
                ADD(S(attn_norm), nextn, TC_F32, 1, H, 1, 1, "blk.%u.attn_norm.weight", i);
                ADD(S(ffn_norm), nextn, TC_F32, 1, H, 1, 1, "blk.%u.ffn_norm.weight", i);
                ADD(S(attn_q_a), nextn, TC_MATRIX, 2, H, c->q_lora_rank, 1, "blk.%u.attn_q_a.weight", i);
                ADD(S(attn_q_a_norm), nextn, TC_F32, 1, c->q_lora_rank, 1, 1, "blk.%u.attn_q_a_norm.weight", i);
                ADD(S(attn_q_b), nextn, TC_MATRIX, 2, c->q_lora_rank, nh * qk, 1, "blk.%u.attn_q_b.weight", i);
                ADD(S(attn_kv_a_mqa), nextn, TC_MATRIX, 2, H, c->kv_lora_rank + c->qk_rope, 1,
                    "blk.%u.attn_kv_a_mqa.weight", i);
                ADD(S(attn_kv_a_norm), nextn, TC_F32, 1, c->kv_lora_rank, 1, 1, "blk.%u.attn_kv_a_norm.weight", i);
                ADD(S(attn_k_b), nextn, TC_MATRIX, 3, c->qk_nope, c->kv_lora_rank, nh, "blk.%u.attn_k_b.weight", i);
                ADD(S(attn_v_b), nextn, TC_MATRIX, 3, c->kv_lora_rank, c->v_head, nh, "blk.%u.attn_v_b.weight", i);
                ADD(S(attn_output), nextn, TC_MATRIX, 2, nh * c->v_head, H, 1, "blk.%u.attn_output.weight", i);
                if (i < c->n_dense) {
                        ADD(S(ffn_gate), nextn, TC_MATRIX, 2, H, c->n_ff, 1, "blk.%u.ffn_gate.weight", i);
                        ADD(S(ffn_up), nextn, TC_MATRIX, 2, H, c->n_ff, 1, "blk.%u.ffn_up.weight", i);
                        ADD(S(ffn_down), nextn, TC_MATRIX, 2, c->n_ff, H, 1, "blk.%u.ffn_down.weight", i);
                } else {
                        ADD(S(ffn_gate_inp), nextn, TC_F32, 2, H, c->n_expert, 1, "blk.%u.ffn_gate_inp.weight", i);
                        ADD(S(exp_probs_b), nextn, TC_F32, 1, c->n_expert, 1, 1, "blk.%u.exp_probs_b.bias", i);
                        ADD(S(ffn_gate_exps), nextn, TC_MATRIX, 3, H, c->n_ff_exp, c->n_expert,
                            "blk.%u.ffn_gate_exps.weight", i);
                        ADD(S(ffn_up_exps), nextn, TC_MATRIX, 3, H, c->n_ff_exp, c->n_expert,
                            "blk.%u.ffn_up_exps.weight", i);
                        ADD(S(ffn_down_exps), nextn, TC_MATRIX, 3, c->n_ff_exp, H, c->n_expert,
                            "blk.%u.ffn_down_exps.weight", i);
                        if (sh > 0) {
                                ADD(S(ffn_gate_shexp), nextn, TC_MATRIX, 2, H, sh, 1, "blk.%u.ffn_gate_shexp.weight", i);
                                ADD(S(ffn_up_shexp), nextn, TC_MATRIX, 2, H, sh, 1, "blk.%u.ffn_up_shexp.weight", i);
                                ADD(S(ffn_down_shexp), nextn, TC_MATRIX, 2, sh, H, 1, "blk.%u.ffn_down_shexp.weight", i);
                        }
                }
                if (nextn) {
                        /* docs/model.md §8 */
#define NS(field) (N ? &N->field : NULL)
                        ADD(NS(eh_proj), true, TC_MATRIX, 2, 2 * H, H, 1, "blk.%u.nextn.eh_proj.weight", i);
                        ADD(NS(embed_tokens), true, TC_MATRIX, 2, H, c->n_vocab, 1, "blk.%u.nextn.embed_tokens.weight", i);
                        ADD(NS(shared_head_head), true, TC_MATRIX, 2, H, c->n_vocab, 1,
                            "blk.%u.nextn.shared_head_head.weight", i);
                        ADD(NS(enorm), true, TC_F32, 1, H, 1, 1, "blk.%u.nextn.enorm.weight", i);
                        ADD(NS(hnorm), true, TC_F32, 1, H, 1, 1, "blk.%u.nextn.hnorm.weight", i);
                        ADD(NS(shared_head_norm), true, TC_F32, 1, H, 1, 1, "blk.%u.nextn.shared_head_norm.weight", i);
#undef NS
                }
#undef S
        }
#undef ADD
        return 0;
}

static void format_shape(char *buf, size_t size, uint32_t n_dims, const uint64_t *ne) {
        size_t n = 0;

        n += (size_t) snprintf(buf + n, size - n, "[");
        for (uint32_t d = 0; d < n_dims && n < size; d++)
                n += (size_t) snprintf(buf + n, size - n, "%s%llu", d ? ", " : "",
                                       (unsigned long long) ne[d]);
        if (n < size)
                snprintf(buf + n, size - n, "]");
}

static bool type_ok(enum tclass cls, uint32_t type) {
        if (cls == TC_F32)
                return type == GGML_TYPE_F32;
        for (size_t i = 0; i < ELEMENTSOF(matrix_types); i++)
                if (matrix_types[i] == type)
                        return true;
        return false;
}

static int cmp_expect_name(const void *a, const void *b) {
        return strcmp(((const struct expect *) a)->name, ((const struct expect *) b)->name);
}

static int validate_tensors(struct x4_model *m) {
        struct expect_list l = {};
        _cleanup_free_ char *unknown = NULL;
        size_t n_unknown = 0, unknown_len = 0, n_nextn_missing = 0;
        const char *first_nextn_missing = NULL;
        int r;

        r = build_expected(&m->cfg, &m->w, &l);
        if (r < 0)
                goto out;

        for (size_t i = 0; i < l.n; i++) {
                const struct expect *e = &l.v[i];
                const struct gguf_tensor *t = gguf_tensor_find(m->gguf, e->name);
                char want[96], have[96];

                if (!t) {
                        if (e->nextn) {
                                /* MTP is optional: the trunk runs without it */
                                if (!first_nextn_missing)
                                        first_nextn_missing = e->name;
                                n_nextn_missing++;
                                continue;
                        }
                        r = log_error_errno(ENOENT, "%s: tensor %s missing", m->path, e->name);
                        goto out;
                }
                if (memcmp(t->ne, e->ne, sizeof e->ne) != 0) {
                        format_shape(want, sizeof want, e->n_dims, e->ne);
                        format_shape(have, sizeof have, t->n_dims, t->ne);
                        r = log_error_errno(EBADMSG, "%s: tensor %s shape %s expected %s", m->path, e->name,
                                            have, want);
                        goto out;
                }
                if (!type_ok(e->cls, t->type)) {
                        if (e->cls == TC_F32)
                                r = log_error_errno(EOPNOTSUPP, "%s: tensor %s: type %s, F32 expected", m->path,
                                                    e->name, ggml_type_name(t->type));
                        else
                                r = log_error_errno(EOPNOTSUPP, "%s: tensor %s: type %s cannot be computed by "
                                                    "this engine; expected one of F32, F16, BF16, Q8_0, Q6_K, IQ4_NL, "
                                                    "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, IQ4_XS",
                                                    m->path, e->name, ggml_type_name(t->type));
                        goto out;
                }
                if (e->slot)
                        *e->slot = t;
        }
        m->w.has_nextn = m->cfg.n_nextn > 0 && n_nextn_missing == 0;
        if (n_nextn_missing > 0)
                log_warning("%s: %zu NextN (MTP) tensor%s missing, e.g. %s: the model runs without "
                            "speculative decoding", m->path, n_nextn_missing, n_nextn_missing == 1 ? "" : "s",
                            first_nextn_missing);

        /* Anything else in the file is reported, not fatal: it is never read. */
        qsort(l.v, l.n, sizeof *l.v, cmp_expect_name);
        for (size_t i = 0; i < gguf_tensor_count(m->gguf); i++) {
                const struct gguf_tensor *t = gguf_tensor_at(m->gguf, i);
                struct expect key;

                snprintf(key.name, sizeof key.name, "%s", t->name);
                if (strlen(t->name) < sizeof key.name &&
                    bsearch(&key, l.v, l.n, sizeof *l.v, cmp_expect_name))
                        continue;
                n_unknown++;
                if (unknown_len < 512) {
                        size_t add = strlen(t->name) + 3;
                        char *p = realloc(unknown, unknown_len + add + 1);
                        if (!p) {
                                r = -ENOMEM;
                                goto out;
                        }
                        unknown = p;
                        unknown_len += (size_t) snprintf(unknown + unknown_len, add + 1, "%s%s",
                                                         unknown_len ? ", " : "", t->name);
                }
        }
        if (n_unknown > 0)
                log_warning("%s: %zu unknown tensor%s ignored: %s%s", m->path, n_unknown,
                            n_unknown == 1 ? "" : "s", unknown, unknown_len >= 512 ? ", ..." : "");
        r = 0;
out:
        free(l.v);
        return r;
}

/* ---- fingerprint -------------------------------------------------------------------------- */

/* Two independent 64-bit FNV-1a lanes (different offset bases) finished with a splitmix64-style
 * avalanche: not cryptographic, only "same file + same config = same id, anything else differs". */
struct fp_hash {
        uint64_t a, b;
};

static void fp_update(struct fp_hash *h, const void *data, size_t n) {
        const uint8_t *p = data;

        for (size_t i = 0; i < n; i++) {
                h->a = (h->a ^ p[i]) * 0x100000001b3ull;
                h->b = (h->b ^ p[i]) * 0x100000001b3ull;
                h->b ^= h->b >> 29;
        }
}

static uint64_t fp_mix(uint64_t x) {
        x ^= x >> 30;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 27;
        x *= 0x94d049bb133111ebull;
        x ^= x >> 31;
        return x;
}

static int compute_fingerprint(struct x4_model *m) {
        const struct x4_config *c = &m->cfg;
        struct fp_hash h = { 0xcbf29ce484222325ull, 0x84222325cbf29ce4ull };
        uint64_t left = gguf_data_offset(m->gguf);
        _cleanup_close_ int fd = -1;
        char text[1024];
        uint8_t buf[65536];
        uint64_t off = 0;
        int n;

        /* the header (metadata + tensor table) as stored */
        fd = open(m->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return log_error_errno(errno, "%s: cannot reopen for the fingerprint: %m", m->path);
        while (left > 0) {
                ssize_t k = pread(fd, buf, MIN(sizeof buf, left), (off_t) off);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return log_error_errno(k < 0 ? errno : EIO, "%s: reading the header: %s", m->path,
                                               k < 0 ? strerror(errno) : "short file");
                fp_update(&h, buf, (size_t) k);
                left -= (uint64_t) k;
                off += (uint64_t) k;
        }
        /* the values config.json supplied (the GGUF ones are in the header already) */
        n = snprintf(text, sizeof text, "hc_clamp=%.9g;rope_interleave=%d;mscale=%.9g;mscale_all_dim=%.9g",
                     c->hc_clamp, c->rope_interleave, c->yarn_mscale, c->yarn_mscale_all_dim);
        fp_update(&h, text, (size_t) n);
        snprintf(m->fingerprint, sizeof m->fingerprint, "%016llx%016llx",
                 (unsigned long long) fp_mix(h.a), (unsigned long long) fp_mix(h.b ^ h.a));
        return 0;
}

/* ---- public ----------------------------------------------------------------------------- */

static int model_open(const struct x4_model_params *params, struct x4_model **ret) {
        _cleanup_(x4_model_freep) struct x4_model *m = NULL;
        int r;

        if (!params || !params->path)
                return log_error_errno(EINVAL, "x4_model_open: no model path given");
        m = calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        m->path = strdup(params->path);
        if (!m->path)
                return -ENOMEM;

        r = gguf_open(params->path, &m->gguf);
        if (r < 0)
                return r; /* the reader named the path and the fault */
        r = read_gguf_config(m->gguf, m->path, &m->cfg);
        if (r < 0)
                return r;
        r = find_and_read_config(m, params);
        if (r < 0)
                return r;
        derive(&m->cfg);
        r = validate_tensors(m);
        if (r < 0)
                return r;
        r = compute_fingerprint(m);
        if (r < 0)
                return r;
        log_debug("%s: xing4_0, %u trunk blocks (%u dense), %u experts top-%u, H %u, vocab %u, config %s",
                  m->path, m->cfg.n_layer, m->cfg.n_dense, m->cfg.n_expert, m->cfg.n_expert_used,
                  m->cfg.n_embd, m->cfg.n_vocab, m->config_source);
        *ret = TAKE_PTR(m);
        return 0;
}

/* The GGUF reader and the checks under it fail by logging; the reason comes back as a value. */
int x4_model_open(const struct x4_model_params *params, struct x4_model **ret, char *err,
                  size_t err_size) {
        log_clear_last_error();
        return log_error_value(model_open(params, ret), err, err_size);
}

void x4_model_free(struct x4_model *m) {
        if (!m)
                return;
        gguf_close(m->gguf);
        free(m->path);
        free(m->config_source);
        free(m);
}

const struct x4_config *x4_model_config(const struct x4_model *m) {
        return &m->cfg;
}

const struct x4_weights *x4_model_weights(const struct x4_model *m) {
        return &m->w;
}

const struct gguf_file *x4_model_gguf(const struct x4_model *m) {
        return m->gguf;
}

const char *x4_model_fingerprint(const struct x4_model *m) {
        return m->fingerprint;
}

const char *x4_model_config_source(const struct x4_model *m) {
        return m->config_source;
}
