/* SPDX-License-Identifier: MIT */
/* x4-bench (and x4-logits' --cache), the built programs, on a demo model that x4-mkmodel writes at
 * test time:
 * - the CPU backend: a decode context longer than --decode-prefill-max is filled by prefill +
 *   page copies and the JSON line says so; --cache f16 is refused naming the cache and the
 *   measurements; --profile on a backend without the op says so once and the run succeeds; bad
 *   option values are refused naming the option; --mtp on with --mtp-prompt: chat questions
 *   rendered by the chat template, per question and in total the generate lines, the same tokens
 *   with MTP on and off; --mtp-prompt refused without --mtp, on a model without a tokenizer and
 *   (--mtp on) on a model without the NextN block, naming the flag;
 * - a stand-in backend module (bench-fake-backend.c, compiled here, loaded as "cuda" through
 *   X4_CUDA_MODULE) that traces every call: the exact cache size asked for, the decode setup's
 *   prefills and page copies at the edges (C < N, C == N, C > N and not whole pages), profiling
 *   switched on only after the timed runs, and the profile report's per-step arithmetic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/mkmodel.h"
#include "common/log.h"

static struct {
        char dir[128], gguf[160], config[160], trace[160], module[160], out[160], err[160];
        char tiny[160], tiny_config[160], notok[160]; /* no NextN block; and no tokenizer either */
        bool have_module;
} T;

static int count_substr(const char *s, const char *sub) {
        int n = 0;

        for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub))
                n++;
        return n;
}

static void slurp(const char *path, char *buf, size_t size) {
        FILE *f = fopen(path, "re");
        size_t n = 0;

        buf[0] = 0;
        if (!f)
                return;
        n = fread(buf, 1, size - 1, f);
        buf[n] = 0;
        fclose(f);
}

/* Run `env x4-bench --model model args`; stdout and stderr into out and err; the exit status. */
static int bench_model(const char *model, const char *env, const char *args, char *out, size_t out_size, char *err,
                       size_t err_size) {
        const char *bdir = getenv("X4_BUILD_DIR");
        char cmd[4096];
        int status;

        assert_non_null(bdir);
        snprintf(cmd, sizeof cmd, "%s '%s/tools/x4-bench' --model '%s' %s >'%s' 2>'%s'", env ? env : "", bdir,
                 model, args, T.out, T.err);
        status = system(cmd);
        assert_true(WIFEXITED(status));
        slurp(T.out, out, out_size);
        slurp(T.err, err, err_size);
        return WEXITSTATUS(status);
}

/* Run `env x4-bench --model demo args` (the demo preset: a tokenizer and the NextN block). */
static int bench(const char *env, const char *args, char *out, size_t out_size, char *err, size_t err_size) {
        return bench_model(T.gguf, env, args, out, out_size, err, err_size);
}

/* A copy of the tiny model whose tokenizer.ggml.model key is renamed: the model loads, its
 * tokenizer does not. */
static int write_without_tokenizer(const char *from, const char *to) {
        static const char key[] = "tokenizer.ggml.model";
        FILE *f = fopen(from, "rbe");
        char *buf = NULL, *at;
        long n;
        int r = -1;

        if (!f)
                return -1;
        if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t) n)) && fread(buf, 1, (size_t) n, f) == (size_t) n &&
            (at = memmem(buf, (size_t) n, key, sizeof key - 1))) {
                at[sizeof key - 2] = 'z';
                FILE *g = fopen(to, "wbe");
                r = g && fwrite(buf, 1, (size_t) n, g) == (size_t) n ? 0 : -1;
                if (g && fclose(g) != 0)
                        r = -1;
        }
        free(buf);
        fclose(f);
        return r;
}

