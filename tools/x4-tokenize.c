/* SPDX-License-Identifier: MIT */
/* x4-tokenize --model M.gguf [--decode] [--raw] [--skip-specials] [--bench SECONDS]
 *
 * Encode: reads UTF-8 text on stdin and prints one line of space-separated ids per input line
 * (no BOS/EOS, registered specials recognised unless --raw; the '\n' ending a line is not part
 * of the text). --decode: reads such lines of ids and prints the decoded text, one line each.
 * --bench: encodes stdin as one text repeatedly and prints the speed as one JSON line.
 * Errors: one line on stderr, exit status 1. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/tokenizer.h"
#include "common/log.h"
#include "tools/common.h"

static void usage(FILE *f) {
        fprintf(f, "usage: x4-tokenize --model M.gguf [--decode] [--raw] [--skip-specials] [--bench SECONDS]\n"
                   "  reads the text (or with --decode the ids) on stdin, one line at a time\n");
}

static int encode_lines(const struct tokenizer *t, unsigned flags) {
        _cleanup_free_ char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, stdin)) >= 0) {
                if (n > 0 && line[n - 1] == '\n')
                        n--;
                _cleanup_free_ int32_t *ids = NULL;
                size_t nids;
                int r = tokenizer_encode(t, line, (size_t) n, flags, &ids, &nids, NULL, 0);
                if (r < 0)
                        return r;
                for (size_t i = 0; i < nids; i++)
                        printf(i ? " %d" : "%d", (int) ids[i]);
                putchar('\n');
        }
        return 0;
}

static int decode_lines(const struct tokenizer *t, unsigned flags) {
        _cleanup_free_ char *line = NULL;
        size_t cap = 0, lineno = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, stdin)) >= 0) {
                lineno++;
                _cleanup_free_ int32_t *ids = calloc((size_t) n / 2 + 1, sizeof(int32_t));
                size_t nids = 0;
                if (!ids)
                        return -ENOMEM;
                for (char *p = line;;) {
                        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
                                p++;
                        if (!*p)
                                break;
                        char *end;
                        errno = 0;
                        long v = strtol(p, &end, 10);
                        if (end == p || errno || v < INT32_MIN || v > INT32_MAX ||
                            (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r'))
                                return log_error_errno(EINVAL, "stdin line %zu: \"%.*s\" is not a token id, integers expected",
                                                       lineno, (int) strcspn(p, " \t\r\n"), p);
                        ids[nids++] = (int32_t) v;
                        p = end;
                }
                _cleanup_free_ char *text = NULL;
                size_t len;
                int r = tokenizer_decode(t, ids, nids, flags, &text, &len);
                if (r < 0)
                        return log_error_errno(r, "stdin line %zu: %s", lineno, log_last_error());
                fwrite(text, 1, len, stdout);
                putchar('\n');
        }
        return 0;
}

static int bench(const struct tokenizer *t, double seconds) {
        _cleanup_free_ char *text = NULL;
        size_t len;
        int r = tool_read_all(stdin, &text, &len);
        if (r < 0)
                return r;
        double bps;
        size_t nids;
        r = tokenizer_bench(t, text, len, seconds, &bps, &nids);
        if (r < 0)
                return r;
        printf("{\"what\":\"tokenizer_encode\",\"bytes\":%zu,\"tokens\":%zu,\"MB_per_s\":%.2f}\n", len, nids,
               bps / 1e6);
        return 0;
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "model", required_argument, NULL, 'm' },
                { "decode", no_argument, NULL, 'd' },
                { "raw", no_argument, NULL, 'r' },
                { "skip-specials", no_argument, NULL, 's' },
                { "bench", required_argument, NULL, 'b' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *model = NULL;
        bool decode = false;
        unsigned enc_flags = 0, dec_flags = 0;
        double bench_s = 0;
        int c, r;

        log_set_ident("x4-tokenize");
        while ((c = getopt_long(argc, argv, "m:drsb:h", opts, NULL)) >= 0) {
                switch (c) {
                case 'm':
                        model = optarg;
                        break;
                case 'd':
                        decode = true;
                        break;
                case 'r':
                        enc_flags |= TOKENIZER_ENCODE_RAW;
                        break;
                case 's':
                        dec_flags |= TOKENIZER_DECODE_SKIP_SPECIALS;
                        break;
                case 'b':
                        bench_s = strtod(optarg, NULL);
                        if (!(bench_s > 0)) {
                                fprintf(stderr, "x4-tokenize: --bench %s: a positive number of seconds expected\n", optarg);
                                return 1;
                        }
                        break;
                default:
                        return tool_usage_exit(c, usage);
                }
        }
        if (!model) {
                fprintf(stderr, "x4-tokenize: --model M.gguf is required\n");
                return 1;
        }
        if (optind != argc) {
                fprintf(stderr, "x4-tokenize: unexpected argument '%s' (the text is read on stdin)\n", argv[optind]);
                return 1;
        }

        /* errors are printed once, by us, as one line */
        log_set_max_level(LOG_CRIT);
        log_max_level_from_env(); /* X4_LOG_LEVEL=warning: the library's warnings too */
        _cleanup_(tokenizer_freep) struct tokenizer *t = NULL;
        r = tokenizer_load(model, &t);
        if (r < 0) {
                const char *e = log_last_error();
                /* the reader's and tokenizer's messages name the file themselves */
                if (*e)
                        fprintf(stderr, "x4-tokenize: %s\n", e);
                else
                        fprintf(stderr, "x4-tokenize: %s: %s\n", model, strerror(-r));
                return 1;
        }
        if (bench_s > 0)
                r = bench(t, bench_s);
        else
                r = decode ? decode_lines(t, dec_flags) : encode_lines(t, enc_flags);
        if (r < 0) {
                const char *e = log_last_error();
                fprintf(stderr, "x4-tokenize: %s\n", *e ? e : strerror(-r));
                return 1;
        }
        if (fflush(stdout) != 0 || ferror(stdout)) {
                fprintf(stderr, "x4-tokenize: writing stdout: %s\n", strerror(errno));
                return 1;
        }
        return 0;
}
