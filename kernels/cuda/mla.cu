/* SPDX-License-Identifier: MIT */
/* MLA in the absorbed form over the paged latent cache (spec §4): the q_a / latent norms, YaRN RoPE
 * (§4.1), the cache store, and attention split over the context in parts of CU_ATTN_PART
 * positions, each part reduced by one block and the parts folded in order by a second kernel.
 * The new tokens' rows are stored before attention runs, and attention reads every key (old or
 * new) from the cache, so a query's arithmetic is the same however the prompt was chunked. */
#include "common.cuh"

template <typename CT>
static __device__ __forceinline__ float cu_ld(const CT *p);
template <>
__device__ __forceinline__ float cu_ld<float>(const float *p) {
        return *p;
}
template <>
__device__ __forceinline__ float cu_ld<__half>(const __half *p) {
        return __half2float(*p);
}
template <typename CT>
static __device__ __forceinline__ void cu_st(CT *p, float v);
template <>
__device__ __forceinline__ void cu_st<float>(float *p, float v) {
        *p = v;
}
template <>
__device__ __forceinline__ void cu_st<__half>(__half *p, float v) {
        *p = __float2half_rn(v);
}

/* Element offset of the cache row of (token t of the launch's metadata, layer, position pos). */
static __device__ __forceinline__ uint64_t cu_cache_row(const struct cu_cache &c, uint32_t layer,
                                                        uint32_t t, uint32_t pos) {
        uint32_t page = c.pt[c.tok_pt[t] + pos / c.page_tokens];
        uint32_t slot = pos % c.page_tokens;
        return (((uint64_t) page * c.n_layer + layer) * c.page_tokens + slot) * c.D;
}

template <typename CT>
__global__ void k_mla_prep(float *qkv, uint32_t QL, uint32_t KV, uint32_t R, const float *q_a_norm,
                           const float *kv_a_norm, float eps, const double *inv_freq,
                           bool interleave, struct cu_cache c, uint32_t layer) {
        __shared__ float red[32];
        uint32_t t = blockIdx.x;
        float *row = qkv + (uint64_t) t * (QL + KV + R);

        /* spec §4 step 1: qa = RMSNorm(W_qa·a, q_a_norm) */
        float ss = 0.0f;
        for (uint32_t i = threadIdx.x; i < QL; i += blockDim.x)
                ss += row[i] * row[i];
        ss = cu_block_sum(ss, red);
        float rq = 1.0f / sqrtf(ss / (float) QL + eps);
        for (uint32_t i = threadIdx.x; i < QL; i += blockDim.x)
                row[i] = q_a_norm[i] * (row[i] * rq);

        /* step 2: c = RMSNorm(latent, kv_a_norm); k_pe not normed */
        const float *lat = row + QL;
        float ss2 = 0.0f;
        for (uint32_t i = threadIdx.x; i < KV; i += blockDim.x)
                ss2 += lat[i] * lat[i];
        ss2 = cu_block_sum(ss2, red);
        float rc = 1.0f / sqrtf(ss2 / (float) KV + eps);
        uint32_t pos = c.tok_pos[t];
        CT *dst = (CT *) c.base + cu_cache_row(c, layer, t, pos);
        for (uint32_t i = threadIdx.x; i < KV; i += blockDim.x)
                cu_st<CT>(dst + i, kv_a_norm[i] * (lat[i] * rc));

        /* step 3: RoPE of the shared k_pe at position pos */
        const float *kpe = lat + KV;
        for (uint32_t i = threadIdx.x; i < R / 2; i += blockDim.x) {
                uint32_t i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + R / 2;
                float y0, y1;
                cu_rope_pair(kpe[i0], kpe[i1], pos, inv_freq[i], &y0, &y1);
                cu_st<CT>(dst + KV + i0, y0);
                cu_st<CT>(dst + KV + i1, y1);
        }
}

extern "C" void cu_mla_prep(float *qkv, uint32_t T, uint32_t QL, uint32_t KV, uint32_t R,
                            const float *q_a_norm, const float *kv_a_norm, float eps,
                            const double *inv_freq, bool interleave, const struct cu_cache *c,
                            uint32_t layer, cudaStream_t s) {
        if (T == 0)
                return;
        if (c->f16)
                k_mla_prep<__half><<<T, 256, 0, s>>>(qkv, QL, KV, R, q_a_norm, kv_a_norm, eps,
                                                     inv_freq, interleave, *c, layer);
        else
                k_mla_prep<float><<<T, 256, 0, s>>>(qkv, QL, KV, R, q_a_norm, kv_a_norm, eps,
                                                    inv_freq, interleave, *c, layer);
}

#define ATT_THREADS 256

/* One block per (part, head, token). Dynamic shared memory: D floats of the query, CU_ATTN_PART
 * scores and CU_ATTN_PART row offsets. part[t][part][h] = [o (KV) | max | sum]. */
