/* SPDX-License-Identifier: MIT */
/* The engine thread. One iteration:
 *   1. take new requests and cancels from the loop thread (one mutex);
 *   2. finish cancelled requests (their pages go back at once);
 *   3. admit waiting requests in FIFO order while cache pages and running slots allow; each
 *      reserves the pages for prompt + max output up front, so it never waits mid-generation;
 *   4. one backend forward: one decode token of every running request + one prefill chunk of the
 *      oldest request still prefilling (continuous batching, docs/design.md "Threads and flow");
 *   5. sample, detokenize, split channels, check stops, push events, wake the loop thread.
 * No socket I/O here; the loop thread is woken through an eventfd. */
#include "scheduler.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../kernels/backend.h"
#include "engine/grammar.h"
#include "engine/kvcache.h"
#include "engine/prefix.h"
#include "engine/sampler.h"
#include "chat/chat.h"
#include "chat/chat_xing4.h"
#include "gguf/gguf.h"
#include "chat/outparse.h"
#include "chat/tokenizer.h"
#include "model/xing4.h"
#include "common/json.h"
#include "common/log.h"

#define MAX_LOGPROBS 20u
#define MAX_STOP_LEN 256u

enum job_state {
        JOB_WAITING,
        JOB_PREFILL,
        JOB_DECODE,
        JOB_SAVING, /* a snapshot's pages copied out; the prep thread writes the file */
};

struct job {
        struct job *next;
        struct sched_request *r;
        enum job_state state;
        bool prepared, cancel, paused;
        int32_t *seq; /* prompt + output */
        uint32_t n_seq, n_prompt, n_cached, max_tokens, n_out;
        uint32_t n_reused; /* prompt tokens whose pages came from the prefix store */
        uint32_t *pages;
        uint32_t n_pages;  /* pages held: taken as the sequence grows */
        uint32_t n_fill;   /* positions to cache before decoding (the prompt; after a preemption,
                            * the sequence but its last token) */
        uint32_t plan;     /* prompt tokens this step computes */
        uint64_t admit_seq; /* admission order (the latest admitted is preempted first) */
        uint32_t preempted; /* times it was preempted */
        double t_progress;  /* last PROGRESS event */
        /* preparation on the prep thread: while prep_queued, the engine thread leaves every
         * field prepare() writes alone */
        struct job *prep_next;
        bool prep_queued;
        int prep_code;      /* prepare() (or the snapshot write) failed: the error to report */
        char *prep_msg;
        struct sched_snapshot_info saved; /* JOB_SAVING: what was written */
        struct sampler *sampler; /* engine/sampler: penalties, truncation, seeded draws */
        struct tokenizer_stream *ts;
        struct outparse *op; /* channels, tool calls, stops (NULL without a tokenizer) */
        struct sched *s;
        bool force_end_think, tool_call_seen, op_stopped;
        int op_finish;
        char *op_stop_string;
        /* the token being fed to outparse: attached to the first chunk it produces */
        int32_t cur_tok;
        struct sched_logprob *cur_lp;
        bool cur_sent;
        double t_submit, t_admit, t_first, t_last;
        /* snapshots: resume (pages loaded at prepare, written into the cache at admission) */
        uint32_t snap_n;      /* tokens the snapshot holds: cached at admission */
        uint8_t *snap_data;   /* snap_pages pages of page_bytes */
        uint32_t snap_pages;
        /* snapshot creation: the file is written by the prep thread in chunks of at most
         * SNAP_CHUNK_BYTES copied out of the cache by the engine thread, one chunk in flight */
        int snap_fd, snap_dfd;    /* the .tmp file and the state directory (-1: not open) */
        uint32_t snap_written;    /* pages in the file so far */
        uint32_t snap_chunk;      /* pages in snap_data for the prep thread to append */
        bool create;          /* r->snapshot_create: prefill only, then save */
        bool thinking;        /* the prompt ends inside <think> */
        /* constrained decoding (engine/grammar.h): the mask is on from the start, or from the
         * end of the reasoning when the output starts in it */
        struct grammar *grammar;
        struct grammar_matcher *gm;
        uint64_t *gmask;
        bool gm_on;
};

struct sched {
        struct sched_params p;
        const struct x4_config *cfg;
        struct grammar_vocab *gvocab; /* token trie for constrained decoding, built on first use */
        struct kvcache *kv;
        struct prefix_store *prefix; /* NULL: prefix reuse off */
        struct x4_backend_caps caps;
        uint32_t ctx_limit;
        /* prompt text bytes that could still fit the context: ctx_limit × the longest piece
         * (a piece never stands for more bytes than it spells), refused before tokenizing so a
         * client cannot keep the engine thread busy tokenizing megabytes that cannot fit */
        uint64_t max_prompt_bytes;
        int32_t eos_id, think_id;
        struct chat_template *tmpl; /* the GGUF's tokenizer.chat_template, NULL: built-in */
        char *bos_text, *eos_text;
        int32_t turn_end_ids[8]; /* specials that end a turn (outparse.h), ignored by ignore_eos */
        size_t n_turn_end_ids;
        int efd;
        pthread_t thread;
        bool started;
        pthread_t prep_thread; /* tokenizing, rendering, snapshot reads (prep_main) */
        bool prep_started;

        pthread_mutex_t lock;
        pthread_cond_t wake;
        /* guarded by lock */
        bool quit, draining;
        struct job *in_head, *in_tail;
        struct job *prep_head, *prep_tail; /* for the prep thread, in order */
        struct job *prepped;               /* back from it (any order; flags only) */
        pthread_cond_t prep_wake;
        uint64_t *cancels;
        size_t n_cancels, cap_cancels;
        struct pause_op { uint64_t id; bool paused; } *pauses;
        size_t n_pauses, cap_pauses;
        uint64_t *live; /* ids submitted whose final event is not pushed yet */
        size_t n_live, cap_live;
        struct sched_event *ev_head, *ev_tail;
        uint64_t next_id;
        struct sched_stats stats;
        struct sched_request_state *states;
        size_t n_states;

        /* engine thread only */
        struct job *jobs; /* waiting and running, FIFO */
        float *logits;
        size_t logits_cap;
        uint64_t total, failed, cancelled, prompt_total, completion_total;
        double prefill_rate, decode_rate;
        uint64_t steps, steps_multi; /* forwards; those holding more than one request */
        uint32_t batch_max;          /* most requests in one forward */
        uint64_t admit_counter, preemptions;
        double decode_step_ms; /* a step without prefill (moving average) */
        double prefill_tok_ms; /* a prompt token's cost within a step (moving average) */
};

static double now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- requests and events -------------------------------------------------------------------- */

