/* SPDX-License-Identifier: MIT */
/* MLA in the absorbed form over the paged latent cache (docs/model.md §4): the q_a / latent norms, YaRN RoPE
 * (§4.1), the cache store, and attention split over the context in parts of CU_ATTN_PART
 * positions, each part reduced by one block and the parts folded in order by a second kernel.
 * The new tokens' rows are stored before attention runs, and attention reads every key (old or
 * new) from the cache, so a query's arithmetic is the same however the prompt was chunked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

unsigned long long cu_launches;
bool cu_pdl, cu_carveout_max;

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

/* Three independent jobs a token, a block each (blockIdx.y), so their latencies overlap instead of
 * adding up: 0 the q_a norm, 1 the latent norm and its store, 2 the RoPE of k_pe and its store.
 * Each computes what one block computed before, with the same block size and reductions. */
template <typename CT>
__global__ void k_mla_prep(float *qkv, uint32_t QL, uint32_t KV, uint32_t R, const float *q_a_norm,
                           const float *kv_a_norm, float eps, const double *inv_freq,
                           bool interleave, struct cu_cache c, uint32_t layer) {
        __shared__ float red[32];
        uint32_t t = blockIdx.x, job = blockIdx.y;
        float *row = qkv + (uint64_t) t * (QL + KV + R);
        uint32_t pos = c.tok_pos[t]; /* metadata: the row's place before the wait */
        CT *dst = (CT *) c.base + cu_cache_row(c, layer, t, pos);
        cu_pdl_wait();
        cu_pdl_trigger();

        if (job == 0) {
                /* docs/model.md §4 step 1: qa = RMSNorm(W_qa·a, q_a_norm) */
                float ss = 0.0f;
#pragma unroll 4
                for (uint32_t i = threadIdx.x; i < QL; i += blockDim.x)
                        ss += row[i] * row[i];
                ss = cu_block_sum(ss, red);
                float rq = 1.0f / sqrtf(ss / (float) QL + eps);
#pragma unroll 4
                for (uint32_t i = threadIdx.x; i < QL; i += blockDim.x)
                        row[i] = q_a_norm[i] * (row[i] * rq);
        } else if (job == 1) {
                /* step 2: c = RMSNorm(latent, kv_a_norm); k_pe not normed */
                const float *lat = row + QL;
                float ss2 = 0.0f;
#pragma unroll 4
                for (uint32_t i = threadIdx.x; i < KV; i += blockDim.x)
                        ss2 += lat[i] * lat[i];
                ss2 = cu_block_sum(ss2, red);
                float rc = 1.0f / sqrtf(ss2 / (float) KV + eps);
#pragma unroll 4
                for (uint32_t i = threadIdx.x; i < KV; i += blockDim.x)
                        cu_st<CT>(dst + i, kv_a_norm[i] * (lat[i] * rc));
        } else {
                /* step 3: RoPE of the shared k_pe at position pos */
                const float *kpe = row + QL + KV;
#pragma unroll 4
                for (uint32_t i = threadIdx.x; i < R / 2; i += blockDim.x) {
                        uint32_t i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + R / 2;
                        float y0, y1;
                        cu_rope_pair(kpe[i0], kpe[i1], pos, inv_freq[i], &y0, &y1);
                        cu_st<CT>(dst + KV + i0, y0);
                        cu_st<CT>(dst + KV + i1, y1);
                }
        }
}

extern "C" void cu_mla_prep(float *qkv, uint32_t T, uint32_t QL, uint32_t KV, uint32_t R,
                            const float *q_a_norm, const float *kv_a_norm, float eps,
                            const double *inv_freq, bool interleave, const struct cu_cache *c,
                            uint32_t layer, cudaStream_t s) {
        if (T == 0)
                return;
        cu_launches++;
        dim3 grid(T, 3);
        if (c->f16)
                cu_launch(k_mla_prep<__half>, grid, 256, 0, s, qkv, QL, KV, R, q_a_norm, kv_a_norm, eps, inv_freq, interleave, *c, layer);
        else
                cu_launch(k_mla_prep<float>, grid, 256, 0, s, qkv, QL, KV, R, q_a_norm, kv_a_norm, eps, inv_freq, interleave, *c, layer);
}

/* docs/model.md §4.1: RoPE of q_pe into the query rows: qc holds per (token, head) a row of D = KV + R
 * values, [q_c (written by the absorb matvec) ; RoPE(q_pe) (written here)]. */
__global__ void k_q_rope(const float *q, uint32_t n_head, uint32_t nope, uint32_t R, uint32_t KV,
                         const double *inv_freq, bool interleave, const uint32_t *tok_pos,
                         float *qc) {
        uint32_t t = blockIdx.x, pos = tok_pos[t], half = R / 2; /* metadata: before the wait */
        cu_pdl_wait();
        cu_pdl_trigger();
#pragma unroll 4
        for (uint32_t e = blockIdx.y * blockDim.x + threadIdx.x; e < n_head * half; e += gridDim.y * blockDim.x)
                cu_q_rope_one(q, qc, n_head, nope, R, KV, inv_freq, interleave, t, pos, e);
}

/* The queries' RoPE as extra blocks of the absorb product: the default (the same bits, one kernel
 * a layer fewer: 562 -> 522 a batch-1 step; H200, full model, 72ecf98: 196.6 -> 198.7 tok/s at
 * 512; bench/RESULTS.md). X4_CUDA_ROPE_SIDE=0 keeps k_q_rope after the product. */
extern "C" bool cu_rope_side_on(void) {
        static int on = -1;
        if (on < 0)
                on = cu_env_or("X4_CUDA_ROPE_SIDE", true);
        return on;
}

/* cu_q_rope's kernel for a side job no product took (cu_matvec) */
extern "C" void cu_q_rope_side(const struct cu_rope_side *r, cudaStream_t s) {
        struct cu_attn a = {.qc = r->qc, .q = r->q, .n_head = r->n_head, .nope = r->nope, .R = r->R, .KV = r->KV,
                            .inv_freq = r->inv_freq, .interleave = r->interleave};
        cu_q_rope(&a, r->T, r->tok_pos, s);
}

extern "C" void cu_q_rope(const struct cu_attn *a, uint32_t T, const uint32_t *tok_pos,
                          cudaStream_t s) {
        if (T == 0)
                return;
        cu_launches++;
        /* a rotation a thread: the double-precision angles are the kernel's latency */
        uint32_t ny = (a->n_head * (a->R / 2) + 255) / 256;
        cu_launch(k_q_rope, dim3(T, ny ? ny : 1), 256, 0, s, a->q, a->n_head, a->nope, a->R, a->KV, a->inv_freq, a->interleave, tok_pos, a->qc);
}

/* Attention over one part (≤ CU_ATTN_PART positions of the cache) for a group of HG heads of one
 * token: scores, the part's softmax statistics and P·c. Two kernels do it, shaped for different
 * batches, and both compute every value in the same canonical order, so which one runs (and with
 * which head-group size) never changes a bit of a query's result:
 *   P_c  = Σ_{k in chunk c} q[k]·c_j[k]   one fmaf chain from 0, chunks of ATT_KC values
 *   s_j  = scale · (0 + P_0 + P_1 + ...)   chunk sums added in chunk order
 *   m    = max_j s_j                       (exact in any order)
 *   p_j  = expf(s_j − m)
 *   l    = butterfly warp sum of 32 lane sums, lane i summing p_j for j ≡ i (mod 32) ascending
 *   Q_g  = Σ_{j in sub-part g} p_j·c_j[k]  one fmaf chain from 0, sub-parts of ATT_SUB positions
 *   o[k] = 0 + Q_0 + Q_1 + ...             sub-part sums added in order
 * part[t][part][h] = [o (KV) | m | l].
 *
 * k_attn_part (many tokens: prefill, big decode batches): all heads share each staged cache
 * chunk; each thread keeps TH heads × 2 positions of scores in registers.
 * k_attn_dec (few tokens): one warp per position, a lane per chunk, and four lanes per output
 * value (one per sub-part), so a batch-1 step has few dependent memory round trips. */
#define ATT_KC 32
#define ATT_SUB 32
#define ATT_JS (CU_ATTN_PART / 2) /* position lanes of k_attn_part's phase A, 2 positions each */

/* Phase B of both kernels: per head (one warp each) m, p_j (in place) and l; sP rows of
 * `stride` floats, position j at j + j / ATT_SUB · pad. */
template <int HG>
static __device__ __forceinline__ void attn_softmax(float *sP, uint32_t stride, uint32_t pad,
                                                    uint32_t n, uint32_t h0, uint32_t n_head,
                                                    uint32_t KV, float *out0) {
        uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
        for (uint32_t hh = warp; hh < HG; hh += nw) {
                float *row = sP + hh * stride;
                float m = -INFINITY;
                for (uint32_t j = lane; j < n; j += 32)
                        m = fmaxf(m, row[j + j / ATT_SUB * pad]);
                m = cu_warp_max(m);
                float l = 0.0f;
                for (uint32_t j = lane; j < n; j += 32) {
                        float p = expf(row[j + j / ATT_SUB * pad] - m);
                        row[j + j / ATT_SUB * pad] = p;
                        l += p;
                }
                l = cu_warp_sum(l);
                if (lane == 0 && h0 + hh < n_head) {
                        out0[(uint64_t) (h0 + hh) * (KV + 2) + KV] = m;
                        out0[(uint64_t) (h0 + hh) * (KV + 2) + KV + 1] = l;
                }
        }
}

template <int HG, int TH, typename CT>
__global__ void __launch_bounds__((HG / TH) * ATT_JS)
        k_attn_part(struct cu_attn a, uint32_t t0, uint32_t max_parts, struct cu_cache c,
                    uint32_t layer, float *part) {
        cu_pdl_wait();
        cu_pdl_trigger();
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
        uint32_t tid = threadIdx.x;
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
                float pc[TH][TJ];
#pragma unroll
                for (int x = 0; x < TH; x++)
#pragma unroll
                        for (int y = 0; y < TJ; y++)
                                pc[x][y] = 0.0f;
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
                                        pc[x][y] = fmaf(qv[x], cv[y], pc[x][y]);
                }
#pragma unroll
                for (int x = 0; x < TH; x++)
#pragma unroll
                        for (int y = 0; y < TJ; y++)
                                acc[x][y] += pc[x][y];
        }
#pragma unroll
        for (int x = 0; x < TH; x++)
#pragma unroll
                for (int y = 0; y < TJ; y++)
                        sP[hl + x][jl + y * ATT_JS] = a.scale * acc[x][y];
        __syncthreads();

        /* phase B */
        float *out0 = part + (((uint64_t) tl * max_parts + pi) * n_head) * (KV + 2);
        attn_softmax<HG>(&sP[0][0], CU_ATTN_PART, 0, n, h0, n_head, KV, out0);
        __syncthreads();

        /* phase C: o[h][k], sub-part by sub-part, four positions per step */
        for (uint32_t k = tid; k < KV; k += NT) {
                float o[HG];
#pragma unroll
                for (int x = 0; x < HG; x++)
                        o[x] = 0.0f;
                for (uint32_t g0 = 0; g0 < n; g0 += ATT_SUB) {
                        uint32_t ge = min(g0 + ATT_SUB, n), j = g0;
                        float q[HG];
#pragma unroll
                        for (int x = 0; x < HG; x++)
                                q[x] = 0.0f;
                        for (; j + 4 <= ge; j += 4) {
                                float c0 = cu_ld<CT>(cache + roff[j] + k);
                                float c1 = cu_ld<CT>(cache + roff[j + 1] + k);
                                float c2 = cu_ld<CT>(cache + roff[j + 2] + k);
                                float c3 = cu_ld<CT>(cache + roff[j + 3] + k);
#pragma unroll
                                for (int x = 0; x < HG; x++) {
                                        float4 p = *(const float4 *) &sP[x][j];
                                        q[x] = fmaf(p.x, c0, q[x]);
                                        q[x] = fmaf(p.y, c1, q[x]);
                                        q[x] = fmaf(p.z, c2, q[x]);
                                        q[x] = fmaf(p.w, c3, q[x]);
                                }
                        }
                        for (; j < ge; j++) {
                                float cj = cu_ld<CT>(cache + roff[j] + k);
#pragma unroll
                                for (int x = 0; x < HG; x++)
                                        q[x] = fmaf(sP[x][j], cj, q[x]);
                        }
#pragma unroll
                        for (int x = 0; x < HG; x++)
                                o[x] += q[x];
                }
#pragma unroll
                for (int x = 0; x < HG; x++)
                        if (h0 + x < n_head)
                                out0[(uint64_t) (h0 + x) * (KV + 2) + k] = o[x];
        }
}

/* 32 consecutive cache values as fp32 (16-byte loads when `vec`: row offsets multiples of 8). */
template <typename CT>
static __device__ __forceinline__ void cu_ld32(const CT *p, bool vec, float *v);
template <>
__device__ __forceinline__ void cu_ld32<float>(const float *p, bool vec, float *v) {
        if (vec) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                        float4 f = ((const float4 *) p)[i];
                        v[4 * i] = f.x;
                        v[4 * i + 1] = f.y;
                        v[4 * i + 2] = f.z;
                        v[4 * i + 3] = f.w;
                }
        } else {
#pragma unroll
                for (int i = 0; i < 32; i++)
                        v[i] = p[i];
        }
}
template <>
__device__ __forceinline__ void cu_ld32<__half>(const __half *p, bool vec, float *v) {
        if (vec) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                        uint4 u = ((const uint4 *) p)[i];
                        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                                float2 f = __half22float2(*(const __half2 *) &w[e]);
                                v[8 * i + 2 * e] = f.x;
                                v[8 * i + 2 * e + 1] = f.y;
                        }
                }
        } else {
#pragma unroll
                for (int i = 0; i < 32; i++)
                        v[i] = __half2float(p[i]);
        }
}

/* 4 consecutive cache values (row offsets and k multiples of 4): one 16-byte (f32) or 8-byte
 * (f16) load instead of four. */
template <typename CT>
static __device__ __forceinline__ void cu_ld4(const CT *p, float *v);
template <>
__device__ __forceinline__ void cu_ld4<float>(const float *p, float *v) {
        float4 f = *(const float4 *) p;
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}
template <>
__device__ __forceinline__ void cu_ld4<__half>(const __half *p, float *v) {
        uint2 u = *(const uint2 *) p;
        float2 a = __half22float2(*(const __half2 *) &u.x), b = __half22float2(*(const __half2 *) &u.y);
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}

/* k_attn_dec's layout: one lane per ATT_KC = 32-value chunk in phase A, four sub-part lanes per
 * output value in phase C (lane / 8); a different part or chunk size needs a different layout. */
static_assert(ATT_KC == 32 && CU_ATTN_PART == 4 * ATT_SUB,
              "k_attn_dec assumes 32-value chunks and four 32-position sub-parts per part");

#define ATT_DEC_THREADS 512
/* (token, part) blocks below which the split path runs by default (its kernels spread a few parts
 * over many blocks; k_attn_part shares each staged chunk among all heads for many). Measured on the
 * full model (H200, 9deea5b): split vs the others, batch 1 at 512 (4 blocks) 163.2 vs 154.2 tok/s,
 * at 4,096 (32) 135.9 vs 115.1, batch 16 at 512 (64) 464 vs 428; slower at batch 16 / 4,096 (512
 * blocks: 294.6 vs 306.3) and batch 1 / 32,768 (256: 42.8 vs 45.6). Same bits either way. */
#define ATT_SPLIT_BELOW 129u
#define ATT_DEC_PAD 1 /* sP: a free slot after each sub-part, so the four sub-part lanes of phase
                       * C read different banks */
#define ATT_DEC_STRIDE (CU_ATTN_PART + CU_ATTN_PART / ATT_SUB * ATT_DEC_PAD)

