/* SPDX-License-Identifier: MIT */
/* Stored-row × fp32-vector products for every projection of the model (docs/model.md §3-§5): BF16
 * attention and HC weights, IQ4_NL dense/expert FFNs (MoE pairs grouped through `sel`), the Q6_K
 * head. One warp owns one output row; lane l dequantizes the 32-value chunks l, l+32, ... of the
 * row once and dots them with up to MV_TP input vectors. The per-lane order and the butterfly over
 * the warp are fixed, so an output depends only on its row and its input: not on how many vectors
 * share the launch (batch invariance) nor on the tile a vector lands in.
 *
 * Three kernels compute that one order: k_mv_small (≤ 16 inputs, shaped for bandwidth), k_mm
 * (many inputs: a register tile of rows × inputs per thread) and k_matvec (the rest). A
 * tensor-core path would need its own order for every token count (issue 12). */
#include "common.cuh"
#include <stdio.h>

#define MV_WARPS 8
#define MV_TP 8 /* input vectors per block: 8 × 4.2 KB of x tile in shared memory */

/* NR = 1: one row per warp. NR = 2 (SwiGLU): the warp computes the (gate, up) row pair 2j, 2j+1
 * with the same per-row arithmetic as NR = 1 and writes silu(gate)·up.
 *
 * The inputs are staged through shared memory one tile of 32 chunks (1024 values) at a time, so
 * global reads of x are coalesced and shared by the block's 8 rows; each chunk is stored with a
 * stride of 33 floats so lane l reading chunk l hits bank (l + i) % 32 (no conflicts). Reading x
 * straight from global with a 128-byte stride per lane cost 270 µs for the 24-row HC projection
 * of one token (ncu, H200). Lane l still takes chunks l, l+32, ... in order, so the arithmetic is
 * the same as without the tile. */
#define MV_TILE_CHUNKS 32
#define MV_TILE_STRIDE (CU_CHUNK + 1)

/* GROUPED: blockIdx.y is a tile of a.groups (cu_moe_group): up to TP pairs of one expert. */
template <int TYPE, int TP, int NR, bool GROUPED>
__global__ void __launch_bounds__(MV_WARPS * 32) k_matvec(struct cu_mv a) {
        cu_pdl_wait();
        cu_pdl_trigger();
        __shared__ float iq4[16];
        __shared__ float xs[TP][MV_TILE_CHUNKS * MV_TILE_STRIDE];
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t r = blockIdx.x * MV_WARPS + warp; /* output index */
        uint32_t p0 = blockIdx.y * TP, n_p = min((uint32_t) TP, a.P - min(p0, a.P));
        const int32_t *perm = NULL;
        int32_t expert = 0;
        if (GROUPED && !cu_group_tile(a, blockIdx.y, &expert, &perm, &n_p))
                return; /* the whole block: beyond this batch's tiles */
        if (TYPE == CU_TYPE_IQ4_NL && threadIdx.x < 16)
                iq4[threadIdx.x] = cu_iq4nl_values[threadIdx.x];
        /* no early return: every warp takes part in the tile loads and barriers */
        bool active = r < a.N / NR;

        const uint8_t *w = (const uint8_t *) a.w + (uint64_t) (active ? r : 0) * NR * a.row_bytes;
        if (GROUPED)
                w += (uint64_t) expert * a.expert_bytes;
        else if (a.sel)
                w += (uint64_t) a.sel[p0] * a.expert_bytes; /* TP == 1 with sel */
        /* the block's rows share one input group (host checks G % MV_WARPS == 0) */
        uint32_t g = NR == 1 ? (blockIdx.x * MV_WARPS) / a.G : 0;
        const float *x[TP];
        uint32_t pid[TP]; /* the pair (input/output index) of tile slot t */
        float acc[NR][TP];
#pragma unroll
        for (int t = 0; t < TP; t++) {
                uint32_t p = GROUPED ? (uint32_t) perm[(uint32_t) t < n_p ? t : 0]
                                     : ((uint32_t) t < n_p ? p0 + t : p0);
                pid[t] = p;
                x[t] = a.x + (uint64_t) (p / a.x_div) * a.x_pstride + (uint64_t) g * a.x_gstride;
#pragma unroll
                for (int k = 0; k < NR; k++)
                        acc[k][t] = 0.0f;
        }

        uint32_t n_chunks = a.K / CU_CHUNK;
        for (uint32_t c0 = 0; c0 < n_chunks; c0 += MV_TILE_CHUNKS) {
                uint32_t n_vals = min(n_chunks - c0, (uint32_t) MV_TILE_CHUNKS) * CU_CHUNK;
                __syncthreads(); /* the previous tile has been read */
#pragma unroll
                for (int t = 0; t < TP; t++)
                        for (uint32_t e = threadIdx.x; (uint32_t) t < n_p && e < n_vals;
                             e += blockDim.x)
                                xs[t][(e / CU_CHUNK) * MV_TILE_STRIDE + e % CU_CHUNK] =
                                        x[t][(uint64_t) c0 * CU_CHUNK + e];
                __syncthreads();
                uint32_t c = c0 + lane;
                if (!active || c >= n_chunks)
                        continue;
#pragma unroll
                for (int k = 0; k < NR; k++) {
                        float wv[CU_CHUNK];
                        cu_dequant32<TYPE>(w + k * a.row_bytes, c, wv, iq4);
#pragma unroll
                        for (int t = 0; t < TP; t++) {
                                if ((uint32_t) t >= n_p)
                                        break; /* a part-filled tile (last of a batch/expert) */
                                const float *xv = &xs[t][lane * MV_TILE_STRIDE];
                                float s = 0.0f;
#pragma unroll
                                for (int i = 0; i < CU_CHUNK; i++)
                                        s += wv[i] * xv[i];
                                acc[k][t] += s;
                        }
                }
        }
        if (!active)
                return;
#pragma unroll
        for (int t = 0; t < TP; t++) {
                float v = cu_warp_sum(acc[0][t]);
                if (NR == 2) {
                        float u = cu_warp_sum(acc[NR - 1][t]);
                        v = v / (1.0f + expf(-v)) * u; /* docs/model.md §5: silu(gate)·up in fp32 */
                }
                if (lane == 0 && (uint32_t) t < n_p)
                        a.y[(uint64_t) pid[t] * a.y_pstride + (uint64_t) g * a.y_gstride +
                            (NR == 1 ? r % a.G : r)] = v;
        }
}

