/* SPDX-License-Identifier: MIT */
/* The router's expert selection for one token on one warp (docs/model.md §5): moe.cu's router
 * kernels and the mHC kernel that routes in its tail (mhc.cu, X4_CUDA_HC_ROUTE) run the same code,
 * so the same choice and weights from the same logits. */
#pragma once
#include "common.cuh"

#define ROUTER_MAX_EXPERTS 256

/* A ticket taken with acquire-release semantics at GPU scope: its release publishes what the
 * block wrote before the __syncthreads ahead of it, its acquire (in the block that draws the last
 * ticket) lets the block read, past the __syncthreads after it, what every block published: the
 * two __threadfence a ticket needs otherwise (X4_CUDA_ROUTER_RELEASE, X4_CUDA_HC_RELEASE). */
static __device__ __forceinline__ uint32_t cu_ticket_acq_rel(uint32_t *p) {
        uint32_t old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
        return old;
}

/* Selection for one token per warp from the router logits z (cu_matvec): lane l holds experts
 * l, l+32, ...; each of the k rounds is a butterfly argmax (highest score + bias, ties to the
 * lower id), so the choice does not depend on the order of the reduction. */
#define ROUTER_PER_LANE (ROUTER_MAX_EXPERTS / 32)

/* Selection for token t on one warp (lane = its lane) from the router logits z. LDCG: the logits
 * were written by other blocks of this grid (read past L1). */
template <bool LDCG>
static __device__ __forceinline__ void route_token(const struct cu_router &a, uint32_t t, uint32_t lane,
                                                   int32_t *sel, float *wout) {
        const float *zt = a.z + (uint64_t) t * a.n_expert;
        float sc[ROUTER_PER_LANE], key[ROUTER_PER_LANE];
        /* scores: sigmoid (xing4) or softmax over the experts */
        float m = -INFINITY;
#pragma unroll
        for (int j = 0; j < ROUTER_PER_LANE; j++) {
                uint32_t e = lane + 32 * j;
                sc[j] = e < a.n_expert ? (LDCG ? __ldcg(zt + e) : zt[e]) : -INFINITY;
                m = fmaxf(m, sc[j]);
        }
        if (a.sigmoid) {
#pragma unroll
                for (int j = 0; j < ROUTER_PER_LANE; j++)
                        sc[j] = 1.0f / (1.0f + expf(-sc[j]));
        } else {
                m = cu_warp_max(m);
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < ROUTER_PER_LANE; j++) {
                        sc[j] = expf(sc[j] - m);
                        sum += sc[j];
                }
                sum = cu_warp_sum(sum);
#pragma unroll
                for (int j = 0; j < ROUTER_PER_LANE; j++)
                        sc[j] /= sum;
        }
#pragma unroll
        for (int j = 0; j < ROUTER_PER_LANE; j++) {
                uint32_t e = lane + 32 * j;
                key[j] = e < a.n_expert ? sc[j] + (a.bias ? a.bias[e] : 0.0f) : -INFINITY;
        }

        uint32_t n_slots = a.k + (a.shared ? 1 : 0);
        int32_t *s = sel + (uint64_t) t * n_slots;
        float *w = wout + (uint64_t) t * n_slots;
        float wsum = 0.0f;
        for (uint32_t k = 0; k < a.k; k++) {
                float bv = -INFINITY;
                int32_t bi = INT32_MAX;
#pragma unroll
                for (int j = 0; j < ROUTER_PER_LANE; j++) {
                        int32_t e = (int32_t) (lane + 32 * j);
                        if (e < (int32_t) a.n_expert && key[j] != -INFINITY &&
                            (key[j] > bv || (key[j] == bv && e < bi))) {
                                bv = key[j];
                                bi = e;
                        }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                        float ov = __shfl_xor_sync(CU_FULL_MASK, bv, o);
                        int32_t oi = __shfl_xor_sync(CU_FULL_MASK, bi, o);
                        if (ov > bv || (ov == bv && oi < bi)) {
                                bv = ov;
                                bi = oi;
                        }
                }
                /* the owner lane retires the expert and hands out its unbiased score */
                float score = 0.0f;
#pragma unroll
                for (int j = 0; j < ROUTER_PER_LANE; j++)
                        if (lane + 32 * j == (uint32_t) bi) {
                                score = sc[j];
                                key[j] = -INFINITY;
                        }
                score = __shfl_sync(CU_FULL_MASK, score, bi % 32);
                if (lane == 0) {
                        s[k] = bi;
                        w[k] = score;
                }
                wsum += score;
        }
        if (lane != 0)
                return;
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
