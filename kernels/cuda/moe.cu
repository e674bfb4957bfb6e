/* SPDX-License-Identifier: MIT */
/* MoE routing (spec §5). The router runs in fp32 on the F32 router weight; selection uses
 * score + bias, the weights the unbiased scores. The expert products themselves (with SwiGLU
 * fused) are cu_matvec over (token, slot) pairs. */
#include "common.cuh"

#define ROUTER_THREADS 256
#define ROUTER_MAX_EXPERTS 256

__global__ void __launch_bounds__(ROUTER_THREADS) k_route(struct cu_router a, const float *f,
                                                           int32_t *sel, float *wout) {
        __shared__ float z[ROUTER_MAX_EXPERTS];
        uint32_t t = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        uint32_t nw = blockDim.x / 32;
        const float *x = f + (uint64_t) t * a.H;

        for (uint32_t e = warp; e < a.n_expert; e += nw) {
                const uint8_t *row = (const uint8_t *) a.w + (uint64_t) e * a.row_bytes;
                float acc = 0.0f;
                for (uint32_t c = lane; c < a.H / CU_CHUNK; c += 32) {
                        float v[CU_CHUNK];
                        cu_dequant32_any(a.type, row, c, v);
                        float s = 0.0f;
#pragma unroll
                        for (int i = 0; i < CU_CHUNK; i++)
                                s += v[i] * x[CU_CHUNK * c + i];
                        acc += s;
                }
                acc = cu_warp_sum(acc);
                if (lane == 0)
                        z[e] = acc;
        }
        __syncthreads();
        if (threadIdx.x != 0)
                return;

        uint32_t n_slots = a.k + (a.shared ? 1 : 0);
        /* scores: sigmoid (xing4) or softmax over the experts */
        if (a.sigmoid) {
                for (uint32_t e = 0; e < a.n_expert; e++)
                        z[e] = 1.0f / (1.0f + expf(-z[e]));
        } else {
                float m = -INFINITY, sum = 0.0f;
                for (uint32_t e = 0; e < a.n_expert; e++)
                        m = fmaxf(m, z[e]);
                for (uint32_t e = 0; e < a.n_expert; e++) {
                        z[e] = expf(z[e] - m);
                        sum += z[e];
                }
                for (uint32_t e = 0; e < a.n_expert; e++)
                        z[e] /= sum;
        }
        /* top-k of score + bias, highest first, ties to the lower id */
        int32_t *s = sel + (uint64_t) t * n_slots;
        float *w = wout + (uint64_t) t * n_slots;
        uint64_t taken[ROUTER_MAX_EXPERTS / 64] = {0};
        float wsum = 0.0f;
        for (uint32_t k = 0; k < a.k; k++) {
                int32_t best = -1;
                float bv = -INFINITY;
                for (uint32_t e = 0; e < a.n_expert; e++) {
                        if (taken[e / 64] >> (e % 64) & 1)
                                continue;
                        float v = z[e] + (a.bias ? a.bias[e] : 0.0f);
                        if (best < 0 || v > bv) {
                                best = (int32_t) e;
                                bv = v;
                        }
                }
                taken[best / 64] |= 1ull << (best % 64);
                s[k] = best;
                w[k] = z[best];
                wsum += z[best];
        }
        for (uint32_t k = 0; k < a.k; k++) {
                if (a.norm)
                        w[k] = w[k] / (wsum + 1e-20f);
                w[k] *= a.scale;
        }
        if (a.shared) {
                s[a.k] = (int32_t) a.n_expert;
                w[a.k] = 1.0f;
        }
}

extern "C" void cu_route(const struct cu_router *a, const float *f, uint32_t T, int32_t *sel,
                         float *w, cudaStream_t s) {
        if (T == 0)
                return;
        k_route<<<T, ROUTER_THREADS, 0, s>>>(*a, f, sel, w);
}
