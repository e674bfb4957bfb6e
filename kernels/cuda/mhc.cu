/* SPDX-License-Identifier: MIT */
/* The residual side of the trunk (docs/model.md §3, §3.1): embedding into the four streams, the fused mHC
 * pre-mapping (unweighted RMS over all streams, the 24-wide projection, sigmoid/clamp/exp/Sinkhorn,
 * collapse, the sublayer RMSNorm) in one kernel for a single token and in a token-tiled kernel and
 * a tail kernel for more (the same sums: the same bits), the post-mapping, and the head norm.
 * Everything here is fp32 (docs/model.md §5 "Numerics": streams exceed fp16 range). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "route.cuh"



__global__ void k_embed(const uint8_t *embd, uint32_t type, uint64_t row_bytes, const int32_t *ids,
                        uint32_t H, uint32_t n_hc, float *X) {
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t t = blockIdx.y;
        uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
        if (c >= H / CU_CHUNK)
                return;
        float v[CU_CHUNK];
        cu_dequant32_any(type, embd + (uint64_t) ids[t] * row_bytes, c, v);
        for (uint32_t s = 0; s < n_hc; s++) {
                float *o = X + ((uint64_t) t * n_hc + s) * H + CU_CHUNK * c;
#pragma unroll
                for (int i = 0; i < CU_CHUNK; i++)
                        o[i] = v[i];
        }
}

extern "C" void cu_embed(const void *embd, uint32_t type, uint64_t row_bytes, const int32_t *ids,
                         uint32_t T, uint32_t H, uint32_t n_hc, float *X, cudaStream_t s) {
        if (T == 0)
                return;
        uint32_t chunks = H / CU_CHUNK;
        dim3 grid((chunks + 127) / 128, T);
        cu_launches++;
        cu_launch(k_embed, grid, 128, 0, s, (const uint8_t *) embd, type, row_bytes, ids, H, n_hc, X);
}

/* docs/model.md §3.1 post-mapping of element i of token t: X[d][i] = post[d]·o + Σ_s C[d][s]·X[s][i],
 * in two halves so a loop over tokens can issue the next token's loads before this token's
 * arithmetic: hc_post_load reads everything element (t, i) needs (the slot outputs and weights,
 * the old streams, the token's post and C), hc_post_apply computes and stores the new streams
 * (and hands them back). hc_post_elem is both at once. */
struct hc_post_in {
        float yv[CU_SLOTS_MAX], wk[CU_SLOTS_MAX], old[CU_HC_MAX];
        float post[CU_HC_MAX], C[CU_HC_MAX][CU_HC_MAX];
};

static __device__ __forceinline__ void hc_post_load(const float *X, const float *hp, const struct cu_post &p,
                                                    uint32_t t, uint32_t i, uint32_t H, uint32_t n_hc,
                                                    struct hc_post_in &in) {
        if (p.w) {
#pragma unroll
                for (uint32_t k = 0; k < CU_SLOTS_MAX; k++)
                        if (k < p.n_slots) {
                                in.wk[k] = p.w[(uint64_t) t * p.n_slots + k];
                                in.yv[k] = p.y[((uint64_t) t * p.n_slots + k) * p.y_slot_stride + i];
                        }
        } else {
                in.yv[0] = p.y[(uint64_t) t * p.y_slot_stride + i];
        }
        const float *x = X + (uint64_t) t * n_hc * H + i;
#pragma unroll
        for (uint32_t s = 0; s < CU_HC_MAX; s++)
                in.old[s] = s < n_hc ? x[(uint64_t) s * H] : 0.0f;
#pragma unroll
        for (uint32_t d = 0; d < CU_HC_MAX; d++) {
                in.post[d] = d < n_hc ? hp[n_hc + d] : 0.0f;
#pragma unroll
                for (uint32_t s = 0; s < CU_HC_MAX; s++)
                        in.C[d][s] = d < n_hc && s < n_hc ? hp[2 * n_hc + d * n_hc + s] : 0.0f;
        }
}

static __device__ __forceinline__ void hc_post_apply(float *X, const struct cu_post &p, uint32_t t, uint32_t i,
                                                     uint32_t H, uint32_t n_hc, const struct hc_post_in &in,
                                                     float *xnew) {
        float o;
        if (p.w) {
                o = 0.0f;
#pragma unroll
                for (uint32_t k = 0; k < CU_SLOTS_MAX; k++)
                        if (k < p.n_slots)
                                o += in.wk[k] * in.yv[k];
        } else {
                o = in.yv[0];
        }
        float *x = X + (uint64_t) t * n_hc * H + i;
#pragma unroll
        for (uint32_t d = 0; d < CU_HC_MAX; d++) {
                xnew[d] = 0.0f;
                if (d >= n_hc)
                        continue;
                /* __fmul_rn: never contracted, so v + C·old is one fma chain from here on in
                 * every kernel that post-maps (a plain product beside the first C·old left nvcc
                 * free to fuse either one: k_hc_wtok's copy of this expression got other bits) */
                float v = __fmul_rn(in.post[d], o);
#pragma unroll
                for (uint32_t s = 0; s < CU_HC_MAX; s++)
                        if (s < n_hc)
                                v += in.C[d][s] * in.old[s];
                x[(uint64_t) d * H] = v;
                xnew[d] = v;
        }
}

static __device__ __forceinline__ void hc_post_elem(float *X, const float *hp, const struct cu_post &p,
                                                    uint32_t t, uint32_t i, uint32_t H,
                                                    uint32_t n_hc) {
        struct hc_post_in in;
        float xnew[CU_HC_MAX];
        hc_post_load(X, hp, p, t, i, H, n_hc, in);
        hc_post_apply(X, p, t, i, H, n_hc, in, xnew);
}

__global__ void k_hc_post(float *X, const float *hcp, struct cu_post post, uint32_t H,
                          uint32_t n_hc);

/* The whole pre-mapping of a sublayer in one launch (with the previous sublayer's post-mapping
 * in front): grid (slices of HCF_SLICE positions, tokens). Each block post-maps its slice of the
 * four streams into shared memory, then reduces over it the sum of squares (a thread per
 * position, block sum) and the n_hc·(2+n_hc) projection rows (a warp per three rows, a lane per
 * eight consecutive positions: one 16-byte BF16 load per row and stream) into a partial row; the
 * last block of a token to finish (an atomic ticket, reset by that block) folds the partials in
 * slice order, runs the gates and Sinkhorn on one warp, and collapses and norms the token. Every
 * sum's order depends on H alone, never on the number of tokens or on which block finishes
 * last. */
#define HCF_THREADS 256
#define HCF_SLICE 256 /* positions per block: one per thread, eight per lane of a row's warp */
#define HCF_Q CU_HCP_STRIDE /* partial row: projections 0..n_rows-1, sum of squares last */
#define HCF_ROWS (CU_HC_MAX * (2 + CU_HC_MAX))
#define HCF_FOLD_AHEAD 16 /* partial rows loaded at once by the folding warp (16 slices: H 4096) */
#define HCF_PT 16 /* positions a thread collapses per group of loads (one group up to H 4096) */

/* Shared-memory rows of floats that a lane reads eight at a time (positions 8·lane .. 8·lane + 7,
 * two 16-byte loads) are stored with their 16-byte units swizzled: unit q at q ^ ((q >> 3) & 1).
 * Plain, the eight lanes of a quarter warp (whose 16-byte loads share one shared-memory pass) hit
 * units 0, 2, .., 14 of the row: banks 0-3 twice each, two passes a load; swizzled, units 9, 11, ..
 * trade places with 8, 10, .., so the eight loads fall on distinct banks. ncu put the token-tiled
 * kernel at 80% of the L1/shared-memory throughput (718 us a sublayer of a 4,096-token pass). Only
 * where values are stored moves: every sum reads the same values in the same order. */
static __device__ __forceinline__ uint32_t hcf_swz(uint32_t i) { /* float index → its stored index */
        return ((((i >> 2) ^ ((i >> 5) & 1u)) << 2) | (i & 3u));
}

#define HCF_TILE_BLOCKS_SM 2 /* tiled blocks an SM counted on (and the registers sized for) */
#define HCF_TILE_ROUND 2     /* tokens the tiled kernel takes a round */

/* cu_block_sum of TB values at once: each value's sum is cu_block_sum's (its warp sums in lane
 * order, then the warps' in warp order), the barriers shared. Ends past a barrier. */
template <uint32_t TB>
static __device__ __forceinline__ void hcf_block_sums(float (&v)[TB], float (*red)[32]) {
        uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
#pragma unroll
        for (uint32_t k = 0; k < TB; k++)
                v[k] = cu_warp_sum(v[k]);
        __syncthreads(); /* red may still be read by a previous call */
        if (lane == 0)
#pragma unroll
                for (uint32_t k = 0; k < TB; k++)
                        red[k][warp] = v[k];
        __syncthreads();
#pragma unroll
        for (uint32_t k = 0; k < TB; k++)
                v[k] = cu_warp_sum(lane < nw ? red[k][lane] : 0.0f);
}

