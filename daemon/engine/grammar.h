/* SPDX-License-Identifier: MIT */
/* Constrained decoding: a JSON Schema, "any JSON object" or a forced tool call compiled into a
 * byte-level pushdown matcher, and the per-step token mask it gives over the vocabulary.
 *
 * Three objects:
 *   struct grammar          a compiled constraint (immutable; one per request)
 *   struct grammar_vocab    the token trie of a tokenizer (immutable, shared by every request)
 *   struct grammar_matcher  the state of one generation: mask, accept, finish
 *
 * Schema subset (the one OpenAI's strict mode and Anthropic's tool input schemas use):
 *   type (one name or an array of names): object, array, string, number, integer, boolean, null;
 *   properties, required, additionalProperties (false, true, absent or a schema); items,
 *   minItems, maxItems; enum, const; anyOf; allOf with one member; nullable (OpenAPI); $ref to
 *   "#", "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed, nesting capped at
 *   GRAMMAR_MAX_DEPTH); a schema without type, enum, const, anyOf or $ref is any JSON value.
 *   Ignored (annotations): title, description, default, examples, $schema, $id, $comment,
 *   deprecated, readOnly, writeOnly, and x-* keys.
 *   Refused with INVALID_ARGUMENT naming the keyword: every other keyword (format, minimum, maximum,
 *   exclusiveMinimum, exclusiveMaximum, multipleOf, minLength, maxLength, pattern, oneOf, not,
 *   if/then/else, patternProperties, propertyNames, minProperties, maxProperties, uniqueItems,
 *   prefixItems, contains, ...): the output could break them.
 *
 * What the matcher lets the model write (a subset of what the schema allows; every output the
 * mask permits and that finishes is valid against the schema):
 *   - an object with listed properties has only those (additionalProperties true or absent adds
 *     none); an object without properties takes any keys when additionalProperties is not false,
 *     with values of its schema (any JSON when true or absent); keys appear in any order, each
 *     once; `}` only after every required one;
 *   - strings are valid UTF-8 (multi-byte characters may be split across byte-fallback tokens),
 *     with the JSON escapes; \u escapes of surrogates and \u0000 are not allowed;
 *   - numbers: at most 16 integer digits, 16 fraction digits, 3 exponent digits; integers have
 *     neither fraction nor exponent;
 *   - enum / const values in their compact JSON form (json_dump: `{"a":1}`, `"é"` unescaped);
 *   - whitespace between tokens of the JSON text: at most GRAMMAR_MAX_WS bytes in a row, none
 *     after the value is complete;
 *   - nesting at most GRAMMAR_MAX_DEPTH; anyOf alternatives are followed in parallel, at most
 *     GRAMMAR_MAX_THREADS at once (further ones are dropped, never wrongly allowed); an anyOf
 *     expands to at most GRAMMAR_MAX_ALTERNATIVES values with nested anyOfs and $refs followed
 *     (an alternative that refers back to the anyOf adds nothing).
 *
 * Forced tool call, in the model's own syntax (docs/model.md §7; chat/outparse.h reads it back):
 * `<tool_call>NAME<param_key>K</param_key><param_value>V</param_value>…</tool_call>` then the end
 * of the turn, `<tool_call>` / `</tool_call>` being the model's special tokens and the rest text
 * (the markup is matched byte by byte, as its user-defined pieces or any split of it):
 *   - NAME: one of the chosen tools' names (whitespace before it allowed, as before a JSON
 *     value); a name the output parser could not read back ('<', '>', a control character, a
 *     leading '{', a space at either end) is refused by name;
 *   - K: a property the tool's `parameters` lists, each at most once, in any order, no
 *     whitespace around the markup; `</tool_call>` only once every required one is written. A
 *     schema without properties takes free keys (raw text without '<', not empty; a key may then
 *     repeat), none with additionalProperties false; a tool without `parameters` takes none;
 *   - V, where the property's schema allows any string (type string, no type, an anyOf with a
 *     string branch): raw text, valid UTF-8 without NUL, anything but `</param_value>` ('<' and
 *     markup-like text included); format, pattern, minLength and maxLength are
 *     refused as elsewhere (ignored with GRAMMAR_LENIENT). enum / const (and an anyOf of them):
 *     one of the values literally, a string raw, any other value in its compact JSON form; an
 *     anyOf mixing string enum values with other schemas takes any raw text. Otherwise the
 *     value's JSON, constrained as above (whitespace before it, none after), then the marker.
 * A tool whose definition says "strict": true (in `function` or beside it) is compiled without
 * GRAMMAR_LENIENT whatever the flags: a keyword the mask cannot enforce is refused naming it.
 * Lazy (GRAMMAR_TOOL_CALLS, tool_choice auto): the output is free (every token, nothing
 * reserved) until the model's `<tool_call>`, held to the call above up to its `</tool_call>`,
 * then free again, any number of calls; `<tool_call>` is left out of the mask while the budget
 * cannot hold a whole call. The caller keeps the matcher off while the model is in its reasoning
 * (calls are content-channel only: chat/outparse.h). Beside a JSON answer (GRAMMAR_OR_TOOL_CALLS,
 * below): the output's first token, after whitespace, is `<tool_call>` or the JSON's; after a
 * call, another `<tool_call>` or the end; the reserve is room for the longer of the two.
 * The JSON form of a call (`{"name":…,"arguments":{…}}`), which the output parser also reads, is
 * not allowed: a model trained on the native form writes junk in it. The budget (below) counts
 * tokens of the vocabulary: the markup is one piece each where the vocabulary has it as a
 * user-defined piece (the release's does), its bytes otherwise.
 *
 * The text a token stands for is its decoded piece (`▁` as ' ', byte pieces as their byte);
 * control, unknown and registered special pieces are never part of the JSON. The decoder drops
 * one leading `▁` of the first piece after a special or at the start of the output: the matcher
 * counts it as whitespace before the value (or a tool's name), which is allowed there either
 * way. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

struct tokenizer;
struct json_value;

#define GRAMMAR_MAX_DEPTH 32
#define GRAMMAR_MAX_THREADS 8
#define GRAMMAR_MAX_WS 24
#define GRAMMAR_MAX_PROPERTIES 64
/* an anyOf with its nested anyOfs, type lists and $refs expanded */
#define GRAMMAR_MAX_ALTERNATIVES 1024

