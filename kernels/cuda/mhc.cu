/* SPDX-License-Identifier: MIT */
/* The residual side of the trunk (spec §3, §3.1): embedding into the four streams, the fused mHC
 * pre-mapping (unweighted RMS over all streams, the 24-wide projection, sigmoid/clamp/exp/Sinkhorn,
 * collapse, the sublayer RMSNorm) in one kernel per token, the post-mapping, and the head norm.
 * Everything here is fp32 (spec §5 "Numerics": streams exceed fp16 range). */
#include "common.cuh"

/* k_hc_gate is one block per token and latency-bound: 1024 threads keep more loads in flight
 * (256 threads: 55 µs per call at full width, ncu, H200) */
#define HC_THREADS 1024

__global__ void k_embed(const uint8_t *embd, uint32_t type, uint64_t row_bytes, const int32_t *ids,
                        uint32_t H, uint32_t n_hc, float *X) {
        uint32_t t = blockIdx.y;
        uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
        if (c >= H / CU_CHUNK)
                return;
        float v[CU_CHUNK];
        cu_dequant32_any(type, embd + (uint64_t) ids[t] * row_bytes, c, v);
        for (uint32_t s = 0; s < n_hc; s++) {
                float *o = X + ((uint64_t) t * n_hc + s) * H + CU_CHUNK * c;
#pragma unroll
                for (int i = 0; i < CU_CHUNK; i++)
                        o[i] = v[i];
        }
}

extern "C" void cu_embed(const void *embd, uint32_t type, uint64_t row_bytes, const int32_t *ids,
                         uint32_t T, uint32_t H, uint32_t n_hc, float *X, cudaStream_t s) {
        if (T == 0)
                return;
        uint32_t chunks = H / CU_CHUNK;
        dim3 grid((chunks + 127) / 128, T);
        cu_launches++;
        k_embed<<<grid, 128, 0, s>>>((const uint8_t *) embd, type, row_bytes, ids, H, n_hc, X);
}

/* spec §3.1 post-mapping of element i of token t: X[d][i] = post[d]·o + Σ_s C[d][s]·X[s][i]. */
static __device__ __forceinline__ void hc_post_elem(float *X, const float *hp, const struct cu_post &p,
                                                    uint32_t t, uint32_t i, uint32_t H,
                                                    uint32_t n_hc) {
        const float *post = hp + n_hc, *C = hp + 2 * n_hc;
        float o;
        if (p.w) {
                o = 0.0f;
                for (uint32_t k = 0; k < p.n_slots; k++)
                        o += p.w[(uint64_t) t * p.n_slots + k] *
                             p.y[((uint64_t) t * p.n_slots + k) * p.y_slot_stride + i];
        } else {
                o = p.y[(uint64_t) t * p.y_slot_stride + i];
        }
        float *x = X + (uint64_t) t * n_hc * H + i;
        float old[CU_HC_MAX];
        for (uint32_t s = 0; s < n_hc; s++)
                old[s] = x[(uint64_t) s * H];
        for (uint32_t d = 0; d < n_hc; d++) {
                float v = post[d] * o;
                for (uint32_t s = 0; s < n_hc; s++)
                        v += C[d * n_hc + s] * old[s];
                x[(uint64_t) d * H] = v;
        }
}

/* The gates of spec §3.1 steps 2-9 for one token per block, from the raw projection
 * hw = Wfn · z (cu_matvec): w = hw / rms(z) (unweighted RMS over all n_hc·H values), then
 * sigmoid/clamp/exp/Sinkhorn, the collapse u = Σ pre[s]·X[s] and a = RMSNorm(u, norm_w).
 * Dynamic shared memory: H floats (u). */
