/* SPDX-License-Identifier: MIT */
/* Tensor-core products (sm_80+; issues 11, 12): the BF16 and IQ4_NL projections of every token (the
 * default; X4_CUDA_MM=fp32 leaves generated tokens on matvec.cu's CUDA-core products, prompt tokens
 * then still here in passes of their own, cu_mm_tc_pass), through mma.sync m16n8k16 with BF16
 * inputs and fp32 accumulation. Their own
 * numerics, not k_matvec's: the inputs are rounded to bf16 as they are staged; BF16 weights go in
 * as stored; IQ4_NL codebook values (small integers, exact in bf16) go in unscaled and each
 * 32-value block's two k16 products are scaled by the block's d in fp32 and added to the output in
 * block order.
 *
 * Batch and chunk invariance hold by construction: an output element (row r, input p) is the same
 * chain of mma instructions over the same K order whatever else shares the launch (an mma's
 * column n depends only on A, column n of B and column n of C; padding columns are zeros), and
 * every token count, one included, takes this kernel while tc is on. So with tc on, decode and
 * prefill rows of the same position agree bit for bit too.
 *
 * Layout: a block is MT_WARPS warps × MT_MT m-tiles (16 stored rows each) × NT n-tiles (8 inputs
 * each). The inputs of one K tile (MT_KT values) are staged in shared memory as bf16, rows padded
 * so a fragment load (row g = lane / 4, word t = lane % 4) hits 32 distinct banks. Weight
 * fragments are loaded straight from global memory.
 *
 * Fragment mapping (PTX m16n8k16, A row-major, B column-major): lane (g, t) holds A[g][2t..2t+1],
 * A[g+8][2t..2t+1], A[g][2t+8..2t+9], A[g+8][2t+8..2t+9] and B[2t..2t+1][g], B[2t+8..2t+9][g].
 * The products only need A's column k and B's row k to be the same value index, so IQ4_NL's k16
 * step s of a block takes the low nibbles of quant bytes 8s + 2t, 8s + 2t + 1 as columns 2t, 2t+1
 * (values 8s+2t, 8s+2t+1) and their high nibbles as columns 2t+8, 2t+9 (values 16+8s+2t, ...),
 * and B follows the same value indices. BF16 uses the plain mapping.
 *
 * Launches of at most MTD_P_MAX tokens (decode) take k_mm_tcd below instead: the same chains,
 * shaped for memory bandwidth (a warp per m-tile, cp.async rings); BF16 ones of at most 8 take
 * k_mm_tcs (an m-tile's K parts over a block's warps); X4_CUDA_MMTC_DEC=0 keeps k_mm_tc. Launches of more (prompts) take k_mm_tcp: the same chains again, shaped for the
 * tensor cores (128 × 64 block tiles, both operands through a cp.async ring, ldmatrix, grouped
 * experts in tiles of 64 pairs); X4_CUDA_MMTC_PROMPT=0 keeps k_mm_tc. */
#include <stdio.h>

#include <cuda_bf16.h>

#include "common.cuh"

#define MT_WARPS 4
#define MT_MT 2                                  /* m-tiles a warp: 32 stored rows */
#define MT_ROWS (MT_WARPS * MT_MT * 16)         /* stored rows a block: 128 */
#define MT_KT 256                                /* input values staged at a time (8 chunks) */
#define MT_XS (MT_KT + 8)                        /* bf16 per staged row: 132 words, 4g + t banks */
#define MT_NT_DENSE 8                            /* n-tiles a block for plain products: 64 inputs */
/* Every product sums K in parts of MT_KPART values: each part's sum starts from zero (BF16: the
 * part's mma chain; IQ4_NL: its blocks' k16 products scaled and added in block order by
 * mt_scale_add) and the parts' sums are added to the output in part order in fp32 (tot = 0; tot +=
 * part 0; tot += part 1; ...). Every kernel here runs that chain, so which kernel runs stays
 * invisible in the bits; it lets a decode launch spread one m-tile's parts over a block's warps
 * (k_mm_tcs) instead of one warp streaming a whole 3,584- or 4,096-value row alone. */
#define MT_KPART 256
static_assert(MT_KPART == MT_KT, "k_mm_tc ends a part with each staged tile");

enum { MT_DENSE, MT_GROUPED, MT_SEL };

static bool mm_tc_ready;
static bool mm_tc_pass; /* the forward pass being launched is a prompt-class pass (cu_mm_tc_pass) */
static void mtd_setup(int dev);
static void mts_setup(void);
template <int TYPE, int NR>
static void mtp1_prepare(void);
static void mtp_setup(void);

/* Every token on tensor cores: the default on sm_80+ since k_mm_tcs made batch-1 decode as fast
 * on them as on the CUDA-core products (H200, full model, one call at bf56437: 192.5 against 191.6
 * tok/s at 512, 177.8 against 174.7 at 4,096) while batches gained (batch 64 at 512: 1,917 against
 * 944; bench/RESULTS.md). X4_CUDA_MM
 * set to anything but tc (fp32, or k_mm's 0-3) puts generated tokens back on the CUDA-core
 * products (matvec.cu: the fp32 numerics); X4_CUDA_PROMPT=fp32 then puts prompt tokens there too. */
static bool mm_tc_all(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_MM");
                on = !e || !*e || !strcmp(e, "tc");
                /* a misspelt value would silently mean fp32: say what it was taken as */
                if (!on && strcmp(e, "fp32") && !(e[0] >= '0' && e[0] <= '3' && !e[1]))
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MM=%s: expected tc, fp32 or 0-3; taken as fp32 "
                                        "(generated tokens on the CUDA-core products)\n", e);
        }
        return on;
}

static bool mm_tc_prompt(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_PROMPT");
                on = !(e && !strcmp(e, "fp32"));
        }
        return on;
}

static void q6tc_setup(void); /* the Q6_K head on tensor cores (below) */

bool cu_rope_side_done;

extern "C" void cu_mm_tc_setup(void) {
        int dev = 0, major = 0;
        mm_tc_ready = cudaGetDevice(&dev) == cudaSuccess &&
                      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                      major >= 8;
        if (mm_tc_ready && (mm_tc_all() || mm_tc_prompt())) {
                mtd_setup(dev); /* only the kernels' attributes: nothing else changes */
                mtp_setup();
                q6tc_setup();
        }
}

extern "C" bool cu_mm_tc_prompt_class(void) {
        /* prompt tokens take kernels of their own: the prompt attention (mha.cu, tc2) whatever the
         * products, and the tensor-core products while generated tokens keep the fp32 ones */
        return mm_tc_ready && (mm_tc_prompt() || mm_tc_all());
}

extern "C" void cu_mm_tc_pass(bool prompt) {
        mm_tc_pass = prompt;
}

extern "C" bool cu_pass_prompt(void) {
        return mm_tc_pass && cu_mm_tc_prompt_class();
}

/* two bf16 values in a word, the first in the low half */
[[maybe_unused]] static __device__ __forceinline__ uint32_t mt_pack(uint16_t lo, uint16_t hi) {
        return (uint32_t) lo | ((uint32_t) hi << 16);
}

[[maybe_unused]] static __device__ __forceinline__ uint16_t mt_bf16(float v) {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        return *(uint16_t *) &h;
}

/* A block's two k16 products (tmp: rows g, g + 8 in e 0-1, 2-3) scaled by the rows' d and added
 * to the output: one fused multiply-add each (what `acc += d * tmp` compiled to with nvcc's
 * default --fmad=true). k_mm_tc and k_mm_tcd share it, so their chains stay the same. */
[[maybe_unused]] static __device__ __forceinline__ void mt_scale_add(float *acc, float d0, float d1, const float *tmp) {
        acc[0] = __fmaf_rn(d0, tmp[0], acc[0]);
        acc[1] = __fmaf_rn(d0, tmp[1], acc[1]);
        acc[2] = __fmaf_rn(d1, tmp[2], acc[2]);
        acc[3] = __fmaf_rn(d1, tmp[3], acc[3]);
}

/* docs/model.md §5: silu(gate)·up in fp32 (both kernels) */
[[maybe_unused]] static __device__ __forceinline__ float mt_silu_mul(float v, float up) {
        return v / (1.0f + expf(-v)) * up;
}

/* Write one m16n8 D fragment (both kernels): acc[e] is row r0 + g (e 0, 1) or r0 + g + 8 (e 2, 3),
 * column n0 + 2t + (e & 1). With NR == 2 the (gate, up) stored rows 2o, 2o + 1 are rows g and
 * g ^ 1, lanes 4 apart: every lane takes part in the shuffle, the even rows write silu(gate)·up. */
template <int NR, int MODE>
[[maybe_unused]] static __device__ __forceinline__ void
mt_store(const struct cu_mv &a, const float *acc, uint32_t r0, uint32_t n0, uint32_t g, uint32_t t,
         uint32_t n_rows, uint32_t n_p, uint32_t p0, const int32_t *perm, uint32_t grp) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
                uint32_t r = r0 + g + 8 * (e / 2);
                uint32_t n = n0 + 2 * t + (e & 1);
                float v = acc[e];
                if (NR == 2) {
                        float up = __shfl_xor_sync(CU_FULL_MASK, v, 4);
                        if (g & 1)
                                continue;
                        v = mt_silu_mul(v, up);
                }
                if (r >= n_rows || n >= n_p)
                        continue;
                uint32_t p = MODE == MT_GROUPED ? (uint32_t) perm[n] : p0 + n;
                uint32_t o = NR == 2 ? r / 2 : r;
                a.y[(uint64_t) p * a.y_pstride + (uint64_t) grp * a.y_gstride + (NR == 1 ? o % a.G : o)] = v;
        }
}

template <int TYPE, int NR, int MODE, int NT>
__global__ void __launch_bounds__(MT_WARPS * 32) k_mm_tc(struct cu_mv a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        __shared__ __align__(16) uint16_t xs[NT * 8][MT_XS];
        __shared__ uint16_t cb[16]; /* the IQ4_NL codebook as bf16 (exact: |v| ≤ 127) */
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        uint32_t n_in = NT * 8;
        uint32_t p0 = blockIdx.x * n_in, n_p = 0;
        const int32_t *perm = NULL;
        int32_t expert = 0;
        if (MODE == MT_GROUPED) {
                if (!cu_group_tile(a, blockIdx.x, &expert, &perm, &n_p))
                        return;
        } else if (MODE == MT_SEL) {
                p0 = blockIdx.x; /* one pair a block, its own expert */
                n_p = 1;
                expert = a.sel[p0];
        } else
                n_p = min(n_in, a.P - min(p0, a.P));
        if (TYPE == CU_TYPE_IQ4_NL && threadIdx.x < 16)
                cb[threadIdx.x] = mt_bf16(cu_iq4nl_values[threadIdx.x]);

        /* the block's stored rows; all in one input group (the host checks G) */
        uint32_t n_rows = a.N, row0 = blockIdx.y * MT_ROWS;
        uint32_t grp = NR == 1 && a.G != a.N ? row0 / a.G : 0;
        const uint8_t *wbase = (const uint8_t *) a.w + (uint64_t) expert * (MODE == MT_DENSE ? 0 : a.expert_bytes);
        /* rows g and g + 8 of each of the warp's m-tiles */
        const uint8_t *wr[MT_MT][2];
#pragma unroll
        for (int mt = 0; mt < MT_MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                        uint32_t r = row0 + warp * MT_MT * 16 + mt * 16 + g + 8 * h;
                        wr[mt][h] = wbase + (uint64_t) (r < n_rows ? r : 0) * a.row_bytes;
                }
        /* the inputs of the block's columns (pair ids; padding columns read input 0 as zeros) */
        float acc[MT_MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT_MT; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                                acc[mt][j][e] = 0.0f;
        float tot[MT_MT][NT][4] = {}; /* the parts' sums so far (acc: the current part's) */

        uint32_t n_chunks = a.K / CU_CHUNK;
        for (uint32_t k0 = 0; k0 < a.K; k0 += MT_KT) {
                uint32_t kt = min((uint32_t) MT_KT, a.K - k0);
                __syncthreads(); /* the previous tile has been read */
                /* stage: input n's values k0 .. k0 + kt as bf16 (float4 reads, 8-byte writes) */
                for (uint32_t e = threadIdx.x; e < n_in * (MT_KT / 4); e += blockDim.x) {
                        uint32_t n = e / (MT_KT / 4), k = 4 * (e % (MT_KT / 4));
                        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        if (n < n_p && k < kt) {
                                uint32_t p = MODE == MT_GROUPED ? (uint32_t) perm[n] : p0 + n;
                                const float *x = a.x + (uint64_t) (p / a.x_div) * a.x_pstride +
                                                 (uint64_t) grp * a.x_gstride;
                                v = *(const float4 *) (x + k0 + k);
                        }
                        *(uint2 *) &xs[n][k] = make_uint2(mt_pack(mt_bf16(v.x), mt_bf16(v.y)),
                                                          mt_pack(mt_bf16(v.z), mt_bf16(v.w)));
                }
                __syncthreads();
                uint32_t c_end = min(n_chunks, (k0 + kt) / CU_CHUNK);
                for (uint32_t c = k0 / CU_CHUNK; c < c_end; c++) {
                        uint32_t kc = c * CU_CHUNK - k0; /* the chunk's offset in the tile */
#pragma unroll
                        for (int mt = 0; mt < MT_MT; mt++) {
                                if constexpr (TYPE == CU_TYPE_IQ4_NL) {
                                        float tmp[NT][4];
#pragma unroll
                                        for (int j = 0; j < NT; j++)
#pragma unroll
                                                for (int e = 0; e < 4; e++)
                                                        tmp[j][e] = 0.0f;
                                        const uint8_t *b0 = wr[mt][0] + 18 * (uint64_t) c;
                                        const uint8_t *b1 = wr[mt][1] + 18 * (uint64_t) c;
                                        float d0 = __half2float(*(const __half *) b0);
                                        float d1 = __half2float(*(const __half *) b1);
#pragma unroll
                                        for (int s = 0; s < 2; s++) {
                                                /* quant bytes 8s + 2t, 8s + 2t + 1 of rows g, g + 8 */
                                                uint32_t q0 = *(const uint16_t *) (b0 + 2 + 8 * s + 2 * t);
                                                uint32_t q1 = *(const uint16_t *) (b1 + 2 + 8 * s + 2 * t);
                                                uint32_t af[4] = {
                                                        mt_pack(cb[q0 & 0xF], cb[(q0 >> 8) & 0xF]),
                                                        mt_pack(cb[q1 & 0xF], cb[(q1 >> 8) & 0xF]),
                                                        mt_pack(cb[(q0 >> 4) & 0xF], cb[q0 >> 12]),
                                                        mt_pack(cb[(q1 >> 4) & 0xF], cb[q1 >> 12]),
                                                };
#pragma unroll
                                                for (int j = 0; j < NT; j++) {
                                                        const uint16_t *xr = xs[j * 8 + g] + kc;
                                                        mtd_mma16<true>(tmp[j], af, *(const uint32_t *) (xr + 8 * s + 2 * t),
                                                               *(const uint32_t *) (xr + 16 + 8 * s + 2 * t));
                                                }
                                        }
#pragma unroll
                                        for (int j = 0; j < NT; j++)
                                                mt_scale_add(acc[mt][j], d0, d1, tmp[j]);
                                } else {
                                        const uint32_t *r0 = (const uint32_t *) (wr[mt][0] + 64 * (uint64_t) c);
                                        const uint32_t *r1 = (const uint32_t *) (wr[mt][1] + 64 * (uint64_t) c);
#pragma unroll
                                        for (int s = 0; s < 2; s++) {
                                                /* values 16s + 2t (+1) and 16s + 8 + 2t (+1): words 8s + t, 8s + 4 + t */
                                                uint32_t af[4] = { r0[8 * s + t], r1[8 * s + t], r0[8 * s + 4 + t],
                                                                   r1[8 * s + 4 + t] };
#pragma unroll
                                                for (int j = 0; j < NT; j++) {
                                                        const uint16_t *xr = xs[j * 8 + g] + kc + 16 * s;
                                                        mtd_mma16<true>(acc[mt][j], af, *(const uint32_t *) (xr + 2 * t),
                                                               *(const uint32_t *) (xr + 8 + 2 * t));
                                                }
                                        }
                                }
                        }
                }
                /* a tile is a part (MT_KPART): its sum added */
#pragma unroll
                        for (int mt = 0; mt < MT_MT; mt++)
#pragma unroll
                                for (int j = 0; j < NT; j++)
#pragma unroll
                                        for (int e = 0; e < 4; e++) {
                                                tot[mt][j][e] += acc[mt][j][e];
                                                acc[mt][j][e] = 0.0f;
                                        }
        }
        /* D fragment: rows g (e 0, 1) and g + 8 (e 2, 3), columns 2t and 2t + 1 of each n-tile */
#pragma unroll
        for (int mt = 0; mt < MT_MT; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
                        mt_store<NR, MODE>(a, tot[mt][j], row0 + warp * MT_MT * 16 + mt * 16, j * 8, g, t, n_rows,
                                           n_p, p0, perm, grp);
#else
        (void) a;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

template <int TYPE, int NR>
static void launch_tc(const struct cu_mv *a, cudaStream_t s) {
        uint32_t gy = (a->N + MT_ROWS - 1) / MT_ROWS;
        cu_launches++;
        if (a->sel && a->groups)
                cu_launch(k_mm_tc<TYPE, NR, MT_GROUPED, 1>, dim3(a->n_groups_max, gy), MT_WARPS * 32, 0, s, *a);
        else if (a->sel)
                cu_launch(k_mm_tc<TYPE, NR, MT_SEL, 1>, dim3(a->P, gy), MT_WARPS * 32, 0, s, *a);
        else if (a->P <= 8)
                cu_launch(k_mm_tc<TYPE, NR, MT_DENSE, 1>, dim3(1, gy), MT_WARPS * 32, 0, s, *a);
        else
                cu_launch(k_mm_tc<TYPE, NR, MT_DENSE, MT_NT_DENSE>,
                          dim3((a->P + 8 * MT_NT_DENSE - 1) / (8 * MT_NT_DENSE), gy), MT_WARPS * 32, 0, s, *a);
}

/* ---- k_mm_tcd: the same products for few inputs (decode), shaped for memory bandwidth ----
 *
 * k_mm_tc's arithmetic with another work distribution. An output element (row r, input p) is the
 * same chain of mma.sync m16n8k16 instructions as there: r sits in the m-tile of rows
 * 16·⌊r/16⌋ .. +15 at position r % 16, p in n-tile ⌊n/8⌋ at column n % 8 (n its column in the
 * block, as k_mm_tc places it: p itself for dense launches of ≤ 16 inputs, the pair's place in its
 * expert tile, column 0 for one pair), every lane holds the same A, B and C registers for every
 * mma, the K order is the same (chunks ascending, k16 steps s = 0, 1 of each), and IQ4_NL's block
 * products are scaled and added by the same mt_scale_add. Only who computes which m-tile and how
 * the bytes reach the registers differ. The choice between the two kernels (by token count) never
 * changes a bit.
 *
 * Work: one warp per 16-row m-tile, W warps a block (W = 1, 2 or 4, chosen on the host so that even
 * a 576-row matrix spreads over many SMs), NT = 1 or 2 n-tiles (≤ 16 inputs) or one expert tile. No
 * split-K: a warp runs its m-tile's whole K chain.
 *
 * Memory: the rows' bytes go global → shared memory with cp.async (16 bytes a lane, each row's
 * stretch of a stage contiguous, L2 only), MTD_KC chunks (256 values) a stage, in a ring of S
 * stages: S − 1 stages of every warp are in flight while one is computed. The inputs of each stage
 * (fp32, ≤ 16 rows) travel in the same ring and are rounded to bf16 as a B fragment is formed
 * (__floats2bfloat162_rn: the same round-to-nearest-even k_mm_tc's staging applies). S is chosen
 * at launch from the grid size so that the ring fills the SM's shared memory (more stages when
 * few blocks share an SM). Dense products issue their first stages' weight loads before waiting
 * for the previous kernel (programmatic dependent launch).
 *
 * Fragments are read from shared memory exactly as k_mm_tc reads them from global memory: BF16
 * words 8s + t and 8s + 4 + t of a row's chunk; IQ4_NL the 16-bit quant pairs at bytes
 * 2 + 8s + 2t of rows g and g + 8 and the block's d. IQ4_NL nibbles become bf16 codebook values in
 * registers with byte permutes (mtd_iq4_pair) instead of a shared-memory table: the same words.
 * A warp reads and decodes MTD_PF chunks' fragments before their mma (mtd_mma: mtd_mma16<true>'s
 * instruction, not volatile, so the compiler may schedule the reads early).
 * Staged rows are padded so the fragment reads hit distinct banks (IQ4_NL: 144-byte rows, 36 words
 * ≡ 4 mod 32; BF16: 528 bytes, 132 words; inputs: 264 floats ≡ 8 mod 32 for the 8-byte reads). */
#define MTD_KC 8                                    /* chunks a stage */
#define MTD_KV (MTD_KC * CU_CHUNK)                  /* values a stage: 256 */
#define MTD_XS (MTD_KV + 8)                         /* floats a staged input row */
#define MTD_WARPS_MAX 4
#define MTD_S_MAX 12                                /* ring stages at most */
/* Token counts up to which tc products take k_mm_tcd (X4_CUDA_MMTC_DEC=0: never). 16 inputs are
 * two n-tiles: a weight byte then feeds at most two mma, so the product is bound by the weight
 * bytes, which k_mm_tc (128-row blocks, one k-step of loads in flight, x staged for 64 inputs)
 * cannot stream at batch sizes where its grid is a handful of blocks; beyond 16, k_mm_tc's
 * 64-input tiles reuse each weight fragment 8 times and are the better shape. Expert products
 * count (token, expert) pairs: up to MTD_P_MAX · CU_SLOTS_MAX. The same bound as the CUDA-core
 * decode kernel (matvec.cu, MVS_P_MAX). */
#define MTD_P_MAX 16


/* The A words of one 16-bit quant pair q (bytes b0 = q & 0xff, b1 = q >> 8 of a row): lo =
 * {cb[b0 & 0xF], cb[b1 & 0xF]}, hi = {cb[b0 >> 4], cb[b1 >> 4]} (first value in the low half),
 * k_mm_tc's mt_pack(cb[q & 0xF], cb[(q >> 8) & 0xF]) and mt_pack(cb[(q >> 4) & 0xF], cb[q >> 12]).
 * tl/th hold the low/high bytes of the 16 bf16 codebook values, entry i in byte i % 4 of word
 * i / 4. A permute picks per nibble among 8 bytes (3 bits; the fourth selector bit would
 * sign-fill, hence the masks): one from entries 0-7, one from 8-15, and a third picks between
 * them by the nibble's bit 3. */
[[maybe_unused]] static __device__ __forceinline__ void mtd_iq4_pair(uint32_t q, const uint32_t *tl,
                                                                     const uint32_t *th, uint32_t *lo,
                                                                     uint32_t *hi) {
        uint32_t sel = q & 0x7777u, pick = ((q >> 1) & 0x4444u) | 0x3210u;
        /* byte k: the low / high byte of cb[nibble k of q] (nibbles b0 & 0xF, b0 >> 4, b1 & 0xF, b1 >> 4) */
        uint32_t l = __byte_perm(__byte_perm(tl[0], tl[1], sel), __byte_perm(tl[2], tl[3], sel), pick);
        uint32_t h = __byte_perm(__byte_perm(th[0], th[1], sel), __byte_perm(th[2], th[3], sel), pick);
        *lo = __byte_perm(l, h, 0x6240u); /* {l0, h0, l2, h2}: cb[nibble 0] | cb[nibble 2] << 16 */
        *hi = __byte_perm(l, h, 0x7351u); /* {l1, h1, l3, h3}: cb[nibble 1] | cb[nibble 3] << 16 */
}

/* The tables mtd_iq4_pair reads: the IQ4_NL codebook as bf16 (k_mm_tc's cb), entry i's low byte
 * in byte i % 4 of tl[i / 4], its high byte likewise in th. */
[[maybe_unused]] static __device__ __forceinline__ void mtd_codebook(uint32_t *tl, uint32_t *th) {
#pragma unroll
        for (int i = 0; i < 16; i++) {
                uint32_t c = mt_bf16(cu_iq4nl_values[i]);
                tl[i / 4] |= (c & 0xFFu) << (8 * (i % 4));
                th[i / 4] |= (c >> 8) << (8 * (i % 4));
        }
}

/* mtd_mma16<true>'s instruction with the same operands, not volatile: the compiler may schedule a stage's
 * shared-memory reads and decodes ahead of it (the result does not depend on when it issues) */
[[maybe_unused]] static __device__ __forceinline__ void mtd_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
        (void) d, (void) a, (void) b0, (void) b1;
#endif
}

/* two staged inputs at k, k + 1 of a column as a bf16 pair, zeros for a padding column (whose
 * lanes read column 0, always staged, and drop it: no branch in the unrolled stage) */
[[maybe_unused]] static __device__ __forceinline__ uint32_t mtd_x2(const float *xs, bool on, uint32_t k) {
        float2 v = *(const float2 *) (xs + k);
        __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y); /* .x (low half) = v.x */
        return on ? *(const uint32_t *) &h : 0u;
}

/* one chunk's fragments of a lane: A of steps s = 0, 1 (the four words mtd_mma16 takes), B of each
 * n-tile and step, and for IQ4_NL the two rows' d */
#define MTD_PF 4 /* chunks fetched ahead of their mma */
template <int NT>
struct mtd_frag {
        uint32_t a[2][4];
        uint32_t b[NT][2][2];
        float d0, d1;
};

/* chunk cc's A fragments of a lane (and the two rows' d for IQ4_NL): mtd_fetch's, alone */
template <bool IQ4, int NT>
[[maybe_unused]] static __device__ __forceinline__ void mtd_fetch_a(const uint8_t *ws, uint32_t RB, uint32_t cc,
                                                                    uint32_t g, uint32_t t, const uint32_t *tl,
                                                                    const uint32_t *th, mtd_frag<NT> &f) {
        if constexpr (IQ4) {
                const uint8_t *b0 = ws + g * RB + 18 * cc, *b1 = b0 + 8 * RB;
                f.d0 = __half2float(*(const __half *) b0);
                f.d1 = __half2float(*(const __half *) b1);
#pragma unroll
                for (uint32_t s = 0; s < 2; s++) {
                        /* quant bytes 8s + 2t, 8s + 2t + 1 of rows g, g + 8 */
                        uint32_t q0 = *(const uint16_t *) (b0 + 2 + 8 * s + 2 * t);
                        uint32_t q1 = *(const uint16_t *) (b1 + 2 + 8 * s + 2 * t);
                        mtd_iq4_pair(q0, tl, th, &f.a[s][0], &f.a[s][2]);
                        mtd_iq4_pair(q1, tl, th, &f.a[s][1], &f.a[s][3]);
                }
        } else {
                const uint32_t *r0 = (const uint32_t *) (ws + g * RB + 64 * cc);
                const uint32_t *r1 = (const uint32_t *) (ws + (g + 8) * RB + 64 * cc);
#pragma unroll
                for (uint32_t s = 0; s < 2; s++) {
                        /* values 16s + 2t (+1) and 16s + 8 + 2t (+1): words 8s + t, 8s + 4 + t */
                        f.a[s][0] = r0[8 * s + t];
                        f.a[s][1] = r1[8 * s + t];
                        f.a[s][2] = r0[8 * s + 4 + t];
                        f.a[s][3] = r1[8 * s + 4 + t];
                }
        }
}

/* The input values chunk cc's k16 step s of a lane takes (B rows 2t, 2t + 1 and 2t + 8, 2t + 9):
 * IQ4_NL's quant bytes hold values v and v + 16, so its step s covers 8s + 2t .. and 16 + 8s + 2t;
 * BF16's covers 16s + 2t and 16s + 8 + 2t. Offsets in the chunk's 32 values. */
template <bool IQ4>
[[maybe_unused]] static __device__ __forceinline__ uint32_t mtd_bk(uint32_t s, uint32_t t, uint32_t half) {
        return IQ4 ? 16 * half + 8 * s + 2 * t : 16 * s + 8 * half + 2 * t;
}

/* chunk cc's fragments of a lane (k_mm_tcd and k_mm_tcs): A from the staged rows g, g + 8 of the
 * warp's m-tile at ws (RB bytes a row), read and decoded as k_mm_tc reads them; B of n-tile j from
 * the staged input row xs + xrow[j] (col_on[j] false: a padding column, zeros) */
template <bool IQ4, int NT>
[[maybe_unused]] static __device__ __forceinline__ void mtd_fetch(const uint8_t *ws, uint32_t RB, const float *xs,
                                                                  const uint32_t *xrow, const bool *col_on,
                                                                  uint32_t cc, uint32_t g, uint32_t t,
                                                                  const uint32_t *tl, const uint32_t *th,
                                                                  mtd_frag<NT> &f) {
        mtd_fetch_a<IQ4, NT>(ws, RB, cc, g, t, tl, th, f);
#pragma unroll
        for (uint32_t s = 0; s < 2; s++)
#pragma unroll
                for (int j = 0; j < NT; j++) {
                        const float *xr = xs + xrow[j] + 32 * cc;
                        f.b[j][s][0] = mtd_x2(xr, col_on[j], mtd_bk<IQ4>(s, t, 0));
                        f.b[j][s][1] = mtd_x2(xr, col_on[j], mtd_bk<IQ4>(s, t, 1));
                }
}

/* Lane group g's column in each of NT n-tiles (j·8 + g): whether it is one of the n inputs, and the
 * staged input row it reads (a padding column reads row 0, its products never stored) */
template <int NT>
[[maybe_unused]] static __device__ __forceinline__ void mtd_columns(uint32_t g, uint32_t n, bool *col_on,
                                                                    uint32_t *xrow) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
                col_on[j] = (uint32_t) j * 8 + g < n;
                xrow[j] = col_on[j] ? (j * 8 + g) * MTD_XS : 0;
        }
}

