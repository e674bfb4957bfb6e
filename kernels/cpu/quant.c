/* SPDX-License-Identifier: MIT */
/* Quant formats on the CPU (docs/model.md §6): conversions, row dequantization, and the vector kernels of
 * the backend (the panel product, the fused decode product, attention's weighted row sums and
 * softmax). The summation order every kernel keeps is the one documented in quant.h: 16 lanes
 * (index mod 16), multiply then add, a fixed tree; the weights are the exact dequantized values.
 * So a result depends only on the length of its reduction: not on threads, batch, tiling, or the
 * ISA variant (test-quant and test-cpu-invariance compare all three bit for bit). */
#include "quant.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "gguf/ggml.h"
#include "common/log.h"

const int8_t quant_iq4nl_values[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113 };

static inline float f32_from_bits(uint32_t u) {
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
}

static inline uint32_t f32_bits(float f) {
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        return u;
}

/* IEEE binary16 -> binary32, exact for every input, branch-free (scales arrive in random order;
 * a branchy version cost 3x on IQ4_NL dots through mispredictions). The half's exponent and
 * mantissa bits shifted into f32 position read as a float 2^-112 times the half's value, for
 * normals and subnormals alike (f32 bias 127 - half bias 15 = 112); one exact multiply by 2^112
 * fixes it. Exponent 31 (inf/NaN) is mapped to f32's 255 with the payload kept. */
static inline float fp16_to_f32(uint16_t h) {
        uint32_t sign = (uint32_t) (h & 0x8000) << 16;
        uint32_t em = (uint32_t) (h & 0x7fff) << 13;
        uint32_t bits = (h & 0x7c00) == 0x7c00 ? 0x7f800000 | em : f32_bits(f32_from_bits(em) * 0x1p112f);
        return f32_from_bits(bits | sign);
}

float quant_fp16_to_f32(uint16_t h) {
        return fp16_to_f32(h);
}

uint16_t quant_f32_to_fp16(float f) {
        uint32_t x = f32_bits(f);
        uint16_t sign = (uint16_t) ((x >> 16) & 0x8000);
        uint32_t ax = x & 0x7fffffff;

        if (ax > 0x7f800000) /* NaN: quiet, keep the top payload bits */
                return sign | 0x7e00 | ((ax >> 13) & 0x3ff);
        if (ax >= 0x477ff000) /* >= 65520 = halfway between 65504 (max) and 2^16: rounds to inf */
                return sign | 0x7c00;
        if (ax < 0x38800000) { /* below 2^-14: a subnormal half (units of 2^-24) or zero */
                if (ax <= 0x33000000) /* <= 2^-25: ties to even give 0 */
                        return sign;
                uint32_t e = ax >> 23, mant = (ax & 0x7fffff) | 0x800000;
                uint32_t shift = 126 - e; /* value / 2^-24 = mant · 2^(e-126) */
                uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1),
                         half = 1u << (shift - 1);
                if (rem > half || (rem == half && (q & 1)))
                        q++;
                return sign | (uint16_t) q; /* q == 0x400 is the smallest normal, encoded right */
        }
        /* normal: rebias the exponent (127 -> 15), keep 10 mantissa bits, round on the low 13;
         * a carry out of the mantissa correctly bumps the exponent */
        uint32_t h = (ax - (112u << 23)) >> 13, rem = ax & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
                h++;
        return sign | (uint16_t) h;
}

static inline float bf16_to_f32(uint16_t b) {
        return f32_from_bits((uint32_t) b << 16);
}

float quant_bf16_to_f32(uint16_t b) {
        return bf16_to_f32(b);
}

uint16_t quant_f32_to_bf16(float f) {
        uint32_t x = f32_bits(f);

        if ((x & 0x7fffffff) > 0x7f800000) /* NaN: truncating could make it inf; set quiet bit */
                return (uint16_t) ((x >> 16) | 0x40);
        x += 0x7fff + ((x >> 16) & 1); /* round to nearest even; overflow correctly gives inf */
        return (uint16_t) (x >> 16);
}

/* ---- dequantization (docs/model.md §6) ---- */

static void dequant_iq4nl_block(const struct block_iq4_nl *b, float *y) {
        float d = fp16_to_f32(b->d);
        for (int j = 0; j < QK4_NL / 2; j++) {
                y[j] = d * (float) quant_iq4nl_values[b->qs[j] & 0xf];
                y[j + QK4_NL / 2] = d * (float) quant_iq4nl_values[b->qs[j] >> 4];
        }
}

static void dequant_q8_0_block(const struct block_q8_0 *b, float *y) {
        float d = fp16_to_f32(b->d);
        for (int j = 0; j < QK8_0; j++)
                y[j] = d * (float) b->qs[j];
}