static int setup(void **state) {
        struct x4_mkmodel_shape s;
        struct x4_mkmodel_options o = { .seed = 1, .threads = 2 };
        const char *src = getenv("X4_SOURCE_DIR"), *cc = getenv("CC");
        char cmd[2048];

        (void) state;
        log_set_max_level(LOG_CRIT);
        snprintf(T.dir, sizeof T.dir, "/tmp/x4-test-bench-XXXXXX");
        if (!mkdtemp(T.dir))
                return -1;
        snprintf(T.gguf, sizeof T.gguf, "%s/demo.gguf", T.dir);
        snprintf(T.config, sizeof T.config, "%s/config.json", T.dir);
        snprintf(T.trace, sizeof T.trace, "%s/trace", T.dir);
        snprintf(T.module, sizeof T.module, "%s/fake.so", T.dir);
        snprintf(T.out, sizeof T.out, "%s/out", T.dir);
        snprintf(T.err, sizeof T.err, "%s/err", T.dir);
        o.out = T.gguf;
        if (x4_mkmodel_preset("demo", &s) < 0 || x4_mkmodel_write(&s, &o) < 0)
                return -1;
        snprintf(T.tiny, sizeof T.tiny, "%s/tiny.gguf", T.dir);
        snprintf(T.tiny_config, sizeof T.tiny_config, "%s/tiny-config.json", T.dir);
        snprintf(T.notok, sizeof T.notok, "%s/notok.gguf", T.dir);
        o.out = T.tiny;
        o.config_out = T.tiny_config;
        if (x4_mkmodel_preset("tiny", &s) < 0 || x4_mkmodel_write(&s, &o) < 0 ||
            write_without_tokenizer(T.tiny, T.notok) < 0)
                return -1;
        if (src && *src) {
                snprintf(cmd, sizeof cmd, "%s -std=c11 -Wall -Wextra -Werror -shared -fPIC -I'%s/kernels' -o '%s' "
                         "'%s/tests/unit/bench-fake-backend.c'",
                         cc && *cc ? cc : "cc", src, T.module, src);
                T.have_module = system(cmd) == 0;
        }
        if (!T.have_module)
                fprintf(stderr, "cannot build the stand-in backend module (X4_SOURCE_DIR unset or no C compiler)\n");
        return 0;
}

static int teardown(void **state) {
        (void) state;
        unlink(T.gguf);
        unlink(T.config);
        unlink(T.tiny);
        unlink(T.tiny_config);
        unlink(T.notok);
        unlink(T.trace);
        unlink(T.module);
        unlink(T.out);
        unlink(T.err);
        rmdir(T.dir);
        return 0;
}

static void test_cpu_decode_prefill_copy(void **state) {
        char out[16384], err[4096];
        const char *line, *nl;
        double tok_s = 0;

        (void) state;
        assert_int_equal(bench(NULL, "--prefill 16 --decode-ctx 300 --decode-prefill-max 256 --batch 2 "
                                     "--decode-tokens 2 --repeats 1 --json", out, sizeof out, err, sizeof err), 0);
        assert_string_equal(err, "");
        /* --json: JSON lines only, load + prefill + decode */
        assert_int_equal(count_substr(out, "\n"), 3);
        for (line = out; *line; line = nl + 1) {
                assert_int_equal(line[0], '{');
                nl = strchr(line, '\n');
                assert_non_null(nl);
                assert_int_equal(nl[-1], '}');
        }
        line = strstr(out, "{\"what\":\"decode\",\"ctx\":300,\"batch\":2,\"tok_s\":");
        assert_non_null(line);
        assert_int_equal(sscanf(line, "{\"what\":\"decode\",\"ctx\":300,\"batch\":2,\"tok_s\":%lf", &tok_s), 1);
        assert_true(tok_s > 0);
        /* 300 > 256: one page prefilled, the second a copy of it */
        assert_non_null(strstr(line, "\"ctx_filled\":\"prefill+copy\",\"ctx_prefilled\":256,"));
        assert_non_null(strstr(line, "\"cache\":\"f32\",\"device\":\"cpu ("));
        assert_int_equal(count_substr(out, "\"cache\":\"f32\""), 3);

        /* C == N: all prefilled */
        assert_int_equal(bench(NULL, "--prefill 16 --decode-ctx 300 --decode-prefill-max 300 --batch 1 "
                                     "--decode-tokens 1 --repeats 1 --json", out, sizeof out, err, sizeof err), 0);
        assert_non_null(strstr(out, "\"ctx\":300,\"batch\":1,"));
        assert_non_null(strstr(out, "\"ctx_filled\":\"prefill\",\"ctx_prefilled\":300,"));
}

/* --grammar model: the mask cost on the demo model's vocabulary, one JSON line per schema (the
 * three JSON ones and the native tool call), and every sequence ends (the budget closes what
 * the random choices left open). */