/* Positions 8·lane .. 8·lane + 7 of a swizzled shared-memory row of floats */
static __device__ __forceinline__ void hcf_ld8(const float *row, uint32_t lane, float *v) {
        float4 a = *(const float4 *) (row + hcf_swz(8 * lane)), b = *(const float4 *) (row + hcf_swz(8 * lane + 4));
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* Eight consecutive weights of a row (BF16/F16: one 16-byte load; F32: two). */
template <int FT>
static __device__ __forceinline__ void hcf_w8(const uint8_t *row, uint32_t i, float *w) {
        if (FT == CU_TYPE_F32) {
                const float4 *p = (const float4 *) (row + 4 * (uint64_t) i);
                float4 a = p[0], b = p[1];
                w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
                w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
                return;
        }
        uint4 v = *(const uint4 *) (row + 2 * (uint64_t) i);
        uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
                if (FT == CU_TYPE_BF16) {
                        w[2 * j] = __uint_as_float(u[j] << 16);
                        w[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
                } else {
                        float2 f = __half22float2(*(const __half2 *) &u[j]);
                        w[2 * j] = f.x;
                        w[2 * j + 1] = f.y;
                }
        }
}

/* The weights of slice `base` for every projection row into shared memory (the token-tiled
 * kernels): [HCF_ROWS][N][HCF_SLICE] values of the stored type, zeros past n_rows, n_hc and H.
 * F32 rows are read eight floats a lane: swizzled (hcf_swz); a 16-bit row's eight values are one
 * 16-byte unit a lane, conflict-free as they are. Threads tid of nt. */
template <int FT>
static __device__ __forceinline__ void hcf_stage_w(const struct cu_hc &a, uint32_t base, uint4 *wsm, uint32_t tid,
                                                   uint32_t nt) {
        constexpr uint32_t N = CU_HC_MAX, ES = FT == CU_TYPE_F32 ? 4 : 2, UPR = HCF_SLICE * ES / 16;
        uint32_t H = a.H, n_hc = a.n_hc, n_rows = n_hc * (2 + n_hc);
        for (uint32_t e = tid; e < HCF_ROWS * N * UPR; e += nt) {
                uint32_t r = e / (N * UPR), st = (e / UPR) % N, un = e % UPR;
                uint32_t pos = base + un * (16 / ES);
                uint4 v = make_uint4(0, 0, 0, 0);
                if (r < n_rows && st < n_hc && pos < H)
                        v = *(const uint4 *) ((const uint8_t *) a.fn + (uint64_t) r * a.fn_row_bytes +
                                              ((uint64_t) st * H + pos) * ES);
                wsm[ES == 4 ? e - un + (hcf_swz(4 * un) >> 2) : e] = v;
        }
}

/* Eight weights of row r, stream s of a slice staged by hcf_stage_w, at positions 8·lane .. +7 */
template <int FT>
static __device__ __forceinline__ void hcf_w8s(const float *u, uint32_t r, uint32_t s, uint32_t lane, float *w8) {
        constexpr uint32_t ES = FT == CU_TYPE_F32 ? 4 : 2;
        const uint8_t *row = (const uint8_t *) u + ((uint64_t) r * CU_HC_MAX + s) * HCF_SLICE * ES;
        if constexpr (ES == 4)
                hcf_ld8((const float *) row, lane, w8);
        else
                hcf_w8<FT>(row, 8 * lane, w8);
}

extern "C" uint32_t cu_hc_slices(uint32_t H) {
        return (H + HCF_SLICE - 1) / HCF_SLICE;
}

/* A token's pre gates on one warp (lane = its lane) from its NB partial rows p0 (folded in slice
 * order; read past L1: other blocks wrote them) into wsh (the folded row) and g[0, n_hc): sigmoids
 * of the projections times the RMS factor, with the sublayer's base and scale (docs/model.md
 * §3.1). What the collapse needs. Ends past a __syncwarp. */
static __device__ __forceinline__ void hcf_gates_pre(const struct cu_hc &a, const float *p0, uint32_t NB, const float *base,
                                                     const float *scale, float *wsh, float *g) {
        uint32_t lane = threadIdx.x % 32, n_hc = a.n_hc, W = n_hc * a.H;
        /* the partials' loads issued HCF_FOLD_AHEAD at a time (a runtime loop of loads is a chain of
         * L2 round trips), added in slice order */
        float v = 0.0f;
        for (uint32_t b0 = 0; b0 < NB; b0 += HCF_FOLD_AHEAD) {
                float pv[HCF_FOLD_AHEAD];
#pragma unroll
                for (uint32_t k = 0; k < HCF_FOLD_AHEAD; k++)
                        pv[k] = b0 + k < NB ? __ldcg(p0 + (uint64_t) (b0 + k) * HCF_Q + lane) : 0.0f;
#pragma unroll
                for (uint32_t k = 0; k < HCF_FOLD_AHEAD; k++)
                        if (b0 + k < NB)
                                v += pv[k];
        }
        wsh[lane] = v;
        __syncwarp();
        float rinv = 1.0f / sqrtf(wsh[HCF_Q - 1] / (float) W + a.rms_eps);
        if (lane < n_hc)
                g[lane] = 1.0f / (1.0f + expf(-(wsh[lane] * rinv * scale[0] + base[lane])));
        __syncwarp();
}

/* The rest of a token's gates on the warp that ran hcf_gates_pre (wsh its folded row): g[n_hc,
 * 2·n_hc) the post gates, g[2·n_hc, ..) the clamped, exponentiated and Sinkhorn-normalised
 * residual matrix C (docs/model.md §3.1). Ends past a __syncwarp. */
static __device__ __forceinline__ void hcf_gates_rest(const struct cu_hc &a, const float *base, const float *scale,
                                                      const float *wsh, float *g) {
        const uint32_t N = CU_HC_MAX;
        uint32_t lane = threadIdx.x % 32, n_hc = a.n_hc, W = n_hc * a.H;
        float rinv = 1.0f / sqrtf(wsh[HCF_Q - 1] / (float) W + a.rms_eps); /* hcf_gates_pre's */
        uint32_t d = (lane / N) % N, r = lane % N;
        float s1 = scale[1], s2 = scale[2];
        if (lane < n_hc)
                g[n_hc + lane] = 2.0f / (1.0f + expf(-(wsh[n_hc + lane] * rinv * s1 + base[n_hc + lane])));
        bool valid = d < n_hc && r < n_hc;
        uint32_t i = 2 * n_hc + d * n_hc + r;
        float L = valid ? fminf(fmaxf(wsh[i] * rinv * s2 + base[i], -a.clamp), a.clamp) : -INFINITY;
        float m = -INFINITY;
#pragma unroll
        for (uint32_t rr = 0; rr < N; rr++)
                m = fmaxf(m, __shfl_sync(CU_FULL_MASK, L, d * N + rr));
        float C = valid ? expf(L - m) : 0.0f;
        for (uint32_t it = 0; it < a.iters; it++) {
                float sum = 0.0f;
#pragma unroll
                for (uint32_t rr = 0; rr < N; rr++)
                        sum += __shfl_sync(CU_FULL_MASK, C, d * N + rr);
                sum += a.hc_eps;
                C /= sum;
                sum = 0.0f;
#pragma unroll
                for (uint32_t dd = 0; dd < N; dd++)
                        sum += __shfl_sync(CU_FULL_MASK, C, dd * N + r);
                sum += a.hc_eps;
                C /= sum;
        }
        if (valid && lane < N * N)
                g[i] = C;
        __syncwarp();
}

/* A token's gates on one warp: g = [pre (n_hc) | post (n_hc) | C (n_hc²)]; full false: the pre
 * gates only. Ends past a __syncwarp. */
static __device__ __forceinline__ void hcf_gates(const struct cu_hc &a, const float *p0, uint32_t NB, const float *base,
                                                 const float *scale, bool full, float *wsh, float *g) {
        hcf_gates_pre(a, p0, NB, base, scale, wsh, g);
        if (full)
                hcf_gates_rest(a, base, scale, wsh, g);
}

/* The tail of a token's pre-mapping, on one block of HCF_THREADS threads once every slice's
 * partial row is in a.hw: fold the slices in order and the pre gates on the first warp, then
 * collapse u = Σ_s pre[s]·X[s] and the sublayer RMSNorm into out while the first warp runs the
 * post gates and Sinkhorn (into g and hcp) before its own positions. The
 * fused kernel's last block and k_hc_tail both run it, so their bits are the same. */
template <bool PF>
static __device__ __forceinline__ void hcf_finish(const struct cu_hc &a, uint32_t t, uint32_t NB, const float *X,
                                                  float *hcp, float *out, float *u, float *wsh, float *g,
                                                  float *red2) {
        const uint32_t N = CU_HC_MAX;
        uint32_t tid = threadIdx.x, lane = tid % 32;
        uint32_t H = a.H, n_hc = a.n_hc, W = n_hc * H;
        const float *xt = X + (uint64_t) t * W;
        /* PF (the fused kernel's last block, whose registers the weights freed): the first
         * group of the collapse's stream loads and norm weights (they do not depend on the gates)
         * go out before the fold and Sinkhorn on warp 0, so the collapse below finds them in
         * registers instead of waiting on a round trip. The tail kernel (one block a token, many
         * tokens) keeps its registers low and loads them at the collapse. Same values either way. */
        float xv0[HCF_PT][N], nw[HCF_PT];
#pragma unroll
        for (uint32_t k = 0; PF && k < HCF_PT; k++) {
                uint32_t i = tid + k * HCF_THREADS;
#pragma unroll
                for (uint32_t s = 0; s < N; s++)
                        xv0[k][s] = s < n_hc && i < H ? __ldcg(xt + (uint64_t) s * H + i) : 0.0f;
                nw[k] = i < H ? a.norm_w[i] : 0.0f;
        }
        /* the collapse needs only the pre gates: they go first, and the post gates and Sinkhorn
         * (into g past the pre gates, and hcp) run on warp 0 while the block collapses, warp 0's
         * own positions after them. X4_CUDA_HC_EARLY (a.early): those are left to the next kernel
         * that post-maps (hcf_gates there, before its wait, from these partials), and hcp is not
         * written */
        if (tid < 32)
                hcf_gates_pre(a, a.hw + (uint64_t) t * NB * HCF_Q, NB, a.base, a.scale, wsh, g);
        __syncthreads();
        if (tid < 32 && !a.early) {
                hcf_gates_rest(a, a.base, a.scale, wsh, g);
                for (uint32_t k = lane; k < 2 * n_hc + n_hc * n_hc; k += 32)
                        hcp[(uint64_t) t * CU_HCP_STRIDE + k] = g[k];
        }
        if (a.probe & 4)
                return;

        /* collapse u = Σ_s pre[s]·X[s] (other blocks' post-mapped slices: read past L1), then
         * the sublayer RMSNorm. A thread's HCF_PT positions have all their stream loads (and,
         * for the first group, their norm weights) in flight at once: a loop of loads here was
         * a chain of round trips, 9.4 of the kernel's 21 us at batch 1 (ncu, X4_HC_PROBE=4). */
        float ss2 = 0.0f;
        for (uint32_t i0 = 0; i0 < H; i0 += HCF_PT * HCF_THREADS) {
                float xv[HCF_PT][N];
#pragma unroll
                for (uint32_t k = 0; k < HCF_PT; k++) {
                        uint32_t i = i0 + tid + k * HCF_THREADS;
#pragma unroll
                        for (uint32_t s = 0; s < N; s++)
                                xv[k][s] = PF && i0 == 0 ? xv0[k][s]
                                                         : s < n_hc && i < H ? __ldcg(xt + (uint64_t) s * H + i) : 0.0f;
                        if (!PF && i0 == 0)
                                nw[k] = i < H ? a.norm_w[i] : 0.0f;
                }
#pragma unroll
                for (uint32_t k = 0; k < HCF_PT; k++) {
                        uint32_t i = i0 + tid + k * HCF_THREADS;
                        if (i >= H)
                                break;
                        float v = 0.0f;
#pragma unroll
                        for (uint32_t s = 0; s < N; s++)
                                if (s < n_hc)
                                        v += g[s] * xv[k][s];
                        u[i] = v;
                        ss2 += v * v;
                }
        }
        ss2 = cu_block_sum(ss2, red2);
        float rinv2 = 1.0f / sqrtf(ss2 / (float) H + a.rms_eps);
        for (uint32_t i0 = 0; i0 < H; i0 += HCF_PT * HCF_THREADS) {
#pragma unroll
                for (uint32_t k = 0; k < HCF_PT; k++) {
                        uint32_t i = i0 + tid + k * HCF_THREADS;
                        if (i >= H)
                                break;
                        float w = i0 == 0 ? nw[k] : a.norm_w[i];
                        out[(uint64_t) t * H + i] = w * (u[i] * rinv2);
                }
        }
}

/* The one-launch kernel's tail spread over the token's NB blocks (cu_hc.grid: the host has
 * checked that the launch's blocks are all resident at once, so a block may wait for the others).
 * hcf_finish ran it on the last block alone: the collapse read the four streams' 57 KB (H 3,584)
 * on one SM, ~3.6 us of a launch's ~18 (X4_HC_PROBE=4). Here, past a barrier over the token's
 * blocks (every partial row written), each block folds the partials and runs the pre gates on
 * warp 0 (hcf_gates_pre: the same sums, so the same gates in every block), block NB − 1 also the
 * post gates and Sinkhorn into hcp; each block collapses its own slice from the streams it
 * post-mapped (zs, still in shared memory) into ug; past a second barrier each block sums the
 * squares of all H collapsed values in hcf_finish's order (thread tid: positions tid, tid + 256, ..
 * in order, then cu_block_sum) and norms its slice. Every value is hcf_finish's expression on the
 * same operands: the same bits as the ticket path and k_hc_tail (GPU step hc_grid_same). The
 * counter a.ticket[t] counts three rounds of arrivals (the barriers at NB and 2·NB, the exits) and
 * the last exit sets it back to zero. The default; X4_CUDA_HC_GRID=0 the ticket tail. */
static __device__ __forceinline__ uint32_t hcf_ld_acquire(const uint32_t *p) {
        uint32_t v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
        return v;
}

/* every block of the token past this point once all NB have reached it (round r: target r·NB);
 * what each block wrote before it is visible to the others' L2 reads after it.
 * REL (X4_CUDA_HC_RELEASE=1, opt-in until a GPU has timed it): thread 0 arrives with a release
 * reduction and waits with acquire loads, and the block's barriers order its other threads' writes
 * before the release and their reads after the acquire (the PTX model's causality order through
 * bar.sync; CUTLASS's generic barrier has the same shape), so neither the arriving thread's
 * __threadfence nor every thread's after the wait: two sequentially consistent fences of the
 * critical path a barrier, four a launch; and its norm weight is loaded before the kernel's wait
 * (k_hc_fused's nw_pre), where the default loads it just ahead of the first barrier, whose fence
 * may wait for it. Synchronization and load order only: the same bits. */
template <bool REL = false>
static __device__ __forceinline__ void hcf_grid_barrier(uint32_t *ctr, uint32_t target) {
        __syncthreads();
        if (threadIdx.x == 0) {
                if constexpr (REL) {
                        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
                } else {
                        __threadfence();
                        atomicAdd(ctr, 1u);
                }
                while (hcf_ld_acquire(ctr) < target)
                        ;
        }
        __syncthreads();
        if constexpr (!REL)
                __threadfence();
}

/* X4_CUDA_HC_ROUTE (opt-in; cu_hc_pre_route): the FFN's one-launch pre-mapping also routes its
 * token, in the spread tail, instead of k_router_fused's launch after it (that launch took 9.1-9.5
 * us a layer of a batch-1 step, H100, X4_PROBE_SKIP; a dependent launch costs ~4 us even for no
 * work). Block b computes router rows b·rpb .. b·rpb + rpb − 1 over the whole normed row, which
 * every block can form once it has the square sum: thread tid holds positions tid + 256·j (the
 * square sum's loads), so it holds every value of cu_few_rows' four chains tid + 256·q (q =
 * 0..3; positions tid + 256·q + 1024·m, m in order, one fmaf each from zero); each chain is lane
 * tid % 32 of warp slice tid / 32 + 8·q, summed by cu_warp_sum's butterfly, and the 32 slice
 * sums are added in slice order from zero: the sums k_router_fused forms with its 1,024 threads,
 * so the same logits. The last block out selects the experts with route_token (k_router_fused's
 * last block's code). The rows are asked of the L2 before the wait and loaded into registers past
 * the last barrier (untimed). Two other layouts gave the same logits (GPU step hc_route_same, the
 * full model by cmp) and were slower (2026-12-07, nineteenth session; H100, full model, batch 1
 * at 512 / 4,096): the rows staged in shared memory before the wait (~77 KB a block, so its blocks
 * no longer fit an SM beside the attention output product's) 217.9-218.1 / 202.0-202.4 tok/s
 * against 220.1-220.9 / 204.9-205.1; the rows loaded into registers before the first barrier
 * (whose fences may wait for them) 205.3-205.5 / 191.2-192.9 against 218.9-219.8 / 202.4-205.0. */
#define HCR_RPB_MAX 5 /* router rows a block at most (in registers: the release's 64 over 14 blocks) */
struct hc_route {
        struct cu_router r; /* F32 rows of H floats (row_bytes 4·H), 16-byte aligned */
        int32_t *sel;
        float *wout;
        uint32_t rpb; /* rows a block */
};
static __device__ __forceinline__ const struct hc_route *hcr_ptr() {
        return nullptr;
}
static __device__ __forceinline__ const struct hc_route *hcr_ptr(const struct hc_route &rt) {
        return &rt;
}

template <bool ROUTE = false, bool REL = false>
static __device__ __forceinline__ void hcf_grid_tail(const struct cu_hc &a, uint32_t t, uint32_t b, uint32_t NB,
                                                     const float (*zs)[HCF_SLICE], float *hcp, float *out, float *wsh,
                                                     float *g, float *red2, const struct hc_route *rt = nullptr,
                                                     float nw_pre = 0.0f) {
        const uint32_t N = CU_HC_MAX;
        uint32_t tid = threadIdx.x, lane = tid % 32;
        uint32_t H = a.H, n_hc = a.n_hc;
        uint32_t i = b * HCF_SLICE + tid;
        /* no kernel writes it: before the barrier (REL: loaded before the kernel's wait, nw_pre,
         * so no load of it is in flight at the barrier's release) */
        float nw = REL ? nw_pre : i < H ? a.norm_w[i] : 0.0f;
        float nwall[ROUTE ? HCF_PT : 1], rw[ROUTE ? HCR_RPB_MAX : 1][ROUTE ? HCF_PT : 1];
        uint32_t r0 = 0, nr = 0;
        if constexpr (ROUTE) {
                uint32_t E = rt->r.n_expert;
                r0 = b * rt->rpb, nr = r0 < E ? min(rt->rpb, E - r0) : 0;
        }
        hcf_grid_barrier<REL>(a.ticket + t, NB);
        if (tid < 32)
                hcf_gates_pre(a, a.hw + (uint64_t) t * NB * HCF_Q, NB, a.base, a.scale, wsh, g);
        __syncthreads();
        if (tid < 32 && !a.early && b == NB - 1) {
                hcf_gates_rest(a, a.base, a.scale, wsh, g);
                for (uint32_t k = lane; k < 2 * n_hc + n_hc * n_hc; k += 32)
                        hcp[(uint64_t) t * CU_HCP_STRIDE + k] = g[k];
        }
        /* the collapse of this block's positions (hcf_finish's expression) */
        float *ut = a.ug + (uint64_t) t * H;
        float v = 0.0f;
        if (i < H) {
                float xv[N];
#pragma unroll
                for (uint32_t s = 0; s < N; s++)
                        xv[s] = zs[s][hcf_swz(tid)];
#pragma unroll
                for (uint32_t s = 0; s < N; s++)
                        if (s < n_hc)
                                v += g[s] * xv[s];
                ut[i] = v;
        }
        hcf_grid_barrier<REL>(a.ticket + t, 2 * NB);
        /* the square sum of all H values: thread tid's chain over positions tid + 256·j in order
         * (hcf_finish's), HCF_PT loads in flight at a time */
        float ss2 = 0.0f;
        float uall[ROUTE ? HCF_PT : 1]; /* ROUTE: the one group's values, kept for the router */
        if constexpr (ROUTE) {
                /* the block's router rows and the norm weights at the thread's positions (H ≤
                 * HCF_PT · HCF_THREADS; the rows asked of the L2 before the wait), loaded past the
                 * last barrier: a load in flight at a barrier's fence may hold the block there
                 * until it lands */
                const float *w0 = (const float *) rt->r.w + (uint64_t) r0 * H;
#pragma unroll
                for (uint32_t k = 0; k < HCF_PT; k++) {
                        uint32_t ii = tid + k * HCF_THREADS;
                        nwall[k] = ii < H ? a.norm_w[ii] : 0.0f;
                }
#pragma unroll
                for (uint32_t rr = 0; rr < HCR_RPB_MAX; rr++)
#pragma unroll
                        for (uint32_t k = 0; k < HCF_PT; k++) {
                                uint32_t ii = tid + k * HCF_THREADS;
                                rw[rr][k] = rr < nr && ii < H ? __ldg(w0 + (uint64_t) rr * H + ii) : 0.0f;
                        }
                /* H ≤ HCF_PT · HCF_THREADS (the host checks): the loop below's one group */
#pragma unroll
                for (uint32_t k = 0; k < HCF_PT; k++) {
                        uint32_t ii = tid + k * HCF_THREADS;
                        uall[k] = ii < H ? __ldcg(ut + ii) : 0.0f;
                }
#pragma unroll
                for (uint32_t k = 0; k < HCF_PT; k++) {
                        uint32_t ii = tid + k * HCF_THREADS;
                        if (ii >= H)
                                break;
                        ss2 += uall[k] * uall[k];
                }
        } else {
                for (uint32_t i0 = 0; i0 < H; i0 += HCF_PT * HCF_THREADS) {
                        float uv[HCF_PT];
#pragma unroll
                        for (uint32_t k = 0; k < HCF_PT; k++) {
                                uint32_t ii = i0 + tid + k * HCF_THREADS;
                                uv[k] = ii < H ? __ldcg(ut + ii) : 0.0f;
                        }
#pragma unroll
                        for (uint32_t k = 0; k < HCF_PT; k++) {
                                uint32_t ii = i0 + tid + k * HCF_THREADS;
                                if (ii >= H)
                                        break;
                                ss2 += uv[k] * uv[k];
                        }
                }
        }
        ss2 = cu_block_sum(ss2, red2);
        float rinv2 = 1.0f / sqrtf(ss2 / (float) H + a.rms_eps);
        if (i < H)
                out[(uint64_t) t * H + i] = nw * (v * rinv2);
        if constexpr (!ROUTE) {
                /* the third round: the last block out sets the counter back to zero for the next launch */
                if (tid == 0 && atomicAdd(a.ticket + t, 1u) == 3 * NB - 1)
                        a.ticket[t] = 0;
                return;
        } else {
                static_assert(CU_FEW_WARPS * 32 == 4 * HCF_THREADS, "cu_few_rows' chains: four a thread");
                __shared__ float hcr_part[HCR_RPB_MAX][32];
                __shared__ bool hcr_last;
                const struct cu_router &r = rt->r;
                uint32_t warp = tid / 32, E = r.n_expert;
                /* the normed values at the thread's positions: out's expression */
                float av[HCF_PT];
#pragma unroll
                for (uint32_t k = 0; k < HCF_PT; k++) {
                        uint32_t ii = tid + k * HCF_THREADS;
                        av[k] = ii < H ? nwall[k] * (uall[k] * rinv2) : 0.0f;
                }
#pragma unroll
                for (uint32_t rr = 0; rr < HCR_RPB_MAX; rr++) {
                        if (rr >= nr)
                                break;
#pragma unroll
                        for (uint32_t q = 0; q < 4; q++) {
                                float acc = 0.0f;
#pragma unroll
                                for (uint32_t k = q; k < HCF_PT; k += 4) {
                                        uint32_t ii = tid + k * HCF_THREADS;
                                        if (ii < H)
                                                acc = __fmaf_rn(rw[rr][k], av[k], acc);
                                }
                                acc = cu_warp_sum(acc);
                                if (lane == 0)
                                        hcr_part[rr][warp + 8 * q] = acc;
                        }
                }
                __syncthreads();
                if (tid < nr) {
                        float z = 0.0f;
                        for (uint32_t w = 0; w < CU_FEW_WARPS; w++)
                                z += hcr_part[tid][w];
                        r.z[(uint64_t) t * E + r0 + tid] = z;
                        if constexpr (!REL)
                                __threadfence(); /* the logit is visible before this block's arrival */
                }
                __syncthreads();
                /* the third round: the last block out selects the token's experts and sets the
                 * counter back to zero for the next launch (REL: an acquire-release ticket instead
                 * of the two fences) */
                if (tid == 0)
                        hcr_last = (REL ? cu_ticket_acq_rel(a.ticket + t) : atomicAdd(a.ticket + t, 1u)) == 3 * NB - 1;
                __syncthreads();
                if (!hcr_last)
                        return;
                if constexpr (!REL)
                        __threadfence();
                if (tid < 32)
                        route_token<true>(r, t, lane, rt->sel, rt->wout);
                if (tid == 0)
                        a.ticket[t] = 0;
        }
}

/* The pre-mapping's first part for block (slice b, token tile): the weights of the slice's
 * positions for every projection row into registers (once for all the tokens of the tile), then
 * for each token t of the tile: the previous sublayer's post-mapping of position base + tid
 * (docs/model.md §3.1), its streams into shared memory and their square sum (streams in order),
 * and the slice's partial row into a.hw. TILE false: the fused kernel (one token a block, grid y
 * the tokens), whose last block to finish a token runs hcf_finish; TILE true: tt tokens a block
 * (grid y the tiles), k_hc_tail finishing them. Every partial is the same sum either way. */
template <int FT, bool TILE, int GRID = 0, typename... RP>
__global__ void __launch_bounds__(HCF_THREADS, TILE ? HCF_TILE_BLOCKS_SM : 1)
        k_hc_fused(struct cu_hc a, struct cu_post post, float *X, float *hcp, float *out, uint32_t T,
                   uint32_t tt, RP... rp) {
        /* RP: one struct hc_route (the spread tail's build that routes, X4_CUDA_HC_ROUTE) or none */
        constexpr bool ROUTE = sizeof...(RP) == 1;
        static_assert(!ROUTE || (GRID && !TILE), "routing: the spread tail's build");
        /* GRID: 0 the ticket tail (hcf_finish), 1 the spread tail, 2 the spread tail with
         * release / acquire barriers (hcf_grid_barrier's REL) */
        [[maybe_unused]] const struct hc_route *rt = hcr_ptr(rp...);
        constexpr uint32_t TB = TILE ? HCF_TILE_ROUND : 1; /* tokens a round */
        extern __shared__ __align__(16) float u[]; /* fused: the collapse; tiled: the weights */
        __shared__ __align__(16) float zs[TB][CU_HC_MAX][HCF_SLICE]; /* swizzled (hcf_swz) */
        __shared__ float red[TB][HCF_Q];
        __shared__ float wsh[HCF_Q];
        __shared__ float g[CU_HCP_STRIDE];
        __shared__ float red2[TB][32];
        __shared__ bool last;
        __shared__ float gprev[TILE ? 1 : CU_HCP_STRIDE]; /* early: the previous launch's gates */
        const uint32_t N = CU_HC_MAX;
        constexpr uint32_t NW = HCF_THREADS / 32, RPW = (HCF_ROWS + NW - 1) / NW;
        uint32_t b = blockIdx.x, NB = gridDim.x, tid = threadIdx.x;
        uint32_t lane = tid % 32, warp = tid / 32;
        uint32_t H = a.H, n_hc = a.n_hc, W = n_hc * H, n_rows = n_hc * (2 + n_hc);
        uint32_t base = b * HCF_SLICE;
        cu_l2_prefetch(a.pf, cu_block_flat(), cu_blocks(), tid, HCF_THREADS); /* X4_CUDA_L2PF */
        if constexpr (ROUTE) {
                /* the block's router rows (no kernel writes them) asked of the L2 before the wait;
                 * the tail loads them into registers past the projection */
                uint32_t E = rt->r.n_expert, r0 = b * rt->rpb, nr = r0 < E ? min(rt->rpb, E - r0) : 0;
                cu_l2_prefetch_range((const float *) rt->r.w + (uint64_t) r0 * H, (uint64_t) nr * H * sizeof(float), 0, 1,
                                     tid, HCF_THREADS);
        }

        /* the weights first, before the wait for the previous kernel (they overlap its tail):
         * the fused kernel holds them in registers (a lane's loads all in flight before the first
         * use); the tiled one copies the slice into shared memory (fewer registers, so more blocks
         * an SM hide the latency of a token's chain) and reads the same values there */
        uint32_t iw = base + 8 * lane; /* this lane's eight positions */
        float wv[TILE ? 1 : RPW][N][8];
        if constexpr (TILE) {
                hcf_stage_w<FT>(a, base, (uint4 *) u, tid, HCF_THREADS);
        } else {
#pragma unroll
                for (uint32_t k = 0; k < RPW; k++)
#pragma unroll
                        for (uint32_t s = 0; s < N; s++) {
                                uint32_t r = warp + NW * k;
#pragma unroll
                                for (int e = 0; e < 8; e++)
                                        wv[k][s][e] = 0.0f;
                                if (r < n_rows && s < n_hc && iw < H)
                                        hcf_w8<FT>((const uint8_t *) a.fn + (uint64_t) r * a.fn_row_bytes,
                                                   s * H + iw, wv[k][s]);
                        }
        }

        /* early (the fused kernel only): the previous pre-mapping's post gates and Sinkhorn, from its
         * partial rows, before the wait (they were written three kernels back or more, past the
         * previous kernel's own wait: the step's order has them in memory; read past L1) */
        uint32_t t0 = TILE ? blockIdx.y * tt : blockIdx.y, t_end = TILE ? min(T, t0 + tt) : t0 + 1;
        const float *hp0 = hcp + (uint64_t) t0 * CU_HCP_STRIDE; /* token t's gates: hp0 + (t − t0)·stride */
        if constexpr (!TILE)
                if (a.hw_prev && post.y) {
                        if (tid < 32)
                                hcf_gates(a, a.hw_prev + (uint64_t) t0 * NB * HCF_Q, NB, a.prev_base, a.prev_scale, true,
                                          wsh, gprev);
                        __syncthreads();
                        hp0 = gprev;
                }
        /* GRID 2: the spread tail's norm weight of this position (no kernel writes it) */
        [[maybe_unused]] float nw_pre = 0.0f;
        if constexpr (GRID == 2)
                nw_pre = base + tid < H ? a.norm_w[base + tid] : 0.0f;
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t i = base + tid;
        bool post_on = i < H && post.y;
        /* TB tokens a round (the tiled kernel: 2): each weight read from shared memory serves TB
         * tokens and a round's barriers and butterflies are shared; every token's sums are the
         * one-token chains as before */
        struct hc_post_in pin[TB];
#pragma unroll
        for (uint32_t v = 0; v < TB; v++)
                if (post_on && t0 + v < t_end)
                        hc_post_load(X, hp0 + (uint64_t) v * CU_HCP_STRIDE, post, t0 + v, i, H, n_hc, pin[v]);
        for (uint32_t t = t0; t < t_end; t += TB) {
                float ss[TB];
#pragma unroll
                for (uint32_t v = 0; v < TB; v++) {
                        uint32_t tv = t + v;
                        float z[N];
                        if (post_on && tv < t_end) {
                                hc_post_apply(X, post, tv, i, H, n_hc, pin[v], z);
                        } else {
                                const float *xt = X + (uint64_t) tv * W;
#pragma unroll
                                for (uint32_t s = 0; s < N; s++)
                                        z[s] = tv < t_end && s < n_hc && i < H ? xt[(uint64_t) s * H + i] : 0.0f;
                        }
                        ss[v] = 0.0f;
#pragma unroll
                        for (uint32_t s = 0; s < N; s++) {
                                zs[v][s][hcf_swz(tid)] = z[s];
                                if (s < n_hc)
                                        ss[v] += z[s] * z[s];
                        }
                }
                /* the next round's loads in flight during this round's sums */
#pragma unroll
                for (uint32_t v = 0; v < TB; v++)
                        if (post_on && t + TB + v < t_end)
                                hc_post_load(X, hp0 + (uint64_t) (t + TB + v - t0) * CU_HCP_STRIDE, post, t + TB + v, i,
                                             H, n_hc, pin[v]);
                hcf_block_sums<TB>(ss, red2); /* its barriers publish zs (the previous round's
                                               * reads of zs ended at its last barrier below,
                                               * of red at this call's first one) */

                /* rows warp, warp + NW, ...: lane sum over its eight positions (streams in order,
                 * positions in order), then the butterfly */
#pragma unroll
                for (uint32_t k = 0; k < RPW; k++) {
                        uint32_t r = warp + NW * k;
                        float acc[TB];
#pragma unroll
                        for (uint32_t v = 0; v < TB; v++)
                                acc[v] = 0.0f;
#pragma unroll
                        for (uint32_t s = 0; s < N; s++)
                                if (s < n_hc) {
                                        float w8[8];
                                        if constexpr (TILE) {
                                                hcf_w8s<FT>(u, r, s, lane, w8);
                                        } else {
#pragma unroll
                                                for (int e = 0; e < 8; e++)
                                                        w8[e] = wv[k][s][e];
                                        }
#pragma unroll
                                        for (uint32_t v = 0; v < TB; v++) {
                                                float z8[8];
                                                hcf_ld8(zs[v][s], lane, z8);
#pragma unroll
                                                for (int e = 0; e < 8; e++)
                                                        acc[v] += w8[e] * z8[e];
                                        }
                                }
#pragma unroll
                        for (uint32_t v = 0; v < TB; v++) {
                                float sum = cu_warp_sum(acc[v]);
                                if (lane == 0 && r < HCF_Q - 1)
                                        red[v][r] = r < n_rows ? sum : 0.0f;
                        }
                }
                if (tid == 0)
#pragma unroll
                        for (uint32_t v = 0; v < TB; v++)
                                red[v][HCF_Q - 1] = ss[v];
                __syncthreads();
#pragma unroll
                for (uint32_t v = 0; v < TB; v++)
                        if (tid < HCF_Q && t + v < t_end)
                                a.hw[((uint64_t) (t + v) * NB + b) * HCF_Q + tid] =
                                        tid < n_rows || tid == HCF_Q - 1 ? red[v][tid] : 0.0f;
        }
        if (TILE || (a.probe & 2))
                return;
        uint32_t t = t0;
        if constexpr (GRID) {
                hcf_grid_tail<ROUTE, GRID == 2>(a, t, b, NB, zs[0], hcp, out, wsh, g, red2[0], rt, nw_pre);
                return;
        }
        __syncthreads();
        if (tid == 0) {
                __threadfence();
                last = atomicAdd(&a.ticket[t], 1u) == NB - 1;
        }
        __syncthreads();
        if (!last)
                return;
        __threadfence();

        hcf_finish<true>(a, t, NB, X, hcp, out, u, wsh, g, red2[0]);
        if (tid == 0)
                a.ticket[t] = 0;
}

/* The tail of token blockIdx.x's pre-mapping after k_hc_fused<FT, true> (hcf_finish). */
__global__ void __launch_bounds__(HCF_THREADS)
        k_hc_tail(struct cu_hc a, float *X, float *hcp, float *out, uint32_t NB) {
        extern __shared__ float u[];
        __shared__ float wsh[HCF_Q];
        __shared__ float g[CU_HCP_STRIDE];
        __shared__ float red2[32];
        cu_pdl_wait();
        cu_pdl_trigger();
        hcf_finish<false>(a, blockIdx.x, NB, X, hcp, out, u, wsh, g, red2);
}

/* ---- k_hc_wtok: the token-tiled first part, a warp a token ----
 * k_hc_fused<FT, true>'s partial rows (the same sums in the same order, so the same bits) with
 * the work laid out by token instead of by row. There, every warp takes three projection rows of
 * every token, so each lane re-reads the token's post-mapped streams from shared memory for each
 * of its rows (about 123 KB of shared-memory reads a token and slice) and the block meets at four
 * barriers a round; ncu put it at 70% of the L1 throughput and a quarter of the card's bandwidth
 * (1.4 ms of a 4,096-token prefill's layer). Here a warp takes a whole token of the slice:
 *   - lane l post-maps positions 8l .. 8l + 7 (docs/model.md §3.1, hc_post_apply's expression
 *     for each position) with 16-byte loads and keeps the four streams' values in registers;
 *   - the square sum over the slice in cu_block_sum's order: each position's sum (streams in
 *     order) goes to the warp's row of shared memory, then the eight 32-position groups are summed
 *     as the eight warps of k_hc_fused sum theirs and the eight results as its block sum does;
 *   - each projection row as k_hc_fused's lane sums it (streams in order, the lane's eight
 *     positions in order, then cu_warp_sum), the weights read from shared memory once a row;
 *   - no block barrier after the weights are staged, so a warp's loads for its next token go out
 *     while other warps compute.
 * k_hc_tail then finishes each token as it does after k_hc_fused<FT, true>. Needs H % 8 == 0 and
 * 16-byte aligned stream and slot rows (the host checks). */
#define HCW_WARPS 8
template <int FT>
__global__ void __launch_bounds__(HCW_WARPS * 32, HCF_TILE_BLOCKS_SM)
        k_hc_wtok(struct cu_hc a, struct cu_post post, float *X, const float *hcp, uint32_t T, uint32_t tt) {
        static_assert(HCF_Q == 32, "a lane a value of the partial row");
        static_assert(HCF_THREADS == HCF_SLICE, "k_hc_fused's block sum: a thread a position");
        constexpr uint32_t N = CU_HC_MAX, NG = HCF_SLICE / 32; /* 32-position groups: k_hc_fused's warps */
        extern __shared__ __align__(16) float u[];            /* the slice's weights (hcf_stage_w) */
        __shared__ __align__(16) float ssb[HCW_WARPS][HCF_SLICE]; /* a warp's token: each position's square sum */
        uint32_t b = blockIdx.x, NB = gridDim.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        uint32_t H = a.H, n_hc = a.n_hc, W = n_hc * H, n_rows = n_hc * (2 + n_hc);
        uint32_t base = b * HCF_SLICE, i0 = base + 8 * lane; /* the lane's eight positions */
        bool on = i0 < H;                                      /* H % 8 == 0: all eight or none */
        cu_l2_prefetch(a.pf, cu_block_flat(), cu_blocks(), tid, HCW_WARPS * 32); /* X4_CUDA_L2PF */
        hcf_stage_w<FT>(a, base, (uint4 *) u, tid, HCW_WARPS * 32); /* weights: before the wait */
        cu_pdl_wait();
        cu_pdl_trigger();
        __syncthreads(); /* the weights staged */
        uint32_t t_end = min(T, blockIdx.y * tt + tt);
        for (uint32_t t = blockIdx.y * tt + warp; t < t_end; t += HCW_WARPS) {
                float *xt = X + (uint64_t) t * W;
                float z[N][8];
                if (on && post.y) {
                        /* the previous sublayer's post-mapping of the eight positions */
                        float o[8];
                        if (post.w) {
#pragma unroll
                                for (int e = 0; e < 8; e++)
                                        o[e] = 0.0f;
#pragma unroll
                                for (uint32_t k = 0; k < CU_SLOTS_MAX; k++)
                                        if (k < post.n_slots) {
                                                float wk = post.w[(uint64_t) t * post.n_slots + k];
                                                const float4 *yp = (const float4 *) (post.y + ((uint64_t) t * post.n_slots + k) *
                                                                                              post.y_slot_stride + i0);
                                                float4 y0 = yp[0], y1 = yp[1];
                                                float yv[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
#pragma unroll
                                                for (int e = 0; e < 8; e++)
                                                        o[e] += wk * yv[e];
                                        }
                        } else {
                                const float4 *yp = (const float4 *) (post.y + (uint64_t) t * post.y_slot_stride + i0);
                                float4 y0 = yp[0], y1 = yp[1];
                                o[0] = y0.x, o[1] = y0.y, o[2] = y0.z, o[3] = y0.w;
                                o[4] = y1.x, o[5] = y1.y, o[6] = y1.z, o[7] = y1.w;
                        }
                        float old[N][8];
#pragma unroll
                        for (uint32_t s = 0; s < N; s++) {
                                float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
                                if (s < n_hc) {
                                        const float4 *xp = (const float4 *) (xt + (uint64_t) s * H + i0);
                                        x0 = xp[0];
                                        x1 = xp[1];
                                }
                                old[s][0] = x0.x, old[s][1] = x0.y, old[s][2] = x0.z, old[s][3] = x0.w;
                                old[s][4] = x1.x, old[s][5] = x1.y, old[s][6] = x1.z, old[s][7] = x1.w;
                        }
                        const float *hp = hcp + (uint64_t) t * CU_HCP_STRIDE;
#pragma unroll
                        for (uint32_t d = 0; d < N; d++) {
#pragma unroll
                                for (int e = 0; e < 8; e++)
                                        z[d][e] = 0.0f;
                                if (d >= n_hc)
                                        continue;
                                float pd = hp[n_hc + d], C[N];
#pragma unroll
                                for (uint32_t s = 0; s < N; s++)
                                        C[s] = s < n_hc ? hp[2 * n_hc + d * n_hc + s] : 0.0f;
#pragma unroll
                                for (int e = 0; e < 8; e++) {
                                        float v = __fmul_rn(pd, o[e]); /* hc_post_apply's chain */
#pragma unroll
                                        for (uint32_t s = 0; s < N; s++)
                                                if (s < n_hc)
                                                        v += C[s] * old[s][e];
                                        z[d][e] = v;
                                }
                                float4 *xo = (float4 *) (xt + (uint64_t) d * H + i0);
                                xo[0] = make_float4(z[d][0], z[d][1], z[d][2], z[d][3]);
                                xo[1] = make_float4(z[d][4], z[d][5], z[d][6], z[d][7]);
                        }
                } else {
#pragma unroll
                        for (uint32_t s = 0; s < N; s++)
#pragma unroll
                                for (int e = 0; e < 8; e++)
                                        z[s][e] = on && s < n_hc ? xt[(uint64_t) s * H + i0 + e] : 0.0f;
                }
                /* the square sum: each position's over the streams in order, then cu_block_sum's
                 * tree over the slice (k_hc_fused: thread tid = position base + tid) */
                {
                        float ss[8];
#pragma unroll
                        for (int e = 0; e < 8; e++) {
                                ss[e] = 0.0f;
#pragma unroll
                                for (uint32_t s = 0; s < N; s++)
                                        if (s < n_hc)
                                                ss[e] += z[s][e] * z[s][e];
                        }
                        float4 *sp = (float4 *) &ssb[warp][8 * lane];
                        sp[0] = make_float4(ss[0], ss[1], ss[2], ss[3]);
                        sp[1] = make_float4(ss[4], ss[5], ss[6], ss[7]);
                }
                __syncwarp();
                float gmine = 0.0f;
#pragma unroll
                for (uint32_t w = 0; w < NG; w++) {
                        float v = cu_warp_sum(ssb[warp][32 * w + lane]);
                        if (lane == w)
                                gmine = v;
                }
                float SS = cu_warp_sum(lane < NG ? gmine : 0.0f);
                /* the projection rows: lane sums over its eight positions, then the butterfly;
                 * lane r keeps row r's */
                float rmine = 0.0f;
#pragma unroll 4
                for (uint32_t r = 0; r < n_rows; r++) {
                        float acc = 0.0f;
#pragma unroll
                        for (uint32_t s = 0; s < N; s++)
                                if (s < n_hc) {
                                        float w8[8];
                                        hcf_w8s<FT>(u, r, s, lane, w8);
#pragma unroll
                                        for (int e = 0; e < 8; e++)
                                                acc += w8[e] * z[s][e];
                                }
                        float sum = cu_warp_sum(acc);
                        if (lane == r)
                                rmine = sum;
                }
                a.hw[((uint64_t) t * NB + b) * HCF_Q + lane] = lane < n_rows ? rmine : lane == HCF_Q - 1 ? SS : 0.0f;
                __syncwarp(); /* the square sums read before the next token's land */
        }
}

/* Tokens a block of the tiled first part takes: one (the fused kernel, one launch) for a single
 * token; for more, enough that the tiles fill the SMs about once (each block loads its slice's
 * weights once for all its tokens), at most HCF_TILE_MAX. X4_CUDA_HC=fused keeps the fused kernel
 * for every token count, =tiled takes the tiled pair for every count (measurements; the bits are
 * the same either way). */
#define HCF_TILE_MAX 32
template <int FT>
static size_t hc_tile_smem(void) {
        return (size_t) HCF_ROWS * CU_HC_MAX * HCF_SLICE * (FT == CU_TYPE_F32 ? 4 : 2);
}

/* whether the tiled kernel's shared memory fits this device, by weight type (BF16, F16, F32:
 * 48, 48 and 96 KB, plus 4.4 KB of static arrays: the F32 one does not fit the 64-99 KB a block of
 * sm_75 and sm_86-sm_89 cards, which run the fused kernel for it) */
static bool hc_tile_fits[3], hc_wtok_fits[3]; /* k_hc_wtok: the same weights and 8 KB of square sums */

template <int FT>
static bool hc_tile_attr(void) {
        bool ok = cudaFuncSetAttribute(k_hc_fused<FT, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int) hc_tile_smem<FT>()) == cudaSuccess;
        (void) cudaGetLastError();
        return ok;
}

template <int FT>
static bool hc_wtok_attr(void) {
        bool ok = cudaFuncSetAttribute(k_hc_wtok<FT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int) hc_tile_smem<FT>()) == cudaSuccess;
        (void) cudaGetLastError();
        return ok;
}

