/* SPDX-License-Identifier: MIT */
/* x4-bench: prefill and decode rates of a backend on a model (conventions.md "Benchmarks").
 *
 *   x4-bench --model M.gguf [--config C.json] [--assume-release-defaults] [--device cpu|cuda]
 *            [--threads N] [--cache f32|f16] [--prefill 512,4096] [--decode-ctx 512,4096]
 *            [--batch 1,16] [--decode-tokens 32] [--decode-prefill-max 4096] [--repeats 3]
 *            [--profile] [--json]
 *            [--mtp off|on] [--mtp-draft N] [--mtp-verify] [--mtp-prompt TEXT]...
 *   x4-bench --model M.gguf --tokenize TEXT_FILE [--seconds 3]
 *   x4-bench --grammar dense|full|model [--model M.gguf] [--grammar-seqs 20] [--json]
 *
 * --grammar: the constrained-decoding mask cost per token (engine/grammar.h) on one core, for
 * three schemas (a flat object, a nested one with anyOf and $ref, any JSON object) and a forced
 * call of one of two tools in the model's native syntax (raw string values, an integer, an
 * enum). The
 * vocabulary: "dense" 131,072 text pieces shaped like a multilingual SentencePiece vocabulary
 * (byte pieces, ASCII, JSON punctuation runs, digit runs, 20,000 CJK pieces, Latin words with and
 * without `▁`, pieces holding quotes and backslashes; generated from a fixed seed), "full" the
 * `full` preset's (131,072 ids, but ~7,000 text pieces: the rest are padding control pieces no
 * mask visits), "model" the --model's. Each schema runs --grammar-seqs sequences of up to 256
 * tokens, every token drawn uniformly among the allowed ones (a random model writes long strings
 * and the budget closes them); the mask of each step is timed with the thread's CPU clock, both
 * as served (with the matcher's state cache) and with the cache off (every mask a trie walk).
 * Applying each step's mask to the logits (-inf for the refused ones) is timed apart ("apply").
 *
 * --tokenize: the tokenizer's encode speed instead (one thread, the GGUF's vocabulary, the file
 * encoded as one text repeatedly for --seconds; issue 3 asks for >= 10 MB/s).
 * Prefill: one forward of L prompt tokens from position 0 (the backend micro-batches as it likes),
 * rate L / time. Decode at context C with batch B: B independent sequences, each holding C cached
 * tokens, step together one token each for --decode-tokens steps; rate B·steps / time. Every
 * number is the median of --repeats runs after a warm-up run (--warmup 0: none; for runs of
 * minutes, like a 32K prefill). One JSON line per measurement on stdout as it completes
 * (including the load time), then a human table (--json: the JSON lines only). Each measurement also gives the process CPU time (all threads) of the same run,
 * "cpu_ms": on a shared machine it shows what the work cost when the wall clock mostly measures
 * waiting for a core.
 *
 * The decode context: sequence 0 is prefilled with min(C, --decode-prefill-max) tokens (when C is
 * larger, rounded down to whole cache pages), the rest of its page table up to C is filled with
 * copies of those pages, cyclically, and its batch-mates get copies of its pages. A decode step
 * costs the same whatever the cached rows hold: attention reads every one of the C rows of every
 * layer, and copied pages are real latent rows of real tokens. So a 32K context costs seconds to
 * set up, not the minutes of a 32K prefill (on the CPU backend, hours). The JSON line says which
 * way it was filled: "ctx_filled":"prefill" or "prefill+copy".
 *
 * The cache: --cache is the backend's cache_type; by default the daemon's choice, f16 on CUDA
 * (its decode attention then runs on tensor cores on sm_80 / sm_90) and f32 on the CPU (its only
 * type);
 * batch 64 at 32K context needs f16 on a 141 GB card. x4-bench asks for exactly the pages its
 * measurements use: sequence 0 holds max(longest prefill, longest context + steps) tokens, the
 * max(batch) - 1 others the longest context + steps; a backend that cannot fit them refuses, and
 * the message names the measurements that needed them.
 *
 * --profile: after each measurement (never inside a timed run) the backend's profiling is
 * switched on for one more run of the same shape (--decode-tokens steps; one prefill forward),
 * then reported: kernels launched per decode step (per prefill) and, per kernel class, kernels,
 * device ms, share of the summed class time, and the MB the class had to move with its achieved
 * bandwidth (GB/s; the backend's count of weights, cache rows, streams and logits, "-" where it
 * counts none); a JSON line {"what":"profile",...} each and a
 * block per shape in the table, classes sorted by time. A backend without the optional profile
 * op says so once on stderr and the run goes on without profiles.
 *
 * --mtp off|on: also a greedy generation of --decode-tokens tokens after a prompt of
 * MTP_PROMPT tokens (batch 1, "what":"generate"), timed from the prompt's first forward to the
 * last token: with off, one forward per token; with on (the backend created with MTP), each step
 * drafts up to --mtp-draft tokens with the NextN block (the first from the trunk's hidden, the
 * next ones chaining the block) and verifies them in one trunk forward, keeping the drafts up to
 * the first that is not the trunk's argmax, then the trunk's token. --mtp on runs the off loop
 * first on the same backend, reports both, the speed-up, drafted and accepted tokens and the
 * acceptance, and fails if the two token sequences differ.
 *
 * --mtp-prompt TEXT (repeatable, with --mtp off|on): the generate measurement on chat questions
 * instead of the synthetic prompt, so that a trained model's acceptance means something. Each
 * TEXT is one user message rendered as the daemon renders a chat request (daemon/engine/
 * prepare.c: chat_context_build with the generation prompt and enable_thinking left undefined,
 * then the GGUF's tokenizer.chat_template when it has a usable one, else the built-in Xing4
 * template; tokenizer_encode without BOS/EOS). Each question then generates greedily up to
 * --decode-tokens tokens and stops, as the daemon does, at the token that ends the turn (the
 * output parser, chat/outparse.c, decides; the end token counts as generated). Per question
 * and mode a "generate" line with "question" (1-based), "text", "tokens" (generated, end token
 * included), "max_tokens" and "stop" ("end" or "length"); then one "generate_total" line: the
 * tokens, time, drafted and accepted drafts summed over the questions, tok/s off and on (summed
 * tokens / summed median times), the acceptance, the speed-up and same_tokens. The run fails
 * (exit 1) when any question's tokens with MTP on differ from MTP off, after printing them all.
 * A model without a tokenizer is refused naming --mtp-prompt; --mtp on with a model without the
 * NextN block is refused naming --mtp.
 *
 * --mtp-verify (with --mtp on): at every decode shape (context × batch), right after its decode
 * measurement, the cost of a verify step of 1, 2 and 3 drafts (each sequence carries 1 + k tokens,
 * every logits row and hidden row, as MTP asks; the same positions rewritten each step, so the
 * context stays C) and of a NextN draft forward (one row a sequence), per step, against the
 * decode step: {"what":"verify",...} lines with "vs_decode" (verify ms / decode ms) and the
 * speed-up MTP would give if each draft were accepted with probability a, independently:
 * E = 1 + a + ... + a^k tokens a sequence per step of verify + k NextN forwards,
 * speed-up = E · decode ms / (verify ms + k · NextN ms), at a = 0.6, 0.75 and 0.9. Random
 * weights make a measured acceptance meaningless, so this is how the `full` synthetic model
 * shows what MTP can give (issue 16).
 *
 * The commit is $X4_COMMIT, else `git rev-parse --short HEAD` run in $X4_SOURCE_DIR or in the
 * folder of this executable (an in-tree build dir), else "unknown". */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "chat/chat.h"
#include "chat/chat_xing4.h"
#include "chat/outparse.h"
#include "common/json.h"
#include "engine/grammar.h"
#include "model/mkmodel.h"
#include "chat/tokenizer.h"
#include "model/xing4.h"
#include "common/log.h"
#include "common/util.h"
#include "common/macro.h"
#include "tools/common.h"

#define PAGE_TOKENS 256u
#define MAX_LIST 32
#define MAX_RESULTS 256
#define MAX_PROFILES 128

struct result {
        char what[16];
        uint32_t len, ctx, batch;
        uint32_t filled; /* decode: tokens of sequence 0 that were prefilled (the rest copied) */
        double tok_s, ms, cpu_ms;
};

/* One profiled shape, per decode step or per prefill forward. */
struct profile_result {
        bool prefill;
        uint32_t len, ctx, batch;
        double kernels;
        uint32_t n_classes;
        struct {
                const char *name;
                double kernels, ms;
                double mb; /* MB it had to move (the backend's count; 0: not counted) */
        } classes[X4_PROFILE_MAX_CLASSES]; /* sorted by ms, largest first */
};

/* A class's achieved bandwidth in GB/s (bytes it had to move / its device time), 0 when either is 0. */
static double class_gbs(double mb, double ms) {
        return mb > 0 && ms > 0 ? mb / ms : 0; /* MB / ms = GB/s */
}

#define MTP_PROMPT 64u
#define MAX_PROMPTS 64

struct bench {
        const struct x4_backend_ops *ops;
        struct x4_backend *b;
        uint32_t n_vocab;
        /* cache slots: sequence 0 (prefill, the decode source) owns pages[0 .. pages0), batch-mate
         * i >= 1 owns pages_dec pages from pages0 + (i - 1) * pages_dec */
        uint32_t pages0, pages_dec;
        uint32_t *pages;
        int32_t *tokens;
        float *logits;
        uint32_t prefill_max; /* --decode-prefill-max */
        const char *cache;    /* "f32", "f16" */
        const char *cpu_math; /* "fp32", "fast" (the CPU backend's numerics) */
        bool json, profile, profile_unsupported, warmup;
        char device[128], model[256], commit[64];
        char model_name[256]; /* general.name, JSON-escaped ("" when absent) */
        bool prompt_class;    /* x4_backend_caps.prompt_class */
        uint32_t pass_tokens; /* x4_backend_caps.max_batch_tokens (CUDA: the pass length) */
        double kernels_per_step; /* of the decode shape being reported; < 0: unknown */
        struct result results[MAX_RESULTS];
        size_t n_results;
        struct profile_result profiles[MAX_PROFILES];
        size_t n_profiles;
        /* --mtp: the generate measurements (off, then on) */
        int mtp;            /* -1 not asked, 0 off, 1 on */
        uint32_t mtp_draft, n_embd;
        bool mtp_verify;    /* --mtp-verify */
        struct gen_result {
                bool on, end;       /* end: stopped at the end of the turn (--mtp-prompt) */
                uint32_t question;  /* 1-based with --mtp-prompt, 0 the synthetic prompt */
                uint32_t prompt, tokens, draft;
                double tok_s, ms;
                uint64_t drafted, accepted;
        } gen[2 * MAX_PROMPTS];
        size_t n_gen;
        /* --mtp-prompt: the questions, their rendered and tokenized prompts, the tokenizer that
         * decides where a turn ends */
        const char *questions[MAX_PROMPTS];
        size_t n_questions;
        int32_t *q_ids[MAX_PROMPTS];
        uint32_t q_len[MAX_PROMPTS];
        struct tokenizer *tok;
        bool q_gguf_template; /* the GGUF's own chat template (else the built-in Xing4 one) */
};

