/* SPDX-License-Identifier: MIT */
/* x4-logits: run a prompt (and teacher-forced decode ids) through a backend and write the logits.
 *
 *   x4-logits --model M.gguf [--config C.json] --prompt 1,7,3 [--decode 4,5] [--last N]
 *             [--device cpu|cuda] [--threads N] [--chunk N] [--assume-release-defaults]
 *             [--nextn-out G.bin] [--prompt-class] --out F.bin
 *
 * Output: little-endian float32 rows of vocab width: the logits of every prompt position (only the
 * last N with --last N), then one row per decode id (the logits after feeding that id at the next
 * position). The prompt runs as one batch, or in --chunk N pieces. With --nextn-out (MTP on), G.bin
 * gets the NextN block's draft logits (docs/model.md §8) of every position t but the last, from the
 * trunk's hidden of t and the id at t + 1 (the distribution of the token at t + 2); each feed runs
 * the NextN rows whose next id it has just made known, as the engine does. With --prompt-class the
 * prompt's tokens are labeled as prompt tokens (x4_seq.prompt_tokens, as the daemon labels a
 * request's prompt: the CUDA backend then runs them on its prompt-class kernels); the decode ids
 * stay generated tokens. With --experts, stdout gets a line per MoE layer: how many distinct
 * routed experts the run's tokens selected, of how many (the synthetic models' deep layers send
 * every token to the same few; a trained model's spread over most). Any error: one line on stderr,
 * exit status 1. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model/xing4.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/util.h"
#include "tools/common.h"

#define PAGE_TOKENS 256u
#define EXPERTS_MAX_LAYERS 256
#define EXPERTS_MAX 1024

/* --experts: the routed experts each MoE layer's tokens selected (route_trace) */
struct expert_use {
        bool past_table; /* a layer or an expert id beyond the table: said, not counted */
        uint32_t n_expert, n_layers, tokens[EXPERTS_MAX_LAYERS];
        uint8_t used[EXPERTS_MAX_LAYERS][EXPERTS_MAX];
        bool layer_seen[EXPERTS_MAX_LAYERS];
};

static void expert_use_add(uint32_t layer, uint32_t token, const float *scores, uint32_t n_expert,
                           const int32_t *selected, uint32_t k, void *userdata) {
        struct expert_use *u = userdata;
        (void) token, (void) scores;
        if (layer >= EXPERTS_MAX_LAYERS || n_expert > EXPERTS_MAX) {
                u->past_table = true;
                return;
        }
        u->n_expert = n_expert;
        u->layer_seen[layer] = true;
        u->n_layers = MAX(u->n_layers, layer + 1);
        u->tokens[layer]++;
        for (uint32_t i = 0; i < k; i++)
                if (selected[i] >= 0 && (uint32_t) selected[i] < n_expert)
                        u->used[layer][selected[i]] = 1;
}

static void expert_use_print(const struct expert_use *u) {
        for (uint32_t l = 0; l < u->n_layers; l++) {
                if (!u->layer_seen[l])
                        continue;
                uint32_t n = 0;
                for (uint32_t e = 0; e < u->n_expert; e++)
                        n += u->used[l][e];
                printf("layer %3u: %3u of %u routed experts selected by %u tokens\n", l, n, u->n_expert, u->tokens[l]);
        }
        if (u->past_table)
                fprintf(stderr, "x4-logits: --experts counts layers below %d of models of at most %d experts; the "
                                "rest were not counted\n", EXPERTS_MAX_LAYERS, EXPERTS_MAX);
}

static void usage(FILE *f) {
        fputs("usage: x4-logits --model M.gguf [--config C.json] --prompt 1,7,3 [--decode 4,5]\n"
              "                 [--last N] [--device cpu|cuda] [--threads N] [--chunk N]\n"
              "                 [--assume-release-defaults] [--nextn-out G.bin] [--prompt-class]\n"
              "                 [--cache f32|f16] [--experts] --out F.bin\n"
              "  --experts         print each MoE layer's count of distinct routed experts selected\n"
              "  --cache f32|f16   the latent cache type (default f32, the exact path; cuda only: f16,\n"
              "                    the daemon's, whose decode attention runs on tensor cores)\n",
              f);
}

