/* SPDX-License-Identifier: MIT */
/* The CUDA kernels of the Xing4 forward, as plain C launchers (the host side, forward.c, is C11;
 * the kernels are CUDA C++ in *.cu). Every launcher only enqueues work on `stream`: none of them
 * synchronizes with the host, so a forward can later be captured as a CUDA graph.
 *
 * Determinism (docs/design.md "Numerics"): every reduction has a fixed order that depends only on the
 * row length, the position of the token and the model, never on how many tokens are in the launch
 * or which other sequences share it. Nothing uses floating-point atomics. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "mha_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Weight storage types the kernels read (ggml ids, docs/model.md §6). */
#define CU_TYPE_F32 0
#define CU_TYPE_F16 1
#define CU_TYPE_Q8_0 8
#define CU_TYPE_Q6_K 14
#define CU_TYPE_IQ4_NL 20
#define CU_TYPE_BF16 30

bool cu_type_supported(uint32_t type);

/* Kernels launched by this module so far (every launcher adds its launches; profiling reads the
 * difference around a forward). Only the thread running forwards touches it. */
extern unsigned long long cu_launches;
/* Launch kernels with programmatic dependent launch (sm_90 and newer; the backend sets it). */
extern bool cu_pdl;
/* X4_CUDA_CARVEOUT_MAX=1 (a measurement; the backend sets it): every kernel's preferred
 * shared-memory carveout the largest, set at its first launch (cu_launch). Unset, the driver
 * picks each kernel's split of L1 and shared memory from its own needs, so consecutive kernels of
 * a step mostly ask for different splits, and an SM must drain before it takes a kernel with
 * another split: the next kernel's blocks cannot start their weight loads beside the previous
 * kernel's tail, which is what programmatic dependent launch is for. */
extern bool cu_carveout_max;

/* (token, expert) pairs per token the kernels hold in registers (top-8 + shared at most). */
#define CU_SLOTS_MAX 9

/* Values a matvec lane dequantizes at once: every supported row length is a multiple of it. */
#define CU_CHUNK 32

/* Positions of the latent cache one attention block reads (split-K unit over the context). A
 * query at position p is reduced over ceil((p+1)/CU_ATTN_PART) parts, combined in part order:
 * the arithmetic depends on p alone. 128 keeps a batch-1 decode at short context spread over the
 * card (parts × head groups blocks) and the kernel's shared memory under sm_75's 48 KiB. */
#define CU_ATTN_PART 128

/* Positions of a part of the prompt attention kernel (k_attn_tc2 on prompt-class passes): its
 * parts too start at multiples of a fixed length, so a query's reduction still depends on its
 * position alone, but a long one. Each (token, part) block stages the token's 32 query rows and
 * writes its [o | m | l] rows once a part: at 128 positions that traffic (and the combine's) was
 * about as large as the cache reads of a 4K prompt. X4_CUDA_ATTN_PROMPT_PART (a multiple of 32,
 * 32..CU_ATTN_PART_TC2) shortens it: the GPU tests run a prompt over several parts with it. */
#define CU_ATTN_PART_TC2 1024

/* The longest part of the decode attention kernel (k_attn_dtc: decode-class passes over the f16
 * cache, sm_80+; cu_dtc_plen below picks a query's part length): a 32K context is 128 blocks
 * (one wave on the H200); the combine reads a part's 32 × 514 floats, so shorter parts there
 * would cost the combine what they gain. It sizes the kernel's row offsets; X4_CUDA_ATTN_DECODE_PART
 * (a multiple of 32 up to it) forces a length, for tests and measurements. */
#define CU_ATTN_PART_DEC 256

/* k_attn_dtc's part length for a query at position pos: a function of the position alone (so of
 * the token alone: batch- and chunk-invariant), short where a context is short so that its few
 * parts still spread over the card (a part's sub-parts run one after another in its block), long
 * where a context is long so that the parts stay one wave and the combine's reads small. Full
 * model, H200, batch 1, forced lengths (5f15019): 512 tokens 191.9 / 180.7 / 162.3 tok/s with
 * parts of 64 / 128 / 256, 4,096 tokens 179.3 / 175.6 / 160.3, 32,768 85.8 / 113.2 / 137.2.
 * forced (X4_CUDA_ATTN_DECODE_PART, 0 when unset) overrides it. Host and device. */
