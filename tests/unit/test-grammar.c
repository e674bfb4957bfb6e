/* SPDX-License-Identifier: MIT */
/* Constrained decoding (engine/grammar.h): the schema compiler's errors, the matcher's accept /
 * reject on byte strings, the token mask against a brute force over a hand-made vocabulary with
 * multi-byte and byte-fallback pieces, random walks that must end in valid JSON within the
 * budget, and the forced tool call's token sequence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar.h"
#include "chat/tokenizer.h"
#include "common/json.h"
#include "common/log.h"

/* ---- a small vocabulary ---------------------------------------------------------------------- */

static const char *const SPECIALS[] = {
        "<unk>", "<_start>", "<_end>", "<_pad>", "<_user>", "<_bot>", "<_system>", "<think>",
        "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
};
#define ID_END 2
#define ID_TOOL_CALL 9
#define ID_END_TOOL_CALL 10
#define FIRST_BYTE 13
#define BYTE_ID(b) (FIRST_BYTE + (b))

/* text pieces (after the 256 byte pieces); "▁" is the space */
static const char *const TEXT[] = {
        "\xe2\x96\x81", "{", "}", "[", "]", ":", ",", "\"", "\\", "n", "u", "0", "1", "2", "9",
        "-", ".", "e", "a", "b", "c", "t", "r", "f", "l", "s", "x", "y", "z",
        "{\"", "\"}", "\",\"", "\":", "\":\"", "true", "false", "null", "\xe2\x96\x81\"",
        "\xe2\x96\x81{", "abc", "name", "\"name\"", "12", "0.5", "e+", "\\n", "\\u00e9",
        "\xc3\xa9",               /* é */
        "\xe4\xb8\xad\xe6\x96\x87", /* 中文 */
        "\xe4\xb8\xad\"",          /* 中" */
        "caf\xc3\xa9",             /* café */
        "\xe2\x96\x81\xe2\x96\x81", "\n", "\t", "age", "\"age\"", "tags", "\"]", "]}", "\"],",
        "<reserve0>",
        /* the native tool call's markup: user-defined pieces, as in the release's vocabulary */
        "<param_key>", "</param_key>", "<param_value>", "</param_value>", "<", "get", "_weather", "city",
        "Paris", "days",
};

static bool user_defined(const char *piece) {
        static const char *const UD[] = { "<reserve0>", "<param_key>", "</param_key>", "<param_value>",
                                          "</param_value>" };
        for (size_t i = 0; i < ELEMENTSOF(UD); i++)
                if (strcmp(piece, UD[i]) == 0)
                        return true;
        return false;
}

static struct tokenizer *tok;
static struct grammar_vocab *voc;
static uint32_t NV;
static int32_t END_IDS[1] = { ID_END };

static int setup(void **state) {
        size_t n = ELEMENTSOF(SPECIALS) + 256 + ELEMENTSOF(TEXT);
        char **pieces = calloc(n, sizeof *pieces);
        size_t *lens = calloc(n, sizeof *lens);
        float *scores = calloc(n, sizeof *scores);
        int32_t *types = calloc(n, sizeof *types);
        size_t k = 0;
        log_set_max_level(LOG_CRIT);
        for (size_t i = 0; i < ELEMENTSOF(SPECIALS); i++, k++) {
                pieces[k] = strdup(SPECIALS[i]);
                types[k] = i == 0 ? TOKENIZER_PIECE_UNKNOWN : TOKENIZER_PIECE_CONTROL;
        }
        for (unsigned b = 0; b < 256; b++, k++) {
                assert_true(asprintf(&pieces[k], "<0x%02X>", b) > 0);
                types[k] = TOKENIZER_PIECE_BYTE;
        }
        for (size_t i = 0; i < ELEMENTSOF(TEXT); i++, k++) {
                pieces[k] = strdup(TEXT[i]);
                types[k] = user_defined(TEXT[i]) ? TOKENIZER_PIECE_USER_DEFINED : TOKENIZER_PIECE_NORMAL;
                scores[k] = -(float) i;
        }
        for (size_t i = 0; i < n; i++)
                lens[i] = strlen(pieces[i]);
        struct tokenizer_vocab v = { .n = n, .pieces = (const char *const *) pieces, .piece_lens = lens,
                                     .scores = scores, .types = types, .unk_id = 0, .bos_id = 1,
                                     .eos_id = ID_END, .pad_id = 3, .add_space_prefix = true };
        int r = tokenizer_new(&v, &tok);
        for (size_t i = 0; i < n; i++)
                free(pieces[i]);
        free(pieces);
        free(lens);
        free(scores);
        free(types);
        if (r < 0)
                return r;
        NV = (uint32_t) n;
        return grammar_vocab_new(tok, &voc);
}

static int teardown(void **state) {
        grammar_vocab_free(voc);
        tokenizer_free(tok);
        return 0;
}

static int32_t id_of(const char *text) {
        int32_t id = tokenizer_find_piece(tok, text, strlen(text));
        assert_true(id >= 0);
        return id;
}

static struct grammar *schema(const char *json) {
        struct grammar *g = NULL;
        char err[256];
        int r = grammar_compile_schema(json, strlen(json), &g, err, sizeof err);
        if (r < 0)
                fail_msg("schema %s: %s", json, err);
        return g;
}

/* The schema refuses with a message holding `want`. */
static void refused(const char *json, const char *want) {
        struct grammar *g = NULL;
        char err[256];
        int r = grammar_compile_schema(json, strlen(json), &g, err, sizeof err);
        if (r != -EINVAL || !strstr(err, want))
                fail_msg("schema %s: r=%d err '%s', '%s' expected", json, r, err, want);
        assert_null(g);
}

/* Feed text to a fresh matcher (a forced call's after its `<tool_call>`): 0 or -EINVAL;
 * *can_end: the output can end there (a call's: `</tool_call>` may follow, then it can). */
static int feed_text(const struct grammar *g, bool call, const char *text, bool *can_end) {
        struct grammar_matcher *m = NULL;
        assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &m), 0);
        if (call)
                assert_int_equal(grammar_matcher_accept(m, ID_TOOL_CALL), 0);
        int r = grammar_matcher_accept_bytes(m, text, strlen(text));
        *can_end = grammar_matcher_can_end(m);
        if (call) {
                assert_false(*can_end); /* not before `</tool_call>` */
                *can_end = r == 0 && grammar_matcher_accept(m, ID_END_TOOL_CALL) == 0;
                if (*can_end)
                        assert_true(grammar_matcher_can_end(m));
        }
        grammar_matcher_free(m);
        return r;
}

enum want { COMPLETE, PREFIX, REFUSED };

static void expect(const struct grammar *g, bool call, const char *text, enum want want) {
        static const char *const what[] = { "a complete value", "an unfinished prefix", "refused" };
        bool e;
        int r = feed_text(g, call, text, &e);
        if (want == REFUSED ? r != -EINVAL : r < 0 || e != (want == COMPLETE))
                fail_msg("'%s' should be %s", text, what[want]);
}