/* k_mv_small: the same products for few input vectors (decode: at most MVS_TP_MAX per block),
 * shaped for memory bandwidth. A lane issues the weight loads of up to MVS_BATCH of its chunks
 * (one per staged input tile) before the first barrier, so the row's bytes are in flight while
 * the inputs are staged; the inputs go through shared memory as in k_matvec (a lane reading its
 * 128-byte chunk of x straight from global memory touches 32 cache lines per warp load).
 *
 * The arithmetic is k_matvec's, so the two kernels give the same bits and the choice between them
 * (by batch shape) never changes a result:
 *   - lane l owns chunks l, l+32, ... of its row, in order; s = Σ_i w[i]·x[i] as one chain from
 *     0 (fused multiply-adds, i ascending), acc += s per chunk;
 *   - the warp's 32 lane sums are folded by the butterfly (cu_warp_sum).
 * Rows of at most 8 chunks leave lanes idle in k_matvec; here a warp packs 32/L rows of
 * L = 4 or 8 lanes each. k_matvec's butterfly steps 16 … L add an idle lane's +0 to every
 * value, which is exact except that it turns −0 into +0: `+ 0.0f` once reproduces that, then
 * the sub-warp butterfly (L/2 … 1) is the rest of the same pattern. */
#define MVS_WARPS 8
#define MVS_BATCH 4  /* chunks (input tiles) a lane loads ahead */
#define MVS_TP_MAX 8 /* input vectors one block serves */
#define MVS_FX_CHUNKS 128 /* k_mv_small<..., FX>: the whole input (K ≤ 4,096) staged at once */
#define MVS_XS 36    /* floats a staged chunk takes: 16-byte aligned, a quarter warp's 16-byte
                      * reads of chunks sl, sl + 1, ... hit distinct banks */
/* RW (rows a warp computes, RW·RPW in all): with a short row (one input tile), one row a warp
 * keeps too few bytes in flight (the K = 1024 expert down product: 18 bytes a lane, 0.7 TB/s);
 * RW rows a warp issue RW rows' loads at once, MVS_BATCH / RW tiles ahead each. */

template <int TYPE>
struct raw_chunk; /* a chunk's stored bytes, loaded as wide as its alignment allows */
template <>
struct raw_chunk<CU_TYPE_BF16> {
        uint4 v[4];
        __device__ __forceinline__ void load(const uint8_t *row, uint32_t c) {
                const uint4 *r = (const uint4 *) (row + 64 * (uint64_t) c);
#pragma unroll
                for (int i = 0; i < 4; i++)
                        v[i] = r[i];
        }
        __device__ __forceinline__ void dequant(float *out, const float *) const {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                        uint32_t wv[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                                out[8 * i + 2 * j] = __uint_as_float(wv[j] << 16);
                                out[8 * i + 2 * j + 1] = __uint_as_float(wv[j] & 0xffff0000u);
                        }
                }
        }
};
template <>
struct raw_chunk<CU_TYPE_IQ4_NL> {
        /* the block's nine 16-bit units (scale, then the quant byte pairs), two to a word */
        uint32_t w[5];
        __device__ __forceinline__ void load(const uint8_t *row, uint32_t c) {
                const uint8_t *b = row + 18 * (uint64_t) c;
                if (((uintptr_t) row & 3) == 0) {
                        /* 18-byte blocks are 2-byte aligned: five aligned words cover the block
                         * (nine 16-bit loads before), shifted by half a word for odd blocks */
                        const uint32_t *p = (const uint32_t *) ((uintptr_t) b & ~(uintptr_t) 3);
#pragma unroll
                        for (int i = 0; i < 5; i++)
                                w[i] = p[i];
                        if (c & 1) {
#pragma unroll
                                for (int i = 0; i < 4; i++)
                                        w[i] = __funnelshift_r(w[i], w[i + 1], 16);
                                w[4] >>= 16;
                        }
                } else {
                        const uint16_t *h = (const uint16_t *) b;
#pragma unroll
                        for (int i = 0; i < 5; i++)
                                w[i] = (uint32_t) h[2 * i] | (i < 4 ? (uint32_t) h[2 * i + 1] << 16 : 0u);
                }
        }
        __device__ __forceinline__ uint32_t unit(int k) const {
                return (w[k >> 1] >> (16 * (k & 1))) & 0xffffu;
        }
        /* The codebook in registers instead of a shared-memory table (a load a value kept the
         * L1 pipe 55-69% busy in the expert products, ncu): the 16 entries + 128 as bytes of
         * four words, a unit's four nibbles (values 2j, 2j + 16, 2j + 1, 2j + 17) looked up
         * by three byte permutes, each byte turned into its float by the 2^23 trick. The
         * values are the same integers, so d·value is the same product as before. */
        __device__ __forceinline__ void dequant(float *out, const float *) const {
                float d = __half2float(__ushort_as_half((uint16_t) unit(0)));
#pragma unroll
                for (int j = 0; j < 8; j++) {
                        uint32_t u = unit(1 + j);
                        uint32_t ix = u & 0x7777u;
                        uint32_t lo = __byte_perm(CU_IQ4_B0, CU_IQ4_B1, ix);
                        uint32_t hi = __byte_perm(CU_IQ4_B2, CU_IQ4_B3, ix);
                        uint32_t v = __byte_perm(lo, hi, ((u >> 1) & 0x4444u) | 0x3210u);
                        out[2 * j] = d * cu_iq4_byte(v, 0);
                        out[2 * j + 16] = d * cu_iq4_byte(v, 1);
                        out[2 * j + 1] = d * cu_iq4_byte(v, 2);
                        out[2 * j + 17] = d * cu_iq4_byte(v, 3);
                }
        }
};
/* the other types: through cu_dequant32 at compute time (no early load) */
template <int TYPE>
struct raw_chunk {
        const uint8_t *row;
        uint32_t c;
        __device__ __forceinline__ void load(const uint8_t *r, uint32_t cc) {
                row = r;
                c = cc;
        }
        __device__ __forceinline__ void dequant(float *out, const float *iq4) const {
                cu_dequant32<TYPE>(row, c, out, iq4);
        }
};

/* Where quarter `sub` (0-7) of a Q6_K super-block b keeps its ql and qh bytes, its shifts and its two
 * scales d·sc, as cu_dequant32 forms them (docs/model.md §6): k_mm's and k_mv_small's chunks */
struct q6k_meta {
        uint32_t ql, qh, shift_lo, shift_hi;
        float ds0, ds1;
        __device__ __forceinline__ q6k_meta(const uint8_t *b, uint32_t sub) {
                uint32_t n = sub / 4, q = sub % 4;
                const int8_t *sc = (const int8_t *) (b + 192) + 8 * n;
                float d = cu_fp16(b + 208);
                ql = 64 * n + ((q & 1) ? 32 : 0);
                qh = 128 + 32 * n;
                shift_lo = (q & 2) ? 4 : 0;
                shift_hi = 2 * q;
                ds0 = d * (float) sc[2 * q];
                ds1 = d * (float) sc[1 + 2 * q];
        }
};

