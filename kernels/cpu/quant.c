/* SPDX-License-Identifier: MIT */
/* Quant formats on the CPU (spec §6): conversions, row dequantization, row · vector dots.
 *
 * Summation order of quant_dot_row (the determinism contract of quant.h): 8 lanes; lane k holds
 * the values whose index within the row is ≡ k (mod 8). Per block (32 values; for Q6_K per
 * 16-value sub-block) each lane sums its products in index order into b[k] (a mul then an add,
 * never fused), then acc[k] += scale · b[k]. The row result is the fixed tree
 * ((acc0+acc4)+(acc2+acc6)) + ((acc1+acc5)+(acc3+acc7)). This order depends only on n. The AVX2
 * build of the same kernels runs lane k in vector lane k with the same operations (no FMA: the
 * project compiles ISO C11, where gcc and clang do not contract a*b+c), so it gives bit-identical
 * results to the portable one; the unit test checks that on machines that have AVX2. */
#include "quant.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "model/ggml.h"
#include "util/log.h"

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

/* ---- dequantization (spec §6) ---- */

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
                return log_error_errno(EINVAL, "quant: type %s has no CPU dequantizer",
                                       ggml_type_name(type));
        }
        return 0;
}

/* ---- dot products ----
 * The kernels are written once as always_inline bodies and instantiated for the baseline ISA and
 * for AVX2 (picked at run time); the lane structure above is what the vectorizer maps onto
 * 8-float registers. */

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* lane sums of 32 values: b[k] = ((w[k]x[k] + w[k+8]x[k+8]) + w[k+16]x[k+16]) + w[k+24]x[k+24] */
ALWAYS_INLINE void lanes32(const float *w, const float *x, float b[8]) {
        for (int k = 0; k < 8; k++)
                b[k] = w[k] * x[k];
        for (int g = 8; g < 32; g += 8)
                for (int k = 0; k < 8; k++)
                        b[k] = b[k] + w[g + k] * x[g + k];
}

ALWAYS_INLINE void lanes16(const float *w, const float *x, float b[8]) {
        for (int k = 0; k < 8; k++)
                b[k] = w[k] * x[k] + w[k + 8] * x[k + 8];
}

ALWAYS_INLINE void acc_add(float acc[8], float scale, const float b[8]) {
        for (int k = 0; k < 8; k++)
                acc[k] = acc[k] + scale * b[k];
}