extern "C" void cu_hc_setup(void) {
        hc_tile_fits[0] = hc_tile_attr<CU_TYPE_BF16>();
        hc_tile_fits[1] = hc_tile_attr<CU_TYPE_F16>();
        hc_tile_fits[2] = hc_tile_attr<CU_TYPE_F32>();
        hc_wtok_fits[0] = hc_wtok_attr<CU_TYPE_BF16>();
        hc_wtok_fits[1] = hc_wtok_attr<CU_TYPE_F16>();
        hc_wtok_fits[2] = hc_wtok_attr<CU_TYPE_F32>();
}

/* X4_CUDA_HC: 0 unset (the default's choice: k_hc_wtok from HCW_DEFAULT_MIN tokens), 1 fused,
 * 2 tiled, 3 wtok (k_hc_wtok for every count over one token); the SM count */
static int hc_force = -1, hc_sms = 0;
static void hc_env(void) {
        if (hc_force >= 0)
                return;
        const char *e = getenv("X4_CUDA_HC");
        hc_force = !e || !*e ? 0 : !strcmp(e, "fused") ? 1 : !strcmp(e, "tiled") ? 2 : !strcmp(e, "wtok") ? 3 : -1;
        if (hc_force < 0) {
                fprintf(stderr, "xing4d-cuda: X4_CUDA_HC=%s ignored: expected fused, tiled or wtok\n", e);
                hc_force = 0;
        }
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&hc_sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || hc_sms < 1)
                hc_sms = 1;
}

