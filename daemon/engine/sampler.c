/* SPDX-License-Identifier: MIT */
/* Token sampler; the order of operations and its reasons are in sampler.h. */
#include "sampler.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rng.h"

/* Seen tokens: open addressing, key = token + 1 (0 = empty). */
struct seen {
        uint32_t key;
        uint32_t gen_count; /* times generated (accepted) */
};

struct cand {
        float z; /* penalized logit */
        float w; /* tempered weight relative to the best token: exp((z - zmax) / T) */
        int32_t id;
};

/* top-p buckets by the float bits of a weight w <= 1: (bits(1.0) - bits(w)) >> 18 is 32 buckets
 * per octave, in decreasing-weight order, 0..4064 (w = 0 last) */
#define TOPP_BUCKETS 4096
/* weights are summed in blocks (8 float lanes of 32), blocks in double */
#define BLOCK 256

struct sampler {
        struct sampler_params p;
        uint32_t n_vocab;
        uint64_t rng[4]; /* xoshiro256** */

        struct seen *seen;
        size_t seen_n, seen_cap; /* cap is a power of two */

        float *z;          /* scratch: penalized logits, n_vocab */
        float *w;          /* scratch: tempered weights exp((z - zmax) / T), n_vocab */
        float *block_sum;  /* scratch: sums of w over blocks of BLOCK tokens */
        struct cand *cand; /* scratch: candidates, n_vocab */
        double bucket_mass[TOPP_BUCKETS];
        uint32_t bucket_count[TOPP_BUCKETS];
};

void sampler_params_default(struct sampler_params *p) {
        *p = (struct sampler_params) {
                .temperature = 1.0f,
                .top_k = 0,
                .top_p = 1.0f,
                .min_p = 0.0f,
                .repetition_penalty = 1.0f,
                .presence_penalty = 0.0f,
                .frequency_penalty = 0.0f,
                .seed = 0,
        };
}

int sampler_params_validate(const struct sampler_params *p, char msg[static SAMPLER_MESSAGE_MAX]) {
        msg[0] = 0;
        if (!isfinite(p->temperature) || p->temperature < 0)
                snprintf(msg, SAMPLER_MESSAGE_MAX, "temperature must be >= 0 (0 = greedy), got %g",
                         p->temperature);
        else if (p->top_k < 0)
                snprintf(msg, SAMPLER_MESSAGE_MAX, "top_k must be >= 0 (0 = off), got %d", (int) p->top_k);
        else if (!(p->top_p > 0 && p->top_p <= 1))
                snprintf(msg, SAMPLER_MESSAGE_MAX, "top_p must be in (0, 1], got %g", p->top_p);
        else if (!(p->min_p >= 0 && p->min_p < 1))
                snprintf(msg, SAMPLER_MESSAGE_MAX, "min_p must be in [0, 1), got %g", p->min_p);
        else if (!isfinite(p->repetition_penalty) || p->repetition_penalty <= 0)
                snprintf(msg, SAMPLER_MESSAGE_MAX, "repetition_penalty must be > 0 (1 = off), got %g",
                         p->repetition_penalty);
        else if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
                snprintf(msg, SAMPLER_MESSAGE_MAX, "presence_penalty must be in [-2, 2], got %g",
                         p->presence_penalty);
        else if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
                snprintf(msg, SAMPLER_MESSAGE_MAX, "frequency_penalty must be in [-2, 2], got %g",
                         p->frequency_penalty);
        else
                return 0;
        return -EINVAL;
}

/* ---- RNG: xoshiro256** (common/rng.h), state filled by splitmix64 from the seed ---- */

static double rng_uniform(uint64_t s[4]) {
        return xoshiro256_uniform(s);
}

/* ---- lifecycle and seen tokens ---- */

