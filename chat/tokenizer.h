/* SPDX-License-Identifier: MIT */
/* The Xing4 tokenizer (docs/model.md §7, §2.3): SentencePiece BPE with byte fallback, built from the
 * tokenizer.ggml.* keys of a GGUF file, plus a streaming detokenizer.
 *
 * Encode (what the reference Xing4_0Tokenizer does): the text is split on the 12 registered
 * specials (TOKENIZER_REGISTERED_SPECIALS); each special becomes its id; every other chunk is
 * encoded on its own exactly like sentencepiece's BPE model: identity normalizer, each malformed
 * UTF-8 byte becomes U+FFFD, a `▁` (U+2581) dummy prefix per chunk when add_space_prefix, every
 * ' ' becomes `▁`; user-defined pieces are cut out leftmost-longest and never merged; the rest
 * starts as characters and the adjacent pair whose concatenation is a normal (or unused) piece
 * with the highest score is merged, leftmost first on ties, until no pair merges; a piece left
 * unknown becomes its UTF-8 bytes as `<0xXX>` pieces (byte fallback) or the unknown id.
 *
 * Decode: split at registered specials; per run, sentencepiece's decode: the first piece that
 * produces text loses one leading `▁` (only with add_space_prefix), `▁` → ' ', runs of byte pieces are decoded as UTF-8 with
 * one U+FFFD per byte that does not start a complete valid character (sentencepiece's rule, not
 * Python's "maximal subpart" one), the unknown piece is " ⁇ ", control pieces are "".
 *
 * A tokenizer is immutable once built and may be shared by threads. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

struct gguf_file;

/* tokenizer.ggml.token_type values (sentencepiece's ModelProto.SentencePiece.Type). */
enum tokenizer_piece_type {
        TOKENIZER_PIECE_NORMAL = 1,
        TOKENIZER_PIECE_UNKNOWN = 2,
        TOKENIZER_PIECE_CONTROL = 3,
        TOKENIZER_PIECE_USER_DEFINED = 4,
        TOKENIZER_PIECE_UNUSED = 5,
        TOKENIZER_PIECE_BYTE = 6,
};

/* The registered specials of the reference tokenizer (docs/model.md §7), in this order. Only these are
 * split out of text and kept as run separators on decode; other control pieces (`<_sep>`,
 * `<_observation>`, `<_controlN>`) are ordinary text on encode and "" on decode. */
enum tokenizer_special {
        TOKENIZER_SPECIAL_START,         /* <_start> */
        TOKENIZER_SPECIAL_END,           /* <_end> */
        TOKENIZER_SPECIAL_PAD,           /* <_pad> */
        TOKENIZER_SPECIAL_USER,          /* <_user> */
        TOKENIZER_SPECIAL_BOT,           /* <_bot> */
        TOKENIZER_SPECIAL_SYSTEM,        /* <_system> */
        TOKENIZER_SPECIAL_THINK,         /* <think> */
        TOKENIZER_SPECIAL_END_THINK,     /* </think> */
        TOKENIZER_SPECIAL_TOOL_CALL,     /* <tool_call> */
        TOKENIZER_SPECIAL_END_TOOL_CALL, /* </tool_call> */
        TOKENIZER_SPECIAL_TOOL_RESPONSE, /* <tool_response> */
        TOKENIZER_SPECIAL_END_TOOL_RESPONSE, /* </tool_response> */
        _TOKENIZER_SPECIAL_MAX,
};
extern const char *const TOKENIZER_REGISTERED_SPECIALS[_TOKENIZER_SPECIAL_MAX];

/* A vocabulary given as arrays (what the GGUF keys hold). Piece texts need not be
 * NUL-terminated; they must be valid UTF-8. Ids of -1 mean "none". */
struct tokenizer_vocab {
        size_t n;
        const char *const *pieces;
        const size_t *piece_lens;
        const float *scores;
        const int32_t *types; /* enum tokenizer_piece_type */
        int32_t unk_id, bos_id, eos_id, pad_id;
        bool add_space_prefix;
        bool add_bos, add_eos; /* informational: encode adds them only when asked by flags */
};

struct tokenizer;

/* Build from arrays (copied). Errors name the piece/id and the expectation. */
int tokenizer_new(const struct tokenizer_vocab *v, struct tokenizer **ret);
/* Build from tokenizer.ggml.{model,tokens,scores,token_type,*_token_id,add_*} (docs/model.md §2.3).
 * tokenizer.ggml.model must be "llama" (SentencePiece); absent ids/flags take the defaults
 * unk 0, bos 1, eos 2, pad -1, add_space_prefix true, add_bos/add_eos false. -errno with the
 * reason in err (NULL, 0: logged only). */
int tokenizer_new_from_gguf(const struct gguf_file *f, struct tokenizer **ret, char *err,
                            size_t err_size);
/* Open a GGUF file and build its tokenizer (tools, tests, fuzzers). */
int tokenizer_load(const char *gguf_path, struct tokenizer **ret);
void tokenizer_free(struct tokenizer *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct tokenizer *, tokenizer_free);

