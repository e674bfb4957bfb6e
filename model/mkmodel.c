/* SPDX-License-Identifier: MIT */
#include "model/mkmodel.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/rng.h"
#include "chat/chat_xing4.h"
#include "gguf/ggml.h"
#include "gguf/gguf_writer.h"
#include "kernels/cpu/quant.h"
#include "model/xing4.h"

/* Same bytes on every machine: no contraction of a*b+c into an FMA (GCC does not contract in ISO
 * C mode; clang does unless told). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- PRNG: splitmix64 to seed, xoshiro256** to draw (common/rng.h) ---- */

struct rng {
        uint64_t s[4];
};

static void rng_seed(struct rng *r, uint64_t seed, uint64_t stream, uint64_t sub) {
        uint64_t x = seed;
        uint64_t k = splitmix64(&x) ^ (stream * 0xd1342543de82ef95ull);
        k = splitmix64(&k) ^ (sub * 0xa0761d6478bd642full);
        for (int i = 0; i < 4; i++)
                r->s[i] = splitmix64(&k);
}

static inline uint64_t rng_next(struct rng *r) {
        return xoshiro256_next(r->s);
}

static double rng_uniform(struct rng *r) { /* [0, 1) */
        return xoshiro256_uniform(r->s);
}

/* Approximately N(0, 1): Irwin–Hall sum of four 16-bit uniforms (tails end at ±3.46σ, which
 * random weights do not miss). Integer sums and one multiplication, no libm transcendental:
 * the bytes do not depend on the C library's log/cos (reproducible across machines). */
static double rng_gauss(struct rng *r) {
        uint64_t x = rng_next(r);
        int64_t s = (int64_t) (x & 0xffff) + (int64_t) ((x >> 16) & 0xffff) + (int64_t) ((x >> 32) & 0xffff) +
                    (int64_t) (x >> 48);
        /* mean 4 · 32767.5, sd sqrt(4 · (65536² − 1) / 12) */
        static const double half_inv_sd = 0.5 / 37837.227237206;
        return (double) (2 * s - 262140) * half_inv_sd;
}

static void rng_fill(struct rng *r, uint8_t *p, size_t n) {
        while (n >= 8) {
                uint64_t x = rng_next(r);
                memcpy(p, &x, 8);
                p += 8;
                n -= 8;
        }
        if (n > 0) {
                uint64_t x = rng_next(r);
                memcpy(p, &x, n);
        }
}

/* ---- vocabulary (docs/model.md §7) -------------------------------------------------------- */

/* Frequent English words, most frequent first, that the BPE merges are learned from (a Zipf
 * weight by rank), so that a demo prompt tokenizes into word-like pieces. Written for this
 * project from general knowledge of English word frequency. */
static const char english_words[] =
        "the of and to a in is it you that he was for on are with as I his they be at one have "
        "this from or had by not word but what some we can out other were all there when up use "
        "your how said an each she which do their time if will way about many then them write "
        "would like so these her long make thing see him two has look more day could go come did "
        "number sound no most people my over know water than call first who may down side been now "
        "find any new work part take get place made live where after back little only round man "
        "year came show every good me give our under name very through just form sentence great "
        "think say help low line differ turn cause much mean before move right boy old too same "
        "tell does set three want air well also play small end put home read hand port large spell "
        "add even land here must big high such follow act why ask men change went light kind off "
        "need house picture try us again animal point mother world near build self earth father "
        "head stand own page should country found answer school grow study still learn plant cover "
        "food sun four between state keep eye never last let thought city tree cross farm hard "
        "start might story saw far sea draw left late run while press close night real life few "
        "north open seem together next white children begin got walk example ease paper group "
        "always music those both mark often letter until mile river car feet care second book "
        "carry took science eat room friend began idea fish mountain stop once base hear horse cut "
        "sure watch color face wood main enough plain girl usual young ready above ever red list "
        "though feel talk bird soon body dog family direct pose leave song measure door product "
        "black short numeral class wind question happen complete ship area half rock order fire "
        "south problem piece told knew pass since top whole king space heard best hour better true "
        "during hundred five remember step early hold west ground interest reach fast verb sing "
        "listen six table travel less morning ten simple several vowel toward war lay against "
        "pattern slow center love person money serve appear road map rain rule govern pull cold "
        "notice voice unit power town fine certain fly fall lead cry dark machine note wait plan "
        "figure star box noun field rest correct able pound done beauty drive stood contain front "
        "teach week final gave green quick develop ocean warm free minute strong special mind "
        "behind clear tail produce fact street inch multiply nothing course stay wheel full force "
        "blue object decide surface deep moon island foot system busy test record boat common gold "
        "possible plane stead dry wonder laugh thousand ago ran check game shape equate miss "
        "brought heat snow tire bring yes distant fill east paint language among grand ball yet "
        "wave drop heart present heavy dance engine position arm wide sail material size vary "
        "settle speak weight general ice matter circle pair include divide syllable felt perhaps "
        "pick sudden count square reason length represent art subject region energy hunt probable "
        "bed brother egg ride cell believe fraction forest sit race window store summer train "
        "sleep prove lone leg exercise wall catch mount wish sky board joy winter sat written wild "
        "instrument kept glass grass cow job edge sign visit past soft fun bright gas weather "
        "month million bear finish happy hope flower clothe strange gone jump baby eight village "
        "meet root buy raise solve metal whether push seven paragraph third shall held hair "
        "describe cook floor either result burn hill safe cat century consider type law bit coast "
        "copy phrase silent tall sand soil roll temperature finger industry value fight lie beat "
        "excite natural view sense ear else quite broke case middle kill son lake moment scale "
        "loud spring observe child straight consonant nation dictionary milk speed method organ "
        "pay age section dress cloud surprise quiet stone tiny climb cool design poor lot "
        "experiment bottom key iron single stick flat twenty skin smile crease hole trade melody "
        "trip office receive row mouth exact symbol die least trouble shout except wrote seed tone "
        "join suggest clean break lady yard rise bad blow oil blood touch grew cent mix team wire "
        "cost lost brown wear garden equal sent choose fell fit flow fair bank collect save "
        "control decimal gentle woman captain practice separate difficult doctor please protect "
        "noon whose locate ring character insect caught period indicate radio spoke atom human "
        "history effect electric expect crop modern element hit student corner party supply bone "
        "rail imagine provide agree thus capital won chair danger fruit rich thick soldier process "
        "operate guess necessary sharp wing create neighbor wash bat rather crowd corn compare "
        "poem string bell depend meat rub tube famous dollar stream fear sight thin triangle "
        "planet hurry chief colony clock mine tie enter major fresh search send yellow gun allow "
        "print dead spot desert suit current lift rose continue block chart hat sell success "
        "company subtract event particular deal swim term opposite wife shoe shoulder spread "
        "arrange camp invent cotton born determine quart nine truck noise level chance gather shop "
        "stretch throw shine property column molecule select wrong gray repeat require broad "
        "prepare salt nose plural anger claim continent oxygen sugar death pretty skill women "
        "season solution magnet silver thank branch match suffix especially fig afraid huge sister "
        "steel discuss forward similar guide experience score apple bought led pitch coat mass "
        "card band rope slip win dream evening condition feed tool total basic smell valley nor "
        "double seat arrive master track parent shore division sheet substance favor connect post "
        "spend chord fat glad original share station dad bread charge proper bar offer segment "
        "slave duck instant market degree populate chick dear enemy reply drink occur support "
        "speech nature range steam motion path liquid log meant quotient teeth shell neck model "
        "computer data network program code function error file server request response message "
        "token context memory thread kernel France Paris Japan Tokyo today explain summary "
        "translate english assistant user reasoning because therefore however information "
        "important different following without within another ";

static const char *const special_pieces[24] = {
        "<_unk>",         "<_start>",     "<_end>",       "<_pad>",        "<_user>",
        "<_bot>",         "<_system>",    "<_observation>", "<_sep>",      "<think>",
        "</think>",       "<tool_call>",  "</tool_call>", "<tool_response>", "</tool_response>",
        "<_control1>",    "<_control2>",  "<_control3>",  "<_control4>",   "<_control5>",
        "<_control6>",    "<_control7>",  "<_control8>",  "<_control9>",
};

