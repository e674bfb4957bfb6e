/* SPDX-License-Identifier: MIT */
/* The scheduler: what the loop thread calls (validation, submit, cancel, pause, drain, stats,
 * events out) and its lifecycle. The engine itself is in daemon/engine/: step.c (the engine
 * thread's iteration: inputs, admission and preemption, the prefill budget, one forward,
 * sampling), jobs.c (a request's events and token output), prepare.c (prompt preparation on the
 * prep thread), snapshot.c (snapshot files); engine/internal.h is what they share. No socket I/O
 * on the engine thread; the loop thread is woken through an eventfd. */
#include "engine/internal.h"

/* ---- requests and events -------------------------------------------------------------------- */

void eng_messages_free(struct sched_message *m, size_t n) {
        for (size_t i = 0; m && i < n; i++) {
                free(m[i].role);
                free(m[i].content);
                free(m[i].reasoning);
                free(m[i].tool_calls_json);
                free(m[i].name);
        }
        free(m);
}

void sched_request_free(struct sched_request *r) {
        if (!r)
                return;
        free(r->tokens);
        free(r->text);
        eng_messages_free(r->messages, r->n_messages);
        free(r->tools_json);
        for (size_t i = 0; i < r->n_stop; i++)
                free(r->stop[i]);
        free(r->stop);
        free(r->stop_ids);
        free(r->snapshot);
        free(r->snapshot_create);
        free(r->constraint_schema);
        free(r->constraint_tool);
        free(r);
}

void eng_logprob_free(struct sched_logprob *lp) {
        if (!lp)
                return;
        for (uint32_t k = 0; lp->top && k < lp->n_top; k++)
                free(lp->top[k].text);
        free(lp->top);
        free(lp);
}

void sched_event_free(struct sched_event *e) {
        if (!e)
                return;
        free(e->text);
        free(e->tokens);
        for (uint32_t i = 0; i < e->n_logprobs; i++) {
                for (uint32_t k = 0; e->logprobs[i].top && k < e->logprobs[i].n_top; k++)
                        free(e->logprobs[i].top[k].text);
                free(e->logprobs[i].top);
        }
        free(e->logprobs);
        free(e->tool_name);
        free(e->tool_arguments);
        free(e->sequence);
        free(e->stop);
        free(e->message);
        free(e);
}

/* A request's final event: how it ended, in the counters (with s->lock held). */
static void count_end(struct sched *s, const struct sched_event *e) {
        switch (e->kind) {
        case SCHED_EVENT_DONE:
                if (e->finish_reason == SCHED_FINISH_CANCELLED)
                        s->n_cancelled++;
                else
                        s->n_completed++;
                break;
        case SCHED_EVENT_SNAPSHOT:
                s->n_completed++;
                break;
        case SCHED_EVENT_ERROR:
                if (e->cancelled)
                        s->n_cancelled++;
                else if (e->code == SCHED_ERR_INTERNAL)
                        s->n_failed++;
                else
                        s->n_refused++;
                break;
        default:
                break;
        }
}

void eng_push_event(struct sched *s, struct sched_event *e, bool final) {
        uint64_t one = 1;
        pthread_mutex_lock(&s->lock);
        if (s->ev_tail)
                s->ev_tail->next = e;
        else
                s->ev_head = e;
        s->ev_tail = e;
        if (final)
                for (size_t i = 0; i < s->n_live; i++)
                        if (s->live[i] == e->id) {
                                s->live[i] = s->live[--s->n_live];
                                count_end(s, e);
                                break;
                        }
        pthread_mutex_unlock(&s->lock);
        /* the counter only needs to become nonzero; a full counter (never here) is harmless */
        if (write(s->efd, &one, sizeof one) < 0 && errno != EAGAIN)
                log_warning("scheduler: eventfd write failed: %m");
}

struct sched_event *sched_pop_events(struct sched *s) {
        struct sched_event *e;
        pthread_mutex_lock(&s->lock);
        e = s->ev_head;
        s->ev_head = s->ev_tail = NULL;
        pthread_mutex_unlock(&s->lock);
        return e;
}

int sched_event_fd(const struct sched *s) {
        return s->efd;
}