/* chunk f's two k16 steps as k_mm_tc runs them: BF16 into acc's mma chains, IQ4_NL from zero and
 * then scaled into acc by mt_scale_add */
template <bool IQ4, int NT>
[[maybe_unused]] static __device__ __forceinline__ void mtd_step(float (*acc)[4], const mtd_frag<NT> &f) {
        if constexpr (IQ4) {
                float tmp[NT][4];
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                                tmp[j][e] = 0.0f;
#pragma unroll
                for (uint32_t s = 0; s < 2; s++)
#pragma unroll
                        for (int j = 0; j < NT; j++)
                                mtd_mma(tmp[j], f.a[s], f.b[j][s][0], f.b[j][s][1]);
#pragma unroll
                for (int j = 0; j < NT; j++)
                        mt_scale_add(acc[j], f.d0, f.d1, tmp[j]);
        } else {
#pragma unroll
                for (uint32_t s = 0; s < 2; s++)
#pragma unroll
                        for (int j = 0; j < NT; j++)
                                mtd_mma(acc[j], f.a[s], f.b[j][s][0], f.b[j][s][1]);
        }
}

/* a stage's (or part's) nc chunks through fetch and step (k_mm_tcd, k_mm_tcs): a whole one (full:
 * always for IQ4_NL, whose K the host checks is a multiple of 256) unrolled, MTD_PF chunks'
 * fragments read and decoded before their steps so the shared-memory reads and decodes overlap
 * the mma chain; a partial one chunk by chunk */
template <int NT, typename Fetch, typename Step>
[[maybe_unused]] static __device__ __forceinline__ void mtd_chunks(uint32_t nc, bool full, Fetch &&fetch,
                                                                   Step &&step) {
        if (full) {
#pragma unroll
                for (uint32_t c0 = 0; c0 < MTD_KC; c0 += MTD_PF) {
                        mtd_frag<NT> f[MTD_PF];
#pragma unroll
                        for (uint32_t k = 0; k < MTD_PF; k++)
                                fetch(c0 + k, f[k]);
#pragma unroll
                        for (uint32_t k = 0; k < MTD_PF; k++)
                                step(f[k]);
                }
        } else {
                for (uint32_t cc = 0; cc < nc; cc++) {
                        mtd_frag<NT> f;
                        fetch(cc, f);
                        step(f);
                }
        }
}

/* S: ring stages; n_x: input rows a stage holds (≥ the block's inputs). Dynamic shared memory:
 * S × (16·W rows × RB bytes) of weights, then S × n_x × MTD_XS floats of inputs. */
template <int TYPE, int NR, int MODE, int NT>
__global__ void __launch_bounds__(MTD_WARPS_MAX * 32) k_mm_tcd(struct cu_mv a, uint32_t S, uint32_t n_x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        constexpr bool IQ4 = TYPE == CU_TYPE_IQ4_NL;
        constexpr uint32_t CB = IQ4 ? 18 : 64;                        /* bytes a chunk of a row */
        constexpr uint32_t RB = IQ4 ? MTD_KC * 18 : MTD_KC * 64 + 16; /* smem bytes a row a stage */
        constexpr uint32_t PR = MTD_KC * CB / 16;                     /* 16-byte pieces a row a stage */
        extern __shared__ __align__(16) uint8_t mtd_smem[];
        __shared__ uint64_t xoff[NT * 8]; /* where column n's inputs start (floats from a.x) */
        uint32_t W = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t g = lane / 4, t = lane % 4;
        uint32_t n_rows = a.N, rows_blk = 16 * W, row0 = blockIdx.y * rows_blk;
        uint32_t n_chunks = a.K / CU_CHUNK, n_st = (n_chunks + MTD_KC - 1) / MTD_KC;
        uint8_t *wsm = mtd_smem;
        float *xsm = (float *) (mtd_smem + (size_t) S * rows_blk * RB);
        const uint8_t *wbase = (const uint8_t *) a.w;

        /* stage st's bytes of the block's rows into ring slot `slot` (rows past N: not loaded;
         * only their own, unwritten outputs read them) */
        auto load_w = [&](uint32_t st, uint32_t slot) {
                if (st >= n_st)
                        return;
                uint32_t c0 = st * MTD_KC, np = min((uint32_t) MTD_KC, n_chunks - c0) * CB / 16;
                uint8_t *dst = wsm + (size_t) slot * rows_blk * RB;
                for (uint32_t e = threadIdx.x; e < rows_blk * PR; e += blockDim.x) {
                        uint32_t rr = e / PR, pc = e % PR, r = row0 + rr;
                        if (pc < np && r < n_rows)
                                mtd_cp16(dst + rr * RB + pc * 16,
                                         wbase + (uint64_t) r * a.row_bytes + (uint64_t) c0 * CB + pc * 16);
                }
        };
        uint32_t n_p = 0;
        auto load_x = [&](uint32_t st, uint32_t slot) {
                if (st >= n_st)
                        return;
                uint32_t k0 = st * MTD_KV, nv4 = min((uint32_t) MTD_KV, a.K - k0) / 4;
                float *dst = xsm + (size_t) slot * n_x * MTD_XS;
                for (uint32_t e = threadIdx.x; e < n_p * (MTD_KV / 4); e += blockDim.x) {
                        uint32_t n = e / (MTD_KV / 4), i = e % (MTD_KV / 4);
                        if (i < nv4)
                                mtd_cp16(dst + n * MTD_XS + 4 * i, a.x + xoff[n] + k0 + 4 * i);
                }
        };

        /* the weights no kernel writes: in flight before the previous kernel has finished */
        if (MODE == MT_DENSE)
                for (uint32_t st = 0; st + 1 < S; st++) {
                        load_w(st, st);
                        mtd_commit();
                }
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t p0 = blockIdx.x * NT * 8;
        const int32_t *perm = NULL;
        int32_t expert = 0;
        if (MODE == MT_GROUPED) {
                if (!cu_group_tile(a, blockIdx.x, &expert, &perm, &n_p))
                        return; /* the whole block, before any load */
        } else if (MODE == MT_SEL) {
                p0 = blockIdx.x; /* one pair a block, its own expert */
                n_p = 1;
                expert = a.sel[p0];
        } else
                n_p = min((uint32_t) NT * 8, a.P - min(p0, a.P));
        uint32_t grp = NR == 1 && a.G != a.N ? row0 / a.G : 0;
        if (MODE != MT_DENSE) {
                wbase += (uint64_t) expert * a.expert_bytes;
                for (uint32_t st = 0; st + 1 < S; st++) {
                        load_w(st, st);
                        mtd_commit();
                }
        }
        if (threadIdx.x < n_p) {
                uint32_t p = MODE == MT_GROUPED ? (uint32_t) perm[threadIdx.x] : p0 + threadIdx.x;
                xoff[threadIdx.x] = (uint64_t) (p / a.x_div) * a.x_pstride + (uint64_t) grp * a.x_gstride;
        }
        __syncthreads();
        for (uint32_t st = 0; st + 1 < S; st++) {
                load_x(st, st);
                mtd_commit();
        }

        /* the IQ4_NL codebook as bf16 (k_mm_tc's cb), low and high bytes apart */
        uint32_t tl[4] = {0, 0, 0, 0}, th[4] = {0, 0, 0, 0};
        if constexpr (IQ4)
                mtd_codebook(tl, th);
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                        acc[j][e] = 0.0f;
        float tot[NT][4] = {}; /* the parts' sums so far (a stage is a part) */
        bool col_on[NT];
        uint32_t xrow[NT];
        mtd_columns<NT>(g, n_p, col_on, xrow);

        /* Groups committed so far: 2(S − 1) (weights, then inputs, of stages 0 .. S − 2), then one
         * a step. Stage i is complete once groups 0 .. S − 1 + i are: at most S − 2 pending. */
        uint32_t slot = 0;
        for (uint32_t i = 0; i < n_st; i++) {
                mtd_wait(S - 2);
                __syncthreads(); /* stage i visible to all; stage i − 1's slot read by all */
                uint32_t refill = slot == 0 ? S - 1 : slot - 1;
                load_w(i + S - 1, refill);
                load_x(i + S - 1, refill);
                mtd_commit();

                const uint8_t *ws = wsm + (size_t) slot * rows_blk * RB + (size_t) warp * 16 * RB;
                const float *xs = xsm + (size_t) slot * n_x * MTD_XS;
                /* a chunk's fragments, read and decoded (fetch), then its two k16 steps as k_mm_tc
                 * runs them (step): fetching MTD_PF chunks before stepping them lets their
                 * shared-memory reads and decodes overlap the mma chain */
                auto fetch = [&](uint32_t cc, mtd_frag<NT> &f) {
                        mtd_fetch<IQ4, NT>(ws, RB, xs, xrow, col_on, cc, g, t, tl, th, f);
                };
                auto step = [&](const mtd_frag<NT> &f) { mtd_step<IQ4, NT>(acc, f); };
                uint32_t nc = min((uint32_t) MTD_KC, n_chunks - i * MTD_KC);
                mtd_chunks<NT>(nc, IQ4 || nc == MTD_KC, fetch, step);
#pragma unroll
                for (int j = 0; j < NT; j++) /* a stage is a part: its sum added */
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                                tot[j][e] += acc[j][e];
                                acc[j][e] = 0.0f;
                        }
                slot = slot + 1 == S ? 0 : slot + 1;
        }
        mtd_wait(0); /* the empty tail groups */

        /* D fragment: rows g (e 0, 1) and g + 8 (e 2, 3), columns 2t and 2t + 1 of each n-tile;
         * written as k_mm_tc writes them */
#pragma unroll
        for (int j = 0; j < NT; j++)
                mt_store<NR, MODE>(a, tot[j], row0 + warp * 16, j * 8, g, t, n_rows, n_p, p0, perm, grp);
#else
        (void) a, (void) S, (void) n_x;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

/* the device's numbers the launch shapes come from (cu_mm_tc_setup) */
static uint32_t mtd_sms = 1, mtd_smem_sm, mtd_smem_blk;

template <int TYPE, int NR, int MODE, int NT>
static void mtd_prepare(void) {
        (void) cudaFuncSetAttribute(k_mm_tcd<TYPE, NR, MODE, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) mtd_smem_blk);
}

template <int TYPE, int NR>
static void mtd_prepare_type(void) {
        mtd_prepare<TYPE, NR, MT_DENSE, 1>();
        mtd_prepare<TYPE, NR, MT_DENSE, 2>();
        mtd_prepare<TYPE, NR, MT_GROUPED, 1>();
        mtd_prepare<TYPE, NR, MT_SEL, 1>();
}

static void mtd_setup(int dev) {
        int sms = 0, per_sm = 0, per_blk = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&per_blk, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
            sms <= 0 || per_blk < 48 * 1024) {
                mtd_smem_blk = 0; /* k_mm_tc serves */
                return;
        }
        mtd_sms = (uint32_t) sms;
        mtd_smem_sm = (uint32_t) per_sm;
        mtd_smem_blk = (uint32_t) per_blk - 1024; /* room for the static xoff table */
        mtd_prepare_type<CU_TYPE_BF16, 1>();
        mtd_prepare_type<CU_TYPE_BF16, 2>();
        mtd_prepare_type<CU_TYPE_IQ4_NL, 1>();
        mtd_prepare_type<CU_TYPE_IQ4_NL, 2>();
        mts_setup();
}

/* X4_CUDA_MMTC_DEC=log: the first launches' shapes on stderr (that k_mm_tcd runs at all) */
static int mtd_log_left = -1;