static uint32_t hc_tile(uint32_t T, uint32_t NB, bool fits) {
        hc_env();
        int force = hc_force, sms = hc_sms;
        if (force == 2 && !fits) {
                /* asked for (tests compare the two paths): say that it cannot be, once */
                static bool said;
                if (!said)
                        fprintf(stderr, "X4_CUDA_HC=tiled: the tiled mHC kernel's shared memory does not fit this "
                                        "device for this weight type; the fused kernel runs\n");
                said = true;
        }
        if (!fits || force == 1 || (force != 2 && T == 1))
                return 0;
        uint64_t slots = (uint64_t) sms * HCF_TILE_BLOCKS_SM, tt = ((uint64_t) T * NB + slots - 1) / slots;
        return (uint32_t) (tt < 1 ? 1 : tt > HCF_TILE_MAX ? HCF_TILE_MAX : tt);
}

/* Tokens a k_hc_wtok block takes: a multiple of its warps, as few tiles as fill the SMs once at
 * HCF_TILE_BLOCKS_SM blocks each (a block stages its slice's weights once for all its tokens) */
static uint32_t hc_wtok_tile(uint32_t T, uint32_t NB) {
        uint64_t slots = (uint64_t) hc_sms * HCF_TILE_BLOCKS_SM, tiles = slots / NB ? slots / NB : 1;
        uint64_t tt = (T + tiles - 1) / tiles;
        tt = (tt + HCW_WARPS - 1) / HCW_WARPS * HCW_WARPS;
        return (uint32_t) tt;
}