template <int HG, typename CT>
__global__ void __launch_bounds__(ATT_DEC_THREADS)
        k_attn_dec(struct cu_attn a, uint32_t t0, uint32_t max_parts, struct cu_cache c,
                   uint32_t layer, float *part) {
        __shared__ float sQ[HG][32 * (ATT_KC + 1)]; /* query, chunk c at c·33 (bank spread) */
        __shared__ float sP[HG][ATT_DEC_STRIDE];
        __shared__ uint64_t roff[CU_ATTN_PART];
        uint32_t D = c.D, KV = a.KV, n_head = a.n_head, nch = (D + ATT_KC - 1) / ATT_KC;
        uint32_t pi = blockIdx.x, h0 = blockIdx.y * HG, tl = blockIdx.z, t = t0 + tl;
        uint32_t pos_q = c.tok_pos[t];
        if (pi > pos_q / CU_ATTN_PART)
                return;
        uint32_t start = pi * CU_ATTN_PART;
        uint32_t n = min(pos_q + 1 - start, (uint32_t) CU_ATTN_PART);
        const CT *cache = (const CT *) c.base;
        uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        constexpr uint32_t NW = ATT_DEC_THREADS / 32;
        const float *qrow = a.qc + (uint64_t) t * n_head * D;
        bool vec = D % 8 == 0, vec4 = D % 4 == 0;

        for (uint32_t j = tid; j < n; j += ATT_DEC_THREADS)
                roff[j] = cu_cache_row(c, layer, t, start + j); /* metadata: before the wait */
        cu_pdl_wait();
        cu_pdl_trigger();
        for (uint32_t e = tid; e < HG * nch * ATT_KC; e += ATT_DEC_THREADS) {
                uint32_t hh = e / (nch * ATT_KC), r = e % (nch * ATT_KC);
                uint32_t cc = r / ATT_KC, i = r % ATT_KC, k = cc * ATT_KC + i;
                sQ[hh][cc * (ATT_KC + 1) + i] =
                        h0 + hh < n_head && k < D ? qrow[(uint64_t) (h0 + hh) * D + k] : 0.0f;
        }
        __syncthreads();

        /* phase A: a warp per position, lane c computes chunk c's sums P_c for the HG heads */
#pragma unroll 2
        for (uint32_t j = warp; j < n; j += NW) {
                float pc[HG];
#pragma unroll
                for (int x = 0; x < HG; x++)
                        pc[x] = 0.0f;
                if (lane < nch) {
                        uint32_t k0 = lane * ATT_KC, kc = min((uint32_t) ATT_KC, D - k0);
                        const float *q = &sQ[0][lane * (ATT_KC + 1)];
                        if (kc == ATT_KC) {
                                float v[ATT_KC];
                                cu_ld32<CT>(cache + roff[j] + k0, vec, v);
#pragma unroll
                                for (int i = 0; i < ATT_KC; i++)
#pragma unroll
                                        for (int x = 0; x < HG; x++)
                                                pc[x] = fmaf(q[x * 32 * (ATT_KC + 1) + i], v[i],
                                                             pc[x]);
                        } else {
                                for (uint32_t i = 0; i < kc; i++) {
                                        float v = cu_ld<CT>(cache + roff[j] + k0 + i);
#pragma unroll
                                        for (int x = 0; x < HG; x++)
                                                pc[x] = fmaf(q[x * 32 * (ATT_KC + 1) + i], v,
                                                             pc[x]);
                                }
                        }
                }
#pragma unroll
                for (int x = 0; x < HG; x++) {
                        float sum = 0.0f;
                        for (uint32_t cc = 0; cc < nch; cc++)
                                sum += __shfl_sync(CU_FULL_MASK, pc[x], cc);
                        if (lane == 0)
                                sP[x][j + j / ATT_SUB * ATT_DEC_PAD] = a.scale * sum;
                }
        }
        __syncthreads();

        float *out0 = part + (((uint64_t) tl * max_parts + pi) * n_head) * (KV + 2);
        attn_softmax<HG>(&sP[0][0], ATT_DEC_STRIDE, ATT_DEC_PAD, n, h0, n_head, KV, out0);
        __syncthreads();

        /* phase C: lane = sub-part g (0..3) × value quad kq (0..7): a warp covers 32 values of
         * o; the four sub-part sums of a value are added in order by its g = 0 lane */
        uint32_t g = lane / 8, kq = lane % 8, ng = (n + ATT_SUB - 1) / ATT_SUB;
        for (uint32_t kb = warp * 32; kb < KV; kb += NW * 32) {
                uint32_t k = kb + 4 * kq;
                float q[HG][4];
#pragma unroll
                for (int x = 0; x < HG; x++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                                q[x][e] = 0.0f;
                uint32_t j0 = g * ATT_SUB, je = min(j0 + ATT_SUB, n);
                if (j0 < n) {
#pragma unroll 8
                        for (uint32_t j = j0; j < je; j++) {
                                float cv[4];
                                if (vec4 && k + 4 <= KV) {
                                        cu_ld4<CT>(cache + roff[j] + k, cv);
                                } else {
#pragma unroll
                                        for (int e = 0; e < 4; e++)
                                                cv[e] = k + e < KV
                                                                ? cu_ld<CT>(cache + roff[j] + k + e)
                                                                : 0.0f;
                                }
                                uint32_t js = j + j / ATT_SUB * ATT_DEC_PAD;
#pragma unroll
                                for (int x = 0; x < HG; x++) {
                                        float p = sP[x][js];
#pragma unroll
                                        for (int e = 0; e < 4; e++)
                                                q[x][e] = fmaf(p, cv[e], q[x][e]);
                                }
                        }
                }
#pragma unroll
                for (int x = 0; x < HG; x++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                                float o = 0.0f;
                                for (uint32_t gg = 0; gg < ng; gg++)
                                        o += __shfl_sync(CU_FULL_MASK, q[x][e], gg * 8 + kq);
                                if (g == 0 && k + e < KV && h0 + x < n_head)
                                        out0[(uint64_t) (h0 + x) * (KV + 2) + k + e] = o;
                        }
        }
}

/* The split decode path: two kernels in place of one k_attn_dec block per (part, head group),
 * computing every value in the canonical order above.
 *
 * k_attn_scores: a block per (token, 32-position tile, AS_HG heads) stages the tile's cache rows
 * once (coalesced, f32 in shared memory) and computes s_j for its heads: warp w computes chunk
 * w's sums P_w (its lanes hold the head's query chunk in registers and read the cache row as a
 * broadcast), then each (position, head) adds the chunk sums in chunk order. Scores go to `sc`,
 * CU_ATTN_PART floats per (token, part, head).
 * k_attn_pv: a block per (token, part, AC_KS values of the latent, 32 heads) reads the part's
 * scores, forms m, p and l as attn_softmax does (same lane order), stages its AC_KS cache columns
 * and computes the sub-part sums Q_g (a thread per (value, sub-part), 32 heads in registers),
 * then o = 0 + Q_0 + Q_1 + ... .
 * The old kernels re-read each part from L2 once per head group (16 times at batch 1); here the
 * scores read it once per AS_HG heads (twice for 32 heads, four times where a launch takes half
 * the heads a block) and the P·c step once per AC_HG heads, in wide loads. */
/* The launch shapes (heads a scores block; heads and latent values a P·c block) change how the
 * work is spread over blocks, never a sum's order. A launch takes AS_HG, AC_HG, AC_KS, or half
 * the heads a block where that leaves fewer blocks than the card has SMs (attn_launch_split);
 * X4_CUDA_SPLIT="AS_HG,AC_HG,AC_KS" forces one of the compiled shapes (measurements). */
#define AS_HG 16
#define AS_TILE ATT_SUB
#define AC_KS 64
#define AC_HG 32
static_assert(AS_TILE == 32 && CU_ATTN_PART % AS_TILE == 0,
              "k_attn_scores assumes 32-position tiles");

/* 4 consecutive cache values as fp32, any alignment of 4 elements */
template <typename CT>
static __device__ __forceinline__ float4 cu_ld4v(const CT *p) {
        float v[4];
        cu_ld4<CT>(p, v);
        return make_float4(v[0], v[1], v[2], v[3]);
}

template <typename CT, int HG>
__global__ void __launch_bounds__(768)
        k_attn_scores(struct cu_attn a, uint32_t t0, uint32_t max_parts, struct cu_cache c,
                      uint32_t layer, float *sc) {
        static_assert(32 % HG == 0 && HG >= 4, "k_attn_scores: whole head sub-groups a warp");
        constexpr uint32_t JP = 32 / HG; /* positions a warp takes at once */
        extern __shared__ __align__(16) float as_smem[];
        __shared__ uint64_t roff[AS_TILE];
        /* rows padded with zeros to whole chunks: a zero product leaves a chain's sum as it was
         * (only the sign of a zero P_c can change, which 0 + P_0 + ... never shows) */
        uint32_t D = c.D, n_head = a.n_head, nch = (D + ATT_KC - 1) / ATT_KC;
        uint32_t stride = nch * ATT_KC + 4, nq = nch * ATT_KC / 4;
        uint32_t h0 = blockIdx.x * HG, ti = blockIdx.y, tl = blockIdx.z, t = t0 + tl;
        uint32_t pos_q = c.tok_pos[t], start = ti * AS_TILE;
        if (start > pos_q)
                return;
        uint32_t n = min(pos_q + 1 - start, (uint32_t) AS_TILE);
        uint32_t tid = threadIdx.x, cc = tid / 32, lane = tid % 32;
        uint32_t hh = lane % HG, jp = lane / HG;
        const CT *cache = (const CT *) c.base;
        if (tid < n)
                roff[tid] = cu_cache_row(c, layer, t, start + tid); /* metadata: before the wait */
        cu_pdl_wait();
        cu_pdl_trigger();

        /* this lane's query chunk: head h0 + hh, values [32 cc, 32 cc + 32) */
        float q[ATT_KC];
        {
                bool hv = h0 + hh < n_head;
                const float4 *qp = (const float4 *) (a.qc + ((uint64_t) t * n_head + h0 + (hv ? hh : 0)) * D +
                                                     cc * ATT_KC);
#pragma unroll
                for (int i = 0; i < ATT_KC / 4; i++) {
                        float4 v = hv && cc * ATT_KC + 4 * i < D ? qp[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        q[4 * i] = v.x, q[4 * i + 1] = v.y, q[4 * i + 2] = v.z, q[4 * i + 3] = v.w;
                }
        }
        __syncthreads();
        float *sC = as_smem;
#pragma unroll 8
        for (uint32_t e = tid; e < n * nq; e += blockDim.x) {
                uint32_t j = e / nq, k4 = e % nq;
                *(float4 *) &sC[j * stride + 4 * k4] = 4 * k4 < D ? cu_ld4v<CT>(cache + roff[j] + 4 * k4)
                                                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        __syncthreads();

        /* P_cc of positions jp, jp + JP, ... for head hh: one fmaf chain from 0 */
        float pc[AS_TILE / JP];
#pragma unroll
        for (int u = 0; u < (int) (AS_TILE / JP); u++) {
                uint32_t j = jp + JP * u;
                float acc = 0.0f;
                if (j < n) {
                        const float *cr = sC + j * stride + cc * ATT_KC;
#pragma unroll
                        for (int i = 0; i < ATT_KC; i += 4) {
                                float4 v = *(const float4 *) &cr[i];
                                acc = fmaf(q[i], v.x, acc);
                                acc = fmaf(q[i + 1], v.y, acc);
                                acc = fmaf(q[i + 2], v.z, acc);
                                acc = fmaf(q[i + 3], v.w, acc);
                        }
                }
                pc[u] = acc;
        }
        __syncthreads(); /* the tile is consumed: its space holds the chunk sums */
        float *sS = as_smem; /* [chunk][position][head] */
#pragma unroll
        for (int u = 0; u < (int) (AS_TILE / JP); u++)
                sS[(cc * AS_TILE + jp + JP * u) * HG + hh] = pc[u];
        __syncthreads();
        uint32_t pi = ti / (CU_ATTN_PART / AS_TILE), g = ti % (CU_ATTN_PART / AS_TILE);
        for (uint32_t e = tid; e < n * HG; e += blockDim.x) {
                uint32_t j = e / HG, x = e % HG;
                float acc = 0.0f;
                for (uint32_t k = 0; k < nch; k++)
                        acc += sS[(k * AS_TILE + j) * HG + x];
                if (h0 + x < n_head)
                        sc[(((uint64_t) tl * max_parts + pi) * n_head + h0 + x) * CU_ATTN_PART +
                           g * AS_TILE + j] = a.scale * acc;
        }
}

template <typename CT, int KS, int HG>
__global__ void __launch_bounds__(KS *(CU_ATTN_PART / ATT_SUB))
        k_attn_pv(struct cu_attn a, uint32_t t0, uint32_t max_parts, struct cu_cache c,
                  uint32_t layer, const float *sc, float *part) {
        static_assert(HG % 4 == 0 && HG <= 32 && KS % 4 == 0, "k_attn_pv: p rows of whole float4s");
        constexpr uint32_t PSTRIDE = HG + 4; /* p rows [position][head], 16-byte aligned */
        extern __shared__ __align__(16) float pv_smem[];
        float *sPT = pv_smem;                              /* p, [position][head] */
        float *sCk = pv_smem + CU_ATTN_PART * PSTRIDE; /* cache columns, then Q */
        __shared__ uint64_t roff[CU_ATTN_PART];
        uint32_t KV = a.KV, n_head = a.n_head, nhg = (n_head + HG - 1) / HG;
        uint32_t ks = blockIdx.x, pi = blockIdx.y, tl = blockIdx.z / nhg;
        uint32_t h0 = (blockIdx.z % nhg) * HG, t = t0 + tl;
        uint32_t pos_q = c.tok_pos[t];
        if (pi > pos_q / CU_ATTN_PART)
                return;
        uint32_t start = pi * CU_ATTN_PART;
        uint32_t n = min(pos_q + 1 - start, (uint32_t) CU_ATTN_PART);
        uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        const CT *cache = (const CT *) c.base;
        uint32_t nh = min((uint32_t) HG, n_head - h0);
        const float *srow = sc + (((uint64_t) tl * max_parts + pi) * n_head + h0) * CU_ATTN_PART;
        float *out0 = part + (((uint64_t) tl * max_parts + pi) * n_head) * (KV + 2);

        if (tid < n)
                roff[tid] = cu_cache_row(c, layer, t, start + tid); /* metadata: before the wait */
        cu_pdl_wait();
        cu_pdl_trigger();
#pragma unroll 8
        for (uint32_t e = tid; e < HG * n; e += blockDim.x) {
                uint32_t x = e / n, j = e % n;
                sPT[j * PSTRIDE + x] = x < nh ? srow[(uint64_t) x * CU_ATTN_PART + j] : 0.0f;
        }
        __syncthreads();
        constexpr uint32_t NQ = KS / 4;
#pragma unroll 8
        for (uint32_t e = tid; e < n * NQ; e += blockDim.x) {
                uint32_t j = e / NQ, k4 = e % NQ;
                *(float4 *) &sCk[j * KS + 4 * k4] =
                        cu_ld4v<CT>(cache + roff[j] + ks * KS + 4 * k4);
        }
        /* m, p and l per head, a warp each, in attn_softmax's order */
        for (uint32_t x = warp; x < nh; x += blockDim.x / 32) {
                float m = -INFINITY;
                for (uint32_t j = lane; j < n; j += 32)
                        m = fmaxf(m, sPT[j * PSTRIDE + x]);
                m = cu_warp_max(m);
                float l = 0.0f;
                for (uint32_t j = lane; j < n; j += 32) {
                        float p = expf(sPT[j * PSTRIDE + x] - m);
                        sPT[j * PSTRIDE + x] = p;
                        l += p;
                }
                l = cu_warp_sum(l);
                if (lane == 0 && ks == 0) {
                        out0[(uint64_t) (h0 + x) * (KV + 2) + KV] = m;
                        out0[(uint64_t) (h0 + x) * (KV + 2) + KV + 1] = l;
                }
        }
        __syncthreads();

        /* Q_g for value k = tid % KS, sub-part g = tid / KS, all heads */
        static_assert(KS * (CU_ATTN_PART / ATT_SUB) >= CU_ATTN_PART, "k_attn_pv: a thread per position for its offsets");
        uint32_t k = tid % KS, g = tid / KS;
        float acc[HG];
#pragma unroll
        for (int x = 0; x < HG; x++)
                acc[x] = 0.0f;
        uint32_t j0 = g * ATT_SUB, je = min(j0 + ATT_SUB, n);
#pragma unroll 2
        for (uint32_t j = j0; j < je; j++) {
                float cv = sCk[j * KS + k];
                const float4 *pr = (const float4 *) &sPT[j * PSTRIDE];
#pragma unroll
                for (int x4 = 0; x4 < HG / 4; x4++) {
                        float4 p = pr[x4];
                        acc[4 * x4] = fmaf(p.x, cv, acc[4 * x4]);
                        acc[4 * x4 + 1] = fmaf(p.y, cv, acc[4 * x4 + 1]);
                        acc[4 * x4 + 2] = fmaf(p.z, cv, acc[4 * x4 + 2]);
                        acc[4 * x4 + 3] = fmaf(p.w, cv, acc[4 * x4 + 3]);
                }
        }
        __syncthreads(); /* the columns are consumed: their space holds Q[g][head][value] */
#pragma unroll
        for (int x = 0; x < HG; x++)
                sCk[(g * HG + x) * KS + k] = acc[x];
        __syncthreads();
        uint32_t ng = (n + ATT_SUB - 1) / ATT_SUB;
        for (uint32_t e = tid; e < nh * KS; e += blockDim.x) {
                uint32_t x = e / KS, kk = e % KS;
                float o = 0.0f;
                for (uint32_t gg = 0; gg < ng; gg++)
                        o += sCk[(gg * HG + x) * KS + kk];
                out0[(uint64_t) (h0 + x) * (KV + 2) + ks * KS + kk] = o;
        }
}

/* Shared memory k_attn_scores needs for a row of D values (the tile, or the chunk sums). */
static size_t attn_scores_smem(uint32_t D) {
        size_t nch = (D + ATT_KC - 1) / ATT_KC;
        size_t tile = (size_t) AS_TILE * (nch * ATT_KC + 4), sums = nch * AS_TILE * AS_HG;
        return (tile > sums ? tile : sums) * sizeof(float);
}

/* Shared memory of a k_attn_pv<KS, HG> block: p rows, then the cache columns (later the Q sums). */
static constexpr size_t attn_pv_smem(int KS, int HG) {
        return (size_t) CU_ATTN_PART * (HG + 4 + KS) * sizeof(float);
}

/* The compiled launch shapes of the split path (see AS_HG above), for X4_CUDA_SPLIT. */
static const struct {
        int as_hg, ac_hg, ac_ks;
} attn_shapes[] = { { AS_HG, AC_HG, AC_KS }, { 8, 32, 64 }, { 16, 16, 64 }, { 8, 16, 64 },
                    { 16, 32, 32 }, { 8, 16, 32 }, { 16, 16, 32 } };
static int attn_shape; /* index into attn_shapes; -1: chosen a launch (attn_launch_split) */
static uint32_t attn_sms; /* the card's SMs */

template <typename CT, int KS, int HG>
static bool attn_pv_attr() {
        return cudaFuncSetAttribute(k_attn_pv<CT, KS, HG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) attn_pv_smem(KS, HG)) == cudaSuccess;
}

/* Whether the split path can run (set once by cu_attention_setup, before any graph capture:
 * cudaFuncSetAttribute is not a stream operation and has no place inside one). */
static bool attn_split_ready;
static uint32_t attn_split_D;

static bool attn_tc_setup(uint32_t KV, uint32_t R, int smem_max, int major);

extern "C" bool cu_attention_setup(uint32_t KV, uint32_t R) {
        uint32_t D = KV + R;
        int dev = 0, smem_max = 0, major = 0;
        attn_split_ready = false;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
                return false;
        int sms = 0; /* before attn_tc_setup: k_attn_dtc's launches read it too */
        attn_sms = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0
                           ? (uint32_t) sms : 132;
        attn_tc_setup(KV, R, smem_max, major);
        if (D % 4 || D == 0 || D > 24 * ATT_KC || KV % AC_KS)
                return false;
        size_t need = attn_scores_smem(D);
        if (need > (size_t) smem_max || attn_pv_smem(32, 32) > (size_t) smem_max ||
            attn_pv_smem(64, 32) > (size_t) smem_max)
                return false;
        attn_shape = -1;
        if (const char *e = getenv("X4_CUDA_SPLIT")) {
                int as = 0, ac = 0, ks = 0, found = -1;
                if (sscanf(e, "%d,%d,%d", &as, &ac, &ks) == 3)
                        for (size_t i = 0; i < sizeof attn_shapes / sizeof attn_shapes[0]; i++)
                                if (attn_shapes[i].as_hg == as && attn_shapes[i].ac_hg == ac && attn_shapes[i].ac_ks == ks)
                                        found = (int) i;
                if (found < 0)
                        fprintf(stderr, "xing4: X4_CUDA_SPLIT='%s' is not a compiled shape (AS_HG,AC_HG,AC_KS: "
                                        "16|8, 32|16, 64|32); the shape follows the launch\n",
                                e);
                else
                        attn_shape = found;
        }
        bool ok = true;
#define ATTN_SCORES_ATTR(CT, HG) \
        ok = ok && cudaFuncSetAttribute(k_attn_scores<CT, HG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need) == cudaSuccess
        ATTN_SCORES_ATTR(float, 16);
        ATTN_SCORES_ATTR(__half, 16);
        ATTN_SCORES_ATTR(float, 8);
        ATTN_SCORES_ATTR(__half, 8);
#undef ATTN_SCORES_ATTR
        ok = ok && attn_pv_attr<float, 64, 32>() && attn_pv_attr<__half, 64, 32>() &&
             attn_pv_attr<float, 64, 16>() && attn_pv_attr<__half, 64, 16>() &&
             attn_pv_attr<float, 32, 32>() && attn_pv_attr<__half, 32, 32>() &&
             attn_pv_attr<float, 32, 16>() && attn_pv_attr<__half, 32, 16>();
        if (!ok) {
                cudaGetLastError(); /* not sticky: the other kernels serve */
                return false;
        }
        attn_split_D = D;
        attn_split_ready = true;
        return true;
}

static bool attn_split_ok(const struct cu_attn *a, const struct cu_cache *c) {
        return attn_split_ready && c->D == attn_split_D && a->KV + a->R == c->D;
}

static void attn_launch_split(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts,
                              const struct cu_cache *c, uint32_t layer, float *sc, float *part,
                              cudaStream_t s) {
        uint32_t D = c->D;
        int as = AS_HG, ac = AC_HG, ks = AC_KS;
        if (attn_shape >= 0) {
                as = attn_shapes[attn_shape].as_hg, ac = attn_shapes[attn_shape].ac_hg;
                ks = attn_shapes[attn_shape].ac_ks;
        } else {
                /* fewer blocks than SMs: half the heads a block, twice the blocks (H200, full
                 * model, batch 1: 189.4 → 197.6 tok/s at 512 context, where 40 blocks each ran;
                 * at 4,096, 258 and more, the halves were slower: 156.2 → 148.7) */
                uint64_t tiles = (uint64_t) n * max_parts * (CU_ATTN_PART / AS_TILE);
                if (tiles * ((a->n_head + AS_HG - 1) / AS_HG) < attn_sms)
                        as = 8;
                if ((uint64_t) n * max_parts * (a->KV / AC_KS) * ((a->n_head + AC_HG - 1) / AC_HG) < attn_sms)
                        ac = 16;
        }
        dim3 g1((a->n_head + as - 1) / as, max_parts * (CU_ATTN_PART / AS_TILE), n);
        dim3 g2(a->KV / ks, max_parts, n * ((a->n_head + ac - 1) / ac));
        size_t sm = attn_scores_smem(D);
        uint32_t nt = (D + ATT_KC - 1) / ATT_KC * 32; /* a warp per chunk */
        uint32_t nt2 = ks * (CU_ATTN_PART / ATT_SUB);
        size_t sm2 = attn_pv_smem(ks, ac);
        cu_launches += 2;
#define ATTN_SPLIT(CT)                                                                                              \
        do {                                                                                                        \
                if (as == 8)                                                                                        \
                        cu_launch(k_attn_scores<CT, 8>, g1, nt, sm, s, *a, t0, max_parts, *c, layer, sc);           \
                else                                                                                                \
                        cu_launch(k_attn_scores<CT, 16>, g1, nt, sm, s, *a, t0, max_parts, *c, layer, sc);          \
                const float *scc = sc;                                                                              \
                if (ks == 64 && ac == 32)                                                                           \
                        cu_launch(k_attn_pv<CT, 64, 32>, g2, nt2, sm2, s, *a, t0, max_parts, *c, layer, scc, part); \
                else if (ks == 64)                                                                                  \
                        cu_launch(k_attn_pv<CT, 64, 16>, g2, nt2, sm2, s, *a, t0, max_parts, *c, layer, scc, part); \
                else if (ac == 32)                                                                                  \
                        cu_launch(k_attn_pv<CT, 32, 32>, g2, nt2, sm2, s, *a, t0, max_parts, *c, layer, scc, part); \
                else                                                                                                \
                        cu_launch(k_attn_pv<CT, 32, 16>, g2, nt2, sm2, s, *a, t0, max_parts, *c, layer, scc, part); \
        } while (0)
        if (c->f16)
                ATTN_SPLIT(__half);
        else
                ATTN_SPLIT(float);
#undef ATTN_SPLIT
}

/* ---- tensor-core attention (X4_CUDA_ATTN=tc; sm_80+) ---------------------------------------
 *
 * The same absorbed attention on mma.sync (m16n8k16, f16 inputs, fp32 accumulation), one block
 * per (token, part, 32 heads): the heads are the M dimension, so a batch-1 step at long context
 * runs on tensor cores (the fp32 kernels above are CUDA-core bound there: 32 heads × 1,088
 * multiply-adds a cached position). Its numerics are its own, not the canonical order's:
 *   - the query rows and the cache rows are rounded to f16 (the f16 cache stores them so; an f32
 *     cache is rounded when staged), TC_INPUT_TYPE;
 *   - s_j = scale · (q·c_j) accumulated in fp32 by the MMA over 16-value steps in k order;
 *   - m = max_j s_j, p_j = f16(exp(s_j − m)), l = Σ p_j (fp32: lane sums over j ≡ lane mod 32
 *     ascending, then the butterfly);
 *   - o = Σ_j p_j·c_j[k] by the MMA over 16-position steps in position order.
 * Every value of a query depends only on its own row and the cache, never on the other rows of
 * the MMA (other heads or tokens), so the kernel is batch- and chunk-invariant by itself; it is
 * used for every shape when chosen, so the bits never depend on which tokens share a step. */
#define TC_HG 32      /* heads a block (two m-tiles) */
#define TC_SUB 32     /* positions staged at a time */
#define TC_WARPS 8
#define TC_PAD 8      /* halves of padding a row: 16-byte aligned rows, conflict-free fragments */
#define TC_NT_MAX 16  /* o n-tiles (8 values) a warp: KV ≤ 4 · 16 · 8 = 512 */

static __device__ __forceinline__ void tc_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

static __device__ __forceinline__ uint32_t tc_ld32(const __half *p) {
        return *(const uint32_t *) p;
}

/* 8 consecutive cache values as f16 (row offsets and k multiples of 8) */
template <typename CT>
static __device__ __forceinline__ uint4 tc_ld8(const CT *p);
template <>
__device__ __forceinline__ uint4 tc_ld8<__half>(const __half *p) {
        return *(const uint4 *) p;
}
template <>
__device__ __forceinline__ uint4 tc_ld8<float>(const float *p) {
        float4 a = ((const float4 *) p)[0], b = ((const float4 *) p)[1];
        __half2 h0 = __floats2half2_rn(a.x, a.y), h1 = __floats2half2_rn(a.z, a.w);
        __half2 h2 = __floats2half2_rn(b.x, b.y), h3 = __floats2half2_rn(b.z, b.w);
        return make_uint4(*(uint32_t *) &h0, *(uint32_t *) &h1, *(uint32_t *) &h2, *(uint32_t *) &h3);
}

/* The pieces k_attn_tc and k_attn_tc2 share. The queries of heads h0.. as f16 rows of rq halves
 * (rows of absent heads zero). */
static __device__ __forceinline__ void tc_stage_q(__half *sQ, const struct cu_attn &a, uint32_t t,
                                                  uint32_t h0, uint32_t D, uint32_t rq) {
        const float *qrow = a.qc + (uint64_t) t * a.n_head * D;
        for (uint32_t e = threadIdx.x; e < TC_HG * (D / 8); e += blockDim.x) {
                uint32_t h = e / (D / 8), k8 = e % (D / 8);
                uint4 v = make_uint4(0, 0, 0, 0);
                if (h0 + h < a.n_head)
                        v = tc_ld8<float>(qrow + (uint64_t) (h0 + h) * D + 8 * k8);
                *(uint4 *) &sQ[h * rq + 8 * k8] = v;
        }
}

/* Cache rows s0.. of the part (TC_SUB of them, zero past n) as f16 rows of rq halves. */
template <typename CT>
static __device__ __forceinline__ void tc_stage_rows(__half *sK, const CT *cache, const uint64_t *roff,
                                                     uint32_t s0, uint32_t n, uint32_t D, uint32_t rq) {
#pragma unroll 4
        for (uint32_t e = threadIdx.x; e < TC_SUB * (D / 8); e += blockDim.x) {
                uint32_t j = e / (D / 8), k8 = e % (D / 8);
                uint4 v = make_uint4(0, 0, 0, 0);
                if (s0 + j < n)
                        v = tc_ld8<CT>(cache + roff[s0 + j] + 8 * k8);
                *(uint4 *) &sK[j * rq + 8 * k8] = v;
        }
}

/* q·c for the 16 heads of m-tile mt × the 8 staged positions of n-tile nt, over D in 16-value
 * steps: acc d0, d1 = head g, positions 2cq, 2cq + 1; d2, d3 = head g + 8. */
static __device__ __forceinline__ void tc_score_tile(const __half *sQ, const __half *sK, uint32_t mt,
                                                     uint32_t nt, uint32_t D, uint32_t rq, float *acc) {
        uint32_t lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
        const __half *qa = sQ + (mt * 16 + g) * rq + 2 * cq;
        const __half *kb = sK + (nt * 8 + g) * rq + 2 * cq;
        for (uint32_t k0 = 0; k0 < D; k0 += 16)
                tc_mma(acc, tc_ld32(qa + k0), tc_ld32(qa + 8 * rq + k0), tc_ld32(qa + k0 + 8),
                       tc_ld32(qa + 8 * rq + k0 + 8), tc_ld32(kb + k0), tc_ld32(kb + k0 + 8));
}

/* A warp's o tiles (m-tile mt, n-tiles wq, wq + SW, ...) into the part's rows: the block's first
 * HB heads (SW 8: k_attn_dtc's blocks of 16 or 8 heads, whose eight warps share one m-tile; of 8,
 * rows 8-15 of the tile are not heads of the block). */
template <uint32_t SW = 4, uint32_t HB = 32>
static __device__ __forceinline__ void tc_store_o(float *out0, const float (*o)[4], uint32_t mt,
                                                  uint32_t wq, uint32_t h0, uint32_t n_head, uint32_t KV) {
        uint32_t lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
#pragma unroll
        for (int i = 0; i < TC_NT_MAX; i++) {
                uint32_t nn = wq + SW * i;
                if (nn >= KV / 8)
                        break;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                        uint32_t h = mt * 16 + g + (e >= 2 ? 8 : 0), k = nn * 8 + 2 * cq + (e & 1);
                        if (h < HB && h0 + h < n_head)
                                out0[(uint64_t) (h0 + h) * (KV + 2) + k] = o[i][e];
                }
        }
}

/* Shared memory of k_attn_tc for rows of D values (KV of them the latent): the queries, the
 * staged keys (or the transposed values), the scores (then p, in f16). */
static size_t tc_smem(uint32_t D, uint32_t KV) {
        size_t rq = D + TC_PAD;
        size_t q = (size_t) TC_HG * rq * 2;
        size_t k = (size_t) TC_SUB * rq * 2, vt = (size_t) KV * (TC_SUB + TC_PAD) * 2;
        size_t sc = (size_t) TC_HG * (CU_ATTN_PART + 4) * 4;
        return q + (k > vt ? k : vt) + sc;
}

template <typename CT>
__global__ void __launch_bounds__(TC_WARPS * 32)
        k_attn_tc(struct cu_attn a, uint32_t t0, uint32_t max_parts, struct cu_cache c,
                  uint32_t layer, float *part) {
        extern __shared__ __align__(16) unsigned char tc_smem_raw[];
        __shared__ uint64_t roff[CU_ATTN_PART];
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t D = c.D, KV = a.KV, n_head = a.n_head, rq = D + TC_PAD;
        uint32_t nhg = (n_head + TC_HG - 1) / TC_HG;
        uint32_t pi = blockIdx.x, tl = blockIdx.z, t = t0 + tl, h0 = blockIdx.y * TC_HG;
        uint32_t pos_q = c.tok_pos[t];
        if (pi > pos_q / CU_ATTN_PART)
                return;
        (void) nhg;
        uint32_t start = pi * CU_ATTN_PART, n = min(pos_q + 1 - start, (uint32_t) CU_ATTN_PART);
        uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, cq = lane % 4;
        __half *sQ = (__half *) tc_smem_raw;                    /* [head][D + pad] */
        __half *sK = sQ + (size_t) TC_HG * rq;                   /* [position][D + pad] */
        __half *sVt = sK;                                        /* [value][TC_SUB + pad] */
        float *sS = (float *) (sK + (size_t) max((uint32_t) TC_SUB * rq, KV * (TC_SUB + TC_PAD)));
        const uint32_t ss = CU_ATTN_PART + 4;                    /* sS row stride (floats) */
        __half *sP = (__half *) sS;                              /* [head][CU_ATTN_PART + pad] */
        const uint32_t ps = CU_ATTN_PART + TC_PAD;
        const CT *cache = (const CT *) c.base;

        for (uint32_t j = tid; j < n; j += blockDim.x)
                roff[j] = cu_cache_row(c, layer, t, start + j);
        /* the queries, rounded to f16 (rows of absent heads zero) */
        tc_stage_q(sQ, a, t, h0, D, rq);

        /* scores: warp w computes the 16 heads of m-tile w % 2 × the 8 positions of n-tile w / 2
         * of each staged sub-part */
        uint32_t mt = warp % 2, nt = warp / 2;
        for (uint32_t s0 = 0; s0 < n; s0 += TC_SUB) {
                __syncthreads(); /* roff and sQ written; the previous sub-part consumed */
                tc_stage_rows<CT>(sK, cache, roff, s0, n, D, rq);
                __syncthreads();
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                tc_score_tile(sQ, sK, mt, nt, D, rq, acc);
                /* d0, d1: head g, positions 2cq, 2cq+1; d2, d3: head g + 8 */
                uint32_t j0 = s0 + nt * 8 + 2 * cq;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                        uint32_t h = mt * 16 + g + (e >= 2 ? 8 : 0), j = j0 + (e & 1);
                        if (j < CU_ATTN_PART)
                                sS[h * ss + j] = j < n ? a.scale * acc[e] : -INFINITY;
                }
        }
        __syncthreads();

        /* softmax statistics and p, a warp per head (four each) */
        float *out0 = part + (((uint64_t) tl * max_parts + pi) * n_head) * (KV + 2);
        float pv[TC_HG / TC_WARPS][CU_ATTN_PART / 32];
#pragma unroll
        for (int x = 0; x < TC_HG / TC_WARPS; x++) {
                uint32_t h = warp * (TC_HG / TC_WARPS) + x;
                float m = -INFINITY;
#pragma unroll
                for (int i = 0; i < CU_ATTN_PART / 32; i++) {
                        uint32_t j = lane + 32 * i;
                        pv[x][i] = j < n ? sS[h * ss + j] : -INFINITY;
                        m = fmaxf(m, pv[x][i]);
                }
                m = cu_warp_max(m);
                float l = 0.0f;
#pragma unroll
                for (int i = 0; i < CU_ATTN_PART / 32; i++) {
                        uint32_t j = lane + 32 * i;
                        pv[x][i] = j < n ? __half2float(__float2half_rn(expf(pv[x][i] - m))) : 0.0f;
                        l += pv[x][i];
                }
                l = cu_warp_sum(l);
                if (lane == 0 && h0 + h < n_head) {
                        out0[(uint64_t) (h0 + h) * (KV + 2) + KV] = m;
                        out0[(uint64_t) (h0 + h) * (KV + 2) + KV + 1] = l;
                }
        }
        __syncthreads(); /* every score read: p takes their place */
#pragma unroll
        for (int x = 0; x < TC_HG / TC_WARPS; x++) {
                uint32_t h = warp * (TC_HG / TC_WARPS) + x;
#pragma unroll
                for (int i = 0; i < CU_ATTN_PART / 32; i++)
                        sP[h * ps + lane + 32 * i] = __float2half_rn(pv[x][i]);
        }

        /* o = p·c over the sub-parts: warp w takes m-tile w % 2 and the n-tiles (8 values)
         * j ≡ w / 2 (mod 4) */
        uint32_t ntiles = KV / 8, wq = warp / 2;
        float o[TC_NT_MAX][4];
#pragma unroll
        for (int i = 0; i < TC_NT_MAX; i++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                        o[i][e] = 0.0f;
        const uint32_t vs = TC_SUB + TC_PAD;
        for (uint32_t s0 = 0; s0 < n; s0 += TC_SUB) {
                __syncthreads(); /* p written; the previous sub-part consumed */
                /* values of positions s0.. transposed: sVt[k][j] (zero past n) */
                for (uint32_t e = tid; e < TC_SUB * (KV / 8); e += blockDim.x) {
                        uint32_t j = e % TC_SUB, k8 = e / TC_SUB;
                        uint4 v = make_uint4(0, 0, 0, 0);
                        if (s0 + j < n)
                                v = tc_ld8<CT>(cache + roff[s0 + j] + 8 * k8);
                        const __half *hv = (const __half *) &v;
#pragma unroll
                        for (int i = 0; i < 8; i++)
                                sVt[(8 * k8 + i) * vs + j] = hv[i];
                }
                __syncthreads();
#pragma unroll
                for (uint32_t ks = 0; ks < TC_SUB; ks += 16) {
                        const __half *pa = sP + (mt * 16 + g) * ps + s0 + ks + 2 * cq;
                        uint32_t a0 = tc_ld32(pa), a1 = tc_ld32(pa + 8 * ps);
                        uint32_t a2 = tc_ld32(pa + 8), a3 = tc_ld32(pa + 8 * ps + 8);
#pragma unroll
                        for (int i = 0; i < TC_NT_MAX; i++) {
                                uint32_t nn = wq + 4 * i;
                                if (nn >= ntiles)
                                        break;
                                const __half *vb = sVt + (nn * 8 + g) * vs + ks + 2 * cq;
                                tc_mma(o[i], a0, a1, a2, a3, tc_ld32(vb), tc_ld32(vb + 8));
                        }
                }
        }
        tc_store_o(out0, o, mt, wq, h0, n_head, KV);
}

/* k_attn_tc2 (prompt-class passes by default, every token with X4_CUDA_ATTN=tc2): k_attn_tc's
 * job in one pass over the part. Each 32-position sub-part is staged once (as f16) and serves
 * as the keys and, through ldmatrix.trans, as the values (the absorbed form's values are the keys' first KV entries), so
 * the cache is read once instead of twice and the values need no transposing store. The softmax
 * runs online over the sub-parts: a head's running max m, p_j = f16(exp(s_j − m)) with the
 * sub-part's max folded in, o and l rescaled by exp(m_old − m_new) when m grows. What a part hands
 * the combine is what k_attn_tc hands it ([o | m | l], o relative to the part's max); the bits
 * are this kernel's own, and it runs for every shape when chosen (batch- and chunk-invariant by
 * itself, as k_attn_tc). */
#define TC2_SMEM_STATE (3 * TC_HG) /* per head: m, l, and the step's rescale factor */

/* Shared memory of k_attn_tc2 with TOK tokens a block: per token the queries, scores, p and
 * running statistics; one staged sub-part of cache rows. */
static size_t tc2_smem(uint32_t D, uint32_t TOK) {
        size_t rq = D + TC_PAD;
        size_t q = (size_t) TC_HG * rq * 2, k = (size_t) TC_SUB * rq * 2;
        size_t sc = (size_t) TC_HG * (TC_SUB + 4) * 4, pp = (size_t) TC_HG * (TC_SUB + TC_PAD) * 2;
        return TOK * (q + sc + pp + TC2_SMEM_STATE * 4) + k;
}

/* Two 8×8 f16 tiles of a row-major [position][value] array, transposed into a B fragment of
 * m16n8k16 (k = 16 positions from the rows given, n = 8 values): lanes 0-15 name rows. */
static __device__ __forceinline__ void tc_ldsm_x2_trans(const __half *row, uint32_t *b0, uint32_t *b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        uint32_t a = (uint32_t) __cvta_generic_to_shared(row);
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(*b0), "=r"(*b1)
                     : "r"(a));
#else
        (void) row, *b0 = 0, *b1 = 0;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

/* One online-softmax step of head h over a staged sub-part (k_attn_tc2 and k_attn_dtc), a lane a
 * position: the running max m, p = f16(exp(s − m)) into sP, l = l·alpha + Σ p (the lane
 * butterfly), alpha = exp(m_old − m_new) for o's rescale. ALIAS: sP's row h lies in sS's row h
 * (k_attn_dtc's two-blocks-an-SM layout), so a lane's p may land on a score another lane of the
 * warp has yet to read: the warp meets before the stores. */
template <bool ALIAS = false>
static __device__ __forceinline__ void tc_softmax_step(const float *sS, __half *sP, float *sM, float *sL, float *sA,
                                                       uint32_t ss, uint32_t ps, uint32_t h, uint32_t lane) {
        float sv = sS[h * ss + lane];
        float m_old = sM[h], m_new = fmaxf(m_old, cu_warp_max(sv));
        float p = __half2float(__float2half_rn(expf(sv - m_new)));
        float ps_sum = cu_warp_sum(p);
        if constexpr (ALIAS)
                __syncwarp(); /* every lane has read its score (racecheck) */
        sP[h * ps + lane] = __float2half_rn(p);
        __syncwarp(); /* every lane has read sM[h] and sL[h] (racecheck) */
        if (lane == 0) {
                float alpha = expf(m_old - m_new); /* 0 on the first step */
                sA[h] = alpha;
                sL[h] = sL[h] * alpha + ps_sum;
                sM[h] = m_new;
        }
}

/* TOK tokens a block (2 for prompt passes, 1 with X4_CUDA_ATTN_TOK=1 and otherwise): each token's 8 warps do what one token's block
 * does, and two tokens of one sequence (the same page table) share each staged sub-part, which
 * halves the cache reads and f16 conversions of a prompt. A token's rows are computed exactly as
 * alone: its sub-parts, its scores with −inf past its own positions, and the values of positions
 * past its own count enter its p·v products as zeros (the B fragments are masked, as the staging
 * zeroes them for a token alone), so the pairing never changes a bit. Two tokens of different
 * sequences take turns over the block (rounds), each with its own staging. */
template <typename CT, int TOK>
__global__ void __launch_bounds__(TOK * TC_WARPS * 32)
        k_attn_tc2(struct cu_attn a, uint32_t t0, uint32_t n_tok, uint32_t max_parts, uint32_t plen,
                   struct cu_cache c, uint32_t layer, float *part) {
        extern __shared__ __align__(16) unsigned char tc_smem_raw[];
        __shared__ uint64_t roff[CU_ATTN_PART_TC2];
        static_assert(TC_SUB == 32, "a lane a position of the sub-part in the softmax step");
        static_assert(TOK == 1 || TOK == 2, "one or two tokens a block");
        uint32_t D = c.D, KV = a.KV, n_head = a.n_head, rq = D + TC_PAD;
        uint32_t pi = blockIdx.x, h0 = blockIdx.y * TC_HG;
        uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, cq = lane % 4;
        uint32_t kt = warp / TC_WARPS, lw = warp % TC_WARPS; /* the warp's token, its warp in it */
        uint32_t start = pi * plen;
        /* the tokens: metadata, before the wait. The last tokens of a launch (the longest
         * prompt rows) take the first blocks, so the short ones fill the tail. */
        uint32_t tk[TOK], nk[TOK];
        bool any = false;
#pragma unroll
        for (int k = 0; k < TOK; k++) {
                uint32_t tl = (gridDim.z - 1 - blockIdx.z) * TOK + k;
                tk[k] = t0 + tl;
                nk[k] = 0;
                if (tl < n_tok) {
                        uint32_t pos_q = c.tok_pos[tk[k]];
                        if (pi <= pos_q / plen)
                                nk[k] = min(pos_q + 1 - start, plen);
                }
                any |= nk[k] > 0;
        }
        if (!any)
                return;
        bool together = TOK == 1 || (nk[0] && nk[TOK - 1] && c.tok_pt[tk[0]] == c.tok_pt[tk[TOK - 1]]);
        cu_pdl_wait();
        cu_pdl_trigger();
        const uint32_t ss = TC_SUB + 4, ps = TC_SUB + TC_PAD;
        const size_t tok_bytes = (size_t) TC_HG * rq * 2 + (size_t) TC_HG * ss * 4 + (size_t) TC_HG * ps * 2 +
                                 TC2_SMEM_STATE * 4;
        __half *sK = (__half *) (tc_smem_raw + TOK * tok_bytes); /* [position][D + pad]: keys and values */
        unsigned char *mine = tc_smem_raw + kt * tok_bytes;      /* this warp's token's */
        __half *sQ = (__half *) mine;                             /* [head][D + pad] */
        float *sS = (float *) (sQ + (size_t) TC_HG * rq);         /* [head][TC_SUB + 4] scores */
        __half *sP = (__half *) (sS + (size_t) TC_HG * ss);       /* [head][TC_SUB + pad] p */
        float *sM = (float *) (sP + (size_t) TC_HG * ps), *sL = sM + TC_HG, *sA = sL + TC_HG;
        const CT *cache = (const CT *) c.base;

        /* the queries, rounded to f16 (rows of absent heads zero); the running statistics */
#pragma unroll
        for (int k = 0; k < TOK; k++)
                if (nk[k]) {
                        __half *q = (__half *) (tc_smem_raw + k * tok_bytes);
                        tc_stage_q(q, a, tk[k], h0, D, rq);
                        float *m = (float *) (tc_smem_raw + k * tok_bytes + (size_t) TC_HG * rq * 2 +
                                              (size_t) TC_HG * ss * 4 + (size_t) TC_HG * ps * 2);
                        if (tid < TC_HG) {
                                m[tid] = -INFINITY;
                                m[TC_HG + tid] = 0.0f;
                        }
                }

        uint32_t mt = lw % 2, nt = lw / 2, wq = lw / 2, ntiles = KV / 8;
        uint32_t n_mine = nk[kt];
        for (uint32_t r = 0; r < (together ? 1u : (uint32_t) TOK); r++) {
                /* the tokens of this round: all of them, or token r alone */
                uint32_t lead = together ? (nk[0] ? 0 : TOK - 1) : r, n_max = 0;
#pragma unroll
                for (int k = 0; k < TOK; k++)
                        if (together || (uint32_t) k == r)
                                n_max = max(n_max, nk[k]);
                bool in = (together || kt == r) && n_mine > 0;
                __syncthreads(); /* the previous round's roff consumed */
                for (uint32_t j = tid; j < n_max; j += blockDim.x)
                        roff[j] = cu_cache_row(c, layer, tk[lead], start + j);
                float o[TC_NT_MAX][4];
#pragma unroll
                for (int i = 0; i < TC_NT_MAX; i++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                                o[i][e] = 0.0f;
                for (uint32_t s0 = 0; s0 < n_max; s0 += TC_SUB) {
                        __syncthreads(); /* the previous sub-part consumed (and sQ, roff, sM, sL written) */
                        tc_stage_rows<CT>(sK, cache, roff, s0, n_max, D, rq);
                        __syncthreads();
                        bool on = in && s0 < n_mine;
                        /* scores: warp lw, the 16 heads of m-tile lw % 2 × the 8 positions of n-tile lw / 2 */
                        if (on) {
                                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                tc_score_tile(sQ, sK, mt, nt, D, rq, acc);
                                uint32_t j0 = nt * 8 + 2 * cq;
#pragma unroll
                                for (int e = 0; e < 4; e++) {
                                        uint32_t h = mt * 16 + g + (e >= 2 ? 8 : 0), j = j0 + (e & 1);
                                        sS[h * ss + j] = s0 + j < n_mine ? a.scale * acc[e] : -INFINITY;
                                }
                        }
                        __syncthreads();
                        /* the online softmax step, a warp per four heads, a lane per position */
                        if (on) {
#pragma unroll
                                for (int x = 0; x < TC_HG / TC_WARPS; x++)
                                        tc_softmax_step(sS, sP, sM, sL, sA, ss, ps, lw * (TC_HG / TC_WARPS) + x, lane);
                        }
                        __syncthreads();
                        if (!on)
                                continue;
                        /* o = alpha·o + p·v: warp lw, m-tile lw % 2, the n-tiles (8 values) ≡ lw / 2 (mod 4) */
                        float a_lo = sA[mt * 16 + g], a_hi = sA[mt * 16 + g + 8];
#pragma unroll
                        for (int i = 0; i < TC_NT_MAX; i++) {
                                o[i][0] *= a_lo, o[i][1] *= a_lo;
                                o[i][2] *= a_hi, o[i][3] *= a_hi;
                        }
                        /* positions past this token's own (staged for its partner) enter as zeros */
                        uint32_t lim = n_mine - s0;
#pragma unroll
                        for (uint32_t ks = 0; ks < TC_SUB; ks += 16) {
                                const __half *pa = sP + (mt * 16 + g) * ps + ks + 2 * cq;
                                uint32_t a0 = tc_ld32(pa), a1 = tc_ld32(pa + 8 * ps);
                                uint32_t a2 = tc_ld32(pa + 8), a3 = tc_ld32(pa + 8 * ps + 8);
                                uint32_t p0 = ks + 2 * cq;
                                uint32_t m0 = (p0 < lim ? 0xFFFFu : 0u) | (p0 + 1 < lim ? 0xFFFF0000u : 0u);
                                uint32_t m1 = (p0 + 8 < lim ? 0xFFFFu : 0u) | (p0 + 9 < lim ? 0xFFFF0000u : 0u);
#pragma unroll
                                for (int i = 0; i < TC_NT_MAX; i++) {
                                        uint32_t nn = wq + 4 * i;
                                        if (nn >= ntiles)
                                                break;
                                        uint32_t b0, b1;
                                        tc_ldsm_x2_trans(sK + (ks + lane % 16) * rq + nn * 8, &b0, &b1);
                                        if (TOK > 1)
                                                b0 &= m0, b1 &= m1;
                                        tc_mma(o[i], a0, a1, a2, a3, b0, b1);
                                }
                        }
                }
                /* [o | m | l] of the part; d0, d1: head g, values 2cq, 2cq+1 of the n-tile; d2, d3: g + 8 */
                if (in) {
                        float *out0 = part + (((uint64_t) (tk[kt] - t0) * max_parts + pi) * n_head) * (KV + 2);
                        tc_store_o(out0, o, mt, wq, h0, n_head, KV);
                        uint32_t tt = tid - kt * TC_WARPS * 32;
                        if (tt < TC_HG && h0 + tt < n_head) {
                                out0[(uint64_t) (h0 + tt) * (KV + 2) + KV] = sM[tt];
                                out0[(uint64_t) (h0 + tt) * (KV + 2) + KV + 1] = sL[tt];
                        }
                }
        }
}

/* k_attn_fa (prompt-class passes with X4_CUDA_ATTN_PROMPT=fa; not yet the default): the prompt
 * attention as one tile of two tokens' 64 query rows (32 head slots each) a block of 8 warps,
 * parts of attn_tc2_part() positions as k_attn_tc2, [o | m | l] a part for the same combine.
 * Against k_attn_tc2 with two tokens (two 8-warp groups, a 16 × 8 score tile a warp as one chain
 * of D/16 mma, four block barriers a sub-part, synchronous staging):
 * - warp w owns m-tile w / 2 (16 rows of one token) and half w % 2: for the scores the half of D's
 *   k-steps (two warps' partial sums added in a fixed order, half 0 then half 1), for p·v the
 *   half of the KV values (o: 16 × KV/2 in registers, up to 128 floats a lane);
 * - a score tile is 16 rows × the 32 staged positions (four independent mma chains a warp),
 *   operands by ldmatrix; the two warps of an m-tile meet at a named barrier of their own;
 * - the next sub-part is copied by cp.async while the current one computes (f16 cache: two
 *   staging buffers; f32: one raw f32 buffer, converted to f16 after the block's barrier).
 * A row's arithmetic depends on its own token only (partner-free, as k_attn_tc2): scores past its
 * count are −inf, values past it enter p·v as masked zeros, sub-parts past it are skipped by the
 * warps of its m-tiles. Its bits differ from k_attn_tc2's (the score sums are split), so the
 * choice is one per process. */
#define FA_WARPS 8
#define FA_ROWS (2 * TC_HG) /* two tokens × 32 head slots: four m-tiles */
#define FA_SUB 32           /* positions a staged sub-part */
#define FA_NT_MAX 32        /* o n-tiles (8 values) a warp: KV / 2 ≤ 256 */
#define FA_XS (FA_SUB + 4)  /* partial-score row stride (floats) */
#define FA_PS (FA_SUB + TC_PAD) /* p row stride (halves) */

/* Shared memory of k_attn_fa (rows of D values, KV of them the latent) for cache type f16 (two
 * staging buffers) or f32 (one f16 buffer and one raw f32 buffer). */
static size_t fa_smem(uint32_t D, bool f16) {
        size_t rq = D + TC_PAD;
        size_t q = (size_t) FA_ROWS * rq * 2, k = (size_t) FA_SUB * rq * 2;
        size_t x = (size_t) 4 * 16 * FA_XS * 4, p = (size_t) 4 * 16 * FA_PS * 2, al = 4 * 16 * 4;
        size_t raw = f16 ? k : (size_t) FA_SUB * D * 4;
        return q + k + raw + x + p + al;
}

/* 16 bytes global → shared by cp.async, or 16 zero bytes where !valid (src-size 0 reads nothing) */
static __device__ __forceinline__ void fa_cp16(void *smem, const void *gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        uint32_t s = (uint32_t) __cvta_generic_to_shared(smem);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0)
                     : "memory");
#else
        (void) smem, (void) gmem, (void) valid;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

/* the two warps of m-tile mt (64 threads) meet: named barrier 1 + mt */
static __device__ __forceinline__ void fa_pair_sync(uint32_t mt) {
        asm volatile("bar.sync %0, 64;\n" ::"r"(1 + mt) : "memory");
}

/* Copies of sub-part s0 (rows past n zero): f16 rows into the staging buffer dst, or f32 rows raw
 * into the raw buffer (rows of D floats). One cp.async group. */
template <typename CT>
static __device__ __forceinline__ void fa_issue(void *dst, const CT *cache, const uint64_t *roff, uint32_t s0,
                                                uint32_t n, uint32_t D, uint32_t rq) {
        constexpr uint32_t per = 16 / sizeof(CT); /* values a copy */
        uint32_t cpr = D / per;
        for (uint32_t e = threadIdx.x; e < FA_SUB * cpr; e += blockDim.x) {
                uint32_t j = e / cpr, k = e % cpr;
                bool v = s0 + j < n;
                const CT *src = cache + (v ? roff[s0 + j] : 0) + per * k;
                if constexpr (sizeof(CT) == 2)
                        fa_cp16((__half *) dst + (size_t) j * rq + per * k, src, v);
                else
                        fa_cp16((float *) dst + (size_t) j * D + per * k, src, v);
        }
        mtd_commit();
}

template <typename CT>
__global__ void __launch_bounds__(FA_WARPS * 32, 1)
        k_attn_fa(struct cu_attn a, uint32_t t0, uint32_t n_tok, uint32_t max_parts, uint32_t plen,
                  struct cu_cache c, uint32_t layer, float *part) {
        extern __shared__ __align__(16) unsigned char tc_smem_raw[];
        __shared__ uint64_t roff[CU_ATTN_PART_TC2];
        static_assert(FA_SUB == 32 && FA_WARPS == 8, "four m-tiles of two warps; four n-tiles a score tile");
        constexpr bool F16 = sizeof(CT) == 2;
        uint32_t D = c.D, KV = a.KV, n_head = a.n_head, rq = D + TC_PAD;
        uint32_t pi = blockIdx.x, h0 = blockIdx.y * TC_HG, start = pi * plen;
        uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, cq = lane % 4;
        uint32_t mt = warp / 2, kh = warp % 2, kt = mt / 2; /* m-tile, half, its token */
        /* the tokens (the launch's last first, as k_attn_tc2): metadata, before the wait */
        uint32_t tk[2], nk[2];
        bool any = false;
#pragma unroll
        for (int k = 0; k < 2; k++) {
                uint32_t tl = (gridDim.z - 1 - blockIdx.z) * 2 + k;
                tk[k] = t0 + tl;
                nk[k] = 0;
                if (tl < n_tok) {
                        uint32_t pos_q = c.tok_pos[tk[k]];
                        if (pi <= pos_q / plen)
                                nk[k] = min(pos_q + 1 - start, plen);
                }
                any |= nk[k] > 0;
        }
        if (!any)
                return;
        bool together = nk[0] && nk[1] && c.tok_pt[tk[0]] == c.tok_pt[tk[1]];
        cu_pdl_wait();
        cu_pdl_trigger();
        __half *sQ = (__half *) tc_smem_raw;                          /* [row][D + pad] */
        __half *sK0 = sQ + (size_t) FA_ROWS * rq;                     /* [position][D + pad] */
        unsigned char *sB = (unsigned char *) (sK0 + (size_t) FA_SUB * rq); /* f16: 2nd buffer; f32: raw */
        float *sX = (float *) (sB + (F16 ? (size_t) FA_SUB * rq * 2 : (size_t) FA_SUB * D * 4));
        __half *sP = (__half *) (sX + 4 * 16 * FA_XS);
        float *sA = (float *) (sP + 4 * 16 * FA_PS);
        const CT *cache = (const CT *) c.base;

#pragma unroll
        for (int k = 0; k < 2; k++)
                if (nk[k])
                        tc_stage_q(sQ + (size_t) k * TC_HG * rq, a, tk[k], h0, D, rq);

        uint32_t KS = D / 16, khalf = (KS + 1) / 2, k_lo = kh ? khalf : 0, k_hi = kh ? KS : khalf;
        uint32_t nth = KV / 16; /* o n-tiles of a half */
        uint32_t n_mine = nk[kt];
        float *xr = sX + (size_t) mt * 16 * FA_XS;
        __half *pr = sP + (size_t) mt * 16 * FA_PS;
        for (uint32_t r = 0; r < (together ? 1u : 2u); r++) {
                uint32_t lead = together ? 0 : r, n_max = together ? max(nk[0], nk[1]) : nk[r];
                bool in = (together || kt == r) && n_mine > 0;
                __syncthreads(); /* sQ written; the previous round's roff and buffers consumed */
                if (n_max == 0)
                        continue;
                for (uint32_t j = tid; j < n_max; j += blockDim.x)
                        roff[j] = cu_cache_row(c, layer, tk[lead], start + j);
                __syncthreads();
                fa_issue<CT>(F16 ? (void *) sK0 : (void *) sB, cache, roff, 0, n_max, D, rq);
                float o[FA_NT_MAX][4] = {};
                float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
                uint32_t it = 0;
                for (uint32_t s0 = 0; s0 < n_max; s0 += FA_SUB, it++) {
                        mtd_wait(0);
                        __syncthreads(); /* sub-part s0 landed; the buffer it will overwrite is consumed */
                        __half *sK;
                        if constexpr (F16) {
                                sK = (it & 1) ? (__half *) sB : sK0;
                                if (s0 + FA_SUB < n_max)
                                        fa_issue<CT>((it & 1) ? (void *) sK0 : (void *) sB, cache, roff, s0 + FA_SUB,
                                                     n_max, D, rq);
                        } else {
                                sK = sK0;
                                const float *raw = (const float *) sB;
                                for (uint32_t e = tid; e < FA_SUB * (D / 8); e += blockDim.x) {
                                        uint32_t j = e / (D / 8), k8 = e % (D / 8);
                                        *(uint4 *) &sK[(size_t) j * rq + 8 * k8] = tc_ld8<float>(raw + (size_t) j * D + 8 * k8);
                                }
                                __syncthreads(); /* converted; the raw buffer is free */
                                if (s0 + FA_SUB < n_max)
                                        fa_issue<CT>(sB, cache, roff, s0 + FA_SUB, n_max, D, rq);
                        }
                        if (!in || s0 >= n_mine)
                                continue; /* a warp pair skips together: same token */
                        uint32_t lim = n_mine - s0; /* positions of this row's own in the sub-part */
                        /* partial scores: 16 rows × 32 positions over this half's k-steps */
                        float acc[4][4] = {};
                        const __half *qa = sQ + (size_t) (mt * 16 + lane % 16) * rq + (lane / 16) * 8;
                        const __half *kb = sK + (size_t) ((lane / 16) * 8 + lane % 8) * rq + ((lane / 8) % 2) * 8;
                        for (uint32_t ks = k_lo; ks < k_hi; ks++) {
                                uint32_t af[4], b01[4], b23[4];
                                mtp_ldm4(af, qa + 16 * ks);
                                mtp_ldm4(b01, kb + 16 * ks);
                                mtp_ldm4(b23, kb + (size_t) 16 * rq + 16 * ks);
                                tc_mma(acc[0], af[0], af[1], af[2], af[3], b01[0], b01[1]);
                                tc_mma(acc[1], af[0], af[1], af[2], af[3], b01[2], b01[3]);
                                tc_mma(acc[2], af[0], af[1], af[2], af[3], b23[0], b23[1]);
                                tc_mma(acc[3], af[0], af[1], af[2], af[3], b23[2], b23[3]);
                        }
                        if (kh == 1) {
#pragma unroll
                                for (int j = 0; j < 4; j++)
#pragma unroll
                                        for (int e = 0; e < 4; e++)
                                                xr[(g + (e >= 2 ? 8 : 0)) * FA_XS + j * 8 + 2 * cq + (e & 1)] = acc[j][e];
                        }
                        fa_pair_sync(mt); /* half 1's partial scores written */
                        if (kh == 0) {
                                /* the online softmax step: rows g (e 0, 1) and g + 8 (e 2, 3), a quad a row */
                                float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
                                for (int j = 0; j < 4; j++)
#pragma unroll
                                        for (int e = 0; e < 4; e++) {
                                                uint32_t col = j * 8 + 2 * cq + (e & 1);
                                                float v = acc[j][e] + xr[(g + (e >= 2 ? 8 : 0)) * FA_XS + col];
                                                acc[j][e] = col < lim ? a.scale * v : -INFINITY;
                                                if (e < 2)
                                                        mx_lo = fmaxf(mx_lo, acc[j][e]);
                                                else
                                                        mx_hi = fmaxf(mx_hi, acc[j][e]);
                                        }
                                mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
                                mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
                                mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
                                mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
                                float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
                                float s_lo = 0.0f, s_hi = 0.0f;
#pragma unroll
                                for (int j = 0; j < 4; j++)
#pragma unroll
                                        for (int e = 0; e < 4; e++) {
                                                float p = __half2float(__float2half_rn(expf(acc[j][e] - (e < 2 ? mn_lo : mn_hi))));
                                                if (e < 2)
                                                        s_lo += p;
                                                else
                                                        s_hi += p;
                                                pr[(g + (e >= 2 ? 8 : 0)) * FA_PS + j * 8 + 2 * cq + (e & 1)] = __float2half_rn(p);
                                        }
                                s_lo += __shfl_xor_sync(0xffffffffu, s_lo, 1);
                                s_lo += __shfl_xor_sync(0xffffffffu, s_lo, 2);
                                s_hi += __shfl_xor_sync(0xffffffffu, s_hi, 1);
                                s_hi += __shfl_xor_sync(0xffffffffu, s_hi, 2);
                                float al_lo = expf(m_lo - mn_lo), al_hi = expf(m_hi - mn_hi); /* 0 on the first step */
                                l_lo = l_lo * al_lo + s_lo, l_hi = l_hi * al_hi + s_hi;
                                m_lo = mn_lo, m_hi = mn_hi;
                                if (cq == 0) {
                                        sA[mt * 16 + g] = al_lo;
                                        sA[mt * 16 + g + 8] = al_hi;
                                }
                        }
                        fa_pair_sync(mt); /* p and the rescale factors written; the partial scores read */
                        /* o = alpha·o + p·v over this half's values */
                        float a_lo = sA[mt * 16 + g], a_hi = sA[mt * 16 + g + 8];
#pragma unroll
                        for (int i = 0; i < FA_NT_MAX; i++) {
                                o[i][0] *= a_lo, o[i][1] *= a_lo;
                                o[i][2] *= a_hi, o[i][3] *= a_hi;
                        }
#pragma unroll
                        for (uint32_t ks = 0; ks < FA_SUB; ks += 16) {
                                uint32_t af[4];
                                mtp_ldm4(af, pr + (size_t) (lane % 16) * FA_PS + ks + (lane / 16) * 8);
                                uint32_t p0 = ks + 2 * cq;
                                uint32_t m0 = (p0 < lim ? 0xFFFFu : 0u) | (p0 + 1 < lim ? 0xFFFF0000u : 0u);
                                uint32_t m1 = (p0 + 8 < lim ? 0xFFFFu : 0u) | (p0 + 9 < lim ? 0xFFFF0000u : 0u);
                                const __half *vb = sK + (size_t) (ks + lane % 16) * rq + (kh * nth + lane / 16) * 8;
#pragma unroll
                                for (int i = 0; i < FA_NT_MAX; i += 2) {
                                        if ((uint32_t) i >= nth)
                                                break;
                                        uint32_t b[4];
                                        mtp_ldm4<true>(b, vb + 8 * i);
                                        tc_mma(o[i], af[0], af[1], af[2], af[3], b[0] & m0, b[1] & m1);
                                        tc_mma(o[i + 1], af[0], af[1], af[2], af[3], b[2] & m0, b[3] & m1);
                                }
                        }
                }
                /* [o | m | l] of the part: this half's values; half 0 the statistics */
                if (in) {
                        float *out0 = part + (((uint64_t) (tk[kt] - t0) * max_parts + pi) * n_head) * (KV + 2);
                        uint32_t hb = (mt % 2) * 16 + g;
#pragma unroll
                        for (int i = 0; i < FA_NT_MAX; i++) {
                                if ((uint32_t) i >= nth)
                                        break;
#pragma unroll
                                for (int e = 0; e < 4; e++) {
                                        uint32_t h = hb + (e >= 2 ? 8 : 0), k = (kh * nth + i) * 8 + 2 * cq + (e & 1);
                                        if (h0 + h < n_head)
                                                out0[(uint64_t) (h0 + h) * (KV + 2) + k] = o[i][e];
                                }
                        }
                        if (kh == 0 && cq == 0) {
                                if (h0 + hb < n_head) {
                                        out0[(uint64_t) (h0 + hb) * (KV + 2) + KV] = m_lo;
                                        out0[(uint64_t) (h0 + hb) * (KV + 2) + KV + 1] = l_lo;
                                }
                                if (h0 + hb + 8 < n_head) {
                                        out0[(uint64_t) (h0 + hb + 8) * (KV + 2) + KV] = m_hi;
                                        out0[(uint64_t) (h0 + hb + 8) * (KV + 2) + KV + 1] = l_hi;
                                }
                        }
                }
        }
}

/* ---- decode attention on tensor cores (k_attn_dtc: decode-class passes with the f16 cache) -----
 *
 * k_attn_tc2's arithmetic for one token a block, shaped for decode: the same sub-parts of TC_SUB
 * positions, the same f16 queries, scores, online softmax (max, p = f16(exp(s − m)), l by the
 * lane butterfly, o and l rescaled by exp(m_old − m_new)) and p·v chains, so its [o | m | l] rows
 * are k_attn_tc2's for the same part length, bit for bit (GPU test "decode attention on tensor
 * cores equals k_attn_tc2"). What differs is the shape:
 *   - parts whose length follows the query's position (cu_dtc_plen: 64 to CU_ATTN_PART_DEC = 256;
 *     X4_CUDA_ATTN_DECODE_PART forces one): a 32K context is 128 blocks, one wave on the H200,
 *     where k_attn_tc2's 1,024 gave 32, and a 512-token one 9;
 *   - the cache rows go global → shared by cp.async through a ring of NS sub-parts (up to three
 *     in flight while one computes) instead of a staging loop that waits for its loads;
 *   - the row offsets are computed from the step's metadata before the PDL wait;
 *   - three barriers a sub-part (copies landed; scores written; p written).
 * It reads f16 rows only: an f32 cache keeps the fp32 kernels (the exact path, 1e-3 of float64).
 *
 * LEAN (k_attn_dtc<2, false, true>, batch decode: grids of at least two blocks an SM, or
 * X4_CUDA_DTC_2SM=1): the same chains in the same order in a layout small enough for two blocks
 * an SM (the full model: 113,536 bytes + roff's 2,048 against the H200's 115,712 a block of two),
 * so one block's barriers and copy waits hide behind the other's mma:
 *   - one sub-part a round, a ring of two;
 *   - a ring slot holds the c-part of its rows (the first KV values, the only ones p·v reads);
 *     the rope keys (the last R) go to one buffer the slots share: only the score chains read
 *     them, and those are done at the scores barrier, behind which the next copy is issued;
 *   - p lives in the first half of the scores' rows (a row of 36 floats is 72 halves: 16-byte
 *     aligned, conflict-free for ldmatrix): the softmax step reads a row's scores before any p
 *     of that row lands (tc_softmax_step<true>), and the next scores come after p·v's barrier.
 *
 * HG = 16 or 8 (small head groups, small grids: X4_CUDA_DTC_HG): a block of 16 or 8 heads, one
 * m-tile, two or four times the blocks where a batch-1 step's few parts leave most SMs idle. The
 * eight warps share the m-tile: the scores' four n-tiles on warps 0-3 (in rounds of two sub-parts,
 * warps 4-7 take the second sub-part's), o's 64 n-tiles eight a warp; of 8 heads, the tile's rows
 * 8-15 are zero queries with p 0, never stored. Every score, p and o value is the same chain as
 * in a block of 32 heads (rows of an mma never mix), so the choice never changes a bit. */
#define DTC_NS_MAX 4
#define DTC_LEAN_NS 2 /* the lean layout's ring */

/* Shared memory of k_attn_dtc with a ring of ns sub-parts, g sub-parts a round, hg heads a block:
 * queries, scores, p, running state. */
static size_t dtc_smem(uint32_t D, int ns, int g = 1, size_t hg = TC_HG) {
        size_t rq = D + TC_PAD;
        return hg * rq * 2 + hg * (g * TC_SUB + 4) * 4 + hg * (g * TC_SUB + TC_PAD) * 2 + (size_t) (2 + g) * hg * 4 +
               (size_t) ns * TC_SUB * rq * 2;
}

/* Shared memory of k_attn_dtc's lean layout (DTC_LEAN_NS c-parts of KV values a row, one rope-key
 * buffer, p inside the scores): queries, scores, running state, rope keys, ring. */
static size_t dtc_lean_smem(uint32_t D, uint32_t KV) {
        size_t rq = D + TC_PAD;
        return (size_t) TC_HG * rq * 2 + (size_t) TC_HG * (TC_SUB + 4) * 4 + (size_t) 3 * TC_HG * 4 +
               (size_t) TC_SUB * (D - KV + TC_PAD) * 2 + (size_t) DTC_LEAN_NS * TC_SUB * (KV + TC_PAD) * 2;
}

/* One score chain of k_attn_dtc's full layout: acc = the 16 heads of m-tile mt of sQ × the 8
 * positions of n-tile nt of the staged sub-part sK, over D in 16-value steps (tc_score_tile's
 * fragments, by ldmatrix: A four 8×8 tiles of the queries a step, B two steps of the keys a load;
 * 32 values a step while they fit, then 16). */
static __device__ __forceinline__ void dtc_score(float *acc, const __half *sQ, const __half *sK, uint32_t mt, uint32_t nt,
                                                 uint32_t D, uint32_t rq, uint32_t lane) {
        uint32_t g = lane / 4, cq = lane % 4;
        const __half *qa = sQ + (size_t) (mt * 16 + lane % 16) * rq + (lane / 16) * 8;
        const __half *kb = sK + (size_t) (nt * 8 + lane % 8) * rq + (lane / 8) * 8;
        uint32_t k0 = 0;
#pragma unroll 2
        for (; k0 + 32 <= D; k0 += 32) {
                uint32_t qf0[4], qf1[4], kf[4];
                mtp_ldm4(qf0, qa + k0);
                mtp_ldm4(qf1, qa + k0 + 16);
                mtp_ldm4(kf, kb + k0);
                tc_mma(acc, qf0[0], qf0[1], qf0[2], qf0[3], kf[0], kf[1]);
                tc_mma(acc, qf1[0], qf1[1], qf1[2], qf1[3], kf[2], kf[3]);
        }
        for (; k0 < D; k0 += 16) {
                uint32_t qf[4];
                mtp_ldm4(qf, qa + k0);
                const __half *kr = sK + (size_t) (nt * 8 + g) * rq + 2 * cq + k0;
                tc_mma(acc, qf[0], qf[1], qf[2], qf[3], tc_ld32(kr), tc_ld32(kr + 8));
        }
}

/* o = alpha·o + p·v over one staged sub-part (k_attn_dtc): warp w, m-tile mt, the n-tiles (8
 * values) wq, wq + SW, ... (a block of 32 heads: mt = w % 2, wq = w / 2, SW 4; of 16: mt 0, wq = w,
 * SW 8); p the sub-part's columns of sP (rows of ps halves), alpha its factors. A factor of 1 leaves
 * o as it is (x·1 = x), so a warp whose 16 heads kept their max skips the multiplies. Each o value
 * is the same chain whichever warp holds it. */
template <uint32_t SW = 4>
static __device__ __forceinline__ void dtc_pv(float (*o)[4], const __half *sP, uint32_t ps, const float *sA,
                                              const __half *sK, uint32_t rq, uint32_t mt, uint32_t wq,
                                              uint32_t ntiles, uint32_t lane) {
        uint32_t g = lane / 4;
        float a_lo = sA[mt * 16 + g], a_hi = sA[mt * 16 + g + 8];
        if (__any_sync(CU_FULL_MASK, a_lo != 1.0f || a_hi != 1.0f)) {
#pragma unroll
                for (int i = 0; i < TC_NT_MAX; i++) {
                        o[i][0] *= a_lo, o[i][1] *= a_lo;
                        o[i][2] *= a_hi, o[i][3] *= a_hi;
                }
        }
#pragma unroll
        for (uint32_t ks = 0; ks < TC_SUB; ks += 16) {
                uint32_t pf[4];
                mtp_ldm4(pf, sP + (size_t) (mt * 16 + lane % 16) * ps + ks + (lane / 16) * 8);
                /* B of n-tiles nn (lanes 0-15's rows) and nn + SW (lanes 16-31's), transposed */
                const __half *vb = sK + (size_t) (ks + lane % 16) * rq + (lane / 16) * (8 * SW) + wq * 8;
#pragma unroll
                for (int i = 0; i < TC_NT_MAX; i += 2) {
                        uint32_t nn = wq + SW * i;
                        if (nn >= ntiles)
                                break;
                        if (nn + SW < ntiles) {
                                uint32_t vf[4];
                                mtp_ldm4<true>(vf, vb + 8 * SW * i);
                                tc_mma(o[i], pf[0], pf[1], pf[2], pf[3], vf[0], vf[1]);
                                tc_mma(o[i + 1], pf[0], pf[1], pf[2], pf[3], vf[2], vf[3]);
                        } else {
                                uint32_t b0, b1;
                                tc_ldsm_x2_trans(sK + (ks + lane % 16) * rq + nn * 8, &b0, &b1);
                                tc_mma(o[i], pf[0], pf[1], pf[2], pf[3], b0, b1);
                        }
                }
        }
}

template <int NS, bool PAIR, bool LEAN = false, int HG = TC_HG>
__global__ void __launch_bounds__(TC_WARPS * 32, LEAN ? 2 : 1)
        k_attn_dtc(struct cu_attn a, uint32_t t0, uint32_t max_parts, uint32_t plen_forced, struct cu_cache c,
                   uint32_t layer, float *part) {
        static_assert(NS >= 2 && NS <= DTC_NS_MAX, "a sub-part computes while the next ones copy");
        static_assert(!PAIR || NS == 4, "rounds of two sub-parts: two rounds in the ring");
        static_assert(!LEAN || (!PAIR && NS == DTC_LEAN_NS), "the lean layout: one sub-part a round, its own ring");
        static_assert(TC_SUB == 32, "a lane a position of the sub-part in the softmax step");
        static_assert(HG == TC_HG || ((HG == 16 || HG == 8) && !LEAN), "small head groups: one m-tile, not LEAN");
        /* HG 16 or 8: one m-tile the eight warps share, MR rows of queries, scores, p and state (of
         * 8 heads: rows 8-15 zero queries, p and factors of 1, never stored) */
        constexpr bool ONE_MT = HG < TC_HG;
        constexpr uint32_t MR = HG < 16 ? 16 : HG;
        extern __shared__ __align__(16) unsigned char tc_smem_raw[];
        __shared__ uint64_t roff[CU_ATTN_PART_DEC];
        uint32_t D = c.D, KV = a.KV, n_head = a.n_head, rq = D + TC_PAD;
        uint32_t pi = blockIdx.x, tl = blockIdx.z, t = t0 + tl, h0 = blockIdx.y * HG;
        uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, cq = lane % 4;
        /* X4_CUDA_L2PF: every block of the grid, those past the query's parts too */
        cu_l2_prefetch(a.pf, cu_block_flat(), cu_blocks(), tid, TC_WARPS * 32);
        /* metadata (host-copied, never written by a kernel): before the wait */
        uint32_t pos_q = c.tok_pos[t], plen = cu_dtc_plen(pos_q, plen_forced);
        if (pi > pos_q / plen)
                return;
        uint32_t start = pi * plen, n = min(pos_q + 1 - start, plen), nsub = (n + TC_SUB - 1) / TC_SUB;
        for (uint32_t j = tid; j < n; j += blockDim.x)
                roff[j] = cu_cache_row(c, layer, t, start + j);
        cu_pdl_wait();
        cu_pdl_trigger();
        constexpr uint32_t G = PAIR ? 2 : 1; /* sub-parts a round */
        /* LEAN: p in the scores' rows (ps = 2·ss halves), ring slots of KV values a row (rk) and
         * the rope keys' buffer sR (rows of R + pad) */
        const uint32_t ss = G * TC_SUB + 4, ps = LEAN ? 2 * ss : G * TC_SUB + TC_PAD;
        const uint32_t rk = LEAN ? KV + TC_PAD : rq, rr = D - KV + TC_PAD;
        __half *sQ = (__half *) tc_smem_raw;               /* [head][D + pad] */
        float *sS = (float *) (sQ + (size_t) MR * rq);     /* [head][G · TC_SUB + 4] scores */
        __half *sP = LEAN ? (__half *) sS : (__half *) (sS + (size_t) MR * ss); /* [head][G · TC_SUB + pad] p */
        float *sM = LEAN ? sS + (size_t) MR * ss : (float *) (sP + (size_t) MR * ps), *sL = sM + MR,
              *sA = sL + MR;                               /* sA: G rows */
        __half *sR = (__half *) (sA + G * MR);            /* LEAN: [position][R + pad] rope keys */
        __half *ring = LEAN ? sR + (size_t) TC_SUB * rr : sR; /* NS × [position][D + pad] (LEAN: KV + pad) */
        const size_t slot = (size_t) TC_SUB * rk;
        const __half *cache = (const __half *) c.base;
        const uint32_t cpr = D / 8; /* 16-byte copies a row */
        __syncthreads();           /* roff written */

        /* sub-part s into its ring slot (rows past n zero), one cp.async group (empty past the end):
         * thread tid copies row tid / 8, the 16-byte pieces ≡ tid (mod 8) */
        static_assert(TC_SUB * 8 == TC_WARPS * 32, "eight threads a row");
        const uint32_t crow = tid / 8, ck0 = tid % 8;
        auto issue = [&](uint32_t s) {
                if (s < nsub) {
                        uint32_t j = s * TC_SUB + crow;
                        bool v = j < n;
                        const __half *src = cache + (v ? roff[j] : 0);
                        __half *dst = ring + (s % NS) * slot + (size_t) crow * rk;
                        for (uint32_t k = ck0; k < cpr; k += 8) {
                                __half *d = dst + 8 * k;
                                if constexpr (LEAN)
                                        if (8 * k >= KV) /* a rope key: the shared buffer */
                                                d = sR + (size_t) crow * rr + (8 * k - KV);
                                fa_cp16(d, src + 8 * k, v);
                        }
                }
                mtd_commit();
        };
        /* the queries, rounded to f16 (rows of absent heads zero), as tc_stage_q: thread tid takes
         * head tid / 8 and the 8-value pieces ≡ tid (mod 8), its loads issued before any store;
         * the running statistics */
        auto stage_q = [&]() {
                constexpr int QP = 12; /* pieces a thread at most in one round (D ≤ 768 in one) */
                uint32_t h = tid / 8;
                if (h >= MR) /* ONE_MT: the first 128 threads */
                        return;
                bool hv = h < (uint32_t) HG && h0 + h < n_head;
                const float *qrow = a.qc + ((uint64_t) t * n_head + h0 + (hv ? h : 0)) * D;
                for (uint32_t k1 = ck0; k1 < cpr; k1 += 8 * QP) {
                        float4 v[QP][2];
#pragma unroll
                        for (int i = 0; i < QP; i++)
                                if (hv && k1 + 8 * i < cpr) {
                                        v[i][0] = ((const float4 *) (qrow + 8 * (k1 + 8 * i)))[0];
                                        v[i][1] = ((const float4 *) (qrow + 8 * (k1 + 8 * i)))[1];
                                }
#pragma unroll
                        for (int i = 0; i < QP; i++)
                                if (k1 + 8 * i < cpr) {
                                        uint4 u = make_uint4(0, 0, 0, 0);
                                        if (hv) {
                                                __half2 h0v = __floats2half2_rn(v[i][0].x, v[i][0].y);
                                                __half2 h1v = __floats2half2_rn(v[i][0].z, v[i][0].w);
                                                __half2 h2v = __floats2half2_rn(v[i][1].x, v[i][1].y);
                                                __half2 h3v = __floats2half2_rn(v[i][1].z, v[i][1].w);
                                                u = make_uint4(*(uint32_t *) &h0v, *(uint32_t *) &h1v, *(uint32_t *) &h2v,
                                                               *(uint32_t *) &h3v);
                                        }
                                        *(uint4 *) &sQ[(size_t) h * rq + 8 * (k1 + 8 * i)] = u;
                                }
                }
                if (tid < MR) {
                        sM[tid] = -INFINITY;
                        sL[tid] = 0.0f;
                }
                /* 8 heads: the tile's other rows p 0 and factors 1 (no softmax step writes them) */
                if (HG < MR && tid >= HG && tid < MR) {
                        for (uint32_t j = 0; j < ps; j++)
                                sP[tid * ps + j] = __float2half_rn(0.0f);
                        for (uint32_t r = 0; r < G; r++)
                                sA[r * MR + tid] = 1.0f;
                }
        };

        /* warp roles: 32 heads, m-tile w % 2 and n-tile w / 2 of the scores, o's n-tiles ≡ w / 2
         * (mod 4); ONE_MT: m-tile 0, n-tile w % 4 of the scores (warps 4-7: of a round's second
         * sub-part, or none), o's n-tiles ≡ w (mod 8) */
        constexpr uint32_t SW = ONE_MT ? 8 : 4;
        uint32_t mt = ONE_MT ? 0 : warp % 2, nt = ONE_MT ? warp % 4 : warp / 2, wq = ONE_MT ? warp : warp / 2,
                 ntiles = KV / 8;
        float o[TC_NT_MAX][4];
#pragma unroll
        for (int i = 0; i < TC_NT_MAX; i++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                        o[i][e] = 0.0f;
        if constexpr (!PAIR) {
#pragma unroll 1
        for (uint32_t s = 0; s + 1 < (uint32_t) NS; s++)
                issue(s);
        stage_q();
#pragma unroll 1
        for (uint32_t s = 0; s < nsub; s++) {
                mtd_wait(NS - 2);
                __syncthreads(); /* sub-part s landed; the previous p·v done (its slot and p free) */
                const __half *sK = ring + (s % NS) * slot;
                uint32_t s0 = s * TC_SUB;
                /* scores: warp w, the 16 heads of m-tile mt × the 8 positions of n-tile nt, over
                 * D in 16-value steps (tc_score_tile's fragments, by ldmatrix: A four 8×8 tiles of
                 * the queries a step, B two steps of the keys a load); ONE_MT: warps 0-3 */
                if (!ONE_MT || warp < 4) {
                        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        if constexpr (LEAN) {
                                const __half *qa = sQ + (size_t) (mt * 16 + lane % 16) * rq + (lane / 16) * 8;
                                /* a 32-value step: keys k (values k0 .. k0 + 31 of the rows) */
                                auto step32 = [&](const __half *k, uint32_t k0) {
                                        uint32_t qf0[4], qf1[4], kf[4];
                                        mtp_ldm4(qf0, qa + k0);
                                        mtp_ldm4(qf1, qa + k0 + 16);
                                        mtp_ldm4(kf, k);
                                        tc_mma(acc, qf0[0], qf0[1], qf0[2], qf0[3], kf[0], kf[1]);
                                        tc_mma(acc, qf1[0], qf1[1], qf1[2], qf1[3], kf[2], kf[3]);
                                };
                                /* dtc_score's steps: 32 values while they fit, then 16; the
                                 * c-part's from the slot (KV % 32 = 0: no step straddles KV), the
                                 * rope keys' from sR */
                                const __half *kb = sK + (size_t) (nt * 8 + lane % 8) * rk + (lane / 8) * 8;
                                const __half *rb = sR + (size_t) (nt * 8 + lane % 8) * rr + (lane / 8) * 8;
                                uint32_t k0 = 0;
#pragma unroll 2
                                for (; k0 < KV; k0 += 32)
                                        step32(kb + k0, k0);
                                for (; k0 + 32 <= D; k0 += 32)
                                        step32(rb + (k0 - KV), k0);
                                for (; k0 < D; k0 += 16) {
                                        uint32_t qf[4];
                                        mtp_ldm4(qf, qa + k0);
                                        const __half *kr = sR + (size_t) (nt * 8 + g) * rr + 2 * cq + (k0 - KV);
                                        tc_mma(acc, qf[0], qf[1], qf[2], qf[3], tc_ld32(kr), tc_ld32(kr + 8));
                                }
                        } else {
                                dtc_score(acc, sQ, sK, mt, nt, D, rq, lane);
                        }
                        uint32_t j0 = nt * 8 + 2 * cq;
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                                uint32_t h = mt * 16 + g + (e >= 2 ? 8 : 0), j = j0 + (e & 1);
                                sS[h * ss + j] = s0 + j < n ? a.scale * acc[e] : -INFINITY;
                        }
                }
                __syncthreads(); /* scores written; every warp is past the previous sub-part */
                /* into the slot of sub-part s − 1 (LEAN: and sR, whose readers, this sub-part's
                 * score chains, are done) */
                issue(s + NS - 1);
                /* the online softmax step, a warp per HG / 8 heads, a lane per position */
#pragma unroll
                for (int x = 0; x < HG / TC_WARPS; x++)
                        tc_softmax_step<LEAN>(sS, sP, sM, sL, sA, ss, ps, warp * (HG / TC_WARPS) + x, lane);
                __syncthreads(); /* p and the rescale factors written */
                dtc_pv<SW>(o, sP, ps, sA, sK, rk, mt, wq, ntiles, lane);
        }
        } else {
                /* DTC_PAIR: rounds of two sub-parts (ring slots of the round before), each warp two
                 * score tiles at once (two chains sharing the query fragments), three barriers a
                 * round; every chain and step as above, in the same order */
                issue(0);
                issue(1);
                stage_q();
#pragma unroll 1
                for (uint32_t sb = 0; sb < nsub; sb += 2) {
                        bool two = sb + 1 < nsub;
                        mtd_wait(0);
                        __syncthreads(); /* the round landed; the previous round's p·v done */
                        issue(sb + 2);   /* into the slots of the round before */
                        issue(sb + 3);
                        const __half *sK0 = ring + (sb % NS) * slot, *sK1 = ring + ((sb + 1) % NS) * slot;
                        if constexpr (ONE_MT) {
                                /* warp w: n-tile w % 4 of sub-part sb + w / 4, one chain (acc0's
                                 * below, step for step) */
                                uint32_t sel = warp / 4;
                                if (sel == 0 || two) {
                                        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                        dtc_score(acc, sQ, sel ? sK1 : sK0, 0, nt, D, rq, lane);
                                        uint32_t j0 = nt * 8 + 2 * cq;
#pragma unroll
                                        for (int e = 0; e < 4; e++) {
                                                uint32_t h = g + (e >= 2 ? 8 : 0), j = j0 + (e & 1);
                                                sS[h * ss + sel * TC_SUB + j] =
                                                        (sb + sel) * TC_SUB + j < n ? a.scale * acc[e] : -INFINITY;
                                        }
                                }
                        } else {
                                float acc0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                const __half *qa = sQ + (size_t) (mt * 16 + lane % 16) * rq + (lane / 16) * 8;
                                size_t kro = (size_t) (nt * 8 + lane % 8) * rq + (lane / 8) * 8;
                                uint32_t k0 = 0;
#pragma unroll 2
                                for (; k0 + 32 <= D; k0 += 32) {
                                        uint32_t qf0[4], qf1[4], kf[4];
                                        mtp_ldm4(qf0, qa + k0);
                                        mtp_ldm4(qf1, qa + k0 + 16);
                                        mtp_ldm4(kf, sK0 + kro + k0);
                                        tc_mma(acc0, qf0[0], qf0[1], qf0[2], qf0[3], kf[0], kf[1]);
                                        tc_mma(acc0, qf1[0], qf1[1], qf1[2], qf1[3], kf[2], kf[3]);
                                        if (two) {
                                                mtp_ldm4(kf, sK1 + kro + k0);
                                                tc_mma(acc1, qf0[0], qf0[1], qf0[2], qf0[3], kf[0], kf[1]);
                                                tc_mma(acc1, qf1[0], qf1[1], qf1[2], qf1[3], kf[2], kf[3]);
                                        }
                                }
                                for (; k0 < D; k0 += 16) {
                                        uint32_t qf[4];
                                        mtp_ldm4(qf, qa + k0);
                                        size_t ko = (size_t) (nt * 8 + g) * rq + 2 * cq + k0;
                                        tc_mma(acc0, qf[0], qf[1], qf[2], qf[3], tc_ld32(sK0 + ko), tc_ld32(sK0 + ko + 8));
                                        if (two)
                                                tc_mma(acc1, qf[0], qf[1], qf[2], qf[3], tc_ld32(sK1 + ko), tc_ld32(sK1 + ko + 8));
                                }
                                uint32_t j0 = nt * 8 + 2 * cq;
#pragma unroll
                                for (int e = 0; e < 4; e++) {
                                        uint32_t h = mt * 16 + g + (e >= 2 ? 8 : 0), j = j0 + (e & 1);
                                        sS[h * ss + j] = sb * TC_SUB + j < n ? a.scale * acc0[e] : -INFINITY;
                                        sS[h * ss + TC_SUB + j] = (sb + 1) * TC_SUB + j < n ? a.scale * acc1[e] : -INFINITY;
                                }
                        }
                        __syncthreads(); /* both sub-parts' scores written */
#pragma unroll
                        for (int x = 0; x < HG / TC_WARPS; x++) {
                                uint32_t h = warp * (HG / TC_WARPS) + x;
                                tc_softmax_step(sS, sP, sM, sL, sA, ss, ps, h, lane);
                                if (two) {
                                        __syncwarp(); /* lane 0's m and l of the first step */
                                        tc_softmax_step(sS + TC_SUB, sP + TC_SUB, sM, sL, sA + MR, ss, ps, h, lane);
                                }
                        }
                        __syncthreads(); /* p and both steps' factors written */
                        dtc_pv<SW>(o, sP, ps, sA, sK0, rq, mt, wq, ntiles, lane);
                        if (two)
                                dtc_pv<SW>(o, sP + TC_SUB, ps, sA + MR, sK1, rq, mt, wq, ntiles, lane);
                }
        }
        mtd_wait(0); /* no copy outlives the block (the groups past the end are empty) */
        /* [o | m | l] of the part; d0, d1: head g, values 2cq, 2cq+1 of the n-tile; d2, d3: g + 8 */
        float *out0 = part + (((uint64_t) tl * max_parts + pi) * n_head) * (KV + 2);
        tc_store_o<SW, HG>(out0, o, mt, wq, h0, n_head, KV);
        if (tid < (uint32_t) HG && h0 + tid < n_head) {
                out0[(uint64_t) (h0 + tid) * (KV + 2) + KV] = sM[tid];
                out0[(uint64_t) (h0 + tid) * (KV + 2) + KV + 1] = sL[tid];
        }
}

static bool attn_tc_ready, attn_tc2_ready, attn_tc22_ready; /* tc22: two tokens a block */
static int attn_dtc_ns; /* k_attn_dtc's ring (sub-parts) this device's shared memory holds; 0: not run */
static bool attn_dtc_pair; /* the ring holds two rounds of two (not X4_CUDA_DTC_PAIR=0): k_attn_dtc<4, true> */
static bool attn_dtc_lean; /* k_attn_dtc<2, false, true> runs two blocks an SM on this device and shape */
static bool attn_dtc_hg_ready[2]; /* k_attn_dtc<.., 16> and <.., 8> are ready for the ring and rounds above */
static uint32_t attn_dtc_hg; /* X4_CUDA_DTC_HG: heads a block forced (32, 16 or 8; not the lean layout), 0 by the grid */
static int attn_dtc_2sm;   /* X4_CUDA_DTC_2SM: 1 the lean layout whenever it is ready, 0 never, -1 by the grid */
static bool attn_fa_ready; /* k_attn_fa could be configured (X4_CUDA_ATTN_PROMPT=fa) */
static uint32_t attn_tc_D;

/* Once per backend (cu_attention_setup): whether this device and shape can run k_attn_tc. */
static bool attn_tc_setup(uint32_t KV, uint32_t R, int smem_max, int major) {
        uint32_t D = KV + R;
        attn_tc_ready = false;
        if (major < 8 || D % 16 || KV % 32 || KV > 4 * TC_NT_MAX * 8 || D == 0)
                return false;
        size_t need = tc_smem(D, KV);
        if (need > (size_t) smem_max)
                return false;
        if (cudaFuncSetAttribute(k_attn_tc<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need) != cudaSuccess ||
            cudaFuncSetAttribute(k_attn_tc<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need) != cudaSuccess) {
                cudaGetLastError();
                return false;
        }
        attn_tc_D = D;
        attn_tc_ready = true;
        /* the limit holds the static roff array too */
        size_t need2 = tc2_smem(D, 1), need22 = tc2_smem(D, 2), roff_bytes = CU_ATTN_PART_TC2 * sizeof(uint64_t);
        attn_tc2_ready = need2 + roff_bytes <= (size_t) smem_max &&
                         cudaFuncSetAttribute(k_attn_tc2<float, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need2) == cudaSuccess &&
                         cudaFuncSetAttribute(k_attn_tc2<__half, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need2) == cudaSuccess;
        attn_tc22_ready = attn_tc2_ready && need22 + roff_bytes <= (size_t) smem_max &&
                          cudaFuncSetAttribute(k_attn_tc2<float, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need22) == cudaSuccess &&
                          cudaFuncSetAttribute(k_attn_tc2<__half, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need22) == cudaSuccess;
        size_t fa16 = fa_smem(D, true), fa32 = fa_smem(D, false);
        attn_fa_ready = attn_tc2_ready && KV % 32 == 0 && KV <= 2 * FA_NT_MAX * 8 &&
                        fa16 + roff_bytes <= (size_t) smem_max && fa32 + roff_bytes <= (size_t) smem_max &&
                        cudaFuncSetAttribute(k_attn_fa<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) fa16) == cudaSuccess &&
                        cudaFuncSetAttribute(k_attn_fa<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) fa32) == cudaSuccess;
        if (!attn_tc2_ready || !attn_tc22_ready || !attn_fa_ready)
                cudaGetLastError();
        /* the decode kernel: the deepest ring that fits (4 on sm_90's 227 KiB, 3 on sm_80's 163;
         * none on 99 KiB cards, whose f16-cache decodes keep the fp32 kernels) */
        attn_dtc_ns = 0;
        for (int ns = DTC_NS_MAX; ns >= 2 && !attn_dtc_ns; ns--) {
                size_t need = dtc_smem(D, ns);
                if (need + CU_ATTN_PART_DEC * sizeof(uint64_t) > (size_t) smem_max)
                        continue;
                cudaError_t e = ns == 4 ? cudaFuncSetAttribute(k_attn_dtc<4, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need)
                              : ns == 3 ? cudaFuncSetAttribute(k_attn_dtc<3, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need)
                                        : cudaFuncSetAttribute(k_attn_dtc<2, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need);
                if (e == cudaSuccess)
                        attn_dtc_ns = ns;
                else
                        cudaGetLastError();
        }
        /* rounds of two sub-parts where the ring holds them (the same bits: GPU step; H200, full
         * model, 2026-12-04 third session call 1: batch 1 at 4,096 179.3 against 176.6 tok/s, at
         * 32,768 140.5 against 138.5, at 512 equal); X4_CUDA_DTC_PAIR=0 takes one sub-part a round */
        const char *pe = getenv("X4_CUDA_DTC_PAIR");
        size_t need_pair = dtc_smem(D, 4, 2);
        attn_dtc_pair = !(pe && !strcmp(pe, "0")) && attn_dtc_ns == 4 &&
                        need_pair + CU_ATTN_PART_DEC * sizeof(uint64_t) <= (size_t) smem_max &&
                        cudaFuncSetAttribute(k_attn_dtc<4, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) need_pair) == cudaSuccess;
        if (!attn_dtc_pair)
                (void) cudaGetLastError(); /* a refused attribute must not fail the first forward */
        if (pe && !strcmp(pe, "1") && !attn_dtc_pair)
                fprintf(stderr, "xing4d: X4_CUDA_DTC_PAIR=1: this device's shared memory cannot hold it; one sub-part a round\n");
        /* the lean layout (batch decode): only where two blocks fit an SM (the H200 at the full
         * model, 115,584 bytes a block with roff; not sm_80's 164 KiB an SM), asked of the runtime
         * with the carveout at its largest; X4_CUDA_DTC_2SM=1 takes it whenever it is ready, 0 never */
        const char *le = getenv("X4_CUDA_DTC_2SM");
        attn_dtc_2sm = -1;
        if (le && *le) {
                if (!strcmp(le, "0") || !strcmp(le, "1"))
                        attn_dtc_2sm = le[0] - '0';
                else
                        fprintf(stderr, "xing4d: X4_CUDA_DTC_2SM=%s ignored: expected 0 or 1; the grid decides\n", le);
        }
        size_t need_lean = dtc_lean_smem(D, KV);
        int lean_blocks = 0;
        attn_dtc_lean = attn_dtc_2sm != 0 && attn_dtc_ns &&
                        need_lean + CU_ATTN_PART_DEC * sizeof(uint64_t) <= (size_t) smem_max &&
                        cudaFuncSetAttribute(k_attn_dtc<DTC_LEAN_NS, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int) need_lean) == cudaSuccess &&
                        cudaFuncSetAttribute(k_attn_dtc<DTC_LEAN_NS, false, true>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             cudaSharedmemCarveoutMaxShared) == cudaSuccess &&
                        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&lean_blocks, k_attn_dtc<DTC_LEAN_NS, false, true>,
                                                                      TC_WARPS * 32, need_lean) == cudaSuccess &&
                        lean_blocks >= 2;
        if (!attn_dtc_lean)
                (void) cudaGetLastError(); /* a refused attribute must not fail the first forward */
        if (attn_dtc_2sm == 1 && !attn_dtc_lean)
                fprintf(stderr, "xing4d: X4_CUDA_DTC_2SM=1: k_attn_dtc's lean layout cannot run two blocks an SM on this "
                                "device or shape (%d); the default serves\n", lean_blocks);
        /* small head groups (16 or 8 heads a block, the same ring and rounds): where a grid of
         * 32-head blocks leaves SMs idle (a short context at batch 1), two or four times the blocks;
         * every head's chains are the ones it has in a block of 32, so the choice never changes a bit */
        const char *he = getenv("X4_CUDA_DTC_HG");
        attn_dtc_hg = 0;
        if (he && *he) {
                if (!strcmp(he, "32") || !strcmp(he, "16") || !strcmp(he, "8"))
                        attn_dtc_hg = (uint32_t) atoi(he);
                else
                        fprintf(stderr, "xing4d: X4_CUDA_DTC_HG=%s ignored: expected 32, 16 or 8; the grid decides\n", he);
        }
        int hns = attn_dtc_pair ? 4 : attn_dtc_ns, hr = attn_dtc_pair ? 2 : 1;
        size_t need_small = dtc_smem(D, hns, hr, 16); /* either size: 16 rows */
        for (int i = 0; i < 2; i++) {
                cudaError_t e = cudaErrorInvalidValue;
                if (attn_dtc_ns && need_small + CU_ATTN_PART_DEC * sizeof(uint64_t) <= (size_t) smem_max) {
                        int sz = (int) need_small;
                        auto set = [sz](auto f) { return cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, sz); };
                        if (i == 0)
                                e = attn_dtc_pair ? set(k_attn_dtc<4, true, false, 16>) : hns == 4 ? set(k_attn_dtc<4, false, false, 16>)
                                    : hns == 3 ? set(k_attn_dtc<3, false, false, 16>) : set(k_attn_dtc<2, false, false, 16>);
                        else
                                e = attn_dtc_pair ? set(k_attn_dtc<4, true, false, 8>) : hns == 4 ? set(k_attn_dtc<4, false, false, 8>)
                                    : hns == 3 ? set(k_attn_dtc<3, false, false, 8>) : set(k_attn_dtc<2, false, false, 8>);
                }
                attn_dtc_hg_ready[i] = e == cudaSuccess;
                if (e != cudaSuccess)
                        (void) cudaGetLastError(); /* a refused attribute must not fail the first forward */
        }
        if ((attn_dtc_hg == 16 && !attn_dtc_hg_ready[0]) || (attn_dtc_hg == 8 && !attn_dtc_hg_ready[1])) {
                fprintf(stderr, "xing4d: X4_CUDA_DTC_HG=%u: k_attn_dtc's blocks of %u heads cannot run on this device or "
                                "shape; the grid decides\n", attn_dtc_hg, attn_dtc_hg);
                attn_dtc_hg = 0;
        }
        return true;
}