/* Q6_K rows of whole tiles (the head at batch 1-16, k_mv_small with L = 32, RW = 1, NR = 1): a
 * warp's tile of 32 chunks is 4 super-blocks, 840 contiguous bytes. Lane l loads words l, l + 32,
 * ... of them (7 a lane, coalesced) ahead, as the other types' raw chunks are loaded, and stages
 * them in shared memory with each super-block at a 4-byte boundary (212 bytes apart: the 210-byte
 * blocks are 2-byte aligned in the row); a lane then decodes its own chunk there four six-bit
 * quants a word (q6k_decode): the values cu_dequant32 gives, (d·sc)·(q − 32), exactly. Before,
 * each lane's cu_dequant32 read its chunk straight from global memory in 2-byte loads and
 * decoded it a value at a time: 439 us for the 385 MB head at batch 1 (18% of DRAM throughput,
 * the L1 half busy), now 360 (ncu, H200, 2026-12-04: batch 1 at 512 195.1 -> 198.8 tok/s). It
 * is issue-bound now (101 registers, two blocks an SM; compiled for three, 80 registers without
 * spills, it was no faster: 199.5 against 200.3). */
#define Q6T_WORDS 210 /* 4 super-blocks of 210 bytes, as loaded */
#define Q6T_SB 212    /* bytes a staged super-block takes */
struct q6k_tile {
        uint32_t w[(Q6T_WORDS + 31) / 32];
        /* tile `tile` of a row of n_chunks chunks (a multiple of 8: whole super-blocks) */
        __device__ __forceinline__ void load(const uint8_t *row, uint32_t tile, uint32_t n_chunks, uint32_t lane) {
                uint32_t nsb = min(4u, (n_chunks - tile * MV_TILE_CHUNKS) / 8), bytes = 210 * nsb;
                const uint8_t *base = row + 840 * (uint64_t) tile;
                bool al = ((uintptr_t) base & 3) == 0; /* 210-byte blocks: rows 2-byte aligned at least */
#pragma unroll
                for (int j = 0; j < (Q6T_WORDS + 31) / 32; j++) {
                        uint32_t o = 4 * (lane + 32 * j), v = 0;
                        if (o + 4 <= bytes)
                                v = al ? *(const uint32_t *) (base + o)
                                       : (uint32_t) *(const uint16_t *) (base + o) |
                                                 (uint32_t) *(const uint16_t *) (base + o + 2) << 16;
                        else if (o + 2 <= bytes)
                                v = *(const uint16_t *) (base + o);
                        w[j] = v;
                }
        }
        /* into the warp's staging bytes s (4·Q6T_SB): the two 16-bit halves of a word each at its
         * super-block's place (a half never straddles two blocks: 210 is even). All lanes; returns
         * past a __syncwarp. */
        __device__ __forceinline__ void stage(uint8_t *s, uint32_t lane) const {
                __syncwarp(); /* the previous tile's decodes have read s */
#pragma unroll
                for (int j = 0; j < (Q6T_WORDS + 31) / 32; j++) {
                        uint32_t o = 4 * (lane + 32 * j);
                        if (o < 4 * Q6T_WORDS) {
                                uint32_t b0 = o / 210, b1 = (o + 2) / 210;
                                *(uint16_t *) (s + o + (Q6T_SB - 210) * b0) = (uint16_t) w[j];
                                *(uint16_t *) (s + o + 2 + (Q6T_SB - 210) * b1) = (uint16_t) (w[j] >> 16);
                        }
                }
                __syncwarp();
        }
};

/* Chunk c (< 32) of a staged tile (q6k_tile::stage): cu_dequant32's values, four quants a word:
 * the ql nibbles and qh pairs of values 4k .. 4k + 3 in one word each (docs/model.md §6), their
 * byte e assembled as cu_dequant32 assembles it, then (d·sc)·(q − 32) with d·sc as it forms it. */
static __device__ __forceinline__ void q6k_decode(const uint8_t *s, uint32_t c, float *out) {
        const uint8_t *b = s + Q6T_SB * (c / 8);
        struct q6k_meta m(b, c % 8);
        const uint32_t *ql = (const uint32_t *) (b + m.ql), *qh = (const uint32_t *) (b + m.qh);
        uint32_t shift_lo = m.shift_lo, shift_hi = m.shift_hi;
        float ds0 = m.ds0, ds1 = m.ds1;
#pragma unroll
        for (int k = 0; k < 8; k++) {
                uint32_t v = ((ql[k] >> shift_lo) & 0x0F0F0F0Fu) | (((qh[k] >> shift_hi) & 0x03030303u) << 4);
#pragma unroll
                for (int e = 0; e < 4; e++)
                        out[4 * k + e] = (k < 4 ? ds0 : ds1) * (float) ((int) ((v >> (8 * e)) & 0xffu) - 32);
        }
}
template <int TYPE, bool Q6S>
struct mvs_raw {
        using type = raw_chunk<TYPE>;
};
template <>
struct mvs_raw<CU_TYPE_Q6_K, true> {
        using type = q6k_tile;
};