template <typename CT>
__global__ void __launch_bounds__(ATT_THREADS)
        k_attn_part(struct cu_attn a, uint32_t t0, uint32_t max_parts, struct cu_cache c,
                    uint32_t layer, float *part) {
        extern __shared__ float smem[];
        __shared__ float red[32];
        uint32_t D = c.D, KV = a.KV, R = a.R, n_head = a.n_head;
        float *sq = smem, *sc = smem + D;
        uint64_t *roff = (uint64_t *) (smem + ((D + CU_ATTN_PART + 1) & ~1u));
        uint32_t pi = blockIdx.x, h = blockIdx.y, tl = blockIdx.z, t = t0 + tl;
        uint32_t pos_q = c.tok_pos[t];
        if (pi > pos_q / CU_ATTN_PART)
                return;
        uint32_t start = pi * CU_ATTN_PART;
        uint32_t n = min(pos_q + 1 - start, (uint32_t) CU_ATTN_PART);
        const CT *cache = (const CT *) c.base;
        uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;

        /* query = [q_c ; RoPE(q_pe)] (spec §4 absorbed form, §4.1 rope at the query's position) */
        const float *qc = a.qc + ((uint64_t) t * n_head + h) * KV;
        const float *qp = a.q + ((uint64_t) t * n_head + h) * (a.nope + R) + a.nope;
        for (uint32_t i = threadIdx.x; i < KV; i += blockDim.x)
                sq[i] = qc[i];
        for (uint32_t i = threadIdx.x; i < R / 2; i += blockDim.x) {
                uint32_t i0 = a.interleave ? 2 * i : i, i1 = a.interleave ? 2 * i + 1 : i + R / 2;
                cu_rope_pair(qp[i0], qp[i1], pos_q, a.inv_freq[i], &sq[KV + i0], &sq[KV + i1]);
        }
        for (uint32_t j = threadIdx.x; j < n; j += blockDim.x)
                roff[j] = cu_cache_row(c, layer, t, start + j);
        __syncthreads();

        /* s(t') = scale · (q_c·c(t') + q_pe·k_pe(t')): one warp per position */
        for (uint32_t j = warp; j < n; j += nw) {
                const CT *kr = cache + roff[j];
                float acc = 0.0f;
                for (uint32_t i = lane; i < D; i += 32)
                        acc += sq[i] * cu_ld<CT>(kr + i);
                acc = cu_warp_sum(acc);
                if (lane == 0)
                        sc[j] = a.scale * acc;
        }
        __syncthreads();

        float m = -INFINITY;
        for (uint32_t j = threadIdx.x; j < n; j += blockDim.x)
                m = fmaxf(m, sc[j]);
        m = cu_block_max(m, red);
        float l = 0.0f;
        for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
                float p = expf(sc[j] - m);
                sc[j] = p;
                l += p;
        }
        l = cu_block_sum(l, red); /* also orders the sc[] writes before the reads below */

        float *out = part + (((uint64_t) tl * max_parts + pi) * n_head + h) * (KV + 2);
        for (uint32_t k = threadIdx.x; k < KV; k += blockDim.x) {
                /* unrolled so the loads of 8 positions are in flight together; the sum stays
                 * sequential in j */
                float acc = 0.0f;
#pragma unroll 8
                for (uint32_t j = 0; j < n; j++)
                        acc += sc[j] * cu_ld<CT>(cache + roff[j] + k);
                out[k] = acc;
        }
        if (threadIdx.x == 0) {
                out[KV] = m;
                out[KV + 1] = l;
        }
}

/* Fold the parts of each (token, head) in part order. */
__global__ void k_attn_combine(const float *part, uint32_t t0, uint32_t max_parts, uint32_t n_head,
                               uint32_t KV, const uint32_t *tok_pos, float *out) {
        uint32_t tl = blockIdx.x, h = blockIdx.y, t = t0 + tl;
        uint32_t n_parts = tok_pos[t] / CU_ATTN_PART + 1;
        const float *p0 = part + ((uint64_t) tl * max_parts * n_head + h) * (KV + 2);
        uint64_t stride = (uint64_t) n_head * (KV + 2);
        for (uint32_t k = threadIdx.x; k < KV; k += blockDim.x) {
                float M = p0[KV], L = p0[KV + 1], O = p0[k];
                for (uint32_t pi = 1; pi < n_parts; pi++) {
                        const float *pp = p0 + pi * stride;
                        float mq = pp[KV], Mn = fmaxf(M, mq);
                        float a = expf(M - Mn), b = expf(mq - Mn);
                        L = L * a + pp[KV + 1] * b;
                        O = O * a + pp[k] * b;
                        M = Mn;
                }
                out[((uint64_t) t * n_head + h) * KV + k] = O / L;
        }
}

extern "C" void cu_attention(const struct cu_attn *a, uint32_t t0, uint32_t n,
                             uint32_t max_parts, const struct cu_cache *c, uint32_t layer,
                             float *part, float *out, cudaStream_t s) {
        if (n == 0)
                return;
        dim3 grid(max_parts, a->n_head, n);
        size_t smem = ((c->D + CU_ATTN_PART + 1) & ~1u) * sizeof(float) +
                      CU_ATTN_PART * sizeof(uint64_t);
        if (c->f16)
                k_attn_part<__half><<<grid, ATT_THREADS, smem, s>>>(*a, t0, max_parts, *c, layer,
                                                                   part);
        else
                k_attn_part<float><<<grid, ATT_THREADS, smem, s>>>(*a, t0, max_parts, *c, layer,
                                                                  part);
        k_attn_combine<<<dim3(n, a->n_head), 256, 0, s>>>(part, t0, max_parts, a->n_head, a->KV,
                                                        c->tok_pos, out);
}