#if defined(__CUDACC__)
__host__ __device__
#endif
static inline uint32_t cu_dtc_plen(uint32_t pos, uint32_t forced) {
        return forced ? forced : pos < 2048 ? 64u : pos < 8192 ? 128u : (uint32_t) CU_ATTN_PART_DEC;
}

/* y = W·x for P input vectors. Row r of the weight is dotted with the input slice
 *   x + (p / x_div)·x_pstride + (r / G)·x_gstride      (K values)
 * and written to
 *   y + p·y_pstride + (r / G)·y_gstride + r % G.
 * With `sel`, input p uses expert sel[p]: its weight starts at w + sel[p]·expert_bytes (MoE pairs).
 * G = N for a plain matvec; grouped (per-head) matrices like attn_k_b use G = rows per head.
 * With `swiglu` the rows come in (gate, up) pairs (interleaved at load) and output j of input p
 * is silu(row 2j · x)·(row 2j+1 · x), written to y + p·y_pstride + j (docs/model.md §5 SwiGLU fused). */
/* RoPE of the queries' q_pe into their absorbed rows (cu_q_rope's job) run beside a product by
 * extra blocks of its launch (X4_CUDA_ROPE_SIDE=1, cu_mv.rope): q NULL for none. */
struct cu_rope_side {
        float *qc;
        const float *q;
        const double *inv_freq;
        const uint32_t *tok_pos;
        uint32_t n_head, nope, R, KV, T;
        bool interleave;
};

/* X4_CUDA_L2PF: byte ranges of weights (never written by a kernel) that a latency-bound kernel
 * asks the L2 to fetch before its wait, so the products after it read them from the L2 instead
 * of memory (common.cuh cu_l2_prefetch; numbers unchanged: a prefetch moves no value). n 0: none. */
#define CU_PF_MAX 4
struct cu_pf {
        const void *p[CU_PF_MAX];
        uint64_t n[CU_PF_MAX];
};

struct cu_mv {
        const void *w;
        uint32_t type;
        uint64_t row_bytes;
        uint64_t expert_bytes;
        uint32_t K, N, G;
        const float *x;
        uint64_t x_pstride, x_gstride;
        uint32_t x_div;
        float *y;
        uint64_t y_pstride, y_gstride;
        const int32_t *sel;
        /* sel was written two kernels back or earlier (the expert down product after gate-up):
         * k_mv_small reads it (past L1) and issues its weight loads before waiting for the
         * previous kernel, which by PDL's chain cannot start before the router finished */
        bool sel_ready;
        uint32_t P;
        bool swiglu;
        /* With sel, optionally the pairs grouped by expert (cu_moe_group): a block dots one
         * dequantized weight chunk with up to MV_TP pairs of the same expert instead of one,
         * with the same per-pair arithmetic (so the same bits). NULL: one pair per block. */
        const int32_t *groups;
        uint32_t n_groups_max;
        /* A matrix of few long rows (HC projection 24 × 14336, router 64 × 3584): one block per
         * row, its 32 warps splitting the row and summed in warp order. F32/F16/BF16 only (others
         * take the normal path). Fixed per matrix, so batch invariance holds. */
        bool few_rows;
        /* the queries' RoPE beside the absorb product (k_mm_tcs' extra blocks, rope_blocks of them,
         * set by its launcher; cu_matvec runs cu_q_rope's kernel after any other) */
        struct cu_rope_side rope;
        uint32_t rope_blocks;
        /* X4_CUDA_L2PF, expert products on k_mm_tcs: the same expert's rows of the next product
         * (base, bytes an expert; NULL none), each block asking the L2 for its share once it knows
         * its expert (the down rows while gate-up runs) */
        const void *pf_next;
        uint64_t pf_next_eb;
        /* X4_CUDA_L2PF, k_mm_tcs: each block asks the L2 for its whole m-tile (16 rows) as soon as
         * it knows its weights, so the parts its warps load after their first (rings of one slot:
         * batch 1's expert gate-up) come from the L2 */
        bool pf_tile;
};
void cu_matvec(const struct cu_mv *a, cudaStream_t s);
/* The tensor-core products (kernels/cuda/mmtc.cu, sm_80+, the default; X4_CUDA_MM=fp32 for generated
 * tokens on the CUDA-core ones): cu_matvec hands them
 * every product they take (true), its own paths the rest. Setup once per backend. */
