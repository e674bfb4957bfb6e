/* SPDX-License-Identifier: MIT */
/* The backend seam (docs/design.md "The backend seam"): model-level, not op-level. A backend runs the
 * whole Xing4 trunk forward for a batch of sequences and owns the memory of the paged latent cache.
 *
 * Cache: `n_pages` pages of `page_tokens` tokens; a page holds, for every trunk layer, the
 * 576-wide latent row of each of its tokens (kv_lora_rank normed latent + qk_rope roped k_pe,
 * docs/model.md §4 absorbed form). A backend created with MTP on (x4_backend_params.mtp) has one
 * more layer in every page, the NextN block's (layer n_layer, docs/model.md §8): page_bytes grows
 * by one layer's rows, and snapshots/prefix pages carry it like any other layer. A sequence's page table lists its pages in position order: position p
 * lives in pages[p / page_tokens] at slot p % page_tokens.
 *
 * Determinism (docs/design.md "Numerics"): a sequence's logits do not depend on its batch-mates, on how
 * its prompt was chunked, or on the number of threads. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct x4_model;

enum x4_cache_type {
        X4_CACHE_F32 = 0,
        X4_CACHE_F16 = 1,
};

enum x4_cpu_math {
        X4_CPU_MATH_FP32 = 0, /* the reference: every product in fp32, one documented order */
        X4_CPU_MATH_FAST = 1, /* BF16 products on bf16-rounded activations (vdpbf16ps), quantized
                               * ones in integers on q8-rounded activations (kernels/cpu/quant.h) */
};

enum x4_logits_mode {
        X4_LOGITS_NONE = 0, /* prefill chunk that is not the last one */
        X4_LOGITS_LAST = 1, /* one row: the sequence's last new token */
        X4_LOGITS_ALL = 2,  /* one row per new token (parity tests, prompt logprobs) */
};

struct x4_seq {
        const int32_t *tokens; /* new token ids */
        uint32_t n_tokens;
        uint32_t pos0;         /* absolute position of tokens[0]; positions < pos0 are cached */
        const uint32_t *pages; /* page table covering positions [0, pos0 + n_tokens) */
        uint32_t n_pages;
        uint32_t logits;       /* enum x4_logits_mode */
        /* MTP: which rows of the final hidden the forward writes to x4_batch.hidden (enum
         * x4_logits_mode, independent of `logits`): the vector the output head multiplies,
         * RMSNorm(mean_s X, output_norm) (or the pre-norm mean, X4_MTP_H_POST_NORM, U4), n_embd
         * floats a row. What a NextN forward consumes. */
        uint32_t hidden;
        /* How many of the new tokens (the first ones) are the request's prompt; the rest are
         * tokens the request generated (a decode step, MTP drafts being verified, or generated
         * tokens recomputed after a preemption). A token's class is its role in its own request,
         * never a property of the step, so it does not depend on batch-mates or chunking. A
         * backend with x4_backend_caps.prompt_class runs prompt tokens on other kernels (the CUDA
         * backend: tensor-core products, bf16 inputs) than generated ones, so their cache rows and
         * logits differ in the last bits from the same positions computed as generated tokens;
         * the CPU backend computes both alike. 0 (the default): every token is generated-class. */
        uint32_t prompt_tokens;
};

struct x4_batch {
        const struct x4_seq *seqs;
        uint32_t n_seqs;
        float *hidden; /* x4_batch_hidden_rows() rows of n_embd floats, batch order; NULL when none */
};

/* One sequence of a NextN (MTP draft) forward, docs/model.md §8. Row k combines the hidden h of
 * the token at position t = seq.pos0 + k with the id seq.tokens[k] of the token at t + 1; it
 * writes the NextN layer's cache row of position t (the slot of h's token; its RoPE position is
 * t + X4_MTP_POS_OFFSET, U5) and attends to that layer's rows 0..t of its sequence. seq.logits
 * asks for draft logits rows (the distribution of the token at t + 2); seq.hidden for the
 * block's own hidden of the same kind as the trunk's (what a chained draft hands on). */
struct x4_nextn_seq {
        struct x4_seq seq;
        const float *h; /* seq.n_tokens rows of n_embd floats */
};

struct x4_nextn_batch {
        const struct x4_nextn_seq *seqs;
        uint32_t n_seqs;
        float *hidden; /* out, x4_nextn_hidden_rows() rows; NULL when none */
};