static void attn_launch_tc(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts,
                           const struct cu_cache *c, uint32_t layer, float *part, cudaStream_t s) {
        dim3 grid(max_parts, (a->n_head + TC_HG - 1) / TC_HG, n);
        size_t sm = tc_smem(c->D, a->KV);
        cu_launches++;
        if (c->f16)
                cu_launch(k_attn_tc<__half>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, *c, layer, part);
        else
                cu_launch(k_attn_tc<float>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, *c, layer, part);
}

/* tok: tokens a block the caller allows (2: prompt passes, whose neighbours share a sequence);
 * X4_CUDA_ATTN_TOK=1 keeps one. With parts of 128 positions two were slower (full model, H200,
 * 0fb5d91: 598 against ~570 ms of a 4,096-token prefill): the per-part query staging and partial
 * results, which pairing does not share, dominated. With parts of 1,024 the cache staging is what
 * is left, and pairing halves it (ef64321: prefill 4,096 4,914 -> 5,122 tok/s, 512 8,063 ->
 * 8,123). The bits are the same either way (GPU test tok_same). */
static void attn_launch_tc2(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts, uint32_t plen,
                            const struct cu_cache *c, uint32_t layer, float *part, uint32_t tok, cudaStream_t s) {
        static int two = -1;
        if (two < 0) {
                const char *e = getenv("X4_CUDA_ATTN_TOK");
                two = !(e && !strcmp(e, "1"));
        }
        if (!two || !attn_tc22_ready || n < 2)
                tok = 1;
        dim3 grid(max_parts, (a->n_head + TC_HG - 1) / TC_HG, (n + tok - 1) / tok);
        size_t sm = tc2_smem(c->D, tok);
        cu_launches++;
        if (tok == 2 && c->f16)
                cu_launch(k_attn_tc2<__half, 2>, grid, 2 * TC_WARPS * 32, sm, s, *a, t0, n, max_parts, plen, *c, layer, part);
        else if (tok == 2)
                cu_launch(k_attn_tc2<float, 2>, grid, 2 * TC_WARPS * 32, sm, s, *a, t0, n, max_parts, plen, *c, layer, part);
        else if (c->f16)
                cu_launch(k_attn_tc2<__half, 1>, grid, TC_WARPS * 32, sm, s, *a, t0, n, max_parts, plen, *c, layer, part);
        else
                cu_launch(k_attn_tc2<float, 1>, grid, TC_WARPS * 32, sm, s, *a, t0, n, max_parts, plen, *c, layer, part);
}