#define ok_complete(g, text) expect(g, false, text, COMPLETE)
#define ok_prefix(g, text) expect(g, false, text, PREFIX)
#define rejected(g, text) expect(g, false, text, REFUSED)
#define call_complete(g, text) expect(g, true, text, COMPLETE)
#define call_prefix(g, text) expect(g, true, text, PREFIX)
#define call_rejected(g, text) expect(g, true, text, REFUSED)

/* ---- schema compiler ------------------------------------------------------------------------- */

static void test_compile_errors(void **state) {
        refused("{\"type\": \"string\", \"minLength\": 3}", "keyword 'minLength' is not supported");
        /* a bound the generator does not enforce is refused; zod's .int() safe-integer range,
         * which every generated integer (at most 15 digits) meets, is taken */
        refused("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"minimum\":0}}}",
                "properties.age: keyword 'minimum' is supported only on an integer and only as loose as");
        refused("{\"type\":\"number\",\"maximum\":9007199254740991}", "keyword 'maximum' is supported only");
        {
                struct grammar *g = schema("{\"type\":\"integer\",\"minimum\":-9007199254740991,"
                                           "\"maximum\":9007199254740991}");
                ok_complete(g, "-999999999999999");
                rejected(g, "9999999999999999"); /* a 16th digit could leave the range */
                grammar_free(g);
        }
        refused("{\"oneOf\": [{\"type\":\"string\"}]}", "keyword 'oneOf'");
        refused("{\"type\": \"strin\"}", "type 'strin' is not one of");
        refused("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}",
                "required names 'b', which properties does not list");
        refused("{\"enum\": []}", "enum must be a non-empty array");
        refused("{\"$ref\": \"#/$defs/missing\"}", "no such definition");
        refused("{\"$ref\": \"http://x/y\"}", "only \"#\"");
        refused("not json", "not valid JSON");
        refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems 3 is larger than maxItems 2");
        refused("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
                "no finite JSON value");
        refused("false", "allows no value");
        refused("{\"anyOf\":[{\"$ref\":\"#\"},{\"anyOf\":[{\"$ref\":\"#\"}]}]}",
                "every alternative refers back to the anyOf");
        refused("{\"enum\": [1, 1e999]}", "enum holds a number out of the double range");
        refused("{\"items\": [{}, {}]}", "tuple arrays");
        /* a format is not enforced: refused by name (GRAMMAR_LENIENT ignores it: test_lenient) */
        refused("{\"type\":\"object\",\"properties\":{\"at\":{\"type\":\"string\",\"format\":\"date-time\"}}}",
                "properties.at: keyword 'format' (\"date-time\") is not enforced");
        /* annotations are ignored */
        struct grammar *g = schema("{\"type\":\"string\",\"description\":\"d\","
                                   "\"title\":\"t\",\"x-extra\":1}");
        grammar_free(g);
}

/* GRAMMAR_LENIENT (Constraint.lenient): the keywords refused above are ignored, the structure
 * kept: a schema written for validation (an MCP tool's, a non-strict OpenAI one) still constrains
 * the answer's shape; without the flag the same schema is refused as before. */
static void test_lenient(void **state) {
        const char *s = "{\"type\":\"object\",\"properties\":{"
                        "\"path\":{\"type\":\"string\",\"pattern\":\"^/\",\"minLength\":1,\"format\":\"uri\"},"
                        "\"n\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9},"
                        "\"mode\":{\"oneOf\":[{\"const\":\"r\"},{\"const\":\"w\"}]},"
                        "\"both\":{\"allOf\":[{\"type\":\"boolean\"},{\"not\":{\"const\":false}}]}},"
                        "\"required\":[\"path\",\"n\"],\"additionalProperties\":false}";
        struct grammar *g = NULL;
        char err[512];

        (void) state;
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_JSON_SCHEMA, s, NULL, NULL, NULL, 0, &g, err,
                                                          sizeof err), -EINVAL);
        assert_non_null(strstr(err, "keyword 'pattern' is not supported"));
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_JSON_SCHEMA, s, NULL, NULL, NULL,
                                                          GRAMMAR_LENIENT, &g, err, sizeof err), 0);
        ok_complete(g, "{\"path\":\"x\",\"n\":42,\"mode\":\"w\",\"both\":true}"); /* bounds not enforced */
        rejected(g, "{\"path\":3");                 /* the structure is */
        rejected(g, "{\"path\":\"x\",\"n\":1,\"mode\":\"x\""); /* oneOf read as anyOf */
        rejected(g, "{\"path\":\"x\",\"n\":1,\"both\":1");       /* allOf's first schema */
        rejected(g, "{\"path\":\"x\"}");           /* n is required */
        rejected(g, "{\"path\":\"x\",\"n\":1,\"z\":1"); /* no other property */
        grammar_free(g);
        /* beside a structure of their own, allOf (if/then) and oneOf (required alternatives) are
         * rules on it, ignored: the object stays an object */
        const char *s2 = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"integer\"}},"
                         "\"required\":[\"a\"],\"allOf\":[{\"if\":{\"required\":[\"b\"]},\"then\":{}}],"
                         "\"oneOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}";
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_JSON_SCHEMA, s2, NULL, NULL, NULL,
                                                          GRAMMAR_LENIENT, &g, err, sizeof err), 0);
        ok_complete(g, "{\"a\":\"x\",\"b\":2}");
        rejected(g, "0");
        rejected(g, "{\"b\":2}");
        grammar_free(g);
}

/* ---- matcher on bytes ------------------------------------------------------------------------ */

static void test_matcher_object(void **state) {
        struct grammar *g = schema(
                "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",1]},"
                "\"maxItems\":2}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}");
        ok_complete(g, "{\"name\":\"x\",\"age\":3}");
        ok_complete(g, " {\n  \"age\": -12 ,\"name\" : \"caf\xc3\xa9 \\n \\u00e9\", \"tags\":[\"a\",1]}");
        ok_complete(g, "{\"tags\":[],\"age\":0,\"name\":\"\"}");
        ok_prefix(g, "{\"name\":\"x\"");
        ok_prefix(g, "{\"na");
        rejected(g, "{\"name\":\"x\"}");          /* age is required */
        rejected(g, "{\"nam\":");                 /* not a property */
        rejected(g, "{\"name\":\"x\",\"name\"");  /* twice */
        rejected(g, "{\"age\":1.5");              /* integer */
        rejected(g, "{\"age\":01");               /* leading zero */
        rejected(g, "{\"tags\":[\"c\"");          /* enum */
        rejected(g, "{\"tags\":[\"a\",\"b\",");   /* maxItems */
        rejected(g, "{\"name\":\"\\x\"");         /* bad escape */
        rejected(g, "{\"name\":\"\\ud800\"");     /* surrogate escape */
        rejected(g, "{\"name\":\"\\u0000\"");     /* NUL escape */
        rejected(g, "{\"name\":\"a\nb\"");        /* control byte */
        rejected(g, "{\"name\":\"\xc3\x28\"");    /* bad UTF-8 */
        rejected(g, "{\"name\":\"\xed\xa0\x80\""); /* UTF-8 surrogate */
        rejected(g, "{\"name\":\"x\",\"age\":1} ");/* nothing after the value */
        rejected(g, "{,");
        rejected(g, "{\"name\":\"x\",}");
        rejected(g, "{                         \"name\""); /* more than GRAMMAR_MAX_WS spaces */
        grammar_free(g);
}