template <int TYPE, int TP, int NR, int L, bool GROUPED, int RW, bool FX = false, int MINB = 1>
__global__ void __launch_bounds__(MVS_WARPS * 32, MINB) k_mv_small(struct cu_mv a) {
        static_assert(!FX || TP == 1, "the whole input staged at once: one input a block");
        __shared__ __align__(16) float xs[TP][(FX ? MVS_FX_CHUNKS : MV_TILE_CHUNKS) * MVS_XS];
        constexpr bool Q6S = TYPE == CU_TYPE_Q6_K && L == 32 && RW == 1 && NR == 1 && !GROUPED;
        __shared__ __align__(16) uint8_t q6s[Q6S ? MVS_WARPS : 1][Q6S ? 4 * Q6T_SB : 4];
        constexpr int RPW = 32 / L; /* rows per warp pass */
        constexpr int TB = MVS_BATCH / RW > 0 ? MVS_BATCH / RW : 1; /* tiles a lane loads ahead */
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, sl = lane % L;
        /* the warp's rows: RW passes of RPW rows, consecutive */
        uint32_t rb = (blockIdx.x * MVS_WARPS + warp) * RW * RPW + lane / L;
        uint32_t p0 = blockIdx.y * TP, n_p = min((uint32_t) TP, a.P - min(p0, a.P));
        const int32_t *perm = NULL;
        int32_t expert = 0;
        if (a.sel && (GROUPED || !a.sel_ready))
                cu_pdl_wait(); /* the expert ids come from the router kernel */
        if (GROUPED && !cu_group_tile(a, blockIdx.y, &expert, &perm, &n_p))
                return; /* the whole block */
        uint64_t eoff = 0; /* TP == 1 with sel */
        if (GROUPED)
                eoff = (uint64_t) expert * a.expert_bytes;
        else if (a.sel)
                eoff = (uint64_t) (a.sel_ready ? __ldcg(a.sel + p0) : a.sel[p0]) * a.expert_bytes;
        bool active[RW];
        const uint8_t *w[RW];
#pragma unroll
        for (int k = 0; k < RW; k++) {
                uint32_t r = rb + k * RPW;
                active[k] = r < a.N / NR;
                w[k] = (const uint8_t *) a.w + (uint64_t) (active[k] ? r : 0) * NR * a.row_bytes + eoff;
        }
        /* the block's rows share one input group (the host checks G) */
        uint32_t g = NR == 1 ? (blockIdx.x * MVS_WARPS * RW * RPW) / a.G : 0;
        const float *x[TP];
        uint32_t pid[TP];
        float acc[RW][NR][TP];
#pragma unroll
        for (int t = 0; t < TP; t++) {
                uint32_t p = GROUPED ? (uint32_t) perm[(uint32_t) t < n_p ? t : 0]
                                     : ((uint32_t) t < n_p ? p0 + t : p0);
                pid[t] = p;
                x[t] = a.x + (uint64_t) (p / a.x_div) * a.x_pstride + (uint64_t) g * a.x_gstride;
#pragma unroll
                for (int k = 0; k < RW; k++)
#pragma unroll
                        for (int n = 0; n < NR; n++)
                                acc[k][n][t] = 0.0f;
        }
        /* lane sl's chunk of tile i is 32·i + sl (L < 32: one tile, chunks < L). Thread j
         * stages values 4j..4j+3 of each input's tile with one 16-byte load; the next tile's
         * loads are issued before the current tile is computed (a strided loop of loads here
         * was a chain of dependent L2 round trips per tile). */
        static_assert(MVS_WARPS * 32 * 4 == MV_TILE_CHUNKS * CU_CHUNK, "one float4 per thread");
        uint32_t n_chunks = a.K / CU_CHUNK;
        uint32_t n_tiles = (n_chunks + MV_TILE_CHUNKS - 1) / MV_TILE_CHUNKS;
        uint32_t e4 = 4 * threadIdx.x;
        float4 xr[TP];
        for (uint32_t t0 = 0; t0 < n_tiles; t0 += TB) {
                typename mvs_raw<TYPE, Q6S>::type raw[RW][NR][TB];
#pragma unroll
                for (int b = 0; b < TB; b++) {
                        uint32_t c = (t0 + b) * MV_TILE_CHUNKS + sl;
                        if constexpr (Q6S) {
                                if (active[0] && t0 + b < n_tiles)
                                        raw[0][0][b].load(w[0], t0 + b, n_chunks, lane);
                        } else {
#pragma unroll
                                for (int k = 0; k < RW; k++)
                                        if (active[k] && c < n_chunks)
#pragma unroll
                                                for (int n = 0; n < NR; n++)
                                                        raw[k][n][b].load(w[k] + n * a.row_bytes, c);
                        }
                }
                if (t0 == 0) {
                        /* the first weights are in flight: now the inputs (written by the
                         * previous kernel) */
                        cu_pdl_wait();
                        cu_pdl_trigger();
                        if constexpr (FX) {
                                /* the whole input at once (K ≤ MVS_FX_CHUNKS chunks): one round
                                 * trip and one barrier instead of two a tile */
                                constexpr uint32_t Q = MVS_FX_CHUNKS / MV_TILE_CHUNKS;
                                float4 xq[Q];
#pragma unroll
                                for (uint32_t q = 0; q < Q; q++) {
                                        uint32_t e = e4 + q * MV_TILE_CHUNKS * CU_CHUNK;
                                        if (e < a.K)
                                                xq[q] = *(const float4 *) (x[0] + e);
                                }
#pragma unroll
                                for (uint32_t q = 0; q < Q; q++) {
                                        uint32_t e = e4 + q * MV_TILE_CHUNKS * CU_CHUNK;
                                        if (e < a.K)
                                                *(float4 *) &xs[0][(e / CU_CHUNK) * MVS_XS + e % CU_CHUNK] = xq[q];
                                }
                                __syncthreads();
                        } else {
#pragma unroll
                                for (int t = 0; t < TP; t++)
                                        if ((uint32_t) t < n_p && e4 < a.K)
                                                xr[t] = *(const float4 *) (x[t] + e4);
                        }
                }
#pragma unroll
                for (int b = 0; b < TB; b++) {
                        uint32_t tile = t0 + b;
                        if (tile >= n_tiles)
                                break;
                        if constexpr (!FX) {
                                uint32_t n_vals = min(n_chunks - tile * MV_TILE_CHUNKS,
                                                      (uint32_t) MV_TILE_CHUNKS) * CU_CHUNK;
                                __syncthreads(); /* the previous tile has been read */
                                if (e4 < n_vals) {
                                        uint32_t o = (e4 / CU_CHUNK) * MVS_XS + e4 % CU_CHUNK;
#pragma unroll
                                        for (int t = 0; t < TP; t++)
                                                if ((uint32_t) t < n_p)
                                                        *(float4 *) &xs[t][o] = xr[t];
                                }
                                __syncthreads();
                                uint64_t nx = (uint64_t) (tile + 1) * MV_TILE_CHUNKS * CU_CHUNK + e4;
#pragma unroll
                                for (int t = 0; t < TP; t++)
                                        if ((uint32_t) t < n_p && nx < a.K)
                                                xr[t] = *(const float4 *) (x[t] + nx);
                        }
                        uint32_t c = tile * MV_TILE_CHUNKS + sl;
                        if constexpr (Q6S)
                                raw[0][0][b].stage(q6s[warp], lane); /* the whole warp */
                        if (c >= n_chunks)
                                continue;
                        uint32_t xc = FX ? c : sl; /* the chunk's place in xs */
#pragma unroll
                        for (int k = 0; k < RW; k++) {
                                if (!active[k])
                                        continue;
#pragma unroll
                                for (int n = 0; n < NR; n++) {
                                        float wv[CU_CHUNK];
                                        /* no codebook table: IQ4_NL's chunks decode by
                                         * byte permutes, the other types use none */
                                        if constexpr (Q6S)
                                                q6k_decode(q6s[warp], sl, wv);
                                        else
                                                raw[k][n][b].dequant(wv, cu_iq4nl_values);
#pragma unroll
                                        for (int t = 0; t < TP; t++) {
                                                if ((uint32_t) t >= n_p)
                                                        break;
                                                /* x four values a load (MVS_XS: the quarter
                                                 * warp's 16-byte reads hit distinct banks) */
                                                const float4 *xv = (const float4 *) &xs[t][xc * MVS_XS];
                                                float s = 0.0f;
#pragma unroll
                                                for (int i = 0; i < CU_CHUNK / 4; i++) {
                                                        float4 xq = xv[i];
                                                        s += wv[4 * i] * xq.x;
                                                        s += wv[4 * i + 1] * xq.y;
                                                        s += wv[4 * i + 2] * xq.z;
                                                        s += wv[4 * i + 3] * xq.w;
                                                }
                                                acc[k][n][t] += s;
                                        }
                                }
                        }
                }
        }
#pragma unroll
        for (int k = 0; k < RW; k++)
#pragma unroll
                for (int t = 0; t < TP; t++) {
                        float v[NR];
#pragma unroll
                        for (int n = 0; n < NR; n++) {
                                float s = acc[k][n][t];
                                if (L < 32)
                                        s += 0.0f; /* k_matvec's butterfly over idle lanes (see above) */
#pragma unroll
                                for (int o = L / 2; o > 0; o >>= 1)
                                        s += __shfl_xor_sync(CU_FULL_MASK, s, o);
                                v[n] = s;
                        }
                        float y = v[0];
                        if (NR == 2)
                                y = y / (1.0f + expf(-y)) * v[NR - 1]; /* docs/model.md §5: silu(gate)·up */
                        uint32_t r = rb + k * RPW;
                        if (active[k] && sl == 0 && (uint32_t) t < n_p)
                                a.y[(uint64_t) pid[t] * a.y_pstride + (uint64_t) g * a.y_gstride +
                                    (NR == 1 ? r % a.G : r)] = y;
                }
}

