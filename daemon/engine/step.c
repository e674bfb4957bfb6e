/* SPDX-License-Identifier: MIT */
/* The engine thread's iteration: inputs from the loop thread, admission and preemption, the
 * prefill budget, one backend forward, sampling, statistics. */
#include "engine/internal.h"

/* ---- the step ------------------------------------------------------------------------------- */

static void take_inputs(struct sched *s) {
        pthread_mutex_lock(&s->lock);
        struct job *in = s->in_head;
        s->in_head = s->in_tail = NULL;
        uint64_t *cancels = s->cancels;
        size_t n_cancels = s->n_cancels;
        s->cancels = NULL;
        s->n_cancels = s->cap_cancels = 0;
        struct pause_op *pauses = s->pauses;
        size_t n_pauses = s->n_pauses;
        s->pauses = NULL;
        s->n_pauses = s->cap_pauses = 0;
        struct job *prepped = s->prepped;
        s->prepped = NULL;
        pthread_mutex_unlock(&s->lock);

        /* back from the prep thread: the engine owns them again; report failures */
        for (struct job *j = prepped, *next; j; j = next) {
                next = j->prep_next;
                j->prep_next = NULL;
                j->prep_queued = false;
        }
        for (struct job *j = prepped ? s->jobs : NULL, *next; j; j = next) {
                next = j->next;
                if (j->prep_queued)
                        continue;
                if (j->state == JOB_SAVING) { /* written (or not): cancels come too late */
                        if (j->prep_code)
                                eng_fail_job(s, j, j->prep_code, "%s", j->prep_msg ? j->prep_msg : "");
                        else if (j->snap_written < kvcache_pages_for(s->kv, j->n_prompt))
                                eng_finish_snapshot(s, j); /* the next chunk */
                        else
                                eng_snapshot_done(s, j, &j->saved);
                } else if (j->prep_code && !j->cancel)
                        eng_fail_job(s, j, j->prep_code, "%s", j->prep_msg ? j->prep_msg : "");
                else if (j->count_only)
                        eng_finish_job(s, j, SCHED_FINISH_STOP, NULL);
        }

        struct job **tail = &s->jobs;
        while (*tail)
                tail = &(*tail)->next;
        *tail = in;
        for (size_t i = 0; i < n_cancels; i++)
                for (struct job *j = s->jobs; j; j = j->next)
                        if (j->r->id == cancels[i])
                                j->cancel = true;
        free(cancels);
        for (size_t i = 0; i < n_pauses; i++)
                for (struct job *j = s->jobs; j; j = j->next)
                        if (j->r->id == pauses[i].id)
                                j->paused = pauses[i].paused;
        free(pauses);
        for (struct job *j = s->jobs, *next; j; j = next) {
                next = j->next;
                if (j->prep_queued)
                        continue; /* finished (or cancelled) when the prep thread gives it back */
                if (j->cancel && j->r->snapshot_create) {
                        /* a snapshot request ends with a SnapshotReply or an Error, never a
                         * bare Done: say nothing was saved */
                        j->end_cancelled = true; /* counted as cancelled, not refused */
                        eng_fail_job(s, j, SCHED_ERR_UNAVAILABLE,
                                 "snapshot '%s': cancelled before it was saved (nothing written)",
                                 j->r->snapshot_create);
                } else if (j->cancel)
                        eng_finish_job(s, j, SCHED_FINISH_CANCELLED, NULL);
        }
}

static uint32_t prefix_evict_if(struct sched *s, uint32_t want) {
        return s->prefix ? prefix_evict(s->prefix, want) : 0;
}

/* Hand a job to the prep thread (tokenizing a megabyte of chat or reading a snapshot file there
 * does not stall the running streams). */
static void preempt(struct sched *s, struct job *j);
static struct job *pick_victim(struct sched *s);

