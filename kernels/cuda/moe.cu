/* SPDX-License-Identifier: MIT */
/* MoE routing (docs/model.md §5). The router runs in fp32 on the F32 router weight; selection uses
 * score + bias, the weights the unbiased scores. The expert products themselves (with SwiGLU
 * fused) are cu_matvec over (token, slot) pairs. */
#include "common.cuh"
#include "route.cuh"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__global__ void k_route(struct cu_router a, uint32_t T, int32_t *sel, float *wout) {
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
        if (t >= T)
                return;
        route_token<false>(a, t, lane, sel, wout);
}

/* The router's matvec and its selection in one launch: block (rows r0 .. r0 + RB − 1, token tile)
 * computes those rows' logits for up to TP tokens with k_matvec_few's arithmetic (cu_few_rows:
 * the same bits for any RB), and the last row block of a tile to finish (an atomic ticket, reset by
 * that block) selects the tile's experts, a warp a token, with k_route's code: one launch instead
 * of two a MoE layer. RB > 1 (token tiles of many tokens) reads each token's input once for RB
 * rows instead of once a row. REL (X4_CUDA_ROUTER_RELEASE=1, batch 1's build only; opt-in until a
 * GPU has timed it): the ticket by cu_ticket_acq_rel instead of two __threadfence (the logits'
 * writers' and the last block's) on the step's critical path; synchronization only, the same bits. */
template <int TYPE, int TP, int RB, bool REL = false>
__global__ void __launch_bounds__(CU_FEW_WARPS * 32)
        k_router_fused(struct cu_router a, const float *f, uint32_t T, int32_t *sel, float *wout) {
        cu_pdl_wait();
        cu_pdl_trigger();
        __shared__ float part[CU_FEW_WARPS][RB][TP];
        __shared__ bool last;
        uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
        uint32_t r0 = blockIdx.x * RB, p0 = blockIdx.y * TP;
        const uint8_t *w = (const uint8_t *) a.w + (uint64_t) r0 * a.row_bytes;
        const float *x[TP];
#pragma unroll
        for (int t = 0; t < TP; t++)
                x[t] = f + (uint64_t) (p0 + t < T ? p0 + t : p0) * a.H;
        float v = cu_few_rows<TYPE, TP, RB>(w, a.row_bytes, x, a.H, part);
        if (tid < RB * TP && p0 + tid % TP < T) {
                a.z[(uint64_t) (p0 + tid % TP) * a.n_expert + r0 + tid / TP] = v;
                if constexpr (!REL)
                        __threadfence(); /* the logit is visible before this block's ticket */
        }
        __syncthreads();
        if (tid == 0)
                last = (REL ? cu_ticket_acq_rel(&a.ticket[blockIdx.y]) : atomicAdd(&a.ticket[blockIdx.y], 1u)) ==
                       gridDim.x - 1;
        __syncthreads();
        if (!last)
                return;
        if constexpr (!REL)
                __threadfence();
        if (warp < TP && p0 + warp < T)
                route_token<true>(a, p0 + warp, lane, sel, wout);
        if (tid == 0)
                a.ticket[blockIdx.y] = 0;
}

