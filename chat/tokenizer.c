/* SPDX-License-Identifier: MIT */
/* SentencePiece-BPE tokenizer (docs/model.md §7). The exact rules (which pieces merge, the tie-break,
 * invalid UTF-8, the decode of byte runs and of the first piece of a run) were established by
 * experiment against python3-sentencepiece 0.1.97; tests/tokenizer/ checks them on 12,600 lines. */
#include "chat/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "gguf/gguf.h"

const char *const TOKENIZER_REGISTERED_SPECIALS[_TOKENIZER_SPECIAL_MAX] = {
        [TOKENIZER_SPECIAL_START] = "<_start>",
        [TOKENIZER_SPECIAL_END] = "<_end>",
        [TOKENIZER_SPECIAL_PAD] = "<_pad>",
        [TOKENIZER_SPECIAL_USER] = "<_user>",
        [TOKENIZER_SPECIAL_BOT] = "<_bot>",
        [TOKENIZER_SPECIAL_SYSTEM] = "<_system>",
        [TOKENIZER_SPECIAL_THINK] = "<think>",
        [TOKENIZER_SPECIAL_END_THINK] = "</think>",
        [TOKENIZER_SPECIAL_TOOL_CALL] = "<tool_call>",
        [TOKENIZER_SPECIAL_END_TOOL_CALL] = "</tool_call>",
        [TOKENIZER_SPECIAL_TOOL_RESPONSE] = "<tool_response>",
        [TOKENIZER_SPECIAL_END_TOOL_RESPONSE] = "</tool_response>",
};

/* U+2581 LOWER ONE EIGHTH BLOCK, sentencepiece's escaped space. */
static const char SPACE_MARK[3] = { (char) 0xe2, (char) 0x96, (char) 0x81 };
static const char REPLACEMENT[3] = { (char) 0xef, (char) 0xbf, (char) 0xbd };
static const char UNK_SURFACE[] = " \xe2\x81\x87 "; /* " ⁇ " */

#define MAX_PIECE_LEN 4096u

struct tokenizer {
        size_t n;
        char *blob;        /* all piece texts, each NUL-terminated */
        uint32_t *offset;  /* piece i starts at blob + offset[i] */
        uint32_t *len;
        float *score;
        uint8_t *type;
        uint8_t *special_of; /* 0 = not a registered special, else special + 1 */

        int32_t *table; /* open addressing: piece ids, -1 empty */
        size_t table_mask;

        /* (left id, right id) → id of the mergeable piece spelled left+right, for every split of
         * every mergeable piece into two pieces: merges then never hash text (the profile of the
         * text-hash version spent 55% in lookup()). */
        struct pair_slot *pairs;
        size_t pairs_mask;
        int32_t ascii_id[128]; /* piece of each one-byte character, -1 if none */

        int32_t byte_id[256];
        bool byte_fallback; /* all 256 byte pieces present */
        int32_t special_id[_TOKENIZER_SPECIAL_MAX];
        bool has_specials;

        /* user-defined pieces: cut out leftmost-longest (docs/model.md §7) */
        uint8_t user_first[256]; /* first bytes of user-defined pieces */
        size_t user_max_len;

        /* Every mergeable piece longer than one character has `▁` only as a leading run, so a
         * merge never spans a cut in front of a `▁` that follows another character: each such
         * word is merged on its own, which keeps the heap small (same result, see bpe_chunk). */
        bool word_cuts;

        int32_t unk_id, bos_id, eos_id, pad_id;
        bool add_space_prefix, add_bos, add_eos;
};

struct pair_slot {
        uint64_t key; /* left << 32 | right; UINT64_MAX empty */
        int32_t id;
};

static inline uint64_t pair_key(int32_t l, int32_t r) {
        return (uint64_t) (uint32_t) l << 32 | (uint32_t) r;
}

static inline size_t pair_hash(uint64_t k) {
        k ^= k >> 31;
        k *= 0x9e3779b97f4a7c15ull;
        return (size_t) (k ^ (k >> 29));
}

static int32_t pair_lookup(const struct tokenizer *t, int32_t l, int32_t r) {
        uint64_t k = pair_key(l, r);
        for (size_t i = pair_hash(k) & t->pairs_mask;; i = (i + 1) & t->pairs_mask) {
                if (t->pairs[i].key == k)
                        return t->pairs[i].id;
                if (t->pairs[i].key == UINT64_MAX)
                        return -ENOENT;
        }
}

static uint64_t hash_bytes(const char *p, size_t n) {
        /* FNV-1a, 64 bit: pieces are short, so a simple byte loop is enough */
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < n; i++) {
                h ^= (uint8_t) p[i];
                h *= 0x100000001b3ull;
        }
        return h ^ (h >> 29);
}

static int32_t lookup(const struct tokenizer *t, const char *p, size_t n) {
        size_t i = hash_bytes(p, n) & t->table_mask;
        for (;;) {
                int32_t id = t->table[i];
                if (id < 0)
                        return -ENOENT;
                if (t->len[id] == n && memcmp(t->blob + t->offset[id], p, n) == 0)
                        return id;
                i = (i + 1) & t->table_mask;
        }
}

/* The continuation bytes a lead byte c >= 0xc2 needs (1..3, 0 for none: not a multi-byte
 * lead), and the range [*lo, *hi] its first continuation byte must fall in (no overlong forms,
 * surrogates or code points beyond U+10FFFF). */
static size_t utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi) {
        *lo = 0x80;
        *hi = 0xbf;
        if (c < 0xc2 || c >= 0xf5)
                return 0;
        if (c < 0xe0)
                return 1;
        if (c < 0xf0) {
                if (c == 0xe0)
                        *lo = 0xa0;
                else if (c == 0xed)
                        *hi = 0x9f;
                return 2;
        }
        if (c == 0xf0)
                *lo = 0x90;
        else if (c == 0xf4)
                *hi = 0x8f;
        return 3;
}

/* Length of the valid UTF-8 character at p (n bytes left), 0 if the bytes there do not start a
 * complete valid character (overlong, surrogate, > U+10FFFF, truncated, stray continuation). */
static size_t utf8_valid_len(const uint8_t *p, size_t n) {
        uint8_t lo, hi;
        if (p[0] < 0x80)
                return 1;
        size_t need = utf8_lead(p[0], &lo, &hi);
        if (need == 0)
                return 0;
        if (n < need + 1)
                return 0;
        if (p[1] < lo || p[1] > hi)
                return 0;
        for (size_t i = 2; i <= need; i++)
                if ((p[i] & 0xc0) != 0x80)
                        return 0;
        return need + 1;
}

