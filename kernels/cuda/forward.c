/* SPDX-License-Identifier: MIT */
/* The CUDA backend (kernels/backend.h seam), host side: load the weights as stored, plan memory,
 * and run the whole Xing4 trunk forward of a batch on one stream. Read top to bottom, it follows
 * a token through the model with the spec section at each step; the kernels are in *.cu.
 *
 * Built as the loadable module xing4d-cuda.so (see meson.build for how it gets the core symbols).
 *
 * Numerics: fp32 streams, activations and accumulation everywhere; weights are read as stored
 * (BF16, IQ4_NL, Q6_K, F32) and dequantized exactly in registers. Generated tokens (decode steps)
 * run the same arithmetic whatever the batch (where a batch shape picks a different kernel, e.g.
 * attention or expert grouping, it computes every value in the same order). Prompt tokens
 * (x4_seq.prompt_tokens) take the tensor-core products on sm_80+ (kernels/cuda/mmtc.cu: bf16
 * inputs, their own fixed order, the same for every token count) and the tensor-core attention
 * (mla.cu, k_attn_tc2: f16 inputs), in passes of their own
 * (forward_classes): a prompt row is held to the tensor-core bound against the reference, and
 * differs in the last bits from the same position computed as a generated token. No host
 * synchronization happens inside the forward except the final copy of the logits (the API
 * returns them in host memory) and, only when a caller asks for it, the routing trace.
 *
 * BF16 stays BF16 on every architecture, sm_75 included: the CUDA-core kernels widen it to fp32
 * with a shift, which needs no bf16 hardware. The design's one-time BF16 → fp16 cast on sm_75
 * belongs with a tensor-core prefill path (fp16 operands there); casting now would only lose
 * range and precision.
 *
 * cuBLAS is not linked (docs/design.md allows it for prefill GEMMs): its algorithm choice follows the
 * matrix shape, so a token's result would depend on how many tokens share the launch.
 *
 * Batch invariance: every output is one warp's (or, for few-row matrices, one block's) fixed
 * reduction over its row; attention splits the context at fixed CU_ATTN_PART-position boundaries
 * and folds the parts in order; the new tokens' cache rows are stored before attention reads them.
 * A token's class is its role in its own request. So a sequence's logits are bit-identical
 * alone, in any batch, and for any prefill chunking (tests/gpu). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "launch.h"
#include "gguf/ggml.h"
#include "model/xing4.h"
#include "common/log.h"

/* Tokens one pass of the layer stack takes at least (the load may choose up to
 * CUDA_PASS_TOKENS_AUTO); a longer batch runs as consecutive passes (each sequence's tokens stay
 * in order, so causality holds and results do not change). X4_CUDA_PASS_TOKENS (pass_tokens)
 * sets the length. */
#define CUDA_MAX_BATCH_TOKENS 512
#define CUDA_PASS_TOKENS_MAX 8192
/* Passes of up to this many tokens where the memory allows (see the load): a prompt's prefix is
 * expanded (mha.cu) and the expert weights read once a pass, so a 4,096-token prompt in one pass
 * instead of eight prefills at 11,569 tok/s instead of 7,827 and a 32,768-token one at 5,670
 * instead of 2,867 (full model, H200, 34867cb: the same bits, the pass boundary being a chunk
 * boundary), for a workspace of ~4.5 GiB instead of ~0.8 on the full model. */
#define CUDA_PASS_TOKENS_AUTO 4096
/* the workspace may take at most this share (1/N) of the memory the weights leave */
#define CUDA_PASS_WS_SHARE 4
/* logits rows the head makes a launch (a longer pass runs it in runs of these) */
#define CUDA_LOGIT_ROWS 512u
#define CUDA_DEFAULT_PAGE_TOKENS 256
/* A MoE layer groups its (token, expert) pairs by expert when there are at least this many per
 * expert id on average (prefill); fewer, and most tiles would hold one pair (batched decode). The
 * matvec is bound by its shared-memory reads of the inputs, so grouping saves the weight reads and
 * dequantization only: 12% of the expert time of a 512-token prefill (H200, 6-layer model). */
#define CUDA_GROUP_MIN_PAIRS_PER_ID 4
/* pairs k_mm_tcs takes one a block (its MTS_P_MAX): batch 1's five */
#define CUDA_SEL_PAIRS_MAX 8
/* X4_CUDA_L2PF: passes of up to this many tokens (decode steps) have their latency-bound kernels
 * (the mHC pre-mappings, the decode attention) and the expert gate-up ask the L2 for the weights
 * of the products after them (launch.h struct cu_pf) */
#define CUDA_L2PF_MAX_T 64
#define CUDA_STAGING_BYTES (32u << 20)
/* Batches of at most this many tokens (decode steps) run as replayed CUDA graphs
 * (X4_CUDA_GRAPHS=0 turns them off, for comparison). */
#define CUDA_GRAPH_MAX_TOKENS 64
/* Kept free of the device's reported free memory for the CUDA runtime's own allocations. */
#define CUDA_MEMORY_MARGIN (256ull << 20)
#define CUDA_ALIGN 256

struct cu_w {
        void *d;
        uint32_t type;
        uint64_t row_bytes;
        uint32_t K, N;
        uint64_t expert_bytes;
};

struct cu_layer {
        struct cu_w hc_attn_fn, hc_ffn_fn;
        float *hc_attn_base, *hc_attn_scale, *hc_ffn_base, *hc_ffn_scale;
        float *attn_norm, *ffn_norm, *q_a_norm, *kv_a_norm;
        struct cu_w qkv_a; /* attn_q_a ‖ attn_kv_a_mqa: one projection of the same input */
        struct cu_w q_b, k_b, v_b, o;
        bool moe;
        /* dense: ffn_gate ‖ ffn_up rows and ffn_down; MoE: per expert [gate ‖ up] and down,
         * the shared expert stacked after the routed ones as expert n_expert */
        struct cu_w gateup, down;
        struct cu_w router;
        float *router_bias;
};

/* Profiling (x4-bench --profile): while on, every forward records an event after each step and
 * tags it with the step's class; after the forward's final synchronization the gaps between
 * consecutive events are summed per class, with the kernels cu_launches counted in between. */
enum prof_class {
        PC_COPY, PC_EMBED, PC_HC, PC_ATTN_PROJ, PC_MLA_PREP, PC_ATTENTION, PC_ROUTER, PC_EXPERTS,
        PC_DENSE_FFN, PC_HEAD, PC_N,
};
static const char *const prof_names[PC_N] = {
        [PC_COPY] = "copies", [PC_EMBED] = "embedding", [PC_HC] = "hc (mHC pre/post)",
        [PC_ATTN_PROJ] = "attention projections", [PC_MLA_PREP] = "mla prep + q rope",
        [PC_ATTENTION] = "attention", [PC_ROUTER] = "router",
        [PC_EXPERTS] = "experts (MoE)", [PC_DENSE_FFN] = "dense ffn", [PC_HEAD] = "head",
};
struct cu_prof {
        bool on, failed;
        cudaEvent_t *ev;
        uint8_t *cls;
        unsigned long long *kern;
        uint32_t n, cap;
        uint64_t forwards, kernels;
        uint64_t class_kernels[PC_N];
        double class_ms[PC_N];
        uint64_t class_bytes[PC_N]; /* prof_bytes: what each class had to move (x4_backend_profile) */
};

struct cu_graph {
        uint32_t T, R, RH, parts, n_att; /* n_att: its even attention groups (att_chunk) */
        const void *meta; /* the metadata buffer its kernels read (a reallocation drops it) */
        cudaGraphExec_t exec;
        unsigned long long kernels;
};

struct x4_backend {
        struct x4_config cfg;
        int device;
        char name[320];
        cudaStream_t stream;
        uint64_t mem_total;

        uint8_t *wmem;
        uint64_t wbytes;
        struct cu_w embd, output;
        float *output_norm;
        struct cu_layer *layers; /* n_layer, + the NextN block's (layer n_layer) with MTP */
        double *inv_freq;
        /* MTP (docs/model.md §8): the NextN block runs (cuda_nextn); its attention/FFN tensors are
         * layers[n_layer] (no HC), its own ones these; loaded only with MTP on */
        bool mtp;
        struct cu_w nextn_eh, nextn_embd, nextn_head;
        float *nextn_enorm, *nextn_hnorm, *nextn_head_norm;

        void *cache;
        uint32_t n_pages, page_tokens, cache_type;
        uint32_t n_cache_layers; /* layers in a page: n_layer, + 1 (the NextN block's) with MTP */
        uint64_t page_bytes;

        uint32_t T_max, part_slots, n_slots_max;
        uint32_t logit_rows; /* the head's rows a launch: min(T_max, CUDA_LOGIT_ROWS) */
        uint64_t hw;
        uint16_t *xbf;     /* bf16 inputs of the many-input tensor-core products (mmtc.cu) */
        uint64_t xbf_cap;  /* its values */
        void *ws;
        uint64_t ws_bytes;
        uint32_t *hc_ticket, *route_ticket, *ks_ticket;
        float *ksb; /* k_mm_tcp's split-K parts (cu_mm_tc_ksplit) */
        uint32_t hcw_bufs; /* buffers of mHC partial rows in hcw (ws_layout) */
        float *X, *a, *hcp, *hcw, *zr, *qkv, *q, *qabs, *lat, *ao, *o, *gw, *act, *dn, *hn, *logits,
                *part, *sc;
        uint64_t sc_values; /* floats of sc (the split kernels' scores; mha.cu's scratch) */
        float *hid;     /* T_max × H: the hidden rows a forward hands out (x4_seq.hidden) */
        float *eh, *hin; /* MTP only: T_max × 2H NextN input concat(e, g); T_max × H its h rows */
        int32_t *sel, *groups;

        uint32_t *meta_d, *meta_h;
        size_t meta_cap; /* u32 elements of both */

        struct cu_prof prof;
        /* Decode steps replayed as CUDA graphs (cuda_forward): one per (tokens, logits rows,
         * attention parts bucket), captured on first use. */
        struct cu_graph *graphs;
        uint32_t n_graphs, cap_graphs;
        bool graphs_off;
        /* decode-class attention in token groups whose parts' partial rows stay in L2
         * (X4_CUDA_ATTN_CHUNK, att_chunk): 0 off, UINT32_MAX auto, else tokens a group */
        uint32_t att_chunk_mode;
        uint32_t n_sms;
        uint64_t l2_bytes;
        void (*route_trace)(uint32_t layer, uint32_t token, const float *scores,
                            uint32_t n_expert, const int32_t *selected, uint32_t k, void *userdata);
        void *route_trace_ud;
        float *trace_z, *trace_bias; /* host copies for route_trace */
        int32_t *trace_sel;
        uint32_t trace_tok0;         /* batch index of the pass's first token */
        int trace_err;

        /* prompt attention in the non-absorbed form (mha.cu; mha_wanted): whether
         * this device, shape and the k_b / v_b types allow it, the expansion scratch (in b->sc,
         * which only the split decode kernels use), and the pass's jobs (mha_prepare) */
        bool mha_ok, mha_pass;
        bool l2pf_pass; /* this pass asks the L2 for the next products' weights (l2pf_wanted) */
        uint16_t *mha_kx, *mha_vx;
        uint32_t mha_rows_cap, mha_plen, mha_bn;
        bool mha_small;
        const uint32_t *pass_pos_h, *pass_tokpt_h; /* host copies of the pass's metadata */
        struct mha_plan mha_plan;
        struct cu_mha_job *mha_jobs_d;
        uint32_t mha_jobs_dcap;
};

#define CU_TRY(call, err, what)                                                                    \
        ({                                                                                         \
                cudaError_t _e = (call);                                                           \
                _e == cudaSuccess ? 0 : log_error_errno((err), "CUDA backend: %s: %s", (what),     \
                                                        cudaGetErrorString(_e));                   \
        })

static void att_chunk_setup(struct x4_backend *b, const struct cudaDeviceProp *prop);

static uint64_t align_up(uint64_t v) {
        return (v + CUDA_ALIGN - 1) / CUDA_ALIGN * CUDA_ALIGN;
}

/* ---- loading (docs/design.md: weights resident as stored) ----------------------------------- */

/* The loader runs twice over the same code: once to plan (sizes, checks), once to copy. The copy
 * pass writes through two pinned staging buffers: while one is in flight to the device the other
 * is filled from the mmap, so the upload streams at the slower of disk/page cache and PCIe. */
struct loader {
        bool plan;
        uint64_t off;   /* bytes placed so far */
        uint8_t *base;  /* device allocation (copy pass) */
        void *stage[2];
        cudaEvent_t ev[2];
        int cur;
        size_t fill;    /* bytes waiting in stage[cur] */
        uint64_t wdst;  /* device offset stage[cur] goes to */
        cudaStream_t stream;
        uint64_t total, done;
        const struct x4_backend_params *params;
};

static int ld_flush(struct loader *L) {
        int r;

        if (L->fill == 0)
                return 0;
        r = CU_TRY(cudaMemcpyAsync(L->base + L->wdst, L->stage[L->cur], L->fill,
                                   cudaMemcpyHostToDevice, L->stream),
                   EIO, "uploading weights");
        if (r >= 0)
                r = CU_TRY(cudaEventRecord(L->ev[L->cur], L->stream), EIO, "recording an event");
        if (r < 0)
                return r;
        L->wdst += L->fill;
        L->fill = 0;
        L->cur ^= 1;
        return 0;
}

/* The next bytes go to device offset dst. */
static int ld_seek(struct loader *L, uint64_t dst) {
        int r;

        if (L->fill > 0 && dst == L->wdst + L->fill)
                return 0;
        r = ld_flush(L);
        if (r < 0)
                return r;
        L->wdst = dst;
        return 0;
}