ALWAYS_INLINE float acc_reduce(const float acc[8]) {
        return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

ALWAYS_INLINE float dot_f32_body(const float *w, const float *x, size_t n) {
        float acc[8] = { 0 }, b[8];
        for (size_t i = 0; i < n; i += 32) {
                lanes32(w + i, x + i, b);
                acc_add(acc, 1.0f, b);
        }
        return acc_reduce(acc);
}

ALWAYS_INLINE float dot_f16_body(const uint16_t *h, const float *x, size_t n) {
        float acc[8] = { 0 }, b[8], w[32];
        for (size_t i = 0; i < n; i += 32) {
                for (int j = 0; j < 32; j++)
                        w[j] = fp16_to_f32(h[i + j]);
                lanes32(w, x + i, b);
                acc_add(acc, 1.0f, b);
        }
        return acc_reduce(acc);
}

ALWAYS_INLINE float dot_bf16_body(const uint16_t *h, const float *x, size_t n) {
        float acc[8] = { 0 }, b[8], w[32];
        for (size_t i = 0; i < n; i += 32) {
                for (int j = 0; j < 32; j++)
                        w[j] = bf16_to_f32(h[i + j]);
                lanes32(w, x + i, b);
                acc_add(acc, 1.0f, b);
        }
        return acc_reduce(acc);
}

ALWAYS_INLINE float dot_q8_0_body(const struct block_q8_0 *blk, const float *x, size_t nb) {
        float acc[8] = { 0 }, b[8], w[32];
        for (size_t i = 0; i < nb; i++) {
                for (int j = 0; j < 32; j++)
                        w[j] = (float) blk[i].qs[j];
                lanes32(w, x + 32 * i, b);
                acc_add(acc, fp16_to_f32(blk[i].d), b);
        }
        return acc_reduce(acc);
}

ALWAYS_INLINE float dot_iq4nl_body(const struct block_iq4_nl *blk, const float *x, size_t nb) {
        float acc[8] = { 0 }, b[8], w[32];
        for (size_t i = 0; i < nb; i++) {
                for (int j = 0; j < 16; j++) {
                        w[j] = (float) quant_iq4nl_values[blk[i].qs[j] & 0xf];
                        w[j + 16] = (float) quant_iq4nl_values[blk[i].qs[j] >> 4];
                }
                lanes32(w, x + 32 * i, b);
                acc_add(acc, fp16_to_f32(blk[i].d), b);
        }
        return acc_reduce(acc);
}

ALWAYS_INLINE float dot_q6k_body(const struct block_q6_k *blk, const float *x, size_t nb) {
        float acc[8] = { 0 }, b[8], w[QK_K];
        int8_t q[QK_K];
        for (size_t i = 0; i < nb; i++) {
                float d = fp16_to_f32(blk[i].d);
                q6k_unpack(&blk[i], q);
                for (int j = 0; j < QK_K; j++)
                        w[j] = (float) q[j];
                for (int s = 0; s < QK_K / 16; s++) {
                        lanes16(w + 16 * s, x + QK_K * i + 16 * s, b);
                        acc_add(acc, d * (float) blk[i].scales[q6k_scale_index(s)], b);
                }
        }
        return acc_reduce(acc);
}

/* The F32/F16/BF16 kernels step 32 values at a time; their rows are any multiple of 32 in this
 * model (spec §1: every width is), and other lengths take the tail path below. */
ALWAYS_INLINE float dot_body(uint32_t type, const void *row, const float *x, size_t n) {
        switch (type) {
        case GGML_TYPE_F32:
                return dot_f32_body(row, x, n);
        case GGML_TYPE_F16:
                return dot_f16_body(row, x, n);
        case GGML_TYPE_BF16:
                return dot_bf16_body(row, x, n);
        case GGML_TYPE_Q8_0:
                return dot_q8_0_body(row, x, n / QK8_0);
        case GGML_TYPE_Q6_K:
                return dot_q6k_body(row, x, n / QK_K);
        case GGML_TYPE_IQ4_NL:
                return dot_iq4nl_body(row, x, n / QK4_NL);
        default:
                assert(!"quant_dot_row: unsupported type");
                return 0;
        }
}

static float dot_generic(uint32_t type, const void *row, const float *x, size_t n) {
        return dot_body(type, row, x, n);
}

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_AVX2_CLONE 1
#include <cpuid.h>
#include <immintrin.h>

/* IQ4_NL and F16 get hand-written AVX2 kernels (the codebook lookup is one pshufb; F16C converts
 * halfs); they keep the lane order of the portable kernels: vector lane k = lane k. The others are
 * the portable bodies compiled for AVX2 (gcc vectorizes the 8-lane loops). Measured on the 2-core
 * x86-64 dev box, one thread, 2048 rows x 3584, ns per weight (portable -> AVX2): IQ4_NL 1.3 -> 0.13
 * (4 GB/s of blocks), Q6_K 0.58 -> 0.28, Q8_0 0.41 -> 0.21, BF16 0.21 -> 0.20, F16 1.8 -> 0.15,
 * F32 0.4 -> 0.36. The scale's fp16 conversion is F16C's vcvtph2ps here; the branchy software
 * version cost 3x on IQ4_NL. */
#define AVX2_TARGET __attribute__((target("avx2,f16c")))

AVX2_TARGET static inline __m256 avx2_lanes32(__m256 w0, __m256 w1, __m256 w2, __m256 w3,
                                              const float *x) {
        __m256 b = _mm256_mul_ps(w0, _mm256_loadu_ps(x));
        b = _mm256_add_ps(b, _mm256_mul_ps(w1, _mm256_loadu_ps(x + 8)));
        b = _mm256_add_ps(b, _mm256_mul_ps(w2, _mm256_loadu_ps(x + 16)));
        return _mm256_add_ps(b, _mm256_mul_ps(w3, _mm256_loadu_ps(x + 24)));
}

AVX2_TARGET static float avx2_reduce(__m256 acc) {
        float a[8];
        _mm256_storeu_ps(a, acc);
        return acc_reduce(a);
}

AVX2_TARGET static float dot_iq4nl_avx2(const struct block_iq4_nl *blk, const float *x, size_t nb) {
        const __m128i book = _mm_loadu_si128((const __m128i *) quant_iq4nl_values);
        const __m128i mask = _mm_set1_epi8(0x0f);
        __m256 acc = _mm256_setzero_ps();

        for (size_t i = 0; i < nb; i++) {
                __m128i q = _mm_loadu_si128((const __m128i *) blk[i].qs);
                __m128i lo = _mm_shuffle_epi8(book, _mm_and_si128(q, mask));
                __m128i hi = _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(q, 4), mask));
                __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
                __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
                __m256 w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
                __m256 w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
                __m256 b = avx2_lanes32(w0, w1, w2, w3, x + 32 * i);
                __m256 d = _mm256_set1_ps(_cvtsh_ss(blk[i].d));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(d, b));
        }
        return avx2_reduce(acc);
}