/* k_mm: the same products for many input vectors (prefill chunks, large decode batches), shaped
 * for arithmetic throughput. k_matvec gives each (row, input) one fma per shared-memory load; here
 * a thread keeps MM_R stored rows × MM_T inputs in registers (an outer product per value), so a
 * weight value, once dequantized, serves MM_T inputs and a staged input value MM_R rows.
 *
 * The arithmetic is k_matvec's, so the three kernels give the same bits whichever the batch shape
 * picks: lane l of a warp owns chunks l, l+32, ... of each of its rows, in order; per chunk
 * s = Σ_i w[i]·x[i] as one chain from 0 (i ascending), acc += s; the warp's 32 lane sums are
 * folded by the butterfly. What differs is only which warp holds which (row, input) pairs: a warp
 * owns MM_R rows (MM_R / NR outputs) of MM_T inputs, and each of its lanes computes all MM_R·MM_T
 * partial sums of its chunk.
 *
 * Inputs are staged as in k_matvec, one tile of 32 chunks (1024 values) at a time, each chunk
 * padded to MM_XS floats so a lane's 16-byte loads of its chunk hit distinct banks within each
 * quarter-warp phase. Block: MM_WARPS warps over the same MM_T inputs; grid x walks input tiles
 * (fastest, so the blocks in flight share weight rows through L2), grid y row blocks. */
#define MM_WARPS 8
/* R: stored rows a thread holds (NR = 2: R/2 (gate, up) pairs); MINB: blocks an SM must fit
 * (registers capped accordingly) */
#define MM_T 8 /* inputs a block serves; = CU_GROUP_TILE, so one expert tile a block */
#define MM_XS 36
static_assert(MM_T == CU_GROUP_TILE, "one grouped expert tile per k_mm block");
static_assert(MM_WARPS * 32 * 4 == MV_TILE_CHUNKS * CU_CHUNK, "one float4 per thread per input");

/* Q6_K in k_mm (the default; X4_CUDA_MM_Q6K=0 keeps k_matvec's 8-input tiles): a chunk's
 * 32 six-bit quants (the ql nibble | the qh pair << 4, as cu_dequant32 assembles them) a byte each
 * in eight words, the same per-byte shifts and masks four at a time, and its two scales d·sc as
 * cu_dequant32 forms them; mm_value then gives cu_dequant32's (d·sc)·(q − 32). 10 registers a row
 * instead of the generic chunk's pointer, so a weight value, once decoded, serves MM_T inputs. */
struct mm_q6k_chunk {
        uint32_t v[8];
        float ds0, ds1;
        __device__ __forceinline__ void load(const uint8_t *row, uint32_t c) {
                const uint8_t *b = row + 210 * (uint64_t) (c / 8); /* 2-byte aligned: 16-bit loads */
                struct q6k_meta m(b, c % 8);
                const uint16_t *ql = (const uint16_t *) (b + m.ql), *qh = (const uint16_t *) (b + m.qh);
                uint32_t shift_lo = m.shift_lo, shift_hi = m.shift_hi;
                ds0 = m.ds0;
                ds1 = m.ds1;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                        uint32_t lo = (uint32_t) ql[2 * k] | (uint32_t) ql[2 * k + 1] << 16;
                        uint32_t hi = (uint32_t) qh[2 * k] | (uint32_t) qh[2 * k + 1] << 16;
                        v[k] = ((lo >> shift_lo) & 0x0F0F0F0Fu) | (((hi >> shift_hi) & 0x03030303u) << 4);
                }
        }
};

/* the chunk k_mm holds in registers: raw_chunk, Q6_K's own */
template <int TYPE>
struct mm_raw {
        using type = raw_chunk<TYPE>;
};
template <>
struct mm_raw<CU_TYPE_Q6_K> {
        using type = mm_q6k_chunk;
};

/* value i (compile-time after unrolling) of a chunk held in registers, exactly as cu_dequant32 */
template <int TYPE>
static __device__ __forceinline__ float mm_value(const typename mm_raw<TYPE>::type &r, int i, float d,
                                                 const float *iq4);
template <>
__device__ __forceinline__ float mm_value<CU_TYPE_IQ4_NL>(const raw_chunk<CU_TYPE_IQ4_NL> &r,
                                                          int i, float d, const float *iq4) {
        int b = i & 15; /* quant byte: values b and b + 16 share it */
        uint32_t q = (r.unit(1 + b / 2) >> (8 * (b & 1))) & 0xffu;
        return d * iq4[i < 16 ? (q & 0xF) : (q >> 4)];
}
template <>
__device__ __forceinline__ float mm_value<CU_TYPE_BF16>(const raw_chunk<CU_TYPE_BF16> &r, int i,
                                                        float, const float *) {
        const uint4 &v = r.v[i / 8];
        uint32_t wv = (i % 8) / 2 == 0 ? v.x : (i % 8) / 2 == 1 ? v.y : (i % 8) / 2 == 2 ? v.z : v.w;
        return __uint_as_float((i & 1) ? (wv & 0xffff0000u) : (wv << 16));
}
template <>
__device__ __forceinline__ float mm_value<CU_TYPE_Q6_K>(const mm_q6k_chunk &r, int i, float, const float *) {
        int v = (int) ((r.v[i / 4] >> (8 * (i % 4))) & 0xffu) - 32;
        return (i < 16 ? r.ds0 : r.ds1) * (float) v;
}

