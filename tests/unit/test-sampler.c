/* SPDX-License-Identifier: MIT */
/* sampler: empirical distributions (20,000 seeded draws checked with a chi-square bound at
 * p = 0.001), truncation boundaries, penalties, greedy/temperature limits, reproducibility,
 * logprobs, and every refused input with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/sampler.h"
#include "common/log.h"

#define N_DRAWS 20000

static struct sampler *make(const struct sampler_params *p, uint32_t n_vocab) {
        struct sampler *s = NULL;
        int r = sampler_new(p, n_vocab, &s, NULL, 0);
        if (r < 0)
                fail_msg("sampler_new: %s", log_last_error());
        return s;
}

static struct sampler_params params(float temperature, int top_k, float top_p, float min_p,
                                    uint64_t seed) {
        struct sampler_params p;
        sampler_params_default(&p);
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        p.min_p = min_p;
        p.seed = seed;
        return p;
}

/* Draws N_DRAWS tokens and checks the frequencies against want[] (probabilities summing to 1;
 * tokens with want 0 must never appear) with Pearson's chi-square: the bound is the 0.999
 * quantile for the degrees of freedom, so a correct sampler fails 1 in 1000 seeds, and the seed
 * is fixed. */
static void check_distribution(struct sampler *s, const float *logits, uint32_t n,
                               const double *want) {
        static const double chi2_999[] = { 0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32 };
        unsigned *count = calloc(n, sizeof *count);
        for (int i = 0; i < N_DRAWS; i++) {
                int t = sampler_sample(s, logits, NULL, 0, NULL, 0);
                assert_in_range(t, 0, n - 1);
                count[t]++;
        }
        double chi2 = 0;
        int df = -1;
        for (uint32_t i = 0; i < n; i++) {
                if (want[i] == 0) {
                        if (count[i] != 0)
                                fail_msg("token %u drawn %u times, must never be", i, count[i]);
                        continue;
                }
                double e = want[i] * N_DRAWS;
                chi2 += (count[i] - e) * (count[i] - e) / e;
                df++;
        }
        assert_in_range(df, 0, 7); /* df 0: one allowed token, checked above */
        if (df > 0 && chi2 > chi2_999[df]) {
                for (uint32_t i = 0; i < n; i++)
                        print_message("token %u: %u drawn, %.1f expected\n", i, count[i],
                                      want[i] * N_DRAWS);
                fail_msg("chi-square %.2f > %.2f (df %d)", chi2, chi2_999[df], df);
        }
        free(count);
}

static void logits_of(const double *p, float *z, uint32_t n) {
        for (uint32_t i = 0; i < n; i++)
                z[i] = p[i] > 0 ? (float) log(p[i]) : -INFINITY;
}

