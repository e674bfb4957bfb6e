/* SPDX-License-Identifier: MIT */
/* Prompt attention in the non-absorbed form (docs/model.md §4; issue 12 allows it for prompts,
 * decode keeps the absorbed form). Per head a query row is [q_nope ; RoPE(q_pe)] (nope + R
 * values) and a key row [k_nope ; k_pe] with k_nope = Kb[h] · c_j; the values are v = Vb[h] · c_j.
 * That is 2·(nope + R + V) = 640 flops a (query, position, head) against the absorbed form's
 * 2·(KV + R + KV) = 2,176, at the price of expanding each position's latent into its keys and
 * values once per pass: k_mha_expand writes them as f16 into a scratch, k_mha_attend runs a
 * flash-attention tile (64 queries of one sequence and one head, 64 positions a step, online
 * softmax in registers) over them.
 *
 * The context splits at fixed absolute positions (parts of cu_mha_part_len() positions), each
 * (sequence, part) a job whose partial [o | m | l] k_attn_combine folds in part order, so a row's
 * arithmetic depends on its own position alone: the expansion of position j is one chain of
 * mma over the latent whatever the job, a query row's steps are the part's 64-position tiles in
 * order (tiles past the row's own position are masked to exact no-ops), and the tile's other rows
 * never enter its sums. Batch- and chunk-invariant by construction; its bits are its own (f16
 * operands, f32 accumulation), not the absorbed kernels'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

#define MHA_BM 64      /* positions (expansion rows) a block / queries a block */
#define MHA_BK 64      /* latent values a staging step of the expansion */
#define MHA_PAD 8      /* f16 pad of every shared row (ldmatrix rows on distinct banks) */
#define MHA_THREADS 128 /* 4 warps, 16 rows each */
static_assert(MHA_BM == MHA_QTILE, "the host plans query tiles of MHA_BM tokens");

static __device__ __forceinline__ uint32_t mha_pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *(uint32_t *) &h;
}

