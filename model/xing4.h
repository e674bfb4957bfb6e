/* SPDX-License-Identifier: MIT */
/* The Xing4 (`xing4_0`) model description: hyperparameters read from the GGUF (docs/model.md §2.2) and
 * config.json, cross-checked, and the weight table of docs/model.md §2.4 validated by name, shape and type.
 * Owns the gguf_file it was opened from. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"
#include "gguf/gguf.h"

/* Not in the GGUF (docs/model.md §2.2 "Not in the GGUF"): taken from config.json, or these release values
 * when the user states the release defaults are assumed. */
#define X4_RELEASE_HC_CLAMP 30.0      /* mhc_h_res_clamp_min/max: comb logits clamped to ±30 (U1) */
#define X4_RELEASE_ROPE_INTERLEAVE true
#define X4_RELEASE_YARN_MSCALE 1.0
#define X4_RELEASE_YARN_MSCALE_ALL_DIM 1.0

#define X4_HC_MAX 4
#define X4_MAX_LAYERS 128

struct x4_config {
        /* docs/model.md §1 / §2.2 */
        uint32_t n_embd;          /* H: 3584 */
        uint32_t n_layer;         /* trunk blocks (block_count - nextn_predict_layers): 40 */
        uint32_t n_block;         /* xing4_0.block_count incl. NextN: 41 */
        uint32_t n_nextn;         /* nextn_predict_layers: 1 */
        uint32_t n_dense;         /* leading_dense_block_count: 2 */
        uint32_t n_ff;            /* dense FFN width: 9216 */
        uint32_t n_vocab;         /* 131072 */
        uint32_t n_ctx_train;     /* context_length: 262144 */
        uint32_t n_head;          /* 32 */
        uint32_t q_lora_rank;     /* 768 */
        uint32_t kv_lora_rank;    /* 512 */
        uint32_t qk_nope;         /* 128 = key_length_mla - rope dims */
        uint32_t qk_rope;         /* 64 = rope.dimension_count */
        uint32_t v_head;          /* 128 = value_length_mla */
        uint32_t n_expert;        /* 64 */
        uint32_t n_expert_used;   /* 4 */
        uint32_t n_expert_shared; /* 1 */
        uint32_t n_ff_exp;        /* 1024 */
        uint32_t expert_gating;   /* 2 = sigmoid, 1 = softmax */
        bool expert_weights_norm; /* true */
        float expert_weights_scale; /* 2.0 */
        uint32_t hc_mult;         /* 4 */
        uint32_t hc_sinkhorn_iters; /* 20 */
        float hc_eps;             /* 1e-6 */
        float hc_clamp;           /* 30 (config.json or X4_RELEASE_HC_CLAMP) */
        float rms_eps;            /* 1e-6 */
        float rope_freq_base;     /* 10000 */
        bool rope_interleave;     /* true */
        bool yarn;                /* rope.scaling.type == "yarn" */
        float yarn_factor;        /* 64 */
        uint32_t yarn_orig_ctx;   /* 4096 */
        float yarn_beta_fast;     /* 32 */
        float yarn_beta_slow;     /* 1 */
        float yarn_log_mul;       /* 0.1 */
        float yarn_mscale;        /* 1.0 */
        float yarn_mscale_all_dim; /* 1.0 */
        float attn_scale;         /* derived, docs/model.md §4.1: (qk_nope+qk_rope)^-0.5 * m^2 */
        /* tokenizer ids (docs/model.md §7) */
        int32_t bos_id, eos_id, unk_id, pad_id;
};

/* Tensors of one trunk block (docs/model.md §2.4). Unused ones (dense vs MoE) are NULL. */
struct x4_layer_weights {
        const struct gguf_tensor *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
        const struct gguf_tensor *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
        const struct gguf_tensor *attn_norm, *ffn_norm;
        const struct gguf_tensor *attn_q_a, *attn_q_a_norm, *attn_q_b;
        const struct gguf_tensor *attn_kv_a_mqa, *attn_kv_a_norm;
        const struct gguf_tensor *attn_k_b, *attn_v_b, *attn_output;
        /* dense blocks */
        const struct gguf_tensor *ffn_gate, *ffn_up, *ffn_down;
        /* MoE blocks */
        const struct gguf_tensor *ffn_gate_inp, *exp_probs_b;
        const struct gguf_tensor *ffn_gate_exps, *ffn_up_exps, *ffn_down_exps;
        const struct gguf_tensor *ffn_gate_shexp, *ffn_up_shexp, *ffn_down_shexp;
};

