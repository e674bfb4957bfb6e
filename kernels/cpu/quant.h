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

/* ---- The fast CPU numerics (x4_backend_params.cpu_math = X4_CPU_MATH_FAST, `--cpu-math fast`)
 * BF16 weights times activations rounded to bf16 (round to nearest even), on the CPU's BF16 dot
 * instruction (AVX512_BF16's vdpbf16ps: two bf16 products a lane, added to an fp32 lane with round
 * to nearest even, denormals flushed). An output over k values has 16 lanes; lane l sums the pairs
 * (32c + 2l, 32c + 2l + 1) for c ascending, the tail of k % 32 values in zero-filled pairs, and the
 * lanes meet in the tree of the reference order. So the order depends only on k: never on threads,
 * the batch or the tiling. Only where the instruction exists (quant_bf16_dot_available()): other
 * CPUs keep the fp32 reference for every product. */
bool quant_bf16_dot_available(void);

/* xb[i] = x[i] rounded to bf16 (round to nearest even; quant_f32_to_bf16) for i < n. */
void quant_round_bf16(const float *x, size_t n, uint16_t *xb);

/* y[t·y_stride + r] = w[r] · xb[t] for r < R rows of a BF16 matrix (row_bytes apart, k values) and
 * t < T bf16 inputs (xb_stride values apart), in the order above. Only when
 * quant_bf16_dot_available(). */
void quant_gemm_bf16(const void *w, size_t row_bytes, size_t R, size_t k, const uint16_t *xb,
                     size_t xb_stride, size_t T, float *y, size_t y_stride);

/* The fast numerics' integer products: weights of every quantized format the CPU reads (IQ4_NL,
 * Q8_0, Q6_K; a user's Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, IQ4_XS) times activations rounded to q8
 * blocks. A row of k inputs (k % 32 == 0) becomes quant_q8_row_bytes(k) bytes: k int8
 * values, then k/32 fp32 scales, then k/16 int32 sums (Σq of each 16-value run, which the
 * integer products use to undo the offsets of unsigned weights), padded to 64 bytes. Block b's
 * scale is dx_b = max|x| / 127 and q_i = x_i · (127 / max|x|) rounded to nearest even, in [-127,
 * 127]. A block whose max|x| is below 2^-96 (zeros included) has dx 0 and q 0; one holding a NaN
 * or an infinity has dx NaN and q 0, so the NaN reaches every output it takes part in.
 *
 * An output w · x is one fp32 chain over the 32-value blocks: block b's integer sum is
 * L_b = Σ_i w_i·q_i (w the block's integer weights: the IQ4_NL codebook entries, the Q8_0
 * values, Q4_0's q − 8, Q5_0's q − 16; exact in int32), for Q6_K L_b = sc_0·Σ_{i<16} w_i·q_i +
 * sc_1·Σ_{i>=16} w_i·q_i (w the six-bit values less 32, sc the two 16-value runs' scales; exact),
 * for IQ4_XS L_b = (ls_b − 32)·Σ_i w_i·q_i (w the codebook entries, ls_b the block's six-bit scale;
 * exact), and acc = fma((float) L_b, d_b·dx_b, acc) for b ascending from acc = +0 (d_b the block's fp16
 * scale, a K super-block's d; d_b·dx_b rounded once, the fma rounded once). Q4_K and Q5_K (weight
 * d·sc·u − dmin·m, u the unsigned four- or five-bit number, sc and m the block's six-bit scale
 * and min): L_b = sc·Σ_i u_i·q_i and M_b = m·Σ_i q_i (the block's two run sums), both exact, and
 * per block acc = fma((float) L_b, d·dx_b, acc), then acc = fma(−(float) M_b, dmin·dx_b, acc).
 * Q4_1 and Q5_1 (weight d·u + m): L_b = Σ_i u_i·q_i, then acc = fma((float) L_b, d·dx_b, acc) and
 * acc = fma((float) Σ_i q_i, m·dx_b, acc).
 * The order depends only on k: every variant gives the same bits, for any thread count, batch or
 * tiling (a NaN is a NaN in every variant; its payload, where both scales are NaN, may differ).
 *
 * The weights are multiplied in a packed copy (quant_q8_pack): 16 rows interleaved so that one
 * 64-byte register holds 4 consecutive weights of each of 16 rows, and one integer dot
 * instruction serves 16 outputs. The copy has the stored matrix's size, the last group padded
 * to 16 rows (quant_q8_packed_bytes). */
bool quant_q8_supported(uint32_t type);
/* the values a row's length must be a multiple of for the type's integer products (32, or 256
 * for the K formats) */
size_t quant_q8_block_values(uint32_t type);
size_t quant_q8_row_bytes(size_t k);
void quant_q8_quantize(const float *x, size_t k, void *row);
/* Whether the integer products have a SIMD kernel here (AVX-512 with VNNI, 16 rows a
 * register; else AVX2 with FMA, 8): the fast numerics use them only then (the portable code is
 * the definition, and for tests). */
bool quant_q8_dot_available(void);
/* The bytes of the packed copy of R rows of k values: R rounded up to 16, times the row size. */
size_t quant_q8_packed_bytes(uint32_t type, size_t R, size_t k);
/* R rows of a stored matrix of a quant_q8_supported type (k values each, k a whole number of
 * blocks; row_bytes apart, which must be the type's row size for k: rows as a GGUF stores them)
 * into `packed`, quant_q8_packed_bytes(type, R, k) bytes (any alignment; 64 is best). */
void quant_q8_pack(uint32_t type, const void *w, size_t row_bytes, size_t R, size_t k,
                   void *packed);
/* y[t·y_stride + r − r0] = w[r] · xq[t] for rows r0 <= r < r1 of a packed matrix of R rows and
 * t < T q8 rows (xq_stride bytes apart). */
void quant_gemm_q8(uint32_t type, const void *packed, size_t R, size_t k, size_t r0, size_t r1,
                   const void *xq, size_t xq_stride, size_t T, float *y, size_t y_stride);

/* Tests and benchmarks: 0 forces the portable kernels, 1 at most AVX2, 2 the best the CPU has.
 * Returns the name of the variant now in use ("portable", "avx2", "avx512"). Not for use while
 * other threads compute. */
const char *quant_set_simd(int level);