static int ld_put(struct loader *L, const void *src, uint64_t n) {
        const uint8_t *s = src;
        int r;

        while (n > 0) {
                if (L->fill == 0) {
                        /* stage[cur] may still feed the copy enqueued two flushes ago */
                        r = CU_TRY(cudaEventSynchronize(L->ev[L->cur]), EIO,
                                   "waiting for a weight upload");
                        if (r < 0)
                                return r;
                }
                size_t c = MIN(n, (uint64_t) CUDA_STAGING_BYTES - L->fill);
                memcpy((uint8_t *) L->stage[L->cur] + L->fill, s, c);
                L->fill += c;
                s += c;
                n -= c;
                if (L->fill == CUDA_STAGING_BYTES) {
                        r = ld_flush(L);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

static int ld_copy(struct loader *L, uint64_t dst, const void *src, uint64_t n) {
        int r = ld_seek(L, dst);
        if (r < 0)
                return r;
        return ld_put(L, src, n);
}

static void ld_progress(struct loader *L, uint64_t bytes, const char *what) {
        L->done += bytes;
        if (!L->plan && L->params->progress && L->total > 0)
                L->params->progress((double) L->done / (double) L->total, what,
                                    L->params->progress_userdata);
}

static int check_present(const struct gguf_tensor *t, const char *name) {
        if (!t)
                return log_error_errno(ENOENT, "CUDA backend: tensor %s missing from the model",
                                       name);
        return 0;
}

static int check_shape(const struct gguf_tensor *t, uint64_t ne0, uint64_t ne1, uint64_t ne2) {
        if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1)
                return log_error_errno(EINVAL,
                                       "%s: shape [%llu, %llu, %llu] expected, file has [%llu, "
                                       "%llu, %llu, %llu]",
                                       t->name, (unsigned long long) ne0,
                                       (unsigned long long) ne1, (unsigned long long) ne2,
                                       (unsigned long long) t->ne[0], (unsigned long long) t->ne[1],
                                       (unsigned long long) t->ne[2],
                                       (unsigned long long) t->ne[3]);
        return 0;
}

static int check_matrix_type(const struct gguf_tensor *t) {
        if (!cu_type_supported(t->type))
                return log_error_errno(EOPNOTSUPP,
                                       "%s: type %s is not supported by the CUDA backend (F32, "
                                       "F16, BF16, Q8_0, Q6_K, IQ4_NL)",
                                       t->name, ggml_type_name(t->type));
        if (t->ne[0] % CU_CHUNK != 0)
                return log_error_errno(EINVAL,
                                       "%s: row length %llu is not a multiple of %u, which the "
                                       "CUDA kernels need",
                                       t->name, (unsigned long long) t->ne[0], CU_CHUNK);
        return 0;
}

/* Place a byte range; in the copy pass, copy `n_src` source ranges into it back to back. */
static int ld_place(struct loader *L, uint64_t bytes, uint64_t *ret_off) {
        *ret_off = L->off;
        L->off = align_up(L->off + bytes);
        return 0;
}

/* An F32 vector of n values (norm weights, HC base/scale, router bias). */
static int ld_vec(struct loader *L, const struct gguf_tensor *t, const char *name, uint64_t n,
                  float **ret) {
        uint64_t off;
        int r;

        r = check_present(t, name);
        if (r < 0)
                return r;
        if (t->type != GGML_TYPE_F32)
                return log_error_errno(EINVAL, "%s: type F32 expected, file has %s", t->name,
                                       ggml_type_name(t->type));
        if (t->n_elements != n)
                return log_error_errno(EINVAL, "%s: %llu values expected, file has %llu", t->name,
                                       (unsigned long long) n,
                                       (unsigned long long) t->n_elements);
        ld_place(L, t->size, &off);
        if (!L->plan) {
                r = ld_copy(L, off, t->data, t->size);
                if (r < 0)
                        return r;
                *ret = (float *) (L->base + off);
        }
        ld_progress(L, t->size, t->name);
        return 0;
}

/* A matrix made of `n` stored tensors of one type and row length, their rows stacked in order. */
static int ld_matrix(struct loader *L, const struct gguf_tensor *const *ts, size_t n,
                     struct cu_w *ret) {
        uint64_t rows = 0, bytes = 0, off, row_bytes;
        const struct gguf_tensor *t0 = ts[0];
        int r;

        for (size_t i = 0; i < n; i++) {
                const struct gguf_tensor *t = ts[i];
                r = check_matrix_type(t);
                if (r < 0)
                        return r;
                if (t->type != t0->type || t->ne[0] != t0->ne[0])
                        return log_error_errno(EINVAL,
                                               "%s: type %s with rows of %llu expected (as %s, "
                                               "which the CUDA backend stacks it with), file has "
                                               "%s with rows of %llu",
                                               t->name, ggml_type_name(t0->type),
                                               (unsigned long long) t0->ne[0], t0->name,
                                               ggml_type_name(t->type),
                                               (unsigned long long) t->ne[0]);
                bytes += t->size;
                rows += t->ne[1] * t->ne[2];
        }
        r = ggml_row_bytes(t0->type, t0->ne[0], &row_bytes);
        if (r < 0)
                return log_error_errno(r, "%s: cannot size a row of %llu %s values", t0->name,
                                       (unsigned long long) t0->ne[0],
                                       ggml_type_name(t0->type));
        ld_place(L, bytes, &off);
        if (!L->plan) {
                r = ld_seek(L, off);
                for (size_t i = 0; r >= 0 && i < n; i++)
                        r = ld_put(L, ts[i]->data, ts[i]->size);
                if (r < 0)
                        return r;
        }
        *ret = (struct cu_w){
                .d = L->plan ? NULL : L->base + off,
                .type = t0->type,
                .row_bytes = row_bytes,
                .K = (uint32_t) t0->ne[0],
                .N = (uint32_t) rows,
                .expert_bytes = rows * row_bytes,
        };
        ld_progress(L, bytes, t0->name);
        return 0;
}

/* docs/model.md §5 gate and up projections of `experts` experts (1 for a dense FFN), their rows
 * interleaved [gate 0, up 0, gate 1, up 1, ...] per expert so one warp computes silu(gate)·up
 * (cu_mv.swiglu); the shared expert, if given, follows as expert `experts`. */
static int ld_gateup(struct loader *L, const struct gguf_tensor *gate, const struct gguf_tensor *up,
                     uint32_t experts, const struct gguf_tensor *gate_sh,
                     const struct gguf_tensor *up_sh, struct cu_w *ret) {
        const struct gguf_tensor *ts[4] = {gate, up, gate_sh, up_sh};
        size_t n = gate_sh ? 4 : 2;
        uint64_t F = gate->ne[1], off, rb, bytes = 0;
        int r;

        for (size_t i = 0; i < n; i++) {
                r = check_matrix_type(ts[i]);
                if (r < 0)
                        return r;
                if (ts[i]->type != gate->type || ts[i]->ne[0] != gate->ne[0] ||
                    ts[i]->ne[1] != F)
                        return log_error_errno(EINVAL,
                                               "%s: type %s with %llu rows of %llu expected (as "
                                               "%s, which the CUDA backend interleaves it with), "
                                               "file has %s with %llu rows of %llu",
                                               ts[i]->name, ggml_type_name(gate->type),
                                               (unsigned long long) F,
                                               (unsigned long long) gate->ne[0], gate->name,
                                               ggml_type_name(ts[i]->type),
                                               (unsigned long long) ts[i]->ne[1],
                                               (unsigned long long) ts[i]->ne[0]);
                bytes += ts[i]->size;
        }
        r = ggml_row_bytes(gate->type, gate->ne[0], &rb);
        if (r < 0)
                return log_error_errno(r, "%s: cannot size a row", gate->name);
        ld_place(L, bytes, &off);
        if (!L->plan) {
                const uint8_t *g = gate->data, *u = up->data;
                r = ld_seek(L, off);
                for (uint64_t i = 0; r >= 0 && i < (uint64_t) experts * F; i++) {
                        r = ld_put(L, g + i * rb, rb);
                        if (r >= 0)
                                r = ld_put(L, u + i * rb, rb);
                }
                if (gate_sh) {
                        g = gate_sh->data;
                        u = up_sh->data;
                        for (uint64_t i = 0; r >= 0 && i < F; i++) {
                                r = ld_put(L, g + i * rb, rb);
                                if (r >= 0)
                                        r = ld_put(L, u + i * rb, rb);
                        }
                }
                if (r < 0)
                        return r;
        }
        *ret = (struct cu_w){
                .d = L->plan ? NULL : L->base + off,
                .type = gate->type,
                .row_bytes = rb,
                .K = (uint32_t) gate->ne[0],
                .N = (uint32_t) (2 * F),
                .expert_bytes = 2 * F * rb,
        };
        ld_progress(L, bytes, gate->name);
        return 0;
}

static int ld_one(struct loader *L, const struct gguf_tensor *t, const char *name, uint64_t ne0,
                  uint64_t ne1, uint64_t ne2, struct cu_w *ret) {
        int r = check_present(t, name);
        if (r < 0)
                return r;
        r = check_shape(t, ne0, ne1, ne2);
        if (r < 0)
                return r;
        return ld_matrix(L, &t, 1, ret);
}

#define LNAME(buf, l, what) (snprintf((buf), sizeof(buf), "blk.%u.%s", (l), (what)), (buf))

/* Block l's tensors; `hc`: a trunk block (with its mHC tensors), else the NextN block (docs/model.md
 * §8: a plain DeepSeek layer, MoE when it has a router). */
static int ld_layer(struct loader *L, const struct x4_config *c, const struct x4_layer_weights *w,
                    uint32_t l, bool hc, struct cu_layer *cl) {
        uint32_t H = c->n_embd, n_hc = c->hc_mult, nh = c->n_head;
        uint32_t QL = c->q_lora_rank, KV = c->kv_lora_rank, R = c->qk_rope, nope = c->qk_nope;
        uint32_t hc_rows = n_hc * (2 + n_hc);
        char nb[96];
        int r;

        /* docs/model.md §3.1 HC tensors (trunk blocks only) */
        r = 0;
        if (hc)
                r = ld_one(L, w->hc_attn_fn, LNAME(nb, l, "hc_attn_fn.weight"), (uint64_t) n_hc * H,
                           hc_rows, 1, &cl->hc_attn_fn);
        if (r >= 0 && hc)
                r = ld_one(L, w->hc_ffn_fn, LNAME(nb, l, "hc_ffn_fn.weight"), (uint64_t) n_hc * H,
                           hc_rows, 1, &cl->hc_ffn_fn);
        if (r >= 0 && hc)
                r = ld_vec(L, w->hc_attn_base, LNAME(nb, l, "hc_attn_base.weight"), hc_rows,
                           &cl->hc_attn_base);
        if (r >= 0 && hc)
                r = ld_vec(L, w->hc_ffn_base, LNAME(nb, l, "hc_ffn_base.weight"), hc_rows,
                           &cl->hc_ffn_base);
        if (r >= 0 && hc)
                r = ld_vec(L, w->hc_attn_scale, LNAME(nb, l, "hc_attn_scale.weight"), 3,
                           &cl->hc_attn_scale);
        if (r >= 0 && hc)
                r = ld_vec(L, w->hc_ffn_scale, LNAME(nb, l, "hc_ffn_scale.weight"), 3,
                           &cl->hc_ffn_scale);
        if (r >= 0)
                r = ld_vec(L, w->attn_norm, LNAME(nb, l, "attn_norm.weight"), H, &cl->attn_norm);
        if (r >= 0)
                r = ld_vec(L, w->ffn_norm, LNAME(nb, l, "ffn_norm.weight"), H, &cl->ffn_norm);
        if (r < 0)
                return r;

        /* docs/model.md §4 MLA tensors; q_a and kv_a read the same input: one stacked projection */
        r = check_present(w->attn_q_a, LNAME(nb, l, "attn_q_a.weight"));
        if (r >= 0)
                r = check_present(w->attn_kv_a_mqa, LNAME(nb, l, "attn_kv_a_mqa.weight"));
        if (r >= 0)
                r = check_shape(w->attn_q_a, H, QL, 1);
        if (r >= 0)
                r = check_shape(w->attn_kv_a_mqa, H, KV + R, 1);
        if (r < 0)
                return r;
        const struct gguf_tensor *qkv[2] = {w->attn_q_a, w->attn_kv_a_mqa};
        r = ld_matrix(L, qkv, 2, &cl->qkv_a);
        if (r >= 0)
                r = ld_vec(L, w->attn_q_a_norm, LNAME(nb, l, "attn_q_a_norm.weight"), QL,
                           &cl->q_a_norm);
        if (r >= 0)
                r = ld_vec(L, w->attn_kv_a_norm, LNAME(nb, l, "attn_kv_a_norm.weight"), KV,
                           &cl->kv_a_norm);
        if (r >= 0)
                r = ld_one(L, w->attn_q_b, LNAME(nb, l, "attn_q_b.weight"), QL,
                           (uint64_t) nh * (nope + R), 1, &cl->q_b);
        if (r >= 0)
                r = ld_one(L, w->attn_k_b, LNAME(nb, l, "attn_k_b.weight"), nope, KV, nh, &cl->k_b);
        if (r >= 0)
                r = ld_one(L, w->attn_v_b, LNAME(nb, l, "attn_v_b.weight"), KV, c->v_head, nh,
                           &cl->v_b);
        if (r >= 0)
                r = ld_one(L, w->attn_output, LNAME(nb, l, "attn_output.weight"),
                           (uint64_t) nh * c->v_head, H, 1, &cl->o);
        if (r < 0)
                return r;

        /* docs/model.md §5 FFN */
        cl->moe = hc ? l >= c->n_dense : w->ffn_gate_inp != NULL;
        if (!cl->moe) {
                uint32_t F = c->n_ff;
                r = check_present(w->ffn_gate, LNAME(nb, l, "ffn_gate.weight"));
                if (r >= 0)
                        r = check_present(w->ffn_up, LNAME(nb, l, "ffn_up.weight"));
                if (r >= 0)
                        r = check_shape(w->ffn_gate, H, F, 1);
                if (r >= 0)
                        r = check_shape(w->ffn_up, H, F, 1);
                if (r < 0)
                        return r;
                r = ld_gateup(L, w->ffn_gate, w->ffn_up, 1, NULL, NULL, &cl->gateup);
                if (r >= 0)
                        r = ld_one(L, w->ffn_down, LNAME(nb, l, "ffn_down.weight"), F, H, 1,
                                   &cl->down);
                return r;
        }

        uint32_t E = c->n_expert, F = c->n_ff_exp;
        bool shared = c->n_expert_shared > 0;
        r = check_present(w->ffn_gate_exps, LNAME(nb, l, "ffn_gate_exps.weight"));
        if (r >= 0)
                r = check_present(w->ffn_up_exps, LNAME(nb, l, "ffn_up_exps.weight"));
        if (r >= 0)
                r = check_present(w->ffn_down_exps, LNAME(nb, l, "ffn_down_exps.weight"));
        if (r >= 0)
                r = check_shape(w->ffn_gate_exps, H, F, E);
        if (r >= 0)
                r = check_shape(w->ffn_up_exps, H, F, E);
        if (r >= 0)
                r = check_shape(w->ffn_down_exps, F, H, E);
        if (r >= 0 && shared) {
                r = check_present(w->ffn_gate_shexp, LNAME(nb, l, "ffn_gate_shexp.weight"));
                if (r >= 0)
                        r = check_present(w->ffn_up_shexp, LNAME(nb, l, "ffn_up_shexp.weight"));
                if (r >= 0)
                        r = check_present(w->ffn_down_shexp,
                                          LNAME(nb, l, "ffn_down_shexp.weight"));
                /* the shared expert is stacked as expert E: it must have the routed width */
                if (r >= 0)
                        r = check_shape(w->ffn_gate_shexp, H, F, 1);
                if (r >= 0)
                        r = check_shape(w->ffn_up_shexp, H, F, 1);
                if (r >= 0)
                        r = check_shape(w->ffn_down_shexp, F, H, 1);
        }
        if (r < 0)
                return r;
        r = ld_gateup(L, w->ffn_gate_exps, w->ffn_up_exps, E, shared ? w->ffn_gate_shexp : NULL,
                      shared ? w->ffn_up_shexp : NULL, &cl->gateup);
        if (r < 0)
                return r;
        const struct gguf_tensor *dn[2] = {w->ffn_down_exps, w->ffn_down_shexp};
        r = ld_matrix(L, dn, shared ? 2 : 1, &cl->down);
        if (r < 0)
                return r;
        cl->down.N = H;
        cl->down.expert_bytes = (uint64_t) H * cl->down.row_bytes;

        r = ld_one(L, w->ffn_gate_inp, LNAME(nb, l, "ffn_gate_inp.weight"), H, E, 1, &cl->router);
        if (r < 0)
                return r;
        cl->router_bias = NULL;
        if (w->exp_probs_b)
                r = ld_vec(L, w->exp_probs_b, LNAME(nb, l, "exp_probs_b.bias"), E,
                           &cl->router_bias);
        return r;
}

static int ld_all(struct loader *L, struct x4_backend *b, const struct x4_weights *w) {
        const struct x4_config *c = &b->cfg;
        int r;

        r = ld_one(L, w->token_embd, "token_embd.weight", c->n_embd, c->n_vocab, 1, &b->embd);
        if (r < 0)
                return r;
        for (uint32_t l = 0; l < c->n_layer; l++) {
                r = ld_layer(L, c, &w->layers[l], l, true, &b->layers[l]);
                if (r < 0)
                        return r;
        }
        r = ld_vec(L, w->output_norm, "output_norm.weight", c->n_embd, &b->output_norm);
        if (r < 0)
                return r;
        r = ld_one(L, w->output, "output.weight", c->n_embd, c->n_vocab, 1, &b->output);
        if (r < 0 || !b->mtp)
                return r;

        /* docs/model.md §8: the NextN block, only with MTP on (else never read nor counted) */
        const uint32_t l = c->n_layer, H = c->n_embd;
        const struct x4_nextn_weights *N = &w->nextn;
        char nb[96];
        r = ld_layer(L, c, &w->layers[l], l, false, &b->layers[l]);
        if (r >= 0)
                r = ld_one(L, N->eh_proj, LNAME(nb, l, "nextn.eh_proj.weight"), 2 * (uint64_t) H, H,
                           1, &b->nextn_eh);
        if (r >= 0)
                r = ld_one(L, N->embed_tokens, LNAME(nb, l, "nextn.embed_tokens.weight"), H,
                           c->n_vocab, 1, &b->nextn_embd);
        if (r >= 0)
                r = ld_one(L, N->shared_head_head, LNAME(nb, l, "nextn.shared_head_head.weight"), H,
                           c->n_vocab, 1, &b->nextn_head);
        if (r >= 0)
                r = ld_vec(L, N->enorm, LNAME(nb, l, "nextn.enorm.weight"), H, &b->nextn_enorm);
        if (r >= 0)
                r = ld_vec(L, N->hnorm, LNAME(nb, l, "nextn.hnorm.weight"), H, &b->nextn_hnorm);
        if (r >= 0)
                r = ld_vec(L, N->shared_head_norm, LNAME(nb, l, "nextn.shared_head_norm.weight"), H,
                           &b->nextn_head_norm);
        return r;
}

/* ---- configuration checks and derived values -------------------------------------------------- */

/* `any_moe`: some block the backend runs (the trunk's, the NextN block's with MTP) is MoE. */
static int check_config(const struct x4_config *c, bool any_moe) {
        if (c->hc_mult == 0 || c->hc_mult > CU_HC_MAX)
                return log_error_errno(EOPNOTSUPP,
                                       "CUDA backend: hyper_connection.count %u is not supported "
                                       "(1..%u)",
                                       c->hc_mult, CU_HC_MAX);
        if (c->n_layer > X4_MAX_LAYERS)
                return log_error_errno(EINVAL, "CUDA backend: %u trunk layers, at most %u",
                                       c->n_layer, X4_MAX_LAYERS);
        if (c->n_embd % CU_CHUNK || c->qk_nope % CU_CHUNK || c->kv_lora_rank % CU_CHUNK ||
            c->q_lora_rank % CU_CHUNK || c->v_head % CU_CHUNK || c->n_ff % CU_CHUNK ||
            c->n_ff_exp % CU_CHUNK)
                return log_error_errno(EOPNOTSUPP,
                                       "CUDA backend: model widths (embedding %u, q_lora %u, "
                                       "kv_lora %u, qk_nope %u, v_head %u, ffn %u, expert ffn %u) "
                                       "must be multiples of %u",
                                       c->n_embd, c->q_lora_rank, c->kv_lora_rank, c->qk_nope,
                                       c->v_head, c->n_ff, c->n_ff_exp, CU_CHUNK);
        if (c->qk_rope % 4 || c->qk_rope == 0)
                return log_error_errno(EOPNOTSUPP,
                                       "CUDA backend: rope dimension %u must be a positive "
                                       "multiple of 4",
                                       c->qk_rope);
        if (c->n_expert > 256 || c->n_expert_used > c->n_expert || c->n_expert_shared > 1)
                return log_error_errno(EOPNOTSUPP,
                                       "CUDA backend: %u experts, %u used, %u shared: at most 256 "
                                       "experts and 1 shared expert are supported",
                                       c->n_expert, c->n_expert_used, c->n_expert_shared);
        if (any_moe && c->n_expert_used + c->n_expert_shared > CU_SLOTS_MAX)
                return log_error_errno(EOPNOTSUPP,
                                       "CUDA backend: %u routed + %u shared experts per token: "
                                       "at most %u are supported",
                                       c->n_expert_used, c->n_expert_shared, CU_SLOTS_MAX);
        if (c->expert_gating != 1 && c->expert_gating != 2 && any_moe)
                return log_error_errno(EOPNOTSUPP,
                                       "CUDA backend: expert_gating_func %u unknown (1 softmax, 2 "
                                       "sigmoid)",
                                       c->expert_gating);
        return 0;
}

/* docs/model.md §4.1 in double: f_i = base^(-2i/d), YaRN ramp over pair indices between the correction
 * bounds (HF yarn_find_correction_range: floor/ceil, clamped to [0, d-1]). */
static void rope_inv_freq(const struct x4_config *c, double *out) {
        double d = c->qk_rope, base = c->rope_freq_base;
        double low = 0, high = 0;

        if (c->yarn) {
                low = floor(d * log(c->yarn_orig_ctx / (c->yarn_beta_fast * 2 * M_PI)) /
                            (2 * log(base)));
                high = ceil(d * log(c->yarn_orig_ctx / (c->yarn_beta_slow * 2 * M_PI)) /
                            (2 * log(base)));
                low = MAX(low, 0.0);
                high = MIN(high, d - 1);
                if (low == high)
                        high += 0.001;
        }
        for (uint32_t i = 0; i < c->qk_rope / 2; i++) {
                double f = pow(base, -2.0 * i / d);
                if (!c->yarn) {
                        out[i] = f;
                        continue;
                }
                double ramp = (i - low) / (high - low);
                ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
                out[i] = f * (1 - ramp) + f / c->yarn_factor * ramp;
        }
}

/* X4_CUDA_PASS_TOKENS: the pass length asked for (a multiple of 64 up to CUDA_PASS_TOKENS_MAX;
 * anything else is named on stderr), or 0 (unset: the load picks it from the memory). A longer
 * pass reads the weights fewer times and expands a prompt's prefix (mha.cu) fewer times, for a
 * workspace that grows with it (expert rows, the attention partials). The results are the same
 * bits for any pass length (a pass boundary is a chunk boundary). */
static uint32_t pass_tokens(void) {
        const char *e = getenv("X4_CUDA_PASS_TOKENS");
        if (!e || !*e)
                return 0;
        char *end;
        errno = 0;
        unsigned long v = strtoul(e, &end, 10);
        if (errno || *end || v < 64 || v > CUDA_PASS_TOKENS_MAX || v % 64) {
                log_warning("X4_CUDA_PASS_TOKENS=%s ignored: expected a multiple of 64 from 64 to %u; "
                            "the pass length follows the memory",
                            e, CUDA_PASS_TOKENS_MAX);
                return 0;
        }
        return (uint32_t) v;
}

/* ---- workspace ------------------------------------------------------------------------------ */

static uint64_t ws_layout(struct x4_backend *b, uint8_t *base) {
        const struct x4_config *c = &b->cfg;
        uint64_t T = b->T_max, H = c->n_embd, nh = c->n_head;
        uint64_t QL = c->q_lora_rank, KV = c->kv_lora_rank, R = c->qk_rope, D = KV + R;
        uint64_t S = b->n_slots_max, off = 0;

#define WS(ptr, type, n)                                                                           \
        do {                                                                                       \
                (ptr) = base ? (type *) (base + off) : NULL;                                       \
                off = align_up(off + (uint64_t) (n) * sizeof(type));                              \
        } while (0)
        WS(b->X, float, T * c->hc_mult * H);
        WS(b->a, float, T * H);
        WS(b->hcp, float, T * CU_HCP_STRIDE);
        /* partial rows; two buffers when X4_CUDA_HC_EARLY may make pre-mappings early (cu_hc_early:
         * one reads the previous one's while it writes its own) */
        b->hcw_bufs = cu_hc_early_asked() ? 2 : 1;
        WS(b->hcw, float, b->hcw_bufs * T * cu_hc_slices((uint32_t) H) * CU_HCP_STRIDE);
        WS(b->hc_ticket, uint32_t, T);
        WS(b->route_ticket, uint32_t, (T + CU_ROUTE_TP - 1) / CU_ROUTE_TP);
        WS(b->zr, float, T * MAX(c->n_expert, 1u));
        WS(b->qkv, float, T * (QL + D));
        WS(b->q, float, T * nh * (c->qk_nope + R));
        WS(b->qabs, float, T * nh * D);
        WS(b->lat, float, T * nh * KV);
        WS(b->ao, float, T * nh * c->v_head);
        WS(b->o, float, T * H);
        WS(b->sel, int32_t, T * S);
        WS(b->groups, int32_t, cu_moe_group_ints((uint32_t) (T * S), MAX(c->n_expert, 1u) + 1));
        WS(b->gw, float, T * S);
        WS(b->act, float, T * b->hw);
        WS(b->dn, float, T * S * H);
        WS(b->hn, float, T * H); /* the head's normed rows; in the trunk, the mHC kernel's scratch (cu_hc.ug) */
        WS(b->logits, float, (uint64_t) b->logit_rows * c->n_vocab);
        WS(b->hid, float, T * H);
        WS(b->eh, float, b->mtp ? T * 2 * H : 0);
        WS(b->hin, float, b->mtp ? T * H : 0);
        WS(b->part, float, (uint64_t) b->part_slots * nh * (KV + 2));
        b->sc_values = (uint64_t) b->part_slots * nh * CU_ATTN_PART;
        WS(b->sc, float, b->sc_values);
        /* the widest product input a token: v_b's per-head latents, the experts' activations, the
         * HC and NextN inputs, q_b's heads */
        b->xbf_cap = T * MAX(MAX(nh * KV, b->hw), MAX((uint64_t) c->hc_mult * H, MAX(2 * H, nh * (c->qk_nope + R))));
        WS(b->xbf, uint16_t, b->xbf_cap);
        WS(b->ksb, float, CU_KS_FLOATS);
        WS(b->ks_ticket, uint32_t, CU_KS_TICKETS);
#undef WS
        return off;
}

/* The non-absorbed prompt attention (mha.cu) serves prompt passes where the device, the head shape
 * and every attention block's k_b / v_b types allow it and the split kernels' score workspace (idle
 * in prompt passes) holds a part's expanded rows, with either latent cache (the f16 cache's
 * instance passed the GPU suite's fixture, chunk and batch steps at e3ebbab).
 * Full model, H200 (667e2e1): prefill 512 8,490 ->
 * 9,000 tok/s, 4,096 5,267 -> 7,049, 32,768 1,237 -> 2,190. X4_CUDA_ATTN_PROMPT=tc2 (or fa) keeps
 * the absorbed prompt kernels, as do X4_CUDA_PROMPT_ATTN=fp32 and a forced X4_CUDA_ATTN kernel.
 * Returns 2 when asked for by name (=mha: a reason it cannot run is logged), 1 by default. */
static int mha_wanted(void) {
        static int want = -1;
        if (want < 0) {
                const char *e = getenv("X4_CUDA_ATTN_PROMPT"), *f = getenv("X4_CUDA_ATTN");
                const char *p = getenv("X4_CUDA_PROMPT_ATTN");
                if (e && *e && !streq(e, "mha") && !streq(e, "tc2") && !streq(e, "fa")) {
                        log_warning("X4_CUDA_ATTN_PROMPT=%s ignored: expected mha, tc2 or fa", e);
                        e = NULL;
                }
                if (e && streq(e, "mha"))
                        want = 2;
                else
                        want = (!e || !*e) && (!f || !*f) && !(p && streq(p, "fp32"));
        }
        return want;
}

static void mha_setup(struct x4_backend *b) {
        const struct x4_config *c = &b->cfg;
        uint64_t nh = c->n_head, DK = (uint64_t) c->qk_nope + c->qk_rope, V = c->v_head;
        b->mha_ok = false;
        if (!mha_wanted())
                return;
        const char *why = NULL;
        uint64_t rows = b->sc_values * sizeof(float) / (2 * nh * (DK + V)) / 64 * 64;
        if (!cu_mha_setup(c->qk_nope, c->qk_rope, c->v_head, c->kv_lora_rank, &b->mha_bn, &b->mha_small))
                why = "no kernel for this device (sm_80 or newer) or head shape";
        for (uint32_t l = 0; !why && l < c->n_layer; l++)
                if (!cu_mha_supported(b->layers[l].k_b.type, b->layers[l].v_b.type))
                        why = "attn_k_b / attn_v_b are not both F32, F16 or BF16";
        if (!why && (rows < CU_ATTN_PART_TC2 || rows > UINT32_MAX)) /* a part of the longest length fits */
                why = "the expansion scratch holds too few rows";
        if (why) {
                if (mha_wanted() == 2)
                        log_warning("CUDA backend: X4_CUDA_ATTN_PROMPT=mha: %s; the absorbed prompt kernels serve", why);
                return;
        }
        b->mha_rows_cap = (uint32_t) rows;
        b->mha_kx = (uint16_t *) b->sc;
        b->mha_vx = b->mha_kx + nh * rows * DK;
        b->mha_ok = true;
}

/* The pass's jobs for the non-absorbed path (mha_plan.h): attention groups of as many tokens as
 * the partial workspace holds in rows of V + 2 values, a job per (run of one sequence's tokens,
 * part of its context), batches that fit the expansion scratch; uploaded once, the same for every
 * layer. false: the pass takes the absorbed kernels. */
static bool mha_prepare(struct x4_backend *b, uint32_t T) {
        const struct x4_config *c = &b->cfg;
        /* the prompt kernels' part length (this is a prompt pass) */
        uint32_t plen = cu_attn_part_len(c->kv_lora_rank + c->qk_rope, b->cache_type == X4_CACHE_F16);
        if (plen == 0) /* the decode kernel's (parts by position): not a prompt pass's */
                return false;
        uint64_t slots = (uint64_t) b->part_slots * (c->kv_lora_rank + 2) / (c->v_head + 2);
        struct mha_plan *mp = &b->mha_plan;

        if (!b->pass_pos_h || !b->pass_tokpt_h ||
            mha_plan_build(mp, b->pass_pos_h, b->pass_tokpt_h, T, plen, b->mha_rows_cap, slots) < 0)
                return false;
        b->mha_plen = plen;
        if (mp->n_jobs > b->mha_jobs_dcap) {
                cudaFree(b->mha_jobs_d);
                b->mha_jobs_d = NULL;
                b->mha_jobs_dcap = 0;
                if (CU_TRY(cudaMalloc((void **) &b->mha_jobs_d, (size_t) mp->jobs_cap * sizeof *b->mha_jobs_d),
                           ENOMEM, "allocating attention jobs") < 0)
                        return false;
                b->mha_jobs_dcap = mp->jobs_cap;
        }
        return CU_TRY(cudaMemcpyAsync(b->mha_jobs_d, mp->jobs, (size_t) mp->n_jobs * sizeof *mp->jobs,
                                      cudaMemcpyHostToDevice, b->stream),
                      EIO, "uploading attention jobs") >= 0;
}

/* ---- create / destroy ----------------------------------------------------------------------- */

static void prof_free(struct cu_prof *p) {
        for (uint32_t i = 0; i < p->cap; i++)
                cudaEventDestroy(p->ev[i]);
        free(p->ev);
        free(p->cls);
        free(p->kern);
}

static void graphs_drop(struct x4_backend *b) {
        for (uint32_t i = 0; i < b->n_graphs; i++)
                cudaGraphExecDestroy(b->graphs[i].exec);
        b->n_graphs = 0;
}

static void cuda_destroy(struct x4_backend *b) {
        if (!b)
                return;
        cudaSetDevice(b->device);
        if (b->stream)
                cudaStreamSynchronize(b->stream);
        cudaFree(b->wmem);
        cudaFree(b->cache);
        cudaFree(b->ws);
        cudaFree(b->meta_d);
        cudaFree(b->inv_freq);
        cudaFreeHost(b->meta_h);
        cudaFree(b->mha_jobs_d);
        mha_plan_free(&b->mha_plan);
        prof_free(&b->prof);
        graphs_drop(b);
        free(b->graphs);
        free(b->trace_z);
        free(b->trace_bias);
        free(b->trace_sel);
        if (b->stream)
                cudaStreamDestroy(b->stream);
        free(b->layers);
        free(b);
}

static void cuda_destroyp(struct x4_backend **b) {
        cuda_destroy(*b);
}

static int gib_fmt(char *buf, size_t n, uint64_t bytes) {
        return snprintf(buf, n, "%.2f GiB", (double) bytes / (1024.0 * 1024.0 * 1024.0));
}

/* The module's copy of the logger (see meson.build: everything here is hidden, so the host's
 * log.c is not ours) forwards to the caller's params->log while a backend lives, so the
 * operator sees the module's messages through the caller's logger (the seam's calls hand their
 * errors back as values through log_error_value, create's "CUDA backend: no usable CUDA device: ..."
 * too). The
 * module's logger is process-wide, so the forwarding is too: installed by the first create(),
 * removed when the last backend goes (or the create that installed it fails). The level filter
 * is the caller's: this copy passes everything on. */
struct log_forward {
        void (*fn)(int level, const char *message, void *userdata);
        void *userdata;
};
static struct log_forward log_forward;
static unsigned n_backends_live;

static void log_forward_sink(int level, const char *message, void *userdata) {
        const struct log_forward *f = userdata;
        f->fn(level, message, f->userdata);
}

static void log_forward_install(const struct x4_backend_params *params) {
        if (!params->log)
                return;
        log_forward = (struct log_forward){params->log, params->log_userdata};
        log_set_max_level(LOG_DEBUG);
        log_set_sink(log_forward_sink, &log_forward);
}

static void log_forward_release(void) {
        if (n_backends_live > 0)
                return;
        log_set_sink(NULL, NULL);
        log_set_max_level(LOG_INFO);
        log_forward = (struct log_forward){0};
}

static int cuda_create_backend(const struct x4_model *model, const struct x4_backend_params *params,
                               struct x4_backend **ret) {
        _cleanup_(cuda_destroyp) struct x4_backend *b = NULL;
        struct cudaDeviceProp prop;
        size_t mem_free = 0, mem_total = 0;
        int r, n_dev = 0;

        b = calloc(1, sizeof *b);
        if (!b)
                return log_error_errno(ENOMEM, "CUDA backend: out of memory");
        b->cfg = *x4_model_config(model);
        const struct x4_config *c = &b->cfg;
        const struct x4_weights *W = x4_model_weights(model);
        b->mtp = params->mtp;
        if (b->mtp && !W->has_nextn)
                return log_error_errno(EOPNOTSUPP,
                                       "cuda backend: MTP needs the model's NextN block (blk.%u): "
                                       "the file has xing4_0.nextn_predict_layers = %u%s",
                                       c->n_layer, c->n_nextn,
                                       c->n_nextn ? " but not all of its tensors" : "");
        /* the NextN block's layer is a MoE layer when it has a router (docs/model.md §8) */
        bool nextn_moe = b->mtp && W->layers[c->n_layer].ffn_gate_inp != NULL;
        bool any_moe = c->n_dense < c->n_layer || nextn_moe;
        r = check_config(c, any_moe);
        if (r < 0)
                return r;
        b->n_cache_layers = c->n_layer + (b->mtp ? 1u : 0u);

        r = CU_TRY(cudaGetDeviceCount(&n_dev), ENODEV, "no usable CUDA device");
        if (r < 0)
                return r;
        if (params->device < 0 || params->device >= n_dev)
                return log_error_errno(ENODEV, "CUDA backend: device %d requested, %d present",
                                       params->device, n_dev);
        b->device = params->device;
        r = CU_TRY(cudaSetDevice(b->device), ENODEV, "selecting the device");
        if (r >= 0)
                r = CU_TRY(cudaGetDeviceProperties(&prop, b->device), ENODEV,
                           "reading device properties");
        if (r < 0)
                return r;
        if (prop.major * 10 + prop.minor < 75)
                return log_error_errno(EOPNOTSUPP,
                                       "CUDA backend: %s is sm_%d%d; this module is built for "
                                       "sm_75 and newer",
                                       prop.name, prop.major, prop.minor);
        snprintf(b->name, sizeof b->name, "cuda:%s", prop.name);
        /* programmatic dependent launch where the hardware has it (X4_CUDA_PDL=0: off, for
         * comparison); the kernels' waits make it change no result */
        {
                const char *pv = getenv("X4_CUDA_PDL");
                cu_pdl = prop.major >= 9 && !(pv && streq(pv, "0"));
                /* X4_CUDA_CARVEOUT_MAX=1: every kernel the largest shared-memory carveout (launch.h) */
                const char *cv = getenv("X4_CUDA_CARVEOUT_MAX");
                if (cv && *cv && !streq(cv, "0") && !streq(cv, "1"))
                        log_warning("X4_CUDA_CARVEOUT_MAX=%s ignored: expected 0 or 1", cv);
                cu_carveout_max = cv && streq(cv, "1");
                if (cu_carveout_max)
                        log_warning("X4_CUDA_CARVEOUT_MAX=1: every kernel asks for the largest shared-memory carveout "
                                    "(a measurement; the results are the same)");
        }
        r = CU_TRY(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), EIO,
                   "creating a stream");
        if (r < 0)
                return r;
        r = CU_TRY(cudaMemGetInfo(&mem_free, &mem_total), EIO, "reading free memory");
        if (r < 0)
                return r;
        b->mem_total = mem_total;

        b->layers = calloc(b->n_cache_layers ? b->n_cache_layers : 1, sizeof *b->layers);
        if (!b->layers)
                return log_error_errno(ENOMEM, "CUDA backend: out of memory");

        /* plan: weights, workspace, cache pages against what the card (or the limit) has */
        struct loader L = {.plan = true, .params = params, .stream = b->stream};
        r = ld_all(&L, b, W);
        if (r < 0)
                return r;
        b->wbytes = L.off;
        uint64_t payload = L.done; /* tensor bytes without alignment padding: progress runs to 1 */

        uint32_t pass_asked = pass_tokens(); /* 0: chosen from the memory below */
        {
                const char *gv = getenv("X4_CUDA_GRAPHS");
                b->graphs_off = gv && streq(gv, "0");
        }
        att_chunk_setup(b, &prop);
        b->n_slots_max = any_moe ? c->n_expert_used + (c->n_expert_shared ? 1 : 0) : 1;
        if (b->n_slots_max == 0)
                b->n_slots_max = 1;
        /* FFN rows per token: k+1 expert slots of n_ff_exp, or one dense slot of n_ff */
        bool any_dense = c->n_dense > 0 || (b->mtp && !nextn_moe);
        b->hw = MAX(any_moe ? (uint64_t) b->n_slots_max * c->n_ff_exp : 0,
                    any_dense ? (uint64_t) c->n_ff : 0);
        b->page_tokens = params->page_tokens ? params->page_tokens : CUDA_DEFAULT_PAGE_TOKENS;
        b->cache_type = params->cache_type;
        if (b->cache_type != X4_CACHE_F32 && b->cache_type != X4_CACHE_F16)
                return log_error_errno(EOPNOTSUPP,
                                       "CUDA backend: cache type %u not supported (0 = f32, 1 = "
                                       "f16)",
                                       b->cache_type);
        uint64_t D = (uint64_t) c->kv_lora_rank + c->qk_rope;
        /* with MTP every page holds the NextN block's layer too (snapshots and prefix pages carry
         * it: page_read/page_write/page_copy move whole pages) */
        b->page_bytes = (uint64_t) b->n_cache_layers * b->page_tokens * D *
                        (b->cache_type == X4_CACHE_F16 ? 2 : 4);

        uint64_t room = mem_free > CUDA_MEMORY_MARGIN ? mem_free - CUDA_MEMORY_MARGIN : 0;
        if (params->memory_limit && params->memory_limit < room)
                room = params->memory_limit;
        /* the pass length: the longest of CUDA_PASS_TOKENS_AUTO, halved down to
         * CUDA_MAX_BATCH_TOKENS, whose workspace takes at most 1/CUDA_PASS_WS_SHARE of what the
         * weights leave (and leaves room for the cache pages asked for) */
        uint32_t ctx_parts = DIV_ROUND_UP(MAX(c->n_ctx_train, 65536u), CU_ATTN_PART);
        for (uint32_t T = pass_asked ? pass_asked : CUDA_PASS_TOKENS_AUTO;; T /= 2) {
                b->T_max = T;
                b->logit_rows = MIN(T, CUDA_LOGIT_ROWS);
                b->part_slots = MAX(T * 8, ctx_parts);
                b->ws_bytes = ws_layout(b, NULL);
                if (pass_asked || T <= CUDA_MAX_BATCH_TOKENS)
                        break;
                uint64_t left = room > b->wbytes ? room - b->wbytes : 0;
                uint64_t pages = (uint64_t) params->n_pages * b->page_bytes;
                if (b->ws_bytes <= left / CUDA_PASS_WS_SHARE && b->ws_bytes + pages <= left)
                        break;
        }
        uint64_t fixed = b->wbytes + b->ws_bytes;
        char s_room[32], s_w[32], s_ws[32], s_need[32];
        gib_fmt(s_room, sizeof s_room, room);
        gib_fmt(s_w, sizeof s_w, b->wbytes);
        gib_fmt(s_ws, sizeof s_ws, b->ws_bytes);
        if (params->n_pages) {
                uint64_t need = fixed + (uint64_t) params->n_pages * b->page_bytes;
                gib_fmt(s_need, sizeof s_need, need);
                if (need > room)
                        return log_error_errno(ENOMEM,
                                               "CUDA backend: %u cache pages of %u tokens (%u "
                                               "tokens of context) + weights %s + workspace %s "
                                               "need %s, %s has room for %s",
                                               params->n_pages, b->page_tokens,
                                               params->n_pages * b->page_tokens, s_w, s_ws, s_need,
                                               prop.name, s_room);
                b->n_pages = params->n_pages;
        } else {
                uint64_t pages = room > fixed ? (room - fixed) / b->page_bytes : 0;
                gib_fmt(s_need, sizeof s_need, fixed + b->page_bytes);
                if (pages == 0)
                        return log_error_errno(ENOMEM,
                                               "CUDA backend: weights %s + workspace %s + one "
                                               "cache page (%u tokens) need %s, %s has room for %s",
                                               s_w, s_ws, b->page_tokens, s_need, prop.name,
                                               s_room);
                b->n_pages = pages > UINT32_MAX ? UINT32_MAX : (uint32_t) pages;
        }

        /* allocate and stream the weights through pinned staging buffers */
        r = CU_TRY(cudaMalloc((void **) &b->wmem, b->wbytes), ENOMEM, "allocating the weights");
        if (r < 0)
                return r;
        L = (struct loader){.plan = false,
                            .base = b->wmem,
                            .params = params,
                            .stream = b->stream,
                            .total = payload};
        for (int i = 0; i < 2; i++) {
                r = CU_TRY(cudaHostAlloc(&L.stage[i], CUDA_STAGING_BYTES, cudaHostAllocDefault),
                           ENOMEM, "allocating pinned staging memory");
                if (r >= 0)
                        r = CU_TRY(cudaEventCreateWithFlags(&L.ev[i], cudaEventDisableTiming), EIO,
                                   "creating an event");
                if (r < 0)
                        break;
        }
        if (r >= 0)
                r = ld_all(&L, b, W);
        if (r >= 0)
                r = ld_flush(&L);
        if (r >= 0)
                r = CU_TRY(cudaStreamSynchronize(b->stream), EIO, "finishing the weight upload");
        for (int i = 0; i < 2; i++) {
                if (L.ev[i])
                        cudaEventDestroy(L.ev[i]);
                if (L.stage[i])
                        cudaFreeHost(L.stage[i]);
        }
        if (r < 0)
                return r;

        double inv[128];
        rope_inv_freq(c, inv);
        r = CU_TRY(cudaMalloc((void **) &b->inv_freq, sizeof(double) * (c->qk_rope / 2)), ENOMEM,
                   "allocating rope frequencies");
        if (r >= 0)
                r = CU_TRY(cudaMemcpyAsync(b->inv_freq, inv, sizeof(double) * (c->qk_rope / 2),
                                           cudaMemcpyHostToDevice, b->stream),
                           EIO, "uploading rope frequencies");
        if (r >= 0)
                r = CU_TRY(cudaMalloc(&b->ws, b->ws_bytes), ENOMEM, "allocating the workspace");
        if (r < 0)
                return r;
        ws_layout(b, b->ws);
        cu_attention_setup(c->kv_lora_rank, c->qk_rope);
        mha_setup(b);
        cu_mm_tc_setup();
        cu_hc_setup();
        cu_route_setup();
        /* the fused HC kernel's tickets start (and every launch leaves them) at zero */
        r = CU_TRY(cudaMemsetAsync(b->hc_ticket, 0, sizeof(uint32_t) * b->T_max, b->stream), EIO,
                   "clearing the workspace");
        /* the router's tickets likewise (one per CU_ROUTE_TP tokens) */
        if (r >= 0)
                r = CU_TRY(cudaMemsetAsync(b->route_ticket, 0,
                                           sizeof(uint32_t) * ((b->T_max + CU_ROUTE_TP - 1) / CU_ROUTE_TP), b->stream),
                           EIO, "clearing the workspace");
        if (r >= 0)
                r = CU_TRY(cudaMemsetAsync(b->ks_ticket, 0, sizeof(uint32_t) * CU_KS_TICKETS, b->stream), EIO,
                           "clearing the workspace");
        if (r >= 0)
                r = CU_TRY(cudaMalloc(&b->cache, (uint64_t) b->n_pages * b->page_bytes), ENOMEM,
                   "allocating the latent cache");
        /* zeroed so a page never read back holds stale data of another run */
        if (r >= 0)
                r = CU_TRY(cudaMemsetAsync(b->cache, 0, (uint64_t) b->n_pages * b->page_bytes,
                                           b->stream),
                           EIO, "clearing the latent cache");
        if (r >= 0)
                r = CU_TRY(cudaStreamSynchronize(b->stream), EIO, "clearing the latent cache");
        if (r < 0)
                return r;

        if (params->route_trace) {
                uint32_t E = MAX(c->n_expert, 1u);
                b->route_trace = params->route_trace;
                b->route_trace_ud = params->route_trace_userdata;
                b->trace_z = malloc((uint64_t) b->T_max * E * sizeof(float));
                b->trace_bias = malloc(E * sizeof(float));
                b->trace_sel = malloc((uint64_t) b->T_max * b->n_slots_max * sizeof(int32_t));
                if (!b->trace_z || !b->trace_bias || !b->trace_sel)
                        return log_error_errno(ENOMEM, "CUDA backend: out of memory");
        }
        log_debug("CUDA backend on %s: weights %s, workspace %s (passes of %u tokens), %u pages of %u tokens%s",
                  prop.name, s_w, s_ws, b->T_max, b->n_pages, b->page_tokens,
                  b->mtp ? " (MTP: NextN block loaded, its layer in every page)" : "");
        *ret = TAKE_PTR(b);
        return 0;
}

static int cuda_create(const struct x4_model *model, const struct x4_backend_params *params,
                       struct x4_backend **ret, char *err, size_t err_size) {
        int r;

        log_clear_last_error();
        if (n_backends_live == 0)
                log_forward_install(params);
        r = cuda_create_backend(model, params, ret);
        if (r < 0) {
                log_forward_release();
                return log_error_value(r, err, err_size);
        }
        n_backends_live++;
        return 0;
}

static void cuda_destroy_backend(struct x4_backend *b) {
        if (!b)
                return;
        cuda_destroy(b);
        if (n_backends_live > 0)
                n_backends_live--;
        log_forward_release();
}

/* ---- profiling ------------------------------------------------------------------------------ */

static void prof_mark(struct x4_backend *b, int cls) {
        struct cu_prof *p = &b->prof;

        if (!p->on || p->failed)
                return;
        if (p->n == p->cap) {
                uint32_t cap = p->cap ? p->cap * 2 : 1024;
                cudaEvent_t *ev = realloc(p->ev, cap * sizeof *ev);
                if (ev)
                        p->ev = ev;
                uint8_t *cl = realloc(p->cls, cap);
                if (cl)
                        p->cls = cl;
                unsigned long long *k = realloc(p->kern, cap * sizeof *k);
                if (k)
                        p->kern = k;
                if (!ev || !cl || !k) {
                        p->failed = true;
                        return;
                }
                for (uint32_t i = p->cap; i < cap; i++) {
                        if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
                                p->failed = true;
                                return;
                        }
                        p->cap = i + 1; /* prof_free destroys exactly the events made */
                }
        }
        cudaEventRecord(p->ev[p->n], b->stream);
        p->cls[p->n] = (uint8_t) cls;
        p->kern[p->n] = cu_launches;
        p->n++;
}