/* Whether p[0..n) is a proper prefix of some valid UTF-8 character (more bytes could complete
 * it). Used by the streaming decoder to hold bytes back. */
static bool utf8_incomplete_prefix(const uint8_t *p, size_t n) {
        uint8_t lo, hi;
        size_t need = utf8_lead(p[0], &lo, &hi);
        if (need == 0)
                return false;
        if (n > need)
                return false;
        if (n >= 2 && (p[1] < lo || p[1] > hi))
                return false;
        for (size_t i = 2; i < n; i++)
                if ((p[i] & 0xc0) != 0x80)
                        return false;
        return true;
}

static bool valid_utf8(const char *s, size_t n) {
        for (size_t i = 0; i < n;) {
                size_t l = utf8_valid_len((const uint8_t *) s + i, n - i);
                if (l == 0)
                        return false;
                i += l;
        }
        return true;
}

void tokenizer_free(struct tokenizer *t) {
        if (!t)
                return;
        free(t->blob);
        free(t->offset);
        free(t->len);
        free(t->score);
        free(t->type);
        free(t->special_of);
        free(t->table);
        free(t->pairs);
        free(t);
}

static bool mergeable(uint8_t type) {
        /* sentencepiece merges into the pieces of its piece map: normal, user-defined, unused */
        return type == TOKENIZER_PIECE_NORMAL || type == TOKENIZER_PIECE_USER_DEFINED ||
               type == TOKENIZER_PIECE_UNUSED;
}

static size_t utf8_char_count(const char *s, size_t n) {
        size_t c = 0;
        for (size_t i = 0; i < n; i++)
                c += ((uint8_t) s[i] & 0xc0) != 0x80;
        return c;
}

static int pairs_insert(struct tokenizer *t, int32_t l, int32_t r, int32_t id) {
        uint64_t k = pair_key(l, r);
        size_t i = pair_hash(k) & t->pairs_mask;
        while (t->pairs[i].key != UINT64_MAX) {
                if (t->pairs[i].key == k)
                        return 0;
                i = (i + 1) & t->pairs_mask;
        }
        t->pairs[i] = (struct pair_slot) { .key = k, .id = id };
        return 1;
}

static int build_pairs(struct tokenizer *t) {
        size_t count = 0;
        /* two passes: count the splits, then size the table for a load factor below 1/2 */
        for (int pass = 0; pass < 2; pass++) {
                if (pass == 1) {
                        size_t cap = 16;
                        while (cap < count * 2 + 16)
                                cap <<= 1;
                        t->pairs = malloc(cap * sizeof(struct pair_slot));
                        if (!t->pairs)
                                return -ENOMEM;
                        memset(t->pairs, 0xff, cap * sizeof(struct pair_slot));
                        t->pairs_mask = cap - 1;
                }
                for (size_t i = 0; i < t->n; i++) {
                        if (!mergeable(t->type[i]))
                                continue;
                        const char *p = t->blob + t->offset[i];
                        size_t n = t->len[i];
                        if (lookup(t, p, n) != (int32_t) i)
                                continue; /* a duplicate text: the first piece is the one merged into */
                        for (size_t k = 1; k < n; k++) {
                                if (((uint8_t) p[k] & 0xc0) == 0x80)
                                        continue;
                                int32_t l = lookup(t, p, k), r = lookup(t, p + k, n - k);
                                if (l < 0 || r < 0)
                                        continue;
                                if (pass == 0)
                                        count++;
                                else
                                        pairs_insert(t, l, r, (int32_t) i);
                        }
                }
        }
        return 0;
}

int tokenizer_new(const struct tokenizer_vocab *v, struct tokenizer **ret) {
        _cleanup_(tokenizer_freep) struct tokenizer *t = NULL;
        uint64_t total = 0;

        if (v->n == 0)
                return log_error_errno(EINVAL, "tokenizer: empty vocabulary, at least one piece expected");
        if (v->n > INT32_MAX)
                return log_error_errno(EOVERFLOW, "tokenizer: %zu pieces, at most %d supported", v->n,
                                       INT32_MAX);

        t = calloc(1, sizeof(*t));
        if (!t)
                return -ENOMEM;
        t->n = v->n;
        for (size_t i = 0; i < v->n; i++) {
                if (v->piece_lens[i] == 0)
                        return log_error_errno(EBADMSG, "tokenizer: piece %zu is empty, non-empty text expected", i);
                if (v->piece_lens[i] > MAX_PIECE_LEN)
                        return log_error_errno(EBADMSG, "tokenizer: piece %zu is %zu bytes, at most %u expected",
                                               i, v->piece_lens[i], MAX_PIECE_LEN);
                if (!valid_utf8(v->pieces[i], v->piece_lens[i]))
                        return log_error_errno(EBADMSG, "tokenizer: piece %zu is not valid UTF-8", i);
                if (v->types[i] < TOKENIZER_PIECE_NORMAL || v->types[i] > TOKENIZER_PIECE_BYTE)
                        return log_error_errno(EBADMSG, "tokenizer: piece %zu has token type %d, 1..6 expected",
                                               i, (int) v->types[i]);
                if (!isfinite(v->scores[i]))
                        return log_error_errno(EBADMSG, "tokenizer: piece %zu has a score that is not finite", i);
                total += v->piece_lens[i] + 1;
        }
        if (total > UINT32_MAX)
                return log_error_errno(EOVERFLOW, "tokenizer: piece texts total %llu bytes, at most 4 GiB expected",
                                       (unsigned long long) total);

        t->blob = malloc(total);
        t->offset = calloc(v->n, sizeof(uint32_t));
        t->len = calloc(v->n, sizeof(uint32_t));
        t->score = calloc(v->n, sizeof(float));
        t->type = calloc(v->n, 1);
        t->special_of = calloc(v->n, 1);
        size_t cap = 16;
        while (cap < v->n * 2)
                cap <<= 1;
        t->table = malloc(cap * sizeof(int32_t));
        if (!t->blob || !t->offset || !t->len || !t->score || !t->type || !t->special_of || !t->table)
                return -ENOMEM;
        t->table_mask = cap - 1;
        memset(t->table, 0xff, cap * sizeof(int32_t));

        uint32_t off = 0;
        for (size_t i = 0; i < v->n; i++) {
                memcpy(t->blob + off, v->pieces[i], v->piece_lens[i]);
                t->blob[off + v->piece_lens[i]] = 0;
                t->offset[i] = off;
                t->len[i] = (uint32_t) v->piece_lens[i];
                t->score[i] = v->scores[i];
                t->type[i] = (uint8_t) v->types[i];
                off += (uint32_t) v->piece_lens[i] + 1;

                /* first piece with a text wins, like sentencepiece's map */
                if (lookup(t, v->pieces[i], v->piece_lens[i]) < 0) {
                        size_t h = hash_bytes(v->pieces[i], v->piece_lens[i]) & t->table_mask;
                        while (t->table[h] >= 0)
                                h = (h + 1) & t->table_mask;
                        t->table[h] = (int32_t) i;
                }
        }

        t->byte_fallback = true;
        for (unsigned b = 0; b < 256; b++) {
                char name[8];
                snprintf(name, sizeof(name), "<0x%02X>", b);
                int32_t id = lookup(t, name, 6);
                t->byte_id[b] = id >= 0 && t->type[id] == TOKENIZER_PIECE_BYTE ? id : -1;
                if (t->byte_id[b] < 0)
                        t->byte_fallback = false;
        }

        for (int s = 0; s < _TOKENIZER_SPECIAL_MAX; s++) {
                const char *txt = TOKENIZER_REGISTERED_SPECIALS[s];
                int32_t id = lookup(t, txt, strlen(txt));
                t->special_id[s] = id >= 0 ? id : -ENOENT;
                if (id >= 0) {
                        t->special_of[id] = (uint8_t) (s + 1);
                        t->has_specials = true;
                }
        }

        t->word_cuts = true;
        for (size_t i = 0; i < v->n; i++) {
                const char *p = t->blob + t->offset[i];
                size_t l = t->len[i];
                if (t->type[i] == TOKENIZER_PIECE_USER_DEFINED) {
                        t->user_first[(uint8_t) p[0]] = 1;
                        t->user_max_len = MAX(t->user_max_len, l);
                }
                if (mergeable(t->type[i]) && utf8_char_count(p, l) > 1) {
                        size_t j = 0;
                        while (j + 3 <= l && memcmp(p + j, SPACE_MARK, 3) == 0)
                                j += 3;
                        if (j < l && memmem(p + j, l - j, SPACE_MARK, 3))
                                t->word_cuts = false;
                }
        }

        for (unsigned c = 0; c < 128; c++) {
                char ch = (char) c;
                t->ascii_id[c] = lookup(t, &ch, 1);
                if (t->ascii_id[c] < 0)
                        t->ascii_id[c] = -1;
        }

        int r = build_pairs(t);
        if (r < 0)
                return r;

        for (const int32_t *idp = &v->unk_id; idp <= &v->pad_id; idp++)
                if (*idp < -1 || *idp >= (int64_t) v->n)
                        return log_error_errno(ERANGE, "tokenizer: special token id %d out of range, -1..%zu expected",
                                               (int) *idp, v->n - 1);
        t->unk_id = v->unk_id;
        t->bos_id = v->bos_id;
        t->eos_id = v->eos_id;
        t->pad_id = v->pad_id;
        t->add_space_prefix = v->add_space_prefix;
        t->add_bos = v->add_bos;
        t->add_eos = v->add_eos;
        if (!t->byte_fallback && t->unk_id < 0)
                return log_error_errno(EBADMSG, "tokenizer: neither byte pieces <0x00>..<0xFF> nor an unknown "
                                                "token id, one of them expected");

        *ret = TAKE_PTR(t);
        return 0;
}