/* The 256 quants of a Q6_K block as signed integers -32..31, in output order. */
static inline void q6k_unpack(const struct block_q6_k *b, int8_t q[QK_K]) {
        const uint8_t *ql = b->ql, *qh = b->qh;
        for (int n = 0; n < 2; n++) {
                int8_t *y = q + 128 * n;
                for (int l = 0; l < 32; l++) {
                        y[l] = (int8_t) ((int) ((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4) - 32);
                        y[l + 32] = (int8_t) ((int) ((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32);
                        y[l + 64] = (int8_t) ((int) ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
                        y[l + 96] = (int8_t) ((int) ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
                }
                ql += 64;
                qh += 32;
        }
}

/* Scale of output index i (0..255) of a block: half n = i/128, within it l = i%32 gives is = l/16
 * and the quarter i%128/32 adds 2 each (spec: sc[is], sc[is+2], sc[is+4], sc[is+6]; sc += 8 per
 * half). So the 16-value run starting at 16·s uses scales[8·(s/8) + (s%2) + 2·((s%8)/2)]. */
static inline int q6k_scale_index(int s) {
        return 8 * (s / 8) + (s % 2) + 2 * ((s % 8) / 2);
}

static void dequant_q6k_block(const struct block_q6_k *b, float *y) {
        int8_t q[QK_K];
        float d = fp16_to_f32(b->d);

        q6k_unpack(b, q);
        for (int s = 0; s < QK_K / 16; s++) {
                float ds = d * (float) b->scales[q6k_scale_index(s)];
                for (int j = 0; j < 16; j++)
                        y[16 * s + j] = ds * (float) q[16 * s + j];
        }
}

/* The other llama.cpp quant formats a community quantization of the model may use (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, IQ4_XS; docs/model.md §6): dequantized by ggml's formulas, each value
 * one float expression of exact parts (a product d·q of an fp16 and a small integer is exact,
 * and a subtraction or addition of an offset rounds once), so there is one right answer. They
 * take the fp32 products (the fast numerics' integer kernels do not cover them). */
static inline uint16_t load_u16(const uint8_t *p) {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes */
static inline void k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
        if (j < 4) {
                *sc = q[j] & 63;
                *m = q[j + 4] & 63;
        } else {
                *sc = (uint8_t) ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
                *m = (uint8_t) ((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
        }
}

/* One block of `type` at b into y (block_size values); false for a type not handled here. */
static inline __attribute__((always_inline)) bool dequant_other_block(uint32_t type, const uint8_t *b,
                                                                     float *y) {
        switch (type) {
        case GGML_TYPE_Q4_0: { /* d, qs[16]: (q - 8)·d */
                float d = fp16_to_f32(load_u16(b));
                for (int j = 0; j < 16; j++) {
                        y[j] = (float) ((b[2 + j] & 0xf) - 8) * d;
                        y[j + 16] = (float) ((b[2 + j] >> 4) - 8) * d;
                }
                return true;
        }
        case GGML_TYPE_Q4_1: { /* d, m, qs[16]: q·d + m */
                float d = fp16_to_f32(load_u16(b)), m = fp16_to_f32(load_u16(b + 2));
                for (int j = 0; j < 16; j++) {
                        float v0 = (float) (b[4 + j] & 0xf) * d, v1 = (float) (b[4 + j] >> 4) * d;
                        y[j] = v0 + m;
                        y[j + 16] = v1 + m;
                }
                return true;
        }
        case GGML_TYPE_Q5_0:   /* d, qh[4], qs[16]: (q - 16)·d, q's 5th bit from qh */
        case GGML_TYPE_Q5_1: { /* d, m, qh[4], qs[16]: q·d + m */
                const bool one = type == GGML_TYPE_Q5_1;
                const uint8_t *p = b + (one ? 4 : 2), *qs = p + 4;
                float d = fp16_to_f32(load_u16(b)), m = one ? fp16_to_f32(load_u16(b + 2)) : 0.0f;
                uint32_t qh;
                memcpy(&qh, p, 4);
                for (int j = 0; j < 16; j++) {
                        int x0 = (qs[j] & 0xf) | (int) (((qh >> j) << 4) & 0x10);
                        int x1 = (qs[j] >> 4) | (int) ((qh >> (j + 12)) & 0x10);
                        if (one) {
                                float v0 = (float) x0 * d, v1 = (float) x1 * d;
                                y[j] = v0 + m;
                                y[j + 16] = v1 + m;
                        } else {
                                y[j] = (float) (x0 - 16) * d;
                                y[j + 16] = (float) (x1 - 16) * d;
                        }
                }
                return true;
        }
        case GGML_TYPE_Q4_K:   /* d, dmin, scales[12], qs[128] */
        case GGML_TYPE_Q5_K: { /* d, dmin, scales[12], qh[32], qs[128]: d·sc·q − dmin·m */
                const bool five = type == GGML_TYPE_Q5_K;
                float d = fp16_to_f32(load_u16(b)), dmin = fp16_to_f32(load_u16(b + 2));
                const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + (five ? 48 : 16);
                for (int j = 0, is = 0; j < QK_K; j += 64, is += 2) {
                        uint8_t sc, m;
                        k_scale_min(is, scales, &sc, &m);
                        float d1 = d * (float) sc, m1 = dmin * (float) m;
                        k_scale_min(is + 1, scales, &sc, &m);
                        float d2 = d * (float) sc, m2 = dmin * (float) m;
                        for (int l = 0; l < 32; l++) {
                                int q0 = ql[l] & 0xf, q1 = ql[l] >> 4;
                                if (five) {
                                        q0 += ((qh[l] >> (j / 32)) & 1) ? 16 : 0;
                                        q1 += ((qh[l] >> (j / 32 + 1)) & 1) ? 16 : 0;
                                }
                                float v0 = d1 * (float) q0, v1 = d2 * (float) q1;
                                y[j + l] = v0 - m1;
                                y[j + 32 + l] = v1 - m2;
                        }
                        ql += 32;
                }
                return true;
        }
        case GGML_TYPE_IQ4_XS: { /* d, scales_h, scales_l[4], qs[128]: d·(ls − 32)·book[q], IQ4_NL's book */
                float d = fp16_to_f32(load_u16(b));
                uint16_t sh = load_u16(b + 2);
                const uint8_t *sl = b + 4, *qs = b + 8;
                for (int ib = 0; ib < 8; ib++, qs += 16, y += 32) {
                        int ls = ((sl[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((sh >> 2 * ib) & 3) << 4);
                        float dl = d * (float) (ls - 32);
                        for (int j = 0; j < 16; j++) {
                                y[j] = dl * (float) quant_iq4nl_values[qs[j] & 0xf];
                                y[j + 16] = dl * (float) quant_iq4nl_values[qs[j] >> 4];
                        }
                }
                return true;
        }
        default:
                return false;
        }
}

/* n values (whole blocks) of a row of one of the types above; false for another type */
static inline __attribute__((always_inline)) bool dequant_other_row(uint32_t type, const void *row,
                                                                   float *out, size_t n) {
        const struct ggml_type_info *t = ggml_type_get(type);

        for (size_t i = 0; t && i < n / t->block_size; i++)
                if (!dequant_other_block(type, (const uint8_t *) row + i * t->type_size,
                                         out + i * t->block_size))
                        return false;
        return t != NULL;
}

int quant_dequantize_row(uint32_t type, const void *row, float *out, size_t n) {
        const struct ggml_type_info *t = ggml_type_get(type);

        if (!t || !t->computable)
                return log_error_errno(EINVAL, "quant: type %s cannot be dequantized on the CPU",
                                       ggml_type_name(type));
        if (n % t->block_size != 0)
                return log_error_errno(EINVAL,
                                       "quant: a %s row of %zu values is not a whole number of %u-value blocks",
                                       t->name, n, t->block_size);

        switch (type) {
        case GGML_TYPE_F32:
                memcpy(out, row, n * sizeof(float));
                break;
        case GGML_TYPE_F16: {
                const uint16_t *h = row;
                for (size_t i = 0; i < n; i++)
                        out[i] = fp16_to_f32(h[i]);
                break;
        }
        case GGML_TYPE_BF16: {
                const uint16_t *h = row;
                for (size_t i = 0; i < n; i++)
                        out[i] = bf16_to_f32(h[i]);
                break;
        }
        case GGML_TYPE_Q8_0: {
                const struct block_q8_0 *b = row;
                for (size_t i = 0; i < n / QK8_0; i++)
                        dequant_q8_0_block(&b[i], out + i * QK8_0);
                break;
        }
        case GGML_TYPE_Q6_K: {
                const struct block_q6_k *b = row;
                for (size_t i = 0; i < n / QK_K; i++)
                        dequant_q6k_block(&b[i], out + i * QK_K);
                break;
        }
        case GGML_TYPE_IQ4_NL: {
                const struct block_iq4_nl *b = row;
                for (size_t i = 0; i < n / QK4_NL; i++)
                        dequant_iq4nl_block(&b[i], out + i * QK4_NL);
                break;
        }
        default:
                if (!dequant_other_row(type, row, out, n))
                        return log_error_errno(EINVAL, "quant: type %s has no CPU dequantizer",
                                               ggml_type_name(type));
                break;
        }
        return 0;
}

/* ---- dot products and the panel product ----
 *
 * Every kernel below is written once as an always_inline body and instantiated three times: for
 * the baseline ISA, for AVX2 (+F16C) and for AVX-512F (+AVX2, F16C), one of which is picked at
 * the first call from what the CPU has (an explicit pick rather than target_clones: ifunc
 * resolvers run before sanitizer runtimes start). The arithmetic is lane-wise (GNU vector
 * extension, 16 floats; AVX2 holds one in two registers, the baseline in four; the AVX2 panel
 * product, weighted rows and softmax spell the two halves out, see gemm_tile_avx2) with a separate
 * multiply and add (ISO C11: gcc does not contract a*b+c; the clang pragma below says the same),
 * and the dequantization is exact, so the three variants give the same bits. */

#ifdef __clang__
#pragma clang fp contract(off)
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef float v16f __attribute__((vector_size(64)));

/* the tile loops have constant trip counts <= 4: unrolled, the accumulators live in registers */
#define UNROLL _Pragma("GCC unroll 8")

/* unaligned load (a macro: returning a 64-byte vector from a function changes the ABI on
 * targets without AVX-512) */
#define V16F_LOAD(p)                                                                               \
        ({                                                                                         \
                v16f _v;                                                                           \
                memcpy(&_v, (p), sizeof _v);                                                       \
                _v;                                                                                \
        })

/* The fixed tree over the 16 lanes: halves, quarters, eighths, then the last pair. */
ALWAYS_INLINE float lanes_reduce(const float a[16]) {
        float s8[8], s4[4];
        for (int k = 0; k < 8; k++)
                s8[k] = a[k] + a[k + 8];
        for (int k = 0; k < 4; k++)
                s4[k] = s8[k] + s8[k + 4];
        return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* One output from its 16 lane sums a: plus the n % 16 tail continuing lane = index mod 16. */
ALWAYS_INLINE float lanes_finish_sums(float a[16], const float *w, const float *x, size_t rem) {
        for (size_t j = 0; j < rem; j++)
                a[j] = a[j] + w[j] * x[j];
        return lanes_reduce(a);
}

ALWAYS_INLINE float lanes_finish(const v16f *acc, const float *w, const float *x, size_t rem) {
        float a[16];

        memcpy(a, acc, sizeof a);
        return lanes_finish_sums(a, w, x, rem);
}

/* A register tile: y[t·ys + r] for r < NR rows of w (ws floats apart), t < NT inputs (xs apart).
 * NR and NT are compile-time constants at every call, so acc stays in registers. */
ALWAYS_INLINE void gemm_tile(const int NR, const int NT, const float *w, size_t ws, const float *x,
                             size_t xs, float *y, size_t ys, size_t k) {
        v16f acc[4][4];
        size_t kv = k - k % 16;

        UNROLL for (int r = 0; r < NR; r++)
                UNROLL for (int t = 0; t < NT; t++)
                        acc[r][t] = (v16f) { 0 };
        for (size_t i = 0; i < kv; i += 16) {
                v16f wv[4], xv[4];

                UNROLL for (int r = 0; r < NR; r++)
                        wv[r] = V16F_LOAD(w + r * ws + i);
                UNROLL for (int t = 0; t < NT; t++)
                        xv[t] = V16F_LOAD(x + t * xs + i);
                UNROLL for (int r = 0; r < NR; r++)
                        UNROLL for (int t = 0; t < NT; t++) {
                                v16f p = wv[r] * xv[t];
                                acc[r][t] = acc[r][t] + p;
                        }
        }
        UNROLL for (int r = 0; r < NR; r++)
                UNROLL for (int t = 0; t < NT; t++)
                        y[t * ys + r] = lanes_finish(&acc[r][t], w + r * ws + kv, x + t * xs + kv,
                                                     k - kv);
}

/* y[t·ys + r] = w[r] · x[t] for r < R, t < T: register tiles of TR rows × TT inputs, the rows
 * outer (they stay in L1) and the inputs streaming past. Edges take TR × 1 and 1 × TT tiles.
 * The tiling never changes an output's own order. GEMM_BODY_TILED is the loop for any tile
 * function of gemm_tile's arguments (the AVX2 variant has its own, below). */
#define GEMM_BODY_TILED(TILE, TR, TT, w, R, k, x, xs, T, y, ys)                                    \
        do {                                                                                       \
                for (size_t r_ = 0; r_ < (R); r_ += (TR)) {                                        \
                        size_t nr_ = MIN((size_t) (TR), (R) - r_);                                 \
                        const float *wr_ = (w) + r_ * (k);                                         \
                        float *yr_ = (y) + r_;                                                     \
                                                                                                   \
                        for (size_t t_ = 0; t_ < (T); t_ += (TT)) {                                \
                                size_t nt_ = MIN((size_t) (TT), (T) - t_);                         \
                                const float *xt_ = (x) + t_ * (xs);                                \
                                float *yt_ = yr_ + t_ * (ys);                                      \
                                                                                                   \
                                if (nr_ == (size_t) (TR) && nt_ == (size_t) (TT))                  \
                                        TILE((TR), (TT), wr_, (k), xt_, (xs), yt_, (ys), (k));     \
                                else if (nr_ == (size_t) (TR))                                     \
                                        for (size_t u_ = 0; u_ < nt_; u_++)                        \
                                                TILE((TR), 1, wr_, (k), xt_ + u_ * (xs), (xs),     \
                                                     yt_ + u_ * (ys), (ys), (k));                  \
                                else if (nt_ == (size_t) (TT))                                     \
                                        for (size_t q_ = 0; q_ < nr_; q_++)                        \
                                                TILE(1, (TT), wr_ + q_ * (k), (k), xt_, (xs),      \
                                                     yt_ + q_, (ys), (k));                         \
                                else                                                               \
                                        for (size_t q_ = 0; q_ < nr_; q_++)                        \
                                                for (size_t u_ = 0; u_ < nt_; u_++)                \
                                                        TILE(1, 1, wr_ + q_ * (k), (k),            \
                                                             xt_ + u_ * (xs), (xs),                \
                                                             yt_ + q_ + u_ * (ys), (ys), (k));     \
                        }                                                                          \
                }                                                                                  \
        } while (0)

ALWAYS_INLINE void gemm_body(const int TR, const int TT, const float *w, size_t R, size_t k,
                             const float *x, size_t xs, size_t T, float *y, size_t ys) {
        GEMM_BODY_TILED(gemm_tile, TR, TT, w, R, k, x, xs, T, y, ys);
}

/* ---- softmax ----
 * exp by Cephes' expf method (round x·log2 e to n, reduce by n·ln 2 in two parts, a degree-5
 * polynomial, scale by 2^n through the exponent bits), written with separate multiplies and adds
 * so every variant computes the same bits; within ~2 ulp of expf for the arguments a softmax has
 * (x <= 0; below -87 it returns ~1e-38 instead of a subnormal, nothing next to the max's 1). */
typedef int32_t v16i __attribute__((vector_size(64)));

ALWAYS_INLINE void exp16(v16f *px) { /* in place: a 64-byte vector by value changes the ABI */
        v16f x = *px;
        const v16f lo = (v16f) { 0 } - 87.0f, hi = (v16f) { 0 } + 88.0f;
        const v16f magic = (v16f) { 0 } + 12582912.0f; /* 1.5·2^23: adding it rounds to an integer */
        v16i m;
        v16f fx, n, r, p, y;

        m = x < lo;
        x = (v16f) (((v16i) x & ~m) | ((v16i) lo & m));
        m = x > hi;
        x = (v16f) (((v16i) x & ~m) | ((v16i) hi & m));
        fx = x * 1.44269504088896341f;
        n = fx + magic;
        n = n - magic;
        r = n * 0.693359375f;
        r = x - r;
        p = n * -2.12194440e-4f;
        r = r - p;
        p = r * 1.9875691500e-4f;
        p = p + 1.3981999507e-3f;
        p = p * r;
        p = p + 8.3334519073e-3f;
        p = p * r;
        p = p + 4.1665795894e-2f;
        p = p * r;
        p = p + 1.6666665459e-1f;
        p = p * r;
        p = p + 5.0000001201e-1f;
        y = r * r;
        y = p * y;
        y = y + r;
        y = y + 1.0f;
        *px = y * (v16f) ((__builtin_convertvector(n, v16i) + 127) << 23);
}

/* s[i] = exp(scale·s[i] − max) / Σ, the sum in the 16-lane order of the dots */
ALWAYS_INLINE void softmax_body(float *s, size_t n, float scale) {
        size_t nv = n - n % 16, rem = n - nv;
        v16f mxv = (v16f) { 0 } - __builtin_inff(), acc = { 0 }, tail;
        float t[16], a[16], mx = -__builtin_inff(), inv;

        for (size_t i = 0; i < nv; i += 16) {
                v16f v = V16F_LOAD(s + i) * scale;
                v16i m = v > mxv;
                mxv = (v16f) (((v16i) mxv & ~m) | ((v16i) v & m));
                memcpy(s + i, &v, sizeof v);
        }
        memcpy(a, &mxv, sizeof a);
        for (int l = 0; l < 16; l++)
                mx = a[l] > mx ? a[l] : mx;
        for (size_t i = nv; i < n; i++) {
                s[i] = s[i] * scale;
                mx = s[i] > mx ? s[i] : mx;
        }
        for (size_t i = 0; i < nv; i += 16) {
                v16f e = V16F_LOAD(s + i) - mx;
                exp16(&e);
                acc = acc + e;
                memcpy(s + i, &e, sizeof e);
        }
        /* the tail through the same vector code, padded; its values continue the lanes */
        for (int l = 0; l < 16; l++)
                t[l] = (size_t) l < rem ? s[nv + l] : mx;
        tail = V16F_LOAD(t) - mx;
        exp16(&tail);
        memcpy(t, &tail, sizeof t);
        memcpy(a, &acc, sizeof a);
        for (size_t l = 0; l < rem; l++) {
                s[nv + l] = t[l];
                a[l] = a[l] + t[l];
        }
        inv = 1.0f / lanes_reduce(a);
        for (size_t i = 0; i < nv; i += 16) {
                v16f v = V16F_LOAD(s + i) * inv;
                memcpy(s + i, &v, sizeof v);
        }
        for (size_t i = nv; i < n; i++)
                s[i] = s[i] * inv;
}

/* out[h][j] += P[h][r]·rows[r][j], r ascending, for the columns j0 <= j < k one at a time (the
 * k % 16 tail of the vector loops) */
ALWAYS_INLINE void weighted_columns(const int NH, const float *rows, size_t row_stride,
                                    size_t n_rows, size_t j0, size_t k, const float *P,
                                    size_t p_stride, float *out, size_t out_stride) {
        for (int h = 0; h < NH; h++)
                for (size_t j = j0; j < k; j++) {
                        float o = out[h * out_stride + j];
                        for (size_t r = 0; r < n_rows; r++)
                                o = o + P[h * p_stride + r] * rows[r * row_stride + j];
                        out[h * out_stride + j] = o;
                }
}

/* out[h][j] = out[h][j] + P[h][r]·rows[r][j] for r ascending (a multiply, then an add): every
 * element's own order is r, whatever the vector width. NH heads at a time keep their 16-value
 * column chunk in registers while the rows pass. */
ALWAYS_INLINE void weighted_heads(const int NH, const float *rows, size_t row_stride,
                                  size_t n_rows, size_t k, const float *P, size_t p_stride,
                                  float *out, size_t out_stride) {
        size_t kv = k - k % 16;

        for (size_t j = 0; j < kv; j += 16) {
                v16f acc[4];

                UNROLL for (int h = 0; h < NH; h++)
                        acc[h] = V16F_LOAD(out + h * out_stride + j);
                for (size_t r = 0; r < n_rows; r++) {
                        v16f v = V16F_LOAD(rows + r * row_stride + j);

                        UNROLL for (int h = 0; h < NH; h++) {
                                float p = P[h * p_stride + r];
                                v16f m = (v16f) { p, p, p, p, p, p, p, p, p, p, p, p, p, p, p, p } * v;
                                acc[h] = acc[h] + m;
                        }
                }
                UNROLL for (int h = 0; h < NH; h++)
                        memcpy(out + h * out_stride + j, &acc[h], sizeof acc[h]);
        }
        weighted_columns(NH, rows, row_stride, n_rows, kv, k, P, p_stride, out, out_stride);
}

/* The H heads by HEADS (a function of weighted_heads' arguments): groups of 4, then one by one */
#define WEIGHTED_ROWS_BY_HEADS(HEADS, rows, row_stride, n_rows, k, P, p_stride, H, out, os)        \
        do {                                                                                       \
                size_t h_ = 0;                                                                     \
                                                                                                   \
                for (; h_ + 4 <= (H); h_ += 4)                                                     \
                        HEADS(4, (rows), (row_stride), (n_rows), (k), (P) + h_ * (p_stride),       \
                              (p_stride), (out) + h_ * (os), (os));                                \
                for (; h_ < (H); h_++)                                                             \
                        HEADS(1, (rows), (row_stride), (n_rows), (k), (P) + h_ * (p_stride),       \
                              (p_stride), (out) + h_ * (os), (os));                                \
        } while (0)

ALWAYS_INLINE void weighted_rows_body(const float *rows, size_t row_stride, size_t n_rows,
                                      size_t k, const float *P, size_t p_stride, size_t H,
                                      float *out, size_t out_stride) {
        WEIGHTED_ROWS_BY_HEADS(weighted_heads, rows, row_stride, n_rows, k, P, p_stride, H, out,
                               out_stride);
}

/* Rows [0, R) of a stored matrix (row_bytes apart, k values each) as fp32, exactly (docs/model.md §6). */
ALWAYS_INLINE void dequant_rows_body(uint32_t type, const void *w, size_t row_bytes, size_t R,
                                     size_t k, float *out) {
        for (size_t r = 0; r < R; r++) {
                const void *row = (const uint8_t *) w + r * row_bytes;
                float *o = out + r * k;

                switch (type) {
                case GGML_TYPE_F32:
                        memcpy(o, row, k * sizeof(float));
                        break;
                case GGML_TYPE_F16:
                        for (size_t i = 0; i < k; i++)
                                o[i] = fp16_to_f32(((const uint16_t *) row)[i]);
                        break;
                case GGML_TYPE_BF16:
                        for (size_t i = 0; i < k; i++)
                                o[i] = bf16_to_f32(((const uint16_t *) row)[i]);
                        break;
                case GGML_TYPE_Q8_0:
                        for (size_t i = 0; i < k / QK8_0; i++)
                                dequant_q8_0_block((const struct block_q8_0 *) row + i, o + i * QK8_0);
                        break;
                case GGML_TYPE_Q6_K:
                        for (size_t i = 0; i < k / QK_K; i++)
                                dequant_q6k_block((const struct block_q6_k *) row + i, o + i * QK_K);
                        break;
                case GGML_TYPE_IQ4_NL:
                        for (size_t i = 0; i < k / QK4_NL; i++)
                                dequant_iq4nl_block((const struct block_iq4_nl *) row + i, o + i * QK4_NL);
                        break;
                default: {
                        bool ok = dequant_other_row(type, row, o, k);
                        assert(ok && "quant: unsupported type");
                        (void) ok;
                }
                }
        }
}

struct quant_impl {
        const char *name;
        void (*dequant_rows)(uint32_t type, const void *w, size_t row_bytes, size_t R, size_t k,
                             float *out);
        void (*gemm)(const float *w, size_t R, size_t k, const float *x, size_t xs, size_t T,
                     float *y, size_t ys);
        void (*weighted_rows)(const float *rows, size_t row_stride, size_t n_rows, size_t k,
                              const float *P, size_t p_stride, size_t H, float *out,
                              size_t out_stride);
        bool (*gemv)(uint32_t type, const void *w, size_t rb, size_t R, size_t k, const float *x,
                     float *y); /* NULL: none */
        void (*softmax)(float *s, size_t n, float scale);
};

static void dequant_rows_generic(uint32_t type, const void *w, size_t row_bytes, size_t R,
                                 size_t k, float *out) {
        dequant_rows_body(type, w, row_bytes, R, k, out);
}

static void gemm_generic(const float *w, size_t R, size_t k, const float *x, size_t xs, size_t T,
                         float *y, size_t ys) {
        gemm_body(2, 2, w, R, k, x, xs, T, y, ys);
}

static void weighted_rows_generic(const float *rows, size_t row_stride, size_t n_rows, size_t k,
                                  const float *P, size_t p_stride, size_t H, float *out,
                                  size_t out_stride) {
        weighted_rows_body(rows, row_stride, n_rows, k, P, p_stride, H, out, out_stride);
}

static void softmax_generic(float *s, size_t n, float scale) {
        softmax_body(s, n, scale);
}

static const struct quant_impl impl_generic = { "portable", dequant_rows_generic, gemm_generic,
                                                weighted_rows_generic, NULL, softmax_generic };

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_X86_SIMD 1
#include <cpuid.h>
#include <immintrin.h>

/* The dequantizers with AVX2 intrinsics (the codebook lookup is one pshufb; F16C converts
 * halfs); the AVX-512 variant uses them too. Same values as the portable ones: each weight is
 * the exact d·q (or the exact conversion). */
#define AVX2_TARGET __attribute__((target("avx2,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

AVX2_TARGET static inline void store_i8x8_scaled(float *o, __m128i q8, __m256 d) {
        _mm256_storeu_ps(o, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
}

AVX2_TARGET static void dequant_rows_avx2(uint32_t type, const void *w, size_t row_bytes, size_t R,
                                          size_t k, float *out) {
        const __m128i book = _mm_loadu_si128((const __m128i *) quant_iq4nl_values);
        const __m128i mask = _mm_set1_epi8(0x0f);

        for (size_t r = 0; r < R; r++) {
                const void *row = (const uint8_t *) w + r * row_bytes;
                float *o = out + r * k;

                switch (type) {
                case GGML_TYPE_IQ4_NL: {
                        const struct block_iq4_nl *b = row;
                        for (size_t i = 0; i < k / QK4_NL; i++, o += QK4_NL) {
                                __m128i q = _mm_loadu_si128((const __m128i *) b[i].qs);
                                __m128i lo = _mm_shuffle_epi8(book, _mm_and_si128(q, mask));
                                __m128i hi = _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(q, 4), mask));
                                __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
                                store_i8x8_scaled(o, lo, d);
                                store_i8x8_scaled(o + 8, _mm_srli_si128(lo, 8), d);
                                store_i8x8_scaled(o + 16, hi, d);
                                store_i8x8_scaled(o + 24, _mm_srli_si128(hi, 8), d);
                        }
                        break;
                }
                case GGML_TYPE_Q8_0: {
                        const struct block_q8_0 *b = row;
                        for (size_t i = 0; i < k / QK8_0; i++, o += QK8_0) {
                                __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
                                for (int j = 0; j < 32; j += 8)
                                        store_i8x8_scaled(o + j, _mm_loadl_epi64((const __m128i *) (b[i].qs + j)), d);
                        }
                        break;
                }
                case GGML_TYPE_BF16: {
                        const uint16_t *h = row;
                        size_t i = 0;
                        for (; i + 8 <= k; i += 8)
                                _mm256_storeu_ps(o + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *) (h + i))), 16)));
                        for (; i < k; i++)
                                o[i] = bf16_to_f32(h[i]);
                        break;
                }
                case GGML_TYPE_F16: {
                        const uint16_t *h = row;
                        size_t i = 0;
                        for (; i + 8 <= k; i += 8)
                                _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + i))));
                        for (; i < k; i++)
                                o[i] = _cvtsh_ss(h[i]);
                        break;
                }
                default: /* F32, Q6_K: the portable code, compiled for AVX2 */
                        dequant_rows_body(type, row, row_bytes, 1, k, o);
                        break;
                }
        }
}

/* AVX-512: a 16-value run (an IQ4_NL half block, a Q6_K sub-block) is one register. */
AVX512_TARGET static inline void store_i8x16_scaled(float *o, __m128i q8, __m512 d) {
        _mm512_storeu_ps(o, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8))));
}

/* docs/model.md §6 (q6k_unpack): the 128 six-bit values of half a Q6_K super-block (ql: 64 bytes,
 * qh: 32), less 32, as four registers of 32 int8: low nibbles / high nibbles of ql, 2 bits of qh
 * each. Shared by the dequantizer and the matrix-vector product, which must agree bit for bit. */
