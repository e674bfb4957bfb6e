/* SPDX-License-Identifier: MIT */
/* MoE routing traces of two backends and their comparison (x4-gpu-check parity and nextn;
 * unit-tested by tests/unit/test-route-compare.c). Header-only, plain C, no cmocka: the GPU
 * machine has none.
 *
 * Why: CUDA and CPU sum the router products in different orders, so a token whose k-th and
 * (k+1)-th best expert scores (docs/model.md §5: sigmoid(z) + bias, top-k ranked) lie within fp32 rounding
 * of each other can pick a different expert set on the two backends. That one swap changes the
 * token's FFN output by a whole expert's contribution, far beyond rounding, so the position's
 * logits miss the 1e-3 parity bound while every other position sits near 1e-7. The collector
 * below records, per (layer, position), what each backend ranked and chose (the backend.h
 * route_trace hook); route_compare_position() says where the sets differ and by what margin, and
 * route_judge() decides whether a position's logit error is explained by a near-tie flip
 * (route_judge_tie() with the bound of the product numerics in use, route_judge_any() for a row
 * fed by several routings). */
#pragma once

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A selection whose k-th best score leads the (k+1)-th by less than this is a near-tie. The two
 * backends' hidden states differ by fp32 rounding compounded over the layers (per-position logit
 * error median 4.2e-7 on the full synthetic model, H200), so their router scores, O(1) (sigmoid
 * in (0, 1) plus a bias of O(0.1)), differ by ~1e-6 at most; 1e-4 leaves two orders of magnitude
 * of head room, while a real fault (wrong router row, bias dropped) moves scores by O(0.1). */
#define ROUTE_NEAR_TIE 1e-4

/* The near-tie bound when the CUDA side runs its products on tensor cores with bf16 inputs
 * (X4_CUDA_MM=tc, kernels/cuda/mmtc.cu). bf16 keeps 8 significant bits: each rounding moves a
 * value by up to 2^-9 of itself, and the spacing is 2^-8 = 3.9e-3 relative. The router's input
 * (and, through every earlier layer, the hidden state it is normed from) carries that rounding, so
 * a selection score of magnitude up to ~1.2 (sigmoid in (0, 1) plus a bias of O(0.1)) may sit
 * 2^-8 relative off on the CUDA side, and the k-th and (k+1)-th scores may move in opposite
 * directions: their difference by up to 2 x 1.2 x 2^-8 = 9.4e-3, hence 1e-2 (the same 1e-2 the
 * tensor-core checks allow the logits and hidden rows, relative). A real fault (wrong router row,
 * bias dropped) still moves scores by O(0.1), ten times more. */
#define ROUTE_NEAR_TIE_BF16 1e-2

/* The near-tie bound with the f16 latent cache (X4_GPU_CACHE=f16): the cache rows, and with the
 * tensor-core decode attention the queries and p too, keep 11 significant bits, a rounding of up
 * to 2^-11 = 4.9e-4 of each value; the router's scores (magnitude up to ~1.2) downstream of them
 * may move by that relative amount in opposite directions, 2 x 1.2 x 4.9e-4 = 1.2e-3, hence 2e-3
 * (the demo model's parity at 40fec86: flips at CPU margins 1.0e-4 and 1.4e-4, every per-position
 * error median 3.5e-4). A real fault still moves scores by O(0.1). */
#define ROUTE_NEAR_TIE_F16 2e-3

/* What one backend routed: per position (the token's index in its sequence: prompt tokens first,
 * then decode steps via `offset`) and trunk layer, the n_expert ranked scores and the k ids. */
struct route_trace {
        uint32_t n_pos, n_layer, n_expert, k;
        uint32_t offset;  /* position of the hook's token 0 in the current forward */
        float *scores;    /* [n_pos][n_layer][n_expert] */
        int32_t *sel;     /* [n_pos][n_layer][k] in selection order */
        uint8_t *seen;    /* [n_pos][n_layer] 1 once traced */
        uint64_t calls;   /* hook calls */
        uint64_t dropped; /* calls outside the shape (wrong n_expert / k, position, layer) */
};

static inline int route_trace_init(struct route_trace *t, uint32_t n_pos, uint32_t n_layer,
                                   uint32_t n_expert, uint32_t k) {
        size_t cells = (size_t) n_pos * n_layer;

        memset(t, 0, sizeof *t);
        t->n_pos = n_pos;
        t->n_layer = n_layer;
        t->n_expert = n_expert;
        t->k = k;
        t->scores = calloc(cells * n_expert + 1, sizeof(float));
        t->sel = calloc(cells * k + 1, sizeof(int32_t));
        t->seen = calloc(cells + 1, 1);
        return t->scores && t->sel && t->seen ? 0 : -ENOMEM;
}