void sched_request_free(struct sched_request *r) {
        if (!r)
                return;
        free(r->tokens);
        free(r->text);
        for (size_t i = 0; i < r->n_messages; i++) {
                free(r->messages[i].role);
                free(r->messages[i].content);
                free(r->messages[i].reasoning);
                free(r->messages[i].tool_calls_json);
                free(r->messages[i].name);
        }
        free(r->messages);
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

static void logprob_free(struct sched_logprob *lp) {
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

static void push_event(struct sched *s, struct sched_event *e, bool final) {
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

_printf_(4, 5) static int verr(char *err, size_t size, int code, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, size, fmt, ap);
        va_end(ap);
        return code;
}

#define CHECK_RANGE(has, v, cond, name, range)                                                     \
        do {                                                                                       \
                if ((has) && (!isfinite(v) || !(cond)))                                            \
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,                         \
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
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "prompt.tokens: empty, at least one token id expected");
                for (uint32_t i = 0; i < r->n_tokens; i++)
                        if (r->tokens[i] < 0 || (uint32_t) r->tokens[i] >= n_vocab)
                                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                            "prompt.tokens[%u]: id %d is out of range [0, %u)", i,
                                            r->tokens[i], n_vocab);
                if (r->n_tokens >= s->ctx_limit)
                        return verr(err, size, SCHED_ERR_TOO_LARGE,
                                    "prompt of %u tokens leaves no room for output in the context "
                                    "limit of %u tokens",
                                    r->n_tokens, s->ctx_limit);
                break;
        case SCHED_PROMPT_TEXT:
        case SCHED_PROMPT_CHAT:
                if (r->prompt == SCHED_PROMPT_TEXT && (!r->text || !r->text[0]))
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "prompt.text: empty, some text expected");
                if (r->prompt == SCHED_PROMPT_CHAT && r->n_messages > s->p.max_messages)
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "prompt.chat.messages: %zu messages, at most %u accepted",
                                    r->n_messages, s->p.max_messages);
                if (!s->p.tokenizer)
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
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
                        if (bytes > s->max_prompt_bytes)
                                return verr(err, size, SCHED_ERR_TOO_LARGE,
                                            "prompt.%s: %llu bytes cannot fit the context limit of "
                                            "%u tokens (at most %llu bytes)",
                                            r->prompt == SCHED_PROMPT_TEXT ? "text" : "chat",
                                            (unsigned long long) bytes, s->ctx_limit,
                                            (unsigned long long) s->max_prompt_bytes);
                }
                if (r->prompt == SCHED_PROMPT_CHAT) {
                        if (r->n_messages == 0)
                                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                            "prompt.chat.messages: empty, at least one message "
                                            "expected");
                        for (size_t i = 0; i < r->n_messages; i++) {
                                const char *role = r->messages[i].role;
                                if (!streq(role, "system") && !streq(role, "user") &&
                                    !streq(role, "assistant") && !streq(role, "tool"))
                                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                                    "prompt.chat.messages[%zu].role: '%s', one of "
                                                    "system, user, assistant, tool expected",
                                                    i, role ? role : "");
                        }
                }
                break;
        default:
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "prompt: none given, text, tokens or chat expected");
        }
        if (r->has_max_tokens && r->max_tokens == 0)
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "max_tokens: 0, at least 1 expected");
        if (r->n_stop > s->p.max_stop)
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "stop: %zu strings, at most %u accepted", r->n_stop, s->p.max_stop);
        for (size_t i = 0; i < r->n_stop; i++) {
                size_t n = strlen(r->stop[i]);
                if (n == 0 || n > MAX_STOP_LEN)
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "stop[%zu]: %zu bytes, 1..%u expected", i, n, MAX_STOP_LEN);
        }
        for (size_t i = 0; i < r->n_stop_ids; i++)
                if (r->stop_ids[i] < 0 || (uint32_t) r->stop_ids[i] >= n_vocab)
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "stop_ids[%zu]: id %d is out of range [0, %u)", i,
                                    r->stop_ids[i], n_vocab);
        if (r->logprobs > MAX_LOGPROBS)
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "logprobs: %u, at most %u supported", r->logprobs, MAX_LOGPROBS);
        if (r->has_thinking_budget && r->thinking_budget < -1)
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "thinking_budget: %d, -1 (unlimited) or a token count expected",
                            r->thinking_budget);
        if (r->constraint != SCHED_CONSTRAINT_NONE) {
                if (!s->p.tokenizer)
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "constraint: this model has no tokenizer, constrained decoding "
                                    "needs one");
                if (r->constraint == SCHED_CONSTRAINT_TOOL && r->prompt != SCHED_PROMPT_CHAT)
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "constraint.tool: a chat prompt with tools (prompt.chat.tools_json) "
                                    "expected");
                /* compiled here for the error, again when the request is prepared */
                struct grammar *g = NULL;
                int k = grammar_compile_constraint((enum grammar_kind) r->constraint, r->constraint_schema,
                                                   r->tools_json, r->constraint_tool, s->p.tokenizer,
                                                   &g, err, size);
                grammar_free(g);
                if (k < 0)
                        return k == -ENOMEM ? SCHED_ERR_INTERNAL : SCHED_ERR_INVALID_ARGUMENT;
        }
        if (r->snapshot || r->snapshot_create) {
                const char *name = r->snapshot ? r->snapshot : r->snapshot_create;
                int code = sched_snapshot_check_name(name, err, size);
                if (code)
                        return code;
                if (!s->p.state_dir)
                        return verr(err, size, SCHED_ERR_UNAVAILABLE,
                                    "snapshot '%s': this daemon has no state directory", name);
        }
        return 0;
}

int sched_snapshot_check_name(const char *name, char *err, size_t size) {
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > 64 || name[0] == '.')
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot name '%s': 1 to 64 characters of A-Z a-z 0-9 . _ - expected, "
                            "not starting with '.'", name ? name : "");
        for (size_t i = 0; i < n; i++) {
                char c = name[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-'))
                        return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                    "snapshot name '%s': character %zu is not one of A-Z a-z 0-9 "
                                    ". _ -", name, i + 1);
        }
        return 0;
}

/* ---- submit / cancel (loop thread) ---------------------------------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
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

int sched_submit(struct sched *s, struct sched_request *r, uint64_t *ret_id) {
        struct job *j = calloc(1, sizeof *j);
        int ret = 0;

        if (!j)
                return -ENOMEM;
        j->snap_fd = j->snap_dfd = -1;
        pthread_mutex_lock(&s->lock);
        if (s->draining)
                ret = -ESHUTDOWN;
        else if (s->n_live >= (size_t) s->p.max_running + s->p.max_waiting)
                ret = -EAGAIN;
        else if (grow((void **) &s->live, &s->cap_live, s->n_live + 1, sizeof *s->live) < 0)
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
                        ret = grow((void **) &s->cancels, &s->cap_cancels, s->n_cancels + 1,
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
                        ret = grow((void **) &s->pauses, &s->cap_pauses, s->n_pauses + 1,
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
                        if (grow((void **) &s->cancels, &s->cap_cancels, s->n_cancels + 1,
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

/* ---- jobs (engine thread) ------------------------------------------------------------------- */

static void publish_stats(struct sched *s);

/* Give the pages back and make the stats say so BEFORE the final event is pushed: a client that
 * asks for stats right after its Done sees its pages free. */
static void job_release(struct sched *s, struct job *j) {
        if (j->n_pages && s->prefix && j->seq && j->n_cached)
                /* positions [0, n_cached) are in the cache: keep their full pages for reuse */
                (void) prefix_insert(s->prefix, j->seq, MIN(j->n_cached, j->n_seq), j->pages,
                                     j->n_pages);
        if (j->n_pages)
                (void) kvcache_release(s->kv, j->pages, j->n_pages);
        j->n_pages = 0;
        publish_stats(s);
}

static void snap_abandon(struct job *j);

static void job_free(struct sched *s, struct job *j) {
        snap_abandon(j);
        if (j->n_pages)
                (void) kvcache_release(s->kv, j->pages, j->n_pages);
        free(j->pages);
        free(j->seq);
        sampler_free(j->sampler);
        outparse_free(j->op);
        free(j->op_stop_string);
        free(j->snap_data);
        free(j->prep_msg);
        logprob_free(j->cur_lp);
        tokenizer_stream_free(j->ts);
        grammar_matcher_free(j->gm);
        grammar_free(j->grammar);
        free(j->gmask);
        sched_request_free(j->r);
        free(j);
}

static void unlink_job(struct sched *s, struct job *j) {
        for (struct job **l = &s->jobs; *l; l = &(*l)->next)
                if (*l == j) {
                        *l = j->next;
                        return;
                }
}

