/* SPDX-License-Identifier: MIT */
/* Tokenizer fuzzer: arbitrary bytes are encoded with the committed fixture tokenizer
 * (tests/tokenizer/spm-bpe8k.gguf, loaded once), the ids decoded, and
 *  - the streaming detokenizer fed one id at a time must equal the one-shot decode, and never
 *    return half a UTF-8 character;
 *  - decode(encode(x)) == x when x is valid UTF-8 without U+2581 (the escaped-space mark);
 *  - the same bytes read as ids (any mix of byte pieces, controls, specials) decode the same
 *    both ways, and go through the output parser without a crash;
 *  - the bytes as hand-made tokens (specials and text) through the output parser.
 * Fixture path: $X4_TOKENIZER_FIXTURE, else $X4_SOURCE_DIR/tests/tokenizer/spm-bpe8k.gguf, else
 * the source tree this file was compiled from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/outparse.h"
#include "chat/tokenizer.h"
#include "common/log.h"
#include "fixture.h"

static struct tokenizer *tok;

static void load(void) {
        char path[4096];
        fuzz_load_tokenizer("fuzz-tokenizer", &tok, path, sizeof path);
}

static bool valid_utf8_no_mark(const uint8_t *s, size_t n) {
        for (size_t i = 0; i < n;) {
                uint8_t c = s[i];
                size_t l;
                if (c < 0x80)
                        l = 1;
                else if (c >= 0xc2 && c < 0xe0)
                        l = 2;
                else if (c >= 0xe0 && c < 0xf0)
                        l = 3;
                else if (c >= 0xf0 && c < 0xf5)
                        l = 4;
                else
                        return false;
                if (i + l > n)
                        return false;
                for (size_t k = 1; k < l; k++)
                        if ((s[i + k] & 0xc0) != 0x80)
                                return false;
                if (l == 3 && ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] > 0x9f)))
                        return false;
                if (l == 4 && ((c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] > 0x8f)))
                        return false;
                if (l == 3 && c == 0xe2 && s[i + 1] == 0x96 && s[i + 2] == 0x81)
                        return false;
                i += l;
        }
        return true;
}

static void check_whole_chars(const char *s, size_t n) {
        for (size_t k = 0; k < n;) {
                uint8_t c = (uint8_t) s[k];
                size_t l = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
                if ((c >= 0x80 && c < 0xc2) || k + l > n)
                        abort();
                k += l;
        }
}

static int ignore(const struct outparse_event *ev, void *userdata) {
        size_t *total = userdata;
        if (ev->type == OUTPARSE_EVENT_TEXT)
                *total += ev->len;
        return 0;
}

/* Stream the ids (checking against the one-shot decode) and feed them to an output parser. */
static void stream_check(const int32_t *ids, size_t n, unsigned flags, bool thinking) {
        char *want = NULL, *got = NULL;
        size_t want_len, got_len = 0, parsed = 0;
        struct tokenizer_stream *st = NULL;
        struct outparse *op = NULL;
        static const char *stops[] = { "\n\n", "STOP" };
        struct outparse_config c = { .thinking = thinking, .thinking_budget = n / 2, .stop_strings = stops,
                                     .n_stop_strings = 2, .emit = ignore, .userdata = &parsed };

        if (tokenizer_decode(tok, ids, n, flags, &want, &want_len) < 0)
                abort();
        if (tokenizer_stream_new(tok, flags, &st) < 0 || outparse_new(tok, &c, &op, NULL, 0) < 0)
                abort();
        got = malloc(want_len + 1);
        for (size_t i = 0; i <= n; i++) {
                const char *t;
                size_t l;
                if (i < n ? tokenizer_stream_feed(st, ids[i], &t, &l) < 0 : tokenizer_stream_flush(st, &t, &l) < 0)
                        abort();
                check_whole_chars(t, l);
                if (got_len + l > want_len || memcmp(want + got_len, t, l) != 0)
                        abort(); /* the stream diverged from decode() */
                memcpy(got + got_len, t, l);
                got_len += l;
                if (i < n && outparse_feed(op, ids[i], t, l) < 0)
                        abort();
        }
        if (got_len != want_len)
                abort();
        if (outparse_finish(op, "length") < 0 || parsed > want_len + 64 * n + 64)
                abort();
        outparse_free(op);
        tokenizer_stream_free(st);
        free(want);
        free(got);
}

/* The output parser on hand-made tokens: bytes below 0x10 pick a special (tool-call markers,
 * </think>, <_end>...), everything between them is one text token (made valid UTF-8). */
static void parser_tokens(const uint8_t *data, size_t size) {
        static const int32_t specials[16] = { 9, 10, 11, 12, 11, 12, 10, 11, 12, 2, 4, 13, 8, 0, 1, 303 };
        static const char *stops[] = { "</param", "}}" };
        size_t parsed = 0;
        struct outparse *op = NULL;
        struct outparse_config c = { .thinking = size > 0 && (data[0] & 1), .thinking_budget = -1,
                                     .stop_strings = stops, .n_stop_strings = size > 1 && (data[1] & 1) ? 2 : 0,
                                     .emit = ignore, .userdata = &parsed };
        char *text = malloc(size + 1);
        if (!text || outparse_new(tok, &c, &op, NULL, 0) < 0)
                abort();
        for (size_t i = 0; i < size;) {
                if (data[i] < 0x10) {
                        if (outparse_feed(op, specials[data[i]], "", 0) < 0)
                                abort();
                        i++;
                        continue;
                }
                size_t n = 0;
                while (i < size && data[i] >= 0x10) {
                        uint8_t b = data[i++];
                        text[n++] = b < 0x80 ? (char) b : '?';
                }
                if (outparse_feed(op, 303, text, n) < 0)
                        abort();
        }
        if (outparse_finish(op, "length") < 0)
                abort();
        outparse_free(op);
        free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!tok)
                load();
        if (size > 1 << 16)
                return 0;
        unsigned flags = size > 0 && (data[0] & 1) ? TOKENIZER_ENCODE_RAW : 0;

        int32_t *ids = NULL;
        size_t n;
        if (tokenizer_encode(tok, (const char *) data, size, flags, &ids, &n, NULL, 0) < 0)
                abort();
        for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || (size_t) ids[i] >= tokenizer_n_vocab(tok))
                        abort();
        stream_check(ids, n, 0, false);
        stream_check(ids, n, TOKENIZER_DECODE_SKIP_SPECIALS, true);

        if (!(flags & TOKENIZER_ENCODE_RAW) && valid_utf8_no_mark(data, size)) {
                char *text = NULL;
                size_t len;
                if (tokenizer_decode(tok, ids, n, 0, &text, &len) < 0)
                        abort();
                if (len != size || memcmp(text, data, size) != 0)
                        abort(); /* valid UTF-8 must round-trip */
                free(text);
        }
        free(ids);

        /* the bytes as ids: 16 bits each, mostly inside the vocab */
        size_t m = size / 2;
        int32_t *raw = malloc((m + 1) * sizeof(int32_t));
        for (size_t i = 0; i < m; i++)
                raw[i] = (int32_t) ((data[2 * i] | data[2 * i + 1] << 8) % tokenizer_n_vocab(tok));
        stream_check(raw, m, 0, size > 0 && (data[0] & 2));
        free(raw);
        parser_tokens(data, size);
        return 0;
}