/* 8 consecutive weights (F32, F16 or BF16 rows) as loaded, and as 8 f16 values */
template <typename WT>
struct mha_w8 {
        uint4 r[sizeof(WT) / 2];
};
template <typename WT>
static __device__ __forceinline__ void mha_w8_load(mha_w8<WT> &x, const WT *p) {
#pragma unroll
        for (int i = 0; i < (int) (sizeof(WT) / 2); i++)
                x.r[i] = ((const uint4 *) p)[i];
}
static __device__ __forceinline__ uint4 mha_w8_half(const mha_w8<float> &x) {
        return make_uint4(mha_pack(__uint_as_float(x.r[0].x), __uint_as_float(x.r[0].y)),
                          mha_pack(__uint_as_float(x.r[0].z), __uint_as_float(x.r[0].w)),
                          mha_pack(__uint_as_float(x.r[1].x), __uint_as_float(x.r[1].y)),
                          mha_pack(__uint_as_float(x.r[1].z), __uint_as_float(x.r[1].w)));
}
static __device__ __forceinline__ uint4 mha_w8_half(const mha_w8<__half> &x) {
        return x.r[0];
}
/* bf16 pairs (low half first) to f16 pairs */
static __device__ __forceinline__ uint32_t mha_bf2h(uint32_t u) {
        return mha_pack(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
static __device__ __forceinline__ uint4 mha_w8_half(const mha_w8<uint16_t> &x) {
        return make_uint4(mha_bf2h(x.r[0].x), mha_bf2h(x.r[0].y), mha_bf2h(x.r[0].z), mha_bf2h(x.r[0].w));
}

/* 8 consecutive cache values as f16 */
static __device__ __forceinline__ uint4 mha_c8(const float *p) {
        float4 a = ((const float4 *) p)[0], b = ((const float4 *) p)[1];
        return make_uint4(mha_pack(a.x, a.y), mha_pack(a.z, a.w), mha_pack(b.x, b.y), mha_pack(b.z, b.w));
}
static __device__ __forceinline__ uint4 mha_c8(const __half *p) {
        return *(const uint4 *) p;
}

/* the job of flattened index x: the last job whose first index (field `off` of jobs) ≤ x */
template <int OFF>
static __device__ __forceinline__ uint32_t mha_find(const struct cu_mha_job *jobs, uint32_t n, uint32_t x) {
        uint32_t lo = 0, hi = n - 1;
        while (lo < hi) {
                uint32_t mid = (lo + hi + 1) / 2;
                uint32_t v = OFF == 0 ? jobs[mid].row0 : jobs[mid].qt0;
                if (v <= x)
                        lo = mid;
                else
                        hi = mid - 1;
        }
        return lo;
}

/* ---- expansion: k_nope and v of every position of the batch's jobs ------------------------- */

/* Shared memory of k_mha_expand: the rows' whole latent (f16) and two weight tiles. */
static size_t mha_expand_smem(uint32_t KV, uint32_t BN) {
        size_t b = (size_t) MHA_BK * (BN + MHA_PAD) > (size_t) BN * (MHA_BK + MHA_PAD)
                           ? (size_t) MHA_BK * (BN + MHA_PAD)
                           : (size_t) BN * (MHA_BK + MHA_PAD);
        return ((size_t) MHA_BM * (KV + MHA_PAD) + 2 * b) * 2;
}

/* One block: MHA_BM rows of the batch (positions of its jobs) × every output of HPB heads: per
 * head nope / BN column tiles of keys (Kb[h][c][d], staged [c][d] and read transposed) and V / BN
 * of values (Vb[h][d][c], staged [d][c]). The rows' latent is staged once as f16 (vector loads);
 * the weights MHA_BK latent values at a time through two shared tiles, the next tile's loads in
 * flight while the current one's products run. Every output is one chain of m16n8k16 steps over
 * the latent in order: its bits depend on its row's latent alone. The first key tile of a head also
 * copies the row's k_pe (f16) after k_nope. */
template <typename CT, typename WT, int BN>
__global__ void __launch_bounds__(MHA_THREADS)
        k_mha_expand(struct cu_mha m, struct cu_cache c, uint32_t layer, uint32_t hpb) {
        extern __shared__ __align__(16) unsigned char mha_xsmem[];
        __shared__ uint64_t roff[MHA_BM];
        static_assert(BN % 32 == 0 && BN <= 128, "column tiles of 32 to 128");
        const uint32_t nope = m.nope, V = m.V, KV = m.KV, R = m.R, DK = nope + R;
        const uint32_t AS = KV + MHA_PAD;
        const uint32_t bstride = MHA_BK * (BN + MHA_PAD) > BN * (MHA_BK + MHA_PAD) ? MHA_BK * (BN + MHA_PAD)
                                                                                   : BN * (MHA_BK + MHA_PAD);
        __half *sA = (__half *) mha_xsmem, *sB = sA + MHA_BM * AS;
        const uint32_t kt_k = nope / BN, per_head = kt_k + V / BN, h0 = blockIdx.y * hpb;
        const uint32_t nchunk = KV / MHA_BK, n_steps = hpb * per_head * nchunk;
        const uint32_t r0 = blockIdx.x * MHA_BM, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        const uint32_t g = lane / 4, cq = lane % 4;
        const WT *kb = (const WT *) m.kb, *vb = (const WT *) m.vb;

        /* the rows' cache offsets (metadata: before the wait; rows past the batch are zeros) */
        if (tid < MHA_BM) {
                uint32_t r = r0 + tid;
                uint64_t o = UINT64_MAX;
                if (r < m.rows) {
                        const struct cu_mha_job &j = m.jobs[mha_find<0>(m.jobs, m.n_jobs, r)];
                        uint32_t pos = j.pos0 + (r - j.row0);
                        if (pos < j.pos0 + j.npos) {
                                uint32_t page = c.pt[c.tok_pt[j.tok] + pos / c.page_tokens];
                                o = (((uint64_t) page * c.n_layer + layer) * c.page_tokens + pos % c.page_tokens) * c.D;
                        }
                }
                roff[tid] = o;
        }
        cu_pdl_wait();
        cu_pdl_trigger();
        __syncthreads();
        const CT *cache = (const CT *) c.base;

        /* step i: column tile i / nchunk of the block, latent chunk i % nchunk */
        constexpr int ITEMS = BN * MHA_BK / 8 / MHA_THREADS;
        mha_w8<WT> raw[ITEMS];
        auto load = [&](uint32_t i) {
                uint32_t t = i / nchunk, k0 = (i % nchunk) * MHA_BK, h = h0 + t / per_head, col = t % per_head;
#pragma unroll
                for (int it = 0; it < ITEMS; it++) {
                        uint32_t e = tid + it * MHA_THREADS;
                        if (col < kt_k) { /* [c][d]: BN / 8 items a latent row */
                                uint32_t kk = e / (BN / 8), n8 = (e % (BN / 8)) * 8;
                                mha_w8_load(raw[it], kb + ((uint64_t) h * KV + k0 + kk) * m.kb_row_elems + col * BN + n8);
                        } else {       /* [d][c]: MHA_BK / 8 items a value row */
                                uint32_t n = e / (MHA_BK / 8), k8 = (e % (MHA_BK / 8)) * 8;
                                mha_w8_load(raw[it], vb + ((uint64_t) h * V + (col - kt_k) * BN + n) * m.vb_row_elems + k0 + k8);
                        }
                }
        };
        auto store = [&](uint32_t i) {
                uint32_t t = i / nchunk, col = t % per_head;
                __half *b = sB + (i % 2) * bstride;
#pragma unroll
                for (int it = 0; it < ITEMS; it++) {
                        uint32_t e = tid + it * MHA_THREADS;
                        uint32_t off = col < kt_k ? (e / (BN / 8)) * (BN + MHA_PAD) + (e % (BN / 8)) * 8
                                                  : (e / (MHA_BK / 8)) * (MHA_BK + MHA_PAD) + (e % (MHA_BK / 8)) * 8;
                        *(uint4 *) (b + off) = mha_w8_half(raw[it]);
                }
        };
        load(0);
        /* the latent, once */
        for (uint32_t e = tid; e < MHA_BM * (KV / 8); e += MHA_THREADS) {
                uint32_t r = e / (KV / 8), k = (e % (KV / 8)) * 8;
                uint64_t o = roff[r];
                *(uint4 *) (sA + r * AS + k) = o == UINT64_MAX ? make_uint4(0, 0, 0, 0) : mha_c8(cache + o + k);
        }

        float acc[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
                acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
        for (uint32_t i = 0; i < n_steps; i++) {
                store(i);
                __syncthreads(); /* the tile (and the latent) visible; step i − 1's reads done */
                if (i + 1 < n_steps)
                        load(i + 1);
                uint32_t t = i / nchunk, kc = i % nchunk, h = h0 + t / per_head, col = t % per_head;
                bool keys = col < kt_k;
                const __half *b = sB + (i % 2) * bstride;
#pragma unroll
                for (uint32_t ks = 0; ks < MHA_BK; ks += 16) {
                        uint32_t a[4];
                        mtp_ldm4(a, sA + (warp * 16 + lane % 16) * AS + kc * MHA_BK + ks + (lane / 16) * 8);
#pragma unroll
                        for (int nt = 0; nt < BN / 8; nt += 2) {
                                uint32_t f[4];
                                if (keys) /* [k][n]: transposed */
                                        mtp_ldm4<true>(f, b + (ks + lane % 8 + ((lane / 8) % 2) * 8) * (BN + MHA_PAD) + nt * 8 + (lane / 16) * 8);
                                else
                                        mtp_ldm4(f, b + (nt * 8 + lane % 8 + (lane / 16) * 8) * (MHA_BK + MHA_PAD) + ks + ((lane / 8) % 2) * 8);
                                mtd_mma16<false>(acc[nt], a, f[0], f[1]);
                                mtd_mma16<false>(acc[nt + 1], a, f[2], f[3]);
                        }
                }
                if (kc + 1 < nchunk)
                        continue;
                /* the column tile done: f16 out, Kx[h][row][DK] (k_nope at its columns), Vx[h][row][V] */
                uint32_t n0 = (keys ? col : col - kt_k) * BN, ld = keys ? DK : V;
                __half *dst = (__half *) (keys ? m.kx + (uint64_t) h * m.rows_cap * DK : m.vx + (uint64_t) h * m.rows_cap * V);
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
                        for (int hf = 0; hf < 2; hf++) {
                                uint32_t r = r0 + warp * 16 + g + hf * 8;
                                if (r < m.rows)
                                        *(uint32_t *) (dst + (uint64_t) r * ld + n0 + nt * 8 + 2 * cq) =
                                                mha_pack(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
                        }
                        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
                }
                if (keys && col == 0)
                        for (uint32_t e = tid; e < MHA_BM * R; e += MHA_THREADS) {
                                uint32_t rl = e / R, x = e % R, r = r0 + rl;
                                if (r >= m.rows)
                                        continue;
                                uint64_t o = roff[rl];
                                dst[(uint64_t) r * DK + nope + x] =
                                        o == UINT64_MAX ? __float2half_rn(0.0f) : __float2half_rn((float) cache[o + KV + x]);
                        }
        }
}

/* ---- attention over the expanded rows ------------------------------------------------------- */

/* One block: a job's query tile (64 of its tokens, 16 a warp) and one head, over the job's
 * positions in tiles of 64 (K and V copied by cp.async, the next tile during the current one).
 * Scores in registers, scaled by scale·log2(e) through the f16 queries; the row's running max m
 * and sum l, o rescaled by exp2(m_old − m_new); p rounded to f16 for the p·v products. Hands the
 * combine [o | m·ln 2 | l] (natural-log units, as the absorbed kernels do). SMALL (cards whose
 * blocks get under ~112 KB of shared memory, or X4_CUDA_MHA_SMALL=1): the queries are staged in
 * the second key buffer, free until the first step restages it; the same arithmetic. */
template <int DK, int DV, bool SMALL>
__global__ void __launch_bounds__(MHA_THREADS)
        k_mha_attend(struct cu_mha m, const uint32_t *tok_pos) {
        extern __shared__ __align__(16) unsigned char mha_smem[];
        constexpr int KS = DK + MHA_PAD, VS = DV + MHA_PAD;
        __half *sK = (__half *) mha_smem + (SMALL ? 0 : MHA_BM * KS); /* 2 × [64][KS] */
        __half *sQ = SMALL ? sK + MHA_BM * KS : (__half *) mha_smem;   /* [64][KS] */
        __half *sV = sK + 2 * MHA_BM * KS;                             /* 2 × [64][VS] */
        __shared__ uint32_t spos[MHA_BM];
        const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, cq = lane % 4;
        const uint32_t h = blockIdx.y, n_head = gridDim.y;
        const struct cu_mha_job &j = m.jobs[mha_find<1>(m.jobs, m.n_jobs, blockIdx.x)];
        const uint32_t q0 = (blockIdx.x - j.qt0) * MHA_BM; /* the tile's first query of the job */
        const uint32_t nq = min((uint32_t) MHA_BM, j.nq - q0);
        if (tid < MHA_BM)
                spos[tid] = tid < nq ? tok_pos[j.tq + q0 + tid] : j.pos0; /* absent rows: see pos0 only */
        cu_pdl_wait();
        cu_pdl_trigger();
        __syncthreads();
        const uint32_t pmax = min(spos[nq - 1], j.pos0 + j.npos - 1); /* positions are consecutive */
        const uint32_t n_tiles = (pmax - j.pos0) / MHA_BM + 1;
        const __half *kx = (const __half *) m.kx + (uint64_t) h * m.rows_cap * DK;
        const __half *vx = (const __half *) m.vx + (uint64_t) h * m.rows_cap * DV;

        /* stage tile kt: rows past the job's positions zero */
        auto stage = [&](uint32_t kt, int buf) {
                __half *k = sK + buf * MHA_BM * KS, *v = sV + buf * MHA_BM * VS;
                uint32_t p0 = kt * MHA_BM;
                for (uint32_t e = tid; e < MHA_BM * (DK / 8); e += MHA_THREADS) {
                        uint32_t r = e / (DK / 8), x = (e % (DK / 8)) * 8;
                        if (p0 + r < j.npos)
                                mtd_cp16(k + r * KS + x, kx + (uint64_t) (j.row0 + p0 + r) * DK + x);
                        else
                                *(uint4 *) (k + r * KS + x) = make_uint4(0, 0, 0, 0);
                }
                for (uint32_t e = tid; e < MHA_BM * (DV / 8); e += MHA_THREADS) {
                        uint32_t r = e / (DV / 8), x = (e % (DV / 8)) * 8;
                        if (p0 + r < j.npos)
                                mtd_cp16(v + r * VS + x, vx + (uint64_t) (j.row0 + p0 + r) * DV + x);
                        else
                                *(uint4 *) (v + r * VS + x) = make_uint4(0, 0, 0, 0);
                }
                mtd_commit();
        };
        stage(0, 0);

        /* the queries: f16 of q · scale · log2(e) */
        const float qs = m.scale * 1.4426950408889634f;
        for (uint32_t e = tid; e < MHA_BM * DK; e += MHA_THREADS) {
                uint32_t r = e / DK, x = e % DK;
                float v = r < nq ? m.q[((uint64_t) (j.tq + q0 + r) * n_head + h) * DK + x] * qs : 0.0f;
                sQ[r * KS + x] = __float2half_rn(v);
        }
        __syncthreads();
        uint32_t qf[DK / 16][4];
#pragma unroll
        for (int ks = 0; ks < DK / 16; ks++)
                mtp_ldm4(qf[ks], sQ + (warp * 16 + lane % 16) * KS + ks * 16 + (lane / 16) * 8);
        if (SMALL)
                __syncthreads(); /* every warp has its fragments before step 0 restages buffer 1 */
        const uint32_t pr0 = spos[warp * 16 + g], pr1 = spos[warp * 16 + g + 8];
        const uint32_t pend = j.pos0 + j.npos; /* positions ≥ pend are not this job's */

        float o[DV / 8][4];
#pragma unroll
        for (int i = 0; i < DV / 8; i++)
                o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
        float mx0 = -INFINITY, mx1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

        for (uint32_t kt = 0; kt < n_tiles; kt++) {
                int buf = kt & 1;
                if (kt + 1 < n_tiles) {
                        stage(kt + 1, buf ^ 1);
                        mtd_wait(1);
                } else {
                        mtd_wait(0);
                }
                __syncthreads();
                const __half *k = sK + buf * MHA_BM * KS, *v = sV + buf * MHA_BM * VS;
                float s[8][4];
#pragma unroll
                for (int i = 0; i < 8; i++)
                        s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
                for (int ks = 0; ks < DK / 16; ks++)
#pragma unroll
                        for (int nt = 0; nt < 8; nt += 2) {
                                uint32_t b[4];
                                mtp_ldm4(b, k + (nt * 8 + lane % 8 + (lane / 16) * 8) * KS + ks * 16 + ((lane / 8) % 2) * 8);
                                mtd_mma16<false>(s[nt], qf[ks], b[0], b[1]);
                                mtd_mma16<false>(s[nt + 1], qf[ks], b[2], b[3]);
                        }
                /* mask: past the row's own position or the job's positions */
                uint32_t pbase = j.pos0 + kt * MHA_BM;
                float t0 = -INFINITY, t1 = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                                uint32_t p = pbase + nt * 8 + 2 * cq + e;
                                if (p > pr0 || p >= pend)
                                        s[nt][e] = -INFINITY;
                                if (p > pr1 || p >= pend)
                                        s[nt][2 + e] = -INFINITY;
                                t0 = fmaxf(t0, s[nt][e]);
                                t1 = fmaxf(t1, s[nt][2 + e]);
                        }
                t0 = fmaxf(t0, __shfl_xor_sync(CU_FULL_MASK, t0, 1));
                t0 = fmaxf(t0, __shfl_xor_sync(CU_FULL_MASK, t0, 2));
                t1 = fmaxf(t1, __shfl_xor_sync(CU_FULL_MASK, t1, 1));
                t1 = fmaxf(t1, __shfl_xor_sync(CU_FULL_MASK, t1, 2));
                float n0 = fmaxf(mx0, t0), n1 = fmaxf(mx1, t1);
                float a0 = exp2f(mx0 - n0), a1 = exp2f(mx1 - n1); /* first tile: exp2(−inf) = 0 */
                mx0 = n0;
                mx1 = n1;
                l0 *= a0;
                l1 *= a1;
#pragma unroll
                for (int i = 0; i < DV / 8; i++) {
                        o[i][0] *= a0;
                        o[i][1] *= a0;
                        o[i][2] *= a1;
                        o[i][3] *= a1;
                }
                uint32_t pf[4][4]; /* p as the A fragments of 4 k-steps of 16 positions */
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                        float e0 = exp2f(s[nt][0] - n0), e1 = exp2f(s[nt][1] - n0);
                        float e2 = exp2f(s[nt][2] - n1), e3 = exp2f(s[nt][3] - n1);
                        l0 += e0 + e1;
                        l1 += e2 + e3;
                        pf[nt / 2][(nt % 2) * 2] = mha_pack(e0, e1);
                        pf[nt / 2][(nt % 2) * 2 + 1] = mha_pack(e2, e3);
                }
#pragma unroll
                for (int ks = 0; ks < 4; ks++)
#pragma unroll
                        for (int nt = 0; nt < DV / 8; nt += 2) {
                                uint32_t b[4];
                                mtp_ldm4<true>(b, v + (ks * 16 + lane % 8 + ((lane / 8) % 2) * 8) * VS + nt * 8 + (lane / 16) * 8);
                                mtd_mma16<false>(o[nt], pf[ks], b[0], b[1]);
                                mtd_mma16<false>(o[nt + 1], pf[ks], b[2], b[3]);
                        }
                __syncthreads(); /* the buffer is restaged two steps on */
        }
        l0 += __shfl_xor_sync(CU_FULL_MASK, l0, 1);
        l0 += __shfl_xor_sync(CU_FULL_MASK, l0, 2);
        l1 += __shfl_xor_sync(CU_FULL_MASK, l1, 1);
        l1 += __shfl_xor_sync(CU_FULL_MASK, l1, 2);

        /* partial of (token, part, head): [o | m | l], rows of DV + 2 */
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
                uint32_t r = warp * 16 + g + hf * 8;
                if (r >= nq)
                        continue;
                uint32_t tl = j.tl0 + q0 + r;
                float *dst = m.part + (((uint64_t) tl * j.maxp + j.part) * n_head + h) * (DV + 2);
#pragma unroll
                for (int nt = 0; nt < DV / 8; nt++)
                        *(float2 *) (dst + nt * 8 + 2 * cq) = make_float2(o[nt][2 * hf], o[nt][2 * hf + 1]);
                if (cq == 0) {
                        dst[DV] = (hf ? mx1 : mx0) * 0.6931471805599453f;
                        dst[DV + 1] = hf ? l1 : l0;
                }
        }
}