/* single letters that are not ASCII (UTF-8), for vocabularies large enough to afford them */
static const char *const extra_letters[] = {
        "é", "è", "à", "ç", "ü", "ö", "ä", "ñ", "ß", "á", "í", "ó", "ú", "â", "ê", "ô",
        "É", "Ü", "Ö", "Ä", "’", "“", "”", "—", "–", "…", "€", "°", "·", "×",
};

#define TOKEN_NORMAL 1
#define TOKEN_UNKNOWN 2
#define TOKEN_CONTROL 3
#define TOKEN_USER_DEFINED 4
#define TOKEN_BYTE 6

#define VOCAB_FIRST_USER 24
#define VOCAB_FIRST_BYTE 140
#define VOCAB_FIRST_NORMAL 396
#define SPACE_PIECE "\xe2\x96\x81" /* U+2581 ▁ */
#define RELEASE_VOCAB 131072
#define RELEASE_SPACE_ID 124361

struct vocab_builder {
        struct x4_mkmodel_vocab *v;
        uint32_t cap;       /* = n_vocab */
        uint32_t n_normal;  /* rank of the next NORMAL piece (score = -rank) */
        /* open-addressing index piece -> id, for uniqueness */
        uint32_t *index;
        uint32_t index_size;
};

static uint64_t str_hash(const char *s) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (; *s; s++)
                h = (h ^ (uint8_t) *s) * 0x100000001b3ull;
        return h;
}

static int64_t vocab_find(const struct vocab_builder *b, const char *piece) {
        for (uint64_t i = str_hash(piece) & (b->index_size - 1);; i = (i + 1) & (b->index_size - 1)) {
                uint32_t id = b->index[i];
                if (id == UINT32_MAX)
                        return -1;
                if (streq(b->v->pieces[id], piece))
                        return id;
        }
}

/* Append a piece; returns its id, -EEXIST if the text is already a piece, -ENOSPC when full. */
static int64_t vocab_add(struct vocab_builder *b, const char *piece, int32_t type) {
        struct x4_mkmodel_vocab *v = b->v;
        uint64_t i;

        if (v->n >= b->cap)
                return -ENOSPC;
        if (vocab_find(b, piece) >= 0)
                return -EEXIST;
        v->pieces[v->n] = strdup(piece);
        if (!v->pieces[v->n])
                return -ENOMEM;
        v->types[v->n] = type;
        v->scores[v->n] = type == TOKEN_NORMAL ? -(float) b->n_normal++ : 0.0f;
        for (i = str_hash(piece) & (b->index_size - 1); b->index[i] != UINT32_MAX;
             i = (i + 1) & (b->index_size - 1))
                ;
        b->index[i] = v->n;
        return v->n++;
}

/* BPE training over the word list (SentencePiece's BPE invariant: every merged piece is the
 * concatenation of two pieces already in the vocabulary, so the encoder can reach it). */
struct bpe_word {
        uint32_t *sym;
        uint32_t n;
        uint64_t weight;
};

struct pair_slot {
        uint32_t a, b;
        uint64_t count;
};

static int bpe_train(struct vocab_builder *b) {
        _cleanup_free_ char *text = strdup(english_words);
        _cleanup_free_ struct bpe_word *words = NULL;
        _cleanup_free_ struct pair_slot *pairs = NULL;
        _cleanup_free_ uint32_t *syms = NULL, *used = NULL;
        const uint32_t pair_size = 1u << 18; /* > the symbol positions of all forms */
        size_t n_words = 0, n_syms = 0, cap_words, cap_syms;
        char *save = NULL, *tok;
        int r = 0;

        if (!text)
                return -ENOMEM;
        cap_words = 8 * sizeof english_words; /* > 7 forms per word */
        cap_syms = 64 * sizeof english_words;
        words = calloc(cap_words, sizeof *words);
        syms = calloc(cap_syms, sizeof *syms);
        pairs = calloc(pair_size, sizeof *pairs);
        used = calloc(pair_size, sizeof *used);
        if (!words || !syms || !pairs || !used)
                return -ENOMEM;

        size_t rank = 0;
        for (tok = strtok_r(text, " ", &save); tok; tok = strtok_r(NULL, " ", &save), rank++) {
                char forms[8][64];
                uint64_t weights[8];
                size_t len = strlen(tok), n_forms = 0;
                bool e_end = len > 1 && tok[len - 1] == 'e';
                uint64_t weight = 1000000 / (rank + 10);

                if (len > 40)
                        continue;
                /* the word, Capitalized (sentence start), and a few regular inflections so the
                 * vocabulary has word-like pieces beyond the list itself */
#define FORM(wt, ...)                                                                              \
        do {                                                                                       \
                snprintf(forms[n_forms], sizeof forms[0], __VA_ARGS__);                            \
                weights[n_forms++] = (wt);                                                         \
        } while (0)
                FORM(weight, "%s", tok);
                if (tok[0] >= 'a' && tok[0] <= 'z') {
                        FORM(weight / 4, "%c%s", tok[0] - 'a' + 'A', tok + 1);
                        FORM(weight / 8, "%s%s", tok, tok[len - 1] == 's' ? "es" : "s");
                        if (len >= 4) {
                                FORM(weight / 12, "%s%s", tok, e_end ? "d" : "ed");
                                FORM(weight / 12, "%.*sing", (int) (e_end ? len - 1 : len), tok);
                                FORM(weight / 16, "%s%s", tok, e_end ? "r" : "er");
                        }
                        if (len >= 5)
                                FORM(weight / 24, "%sly", tok);
                }
#undef FORM
                for (size_t f = 0; f < n_forms; f++) {
                        struct bpe_word *bw = &words[n_words++];
                        int64_t id = vocab_find(b, SPACE_PIECE);

                        if (id < 0)
                                return -EINVAL;
                        bw->sym = &syms[n_syms];
                        bw->weight = MAX(weights[f], 1u);
                        bw->sym[bw->n++] = (uint32_t) id;
                        for (const char *c = forms[f]; *c; c++) {
                                char one[2] = { *c, 0 };
                                id = vocab_find(b, one);
                                if (id < 0)
                                        return log_error_errno(EINVAL, "mkmodel vocab: no piece for '%c'", *c);
                                bw->sym[bw->n++] = (uint32_t) id;
                        }
                        n_syms += bw->n;
                }
        }

        while (b->v->n < b->cap) {
                struct pair_slot best = {};
                const char *best_text = NULL;
                char merged[256];

                uint32_t n_used = 0;
                /* words that are one piece already take no further part */
                size_t live = 0;
                for (size_t w = 0; w < n_words; w++)
                        if (words[w].n > 1)
                                words[live++] = words[w];
                n_words = live;
                for (size_t w = 0; w < n_words; w++)
                        for (uint32_t k = 0; k + 1 < words[w].n; k++) {
                                uint32_t a = words[w].sym[k], c = words[w].sym[k + 1];
                                uint64_t h = ((uint64_t) a * 0x9e3779b1u ^ (uint64_t) c * 0x85ebca77u);
                                for (h &= pair_size - 1;; h = (h + 1) & (pair_size - 1)) {
                                        if (pairs[h].count == 0) {
                                                pairs[h] = (struct pair_slot){ a, c, words[w].weight };
                                                used[n_used++] = (uint32_t) h;
                                                break;
                                        }
                                        if (pairs[h].a == a && pairs[h].b == c) {
                                                pairs[h].count += words[w].weight;
                                                break;
                                        }
                                }
                        }
                /* most frequent pair; ties broken by the merged text so the result is fixed */
                for (uint32_t u = 0; u < n_used; u++) {
                        const struct pair_slot *ps = &pairs[used[u]];
                        char text2[256];
                        if (ps->count < best.count)
                                continue;
                        snprintf(text2, sizeof text2, "%s%s", b->v->pieces[ps->a], b->v->pieces[ps->b]);
                        if (ps->count == best.count && strcmp(text2, merged) >= 0)
                                continue;
                        best = *ps;
                        best_text = merged;
                        memcpy(merged, text2, sizeof merged);
                }
                for (uint32_t u = 0; u < n_used; u++)
                        pairs[used[u]].count = 0;
                if (!best_text)
                        break; /* every word is one piece */

                int64_t id = vocab_find(b, merged);
                if (id < 0) {
                        id = vocab_add(b, merged, TOKEN_NORMAL);
                        if (id < 0)
                                return (int) id;
                }
                for (size_t w = 0; w < n_words; w++) {
                        uint32_t o = 0;
                        for (uint32_t k = 0; k < words[w].n; k++) {
                                if (k + 1 < words[w].n && words[w].sym[k] == best.a && words[w].sym[k + 1] == best.b) {
                                        words[w].sym[o++] = (uint32_t) id;
                                        k++;
                                } else
                                        words[w].sym[o++] = words[w].sym[k];
                        }
                        words[w].n = o;
                }
        }
        return r;
}