static void test_matcher_values(void **state) {
        struct grammar *g = schema("{\"type\":\"number\"}");
        ok_complete(g, "0");
        ok_complete(g, "-1.25e+3");
        ok_complete(g, "12");
        ok_prefix(g, "-");
        ok_prefix(g, "1.");
        ok_prefix(g, "1e");
        rejected(g, "1.e5");
        rejected(g, "+1");
        rejected(g, "12345678901234567"); /* 17 integer digits */
        grammar_free(g);

        g = schema("{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"},"
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}},\"required\":[\"a\"]},"
                   "{\"type\":\"object\",\"properties\":{\"b\":{\"const\":\"x\"}},\"required\":[\"b\"]}]}");
        ok_complete(g, "null");
        ok_complete(g, "\"s\"");
        ok_complete(g, "{\"a\":true}");
        ok_complete(g, "{\"b\":\"x\"}");
        rejected(g, "{\"a\":\"x\"");
        rejected(g, "{\"b\":true");
        rejected(g, "nul1");
        grammar_free(g);

        g = schema("{\"type\":[\"integer\",\"null\"],\"nullable\":true}");
        ok_complete(g, "null");
        ok_complete(g, "7");
        rejected(g, "7.5");
        grammar_free(g);

        /* enum with a prefix of another value, of several JSON types */
        g = schema("{\"enum\":[1,12,\"ab\",{\"k\":[1]},true]}");
        ok_complete(g, "1");
        ok_complete(g, "12");
        ok_complete(g, "{\"k\":[1]}");
        rejected(g, "123");
        rejected(g, "{\"k\": [1]}"); /* enum values in compact form */
        grammar_free(g);

        /* recursion through $defs */
        g = schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                   "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
                   "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}");
        ok_complete(g, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}");
        rejected(g, "{\"v\":1,\"kids\":[{\"w\"");
        grammar_free(g);

        /* an anyOf that is its own branch */
        g = schema("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"string\"}]}");
        ok_complete(g, "\"ab\"");
        rejected(g, "1");
        grammar_free(g);

        /* several alternatives back to the root and nested anyOfs: each value is followed once
         * (three of them used to fork 3^16 ways at the first byte, seconds a byte) */
        g = schema("{\"anyOf\":[{\"$ref\":\"#\"},{\"$ref\":\"#\"},{\"anyOf\":[{\"$ref\":\"#\"},"
                   "{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}]},{\"type\":[\"integer\",\"null\"]}]}");
        ok_complete(g, "[[1,null],[],[[[2]]]]");
        ok_complete(g, "17");
        rejected(g, "\"s\"");
        rejected(g, "[1,\"s\"");
        grammar_free(g);

        /* nested objects, each with its own keys */
        g = schema("{\"type\":\"object\",\"properties\":{\"outer\":{\"type\":\"object\",\"properties\":"
                   "{\"x\":{\"type\":\"number\"},\"y\":{\"type\":\"number\"}},\"required\":[\"x\",\"y\"]},"
                   "\"z\":{\"type\":\"boolean\"}},\"required\":[\"outer\",\"z\"]}");
        ok_complete(g, "{\"z\":true,\"outer\":{\"y\":1,\"x\":2}}");
        rejected(g, "{\"outer\":{\"z\"");
        rejected(g, "{\"x\"");
        rejected(g, "{\"outer\":{\"x\":1}");
        grammar_free(g);

        /* {} schema and additionalProperties: free keys */
        g = schema("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}");
        ok_complete(g, "{\"any key\":1,\"other\":2}");
        rejected(g, "{\"k\":\"v\"");
        grammar_free(g);

        struct grammar *o = NULL;
        assert_int_equal(grammar_compile_json_object(&o), 0);
        ok_complete(o, "{\"a\":[1,{\"b\":null},\"x\",true,-0.5e3],\"c\":{}}");
        rejected(o, "[1]");
        rejected(o, "\"x\"");
        grammar_free(o);
}

/* ---- token mask ------------------------------------------------------------------------------ */

/* The mask against a brute force: a token is allowed iff a fresh matcher, replayed through the
 * history, accepts it. */
static void check_mask(const struct grammar *g, const int32_t *hist, size_t n_hist, uint32_t budget,
                       uint64_t *mask) {
        struct grammar_matcher *m = NULL;
        assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &m), 0);
        for (size_t i = 0; i < n_hist; i++)
                assert_int_equal(grammar_matcher_accept(m, hist[i]), 0);
        int n = grammar_matcher_mask(m, budget, mask);
        int brute = 0;
        for (uint32_t id = 0; id < NV; id++) {
                struct grammar_matcher *x = NULL;
                assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &x), 0);
                for (size_t i = 0; i < n_hist; i++)
                        assert_int_equal(grammar_matcher_accept(x, hist[i]), 0);
                bool ok = grammar_matcher_accept(x, (int32_t) id) == 0;
                grammar_matcher_free(x);
                brute += ok;
                if (ok != grammar_mask_test(mask, (int32_t) id)) {
                        size_t l;
                        fail_msg("token %u '%s' after %zu tokens: mask %d, matcher %d", id,
                                 tokenizer_piece(tok, (int32_t) id, &l), n_hist,
                                 grammar_mask_test(mask, (int32_t) id), ok);
                }
        }
        assert_int_equal(n, brute);
        grammar_matcher_free(m);
}