/* ---- validation (any thread) ---------------------------------------------------------------- */

_printf_(4, 5) int eng_verr(char *err, size_t size, int code, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, size, fmt, ap);
        va_end(ap);
        return code;
}

#define CHECK_RANGE(has, v, cond, name, range)                                                     \
        do {                                                                                       \
                if ((has) && (!isfinite(v) || !(cond)))                                            \
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,                         \
                                    "sampling." name ": %g is out of range " range, (double) (v)); \
        } while (0)

int sched_validate(const struct sched *s, const struct sched_request *r, char *err, size_t size) {
        const struct sched_sampling *sp = &r->sampling;
        uint32_t n_vocab = s->cfg->n_vocab;

        CHECK_RANGE(sp->has_temperature, sp->temperature,
                    sp->temperature >= 0 && sp->temperature <= 100, "temperature", "[0, 100]");
        CHECK_RANGE(sp->has_top_p, sp->top_p, sp->top_p > 0 && sp->top_p <= 1, "top_p", "(0, 1]");
        CHECK_RANGE(sp->has_min_p, sp->min_p, sp->min_p >= 0 && sp->min_p < 1, "min_p", "[0, 1)");
        CHECK_RANGE(sp->has_repetition_penalty, sp->repetition_penalty,
                    sp->repetition_penalty > 0 && sp->repetition_penalty <= 10,
                    "repetition_penalty", "(0, 10]");
        CHECK_RANGE(sp->has_presence_penalty, sp->presence_penalty,
                    sp->presence_penalty >= -2 && sp->presence_penalty <= 2, "presence_penalty",
                    "[-2, 2]");
        CHECK_RANGE(sp->has_frequency_penalty, sp->frequency_penalty,
                    sp->frequency_penalty >= -2 && sp->frequency_penalty <= 2, "frequency_penalty",
                    "[-2, 2]");

        switch (r->prompt) {
        case SCHED_PROMPT_TOKENS:
                if (r->n_tokens == 0)
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "prompt.tokens: empty, at least one token id expected");
                for (uint32_t i = 0; i < r->n_tokens; i++)
                        if (r->tokens[i] < 0 || (uint32_t) r->tokens[i] >= n_vocab)
                                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                            "prompt.tokens[%u]: id %d is out of range [0, %u)", i,
                                            r->tokens[i], n_vocab);
                if (r->n_tokens >= s->ctx_limit)
                        return eng_verr(err, size, SCHED_ERR_TOO_LARGE,
                                    "prompt of %u tokens leaves no room for output in the context "
                                    "limit of %u tokens",
                                    r->n_tokens, s->ctx_limit);
                break;
        case SCHED_PROMPT_TEXT:
        case SCHED_PROMPT_CHAT:
                if (r->prompt == SCHED_PROMPT_TEXT && (!r->text || !r->text[0]))
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "prompt.text: empty, some text expected");
                if (r->prompt == SCHED_PROMPT_CHAT && r->n_messages > s->p.max_messages)
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "prompt.chat.messages: %zu messages, at most %u accepted",
                                    r->n_messages, s->p.max_messages);
                if (!s->p.tokenizer)
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "prompt.%s: this model has no tokenizer, send token ids",
                                    r->prompt == SCHED_PROMPT_TEXT ? "text" : "chat");
                {
                        uint64_t bytes = 0;
                        if (r->prompt == SCHED_PROMPT_TEXT && r->text)
                                bytes = strlen(r->text);
                        for (size_t i = 0; r->prompt == SCHED_PROMPT_CHAT && i < r->n_messages; i++) {
                                const struct sched_message *m = &r->messages[i];
                                bytes += (m->content ? strlen(m->content) : 0) +
                                         (m->reasoning ? strlen(m->reasoning) : 0) +
                                         (m->tool_calls_json ? strlen(m->tool_calls_json) : 0);
                        }
                        if (r->prompt == SCHED_PROMPT_CHAT && r->tools_json)
                                bytes += strlen(r->tools_json);
                        /* a count (count_only) tells how much too long: the frame limit bounds it */
                        if (bytes > s->max_prompt_bytes && !r->count_only)
                                return eng_verr(err, size, SCHED_ERR_TOO_LARGE,
                                            "prompt.%s: %llu bytes cannot fit the context limit of "
                                            "%u tokens (at most %llu bytes)",
                                            r->prompt == SCHED_PROMPT_TEXT ? "text" : "chat",
                                            (unsigned long long) bytes, s->ctx_limit,
                                            (unsigned long long) s->max_prompt_bytes);
                }
                if (r->prompt == SCHED_PROMPT_CHAT) {
                        if (r->n_messages == 0)
                                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                            "prompt.chat.messages: empty, at least one message "
                                            "expected");
                        for (size_t i = 0; i < r->n_messages; i++) {
                                const char *role = r->messages[i].role;
                                if (!streq(role, "system") && !streq(role, "user") &&
                                    !streq(role, "assistant") && !streq(role, "tool"))
                                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                                    "prompt.chat.messages[%zu].role: '%s', one of "
                                                    "system, user, assistant, tool expected",
                                                    i, role ? role : "");
                        }
                }
                break;
        default:
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "prompt: none given, text, tokens or chat expected");
        }
        if (r->has_max_tokens && r->max_tokens == 0 && !r->count_only)
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "max_tokens: 0, at least 1 expected");
        if (r->n_stop > s->p.max_stop)
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "stop: %zu strings, at most %u accepted", r->n_stop, s->p.max_stop);
        for (size_t i = 0; i < r->n_stop; i++) {
                size_t n = strlen(r->stop[i]);
                if (n == 0 || n > MAX_STOP_LEN)
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "stop[%zu]: %zu bytes, 1..%u expected", i, n, MAX_STOP_LEN);
        }
        for (size_t i = 0; i < r->n_stop_ids; i++)
                if (r->stop_ids[i] < 0 || (uint32_t) r->stop_ids[i] >= n_vocab)
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "stop_ids[%zu]: id %d is out of range [0, %u)", i,
                                    r->stop_ids[i], n_vocab);
        if (r->logprobs > MAX_LOGPROBS)
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "logprobs: %u, at most %u supported", r->logprobs, MAX_LOGPROBS);
        if (r->has_thinking_budget && r->thinking_budget < -1)
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "thinking_budget: %d, -1 (unlimited) or a token count expected",
                            r->thinking_budget);
        if (r->constraint != SCHED_CONSTRAINT_NONE && !r->count_only) { /* a count generates nothing */
                if (!s->p.tokenizer)
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "constraint: this model has no tokenizer, constrained decoding "
                                    "needs one");
                if (r->constraint_or_calls && r->constraint != SCHED_CONSTRAINT_JSON_OBJECT &&
                    r->constraint != SCHED_CONSTRAINT_JSON_SCHEMA)
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "constraint.or_tool_calls: an alternative to a JSON answer, set only with "
                                    "json_object or json_schema");
                if ((r->constraint == SCHED_CONSTRAINT_TOOL || r->constraint == SCHED_CONSTRAINT_TOOL_CALLS ||
                     r->constraint_or_calls) && r->prompt != SCHED_PROMPT_CHAT)
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "constraint.%s: a chat prompt with tools (prompt.chat.tools_json) "
                                    "expected", r->constraint == SCHED_CONSTRAINT_TOOL ? "tool" : "tool_calls");
                /* a schema nested deeper than the JSON parser reads may well be valid JSON: say
                 * it is too deep, not (as the grammar would) that it is not JSON */
                if (r->constraint == SCHED_CONSTRAINT_JSON_SCHEMA && r->constraint_schema) {
                        struct json_value *v = NULL;
                        char why[256];
                        int k = json_parse(r->constraint_schema, strlen(r->constraint_schema), "json_schema",
                                           &v, why, sizeof why);
                        json_free(v);
                        const char *at = strstr(why, "line ");
                        if (k == -E2BIG)
                                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                                "constraint.json_schema: too deeply nested for the daemon: its "
                                                "arrays and objects nest more than %d levels deep (%.*s), %d at "
                                                "most",
                                                JSON_DEPTH_MAX, at ? (int) strcspn(at, ":") : 0, at ? at : "",
                                                JSON_DEPTH_MAX);
                }
                /* compiled here for the error, again when the request is prepared */
                struct grammar *g = NULL;
                int k = grammar_compile_constraint_flags((enum grammar_kind) r->constraint, r->constraint_schema,
                                                         r->tools_json, r->constraint_tool, s->p.tokenizer,
                                                         (r->constraint_lenient ? GRAMMAR_LENIENT : 0) |
                                                                 (r->constraint_or_calls ? GRAMMAR_OR_TOOL_CALLS : 0),
                                                         &g, err,
                                                         size);
                grammar_free(g);
                /* tool_choice auto: tools the mask cannot hold leave their calls free, unless a
                 * tool asked to be held exactly (prepare_constraint says so in the log) */
                if (k == -EINVAL && r->constraint == SCHED_CONSTRAINT_TOOL_CALLS &&
                    grammar_tools_strict(r->tools_json) == 0) {
                        err[0] = 0;
                        k = 0;
                }
                if (k < 0)
                        return k == -ENOMEM ? SCHED_ERR_INTERNAL : SCHED_ERR_INVALID_ARGUMENT;
        }
        if (r->snapshot || r->snapshot_create) {
                const char *name = r->snapshot ? r->snapshot : r->snapshot_create;
                int code = sched_snapshot_check_name(name, err, size);
                if (code)
                        return code;
                if (!s->p.state_dir)
                        return eng_verr(err, size, SCHED_ERR_UNAVAILABLE,
                                    "snapshot '%s': this daemon has no state directory", name);
                /* before the prefill, so a refused create costs nothing; the final rename checks
                 * again (another create may have taken the name meanwhile) */
                if (r->snapshot_create && !r->snapshot_replace &&
                    (code = eng_snap_check_absent(s, name, err, size)))
                        return code;
        }
        return 0;
}