template <int TYPE, int NR, bool GROUPED, int MM_R, int MINB>
__global__ void __launch_bounds__(MM_WARPS * 32, MINB) k_mm(struct cu_mv a) {
        cu_pdl_wait();
        cu_pdl_trigger();
        __shared__ float iq4[16];
        __shared__ __align__(16) float xs[MM_T][MV_TILE_CHUNKS * MM_XS];
        constexpr int RO = MM_R / NR; /* outputs a warp owns */
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t o0 = (blockIdx.y * MM_WARPS + warp) * RO; /* the warp's first output */
        uint32_t p0 = blockIdx.x * MM_T, n_p = min((uint32_t) MM_T, a.P - min(p0, a.P));
        const int32_t *perm = NULL;
        int32_t expert = 0;
        if (GROUPED && !cu_group_tile(a, blockIdx.x, &expert, &perm, &n_p))
                return; /* the whole block: beyond this batch's tiles */
        if (TYPE == CU_TYPE_IQ4_NL && threadIdx.x < 16)
                iq4[threadIdx.x] = cu_iq4nl_values[threadIdx.x]; /* read after the first barrier */
        uint32_t n_out = a.N / NR;
        const uint8_t *w[MM_R];
#pragma unroll
        for (int j = 0; j < RO; j++)
#pragma unroll
                for (int k = 0; k < NR; k++) {
                        uint32_t o = o0 + j < n_out ? o0 + j : 0;
                        w[j * NR + k] = (const uint8_t *) a.w + ((uint64_t) o * NR + k) * a.row_bytes +
                                        (GROUPED ? (uint64_t) expert * a.expert_bytes : 0);
                }
        /* the block's outputs share one input group (the host checks G) */
        uint32_t g = NR == 1 ? (blockIdx.y * MM_WARPS * RO) / a.G : 0;
        const float *x[MM_T];
        uint32_t pid[MM_T];
#pragma unroll
        for (int t = 0; t < MM_T; t++) {
                uint32_t p = GROUPED ? (uint32_t) perm[(uint32_t) t < n_p ? t : 0]
                                     : ((uint32_t) t < n_p ? p0 + t : p0);
                pid[t] = p;
                x[t] = a.x + (uint64_t) (p / a.x_div) * a.x_pstride + (uint64_t) g * a.x_gstride;
        }
        float acc[MM_R][MM_T];
#pragma unroll
        for (int r = 0; r < MM_R; r++)
#pragma unroll
                for (int t = 0; t < MM_T; t++)
                        acc[r][t] = 0.0f;

        uint32_t n_chunks = a.K / CU_CHUNK, e4 = 4 * threadIdx.x;
        uint32_t xo = (e4 / CU_CHUNK) * MM_XS + e4 % CU_CHUNK;
        for (uint32_t c0 = 0; c0 < n_chunks; c0 += MV_TILE_CHUNKS) {
                uint32_t c = c0 + lane;
                bool has = c < n_chunks;
                typename mm_raw<TYPE>::type raw[MM_R];
                if (has)
#pragma unroll
                        for (int r = 0; r < MM_R; r++)
                                raw[r].load(w[r], c); /* in flight while the inputs are staged */
                uint32_t n_vals = min(n_chunks - c0, (uint32_t) MV_TILE_CHUNKS) * CU_CHUNK;
                __syncthreads(); /* the previous tile has been read */
#pragma unroll
                for (int t = 0; t < MM_T; t++) {
                        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        if ((uint32_t) t < n_p && e4 < n_vals)
                                v = *(const float4 *) (x[t] + (uint64_t) c0 * CU_CHUNK + e4);
                        *(float4 *) &xs[t][xo] = v;
                }
                __syncthreads();
                if (!has)
                        continue;
                float d[MM_R];
#pragma unroll
                for (int r = 0; r < MM_R; r++) {
                        if constexpr (TYPE == CU_TYPE_IQ4_NL)
                                d[r] = __half2float(__ushort_as_half((uint16_t) raw[r].unit(0)));
                        else
                                d[r] = 0.0f;
                }
                float s[MM_R][MM_T];
#pragma unroll
                for (int r = 0; r < MM_R; r++)
#pragma unroll
                        for (int t = 0; t < MM_T; t++)
                                s[r][t] = 0.0f;
#pragma unroll
                for (int i4 = 0; i4 < CU_CHUNK; i4 += 4) {
                        float4 xv[MM_T];
#pragma unroll
                        for (int t = 0; t < MM_T; t++)
                                xv[t] = *(const float4 *) &xs[t][lane * MM_XS + i4];
#pragma unroll
                        for (int ii = 0; ii < 4; ii++) {
                                float wv[MM_R];
#pragma unroll
                                for (int r = 0; r < MM_R; r++)
                                        wv[r] = mm_value<TYPE>(raw[r], i4 + ii, d[r], iq4);
#pragma unroll
                                for (int t = 0; t < MM_T; t++) {
                                        float xi = ii == 0 ? xv[t].x : ii == 1 ? xv[t].y : ii == 2 ? xv[t].z : xv[t].w;
#pragma unroll
                                        for (int r = 0; r < MM_R; r++)
                                                s[r][t] += wv[r] * xi;
                                }
                        }
                }
#pragma unroll
                for (int r = 0; r < MM_R; r++)
#pragma unroll
                        for (int t = 0; t < MM_T; t++)
                                acc[r][t] += s[r][t];
        }
        /* the butterfly of every (row, input), then lane (j·MM_T + t) % 32 writes output j of t */
#pragma unroll
        for (int j = 0; j < RO; j++)
#pragma unroll
                for (int t = 0; t < MM_T; t++) {
                        float v[NR];
#pragma unroll
                        for (int k = 0; k < NR; k++)
                                v[k] = cu_warp_sum(acc[j * NR + k][t]);
                        float y = v[0];
                        if (NR == 2)
                                y = y / (1.0f + expf(-y)) * v[NR - 1]; /* docs/model.md §5: silu(gate)·up */
                        uint32_t o = o0 + j;
                        if (lane == (uint32_t) (j * MM_T + t) % 32 && o < n_out && (uint32_t) t < n_p)
                                a.y[(uint64_t) pid[t] * a.y_pstride + (uint64_t) g * a.y_gstride +
                                    (NR == 1 ? o % a.G : o)] = y;
                }
}

/* Inputs per launch from which k_mm takes over (BF16 and IQ4_NL rows of at least MM_MIN_CHUNKS
 * chunks: shorter rows leave most lanes idle). Same bits either way. X4_CUDA_MM=0 turns it off
 * (measurements). */
#define MM_P_MIN 17
#define MM_MIN_CHUNKS 8

template <int TYPE, int NR, int R, int MINB>
static void launch_mm_cfg(const struct cu_mv *a, cudaStream_t s) {
        uint32_t rows_per_block = MM_WARPS * (R / NR);
        uint32_t gy = (a->N / NR + rows_per_block - 1) / rows_per_block;
        cu_launches++;
        if (a->groups)
                cu_launch(k_mm<TYPE, NR, true, R, MINB>, dim3(a->n_groups_max, gy), MM_WARPS * 32, 0, s, *a);
        else
                cu_launch(k_mm<TYPE, NR, false, R, MINB>, dim3((a->P + MM_T - 1) / MM_T, gy), MM_WARPS * 32, 0, s, *a);
}

/* X4_CUDA_MM: 0 off; 1 rows 4, one block an SM; 2 rows 4, two blocks; 3 rows 2, two blocks
 * (measurements: the bits are the same for every choice). Default by type, from prefill 512 on
 * the full model (H200): IQ4_NL experts 246 / 159 / 195 ms, BF16 projections 186 / 181 / 171 ms
 * for 1 / 2 / 3, so IQ4_NL takes 2 and BF16 3 (BF16 with 4 rows and two blocks spills). */