/* X4_CUDA_MMTC_PAIRS_TCD=N (opt-in until a GPU has timed it; 0, the default: none): grouped expert
 * products of up to N pairs take k_mm_tcd's tiles of CU_GROUP_TILE pairs instead of k_mm_tcp's
 * 64-pair tiles. At batch 64 an expert has ~5 of the 320 pairs, so k_mm_tcp's tiles compute 32-64
 * columns for 5 and its 128-row blocks decode each weight for them; the bits are the same either
 * way. */
static uint32_t mt_pairs_tcd(void) {
        static int v = -1;
        if (v < 0) {
                const char *e = getenv("X4_CUDA_MMTC_PAIRS_TCD");
                char *end = NULL;
                long n = e && *e ? strtol(e, &end, 10) : 0;
                v = e && *e && end && !*end && n >= 0 && n <= 1 << 20 ? (int) n : 0;
                if (e && *e && v == 0 && strcmp(e, "0"))
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTC_PAIRS_TCD=%s ignored: expected a pair count\n", e);
        }
        return (uint32_t) v;
}

/* k_mm_tcd for this product if it takes it (the token count, the rows' alignment), else false:
 * k_mm_tc then runs, with the same bits. */
template <int TYPE, int NR>
static bool launch_tcd(const struct cu_mv *a, cudaStream_t s) {
        constexpr bool IQ4 = TYPE == CU_TYPE_IQ4_NL;
        constexpr uint32_t RB = IQ4 ? MTD_KC * 18 : MTD_KC * 64 + 16;
        uint32_t n_chunks = a->K / CU_CHUNK;
        uint32_t sel_max = a->groups ? max((uint32_t) (MTD_P_MAX * CU_SLOTS_MAX), mt_pairs_tcd()) : MTD_P_MAX * CU_SLOTS_MAX;
        if (!mtd_smem_blk || a->P > (a->sel ? sel_max : MTD_P_MAX))
                return false;
        /* 16-byte copies: rows and each stage's stretch of them 16-byte aligned (IQ4_NL: 8 chunks
         * are 144 bytes, so K a multiple of 256) */
        if ((uintptr_t) a->w % 16 || a->row_bytes % 16 || (a->sel && a->expert_bytes % 16) ||
            (IQ4 && n_chunks % MTD_KC))
                return false;
        uint32_t m_tiles = (a->N + 15) / 16, bx, n_x, W = 1;
        if (a->sel && a->groups) {
                bx = a->n_groups_max;
                n_x = min(a->P, (uint32_t) CU_GROUP_TILE);
        } else if (a->sel) {
                bx = a->P;
                n_x = 1;
        } else {
                bx = 1;
                n_x = a->P;
                /* warps a block share one staged input copy: more of them as the inputs grow (fp32
                 * inputs are 2 bytes of L2 reads and shared memory per BF16 weight byte per token
                 * at W = 1: at 16 tokens the ring would hold twice as many input bytes as weight
                 * bytes), fewer while that leaves SMs without a block */
                W = a->P <= 2 ? 1 : a->P <= 4 ? 2 : 4;
                while (W > 1 && (m_tiles + W - 1) / W * bx < mtd_sms)
                        W /= 2;
                /* X4_CUDA_MMTC_DEC_W=1|2|4: that many (measurements; the bits are the same) */
                static int force_w = -1;
                if (force_w < 0) {
                        const char *e = getenv("X4_CUDA_MMTC_DEC_W");
                        force_w = e && (!strcmp(e, "1") || !strcmp(e, "2") || !strcmp(e, "4")) ? atoi(e) : 0;
                }
                if (force_w)
                        W = (uint32_t) force_w;
        }
        /* a block's rows in one input group (cu_matvec_tc checked G % 128) */
        while (W > 1 && !a->swiglu && a->G != a->N && a->G % (16 * W))
                W /= 2;
        uint32_t by;
        uint64_t stage, S;
        for (;;) {
                by = (m_tiles + W - 1) / W;
                stage = (uint64_t) 16 * W * RB + (uint64_t) n_x * MTD_XS * sizeof(float);
                /* ring depth: the blocks an SM holds at once share its shared memory */
                uint64_t blocks = (uint64_t) bx * by;
                uint32_t per_sm = (uint32_t) min((blocks + mtd_sms - 1) / mtd_sms, (uint64_t) 16);
                S = (mtd_smem_sm - per_sm * 2048u) / per_sm / stage;
                uint32_t n_st = (n_chunks + MTD_KC - 1) / MTD_KC;
                S = max(min(S, (uint64_t) min(MTD_S_MAX, n_st + 1)), (uint64_t) 2); /* 2: fewer blocks resident */
                S = min(S, mtd_smem_blk / stage);
                if (S >= 2)
                        break;
                if (W == 1)
                        return false; /* k_mm_tc */
                W /= 2; /* cards with less shared memory a block than the H200's 227 KiB */
        }
        size_t smem = (size_t) (S * stage);
        dim3 block(32 * W);
        if (mtd_log_left > 0) {
                mtd_log_left--;
                fprintf(stderr, "k_mm_tcd: type %u%s %s P %u N %u K %u grid %ux%u warps %u stages %u smem %zu\n",
                        TYPE, NR == 2 ? " swiglu" : "",
                        a->sel ? (a->groups ? "grouped" : "pairs") : "dense", a->P, a->N, a->K, bx, by, W,
                        (uint32_t) S, smem);
        }
        cu_launches++;
        if (a->sel && a->groups)
                cu_launch(k_mm_tcd<TYPE, NR, MT_GROUPED, 1>, dim3(bx, by), block, smem, s, *a, (uint32_t) S, n_x);
        else if (a->sel)
                cu_launch(k_mm_tcd<TYPE, NR, MT_SEL, 1>, dim3(bx, by), block, smem, s, *a, (uint32_t) S, n_x);
        else if (a->P <= 8)
                cu_launch(k_mm_tcd<TYPE, NR, MT_DENSE, 1>, dim3(bx, by), block, smem, s, *a, (uint32_t) S, n_x);
        else
                cu_launch(k_mm_tcd<TYPE, NR, MT_DENSE, 2>, dim3(bx, by), block, smem, s, *a, (uint32_t) S, n_x);
        return true;
}

/* ---- k_mm_tcn: dense products of 17-64 inputs (batch decode), a warp an n-tile ----
 *
 * k_mm_tc's chains (k_mm_tcd's stages = MT_KPART parts, each from zero, added in part order into
 * the warp's running sums) for a block of one m-tile (16 stored rows) × up to 8 n-tiles, a warp
 * an n-tile: the block's warps share each staged stage of the 16 rows (a cp.async ring, one
 * barrier a stage), each warp reads its 8 inputs' B fragments from the bf16 rows k_x_bf16 wrote
 * (the rounding k_mm_tc's staging applies), so the same A and B registers and the same mma chain:
 * the same bits as k_mm_tc, k_mm_tcd, k_mm_tcs and k_mm_tcp. At batch 64 those products took
 * k_mm_tcp's 128-row tiles: 11 blocks for q_a‖kv_a, 28 for attn_output (5.8 of a 36.6 ms step at
 * 4,096 for 2.5 GB of weights); here they are 84 and 224. X4_CUDA_MMTC_TCN=1 (opt-in until a GPU
 * has timed it). */
template <int TYPE>
struct mtd_rows { /* k_mm_tcd's stage of a weight row: bytes a chunk, staged bytes (padded), 16-byte pieces */
        static constexpr bool IQ4 = TYPE == CU_TYPE_IQ4_NL;
        static constexpr uint32_t CB = IQ4 ? 18 : 64, RB = IQ4 ? MTD_KC * 18 : MTD_KC * 64 + 16, PR = MTD_KC * CB / 16;
};

template <int TYPE, int NR>
__global__ void __launch_bounds__(MTD_WARPS_MAX * 2 * 32) k_mm_tcn(struct cu_mv a, const uint16_t *xb, uint32_t S,
                                                                    uint32_t n_grp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        using MR = mtd_rows<TYPE>;
        constexpr bool IQ4 = MR::IQ4;
        constexpr uint32_t CB = MR::CB, RB = MR::RB, PR = MR::PR;
        extern __shared__ __align__(16) uint8_t mtn_smem[];
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        uint32_t n_rows = a.N, row0 = blockIdx.y * 16, p0 = blockIdx.x * 64 + warp * 8;
        uint32_t n_chunks = a.K / CU_CHUNK, n_st = (n_chunks + MTD_KC - 1) / MTD_KC;
        const uint8_t *wbase = (const uint8_t *) a.w;
        auto load_w = [&](uint32_t st, uint32_t slot) {
                if (st >= n_st)
                        return;
                uint32_t c0 = st * MTD_KC, np = min((uint32_t) MTD_KC, n_chunks - c0) * CB / 16;
                uint8_t *dst = mtn_smem + (size_t) slot * 16 * RB;
                for (uint32_t e = threadIdx.x; e < 16 * PR; e += blockDim.x) {
                        uint32_t rr = e / PR, pc = e % PR, r = row0 + rr;
                        if (pc < np && r < n_rows)
                                mtd_cp16(dst + rr * RB + pc * 16,
                                         wbase + (uint64_t) r * a.row_bytes + (uint64_t) c0 * CB + pc * 16);
                }
        };
        /* the weights no kernel writes: in flight before the previous kernel has finished */
        for (uint32_t st = 0; st + 1 < S; st++) {
                load_w(st, st);
                mtd_commit();
        }
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t grp = NR == 1 && a.G != a.N ? row0 / a.G : 0;
        uint32_t p = p0 + g; /* this lane's B column */
        bool col_on = p < a.P;
        const uint32_t *xr = (const uint32_t *) (xb + ((uint64_t) (col_on ? p : 0) * n_grp + grp) * a.K);
        uint32_t tl[4] = {0, 0, 0, 0}, th[4] = {0, 0, 0, 0};
        if constexpr (IQ4)
                mtd_codebook(tl, th);
        float acc[1][4] = {}, tot[4] = {};
        uint32_t slot = 0;
        for (uint32_t i = 0; i < n_st; i++) {
                mtd_wait(S - 2);
                __syncthreads(); /* stage i visible to all; stage i − 1's slot read by all */
                load_w(i + S - 1, slot == 0 ? S - 1 : slot - 1);
                mtd_commit();
                const uint8_t *ws = mtn_smem + (size_t) slot * 16 * RB;
                uint32_t kw0 = i * MTD_KV / 2; /* the stage's first input word */
                auto fetch = [&](uint32_t cc, mtd_frag<1> &f) {
                        mtd_fetch_a<IQ4, 1>(ws, RB, cc, g, t, tl, th, f);
#pragma unroll
                        for (uint32_t s = 0; s < 2; s++) {
                                uint32_t w0 = kw0 + 16 * cc + mtd_bk<IQ4>(s, t, 0) / 2;
                                uint32_t w1 = kw0 + 16 * cc + mtd_bk<IQ4>(s, t, 1) / 2;
                                f.b[0][s][0] = col_on ? __ldcg(xr + w0) : 0u; /* written by the previous kernel: past L1 */
                                f.b[0][s][1] = col_on ? __ldcg(xr + w1) : 0u;
                        }
                };
                auto step = [&](const mtd_frag<1> &f) { mtd_step<IQ4, 1>(acc, f); };
                uint32_t nc = min((uint32_t) MTD_KC, n_chunks - i * MTD_KC);
                mtd_chunks<1>(nc, IQ4 || nc == MTD_KC, fetch, step);
#pragma unroll
                for (int e = 0; e < 4; e++) { /* a stage is a part: its sum added */
                        tot[e] += acc[0][e];
                        acc[0][e] = 0.0f;
                }
                slot = slot + 1 == S ? 0 : slot + 1;
        }
        mtd_wait(0); /* the empty tail groups */
        mt_store<NR, MT_DENSE>(a, tot, row0, 0, g, t, n_rows, a.P - min(p0, a.P), p0, NULL, grp);
#else
        (void) a, (void) xb, (void) S, (void) n_grp;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

/* ---- k_mm_tcs: products of at most 8 inputs or one expert pair a block (decode), one m-tile a block ----
 *
 * k_mm_tc's chains (MT_KPART parts, each summed from zero over its chunks in order: BF16 an mma
 * chain, IQ4_NL the block products scaled by mt_scale_add; the parts' sums added in part order)
 * with the parts spread over the block's W warps: warp w computes parts w, w + W, w + 2W, ... (a
 * part is one k_mm_tcd stage: 16 rows × 256 values), each through the warp's own ring of S slots
 * (cp.async, its lanes' copies only, so __syncwarp orders them), leaves each part's D fragment in
 * shared memory, and warp 0 adds them in part order and stores as k_mm_tc does. With one warp an
 * m-tile (k_mm_tcd) a 1,344 × 3,584 BF16 product had 84 warps on the whole card, each streaming
 * 114 KB alone (26 µs against the CUDA-core kernel's 7.6), and an expert gate-up 640 warps at 1.2
 * a scheduler (32 µs for 20.7 MB). Same registers and instructions in the same order for every
 * output, so the same bits as k_mm_tc, k_mm_tcd and k_mm_tcp.
 * MODE: MT_DENSE (≤ 8 inputs on one n-tile; NT 2: 9-16 on two), MT_SEL (one expert pair a block, grid x the pairs) or
 * MT_GROUPED (one tile of up to CU_GROUP_TILE pairs of one expert a block, grid x the tiles of
 * cu_moe_group: each expert's rows read once for its pairs, where MT_SEL reads them once a pair;
 * batches of 2-51 tokens, whose pairs went one a block on k_mm_tcs or k_mm_tcd). */
#define MTS_WARPS 8
#define MTS_P_MAX 8 /* dense inputs: one n-tile */

/* LBT, LBM: the launch bounds (threads a block, blocks an SM); only the expert pairs' one-wave
 * builds (mts_onewave) set them: the same code, fewer registers */
/* The blocks an SM a launch bound asks for: sm_75 holds 1,024 threads an SM, where the one-wave
 * builds' bounds (1,152 and 1,280 threads) are out of range, which ptxas reports (an error under
 * the build's --Werror); their kernels never run below sm_80, so any bound does there. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define MT_MINB(n) 0
#else
#define MT_MINB(n) (n)
#endif

/* VAR (IQ4_NL expert pairs, MT_SEL, only; the default is both, X4_CUDA_MMTC_VAR=0 the former
 * kernel): batch 1's expert products issued ~143 warp instructions a 16-row chunk (ncu,
 * 2026-12-06), and two parts of that go without moving a byte. MTS_VAR_HOIST: a lane's five
 * 16-byte copies of a part (k_mm_tcs's load_w pattern: piece e = lane + 32i of the 144, row e / 9,
 * piece e % 9) have their offsets worked out once a block, not a division and a 64-bit product a
 * piece a part; the same copies in the same order. MTS_VAR_XB: the part's one input row rounded to
 * bf16 pairs once a warp (in its slot, in place) where every lane rounded its own 32 pairs a part;
 * padding columns then read column 0's values instead of zeros (their products are never stored).
 * The same operands into the same mma chains: the same bits. Timed on an H100 (full model,
 * 2026-12-06, fourteenth session): each alone within 0.5% of the former, both +1.7% at batch 1 /
 * 512 and +1.5% at 4,096 (two runs each); ncu gate-up 22.1 against 23.4 us, down 14.1 against
 * 14.7. */
#define MTS_VAR_HOIST 1
#define MTS_VAR_XB 2
#define MTS_VAR (MTS_VAR_HOIST | MTS_VAR_XB) /* the build batch 1 takes */

/* LBM 0: no blocks-an-SM bound (the default build: the compiler's own register budget; a bound
 * of 1 let it take up to 255 registers, 94 where it took 64, halving the blocks an SM holds) */
template <int TYPE, int NR, int MODE, int LBT = MTS_WARPS * 32, int LBM = 0, bool ROPE = false, int NT = 1, int VAR = 0>
__global__ void __launch_bounds__(LBT, MT_MINB(LBM)) k_mm_tcs(struct cu_mv a, uint32_t S, uint32_t n_x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        constexpr bool IQ4 = TYPE == CU_TYPE_IQ4_NL;
        constexpr bool HOIST = IQ4 && MODE == MT_SEL && (VAR & MTS_VAR_HOIST);
        constexpr bool XB = IQ4 && MODE == MT_SEL && (VAR & MTS_VAR_XB);
        static_assert(!XB || MTD_KV == 8 * 32, "MTS_VAR_XB: a part's inputs are two float4 a lane");
        constexpr uint32_t CB = IQ4 ? 18 : 64;                        /* bytes a chunk of a row */
        constexpr uint32_t RB = IQ4 ? MTD_KC * 18 : MTD_KC * 64 + 16; /* smem bytes a row a slot (k_mm_tcd's) */
        constexpr uint32_t PR = MTD_KC * CB / 16;                     /* 16-byte pieces a row a part */
        extern __shared__ __align__(16) uint8_t mts_smem[];
        __shared__ uint64_t xoff[MTS_P_MAX * NT];
        static_assert(CU_GROUP_TILE <= MTS_P_MAX, "a group tile's pairs: one n-tile");
        static_assert(NT == 1 || MODE == MT_DENSE, "two n-tiles: dense inputs only");
        uint32_t W = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t g = lane / 4, t = lane % 4;
        /* ROPE: the grid's first rope_blocks rows are the side job's, the m-tiles after them */
        uint32_t n_rows = a.N, row0 = (blockIdx.y - (ROPE ? a.rope_blocks : 0)) * 16, n_chunks = a.K / CU_CHUNK;
        uint32_t n_parts = (n_chunks + MTD_KC - 1) / MTD_KC;
        uint32_t slot_bytes = 16 * RB + n_x * MTD_XS * (uint32_t) sizeof(float);
        uint8_t *ring = mts_smem + (size_t) warp * S * slot_bytes;
        float *psum = (float *) (mts_smem + (size_t) W * S * slot_bytes); /* [part][n-tile][lane][4] */
        uint32_t grp = NR == 1 && a.G != a.N ? row0 / a.G : 0;
        const uint8_t *wbase = (const uint8_t *) a.w;
        uint32_t p0 = MODE == MT_SEL ? blockIdx.x : 0; /* the block's pair (MT_SEL) */
        uint32_t n_in = n_x;                              /* inputs staged (MT_GROUPED: the tile's pairs) */
        const int32_t *perm = NULL;                       /* MT_GROUPED: the tile's pairs */
        /* ROPE (a build of its own, so the default's registers stay as they were): the side job's
         * blocks, the grid's first rope_blocks rows (dispatched first: their double-precision
         * angles are the longest chain): the queries' RoPE, k_q_rope's rotations, a thread each */
        if constexpr (MODE == MT_DENSE && ROPE)
                if (blockIdx.y < a.rope_blocks) {
                        const struct cu_rope_side &r = a.rope;
                        uint32_t sb = blockIdx.y, per_tok = a.rope_blocks / r.T;
                        uint32_t t = sb / per_tok, pos = r.tok_pos[t]; /* metadata: before the wait */
                        cu_pdl_wait();
                        cu_pdl_trigger();
                        for (uint32_t e = (sb % per_tok) * blockDim.x + threadIdx.x; e < r.n_head * (r.R / 2);
                             e += per_tok * blockDim.x)
                                cu_q_rope_one(r.q, r.qc, r.n_head, r.nope, r.R, r.KV, r.inv_freq, r.interleave, t, pos, e);
                        return;
                }

        /* HOIST: the lane's pieces e = lane + 32i of a part's 16 rows × PR (IQ4_NL parts are whole:
         * the host checks K), their offsets from the m-tile's first row and whether their row is
         * one of the N */
        constexpr uint32_t HI = HOIST ? (16 * PR + 31) / 32 : 1;
        uint32_t hoff[HI], hmask = 0;
        if constexpr (HOIST) {
#pragma unroll
                for (uint32_t i = 0; i < HI; i++) {
                        uint32_t e = lane + 32 * i, rr = e / PR, pc = e % PR;
                        hoff[i] = rr * a.row_bytes + pc * 16;
                        if (e < 16 * PR && row0 + rr < n_rows)
                                hmask |= 1u << i;
                }
        }
        /* the warp's j-th part (warp + j·W) into slot j % S: rows past N are not loaded (only
         * their own outputs, never stored, read them) */
        auto load_w = [&](uint32_t j) {
                uint32_t part = warp + j * W;
                if (part >= n_parts)
                        return;
                if constexpr (HOIST) {
                        static_assert(RB == 16 * PR, "HOIST: a piece's place in the slot is 16·e");
                        const uint8_t *src = wbase + (uint64_t) row0 * a.row_bytes + (uint64_t) part * MTD_KC * CB;
                        uint8_t *dst = ring + (size_t) (j % S) * slot_bytes + 16 * lane;
#pragma unroll
                        for (uint32_t i = 0; i < HI; i++)
                                if (hmask & (1u << i))
                                        mtd_cp16(dst + 512 * i, src + hoff[i]);
                        return;
                }
                uint32_t c0 = part * MTD_KC, np = min((uint32_t) MTD_KC, n_chunks - c0) * CB / 16;
                uint8_t *dst = ring + (size_t) (j % S) * slot_bytes;
                for (uint32_t e = lane; e < 16 * PR; e += 32) {
                        uint32_t rr = e / PR, pc = e % PR, r = row0 + rr;
                        if (pc < np && r < n_rows)
                                mtd_cp16(dst + rr * RB + pc * 16,
                                         wbase + (uint64_t) r * a.row_bytes + (uint64_t) c0 * CB + pc * 16);
                }
        };
        auto load_x = [&](uint32_t j) {
                uint32_t part = warp + j * W;
                if (part >= n_parts)
                        return;
                uint32_t k0 = part * MTD_KV, nv4 = min((uint32_t) MTD_KV, a.K - k0) / 4;
                float *dst = (float *) (ring + (size_t) (j % S) * slot_bytes + 16 * RB);
                for (uint32_t e = lane; e < n_in * (MTD_KV / 4); e += 32) {
                        uint32_t n = e / (MTD_KV / 4), i = e % (MTD_KV / 4);
                        if (i < nv4)
                                mtd_cp16(dst + n * MTD_XS + 4 * i, a.x + xoff[n] + k0 + 4 * i);
                }
        };

        /* the weights no kernel writes: in flight before the previous kernel has finished (an
         * expert pair's too when its router ran two kernels back: sel_ready, as k_mv_small reads it) */
        bool early = MODE == MT_DENSE || a.sel_ready;
        /* MT_GROUPED: the block's tile (its expert, first pair and count; read past L1: the
         * grouping kernel wrote them, two kernels back when early); no tile, nothing to do */
        int32_t ex = -1; /* the block's expert (X4_CUDA_L2PF: its rows of the next product) */
        auto tile = [&]() -> bool {
                if (blockIdx.x >= (uint32_t) __ldcg(a.groups))
                        return false;
                const int32_t *td = a.groups + 1 + 3 * blockIdx.x;
                ex = __ldcg(td);
                wbase += (uint64_t) ex * a.expert_bytes;
                perm = a.groups + 1 + 3 * a.n_groups_max + __ldcg(td + 1);
                n_in = (uint32_t) __ldcg(td + 2);
                return true;
        };
        if (MODE == MT_SEL && a.sel_ready) {
                ex = __ldcg(a.sel + p0);
                wbase += (uint64_t) ex * a.expert_bytes;
        }
        if (MODE == MT_GROUPED && a.sel_ready && !tile())
                return;
        if (early)
                for (uint32_t j = 0; j < S; j++)
                        load_w(j);
        cu_pdl_wait();
        cu_pdl_trigger();
        if (!early) {
                if constexpr (MODE == MT_GROUPED) {
                        if (!tile())
                                return;
                } else if constexpr (MODE == MT_SEL) {
                        ex = a.sel[p0];
                        wbase += (uint64_t) ex * a.expert_bytes;
                }
                for (uint32_t j = 0; j < S; j++)
                        load_w(j);
        }
        if (a.pf_tile && threadIdx.x == 0 && row0 < n_rows) /* the block's 16 rows, whole */
                cu_l2_prefetch_range(wbase + (uint64_t) row0 * a.row_bytes, (uint64_t) min(16u, n_rows - row0) * a.row_bytes,
                                     0, 1, 0, 1);
        if (MODE != MT_DENSE && a.pf_next && ex >= 0) /* this m-tile's share of the expert's next rows */
                cu_l2_prefetch_range((const uint8_t *) a.pf_next + (uint64_t) ex * a.pf_next_eb, a.pf_next_eb,
                                     blockIdx.y, gridDim.y, threadIdx.x, blockDim.x);
        if (threadIdx.x < n_in) {
                uint32_t p = MODE == MT_GROUPED ? (uint32_t) __ldcg(perm + threadIdx.x) : p0 + threadIdx.x;
                xoff[threadIdx.x] = (uint64_t) (p / a.x_div) * a.x_pstride + (uint64_t) grp * a.x_gstride;
        }
        __syncthreads();
        /* group j < S: part j's inputs (group 0 also the first S parts' weights); then one a part */
        for (uint32_t j = 0; j < S; j++) {
                load_x(j);
                mtd_commit();
        }
        uint32_t tl[4] = {0, 0, 0, 0}, th[4] = {0, 0, 0, 0};
        if constexpr (IQ4)
                mtd_codebook(tl, th);
        bool col_on[NT];
        uint32_t xrow[NT];
        mtd_columns<NT>(g, n_in, col_on, xrow);
        uint32_t my_parts = warp < n_parts ? (n_parts - warp + W - 1) / W : 0;
        for (uint32_t j = 0; j < my_parts; j++) {
                mtd_wait(S - 1); /* S + j groups committed: part j's complete */
                __syncwarp();
                const uint8_t *ws = ring + (size_t) (j % S) * slot_bytes;
                const float *xs = (const float *) (ws + 16 * RB);
                uint32_t part = warp + j * W, nc = min((uint32_t) MTD_KC, n_chunks - part * MTD_KC);
                if constexpr (XB) {
                        /* the part's input row as bf16 pairs over its first half (mtd_x2's rounding:
                         * the even value in the low half), every lane's floats read first; a lane
                         * takes values 4·lane.. and 128 + 4·lane.. (16-byte steps: no bank conflict) */
                        float4 v0 = *(const float4 *) (xs + 4 * lane), v1 = *(const float4 *) (xs + 128 + 4 * lane);
                        __syncwarp();
                        __nv_bfloat162 h0 = __floats2bfloat162_rn(v0.x, v0.y), h1 = __floats2bfloat162_rn(v0.z, v0.w);
                        __nv_bfloat162 h2 = __floats2bfloat162_rn(v1.x, v1.y), h3 = __floats2bfloat162_rn(v1.z, v1.w);
                        uint32_t *xw = (uint32_t *) xs;
                        *(uint2 *) (xw + 2 * lane) = make_uint2(*(const uint32_t *) &h0, *(const uint32_t *) &h1);
                        *(uint2 *) (xw + 64 + 2 * lane) = make_uint2(*(const uint32_t *) &h2, *(const uint32_t *) &h3);
                        __syncwarp();
                }
                float acc[NT][4] = {};
                /* chunk cc's fragments and its two k16 steps: k_mm_tcd's (NT n-tiles) */
                auto fetch = [&](uint32_t cc, mtd_frag<NT> &f) {
                        if constexpr (XB) {
                                const uint32_t *xw = (const uint32_t *) xs + 16 * cc;
                                mtd_fetch_a<IQ4, NT>(ws, RB, cc, g, t, tl, th, f);
#pragma unroll
                                for (uint32_t s = 0; s < 2; s++) {
                                        f.b[0][s][0] = xw[mtd_bk<IQ4>(s, t, 0) / 2];
                                        f.b[0][s][1] = xw[mtd_bk<IQ4>(s, t, 1) / 2];
                                }
                        } else {
                                mtd_fetch<IQ4, NT>(ws, RB, xs, xrow, col_on, cc, g, t, tl, th, f);
                        }
                };
                auto step = [&](const mtd_frag<NT> &f) { mtd_step<IQ4, NT>(acc, f); };
                mtd_chunks<NT>(nc, IQ4 || nc == MTD_KC, fetch, step);
#pragma unroll
                for (int n = 0; n < NT; n++)
                        *(float4 *) (psum + (((size_t) part * NT + n) * 32 + lane) * 4) =
                                make_float4(acc[n][0], acc[n][1], acc[n][2], acc[n][3]);
                __syncwarp(); /* every lane's reads of the slot done before it is refilled */
                load_w(j + S);
                load_x(j + S);
                mtd_commit();
        }
        mtd_wait(0);
        __syncthreads();
        if (warp != 0)
                return;
#pragma unroll
        for (int j = 0; j < NT; j++) {
                float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (uint32_t p = 0; p < n_parts; p++) {
                        float4 v = *(const float4 *) (psum + (((size_t) p * NT + j) * 32 + lane) * 4);
                        tot[0] += v.x;
                        tot[1] += v.y;
                        tot[2] += v.z;
                        tot[3] += v.w;
                }
                mt_store<NR, MODE>(a, tot, row0, j * 8, g, t, n_rows, n_in, p0, perm, grp);
        }
#else
        (void) a, (void) S, (void) n_x;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

static bool mts_rope_ready = true; /* every ROPE build took its shared memory attribute */

template <int TYPE, int NR>
static void mts_prepare(void) {
        (void) cudaFuncSetAttribute(k_mm_tcs<TYPE, NR, MT_DENSE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) mtd_smem_blk);
        (void) cudaFuncSetAttribute(k_mm_tcs<TYPE, NR, MT_DENSE, MTS_WARPS * 32, 0, false, 2>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mtd_smem_blk);
        if (cudaFuncSetAttribute(k_mm_tcs<TYPE, NR, MT_DENSE, MTS_WARPS * 32, 0, true>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mtd_smem_blk) != cudaSuccess ||
            cudaFuncSetAttribute(k_mm_tcs<TYPE, NR, MT_DENSE, MTS_WARPS * 32, 0, true, 2>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mtd_smem_blk) != cudaSuccess)
                mts_rope_ready = false;
        (void) cudaFuncSetAttribute(k_mm_tcs<TYPE, NR, MT_SEL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) mtd_smem_blk);
        (void) cudaFuncSetAttribute(k_mm_tcs<TYPE, NR, MT_GROUPED>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) mtd_smem_blk);
}