static void test_validate(void **state) {
        static const struct {
                const char *field;
                float value;
                const char *message;
        } bad[] = {
                { "temperature", -0.5f, "temperature must be >= 0 (0 = greedy), got -0.5" },
                { "temperature", NAN, "temperature must be >= 0 (0 = greedy), got nan" },
                { "temperature", INFINITY, "temperature must be >= 0 (0 = greedy), got inf" },
                { "top_k", -1, "top_k must be >= 0 (0 = off), got -1" },
                { "top_p", 0, "top_p must be in (0, 1], got 0" },
                { "top_p", 1.5f, "top_p must be in (0, 1], got 1.5" },
                { "top_p", NAN, "top_p must be in (0, 1], got nan" },
                { "min_p", 1, "min_p must be in [0, 1), got 1" },
                { "min_p", -0.25f, "min_p must be in [0, 1), got -0.25" },
                { "repetition_penalty", 0, "repetition_penalty must be > 0 (1 = off), got 0" },
                { "repetition_penalty", -1, "repetition_penalty must be > 0 (1 = off), got -1" },
                { "presence_penalty", 2.5f, "presence_penalty must be in [-2, 2], got 2.5" },
                { "frequency_penalty", -3, "frequency_penalty must be in [-2, 2], got -3" },
                { "frequency_penalty", NAN, "frequency_penalty must be in [-2, 2], got nan" },
        };
        char msg[SAMPLER_MESSAGE_MAX];
        struct sampler_params p;

        (void) state;
        log_set_max_level(LOG_CRIT);
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                sampler_params_default(&p);
                if (streq(bad[i].field, "temperature"))
                        p.temperature = bad[i].value;
                else if (streq(bad[i].field, "top_k"))
                        p.top_k = (int32_t) bad[i].value;
                else if (streq(bad[i].field, "top_p"))
                        p.top_p = bad[i].value;
                else if (streq(bad[i].field, "min_p"))
                        p.min_p = bad[i].value;
                else if (streq(bad[i].field, "repetition_penalty"))
                        p.repetition_penalty = bad[i].value;
                else if (streq(bad[i].field, "presence_penalty"))
                        p.presence_penalty = bad[i].value;
                else
                        p.frequency_penalty = bad[i].value;
                assert_int_equal(sampler_params_validate(&p, msg), -EINVAL);
                assert_string_equal(msg, bad[i].message);
                /* sampler_new refuses with the same text */
                struct sampler *s = NULL;
                assert_int_equal(sampler_new(&p, 10, &s, NULL, 0), -EINVAL);
                assert_null(s);
                assert_string_equal(log_last_error(), bad[i].message);
        }
        /* the edges of every range are allowed */
        sampler_params_default(&p);
        p.temperature = 0;
        p.top_p = 1;
        p.min_p = 0;
        p.presence_penalty = 2;
        p.frequency_penalty = -2;
        p.repetition_penalty = 0.01f;
        p.top_k = 1000000;
        assert_int_equal(sampler_params_validate(&p, msg), 0);
        assert_string_equal(msg, "");
        struct sampler *s = NULL;
        assert_int_equal(sampler_new(&p, 0, &s, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "sampler: vocabulary of 0 tokens, 1..2^31-1 expected");
        log_set_max_level(LOG_INFO);
}

static void test_plain_distribution(void **state) {
        const double p[5] = { 0.5, 0.25, 0.125, 0.0625, 0.0625 };
        float z[5];
        (void) state;
        logits_of(p, z, 5);
        struct sampler_params sp = params(1.0f, 0, 1.0f, 0.0f, 42);
        _cleanup_(sampler_freep) struct sampler *s = make(&sp, 5);
        check_distribution(s, z, 5, p);

        /* temperature 2: p^(1/2) renormalized */
        double q[5], sum = 0;
        for (int i = 0; i < 5; i++)
                sum += q[i] = sqrt(p[i]);
        for (int i = 0; i < 5; i++)
                q[i] /= sum;
        sp.temperature = 2.0f;
        _cleanup_(sampler_freep) struct sampler *s2 = make(&sp, 5);
        check_distribution(s2, z, 5, q);

        /* the check itself has teeth: the untempered distribution fails it */
        sp.temperature = 1.0f;
        _cleanup_(sampler_freep) struct sampler *s3 = make(&sp, 5);
        unsigned hits0 = 0;
        for (int i = 0; i < N_DRAWS; i++)
                hits0 += sampler_sample(s3, z, NULL, 0, NULL, 0) == 0;
        assert_true(fabs(hits0 - q[0] * N_DRAWS) > 10 * sqrt(N_DRAWS * q[0] * (1 - q[0])));
}

