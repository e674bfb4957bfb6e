/* SPDX-License-Identifier: MIT */
#include "mha_plan.h"

#include <errno.h>
#include <stdlib.h>

/* grow an array of `size`-byte elements to hold n */
static int grow(void **p, uint32_t *cap, uint64_t n, size_t size) {
        if (n <= *cap)
                return 0;
        uint64_t c = n > (uint64_t) *cap * 2 ? n : (uint64_t) *cap * 2;
        if (c > UINT32_MAX)
                return -E2BIG;
        void *q = realloc(*p, c * size);
        if (!q)
                return -ENOMEM;
        *p = q;
        *cap = (uint32_t) c;
        return 0;
}

static int add_batch(struct mha_plan *p, struct mha_group *g, uint32_t j0, uint32_t rows, uint32_t qt) {
        int r = grow((void **) &p->batches, &p->batches_cap, (uint64_t) p->n_batches + 1, sizeof *p->batches);
        if (r < 0)
                return r;
        p->batches[p->n_batches++] = (struct mha_batch){j0, p->n_jobs - j0, rows, qt};
        g->nb++;
        return 0;
}

int mha_plan_build(struct mha_plan *p, const uint32_t *pos, const uint32_t *tokpt, uint32_t T,
                   uint32_t plen, uint32_t rows_cap, uint64_t slots) {
        int r;

        p->n_jobs = p->n_groups = p->n_batches = 0;
        if (T == 0 || plen == 0 || plen > rows_cap)
                return -EINVAL;
        for (uint32_t g0 = 0; g0 < T;) {
                uint32_t maxp = 0, n = 0;
                while (g0 + n < T) {
                        uint32_t parts = pos[g0 + n] / plen + 1, m = parts > maxp ? parts : maxp;
                        if ((uint64_t) m * (n + 1) > slots)
                                break;
                        maxp = m;
                        n++;
                }
                if (n == 0)
                        return -EINVAL;
                r = grow((void **) &p->groups, &p->groups_cap, (uint64_t) p->n_groups + 1, sizeof *p->groups);
                if (r < 0)
                        return r;
                struct mha_group *g = &p->groups[p->n_groups++];
                *g = (struct mha_group){.t0 = g0, .n = n, .maxp = maxp, .b0 = p->n_batches};
                uint32_t rows = 0, qt = 0, j0 = p->n_jobs;
                for (uint32_t s0 = g0; s0 < g0 + n;) {
                        uint32_t e = s0 + 1;
                        while (e < g0 + n && tokpt[e] == tokpt[s0] && pos[e] == pos[e - 1] + 1)
                                e++;
                        uint32_t pf = pos[s0], pl = pos[e - 1];
                        for (uint32_t q = 0; q <= pl / plen; q++) {
                                uint64_t start = (uint64_t) q * plen, end = start + plen < (uint64_t) pl + 1 ? start + plen : (uint64_t) pl + 1;
                                uint32_t npos = (uint32_t) (end - start);
                                uint32_t k0 = start > pf ? (uint32_t) (start - pf) : 0, nq = (e - s0) - k0;
                                if (rows + (uint64_t) npos > rows_cap) {
                                        r = add_batch(p, g, j0, rows, qt);
                                        if (r < 0)
                                                return r;
                                        rows = qt = 0;
                                        j0 = p->n_jobs;
                                }
                                r = grow((void **) &p->jobs, &p->jobs_cap, (uint64_t) p->n_jobs + 1, sizeof *p->jobs);
                                if (r < 0)
                                        return r;
                                p->jobs[p->n_jobs++] = (struct cu_mha_job){
                                        .tq = s0 + k0, .nq = nq, .tl0 = s0 + k0 - g0, .maxp = maxp,
                                        .pos0 = (uint32_t) start, .npos = npos, .row0 = rows, .tok = s0,
                                        .part = q, .qt0 = qt,
                                };
                                rows += npos;
                                qt += (nq + MHA_QTILE - 1) / MHA_QTILE;
                        }
                        s0 = e;
                }
                if (p->n_jobs > j0) {
                        r = add_batch(p, g, j0, rows, qt);
                        if (r < 0)
                                return r;
                }
                g0 += n;
        }
        return 0;
}

void mha_plan_free(struct mha_plan *p) {
        free(p->jobs);
        free(p->groups);
        free(p->batches);
        *p = (struct mha_plan){0};
}