/* ---- k_router_tiled: a prompt pass's router, every expert of 32 tokens a block (the default for
 * passes of RT_MIN_TOKENS or more on sm_80+ since 2026-12-05; X4_CUDA_ROUTER_TILED=0 keeps
 * k_router_fused) ----
 *
 * k_router_fused's logits are cu_few_rows' sums: for value k the thread k % 1024 of a block of
 * CU_FEW_WARPS warps, whose chain (one fmaf from zero a value) runs over k, k + 1024, ...; each
 * warp's 32 chains summed by cu_warp_sum's xor butterfly; the 32 warp sums added in warp order
 * from zero. Fine for one token (64 blocks spread a 0.9 MB matrix over the card) but a prompt
 * pass's 4,096 tokens run 8,192 blocks of 1,024 threads whose butterflies and barriers outweigh
 * their 112 multiply-adds a thread (the router was ~7% of a 4,096-token prefill). Here a thread
 * computes whole logits, 8 experts of one token, in that same order: for warp slice w = 0 .. 31,
 * each leaf (lane) l's chain over the values 32w + l + 1024s (s = 0 .. 3: K ≤ 4,096), the 32
 * leaves combined as the butterfly combines them (l with l + 16, then with + 8, + 4, + 2, + 1:
 * rt_tree, depth first so a few partial sums live at once), the slice's sum added to the logit.
 * A block stages each slice's values of the 64 experts' rows and its 32 tokens' inputs (4-byte
 * cp.async, two slices in flight), then writes its tokens' logits and selects their experts with
 * k_route's code. The same sums, so the same bits as k_router_fused (GPU step: cmp). F32 rows,
 * at most 64 experts, K a multiple of 32 up to 4,096. */
#define RT_TOK 32
#define RT_ROWS 64
#define RT_THREADS 256                  /* 8 warps: 8 experts each, a lane a token */
#define RT_NS 4                         /* values a chain: K ≤ 4 · 1,024 */
#define RT_WS RT_ROWS                   /* floats a staged (slice, lane) row of the experts' weights (a warp's
                                         * reads of it are broadcasts; 98,560 bytes in all fit sm_86's 99 KiB) */
#define RT_XS (RT_NS * 32 + 1)          /* floats a staged token row (+1: the lanes' rows on distinct banks) */
#define RT_STAGE (RT_NS * 32 * RT_WS + RT_TOK * RT_XS) /* floats a staged slice */
static_assert(CU_FEW_WARPS == 32, "a warp slice of 32 values: cu_few_rows' block of 1,024 threads");

/* V(J, M) of the butterfly's tree over one slice's 32 leaves, for a thread's 8 experts: V(0, l)
 * = leaf l, V(J, M) = V(J − 1, M) + V(J − 1, M + 2^(5 − J)); V(5, 0) is what cu_warp_sum leaves
 * in every lane. ws: the staged weights at the thread's first expert, xs: its token's row. */
template <int J, int M>
struct rt_tree {
        static __device__ __forceinline__ void eval(const float *ws, const float *xs, uint32_t ns, float (&out)[8]) {
                float a[8], b[8];
                rt_tree<J - 1, M>::eval(ws, xs, ns, a);
                rt_tree<J - 1, M + (1 << (5 - J))>::eval(ws, xs, ns, b);
#pragma unroll
                for (int p = 0; p < 8; p++)
                        out[p] = a[p] + b[p];
        }
};
template <int M>
struct rt_tree<0, M> { /* leaf M: the chain of cu_few_rows' thread 32w + M */
        static __device__ __forceinline__ void eval(const float *ws, const float *xs, uint32_t ns, float (&out)[8]) {
#pragma unroll
                for (int p = 0; p < 8; p++)
                        out[p] = 0.0f;
#pragma unroll
                for (uint32_t s = 0; s < RT_NS; s++)
                        if (s < ns) {
                                float xv = xs[s * 32 + M];
                                const float4 *wp = (const float4 *) (ws + (s * 32 + M) * RT_WS);
                                float4 w0 = wp[0], w1 = wp[1];
                                out[0] = __fmaf_rn(w0.x, xv, out[0]);
                                out[1] = __fmaf_rn(w0.y, xv, out[1]);
                                out[2] = __fmaf_rn(w0.z, xv, out[2]);
                                out[3] = __fmaf_rn(w0.w, xv, out[3]);
                                out[4] = __fmaf_rn(w1.x, xv, out[4]);
                                out[5] = __fmaf_rn(w1.y, xv, out[5]);
                                out[6] = __fmaf_rn(w1.z, xv, out[6]);
                                out[7] = __fmaf_rn(w1.w, xv, out[7]);
                        }
        }
};

