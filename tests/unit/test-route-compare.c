/* SPDX-License-Identifier: MIT */
/* The routing-trace comparison x4-gpu-check parity uses to explain CUDA-vs-CPU logit misses
 * (tests/gpu/route-compare.h), on constructed traces: it runs on the GPU machine only, so its
 * verdicts are pinned here. A miss is explained only by an expert-set flip at that position whose
 * CPU-side margin is a near-tie (< ROUTE_NEAR_TIE; < ROUTE_NEAR_TIE_BF16 with bf16-input
 * tensor-core products); a flip with a clear margin or no flip at all is a failure. x4-gpu-check
 * nextn explains a NextN row by any of the routings that feed it (route_judge_any). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "../gpu/route-compare.h"

#define N_POS 3u
#define N_LAYER 3u /* layer 0 dense (never traced), 1 and 2 MoE */
#define N_EXP 6u
#define K 2u

/* Both traces: every position, MoE layers 1-2, scores with a clear top-2 {1, 4} (margin 0.3). */
static void base_traces(struct route_trace *cpu, struct route_trace *cuda) {
        const float s[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.50f, 0.80f, 0.20f };
        const int32_t sel[K] = { 1, 4 };

        assert_int_equal(route_trace_init(cpu, N_POS, N_LAYER, N_EXP, K), 0);
        assert_int_equal(route_trace_init(cuda, N_POS, N_LAYER, N_EXP, K), 0);
        for (uint32_t p = 0; p < N_POS; p++)
                for (uint32_t l = 1; l < N_LAYER; l++) {
                        route_trace_collect(l, p, s, N_EXP, sel, K, cpu);
                        route_trace_collect(l, p, s, N_EXP, sel, K, cuda);
                }
}

static void test_margin(void **state) {
        const float s[5] = { 0.5f, 0.9f, 0.7f, 0.1f, 0.7f };

        (void) state;
        /* sorted 0.9, 0.7 (id 2), 0.7 (id 4), 0.5, 0.1 */
        assert_float_equal(route_margin(s, 5, 1), 0.2, 1e-6);
        assert_float_equal(route_margin(s, 5, 2), 0.0, 0.0); /* a tie between ids 2 and 4 */
        assert_float_equal(route_margin(s, 5, 3), 0.2, 1e-6);
        assert_true(isinf(route_margin(s, 5, 5)));
}

static void test_sets(void **state) {
        const int32_t a[3] = { 4, 1, 7 }, b[3] = { 7, 4, 1 }, c[3] = { 4, 1, 2 };
        int32_t only[3];

        (void) state;
        assert_true(route_same_set(a, b, 3)); /* selection order does not matter */
        assert_false(route_same_set(a, c, 3));
        assert_int_equal(route_only_in(a, c, 3, only), 1);
        assert_int_equal(only[0], 7);
        assert_int_equal(route_only_in(c, a, 3, only), 1);
        assert_int_equal(only[0], 2);
}

static void test_collect(void **state) {
        struct route_trace t;
        const float s[N_EXP] = { 0 };
        const int32_t sel[K] = { 3, 0 };

        (void) state;
        assert_int_equal(route_trace_init(&t, N_POS, N_LAYER, N_EXP, K), 0);
        /* a decode step: the hook's token 0 is position 2 */
        t.offset = 2;
        route_trace_collect(1, 0, s, N_EXP, sel, K, &t);
        assert_true(route_trace_has(&t, 2, 1));
        assert_false(route_trace_has(&t, 0, 1));
        assert_int_equal(route_trace_sel(&t, 2, 1)[0], 3);
        /* beyond the shape: dropped, not written */
        route_trace_collect(1, 1, s, N_EXP, sel, K, &t);     /* position 3 of 3 */
        route_trace_collect(N_LAYER, 0, s, N_EXP, sel, K, &t);
        route_trace_collect(2, 0, s, N_EXP + 1, sel, K, &t);
        route_trace_collect(2, 0, s, N_EXP, sel, K + 1, &t);
        assert_int_equal(t.calls, 5);
        assert_int_equal(t.dropped, 4);
        assert_false(route_trace_has(&t, 2, 2));
        route_trace_free(&t);
}