static void test_mask_multibyte(void **state) {
        struct grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},"
                                   "\"required\":[\"name\"]}");
        uint64_t *mask = calloc(DIV_ROUND_UP(NV, 64), 8);
        int32_t h[16] = { 0 };
        size_t n = 0;
        check_mask(g, h, n, 1000, mask);
        assert_true(grammar_mask_test(mask, id_of("{\"")));
        assert_true(grammar_mask_test(mask, id_of("\xe2\x96\x81{")));
        assert_false(grammar_mask_test(mask, id_of("}")));  /* name is required */
        assert_false(grammar_mask_test(mask, ID_END));
        h[n++] = id_of("{\"");
        check_mask(g, h, n, 1000, mask);
        assert_true(grammar_mask_test(mask, id_of("name")));
        assert_false(grammar_mask_test(mask, id_of("age")));
        h[n++] = id_of("name");
        h[n++] = id_of("\":\"");
        /* in the string: whole characters, the byte pieces that start one, quote-closing pieces */
        check_mask(g, h, n, 1000, mask);
        assert_true(grammar_mask_test(mask, id_of("\xc3\xa9")));
        assert_true(grammar_mask_test(mask, id_of("\xe4\xb8\xad\xe6\x96\x87")));
        assert_true(grammar_mask_test(mask, id_of("\xe4\xb8\xad\"")));
        assert_true(grammar_mask_test(mask, id_of("\"}")));
        assert_true(grammar_mask_test(mask, BYTE_ID(0xc3)));
        assert_true(grammar_mask_test(mask, BYTE_ID('a')));
        assert_false(grammar_mask_test(mask, BYTE_ID(0xa9))); /* a lone continuation byte */
        assert_false(grammar_mask_test(mask, BYTE_ID(0xff)));
        assert_false(grammar_mask_test(mask, BYTE_ID('\n')));
        assert_false(grammar_mask_test(mask, id_of("\n")));
        assert_false(grammar_mask_test(mask, ID_END));
        assert_false(grammar_mask_test(mask, ID_TOOL_CALL)); /* specials are never text */
        assert_true(grammar_mask_test(mask, id_of("<reserve0>"))); /* user-defined: its text */
        /* half a character from a byte piece: only its continuation */
        h[n++] = BYTE_ID(0xe4);
        check_mask(g, h, n, 1000, mask);
        assert_true(grammar_mask_test(mask, BYTE_ID(0xb8)));
        assert_false(grammar_mask_test(mask, BYTE_ID('a')));
        assert_false(grammar_mask_test(mask, id_of("\xc3\xa9")));
        assert_false(grammar_mask_test(mask, id_of("\"}")));
        h[n++] = BYTE_ID(0xb8);
        h[n++] = BYTE_ID(0xad);
        check_mask(g, h, n, 1000, mask);
        assert_true(grammar_mask_test(mask, id_of("\"}")));
        h[n++] = id_of("\"}");
        check_mask(g, h, n, 1000, mask);
        assert_true(grammar_mask_test(mask, ID_END));
        free(mask);
        grammar_free(g);
}

static void test_mask_values(void **state) {
        /* escapes, numbers, enums: every state of a few texts against the brute force */
        static const char *const schemas[] = {
                ("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"number\"},"
                "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"abc\",12]}}},\"required\":[\"age\"]}"),
                "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"},{\"type\":\"null\"}]}",
        };
        static const char *const texts[][16] = {
                { "{\"", "name", "\":\"", "\\n", "\\u00e9", "\\", "u", "0", "0", "e", "9", "\",\"", "age", "\":",
                  "-", NULL },
                { "12", NULL },
        };
        uint64_t *mask = calloc(DIV_ROUND_UP(NV, 64), 8);
        for (size_t s = 0; s < ELEMENTSOF(schemas); s++) {
                struct grammar *g = schema(schemas[s]);
                int32_t h[16];
                size_t n = 0;
                check_mask(g, h, 0, 1000, mask);
                for (; texts[s][n]; n++) {
                        h[n] = id_of(texts[s][n]);
                        check_mask(g, h, n + 1, 1000, mask);
                }
                grammar_free(g);
        }
        free(mask);
}

/* Random walks: pick any allowed token (seeded), with a budget; the output must be complete,
 * parse as JSON and end with the end token within the budget. */
static uint64_t rng = 88172645463325252ull;
static uint64_t xorshift(void) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

static char *random_walk(const struct grammar *g, uint32_t budget, bool *ended) {
        struct grammar_matcher *m = NULL;
        uint64_t *mask = calloc(DIV_ROUND_UP(NV, 64), 8);
        char *out = calloc(1, 4096);
        size_t len = 0;
        assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &m), 0);
        *ended = false;
        for (uint32_t left = budget; left > 0 && !*ended; left--) {
                int n = grammar_matcher_mask(m, left, mask);
                assert_true(n > 0);
                /* prefer long tokens a little so the walks also leave strings */
                uint32_t pick = (uint32_t) (xorshift() % (uint64_t) n), k = 0;
                int32_t id = -1;
                for (uint32_t i = 0; i < NV; i++)
                        if (grammar_mask_test(mask, (int32_t) i) && k++ == pick) {
                                id = (int32_t) i;
                                break;
                        }
                assert_true(id >= 0);
                assert_int_equal(grammar_matcher_accept(m, id), 0);
                if (id == ID_END) {
                        *ended = true;
                        break;
                }
                size_t l;
                const char *p = tokenizer_piece(tok, id, &l);
                if (tokenizer_piece_type(tok, id) == TOKENIZER_PIECE_BYTE) {
                        unsigned b;
                        sscanf(p, "<0x%02X>", &b);
                        out[len++] = (char) b;
                } else if (id == ID_TOOL_CALL || id == ID_END_TOOL_CALL) {
                        memcpy(out + len, p, l);
                        len += l;
                } else
                        for (size_t i = 0; i < l;) {
                                if (i + 3 <= l && memcmp(p + i, "\xe2\x96\x81", 3) == 0) {
                                        out[len++] = ' ';
                                        i += 3;
                                } else
                                        out[len++] = p[i++];
                        }
                assert_true(len < 4000);
        }
        grammar_matcher_free(m);
        free(mask);
        return out;
}

static void test_random_walks_close(void **state) {
        static const char *const schemas[] = {
                ("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
                "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1}},"
                "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}"),
                "{\"type\":\"object\"}",
                ("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"}},\"required\":[\"a\"]},"
                "{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\",null]}}]}"),
                /* an anyOf that is its own branch: the shortest completion must not follow it */
                "{\"anyOf\":[{\"$ref\":\"#\"},{\"const\":{\"k\":\"vvvvvvvvvvvvvvvvvvvvvv\"}}]}",
        };
        for (size_t s = 0; s < ELEMENTSOF(schemas); s++) {
                struct grammar *g = schema(schemas[s]);
                for (int rep = 0; rep < 20; rep++) {
                        uint32_t budget = 60 + (uint32_t) (xorshift() % 200);
                        bool ended;
                        char *out = random_walk(g, budget, &ended);
                        if (!ended)
                                fail_msg("schema %zu: no end within %u tokens: %s", s, budget, out);
                        struct json_value *v = NULL;
                        if (json_parse(out, strlen(out), "walk", &v, NULL, 0) < 0)
                                fail_msg("schema %zu: not JSON: %s", s, out);
                        json_free(v);
                        free(out);
                }
                grammar_free(g);
        }
}

