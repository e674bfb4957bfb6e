/* SPDX-License-Identifier: MIT */
/* Tokenizer unit tests. The expected ids of the fixture come from python3-sentencepiece on
 * tests/tokenizer/spm-bpe8k.model (see tests/tokenizer/README.md); the whole-corpus comparison
 * is the tokenizer-spm-diff test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "chat/tokenizer.h"
#include "common/log.h"

static struct tokenizer *fixture;

static char *fixture_path(const char *rel) {
        const char *src = getenv("X4_SOURCE_DIR");
        char *p = NULL;
        if (src)
                assert_true(asprintf(&p, "%s/tests/tokenizer/%s", src, rel) > 0);
        else
                assert_true(asprintf(&p, "%s/../tokenizer/%s", X4_FIXTURES, rel) > 0);
        return p;
}

static int setup(void **state) {
        log_set_max_level(LOG_CRIT);
        char *p = fixture_path("spm-bpe8k.gguf");
        int r = tokenizer_load(p, &fixture);
        free(p);
        return r;
}

static int teardown(void **state) {
        tokenizer_free(fixture);
        return 0;
}

static int32_t P(const char *piece) {
        int32_t id = tokenizer_find_piece(fixture, piece, strlen(piece));
        assert_true(id >= 0);
        return id;
}

static void expect_ids(const char *text, size_t len, unsigned flags, const int32_t *want, size_t n) {
        _cleanup_free_ int32_t *ids = NULL;
        size_t got;
        assert_int_equal(tokenizer_encode(fixture, text, len, flags, &ids, &got, NULL, 0), 0);
        if (got != n) {
                for (size_t i = 0; i < got; i++)
                        fprintf(stderr, "  got[%zu] = %d %s\n", i, ids[i], tokenizer_piece(fixture, ids[i], NULL));
        }
        assert_int_equal(got, n);
        assert_memory_equal(ids, want, n * sizeof(int32_t));
}
#define EXPECT(text, flags, ...)                                                                   \
        do {                                                                                       \
                const int32_t _w[] = { __VA_ARGS__ };                                              \
                expect_ids(text, sizeof(text) - 1, flags, _w, ELEMENTSOF(_w));                     \
        } while (0)

static char *decode_len(const int32_t *ids, size_t n, unsigned flags, size_t *ret_len) {
        char *s = NULL;
        assert_int_equal(tokenizer_decode(fixture, ids, n, flags, &s, ret_len), 0);
        assert_int_equal(s[*ret_len], 0);
        return s;
}

static char *decode(const int32_t *ids, size_t n, unsigned flags) {
        size_t len;
        char *s = decode_len(ids, n, flags, &len);
        assert_int_equal(strlen(s), len);
        return s;
}
#define EXPECT_DECODE(want, flags, ...)                                                            \
        do {                                                                                       \
                const int32_t _i[] = { __VA_ARGS__ };                                              \
                _cleanup_free_ char *_s = decode(_i, ELEMENTSOF(_i), flags);                       \
                assert_string_equal(_s, want);                                                     \
        } while (0)

static void test_fixture_vocab(void **state) {
        assert_int_equal(tokenizer_n_vocab(fixture), 8000);
        /* the Xing4 layout: registered specials at 1..6 and 9..14 (docs/model.md §7 table) */
        assert_int_equal(tokenizer_special_id(fixture, TOKENIZER_SPECIAL_START), 1);
        assert_int_equal(tokenizer_special_id(fixture, TOKENIZER_SPECIAL_END), 2);
        assert_int_equal(tokenizer_special_id(fixture, TOKENIZER_SPECIAL_SYSTEM), 6);
        assert_int_equal(tokenizer_special_id(fixture, TOKENIZER_SPECIAL_THINK), 9);
        assert_int_equal(tokenizer_special_id(fixture, TOKENIZER_SPECIAL_END_TOOL_RESPONSE), 14);
        assert_int_equal(tokenizer_id_special(fixture, 10), TOKENIZER_SPECIAL_END_THINK);
        assert_int_equal(tokenizer_id_special(fixture, 8), -ENOENT); /* <_sep>: not registered */
        assert_int_equal(tokenizer_id_special(fixture, 7), -ENOENT); /* <_observation> */
        assert_int_equal(tokenizer_unk_id(fixture), 0);
        assert_int_equal(tokenizer_eos_id(fixture), 2);
        assert_int_equal(tokenizer_piece_type(fixture, 8), TOKENIZER_PIECE_CONTROL);
        assert_int_equal(tokenizer_piece_type(fixture, 24), TOKENIZER_PIECE_USER_DEFINED);
        assert_int_equal(tokenizer_piece_type(fixture, P("<0x41>")), TOKENIZER_PIECE_BYTE);
        assert_int_equal(tokenizer_piece_type(fixture, 8000), -EINVAL);
        assert_null(tokenizer_piece(fixture, -1, NULL));
}