__global__ void __launch_bounds__(RT_THREADS) k_router_tiled(struct cu_router a, const float *f, uint32_t T, int32_t *sel,
                                                            float *wout) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        extern __shared__ __align__(16) float rts[]; /* two stages: [slice value][expert], then [token][value] */
        uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        uint32_t t0 = blockIdx.x * RT_TOK, K = a.H, NE = a.n_expert;
        /* slice w: values 32w + 1024s + l of every expert and token (past K or the tokens: not loaded,
         * never read into a stored sum) */
        auto stage = [&](uint32_t w) {
                if (w < 32) {
                        float *sw = rts + (w & 1) * RT_STAGE, *sx = sw + RT_NS * 32 * RT_WS;
                        for (uint32_t e = tid; e < RT_NS * 32 * RT_ROWS; e += RT_THREADS) {
                                uint32_t row = e % RT_ROWS, sl = e / RT_ROWS, k = 32 * w + 1024 * (sl / 32) + sl % 32;
                                if (row < NE && k < K)
                                        mtd_cp<4>(sw + sl * RT_WS + row,
                                                  (const uint8_t *) a.w + (uint64_t) row * a.row_bytes + 4 * (uint64_t) k);
                        }
                        for (uint32_t e = tid; e < RT_TOK * RT_NS * 32; e += RT_THREADS) {
                                uint32_t tt = e / (RT_NS * 32), sl = e % (RT_NS * 32), k = 32 * w + 1024 * (sl / 32) + sl % 32;
                                if (t0 + tt < T && k < K)
                                        mtd_cp<4>(sx + tt * RT_XS + sl, f + (uint64_t) (t0 + tt) * K + k);
                        }
                }
                mtd_commit();
        };
        cu_pdl_wait();
        cu_pdl_trigger();
        stage(0);
        float v[8] = {}; /* the logits, from zero as cu_few_rows' v */
        for (uint32_t w = 0; w < 32; w++) {
                stage(w + 1); /* into the buffer slice w − 1 used (read before the last barrier) */
                mtd_wait(1);
                __syncthreads(); /* slice w landed for every thread */
                const float *sw = rts + (w & 1) * RT_STAGE, *sx = sw + RT_NS * 32 * RT_WS;
                uint32_t ns = 0; /* the chains' values in this slice: K % 32 == 0, so the same for every lane */
                while (ns < RT_NS && 32 * w + 1024 * ns < K)
                        ns++;
                float sv[8];
                rt_tree<5, 0>::eval(sw + 8 * warp, sx + lane * RT_XS, ns, sv);
#pragma unroll
                for (int p = 0; p < 8; p++)
                        v[p] += sv[p];
                __syncthreads(); /* every thread's reads of slice w done before stage(w + 2) refills it */
        }
        mtd_wait(0);
        uint32_t t = t0 + lane;
#pragma unroll
        for (int p = 0; p < 8; p++) {
                uint32_t r = 8 * warp + p;
                if (t < T && r < NE)
                        a.z[(uint64_t) t * NE + r] = v[p];
        }
        __syncthreads(); /* the block's logits written (global, visible to the block past the barrier) */
        for (uint32_t tt = warp; tt < RT_TOK; tt += RT_THREADS / 32)
                if (t0 + tt < T)
                        route_token<false>(a, t0 + tt, lane, sel, wout);
#else
        (void) a, (void) f, (void) T, (void) sel, (void) wout;
        __trap(); /* the host never picks this kernel below sm_80 */
#endif
}

/* k_router_tiled for passes of RT_MIN_TOKENS tokens or more: the default on sm_80+ (the same bits
 * as k_router_fused, tests/gpu/run.sh; H200, full model, 72ecf98: prefill 4,096 12,370 -> 12,485
 * tok/s alone, 12,933 -> 13,070 beside X4_CUDA_HC=wtok; bench/RESULTS.md). X4_CUDA_ROUTER_TILED=0
 * keeps k_router_fused; =log also says its first launches on stderr (that it ran); =1 says when
 * the device cannot run it. Whether the device gave it its shared memory is settled here
 * (cu_route_setup, at backend creation: not inside a graph capture). */