static void test_depth_cap(void **state) {
        /* optional recursion: the 32nd level cannot open another object, so no dead end */
        struct grammar *g = schema("{\"type\":\"object\",\"properties\":{\"c\":{\"$ref\":\"#\"}},"
                                   "\"additionalProperties\":false}");
        char buf[512] = "";
        for (int i = 0; i < GRAMMAR_MAX_DEPTH - 1; i++)
                strcat(buf, "{\"c\":");
        strcat(buf, "{");
        ok_prefix(g, buf);
        strcat(buf, "\"");
        rejected(g, buf); /* a key would need a 33rd level */
        buf[strlen(buf) - 1] = '}';
        ok_prefix(g, buf);
        for (int rep = 0; rep < 10; rep++) {
                bool ended;
                char *out = random_walk(g, 200, &ended);
                assert_true(ended);
                free(out);
        }
        grammar_free(g);
        /* a schema whose every value is deeper than the cap is refused */
        char big[4096] = "";
        for (int i = 0; i < GRAMMAR_MAX_DEPTH; i++)
                strcat(big, "{\"type\":\"object\",\"required\":[\"a\"],\"properties\":{\"a\":");
        strcat(big, "{\"type\":\"integer\"}");
        for (int i = 0; i < GRAMMAR_MAX_DEPTH; i++)
                strcat(big, "}}");
        refused(big, "nests deeper than 32 levels");
}

static const char *const TOOLS =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
        "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
        "\"loud\":{\"type\":[\"boolean\",\"null\"]},\"note\":{\"type\":[\"string\",\"null\"]},"
        "\"at\":{\"type\":\"object\",\"properties\":{\"lat\":{\"type\":\"number\"}},\"required\":[\"lat\"]}},"
        "\"required\":[\"city\",\"days\"]}}},"
        "{\"name\":\"noop\"},"
        "{\"name\":\"get\",\"parameters\":{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"}}}},"
        "{\"name\":\"free\",\"parameters\":{\"type\":\"object\"}}]";

static struct grammar *tool(const char *tools, const char *name) {
        struct grammar *g = NULL;
        char err[256];
        if (grammar_compile_tool(tools, name, tok, &g, err, sizeof err) < 0)
                fail_msg("tools %s: %s", tools, err);
        return g;
}

static void tool_refused(const char *tools, const char *name, const char *want) {
        struct grammar *g = NULL;
        char err[256];
        int r = grammar_compile_tool(tools, name, tok, &g, err, sizeof err);
        if (r != -EINVAL || !strstr(err, want))
                fail_msg("tools %s: r=%d err '%s', '%s' expected", tools, r, err, want);
        assert_null(g);
}

#define K(k) "<param_key>" k "</param_key><param_value>"
#define V "</param_value>"

static void test_tool_call_errors(void **state) {
        tool_refused(TOOLS, "nope", "tool 'nope' is not among the request's tools (get_weather, noop, get, free)");
        tool_refused(NULL, NULL, "no tools");
        tool_refused("[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"pattern\":\"x\"}}}}]",
                     NULL, "tools[0].parameters.properties.a: keyword 'pattern' is not supported");
        /* what the native syntax cannot carry, by name */
        tool_refused("[{\"name\":\"a<b\"}]", NULL,
                     "tools[0]: the name 'a<b' cannot be written in the model's tool-call syntax: it holds '<'");
        tool_refused("[{\"name\":\"{x\"}]", NULL, "it starts with '{'");
        tool_refused("[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a</param_key>\":{}}}}]",
                     NULL, "tools[0].parameters: property \"a</param_key>\" cannot be written");
        tool_refused("[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[\"x</param_value>\"]}}}}]",
                     NULL, "tool 'f' parameter 'a': the value \"x</param_value>\" cannot be written");
        tool_refused("[{\"name\":\"f\"},{\"name\":\"f\"}]", NULL, "names 'f' twice");
}

/* The forced call in the model's own syntax: NAME, then <param_key>K</param_key><param_value>V
 * </param_value> pairs, strings raw, other values JSON. */
static void test_tool_call_native(void **state) {
        struct grammar *g = tool(TOOLS, "get_weather");
        call_complete(g, "get_weather" K("city") "Paris" V K("days") "3" V);
        call_complete(g, " get_weather" K("days") " -2" V K("city") "" V); /* the decoder's space before */
        /* a raw string holds anything but its end marker: '<', markup-like text, quotes, lines */
        call_complete(g, "get_weather" K("city") "a<b </param_valu <param_key>\"x\"\n\\" V K("days") "0" V);
        call_complete(g, "get_weather" K("city") "caf\xc3\xa9" V K("days") "1" V K("unit") "celsius" V
                      K("loud") "null" V K("note") "null" V K("at") "{\"lat\": 1.5}" V);
        call_complete(g, "get_weather" K("note") "12" V K("loud") "true" V K("city") "x" V K("days") "1" V);
        call_prefix(g, "get_weather" K("city") "Paris" V);            /* days is required */
        call_prefix(g, "get_weather" K("city") "Paris</param_value");
        call_prefix(g, "get_weath");
        call_rejected(g, "get_weather" K("town"));                     /* not a property */
        call_rejected(g, "get_weather" K("city") "x" V K("city"));    /* twice */
        call_rejected(g, "get_weather" K("days") "x");                 /* an integer */
        call_rejected(g, "get_weather" K("days") "1.5");
        call_rejected(g, "get_weather" K("days") "1 " V);              /* nothing after the value */
        call_rejected(g, "get_weather" K("unit") "kelvin");            /* the enum, literally */
        call_rejected(g, "get_weather" K("unit") " celsius");
        call_rejected(g, "get_weather" K("unit") "celsius2");
        call_rejected(g, "get_weather" K("loud") "yes");
        call_rejected(g, "get_weather" K("at") "{\"lon\"");           /* a JSON value's schema */
        call_rejected(g, "get_weather" K("at") "{}" V);                /* lat is required */
        call_rejected(g, "get_weather" K("city") "\xc3\x28");          /* bad UTF-8 */
        call_rejected(g, "noop");                                      /* not the tool asked for */
        call_rejected(g, "{\"name\"");                                 /* the JSON form is not taken */
        call_rejected(g, "get_weather " K("city"));                    /* no space in the markup */
        call_rejected(g, "get_weather" K("city") "x" V " ");
        grammar_free(g);

        /* any tool: a name of the set, one a prefix of another */
        g = tool(TOOLS, NULL);
        call_complete(g, "noop");
        call_complete(g, "get");                                       /* its q is optional */
        call_complete(g, "get" K("q") "x" V);
        call_prefix(g, "get_weather" K("city") "x" V);
        call_rejected(g, "got");
        call_rejected(g, "noop" K("x"));                               /* no parameters */
        /* free keys: raw, non-empty, without '<'; values any text */
        call_complete(g, "free" K("any key") "v" V K("n") "1" V);
        call_rejected(g, "free<param_key></param_key>");
        call_rejected(g, "free<param_key>a<b");
        grammar_free(g);
        /* parameters `true` (any value): any keys too; additionalProperties false: none */
        g = tool("[{\"name\":\"t\",\"parameters\":true},{\"name\":\"c\",\"parameters\":{\"type\":\"object\","
                 "\"additionalProperties\":false}}]", NULL);
        call_complete(g, "t" K("k") "[1]" V);
        call_complete(g, "c");
        call_rejected(g, "c<");
        grammar_free(g);
}