AVX2_TARGET static float dot_f16_avx2(const uint16_t *h, const float *x, size_t n) {
        __m256 acc = _mm256_setzero_ps();

        for (size_t i = 0; i < n; i += 32) {
                __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + i)));
                __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + i + 8)));
                __m256 w2 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + i + 16)));
                __m256 w3 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + i + 24)));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(1.0f),
                                                       avx2_lanes32(w0, w1, w2, w3, x + i)));
        }
        return avx2_reduce(acc);
}

AVX2_TARGET static float dot_avx2(uint32_t type, const void *row, const float *x, size_t n) {
        if (type == GGML_TYPE_IQ4_NL)
                return dot_iq4nl_avx2(row, x, n / QK4_NL);
        if (type == GGML_TYPE_F16)
                return dot_f16_avx2(row, x, n);
        return dot_body(type, row, x, n);
}

static bool cpu_has_avx2_f16c(void) {
        unsigned a, b, c, d;
        __builtin_cpu_init();
        if (!__builtin_cpu_supports("avx2") || !__get_cpuid(1, &a, &b, &c, &d))
                return false;
        return c & bit_F16C;
}
#endif

static float (*dot_impl)(uint32_t, const void *, const float *, size_t);

static float dot_pick(uint32_t type, const void *row, const float *x, size_t n) {
#ifdef HAVE_AVX2_CLONE
        if (cpu_has_avx2_f16c()) {
                __atomic_store_n(&dot_impl, dot_avx2, __ATOMIC_RELAXED);
                return dot_avx2(type, row, x, n);
        }
#endif
        __atomic_store_n(&dot_impl, dot_generic, __ATOMIC_RELAXED);
        return dot_generic(type, row, x, n);
}

/* Element-wise tail for F32/F16/BF16 rows that are not a multiple of 32: lane = index mod 8
 * continues, so the order still depends only on n. */
static float dot_tail(uint32_t type, const void *row, const float *x, size_t start, size_t n,
                      float head) {
        float acc[8] = { 0 };
        for (size_t i = start; i < n; i++) {
                float w = type == GGML_TYPE_F32  ? ((const float *) row)[i]
                        : type == GGML_TYPE_F16 ? fp16_to_f32(((const uint16_t *) row)[i])
                                                : bf16_to_f32(((const uint16_t *) row)[i]);
                acc[i % 8] = acc[i % 8] + w * x[i];
        }
        return head + acc_reduce(acc);
}

float quant_dot_row(uint32_t type, const void *row, const float *x, size_t n) {
        const struct ggml_type_info *t = ggml_type_get(type);
        float (*impl)(uint32_t, const void *, const float *, size_t) =
                __atomic_load_n(&dot_impl, __ATOMIC_RELAXED);

        assert(t && t->computable && n % t->block_size == 0);
        if (!impl)
                impl = dot_pick; /* benign race: every thread picks the same */
        if (t->block_size == 1 && n % 32 != 0) {
                size_t body = n - n % 32;
                return dot_tail(type, row, x, body, n, body ? impl(type, row, x, body) : 0.0f);
        }
        return impl(type, row, x, n);
}

int quant_set_simd(int enable) {
#ifdef HAVE_AVX2_CLONE
        if (enable && cpu_has_avx2_f16c()) {
                __atomic_store_n(&dot_impl, dot_avx2, __ATOMIC_RELAXED);
                return 1;
        }
#endif
        __atomic_store_n(&dot_impl, dot_generic, __ATOMIC_RELAXED);
        return 0;
}