static void fail_job(struct sched *s, struct job *j, int code, const char *fmt, ...) _printf_(4, 5);
static void fail_job(struct sched *s, struct job *j, int code, const char *fmt, ...) {
        struct sched_event *e = calloc(1, sizeof *e);
        char buf[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        unlink_job(s, j);
        s->failed++;
        job_release(s, j);
        if (e) {
                e->kind = SCHED_EVENT_ERROR;
                e->cookie = j->r->cookie;
                e->id = j->r->id;
                e->code = code;
                e->message = strdup(buf);
                push_event(s, e, true);
        } else
                log_error("scheduler: out of memory reporting the failure of request %llu: %s",
                          (unsigned long long) j->r->id, buf);
        job_free(s, j);
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
        push_event(s, e, false);
        return;
oom:
        logprob_free(lp);
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
static int on_outparse(const struct outparse_event *ev, void *userdata) {
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

static void finish_job(struct sched *s, struct job *j, int reason, const char *stop) {
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
        unlink_job(s, j);
        if (reason == SCHED_FINISH_CANCELLED)
                s->cancelled++;
        s->completion_total += j->n_out;
        job_release(s, j);
        e = calloc(1, sizeof *e);
        if (!e) {
                log_error("scheduler: out of memory ending request %llu",
                          (unsigned long long) j->r->id);
                job_free(s, j);
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
        double admit = j->t_admit ? j->t_admit : t;
        e->queue_ms = admit - j->t_submit;
        e->prefill_ms = j->t_first ? j->t_first - admit : 0;
        e->decode_ms = j->t_first ? j->t_last - j->t_first : 0;
        e->total_ms = t - j->t_submit;
        push_event(s, e, true);
        job_free(s, j);
}

/* ---- snapshot files ------------------------------------------------------------------------ */

/* state_dir/NAME.x4snap: this header, the token ids, then the cache pages as the backend's
 * page_read() gives them. Native byte order: a snapshot belongs to the daemon build and model
 * (fingerprint) that wrote it. */
#define SNAP_MAGIC "X4SNAP1\n"
struct snap_header {
        char magic[8];
        uint32_t version;
        uint32_t page_tokens;
        uint64_t page_bytes;
        uint32_t n_tokens;
        uint32_t n_pages;
        uint64_t created_unix;
        char fingerprint[64];
};

static void snap_path(const struct sched *s, const char *name, char *buf, size_t size,
                      const char *suffix) {
        snprintf(buf, size, "%s/%s.x4snap%s", s->p.state_dir, name, suffix);
}

static int read_full(int fd, void *buf, size_t n) {
        uint8_t *p = buf;
        while (n > 0) {
                ssize_t r = read(fd, p, n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return r < 0 ? -errno : -EIO;
                p += r;
                n -= (size_t) r;
        }
        return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
        const uint8_t *p = buf;
        while (n > 0) {
                ssize_t r = write(fd, p, n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0)
                        return -errno;
                p += r;
                n -= (size_t) r;
        }
        return 0;
}

/* Read and check a header; code + message on failure. */
/* The state directory, opened once per operation: every file of the operation is then opened,
 * renamed and unlinked relative to it (openat & co), so the directory cannot be swapped for
 * another in the middle of an operation. */
static int snap_dir_open(const struct sched *s, int *ret, char *err, size_t size) {
        int dfd = open(s->p.state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return errno == ENOENT ? SCHED_ERR_NOT_FOUND
                                       : verr(err, size, SCHED_ERR_INTERNAL, "state directory %s: %s",
                                              s->p.state_dir, strerror(errno));
        *ret = dfd;
        return 0;
}

static int snap_open(const struct sched *s, int dfd, const char *name, struct snap_header *h,
                     int *ret_fd, char *err, size_t size) {
        char path[4096], file[96];
        snap_path(s, name, path, sizeof path, "");
        snprintf(file, sizeof file, "%s.x4snap", name);
        int own = -1;
        if (dfd < 0) {
                int code = snap_dir_open(s, &own, err, size);
                if (code == SCHED_ERR_NOT_FOUND)
                        return verr(err, size, SCHED_ERR_NOT_FOUND, "snapshot '%s': not found in %s",
                                    name, s->p.state_dir);
                if (code)
                        return code;
                dfd = own;
        }
        /* O_NOFOLLOW: a symlink planted at NAME.x4snap must not make the daemon read (or, for
         * drop, judge) a file elsewhere with its privileges; O_NONBLOCK: nor hang on a FIFO */
        int fd = openat(dfd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (own >= 0) {
                int e = errno;
                close(own);
                errno = e;
        }
        if (fd < 0)
                return errno == ENOENT ? verr(err, size, SCHED_ERR_NOT_FOUND,
                                              "snapshot '%s': not found in %s", name, s->p.state_dir)
                       : errno == ELOOP ? verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                              "snapshot %s: a symbolic link, not followed", path)
                                        : verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s",
                                               path, strerror(errno));
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                close(fd);
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot %s: not a regular file", path);
        }
        if (read_full(fd, h, sizeof *h) < 0 || memcmp(h->magic, SNAP_MAGIC, 8) != 0 ||
            h->version != 1) {
                close(fd);
                return verr(err, size, SCHED_ERR_INTERNAL,
                            "snapshot %s: not a version 1 xing4d snapshot file", path);
        }
        h->fingerprint[sizeof h->fingerprint - 1] = 0;
        *ret_fd = fd;
        return 0;
}

/* Load a snapshot for resuming into j: its tokens become the start of j's sequence. */
static int snap_load(struct sched *s, struct job *j, int32_t **ret_tokens, char *err, size_t size) {
        const char *name = j->r->snapshot;
        struct snap_header h;
        int fd, code;
        size_t pb = s->p.ops->page_bytes(s->p.backend);

        code = snap_open(s, -1, name, &h, &fd, err, size);
        if (code)
                return code;
        if (strcmp(h.fingerprint, x4_model_fingerprint(s->p.model)) != 0) {
                close(fd);
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot '%s': made with model %s, this daemon serves %s", name,
                            h.fingerprint, x4_model_fingerprint(s->p.model));
        }
        if (h.page_tokens != kvcache_page_tokens(s->kv) || h.page_bytes != pb) {
                close(fd);
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot '%s': pages of %u tokens / %llu bytes, this cache has %u / %zu",
                            name, h.page_tokens, (unsigned long long) h.page_bytes,
                            kvcache_page_tokens(s->kv), pb);
        }
        if (h.n_tokens == 0 || h.n_pages != kvcache_pages_for(s->kv, h.n_tokens) ||
            h.n_tokens >= s->ctx_limit) {
                close(fd);
                return verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot '%s': %u tokens in %u pages does not fit this cache", name,
                            h.n_tokens, h.n_pages);
        }
        int32_t *tokens = malloc((size_t) h.n_tokens * sizeof *tokens);
        uint8_t *data = malloc((size_t) h.n_pages * pb);
        if (!tokens || !data || read_full(fd, tokens, (size_t) h.n_tokens * sizeof *tokens) < 0 ||
            read_full(fd, data, (size_t) h.n_pages * pb) < 0) {
                free(tokens);
                free(data);
                close(fd);
                return verr(err, size, SCHED_ERR_INTERNAL, "snapshot '%s': truncated or unreadable",
                            name);
        }
        close(fd);
        j->snap_n = h.n_tokens;
        j->snap_data = data;
        j->snap_pages = h.n_pages;
        *ret_tokens = tokens;
        return 0;
}

/* Snapshots are written on behalf of any client that can connect: a count and a byte quota keep
 * them from filling the disk. Replacing a snapshot of the same name counts its old size out. */
static int snap_check_quota(const struct sched *s, const char *name, uint64_t bytes, char *err,
                            size_t size) {
        struct sched_snapshot_info *a = NULL;
        size_t n = 0, count = 0;
        uint64_t total = 0;
        int code = sched_snapshot_list(s, &a, &n, err, size);
        if (code)
                return code;
        for (size_t i = 0; i < n; i++) {
                if (streq(a[i].name, name))
                        continue;
                count++;
                total += a[i].bytes;
        }
        free(a);
        if (count + 1 > s->p.max_snapshots)
                return verr(err, size, SCHED_ERR_RESOURCE_EXHAUSTED,
                            "snapshot '%s': %zu snapshots exist, limit %u (max-snapshots): drop one "
                            "first", name, count, s->p.max_snapshots);
        if (total + bytes > s->p.max_snapshot_bytes)
                return verr(err, size, SCHED_ERR_RESOURCE_EXHAUSTED,
                            "snapshot '%s': %llu bytes more would bring the snapshots to %llu bytes, "
                            "limit %llu (max-snapshot-bytes)", name, (unsigned long long) bytes,
                            (unsigned long long) (total + bytes),
                            (unsigned long long) s->p.max_snapshot_bytes);
        return 0;
}

/* j (a create job) has prefilled its whole prompt: write its pages. */
static void snap_tmpfile(const struct job *j, char *buf, size_t size) {
        snprintf(buf, size, "%s.x4snap.tmp", j->r->snapshot_create);
}

/* A half-written snapshot file (an error, a cancel at shutdown): closed and its .tmp unlinked. */
static void snap_abandon(struct job *j) {
        char tmpfile[100];

        if (j->snap_fd < 0)
                return;
        close(j->snap_fd);
        snap_tmpfile(j, tmpfile, sizeof tmpfile);
        (void) unlinkat(j->snap_dfd, tmpfile, 0);
        close(j->snap_dfd);
        j->snap_fd = j->snap_dfd = -1;
}

/* Open NAME.x4snap.tmp and write the header and the tokens (prep thread). */
static int snap_begin(struct sched *s, struct job *j, char *err, size_t size) {
        char tmp[4096], tmpfile[100];
        size_t pb = s->p.ops->page_bytes(s->p.backend);
        uint32_t n_pages = kvcache_pages_for(s->kv, j->n_prompt);
        struct snap_header h = { .version = 1, .page_tokens = kvcache_page_tokens(s->kv),
                                 .page_bytes = pb, .n_tokens = j->n_prompt, .n_pages = n_pages,
                                 .created_unix = (uint64_t) time(NULL) };
        const char *name = j->r->snapshot_create;

        memcpy(h.magic, SNAP_MAGIC, 8);
        snprintf(h.fingerprint, sizeof h.fingerprint, "%s", x4_model_fingerprint(s->p.model));
        snap_path(s, name, tmp, sizeof tmp, ".tmp");
        snap_tmpfile(j, tmpfile, sizeof tmpfile);
        uint64_t bytes = sizeof h + (uint64_t) j->n_prompt * sizeof *j->seq + (uint64_t) n_pages * pb;
        int code = snap_check_quota(s, name, bytes, err, size);
        if (code)
                return code;
        int dfd;
        code = snap_dir_open(s, &dfd, err, size);
        if (code == SCHED_ERR_NOT_FOUND)
                return verr(err, size, SCHED_ERR_INTERNAL, "state directory %s: %s",
                            s->p.state_dir, strerror(ENOENT));
        if (code)
                return code;
        /* O_EXCL | O_NOFOLLOW: never write through a file or symlink someone put at the tmp
         * name; a stale tmp of ours (a crash mid-write) is unlinked (the link, not its target) */
        int fd = openat(dfd, tmpfile, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
        if (fd < 0 && errno == EEXIST && unlinkat(dfd, tmpfile, 0) == 0)
                fd = openat(dfd, tmpfile, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
        if (fd < 0) {
                int e = errno;
                close(dfd);
                return verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", tmp, strerror(e));
        }
        j->snap_fd = fd;
        j->snap_dfd = dfd;
        j->snap_written = 0;
        int r = write_full(fd, &h, sizeof h);
        if (r >= 0)
                r = write_full(fd, j->seq, (size_t) j->n_prompt * sizeof *j->seq);
        if (r < 0) {
                snap_abandon(j);
                return verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", tmp, strerror(-r));
        }
        return 0;
}

/* Append the chunk in snap_data; after the last page, close the file and rename it into place,
 * filling j->saved (prep thread). */
static int snap_write_chunk(struct sched *s, struct job *j, char *err, size_t size) {
        char path[4096], file[96], tmpfile[100];
        size_t pb = s->p.ops->page_bytes(s->p.backend);
        uint32_t n_pages = kvcache_pages_for(s->kv, j->n_prompt);
        const char *name = j->r->snapshot_create;
        int code, r;

        if (j->snap_fd < 0 && (code = snap_begin(s, j, err, size)))
                return code;
        snap_path(s, name, path, sizeof path, "");
        r = write_full(j->snap_fd, j->snap_data, (size_t) j->snap_chunk * pb);
        if (r < 0) {
                snap_abandon(j);
                return verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", path, strerror(-r));
        }
        j->snap_written += j->snap_chunk;
        if (j->snap_written < n_pages)
                return 0;
        snprintf(file, sizeof file, "%s.x4snap", name);
        snap_tmpfile(j, tmpfile, sizeof tmpfile);
        r = close(j->snap_fd) < 0 ? -errno : 0;
        j->snap_fd = -1;
        /* rename replaces whatever is at NAME.x4snap, a planted symlink included, never its
         * target */
        if (r >= 0 && renameat(j->snap_dfd, tmpfile, j->snap_dfd, file) < 0)
                r = -errno;
        if (r < 0)
                (void) unlinkat(j->snap_dfd, tmpfile, 0);
        close(j->snap_dfd);
        j->snap_dfd = -1;
        if (r < 0)
                return verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", path, strerror(-r));
        memset(&j->saved, 0, sizeof j->saved);
        snprintf(j->saved.name, sizeof j->saved.name, "%s", name);
        j->saved.n_tokens = j->n_prompt;
        j->saved.bytes = sizeof(struct snap_header) + (uint64_t) j->n_prompt * sizeof *j->seq +
                         (uint64_t) n_pages * pb;
        j->saved.created_unix = (uint64_t) time(NULL);
        return 0;
}

int sched_snapshot_list(const struct sched *s, struct sched_snapshot_info **ret, size_t *n,
                        char *err, size_t size) {
        struct sched_snapshot_info *a = NULL;
        size_t k = 0, cap = 0;

        if (!s->p.state_dir)
                return verr(err, size, SCHED_ERR_UNAVAILABLE, "this daemon has no state directory");
        DIR *d = opendir(s->p.state_dir);
        if (!d) {
                if (errno == ENOENT) {
                        *ret = calloc(1, sizeof **ret);
                        *n = 0;
                        return *ret ? 0 : verr(err, size, SCHED_ERR_INTERNAL, "out of memory");
                }
                return verr(err, size, SCHED_ERR_INTERNAL, "%s: %s", s->p.state_dir, strerror(errno));
        }
        for (struct dirent *de; (de = readdir(d));) {
                size_t len = strlen(de->d_name);
                char name[72], e2[8];
                struct snap_header h;
                int fd;
                struct stat st;
                if (len <= 7 || strcmp(de->d_name + len - 7, ".x4snap") != 0 || len - 7 >= sizeof name)
                        continue;
                memcpy(name, de->d_name, len - 7);
                name[len - 7] = 0;
                if (sched_snapshot_check_name(name, e2, sizeof e2) != 0 ||
                    snap_open(s, dirfd(d), name, &h, &fd, e2, sizeof e2) != 0)
                        continue;
                if (fstat(fd, &st) < 0)
                        st.st_size = 0;
                close(fd);
                if (grow((void **) &a, &cap, k + 1, sizeof *a) < 0) {
                        closedir(d);
                        free(a);
                        return verr(err, size, SCHED_ERR_INTERNAL, "out of memory");
                }
                memset(&a[k], 0, sizeof a[k]);
                snprintf(a[k].name, sizeof a[k].name, "%s", name);
                a[k].n_tokens = h.n_tokens;
                a[k].bytes = (uint64_t) st.st_size;
                a[k].created_unix = h.created_unix;
                k++;
        }
        closedir(d);
        if (!a && !(a = calloc(1, sizeof *a)))
                return verr(err, size, SCHED_ERR_INTERNAL, "out of memory");
        *ret = a;
        *n = k;
        return 0;
}

int sched_snapshot_drop(const struct sched *s, const char *name, struct sched_snapshot_info *ret,
                        char *err, size_t size) {
        struct snap_header h;
        struct stat st;
        char path[4096];
        int fd, code;

        code = sched_snapshot_check_name(name, err, size);
        if (code)
                return code;
        if (!s->p.state_dir)
                return verr(err, size, SCHED_ERR_UNAVAILABLE, "this daemon has no state directory");
        int dfd;
        code = snap_dir_open(s, &dfd, err, size);
        if (code == SCHED_ERR_NOT_FOUND)
                return verr(err, size, SCHED_ERR_NOT_FOUND, "snapshot '%s': not found in %s", name,
                            s->p.state_dir);
        if (code)
                return code;
        code = snap_open(s, dfd, name, &h, &fd, err, size);
        if (code) {
                close(dfd);
                return code;
        }
        if (fstat(fd, &st) < 0)
                st.st_size = 0;
        close(fd);
        snap_path(s, name, path, sizeof path, "");
        char file[96];
        snprintf(file, sizeof file, "%s.x4snap", name);
        int u = unlinkat(dfd, file, 0) < 0 ? errno : 0;
        close(dfd);
        if (u)
                return verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", path, strerror(u));
        memset(ret, 0, sizeof *ret);
        snprintf(ret->name, sizeof ret->name, "%s", name);
        ret->n_tokens = h.n_tokens;
        ret->bytes = (uint64_t) st.st_size;
        ret->created_unix = h.created_unix;
        return 0;
}

/* The last `<think>` among the prompt's final tokens, followed only by whitespace. */
static bool prompt_ends_in_think(const struct sched *s, const int32_t *ids, size_t n) {
        if (s->think_id < 0 || !s->p.tokenizer)
                return false;
        for (size_t k = n; k > 0 && k + 4 > n; k--) {
                if (ids[k - 1] != s->think_id)
                        continue;
                _cleanup_free_ char *tail = NULL;
                size_t len = 0;
                if (tokenizer_decode(s->p.tokenizer, ids + k, n - k, 0, &tail, &len) < 0)
                        return false;
                for (size_t i = 0; i < len; i++)
                        if (tail[i] != ' ' && tail[i] != '\n' && tail[i] != '\r' && tail[i] != '\t')
                                return false;
                return true;
        }
        return false;
}

_printf_(3, 4) static bool prep_fail(struct job *j, int code, const char *fmt, ...) {
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        j->prep_code = code;
        free(j->prep_msg);
        j->prep_msg = strdup(buf);
        return false;
}


_Static_assert((int) SCHED_CONSTRAINT_JSON_OBJECT == (int) GRAMMAR_JSON_OBJECT &&
                       (int) SCHED_CONSTRAINT_JSON_SCHEMA == (int) GRAMMAR_JSON_SCHEMA &&
                       (int) SCHED_CONSTRAINT_TOOL == (int) GRAMMAR_TOOL,
               "enum sched_constraint mirrors enum grammar_kind");

/* The grammar and matcher of a constrained request (on the prep thread, as part of prepare(); the
 * vocabulary index is built there on first use and only read by the engine thread afterwards).
 * On failure the error is recorded in the job: false. */
static bool prepare_constraint(struct sched *s, struct job *j) {
        const struct sched_request *r = j->r;
        char err[1024];
        int ret;

        if (!s->gvocab && (ret = grammar_vocab_new(s->p.tokenizer, &s->gvocab)) < 0) {
                prep_fail(j, SCHED_ERR_INTERNAL, "constraint: cannot index the vocabulary: %s",
                          strerror(-ret));
                return false;
        }
        ret = grammar_compile_constraint((enum grammar_kind) r->constraint, r->constraint_schema,
                                         r->tools_json, r->constraint_tool, s->p.tokenizer,
                                         &j->grammar, err, sizeof err);
        if (ret < 0) {
                prep_fail(j, ret == -ENOMEM ? SCHED_ERR_INTERNAL : SCHED_ERR_INVALID_ARGUMENT, "%s", err);
                return false;
        }
        /* the turn ends with EOS or `<_end>` once the output is complete */
        int32_t ends[2] = { s->eos_id, tokenizer_special_id(s->p.tokenizer, TOKENIZER_SPECIAL_END) };
        j->gmask = malloc(DIV_ROUND_UP(s->cfg->n_vocab, 64) * sizeof *j->gmask);
        if (!j->gmask || grammar_matcher_new(j->grammar, s->gvocab, ends, 2, &j->gm) < 0) {
                prep_fail(j, SCHED_ERR_INTERNAL, "constraint: out of memory");
                return false;
        }
        j->gm_on = !j->thinking;
        return true;
}

/* Text, tokens or chat → token ids, a snapshot's file read, the sampler and output parser. Runs
 * on the prep thread (prep_main): it touches only the job's own fields and what is read-only
 * after start (params, tokenizer, template). On failure it records the error in the job
 * (prep_code, prep_msg) for the engine thread to report; returns false. */
static bool prepare(struct sched *s, struct job *j) {
        struct sched_request *r = j->r;
        int32_t *ids = NULL;
        size_t n = 0;
        int ret;

        if (r->prompt == SCHED_PROMPT_TOKENS) {
                ids = malloc(r->n_tokens * sizeof *ids);
                if (!ids) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "out of memory");
                        return false;
                }
                memcpy(ids, r->tokens, r->n_tokens * sizeof *ids);
                n = r->n_tokens;
        } else if (r->prompt == SCHED_PROMPT_TEXT) {
                ret = tokenizer_encode(s->p.tokenizer, r->text, strlen(r->text), 0, &ids, &n);
                if (ret < 0) {
                        prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "prompt.text: %s",
                                 log_last_error());
                        return false;
                }
        } else {
                _cleanup_(json_freep) struct json_value *ctx = json_new_object();
                struct json_value *msgs = json_new_array();
                _cleanup_free_ char *rendered = NULL;
                bool ok = ctx && msgs && json_object_set(ctx, "messages", msgs) == 0;
                if (!ok)
                        json_free(msgs);
                for (size_t i = 0; ok && i < r->n_messages; i++) {
                        const struct sched_message *m = &r->messages[i];
                        struct json_value *o = json_new_object();
                        ok = o && json_array_append(msgs, o) == 0;
                        if (!ok) {
                                json_free(o);
                                break;
                        }
                        ok = json_object_set(o, "role", json_new_string(m->role, strlen(m->role))) == 0 &&
                             json_object_set(o, "content",
                                             json_new_string(m->content ? m->content : "",
                                                             m->content ? strlen(m->content) : 0)) == 0;
                        if (ok && m->name)
                                ok = json_object_set(o, "name", json_new_string(m->name, strlen(m->name))) == 0;
                        if (ok && m->reasoning)
                                ok = json_object_set(o, "reasoning_content",
                                                     json_new_string(m->reasoning, strlen(m->reasoning))) == 0;
                        if (ok && m->tool_calls_json) {
                                struct json_value *tc;
                                char what[64];
                                snprintf(what, sizeof what, "prompt.chat.messages[%zu].tool_calls_json", i);
                                if (json_parse(m->tool_calls_json, strlen(m->tool_calls_json), what, &tc) < 0) {
                                        prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "%s", log_last_error());
                                        return false;
                                }
                                ok = json_object_set(o, "tool_calls", tc) == 0;
                        }
                }
                if (ok && r->tools_json) {
                        struct json_value *tools;
                        if (json_parse(r->tools_json, strlen(r->tools_json), "prompt.chat.tools_json",
                                       &tools) < 0) {
                                prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "%s", log_last_error());
                                return false;
                        }
                        ok = json_object_set(ctx, "tools", tools) == 0;
                }
                if (ok)
                        ok = json_object_set(ctx, "add_generation_prompt", json_new_bool(true)) == 0;
                if (ok && r->enable_thinking >= 0)
                        ok = json_object_set(ctx, "enable_thinking",
                                             json_new_bool(r->enable_thinking)) == 0;
                if (!ok) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "out of memory building the chat context");
                        return false;
                }
                /* one HF-style context for both renderers: chat_context_build also turns
                 * OpenAI's tool-call arguments (JSON text) into objects, so the Xing4 format
                 * renders them as <param_key>/<param_value> pairs, not as the JSON fallback */
                _cleanup_(json_freep) struct json_value *full = NULL;
                ret = chat_context_build(json_object_get(ctx, "messages"),
                                         json_object_get(ctx, "tools"), true, r->enable_thinking,
                                         s->bos_text, s->eos_text, &full);
                if (ret >= 0) {
                        if (s->tmpl) /* the model's own template (docs/model.md §7 best practice) */
                                ret = chat_template_render(s->tmpl, full, &rendered);
                        else
                                ret = chat_xing4_render(full, &rendered);
                }
                if (ret < 0) {
                        prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "prompt.chat: %s", log_last_error());
                        return false;
                }
                ret = tokenizer_encode(s->p.tokenizer, rendered, strlen(rendered), 0, &ids, &n);
                if (ret < 0) {
                        prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "prompt.chat: %s", log_last_error());
                        return false;
                }
        }
        if (n == 0) {
                free(ids);
                prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "prompt: no tokens after tokenizing");
                return false;
        }
        /* a prompt ending in `<think>` or `<think>\n` (the generation prompt with thinking on,
         * whatever rendered it) makes the output start in the reasoning channel */
        j->thinking = prompt_ends_in_think(s, ids, n);
        if (r->snapshot) {
                /* the snapshot's tokens come first; they are cached once admitted */
                int32_t *prefix = NULL;
                char err[512];
                int code = snap_load(s, j, &prefix, err, sizeof err);
                if (code) {
                        free(ids);
                        prep_fail(j, code, "%s", err);
                        return false;
                }
                int32_t *all = malloc(((size_t) j->snap_n + n) * sizeof *all);
                if (!all) {
                        free(ids);
                        free(prefix);
                        prep_fail(j, SCHED_ERR_INTERNAL, "out of memory");
                        return false;
                }
                memcpy(all, prefix, (size_t) j->snap_n * sizeof *all);
                memcpy(all + j->snap_n, ids, n * sizeof *all);
                free(prefix);
                free(ids);
                ids = all;
                n += j->snap_n;
        }
        j->create = r->snapshot_create != NULL;
        if (n >= s->ctx_limit) {
                free(ids);
                prep_fail(j, SCHED_ERR_TOO_LARGE,
                         "prompt of %zu tokens leaves no room for output in the context limit of "
                         "%u tokens", n, s->ctx_limit);
                return false;
        }
        j->n_prompt = (uint32_t) n;
        j->max_tokens = j->create ? 0 : r->has_max_tokens ? r->max_tokens : s->p.max_tokens_default;
        if (s->p.max_tokens_limit && j->max_tokens > s->p.max_tokens_limit)
                j->max_tokens = s->p.max_tokens_limit; /* the admin's ceiling: ends with LENGTH */
        if (j->max_tokens > s->ctx_limit - j->n_prompt)
                j->max_tokens = s->ctx_limit - j->n_prompt; /* ends with LENGTH at the limit */
        j->seq = realloc(ids, ((size_t) j->n_prompt + j->max_tokens) * sizeof *ids);
        if (!j->seq) {
                free(ids);
                prep_fail(j, SCHED_ERR_INTERNAL, "out of memory for %u tokens",
                         j->n_prompt + j->max_tokens);
                return false;
        }
        j->n_seq = j->n_prompt;
        if (!j->create) {
                const struct sched_sampling *q = &r->sampling;
                struct sampler_params sp;
                sampler_params_default(&sp);
                if (q->has_temperature)
                        sp.temperature = q->temperature;
                if (q->has_top_k)
                        sp.top_k = (int32_t) MIN(q->top_k, s->cfg->n_vocab);
                if (q->has_top_p)
                        sp.top_p = q->top_p;
                if (q->has_min_p)
                        sp.min_p = q->min_p;
                if (q->has_repetition_penalty)
                        sp.repetition_penalty = q->repetition_penalty;
                if (q->has_presence_penalty)
                        sp.presence_penalty = q->presence_penalty;
                if (q->has_frequency_penalty)
                        sp.frequency_penalty = q->frequency_penalty;
                /* no seed: a different stream per request */
                sp.seed = q->has_seed ? q->seed
                                      : (uint64_t) (now_ms() * 1000.0) ^ (r->id << 32) ^ 0x9e3779b97f4a7c15ull;
                if (sampler_new(&sp, s->cfg->n_vocab, &j->sampler) < 0) {
                        prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "sampling: %s", log_last_error());
                        return false;
                }
                /* prompt tokens count for the repetition penalty */
                if (sampler_add_prompt(j->sampler, j->seq, j->n_prompt) < 0) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "%s", log_last_error());
                        return false;
                }
        }
        if (s->p.tokenizer && !j->create) {
                /* the chat generation prompt ends inside <think> unless thinking is off */
                struct outparse_config oc = {
                        .thinking = j->thinking,
                        .thinking_budget = r->has_thinking_budget ? r->thinking_budget : -1,
                        .stop_strings = (const char *const *) r->stop,
                        .n_stop_strings = r->n_stop,
                        .stop_ids = r->stop_ids,
                        .n_stop_ids = r->n_stop_ids,
                        .emit = on_outparse,
                        .userdata = j,
                };
                if (tokenizer_stream_new(s->p.tokenizer, TOKENIZER_DECODE_SKIP_SPECIALS, &j->ts) < 0 ||
                    outparse_new(s->p.tokenizer, &oc, &j->op) < 0) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "%s", log_last_error());
                        return false;
                }
        }
        if (r->constraint != SCHED_CONSTRAINT_NONE && !j->create && !prepare_constraint(s, j))
                return false;
        j->s = s;
        j->prepared = true;
        return true;
}

