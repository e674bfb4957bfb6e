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

static __device__ __forceinline__ void mha_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
        (void) d, (void) a, (void) b0, (void) b1;
        __trap(); /* the host never picks these kernels below sm_80 */
#endif
}

static __device__ __forceinline__ uint32_t mha_pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *(uint32_t *) &h;
}

/* one weight element as float: F32, F16 or BF16 rows (cu_mha_supported names the types) */
static __device__ __forceinline__ float mha_w(const void *w, uint64_t i, uint32_t type) {
        if (type == 0)
                return ((const float *) w)[i];
        if (type == 1)
                return __half2float(((const __half *) w)[i]);
        uint32_t u = (uint32_t) ((const uint16_t *) w)[i] << 16;
        return __uint_as_float(u);
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

/* One block: MHA_BM rows of the batch (positions of its jobs) × BN outputs of one head, keys
 * (kind 0, Kb[h][c][d], staged [c][d] and read transposed) or values (kind 1, Vb[h][d][c],
 * staged [d][c]); the latent staged as f16 MHA_BK values at a time. Every output is one chain of
 * m16n8k16 steps over the latent in order: its bits depend on its row's latent alone. Kind-0
 * blocks of the head's first column tile also copy the row's k_pe (f16) after k_nope. */
template <typename CT, int BN>
__global__ void __launch_bounds__(MHA_THREADS)
        k_mha_expand(struct cu_mha m, struct cu_cache c, uint32_t layer) {
        __shared__ __align__(16) __half sA[MHA_BM][MHA_BK + MHA_PAD];
        __shared__ __align__(16) __half sB[MHA_BK][MHA_BK + MHA_PAD]; /* [n][k] or [k][n] */
        __shared__ uint64_t roff[MHA_BM];
        static_assert(BN == 32 || BN == 64, "column tiles of 32 or 64");
        const uint32_t nope = m.nope, V = m.V, KV = m.KV, R = m.R, DK = nope + R;
        const uint32_t kt_k = nope / BN, kt_v = V / BN, per_head = kt_k + kt_v;
        const uint32_t h = blockIdx.y / per_head, col = blockIdx.y % per_head;
        const uint32_t kind = col < kt_k ? 0 : 1, n0 = (kind ? col - kt_k : col) * BN;
        const uint32_t r0 = blockIdx.x * MHA_BM, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        const uint32_t g = lane / 4, cq = lane % 4;

        /* the rows' cache offsets (metadata: before the wait; rows past the batch read row 0) */
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

        float acc[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
                acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

        for (uint32_t k0 = 0; k0 < KV; k0 += MHA_BK) {
                __syncthreads();
                /* latent: 8 consecutive values a thread-step */
                for (uint32_t e = tid; e < MHA_BM * MHA_BK / 8; e += MHA_THREADS) {
                        uint32_t r = e / (MHA_BK / 8), k = (e % (MHA_BK / 8)) * 8;
                        uint64_t o = roff[r];
                        __half v[8];
#pragma unroll
                        for (int i = 0; i < 8; i++)
                                v[i] = o == UINT64_MAX ? __float2half_rn(0.0f)
                                                       : __float2half_rn((float) cache[o + k0 + k + i]);
                        *(uint4 *) &sA[r][k] = *(uint4 *) v;
                }
                /* weights */
                if (kind == 0) {
                        /* Kb[h][c][d]: rows c of nope values; staged [c][d] */
                        const uint64_t rb = m.kb_row_elems;
                        for (uint32_t e = tid; e < MHA_BK * BN; e += MHA_THREADS) {
                                uint32_t kk = e / BN, n = e % BN;
                                sB[kk][n] = __float2half_rn(mha_w(m.kb, ((uint64_t) h * KV + k0 + kk) * rb + n0 + n, m.w_type));
                        }
                } else {
                        /* Vb[h][d][c]: rows d of KV values; staged [d][c] */
                        const uint64_t rb = m.vb_row_elems;
                        for (uint32_t e = tid; e < MHA_BK * BN; e += MHA_THREADS) {
                                uint32_t n = e / MHA_BK, kk = e % MHA_BK;
                                sB[n][kk] = __float2half_rn(mha_w(m.vb, ((uint64_t) h * V + n0 + n) * rb + k0 + kk, m.w_type));
                        }
                }
                __syncthreads();
#pragma unroll
                for (uint32_t ks = 0; ks < MHA_BK; ks += 16) {
                        uint32_t a[4];
                        mtp_ldm4(a, &sA[warp * 16 + lane % 16][ks + (lane / 16) * 8]);
#pragma unroll
                        for (int nt = 0; nt < BN / 8; nt += 2) {
                                uint32_t b[4];
                                if (kind == 0) /* [k][n]: transposed */
                                        mtp_ldm4<true>(b, &sB[ks + lane % 8 + ((lane / 8) % 2) * 8][nt * 8 + (lane / 16) * 8]);
                                else
                                        mtp_ldm4(b, &sB[nt * 8 + lane % 8 + (lane / 16) * 8][ks + ((lane / 8) % 2) * 8]);
                                mha_mma(acc[nt], a, b[0], b[1]);
                                mha_mma(acc[nt + 1], a, b[2], b[3]);
                        }
                }
        }

        /* f16 out: Kx[h][row][DK] (k_nope at n0..), Vx[h][row][V] */
        __half *dst = (__half *) (kind == 0 ? m.kx + (uint64_t) h * m.rows_cap * DK : m.vx + (uint64_t) h * m.rows_cap * V);
        uint32_t ld = kind == 0 ? DK : V;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                        uint32_t r = r0 + warp * 16 + g + hf * 8;
                        if (r < m.rows)
                                *(uint32_t *) (dst + (uint64_t) r * ld + n0 + nt * 8 + 2 * cq) =
                                        mha_pack(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
                }
        if (kind == 0 && col == 0)
                for (uint32_t e = tid; e < MHA_BM * R; e += MHA_THREADS) {
                        uint32_t rl = e / R, i = e % R, r = r0 + rl;
                        if (r >= m.rows)
                                continue;
                        uint64_t o = roff[rl];
                        dst[(uint64_t) r * DK + nope + i] =
                                o == UINT64_MAX ? __float2half_rn(0.0f) : __float2half_rn((float) cache[o + KV + i]);
                }
}

/* ---- attention over the expanded rows ------------------------------------------------------- */

/* One block: a job's query tile (64 of its tokens, 16 a warp) and one head, over the job's
 * positions in tiles of 64 (K and V copied by cp.async, the next tile during the current one).
 * Scores in registers, scaled by scale·log2(e) through the f16 queries; the row's running max m
 * and sum l, o rescaled by exp2(m_old − m_new); p rounded to f16 for the p·v products. Hands the
 * combine [o | m·ln 2 | l] (natural-log units, as the absorbed kernels do). */
template <int DK, int DV>
__global__ void __launch_bounds__(MHA_THREADS)
        k_mha_attend(struct cu_mha m, const uint32_t *tok_pos) {
        extern __shared__ __align__(16) unsigned char mha_smem[];
        constexpr int KS = DK + MHA_PAD, VS = DV + MHA_PAD;
        __half *sQ = (__half *) mha_smem;               /* [64][KS] */
        __half *sK = sQ + MHA_BM * KS;                  /* 2 × [64][KS] */
        __half *sV = sK + 2 * MHA_BM * KS;              /* 2 × [64][VS] */
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
                                mha_mma(s[nt], qf[ks], b[0], b[1]);
                                mha_mma(s[nt + 1], qf[ks], b[2], b[3]);
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
                                mha_mma(o[nt], pf[ks], b[0], b[1]);
                                mha_mma(o[nt + 1], pf[ks], b[2], b[3]);
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

static size_t mha_attend_smem(uint32_t DK, uint32_t DV) {
        return (size_t) MHA_BM * (DK + MHA_PAD) * 2 * 3 + (size_t) MHA_BM * (DV + MHA_PAD) * 2 * 2;
}

/* the shapes with an instantiated kernel: (nope, R, V) */
#define MHA_SHAPES(X) X(128, 64, 128) X(32, 32, 32) X(32, 16, 32)

static bool mha_ready;

extern "C" bool cu_mha_setup(uint32_t nope, uint32_t R, uint32_t V, uint32_t KV) {
        int dev = 0, major = 0, smem_max = 0;
        mha_ready = false;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
                (void) cudaGetLastError();
                return false;
        }
        if (major < 8 || KV % MHA_BK != 0)
                return false;
        size_t need = mha_attend_smem(nope + R, V) + 1024;
        if (need > (size_t) smem_max)
                return false;
        bool ok = false;
#define MHA_SET(N, RR, VV)                                                                          \
        if (nope == N && R == RR && V == VV)                                                        \
                ok = cudaFuncSetAttribute(k_mha_attend<N + RR, VV>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                          (int) mha_attend_smem(N + RR, VV)) == cudaSuccess;
        MHA_SHAPES(MHA_SET)
#undef MHA_SET
        if (!ok) {
                (void) cudaGetLastError();
                return false;
        }
        mha_ready = true;
        return true;
}

extern "C" bool cu_mha_supported(uint32_t kb_type, uint32_t vb_type) {
        return mha_ready && kb_type == vb_type && (kb_type == 0 || kb_type == 1 || kb_type == 30);
}

extern "C" void cu_mha_batch(const struct cu_mha *m, const struct cu_cache *c, uint32_t layer, cudaStream_t s) {
        if (m->rows == 0 || m->qtiles == 0)
                return;
        uint32_t bn = (m->nope % 64 == 0 && m->V % 64 == 0) ? 64 : 32;
        dim3 eg((m->rows + MHA_BM - 1) / MHA_BM, m->n_head * (m->nope / bn + m->V / bn));
        cu_launches++;
        if (bn == 64) {
                if (c->f16)
                        cu_launch(k_mha_expand<__half, 64>, eg, MHA_THREADS, 0, s, *m, *c, layer);
                else
                        cu_launch(k_mha_expand<float, 64>, eg, MHA_THREADS, 0, s, *m, *c, layer);
        } else {
                if (c->f16)
                        cu_launch(k_mha_expand<__half, 32>, eg, MHA_THREADS, 0, s, *m, *c, layer);
                else
                        cu_launch(k_mha_expand<float, 32>, eg, MHA_THREADS, 0, s, *m, *c, layer);
        }
        dim3 ag(m->qtiles, m->n_head);
        cu_launches++;
#define MHA_RUN(N, RR, VV)                                                                          \
        if (m->nope == N && m->R == RR && m->V == VV)                                               \
                cu_launch(k_mha_attend<N + RR, VV>, ag, MHA_THREADS, mha_attend_smem(N + RR, VV), s, *m, c->tok_pos);
        MHA_SHAPES(MHA_RUN)
#undef MHA_RUN
}