/* The token sequence: `<tool_call>`, the call in any mix of pieces (the markup's user-defined ones,
 * byte pieces across it), `</tool_call>` once complete, then the end. */
static void test_tool_call_tokens(void **state) {
        struct grammar *g = tool(TOOLS, "get_weather");
        struct grammar_matcher *m = NULL;
        uint64_t *mask = calloc(DIV_ROUND_UP(NV, 64), 8);
        assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &m), 0);
        assert_int_equal(grammar_matcher_mask(m, 100, mask), 1);
        assert_true(grammar_mask_test(mask, ID_TOOL_CALL));
        assert_int_equal(grammar_matcher_accept(m, id_of("{\"")), -EINVAL);
        assert_int_equal(grammar_matcher_accept(m, ID_TOOL_CALL), 0);
        static const char *const seq[] = { "get", "_weather", "<param_key>", "city", "</param_key>", "<param_value>",
                                           "Paris", "<", "b", "</param_value>", "<", "param_key>", NULL };
        for (size_t i = 0; seq[i]; i++) {
                const char *p = seq[i];
                int32_t id = strcmp(p, "param_key>") == 0 ? -1 : id_of(p);
                if (id < 0) /* no such piece: byte pieces */
                        for (; *p; p++)
                                assert_int_equal(grammar_matcher_accept(m, BYTE_ID((uint8_t) *p)), 0);
                else
                        assert_int_equal(grammar_matcher_accept(m, id), 0);
        }
        assert_int_equal(grammar_matcher_accept_bytes(m, "days</param_key><param_value>", 29), 0);
        assert_int_equal(grammar_matcher_accept(m, ID_END_TOOL_CALL), -EINVAL);
        assert_int_equal(grammar_matcher_accept(m, id_of("12")), 0);
        assert_int_equal(grammar_matcher_accept(m, id_of("</param_value>")), 0);
        /* `</tool_call>`, or another key: its markup piece, "<" and the byte piece of '<' */
        assert_int_equal(grammar_matcher_mask(m, 1000, mask), 4);
        assert_true(grammar_mask_test(mask, ID_END_TOOL_CALL));
        assert_true(grammar_mask_test(mask, id_of("<param_key>")));
        assert_true(grammar_mask_test(mask, BYTE_ID('<')));
        /* near the budget, only the close */
        assert_int_equal(grammar_matcher_mask(m, 3, mask), 1);
        assert_true(grammar_mask_test(mask, ID_END_TOOL_CALL));
        assert_int_equal(grammar_matcher_accept(m, ID_END), -EINVAL);
        assert_int_equal(grammar_matcher_accept(m, ID_END_TOOL_CALL), 0);
        assert_int_equal(grammar_matcher_mask(m, 100, mask), 1);
        assert_int_equal(grammar_matcher_accept(m, ID_END), 0);
        assert_true(grammar_matcher_ended(m));
        grammar_matcher_free(m);

        /* the mask against the brute force along a call, in the states of every kind of value */
        static const char *const hist[] = { "get", "_weather", "<param_key>", "city", "</param_key>",
                                            "<param_value>", "Paris", "<", "</param_value>", "<param_key>",
                                            "days", "</param_key>", "<param_value>", "1", "</param_value>",
                                            NULL };
        int32_t h[24] = { ID_TOOL_CALL };
        size_t n = 1;
        check_mask(g, h, n, 1000, mask);
        for (; hist[n - 1]; n++) {
                h[n] = id_of(hist[n - 1]);
                check_mask(g, h, n + 1, 1000, mask);
        }
        grammar_free(g);
        /* any tool: a free key (raw text with a minimum), a value's marker begun twice over */
        g = tool(TOOLS, NULL);
        static const char *const free_hist[] = { "f", "r", "e", "e", "<param_key>", "a", "</param_key>",
                                                 "<param_value>", "x", "<", "/", "p", "<", "</param_value>", NULL };
        for (n = 1; free_hist[n - 1]; n++) {
                /* single characters as byte pieces, but for "<" */
                const char *p = free_hist[n - 1];
                h[n] = strlen(p) == 1 && p[0] != '<' ? BYTE_ID((uint8_t) p[0]) : id_of(p);
                check_mask(g, h, n + 1, 1000, mask);
        }
        free(mask);
        grammar_free(g);
}

/* a walk is free until the budget is close in tokens: a free key or value may take a few hundred
 * byte pieces */
#define KEY_MAX 512
#define VAL_MAX 1024

/* A native call as the output parser reads it: NAME, then key / value pairs; checks the name is
 * one of names[] and returns the number of pairs, -1 if it does not parse. */
static int parse_native(const char *s, const char *const *names, size_t n_names, char keys[][KEY_MAX], char vals[][VAL_MAX]) {
        const char *k = strstr(s, "<param_key>");
        size_t nl = k ? (size_t) (k - s) : strlen(s);
        bool named = false;
        while (nl && strchr(" \t\n\r", *s))
                s++, nl--;
        for (size_t i = 0; i < n_names; i++)
                named |= strlen(names[i]) == nl && strncmp(s, names[i], nl) == 0;
        if (!named)
                return -1;
        int n = 0;
        for (s += nl; *s; n++) {
                const char *ke = strstr(s, "</param_key><param_value>"), *ve = ke ? strstr(ke, V) : NULL;
                if (strncmp(s, "<param_key>", 11) != 0 || !ve || ke - s - 11 >= KEY_MAX || ve - ke - 25 >= VAL_MAX)
                        return -1;
                snprintf(keys[n], KEY_MAX, "%.*s", (int) (ke - s - 11), s + 11);
                snprintf(vals[n], VAL_MAX, "%.*s", (int) (ve - ke - 25), ke + 25);
                s = ve + strlen(V);
        }
        return n;
}

/* Random walks: any allowed token; the call closes within the budget, names a tool, and its
 * values have their schema's type. */