/* k_attn_fa for tokens [t0, t0 + n), two a block */
static void attn_launch_fa(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts, uint32_t plen,
                           const struct cu_cache *c, uint32_t layer, float *part, cudaStream_t s) {
        dim3 grid(max_parts, (a->n_head + TC_HG - 1) / TC_HG, (n + 1) / 2);
        cu_launches++;
        if (c->f16)
                cu_launch(k_attn_fa<__half>, grid, FA_WARPS * 32, fa_smem(c->D, true), s, *a, t0, n, max_parts, plen,
                          *c, layer, part);
        else
                cu_launch(k_attn_fa<float>, grid, FA_WARPS * 32, fa_smem(c->D, false), s, *a, t0, n, max_parts, plen,
                          *c, layer, part);
}

/* The smallest head group the grid rule takes: 8. Blocks of 16 heads gained +5% at 512, +7% at
 * 4,096, +10% at 8,192 against blocks of 32 (H100, full model, batch 1); blocks of 8 against 16
 * +1.7% / +1.2% at 512 / 4,096 in one call and +0.7% / -0.3% in the next (H100, 2026-12-06,
 * twelfth session): within a run's spread, never behind by more */
#define DTC_HG_AUTO_MIN 8

/* k_attn_dtc in blocks of HG (16 or 8) heads, the ring and rounds the device took */
template <int HG>
static void attn_launch_dtc_small(dim3 grid, size_t sm, const struct cu_attn *a, uint32_t t0, uint32_t max_parts,
                                  uint32_t plen, const struct cu_cache *c, uint32_t layer, float *part, cudaStream_t s) {
        if (attn_dtc_pair)
                cu_launch(k_attn_dtc<4, true, false, HG>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, plen, *c, layer, part);
        else if (attn_dtc_ns == 4)
                cu_launch(k_attn_dtc<4, false, false, HG>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, plen, *c, layer, part);
        else if (attn_dtc_ns == 3)
                cu_launch(k_attn_dtc<3, false, false, HG>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, plen, *c, layer, part);
        else
                cu_launch(k_attn_dtc<2, false, false, HG>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, plen, *c, layer, part);
}