void x4_mkmodel_vocab_free(struct x4_mkmodel_vocab *v) {
        if (!v || !v->pieces)
                return;
        for (uint32_t i = 0; i < v->n; i++)
                free(v->pieces[i]);
        free(v->pieces);
        free(v->scores);
        free(v->types);
        *v = (struct x4_mkmodel_vocab){};
}

/* Layout (docs/model.md §7): 0..23 specials, 24..139 user-defined (digits, "\n", "\t", runs of "_",
 * <reserveN>), 140..395 byte pieces, then NORMAL pieces by falling score: "▁", printable ASCII,
 * (non-ASCII letters when the vocabulary has room), "▁"+letter, BPE merges of the word list;
 * what is left is padded with CONTROL pieces <unusedN> (never produced from text). */
int x4_mkmodel_vocab_build(uint32_t n_vocab, struct x4_mkmodel_vocab *ret) {
        struct x4_mkmodel_vocab v = {};
        struct vocab_builder b = { .v = &v, .cap = n_vocab };
        char buf[64];
        int64_t k;
        int r = 0;

        /* 396 special/user/byte pieces + "▁" + 83 printable ASCII characters */
        if (n_vocab < VOCAB_FIRST_NORMAL + 84)
                return log_error_errno(EINVAL, "mkmodel: vocabulary of %u pieces: at least %u expected "
                                       "(396 special/user-defined/byte pieces + 84 characters)", n_vocab,
                                       VOCAB_FIRST_NORMAL + 84);
        v.pieces = calloc(n_vocab, sizeof *v.pieces);
        v.scores = calloc(n_vocab, sizeof *v.scores);
        v.types = calloc(n_vocab, sizeof *v.types);
        for (b.index_size = 1024; b.index_size < 2 * n_vocab; b.index_size *= 2)
                ;
        b.index = malloc(b.index_size * sizeof *b.index);
        if (!v.pieces || !v.scores || !v.types || !b.index) {
                r = -ENOMEM;
                goto fail;
        }
        memset(b.index, 0xff, b.index_size * sizeof *b.index);

#define ADD(piece, type)                                                                           \
        do {                                                                                       \
                k = vocab_add(&b, piece, type);                                                    \
                if (k < 0 && k != -EEXIST) {                                                       \
                        r = (int) k;                                                               \
                        goto fail;                                                                 \
                }                                                                                  \
        } while (0)

        for (unsigned i = 0; i < 24; i++)
                ADD(special_pieces[i], i == 0 ? TOKEN_UNKNOWN : TOKEN_CONTROL);
        for (char c = '0'; c <= '9'; c++) {
                char s[2] = { c, 0 };
                ADD(s, TOKEN_USER_DEFINED);
        }
        ADD("\n", TOKEN_USER_DEFINED);
        ADD("\t", TOKEN_USER_DEFINED);
        for (unsigned i = 1; i <= 16; i++) {
                memset(buf, '_', i);
                buf[i] = 0;
                ADD(buf, TOKEN_USER_DEFINED);
        }
        for (unsigned i = 0; v.n < VOCAB_FIRST_BYTE; i++) {
                snprintf(buf, sizeof buf, "<reserve%u>", i);
                ADD(buf, TOKEN_USER_DEFINED);
        }
        for (unsigned i = 0; i < 256; i++) {
                snprintf(buf, sizeof buf, "<0x%02X>", i);
                ADD(buf, TOKEN_BYTE);
        }
        /* The release's vocabulary (docs/model.md §7) has "▁" at id 124361 with 6,711 ids after it: at
         * that size the padding goes first so the NORMAL pieces land at the release's ids. */
        for (unsigned i = v.n; n_vocab == RELEASE_VOCAB && v.n < RELEASE_SPACE_ID; i++) {
                snprintf(buf, sizeof buf, "<unused%u>", i);
                ADD(buf, TOKEN_CONTROL);
        }
        ADD(SPACE_PIECE, TOKEN_NORMAL);
        /* printable ASCII except the space (escaped to ▁), digits and '_' (user-defined) */
        for (char c = '!'; c <= '~'; c++) {
                char s[2] = { c, 0 };
                if ((c >= '0' && c <= '9') || c == '_')
                        continue;
                ADD(s, TOKEN_NORMAL);
        }
        if (n_vocab >= 2048)
                for (size_t i = 0; i < ELEMENTSOF(extra_letters); i++)
                        ADD(extra_letters[i], TOKEN_NORMAL);
        if (n_vocab >= 1024)
                for (char c = 'A'; c <= 'z'; c++) {
                        if (c > 'Z' && c < 'a')
                                continue;
                        snprintf(buf, sizeof buf, SPACE_PIECE "%c", c);
                        ADD(buf, TOKEN_NORMAL);
                }
        if (v.n < n_vocab) {
                r = bpe_train(&b);
                if (r < 0 && r != -ENOSPC)
                        goto fail;
        }
        for (unsigned i = v.n; v.n < n_vocab; i++) {
                snprintf(buf, sizeof buf, "<unused%u>", i);
                ADD(buf, TOKEN_CONTROL);
        }
#undef ADD
        free(b.index);
        *ret = v;
        return 0;
fail:
        free(b.index);
        x4_mkmodel_vocab_free(&v);
        return r < 0 ? r : -ENOMEM;
}

/* ---- presets ------------------------------------------------------------------------------ */

int x4_mkmodel_preset(const char *name, struct x4_mkmodel_shape *ret) {
        struct x4_mkmodel_shape s = {
                .n_ctx = 262144,
                .type_attn = GGML_TYPE_BF16,
                .type_ffn = GGML_TYPE_IQ4_NL,
                .type_output = GGML_TYPE_Q6_K,
        };

        if (streq(name, "tiny")) {
                /* the shapes of tests/fixtures/xing4-tiny-a */
                s.n_embd = 256, s.n_layer = 3, s.n_dense = 1, s.n_nextn = 0, s.n_head = 4;
                s.q_lora_rank = 64, s.kv_lora_rank = 64, s.qk_nope = 32, s.qk_rope = 16, s.v_head = 32;
                s.n_ff = 256, s.n_expert = 8, s.n_expert_used = 2, s.n_expert_shared = 1, s.n_ff_exp = 64;
                s.n_vocab = 512;
        } else if (streq(name, "demo")) {
                /* interactive on a 2-core CPU with the fp32 reference backend: ~12M active params */
                s.n_embd = 512, s.n_layer = 4, s.n_dense = 1, s.n_nextn = 1, s.n_head = 8;
                s.q_lora_rank = 128, s.kv_lora_rank = 128, s.qk_nope = 32, s.qk_rope = 32, s.v_head = 32;
                s.n_ff = 1024, s.n_expert = 16, s.n_expert_used = 4, s.n_expert_shared = 1, s.n_ff_exp = 256;
                s.n_vocab = 4096;
        } else if (streq(name, "full")) {
                /* docs/model.md §1: the released Xing4.0-29B-A4B */
                s.n_embd = 3584, s.n_layer = 40, s.n_dense = 2, s.n_nextn = 1, s.n_head = 32;
                s.q_lora_rank = 768, s.kv_lora_rank = 512, s.qk_nope = 128, s.qk_rope = 64, s.v_head = 128;
                s.n_ff = 9216, s.n_expert = 64, s.n_expert_used = 4, s.n_expert_shared = 1, s.n_ff_exp = 1024;
                s.n_vocab = 131072;
        } else
                return log_error_errno(EINVAL, "mkmodel: unknown preset \"%s\"; tiny, demo or full expected",
                                       name ?: "(null)");
        snprintf(s.name, sizeof s.name, "%s", name);
        *ret = s;
        return 0;
}

