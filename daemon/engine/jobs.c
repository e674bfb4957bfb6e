/* SPDX-License-Identifier: MIT */
/* A request's life on the engine thread: releasing and freeing jobs, its events (chunks, the
 * final DONE or ERROR), and each sampled token through the detokenizer, the output parser, stops
 * and the constrained-decoding mask. */
#include "engine/internal.h"

/* ---- jobs (engine thread) ------------------------------------------------------------------- */

void eng_publish_stats(struct sched *s);

/* Give the pages back and make the stats say so BEFORE the final event is pushed: a client that
 * asks for stats right after its Done sees its pages free. */
void eng_job_release(struct sched *s, struct job *j) {
        if (j->n_pages && s->prefix && j->seq && j->n_cached)
                /* positions [0, n_cached) are in the cache: keep their full pages for reuse */
                (void) prefix_insert(s->prefix, j->seq, MIN(j->n_cached, j->n_seq), j->n_prompt, j->pages,
                                     j->n_pages);
        if (j->n_pages)
                (void) kvcache_release(s->kv, j->pages, j->n_pages);
        j->n_pages = 0;
        eng_publish_stats(s);
}

void eng_snap_abandon(struct job *j);

void eng_job_free(struct sched *s, struct job *j) {
        eng_snap_abandon(j);
        if (j->n_pages)
                (void) kvcache_release(s->kv, j->pages, j->n_pages);
        free(j->pages);
        free(j->seq);
        free(j->mtp_h);
        free(j->mtp_q);
        sampler_free(j->sampler);
        outparse_free(j->op);
        free(j->op_stop_string);
        free(j->snap_data);
        free(j->snap_meta);
        free(j->prep_msg);
        eng_logprob_free(j->cur_lp);
        tokenizer_stream_free(j->ts);
        grammar_matcher_free(j->gm);
        grammar_free(j->grammar);
        free(j->gmask);
        sched_request_free(j->r);
        free(j);
}

void eng_unlink_job(struct sched *s, struct job *j) {
        for (struct job **l = &s->jobs; *l; l = &(*l)->next)
                if (*l == j) {
                        *l = j->next;
                        return;
                }
}