static int gguf_opt_id(const struct gguf_file *f, const char *key, int32_t def, int32_t *ret) {
        int64_t v;
        int r = gguf_get_i64(f, key, &v);
        if (r == -ENOENT) {
                *ret = def;
                return 0;
        }
        if (r < 0)
                return r;
        if (v < -1 || v > INT32_MAX)
                return log_error_errno(ERANGE, "%s: %lld out of range, a token id expected", key, (long long) v);
        *ret = (int32_t) v;
        return 0;
}

static int gguf_opt_bool(const struct gguf_file *f, const char *key, bool def, bool *ret) {
        int r = gguf_get_bool(f, key, ret);
        if (r == -ENOENT) {
                *ret = def;
                return 0;
        }
        return r;
}

static int new_from_gguf(const struct gguf_file *f, struct tokenizer **ret) {
        const struct gguf_value *tokens, *scores, *types;
        struct gguf_string model;
        int r;

        r = gguf_get_string(f, "tokenizer.ggml.model", &model);
        if (r == -ENOENT)
                return log_error_errno(EBADMSG, "%s: tokenizer.ggml.model missing, \"llama\" (SentencePiece) expected",
                                       gguf_path(f));
        if (r < 0)
                return r;
        if (model.len != 5 || memcmp(model.data, "llama", 5) != 0)
                return log_error_errno(EOPNOTSUPP, "%s: tokenizer.ggml.model is \"%.*s\", \"llama\" (SentencePiece) expected",
                                       gguf_path(f), (int) MIN(model.len, 64u), model.data);

        const char *keys[3] = { "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type" };
        const struct gguf_value **vals[3] = { &tokens, &scores, &types };
        const uint32_t want[3] = { GGUF_TYPE_STRING, GGUF_TYPE_FLOAT32, GGUF_TYPE_INT32 };
        for (int k = 0; k < 3; k++) {
                r = gguf_get_array(f, keys[k], vals[k]);
                if (r == -ENOENT)
                        return log_error_errno(EBADMSG, "%s: %s missing, an array expected", gguf_path(f), keys[k]);
                if (r < 0)
                        return r;
                if ((*vals[k])->arr.elem_type != want[k] &&
                    !(k == 2 && ((*vals[k])->arr.elem_type == GGUF_TYPE_UINT32 ||
                                 (*vals[k])->arr.elem_type == GGUF_TYPE_INT8 ||
                                 (*vals[k])->arr.elem_type == GGUF_TYPE_UINT8)))
                        return log_error_errno(EBADMSG, "%s: %s is an array of %s, %s expected", gguf_path(f),
                                               keys[k], gguf_value_type_name((*vals[k])->arr.elem_type),
                                               gguf_value_type_name(want[k]));
        }
        size_t n = tokens->arr.n;
        if (scores->arr.n != n || types->arr.n != n)
                return log_error_errno(EBADMSG, "%s: tokenizer.ggml.tokens has %zu entries, scores %llu and token_type %llu; "
                                                "equal counts expected",
                                       gguf_path(f), n, (unsigned long long) scores->arr.n,
                                       (unsigned long long) types->arr.n);
        if (n == 0 || n > INT32_MAX)
                return log_error_errno(EBADMSG, "%s: tokenizer.ggml.tokens has %zu entries, 1..%d expected",
                                       gguf_path(f), n, INT32_MAX);

        _cleanup_free_ const char **pieces = calloc(n, sizeof(char *));
        _cleanup_free_ size_t *lens = calloc(n, sizeof(size_t));
        _cleanup_free_ float *sc = calloc(n, sizeof(float));
        _cleanup_free_ int32_t *ty = calloc(n, sizeof(int32_t));
        if (!pieces || !lens || !sc || !ty)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct gguf_string s;
                double d;
                int64_t tv;
                r = gguf_array_get_string(tokens, i, &s);
                if (r < 0)
                        return log_error_errno(r, "%s: tokenizer.ggml.tokens[%zu] unreadable", gguf_path(f), i);
                r = gguf_array_get_f64(scores, i, &d);
                if (r < 0)
                        return log_error_errno(r, "%s: tokenizer.ggml.scores[%zu] unreadable", gguf_path(f), i);
                r = gguf_array_get_i64(types, i, &tv);
                if (r < 0)
                        return log_error_errno(r, "%s: tokenizer.ggml.token_type[%zu] unreadable", gguf_path(f), i);
                if (tv < TOKENIZER_PIECE_NORMAL || tv > TOKENIZER_PIECE_BYTE)
                        return log_error_errno(EBADMSG, "%s: tokenizer.ggml.token_type[%zu] is %lld, 1..6 expected",
                                               gguf_path(f), i, (long long) tv);
                pieces[i] = s.data;
                lens[i] = s.len;
                sc[i] = (float) d;
                ty[i] = (int32_t) tv;
        }

        struct tokenizer_vocab v = { .n = n, .pieces = pieces, .piece_lens = lens, .scores = sc, .types = ty };
        if ((r = gguf_opt_id(f, "tokenizer.ggml.unknown_token_id", 0, &v.unk_id)) < 0 ||
            (r = gguf_opt_id(f, "tokenizer.ggml.bos_token_id", 1, &v.bos_id)) < 0 ||
            (r = gguf_opt_id(f, "tokenizer.ggml.eos_token_id", 2, &v.eos_id)) < 0 ||
            (r = gguf_opt_id(f, "tokenizer.ggml.padding_token_id", -1, &v.pad_id)) < 0 ||
            (r = gguf_opt_bool(f, "tokenizer.ggml.add_space_prefix", true, &v.add_space_prefix)) < 0 ||
            (r = gguf_opt_bool(f, "tokenizer.ggml.add_bos_token", false, &v.add_bos)) < 0 ||
            (r = gguf_opt_bool(f, "tokenizer.ggml.add_eos_token", false, &v.add_eos)) < 0)
                return r;
        for (int32_t *idp = &v.unk_id; idp <= &v.pad_id; idp++)
                if (*idp >= (int64_t) n)
                        *idp = -1; /* a default that does not exist in a small vocab */
        return tokenizer_new(&v, ret);
}