int sched_snapshot_check_name(const char *name, char *err, size_t size) {
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > 64 || name[0] == '.')
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot name '%s': 1 to 64 characters of A-Z a-z 0-9 . _ - expected, "
                            "not starting with '.'", name ? name : "");
        for (size_t i = 0; i < n; i++) {
                char c = name[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-'))
                        return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "snapshot name '%s': character %zu is not one of A-Z a-z 0-9 "
                                    ". _ -", name, i + 1);
        }
        return 0;
}

/* ---- submit / cancel (loop thread) ---------------------------------------------------------- */

int eng_grow(void **p, size_t *cap, size_t need, size_t elem) {
        if (need <= *cap)
                return 0;
        size_t n = MAX(*cap * 2, MAX(need, (size_t) 16));
        void *q = realloc(*p, n * elem);
        if (!q)
                return -ENOMEM;
        *p = q;
        *cap = n;
        return 0;
}

void sched_count_unsubmitted(struct sched *s, int code) {
        pthread_mutex_lock(&s->lock);
        s->n_total++;
        if (code == SCHED_ERR_INTERNAL)
                s->n_failed++;
        else
                s->n_refused++;
        pthread_mutex_unlock(&s->lock);
}

int sched_submit(struct sched *s, struct sched_request *r, uint64_t *ret_id) {
        struct job *j = calloc(1, sizeof *j);
        int ret = 0;

        if (!j) {
                sched_count_unsubmitted(s, SCHED_ERR_INTERNAL);
                return -ENOMEM;
        }
        j->snap_fd = j->snap_dfd = -1;
        pthread_mutex_lock(&s->lock);
        s->n_total++;
        if (s->draining)
                ret = -ESHUTDOWN;
        /* a count takes no slot: it is tokenized on the prep thread and answered */
        else if (s->n_live >= (size_t) s->p.max_running + s->p.max_waiting && !r->count_only)
                ret = -EAGAIN;
        else if (eng_grow((void **) &s->live, &s->cap_live, s->n_live + 1, sizeof *s->live) < 0)
                ret = -ENOMEM;
        if (ret == 0) {
                r->id = s->next_id++;
                s->live[s->n_live++] = r->id;
                if (ret_id)
                        *ret_id = r->id;
                j->r = r;
                j->t_submit = now_ms();
                if (s->in_tail)
                        s->in_tail->next = j;
                else
                        s->in_head = j;
                s->in_tail = j;
                pthread_cond_signal(&s->wake);
        } else if (ret == -ENOMEM)
                s->n_failed++;
        else {
                s->n_refused++;
                s->n_queue_full += ret == -EAGAIN;
        }
        pthread_mutex_unlock(&s->lock);
        if (ret < 0)
                free(j);
        return ret;
}