static void test_grammar_mask(void **state) {
        char out[16384], err[4096];

        (void) state;
        assert_int_equal(bench(NULL, "--grammar model --grammar-seqs 2 --json", out, sizeof out, err, sizeof err), 0);
        assert_string_equal(err, "");
        assert_int_equal(count_substr(out, "\n"), 4);
        assert_int_equal(count_substr(out, "\"what\":\"grammar_mask\",\"vocab\":\"model\",\"n_vocab\":4096"), 4);
        assert_int_equal(count_substr(out, "\"sequences\":2,\"ended\":2,"), 4);
        assert_non_null(strstr(out, "\"schema\":\"json_object\""));
        /* a forced call in the model's own syntax: raw string values, the markup byte by byte */
        assert_non_null(strstr(out, "\"schema\":\"tool_call\""));
        assert_int_equal(bench(NULL, "--grammar words", out, sizeof out, err, sizeof err), 1);
        assert_string_equal(err, "x4-bench: --grammar: 'words' is not a vocabulary; dense, full or model expected\n");
        assert_int_equal(bench(NULL, "--grammar model --grammar-seqs 0", out, sizeof out, err, sizeof err), 1);
        assert_string_equal(err, "x4-bench: --grammar-seqs: '0' is not an integer >= 1\n");
}

static void test_cpu_refusals(void **state) {
        char out[16384], err[4096];

        (void) state;
        /* the CPU backend has only f32: its reason, after what x4-bench asked for */
        assert_int_equal(bench(NULL, "--prefill 16 --decode-ctx 300 --batch 2 --decode-tokens 2 --cache f16",
                               out, sizeof out, err, sizeof err), 1);
        assert_non_null(strstr(err, "x4-bench: cpu backend, --cache f16, 4 pages of 256 tokens for 2 sequences of "
                                    "302 tokens (decode at ctx 300 + 2 steps, batch 2): "));
        assert_non_null(strstr(err, "cache type 1 not supported"));
        /* nothing measured */
        assert_null(strstr(out, "\"what\":\"decode\""));

        assert_int_equal(bench(NULL, "--cache q8", out, sizeof out, err, sizeof err), 1);
        assert_string_equal(err, "x4-bench: --cache: 'q8' is not a cache type; f32 or f16 expected\n");
        assert_int_equal(bench(NULL, "--decode-prefill-max 0", out, sizeof out, err, sizeof err), 1);
        assert_string_equal(err, "x4-bench: --decode-prefill-max: '0' is not an integer >= 256\n");
        /* less than a page: a longer context could not be filled by whole pages */
        assert_int_equal(bench(NULL, "--decode-prefill-max 255", out, sizeof out, err, sizeof err), 1);
        assert_string_equal(err, "x4-bench: --decode-prefill-max: '255' is not an integer >= 256\n");
        assert_int_equal(bench(NULL, "--decode-prefill-max 4k", out, sizeof out, err, sizeof err), 1);
        assert_string_equal(err, "x4-bench: --decode-prefill-max: '4k' is not an integer >= 256\n");
        assert_int_equal(bench(NULL, "--cpu-math q8", out, sizeof out, err, sizeof err), 1);
        assert_string_equal(err, "x4-bench: --cpu-math: 'q8', fp32 or fast expected\n");
}

/* --cpu-math fast: the backend's fast numerics, named in every JSON line and the table header;
 * the default (fp32) in the JSON lines only */
static void test_cpu_math(void **state) {
        char out[16384], err[4096];

        (void) state;
        assert_int_equal(bench(NULL, "--prefill 16 --decode-ctx 32 --batch 1 --decode-tokens 2 --repeats 1 --cpu-math fast",
                               out, sizeof out, err, sizeof err), 0);
        assert_non_null(strstr(out, "\"what\":\"prefill\",\"tokens\":16,"));
        assert_non_null(strstr(out, "\"cpu_math\":\"fast\"}\n"));
        assert_null(strstr(out, "\"cpu_math\":\"fp32\""));
        assert_non_null(strstr(out, "  cpu-math fast\n"));
        assert_int_equal(bench(NULL, "--prefill 16 --decode-ctx none --repeats 1", out, sizeof out, err, sizeof err), 0);
        assert_non_null(strstr(out, "\"cpu_math\":\"fp32\"}\n"));
        assert_null(strstr(out, "cpu-math fast"));
}

static void test_cpu_profile_unsupported(void **state) {
        char out[16384], err[4096];

        (void) state;
        assert_int_equal(bench(NULL, "--prefill 16 --decode-ctx 300 --decode-prefill-max 256 --batch 2 "
                                     "--decode-tokens 2 --repeats 1 --profile", out, sizeof out, err, sizeof err), 0);
        /* said once for the two measurements, on stderr */
        assert_string_equal(err, "profile: not supported by the cpu backend\n");
        assert_null(strstr(out, "\"what\":\"profile\""));
        assert_non_null(strstr(out, "\"what\":\"decode\",\"ctx\":300,\"batch\":2,"));
        /* the table: the cache in the header, how the context was filled */
        assert_non_null(strstr(out, "  cache f32  commit "));
        assert_non_null(strstr(out, "decode   ctx 300 batch 2"));
        assert_non_null(strstr(out, "per step; ctx: 256 prefilled + page copies\n"));
}