/* ---- the tensor plan (docs/model.md §2.4) and how each tensor is filled --------------------- */

enum init_kind {
        INIT_MATRIX,   /* element std a (by type: gaussian / table / random quant blocks) */
        INIT_UNIFORM,  /* F32 uniform in a ± b (norms) */
        INIT_GAUSS,    /* F32 N(a, b²) (hc_base, router) */
        INIT_HC_SCALE, /* (0.75, 1.25, -0.6) ± 10% */
        INIT_LINSPACE, /* shuffled linspace(a, b) (exp_probs_b) */
};

struct init {
        enum init_kind kind;
        double a, b;
};

struct plan {
        struct gguf_writer *w;
        struct init *init;
        size_t cap;
};

static int plan_add(struct plan *p, const char *name, uint32_t type, uint32_t n_dims, uint64_t ne0,
                    uint64_t ne1, uint64_t ne2, enum init_kind kind, double a, double b) {
        const uint64_t ne[3] = { ne0, ne1, ne2 };
        int i;

        const struct ggml_type_info *ti = ggml_type_get(type);
        if (ti && ne0 % ti->block_size != 0)
                return log_error_errno(EINVAL, "mkmodel: tensor %s: rows of %llu values are not whole %s blocks "
                                       "(%u values); change the shape or the type flags",
                                       name, (unsigned long long) ne0, ti->name, ti->block_size);
        i = gguf_writer_add_tensor(p->w, name, type, n_dims, ne);
        if (i < 0)
                return i; /* logged by the writer, naming the tensor */
        if ((size_t) i >= p->cap) {
                size_t cap = MAX(1024u, p->cap * 2);
                struct init *v = realloc(p->init, cap * sizeof *v);
                if (!v)
                        return -ENOMEM;
                p->init = v;
                p->cap = cap;
        }
        p->init[i] = (struct init){ kind, a, b };
        return 0;
}

static int plan_tensors(const struct x4_mkmodel_shape *s, struct plan *p) {
        const uint64_t H = s->n_embd, hc = X4_HC_MAX, n_hc = hc * (2 + hc);
        const uint64_t nh = s->n_head, qk = s->qk_nope + s->qk_rope, sh = (uint64_t) s->n_ff_exp * s->n_expert_shared;
        const uint32_t A = s->type_attn, F = s->type_ffn;
        char n[96];
        int r;

#define T(type, nd, a, b, c, kind, x, y, ...)                                                      \
        do {                                                                                       \
                snprintf(n, sizeof n, __VA_ARGS__);                                                \
                r = plan_add(p, n, type, nd, a, b, c, kind, x, y);                                 \
                if (r < 0)                                                                         \
                        return r;                                                                  \
        } while (0)
#define INV_SQRT(k) (1.0 / sqrt((double) (k)))

        /* Statistics (tools/README.md): unit-variance inputs give unit-variance outputs. */
        T(A, 2, H, s->n_vocab, 1, INIT_MATRIX, 1.0, 0, "token_embd.weight");
        T(GGML_TYPE_F32, 1, H, 1, 1, INIT_UNIFORM, 1.0, 0.05, "output_norm.weight");
        /* logits std ~2 for a normed hidden state */
        T(s->type_output, 2, H, s->n_vocab, 1, INIT_MATRIX, 2.0 * INV_SQRT(H), 0, "output.weight");

        for (uint32_t i = 0; i < s->n_layer + s->n_nextn; i++) {
                bool nextn = i >= s->n_layer;
                if (!nextn)
                        for (int k = 0; k < 2; k++) {
                                const char *what = k == 0 ? "attn" : "ffn";
                                T(A, 2, hc * H, n_hc, 1, INIT_MATRIX, 0.05, 0, "blk.%u.hc_%s_fn.weight", i, what);
                                T(GGML_TYPE_F32, 1, n_hc, 1, 1, INIT_GAUSS, 0, 0.12, "blk.%u.hc_%s_base.weight", i, what);
                                T(GGML_TYPE_F32, 1, 3, 1, 1, INIT_HC_SCALE, 0, 0, "blk.%u.hc_%s_scale.weight", i, what);
                        }
                T(GGML_TYPE_F32, 1, H, 1, 1, INIT_UNIFORM, 1.0, 0.05, "blk.%u.attn_norm.weight", i);
                T(GGML_TYPE_F32, 1, H, 1, 1, INIT_UNIFORM, 1.0, 0.05, "blk.%u.ffn_norm.weight", i);
                T(A, 2, H, s->q_lora_rank, 1, INIT_MATRIX, INV_SQRT(H), 0, "blk.%u.attn_q_a.weight", i);
                T(GGML_TYPE_F32, 1, s->q_lora_rank, 1, 1, INIT_UNIFORM, 1.0, 0.05, "blk.%u.attn_q_a_norm.weight", i);
                T(A, 2, s->q_lora_rank, nh * qk, 1, INIT_MATRIX, INV_SQRT(s->q_lora_rank), 0, "blk.%u.attn_q_b.weight", i);
                T(A, 2, H, s->kv_lora_rank + s->qk_rope, 1, INIT_MATRIX, INV_SQRT(H), 0, "blk.%u.attn_kv_a_mqa.weight", i);
                T(GGML_TYPE_F32, 1, s->kv_lora_rank, 1, 1, INIT_UNIFORM, 1.0, 0.05, "blk.%u.attn_kv_a_norm.weight", i);
                /* k_nope = Kb·c and v = Vb·c both sum over the latent */
                T(A, 3, s->qk_nope, s->kv_lora_rank, nh, INIT_MATRIX, INV_SQRT(s->kv_lora_rank), 0, "blk.%u.attn_k_b.weight", i);
                T(A, 3, s->kv_lora_rank, s->v_head, nh, INIT_MATRIX, INV_SQRT(s->kv_lora_rank), 0, "blk.%u.attn_v_b.weight", i);
                T(A, 2, nh * s->v_head, H, 1, INIT_MATRIX, INV_SQRT(nh * s->v_head), 0, "blk.%u.attn_output.weight", i);
                if (i < s->n_dense) {
                        T(F, 2, H, s->n_ff, 1, INIT_MATRIX, INV_SQRT(H), 0, "blk.%u.ffn_gate.weight", i);
                        T(F, 2, H, s->n_ff, 1, INIT_MATRIX, INV_SQRT(H), 0, "blk.%u.ffn_up.weight", i);
                        T(F, 2, s->n_ff, H, 1, INIT_MATRIX, INV_SQRT(s->n_ff), 0, "blk.%u.ffn_down.weight", i);
                } else {
                        T(GGML_TYPE_F32, 2, H, s->n_expert, 1, INIT_GAUSS, 0, 1.6 * INV_SQRT(H), "blk.%u.ffn_gate_inp.weight", i);
                        T(GGML_TYPE_F32, 1, s->n_expert, 1, 1, INIT_LINSPACE, -0.08, 0.08, "blk.%u.exp_probs_b.bias", i);
                        T(F, 3, H, s->n_ff_exp, s->n_expert, INIT_MATRIX, INV_SQRT(H), 0, "blk.%u.ffn_gate_exps.weight", i);
                        T(F, 3, H, s->n_ff_exp, s->n_expert, INIT_MATRIX, INV_SQRT(H), 0, "blk.%u.ffn_up_exps.weight", i);
                        T(F, 3, s->n_ff_exp, H, s->n_expert, INIT_MATRIX, INV_SQRT(s->n_ff_exp), 0, "blk.%u.ffn_down_exps.weight", i);
                        if (sh > 0) {
                                T(F, 2, H, sh, 1, INIT_MATRIX, INV_SQRT(H), 0, "blk.%u.ffn_gate_shexp.weight", i);
                                T(F, 2, H, sh, 1, INIT_MATRIX, INV_SQRT(H), 0, "blk.%u.ffn_up_shexp.weight", i);
                                T(F, 2, sh, H, 1, INIT_MATRIX, INV_SQRT(sh), 0, "blk.%u.ffn_down_shexp.weight", i);
                        }
                }
                if (nextn) {
                        /* docs/model.md §2.4 / §8 (types derived, U6) */
                        T(F, 2, 2 * H, H, 1, INIT_MATRIX, INV_SQRT(2 * H), 0, "blk.%u.nextn.eh_proj.weight", i);
                        T(F, 2, H, s->n_vocab, 1, INIT_MATRIX, 1.0, 0, "blk.%u.nextn.embed_tokens.weight", i);
                        T(F, 2, H, s->n_vocab, 1, INIT_MATRIX, 2.0 * INV_SQRT(H), 0, "blk.%u.nextn.shared_head_head.weight", i);
                        T(GGML_TYPE_F32, 1, H, 1, 1, INIT_UNIFORM, 1.0, 0.05, "blk.%u.nextn.enorm.weight", i);
                        T(GGML_TYPE_F32, 1, H, 1, 1, INIT_UNIFORM, 1.0, 0.05, "blk.%u.nextn.hnorm.weight", i);
                        T(GGML_TYPE_F32, 1, H, 1, 1, INIT_UNIFORM, 1.0, 0.05, "blk.%u.nextn.shared_head_norm.weight", i);
                }
        }
#undef T
#undef INV_SQRT
        return 0;
}