int tokenizer_new_from_gguf(const struct gguf_file *f, struct tokenizer **ret, char *err,
                            size_t err_size) {
        log_clear_last_error();
        return log_error_value(new_from_gguf(f, ret), err, err_size);
}

int tokenizer_load(const char *path, struct tokenizer **ret) {
        _cleanup_(gguf_closep) struct gguf_file *f = NULL;
        int r = gguf_open(path, &f);
        if (r < 0)
                return r;
        return tokenizer_new_from_gguf(f, ret, NULL, 0);
}

size_t tokenizer_n_vocab(const struct tokenizer *t) {
        return t->n;
}

const char *tokenizer_piece(const struct tokenizer *t, int32_t id, size_t *len) {
        if (id < 0 || (size_t) id >= t->n)
                return NULL;
        if (len)
                *len = t->len[id];
        return t->blob + t->offset[id];
}

int tokenizer_piece_type(const struct tokenizer *t, int32_t id) {
        if (id < 0 || (size_t) id >= t->n)
                return -EINVAL;
        return t->type[id];
}

int32_t tokenizer_find_piece(const struct tokenizer *t, const char *text, size_t len) {
        return lookup(t, text, len);
}

int32_t tokenizer_special_id(const struct tokenizer *t, enum tokenizer_special s) {
        if ((int) s < 0 || s >= _TOKENIZER_SPECIAL_MAX)
                return -EINVAL;
        return t->special_id[s];
}

int tokenizer_id_special(const struct tokenizer *t, int32_t id) {
        if (id < 0 || (size_t) id >= t->n || !t->special_of[id])
                return -ENOENT;
        return t->special_of[id] - 1;
}

int32_t tokenizer_bos_id(const struct tokenizer *t) {
        return t->bos_id;
}
int32_t tokenizer_eos_id(const struct tokenizer *t) {
        return t->eos_id;
}
int32_t tokenizer_unk_id(const struct tokenizer *t) {
        return t->unk_id;
}
int32_t tokenizer_pad_id(const struct tokenizer *t) {
        return t->pad_id;
}

/* ---- encode ---------------------------------------------------------------------------- */

void tokenizer_ids_done(struct tokenizer_ids *ids) {
        free(ids->ids);
        *ids = (struct tokenizer_ids) {};
}

static int ids_push(struct tokenizer_ids *o, int32_t id) {
        if (o->n == o->cap) {
                size_t cap = o->cap ? o->cap * 2 : 64;
                int32_t *p = realloc(o->ids, cap * sizeof(int32_t));
                if (!p)
                        return -ENOMEM;
                o->ids = p;
                o->cap = cap;
        }
        o->ids[o->n++] = id;
        return 0;
}

struct sym {
        uint32_t start, len; /* in the normalized text; len 0 = merged away */
        int32_t id;          /* the piece spelled by it, -1 if none */
        int32_t prev, next;
        bool frozen; /* a user-defined piece: never merged */
};

struct cand {
        float score;
        int32_t left, right, id;
        uint32_t len; /* left.len + right.len when it was queued */
};

/* Per-call scratch, grown as needed. */
struct work {
        char *norm;
        size_t norm_cap;
        struct sym *sym;
        size_t sym_cap;
        struct cand *heap;
        size_t heap_n, heap_cap;
        struct { int32_t id; uint32_t left_len; } *rev; /* merges into unused pieces */
        size_t rev_n, rev_cap;

        /* Words already merged in this call (long texts repeat their words: on 5 MB of
         * licenses/man pages/Python: 10.3 → 24 MB/s of thread CPU time). A word's ids depend on
         * its text only, so a hit is exact. Per call, so the tokenizer stays shareable. */
        struct wc_slot { uint64_t h; uint32_t koff, klen, ioff, in; } *wc;
        size_t wc_mask, wc_n;
        struct buf8 { char *p; size_t n, cap; } wc_keys;
        struct tokenizer_ids wc_ids;
};

#define WC_MIN_TEXT 2048u   /* below this a call does not build a cache */
#define WC_MAX_WORD 64u     /* bytes */
#define WC_SLOTS (1u << 15) /* at most half used */

