/* SPDX-License-Identifier: MIT */
/* Quant formats on the CPU (spec §6): scalar conversions, row dequantization and dot products of
 * a stored row with an fp32 vector, for F32, F16, BF16, Q8_0, Q6_K and IQ4_NL.
 *
 * The dot products accumulate in a fixed order that depends only on the row length (never on
 * threads or batch), so a token's result is the same however the work is split. That order is
 * documented at the top of quant.c: 8 lanes (index mod 8), per-block lane sums scaled by the block's
 * scale, a fixed reduction tree. The AVX2 variant (chosen at run time on x86-64) performs the same
 * operations in the same order (no FMA), so its results are bit-identical to the portable code. */
#pragma once

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

/* spec §6: the 16-entry non-linear codebook of IQ4_NL */
extern const int8_t quant_iq4nl_values[16];

float quant_fp16_to_f32(uint16_t h);
uint16_t quant_f32_to_fp16(float f); /* round to nearest even */
float quant_bf16_to_f32(uint16_t b);
uint16_t quant_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

/* Dequantize n values (a whole number of blocks) of `type` starting at row. 0 or -EINVAL for an
 * unsupported type / ragged n. */
int quant_dequantize_row(uint32_t type, const void *row, float *out, size_t n);

/* sum_i row[i] * x[i] over n values. The caller guarantees type support and n % block == 0
 * (checked at load); asserts otherwise. */
float quant_dot_row(uint32_t type, const void *row, const float *x, size_t n);

/* Tests and benchmarks: 0 forces the portable kernels, 1 the best the CPU has. Returns 1 if a SIMD
 * variant (AVX2) is now in use, else 0. Not for use while other threads compute dots. */
int quant_set_simd(int enable);