static int router_tiled_on, router_tiled_log;

extern "C" void cu_route_setup(void) {
        const char *e = getenv("X4_CUDA_ROUTER_TILED");
        bool asked = e && (!strcmp(e, "1") || !strcmp(e, "log"));
        if (e && *e && !asked && strcmp(e, "0"))
                fprintf(stderr, "xing4d-cuda: X4_CUDA_ROUTER_TILED=%s ignored: expected 0, 1 or log\n", e);
        router_tiled_on = 0;
        if (!(e && !strcmp(e, "0"))) {
                router_tiled_log = e && !strcmp(e, "log") ? 4 : 0;
                int dev = 0, major = 0;
                router_tiled_on = cudaGetDevice(&dev) == cudaSuccess &&
                                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                                  major >= 8 &&
                                  cudaFuncSetAttribute(k_router_tiled, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       (int) (2 * RT_STAGE * sizeof(float))) == cudaSuccess;
                (void) cudaGetLastError();
                if (!router_tiled_on && asked)
                        fprintf(stderr, "xing4d-cuda: X4_CUDA_ROUTER_TILED: this device cannot run k_router_tiled "
                                        "(sm_80+ and %zu bytes of shared memory a block); the fused router runs\n",
                                (size_t) (2 * RT_STAGE * sizeof(float)));
        }
}

/* Tokens from which a pass's router takes k_router_tiled: 32 tokens a block, so below this the
 * grid leaves most SMs idle where k_router_fused spreads 64 row blocks a token tile over them */
#define RT_MIN_TOKENS 1024

/* k_router_tiled for this launch: on, enough tokens, F32 rows, ≤ 64 experts, K a multiple of 32 up
 * to 4,096 */
static bool router_tiled(const struct cu_router *a, uint32_t T) {
        return router_tiled_on && T >= RT_MIN_TOKENS && a->type == CU_TYPE_F32 && a->n_expert <= RT_ROWS &&
               a->H % 32 == 0 && a->H <= RT_NS * 1024 && a->row_bytes % 4 == 0 && (uintptr_t) a->w % 4 == 0;
}

/* X4_CUDA_ROUTER_RELEASE=1 (k_router_fused's REL), read once */
static bool router_release_on(void) {
        static int on = -1;
        if (on < 0)
                on = cu_env_on("X4_CUDA_ROUTER_RELEASE");
        return on;
}

/* rows a router block for token tiles of CU_ROUTE_TP (X4_CUDA_ROUTER_RB=1: one, the bits are the same) */
#define ROUTER_RB 4