template <int TYPE, int NR>
static bool launch_mm(const struct cu_mv *a, cudaStream_t s) {
        static int cfg = -1;
        if (cfg < 0) {
                const char *e = getenv("X4_CUDA_MM");
                cfg = e && *e >= '0' && *e <= '3' ? *e - '0' : 9;
        }
        int c = cfg != 9 ? cfg : TYPE == CU_TYPE_IQ4_NL ? 2 : 3; /* Q6_K: 3 (its rows are 10 registers) */
        uint32_t R = c == 3 ? 2 : 4, rows_per_block = MM_WARPS * (R / NR);
        if (c == 0 || a->K / CU_CHUNK < MM_MIN_CHUNKS || (NR == 1 && a->G % rows_per_block != 0))
                return false;
        if (a->sel && !a->groups)
                return false; /* one expert per pair: k_matvec's one pair a block */
        if (!a->groups && a->P < MM_P_MIN)
                return false;
        if (c == 1)
                launch_mm_cfg<TYPE, NR, 4, 1>(a, s);
        else if (c == 2)
                launch_mm_cfg<TYPE, NR, 4, 2>(a, s);
        else
                launch_mm_cfg<TYPE, NR, 2, 2>(a, s);
        return true;
}

/* Rows a warp computes for a one-input block (RW, see k_mv_small): from the row's input tiles, so
 * a lane keeps about MVS_BATCH chunks in flight; X4_CUDA_RW=1|2|4 forces it (measurements; the
 * bits are the same either way). */
static uint32_t mvs_rows_per_warp(uint32_t n_chunks) {
        static int force = -1;
        if (force < 0) {
                const char *e = getenv("X4_CUDA_RW");
                force = e && (*e == '1' || *e == '2' || *e == '4') ? *e - '0' : 0;
        }
        if (force)
                return (uint32_t) force;
        uint32_t tiles = (n_chunks + MV_TILE_CHUNKS - 1) / MV_TILE_CHUNKS;
        return tiles >= MVS_BATCH ? 1 : tiles >= 2 ? 2 : 4;
}

/* X4_CUDA_FULLX=1 (opt-in, not yet measured on a GPU): one-input blocks stage the whole input
 * (K ≤ 4,096) at once instead of tile by tile (same bits). */
static bool mvs_full_x(uint32_t K) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_FULLX");
                on = e && *e == '1';
        }
        return on && K <= MVS_FX_CHUNKS * CU_CHUNK;
}

/* The IQ4_NL one-input products (the experts) compiled for 4 resident blocks an SM (at most 64
 * registers a thread; spills 68-100 bytes): the same arithmetic, so the same bits. Measured on the
 * full model (H200, 51673ad, one call): batch 1 185.9 -> 192.7 tok/s at 512, 148.6 -> 152.6 at
 * 4,096; batch 16 472.1 -> 517.8 and 314.1 -> 331.4. The default since then; X4_CUDA_MINB=1 keeps
 * the build without the bound (measurements). */
static int mvs_min_blocks() {
        static int n = -1;
        if (n < 0) {
                const char *e = getenv("X4_CUDA_MINB");
                n = e && *e == '1' ? 1 : 4;
        }
        return n;
}

template <int TYPE, int NR, int L, int RW>
static void launch_small_rw(const struct cu_mv *a, cudaStream_t s) {
        uint32_t n_out = a->N / NR, rows_per_block = MVS_WARPS * (32 / L) * RW;
        dim3 grid((n_out + rows_per_block - 1) / rows_per_block, a->P);
        cu_launches++;
        if constexpr (TYPE == CU_TYPE_IQ4_NL && L == 32) {
                if (mvs_min_blocks() == 4 && !mvs_full_x(a->K)) {
                        cu_launch(k_mv_small<TYPE, 1, NR, L, false, RW, false, 4>, grid, dim3(MVS_WARPS * 32), 0, s, *a);
                        return;
                }
        }
        if (mvs_full_x(a->K))
                cu_launch(k_mv_small<TYPE, 1, NR, L, false, RW, true>, grid, dim3(MVS_WARPS * 32), 0, s, *a);
        else
                cu_launch(k_mv_small<TYPE, 1, NR, L, false, RW>, grid, dim3(MVS_WARPS * 32), 0, s, *a);
}

template <int TYPE, int NR, int L>
static void launch_small_l(const struct cu_mv *a, cudaStream_t s) {
        dim3 block(MVS_WARPS * 32);
        uint32_t n_out = a->N / NR, rows_per_block = MVS_WARPS * (32 / L);
        uint32_t gx = (n_out + rows_per_block - 1) / rows_per_block;
        if (!a->groups && (a->sel || a->P == 1)) {
                /* one input a block: RW rows a warp, as long as a block's rows stay in one
                 * input group */
                uint32_t rw = mvs_rows_per_warp(a->K / CU_CHUNK);
                while (rw > 1 && NR == 1 && a->G != a->N && a->G % (rows_per_block * rw) != 0)
                        rw /= 2;
                if (rw == 4) {
                        launch_small_rw<TYPE, NR, L, 4>(a, s);
                        return;
                }
                if (rw == 2) {
                        launch_small_rw<TYPE, NR, L, 2>(a, s);
                        return;
                }
                launch_small_rw<TYPE, NR, L, 1>(a, s);
                return;
        }
        cu_launches++;
        if (a->sel && a->groups)
                cu_launch(k_mv_small<TYPE, CU_GROUP_TILE, NR, L, true, 1>, dim3(gx, a->n_groups_max), block, 0, s, *a);
        else if (a->sel || a->P == 1)
                cu_launch(k_mv_small<TYPE, 1, NR, L, false, 1>, dim3(gx, a->P), block, 0, s, *a);
        else if (a->P <= 2)
                cu_launch(k_mv_small<TYPE, 2, NR, L, false, 1>, dim3(gx, 1), block, 0, s, *a);
        else if (a->P <= 4)
                cu_launch(k_mv_small<TYPE, 4, NR, L, false, 1>, dim3(gx, 1), block, 0, s, *a);
        else
                cu_launch(k_mv_small<TYPE, MVS_TP_MAX, NR, L, false, 1>, dim3(gx, (a->P + MVS_TP_MAX - 1) / MVS_TP_MAX), block, 0, s, *a);
}

/* Packed rows (L < 32) only for BF16 single rows: the per-head absorb matrices (attn_k_b rows of
 * 128 values, 4 chunks). */
template <int TYPE, int NR>
static void launch_small(const struct cu_mv *a, cudaStream_t s) {
        if constexpr (TYPE == CU_TYPE_BF16 && NR == 1) {
                uint32_t chunks = a->K / CU_CHUNK;
                /* a block's rows must share one input group (G rows each) */
                if (chunks <= 4 && a->G % (MVS_WARPS * 8) == 0) {
                        launch_small_l<TYPE, NR, 4>(a, s);
                        return;
                }
                if (chunks <= 8 && a->G % (MVS_WARPS * 4) == 0) {
                        launch_small_l<TYPE, NR, 8>(a, s);
                        return;
                }
        }
        launch_small_l<TYPE, NR, 32>(a, s);
}

