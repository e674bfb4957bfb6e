/* SPDX-License-Identifier: MIT */
/* x4-bench: prefill and decode rates of a backend on a model (conventions.md "Benchmarks").
 *
 *   x4-bench --model M.gguf [--config C.json] [--assume-release-defaults] [--device cpu|cuda]
 *            [--threads N] [--prefill 512,4096] [--decode-ctx 512,4096] [--batch 1,16]
 *            [--decode-tokens 32] [--repeats 3] [--json]
 *   x4-bench --model M.gguf --tokenize TEXT_FILE [--seconds 3]
 *
 * --tokenize: the tokenizer's encode speed instead (one thread, the GGUF's vocabulary, the file
 * encoded as one text repeatedly for --seconds; issue 3 asks for >= 10 MB/s).
 * Prefill: one forward of L prompt tokens from position 0 (the backend micro-batches as it likes),
 * rate L / time. Decode at context C with batch B: B independent sequences, each holding C cached
 * tokens (sequence 0 is prefilled once, the others get copies of its pages), step together one
 * token each for --decode-tokens steps; rate B·steps / time. Every number is the median of
 * --repeats runs after a warm-up run. One JSON line per measurement on stdout as it completes
 * (including the load time), then a human table (--json: the JSON lines only). Each measurement
 * also gives the process CPU time (all threads) of the same run, "cpu_ms": on a shared machine
 * it shows what the work cost when the wall clock mostly measures waiting for a core.
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
#include "model/tokenizer.h"
#include "model/xing4.h"
#include "util/log.h"
#include "util/macro.h"

#define PAGE_TOKENS 256u
#define MAX_LIST 32
#define MAX_RESULTS 256

struct result {
        char what[16];
        uint32_t len, ctx, batch;
        double tok_s, ms, cpu_ms;
};

struct bench {
        const struct x4_backend_ops *ops;
        struct x4_backend *b;
        uint32_t n_vocab;
        uint32_t pages_per_seq;
        uint32_t *pages; /* seq i owns pages[i * pages_per_seq ...] */
        int32_t *tokens;
        float *logits;
        char device[128], model[256], commit[64];
        bool json;
        struct result results[MAX_RESULTS];
        size_t n_results;
};

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
        for (;;) {
                char *end;
                unsigned long long x;

                errno = 0;
                x = strtoull(p, &end, 10);
                if (end == p || errno || x == 0 || x > UINT32_MAX / 2 || *p == '-' ||
                    (*end != ',' && *end != '\0') || *n == MAX_LIST)
                        return log_error_errno(EINVAL,
                                               "%s: '%s' is not a comma-separated list of at most %d positive integers",
                                               opt, s, MAX_LIST);
                v[(*n)++] = (uint32_t) x;
                if (*end == '\0')
                        return 0;
                p = end + 1;
        }
}