int sched_cancel(struct sched *s, uint64_t id) {
        int ret = -ENOENT;
        pthread_mutex_lock(&s->lock);
        for (size_t i = 0; i < s->n_live; i++)
                if (s->live[i] == id) {
                        ret = eng_grow((void **) &s->cancels, &s->cap_cancels, s->n_cancels + 1,
                                   sizeof *s->cancels);
                        if (ret == 0) {
                                s->cancels[s->n_cancels++] = id;
                                pthread_cond_signal(&s->wake);
                        }
                        break;
                }
        pthread_mutex_unlock(&s->lock);
        return ret;
}

int sched_pause(struct sched *s, uint64_t id, bool paused) {
        int ret = -ENOENT;
        pthread_mutex_lock(&s->lock);
        for (size_t i = 0; i < s->n_live; i++)
                if (s->live[i] == id) {
                        ret = eng_grow((void **) &s->pauses, &s->cap_pauses, s->n_pauses + 1,
                                   sizeof *s->pauses);
                        if (ret == 0) {
                                s->pauses[s->n_pauses++] = (struct pause_op){ id, paused };
                                pthread_cond_signal(&s->wake);
                        }
                        break;
                }
        pthread_mutex_unlock(&s->lock);
        return ret;
}

void sched_drain(struct sched *s, bool cancel_all) {
        pthread_mutex_lock(&s->lock);
        s->draining = true;
        if (cancel_all)
                for (size_t i = 0; i < s->n_live; i++)
                        if (eng_grow((void **) &s->cancels, &s->cap_cancels, s->n_cancels + 1,
                                 sizeof *s->cancels) == 0)
                                s->cancels[s->n_cancels++] = s->live[i];
        pthread_cond_signal(&s->wake);
        pthread_mutex_unlock(&s->lock);
}

