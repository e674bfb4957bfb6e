/* SPDX-License-Identifier: MIT */
/* Device helpers shared by the kernels: exact dequantization of one 32-value chunk of a stored row
 * (docs/model.md §6) and fixed-order reductions. */
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

#define CU_FULL_MASK 0xffffffffu

/* Programmatic dependent launch (sm_90+; no-ops before). Every kernel of the forward is launched
 * with cu_launch, which lets it start while the previous kernel is still running. Every kernel
 * calls cu_pdl_wait() before it touches anything an earlier kernel of the stream wrote (the wait
 * returns when the previous grid has finished and its writes are visible, and that grid waited
 * for its own predecessor), and cu_pdl_trigger() right after it, so at most one kernel is
 * launched ahead (triggering before the wait let a chain of waiting grids fill the SMs: 12%
 * slower at batch 1). What a kernel does before the wait may only read data no kernel writes:
 * weights, as the matvecs and the HC kernel do to have their weight loads in flight during the
 * previous kernel's tail, and the step's metadata (token positions, page tables: copied by the
 * host before the step's first kernel, never written by a kernel), as the attention kernels do
 * to have their cache row offsets ready. One exception rests on that order: since every kernel
 * waits before it triggers, kernel N starts only once kernel N − 2 has finished, so data written
 * three kernels back or more is in memory before N's wait and may be read then, past L1 (__ldcg):
 * the expert products' pair ids (sel_ready) and an early mHC pre-mapping's previous partial rows
 * (X4_CUDA_HC_EARLY). A kernel that triggered before its wait would break it. */
static __device__ __forceinline__ void cu_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
static __device__ __forceinline__ void cu_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* X4_CUDA_L2PF (launch.h struct cu_pf): ask the L2 for [p, p + n) before the wait, spread over a
 * grid: chunk c of CU_PF_CHUNK bytes by block c % nb, thread (c / nb) % nt, so every SM of the
 * grid issues some. sm_90: one bulk prefetch a chunk (the copy engine walks it); sm_80-89: a
 * prefetch instruction a 128-byte line; older: nothing. A prefetch reads nothing into registers
 * and writes nothing, so no result depends on it. */
#define CU_PF_CHUNK 16384u
static __device__ __forceinline__ void cu_l2_prefetch_range(const void *p, uint64_t n, uint32_t blk, uint32_t nb,
                                                            uint32_t tid, uint32_t nt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (!p || ((uintptr_t) p & 15))
                return;
        uint64_t nch = (n + CU_PF_CHUNK - 1) / CU_PF_CHUNK, me = (uint64_t) tid * nb + blk, all = (uint64_t) nb * nt;
        for (uint64_t c = me; c < nch; c += all) {
                uint64_t off = c * CU_PF_CHUNK;
                uint32_t len = (uint32_t) (n - off < CU_PF_CHUNK ? n - off : CU_PF_CHUNK) & ~15u;
                if (len)
                        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const char *) p + off), "r"(len)
                                     : "memory");
        }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        if (!p)
                return;
        uint64_t me = (uint64_t) tid * nb + blk, all = (uint64_t) nb * nt;
        for (uint64_t off = me * 128; off < n; off += all * 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *) p + off));
#else
        (void) p, (void) n, (void) blk, (void) nb, (void) tid, (void) nt;
