/* SPDX-License-Identifier: MIT */
/* Token sampling for one request: penalties, temperature, top-k / top-p / min-p truncation, a
 * seeded per-request RNG, and OpenAI-style logprobs.
 *
 * Order (the sampled distribution), from the raw logits l of one step:
 *   1. penalties (over the tokens this sampler was told about):
 *      repetition (HF/llama.cpp): for every token seen in the sequence so far, prompt and generated,
 *        l > 0 ? l / r : l * r;
 *      presence / frequency (OpenAI): for every generated token with count c > 0,
 *        l -= presence + frequency * c.
 *      The result is the "raw distribution" that logprobs report (as OpenAI does: before
 *      temperature and truncation).
 *   2. temperature == 0: greedy, the argmax (lowest id among equal maxima); nothing below applies
 *      and no random number is drawn.
 *   3. temperature: l / T.
 *   4. top-k (0 = off): the k most likely tokens.
 *   5. top-p (1 = off): the smallest prefix of the remaining tokens in order of probability whose
 *      mass (renormalized over what is left) reaches top_p; a prefix whose mass is within 1e-6 of
 *      top_p counts as reaching it, so a cut that lands exactly on a boundary is not defeated by
 *      rounding.
 *   6. min-p (0 = off): drop tokens whose probability is below min_p times the most likely one.
 *   7. draw from what is left (renormalized) with the request's xoshiro256** stream.
 * This is the order of HF transformers and vLLM (temperature before the truncations; llama.cpp
 * applies temperature last, which makes top-p/min-p see the untempered distribution): OpenAI-API
 * clients expect top_p to act on the tempered distribution.
 * Equal probabilities are ordered by token id (lower first), so results are reproducible: the same
 * seed, parameters, tokens and logits give the same tokens.
 *
 * Cost for a 131072-token vocabulary: nothing sorts the vocabulary. Top-k (k <= 4096) keeps a
 * bounded heap over the logits and weighs only the k kept; larger k quickselects. Top-p without
 * top-k histograms the tempered mass by weight (32 buckets per octave) and sorts only the boundary
 * bucket. Plain sampling finds the token through block sums. Measured on the loaded 2-core dev box
 * (CPU time per sample, random logits): greedy 0.3 ms, top_k=40 0.5-0.6 ms, plain T=1 ~1 ms,
 * top_p=0.9 1.5-1.8 ms, logprobs add ~1 ms (one expf pass over the vocabulary). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

struct sampler_params {
        float temperature;        /* >= 0; 0 = greedy. Default 1. */
        int32_t top_k;            /* >= 0; 0 = off. Default 0. */
        float top_p;              /* (0, 1]; 1 = off. Default 1. */
        float min_p;              /* [0, 1); 0 = off. Default 0. */
        float repetition_penalty; /* > 0; 1 = off. Default 1. */
        float presence_penalty;   /* [-2, 2]; 0 = off. Default 0. */
        float frequency_penalty;  /* [-2, 2]; 0 = off. Default 0. */
        uint64_t seed;
};

#define SAMPLER_TOP_LOGPROBS_MAX 20
#define SAMPLER_MESSAGE_MAX 128

void sampler_params_default(struct sampler_params *p);

/* 0 if usable, else -EINVAL and a message for the client naming the parameter, the allowed range
 * and the value, e.g. "top_p must be in (0, 1], got 0". NaN and infinities are refused. */
int sampler_params_validate(const struct sampler_params *p, char msg[static SAMPLER_MESSAGE_MAX]);

struct sampler;

/* Validates (-EINVAL) and allocates the per-request state and scratch. Failures say why in err
 * (error_set(), common/log.h: NULL, 0 logs it), as do sampler_add_prompt and sampler_sample. */
int sampler_new(const struct sampler_params *p, uint32_t n_vocab, struct sampler **ret, char *err,
                size_t err_size);
void sampler_free(struct sampler *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct sampler *, sampler_free);

/* Tell the sampler about tokens of the sequence: prompt tokens count for the repetition penalty
 * only; accepted (generated) tokens count for all penalties. sampler_sample() does not accept
 * the token it returns (speculative decoding may reject it): call sampler_accept() for each
 * token that becomes part of the output. -EINVAL for ids outside the vocabulary. */
int sampler_add_prompt(struct sampler *s, const int32_t *tokens, size_t n, char *err, size_t err_size);
int sampler_accept(struct sampler *s, int32_t token);

struct sampler_logprob {
        int32_t token;
        float logprob;
};

struct sampler_result {
        int32_t token;
        float logprob; /* of token under the raw (penalized, untempered) distribution */
        uint32_t n_top;
        struct sampler_logprob top[SAMPLER_TOP_LOGPROBS_MAX]; /* most likely first, ties by id */
};

/* Samples one token from n_vocab logits (not modified). NaN logits count as -inf, +inf as the
 * largest float. With ret, also fills the chosen token's logprob and the n_top most likely
 * alternatives (n_top <= SAMPLER_TOP_LOGPROBS_MAX). Returns the token id, -EINVAL for n_top too
 * large, -EDOM if every logit is -inf or NaN. */
int sampler_sample(struct sampler *s, const float *logits, struct sampler_result *ret,
                   uint32_t n_top, char *err, size_t err_size);

/* Speculative decoding by rejection sampling (Leviathan et al. 2023, Chen et al. 2023).
 * sampler_probs: the distribution sampler_sample draws from for these logits (steps 1-6 with this
 * sampler's parameters and penalty state), as n_vocab probabilities (0 for tokens the truncations
 * drop; one-hot on the argmax at temperature 0); draws nothing. Returns the argmax or -EDOM.
 * sampler_draw_probs: one token from such a distribution with this sampler's RNG.
 * sampler_speculate: given the target distribution p, the draft distribution q and a draft token
 * drawn from q, accept the draft with probability min(1, p/q) (one uniform draw, none when
 * p >= q), else draw from max(0, p - q) renormalised; *accepted says which. The token returned
 * is distributed exactly as p, whatever q is, when the draft was drawn from q. */
int sampler_probs(struct sampler *s, const float *logits, float *probs);
/* temperature 0 */
bool sampler_greedy(const struct sampler *s);
/* What sampler_sample's `ret` says for `token` (chosen some other way, e.g. sampler_speculate). */
int sampler_logprobs(struct sampler *s, const float *logits, int32_t token, struct sampler_result *ret,
                     uint32_t n_top);
int32_t sampler_draw_probs(struct sampler *s, const float *probs);
int32_t sampler_speculate(struct sampler *s, const float *p, const float *q, int32_t draft,
                          bool *accepted);