static void work_done(struct work *w) {
        free(w->wc);
        free(w->wc_keys.p);
        free(w->wc_ids.ids);
        free(w->norm);
        free(w->sym);
        free(w->heap);
        free(w->rev);
}

static bool cand_before(const struct cand *a, const struct cand *b) {
        /* highest score first; on ties the leftmost pair (sentencepiece's agenda order) */
        if (a->score != b->score)
                return a->score > b->score;
        return a->left < b->left;
}

static int heap_push(struct work *w, struct cand c) {
        if (w->heap_n == w->heap_cap) {
                size_t cap = w->heap_cap ? w->heap_cap * 2 : 256;
                struct cand *p = realloc(w->heap, cap * sizeof(*p));
                if (!p)
                        return -ENOMEM;
                w->heap = p;
                w->heap_cap = cap;
        }
        size_t i = w->heap_n++;
        while (i > 0) {
                size_t parent = (i - 1) / 2;
                if (!cand_before(&c, &w->heap[parent]))
                        break;
                w->heap[i] = w->heap[parent];
                i = parent;
        }
        w->heap[i] = c;
        return 0;
}

static struct cand heap_pop(struct work *w) {
        struct cand top = w->heap[0], last = w->heap[--w->heap_n];
        size_t i = 0, n = w->heap_n;
        for (;;) {
                size_t c = 2 * i + 1;
                if (c >= n)
                        break;
                if (c + 1 < n && cand_before(&w->heap[c + 1], &w->heap[c]))
                        c++;
                if (!cand_before(&w->heap[c], &last))
                        break;
                w->heap[i] = w->heap[c];
                i = c;
        }
        if (n > 0)
                w->heap[i] = last;
        return top;
}

static int try_pair(const struct tokenizer *t, struct work *w, int32_t left, int32_t right) {
        if (left < 0 || right < 0)
                return 0;
        const struct sym *a = &w->sym[left], *b = &w->sym[right];
        if (a->frozen || b->frozen)
                return 0;
        uint32_t len = a->len + b->len;
        /* symbols without an id can only merge by text (a vocab whose pieces use characters that
         * are not pieces themselves) */
        int32_t id = a->id >= 0 && b->id >= 0 ? pair_lookup(t, a->id, b->id) : lookup(t, w->norm + a->start, len);
        if (id < 0 || !mergeable(t->type[id]))
                return 0;
        return heap_push(w, (struct cand) { .score = t->score[id], .left = left, .right = right, .id = id, .len = len });
}

static int emit_text(const struct tokenizer *t, struct work *w, const char *p, size_t n,
                     struct tokenizer_ids *out);

/* An unused piece left at the end is split back into the two pieces it was merged from. */
static int emit_piece(const struct tokenizer *t, struct work *w, const char *p, size_t n,
                      struct tokenizer_ids *out, unsigned depth) {
        int32_t id = lookup(t, p, n);
        if (id >= 0 && t->type[id] == TOKENIZER_PIECE_UNUSED && depth < 64) {
                for (size_t k = w->rev_n; k > 0; k--)
                        if (w->rev[k - 1].id == id) {
                                uint32_t l = w->rev[k - 1].left_len;
                                int r = emit_piece(t, w, p, l, out, depth + 1);
                                if (r < 0)
                                        return r;
                                return emit_piece(t, w, p + l, n - l, out, depth + 1);
                        }
        }
        if (id >= 0)
                return ids_push(out, id);
        return emit_text(t, w, p, n, out);
}