void eng_admit(struct sched *s) {
        uint32_t running = 0;
        uint32_t pt = kvcache_page_tokens(s->kv);
        for (struct job *j = s->jobs; j; j = j->next)
                running += j->state != JOB_WAITING && j->state != JOB_SAVING;
        for (struct job *j = s->jobs, *next; j; j = next) {
                next = j->next;
                if (j->state != JOB_WAITING || j->prep_queued)
                        continue;
                if (!j->prepared) {
                        eng_prep_enqueue(s, j);
                        continue;
                }
                if (j->paused)
                        continue; /* a paused request would only hold pages: it waits */
                if (running >= s->p.max_running)
                        break; /* FIFO for slots: later requests wait behind this one */
                /* what has to be in the cache before it decodes: the prompt, or for a preempted
                 * request everything but its last sampled token (fed by its next decode step) */
                bool resumed = j->n_out > 0;
                uint32_t fill = resumed ? j->n_seq - 1 : j->n_prompt;
                uint32_t cap = kvcache_pages_for(s->kv, (uint64_t) j->n_prompt + j->max_tokens + 1);
                if (!j->pages && !(j->pages = malloc(cap * sizeof *j->pages))) {
                        eng_fail_job(s, j, SCHED_ERR_INTERNAL, "out of memory for a page table");
                        continue;
                }
                /* the longest stored prefix, in full pages; a new request computes at least one
                 * prompt token (its logits start the output). A resumed snapshot's pages that are
                 * stored already (an earlier resume of it) are shared, not written again. */
                uint32_t k = 0;
                if (s->prefix)
                        k = prefix_match(s->prefix, j->seq, fill, j->n_prompt,
                                         resumed ? fill / pt : (j->n_prompt - 1) / pt, j->pages);
                /* pages are taken as the sequence grows, but a request starts only when the pages
                 * its prompt needs are free now, so admitting it does not preempt another at once.
                 * One that does not fit yet lets later ones that do start (they are preempted
                 * first if the cache runs out: the most recently admitted goes first). */
                uint32_t need = kvcache_pages_for(s->kv, (uint64_t) fill + 1);
                need = need > k ? need - k : 0;
                if (need > kvcache_n_free(s->kv))
                        /* pages only the store holds go back, least recently used first */
                        (void) prefix_evict_if(s, need - kvcache_n_free(s->kv));
                /* a request whose client does not read its output makes no progress: it gives
                 * its pages up to one that can run (it resumes once its client reads again) */
                for (struct job *v; need > kvcache_n_free(s->kv) && (v = pick_victim(s)) &&
                                    v->paused;) {
                        preempt(s, v);
                        running--;
                        (void) prefix_evict_if(s, need - MIN(need, kvcache_n_free(s->kv)));
                }
                uint32_t snap = !resumed && j->snap_data && j->snap_pages > k ? j->snap_pages - k : 0;
                if (need > kvcache_n_free(s->kv) ||
                    (snap && kvcache_alloc(s->kv, snap, j->pages + k) < 0)) {
                        if (k)
                                (void) kvcache_release(s->kv, j->pages, k);
                        continue;
                }
                j->n_pages = k + snap;
                j->n_fill = fill;
                j->admit_seq = ++s->admit_counter;
                bool first = j->t_admit == 0;
                if (s->prefix && first)
                        prefix_count(s->prefix, k);
                /* cached: the snapshot's tokens and the stored pages, whichever reach further */
                j->n_cached = MAX(j->snap_data ? j->snap_n : 0, k * pt);
                j->mtp = s->mtp && !j->r->no_mtp;
                eng_mtp_reset(j, j->n_cached);
                if (first)
                        j->n_reused = j->n_cached - j->snap_n;
                if (j->snap_data) {
                        size_t pb = s->p.ops->page_bytes(s->p.backend);
                        int ret = 0;
                        char err[256];
                        for (uint32_t i = k; ret >= 0 && i < j->snap_pages; i++)
                                ret = s->p.ops->page_write(s->p.backend, j->pages[i],
                                                           j->snap_data + (size_t) i * pb, err,
                                                           sizeof err);
                        free(j->snap_data);
                        j->snap_data = NULL;
                        if (ret < 0) {
                                eng_fail_job(s, j, SCHED_ERR_INTERNAL, "snapshot '%s': %s",
                                         j->r->snapshot, err);
                                continue;
                        }
                }
                /* a resumed request whose whole sequence came from the store decodes at once */
                j->state = resumed && j->n_cached >= fill ? JOB_DECODE : JOB_PREFILL;
                if (first) {
                        j->t_admit = now_ms();
                        s->prompt_total += j->n_prompt;
                } else
                        log_debug("request %llu resumed: %u tokens to recompute, %u from the store",
                                  (unsigned long long) j->r->id, fill - MIN(fill, j->n_cached),
                                  MIN(fill, j->n_cached));
                running++;
        }
}

/* Preemption by recompute: give j's pages back (its full pages stay in the prefix store while the
 * cache allows, so resuming may not even recompute them) and put it back in the queue, at its
 * place by arrival. Everything else -- its sequence, sampler (RNG state, penalties), output
 * parser, detokenizer -- is kept, and a position's cache row depends only on the tokens before
 * it, so the resumed request produces exactly what it would have without the interruption. */
