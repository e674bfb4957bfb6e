/* SPDX-License-Identifier: MIT */
/* quant (docs/model.md §6): half/bfloat conversions checked exhaustively against ldexp/rint references,
 * hand-made blocks with known values for every quant format, and dot products against both a
 * double-precision sum and the documented summation order (bit for bit, SIMD and portable). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cmocka.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "gguf/ggml.h"
#include "common/log.h"

static uint32_t bits_of(float f) {
        uint32_t u;
        memcpy(&u, &f, 4);
        return u;
}

static float float_of(uint32_t u) {
        float f;
        memcpy(&f, &u, 4);
        return f;
}

/* xorshift64*: deterministic test data */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return rng_state * 0x2545f4914f6cdd1dull;
}
static float rndf(void) { /* uniform in [-1, 1) */
        return (float) ((double) (rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* IEEE half value by definition: (-1)^s · 2^(e-15) · 1.m, or 2^-14 · 0.m for e = 0 */
static double half_ref(uint16_t h) {
        int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        return s ? -v : v;
}

static void test_fp16_to_f32(void **state) {
        (void) state;
        /* spot values */
        assert_true(quant_fp16_to_f32(0x3c00) == 1.0f);
        assert_true(quant_fp16_to_f32(0xc000) == -2.0f);
        assert_true(quant_fp16_to_f32(0x7bff) == 65504.0f);
        assert_true(quant_fp16_to_f32(0x0400) == 0x1p-14f);    /* smallest normal */
        assert_true(quant_fp16_to_f32(0x0001) == 0x1p-24f);    /* smallest subnormal */
        assert_true(quant_fp16_to_f32(0x03ff) == 1023 * 0x1p-24f);
        assert_true(quant_fp16_to_f32(0x3555) == 0.333251953125f);
        assert_true(quant_fp16_to_f32(0x0000) == 0.0f && !signbit(quant_fp16_to_f32(0x0000)));
        assert_true(quant_fp16_to_f32(0x8000) == 0.0f && signbit(quant_fp16_to_f32(0x8000)));
        assert_true(isinf(quant_fp16_to_f32(0x7c00)) && quant_fp16_to_f32(0x7c00) > 0);
        assert_true(isinf(quant_fp16_to_f32(0xfc00)) && quant_fp16_to_f32(0xfc00) < 0);
        assert_true(isnan(quant_fp16_to_f32(0x7e00)));
        assert_true(isnan(quant_fp16_to_f32(0x7c01))); /* signalling NaN stays NaN, not inf */
        assert_true(isnan(quant_fp16_to_f32(0xfc01)));
        /* every half: exact value, and back to the same bits */
        for (uint32_t h = 0; h < 65536; h++) {
                float f = quant_fp16_to_f32((uint16_t) h);
                if (((h >> 10) & 31) == 31) {
                        assert_true((h & 1023) ? isnan(f) : isinf(f));
                        continue;
                }
                if ((double) f != half_ref((uint16_t) h) || !signbit(f) != !(h >> 15))
                        fail_msg("fp16 0x%04x -> %a, want %a", h, f, half_ref((uint16_t) h));
                if (quant_f32_to_fp16(f) != h)
                        fail_msg("fp16 0x%04x does not round-trip: 0x%04x", h, quant_f32_to_fp16(f));
        }
}

/* Reference f32 -> half with rint (the FPU's round-to-nearest-even) on the scaled value. */
static uint16_t half_from_ref(float f) {
        uint16_t sign = signbit(f) ? 0x8000 : 0;
        double a = fabs((double) f);
        if (isnan(f))
                return 0x7e00;
        if (a < 0x1p-14) /* subnormal range: units of 2^-24 (rint may give 0x400 = normal) */
                return sign | (uint16_t) rint(a * 0x1p24);
        int e;
        frexp(a, &e); /* a = fr · 2^e, fr in [0.5, 1): leading bit is 2^(e-1) */
        double m = rint(ldexp(a, 11 - e)); /* 11 significant bits */
        if (m == 2048) {
                m = 1024;
                e++;
        }
        int he = e - 1 + 15;
        if (he >= 31)
                return sign | 0x7c00;
        return sign | (uint16_t) (he << 10) | (uint16_t) ((int) m - 1024);
}

static void test_f32_to_fp16(void **state) {
        (void) state;
        assert_int_equal(quant_f32_to_fp16(1.0f), 0x3c00);
        assert_int_equal(quant_f32_to_fp16(-0.0f), 0x8000);
        assert_int_equal(quant_f32_to_fp16(65504.0f), 0x7bff);
        assert_int_equal(quant_f32_to_fp16(65519.996f), 0x7bff); /* just below the halfway point */
        assert_int_equal(quant_f32_to_fp16(65520.0f), 0x7c00);   /* halfway: ties to even = inf */
        assert_int_equal(quant_f32_to_fp16(1e10f), 0x7c00);
        assert_int_equal(quant_f32_to_fp16(-1e10f), 0xfc00);
        assert_int_equal(quant_f32_to_fp16(INFINITY), 0x7c00);
        assert_int_equal(quant_f32_to_fp16(-INFINITY), 0xfc00);
        uint16_t n = quant_f32_to_fp16(NAN);
        assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
        n = quant_f32_to_fp16(float_of(0x7f800001)); /* payload only in low bits: still NaN */
        assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
        /* ties to even */
        assert_int_equal(quant_f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
        assert_int_equal(quant_f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
        assert_int_equal(quant_f32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
        /* subnormals */
        assert_int_equal(quant_f32_to_fp16(0x1p-25f), 0x0000); /* tie -> even 0 */
        assert_int_equal(quant_f32_to_fp16(0x1.000002p-25f), 0x0001);
        assert_int_equal(quant_f32_to_fp16(3 * 0x1p-25f), 0x0002); /* tie 1|2 -> 2 */
        assert_int_equal(quant_f32_to_fp16(0x1p-24f), 0x0001);
        assert_int_equal(quant_f32_to_fp16(0x1p-14f - 0x1p-25f), 0x0400); /* tie 0x3ff|0x400 */
        assert_int_equal(quant_f32_to_fp16(-0x1p-30f), 0x8000);
        assert_int_equal(quant_f32_to_fp16(FLT_MIN), 0x0000);
        /* every f32 exponent from far below the subnormals to overflow, random mantissas, plus
         * the exact halfway points of each exponent */
        for (int i = 0; i < 400000; i++) {
                uint32_t e = 90 + (uint32_t) (rnd() % 60); /* 2^-37 .. 2^22 */
                uint32_t m = (uint32_t) rnd() & 0x7fffff;
                if (i % 4 == 0)
                        m = (m & ~0x1fffu) | 0x1000; /* normal-half halfway point */
                uint32_t u = (uint32_t) (rnd() & 1) << 31 | e << 23 | m;
                float f = float_of(u);
                if (quant_f32_to_fp16(f) != half_from_ref(f))
                        fail_msg("f32 %a -> fp16 0x%04x, want 0x%04x", f, quant_f32_to_fp16(f),
                                 half_from_ref(f));
        }
}

static void test_bf16(void **state) {
        (void) state;
        assert_true(quant_bf16_to_f32(0x3f80) == 1.0f);
        assert_true(quant_bf16_to_f32(0xc0a0) == -5.0f);
        for (uint32_t b = 0; b < 65536; b++) {
                float f = quant_bf16_to_f32((uint16_t) b);
                assert_int_equal(bits_of(f), b << 16);
                if (!isnan(f))
                        assert_int_equal(quant_f32_to_bf16(f), b);
        }
        assert_int_equal(quant_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie -> even */
        assert_int_equal(quant_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie -> even */
        assert_int_equal(quant_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
        assert_int_equal(quant_f32_to_bf16(FLT_MAX), 0x7f80); /* rounds up to inf */
        assert_int_equal(quant_f32_to_bf16(-INFINITY), 0xff80);
        /* a NaN whose payload is only in the low 16 bits must not become inf */
        assert_true(isnan(quant_bf16_to_f32(quant_f32_to_bf16(float_of(0x7f800001)))));
        assert_true(isnan(quant_bf16_to_f32(quant_f32_to_bf16(float_of(0xff800001)))));
        assert_true(isnan(quant_bf16_to_f32(quant_f32_to_bf16(NAN))));
}

static const int K[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

static void test_iq4nl_blocks(void **state) {
        (void) state;
        struct block_iq4_nl b[4];
        float y[128];
        /* scales: 1, -0.5, the smallest subnormal 2^-24, and 2^-24·1023 */
        const uint16_t d[4] = { 0x3c00, 0xb800, 0x0001, 0x03ff };
        const float dv[4] = { 1.0f, -0.5f, 0x1p-24f, 1023 * 0x1p-24f };

        for (int k = 0; k < 16; k++)
                assert_int_equal(quant_iq4nl_values[k], K[k]);
        for (int i = 0; i < 4; i++) {
                b[i].d = d[i];
                /* every codebook index in the low nibble and, reversed, in the high nibble;
                 * block 1 and 3 swap the roles so each index is seen in both halves */
                for (int j = 0; j < 16; j++) {
                        int lo = i % 2 ? 15 - j : j, hi = 15 - lo;
                        b[i].qs[j] = (uint8_t) (lo | hi << 4);
                }
        }
        assert_int_equal(quant_dequantize_row(GGML_TYPE_IQ4_NL, b, y, 128), 0);
        for (int i = 0; i < 4; i++)
                for (int j = 0; j < 16; j++) {
                        int lo = i % 2 ? 15 - j : j, hi = 15 - lo;
                        /* docs/model.md §6: low nibbles are the first 16 values, high the second 16 */
                        assert_true(y[32 * i + j] == dv[i] * (float) K[lo]);
                        assert_true(y[32 * i + j + 16] == dv[i] * (float) K[hi]);
                }
        assert_true(y[0] == -127.0f && y[16] == 113.0f);
        assert_true(y[32] == -56.5f && y[48] == 63.5f); /* -0.5·113, -0.5·-127 */
        assert_true(y[64] == -127 * 0x1p-24f);
}

static void test_q8_0_blocks(void **state) {
        (void) state;
        struct block_q8_0 b[8];
        float y[256];
        for (int i = 0; i < 8; i++) {
                b[i].d = i % 2 ? 0xb400 : 0x0001; /* -0.25, 2^-24 */
                for (int j = 0; j < 32; j++)
                        b[i].qs[j] = (int8_t) (-128 + 32 * i + j);
        }
        assert_int_equal(quant_dequantize_row(GGML_TYPE_Q8_0, b, y, 256), 0);
        for (int i = 0; i < 8; i++)
                for (int j = 0; j < 32; j++)
                        assert_true(y[32 * i + j] == (i % 2 ? -0.25f : 0x1p-24f) * (float) (-128 + 32 * i + j));
        assert_true(y[0] == -128 * 0x1p-24f);
        assert_true(y[255] == -0.25f * 127);
}

/* Packs 256 quants (-32..31, output order) into a Q6_K block by inverting the docs/model.md §6 loop. */
static void q6k_pack(const int q[256], struct block_q6_k *b) {
        memset(b->ql, 0, sizeof b->ql);
        memset(b->qh, 0, sizeof b->qh);
        for (int n = 0; n < 2; n++)
                for (int l = 0; l < 32; l++) {
                        int v1 = q[128 * n + l] + 32, v2 = q[128 * n + l + 32] + 32,
                            v3 = q[128 * n + l + 64] + 32, v4 = q[128 * n + l + 96] + 32;
                        uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
                        ql[l] = (uint8_t) ((v1 & 0xf) | (v3 & 0xf) << 4);
                        ql[l + 32] = (uint8_t) ((v2 & 0xf) | (v4 & 0xf) << 4);
                        qh[l] = (uint8_t) ((v1 >> 4) | (v2 >> 4) << 2 | (v3 >> 4) << 4 | (v4 >> 4) << 6);
                }
}

static void test_q6k_blocks(void **state) {
        (void) state;
        struct block_q6_k b;
        float y[256];

        /* hand-made: first output of each quarter of each half, and the is = 1 run */
        memset(&b, 0, sizeof b);
        b.d = 0x3c00; /* 1.0 */
        for (int i = 0; i < 16; i++)
                b.scales[i] = (int8_t) ((i + 1) * (i % 2 ? -1 : 1)); /* 1 -2 3 -4 ... */
        b.ql[0] = 0x21;          /* q1 low 1, q3 low 2 */
        b.ql[32] = 0x43;         /* q2 low 3, q4 low 4 */
        b.qh[0] = 0xe4;          /* 0b11'10'01'00: q1 hi 0, q2 hi 1, q3 hi 2, q4 hi 3 */
        b.ql[16] = 0x0f;         /* l = 16: is = 1 */
        b.qh[16] = 0x03;
        b.ql[64] = 0xff;         /* second half, l = 0 */
        b.qh[32] = 0xff;
        assert_int_equal(quant_dequantize_row(GGML_TYPE_Q6_K, &b, y, 256), 0);
        assert_true(y[0] == 1.0f * (1 - 32));          /* sc[0] = 1, q1 = 1 | 0<<4 */
        assert_true(y[32] == 3.0f * (3 + 16 - 32));    /* sc[2] = 3, q2 = 3 | 1<<4 */
        assert_true(y[64] == 5.0f * (2 + 32 - 32));    /* sc[4] = 5, q3 = 2 | 2<<4 = 34 */
        assert_true(y[96] == 7.0f * (4 + 48 - 32));    /* sc[6] = 7, q4 = 4 | 3<<4 = 52 */
        assert_true(y[16] == -2.0f * (15 + 48 - 32));  /* sc[1] = -2 (negative scale), q = 63 */
        assert_true(y[1] == 1.0f * -32);               /* all-zero bits: the -32 offset */
        assert_true(y[128] == 9.0f * 31);              /* second half: sc[8] = 9, q = 63 - 32 */
        assert_true(y[128 + 32] == 11.0f * 16);        /* sc[10] = 11, q2 = 0 | 3<<4 */
        assert_true(y[128 + 64] == 13.0f * 31);        /* sc[12] = 13, q3 = 15 | 3<<4 */
        assert_true(y[128 + 96] == 15.0f * 16);        /* sc[14] = 15, q4 = 0 | 3<<4 */
        assert_true(y[255] == -16.0f * -32);           /* sc[15] = -16, q = -32 */

        /* every quant value at every position through the inverse packer, negative d */
        int q[256];
        for (int i = 0; i < 256; i++)
                q[i] = (int) ((i * 37 + 11) % 64) - 32;
        q6k_pack(q, &b);
        b.d = quant_f32_to_fp16(-0.125f);
        for (int i = 0; i < 16; i++)
                b.scales[i] = (int8_t) (i % 3 == 0 ? -128 : 127 - 9 * i);
        assert_int_equal(quant_dequantize_row(GGML_TYPE_Q6_K, &b, y, 256), 0);
        for (int i = 0; i < 256; i++) {
                int half = i / 128, l = i % 32, quarter = (i % 128) / 32;
                int sc = b.scales[8 * half + l / 16 + 2 * quarter];
                if (y[i] != -0.125f * (float) sc * (float) q[i])
                        fail_msg("Q6_K value %d: %g, want %g", i, y[i], -0.125 * sc * q[i]);
        }
}

static void test_bad_rows(void **state) {
        (void) state;
        float y[64];
        struct block_iq4_nl b[2] = { 0 };
        log_set_max_level(LOG_CRIT);
        assert_int_equal(quant_dequantize_row(GGML_TYPE_IQ4_NL, b, y, 33), -EINVAL);
        assert_string_equal(log_last_error(),
                            "quant: a IQ4_NL row of 33 values is not a whole number of 32-value blocks");
        assert_int_equal(quant_dequantize_row(GGML_TYPE_Q6_K, b, y, 32), -EINVAL);
        assert_string_equal(log_last_error(),
                            "quant: a Q6_K row of 32 values is not a whole number of 256-value blocks");
        assert_int_equal(quant_dequantize_row(GGML_TYPE_Q2_K, b, y, 256), -EINVAL);
        assert_string_equal(log_last_error(), "quant: type Q2_K cannot be dequantized on the CPU");
        assert_int_equal(quant_dequantize_row(77, b, y, 32), -EINVAL);
        assert_string_equal(log_last_error(), "quant: type type#77 cannot be dequantized on the CPU");
        log_set_max_level(LOG_INFO);
}

/* A random row of n values of `type` with realistic scales (fp16 around 0.01). */
static void *random_row(uint32_t type, size_t n) {
        uint64_t bytes;
        assert_int_equal(ggml_row_bytes(type, n, &bytes), 0);
        uint8_t *row = malloc(bytes);
        for (uint64_t i = 0; i < bytes; i++)
                row[i] = (uint8_t) rnd();
        switch (type) {
        case GGML_TYPE_F32:
                for (size_t i = 0; i < n; i++)
                        ((float *) row)[i] = rndf();
                break;
        case GGML_TYPE_F16:
                for (size_t i = 0; i < n; i++)
                        ((uint16_t *) row)[i] = quant_f32_to_fp16(rndf());
                break;
        case GGML_TYPE_BF16:
                for (size_t i = 0; i < n; i++)
                        ((uint16_t *) row)[i] = quant_f32_to_bf16(rndf());
                break;
        case GGML_TYPE_Q8_0:
                for (size_t i = 0; i < n / 32; i++)
                        ((struct block_q8_0 *) row)[i].d = quant_f32_to_fp16(0.01f * rndf());
                break;
        case GGML_TYPE_IQ4_NL:
                for (size_t i = 0; i < n / 32; i++)
                        ((struct block_iq4_nl *) row)[i].d = quant_f32_to_fp16(0.01f * rndf());
                break;
        case GGML_TYPE_Q6_K:
                for (size_t i = 0; i < n / 256; i++)
                        ((struct block_q6_k *) row)[i].d = quant_f32_to_fp16(0.001f * rndf());
                break;
        case GGML_TYPE_Q4_0: /* d, then the nibbles: IQ4_NL's layout */
                for (size_t i = 0; i < n / 32; i++)
                        ((struct block_iq4_nl *) row)[i].d = quant_f32_to_fp16(0.01f * rndf());
                break;
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q5_1: { /* d (and m) first */
                const size_t bb = bytes / (n / 32);
                for (size_t i = 0; i < n / 32; i++) {
                        uint16_t d = quant_f32_to_fp16(0.01f * rndf()), m = quant_f32_to_fp16(0.05f * rndf());
                        memcpy(row + i * bb, &d, 2);
                        if (type != GGML_TYPE_Q5_0)
                                memcpy(row + i * bb + 2, &m, 2);
                }
                break;
        }
        case GGML_TYPE_IQ4_XS: /* d first */
                for (size_t i = 0; i < n / 256; i++) {
                        uint16_t d = quant_f32_to_fp16(0.001f * rndf());
                        memcpy(row + i * 136, &d, 2);
                }
                break;
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K: /* d, dmin first */
                for (size_t i = 0; i < n / 256; i++) {
                        uint16_t d = quant_f32_to_fp16(0.001f * rndf()), dmin = quant_f32_to_fp16(0.001f * rndf());
                        uint8_t *blk = row + i * (bytes / (n / 256));
                        memcpy(blk, &d, 2);
                        memcpy(blk + 2, &dmin, 2);
                }
                break;
        }
        return row;
}

/* The documented order (quant.h), written independently: lane l sums w[i]·x[i] for i ≡ l (mod 16)
 * in index order (multiply, then add), then the tree (l + l+8, + 4, (0+2)+(1+3)). */
static float documented_dot(const float *w, const float *x, size_t n) {
        float acc[16] = { 0 }, s8[8], s4[4];

        for (size_t i = 0; i < n; i++) {
                float p = w[i] * x[i];
                acc[i % 16] = acc[i % 16] + p;
        }
        for (int k = 0; k < 8; k++)
                s8[k] = acc[k] + acc[k + 8];
        for (int k = 0; k < 4; k++)
                s4[k] = s8[k] + s8[k + 4];
        return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

static const int simd_levels[] = { 2, 1, 0 };

static void test_dot(void **state) {
        static const uint32_t types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                                          GGML_TYPE_Q8_0, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL };
        const size_t n = 3584; /* the model's hidden width: 112 IQ4_NL blocks, 14 Q6_K blocks */
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *y2 = malloc(n * sizeof *y2);
        const char *best = quant_set_simd(2);

        (void) state;
        for (size_t i = 0; i < n; i++)
                x[i] = rndf();
        for (size_t t = 0; t < ELEMENTSOF(types); t++)
                for (int rep = 0; rep < 20; rep++) {
                        void *row = random_row(types[t], n);
                        assert_int_equal(quant_dequantize_row(types[t], row, y, n), 0);
                        double ref = 0, mag = 0;
                        for (size_t i = 0; i < n; i++) {
                                ref += (double) y[i] * x[i];
                                mag += fabs((double) y[i] * x[i]);
                        }
                        float doc = documented_dot(y, x, n);
                        /* float accumulation over 3584 products in 16 lanes: error well under
                         * 1e-6 of sum|w·x| */
                        if (fabs(doc - ref) > 1e-6 * mag)
                                fail_msg("%s dot %.9g, double sum %.9g (sum|wx| %g)",
                                         ggml_type_name(types[t]), doc, ref, mag);
                        /* every ISA variant: the panel dequantizer gives the exact values, and
                         * the row dot and the fp32 dot follow the documented order bit for bit */
                        for (size_t v = 0; v < ELEMENTSOF(simd_levels); v++) {
                                const char *name = quant_set_simd(simd_levels[v]);
                                quant_dequantize_rows(types[t], row, 0, 1, n, y2);
                                if (memcmp(y, y2, n * sizeof *y) != 0)
                                        fail_msg("%s: %s panel dequantization differs", name,
                                                 ggml_type_name(types[t]));
                                float d = quant_dot_row(types[t], row, x, n);
                                float f = quant_dot_f32(y, x, n);
                                if (bits_of(d) != bits_of(doc) || bits_of(f) != bits_of(doc))
                                        fail_msg("%s: %s row dot %a, fp32 dot %a, documented order %a",
                                                 name, ggml_type_name(types[t]), d, f, doc);
                        }
                        free(row);
                }
        /* F32/F16/BF16 rows that are not a multiple of 16: the tail continues the lanes */
        for (size_t t = 0; t < 3; t++) {
                size_t m = 37;
                void *row = random_row(types[t], m);
                assert_int_equal(quant_dequantize_row(types[t], row, y, m), 0);
                float doc = documented_dot(y, x, m);
                for (size_t v = 0; v < ELEMENTSOF(simd_levels); v++) {
                        quant_set_simd(simd_levels[v]);
                        assert_true(bits_of(quant_dot_row(types[t], row, x, m)) == bits_of(doc));
                        assert_true(bits_of(quant_dot_f32(y, x, m)) == bits_of(doc));
                }
                free(row);
        }
        quant_set_simd(2);
        print_message("best kernels: %s, compared with the others\n", best);
        free(x);
        free(y);
        free(y2);
}

/* The register-tiled product: every output of a R × T panel product (edges of every tile shape
 * included) is the documented dot of its row and input, in every ISA variant. */
static void test_gemm(void **state) {
        const size_t k = 528, xs = 531, ys = 37; /* k: 33 lane groups; strides not multiples */
        static const size_t shapes[][2] = { { 1, 1 }, { 8, 1 }, { 3, 5 }, { 8, 13 }, { 5, 4 }, { 4, 8 } };
        float *w = malloc(8 * k * sizeof *w), *x = malloc(13 * xs * sizeof *x);
        float *y = malloc(13 * ys * sizeof *y);

        (void) state;
        for (size_t i = 0; i < 8 * k; i++)
                w[i] = rndf();
        for (size_t i = 0; i < 13 * xs; i++)
                x[i] = rndf();
        for (size_t v = 0; v < ELEMENTSOF(simd_levels); v++) {
                const char *name = quant_set_simd(simd_levels[v]);
                for (size_t s = 0; s < ELEMENTSOF(shapes); s++) {
                        size_t R = shapes[s][0], T = shapes[s][1];
                        memset(y, 0xff, 13 * ys * sizeof *y);
                        quant_gemm_f32(w, R, k, x, xs, T, y, ys);
                        for (size_t t = 0; t < T; t++)
                                for (size_t r = 0; r < R; r++) {
                                        float doc = documented_dot(w + r * k, x + t * xs, k);
                                        if (bits_of(y[t * ys + r]) != bits_of(doc))
                                                fail_msg("%s: %zux%zu product, row %zu input %zu: %a, documented %a",
                                                         name, R, T, r, t, y[t * ys + r], doc);
                                }
                }
        }
        quant_set_simd(2);
        free(w);
        free(x);
        free(y);
}

/* The fused decode kernel (where the CPU has one) gives the bits of the panel path for every type,
 * over 7 rows (a 4-row group and 3 single rows). */
static void test_gemv(void **state) {
        static const uint32_t types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                                          GGML_TYPE_Q8_0, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL };
        const size_t n = 512, R = 7;
        float *x = malloc(n * sizeof *x), *panel = malloc(R * n * sizeof *panel);
        float ref[7], y[7];
        int fused = 0;

        (void) state;
        for (size_t i = 0; i < n; i++)
                x[i] = rndf();
        quant_set_simd(2);
        for (size_t t = 0; t < ELEMENTSOF(types); t++) {
                uint64_t rb = 0;
                assert_int_equal(ggml_row_bytes(types[t], n, &rb), 0);
                uint8_t *w = malloc(R * rb);
                for (size_t r = 0; r < R; r++) {
                        void *row = random_row(types[t], n);
                        memcpy(w + r * rb, row, rb);
                        free(row);
                }
                quant_dequantize_rows(types[t], w, rb, R, n, panel);
                quant_gemm_f32(panel, R, n, x, n, 1, ref, R);
                if (quant_gemv(types[t], w, rb, R, n, x, y)) {
                        fused++;
                        for (size_t r = 0; r < R; r++)
                                if (bits_of(y[r]) != bits_of(ref[r]))
                                        fail_msg("%s row %zu: fused %a, panel %a", ggml_type_name(types[t]),
                                                 r, y[r], ref[r]);
                }
                free(w);
        }
        print_message("fused kernels for %d of 6 types\n", fused);
        free(x);
        free(panel);
}

/* The community quant formats (Q4_0 ... IQ4_XS): the dequantized values of rows of generated
 * blocks equal, bit for bit, those of ggml's own dequantizers (libggml-base's to_float of the
 * llama.cpp build that made tests/fixtures, run once on the same bytes: the FNV-1a hash of the
 * 1024 values' bits, and the first and last value), in every ISA variant. */
static uint64_t lcg_next(uint64_t *s) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        return *s >> 33;
}

static void test_other_formats(void **state) {
        static const struct {
                uint32_t type;
                uint64_t hash;
                float first, last;
        } want[] = {
                { GGML_TYPE_Q4_0, 0x18b622b3e49c9afbull, 0x0p+0f, -0x1.8a2p-5f },
                { GGML_TYPE_Q4_1, 0xa01dc096ffbf56fcull, 0x1.44fp-5f, 0x1.cce8p-4f },
                { GGML_TYPE_Q5_0, 0x0c2cf628541e2df8ull, 0x1.9aap-5f, 0x1.dacp-5f },
                { GGML_TYPE_Q5_1, 0xbc199b948bbfebf5ull, 0x1.e86cp-3f, 0x1.3c0cp-3f },
                { GGML_TYPE_Q4_K, 0x66b676f7a240415cull, -0x1.368p-5f, 0x1.1fc4p+1f },
                { GGML_TYPE_Q5_K, 0xb7d2206ca1f2ca26ull, 0x1.52e42p+3f, 0x1.55ba4p+1f },
                { GGML_TYPE_IQ4_XS, 0xc432985fb27c7096ull, 0x1.7b83p+4f, -0x1.6156p+3f },
        };
        enum { N = 1024 };

        (void) state;
        for (size_t ti = 0; ti < ELEMENTSOF(want); ti++) {
                const uint32_t type = want[ti].type;
                const struct ggml_type_info *t = ggml_type_get(type);
                uint64_t bytes = 0, s = type;
                _Alignas(64) uint8_t row[4096];
                float out[N], panel[N];

                assert_non_null(t);
                assert_true(t->computable);
                assert_int_equal(ggml_row_bytes(type, N, &bytes), 0);
                for (uint64_t i = 0; i < bytes; i++)
                        row[i] = (uint8_t) lcg_next(&s);
                /* finite fp16 scales (and mins) about 2^-7: 0x2000 + 10 random bits */
                bool two = type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1 || type == GGML_TYPE_Q4_K ||
                           type == GGML_TYPE_Q5_K;
                for (size_t b = 0; b < N / t->block_size; b++)
                        for (int h = 0; h < 1 + two; h++) {
                                uint8_t *p = row + b * t->type_size + 2 * h;
                                uint16_t v = (uint16_t) (0x2000 + (p[0] & 0x3ff));
                                p[0] = (uint8_t) v;
                                p[1] = (uint8_t) (v >> 8);
                        }
                assert_int_equal(quant_dequantize_row(type, row, out, N), 0);
                uint64_t h = 1469598103934665603ull;
                for (size_t i = 0; i < N; i++) {
                        uint32_t x = bits_of(out[i]);
                        for (int k = 0; k < 4; k++) {
                                h ^= (x >> (8 * k)) & 255;
                                h *= 1099511628211ull;
                        }
                }
                if (h != want[ti].hash || bits_of(out[0]) != bits_of(want[ti].first) ||
                    bits_of(out[N - 1]) != bits_of(want[ti].last))
                        fail_msg("%s: hash %016" PRIx64 " (ggml %016" PRIx64 "), first %a (%a), last %a (%a)",
                                 t->name, h, want[ti].hash, out[0], want[ti].first, out[N - 1], want[ti].last);
                /* the panel the products use, in every variant */
                for (size_t li = 0; li < ELEMENTSOF(simd_levels); li++) {
                        quant_set_simd(simd_levels[li]);
                        quant_dequantize_rows(type, row, (size_t) bytes, 1, N, panel);
                        assert_memory_equal(panel, out, sizeof out);
                }
                quant_set_simd(2);
                /* a ragged row is refused, naming the type */
                assert_int_equal(quant_dequantize_row(type, row, out, t->block_size + 1), -EINVAL);
        }
}

/* The fast numerics' q8 activations: per 32-value block, dx = max|x| / 127 and q = x·127/max|x|
 * rounded to nearest even; an all-zero block has dx 0 and q 0. */
static void test_q8_quantize(void **state) {
        float x[64];
        _Alignas(64) uint8_t row[192];

        (void) state;
        assert_int_equal(quant_q8_row_bytes(64), 128);
        assert_int_equal(quant_q8_row_bytes(3584), 4928); /* 3584 q, 112 dx, 224 run sums */
        for (int i = 0; i < 32; i++)
                x[i] = (float) (i - 16) / 16.0f; /* max |x| = 1 */
        for (int i = 32; i < 64; i++)
                x[i] = 0.0f;
        quant_q8_quantize(x, 64, row);
        const int8_t *q = (const int8_t *) row;
        const float *dx = (const float *) (row + 64);
        assert_true(dx[0] == 1.0f / 127.0f);
        assert_true(dx[1] == 0.0f);
        for (int i = 0; i < 32; i++)
                assert_int_equal(q[i], (int) rint((double) x[i] * 127.0));
        for (int i = 32; i < 64; i++)
                assert_int_equal(q[i], 0);
        const int32_t *sums = (const int32_t *) (row + 64 + 2 * sizeof(float));
        for (int h = 0; h < 4; h++) { /* Σq of each 16-value run */
                int32_t want = 0;
                for (int i = 16 * h; i < 16 * h + 16; i++)
                        want += q[i];
                assert_int_equal(sums[h], want);
        }

        /* every variant converts to the same bytes: q8 rows (blocks of wide and tiny ranges) and
         * bf16 (random bit patterns: NaN, infinities, subnormals, ties) */
        enum { K = 1024 };
        static float xs[K];
        static uint8_t rows[2][4096];
        static uint16_t bf[2][K + 7];
        for (int i = 0; i < K; i++)
                xs[i] = rndf() * ldexpf(1.0f, (int) (rnd() % 40) - 20);
        for (int v = 0; v < 2; v++) {
                quant_set_simd(v ? 2 : 0);
                quant_q8_quantize(xs, K, rows[v]);
        }
        assert_memory_equal(rows[0], rows[1], quant_q8_row_bytes(K));
        for (int i = 0; i < K; i++)
                xs[i] = float_of((uint32_t) rnd());
        for (int v = 0; v < 2; v++) {
                quant_set_simd(v ? 2 : 0);
                quant_round_bf16(xs, K - 3, bf[v]); /* a tail past the 16-value runs */
        }
        for (int i = 0; i < K - 3; i++)
                assert_int_equal(bf[1][i], quant_f32_to_bf16(xs[i]));
        assert_memory_equal(bf[0], bf[1], (K - 3) * sizeof(uint16_t));

        /* blocks a q8 scale cannot hold: a NaN or an infinity (dx NaN, q 0: the NaN reaches the
         * product, as in fp32), a maximum below 2^-96 (subnormals too: a zero block), in every
         * variant alike, and no q of -128 anywhere */
        float odd[4 * 32];
        for (int i = 0; i < 4 * 32; i++)
                odd[i] = rndf();
        odd[5] = NAN;
        odd[32 + 7] = -INFINITY;
        for (int i = 64; i < 96; i++)
                odd[i] = (i % 2 ? 1 : -1) * 0x1p-130f * (float) (i - 63); /* subnormal and tiny */
        for (int v = 0; v < 2; v++) {
                quant_set_simd(v ? 2 : 0);
                quant_q8_quantize(odd, 4 * 32, rows[v]);
        }
        const int8_t *oq = (const int8_t *) rows[1];
        const float *odx = (const float *) (rows[1] + 4 * 32);
        assert_true(isnan(odx[0]) && isnan(odx[1]) && odx[2] == 0.0f && isfinite(odx[3]) && odx[3] > 0);
        for (int i = 0; i < 96; i++)
                assert_int_equal(oq[i], 0);
        for (int i = 0; i < 4 * 32; i++)
                assert_true(oq[i] >= -127);
        assert_memory_equal(rows[0], rows[1], 4 * 32); /* the values; NaN scales compared above */
        for (int v = 0; v < 2; v++) {
                const float *d = (const float *) (rows[v] + 4 * 32);
                assert_true(isnan(d[0]) && isnan(d[1]) && d[2] == 0.0f && d[3] == odx[3]);
        }
        /* a product with a NaN block is NaN in every variant */
        void *w = random_row(GGML_TYPE_IQ4_NL, 4 * 32);
        uint64_t rb = 0;
        assert_int_equal(ggml_row_bytes(GGML_TYPE_IQ4_NL, 4 * 32, &rb), 0);
        void *pw = malloc(quant_q8_packed_bytes(GGML_TYPE_IQ4_NL, 1, 4 * 32));
        quant_q8_pack(GGML_TYPE_IQ4_NL, w, rb, 1, 4 * 32, pw);
        for (int v = 0; v < 2; v++) {
                float y = 0;
                quant_set_simd(v ? 2 : 0);
                quant_gemm_q8(GGML_TYPE_IQ4_NL, pw, 1, 4 * 32, 0, 1, rows[1], quant_q8_row_bytes(4 * 32), 1, &y, 1);
                assert_true(isnan(y));
        }
        free(w);
        free(pw);
        quant_set_simd(2);
}

/* The documented q8 order (quant.h), written independently from dequantized weights: per block
 * the integer sum (for Q6_K each 16-value run's sum times its scale), then one fma a block with
 * d·dx, one chain. Weights: the dequantization's integers recovered as value / (d·sc) (exact: the
 * dequantized value d·sc·q is exact in fp32 for these formats). */
/* Q4_K / Q5_K from ggml's layout (d, dmin, 12 bytes of six-bit scales and mins, Q5_K's 32 bytes of
 * fifth bits, 128 bytes of nibbles: 64 values a 32-byte run, low nibbles first), written here
 * apart from the library: block j's scale, min, and its 32 unsigned numbers. */
static void documented_k_block(uint32_t type, const uint8_t *blk, int j, int32_t *sc, int32_t *m,
                               uint8_t u[32]) {
        const uint8_t *s = blk + 4, *qh = blk + 16, *qs = blk + (type == GGML_TYPE_Q5_K ? 48 : 16);

        if (j < 4) {
                *sc = s[j] & 63;
                *m = s[j + 4] & 63;
        } else {
                *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
                *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
        }
        for (int i = 0; i < 32; i++) {
                u[i] = (uint8_t) ((qs[32 * (j / 2) + i] >> (4 * (j % 2))) & 15);
                if (type == GGML_TYPE_Q5_K)
                        u[i] = (uint8_t) (u[i] | ((qh[i] >> j) & 1) << 4);
        }
}

/* Block b (32 values) of a Q4_K / Q5_K / Q4_1 / Q5_0 / Q5_1 / IQ4_XS row, from ggml's layouts as
 * written here: value i = (d·sc)·u[i] + ms·(dm·m) in fp32, u the block's integers (Q5_0's less 16,
 * IQ4_XS's from the codebook), sc the block's integer scale (1 where none), m its integer min
 * and ms the min's sign (no min term at all where !has_m: Q5_0, IQ4_XS). False for another
 * type. */
struct documented_block {
        int32_t u[32], sc, m, ms;
        float d, dm;
        bool has_m;
};

static bool documented_block(uint32_t type, const void *row, size_t b, struct documented_block *o) {
        uint16_t h[2] = { 0, 0 };

        o->sc = 1;
        o->m = 0;
        o->ms = 1;
        o->has_m = false;
        if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K) {
                const uint8_t *blk = (const uint8_t *) row + b / 8 * (type == GGML_TYPE_Q5_K ? 176 : 144);
                uint8_t u[32];
                memcpy(h, blk, 4);
                documented_k_block(type, blk, (int) (b % 8), &o->sc, &o->m, u);
                for (int i = 0; i < 32; i++)
                        o->u[i] = u[i];
                o->ms = -1;
                o->has_m = true;
        } else if (type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1) {
                /* ggml's blocks: d, m (not Q5_0), the fifth bits as a little-endian word (not Q4_1:
                 * bit j for value j, bit j + 16 for value j + 16), 16 bytes of nibbles (low: value
                 * j, high: j + 16); Q5_0 is d·(u − 16), the others d·u + m */
                const bool has_m = type != GGML_TYPE_Q5_0, has_h = type != GGML_TYPE_Q4_1;
                const size_t bb = 2 + (has_m ? 2 : 0) + (has_h ? 4 : 0) + 16;
                const uint8_t *blk = (const uint8_t *) row + b * bb, *qs = blk + bb - 16;
                uint32_t qh = 0;
                memcpy(h, blk, has_m ? 4 : 2);
                if (has_h)
                        memcpy(&qh, blk + (has_m ? 4 : 2), 4);
                for (int i = 0; i < 32; i++) {
                        int u = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
                        u |= (int) ((qh >> i) & 1) << 4;
                        o->u[i] = has_m ? u : u - 16;
                }
                o->m = has_m;
                o->has_m = has_m;
        } else if (type == GGML_TYPE_IQ4_XS) { /* d, u16 scales_h, u8 scales_l[4], then 8 blocks' nibbles */
                static const int8_t book[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
                                                 1,    13,   25,  38,  53,  69,  89,  113 };
                const uint8_t *blk = (const uint8_t *) row + b / 8 * 136, *qs = blk + 8 + 16 * (b % 8);
                const int j = (int) (b % 8);
                uint16_t sh;
                memcpy(h, blk, 2);
                memcpy(&sh, blk + 2, 2);
                o->sc = (((blk[4 + j / 2] >> (4 * (j % 2))) & 15) | ((sh >> (2 * j)) & 3) << 4) - 32;
                for (int i = 0; i < 16; i++) {
                        o->u[i] = book[qs[i] & 15];
                        o->u[i + 16] = book[qs[i] >> 4];
                }
        } else
                return false;
        o->d = quant_fp16_to_f32(h[0]);
        o->dm = quant_fp16_to_f32(h[1]);
        return true;
}

static float documented_q8_dot(uint32_t type, const void *row, size_t k, const uint8_t *xq) {
        float *wf = malloc(k * sizeof *wf), acc = 0.0f;
        const int8_t *q = (const int8_t *) xq;
        const float *dx = (const float *) (xq + k);
        struct documented_block db;

        if (documented_block(type, row, 0, &db)) { /* quant.h: the scale's fma, then the min's */
                assert_int_equal(quant_dequantize_row(type, row, wf, k), 0);
                for (size_t b = 0; b < k / 32; b++) {
                        int32_t S = 0, Q = 0;
                        documented_block(type, row, b, &db);
                        /* the decoder above is the library's dequantization, bit for bit */
                        float wd[32];
                        for (int i = 0; i < 32; i++) {
                                wd[i] = db.d * (float) db.sc * (float) db.u[i];
                                if (db.has_m)
                                        wd[i] = db.ms > 0 ? wd[i] + db.dm * (float) db.m : wd[i] - db.dm * (float) db.m;
                        }
                        assert_memory_equal(wd, wf + 32 * b, sizeof wd);
                        for (int i = 0; i < 32; i++) {
                                S += db.u[i] * q[32 * b + (size_t) i];
                                Q += q[32 * b + (size_t) i];
                        }
                        acc = fmaf((float) (db.sc * S), db.d * dx[b], acc);
                        if (db.has_m)
                                acc = fmaf((float) (db.ms * db.m * Q), db.dm * dx[b], acc);
                }
                free(wf);
                return acc;
        }

        assert_int_equal(quant_dequantize_row(type, row, wf, k), 0);
        for (size_t b = 0; b < k / 32; b++) {
                float d;
                int32_t L = 0;
                if (type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_Q4_0)
                        d = quant_fp16_to_f32(((const struct block_iq4_nl *) row)[b].d);
                else if (type == GGML_TYPE_Q8_0)
                        d = quant_fp16_to_f32(((const struct block_q8_0 *) row)[b].d);
                else
                        d = quant_fp16_to_f32(((const struct block_q6_k *) row)[b / 8].d);
                for (int h = 0; h < 2; h++) {
                        int32_t S = 0, sc = 1;
                        if (type == GGML_TYPE_Q6_K) { /* the 16-value run's scale */
                                const struct block_q6_k *blk = (const struct block_q6_k *) row + b / 8;
                                int run = (int) (2 * (b % 8)) + h;
                                sc = blk->scales[8 * (run / 8) + (run % 2) + 2 * ((run % 8) / 2)];
                        }
                        /* the integer weight: value / (d·sc), exact; with d·sc = 0 the run adds 0 */
                        for (int i = 16 * h; i < 16 * h + 16 && (double) d * sc != 0; i++) {
                                double wi = (double) wf[32 * b + i] / ((double) d * sc);
                                assert_true(wi == rint(wi));
                                S += (int32_t) wi * q[32 * b + i];
                        }
                        L += sc * S;
                }
                acc = fmaf((float) L, d * dx[b], acc);
        }
        free(wf);
        return acc;
}

/* A row at the integer products' limits: every weight at its most negative (low) or most
 * positive value (Q8_0 -128 / 127, IQ4_NL's and Q4_0's codebook ends, Q6_K 0 / 63 with every
 * scale -128 / 127, Q4_K / Q5_K 0 / 15 / 31 with every scale and min 63, IQ4_XS's codebook ends
 * with every scale -32 / 31, Q4_1 / Q5_0 / Q5_1 0 or the top), the scales kept finite. */
static void extreme_row(uint32_t type, uint8_t *row, size_t k, bool low) {
        for (size_t b = 0; b < k / 32; b++)
                if (type == GGML_TYPE_Q8_0)
                        memset(((struct block_q8_0 *) row)[b].qs, low ? 0x80 : 0x7f, 32);
                else if (type == GGML_TYPE_IQ4_NL || type == GGML_TYPE_Q4_0)
                        memset(((struct block_iq4_nl *) row)[b].qs, low ? 0x00 : 0xff, 16);
        if (type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1) { /* u 0 or the top */
                const size_t bb = type == GGML_TYPE_Q4_1 ? 20 : type == GGML_TYPE_Q5_0 ? 22 : 24;
                const size_t head = type == GGML_TYPE_Q5_0 ? 2 : 4;
                for (size_t b = 0; b < k / 32; b++)
                        memset((uint8_t *) row + b * bb + head, low ? 0x00 : 0xff, bb - head);
        }
        if (type == GGML_TYPE_IQ4_XS) /* the codebook's ends, every scale -32 or 31 */
                for (size_t s = 0; s < k / 256; s++)
                        memset((uint8_t *) row + s * 136 + 2, low ? 0x00 : 0xff, 134);
        if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K) /* numbers 0 or the top, scales and mins 63 */
                for (size_t s = 0; s < k / 256; s++) {
                        uint8_t *blk = row + s * (type == GGML_TYPE_Q5_K ? 176 : 144);
                        memset(blk + 4, 0xff, 12);
                        memset(blk + 16, low ? 0x00 : 0xff, type == GGML_TYPE_Q5_K ? 160 : 128);
                }
        if (type == GGML_TYPE_Q6_K)
                for (size_t s = 0; s < k / 256; s++) {
                        struct block_q6_k *blk = (struct block_q6_k *) row + s;
                        memset(blk->ql, low ? 0x00 : 0xff, sizeof blk->ql);
                        memset(blk->qh, low ? 0x00 : 0xff, sizeof blk->qh);
                        memset(blk->scales, low ? 0x80 : 0x7f, sizeof blk->scales);
                }
}

/* The integer products: every variant (AVX-512 VNNI and AVX2 where the CPU has them, the
 * portable code) gives the documented order's bits for every input of a batch of 1-11 (passes of
 * 8 or 4 inputs and their remainders) and every row range (whole 16-row groups, groups and
 * 8-row halves cut at either end, the last group, padded to 16 rows), odd block counts
 * included, on random rows and on rows at the integer limits; and the result is within a q8
 * bound of the fp32 product. */
static void test_gemm_q8(void **state) {
        static const uint32_t types[] = { GGML_TYPE_IQ4_NL, GGML_TYPE_Q8_0, GGML_TYPE_Q6_K,
                                          GGML_TYPE_Q4_0,  GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_IQ4_XS,
                                          GGML_TYPE_Q4_1,  GGML_TYPE_Q5_0, GGML_TYPE_Q5_1 };
        static const size_t ks[] = { 32, 96, 256, 512 };
        static const size_t ranges[][2] = { { 0, 37 }, { 3, 35 }, { 16, 32 }, { 0, 5 }, { 33, 37 }, { 31, 34 } };
        const size_t R = 37, T = 11;

        (void) state;
        for (int extreme = 0; extreme < 2; extreme++)
        for (size_t ti = 0; ti < ELEMENTSOF(types); ti++)
                for (size_t ki = 0; ki < ELEMENTSOF(ks); ki++) {
                        const uint32_t type = types[ti];
                        const size_t k = ks[ki], xs = quant_q8_row_bytes(k);
                        if (k % quant_q8_block_values(type))
                                continue;
                        uint64_t rb = 0;
                        assert_int_equal(ggml_row_bytes(type, k, &rb), 0);
                        uint8_t *w = malloc(R * rb), *pw = malloc(quant_q8_packed_bytes(type, R, k)), *xq = malloc(T * xs);
                        float *x = malloc(T * k * sizeof *x), *panel = malloc(R * k * sizeof *panel);
                        float want[11][37], y[11 * 37], f32[11 * 37];
                        for (size_t r = 0; r < R; r++) {
                                void *row = random_row(type, k);
                                memcpy(w + r * rb, row, rb);
                                free(row);
                                if (extreme && r % 4 < 2)
                                        extreme_row(type, w + r * rb, k, r % 4 == 0);
                        }
                        assert_int_equal(quant_q8_packed_bytes(type, R, k), 48 * rb); /* 37 rows: 3 groups */
                        quant_q8_pack(type, w, rb, R, k, pw);
                        for (size_t i = 0; i < T * k; i++) /* extreme: q of ±127 throughout */
                                x[i] = extreme ? (i / k % 2 ? -1.0f : 1.0f) : rndf() * (float) (1 + i % 7);
                        for (size_t t = 0; t < T; t++) {
                                quant_q8_quantize(x + t * k, k, xq + t * xs);
                                for (size_t r = 0; r < R; r++)
                                        want[t][r] = documented_q8_dot(type, w + r * rb, k, xq + t * xs);
                        }
                        quant_dequantize_rows(type, w, rb, R, k, panel);
                        quant_gemm_f32(panel, R, k, x, k, T, f32, R);
                        for (size_t li = 0; li < ELEMENTSOF(simd_levels); li++) {
                                const char *v = quant_set_simd(simd_levels[li]);
                                for (size_t ri = 0; ri < ELEMENTSOF(ranges); ri++)
                                        for (size_t nt = 1; nt <= T; nt++) {
                                                const size_t r0 = ranges[ri][0], r1 = ranges[ri][1], n = r1 - r0;
                                                for (size_t i = 0; i < ELEMENTSOF(y); i++)
                                                        y[i] = -1.0f;
                                                quant_gemm_q8(type, pw, R, k, r0, r1, xq, xs, nt, y, n);
                                                for (size_t t = 0; t < nt; t++)
                                                        for (size_t r = r0; r < r1; r++)
                                                                if (bits_of(y[t * n + r - r0]) != bits_of(want[t][r]))
                                                                        fail_msg("%s k %zu %s rows %zu-%zu batch %zu: input %zu row %zu: %a, documented %a",
                                                                                 ggml_type_name(type), k, v, r0, r1, nt, t, r,
                                                                                 y[t * n + r - r0], want[t][r]);
                                                assert_true(nt * n >= ELEMENTSOF(y) || y[nt * n] == -1.0f); /* nothing past */
                                        }
                        }
                        quant_set_simd(2);
                        /* q8 rounding: each product term is off by at most |w|·dx/2, so the sum by
                         * at most Σ|w_i|·dx_b/2 (plus fp32 rounding): checked against that bound */
                        for (size_t t = 0; t < T; t++)
                                for (size_t r = 0; r < R; r++) {
                                        double bound = 1e-5 * fabs(f32[t * R + r]);
                                        const float *dx = (const float *) (xq + t * xs + k);
                                        for (size_t i = 0; i < k; i++)
                                                bound += fabs((double) panel[r * k + i]) * dx[i / 32] * 0.5;
                                        assert_true(fabs((double) want[t][r] - f32[t * R + r]) <= bound);
                                }
                        free(w);
                        free(pw);
                        free(xq);
                        free(x);
                        free(panel);
                }
}

/* The BF16 products: the CPU's instruction (where it has one) and the portable definition give
 * the same bits, on ordinary values and on random bit patterns (subnormals, huge values; no
 * NaN), for k around the 32-value chunk, and every input of a batch the bits it has alone. */
static void test_gemm_bf16(void **state) {
        static const size_t ks[] = { 7, 32, 50, 96, 100, 512 };
        const size_t R = 9, T = 5;
        bool hw = (quant_set_simd(2), quant_bf16_dot_available());

        (void) state;
        for (size_t ki = 0; ki < ELEMENTSOF(ks); ki++)
                for (int pattern = 0; pattern < 2; pattern++) {
                        const size_t k = ks[ki];
                        uint16_t *w = malloc(R * k * 2), *x = malloc(T * k * 2);
                        float y[2][5 * 9], one[9];
                        for (size_t i = 0; i < R * k; i++) {
                                w[i] = pattern ? (uint16_t) rnd() : quant_f32_to_bf16(rndf());
                                if ((w[i] & 0x7f80) == 0x7f80) /* no inf / NaN */
                                        w[i] &= 0xbfff;
                        }
                        for (size_t i = 0; i < T * k; i++) {
                                x[i] = pattern ? (uint16_t) rnd() : quant_f32_to_bf16(rndf());
                                if ((x[i] & 0x7f80) == 0x7f80)
                                        x[i] &= 0xbfff;
                        }
                        for (int level = 0; level < 2; level++) {
                                quant_set_simd(level ? 2 : 0);
                                quant_gemm_bf16(w, k * 2, R, k, x, k, T, y[level], R);
                                for (size_t t = 0; t < T; t++) {
                                        quant_gemm_bf16(w, k * 2, R, k, x + t * k, k, 1, one, 1);
                                        for (size_t r = 0; r < R; r++)
                                                if (bits_of(one[r]) != bits_of(y[level][t * R + r]) &&
                                                    !(isnan(one[r]) && isnan(y[level][t * R + r])))
                                                        fail_msg("k %zu input %zu row %zu: alone %a, in a batch %a",
                                                                 k, t, r, one[r], y[level][t * R + r]);
                                }
                        }
                        for (size_t i = 0; i < R * T; i++)
                                if (bits_of(y[0][i]) != bits_of(y[1][i]) && !(isnan(y[0][i]) && isnan(y[1][i])))
                                        fail_msg("k %zu pattern %d output %zu: portable %a, %s %a", k, pattern, i,
                                                 y[0][i], hw ? "vdpbf16ps" : "portable", y[1][i]);
                        if (!pattern) /* ordinary values: near the double-precision sum */
                                for (size_t t = 0; t < T; t++)
                                        for (size_t r = 0; r < R; r++) {
                                                double ref = 0, mag = 0;
                                                for (size_t i = 0; i < k; i++) {
                                                        double p = (double) quant_bf16_to_f32(w[r * k + i]) *
                                                                   quant_bf16_to_f32(x[t * k + i]);
                                                        ref += p;
                                                        mag += fabs(p);
                                                }
                                                assert_true(fabs(y[0][t * R + r] - ref) <= 1e-6 * mag + 1e-30);
                                        }
                        free(w);
                        free(x);
                }
        quant_set_simd(2);
        print_message("BF16 products: %s\n", hw ? "vdpbf16ps and the portable definition agree" :
                                                  "no BF16 dot instruction here: the portable definition only");
}

/* Attention's softmax: within a few float ulp of the double-precision softmax (including the
 * scores far below the max), the same bits in every ISA variant, for lengths around the 16 lanes. */
static void test_softmax(void **state) {
        static const size_t lens[] = { 1, 15, 16, 37, 300 };
        float in[300], ref_bits[300], s[300];
        double e[300];

        (void) state;
        for (size_t li = 0; li < ELEMENTSOF(lens); li++) {
                size_t n = lens[li];
                for (size_t i = 0; i < n; i++)
                        in[i] = 8.0f * rndf() - (i % 7 == 3 ? 900.0f : 0.0f); /* some below the clamp */
                double mx = -INFINITY, sum = 0;
                for (size_t i = 0; i < n; i++)
                        mx = fmax(mx, 0.125 * in[i]);
                for (size_t i = 0; i < n; i++)
                        sum += e[i] = exp(0.125 * in[i] - mx);
                for (size_t v = 0; v < ELEMENTSOF(simd_levels); v++) {
                        const char *name = quant_set_simd(simd_levels[v]);
                        memcpy(s, in, n * sizeof *s);
                        quant_softmax(s, n, 0.125f);
                        for (size_t i = 0; i < n; i++)
                                if (fabs(s[i] - e[i] / sum) > 1e-6 * (e[i] / sum) + 1e-30)
                                        fail_msg("%s: n %zu, p[%zu] = %.9g, double softmax %.9g", name, n,
                                                 i, s[i], e[i] / sum);
                        if (v == 0)
                                memcpy(ref_bits, s, n * sizeof *s);
                        else if (memcmp(ref_bits, s, n * sizeof *s) != 0)
                                fail_msg("%s: n %zu: softmax differs from the best variant", name, n);
                }
        }
        quant_set_simd(2);
}

/* Attention's weighted row sums: every element accumulated in row order, the same bits in every
 * ISA variant as the scalar loop (rows strided, k not a multiple of 16; 6 heads: a group of 4,
 * then 2 alone). */
static void test_weighted_rows(void **state) {
        const size_t n = 37, k = 133, stride = 150, H = 6, ps = 41, os = 140;
        float *rows = malloc(n * stride * sizeof *rows), *P = malloc(H * ps * sizeof *P);
        float *ref = calloc(H * os, sizeof *ref), *out = malloc(H * os * sizeof *out);

        (void) state;
        for (size_t i = 0; i < n * stride; i++)
                rows[i] = rndf();
        for (size_t i = 0; i < H * ps; i++)
                P[i] = rndf();
        for (size_t r = 0; r < n; r++)
                for (size_t h = 0; h < H; h++)
                        for (size_t j = 0; j < k; j++) {
                                float m = P[h * ps + r] * rows[r * stride + j];
                                ref[h * os + j] = ref[h * os + j] + m;
                        }
        for (size_t v = 0; v < ELEMENTSOF(simd_levels); v++) {
                const char *name = quant_set_simd(simd_levels[v]);
                memset(out, 0, H * os * sizeof *out);
                quant_weighted_rows(rows, stride, n, k, P, ps, H, out, os);
                for (size_t h = 0; h < H; h++)
                        if (memcmp(out + h * os, ref + h * os, k * sizeof *out) != 0)
                                fail_msg("%s: weighted rows of head %zu differ from the scalar loop", name, h);
        }
        quant_set_simd(2);
        free(rows);
        free(P);
        free(ref);
        free(out);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fp16_to_f32), cmocka_unit_test(test_f32_to_fp16),
                cmocka_unit_test(test_bf16),        cmocka_unit_test(test_iq4nl_blocks),
                cmocka_unit_test(test_q8_0_blocks), cmocka_unit_test(test_q6k_blocks),
                cmocka_unit_test(test_bad_rows),    cmocka_unit_test(test_dot),
                cmocka_unit_test(test_gemm),        cmocka_unit_test(test_weighted_rows),
                cmocka_unit_test(test_gemv),        cmocka_unit_test(test_softmax),
                cmocka_unit_test(test_other_formats),
                cmocka_unit_test(test_q8_quantize), cmocka_unit_test(test_gemm_q8),
                cmocka_unit_test(test_gemm_bf16),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