/* ---- metadata (docs/model.md §2.2, §2.3) -------------------------------------------------- */

static uint32_t file_type_of(uint32_t ffn_type) {
        /* llama_ftype values: ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8, Q5_1 9,
         * Q4_K_M 15, Q5_K_M 17, Q6_K 18, IQ4_NL 25, IQ4_XS 30, BF16 32 */
        switch (ffn_type) {
        case GGML_TYPE_Q4_0:
                return 2;
        case GGML_TYPE_Q4_1:
                return 3;
        case GGML_TYPE_Q5_0:
                return 8;
        case GGML_TYPE_Q5_1:
                return 9;
        case GGML_TYPE_Q4_K:
                return 15;
        case GGML_TYPE_Q5_K:
                return 17;
        case GGML_TYPE_IQ4_XS:
                return 30;
        case GGML_TYPE_F32:
                return 0;
        case GGML_TYPE_F16:
                return 1;
        case GGML_TYPE_Q8_0:
                return 7;
        case GGML_TYPE_Q6_K:
                return 18;
        case GGML_TYPE_BF16:
                return 32;
        default:
                return 25;
        }
}

#define YARN_ORIG_CTX 4096

static int add_metadata(const struct x4_mkmodel_shape *s, uint64_t seed, struct gguf_writer *w) {
        struct x4_mkmodel_vocab v = {};
        char name[128];
        int r = 0;

        snprintf(name, sizeof name, "x4-mkmodel %s seed %llu (synthetic random weights)", s->name,
                 (unsigned long long) seed);
#define U32(k, x) if (r >= 0) r = gguf_writer_add_u32(w, k, x)
#define F32(k, x) if (r >= 0) r = gguf_writer_add_f32(w, k, x)
#define STR(k, x) if (r >= 0) r = gguf_writer_add_string(w, k, x)
#define BOOL(k, x) if (r >= 0) r = gguf_writer_add_bool(w, k, x)
        STR("general.architecture", "xing4_0");
        STR("general.name", name);
        U32("general.file_type", file_type_of(s->type_ffn));
        U32("general.quantization_version", 2);
        U32("xing4_0.block_count", s->n_layer + s->n_nextn);
        U32("xing4_0.context_length", s->n_ctx);
        U32("xing4_0.embedding_length", s->n_embd);
        U32("xing4_0.feed_forward_length", s->n_ff);
        U32("xing4_0.vocab_size", s->n_vocab);
        U32("xing4_0.attention.head_count", s->n_head);
        U32("xing4_0.attention.head_count_kv", 1);
        U32("xing4_0.attention.key_length", s->kv_lora_rank + s->qk_rope);
        U32("xing4_0.attention.value_length", s->kv_lora_rank);
        U32("xing4_0.attention.key_length_mla", s->qk_nope + s->qk_rope);
        U32("xing4_0.attention.value_length_mla", s->v_head);
        U32("xing4_0.attention.q_lora_rank", s->q_lora_rank);
        U32("xing4_0.attention.kv_lora_rank", s->kv_lora_rank);
        F32("xing4_0.attention.layer_norm_rms_epsilon", 1e-6f);
        U32("xing4_0.rope.dimension_count", s->qk_rope);
        F32("xing4_0.rope.freq_base", 10000.0f);
        STR("xing4_0.rope.scaling.type", "yarn");
        F32("xing4_0.rope.scaling.factor", (float) s->n_ctx / YARN_ORIG_CTX);
        U32("xing4_0.rope.scaling.original_context_length", YARN_ORIG_CTX);
        F32("xing4_0.rope.scaling.yarn_beta_fast", 32.0f);
        F32("xing4_0.rope.scaling.yarn_beta_slow", 1.0f);
        F32("xing4_0.rope.scaling.yarn_log_multiplier", 0.1f);
        U32("xing4_0.expert_count", s->n_expert);
        U32("xing4_0.expert_used_count", s->n_expert_used);
        U32("xing4_0.expert_shared_count", s->n_expert_shared);
        U32("xing4_0.expert_feed_forward_length", s->n_ff_exp);
        U32("xing4_0.expert_gating_func", 2);
        BOOL("xing4_0.expert_weights_norm", true);
        F32("xing4_0.expert_weights_scale", 2.0f);
        U32("xing4_0.expert_group_count", 1);
        U32("xing4_0.expert_group_used_count", 1);
        U32("xing4_0.leading_dense_block_count", s->n_dense);
        U32("xing4_0.nextn_predict_layers", s->n_nextn);
        U32("xing4_0.hyper_connection.count", X4_HC_MAX);
        U32("xing4_0.hyper_connection.sinkhorn_iterations", 20);
        F32("xing4_0.hyper_connection.epsilon", 1e-6f);
        STR("quantize.imatrix.file", "none (synthetic x4-mkmodel weights, random quant blocks)");
        if (r < 0)
                return r;

        r = x4_mkmodel_vocab_build(s->n_vocab, &v);
        if (r < 0)
                return r;
        STR("tokenizer.ggml.model", "llama");
        if (r >= 0)
                r = gguf_writer_add_string_array(w, "tokenizer.ggml.tokens", (const char *const *) v.pieces, v.n);
        if (r >= 0)
                r = gguf_writer_add_array(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v.scores, v.n);
        if (r >= 0)
                r = gguf_writer_add_array(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.types, v.n);
        U32("tokenizer.ggml.bos_token_id", 1);
        U32("tokenizer.ggml.eos_token_id", 2);
        U32("tokenizer.ggml.unknown_token_id", 0);
        U32("tokenizer.ggml.padding_token_id", 3);
        BOOL("tokenizer.ggml.add_bos_token", false);
        BOOL("tokenizer.ggml.add_eos_token", false);
        BOOL("tokenizer.ggml.add_space_prefix", true);
        STR("tokenizer.chat_template", chat_xing4_template);
#undef U32
#undef F32
#undef STR
#undef BOOL
        x4_mkmodel_vocab_free(&v);
        return r;
}

/* ---- config.json (HF style, like tests/fixtures/xing4-tiny-a/config.json) -------------------- */

/* The marker that says x4-mkmodel wrote a config.json (transformers ignores unknown keys; so
 * does xing4d's reader). */
#define CONFIG_MARKER "\"generated_by\": \"x4-mkmodel\""

/* The text of the config.json for shape s; without the marker line when `marker` is false (what
 * x4-mkmodel wrote before the marker existed). NULL when out of memory. */
