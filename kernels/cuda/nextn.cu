/* SPDX-License-Identifier: MIT */
/* docs/model.md §8: what the NextN (MTP) block needs beyond the trunk's kernels. The block is a
 * plain DeepSeek layer without hyper-connections, so its residual is one fp32 row per token and
 * its norms are plain row RMSNorms: enorm/hnorm (written into the two halves of eh_proj's input),
 * attn_norm and ffn_norm before the sublayers, and the sublayer outputs added back. Its MLA, MoE
 * and head products are the trunk's kernels (forward.c). Everything here is fp32 and every sum
 * has a fixed order that depends on H alone (batch invariance, as in mhc.cu). */
#include "common.cuh"

#define NN_THREADS 256

__global__ void __launch_bounds__(NN_THREADS)
        k_rmsnorm(const float *x, uint64_t x_stride, const int32_t *rows, uint32_t H,
                  const float *w, float eps, float *out, uint64_t out_stride) {
        __shared__ float red[32];
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t r = blockIdx.x;
        const float *xr = x + (uint64_t) (rows ? (uint32_t) rows[r] : r) * x_stride;
        float *o = out + (uint64_t) r * out_stride;
        float ss = 0.0f;
        for (uint32_t i = threadIdx.x; i < H; i += NN_THREADS) {
                float v = xr[i];
                ss += v * v;
        }
        ss = cu_block_sum(ss, red);
        float rinv = 1.0f / sqrtf(ss / (float) H + eps);
        for (uint32_t i = threadIdx.x; i < H; i += NN_THREADS)
                o[i] = w[i] * (xr[i] * rinv);
}

extern "C" void cu_rmsnorm(const float *x, uint64_t x_stride, const int32_t *rows, uint32_t R,
                           uint32_t H, const float *w, float eps, float *out, uint64_t out_stride,
                           cudaStream_t s) {
        if (R == 0)
                return;
        cu_launches++;
        cu_launch(k_rmsnorm, R, NN_THREADS, 0, s, x, x_stride, rows, H, w, eps, out, out_stride);
}

/* X[t][i] += o[t][i], o as hc_post_elem (mhc.cu) forms it: Σ_k w[k]·y[k] in slot order. */
__global__ void k_residual(float *X, struct cu_post p, uint32_t H) {
        cu_pdl_wait();
        cu_pdl_trigger();
        uint32_t t = blockIdx.y;
        uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= H)
                return;
        float o;
        if (p.w) {
                o = 0.0f;
                for (uint32_t k = 0; k < p.n_slots; k++)
                        o += p.w[(uint64_t) t * p.n_slots + k] *
                             p.y[((uint64_t) t * p.n_slots + k) * p.y_slot_stride + i];
        } else {
                o = p.y[(uint64_t) t * p.y_slot_stride + i];
        }
        X[(uint64_t) t * H + i] += o;
}

extern "C" void cu_residual(float *X, const struct cu_post *post, uint32_t T, uint32_t H,
                            cudaStream_t s) {
        if (T == 0)
                return;
        dim3 grid((H + NN_THREADS - 1) / NN_THREADS, T);
        cu_launches++;
        cu_launch(k_residual, grid, NN_THREADS, 0, s, X, *post, H);
}