bool cu_matvec_tc(const struct cu_mv *a, cudaStream_t s);
void cu_mm_tc_setup(void);
/* Whether prompt tokens take kernels of their own (an sm_80+ device with the tensor-core products
 * for prompts or for every token: the prompt attention, and the tc products while generated tokens
 * keep the fp32 ones): the backend then runs a batch's prompt tokens and generated tokens in
 * separate passes. */
bool cu_mm_tc_prompt_class(void);
/* The bf16 input scratch of the many-input tensor-core products (values: its capacity; a product
 * whose inputs do not fit takes the older kernel, with the same bits); set before a pass. */
void cu_mm_tc_scratch(void *p, uint64_t values);
/* k_mm_tcp's split-K scratch (forward.c's workspace): parts' sums (floats) and a ticket a tile,
 * the tickets zero at setup (each launch leaves them zero) */
void cu_mm_tc_ksplit(float *buf, uint64_t floats, uint32_t *tickets, uint32_t n_tickets);
#define CU_KS_FLOATS (4u << 20) /* 16 MiB: 512 stored parts of a 128 × 64 tile */
#define CU_KS_TICKETS 1024u
/* The class of the passes launched from now on (true: prompt tokens). */
void cu_mm_tc_pass(bool prompt);
/* Whether the pass being launched is a prompt-class pass (classes on and cu_mm_tc_pass(true)). */
bool cu_pass_prompt(void);
/* Grouped expert products up to this many pairs run on k_mm_tcs's group tiles; the forward groups
 * a MoE layer's pairs from MTS_P_MAX + 1 (9) up to it (0: no such grouping). */
uint32_t cu_mm_tcs_grouped_max(void);
/* The tiled mHC kernels' shared-memory limit (mhc.cu), once at backend creation. */
void cu_hc_setup(void);

/* Pairs grouped by expert for cu_mv.groups: sel holds P = T·S expert ids (S slots per token, the
 * shared expert as id n_expert); groups gets [n_tiles, then per tile (expert, first, count)]
 * followed by the pair indices ordered by expert, then pair index (`first` indexes that list),
 * then the same pairs in wide tiles: [n_wide, then per wide tile (expert, first, count)].
 * Tiles hold at most CU_GROUP_TILE pairs, wide tiles CU_GROUP_WIDE (the prompt products of
 * mmtc.cu's k_mm_tcp). Returns the tile bound to launch with (n_groups_max); the wide tiles'
 * bound is (P + CU_GROUP_WIDE − 1) / CU_GROUP_WIDE + n_ids. */
#define CU_GROUP_TILE 8
#define CU_GROUP_WIDE 64
uint32_t cu_moe_group_ints(uint32_t P, uint32_t n_ids);
uint32_t cu_moe_group(const int32_t *sel, uint32_t P, uint32_t n_ids, int32_t *groups,
                      cudaStream_t s);

/* docs/model.md §3 step 1: X[t][s] = token_embd[ids[t]] for every stream s. */
void cu_embed(const void *embd, uint32_t type, uint64_t row_bytes, const int32_t *ids, uint32_t T,
              uint32_t H, uint32_t n_hc, float *X, cudaStream_t s);

/* docs/model.md §3.1 HC pre-mapping with the sublayer's RMSNorm: per token, the unweighted RMS over the
 * n_hc·H concatenated streams, the (2+n_hc)·n_hc projection, sigmoid/clamp/exp/Sinkhorn, the
 * collapse u = Σ pre[s]·X[s] and a = RMSNorm(u, norm_w). hcp gets per token [pre, post, C]
 * (CU_HCP_STRIDE floats). */