static int parse_u32(const char *opt, const char *s, uint32_t min, uint32_t *ret) {
        size_t n;
        uint32_t v[MAX_LIST];
        int r = parse_list(opt, s, v, &n);

        if (r < 0 || n != 1 || v[0] < min)
                return log_error_errno(EINVAL, "%s: '%s' is not an integer >= %u", opt, s, min);
        *ret = v[0];
        return 0;
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

static void report(struct bench *B, const char *what, uint32_t len, uint32_t ctx, uint32_t batch,
                   double tok_s, double ms, double cpu_ms) {
        struct result *r;

        if (strcmp(what, "load") == 0)
                printf("{\"what\":\"load\",\"s\":%.3f", ms / 1000);
        else if (strcmp(what, "prefill") == 0)
                printf("{\"what\":\"prefill\",\"tokens\":%u,\"tok_s\":%.2f,\"ms\":%.3f", len, tok_s, ms);
        else
                printf("{\"what\":\"decode\",\"ctx\":%u,\"batch\":%u,\"tok_s\":%.2f,\"ms_per_step\":%.3f",
                       ctx, batch, tok_s, ms);
        if (strcmp(what, "load") != 0)
                printf(",\"cpu_ms\":%.3f", cpu_ms);
        printf(",\"device\":\"%s\",\"model\":\"%s\",\"commit\":\"%s\"}\n", B->device, B->model, B->commit);
        fflush(stdout);
        if (B->n_results == MAX_RESULTS)
                return;
        r = &B->results[B->n_results++];
        snprintf(r->what, sizeof r->what, "%s", what);
        r->len = len;
        r->ctx = ctx;
        r->batch = batch;
        r->tok_s = tok_s;
        r->ms = ms;
        r->cpu_ms = cpu_ms;
}

static int run_seq(struct bench *B, uint32_t seq_slot, uint32_t n, uint32_t pos0, uint32_t mode) {
        struct x4_seq s = {
                .tokens = B->tokens,
                .n_tokens = n,
                .pos0 = pos0,
                .pages = B->pages + (size_t) seq_slot * B->pages_per_seq,
                .n_pages = B->pages_per_seq,
                .logits = mode,
        };
        struct x4_batch batch = { .seqs = &s, .n_seqs = 1 };

        return B->ops->forward(B->b, &batch, B->logits);
}

static int bench_prefill(struct bench *B, uint32_t len, uint32_t repeats) {
        _cleanup_free_ double *t = calloc(repeats, sizeof *t), *ct = calloc(repeats, sizeof *ct);
        int r;

        if (!t || !ct)
                return log_error_errno(ENOMEM, "out of memory");
        /* warm-up: the same shape once */
        r = run_seq(B, 0, len, 0, X4_LOGITS_LAST);
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
        report(B, "prefill", len, 0, 0, len / m, m * 1000, median(ct, repeats) * 1000);
        return 0;
}

static int bench_decode(struct bench *B, uint32_t ctx, uint32_t batch, uint32_t steps,
                        uint32_t repeats) {
        _cleanup_free_ struct x4_seq *seqs = calloc(batch, sizeof *seqs);
        _cleanup_free_ double *t = calloc(repeats, sizeof *t), *ct = calloc(repeats, sizeof *ct);
        uint32_t used = DIV_ROUND_UP(ctx, PAGE_TOKENS);
        int r;

        if (!seqs || !t || !ct)
                return log_error_errno(ENOMEM, "out of memory");
        /* C cached tokens: prefill sequence 0 once, copy its pages to the others */
        r = run_seq(B, 0, ctx, 0, X4_LOGITS_NONE);
        if (r < 0)
                return r;
        for (uint32_t i = 1; i < batch; i++)
                for (uint32_t k = 0; k < used; k++) {
                        r = B->ops->page_copy(B->b, B->pages[(size_t) i * B->pages_per_seq + k], B->pages[k]);
                        if (r < 0)
                                return r;
                }
        for (uint32_t i = 0; i < batch; i++)
                seqs[i] = (struct x4_seq) {
                        .tokens = B->tokens + i,
                        .n_tokens = 1,
                        .pages = B->pages + (size_t) i * B->pages_per_seq,
                        .n_pages = B->pages_per_seq,
                        .logits = X4_LOGITS_LAST,
                };
        struct x4_batch bt = { .seqs = seqs, .n_seqs = batch };

        /* run 0 is the warm-up; every run rewrites positions ctx .. ctx+steps-1 */
        for (uint32_t rep = 0; rep <= repeats; rep++) {
                double t0 = now_s(), c0 = cpu_s();

                for (uint32_t s = 0; s < steps; s++) {
                        for (uint32_t i = 0; i < batch; i++)
                                seqs[i].pos0 = ctx + s;
                        r = B->ops->forward(B->b, &bt, B->logits);
                        if (r < 0)
                                return r;
                }
                if (rep > 0) {
                        t[rep - 1] = (now_s() - t0) / steps;
                        ct[rep - 1] = (cpu_s() - c0) / steps;
                }
        }
        double m = median(t, repeats);
        report(B, "decode", 0, ctx, batch, batch / m, m * 1000, median(ct, repeats) * 1000);
        return 0;
}

static void print_table(const struct bench *B) {
        printf("\nx4-bench  model %s  device %s  commit %s\n", B->model, B->device, B->commit);
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
                else
                        printf("%-8s %-22s %12.2f %14.2f %14.2f%s\n", r->what, shape, r->tok_s, r->ms,
                               r->cpu_ms, strcmp(r->what, "decode") == 0 ? "  per step" : "");
        }
}