/* X4_CUDA_MMTC_ONEWAVE (opt-in until a GPU has timed it: 1 by the grid, force for every launch
 * of the shape, tests): batch 1's expert pairs in one wave. ncu put the gate-up (640 blocks of 8
 * warps, 64 registers: 4 an SM) at 1.21 waves and the down (1,120 blocks of 4 warps: 8 an SM) at
 * 1.06, the last blocks' loads issued only when the first wave's blocks end. Builds of the same
 * kernel bounded to 5 blocks of 8 warps an SM (≤ 48 registers) or 9 of 4 (≤ 56) hold those grids
 * at once; the same instructions on the same values, so the same bits (GPU step: logits `cmp`
 * with it forced). */
#define MTS_OW8 5 /* blocks of 8 warps an SM, the one-wave build */
#define MTS_OW4 9 /* blocks of 4 warps */
static int mts_onewave(void) {
        static int v = -1;
        if (v < 0) {
                const char *e = getenv("X4_CUDA_MMTC_ONEWAVE");
                v = !e || !*e || !strcmp(e, "0") ? 0 : !strcmp(e, "1") ? 1 : !strcmp(e, "force") ? 2 : -2;
                if (v == -2) {
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTC_ONEWAVE=%s ignored: expected 0, 1 or force\n", e);
                        v = 0;
                }
        }
        return v;
}
static bool mts_ow_ready[2][2]; /* [NR - 1][more than 4 warps]: the build took its shared memory attribute */

/* X4_CUDA_MMTC_VAR: 3 (unset: MTS_VAR_HOIST | MTS_VAR_XB) or 0 (the former k_mm_tcs, the GPU
 * test's reference) for batch 1's IQ4_NL expert pairs (k_mm_tcs MT_SEL) */
static int mts_var(void) {
        static int v = -1;
        if (v < 0) {
                const char *e = getenv("X4_CUDA_MMTC_VAR");
                v = e && !strcmp(e, "0") ? 0 : 3;
                if (e && *e && strcmp(e, "0") && strcmp(e, "3"))
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTC_VAR=%s ignored: expected 0 (the former expert "
                                        "product) or 3 (the default)\n", e);
        }
        return v;
}
static bool mts_var_ready[2]; /* [NR - 1]: the variant's build took its shared memory attribute */

template <int NR>
static void mts_prepare_var(void) {
        mts_var_ready[NR - 1] = cudaFuncSetAttribute(k_mm_tcs<CU_TYPE_IQ4_NL, NR, MT_SEL, MTS_WARPS * 32, 0, false, 1, MTS_VAR>,
                                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                          (int) mtd_smem_blk) == cudaSuccess;
        (void) cudaGetLastError();
}

template <int NR>
static void mts_prepare_ow(void) {
        mts_ow_ready[NR - 1][1] = cudaFuncSetAttribute(k_mm_tcs<CU_TYPE_IQ4_NL, NR, MT_SEL, 256, MTS_OW8>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       (int) mtd_smem_blk) == cudaSuccess;
        mts_ow_ready[NR - 1][0] = cudaFuncSetAttribute(k_mm_tcs<CU_TYPE_IQ4_NL, NR, MT_SEL, 128, MTS_OW4>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       (int) mtd_smem_blk) == cudaSuccess;
        (void) cudaGetLastError(); /* a refused attribute must not fail the first forward */
}

static void mts_setup(void) {
        /* k_mm_tcn's ring (the same budget as k_mm_tcd's) */
        (void) cudaFuncSetAttribute(k_mm_tcn<CU_TYPE_BF16, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mtd_smem_blk);
        (void) cudaFuncSetAttribute(k_mm_tcn<CU_TYPE_BF16, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mtd_smem_blk);
        (void) cudaFuncSetAttribute(k_mm_tcn<CU_TYPE_IQ4_NL, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mtd_smem_blk);
        (void) cudaFuncSetAttribute(k_mm_tcn<CU_TYPE_IQ4_NL, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mtd_smem_blk);
        (void) cudaGetLastError();
        mts_prepare<CU_TYPE_BF16, 1>();
        mts_prepare<CU_TYPE_BF16, 2>();
        mts_prepare<CU_TYPE_IQ4_NL, 1>();
        mts_prepare<CU_TYPE_IQ4_NL, 2>();
        mtp1_prepare<CU_TYPE_BF16, 1>();
        mtp1_prepare<CU_TYPE_BF16, 2>();
        mtp1_prepare<CU_TYPE_IQ4_NL, 1>();
        mtp1_prepare<CU_TYPE_IQ4_NL, 2>();
        if (mts_onewave()) {
                mts_prepare_ow<1>();
                mts_prepare_ow<2>();
        }
        if (mts_var()) {
                mts_prepare_var<1>();
                mts_prepare_var<2>();
        }
}

/* blocks of `threads` an SM the runtime says `k` runs with `smem` bytes (0: it cannot say),
 * remembered: the launches of a step ask again and again */
static int mts_blocks_sm(const void *k, int threads, size_t smem) {
        static struct {
                const void *k;
                int threads;
                size_t smem;
                int n;
        } memo[32];
        static unsigned n_memo;
        for (unsigned i = 0; i < n_memo; i++)
                if (memo[i].k == k && memo[i].threads == threads && memo[i].smem == smem)
                        return memo[i].n;
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, smem) != cudaSuccess) {
                (void) cudaGetLastError();
                n = 0;
        }
        if (n_memo < 32)
                memo[n_memo++] = {k, threads, smem, n};
        return n;
}

/* Launch an IQ4_NL expert-pair k_mm_tcs grid on the one-wave build when X4_CUDA_MMTC_ONEWAVE asks
 * (blocks of 5-8 warps on the 256-thread build, 1-4 on the 128-thread one; 1: only a grid the
 * default build would hold in more than one wave and this one holds in one, by the occupancy the
 * runtime reports; force: every such launch, as the tests on the demo model's shapes need);
 * false: the default build. */
template <int NR>
static bool mts_launch_ow(const struct cu_mv *a, dim3 grid, uint32_t W, size_t smem, uint32_t S, uint32_t n_x,
                          cudaStream_t s) {
        int ow = mts_onewave();
        if (!ow || W > 8 || !mts_ow_ready[NR - 1][W > 4])
                return false;
        auto kd = k_mm_tcs<CU_TYPE_IQ4_NL, NR, MT_SEL>;
        auto k8 = k_mm_tcs<CU_TYPE_IQ4_NL, NR, MT_SEL, 256, MTS_OW8>;
        auto k4 = k_mm_tcs<CU_TYPE_IQ4_NL, NR, MT_SEL, 128, MTS_OW4>;
        auto kw = W > 4 ? k8 : k4; /* bounds of 256 or 128 threads: any W up to them */
        if (ow == 1) {
                uint64_t blocks = (uint64_t) grid.x * grid.y;
                int nd = mts_blocks_sm((const void *) kd, (int) (32 * W), smem);
                int nw = mts_blocks_sm((const void *) kw, (int) (32 * W), smem);
                if (nd < 1 || nw < 1)
                        return false;
                if (blocks <= (uint64_t) nd * mtd_sms || blocks > (uint64_t) nw * mtd_sms)
                        return false;
        }
        if (mtd_log_left > 0) {
                mtd_log_left--;
                fprintf(stderr, "k_mm_tcs: one-wave build, %u warps, %d blocks an SM\n", W, W > 4 ? MTS_OW8 : MTS_OW4);
        }
        cu_launch(kw, grid, dim3(32 * W), smem, s, *a, S, n_x);
        return true;
}

/* ---- k_mm_tcp1: k_mm_tcs's m-tiles, several a block (batch 1's expert pairs and long products) ----
 *
 * A grid of k_mm_tcs blocks, one m-tile each, that the card holds in more than one wave (batch 1's
 * expert gate-up: 640 blocks of 8 warps at 4 an SM, ncu 1.21 waves; the down 1,120 of 4 warps,
 * 1.06) runs its last blocks' loads only when the first wave's blocks end, and every block's
 * loads start from an empty ring: ncu put both at 19% of the DRAM throughput (23.0 and 13.8 us for
 * 20.7 and 10.4 MB on the H200). Here a grid the card holds at once walks the m-tiles (block b
 * takes tiles b, b + G, b + 2G, ...; a tile is (pair, m-tile) for expert pairs, pair-major), each
 * warp's ring running on from one tile's parts into the next's, so the loads of a block's next
 * tile are in flight while it computes this one. A tile's parts, its warps' D fragments and warp
 * 0's sum in part order are k_mm_tcs's (mtd_chunks, mtd_step, mt_store: the same instructions on
 * the same values), so the same bits; the partial sums alternate between two buffers so warp 0
 * adds a tile's while the other warps start the next. MODE: MT_DENSE (one n-tile, no RoPE side
 * blocks) or MT_SEL. Opt-in (X4_CUDA_MMTC_PST=1): on the H100 it lost 6% at batch 1 (2026-12-06,
 * twelfth session): these products are held by their instructions (ncu: ~143 warp instructions a
 * 16-row chunk, 46% of issue slots busy) and their loads' latency, not by waves, and this kernel
 * issues as many on fewer warps. =force
 * takes it for every launch it can run, on a third of the tiles' blocks (tests: the demo model's
 * grids fit one wave). */
#define MTP1_TILES_MAX 64 /* tiles a block at most (the host checks) */

/* four blocks of 8 warps an SM (at most 64 registers, k_mm_tcs's own count): without the bound the
 * build took 80 and held three (H100, ncu: gate-up 30.7 us against k_mm_tcs's 23) */