static void preempt(struct sched *s, struct job *j) {
        if (j->n_pages && s->prefix && j->n_cached)
                (void) prefix_insert(s->prefix, j->seq, MIN(j->n_cached, j->n_seq), j->n_prompt, j->pages,
                                     j->n_pages);
        if (j->n_pages)
                (void) kvcache_release(s->kv, j->pages, j->n_pages);
        log_info("request %llu preempted (cache full): %u tokens in the cache, %u generated; it "
                 "resumes when pages are free", (unsigned long long) j->r->id, j->n_cached, j->n_out);
        j->n_pages = 0;
        j->n_cached = 0;
        j->plan = 0;
        j->state = JOB_WAITING;
        j->preempted++;
        s->preemptions++;
}

/* The victim when the cache runs out: a paused request (its client is not reading) if any, else
 * the most recently admitted one. The oldest request therefore always progresses. */
static struct job *pick_victim(struct sched *s) {
        struct job *v = NULL;
        for (struct job *j = s->jobs; j; j = j->next) {
                if (j->state == JOB_WAITING || j->state == JOB_SAVING)
                        continue;
                if (!v || (j->paused && !v->paused) ||
                    (j->paused == v->paused && j->admit_seq > v->admit_seq))
                        v = j;
        }
        return v;
}

/* Pages for j to hold positions [0, n_tokens), taken as it grows. False if the cache has none
 * left even after evicting pages only the prefix store holds. */
static bool grow_pages(struct sched *s, struct job *j, uint64_t n_tokens) {
        uint32_t want = kvcache_pages_for(s->kv, n_tokens);
        if (want <= j->n_pages)
                return true;
        uint32_t more = want - j->n_pages;
        if (more > kvcache_n_free(s->kv))
                (void) prefix_evict_if(s, more - kvcache_n_free(s->kv));
        if (more > kvcache_n_free(s->kv) || kvcache_alloc(s->kv, more, j->pages + j->n_pages) < 0)
                return false;
        j->n_pages = want;
        return true;
}

/* Prompt tokens one step may compute while other requests decode: a fixed --prefill-budget, else
 * sized from measured costs so a step with prefill takes at most about PREFILL_STEP_FACTOR pure
 * decode steps (no running stream stalls on someone's long prompt). Nothing decoding: a whole
 * chunk per prefilling request. */
#define PREFILL_STEP_FACTOR 4.0
#define PREFILL_BUDGET_MIN 1u
static uint32_t prefill_budget(const struct sched *s, bool decoding) {
        if (s->p.prefill_budget)
                return s->p.prefill_budget;
        if (!decoding)
                return UINT32_MAX;
        if (s->decode_step_ms <= 0 || s->prefill_tok_ms <= 0)
                return PREFILL_BUDGET_MIN; /* not measured yet: start small */
        double b = (PREFILL_STEP_FACTOR - 1.0) * s->decode_step_ms / s->prefill_tok_ms;
        if (b < PREFILL_BUDGET_MIN)
                return PREFILL_BUDGET_MIN;
        return b > s->p.prefill_chunk ? s->p.prefill_chunk : (uint32_t) b;
}

/* Tell the client how far a long prefill has come: once it has taken a second, at most four
 * times a second. */
#define PROGRESS_AFTER_MS 1000.0
#define PROGRESS_EVERY_MS 250.0
static void maybe_progress(struct sched *s, struct job *j, double now) {
        /* not for snapshot creation: its client waits for exactly one reply frame */
        if (j->create || j->n_out > 0 || now - j->t_submit < PROGRESS_AFTER_MS ||
            now - j->t_progress < PROGRESS_EVERY_MS || j->n_cached >= j->n_fill)
                return;
        struct sched_event *e = calloc(1, sizeof *e);
        if (!e)
                return;
        j->t_progress = now;
        e->kind = SCHED_EVENT_PROGRESS;
        e->cookie = j->r->cookie;
        e->id = j->r->id;
        e->done_tokens = j->n_cached;
        e->total_tokens = j->n_fill;
        eng_push_event(s, e, false);
}

/* Plan up to `want` prompt tokens of j for this step (within --prefill-chunk and what is left of
 * its prompt), taking the pages they need; when the cache is out, a younger request is preempted
 * for them (pick_victim), or j, the youngest, waits. Sets and returns j->plan. */