static char *config_json_text(const struct x4_mkmodel_shape *s, bool marker) {
        char *text;

        if (asprintf(&text,
                "{\n"
                "%s"
                "  \"architectures\": [\n    \"Xing4_0ForCausalLM\"\n  ],\n"
                "  \"model_type\": \"xing4_0\",\n"
                "  \"hidden_size\": %u,\n"
                "  \"num_hidden_layers\": %u,\n"
                "  \"num_nextn_predict_layers\": %u,\n"
                "  \"first_k_dense_replace\": %u,\n"
                "  \"intermediate_size\": %u,\n"
                "  \"moe_intermediate_size\": %u,\n"
                "  \"n_routed_experts\": %u,\n"
                "  \"num_experts_per_tok\": %u,\n"
                "  \"n_shared_experts\": %u,\n"
                "  \"n_group\": 1,\n  \"topk_group\": 1,\n  \"topk_method\": \"noaux_tc\",\n"
                "  \"scoring_func\": \"sigmoid\",\n  \"norm_topk_prob\": true,\n"
                "  \"routed_scaling_factor\": 2.0,\n"
                "  \"num_attention_heads\": %u,\n"
                "  \"num_key_value_heads\": %u,\n"
                "  \"q_lora_rank\": %u,\n  \"kv_lora_rank\": %u,\n"
                "  \"qk_nope_head_dim\": %u,\n  \"qk_rope_head_dim\": %u,\n  \"v_head_dim\": %u,\n"
                "  \"rms_norm_eps\": 1e-06,\n  \"rope_theta\": 10000.0,\n  \"rope_interleave\": true,\n"
                "  \"rope_scaling\": {\n    \"type\": \"yarn\",\n    \"rope_type\": \"yarn\",\n"
                "    \"factor\": %.1f,\n    \"original_max_position_embeddings\": %u,\n"
                "    \"beta_fast\": 32.0,\n    \"beta_slow\": 1.0,\n    \"mscale\": 1.0,\n    \"mscale_all_dim\": 1.0\n  },\n"
                "  \"max_position_embeddings\": %u,\n"
                "  \"vocab_size\": %u,\n"
                "  \"tie_word_embeddings\": false,\n"
                "  \"hc_mult\": %d,\n  \"hc_sinkhorn_iters\": 20,\n  \"hc_eps\": 1e-06,\n"
                "  \"mhc_h_res_clamp_min\": -30.0,\n  \"mhc_h_res_clamp_max\": 30.0,\n"
                "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"pad_token_id\": 3,\n"
                "  \"torch_dtype\": \"bfloat16\"\n"
                "}\n",
                marker ? "  " CONFIG_MARKER ",\n" : "",
                s->n_embd, s->n_layer, s->n_nextn, s->n_dense, s->n_ff, s->n_ff_exp, s->n_expert,
                s->n_expert_used, s->n_expert_shared, s->n_head, s->n_head, s->q_lora_rank,
                s->kv_lora_rank, s->qk_nope, s->qk_rope, s->v_head, (double) s->n_ctx / YARN_ORIG_CTX,
                YARN_ORIG_CTX, s->n_ctx, s->n_vocab, X4_HC_MAX) < 0)
                return NULL;
        return text;
}

/* The daemon reads the config.json next to a model, so one file serves every model of its folder:
 * replacing the release's config.json next to a real checkpoint would stop that checkpoint from
 * loading. So an existing file is replaced only when x4-mkmodel wrote it (it carries the marker,
 * or it is byte-identical to what an x4-mkmodel without the marker wrote for this shape), or when
 * told (`force`). Checked before the GGUF is written, so a refusal costs nothing. */
static int check_config_overwrite(const char *path, const struct x4_mkmodel_shape *s, bool force) {
        _cleanup_fclose_ FILE *f = NULL;
        _cleanup_free_ char *old = NULL, *legacy = NULL;
        struct stat st;
        size_t size = 0;

        if (force)
                return 0;
        f = fopen(path, "re");
        if (!f) {
                if (errno == ENOENT)
                        return 0;
                return log_error_errno(errno, "%s: cannot read the existing config.json: %m", path);
        }
        /* only a regular file can be another model's config (not /dev/null, a pipe, a directory) */
        if (fstat(fileno(f), &st) < 0)
                return log_error_errno(errno, "%s: cannot stat the existing config.json: %m", path);
        if (!S_ISREG(st.st_mode))
                return 0;
        /* a config.json is a few KB; read up to 1 MiB, a larger file is not ours */
        old = malloc((1u << 20) + 1);
        if (!old)
                return -ENOMEM;
        size = fread(old, 1, 1u << 20, f);
        if (ferror(f))
                return log_error_errno(errno ? errno : EIO, "%s: cannot read the existing config.json: %m", path);
        old[size] = 0;
        if (strlen(old) == size && strstr(old, CONFIG_MARKER))
                return 0;
        legacy = config_json_text(s, false);
        if (!legacy)
                return -ENOMEM;
        if (size == strlen(legacy) && memcmp(old, legacy, size) == 0)
                return 0;
        return log_error_errno(EEXIST, "%s: exists and was not written by x4-mkmodel (no %s in it), so it "
                               "may describe another model in that folder; not replaced: --force replaces "
                               "it, --config-out PATH writes elsewhere, --config-out \"\" writes none",
                               path, CONFIG_MARKER);
}

static int write_config_json(const char *text, const char *path) {
        _cleanup_fclose_ FILE *f = fopen(path, "we");

        if (!f)
                return log_error_errno(errno, "%s: cannot create: %m", path);
        fputs(text, f);
        if (fflush(f) != 0 || ferror(f)) {
                /* the failed write (fputs's or fflush's) left its errno: ENOSPC, EDQUOT, EIO */
                int e = errno > 0 ? errno : EIO;
                return log_error_errno(e, "%s: write failed: %s", path, strerror(e));
        }
        return 0;
}

/* ---- tensor data -------------------------------------------------------------------------- */

/* A chunk is the unit of work and of randomness: (tensor, chunk index) seeds its own stream. */
#define CHUNK_BYTES (16u << 20)

struct chunk {
        uint32_t tensor;
        uint32_t index;
        uint64_t offset; /* within the tensor */
        uint64_t size;
};

struct job {
        const struct gguf_writer *w;
        const struct init *init;
        const struct chunk *chunks;
        size_t n_chunks;
        uint64_t seed;
        int fd;
        const char *path;
        atomic_size_t next;
        atomic_uint_fast64_t done;
        uint64_t total;
        atomic_int error;
        bool progress;
        pthread_mutex_t progress_lock;
        double t_start, t_last;
        double iq4_rms, q6k_rms, q8_rms;
};

static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void store_u16(uint8_t *p, uint16_t v) {
        memcpy(p, &v, 2);
}

/* Random valid quant blocks of `bsize` bytes with the fp16 scale at byte `d_at`; the scale is
 * drawn from a 256-entry table around `d` (±25%), so rows are not all alike. */
static void fill_quant_blocks(struct rng *r, uint8_t *p, uint64_t size, uint32_t bsize, uint32_t d_at,
                              double d) {
        uint16_t dtab[256];

        for (int i = 0; i < 256; i++)
                dtab[i] = quant_f32_to_fp16((float) (d * (0.75 + 0.5 * rng_uniform(r))));
        rng_fill(r, p, size);
        for (uint64_t o = 0; o + bsize <= size; o += bsize)
                store_u16(p + o + d_at, dtab[p[o + d_at]]);
}

/* The llama.cpp formats a user's quantization may hold (Q4_0 ... IQ4_XS), as random blocks of
 * element std about `sd` and mean about 0: the fp16 scale set from the format's rms at unit
 * scale, offsets (Q4_1 / Q5_1's m, Q4_K / Q5_K's dmin·m) set against the unsigned quants' mean. */
static double iq4nl_rms(void);