/* The stand-in backend: profiled decode at a context of 600 = 2 pages + 88 tokens, prefill max
 * 300 (rounded down to one page of 256), batch 2, 2 steps, f16. */
static void test_fake_profile_and_layout(void **state) {
        char out[16384], err[4096], trace[16384], env[512];
        const char *step0 = "fwd 600+1@0,1,2 600+1@3,4,5\n", *step1 = "fwd 601+1@0,1,2 601+1@3,4,5\n";
        char expect[4096];

        (void) state;
        if (!T.have_module)
                skip();
        snprintf(env, sizeof env, "X4_CUDA_MODULE='%s' X4_FAKE_TRACE='%s'", T.module, T.trace);
        assert_int_equal(bench(env, "--device cuda --cache f16 --prefill 16 --decode-ctx 600 --decode-prefill-max 300 "
                                    "--batch 2 --decode-tokens 2 --repeats 1 --profile --json",
                               out, sizeof out, err, sizeof err), 0);
        assert_string_equal(err, "");
        slurp(T.trace, trace, sizeof trace);
        /* 602 tokens (600 + 2 steps) = 3 pages for each of 2 sequences; one page prefilled, pages
         * 1 and 2 copies of it; the batch-mate a copy of all three; profiling only around one
         * more run after the timed ones (warm-up + 1 repeat) */
        snprintf(expect, sizeof expect,
                 "create pages=6 page_tokens=256 cache=1\n"
                 "fwd 0+1@0\n"                                            /* page in the weights */
                 "fwd 0+16@0\n" "fwd 0+16@0\n"                            /* prefill: warm-up, timed */
                 "profile on\n" "fwd 0+16@0\n" "profile off\n"
                 "fwd 0+256@0\n" "copy 1<-0\n" "copy 2<-0\n"              /* decode setup */
                 "copy 3<-0\n" "copy 4<-1\n" "copy 5<-2\n"
                 "%s%s" "%s%s"                                            /* warm-up, timed */
                 "profile on\n" "%s" "profile off\n"                      /* kernels per step */
                 "profile on\n" "%s%s" "profile off\n"
                 "destroy\n",
                 step0, step1, step0, step1, step0, step0, step1);
        assert_string_equal(trace, expect);

        /* per step: 10 kernels, classes by time, shares of the 2 ms */
        assert_non_null(strstr(out, "{\"what\":\"decode\",\"ctx\":600,\"batch\":2,"));
        /* the decode line carries the counted kernels per step and the model's general.name */
        assert_non_null(strstr(out, "\"ctx_prefilled\":256,\"kernels_per_step\":10.0,\"cpu_ms\":"));
        assert_non_null(strstr(out, "\"model_name\":\""));
        /* and the backend's pass length (the fake's max_batch_tokens) */
        assert_non_null(strstr(out, "\"prompt_class\":false,\"pass_tokens\":1048576,\"model\":"));
        assert_non_null(strstr(out, "\"ctx_filled\":\"prefill+copy\",\"ctx_prefilled\":256,"));
        assert_non_null(strstr(out,
                "{\"what\":\"profile\",\"ctx\":600,\"batch\":2,\"kernels_per_step\":10.0,\"ms_sum\":2.0000,"
                "\"classes\":[{\"name\":\"experts\",\"kernels\":8.0,\"ms\":1.5000,\"share\":0.7500,"
                "\"mb\":3000.000,\"gb_s\":2000.0},"
                "{\"name\":\"attention\",\"kernels\":2.0,\"ms\":0.5000,\"share\":0.2500,\"mb\":0.000,\"gb_s\":0.0}],"
                "\"cache\":\"f16\",\"device\":\"cuda:fake\","));
        assert_non_null(strstr(out,
                "{\"what\":\"profile\",\"tokens\":16,\"kernels_per_prefill\":10.0,\"ms_sum\":2.0000,"
                "\"classes\":[{\"name\":\"experts\","));
        assert_int_equal(count_substr(out, "\"what\":\"profile\""), 2);

        /* the human table: a block per shape */
        assert_int_equal(bench(env, "--device cuda --prefill 16 --decode-ctx 600 --batch 2 --decode-tokens 2 "
                                    "--repeats 1 --profile", out, sizeof out, err, sizeof err), 0);
        assert_non_null(strstr(out, "\nprofile  decode ctx 600 batch 2: 10.0 kernels, 2.000 ms of kernel time per step\n"));
        /* MB and GB/s where the backend counted bytes (the fake's experts: 3 GB a step in 1.5 ms),
         * "-" where it did not */
        assert_non_null(strstr(out, "  class                      kernels         ms   share         MB     GB/s\n"));
        assert_non_null(strstr(out, "  experts                        8.0     1.5000   75.0%    3000.00     2000\n"
                                    "  attention                      2.0     0.5000   25.0%          -        -\n"));
        assert_non_null(strstr(out, "\nprofile  prefill 16 tokens: 10.0 kernels, 2.000 ms of kernel time per prefill\n"));
}