/* A symbol that is not a piece: its bytes (byte fallback) or the unknown id. */
static int emit_text(const struct tokenizer *t, struct work *w, const char *p, size_t n,
                     struct tokenizer_ids *out) {
        if (!t->byte_fallback)
                return ids_push(out, t->unk_id);
        for (size_t i = 0; i < n; i++) {
                int r = ids_push(out, t->byte_id[(uint8_t) p[i]]);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* BPE over symbols [first, last] (a linked run). */
static int bpe_run(const struct tokenizer *t, struct work *w, int32_t first, int32_t last,
                   struct tokenizer_ids *out) {
        int r;
        w->heap_n = 0;
        for (int32_t i = first; i < last; i++)
                if ((r = try_pair(t, w, i, i + 1)) < 0)
                        return r;
        while (w->heap_n > 0) {
                struct cand c = heap_pop(w);
                struct sym *a = &w->sym[c.left], *b = &w->sym[c.right];
                if (a->len == 0 || b->len == 0 || a->next != c.right || a->len + b->len != c.len)
                        continue; /* stale: one side changed since it was queued */
                int32_t id = c.id;
                if (t->type[id] == TOKENIZER_PIECE_UNUSED) {
                        if (w->rev_n == w->rev_cap) {
                                size_t cap = w->rev_cap ? w->rev_cap * 2 : 16;
                                void *p = realloc(w->rev, cap * sizeof(*w->rev));
                                if (!p)
                                        return -ENOMEM;
                                w->rev = p;
                                w->rev_cap = cap;
                        }
                        w->rev[w->rev_n].id = id;
                        w->rev[w->rev_n++].left_len = a->len;
                }
                a->len = c.len;
                a->id = id;
                b->len = 0;
                a->next = b->next;
                if (b->next >= 0 && b->next <= last)
                        w->sym[b->next].prev = c.left;
                if ((r = try_pair(t, w, a->prev >= first ? a->prev : -1, c.left)) < 0)
                        return r;
                if ((r = try_pair(t, w, c.left, a->next >= 0 && a->next <= last ? a->next : -1)) < 0)
                        return r;
        }
        for (int32_t i = first; i <= last && i >= 0; i = w->sym[i].next) {
                const struct sym *y = &w->sym[i];
                if (y->id >= 0 && t->type[y->id] != TOKENIZER_PIECE_UNUSED)
                        r = ids_push(out, y->id);
                else
                        r = emit_piece(t, w, w->norm + y->start, y->len, out, 0);
                if (r < 0)
                        return r;
                if (i == last)
                        break;
        }
        return 0;
}

static int bpe_run_cached(const struct tokenizer *t, struct work *w, int32_t first, int32_t last,
                          struct tokenizer_ids *out) {
        uint32_t start = w->sym[first].start, len = w->sym[last].start + w->sym[last].len - start;
        const char *key = w->norm + start;
        if (len > WC_MAX_WORD)
                return bpe_run(t, w, first, last, out);
        uint64_t h = hash_bytes(key, len);
        size_t i = h & w->wc_mask;
        for (; w->wc[i].klen; i = (i + 1) & w->wc_mask) {
                const struct wc_slot *e = &w->wc[i];
                if (e->h == h && e->klen == len && memcmp(w->wc_keys.p + e->koff, key, len) == 0) {
                        for (uint32_t k = 0; k < e->in; k++) {
                                int r = ids_push(out, w->wc_ids.ids[e->ioff + k]);
                                if (r < 0)
                                        return r;
                        }
                        return 0;
                }
        }
        size_t n0 = out->n;
        int r = bpe_run(t, w, first, last, out);
        if (r < 0 || w->wc_n >= (w->wc_mask + 1) / 2)
                return r;
        /* remember it */
        if (w->wc_keys.n + len > w->wc_keys.cap) {
                size_t cap = MAX(w->wc_keys.cap * 2, (size_t) 65536);
                char *p = realloc(w->wc_keys.p, cap);
                if (!p)
                        return -ENOMEM;
                w->wc_keys.p = p;
                w->wc_keys.cap = cap;
        }
        memcpy(w->wc_keys.p + w->wc_keys.n, key, len);
        w->wc[i] = (struct wc_slot) { .h = h, .koff = (uint32_t) w->wc_keys.n, .klen = len,
                                      .ioff = (uint32_t) w->wc_ids.n, .in = (uint32_t) (out->n - n0) };
        w->wc_keys.n += len;
        w->wc_n++;
        for (size_t k = n0; k < out->n; k++)
                if ((r = ids_push(&w->wc_ids, out->ids[k])) < 0)
                        return r;
        return 0;
}

static int work_reserve(struct work *w, size_t len) {
        /* normalized text: at most 3 bytes per input byte (' ' → ▁, bad byte → U+FFFD) + prefix */
        size_t need = 3 * len + 3;
        if (need > w->norm_cap) {
                char *p = realloc(w->norm, need);
                if (!p)
                        return -ENOMEM;
                w->norm = p;
                w->norm_cap = need;
        }
        if (len + 1 > w->sym_cap) {
                struct sym *p = realloc(w->sym, (len + 1) * sizeof(*p));
                if (!p)
                        return -ENOMEM;
                w->sym = p;
                w->sym_cap = len + 1;
        }
        return 0;
}

/* One chunk of text without registered specials. */
static int encode_chunk(const struct tokenizer *t, struct work *w, const char *text, size_t len,
                        struct tokenizer_ids *out, char *err, size_t err_size) {
        size_t n0 = out->n;
        int r;
        if (len == 0)
                return 0;
        if (len > UINT32_MAX / 4)
                return error_set(err, err_size, EFBIG, "tokenizer: text chunk of %zu bytes, at most 1 GiB expected",
                                 len);
        if ((r = work_reserve(w, len)) < 0)
                return r;
        if (len >= WC_MIN_TEXT && t->word_cuts && !w->wc) {
                w->wc = calloc(WC_SLOTS, sizeof(*w->wc));
                if (!w->wc)
                        return -ENOMEM;
                w->wc_mask = WC_SLOTS - 1;
        }

        /* normalize (identity rule): dummy prefix, ' ' → ▁, each malformed byte → U+FFFD */
        size_t n = 0;
        if (t->add_space_prefix) {
                memcpy(w->norm, SPACE_MARK, 3);
                n = 3;
        }
        for (size_t i = 0; i < len;) {
                uint8_t c = (uint8_t) text[i];
                if (c == ' ') {
                        memcpy(w->norm + n, SPACE_MARK, 3);
                        n += 3;
                        i++;
                } else if (c < 0x80) {
                        w->norm[n++] = (char) c;
                        i++;
                } else {
                        size_t l = utf8_valid_len((const uint8_t *) text + i, len - i);
                        if (l == 0) {
                                memcpy(w->norm + n, REPLACEMENT, 3);
                                n += 3;
                                i++;
                        } else {
                                memcpy(w->norm + n, text + i, l);
                                n += l;
                                i += l;
                        }
                }
        }

        /* initial symbols: user-defined pieces leftmost-longest, else one character each */
        size_t ns = 0;
        w->rev_n = 0;
        for (size_t i = 0; i < n;) {
                size_t l = 0;
                int32_t id = -1;
                bool frozen = false;
                uint8_t c = (uint8_t) w->norm[i];
                if (t->user_first[c]) {
                        for (size_t k = MIN(t->user_max_len, n - i); k > 0; k--) {
                                id = lookup(t, w->norm + i, k);
                                if (id >= 0 && t->type[id] == TOKENIZER_PIECE_USER_DEFINED) {
                                        l = k;
                                        frozen = true;
                                        break;
                                }
                        }
                }
                if (l == 0) {
                        if (c < 0x80) {
                                l = 1;
                                id = t->ascii_id[c];
                        } else {
                                l = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2; /* norm is valid UTF-8 */
                                id = lookup(t, w->norm + i, l);
                                if (id < 0)
                                        id = -1;
                        }
                }
                w->sym[ns] = (struct sym) { .start = (uint32_t) i, .len = (uint32_t) l, .id = id,
                                            .prev = (int32_t) ns - 1, .next = (int32_t) ns + 1,
                                            .frozen = frozen };
                ns++;
                i += l;
        }
        w->sym[ns - 1].next = -1;

        /* Merge runs separately where no merge can cross: at frozen symbols always; in front of a
         * `▁` that follows another character when the vocab allows it (word_cuts). */
        size_t first = 0;
        for (size_t i = 0; i < ns; i++) {
                bool cut_after = i + 1 == ns || w->sym[i].frozen || w->sym[i + 1].frozen;
                if (!cut_after && t->word_cuts) {
                        const char *nx = w->norm + w->sym[i + 1].start;
                        const char *cur = w->norm + w->sym[i].start;
                        cut_after = memcmp(nx, SPACE_MARK, 3) == 0 &&
                                    !(w->sym[i].len == 3 && memcmp(cur, SPACE_MARK, 3) == 0);
                }
                if (!cut_after)
                        continue;
                w->sym[first].prev = -1;
                w->sym[i].next = -1;
                if (first == i && w->sym[i].id >= 0 && t->type[w->sym[i].id] != TOKENIZER_PIECE_UNUSED)
                        r = ids_push(out, w->sym[i].id); /* one symbol: nothing to merge */
                else if (w->wc)
                        r = bpe_run_cached(t, w, (int32_t) first, (int32_t) i, out);
                else
                        r = bpe_run(t, w, (int32_t) first, (int32_t) i, out);
                if (r < 0)
                        return r;
                first = i + 1;
        }
        /* Without byte pieces, sentencepiece gives a run of unknown characters one <unk> (seen
         * with a variant of the fixture without byte pieces; tests/tokenizer/README.md). */
        if (!t->byte_fallback) {
                size_t k = n0;
                for (size_t j = n0; j < out->n; j++)
                        if (!(out->ids[j] == t->unk_id && k > n0 && out->ids[k - 1] == t->unk_id))
                                out->ids[k++] = out->ids[j];
                out->n = k;
        }
        return 0;
}

/* The registered special whose text starts at text[i] (the longest), -1 for none. */
static int special_at(const struct tokenizer *t, const char *text, size_t len, size_t i, size_t *ret_len) {
        int best = -1;
        size_t best_len = 0;
        for (int s = 0; s < _TOKENIZER_SPECIAL_MAX; s++) {
                if (t->special_id[s] < 0)
                        continue;
                size_t sl = t->len[t->special_id[s]];
                if (sl > best_len && sl <= len - i && memcmp(text + i, TOKENIZER_REGISTERED_SPECIALS[s], sl) == 0) {
                        best = s;
                        best_len = sl;
                }
        }
        *ret_len = best_len;
        return best;
}

bool tokenizer_text_has_special(const struct tokenizer *t, const char *text, size_t len) {
        size_t sl;
        for (size_t i = 0; t->has_specials && i < len; i++) {
                const char *lt = memchr(text + i, '<', len - i);
                if (!lt)
                        return false;
                i = (size_t) (lt - text);
                if (special_at(t, text, len, i, &sl) >= 0)
                        return true;
        }
        return false;
}

/* plain[0..n_plain): sorted, disjoint byte ranges of text where a special's text is text */
static int encode_into(const struct tokenizer *t, struct work *w, const char *text, size_t len,
                       unsigned flags, const struct tokenizer_span *plain, size_t n_plain,
                       struct tokenizer_ids *out, char *err, size_t err_size) {
        int r;
        if (flags & TOKENIZER_ENCODE_BOS) {
                if (t->bos_id < 0)
                        return error_set(err, err_size, ENOENT,
                                         "tokenizer: BOS requested, but the vocabulary has no bos token id");
                if ((r = ids_push(out, t->bos_id)) < 0)
                        return r;
        }
        if ((flags & TOKENIZER_ENCODE_RAW) || !t->has_specials) {
                if ((r = encode_chunk(t, w, text, len, out, err, err_size)) < 0)
                        return r;
        } else {
                /* docs/model.md §7: split on the registered specials only; every chunk gets its own dummy
                 * prefix. All registered specials start with '<'. */
                size_t chunk = 0, i = 0, pi = 0;
                while (i < len) {
                        const char *lt = memchr(text + i, '<', len - i);
                        if (!lt)
                                break;
                        i = (size_t) (lt - text);
                        size_t best_len;
                        int best = special_at(t, text, len, i, &best_len);
                        while (pi < n_plain && plain[pi].end <= i)
                                pi++;
                        if (best >= 0 && pi < n_plain && plain[pi].start <= i)
                                best = -1; /* in a plain span: its text is text */
                        if (best < 0) {
                                i++;
                                continue;
                        }
                        if ((r = encode_chunk(t, w, text + chunk, i - chunk, out, err, err_size)) < 0)
                                return r;
                        if ((r = ids_push(out, t->special_id[best])) < 0)
                                return r;
                        i += best_len;
                        chunk = i;
                }
                if ((r = encode_chunk(t, w, text + chunk, len - chunk, out, err, err_size)) < 0)
                        return r;
        }
        if (flags & TOKENIZER_ENCODE_EOS) {
                if (t->eos_id < 0)
                        return error_set(err, err_size, ENOENT,
                                         "tokenizer: EOS requested, but the vocabulary has no eos token id");
                if ((r = ids_push(out, t->eos_id)) < 0)
                        return r;
        }
        return 0;
}

int tokenizer_encode_append(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
                            struct tokenizer_ids *out, char *err, size_t err_size) {
        struct work w = {};
        size_t n0 = out->n;
        /* the named failures say so themselves; the rest are allocations */
        int r = encode_into(t, &w, text, len, flags, NULL, 0, out, err, err_size);
        work_done(&w);
        if (r == -ENOMEM)
                r = error_set(err, err_size, ENOMEM, "tokenizer: out of memory for %zu bytes of text", len);
        if (r < 0)
                out->n = n0;
        return r;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
                     int32_t **ret_ids, size_t *ret_n, char *err, size_t err_size) {
        struct tokenizer_ids ids = {};
        int r = tokenizer_encode_append(t, text, len, flags, &ids, err, err_size);
        if (r < 0) {
                tokenizer_ids_done(&ids);
                return r;
        }
        if (!ids.ids && !(ids.ids = malloc(sizeof(int32_t))))
                return error_set(err, err_size, ENOMEM, "tokenizer: out of memory");
        *ret_ids = ids.ids;
        *ret_n = ids.n;
        return 0;
}

int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len,
                           const struct tokenizer_span *plain, size_t n_plain, int32_t **ret_ids,
                           size_t *ret_n, char *err, size_t err_size) {
        struct tokenizer_ids ids = {};
        struct work w = {};
        for (size_t k = 0; k < n_plain; k++)
                if (plain[k].start > plain[k].end || plain[k].end > len || (k && plain[k].start < plain[k - 1].end))
                        return error_set(err, err_size, EINVAL, "tokenizer: plain span %zu is out of order or "
                                         "past the text's %zu bytes", k, len);
        int r = encode_into(t, &w, text, len, 0, plain, n_plain, &ids, err, err_size);
        work_done(&w);
        if (r == -ENOMEM)
                r = error_set(err, err_size, ENOMEM, "tokenizer: out of memory for %zu bytes of text", len);
        if (r < 0) {
                tokenizer_ids_done(&ids);
                return r;
        }
        *ret_ids = ids.ids ? ids.ids : malloc(sizeof(int32_t));
        *ret_n = ids.n;
        return *ret_ids ? 0 : error_set(err, err_size, ENOMEM, "tokenizer: out of memory");
}

/* ---- decode ---------------------------------------------------------------------------- */

struct tokenizer_stream {
        const struct tokenizer *t;
        unsigned flags;
        bool run_start;   /* the next text piece is the first of its run: drop one leading ▁ */
        uint8_t pend[4];  /* bytes of byte pieces that may still become a character */
        size_t npend;
        char *buf;
        size_t len, cap;
};

static int out_put(struct tokenizer_stream *s, const char *p, size_t n) {
        if (s->len + n + 1 > s->cap) {
                size_t cap = MAX(s->cap * 2, s->len + n + 64);
                char *b = realloc(s->buf, cap);
                if (!b)
                        return -ENOMEM;
                s->buf = b;
                s->cap = cap;
        }
        memcpy(s->buf + s->len, p, n);
        s->len += n;
        s->buf[s->len] = 0;
        return 0;
}

/* Emit what the held bytes determine. With `all`, nothing more follows the run: every byte
 * that does not start a complete character is U+FFFD (sentencepiece decodes byte runs so). */
static int stream_drain(struct tokenizer_stream *s, bool all) {
        int r;
        while (s->npend > 0) {
                size_t l = utf8_valid_len(s->pend, s->npend);
                if (l == 0 && !all && utf8_incomplete_prefix(s->pend, s->npend))
                        return 0;
                if (l > 0)
                        r = out_put(s, (const char *) s->pend, l);
                else {
                        r = out_put(s, REPLACEMENT, 3);
                        l = 1;
                }
                if (r < 0)
                        return r;
                memmove(s->pend, s->pend + l, s->npend - l);
                s->npend -= l;
        }
        return 0;
}

static int stream_piece(struct tokenizer_stream *s, int32_t id) {
        const struct tokenizer *t = s->t;
        int r;
        if (id < 0 || (size_t) id >= t->n)
                return -EINVAL;
        uint8_t type = t->type[id];
        if (type == TOKENIZER_PIECE_BYTE) {
                const char *p = t->blob + t->offset[id];
                unsigned b = (unsigned) strtoul(p + 3, NULL, 16);
                s->pend[s->npend++] = (uint8_t) b;
                s->run_start = false;
                return stream_drain(s, false);
        }
        /* anything else ends a byte run */
        if ((r = stream_drain(s, true)) < 0)
                return r;
        if (t->special_of[id]) {
                s->run_start = true;
                if (s->flags & TOKENIZER_DECODE_SKIP_SPECIALS)
                        return 0;
                return out_put(s, t->blob + t->offset[id], t->len[id]);
        }
        if (type == TOKENIZER_PIECE_CONTROL)
                return 0;
        if (type == TOKENIZER_PIECE_UNKNOWN) {
                s->run_start = false;
                return out_put(s, UNK_SURFACE, sizeof(UNK_SURFACE) - 1);
        }
        const char *p = t->blob + t->offset[id];
        size_t n = t->len[id];
        /* sentencepiece drops it only when it adds one (add_dummy_prefix; the noprefix variant) */
        if (s->run_start && t->add_space_prefix && n >= 3 && memcmp(p, SPACE_MARK, 3) == 0) {
                p += 3;
                n -= 3;
        }
        s->run_start = false;
        while (n > 0) {
                const char *m = memmem(p, n, SPACE_MARK, 3);
                size_t k = m ? (size_t) (m - p) : n;
                if ((r = out_put(s, p, k)) < 0)
                        return r;
                if (!m)
                        break;
                if ((r = out_put(s, " ", 1)) < 0)
                        return r;
                p = m + 3;
                n -= k + 3;
        }
        return 0;
}

int tokenizer_stream_new(const struct tokenizer *t, unsigned flags, struct tokenizer_stream **ret) {
        struct tokenizer_stream *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->t = t;
        s->flags = flags;
        s->run_start = true;
        *ret = s;
        return 0;
}

void tokenizer_stream_free(struct tokenizer_stream *s) {
        if (!s)
                return;
        free(s->buf);
        free(s);
}

int tokenizer_stream_feed(struct tokenizer_stream *s, int32_t id, const char **ret_text, size_t *ret_len) {
        s->len = 0;
        int r = stream_piece(s, id);
        if (r == -EINVAL)
                return log_error_errno(r, "tokenizer: token id %d out of range, 0..%zu expected", (int) id,
                                       s->t->n - 1);
        if (r < 0)
                return r;
        *ret_text = s->buf ? s->buf : "";
        *ret_len = s->len;
        return 0;
}

void tokenizer_stream_after(struct tokenizer_stream *s, int32_t prev) {
        const struct tokenizer *t = s->t;
        if (prev < 0 || (size_t) prev >= t->n)
                return;
        /* a control piece decodes to nothing and leaves the run as it was (stream_piece) */
        if (t->special_of[prev])
                s->run_start = true;
        else if (t->type[prev] != TOKENIZER_PIECE_CONTROL)
                s->run_start = false;
}

bool tokenizer_stream_at_run_start(const struct tokenizer_stream *s) {
        return s->run_start;
}

int tokenizer_stream_flush(struct tokenizer_stream *s, const char **ret_text, size_t *ret_len) {
        s->len = 0;
        int r = stream_drain(s, true);
        if (r < 0)
                return r;
        s->run_start = true;
        *ret_text = s->buf ? s->buf : "";
        *ret_len = s->len;
        return 0;
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **ret,
                     size_t *ret_len) {
        struct tokenizer_stream s = { .t = t, .flags = flags, .run_start = true };
        int r = out_put(&s, "", 0);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                r = stream_piece(&s, ids[i]);
                if (r == -EINVAL)
                        r = log_error_errno(r, "tokenizer: token id %d at position %zu out of range, 0..%zu expected",
                                            (int) ids[i], i, t->n - 1);
        }
        if (r >= 0)
                r = stream_drain(&s, true);
        if (r < 0) {
                free(s.buf);
                return r;
        }
        *ret = s.buf;
        if (ret_len)
                *ret_len = s.len;
        return 0;
}