/* ---- output --------------------------------------------------------------------------------- */

static bool is_turn_end(const struct sched *s, int32_t t) {
        for (size_t i = 0; i < s->n_turn_end_ids; i++)
                if (s->turn_end_ids[i] == t)
                        return true;
        return false;
}

/* The mask starts when the reasoning ends; the reasoning is cut (`</think>` forced) when only
 * the tokens the constrained answer needs are left. */
static void constraint_after_token(struct job *j) {
        bool reasoning = outparse_channel(j->op) == OUTPARSE_REASONING;
        if (!j->gm_on && !reasoning)
                j->gm_on = true;
        if (!j->gm_on && reasoning && outparse_end_think_id(j->op) >= 0 &&
            j->max_tokens - j->n_out <= grammar_matcher_reserve(j->gm))
                j->force_end_think = true;
}

/* Disallowed tokens' logits to -inf (allowed ones untouched). False if none is allowed (the job
 * is failed). */
static bool constrain_logits(struct sched *s, struct job *j, float *l) {
        int n = grammar_matcher_mask(j->gm, j->max_tokens - j->n_out, j->gmask);
        if (n <= 0) {
                fail_job(s, j, SCHED_ERR_INTERNAL, "%s", n < 0 ? "constraint: out of memory for the token mask"
                         : "constraint: no token of the vocabulary continues the constrained output here");
                return false;
        }
        grammar_mask_apply(j->gmask, l, s->cfg->n_vocab);
        return true;
}

