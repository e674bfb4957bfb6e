/* SPDX-License-Identifier: MIT */
/* Token sampler; the order of operations and its reasons are in sampler.h. */
#include "sampler.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

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

/* top-p buckets: (zmax - z) / T in steps of 1/32, up to 128 (e^-128 is no mass at all) */
#define TOPP_BUCKETS 4096
#define TOPP_BUCKET_SCALE 32.0f

struct sampler {
        struct sampler_params p;
        uint32_t n_vocab;
        uint64_t rng[4]; /* xoshiro256** */

        struct seen *seen;
        size_t seen_n, seen_cap; /* cap is a power of two */

        float *z;          /* scratch: penalized logits, n_vocab */
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

/* ---- RNG: xoshiro256** (Blackman & Vigna), state filled by splitmix64 from the seed ---- */

static uint64_t splitmix64(uint64_t *x) {
        uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) {
        return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4]) {
        uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = rotl(s[3], 45);
        return result;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t s[4]) {
        return (double) (rng_next(s) >> 11) * 0x1p-53;
}

/* ---- lifecycle and seen tokens ---- */

int sampler_new(const struct sampler_params *p, uint32_t n_vocab, struct sampler **ret) {
        char msg[SAMPLER_MESSAGE_MAX];
        int r;

        r = sampler_params_validate(p, msg);
        if (r < 0)
                return log_error_errno(r, "%s", msg);
        if (n_vocab == 0 || n_vocab > INT32_MAX)
                return log_error_errno(EINVAL, "sampler: vocabulary of %u tokens, 1..2^31-1 expected",
                                       n_vocab);

        _cleanup_(sampler_freep) struct sampler *s = calloc(1, sizeof *s);
        if (!s)
                return log_error_errno(ENOMEM, "sampler: out of memory");
        s->p = *p;
        s->n_vocab = n_vocab;
        uint64_t x = p->seed;
        for (int i = 0; i < 4; i++)
                s->rng[i] = splitmix64(&x);
        s->z = malloc(n_vocab * sizeof *s->z);
        s->cand = malloc(n_vocab * sizeof *s->cand);
        if (!s->z || !s->cand)
                return log_error_errno(ENOMEM, "sampler: out of memory for %u-token scratch", n_vocab);
        *ret = TAKE_PTR(s);
        return 0;
}