int sampler_new(const struct sampler_params *p, uint32_t n_vocab, struct sampler **ret, char *err,
                size_t err_size) {
        char msg[SAMPLER_MESSAGE_MAX];
        int r;

        r = sampler_params_validate(p, msg);
        if (r < 0)
                return error_set(err, err_size, r, "%s", msg);
        if (n_vocab == 0 || n_vocab > INT32_MAX)
                return error_set(err, err_size, EINVAL, "sampler: vocabulary of %u tokens, 1..2^31-1 expected",
                                 n_vocab);

        _cleanup_(sampler_freep) struct sampler *s = calloc(1, sizeof *s);
        if (!s)
                return error_set(err, err_size, ENOMEM, "sampler: out of memory");
        s->p = *p;
        s->n_vocab = n_vocab;
        uint64_t x = p->seed;
        for (int i = 0; i < 4; i++)
                s->rng[i] = splitmix64(&x);
        s->z = malloc(n_vocab * sizeof *s->z);
        s->w = malloc(n_vocab * sizeof *s->w);
        s->block_sum = malloc(DIV_ROUND_UP(n_vocab, BLOCK) * sizeof *s->block_sum);
        s->cand = malloc(n_vocab * sizeof *s->cand);
        if (!s->z || !s->w || !s->block_sum || !s->cand)
                return error_set(err, err_size, ENOMEM, "sampler: out of memory for %u-token scratch", n_vocab);
        *ret = TAKE_PTR(s);
        return 0;
}

void sampler_free(struct sampler *s) {
        if (!s)
                return;
        free(s->seen);
        free(s->z);
        free(s->w);
        free(s->block_sum);
        free(s->cand);
        free(s);
}

static size_t seen_slot(const struct seen *t, size_t cap, uint32_t key) {
        size_t i = (key * 0x9e3779b1u) & (cap - 1);
        while (t[i].key != 0 && t[i].key != key)
                i = (i + 1) & (cap - 1);
        return i;
}

static struct seen *seen_get(struct sampler *s, int32_t token) {
        uint32_t key = (uint32_t) token + 1;

        if (2 * (s->seen_n + 1) > s->seen_cap) {
                size_t cap = s->seen_cap ? 2 * s->seen_cap : 64;
                struct seen *t = calloc(cap, sizeof *t);
                if (!t)
                        return NULL;
                for (size_t i = 0; i < s->seen_cap; i++)
                        if (s->seen[i].key)
                                t[seen_slot(t, cap, s->seen[i].key)] = s->seen[i];
                free(s->seen);
                s->seen = t;
                s->seen_cap = cap;
        }
        size_t i = seen_slot(s->seen, s->seen_cap, key);
        if (s->seen[i].key == 0) {
                s->seen[i].key = key;
                s->seen_n++;
        }
        return &s->seen[i];
}

static int check_token(struct sampler *s, int32_t token, char *err, size_t err_size) {
        if (token < 0 || (uint32_t) token >= s->n_vocab)
                return error_set(err, err_size, EINVAL, "sampler: token %d is outside the vocabulary of %u tokens",
                                 (int) token, s->n_vocab);
        return 0;
}

int sampler_add_prompt(struct sampler *s, const int32_t *tokens, size_t n, char *err, size_t err_size) {
        int r;
        for (size_t i = 0; i < n; i++) {
                r = check_token(s, tokens[i], err, err_size);
                if (r < 0)
                        return r;
                if (!seen_get(s, tokens[i]))
                        return error_set(err, err_size, ENOMEM, "sampler: out of memory");
        }
        return 0;
}

int sampler_accept(struct sampler *s, int32_t token) {
        int r = check_token(s, token, NULL, 0);
        if (r < 0)
                return r;
        struct seen *e = seen_get(s, token);
        if (!e)
                return log_error_errno(ENOMEM, "sampler: out of memory");
        e->gen_count++;
        return 0;
}

/* ---- candidates ---- */

/* a ranks before b: higher logit, then lower id */
static inline bool cand_before(const struct cand *a, const struct cand *b) {
        return a->z > b->z || (a->z == b->z && a->id < b->id);
}

