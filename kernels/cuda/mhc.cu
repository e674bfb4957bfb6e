/* SPDX-License-Identifier: MIT */
/* The residual side of the trunk (spec §3, §3.1): embedding into the four streams, the fused mHC
 * pre-mapping (unweighted RMS over all streams, the 24-wide projection, sigmoid/clamp/exp/Sinkhorn,
 * collapse, the sublayer RMSNorm) in one kernel per token, the post-mapping, and the head norm.
 * Everything here is fp32 (spec §5 "Numerics": streams exceed fp16 range). */
#include "common.cuh"

#define HC_THREADS 256

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

/* One block per token. Dynamic shared memory: H floats (u). */
__global__ void __launch_bounds__(HC_THREADS) k_hc_pre(struct cu_hc a, struct cu_post post,
                                                       float *X, float *hcp, float *out) {
        extern __shared__ float u[];
        __shared__ float red[32];
        __shared__ float w[CU_HCP_STRIDE];
        __shared__ float g[CU_HCP_STRIDE];
        uint32_t t = blockIdx.x, H = a.H, n_hc = a.n_hc, W = n_hc * H;
        const float *z = X + (uint64_t) t * W;
        uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;

        /* the previous sublayer's post-mapping, with the gates its pre-mapping left in hcp */
        if (post.y) {
                if (threadIdx.x < CU_HCP_STRIDE)
                        g[threadIdx.x] = hcp[(uint64_t) t * CU_HCP_STRIDE + threadIdx.x];
                __syncthreads();
                for (uint32_t i = threadIdx.x; i < H; i += blockDim.x)
                        hc_post_elem(X, g, post, t, i, H, n_hc);
                __syncthreads();
        }

        /* step 2: unweighted RMS over all n_hc·H values */
        float ss = 0.0f;
        for (uint32_t i = threadIdx.x; i < W; i += blockDim.x)
                ss += z[i] * z[i];
        ss = cu_block_sum(ss, red);
        float rinv = 1.0f / sqrtf(ss / (float) W + a.rms_eps);

        /* step 3: w = Wfn · ẑ, one warp per row */
        uint32_t n_rows = n_hc * (2 + n_hc);
        for (uint32_t r = warp; r < n_rows; r += nw) {
                const uint8_t *row = (const uint8_t *) a.fn + (uint64_t) r * a.fn_row_bytes;
                float acc = 0.0f;
                for (uint32_t c = lane; c < W / CU_CHUNK; c += 32) {
                        float v[CU_CHUNK];
                        cu_dequant32_any(a.fn_type, row, c, v);
                        float s = 0.0f;
#pragma unroll
                        for (int i = 0; i < CU_CHUNK; i++)
                                s += v[i] * (z[CU_CHUNK * c + i] * rinv);
                        acc += s;
                }
                acc = cu_warp_sum(acc);
                if (lane == 0)
                        w[r] = acc;
        }
        __syncthreads();

        /* steps 4-9 on one thread: 4+4+16 gates and 20 Sinkhorn sweeps over 4×4 */
        if (threadIdx.x == 0) {
                float *pre = g, *post = g + n_hc, *C = g + 2 * n_hc;
                for (uint32_t s = 0; s < n_hc; s++) {
                        pre[s] = 1.0f / (1.0f + expf(-(w[s] * a.scale[0] + a.base[s])));
                        post[s] = 2.0f / (1.0f + expf(-(w[n_hc + s] * a.scale[1] + a.base[n_hc + s])));
                }
                for (uint32_t d = 0; d < n_hc; d++) {
                        float L[CU_HC_MAX], m = -INFINITY;
                        for (uint32_t r = 0; r < n_hc; r++) {
                                uint32_t i = 2 * n_hc + d * n_hc + r;
                                L[r] = fminf(fmaxf(w[i] * a.scale[2] + a.base[i], -a.clamp), a.clamp);
                                m = fmaxf(m, L[r]);
                        }
                        for (uint32_t r = 0; r < n_hc; r++)
                                C[d * n_hc + r] = expf(L[r] - m);
                }
                for (uint32_t it = 0; it < a.iters; it++) {
                        for (uint32_t d = 0; d < n_hc; d++) { /* normalize over src */
                                float sum = 0.0f;
                                for (uint32_t r = 0; r < n_hc; r++)
                                        sum += C[d * n_hc + r];
                                sum += a.hc_eps;
                                for (uint32_t r = 0; r < n_hc; r++)
                                        C[d * n_hc + r] /= sum;
                        }
                        for (uint32_t r = 0; r < n_hc; r++) { /* normalize over dst */
                                float sum = 0.0f;
                                for (uint32_t d = 0; d < n_hc; d++)
                                        sum += C[d * n_hc + r];
                                sum += a.hc_eps;
                                for (uint32_t d = 0; d < n_hc; d++)
                                        C[d * n_hc + r] /= sum;
                        }
                }
                for (uint32_t i = 0; i < 2 * n_hc + n_hc * n_hc; i++)
                        hcp[(uint64_t) t * CU_HCP_STRIDE + i] = g[i];
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

extern "C" void cu_hc_pre(const struct cu_hc *a, const struct cu_post *post, float *X, uint32_t T,
                          float *hcp, float *out, cudaStream_t s) {
        if (T == 0)
                return;
        struct cu_post none = {};
        k_hc_pre<<<T, HC_THREADS, a->H * sizeof(float), s>>>(*a, post ? *post : none, X, hcp, out);
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
        k_head_norm<<<R, 256, H * sizeof(float), s>>>(X, rows, H, n_hc, norm_w, eps, out);
}