/* A token was sampled (or forced) for j. Returns true if j ended (and was freed). */
static bool accept_token(struct sched *s, struct job *j, int32_t t, struct sched_logprob *lp) {
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
                /* ignore_eos (benchmarks): a turn-ending special is just another token */
                if (!(j->r->ignore_eos && is_turn_end(s, t)))
                        (void) outparse_feed(j->op, t, len ? text : "", len);
                if (!j->cur_sent) /* no text for this token (held back, or a special) */
                        emit_chunk(s, j, channel_of(outparse_channel(j->op)), "", 0, &t,
                                   TAKE_PTR(j->cur_lp), NULL, NULL);
                j->cur_sent = true;
                if (j->op_stopped) {
                        finish_job(s, j, j->op_finish, j->op_stop_string);
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
                        finish_job(s, j, SCHED_FINISH_STOP, NULL);
                        return true;
                }
        }
        if (j->n_out >= j->max_tokens) {
                finish_job(s, j, SCHED_FINISH_LENGTH, NULL);
                return true;
        }
        return false;
}

static void snapshot_done(struct sched *s, struct job *j, const struct sched_snapshot_info *info) {
        log_info("snapshot '%s': %u tokens saved (%llu bytes)", info->name, info->n_tokens,
                 (unsigned long long) info->bytes);
        unlink_job(s, j);
        job_release(s, j);
        struct sched_event *e = calloc(1, sizeof *e);
        if (e) {
                e->kind = SCHED_EVENT_SNAPSHOT;
                e->cookie = j->r->cookie;
                e->id = j->r->id;
                e->snapshot = *info;
                push_event(s, e, true);
        } else
                log_error("scheduler: out of memory reporting snapshot '%s'", info->name);
        job_free(s, j);
}