AVX512_TARGET static inline __attribute__((always_inline)) void
q6k_half_avx512(const uint8_t *ql, const uint8_t *qh, __m256i v[4]) {
        const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
        const __m256i m32 = _mm256_set1_epi8(32);
        __m256i l0 = _mm256_loadu_si256((const __m256i *) ql);
        __m256i l1 = _mm256_loadu_si256((const __m256i *) (ql + 32));
        __m256i h = _mm256_loadu_si256((const __m256i *) qh);

        v[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
        v[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
        v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
        v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
        for (int j = 0; j < 4; j++)
                v[j] = _mm256_sub_epi8(v[j], m32);
}

AVX512_TARGET static void dequant_q6k_avx512(const struct block_q6_k *b, float *o) {
        float d = _cvtsh_ss(b->d);

        for (int n = 0; n < 2; n++, o += 128) {
                const int8_t *sc = b->scales + 8 * n;
                __m256i v[4];

                q6k_half_avx512(b->ql + 64 * n, b->qh + 32 * n, v);
                for (int j = 0; j < 4; j++) {
                        __m512 d0 = _mm512_set1_ps(d * (float) sc[2 * j]);
                        __m512 d1 = _mm512_set1_ps(d * (float) sc[2 * j + 1]);
                        store_i8x16_scaled(o + 32 * j, _mm256_castsi256_si128(v[j]), d0);
                        store_i8x16_scaled(o + 32 * j + 16, _mm256_extracti128_si256(v[j], 1), d1);
                }
        }
}

AVX512_TARGET static void dequant_rows_avx512(uint32_t type, const void *w, size_t row_bytes,
                                              size_t R, size_t k, float *out) {
        const __m128i book = _mm_loadu_si128((const __m128i *) quant_iq4nl_values);
        const __m128i mask = _mm_set1_epi8(0x0f);

        for (size_t r = 0; r < R; r++) {
                const void *row = (const uint8_t *) w + r * row_bytes;
                float *o = out + r * k;

                switch (type) {
                case GGML_TYPE_IQ4_NL: {
                        const struct block_iq4_nl *b = row;
                        for (size_t i = 0; i < k / QK4_NL; i++, o += QK4_NL) {
                                __m128i q = _mm_loadu_si128((const __m128i *) b[i].qs);
                                __m512 d = _mm512_set1_ps(_cvtsh_ss(b[i].d));
                                store_i8x16_scaled(o, _mm_shuffle_epi8(book, _mm_and_si128(q, mask)), d);
                                store_i8x16_scaled(o + 16, _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(q, 4), mask)), d);
                        }
                        break;
                }
                case GGML_TYPE_Q6_K: {
                        const struct block_q6_k *b = row;
                        for (size_t i = 0; i < k / QK_K; i++)
                                dequant_q6k_avx512(&b[i], o + i * QK_K);
                        break;
                }
                case GGML_TYPE_Q8_0: {
                        const struct block_q8_0 *b = row;
                        for (size_t i = 0; i < k / QK8_0; i++, o += QK8_0) {
                                __m512 d = _mm512_set1_ps(_cvtsh_ss(b[i].d));
                                store_i8x16_scaled(o, _mm_loadu_si128((const __m128i *) b[i].qs), d);
                                store_i8x16_scaled(o + 16, _mm_loadu_si128((const __m128i *) (b[i].qs + 16)), d);
                        }
                        break;
                }
                case GGML_TYPE_BF16: {
                        const uint16_t *h = row;
                        size_t i = 0;
                        for (; i + 16 <= k; i += 16)
                                _mm512_storeu_ps(o + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *) (h + i))), 16)));
                        for (; i < k; i++)
                                o[i] = bf16_to_f32(h[i]);
                        break;
                }
                default: /* F32, F16 */
                        dequant_rows_avx2(type, row, row_bytes, 1, k, o);
                        break;
                }
        }
}

/* Fused row · x for one input (decode): each 16-value run of a row is decoded in registers and
 * multiplied straight away, NR rows at a time. The weights are the same exact d·q values and the
 * run order is the lane order of gemm_tile, so the result has the same bits as dequantizing and
 * quant_gemm_f32; it saves writing and re-reading the panel when it serves only one input. */
AVX512_TARGET static inline __m512 i8x16_scaled(__m128i q8, __m512 d) {
        return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8)));
}

AVX512_TARGET static inline __m512 acc_add(__m512 acc, __m512 w, const float *x) {
        return _mm512_add_ps(acc, _mm512_mul_ps(w, _mm512_loadu_ps(x)));
}

AVX512_TARGET static inline float acc_reduce16(__m512 acc) {
        float a[16];

        _mm512_storeu_ps(a, acc);
        return lanes_reduce(a);
}

/* How far ahead (bytes) the fused kernels prefetch the weights they stream: past the current
 * 4-row group into the next ones, which rows of a few KB make sequential. At full width a decode
 * step streams ~1.1 GB of weights from DRAM, and with the hardware prefetcher alone IQ4_NL / Q6_K
 * / BF16 rows came in at 7 / 3.4 / 16 GB/s on one thread (4096-value rows); 32 KB ahead gives
 * 16 / 13 / 26, about their in-cache compute rates. Prefetches never fault, so reading past the
 * end of a matrix is harmless (a few wasted lines per product). */
#define GEMV_PREFETCH 32768

AVX512_TARGET static inline __attribute__((always_inline)) void
gemv_rows_avx512(const int NR, uint32_t type, const uint8_t *w, size_t rb, size_t k, const float *x,
                 float *y) {
        const __m128i book = _mm_loadu_si128((const __m128i *) quant_iq4nl_values);
        __m512 acc[4];

        UNROLL for (int r = 0; r < NR; r++)
                acc[r] = _mm512_setzero_ps();
        switch (type) {
        case GGML_TYPE_IQ4_NL: {
                /* the codebook scaled by the block's d (the same one product d·book[q] per
                 * weight), looked up by nibble with one permute per 16 weights */
                const __m512 bookf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(book));
                const __m512i m15 = _mm512_set1_epi32(0x0f);
                for (size_t i = 0; i < k / QK4_NL; i++) {
                        const float *xi = x + QK4_NL * i;
                        UNROLL for (int r = 0; r < NR; r++) {
                                const struct block_iq4_nl *b = (const struct block_iq4_nl *) (w + r * rb) + i;
                                _mm_prefetch((const char *) b + GEMV_PREFETCH, _MM_HINT_T0);
                                __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *) b->qs));
                                __m512 sb = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b->d)), bookf);
                                acc[r] = acc_add(acc[r], _mm512_permutexvar_ps(_mm512_and_si512(q, m15), sb), xi);
                                acc[r] = acc_add(acc[r], _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), sb), xi + 16);
                        }
                }
                break;
        }
        case GGML_TYPE_Q8_0:
                for (size_t i = 0; i < k / QK8_0; i++) {
                        const float *xi = x + QK8_0 * i;
                        UNROLL for (int r = 0; r < NR; r++) {
                                const struct block_q8_0 *b = (const struct block_q8_0 *) (w + r * rb) + i;
                                __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
                                acc[r] = acc_add(acc[r], i8x16_scaled(_mm_loadu_si128((const __m128i *) b->qs), d), xi);
                                acc[r] = acc_add(acc[r], i8x16_scaled(_mm_loadu_si128((const __m128i *) (b->qs + 16)), d), xi + 16);
                        }
                }
                break;
        case GGML_TYPE_BF16:
                for (size_t i = 0; i < k; i += 16)
                        UNROLL for (int r = 0; r < NR; r++) {
                                const uint16_t *h = (const uint16_t *) (w + r * rb) + i;
                                _mm_prefetch((const char *) h + GEMV_PREFETCH, _MM_HINT_T0);
                                __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(
                                        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *) h)), 16));
                                acc[r] = acc_add(acc[r], v, x + i);
                        }
                break;
        case GGML_TYPE_F16:
                for (size_t i = 0; i < k; i += 16)
                        UNROLL for (int r = 0; r < NR; r++) {
                                const uint16_t *h = (const uint16_t *) (w + r * rb) + i;
                                acc[r] = acc_add(acc[r], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) h)), x + i);
                        }
                break;
        case GGML_TYPE_F32:
                for (size_t i = 0; i < k; i += 16)
                        UNROLL for (int r = 0; r < NR; r++)
                                acc[r] = acc_add(acc[r], _mm512_loadu_ps((const float *) (w + r * rb) + i), x + i);
                break;
        case GGML_TYPE_Q6_K: {
                for (size_t i = 0; i < k / QK_K; i++)
                        UNROLL for (int r = 0; r < NR; r++) {
                                const struct block_q6_k *b = (const struct block_q6_k *) (w + r * rb) + i;
                                for (int c = 0; c < 4; c++)
                                        _mm_prefetch((const char *) b + GEMV_PREFETCH + 64 * c, _MM_HINT_T0);
                                float d = _cvtsh_ss(b->d);
                                for (int n = 0; n < 2; n++) {
                                        const int8_t *sc = b->scales + 8 * n;
                                        const float *xn = x + QK_K * i + 128 * n;
                                        __m256i v[4];
                                        q6k_half_avx512(b->ql + 64 * n, b->qh + 32 * n, v);
                                        for (int j = 0; j < 4; j++) {
                                                __m512 d0 = _mm512_set1_ps(d * (float) sc[2 * j]);
                                                __m512 d1 = _mm512_set1_ps(d * (float) sc[2 * j + 1]);
                                                acc[r] = acc_add(acc[r], i8x16_scaled(_mm256_castsi256_si128(v[j]), d0), xn + 32 * j);
                                                acc[r] = acc_add(acc[r], i8x16_scaled(_mm256_extracti128_si256(v[j], 1), d1), xn + 32 * j + 16);
                                        }
                                }
                        }
                break;
        }
        default:
                break;
        }
        UNROLL for (int r = 0; r < NR; r++)
                y[r] = acc_reduce16(acc[r]);
}

AVX512_TARGET static bool gemv_avx512(uint32_t type, const void *w, size_t rb, size_t R, size_t k,
                                      const float *x, float *y) {
        size_t r = 0;

        if (k % 16 != 0 ||
            !(type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_Q8_0 || type == GGML_TYPE_BF16 ||
              type == GGML_TYPE_F16 || type == GGML_TYPE_F32 || type == GGML_TYPE_Q6_K))
                return false;
        for (; r + 4 <= R; r += 4)
                gemv_rows_avx512(4, type, (const uint8_t *) w + r * rb, rb, k, x, y + r);
        for (; r < R; r++)
                gemv_rows_avx512(1, type, (const uint8_t *) w + r * rb, rb, k, x, y + r);
        return true;
}

/* The AVX2 tile and weighted rows hold each 16-lane vector as two explicit 8-lane halves: gcc
 * keeps a 64-byte GNU vector in memory where the widest register is 32 bytes, and so the generic
 * bodies ran with every accumulator spilled (the attention's dots at ~3 G multiply-adds a second
 * on an AVX2 EPYC). Lane l is lane l % 8 of half l / 8, and each lane sees the same operations in
 * the same order (a multiply, then an add, the index ascending; no FMA in this target), so the
 * bits are the generic body's. */
AVX2_TARGET ALWAYS_INLINE void gemm_tile_avx2(const int NR, const int NT, const float *w,
                                              size_t ws, const float *x, size_t xs, float *y,
                                              size_t ys, size_t k) {
        __m256 acc[4][4][2];
        size_t kv = k - k % 16;

        UNROLL for (int r = 0; r < NR; r++)
                UNROLL for (int t = 0; t < NT; t++)
                        acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
        for (size_t i = 0; i < kv; i += 16)
                UNROLL for (int hf = 0; hf < 2; hf++) {
                        __m256 wv[4], xv[4];

                        UNROLL for (int r = 0; r < NR; r++)
                                wv[r] = _mm256_loadu_ps(w + r * ws + i + 8 * hf);
                        UNROLL for (int t = 0; t < NT; t++)
                                xv[t] = _mm256_loadu_ps(x + t * xs + i + 8 * hf);
                        UNROLL for (int r = 0; r < NR; r++)
                                UNROLL for (int t = 0; t < NT; t++)
                                        acc[r][t][hf] = _mm256_add_ps(acc[r][t][hf],
                                                                      _mm256_mul_ps(wv[r], xv[t]));
                }
        UNROLL for (int r = 0; r < NR; r++)
                UNROLL for (int t = 0; t < NT; t++) {
                        float a[16];

                        _mm256_storeu_ps(a, acc[r][t][0]);
                        _mm256_storeu_ps(a + 8, acc[r][t][1]);
                        y[t * ys + r] = lanes_finish_sums(a, w + r * ws + kv, x + t * xs + kv,
                                                          k - kv);
                }
}

AVX2_TARGET static void gemm_avx2(const float *w, size_t R, size_t k, const float *x, size_t xs,
                                  size_t T, float *y, size_t ys) {
        /* 2 × 2 × 2 ymm accumulators, 4 + 4 loaded halves at most: 16 registers */
        GEMM_BODY_TILED(gemm_tile_avx2, 2, 2, w, R, k, x, xs, T, y, ys);
}

/* weighted_heads (above) with two ymm halves per head's 16-value chunk */
AVX2_TARGET ALWAYS_INLINE void weighted_heads_avx2(const int NH, const float *rows,
                                                   size_t row_stride, size_t n_rows, size_t k,
                                                   const float *P, size_t p_stride, float *out,
                                                   size_t out_stride) {
        size_t kv = k - k % 16;

        for (size_t j = 0; j < kv; j += 16) {
                __m256 acc[4][2];

                UNROLL for (int h = 0; h < NH; h++) {
                        acc[h][0] = _mm256_loadu_ps(out + h * out_stride + j);
                        acc[h][1] = _mm256_loadu_ps(out + h * out_stride + j + 8);
                }
                for (size_t r = 0; r < n_rows; r++) {
                        __m256 v0 = _mm256_loadu_ps(rows + r * row_stride + j);
                        __m256 v1 = _mm256_loadu_ps(rows + r * row_stride + j + 8);

                        UNROLL for (int h = 0; h < NH; h++) {
                                __m256 p = _mm256_set1_ps(P[h * p_stride + r]);
                                acc[h][0] = _mm256_add_ps(acc[h][0], _mm256_mul_ps(p, v0));
                                acc[h][1] = _mm256_add_ps(acc[h][1], _mm256_mul_ps(p, v1));
                        }
                }
                UNROLL for (int h = 0; h < NH; h++) {
                        _mm256_storeu_ps(out + h * out_stride + j, acc[h][0]);
                        _mm256_storeu_ps(out + h * out_stride + j + 8, acc[h][1]);
                }
        }
        weighted_columns(NH, rows, row_stride, n_rows, kv, k, P, p_stride, out, out_stride);
}

AVX512_TARGET static void gemm_avx512(const float *w, size_t R, size_t k, const float *x,
                                      size_t xs, size_t T, float *y, size_t ys) {
        gemm_body(4, 4, w, R, k, x, xs, T, y, ys); /* 16 of the 32 zmm registers */
}

AVX2_TARGET static void weighted_rows_avx2(const float *rows, size_t row_stride, size_t n_rows,
                                           size_t k, const float *P, size_t p_stride, size_t H,
                                           float *out, size_t out_stride) {
        WEIGHTED_ROWS_BY_HEADS(weighted_heads_avx2, rows, row_stride, n_rows, k, P, p_stride, H,
                               out, out_stride);
}

AVX512_TARGET static void weighted_rows_avx512(const float *rows, size_t row_stride,
                                               size_t n_rows, size_t k, const float *P,
                                               size_t p_stride, size_t H, float *out,
                                               size_t out_stride) {
        weighted_rows_body(rows, row_stride, n_rows, k, P, p_stride, H, out, out_stride);
}

/* exp16 (above) on 8 lanes: the same operations in the same order, so the same bits */
AVX2_TARGET ALWAYS_INLINE __m256 exp8_avx2(__m256 x) {
        const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
        const __m256 magic = _mm256_set1_ps(12582912.0f);
        __m256 fx, n, r, p, y;

        x = _mm256_blendv_ps(x, lo, _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
        x = _mm256_blendv_ps(x, hi, _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
        fx = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
        n = _mm256_add_ps(fx, magic);
        n = _mm256_sub_ps(n, magic);
        r = _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f));
        r = _mm256_sub_ps(x, r);
        p = _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f));
        r = _mm256_sub_ps(r, p);
        p = _mm256_mul_ps(r, _mm256_set1_ps(1.9875691500e-4f));
        p = _mm256_add_ps(p, _mm256_set1_ps(1.3981999507e-3f));
        p = _mm256_mul_ps(p, r);
        p = _mm256_add_ps(p, _mm256_set1_ps(8.3334519073e-3f));
        p = _mm256_mul_ps(p, r);
        p = _mm256_add_ps(p, _mm256_set1_ps(4.1665795894e-2f));
        p = _mm256_mul_ps(p, r);
        p = _mm256_add_ps(p, _mm256_set1_ps(1.6666665459e-1f));
        p = _mm256_mul_ps(p, r);
        p = _mm256_add_ps(p, _mm256_set1_ps(5.0000001201e-1f));
        y = _mm256_mul_ps(r, r);
        y = _mm256_mul_ps(p, y);
        y = _mm256_add_ps(y, r);
        y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
        __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));

        e = _mm256_slli_epi32(e, 23);
        return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* softmax_body with the 16 lanes as two ymm halves (its generic form spilled them, as the panel
 * product did): the same maxima, the same exps and the same lane sums, so the same bits */