template <int TYPE, int NR, int MODE>
__global__ void __launch_bounds__(MTS_WARPS * 32, MT_MINB(4)) k_mm_tcp1(struct cu_mv a, uint32_t S, uint32_t n_x, uint32_t m_tiles,
                                                           uint32_t n_tiles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        constexpr bool IQ4 = TYPE == CU_TYPE_IQ4_NL;
        constexpr uint32_t CB = IQ4 ? 18 : 64;
        constexpr uint32_t RB = IQ4 ? MTD_KC * 18 : MTD_KC * 64 + 16;
        constexpr uint32_t PR = MTD_KC * CB / 16;
        static_assert(MODE == MT_DENSE || MODE == MT_SEL, "k_mm_tcp1: dense inputs or expert pairs");
        extern __shared__ __align__(16) uint8_t mtp1_smem[];
        __shared__ uint64_t tw[MTP1_TILES_MAX]; /* a tile's weight bytes from a.w (its expert's) */
        uint32_t W = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t g = lane / 4, t = lane % 4;
        uint32_t n_rows = a.N, n_chunks = a.K / CU_CHUNK, n_parts = (n_chunks + MTD_KC - 1) / MTD_KC;
        uint32_t slot_bytes = 16 * RB + n_x * MTD_XS * (uint32_t) sizeof(float);
        uint8_t *ring = mtp1_smem + (size_t) warp * S * slot_bytes;
        float *psum = (float *) (mtp1_smem + (size_t) W * S * slot_bytes); /* [buffer][part][lane][4] */
        uint32_t G = gridDim.x, b = blockIdx.x;
        uint32_t my_tiles = b < n_tiles ? (n_tiles - b + G - 1) / G : 0;
        uint32_t my_parts = warp < n_parts ? (n_parts - warp + W - 1) / W : 0;
        uint32_t n_items = my_tiles * my_parts; /* the warp's (tile, part) items, tile-major */
        uint32_t n_in = MODE == MT_SEL ? 1 : n_x;
        const uint8_t *wbase = (const uint8_t *) a.w;
        /* tile i of the block: its m-tile's first row, its pair (MT_SEL) and its input group */
        auto row0_of = [&](uint32_t i) { return (b + i * G) % m_tiles * 16; };
        auto pair_of = [&](uint32_t i) { return MODE == MT_SEL ? (b + i * G) / m_tiles : 0u; };
        auto grp_of = [&](uint32_t i) { return NR == 1 && a.G != a.N ? row0_of(i) / a.G : 0u; };
        /* input n of tile i: k_mm_tcs's xoff */
        auto xoff_of = [&](uint32_t i, uint32_t n) {
                return (uint64_t) ((pair_of(i) + n) / a.x_div) * a.x_pstride + (uint64_t) grp_of(i) * a.x_gstride;
        };
        auto load_w = [&](uint32_t q) {
                if (q >= n_items)
                        return;
                uint32_t i = q / my_parts, part = warp + q % my_parts * W, row0 = row0_of(i);
                uint32_t c0 = part * MTD_KC, np = min((uint32_t) MTD_KC, n_chunks - c0) * CB / 16;
                uint8_t *dst = ring + (size_t) (q % S) * slot_bytes;
                const uint8_t *wt = wbase + tw[i];
                for (uint32_t e = lane; e < 16 * PR; e += 32) {
                        uint32_t rr = e / PR, pc = e % PR, r = row0 + rr;
                        if (pc < np && r < n_rows)
                                mtd_cp16(dst + rr * RB + pc * 16, wt + (uint64_t) r * a.row_bytes + (uint64_t) c0 * CB + pc * 16);
                }
        };
        auto load_x = [&](uint32_t q) {
                if (q >= n_items)
                        return;
                uint32_t i = q / my_parts, part = warp + q % my_parts * W;
                uint32_t k0 = part * MTD_KV, nv4 = min((uint32_t) MTD_KV, a.K - k0) / 4;
                float *dst = (float *) (ring + (size_t) (q % S) * slot_bytes + 16 * RB);
                for (uint32_t e = lane; e < n_in * (MTD_KV / 4); e += 32) {
                        uint32_t n = e / (MTD_KV / 4), k = e % (MTD_KV / 4);
                        if (k < nv4)
                                mtd_cp16(dst + n * MTD_XS + 4 * k, a.x + xoff_of(i, n) + k0 + 4 * k);
                }
        };
        /* the tiles' weight offsets (an expert pair's from sel: before the wait when the router
         * ran two kernels back, as k_mm_tcs reads it), then the weights no kernel writes in
         * flight before the previous kernel has finished */
        bool early = MODE == MT_DENSE || a.sel_ready;
        auto offsets = [&]() {
                for (uint32_t i = threadIdx.x; i < my_tiles; i += blockDim.x)
                        tw[i] = MODE == MT_SEL ? (uint64_t) __ldcg(a.sel + pair_of(i)) * a.expert_bytes : 0;
                __syncthreads();
        };
        if (early) {
                offsets();
                for (uint32_t q = 0; q < S; q++)
                        load_w(q);
        }
        cu_pdl_wait();
        cu_pdl_trigger();
        if (!early) {
                offsets();
                for (uint32_t q = 0; q < S; q++)
                        load_w(q);
        }
        /* group q < S: item q's inputs (group 0 also the first S items' weights); then one an item */
        for (uint32_t q = 0; q < S; q++) {
                load_x(q);
                mtd_commit();
        }
        uint32_t tl[4] = {0, 0, 0, 0}, th[4] = {0, 0, 0, 0};
        if constexpr (IQ4)
                mtd_codebook(tl, th);
        bool col_on[1];
        uint32_t xrow[1];
        mtd_columns<1>(g, n_in, col_on, xrow);
        uint32_t q = 0;
        for (uint32_t i = 0; i < my_tiles; i++) {
                float *ps = psum + (size_t) (i & 1) * n_parts * 32 * 4;
                for (uint32_t j = 0; j < my_parts; j++, q++) {
                        mtd_wait(S - 1); /* S + q groups committed: item q's complete */
                        __syncwarp();
                        const uint8_t *ws = ring + (size_t) (q % S) * slot_bytes;
                        const float *xs = (const float *) (ws + 16 * RB);
                        uint32_t part = warp + j * W, nc = min((uint32_t) MTD_KC, n_chunks - part * MTD_KC);
                        float acc[1][4] = {};
                        auto fetch = [&](uint32_t cc, mtd_frag<1> &f) {
                                mtd_fetch<IQ4, 1>(ws, RB, xs, xrow, col_on, cc, g, t, tl, th, f);
                        };
                        auto step = [&](const mtd_frag<1> &f) { mtd_step<IQ4, 1>(acc, f); };
                        mtd_chunks<1>(nc, IQ4 || nc == MTD_KC, fetch, step);
                        *(float4 *) (ps + ((size_t) part * 32 + lane) * 4) =
                                make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
                        __syncwarp(); /* every lane's reads of the slot done before it is refilled */
                        load_w(q + S);
                        load_x(q + S);
                        mtd_commit();
                }
                /* tile i's parts all in ps; warp 0 adds them in part order and stores, while the
                 * other warps go on to tile i + 1 (into the other buffer: warp 0 is done with this
                 * one before it reaches the next barrier, which tile i + 2's writes come after) */
                __syncthreads();
                if (warp == 0) {
                        float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        for (uint32_t p = 0; p < n_parts; p++) {
                                float4 v = *(const float4 *) (ps + ((size_t) p * 32 + lane) * 4);
                                tot[0] += v.x;
                                tot[1] += v.y;
                                tot[2] += v.z;
                                tot[3] += v.w;
                        }
                        mt_store<NR, MODE>(a, tot, row0_of(i), 0, g, t, n_rows, n_in, pair_of(i), NULL, grp_of(i));
                }
        }
        mtd_wait(0);
#else
        (void) a, (void) S, (void) n_x, (void) m_tiles, (void) n_tiles;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

/* X4_CUDA_MMTC_PST (opt-in: slower where measured, see k_mm_tcp1): 1 k_mm_tcp1 for a k_mm_tcs
 * launch the card would hold in more than one wave, 0 (unset) never, force for every launch it can
 * run (tests) */
static int mtp1_mode(void) {
        static int v = -1;
        if (v < 0) {
                const char *e = getenv("X4_CUDA_MMTC_PST");
                v = !e || !*e || !strcmp(e, "0") ? 0 : !strcmp(e, "1") ? 1 : !strcmp(e, "force") ? 2 : -2;
                if (v == -2) {
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTC_PST=%s ignored: expected 0, 1 or force\n", e);
                        v = 0;
                }
        }
        return v;
}

template <int TYPE, int NR>
static void mtp1_prepare(void) {
        (void) cudaFuncSetAttribute(k_mm_tcp1<TYPE, NR, MT_DENSE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) mtd_smem_blk);
        (void) cudaFuncSetAttribute(k_mm_tcp1<TYPE, NR, MT_SEL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) mtd_smem_blk);
        (void) cudaGetLastError();
}

/* Launch a k_mm_tcs product (dense inputs on one n-tile or expert pairs one a block; W warps, its
 * k_mm_tcs launch's smem_tcs) as k_mm_tcp1 when X4_CUDA_MMTC_PST takes it: a ring of two slots a
 * warp and two buffers of part sums, a grid the card holds at once (by the runtime's occupancy),
 * each block at most MTP1_TILES_MAX tiles; false: k_mm_tcs. */
template <int TYPE, int NR>
static bool mtp1_launch(const struct cu_mv *a, bool sel, uint32_t bx, uint32_t m_tiles, uint32_t W, uint32_t n_x,
                        uint64_t slot, uint64_t sums, size_t smem_tcs, cudaStream_t s) {
        int mode = mtp1_mode();
        if (!mode)
                return false;
        auto k = sel ? k_mm_tcp1<TYPE, NR, MT_SEL> : k_mm_tcp1<TYPE, NR, MT_DENSE>;
        auto kt = sel ? k_mm_tcs<TYPE, NR, MT_SEL> : k_mm_tcs<TYPE, NR, MT_DENSE>;
        /* X4_CUDA_MMTC_PST_S: the ring's slots a warp (1-3; 2 unset): more blocks an SM or more
         * loads in flight a warp (measurements) */
        static uint32_t s_env = 0;
        if (!s_env) {
                const char *e = getenv("X4_CUDA_MMTC_PST_S");
                s_env = e && *e >= '1' && *e <= '3' && !e[1] ? (uint32_t) (*e - '0') : 2;
                if (e && *e && s_env == 2 && strcmp(e, "2") != 0)
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTC_PST_S=%s ignored: expected 1, 2 or 3\n", e);
        }
        uint32_t n_tiles = bx * m_tiles, S = s_env;
        while (S > 1 && W * S * slot + 2 * sums > mtd_smem_blk)
                S--;
        size_t smem = (size_t) (W * S * slot + 2 * sums);
        if (smem > mtd_smem_blk)
                return false;
        int bps = mts_blocks_sm((const void *) k, (int) (32 * W), smem);
        if (bps < 1)
                return false;
        uint64_t G = (uint64_t) bps * mtd_sms;
        if (mode == 2) {
                G = min(G, (uint64_t) max(1u, n_tiles / 3));
        } else {
                /* k_mm_tcs's grid in one wave: nothing to gain */
                int bps_tcs = mts_blocks_sm((const void *) kt, (int) (32 * W), smem_tcs);
                if (bps_tcs < 1 || n_tiles <= (uint64_t) bps_tcs * mtd_sms || n_tiles <= G)
                        return false;
        }
        if ((n_tiles + G - 1) / G > MTP1_TILES_MAX)
                return false;
        if (mtd_log_left > 0) {
                mtd_log_left--;
                fprintf(stderr, "k_mm_tcp1: type %u%s %s N %u K %u tiles %u on %llu blocks (%d an SM) warps %u stages %u smem %zu\n",
                        TYPE, NR == 2 ? " swiglu" : "", sel ? "pairs" : "dense", a->N, a->K, n_tiles,
                        (unsigned long long) G, bps, W, S, smem);
        }
        cu_launch(k, dim3((uint32_t) G), dim3(32 * W), smem, s, *a, S, n_x, m_tiles, n_tiles);
        return true;
}

/* Grouped expert products of at most this many pairs take k_mm_tcs's tiles of CU_GROUP_TILE
 * pairs (MT_GROUPED), more k_mm_tcp's 64-pair tiles; the forward groups the pairs of a batch of
 * more than MTS_P_MAX of them up to this count (cu_mm_tcs_grouped_max). Batch 16 (80 pairs) ran
 * its pairs one a block on k_mm_tcd, at ~100 GB/s: the experts were 51% of its step (H100,
 * 12.9 of 23.4 ms). X4_CUDA_MMTC_TCS_GROUPED=N sets the count (0: none; the bits are the same
 * either way). */
#define MTS_GROUPED_MAX_DEFAULT 256
static uint32_t mts_grouped_max(void) {
        static int v = -1;
        if (v < 0) {
                const char *e = getenv("X4_CUDA_MMTC_TCS_GROUPED");
                char *end = NULL;
                long n = e && *e ? strtol(e, &end, 10) : MTS_GROUPED_MAX_DEFAULT;
                v = e && *e && !(end && !*end && n >= 0 && n <= 1 << 20) ? -2 : (int) n;
                if (v == -2) {
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTC_TCS_GROUPED=%s ignored: expected a pair count\n", e);
                        v = MTS_GROUPED_MAX_DEFAULT;
                }
        }
        return (uint32_t) v;
}

/* Dense products of at most this many inputs take k_mm_tcs: 8 (one n-tile) or 16 (two, NT 2: a
 * warp's weight fragments serve both; batch 16's attention projections ran on k_mm_tcd at ~360
 * GB/s, 40% of its step). X4_CUDA_MMTC_TCS_DENSE=8 keeps 9-16 inputs on k_mm_tcd (the bits are
 * the same either way). */
static uint32_t mts_dense_max(void) {
        static int v = -1;
        if (v < 0) {
                const char *e = getenv("X4_CUDA_MMTC_TCS_DENSE");
                v = e && !strcmp(e, "8") ? MTS_P_MAX : 2 * MTS_P_MAX;
                if (e && *e && strcmp(e, "8") && strcmp(e, "16"))
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTC_TCS_DENSE=%s ignored: expected 8 or 16\n", e);
        }
        return (uint32_t) v;
}

/* The pair counts the forward groups for k_mm_tcs (MT_GROUPED): more than MTS_P_MAX (fewer go one
 * a block) up to this; 0 where the tensor-core products do not run every token (the fp32 path
 * keeps its own grouping rule). */
extern "C" uint32_t cu_mm_tcs_grouped_max(void) {
        return mm_tc_ready && mm_tc_all() && mtd_smem_blk ? mts_grouped_max() : 0;
}

/* k_mm_tcs for this product if it takes it (≤ 16 dense inputs; ≤ 8 expert pairs one a block:
 * batch 1's five; grouped pairs up to mts_grouped_max, a tile a block; rows and parts in 16-byte
 * pieces, a ring that fits), else false. Ungrouped, more pairs fill the card as k_mm_tcd's
 * one-warp blocks (faster than k_mm_tcs a pair a block at batch 16: 621 against 588 tok/s at
 * 512). X4_CUDA_MMTC_SPLIT=0 leaves these products on k_mm_tcd (comparisons: the bits are the
 * same; measurements). */
template <int TYPE, int NR>
static bool launch_tcs(const struct cu_mv *a, cudaStream_t s) {
        constexpr bool IQ4 = TYPE == CU_TYPE_IQ4_NL;
        constexpr uint32_t RB = IQ4 ? MTD_KC * 18 : MTD_KC * 64 + 16;
        /* X4_CUDA_MMTC_SPLIT=WxS (tests: W warps, a ring of S slots, so a warp walks several
         * parts and reuses its slots, which the shapes of the demo model never make it do) */
        static int on = -1;
        static uint32_t force_w, force_s;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_MMTC_SPLIT");
                on = !(e && !strcmp(e, "0"));
                unsigned fw = 0, fs = 0;
                char tail = 0;
                if (e && sscanf(e, "%ux%u%c", &fw, &fs, &tail) == 2 && fw >= 1 && fw <= MTS_WARPS && fs >= 1 && fs <= 3)
                        force_w = fw, force_s = fs;
                else if (e && *e && strcmp(e, "0"))
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTC_SPLIT=%s ignored: expected 0 or WxS (W warps 1-%d, S "
                                        "stages 1-3)\n", e, MTS_WARPS);
        }
        uint32_t n_chunks = a->K / CU_CHUNK, n_parts = (n_chunks + MTD_KC - 1) / MTD_KC;
        bool sel = a->sel != NULL, grouped = sel && a->groups;
        if (grouped && a->P > mts_grouped_max())
                return false;
        if (!on || !mtd_smem_blk || a->P == 0 || (sel && !grouped && a->P > MTS_P_MAX) ||
            (!sel && a->P > mts_dense_max()) ||
            (uintptr_t) a->w % 16 || a->row_bytes % 16 || (sel && a->expert_bytes % 16) ||
            (IQ4 && n_chunks % MTD_KC) || a->x_pstride % 4 || a->x_gstride % 4 || (uintptr_t) a->x % 16)
                return false;
        uint32_t n_x = grouped ? CU_GROUP_TILE : sel ? 1 : a->P, m_tiles = (a->N + 15) / 16;
        uint32_t bx = grouped ? a->n_groups_max : sel ? a->P : 1;
        uint32_t W = min(n_parts, force_w ? force_w : (uint32_t) MTS_WARPS), ppw = (n_parts + W - 1) / W;
        uint32_t nt = !sel && a->P > MTS_P_MAX ? 2 : 1; /* dense 9-16 inputs: two n-tiles */
        uint64_t slot = 16 * RB + (uint64_t) n_x * MTD_XS * sizeof(float), sums = (uint64_t) n_parts * nt * 32 * 16;
        /* a warp's parts in flight at once (up to 3), fewer while the blocks the card needs at
         * once would not fit its SMs' shared memory, or a block's */
        uint64_t per_sm = ((uint64_t) bx * m_tiles + mtd_sms - 1) / mtd_sms;
        uint32_t S = min(ppw, 3u);
        while (S > 1 && (W * S * slot + sums > mtd_smem_blk || per_sm * (W * S * slot + sums + 1024) > mtd_smem_sm))
                S--;
        if (force_s)
                S = min(force_s, ppw);
        if (W * S * slot + sums > mtd_smem_blk)
                return false;
        size_t smem = (size_t) (W * S * slot + sums);
        if (mtd_log_left > 0) {
                mtd_log_left--;
                fprintf(stderr, "k_mm_tcs: type %u%s %s P %u N %u K %u grid %ux%u warps %u stages %u smem %zu n-tiles %u\n",
                        TYPE, NR == 2 ? " swiglu" : "", grouped ? "grouped" : sel ? "pairs" : "dense", a->P, a->N, a->K,
                        bx, m_tiles, W, S, smem, nt);
        }
        cu_launches++;
        if (grouped) {
                cu_launch(k_mm_tcs<TYPE, NR, MT_GROUPED>, dim3(bx, m_tiles), dim3(32 * W), smem, s, *a, S, n_x);
                return true;
        }
        if constexpr (IQ4)
                if (sel && mts_launch_ow<NR>(a, dim3(bx, m_tiles), W, smem, S, n_x, s))
                        return true;
        /* several m-tiles a block (k_mm_tcp1): not with the RoPE side blocks or the L2 prefetches */
        if (nt == 1 && !a->pf_next && !a->pf_tile && (sel || !(a->rope.q && a->rope.T && mts_rope_ready)) &&
            mtp1_launch<TYPE, NR>(a, sel, bx, m_tiles, W, n_x, slot, sums, smem, s))
                return true;
        if (sel) {
                if constexpr (IQ4) {
                        if (mts_var() && mts_var_ready[NR - 1]) {
                                if (mtd_log_left > 0) {
                                        mtd_log_left--;
                                        fprintf(stderr, "k_mm_tcs: variant %d\n", MTS_VAR);
                                }
                                cu_launch(k_mm_tcs<TYPE, NR, MT_SEL, MTS_WARPS * 32, 0, false, 1, MTS_VAR>, dim3(bx, m_tiles),
                                          dim3(32 * W), smem, s, *a, S, n_x);
                                return true;
                        }
                }
                cu_launch(k_mm_tcs<TYPE, NR, MT_SEL>, dim3(bx, m_tiles), dim3(32 * W), smem, s, *a, S, n_x);
                return true;
        }
        /* the queries' RoPE as extra blocks (cu_mv.rope; the ROPE build): enough that each thread
         * takes one rotation */
        struct cu_mv am = *a;
        am.rope_blocks = 0;
        if (a->rope.q && a->rope.T && mts_rope_ready) {
                uint32_t rot = a->rope.n_head * (a->rope.R / 2), per_tok = (rot + 32 * W - 1) / (32 * W);
                am.rope_blocks = per_tok * a->rope.T;
        }
        if (am.rope_blocks && m_tiles + am.rope_blocks <= 65535) {
                cu_rope_side_done = true;
                if (mtd_log_left > 0) {
                        mtd_log_left--;
                        fprintf(stderr, "k_mm_tcs: rope side blocks %u beside %u m-tiles\n", am.rope_blocks, m_tiles);
                }
                cu_launch(nt == 2 ? k_mm_tcs<TYPE, NR, MT_DENSE, MTS_WARPS * 32, 0, true, 2>
                                  : k_mm_tcs<TYPE, NR, MT_DENSE, MTS_WARPS * 32, 0, true>,
                          dim3(bx, m_tiles + am.rope_blocks), dim3(32 * W), smem, s, am, S, n_x);
                return true;
        }
        am.rope_blocks = 0;
        cu_launch(nt == 2 ? k_mm_tcs<TYPE, NR, MT_DENSE, MTS_WARPS * 32, 0, false, 2> : k_mm_tcs<TYPE, NR, MT_DENSE>,
                  dim3(bx, m_tiles), dim3(32 * W), smem, s, am, S, n_x);
        return true;
}