extern "C" void cu_route(const struct cu_router *a, const float *f, uint32_t T, int32_t *sel,
                         float *w, cudaStream_t s) {
        if (T == 0)
                return;
        struct cu_mv mv = {
                .w = a->w, .type = a->type, .row_bytes = a->row_bytes, .K = a->H,
                .N = a->n_expert, .G = a->n_expert, .x = f, .x_pstride = a->H, .x_div = 1,
                .y = a->z, .y_pstride = a->n_expert, .P = T, .few_rows = true,
        };
        if (router_tiled(a, T)) {
                if (router_tiled_log > 0) {
                        router_tiled_log--;
                        fprintf(stderr, "k_router_tiled: T %u experts %u K %u\n", T, a->n_expert, a->H);
                }
                cu_launches++;
                cu_launch(k_router_tiled, (T + RT_TOK - 1) / RT_TOK, RT_THREADS, 2 * RT_STAGE * sizeof(float), s, *a, f, T,
                          sel, w);
                return;
        }
        if (a->ticket && a->n_expert <= ROUTER_MAX_EXPERTS &&
            (a->type == CU_TYPE_F32 || a->type == CU_TYPE_F16 || a->type == CU_TYPE_BF16)) {
                static_assert(CU_ROUTE_TP <= CU_FEW_WARPS, "a warp a token of the tile");
                static_assert(ROUTER_RB * CU_ROUTE_TP <= CU_FEW_WARPS * 32, "a thread a (row, token) sum");
                static int rb1 = -1;
                if (rb1 < 0) {
                        const char *e = getenv("X4_CUDA_ROUTER_RB");
                        rb1 = e && !strcmp(e, "1");
                }
                /* many tokens: ROUTER_RB rows a block (a token's input read once for them); one
                 * token, or experts not a multiple: a row a block, to spread over the SMs */
                bool multi = !rb1 && T > CU_ROUTE_TP && a->n_expert % ROUTER_RB == 0;
                dim3 grid(a->n_expert / (multi ? ROUTER_RB : 1), (T + CU_ROUTE_TP - 1) / CU_ROUTE_TP);
                cu_launches++;
                if (a->type == CU_TYPE_F32 && T == 1)
                        cu_launch(router_release_on() ? k_router_fused<CU_TYPE_F32, 1, 1, true>
                                                              : k_router_fused<CU_TYPE_F32, 1, 1>,
                                  grid, CU_FEW_WARPS * 32, 0, s, *a, f, T, sel, w);
                else if (a->type == CU_TYPE_F32 && multi)
                        cu_launch(k_router_fused<CU_TYPE_F32, CU_ROUTE_TP, ROUTER_RB>, grid, CU_FEW_WARPS * 32, 0, s, *a, f, T, sel, w);
                else if (a->type == CU_TYPE_F32)
                        cu_launch(k_router_fused<CU_TYPE_F32, CU_ROUTE_TP, 1>, grid, CU_FEW_WARPS * 32, 0, s, *a, f, T, sel, w);
                else if (a->type == CU_TYPE_F16 && multi)
                        cu_launch(k_router_fused<CU_TYPE_F16, CU_ROUTE_TP, ROUTER_RB>, grid, CU_FEW_WARPS * 32, 0, s, *a, f, T, sel, w);
                else if (a->type == CU_TYPE_F16)
                        cu_launch(k_router_fused<CU_TYPE_F16, CU_ROUTE_TP, 1>, grid, CU_FEW_WARPS * 32, 0, s, *a, f, T, sel, w);
                else if (multi)
                        cu_launch(k_router_fused<CU_TYPE_BF16, CU_ROUTE_TP, ROUTER_RB>, grid, CU_FEW_WARPS * 32, 0, s, *a, f, T, sel, w);
                else
                        cu_launch(k_router_fused<CU_TYPE_BF16, CU_ROUTE_TP, 1>, grid, CU_FEW_WARPS * 32, 0, s, *a, f, T, sel, w);
                return;
        }
        cu_matvec(&mv, s);
        cu_launches++;
        cu_launch(k_route, (T + 7) / 8, 256, 0, s, *a, T, sel, w); /* 8 tokens (warps) a block */
}

__global__ void k_route_spread(int32_t *sel, uint32_t T, uint32_t S, uint32_t k, uint32_t n_expert, uint32_t layer) {
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
        if (t >= T)
                return;
        uint32_t off = (t * 2654435761u + (layer + 1) * 40503u) % n_expert;
        for (uint32_t j = 0; j < k; j++) {
                int32_t e = sel[(uint64_t) t * S + j];
                if (e >= 0 && (uint32_t) e < n_expert)
                        sel[(uint64_t) t * S + j] = (int32_t) (((uint32_t) e + off) % n_expert);
        }
}

extern "C" void cu_route_spread(int32_t *sel, uint32_t T, uint32_t S, uint32_t k, uint32_t n_expert, uint32_t layer,
                                cudaStream_t s) {
        if (T == 0 || n_expert == 0)
                return;
        cu_launches++;
        cu_launch(k_route_spread, (T + 127) / 128, 128, 0, s, sel, T, S, k, n_expert, layer);
}

/* One block lays out the pairs by expert (the layout depends on sel alone): each id's pair
 * count, a serial prefix placing the ids, then each id's pairs in pair order and its tiles. */