/* ---- host ----------------------------------------------------------------------------------- */

static size_t mha_attend_smem(uint32_t DK, uint32_t DV, bool small) {
        return (size_t) MHA_BM * (DK + MHA_PAD) * 2 * (small ? 2 : 3) + (size_t) MHA_BM * (DV + MHA_PAD) * 2 * 2;
}


/* heads a block of the expansion takes (each block reads its rows' latent once for them) */
static uint32_t mha_hpb(uint32_t n_head) {
        return n_head % 4 == 0 ? 4 : n_head % 2 == 0 ? 2 : 1;
}

/* the shapes with an instantiated kernel: (nope, R, V) */
#define MHA_SHAPES(X) X(128, 64, 128) X(32, 32, 32) X(32, 16, 32)

/* Per backend: whether this card has kernels for the shape, and its choices (cu_mha_batch's bn and
 * small: the expansion's column tile, 128, 64 or 32, the widest the key and value widths and the
 * card's shared memory allow; whether the attention stages its queries in a key buffer). The bits
 * are the same for every choice (tests/gpu `mha_small`). */
extern "C" bool cu_mha_setup(uint32_t nope, uint32_t R, uint32_t V, uint32_t KV, uint32_t *bn_out, bool *small_out) {
        int dev = 0, major = 0, smem_max = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
                (void) cudaGetLastError();
                return false;
        }
        if (major < 8 || KV % MHA_BK != 0)
                return false;
        /* X4_CUDA_MHA_SMALL=1: the small-memory choices on any card (their tests) */
        const char *e = getenv("X4_CUDA_MHA_SMALL");
        bool force_small = e && !strcmp(e, "1");
        const size_t room = (size_t) smem_max - 1024; /* the kernels' static arrays */
        bool small = force_small || mha_attend_smem(nope + R, V, false) > room;
        if (mha_attend_smem(nope + R, V, small) > room)
                return false;
        uint32_t bn = 0;
        static const uint32_t widths[] = {128, 64, 32};
        for (uint32_t w : widths)
                if (!bn && nope % w == 0 && V % w == 0 && mha_expand_smem(KV, w) <= room && !(force_small && w == 128))
                        bn = w;
        if (!bn)
                return false;
        /* one limit for every instance: what this backend launches, or more if a backend of
         * another shape in this process needed it */
        static int attr;
        size_t need = mha_expand_smem(KV, bn) > mha_attend_smem(nope + R, V, small) ? mha_expand_smem(KV, bn)
                                                                                      : mha_attend_smem(nope + R, V, small);
        if ((int) need > attr)
                attr = (int) need;
        const int xs = attr;
        bool ok = true;