void sampler_free(struct sampler *s) {
        if (!s)
                return;
        free(s->seen);
        free(s->z);
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

static int check_token(struct sampler *s, int32_t token) {
        if (token < 0 || (uint32_t) token >= s->n_vocab)
                return log_error_errno(EINVAL, "sampler: token %d is outside the vocabulary of %u tokens",
                                       (int) token, s->n_vocab);
        return 0;
}

int sampler_add_prompt(struct sampler *s, const int32_t *tokens, size_t n) {
        int r;
        for (size_t i = 0; i < n; i++) {
                r = check_token(s, tokens[i]);
                if (r < 0)
                        return r;
                if (!seen_get(s, tokens[i]))
                        return log_error_errno(ENOMEM, "sampler: out of memory");
        }
        return 0;
}

int sampler_accept(struct sampler *s, int32_t token) {
        int r = check_token(s, token);
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

static void fill_logprobs(struct sampler *s, int32_t token, int32_t best,
                          struct sampler_result *ret, uint32_t n_top) {
        const float *z = s->z;
        const double zmax = z[best];
        double sum = 0;

        for (uint32_t i = 0; i < s->n_vocab; i++)
                sum += exp((double) z[i] - zmax);
        const double lse = zmax + log(sum);

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

/* Adds sorted candidates c[0..k) to cum until it reaches need (at least one). */
static size_t take_until(const struct cand *c, size_t k, double cum, double need) {
        size_t m = 0;
        do
                cum += c[m++].w;
        while (m < k && cum < need);
        return m;
}

static inline unsigned bucket_of(float z, float zmax, float T) {
        float d = (zmax - z) / T * TOPP_BUCKET_SCALE;
        return d < (float) (TOPP_BUCKETS - 1) ? (unsigned) d : TOPP_BUCKETS - 1;
}

/* top-p over unsorted candidates c[0..n) without sorting them: histogram the mass by tempered
 * log-weight (the buckets are in the same order as sorting would give), keep every bucket before
 * the one where the mass reaches need, and sort only that boundary bucket. Returns the kept count;
 * the kept candidates are moved to the front. */
static size_t top_p_unsorted(struct sampler *s, struct cand *c, size_t n, double need, float zmax,
                             float T) {
        double *mass = s->bucket_mass;
        uint32_t *count = s->bucket_count;
        double cum = 0;
        unsigned B;

        memset(mass, 0, sizeof s->bucket_mass);
        memset(count, 0, sizeof s->bucket_count);
        for (size_t i = 0; i < n; i++) {
                unsigned b = bucket_of(c[i].z, zmax, T);
                mass[b] += c[i].w;
                count[b]++;
        }
        for (B = 0; B < TOPP_BUCKETS - 1; B++) {
                if (count[B] && cum + mass[B] >= need)
                        break;
                cum += mass[B];
        }
        /* front: buckets < B (in id order), then bucket B */
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
                if (bucket_of(c[i].z, zmax, T) < B)
                        cand_swap(&c[m++], &c[i]);
        size_t e = m;
        for (size_t i = m; i < n; i++)
                if (bucket_of(c[i].z, zmax, T) == B)
                        cand_swap(&c[e++], &c[i]);
        qsort(c + m, e - m, sizeof *c, cand_cmp);
        if (e == m)
                return m;
        if (m > 0 && cum >= need)
                return m;
        return m + take_until(c + m, e - m, cum, need);
}

static int32_t sample_tempered(struct sampler *s, int32_t best) {
        const uint32_t V = s->n_vocab;
        const float T = s->p.temperature, zmax = s->z[best];
        struct cand *c = s->cand;
        size_t n = V;
        bool sorted = false;

        for (uint32_t i = 0; i < V; i++)
                c[i] = (struct cand) { .z = s->z[i], .id = (int32_t) i };

        /* top-k: quickselect the k best, sort only those */
        if (s->p.top_k > 0 && (uint32_t) s->p.top_k < V) {
                n = (size_t) s->p.top_k;
                cand_top_sorted(c, V, n);
                sorted = true;
        }
        double total = 0;
        for (size_t i = 0; i < n; i++) {
                c[i].w = expf((c[i].z - zmax) / T);
                total += c[i].w;
        }

        /* top-p: the smallest prefix in probability order reaching the mass, at least one token */
        if (s->p.top_p < 1.0f) {
                const double need = ((double) s->p.top_p - 1e-6) * total;
                n = sorted ? take_until(c, n, 0, need) : top_p_unsorted(s, c, n, need, zmax, T);
        }

        /* min-p: weights are relative to the best token, so the threshold is min_p itself */
        if (s->p.min_p > 0) {
                size_t m = 0;
                for (size_t i = 0; i < n; i++)
                        if (c[i].w >= s->p.min_p)
                                c[m++] = c[i];
                n = m;
        }
        return draw(s, c, n);
}

int sampler_sample(struct sampler *s, const float *logits, struct sampler_result *ret,
                   uint32_t n_top) {
        if (n_top > SAMPLER_TOP_LOGPROBS_MAX)
                return log_error_errno(EINVAL, "top_logprobs must be in [0, %d], got %u",
                                       SAMPLER_TOP_LOGPROBS_MAX, n_top);

        int32_t best = penalize(s, logits);
        if (best < 0)
                return log_error_errno(EDOM, "sampler: all %u logits are -inf or NaN", s->n_vocab);

        int32_t token = s->p.temperature == 0 ? best : sample_tempered(s, best);
        if (ret)
                fill_logprobs(s, token, best, ret, n_top);
        return token;
}