/* ---- k_mm_tcp: the same products for many inputs (prompts), shaped for the tensor cores ----
 *
 * k_mm_tc's arithmetic (every output element the same chain of mma.sync m16n8k16 over the same
 * K order, IQ4_NL blocks scaled by mt_scale_add) with a block tile of MTP_BM rows × MTP_BN inputs
 * and both operands streamed through shared memory in a ring of MTP_NS stages (cp.async). An
 * output's column in the block, its block shape and who computes it never enter its chain, so
 * the choice between k_mm_tc, k_mm_tcd and this kernel never changes a bit (what the chunk and
 * batch checks of tests/gpu compare).
 *
 * Inputs: k_x_bf16 first rounds the product's inputs to bf16 (__float2bfloat16_rn, the rounding
 * k_mm_tc's staging applies) into the backend's scratch (cu_mm_tc_scratch), one row of K values
 * per (input row, input group); the kernel copies them 16 bytes a lane and reads B fragments with
 * ldmatrix. Weights: BF16 rows 16 bytes a copy, A fragments by ldmatrix; IQ4_NL rows 4 bytes a copy
 * (a stage's 2 blocks are 36 bytes of a row), decoded to bf16 codebook values in registers
 * (mtd_iq4_pair). Grouped expert products take the wide tiles of cu_moe_group (≤ 64 pairs of one
 * expert a block).
 *
 * Warps: 8, as 4 (rows) × 2 (inputs); a warp owns 32 rows × 32 inputs (2 × 4 m16n8 tiles); a
 * warp whose inputs are all past the tile's count skips the products but not the copies.
 * Staged rows are padded so that ldmatrix's eight 16-byte rows and the IQ4_NL quant reads fall on
 * distinct banks (144-byte rows: 36 words; IQ4_NL rows 48 bytes: 12 words, 4 banks apart). */
#define MTP_BM 128    /* stored rows a block */
#define MTP_BN 64     /* inputs a block (CU_GROUP_WIDE pairs) */
#define MTP_KS 64     /* input values a stage: two 32-value chunks */
#define MTP_NS 4      /* ring stages */
#define MTP_THREADS 256
#define MTP_XB 144    /* bytes a staged input row: 64 bf16 + 16 */
static_assert(MTP_BN == CU_GROUP_WIDE, "a block takes one wide tile");
static_assert(MT_KPART == MTD_KV && MT_KPART % MTP_KS == 0, "k_mm_tcd's stage is a part, k_mm_tcp's divides one");

template <int TYPE>
__host__ __device__ static constexpr uint32_t mtp_wb() { /* bytes a staged weight row */
        return TYPE == CU_TYPE_IQ4_NL ? 48 : 144;
}
template <int TYPE>
__host__ __device__ static constexpr uint32_t mtp_stage() {
        return MTP_BM * mtp_wb<TYPE>() + MTP_BN * MTP_XB;
}

/* the backend's bf16 input scratch (forward.c's workspace), set before each pass's products */
static uint16_t *mtp_xb;
static uint64_t mtp_xb_cap; /* values */

extern "C" void cu_mm_tc_scratch(void *p, uint64_t values) {
        mtp_xb = (uint16_t *) p;
        mtp_xb_cap = values;
}

/* X4_CUDA_MMTC_PROMPT=0: many-input products on k_mm_tc (comparisons: the same bits); =log: on,
 * and the first 64 launch shapes on stderr (that k_mm_tcp runs at all) */
static int mtp_log_left;
static bool mtp_on(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_MMTC_PROMPT");
                on = !(e && !strcmp(e, "0"));
                mtp_log_left = e && !strcmp(e, "log") ? 64 : 0;
        }
        return on;
}

/* out[(r·n_grp + grp)·K + k] = bf16(x[r·x_pstride + grp·x_gstride + k]) for r < rows: a block a
 * (row, group), float4 reads */
__global__ void __launch_bounds__(128) k_x_bf16(const float *x, uint64_t x_pstride, uint64_t x_gstride,
                                                uint32_t n_grp, uint32_t K, uint16_t *out) {
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t r = blockIdx.x / n_grp, grp = blockIdx.x % n_grp;
        const float *src = x + (uint64_t) r * x_pstride + (uint64_t) grp * x_gstride;
        uint16_t *dst = out + (uint64_t) blockIdx.x * K;
        for (uint32_t k = 4 * threadIdx.x; k < K; k += 4 * blockDim.x) {
                float4 v = *(const float4 *) (src + k);
                *(uint2 *) (dst + k) = make_uint2(mt_pack(mt_bf16(v.x), mt_bf16(v.y)),
                                                  mt_pack(mt_bf16(v.z), mt_bf16(v.w)));
        }
}

/* k_x_bf16 for k_q6_tc's 16-byte input loads (B16, the default; X4_CUDA_Q6TC_B16=0 off): one row an input (no
 * groups), and within each run of 16 words (32 values, K % 32 == 0) word 4i + t stored at 4t + i,
 * so lane t of a warp finds the words of two groups' B fragments (t, t + 4, 8 + t, 12 + t of the
 * run) side by side. The same bf16 words as k_x_bf16's. */
__global__ void __launch_bounds__(128) k_x_bf16_q6p(const float *x, uint64_t x_pstride, uint32_t K, uint16_t *out) {
        cu_pdl_wait();
        cu_pdl_trigger();
        const float *src = x + (uint64_t) blockIdx.x * x_pstride;
        uint32_t *dst = (uint32_t *) (out + (uint64_t) blockIdx.x * K);
        for (uint32_t k = 4 * threadIdx.x; k < K; k += 4 * blockDim.x) {
                float4 v = *(const float4 *) (src + k);
                uint32_t w = k / 2, b = w & ~15u, s = w & 15u; /* s even: words s, s + 1 of the run */
                dst[b + 4 * (s % 4) + s / 4] = mt_pack(mt_bf16(v.x), mt_bf16(v.y));
                dst[b + 4 * ((s + 1) % 4) + (s + 1) / 4] = mt_pack(mt_bf16(v.z), mt_bf16(v.w));
        }
}

/* The B fragments of a warp's four n-tiles at one k16 step: two ldmatrix.x4 from the lanes'
 * row addresses (p: n-tiles 0, 1; 16 staged rows on: 2, 3) */
[[maybe_unused]] static __device__ __forceinline__ void mtp_b_frags(uint32_t (*bf)[2], const uint8_t *p) {
#pragma unroll
        for (int jj = 0; jj < 2; jj++) {
                uint32_t r[4];
                mtp_ldm4(r, p + jj * 16 * MTP_XB);
                bf[2 * jj][0] = r[0], bf[2 * jj][1] = r[1];
                bf[2 * jj + 1][0] = r[2], bf[2 * jj + 1][1] = r[3];
        }
}

/* one k16 step of a warp's 2 × 4 m16n8 tiles */
[[maybe_unused]] static __device__ __forceinline__ void mtp_mma_tile(float (*d)[4][4], const uint32_t (*af)[4],
                                                                     const uint32_t (*bf)[2]) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                        mtd_mma(d[mt][j], af[mt], bf[j][0], bf[j][1]);
}

/* D1 (X4_CUDA_MMTCP_DEC1=1, IQ4_NL; opt-in: timed on the H200 on 2026-12-04, prefill 4,096 12,416
 * against 12,372 tok/s and 512 9,882 against 10,079, so not the default): each stage's IQ4_NL weights
 * decoded once a block into shared memory (MTP_D1_BYTES: a row's 64 codebook values as bf16, a k16
 * step's A columns in the order the fragments take them: the low nibbles of quant bytes 8s .. 8s+7,
 * then their high nibbles) and read by ldmatrix as BF16 rows are, instead of decoded by both of
 * the block's input-column warps from the quant bytes (ncu: the gate-up product issue-bound, the
 * ALU pipe the busiest). The same A registers, the same B, the same chains: the same bits. */
#define MTP_D1_ROW 144 /* bytes a decoded row: 64 bf16 + 16 (BF16's staged row) */
#define MTP_D1_BYTES (MTP_BM * MTP_D1_ROW)

/* KS (dense products whose tiles leave the card half idle: batch decode's attention projections,
 * a prompt's short last pass): the K parts split over blockIdx.z, pps parts a block. Every output
 * is still the one chain ((0 + p0) + p1) + ... of its parts' sums in part order: the block of
 * parts 0 .. pps − 1 stores its running sum, every other block each of its parts' sums (from zero,
 * as ever), into the backend's scratch (cu_mm_tc_ksplit), and the tile's last block to finish
 * (a ticket a tile, left at zero) adds them in part order before the store. The same A and B
 * registers into the same mma chains: the same bits as the unsplit kernel (GPU step ks_same). */
#define MTP_KS_ENTRY (MTP_BM * MTP_BN) /* floats a stored part of a tile */
static float *mtp_ks_buf;               /* the scratch: entries of MTP_KS_ENTRY floats */
static uint32_t *mtp_ks_ticket;
static uint64_t mtp_ks_entries;
static uint32_t mtp_ks_tickets;

extern "C" void cu_mm_tc_ksplit(float *buf, uint64_t floats, uint32_t *tickets, uint32_t n_tickets) {
        mtp_ks_buf = buf;
        mtp_ks_entries = floats / MTP_KS_ENTRY;
        mtp_ks_ticket = tickets;
        mtp_ks_tickets = n_tickets;
}

/* NW (grouped IQ4_NL expert products; the default, X4_CUDA_MMTCP_NARROW=0 the 4 × 2 layout): the block's 8
 * warps as 8 (rows) × 1: warp w owns rows 16w .. 16w + 15 and the tile's n-tiles of 8 inputs up to
 * its pair count, nj = ⌈n_p / 8⌉ (warp-uniform: the others' products are not issued). In the
 * 4 × 2 layout a decode batch's tiles (batch 64: 320 pairs on 65 experts, ~5 a tile) left the
 * four warps of inputs 32-63 idle, and each of the other four decoded two m-tiles of IQ4_NL and ran
 * the mma of all four of its n-tiles for one n-tile of inputs; a full tile's m-tiles were decoded
 * twice (once for each column of warps). Each output's chain is the same: its two k16 mma of a
 * block from zero (k16 steps in order), mt_scale_add, the parts' sums in order; the same A and B
 * values, so the same bits (GPU step narrow_same). */
template <int TYPE, int NR, int MODE, bool D1 = false, bool KS = false, bool NW = false>
__global__ void __launch_bounds__(MTP_THREADS, 2) k_mm_tcp(struct cu_mv a, const uint16_t *xb, uint32_t n_grp,
                                                          float *ksb, uint32_t *kst, uint32_t pps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        constexpr bool IQ4 = TYPE == CU_TYPE_IQ4_NL;
        constexpr bool NARROW = NW && IQ4 && MODE == MT_GROUPED && !D1;
        static_assert(!NW || NARROW, "the narrow layout: grouped IQ4_NL products, decoded by the warps");
        constexpr bool DEC1 = IQ4 && D1;
        constexpr uint32_t WB = mtp_wb<TYPE>(), STG = mtp_stage<TYPE>();
        constexpr uint32_t CPR = IQ4 ? MTP_KS / 32 * 18 / 4 : MTP_KS * 2 / 16; /* copies a row a stage: 9 / 8 */
        constexpr uint32_t WCP = (MTP_BM * CPR + MTP_THREADS - 1) / MTP_THREADS; /* a thread's: 5 / 4 */
        extern __shared__ __align__(16) uint8_t mtp_smem[];
        uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
        uint32_t wm = warp % 4, wn = warp / 4; /* the warp's rows 32·wm .., inputs 32·wn .. */
        uint32_t n_rows = a.N, row0 = blockIdx.y * MTP_BM, K = a.K, n_st = K / MTP_KS;
        uint32_t grp = NR == 1 && a.G != a.N ? row0 / a.G : 0;
        const uint8_t *wbase = (const uint8_t *) a.w;
        static_assert(!KS || MODE == MT_DENSE, "split K: dense products");
        constexpr uint32_t SPP = MT_KPART / MTP_KS; /* stages a part */
        /* KS: this block's stages [st0, st1), parts [st0 / SPP, ..) */
        uint32_t st0 = KS ? blockIdx.z * pps * SPP : 0, st1 = KS ? min(n_st, st0 + pps * SPP) : n_st;

        /* dense: the weights no kernel writes go out before the wait (below) */
        if (MODE != MT_DENSE) {
                cu_pdl_wait();
                cu_pdl_trigger();
        }
        uint32_t p0 = blockIdx.x * MTP_BN, n_p;
        const int32_t *perm = NULL;
        if (MODE == MT_GROUPED) {
                const int32_t *wide = a.groups + 1 + 3 * a.n_groups_max + a.P;
                if (blockIdx.x >= (uint32_t) wide[0])
                        return;
                const int32_t *td = wide + 1 + 3 * blockIdx.x;
                wbase += (uint64_t) td[0] * a.expert_bytes;
                perm = a.groups + 1 + 3 * a.n_groups_max + td[1];
                n_p = (uint32_t) td[2];
        } else
                n_p = min((uint32_t) MTP_BN, a.P - p0);

        /* what this thread copies: weight pieces e = tid + 256·i (row e / CPR, piece e % CPR; rows
         * past N read row N − 1, for outputs nobody stores) and input rows tid / 8 + 32·i (piece
         * tid % 8; columns past the tile's count read its last input, likewise never stored) */
        const uint8_t *wsrc[WCP];
        uint32_t wdst[WCP];
#pragma unroll
        for (uint32_t i = 0; i < WCP; i++) {
                uint32_t e = tid + MTP_THREADS * i, rr = min(e / CPR, (uint32_t) MTP_BM - 1);
                uint32_t r = min(row0 + rr, n_rows - 1);
                wsrc[i] = wbase + (uint64_t) r * a.row_bytes + (e % CPR) * (IQ4 ? 4 : 16);
                wdst[i] = e < MTP_BM * CPR ? rr * WB + (e % CPR) * (IQ4 ? 4 : 16) : ~0u;
        }
        const uint16_t *xsrc[2];
#pragma unroll
        for (uint32_t i = 0; i < 2; i++) {
                uint32_t n = min(tid / 8 + 32 * i, n_p - 1);
                uint32_t p = MODE == MT_GROUPED ? (uint32_t) perm[n] : p0 + n;
                xsrc[i] = xb + ((uint64_t) (p / a.x_div) * n_grp + grp) * K + (tid % 8) * 8;
        }
        /* stage st into ring slot (st − st0) % MTP_NS: its weights, its inputs */
        auto load_w = [&](uint32_t st) {
                if (st >= st1)
                        return;
                uint8_t *ws = mtp_smem + ((st - st0) % MTP_NS) * STG;
#pragma unroll
                for (uint32_t i = 0; i < WCP; i++)
                        if (wdst[i] != ~0u) {
                                if constexpr (IQ4)
                                        mtd_cp<4>(ws + wdst[i], wsrc[i] + (uint64_t) st * (MTP_KS / 32 * 18));
                                else
                                        mtd_cp16(ws + wdst[i], wsrc[i] + (uint64_t) st * (MTP_KS * 2));
                        }
        };
        auto load_x = [&](uint32_t st) {
                if (st >= st1)
                        return;
                uint8_t *xs = mtp_smem + ((st - st0) % MTP_NS) * STG + MTP_BM * WB;
#pragma unroll
                for (uint32_t i = 0; i < 2; i++)
                        mtd_cp16(xs + (tid / 8 + 32 * i) * MTP_XB + (tid % 8) * 16, xsrc[i] + (uint64_t) st * MTP_KS);
        };
        /* the first stages: dense weights before the wait (in the first group with stage st0's
         * inputs, so each stage's wait below still finds its weights complete), the rest after */
        if (MODE == MT_DENSE) {
                for (uint32_t st = 0; st + 1 < MTP_NS; st++)
                        load_w(st0 + st);
                cu_pdl_wait();
                cu_pdl_trigger();
        }
        for (uint32_t st = 0; st + 1 < MTP_NS; st++) {
                if (MODE != MT_DENSE)
                        load_w(st0 + st);
                load_x(st0 + st);
                mtd_commit();
        }

        uint32_t tl[4] = {0, 0, 0, 0}, th[4] = {0, 0, 0, 0};
        if constexpr (IQ4)
                mtd_codebook(tl, th);
        float acc[2][4][4] = {};
        float tot[2][4][4] = {}; /* the parts' sums so far (MT_KPART / MTP_KS stages a part);
                                  * NARROW: n-tile j in [j / 4][j % 4] */
        bool active = NARROW || 32 * wn < n_p;
        uint32_t nj = min(8u, (n_p + 7) / 8); /* NARROW: the warp's n-tiles with inputs */
        (void) nj;
        /* ldmatrix row addresses (bytes in a stage): B of n-tiles 2jj, 2jj + 1 — lanes 0-7 and
         * 8-15 the first tile's inputs at columns +0 and +8 (BF16) / +16 (IQ4_NL's high nibbles),
         * lanes 16-31 the second's; A (BF16) of an m-tile — lanes 0-7 rows 0-7, 8-15 rows 8-15,
         * 16-31 the same rows 8 columns on */
        uint32_t boff = MTP_BM * WB + ((NARROW ? 0 : 32 * wn) + (lane & 7) + (lane >> 4) * 8) * MTP_XB +
                        ((lane >> 3) & 1) * (IQ4 ? 32 : 16);
        uint32_t aoff = (32 * wm + (lane & 7) + ((lane >> 3) & 1) * 8) * WB + (lane >> 4) * 16;
        uint32_t aoff_d1 = (32 * wm + (lane & 7) + ((lane >> 3) & 1) * 8) * MTP_D1_ROW + (lane >> 4) * 16;
        (void) aoff_d1;

        for (uint32_t it = st0; it < st1; it++) {
                mtd_wait(MTP_NS - 2);
                __syncthreads(); /* stage it visible to all; stage it − 1's slot read by all */
                load_w(it + MTP_NS - 1);
                load_x(it + MTP_NS - 1);
                mtd_commit();
                const uint8_t *ws = mtp_smem + ((it - st0) % MTP_NS) * STG;
                if constexpr (DEC1) {
                        /* thread: row tid % 128, block tid / 128 of the stage; both k16 steps */
                        uint32_t dr = tid % MTP_BM, dc = tid / MTP_BM;
                        const uint8_t *src = ws + dr * WB + 18 * dc;
                        uint8_t *dst = mtp_smem + MTP_NS * STG + dr * MTP_D1_ROW + dc * 64;
#pragma unroll
                        for (uint32_t s = 0; s < 2; s++) {
                                uint32_t lo[4], hi[4];
#pragma unroll
                                for (uint32_t tt = 0; tt < 4; tt++)
                                        mtd_iq4_pair(*(const uint16_t *) (src + 2 + 8 * s + 2 * tt), tl, th, &lo[tt],
                                                     &hi[tt]);
                                *(uint4 *) (dst + 32 * s) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
                                *(uint4 *) (dst + 32 * s + 16) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
                        }
                        __syncthreads(); /* the stage's decoded rows written (the loop's first
                                          * barrier keeps the next decode behind this stage's reads) */
                }
                if (!active)
                        continue;
                if constexpr (NARROW) {
                        /* the warp's m-tile: both k16 steps' A decoded once, then the n-tiles in
                         * pairs (one ldmatrix.x4 a pair and step), each from zero over the two
                         * steps and mt_scale_add, as below */
#pragma unroll
                        for (uint32_t cc = 0; cc < MTP_KS / 32; cc++) {
                                const uint8_t *b0 = ws + (16 * warp + g) * WB + 18 * cc;
                                const uint8_t *b1 = b0 + 8 * WB;
                                float d0 = __half2float(*(const __half *) b0);
                                float d1 = __half2float(*(const __half *) b1);
                                uint32_t af[2][4];
#pragma unroll
                                for (uint32_t s = 0; s < 2; s++) {
                                        uint32_t q0 = *(const uint16_t *) (b0 + 2 + 8 * s + 2 * t);
                                        uint32_t q1 = *(const uint16_t *) (b1 + 2 + 8 * s + 2 * t);
                                        mtd_iq4_pair(q0, tl, th, &af[s][0], &af[s][2]);
                                        mtd_iq4_pair(q1, tl, th, &af[s][1], &af[s][3]);
                                }
#pragma unroll
                                for (uint32_t jj = 0; jj < 4; jj++) {
                                        if (2 * jj >= nj)
                                                break;
                                        uint32_t bf[2][4];
#pragma unroll
                                        for (uint32_t s = 0; s < 2; s++)
                                                mtp_ldm4(bf[s], ws + boff + jj * 16 * MTP_XB + (32 * cc + 8 * s) * 2);
#pragma unroll
                                        for (uint32_t h = 0; h < 2; h++) {
                                                float tmp[4] = {};
#pragma unroll
                                                for (uint32_t s = 0; s < 2; s++)
                                                        mtd_mma(tmp, af[s], bf[s][2 * h], bf[s][2 * h + 1]);
                                                mt_scale_add(acc[jj / 2][(2 * jj + h) % 4], d0, d1, tmp);
                                        }
                                }
                        }
                } else if constexpr (IQ4) {
                        /* a block's two k16 steps per m-tile in turn (the B fragments of both
                         * steps held for the two m-tiles): tmp is one m-tile's 4 × 4 values
                         * (it spilled with both m-tiles' 32); every output's chain (its two mma
                         * from zero, then mt_scale_add) as before. Sized for three blocks an SM
                         * (80 registers) it was slower on the H200: experts 122.6 -> 134.1 ms of
                         * a 4,096-token prefill. */
#pragma unroll
                        for (uint32_t cc = 0; cc < MTP_KS / 32; cc++) {
                                uint32_t bf[2][4][2];
#pragma unroll
                                for (uint32_t s = 0; s < 2; s++) /* values 32cc + 8s + 2t (+1), 32cc + 16 + 8s + 2t (+1) */
                                        mtp_b_frags(bf[s], ws + boff + (32 * cc + 8 * s) * 2);
#pragma unroll
                                for (int mt = 0; mt < 2; mt++) {
                                        const uint8_t *b0 = ws + (32 * wm + 16 * mt + g) * WB + 18 * cc;
                                        const uint8_t *b1 = b0 + 8 * WB;
                                        float d0 = __half2float(*(const __half *) b0);
                                        float d1 = __half2float(*(const __half *) b1);
                                        float tmp[4][4] = {};
#pragma unroll
                                        for (uint32_t s = 0; s < 2; s++) {
                                                /* quant bytes 8s + 2t, 8s + 2t + 1 of rows g, g + 8
                                                 * (D1: decoded by the block, read by ldmatrix) */
                                                uint32_t af[4];
                                                if constexpr (DEC1) {
                                                        mtp_ldm4(af, mtp_smem + MTP_NS * STG + aoff_d1 +
                                                                             mt * 16 * MTP_D1_ROW + (2 * cc + s) * 32);
                                                } else {
                                                        uint32_t q0 = *(const uint16_t *) (b0 + 2 + 8 * s + 2 * t);
                                                        uint32_t q1 = *(const uint16_t *) (b1 + 2 + 8 * s + 2 * t);
                                                        mtd_iq4_pair(q0, tl, th, &af[0], &af[2]);
                                                        mtd_iq4_pair(q1, tl, th, &af[1], &af[3]);
                                                }
#pragma unroll
                                                for (int j = 0; j < 4; j++)
                                                        mtd_mma(tmp[j], af, bf[s][j][0], bf[s][j][1]);
                                        }
#pragma unroll
                                        for (int j = 0; j < 4; j++)
                                                mt_scale_add(acc[mt][j], d0, d1, tmp[j]);
                                }
                        }
                } else {
#pragma unroll
                        for (uint32_t ks = 0; ks < MTP_KS / 16; ks++) {
                                uint32_t af[2][4], bf[4][2];
#pragma unroll
                                for (int mt = 0; mt < 2; mt++)
                                        mtp_ldm4(af[mt], ws + aoff + mt * 16 * WB + ks * 32);
                                mtp_b_frags(bf, ws + boff + ks * 32);
                                mtp_mma_tile(acc, af, bf);
                        }
                }
                if ((it + 1) % SPP == 0 || it + 1 == n_st) { /* a part's end */
                        if (KS && blockIdx.z > 0) {
                                /* a later block's part: its own sum, stored (entry = the part) */
                                float4 *e4 = (float4 *) (ksb + ((uint64_t) (blockIdx.y * gridDim.x + blockIdx.x) *
                                                                        ((n_st + SPP - 1) / SPP) + it / SPP) * MTP_KS_ENTRY);
#pragma unroll
                                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                                        for (int j = 0; j < 4; j++) {
                                                e4[(mt * 4 + j) * MTP_THREADS + tid] =
                                                        make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]);
#pragma unroll
                                                for (int e = 0; e < 4; e++)
                                                        acc[mt][j][e] = 0.0f;
                                        }
                        } else {
#pragma unroll
                                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                                        for (int j = 0; j < 4; j++)
#pragma unroll
                                                for (int e = 0; e < 4; e++) {
                                                        tot[mt][j][e] += acc[mt][j][e];
                                                        acc[mt][j][e] = 0.0f;
                                                }
                        }
                }
        }
        mtd_wait(0); /* the empty tail groups */
        if constexpr (KS) {
                __shared__ bool ks_last;
                uint32_t tile = blockIdx.y * gridDim.x + blockIdx.x, n_parts = (n_st + SPP - 1) / SPP;
                float4 *tb = (float4 *) (ksb + (uint64_t) tile * n_parts * MTP_KS_ENTRY);
                if (blockIdx.z == 0 && active) /* the first parts' running sum: entry 0 */
#pragma unroll
                        for (int mt = 0; mt < 2; mt++)
#pragma unroll
                                for (int j = 0; j < 4; j++)
                                        tb[(mt * 4 + j) * MTP_THREADS + tid] =
                                                make_float4(tot[mt][j][0], tot[mt][j][1], tot[mt][j][2], tot[mt][j][3]);
                __threadfence(); /* this thread's entries before the ticket */
                __syncthreads();
                if (tid == 0)
                        ks_last = atomicAdd(kst + tile, 1u) == gridDim.z - 1;
                __syncthreads();
                if (!ks_last)
                        return;
                __threadfence(); /* the other blocks' entries after their tickets */
                if (tid == 0)
                        kst[tile] = 0; /* for the next launch (stream order) */
                if (!active)
                        return;
                /* entry 0, then the later blocks' parts in part order (read past L1) */
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                                float4 v = __ldcg(tb + (mt * 4 + j) * MTP_THREADS + tid);
                                tot[mt][j][0] = v.x, tot[mt][j][1] = v.y, tot[mt][j][2] = v.z, tot[mt][j][3] = v.w;
                        }
                for (uint32_t p = pps; p < n_parts; p++) {
                        const float4 *pb = tb + (uint64_t) p * (MTP_KS_ENTRY / 4);
                        float4 v[8];
#pragma unroll
                        for (int q = 0; q < 8; q++)
                                v[q] = __ldcg(pb + q * MTP_THREADS + tid);
#pragma unroll
                        for (int mt = 0; mt < 2; mt++)
#pragma unroll
                                for (int j = 0; j < 4; j++) {
                                        const float4 &w = v[mt * 4 + j];
                                        tot[mt][j][0] += w.x;
                                        tot[mt][j][1] += w.y;
                                        tot[mt][j][2] += w.z;
                                        tot[mt][j][3] += w.w;
                                }
                }
        }
        if (!active)
                return;
        if constexpr (NARROW) {
#pragma unroll
                for (uint32_t j = 0; j < 8; j++)
                        if (j < nj)
                                mt_store<NR, MODE>(a, tot[j / 4][j % 4], row0 + 16 * warp, 8 * j, g, t, n_rows, n_p,
                                                   p0, perm, grp);
        } else {
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int j = 0; j < 4; j++)
                                mt_store<NR, MODE>(a, tot[mt][j], row0 + 32 * wm + 16 * mt, 32 * wn + 8 * j,
                                                   g, t, n_rows, n_p, p0, perm, grp);
        }