/* identical routing: no difference anywhere; a miss is then not explained */
static void test_no_flip(void **state) {
        struct route_trace cpu, cuda;
        struct route_pos_cmp c;

        (void) state;
        base_traces(&cpu, &cuda);
        route_compare_position(&cpu, &cuda, 1, &c);
        assert_int_equal(c.n_layers, 2);
        assert_int_equal(c.n_missing, 0);
        assert_int_equal(c.n_differ, 0);
        assert_int_equal(c.first_layer, -1);
        assert_int_equal(route_judge(5e-7, 1e-3, &c), ROUTE_WITHIN);
        assert_int_equal(route_judge(0.144, 1e-3, &c), ROUTE_NO_FLIP);
        route_trace_free(&cpu);
        route_trace_free(&cuda);
}

/* at position 2 layer 2 experts 4 and 3 are within 3e-8 (fp32 rounding): CPU takes 4, CUDA 3 */
static void test_near_tie_flip(void **state) {
        struct route_trace cpu, cuda;
        struct route_pos_cmp c;
        const float sc[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.70000000f, 0.70000006f, 0.20f };
        const float sg[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.70000006f, 0.70000000f, 0.20f };
        const int32_t selc[K] = { 1, 4 }, selg[K] = { 1, 3 };

        (void) state;
        base_traces(&cpu, &cuda);
        route_trace_collect(2, 2, sc, N_EXP, selc, K, &cpu);
        route_trace_collect(2, 2, sg, N_EXP, selg, K, &cuda);

        route_compare_position(&cpu, &cuda, 2, &c);
        assert_int_equal(c.n_differ, 1);
        assert_int_equal(c.first_layer, 2);
        assert_int_equal(c.tie_layer, 2);
        assert_true(c.min_margin_a > 0 && c.min_margin_a < 1e-7);
        assert_true(c.min_margin_b > 0 && c.min_margin_b < 1e-7);
        assert_int_equal(route_judge(0.144, 1e-3, &c), ROUTE_EXPLAINED);
        /* the other positions are untouched: a miss there stays unexplained */
        route_compare_position(&cpu, &cuda, 1, &c);
        assert_int_equal(c.n_differ, 0);
        assert_int_equal(route_judge(0.144, 1e-3, &c), ROUTE_NO_FLIP);
        route_trace_free(&cpu);
        route_trace_free(&cuda);
}

/* CUDA picks expert 0 although CPU's margin is 0.3: a real fault, not rounding */
static void test_big_margin_flip(void **state) {
        struct route_trace cpu, cuda;
        struct route_pos_cmp c;
        const float s[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.50f, 0.80f, 0.20f };
        const int32_t selg[K] = { 1, 0 };

        (void) state;
        base_traces(&cpu, &cuda);
        route_trace_collect(1, 0, s, N_EXP, selg, K, &cuda);
        route_compare_position(&cpu, &cuda, 0, &c);
        assert_int_equal(c.n_differ, 1);
        assert_int_equal(c.first_layer, 1);
        assert_float_equal(c.min_margin_a, 0.3, 1e-6);
        assert_float_equal(c.max_margin_a, 0.3, 1e-6);
        assert_int_equal(route_judge(0.144, 1e-3, &c), ROUTE_FLIP_NOT_TIE);
        assert_int_equal(route_judge(1e-4, 1e-3, &c), ROUTE_WITHIN);
        route_trace_free(&cpu);
        route_trace_free(&cuda);
}

/* two flips at one position: the first (layer 1) has a big margin, the later one (layer 2) is a
 * near-tie; the near-tie explains the miss, and both are reported */
static void test_two_flips(void **state) {
        struct route_trace cpu, cuda;
        struct route_pos_cmp c;
        const float s[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.50f, 0.80f, 0.20f };
        const float t[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.80001f, 0.80f, 0.20f };
        const int32_t sel_big[K] = { 1, 0 }, selc[K] = { 1, 3 }, selg[K] = { 1, 4 };

        (void) state;
        base_traces(&cpu, &cuda);
        route_trace_collect(1, 1, s, N_EXP, sel_big, K, &cuda);
        route_trace_collect(2, 1, t, N_EXP, selc, K, &cpu);
        route_trace_collect(2, 1, t, N_EXP, selg, K, &cuda);
        route_compare_position(&cpu, &cuda, 1, &c);
        assert_int_equal(c.n_differ, 2);
        assert_int_equal(c.first_layer, 1);
        assert_float_equal(c.first_margin_a, 0.3, 1e-6);
        assert_int_equal(c.tie_layer, 2);
        assert_float_equal(c.min_margin_a, 1e-5, 1e-6);
        assert_float_equal(c.max_margin_a, 0.3, 1e-6);
        assert_int_equal(route_judge(0.02, 1e-3, &c), ROUTE_EXPLAINED);
        route_trace_free(&cpu);
        route_trace_free(&cuda);
}