template <int TYPE, int TP>
__global__ void __launch_bounds__(CU_FEW_WARPS * 32) k_matvec_few(struct cu_mv a) {
        cu_pdl_wait();
        cu_pdl_trigger();
        __shared__ float part[CU_FEW_WARPS][TP];
        uint32_t r = blockIdx.x, p0 = blockIdx.y * TP;
        const uint8_t *w = (const uint8_t *) a.w + (uint64_t) r * a.row_bytes;
        uint32_t g = r / a.G;
        const float *x[TP];
#pragma unroll
        for (int t = 0; t < TP; t++) {
                uint32_t p = p0 + t < a.P ? p0 + t : p0;
                x[t] = a.x + (uint64_t) (p / a.x_div) * a.x_pstride + (uint64_t) g * a.x_gstride;
        }
        float v = cu_few_row<TYPE, TP>(w, x, a.K, part);
        if (threadIdx.x < TP && p0 + threadIdx.x < a.P)
                a.y[(uint64_t) (p0 + threadIdx.x) * a.y_pstride + (uint64_t) g * a.y_gstride + r % a.G] = v;
}

template <int TYPE>
static void launch_few(const struct cu_mv *a, cudaStream_t s) {
        cu_launches++;
        if (a->P == 1)
                cu_launch(k_matvec_few<TYPE, 1>, dim3(a->N, 1), CU_FEW_WARPS * 32, 0, s, *a);
        else
                cu_launch(k_matvec_few<TYPE, MV_TP>, dim3(a->N, (a->P + MV_TP - 1) / MV_TP), CU_FEW_WARPS * 32, 0, s, *a);
}

/* Q6_K products of many inputs (the head of a prompt's logits rows or of a batch of more than 16
 * sequences) on k_mm instead of k_matvec's 8-input tiles: the same order, so the same bits
 * (tests/gpu/run.sh compares them on 700 prompt rows and across batches). The default since the
 * 2026-12-04 fourth session's call 1: batch 64 at 512 1,989 -> 2,310 tok/s, at 4,096 1,395 ->
 * 1,525 (the head was 10.4 of 46.6 ms a step there). X4_CUDA_MM_Q6K=0 keeps k_matvec. */
static bool mm_q6k_on(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_MM_Q6K");
                on = !(e && !strcmp(e, "0"));
                if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MM_Q6K=%s: expected 0 or 1; taken as 1 (the default)\n", e);
        }
        return on;
}

/* Inputs per launch up to which the decode-shaped kernel runs (same bits either way). */
#define MVS_P_MAX 16

template <int TYPE, int NR>
static void launch_rows(const struct cu_mv *a, cudaStream_t s) {
        dim3 block(MV_WARPS * 32);
        if constexpr (TYPE == CU_TYPE_BF16 || TYPE == CU_TYPE_IQ4_NL || TYPE == CU_TYPE_Q6_K) {
                /* its inputs are read as float4: 16-byte aligned rows */
                bool aligned = a->x_pstride % 4 == 0 && a->x_gstride % 4 == 0 &&
                               (uintptr_t) a->x % 16 == 0;
                if (aligned && a->P <= (a->sel ? MVS_P_MAX * CU_SLOTS_MAX : MVS_P_MAX)) {
                        launch_small<TYPE, NR>(a, s);
                        return;
                }
                if constexpr (TYPE == CU_TYPE_BF16 || TYPE == CU_TYPE_IQ4_NL)
                        if (aligned && launch_mm<TYPE, NR>(a, s))
                                return;
                if constexpr (TYPE == CU_TYPE_Q6_K)
                        if (aligned && mm_q6k_on() && launch_mm<TYPE, NR>(a, s))
                                return;
        }
        uint32_t n_out = a->N / NR;
        cu_launches++;
        if (a->sel && a->groups) {
                dim3 grid((n_out + MV_WARPS - 1) / MV_WARPS, a->n_groups_max);
                cu_launch(k_matvec<TYPE, CU_GROUP_TILE, NR, true>, grid, block, 0, s, *a);
        } else if (a->sel || a->P == 1) {
                dim3 grid((n_out + MV_WARPS - 1) / MV_WARPS, a->P);
                cu_launch(k_matvec<TYPE, 1, NR, false>, grid, block, 0, s, *a);
        } else {
                dim3 grid((n_out + MV_WARPS - 1) / MV_WARPS, (a->P + MV_TP - 1) / MV_TP);
                cu_launch(k_matvec<TYPE, MV_TP, NR, false>, grid, block, 0, s, *a);
        }
}

template <int TYPE>
static void launch_type(const struct cu_mv *a, cudaStream_t s) {
        if (a->swiglu)
                launch_rows<TYPE, 2>(a, s);
        else
                launch_rows<TYPE, 1>(a, s);
}

extern "C" bool cu_type_supported(uint32_t type) {
        switch (type) {
        case CU_TYPE_F32:
        case CU_TYPE_F16:
        case CU_TYPE_BF16:
        case CU_TYPE_Q8_0:
        case CU_TYPE_IQ4_NL:
        case CU_TYPE_Q6_K:
                return true;
        default:
                return false;
        }
}

static void matvec_any(const struct cu_mv *a, cudaStream_t s);

extern "C" void cu_matvec(const struct cu_mv *a, cudaStream_t s) {
        if (a->P == 0 || a->N == 0)
                return;
        cu_rope_side_done = false;
        matvec_any(a, s);
        /* a rope side job no launcher took (X4_CUDA_ROPE_SIDE): its own kernel, after the product */
        if (a->rope.q && !cu_rope_side_done)
                cu_q_rope_side(&a->rope, s);
}

static void matvec_any(const struct cu_mv *a, cudaStream_t s) {
        if (cu_matvec_tc(a, s))
                return;
        if (a->few_rows && !a->sel && !a->swiglu) {
                switch (a->type) {
                case CU_TYPE_F32: launch_few<CU_TYPE_F32>(a, s); return;
                case CU_TYPE_F16: launch_few<CU_TYPE_F16>(a, s); return;
                case CU_TYPE_BF16: launch_few<CU_TYPE_BF16>(a, s); return;
                }
        }
        switch (a->type) {
        case CU_TYPE_F32: launch_type<CU_TYPE_F32>(a, s); break;
        case CU_TYPE_F16: launch_type<CU_TYPE_F16>(a, s); break;
        case CU_TYPE_BF16: launch_type<CU_TYPE_BF16>(a, s); break;
        case CU_TYPE_Q8_0: launch_type<CU_TYPE_Q8_0>(a, s); break;
        case CU_TYPE_IQ4_NL: launch_type<CU_TYPE_IQ4_NL>(a, s); break;
        case CU_TYPE_Q6_K: launch_type<CU_TYPE_Q6_K>(a, s); break;
        }
}