/* Passes from which k_hc_wtok is the default: prompt chunks (H200 and H100, full model: prefill
 * 4,096 12,370 -> 12,933 and 12,346 -> 12,850 tok/s, 512 +1.4-1.7%); decode batches of 16 and 64
 * keep the tiled kernel, which was as fast or faster there (-0.7 to -1.4% with wtok). The bits
 * are the same either way (tests/gpu/run.sh compares them with cmp). */
#define HCW_DEFAULT_MIN 128

/* Whether k_hc_wtok takes this launch: asked for (X4_CUDA_HC=wtok, more than one token) or the
 * default's choice (HCW_DEFAULT_MIN tokens or more), its shared memory fits, and the rows it reads
 * 16 bytes at a time are aligned */
static bool hc_wtok_ok(const struct cu_hc *a, const struct cu_post *p, const float *X, uint32_t T, bool fits) {
        hc_env();
        bool asked = hc_force == 3;
        if (T < 2 || !(asked || (hc_force == 0 && T >= HCW_DEFAULT_MIN)))
                return false;
        bool aligned = (uintptr_t) X % 16 == 0 && (!p->y || ((uintptr_t) p->y % 16 == 0 && p->y_slot_stride % 4 == 0));
        bool ok = fits && a->H % 8 == 0 && aligned;
        if (!ok && asked) {
                /* asked for (tests compare the paths): say that it cannot be, once */
                static bool said;
                if (!said)
                        fprintf(stderr, "X4_CUDA_HC=wtok: k_hc_wtok cannot take this launch (shared memory %s, "
                                        "hidden %u, streams and slot rows 16-byte aligned: %s); the default's "
                                        "kernels run\n",
                                fits ? "fits" : "does not fit", a->H, aligned ? "yes" : "no");
                said = true;
        }
        return ok;
}