static void prep_enqueue(struct sched *s, struct job *j);

/* Creating a snapshot: the engine thread copies the pages out of the cache a chunk of at most
 * --snapshot-chunk bytes (default this) at a time (a fast copy), the prep thread appends it to the file (the slow part)
 * while the running streams go on; the next chunk is copied when the last one is written, so a
 * snapshot of any size needs one chunk of memory and never stalls the engine on the disk. The
 * request keeps its cache pages until the last chunk is copied. */
#define SNAP_CHUNK_BYTES ((uint64_t) 64 << 20)

static void finish_snapshot(struct sched *s, struct job *j) {
        size_t pb = s->p.ops->page_bytes(s->p.backend);
        uint32_t n_pages = kvcache_pages_for(s->kv, j->n_prompt);
        uint32_t per = (uint32_t) MAX((uint64_t) 1, s->p.snapshot_chunk / pb);
        uint32_t first = j->snap_written, k = MIN(per, n_pages - first);
        uint8_t *data = malloc(MAX((size_t) k, (size_t) 1) * pb);
        int r = data ? 0 : -ENOMEM;

        for (uint32_t i = 0; r >= 0 && i < k; i++)
                r = s->p.ops->page_read(s->p.backend, j->pages[first + i], data + (size_t) i * pb);
        if (r < 0) {
                free(data);
                snap_abandon(j);
                fail_job(s, j, SCHED_ERR_INTERNAL, "snapshot '%s': %s", j->r->snapshot_create,
                         r == -ENOMEM ? "out of memory" : "reading the cache failed");
                return;
        }
        free(j->snap_data);
        j->snap_data = data;
        j->snap_chunk = k;
        if (first + k == n_pages)
                job_release(s, j); /* its pages are free for others while the rest is written */
        j->state = JOB_SAVING;
        prep_enqueue(s, j);
}

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
                                fail_job(s, j, j->prep_code, "%s", j->prep_msg ? j->prep_msg : "");
                        else if (j->snap_written < kvcache_pages_for(s->kv, j->n_prompt))
                                finish_snapshot(s, j); /* the next chunk */
                        else
                                snapshot_done(s, j, &j->saved);
                } else if (j->prep_code && !j->cancel)
                        fail_job(s, j, j->prep_code, "%s", j->prep_msg ? j->prep_msg : "");
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
                        s->cancelled++;
                        s->failed--; /* fail_job counts it failed; it was cancelled */
                        fail_job(s, j, SCHED_ERR_UNAVAILABLE,
                                 "snapshot '%s': cancelled before it was saved (nothing written)",
                                 j->r->snapshot_create);
                } else if (j->cancel)
                        finish_job(s, j, SCHED_FINISH_CANCELLED, NULL);
        }
}