/* a backend that never calls the hook (or skips a layer) leaves cells missing: counted, and a
 * miss there is not explained */
static void test_missing(void **state) {
        struct route_trace cpu, cuda;
        struct route_pos_cmp c;

        (void) state;
        base_traces(&cpu, &cuda);
        memset(cuda.seen, 0, (size_t) N_POS * N_LAYER);
        route_compare_position(&cpu, &cuda, 0, &c);
        assert_int_equal(c.n_layers, 0);
        assert_int_equal(c.n_missing, 2);
        assert_int_equal(route_judge(0.144, 1e-3, &c), ROUTE_NO_FLIP);
        assert_string_equal(route_verdict_name(ROUTE_NO_FLIP), "NOT explained (no routing flip)");
        route_trace_free(&cpu);
        route_trace_free(&cuda);
}

/* bf16-input tensor-core products (x4-gpu-check nextn with X4_CUDA_MM=tc): at position 1 layer 1
 * the CPU ranks expert 4 over 3 by 3e-3, far beyond fp32 rounding but within bf16's; CUDA takes 3.
 * The tensor-core bound explains it, the fp32 one does not, and a clear margin stays a fault. */
static void test_bf16_near_tie(void **state) {
        struct route_trace cpu, cuda;
        struct route_pos_cmp c;
        const float sc[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.797f, 0.800f, 0.20f };
        const float sg[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.801f, 0.799f, 0.20f };
        const int32_t selc[K] = { 1, 4 }, selg[K] = { 1, 3 };

        (void) state;
        assert_true(ROUTE_NEAR_TIE_BF16 > ROUTE_NEAR_TIE);
        /* two scores of ~1.2 moving 2^-8 of themselves apart in opposite directions */
        assert_true(ROUTE_NEAR_TIE_BF16 >= 2 * 1.2 * (1.0 / 256));
        base_traces(&cpu, &cuda);
        route_trace_collect(1, 1, sc, N_EXP, selc, K, &cpu);
        route_trace_collect(1, 1, sg, N_EXP, selg, K, &cuda);
        route_compare_position(&cpu, &cuda, 1, &c);
        assert_int_equal(c.n_differ, 1);
        assert_int_equal(c.tie_layer, 1);
        assert_float_equal(c.min_margin_a, 3e-3, 1e-6);
        assert_float_equal(c.min_margin_b, 2e-3, 1e-6);
        assert_int_equal(route_judge_tie(0.498, 1e-2, &c, ROUTE_NEAR_TIE_BF16), ROUTE_EXPLAINED);
        assert_int_equal(route_judge_tie(0.498, 1e-2, &c, ROUTE_NEAR_TIE), ROUTE_FLIP_NOT_TIE);
        assert_int_equal(route_judge(0.498, 1e-2, &c), ROUTE_FLIP_NOT_TIE); /* the fp32 rule */
        assert_int_equal(route_judge_tie(5e-3, 1e-2, &c, ROUTE_NEAR_TIE_BF16), ROUTE_WITHIN);
        /* the big-margin fault of test_big_margin_flip, judged with the bf16 bound */
        route_compare_position(&cpu, &cuda, 0, &c);
        assert_int_equal(route_judge_tie(0.498, 1e-2, &c, ROUTE_NEAR_TIE_BF16), ROUTE_NO_FLIP);
        route_trace_collect(1, 0, (const float[N_EXP]){ 0.40f, 0.95f, 0.10f, 0.50f, 0.80f, 0.20f },
                            N_EXP, (const int32_t[K]){ 1, 0 }, K, &cuda);
        route_compare_position(&cpu, &cuda, 0, &c);
        assert_float_equal(c.min_margin_a, 0.3, 1e-6);
        assert_int_equal(route_judge_tie(0.498, 1e-2, &c, ROUTE_NEAR_TIE_BF16), ROUTE_FLIP_NOT_TIE);
        route_trace_free(&cpu);
        route_trace_free(&cuda);
}

/* A NextN row fed by two routings (the trunk's at its position, the NextN block's): explained when
 * either flipped on a near-tie, and `which` names it; a clear-margin flip alone is a fault, no flip
 * anywhere is NO_FLIP, and a row within the bound is never judged. */
