/* SPDX-License-Identifier: MIT */
/* Rejection sampling for speculative decoding (engine/sampler.h sampler_speculate): a draft drawn
 * from q, accepted with min(1, p/q), else a token from max(0, p - q) renormalised, is distributed
 * as p. Chi-square tests over 40,000 draws per case, with every sampling option applied to p and q
 * alike (temperature, top-k, top-p, min-p, repetition/presence/frequency penalties): against p
 * itself (sampler_probs) and against 40,000 plain sampler_sample draws (MTP off). The same test
 * must reject the drafts alone (the distribution q), so it can fail. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sampler.h"

#define V 40u
#define N 40000u

/* chi-square critical value at alpha = 1e-3 (Wilson-Hilferty) */
static double chi2_crit(unsigned df) {
        double k = df, z = 3.0902;
        double x = 1.0 - 2.0 / (9.0 * k) + z * sqrt(2.0 / (9.0 * k));
        return k * x * x * x;
}

/* Pearson's statistic of counts against probabilities, bins with an expected count < 5 pooled. */
static double chi2_vs_probs(const uint32_t *obs, const float *p, bool support, unsigned *df) {
        double stat = 0, pool_o = 0, pool_e = 0;
        unsigned bins = 0;

        for (unsigned i = 0; i < V; i++) {
                double e = (double) N * p[i];
                if (e < 5) {
                        pool_o += obs[i];
                        pool_e += e;
                        if (support)
                                assert_true(e > 0 || obs[i] == 0); /* nothing outside p's support */
                        continue;
                }
                stat += (obs[i] - e) * (obs[i] - e) / e;
                bins++;
        }
        if (pool_e >= 5) {
                stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
                bins++;
        }
        *df = bins - 1;
        return stat;
}

/* Two samples of N draws each: sum (a - b)^2 / (a + b) over bins with a + b >= 10. */
static double chi2_two(const uint32_t *a, const uint32_t *b, unsigned *df) {
        double stat = 0;
        unsigned bins = 0;
        uint32_t pa = 0, pb = 0;

        for (unsigned i = 0; i < V; i++) {
                if (a[i] + b[i] < 10) {
                        pa += a[i], pb += b[i];
                        continue;
                }
                stat += ((double) a[i] - b[i]) * ((double) a[i] - b[i]) / (a[i] + b[i]);
                bins++;
        }
        if (pa + pb >= 10) {
                stat += ((double) pa - pb) * ((double) pa - pb) / (pa + pb);
                bins++;
        }
        *df = bins - 1;
        return stat;
}

struct opt_case {
        const char *name;
        struct sampler_params p;
        bool history;
};

static void logits_of(uint32_t seed, float *l) {
        uint32_t x = seed;
        for (unsigned i = 0; i < V; i++) {
                x = x * 1103515245u + 12345u;
                l[i] = ((float) ((x >> 8) % 6000) / 1000.0f) - 3.0f;
        }
}