#define MHA_XSET(CT, WT, BN) \
        ok = ok && cudaFuncSetAttribute(k_mha_expand<CT, WT, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, xs) == cudaSuccess;
#define MHA_XSET_ALL(BN) \
        MHA_XSET(float, float, BN) MHA_XSET(float, __half, BN) MHA_XSET(float, uint16_t, BN) \
        MHA_XSET(__half, float, BN) MHA_XSET(__half, __half, BN) MHA_XSET(__half, uint16_t, BN)
        if (bn == 128) {
                MHA_XSET_ALL(128)
        } else if (bn == 64) {
                MHA_XSET_ALL(64)
        } else {
                MHA_XSET_ALL(32)
        }
#undef MHA_XSET_ALL
#undef MHA_XSET
        bool att = false;
#define MHA_SET(N, RR, VV)                                                                          \
        if (nope == N && R == RR && V == VV)                                                        \
                att = small ? cudaFuncSetAttribute(k_mha_attend<N + RR, VV, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, xs) == cudaSuccess \
                            : cudaFuncSetAttribute(k_mha_attend<N + RR, VV, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, xs) == cudaSuccess;
        MHA_SHAPES(MHA_SET)
#undef MHA_SET
        if (!ok || !att) {
                (void) cudaGetLastError();
                return false;
        }
        *bn_out = bn;
        *small_out = small;
        return true;
}