static int cand_cmp(const void *x, const void *y) {
        const struct cand *a = x, *b = y;
        return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

static inline void cand_swap(struct cand *a, struct cand *b) {
        struct cand t = *a;
        *a = *b;
        *b = t;
}

/* Rearranges a[0..n) so that a[0..k) are the k best (in no particular order). Quickselect with a
 * median-of-three pivot; the order is strict (ids break ties) so equal logits cannot degrade it. */
static void cand_select(struct cand *a, size_t n, size_t k) {
        size_t lo = 0, hi = n; /* the k-th best lies in [lo, hi) */

        if (k == 0 || k >= n)
                return;
        while (hi - lo > 16) {
                size_t mid = lo + (hi - lo) / 2;
                if (cand_before(&a[mid], &a[lo]))
                        cand_swap(&a[mid], &a[lo]);
                if (cand_before(&a[hi - 1], &a[lo]))
                        cand_swap(&a[hi - 1], &a[lo]);
                if (cand_before(&a[hi - 1], &a[mid]))
                        cand_swap(&a[hi - 1], &a[mid]);
                /* a[lo] best, a[mid] median, a[hi-1] worst of the three: partition on the median */
                struct cand pivot = a[mid];
                cand_swap(&a[mid], &a[hi - 2]);
                size_t i = lo, j = hi - 2;
                for (;;) {
                        while (cand_before(&a[++i], &pivot))
                                ;
                        while (cand_before(&pivot, &a[--j]))
                                ;
                        if (i >= j)
                                break;
                        cand_swap(&a[i], &a[j]);
                }
                cand_swap(&a[i], &a[hi - 2]); /* pivot to its final place i */
                if (i == k - 1 || i == k)
                        return; /* [0, i) are the i best and a[i] the next */
                if (i > k)
                        hi = i;
                else
                        lo = i + 1;
        }
        qsort(a + lo, hi - lo, sizeof *a, cand_cmp);
}

/* The k best of a[0..n) moved to the front and sorted. */
static void cand_top_sorted(struct cand *a, size_t n, size_t k) {
        k = MIN(k, n);
        cand_select(a, n, k);
        qsort(a, k, sizeof *a, cand_cmp);
}

/* ---- sampling ---- */

/* Copies the logits with NaN -> -inf, +inf -> FLT_MAX and applies the penalties (sampler.h §1).
 * Returns the index of the maximum (lowest id on ties) or -1 if none is finite. */
static int32_t penalize(struct sampler *s, const float *logits) {
        float *z = s->z;
        const float rp = s->p.repetition_penalty;

        for (uint32_t i = 0; i < s->n_vocab; i++) {
                float l = logits[i];
                z[i] = isnan(l) ? -INFINITY : l == INFINITY ? FLT_MAX : l;
        }
        for (size_t i = 0; i < s->seen_cap; i++) {
                const struct seen *e = &s->seen[i];
                if (!e->key)
                        continue;
                float *l = &z[e->key - 1];
                if (*l == -INFINITY)
                        continue;
                if (rp != 1.0f)
                        *l = *l > 0 ? *l / rp : *l * rp;
                if (e->gen_count > 0)
                        *l -= s->p.presence_penalty + s->p.frequency_penalty * (float) e->gen_count;
        }
        int32_t best = -1;
        float bz = -INFINITY;
        for (uint32_t i = 0; i < s->n_vocab; i++)
                if (z[i] > bz) {
                        bz = z[i];
                        best = (int32_t) i;
                }
        return best;
}

/* w[i] = e^((z[i] - zmax) / T) and block sums; returns the total (double over blocks). */
static double weigh(struct sampler *s, float zmax, float T) {
        const uint32_t V = s->n_vocab;
        const float *restrict z = s->z;
        float *restrict w = s->w;
        double total = 0;

        /* expf(-inf) = 0: masked tokens get no weight */
        for (uint32_t i = 0; i < V; i++)
                w[i] = expf((z[i] - zmax) / T);
        for (uint32_t b = 0; b < DIV_ROUND_UP(V, BLOCK); b++) {
                const float *x = w + (size_t) b * BLOCK;
                uint32_t n = MIN((uint32_t) BLOCK, V - b * BLOCK);
                float lane[8] = { 0 };
                uint32_t i = 0;
                for (; i + 8 <= n; i += 8)
                        for (int k = 0; k < 8; k++)
                                lane[k] += x[i + k];
                for (; i < n; i++)
                        lane[0] += x[i];
                float sum = ((lane[0] + lane[4]) + (lane[2] + lane[6])) +
                            ((lane[1] + lane[5]) + (lane[3] + lane[7]));
                s->block_sum[b] = sum;
                total += sum;
        }
        return total;
}

static void fill_logprobs(struct sampler *s, int32_t token, int32_t best,
                          struct sampler_result *ret, uint32_t n_top) {
        const float *z = s->z;
        const float zmax = z[best];

        /* log-softmax of the penalized logits (temperature 1); w is scratch here */
        const double lse = zmax + log(weigh(s, zmax, 1.0f));

        ret->token = token;
        ret->logprob = (float) ((double) z[token] - lse);
        ret->n_top = 0;
        /* the n_top best by insertion into a small sorted array; most tokens fail the first test */
        struct cand top[SAMPLER_TOP_LOGPROBS_MAX];
        uint32_t n = 0;
        for (uint32_t i = 0; i < s->n_vocab && n_top > 0; i++) {
                struct cand c = { .z = z[i], .id = (int32_t) i };
                if (n == n_top && !cand_before(&c, &top[n - 1]))
                        continue;
                uint32_t j = n < n_top ? n++ : n - 1;
                while (j > 0 && cand_before(&c, &top[j - 1])) {
                        top[j] = top[j - 1];
                        j--;
                }
                top[j] = c;
        }
        for (uint32_t i = 0; i < n; i++)
                ret->top[i] = (struct sampler_logprob) { top[i].id, (float) ((double) top[i].z - lse) };
        ret->n_top = n;
}

/* Draws from candidates c[0..n) in their order, by weight. */
static int32_t draw(struct sampler *s, const struct cand *c, size_t n) {
        double total = 0;
        for (size_t i = 0; i < n; i++)
                total += c[i].w;
        double u = rng_uniform(s->rng) * total, cum = 0;
        for (size_t i = 0; i < n; i++) {
                cum += c[i].w;
                if (u < cum)
                        return c[i].id;
        }
        /* rounding put u at the very end: the last token with weight */
        for (size_t i = n; i > 0; i--)
                if (c[i - 1].w > 0)
                        return c[i - 1].id;
        return c[0].id;
}

/* Draws from the whole vocabulary in id order: find the block by the block sums, then the token. */
static int32_t draw_all(struct sampler *s, double total) {
        const uint32_t V = s->n_vocab, nb = DIV_ROUND_UP(V, BLOCK);
        double u = rng_uniform(s->rng) * total, cum = 0;
        uint32_t b = 0;

        while (b + 1 < nb && cum + s->block_sum[b] <= u)
                cum += s->block_sum[b++];
        /* the block sum and the sequential sum may differ in the last bits: scan on from b */
        int32_t last = -1;
        for (uint32_t i = b * BLOCK; i < V; i++) {
                if (s->w[i] <= 0)
                        continue;
                cum += s->w[i];
                last = (int32_t) i;
                if (u < cum)
                        return last;
        }
        if (last >= 0)
                return last;
        for (uint32_t i = b * BLOCK; i > 0; i--) /* all weight was before block b */
                if (s->w[i - 1] > 0)
                        return (int32_t) (i - 1);
        return 0;
}

/* Adds sorted candidates c[0..k) to cum until it reaches need (at least one). */
static size_t take_until(const struct cand *c, size_t k, double cum, double need) {
        size_t m = 0;
        do
                cum += c[m++].w;
        while (m < k && cum < need);
        return m;
}

static inline unsigned bucket_of(float w) {
        uint32_t bits;
        memcpy(&bits, &w, sizeof bits);
        return bits >= 0x3f800000 ? 0 : (0x3f800000 - bits) >> 18;
}

/* top-p over the whole vocabulary without sorting it: histogram the mass by weight (the buckets
 * are in the order sorting would give), keep every bucket before the one where the mass reaches
 * need, and sort only that boundary bucket. The kept candidates go to s->cand; returns their
 * number. */
static size_t top_p_all(struct sampler *s, double need) {
        double *mass = s->bucket_mass;
        uint32_t *count = s->bucket_count;
        const float *w = s->w;
        struct cand *c = s->cand;
        double cum = 0;
        unsigned B;

        memset(mass, 0, sizeof s->bucket_mass);
        memset(count, 0, sizeof s->bucket_count);
        for (uint32_t i = 0; i < s->n_vocab; i++) {
                unsigned b = bucket_of(w[i]);
                mass[b] += w[i];
                count[b]++;
        }
        for (B = 0; B < TOPP_BUCKETS - 1; B++) {
                if (count[B] && cum + mass[B] >= need)
                        break;
                cum += mass[B];
        }
        /* buckets before B in id order, then bucket B sorted by probability */
        size_t m = 0, e = count[B], before = 0;
        for (unsigned k = 0; k < B; k++)
                before += count[k];
        for (uint32_t i = 0; i < s->n_vocab; i++) {
                unsigned b = bucket_of(w[i]);
                if (b < B)
                        c[m++] = (struct cand) { .z = s->z[i], .w = w[i], .id = (int32_t) i };
                else if (b == B)
                        c[before + --e] = (struct cand) { .z = s->z[i], .w = w[i], .id = (int32_t) i };
        }
        assert(m == before && e == 0);
        size_t nb = count[B];
        qsort(c + m, nb, sizeof *c, cand_cmp);
        if (nb == 0)
                return m;
        return m + take_until(c + m, nb, cum, need);
}

/* The k best tokens (finite logit), sorted, into s->cand; returns how many (<= k). A bounded
 * heap whose root is the worst kept token: one compare per token for most of the vocabulary,
 * cheaper than building and selecting 131072 candidates when k is small. */
static size_t top_k_heap(struct sampler *s, size_t k) {
        struct cand *h = s->cand;
        size_t n = 0;

        for (uint32_t i = 0; i < s->n_vocab; i++) {
                if (s->z[i] == -INFINITY)
                        continue;
                struct cand x = { .z = s->z[i], .id = (int32_t) i };
                size_t j;
                if (n < k) {
                        j = n++;
                        while (j > 0 && cand_before(&h[(j - 1) / 2], &x)) {
                                h[j] = h[(j - 1) / 2];
                                j = (j - 1) / 2;
                        }
                        h[j] = x;
                        continue;
                }
                if (!cand_before(&x, &h[0]))
                        continue;
                j = 0;
                for (;;) {
                        size_t c = 2 * j + 1;
                        if (c >= n)
                                break;
                        if (c + 1 < n && cand_before(&h[c], &h[c + 1]))
                                c++; /* the worse child */
                        if (!cand_before(&x, &h[c]))
                                break;
                        h[j] = h[c];
                        j = c;
                }
                h[j] = x;
        }
        qsort(h, n, sizeof *h, cand_cmp);
        return n;
}

/* Steps 3-6: the kept candidates of the tempered distribution in s->cand (returns how many), or
 * *all (no truncation: every token, weights s->w, their sum in *total). */
static size_t keep_tempered(struct sampler *s, int32_t best, bool *all, double *all_total) {
        const uint32_t V = s->n_vocab;
        const float T = s->p.temperature, zmax = s->z[best];
        const bool top_k_on = s->p.top_k > 0 && (uint32_t) s->p.top_k < V;
        const bool top_p_on = s->p.top_p < 1.0f, min_p_on = s->p.min_p > 0;
        struct cand *c = s->cand;
        size_t n;

        if (top_k_on && s->p.top_k <= 4096) {
                /* small k: select on the logits, weigh only the k kept */
                n = top_k_heap(s, (size_t) s->p.top_k);
                double kept = 0;
                for (size_t i = 0; i < n; i++) {
                        c[i].w = expf((c[i].z - zmax) / T);
                        kept += c[i].w;
                }
                if (top_p_on)
                        n = take_until(c, n, 0, ((double) s->p.top_p - 1e-6) * kept);
        } else {
                double total = weigh(s, zmax, T);
                if (!top_k_on && !top_p_on && !min_p_on) {
                        *all = true;
                        *all_total = total;
                        return 0;
                }
                n = 0;
                if (top_k_on || !top_p_on) /* large k or min-p alone: tokens with weight */
                        for (uint32_t i = 0; i < V; i++)
                                if (s->w[i] > 0)
                                        c[n++] = (struct cand) { .z = s->z[i], .w = s->w[i], .id = (int32_t) i };
                if (top_k_on) {
                        cand_top_sorted(c, n, (size_t) s->p.top_k);
                        n = MIN(n, (size_t) s->p.top_k);
                        if (top_p_on) {
                                double kept = 0;
                                for (size_t i = 0; i < n; i++)
                                        kept += c[i].w;
                                n = take_until(c, n, 0, ((double) s->p.top_p - 1e-6) * kept);
                        }
                } else if (top_p_on)
                        n = top_p_all(s, ((double) s->p.top_p - 1e-6) * total);
        }

        /* min-p: weights are relative to the best token, so the threshold is min_p itself */
        if (min_p_on) {
                size_t m = 0;
                for (size_t i = 0; i < n; i++)
                        if (c[i].w >= s->p.min_p)
                                c[m++] = c[i];
                n = m;
        }
        *all = false;
        return n;
}

static int32_t sample_tempered(struct sampler *s, int32_t best) {
        bool all;
        double total;
        size_t n = keep_tempered(s, best, &all, &total);

        return all ? draw_all(s, total) : draw(s, s->cand, n);
}

bool sampler_greedy(const struct sampler *s) {
        return s->p.temperature == 0;
}

int sampler_logprobs(struct sampler *s, const float *logits, int32_t token, struct sampler_result *ret,
                     uint32_t n_top) {
        if (n_top > SAMPLER_TOP_LOGPROBS_MAX)
                return log_error_errno(EINVAL, "top_logprobs must be in [0, %d], got %u",
                                       SAMPLER_TOP_LOGPROBS_MAX, n_top);
        if (token < 0 || (uint32_t) token >= s->n_vocab)
                return log_error_errno(EINVAL, "sampler: token %d outside the vocabulary", token);
        int32_t best = penalize(s, logits);
        if (best < 0)
                return log_error_errno(EDOM, "sampler: all %u logits are -inf or NaN", s->n_vocab);
        fill_logprobs(s, token, best, ret, n_top);
        return token;
}

int sampler_probs(struct sampler *s, const float *logits, float *probs) {
        int32_t best = penalize(s, logits);

        if (best < 0)
                return log_error_errno(EDOM, "sampler: all %u logits are -inf or NaN", s->n_vocab);
        memset(probs, 0, s->n_vocab * sizeof *probs);
        if (s->p.temperature == 0) {
                probs[best] = 1.0f;
                return best;
        }
        bool all;
        double total = 0;
        size_t n = keep_tempered(s, best, &all, &total);
        if (all) {
                for (uint32_t i = 0; i < s->n_vocab; i++)
                        probs[i] = (float) (s->w[i] / total);
                return best;
        }
        total = 0;
        for (size_t i = 0; i < n; i++)
                total += s->cand[i].w;
        for (size_t i = 0; i < n; i++)
                probs[s->cand[i].id] = (float) (s->cand[i].w / total);
        return best;
}

/* One draw from a dense distribution (need not be normalised; > 0 total), in id order. */
static int32_t draw_dense(struct sampler *s, const float *w, double total) {
        double u = rng_uniform(s->rng) * total, cum = 0;
        int32_t last = -1;

        for (uint32_t i = 0; i < s->n_vocab; i++) {
                if (w[i] <= 0)
                        continue;
                cum += w[i];
                last = (int32_t) i;
                if (u < cum)
                        return last;
        }
        return last;
}

int32_t sampler_draw_probs(struct sampler *s, const float *probs) {
        double total = 0;

        for (uint32_t i = 0; i < s->n_vocab; i++)
                total += probs[i] > 0 ? probs[i] : 0;
        if (!(total > 0))
                return log_error_errno(EDOM, "sampler: a distribution without mass");
        return draw_dense(s, probs, total);
}

int32_t sampler_speculate(struct sampler *s, const float *p, const float *q, int32_t draft,
                          bool *accepted) {
        *accepted = false;
        if (draft < 0 || (uint32_t) draft >= s->n_vocab)
                return log_error_errno(EINVAL, "sampler: draft %d outside the vocabulary", draft);
        /* accept with min(1, p/q): u < p/q, u uniform in [0, 1) (q[draft] > 0: it was drawn) */
        double pd = p[draft], qd = q[draft];
        if (pd > 0 && (pd >= qd || rng_uniform(s->rng) * qd < pd)) {
                *accepted = true;
                return draft;
        }
        /* else the residual max(0, p - q), normalised; where p <= q everywhere (p == q) it has no
         * mass and p itself is the answer */
        double total = 0;
        for (uint32_t i = 0; i < s->n_vocab; i++)
                if (p[i] > q[i])
                        total += (double) p[i] - (double) q[i];
        if (!(total > 0))
                return sampler_draw_probs(s, p);
        double u = rng_uniform(s->rng) * total, cum = 0;
        int32_t last = -1;
        for (uint32_t i = 0; i < s->n_vocab; i++) {
                if (!(p[i] > q[i]))
                        continue;
                cum += (double) p[i] - (double) q[i];
                last = (int32_t) i;
                if (u < cum)
                        return last;
        }
        return last;
}

int sampler_sample(struct sampler *s, const float *logits, struct sampler_result *ret,
                   uint32_t n_top, char *err, size_t err_size) {
        if (n_top > SAMPLER_TOP_LOGPROBS_MAX)
                return error_set(err, err_size, EINVAL, "top_logprobs must be in [0, %d], got %u",
                                 SAMPLER_TOP_LOGPROBS_MAX, n_top);

        int32_t best = penalize(s, logits);
        if (best < 0)
                return error_set(err, err_size, EDOM, "sampler: all %u logits are -inf or NaN", s->n_vocab);

        int32_t token = s->p.temperature == 0 ? best : sample_tempered(s, best);
        if (ret)
                fill_logprobs(s, token, best, ret, n_top);
        return token;
}
