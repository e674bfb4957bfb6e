/* SPDX-License-Identifier: MIT */
/* Quant formats on the CPU (docs/model.md §6): scalar conversions, row dequantization, and the products
 * the backend is built on: a panel of stored rows is dequantized once to fp32 (exactly: each
 * weight is d·q or the exact conversion) and then multiplied with every input of a batch.
 *
 * Summation order (the determinism contract): an output w · x over n values has 16 lanes; lane
 * l sums w[i]·x[i] for i ≡ l (mod 16) in index order (a multiply then an add, never fused), and
 * the lanes are combined by a fixed tree (lane l + lane l+8, then +4, then (0+2)+(1+3)). The
 * order depends only on n: never on threads, the batch, the tiling, or which ISA variant
 * (portable, AVX2, AVX-512; picked at run time) computes it, so all give the same bits. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QK4_NL 32
#define QK8_0 32
#define QK_K 256

struct block_iq4_nl {
        uint16_t d; /* fp16 */
        uint8_t qs[QK4_NL / 2];
};
_Static_assert(sizeof(struct block_iq4_nl) == 18, "block_iq4_nl is 18 bytes");

struct block_q8_0 {
        uint16_t d; /* fp16 */
        int8_t qs[QK8_0];
};
_Static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 is 34 bytes");

struct block_q6_k {
        uint8_t ql[QK_K / 2];
        uint8_t qh[QK_K / 4];
        int8_t scales[QK_K / 16];
        uint16_t d; /* fp16 */
};
_Static_assert(sizeof(struct block_q6_k) == 210, "block_q6_k is 210 bytes");

/* docs/model.md §6: the 16-entry non-linear codebook of IQ4_NL */
extern const int8_t quant_iq4nl_values[16];

float quant_fp16_to_f32(uint16_t h);
uint16_t quant_f32_to_fp16(float f); /* round to nearest even */
float quant_bf16_to_f32(uint16_t b);
uint16_t quant_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

/* Dequantize n values (a whole number of blocks) of `type` starting at row. 0 or -EINVAL for an
 * unsupported type / ragged n. */
int quant_dequantize_row(uint32_t type, const void *row, float *out, size_t n);

/* Rows [0, R) of a stored matrix (row_bytes apart, k values each, k a whole number of blocks)
 * into out[R][k], exactly as quant_dequantize_row; the type is checked at load (asserted). */
void quant_dequantize_rows(uint32_t type, const void *w, size_t row_bytes, size_t R, size_t k,
                           float *out);

/* y[t·y_stride + r] = w[r] · x[t] (w dense fp32 rows of k values, x_stride floats between
 * inputs) for r < R, t < T, each in the order above. */
void quant_gemm_f32(const float *w, size_t R, size_t k, const float *x, size_t x_stride, size_t T,
                    float *y, size_t y_stride);

/* out[h·out_stride + j] += Σ_r P[h·p_stride + r] · rows[r·row_stride + j] for h < H, j < k, each element
 * accumulated r ascending (multiply, then add): attention's ô = Σ_p P[p]·c(p) for H heads. */
void quant_weighted_rows(const float *rows, size_t row_stride, size_t n_rows, size_t k,
                         const float *P, size_t p_stride, size_t H, float *out, size_t out_stride);

/* y[r] = row r · x for r < R rows of a stored matrix (row_bytes apart, k values), decoded in
 * registers (no panel): the same bits as quant_dequantize_rows + quant_gemm_f32. For a single
 * input (decode). false (nothing written) where the CPU variant has no fused kernel for the type;
 * the caller then takes the panel path. */
bool quant_gemv(uint32_t type, const void *w, size_t row_bytes, size_t R, size_t k,
                const float *x, float *y);

/* s[i] = exp(scale·s[i] − m) / Σ_j exp(scale·s[j] − m), m the max, for n >= 1 values: a
 * polynomial exp (within ~2 ulp of expf, the same bits in every variant) and the sum in the
 * 16-lane order above. */
void quant_softmax(float *s, size_t n, float scale);

/* w · x over n fp32 values, in the order above. */
float quant_dot_f32(const float *w, const float *x, size_t n);

/* row · x over n values of a stored row (the caller guarantees type support and n % block == 0,
 * checked at load; asserts otherwise). Same bits as dequantizing the row and quant_dot_f32. */
float quant_dot_row(uint32_t type, const void *row, const float *x, size_t n);

/* Tests and benchmarks: 0 forces the portable kernels, 1 at most AVX2, 2 the best the CPU has.
 * Returns the name of the variant now in use ("portable", "avx2", "avx512"). Not for use while
 * other threads compute. */
const char *quant_set_simd(int level);