size_t tokenizer_n_vocab(const struct tokenizer *t);
/* Piece text (NUL-terminated; *len may be NULL), NULL for an id out of range. */
const char *tokenizer_piece(const struct tokenizer *t, int32_t id, size_t *len);
int tokenizer_piece_type(const struct tokenizer *t, int32_t id); /* -EINVAL out of range */
/* Id of the piece with exactly this text, -ENOENT if none. */
int32_t tokenizer_find_piece(const struct tokenizer *t, const char *text, size_t len);
/* Id of a registered special, -ENOENT if the vocab lacks it. */
int32_t tokenizer_special_id(const struct tokenizer *t, enum tokenizer_special s);
/* The registered special an id is, or -ENOENT. */
int tokenizer_id_special(const struct tokenizer *t, int32_t id);
int32_t tokenizer_bos_id(const struct tokenizer *t);
int32_t tokenizer_eos_id(const struct tokenizer *t);
int32_t tokenizer_unk_id(const struct tokenizer *t);
int32_t tokenizer_pad_id(const struct tokenizer *t);

/* Encode flags. 0 = the reference behaviour: specials recognised, no BOS/EOS. */
#define TOKENIZER_ENCODE_RAW 1u /* do not split out registered specials: all text is text */
#define TOKENIZER_ENCODE_BOS 2u /* prepend bos (error if the vocab has none) */
#define TOKENIZER_ENCODE_EOS 4u /* append eos (error if the vocab has none) */

/* A growable id array. */
struct tokenizer_ids {
        int32_t *ids;
        size_t n, cap;
};
void tokenizer_ids_done(struct tokenizer_ids *ids); /* frees, leaves it empty */

/* Append the ids of text[0..len) to *out. text may hold any bytes (NUL too). On failure -errno,
 * *out as it was, and the reason in err (error_set(), common/log.h; NULL, 0 logs it instead). */
int tokenizer_encode_append(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
                            struct tokenizer_ids *out, char *err, size_t err_size);
/* Same, into a fresh malloc'ed array (*ret_ids is non-NULL even when *ret_n is 0). */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
                     int32_t **ret_ids, size_t *ret_n, char *err, size_t err_size);

/* A byte range [start, end) of a text. */
struct tokenizer_span {
        size_t start, end;
};
/* tokenizer_encode (flags 0) where, inside the spans plain[0..n_plain) (sorted, disjoint), the
 * text of a registered special is text (the chat prompt's message contents: a user typing
 * `<_bot>` does not write a role marker); outside them, and for a text with no special's text in
 * the spans, the ids are tokenizer_encode's. */
int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len,
                           const struct tokenizer_span *plain, size_t n_plain, int32_t **ret_ids,
                           size_t *ret_n, char *err, size_t err_size);
/* Whether text holds the text of a registered special the vocabulary has. */
bool tokenizer_text_has_special(const struct tokenizer *t, const char *text, size_t len);

/* Decode flags. */
#define TOKENIZER_DECODE_SKIP_SPECIALS 1u /* registered specials produce no text */

/* Decode into a malloc'ed NUL-terminated UTF-8 string. An id out of range is -EINVAL (logged,
 * naming its position and the vocab size). */
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                     char **ret, size_t *ret_len);

/* Streaming detokenizer: feed ids one at a time, get the text they complete. It never returns
 * half a UTF-8 character; the concatenation of every feed's text and the final flush equals
 * tokenizer_decode() of all ids with the same flags. */
struct tokenizer_stream;
int tokenizer_stream_new(const struct tokenizer *t, unsigned flags, struct tokenizer_stream **ret);
void tokenizer_stream_free(struct tokenizer_stream *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct tokenizer_stream *, tokenizer_stream_free);
/* *ret_text points into the stream (valid until the next call), not NUL-terminated. */
int tokenizer_stream_feed(struct tokenizer_stream *s, int32_t id, const char **ret_text,
                          size_t *ret_len);
/* End of the ids: bytes still held (an unfinished byte sequence) come out as U+FFFD each.
 * The stream is then reset for a new sequence. */
int tokenizer_stream_flush(struct tokenizer_stream *s, const char **ret_text, size_t *ret_len);
/* The stream continues a text whose last token was prev (a prompt's): after a special the next
 * piece starts a run (its leading ▁ dropped, as sentencepiece decodes the whole sequence); after
 * text it keeps its space ("The cloud" + "▁told" is " told"); a control piece changes nothing. */
void tokenizer_stream_after(struct tokenizer_stream *s, int32_t prev);
/* Whether the next piece starts a run (its leading ▁ would be dropped). */
bool tokenizer_stream_at_run_start(const struct tokenizer_stream *s);

/* Encode speed on this machine: encodes `text` repeatedly for about `seconds` (single thread)
 * and returns bytes per second in *ret_bytes_per_s and the ids of one pass in *ret_n_ids. */
int tokenizer_bench(const struct tokenizer *t, const char *text, size_t len, double seconds,
                    double *ret_bytes_per_s, size_t *ret_n_ids);