/* k_attn_dtc for tokens [t0, t0 + n), parts of cu_dtc_plen(position, plen) positions. The lean
 * layout (two blocks an SM) where the grid fills two blocks an SM at least, or where
 * X4_CUDA_DTC_2SM says; small head groups where blocks of 8 or 16 heads still fit one wave, or
 * where X4_CUDA_DTC_HG says; the same chains in the same order every way, so the choice never
 * changes a bit (GPU test dtc_same) and batch invariance holds. */
static void attn_launch_dtc(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts, uint32_t plen,
                            const struct cu_cache *c, uint32_t layer, float *part, cudaStream_t s) {
        dim3 grid(max_parts, (a->n_head + TC_HG - 1) / TC_HG, n);
        size_t sm = dtc_smem(c->D, attn_dtc_ns, attn_dtc_pair ? 2 : 1);
        cu_launches++;
        bool lean = attn_dtc_lean &&
                    (attn_dtc_2sm == 1 || (uint64_t) grid.x * grid.y * grid.z >= 2 * (uint64_t) attn_sms);
        /* heads a block: forced, or the fewest (from DTC_HG_AUTO_MIN) whose blocks still fit one
         * wave where there are more of them than of 32-head blocks; the lean layout keeps 32 */
        uint32_t hg = 32;
        if (!lean && attn_dtc_hg)
                hg = attn_dtc_hg;
        else if (!lean)
                for (uint32_t h = DTC_HG_AUTO_MIN; h < 32 && hg == 32; h *= 2) {
                        uint32_t gy = (a->n_head + h - 1) / h;
                        if (attn_dtc_hg_ready[h == 16 ? 0 : 1] && gy > grid.y &&
                            (uint64_t) grid.x * gy * grid.z <= (uint64_t) attn_sms)
                                hg = h;
                }
        if (hg < 32) {
                dim3 gh(max_parts, (a->n_head + hg - 1) / hg, n);
                size_t smh = dtc_smem(c->D, attn_dtc_pair ? 4 : attn_dtc_ns, attn_dtc_pair ? 2 : 1, 16);
                if (hg == 16)
                        attn_launch_dtc_small<16>(gh, smh, a, t0, max_parts, plen, c, layer, part, s);
                else
                        attn_launch_dtc_small<8>(gh, smh, a, t0, max_parts, plen, c, layer, part, s);
        } else if (lean)
                cu_launch(k_attn_dtc<DTC_LEAN_NS, false, true>, grid, TC_WARPS * 32, dtc_lean_smem(c->D, a->KV), s, *a, t0,
                          max_parts, plen, *c, layer, part);
        else if (attn_dtc_pair)
                cu_launch(k_attn_dtc<4, true>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, plen, *c, layer, part);
        else if (attn_dtc_ns == 4)
                cu_launch(k_attn_dtc<4, false>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, plen, *c, layer, part);
        else if (attn_dtc_ns == 3)
                cu_launch(k_attn_dtc<3, false>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, plen, *c, layer, part);
        else
                cu_launch(k_attn_dtc<2, false>, grid, TC_WARPS * 32, sm, s, *a, t0, max_parts, plen, *c, layer, part);
}

