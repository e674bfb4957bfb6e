/* SPDX-License-Identifier: MIT */
/* Constrained-decoding fuzzer (engine/grammar.h). The input is a JSON Schema, a NUL byte, then
 * bytes to feed; with no NUL it is all schema and the feed is a walk of mask choices. For
 * every schema the compiler accepts:
 *  - the fed bytes are taken or refused without a crash, and a refusal leaves the state as it was;
 *  - a walk picks allowed tokens (choices from the input) and each must be accepted: the mask
 *    never allows what the matcher refuses; with a small budget the walk must reach the end
 *    token (the closing mode), and the text it wrote must parse as JSON.
 * Vocabulary: the committed fixture tokenizer (tests/tokenizer/spm-bpe8k.gguf, 8,000 pieces with
 * byte fallback), found as fixture.h says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar.h"
#include "chat/tokenizer.h"
#include "common/json.h"
#include "common/log.h"
#include "fixture.h"

static struct tokenizer *tok;
static struct grammar_vocab *voc;
static uint64_t *mask;

static void load(void) {
        char path[4096];
        fuzz_load_tokenizer("fuzz-grammar", &tok, path, sizeof path);
        if (grammar_vocab_new(tok, &voc) < 0) {
                fprintf(stderr, "fuzz-grammar: cannot load %s: %s\n", path, log_last_error());
                abort();
        }
        mask = calloc(DIV_ROUND_UP(grammar_vocab_n(voc), 64), sizeof *mask);
        if (!mask)
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!tok)
                load();
        const uint8_t *nul = memchr(data, 0, size);
        size_t slen = nul ? (size_t) (nul - data) : size;
        const uint8_t *feed = nul ? nul + 1 : data;
        size_t flen = nul ? size - slen - 1 : size;
        struct grammar *g = NULL;
        char err[512];
        if (slen > 4096)
                return 0;
        if (grammar_compile_schema((const char *) data, slen, &g, err, sizeof err) < 0) {
                if (!err[0])
                        abort(); /* every refusal says why */
                /* refused strictly: the lenient compile (Constraint.lenient) of the same schema,
                 * whose grammar is then walked like any other */
                char schema[4097];
                memcpy(schema, data, slen);
                schema[slen] = 0;
                err[0] = 0;
                if (memchr(schema, 0, slen) ||
                    grammar_compile_constraint_flags(GRAMMAR_JSON_SCHEMA, schema, NULL, NULL, tok, GRAMMAR_LENIENT,
                                                     &g, err, sizeof err) < 0) {
                        if (!memchr(schema, 0, slen) && !err[0])
                                abort();
                        return 0;
                }
        }
        int32_t end = tokenizer_eos_id(tok);
        struct grammar_matcher *m = NULL;
        if (grammar_matcher_new(g, voc, &end, 1, &m) < 0)
                abort();
        if (nul) {
                /* bytes, one at a time; a refused byte is skipped */
                for (size_t i = 0; i < flen && i < 512; i++)
                        (void) grammar_matcher_accept_bytes(m, (const char *) feed + i, 1);
        } else {
                /* a walk of at most 48 tokens that must close: the choices come from the input */
                uint32_t nv = grammar_vocab_n(voc);
                char out[4096];
                size_t len = 0;
                bool ended = false;
                for (uint32_t left = 48, step = 0; left > 0; left--, step++) {
                        int n = grammar_matcher_mask(m, left, mask);
                        if (n <= 0)
                                abort(); /* a state the vocabulary cannot continue */
                        uint32_t pick = (uint32_t) (feed[step % (flen ? flen : 1)] * 131u + step) % (uint32_t) n, k = 0;
                        int32_t id = -1;
                        for (uint32_t i = 0; i < nv && id < 0; i++)
                                if (grammar_mask_test(mask, (int32_t) i) && k++ == pick)
                                        id = (int32_t) i;
                        if (id < 0 || grammar_matcher_accept(m, id) < 0)
                                abort(); /* the mask allowed a token the matcher refuses */
                        if (id == end) {
                                ended = true;
                                break;
                        }
                        /* the text, as the decoder gives it (byte pieces as bytes) */
                        size_t l;
                        const char *p = tokenizer_piece(tok, id, &l);
                        unsigned b;
                        if (tokenizer_piece_type(tok, id) == TOKENIZER_PIECE_BYTE && sscanf(p, "<0x%02X>", &b) == 1)
                                out[len++] = (char) b;
                        else
                                for (size_t i = 0; i < l && len < sizeof out - 8;) {
                                        if (i + 3 <= l && memcmp(p + i, "\xe2\x96\x81", 3) == 0) {
                                                out[len++] = ' ';
                                                i += 3;
                                        } else
                                                out[len++] = p[i++];
                                }
                        if (len >= sizeof out - 64)
                                break;
                }
                /* the budget forces the close when the schema's shortest value fits in it */
                if (ended) {
                        struct json_value *v = NULL;
                        if (json_parse(out, len, "fuzz", &v, NULL, 0) < 0)
                                abort(); /* the constrained output is not JSON */
                        json_free(v);
                }
        }
        grammar_matcher_free(m);
        grammar_free(g);
        return 0;
}