static void test_tool_call_walks(void **state) {
        static const char *const names[] = { "get_weather", "noop", "get", "free" };
        for (int rep = 0; rep < 60; rep++) {
                /* any tool, then get_weather alone (two required keys to fill before the budget) */
                struct grammar *g = tool(TOOLS, rep < 40 ? NULL : "get_weather");
                bool ended;
                /* get_weather's shortest call is 112 bytes, which a walk may pick byte by byte */
                uint32_t budget = (rep < 40 ? 40 : 120) + (uint32_t) (xorshift() % 120);
                char *out = random_walk(g, budget, &ended);
                if (!ended)
                        fail_msg("no end within %u tokens: %s", budget, out);
                assert_true(strncmp(out, "<tool_call>", 11) == 0);
                char *e = strstr(out, "</tool_call>");
                assert_non_null(e);
                assert_string_equal(e, "</tool_call>");
                *e = 0;
                char keys[16][KEY_MAX], vals[16][VAL_MAX];
                int n = parse_native(out + 11, names, ELEMENTSOF(names), keys, vals), required = 0;
                if (n < 0)
                        fail_msg("not a native call: %s", out);
                for (int i = 0; i < n; i++) {
                        required += strcmp(keys[i], "city") == 0 || strcmp(keys[i], "days") == 0;
                        struct json_value *v = NULL;
                        if (strcmp(keys[i], "days") == 0) {
                                assert_int_equal(json_parse(vals[i], strlen(vals[i]), "days", &v, NULL, 0), 0);
                                assert_int_equal(json_type(v), JSON_INT);
                        } else if (strcmp(keys[i], "unit") == 0)
                                assert_true(strcmp(vals[i], "celsius") == 0 || strcmp(vals[i], "fahrenheit") == 0);
                        else if (strcmp(keys[i], "at") == 0) {
                                assert_int_equal(json_parse(vals[i], strlen(vals[i]), "at", &v, NULL, 0), 0);
                                assert_int_equal(json_type(json_object_get(v, "lat")) == JSON_INT ||
                                                 json_type(json_object_get(v, "lat")) == JSON_DOUBLE, 1);
                        }
                        json_free(v);
                }
                if (rep >= 40 && required != 2)
                        fail_msg("city and days are required: %s", out);
                free(out);
                grammar_free(g);
        }
}

/* The reserve a reasoning leaves the call is counted in tokens: get_weather's shortest call is 120
 * bytes but 13 tokens here (`get` `_weather`, the markup one piece each, `0`); walks that start
 * with just the reserve still close. */
static void test_tool_call_reserve(void **state) {
        struct grammar *g = tool(TOOLS, "get_weather");
        struct grammar_matcher *m = NULL;
        assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &m), 0);
        uint32_t reserve = grammar_matcher_reserve(m);
        /* 13 tokens, `<tool_call>`, `</tool_call>`, the end, twice the margin (the call's 13 + 2) */
        assert_int_equal(reserve, 13 + 3 + 2 * 15);
        grammar_matcher_free(m);
        for (int rep = 0; rep < 40; rep++) {
                bool ended;
                char *out = random_walk(g, reserve, &ended);
                if (!ended)
                        fail_msg("no end within the reserve of %u tokens: %s", reserve, out);
                assert_true(strncmp(out, "<tool_call>", 11) == 0 && strstr(out, "get_weather<param_key>"));
                free(out);
        }
        grammar_free(g);
}

/* A call of noop (no parameters), then the end of the turn. */
static void last_call_noop(struct grammar_matcher *m) {
        assert_int_equal(grammar_matcher_accept(m, ID_TOOL_CALL), 0);
        assert_int_equal(grammar_matcher_accept_bytes(m, "noop", 4), 0);
        assert_int_equal(grammar_matcher_accept(m, ID_END_TOOL_CALL), 0);
        assert_int_equal(grammar_matcher_accept(m, ID_END), 0);
        assert_true(grammar_matcher_ended(m));
}

/* GRAMMAR_TOOL_CALLS (tool_choice auto): the output is free until the model's `<tool_call>`,
 * the call is held to the tools' native syntax up to its `</tool_call>`, then free again, any
 * number of times; nothing is reserved from a reasoning. */
static void test_tool_calls_lazy(void **state) {
        struct grammar *g = NULL;
        struct grammar_matcher *m = NULL;
        uint64_t *mask = calloc(DIV_ROUND_UP(NV, 64), 8);
        char err[512];

        (void) state;
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_TOOL_CALLS, NULL, TOOLS, NULL, tok, 0, &g, err,
                                                          sizeof err), 0);
        assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &m), 0);
        assert_int_equal(grammar_matcher_reserve(m), 0);
        /* free: every token, the end and the call's markers included */
        assert_int_equal(grammar_matcher_mask(m, 1000, mask), (int) NV);
        assert_true(grammar_matcher_can_end(m));
        assert_int_equal(grammar_matcher_accept(m, id_of("abc")), 0);
        assert_int_equal(grammar_matcher_accept(m, id_of("{\"")), 0);
        assert_int_equal(grammar_matcher_accept(m, ID_END_TOOL_CALL), 0); /* a stray close is text */
        /* too little budget left for a whole call: `<tool_call>` is not offered */
        assert_int_equal(grammar_matcher_mask(m, 3, mask), (int) NV - 1);
        assert_false(grammar_mask_test(mask, ID_TOOL_CALL));
        /* a call: held to the grammar */
        assert_int_equal(grammar_matcher_accept(m, ID_TOOL_CALL), 0);
        assert_false(grammar_matcher_can_end(m));
        grammar_matcher_mask(m, 1000, mask);
        assert_true(grammar_mask_test(mask, id_of("get")));
        assert_false(grammar_mask_test(mask, id_of("{\"")));  /* the JSON form is not taken */
        assert_false(grammar_mask_test(mask, ID_END));
        assert_int_equal(grammar_matcher_accept(m, id_of("{\"")), -EINVAL);
        assert_int_equal(grammar_matcher_accept_bytes(m, "get_weather" K("city") "Paris" V, 70), 0);
        assert_int_equal(grammar_matcher_accept(m, ID_END_TOOL_CALL), -EINVAL); /* days is required */
        assert_int_equal(grammar_matcher_accept(m, ID_END), -EINVAL);
        assert_int_equal(grammar_matcher_accept_bytes(m, K("days") "x", 41), -EINVAL); /* an integer */
        assert_int_equal(grammar_matcher_accept_bytes(m, K("days") "3" V, 55), 0);
        assert_int_equal(grammar_matcher_accept(m, ID_END_TOOL_CALL), 0);
        /* free again, and a second call */
        assert_true(grammar_matcher_can_end(m));
        assert_int_equal(grammar_matcher_mask(m, 1000, mask), (int) NV);
        assert_int_equal(grammar_matcher_accept(m, id_of("abc")), 0);
        last_call_noop(m);
        grammar_matcher_free(m);
        grammar_free(g);
        free(mask);

        /* a tool marked strict is held to its schema exactly, lenient or not; the others are
         * lenient */
        static const char *const pat = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}";
        char tools[512];
        snprintf(tools, sizeof tools, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
                 "\"parameters\":%s}}]", pat);
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_TOOL_CALLS, NULL, tools, NULL, tok, GRAMMAR_LENIENT,
                                                          &g, err, sizeof err), -EINVAL);
        assert_non_null(strstr(err, "constraint.tool_calls: tools[0].parameters (strict).properties.a: "
                                    "keyword 'pattern' is not supported"));
        snprintf(tools, sizeof tools, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":%s}}]", pat);
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_TOOL_CALLS, NULL, tools, NULL, tok, GRAMMAR_LENIENT,
                                                          &g, err, sizeof err), 0);
        grammar_free(g);
}

/* GRAMMAR_OR_TOOL_CALLS (response_format beside tools under auto): the output's first token is
 * `<tool_call>` or the JSON's; calls may follow each other, then the end; the JSON ends it. */