static void test_top_k(void **state) {
        const double p[5] = { 0.125, 0.5, 0.0625, 0.25, 0.0625 };
        const double want[5] = { 0, 2.0 / 3, 0, 1.0 / 3, 0 };
        float z[5];
        (void) state;
        logits_of(p, z, 5);
        struct sampler_params sp = params(1.0f, 2, 1.0f, 0.0f, 7);
        _cleanup_(sampler_freep) struct sampler *s = make(&sp, 5);
        check_distribution(s, z, 5, want); /* the 3rd most likely (token 0) never */

        /* top_k = 1 is greedy whatever the temperature */
        sp.top_k = 1;
        sp.temperature = 5.0f;
        _cleanup_(sampler_freep) struct sampler *s1 = make(&sp, 5);
        for (int i = 0; i < 1000; i++)
                assert_int_equal(sampler_sample(s1, z, NULL, 0, NULL, 0), 1);
}

static void test_top_p(void **state) {
        const double p[3] = { 0.3, 0.5, 0.2 };
        float z[3];
        (void) state;
        logits_of(p, z, 3);

        /* 0.5 + 0.3 reaches 0.8 exactly: token 2 is cut */
        const double want80[3] = { 0.375, 0.625, 0 };
        struct sampler_params sp = params(1.0f, 0, 0.8f, 0.0f, 1);
        _cleanup_(sampler_freep) struct sampler *s = make(&sp, 3);
        check_distribution(s, z, 3, want80);

        /* just past the boundary token 2 is needed */
        sp.top_p = 0.81f;
        _cleanup_(sampler_freep) struct sampler *s2 = make(&sp, 3);
        check_distribution(s2, z, 3, p);

        /* 0.5 exactly: only the most likely */
        const double want50[3] = { 0, 1, 0 };
        sp.top_p = 0.5f;
        _cleanup_(sampler_freep) struct sampler *s3 = make(&sp, 3);
        check_distribution(s3, z, 3, want50);

        /* a tiny top_p still keeps one token */
        sp.top_p = 1e-9f;
        _cleanup_(sampler_freep) struct sampler *s4 = make(&sp, 3);
        assert_int_equal(sampler_sample(s4, z, NULL, 0, NULL, 0), 1);
}

static void test_min_p(void **state) {
        const double p[4] = { 0.15, 0.05, 0.5, 0.3 };
        const double want[4] = { 0.15 / 0.95, 0, 0.5 / 0.95, 0.3 / 0.95 };
        float z[4];
        (void) state;
        logits_of(p, z, 4);
        /* threshold 0.2 · 0.5 = 0.1: 0.05 goes, 0.15 stays */
        struct sampler_params sp = params(1.0f, 0, 1.0f, 0.2f, 3);
        _cleanup_(sampler_freep) struct sampler *s = make(&sp, 4);
        check_distribution(s, z, 4, want);
        /* min_p combined with top_p 0.8 (keeps 0.5 + 0.3) */
        const double want2[4] = { 0, 0, 0.625, 0.375 };
        sp.top_p = 0.8f;
        _cleanup_(sampler_freep) struct sampler *s2 = make(&sp, 4);
        check_distribution(s2, z, 4, want2);
}