/* --warmup 0 (a 32K prefill runs once, not twice) and "none" for a measurement list. */
static void test_fake_warmup_and_none(void **state) {
        char out[16384], err[4096], trace[16384], env[512];

        (void) state;
        if (!T.have_module)
                skip();
        snprintf(env, sizeof env, "X4_CUDA_MODULE='%s' X4_FAKE_TRACE='%s'", T.module, T.trace);
        assert_int_equal(bench(env, "--device cuda --prefill 16 --decode-ctx none --warmup 0 --repeats 2 --json",
                               out, sizeof out, err, sizeof err), 0);
        assert_string_equal(err, "");
        slurp(T.trace, trace, sizeof trace);
        /* no warm-up: the two timed prefills only; no decode at all */
        /* no --cache: the daemon's choice on the cuda backend, f16 */
        assert_string_equal(trace, "create pages=1 page_tokens=256 cache=1\n"
                                   "fwd 0+1@0\n"
                                   "fwd 0+16@0\n" "fwd 0+16@0\n"
                                   "destroy\n");
        assert_non_null(strstr(out, "{\"what\":\"prefill\",\"tokens\":16,"));
        assert_null(strstr(out, "\"what\":\"decode\""));

        assert_int_equal(bench(env, "--device cuda --cache f32 --prefill none --decode-ctx 300 --batch 1 "
                                    "--decode-tokens 1 --warmup 0 --repeats 1 --json", out, sizeof out, err, sizeof err), 0);
        slurp(T.trace, trace, sizeof trace);
        /* decode setup, then one timed step (no warm-up step) */
        assert_string_equal(trace, "create pages=2 page_tokens=256 cache=0\n"
                                   "fwd 0+1@0\n"
                                   "fwd 0+300@0,1\n"
                                   "fwd 300+1@0,1\n"
                                   "profile on\n" "fwd 300+1@0,1\n" "profile off\n"
                                   "destroy\n");
        assert_null(strstr(out, "\"what\":\"prefill\""));

        assert_int_equal(bench(NULL, "--warmup 2", out, sizeof out, err, sizeof err), 1);
        assert_string_equal(err, "x4-bench: --warmup: '2' is not 0 or 1\n");
        assert_int_equal(bench(NULL, "--repeats none", out, sizeof out, err, sizeof err), 1);
        assert_string_equal(err, "x4-bench: --repeats: 'none' is not an integer >= 1\n");
}

/* Contexts below, at and above --decode-prefill-max 512, the last two not whole pages, the last
 * one with copies of more than one page; batch 3. */