static inline void route_trace_free(struct route_trace *t) {
        free(t->scores);
        free(t->sel);
        free(t->seen);
        memset(t, 0, sizeof *t);
}

/* The backend.h route_trace hook; userdata is a struct route_trace. */
static inline void route_trace_collect(uint32_t layer, uint32_t token, const float *scores,
                                       uint32_t n_expert, const int32_t *selected, uint32_t k,
                                       void *userdata) {
        struct route_trace *t = userdata;
        uint64_t pos = (uint64_t) t->offset + token;
        size_t cell;

        t->calls++;
        if (pos >= t->n_pos || layer >= t->n_layer || n_expert != t->n_expert || k != t->k) {
                t->dropped++;
                return;
        }
        cell = (size_t) pos * t->n_layer + layer;
        memcpy(t->scores + cell * n_expert, scores, n_expert * sizeof(float));
        memcpy(t->sel + cell * k, selected, k * sizeof(int32_t));
        t->seen[cell] = 1;
}

static inline bool route_trace_has(const struct route_trace *t, uint32_t pos, uint32_t layer) {
        return pos < t->n_pos && layer < t->n_layer && t->seen[(size_t) pos * t->n_layer + layer];
}

static inline const float *route_trace_scores(const struct route_trace *t, uint32_t pos,
                                              uint32_t layer) {
        return t->scores + ((size_t) pos * t->n_layer + layer) * t->n_expert;
}

static inline const int32_t *route_trace_sel(const struct route_trace *t, uint32_t pos,
                                             uint32_t layer) {
        return t->sel + ((size_t) pos * t->n_layer + layer) * t->k;
}

/* k-th best minus (k+1)-th best of scores[0..n): how far the selection is from changing its set.
 * INFINITY when every expert is selected (k >= n). */
static inline double route_margin(const float *scores, uint32_t n, uint32_t k) {
        float kth = INFINITY, next = -INFINITY;
        bool used[256] = { false };

        if (k >= n || n > 256)
                return INFINITY;
        /* k + 1 passes of "largest not yet taken" (ties: lower index first, as the backends) */
        for (uint32_t r = 0; r <= k; r++) {
                int32_t best = -1;

                for (uint32_t e = 0; e < n; e++)
                        if (!used[e] && (best < 0 || scores[e] > scores[best]))
                                best = (int32_t) e;
                used[best] = true;
                if (r + 1 == k)
                        kth = scores[best];
                if (r == k)
                        next = scores[best];
        }
        return (double) kth - (double) next;
}

/* Whether a and b (k ids each, any order) hold the same set. */
static inline bool route_same_set(const int32_t *a, const int32_t *b, uint32_t k) {
        for (uint32_t i = 0; i < k; i++) {
                bool found = false;

                for (uint32_t j = 0; j < k && !found; j++)
                        found = a[i] == b[j];
                if (!found)
                        return false;
        }
        return true;
}

/* The ids of a (k of them) that b lacks, into out; returns how many. */
static inline uint32_t route_only_in(const int32_t *a, const int32_t *b, uint32_t k, int32_t *out) {
        uint32_t n = 0;

        for (uint32_t i = 0; i < k; i++) {
                bool found = false;

                for (uint32_t j = 0; j < k && !found; j++)
                        found = a[i] == b[j];
                if (!found)
                        out[n++] = a[i];
        }
        return n;
}

/* One position, every layer, backend a (the reference: CPU) vs b (CUDA). */
struct route_pos_cmp {
        uint32_t n_layers;       /* layers traced by both */
        uint32_t n_missing;      /* layers traced by one backend only */
        uint32_t n_differ;       /* layers whose selected sets differ */
        int32_t first_layer;     /* first differing layer, -1 if none */
        double first_margin_a, first_margin_b; /* margins there */
        int32_t tie_layer;       /* differing layer with the smallest margin on a, -1 if none */
        double min_margin_a, min_margin_b;     /* margins there */
        double max_margin_a;     /* largest margin on a among the differing layers */
};