void eng_fail_job(struct sched *s, struct job *j, int code, const char *fmt, ...) {
        struct sched_event *e = calloc(1, sizeof *e);
        char buf[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        eng_unlink_job(s, j);
        eng_job_release(s, j);
        if (e) {
                e->kind = SCHED_EVENT_ERROR;
                e->cookie = j->r->cookie;
                e->id = j->r->id;
                e->code = code;
                e->cancelled = j->end_cancelled;
                e->message = strdup(buf);
                eng_push_event(s, e, true);
        } else
                log_error("scheduler: out of memory reporting the failure of request %llu: %s",
                          (unsigned long long) j->r->id, buf);
        eng_job_free(s, j);
}

static void emit_chunk(struct sched *s, struct job *j, int channel, const char *text, size_t len,
                       const int32_t *tok, struct sched_logprob *lp, const char *tool_name,
                       const char *tool_arguments) {
        struct sched_event *e = calloc(1, sizeof *e);
        if (!e)
                goto oom;
        e->kind = SCHED_EVENT_CHUNK;
        e->cookie = j->r->cookie;
        e->id = j->r->id;
        e->channel = channel;
        if (!j->chunked) {
                j->chunked = true;
                e->first = true;
                e->prompt_tokens = j->n_prompt;
                e->cached_tokens = j->snap_n + j->n_reused;
        }
        e->text = malloc(len + 1);
        if (!e->text)
                goto oom;
        memcpy(e->text, text, len);
        e->text[len] = 0;
        e->text_len = len;
        if (tok && j->r->echo_ids) {
                e->tokens = malloc(sizeof *e->tokens);
                if (!e->tokens)
                        goto oom;
                e->tokens[0] = *tok;
                e->n_tokens = 1;
        }
        if (tool_name) {
                e->tool_name = strdup(tool_name);
                e->tool_arguments = strdup(tool_arguments ? tool_arguments : "{}");
                if (!e->tool_name || !e->tool_arguments)
                        goto oom;
        }
        if (lp) {
                e->logprobs = lp;
                e->n_logprobs = 1;
                lp = NULL;
        }
        eng_push_event(s, e, false);
        return;
oom:
        eng_logprob_free(lp);
        sched_event_free(e);
        log_error("scheduler: out of memory, a chunk of request %llu is lost",
                  (unsigned long long) j->r->id);
}

static int channel_of(enum outparse_channel c) {
        switch (c) {
        case OUTPARSE_REASONING: return SCHED_CHANNEL_REASONING;
        case OUTPARSE_TOOL_CALL: return SCHED_CHANNEL_TOOL_CALL;
        default: return SCHED_CHANNEL_CONTENT;
        }
}

/* outparse's events → chunks; the token being fed rides on the first chunk it produces. */
int eng_on_outparse(const struct outparse_event *ev, void *userdata) {
        struct job *j = userdata;
        const int32_t *tok = NULL;
        struct sched_logprob *lp = NULL;

        if (ev->type == OUTPARSE_EVENT_STOP) {
                j->op_stopped = true;
                j->op_finish = streq(ev->finish_reason, "length")      ? SCHED_FINISH_LENGTH
                               : streq(ev->finish_reason, "cancelled") ? SCHED_FINISH_CANCELLED
                                                                       : SCHED_FINISH_STOP;
                free(j->op_stop_string);
                j->op_stop_string = ev->stop_string ? strdup(ev->stop_string) : NULL;
                return 0;
        }
        if (!j->cur_sent) {
                tok = &j->cur_tok;
                lp = TAKE_PTR(j->cur_lp);
                j->cur_sent = true;
        }
        if (ev->type == OUTPARSE_EVENT_TOOL_CALL) {
                j->tool_call_seen = true;
                emit_chunk(j->s, j, SCHED_CHANNEL_TOOL_CALL, "", 0, tok, lp, ev->tool_name,
                           ev->tool_arguments);
        } else
                emit_chunk(j->s, j, channel_of(ev->channel), ev->text, ev->len, tok, lp, NULL,
                           NULL);
        return 0;
}

static const char *finish_name(int reason) {
        switch (reason) {
        case SCHED_FINISH_LENGTH: return "length";
        case SCHED_FINISH_CANCELLED: return "cancelled";
        default: return "stop";
        }
}

void eng_finish_job(struct sched *s, struct job *j, int reason, const char *stop) {
        struct sched_event *e;
        double t = now_ms();

        if (j->op && !j->op_stopped) {
                /* emit what outparse holds back (a possible stop-string start, an unfinished
                 * tool call as text) */
                const char *rest = NULL;
                size_t rest_len = 0;
                j->cur_sent = true;
                /* a trailing partial character (bytes the stream held back) is not lost */
                if (j->ts && tokenizer_stream_flush(j->ts, &rest, &rest_len) >= 0 && rest_len)
                        (void) outparse_feed_text(j->op, rest, rest_len);
                (void) outparse_finish(j->op, finish_name(reason));
        }
        if (reason == SCHED_FINISH_STOP && j->tool_call_seen)
                reason = SCHED_FINISH_TOOL_CALLS;
        eng_unlink_job(s, j);
        s->completion_total += j->n_out;
        eng_job_release(s, j);
        e = calloc(1, sizeof *e);
        if (!e) {
                log_error("scheduler: out of memory ending request %llu",
                          (unsigned long long) j->r->id);
                eng_job_free(s, j);
                return;
        }
        e->kind = SCHED_EVENT_DONE;
        e->cookie = j->r->cookie;
        e->id = j->r->id;
        e->finish_reason = reason;
        if (j->seq && j->n_seq) {
                /* the whole sequence, so a client can snapshot this request later */
                e->sequence = TAKE_PTR(j->seq);
                e->n_sequence = j->n_seq;
        }
        e->stop = stop ? strdup(stop) : NULL;
        e->prompt_tokens = j->n_prompt;
        e->cached_tokens = j->snap_n + j->n_reused;
        e->completion_tokens = j->n_out;
        e->reasoning_tokens = j->op ? (uint32_t) outparse_reasoning_tokens(j->op) : 0;
        double eng_admit = j->t_admit ? j->t_admit : t;
        e->queue_ms = eng_admit - j->t_submit;
        e->prefill_ms = j->t_first ? j->t_first - eng_admit : 0;
        e->decode_ms = j->t_first ? j->t_last - j->t_first : 0;
        e->total_ms = t - j->t_submit;
        eng_push_event(s, e, true);
        eng_job_free(s, j);
}

/* ---- output --------------------------------------------------------------------------------- */

static bool is_turn_end(const struct sched *s, int32_t t) {
        for (size_t i = 0; i < s->n_turn_end_ids; i++)
                if (s->turn_end_ids[i] == t)
                        return true;
        return false;
}

/* The mask starts when the reasoning ends; the reasoning is cut (`</think>` forced) when only
 * the tokens the constrained answer needs are left. Lazy tool calls need nothing kept; their
 * mask is off in any reasoning (a `<think>` the model opens itself too), where `<tool_call>` is
 * text. */
static void constraint_after_token(struct job *j) {
        bool reasoning = outparse_channel(j->op) == OUTPARSE_REASONING;
        if (grammar_matcher_lazy(j->gm)) {
                j->gm_on = !reasoning;
                return;
        }
        if (!j->gm_on && !reasoning)
                j->gm_on = true;
        if (!j->gm_on && reasoning && outparse_end_think_id(j->op) >= 0 &&
            j->max_tokens - j->n_out <= grammar_matcher_reserve(j->gm))
                j->force_end_think = true;
}

/* Disallowed tokens' logits to -inf (allowed ones untouched). False if none is allowed (the job
 * is failed). */
bool eng_constrain_logits(struct sched *s, struct job *j, float *l) {
        int n = grammar_matcher_mask(j->gm, j->max_tokens - j->n_out, j->gmask);
        if (n <= 0) {
                eng_fail_job(s, j, SCHED_ERR_INTERNAL, "%s", n < 0 ? "constraint: out of memory for the token mask"
                         : "constraint: no token of the vocabulary continues the constrained output here");
                return false;
        }
        grammar_mask_apply(j->gmask, l, s->cfg->n_vocab);
        return true;
}

/* A required answer (a JSON schema, json_object, a forced tool call: a constraint that is not
 * lazy) after a reasoning: until the reasoning ends, the tokens that end the turn are masked, so
 * the turn cannot end inside the reasoning with no answer at all (the demo model did so in 2 of
 * test_json_object_and_thinking's 3 requests with thinking on). The reasoning is otherwise free;
 * its end is forced when only the answer's room is left (constraint_after_token). */
void eng_keep_turn_open(struct sched *s, struct job *j, float *l) {
        if (!j->gm || j->gm_on || grammar_matcher_lazy(j->gm) || j->r->ignore_eos)
                return;
        for (size_t i = 0; i < s->n_turn_end_ids; i++)
                if (s->turn_end_ids[i] >= 0 && (uint32_t) s->turn_end_ids[i] < s->cfg->n_vocab)
                        l[s->turn_end_ids[i]] = -INFINITY;
}

/* A token was sampled (or forced) for j. Returns true if j ended (and was freed). */
bool eng_accept_token(struct sched *s, struct job *j, int32_t t, struct sched_logprob *lp) {
        double now = now_ms();

        if (j->state == JOB_PREFILL) {
                j->state = JOB_DECODE;
                j->t_first = now;
        }
        j->t_last = now;
        j->seq[j->n_seq++] = t;
        j->n_out++;
        (void) sampler_accept(j->sampler, t); /* generated tokens count for all penalties */
        if (j->gm && j->gm_on)
                (void) grammar_matcher_accept(j->gm, t); /* the mask allowed it */

        if (j->op) {
                const char *text = "";
                size_t len = 0;
                if (tokenizer_stream_feed(j->ts, t, &text, &len) < 0)
                        len = 0;
                j->cur_tok = t;
                j->cur_lp = lp;
                j->cur_sent = false;
                /* `</think>` belongs to the reasoning it closes (its logprob is not the answer's) */
                int ch = t == outparse_end_think_id(j->op) ? channel_of(outparse_channel(j->op)) : -1;
                /* ignore_eos (benchmarks): a turn-ending special is just another token */
                if (!(j->r->ignore_eos && is_turn_end(s, t)))
                        (void) outparse_feed(j->op, t, len ? text : "", len);
                if (!j->cur_sent) /* no text for this token (held back, or a special) */
                        emit_chunk(s, j, ch >= 0 ? ch : channel_of(outparse_channel(j->op)), "", 0, &t,
                                   TAKE_PTR(j->cur_lp), NULL, NULL);
                j->cur_sent = true;
                if (j->op_stopped) {
                        eng_finish_job(s, j, j->op_finish, j->op_stop_string);
                        return true;
                }
                j->force_end_think = outparse_should_force_end_think(j->op);
                if (j->gm)
                        constraint_after_token(j);
        } else {
                /* no tokenizer: ids only; EOS and stop ids end the request */
                bool stop = !j->r->ignore_eos && t == s->eos_id;
                for (size_t i = 0; i < j->r->n_stop_ids; i++)
                        stop |= j->r->stop_ids[i] == t;
                emit_chunk(s, j, SCHED_CHANNEL_CONTENT, "", 0, &t, lp, NULL, NULL);
                if (stop) {
                        eng_finish_job(s, j, SCHED_FINISH_STOP, NULL);
                        return true;
                }
        }
        if (j->n_out >= j->max_tokens) {
                eng_finish_job(s, j, SCHED_FINISH_LENGTH, NULL);
                return true;
        }
        return false;
}