#endif
}
static __device__ __forceinline__ void cu_l2_prefetch(const struct cu_pf &pf, uint32_t blk, uint32_t nb, uint32_t tid,
                                                      uint32_t nt) {
#pragma unroll
        for (int r = 0; r < CU_PF_MAX; r++)
                if (pf.n[r])
                        cu_l2_prefetch_range(pf.p[r], pf.n[r], blk, nb, tid, nt);
}
/* the calling grid's flat block index and block count */
static __device__ __forceinline__ uint32_t cu_block_flat() {
        return (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
}
static __device__ __forceinline__ uint32_t cu_blocks() {
        return gridDim.x * gridDim.y * gridDim.z;
}

/* An opt-in switch (read once by its caller): NAME=1 on; unset, empty or 0 off; anything else off,
 * said on stderr */
static inline bool cu_env_on(const char *name) {
        const char *e = getenv(name);
        if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
                fprintf(stderr, "xing4d-cuda: %s=%s ignored: expected 0 or 1\n", name, e);
        return e && !strcmp(e, "1");
}

/* A default-on switch whose default may depend on the caller's state: NAME=1 on, NAME=0 off, unset
 * or empty `dflt`; anything else `dflt`, said on stderr */
static inline bool cu_env_or(const char *name, bool dflt) {
        const char *e = getenv(name);
        if (!e || !*e)
                return dflt;
        if (strcmp(e, "0") && strcmp(e, "1")) {
                fprintf(stderr, "xing4d-cuda: %s=%s ignored: expected 0 or 1\n", name, e);
                return dflt;
        }
        return !strcmp(e, "1");
}

/* Launch `kernel` on `s`, with programmatic stream serialization when cu_pdl is on. */
template <typename... KArgs, typename... Args>
static void cu_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t s, Args &&...args) {
        if (cu_carveout_max) {
                /* X4_CUDA_CARVEOUT_MAX (launch.h): once a kernel (this file's launches) */
                static const void *done[256];
                static unsigned n_done;
                bool seen = false;
                cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
                for (unsigned i = 0; i < n_done && !seen; i++)
                        seen = done[i] == (const void *) kernel;
                /* never inside a graph capture (a kernel's first launch is an eager one) */
                if (!seen && cudaStreamIsCapturing(s, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone) {
                        if (n_done < 256)
                                done[n_done++] = (const void *) kernel;
                        (void) cudaFuncSetAttribute((const void *) kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                    (int) cudaSharedmemCarveoutMaxShared);
                        (void) cudaGetLastError();
                }
        }
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = s;
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = cu_pdl ? 1 : 0;
        (void) cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

/* docs/model.md §6: the IQ4_NL codebook */
__constant__ static const float cu_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                       1,    13,   25,  38,  53,  69,  89,  113};

/* The codebook + 128 as bytes (1, 24, 45, ..., 241), four to a word, for lookups by byte
 * permutes (__byte_perm picks byte s & 7 of the pair of words for each selector nibble s), and
 * byte k of such a word back to its codebook value: 0x4B0000bb is the float 2^23 + bb, exactly. */
#define CU_IQ4_B0 0x3F2D1801u
#define CU_IQ4_B1 0x766A5D4Fu
#define CU_IQ4_B2 0xA6998D81u
#define CU_IQ4_B3 0xF1D9C5B5u
static __device__ __forceinline__ float cu_iq4_byte(uint32_t v, uint32_t k) {
        return __int_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | k)) - 8388736.0f;
}

static __device__ __forceinline__ float cu_fp16(const uint8_t *p) {
        uint16_t h = (uint16_t) p[0] | ((uint16_t) p[1] << 8);
        return __half2float(__ushort_as_half(h));
}

static __device__ __forceinline__ float cu_bf16(uint16_t b) {
        return __uint_as_float((uint32_t) b << 16);
}

/* Values [32·c, 32·c + 32) of a row, exactly as stored (no rounding: every product below is exact
 * in fp32 except Q6_K's d·sc·q, which rounds once). Loads are as wide as the layout allows: rows
 * of F32/F16/BF16 start 64-byte aligned (K % 32 == 0 and 256-aligned tensors), IQ4_NL/Q8_0 blocks
 * only 2-byte aligned. `iq4` is the IQ4_NL codebook, in shared memory in hot kernels: a
 * __constant__ table indexed by per-lane nibbles serializes (measured: 1.4 ms per MoE layer of
 * decode on an H200 before, see bench/RESULTS.md). */