static inline void route_compare_position(const struct route_trace *a, const struct route_trace *b,
                                          uint32_t pos, struct route_pos_cmp *ret) {
        struct route_pos_cmp c = { .first_layer = -1, .tie_layer = -1,
                                   .first_margin_a = INFINITY, .first_margin_b = INFINITY,
                                   .min_margin_a = INFINITY, .min_margin_b = INFINITY,
                                   .max_margin_a = -INFINITY };
        uint32_t n_layer = a->n_layer < b->n_layer ? a->n_layer : b->n_layer;

        for (uint32_t l = 0; l < n_layer; l++) {
                bool ha = route_trace_has(a, pos, l), hb = route_trace_has(b, pos, l);
                double ma, mb;

                if (ha != hb)
                        c.n_missing++;
                if (!ha || !hb)
                        continue;
                c.n_layers++;
                if (a->k == b->k &&
                    route_same_set(route_trace_sel(a, pos, l), route_trace_sel(b, pos, l), a->k))
                        continue;
                c.n_differ++;
                ma = route_margin(route_trace_scores(a, pos, l), a->n_expert, a->k);
                mb = route_margin(route_trace_scores(b, pos, l), b->n_expert, b->k);
                if (c.first_layer < 0) {
                        c.first_layer = (int32_t) l;
                        c.first_margin_a = ma;
                        c.first_margin_b = mb;
                }
                if (c.tie_layer < 0 || ma < c.min_margin_a) {
                        c.tie_layer = (int32_t) l;
                        c.min_margin_a = ma;
                        c.min_margin_b = mb;
                }
                if (ma > c.max_margin_a)
                        c.max_margin_a = ma;
        }
        *ret = c;
}

enum route_verdict {
        ROUTE_WITHIN = 0,       /* error within the bound */
        ROUTE_EXPLAINED,        /* over the bound, and a layer there flipped on a near-tie */
        ROUTE_FLIP_NOT_TIE,     /* over the bound; sets differ, but no flip was a near-tie */
        ROUTE_NO_FLIP,          /* over the bound with the same selections everywhere */
};

/* The rule with a near-tie bound of the caller's (ROUTE_NEAR_TIE for fp32 products on both sides,
 * ROUTE_NEAR_TIE_BF16 for bf16-input tensor-core products): a position over the bound must have
 * a differing selection at that position whose margin on the reference side is under near_tie.
 * A position whose traces are incomplete (n_missing) and have no near-tie flip is not explained
 * either: NO_FLIP. */
static inline enum route_verdict route_judge_tie(double err, double bound,
                                                 const struct route_pos_cmp *c, double near_tie) {
        if (err <= bound)
                return ROUTE_WITHIN;
        if (c->n_differ == 0)
                return ROUTE_NO_FLIP;
        return c->min_margin_a < near_tie ? ROUTE_EXPLAINED : ROUTE_FLIP_NOT_TIE;
}

/* The parity rule with fp32 products: route_judge_tie at ROUTE_NEAR_TIE. */
static inline enum route_verdict route_judge(double err, double bound, const struct route_pos_cmp *c) {
        return route_judge_tie(err, bound, c, ROUTE_NEAR_TIE);
}

/* A row fed by several routings (x4-gpu-check nextn: a NextN row at position r takes the trunk's
 * hidden of r and runs the NextN block's own MoE at r): c[0..n) are the comparisons of each
 * routing at the row's position. The row is explained when any of them is (a near-tie flip under
 * near_tie); else FLIP_NOT_TIE when any has a flip, else NO_FLIP. *which: the index of the
 * explaining comparison (the one with the smallest reference margin among the near-tie flips),
 * else of the first one with a flip, else -1. */
static inline enum route_verdict route_judge_any(double err, double bound,
                                                 const struct route_pos_cmp *c, uint32_t n,
                                                 double near_tie, int32_t *which) {
        enum route_verdict best = ROUTE_NO_FLIP;
        int32_t at = -1;

        if (err <= bound) {
                *which = -1;
                return ROUTE_WITHIN;
        }
        for (uint32_t i = 0; i < n; i++) {
                enum route_verdict v = route_judge_tie(err, bound, &c[i], near_tie);

                if (v == ROUTE_EXPLAINED &&
                    (best != ROUTE_EXPLAINED || c[i].min_margin_a < c[at].min_margin_a)) {
                        best = ROUTE_EXPLAINED;
                        at = (int32_t) i;
                } else if (v == ROUTE_FLIP_NOT_TIE && best == ROUTE_NO_FLIP) {
                        best = ROUTE_FLIP_NOT_TIE;
                        at = (int32_t) i;
                }
        }
        *which = at;
        return best;
}

static inline const char *route_verdict_name(enum route_verdict v) {
        switch (v) {
        case ROUTE_WITHIN:
                return "within bound";
        case ROUTE_EXPLAINED:
                return "explained (near-tie flip)";
        case ROUTE_FLIP_NOT_TIE:
                return "NOT explained (flip is not a near-tie)";
        case ROUTE_NO_FLIP:
                return "NOT explained (no routing flip)";
        }
        return "?";
}
