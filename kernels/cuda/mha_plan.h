/* SPDX-License-Identifier: MIT */
/* The jobs of the non-absorbed prompt attention (mha.cu) for one pass, built on the host once and
 * used by every layer: plain C, so tests/unit/test-mha-plan.c checks it without a GPU. */
#pragma once

#include <stdint.h>

/* A job is one run of a sequence's consecutive tokens against one part of its context
 * (positions [pos0, pos0 + npos), part index `part`), the part's keys and values expanded into
 * rows row0.. of the scratch. Jobs of a batch are in order of row0 and of qt0 (the job's first
 * query tile of 64 tokens in the batch's grid). */
struct cu_mha_job {
        uint32_t tq, nq;     /* the pass's query tokens tq .. tq + nq (one sequence, consecutive positions) */
        uint32_t tl0, maxp;  /* tq's index in its attention group and the group's part stride */
        uint32_t pos0, npos; /* the part's positions */
        uint32_t row0, tok;  /* scratch row of pos0; a token of the sequence (its page table) */
        uint32_t part, qt0;
};

#define MHA_QTILE 64 /* queries a tile of k_mha_attend */

/* tokens [t0, t0 + n) with max_parts maxp (their partials: n × maxp slots), batches b0 .. b0 + nb */
struct mha_group {
        uint32_t t0, n, maxp, b0, nb;
};
/* jobs j0 .. j0 + nj, their scratch rows (Σ npos) and query tiles */
struct mha_batch {
        uint32_t j0, nj, rows, qtiles;
};

struct mha_plan {
        struct cu_mha_job *jobs;
        struct mha_group *groups;
        struct mha_batch *batches;
        uint32_t n_jobs, n_groups, n_batches;
        uint32_t jobs_cap, groups_cap, batches_cap;
};

/* The plan of a pass of T tokens (pos: absolute positions; tokpt: a sequence's page-table offset,
 * equal for the tokens of one sequence): groups of as many tokens as `slots` partials hold, in
 * each a job per (run of one sequence's consecutive tokens, part of plen positions up to the run's
 * last position), batched so a batch's rows fit rows_cap. Reuses the plan's arrays. 0, or -EINVAL
 * (T == 0, plen == 0 or plen > rows_cap, a token whose parts exceed slots), -ENOMEM, -E2BIG. */
int mha_plan_build(struct mha_plan *p, const uint32_t *pos, const uint32_t *tokpt, uint32_t T,
                   uint32_t plen, uint32_t rows_cap, uint64_t slots);
void mha_plan_free(struct mha_plan *p);