static uint32_t plan_prefill(struct sched *s, struct job *j, uint32_t want, bool may_preempt) {
        uint32_t pt = kvcache_page_tokens(s->kv);
        uint32_t chunk = MIN(MIN(s->p.prefill_chunk, want), j->n_fill - j->n_cached);
        while (chunk && !grow_pages(s, j, (uint64_t) j->n_cached + chunk)) {
                /* what its pages hold already, else preempt a younger request for it */
                uint32_t room = (uint32_t) MIN((uint64_t) j->n_pages * pt - j->n_cached,
                                               (uint64_t) chunk);
                if (room) {
                        chunk = room;
                        break;
                }
                struct job *v = pick_victim(s);
                if (!may_preempt || !v || v == j ||
                    (!v->paused && v->admit_seq < j->admit_seq)) {
                        chunk = 0; /* the youngest itself: it waits for pages */
                        break;
                }
                preempt(s, v);
        }
        j->plan = chunk;
        return chunk;
}

static int by_prompt_left(const void *a, const void *b) {
        const struct job *x = *(const struct job *const *) a, *y = *(const struct job *const *) b;
        uint32_t l = x->n_fill - x->n_cached, r = y->n_fill - y->n_cached;
        return l < r ? -1 : l > r;
}

/* Sample (or force) j's next token from its logits row l, as every step does; false when j
 * failed (and was freed). With a draft distribution q (MTP rejection sampling, engine/mtp.c), the
 * draft is accepted with min(1, p/q) or another token drawn from max(0, p - q) (p: the row's
 * distribution after the mask and every sampling option); *accepted says whether the token is
 * the draft. */
static bool sample_row(struct sched *s, struct job *j, float *l, const float *q, int32_t draft,
                       int32_t *ret, struct sched_logprob **ret_lp, bool *accepted) {
        struct sched_logprob *lp = NULL;
        int32_t t;

        if (j->force_end_think) {
                t = outparse_end_think_id(j->op);
                *accepted = draft >= 0 && t == draft;
        } else {
                struct sampler_result res;
                bool want = j->r->logprobs > 0;
                char err[256] = "";
                if (j->gm && j->gm_on && !eng_constrain_logits(s, j, l))
                        return false;
                eng_keep_turn_open(s, j, l);
                if (q) {
                        bool ok = false;
                        float *p = eng_mtp_grow(&s->mtp_p, &s->mtp_p_cap, s->cfg->n_vocab);
                        t = !p ? -ENOMEM : sampler_probs(j->sampler, l, p);
                        if (t >= 0)
                                t = sampler_speculate(j->sampler, p, q, draft, &ok);
                        if (t >= 0 && want)
                                t = sampler_logprobs(j->sampler, l, t, &res, j->r->logprobs);
                        *accepted = ok;
                } else
                        t = sampler_sample(j->sampler, l, want ? &res : NULL, j->r->logprobs, err,
                                           sizeof err);
                if (t < 0) {
                        if (!err[0])
                                snprintf(err, sizeof err, "%s", strerror(-t));
                        eng_fail_job(s, j, SCHED_ERR_INTERNAL, "sampling: %s", err);
                        return false;
                }
                if (want && (lp = calloc(1, sizeof *lp)) &&
                    (lp->top = calloc(MAX(res.n_top, 1u), sizeof *lp->top))) {
                        lp->token_id = res.token;
                        lp->logprob = res.logprob;
                        /* a constraint leaves fewer allowed tokens than asked for: the
                         * masked ones (-inf) are not alternatives */
                        while (res.n_top > 0 && !isfinite(res.top[res.n_top - 1].logprob))
                                res.n_top--;
                        lp->n_top = res.n_top;
                        for (uint32_t k = 0; k < res.n_top; k++) {
                                lp->top[k] = (struct sched_top_logprob){ res.top[k].token,
                                                                         res.top[k].logprob };
                                /* so clients show the alternative, not "<token N>" */
                                if (s->p.tokenizer) {
                                        size_t len, plen;
                                        if (tokenizer_decode(s->p.tokenizer, &res.top[k].token,
                                                             1, 0, &lp->top[k].text, &len) < 0)
                                                lp->top[k].text = NULL;
                                        /* as the token reads inside the output: decoding it alone
                                         * drops a leading "▁" (the start of a text has no space
                                         * before it), so " user" came back as "user" */
                                        const char *piece = tokenizer_piece(s->p.tokenizer, res.top[k].token, &plen);
                                        char *t = lp->top[k].text, *sp;
                                        if (t && piece && plen >= 3 && memcmp(piece, "\xe2\x96\x81", 3) == 0 &&
                                            t[0] != ' ' && !(j->ts && tokenizer_stream_at_run_start(j->ts)) &&
                                            (sp = malloc(len + 2))) {
                                                sp[0] = ' ';
                                                memcpy(sp + 1, t, len + 1);
                                                free(t);
                                                lp->top[k].text = sp;
                                        }
                                }
                        }
                } else if (lp) {
                        free(lp);
                        lp = NULL;
                }
        }
        if (!q)
                *accepted = draft >= 0 && t == draft;
        *ret = t;
        *ret_lp = lp;
        return true;
}