static void test_fake_decode_fill_edges(void **state) {
        char out[16384], err[4096], trace[16384], env[512];
        char expect[8192];
        const char *mates2 = "copy 4<-0\ncopy 5<-1\ncopy 8<-0\ncopy 9<-1\n";

        (void) state;
        if (!T.have_module)
                skip();
        snprintf(env, sizeof env, "X4_CUDA_MODULE='%s' X4_FAKE_TRACE='%s'", T.module, T.trace);
        assert_int_equal(bench(env, "--device cuda --prefill 16 --decode-ctx 300,512,513,1000 "
                                    "--decode-prefill-max 512 --batch 3 --decode-tokens 1 --repeats 1 --json",
                               out, sizeof out, err, sizeof err), 0);
        slurp(T.trace, trace, sizeof trace);
        /* 1001 tokens (1000 + 1 step) = 4 pages for each of 3 sequences */
        snprintf(expect, sizeof expect,
                 "create pages=12 page_tokens=256 cache=1\n"
                 "fwd 0+1@0\n" "fwd 0+16@0\n" "fwd 0+16@0\n"
                 /* 300 < 512: prefilled, 2 pages */
                 "fwd 0+300@0,1\n" "%s"
                 "fwd 300+1@0,1 300+1@4,5 300+1@8,9\n" "fwd 300+1@0,1 300+1@4,5 300+1@8,9\n"
                 "profile on\n" "fwd 300+1@0,1 300+1@4,5 300+1@8,9\n" "profile off\n"
                 /* 512 == 512: prefilled; the step's position 512 opens page 2 */
                 "fwd 0+512@0,1\n" "%s"
                 "fwd 512+1@0,1,2 512+1@4,5,6 512+1@8,9,10\n" "fwd 512+1@0,1,2 512+1@4,5,6 512+1@8,9,10\n"
                 "profile on\n" "fwd 512+1@0,1,2 512+1@4,5,6 512+1@8,9,10\n" "profile off\n"
                 /* 513 > 512: 2 pages prefilled, page 2 (position 512) a copy of page 0 */
                 "fwd 0+512@0,1\n" "copy 2<-0\n"
                 "copy 4<-0\ncopy 5<-1\ncopy 6<-2\ncopy 8<-0\ncopy 9<-1\ncopy 10<-2\n"
                 "fwd 513+1@0,1,2 513+1@4,5,6 513+1@8,9,10\n" "fwd 513+1@0,1,2 513+1@4,5,6 513+1@8,9,10\n"
                 "profile on\n" "fwd 513+1@0,1,2 513+1@4,5,6 513+1@8,9,10\n" "profile off\n"
                 /* 1000: pages 2 and 3 copies of pages 0 and 1, cyclically */
                 "fwd 0+512@0,1\n" "copy 2<-0\n" "copy 3<-1\n"
                 "copy 4<-0\ncopy 5<-1\ncopy 6<-2\ncopy 7<-3\ncopy 8<-0\ncopy 9<-1\ncopy 10<-2\ncopy 11<-3\n"
                 "fwd 1000+1@0,1,2,3 1000+1@4,5,6,7 1000+1@8,9,10,11\n"
                 "fwd 1000+1@0,1,2,3 1000+1@4,5,6,7 1000+1@8,9,10,11\n"
                 "profile on\n" "fwd 1000+1@0,1,2,3 1000+1@4,5,6,7 1000+1@8,9,10,11\n" "profile off\n"
                 "destroy\n",
                 mates2, mates2);
        assert_string_equal(trace, expect);
        assert_non_null(strstr(out, "\"ctx\":300,\"batch\":3,"));
        assert_non_null(strstr(out, "\"ctx_filled\":\"prefill\",\"ctx_prefilled\":300,"));
        assert_non_null(strstr(out, "\"ctx_filled\":\"prefill\",\"ctx_prefilled\":512,"));
        assert_int_equal(count_substr(out, "\"ctx_filled\":\"prefill+copy\",\"ctx_prefilled\":512,"), 2);

        /* a prefill longer than the decode context: sequence 0 alone holds it */
        assert_int_equal(bench(env, "--device cuda --prefill 1000 --decode-ctx 300 --batch 3 --decode-tokens 1 "
                                    "--repeats 1 --json", out, sizeof out, err, sizeof err), 0);
        slurp(T.trace, trace, sizeof trace);
        /* 4 pages for the 1000-token prefill + 2 for each batch-mate's 301 tokens */
        assert_non_null(strstr(trace, "create pages=8 page_tokens=256 cache=1\n"));
        assert_non_null(strstr(trace, "fwd 0+1000@0,1,2,3\n"));
        assert_non_null(strstr(trace, "fwd 300+1@0,1 300+1@4,5 300+1@6,7\n"));
}

/* --mtp-prompt on the demo preset (random weights: the acceptance is whatever it is, but the
 * tokens with MTP on must be those with it off, and the lines must say what ran). */