template <int TYPE>
static __device__ __forceinline__ void cu_dequant32(const uint8_t *row, uint32_t c, float *out,
                                                    const float *iq4) {
        if (TYPE == CU_TYPE_F32) {
                const float4 *r = (const float4 *) (row + 128 * (uint64_t) c);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                        float4 v = r[i];
                        out[4 * i] = v.x;
                        out[4 * i + 1] = v.y;
                        out[4 * i + 2] = v.z;
                        out[4 * i + 3] = v.w;
                }
        } else if (TYPE == CU_TYPE_F16) {
                const uint4 *r = (const uint4 *) (row + 64 * (uint64_t) c);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                        uint4 v = r[i];
                        uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                                out[8 * i + 2 * j] = __half2float(__ushort_as_half((uint16_t) wv[j]));
                                out[8 * i + 2 * j + 1] =
                                        __half2float(__ushort_as_half((uint16_t) (wv[j] >> 16)));
                        }
                }
        } else if (TYPE == CU_TYPE_BF16) {
                const uint4 *r = (const uint4 *) (row + 64 * (uint64_t) c);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                        uint4 v = r[i];
                        uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                                out[8 * i + 2 * j] = __uint_as_float(wv[j] << 16);
                                out[8 * i + 2 * j + 1] = __uint_as_float(wv[j] & 0xffff0000u);
                        }
                }
        } else if (TYPE == CU_TYPE_Q8_0) {
                const uint16_t *b = (const uint16_t *) (row + 34 * (uint64_t) c);
                float d = __half2float(__ushort_as_half(b[0]));
#pragma unroll
                for (int j = 0; j < 16; j++) {
                        uint16_t q = b[1 + j];
                        out[2 * j] = d * (float) (int8_t) (q & 0xff);
                        out[2 * j + 1] = d * (float) (int8_t) (q >> 8);
                }
        } else if (TYPE == CU_TYPE_IQ4_NL) {
                const uint16_t *b = (const uint16_t *) (row + 18 * (uint64_t) c);
                float d = __half2float(__ushort_as_half(b[0]));
#pragma unroll
                for (int j = 0; j < 8; j++) {
                        uint16_t q = b[1 + j];
                        uint8_t q0 = q & 0xff, q1 = q >> 8;
                        out[2 * j] = d * iq4[q0 & 0xF];
                        out[2 * j + 16] = d * iq4[q0 >> 4];
                        out[2 * j + 1] = d * iq4[q1 & 0xF];
                        out[2 * j + 17] = d * iq4[q1 >> 4];
                }
        } else if (TYPE == CU_TYPE_Q6_K) {
                /* chunk c is quarter q of half n of super-block c/8 (docs/model.md §6 loop order); the
                 * 210-byte blocks are 2-byte aligned: 16-bit loads */
                const uint8_t *b = row + 210 * (uint64_t) (c / 8);
                uint32_t sub = c % 8, n = sub / 4, q = sub % 4;
                const uint16_t *ql = (const uint16_t *) (b + 64 * n + ((q & 1) ? 32 : 0));
                const uint16_t *qh = (const uint16_t *) (b + 128 + 32 * n);
                const int8_t *sc = (const int8_t *) (b + 192) + 8 * n;
                float d = cu_fp16(b + 208);
                uint32_t shift_lo = (q & 2) ? 4 : 0; /* q3,q4 take the high nibble */
                uint32_t shift_hi = 2 * q;
                float ds0 = d * (float) sc[2 * q], ds1 = d * (float) sc[1 + 2 * q];
#pragma unroll
                for (int j = 0; j < 16; j++) {
                        uint32_t lo = ql[j], hi = qh[j];
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                                int l = 2 * j + e;
                                int v = (int) ((((lo >> (8 * e)) >> shift_lo) & 0xF) |
                                               ((((hi >> (8 * e)) >> shift_hi) & 3) << 4)) -
                                        32;
                                out[l] = (l < 16 ? ds0 : ds1) * (float) v;
                        }
                }
        }
}

/* One value of a row (the few-rows products and the router: consecutive threads read consecutive values). */
template <int TYPE>
static __device__ __forceinline__ float cu_value(const uint8_t *row, uint32_t k) {
        if (TYPE == CU_TYPE_F32)
                return ((const float *) row)[k];
        if (TYPE == CU_TYPE_F16)
                return __half2float(((const __half *) row)[k]);
        return cu_bf16(((const uint16_t *) row)[k]);
}

/* Runtime-typed variant for small, cold matrices (HC projection, router). */
static __device__ __forceinline__ void cu_dequant32_any(uint32_t type, const uint8_t *row,
                                                        uint32_t c, float *out) {
        switch (type) {
        case CU_TYPE_F32: cu_dequant32<CU_TYPE_F32>(row, c, out, cu_iq4nl_values); break;
        case CU_TYPE_F16: cu_dequant32<CU_TYPE_F16>(row, c, out, cu_iq4nl_values); break;
        case CU_TYPE_BF16: cu_dequant32<CU_TYPE_BF16>(row, c, out, cu_iq4nl_values); break;
        case CU_TYPE_Q8_0: cu_dequant32<CU_TYPE_Q8_0>(row, c, out, cu_iq4nl_values); break;
        case CU_TYPE_IQ4_NL: cu_dequant32<CU_TYPE_IQ4_NL>(row, c, out, cu_iq4nl_values); break;
        default: cu_dequant32<CU_TYPE_Q6_K>(row, c, out, cu_iq4nl_values); break;
        }
}

/* Tile `tile` of a grouped product (struct cu_mv.groups, cu_moe_group): its expert, its pair
 * indices and how many; false when the tile is beyond this batch's (the whole block returns). */