/* --profile's byte counts (x4_backend_profile.classes[].bytes): what class cls had to move. */
static void prof_bytes(struct x4_backend *b, int cls, uint64_t n) {
        if (b->prof.on && !b->prof.failed)
                b->prof.class_bytes[cls] += n;
}

/* After the forward's synchronization: fold the marks into the class totals. */
static void prof_collect(struct x4_backend *b) {
        struct cu_prof *p = &b->prof;

        if (!p->on || p->failed || p->n == 0)
                return;
        for (uint32_t i = 1; i < p->n; i++) {
                float ms = 0.0f;
                cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]);
                p->class_ms[p->cls[i]] += ms;
                p->class_kernels[p->cls[i]] += p->kern[i] - p->kern[i - 1];
        }
        p->kernels += p->kern[p->n - 1] - p->kern[0];
        p->forwards++;
        p->n = 0;
}

static int cuda_profile(struct x4_backend *b, bool on, struct x4_backend_profile *ret) {
        struct cu_prof *p = &b->prof;

        if (p->failed)
                return log_error_errno(ENOMEM, "CUDA backend: profiling ran out of memory");
        if (ret) {
                *ret = (struct x4_backend_profile){.forwards = p->forwards, .kernels = p->kernels};
                for (int c = 0; c < PC_N && ret->n_classes < X4_PROFILE_MAX_CLASSES; c++) {
                        if (p->class_kernels[c] == 0 && p->class_ms[c] == 0.0)
                                continue;
                        ret->classes[ret->n_classes].name = prof_names[c];
                        ret->classes[ret->n_classes].kernels = p->class_kernels[c];
                        ret->classes[ret->n_classes].ms = p->class_ms[c];
                        ret->classes[ret->n_classes].bytes = p->class_bytes[c];
                        ret->n_classes++;
                }
        }
        if (on) {
                p->forwards = p->kernels = 0;
                memset(p->class_kernels, 0, sizeof p->class_kernels);
                memset(p->class_ms, 0, sizeof p->class_ms);
                memset(p->class_bytes, 0, sizeof p->class_bytes);
        }
        p->n = 0;
        p->on = on;
        return 0;
}