static void test_encode_sentencepiece(void **state) {
        /* ids printed by sp.encode() for the same strings */
        EXPECT("", 0);
        EXPECT(" ", 0, 296);
        EXPECT("a", 0, 303);
        EXPECT(" a", 0, 296, 5698);
        EXPECT("hello world", 0, 896, 5703, 406, 4881, 1114);
        EXPECT("a  b", 0, 303, 296, 5714);
        EXPECT("a\tb", 0, 303, 37, 5714);               /* tab: user-defined, isolated */
        EXPECT("12345", 0, 5694, 25, 26, 27, 28, 29);   /* digits: user-defined */
        EXPECT("_____a", 0, 5694, 36, 5744, 5698);      /* "____" leftmost-longest, then "_" */
        EXPECT("aaaa", 0, 303, 5698, 5698, 5698);
        EXPECT("x\0y", 0, 1438, 40, 5716);               /* NUL is text: byte fallback */
        EXPECT("\xef\xbf\xbd", 0, 5694, 279, 231, 229);  /* U+FFFD is not a piece: 3 bytes */
}

static void test_encode_invalid_utf8(void **state) {
        /* sentencepiece: one U+FFFD per malformed byte (not per maximal subpart) */
        EXPECT("a\x80" "b", 0, 303, 279, 231, 229, 5714);
        EXPECT("\xe2\x82" "A", 0, 5694, 279, 231, 229, 279, 231, 229, 5725);
        EXPECT("\xed\xa0\x80", 0, 5694, 279, 231, 229, 279, 231, 229, 279, 231, 229);
        EXPECT("\xff", 0, 5694, 279, 231, 229);
}

static void test_encode_specials(void **state) {
        /* docs/model.md §7: split on registered specials, each chunk gets its own dummy prefix */
        EXPECT("<think>hi", 0, 9, P("▁hi"));
        EXPECT("a<think>a</think>a", 0, 303, 9, 303, 10, 303);
        EXPECT("<_end><_end>", 0, 2, 2);
        EXPECT("a <_user>", 0, 303, 5694, 4);
        /* not registered: ordinary text (sp.encode("<_sep>")) */
        EXPECT("<_sep>", 0, 425, 5744, 323, 5707, 5768);
        /* raw: specials are text too */
        EXPECT("<think>hi", TOKENIZER_ENCODE_RAW, 425, 494, 3568, 5768, 2733);
        EXPECT("a", TOKENIZER_ENCODE_BOS | TOKENIZER_ENCODE_EOS, 1, 303, 2);
}

/* Plain spans (the chat prompt's user and tool contents): inside them a special's text is text,
 * outside them and without specials inside, the ids are tokenizer_encode's. */
static void encode_both(const char *text, const struct tokenizer_span *sp, size_t n_sp, int32_t **a, size_t *na,
                        int32_t **b, size_t *nb) {
        assert_int_equal(tokenizer_encode(fixture, text, strlen(text), 0, a, na, NULL, 0), 0);
        assert_int_equal(tokenizer_encode_spans(fixture, text, strlen(text), sp, n_sp, b, nb, NULL, 0), 0);
}

static size_t count_id(const int32_t *ids, size_t n, int32_t id) {
        size_t c = 0;
        for (size_t i = 0; i < n; i++)
                c += ids[i] == id;
        return c;
}