/* X4_CUDA_HC_RELEASE=1: the spread tail's barriers by release / acquire (the build GRID 2,
 * hcf_grid_barrier's REL); opt-in until a GPU has timed it; the bits are the same either way */
static bool hc_release_on(void) {
        static int on = -1;
        if (on < 0)
                on = cu_env_on("X4_CUDA_HC_RELEASE");
        return on;
}

/* X4_CUDA_HC_GRID: the one-launch kernel takes the spread tail (hcf_grid_tail) where its blocks fit
 * the card at once, unless it is 0 (the ticket tail: hcf_finish on the last block); =log: spread,
 * and the first 8 launches that take it on stderr (tests: that it ran). The bits are the same
 * either way. The default since 2026-12-07's eighteenth session: on the H100, full model, batch 1
 * 221.8-222.4 / 203.4-206.5 tok/s at 512 / 4,096 against the ticket tail's 212.7-213.0 /
 * 196.4-197.9 (each tail its own build; bench/RESULTS.md). */
static int hc_grid_log;
static bool hc_grid_on(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_HC_GRID");
                bool known = !e || !*e || !strcmp(e, "0") || !strcmp(e, "1") || !strcmp(e, "log");
                if (!known)
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_HC_GRID=%s ignored: expected 0 (the ticket tail), 1 or log\n",
                                e);
                on = !(known && e && !strcmp(e, "0"));
                hc_grid_log = on && e && !strcmp(e, "log") ? 8 : 0;
        }
        return on;
}