struct grammar;
struct grammar_vocab;
struct grammar_matcher;

/* Compile a JSON Schema given as JSON text. On a bad schema returns -EINVAL with a message in
 * err naming the place and the problem ("properties.age: keyword 'minimum' is not supported"). */
int grammar_compile_schema(const char *json, size_t len, struct grammar **ret, char *err,
                           size_t err_size);
/* Any JSON object. */
int grammar_compile_json_object(struct grammar **ret);
/* A call of one of the tools in tools_json (an array of OpenAI-style definitions,
 * {"type":"function","function":{"name","parameters"}} or {"name","parameters"}): the named one,
 * or any of them when name is NULL or empty, in the native syntax above. The tokenizer gives the
 * ids of `<tool_call>` and `</tool_call>`. -EINVAL with a message in err for unknown names, bad
 * definitions or schemas, and names, keys or enum values the native syntax cannot carry. */
int grammar_compile_tool(const char *tools_json, const char *name, const struct tokenizer *t,
                         struct grammar **ret, char *err, size_t err_size);
/* What GenerateRequest.constraint asks for (values = enum sched_constraint). */
enum grammar_kind {
        GRAMMAR_JSON_OBJECT = 1,
        GRAMMAR_JSON_SCHEMA = 2,
        GRAMMAR_TOOL = 3,
        /* lazy tool calls: the output is free; each call the model begins with `<tool_call>` is
         * held to the native syntax of one of the tools (as GRAMMAR_TOOL) up to its
         * `</tool_call>`, then the output is free again (any number of calls) */
        GRAMMAR_TOOL_CALLS = 5,
};
/* One of the above, with the message in err naming the request field at fault
 * ("constraint.json_schema: properties.age: keyword 'minimum' is not supported"). */
int grammar_compile_constraint(enum grammar_kind kind, const char *schema, const char *tools_json,
                               const char *tool_name, const struct tokenizer *t,
                               struct grammar **ret, char *err, size_t err_size);
/* The same with flags: GRAMMAR_LENIENT ignores the keywords the grammar cannot enforce (value
 * bounds, pattern, formats, not, if/then/else; oneOf read as anyOf, allOf of several as its
 * first) instead of refusing them: the output has the schema's structure, its values may break
 * those rules (OpenAI's non-strict schemas, a forced tool of an MCP client). */