static uint32_t prefix_evict_if(struct sched *s, uint32_t want) {
        return s->prefix ? prefix_evict(s->prefix, want) : 0;
}

/* Hand a job to the prep thread (tokenizing a megabyte of chat or reading a snapshot file there
 * does not stall the running streams). */
static void prep_enqueue(struct sched *s, struct job *j) {
        j->prep_queued = true;
        pthread_mutex_lock(&s->lock);
        j->prep_next = NULL;
        if (s->prep_tail)
                s->prep_tail->prep_next = j;
        else
                s->prep_head = j;
        s->prep_tail = j;
        pthread_cond_signal(&s->prep_wake);
        pthread_mutex_unlock(&s->lock);
}

static void *prep_main(void *userdata) {
        struct sched *s = userdata;

        log_set_ident("xing4d");
        pthread_mutex_lock(&s->lock);
        for (;;) {
                while (!s->quit && !s->prep_head)
                        pthread_cond_wait(&s->prep_wake, &s->lock);
                if (s->quit)
                        break;
                struct job *j = s->prep_head;
                s->prep_head = j->prep_next;
                if (!s->prep_head)
                        s->prep_tail = NULL;
                pthread_mutex_unlock(&s->lock);
                if (j->state == JOB_SAVING) {
                        char err[512];
                        int code = snap_write_chunk(s, j, err, sizeof err);
                        if (code)
                                (void) prep_fail(j, code, "%s", err);
                        free(j->snap_data);
                        j->snap_data = NULL;
                } else
                        (void) prepare(s, j);
                pthread_mutex_lock(&s->lock);
                j->prep_next = s->prepped;
                s->prepped = j;
                pthread_cond_signal(&s->wake);
        }
        pthread_mutex_unlock(&s->lock);
        return NULL;
}

static void preempt(struct sched *s, struct job *j);
static struct job *pick_victim(struct sched *s);