#define CU_HCP_STRIDE 32
#define CU_HC_MAX 4 /* streams the kernels hold in registers (spec: hc_mult 4) */
struct cu_hc {
        const void *fn;
        uint32_t fn_type;
        uint64_t fn_row_bytes;
        const float *base, *scale, *norm_w;
        float *hw;         /* workspace: T × cu_hc_slices(H) × CU_HCP_STRIDE partial sums */
        uint32_t *ticket;  /* T counters, zero between launches (each launch leaves them zero) */
        uint32_t H, n_hc, iters;
        float rms_eps, hc_eps, clamp;
        /* X4_CUDA_HC_EARLY (cu_hc_early): early, this launch's post gates and Sinkhorn are left to
         * the next kernel that post-maps, and hcp is not written; hw_prev (not NULL), the previous
         * pre-mapping's partial rows (another buffer than hw), whose post gates and Sinkhorn this
         * launch computes before its wait with that sublayer's prev_base and prev_scale instead of
         * reading hcp. The same expressions on the same partials: the same bits. */
        bool early;
        const float *hw_prev, *prev_base, *prev_scale;
        /* measurement only (X4_HC_PROBE, mhc.cu): parts of the kernel left out, results wrong */
        uint32_t probe;
        /* scratch of T × H floats (idle during the trunk) for the one-launch kernel's spread tail:
         * each block's collapsed slice, which every block of the token reads for the norm's square
         * sum (mhc.cu, hcf_grid_tail). NULL: that tail is not taken. grid: whether this launch takes
         * it (cu_hc_pre sets it; callers leave it false). */
        float *ug;
        bool grid;
        struct cu_pf pf; /* X4_CUDA_L2PF: the next products' weights, asked of the L2 first */
};
/* Slices of a token's positions the fused pre-mapping kernel splits over (partials per token). */
uint32_t cu_hc_slices(uint32_t H);
/* The previous sublayer's output to post-map into X first (y NULL: none, as after the
 * embedding): o = Σ_k w[k]·y[k] over the token's n_slots outputs (slot order fixed; w NULL means
 * one slot of weight 1), then X[d] = post[d]·o + Σ_s C[d][s]·X[s] with the hcp the previous
 * pre-mapping left. */
struct cu_post {
        const float *y;
        uint64_t y_slot_stride;
        uint32_t n_slots;
        const float *w;
};
/* Post-mapping of the previous sublayer (if any) and pre-mapping of the next: blocks over slices
 * of the positions reduce partial sums (for several tokens a block when T > 1), and the last
 * block of each token (T = 1) or a tail kernel (T > 1) folds them in slice order and runs
 * gates/Sinkhorn/collapse/norm (mhc.cu; the same bits either way). */
void cu_hc_pre(const struct cu_hc *a, const struct cu_post *post, float *X, uint32_t T, float *hcp,
               float *out, cudaStream_t s);
/* docs/model.md §3.1 post-mapping alone (after the last sublayer). */
void cu_hc_post(float *X, const float *hcp, const struct cu_post *post, uint32_t T, uint32_t H,
                uint32_t n_hc, cudaStream_t s);
/* The same when the last pre-mapping was early (a: it, with hw_prev its partial rows): the post
 * gates and Sinkhorn computed here from them. */
void cu_hc_post_early(float *X, const struct cu_hc *a, const struct cu_post *post, uint32_t T, cudaStream_t s);
/* Whether X4_CUDA_HC_EARLY asks for early pre-mappings and cu_hc_pre would take the fused kernel
 * (the one that computes a previous launch's gates itself) for T tokens of weight type fn_type. */
bool cu_hc_early(uint32_t T, uint32_t fn_type);
/* Whether X4_CUDA_HC_EARLY asks for it at all (the workspace's second buffer of partial rows). */
bool cu_hc_early_asked(void);
/* docs/model.md §3 steps 3-4 for the rows asked for: out[r] = RMSNorm(mean_s X[rows[r]][s], norm_w);
 * norm_w NULL: the mean itself, unnormed (the pre-norm hidden of MTP's U4 choice,
 * X4_MTP_H_POST_NORM false). With n_hc = 1 it is a plain row RMSNorm (the NextN block's head). */
void cu_head_norm(const float *X, const int32_t *rows, uint32_t R, uint32_t H, uint32_t n_hc,
                  const float *norm_w, float eps, float *out, cudaStream_t s);

