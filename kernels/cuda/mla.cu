/* SPDX-License-Identifier: MIT */
/* MLA in the absorbed form over the paged latent cache (spec §4): the q_a / latent norms, YaRN RoPE
 * (§4.1), the cache store, and attention split over the context in parts of CU_ATTN_PART
 * positions, each part reduced by one block and the parts folded in order by a second kernel.
 * The new tokens' rows are stored before attention runs, and attention reads every key (old or
 * new) from the cache, so a query's arithmetic is the same however the prompt was chunked. */
#include "common.cuh"

unsigned long long cu_launches;

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
        cu_launches++;
        if (c->f16)
                k_mla_prep<__half><<<T, 256, 0, s>>>(qkv, QL, KV, R, q_a_norm, kv_a_norm, eps,
                                                     inv_freq, interleave, *c, layer);
        else
                k_mla_prep<float><<<T, 256, 0, s>>>(qkv, QL, KV, R, q_a_norm, kv_a_norm, eps,
                                                    inv_freq, interleave, *c, layer);
}

/* spec §4.1: RoPE of q_pe into the query rows: qc holds per (token, head) a row of D = KV + R
 * values, [q_c (written by the absorb matvec) ; RoPE(q_pe) (written here)]. */
__global__ void k_q_rope(const float *q, uint32_t n_head, uint32_t nope, uint32_t R, uint32_t KV,
                         const double *inv_freq, bool interleave, const uint32_t *tok_pos,
                         float *qc) {
        uint32_t t = blockIdx.x, pos = tok_pos[t], half = R / 2;
        for (uint32_t e = threadIdx.x; e < n_head * half; e += blockDim.x) {
                uint32_t h = e / half, i = e % half;
                const float *qp = q + ((uint64_t) t * n_head + h) * (nope + R) + nope;
                float *dst = qc + ((uint64_t) t * n_head + h) * (KV + R) + KV;
                uint32_t i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + half;
                cu_rope_pair(qp[i0], qp[i1], pos, inv_freq[i], &dst[i0], &dst[i1]);
        }
}

extern "C" void cu_q_rope(const struct cu_attn *a, uint32_t T, const uint32_t *tok_pos,
                          cudaStream_t s) {
        if (T == 0)
                return;
        cu_launches++;
        k_q_rope<<<T, 256, 0, s>>>(a->q, a->n_head, a->nope, a->R, a->KV, a->inv_freq,
                                   a->interleave, tok_pos, a->qc);
}

/* One block per (part, head group of HG heads, token): the scores of its HG query rows against
 * the part's ≤ CU_ATTN_PART cache rows, the part's softmax statistics and P·c. Every value is
 * computed in one canonical order that does not depend on HG or the thread layout, so a launch
 * may pick the head-group size from the batch shape (few tokens: small groups for parallelism;
 * many tokens: all heads share each cache row read) and a query's bits stay the same:
 *   s_j = scale · Σ_k q[k]·c_j[k]   one fmaf chain over k = 0..D-1 from 0
 *   m   = max_j s_j                 (exact in any order)
 *   p_j = expf(s_j − m)
 *   l   = butterfly warp sum of 32 lane sums, lane i summing p_j for j ≡ i (mod 32) ascending
 *   o[k] = Σ_j p_j·c_j[k]           one fmaf chain over j ascending from 0
 * part[t][part][h] = [o (KV) | m | l]. Phase A stages the cache rows in chunks of ATT_KC values,
 * transposed, and each thread keeps TH heads × TJ positions of scores in registers. */
#define ATT_KC 32
#define ATT_JS (CU_ATTN_PART / 2) /* position lanes of phase A: TJ = 2 positions each */