__global__ void __launch_bounds__(HC_THREADS) k_hc_gate(struct cu_hc a, const float *X,
                                                        float *hcp, float *out) {
        extern __shared__ float u[];
        __shared__ float red[32];
        __shared__ float g[CU_HCP_STRIDE];
        uint32_t t = blockIdx.x, H = a.H, n_hc = a.n_hc, W = n_hc * H;
        const float *z = X + (uint64_t) t * W;

        /* step 2: unweighted RMS over all n_hc·H values */
        float ss = 0.0f;
#pragma unroll 4
        for (uint32_t i = threadIdx.x; i < W; i += blockDim.x)
                ss += z[i] * z[i];
        ss = cu_block_sum(ss, red);
        float rinv = 1.0f / sqrtf(ss / (float) W + a.rms_eps);

        /* steps 3-9 on the first warp: lane (d, r) holds entry C[d][r] of the n_hc × n_hc
         * matrix (streams beyond n_hc are zero entries, which leave every sum unchanged); each
         * row and column sum reads its four entries by shuffle in index order, so the result is
         * that of one thread summing them in order, and a sweep costs two divisions per lane
         * instead of 32 on one thread */
        if (threadIdx.x < 32) {
                const float *w = a.hw + (uint64_t) t * CU_HCP_STRIDE;
                const uint32_t N = CU_HC_MAX;
                uint32_t lane = threadIdx.x, d = (lane / N) % N, r = lane % N;
                float s0 = a.scale[0], s1 = a.scale[1], s2 = a.scale[2];
                if (lane < n_hc) {
                        g[lane] = 1.0f / (1.0f + expf(-(w[lane] * rinv * s0 + a.base[lane])));
                        g[n_hc + lane] = 2.0f / (1.0f + expf(-(w[n_hc + lane] * rinv * s1 +
                                                               a.base[n_hc + lane])));
                }
                bool valid = d < n_hc && r < n_hc;
                uint32_t i = 2 * n_hc + d * n_hc + r;
                float L = valid ? fminf(fmaxf(w[i] * rinv * s2 + a.base[i], -a.clamp), a.clamp)
                                : -INFINITY;
                float m = -INFINITY;
#pragma unroll
                for (uint32_t rr = 0; rr < N; rr++)
                        m = fmaxf(m, __shfl_sync(CU_FULL_MASK, L, d * N + rr));
                float C = valid ? expf(L - m) : 0.0f;
                for (uint32_t it = 0; it < a.iters; it++) {
                        float sum = 0.0f; /* normalize over src */
#pragma unroll
                        for (uint32_t rr = 0; rr < N; rr++)
                                sum += __shfl_sync(CU_FULL_MASK, C, d * N + rr);
                        sum += a.hc_eps;
                        C /= sum;
                        sum = 0.0f; /* normalize over dst */
#pragma unroll
                        for (uint32_t dd = 0; dd < N; dd++)
                                sum += __shfl_sync(CU_FULL_MASK, C, dd * N + r);
                        sum += a.hc_eps;
                        C /= sum;
                }
                if (valid && lane < N * N)
                        g[i] = C;
                __syncwarp();
                for (uint32_t k = lane; k < 2 * n_hc + n_hc * n_hc; k += 32)
                        hcp[(uint64_t) t * CU_HCP_STRIDE + k] = g[k];
        }
        __syncthreads();

        /* collapse u = Σ_s pre[s]·X[s], then the sublayer RMSNorm */
        float ss2 = 0.0f;
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
                float v = 0.0f;
                for (uint32_t s = 0; s < n_hc; s++)
                        v += g[s] * z[(uint64_t) s * H + i];
                u[i] = v;
                ss2 += v * v;
        }
        ss2 = cu_block_sum(ss2, red);
        float rinv2 = 1.0f / sqrtf(ss2 / (float) H + a.rms_eps);
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x)
                out[(uint64_t) t * H + i] = a.norm_w[i] * (u[i] * rinv2);
}

__global__ void k_hc_post(float *X, const float *hcp, struct cu_post post, uint32_t H,
                          uint32_t n_hc);

extern "C" void cu_hc_pre(const struct cu_hc *a, const struct cu_post *post, float *X, uint32_t T,
                          float *hcp, float *out, cudaStream_t s) {
        if (T == 0)
                return;
        if (post && post->y) {
                dim3 grid((a->H + 255) / 256, T);
                cu_launches++;
                k_hc_post<<<grid, 256, 0, s>>>(X, hcp, *post, a->H, a->n_hc);
        }
        uint32_t W = a->n_hc * a->H, n_rows = a->n_hc * (2 + a->n_hc);
        struct cu_mv mv = {
                .w = a->fn, .type = a->fn_type, .row_bytes = a->fn_row_bytes, .K = W, .N = n_rows,
                .G = n_rows, .x = X, .x_pstride = W, .x_div = 1, .y = a->hw,
                .y_pstride = CU_HCP_STRIDE, .P = T, .few_rows = true,
        };
        cu_matvec(&mv, s);
        cu_launches++;
        k_hc_gate<<<T, HC_THREADS, a->H * sizeof(float), s>>>(*a, X, hcp, out);
}

__global__ void k_hc_post(float *X, const float *hcp, struct cu_post post, uint32_t H,
                          uint32_t n_hc) {
        uint32_t t = blockIdx.y;
        uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= H)
                return;
        hc_post_elem(X, hcp + (uint64_t) t * CU_HCP_STRIDE, post, t, i, H, n_hc);
}

extern "C" void cu_hc_post(float *X, const float *hcp, const struct cu_post *post, uint32_t T,
                           uint32_t H, uint32_t n_hc, cudaStream_t s) {
        if (T == 0)
                return;
        dim3 grid((H + 255) / 256, T);
        cu_launches++;
        k_hc_post<<<grid, 256, 0, s>>>(X, hcp, *post, H, n_hc);
}

__global__ void k_head_norm(const float *X, const int32_t *rows, uint32_t H, uint32_t n_hc,
                            const float *norm_w, float eps, float *out) {
        extern __shared__ float h[];
        __shared__ float red[32];
        uint32_t r = blockIdx.x;
        const float *x = X + (uint64_t) rows[r] * n_hc * H;
        float ss = 0.0f;
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
                float v = 0.0f;
                for (uint32_t s = 0; s < n_hc; s++)
                        v += x[(uint64_t) s * H + i];
                v /= (float) n_hc; /* spec §3 step 3: mean, not sum */
                h[i] = v;
                ss += v * v;
        }
        ss = cu_block_sum(ss, red);
        float rinv = 1.0f / sqrtf(ss / (float) H + eps);
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x)
                out[(uint64_t) r * H + i] = norm_w[i] * (h[i] * rinv);
}

extern "C" void cu_head_norm(const float *X, const int32_t *rows, uint32_t R, uint32_t H,
                             uint32_t n_hc, const float *norm_w, float eps, float *out,
                             cudaStream_t s) {
        if (R == 0)
                return;
        cu_launches++;
        k_head_norm<<<R, 256, H * sizeof(float), s>>>(X, rows, H, n_hc, norm_w, eps, out);
}