/* "1,7,3" → ids; an empty list is allowed only where `allow_empty`. */
static int parse_ids(const char *opt, const char *s, bool allow_empty, int32_t **ret, uint32_t *n_ret) {
        _cleanup_free_ int32_t *ids = NULL;
        uint32_t n = 0, cap = 0;
        const char *p = s;

        if (*s == '\0') {
                if (!allow_empty)
                        return log_error_errno(EINVAL, "%s: empty list, at least one token id expected", opt);
                *ret = NULL;
                *n_ret = 0;
                return 0;
        }
        for (;;) {
                char *end;
                long long v;

                errno = 0;
                v = strtoll(p, &end, 10);
                if (end == p || errno != 0 || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0'))
                        return log_error_errno(EINVAL,
                                               "%s: '%s' is not a comma-separated list of token ids (bad entry at offset %td)",
                                               opt, s, p - s);
                if (n == cap) {
                        int32_t *t;

                        cap = cap ? cap * 2 : 64;
                        t = realloc(ids, cap * sizeof *ids);
                        if (!t)
                                return log_error_errno(ENOMEM, "%s: out of memory", opt);
                        ids = t;
                }
                ids[n++] = (int32_t) v;
                if (*end == '\0')
                        break;
                p = end + 1;
        }
        *ret = TAKE_PTR(ids);
        *n_ret = n;
        return 0;
}

static int parse_opt_u32(const char *opt, const char *s, uint32_t min, uint32_t *ret) {
        return tool_parse_u32(opt, s, min, UINT32_MAX, ret);
}

struct run {
        const struct x4_backend_ops *ops;
        struct x4_backend *b;
        const uint32_t *pages;
        uint32_t n_pages;
        uint32_t n_vocab;
        FILE *out;
        const char *out_path;
        /* --nextn-out: every position's trunk hidden, all the ids, and where the draft rows go */
        float *hidden;
        const int32_t *ids;
        uint32_t n_embd;
        FILE *nextn_out;
        const char *nextn_path;
        bool prompt_class; /* --prompt-class */
        bool in_prompt;    /* the feed being made carries prompt tokens */
};

static int write_rows(struct run *r, const float *rows, size_t n) {
        if (fwrite(rows, sizeof(float) * r->n_vocab, n, r->out) != n)
                return log_error_errno(errno ? errno : EIO, "%s: write failed: %m", r->out_path);
        return 0;
}

/* Feed tokens[0..n) at pos0; write the rows of positions >= first_wanted. */
static int feed(struct run *r, const int32_t *tokens, uint32_t n, uint32_t pos0, uint64_t first_wanted,
                float *buf) {
        uint64_t end = (uint64_t) pos0 + n;
        struct x4_seq seq = {
                .tokens = tokens,
                .n_tokens = n,
                .pos0 = pos0,
                .pages = r->pages,
                .n_pages = r->n_pages,
                .logits = X4_LOGITS_NONE,
                .prompt_tokens = r->prompt_class && r->in_prompt ? n : 0,
        };
        struct x4_batch batch = { .seqs = &seq, .n_seqs = 1 };
        uint32_t skip = 0, rows = 0;
        int k;

        if (r->nextn_out) {
                seq.hidden = X4_LOGITS_ALL;
                batch.hidden = r->hidden + (size_t) pos0 * r->n_embd;
        }
        if (first_wanted < end) {
                if (first_wanted + 1 == end) {
                        seq.logits = X4_LOGITS_LAST;
                        rows = 1;
                } else {
                        seq.logits = X4_LOGITS_ALL;
                        rows = n;
                        skip = first_wanted > pos0 ? (uint32_t) (first_wanted - pos0) : 0;
                }
        }
        k = r->ops->forward(r->b, &batch, buf, NULL, 0);
        if (k < 0)
                return k;
        k = rows > skip ? write_rows(r, buf + (size_t) skip * r->n_vocab, rows - skip) : 0;
        /* the ids at pos0.. are now known: the NextN rows of positions pos0 - 1 .. end - 2 */
        uint32_t t0 = pos0 > 0 ? pos0 - 1 : 0, nn = (uint32_t) (end - 1 - t0);
        if (k < 0 || !r->nextn_out || nn == 0)
                return k;
        struct x4_nextn_seq ns = {
                .seq = { .tokens = r->ids + t0 + 1, .n_tokens = nn, .pos0 = t0, .pages = r->pages,
                         .n_pages = r->n_pages, .logits = X4_LOGITS_ALL },
                .h = r->hidden + (size_t) t0 * r->n_embd,
        };
        struct x4_nextn_batch nb = { .seqs = &ns, .n_seqs = 1 };
        _cleanup_free_ float *draft = malloc((size_t) nn * r->n_vocab * sizeof(float));
        if (!draft)
                return log_error_errno(ENOMEM, "out of memory");
        k = r->ops->nextn(r->b, &nb, draft, NULL, 0);
        if (k < 0)
                return k;
        if (fwrite(draft, sizeof(float) * r->n_vocab, nn, r->nextn_out) != nn)
                return log_error_errno(errno ? errno : EIO, "%s: write failed: %m", r->nextn_path);
        return 0;
}

static void backend_destroy(struct run *r) {
        if (r->b)
                r->ops->destroy(r->b);
}

int main(int argc, char **argv) {
        static const struct option options[] = {
                { "model", required_argument, NULL, 'm' },
                { "config", required_argument, NULL, 'c' },
                { "prompt", required_argument, NULL, 'p' },
                { "decode", required_argument, NULL, 'd' },
                { "last", required_argument, NULL, 'l' },
                { "device", required_argument, NULL, 'D' },
                { "threads", required_argument, NULL, 't' },
                { "chunk", required_argument, NULL, 'k' },
                { "assume-release-defaults", no_argument, NULL, 'R' },
                { "out", required_argument, NULL, 'o' },
                { "nextn-out", required_argument, NULL, 'N' },
                { "prompt-class", no_argument, NULL, 'P' },
                { "cache", required_argument, NULL, 'C' },
                { "experts", no_argument, NULL, 'E' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        struct x4_model_params mp = {};
        _cleanup_(x4_model_freep) struct x4_model *model = NULL;
        _cleanup_free_ int32_t *prompt = NULL, *decode = NULL;
        _cleanup_free_ uint32_t *pages = NULL;
        _cleanup_free_ float *buf = NULL;
        _cleanup_fclose_ FILE *out = NULL, *nextn_out = NULL;
        _cleanup_free_ int32_t *all_ids = NULL;
        _cleanup_free_ float *hidden = NULL;
        _cleanup_free_ struct expert_use *experts = NULL; /* --experts */
        const char *nextn_path = NULL;
        const char *device = "cpu", *out_path = NULL, *prompt_s = NULL, *decode_s = "";
        uint32_t n_prompt = 0, n_decode = 0, last = 0, threads = 0, chunk = 0;
        uint32_t cache_type = X4_CACHE_F32;
        bool have_last = false;
        struct run run = {};
        int c, r;

        /* errors are printed once, by main, as one line */
        log_set_max_level(LOG_CRIT);
        log_max_level_from_env(); /* X4_LOG_LEVEL=warning: the backend's warnings too */

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                r = 0;
                if (tool_model_option(c, optarg, &mp, &device))
                        continue;
                switch (c) {
                case 'p':
                        prompt_s = optarg;
                        break;
                case 'd':
                        decode_s = optarg;
                        break;
                case 'l':
                        r = parse_opt_u32("--last", optarg, 1, &last);
                        have_last = true;
                        break;
                case 't':
                        r = parse_opt_u32("--threads", optarg, 1, &threads);
                        break;
                case 'k':
                        r = parse_opt_u32("--chunk", optarg, 1, &chunk);
                        break;
                case 'o':
                        out_path = optarg;
                        break;
                case 'N':
                        nextn_path = optarg;
                        break;
                case 'P':
                        run.prompt_class = true;
                        break;
                case 'E':
                        if (!experts && !(experts = calloc(1, sizeof *experts)))
                                goto oom;
                        break;
                case 'C':
                        if (streq(optarg, "f32"))
                                cache_type = X4_CACHE_F32;
                        else if (streq(optarg, "f16"))
                                cache_type = X4_CACHE_F16;
                        else
                                r = log_error_errno(EINVAL, "--cache: '%s' is not a cache type; f32 or f16 expected",
                                                    optarg);
                        break;
                default:
                        return tool_usage_exit(c, usage);
                }
                if (r < 0)
                        goto fail;
        }
        if (optind < argc) {
                log_error("unexpected argument '%s'", argv[optind]);
                goto fail;
        }
        if (!mp.path || !prompt_s || !out_path) {
                log_error("--model, --prompt and --out are required");
                goto fail;
        }
        if ((r = parse_ids("--prompt", prompt_s, false, &prompt, &n_prompt)) < 0 ||
            (r = parse_ids("--decode", decode_s, true, &decode, &n_decode)) < 0)
                goto fail;
        if (!have_last)
                last = n_prompt;
        if (last > n_prompt) {
                log_error("--last %u: the prompt has only %u tokens", last, n_prompt);
                goto fail;
        }

        r = x4_model_open(&mp, &model, NULL, 0);
        if (r < 0)
                goto fail;
        const struct x4_config *cfg = x4_model_config(model);
        for (uint32_t i = 0; i < n_prompt + n_decode; i++) {
                int32_t id = i < n_prompt ? prompt[i] : decode[i - n_prompt];
                if ((uint32_t) id >= cfg->n_vocab) {
                        log_error("%s entry %u: token id %d out of range, the model's vocab is 0..%u",
                                  i < n_prompt ? "--prompt" : "--decode", i < n_prompt ? i : i - n_prompt,
                                  id, cfg->n_vocab - 1);
                        goto fail;
                }
        }

        r = x4_backend_get(device, &run.ops, NULL, 0);
        if (r < 0)
                goto fail;
        if (cache_type == X4_CACHE_F16 && streq(run.ops->name, "cpu")) {
                log_error("--cache f16: the cpu backend keeps an f32 cache only; --device cuda or --cache f32 expected");
                goto fail;
        }
        run.n_pages = DIV_ROUND_UP(n_prompt + n_decode, PAGE_TOKENS);
        pages = calloc(run.n_pages, sizeof *pages);
        if (!pages)
                goto oom;
        for (uint32_t i = 0; i < run.n_pages; i++)
                pages[i] = i;
        run.pages = pages;
        run.n_vocab = cfg->n_vocab;
        struct x4_backend_params bp = {
                .n_threads = threads,
                .page_tokens = PAGE_TOKENS,
                .n_pages = run.n_pages,
                .cache_type = cache_type,
                .log = x4_backend_params_default_log,
                .mtp = nextn_path != NULL,
                .route_trace = experts ? expert_use_add : NULL,
                .route_trace_userdata = experts,
        };
        r = run.ops->create(model, &bp, &run.b, NULL, 0);
        if (r < 0)
                goto fail;

        if (chunk == 0)
                chunk = n_prompt;
        /* a chunk asks for all its rows when it holds more than one wanted row, else at most its
         * last one (so --last 1 on a long prompt needs one row, not prompt × vocab floats) */
        buf = malloc((size_t) (last > 1 ? MIN(chunk, n_prompt) : 1u) * cfg->n_vocab * sizeof(float));
        if (!buf)
                goto oom_b;
        out = fopen(out_path, "we");
        if (!out) {
                log_error("%s: cannot open for writing: %m", out_path);
                goto fail_b;
        }
        run.out = out;
        run.out_path = out_path;
        if (nextn_path) {
                uint32_t n_all = n_prompt + n_decode;

                all_ids = malloc((size_t) n_all * sizeof *all_ids);
                hidden = malloc((size_t) n_all * cfg->n_embd * sizeof(float));
                if (!all_ids || !hidden)
                        goto oom_b;
                memcpy(all_ids, prompt, (size_t) n_prompt * sizeof *all_ids);
                if (n_decode)
                        memcpy(all_ids + n_prompt, decode, (size_t) n_decode * sizeof *all_ids);
                nextn_out = fopen(nextn_path, "we");
                if (!nextn_out) {
                        log_error("%s: cannot open for writing: %m", nextn_path);
                        goto fail_b;
                }
                run.ids = all_ids;
                run.hidden = hidden;
                run.n_embd = cfg->n_embd;
                run.nextn_out = nextn_out;
                run.nextn_path = nextn_path;
        }

        for (uint32_t pos = 0; pos < n_prompt; pos += chunk) {
                run.in_prompt = true;
                r = feed(&run, prompt + pos, MIN(chunk, n_prompt - pos), pos, n_prompt - last, buf);
                run.in_prompt = false;
                if (r < 0)
                        goto fail_b;
        }
        for (uint32_t i = 0; i < n_decode; i++) {
                r = feed(&run, decode + i, 1, n_prompt + i, n_prompt + i, buf);
                if (r < 0)
                        goto fail_b;
        }
        if (fflush(out) != 0 || ferror(out)) {
                log_error("%s: write failed: %m", out_path);
                goto fail_b;
        }
        if (nextn_out && (fflush(nextn_out) != 0 || ferror(nextn_out))) {
                log_error("%s: write failed: %m", nextn_path);
                goto fail_b;
        }
        backend_destroy(&run);
        if (experts)
                expert_use_print(experts);
        return 0;

oom_b:
        log_error("out of memory");
fail_b:
        backend_destroy(&run);
        goto fail;
oom:
        log_error("out of memory");
fail:
        return tool_fail("x4-logits");
}