template <int HG, int TH, typename CT>
__global__ void __launch_bounds__((HG / TH) * ATT_JS)
        k_attn_part(struct cu_attn a, uint32_t t0, uint32_t max_parts, struct cu_cache c,
                    uint32_t layer, float *part) {
        constexpr int NT = (HG / TH) * ATT_JS, TJ = 2;
        __shared__ float sC[ATT_KC][CU_ATTN_PART + 1]; /* cache chunk, [k][position] */
        __shared__ float sQ[ATT_KC][HG];               /* query chunk, [k][head] */
        __shared__ __align__(16) float sP[HG][CU_ATTN_PART]; /* scores, then p */
        __shared__ uint64_t roff[CU_ATTN_PART];
        uint32_t D = c.D, KV = a.KV, n_head = a.n_head;
        uint32_t pi = blockIdx.x, h0 = blockIdx.y * HG, tl = blockIdx.z, t = t0 + tl;
        uint32_t pos_q = c.tok_pos[t];
        if (pi > pos_q / CU_ATTN_PART)
                return;
        uint32_t start = pi * CU_ATTN_PART;
        uint32_t n = min(pos_q + 1 - start, (uint32_t) CU_ATTN_PART);
        const CT *cache = (const CT *) c.base;
        uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        const float *qrow = a.qc + (uint64_t) t * n_head * D;

        for (uint32_t j = tid; j < n; j += NT)
                roff[j] = cu_cache_row(c, layer, t, start + j);

        /* phase A: scores */
        uint32_t jl = tid % ATT_JS, hl = (tid / ATT_JS) * TH;
        float acc[TH][TJ];
#pragma unroll
        for (int x = 0; x < TH; x++)
#pragma unroll
                for (int y = 0; y < TJ; y++)
                        acc[x][y] = 0.0f;
        for (uint32_t k0 = 0; k0 < D; k0 += ATT_KC) {
                uint32_t kc = min((uint32_t) ATT_KC, D - k0);
                __syncthreads(); /* roff written / previous chunk consumed */
                for (uint32_t e = tid; e < kc * n; e += NT) {
                        uint32_t j = e / kc, kk = e % kc;
                        sC[kk][j] = cu_ld<CT>(cache + roff[j] + k0 + kk);
                }
                for (uint32_t e = tid; e < kc * HG; e += NT) {
                        uint32_t kk = e / HG, hh = e % HG;
                        sQ[kk][hh] = h0 + hh < n_head ? qrow[(uint64_t) (h0 + hh) * D + k0 + kk]
                                                      : 0.0f;
                }
                __syncthreads();
                for (uint32_t kk = 0; kk < kc; kk++) {
                        float cv[TJ], qv[TH];
#pragma unroll
                        for (int y = 0; y < TJ; y++)
                                cv[y] = sC[kk][jl + y * ATT_JS];
#pragma unroll
                        for (int x = 0; x < TH; x++)
                                qv[x] = sQ[kk][hl + x];
#pragma unroll
                        for (int x = 0; x < TH; x++)
#pragma unroll
                                for (int y = 0; y < TJ; y++)
                                        acc[x][y] = fmaf(qv[x], cv[y], acc[x][y]);
                }
        }
#pragma unroll
        for (int x = 0; x < TH; x++)
#pragma unroll
                for (int y = 0; y < TJ; y++)
                        sP[hl + x][jl + y * ATT_JS] = a.scale * acc[x][y];
        __syncthreads();

        /* phase B: per head (one warp each) max, p, l */
        float *out0 = part + (((uint64_t) tl * max_parts + pi) * n_head) * (KV + 2);
        for (uint32_t hh = warp; hh < HG; hh += NT / 32) {
                float m = -INFINITY;
                for (uint32_t j = lane; j < n; j += 32)
                        m = fmaxf(m, sP[hh][j]);
                m = cu_warp_max(m);
                float l = 0.0f;
                for (uint32_t j = lane; j < n; j += 32) {
                        float p = expf(sP[hh][j] - m);
                        sP[hh][j] = p;
                        l += p;
                }
                l = cu_warp_sum(l);
                if (lane == 0 && h0 + hh < n_head) {
                        out0[(uint64_t) (h0 + hh) * (KV + 2) + KV] = m;
                        out0[(uint64_t) (h0 + hh) * (KV + 2) + KV + 1] = l;
                }
        }
        __syncthreads();

        /* phase C: o[h][k] = Σ_j p[h][j]·c_j[k], four positions per step, in order */
        for (uint32_t k = tid; k < KV; k += NT) {
                float o[HG];
#pragma unroll
                for (int x = 0; x < HG; x++)
                        o[x] = 0.0f;
                uint32_t j = 0;
                for (; j + 4 <= n; j += 4) {
                        float c0 = cu_ld<CT>(cache + roff[j] + k);
                        float c1 = cu_ld<CT>(cache + roff[j + 1] + k);
                        float c2 = cu_ld<CT>(cache + roff[j + 2] + k);
                        float c3 = cu_ld<CT>(cache + roff[j + 3] + k);
#pragma unroll
                        for (int x = 0; x < HG; x++) {
                                float4 p = *(const float4 *) &sP[x][j];
                                o[x] = fmaf(p.x, c0, o[x]);
                                o[x] = fmaf(p.y, c1, o[x]);
                                o[x] = fmaf(p.z, c2, o[x]);
                                o[x] = fmaf(p.w, c3, o[x]);
                        }
                }
                for (; j < n; j++) {
                        float cj = cu_ld<CT>(cache + roff[j] + k);
#pragma unroll
                        for (int x = 0; x < HG; x++)
                                o[x] = fmaf(sP[x][j], cj, o[x]);
                }
#pragma unroll
                for (int x = 0; x < HG; x++)
                        if (h0 + x < n_head)
                                out0[(uint64_t) (h0 + x) * (KV + 2) + k] = o[x];
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

template <int HG, int TH>
static void attn_launch(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts,
                        const struct cu_cache *c, uint32_t layer, float *part, cudaStream_t s) {
        dim3 grid(max_parts, (a->n_head + HG - 1) / HG, n);
        constexpr int NT = (HG / TH) * ATT_JS;
        cu_launches++;
        if (c->f16)
                k_attn_part<HG, TH, __half><<<grid, NT, 0, s>>>(*a, t0, max_parts, *c, layer, part);
        else
                k_attn_part<HG, TH, float><<<grid, NT, 0, s>>>(*a, t0, max_parts, *c, layer, part);
}

extern "C" void cu_attention(const struct cu_attn *a, uint32_t t0, uint32_t n,
                             uint32_t max_parts, const struct cu_cache *c, uint32_t layer,
                             float *part, float *out, cudaStream_t s) {
        if (n == 0)
                return;
        /* head groups: the arithmetic is the same for every choice (see k_attn_part); many
         * (token, part) blocks → all heads per block, each cache row read once per block; few →
         * small groups so the launch fills the card */
        uint64_t blocks = (uint64_t) n * max_parts;
        if (blocks >= 512 && a->n_head > 8)
                attn_launch<32, 4>(a, t0, n, max_parts, c, layer, part, s);
        else if (blocks >= 64)
                attn_launch<8, 2>(a, t0, n, max_parts, c, layer, part, s);
        else
                attn_launch<2, 1>(a, t0, n, max_parts, c, layer, part, s);
        cu_launches++;
        k_attn_combine<<<dim3(n, a->n_head), 256, 0, s>>>(part, t0, max_parts, a->n_head, a->KV,
                                                        c->tok_pos, out);
}