/* docs/model.md §8, the NextN block (kernels/cuda/nextn.cu): the pieces the trunk's fused HC
 * kernels do not cover. out + r·out_stride = RMSNorm(x + (rows ? rows[r] : r)·x_stride, w) for
 * r < R (rows of H values; the fixed-order block sum of k_head_norm). */
void cu_rmsnorm(const float *x, uint64_t x_stride, const int32_t *rows, uint32_t R, uint32_t H,
                const float *w, float eps, float *out, uint64_t out_stride, cudaStream_t s);
/* The plain residual of a layer without HC: X[t] += o_t for T rows of H values, o_t the
 * sublayer output as cu_post describes it (Σ_k w[k]·y[k] in slot order, or y). */
void cu_residual(float *X, const struct cu_post *post, uint32_t T, uint32_t H, cudaStream_t s);

/* Where the latent cache row of (token, layer) lives. */
struct cu_cache {
        void *base;          /* n_pages × n_layer × page_tokens × D elements (n_layer: the
                              * layers of a page, the trunk's + the NextN block's with MTP) */
        uint32_t f16;        /* element type: 0 = f32, 1 = f16 */
        uint32_t n_layer, page_tokens, D;
        const uint32_t *pt;  /* flattened page tables of the batch */
        const uint32_t *tok_pt; /* per token: offset of its sequence's table in pt */
        const uint32_t *tok_pos; /* per token: absolute position */
};

/* docs/model.md §4 steps 1-3: per token, RMSNorm of q_a (in place in qkv), RMSNorm of the latent, RoPE of
 * k_pe, and the store of [c ; k_pe] into the cache row of its position. qkv rows are
 * [q_a (QL) | latent (KV) | k_pe (R)]. */
void cu_mla_prep(float *qkv, uint32_t T, uint32_t QL, uint32_t KV, uint32_t R,
                 const float *q_a_norm, const float *kv_a_norm, float eps, const double *inv_freq,
                 bool interleave, const struct cu_cache *c, uint32_t layer, cudaStream_t s);
/* docs/model.md §4 absorbed attention for tokens [t0, t0+n): per head the query row qc[t][h] holds
 * D = KV + R values, [q_c ; RoPE(q_pe)] (cu_q_rope writes the second half from q, rows of
 * n_head × (nope + R)); softmax(scale·query·cache) over positions 0..p, out[t][h] = Σ P·c (KV
 * values). part holds n × max_parts × n_head × (KV+2) floats, sc n × max_parts × n_head ×
 * CU_ATTN_PART (the split path's scores). */
struct cu_attn {
        float *qc;
        const float *q;
        uint32_t n_head, nope, R, KV;
        float scale;
        const double *inv_freq;
        bool interleave;
        struct cu_pf pf; /* X4_CUDA_L2PF: the decode attention kernel asks the L2 for these first */
};
void cu_q_rope(const struct cu_attn *a, uint32_t T, const uint32_t *tok_pos, cudaStream_t s);
/* X4_CUDA_ROPE_SIDE=1: whether the absorb product should take the queries' RoPE as extra blocks
 * (cu_mv.rope; opt-in until a GPU has timed it). */
bool cu_rope_side_on(void);
void cu_q_rope_side(const struct cu_rope_side *r, cudaStream_t s);
/* Set by the product launcher that took a cu_mv's rope side job (cu_matvec resets and reads it). */
extern bool cu_rope_side_done;
/* Once per backend, before any forward: prepares the split attention path for rows of KV + R
 * values; false when this device or shape cannot run it (the other kernels serve). */
bool cu_attention_setup(uint32_t KV, uint32_t R);
void cu_attention(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts,
                  const struct cu_cache *c, uint32_t layer, float *sc, float *part, float *out,
                  cudaStream_t s);
/* The part length cu_attention uses for the pass being launched (cache rows of D values, f16 or
 * f32): CU_ATTN_PART, the prompt kernel's (CU_ATTN_PART_TC2), or 0 for the f16 cache's decode
 * kernel, whose parts follow the query's position (cu_dtc_plen). A plan sizes its attention groups
 * (max_parts) with it, under the same pass class as the launch. */