/* The NextN (MTP) block's own tensors (docs/model.md §8); its attention and FFN tensors are
 * x4_weights.layers[n_layer]. */
struct x4_nextn_weights {
        const struct gguf_tensor *eh_proj, *embed_tokens, *shared_head_head;
        const struct gguf_tensor *enorm, *hnorm, *shared_head_norm;
};

struct x4_weights {
        const struct gguf_tensor *token_embd, *output_norm, *output;
        /* [0, n_layer) the trunk; [n_layer] the first NextN block when `has_nextn` (its tensors are
         * validated always, and only read by a backend created with MTP on) */
        struct x4_layer_weights layers[X4_MAX_LAYERS];
        struct x4_nextn_weights nextn;
        bool has_nextn; /* n_nextn >= 1 and every tensor of blk.n_layer is in the file */
};

/* docs/model.md §8 and §12: the choices the release's documentation leaves open for MTP.
 * U4: which hidden of token t a step hands to the NextN block: true = the trunk's final normed
 * hidden RMSNorm(mean_s X, output_norm) (llama.cpp, HF, vLLM), false = the pre-norm mean (ROCmFPX).
 * A chained draft hands on the NextN block's own hidden of the same kind (after / before
 * shared_head_norm). */
#define X4_MTP_H_POST_NORM true
/* U5: the position id (RoPE) of a NextN row that combines h_t with the embedding of token t+1 is
 * t + X4_MTP_POS_OFFSET (0: h's token, as vLLM's MTP proposer passes the target positions). The
 * row's layer-40 cache slot is position t either way. */
#define X4_MTP_POS_OFFSET 0u

struct x4_model_params {
        const char *path;            /* the .gguf */
        const char *config_path;     /* explicit config.json, or NULL */
        const char *tokenizer_dir;   /* folder holding config.json (--tokenizer-path), or NULL */
        bool assume_release_defaults; /* no config.json: use X4_RELEASE_* (user said so) */
};

struct x4_model;

/* Open, parse and validate. Every refusal is logged naming the cause (key/tensor/path and the
 * expectation) and returns -errno. Without a config.json the error lists the paths looked at.
 *
 * config.json: params->config_path if set (must exist), else <tokenizer_dir>/config.json, else
 * config.json in the folder of the .gguf. Every key it shares with the GGUF must agree (floats to
 * 1e-6 relative), else the load is refused naming both values and both files. It supplies the
 * comb clamp (mhc_h_res_clamp_min/max, must be -c/+c), rope_interleave and the YaRN mscales.
 * No file found: refused, unless assume_release_defaults (then X4_RELEASE_*, logged at info).
 *
 * Tensors: every docs/model.md §2.4 tensor of the trunk must be present with the exact shape; matrices may
 * be F32/F16/BF16/Q8_0/Q6_K/IQ4_NL, norms/router/hc_base/hc_scale/exp_probs_b F32. NextN blocks
 * (blk.n_layer..) are checked the same way but only warned about when missing, and are not put in
 * x4_weights. Tensors the table does not know are listed in one warning and ignored.
 *
 * -errno with the reason in err (errors as values; NULL, 0: logged only). */
int x4_model_open(const struct x4_model_params *params, struct x4_model **ret, char *err,
                  size_t err_size);
void x4_model_free(struct x4_model *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct x4_model *, x4_model_free);

const struct x4_config *x4_model_config(const struct x4_model *m);
const struct x4_weights *x4_model_weights(const struct x4_model *m);
const struct gguf_file *x4_model_gguf(const struct x4_model *m);
/* Hex fingerprint of the model (for snapshots): hash of the header + tensor table + config. */
const char *x4_model_fingerprint(const struct x4_model *m);
/* Where config.json came from ("<release defaults>" if assumed). */
const char *x4_model_config_source(const struct x4_model *m);

/* Derived YaRN inverse frequencies (docs/model.md §4.1), qk_rope/2 values. */
void x4_config_rope_inv_freq(const struct x4_config *c, float *inv_freq);