static int bench_tokenize(const char *model, const char *path, double seconds, const char *commit) {
        _cleanup_(tokenizer_freep) struct tokenizer *t = NULL;
        _cleanup_fclose_ FILE *f = NULL;
        _cleanup_free_ char *text = NULL;
        size_t len = 0, cap = 0, n_ids;
        double bps;
        int r;

        r = tokenizer_load(model, &t);
        if (r < 0)
                return r;
        f = fopen(path, "rb");
        if (!f)
                return log_error_errno(errno, "%s: cannot open the text to tokenize: %m", path);
        for (;;) {
                if (len + 65536 > cap) {
                        char *p = realloc(text, cap = cap ? cap * 2 : 1 << 20);
                        if (!p)
                                return log_error_errno(ENOMEM, "out of memory reading %s", path);
                        text = p;
                }
                size_t got = fread(text + len, 1, cap - len, f);
                if (got == 0)
                        break;
                len += got;
        }
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

static void usage(FILE *f) {
        fputs("usage: x4-bench --model M.gguf [--config C.json] [--assume-release-defaults]\n"
              "                [--device cpu|cuda] [--threads N] [--prefill 512,4096]\n"
              "                [--decode-ctx 512,4096] [--batch 1,16] [--decode-tokens 32]\n"
              "                [--repeats 3] [--json]\n"
              "       x4-bench --model M.gguf --tokenize TEXT_FILE [--seconds 3]\n",
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
                { "json", no_argument, NULL, 'j' },
                { "tokenize", required_argument, NULL, 'T' },
                { "seconds", required_argument, NULL, 'S' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        static struct bench B;
        struct x4_model_params mp = {};
        _cleanup_(x4_model_freep) struct x4_model *model = NULL;
        uint32_t prefill[MAX_LIST] = { 512, 4096 }, ctxs[MAX_LIST] = { 512, 4096 }, batches[MAX_LIST] = { 1, 16 };
        size_t n_prefill = 2, n_ctx = 2, n_batch = 2;
        uint32_t threads = 0, steps = 32, repeats = 3, max_len = 1, max_batch = 1, max_ctx = 0;
        const char *device = "cpu", *tokenize = NULL;
        double seconds = 3;
        int c, r = 0;

        log_set_max_level(LOG_CRIT);
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                switch (c) {
                case 'm':
                        mp.path = optarg;
                        break;
                case 'c':
                        mp.config_path = optarg;
                        break;
                case 'R':
                        mp.assume_release_defaults = true;
                        break;
                case 'D':
                        device = optarg;
                        break;
                case 't':
                        r = parse_u32("--threads", optarg, 1, &threads);
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
                        r = parse_u32("--decode-tokens", optarg, 1, &steps);
                        break;
                case 'r':
                        r = parse_u32("--repeats", optarg, 1, &repeats);
                        break;
                case 'j':
                        B.json = true;
                        break;
                case 'T':
                        tokenize = optarg;
                        break;
                case 'S': {
                        char *end;
                        seconds = strtod(optarg, &end);
                        if (*end || !(seconds > 0 && seconds <= 3600))
                                r = log_error_errno(EINVAL, "--seconds '%s': a number of seconds in (0, 3600] expected", optarg);
                        break;
                }
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        usage(stderr);
                        return 1;
                }
                if (r < 0)
                        goto fail;
        }
        if (!mp.path || optind < argc) {
                log_error(optind < argc ? "unexpected argument" : "--model is required");
                goto fail;
        }

        for (size_t i = 0; i < n_prefill; i++)
                max_len = MAX(max_len, prefill[i]);
        for (size_t i = 0; i < n_ctx; i++)
                max_ctx = MAX(max_ctx, ctxs[i]);
        for (size_t i = 0; i < n_batch; i++)
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
        r = x4_model_open(&mp, &model);
        if (r < 0)
                goto fail;
        const struct x4_config *cfg = x4_model_config(model);
        B.n_vocab = cfg->n_vocab;
        r = x4_backend_get(device, &B.ops);
        if (r < 0)
                goto fail;
        /* sequence slots: 0 for prefill and the decode source, up to max_batch in all */
        B.pages_per_seq = DIV_ROUND_UP(MAX(max_len, max_ctx + steps), PAGE_TOKENS);
        struct x4_backend_params bp = {
                .n_threads = threads,
                .page_tokens = PAGE_TOKENS,
                .n_pages = B.pages_per_seq * max_batch,
                .cache_type = X4_CACHE_F32,
                .log = x4_backend_params_default_log,
        };
        r = B.ops->create(model, &bp, &B.b);
        if (r < 0)
                goto fail;
        double load_s = now_s() - t0;

        struct x4_backend_caps caps;
        B.ops->caps(B.b, &caps);
        if (streq(caps.name, "cpu")) {
                long n = threads ? (long) threads : sysconf(_SC_NPROCESSORS_ONLN);
                snprintf(B.device, sizeof B.device, "cpu (%ld thread%s)", n, n == 1 ? "" : "s");
        } else
                snprintf(B.device, sizeof B.device, "%s", caps.name);

        B.pages = calloc(bp.n_pages, sizeof *B.pages);
        B.tokens = calloc(MAX(max_len, max_batch), sizeof *B.tokens);
        B.logits = calloc(max_batch, (size_t) B.n_vocab * sizeof(float));
        if (!B.pages || !B.tokens || !B.logits) {
                log_error("out of memory");
                goto fail_b;
        }
        for (uint32_t i = 0; i < bp.n_pages; i++)
                B.pages[i] = i;
        for (uint32_t i = 0, x = 1; i < MAX(max_len, max_batch); i++) {
                x = x * 1103515245u + 12345u;
                B.tokens[i] = (int32_t) ((x >> 8) % B.n_vocab);
        }

        report(&B, "load", 0, 0, 0, 0, load_s * 1000, 0);
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
        if (!B.json)
                print_table(&B);
        B.ops->destroy(B.b);
        return 0;

fail_b:
        B.ops->destroy(B.b);
fail:
        fprintf(stderr, "x4-bench: %s\n", *log_last_error() ? log_last_error() : "failed");
        return 1;
}