static void test_greedy_and_cold(void **state) {
        const float z[6] = { 1.0f, 3.0f, 3.0f, 2.9f, -INFINITY, NAN };
        const float y[6] = { 1.0f, 3.0f, 2.99f, 2.9f, -1.0f, 0.0f };
        (void) state;
        struct sampler_params sp = params(0.0f, 0, 1.0f, 0.0f, 0);
        _cleanup_(sampler_freep) struct sampler *g = make(&sp, 6);
        /* greedy: argmax, lowest id on ties, NaN ignored */
        assert_int_equal(sampler_sample(g, z, NULL, 0, NULL, 0), 1);
        assert_int_equal(sampler_sample(g, y, NULL, 0, NULL, 0), 1);
        /* temperature -> 0 converges to greedy */
        sp.temperature = 1e-4f; /* the 0.01 gap becomes e^-100 */
        _cleanup_(sampler_freep) struct sampler *c = make(&sp, 6);
        for (int i = 0; i < 2000; i++)
                assert_int_equal(sampler_sample(c, y, NULL, 0, NULL, 0), 1);
        /* at temperature 0.1 the 0.01 gap is e^-0.1: token 2 must show up */
        sp.temperature = 0.1f;
        _cleanup_(sampler_freep) struct sampler *w = make(&sp, 6);
        int seen2 = 0;
        for (int i = 0; i < 2000; i++)
                seen2 += sampler_sample(w, y, NULL, 0, NULL, 0) == 2;
        assert_true(seen2 > 500);
        /* +inf wins, all -inf/NaN is refused with a message */
        const float inf[6] = { 1.0f, INFINITY, 2.0f, INFINITY, 0.0f, 0.0f };
        assert_int_equal(sampler_sample(g, inf, NULL, 0, NULL, 0), 1);
        const float none[6] = { -INFINITY, NAN, -INFINITY, NAN, -INFINITY, -INFINITY };
        log_set_max_level(LOG_CRIT);
        assert_int_equal(sampler_sample(g, none, NULL, 0, NULL, 0), -EDOM);
        assert_string_equal(log_last_error(), "sampler: all 6 logits are -inf or NaN");
        log_set_max_level(LOG_INFO);
}

