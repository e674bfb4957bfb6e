/* SPDX-License-Identifier: MIT */
/* Tensor-core products (X4_CUDA_MM=tc, sm_80+; issue 12): the BF16 and IQ4_NL projections of
 * every token count through mma.sync m16n8k16 with BF16 inputs and fp32 accumulation. Their own
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
 * and B follows the same value indices. BF16 uses the plain mapping. */
#include <cuda_bf16.h>

#include "common.cuh"

#define MT_WARPS 4
#define MT_MT 2                                  /* m-tiles a warp: 32 stored rows */
#define MT_ROWS (MT_WARPS * MT_MT * 16)         /* stored rows a block: 128 */
#define MT_KT 256                                /* input values staged at a time (8 chunks) */
#define MT_XS (MT_KT + 8)                        /* bf16 per staged row: 132 words, 4g + t banks */
#define MT_NT_DENSE 8                            /* n-tiles a block for plain products: 64 inputs */

enum { MT_DENSE, MT_GROUPED, MT_SEL };

static bool mm_tc_ready;

extern "C" void cu_mm_tc_setup(void) {
        int dev = 0, major = 0;
        mm_tc_ready = cudaGetDevice(&dev) == cudaSuccess &&
                      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                      major >= 8;
}

[[maybe_unused]] static __device__ __forceinline__ void mt_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
        (void) d, (void) a, (void) b0, (void) b1;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

/* two bf16 values in a word, the first in the low half */
[[maybe_unused]] static __device__ __forceinline__ uint32_t mt_pack(uint16_t lo, uint16_t hi) {
        return (uint32_t) lo | ((uint32_t) hi << 16);
}

[[maybe_unused]] static __device__ __forceinline__ uint16_t mt_bf16(float v) {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        return *(uint16_t *) &h;
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
                                                        mt_mma(tmp[j], af, *(const uint32_t *) (xr + 8 * s + 2 * t),
                                                               *(const uint32_t *) (xr + 16 + 8 * s + 2 * t));
                                                }
                                        }
#pragma unroll
                                        for (int j = 0; j < NT; j++) {
                                                acc[mt][j][0] += d0 * tmp[j][0];
                                                acc[mt][j][1] += d0 * tmp[j][1];
                                                acc[mt][j][2] += d1 * tmp[j][2];
                                                acc[mt][j][3] += d1 * tmp[j][3];
                                        }
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
                                                        mt_mma(acc[mt][j], af, *(const uint32_t *) (xr + 2 * t),
                                                               *(const uint32_t *) (xr + 8 + 2 * t));
                                                }
                                        }
                                }
                        }
                }
        }
        /* D fragment: rows g (e 0, 1) and g + 8 (e 2, 3), columns 2t and 2t + 1 of each n-tile */
#pragma unroll
        for (int mt = 0; mt < MT_MT; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                                uint32_t r = row0 + warp * MT_MT * 16 + mt * 16 + g + 8 * (e / 2);
                                uint32_t n = j * 8 + 2 * t + (e & 1);
                                float v = acc[mt][j][e];
                                if (NR == 2) {
                                        /* (gate, up) are stored rows 2o, 2o + 1: rows g and g ^ 1,
                                         * lanes 4 apart */
                                        float up = __shfl_xor_sync(CU_FULL_MASK, v, 4);
                                        if (g & 1)
                                                continue;
                                        v = v / (1.0f + expf(-v)) * up; /* docs/model.md §5 */
                                }
                                if (r >= n_rows || n >= n_p)
                                        continue;
                                uint32_t p = MODE == MT_GROUPED ? (uint32_t) perm[n] : p0 + n;
                                uint32_t o = NR == 2 ? r / 2 : r;
                                a.y[(uint64_t) p * a.y_pstride + (uint64_t) grp * a.y_gstride +
                                    (NR == 1 ? o % a.G : o)] = v;
                        }
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

/* Whether tc runs this product (X4_CUDA_MM=tc on an sm_80+ device, BF16 or IQ4_NL rows, a
 * block's rows within one input group); if so it is launched. Every token count of a matrix
 * takes the same answer, so invariance holds. */
extern "C" bool cu_matvec_tc(const struct cu_mv *a, cudaStream_t s) {
        static int on = -1;
        if (on < 0) {
                const char *e = getenv("X4_CUDA_MM");
                on = e && !strcmp(e, "tc");
        }
        if (!on || !mm_tc_ready || a->few_rows)
                return false;
        if (a->type != CU_TYPE_BF16 && a->type != CU_TYPE_IQ4_NL)
                return false;
        /* staged as float4; one input group per block; rows pair up for SwiGLU */
        if (a->K % CU_CHUNK || a->x_pstride % 4 || a->x_gstride % 4 || (uintptr_t) a->x % 16)
                return false;
        if (!a->swiglu && a->G != a->N && a->G % MT_ROWS)
                return false;
        if (a->type == CU_TYPE_BF16) {
                if (a->swiglu)
                        launch_tc<CU_TYPE_BF16, 2>(a, s);
                else
                        launch_tc<CU_TYPE_BF16, 1>(a, s);
        } else {
                if (a->swiglu)
                        launch_tc<CU_TYPE_IQ4_NL, 2>(a, s);
                else
                        launch_tc<CU_TYPE_IQ4_NL, 1>(a, s);
        }
        return true;
}