/* ---- routing trace (diagnostics) ------------------------------------------------------------ */

/* After a layer's router: wait for it and hand every token's selection scores (gating score +
 * bias, recomputed here from the router logits with the host's expf: within an ulp or so of what
 * the router kernel ranked) and routed choices to the caller. */
static void route_trace_layer(struct x4_backend *b, uint32_t l, uint32_t T, const float *bias_d) {
        const struct x4_config *c = &b->cfg;
        uint32_t E = c->n_expert, K = c->n_expert_used, S = K + (c->n_expert_shared ? 1 : 0);
        float scores[256];

        if (b->trace_err)
                return;
        int r = CU_TRY(cudaMemcpyAsync(b->trace_z, b->zr, (uint64_t) T * E * sizeof(float),
                                       cudaMemcpyDeviceToHost, b->stream),
                       EIO, "route trace: copying router logits");
        if (r >= 0)
                r = CU_TRY(cudaMemcpyAsync(b->trace_sel, b->sel, (uint64_t) T * S * sizeof(int32_t),
                                           cudaMemcpyDeviceToHost, b->stream),
                           EIO, "route trace: copying selections");
        if (r >= 0 && bias_d)
                r = CU_TRY(cudaMemcpyAsync(b->trace_bias, bias_d, E * sizeof(float),
                                           cudaMemcpyDeviceToHost, b->stream),
                           EIO, "route trace: copying the bias");
        if (r >= 0)
                r = CU_TRY(cudaStreamSynchronize(b->stream), EIO, "route trace");
        if (r < 0) {
                b->trace_err = r;
                return;
        }
        for (uint32_t t = 0; t < T; t++) {
                const float *z = b->trace_z + (uint64_t) t * E;
                float m = -INFINITY, sum = 0.0f;
                for (uint32_t e = 0; e < E; e++)
                        m = fmaxf(m, z[e]);
                for (uint32_t e = 0; e < E; e++) {
                        scores[e] = c->expert_gating == 2 ? 1.0f / (1.0f + expf(-z[e]))
                                                          : expf(z[e] - m);
                        sum += scores[e];
                }
                for (uint32_t e = 0; e < E; e++) {
                        if (c->expert_gating != 2)
                                scores[e] /= sum;
                        scores[e] += bias_d ? b->trace_bias[e] : 0.0f;
                }
                b->route_trace(l, b->trace_tok0 + t, scores, E, b->trace_sel + (uint64_t) t * S, K,
                               b->route_trace_ud);
        }
}

/* ---- forward -------------------------------------------------------------------------------- */

static int meta_reserve(struct x4_backend *b, size_t n) {
        int r;

        if (n <= b->meta_cap)
                return 0;
        n = MAX(n, b->meta_cap * 2);
        cudaFree(b->meta_d);
        cudaFreeHost(b->meta_h);
        b->meta_d = NULL;
        b->meta_h = NULL;
        b->meta_cap = 0;
        r = CU_TRY(cudaMalloc((void **) &b->meta_d, n * sizeof(uint32_t)), ENOMEM,
                   "allocating batch metadata");
        if (r >= 0)
                r = CU_TRY(cudaHostAlloc((void **) &b->meta_h, n * sizeof(uint32_t),
                                         cudaHostAllocDefault),
                           ENOMEM, "allocating pinned batch metadata");
        if (r < 0)
                return r;
        b->meta_cap = n;
        return 0;
}