#define GRAMMAR_LENIENT 1u
/* With GRAMMAR_JSON_OBJECT / GRAMMAR_JSON_SCHEMA: the output is either that JSON or tool calls
 * of tools_json (response_format beside tools under tool_choice auto): at its first token (after
 * whitespace) `<tool_call>` or the JSON's first; a call is held as in GRAMMAR_TOOL and may be
 * followed by more calls or the end, the JSON ends the output. Tools not marked strict are
 * lenient; GRAMMAR_LENIENT is the JSON schema's. */
#define GRAMMAR_OR_TOOL_CALLS 2u
int grammar_compile_constraint_flags(enum grammar_kind kind, const char *schema, const char *tools_json,
                                     const char *tool_name, const struct tokenizer *t, unsigned flags,
                                     struct grammar **ret, char *err, size_t err_size);
void grammar_free(struct grammar *g);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct grammar *, grammar_free);

/* The token trie of a tokenizer (built once, ~10-100 ms for 131072 pieces). */
int grammar_vocab_new(const struct tokenizer *t, struct grammar_vocab **ret);
void grammar_vocab_free(struct grammar_vocab *v);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct grammar_vocab *, grammar_vocab_free);
uint32_t grammar_vocab_n(const struct grammar_vocab *v); /* vocabulary size (mask bits) */

/* A matcher at the start of the constrained output. end_ids: the tokens that end the turn
 * (EOS, `<_end>`), allowed only once the constrained output is complete. */
int grammar_matcher_new(const struct grammar *g, const struct grammar_vocab *v,
                        const int32_t *end_ids, size_t n_end, struct grammar_matcher **ret);
void grammar_matcher_free(struct grammar_matcher *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct grammar_matcher *, grammar_matcher_free);

/* The allowed tokens now, as a bitset of DIV_ROUND_UP(n_vocab, 64) words (bit id % 64 of word
 * id / 64). budget: the tokens the request may still generate, this one included; when it gets
 * close to what the shortest completion needs, only tokens along that completion are allowed,
 * and of those only the ones after which the rest can still be spelled within the budget (so
 * the output closes before max_tokens). Lengths are tokens: a completion counts the fewest
 * tokens of the vocabulary that spell it; "close" keeps a margin of the longest shortest-value of
 * any schema node, so counted, which covers what one token can open; a budget smaller than the
 * shortest complete output cannot close and ends by length. Returns the number of allowed
 * tokens (0: the vocabulary cannot continue the output). Masks of states seen before come from a
 * cache. */
int grammar_matcher_mask(struct grammar_matcher *m, uint32_t budget, uint64_t *mask);
/* Advance by a generated token: 0, or -EINVAL (state unchanged) if the constraint forbids it. */
int grammar_matcher_accept(struct grammar_matcher *m, int32_t id);
/* Advance by text (tests): 0, or -EINVAL (state unchanged) if a byte is not allowed. */
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n);
/* The constrained output is complete: the JSON value can end here (and a tool call is closed). */
bool grammar_matcher_can_end(const struct grammar_matcher *m);
/* Whether tools_json (the request's tools) marks a tool "strict": true (in `function` or beside
 * it): 1 some tool, 0 none, -EINVAL no tools (absent, not JSON, not a non-empty array). Lazy tool
 * calls whose tools cannot be compiled run unconstrained when it is 0 (the daemon's choice:
 * tool_choice auto is "the model may call", not "refuse the request"). */
int grammar_tools_strict(const char *tools_json);
/* A lazy grammar (GRAMMAR_TOOL_CALLS): free output between calls. */
bool grammar_matcher_lazy(const struct grammar_matcher *m);
/* An end token was accepted: nothing more is allowed but end tokens. */
bool grammar_matcher_ended(const struct grammar_matcher *m);
/* Tokens to keep for the constrained output when something unconstrained comes first (the
 * reasoning): the shortest complete output in tokens, its special tokens and the end, and twice
 * the closing margin (room for values longer than their shortest). */
uint32_t grammar_matcher_reserve(const struct grammar_matcher *m);

/* Benchmarks: off, every mask is computed (the trie walk) instead of taken from the cache. */
void grammar_matcher_set_cache(struct grammar_matcher *m, bool on);

/* logits[i] = -inf for every token not in mask. Allowed logits are not touched. */
void grammar_mask_apply(const uint64_t *mask, float *logits, uint32_t n_vocab);
static inline bool grammar_mask_test(const uint64_t *mask, int32_t id) {
        return (mask[(uint32_t) id >> 6] >> ((uint32_t) id & 63)) & 1;
}