AVX2_TARGET static void softmax_avx2(float *s, size_t n, float scale) {
        size_t nv = n - n % 16, rem = n - nv;
        const __m256 sc = _mm256_set1_ps(scale);
        __m256 mxv[2], acc[2];
        float t[16], a[16], mx = -__builtin_inff(), inv;

        mxv[0] = mxv[1] = _mm256_set1_ps(-__builtin_inff());
        acc[0] = acc[1] = _mm256_setzero_ps();
        for (size_t i = 0; i < nv; i += 16)
                for (int hf = 0; hf < 2; hf++) {
                        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + i + 8 * hf), sc);
                        __m256 gt = _mm256_cmp_ps(v, mxv[hf], _CMP_GT_OQ);

                        mxv[hf] = _mm256_blendv_ps(mxv[hf], v, gt);
                        _mm256_storeu_ps(s + i + 8 * hf, v);
                }
        _mm256_storeu_ps(a, mxv[0]);
        _mm256_storeu_ps(a + 8, mxv[1]);
        for (int l = 0; l < 16; l++)
                mx = a[l] > mx ? a[l] : mx;
        for (size_t i = nv; i < n; i++) {
                s[i] = s[i] * scale;
                mx = s[i] > mx ? s[i] : mx;
        }
        const __m256 mxb = _mm256_set1_ps(mx);
        for (size_t i = 0; i < nv; i += 16)
                for (int hf = 0; hf < 2; hf++) {
                        __m256 e = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i + 8 * hf), mxb));
                        acc[hf] = _mm256_add_ps(acc[hf], e);
                        _mm256_storeu_ps(s + i + 8 * hf, e);
                }
        /* the tail through the same vector code, padded; its values continue the lanes */
        for (int l = 0; l < 16; l++)
                t[l] = (size_t) l < rem ? s[nv + l] : mx;
        for (int hf = 0; hf < 2; hf++) {
                __m256 e = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(t + 8 * hf), mxb));

                _mm256_storeu_ps(t + 8 * hf, e);
        }
        _mm256_storeu_ps(a, acc[0]);
        _mm256_storeu_ps(a + 8, acc[1]);
        for (size_t l = 0; l < rem; l++) {
                s[nv + l] = t[l];
                a[l] = a[l] + t[l];
        }
        inv = 1.0f / lanes_reduce(a);
        const __m256 invb = _mm256_set1_ps(inv);
        for (size_t i = 0; i < nv; i += 8)
                _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), invb));
        for (size_t i = nv; i < n; i++)
                s[i] = s[i] * inv;
}

AVX512_TARGET static void softmax_avx512(float *s, size_t n, float scale) {
        softmax_body(s, n, scale);
}

/* ---- the fast numerics' BF16 products (quant.h): vdpbf16ps, AVX512_BF16 only ---- */
#define AVX512BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,f16c")))

/* A register tile of NR rows × NT inputs; the k % 32 tail as zero-filled pairs (0·0 adds +0). */
AVX512BF16_TARGET static inline __attribute__((always_inline)) void
bf16_tile(const int NR, const int NT, const uint8_t *w, size_t rb, size_t k, const uint16_t *x,
          size_t xs, float *y, size_t ys) {
        __m512 acc[4][4];
        const size_t kv = k - k % 32;

        UNROLL for (int r = 0; r < NR; r++)
                UNROLL for (int t = 0; t < NT; t++)
                        acc[r][t] = _mm512_setzero_ps();
        for (size_t i = 0; i < kv; i += 32) {
                __m512i wv[4], xv[4];

                UNROLL for (int r = 0; r < NR; r++) {
                        const uint16_t *h = (const uint16_t *) (w + r * rb) + i;
                        _mm_prefetch((const char *) h + GEMV_PREFETCH, _MM_HINT_T0);
                        wv[r] = _mm512_loadu_si512(h);
                }
                UNROLL for (int t = 0; t < NT; t++)
                        xv[t] = _mm512_loadu_si512(x + t * xs + i);
                UNROLL for (int r = 0; r < NR; r++)
                        UNROLL for (int t = 0; t < NT; t++)
                                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh) wv[r], (__m512bh) xv[t]);
        }
        if (kv < k) {
                const __mmask32 m = (__mmask32) ((1ull << (k - kv)) - 1);
                __m512i wv[4], xv[4];

                UNROLL for (int r = 0; r < NR; r++)
                        wv[r] = _mm512_maskz_loadu_epi16(m, (const uint16_t *) (w + r * rb) + kv);
                UNROLL for (int t = 0; t < NT; t++)
                        xv[t] = _mm512_maskz_loadu_epi16(m, x + t * xs + kv);
                UNROLL for (int r = 0; r < NR; r++)
                        UNROLL for (int t = 0; t < NT; t++)
                                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh) wv[r], (__m512bh) xv[t]);
        }
        UNROLL for (int r = 0; r < NR; r++)
                UNROLL for (int t = 0; t < NT; t++) {
                        float a[16];
                        _mm512_storeu_ps(a, acc[r][t]);
                        y[t * ys + r] = lanes_reduce(a);
                }
}

/* Tiles of 4 rows × 4 inputs, rows outer; the edges in 4 × 1 and 1 × 4 (or 1 × 1) tiles, which
 * never change an output's own order. */
AVX512BF16_TARGET static void gemm_bf16_avx512(const void *w, size_t rb, size_t R, size_t k,
                                               const uint16_t *x, size_t xs, size_t T, float *y,
                                               size_t ys) {
        for (size_t r = 0; r < R; r += 4) {
                size_t nr = MIN((size_t) 4, R - r);
                const uint8_t *wr = (const uint8_t *) w + r * rb;

                for (size_t t = 0; t < T; t += 4) {
                        size_t nt = MIN((size_t) 4, T - t);
                        const uint16_t *xt = x + t * xs;
                        float *yt = y + r + t * ys;

                        if (nr == 4 && nt == 4)
                                bf16_tile(4, 4, wr, rb, k, xt, xs, yt, ys);
                        else if (nr == 4)
                                for (size_t u = 0; u < nt; u++)
                                        bf16_tile(4, 1, wr, rb, k, xt + u * xs, xs, yt + u * ys, ys);
                        else
                                for (size_t q = 0; q < nr; q++)
                                        for (size_t u = 0; u < nt; u++)
                                                bf16_tile(1, 1, wr + q * rb, rb, k, xt + u * xs, xs,
                                                          yt + q + u * ys, ys);
                }
        }
}

static bool cpu_has_avx512_bf16(void);
#endif

static bool bf16_dot_off; /* quant_set_simd below level 2 */

bool quant_bf16_dot_available(void) {
#ifdef HAVE_X86_SIMD
        /* cpuid once (in a VM it traps: tens of microseconds); 0 unknown, 1 no, 2 yes */
        static int has;
        int h = __atomic_load_n(&has, __ATOMIC_RELAXED);

        if (!h) {
                h = cpu_has_avx512_bf16() ? 2 : 1;
                __atomic_store_n(&has, h, __ATOMIC_RELAXED);
        }
        return !__atomic_load_n(&bf16_dot_off, __ATOMIC_RELAXED) && h == 2;
#else
        return false;
#endif
}

static void round_bf16_generic(const float *x, size_t n, uint16_t *xb) {
        for (size_t i = 0; i < n; i++)
                xb[i] = quant_f32_to_bf16(x[i]);
}

/* The instruction's arithmetic, portably (the definition; tests and CPUs without it): per lane
 * and pair, the odd element's product is added first, then the even one's, each a fused
 * multiply-add rounded to nearest even, with bf16 subnormal inputs read as zero and subnormal
 * results flushed to zero (as vdpbf16ps does, whatever MXCSR says). */
static inline float bf16_daz(uint16_t h) {
        return (h & 0x7f80) == 0 ? 0.0f * bf16_to_f32(h) : bf16_to_f32(h);
}

static inline float f32_ftz(float f) {
        uint32_t u = f32_bits(f);
        return (u & 0x7f800000) == 0 ? f32_from_bits(u & 0x80000000) : f;
}

static float bf16_dot_ref(const uint16_t *w, const uint16_t *x, size_t k) {
        float acc[16] = { 0 };

        for (size_t c = 0; c < k; c += 32)
                for (int l = 0; l < 16; l++)
                        for (int e = 1; e >= 0; e--) {
                                size_t i = c + 2 * (size_t) l + (size_t) e;
                                if (i < k)
                                        acc[l] = f32_ftz(fmaf(bf16_daz(w[i]), bf16_daz(x[i]), acc[l]));
                                else /* the zero-filled tail: +0·+0 */
                                        acc[l] = f32_ftz(acc[l] + 0.0f);
                        }
        return lanes_reduce(acc);
}

void quant_gemm_bf16(const void *w, size_t row_bytes, size_t R, size_t k, const uint16_t *xb,
                     size_t xb_stride, size_t T, float *y, size_t y_stride) {
#ifdef HAVE_X86_SIMD
        if (quant_bf16_dot_available()) {
                gemm_bf16_avx512(w, row_bytes, R, k, xb, xb_stride, T, y, y_stride);
                return;
        }
#endif
        for (size_t t = 0; t < T; t++)
                for (size_t r = 0; r < R; r++)
                        y[t * y_stride + r] = bf16_dot_ref(
                                (const uint16_t *) ((const uint8_t *) w + r * row_bytes),
                                xb + t * xb_stride, k);
}

/* ---- the fast numerics' integer products (quant.h): the portable definition ---- */
bool quant_q8_supported(uint32_t type) {
        return type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q6_K ||
               type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K ||
               type == GGML_TYPE_IQ4_XS || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_0 ||
               type == GGML_TYPE_Q5_1;
}

size_t quant_q8_block_values(uint32_t type) {
        return type == GGML_TYPE_Q6_K || type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K ||
                               type == GGML_TYPE_IQ4_XS
                       ? QK_K
                       : 32;
}

size_t quant_q8_row_bytes(size_t k) {
        return (k + k / 32 * sizeof(float) + k / 16 * sizeof(int32_t) + 63) & ~(size_t) 63;
}

/* Below this a block's values are 0 in q8 (127 / amax would overflow near 2^-121; nothing this
 * small changes a product of the model's scale). */
#define Q8_TINY 0x1p-96f

/* a q8 row's parts (quant.h): the values, the block scales, the 16-value runs' sums */
#define Q8_DX(row, k) ((const float *) ((const uint8_t *) (row) + (k)))
#define Q8_SUMS(row, k) ((const int32_t *) ((const uint8_t *) (row) + (k) + (k) / 32 * sizeof(float)))

static void q8_quantize_generic(const float *x, size_t k, void *row) {
        int8_t *q = row;
        float *dx = (float *) ((uint8_t *) row + k);
        int32_t *sums = (int32_t *) (dx + k / 32);

        assert(k % 32 == 0);
        for (size_t b = 0; b < k / 32; b++) {
                const float *xb = x + 32 * b;
                float amax = 0.0f;
                bool finite = true;

                for (int i = 0; i < 32; i++) {
                        float a = xb[i] < 0 ? -xb[i] : xb[i];
                        finite = finite && isfinite(xb[i]);
                        amax = a > amax ? a : amax;
                }
                if (!finite || amax < Q8_TINY) { /* quant.h: NaN scale, or a zero block */
                        dx[b] = finite ? 0.0f : NAN;
                        memset(q + 32 * b, 0, 32);
                } else {
                        float id = 127.0f / amax;
                        dx[b] = amax / 127.0f;
                        for (int i = 0; i < 32; i++) {
                                float v = nearbyintf(xb[i] * id);
                                q[32 * b + i] = (int8_t) (v > 127.0f ? 127 : v < -127.0f ? -127 : v);
                        }
                }
                for (int h = 0; h < 2; h++) {
                        int32_t s = 0;
                        for (int i = 0; i < 16; i++)
                                s += q[32 * b + 16 * h + i];
                        sums[2 * b + h] = s;
                }
        }
}

/* The packed copy (quant.h): rows in groups of 16; a group's bytes are those of its 16 stored
 * rows, unit after unit (IQ4_NL, Q4_0 and Q8_0: a 32-value block; the K formats: a 256-value
 * super-block):
 * - IQ4_NL and Q4_0, 288 bytes a unit: 4 chunks of 64 bytes, chunk c holding bytes 4c..4c+3 of
 *   each row's qs (row r at 4r: low nibbles are values 4c + i, high nibbles 16 + 4c + i), then
 *   the 16 rows' d.
 * - Q8_0, 544 bytes: 8 chunks, chunk c values 4c..4c+3 of each row, then the 16 d.
 * - Q6_K, 3360 bytes: for each 16-value run j (values 16j..16j+15, 0 <= u < 64 the stored
 *   six-bit numbers): 3 chunks of 64 bytes, row r's 4 bytes at 4r, byte i of them: chunk 0 the
 *   low 4 bits of u[16j + i] | those of u[16j + 4 + i] << 4, chunk 1 the same of 16j + 8 + i and
 *   16j + 12 + i, chunk 2 the top 2 bits of the four at bits 0, 2, 4, 6; then the runs' scales
 *   (run j's 16 rows at 16j), then the 16 d.
 * - Q4_K, 2304 bytes, and Q5_K, 2816 (u the unsigned four- or five-bit numbers, sc / m the
 *   32-value blocks' six-bit scales and mins): for each block j the IQ4_NL layout of the low 4
 *   bits of u[32j..32j+31] (4 chunks of 64 bytes at 256j); Q5_K then, at 2048 + 64j, one chunk a
 *   block: row r's byte i at 4r + i holds the fifth bits of u[32j + 4c + i] at bit c and of
 *   u[32j + 16 + 4c + i] at bit 4 + c (c < 4); then 128 bytes of (sc_j & 15) | (m_j & 15) << 4
 *   (block j's 16 rows at 16j), 64 bytes of the top 2 bits (row r's byte i at 4r + i:
 *   sc_2i, m_2i, sc_2i+1, m_2i+1 at bits 0, 2, 4, 6), the 16 d and the 16 dmin.
 * - IQ4_XS, 2176 bytes (ls the 32-value blocks' six-bit scales, the block's factor ls − 32): for
 *   each block j the IQ4_NL layout of its nibbles (4 chunks of 64 bytes at 256j); then 64 bytes,
 *   row r's 4 bytes at 4r as a little-endian word holding the low 4 bits of ls_j at bits 4j; 32
 *   bytes, row r's 2 at 2r a word holding the top 2 bits of ls_j at bits 2j; the 16 d.
 * - Q4_1 (320 bytes), Q5_0 (352) and Q5_1 (384), u the unsigned four- or five-bit numbers of a
 *   32-value block: the IQ4_NL layout of their low 4 bits; Q5_0 / Q5_1 then one chunk of fifth
 *   bits as Q5_K's; the 16 d; Q4_1 / Q5_1 then the 16 m.
 * A last group of fewer than 16 rows is padded with zero bytes to a whole one, so every row
 * takes the SIMD kernels (a 24-row mHC projection in a user's quantization left 8 rows a token
 * to the portable code, and its prefill ran slower than the reference's). */
#define Q8P_ROWS 16

static size_t q8p_row_bytes(uint32_t type, size_t k) {
        switch (type) {
        case GGML_TYPE_IQ4_NL:
        case GGML_TYPE_Q4_0: return k / QK4_NL * sizeof(struct block_iq4_nl);
        case GGML_TYPE_Q8_0: return k / QK8_0 * sizeof(struct block_q8_0);
        case GGML_TYPE_Q4_K: return k / QK_K * 144;
        case GGML_TYPE_Q5_K: return k / QK_K * 176;
        case GGML_TYPE_IQ4_XS: return k / QK_K * 136;
        case GGML_TYPE_Q4_1: return k / 32 * 20;
        case GGML_TYPE_Q5_0: return k / 32 * 22;
        case GGML_TYPE_Q5_1: return k / 32 * 24;
        default: return k / QK_K * sizeof(struct block_q6_k);
        }
}

size_t quant_q8_packed_bytes(uint32_t type, size_t R, size_t k) {
        return (R + Q8P_ROWS - 1) / Q8P_ROWS * Q8P_ROWS * q8p_row_bytes(type, k);
}

enum { Q8P_IQ4_UNIT = 16 * 18, Q8P_Q8_UNIT = 16 * 34, Q8P_Q6K_UNIT = 16 * 210, Q8P_Q6K_SC = 3072,
       Q8P_Q6K_D = 3328 };

/* the K formats' packed unit: its size, and where the fifth bits (Q5_K), the scales' low bits,
 * their top bits, d and dmin start */