/* X4_CUDA_L2PF=0 off, 1 on (read once) */
static bool l2pf_wanted(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_L2PF");
                if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
                        log_warning("X4_CUDA_L2PF=%s ignored: expected 0 or 1", e);
                on = e && !strcmp(e, "1");
                if (on)
                        log_warning("X4_CUDA_L2PF=1: decode passes of up to %d tokens ask the L2 for the next products' "
                                    "weights (a measurement; the results are the same)", CUDA_L2PF_MAX_T);
        }
        return on;
}

/* X4_PROBE_SKIP=NAME,NAME,... (measurements only; every result is wrong, said once in the log):
 * the trunk's launches of those kinds are left out, so a decode step's time without them says
 * what each costs inside the replayed, PDL-overlapped step, which a profile of eager launches
 * (--profile, ncu) cannot: hc_attn, qkv_a, mla_prep, q_b, k_b (with the RoPE side blocks),
 * q_rope, attn (the attention and its combine), v_b, o, hc_ffn, router, gateup, down. The
 * buffers they would write keep what they held, so the step runs on stale, finite values. */
enum {
        PS_HC_ATTN = 1u << 0, PS_QKV_A = 1u << 1, PS_MLA_PREP = 1u << 2, PS_Q_B = 1u << 3,
        PS_K_B = 1u << 4, PS_Q_ROPE = 1u << 5, PS_ATTN = 1u << 6, PS_V_B = 1u << 7, PS_O = 1u << 8,
        PS_HC_FFN = 1u << 9, PS_ROUTER = 1u << 10, PS_GATEUP = 1u << 11, PS_DOWN = 1u << 12,
};
static bool probe_skip(uint32_t what) {
        static const char *const names[] = {"hc_attn", "qkv_a", "mla_prep", "q_b", "k_b", "q_rope", "attn",
                                            "v_b", "o", "hc_ffn", "router", "gateup", "down"};
        static int64_t mask = -1;
        if (mask < 0) {
                mask = 0;
                const char *e = getenv("X4_PROBE_SKIP");
                for (const char *p = e; p && *p;) {
                        size_t n = strcspn(p, ",");
                        uint32_t i = 0;
                        while (i < sizeof names / sizeof names[0] && !(strlen(names[i]) == n && !strncmp(p, names[i], n)))
                                i++;
                        if (i < sizeof names / sizeof names[0])
                                mask |= 1 << i;
                        else
                                log_warning("X4_PROBE_SKIP: '%.*s' ignored: expected hc_attn, qkv_a, mla_prep, q_b, "
                                            "k_b, q_rope, attn, v_b, o, hc_ffn, router, gateup or down", (int) n, p);
                        p += n + (p[n] == ',');
                }
                if (mask)
                        log_warning("X4_PROBE_SKIP=%s: those launches are left out of every trunk pass, for a "
                                    "measurement; every result is wrong", e);
        }
        return (mask & what) != 0;
}

/* The bytes of a stored matrix (all its rows). */
static uint64_t w_bytes(const struct cu_w *w) {
        return (uint64_t) w->N * w->row_bytes;
}

/* X4_CUDA_L2PF_MB=N (a measurement of how much the L2 holds for the products, with
 * X4_CUDA_L2PF=1): each kernel's ranges cut to N MiB in all, the first ranges first; unset, no cut */
static struct cu_pf l2pf_cut(struct cu_pf pf) {
        static int64_t cap = -2;
        if (cap == -2) {
                const char *e = getenv("X4_CUDA_L2PF_MB");
                char *end = NULL;
                long v = e && *e ? strtol(e, &end, 10) : -1;
                if (e && *e && (*end || v < 0)) {
                        log_warning("X4_CUDA_L2PF_MB=%s ignored: expected a whole number of MiB", e);
                        v = -1;
                }
                cap = v < 0 ? -1 : (int64_t) v << 20;
        }
        if (cap < 0)
                return pf;
        uint64_t left = (uint64_t) cap;
        for (int r = 0; r < CU_PF_MAX; r++) {
                pf.n[r] = pf.n[r] < left ? pf.n[r] : left;
                left -= pf.n[r];
        }
        return pf;
}

static void mv(struct x4_backend *b, const struct cu_w *w, const float *x, uint64_t x_pstride,
               float *y, uint64_t y_pstride, uint32_t P) {
        struct cu_mv a = {
                .w = w->d, .type = w->type, .row_bytes = w->row_bytes, .K = w->K, .N = w->N,
                .G = w->N, .x = x, .x_pstride = x_pstride, .x_div = 1, .y = y,
                .y_pstride = y_pstride, .P = P,
        };
        cu_matvec(&a, b->stream);
}

/* The attention sublayer of block l after its input norm (input b->a, output b->o): docs/model.md
 * §4, the same launches for a trunk block and for the NextN block (whose rows live in the cache's
 * layer n_layer). */
static void attn_sublayer(struct x4_backend *b, const struct cu_layer *cl, uint32_t l, uint32_t T,
                          const uint32_t *d_pos, const struct cu_cache *cache,
                          const struct cu_attn *attn, const uint32_t *att, uint32_t n_att) {
        const struct x4_config *c = &b->cfg;
        uint32_t H = c->n_embd, nh = c->n_head, nope = c->qk_nope;
        uint32_t QL = c->q_lora_rank, KV = c->kv_lora_rank, R = c->qk_rope, D = KV + R;
        uint32_t V = c->v_head;
        cudaStream_t s = b->stream;

        /* docs/model.md §4 steps 1-2: [q_a | latent | k_pe] = W_qa‖W_kva · a, norms, rope, store */
        if (!probe_skip(PS_QKV_A))
                mv(b, &cl->qkv_a, b->a, H, b->qkv, QL + D, T);
        prof_mark(b, PC_ATTN_PROJ);
        if (!probe_skip(PS_MLA_PREP))
                cu_mla_prep(b->qkv, T, QL, KV, R, cl->q_a_norm, cl->kv_a_norm, c->rms_eps,
                            b->inv_freq, c->rope_interleave, cache, l, s);
        prof_mark(b, PC_MLA_PREP);
        /* q = W_qb · qa */
        if (!probe_skip(PS_Q_B))
                mv(b, &cl->q_b, b->qkv, QL + D, b->q, (uint64_t) nh * (nope + R), T);
        if (b->mha_pass) {
                /* the non-absorbed form (mha.cu): RoPE of q_pe in place; each part's keys and values
                 * expanded from the cache, attention, the parts folded into the per-head value rows
                 * (b->ao) v_b would have made; then out = W_o · o */
                prof_mark(b, PC_ATTN_PROJ);
                struct cu_attn qa = *attn;
                qa.qc = b->q;
                qa.KV = nope; /* rows of nope + R: RoPE(q_pe) over q_pe */
                cu_q_rope(&qa, T, d_pos, s);
                prof_mark(b, PC_MLA_PREP);
                size_t es = cl->k_b.type == GGML_TYPE_F32 ? 4 : 2;
                struct cu_mha m = {
                        .kb = cl->k_b.d, .vb = cl->v_b.d, .w_type = cl->k_b.type,
                        .kb_row_elems = cl->k_b.row_bytes / es, .vb_row_elems = cl->v_b.row_bytes / es,
                        .kx = b->mha_kx, .vx = b->mha_vx, .rows_cap = b->mha_rows_cap, .q = b->q,
                        .n_head = nh, .nope = nope, .R = R, .V = V, .KV = KV, .scale = c->attn_scale,
                        .part = b->part,
                };
                const struct mha_plan *mp = &b->mha_plan;
                for (uint32_t gi = 0; gi < mp->n_groups; gi++) {
                        const struct mha_group *g = &mp->groups[gi];
                        for (uint32_t bi = g->b0; bi < g->b0 + g->nb; bi++) {
                                const struct mha_batch *bt = &mp->batches[bi];
                                m.jobs = b->mha_jobs_d + bt->j0;
                                m.n_jobs = bt->nj;
                                m.rows = bt->rows;
                                m.qtiles = bt->qtiles;
                                cu_mha_batch(&m, b->mha_bn, b->mha_small, cache, l, s);
                        }
                        cu_attn_combine(b->part, g->t0, g->n, g->maxp, b->mha_plen, nh, V,
                                        cache->tok_pos, b->ao, s);
                }
                prof_mark(b, PC_ATTENTION);
                mv(b, &cl->o, b->ao, (uint64_t) nh * V, b->o, H, T);
                prof_mark(b, PC_ATTN_PROJ);
                return;
        }
        /* absorb: q_c[h] = Kb[h]ᵀ q_nope[h]; cu_q_rope appends RoPE(q_pe) */
        struct cu_mv kb = {
                .w = cl->k_b.d, .type = cl->k_b.type, .row_bytes = cl->k_b.row_bytes,
                .K = nope, .N = nh * KV, .G = KV, .x = b->q,
                .x_pstride = (uint64_t) nh * (nope + R), .x_gstride = nope + R,
                .x_div = 1, .y = b->qabs, .y_pstride = (uint64_t) nh * D,
                .y_gstride = D, .P = T,
        };
        if (cu_rope_side_on()) {
                /* X4_CUDA_ROPE_SIDE: the queries' RoPE in the absorb product's launch (extra blocks
                 * where k_mm_tcs takes it, else cu_matvec's own kernel after it): one step fewer */
                kb.rope = (struct cu_rope_side){
                        .qc = attn->qc, .q = attn->q, .inv_freq = attn->inv_freq, .tok_pos = d_pos,
                        .n_head = attn->n_head, .nope = attn->nope, .R = attn->R, .KV = attn->KV, .T = T,
                        .interleave = attn->interleave,
                };
                if (!probe_skip(PS_K_B))
                        cu_matvec(&kb, s);
                prof_mark(b, PC_ATTN_PROJ);
        } else {
                if (!probe_skip(PS_K_B))
                        cu_matvec(&kb, s);
                prof_mark(b, PC_ATTN_PROJ);
                if (!probe_skip(PS_Q_ROPE))
                        cu_q_rope(attn, T, d_pos, s);
                prof_mark(b, PC_MLA_PREP);
        }
        /* attention over the cache, in token groups that fit the part workspace (X4_CUDA_L2PF:
         * the first group's kernel asks the L2 for v_b and W_o) */
        struct cu_attn at = *attn;
        if (b->l2pf_pass)
                at.pf = l2pf_cut((struct cu_pf){.p = {cl->v_b.d, cl->o.d}, .n = {w_bytes(&cl->v_b), w_bytes(&cl->o)}});
        for (uint32_t i = 0; i < n_att && !probe_skip(PS_ATTN); i++) {
                cu_attention(&at, att[3 * i], att[3 * i + 1], att[3 * i + 2], cache, l, b->sc, b->part, b->lat, s);
                at.pf = (struct cu_pf){0};
        }
        prof_mark(b, PC_ATTENTION);
        /* o[h] = Vb[h] · ô[h]; out = W_o · o */
        struct cu_mv vb = {
                .w = cl->v_b.d, .type = cl->v_b.type, .row_bytes = cl->v_b.row_bytes,
                .K = KV, .N = nh * V, .G = V, .x = b->lat,
                .x_pstride = (uint64_t) nh * KV, .x_gstride = KV, .x_div = 1,
                .y = b->ao, .y_pstride = (uint64_t) nh * V, .y_gstride = V, .P = T,
        };
        if (!probe_skip(PS_V_B))
                cu_matvec(&vb, s);
        if (!probe_skip(PS_O))
                mv(b, &cl->o, b->ao, (uint64_t) nh * V, b->o, H, T);
        prof_mark(b, PC_ATTN_PROJ);
}

/* X4_CUDA_ROUTE_SPREAD=1 (cu_route_spread: measurements only, said once in the log) */
static bool route_spread(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_ROUTE_SPREAD");
                on = e && !strcmp(e, "1");
                if (on)
                        log_warning("X4_CUDA_ROUTE_SPREAD=1: each token's experts are moved for a measurement "
                                    "of real weights' expert spread; every result is wrong");
        }
        return on;
}

/* The router of MoE block cl (docs/model.md §5) as cu_route takes it. */
static struct cu_router router_of(const struct x4_backend *b, const struct cu_layer *cl) {
        const struct x4_config *c = &b->cfg;
        return (struct cu_router){
                .w = cl->router.d, .type = cl->router.type,
                .row_bytes = cl->router.row_bytes, .bias = cl->router_bias, .z = b->zr,
                .ticket = b->route_ticket,
                .H = c->n_embd,
                .n_expert = c->n_expert, .k = c->n_expert_used,
                .shared = c->n_expert_shared > 0, .sigmoid = c->expert_gating == 2,
                .norm = c->expert_weights_norm, .scale = c->expert_weights_scale,
        };
}

/* The FFN sublayer of block l after its input norm (input b->a): docs/model.md §5, dense or MoE.
 * Its output is left in b->dn as *post describes it (the next hc_pre post-maps it in the trunk;
 * cu_residual adds it in the NextN block). routed: the pre-mapping has already routed the rows
 * (cu_hc_pre_route), b->sel and b->gw hold the selection. */
static void ffn_sublayer(struct x4_backend *b, const struct cu_layer *cl, uint32_t l, uint32_t T,
                         struct cu_post *post, bool routed) {
        const struct x4_config *c = &b->cfg;
        uint32_t H = c->n_embd;
        cudaStream_t s = b->stream;

        if (!cl->moe) {
                /* docs/model.md §5 dense: Down(silu(Gate f) ⊙ Up f) */
                uint32_t F = c->n_ff;
                struct cu_mv gu = {
                        .w = cl->gateup.d, .type = cl->gateup.type,
                        .row_bytes = cl->gateup.row_bytes, .K = H, .N = 2 * F, .G = F,
                        .x = b->a, .x_pstride = H, .x_div = 1, .y = b->act,
                        .y_pstride = F, .P = T, .swiglu = true,
                };
                cu_matvec(&gu, s);
                mv(b, &cl->down, b->act, F, b->dn, H, T);
                prof_mark(b, PC_DENSE_FFN);
                *post = (struct cu_post){.y = b->dn, .y_slot_stride = H, .n_slots = 1};
                return;
        }

        /* docs/model.md §5 MoE: router, then the token's k routed experts and the shared one as
         * (token, slot) pairs */
        uint32_t F = c->n_ff_exp, S = c->n_expert_used + (c->n_expert_shared ? 1 : 0);
        struct cu_router ra = router_of(b, cl);
        if (!routed && !probe_skip(PS_ROUTER))
                cu_route(&ra, b->a, T, b->sel, b->gw, s);
        if (route_spread())
                cu_route_spread(b->sel, T, S, c->n_expert_used, c->n_expert, l, s);
        /* many pairs: group them by expert, so each dequantized weight chunk serves up to
         * CU_GROUP_TILE pairs (same bits as one pair per block); on the tensor-core products also
         * a batch's 9 or more (k_mm_tcs's group tiles read each expert once for its pairs) */
        uint32_t P = T * S, tcs_max = cu_mm_tcs_grouped_max();
        bool group = P >= CUDA_GROUP_MIN_PAIRS_PER_ID * (c->n_expert + 1) || (P > CUDA_SEL_PAIRS_MAX && P <= tcs_max);
        uint32_t n_groups = group ? cu_moe_group(b->sel, P, c->n_expert + 1, b->groups, s) : 0;
        prof_mark(b, PC_ROUTER);
        if (b->route_trace)
                route_trace_layer(b, l, T, cl->router_bias);
        struct cu_mv gu = {
                .w = cl->gateup.d, .type = cl->gateup.type,
                .row_bytes = cl->gateup.row_bytes, .expert_bytes = cl->gateup.expert_bytes,
                .K = H, .N = 2 * F, .G = F, .x = b->a, .x_pstride = H, .x_div = S,
                .y = b->act, .y_pstride = F, .sel = b->sel, .P = T * S, .swiglu = true,
                .groups = n_groups ? b->groups : NULL, .n_groups_max = n_groups,
                .pf_next = b->l2pf_pass ? cl->down.d : NULL, .pf_next_eb = cl->down.expert_bytes,
                .pf_tile = b->l2pf_pass,
        };
        if (!probe_skip(PS_GATEUP))
                cu_matvec(&gu, s);
        struct cu_mv dn = {
                .w = cl->down.d, .type = cl->down.type, .row_bytes = cl->down.row_bytes,
                .expert_bytes = cl->down.expert_bytes, .K = F, .N = H, .G = H,
                .x = b->act, .x_pstride = F, .x_div = 1, .y = b->dn, .y_pstride = H,
                .sel = b->sel, .sel_ready = true, .P = T * S,
                .groups = n_groups ? b->groups : NULL, .n_groups_max = n_groups,
        };
        if (!probe_skip(PS_DOWN))
                cu_matvec(&dn, s);
        prof_mark(b, PC_EXPERTS);
        /* y = Σ_k g_k·Down_k + shared (slot order fixed) */
        *post = (struct cu_post){.y = b->dn, .y_slot_stride = H, .n_slots = S, .w = b->gw};
}

/* The cache and attention descriptors of a pass (every page holds n_cache_layers layers). */
static struct cu_cache pass_cache(const struct x4_backend *b, const uint32_t *d_pos,
                                  const uint32_t *d_tokpt, const uint32_t *d_pt) {
        const struct x4_config *c = &b->cfg;
        return (struct cu_cache){
                .base = b->cache, .f16 = b->cache_type == X4_CACHE_F16,
                .n_layer = b->n_cache_layers, .page_tokens = b->page_tokens,
                .D = c->kv_lora_rank + c->qk_rope, .pt = d_pt, .tok_pt = d_tokpt, .tok_pos = d_pos,
        };
}

