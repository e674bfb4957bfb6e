/* SPDX-License-Identifier: MIT */
/* Stored-row × fp32-vector products for every projection of the model (docs/model.md §3-§5): BF16
 * attention and HC weights, IQ4_NL dense/expert FFNs (MoE pairs grouped through `sel`), the Q6_K
 * head. One warp owns one output row; lane l dequantizes the 32-value chunks l, l+32, ... of the
 * row once and dots them with up to MV_TP input vectors. The per-lane order and the butterfly over
 * the warp are fixed, so an output depends only on its row and its input: not on how many vectors
 * share the launch (batch invariance) nor on the tile a vector lands in.
 *
 * Performance note (later issue): decode reads 18-byte IQ4_NL blocks per lane, not coalesced;
 * prefill re-reads weights per MV_TP vectors. A tensor-core path must keep the per-row reduction
 * order independent of the batch to stay bit-identical. */
#include "common.cuh"

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
        if (GROUPED) {
                uint32_t tiles_max = a.n_groups_max;
                if (blockIdx.y >= (uint32_t) a.groups[0])
                        return; /* the whole block: beyond this batch's tiles */
                const int32_t *td = a.groups + 1 + 3 * blockIdx.y;
                expert = td[0];
                perm = a.groups + 1 + 3 * tiles_max + td[1];
                n_p = (uint32_t) td[2];
        }
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
        __device__ __forceinline__ void dequant(float *out, const float *iq4) const {
                float d = __half2float(__ushort_as_half((uint16_t) unit(0)));
#pragma unroll
                for (int j = 0; j < 8; j++) {
                        uint32_t q = unit(1 + j);
                        uint32_t q0 = q & 0xff, q1 = q >> 8;
                        out[2 * j] = d * iq4[q0 & 0xF];
                        out[2 * j + 16] = d * iq4[q0 >> 4];
                        out[2 * j + 1] = d * iq4[q1 & 0xF];
                        out[2 * j + 17] = d * iq4[q1 >> 4];
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

template <int TYPE, int TP, int NR, int L, bool GROUPED>
__global__ void __launch_bounds__(MVS_WARPS * 32) k_mv_small(struct cu_mv a) {
        __shared__ float iq4[16];
        __shared__ float xs[TP][MV_TILE_CHUNKS * MV_TILE_STRIDE];
        constexpr int RPW = 32 / L; /* rows per warp */
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, sl = lane % L;
        uint32_t r = (blockIdx.x * MVS_WARPS + warp) * RPW + lane / L; /* output index */
        uint32_t p0 = blockIdx.y * TP, n_p = min((uint32_t) TP, a.P - min(p0, a.P));
        const int32_t *perm = NULL;
        int32_t expert = 0;
        if (a.sel)
                cu_pdl_wait(); /* the expert ids come from the router kernel */
        if (GROUPED) {
                if (blockIdx.y >= (uint32_t) a.groups[0])
                        return; /* the whole block */
                const int32_t *td = a.groups + 1 + 3 * blockIdx.y;
                expert = td[0];
                perm = a.groups + 1 + 3 * a.n_groups_max + td[1];
                n_p = (uint32_t) td[2];
        }
        if (TYPE == CU_TYPE_IQ4_NL && threadIdx.x < 16)
                iq4[threadIdx.x] = cu_iq4nl_values[threadIdx.x]; /* read after the first barrier */
        bool active = r < a.N / NR;
        const uint8_t *w = (const uint8_t *) a.w + (uint64_t) (active ? r : 0) * NR * a.row_bytes;
        if (GROUPED)
                w += (uint64_t) expert * a.expert_bytes;
        else if (a.sel)
                w += (uint64_t) a.sel[p0] * a.expert_bytes; /* TP == 1 with sel */
        /* the block's rows share one input group (the host checks G) */
        uint32_t g = NR == 1 ? (blockIdx.x * MVS_WARPS * RPW) / a.G : 0;
        const float *x[TP];
        uint32_t pid[TP];
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
        /* lane sl's chunk of tile i is 32·i + sl (L < 32: one tile, chunks < L). Thread j
         * stages values 4j..4j+3 of each input's tile with one 16-byte load; the next tile's
         * loads are issued before the current tile is computed (a strided loop of loads here
         * was a chain of dependent L2 round trips per tile). */
        static_assert(MVS_WARPS * 32 * 4 == MV_TILE_CHUNKS * CU_CHUNK, "one float4 per thread");
        uint32_t n_chunks = a.K / CU_CHUNK;
        uint32_t n_tiles = (n_chunks + MV_TILE_CHUNKS - 1) / MV_TILE_CHUNKS;
        uint32_t e4 = 4 * threadIdx.x;
        float4 xr[TP];
        for (uint32_t t0 = 0; t0 < n_tiles; t0 += MVS_BATCH) {
                raw_chunk<TYPE> raw[NR][MVS_BATCH];
#pragma unroll
                for (int b = 0; b < MVS_BATCH; b++) {
                        uint32_t c = (t0 + b) * MV_TILE_CHUNKS + sl;
                        if (active && c < n_chunks)
#pragma unroll
                                for (int k = 0; k < NR; k++)
                                        raw[k][b].load(w + k * a.row_bytes, c);
                }
                if (t0 == 0) {
                        /* the first weights are in flight: now the inputs (written by the
                         * previous kernel) */
                        cu_pdl_wait();
                        cu_pdl_trigger();
#pragma unroll
                        for (int t = 0; t < TP; t++)
                                if ((uint32_t) t < n_p && e4 < a.K)
                                        xr[t] = *(const float4 *) (x[t] + e4);
                }
#pragma unroll
                for (int b = 0; b < MVS_BATCH; b++) {
                        uint32_t tile = t0 + b;
                        if (tile >= n_tiles)
                                break;
                        uint32_t n_vals =
                                min(n_chunks - tile * MV_TILE_CHUNKS, (uint32_t) MV_TILE_CHUNKS) *
                                CU_CHUNK;
                        __syncthreads(); /* the previous tile has been read */
                        if (e4 < n_vals) {
                                uint32_t o = (e4 / CU_CHUNK) * MV_TILE_STRIDE + e4 % CU_CHUNK;
#pragma unroll
                                for (int t = 0; t < TP; t++)
                                        if ((uint32_t) t < n_p) {
                                                xs[t][o] = xr[t].x;
                                                xs[t][o + 1] = xr[t].y;
                                                xs[t][o + 2] = xr[t].z;
                                                xs[t][o + 3] = xr[t].w;
                                        }
                        }
                        __syncthreads();
                        uint64_t nx = (uint64_t) (tile + 1) * MV_TILE_CHUNKS * CU_CHUNK + e4;
#pragma unroll
                        for (int t = 0; t < TP; t++)
                                if ((uint32_t) t < n_p && nx < a.K)
                                        xr[t] = *(const float4 *) (x[t] + nx);
                        uint32_t c = tile * MV_TILE_CHUNKS + sl;
                        if (!active || c >= n_chunks)
                                continue;
#pragma unroll
                        for (int k = 0; k < NR; k++) {
                                float wv[CU_CHUNK];
                                raw[k][b].dequant(wv, iq4);
#pragma unroll
                                for (int t = 0; t < TP; t++) {
                                        if ((uint32_t) t >= n_p)
                                                break;
                                        const float *xv = &xs[t][sl * MV_TILE_STRIDE];
                                        float s = 0.0f;
#pragma unroll
                                        for (int i = 0; i < CU_CHUNK; i++)
                                                s += wv[i] * xv[i];
                                        acc[k][t] += s;
                                }
                        }
                }
        }
#pragma unroll
        for (int t = 0; t < TP; t++) {
                float v[NR];
#pragma unroll
                for (int k = 0; k < NR; k++) {
                        float s = acc[k][t];
                        if (L < 32)
                                s += 0.0f; /* k_matvec's butterfly over idle lanes (see above) */
#pragma unroll
                        for (int o = L / 2; o > 0; o >>= 1)
                                s += __shfl_xor_sync(CU_FULL_MASK, s, o);
                        v[k] = s;
                }
                float y = v[0];
                if (NR == 2)
                        y = y / (1.0f + expf(-y)) * v[NR - 1]; /* docs/model.md §5: silu(gate)·up */
                if (active && sl == 0 && (uint32_t) t < n_p)
                        a.y[(uint64_t) pid[t] * a.y_pstride + (uint64_t) g * a.y_gstride +
                            (NR == 1 ? r % a.G : r)] = y;
        }
}

template <int TYPE, int NR, int L>
static void launch_small_l(const struct cu_mv *a, cudaStream_t s) {
        dim3 block(MVS_WARPS * 32);
        uint32_t n_out = a->N / NR, rows_per_block = MVS_WARPS * (32 / L);
        uint32_t gx = (n_out + rows_per_block - 1) / rows_per_block;
        cu_launches++;
        if (a->sel && a->groups)
                cu_launch(k_mv_small<TYPE, CU_GROUP_TILE, NR, L, true>, dim3(gx, a->n_groups_max), block, 0, s, *a);
        else if (a->sel || a->P == 1)
                cu_launch(k_mv_small<TYPE, 1, NR, L, false>, dim3(gx, a->P), block, 0, s, *a);
        else if (a->P <= 2)
                cu_launch(k_mv_small<TYPE, 2, NR, L, false>, dim3(gx, 1), block, 0, s, *a);
        else if (a->P <= 4)
                cu_launch(k_mv_small<TYPE, 4, NR, L, false>, dim3(gx, 1), block, 0, s, *a);
        else
                cu_launch(k_mv_small<TYPE, MVS_TP_MAX, NR, L, false>, dim3(gx, (a->P + MVS_TP_MAX - 1) / MVS_TP_MAX), block, 0, s, *a);
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

/* One value of a row (few_rows path: consecutive threads read consecutive values). */
template <int TYPE>
static __device__ __forceinline__ float cu_value(const uint8_t *row, uint32_t k) {
        if (TYPE == CU_TYPE_F32)
                return ((const float *) row)[k];
        if (TYPE == CU_TYPE_F16)
                return __half2float(((const __half *) row)[k]);
        return cu_bf16(((const uint16_t *) row)[k]);
}

/* 32 warps per row: latency-bound otherwise (8 warps: 24 µs for the 24 × 14336 HC projection) */
#define MV_FEW_WARPS 32

template <int TYPE, int TP>
__global__ void __launch_bounds__(MV_FEW_WARPS * 32) k_matvec_few(struct cu_mv a) {
        cu_pdl_wait();
        cu_pdl_trigger();
        __shared__ float part[MV_FEW_WARPS][TP];
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t r = blockIdx.x, p0 = blockIdx.y * TP;
        const uint8_t *w = (const uint8_t *) a.w + (uint64_t) r * a.row_bytes;
        uint32_t g = r / a.G;
        const float *x[TP];
        float acc[TP];
#pragma unroll
        for (int t = 0; t < TP; t++) {
                uint32_t p = p0 + t < a.P ? p0 + t : p0;
                x[t] = a.x + (uint64_t) (p / a.x_div) * a.x_pstride + (uint64_t) g * a.x_gstride;
                acc[t] = 0.0f;
        }
#pragma unroll 4
        for (uint32_t k = threadIdx.x; k < a.K; k += blockDim.x) {
                float wv = cu_value<TYPE>(w, k);
#pragma unroll
                for (int t = 0; t < TP; t++)
                        acc[t] += wv * x[t][k];
        }
#pragma unroll
        for (int t = 0; t < TP; t++) {
                float v = cu_warp_sum(acc[t]);
                if (lane == 0)
                        part[warp][t] = v;
        }
        __syncthreads();
        if (threadIdx.x < TP && p0 + threadIdx.x < a.P) {
                float v = 0.0f;
                for (int i = 0; i < MV_FEW_WARPS; i++)
                        v += part[i][threadIdx.x];
                a.y[(uint64_t) (p0 + threadIdx.x) * a.y_pstride + (uint64_t) g * a.y_gstride +
                    r % a.G] = v;
        }
}

template <int TYPE>
static void launch_few(const struct cu_mv *a, cudaStream_t s) {
        cu_launches++;
        if (a->P == 1)
                cu_launch(k_matvec_few<TYPE, 1>, dim3(a->N, 1), MV_FEW_WARPS * 32, 0, s, *a);
        else
                cu_launch(k_matvec_few<TYPE, MV_TP>, dim3(a->N, (a->P + MV_TP - 1) / MV_TP), MV_FEW_WARPS * 32, 0, s, *a);
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

extern "C" void cu_matvec(const struct cu_mv *a, cudaStream_t s) {
        if (a->P == 0 || a->N == 0)
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