#define Q8P_K_FIVE(type) ((type) == GGML_TYPE_Q5_K)
#define Q8P_K_UNIT(type) (Q8P_K_FIVE(type) ? 16 * 176 : 16 * 144)
#define Q8P_K_QH 2048
#define Q8P_K_SC(type) (Q8P_K_FIVE(type) ? 2560 : 2048)
#define Q8P_K_SCH(type) (Q8P_K_SC(type) + 128)
#define Q8P_K_D(type) (Q8P_K_SC(type) + 192)
#define Q8P_K_DMIN(type) (Q8P_K_SC(type) + 224)

/* IQ4_XS's packed unit: the scales' low bits, top bits, d */
enum { Q8P_XS_UNIT = 16 * 136, Q8P_XS_SCL = 2048, Q8P_XS_SCH = 2112, Q8P_XS_D = 2144 };

/* A stored IQ4_XS super-block (docs/model.md §6): block j's six-bit scale ls_j */
static inline int xs_scale(const uint8_t *b, int j) {
        return ((b[4 + j / 2] >> 4 * (j % 2)) & 15) | ((load_u16(b + 2) >> 2 * j) & 3) << 4;
}

/* Q4_1, Q5_0, Q5_1: a 32-value block of unsigned numbers u with d (and m): d·(u − 16) for Q5_0,
 * d·u + m for the others. The packed unit: nibbles, fifth bits, d, m. */
static bool q8_is_legacy(uint32_t type) {
        return type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1;
}
#define Q8P_L_FIVE(type) ((type) != GGML_TYPE_Q4_1)
#define Q8P_L_MIN(type) ((type) != GGML_TYPE_Q5_0)
#define Q8P_L_UNIT(type) ((type) == GGML_TYPE_Q4_1 ? 320 : (type) == GGML_TYPE_Q5_0 ? 352 : 384)
#define Q8P_L_D(type) (Q8P_L_FIVE(type) ? 320 : 256)
#define Q8P_L_M(type) (Q8P_L_D(type) + 32)

/* A stored Q4_1 / Q5_0 / Q5_1 block (docs/model.md §6): its 32 unsigned numbers in output order,
 * d and m (0 for Q5_0). */