static const uint32_t *slot_pages(const struct bench *B, uint32_t slot) {
        return B->pages + (slot == 0 ? 0 : B->pages0 + (size_t) (slot - 1) * B->pages_dec);
}

static uint32_t slot_n_pages(const struct bench *B, uint32_t slot) {
        return slot == 0 ? B->pages0 : B->pages_dec;
}

static double now_s(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process (all threads): on a shared machine it says what the work cost
 * even when the wall clock mostly measures waiting for a core. */
static double cpu_s(void) {
        struct timespec ts;

        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

static double median(double *v, size_t n) {
        qsort(v, n, sizeof *v, cmp_double);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int parse_list(const char *opt, const char *s, uint32_t *v, size_t *n) {
        const char *p = s;

        *n = 0;
        if (streq(s, "none"))
                return 0;
        for (;;) {
                char *end;
                unsigned long long x;

                errno = 0;
                x = strtoull(p, &end, 10);
                if (end == p || errno || x == 0 || x > UINT32_MAX / 2 || *p == '-' ||
                    (*end != ',' && *end != '\0') || *n == MAX_LIST)
                        return log_error_errno(EINVAL,
                                               "%s: '%s' is not a comma-separated list of at most %d positive integers (or none)",
                                               opt, s, MAX_LIST);
                v[(*n)++] = (uint32_t) x;
                if (*end == '\0')
                        return 0;
                p = end + 1;
        }
}

static int parse_opt_u32(const char *opt, const char *s, uint32_t min, uint32_t *ret) {
        return tool_parse_u32(opt, s, min, UINT32_MAX / 2 /* the bound of parse_list */, ret);
}

static void find_commit(char *buf, size_t size) {
        const char *env = getenv("X4_COMMIT"), *src = getenv("X4_SOURCE_DIR");
        char exe[PATH_MAX], cmd[PATH_MAX + 64];
        const char *dirs[2] = { src, NULL };
        ssize_t n;

        snprintf(buf, size, "unknown");
        if (env && *env) {
                snprintf(buf, size, "%s", env);
                return;
        }
        n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
                exe[n] = 0;
                dirs[1] = dirname(exe);
        }
        for (size_t i = 0; i < ELEMENTSOF(dirs); i++) {
                FILE *p;

                if (!dirs[i] || !*dirs[i] || strchr(dirs[i], '\''))
                        continue;
                snprintf(cmd, sizeof cmd, "git -C '%s' rev-parse --short HEAD 2>/dev/null", dirs[i]);
                p = popen(cmd, "r");
                if (!p)
                        continue;
                if (fgets(buf, (int) size, p) && buf[0]) {
                        buf[strcspn(buf, "\n")] = 0;
                        pclose(p);
                        return;
                }
                pclose(p);
                snprintf(buf, size, "unknown");
        }
}

static void print_tail(const struct bench *B) {
        /* prompt_class: the backend runs prompt tokens (prefill, the decode runs' context) on
         * other kernels than generated ones (kernels/backend.h) */
        printf(",\"cache\":\"%s\",\"device\":\"%s\",\"prompt_class\":%s,\"pass_tokens\":%u,\"model\":\"%s\","
               "\"model_name\":\"%s\",\"commit\":\"%s\",\"cpu_math\":\"%s\"}\n",
               B->cache, B->device, B->prompt_class ? "true" : "false", B->pass_tokens, B->model,
               B->model_name, B->commit, B->cpu_math);
        fflush(stdout);
}

static void report(struct bench *B, const char *what, uint32_t len, uint32_t ctx, uint32_t batch,
                   uint32_t filled, double tok_s, double ms, double cpu_ms) {
        struct result *r;

        if (strcmp(what, "load") == 0)
                printf("{\"what\":\"load\",\"s\":%.3f", ms / 1000);
        else if (strcmp(what, "prefill") == 0)
                printf("{\"what\":\"prefill\",\"tokens\":%u,\"tok_s\":%.2f,\"ms\":%.3f", len, tok_s, ms);
        else
                printf("{\"what\":\"decode\",\"ctx\":%u,\"batch\":%u,\"tok_s\":%.2f,\"ms_per_step\":%.3f,"
                       "\"ctx_filled\":\"%s\",\"ctx_prefilled\":%u",
                       ctx, batch, tok_s, ms, filled < ctx ? "prefill+copy" : "prefill", filled);
        if (strcmp(what, "decode") == 0 && B->kernels_per_step >= 0)
                printf(",\"kernels_per_step\":%.1f", B->kernels_per_step);
        if (strcmp(what, "load") != 0)
                printf(",\"cpu_ms\":%.3f", cpu_ms);
        print_tail(B);
        if (B->n_results == MAX_RESULTS)
                return;
        r = &B->results[B->n_results++];
        snprintf(r->what, sizeof r->what, "%s", what);
        r->len = len;
        r->ctx = ctx;
        r->batch = batch;
        r->filled = filled;
        r->tok_s = tok_s;
        r->ms = ms;
        r->cpu_ms = cpu_ms;
}

static int run_seq(struct bench *B, uint32_t slot, uint32_t n, uint32_t pos0, uint32_t mode) {
        struct x4_seq s = {
                .tokens = B->tokens,
                .n_tokens = n,
                .pos0 = pos0,
                .pages = slot_pages(B, slot),
                .n_pages = slot_n_pages(B, slot),
                .logits = mode,
                .prompt_tokens = n, /* a prompt, as the daemon labels it (kernels/backend.h) */
        };
        struct x4_batch batch = { .seqs = &s, .n_seqs = 1 };

        return B->ops->forward(B->b, &batch, B->logits, NULL, 0);
}

/* Log r with `what` in front of the backend's own message (log_last_error() is reused by the
 * next message, so it is copied first). */
static int backend_error(int r, const char *what) {
        char reason[1024];

        snprintf(reason, sizeof reason, "%s", *log_last_error() ? log_last_error() : "failed");
        return log_error_errno(r, "%s: %s", what, reason);
}

/* --profile: switch the backend's profiling on before one more untimed run of a measured shape.
 * 1: on; 0: the backend cannot profile (said once), run nothing more; <0: error. */
static int profile_begin(struct bench *B) {
        int r;

        if (!B->profile)
                return 0;
        if (!B->ops->profile) {
                if (!B->profile_unsupported)
                        fprintf(stderr, "profile: not supported by the %s backend\n", B->ops->name);
                B->profile_unsupported = true;
                return 0;
        }
        r = B->ops->profile(B->b, true, NULL);
        if (r < 0)
                return backend_error(r, "profile: switching the profiling on");
        return 1;
}

struct class_order {
        double ms;
        uint32_t i;
};

static int cmp_class_ms(const void *a, const void *b) {
        double x = ((const struct class_order *) a)->ms, y = ((const struct class_order *) b)->ms;
        return (x < y) - (x > y); /* largest first */
}

/* Switch profiling off and report what the run spent, per decode step (per prefill forward). */
static int profile_end(struct bench *B, bool prefill, uint32_t len, uint32_t ctx, uint32_t batch) {
        struct x4_backend_profile p = {};
        struct profile_result pr = { .prefill = prefill, .len = len, .ctx = ctx, .batch = batch };
        struct class_order order[X4_PROFILE_MAX_CLASSES];
        double per, sum_ms = 0;
        int r;

        r = B->ops->profile(B->b, false, &p);
        if (r < 0)
                return backend_error(r, "profile: switching the profiling off");
        if (p.forwards == 0)
                return log_error_errno(EPROTO, "profile of %s %u: the %s backend counted no forward",
                                       prefill ? "prefill" : "decode at ctx", prefill ? len : ctx,
                                       B->ops->name);
        per = (double) p.forwards;
        pr.kernels = (double) p.kernels / per;
        pr.n_classes = MIN(p.n_classes, (uint32_t) X4_PROFILE_MAX_CLASSES);
        for (uint32_t i = 0; i < pr.n_classes; i++) {
                order[i].ms = p.classes[i].ms;
                order[i].i = i;
                sum_ms += p.classes[i].ms;
        }
        qsort(order, pr.n_classes, sizeof *order, cmp_class_ms);
        for (uint32_t k = 0; k < pr.n_classes; k++) {
                uint32_t i = order[k].i;

                pr.classes[k].name = p.classes[i].name ? p.classes[i].name : "?";
                pr.classes[k].kernels = (double) p.classes[i].kernels / per;
                pr.classes[k].ms = p.classes[i].ms / per;
                pr.classes[k].mb = (double) p.classes[i].bytes / per / 1e6;
        }

        if (prefill)
                printf("{\"what\":\"profile\",\"tokens\":%u,\"kernels_per_prefill\":%.1f", len, pr.kernels);
        else
                printf("{\"what\":\"profile\",\"ctx\":%u,\"batch\":%u,\"kernels_per_step\":%.1f", ctx, batch,
                       pr.kernels);
        printf(",\"ms_sum\":%.4f,\"classes\":[", sum_ms / per);
        for (uint32_t k = 0; k < pr.n_classes; k++)
                printf("%s{\"name\":\"%s\",\"kernels\":%.1f,\"ms\":%.4f,\"share\":%.4f,\"mb\":%.3f,\"gb_s\":%.1f}",
                       k ? "," : "", pr.classes[k].name, pr.classes[k].kernels, pr.classes[k].ms,
                       sum_ms > 0 ? pr.classes[k].ms * per / sum_ms : 0, pr.classes[k].mb,
                       class_gbs(pr.classes[k].mb, pr.classes[k].ms));
        printf("]");
        print_tail(B);
        if (B->n_profiles < MAX_PROFILES)
                B->profiles[B->n_profiles++] = pr;
        return 0;
}

static int bench_prefill(struct bench *B, uint32_t len, uint32_t repeats) {
        _cleanup_free_ double *t = calloc(repeats, sizeof *t), *ct = calloc(repeats, sizeof *ct);
        int r;

        if (!t || !ct)
                return log_error_errno(ENOMEM, "out of memory");
        /* warm-up: the same shape once */
        r = B->warmup ? run_seq(B, 0, len, 0, X4_LOGITS_LAST) : 0;
        if (r < 0)
                return r;
        for (uint32_t i = 0; i < repeats; i++) {
                double t0 = now_s(), c0 = cpu_s();

                r = run_seq(B, 0, len, 0, X4_LOGITS_LAST);
                if (r < 0)
                        return r;
                t[i] = now_s() - t0;
                ct[i] = cpu_s() - c0;
        }
        double m = median(t, repeats);
        report(B, "prefill", len, 0, 0, 0, len / m, m * 1000, median(ct, repeats) * 1000);

        r = profile_begin(B);
        if (r <= 0)
                return r;
        r = run_seq(B, 0, len, 0, X4_LOGITS_LAST);
        if (r < 0)
                return r;
        return profile_end(B, true, len, 0, 0);
}

/* Tokens of sequence 0 that the decode setup prefills for context ctx: all of them up to
 * --decode-prefill-max, else that many rounded down to whole pages (at least one: the option's
 * minimum is one page), the rest of the context being copies of those pages. */
static uint32_t decode_prefilled(const struct bench *B, uint32_t ctx) {
        return ctx <= B->prefill_max ? ctx : B->prefill_max / PAGE_TOKENS * PAGE_TOKENS;
}

/* `steps` decode steps of `batch` sequences at positions ctx .. ctx + steps - 1 */
static int decode_steps(struct bench *B, struct x4_seq *seqs, uint32_t batch, uint32_t ctx,
                        uint32_t steps) {
        struct x4_batch bt = { .seqs = seqs, .n_seqs = batch };
        int r;

        for (uint32_t s = 0; s < steps; s++) {
                for (uint32_t i = 0; i < batch; i++)
                        seqs[i].pos0 = ctx + s;
                r = B->ops->forward(B->b, &bt, B->logits, NULL, 0);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* An output buffer from the backend's host memory (x4_host_alloc: page-locked on CUDA, as the
 * daemon's), freed at the end of its scope. */
struct hostbuf {
        const struct bench *B;
        float *p;
};

static void hostbuf_free(struct hostbuf *h) {
        if (h->B)
                x4_host_free(h->B->ops, h->B->b, h->p);
}

static struct hostbuf hostbuf_new(const struct bench *B, size_t floats) {
        return (struct hostbuf){ B, x4_host_alloc(B->ops, B->b, floats * sizeof(float)) };
}

/* --mtp-verify at one decode shape (seqs: bench_decode's, their pages holding context ctx):
 * median ms per step of the NextN draft forward and of verify steps of k = 1..3 drafts. */
static int bench_verify(struct bench *B, const struct x4_seq *dec, uint32_t ctx, uint32_t batch,
                        uint32_t steps, uint32_t repeats, double decode_ms) {
        const size_t V = B->n_vocab, H = B->n_embd;
        const uint32_t K = 3;
        _cleanup_free_ struct x4_seq *seqs = calloc(batch, sizeof *seqs);
        _cleanup_free_ struct x4_nextn_seq *ns = calloc(batch, sizeof *ns);
        _cleanup_free_ int32_t *toks = calloc((size_t) batch * (K + 1), sizeof *toks);
        _cleanup_(hostbuf_free) struct hostbuf lgb = hostbuf_new(B, (size_t) batch * (K + 1) * V);
        _cleanup_(hostbuf_free) struct hostbuf hidb = hostbuf_new(B, (size_t) batch * (K + 1) * H);
        float *lg = lgb.p, *hid = hidb.p;
        _cleanup_free_ float *h = malloc((size_t) batch * H * sizeof(float));
        _cleanup_free_ double *t = calloc(repeats, sizeof *t);
        double ms[4];
        int r;

        if (!seqs || !ns || !toks || !lg || !hid || !h || !t)
                return log_error_errno(ENOMEM, "out of memory");
        for (size_t i = 0; i < (size_t) batch * (K + 1); i++)
                toks[i] = B->tokens[i % MTP_PROMPT];
        for (size_t i = 0; i < (size_t) batch * H; i++)
                h[i] = (float) ((i * 2654435761u) % 1000) / 500.0f - 1.0f; /* any hidden will do */
        /* k = 0: the NextN draft forward; k >= 1: a verify step of k drafts */
        for (uint32_t k = 0; k <= K; k++) {
                for (uint32_t i = 0; i < batch; i++) {
                        struct x4_seq s = {
                                .tokens = toks + (size_t) i * (K + 1), .n_tokens = k ? 1 + k : 1,
                                .pos0 = ctx, .pages = dec[i].pages, .n_pages = dec[i].n_pages,
                                .logits = k ? X4_LOGITS_ALL : X4_LOGITS_LAST,
                                .hidden = k ? X4_LOGITS_ALL : X4_LOGITS_LAST,
                        };
                        seqs[i] = s;
                        ns[i] = (struct x4_nextn_seq){ .seq = s, .h = h + (size_t) i * H };
                }
                for (uint32_t rep = B->warmup ? 0 : 1; rep <= repeats; rep++) {
                        double t0 = now_s();

                        for (uint32_t st = 0; st < steps; st++) {
                                if (k == 0)
                                        r = B->ops->nextn(B->b, &(struct x4_nextn_batch){ ns, batch, hid },
                                                          lg, NULL, 0);
                                else
                                        r = B->ops->forward(B->b, &(struct x4_batch){ seqs, batch, hid }, lg,
                                                            NULL, 0);
                                if (r < 0)
                                        return backend_error(r, k ? "verify step" : "NextN draft forward");
                        }
                        if (rep > 0)
                                t[rep - 1] = (now_s() - t0) / steps;
                }
                ms[k] = median(t, repeats) * 1000;
        }
        for (uint32_t k = 1; k <= K; k++) {
                static const double acc[3] = { 0.6, 0.75, 0.9 };
                double proj[3];

                for (int a = 0; a < 3; a++) {
                        double e = 0, p = 1;
                        for (uint32_t i = 0; i <= k; i++, p *= acc[a])
                                e += p;
                        proj[a] = e * decode_ms / (ms[k] + k * ms[0]);
                }
                printf("{\"what\":\"verify\",\"ctx\":%u,\"batch\":%u,\"drafts\":%u,\"ms_per_step\":%.3f,"
                       "\"decode_ms\":%.3f,\"vs_decode\":%.3f,\"nextn_ms\":%.3f,"
                       "\"projected_speedup\":{\"0.6\":%.3f,\"0.75\":%.3f,\"0.9\":%.3f}",
                       ctx, batch, k, ms[k], decode_ms, ms[k] / decode_ms, ms[0], proj[0], proj[1], proj[2]);
                print_tail(B);
        }
        return 0;
}

static int bench_decode(struct bench *B, uint32_t ctx, uint32_t batch, uint32_t steps,
                        uint32_t repeats) {
        _cleanup_free_ struct x4_seq *seqs = calloc(batch, sizeof *seqs);
        _cleanup_free_ double *t = calloc(repeats, sizeof *t), *ct = calloc(repeats, sizeof *ct);
        const uint32_t *p0 = slot_pages(B, 0);
        uint32_t used = DIV_ROUND_UP(ctx, PAGE_TOKENS), filled = decode_prefilled(B, ctx);
        uint32_t filled_pages = DIV_ROUND_UP(filled, PAGE_TOKENS);
        int r;

        if (!seqs || !t || !ct)
                return log_error_errno(ENOMEM, "out of memory");
        /* C cached tokens in sequence 0: prefill, then (C > --decode-prefill-max, so `filled` is
         * whole pages) pages filled_pages .. used - 1 copied from pages 0, 1, .. cyclically */
        r = run_seq(B, 0, filled, 0, X4_LOGITS_NONE);
        if (r < 0)
                return r;
        for (uint32_t k = filled_pages; k < used; k++) {
                r = B->ops->page_copy(B->b, p0[k], p0[k % filled_pages], NULL, 0);
                if (r < 0)
                        return r;
        }
        /* the batch-mates: copies of sequence 0's pages */
        for (uint32_t i = 1; i < batch; i++)
                for (uint32_t k = 0; k < used; k++) {
                        r = B->ops->page_copy(B->b, slot_pages(B, i)[k], p0[k], NULL, 0);
                        if (r < 0)
                                return r;
                }
        for (uint32_t i = 0; i < batch; i++)
                seqs[i] = (struct x4_seq) {
                        .tokens = B->tokens + i,
                        .n_tokens = 1,
                        .pages = slot_pages(B, i),
                        .n_pages = slot_n_pages(B, i),
                        .logits = X4_LOGITS_LAST,
                };

        /* run 0 is the warm-up (skipped with --warmup 0); every run rewrites positions
         * ctx .. ctx+steps-1 */
        for (uint32_t rep = B->warmup ? 0 : 1; rep <= repeats; rep++) {
                double t0 = now_s(), c0 = cpu_s();

                r = decode_steps(B, seqs, batch, ctx, steps);
                if (r < 0)
                        return r;
                if (rep > 0) {
                        t[rep - 1] = (now_s() - t0) / steps;
                        ct[rep - 1] = (cpu_s() - c0) / steps;
                }
        }
        double m = median(t, repeats);
        /* kernels per step: one more untimed step with the backend's profiling on (backends
         * without the optional profile op report none) */
        B->kernels_per_step = -1;
        if (B->ops->profile) {
                struct x4_backend_profile p = {};
                r = B->ops->profile(B->b, true, NULL);
                if (r >= 0) {
                        r = decode_steps(B, seqs, batch, ctx, 1);
                        int r2 = B->ops->profile(B->b, false, &p);
                        if (r < 0)
                                return r;
                        if (r2 >= 0 && p.forwards > 0)
                                B->kernels_per_step = (double) p.kernels / (double) p.forwards;
                }
        }
        report(B, "decode", 0, ctx, batch, filled, batch / m, m * 1000, median(ct, repeats) * 1000);
        if (B->mtp_verify && (r = bench_verify(B, seqs, ctx, batch, steps, repeats, m * 1000)) < 0)
                return r;

        r = profile_begin(B);
        if (r <= 0)
                return r;
        r = decode_steps(B, seqs, batch, ctx, steps);
        if (r < 0)
                return r;
        return profile_end(B, false, 0, ctx, batch);
}

static int32_t argmax_row(const float *l, uint32_t n) {
        uint32_t best = 0;

        for (uint32_t i = 1; i < n; i++)
                if (l[i] > l[best])
                        best = i;
        return (int32_t) best;
}

static int outparse_ignore(const struct outparse_event *ev, void *userdata) {
        (void) ev, (void) userdata;
        return 0;
}

/* One greedy generation of up to `steps` tokens after the P prompt tokens in cache slot 0, with
 * up to `draft` MTP drafts a step (0: plain decode). With B->tok (--mtp-prompt) it stops after
 * the token that ends the turn, as the daemon's output parser decides (*ret_end true). Writes
 * the generated ids to out[0..*ret_n). */
static int generate_once(struct bench *B, const int32_t *prompt, uint32_t P, uint32_t steps, uint32_t draft,
                         int32_t *out, uint32_t *ret_n, bool *ret_end, uint64_t *drafted, uint64_t *accepted) {
        const size_t V = B->n_vocab, H = B->n_embd;
        _cleanup_free_ int32_t *ids = calloc(P + steps + 8, sizeof *ids);
        _cleanup_(hostbuf_free) struct hostbuf hidb = hostbuf_new(B, (size_t) (P + 8) * H);
        _cleanup_(hostbuf_free) struct hostbuf lgb = hostbuf_new(B, (size_t) (1 + draft) * V);
        float *hid = hidb.p, *lg = lgb.p;
        _cleanup_free_ float *dh = malloc(H * sizeof(float)), *dl = malloc(V * sizeof(float));
        _cleanup_(outparse_freep) struct outparse *op = NULL;
        bool mtp = draft > 0, end = false;
        int r;

        if (!ids || !hid || !lg || !dh || !dl)
                return log_error_errno(ENOMEM, "out of memory");
        if (B->tok) {
                char err[256];
                struct outparse_config oc = { .thinking_budget = -1, .emit = outparse_ignore };
                r = outparse_new(B->tok, &oc, &op, err, sizeof err);
                if (r < 0)
                        return log_error_errno(r, "output parser: %s", err);
        }
        memcpy(ids, prompt, P * sizeof *ids);
        struct x4_seq sq = { .tokens = ids, .n_tokens = P, .pos0 = 0, .pages = slot_pages(B, 0),
                             .n_pages = slot_n_pages(B, 0), .logits = X4_LOGITS_LAST,
                             .hidden = mtp ? X4_LOGITS_ALL : X4_LOGITS_NONE, .prompt_tokens = P };
        r = B->ops->forward(B->b, &(struct x4_batch){ &sq, 1, mtp ? hid : NULL }, lg, NULL, 0);
        if (r < 0)
                return r;
        ids[P] = argmax_row(lg, (uint32_t) V);
        /* the text of a token is not needed to see the end of a turn (special ids end it) */
        if (op && outparse_feed(op, ids[P], "", 0) >= 0 && outparse_stopped(op))
                end = true;
        uint32_t n_cached = P, gen = 1, h_pos0 = 0, h_n = P;
        while (gen < steps && !end) {
                uint32_t k = mtp ? MIN(draft, steps - gen - 1) : 0;
                int32_t toks[4] = { ids[n_cached] };

                if (mtp) {
                        /* the waiting rows' NextN cache rows; the last one drafts */
                        struct x4_nextn_seq ns = {
                                .seq = { .tokens = ids + h_pos0 + 1, .n_tokens = h_n, .pos0 = h_pos0,
                                         .pages = sq.pages, .n_pages = sq.n_pages,
                                         .logits = k ? X4_LOGITS_LAST : X4_LOGITS_NONE,
                                         .hidden = k ? X4_LOGITS_LAST : X4_LOGITS_NONE },
                                .h = hid,
                        };
                        r = B->ops->nextn(B->b, &(struct x4_nextn_batch){ &ns, 1, dh }, dl, NULL, 0);
                        if (r < 0)
                                return r;
                        if (k)
                                toks[1] = argmax_row(dl, (uint32_t) V);
                        for (uint32_t level = 1; level < k; level++) {
                                memcpy(hid, dh, H * sizeof(float));
                                ns = (struct x4_nextn_seq){
                                        .seq = { .tokens = &toks[level], .n_tokens = 1, .pos0 = n_cached + level - 1,
                                                 .pages = sq.pages, .n_pages = sq.n_pages,
                                                 .logits = X4_LOGITS_LAST, .hidden = X4_LOGITS_LAST },
                                        .h = hid,
                                };
                                r = B->ops->nextn(B->b, &(struct x4_nextn_batch){ &ns, 1, dh }, dl, NULL, 0);
                                if (r < 0)
                                        return r;
                                toks[level + 1] = argmax_row(dl, (uint32_t) V);
                        }
                }
                sq = (struct x4_seq){ .tokens = toks, .n_tokens = 1 + k, .pos0 = n_cached,
                                      .pages = sq.pages, .n_pages = sq.n_pages,
                                      .logits = k ? X4_LOGITS_ALL : X4_LOGITS_LAST,
                                      .hidden = mtp ? X4_LOGITS_ALL : X4_LOGITS_NONE };
                r = B->ops->forward(B->b, &(struct x4_batch){ &sq, 1, mtp ? hid : NULL }, lg, NULL, 0);
                if (r < 0)
                        return r;
                uint32_t i = 0;
                for (;; i++) {
                        int32_t t = argmax_row(lg + (size_t) i * V, (uint32_t) V);
                        ids[n_cached + 1 + i] = t;
                        gen++;
                        /* row i is the trunk's token after draft i: draft i + 1 is accepted when
                         * it is that token (also when that token ends the turn) */
                        bool match = i < k && t == toks[i + 1];
                        if (match)
                                (*accepted)++;
                        if (op && outparse_feed(op, t, "", 0) >= 0 && outparse_stopped(op))
                                end = true;
                        if (!match || end || gen >= steps)
                                break;
                }
                *drafted += k;
                n_cached += i + 1;
                h_pos0 = n_cached - (i + 1);
                h_n = i + 1;
        }
        memcpy(out, ids + P, gen * sizeof *out);
        *ret_n = gen;
        *ret_end = end;
        return 0;
}

static void print_json_string(const char *s) {
        _cleanup_(json_freep) struct json_value *v = json_new_string(s, strlen(s));
        _cleanup_free_ char *d = v ? json_dump(v, JSON_COMPACT, 0) : NULL;
        fputs(d ? d : "\"\"", stdout);
}

/* The generate measurement of one prompt (question 0: the synthetic one): MTP off, then on with
 * --mtp on. *same: the two token sequences are equal. */
static int generate_prompt(struct bench *B, uint32_t question, const int32_t *prompt, uint32_t P, uint32_t steps,
                           uint32_t repeats, bool *same) {
        _cleanup_free_ int32_t *off = calloc(steps + 8, sizeof *off), *on = calloc(steps + 8, sizeof *on);
        _cleanup_free_ double *t = calloc(repeats, sizeof *t);
        uint32_t n[2] = {};
        int r;

        if (!off || !on || !t)
                return log_error_errno(ENOMEM, "out of memory");
        *same = true;
        for (int mode = 0; mode <= B->mtp; mode++) {
                uint32_t draft = mode ? B->mtp_draft : 0;
                uint64_t drafted = 0, accepted = 0;
                bool end = false;

                for (uint32_t rep = B->warmup ? 0 : 1; rep <= repeats; rep++) {
                        uint64_t d = 0, a = 0;
                        double t0 = now_s();

                        r = generate_once(B, prompt, P, steps, draft, mode ? on : off, &n[mode], &end, &d, &a);
                        if (r < 0)
                                return r;
                        if (rep > 0)
                                t[rep - 1] = now_s() - t0;
                        drafted = d, accepted = a;
                }
                double m = median(t, repeats);
                uint32_t got = n[mode];
                printf("{\"what\":\"generate\",\"mtp\":\"%s\",\"mtp_draft\":%u,\"prompt\":%u,\"tokens\":%u,"
                       "\"tok_s\":%.2f,\"ms\":%.3f,\"drafted\":%" PRIu64 ",\"accepted\":%" PRIu64
                       ",\"acceptance\":%.4f",
                       mode ? "on" : "off", draft, P, got, got / m, m * 1000, drafted, accepted,
                       drafted ? (double) accepted / (double) drafted : 0.0);
                if (mode) {
                        *same = n[0] == n[1] && memcmp(on, off, n[1] * sizeof *on) == 0;
                        printf(",\"speedup\":%.3f,\"same_tokens\":%s", B->gen[B->n_gen - 1].ms / (m * 1000),
                               *same ? "true" : "false");
                }
                if (question) {
                        printf(",\"question\":%u,\"max_tokens\":%u,\"stop\":\"%s\",\"template\":\"%s\",\"text\":",
                               question, steps, end ? "end" : "length", B->q_gguf_template ? "gguf" : "xing4");
                        print_json_string(B->questions[question - 1]);
                }
                print_tail(B);
                B->gen[B->n_gen++] = (struct gen_result){ .on = mode, .end = end, .question = question, .prompt = P,
                                                         .tokens = got, .draft = draft, .tok_s = got / m,
                                                         .ms = m * 1000, .drafted = drafted, .accepted = accepted };
        }
        return 0;
}

static int bench_generate(struct bench *B, uint32_t steps, uint32_t repeats) {
        bool same, all_same = true;
        int r;

        if (!B->n_questions) {
                r = generate_prompt(B, 0, B->tokens, MTP_PROMPT, steps, repeats, &same);
                if (r < 0)
                        return r;
                if (!same)
                        return log_error_errno(EPROTO, "generate: the greedy tokens with MTP on differ from MTP off");
                return 0;
        }
        for (size_t q = 0; q < B->n_questions; q++) {
                r = generate_prompt(B, (uint32_t) q + 1, B->q_ids[q], B->q_len[q], steps, repeats, &same);
                if (r < 0)
                        return r;
                if (!same)
                        log_error("--mtp-prompt: question %zu: the greedy tokens with MTP on differ from MTP off", q + 1);
                all_same &= same;
        }
        /* the sums over the questions, per mode */
        uint64_t tokens[2] = {}, drafted = 0, accepted = 0, prompt = 0;
        double ms[2] = {};
        for (size_t i = 0; i < B->n_gen; i++) {
                const struct gen_result *g = &B->gen[i];
                tokens[g->on] += g->tokens;
                ms[g->on] += g->ms;
                if (g->on)
                        drafted += g->drafted, accepted += g->accepted;
                else
                        prompt += g->prompt;
        }
        printf("{\"what\":\"generate_total\",\"mtp_draft\":%u,\"questions\":%zu,\"prompt\":%" PRIu64
               ",\"max_tokens\":%u,\"tokens\":%" PRIu64 ",\"ms_off\":%.3f,\"tok_s_off\":%.2f",
               B->mtp == 1 ? B->mtp_draft : 0, B->n_questions, prompt, steps, tokens[0], ms[0],
               tokens[0] / (ms[0] / 1000));
        if (B->mtp == 1)
                printf(",\"ms_on\":%.3f,\"tok_s_on\":%.2f,\"drafted\":%" PRIu64 ",\"accepted\":%" PRIu64
                       ",\"acceptance\":%.4f,\"speedup\":%.3f,\"same_tokens\":%s",
                       ms[1], tokens[1] / (ms[1] / 1000), drafted, accepted,
                       drafted ? (double) accepted / (double) drafted : 0.0, ms[0] / ms[1],
                       all_same ? "true" : "false");
        print_tail(B);
        if (!all_same)
                return log_error_errno(EPROTO, "--mtp-prompt: the greedy tokens with MTP on differ from MTP off");
        return 0;
}

/* --mtp-prompt: each question as the daemon renders a chat request with one user message
 * (daemon/engine/prepare.c prepare_chat; the template chosen as daemon/scheduler.c does: the
 * GGUF's tokenizer.chat_template when it parses, else the built-in Xing4 one), tokenized. */
static int chat_prompts(struct bench *B, const struct x4_model *model) {
        const struct gguf_file *g = x4_model_gguf(model);
        _cleanup_(chat_template_freep) struct chat_template *tmpl = NULL;
        char err[1024] = "";
        int r;

        r = tokenizer_new_from_gguf(g, &B->tok, err, sizeof err);
        if (r < 0)
                return log_error_errno(r, "--mtp-prompt: %s has no usable tokenizer (%s); a model with its "
                                       "tokenizer (tokenizer.ggml.*) expected, to render and tokenize the questions",
                                       B->model, err);
        if (gguf_kv_find(g, "tokenizer.chat_template")) {
                struct gguf_string t;
                if (gguf_get_string(g, "tokenizer.chat_template", &t) < 0 ||
                    chat_template_parse_len(t.data, t.len, &tmpl, err, sizeof err) < 0)
                        tmpl = NULL; /* the daemon warns and uses the built-in template */
        }
        B->q_gguf_template = tmpl != NULL;
        const char *bos = tokenizer_piece(B->tok, tokenizer_bos_id(B->tok), NULL);
        const char *eos = tokenizer_piece(B->tok, tokenizer_eos_id(B->tok), NULL);
        for (size_t q = 0; q < B->n_questions; q++) {
                const char *text = B->questions[q];
                _cleanup_(json_freep) struct json_value *msgs = json_new_array(), *ctx = NULL;
                _cleanup_free_ char *rendered = NULL;
                struct json_value *m = json_new_object();
                size_t n = 0;

                if (!msgs || !m || json_array_append(msgs, m) < 0) {
                        json_free(m);
                        return log_error_errno(ENOMEM, "out of memory");
                }
                if (json_object_set(m, "role", json_new_string("user", 4)) < 0 ||
                    json_object_set(m, "content", json_new_string(text, strlen(text))) < 0)
                        return log_error_errno(ENOMEM, "out of memory");
                r = chat_context_build(msgs, NULL, true, -1, bos, eos, &ctx, err, sizeof err);
                if (r >= 0)
                        r = tmpl ? chat_template_render(tmpl, ctx, &rendered, err, sizeof err)
                                 : chat_xing4_render(ctx, &rendered, err, sizeof err);
                if (r >= 0)
                        r = tokenizer_encode(B->tok, rendered, strlen(rendered), 0, &B->q_ids[q], &n, err, sizeof err);
                if (r < 0)
                        return log_error_errno(r, "--mtp-prompt: question %zu: %s", q + 1, err);
                if (n == 0 || n > UINT32_MAX / 2)
                        return log_error_errno(EINVAL, "--mtp-prompt: question %zu: %zu prompt tokens", q + 1, n);
                B->q_len[q] = (uint32_t) n;
        }
        return 0;
}

static void print_table(const struct bench *B) {
        printf("\nx4-bench  model %s  device %s  cache %s  commit %s%s\n", B->model, B->device,
               B->cache, B->commit, streq(B->cpu_math, "fast") ? "  cpu-math fast" : "");
        printf("%-8s %-22s %12s %14s %14s\n", "what", "shape", "tok/s", "ms", "cpu ms");
        for (size_t i = 0; i < B->n_results; i++) {
                const struct result *r = &B->results[i];
                char shape[64] = "";

                if (strcmp(r->what, "prefill") == 0)
                        snprintf(shape, sizeof shape, "%u tokens", r->len);
                else if (strcmp(r->what, "decode") == 0)
                        snprintf(shape, sizeof shape, "ctx %u batch %u", r->ctx, r->batch);
                if (strcmp(r->what, "load") == 0)
                        printf("%-8s %-22s %12s %14.1f\n", r->what, shape, "", r->ms);
                else if (strcmp(r->what, "prefill") == 0)
                        printf("%-8s %-22s %12.2f %14.2f %14.2f\n", r->what, shape, r->tok_s, r->ms, r->cpu_ms);
                else if (r->filled < r->ctx)
                        printf("%-8s %-22s %12.2f %14.2f %14.2f  per step; ctx: %u prefilled + page copies\n",
                               r->what, shape, r->tok_s, r->ms, r->cpu_ms, r->filled);
                else
                        printf("%-8s %-22s %12.2f %14.2f %14.2f  per step\n", r->what, shape, r->tok_s, r->ms,
                               r->cpu_ms);
        }
        for (size_t i = 0; i < B->n_profiles; i++) {
                const struct profile_result *p = &B->profiles[i];
                double sum = 0;

                for (uint32_t k = 0; k < p->n_classes; k++)
                        sum += p->classes[k].ms;
                if (p->prefill)
                        printf("\nprofile  prefill %u tokens: %.1f kernels, %.3f ms of kernel time per prefill\n",
                               p->len, p->kernels, sum);
                else
                        printf("\nprofile  decode ctx %u batch %u: %.1f kernels, %.3f ms of kernel time per step\n",
                               p->ctx, p->batch, p->kernels, sum);
                printf("  %-24s %9s %10s %7s %10s %8s\n", "class", "kernels", "ms", "share", "MB", "GB/s");
                for (uint32_t k = 0; k < p->n_classes; k++) {
                        printf("  %-24s %9.1f %10.4f %6.1f%%", p->classes[k].name, p->classes[k].kernels,
                               p->classes[k].ms, sum > 0 ? 100 * p->classes[k].ms / sum : 0);
                        if (p->classes[k].mb > 0)
                                printf(" %10.2f %8.0f\n", p->classes[k].mb, class_gbs(p->classes[k].mb, p->classes[k].ms));
                        else
                                printf(" %10s %8s\n", "-", "-");
                }
        }
        for (size_t i = 0; i < B->n_gen; i++) {
                const struct gen_result *g = &B->gen[i];
                if (i == 0 && !B->n_questions)
                        printf("\ngenerate (greedy, batch 1, prompt %u)\n", MTP_PROMPT);
                else if (i == 0)
                        printf("\ngenerate (greedy, batch 1, %zu chat questions, %s template)\n", B->n_questions,
                               B->q_gguf_template ? "the GGUF's" : "built-in Xing4");
                if (g->question && !g->on)
                        printf("  question %u (prompt %u tokens): %.60s\n", g->question, g->prompt,
                               B->questions[g->question - 1]);
                printf("  mtp %-3s draft %u  %u tokens%s  %10.2f tok/s", g->on ? "on" : "off", g->draft, g->tokens,
                       g->question ? (g->end ? " (end)" : " (length)") : "", g->tok_s);
                if (g->on)
                        printf("  acceptance %.1f%% (%" PRIu64 " of %" PRIu64 " drafts)  speed-up %.2fx",
                               g->drafted ? 100.0 * g->accepted / g->drafted : 0.0, g->accepted, g->drafted,
                               B->gen[i - 1].ms / g->ms);
                printf("\n");
        }
}

static int bench_tokenize(const char *model, const char *path, double seconds, const char *commit) {
        _cleanup_(tokenizer_freep) struct tokenizer *t = NULL;
        _cleanup_fclose_ FILE *f = NULL;
        _cleanup_free_ char *text = NULL;
        size_t len, n_ids;
        double bps;
        int r;

        r = tokenizer_load(model, &t);
        if (r < 0)
                return r;
        f = fopen(path, "rb");
        if (!f)
                return log_error_errno(errno, "%s: cannot open the text to tokenize: %m", path);
        if (tool_read_all(f, &text, &len) < 0)
                return log_error_errno(ENOMEM, "out of memory reading %s", path);
        if (len == 0)
                return log_error_errno(EINVAL, "%s: empty file, nothing to tokenize", path);
        r = tokenizer_bench(t, text, len, seconds, &bps, &n_ids);
        if (r < 0)
                return r;
        printf("{\"what\":\"tokenize\",\"bytes\":%zu,\"tokens\":%zu,\"MB_s\":%.2f,\"device\":\"cpu (1 thread)\","
               "\"model\":\"%s\",\"commit\":\"%s\"}\n",
               len, n_ids, bps / 1e6, model, commit);
        printf("\nx4-bench  tokenizer encode  %s: %zu bytes -> %zu tokens, %.2f MB/s (1 thread)\n",
               path, len, n_ids, bps / 1e6);
        return 0;
}

/* ---- --grammar ------------------------------------------------------------------------------ */

static uint64_t bench_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
        bench_rng ^= bench_rng << 13;
        bench_rng ^= bench_rng >> 7;
        bench_rng ^= bench_rng << 17;
        return bench_rng;
}

/* A 131,072-piece vocabulary with the make-up of a real multilingual one (see the header). */
static int dense_vocab(struct tokenizer **ret) {
        const uint32_t N = 131072;
        char **pieces = calloc(N, sizeof *pieces);
        size_t *lens = calloc(N, sizeof *lens);
        float *scores = calloc(N, sizeof *scores);
        int32_t *types = calloc(N, sizeof *types);
        uint32_t hcap = 1u << 19, n = 0;
        uint32_t *hash = calloc(hcap, sizeof *hash); /* id + 1 */
        char buf[64];
        int r = -ENOMEM;

        if (!pieces || !lens || !scores || !types || !hash)
                goto out;
#define ADD(text, type)                                                                              \
        do {                                                                                         \
                const char *t_ = (text);                                                             \
                size_t l_ = strlen(t_);                                                              \
                uint64_t h_ = 1469598103934665603ull;                                                \
                for (size_t i_ = 0; i_ < l_; i_++)                                                   \
                        h_ = (h_ ^ (uint8_t) t_[i_]) * 1099511628211ull;                             \
                uint32_t s_ = (uint32_t) h_ & (hcap - 1);                                            \
                bool dup_ = false;                                                                   \
                for (; hash[s_]; s_ = (s_ + 1) & (hcap - 1))                                         \
                        if (lens[hash[s_] - 1] == l_ && memcmp(pieces[hash[s_] - 1], t_, l_) == 0) { \
                                dup_ = true;                                                         \
                                break;                                                               \
                        }                                                                            \
                if (!dup_ && n < N) {                                                                \
                        if (!(pieces[n] = strdup(t_)))                                               \
                                goto out;                                                            \
                        lens[n] = l_;                                                                \
                        types[n] = (type);                                                           \
                        scores[n] = -(float) n;                                                      \
                        hash[s_] = ++n;                                                              \
                }                                                                                    \
        } while (0)
        static const char *const specials[] = { "<unk>", "<s>", "</s>" };
        for (int i = 0; i < 3; i++)
                ADD(specials[i], i == 0 ? TOKENIZER_PIECE_UNKNOWN : TOKENIZER_PIECE_CONTROL);
        for (const char *const *s = TOKENIZER_REGISTERED_SPECIALS; s < TOKENIZER_REGISTERED_SPECIALS + _TOKENIZER_SPECIAL_MAX; s++)
                ADD(*s, TOKENIZER_PIECE_CONTROL);
        for (unsigned b = 0; b < 256; b++) {
                snprintf(buf, sizeof buf, "<0x%02X>", b);
                ADD(buf, TOKENIZER_PIECE_BYTE);
        }
        ADD("\xe2\x96\x81", TOKENIZER_PIECE_NORMAL);
        for (char c = '!'; c <= '~'; c++) {
                char s[2] = { c, 0 };
                ADD(s, TOKENIZER_PIECE_NORMAL);
        }
        ADD("\n", TOKENIZER_PIECE_NORMAL);
        ADD("\t", TOKENIZER_PIECE_NORMAL);
        /* digit runs */
        for (unsigned i = 0; i < 1000; i++) {
                snprintf(buf, sizeof buf, "%u", i);
                ADD(buf, TOKENIZER_PIECE_NORMAL);
                snprintf(buf, sizeof buf, "%02u", i % 100);
                ADD(buf, TOKENIZER_PIECE_NORMAL);
        }
        /* JSON punctuation runs of 2 and 3 (space as ▁) */
        static const char *const punct[] = { "\"", ",", ":", "{", "}", "[", "]", "\xe2\x96\x81", "\n" };
        for (size_t a = 0; a < 9; a++)
                for (size_t b = 0; b < 9; b++) {
                        snprintf(buf, sizeof buf, "%s%s", punct[a], punct[b]);
                        ADD(buf, TOKENIZER_PIECE_NORMAL);
                        for (size_t c = 0; c < 9; c++) {
                                snprintf(buf, sizeof buf, "%s%s%s", punct[a], punct[b], punct[c]);
                                ADD(buf, TOKENIZER_PIECE_NORMAL);
                        }
                }
        /* whitespace runs */
        for (unsigned k = 2; k <= 16; k++) {
                buf[0] = 0;
                for (unsigned i = 0; i < k; i++)
                        strcat(buf, "\xe2\x96\x81");
                ADD(buf, TOKENIZER_PIECE_NORMAL);
        }
        /* CJK: 8,000 single characters, 12,000 pairs (U+4E00..) */
        for (unsigned i = 0; i < 20000; i++) {
                unsigned cps = i < 8000 ? 1 : 2, k = 0;
                for (unsigned j = 0; j < cps; j++) {
                        unsigned cp = 0x4e00 + (unsigned) (i < 8000 ? i : rng_next() % 8000);
                        buf[k++] = (char) (0xe0 | cp >> 12);
                        buf[k++] = (char) (0x80 | (cp >> 6 & 0x3f));
                        buf[k++] = (char) (0x80 | (cp & 0x3f));
                }
                buf[k] = 0;
                ADD(buf, TOKENIZER_PIECE_NORMAL);
        }
        /* pieces with quotes / backslashes inside words, as code and JSON corpora give */
        for (unsigned i = 0; i < 3000; i++) {
                unsigned k = 0, len = 1 + (unsigned) (rng_next() % 6);
                if (rng_next() % 2)
                        k += (unsigned) snprintf(buf, sizeof buf, "\xe2\x96\x81");
                for (unsigned j = 0; j < len; j++)
                        buf[k++] = (char) ('a' + rng_next() % 26);
                static const char *const tails[] = { "\"", "\",", "\":", "\\", "\\n", "\")", "\"}" };
                k += (unsigned) snprintf(buf + k, sizeof buf - k, "%s", tails[rng_next() % 7]);
                ADD(buf, TOKENIZER_PIECE_NORMAL);
        }
        /* Latin words, 60% with the space mark, accented letters now and then */
        while (n < N) {
                unsigned k = 0, len = 2 + (unsigned) (rng_next() % 9);
                if (rng_next() % 10 < 6)
                        k += (unsigned) snprintf(buf, sizeof buf, "\xe2\x96\x81");
                for (unsigned j = 0; j < len; j++) {
                        uint64_t x = rng_next();
                        if (x % 40 == 0)
                                k += (unsigned) snprintf(buf + k, sizeof buf - k, "\xc3\xa9");
                        else
                                buf[k++] = (char) ((j == 0 && x % 7 == 0 ? 'A' : 'a') + (x >> 8) % 26);
                }
                buf[k] = 0;
                ADD(buf, TOKENIZER_PIECE_NORMAL);
        }
#undef ADD
        {
                struct tokenizer_vocab v = { .n = N, .pieces = (const char *const *) pieces, .piece_lens = lens,
                                             .scores = scores, .types = types, .unk_id = 0, .bos_id = 1,
                                             .eos_id = 2, .pad_id = -1, .add_space_prefix = true };
                r = tokenizer_new(&v, ret);
        }
out:
        for (uint32_t i = 0; pieces && i < N; i++)
                free(pieces[i]);
        free(pieces);
        free(lens);
        free(scores);
        free(types);
        free(hash);
        return r;
}

static double thread_us(void) {
        struct timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static double pct(double *v, size_t n, double p) {
        qsort(v, n, sizeof *v, cmp_double);
        size_t i = (size_t) (p * (double) (n - 1) + 0.5);
        return v[MIN(i, n - 1)];
}

static int bench_grammar(const char *which, const char *model, uint32_t seqs, bool json,
                         const char *commit) {
        static const struct {
                const char *name, *schema, *tools; /* tools: a forced call of them (native syntax) */
        } schemas[] = {
                { "flat", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                          "\"age\":{\"type\":\"integer\"},\"email\":{\"type\":[\"string\",\"null\"]},"
                          "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},\"tags\":{\"type\":\"array\","
                          "\"items\":{\"type\":\"string\"}}},\"required\":[\"name\",\"age\",\"email\",\"role\","
                          "\"tags\"],\"additionalProperties\":false}" },
                { "nested", "{\"$defs\":{\"item\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":"
                            "\"integer\"},\"price\":{\"type\":\"number\"},\"note\":{\"anyOf\":[{\"type\":"
                            "\"string\"},{\"type\":\"null\"}]}},\"required\":[\"id\",\"price\",\"note\"],"
                            "\"additionalProperties\":false}},\"type\":\"object\",\"properties\":{\"order\":"
                            "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":"
                            "{\"$ref\":\"#/$defs/item\"},\"minItems\":1},\"paid\":{\"type\":\"boolean\"}},"
                            "\"required\":[\"items\",\"paid\"],\"additionalProperties\":false}},\"required\":"
                            "[\"order\"],\"additionalProperties\":false}" },
                { "json_object", NULL, NULL },
                { "tool_call", NULL, "[{\"name\":\"search\",\"parameters\":{\"type\":\"object\",\"properties\":"
                                     "{\"query\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\"},"
                                     "\"lang\":{\"enum\":[\"en\",\"de\",\"fr\"]}},\"required\":[\"query\","
                                     "\"limit\"]}},{\"name\":\"read_file\",\"parameters\":{\"type\":\"object\","
                                     "\"properties\":{\"path\":{\"type\":\"string\"}},\"required\":[\"path\"]}}]" },
        };
        _cleanup_(tokenizer_freep) struct tokenizer *t = NULL;
        _cleanup_(grammar_vocab_freep) struct grammar_vocab *v = NULL;
        int r;

        if (streq(which, "dense"))
                r = dense_vocab(&t);
        else if (streq(which, "full")) {
                struct x4_mkmodel_vocab mv;
                r = x4_mkmodel_vocab_build(131072, &mv);
                if (r >= 0) {
                        _cleanup_free_ size_t *lens = calloc(mv.n, sizeof *lens);
                        if (!lens)
                                r = -ENOMEM;
                        for (uint32_t i = 0; lens && i < mv.n; i++)
                                lens[i] = strlen(mv.pieces[i]);
                        struct tokenizer_vocab tv = { .n = mv.n, .pieces = (const char *const *) mv.pieces,
                                                      .piece_lens = lens, .scores = mv.scores, .types = mv.types,
                                                      .unk_id = 0, .bos_id = 1, .eos_id = 2, .pad_id = 3,
                                                      .add_space_prefix = true };
                        if (lens)
                                r = tokenizer_new(&tv, &t);
                        x4_mkmodel_vocab_free(&mv);
                }
        } else if (streq(which, "model")) {
                if (!model)
                        return log_error_errno(EINVAL, "--grammar model: --model is required");
                r = tokenizer_load(model, &t);
        } else
                return log_error_errno(EINVAL, "--grammar: '%s' is not a vocabulary; dense, full or model expected",
                                       which);
        if (r < 0)
                return log_error_errno(r, "--grammar %s: cannot build the tokenizer: %s", which, log_last_error());
        double t1 = thread_us();
        if ((r = grammar_vocab_new(t, &v)) < 0)
                return log_error_errno(r, "--grammar: cannot index the vocabulary");
        double trie_ms = (thread_us() - t1) / 1e3;
        uint32_t nv = grammar_vocab_n(v), words = (uint32_t) DIV_ROUND_UP(nv, 64);
        _cleanup_free_ uint64_t *mask = malloc(words * sizeof *mask);
        _cleanup_free_ float *logits = malloc(nv * sizeof *logits);
        _cleanup_free_ double *tc = malloc((size_t) seqs * 256 * sizeof *tc), *tu = malloc((size_t) seqs * 256 * sizeof *tu);
        _cleanup_free_ double *ta = malloc((size_t) seqs * 256 * sizeof *ta);
        if (!mask || !logits || !tc || !tu || !ta)
                return log_error_errno(ENOMEM, "--grammar: out of memory");
        int32_t eos = tokenizer_eos_id(t);

        for (uint32_t i = 0; i < nv; i++)
                logits[i] = (float) (i % 13);
        char table[ELEMENTSOF(schemas)][160];
        for (size_t s = 0; s < ELEMENTSOF(schemas); s++) {
                _cleanup_(grammar_freep) struct grammar *g = NULL;
                char err[256];
                r = schemas[s].tools  ? grammar_compile_tool(schemas[s].tools, NULL, t, &g, err, sizeof err)
                    : schemas[s].schema ? grammar_compile_schema(schemas[s].schema, strlen(schemas[s].schema), &g, err, sizeof err)
                                        : grammar_compile_json_object(&g);
                if (r < 0)
                        return log_error_errno(r, "--grammar: schema %s: %s", schemas[s].name, err);
                size_t n = 0, done = 0;
                for (uint32_t q = 0; q < seqs; q++) {
                        _cleanup_(grammar_matcher_freep) struct grammar_matcher *m = NULL;
                        _cleanup_(grammar_matcher_freep) struct grammar_matcher *u = NULL;
                        if (grammar_matcher_new(g, v, &eos, 1, &m) < 0 || grammar_matcher_new(g, v, &eos, 1, &u) < 0)
                                return log_error_errno(ENOMEM, "--grammar: out of memory");
                        grammar_matcher_set_cache(u, false);
                        for (uint32_t left = 256; left > 0; left--) {
                                double a = thread_us();
                                int cnt = grammar_matcher_mask(u, left, mask);
                                tu[n] = thread_us() - a;
                                a = thread_us();
                                cnt = grammar_matcher_mask(m, left, mask);
                                tc[n] = thread_us() - a;
                                a = thread_us();
                                grammar_mask_apply(mask, logits, nv);
                                ta[n++] = thread_us() - a;
                                if (cnt <= 0)
                                        return log_error_errno(EPROTO, "--grammar: schema %s: no token allowed", schemas[s].name);
                                uint32_t pick = (uint32_t) (rng_next() % (uint64_t) cnt), k = 0;
                                int32_t id = -1;
                                for (uint32_t w = 0; w < words && id < 0; w++) {
                                        uint32_t c = (uint32_t) __builtin_popcountll(mask[w]);
                                        if (k + c <= pick) {
                                                k += c;
                                                continue;
                                        }
                                        for (uint32_t b = 0; b < 64; b++)
                                                if (mask[w] >> b & 1 && k++ == pick) {
                                                        id = (int32_t) (w * 64 + b);
                                                        break;
                                                }
                                }
                                if (grammar_matcher_accept(m, id) < 0 || grammar_matcher_accept(u, id) < 0)
                                        return log_error_errno(EPROTO, "--grammar: token %d was allowed but refused", id);
                                if (grammar_matcher_ended(m)) {
                                        done++;
                                        break;
                                }
                        }
                }
                double p50 = pct(tc, n, 0.5), p99 = pct(tc, n, 0.99), mx = tc[n - 1];
                double u50 = pct(tu, n, 0.5), u99 = pct(tu, n, 0.99), apply_us = pct(ta, n, 0.5);
                snprintf(table[s], sizeof table[s], "  %-12s %8zu %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n",
                         schemas[s].name, n, p50, p99, mx, u50, u99, apply_us);
                printf("{\"what\":\"grammar_mask\",\"vocab\":\"%s\",\"n_vocab\":%u,\"schema\":\"%s\","
                        "\"tokens\":%zu,\"sequences\":%u,\"ended\":%zu,\"p50_us\":%.2f,\"p99_us\":%.2f,"
                        "\"max_us\":%.2f,\"nocache_p50_us\":%.2f,\"nocache_p99_us\":%.2f,\"apply_us\":%.2f,"
                        "\"trie_ms\":%.1f,\"device\":\"cpu (1 thread)\",\"commit\":\"%s\"}\n",
                        which, nv, schemas[s].name, n, seqs, done, p50, p99, mx, u50, u99, apply_us, trie_ms, commit);
                fflush(stdout);
        }
        if (json)
                return 0;
        printf("\nx4-bench  constrained-decoding mask per token, vocabulary %s: %u ids (1 thread; trie built "
               "in %.0f ms)\n"
               "  %-12s %8s %10s %10s %10s %10s %10s %10s\n", which, nv, trie_ms, "schema", "tokens",
               "p50 us", "p99 us", "max us", "nocache50", "nocache99", "apply50");
        for (size_t s = 0; s < ELEMENTSOF(schemas); s++)
                fputs(table[s], stdout);
        return 0;
}

static void usage(FILE *f) {
        fputs("usage: x4-bench --model M.gguf [--config C.json] [--assume-release-defaults]\n"
              "                [--device cpu|cuda] [--threads N] [--cache f32|f16] [--cpu-math fp32|fast]\n"
              "                [--prefill 512,4096] [--decode-ctx 512,4096] [--batch 1,16]\n"
              "                [--decode-tokens 32] [--decode-prefill-max 4096] [--repeats 3]\n"
              "                [--warmup 0|1] [--profile] [--json] [--mtp off|on] [--mtp-draft N]\n"
              "                [--mtp-verify] [--mtp-prompt TEXT]...\n"
              "       x4-bench --model M.gguf --tokenize TEXT_FILE [--seconds 3]\n"
              "       x4-bench --grammar dense|full|model [--model M.gguf] [--grammar-seqs 20] [--json]\n"
              "\n"
              "  --cache f32|f16           the backend's latent cache type (default: the daemon's,\n"
              "                            f16 on cuda, f32 on cpu: its only type)\n"
              "  --cpu-math fp32|fast      the cpu backend's numerics (default fp32, the reference;\n"
              "                            fast: BF16 products on bf16 activations, xing4d(8))\n"
              "  --decode-prefill-max N    decode setup: prefill at most N tokens of the context\n"
              "                            (default 4096, at least 256 = one cache page); a longer\n"
              "                            context is N rounded down to whole pages, prefilled, and\n"
              "                            page copies of them up to the context length. A decode\n"
              "                            step's work depends on the context length, not on the\n"
              "                            cached values.\n"
              "  --prefill/--decode-ctx/--batch none   skip those measurements\n"
              "  --warmup 0|1              run each shape once untimed first (default 1); 0 for\n"
              "                            shapes whose one run takes minutes (a 32K prefill)\n"
              "  --profile                 after each measurement, one more untimed run of the same\n"
              "                            shape with the backend's profiling on: kernels per decode\n"
              "                            step (per prefill) and time per kernel class\n"
              "  --mtp off|on              also a greedy generation of --decode-tokens tokens at batch 1:\n"
              "                            on: speculative decoding with the NextN block (after the\n"
              "                            same run with it off): tok/s, acceptance, speed-up\n"
              "  --mtp-draft N             drafts per step with --mtp on, 1..3 (default 1)\n"
              "  --mtp-prompt TEXT         (repeatable, needs --mtp) the generate measurement on chat\n"
              "                            questions instead of the synthetic prompt: each TEXT a user\n"
              "                            message, rendered with the model's chat template as the\n"
              "                            daemon does (generation prompt on), greedy up to\n"
              "                            --decode-tokens tokens or the end of the turn; per question\n"
              "                            and in total: tokens, tok/s off and on, drafted, accepted,\n"
              "                            acceptance, speed-up; exit 1 if on and off differ. The\n"
              "                            model needs its tokenizer (and the NextN block for on)\n"
              "  --mtp-verify              with --mtp on, at every decode shape: the cost of verifying\n"
              "                            1, 2, 3 drafts and of a NextN draft forward against the\n"
              "                            decode step, and the projected speed-up at acceptance\n"
              "                            0.6, 0.75, 0.9\n",
              f);
}

int main(int argc, char **argv) {
        static const struct option options[] = {
                { "model", required_argument, NULL, 'm' },
                { "config", required_argument, NULL, 'c' },
                { "assume-release-defaults", no_argument, NULL, 'R' },
                { "device", required_argument, NULL, 'D' },
                { "threads", required_argument, NULL, 't' },
                { "prefill", required_argument, NULL, 'p' },
                { "decode-ctx", required_argument, NULL, 'x' },
                { "batch", required_argument, NULL, 'b' },
                { "decode-tokens", required_argument, NULL, 'n' },
                { "repeats", required_argument, NULL, 'r' },
                { "cache", required_argument, NULL, 'C' },
                { "cpu-math", required_argument, NULL, 'K' },
                { "decode-prefill-max", required_argument, NULL, 'P' },
                { "profile", no_argument, NULL, 'F' },
                { "warmup", required_argument, NULL, 'W' },
                { "json", no_argument, NULL, 'j' },
                { "tokenize", required_argument, NULL, 'T' },
                { "seconds", required_argument, NULL, 'S' },
                { "grammar", required_argument, NULL, 'G' },
                { "grammar-seqs", required_argument, NULL, 'g' },
                { "mtp", required_argument, NULL, 'M' },
                { "mtp-draft", required_argument, NULL, 'd' },
                { "mtp-verify", no_argument, NULL, 'V' },
                { "mtp-prompt", required_argument, NULL, 'Q' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        static struct bench B;
        struct x4_model_params mp = {};
        _cleanup_(x4_model_freep) struct x4_model *model = NULL;
        uint32_t prefill[MAX_LIST] = { 512, 4096 }, ctxs[MAX_LIST] = { 512, 4096 }, batches[MAX_LIST] = { 1, 16 };
        size_t n_prefill = 2, n_ctx = 2, n_batch = 2;
        uint32_t threads = 0, steps = 32, repeats = 3, max_len = 1, max_batch = 1, max_ctx = 0;
        uint32_t cache_type = X4_CACHE_F32;
        bool cache_given = false;
        const char *device = "cpu", *tokenize = NULL, *grammar = NULL;
        uint32_t grammar_seqs = 20;
        double seconds = 3;
        int c, r = 0;

        log_set_max_level(LOG_CRIT);
        log_max_level_from_env(); /* X4_LOG_LEVEL=warning: the backend's warnings too */
        B.cache = "f32";
        B.cpu_math = "fp32";
        B.prefill_max = 4096;
        B.mtp = -1;
        B.mtp_draft = 1;
        B.warmup = true;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                if (tool_model_option(c, optarg, &mp, &device))
                        continue;
                switch (c) {
                case 't':
                        r = parse_opt_u32("--threads", optarg, 1, &threads);
                        break;
                case 'p':
                        r = parse_list("--prefill", optarg, prefill, &n_prefill);
                        break;
                case 'x':
                        r = parse_list("--decode-ctx", optarg, ctxs, &n_ctx);
                        break;
                case 'b':
                        r = parse_list("--batch", optarg, batches, &n_batch);
                        break;
                case 'n':
                        r = parse_opt_u32("--decode-tokens", optarg, 1, &steps);
                        break;
                case 'r':
                        r = parse_opt_u32("--repeats", optarg, 1, &repeats);
                        break;
                case 'W':
                        if (streq(optarg, "0") || streq(optarg, "1"))
                                B.warmup = optarg[0] == '1';
                        else
                                r = log_error_errno(EINVAL, "--warmup: '%s' is not 0 or 1", optarg);
                        break;
                case 'j':
                        B.json = true;
                        break;
                case 'C':
                        cache_given = true;
                        if (streq(optarg, "f32"))
                                cache_type = X4_CACHE_F32, B.cache = "f32";
                        else if (streq(optarg, "f16"))
                                cache_type = X4_CACHE_F16, B.cache = "f16";
                        else
                                r = log_error_errno(EINVAL, "--cache: '%s' is not a cache type; f32 or f16 expected",
                                                    optarg);
                        break;
                case 'K':
                        if (streq(optarg, "fp32") || streq(optarg, "fast"))
                                B.cpu_math = streq(optarg, "fp32") ? "fp32" : "fast";
                        else
                                r = log_error_errno(EINVAL, "--cpu-math: '%s', fp32 or fast expected", optarg);
                        break;
                case 'P':
                        /* at least one page: a longer context is prefilled in whole pages */
                        r = parse_opt_u32("--decode-prefill-max", optarg, PAGE_TOKENS, &B.prefill_max);
                        break;
                case 'F':
                        B.profile = true;
                        break;
                case 'T':
                        tokenize = optarg;
                        break;
                case 'G':
                        grammar = optarg;
                        break;
                case 'g':
                        r = parse_opt_u32("--grammar-seqs", optarg, 1, &grammar_seqs);
                        break;
                case 'M':
                        if (streq(optarg, "on") || streq(optarg, "off"))
                                B.mtp = streq(optarg, "on");
                        else
                                r = log_error_errno(EINVAL, "--mtp: '%s', off or on expected", optarg);
                        break;
                case 'd':
                        r = parse_opt_u32("--mtp-draft", optarg, 1, &B.mtp_draft);
                        if (r >= 0 && B.mtp_draft > 3)
                                r = log_error_errno(EINVAL, "--mtp-draft: '%s' is not an integer in [1, 3]", optarg);
                        break;
                case 'V':
                        B.mtp_verify = true;
                        break;
                case 'Q':
                        if (!optarg[0])
                                r = log_error_errno(EINVAL, "--mtp-prompt: an empty question; a non-empty text expected");
                        else if (B.n_questions == MAX_PROMPTS)
                                r = log_error_errno(E2BIG, "--mtp-prompt: more than %d questions", MAX_PROMPTS);
                        else
                                B.questions[B.n_questions++] = optarg;
                        break;
                case 'S': {
                        char *end;
                        seconds = strtod(optarg, &end);
                        if (*end || !(seconds > 0 && seconds <= 3600))
                                r = log_error_errno(EINVAL, "--seconds '%s': a number of seconds in (0, 3600] expected", optarg);
                        break;
                }
                default:
                        return tool_usage_exit(c, usage);
                }
                if (r < 0)
                        goto fail;
        }
        if (grammar && optind == argc) {
                find_commit(B.commit, sizeof B.commit);
                r = bench_grammar(grammar, mp.path, grammar_seqs, B.json, B.commit);
                if (r < 0)
                        goto fail;
                return 0;
        }
        if (optind < argc) {
                log_error("unexpected argument '%s'", argv[optind]);
                goto fail;
        }
        if (!mp.path) {
                log_error("--model is required");
                goto fail;
        }
        if (B.mtp_verify && B.mtp != 1) {
                log_error("--mtp-verify needs --mtp on (it times the NextN draft forward too)");
                goto fail;
        }
        if (B.n_questions && B.mtp < 0) {
                log_error("--mtp-prompt needs --mtp off|on (it replaces the generate measurement's prompt)");
                goto fail;
        }

        for (size_t i = 0; i < n_prefill; i++)
                max_len = MAX(max_len, prefill[i]);
        /* decode measurements are the contexts × the batches: none when either list is none */
        for (size_t i = 0; n_batch > 0 && i < n_ctx; i++)
                max_ctx = MAX(max_ctx, ctxs[i]);
        for (size_t i = 0; n_ctx > 0 && i < n_batch; i++)
                max_batch = MAX(max_batch, batches[i]);

        find_commit(B.commit, sizeof B.commit);
        if (tokenize) {
                r = bench_tokenize(mp.path, tokenize, seconds, B.commit);
                if (r < 0)
                        goto fail;
                return 0;
        }
        {
                _cleanup_free_ char *copy = strdup(mp.path);
                snprintf(B.model, sizeof B.model, "%s", copy ? basename(copy) : mp.path);
        }

        double t0 = now_s();
        r = x4_model_open(&mp, &model, NULL, 0);
        if (r < 0)
                goto fail;
        const struct x4_config *cfg = x4_model_config(model);
        B.n_vocab = cfg->n_vocab;
        if (B.mtp == 1 && !x4_model_weights(model)->has_nextn) {
                log_error("--mtp on: %s has no NextN block (nextn_predict_layers %u, or its tensors missing); "
                          "a model with the NextN block expected", B.model, cfg->n_nextn);
                goto fail;
        }
        if (B.n_questions && (r = chat_prompts(&B, model)) < 0)
                goto fail;
        {
                /* general.name for the JSON lines: printable ASCII kept, quotes and backslashes
                 * and everything else dropped (it is a label, not data) */
                struct gguf_string gn = {};
                size_t k = 0;
                if (gguf_get_string(x4_model_gguf(model), "general.name", &gn) >= 0)
                        for (uint64_t i = 0; i < gn.len && k + 1 < sizeof B.model_name; i++) {
                                char ch = gn.data[i];
                                if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\')
                                        B.model_name[k++] = ch;
                        }
                B.model_name[k] = 0;
        }
        r = x4_backend_get(device, &B.ops, NULL, 0);
        /* the cache the daemon gives the backend unless told (daemon/main.c): f16 on CUDA */
        if (r >= 0 && !cache_given && streq(B.ops->name, "cuda"))
                cache_type = X4_CACHE_F16, B.cache = "f16";
        if (r < 0)
                goto fail;
        /* Cache slots, exactly what the measurements use: sequence 0 runs every prefill and is the
         * decode source, max_batch - 1 batch-mates hold a decode context; a decode run writes
         * positions ctx .. ctx + steps - 1 */
        /* --mtp-verify rewrites positions ctx .. ctx + 3 */
        uint64_t dec_tokens = (uint64_t) max_ctx + MAX(steps, B.mtp_verify ? 4u : 0u), seq0_tokens = MAX((uint64_t) max_len, dec_tokens);
        if (B.mtp >= 0) { /* the generate run: prompt, tokens, drafts past the last */
                uint32_t longest = B.n_questions ? 0 : MTP_PROMPT;
                for (size_t q = 0; q < B.n_questions; q++)
                        longest = MAX(longest, B.q_len[q]);
                seq0_tokens = MAX(seq0_tokens, (uint64_t) longest + steps + 4);
        }
        uint64_t n_pages = DIV_ROUND_UP(seq0_tokens, PAGE_TOKENS) +
                           (uint64_t) (max_batch - 1) * DIV_ROUND_UP(dec_tokens, PAGE_TOKENS);
        char need[256];

        if (max_batch == 1)
                snprintf(need, sizeof need, "one sequence of %" PRIu64 " tokens (%s)", seq0_tokens,
                         max_len > dec_tokens ? "prefill" : "decode context + steps");
        else if (max_len > dec_tokens)
                snprintf(need, sizeof need, "sequence 0 of %u tokens (prefill) and %u more of %" PRIu64
                         " tokens (decode at ctx %u + %u steps, batch %u)",
                         max_len, max_batch - 1, dec_tokens, max_ctx, steps, max_batch);
        else
                snprintf(need, sizeof need, "%u sequences of %" PRIu64 " tokens (decode at ctx %u + %u steps, batch %u)",
                         max_batch, dec_tokens, max_ctx, steps, max_batch);
        if (n_pages > UINT32_MAX) {
                log_error("%" PRIu64 " cache pages of %u tokens for %s: more than %u pages", n_pages, PAGE_TOKENS,
                          need, UINT32_MAX);
                goto fail;
        }
        B.pages0 = (uint32_t) DIV_ROUND_UP(seq0_tokens, PAGE_TOKENS);
        B.pages_dec = (uint32_t) DIV_ROUND_UP(dec_tokens, PAGE_TOKENS);
        struct x4_backend_params bp = {
                .n_threads = threads,
                .page_tokens = PAGE_TOKENS,
                .n_pages = (uint32_t) n_pages,
                .cache_type = cache_type,
                .log = x4_backend_params_default_log,
                .mtp = B.mtp == 1,
                .cpu_math = streq(B.cpu_math, "fast") ? X4_CPU_MATH_FAST : X4_CPU_MATH_FP32,
        };
        B.n_embd = cfg->n_embd;
        r = B.ops->create(model, &bp, &B.b, NULL, 0);
        if (r < 0) {
                char what[512];

                snprintf(what, sizeof what, "%s backend, --cache %s, %u pages of %u tokens for %s", B.ops->name,
                         B.cache, bp.n_pages, PAGE_TOKENS, need);
                backend_error(r, what);
                goto fail;
        }
        double load_s = now_s() - t0;

        struct x4_backend_caps caps;
        B.ops->caps(B.b, &caps);
        if (streq(caps.name, "cpu")) {
                long n = threads ? (long) threads : sysconf(_SC_NPROCESSORS_ONLN);
                snprintf(B.device, sizeof B.device, "cpu (%ld thread%s)", n, n == 1 ? "" : "s");
        } else
                snprintf(B.device, sizeof B.device, "%s", caps.name);
        B.prompt_class = caps.prompt_class;
        B.pass_tokens = caps.max_batch_tokens;

        /* tokens: the longest prefill, the decode setup's prefill, one per sequence of a batch */
        uint32_t n_tokens = MAX(MAX(MAX(max_len, MIN(max_ctx, B.prefill_max)), max_batch), MTP_PROMPT);
        B.pages = calloc(bp.n_pages, sizeof *B.pages);
        B.tokens = calloc(n_tokens, sizeof *B.tokens);
        /* the backend's host memory, as the daemon's (page-locked on CUDA: the logits copy runs at
         * the bus's rate) */
        B.logits = x4_host_alloc(B.ops, B.b, (size_t) max_batch * B.n_vocab * sizeof(float));
        if (B.logits)
                memset(B.logits, 0, (size_t) max_batch * B.n_vocab * sizeof(float));
        if (!B.pages || !B.tokens || !B.logits) {
                log_error("out of memory");
                goto fail_b;
        }
        for (uint32_t i = 0; i < bp.n_pages; i++)
                B.pages[i] = i;
        for (uint32_t i = 0, x = 1; i < n_tokens; i++) {
                x = x * 1103515245u + 12345u;
                B.tokens[i] = (int32_t) ((x >> 8) % B.n_vocab);
        }

        report(&B, "load", 0, 0, 0, 0, 0, load_s * 1000, 0);
        /* page in the weights once before any timing */
        r = run_seq(&B, 0, 1, 0, X4_LOGITS_LAST);
        if (r < 0)
                goto fail_b;
        for (size_t i = 0; i < n_prefill; i++)
                if ((r = bench_prefill(&B, prefill[i], repeats)) < 0)
                        goto fail_b;
        for (size_t i = 0; i < n_ctx; i++)
                for (size_t j = 0; j < n_batch; j++)
                        if ((r = bench_decode(&B, ctxs[i], batches[j], steps, repeats)) < 0)
                                goto fail_b;
        if (B.mtp >= 0 && (r = bench_generate(&B, steps, repeats)) < 0)
                goto fail_b;
        if (!B.json)
                print_table(&B);
        x4_host_free(B.ops, B.b, B.logits);
        B.ops->destroy(B.b);
        return 0;

fail_b:
        x4_host_free(B.ops, B.b, B.logits);
        B.ops->destroy(B.b);
fail:
        return tool_fail("x4-bench");
}
