/* SPDX-License-Identifier: MIT */
/* The non-absorbed prompt attention's pass plan (kernels/cuda/mha_plan.c): every (token, part of
 * its context up to its position) is in exactly one job of its group, with its sequence's page
 * table and the part's fixed absolute positions; groups fit the partial workspace, batches the
 * expansion scratch. A token the plan misses would read a stale partial on the GPU; one it puts
 * in two jobs, or in a part past its position, would change its bits with the chunking. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/mha_plan.h"

/* a pass of up to 512 tokens: runs of consecutive positions, a sequence (page-table offset)
 * per run, sometimes two runs of one sequence with a gap */
static uint32_t make_pass(uint32_t *pos, uint32_t *tp, uint32_t T_max, unsigned *seed) {
        uint32_t T = 0, seq = 0;
        while (T < T_max) {
                uint32_t len = 1 + (uint32_t) (rand_r(seed) % (rand_r(seed) % 2 ? 8 : 300));
                uint32_t p0 = (uint32_t) (rand_r(seed) % 6000);
                if (len > T_max - T)
                        len = T_max - T;
                for (uint32_t k = 0; k < len; k++) {
                        pos[T + k] = p0 + k;
                        tp[T + k] = seq * 100;
                }
                T += len;
                if (rand_r(seed) % 4)
                        seq++;
                if (rand_r(seed) % 5 == 0)
                        break;
        }
        return T;
}

static void check_plan(const struct mha_plan *p, const uint32_t *pos, const uint32_t *tp, uint32_t T,
                       uint32_t plen, uint32_t cap, uint64_t slots) {
        /* groups partition the pass in order and fit the workspace */
        uint32_t next = 0, nb = 0;
        for (uint32_t gi = 0; gi < p->n_groups; gi++) {
                const struct mha_group *g = &p->groups[gi];
                assert_int_equal(g->t0, next);
                assert_true(g->n > 0);
                uint32_t maxp = 0;
                for (uint32_t t = g->t0; t < g->t0 + g->n; t++)
                        maxp = pos[t] / plen + 1 > maxp ? pos[t] / plen + 1 : maxp;
                assert_int_equal(g->maxp, maxp);
                assert_true((uint64_t) g->n * g->maxp <= slots);
                assert_int_equal(g->b0, nb);
                nb += g->nb;
                next += g->n;
        }
        assert_int_equal(next, T);
        assert_int_equal(nb, p->n_batches);
        /* batches: consecutive jobs, rows and tiles counted from 0, within the scratch */
        uint32_t nj = 0;
        for (uint32_t bi = 0; bi < p->n_batches; bi++) {
                const struct mha_batch *b = &p->batches[bi];
                assert_int_equal(b->j0, nj);
                assert_true(b->nj > 0);
                uint32_t rows = 0, qt = 0;
                for (uint32_t j = b->j0; j < b->j0 + b->nj; j++) {
                        assert_int_equal(p->jobs[j].row0, rows);
                        assert_int_equal(p->jobs[j].qt0, qt);
                        rows += p->jobs[j].npos;
                        qt += (p->jobs[j].nq + MHA_QTILE - 1) / MHA_QTILE;
                }
                assert_int_equal(b->rows, rows);
                assert_int_equal(b->qtiles, qt);
                assert_true(rows <= cap);
                nj += b->nj;
        }
        assert_int_equal(nj, p->n_jobs);
        /* each (token, part ≤ its position's) exactly once, in a job of its group and sequence */
        uint32_t stride = 6000 / plen + 520 / plen + 2; /* parts of the largest position */
        uint32_t *seen = calloc((size_t) T * stride, sizeof *seen);
        assert_non_null(seen);
        for (uint32_t gi = 0; gi < p->n_groups; gi++) {
                const struct mha_group *g = &p->groups[gi];
                for (uint32_t bi = g->b0; bi < g->b0 + g->nb; bi++)
                        for (uint32_t j = p->batches[bi].j0; j < p->batches[bi].j0 + p->batches[bi].nj; j++) {
                                const struct cu_mha_job *jb = &p->jobs[j];
                                assert_int_equal(jb->pos0, jb->part * plen);
                                assert_true(jb->npos >= 1 && jb->npos <= plen);
                                assert_int_equal(jb->maxp, g->maxp);
                                assert_int_equal(jb->tl0, jb->tq - g->t0);
                                assert_true(jb->tq >= g->t0 && jb->tq + jb->nq <= g->t0 + g->n);
                                uint32_t last = 0;
                                for (uint32_t t = jb->tq; t < jb->tq + jb->nq; t++) {
                                        assert_int_equal(tp[t], tp[jb->tok]);
                                        assert_true(pos[t] >= jb->pos0);
                                        if (t > jb->tq)
                                                assert_int_equal(pos[t], pos[t - 1] + 1);
                                        seen[(size_t) t * stride + jb->part]++;
                                        last = pos[t];
                                }
                                /* the part's positions end at the run's last token's, or the part's end */
                                uint32_t end = jb->pos0 + plen < last + 1 ? jb->pos0 + plen : last + 1;
                                assert_int_equal(jb->pos0 + jb->npos, end);
                        }
        }
        for (uint32_t t = 0; t < T; t++)
                for (uint32_t q = 0; q < stride; q++)
                        assert_int_equal(seen[(size_t) t * stride + q], q <= pos[t] / plen ? 1 : 0);
        free(seen);
}