/* Whether the one-launch kernel's blocks (NB a token, T tokens) are all resident at once on this
 * device, as the spread tail's barriers need: blocks an SM (the occupancy API, for the launch's
 * shared memory) times the SMs, computed once a type and size. Anything else on the card only
 * delays blocks (every kernel before this one ends without it; the next ones start past its end or
 * past every block's trigger), so a grid within that count cannot wait on a block never placed. */
template <int FT, bool ROUTE = false>
static bool hc_grid_fits(uint64_t blocks, size_t smem) {
        static size_t smem_seen = (size_t) -1;
        static int per_sm = 0;
        if (smem != smem_seen) {
                /* the build that runs (ROUTE: the routing one) */
                cudaError_t e;
                if constexpr (ROUTE) {
                        auto k = hc_release_on() ? k_hc_fused<FT, false, 2, struct hc_route> : k_hc_fused<FT, false, 1, struct hc_route>;
                        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, HCF_THREADS, smem);
                } else {
                        auto k = hc_release_on() ? k_hc_fused<FT, false, 2> : k_hc_fused<FT, false, 1>;
                        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, HCF_THREADS, smem);
                }
                if (e != cudaSuccess)
                        per_sm = 0;
                (void) cudaGetLastError();
                smem_seen = smem;
        }
        hc_env();
        return blocks <= (uint64_t) per_sm * (uint64_t) hc_sms;
}

/* X4_CUDA_HC_ROUTE: 1 the FFN's one-launch pre-mapping routes its token where it can (struct
 * hc_route), 0 (unset) never; =log: 1, and the first 8 launches that route on stderr (tests: that
 * it ran). Opt-in: two layouts of it measured slower, this one is untimed (hcf_grid_tail). The
 * bits are the same either way. */
static int hc_route_log;
static bool hc_route_on(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_HC_ROUTE");
                bool known = !e || !*e || !strcmp(e, "0") || !strcmp(e, "1") || !strcmp(e, "log");
                if (!known)
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_HC_ROUTE=%s ignored: expected 0, 1 or log\n", e);
                on = known && e && (!strcmp(e, "1") || !strcmp(e, "log"));
                hc_route_log = on && !strcmp(e, "log") ? 8 : 0;
        }
        return on;
}

/* Whether the routing build takes token routing for this launch (NB blocks a token, T tokens,
 * smem the launch's shared memory): the router's shapes fit it (F32 rows of exactly H floats,
 * 16-byte aligned, H ≤ 4,096, at most HCR_RPB_MAX rows a block, route_token's expert count) and
 * its blocks are all resident at once (the spread tail's barriers). Fills *rt. */
template <int FT>
static bool hcr_fits(const struct cu_hc *a, const struct hc_route *want, uint32_t NB, uint32_t T, size_t smem,
                     struct hc_route *rt) {
        const struct cu_router *r = &want->r;
        uint32_t E = r->n_expert, rpb = NB ? (E + NB - 1) / NB : 0;
        if (r->type != CU_TYPE_F32 || !r->z || E == 0 || E > ROUTER_MAX_EXPERTS || r->k > E ||
            r->H != a->H || a->H % 4 || a->H > HCF_PT * HCF_THREADS || r->row_bytes != (uint64_t) a->H * 4 ||
            (uintptr_t) r->w % 16 || rpb > HCR_RPB_MAX || !hc_grid_fits<FT, true>((uint64_t) NB * T, smem))
                return false;
        *rt = *want;
        rt->rpb = rpb;
        return true;
}