extern "C" bool cu_mha_supported(uint32_t kb_type, uint32_t vb_type) {
        return kb_type == vb_type && (kb_type == 0 || kb_type == 1 || kb_type == 30);
}

extern "C" void cu_mha_batch(const struct cu_mha *m, uint32_t bn, bool small, const struct cu_cache *c, uint32_t layer,
                             cudaStream_t s) {
        if (m->rows == 0 || m->qtiles == 0)
                return;
        uint32_t hpb = mha_hpb(m->n_head);
        dim3 eg((m->rows + MHA_BM - 1) / MHA_BM, m->n_head / hpb);
        cu_launches++;
#define MHA_EXP(CT, WT, BN) cu_launch(k_mha_expand<CT, WT, BN>, eg, MHA_THREADS, mha_expand_smem(m->KV, BN), s, *m, *c, layer, hpb)
#define MHA_EXP_W(CT, BN)                                                                           \
        do {                                                                                        \
                if (m->w_type == 0)                                                                 \
                        MHA_EXP(CT, float, BN);                                                     \
                else if (m->w_type == 1)                                                            \
                        MHA_EXP(CT, __half, BN);                                                    \
                else                                                                                \
                        MHA_EXP(CT, uint16_t, BN);                                                  \
        } while (0)
        if (bn == 128) {
                if (c->f16)
                        MHA_EXP_W(__half, 128);
                else
                        MHA_EXP_W(float, 128);
        } else if (bn == 64) {
                if (c->f16)
                        MHA_EXP_W(__half, 64);
                else
                        MHA_EXP_W(float, 64);
        } else {
                if (c->f16)
                        MHA_EXP_W(__half, 32);
                else
                        MHA_EXP_W(float, 32);
        }
#undef MHA_EXP_W
#undef MHA_EXP
        dim3 ag(m->qtiles, m->n_head);
        cu_launches++;
#define MHA_RUN(N, RR, VV)                                                                          \
        if (m->nope == N && m->R == RR && m->V == VV)                                               \
                cu_launch(small ? k_mha_attend<N + RR, VV, true> : k_mha_attend<N + RR, VV, false>, ag, MHA_THREADS, \
                          mha_attend_smem(N + RR, VV, small), s, *m, c->tok_pos);
        MHA_SHAPES(MHA_RUN)
#undef MHA_RUN
}