static __device__ __forceinline__ bool cu_group_tile(const struct cu_mv &a, uint32_t tile,
                                                     int32_t *expert, const int32_t **perm,
                                                     uint32_t *n) {
        if (tile >= (uint32_t) a.groups[0])
                return false;
        const int32_t *td = a.groups + 1 + 3 * tile;
        *expert = td[0];
        *perm = a.groups + 1 + 3 * a.n_groups_max + td[1];
        *n = (uint32_t) td[2];
        return true;
}

/* Butterfly sum over the warp: the same fixed pattern on every call, every lane gets the sum. */
static __device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(CU_FULL_MASK, v, o);
        return v;
}

/* Warps of the few-rows products (k_matvec_few) and the router's (k_router_fused): 32 warps a
 * row, latency-bound otherwise (8 warps: 24 µs for the 24 × 14336 HC projection). */
#define CU_FEW_WARPS 32

/* One row's dot products with TP inputs, a block of CU_FEW_WARPS warps: thread j takes values
 * j, j + blockDim, ... in one chain an input, the warp sums land in part[warp][t], and thread t
 * (< TP) gets input t's sum, the warp sums added in warp order. k_matvec_few and the router
 * share it, so the router's logits have the few-rows products' bits. Ends past a barrier. */
template <int TYPE, int TP>
static __device__ __forceinline__ float cu_few_row(const uint8_t *w, const float *const *x, uint32_t K,
                                                   float (*part)[TP]) {
        uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
        float acc[TP];
#pragma unroll
        for (int t = 0; t < TP; t++)
                acc[t] = 0.0f;
#pragma unroll 4
        for (uint32_t k = tid; k < K; k += blockDim.x) {
                float wv = cu_value<TYPE>(w, k);
#pragma unroll
                for (int t = 0; t < TP; t++)
                        acc[t] += wv * x[t][k];
        }
#pragma unroll
        for (int t = 0; t < TP; t++) {
                float v = cu_warp_sum(acc[t]);
                if (lane == 0)
                        part[warp][t] = v;
        }
        __syncthreads();
        float v = 0.0f;
        if (tid < TP)
                for (int i = 0; i < CU_FEW_WARPS; i++)
                        v += part[i][tid];
        return v;
}

/* cu_few_row for RB consecutive rows (row_bytes apart) at once: every (row, input) sum is
 * cu_few_row's chain (thread j takes values j, j + blockDim, ...; the warp sums added in warp
 * order), so the same bits; the inputs are read once for the RB rows. Thread tid < RB·TP gets
 * row tid / TP's sum with input tid % TP. Ends past a barrier. */
template <int TYPE, int TP, int RB>
static __device__ __forceinline__ float cu_few_rows(const uint8_t *w, uint64_t row_bytes, const float *const *x,
                                                    uint32_t K, float (*part)[RB][TP]) {
        uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
        float acc[RB][TP];
#pragma unroll
        for (int r = 0; r < RB; r++)
#pragma unroll
                for (int t = 0; t < TP; t++)
                        acc[r][t] = 0.0f;
#pragma unroll 2
        for (uint32_t k = tid; k < K; k += blockDim.x) {
                float xv[TP];
#pragma unroll
                for (int t = 0; t < TP; t++)
                        xv[t] = x[t][k];
#pragma unroll
                for (int r = 0; r < RB; r++) {
                        float wv = cu_value<TYPE>(w + (uint64_t) r * row_bytes, k);
#pragma unroll
                        for (int t = 0; t < TP; t++)
                                acc[r][t] += wv * xv[t];
                }
        }
#pragma unroll
        for (int r = 0; r < RB; r++)
#pragma unroll
                for (int t = 0; t < TP; t++) {
                        float v = cu_warp_sum(acc[r][t]);
                        if (lane == 0)
                                part[warp][r][t] = v;
                }
        __syncthreads();
        float v = 0.0f;
        if (tid < RB * TP)
                for (int i = 0; i < CU_FEW_WARPS; i++)
                        v += part[i][tid / TP][tid % TP];
        return v;
}

static __device__ __forceinline__ float cu_warp_max(float v) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
                v = fmaxf(v, __shfl_xor_sync(CU_FULL_MASK, v, o));
        return v;
}

/* Sum of one value per thread over a block of blockDim.x (a multiple of 32, ≤ 1024) threads in a
 * fixed order; `red` is 32 floats of shared memory. Every thread gets the result. */
static __device__ __forceinline__ float cu_block_sum(float v, float *red) {
        int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
        v = cu_warp_sum(v);
        __syncthreads(); /* red may still be read by a previous call */
        if (lane == 0)
                red[warp] = v;
        __syncthreads();
        v = lane < nw ? red[lane] : 0.0f;
        return cu_warp_sum(v);
}