#else
        (void) a, (void) xb, (void) n_grp, (void) ksb, (void) kst, (void) pps;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

/* per type: the dynamic shared memory attributes are set (cu_mm_tc_setup; a card with less shared
 * memory a block than a BF16 ring needs keeps BF16 products on k_mm_tc) */
static bool mtp_smem_ok[2], mtp_d1_ok;

template <int TYPE, int NR, bool D1 = false>
static bool mtp_prepare(void) {
        int n = (int) (MTP_NS * mtp_stage<TYPE>() + (D1 ? MTP_D1_BYTES : 0));
        return cudaFuncSetAttribute(k_mm_tcp<TYPE, NR, MT_DENSE, D1>, cudaFuncAttributeMaxDynamicSharedMemorySize, n) ==
                       cudaSuccess &&
               cudaFuncSetAttribute(k_mm_tcp<TYPE, NR, MT_GROUPED, D1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    n) == cudaSuccess;
}

/* the narrow grouped build's attribute (IQ4_NL; false: the 4 × 2 layout) */
static bool mtp_nw_ok;
template <int NR>
static bool mtp_prepare_nw(void) {
        return cudaFuncSetAttribute(k_mm_tcp<CU_TYPE_IQ4_NL, NR, MT_GROUPED, false, false, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) (MTP_NS * mtp_stage<CU_TYPE_IQ4_NL>())) == cudaSuccess;
}

/* X4_CUDA_MMTCP_NARROW: grouped IQ4_NL products take k_mm_tcp's narrow warp layout (NW) unless it
 * is 0 (the 4 × 2 layout); =log: narrow, and its first 8 launches on stderr (the GPU test's proof
 * that it ran). The same bits either way. The default since 2026-12-07's eighteenth session: on
 * the H100, full model, batch 64 3,356 / 2,129 tok/s at 512 / 4,096 against 3,202-3,205 /
 * 2,071-2,073, prefill 11,033-11,093 / 13,846 against 10,287-10,436 / 12,957. */
static int mtp_nw_log;
static bool mtp_nw_on(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_MMTCP_NARROW");
                bool known = !e || !*e || !strcmp(e, "0") || !strcmp(e, "1") || !strcmp(e, "log");
                if (!known)
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTCP_NARROW=%s ignored: expected 0 (the 4 x 2 layout), 1 or log\n", e);
                on = !(known && e && !strcmp(e, "0"));
                mtp_nw_log = known && e && !strcmp(e, "log") ? 8 : 0;
        }
        return on;
}

/* the split-K build's attribute (per type; false: products stay unsplit) */
static bool mtp_ks_ok[2];
template <int TYPE, int NR>
static bool mtp_prepare_ks(void) {
        return cudaFuncSetAttribute(k_mm_tcp<TYPE, NR, MT_DENSE, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int) (MTP_NS * mtp_stage<TYPE>())) == cudaSuccess;
}

/* X4_CUDA_MMTCP_KS: 0 never splits K; N (1-64) splits every dense k_mm_tcp product of two or
 * more parts into blocks of N parts (tests: GPU step ks_same compares both with 0, and with the
 * default rule, which splits on the demo model's grids too); unset, the grid decides (mtp_ks_pps) */
static int mtp_ks_env(void) {
        static int v = -2;
        if (v == -2) {
                const char *e = getenv("X4_CUDA_MMTCP_KS");
                char *end = NULL;
                long n = e && *e ? strtol(e, &end, 10) : -1;
                v = !e || !*e ? -1 : (*end || n < 0 || n > 64) ? -3 : (int) n;
                if (v == -3) {
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTCP_KS=%s ignored: expected 0 (never split K) or 1-64 "
                                        "(parts a block)\n", e);
                        v = -1;
                }
        }
        return v;
}

/* Parts a block for a dense product of `tiles` blocks and n_parts parts: 0 (no split) where the
 * tiles alone are more than one block an SM, or the split is not set up; else the fewest parts a block
 * that fill about two blocks an SM (batch 64's q_a‖kv_a: 11 tiles of 14 parts, 154 blocks of one
 * part; attn_output 28 tiles of 16, 224 of two). */
static uint32_t mtp_ks_pps(uint64_t tiles, uint32_t n_parts, bool ready) {
        int e = mtp_ks_env();
        if (e == 0 || n_parts < 2 || !ready || !mtp_ks_buf || tiles > mtp_ks_tickets ||
            tiles * n_parts > mtp_ks_entries)
                return 0;
        if (e > 0)
                return (uint32_t) e < n_parts ? (uint32_t) e : 0;
        uint64_t want = 2ull * mtd_sms;
        if (tiles * 2 > want) /* at least half the blocks the card holds at once: as it is */
                return 0;
        uint32_t slices = (uint32_t) min((uint64_t) n_parts, (want + tiles - 1) / tiles);
        uint32_t pps = (n_parts + slices - 1) / slices;
        return pps < n_parts ? pps : 0;
}

/* X4_CUDA_MMTCP_DEC1=1: IQ4_NL stages decoded once a block (k_mm_tcp's D1; opt-in: no faster when
 * timed, see above) */
static bool mtp_d1_on(void) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_MMTCP_DEC1");
                on = e && !strcmp(e, "1");
        }
        return on;
}

static void mtp_setup(void) {
        mtp_smem_ok[0] = mtp_prepare<CU_TYPE_BF16, 1>() && mtp_prepare<CU_TYPE_BF16, 2>();
        mtp_smem_ok[1] = mtp_prepare<CU_TYPE_IQ4_NL, 1>() && mtp_prepare<CU_TYPE_IQ4_NL, 2>();
        mtp_d1_ok = mtp_d1_on() && mtp_prepare<CU_TYPE_IQ4_NL, 1, true>() && mtp_prepare<CU_TYPE_IQ4_NL, 2, true>();
        mtp_ks_ok[0] = mtp_prepare_ks<CU_TYPE_BF16, 1>() && mtp_prepare_ks<CU_TYPE_BF16, 2>();
        mtp_ks_ok[1] = mtp_prepare_ks<CU_TYPE_IQ4_NL, 1>() && mtp_prepare_ks<CU_TYPE_IQ4_NL, 2>();
        mtp_nw_ok = mtp_prepare_nw<1>() && mtp_prepare_nw<2>();
        (void) cudaGetLastError();
}

/* k_mm_tcp for this product if it takes it (many inputs, K a multiple of MTP_KS, the inputs fit
 * the scratch), else false: k_mm_tc or k_mm_tcd then run, with the same bits */
template <int TYPE, int NR>
static bool launch_tcp(const struct cu_mv *a, cudaStream_t s) {
        constexpr bool IQ4 = TYPE == CU_TYPE_IQ4_NL;
        if (a->sel && a->groups && a->P <= mts_grouped_max() && mtd_smem_blk)
                return false; /* k_mm_tcs's group tiles */
        if (!mtp_on() || !mtp_smem_ok[IQ4] || !mtp_xb || a->K % MTP_KS || (a->sel && !a->groups) ||
            (!a->sel && a->P <= MTD_P_MAX) || (a->sel && a->P <= mt_pairs_tcd()))
                return false;
        if ((uintptr_t) a->w % 16 || a->row_bytes % (IQ4 ? 4 : 16) || (a->sel && a->expert_bytes % (IQ4 ? 4 : 16)))
                return false;
        uint32_t n_grp = NR == 1 && a->G != a->N ? a->N / a->G : 1;
        uint32_t rows = (a->P + a->x_div - 1) / a->x_div;
        if ((uint64_t) rows * n_grp * a->K > mtp_xb_cap)
                return false;
        if (mtp_log_left > 0) {
                mtp_log_left--;
                fprintf(stderr, "k_mm_tcp: type %u%s %s P %u N %u K %u groups %u\n", TYPE, NR == 2 ? " swiglu" : "",
                        a->sel ? "grouped" : "dense", a->P, a->N, a->K, n_grp);
        }
        cu_launches += 2;
        cu_launch(k_x_bf16, rows * n_grp, 128, 0, s, a->x, a->x_pstride, a->x_gstride, n_grp, a->K, mtp_xb);
        uint32_t by = (a->N + MTP_BM - 1) / MTP_BM;
        size_t smem = MTP_NS * mtp_stage<TYPE>();
        dim3 grid((a->P + MTP_BN - 1) / MTP_BN, by);
        if (a->sel) {
                uint32_t n_ids = a->n_groups_max - (a->P + CU_GROUP_TILE - 1) / CU_GROUP_TILE;
                grid.x = (a->P + CU_GROUP_WIDE - 1) / CU_GROUP_WIDE + n_ids;
        }
        if (!a->sel) {
                uint32_t n_parts = (a->K + MT_KPART - 1) / MT_KPART;
                uint32_t pps = mtp_ks_pps((uint64_t) grid.x * grid.y, n_parts, mtp_ks_ok[IQ4]);
                if (pps) {
                        grid.z = (n_parts + pps - 1) / pps;
                        if (mtp_log_left > 0) {
                                mtp_log_left--;
                                fprintf(stderr, "k_mm_tcp: split K: %u tiles x %u blocks of %u parts\n", grid.x * grid.y,
                                        grid.z, pps);
                        }
                        cu_launch(k_mm_tcp<TYPE, NR, MT_DENSE, false, true>, grid, MTP_THREADS, smem, s, *a,
                                  (const uint16_t *) mtp_xb, n_grp, mtp_ks_buf, mtp_ks_ticket, pps);
                        return true;
                }
        }
        if constexpr (IQ4)
                if (mtp_d1_ok) {
                        cu_launch(a->sel ? k_mm_tcp<TYPE, NR, MT_GROUPED, true> : k_mm_tcp<TYPE, NR, MT_DENSE, true>,
                                  grid, MTP_THREADS, smem + MTP_D1_BYTES, s, *a, (const uint16_t *) mtp_xb, n_grp,
                                  (float *) NULL, (uint32_t *) NULL, 0u);
                        return true;
                }
        if constexpr (IQ4)
                if (a->sel && mtp_nw_ok && mtp_nw_on()) {
                        if (mtp_nw_log > 0) {
                                mtp_nw_log--;
                                fprintf(stderr, "k_mm_tcp: narrow grouped layout, P %u N %u\n", a->P, a->N);
                        }
                        cu_launch(k_mm_tcp<TYPE, NR, MT_GROUPED, false, false, true>, grid, MTP_THREADS, smem, s, *a,
                                  (const uint16_t *) mtp_xb, n_grp, (float *) NULL, (uint32_t *) NULL, 0u);
                        return true;
                }
        cu_launch(a->sel ? k_mm_tcp<TYPE, NR, MT_GROUPED> : k_mm_tcp<TYPE, NR, MT_DENSE>, grid, MTP_THREADS, smem, s,
                  *a, (const uint16_t *) mtp_xb, n_grp, (float *) NULL, (uint32_t *) NULL, 0u);
        return true;
}

/* X4_CUDA_MMTC_TCN=1: dense products of 17-64 inputs on k_mm_tcn (opt-in until a GPU has timed
 * it; the bits are the same either way) */
static bool mtn_on(void) {
        static int on = -1;
        if (on < 0)
                on = cu_env_on("X4_CUDA_MMTC_TCN");
        return on;
}

/* k_mm_tcn for this product if it takes it (dense, 17-64 inputs, 16-byte rows, the inputs fit the
 * bf16 scratch), else false */
template <int TYPE, int NR>
static bool launch_tcn(const struct cu_mv *a, cudaStream_t s) {
        constexpr bool IQ4 = mtd_rows<TYPE>::IQ4;
        constexpr uint32_t RB = mtd_rows<TYPE>::RB;
        uint32_t n_chunks = a->K / CU_CHUNK, n_st = (n_chunks + MTD_KC - 1) / MTD_KC;
        if (!mtn_on() || !mtd_smem_blk || !mtp_xb || a->sel || a->x_div != 1 || a->P <= MTD_P_MAX || a->P > 64)
                return false;
        if ((uintptr_t) a->w % 16 || a->row_bytes % 16 || (IQ4 && n_chunks % MTD_KC))
                return false;
        bool grouped = NR == 1 && a->G != a->N;
        if (grouped && (a->G % 16 || a->N % a->G)) /* a block's 16 rows in one input group */
                return false;
        uint32_t n_grp = grouped ? a->N / a->G : 1;
        if ((uint64_t) a->P * n_grp * a->K > mtp_xb_cap)
                return false;
        uint32_t m_tiles = (a->N + 15) / 16, W = (a->P + 7) / 8;
        uint64_t stage = (uint64_t) 16 * RB;
        uint32_t per_sm = (uint32_t) min(((uint64_t) m_tiles + mtd_sms - 1) / mtd_sms, (uint64_t) 16);
        uint64_t S = (mtd_smem_sm - per_sm * 2048u) / per_sm / stage;
        S = max(min(S, (uint64_t) min(MTD_S_MAX, n_st + 1)), (uint64_t) 2);
        /* X4_CUDA_MMTC_TCN_S=2..12: that ring (tests: the demo model's rows are a few stages, so the
         * default ring never wraps there) */
        static int force_s = -1;
        if (force_s < 0) {
                const char *e = getenv("X4_CUDA_MMTC_TCN_S");
                force_s = e && atoi(e) >= 2 && atoi(e) <= MTD_S_MAX ? atoi(e) : 0;
                if (e && *e && strcmp(e, "0") && !force_s)
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_MMTC_TCN_S=%s ignored: expected 2-%d stages\n", e, MTD_S_MAX);
        }
        if (force_s)
                S = (uint64_t) force_s;
        S = min(S, mtd_smem_blk / stage);
        if (S < 2)
                return false;
        if (mtd_log_left > 0) {
                mtd_log_left--;
                fprintf(stderr, "k_mm_tcn: type %u%s P %u N %u K %u groups %u grid %u warps %u stages %u\n", TYPE,
                        NR == 2 ? " swiglu" : "", a->P, a->N, a->K, n_grp, m_tiles, W, (uint32_t) S);
        }
        cu_launches += 2;
        cu_launch(k_x_bf16, a->P * n_grp, 128, 0, s, a->x, a->x_pstride, a->x_gstride, n_grp, a->K, mtp_xb);
        cu_launch(k_mm_tcn<TYPE, NR>, dim3(1, m_tiles), dim3(32 * W), (size_t) (S * stage), s, *a,
                  (const uint16_t *) mtp_xb, (uint32_t) S, n_grp);
        return true;
}

/* X4_CUDA_MMTC_DEC=0 keeps every token count on k_mm_tc (comparisons: the bits are the same);
 * =log also prints k_mm_tcd's first 64 launch shapes */