static void admit(struct sched *s) {
        uint32_t running = 0;
        uint32_t pt = kvcache_page_tokens(s->kv);
        for (struct job *j = s->jobs; j; j = j->next)
                running += j->state != JOB_WAITING && j->state != JOB_SAVING;
        for (struct job *j = s->jobs, *next; j; j = next) {
                next = j->next;
                if (j->state != JOB_WAITING || j->prep_queued)
                        continue;
                if (!j->prepared) {
                        prep_enqueue(s, j);
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
                        fail_job(s, j, SCHED_ERR_INTERNAL, "out of memory for a page table");
                        continue;
                }
                /* the longest stored prefix, in full pages; a new request computes at least one
                 * prompt token (its logits start the output). A resumed snapshot's pages that are
                 * stored already (an earlier resume of it) are shared, not written again. */
                uint32_t k = 0;
                if (s->prefix)
                        k = prefix_match(s->prefix, j->seq, fill,
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
                if (first)
                        j->n_reused = j->n_cached - j->snap_n;
                if (j->snap_data) {
                        size_t pb = s->p.ops->page_bytes(s->p.backend);
                        int ret = 0;
                        for (uint32_t i = k; ret >= 0 && i < j->snap_pages; i++)
                                ret = s->p.ops->page_write(s->p.backend, j->pages[i],
                                                           j->snap_data + (size_t) i * pb);
                        free(j->snap_data);
                        j->snap_data = NULL;
                        if (ret < 0) {
                                fail_job(s, j, SCHED_ERR_INTERNAL, "snapshot '%s': %s",
                                         j->r->snapshot, log_last_error());
                                continue;
                        }
                }
                /* a resumed request whose whole sequence came from the store decodes at once */
                j->state = resumed && j->n_cached >= fill ? JOB_DECODE : JOB_PREFILL;
                if (first) {
                        j->t_admit = now_ms();
                        s->prompt_total += j->n_prompt;
                        s->total++;
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
                (void) prefix_insert(s->prefix, j->seq, MIN(j->n_cached, j->n_seq), j->pages,
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
        push_event(s, e, false);
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

static void step(struct sched *s) {
        struct x4_seq *seqs;
        struct job **owners;
        uint32_t n = 0, cap = 0, rows = 0;
        uint32_t prefill_tokens = 0, decode_tokens = 0;

        /* pages for this step, as sequences grow: decoding requests first (one position each),
         * oldest first; when the cache is out, preempt (pick_victim) and try again */
        for (bool again = true; again;) {
                again = false;
                for (struct job *j = s->jobs; j; j = j->next) {
                        j->plan = 0;
                        if (j->state != JOB_DECODE || j->paused)
                                continue;
                        if (grow_pages(s, j, (uint64_t) j->n_cached + 1))
                                continue;
                        preempt(s, pick_victim(s));
                        again = true;
                        break;
                }
        }
        bool decoding = false;
        for (struct job *j = s->jobs; j; j = j->next)
                decoding |= j->state == JOB_DECODE && !j->paused;
        /* then prompt chunks within the step's budget: half of it (all, if it is alone) to the
         * oldest prompt, so it always progresses; the rest to the others, fewest tokens left
         * first, so a short prompt is done in a step or two even beside a long one; what is
         * left over goes back to the oldest */
        uint32_t left = prefill_budget(s, decoding), n_pre = 0;
        struct job *oldest = NULL;
        for (struct job *j = s->jobs; j; j = j->next)
                if (j->state == JOB_PREFILL && !j->paused) {
                        oldest = oldest ? oldest : j;
                        n_pre++;
                }
        if (oldest) {
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
        for (struct job *j = s->jobs; j; j = j->next)
                cap += (j->state == JOB_DECODE && !j->paused) || j->plan;
        if (cap == 0)
                return;
        seqs = calloc(cap, sizeof *seqs);
        owners = calloc(cap, sizeof *owners);
        if (!seqs || !owners) {
                free(seqs);
                free(owners);
                log_error("scheduler: out of memory building a batch of %u sequences", cap);
                return;
        }
        for (struct job *j = s->jobs; j; j = j->next) {
                if (j->state == JOB_DECODE && !j->paused) {
                        seqs[n] = (struct x4_seq){ .tokens = &j->seq[j->n_cached], .n_tokens = 1,
                                                   .pos0 = j->n_cached, .pages = j->pages,
                                                   .n_pages = j->n_pages, .logits = X4_LOGITS_LAST };
                        owners[n++] = j;
                        decode_tokens++;
                        rows++;
                } else if (j->plan) {
                        uint32_t chunk = j->plan;
                        /* logits for the last prompt token only; a resumed request's last
                         * recomputed token already has its sampled successor */
                        bool last = j->n_cached + chunk == j->n_fill && !j->create && j->n_out == 0;
                        seqs[n] = (struct x4_seq){ .tokens = &j->seq[j->n_cached], .n_tokens = chunk,
                                                   .pos0 = j->n_cached, .pages = j->pages,
                                                   .n_pages = j->n_pages,
                                                   .logits = last ? X4_LOGITS_LAST : X4_LOGITS_NONE };
                        owners[n++] = j;
                        prefill_tokens += chunk;
                        rows += last;
                }
        }
        size_t need = (size_t) MAX(rows, 1u) * s->cfg->n_vocab;
        if (need > s->logits_cap) {
                float *l = realloc(s->logits, need * sizeof *l);
                if (!l) {
                        log_error("scheduler: out of memory for %u logits rows", rows);
                        free(seqs);
                        free(owners);
                        return;
                }
                s->logits = l;
                s->logits_cap = need;
        }
        struct x4_batch batch = { .seqs = seqs, .n_seqs = n };
        double t0 = now_ms();
        int r = s->p.ops->forward(s->p.backend, &batch, s->logits);
        double dt = now_ms() - t0;
        if (r < 0) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", log_last_error());
                for (uint32_t i = 0; i < n; i++)
                        fail_job(s, owners[i], SCHED_ERR_INTERNAL, "backend forward failed: %s", msg);
                free(seqs);
                free(owners);
                return;
        }
        s->steps++;
        s->steps_multi += n > 1;
        s->batch_max = MAX(s->batch_max, n);
        /* recent rates: exponential moving average over steps */
        if (dt > 0) {
                double a = 0.2;
                if (prefill_tokens)
                        s->prefill_rate = (1 - a) * s->prefill_rate + a * (prefill_tokens * 1e3 / dt);
                if (decode_tokens)
                        s->decode_rate = (1 - a) * s->decode_rate + a * (decode_tokens * 1e3 / dt);
                /* the prefill budget's inputs: a pure decode step, and a prompt token's share of
                 * a step beyond the decode work in it */
                if (!prefill_tokens)
                        s->decode_step_ms = s->decode_step_ms > 0
                                                    ? (1 - a) * s->decode_step_ms + a * dt : dt;
                else {
                        double extra = dt - (decode_tokens ? s->decode_step_ms : 0);
                        double per = MAX(extra, 0.05 * dt) / prefill_tokens;
                        s->prefill_tok_ms = s->prefill_tok_ms > 0
                                                    ? (1 - a) * s->prefill_tok_ms + a * per : per;
                }
        }
        uint32_t row = 0;
        double now = now_ms();
        for (uint32_t i = 0; i < n; i++) {
                struct job *j = owners[i];
                j->n_cached += seqs[i].n_tokens;
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
                        (void) prefix_insert(s->prefix, j->seq, j->n_prompt, j->pages, j->n_pages);
                if (j->create && j->n_cached == j->n_prompt) {
                        finish_snapshot(s, j);
                        continue;
                }
                if (seqs[i].logits != X4_LOGITS_LAST)
                        continue;
                float *l = s->logits + (size_t) row++ * s->cfg->n_vocab;
                struct sched_logprob *lp = NULL;
                int32_t t;
                if (j->force_end_think)
                        t = outparse_end_think_id(j->op);
                else {
                        struct sampler_result res;
                        bool want = j->r->logprobs > 0;
                        if (j->gm && j->gm_on && !constrain_logits(s, j, l))
                                continue;
                        t = sampler_sample(j->sampler, l, want ? &res : NULL, j->r->logprobs);
                        if (t < 0) {
                                fail_job(s, j, SCHED_ERR_INTERNAL, "sampling: %s", log_last_error());
                                continue;
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
                                                size_t len;
                                                if (tokenizer_decode(s->p.tokenizer, &res.top[k].token,
                                                                     1, 0, &lp->top[k].text, &len) < 0)
                                                        lp->top[k].text = NULL;
                                        }
                                }
                        } else if (lp) {
                                free(lp);
                                lp = NULL;
                        }
                }
                (void) accept_token(s, j, t, lp);
        }
        free(seqs);
        free(owners);
}

static void publish_stats(struct sched *s) {
        struct sched_stats st = {
                .total = s->total,
                .failed = s->failed,
                .cancelled = s->cancelled,
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

static void *engine_main(void *userdata) {
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
                admit(s);
                step(s);
                publish_stats(s);
                /* requests that ended in this step gave pages back: admit waiting ones now.
                 * If still nothing runs, nothing can free pages but a new input: sleep. */
                admit(s);
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

/* ---- lifecycle ------------------------------------------------------------------------------ */

int sched_new(const struct sched_params *params, struct sched **ret) {
        struct sched *s = calloc(1, sizeof *s);
        int r;

        if (!s)
                return log_error_errno(ENOMEM, "scheduler: out of memory");
        s->p = *params;
        if (!s->p.max_running)
                s->p.max_running = 16;
        if (!s->p.max_waiting)
                s->p.max_waiting = 256;
        if (!s->p.max_tokens_default)
                s->p.max_tokens_default = 1024;
        if (!s->p.prefill_chunk)
                s->p.prefill_chunk = 256;
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
        r = kvcache_new(s->caps.n_pages, s->caps.page_tokens, &s->kv);
        if (r < 0) {
                free(s);
                return r;
        }
        if (!s->p.prefix_off && prefix_new(s->kv, s->p.prefix_pages, &s->prefix) < 0) {
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
                        if (gguf_get_string(g, "tokenizer.chat_template", &t) < 0 ||
                            chat_template_parse_len(t.data, t.len, &s->tmpl) < 0) {
                                log_warning("tokenizer.chat_template unusable (%s): chat prompts "
                                            "use the built-in Xing4 template", log_last_error());
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
        publish_stats(s);
        *ret = s;
        return 0;
}

int sched_start(struct sched *s) {
        int r = pthread_create(&s->prep_thread, NULL, prep_main, s);
        if (r != 0)
                return log_error_errno(r, "scheduler: cannot start the prep thread: %s", strerror(r));
        s->prep_started = true;
        r = pthread_create(&s->thread, NULL, engine_main, s);
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
                job_free(s, j);
        }
        while (s->in_head) {
                struct job *j = s->in_head;
                s->in_head = j->next;
                job_free(s, j);
        }
        for (struct sched_event *e = s->ev_head, *next; e; e = next) {
                next = e->next;
                sched_event_free(e);
        }
        free(s->cancels);
        free(s->pauses);
        free(s->live);
        free(s->states);
        free(s->logits);
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