static void k_pack_scales(uint8_t q[12], const uint8_t sc[8], const uint8_t m[8]) {
        for (int j = 0; j < 4; j++) {
                q[j] = (uint8_t) ((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
                q[j + 4] = (uint8_t) ((m[j] & 63) | ((m[j + 4] >> 4) << 6));
                q[j + 8] = (uint8_t) ((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4));
        }
}

static void fill_other_blocks(struct rng *r, uint8_t *p, uint64_t size, uint32_t type, double sd) {
        const struct ggml_type_info *t = ggml_type_get(type);
        uint32_t bs = t->type_size;
        /* rms of a value at d = 1: (q - 8), (q - 16), d·sc·(q - 7.5) with sc 1..8, (q - 15.5)
         * with sc 1..4, (ls - 32)·book */
        double rms = type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 ? 4.64 :
                     type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1 ? 9.25 :
                     type == GGML_TYPE_Q4_K ? 23.3 : type == GGML_TYPE_Q5_K ? 25.3 : 18.5 * iq4nl_rms();

        rng_fill(r, p, size);
        for (uint64_t o = 0; o + bs <= size; o += bs) {
                uint8_t *b = p + o;
                float d = (float) (sd / rms * (0.75 + 0.5 * (b[0] / 255.0)));
                uint16_t hd = quant_f32_to_fp16(d);
                store_u16(b, hd);
                switch (type) {
                case GGML_TYPE_Q4_1:
                case GGML_TYPE_Q5_1: /* m = −8·d or −16·d */
                        store_u16(b + 2, quant_f32_to_fp16(-(type == GGML_TYPE_Q4_1 ? 8.0f : 16.0f) *
                                                           quant_fp16_to_f32(hd)));
                        break;
                case GGML_TYPE_Q4_K:
                case GGML_TYPE_Q5_K: { /* dmin = d, m = sc·7.5 (15.5) rounded */
                        uint8_t sc[8], m[8];
                        const bool five = type == GGML_TYPE_Q5_K;
                        store_u16(b + 2, hd);
                        for (int j = 0; j < 8; j++) {
                                sc[j] = (uint8_t) (1 + b[4 + j] % (five ? 4 : 8));
                                m[j] = (uint8_t) (sc[j] * (five ? 31 : 15) / 2 + (sc[j] % 2));
                        }
                        k_pack_scales(b + 4, sc, m);
                        break;
                }
                default: /* Q4_0, Q5_0, IQ4_XS: d only */
                        break;
                }
        }
}

static void fill_chunk(struct job *j, const struct chunk *c, uint8_t *p) {
        const struct init *in = &j->init[c->tensor];
        uint32_t type = gguf_writer_tensor_type(j->w, c->tensor);
        uint64_t n_tensor_values = 1;
        const uint64_t *ne = gguf_writer_tensor_ne(j->w, c->tensor, NULL);
        struct rng r;

        for (int d = 0; d < GGUF_MAX_DIMS; d++)
                n_tensor_values *= ne[d];
        rng_seed(&r, j->seed, c->tensor, c->index);

        if (in->kind == INIT_MATRIX && type != GGML_TYPE_F32) {
                const double sd = in->a;
                uint64_t n = c->size / 2;

                switch (type) {
                case GGML_TYPE_BF16:
                case GGML_TYPE_F16: {
                        /* a 4096-value gaussian table per chunk, indexed by 12 random bits: no
                         * per-value float math for the 3 GiB of BF16 */
                        uint16_t tab[4096];
                        for (int i = 0; i < 4096; i++) {
                                float v = (float) (sd * rng_gauss(&r));
                                tab[i] = type == GGML_TYPE_BF16 ? quant_f32_to_bf16(v) : quant_f32_to_fp16(v);
                        }
                        for (uint64_t i = 0; i < n;) {
                                uint64_t x = rng_next(&r);
                                for (int k = 0; k < 5 && i < n; k++, i++, x >>= 12)
                                        store_u16(p + 2 * i, tab[x & 4095]);
                        }
                        return;
                }
                case GGML_TYPE_IQ4_NL:
                        fill_quant_blocks(&r, p, c->size, sizeof(struct block_iq4_nl),
                                          offsetof(struct block_iq4_nl, d), sd / j->iq4_rms);
                        return;
                case GGML_TYPE_Q8_0:
                        fill_quant_blocks(&r, p, c->size, sizeof(struct block_q8_0),
                                          offsetof(struct block_q8_0, d), sd / j->q8_rms);
                        return;
                case GGML_TYPE_Q6_K:
                        /* scales 8..31: rms 20.7 (docs/model.md §6: y = d·sc·q, q in -32..31) */
                        fill_quant_blocks(&r, p, c->size, sizeof(struct block_q6_k),
                                          offsetof(struct block_q6_k, d), sd / (j->q6k_rms * 20.69));
                        for (uint64_t o = 0; o + sizeof(struct block_q6_k) <= c->size; o += sizeof(struct block_q6_k))
                                for (int k = 0; k < QK_K / 16; k++) {
                                        uint8_t *sc = p + o + offsetof(struct block_q6_k, scales) + k;
                                        *sc = (uint8_t) (8 + *sc % 24);
                                }
                        return;
                default:
                        fill_other_blocks(&r, p, c->size, type, sd);
                        return;
                }
        }

        /* F32 */
        float *v = (float *) p;
        uint64_t n = c->size / 4, first = c->offset / 4;
        switch (in->kind) {
        case INIT_MATRIX:
                for (uint64_t i = 0; i < n; i++)
                        v[i] = (float) (in->a * rng_gauss(&r));
                break;
        case INIT_UNIFORM:
                for (uint64_t i = 0; i < n; i++)
                        v[i] = (float) (in->a + in->b * (2 * rng_uniform(&r) - 1));
                break;
        case INIT_GAUSS:
                for (uint64_t i = 0; i < n; i++)
                        v[i] = (float) (in->a + in->b * rng_gauss(&r));
                break;
        case INIT_HC_SCALE: {
                static const double base[3] = { 0.75, 1.25, -0.6 };
                for (uint64_t i = 0; i < n; i++)
                        v[i] = (float) (base[(first + i) % 3] * (1 + 0.1 * (2 * rng_uniform(&r) - 1)));
                break;
        }
        case INIT_LINSPACE:
                /* one chunk holds the whole (small) vector */
                for (uint64_t i = 0; i < n; i++)
                        v[i] = (float) (n_tensor_values > 1 ? in->a + (in->b - in->a) * (double) i / (double) (n - 1)
                                                            : in->a);
                for (uint64_t i = n; i > 1; i--) {
                        uint64_t k = rng_next(&r) % i;
                        float t = v[i - 1];
                        v[i - 1] = v[k];
                        v[k] = t;
                }
                break;
        }
}

static void report_progress(struct job *j, bool final) {
        double t = now_s();
        uint64_t done = atomic_load(&j->done);

        if (!j->progress)
                return;
        if (!final && (t - j->t_last < 1.0 || pthread_mutex_trylock(&j->progress_lock) != 0))
                return;
        if (final)
                pthread_mutex_lock(&j->progress_lock);
        j->t_last = t;
        fprintf(stderr, "\rx4-mkmodel: %s %5.1f%%  %.2f / %.2f GB  %.2f GB/s%s", j->path,
                100.0 * (double) done / (double) MAX(j->total, 1), done / 1e9, j->total / 1e9,
                done / 1e9 / MAX(t - j->t_start, 1e-6), final ? "\n" : "");
        pthread_mutex_unlock(&j->progress_lock);
}

static void *worker(void *userdata) {
        struct job *j = userdata;
        _cleanup_free_ uint8_t *buf = malloc(CHUNK_BYTES + 4096);

        if (!buf) {
                atomic_store(&j->error, -ENOMEM);
                return NULL;
        }
        for (;;) {
                size_t i = atomic_fetch_add(&j->next, 1);
                if (i >= j->n_chunks || atomic_load(&j->error) != 0)
                        break;
                const struct chunk *c = &j->chunks[i];
                int r;

                fill_chunk(j, c, buf);
                r = gguf_pwrite_all(j->fd, buf, c->size,
                                    gguf_writer_tensor_file_offset(j->w, c->tensor) + c->offset);
                if (r < 0) {
                        atomic_store(&j->error, r);
                        break;
                }
                atomic_fetch_add(&j->done, c->size);
                report_progress(j, false);
        }
        return NULL;
}

static int split_chunks(const struct gguf_writer *w, const struct init *init, struct chunk **ret, size_t *ret_n) {
        size_t n = 0, cap = 0;
        struct chunk *v = NULL;

        for (size_t t = 0; t < gguf_writer_tensor_count(w); t++) {
                const struct ggml_type_info *ti = ggml_type_get(gguf_writer_tensor_type(w, t));
                uint64_t size = gguf_writer_tensor_size(w, t);
                /* whole blocks per chunk; the small special vectors stay in one chunk */
                uint64_t step = init[t].kind == INIT_LINSPACE || init[t].kind == INIT_HC_SCALE
                                        ? size
                                        : CHUNK_BYTES / ti->type_size * ti->type_size;
                if (step == 0 || size > UINT64_MAX / 2)
                        return -EINVAL;
                if (step > CHUNK_BYTES && size > CHUNK_BYTES)
                        return -EINVAL;
                for (uint64_t off = 0, k = 0; off < size; off += step, k++) {
                        if (n == cap) {
                                cap = MAX(1024u, cap * 2);
                                struct chunk *p = realloc(v, cap * sizeof *p);
                                if (!p) {
                                        free(v);
                                        return -ENOMEM;
                                }
                                v = p;
                        }
                        v[n++] = (struct chunk){ (uint32_t) t, (uint32_t) k, off, MIN(step, size - off) };
                }
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

static double iq4nl_rms(void) {
        double s = 0;
        for (int i = 0; i < 16; i++)
                s += (double) quant_iq4nl_values[i] * quant_iq4nl_values[i];
        return sqrt(s / 16);
}

/* ---- the whole file --------------------------------------------------------------------- */

static int check_shape(const struct x4_mkmodel_shape *s) {
        static const uint32_t allowed[] = { GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16,
                                            GGML_TYPE_Q8_0, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
                                            GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                                            GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                            GGML_TYPE_IQ4_XS };
        const struct {
                const char *what;
                uint32_t v;
        } pos[] = {
                { "hidden", s->n_embd }, { "layers", s->n_layer }, { "heads", s->n_head },
                { "q-lora", s->q_lora_rank }, { "kv-lora", s->kv_lora_rank }, { "qk-nope", s->qk_nope },
                { "qk-rope", s->qk_rope }, { "v-head", s->v_head }, { "experts", s->n_expert },
                { "experts-used", s->n_expert_used }, { "expert-ff", s->n_ff_exp }, { "vocab", s->n_vocab },
        };
        for (size_t i = 0; i < ELEMENTSOF(pos); i++)
                if (pos[i].v == 0)
                        return log_error_errno(EINVAL, "mkmodel: %s is 0, a positive value expected", pos[i].what);
        if (s->n_dense > s->n_layer)
                return log_error_errno(EINVAL, "mkmodel: %u dense blocks, at most the %u layers expected",
                                       s->n_dense, s->n_layer);
        if (s->n_dense > 0 && s->n_ff == 0)
                return log_error_errno(EINVAL, "mkmodel: dense FFN width 0 with %u dense blocks", s->n_dense);
        if (s->n_layer + s->n_nextn > X4_MAX_LAYERS)
                return log_error_errno(EINVAL, "mkmodel: %u blocks, at most %d supported",
                                       s->n_layer + s->n_nextn, X4_MAX_LAYERS);
        if (s->n_expert_used > s->n_expert)
                return log_error_errno(EINVAL, "mkmodel: experts-used %u, at most experts (%u) expected",
                                       s->n_expert_used, s->n_expert);
        if (s->qk_rope % 2)
                return log_error_errno(EINVAL, "mkmodel: qk-rope %u, an even number expected", s->qk_rope);
        if (s->n_ctx % YARN_ORIG_CTX)
                return log_error_errno(EINVAL, "mkmodel: context %u, a multiple of %d expected (YaRN factor)",
                                       s->n_ctx, YARN_ORIG_CTX);
        const uint32_t types[3] = { s->type_attn, s->type_ffn, s->type_output };
        for (int k = 0; k < 3; k++) {
                bool ok = false;
                for (size_t i = 0; i < ELEMENTSOF(allowed); i++)
                        ok |= types[k] == allowed[i];
                if (!ok)
                        return log_error_errno(EINVAL, "mkmodel: type %s: one of F32, F16, BF16, Q8_0, Q6_K, IQ4_NL, "
                                               "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, IQ4_XS expected",
                                               ggml_type_name(types[k]));
        }
        return 0;
}

int x4_mkmodel_write(const struct x4_mkmodel_shape *s, const struct x4_mkmodel_options *o) {
        _cleanup_(gguf_writer_freep) struct gguf_writer *w = NULL;
        _cleanup_free_ struct chunk *chunks = NULL;
        _cleanup_free_ char *config_path = NULL, *config_text = NULL;
        char *tmp_path = NULL;
        _cleanup_close_ int fd = -1;
        struct plan plan = {};
        size_t n_chunks = 0;
        int r;

        if (!o || !o->out)
                return log_error_errno(EINVAL, "mkmodel: no output path given");
        r = check_shape(s);
        if (r < 0)
                return r;
        if (!o->config_out) {
                _cleanup_free_ char *copy = strdup(o->out);
                if (!copy || asprintf(&config_path, "%s/config.json", dirname(copy)) < 0) {
                        config_path = NULL;
                        return -ENOMEM;
                }
        } else if (o->config_out[0]) {
                config_path = strdup(o->config_out);
                if (!config_path)
                        return -ENOMEM;
        }
        if (config_path) {
                config_text = config_json_text(s, true);
                if (!config_text)
                        return -ENOMEM;
                r = check_config_overwrite(config_path, s, o->force_config);
                if (r < 0)
                        return r;
        }
        r = gguf_writer_new(&w);
        if (r < 0)
                return r;
        r = add_metadata(s, o->seed, w);
        if (r < 0)
                return r;
        plan.w = w;
        r = plan_tensors(s, &plan);
        if (r < 0)
                goto out;
        r = split_chunks(w, plan.init, &chunks, &n_chunks);
        if (r < 0)
                goto out;

        /* written under a temporary name and renamed at the end, so a daemon that has the old
         * file mapped never sees it truncated, and an interrupted run leaves no half model */
        if (asprintf(&tmp_path, "%s.XXXXXX", o->out) < 0) {
                tmp_path = NULL;
                r = -ENOMEM;
                goto out;
        }
        fd = mkostemp(tmp_path, O_CLOEXEC);
        if (fd < 0) {
                r = log_error_errno(errno, "%s: cannot create: %m", o->out);
                free(tmp_path);
                tmp_path = NULL;
                goto out;
        }
        (void) fchmod(fd, 0644);
        r = gguf_writer_write_header(w, fd);
        if (r < 0)
                goto out;

        if (!o->header_only) {
                unsigned n_threads = o->threads;
                if (n_threads == 0) {
                        long n = sysconf(_SC_NPROCESSORS_ONLN);
                        n_threads = n > 0 ? (unsigned) n : 1;
                }
                n_threads = MIN(MAX(n_threads, 1u), 64u);

                struct job j = {
                        .w = w, .init = plan.init, .chunks = chunks, .n_chunks = n_chunks,
                        .seed = o->seed, .fd = fd, .path = o->out,
                        .total = gguf_writer_file_size(w) - gguf_writer_data_offset(w),
                        .t_start = now_s(),
                        .iq4_rms = iq4nl_rms(),
                        .q6k_rms = 18.47, /* uniform -32..31 */
                        .q8_rms = 73.9,   /* uniform int8 */
                };
                j.progress = o->progress && j.total >= (256u << 20);
                j.t_last = j.t_start;
                pthread_mutex_init(&j.progress_lock, NULL);
                pthread_t tids[64];
                unsigned started = 0;
                for (; started + 1 < n_threads; started++)
                        if (pthread_create(&tids[started], NULL, worker, &j) != 0)
                                break;
                worker(&j);
                for (unsigned i = 0; i < started; i++)
                        pthread_join(tids[i], NULL);
                report_progress(&j, true);
                pthread_mutex_destroy(&j.progress_lock);
                r = atomic_load(&j.error);
                if (r < 0) {
                        r = log_error_errno(r, "%s: writing tensor data: %s", o->out, strerror(-r));
                        goto out;
                }
        }
        r = gguf_writer_finish(w, fd);
        if (r < 0)
                goto out;
        if (close(TAKE_FD(fd)) < 0) {
                r = log_error_errno(errno, "%s: close: %m", tmp_path);
                goto out;
        }
        if (rename(tmp_path, o->out) < 0) {
                r = log_error_errno(errno, "%s: cannot rename to %s: %m", tmp_path, o->out);
                goto out;
        }
        free(tmp_path);
        tmp_path = NULL;

        if (config_path)
                r = write_config_json(config_text, config_path);
out:
        if (tmp_path) {
                (void) unlink(tmp_path);
                free(tmp_path);
        }
        free(plan.init);
        return r;
}