static struct cu_attn pass_attn(const struct x4_backend *b) {
        const struct x4_config *c = &b->cfg;
        return (struct cu_attn){
                .qc = b->qabs, .q = b->q, .n_head = c->n_head, .nope = c->qk_nope, .R = c->qk_rope,
                .KV = c->kv_lora_rank, .scale = c->attn_scale, .inv_freq = b->inv_freq,
                .interleave = c->rope_interleave,
        };
}

/* --profile: what a trunk pass of T tokens had to move, by class (prof_bytes): every weight it
 * reads once; the residual streams (read and written by each pre-mapping, with the sublayer output
 * it post-maps and the normed row it writes); the cache rows each token's attention reads (the
 * pass's host positions); the MLA prep's rows and cache writes; the embedding rows. Expert bytes
 * count min(T·k, n_expert) routed experts and the shared one: exact at one token, an upper bound
 * for a batch whose tokens share experts. The products' activations are not counted. */
static void prof_pass_bytes(struct x4_backend *b, uint32_t T) {
        if (!b->prof.on)
                return;
        const struct x4_config *c = &b->cfg;
        uint64_t H = c->n_embd, n_hc = c->hc_mult, D = (uint64_t) c->kv_lora_rank + c->qk_rope;
        uint64_t QL = c->q_lora_rank, es = b->cache_type == X4_CACHE_F16 ? 2 : 4;
        uint64_t S = c->n_expert_used + (c->n_expert_shared ? 1 : 0);
        uint64_t rows = 0; /* cache rows the pass's attention reads, each layer */
        for (uint32_t t = 0; b->pass_pos_h && t < T; t++)
                rows += (uint64_t) b->pass_pos_h[t] + 1;
        prof_bytes(b, PC_EMBED, T * (b->embd.row_bytes + n_hc * H * 4));
        for (uint32_t l = 0; l < c->n_layer; l++) {
                const struct cu_layer *cl = &b->layers[l];
                /* two pre-mappings: the streams read and written, the output post-mapped (the
                 * previous FFN's S slots, or one after a dense FFN; the attention's one row), the
                 * normed row */
                uint64_t attn_post = l ? (b->layers[l - 1].moe ? S : 1) : 0;
                prof_bytes(b, PC_HC, w_bytes(&cl->hc_attn_fn) + T * 4 * (2 * n_hc * H + attn_post * H + H));
                prof_bytes(b, PC_HC, w_bytes(&cl->hc_ffn_fn) + T * 4 * (2 * n_hc * H + H + H));
                prof_bytes(b, PC_ATTN_PROJ, w_bytes(&cl->qkv_a) + w_bytes(&cl->q_b) + w_bytes(&cl->k_b) +
                                                    w_bytes(&cl->v_b) + w_bytes(&cl->o));
                prof_bytes(b, PC_MLA_PREP, T * ((QL + D) * 4 * 2 + D * es));
                prof_bytes(b, PC_ATTENTION, rows * D * es);
                if (cl->moe) {
                        uint64_t routed = MIN((uint64_t) T * c->n_expert_used, (uint64_t) c->n_expert);
                        prof_bytes(b, PC_ROUTER, w_bytes(&cl->router));
                        prof_bytes(b, PC_EXPERTS, (routed + (c->n_expert_shared ? 1 : 0)) *
                                                          (cl->gateup.expert_bytes + cl->down.expert_bytes));
                } else {
                        prof_bytes(b, PC_DENSE_FFN, w_bytes(&cl->gateup) + w_bytes(&cl->down));
                }
        }
        /* the last post-mapping: the streams and the last FFN's slots */
        if (c->n_layer)
                prof_bytes(b, PC_HC, T * 4 * (2 * n_hc * H + (b->layers[c->n_layer - 1].moe ? S : 1) * H));
}

/* One pass of ≤ T_max consecutive tokens of the batch through the trunk: per MoE layer 18
 * kernels (spec step in brackets) and no host synchronization.
 *   hc_pre = post of the previous sublayer + projection matvec + gates/Sinkhorn/collapse/norm
 *   [§3.1] · matvec q_a‖kv_a [§4.1-2] · mla_prep [norms, RoPE k_pe, cache store] · matvec q_b ·
 *   matvec k_b [absorb] · attention part + combine [§4 absorbed, split over the context] ·
 *   matvec v_b · matvec o · hc_pre [+ ffn_norm] · router = matvec + top-k [§5] ·
 *   matvec gate‖up+SwiGLU · matvec down
 * The single-block fused HC kernel (12 kernels per layer) ran at 270 µs per call at full width
 * (one SM reading 0.7 MB); a captured graph will make the extra launches cheap. */
static void forward_pass(struct x4_backend *b, uint32_t T, const uint32_t *d_ids,
                         const uint32_t *d_pos, const uint32_t *d_tokpt, const uint32_t *d_pt,
                         const uint32_t *att, uint32_t n_att) {
        cu_mm_tc_scratch(b->xbf, b->xbf_cap);
        cu_mm_tc_ksplit(b->ksb, CU_KS_FLOATS, b->ks_ticket, CU_KS_TICKETS);
        const struct x4_config *c = &b->cfg;
        uint32_t H = c->n_embd, n_hc = c->hc_mult;
        /* prompt passes (never captured: graphs hold generated-class steps) may take the
         * non-absorbed attention; its jobs are built once for the pass's 40 layers */
        b->mha_pass = b->mha_ok && cu_pass_prompt() && mha_prepare(b, T);
        b->l2pf_pass = l2pf_wanted() && !cu_pass_prompt() && T <= CUDA_L2PF_MAX_T;
        prof_pass_bytes(b, T);
        cudaStream_t s = b->stream;
        struct cu_cache cache = pass_cache(b, d_pos, d_tokpt, d_pt);
        struct cu_attn attn = pass_attn(b);
        /* the sublayer output the next hc_pre post-maps first (none after the embedding) */
        struct cu_post post = {0};

        /* docs/model.md §3 step 1: embedding into all streams */
        cu_embed(b->embd.d, b->embd.type, b->embd.row_bytes, (const int32_t *) d_ids, T, H, n_hc,
                 b->X, s);
        prof_mark(b, PC_EMBED);

        /* X4_CUDA_HC_EARLY: every pre-mapping of the pass early (each leaves its post gates and
         * Sinkhorn to the next post-mapping kernel) when every one of them takes the fused kernel */
        bool early = b->hcw_bufs == 2;
        for (uint32_t l = 0; l < c->n_layer && early; l++)
                early = cu_hc_early(T, b->layers[l].hc_attn_fn.type) && cu_hc_early(T, b->layers[l].hc_ffn_fn.type);
        uint64_t hw_n = (uint64_t) b->T_max * cu_hc_slices(H) * CU_HCP_STRIDE;
        uint32_t n_pre = 0; /* pre-mappings so far: partial rows alternate between the two buffers */
        struct cu_hc hc = {
                .ticket = b->hc_ticket, .H = H, .n_hc = n_hc, .iters = c->hc_sinkhorn_iters,
                .rms_eps = c->rms_eps, .hc_eps = c->hc_eps, .clamp = c->hc_clamp, .early = early,
                .ug = b->hn, /* idle until the head */
        };
        /* the next pre-mapping's hc: its weights, its partial rows' buffer, and (early, after a
         * sublayer) the previous one's partials, base and scale */
#define HC_NEXT(fn_, base_, scale_, norm_)                                                                \
        do {                                                                                              \
                const float *pb = hc.base, *ps = hc.scale, *pw = hc.hw;                                   \
                hc.fn = (fn_).d, hc.fn_type = (fn_).type, hc.fn_row_bytes = (fn_).row_bytes;              \
                hc.base = (base_), hc.scale = (scale_), hc.norm_w = (norm_);                              \
                hc.hw = b->hcw + (n_pre % b->hcw_bufs) * hw_n;                                            \
                hc.hw_prev = early && post.y ? pw : NULL, hc.prev_base = pb, hc.prev_scale = ps;          \
                n_pre++;                                                                                  \
        } while (0)

        for (uint32_t l = 0; l < c->n_layer; l++) {
                const struct cu_layer *cl = &b->layers[l];

                /* docs/model.md §3.1: (post-mapping of the previous FFN) HC pre-mapping + attn_norm → a */
                HC_NEXT(cl->hc_attn_fn, cl->hc_attn_base, cl->hc_attn_scale, cl->attn_norm);
                /* X4_CUDA_L2PF: the attention's first three products */
                if (b->l2pf_pass)
                        hc.pf = l2pf_cut((struct cu_pf){.p = {cl->qkv_a.d, cl->q_b.d, cl->k_b.d},
                                                        .n = {w_bytes(&cl->qkv_a), w_bytes(&cl->q_b), w_bytes(&cl->k_b)}});
                if (!probe_skip(PS_HC_ATTN))
                        cu_hc_pre(&hc, &post, b->X, T, b->hcp, b->a, s);
                prof_mark(b, PC_HC);

                attn_sublayer(b, cl, l, T, d_pos, &cache, &attn, att, n_att);

                /* docs/model.md §3.1: post-mapping of the attention, HC pre-mapping + ffn_norm → f (in a) */
                post = (struct cu_post){.y = b->o, .y_slot_stride = H, .n_slots = 1};
                HC_NEXT(cl->hc_ffn_fn, cl->hc_ffn_base, cl->hc_ffn_scale, cl->ffn_norm);
                /* X4_CUDA_L2PF: the router and the shared expert's gate-up (the routed experts are
                 * known only after the router; the gate-up product asks for their down rows) */
                hc.pf = (struct cu_pf){0};
                if (b->l2pf_pass && cl->moe) {
                        hc.pf.p[0] = cl->router.d, hc.pf.n[0] = w_bytes(&cl->router);
                        if (c->n_expert_shared)
                                hc.pf.p[1] = (const uint8_t *) cl->gateup.d + (uint64_t) c->n_expert * cl->gateup.expert_bytes,
                                hc.pf.n[1] = cl->gateup.expert_bytes;
                        hc.pf = l2pf_cut(hc.pf);
                }
                /* a MoE block's pre-mapping routes its rows too where it can (X4_CUDA_HC_ROUTE) */
                bool routed = false;
                if (!probe_skip(PS_HC_FFN)) {
                        if (cl->moe && !probe_skip(PS_ROUTER)) {
                                struct cu_router ra = router_of(b, cl);
                                routed = cu_hc_pre_route(&hc, &post, b->X, T, b->hcp, b->a, &ra, b->sel, b->gw, s);
                        } else {
                                cu_hc_pre(&hc, &post, b->X, T, b->hcp, b->a, s);
                        }
                }
                hc.pf = (struct cu_pf){0};
                prof_mark(b, PC_HC);

                /* the FFN's output, post-mapped by the next hc_pre */
                ffn_sublayer(b, cl, l, T, &post, routed);
        }
#undef HC_NEXT
        /* the last sublayer's post-mapping (early: with the last pre-mapping's gates computed there) */
        if (early && n_pre > 0) {
                struct cu_hc last = hc;
                last.hw_prev = hc.hw, last.prev_base = hc.base, last.prev_scale = hc.scale;
                cu_hc_post_early(b->X, &last, &post, T, s);
        } else
                cu_hc_post(b->X, b->hcp, &post, T, H, n_hc, s);
        prof_mark(b, PC_HC);
        b->mha_pass = false;
        b->l2pf_pass = false;
}

/* U5 (docs/model.md §8, model/xing4.h): the kernels rope a row at the position of its cache slot
 * (cu_cache.tok_pos), so a NextN row's RoPE position t + X4_MTP_POS_OFFSET is its slot t only
 * with offset 0; another choice needs its own position array for cu_mla_prep and cu_q_rope. */
_Static_assert(X4_MTP_POS_OFFSET == 0, "the CUDA NextN block ropes at the cache slot's position");

/* docs/model.md §8 steps 2-4: one pass of ≤ T_max rows of a NextN batch through the NextN block
 * (layer n_layer; d_ids: the ids of tokens t + 1, d_pos: positions t, b->hin: the h rows). The
 * block's residual x (one row per token, no HC) is left in b->X for nextn_head. */
static void nextn_pass(struct x4_backend *b, uint32_t T, const uint32_t *d_ids,
                       const uint32_t *d_pos, const uint32_t *d_tokpt, const uint32_t *d_pt,
                       const uint32_t *att, uint32_t n_att) {
        cu_mm_tc_scratch(b->xbf, b->xbf_cap);
        cu_mm_tc_ksplit(b->ksb, CU_KS_FLOATS, b->ks_ticket, CU_KS_TICKETS);
        const struct x4_config *c = &b->cfg;
        const uint32_t l = c->n_layer, H = c->n_embd;
        const struct cu_layer *cl = &b->layers[l];
        cudaStream_t s = b->stream;
        struct cu_cache cache = pass_cache(b, d_pos, d_tokpt, d_pt);
        struct cu_attn attn = pass_attn(b);
        struct cu_post post = {0};

        /* step 2: e = RMSNorm(embed_tokens[id], enorm), g = RMSNorm(h, hnorm), side by side in eh
         * (embedding half first) */
        cu_embed(b->nextn_embd.d, b->nextn_embd.type, b->nextn_embd.row_bytes,
                 (const int32_t *) d_ids, T, H, 1, b->a, s);
        prof_mark(b, PC_EMBED);
        cu_rmsnorm(b->a, H, NULL, T, H, b->nextn_enorm, c->rms_eps, b->eh, 2 * (uint64_t) H, s);
        cu_rmsnorm(b->hin, H, NULL, T, H, b->nextn_hnorm, c->rms_eps, b->eh + H,
                   2 * (uint64_t) H, s);
        /* step 3: x = eh_proj · concat(e, g) */
        mv(b, &b->nextn_eh, b->eh, 2 * (uint64_t) H, b->X, H, T);
        prof_mark(b, PC_EMBED);

        /* step 4: x += MLA(RMSNorm(x, attn_norm)); x += FFN(RMSNorm(x, ffn_norm)) */
        cu_rmsnorm(b->X, H, NULL, T, H, cl->attn_norm, c->rms_eps, b->a, H, s);
        prof_mark(b, PC_HC);
        attn_sublayer(b, cl, l, T, d_pos, &cache, &attn, att, n_att);
        post = (struct cu_post){.y = b->o, .y_slot_stride = H, .n_slots = 1};
        cu_residual(b->X, &post, T, H, s);
        cu_rmsnorm(b->X, H, NULL, T, H, cl->ffn_norm, c->rms_eps, b->a, H, s);
        prof_mark(b, PC_HC);
        ffn_sublayer(b, cl, l, T, &post, false);
        cu_residual(b->X, &post, T, H, s);
        prof_mark(b, PC_HC);
}

/* The hidden rows (x4_seq.hidden, docs/model.md §8 step 1, U4) of RH tokens of the pass into b->hid:
 * the vector the head multiplies, RMSNorm(mean_s X, output_norm) for the trunk and
 * RMSNorm(x, shared_head_norm) for the NextN block (or the pre-norm ones, X4_MTP_H_POST_NORM
 * false). */
static void pass_hidden(struct x4_backend *b, bool nextn, const uint32_t *d_hrows, uint32_t RH) {
        const struct x4_config *c = &b->cfg;
        const float *norm = nextn ? b->nextn_head_norm : b->output_norm;

        cu_head_norm(b->X, (const int32_t *) d_hrows, RH, c->n_embd, nextn ? 1 : c->hc_mult,
                     X4_MTP_H_POST_NORM ? norm : NULL, c->rms_eps, b->hid, b->stream);
        prof_mark(b, PC_HEAD);
}

/* docs/model.md §8 step 5 for R rows of a NextN pass: shared_head_norm and shared_head_head into
 * b->logits. */
static void nextn_head(struct x4_backend *b, const uint32_t *d_rows, uint32_t R) {
        const struct x4_config *c = &b->cfg;

        cu_head_norm(b->X, (const int32_t *) d_rows, R, c->n_embd, 1, b->nextn_head_norm,
                     c->rms_eps, b->hn, b->stream);
        mv(b, &b->nextn_head, b->hn, c->n_embd, b->logits, c->n_vocab, R);
        prof_mark(b, PC_HEAD);
}

/* docs/model.md §3 steps 3-5 for R rows of the pass: head norm and the Q6_K head into b->logits. */
static void forward_head(struct x4_backend *b, const uint32_t *d_rows, uint32_t R) {
        const struct x4_config *c = &b->cfg;

        cu_head_norm(b->X, (const int32_t *) d_rows, R, c->n_embd, c->hc_mult, b->output_norm,
                     c->rms_eps, b->hn, b->stream);
        mv(b, &b->output, b->hn, c->n_embd, b->logits, c->n_vocab, R);
        prof_mark(b, PC_HEAD);
        prof_bytes(b, PC_HEAD, w_bytes(&b->output) + (uint64_t) R * c->n_vocab * 4);
}

/* A batch laid out for the device, uploaded at once: per token its id, position and page-table
 * offset | the logits rows | the hidden rows (both as pass-relative token indices) | the page
 * tables | the attention groups (t0, n, parts) per pass (read on the host only). Offsets depend
 * on (T, R, RH) alone, which the decode graphs' key holds. */