/* ---- bench ----------------------------------------------------------------------------- */

int tokenizer_bench(const struct tokenizer *t, const char *text, size_t len, double seconds,
                    double *ret_bytes_per_s, size_t *ret_n_ids) {
        struct tokenizer_ids ids = {};
        struct work w = {};
        struct timespec a, b;
        double elapsed = 0;
        uint64_t bytes = 0;
        int r = 0;

        /* one warm-up pass grows the scratch buffers, then timed passes */
        r = encode_into(t, &w, text, len, 0, NULL, 0, &ids, NULL, 0);
        if (ret_n_ids)
                *ret_n_ids = ids.n;
        /* thread CPU time: "one core" on a machine other jobs share (wall time measured the
         * neighbours' load, 1.5-11 MB/s for the same build) */
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        while (r >= 0 && elapsed < seconds) {
                ids.n = 0;
                r = encode_into(t, &w, text, len, 0, NULL, 0, &ids, NULL, 0);
                bytes += len;
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
                elapsed = (double) (b.tv_sec - a.tv_sec) + (double) (b.tv_nsec - a.tv_nsec) * 1e-9;
        }
        work_done(&w);
        tokenizer_ids_done(&ids);
        if (r < 0)
                return r;
        *ret_bytes_per_s = elapsed > 0 ? (double) bytes / elapsed : 0;
        return 0;
}