/* MTP: the rows of a verify step (engine/mtp.c). Row i goes through the mask and the sampler as a
 * one-token step at that position would: greedy requests (and --mtp-sampling match) accept draft
 * i + 1 when it is the token the sampler picks; sampled ones accept it by rejection sampling
 * against the distribution it was drawn from. The first other token ends the step (it is the
 * trunk's own next token). Returns the accepted drafts. */
static uint32_t verify(struct sched *s, struct job *j, const struct x4_seq *sq, const float *logits,
                       const float *hid) {
        const size_t V = s->cfg->n_vocab, H = s->cfg->n_embd;
        uint32_t k = sq->n_tokens - 1, accepted = 0;
        bool gone = false; /* j ended or failed, and was freed */

        s->mtp_drafted += k;
        for (uint32_t i = 0; i <= k; i++) {
                struct sched_logprob *lp;
                int32_t t;

                /* positions up to pos0 + i hold the sequence's own tokens now */
                j->n_cached = sq->pos0 + i + 1;
                (void) eng_mtp_keep(s, j, sq->pos0 + i, hid + i * H, 1);
                bool ok = false;
                const float *q = i < k && j->mtp_rej ? j->mtp_q + (size_t) i * V : NULL;
                if (!sample_row(s, j, (float *) logits + i * V, q, i < k ? sq->tokens[i + 1] : -1, &t,
                                &lp, &ok)) {
                        gone = true;
                        break;
                }
                ok = ok && i < k;
                accepted += ok;
                if ((gone = eng_accept_token(s, j, t, lp)) || !ok)
                        break;
        }
        s->mtp_accepted += accepted;
        if (!gone)
                eng_mtp_count(s, j, k, accepted);
        return accepted;
}

/* Pages for this step, as sequences grow: decoding requests first (one position each, plus the
 * MTP drafts where their pages are free now), oldest first; when the cache is out, preempt
 * (pick_victim) and try again. */
static void plan_decodes(struct sched *s) {
        for (bool again = true; again;) {
                again = false;
                for (struct job *j = s->jobs; j; j = j->next) {
                        j->plan = 0;
                        j->mtp_k = 0;
                        if (j->state != JOB_DECODE || j->paused)
                                continue;
                        j->mtp_k = eng_mtp_want(s, j);
                        if (j->mtp_k && !grow_pages(s, j, (uint64_t) j->n_cached + 1 + j->mtp_k))
                                j->mtp_k = 0;
                        if (grow_pages(s, j, (uint64_t) j->n_cached + 1))
                                continue;
                        preempt(s, pick_victim(s));
                        again = true;
                        break;
                }
        }
}

/* Prompt chunks within the step's budget: half of it (all, if it is alone) to the oldest prompt,
 * so it always progresses; the rest to the others, fewest tokens left first, so a short prompt is
 * done in a step or two even beside a long one; what is left over goes back to the oldest. */
static void plan_prefills(struct sched *s) {
        bool decoding = false;
        for (struct job *j = s->jobs; j; j = j->next)
                decoding |= j->state == JOB_DECODE && !j->paused;
        uint32_t left = prefill_budget(s, decoding), n_pre = 0;
        struct job *oldest = NULL;
        for (struct job *j = s->jobs; j; j = j->next)
                if (j->state == JOB_PREFILL && !j->paused) {
                        oldest = oldest ? oldest : j;
                        n_pre++;
                }
        if (!oldest)
                return;
        uint32_t share = n_pre > 1 ? left - left / 2 : left;
        left -= plan_prefill(s, oldest, share, true);
        struct job **rest = n_pre > 1 ? calloc(n_pre - 1, sizeof *rest) : NULL;
        uint32_t n_rest = 0;
        for (struct job *j = oldest->next; rest && j; j = j->next)
                if (j->state == JOB_PREFILL && !j->paused && n_rest < n_pre - 1)
                        rest[n_rest++] = j;
        if (n_rest)
                qsort(rest, n_rest, sizeof *rest, by_prompt_left);
        for (uint32_t i = 0; i < n_rest && left > 0; i++)
                if (rest[i]->state == JOB_PREFILL) /* not preempted meanwhile */
                        left -= plan_prefill(s, rest[i], left, true);
        free(rest);
        if (left > 0 && oldest->state == JOB_PREFILL && oldest->plan) {
                /* more only within the pages free now: nobody is preempted for it */
                uint32_t had = oldest->plan;
                if (plan_prefill(s, oldest, had + left, false) < had)
                        oldest->plan = had;
        }
}