template <int FT>
static bool hc_pre_launch(const struct cu_hc *a, const struct cu_post *p, float *X, uint32_t T, float *hcp,
                          float *out, const struct hc_route *want, cudaStream_t s) {
        uint32_t NB = cu_hc_slices(a->H);
        int fi = FT == CU_TYPE_BF16 ? 0 : FT == CU_TYPE_F16 ? 1 : 2;
        if (hc_wtok_ok(a, p, X, T, hc_wtok_fits[fi])) {
                uint32_t tw = hc_wtok_tile(T, NB);
                cu_launches++;
                cu_launch(k_hc_wtok<FT>, dim3(NB, (T + tw - 1) / tw), HCW_WARPS * 32, hc_tile_smem<FT>(), s, *a, *p, X,
                          (const float *) hcp, T, tw);
                cu_launches++;
                cu_launch(k_hc_tail, dim3(T), HCF_THREADS, (size_t) a->H * sizeof(float), s, *a, X, hcp, out, NB);
                return false;
        }
        uint32_t tt = hc_tile(T, NB, hc_tile_fits[fi]);
        size_t smem = a->H * sizeof(float);
        cu_launches++;
        if (tt == 0) {
                struct cu_hc ag = *a;
                ag.grid = a->ug && !a->probe && hc_grid_on() && hc_grid_fits<FT>((uint64_t) NB * T, smem);
                if (ag.grid && hc_grid_log > 0) {
                        hc_grid_log--;
                        fprintf(stderr, "mHC: spread tail, %u blocks a token, %u tokens%s\n", NB, T,
                                hc_release_on() ? ", release barriers" : "");
                }
                struct hc_route rt;
                if (ag.grid && want && hcr_fits<FT>(a, want, NB, T, smem, &rt)) {
                        if (hc_route_log > 0) {
                                hc_route_log--;
                                fprintf(stderr, "mHC: spread tail routes, %u blocks a token, %u router rows a block, "
                                                "%u tokens\n", NB, rt.rpb, T);
                        }
                        cu_launch(hc_release_on() ? k_hc_fused<FT, false, 2, struct hc_route>
                                                  : k_hc_fused<FT, false, 1, struct hc_route>,
                                  dim3(NB, T), HCF_THREADS, smem, s, ag, *p, X, hcp, out, T, 1u, rt);
                        return true;
                }
                /* the spread tail its own build: in one build with the ticket tail, the ticket
                 * path's batch-1 step ran 198.6-199.8 tok/s at 512 where the build before the
                 * spread tail ran 211.5-212.2 (H100, the same machine) */
                cu_launch(!ag.grid ? k_hc_fused<FT, false>
                          : hc_release_on() ? k_hc_fused<FT, false, 2>
                                            : k_hc_fused<FT, false, 1>,
                          dim3(NB, T), HCF_THREADS, smem, s, ag, *p, X, hcp, out, T, 1u);
                return false;
        }
        cu_launch(k_hc_fused<FT, true>, dim3(NB, (T + tt - 1) / tt), HCF_THREADS, hc_tile_smem<FT>(), s, *a, *p, X,
                  hcp, out, T, tt);
        cu_launches++;
        cu_launch(k_hc_tail, dim3(T), HCF_THREADS, smem, s, *a, X, hcp, out, NB);
        return false;
}

static bool hc_pre_any(const struct cu_hc *a, const struct cu_post *post, float *X, uint32_t T, float *hcp, float *out,
                       const struct hc_route *want, cudaStream_t s);

extern "C" void cu_hc_pre(const struct cu_hc *a, const struct cu_post *post, float *X, uint32_t T,
                          float *hcp, float *out, cudaStream_t s) {
        (void) hc_pre_any(a, post, X, T, hcp, out, NULL, s);
}

extern "C" bool cu_hc_pre_route(const struct cu_hc *a, const struct cu_post *post, float *X, uint32_t T, float *hcp,
                                float *out, const struct cu_router *r, int32_t *sel, float *w, cudaStream_t s) {
        struct hc_route want = {.r = *r, .sel = sel, .wout = w, .rpb = 0};
        return hc_pre_any(a, post, X, T, hcp, out, r && hc_route_on() ? &want : NULL, s);
}

static bool hc_pre_any(const struct cu_hc *a, const struct cu_post *post, float *X, uint32_t T, float *hcp, float *out,
                       const struct hc_route *want, cudaStream_t s) {
        if (T == 0)
                return false;
        struct cu_post none = {0};
        const struct cu_post *p = post && post->y ? post : &none;
        /* X4_HC_PROBE (a measurement of where the kernel's time goes; its results are wrong):
         * bit 0 no Sinkhorn iterations, bit 1 no tail (partials only), bit 2 no collapse/norm,
         * bit 3 no post-mapping */
        static int probe = -1;
        if (probe < 0) {
                const char *e = getenv("X4_HC_PROBE");
                probe = e ? atoi(e) & 15 : 0;
                if (probe)
                        fprintf(stderr, "xing4d-cuda: X4_HC_PROBE=%d leaves parts of the mHC kernel out: "
                                        "timings only, every result is wrong\n", probe);
        }
        struct cu_hc pa;
        if (probe) {
                pa = *a;
                pa.probe = (uint32_t) probe;
                if (probe & 1)
                        pa.iters = 0;
                if (probe & 8)
                        p = &none;
                a = &pa;
        }
        switch (a->fn_type) {
        case CU_TYPE_BF16:
                return hc_pre_launch<CU_TYPE_BF16>(a, p, X, T, hcp, out, want, s);
        case CU_TYPE_F16:
                return hc_pre_launch<CU_TYPE_F16>(a, p, X, T, hcp, out, want, s);
        default:
                return hc_pre_launch<CU_TYPE_F32>(a, p, X, T, hcp, out, want, s);
        }
}

__global__ void k_hc_post(float *X, const float *hcp, struct cu_post post, uint32_t H,
                          uint32_t n_hc) {
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t t = blockIdx.y;
        uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= H)
                return;
        hc_post_elem(X, hcp + (uint64_t) t * CU_HCP_STRIDE, post, t, i, H, n_hc);
}

/* k_hc_post after an early pre-mapping: each block's warp 0 computes the token's post gates and
 * Sinkhorn from that launch's partial rows (hcf_gates) before the wait, as the fused kernel does */
__global__ void k_hc_post_early(float *X, struct cu_hc a, struct cu_post post, uint32_t NB) {
        __shared__ float wsh[HCF_Q];
        __shared__ float g[CU_HCP_STRIDE];
        uint32_t t = blockIdx.y;
        if (threadIdx.x < 32)
                hcf_gates(a, a.hw_prev + (uint64_t) t * NB * HCF_Q, NB, a.prev_base, a.prev_scale, true, wsh, g);
        __syncthreads();
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= a.H)
                return;
        hc_post_elem(X, g, post, t, i, a.H, a.n_hc);
}

extern "C" void cu_hc_post_early(float *X, const struct cu_hc *a, const struct cu_post *post, uint32_t T,
                                 cudaStream_t s) {
        if (T == 0)
                return;
        cu_launches++;
        cu_launch(k_hc_post_early, dim3((a->H + 255) / 256, T), 256, 0, s, X, *a, *post, cu_hc_slices(a->H));
}

/* X4_CUDA_HC_EARLY=1 (opt-in): batch-1 pre-mappings leave their post gates and Sinkhorn (20 rounds
 * of shuffles and divisions on one warp, ~2 of the fused kernel's 14 us) to the next post-mapping
 * kernel, which runs them before its wait. Same bits (GPU step hc_early). It was the default from
 * the twelfth session (+2.6% at 512 and +2.8% at 4,096 on the H100 against the tail that ran the
 * Sinkhorn before its collapse) until the tail ran the Sinkhorn on warp 0 while the block
 * collapses (hcf_finish): off, +1.4% / +0.7% at 512 and +1.1% / +1.2% at 4,096 over it, two runs
 * each (H100, 2026-12-06, fourteenth session). The next wait did not hide the rounds: without
 * them a step was 0.13 ms (2.7%) shorter. */
static int hc_early_log; /* X4_CUDA_HC_EARLY=log: on, and its first passes said (tests) */
extern "C" bool cu_hc_early_asked(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_HC_EARLY");
                hc_early_log = e && !strcmp(e, "log") ? 4 : 0;
                on = hc_early_log ? 1 : cu_env_or("X4_CUDA_HC_EARLY", false);
        }
        return on;
}

extern "C" bool cu_hc_early(uint32_t T, uint32_t fn_type) {
        if (!cu_hc_early_asked() || T == 0)
                return false;
        hc_env();
        /* hc_pre_launch's choice of the fused kernel (k_hc_wtok, asked for, may take T ≥ 2: no) */
        int fi = fn_type == CU_TYPE_BF16 ? 0 : fn_type == CU_TYPE_F16 ? 1 : 2;
        bool fits = hc_tile_fits[fi];
        bool early = T == 1 ? hc_force != 2 || !fits : hc_force != 3 && (hc_force == 1 || !fits);
        if (early && hc_early_log > 0) {
                hc_early_log--;
                fprintf(stderr, "mHC early gates: %u token(s)\n", T);
        }
        return early;
}

extern "C" void cu_hc_post(float *X, const float *hcp, const struct cu_post *post, uint32_t T,
                           uint32_t H, uint32_t n_hc, cudaStream_t s) {
        if (T == 0)
                return;
        dim3 grid((H + 255) / 256, T);
        cu_launches++;
        cu_launch(k_hc_post, grid, 256, 0, s, X, hcp, *post, H, n_hc);
}

__global__ void k_head_norm(const float *X, const int32_t *rows, uint32_t H, uint32_t n_hc,
                            const float *norm_w, float eps, float *out) {
        cu_pdl_wait();
        cu_pdl_trigger();
        extern __shared__ float h[];
        __shared__ float red[32];
        uint32_t r = blockIdx.x;
        const float *x = X + (uint64_t) rows[r] * n_hc * H;
        float ss = 0.0f;
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
                float v = 0.0f;
                for (uint32_t s = 0; s < n_hc; s++)
                        v += x[(uint64_t) s * H + i];
                v /= (float) n_hc; /* docs/model.md §3 step 3: mean, not sum */
                h[i] = v;
                ss += v * v;
        }
        ss = cu_block_sum(ss, red);
        float rinv = 1.0f / sqrtf(ss / (float) H + eps);
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x)
                out[(uint64_t) r * H + i] = norm_w ? norm_w[i] * (h[i] * rinv) : h[i];
}

extern "C" void cu_head_norm(const float *X, const int32_t *rows, uint32_t R, uint32_t H,
                             uint32_t n_hc, const float *norm_w, float eps, float *out,
                             cudaStream_t s) {
        if (R == 0)
                return;
        cu_launches++;
        cu_launch(k_head_norm, R, 256, H * sizeof(float), s, X, rows, H, n_hc, norm_w, eps, out);
}
