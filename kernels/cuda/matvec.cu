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

template <int TYPE, int TP>
__global__ void __launch_bounds__(MV_WARPS * 32) k_matvec(struct cu_mv a) {
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t r = blockIdx.x * MV_WARPS + warp;
        uint32_t p0 = blockIdx.y * TP;
        if (r >= a.N)
                return;

        const uint8_t *w = (const uint8_t *) a.w + (uint64_t) r * a.row_bytes;
        if (a.sel)
                w += (uint64_t) a.sel[p0] * a.expert_bytes; /* TP == 1 with sel */
        uint32_t g = r / a.G;
        const float *x[TP];
        float acc[TP];
#pragma unroll
        for (int t = 0; t < TP; t++) {
                uint32_t p = p0 + t < a.P ? p0 + t : p0;
                x[t] = a.x + (uint64_t) (p / a.x_div) * a.x_pstride + (uint64_t) g * a.x_gstride;
                acc[t] = 0.0f;
        }

        uint32_t n_chunks = a.K / CU_CHUNK;
        for (uint32_t c = lane; c < n_chunks; c += 32) {
                float wv[CU_CHUNK];
                cu_dequant32<TYPE>(w, c, wv);
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
                        acc[t] += s;
                }
        }
#pragma unroll
        for (int t = 0; t < TP; t++) {
                float v = cu_warp_sum(acc[t]);
                if (lane == 0 && p0 + t < a.P)
                        a.y[(uint64_t) (p0 + t) * a.y_pstride + (uint64_t) g * a.y_gstride +
                            r % a.G] = v;
        }
}

template <int TYPE>
static void launch_type(const struct cu_mv *a, cudaStream_t s) {
        dim3 block(MV_WARPS * 32);
        if (a->sel) {
                dim3 grid((a->N + MV_WARPS - 1) / MV_WARPS, a->P);
                k_matvec<TYPE, 1><<<grid, block, 0, s>>>(*a);
        } else if (a->P == 1) {
                dim3 grid((a->N + MV_WARPS - 1) / MV_WARPS, 1);
                k_matvec<TYPE, 1><<<grid, block, 0, s>>>(*a);
        } else {
                dim3 grid((a->N + MV_WARPS - 1) / MV_WARPS, (a->P + MV_TP - 1) / MV_TP);
                k_matvec<TYPE, MV_TP><<<grid, block, 0, s>>>(*a);
        }
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
