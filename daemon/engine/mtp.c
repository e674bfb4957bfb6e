/* SPDX-License-Identifier: MIT */
/* MTP speculative decoding with the model's NextN block (docs/model.md §8, docs/design.md
 * "Speculative decoding").
 *
 * Per request with MTP: every forward hands back the trunk's hidden rows of the positions it
 * computed; the NextN block's cache row of position t needs h_t and the id at t + 1, so a row
 * waits (j->mtp_h) until that id is known and is written by the next NextN forward. At the start
 * of a step that forward also drafts: its row of position n_cached - 1 (the last sampled token
 * seq[n_cached] is the id) gives draft 1; drafts 2.. chain the block on its own hidden. The step
 * then feeds [seq[n_cached], d1 .. dk] to the trunk with every logits row, and engine/step.c samples
 * row i exactly as a plain decode step would sample that position (same sampler, same state, same
 * RNG draw); the draft d_{i+1} is accepted when the sampled token is it. Because a sequence's
 * logits do not depend on how many tokens a forward carries, the output is the very output of MTP
 * off, for greedy and for seeded sampling alike; drafts only decide how many positions one forward
 * settles. A draft is the argmax of the block's logits (no RNG is drawn for it). */
#include "engine/internal.h"

float *eng_mtp_grow(float **p, size_t *cap, size_t n) {
        if (n > *cap) {
                float *q = realloc(*p, n * sizeof *q);
                if (!q)
                        return NULL;
                *p = q;
                *cap = n;
        }
        return *p;
}

/* Drafts for j this step: the daemon's --mtp-draft, fewer near max_tokens (the last token
 * settled by a verify step is always the trunk's own: at most max_tokens - n_out - 1 drafts). */
uint32_t eng_mtp_want(const struct sched *s, const struct job *j) {
        if (!j->mtp || j->force_end_think || j->n_out + 1 >= j->max_tokens || j->n_out < j->mtp_pause_until)
                return 0;
        return MIN(s->p.mtp_draft, j->max_tokens - j->n_out - 1);
}

/* The drafting guard: a request whose last MTP_GUARD_DRAFTS drafts were accepted less than
 * MTP_GUARD_ACCEPT of the time stops drafting for MTP_GUARD_PAUSE tokens, then tries again. A
 * verify step with one draft costs about 1.3 decode steps on the full model at batch 1 (NextN
 * forward included, bench/RESULTS.md), so below about 30% acceptance drafting is slower than
 * not; an untrained block (random weights) is accepted almost never. The output is the same
 * either way: drafts only decide how many positions a forward settles. Not applied to the
 * test drafter (X4_MTP_TEST_DRAFTER), which exists to exercise accepted drafts. */
#define MTP_GUARD_DRAFTS 16u
#define MTP_GUARD_ACCEPT 0.30
#define MTP_GUARD_PAUSE 128u

void eng_mtp_count(const struct sched *s, struct job *j, uint32_t drafted, uint32_t accepted) {
        if (s->mtp_test_repeat)
                return;
        j->mtp_win_drafted += drafted;
        j->mtp_win_accepted += accepted;
        if (j->mtp_win_drafted < MTP_GUARD_DRAFTS)
                return;
        if (j->mtp_win_accepted < MTP_GUARD_ACCEPT * j->mtp_win_drafted)
                j->mtp_pause_until = j->n_out + MTP_GUARD_PAUSE;
        j->mtp_win_drafted = j->mtp_win_accepted = 0;
}

/* Forget the waiting rows: the NextN rows before `pos` are taken as written (prefix pages,
 * snapshots: only drafts could differ, never the output). */
void eng_mtp_reset(struct job *j, uint32_t pos) {
        j->mtp_h_pos0 = pos;
        j->mtp_h_n = 0;
        j->mtp_k = 0;
}

/* Keep the trunk's hidden rows of positions [pos0, pos0 + n) (they follow the waiting ones). */
bool eng_mtp_keep(struct sched *s, struct job *j, uint32_t pos0, const float *rows, uint32_t n) {
        const size_t H = s->cfg->n_embd;

        if (!j->mtp || n == 0)
                return true;
        if (pos0 != j->mtp_h_pos0 + j->mtp_h_n)
                eng_mtp_reset(j, pos0);
        size_t cap = j->mtp_h_cap;
        if (!eng_mtp_grow(&j->mtp_h, &cap, (size_t) (j->mtp_h_n + n) * H)) {
                eng_mtp_reset(j, pos0 + n); /* drafts only: the output does not need them */
                return false;
        }
        j->mtp_h_cap = (uint32_t) MIN(cap, (size_t) UINT32_MAX);
        memcpy(j->mtp_h + (size_t) j->mtp_h_n * H, rows, (size_t) n * H * sizeof(float));
        j->mtp_h_n += n;
        return true;
}