template <int TYPE, int NR>
static void launch_any(const struct cu_mv *a, cudaStream_t s) {
        static int dec = -1;
        if (dec < 0) {
                const char *e = getenv("X4_CUDA_MMTC_DEC");
                dec = !(e && !strcmp(e, "0"));
                if (mtd_log_left < 0)
                        mtd_log_left = e && !strcmp(e, "log") ? 64 : 0;
        }
        if (launch_tcn<TYPE, NR>(a, s) || launch_tcp<TYPE, NR>(a, s))
                return;
        if (dec && launch_tcs<TYPE, NR>(a, s))
                return;
        if (!dec || !launch_tcd<TYPE, NR>(a, s))
                launch_tc<TYPE, NR>(a, s);
}

/* ---- k_q6_tc: the Q6_K head on tensor cores (the default where every token takes the tensor-core
 * products since 2026-12-05; X4_CUDA_MM_Q6TC=0 keeps the CUDA-core head) ----
 *
 * The head (131,072 × 3,584 Q6_K, 385 MB) on CUDA cores keeps k_matvec's fp32 order for every
 * batch (k_mv_small up to 16 inputs, k_mm beyond): at batch 64 that is 60 GFLOP of fp32 FMA, 5.5
 * of a 36.6 ms step (H200, 4,096 positions). Here every input count runs one chain an output on
 * mma.sync m16n8k16 (bf16 × bf16 → fp32), so batch invariance holds by construction:
 *   - a Q6_K super-block's 16-value groups share a scale d·sc (docs/model.md §6, formed as
 *     cu_dequant32 forms it), and a k16 step is one group: its quants q − 32 (|q − 32| ≤ 32, exact
 *     in bf16) times the inputs rounded to bf16 (k_x_bf16), summed by the mma from zero;
 *   - acc = fmaf(d·sc, that sum, acc), groups in K order, one chain from zero: no parts, no split.
 * The numerics differ from k_matvec's (inputs rounded to bf16, as every tensor-core product's),
 * so the logits do (the GPU steps hold them to the fixture's and the demo model's bounds); the bits
 * never depend on the batch. Shape: a block of 4 warps, a warp 16 vocabulary rows (an m-tile) ×
 * up to 8·NT inputs; each warp streams its rows through a ring of Q6TC_S stages of two
 * super-blocks (420 bytes a row, 4-byte aligned in rows of K/256 · 210 bytes: K % 512 == 0) by
 * 4-byte cp.async; each lane decodes its A fragments from the staged bytes (two 16-bit reads a
 * row and k-pair, the ql nibbles and qh pairs as cu_dequant32 assembles them, q − 32 as a float
 * by the 2^23 trick, its upper half the bf16). B fragments are 32-bit reads of the bf16 inputs. */
#define Q6TC_WARPS 4
#define Q6TC_ROWB 424 /* smem bytes a staged row (two super-blocks + pad: rows 106 words, 10 banks apart) */
#define Q6TC_S 3      /* ring stages a warp */
#define Q6TC_SMEM (Q6TC_WARPS * Q6TC_S * 16 * Q6TC_ROWB)

/* two quants of a staged super-block row as a bf16 pair, the first in the low half: bytes at
 * ql + o, o + 1 (nibble shift sl) and qh + o, o + 1 (2-bit shift sh) */
[[maybe_unused]] static __device__ __forceinline__ uint32_t q6tc_pair(const uint8_t *ql, const uint8_t *qh, uint32_t sl,
                                                                      uint32_t sh) {
        uint32_t lo = *(const uint16_t *) ql, hi = *(const uint16_t *) qh;
        uint32_t v = ((lo >> sl) & 0x0F0Fu) | (((hi >> sh) & 0x0303u) << 4);
        float f0 = __int_as_float(0x4B000000 | (v & 0xFFu)) - 8388640.0f; /* (2^23 + q) − (2^23 + 32) */
        float f1 = __int_as_float(0x4B000000 | (v >> 8)) - 8388640.0f;
        return __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632); /* the upper halves: exact bf16 */
}

/* XS (the default, X4_CUDA_Q6TC_XS=0 off: +1.7% at batch 1 on an H100, 2026-12-05; launches of
 * up to Q6TC_XS_MAX inputs): the block's inputs copied once into shared memory after the wait
 * (rows of K/2 + 4 words: the eight inputs of a fragment's lanes on distinct banks), the inner
 * loop's B words read there instead of from the L2 (two __ldcg a group a lane, each an L2 round
 * trip: with two warps a scheduler, the batch-1 head read 385 MB at ~1.1 TB/s). The same words
 * into the same mma: the same bits. */
#define Q6TC_XS_MAX 2
#define Q6TC_XS_K_MAX 4096 /* the K its shared memory is sized for (the release's head: 3,584) */
static __host__ __device__ inline uint32_t q6tc_xs_words(uint32_t K) {
        return K / 2 + 4;
}

/* B16 (the default since 2026-12-07's nineteenth session; X4_CUDA_Q6TC_B16=0 keeps the 4-byte
 * loads): the inputs from k_x_bf16_q6p, each lane's B words of two groups as one 16-byte __ldcg
 * at the even group instead of four 4-byte ones. At batch 64 the head ran at ~225 GB/s (1.87 ms
 * of a 20.5 ms step, H100): a lane's two 4-byte loads of a group touched the same 32-byte sector
 * of its input row, so the L2 served every sector twice and issued 16 loads a group a lane with
 * eight n-tiles. The same words into the same mma, so the same bits (GPU step q6tc_b16_same).
 * H100, full model: batch 64 3,555-3,557 / 2,206-2,209 tok/s at 512 / 4,096 against 3,351-3,355 /
 * 2,122-2,124, batch 16 1,408 / 1,137-1,142 against 1,381-1,384 / 1,121-1,124. */
template <int NT, bool XS = false, bool B16 = false>
__global__ void __launch_bounds__(Q6TC_WARPS * 32, 2) k_q6_tc(struct cu_mv a, const uint16_t *xb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        static_assert(!XS || NT == 1, "staged inputs: one n-tile");
        static_assert(!(XS && B16), "the staged copy keeps k_x_bf16's order");
        extern __shared__ __align__(16) uint8_t q6tc_smem[];
        constexpr uint32_t WPR = 2 * 210 / 4; /* words a row a stage: 105 */
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        /* grid x the input tiles (blocks of the same rows run together: the rows leave DRAM once) */
        uint32_t row0 = (blockIdx.y * Q6TC_WARPS + warp) * 16, p0 = blockIdx.x * 8 * NT;
        uint32_t n_st = a.K / 512; /* stages: two super-blocks each */
        uint8_t *ring = q6tc_smem + (size_t) warp * Q6TC_S * 16 * Q6TC_ROWB;
        const uint8_t *wb = (const uint8_t *) a.w;
        /* weights no kernel writes: the first stages in flight before the wait */
        auto load = [&](uint32_t st) {
                if (st < n_st) {
                        uint8_t *dst = ring + (size_t) (st % Q6TC_S) * 16 * Q6TC_ROWB;
                        for (uint32_t e = lane; e < 16 * WPR; e += 32) {
                                uint32_t rr = e / WPR, wd = e % WPR, r = row0 + rr;
                                if (r < a.N)
                                        mtd_cp<4>(dst + rr * Q6TC_ROWB + 4 * wd,
                                                  wb + (uint64_t) r * a.row_bytes + (uint64_t) st * 420 + 4 * wd);
                        }
                }
                mtd_commit();
        };
        for (uint32_t st = 0; st + 1 < Q6TC_S; st++)
                load(st);
        cu_pdl_wait();
        cu_pdl_trigger();
        /* this lane's B columns: input p0 + 8j + g, its bf16 row in xb (K values); XS: its row of
         * the staged copy (past the ring), which every thread helps fill (16-byte pieces) */
        const uint32_t *xr[NT];
        bool on[NT];
        uint32_t *xs = (uint32_t *) (q6tc_smem + Q6TC_SMEM);
        if constexpr (XS) {
                uint32_t xw = q6tc_xs_words(a.K), n_in = min((uint32_t) Q6TC_XS_MAX, a.P - p0), pieces = a.K / 8;
                for (uint32_t e = threadIdx.x; e < n_in * pieces; e += blockDim.x) {
                        uint32_t p = e / pieces, k = e % pieces;
                        *(uint4 *) (xs + p * xw + 4 * k) = __ldcg((const uint4 *) (xb + (uint64_t) (p0 + p) * a.K) + k);
                }
                __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
                uint32_t p = p0 + 8 * j + g;
                on[j] = p < a.P && (!XS || g < Q6TC_XS_MAX);
                xr[j] = XS ? xs + (on[j] ? g : 0) * q6tc_xs_words(a.K)
                           : (const uint32_t *) (xb + (uint64_t) (on[j] ? p : 0) * a.K);
        }
        float acc[NT][4] = {}; /* zeros */
        for (uint32_t st = 0; st < n_st; st++) {
                mtd_wait(Q6TC_S - 2);
                __syncwarp(); /* every lane's copies of stage st landed; its reads of stage st − 1 done */
                load(st + Q6TC_S - 1); /* into stage st − 1's slot: two stages in flight during the math */
                const uint8_t *sbase = ring + (size_t) (st % Q6TC_S) * 16 * Q6TC_ROWB;
#pragma unroll
                for (uint32_t u = 0; u < 2; u++) {
                        const uint8_t *b0 = sbase + g * Q6TC_ROWB + 210 * u, *b1 = b0 + 8 * Q6TC_ROWB;
                        float d0 = __half2float(*(const __half *) (b0 + 208)), d1 = __half2float(*(const __half *) (b1 + 208));
                        uint32_t k0w = (st * 512 + u * 256) / 2; /* the super-block's first input word */
                        uint4 b4[NT]; /* B16: the words of groups grp, grp + 1 (grp even) */
#pragma unroll
                        for (uint32_t grp = 0; grp < 16; grp++) {
                                /* group grp: chunk sub = grp / 2 of cu_dequant32 (half n, quarter q),
                                 * its values 16·(grp % 2) .. + 15; this lane's k-pairs 2t and 2t + 8 */
                                uint32_t sub = grp / 2, n = sub / 4, q = sub % 4;
                                uint32_t l = 16 * (grp % 2) + 2 * t;
                                uint32_t qlo = 64 * n + 32 * (q & 1) + l, qho = 128 + 32 * n + l;
                                uint32_t sl = (q & 2) ? 4 : 0, sh = 2 * q;
                                uint32_t A[4];
                                A[0] = q6tc_pair(b0 + qlo, b0 + qho, sl, sh);
                                A[1] = q6tc_pair(b1 + qlo, b1 + qho, sl, sh);
                                A[2] = q6tc_pair(b0 + qlo + 8, b0 + qho + 8, sl, sh);
                                A[3] = q6tc_pair(b1 + qlo + 8, b1 + qho + 8, sl, sh);
                                uint32_t si = 192 + 8 * n + 2 * q + grp % 2;
                                float ds0 = d0 * (float) *(const int8_t *) (b0 + si);
                                float ds1 = d1 * (float) *(const int8_t *) (b1 + si);
                                uint32_t kw = k0w + 8 * grp + t; /* input word of values 16·grp + 2t, +1 */
                                if constexpr (B16) {
                                        if (grp % 2 == 0) {
#pragma unroll
                                                for (int j = 0; j < NT; j++)
                                                        b4[j] = on[j] ? __ldcg((const uint4 *) (xr[j] + kw - t) + t)
                                                                      : make_uint4(0u, 0u, 0u, 0u);
                                        }
                                }
#pragma unroll
                                for (int j = 0; j < NT; j++) {
                                        /* the previous kernel's rows: past L1 (XS: the staged copy) */
                                        uint32_t bw0 = 0u, bw1 = 0u;
                                        if constexpr (B16) {
                                                bw0 = grp % 2 ? b4[j].z : b4[j].x;
                                                bw1 = grp % 2 ? b4[j].w : b4[j].y;
                                        } else if (on[j]) {
                                                if constexpr (XS) {
                                                        bw0 = xr[j][kw], bw1 = xr[j][kw + 4];
                                                } else {
                                                        bw0 = __ldcg(xr[j] + kw), bw1 = __ldcg(xr[j] + kw + 4);
                                                }
                                        }
                                        float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                        mtd_mma(tmp, A, bw0, bw1);
                                        acc[j][0] = __fmaf_rn(ds0, tmp[0], acc[j][0]);
                                        acc[j][1] = __fmaf_rn(ds0, tmp[1], acc[j][1]);
                                        acc[j][2] = __fmaf_rn(ds1, tmp[2], acc[j][2]);
                                        acc[j][3] = __fmaf_rn(ds1, tmp[3], acc[j][3]);
                                }
                        }
                }
        }
        mtd_wait(0);
        /* d0, d1: row g, inputs 2t, 2t + 1; d2, d3: row g + 8 */
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                        uint32_t r = row0 + g + (e >= 2 ? 8 : 0), p = p0 + 8 * j + 2 * t + (e & 1);
                        if (r < a.N && p < a.P)
                                a.y[(uint64_t) p * a.y_pstride + r] = acc[j][e];
                }
#else
        (void) a, (void) xb;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

/* The Q6_K head on tensor cores (k_q6_tc) for every input count: the default when every token
 * takes the tensor-core products (H200, full model, 72ecf98: batch 64 2,417 -> 2,871 tok/s at
 * 512 and 1,755 -> 1,966 at 4,096, batch 16 +9%, batch 1 195.6 -> 194.9, within noise;
 * bench/RESULTS.md). X4_CUDA_MM_Q6TC=0 keeps the head on k_mm / k_matvec (fp32 inputs);
 * =1 puts it there also when generated tokens take the CUDA-core products. */
static bool q6tc_ready, q6tc_xs_ready, q6tc_b16_ready;
static bool q6tc_on(void) {
        static int on = -1;
        if (on < 0)
                on = cu_env_or("X4_CUDA_MM_Q6TC", mm_tc_all());
        return on;
}

static void q6tc_setup(void) {
        q6tc_ready = q6tc_on() &&
                     cudaFuncSetAttribute(k_q6_tc<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, Q6TC_SMEM) == cudaSuccess &&
                     cudaFuncSetAttribute(k_q6_tc<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, Q6TC_SMEM) == cudaSuccess &&
                     cudaFuncSetAttribute(k_q6_tc<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, Q6TC_SMEM) == cudaSuccess &&
                     cudaFuncSetAttribute(k_q6_tc<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, Q6TC_SMEM) == cudaSuccess;
        (void) cudaGetLastError();
        /* XS unless X4_CUDA_Q6TC_XS=0: sized for K up to Q6TC_XS_K_MAX */
        q6tc_xs_ready = q6tc_ready && cu_env_or("X4_CUDA_Q6TC_XS", true) &&
                        cudaFuncSetAttribute(k_q6_tc<1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int) (Q6TC_SMEM + Q6TC_XS_MAX * q6tc_xs_words(Q6TC_XS_K_MAX) * 4)) == cudaSuccess;
        (void) cudaGetLastError();
        /* B16 unless X4_CUDA_Q6TC_B16=0: launches the staged copy does not take */
        auto set = [](auto f) {
                return cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, Q6TC_SMEM) == cudaSuccess;
        };
        q6tc_b16_ready = q6tc_ready && cu_env_or("X4_CUDA_Q6TC_B16", true) && set(k_q6_tc<1, false, true>) &&
                         set(k_q6_tc<2, false, true>) && set(k_q6_tc<4, false, true>) && set(k_q6_tc<8, false, true>);
        (void) cudaGetLastError();
}

/* k_q6_tc for a plain Q6_K product (K % 512 == 0, the inputs fit the bf16 scratch), else false.
 * Whether it takes a product depends on the matrix alone (and the scratch, which holds a pass's
 * rows), never on the input count, so every batch of a model takes the same answer. */
static bool launch_q6tc(const struct cu_mv *a, cudaStream_t s) {
        /* k_x_bf16 reads the inputs as float4, one row an input */
        if (a->x_div != 1 || a->x_pstride % 4 || (uintptr_t) a->x % 16)
                return false;
        if (!q6tc_ready || !mtp_xb || a->sel || a->swiglu || a->G != a->N || a->K % 512 ||
            a->row_bytes % 4 || (uintptr_t) a->w % 4 || (uint64_t) a->P * a->K > mtp_xb_cap)
                return false;
        uint32_t nt = a->P <= 8 ? 1 : a->P <= 16 ? 2 : a->P <= 32 ? 4 : 8;
        dim3 grid((a->P + 8 * nt - 1) / (8 * nt), (a->N + 16 * Q6TC_WARPS - 1) / (16 * Q6TC_WARPS));
        static int log_left = -1; /* X4_CUDA_MMTC_DEC=log: the first launches' shapes (tests: that it ran) */
        if (log_left < 0) {
                const char *e = getenv("X4_CUDA_MMTC_DEC");
                log_left = e && !strcmp(e, "log") ? 16 : 0;
        }
        bool xs = q6tc_xs_ready && a->P <= Q6TC_XS_MAX && a->K <= Q6TC_XS_K_MAX;
        bool b16 = !xs && q6tc_b16_ready;
        if (log_left > 0) {
                log_left--;
                fprintf(stderr, "k_q6_tc: P %u N %u K %u inputs a block %u%s\n", a->P, a->N, a->K, 8 * nt,
                        xs ? " inputs staged" : b16 ? " inputs permuted, 16-byte loads" : "");
        }
        cu_launches += 2;
        const uint16_t *xb = mtp_xb;
        if (b16) {
                cu_launch(k_x_bf16_q6p, a->P, 128, 0, s, a->x, a->x_pstride, a->K, mtp_xb);
                if (nt == 1)
                        cu_launch(k_q6_tc<1, false, true>, grid, Q6TC_WARPS * 32, Q6TC_SMEM, s, *a, xb);
                else if (nt == 2)
                        cu_launch(k_q6_tc<2, false, true>, grid, Q6TC_WARPS * 32, Q6TC_SMEM, s, *a, xb);
                else if (nt == 4)
                        cu_launch(k_q6_tc<4, false, true>, grid, Q6TC_WARPS * 32, Q6TC_SMEM, s, *a, xb);
                else
                        cu_launch(k_q6_tc<8, false, true>, grid, Q6TC_WARPS * 32, Q6TC_SMEM, s, *a, xb);
                return true;
        }
        cu_launch(k_x_bf16, a->P, 128, 0, s, a->x, a->x_pstride, (uint64_t) 0, 1u, a->K, mtp_xb);
        if (xs)
                cu_launch(k_q6_tc<1, true>, grid, Q6TC_WARPS * 32, Q6TC_SMEM + a->P * q6tc_xs_words(a->K) * 4, s, *a, xb);
        else if (nt == 1)
                cu_launch(k_q6_tc<1>, grid, Q6TC_WARPS * 32, Q6TC_SMEM, s, *a, xb);
        else if (nt == 2)
                cu_launch(k_q6_tc<2>, grid, Q6TC_WARPS * 32, Q6TC_SMEM, s, *a, xb);
        else if (nt == 4)
                cu_launch(k_q6_tc<4>, grid, Q6TC_WARPS * 32, Q6TC_SMEM, s, *a, xb);
        else
                cu_launch(k_q6_tc<8>, grid, Q6TC_WARPS * 32, Q6TC_SMEM, s, *a, xb);
        return true;
}

/* Whether tc runs this product (an sm_80+ device, every token or a prompt-class pass, BF16 or
 * IQ4_NL rows, a block's rows within one input group); if so it is launched. Every token count of
 * a matrix and class takes the same answer, so invariance holds. */
extern "C" bool cu_matvec_tc(const struct cu_mv *a, cudaStream_t s) {
        if (!(mm_tc_all() || (mm_tc_pass && mm_tc_prompt())) || !mm_tc_ready || a->few_rows)
                return false;
        if (a->type == CU_TYPE_Q6_K)
                return launch_q6tc(a, s);
        if (a->type != CU_TYPE_BF16 && a->type != CU_TYPE_IQ4_NL)
                return false;
        /* staged as float4; one input group per block; rows pair up for SwiGLU */
        if (a->K % CU_CHUNK || a->x_pstride % 4 || a->x_gstride % 4 || (uintptr_t) a->x % 16)
                return false;
        if (!a->swiglu && a->G != a->N && a->G % MT_ROWS)
                return false;
        if (a->type == CU_TYPE_BF16) {
                if (a->swiglu)
                        launch_any<CU_TYPE_BF16, 2>(a, s);
                else
                        launch_any<CU_TYPE_BF16, 1>(a, s);
        } else {
                if (a->swiglu)
                        launch_any<CU_TYPE_IQ4_NL, 2>(a, s);
                else
                        launch_any<CU_TYPE_IQ4_NL, 1>(a, s);
        }
        return true;
}