static void legacy_unpack(uint32_t type, const uint8_t *b, uint8_t u[32], uint16_t *d, uint16_t *m) {
        const uint8_t *p = b + (Q8P_L_MIN(type) ? 4 : 2), *qs = p + (Q8P_L_FIVE(type) ? 4 : 0);
        uint32_t qh = 0;

        *d = load_u16(b);
        *m = Q8P_L_MIN(type) ? load_u16(b + 2) : 0;
        if (Q8P_L_FIVE(type))
                memcpy(&qh, p, 4);
        for (int j = 0; j < 16; j++) {
                u[j] = (uint8_t) ((qs[j] & 15) | ((qh >> j) & 1) << 4);
                u[j + 16] = (uint8_t) ((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        }
}

static bool q8_is_k(uint32_t type) {
        return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K;
}

/* The book of a four-bit format (values the nibbles stand for): IQ4_NL's codebook, Q4_0's q − 8 */
static const int8_t q4_0_values[16] = { -8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7 };
static inline const int8_t *q8_book(uint32_t type) {
        return type == GGML_TYPE_Q4_0 ? q4_0_values : quant_iq4nl_values;
}

/* A stored Q4_K / Q5_K super-block (docs/model.md §6): its 256 unsigned numbers in output order,
 * the 8 blocks' six-bit scales and mins, d and dmin. */
static void kq_unpack(uint32_t type, const uint8_t *b, uint8_t u[QK_K], uint8_t sc[8], uint8_t m[8],
                      uint16_t *d, uint16_t *dmin) {
        const bool five = type == GGML_TYPE_Q5_K;
        const uint8_t *qh = b + 16, *ql = b + (five ? 48 : 16);

        *d = load_u16(b);
        *dmin = load_u16(b + 2);
        for (int j = 0; j < 8; j++)
                k_scale_min(j, b + 4, &sc[j], &m[j]);
        for (int c = 0; c < 4; c++) /* 64 values a 32-byte run: low nibbles block 2c, high 2c + 1 */
                for (int l = 0; l < 32; l++) {
                        uint8_t q0 = ql[32 * c + l] & 15, q1 = ql[32 * c + l] >> 4;
                        if (five) {
                                q0 = (uint8_t) (q0 | ((qh[l] >> (2 * c)) & 1) << 4);
                                q1 = (uint8_t) (q1 | ((qh[l] >> (2 * c + 1)) & 1) << 4);
                        }
                        u[64 * c + l] = q0;
                        u[64 * c + 32 + l] = q1;
                }
}

void quant_q8_pack(uint32_t type, const void *w, size_t row_bytes, size_t R, size_t k,
                   void *packed) {
        const size_t prb = q8p_row_bytes(type, k);
        uint8_t *P = packed;

        assert(quant_q8_supported(type) && row_bytes == prb);
        for (size_t g = 0; g < R; g += Q8P_ROWS) {
                uint8_t *G = P + g * prb;
                if (R - g < Q8P_ROWS) /* the last group's missing rows: zeros (never stored) */
                        memset(G, 0, Q8P_ROWS * prb);
                for (size_t lr = 0; lr < MIN((size_t) Q8P_ROWS, R - g); lr++) {
                        const uint8_t *row = (const uint8_t *) w + (g + lr) * row_bytes;
                        if (q8_is_legacy(type)) {
                                for (size_t b = 0; b < k / 32; b++) {
                                        uint8_t *U = G + b * Q8P_L_UNIT(type), u[32];
                                        uint16_t d, m;
                                        legacy_unpack(type, row + b * (Q8P_L_UNIT(type) / 16), u, &d, &m);
                                        for (int c = 0; c < 4; c++)
                                                for (int i = 0; i < 4; i++) {
                                                        unsigned lo = u[4 * c + i], hi = u[16 + 4 * c + i];
                                                        U[64 * c + 4 * lr + (size_t) i] = (uint8_t) ((lo & 15) | (hi & 15) << 4);
                                                }
                                        for (int i = 0; Q8P_L_FIVE(type) && i < 4; i++) {
                                                unsigned fifth = 0;
                                                for (int c = 0; c < 4; c++)
                                                        fifth |= (u[4 * c + i] >> 4) << c | (u[16 + 4 * c + i] >> 4) << (4 + c);
                                                U[256 + 4 * lr + (size_t) i] = (uint8_t) fifth;
                                        }
                                        memcpy(U + Q8P_L_D(type) + 2 * lr, &d, 2);
                                        if (Q8P_L_MIN(type))
                                                memcpy(U + Q8P_L_M(type) + 2 * lr, &m, 2);
                                }
                        } else if (type == GGML_TYPE_IQ4_XS) {
                                for (size_t s = 0; s < k / QK_K; s++) {
                                        const uint8_t *blk = row + s * 136;
                                        uint8_t *U = G + s * Q8P_XS_UNIT;
                                        uint32_t lo = 0;
                                        uint16_t hi = 0;
                                        for (int j = 0; j < 8; j++) {
                                                for (int c = 0; c < 4; c++)
                                                        memcpy(U + 256 * j + 64 * c + 4 * lr, blk + 8 + 16 * j + 4 * c, 4);
                                                lo |= (uint32_t) (xs_scale(blk, j) & 15) << 4 * j;
                                                hi = (uint16_t) (hi | (xs_scale(blk, j) >> 4) << 2 * j);
                                        }
                                        memcpy(U + Q8P_XS_SCL + 4 * lr, &lo, 4);
                                        memcpy(U + Q8P_XS_SCH + 2 * lr, &hi, 2);
                                        memcpy(U + Q8P_XS_D + 2 * lr, blk, 2);
                                }
                        } else if (q8_is_k(type)) {
                                for (size_t s = 0; s < k / QK_K; s++) {
                                        uint8_t *U = G + s * Q8P_K_UNIT(type), u[QK_K], sc[8], m[8];
                                        uint16_t d, dmin;
                                        kq_unpack(type, row + s * q8p_row_bytes(type, QK_K), u, sc, m, &d, &dmin);
                                        if (Q8P_K_FIVE(type) && lr == 0) /* the fifth bits are or-ed in */
                                                memset(U + Q8P_K_QH, 0, 512);
                                        for (int j = 0; j < 8; j++) {
                                                for (int c = 0; c < 4; c++)
                                                        for (int i = 0; i < 4; i++) {
                                                                unsigned lo = u[32 * j + 4 * c + i], hi = u[32 * j + 16 + 4 * c + i];
                                                                U[256 * j + 64 * c + 4 * lr + (size_t) i] =
                                                                        (uint8_t) ((lo & 15) | (hi & 15) << 4);
                                                                if (Q8P_K_FIVE(type))
                                                                        U[Q8P_K_QH + 64 * j + 4 * lr + (size_t) i] |=
                                                                                (uint8_t) ((lo >> 4) << c | (hi >> 4) << (4 + c));
                                                        }
                                                U[Q8P_K_SC(type) + 16 * j + lr] = (uint8_t) ((sc[j] & 15) | (m[j] & 15) << 4);
                                        }
                                        for (int i = 0; i < 4; i++)
                                                U[Q8P_K_SCH(type) + 4 * lr + (size_t) i] =
                                                        (uint8_t) (sc[2 * i] >> 4 | (m[2 * i] >> 4) << 2 |
                                                                   (sc[2 * i + 1] >> 4) << 4 | (m[2 * i + 1] >> 4) << 6);
                                        memcpy(U + Q8P_K_D(type) + 2 * lr, &d, 2);
                                        memcpy(U + Q8P_K_DMIN(type) + 2 * lr, &dmin, 2);
                                }
                        } else if (type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_Q4_0) {
                                for (size_t b = 0; b < k / 32; b++) {
                                        const struct block_iq4_nl *blk = (const struct block_iq4_nl *) row + b;
                                        uint8_t *U = G + b * Q8P_IQ4_UNIT;
                                        for (int c = 0; c < 4; c++)
                                                memcpy(U + 64 * c + 4 * lr, blk->qs + 4 * c, 4);
                                        memcpy(U + 256 + 2 * lr, &blk->d, 2);
                                }
                        } else if (type == GGML_TYPE_Q8_0) {
                                for (size_t b = 0; b < k / 32; b++) {
                                        const struct block_q8_0 *blk = (const struct block_q8_0 *) row + b;
                                        uint8_t *U = G + b * Q8P_Q8_UNIT;
                                        for (int c = 0; c < 8; c++)
                                                memcpy(U + 64 * c + 4 * lr, blk->qs + 4 * c, 4);
                                        memcpy(U + 512 + 2 * lr, &blk->d, 2);
                                }
                        } else {
                                for (size_t s = 0; s < k / QK_K; s++) {
                                        const struct block_q6_k *blk = (const struct block_q6_k *) row + s;
                                        uint8_t *U = G + s * Q8P_Q6K_UNIT;
                                        int8_t q[QK_K];
                                        q6k_unpack(blk, q);
                                        for (int j = 0; j < 16; j++) {
                                                const int8_t *v = q + 16 * j; /* u = v + 32 */
                                                for (int i = 0; i < 4; i++) {
                                                        unsigned u0 = (unsigned) (v[i] + 32), u1 = (unsigned) (v[4 + i] + 32);
                                                        unsigned u2 = (unsigned) (v[8 + i] + 32), u3 = (unsigned) (v[12 + i] + 32);
                                                        uint8_t *C = U + 192 * j + 4 * lr + i;
                                                        C[0] = (uint8_t) ((u0 & 15) | (u1 & 15) << 4);
                                                        C[64] = (uint8_t) ((u2 & 15) | (u3 & 15) << 4);
                                                        C[128] = (uint8_t) (u0 >> 4 | (u1 >> 4) << 2 | (u2 >> 4) << 4 | (u3 >> 4) << 6);
                                                }
                                                U[Q8P_Q6K_SC + 16 * j + lr] = (uint8_t) blk->scales[q6k_scale_index(j)];
                                        }
                                        memcpy(U + Q8P_Q6K_D + 2 * lr, &blk->d, 2);
                                }
                        }
                }
        }
}

/* Block b of row r of a packed Q4_1 / Q5_0 / Q5_1 matrix: its 32 unsigned numbers, d and m. */
static void q8p_lblock(uint32_t type, const uint8_t *P, size_t k, size_t r, size_t b, uint8_t u[32],
                       float *d, float *m) {
        const size_t lr = r % Q8P_ROWS;
        const uint8_t *U = P + (r - lr) * q8p_row_bytes(type, k) + b * Q8P_L_UNIT(type);
        uint16_t h16, m16 = 0;

        for (int c = 0; c < 4; c++)
                for (int i = 0; i < 4; i++) {
                        unsigned byte = U[64 * c + 4 * lr + (size_t) i];
                        unsigned hb = Q8P_L_FIVE(type) ? U[256 + 4 * lr + (size_t) i] : 0;
                        u[4 * c + i] = (uint8_t) ((byte & 15) | ((hb >> c) & 1) << 4);
                        u[16 + 4 * c + i] = (uint8_t) ((byte >> 4) | ((hb >> (4 + c)) & 1) << 4);
                }
        memcpy(&h16, U + Q8P_L_D(type) + 2 * lr, 2);
        if (Q8P_L_MIN(type))
                memcpy(&m16, U + Q8P_L_M(type) + 2 * lr, 2);
        *d = fp16_to_f32(h16);
        *m = fp16_to_f32(m16);
}

/* Block b of row r of a packed matrix: its 32 integer weights, its two runs' scales (1 but for
 * Q6_K and IQ4_XS) and its d. */
static void q8p_block(uint32_t type, const uint8_t *P, size_t k, size_t r, size_t b, int8_t w[32],
                      int32_t sc[2], float *d) {
        const size_t prb = q8p_row_bytes(type, k);

        sc[0] = sc[1] = 1;
        const uint8_t *G = P + (r - r % Q8P_ROWS) * prb;
        const size_t lr = r % Q8P_ROWS;
        uint16_t h16;
        if (type == GGML_TYPE_IQ4_XS) {
                const uint8_t *U = G + b / 8 * Q8P_XS_UNIT;
                const size_t j = b % 8;
                uint32_t lo;
                uint16_t hi;
                for (int c = 0; c < 4; c++)
                        for (int i = 0; i < 4; i++) {
                                uint8_t byte = U[256 * j + 64 * c + 4 * lr + (size_t) i];
                                w[4 * c + i] = quant_iq4nl_values[byte & 15];
                                w[16 + 4 * c + i] = quant_iq4nl_values[byte >> 4];
                        }
                memcpy(&lo, U + Q8P_XS_SCL + 4 * lr, 4);
                memcpy(&hi, U + Q8P_XS_SCH + 2 * lr, 2);
                sc[0] = sc[1] = (int32_t) (((lo >> 4 * j) & 15) | ((hi >> 2 * j) & 3u) << 4) - 32;
                memcpy(&h16, U + Q8P_XS_D + 2 * lr, 2);
        } else if (type == GGML_TYPE_Q5_0) {
                uint8_t u[32];
                float dl, ml;
                q8p_lblock(type, P, k, r, b, u, &dl, &ml);
                for (int i = 0; i < 32; i++)
                        w[i] = (int8_t) (u[i] - 16);
                *d = dl;
                return;
        } else if (type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_Q4_0) {
                const uint8_t *U = G + b * Q8P_IQ4_UNIT;
                for (int c = 0; c < 4; c++)
                        for (int i = 0; i < 4; i++) {
                                uint8_t byte = U[64 * c + 4 * lr + i];
                                w[4 * c + i] = q8_book(type)[byte & 15];
                                w[16 + 4 * c + i] = q8_book(type)[byte >> 4];
                        }
                memcpy(&h16, U + 256 + 2 * lr, 2);
        } else if (type == GGML_TYPE_Q8_0) {
                const uint8_t *U = G + b * Q8P_Q8_UNIT;
                for (int c = 0; c < 8; c++)
                        memcpy(w + 4 * c, U + 64 * c + 4 * lr, 4);
                memcpy(&h16, U + 512 + 2 * lr, 2);
        } else {
                const uint8_t *U = G + b / 8 * Q8P_Q6K_UNIT;
                for (int h = 0; h < 2; h++) {
                        const int j = (int) (2 * (b % 8)) + h;
                        const uint8_t *C = U + 192 * j + 4 * lr;
                        for (int i = 0; i < 4; i++) {
                                unsigned l0 = C[i], l1 = C[64 + i], hb = C[128 + i];
                                w[16 * h + i] = (int8_t) ((int) ((l0 & 15) | (hb & 3) << 4) - 32);
                                w[16 * h + 4 + i] = (int8_t) ((int) ((l0 >> 4) | ((hb >> 2) & 3) << 4) - 32);
                                w[16 * h + 8 + i] = (int8_t) ((int) ((l1 & 15) | ((hb >> 4) & 3) << 4) - 32);
                                w[16 * h + 12 + i] = (int8_t) ((int) ((l1 >> 4) | (hb >> 6) << 4) - 32);
                        }
                        sc[h] = (int8_t) U[Q8P_Q6K_SC + 16 * j + lr];
                }
                memcpy(&h16, U + Q8P_Q6K_D + 2 * lr, 2);
        }
        *d = fp16_to_f32(h16);
}

/* Block b of row r of a packed Q4_K / Q5_K matrix: its 32 unsigned numbers, its scale and min,
 * and its super-block's d and dmin. */
static void q8p_kblock(uint32_t type, const uint8_t *P, size_t k, size_t r, size_t b, uint8_t u[32],
                       int32_t *sc, int32_t *m, float *d, float *dmin) {
        const size_t prb = q8p_row_bytes(type, k), j = b % 8, lr = r % Q8P_ROWS;
        const uint8_t *U = P + (r - lr) * prb + b / 8 * Q8P_K_UNIT(type);
        uint16_t h16, m16;

        for (int c = 0; c < 4; c++)
                for (int i = 0; i < 4; i++) {
                        unsigned byte = U[256 * j + 64 * c + 4 * lr + (size_t) i];
                        unsigned hb = Q8P_K_FIVE(type) ? U[Q8P_K_QH + 64 * j + 4 * lr + (size_t) i] : 0;
                        u[4 * c + i] = (uint8_t) ((byte & 15) | ((hb >> c) & 1) << 4);
                        u[16 + 4 * c + i] = (uint8_t) ((byte >> 4) | ((hb >> (4 + c)) & 1) << 4);
                }
        unsigned lo = U[Q8P_K_SC(type) + 16 * j + lr], hi = U[Q8P_K_SCH(type) + 4 * lr + j / 2] >> (4 * (j % 2));
        *sc = (int32_t) ((lo & 15) | (hi & 3) << 4);
        *m = (int32_t) ((lo >> 4) | ((hi >> 2) & 3) << 4);
        memcpy(&h16, U + Q8P_K_D(type) + 2 * lr, 2);
        memcpy(&m16, U + Q8P_K_DMIN(type) + 2 * lr, 2);
        *d = fp16_to_f32(h16);
        *dmin = fp16_to_f32(m16);
}

static float q8p_dot_ref(uint32_t type, const uint8_t *P, size_t k, size_t r,
                         const uint8_t *xq) {
        const int8_t *q = (const int8_t *) xq;
        const float *dx = Q8_DX(xq, k);
        const int32_t *sums = Q8_SUMS(xq, k);
        float acc = 0.0f;

        if (type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1) { /* quant.h: d's fma, then m's */
                for (size_t b = 0; b < k / 32; b++) {
                        uint8_t u[32];
                        int32_t S = 0;
                        float d, m;
                        q8p_lblock(type, P, k, r, b, u, &d, &m);
                        for (int i = 0; i < 32; i++)
                                S += (int32_t) u[i] * q[32 * b + (size_t) i];
                        acc = fmaf((float) S, d * dx[b], acc);
                        acc = fmaf((float) (sums[2 * b] + sums[2 * b + 1]), m * dx[b], acc);
                }
                return acc;
        }
        if (q8_is_k(type)) { /* quant.h: the scale's fma, then the min's */
                for (size_t b = 0; b < k / 32; b++) {
                        uint8_t u[32];
                        int32_t sc, m, S = 0;
                        float d, dmin;
                        q8p_kblock(type, P, k, r, b, u, &sc, &m, &d, &dmin);
                        for (int i = 0; i < 32; i++)
                                S += (int32_t) u[i] * q[32 * b + (size_t) i];
                        acc = fmaf((float) (sc * S), d * dx[b], acc);
                        acc = fmaf(-(float) (m * (sums[2 * b] + sums[2 * b + 1])), dmin * dx[b], acc);
                }
                return acc;
        }
        for (size_t b = 0; b < k / 32; b++) {
                int8_t w[32];
                int32_t sc[2], L[2] = { 0, 0 };
                float d;

                q8p_block(type, P, k, r, b, w, sc, &d);
                for (int i = 0; i < 32; i++)
                        L[i / 16] += (int32_t) w[i] * q[32 * b + (size_t) i];
                float s = d * dx[b];
                acc = fmaf((float) (sc[0] * L[0] + sc[1] * L[1]), s, acc);
        }
        return acc;
}

static void gemm_q8_generic(uint32_t type, const uint8_t *P, size_t k, size_t r0,
                            size_t r1, const uint8_t *xq, size_t xs, size_t T, float *y,
                            size_t ys) {
        for (size_t t = 0; t < T; t++)
                for (size_t r = r0; r < r1; r++)
                        y[t * ys + r - r0] = q8p_dot_ref(type, P, k, r, xq + t * xs);
}

#ifdef HAVE_X86_SIMD
/* The same sums with AVX-512 VNNI, 16 rows a register: one vpdpbusd multiplies 4 consecutive
 * weights of each of the 16 rows (unsigned: IQ4_NL's codebook + 128, Q8_0's values + 128,
 * Q6_K's six-bit numbers) with the same 4 q (signed, broadcast), its accumulator started at the
 * offset's share (-128·Σq of the block, -32·Σq of the run), so each lane holds a row's exact
 * integer sum. Then per row one fma a block, as in the portable definition. */
#define Q8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")))
/* the conversions: any AVX-512 CPU */
#define Q8_CONV_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c,fma")))

/* the IQ4_NL codebook + 128, as unsigned bytes; Q4_0's q − 8 + 128 */
static const uint8_t q8_book_u8[16] = { 1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241 };
static const uint8_t q8_q4_0_u8[16] = { 120, 121, 122, 123, 124, 125, 126, 127, 128, 129, 130, 131, 132, 133, 134, 135 };

/* 4 q of input t's block run, broadcast */
#define Q8_BCAST(p)                                                                                \
        ({                                                                                         \
                int32_t _v;                                                                        \
                memcpy(&_v, (p), 4);                                                               \
                _mm512_set1_epi32(_v);                                                             \
        })

/* a + Σ_i w_i·q_i over a block's 32 values for each of 16 rows (w: 8 registers of 4 consecutive
 * unsigned weights a row, q the block's 32 signed q8 values), in two chains */
Q8_TARGET static inline __attribute__((always_inline)) __m512i q8_dot32_vnni(__m512i a, const __m512i w[8],
                                                                            const int8_t *qb) {
        __m512i a1 = _mm512_setzero_si512();
        a = _mm512_dpbusd_epi32(a, w[0], Q8_BCAST(qb));
        a1 = _mm512_dpbusd_epi32(a1, w[1], Q8_BCAST(qb + 4));
        a = _mm512_dpbusd_epi32(a, w[2], Q8_BCAST(qb + 8));
        a1 = _mm512_dpbusd_epi32(a1, w[3], Q8_BCAST(qb + 12));
        a = _mm512_dpbusd_epi32(a, w[4], Q8_BCAST(qb + 16));
        a1 = _mm512_dpbusd_epi32(a1, w[5], Q8_BCAST(qb + 20));
        a = _mm512_dpbusd_epi32(a, w[6], Q8_BCAST(qb + 24));
        a1 = _mm512_dpbusd_epi32(a1, w[7], Q8_BCAST(qb + 28));
        return _mm512_add_epi32(a, a1);
}

/* A block's 4 chunks of 16 rows' nibbles (the IQ4_NL layout at C): w[c] the low nibbles of chunk
 * c, w[4 + c] the high ones, through the book (a pshufb table) or as they are */
Q8_TARGET static inline __attribute__((always_inline)) void q8_nibbles_vnni(const uint8_t *C, bool through,
                                                                           __m512i book, __m512i w[8]) {
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        for (int o = 0; o < 256; o += 64)
                _mm_prefetch((const char *) C + GEMV_PREFETCH + o, _MM_HINT_T0);
        UNROLL for (int c = 0; c < 4; c++) {
                __m512i v = _mm512_loadu_si512(C + 64 * c);
                w[c] = _mm512_and_si512(v, m4);
                w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (through) {
                        w[c] = _mm512_shuffle_epi8(book, w[c]);
                        w[c + 4] = _mm512_shuffle_epi8(book, w[c + 4]);
                }
        }
}

/* The fifth bits of a block's 16 rows (a 64-byte chunk at H, row r's byte i at 4r + i: bit c for
 * w[c]'s byte i, bit 4 + c for w[4 + c]'s) or-ed into bit 4 of the nibbles in w */
Q8_TARGET static inline __attribute__((always_inline)) void q8_fifth_vnni(const uint8_t *H, __m512i w[8]) {
        const __m512i b4 = _mm512_set1_epi8(0x10), h = _mm512_loadu_si512(H);
        w[0] = _mm512_or_si512(w[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), b4));
        w[1] = _mm512_or_si512(w[1], _mm512_and_si512(_mm512_slli_epi16(h, 3), b4));
        w[2] = _mm512_or_si512(w[2], _mm512_and_si512(_mm512_slli_epi16(h, 2), b4));
        w[3] = _mm512_or_si512(w[3], _mm512_and_si512(_mm512_slli_epi16(h, 1), b4));
        w[4] = _mm512_or_si512(w[4], _mm512_and_si512(h, b4));
        w[5] = _mm512_or_si512(w[5], _mm512_and_si512(_mm512_srli_epi16(h, 1), b4));
        w[6] = _mm512_or_si512(w[6], _mm512_and_si512(_mm512_srli_epi16(h, 2), b4));
        w[7] = _mm512_or_si512(w[7], _mm512_and_si512(_mm512_srli_epi16(h, 3), b4));
}

/* acc[t] (lanes: the group's 16 rows) = the outputs of group G for NT inputs */
Q8_TARGET static inline __attribute__((always_inline)) void
q8p_group(const int NT, const uint32_t type, const uint8_t *G, size_t k, const uint8_t *xq,
          size_t xs, __m512 acc[8]) {
        const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
        const __m512i b128 = _mm512_set1_epi8((char) 0x80);
        const __m512i book = _mm512_broadcast_i32x4(
                _mm_loadu_si128((const __m128i *) (type == GGML_TYPE_Q4_0 ? q8_q4_0_u8 : q8_book_u8)));
        const int8_t *q[8];
        const float *dx[8];
        const int32_t *sums[8];

        UNROLL for (int t = 0; t < NT; t++) {
                acc[t] = _mm512_setzero_ps();
                q[t] = (const int8_t *) (xq + t * xs);
                dx[t] = Q8_DX(xq + t * xs, k);
                sums[t] = Q8_SUMS(xq + t * xs, k);
        }
        if (type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0) {
                const size_t unit = type == GGML_TYPE_Q8_0 ? Q8P_Q8_UNIT : Q8P_IQ4_UNIT;
                for (size_t b = 0; b < k / 32; b++) {
                        const uint8_t *U = G + b * unit;
                        __m512i w[8];
                        __m512 d;
                        for (size_t o = 0; o < unit; o += 64)
                                _mm_prefetch((const char *) U + GEMV_PREFETCH + o, _MM_HINT_T0);
                        if (type != GGML_TYPE_Q8_0) {
                                UNROLL for (int c = 0; c < 4; c++) {
                                        __m512i v = _mm512_loadu_si512(U + 64 * c);
                                        w[c] = _mm512_shuffle_epi8(book, _mm512_and_si512(v, m4));
                                        w[c + 4] = _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                                }
                                d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (U + 256)));
                        } else {
                                _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++)
                                        w[c] = _mm512_xor_si512(_mm512_loadu_si512(U + 64 * c), b128);
                                d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (U + 512)));
                        }
                        UNROLL for (int t = 0; t < NT; t++) {
                                __m512i L = q8_dot32_vnni(_mm512_set1_epi32(-128 * (sums[t][2 * b] + sums[t][2 * b + 1])),
                                                          w, q[t] + 32 * b);
                                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(L), _mm512_mul_ps(d, _mm512_set1_ps(dx[t][b])),
                                                         acc[t]);
                        }
                }
                return;
        }
        if (q8_is_legacy(type)) { /* unsigned numbers; Q5_0's offset 16, the others' m as its own term */
                for (size_t b = 0; b < k / 32; b++) {
                        const uint8_t *U = G + b * Q8P_L_UNIT(type);
                        __m512i w[8];
                        for (int o = 256; o < Q8P_L_UNIT(type); o += 64)
                                _mm_prefetch((const char *) U + GEMV_PREFETCH + o, _MM_HINT_T0);
                        q8_nibbles_vnni(U, false, book, w);
                        if (Q8P_L_FIVE(type))
                                q8_fifth_vnni(U + 256, w);
                        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (U + Q8P_L_D(type))));
                        const __m512 m = Q8P_L_MIN(type) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (U + Q8P_L_M(type))))
                                                        : _mm512_setzero_ps();
                        UNROLL for (int t = 0; t < NT; t++) {
                                const int32_t S = sums[t][2 * b] + sums[t][2 * b + 1];
                                const __m512 x = _mm512_set1_ps(dx[t][b]);
                                __m512i L = q8_dot32_vnni(_mm512_set1_epi32(Q8P_L_MIN(type) ? 0 : -16 * S), w, q[t] + 32 * b);
                                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(L), _mm512_mul_ps(d, x), acc[t]);
                                if (Q8P_L_MIN(type))
                                        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps((float) S), _mm512_mul_ps(m, x), acc[t]);
                        }
                }
                return;
        }
        if (type == GGML_TYPE_IQ4_XS) { /* IQ4_NL's sums, times the block's ls − 32 */
                const __m512i m3 = _mm512_set1_epi32(3), m15 = _mm512_set1_epi32(15), o32 = _mm512_set1_epi32(32);
                for (size_t s = 0; s < k / QK_K; s++) {
                        const uint8_t *U = G + s * Q8P_XS_UNIT;
                        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (U + Q8P_XS_D)));
                        const __m512i lo = _mm512_loadu_si512(U + Q8P_XS_SCL);
                        const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *) (U + Q8P_XS_SCH)));
                        for (int j = 0; j < 8; j++) {
                                const size_t b = 8 * s + (size_t) j;
                                __m512i w[8];
                                q8_nibbles_vnni(U + 256 * j, true, book, w);
                                const __m512i sc = _mm512_sub_epi32(
                                        _mm512_or_si512(_mm512_and_si512(_mm512_srl_epi32(lo, _mm_cvtsi32_si128(4 * j)), m15),
                                                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(hi, _mm_cvtsi32_si128(2 * j)), m3), 4)),
                                        o32);
                                UNROLL for (int t = 0; t < NT; t++) {
                                        __m512i L = q8_dot32_vnni(_mm512_set1_epi32(-128 * (sums[t][2 * b] + sums[t][2 * b + 1])),
                                                                  w, q[t] + 32 * b);
                                        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(L, sc)),
                                                                 _mm512_mul_ps(d, _mm512_set1_ps(dx[t][b])), acc[t]);
                                }
                        }
                }
                return;
        }
        if (q8_is_k(type)) { /* unsigned numbers: no offset; the min's term from the runs' sums */
                const __m512i m3 = _mm512_set1_epi32(3), m15 = _mm512_set1_epi32(15);
                for (size_t s = 0; s < k / QK_K; s++) {
                        const uint8_t *U = G + s * Q8P_K_UNIT(type);
                        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (U + Q8P_K_D(type))));
                        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (U + Q8P_K_DMIN(type))));
                        const __m512i hi = _mm512_loadu_si512(U + Q8P_K_SCH(type));
                        for (int j = 0; j < 8; j++) {
                                const size_t b = 8 * s + (size_t) j;
                                __m512i w[8];
                                q8_nibbles_vnni(U + 256 * j, false, book, w);
                                if (Q8P_K_FIVE(type))
                                        q8_fifth_vnni(U + Q8P_K_QH + 64 * j, w);
                                const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *) (U + Q8P_K_SC(type) + 16 * j)));
                                const __m512i top = _mm512_srl_epi32(hi, _mm_cvtsi32_si128(8 * (j / 2) + 4 * (j % 2)));
                                const __m512i sc = _mm512_or_si512(_mm512_and_si512(lo, m15),
                                                                   _mm512_slli_epi32(_mm512_and_si512(top, m3), 4));
                                const __m512i mn = _mm512_or_si512(_mm512_srli_epi32(lo, 4),
                                                                   _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(top, 2), m3), 4));
                                UNROLL for (int t = 0; t < NT; t++) {
                                        const __m512 x = _mm512_set1_ps(dx[t][b]);
                                        __m512i L = _mm512_mullo_epi32(q8_dot32_vnni(_mm512_setzero_si512(), w, q[t] + 32 * b), sc);
                                        __m512i M = _mm512_mullo_epi32(_mm512_set1_epi32(sums[t][2 * b] + sums[t][2 * b + 1]), mn);
                                        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(L), _mm512_mul_ps(d, x), acc[t]);
                                        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(dmin, x), acc[t]);
                                }
                        }
                }
                return;
        }
        for (size_t s = 0; s < k / QK_K; s++) { /* Q6_K */
                const uint8_t *U = G + s * Q8P_Q6K_UNIT;
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (U + Q8P_Q6K_D)));
                for (int jb = 0; jb < 8; jb++) {
                        const size_t b = 8 * s + (size_t) jb;
                        __m512i L[8];
                        UNROLL for (int t = 0; t < NT; t++)
                                L[t] = _mm512_setzero_si512();
                        for (int h = 0; h < 2; h++) {
                                const int j = 2 * jb + h;
                                const uint8_t *C = U + 192 * j;
                                for (int o = 0; o < 192; o += 64)
                                        _mm_prefetch((const char *) C + GEMV_PREFETCH + o, _MM_HINT_T0);
                                __m512i l0 = _mm512_loadu_si512(C), l1 = _mm512_loadu_si512(C + 64);
                                __m512i hb = _mm512_loadu_si512(C + 128);
                                __m512i w0 = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
                                __m512i w1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30));
                                __m512i w2 = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(hb, m30));
                                __m512i w3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30));
                                __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) (U + Q8P_Q6K_SC + 16 * j)));
                                UNROLL for (int t = 0; t < NT; t++) {
                                        const int8_t *qr = q[t] + QK_K * s + 16 * (size_t) j;
                                        __m512i a0 = _mm512_set1_epi32(-32 * sums[t][16 * s + (size_t) j]);
                                        __m512i a1 = _mm512_setzero_si512();
                                        a0 = _mm512_dpbusd_epi32(a0, w0, Q8_BCAST(qr));
                                        a1 = _mm512_dpbusd_epi32(a1, w1, Q8_BCAST(qr + 4));
                                        a0 = _mm512_dpbusd_epi32(a0, w2, Q8_BCAST(qr + 8));
                                        a1 = _mm512_dpbusd_epi32(a1, w3, Q8_BCAST(qr + 12));
                                        L[t] = _mm512_add_epi32(L[t], _mm512_mullo_epi32(_mm512_add_epi32(a0, a1), sc));
                                }
                        }
                        UNROLL for (int t = 0; t < NT; t++)
                                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(L[t]),
                                                         _mm512_mul_ps(d, _mm512_set1_ps(dx[t][b])), acc[t]);
                }
        }
}