static int32_t argmax(const float *l, uint32_t n) {
        uint32_t best = 0;

        for (uint32_t i = 1; i < n; i++)
                if (l[i] > l[best])
                        best = i;
        return (int32_t) best;
}

/* Draft `level` (1-based) of j from the NextN logits l: for a sampled request (rejection
 * sampling), drawn from the draft distribution q (the request's sampling options and penalty
 * state applied to l), kept in j->mtp_q for the verify step; else the argmax. */
static int32_t pick_draft(struct sched *s, struct job *j, uint32_t level, const float *l) {
        const size_t V = s->cfg->n_vocab;

        if (level == 1)
                j->mtp_rej = !s->p.mtp_match && !sampler_greedy(j->sampler);
        if (j->mtp_rej) {
                if (!eng_mtp_grow(&j->mtp_q, &j->mtp_q_cap, (size_t) s->p.mtp_draft * V)) {
                        j->mtp_rej = false;
                } else {
                        float *q = j->mtp_q + (size_t) (level - 1) * V;
                        int32_t d;
                        if (s->mtp_test_repeat) { /* the test drafter: q is one-hot on its draft */
                                memset(q, 0, V * sizeof *q);
                                d = j->mtp_tok[0];
                                q[d] = 1.0f;
                        } else
                                d = sampler_probs(j->sampler, l, q) < 0 ? -1 : sampler_draw_probs(j->sampler, q);
                        if (d >= 0)
                                return d;
                        /* no usable q: this step checks by matching (exact for any draft) */
                        j->mtp_rej = false;
                        j->mtp_k = MIN(j->mtp_k, level);
                }
        }
        if (s->mtp_test_repeat)
                return j->mtp_tok[0];
        return argmax(l, (uint32_t) V);
}

/* Waiting rows of j whose next id is known (position p needs seq[p + 1]). */
static uint32_t known_rows(const struct job *j) {
        if (j->mtp_h_pos0 + 1 >= j->n_seq)
                return 0;
        return MIN(j->mtp_h_n, j->n_seq - 1 - j->mtp_h_pos0);
}

static bool active(const struct job *j) {
        return j->mtp && !j->paused && (j->state == JOB_PREFILL || j->state == JOB_DECODE) &&
               j->n_pages > 0;
}

/* One NextN forward over `n` sequences; on failure MTP is dropped for the jobs in it (drafts
 * only: their output goes on without). */
static int run_nextn(struct sched *s, struct x4_nextn_seq *ns, struct job **who, uint32_t n) {
        const size_t V = s->cfg->n_vocab, H = s->cfg->n_embd;
        struct x4_nextn_batch nb = { .seqs = ns, .n_seqs = n };
        uint32_t rows = x4_nextn_logits_rows(&nb), hrows = x4_nextn_hidden_rows(&nb);
        char msg[1024] = ""; /* what a failing NextN forward says (errors as values) */

        /* the backend's output buffers: its x4_host_alloc memory (page-locked on CUDA) */
        if (!x4_host_grow(s->p.ops, s->p.backend, &s->mtp_logits, &s->mtp_logits_cap, MAX(rows, 1u) * V) ||
            !x4_host_grow(s->p.ops, s->p.backend, &s->mtp_hid, &s->mtp_hid_cap, MAX(hrows, 1u) * H)) {
                log_warning("MTP: out of memory for %u draft rows: this step decodes without drafts", rows);
                goto fail;
        }
        nb.hidden = s->mtp_hid;
        if (s->p.ops->nextn(s->p.backend, &nb, s->mtp_logits, msg, sizeof msg) < 0) {
                log_warning("MTP: NextN forward failed (%s): this step decodes without drafts", msg);
                goto fail;
        }
        return 0;
fail:
        for (uint32_t i = 0; i < n; i++)
                eng_mtp_reset(who[i], who[i]->n_seq);
        return -1;
}

/* Write j's waiting NextN rows whose next id is known (before a snapshot copies the pages). */
void eng_mtp_flush(struct sched *s, struct job *j) {
        uint32_t k = active(j) ? known_rows(j) : 0;

        if (k == 0)
                return;
        struct x4_nextn_seq ns = {
                .seq = { .tokens = j->seq + j->mtp_h_pos0 + 1, .n_tokens = k, .pos0 = j->mtp_h_pos0,
                         .pages = j->pages, .n_pages = j->n_pages },
                .h = j->mtp_h,
        };
        if (run_nextn(s, &ns, &j, 1) < 0)
                return;
        memmove(j->mtp_h, j->mtp_h + (size_t) k * s->cfg->n_embd,
                (size_t) (j->mtp_h_n - k) * s->cfg->n_embd * sizeof(float));
        j->mtp_h_pos0 += k;
        j->mtp_h_n -= k;
}

/* The step's NextN work, before its trunk forward: every MTP request's waiting rows with known
 * ids in one forward (the rows of a decoding request end at n_cached - 1, whose logits give its
 * first draft), then one forward per further draft. j->mtp_k (set by the step from eng_mtp_want,
 * with pages for it) drops to 0 where no draft can be made. */
