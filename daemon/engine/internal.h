/* SPDX-License-Identifier: MIT */
/* What the scheduler's parts share (daemon/scheduler.c and daemon/engine/{jobs,snapshot,prepare,
 * step}.c): the job and scheduler structs and the functions one part calls in another. Not a public
 * interface: the daemon and the tools use scheduler.h. */
#pragma once

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
#include "common/util.h"
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
        bool end_cancelled; /* its Error (eng_fail_job) ends a cancelled request */
        bool count_only; /* prepared: the prompt was counted, it ends without admission */
        bool chunked;  /* a chunk went out (the first one carries the prompt's size) */
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
        /* a chat snapshot's conversation (JSON: "messages", "tools_json"; NULL: a raw one): read
         * with the file when resuming, rendered by prepare() when creating one from chat */
        char *snap_meta;
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
        /* MTP speculative decoding (engine/mtp.c): the trunk's hidden rows of positions
         * [mtp_h_pos0, mtp_h_pos0 + mtp_h_n) whose NextN cache rows are not written yet (the
         * rows before mtp_h_pos0 are), and this step's verify tokens: the last sampled token,
         * then mtp_k drafts */
        bool mtp;
        float *mtp_h;
        uint32_t mtp_h_pos0, mtp_h_n, mtp_h_cap;
        uint32_t mtp_k;
        int32_t mtp_tok[1 + SCHED_MTP_DRAFT_MAX];
        /* rejection sampling (sampled requests): this step's drafts were drawn from the draft
         * distributions mtp_q (mtp_k rows of n_vocab) */
        bool mtp_rej;
        float *mtp_q;
        size_t mtp_q_cap;
        /* the drafting guard (eng_mtp_want): drafts verified and accepted in the current window,
         * and the n_out until which drafting pauses after a window below MTP_GUARD_ACCEPT */
        uint32_t mtp_win_drafted, mtp_win_accepted, mtp_pause_until;
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
        /* requests received and how they ended (struct sched_stats says what each counts);
         * counted with live, so they add up with n_live */
        uint64_t n_total, n_completed, n_failed, n_cancelled, n_refused, n_queue_full;
        struct sched_event *ev_head, *ev_tail;
        uint64_t next_id;
        struct sched_stats stats;
        struct sched_request_state *states;
        size_t n_states;

        /* engine thread only */
        struct job *jobs; /* waiting and running, FIFO */
        float *logits;
        size_t logits_cap;
        uint64_t prompt_total, completion_total;
        double prefill_rate, decode_rate;
        uint64_t steps, steps_multi; /* forwards; those holding more than one request */
        uint32_t batch_max;          /* most requests in one forward */
        uint64_t admit_counter, preemptions;
        double decode_step_ms; /* a step without prefill (moving average) */
        double prefill_tok_ms; /* a prompt token's cost within a step (moving average) */
        /* MTP (engine/mtp.c): the backend runs the NextN block; the forward's hidden rows; the
         * NextN forwards' scratch; drafted and accepted token counts */
        bool mtp;
        bool mtp_test_repeat; /* X4_MTP_TEST_DRAFTER=repeat (tests): every draft is the last token */
        float *hidden;
        size_t hidden_cap;
        float *mtp_logits, *mtp_hid, *mtp_p;
        size_t mtp_logits_cap, mtp_hid_cap, mtp_p_cap;
        uint64_t mtp_drafted, mtp_accepted;
};

#define SNAP_CHUNK_BYTES ((uint64_t) 64 << 20) /* default --snapshot-chunk */

/* daemon/scheduler.c (requests, validation, the loop-thread API, lifecycle) */
int eng_grow(void **p, size_t *cap, size_t need, size_t elem);
void eng_logprob_free(struct sched_logprob *lp);
void eng_push_event(struct sched *s, struct sched_event *e, bool final);
_printf_(4, 5) int eng_verr(char *err, size_t size, int code, const char *fmt, ...);

/* daemon/engine/jobs.c (jobs and their output) */
bool eng_accept_token(struct sched *s, struct job *j, int32_t t, struct sched_logprob *lp);
bool eng_constrain_logits(struct sched *s, struct job *j, float *l);
void eng_keep_turn_open(struct sched *s, struct job *j, float *l);
_printf_(4, 5) void eng_fail_job(struct sched *s, struct job *j, int code, const char *fmt, ...);
void eng_finish_job(struct sched *s, struct job *j, int reason, const char *stop);
void eng_job_free(struct sched *s, struct job *j);
void eng_job_release(struct sched *s, struct job *j);
int eng_on_outparse(const struct outparse_event *ev, void *userdata);
void eng_unlink_job(struct sched *s, struct job *j);

/* n messages and the strings they hold, then the array */
void eng_messages_free(struct sched_message *m, size_t n);

/* daemon/engine/snapshot.c (snapshot files) */
void eng_finish_snapshot(struct sched *s, struct job *j);
void eng_snap_abandon(struct job *j);
/* j->r->snapshot's tokens (*ret_tokens, j->snap_n of them), pages (j->snap_data) and, for a chat
 * snapshot, its conversation (j->snap_meta). */
int eng_snap_load(struct sched *s, struct job *j, int32_t **ret_tokens, char *err, size_t size);
int eng_snap_write_chunk(struct sched *s, struct job *j, char *err, size_t size);
/* 0 when no snapshot (file or anything else) is at NAME.x4snap, else SCHED_ERR_ALREADY_EXISTS
 * naming it (or another error) with a message in err. */
int eng_snap_check_absent(const struct sched *s, const char *name, char *err, size_t size);
void eng_snapshot_done(struct sched *s, struct job *j, const struct sched_snapshot_info *info);

/* daemon/engine/prepare.c (prompt preparation (the prep thread)) */
void eng_prep_enqueue(struct sched *s, struct job *j);
void *eng_prep_main(void *userdata);

/* daemon/engine/mtp.c (MTP speculative decoding) */
uint32_t eng_mtp_want(const struct sched *s, const struct job *j);
void eng_mtp_count(const struct sched *s, struct job *j, uint32_t drafted, uint32_t accepted);
void eng_mtp_reset(struct job *j, uint32_t pos);
void eng_mtp_draft(struct sched *s);
void eng_mtp_flush(struct sched *s, struct job *j);
bool eng_mtp_keep(struct sched *s, struct job *j, uint32_t pos0, const float *rows, uint32_t n);
float *eng_mtp_grow(float **p, size_t *cap, size_t n);

/* daemon/engine/step.c (the step) */
void eng_admit(struct sched *s);
void *eng_engine_main(void *userdata);
void eng_publish_stats(struct sched *s);

