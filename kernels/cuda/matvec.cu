/* SPDX-License-Identifier: MIT */
/* Stored-row × fp32-vector products for every projection of the model (spec §3-§5): BF16
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
#define MV_TP 8

/* NR = 1: one row per warp. NR = 2 (SwiGLU): the warp computes the (gate, up) row pair 2j, 2j+1
 * with the same per-row arithmetic as NR = 1 and writes silu(gate)·up. */
template <int TYPE, int TP, int NR>
__global__ void __launch_bounds__(MV_WARPS * 32) k_matvec(struct cu_mv a) {
        __shared__ float iq4[16];
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t r = blockIdx.x * MV_WARPS + warp; /* output index */
        uint32_t p0 = blockIdx.y * TP;
        if (TYPE == CU_TYPE_IQ4_NL) {
                if (threadIdx.x < 16)
                        iq4[threadIdx.x] = cu_iq4nl_values[threadIdx.x];
                __syncthreads();
        }
        if (r >= a.N / NR)
                return;

        const uint8_t *w = (const uint8_t *) a.w + (uint64_t) r * NR * a.row_bytes;
        if (a.sel)
                w += (uint64_t) a.sel[p0] * a.expert_bytes; /* TP == 1 with sel */
        uint32_t g = NR == 1 ? r / a.G : 0;
        const float *x[TP];
        float acc[NR][TP];
#pragma unroll
        for (int t = 0; t < TP; t++) {
                uint32_t p = p0 + t < a.P ? p0 + t : p0;
                x[t] = a.x + (uint64_t) (p / a.x_div) * a.x_pstride + (uint64_t) g * a.x_gstride;
#pragma unroll
                for (int k = 0; k < NR; k++)
                        acc[k][t] = 0.0f;
        }

        uint32_t n_chunks = a.K / CU_CHUNK;
        for (uint32_t c = lane; c < n_chunks; c += 32) {
#pragma unroll
                for (int k = 0; k < NR; k++) {
                        float wv[CU_CHUNK];
                        cu_dequant32<TYPE>(w + k * a.row_bytes, c, wv, iq4);
#pragma unroll
                        for (int t = 0; t < TP; t++) {
                                const float4 *xv = (const float4 *) (x[t] + CU_CHUNK * c);
                                float s = 0.0f;
#pragma unroll
                                for (int i = 0; i < CU_CHUNK / 4; i++) {
                                        float4 v = xv[i];
                                        s += wv[4 * i] * v.x;
                                        s += wv[4 * i + 1] * v.y;
                                        s += wv[4 * i + 2] * v.z;
                                        s += wv[4 * i + 3] * v.w;
                                }
                                acc[k][t] += s;
                        }
                }
        }
#pragma unroll
        for (int t = 0; t < TP; t++) {
                float v = cu_warp_sum(acc[0][t]);
                if (NR == 2) {
                        float u = cu_warp_sum(acc[NR - 1][t]);
                        v = v / (1.0f + expf(-v)) * u; /* spec §5: silu(gate)·up in fp32 */
                }
                if (lane == 0 && p0 + t < a.P)
                        a.y[(uint64_t) (p0 + t) * a.y_pstride + (uint64_t) g * a.y_gstride +
                            (NR == 1 ? r % a.G : r)] = v;
        }
}

template <int TYPE, int NR>
static void launch_rows(const struct cu_mv *a, cudaStream_t s) {
        dim3 block(MV_WARPS * 32);
        uint32_t n_out = a->N / NR;
        if (a->sel || a->P == 1) {
                dim3 grid((n_out + MV_WARPS - 1) / MV_WARPS, a->P);
                k_matvec<TYPE, 1, NR><<<grid, block, 0, s>>>(*a);
        } else {
                dim3 grid((n_out + MV_WARPS - 1) / MV_WARPS, (a->P + MV_TP - 1) / MV_TP);
                k_matvec<TYPE, MV_TP, NR><<<grid, block, 0, s>>>(*a);
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
        switch (a->type) {
        case CU_TYPE_F32: launch_type<CU_TYPE_F32>(a, s); break;
        case CU_TYPE_F16: launch_type<CU_TYPE_F16>(a, s); break;
        case CU_TYPE_BF16: launch_type<CU_TYPE_BF16>(a, s); break;
        case CU_TYPE_Q8_0: launch_type<CU_TYPE_Q8_0>(a, s); break;
        case CU_TYPE_IQ4_NL: launch_type<CU_TYPE_IQ4_NL>(a, s); break;
        case CU_TYPE_Q6_K: launch_type<CU_TYPE_Q6_K>(a, s); break;
        }
}