static void test_penalties(void **state) {
        const float z[4] = { 2.0f, 1.9f, -1.0f, -1.05f };
        const float neg[4] = { -INFINITY, -INFINITY, -1.0f, -1.05f };
        const int32_t t0 = 0, t2 = 2;
        struct sampler_params sp = params(0.0f, 0, 1.0f, 0.0f, 0);
        struct sampler_result res;
        (void) state;

        /* repetition: 2.0 / 1.2 = 1.67 < 1.9; negative logits are multiplied: -1.2 < -1.05 */
        sp.repetition_penalty = 1.2f;
        _cleanup_(sampler_freep) struct sampler *r = make(&sp, 4);
        assert_int_equal(sampler_sample(r, z, NULL, 0, NULL, 0), 0);
        assert_int_equal(sampler_add_prompt(r, &t0, 1, NULL, 0), 0);
        assert_int_equal(sampler_sample(r, z, NULL, 0, NULL, 0), 1);
        assert_int_equal(sampler_sample(r, neg, NULL, 0, NULL, 0), 2);
        assert_int_equal(sampler_add_prompt(r, &t2, 1, NULL, 0), 0);
        assert_int_equal(sampler_sample(r, neg, NULL, 0, NULL, 0), 3);
        /* logprobs report the penalized distribution: z' = {1.667, 1.9, -1.2, -1.05} */
        assert_int_equal(sampler_sample(r, z, &res, 2, NULL, 0), 1);
        double lse = log(exp(2.0 / 1.2) + exp(1.9) + exp(-1.2) + exp(-1.05));
        assert_float_equal(res.logprob, 1.9 - lse, 1e-5);
        assert_int_equal(res.n_top, 2);
        assert_int_equal(res.top[1].token, 0);
        assert_float_equal(res.top[1].logprob, 2.0 / 1.2 - lse, 1e-5);

        /* presence: generated tokens only; the prompt does not count */
        sp.repetition_penalty = 1.0f;
        sp.presence_penalty = 2.0f;
        _cleanup_(sampler_freep) struct sampler *p = make(&sp, 4);
        assert_int_equal(sampler_add_prompt(p, &t0, 1, NULL, 0), 0);
        assert_int_equal(sampler_sample(p, z, NULL, 0, NULL, 0), 0);
        assert_int_equal(sampler_accept(p, 0), 0);
        assert_int_equal(sampler_sample(p, z, NULL, 0, NULL, 0), 1); /* 2.0 - 2 */
        assert_int_equal(sampler_accept(p, 0), 0);          /* presence does not grow */
        assert_int_equal(sampler_sample(p, z, &res, 1, NULL, 0), 1);
        assert_int_equal(res.top[0].token, 1);

        /* frequency: 0.06 per occurrence; once 1.94 > 1.9, twice 1.88 < 1.9 */
        sp.presence_penalty = 0.0f;
        sp.frequency_penalty = 0.06f;
        _cleanup_(sampler_freep) struct sampler *f = make(&sp, 4);
        assert_int_equal(sampler_accept(f, 0), 0);
        assert_int_equal(sampler_sample(f, z, NULL, 0, NULL, 0), 0);
        assert_int_equal(sampler_accept(f, 0), 0);
        assert_int_equal(sampler_sample(f, z, NULL, 0, NULL, 0), 1);
        /* negative penalties encourage repeats */
        sp.frequency_penalty = -0.5f;
        _cleanup_(sampler_freep) struct sampler *e = make(&sp, 4);
        assert_int_equal(sampler_accept(e, 3), 0);
        assert_int_equal(sampler_sample(e, neg, NULL, 0, NULL, 0), 3);

        /* ids outside the vocabulary */
        log_set_max_level(LOG_CRIT);
        assert_int_equal(sampler_accept(e, 4), -EINVAL);
        assert_string_equal(log_last_error(), "sampler: token 4 is outside the vocabulary of 4 tokens");
        const int32_t badp[2] = { 1, -1 };
        assert_int_equal(sampler_add_prompt(e, badp, 2, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "sampler: token -1 is outside the vocabulary of 4 tokens");
        log_set_max_level(LOG_INFO);
}

static void test_seeds(void **state) {
        float z[50];
        int32_t a[200], b[200], c[200];
        (void) state;
        for (int i = 0; i < 50; i++)
                z[i] = (float) sin(i * 1.7) * 2;
        struct sampler_params sp = params(0.9f, 30, 0.95f, 0.01f, 1234);
        _cleanup_(sampler_freep) struct sampler *s1 = make(&sp, 50);
        _cleanup_(sampler_freep) struct sampler *s2 = make(&sp, 50);
        sp.seed = 1235;
        _cleanup_(sampler_freep) struct sampler *s3 = make(&sp, 50);
        for (int i = 0; i < 200; i++) {
                a[i] = sampler_sample(s1, z, NULL, 0, NULL, 0);
                b[i] = sampler_sample(s2, z, NULL, 0, NULL, 0);
                c[i] = sampler_sample(s3, z, NULL, 0, NULL, 0);
        }
        assert_memory_equal(a, b, sizeof a);
        int differ = 0;
        for (int i = 0; i < 200; i++)
                differ += a[i] != c[i];
        assert_true(differ > 50);
}

static void test_logprobs(void **state) {
        const float z[4] = { (float) log(0.25), (float) log(0.5), (float) log(0.125), (float) log(0.125) };
        struct sampler_result res;
        (void) state;
        /* temperature does not change the reported (raw) distribution */
        struct sampler_params sp = params(3.0f, 0, 1.0f, 0.0f, 9);
        _cleanup_(sampler_freep) struct sampler *s = make(&sp, 4);
        for (int i = 0; i < 50; i++) {
                int t = sampler_sample(s, z, &res, 4, NULL, 0);
                assert_int_equal(res.token, t);
                assert_float_equal(res.logprob, z[t], 1e-6);
                assert_int_equal(res.n_top, 4);
                const int order[4] = { 1, 0, 2, 3 }; /* ties by id */
                for (int k = 0; k < 4; k++) {
                        assert_int_equal(res.top[k].token, order[k]);
                        assert_float_equal(res.top[k].logprob, z[order[k]], 1e-6);
                }
        }
        int t = sampler_sample(s, z, &res, 0, NULL, 0);
        assert_int_equal(t, res.token);
        assert_int_equal(res.n_top, 0);
        log_set_max_level(LOG_CRIT);
        assert_int_equal(sampler_sample(s, z, &res, 21, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "top_logprobs must be in [0, 20], got 21");
        log_set_max_level(LOG_INFO);
}

static int cmp_desc(const void *x, const void *y) {
        float a = *(const float *) x, b = *(const float *) y;
        return a > b ? -1 : a < b;
}

/* A 131072-token vocabulary (the model's) with spread logits: the truncations keep exactly the
 * sets a full sort gives, and frequencies of the top tokens follow the renormalized mass. */
static void test_large_vocab(void **state) {
        const uint32_t V = 131072;
        float *z = malloc(V * sizeof *z), *sorted = malloc(V * sizeof *z);
        uint64_t x = 88172645463325252ull;
        (void) state;
        for (uint32_t i = 0; i < V; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                /* a long tail of small logits ... */
                double u = (double) (x >> 11) * 0x1p-53;
                z[i] = (float) (-40.0 * u);
        }
        /* ... and three leaders holding about half the tempered mass */
        z[777] = 5.0f;
        z[50000] = 4.5f;
        z[V - 1] = 4.0f;
        memcpy(sorted, z, V * sizeof *z);
        qsort(sorted, V, sizeof *z, cmp_desc);

        /* top-k = 40: never below the 40th logit */
        struct sampler_params sp = params(1.0f, 40, 1.0f, 0.0f, 5);
        _cleanup_(sampler_freep) struct sampler *k = make(&sp, V);
        for (int i = 0; i < 300; i++) {
                int t = sampler_sample(k, z, NULL, 0, NULL, 0);
                assert_true(z[t] >= sorted[39]);
        }

        /* a large k takes the quickselect path (k > 4096), here with top-p after it */
        sp = params(1.5f, 5000, 0.99f, 0.0f, 8);
        _cleanup_(sampler_freep) struct sampler *kk = make(&sp, V);
        for (int i = 0; i < 300; i++) {
                int t = sampler_sample(kk, z, NULL, 0, NULL, 0);
                assert_true(z[t] >= sorted[4999]);
        }

        /* top-p = 0.9 at temperature 0.7 without top-k (the growing-selection path) */
        const float T = 0.7f, top_p = 0.9f;
        double total = 0, cum = 0;
        for (uint32_t i = 0; i < V; i++)
                total += exp((sorted[i] - sorted[0]) / T);
        uint32_t keep = 0;
        while (cum < (top_p - 1e-6) * total)
                cum += exp((sorted[keep++] - sorted[0]) / T);
        assert_true(keep > 64); /* more than the first selection round */
        sp = params(T, 0, top_p, 0.0f, 6);
        _cleanup_(sampler_freep) struct sampler *p = make(&sp, V);
        unsigned top_hits = 0;
        const int draws = 2000; /* ~1 ms each: keep the test short */
        for (int i = 0; i < draws; i++) {
                int t = sampler_sample(p, z, NULL, 0, NULL, 0);
                assert_true(z[t] >= sorted[keep - 1]);
                top_hits += z[t] == sorted[0];
        }
        /* the best token's share is its tempered mass over the kept mass */
        double p0 = 1.0 / cum;
        assert_true(fabs(top_hits - p0 * draws) < 4 * sqrt(draws * p0 * (1 - p0)));

        /* speed, for the record (not asserted: shared CI machines) */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < 50; i++)
                sampler_sample(p, z, NULL, 0, NULL, 0);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        print_message("131072-token top-p sample: %.3f ms\n",
                      ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6) / 200);
        free(z);
        free(sorted);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_validate),    cmocka_unit_test(test_plain_distribution),
                cmocka_unit_test(test_top_k),       cmocka_unit_test(test_top_p),
                cmocka_unit_test(test_min_p),       cmocka_unit_test(test_greedy_and_cold),
                cmocka_unit_test(test_penalties),   cmocka_unit_test(test_seeds),
                cmocka_unit_test(test_logprobs),    cmocka_unit_test(test_large_vocab),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