#define GROUP_IDS_MAX 288 /* ≥ ROUTER_MAX_EXPERTS + 1 ids */

extern "C" uint32_t cu_moe_group_ints(uint32_t P, uint32_t n_ids) {
        uint32_t tiles = (P + CU_GROUP_TILE - 1) / CU_GROUP_TILE + n_ids;
        uint32_t wide = (P + CU_GROUP_WIDE - 1) / CU_GROUP_WIDE + n_ids;
        return 1 + 3 * tiles + P + 1 + 3 * wide;
}

/* Serial prefix over the ids' pair counts: each id's first pair, first tile and first wide tile;
 * the tile counts in groups[0] and wide[0]. */
static __device__ __forceinline__ void group_prefix(const uint32_t *cnt, uint32_t n_ids, uint32_t *first,
                                                    uint32_t *tile0, uint32_t *wide0, int32_t *groups,
                                                    int32_t *wide) {
        uint32_t f = 0, tl = 0, tw = 0;
        for (uint32_t x = 0; x < n_ids; x++) {
                first[x] = f;
                tile0[x] = tl;
                wide0[x] = tw;
                f += cnt[x];
                tl += (cnt[x] + CU_GROUP_TILE - 1) / CU_GROUP_TILE;
                tw += (cnt[x] + CU_GROUP_WIDE - 1) / CU_GROUP_WIDE;
        }
        groups[0] = (int32_t) tl;
        wide[0] = (int32_t) tw;
}

/* Id e's tile and wide-tile descriptors (n pairs from its first; its first tile and wide tile),
 * a lane a tile. */
static __device__ __forceinline__ void group_descs(uint32_t e, uint32_t n, uint32_t lane, const uint32_t *first,
                                                   const uint32_t *tile0, const uint32_t *wide0, int32_t *groups,
                                                   int32_t *wide) {
        for (uint32_t j = lane; j * CU_GROUP_TILE < n; j += 32) {
                int32_t *tdesc = groups + 1 + 3 * (tile0[e] + j);
                tdesc[0] = (int32_t) e;
                tdesc[1] = (int32_t) (first[e] + j * CU_GROUP_TILE);
                tdesc[2] = (int32_t) min((uint32_t) CU_GROUP_TILE, n - j * CU_GROUP_TILE);
        }
        for (uint32_t j = lane; j * CU_GROUP_WIDE < n; j += 32) {
                int32_t *tdesc = wide + 1 + 3 * (wide0[e] + j);
                tdesc[0] = (int32_t) e;
                tdesc[1] = (int32_t) (first[e] + j * CU_GROUP_WIDE);
                tdesc[2] = (int32_t) min((uint32_t) CU_GROUP_WIDE, n - j * CU_GROUP_WIDE);
        }
}

/* The reference grouping, kept for tests/gpu only (x4_cuda_group_compare): warp w takes ids w,
 * w + 32, ..., and walks the pairs 32 at a time, a ballot of those that name its id giving their
 * count (first pass) and their ranks in pair order (second pass). It was the production kernel until
 * k_moe_group_scan below (the same ints, memcmp-compared on the H200 for 1 to 73,728 pairs) took
 * over: this one scans all P pairs twice for every id on one SM (381 us a layer for the 20,480
 * pairs of a 4,096-token pass of the full model); the scan made a 4,096-token prefill 11,630 ->
 * 12,275 tok/s. */