static void test_cpu_mtp_prompt(void **state) {
        char out[16384], err[4096], args[1024], *line;
        unsigned tokens, prompt;

        (void) state;
        assert_int_equal(bench(NULL, "--prefill none --decode-ctx none --decode-tokens 6 --repeats 1 --warmup 0 "
                                     "--threads 2 --mtp on --mtp-draft 2 --mtp-prompt 'What does tar do?' "
                                     "--mtp-prompt 'What is the meaning of \"harbor\"?' --json",
                               out, sizeof out, err, sizeof err), 0);
        assert_string_equal(err, "");
        /* load, 2 questions × (off, on), the total */
        assert_int_equal(count_substr(out, "\n"), 6);
        assert_int_equal(count_substr(out, "{\"what\":\"generate\",\"mtp\":\"off\",\"mtp_draft\":0,"), 2);
        assert_int_equal(count_substr(out, "{\"what\":\"generate\",\"mtp\":\"on\",\"mtp_draft\":2,"), 2);
        assert_int_equal(count_substr(out, "\"same_tokens\":true"), 3);
        /* x4-mkmodel writes tokenizer.chat_template: the model's own template, as the daemon uses it */
        assert_int_equal(count_substr(out, "\"template\":\"gguf\""), 4);
        assert_int_equal(count_substr(out, "\"question\":1,\"max_tokens\":6,"), 2);
        assert_int_equal(count_substr(out, "\"question\":2,\"max_tokens\":6,"), 2);
        /* the question's text, JSON-escaped */
        assert_int_equal(count_substr(out, "\"text\":\"What is the meaning of \\\"harbor\\\"?\""), 2);
        /* the prompt: the rendered chat turn, longer than the question's few words */
        line = strstr(out, "{\"what\":\"generate\",\"mtp\":\"off\"");
        assert_non_null(line);
        assert_int_equal(sscanf(line, "{\"what\":\"generate\",\"mtp\":\"off\",\"mtp_draft\":0,\"prompt\":%u,"
                                      "\"tokens\":%u,", &prompt, &tokens), 2);
        assert_true(prompt > 5);
        assert_true(tokens >= 1 && tokens <= 6);
        line = strstr(out, "{\"what\":\"generate_total\",\"mtp_draft\":2,\"questions\":2,");
        assert_non_null(line);
        assert_non_null(strstr(line, "\"max_tokens\":6,"));
        assert_non_null(strstr(line, "\"tok_s_on\":"));
        assert_non_null(strstr(line, "\"acceptance\":"));

        /* the human table: one block per question */
        assert_int_equal(bench(NULL, "--prefill none --decode-ctx none --decode-tokens 2 --repeats 1 --warmup 0 "
                                     "--mtp off --mtp-prompt 'Compute 12 times 34.'",
                               out, sizeof out, err, sizeof err), 0);
        assert_non_null(strstr(out, "generate (greedy, batch 1, 1 chat questions, the GGUF's template)\n"));
        assert_non_null(strstr(out, "  question 1 (prompt "));
        assert_non_null(strstr(out, "{\"what\":\"generate_total\",\"mtp_draft\":0,\"questions\":1,"));
        assert_null(strstr(out, "\"tok_s_on\""));

        /* refusals, naming the flag */
        assert_int_equal(bench(NULL, "--prefill none --decode-ctx none --mtp-prompt 'What does tar do?'",
                               out, sizeof out, err, sizeof err), 1);
        assert_non_null(strstr(err, "--mtp-prompt needs --mtp off|on"));
        assert_int_equal(bench(NULL, "--mtp on --mtp-prompt ''", out, sizeof out, err, sizeof err), 1);
        assert_non_null(strstr(err, "--mtp-prompt: an empty question; a non-empty text expected"));
        snprintf(args, sizeof args, "--config '%s' --prefill none --decode-ctx none --decode-tokens 2 --mtp on "
                 "--mtp-prompt 'What does tar do?'", T.tiny_config);
        assert_int_equal(bench_model(T.tiny, NULL, args, out, sizeof out, err, sizeof err), 1);
        assert_non_null(strstr(err, "x4-bench: --mtp on: tiny.gguf has no NextN block (nextn_predict_layers 0, "));
        assert_non_null(strstr(err, "a model with the NextN block expected"));
        snprintf(args, sizeof args, "--config '%s' --prefill none --decode-ctx none --decode-tokens 2 --mtp off "
                 "--mtp-prompt 'What does tar do?'", T.tiny_config);
        assert_int_equal(bench_model(T.notok, NULL, args, out, sizeof out, err, sizeof err), 1);
        assert_non_null(strstr(err, "x4-bench: --mtp-prompt: notok.gguf has no usable tokenizer ("));
        assert_non_null(strstr(err, "tokenizer.ggml.model missing"));
        assert_null(strstr(out, "\"what\":\"generate"));
}

/* Run `env x4-logits --model demo --prompt 1,2 args --out DIR/logits.bin`; stderr into err; the
 * exit status. */
static int logits(const char *env, const char *args, char *err, size_t err_size) {
        const char *bdir = getenv("X4_BUILD_DIR");
        char cmd[4096];
        int status;

        assert_non_null(bdir);
        snprintf(cmd, sizeof cmd, "%s '%s/tools/x4-logits' --model '%s' --prompt 1,2 %s --out '%s/logits.bin' 2>'%s'",
                 env ? env : "", bdir, T.gguf, args, T.dir, T.err);
        status = system(cmd);
        assert_true(WIFEXITED(status));
        slurp(T.err, err, err_size);
        return WEXITSTATUS(status);
}

