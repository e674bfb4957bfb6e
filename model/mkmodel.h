/* SPDX-License-Identifier: MIT */
/* Synthetic xing4_0 GGUF generator (x4-mkmodel): the exact schema of docs/model.md §2 at any size, random
 * but well-conditioned weights (activations O(1), varied routing), a SentencePiece-BPE style
 * vocabulary (docs/model.md §7) and an HF-style config.json next to it.
 *
 * Deterministic: the same shape + seed gives byte-identical files whatever the thread count,
 * because every chunk of every tensor draws from its own PRNG stream keyed by (seed, tensor,
 * chunk). Bulk quantized data is random valid blocks (no per-value float math), written by
 * several threads with pwrite at the offsets the GGUF writer computed, so the 20 GB `full`
 * preset writes at disk speed. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct x4_mkmodel_shape {
        char name[32];          /* preset name, written to general.name */
        uint32_t n_embd;        /* hidden */
        uint32_t n_layer;       /* trunk blocks */
        uint32_t n_dense;       /* leading dense blocks */
        uint32_t n_nextn;       /* NextN blocks after the trunk (0 or 1 in practice) */
        uint32_t n_head;
        uint32_t q_lora_rank, kv_lora_rank;
        uint32_t qk_nope, qk_rope, v_head;
        uint32_t n_ff;          /* dense FFN width */
        uint32_t n_expert, n_expert_used, n_expert_shared, n_ff_exp;
        uint32_t n_vocab;
        uint32_t n_ctx;         /* context_length = YaRN factor × original context */
        uint32_t type_attn;     /* ggml type of token_embd, attention matrices, hc_*_fn (BF16) */
        uint32_t type_ffn;      /* dense FFN, experts, shared expert, NextN eh/embed/head (IQ4_NL) */
        uint32_t type_output;   /* output.weight (Q6_K) */
};

/* Fill *ret with a preset: "tiny", "demo" or "full". -EINVAL (logged) for another name. */
int x4_mkmodel_preset(const char *name, struct x4_mkmodel_shape *ret);

struct x4_mkmodel_options {
        const char *out;         /* the .gguf to write */
        const char *config_out;  /* config.json to write; NULL: config.json next to `out`; "" none */
        bool force_config;       /* replace an existing config.json that x4-mkmodel did not write */
        uint64_t seed;
        unsigned threads;        /* 0: one per online CPU */
        bool header_only;        /* header + ftruncate to the full size: a sparse file */
        bool progress;           /* percent and GB/s on stderr for large files */
};

/* Write the model (and its config.json). Every failure is logged naming the path or the shape
 * field at fault. An existing config.json that x4-mkmodel did not write (it may belong to another
 * model in that folder) is -EEXIST, checked before anything is written, unless force_config. */
int x4_mkmodel_write(const struct x4_mkmodel_shape *shape, const struct x4_mkmodel_options *opts);

/* Vocabulary as written to tokenizer.ggml.* (exposed for tests and x4-tokenize fixtures). */
struct x4_mkmodel_vocab {
        char **pieces;
        float *scores;
        int32_t *types;
        uint32_t n;
};
int x4_mkmodel_vocab_build(uint32_t n_vocab, struct x4_mkmodel_vocab *ret);
void x4_mkmodel_vocab_free(struct x4_mkmodel_vocab *v);