static __device__ __forceinline__ float cu_block_max(float v, float *red) {
        int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
        v = cu_warp_max(v);
        __syncthreads();
        if (lane == 0)
                red[warp] = v;
        __syncthreads();
        v = lane < nw ? red[lane] : -INFINITY;
        return cu_warp_max(v);
}

/* Rotate one pair by the YaRN angle of position pos (docs/model.md §4.1). The angle is formed in double:
 * p·inv_freq reaches 2.6e5 rad and fp32 would lose ~1e-2 rad there. */
static __device__ __forceinline__ void cu_rope_pair(float x0, float x1, uint32_t pos,
                                                    double inv_freq, float *y0, float *y1) {
        double sn, cs;
        sincos((double) pos * inv_freq, &sn, &cs);
        float c = (float) cs, s = (float) sn;
        *y0 = x0 * c - x1 * s;
        *y1 = x0 * s + x1 * c;
}

/* docs/model.md §4.1: rotation e (head e / (R/2), pair e % (R/2)) of token t's q_pe (rows of
 * nope + R in q) into its absorbed row's last R values (rows of KV + R in qc) at position pos:
 * k_q_rope's and the absorb product's side blocks' (X4_CUDA_ROPE_SIDE) */
static __device__ __forceinline__ void cu_q_rope_one(const float *q, float *qc, uint32_t n_head, uint32_t nope,
                                                     uint32_t R, uint32_t KV, const double *inv_freq, bool interleave,
                                                     uint32_t t, uint32_t pos, uint32_t e) {
        uint32_t half = R / 2, h = e / half, i = e % half;
        const float *qp = q + ((uint64_t) t * n_head + h) * (nope + R) + nope;
        float *dst = qc + ((uint64_t) t * n_head + h) * (KV + R) + KV;
        uint32_t i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + half;
        cu_rope_pair(qp[i0], qp[i1], pos, inv_freq[i], &dst[i0], &dst[i1]);
}

/* cp.async and ldmatrix (sm_80+; no-ops below, where the host never picks their kernels): the
 * tensor-core products (mmtc.cu) and the prompt attention (mla.cu) */
/* global → shared without registers: 16 bytes past L1 (cg), or 4 bytes (ca: cg takes 16 only) */
template <int BYTES>
[[maybe_unused]] static __device__ __forceinline__ void mtd_cp(void *smem, const void *gmem) {
        static_assert(BYTES == 16 || BYTES == 4, "16- or 4-byte copies");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        uint32_t s = (uint32_t) __cvta_generic_to_shared(smem);
        if constexpr (BYTES == 16)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
        else
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
#else
        (void) smem, (void) gmem;
#endif
}

[[maybe_unused]] static __device__ __forceinline__ void mtd_cp16(void *smem, const void *gmem) {
        mtd_cp<16>(smem, gmem);
}

[[maybe_unused]] static __device__ __forceinline__ void mtd_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* wait until at most n of this thread's cp.async groups are pending (n is an immediate in PTX) */
[[maybe_unused]] static __device__ __forceinline__ void mtd_wait(uint32_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        switch (n) {
        case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
        case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
        case 7: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
        case 8: asm volatile("cp.async.wait_group 8;\n" ::: "memory"); break;
        case 9: asm volatile("cp.async.wait_group 9;\n" ::: "memory"); break;
        case 10: asm volatile("cp.async.wait_group 10;\n" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
        }
#else
        (void) n;
#endif
}

/* d += a·b, one m16n8k16 tensor-core step with fp32 accumulation: bf16 operands (BF16) or f16 */
template <bool BF16>
[[maybe_unused]] static __device__ __forceinline__ void mtd_mma16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        if constexpr (BF16)
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                             "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
        else
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                             "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
        (void) d, (void) a, (void) b0, (void) b1;
        __trap(); /* the host never picks these kernels below sm_80 */
#endif
}

/* four 8×8 b16 matrices; lane l gives the row address of matrix l / 8, r[i] is matrix i's fragment
 * (TRANS: transposed, the B fragments of row-major [k][n] tiles) */
template <bool TRANS = false>
[[maybe_unused]] static __device__ __forceinline__ void mtp_ldm4(uint32_t *r, const void *smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        uint32_t s = (uint32_t) __cvta_generic_to_shared(smem);
        if constexpr (TRANS)
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
        else
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
#else
        (void) r, (void) smem;
#endif
}