void eng_mtp_draft(struct sched *s) {
        const size_t V = s->cfg->n_vocab, H = s->cfg->n_embd;
        uint32_t n = 0, cap = 0;

        if (!s->mtp)
                return;
        for (struct job *j = s->jobs; j; j = j->next)
                cap += active(j);
        if (cap == 0)
                return;
        struct x4_nextn_seq *ns = calloc(cap, sizeof *ns);
        struct job **who = calloc(cap, sizeof *who);
        float *chain = NULL;
        if (!ns || !who)
                goto out;
        for (struct job *j = s->jobs; j; j = j->next) {
                if (!active(j))
                        continue;
                uint32_t k = known_rows(j);
                bool drafts = j->state == JOB_DECODE && j->mtp_k > 0 && k > 0 &&
                              j->mtp_h_pos0 + k == j->n_cached && j->n_seq == j->n_cached + 1;
                if (!drafts)
                        j->mtp_k = 0;
                if (k == 0)
                        continue;
                ns[n] = (struct x4_nextn_seq){
                        .seq = { .tokens = j->seq + j->mtp_h_pos0 + 1, .n_tokens = k,
                                 .pos0 = j->mtp_h_pos0, .pages = j->pages, .n_pages = j->n_pages,
                                 .logits = drafts ? X4_LOGITS_LAST : X4_LOGITS_NONE,
                                 .hidden = drafts ? X4_LOGITS_LAST : X4_LOGITS_NONE },
                        .h = j->mtp_h,
                };
                who[n++] = j;
        }
        if (n == 0 || run_nextn(s, ns, who, n) < 0)
                goto out;
        /* the chain's hidden of every drafting request, in `who` order */
        chain = malloc(cap * H * sizeof *chain);
        if (!chain) {
                for (uint32_t i = 0; i < n; i++)
                        who[i]->mtp_k = 0;
        }
        uint32_t row = 0, max_k = 0;
        for (uint32_t i = 0; i < n; i++) {
                struct job *j = who[i];
                uint32_t k = ns[i].seq.n_tokens;

                memmove(j->mtp_h, j->mtp_h + (size_t) k * H, (size_t) (j->mtp_h_n - k) * H * sizeof(float));
                j->mtp_h_pos0 += k;
                j->mtp_h_n -= k;
                if (ns[i].seq.logits == X4_LOGITS_NONE)
                        continue;
                if (j->mtp_k > 0) {
                        j->mtp_tok[0] = j->seq[j->n_cached];
                        j->mtp_tok[1] = pick_draft(s, j, 1, s->mtp_logits + (size_t) row * V);
                        memcpy(chain + (size_t) i * H, s->mtp_hid + (size_t) row * H, H * sizeof(float));
                        max_k = MAX(max_k, j->mtp_k);
                }
                row++;
        }
        /* drafts 2..: the block on its own hidden, the draft before as the id, one position on */
        for (uint32_t level = 1; level < max_k; level++) {
                uint32_t m = 0;
                struct x4_nextn_seq *ls = calloc(n, sizeof *ls);
                struct job **lj = calloc(n, sizeof *lj);
                uint32_t *li = calloc(n, sizeof *li);
                if (!ls || !lj || !li) {
                        free(ls), free(lj), free(li);
                        for (uint32_t i = 0; i < n; i++)
                                who[i]->mtp_k = MIN(who[i]->mtp_k, level);
                        break;
                }
                for (uint32_t i = 0; i < n; i++) {
                        struct job *j = who[i];
                        if (j->mtp_k <= level)
                                continue;
                        ls[m] = (struct x4_nextn_seq){
                                .seq = { .tokens = &j->mtp_tok[level], .n_tokens = 1,
                                         .pos0 = j->n_cached + level - 1, .pages = j->pages,
                                         .n_pages = j->n_pages, .logits = X4_LOGITS_LAST,
                                         .hidden = X4_LOGITS_LAST },
                                .h = chain + (size_t) i * H,
                        };
                        lj[m] = j;
                        li[m++] = i;
                }
                if (m > 0 && run_nextn(s, ls, lj, m) == 0)
                        for (uint32_t r = 0; r < m; r++) {
                                struct job *j = lj[r];
                                if (j->mtp_k > level) /* pick_draft may have cut the run */
                                        j->mtp_tok[level + 1] = pick_draft(s, j, level + 1,
                                                                           s->mtp_logits + (size_t) r * V);
                                memcpy(chain + (size_t) li[r] * H, s->mtp_hid + (size_t) r * H,
                                       H * sizeof(float));
                        }
                else
                        for (uint32_t r = 0; r < m; r++)
                                lj[r]->mtp_k = MIN(lj[r]->mtp_k, level);
                free(ls), free(lj), free(li);
        }
out:
        free(chain);
        free(ns);
        free(who);
}