static void test_encode_plain_spans(void **state) {
        (void) state;
        const char *text = "<_user>say <_bot> and </think><_bot>";
        int32_t *a, *b;
        size_t na, nb;
        /* no span, and a span with no special inside: the same ids */
        const struct tokenizer_span none[] = { { 7, 11 } };
        encode_both(text, NULL, 0, &a, &na, &b, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
        free(a);
        free(b);
        encode_both(text, none, 1, &a, &na, &b, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
        free(a);
        free(b);
        /* the content "say <_bot> and </think>" as a span: its two specials are text, the
         * template's <_user> and final <_bot> stay specials; decoding gives the text back */
        const struct tokenizer_span content[] = { { 7, 30 } };
        encode_both(text, content, 1, &a, &na, &b, &nb);
        assert_int_equal(count_id(a, na, 5), 2); /* <_bot> */
        assert_int_equal(count_id(a, na, 10), 1); /* </think> */
        assert_int_equal(count_id(b, nb, 5), 1);
        assert_int_equal(count_id(b, nb, 10), 0);
        assert_int_equal(b[0], 4);
        assert_int_equal(b[nb - 1], 5);
        assert_true(nb > na);
        _cleanup_free_ char *back = NULL;
        assert_int_equal(tokenizer_decode(fixture, b, nb, 0, &back, NULL), 0);
        assert_string_equal(back, text);
        free(a);
        free(b);
        /* spans out of order or past the end are refused by name */
        char why[160];
        const struct tokenizer_span bad[] = { { 9, 12 }, { 3, 5 } }, past[] = { { 30, 99 } };
        assert_int_equal(tokenizer_encode_spans(fixture, text, strlen(text), bad, 2, &b, &nb, why, sizeof why), -EINVAL);
        assert_string_equal(why, "tokenizer: plain span 1 is out of order or past the text's 36 bytes");
        assert_int_equal(tokenizer_encode_spans(fixture, text, strlen(text), past, 1, &b, &nb, why, sizeof why), -EINVAL);
        assert_true(tokenizer_text_has_special(fixture, "x </think>", 10));
        assert_false(tokenizer_text_has_special(fixture, "x <_sep> <think", 15));
}

static void test_decode_rules(void **state) {
        int32_t a = P("▁a"), sp = P("▁"), sp2 = P("▁▁");
        EXPECT_DECODE("a a", 0, a, a);
        EXPECT_DECODE("a", 0, 8, a);                      /* control before: still the first */
        EXPECT_DECODE(" \xe2\x81\x87  a", 0, 0, a);       /* <_unk> is " ⁇ " and counts */
        EXPECT_DECODE("A a", 0, P("<0x41>"), a);          /* a byte piece counts */
        EXPECT_DECODE("  a", 0, sp2, a);                  /* only one ▁ dropped */
        EXPECT_DECODE("", 0, sp);
        EXPECT_DECODE("\xe2\x96\x81 a", 0, P("<0xE2>"), P("<0x96>"), P("<0x81>"), a); /* bytes: no ▁ map */
        /* byte runs: per malformed byte one U+FFFD; a control piece ends the run */
        EXPECT_DECODE("\xe2\x82\xac", 0, P("<0xE2>"), P("<0x82>"), P("<0xAC>"));
        EXPECT_DECODE("\xef\xbf\xbd\xef\xbf\xbd" "A", 0, P("<0xE2>"), P("<0x82>"), P("<0x41>"));
        EXPECT_DECODE("\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 0, P("<0xE2>"), 8, P("<0x82>"), P("<0xAC>"));
        EXPECT_DECODE("\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 0, P("<0xF0>"), P("<0x9F>"), P("<0x98>"));
        /* registered specials split runs: each run drops its own leading ▁ */
        EXPECT_DECODE("a<think>a</think>a", 0, a, 9, a, 10, a);
        EXPECT_DECODE("aaa", TOKENIZER_DECODE_SKIP_SPECIALS, a, 9, a, 10, a);

        _cleanup_free_ char *s = NULL;
        const int32_t bad[] = { a, 8000 };
        assert_int_equal(tokenizer_decode(fixture, bad, 2, 0, &s, NULL), -EINVAL);
        assert_string_equal(log_last_error(), "tokenizer: token id 8000 at position 1 out of range, 0..7999 expected");
}

static void test_round_trip(void **state) {
        static const char *texts[] = {
                "Hello, world! Ünïcödé ✓ 日本語のテキスト and emoji 😀👍🏽",
                "  leading and trailing spaces   ",
                "<_system><_user>What is the capital of France?<_bot><think>\n",
                "def f(x):\n\treturn x__y + 12345  # comment",
                "\x01\x02 control \x7f chars",
        };
        for (size_t i = 0; i < ELEMENTSOF(texts); i++) {
                _cleanup_free_ int32_t *ids = NULL;
                _cleanup_free_ char *s = NULL;
                size_t n;
                assert_int_equal(tokenizer_encode(fixture, texts[i], strlen(texts[i]), 0, &ids, &n, NULL, 0), 0);
                s = decode(ids, n, 0);
                assert_string_equal(s, texts[i]);
        }
}

/* Feed ids one at a time: never half a character, and the concatenation equals decode(). */
static void check_stream(const int32_t *ids, size_t n, unsigned flags) {
        _cleanup_(tokenizer_stream_freep) struct tokenizer_stream *st = NULL;
        size_t want_len;
        _cleanup_free_ char *want = decode_len(ids, n, flags, &want_len);
        size_t cap = want_len + 64, len = 0;
        _cleanup_free_ char *got = malloc(cap);
        const char *piece;
        size_t plen;

        assert_int_equal(tokenizer_stream_new(fixture, flags, &st), 0);
        for (size_t i = 0; i <= n; i++) {
                if (i < n)
                        assert_int_equal(tokenizer_stream_feed(st, ids[i], &piece, &plen), 0);
                else
                        assert_int_equal(tokenizer_stream_flush(st, &piece, &plen), 0);
                /* whole characters only: every piece is valid UTF-8 by itself */
                for (size_t k = 0; k < plen;) {
                        uint8_t c = (uint8_t) piece[k];
                        size_t l = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
                        assert_true(c < 0x80 || c >= 0xc2);
                        assert_true(k + l <= plen);
                        k += l;
                }
                assert_true(len + plen <= cap);
                memcpy(got + len, piece, plen);
                len += plen;
        }
        assert_int_equal(len, want_len);
        assert_memory_equal(got, want, len);
}

static void test_stream(void **state) {
        int32_t e2 = P("<0xE2>"), x82 = P("<0x82>"), xac = P("<0xAC>"), a = P("▁a");
        _cleanup_(tokenizer_stream_freep) struct tokenizer_stream *st = NULL;
        const char *p;
        size_t n;

        /* "€" as three byte pieces: nothing until the third */
        assert_int_equal(tokenizer_stream_new(fixture, 0, &st), 0);
        assert_int_equal(tokenizer_stream_feed(st, a, &p, &n), 0);
        assert_int_equal(n, 1);
        assert_memory_equal(p, "a", 1);
        assert_int_equal(tokenizer_stream_feed(st, e2, &p, &n), 0);
        assert_int_equal(n, 0);
        assert_int_equal(tokenizer_stream_feed(st, x82, &p, &n), 0);
        assert_int_equal(n, 0);
        assert_int_equal(tokenizer_stream_feed(st, xac, &p, &n), 0);
        assert_int_equal(n, 3);
        assert_memory_equal(p, "\xe2\x82\xac", 3);
        /* a truncated sequence comes out as U+FFFD per byte when the run ends */
        assert_int_equal(tokenizer_stream_feed(st, e2, &p, &n), 0);
        assert_int_equal(n, 0);
        assert_int_equal(tokenizer_stream_feed(st, a, &p, &n), 0);
        assert_int_equal(n, 5);
        assert_memory_equal(p, "\xef\xbf\xbd a", 5);
        /* the first piece after a registered special loses its ▁, incrementally too */
        assert_int_equal(tokenizer_stream_feed(st, 9, &p, &n), 0);
        assert_int_equal(n, 7);
        assert_int_equal(tokenizer_stream_feed(st, a, &p, &n), 0);
        assert_int_equal(n, 1);
        assert_memory_equal(p, "a", 1);
        assert_int_equal(tokenizer_stream_feed(st, 8000, &p, &n), -EINVAL);
        assert_string_equal(log_last_error(), "tokenizer: token id 8000 out of range, 0..7999 expected");

        /* every line of the differential corpus, and every id sequence shape */
        _cleanup_free_ char *path = fixture_path("corpus.txt");
        _cleanup_fclose_ FILE *f = fopen(path, "re");
        assert_non_null(f);
        _cleanup_free_ char *line = NULL;
        size_t cap = 0, lines = 0;
        ssize_t l;
        while ((l = getline(&line, &cap, f)) > 0 && lines < 3000) {
                _cleanup_free_ int32_t *ids = NULL;
                size_t nids;
                assert_int_equal(tokenizer_encode(fixture, line, (size_t) l - 1, 0, &ids, &nids, NULL, 0), 0);
                check_stream(ids, nids, 0);
                check_stream(ids, nids, TOKENIZER_DECODE_SKIP_SPECIALS);
                lines++;
        }
        assert_int_equal(lines, 3000);
        /* byte pieces in random order: partial characters everywhere */
        uint32_t seed = 12345;
        for (int k = 0; k < 2000; k++) {
                int32_t ids[16];
                size_t nid = (size_t) (k % 16);
                for (size_t i = 0; i < nid; i++) {
                        seed = seed * 1664525u + 1013904223u;
                        uint32_t pick = seed >> 8;
                        ids[i] = pick % 4 == 0 ? (int32_t) (pick % 8000) : P("<0x00>") + (int32_t) ((pick >> 4) % 256);
                }
                check_stream(ids, nid, 0);
        }
}

/* Synthetic vocabularies for rules the fixture does not exercise. */
static struct tokenizer *make_vocab(const char *const *pieces, const float *scores, const int32_t *types,
                                    size_t n, int32_t unk) {
        size_t lens[64];
        struct tokenizer *t = NULL;
        assert_true(n <= 64);
        for (size_t i = 0; i < n; i++)
                lens[i] = strlen(pieces[i]);
        struct tokenizer_vocab v = { .n = n, .pieces = pieces, .piece_lens = lens, .scores = scores,
                                     .types = types, .unk_id = unk, .bos_id = -1, .eos_id = -1,
                                     .pad_id = -1, .add_space_prefix = true };
        assert_int_equal(tokenizer_new(&v, &t), 0);
        return t;
}

static void expect_t(struct tokenizer *t, const char *text, const int32_t *want, size_t n) {
        _cleanup_free_ int32_t *ids = NULL;
        size_t got;
        assert_int_equal(tokenizer_encode(t, text, strlen(text), 0, &ids, &got, NULL, 0), 0);
        assert_int_equal(got, n);
        assert_memory_equal(ids, want, n * sizeof(int32_t));
}

static void test_bpe_synthetic(void **state) {
        /* merges across a ▁ (a piece "a▁b"): words may not be cut at spaces for such a vocab */
        static const char *const p1[] = { "<unk>", "\xe2\x96\x81", "a", "b", "a\xe2\x96\x81", "a\u2581b" };
        static const float s1[] = { 0, -10, -10, -10, -2, -1 };
        static const int32_t t1[] = { 2, 1, 1, 1, 1, 1 };
        _cleanup_(tokenizer_freep) struct tokenizer *t = make_vocab(p1, s1, t1, 6, 0);
        expect_t(t, "a b", (const int32_t[]) { 1, 5 }, 2);
        /* no byte pieces: an unknown character is the unknown id */
        expect_t(t, "a c", (const int32_t[]) { 1, 4, 0 }, 3);
        /* a run of unknown characters is one unknown id (as sentencepiece does) */
        expect_t(t, "a cd\xc3\xa9", (const int32_t[]) { 1, 4, 0 }, 3);
        expect_t(t, "cab", (const int32_t[]) { 1, 0, 2, 3 }, 4);

        /* tie-break leftmost: "aaa" → "aa" "a"; higher score wins over position: "abb" → "a" "bb" */
        static const char *const p2[] = { "<unk>", "\xe2\x96\x81", "a", "b", "aa", "bb", "ab" };
        static const float s2[] = { 0, -10, -10, -10, -3, -1, -2 };
        static const int32_t t2[] = { 2, 1, 1, 1, 1, 1, 1 };
        _cleanup_(tokenizer_freep) struct tokenizer *u = make_vocab(p2, s2, t2, 7, 0);
        expect_t(u, "aaa", (const int32_t[]) { 1, 4, 2 }, 3);
        expect_t(u, "abb", (const int32_t[]) { 1, 2, 5 }, 3);
        expect_t(u, "ab", (const int32_t[]) { 1, 6 }, 2);

        /* an unused piece may be merged through but is never emitted: split back into its halves */
        static const char *const p3[] = { "<unk>", "\xe2\x96\x81", "a", "b", "c", "ab", "abc" };
        static const float s3[] = { 0, -10, -10, -10, -10, -1, -2 };
        static const int32_t t3[] = { 2, 1, 1, 1, 1, 5, 1 };
        _cleanup_(tokenizer_freep) struct tokenizer *w = make_vocab(p3, s3, t3, 7, 0);
        expect_t(w, "ab", (const int32_t[]) { 1, 2, 3 }, 3);
        expect_t(w, "abc", (const int32_t[]) { 1, 6 }, 2);
}

static void test_vocab_errors(void **state) {
        struct tokenizer *t = NULL;
        const char *pieces[] = { "<unk>", "a", "\xc3" };
        size_t lens[] = { 5, 1, 1 };
        float scores[] = { 0, 0, 0 };
        int32_t types[] = { 2, 1, 1 };
        struct tokenizer_vocab v = { .n = 3, .pieces = pieces, .piece_lens = lens, .scores = scores,
                                     .types = types, .unk_id = 0, .bos_id = -1, .eos_id = -1, .pad_id = -1 };

        assert_int_equal(tokenizer_new(&v, &t), -EBADMSG);
        assert_string_equal(log_last_error(), "tokenizer: piece 2 is not valid UTF-8");
        pieces[2] = "b";
        types[1] = 7;
        assert_int_equal(tokenizer_new(&v, &t), -EBADMSG);
        assert_string_equal(log_last_error(), "tokenizer: piece 1 has token type 7, 1..6 expected");
        types[1] = 1;
        lens[1] = 0;
        assert_int_equal(tokenizer_new(&v, &t), -EBADMSG);
        assert_string_equal(log_last_error(), "tokenizer: piece 1 is empty, non-empty text expected");
        lens[1] = 1;
        v.eos_id = 3;
        assert_int_equal(tokenizer_new(&v, &t), -ERANGE);
        assert_string_equal(log_last_error(), "tokenizer: special token id 3 out of range, -1..2 expected");
        v.eos_id = -1;
        v.unk_id = -1;
        assert_int_equal(tokenizer_new(&v, &t), -EBADMSG);
        assert_string_equal(log_last_error(),
                            "tokenizer: neither byte pieces <0x00>..<0xFF> nor an unknown token id, one of them expected");
        v.unk_id = 0;
        assert_int_equal(tokenizer_new(&v, &t), 0);
        _cleanup_free_ int32_t *ids = NULL;
        size_t n;
        assert_int_equal(tokenizer_encode(t, "a", 1, TOKENIZER_ENCODE_BOS, &ids, &n, NULL, 0), -ENOENT);
        assert_string_equal(log_last_error(), "tokenizer: BOS requested, but the vocabulary has no bos token id");
        tokenizer_free(t);
}

static void test_gguf_errors(void **state) {
        static const char *const toks[] = { "<unk>", "a" };
        static const float scores[] = { 0, 0 };
        static const int32_t types[] = { 2, 1 };
        struct {
                const char *model;
                int n_scores;
                int r;
                const char *msg;
        } cases[] = {
                { "gpt2", 2, -EOPNOTSUPP,
                  "<buffer>: tokenizer.ggml.model is \"gpt2\", \"llama\" (SentencePiece) expected" },
                { NULL, 2, -EBADMSG, "<buffer>: tokenizer.ggml.model missing, \"llama\" (SentencePiece) expected" },
                { "llama", 1, -EBADMSG,
                  "<buffer>: tokenizer.ggml.tokens has 2 entries, scores 1 and token_type 2; equal counts expected" },
                { "llama", 0, -EBADMSG, "<buffer>: tokenizer.ggml.scores missing, an array expected" },
                { "llama", 2, 0, NULL },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                struct gguf_writer *w = NULL;
                _cleanup_(gguf_closep) struct gguf_file *f = NULL;
                _cleanup_(tokenizer_freep) struct tokenizer *t = NULL;
                _cleanup_free_ void *buf = NULL;
                size_t size;
                assert_int_equal(gguf_writer_new(&w), 0);
                if (cases[i].model)
                        assert_int_equal(gguf_writer_add_string(w, "tokenizer.ggml.model", cases[i].model), 0);
                assert_int_equal(gguf_writer_add_string_array(w, "tokenizer.ggml.tokens", toks, 2), 0);
                if (cases[i].n_scores)
                        assert_int_equal(gguf_writer_add_array(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores,
                                                               (uint64_t) cases[i].n_scores), 0);
                assert_int_equal(gguf_writer_add_array(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 2), 0);
                assert_int_equal(gguf_writer_get_header(w, &buf, &size), 0);
                gguf_writer_free(w);
                assert_int_equal(gguf_open_buffer(buf, size, &f), 0);
                assert_int_equal(tokenizer_new_from_gguf(f, &t, NULL, 0), cases[i].r);
                if (cases[i].msg) {
                        assert_string_equal(log_last_error(), cases[i].msg);
                        /* and as a value, for a caller with a buffer (the daemon's start-up) */
                        char why[256] = "";
                        assert_int_equal(tokenizer_new_from_gguf(f, &t, why, sizeof why), cases[i].r);
                        assert_string_equal(why, cases[i].msg);
                } else {
                        /* defaults: unk 0; bos 1 exists; eos 2 and pad do not in a 2-piece vocab */
                        assert_int_equal(tokenizer_unk_id(t), 0);
                        assert_int_equal(tokenizer_bos_id(t), 1);
                        assert_int_equal(tokenizer_eos_id(t), -1);
                }
        }
        struct tokenizer *t = NULL;
        assert_true(tokenizer_load("/nonexistent/x.gguf", &t) < 0);
}

static void test_bench(void **state) {
        _cleanup_free_ char *path = fixture_path("corpus.txt");
        _cleanup_fclose_ FILE *f = fopen(path, "re");
        assert_non_null(f);
        static char buf[1 << 20];
        size_t len = fread(buf, 1, sizeof(buf), f);
        double bps;
        size_t n;
        assert_int_equal(tokenizer_bench(fixture, buf, len, 0.3, &bps, &n), 0);
        /* the corpus is 816,403 bytes and 303,212 tokens as one text (measured by x4-tokenize) */
        assert_int_equal(len, 816403);
        assert_int_equal(n, 303212);
        assert_true(bps > 0);
        fprintf(stderr, "tokenizer encode: %.2f MB/s\n", bps / 1e6);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fixture_vocab),
                cmocka_unit_test(test_encode_sentencepiece),
                cmocka_unit_test(test_encode_invalid_utf8),
                cmocka_unit_test(test_encode_specials),
                cmocka_unit_test(test_encode_plain_spans),
                cmocka_unit_test(test_decode_rules),
                cmocka_unit_test(test_round_trip),
                cmocka_unit_test(test_stream),
                cmocka_unit_test(test_bpe_synthetic),
                cmocka_unit_test(test_vocab_errors),
                cmocka_unit_test(test_gguf_errors),
                cmocka_unit_test(test_bench),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