struct plan {
        uint64_t T, R, RH, pt, n_att;
        uint64_t n_att_whole; /* groups before att_chunk split them */
        size_t n_meta;
        uint64_t *row_tok, *hrow_tok; /* the batch token index of every logits / hidden row */
        uint32_t *att;
        const uint32_t *d_ids, *d_pos, *d_tokpt, *d_rows, *d_hrows, *d_pt;
        const uint32_t *h_pos, *h_tokpt; /* host copies (b->meta_h) */
};

/* Decode-class attention in token groups sized for L2 (X4_CUDA_ATTN_CHUNK; opt-in until a GPU
 * has timed it). At batch 64 and 4,096 positions each token's parts write 32 × 32 heads × 514
 * floats (2.1 MB) that the combine reads back at once: 135 MB a layer, as much traffic as the
 * cache reads, through DRAM because one group holds all 64 tokens. In groups of about a dozen
 * tokens (attention, then its combine, then the next group into the same part rows) the rows are
 * rewritten and read while they are still in L2. Every token's kernels and arithmetic are the
 * ones it has in any group (the kernels index tokens from the group's first), so the bits are the
 * same (GPU step: batch invariance with tiny forced groups).
 *   unset, "" or 0: off; "auto": groups of at most half the L2 of part rows, but never so small
 *   that a group's grid drops under two blocks an SM (k_attn_dtc's lean layout); N: N tokens. */
static void att_chunk_setup(struct x4_backend *b, const struct cudaDeviceProp *prop) {
        const char *e = getenv("X4_CUDA_ATTN_CHUNK");
        b->n_sms = prop->multiProcessorCount > 0 ? (uint32_t) prop->multiProcessorCount : 1;
        b->l2_bytes = prop->l2CacheSize > 0 ? (uint64_t) prop->l2CacheSize : 0;
        b->att_chunk_mode = 0;
        if (!e || !*e || streq(e, "0"))
                return;
        if (streq(e, "auto")) {
                b->att_chunk_mode = UINT32_MAX;
                return;
        }
        char *end = NULL;
        unsigned long v = strtoul(e, &end, 10);
        if (end && !*end && v >= 1 && v < UINT32_MAX)
                b->att_chunk_mode = (uint32_t) v;
        else
                log_warning("X4_CUDA_ATTN_CHUNK=%s ignored: expected 0, auto or a token count", e);
}

/* Tokens an attention group of n tokens with `parts` parts each (the group's grid width) takes
 * (n or more: one group). */
static uint32_t att_chunk(const struct x4_backend *b, uint32_t n, uint32_t parts) {
        if (b->att_chunk_mode == 0 || n < 2 || parts == 0)
                return n;
        if (b->att_chunk_mode != UINT32_MAX)
                return b->att_chunk_mode;
        if (b->l2_bytes == 0)
                return n; /* the device did not say: no groups */
        const struct x4_config *c = &b->cfg;
        uint64_t per_tok = (uint64_t) parts * c->n_head * (c->kv_lora_rank + 2) * sizeof(float);
        uint64_t budget = b->l2_bytes / 2, by_l2 = per_tok ? budget / per_tok : n;
        uint64_t hg = DIV_ROUND_UP(c->n_head, 32u); /* k_attn_dtc's head groups */
        uint64_t lean = DIV_ROUND_UP(2 * (uint64_t) b->n_sms, (uint64_t) parts * hg);
        uint64_t groups = DIV_ROUND_UP(n, MAX(by_l2, 1));
        groups = MIN(groups, MAX(n / MAX(lean, 1), 1));
        return (uint32_t) DIV_ROUND_UP(n, groups);
}

/* Split attention group i of att (g0, n, maxp; room for the k − 1 groups it gains) into
 * groups of at most `chunk` tokens, as even as they go; returns the groups it became. */
static uint32_t att_split(uint32_t *att, uint64_t n_att, uint64_t i, uint32_t chunk) {
        uint32_t g0 = att[3 * i], n = att[3 * i + 1], maxp = att[3 * i + 2];
        if (chunk == 0 || n <= chunk)
                return 1;
        uint32_t k = DIV_ROUND_UP(n, chunk), q = n / k, extra = n % k;
        memmove(att + 3 * (i + k), att + 3 * (i + 1), (size_t) (n_att - i - 1) * 3 * sizeof(uint32_t));
        for (uint32_t j = 0, t = g0; j < k; j++) {
                uint32_t m = q + (j < extra ? 1 : 0);
                att[3 * (i + j)] = t;
                att[3 * (i + j) + 1] = m;
                att[3 * (i + j) + 2] = maxp;
                t += m;
        }
        return k;
}

static void plan_free(struct plan *p) {
        free(p->row_tok);
        free(p->hrow_tok);
}

static bool mode_wants(uint32_t mode, uint32_t k, uint32_t n) {
        return mode == X4_LOGITS_ALL || (mode == X4_LOGITS_LAST && k + 1 == n);
}

static int plan_batch(struct x4_backend *b, const struct x4_seq *const *seqs, uint32_t n_seqs,
                      struct plan *p) {
        uint64_t T_tot = 0, R_tot = 0, RH_tot = 0, pt_tot = 0;
        int r;

        *p = (struct plan){0};
        /* the parts of the pass's attention kernel (this pass class's: the caller set it) */
        uint32_t D = b->cfg.kv_lora_rank + b->cfg.qk_rope;
        bool f16 = b->cache_type == X4_CACHE_F16;
        for (uint32_t i = 0; i < n_seqs; i++) {
                const struct x4_seq *sq = seqs[i];
                uint64_t end = (uint64_t) sq->pos0 + sq->n_tokens;
                uint64_t need = DIV_ROUND_UP(end, b->page_tokens);
                if (end > UINT32_MAX - CU_ATTN_PART_TC2)
                        return log_error_errno(E2BIG, "sequence %u: position %llu too large", i,
                                               (unsigned long long) end);
                uint32_t parts = cu_attn_parts(D, f16, (uint32_t) (end - 1));
                if (parts > b->part_slots)
                        return log_error_errno(E2BIG,
                                               "sequence %u: position %llu needs %u attention "
                                               "parts, the workspace has %u",
                                               i, (unsigned long long) end - 1, parts,
                                               b->part_slots);
                T_tot += sq->n_tokens;
                R_tot += sq->logits == X4_LOGITS_ALL ? sq->n_tokens
                         : sq->logits == X4_LOGITS_LAST ? 1
                                                         : 0;
                RH_tot += sq->hidden == X4_LOGITS_ALL ? sq->n_tokens
                          : sq->hidden == X4_LOGITS_LAST ? 1
                                                          : 0;
                pt_tot += need;
        }
        if (T_tot == 0)
                return 0;
        if (T_tot > UINT32_MAX / 8 || pt_tot > UINT32_MAX / 2)
                return log_error_errno(E2BIG, "CUDA backend: batch of %llu tokens too large",
                                       (unsigned long long) T_tot);

        size_t n_meta = 3 * T_tot + R_tot + RH_tot + pt_tot + 3 * T_tot;
        r = meta_reserve(b, n_meta);
        if (r < 0)
                return r;
        p->row_tok = malloc(MAX(R_tot, 1) * sizeof(uint64_t));
        p->hrow_tok = malloc(MAX(RH_tot, 1) * sizeof(uint64_t));
        if (!p->row_tok || !p->hrow_tok)
                return log_error_errno(ENOMEM, "CUDA backend: out of memory");
        uint32_t *ids = b->meta_h, *pos = ids + T_tot, *tokpt = pos + T_tot;
        uint32_t *rows = tokpt + T_tot, *hrows = rows + R_tot, *pt = hrows + RH_tot;
        uint32_t *att = pt + pt_tot;
        uint64_t t = 0, nr = 0, nh = 0, np = 0;
        for (uint32_t i = 0; i < n_seqs; i++) {
                const struct x4_seq *sq = seqs[i];
                if (sq->n_tokens == 0)
                        continue;
                uint64_t need = DIV_ROUND_UP((uint64_t) sq->pos0 + sq->n_tokens, b->page_tokens);
                memcpy(pt + np, sq->pages, need * sizeof(uint32_t));
                for (uint32_t k = 0; k < sq->n_tokens; k++, t++) {
                        ids[t] = (uint32_t) sq->tokens[k];
                        pos[t] = sq->pos0 + k;
                        tokpt[t] = (uint32_t) np;
                        if (mode_wants(sq->logits, k, sq->n_tokens)) {
                                p->row_tok[nr] = t;
                                rows[nr++] = (uint32_t) (t % b->T_max);
                        }
                        if (mode_wants(sq->hidden, k, sq->n_tokens)) {
                                p->hrow_tok[nh] = t;
                                hrows[nh++] = (uint32_t) (t % b->T_max);
                        }
                }
                np += need;
        }
        /* attention groups per pass: as many tokens as the part workspace holds, in parts of the
         * length the pass's attention kernel uses (this pass class's: the caller set it) */
        uint64_t n_att = 0, n_whole = 0;
        for (uint64_t p0 = 0; p0 < T_tot; p0 += b->T_max) {
                uint32_t T = (uint32_t) MIN((uint64_t) b->T_max, T_tot - p0);
                uint32_t g0 = 0;
                while (g0 < T) {
                        uint32_t maxp = 0, n = 0;
                        while (g0 + n < T) {
                                uint32_t parts = cu_attn_parts(D, f16, pos[p0 + g0 + n]);
                                uint32_t m = MAX(maxp, parts);
                                if ((uint64_t) m * (n + 1) > b->part_slots)
                                        break;
                                maxp = m;
                                n++;
                        }
                        att[3 * n_att] = g0;
                        att[3 * n_att + 1] = n;
                        att[3 * n_att + 2] = maxp;
                        /* decode-class passes: groups whose part rows stay in L2 (att_chunk) */
                        n_att += cu_pass_prompt() ? 1 : att_split(att, n_att + 1, n_att, att_chunk(b, n, maxp));
                        n_whole++;
                        g0 += n;
                }
        }
        b->prof.n = 0;
        prof_mark(b, PC_COPY);
        r = CU_TRY(cudaMemcpyAsync(b->meta_d, b->meta_h, n_meta * sizeof(uint32_t),
                                   cudaMemcpyHostToDevice, b->stream),
                   EIO, "uploading batch metadata");
        if (r < 0)
                return r;
        prof_mark(b, PC_COPY);
        b->trace_err = 0;

        p->T = T_tot;
        p->R = R_tot;
        p->RH = RH_tot;
        p->pt = pt_tot;
        p->n_att = n_att;
        p->n_att_whole = n_whole;
        p->n_meta = n_meta;
        p->att = att;
        p->h_pos = pos;
        p->h_tokpt = tokpt;
        p->d_ids = b->meta_d;
        p->d_pos = p->d_ids + T_tot;
        p->d_tokpt = p->d_pos + T_tot;
        p->d_rows = p->d_tokpt + T_tot;
        p->d_hrows = p->d_rows + R_tot;
        p->d_pt = p->d_hrows + RH_tot;
        return 0;
}

/* A decode step as a CUDA graph: the same launches as the eager path (forward_pass, the hidden
 * rows, the head), so the same bits, captured once per (tokens, logits rows, hidden rows, parts
 * bucket) and replayed; every kernel reads its per-step data (ids, positions, page tables) from
 * the metadata buffer, whose address is part of the key. Returns 1 when the step ran (logits and
 * hidden rows still on the device), 0 to run eagerly. */
static int graph_forward(struct x4_backend *b, const struct plan *p) {
        uint32_t T = (uint32_t) p->T, R = (uint32_t) p->R, RH = (uint32_t) p->RH;
        const uint32_t *att = p->att;
        struct cu_graph *g = NULL;
        int r;

        for (uint32_t i = 0; i < b->n_graphs; i++)
                if (b->graphs[i].T == T && b->graphs[i].R == R && b->graphs[i].RH == RH &&
                    b->graphs[i].parts == att[2] && b->graphs[i].n_att == p->n_att) {
                        g = &b->graphs[i];
                        break;
                }
        if (g && g->meta != b->meta_d) {
                graphs_drop(b); /* the metadata buffer grew: every graph reads the old one */
                g = NULL;
        }
        if (!g) {
                if (b->n_graphs == b->cap_graphs) {
                        uint32_t cap = MAX(16u, b->cap_graphs * 2);
                        struct cu_graph *n = realloc(b->graphs, cap * sizeof(*n));
                        if (!n)
                                return log_error_errno(ENOMEM, "CUDA backend: out of memory");
                        b->graphs = n;
                        b->cap_graphs = cap;
                }
                cudaGraph_t graph = NULL;
                cudaGraphExec_t exec = NULL;
                unsigned long long k0 = cu_launches;
                cudaError_t e = cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal);
                if (e == cudaSuccess) {
                        forward_pass(b, T, p->d_ids, p->d_pos, p->d_tokpt, p->d_pt, att, (uint32_t) p->n_att);
                        if (RH > 0)
                                pass_hidden(b, false, p->d_hrows, RH);
                        if (R > 0)
                                forward_head(b, p->d_rows, R);
                        e = cudaStreamEndCapture(b->stream, &graph);
                }
                if (e == cudaSuccess)
                        e = cudaGraphInstantiate(&exec, graph, 0);
                if (graph)
                        cudaGraphDestroy(graph);
                if (e != cudaSuccess) {
                        (void) cudaGetLastError();
                        log_warning("CUDA backend: capturing a decode step as a graph failed (%s); "
                                    "running steps without graphs",
                                    cudaGetErrorString(e));
                        b->graphs_off = true;
                        return 0;
                }
                g = &b->graphs[b->n_graphs++];
                *g = (struct cu_graph){.T = T, .R = R, .RH = RH, .parts = att[2], .n_att = (uint32_t) p->n_att,
                                       .meta = b->meta_d, .exec = exec,
                                       .kernels = cu_launches - k0};
                cu_launches = k0;
        }
        r = CU_TRY(cudaGraphLaunch(g->exec, b->stream), EIO, "launching a decode graph");
        if (r < 0)
                return r;
        cu_launches += g->kernels;
        return 1;
}

/* The step's hidden and logits rows to the caller, and the wait for the step. */
static int forward_finish(struct x4_backend *b, float *logits, uint64_t R, float *hidden,
                          uint64_t RH) {
        int r = 0;

        if (RH > 0)
                r = CU_TRY(cudaMemcpyAsync(hidden, b->hid, RH * b->cfg.n_embd * sizeof(float),
                                           cudaMemcpyDeviceToHost, b->stream),
                           EIO, "copying hidden rows");
        if (r >= 0 && R > 0)
                r = CU_TRY(cudaMemcpyAsync(logits, b->logits,
                                           R * b->cfg.n_vocab * sizeof(float),
                                           cudaMemcpyDeviceToHost, b->stream),
                           EIO, "copying logits");
        if (r >= 0)
                r = CU_TRY(cudaStreamSynchronize(b->stream), EIO, "running the forward");
        if (r >= 0)
                r = CU_TRY(cudaGetLastError(), EIO, "launching the forward's kernels");
        return r;
}

/* The CUDA current device is per host thread: the daemon creates the backend on its main thread
 * and runs forwards on the engine thread, so every entry point selects the device again. */
static int select_device(struct x4_backend *b) {
        return CU_TRY(cudaSetDevice(b->device), ENODEV, "selecting the device");
}

/* Run a planned batch eagerly, pass after pass of ≤ T_max tokens: the trunk (nseqs NULL) or the
 * NextN block (nseqs: the batch's sequences, whose h rows each pass uploads first). Hidden rows
 * go to `hidden`, logits rows to `logits`, both in batch order. */