static void run_case(const struct opt_case *c) {
        struct sampler *sp, *sq, *so;
        float lp[V], lq[V], p[V], q[V];
        uint32_t spec[V] = { 0 }, plain[V] = { 0 }, drafts[V] = { 0 };
        uint64_t acc = 0;
        struct sampler_params pp = c->p, pq = c->p, po = c->p;
        static const int32_t hist[] = { 3, 3, 7, 11, 3, 20 };

        pp.seed = 1, pq.seed = 2, po.seed = 3;
        assert_int_equal(sampler_new(&pp, V, &sp, NULL, 0), 0);
        assert_int_equal(sampler_new(&pq, V, &sq, NULL, 0), 0);
        assert_int_equal(sampler_new(&po, V, &so, NULL, 0), 0);
        if (c->history)
                for (size_t i = 0; i < sizeof hist / sizeof hist[0]; i++) {
                        assert_int_equal(sampler_accept(sp, hist[i]), 0);
                        assert_int_equal(sampler_accept(sq, hist[i]), 0);
                        assert_int_equal(sampler_accept(so, hist[i]), 0);
                }
        logits_of(17, lp);
        logits_of(91, lq); /* a draft model that is only loosely right */
        for (unsigned i = 0; i < V; i++)
                lq[i] = 0.5f * lq[i] + 0.7f * lp[i];
        assert_true(sampler_probs(sp, lp, p) >= 0);
        assert_true(sampler_probs(sq, lq, q) >= 0);
        double overlap = 0;
        for (unsigned i = 0; i < V; i++)
                overlap += fmin(p[i], q[i]);

        for (unsigned k = 0; k < N; k++) {
                bool ok;
                int32_t d = sampler_draw_probs(sq, q);
                assert_true(d >= 0 && d < (int32_t) V);
                int32_t t = sampler_speculate(sp, p, q, d, &ok);
                assert_true(t >= 0 && t < (int32_t) V);
                assert_true(!ok || t == d);
                spec[t]++;
                drafts[d]++;
                acc += ok;
                int32_t o = sampler_sample(so, lp, NULL, 0, NULL, 0);
                assert_true(o >= 0 && o < (int32_t) V);
                plain[o]++;
        }
        unsigned df1, df2, df3;
        double s1 = chi2_vs_probs(spec, p, true, &df1), s2 = chi2_two(spec, plain, &df2);
        double s3 = chi2_vs_probs(drafts, p, false, &df3);
        double rate = (double) acc / N, sd = sqrt(overlap * (1 - overlap) / N);
        print_message("%-28s chi2 vs p %.1f (df %u, crit %.1f); vs plain sampling %.1f (df %u, crit %.1f); "
                      "drafts alone %.1f; acceptance %.4f, expected sum min(p,q) = %.4f\n",
                      c->name, s1, df1, chi2_crit(df1), s2, df2, chi2_crit(df2), s3, rate, overlap);
        assert_true(df1 >= 2 && df2 >= 2);
        assert_true(s1 < chi2_crit(df1));
        assert_true(s2 < chi2_crit(df2));
        assert_true(s3 > chi2_crit(df3)); /* the test can tell q from p */
        assert_true(fabs(rate - overlap) < 5 * sd + 1e-9);
        sampler_free(sp);
        sampler_free(sq);
        sampler_free(so);
}

static void test_rejection_sampling_follows_p(void **state) {
        (void) state;
        struct sampler_params base;
        sampler_params_default(&base);
        struct opt_case cases[4];
        for (int i = 0; i < 4; i++)
                cases[i].p = base, cases[i].history = false;
        cases[0].name = "temperature 1";
        cases[1].name = "T 0.7, top-k 12";
        cases[1].p.temperature = 0.7f, cases[1].p.top_k = 12;
        cases[2].name = "T 1.3, top-p 0.85, min-p 0.03";
        cases[2].p.temperature = 1.3f, cases[2].p.top_p = 0.85f, cases[2].p.min_p = 0.03f;
        cases[3].name = "T 0.9, penalties, history";
        cases[3].p.temperature = 0.9f, cases[3].p.repetition_penalty = 1.3f;
        cases[3].p.presence_penalty = 0.4f, cases[3].p.frequency_penalty = 0.3f;
        cases[3].history = true;
        for (int i = 0; i < 4; i++)
                run_case(&cases[i]);
}

/* Greedy: p is one-hot on the argmax; the result is the argmax whatever the draft. */
static void test_greedy(void **state) {
        (void) state;
        struct sampler *s;
        struct sampler_params pp;
        float l[V], p[V], q[V];
        sampler_params_default(&pp);
        pp.temperature = 0;
        assert_int_equal(sampler_new(&pp, V, &s, NULL, 0), 0);
        logits_of(5, l);
        int32_t best = sampler_probs(s, l, p);
        assert_true(best >= 0);
        for (unsigned i = 0; i < V; i++)
                q[i] = 1.0f / V;
        for (int32_t d = 0; d < (int32_t) V; d++) {
                bool ok;
                assert_int_equal(sampler_speculate(s, p, q, d, &ok), best);
                assert_int_equal(ok, d == best);
        }
        assert_int_equal(sampler_sample(s, l, NULL, 0, NULL, 0), best);
        bool ok;
        assert_int_equal(sampler_speculate(s, p, q, (int32_t) V, &ok), -EINVAL);
        sampler_free(s);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_rejection_sampling_follows_p),
                cmocka_unit_test(test_greedy),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