static void test_json_or_tool_calls(void **state) {
        static const char *const schema = "{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\"}},"
                                          "\"required\":[\"age\"],\"additionalProperties\":false}";
        char err[512];
        uint64_t *mask = calloc(DIV_ROUND_UP(NV, 64), 8);
        struct grammar_matcher *m = NULL;
        struct grammar *g = NULL;

        (void) state;
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_JSON_SCHEMA, schema, TOOLS, NULL, tok,
                                                          GRAMMAR_OR_TOOL_CALLS, &g, err, sizeof err), 0);
        /* the JSON */
        assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &m), 0);
        assert_true(grammar_matcher_reserve(m) > 0);
        grammar_matcher_mask(m, 1000, mask);
        assert_true(grammar_mask_test(mask, ID_TOOL_CALL));
        assert_true(grammar_mask_test(mask, id_of("{\"")));
        assert_false(grammar_mask_test(mask, id_of("abc")));
        assert_false(grammar_mask_test(mask, ID_END));
        assert_int_equal(grammar_matcher_accept(m, id_of("\n")), 0);  /* whitespace: still either */
        grammar_matcher_mask(m, 1000, mask);
        assert_true(grammar_mask_test(mask, ID_TOOL_CALL));
        assert_int_equal(grammar_matcher_accept(m, id_of("{\"")), 0);
        grammar_matcher_mask(m, 1000, mask);
        assert_false(grammar_mask_test(mask, ID_TOOL_CALL));       /* the JSON has begun */
        assert_int_equal(grammar_matcher_accept(m, ID_TOOL_CALL), -EINVAL);
        assert_int_equal(grammar_matcher_accept_bytes(m, "age\":3", 6), 0);
        assert_int_equal(grammar_matcher_accept(m, ID_END), -EINVAL);
        assert_int_equal(grammar_matcher_accept(m, id_of("}")), 0);
        assert_true(grammar_matcher_can_end(m));
        grammar_matcher_mask(m, 1000, mask);
        assert_false(grammar_mask_test(mask, ID_END_TOOL_CALL));
        assert_int_equal(grammar_matcher_accept(m, ID_END), 0);
        assert_true(grammar_matcher_ended(m));
        grammar_matcher_free(m);
        /* calls instead, two of them, then the end */
        assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &m), 0);
        assert_int_equal(grammar_matcher_accept(m, ID_TOOL_CALL), 0);
        assert_false(grammar_matcher_can_end(m));
        assert_int_equal(grammar_matcher_accept(m, id_of("{\"")), -EINVAL); /* a call, not JSON */
        assert_int_equal(grammar_matcher_accept_bytes(m, "get_weather" K("city") "Paris" V K("days") "3" V, 125), 0);
        assert_int_equal(grammar_matcher_accept(m, ID_END), -EINVAL);
        assert_int_equal(grammar_matcher_accept(m, ID_END_TOOL_CALL), 0);
        assert_int_equal(grammar_matcher_mask(m, 1000, mask), 2); /* the end, or another call */
        assert_true(grammar_mask_test(mask, ID_TOOL_CALL) && grammar_mask_test(mask, ID_END));
        assert_int_equal(grammar_matcher_mask(m, 2, mask), 1);    /* no room for another call */
        assert_int_equal(grammar_matcher_accept(m, id_of("{\"")), -EINVAL);
        last_call_noop(m);
        grammar_matcher_free(m);
        grammar_free(g);
        /* random walks: a call or the JSON, closed within the budget either way */
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_JSON_SCHEMA, schema, TOOLS, "", tok,
                                                          GRAMMAR_OR_TOOL_CALLS, &g, err, sizeof err), 0);
        for (int rep = 0; rep < 40; rep++) {
                bool ended;
                uint32_t budget = 60 + (uint32_t) (xorshift() % 120);
                char *out = random_walk(g, budget, &ended);
                if (!ended)
                        fail_msg("no end within %u tokens: %s", budget, out);
                /* whitespace before either is allowed (the JSON's, as before a value) */
                if (strncmp(out + strspn(out, " \t\n"), "<tool_call>", 11) != 0) {
                        struct json_value *v = NULL;
                        if (json_parse(out, strlen(out), "walk", &v, NULL, 0) < 0 || !json_object_get(v, "age"))
                                fail_msg("neither a call nor the JSON (budget %u): [%s] %zu", budget, out, strlen(out));
                        json_free(v);
                }
                free(out);
        }
        grammar_free(g);
        /* json_object beside calls; the schema's errors name it */
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_JSON_OBJECT, NULL, TOOLS, NULL, tok,
                                                          GRAMMAR_OR_TOOL_CALLS, &g, err, sizeof err), 0);
        assert_int_equal(grammar_matcher_new(g, voc, END_IDS, 1, &m), 0);
        assert_int_equal(grammar_matcher_accept_bytes(m, "{}", 2), 0);
        assert_true(grammar_matcher_can_end(m));
        grammar_matcher_free(m);
        grammar_free(g);
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"x\"}",
                                                          TOOLS, NULL, tok, GRAMMAR_OR_TOOL_CALLS, &g, err, sizeof err),
                         -EINVAL);
        assert_non_null(strstr(err, "constraint.json_schema: keyword 'pattern' is not supported"));
        assert_int_equal(grammar_compile_constraint_flags(GRAMMAR_JSON_SCHEMA, schema, NULL, NULL, tok,
                                                          GRAMMAR_OR_TOOL_CALLS, &g, err, sizeof err), -EINVAL);
        assert_non_null(strstr(err, "constraint.or_tool_calls: the request has no tools"));
        free(mask);
}

static void test_mask_apply(void **state) {
        float l[130];
        uint64_t mask[3] = { 0 };
        for (int i = 0; i < 130; i++)
                l[i] = (float) i;
        mask[0] = 1ull << 5;
        mask[2] = 2; /* id 129 */
        grammar_mask_apply(mask, l, 130);
        for (int i = 0; i < 130; i++)
                if (i == 5 || i == 129)
                        assert_true(l[i] == (float) i); /* allowed logits untouched */
                else
                        assert_true(isinf(l[i]) && l[i] < 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_compile_errors),
                cmocka_unit_test(test_lenient),
                cmocka_unit_test(test_matcher_object),
                cmocka_unit_test(test_matcher_values),
                cmocka_unit_test(test_mask_multibyte),
                cmocka_unit_test(test_mask_values),
                cmocka_unit_test(test_random_walks_close),
                cmocka_unit_test(test_depth_cap),
                cmocka_unit_test(test_tool_call_errors),
                cmocka_unit_test(test_tool_call_native),
                cmocka_unit_test(test_tool_call_tokens),
                cmocka_unit_test(test_tool_call_walks),
                cmocka_unit_test(test_tool_call_reserve),
                cmocka_unit_test(test_tool_calls_lazy),
                cmocka_unit_test(test_json_or_tool_calls),
                cmocka_unit_test(test_mask_apply),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
