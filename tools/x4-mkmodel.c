/* SPDX-License-Identifier: MIT */
/* x4-mkmodel: write a synthetic xing4_0 GGUF (docs/model.md §2) and its config.json. See tools/README.md. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf/ggml.h"
#include "model/mkmodel.h"
#include "common/log.h"
#include "common/util.h"

static void usage(FILE *f) {
        fputs("Usage: x4-mkmodel [OPTIONS] --out FILE.gguf\n"
              "Write a synthetic xing4_0 model (random weights, exact schema) and its config.json.\n\n"
              "  --preset NAME        tiny | demo | full (default tiny)\n"
              "  --seed N             PRNG seed (default 1); same seed + shape = same bytes\n"
              "  --out PATH           the .gguf to write (required)\n"
              "  --config-out PATH    config.json to write (default: config.json next to the gguf;\n"
              "                       \"\" for none)\n"
              "  --force              replace an existing config.json that x4-mkmodel did not write\n"
              "  --header-only        header + ftruncate to the full size (sparse file)\n"
              "  --threads N          writer threads (default: all CPUs)\n"
              "  --quiet              no progress on stderr\n"
              "Shape overrides (on top of the preset):\n"
              "  --hidden N --layers N (trunk) --dense N --nextn N --heads N --q-lora N --kv-lora N\n"
              "  --qk-nope N --qk-rope N --v-head N --ff N (dense FFN) --experts N --experts-used N\n"
              "  --shared-experts N --expert-ff N --vocab N --ctx N (multiple of 4096)\n"
              "  --attn-type T --ffn-type T --output-type T   (F32 F16 BF16 Q8_0 Q6_K IQ4_NL,\n"
              "                       or Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K IQ4_XS as a user's quantization)\n",
              f);
}

static int parse_opt_u32(const char *opt, const char *s, uint32_t *ret) {
        uint64_t v;
        if (parse_uint(s, 0, UINT32_MAX, &v) < 0) /* base 0: a seed may be written in hex */
                return log_error_errno(EINVAL, "--%s: \"%s\" is not an unsigned 32-bit integer", opt, s);
        *ret = (uint32_t) v;
        return 0;
}

static int parse_type(const char *opt, const char *s, uint32_t *ret) {
        for (uint32_t t = 0; t < GGML_TYPE_COUNT; t++) {
                const struct ggml_type_info *ti = ggml_type_get(t);
                if (ti && strcasecmp(ti->name, s) == 0) {
                        *ret = t;
                        return 0;
                }
        }
        return log_error_errno(EINVAL, "--%s: unknown type \"%s\"; F32, F16, BF16, Q8_0, Q6_K, IQ4_NL, Q4_0, Q4_1, "
                               "Q5_0, Q5_1, Q4_K, Q5_K or IQ4_XS expected",
                               opt, s);
}