/* x4-logits --cache: f32 by default on either backend, f16 asked of the backend (the stand-in
 * traces it), refused on the cpu and when misspelled, naming the option */
static void test_logits_cache(void **state) {
        char err[4096], trace[16384], env[512];

        (void) state;
        /* cpu, the default f32 */
        assert_int_equal(logits(NULL, "", err, sizeof err), 0);
        assert_int_equal(logits(NULL, "--cache f16", err, sizeof err), 1);
        assert_non_null(strstr(err, "--cache f16: the cpu backend keeps an f32 cache only; --device cuda or --cache f32 expected"));
        assert_int_equal(logits(NULL, "--cache f8", err, sizeof err), 1);
        assert_non_null(strstr(err, "--cache: 'f8' is not a cache type; f32 or f16 expected"));
        if (!T.have_module)
                return;
        /* the stand-in "cuda" backend is asked for the cache named, f32 unless told */
        const char *caches[2][2] = {{"--device cuda", "cache=0"}, {"--device cuda --cache f16", "cache=1"}};
        snprintf(env, sizeof env, "X4_CUDA_MODULE='%s' X4_FAKE_TRACE='%s'", T.module, T.trace);
        for (int i = 0; i < 2; i++) {
                assert_int_equal(logits(env, caches[i][0], err, sizeof err), 0);
                slurp(T.trace, trace, sizeof trace);
                assert_non_null(strstr(trace, caches[i][1]));
        }
}

/* x4-logits --experts: a line per MoE layer, the distinct routed experts its tokens selected (at
 * least k = the model's experts per token, at most all of them); without it, no such line */
static void test_logits_experts(void **state) {
        const char *bdir = getenv("X4_BUILD_DIR");
        char cmd[4096], out[16384], path[600];
        (void) state;
        assert_non_null(bdir);
        snprintf(path, sizeof path, "%s/experts.txt", T.dir);
        for (int with = 0; with < 2; with++) {
                snprintf(cmd, sizeof cmd,
                         "'%s/tools/x4-logits' --model '%s' --prompt 1,2,3,4,5,6,7,8,9,10,11,12 %s --out '%s/logits.bin' "
                         ">'%s' 2>'%s'",
                         bdir, T.gguf, with ? "--experts" : "", T.dir, path, T.err);
                int status = system(cmd);
                assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
                slurp(path, out, sizeof out);
                unsigned lines = 0;
                for (const char *p = out; (p = strstr(p, "layer ")); p++) {
                        unsigned layer, n, e, toks;
                        assert_int_equal(sscanf(p, "layer %u: %u of %u routed experts selected by %u tokens", &layer, &n,
                                                &e, &toks), 4);
                        assert_int_equal(toks, 12);
                        assert_true(n >= 2 && n <= e);
                        lines++;
                }
                if (with)
                        assert_true(lines >= 1);
                else
                        assert_int_equal(lines, 0);
        }
}

/* X4_LOG_LEVEL: the tools keep their log to one error line, and the variable lifts that (the
 * GPU steps read a knob's warning this way); debug shows the model loader's line, an unknown
 * level is named on stderr and the run goes on */
static void test_logits_log_level(void **state) {
        char err[4096];

        (void) state;
        assert_int_equal(logits(NULL, "", err, sizeof err), 0);
        assert_null(strstr(err, "debug:"));
        assert_int_equal(logits("X4_LOG_LEVEL=debug", "", err, sizeof err), 0);
        assert_non_null(strstr(err, "debug: "));
        assert_non_null(strstr(err, "trunk blocks"));
        assert_int_equal(logits("X4_LOG_LEVEL=loud", "", err, sizeof err), 0);
        assert_non_null(strstr(err, "X4_LOG_LEVEL=loud ignored: one of err, warning, notice, info, debug expected"));
        assert_null(strstr(err, "debug:"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_logits_log_level),
                cmocka_unit_test(test_logits_experts),
                cmocka_unit_test(test_logits_cache),
                cmocka_unit_test(test_cpu_decode_prefill_copy),
                cmocka_unit_test(test_cpu_refusals), cmocka_unit_test(test_cpu_math),
                cmocka_unit_test(test_grammar_mask),
                cmocka_unit_test(test_cpu_mtp_prompt),
                cmocka_unit_test(test_cpu_profile_unsupported),
                cmocka_unit_test(test_fake_profile_and_layout),
                cmocka_unit_test(test_fake_decode_fill_edges),
                cmocka_unit_test(test_fake_warmup_and_none),
        };

        return cmocka_run_group_tests(tests, setup, teardown);
}