static void test_judge_any(void **state) {
        struct route_trace cpu, cuda, bcpu, bcuda;
        struct route_pos_cmp c[2];
        const float tie_c[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.797f, 0.800f, 0.20f };
        const float tie_g[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.801f, 0.799f, 0.20f };
        const float clear[N_EXP] = { 0.40f, 0.95f, 0.10f, 0.50f, 0.80f, 0.20f };
        const int32_t sel_base[K] = { 1, 4 }, sel_tie[K] = { 1, 3 }, sel_big[K] = { 1, 0 };
        int32_t which = 7;

        (void) state;
        base_traces(&cpu, &cuda);        /* the trunk: MoE layers 1-2 */
        assert_int_equal(route_trace_init(&bcpu, N_POS, 1, N_EXP, K), 0); /* the block: one layer */
        assert_int_equal(route_trace_init(&bcuda, N_POS, 1, N_EXP, K), 0);
        for (uint32_t p = 0; p < N_POS; p++) {
                route_trace_collect(0, p, clear, N_EXP, sel_base, K, &bcpu);
                route_trace_collect(0, p, clear, N_EXP, sel_base, K, &bcuda);
        }
        /* position 0: no flip in either */
        route_compare_position(&cpu, &cuda, 0, &c[0]);
        route_compare_position(&bcpu, &bcuda, 0, &c[1]);
        assert_int_equal(route_judge_any(1e-3, 1e-2, c, 2, ROUTE_NEAR_TIE_BF16, &which),
                         ROUTE_WITHIN);
        assert_int_equal(which, -1);
        which = 7;
        assert_int_equal(route_judge_any(0.7, 1e-2, c, 2, ROUTE_NEAR_TIE_BF16, &which),
                         ROUTE_NO_FLIP);
        assert_int_equal(which, -1);
        /* position 1: the trunk flips on a clear margin, the block on a near-tie: explained by
         * the block (index 1) */
        route_trace_collect(2, 1, clear, N_EXP, sel_big, K, &cuda);
        route_trace_collect(0, 1, tie_c, N_EXP, sel_base, K, &bcpu);
        route_trace_collect(0, 1, tie_g, N_EXP, sel_tie, K, &bcuda);
        route_compare_position(&cpu, &cuda, 1, &c[0]);
        route_compare_position(&bcpu, &bcuda, 1, &c[1]);
        assert_int_equal(route_judge_any(0.7, 1e-2, c, 2, ROUTE_NEAR_TIE_BF16, &which),
                         ROUTE_EXPLAINED);
        assert_int_equal(which, 1);
        /* ... but not with the fp32 bound: the first flip is reported */
        assert_int_equal(route_judge_any(0.7, 1e-2, c, 2, ROUTE_NEAR_TIE, &which),
                         ROUTE_FLIP_NOT_TIE);
        assert_int_equal(which, 0);
        /* the trunk's clear flip alone (the block's comparison left out) stays a fault */
        assert_int_equal(route_judge_any(0.7, 1e-2, c, 1, ROUTE_NEAR_TIE_BF16, &which),
                         ROUTE_FLIP_NOT_TIE);
        assert_int_equal(which, 0);
        /* position 2: the trunk flips on a near-tie, the block does not flip: the trunk (index 0)
         * explains it, as a NextN row at r is explained when the trunk row r is */
        route_trace_collect(1, 2, tie_c, N_EXP, sel_base, K, &cpu);
        route_trace_collect(1, 2, tie_g, N_EXP, sel_tie, K, &cuda);
        route_compare_position(&cpu, &cuda, 2, &c[0]);
        route_compare_position(&bcpu, &bcuda, 2, &c[1]);
        assert_int_equal(route_judge_any(0.7, 1e-2, c, 2, ROUTE_NEAR_TIE_BF16, &which),
                         ROUTE_EXPLAINED);
        assert_int_equal(which, 0);
        route_trace_free(&cpu);
        route_trace_free(&cuda);
        route_trace_free(&bcpu);
        route_trace_free(&bcuda);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_margin),
                cmocka_unit_test(test_sets),
                cmocka_unit_test(test_collect),
                cmocka_unit_test(test_no_flip),
                cmocka_unit_test(test_near_tie_flip),
                cmocka_unit_test(test_big_margin_flip),
                cmocka_unit_test(test_two_flips),
                cmocka_unit_test(test_missing),
                cmocka_unit_test(test_bf16_near_tie),
                cmocka_unit_test(test_judge_any),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