static int run_passes(struct x4_backend *b, const struct plan *p, const struct x4_nextn_seq *nseqs,
                      float *logits, float *hidden) {
        const struct x4_config *c = &b->cfg;
        const uint64_t H = c->n_embd;
        bool nextn = nseqs != NULL;
        uint64_t ai = 0, r0 = 0, h0 = 0;
        uint32_t si = 0, sk = 0; /* NextN: the sequence and row of the next h row to upload */
        int r;

        for (uint64_t p0 = 0; p0 < p->T; p0 += b->T_max) {
                uint32_t T = (uint32_t) MIN((uint64_t) b->T_max, p->T - p0);
                uint64_t a0 = ai;
                for (uint32_t g = 0; g < T; g += p->att[3 * ai + 1], ai++)
                        ;
                b->trace_tok0 = (uint32_t) p0;
                if (nextn) {
                        /* this pass's h rows into b->hin, a run of rows per sequence */
                        for (uint32_t t = 0; t < T;) {
                                while (sk == nseqs[si].seq.n_tokens) {
                                        si++;
                                        sk = 0;
                                }
                                uint32_t n = MIN(T - t, nseqs[si].seq.n_tokens - sk);
                                r = CU_TRY(cudaMemcpyAsync(b->hin + t * H, nseqs[si].h + sk * H,
                                                           n * H * sizeof(float),
                                                           cudaMemcpyHostToDevice, b->stream),
                                           EIO, "uploading NextN hidden rows");
                                if (r < 0)
                                        return r;
                                t += n;
                                sk += n;
                        }
                        prof_mark(b, PC_COPY);
                        nextn_pass(b, T, p->d_ids + p0, p->d_pos + p0, p->d_tokpt + p0, p->d_pt,
                                   p->att + 3 * a0, (uint32_t) (ai - a0));
                } else {
                        b->pass_pos_h = p->h_pos + p0;
                        b->pass_tokpt_h = p->h_tokpt + p0;
                        forward_pass(b, T, p->d_ids + p0, p->d_pos + p0, p->d_tokpt + p0, p->d_pt,
                                     p->att + 3 * a0, (uint32_t) (ai - a0));
                        b->pass_pos_h = b->pass_tokpt_h = NULL;
                }
                /* hidden rows of this pass: those whose token index falls in [p0, p0 + T) */
                uint64_t h1 = h0;
                while (h1 < p->RH && p->hrow_tok[h1] < p0 + T)
                        h1++;
                if (h1 > h0) {
                        pass_hidden(b, nextn, p->d_hrows + h0, (uint32_t) (h1 - h0));
                        r = CU_TRY(cudaMemcpyAsync(hidden + h0 * H, b->hid,
                                                   (h1 - h0) * H * sizeof(float),
                                                   cudaMemcpyDeviceToHost, b->stream),
                                   EIO, "copying hidden rows");
                        if (r < 0)
                                return r;
                        prof_mark(b, PC_COPY);
                }
                h0 = h1;
                /* logits rows of this pass likewise */
                uint64_t r1 = r0;
                while (r1 < p->R && p->row_tok[r1] < p0 + T)
                        r1++;
                /* in runs of at most logit_rows (the head's rows are independent of each other,
                 * so the bits do not depend on the run length) */
                for (uint64_t q0 = r0; q0 < r1; q0 += b->logit_rows) {
                        uint32_t R = (uint32_t) MIN((uint64_t) b->logit_rows, r1 - q0);
                        if (nextn)
                                nextn_head(b, p->d_rows + q0, R);
                        else
                                forward_head(b, p->d_rows + q0, R);
                        r = CU_TRY(cudaMemcpyAsync(logits + q0 * c->n_vocab, b->logits,
                                                   (uint64_t) R * c->n_vocab * sizeof(float),
                                                   cudaMemcpyDeviceToHost, b->stream),
                                   EIO, "copying logits");
                        if (r < 0)
                                return r;
                        prof_mark(b, PC_COPY);
                        prof_bytes(b, PC_COPY, (uint64_t) R * c->n_vocab * sizeof(float));
                }
                r0 = r1;
        }
        r = CU_TRY(cudaStreamSynchronize(b->stream), EIO, "running the forward");
        if (r < 0)
                return r;
        r = CU_TRY(cudaGetLastError(), EIO, "launching the forward's kernels");
        if (r < 0)
                return r;
        prof_collect(b);
        return b->trace_err;
}

/* What x4_batch_check / x4_nextn_check compare a batch with. */
static struct x4_batch_limits batch_limits(const struct x4_backend *b) {
        return (struct x4_batch_limits){.n_vocab = b->cfg.n_vocab, .n_pages = b->n_pages,
                                        .page_tokens = b->page_tokens};
}

/* plan_batch over n sequences laid out `stride` bytes apart from `first` (a forward's x4_seq
 * array, or the x4_seq inside each x4_nextn_seq). */
static int plan_strided(struct x4_backend *b, const struct x4_seq *first, size_t stride, uint32_t n,
                        struct plan *p) {
        _cleanup_free_ const struct x4_seq **seqs = malloc((n ? n : 1) * sizeof *seqs);
        if (!seqs) {
                *p = (struct plan){0};
                return log_error_errno(ENOMEM, "CUDA backend: out of memory");
        }
        for (uint32_t i = 0; i < n; i++)
                seqs[i] = (const struct x4_seq *) ((const char *) first + i * stride);
        return plan_batch(b, seqs, n, p);
}

/* Planned and run: n sequences of one class (the caller has set it, cu_mm_tc_pass). A decode-shaped
 * batch (one pass, one attention group) of generated-class tokens replays a captured graph;
 * prompt-class passes run eagerly (the graphs hold the generated class's kernels). */
static int forward_seqs(struct x4_backend *b, const struct x4_seq *seqs, uint32_t n_seqs,
                        float *logits, float *hidden, bool graphs) {
        struct plan p;
        int r = plan_strided(b, seqs, sizeof *seqs, n_seqs, &p);
        if (r >= 0 && p.T > 0) {
                r = 0;
                if (graphs && p.T <= CUDA_GRAPH_MAX_TOKENS && p.n_att_whole == 1 && !b->graphs_off &&
                    !b->prof.on && !b->route_trace) {
                        uint32_t parts = 1, maxp = 0;
                        for (uint64_t i = 0; i < p.n_att; i++)
                                maxp = MAX(maxp, p.att[3 * i + 2]);
                        while (parts < maxp)
                                parts *= 2;
                        if ((uint64_t) parts * p.T <= b->part_slots) {
                                /* one group of every token, blocks past a token's own parts
                                 * returning at once, split for L2 (att_chunk) into even groups:
                                 * the graph's shape depends on (tokens, parts) alone (its key
                                 * holds the number of groups) */
                                p.att[0] = 0;
                                p.att[1] = (uint32_t) p.T;
                                p.att[2] = parts;
                                p.n_att = att_split(p.att, 1, 0, att_chunk(b, (uint32_t) p.T, parts));
                                int g = graph_forward(b, &p); /* 0: not captured, run eagerly */
                                if (g != 0) {
                                        r = g < 0 ? g : forward_finish(b, logits, p.R, hidden, p.RH);
                                        plan_free(&p);
                                        return r;
                                }
                        }
                }
                r = run_passes(b, &p, NULL, logits, hidden);
        }
        plan_free(&p);
        return r;
}

/* A sequence's part of one class: its first prompt_tokens tokens (prompt) or the rest (generated).
 * Rows keep their order: a sequence's prompt rows come before its generated rows, so LAST belongs
 * to the generated part when there is one. false: the part is empty. */
static bool class_part(const struct x4_seq *sq, bool prompt, struct x4_seq *out) {
        uint32_t np = sq->prompt_tokens, n = prompt ? np : sq->n_tokens - np;
        if (n == 0)
                return false;
        *out = *sq;
        out->n_tokens = n;
        out->prompt_tokens = prompt ? n : 0;
        if (!prompt) {
                out->tokens += np;
                out->pos0 += np;
        } else if (np < sq->n_tokens) {
                /* the generated part holds the last token */
                if (out->logits == X4_LOGITS_LAST)
                        out->logits = X4_LOGITS_NONE;
                if (out->hidden == X4_LOGITS_LAST)
                        out->hidden = X4_LOGITS_NONE;
        }
        return true;
}

/* Prompt tokens and generated tokens in passes of their own when they take different kernels
 * (cu_mm_tc_prompt_class): every prompt part first, then every generated part (a sequence's prompt
 * precedes what it generated, so its generated part reads the rows its prompt part has just
 * written), each row computed exactly as in a batch of its class alone. The rows come back in
 * batch order. */
static int forward_classes(struct x4_backend *b, const struct x4_batch *batch, float *logits) {
        const struct x4_config *c = &b->cfg;
        uint32_t n = batch->n_seqs;
        uint64_t n_prompt = 0, n_gen = 0;
        bool split = cu_mm_tc_prompt_class();

        for (uint32_t i = 0; i < n; i++) {
                n_prompt += batch->seqs[i].prompt_tokens;
                n_gen += batch->seqs[i].n_tokens - batch->seqs[i].prompt_tokens;
        }
        if (!split || n_prompt == 0 || n_gen == 0) {
                bool prompt = split && n_gen == 0;
                cu_mm_tc_pass(prompt);
                int r = forward_seqs(b, batch->seqs, n, logits, batch->hidden, !prompt);
                cu_mm_tc_pass(false);
                return r;
        }

        _cleanup_free_ struct x4_seq *part = malloc(2 * (size_t) n * sizeof *part);
        uint32_t cnt[2] = {0, 0};
        uint64_t rows[2] = {0, 0}, hrows[2] = {0, 0};
        if (!part)
                return log_error_errno(ENOMEM, "CUDA backend: out of memory");
        for (int k = 0; k < 2; k++)
                for (uint32_t i = 0; i < n; i++) {
                        struct x4_seq *o = &part[(size_t) k * n + cnt[k]];
                        if (class_part(&batch->seqs[i], k == 0, o)) {
                                rows[k] += x4_mode_rows(o->logits, o->n_tokens);
                                hrows[k] += x4_mode_rows(o->hidden, o->n_tokens);
                                cnt[k]++;
                        }
                }
        uint64_t V = c->n_vocab, H = c->n_embd;
        _cleanup_free_ float *lg = malloc(MAX(rows[0] + rows[1], 1) * V * sizeof(float));
        _cleanup_free_ float *hd = malloc(MAX(hrows[0] + hrows[1], 1) * H * sizeof(float));
        if (!lg || !hd)
                return log_error_errno(ENOMEM, "CUDA backend: out of memory for %llu logits rows",
                                       (unsigned long long) (rows[0] + rows[1]));
        int r = 0;
        for (int k = 0; k < 2 && r >= 0; k++) {
                cu_mm_tc_pass(k == 0);
                r = forward_seqs(b, part + (size_t) k * n, cnt[k], lg + (k ? rows[0] : 0) * V,
                                 hd + (k ? hrows[0] : 0) * H, k == 1);
        }
        cu_mm_tc_pass(false);
        if (r < 0)
                return r;
        /* back in batch order: each sequence's prompt rows, then its generated rows */
        uint64_t cur[2] = {0, rows[0]}, hcur[2] = {0, hrows[0]}, ro = 0, ho = 0;
        for (uint32_t i = 0; i < n; i++)
                for (int k = 0; k < 2; k++) {
                        struct x4_seq o;
                        if (!class_part(&batch->seqs[i], k == 0, &o))
                                continue;
                        uint64_t nr = x4_mode_rows(o.logits, o.n_tokens), nh = x4_mode_rows(o.hidden, o.n_tokens);
                        if (nr)
                                memcpy(logits + ro * V, lg + cur[k] * V, nr * V * sizeof(float));
                        if (nh)
                                memcpy(batch->hidden + ho * H, hd + hcur[k] * H, nh * H * sizeof(float));
                        ro += nr, cur[k] += nr, ho += nh, hcur[k] += nh;
                }
        return 0;
}

static int forward_batch(struct x4_backend *b, const struct x4_batch *batch, float *logits) {
        int r;

        r = select_device(b);
        if (r < 0)
                return r;

        {
                struct x4_batch_limits lim = batch_limits(b);
                char msg[256];
                r = x4_batch_check(batch, logits, &lim, msg, sizeof msg);
                if (r < 0)
                        return log_error_errno(-r, "%s", msg);
        }
        return forward_classes(b, batch, logits);
}

/* docs/model.md §8: a NextN (MTP draft) forward, the same contract as the CPU backend's. */
static int nextn_batch(struct x4_backend *b, const struct x4_nextn_batch *batch, float *logits) {
        int r;

        r = select_device(b);
        if (r < 0)
                return r;
        {
                struct x4_batch_limits lim = batch_limits(b);
                char msg[256];
                r = x4_nextn_check(batch, logits, &lim, b->mtp, msg, sizeof msg);
                if (r < 0)
                        return log_error_errno(-r, "cuda backend: %s", msg);
        }
        struct plan p;
        r = plan_strided(b, batch->n_seqs ? &batch->seqs[0].seq : NULL, sizeof *batch->seqs,
                         batch->n_seqs, &p);
        if (r >= 0 && p.T > 0)
                r = run_passes(b, &p, batch->seqs, logits, batch->hidden);
        plan_free(&p);
        return r;
}

/* ---- caps and pages ------------------------------------------------------------------------- */

static void cuda_caps(struct x4_backend *b, struct x4_backend_caps *ret) {
        *ret = (struct x4_backend_caps){
                .name = b->name,
                .n_pages = b->n_pages,
                .page_tokens = b->page_tokens,
                .max_batch_tokens = b->T_max,
                .cache_type = b->cache_type,
                .mtp = b->mtp,
                .prompt_class = cu_mm_tc_prompt_class(),
                .memory_used = b->wbytes + b->ws_bytes + (uint64_t) b->n_pages * b->page_bytes,
                .memory_total = b->mem_total,
        };
}

static size_t cuda_page_bytes(struct x4_backend *b) {
        return b->page_bytes;
}

static int check_page(struct x4_backend *b, uint32_t page, const char *what) {
        char msg[160];
        int r = x4_page_check(page, b->n_pages, what, msg, sizeof msg);

        if (r < 0)
                return log_error_errno(-r, "%s", msg);
        return select_device(b);
}

static int page_read(struct x4_backend *b, uint32_t page, void *dst) {
        int r = check_page(b, page, "read of");
        if (r < 0)
                return r;
        r = CU_TRY(cudaMemcpyAsync(dst, (uint8_t *) b->cache + (uint64_t) page * b->page_bytes,
                                   b->page_bytes, cudaMemcpyDeviceToHost, b->stream),
                   EIO, "reading a cache page");
        if (r < 0)
                return r;
        return CU_TRY(cudaStreamSynchronize(b->stream), EIO, "reading a cache page");
}

static int page_write(struct x4_backend *b, uint32_t page, const void *src) {
        int r = check_page(b, page, "write of");
        if (r < 0)
                return r;
        r = CU_TRY(cudaMemcpyAsync((uint8_t *) b->cache + (uint64_t) page * b->page_bytes, src,
                                   b->page_bytes, cudaMemcpyHostToDevice, b->stream),
                   EIO, "writing a cache page");
        if (r < 0)
                return r;
        return CU_TRY(cudaStreamSynchronize(b->stream), EIO, "writing a cache page");
}

static int page_copy(struct x4_backend *b, uint32_t dst, uint32_t src) {
        int r = check_page(b, dst, "copy to");
        if (r >= 0)
                r = check_page(b, src, "copy from");
        if (r < 0)
                return r;
        r = CU_TRY(cudaMemcpyAsync((uint8_t *) b->cache + (uint64_t) dst * b->page_bytes,
                                   (uint8_t *) b->cache + (uint64_t) src * b->page_bytes,
                                   b->page_bytes, cudaMemcpyDeviceToDevice, b->stream),
                   EIO, "copying a cache page");
        if (r < 0)
                return r;
        return CU_TRY(cudaStreamSynchronize(b->stream), EIO, "copying a cache page");
}

/* The seam's calls return their message as a value (docs/design.md, "Errors"): the paths under
 * them (CU_TRY, the launchers, the checks) fail through this module's own copy of the logger,
 * whose last message log_error_value hands back in err. */

static int cuda_forward(struct x4_backend *b, const struct x4_batch *batch, float *logits, char *err,
                        size_t err_size) {
        log_clear_last_error();
        return log_error_value(forward_batch(b, batch, logits), err, err_size);
}

static int cuda_page_read(struct x4_backend *b, uint32_t page, void *dst, char *err, size_t err_size) {
        log_clear_last_error();
        return log_error_value(page_read(b, page, dst), err, err_size);
}

static int cuda_page_write(struct x4_backend *b, uint32_t page, const void *src, char *err,
                           size_t err_size) {
        log_clear_last_error();
        return log_error_value(page_write(b, page, src), err, err_size);
}

static int cuda_page_copy(struct x4_backend *b, uint32_t dst, uint32_t src, char *err,
                          size_t err_size) {
        log_clear_last_error();
        return log_error_value(page_copy(b, dst, src), err, err_size);
}

/* MTP's NextN forward (docs/model.md §8): draft logits and the block's hidden rows. */
static int cuda_nextn(struct x4_backend *b, const struct x4_nextn_batch *batch, float *logits,
                      char *err, size_t err_size) {
        log_clear_last_error();
        return log_error_value(nextn_batch(b, batch, logits), err, err_size);
}

/* Page-locked host memory for the logits and hidden buffers (x4_host_alloc): the device copies
 * into it at the bus's rate (into malloc'ed memory the driver stages through its own pinned
 * buffers: 3.5 ms for the 64 logits rows of a batch-64 step on an H100). Where pinning fails
 * (a locked-memory limit), malloc serves, once said in the log; host_free tells the two apart. */
static void *cuda_host_alloc(struct x4_backend *b, size_t bytes) {
        void *p = NULL;
        static int off = -1; /* X4_CUDA_PINNED=0: plain memory (measurements) */
        if (off < 0) {
                const char *e = getenv("X4_CUDA_PINNED");
                off = e && !strcmp(e, "0");
        }
        if (off)
                return malloc(bytes ? bytes : 1);
        if (select_device(b) >= 0 && cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) == cudaSuccess)
                return p;
        (void) cudaGetLastError();
        static bool said;
        if (!said)
                log_warning("CUDA backend: page-locked host memory for %zu bytes refused; output buffers in "
                            "plain memory (slower copies)", bytes);
        said = true;
        return malloc(bytes ? bytes : 1);
}

static void cuda_host_free(struct x4_backend *b, void *p) {
        struct cudaPointerAttributes at;
        if (!p)
                return;
        (void) select_device(b);
        if (cudaPointerGetAttributes(&at, p) == cudaSuccess && at.type == cudaMemoryTypeHost) {
                (void) cudaFreeHost(p);
                return;
        }
        (void) cudaGetLastError();
        free(p);
}

__attribute__((visibility("default"))) const struct x4_backend_ops x4_backend_cuda = {
        .name = "cuda",
        .create = cuda_create,
        .destroy = cuda_destroy_backend,
        .forward = cuda_forward,
        .caps = cuda_caps,
        .page_bytes = cuda_page_bytes,
        .page_read = cuda_page_read,
        .page_write = cuda_page_write,
        .page_copy = cuda_page_copy,
        .profile = cuda_profile,
        .nextn = cuda_nextn,
        .host_alloc = cuda_host_alloc,
        .host_free = cuda_host_free,
};