struct x4_backend_params {
        uint32_t n_threads;     /* CPU: worker threads (0 = online CPUs) */
        uint32_t page_tokens;   /* tokens per cache page (e.g. 256) */
        uint32_t n_pages;       /* cache pages to allocate (0 = derive from memory_limit) */
        uint32_t cache_type;    /* enum x4_cache_type */
        uint64_t memory_limit;  /* bytes the backend may use (0 = what the device has) */
        int device;             /* GPU ordinal */
        void (*progress)(double fraction, const char *what, void *userdata); /* load progress */
        void *progress_userdata;
        /* Where the backend's messages go. A backend loaded as a module (CUDA) carries its own
         * copy of the logger; callers set x4_backend_params_default_log (userdata unused) to route
         * its messages into their own logger, with their level filter and identity. Since the
         * seam returns its errors as values (create's too), this carries only the operator's
         * messages (warnings, debug lines, errors as they happen). NULL: the backend logs
         * through its own copy only. */
        void (*log)(int level, const char *message, void *userdata);
        void *log_userdata;
        /* Diagnostics only (parity tests; slows the forward, the CUDA backend synchronizes per
         * MoE layer): called for every MoE layer and every new token of a forward, in token order
         * of the batch, with the token's n_expert selection scores (docs/model.md §5: the gating score
         * plus the correction bias, what top-k ranks) and the k selected routed expert ids in
         * selection order. `token` is the index of the token in the batch's concatenated new
         * tokens. NULL: not called. */
        void (*route_trace)(uint32_t layer, uint32_t token, const float *scores, uint32_t n_expert,
                            const int32_t *selected, uint32_t k, void *userdata);
        void *route_trace_userdata;
        /* MTP (docs/model.md §8): read the NextN block and give every cache page its layer.
         * Refused (-EOPNOTSUPP) by a backend without NextN and for a model without the block.
         * false: the block is never read and pages are the trunk's alone. */
        bool mtp;
        /* The CPU backend's numerics (enum x4_cpu_math; other backends ignore it): the fp32
         * reference (0, what the developer tools and parity tests use), or the fast mode the daemon
         * serves with by default: activations rounded to bf16 for BF16 products and to q8 blocks
         * for quantized ones, on the CPU's dot instructions where it has them (kernels/cpu/quant.h). */
        uint32_t cpu_math;
};

/* What a backend spent its forwards on since profiling was switched on (x4-bench --profile). */
#define X4_PROFILE_MAX_CLASSES 16
struct x4_backend_profile {
        uint64_t forwards;        /* forward() calls profiled */
        uint64_t kernels;         /* device kernels launched by them */
        uint32_t n_classes;
        struct {
                const char *name; /* "attention", "hc", "experts", ... (static strings) */
                uint64_t kernels;
                double ms;        /* device time, summed */
                /* bytes the class's kernels had to move at least once (weights, cache rows, the
                 * residual streams, logits; the backend's count of what the forwards needed, not a
                 * measurement of the traffic); 0: not counted. bytes / ms is its achieved bandwidth */
                uint64_t bytes;
        } classes[X4_PROFILE_MAX_CLASSES];
};

struct x4_backend_caps {
        const char *name;        /* "cpu", "cuda:NVIDIA H200" */
        uint32_t n_pages;        /* allocated pages */
        uint32_t page_tokens;
        uint32_t max_batch_tokens; /* most new tokens one forward takes (cpu: the micro-batch it
                                    * cuts larger batches into; it accepts any size) */
        uint32_t cache_type;
        bool mtp;                /* created with MTP: nextn() runs, pages hold the NextN layer */
        /* prompt tokens (x4_seq.prompt_tokens) compute differently from generated ones: a cache
         * page's bytes depend on the class of the tokens that wrote it (the prefix store keeps
         * the class with each page and reuses a page only for the same classes) */
        bool prompt_class;
        uint64_t memory_used;    /* weights + cache + workspace, bytes */
        uint64_t memory_total;   /* what the device has */
};

struct x4_backend;

struct x4_backend_ops {
        const char *name;
        /* Make the model's weights resident and allocate the cache; -errno with the reason in
         * err (errors as values, as forward; NULL, 0: only logged). */
        int (*create)(const struct x4_model *model, const struct x4_backend_params *params,
                      struct x4_backend **ret, char *err, size_t err_size);
        void (*destroy)(struct x4_backend *b);
        /* Run the batch; write logits rows (n_vocab floats each) for every sequence's requested
         * rows in batch order into `logits` (x4_batch_logits_rows() of them; may be NULL when no
         * row is requested). Also writes the new tokens' cache rows. A token at position p
         * attends to positions 0..p of its own sequence, read through its page table.
         * The whole batch is validated before anything runs, by x4_batch_check (the same codes
         * and messages on every backend); a backend may refuse more (its own limits) with
         * -E2BIG. Errors as values (docs/design.md, "Errors"): forward and the page calls
         * return -errno and say why in err (NULL, 0: the backend logs it instead); the engine
         * hands that text to the requests that failed. */
        int (*forward)(struct x4_backend *b, const struct x4_batch *batch, float *logits, char *err,
                       size_t err_size);
        void (*caps)(struct x4_backend *b, struct x4_backend_caps *ret);
        /* Copy one page's bytes out of / into the cache (snapshots, prefix store). A page id
         * beyond the cache is -ERANGE (x4_page_check) on every backend. */
        size_t (*page_bytes)(struct x4_backend *b);
        int (*page_read)(struct x4_backend *b, uint32_t page, void *dst, char *err, size_t err_size);
        int (*page_write)(struct x4_backend *b, uint32_t page, const void *src, char *err,
                          size_t err_size);
        /* Copy page src to page dst (copy-on-write of a shared prefix page). */
        int (*page_copy)(struct x4_backend *b, uint32_t dst, uint32_t src, char *err, size_t err_size);
        /* Optional (NULL: the backend cannot profile). on = true clears the counters and times
         * every later forward per kernel class (timing events between kernels: slower, so never
         * during a timed run); on = false stops. `ret` (may be NULL) gets the counters so far. */
        int (*profile)(struct x4_backend *b, bool on, struct x4_backend_profile *ret);
        /* MTP draft forward (struct x4_nextn_seq): logits rows (n_vocab floats) of every
         * sequence's requested rows in batch order, hidden rows likewise into batch->hidden.
         * Checked by x4_nextn_check first. -EOPNOTSUPP (with a message naming MTP) when the
         * backend was created without mtp or cannot run the block. Errors as values, as forward:
         * -errno and why in err (NULL, 0: the backend logs it instead). */
        int (*nextn)(struct x4_backend *b, const struct x4_nextn_batch *batch, float *logits,
                     char *err, size_t err_size);
        /* Optional (NULL: malloc serves as well): host memory the backend's copies reach fastest,
         * for the logits and hidden buffers handed to forward and nextn (the CUDA backend's is
         * page-locked: a batch of 64 logits rows, 33.5 MB, copied into malloc'ed memory took
         * 3.5 ms of a 24 ms step). Callers go through x4_host_alloc / x4_host_free. */
        void *(*host_alloc)(struct x4_backend *b, size_t bytes);
        void (*host_free)(struct x4_backend *b, void *p);
};