uint32_t sched_in_flight(struct sched *s) {
        uint32_t n;
        pthread_mutex_lock(&s->lock);
        n = (uint32_t) s->n_live;
        pthread_mutex_unlock(&s->lock);
        return n;
}

uint32_t sched_context_limit(const struct sched *s) {
        return s->ctx_limit;
}

uint32_t sched_max_tokens_default(const struct sched *s) {
        return s->p.max_tokens_default;
}

uint32_t sched_max_running(const struct sched *s) {
        return s->p.max_running;
}

void sched_get_stats(struct sched *s, struct sched_stats *ret) {
        pthread_mutex_lock(&s->lock);
        *ret = s->stats;
        /* the request counters as of now (the rest is what the engine published last) */
        ret->total = s->n_total;
        ret->completed = s->n_completed;
        ret->failed = s->n_failed;
        ret->cancelled = s->n_cancelled;
        ret->refused = s->n_refused;
        ret->queue_full = s->n_queue_full;
        ret->in_flight = (uint32_t) s->n_live;
        pthread_mutex_unlock(&s->lock);
}

int sched_get_requests(struct sched *s, struct sched_request_state **ret, size_t *n) {
        int r = 0;
        pthread_mutex_lock(&s->lock);
        struct sched_request_state *a = malloc(MAX(s->n_states, (size_t) 1) * sizeof *a);
        if (!a)
                r = -ENOMEM;
        else {
                if (s->n_states)
                        memcpy(a, s->states, s->n_states * sizeof *a);
                double t = now_ms();
                /* ages are relative to now, stored as the submit time */
                for (size_t i = 0; i < s->n_states; i++)
                        a[i].age_ms = (uint64_t) MAX(0.0, t - (double) a[i].age_ms);
                *ret = a;
                *n = s->n_states;
        }
        pthread_mutex_unlock(&s->lock);
        return r;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

int sched_new(const struct sched_params *params, struct sched **ret) {
        struct sched *s = calloc(1, sizeof *s);
        int r;

        if (!s)
                return log_error_errno(ENOMEM, "scheduler: out of memory");
        s->p = *params;
        if (!s->p.max_running)
                s->p.max_running = 16;
        if (s->p.max_waiting == SCHED_NO_QUEUE)
                s->p.max_waiting = 0;
        else if (!s->p.max_waiting)
                s->p.max_waiting = 256;
        if (!s->p.max_tokens_default)
                s->p.max_tokens_default = 1024;
        if (!s->p.max_stop)
                s->p.max_stop = 16;
        if (!s->p.max_messages)
                s->p.max_messages = 4096;
        if (!s->p.max_snapshots)
                s->p.max_snapshots = 64;
        if (!s->p.max_snapshot_bytes)
                s->p.max_snapshot_bytes = (uint64_t) 64 << 30;
        if (!s->p.snapshot_chunk)
                s->p.snapshot_chunk = SNAP_CHUNK_BYTES;
        s->efd = -1;
        s->next_id = 1;
        s->cfg = x4_model_config(s->p.model);
        s->p.ops->caps(s->p.backend, &s->caps);
        /* unset: as many prompt tokens a step as one pass of the backend takes (CUDA: up to
         * 4,096 where the memory allows, so a long prompt alone prefills at x4-bench's rate; the
         * CPU's micro-batch of 256), within [SCHED_PREFILL_CHUNK_MIN, SCHED_PREFILL_CHUNK_MAX].
         * While others decode, prefill_budget keeps a step's prompt tokens far under it. */
        if (!s->p.prefill_chunk)
                s->p.prefill_chunk = MIN(MAX(s->caps.max_batch_tokens, SCHED_PREFILL_CHUNK_MIN),
                                         SCHED_PREFILL_CHUNK_MAX);
        /* MTP needs a backend created with it (the NextN layer in its pages) */
        s->p.mtp_draft = MIN(s->p.mtp_draft, SCHED_MTP_DRAFT_MAX);
        s->mtp = s->caps.mtp && s->p.mtp_draft > 0 && s->p.ops->nextn;
        /* tests: a drafter that is often right on a repetitive output (the random demo model's
         * NextN block almost never is), so accepted drafts are exercised end to end */
        const char *drafter = getenv("X4_MTP_TEST_DRAFTER");
        s->mtp_test_repeat = s->mtp && drafter && streq(drafter, "repeat");
        r = kvcache_new(s->caps.n_pages, s->caps.page_tokens, &s->kv);
        if (r < 0) {
                free(s);
                return r;
        }
        if (!s->p.prefix_off && prefix_new(s->kv, s->p.prefix_pages, s->caps.prompt_class, &s->prefix) < 0) {
                kvcache_free(s->kv);
                free(s);
                return -ENOMEM;
        }
        uint64_t cache_tokens = (uint64_t) s->caps.n_pages * s->caps.page_tokens;
        s->ctx_limit = (uint32_t) MIN(cache_tokens, (uint64_t) s->cfg->n_ctx_train);
        s->eos_id = s->cfg->eos_id;
        s->think_id = -1;
        size_t longest = 0;
        for (size_t i = 0; s->p.tokenizer && i < tokenizer_n_vocab(s->p.tokenizer); i++) {
                size_t len = 0;
                if (tokenizer_piece(s->p.tokenizer, (int32_t) i, &len))
                        longest = MAX(longest, len);
        }
        /* no pieces to measure: 64 bytes a token is more than any real vocabulary spells */
        s->max_prompt_bytes = (uint64_t) s->ctx_limit * (longest ? longest : 64);
        if (s->p.tokenizer) {
                static const enum tokenizer_special ends[] = {
                        TOKENIZER_SPECIAL_END, TOKENIZER_SPECIAL_USER, TOKENIZER_SPECIAL_BOT,
                        TOKENIZER_SPECIAL_SYSTEM, TOKENIZER_SPECIAL_START, TOKENIZER_SPECIAL_PAD,
                        TOKENIZER_SPECIAL_TOOL_RESPONSE, TOKENIZER_SPECIAL_END_TOOL_RESPONSE,
                };
                int32_t e = tokenizer_eos_id(s->p.tokenizer);
                if (e >= 0)
                        s->eos_id = e;
                s->think_id = MAX(tokenizer_special_id(s->p.tokenizer, TOKENIZER_SPECIAL_THINK), -1);
                const struct gguf_file *g = x4_model_gguf(s->p.model);
                const char *piece;
                if ((piece = tokenizer_piece(s->p.tokenizer, tokenizer_bos_id(s->p.tokenizer), NULL)))
                        s->bos_text = strdup(piece);
                if ((piece = tokenizer_piece(s->p.tokenizer, tokenizer_eos_id(s->p.tokenizer), NULL)))
                        s->eos_text = strdup(piece);
                if (gguf_kv_find(g, "tokenizer.chat_template")) {
                        struct gguf_string t;
                        char why[512] = "not a string"; /* gguf_get_string logged the details */
                        if (gguf_get_string(g, "tokenizer.chat_template", &t) < 0 ||
                            chat_template_parse_len(t.data, t.len, &s->tmpl, why, sizeof why) < 0) {
                                log_warning("tokenizer.chat_template unusable (%s): chat prompts "
                                            "use the built-in Xing4 template", why);
                                s->tmpl = NULL;
                        }
                }
                log_info("chat template: %s", s->tmpl ? "the model's tokenizer.chat_template"
                                                      : "built-in Xing4 (docs/model.md §7)");
                for (size_t i = 0; i < ELEMENTSOF(ends); i++) {
                        int32_t id = tokenizer_special_id(s->p.tokenizer, ends[i]);
                        if (id >= 0)
                                s->turn_end_ids[s->n_turn_end_ids++] = id;
                }
        }
        s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (s->efd < 0) {
                r = log_error_errno(errno, "scheduler: eventfd: %m");
                prefix_free(s->prefix);
                kvcache_free(s->kv);
                free(s);
                return r;
        }
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->wake, NULL);
        pthread_cond_init(&s->prep_wake, NULL);
        eng_publish_stats(s);
        *ret = s;
        return 0;
}