/* inputs a pass over a group's weights serves (Q8_0's 8 weight registers leave room for 4) */
#define Q8P_NT(TYPE) ((TYPE) == GGML_TYPE_Q8_0 ? 4 : 8)
/* rows [r0, r1): whole groups 16 rows a register, Q8P_NT inputs at a time (a group's weights
 * are decoded once for them); a group cut by r0 or r1 is computed whole and stored in part */
/* The packed formats but Q6_K (each kernel's default case), as switch cases of DRIVE(type): one
 * list, so a format added to the packing reaches the VNNI and the AVX2 kernels alike */
#define Q8P_EACH_TYPE(DRIVE)                                                                       \
        case GGML_TYPE_IQ4_NL: DRIVE(GGML_TYPE_IQ4_NL) break;                                      \
        case GGML_TYPE_Q4_0: DRIVE(GGML_TYPE_Q4_0) break;                                          \
        case GGML_TYPE_Q8_0: DRIVE(GGML_TYPE_Q8_0) break;                                          \
        case GGML_TYPE_Q4_K: DRIVE(GGML_TYPE_Q4_K) break;                                          \
        case GGML_TYPE_Q5_K: DRIVE(GGML_TYPE_Q5_K) break;                                          \
        case GGML_TYPE_IQ4_XS: DRIVE(GGML_TYPE_IQ4_XS) break;                                      \
        case GGML_TYPE_Q4_1: DRIVE(GGML_TYPE_Q4_1) break;                                          \
        case GGML_TYPE_Q5_0: DRIVE(GGML_TYPE_Q5_0) break;                                          \
        case GGML_TYPE_Q5_1: DRIVE(GGML_TYPE_Q5_1) break;

#define Q8P_DRIVE(TYPE)                                                                            \
        for (size_t g = r0 - r0 % Q8P_ROWS; g < r1; g += Q8P_ROWS) {                               \
                const uint8_t *G = P + g * prb;                                                    \
                const size_t a = MAX(r0, g), e = MIN(r1, g + Q8P_ROWS);                            \
                for (size_t t = 0; t < T; t += Q8P_NT(TYPE)) {                                     \
                        const size_t nt = MIN((size_t) Q8P_NT(TYPE), T - t);                       \
                        const uint8_t *xt = xq + t * xs;                                           \
                        __m512 acc[8];                                                             \
                        switch (nt) {                                                              \
                        case 1: q8p_group(1, TYPE, G, k, xt, xs, acc); break;                      \
                        case 2: q8p_group(2, TYPE, G, k, xt, xs, acc); break;                      \
                        case 3: q8p_group(3, TYPE, G, k, xt, xs, acc); break;                      \
                        case 4: q8p_group(4, TYPE, G, k, xt, xs, acc); break;                      \
                        case 5: q8p_group(5, TYPE, G, k, xt, xs, acc); break;                      \
                        case 6: q8p_group(6, TYPE, G, k, xt, xs, acc); break;                      \
                        case 7: q8p_group(7, TYPE, G, k, xt, xs, acc); break;                      \
                        default: q8p_group(8, TYPE, G, k, xt, xs, acc); break;                     \
                        }                                                                          \
                        for (size_t u = 0; u < nt; u++) {                                          \
                                float *yo = y + (t + u) * ys;                                      \
                                if (a == g && e == g + Q8P_ROWS) {                                 \
                                        _mm512_storeu_ps(yo + (g - r0), acc[u]);                   \
                                } else {                                                           \
                                        float l[16];                                               \
                                        _mm512_storeu_ps(l, acc[u]);                               \
                                        for (size_t r = a; r < e; r++)                             \
                                                yo[r - r0] = l[r - g];                             \
                                }                                                                  \
                        }                                                                          \
                }                                                                                  \
        }

Q8_TARGET static void gemm_q8_vnni(uint32_t type, const uint8_t *P, size_t R, size_t k, size_t r0,
                                   size_t r1, const uint8_t *xq, size_t xs, size_t T, float *y,
                                   size_t ys) {
        const size_t prb = q8p_row_bytes(type, k);

        (void) R;
        assert(r1 <= R); /* the last group padded (quant_q8_pack) */

        switch (type) {
                Q8P_EACH_TYPE(Q8P_DRIVE)
        default: Q8P_DRIVE(GGML_TYPE_Q6_K) break;
        }
}

/* The same sums with AVX2 (no AVX-512 VNNI), 8 rows a register: a 64-byte chunk's first 32
 * bytes are rows 0-7 of the group, the last 32 rows 8-15, each half its own pass. Signed weights
 * (IQ4_NL's codebook, Q8_0) take the sign trick (|w| times q with w's sign: vpmaddubsw pairs of at
 * most 2·128·127 fit int16), Q6_K's six-bit numbers multiply directly (its offset as above);
 * vpmaddwd with ones then gives the 4-value sums, all exact. */
#define Q8_AVX2_TARGET __attribute__((target("avx2,f16c,fma")))

#define Q8_BCAST256(p)                                                                             \
        ({                                                                                         \
                int32_t _v;                                                                        \
                memcpy(&_v, (p), 4);                                                               \
                _mm256_set1_epi32(_v);                                                             \
        })

/* Σ over 4-value groups of w·q, added to acc (w signed) */
Q8_AVX2_TARGET static inline __m256i q8_dot_signed(__m256i acc, __m256i w, __m256i q) {
        const __m256i ones = _mm256_set1_epi16(1);
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w),
                                                                             _mm256_sign_epi8(q, w)), ones));
}

/* w unsigned, below 128 */
Q8_AVX2_TARGET static inline __m256i q8_dot_unsigned(__m256i acc, __m256i w, __m256i q) {
        const __m256i ones = _mm256_set1_epi16(1);
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), ones));
}

/* a[t][0] += Σ over block b's first 16 values of w·q, a[t][1] the last 16, for NT <= 2 inputs and
 * 8 rows (C: their 4 chunks of nibbles, 64 bytes apart; w the book's entries, signed) */
Q8_AVX2_TARGET static inline __attribute__((always_inline)) void
q8_book_block_avx2(const int NT, const uint8_t *C, __m256i book, const uint8_t *xq, size_t xs, size_t b,
                   __m256i a[2][2]) {
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        for (int c = 0; c < 4; c++) {
                __m256i v = _mm256_loadu_si256((const __m256i *) (C + 64 * c));
                __m256i wl = _mm256_shuffle_epi8(book, _mm256_and_si256(v, m4));
                __m256i wh = _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
                UNROLL for (int t = 0; t < NT; t++) {
                        const int8_t *qb = (const int8_t *) (xq + t * xs) + 32 * b;
                        a[t][0] = q8_dot_signed(a[t][0], wl, Q8_BCAST256(qb + 4 * c));
                        a[t][1] = q8_dot_signed(a[t][1], wh, Q8_BCAST256(qb + 16 + 4 * c));
                }
        }
}

/* The same for unsigned four- or five-bit numbers (H: their fifth bits as q8_fifth_vnni's, NULL
 * for none) */
Q8_AVX2_TARGET static inline __attribute__((always_inline)) void
q8_unsigned_block_avx2(const int NT, const uint8_t *C, const uint8_t *H, const uint8_t *xq, size_t xs,
                       size_t b, __m256i a[2][2]) {
        const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
        const __m256i h = H ? _mm256_loadu_si256((const __m256i *) H) : _mm256_setzero_si256();
        UNROLL for (int c = 0; c < 4; c++) {
                __m256i v = _mm256_loadu_si256((const __m256i *) (C + 64 * c));
                __m256i wl = _mm256_and_si256(v, m4);
                __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (H) { /* bit c to bit 4; bit 4 + c to bit 4 */
                        wl = _mm256_or_si256(wl, _mm256_and_si256(_mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - c)), b4));
                        wh = _mm256_or_si256(wh, _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(c)), b4));
                }
                UNROLL for (int t = 0; t < NT; t++) {
                        const int8_t *qb = (const int8_t *) (xq + t * xs) + 32 * b;
                        a[t][0] = q8_dot_unsigned(a[t][0], wl, Q8_BCAST256(qb + 4 * c));
                        a[t][1] = q8_dot_unsigned(a[t][1], wh, Q8_BCAST256(qb + 16 + 4 * c));
                }
        }
}

/* acc[t] (lanes: rows 8·half .. 8·half + 7 of the group) for NT <= 2 inputs */
Q8_AVX2_TARGET static inline __attribute__((always_inline)) void
q8p_half_avx2(const int NT, const uint32_t type, const uint8_t *G, size_t k, int half,
              const uint8_t *xq, size_t xs, __m256 acc[2]) {
        const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
        const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) q8_book(type)));
        const size_t ho = 32 * (size_t) half;

        UNROLL for (int t = 0; t < NT; t++)
                acc[t] = _mm256_setzero_ps();
        if (type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0) {
                const size_t unit = type == GGML_TYPE_Q8_0 ? Q8P_Q8_UNIT : Q8P_IQ4_UNIT;
                for (size_t b = 0; b < k / 32; b++) {
                        const uint8_t *U = G + b * unit;
                        __m256 d;
                        /* two chains an input (the integer sums are exact, so any split is) */
                        __m256i a[2][2] = { { _mm256_setzero_si256(), _mm256_setzero_si256() },
                                            { _mm256_setzero_si256(), _mm256_setzero_si256() } };
                        for (size_t o = 0; o < unit; o += 64)
                                _mm_prefetch((const char *) U + GEMV_PREFETCH + o, _MM_HINT_T0);
                        if (type != GGML_TYPE_Q8_0) {
                                q8_book_block_avx2(NT, U + ho, book, xq, xs, b, a);
                                d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (U + 256 + 16 * half)));
                        } else {
                                for (int c = 0; c < 8; c++) {
                                        __m256i wv = _mm256_loadu_si256((const __m256i *) (U + 64 * c + ho));
                                        UNROLL for (int t = 0; t < NT; t++) {
                                                const int8_t *qb = (const int8_t *) (xq + t * xs) + 32 * b;
                                                a[t][c % 2] = q8_dot_signed(a[t][c % 2], wv, Q8_BCAST256(qb + 4 * c));
                                        }
                                }
                                d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (U + 512 + 16 * half)));
                        }
                        UNROLL for (int t = 0; t < NT; t++)
                                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(a[t][0], a[t][1])),
                                                         _mm256_mul_ps(d, _mm256_set1_ps(Q8_DX(xq + t * xs, k)[b])), acc[t]);
                }
                return;
        }
        if (q8_is_legacy(type)) {
                for (size_t b = 0; b < k / 32; b++) {
                        const uint8_t *U = G + b * Q8P_L_UNIT(type);
                        __m256i a[2][2] = { { _mm256_setzero_si256(), _mm256_setzero_si256() },
                                            { _mm256_setzero_si256(), _mm256_setzero_si256() } };
                        for (int o = 0; o < Q8P_L_UNIT(type); o += 64)
                                _mm_prefetch((const char *) U + GEMV_PREFETCH + o, _MM_HINT_T0);
                        q8_unsigned_block_avx2(NT, U + ho, Q8P_L_FIVE(type) ? U + 256 + ho : NULL, xq, xs, b, a);
                        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (U + Q8P_L_D(type) + 16 * half)));
                        const __m256 m = Q8P_L_MIN(type) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (U + Q8P_L_M(type) + 16 * half)))
                                                        : _mm256_setzero_ps();
                        UNROLL for (int t = 0; t < NT; t++) {
                                const int32_t *sums = Q8_SUMS(xq + t * xs, k);
                                const int32_t S = sums[2 * b] + sums[2 * b + 1];
                                const __m256 x = _mm256_set1_ps(Q8_DX(xq + t * xs, k)[b]);
                                __m256i L = _mm256_add_epi32(_mm256_add_epi32(a[t][0], a[t][1]),
                                                             _mm256_set1_epi32(Q8P_L_MIN(type) ? 0 : -16 * S));
                                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(L), _mm256_mul_ps(d, x), acc[t]);
                                if (Q8P_L_MIN(type))
                                        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps((float) S), _mm256_mul_ps(m, x), acc[t]);
                        }
                }
                return;
        }
        if (type == GGML_TYPE_IQ4_XS) {
                const __m256i m3 = _mm256_set1_epi32(3), m15 = _mm256_set1_epi32(15), o32 = _mm256_set1_epi32(32);
                for (size_t s = 0; s < k / QK_K; s++) {
                        const uint8_t *U = G + s * Q8P_XS_UNIT;
                        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (U + Q8P_XS_D + 16 * half)));
                        const __m256i lo = _mm256_loadu_si256((const __m256i *) (U + Q8P_XS_SCL + ho));
                        const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *) (U + Q8P_XS_SCH + 16 * half)));
                        for (int j = 0; j < 8; j++) {
                                const size_t b = 8 * s + (size_t) j;
                                const uint8_t *C = U + 256 * j;
                                __m256i a[2][2] = { { _mm256_setzero_si256(), _mm256_setzero_si256() },
                                                    { _mm256_setzero_si256(), _mm256_setzero_si256() } };
                                for (int o = 0; o < 256; o += 64)
                                        _mm_prefetch((const char *) C + GEMV_PREFETCH + o, _MM_HINT_T0);
                                q8_book_block_avx2(NT, C + ho, book, xq, xs, b, a);
                                const __m256i sc = _mm256_sub_epi32(
                                        _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi32(lo, _mm_cvtsi32_si128(4 * j)), m15),
                                                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(hi, _mm_cvtsi32_si128(2 * j)), m3), 4)),
                                        o32);
                                UNROLL for (int t = 0; t < NT; t++) {
                                        __m256i L = _mm256_mullo_epi32(_mm256_add_epi32(a[t][0], a[t][1]), sc);
                                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(L),
                                                                 _mm256_mul_ps(d, _mm256_set1_ps(Q8_DX(xq + t * xs, k)[b])), acc[t]);
                                }
                        }
                }
                return;
        }
        if (q8_is_k(type)) {
                const __m256i m3 = _mm256_set1_epi32(3), m15 = _mm256_set1_epi32(15);
                for (size_t s = 0; s < k / QK_K; s++) {
                        const uint8_t *U = G + s * Q8P_K_UNIT(type);
                        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (U + Q8P_K_D(type) + 16 * half)));
                        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (U + Q8P_K_DMIN(type) + 16 * half)));
                        const __m256i hi = _mm256_loadu_si256((const __m256i *) (U + Q8P_K_SCH(type) + ho));
                        for (int j = 0; j < 8; j++) {
                                const size_t b = 8 * s + (size_t) j;
                                const uint8_t *C = U + 256 * j;
                                __m256i a[2][2] = { { _mm256_setzero_si256(), _mm256_setzero_si256() },
                                                    { _mm256_setzero_si256(), _mm256_setzero_si256() } };
                                for (int o = 0; o < 256; o += 64)
                                        _mm_prefetch((const char *) C + GEMV_PREFETCH + o, _MM_HINT_T0);
                                q8_unsigned_block_avx2(NT, C + ho, Q8P_K_FIVE(type) ? U + Q8P_K_QH + 64 * j + ho : NULL, xq, xs, b, a);
                                const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) (U + Q8P_K_SC(type) + 16 * j + 8 * half)));
                                const __m256i top = _mm256_srl_epi32(hi, _mm_cvtsi32_si128(8 * (j / 2) + 4 * (j % 2)));
                                const __m256i sc = _mm256_or_si256(_mm256_and_si256(lo, m15),
                                                                   _mm256_slli_epi32(_mm256_and_si256(top, m3), 4));
                                const __m256i mn = _mm256_or_si256(_mm256_srli_epi32(lo, 4),
                                                                   _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(top, 2), m3), 4));
                                UNROLL for (int t = 0; t < NT; t++) {
                                        const int32_t *sums = Q8_SUMS(xq + t * xs, k);
                                        const __m256 x = _mm256_set1_ps(Q8_DX(xq + t * xs, k)[b]);
                                        __m256i L = _mm256_mullo_epi32(_mm256_add_epi32(a[t][0], a[t][1]), sc);
                                        __m256i M = _mm256_mullo_epi32(_mm256_set1_epi32(sums[2 * b] + sums[2 * b + 1]), mn);
                                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(L), _mm256_mul_ps(d, x), acc[t]);
                                        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(dmin, x), acc[t]);
                                }
                        }
                }
                return;
        }
        for (size_t s = 0; s < k / QK_K; s++) { /* Q6_K */
                const uint8_t *U = G + s * Q8P_Q6K_UNIT;
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (U + Q8P_Q6K_D + 16 * half)));
                for (int jb = 0; jb < 8; jb++) {
                        const size_t b = 8 * s + (size_t) jb;
                        __m256i L[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
                        for (int h = 0; h < 2; h++) {
                                const int j = 2 * jb + h;
                                const uint8_t *C = U + 192 * j;
                                for (int o = 0; o < 192; o += 64)
                                        _mm_prefetch((const char *) C + GEMV_PREFETCH + o, _MM_HINT_T0);
                                __m256i l0 = _mm256_loadu_si256((const __m256i *) (C + ho));
                                __m256i l1 = _mm256_loadu_si256((const __m256i *) (C + 64 + ho));
                                __m256i hb = _mm256_loadu_si256((const __m256i *) (C + 128 + ho));
                                __m256i w[4] = {
                                        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)),
                                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
                                        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(hb, m30)),
                                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30)),
                                };
                                __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (U + Q8P_Q6K_SC + 16 * j + 8 * half)));
                                UNROLL for (int t = 0; t < NT; t++) {
                                        const int8_t *qr = (const int8_t *) (xq + t * xs) + QK_K * s + 16 * (size_t) j;
                                        __m256i a0 = _mm256_set1_epi32(-32 * Q8_SUMS(xq + t * xs, k)[16 * s + (size_t) j]);
                                        __m256i a1 = _mm256_setzero_si256();
                                        a0 = q8_dot_unsigned(a0, w[0], Q8_BCAST256(qr));
                                        a1 = q8_dot_unsigned(a1, w[1], Q8_BCAST256(qr + 4));
                                        a0 = q8_dot_unsigned(a0, w[2], Q8_BCAST256(qr + 8));
                                        a1 = q8_dot_unsigned(a1, w[3], Q8_BCAST256(qr + 12));
                                        L[t] = _mm256_add_epi32(L[t], _mm256_mullo_epi32(_mm256_add_epi32(a0, a1), sc));
                                }
                        }
                        UNROLL for (int t = 0; t < NT; t++)
                                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(L[t]),
                                                         _mm256_mul_ps(d, _mm256_set1_ps(Q8_DX(xq + t * xs, k)[b])), acc[t]);
                }
        }
}