uint32_t cu_attn_part_len(uint32_t D, bool f16);
/* The parts of a query at position pos in the pass being launched (pos / its part length + 1). */
uint32_t cu_attn_parts(uint32_t D, bool f16, uint32_t pos);

/* Prompt attention in the non-absorbed form (mha.cu); its jobs: mha_plan.h */
struct cu_mha {
        const void *kb, *vb;  /* Kb [h][KV][nope], Vb [h][V][KV]: F32, F16 or BF16 */
        uint32_t w_type;
        uint64_t kb_row_elems, vb_row_elems;
        uint16_t *kx, *vx;    /* f16 scratch: [h][rows_cap][nope + R], [h][rows_cap][V] */
        uint32_t rows_cap;
        const float *q;       /* the pass's queries [T][h][nope + R], RoPE applied */
        uint32_t n_head, nope, R, V, KV;
        float scale;
        const struct cu_mha_job *jobs; /* this batch's (device) */
        uint32_t n_jobs, rows, qtiles;
        float *part;          /* partials [token of the group][part][head][V + 2] */
};
/* Once per backend: whether this device and head shape have the kernels (false: the absorbed
 * prompt kernels serve). */
bool cu_mha_setup(uint32_t nope, uint32_t R, uint32_t V, uint32_t KV, uint32_t *bn, bool *small);
bool cu_mha_supported(uint32_t kb_type, uint32_t vb_type);
/* a batch of jobs: expand their rows, attend their query tiles (partials into m->part), with the
 * choices cu_mha_setup made (bn, small) */
void cu_mha_batch(const struct cu_mha *m, uint32_t bn, bool small, const struct cu_cache *c, uint32_t layer,
                  cudaStream_t s);
/* fold the partials of tokens [t0, t0 + n) (rows of `values` + 2, max_parts a token) in part
 * order into out[t][h][values] */
void cu_attn_combine(const float *part, uint32_t t0, uint32_t n, uint32_t max_parts, uint32_t plen,
                     uint32_t n_head, uint32_t values, const uint32_t *tok_pos, float *out,
                     cudaStream_t s);

/* docs/model.md §5 router: per token, z = W_r·f (fp32), scores, top-k of score + bias, weights. Writes
 * per token n_slots = k (+1 for the shared expert, id n_expert, weight 1). */
struct cu_router {
        const void *w;
        uint32_t type;
        uint64_t row_bytes;
        const float *bias; /* NULL: none */
        float *z;          /* workspace: T × n_expert router logits */
        /* ceil(T / CU_ROUTE_TP) counters, zero between launches (each launch leaves them zero):
         * the last row block of a token tile to finish selects that tile's experts */
        uint32_t *ticket;
        uint32_t H, n_expert, k;
        bool shared, sigmoid, norm;
        float scale;
};
#define CU_ROUTE_TP 8 /* tokens a router block computes (and its last block routes) */
void cu_route(const struct cu_router *a, const float *f, uint32_t T, int32_t *sel, float *w,
              cudaStream_t s);
/* X4_CUDA_ROUTE_SPREAD=1 (a measurement of batch decode with real weights' expert spread; every
 * result is wrong): each token's k routed experts moved by a per-(token, layer) offset modulo
 * the expert count (still k distinct, the gate weights kept), so a batch's tokens spread over the
 * experts as a trained model's do, where the synthetic models' deep layers send every token to the
 * same few. sel: T rows of S slots, the first k routed. */
void cu_route_spread(int32_t *sel, uint32_t T, uint32_t S, uint32_t k, uint32_t n_expert, uint32_t layer,
                     cudaStream_t s);
/* cu_hc_pre that also routes the pre-mapped rows (the FFN's: cu_route's arguments r, sel, w) in
 * the same launch where X4_CUDA_HC_ROUTE asks for it and the launch can (mhc.cu, struct
 * hc_route): true if it did, false if the caller still has to call cu_route. */
bool cu_hc_pre_route(const struct cu_hc *a, const struct cu_post *post, float *X, uint32_t T, float *hcp, float *out,
                     const struct cu_router *r, int32_t *sel, float *w, cudaStream_t s);
/* Once a backend, before any forward: the router kernels' attributes (X4_CUDA_ROUTER_TILED). */
void cu_route_setup(void);
#ifdef __cplusplus
}
#endif