/* One step's batch: a sequence per planned job, with the job that owns it and the rows it asks
 * for. */
struct step_batch {
        struct x4_seq *seqs;
        struct job **owners;
        uint32_t n, rows, hrows;
        uint32_t prefill_tokens, decode_tokens;
};

static void step_batch_free(struct step_batch *b) {
        free(b->seqs);
        free(b->owners);
        *b = (struct step_batch){ 0 };
}

/* The planned jobs as a batch, and room for its logits and hidden rows; false (logged) when out
 * of memory or nothing is planned. */
static bool build_batch(struct sched *s, struct step_batch *b) {
        uint32_t cap = 0;

        *b = (struct step_batch){ 0 };
        for (struct job *j = s->jobs; j; j = j->next)
                cap += (j->state == JOB_DECODE && !j->paused) || j->plan;
        if (cap == 0)
                return false;
        eng_mtp_draft(s);
        b->seqs = calloc(cap, sizeof *b->seqs);
        b->owners = calloc(cap, sizeof *b->owners);
        if (!b->seqs || !b->owners) {
                step_batch_free(b);
                log_error("scheduler: out of memory building a batch of %u sequences", cap);
                return false;
        }
        for (struct job *j = s->jobs; j; j = j->next) {
                struct x4_seq *sq = &b->seqs[b->n];
                if (j->state == JOB_DECODE && !j->paused && j->mtp_k) {
                        /* MTP: the last sampled token and the drafts, every row (verify) */
                        *sq = (struct x4_seq){ .tokens = j->mtp_tok, .n_tokens = 1 + j->mtp_k,
                                               .pos0 = j->n_cached, .pages = j->pages,
                                               .n_pages = j->n_pages, .logits = X4_LOGITS_ALL,
                                               .hidden = X4_LOGITS_ALL };
                        b->decode_tokens++;
                        b->rows += 1 + j->mtp_k;
                        b->hrows += 1 + j->mtp_k;
                } else if (j->state == JOB_DECODE && !j->paused) {
                        *sq = (struct x4_seq){ .tokens = &j->seq[j->n_cached], .n_tokens = 1,
                                               .pos0 = j->n_cached, .pages = j->pages,
                                               .n_pages = j->n_pages, .logits = X4_LOGITS_LAST,
                                               .hidden = j->mtp ? X4_LOGITS_LAST : X4_LOGITS_NONE };
                        b->decode_tokens++;
                        b->rows++;
                        b->hrows += j->mtp;
                } else if (j->plan) {
                        uint32_t chunk = j->plan;
                        /* logits for the last prompt token only; a resumed request's last
                         * recomputed token already has its sampled successor */
                        bool last = j->n_cached + chunk == j->n_fill && !j->create && j->n_out == 0;
                        /* the chunk's prompt tokens (a preempted request recomputes what it
                         * generated as generated tokens: a token's class is its role in the
                         * request, kernels/backend.h) */
                        uint32_t n_pr = j->n_cached < j->n_prompt ? MIN(chunk, j->n_prompt - j->n_cached) : 0;
                        *sq = (struct x4_seq){ .tokens = &j->seq[j->n_cached], .n_tokens = chunk,
                                               .pos0 = j->n_cached, .pages = j->pages,
                                               .n_pages = j->n_pages,
                                               .logits = last ? X4_LOGITS_LAST : X4_LOGITS_NONE,
                                               .hidden = j->mtp ? X4_LOGITS_ALL : X4_LOGITS_NONE,
                                               .prompt_tokens = n_pr };
                        b->prefill_tokens += chunk;
                        b->rows += last;
                        b->hrows += j->mtp ? chunk : 0;
                } else
                        continue;
                b->owners[b->n++] = j;
        }
        size_t need = (size_t) MAX(b->rows, 1u) * s->cfg->n_vocab;
        /* the forward's output buffers: the backend's x4_host_alloc memory (page-locked on CUDA,
         * where the copies into malloc'ed memory were 14% of a batch-64 step) */
        if (!x4_host_grow(s->p.ops, s->p.backend, &s->logits, &s->logits_cap, need)) {
                log_error("scheduler: out of memory for %u logits rows", b->rows);
                step_batch_free(b);
                return false;
        }
        if (b->hrows && !x4_host_grow(s->p.ops, s->p.backend, &s->hidden, &s->hidden_cap, (size_t) b->hrows * s->cfg->n_embd)) {
                log_error("scheduler: out of memory for %u hidden rows", b->hrows);
                step_batch_free(b);
                return false;
        }
        return true;
}