int sched_start(struct sched *s) {
        int r = pthread_create(&s->prep_thread, NULL, eng_prep_main, s);
        if (r != 0)
                return log_error_errno(r, "scheduler: cannot start the prep thread: %s", strerror(r));
        s->prep_started = true;
        r = pthread_create(&s->thread, NULL, eng_engine_main, s);
        if (r != 0)
                return log_error_errno(r, "scheduler: cannot start the engine thread: %s",
                                       strerror(r));
        s->started = true;
        return 0;
}

void sched_free(struct sched *s) {
        if (!s)
                return;
        if (s->started) {
                pthread_mutex_lock(&s->lock);
                s->quit = true;
                pthread_cond_signal(&s->wake);
                pthread_mutex_unlock(&s->lock);
                pthread_join(s->thread, NULL);
        }
        if (s->prep_started) {
                pthread_mutex_lock(&s->lock);
                s->quit = true;
                pthread_cond_signal(&s->prep_wake);
                pthread_mutex_unlock(&s->lock);
                pthread_join(s->prep_thread, NULL);
        }
        while (s->jobs) {
                struct job *j = s->jobs;
                s->jobs = j->next;
                eng_job_free(s, j);
        }
        while (s->in_head) {
                struct job *j = s->in_head;
                s->in_head = j->next;
                eng_job_free(s, j);
        }
        for (struct sched_event *e = s->ev_head, *next; e; e = next) {
                next = e->next;
                sched_event_free(e);
        }
        free(s->cancels);
        free(s->pauses);
        free(s->live);
        free(s->states);
        x4_host_free(s->p.ops, s->p.backend, s->logits); /* before the backend goes */
        x4_host_free(s->p.ops, s->p.backend, s->hidden);
        x4_host_free(s->p.ops, s->p.backend, s->mtp_logits);
        x4_host_free(s->p.ops, s->p.backend, s->mtp_hid);
        free(s->mtp_p);
        prefix_free(s->prefix);
        kvcache_free(s->kv);
        grammar_vocab_free(s->gvocab);
        chat_template_free(s->tmpl);
        free(s->bos_text);
        free(s->eos_text);
        if (s->efd >= 0)
                close(s->efd);
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->wake);
        pthread_cond_destroy(&s->prep_wake);
        free(s);
}

