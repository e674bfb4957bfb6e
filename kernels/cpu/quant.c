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

/* ---- dot products and the panel product ----
 *
 * Every kernel below is written once as an always_inline body and instantiated three times: for
 * the baseline ISA, for AVX2 (+F16C) and for AVX-512F (+AVX2, F16C), one of which is picked at
 * the first call from what the CPU has (an explicit pick rather than target_clones: ifunc
 * resolvers run before sanitizer runtimes start). The arithmetic is lane-wise (GNU vector
 * extension, 16 floats; AVX2 holds one in two registers, the baseline in four) with a separate
 * multiply and add (ISO C11: gcc does not contract a*b+c; the clang pragma below says the same),
 * and the dequantization is exact, so the three variants give the same bits. */

#ifdef __clang__
#pragma clang fp contract(off)
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef float v16f __attribute__((vector_size(64)));

/* the tile loops have constant trip counts <= 4: unrolled, the accumulators live in registers */
#define UNROLL _Pragma("GCC unroll 4")

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

/* One output: the vector lanes, plus the n % 16 tail continuing lane = index mod 16. */
ALWAYS_INLINE float lanes_finish(const v16f *acc, const float *w, const float *x, size_t rem) {
        float a[16];

        memcpy(a, acc, sizeof a);
        for (size_t j = 0; j < rem; j++)
                a[j] = a[j] + w[j] * x[j];
        return lanes_reduce(a);
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
 * The tiling never changes an output's own order. */
ALWAYS_INLINE void gemm_body(const int TR, const int TT, const float *w, size_t R, size_t k,
                             const float *x, size_t xs, size_t T, float *y, size_t ys) {
        for (size_t r = 0; r < R; r += TR) {
                size_t nr = MIN((size_t) TR, R - r);
                const float *wr = w + r * k;
                float *yr = y + r;

                for (size_t t = 0; t < T; t += TT) {
                        size_t nt = MIN((size_t) TT, T - t);
                        const float *xt = x + t * xs;
                        float *yt = yr + t * ys;

                        if (nr == (size_t) TR && nt == (size_t) TT)
                                gemm_tile(TR, TT, wr, k, xt, xs, yt, ys, k);
                        else if (nr == (size_t) TR)
                                for (size_t u = 0; u < nt; u++)
                                        gemm_tile(TR, 1, wr, k, xt + u * xs, xs, yt + u * ys, ys, k);
                        else if (nt == (size_t) TT)
                                for (size_t q = 0; q < nr; q++)
                                        gemm_tile(1, TT, wr + q * k, k, xt, xs, yt + q, ys, k);
                        else
                                for (size_t q = 0; q < nr; q++)
                                        for (size_t u = 0; u < nt; u++)
                                                gemm_tile(1, 1, wr + q * k, k, xt + u * xs, xs,
                                                          yt + q + u * ys, ys, k);
                }
        }
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
        for (int h = 0; h < NH; h++)
                for (size_t j = kv; j < k; j++) {
                        float o = out[h * out_stride + j];
                        for (size_t r = 0; r < n_rows; r++)
                                o = o + P[h * p_stride + r] * rows[r * row_stride + j];
                        out[h * out_stride + j] = o;
                }
}

ALWAYS_INLINE void weighted_rows_body(const float *rows, size_t row_stride, size_t n_rows,
                                      size_t k, const float *P, size_t p_stride, size_t H,
                                      float *out, size_t out_stride) {
        size_t h = 0;

        for (; h + 4 <= H; h += 4)
                weighted_heads(4, rows, row_stride, n_rows, k, P + h * p_stride, p_stride,
                               out + h * out_stride, out_stride);
        for (; h < H; h++)
                weighted_heads(1, rows, row_stride, n_rows, k, P + h * p_stride, p_stride,
                               out + h * out_stride, out_stride);
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
                default:
                        assert(!"quant: unsupported type");
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

AVX2_TARGET static void gemm_avx2(const float *w, size_t R, size_t k, const float *x, size_t xs,
                                  size_t T, float *y, size_t ys) {
        gemm_body(2, 2, w, R, k, x, xs, T, y, ys); /* 2 × 2 × (2 ymm) accumulators: 8 of 16 */
}

AVX512_TARGET static void gemm_avx512(const float *w, size_t R, size_t k, const float *x,
                                      size_t xs, size_t T, float *y, size_t ys) {
        gemm_body(4, 4, w, R, k, x, xs, T, y, ys); /* 16 of the 32 zmm registers */
}

AVX2_TARGET static void weighted_rows_avx2(const float *rows, size_t row_stride, size_t n_rows,
                                           size_t k, const float *P, size_t p_stride, size_t H,
                                           float *out, size_t out_stride) {
        weighted_rows_body(rows, row_stride, n_rows, k, P, p_stride, H, out, out_stride);
}

AVX512_TARGET static void weighted_rows_avx512(const float *rows, size_t row_stride,
                                               size_t n_rows, size_t k, const float *P,
                                               size_t p_stride, size_t H, float *out,
                                               size_t out_stride) {
        weighted_rows_body(rows, row_stride, n_rows, k, P, p_stride, H, out, out_stride);
}

AVX2_TARGET static void softmax_avx2(float *s, size_t n, float scale) {
        softmax_body(s, n, scale);
}

AVX512_TARGET static void softmax_avx512(float *s, size_t n, float scale) {
        softmax_body(s, n, scale);
}

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
        return i->name;
}