int main(int argc, char **argv) {
        enum {
                ARG_PRESET = 0x100, ARG_SEED, ARG_OUT, ARG_CONFIG_OUT, ARG_HEADER_ONLY, ARG_THREADS,
                ARG_QUIET, ARG_HIDDEN, ARG_LAYERS, ARG_DENSE, ARG_NEXTN, ARG_HEADS, ARG_Q_LORA,
                ARG_KV_LORA, ARG_QK_NOPE, ARG_QK_ROPE, ARG_V_HEAD, ARG_FF, ARG_EXPERTS,
                ARG_EXPERTS_USED, ARG_SHARED, ARG_EXPERT_FF, ARG_VOCAB, ARG_CTX, ARG_ATTN_TYPE,
                ARG_FFN_TYPE, ARG_OUTPUT_TYPE, ARG_FORCE,
        };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "preset", required_argument, NULL, ARG_PRESET },
                { "seed", required_argument, NULL, ARG_SEED },
                { "out", required_argument, NULL, ARG_OUT },
                { "config-out", required_argument, NULL, ARG_CONFIG_OUT },
                { "force", no_argument, NULL, ARG_FORCE },
                { "header-only", no_argument, NULL, ARG_HEADER_ONLY },
                { "threads", required_argument, NULL, ARG_THREADS },
                { "quiet", no_argument, NULL, ARG_QUIET },
                { "hidden", required_argument, NULL, ARG_HIDDEN },
                { "layers", required_argument, NULL, ARG_LAYERS },
                { "dense", required_argument, NULL, ARG_DENSE },
                { "nextn", required_argument, NULL, ARG_NEXTN },
                { "heads", required_argument, NULL, ARG_HEADS },
                { "q-lora", required_argument, NULL, ARG_Q_LORA },
                { "kv-lora", required_argument, NULL, ARG_KV_LORA },
                { "qk-nope", required_argument, NULL, ARG_QK_NOPE },
                { "qk-rope", required_argument, NULL, ARG_QK_ROPE },
                { "v-head", required_argument, NULL, ARG_V_HEAD },
                { "ff", required_argument, NULL, ARG_FF },
                { "experts", required_argument, NULL, ARG_EXPERTS },
                { "experts-used", required_argument, NULL, ARG_EXPERTS_USED },
                { "shared-experts", required_argument, NULL, ARG_SHARED },
                { "expert-ff", required_argument, NULL, ARG_EXPERT_FF },
                { "vocab", required_argument, NULL, ARG_VOCAB },
                { "ctx", required_argument, NULL, ARG_CTX },
                { "attn-type", required_argument, NULL, ARG_ATTN_TYPE },
                { "ffn-type", required_argument, NULL, ARG_FFN_TYPE },
                { "output-type", required_argument, NULL, ARG_OUTPUT_TYPE },
                {}
        };
        struct x4_mkmodel_options o = { .seed = 1, .progress = true };
        struct x4_mkmodel_shape s;
        const char *preset = "tiny";
        int c, r;

        log_set_ident("x4-mkmodel");
        /* the preset first, so shape flags override it whatever their order */
        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--preset") == 0 && i + 1 < argc)
                        preset = argv[i + 1];
                else if (strncmp(argv[i], "--preset=", 9) == 0)
                        preset = argv[i] + 9;
        }
        if (x4_mkmodel_preset(preset, &s) < 0)
                return 2;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                uint32_t *field = NULL, *type = NULL, v32 = 0;
                switch (c) {
                case 'h':
                        usage(stdout);
                        return 0;
                case ARG_PRESET:
                        break;
                case ARG_SEED: {
                        char *end;
                        errno = 0;
                        o.seed = strtoull(optarg, &end, 0);
                        if (errno || end == optarg || *end || optarg[0] == '-') {
                                log_error("--seed: \"%s\" is not an unsigned 64-bit integer", optarg);
                                return 2;
                        }
                        break;
                }
                case ARG_OUT:
                        o.out = optarg;
                        break;
                case ARG_CONFIG_OUT:
                        o.config_out = optarg;
                        break;
                case ARG_FORCE:
                        o.force_config = true;
                        break;
                case ARG_HEADER_ONLY:
                        o.header_only = true;
                        break;
                case ARG_THREADS:
                        if (parse_opt_u32("threads", optarg, &v32) < 0)
                                return 2;
                        o.threads = v32;
                        break;
                case ARG_QUIET:
                        o.progress = false;
                        break;
                case ARG_HIDDEN: field = &s.n_embd; break;
                case ARG_LAYERS: field = &s.n_layer; break;
                case ARG_DENSE: field = &s.n_dense; break;
                case ARG_NEXTN: field = &s.n_nextn; break;
                case ARG_HEADS: field = &s.n_head; break;
                case ARG_Q_LORA: field = &s.q_lora_rank; break;
                case ARG_KV_LORA: field = &s.kv_lora_rank; break;
                case ARG_QK_NOPE: field = &s.qk_nope; break;
                case ARG_QK_ROPE: field = &s.qk_rope; break;
                case ARG_V_HEAD: field = &s.v_head; break;
                case ARG_FF: field = &s.n_ff; break;
                case ARG_EXPERTS: field = &s.n_expert; break;
                case ARG_EXPERTS_USED: field = &s.n_expert_used; break;
                case ARG_SHARED: field = &s.n_expert_shared; break;
                case ARG_EXPERT_FF: field = &s.n_ff_exp; break;
                case ARG_VOCAB: field = &s.n_vocab; break;
                case ARG_CTX: field = &s.n_ctx; break;
                case ARG_ATTN_TYPE: type = &s.type_attn; break;
                case ARG_FFN_TYPE: type = &s.type_ffn; break;
                case ARG_OUTPUT_TYPE: type = &s.type_output; break;
                default:
                        usage(stderr);
                        return 2;
                }
                const char *name = NULL;
                for (const struct option *op = options; op->name; op++)
                        if (op->val == c)
                                name = op->name;
                if (field && parse_opt_u32(name, optarg, field) < 0)
                        return 2;
                if (type && parse_type(name, optarg, type) < 0)
                        return 2;
        }
        if (optind < argc) {
                log_error("unexpected argument \"%s\"", argv[optind]);
                return 2;
        }
        if (!o.out) {
                log_error("--out FILE.gguf is required");
                usage(stderr);
                return 2;
        }
        /* before writing gigabytes: a folder there would only show at the final rename */
        struct stat st;
        if (stat(o.out, &st) == 0 && S_ISDIR(st.st_mode)) {
                log_error("--out %s: is a folder, a file path expected", o.out);
                return 2;
        }
        r = x4_mkmodel_write(&s, &o);
        if (r < 0)
                return 1;
        return 0;
}