#define GROUP_PAR_THREADS 1024
__global__ void __launch_bounds__(GROUP_PAR_THREADS)
        k_moe_group(const int32_t *sel, uint32_t P, uint32_t n_ids, int32_t *groups) {
        cu_pdl_wait();
        cu_pdl_trigger();
        __shared__ uint32_t cnt[GROUP_IDS_MAX], first[GROUP_IDS_MAX], tile0[GROUP_IDS_MAX], wide0[GROUP_IDS_MAX];
        uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
        uint32_t tiles_max = (P + CU_GROUP_TILE - 1) / CU_GROUP_TILE + n_ids;
        int32_t *perm = groups + 1 + 3 * tiles_max;
        int32_t *wide = perm + P;
        const int32_t *ss = sel;

        for (uint32_t e = warp; e < n_ids; e += nw) {
                uint32_t n = 0;
                for (uint32_t c = 0; c < P; c += 32)
                        n += __popc(__ballot_sync(CU_FULL_MASK, c + lane < P && ss[c + lane] == (int32_t) e));
                if (lane == 0)
                        cnt[e] = n;
        }
        __syncthreads();
        if (threadIdx.x == 0)
                group_prefix(cnt, n_ids, first, tile0, wide0, groups, wide);
        __syncthreads();
        for (uint32_t e = warp; e < n_ids; e += nw) {
                uint32_t n = cnt[e], k = first[e];
                if (n == 0)
                        continue;
                for (uint32_t c = 0; c < P; c += 32) {
                        bool m = c + lane < P && ss[c + lane] == (int32_t) e;
                        uint32_t b = __ballot_sync(CU_FULL_MASK, m);
                        if (m)
                                perm[k + __popc(b & ((1u << lane) - 1u))] = (int32_t) (c + lane);
                        k += __popc(b);
                }
                group_descs(e, n, lane, first, tile0, wide0, groups, wide);
        }
}

/* The same ints with work linear in P: the pairs are read in chunks of a block's 1,024 threads,
 * a thread a pair. Counts: a warp's lanes naming one id find each other (__match_any_sync) and the
 * lowest adds their number. Placement, chunk by chunk: each warp's count of each id into a table,
 * a scan of the table over the warps in order per id (carrying the id's running total across
 * chunks), then a pair's place is its id's first + the ids' pairs in earlier chunks and earlier
 * warps + its lanes below it naming the same id: pair order within an id, as k_moe_group. Ids
 * outside [0, n_ids) are skipped, as there. The grouping every MoE layer of a prompt pass or a large
 * batch runs (cu_moe_group). */
#define GSCAN_WARPS (GROUP_PAR_THREADS / 32)
__global__ void __launch_bounds__(GROUP_PAR_THREADS)
        k_moe_group_scan(const int32_t *sel, uint32_t P, uint32_t n_ids, int32_t *groups) {
        cu_pdl_wait();
        cu_pdl_trigger();
        __shared__ uint32_t cnt[GROUP_IDS_MAX], first[GROUP_IDS_MAX], tile0[GROUP_IDS_MAX], wide0[GROUP_IDS_MAX];
        __shared__ uint32_t run[GROUP_IDS_MAX];
        __shared__ uint32_t wcnt[GSCAN_WARPS * GROUP_IDS_MAX]; /* [warp][id], n_ids a row */
        uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        uint32_t tiles_max = (P + CU_GROUP_TILE - 1) / CU_GROUP_TILE + n_ids;
        int32_t *perm = groups + 1 + 3 * tiles_max;
        int32_t *wide = perm + P;
        uint32_t below = (1u << lane) - 1u;

        for (uint32_t x = threadIdx.x; x < n_ids; x += blockDim.x) {
                cnt[x] = 0;
                run[x] = 0;
        }
        __syncthreads();
        for (uint32_t c = 0; c < P; c += blockDim.x) { /* the same trip count for every thread */
                uint32_t i = c + threadIdx.x;
                int32_t x = i < P ? sel[i] : -1;
                if (x >= (int32_t) n_ids)
                        x = -1;
                uint32_t m = __match_any_sync(CU_FULL_MASK, x);
                if (x >= 0 && (m & below) == 0)
                        atomicAdd(&cnt[x], (uint32_t) __popc(m));
        }
        __syncthreads();
        if (threadIdx.x == 0)
                group_prefix(cnt, n_ids, first, tile0, wide0, groups, wide);
        __syncthreads();
        for (uint32_t c = 0; c < P; c += blockDim.x) {
                uint32_t i = c + threadIdx.x;
                int32_t x = i < P ? sel[i] : -1;
                if (x >= (int32_t) n_ids)
                        x = -1;
                uint32_t m = __match_any_sync(CU_FULL_MASK, x);
                for (uint32_t k = threadIdx.x; k < GSCAN_WARPS * n_ids; k += blockDim.x)
                        wcnt[k] = 0;
                __syncthreads();
                if (x >= 0 && (m & below) == 0)
                        wcnt[warp * n_ids + (uint32_t) x] = (uint32_t) __popc(m);
                __syncthreads();
                for (uint32_t e = threadIdx.x; e < n_ids; e += blockDim.x) {
                        uint32_t r = run[e];
                        for (uint32_t w = 0; w < GSCAN_WARPS; w++) {
                                uint32_t t = wcnt[w * n_ids + e];
                                wcnt[w * n_ids + e] = r;
                                r += t;
                        }
                        run[e] = r;
                }
                __syncthreads();
                if (x >= 0)
                        perm[first[x] + wcnt[warp * n_ids + (uint32_t) x] + (uint32_t) __popc(m & below)] = (int32_t) i;
                __syncthreads(); /* the table is zeroed again next chunk */
        }
        for (uint32_t e = warp; e < n_ids; e += GSCAN_WARPS)
                group_descs(e, cnt[e], lane, first, tile0, wide0, groups, wide);
}