/* Fold the parts of each (token, head) in part order: a block per (token, head, AC_COMBINE
 * values), a thread per value. For part i ≥ 1 the running max M_i = max(M_(i-1), m_i), the
 * factors a_i = exp(M_(i-1) − M_i) and b_i = exp(m_i − M_i), then L = L·a_i + l_i·b_i and, per
 * value, O = O·a_i + o_i·b_i; out = O / L. The max and the factors are the same for every value of
 * a head: k_attn_combine stages the parts' m and l, runs the max chain (exact: fmaxf) and the L
 * chain once, computes the factors a thread a part, and leaves each value thread one
 * multiply-add chain with its loads in flight (a 32K context's 129 parts: ~46 µs a layer when
 * every value thread ran both exponentials of every part). The arithmetic of every step is the
 * same expression on the same inputs as k_attn_combine_ref (the per-value chains it replaced, kept
 * for contexts of more than AC_PARTS_STAGED parts and as the GPU test's reference,
 * X4_CUDA_COMBINE=ref), so the bits are the same. */
#define AC_COMBINE 128
#define AC_PARTS_STAGED 1024
__global__ void __launch_bounds__(AC_COMBINE)
        k_attn_combine_ref(const float *part, uint32_t t0, uint32_t max_parts, uint32_t plen, uint32_t n_head,
                           uint32_t KV, const uint32_t *tok_pos, float *out) {
        uint32_t tl = blockIdx.x, h = blockIdx.y, t = t0 + tl;
        uint32_t pos = tok_pos[t], n_parts = pos / (plen ? plen : cu_dtc_plen(pos, 0)) + 1; /* metadata: before the wait */
        cu_pdl_wait();
        cu_pdl_trigger();
        const float *p0 = part + ((uint64_t) tl * max_parts * n_head + h) * (KV + 2);
        uint64_t stride = (uint64_t) n_head * (KV + 2);
        for (uint32_t k = blockIdx.z * blockDim.x + threadIdx.x; k < KV; k += gridDim.z * blockDim.x) {
                float M = p0[KV], L = p0[KV + 1], O = p0[k];
#pragma unroll 8
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

/* The steps k_attn_combine and k_attn_combine_deep share: the parts' m and l into shared memory
 * (ac_stage, after the PDL wait: it returns the token's part count, its first part row and the
 * rows' stride; the block's threads, before a barrier), the factors a_i = exp(M_(i-1) − M_i) and
 * b_i = exp(m_i − M_i) from the running maxima in sm and the parts' maxima in sb (ac_factors, in
 * place of m_i), and the L chain in part order on one thread (ac_L). */
static __device__ __forceinline__ uint32_t ac_stage(const float *part, uint32_t t0, uint32_t max_parts, uint32_t plen,
                                                    uint32_t n_head, uint32_t KV, const uint32_t *tok_pos, float *sm,
                                                    float *sl, const float **p0_out, uint64_t *stride_out) {
        uint32_t tl = blockIdx.x, h = blockIdx.y, t = t0 + tl;
        uint32_t pos = tok_pos[t], n_parts = pos / (plen ? plen : cu_dtc_plen(pos, 0)) + 1; /* metadata: before the wait */
        cu_pdl_wait();
        cu_pdl_trigger();
        const float *p0 = part + ((uint64_t) tl * max_parts * n_head + h) * (KV + 2);
        uint64_t stride = (uint64_t) n_head * (KV + 2);
        for (uint32_t pi = threadIdx.x; pi < n_parts; pi += blockDim.x) {
                sm[pi] = p0[pi * stride + KV];
                sl[pi] = p0[pi * stride + KV + 1];
        }
        *p0_out = p0;
        *stride_out = stride;
        return n_parts;
}

static __device__ __forceinline__ void ac_factors(const float *sm, float *sa, float *sb, uint32_t n_parts) {
        for (uint32_t pi = 1 + threadIdx.x; pi < n_parts; pi += blockDim.x) {
                float M = sm[pi - 1], Mn = sm[pi], mq = sb[pi];
                sa[pi] = expf(M - Mn);
                sb[pi] = expf(mq - Mn);
        }
}

static __device__ __forceinline__ float ac_L(const float *sl, const float *sa, const float *sb, uint32_t n_parts) {
        float L = sl[0];
        for (uint32_t pi = 1; pi < n_parts; pi++) {
                float a = sa[pi], b = sb[pi];
                L = L * a + sl[pi] * b;
        }
        return L;
}

__global__ void __launch_bounds__(AC_COMBINE)
        k_attn_combine(const float *part, uint32_t t0, uint32_t max_parts, uint32_t plen, uint32_t n_head,
                       uint32_t KV, const uint32_t *tok_pos, float *out) {
        __shared__ float sm[AC_PARTS_STAGED], sl[AC_PARTS_STAGED], sa[AC_PARTS_STAGED], sb[AC_PARTS_STAGED];
        __shared__ float sL;
        uint32_t t = t0 + blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
        const float *p0;
        uint64_t stride;
        uint32_t n_parts = ac_stage(part, t0, max_parts, plen, n_head, KV, tok_pos, sm, sl, &p0, &stride);
        __syncthreads();
        if (tid == 0) { /* the running max, in place of the parts' own (each read before it is replaced) */
                float M = sm[0];
                for (uint32_t pi = 1; pi < n_parts; pi++) {
                        float mq = sm[pi], Mn = fmaxf(M, mq);
                        sb[pi] = mq; /* m_i, for b_i below */
                        sm[pi] = Mn;
                        M = Mn;
                }
        }
        __syncthreads();
        ac_factors(sm, sa, sb, n_parts);
        __syncthreads();
        if (tid == 0)
                sL = ac_L(sl, sa, sb, n_parts);
        __syncthreads();
        float L = sL;
        for (uint32_t k = blockIdx.z * blockDim.x + tid; k < KV; k += gridDim.z * blockDim.x) {
                float O = p0[k];
#pragma unroll 8
                for (uint32_t pi = 1; pi < n_parts; pi++) {
                        const float *pp = p0 + pi * stride;
                        float a = sa[pi], b = sb[pi];
                        O = O * a + pp[k] * b;
                }
                out[((uint64_t) t * n_head + h) * KV + k] = O / L;
        }
}

/* k_attn_combine's arithmetic with its latency chains shortened (taken where a launch's blocks fit
 * one wave of it: X4_CUDA_COMBINE, cu_attn_combine). ncu put k_attn_combine at 28 us a layer at
 * 32K (129 parts; k_attn_dtc itself 52): about 1.1 ms of a 7 ms batch-1 step. Three chains made
 * it long, and each is shorter here:
 *   - the running max M_i = max(M_(i-1), m_i): a scan over the block (each warp scans 32 parts by
 *     shuffles, then the warps' maxima and the previous rounds' carry) instead of one thread
 *     walking the parts. fmaxf is exact and a max over a set of numbers is the same value in any
 *     order, so every M_i is the same (parts past n_parts enter as −inf, which changes no max);
 *   - the L chain (L = L·a_i + l_i·b_i, the same expression in the same order, on thread 0) runs
 *     while the value threads run their chains; they meet at a barrier before the division;
 *   - each value's chain (O = O·a_i + o_i·b_i in part order) has AC_DEEP parts' loads in flight at
 *     once where k_attn_combine's unrolled loop had eight: 129 parts were 16 rounds of L2 latency.
 * The same expressions on the same inputs in the same order: the same bits as k_attn_combine and
 * k_attn_combine_ref (GPU steps compare the logits, memcmp). */
#define AC_DEEP 32
/* blocks an SM the deep kernel is built for: without a minimum ptxas aims at full occupancy (32
 * registers) and interleaves the loads with their uses, so few are in flight; with 4 it may take
 * up to 128 and issues a round's loads together */
#define AC_DEEP_MINB 4
__global__ void __launch_bounds__(AC_COMBINE, AC_DEEP_MINB)
        k_attn_combine_deep(const float *part, uint32_t t0, uint32_t max_parts, uint32_t plen, uint32_t n_head,
                            uint32_t KV, const uint32_t *tok_pos, float *out) {
        __shared__ float sm[AC_PARTS_STAGED], sl[AC_PARTS_STAGED], sa[AC_PARTS_STAGED], sb[AC_PARTS_STAGED];
        __shared__ float wmax[AC_COMBINE / 32];
        __shared__ float sL;
        uint32_t t = t0 + blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
        uint32_t lane = tid % 32, warp = tid / 32, nw = blockDim.x / 32;
        const float *p0;
        uint64_t stride;
        uint32_t n_parts = ac_stage(part, t0, max_parts, plen, n_head, KV, tok_pos, sm, sl, &p0, &stride);
        __syncthreads();
        /* the running max, rounds of blockDim.x parts: sb[pi] = m_pi (for b_i), sm[pi] = M_pi */
        float carry = 0.0f; /* the max of the rounds before (from the second round) */
        for (uint32_t r0 = 0; r0 < n_parts; r0 += blockDim.x) {
                uint32_t pi = r0 + tid;
                float mq = pi < n_parts ? sm[pi] : -INFINITY, M = mq;
#pragma unroll
                for (uint32_t d = 1; d < 32; d *= 2) {
                        float o = __shfl_up_sync(CU_FULL_MASK, M, d);
                        if (lane >= d)
                                M = fmaxf(M, o);
                }
                if (lane == 31)
                        wmax[warp] = M;
                __syncthreads();
                for (uint32_t w = 0; w < warp; w++)
                        M = fmaxf(M, wmax[w]);
                float tot = wmax[0];
                for (uint32_t w = 1; w < nw; w++)
                        tot = fmaxf(tot, wmax[w]);
                if (r0) {
                        M = fmaxf(M, carry);
                        tot = fmaxf(tot, carry);
                }
                carry = tot;
                if (pi < n_parts) {
                        sb[pi] = mq;
                        sm[pi] = M;
                }
                __syncthreads(); /* wmax is rewritten by the next round */
        }
        ac_factors(sm, sa, sb, n_parts);
        __syncthreads();
        if (tid == 0)
                sL = ac_L(sl, sa, sb, n_parts);
        /* the value's chain (a value a thread: the grid's z covers KV), AC_DEEP parts' loads at a
         * time; sL is read past the barrier below */
        uint32_t k = blockIdx.z * blockDim.x + tid;
        float O = 0.0f;
        if (k < KV) {
                O = p0[k];
                /* whole rounds of AC_DEEP parts: no guard, so the loads go out together (a
                 * guarded load compiles to a branch around it, and ptxas keeps few in flight) */
                uint32_t pb = 1;
                for (; pb + AC_DEEP <= n_parts; pb += AC_DEEP) {
                        float ov[AC_DEEP];
#pragma unroll
                        for (uint32_t j = 0; j < AC_DEEP; j++)
                                ov[j] = p0[(pb + j) * stride + k];
#pragma unroll
                        for (uint32_t j = 0; j < AC_DEEP; j++) {
                                float a = sa[pb + j], b = sb[pb + j];
                                O = O * a + ov[j] * b;
                        }
                }
                /* the last parts: loads of rows up to the last part (that row again past it,
                 * never used) */
                if (pb < n_parts) {
                        float ov[AC_DEEP];
#pragma unroll
                        for (uint32_t j = 0; j < AC_DEEP; j++)
                                ov[j] = p0[min(pb + j, n_parts - 1) * stride + k];
#pragma unroll
                        for (uint32_t j = 0; j < AC_DEEP; j++)
                                if (pb + j < n_parts) {
                                        float a = sa[pb + j], b = sb[pb + j];
                                        O = O * a + ov[j] * b;
                                }
                }
        }
        __syncthreads();
        if (k < KV)
                out[((uint64_t) t * n_head + h) * KV + k] = O / sL;
}

extern "C" void cu_attn_combine(const float *part, uint32_t t0, uint32_t n, uint32_t max_parts, uint32_t plen,
                                uint32_t n_head, uint32_t values, const uint32_t *tok_pos, float *out,
                                cudaStream_t s) {
        /* X4_CUDA_COMBINE unset or auto: k_attn_combine_deep where the launch's blocks fit one wave
         * of it (AC_DEEP_MINB an SM: the latency-bound launches of small batches), else
         * k_attn_combine; staged: k_attn_combine always; deep: k_attn_combine_deep always; log:
         * deep, saying so on stderr whenever a launch folds more parts than any before (the GPU
         * test's proof that it ran); ref: the per-value chains (the GPU test's reference). The
         * same bits every way. Auto since 2026-12-07's eighteenth session (H100, full model, batch
         * 1: 144.2-144.4 tok/s at 32,768 against 135.2-135.5, 187.0 at 4,096 against 183.3-183.8;
         * ncu 10.1 us a layer's combine at 32K against 28.9; but batch 64, always deep: 3,119 /
         * 2,054 at 512 / 4,096 against 3,202-3,205 / 2,071-2,073) */
        enum { AC_AUTO, AC_REF, AC_DEEP_ALWAYS, AC_LOG, AC_STAGED };
        static int mode = -1;
        static uint32_t logged_parts;
        if (mode < 0) {
                const char *e = getenv("X4_CUDA_COMBINE");
                mode = !e || !*e || !strcmp(e, "auto") ? AC_AUTO : !strcmp(e, "ref") ? AC_REF
                        : !strcmp(e, "deep") ? AC_DEEP_ALWAYS : !strcmp(e, "log") ? AC_LOG
                        : !strcmp(e, "staged") ? AC_STAGED : -2;
                if (mode == -2) {
                        fprintf(stderr, "xing4d: X4_CUDA_COMBINE=%s ignored: expected auto, staged, deep, log or ref\n", e);
                        mode = AC_AUTO;
                }
        }
        if (n == 0)
                return;
        cu_launches++;
        dim3 grid(n, n_head, (values + AC_COMBINE - 1) / AC_COMBINE);
        uint64_t blocks = (uint64_t) grid.x * grid.y * grid.z;
        bool deep = mode == AC_DEEP_ALWAYS || mode == AC_LOG ||
                    (mode == AC_AUTO && blocks <= (uint64_t) attn_sms * AC_DEEP_MINB);
        if (mode == AC_REF || max_parts > AC_PARTS_STAGED)
                cu_launch(k_attn_combine_ref, grid, AC_COMBINE, 0, s, part, t0, max_parts, plen, n_head, values, tok_pos, out);
        else if (deep) {
                if (mode == AC_LOG && max_parts > logged_parts) {
                        logged_parts = max_parts;
                        fprintf(stderr, "attention combine: deep chains, up to %u parts, %u tokens\n", max_parts, n);
                }
                cu_launch(k_attn_combine_deep, grid, AC_COMBINE, 0, s, part, t0, max_parts, plen, n_head, values, tok_pos, out);
        } else
                cu_launch(k_attn_combine, grid, AC_COMBINE, 0, s, part, t0, max_parts, plen, n_head, values, tok_pos, out);
}

static void attn_launch_combine(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts,
                                uint32_t plen, const struct cu_cache *c, const float *part, float *out,
                                cudaStream_t s) {
        cu_attn_combine(part, t0, n, max_parts, plen, a->n_head, a->KV, c->tok_pos, out, s);
}

template <int HG, int TH>
static void attn_launch(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts,
                        const struct cu_cache *c, uint32_t layer, float *part, cudaStream_t s) {
        dim3 grid(max_parts, (a->n_head + HG - 1) / HG, n);
        constexpr int NT = (HG / TH) * ATT_JS;
        cu_launches++;
        if (c->f16)
                cu_launch(k_attn_part<HG, TH, __half>, grid, NT, 0, s, *a, t0, max_parts, *c, layer, part);
        else
                cu_launch(k_attn_part<HG, TH, float>, grid, NT, 0, s, *a, t0, max_parts, *c, layer, part);
}

template <int HG>
static void attn_launch_dec(const struct cu_attn *a, uint32_t t0, uint32_t n, uint32_t max_parts,
                            const struct cu_cache *c, uint32_t layer, float *part,
                            cudaStream_t s) {
        dim3 grid(max_parts, (a->n_head + HG - 1) / HG, n);
        cu_launches++;
        if (c->f16)
                cu_launch(k_attn_dec<HG, __half>, grid, ATT_DEC_THREADS, 0, s, *a, t0, max_parts, *c, layer, part);
        else
                cu_launch(k_attn_dec<HG, float>, grid, ATT_DEC_THREADS, 0, s, *a, t0, max_parts, *c, layer, part);
}

/* X4_CUDA_ATTN=part|dec4|dec2|split forces one kernel, old the choice before the split path
 * (measurements; the bits are the same); tc the tensor-core kernel (its own bits, f16 inputs),
 * tc2 the prompt kernel for every pass */
static int attn_force(void) {
        static int force = -1;
        if (force < 0) {
                const char *f = getenv("X4_CUDA_ATTN");
                force = !f ? 0 : !strcmp(f, "part") ? 1 : !strcmp(f, "dec4") ? 2 : !strcmp(f, "dec2") ? 3
                        : !strcmp(f, "split") ? 4 : !strcmp(f, "old") ? 5 : !strcmp(f, "tc") ? 6
                        : !strcmp(f, "tc2") ? 7 : 0;
        }
        return force;
}

/* Whether the pass being launched takes k_attn_tc2 for cache rows of D values. Prompt-class
 * passes (cu_pass_prompt) do: a token's class is its own, so invariance holds. Full model, H200
 * (100a4eb): prefill 512 3,250 -> 3,971 tok/s, 4,096 1,368 -> 2,733. X4_CUDA_PROMPT_ATTN=fp32
 * keeps them on the fp32 kernels. */
static bool attn_tc2_chosen(uint32_t D) {
        static int prompt_tc2 = -1;
        if (prompt_tc2 < 0) {
                const char *e = getenv("X4_CUDA_PROMPT_ATTN");
                prompt_tc2 = !(e && !strcmp(e, "fp32"));
        }
        int force = attn_force();
        return (force == 7 || (force == 0 && prompt_tc2 && cu_pass_prompt())) && attn_tc2_ready && D == attn_tc_D;
}

/* k_attn_tc2's part length: CU_ATTN_PART_TC2, or X4_CUDA_ATTN_PROMPT_PART (a multiple of TC_SUB
 * up to it; anything else is named on stderr once and the default kept). */
static uint32_t attn_tc2_part(void) {
        static uint32_t plen;
        if (!plen) {
                const char *e = getenv("X4_CUDA_ATTN_PROMPT_PART");
                uint32_t v = CU_ATTN_PART_TC2;
                if (e) {
                        char *end;
                        unsigned long u = strtoul(e, &end, 10);
                        if (*e && !*end && u >= TC_SUB && u <= CU_ATTN_PART_TC2 && u % TC_SUB == 0)
                                v = (uint32_t) u;
                        else
                                fprintf(stderr, "xing4d: X4_CUDA_ATTN_PROMPT_PART=%s ignored: expected a multiple of %d "
                                        "from %d to %d; using %d\n", e, TC_SUB, TC_SUB, CU_ATTN_PART_TC2, CU_ATTN_PART_TC2);
                }
                plen = v;
        }
        return plen;
}

/* Whether the pass being launched takes k_attn_dtc: a decode-class pass (or every pass when the
 * classes are off) over an f16 cache on a device that runs it, no kernel forced, and not
 * X4_CUDA_DECODE_ATTN=fp32 (which keeps the fp32 kernels: the f16 cache's old decode path). The
 * f32 cache never takes it: that cache is the exact path. */
static bool attn_dtc_chosen(uint32_t D, bool f16) {
        static int fp32 = -1;
        if (fp32 < 0) {
                const char *e = getenv("X4_CUDA_DECODE_ATTN");
                fp32 = e && !strcmp(e, "fp32");
                if (e && *e && !fp32 && strcmp(e, "tc"))
                        fprintf(stderr, "xing4d: X4_CUDA_DECODE_ATTN=%s ignored: expected tc or fp32\n", e);
        }
        return f16 && !fp32 && attn_force() == 0 && attn_dtc_ns && D == attn_tc_D && !attn_tc2_chosen(D);
}

/* k_attn_dtc's forced part length: 0 (cu_dtc_plen's by position), or X4_CUDA_ATTN_DECODE_PART (a
 * multiple of TC_SUB up to CU_ATTN_PART_DEC; anything else is named on stderr once and ignored). */
static uint32_t attn_dtc_part(void) {
        static uint32_t plen = UINT32_MAX;
        if (plen == UINT32_MAX) {
                const char *e = getenv("X4_CUDA_ATTN_DECODE_PART");
                uint32_t v = 0;
                if (e && *e) {
                        char *end;
                        unsigned long u = strtoul(e, &end, 10);
                        if (*e && !*end && u >= TC_SUB && u <= CU_ATTN_PART_DEC && u % TC_SUB == 0)
                                v = (uint32_t) u;
                        else
                                fprintf(stderr, "xing4d: X4_CUDA_ATTN_DECODE_PART=%s ignored: expected a multiple of %d "
                                        "from %d to %d; parts follow the position\n", e, TC_SUB, TC_SUB, CU_ATTN_PART_DEC);
                }
                plen = v;
        }
        return plen;
}

extern "C" uint32_t cu_attn_part_len(uint32_t D, bool f16) {
        return attn_tc2_chosen(D) ? attn_tc2_part() : attn_dtc_chosen(D, f16) ? attn_dtc_part() : CU_ATTN_PART;
}

extern "C" uint32_t cu_attn_parts(uint32_t D, bool f16, uint32_t pos) {
        uint32_t plen = cu_attn_part_len(D, f16);
        return pos / (plen ? plen : cu_dtc_plen(pos, 0)) + 1;
}

extern "C" void cu_attention(const struct cu_attn *a, uint32_t t0, uint32_t n,
                             uint32_t max_parts, const struct cu_cache *c, uint32_t layer,
                             float *sc, float *part, float *out, cudaStream_t s) {
        if (n == 0)
                return;
        /* the kernel and head-group size follow the batch shape; the arithmetic is the same for
         * every choice (see above): many (token, part) blocks → all heads share each staged
         * cache chunk; few → a warp per position and small head groups to fill the card */
        uint64_t blocks = (uint64_t) n * max_parts;
        int force = attn_force();
        if (attn_tc2_chosen(c->D)) {
                /* its own numerics (see k_attn_tc2), for every shape; parts of attn_tc2_part()
                 * positions (the plan sized max_parts with cu_attn_part_len) */
                uint32_t plen = attn_tc2_part();
                static int fa = -1; /* X4_CUDA_ATTN_PROMPT=fa: k_attn_fa (its own bits) for every such pass */
                if (fa < 0) {
                        const char *e = getenv("X4_CUDA_ATTN_PROMPT");
                        fa = e && !strcmp(e, "fa");
                        if (fa && !attn_fa_ready)
                                fprintf(stderr, "xing4d: X4_CUDA_ATTN_PROMPT=fa: k_attn_fa cannot run on this device or "
                                        "shape; k_attn_tc2 serves\n");
                }
                if (fa && attn_fa_ready)
                        attn_launch_fa(a, t0, n, max_parts, plen, c, layer, part, s);
                else
                        attn_launch_tc2(a, t0, n, max_parts, plen, c, layer, part, cu_pass_prompt() ? 2 : 1, s);
                attn_launch_combine(a, t0, n, max_parts, plen, c, part, out, s);
                return;
        }
        if (attn_dtc_chosen(c->D, c->f16)) {
                uint32_t plen = attn_dtc_part();
                attn_launch_dtc(a, t0, n, max_parts, plen, c, layer, part, s);
                attn_launch_combine(a, t0, n, max_parts, plen, c, part, out, s);
                return;
        }
        if (force == 6 && attn_tc_ready && c->D == attn_tc_D) {
                /* its own numerics (see k_attn_tc), for every shape */
                attn_launch_tc(a, t0, n, max_parts, c, layer, part, s);
                attn_launch_combine(a, t0, n, max_parts, CU_ATTN_PART, c, part, out, s);
                return;
        }
        bool split = force != 5 && attn_split_ok(a, c);
        if (split && (force == 4 || (force == 0 && blocks + 1 <= (uint64_t) ATT_SPLIT_BELOW)))
                attn_launch_split(a, t0, n, max_parts, c, layer, sc, part, s);
        else if (force == 1 || (c->D > 32 * ATT_KC))
                attn_launch<32, 4>(a, t0, n, max_parts, c, layer, part, s);
        else if (force == 2)
                attn_launch_dec<4>(a, t0, n, max_parts, c, layer, part, s);
        else if (force == 3)
                attn_launch_dec<2>(a, t0, n, max_parts, c, layer, part, s);
        else if (blocks >= 256)
                attn_launch<32, 4>(a, t0, n, max_parts, c, layer, part, s);
        else if (blocks >= 32)
                attn_launch_dec<4>(a, t0, n, max_parts, c, layer, part, s);
        else
                attn_launch_dec<2>(a, t0, n, max_parts, c, layer, part, s);
        attn_launch_combine(a, t0, n, max_parts, CU_ATTN_PART, c, part, out, s);
}