/* Host memory for forward's and nextn's output buffers from the backend's host_alloc, or malloc
 * where it has none; NULL when out of memory. Free with x4_host_free (NULL is ignored) before
 * the backend is destroyed. */
void *x4_host_alloc(const struct x4_backend_ops *ops, struct x4_backend *b, size_t bytes);
void x4_host_free(const struct x4_backend_ops *ops, struct x4_backend *b, void *p);
/* Grow *p (x4_host_alloc'ed, or NULL) to hold n floats, keeping its contents; *cap counts floats.
 * Returns *p, or NULL (and *p, *cap as they were) when out of memory. */
float *x4_host_grow(const struct x4_backend_ops *ops, struct x4_backend *b, float **p, size_t *cap, size_t n);

/* The rows one sequence's logits (or hidden) mode produces for n_tokens new tokens. */
static inline uint32_t x4_mode_rows(uint32_t mode, uint32_t n_tokens) {
        if (mode == X4_LOGITS_LAST && n_tokens > 0)
                return 1;
        return mode == X4_LOGITS_ALL ? n_tokens : 0;
}

/* The number of logits / hidden rows a batch produces. */
uint32_t x4_batch_logits_rows(const struct x4_batch *batch);
uint32_t x4_batch_hidden_rows(const struct x4_batch *batch);
uint32_t x4_nextn_logits_rows(const struct x4_nextn_batch *batch);
uint32_t x4_nextn_hidden_rows(const struct x4_nextn_batch *batch);

/* The forward contract, checked the same way by every backend before it touches anything (one
 * set of codes and messages): returns 0, or -EINVAL (empty batch, n_tokens 0, a token id outside
 * [0, n_vocab), a logits mode beyond X4_LOGITS_ALL, rows requested with no logits buffer,
 * prompt_tokens beyond n_tokens) or
 * -ERANGE (positions beyond the sequence's page table, a page id beyond the cache) with a
 * message naming the sequence, the index and the value in `msg` (errors as values: the caller
 * decides whether to log it). */
struct x4_batch_limits {
        uint32_t n_vocab, n_pages, page_tokens;
};
int x4_batch_check(const struct x4_batch *batch, const float *logits,
                   const struct x4_batch_limits *lim, char *msg, size_t msg_size);
/* The same for a NextN batch, plus: -EINVAL for hidden rows requested with no buffer (either
 * kind of batch), a sequence without its h rows; -EOPNOTSUPP when `mtp` is false (the backend
 * was created without MTP). */
int x4_nextn_check(const struct x4_nextn_batch *batch, const float *logits,
                   const struct x4_batch_limits *lim, bool mtp, char *msg, size_t msg_size);
/* A page id for page_read/page_write/page_copy: 0 or -ERANGE ("<what> cache page P: out of
 * range, ..."). */
int x4_page_check(uint32_t page, uint32_t n_pages, const char *what, char *msg, size_t msg_size);


extern const struct x4_backend_ops x4_backend_cpu;

/* A struct x4_backend_params.log that hands a backend's message to the caller's logger at the
 * same level (the operator sees the module's messages where the caller's go). */
void x4_backend_params_default_log(int level, const char *message, void *userdata);

/* Find a backend by name ("cpu", "cuda"); the CUDA one is dlopen'ed from xing4d-cuda.so. -errno
 * with the reason in err (NULL, 0: logged) when the name is unknown or the module cannot load. */
int x4_backend_get(const char *name, const struct x4_backend_ops **ret, char *err, size_t err_size);