/* A test hook, exported for tests/gpu (`x4-gpu-check group`, found by dlsym; nothing else calls
 * it): P ids in [-2, n_ids + 2) from an LCG of `seed` (so some out of range), grouped by
 * k_moe_group (the reference) and by k_moe_group_scan (what cu_moe_group runs), each into a buffer
 * filled with the same byte pattern first. 0: both buffers hold the same bytes; 2: they differ;
 * -1 on bad arguments or a CUDA error. */
extern "C" __attribute__((visibility("default"))) int x4_cuda_group_compare(uint32_t P, uint32_t n_ids,
                                                                           uint32_t seed) {
        if (P == 0 || n_ids == 0 || n_ids > GROUP_IDS_MAX)
                return -1;
        size_t ints = cu_moe_group_ints(P, n_ids), bytes = ints * sizeof(int32_t);
        int32_t *h = (int32_t *) malloc(P * sizeof(int32_t)), *out = (int32_t *) malloc(2 * bytes);
        int32_t *d_sel = NULL, *d_g = NULL;
        int r = -1;
        if (!h || !out)
                goto done;
        for (uint32_t i = 0; i < P; i++) {
                seed = seed * 1103515245u + 12345u;
                h[i] = (int32_t) ((seed >> 8) % (n_ids + 4)) - 2;
        }
        if (cudaMalloc(&d_sel, P * sizeof(int32_t)) != cudaSuccess || cudaMalloc(&d_g, 2 * bytes) != cudaSuccess ||
            cudaMemcpy(d_sel, h, P * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemset(d_g, 0xa5, 2 * bytes) != cudaSuccess)
                goto done;
        k_moe_group<<<1, GROUP_PAR_THREADS>>>(d_sel, P, n_ids, d_g);
        k_moe_group_scan<<<1, GROUP_PAR_THREADS>>>(d_sel, P, n_ids, d_g + ints);
        if (cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess ||
            cudaMemcpy(out, d_g, 2 * bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
                goto done;
        r = memcmp(out, out + ints, bytes) ? 2 : 0;
done:
        cudaFree(d_sel);
        cudaFree(d_g);
        free(h);
        free(out);
        return r;
}

extern "C" uint32_t cu_moe_group(const int32_t *sel, uint32_t P, uint32_t n_ids,
                                 int32_t *groups, cudaStream_t s) {
        if (P == 0 || n_ids > GROUP_IDS_MAX)
                return 0;
        cu_launches++;
        cu_launch(k_moe_group_scan, 1, GROUP_PAR_THREADS, 0, s, sel, P, n_ids, groups);
        return (P + CU_GROUP_TILE - 1) / CU_GROUP_TILE + n_ids;
}