static void test_random_passes(void **state) {
        static const uint32_t plens[] = {64, 100, 1024};
        uint32_t pos[512], tp[512];
        struct mha_plan p = {0};
        unsigned seed = 7;
        for (int it = 0; it < 400; it++) {
                uint32_t T = make_pass(pos, tp, 1 + (uint32_t) (rand_r(&seed) % 512), &seed);
                uint32_t plen = plens[it % 3];
                uint32_t cap = plen * (1 + (uint32_t) (rand_r(&seed) % 4));
                uint64_t slots = (6000 / plen + 1) * (1 + (uint64_t) (rand_r(&seed) % 600));
                assert_int_equal(mha_plan_build(&p, pos, tp, T, plen, cap, slots), 0);
                check_plan(&p, pos, tp, T, plen, cap, slots);
        }
        mha_plan_free(&p);
}

/* a 512-token pass of one sequence at 3,584..4,095 (a 4K prompt's last pass): one group, four
 * parts of 1,024 in batches of three, every token in all four */
static void test_last_pass_of_a_4k_prompt(void **state) {
        uint32_t pos[512], tp[512];
        struct mha_plan p = {0};
        for (uint32_t t = 0; t < 512; t++)
                pos[t] = 3584 + t, tp[t] = 0;
        assert_int_equal(mha_plan_build(&p, pos, tp, 512, 1024, 3264, 16194), 0);
        assert_int_equal(p.n_groups, 1);
        assert_int_equal(p.n_jobs, 4);
        assert_int_equal(p.n_batches, 2);
        assert_int_equal(p.batches[0].nj, 3);
        assert_int_equal(p.batches[0].rows, 3072);
        assert_int_equal(p.jobs[3].npos, 1024);
        for (uint32_t j = 0; j < 4; j++)
                assert_int_equal(p.jobs[j].nq, 512);
        assert_int_equal(p.batches[1].qtiles, 8);
        check_plan(&p, pos, tp, 512, 1024, 3264, 16194);
        mha_plan_free(&p);
}

static void test_refusals(void **state) {
        uint32_t pos[2] = {5000, 5001}, tp[2] = {0, 0};
        struct mha_plan p = {0};
        /* a part longer than the scratch, an empty pass, a token needing more parts than slots */
        assert_int_equal(mha_plan_build(&p, pos, tp, 2, 1024, 512, 100), -EINVAL);
        assert_int_equal(mha_plan_build(&p, pos, tp, 0, 64, 512, 100), -EINVAL);
        assert_int_equal(mha_plan_build(&p, pos, tp, 2, 64, 512, 10), -EINVAL);
        mha_plan_free(&p);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_random_passes),
                cmocka_unit_test(test_last_pass_of_a_4k_prompt),
                cmocka_unit_test(test_refusals),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