/* After the forward: each sequence's positions are cached; prompts report progress, enter the
 * prefix store or finish a snapshot; rows with logits are sampled (verify steps through verify).
 * Returns the MTP drafts accepted. */
static uint32_t take_results(struct sched *s, const struct step_batch *b) {
        uint32_t row = 0, hrow = 0, accepted = 0;
        double now = now_ms();

        for (uint32_t i = 0; i < b->n; i++) {
                struct job *j = b->owners[i];
                const struct x4_seq *sq = &b->seqs[i];
                const float *hid = b->hrows ? s->hidden + (size_t) hrow * s->cfg->n_embd : NULL;
                uint32_t nh = sq->hidden == X4_LOGITS_ALL ? sq->n_tokens : sq->hidden != 0;
                hrow += nh;
                if (sq->logits == X4_LOGITS_ALL) { /* an MTP verify step */
                        accepted += verify(s, j, sq, s->logits + (size_t) row * s->cfg->n_vocab, hid);
                        row += sq->n_tokens;
                        continue;
                }
                j->n_cached += sq->n_tokens;
                if (nh)
                        (void) eng_mtp_keep(s, j, sq->pos0 + sq->n_tokens - nh, hid, nh);
                if (j->state == JOB_PREFILL) {
                        if (j->n_out > 0 && j->n_cached >= j->n_fill) {
                                j->state = JOB_DECODE; /* resumed: recomputed, decodes again */
                                continue;
                        }
                        maybe_progress(s, j, now);
                }
                if (s->prefix && j->state == JOB_PREFILL && j->n_cached == j->n_prompt)
                        /* prompt prefilled: its full pages can serve requests admitted from now
                         * on (they are never written again) */
                        (void) prefix_insert(s->prefix, j->seq, j->n_prompt, j->n_prompt, j->pages, j->n_pages);
                if (j->create && j->n_cached == j->n_prompt) {
                        eng_mtp_flush(s, j); /* the NextN rows go into the snapshot too */
                        eng_finish_snapshot(s, j);
                        continue;
                }
                if (sq->logits != X4_LOGITS_LAST)
                        continue;
                float *l = s->logits + (size_t) row++ * s->cfg->n_vocab;
                struct sched_logprob *lp = NULL;
                int32_t t;
                bool ok;
                if (!sample_row(s, j, l, NULL, -1, &t, &lp, &ok))
                        continue;
                (void) eng_accept_token(s, j, t, lp);
        }
        return accepted;
}

/* One step's sample folded into a recent average; the first sample is the average (an average
 * seeded at 0 showed a fifth of the real rate after a one-step prompt, and half after three). */
static double ema(double avg, double sample) {
        const double a = 0.2;
        return avg > 0 ? (1 - a) * avg + a * sample : sample;
}

/* Recent rates, exponential moving averages over steps: what stats show, and the prefill
 * budget's inputs (a pure decode step, and a prompt token's share of a step beyond the decode
 * work in it). */
static void update_rates(struct sched *s, const struct step_batch *b, double dt, uint32_t accepted) {
        if (dt <= 0)
                return;
        if (b->prefill_tokens)
                s->prefill_rate = ema(s->prefill_rate, b->prefill_tokens * 1e3 / dt);
        if (b->decode_tokens)
                s->decode_rate = ema(s->decode_rate, (b->decode_tokens + accepted) * 1e3 / dt);
        if (!b->prefill_tokens)
                s->decode_step_ms = ema(s->decode_step_ms, dt);
        else {
                double extra = dt - (b->decode_tokens ? s->decode_step_ms : 0);
                s->prefill_tok_ms = ema(s->prefill_tok_ms, MAX(extra, 0.05 * dt) / b->prefill_tokens);
        }
}

/* One engine step: plan (decodes, then prompt chunks), build the batch, run the forward, take
 * the results. A failed forward fails every request in the batch with the backend's reason. */