#define Q8P_DRIVE_AVX2(TYPE)                                                                       \
        for (size_t g = r0 - r0 % Q8P_ROWS; g < r1; g += Q8P_ROWS) {                               \
                const uint8_t *G = P + g * prb;                                                    \
                const size_t a = MAX(r0, g), e = MIN(r1, g + Q8P_ROWS);                            \
                for (int half = 0; half < 2; half++) {                                             \
                        const size_t h0 = g + 8 * (size_t) half;                                   \
                        if (h0 + 8 <= a || h0 >= e)                                                \
                                continue;                                                          \
                        for (size_t t = 0; t < T; t += 2) {                                        \
                                const size_t nt = MIN((size_t) 2, T - t);                          \
                                __m256 acc[2];                                                     \
                                if (nt == 2)                                                       \
                                        q8p_half_avx2(2, TYPE, G, k, half, xq + t * xs, xs, acc);  \
                                else                                                               \
                                        q8p_half_avx2(1, TYPE, G, k, half, xq + t * xs, xs, acc);  \
                                for (size_t u = 0; u < nt; u++) {                                  \
                                        float l[8];                                                \
                                        _mm256_storeu_ps(l, acc[u]);                               \
                                        for (size_t r = MAX(a, h0); r < MIN(e, h0 + 8); r++)       \
                                                y[(t + u) * ys + r - r0] = l[r - h0];              \
                                }                                                                  \
                        }                                                                          \
                }                                                                                  \
        }

Q8_AVX2_TARGET static void gemm_q8_avx2(uint32_t type, const uint8_t *P, size_t R, size_t k,
                                        size_t r0, size_t r1, const uint8_t *xq, size_t xs,
                                        size_t T, float *y, size_t ys) {
        const size_t prb = q8p_row_bytes(type, k);

        (void) R;
        assert(r1 <= R); /* the last group padded (quant_q8_pack) */

        switch (type) {
                Q8P_EACH_TYPE(Q8P_DRIVE_AVX2)
        default: Q8P_DRIVE_AVX2(GGML_TYPE_Q6_K) break;
        }
}

/* The conversions with AVX-512, the portable code's bits: round to nearest even on the bit
 * pattern for bf16 (NaN kept quiet), and for q8 the same division, product and rounding
 * (vcvtps2dq under the default round-to-nearest-even). */
Q8_CONV_TARGET static void round_bf16_avx512(const float *x, size_t n, uint16_t *xb) {
        const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
        const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
        size_t i = 0;

        for (; i + 16 <= n; i += 16) {
                __m512i u = _mm512_loadu_si512(x + i);
                __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf);
                __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
                r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
                _mm256_storeu_si256((__m256i *) (xb + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
        }
        for (; i < n; i++)
                xb[i] = quant_f32_to_bf16(x[i]);
}

/* A q8 block's scale (quant.h): dx = max|x| / 127, and the factor 127 / max|x| returned; for a
 * block with a NaN or an infinity (bad: dx NaN) or a maximum below Q8_TINY (dx 0), zero q and
 * sums written and 0 returned */
static inline float q8_block_scale(bool bad, float amax, float *dx, int8_t *q, int32_t *sums) {
        if (bad || amax < Q8_TINY) {
                *dx = bad ? NAN : 0.0f;
                memset(q, 0, 32);
                sums[0] = sums[1] = 0;
                return 0.0f;
        }
        *dx = amax / 127.0f;
        return 127.0f / amax;
}

Q8_CONV_TARGET static void q8_quantize_avx512(const float *x, size_t k, void *row) {
        int8_t *q = row;
        float *dx = (float *) ((uint8_t *) row + k);
        int32_t *sums = (int32_t *) (dx + k / 32);
        const __m512 inf = _mm512_set1_ps(INFINITY);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        for (size_t b = 0; b < k / 32; b++) {
                __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
                __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
                /* NaN (unordered) or infinite anywhere: a NaN scale and zeros, as the portable code */
                __mmask16 bad = _mm512_cmp_ps_mask(a0, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(a1, inf, _CMP_NLT_UQ);
                float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
                float id = q8_block_scale(bad, amax, dx + b, q + 32 * b, sums + 2 * b);
                if (id == 0.0f)
                        continue;
                __m512 idv = _mm512_set1_ps(id);
                __m512i i0 = _mm512_max_epi32(lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(x0, idv))));
                __m512i i1 = _mm512_max_epi32(lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(x1, idv))));
                _mm_storeu_si128((__m128i *) (q + 32 * b), _mm512_cvtsepi32_epi8(i0));
                _mm_storeu_si128((__m128i *) (q + 32 * b + 16), _mm512_cvtsepi32_epi8(i1));
                sums[2 * b] = _mm512_reduce_add_epi32(i0);
                sums[2 * b + 1] = _mm512_reduce_add_epi32(i1);
        }
}

/* The same q8 row with AVX2: each 32-value block as four ymm registers, rounded by the same
 * conversion (nearest even), clamped and packed to bytes in order (the packs interleave the
 * 128-bit lanes; one permutation puts the 4-byte groups back) */
AVX2_TARGET static void q8_quantize_avx2(const float *x, size_t k, void *row) {
        int8_t *q = row;
        float *dx = (float *) ((uint8_t *) row + k);
        int32_t *sums = (int32_t *) (dx + k / 32);
        const __m256 inf = _mm256_set1_ps(INFINITY), sign = _mm256_set1_ps(-0.0f);
        const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);

        for (size_t b = 0; b < k / 32; b++) {
                __m256 xv[4], m = _mm256_setzero_ps();
                __m256i iv[4];
                float mm[8], amax = 0.0f;
                int32_t is[8];
                int bad = 0;

                for (int j = 0; j < 4; j++) {
                        xv[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
                        __m256 a = _mm256_andnot_ps(sign, xv[j]);
                        /* NaN (unordered) or infinite: a NaN scale and zeros (the portable code) */
                        bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
                        m = _mm256_max_ps(m, a);
                }
                _mm256_storeu_ps(mm, m);
                for (int l = 0; l < 8; l++)
                        amax = mm[l] > amax ? mm[l] : amax;
                float id = q8_block_scale(bad, amax, dx + b, q + 32 * b, sums + 2 * b);
                if (id == 0.0f)
                        continue;
                __m256 idv = _mm256_set1_ps(id);
                for (int j = 0; j < 4; j++) {
                        __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(xv[j], idv));

                        iv[j] = _mm256_max_epi32(lo, _mm256_min_epi32(hi, r));
                }
                __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]),
                                               _mm256_packs_epi32(iv[2], iv[3]));
                w = _mm256_permutevar8x32_epi32(w, order);
                _mm256_storeu_si256((__m256i *) (q + 32 * b), w);
                for (int h = 0; h < 2; h++) {
                        __m256i pair = _mm256_add_epi32(iv[2 * h], iv[2 * h + 1]);
                        int32_t sum = 0;

                        _mm256_storeu_si256((__m256i *) is, pair);
                        for (int l = 0; l < 8; l++)
                                sum += is[l];
                        sums[2 * b + h] = sum;
                }
        }
}

static bool cpu_has_avx512_vnni(void);
#endif

#ifdef HAVE_X86_SIMD
static const struct quant_impl impl_avx2 = { "avx2", dequant_rows_avx2, gemm_avx2,
                                             weighted_rows_avx2, NULL, softmax_avx2 };
static const struct quant_impl impl_avx512 = { "avx512", dequant_rows_avx512, gemm_avx512,
                                               weighted_rows_avx512, gemv_avx512, softmax_avx512 };

static bool cpu_has_avx2_f16c(void) {
        unsigned a, b, c, d;
        __builtin_cpu_init();
        if (!__builtin_cpu_supports("avx2") || !__get_cpuid(1, &a, &b, &c, &d))
                return false;
        return c & bit_F16C;
}

static bool cpu_has_avx512(void) {
        return cpu_has_avx2_f16c() && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

static bool cpu_has_avx512_bf16(void) {
        return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

static bool cpu_has_avx512_vnni(void) {
        return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
}
#endif

static const struct quant_impl *impl_best(int level) {
#ifdef HAVE_X86_SIMD
        if (level >= 2 && cpu_has_avx512())
                return &impl_avx512;
        if (level >= 1 && cpu_has_avx2_f16c())
                return &impl_avx2;
#endif
        (void) level;
        return &impl_generic;
}

static const struct quant_impl *impl_cur;

static const struct quant_impl *impl_get(void) {
        const struct quant_impl *i = __atomic_load_n(&impl_cur, __ATOMIC_RELAXED);

        if (!i) {
                i = impl_best(2); /* benign race: every thread picks the same */
                __atomic_store_n(&impl_cur, i, __ATOMIC_RELAXED);
        }
        return i;
}

void quant_dequantize_rows(uint32_t type, const void *w, size_t row_bytes, size_t R, size_t k,
                           float *out) {
        const struct ggml_type_info *t = ggml_type_get(type);

        assert(t && t->computable && k % t->block_size == 0);
        (void) t;
        impl_get()->dequant_rows(type, w, row_bytes, R, k, out);
}

bool quant_gemv(uint32_t type, const void *w, size_t row_bytes, size_t R, size_t k,
                const float *x, float *y) {
        const struct quant_impl *im = impl_get();

        return im->gemv && im->gemv(type, w, row_bytes, R, k, x, y);
}

void quant_gemm_f32(const float *w, size_t R, size_t k, const float *x, size_t x_stride, size_t T,
                    float *y, size_t y_stride) {
        impl_get()->gemm(w, R, k, x, x_stride, T, y, y_stride);
}

void quant_weighted_rows(const float *rows, size_t row_stride, size_t n_rows, size_t k,
                         const float *P, size_t p_stride, size_t H, float *out, size_t out_stride) {
        impl_get()->weighted_rows(rows, row_stride, n_rows, k, P, p_stride, H, out, out_stride);
}

void quant_softmax(float *s, size_t n, float scale) {
        impl_get()->softmax(s, n, scale);
}

float quant_dot_f32(const float *w, const float *x, size_t n) {
        float y;

        impl_get()->gemm(w, 1, n, x, 0, 1, &y, 1);
        return y;
}

float quant_dot_row(uint32_t type, const void *row, const float *x, size_t n) {
        const struct ggml_type_info *t = ggml_type_get(type);
        const struct quant_impl *im = impl_get();
        float buf[QK_K];
        float acc[16] = { 0 };

        assert(t && t->computable && n % t->block_size == 0);
        /* chunks of 256 (a whole number of blocks and of 16-value lane groups): the lane sums
         * continue across chunks, so this is the same order as one quant_gemm_f32 of the row */
        for (size_t i = 0; i < n; i += QK_K) {
                size_t m = MIN((size_t) QK_K, n - i);
                uint64_t off = 0;

                (void) ggml_row_bytes(type, i, &off);
                im->dequant_rows(type, (const uint8_t *) row + off, 0, 1, m, buf);
                for (size_t j = 0; j < m; j++)
                        acc[(i + j) % 16] = acc[(i + j) % 16] + buf[j] * x[i + j];
        }
        return lanes_reduce(acc);
}

const char *quant_set_simd(int level) {
        const struct quant_impl *i = impl_best(level);

        __atomic_store_n(&impl_cur, i, __ATOMIC_RELAXED);
        __atomic_store_n(&bf16_dot_off, level < 2, __ATOMIC_RELAXED);
        return i->name;
}

/* which integer kernel this CPU takes: 0 unknown, 1 none, 2 AVX2 (+FMA), 3 AVX-512 VNNI; cpuid
 * once (it traps in a VM) */
static int q8_kernel(void) {
#ifdef HAVE_X86_SIMD
        static int best;
        int v = __atomic_load_n(&best, __ATOMIC_RELAXED);
        const struct quant_impl *im = impl_get();

        if (!v) {
                v = cpu_has_avx512_vnni() ? 3 : cpu_has_avx2_f16c() && __builtin_cpu_supports("fma") ? 2 : 1;
                __atomic_store_n(&best, v, __ATOMIC_RELAXED);
        }
        /* quant_set_simd's level caps it */
        return im == &impl_avx512 ? v : im == &impl_avx2 ? MIN(v, 2) : 1;
#else
        return 1;
#endif
}

bool quant_q8_dot_available(void) {
        return q8_kernel() >= 2;
}

void quant_gemm_q8(uint32_t type, const void *packed, size_t R, size_t k, size_t r0, size_t r1,
                   const void *xq, size_t xq_stride, size_t T, float *y, size_t y_stride) {
        assert(quant_q8_supported(type) && k % quant_q8_block_values(type) == 0);
        assert(r0 <= r1 && r1 <= R);
#ifdef HAVE_X86_SIMD
        switch (q8_kernel()) {
        case 3:
                gemm_q8_vnni(type, packed, R, k, r0, r1, xq, xq_stride, T, y, y_stride);
                return;
        case 2:
                gemm_q8_avx2(type, packed, R, k, r0, r1, xq, xq_stride, T, y, y_stride);
                return;
        }
#endif
        gemm_q8_generic(type, packed, k, r0, r1, xq, xq_stride, T, y, y_stride);
}

void quant_round_bf16(const float *x, size_t n, uint16_t *xb) {
#ifdef HAVE_X86_SIMD
        if (impl_get() == &impl_avx512) {
                round_bf16_avx512(x, n, xb);
                return;
        }
#endif
        round_bf16_generic(x, n, xb);
}

void quant_q8_quantize(const float *x, size_t k, void *row) {
        assert(k % 32 == 0);
#ifdef HAVE_X86_SIMD
        if (impl_get() == &impl_avx512) {
                q8_quantize_avx512(x, k, row);
                return;
        }
        if (impl_get() == &impl_avx2) {
                q8_quantize_avx2(x, k, row);
                return;
        }
#endif
        q8_quantize_generic(x, k, row);
}