static void step(struct sched *s) {
        struct step_batch b;

        plan_decodes(s);
        plan_prefills(s);
        if (!build_batch(s, &b))
                return;
        struct x4_batch batch = { .seqs = b.seqs, .n_seqs = b.n, .hidden = b.hrows ? s->hidden : NULL };
        double t0 = now_ms();
        char msg[1024] = "";
        int r = s->p.ops->forward(s->p.backend, &batch, s->logits, msg, sizeof msg);
        double dt = now_ms() - t0;
        if (r < 0) {
                for (uint32_t i = 0; i < b.n; i++)
                        eng_fail_job(s, b.owners[i], SCHED_ERR_INTERNAL, "backend forward failed: %s", msg);
                step_batch_free(&b);
                return;
        }
        s->steps++;
        s->steps_multi += b.n > 1;
        s->batch_max = MAX(s->batch_max, b.n);
        update_rates(s, &b, dt, take_results(s, &b));
        step_batch_free(&b);
}

void eng_publish_stats(struct sched *s) {
        struct sched_stats st = {
                .prompt_tokens = s->prompt_total,
                .completion_tokens = s->completion_total,
                .prefill_tok_s = s->prefill_rate,
                .decode_tok_s = s->decode_rate,
                .pages_total = kvcache_n_pages(s->kv),
                .pages_used = kvcache_n_pages(s->kv) - kvcache_n_free(s->kv),
                .page_tokens = kvcache_page_tokens(s->kv),
                .memory_used = s->caps.memory_used,
                .memory_total = s->caps.memory_total,
                .steps = s->steps,
                .steps_multi = s->steps_multi,
                .batch_max = s->batch_max,
                .preemptions = s->preemptions,
                .mtp_drafted_tokens = s->mtp_drafted,
                .mtp_accepted_tokens = s->mtp_accepted,
        };
        if (s->prefix) {
                struct prefix_stats ps;
                prefix_get_stats(s->prefix, &ps);
                st.prefix_hits = ps.hits;
                st.prefix_misses = ps.misses;
                st.prefix_tokens_reused = ps.tokens_reused;
                st.prefix_pages = ps.pages_held;
                /* pages only the store holds are free as far as admission goes */
                st.pages_used -= ps.pages_idle;
        }
        size_t n = 0;
        for (struct job *j = s->jobs; j; j = j->next)
                n++;
        struct sched_request_state *a = calloc(MAX(n, (size_t) 1), sizeof *a);
        size_t k = 0;
        for (struct job *j = s->jobs; a && j; j = j->next, k++) {
                a[k].id = j->r->id;
                a[k].running = j->state != JOB_WAITING;
                a[k].paused = j->paused;
                a[k].prompt_tokens = !j->prep_queued && j->n_prompt ? j->n_prompt : j->r->n_tokens;
                a[k].prefilled_tokens = MIN(j->n_cached, j->n_prompt);
                a[k].completion_tokens = j->n_out;
                a[k].age_ms = (uint64_t) j->t_submit; /* made relative on read */
                a[k].peer_pid = j->r->peer_pid;
                a[k].peer_uid = j->r->peer_uid;
                memcpy(a[k].client, j->r->client, sizeof a[k].client);
                if (a[k].running)
                        st.running++;
                else
                        st.waiting++;
        }
        pthread_mutex_lock(&s->lock);
        /* requests handed over but not yet taken by the engine count as waiting */
        for (struct job *j = s->in_head; j; j = j->next)
                st.waiting++;
        s->stats = st;
        if (a) {
                free(s->states);
                s->states = a;
                s->n_states = k;
        }
        pthread_mutex_unlock(&s->lock);
}

void *eng_engine_main(void *userdata) {
        struct sched *s = userdata;

        log_set_ident("xing4d");
        for (;;) {
                pthread_mutex_lock(&s->lock);
                while (!s->quit && !s->in_head && s->n_cancels == 0 && s->n_pauses == 0 &&
                       !s->prepped && !s->jobs)
                        pthread_cond_wait(&s->wake, &s->lock);
                bool quit = s->quit;
                pthread_mutex_unlock(&s->lock);
                if (quit)
                        break;
                take_inputs(s);
                eng_admit(s);
                step(s);
                eng_publish_stats(s);
                /* requests that ended in this step gave pages back: eng_admit waiting ones now.
                 * If still nothing runs, nothing can free pages but a new input: sleep. */
                eng_admit(s);
                bool busy = false;
                for (struct job *j = s->jobs; j; j = j->next)
                        busy |= j->state != JOB_WAITING && j->state != JOB_SAVING && !j->paused;
                if (!busy && s->jobs) {
                        pthread_mutex_lock(&s->lock);
                        while (!s->quit && !s->in_head && s->n_cancels == 0 && s->n_pauses == 0 &&
                               !s->prepped)
                                pthread_cond_wait(&s->wake, &s->lock);
                        pthread_mutex_unlock(&s->lock);
                }
        }
        return NULL;
}

