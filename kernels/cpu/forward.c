/* SPDX-License-Identifier: MIT */
/* The CPU reference backend: the whole Xing4 trunk forward (docs/model.md §3-§5) behind the backend seam
 * (kernels/backend.h). Read it top to bottom: numeric helpers, the matrix engine, then one
 * function per spec step (HC pre/post §3.1, MLA §4 with YaRN §4.1, dense FFN and MoE §5), the trunk
 * (§3) that strings them together for a micro-batch of tokens, and finally the seam glue
 * (create, forward, pages).
 *
 * Numerics: fp32 everywhere (streams, statistics, gates, softmax, router, accumulations); weights
 * stay in their stored formats and are dequantized exactly, a panel of rows at a time serving
 * every token of the step (quant_dequantize_rows / quant_gemm_f32), or for one or two tokens
 * decoded in registers (quant_gemv); nothing is dequantized up front, so memory stays about the
 * size of the mapped file plus the cache.
 *
 * Determinism (docs/design.md "Numerics"): every output element is one fixed-order reduction over its
 * inputs (quant.h: the same order in every kernel and ISA variant). Threads split OUTPUT elements
 * (matrix rows, tokens), never a reduction; a batch of tokens is handled by multiplying one
 * dequantized panel of weight rows with every token (weight reuse), which does not change any
 * single dot product. Prefill and decode use the same absorbed attention code. So a token's
 * logits are bit-identical however its prompt was chunked, whatever its batch-mates, with any
 * number of threads and on any of the ISA variants. */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/quant.h"
#include "cpu/threadpool.h"
#include "gguf/ggml.h"
#include "gguf/gguf.h"
#include "model/xing4.h"
#include "common/log.h"

/* Tokens per internal micro-batch. A forward call of any size is cut into micro-batches in batch
 * order; since every token's computation is independent of its batch-mates, the cut is invisible
 * in the results. 256 keeps the workspace of the full model (H = 3584) near 80 MB. */
#define CPU_MICROBATCH 256u

/* Work (multiply-adds) below which a product, the attention or a per-token step runs on the
 * calling thread alone. A hand-off to sleeping workers costs ~50 µs on the shared VM, about the
 * time of 1M multiply-adds of the AVX-512 kernels: at batch 1 only the FFN and output products
 * were split, and the demo model's decode ran on one thread. When the machine has a core for
 * every thread the workers spin between jobs (kernels/cpu/threadpool.c) and a hand-off costs
 * about a microsecond, so products of 64K multiply-adds (~3 µs) are split too. Which thread
 * computes an output never changes its value, so this only moves time. */
#define CPU_PARALLEL_MIN_WORK (1u << 20)
#define CPU_PARALLEL_MIN_WORK_SPIN (1u << 16)

/* The per-micro-batch workspace, sized for CPU_MICROBATCH tokens. */
struct cpu_work {
        float *x;       /* [T][hc][H] the four residual streams (docs/model.md §3) */
        float *tmp;     /* [T][hc][H] normalised HC input ẑ, then the new streams */
        float *hcw;     /* [T][2hc + hc²] HC projection w */
        float *pre;     /* [T][hc] */
        float *post;    /* [T][hc] */
        float *comb;    /* [T][hc][hc] C[d][s] */
        float *u;       /* [T][H] collapsed input of the sublayer, then its RMSNorm */
        float *out;     /* [T][H] sublayer output */
        float *qa;      /* [T][q_lora] */
        float *q;       /* [T][n_head][qk_nope + qk_rope] */
        float *kv;      /* [T][kv_lora + qk_rope] */
        float *qc;      /* [T][n_head][kv_lora] absorbed queries */
        float *ohat;    /* [T][n_head][kv_lora] attention-weighted latent */
        float *o;       /* [T][n_head][v_head] */
        float *gate;    /* [T][widest FFN] dense or shared expert gate, then silu(gate) ⊙ up */
        float *up;      /* [T][widest FFN] */
        float *router;  /* [T][n_expert] */
        int32_t *sel;   /* [T][k] selected experts, in selection order */
        float *gw;      /* [T][k] their weights */
        float *xe;      /* [T·k][H] inputs gathered by expert */
        float *ge;      /* [T·k][n_ff_exp] their gate, then silu(gate) ⊙ up */
        float *ue;      /* [T·k][n_ff_exp] their up */
        float *ye;      /* [T·k][H] their outputs */
        uint32_t *row_of; /* [T][k] row of xe/ye holding (token, slot) */
        float *shared;  /* [T][H] shared expert output */
        float *hidden;  /* [T][H] final normed hidden of tokens that want logits */
        float *eh;      /* [T][2H] NextN input concat(e, g) (MTP only, else NULL) */
        float **scores; /* per thread: [n_head][max context] attention scores */
        float **qcat;   /* per thread: [n_head][kv_lora + qk_rope] one token's queries */
        float **panel;  /* per thread: MATMUL_PANEL dequantized rows of the longest row */
};

/* One token of a micro-batch. */
struct cpu_token {
        int32_t id;
        uint32_t pos;          /* absolute position in its sequence */
        const uint32_t *pages; /* its sequence's page table */
        int64_t logits_row;    /* row of the caller's logits, or -1 */
        int64_t hidden_row;    /* row of the caller's hidden, or -1 */
        const float *h;        /* NextN forward: the hidden this row combines with `id` */
};

struct x4_backend {
        const struct x4_model *model;
        const struct x4_config *cfg;
        const struct x4_weights *w;
        struct threadpool *pool;

        uint32_t n_pages, page_tokens;
        uint32_t row_width;  /* kv_lora + qk_rope = 576 on the release */
        bool mtp;            /* the NextN block runs; its layer (n_layer) is in every page */
        bool fast_bf16;      /* X4_CPU_MATH_FAST with the BF16 dot: BF16 products on bf16 inputs */
        bool fast_q8;        /* X4_CPU_MATH_FAST with AVX2 or AVX-512 VNNI: quantized products on q8 inputs */
        uint32_t n_cache_layers; /* n_layer, + 1 with MTP */
        size_t page_floats;  /* n_cache_layers * page_tokens * row_width */
        float *cache;        /* [n_pages][n_cache_layers][page_tokens][row_width] */

        float inv_freq[64];  /* docs/model.md §4.1 YaRN inverse frequencies, qk_rope/2 of them */
        struct cpu_work work;
        struct cpu_token tokens[CPU_MICROBATCH];
        struct matmul_set *mm; /* products queued for one hand-off to the pool */
        /* fast numerics: the copies of the matrices (BF16 as stored, quantized ones packed by
         * quant_q8_pack; pack_weights), sorted by tensor address */
        struct cpu_packed {
                const struct gguf_tensor *t;
                uint8_t *data;
                size_t bytes;
        } *packed;
        size_t n_packed;
        uint64_t memory_used;

        /* backend.h route_trace (diagnostics; NULL: not called) and, while a forward runs, the
         * batch index of the current micro-batch's first token (the hook's token numbering) */
        void (*route_trace)(uint32_t layer, uint32_t token, const float *scores, uint32_t n_expert,
                            const int32_t *selected, uint32_t k, void *userdata);
        void *route_trace_userdata;
        uint32_t token_base;
};

/* ---------------------------------------------------------------------------------------------
 * Numeric helpers. Every reduction has a fixed order that depends only on the vector length. */

static inline float sigmoidf(float x) {
        return 1.0f / (1.0f + expf(-x));
}

static inline float siluf(float x) {
        return x / (1.0f + expf(-x));
}

/* docs/model.md §3: RMSNorm(x, w) = w ⊙ x / sqrt(mean(x²) + eps); w == NULL is the unweighted form. */
static void rmsnorm(float *out, const float *x, const float *w, size_t n, float eps) {
        float ss = quant_dot_f32(x, x, n);
        float r = 1.0f / sqrtf(ss / (float) n + eps);

        if (w)
                for (size_t i = 0; i < n; i++)
                        out[i] = w[i] * (x[i] * r);
        else
                for (size_t i = 0; i < n; i++)
                        out[i] = x[i] * r;
}

static const float *tensor_f32(const struct gguf_tensor *t) {
        return t ? (const float *) t->data : NULL;
}

static size_t tensor_row_bytes(const struct gguf_tensor *t) {
        uint64_t rb = 0;

        /* validated at create(): every tensor we dot has whole blocks per row */
        (void) ggml_row_bytes(t->type, t->ne[0], &rb);
        return (size_t) rb;
}

/* ---------------------------------------------------------------------------------------------
 * The matrix engine: y[t][n] = W[row0 + n] · x_t for n < n_rows, t < T.
 *
 * Threads take contiguous ranges of rows. A thread dequantizes a panel of MATMUL_PANEL rows of its
 * range to fp32 once (per token tile) and multiplies it with every input of the tile
 * (quant_gemm_f32, register-tiled): weight reuse across the tokens of a step. Each output is still
 * one fixed-order dot (quant.h), so neither the panel, the tile, the thread count nor the batch
 * changes it. A "grouped" product feeds row n the input x + (n / rows_per_group) * group_stride:
 * that is how the per-head absorbed products Kbᵀ q_nope and Vb ô run as one job (a panel never
 * straddles two groups). */

struct matmul_job {
        const uint8_t *w; /* first row */
        /* fast numerics: the tensor's packed copy (NULL: none), its rows, and this job's first
         * row in it */
        const uint8_t *packed;
        size_t packed_rows, row0;
        size_t row_bytes;
        uint32_t type;
        size_t k;               /* row length */
        const float *x;
        size_t x_stride;        /* floats between tokens */
        size_t rows_per_group;
        size_t group_stride;    /* floats between groups' inputs */
        float *y;
        size_t y_stride;        /* floats between tokens */
        size_t n_tokens;
        size_t start, n_rows;   /* this job's rows in the set's index space */
        /* fast numerics: the inputs converted for the weights' kind of product, [group][token],
         * xc_row bytes a row (NULL: the fp32 reference) */
        const uint8_t *xc;
        size_t xc_row;
        uint8_t xc_kind;
};

enum { XC_NONE, XC_BF16, XC_Q8 };

/* Rows dequantized at once: 8 rows of 512 values are 16 KB (L1); of 3584, 112 KB (L2). */
#define MATMUL_PANEL 8
/* Inputs per token tile, in bytes: the tile stays in L2 while the thread's panels pass over it
 * (a whole 256-token micro-batch at K = 512, 54 tokens at K = 3584); a panel is dequantized once
 * per tile. 768 KB rather than 256: at full width a 256-token prefill spent 18% of its time
 * dequantizing with 256 KB tiles, and took 10% less CPU with 768 KB (1.5 MB was no better). */
#define MATMUL_TILE_BYTES (768u << 10)

/* Up to this many tokens, a product decodes its rows in registers for each token
 * (quant_gemv: same bits, no panel written and re-read) where the CPU variant can. */
#define MATMUL_FUSED_MAX_TOKENS 2

static bool matmul_rows_fused(const struct matmul_job *j, size_t begin, size_t end) {
        for (size_t n = begin; n < end;) {
                size_t g = n / j->rows_per_group;
                size_t n1 = MIN(end, (g + 1) * j->rows_per_group);
                const float *x = j->x + g * j->group_stride;

                for (size_t t = 0; t < j->n_tokens; t++)
                        if (!quant_gemv(j->type, j->w + n * j->row_bytes, j->row_bytes, n1 - n, j->k,
                                        x + t * j->x_stride, j->y + t * j->y_stride + n))
                                return false; /* the type has no fused kernel: nothing written */
                n = n1;
        }
        return true;
}

static void matmul_rows(const struct matmul_job *j, size_t begin, size_t end, float *panel) {
        size_t tile = MAX((size_t) 4, MATMUL_TILE_BYTES / (j->k * sizeof(float)));

        if (j->xc) { /* fast numerics: converted inputs, tiles of tokens of the same bytes */
                size_t xtile = MAX((size_t) 4, MATMUL_TILE_BYTES / j->xc_row);

                for (size_t t0 = 0; t0 < j->n_tokens; t0 += xtile) {
                        size_t nt = MIN(xtile, j->n_tokens - t0);

                        for (size_t n = begin; n < end;) {
                                size_t g = n / j->rows_per_group;
                                size_t n1 = MIN(end, (g + 1) * j->rows_per_group);
                                const uint8_t *xc = j->xc + (g * j->n_tokens + t0) * j->xc_row;
                                float *y = j->y + t0 * j->y_stride + n;

                                if (j->xc_kind == XC_BF16)
                                        quant_gemm_bf16(j->w + n * j->row_bytes, j->row_bytes, n1 - n,
                                                        j->k, (const uint16_t *) xc, j->xc_row / 2, nt,
                                                        y, j->y_stride);
                                else
                                        quant_gemm_q8(j->type, j->packed, j->packed_rows, j->k,
                                                      j->row0 + n, j->row0 + n1, xc, j->xc_row, nt, y,
                                                      j->y_stride);
                                n = n1;
                        }
                }
                return;
        }

        if (j->n_tokens <= MATMUL_FUSED_MAX_TOKENS && matmul_rows_fused(j, begin, end))
                return;

        for (size_t t0 = 0; t0 < j->n_tokens; t0 += tile) {
                size_t nt = MIN(tile, j->n_tokens - t0);

                for (size_t n = begin; n < end;) {
                        size_t g = n / j->rows_per_group;
                        size_t n1 = MIN(MIN(n + MATMUL_PANEL, end), (g + 1) * j->rows_per_group);
                        const float *x = j->x + g * j->group_stride + t0 * j->x_stride;

                        quant_dequantize_rows(j->type, j->w + n * j->row_bytes, j->row_bytes, n1 - n,
                                              j->k, panel);
                        quant_gemm_f32(panel, n1 - n, j->k, x, j->x_stride, nt,
                                       j->y + t0 * j->y_stride + n, j->y_stride);
                        n = n1;
                }
        }
}

/* Several products go to the pool in one hand-off: their rows form one index space, job after
 * job, split into contiguous ranges like a single product (so still one dot per output). This
 * keeps the wake-ups per token low: MoE runs every chosen expert's gate and up in one hand-off
 * and all their downs in a second. */
#define MATMUL_MAX_JOBS (2 * 256 + 4) /* gate + up of every expert and of the shared one */

struct matmul_set {
        float **panel; /* per thread: MATMUL_PANEL × the longest row */
        struct matmul_job jobs[MATMUL_MAX_JOBS];
        size_t n_jobs, n_rows;
        uint64_t work; /* multiply-adds queued */
        /* the fast numerics (X4_CPU_MATH_FAST): the inputs of BF16 products rounded to bf16
         * (with the CPU's BF16 dot) and of packed quantized products (quant_q8_supported) to q8 blocks (with
         * AVX-512), converted before the hand-off into xc_cap bytes (NULL: the reference) */
        uint8_t *xc;
        size_t xc_cap;
        bool fast_bf16, fast_q8;
        size_t xc_rows; /* input rows to convert in this set */
        struct xc_conv {
                const float *x;
                size_t x_stride, group_stride, n_tokens, k, n_groups;
                uint8_t kind;
                uint8_t *dst;
                size_t row;   /* bytes a converted row */
                size_t first; /* its first row in the set's xc_rows */
        } conv[MATMUL_MAX_JOBS];
        size_t n_conv;
};

static void matmul_set_rows(void *ctx, size_t begin, size_t end, unsigned thread) {
        const struct matmul_set *s = ctx;
        size_t i = 0;

        while (s->jobs[i].start + s->jobs[i].n_rows <= begin)
                i++;
        for (; i < s->n_jobs && s->jobs[i].start < end; i++) {
                const struct matmul_job *j = &s->jobs[i];

                matmul_rows(j, MAX(begin, j->start) - j->start,
                            MIN(end, j->start + j->n_rows) - j->start, s->panel[thread]);
        }
}

static int packed_cmp(const void *a, const void *b) {
        uintptr_t x = (uintptr_t) ((const struct cpu_packed *) a)->t;
        uintptr_t y = (uintptr_t) ((const struct cpu_packed *) b)->t;

        return x < y ? -1 : x > y;
}

static const struct cpu_packed *packed_find(const struct x4_backend *b, const struct gguf_tensor *W) {
        struct cpu_packed key = { .t = W };

        return b->n_packed ? bsearch(&key, b->packed, b->n_packed, sizeof key, packed_cmp) : NULL;
}

/* Queue y[t][n] = W[row0 + n] · x_{t, group(n)} for n < n_rows, t < T. */
static void matmul_add_grouped(struct x4_backend *b, const struct gguf_tensor *W, size_t row0,
                               size_t n_rows, size_t rows_per_group, size_t group_stride,
                               const float *x, size_t x_stride, float *y, size_t y_stride,
                               size_t T) {
        struct matmul_set *s = b->mm;
        size_t rb = tensor_row_bytes(W);
        const struct cpu_packed *pk = packed_find(b, W);

        if (T == 0 || n_rows == 0)
                return;
        assert(s->n_jobs < MATMUL_MAX_JOBS);
        s->jobs[s->n_jobs++] = (struct matmul_job) {
                .w = (pk && W->type == GGML_TYPE_BF16 ? pk->data : (const uint8_t *) W->data) + row0 * rb,
                .packed = pk && W->type != GGML_TYPE_BF16 ? pk->data : NULL,
                .packed_rows = pk ? (size_t) (W->n_elements / W->ne[0]) : 0,
                .row0 = row0,
                .row_bytes = rb,
                .type = W->type,
                .k = W->ne[0],
                .x = x,
                .x_stride = x_stride,
                .rows_per_group = rows_per_group,
                .group_stride = group_stride,
                .y = y,
                .y_stride = y_stride,
                .n_tokens = T,
                .start = s->n_rows,
                .n_rows = n_rows,
        };
        s->n_rows += n_rows;
        s->work += (uint64_t) n_rows * W->ne[0] * T;
}

static void matmul_add(struct x4_backend *b, const struct gguf_tensor *W, size_t row0,
                       size_t n_rows, const float *x, size_t x_stride, float *y, size_t y_stride,
                       size_t T) {
        matmul_add_grouped(b, W, row0, n_rows, n_rows, 0, x, x_stride, y, y_stride, T);
}

/* The work below which a job stays on the calling thread (CPU_PARALLEL_MIN_WORK). */
static uint64_t par_min_work(struct x4_backend *b) {
        return threadpool_handoff_cheap(b->pool) ? CPU_PARALLEL_MIN_WORK_SPIN : CPU_PARALLEL_MIN_WORK;
}

/* Fast numerics: convert the set's input rows [begin, end), in conv order. */
static void matmul_convert_rows(void *ctx, size_t begin, size_t end, unsigned thread) {
        const struct matmul_set *s = ctx;

        (void) thread;
        for (size_t i = 0; i < s->n_conv && begin < end; i++) {
                const struct xc_conv *c = &s->conv[i];

                for (; begin < end && begin < c->first + c->n_groups * c->n_tokens; begin++) {
                        size_t r = begin - c->first, g = r / c->n_tokens, t = r % c->n_tokens;
                        const float *x = c->x + g * c->group_stride + t * c->x_stride;

                        if (c->kind == XC_BF16)
                                quant_round_bf16(x, c->k, (uint16_t *) (c->dst + r * c->row));
                        else
                                quant_q8_quantize(x, c->k, c->dst + r * c->row);
                }
        }
}

/* Fast numerics: the kind of product a job takes (XC_NONE: the fp32 reference). */
static uint8_t matmul_fast_kind(const struct matmul_set *s, const struct matmul_job *j) {
        if (s->fast_bf16 && j->type == GGML_TYPE_BF16)
                return XC_BF16;
        if (s->fast_q8 && j->packed)
                return XC_Q8;
        return XC_NONE;
}

/* Fast numerics: give every job of a fast kind its converted inputs (a job with the previous
 * one's inputs and kind, e.g. q_a and kv_a, gate and up, shares them), converted by the pool
 * when there are many. */
static void matmul_prepare_fast(struct x4_backend *b) {
        struct matmul_set *s = b->mm;
        const struct matmul_job *prev = NULL;
        size_t used = 0, values = 0, prev_groups = 0;

        s->n_conv = s->xc_rows = 0;
        for (size_t i = 0; i < s->n_jobs; i++) {
                struct matmul_job *j = &s->jobs[i];
                size_t n_groups = (j->n_rows + j->rows_per_group - 1) / j->rows_per_group;
                uint8_t kind = matmul_fast_kind(s, j);

                if (kind == XC_NONE)
                        continue;
                j->xc_kind = kind;
                j->xc_row = kind == XC_BF16 ? j->k * sizeof(uint16_t) : quant_q8_row_bytes(j->k);
                /* the same inputs: the same x, stride, tokens, length and groups (q_a and kv_a
                 * differ in rows, one group each) */
                if (prev && prev->xc_kind == kind && prev->x == j->x &&
                    prev->x_stride == j->x_stride && prev->n_tokens == j->n_tokens &&
                    prev->k == j->k && prev_groups == n_groups &&
                    (n_groups == 1 || prev->group_stride == j->group_stride)) {
                        j->xc = prev->xc;
                        prev = j;
                        continue;
                }
                /* sized at create (work_alloc) for the worst a set can hold */
                assert(used + n_groups * j->n_tokens * j->xc_row + 63 <= s->xc_cap);
                s->conv[s->n_conv++] = (struct xc_conv) {
                        .x = j->x,
                        .x_stride = j->x_stride,
                        .group_stride = j->group_stride,
                        .n_tokens = j->n_tokens,
                        .k = j->k,
                        .n_groups = n_groups,
                        .kind = kind,
                        .dst = s->xc + used,
                        .row = j->xc_row,
                        .first = s->xc_rows,
                };
                j->xc = s->xc + used;
                used += (n_groups * j->n_tokens * j->xc_row + 63) & ~(size_t) 63; /* q8 scales aligned */
                s->xc_rows += n_groups * j->n_tokens;
                values += n_groups * j->n_tokens * j->k;
                prev = j;
                prev_groups = n_groups;
        }
        if (s->xc_rows == 0)
                return;
        if (values < par_min_work(b))
                matmul_convert_rows(s, 0, s->xc_rows, 0);
        else
                threadpool_run(b->pool, s->xc_rows, matmul_convert_rows, s);
}

/* Run the queued products and empty the set. */
static void matmul_run(struct x4_backend *b) {
        if (b->mm->n_rows == 0)
                return;
        if (b->mm->xc)
                matmul_prepare_fast(b);
        if (b->mm->work < par_min_work(b))
                matmul_set_rows(b->mm, 0, b->mm->n_rows, 0);
        else
                threadpool_run(b->pool, b->mm->n_rows, matmul_set_rows, b->mm);
        b->mm->n_jobs = b->mm->n_rows = 0;
        b->mm->work = 0;
}

static void matmul(struct x4_backend *b, const struct gguf_tensor *W, size_t row0, size_t n_rows,
                   const float *x, size_t x_stride, float *y, size_t y_stride, size_t T) {
        matmul_add(b, W, row0, n_rows, x, x_stride, y, y_stride, T);
        matmul_run(b);
}

static void matmul_grouped(struct x4_backend *b, const struct gguf_tensor *W, size_t row0,
                           size_t n_rows, size_t rows_per_group, size_t group_stride,
                           const float *x, size_t x_stride, float *y, size_t y_stride, size_t T) {
        matmul_add_grouped(b, W, row0, n_rows, rows_per_group, group_stride, x, x_stride, y,
                           y_stride, T);
        matmul_run(b);
}

/* ---------------------------------------------------------------------------------------------
 * docs/model.md §3.1: the mHC pre-mapping. From the four streams X of each token: the gates pre/post, the
 * doubly-stochastic mixing C, and the sublayer input u = Σ_s pre[s]·X[s]. */

static void hc_gates(const struct x4_config *c, const float *w, const float *base,
                     const float *scale, float *pre, float *post, float *C) {
        const uint32_t hc = c->hc_mult;
        float M[X4_HC_MAX][X4_HC_MAX];

        /* docs/model.md §3.1 step 4: pre[s] = σ(w[s]·scale[0] + base[s]), no eps */
        for (uint32_t s = 0; s < hc; s++)
                pre[s] = sigmoidf(w[s] * scale[0] + base[s]);
        /* step 5: post[s] = 2σ(w[hc+s]·scale[1] + base[hc+s]) */
        for (uint32_t s = 0; s < hc; s++)
                post[s] = 2.0f * sigmoidf(w[hc + s] * scale[1] + base[hc + s]);
        /* step 6: comb logits, flat index dst·hc + src, clamped BEFORE exp (docs/model.md §11.6) */
        for (uint32_t d = 0; d < hc; d++)
                for (uint32_t r = 0; r < hc; r++) {
                        uint32_t i = 2 * hc + d * hc + r;
                        float L = w[i] * scale[2] + base[i];

                        if (c->hc_clamp > 0.0f)
                                L = fminf(fmaxf(L, -c->hc_clamp), c->hc_clamp);
                        M[d][r] = L;
                }
        /* step 7: exp after subtracting the row max (over src, per dst) */
        for (uint32_t d = 0; d < hc; d++) {
                float mx = M[d][0];

                for (uint32_t r = 1; r < hc; r++)
                        mx = fmaxf(mx, M[d][r]);
                for (uint32_t r = 0; r < hc; r++)
                        M[d][r] = expf(M[d][r] - mx);
        }
        /* step 8: Sinkhorn, eps only in the denominators: (a) each dst row over src, (b) each src
         * column over dst */
        for (uint32_t it = 0; it < c->hc_sinkhorn_iters; it++) {
                for (uint32_t d = 0; d < hc; d++) {
                        float sum = 0.0f;

                        for (uint32_t r = 0; r < hc; r++)
                                sum += M[d][r];
                        for (uint32_t r = 0; r < hc; r++)
                                M[d][r] /= sum + c->hc_eps;
                }
                for (uint32_t r = 0; r < hc; r++) {
                        float sum = 0.0f;

                        for (uint32_t d = 0; d < hc; d++)
                                sum += M[d][r];
                        for (uint32_t d = 0; d < hc; d++)
                                M[d][r] /= sum + c->hc_eps;
                }
        }
        /* step 9: C = M, C[d][s] at d·hc + s */
        for (uint32_t d = 0; d < hc; d++)
                for (uint32_t r = 0; r < hc; r++)
                        C[d * hc + r] = M[d][r];
}

/* The per-token steps around the products (norms, HC gates and mixes, the MoE combine) split
 * the micro-batch's tokens over the pool: each token's values are computed by one thread with
 * the same code whatever the split. */
struct token_job {
        struct x4_backend *b;
        const float *v1, *v2; /* the step's weights */
};

static void run_tokens(struct x4_backend *b, size_t T, uint64_t work_per_token, threadpool_fn_t fn,
                       const float *v1, const float *v2) {
        struct token_job j = { .b = b, .v1 = v1, .v2 = v2 };

        if (T * work_per_token < par_min_work(b))
                fn(&j, 0, T, 0);
        else
                threadpool_run(b->pool, T, fn, &j);
}

/* docs/model.md §3.1 steps 1-2: z = concat(X[0..hc)) is each token's stream block as stored;
 * ẑ = z / sqrt(mean(z²) + eps), unweighted, over all hc·H values at once */
static void hc_norm_tokens(void *ctx, size_t begin, size_t end, unsigned thread) {
        const struct token_job *j = ctx;
        const struct x4_config *c = j->b->cfg;
        struct cpu_work *w = &j->b->work;
        const size_t zlen = (size_t) c->hc_mult * c->n_embd;

        (void) thread;
        for (size_t t = begin; t < end; t++)
                rmsnorm(w->tmp + t * zlen, w->x + t * zlen, NULL, zlen, c->rms_eps);
}

/* steps 4-9: gates from w (v1 = base, v2 = scale), then u = Σ_s pre[s]·X[s], s in order */
static void hc_gate_tokens(void *ctx, size_t begin, size_t end, unsigned thread) {
        const struct token_job *j = ctx;
        const struct x4_config *c = j->b->cfg;
        struct cpu_work *w = &j->b->work;
        const size_t H = c->n_embd, hc = c->hc_mult, zlen = hc * H, nw = 2 * hc + hc * hc;

        (void) thread;
        for (size_t t = begin; t < end; t++) {
                float *u = w->u + t * H;

                hc_gates(c, w->hcw + t * nw, j->v1, j->v2, w->pre + t * hc, w->post + t * hc,
                         w->comb + t * hc * hc);
                memset(u, 0, H * sizeof(float));
                quant_weighted_rows(w->x + t * zlen, H, hc, H, w->pre + t * hc, hc, 1, u, H);
        }
}

static void hc_pre(struct x4_backend *b, const struct gguf_tensor *fn,
                   const struct gguf_tensor *base, const struct gguf_tensor *scale, size_t T) {
        const struct x4_config *c = b->cfg;
        struct cpu_work *w = &b->work;
        const size_t H = c->n_embd, hc = c->hc_mult, zlen = hc * H, nw = 2 * hc + hc * hc;

        run_tokens(b, T, zlen, hc_norm_tokens, NULL, NULL);
        /* step 3: w = Wfn · ẑ (2hc + hc² values: pre, post, comb) */
        matmul(b, fn, 0, nw, w->tmp, zlen, w->hcw, nw, T);
        run_tokens(b, T, zlen, hc_gate_tokens, tensor_f32(base), tensor_f32(scale));
}

/* docs/model.md §3.1 post-mapping: X_new[d] = post[d]·out + Σ_s C[d][s]·X[s], all d from the OLD X. */
static void hc_post_tokens(void *ctx, size_t begin, size_t end, unsigned thread) {
        const struct token_job *j = ctx;
        const struct x4_config *c = j->b->cfg;
        struct cpu_work *w = &j->b->work;
        const size_t H = c->n_embd, hc = c->hc_mult, zlen = hc * H;

        (void) thread;
        for (size_t t = begin; t < end; t++) {
                const float *X = w->x + t * zlen, *out = w->out + t * H;
                const float *post = w->post + t * hc, *C = w->comb + t * hc * hc;
                float *Xn = w->tmp + t * zlen;

                /* every X_new[d] from post[d]·out first, then C[d][s]·X[s], s in order */
                memset(Xn, 0, zlen * sizeof(float));
                quant_weighted_rows(out, H, 1, H, post, 1, hc, Xn, H);
                quant_weighted_rows(X, H, hc, H, C, hc, hc, Xn, H);
                memcpy(w->x + t * zlen, Xn, zlen * sizeof(float));
        }
}

static void hc_post(struct x4_backend *b, size_t T) {
        const size_t hc = b->cfg->hc_mult;

        run_tokens(b, T, (hc + 1) * hc * b->cfg->n_embd, hc_post_tokens, NULL, NULL);
}

/* u = RMSNorm(u, v1) of every token */
static void norm_tokens(void *ctx, size_t begin, size_t end, unsigned thread) {
        const struct token_job *j = ctx;
        const size_t H = j->b->cfg->n_embd;
        float *u = j->b->work.u;

        (void) thread;
        for (size_t t = begin; t < end; t++)
                rmsnorm(u + t * H, u + t * H, j->v1, H, j->b->cfg->rms_eps);
}

/* ---------------------------------------------------------------------------------------------
 * docs/model.md §4.1: RoPE with YaRN frequencies. cos/sin are not magnitude-scaled. The angle p·inv_freq
 * is formed in double: at p ~ 2.6e5 a float angle would be off by ~0.03 rad. */

static void rope_angles(const struct x4_backend *b, uint32_t pos, float *cs, float *sn) {
        for (uint32_t i = 0; i < b->cfg->qk_rope / 2; i++) {
                double theta = (double) pos * (double) b->inv_freq[i];
                cs[i] = (float) cos(theta);
                sn[i] = (float) sin(theta);
        }
}

static void rope(const struct x4_backend *b, float *x, const float *cs, const float *sn) {
        const uint32_t half = b->cfg->qk_rope / 2;

        for (uint32_t i = 0; i < half; i++) {
                /* interleaved: adjacent pairs (x[2i], x[2i+1]); otherwise halves (x[i], x[i+half]) */
                uint32_t i0 = b->cfg->rope_interleave ? 2 * i : i;
                uint32_t i1 = b->cfg->rope_interleave ? 2 * i + 1 : i + half;
                float x0 = x[i0], x1 = x[i1];

                x[i0] = x0 * cs[i] - x1 * sn[i];
                x[i1] = x0 * sn[i] + x1 * cs[i];
        }
}

/* Cache row of (pages, pos) in layer l: [kv_lora normed latent c | qk_rope roped k_pe]. */
static float *cache_row(const struct x4_backend *b, const uint32_t *pages, uint32_t pos,
                        uint32_t layer) {
        uint32_t page = pages[pos / b->page_tokens], slot = pos % b->page_tokens;

        return b->cache + (size_t) page * b->page_floats +
               ((size_t) layer * b->page_tokens + slot) * b->row_width;
}

/* docs/model.md §4 absorbed attention, one token (all its heads) at a time: the scores of every head over
 * positions 0..pos of the token's own sequence, fp32 softmax, ô = Σ P·c. A cache row serves all
 * heads: the scores s[h][p] = scale·([q_c | q_pe][h] · [c | k_pe](p)) of a page's run of positions
 * are one panel product (cache rows × the token's nh concatenated queries, quant_gemm_f32: one
 * fixed-order 576-value dot each), and ô[h] += P[h][p]·c(p) runs p ascending for every head. */
struct attention_job {
        struct x4_backend *b;
        uint32_t layer;
        size_t n_tokens;
        size_t groups; /* head groups per token: 1, or the threads when a step has fewer tokens */
};

static void attention_rows(void *ctx, size_t begin, size_t end, unsigned thread) {
        const struct attention_job *j = ctx;
        struct x4_backend *b = j->b;
        const struct x4_config *c = b->cfg;
        const size_t nh = c->n_head, kvl = c->kv_lora_rank, rd = c->qk_rope, rw = b->row_width;
        const size_t qkd = c->qk_nope + c->qk_rope, T = j->n_tokens;
        const size_t ctx_max = (size_t) b->n_pages * b->page_tokens;
        float *sc = b->work.scores[thread], *qcat = b->work.qcat[thread];

        for (size_t idx = begin; idx < end; idx++) {
                /* tokens in the order 0, T-1, 1, T-2, ...: a causal batch's long and short rows
                 * pair up, so the threads' contiguous ranges get even work. With head groups
                 * (decode, fewer tokens than threads) item idx is group idx % G of token idx / G:
                 * every head's values come from the same per-head sums either way (quant.h), so
                 * the split never changes a bit */
                const size_t G = j->groups, g = idx % G, h0 = g * nh / G, h1 = (g + 1) * nh / G;
                size_t t = G > 1 ? idx / G : idx % 2 == 0 ? idx / 2 : T - 1 - idx / 2;
                const struct cpu_token *tok = &b->tokens[t];
                const size_t n_pos = (size_t) tok->pos + 1;
                float *oh = b->work.ohat + t * nh * kvl;

                for (size_t h = h0; h < h1; h++) {
                        memcpy(qcat + h * rw, b->work.qc + (t * nh + h) * kvl, kvl * sizeof(float));
                        memcpy(qcat + h * rw + kvl, b->work.q + (t * nh + h) * qkd + c->qk_nope,
                               rd * sizeof(float));
                }
                for (size_t p = 0; p < n_pos;) {
                        size_t run = MIN(b->page_tokens - p % b->page_tokens, n_pos - p);

                        quant_gemm_f32(cache_row(b, tok->pages, (uint32_t) p, j->layer), run, rw,
                                       qcat + h0 * rw, rw, h1 - h0, sc + h0 * ctx_max + p, ctx_max);
                        p += run;
                }
                for (size_t h = h0; h < h1; h++)
                        quant_softmax(sc + h * ctx_max, n_pos, c->attn_scale);
                memset(oh + h0 * kvl, 0, (h1 - h0) * kvl * sizeof(float));
                for (size_t p = 0; p < n_pos;) {
                        size_t run = MIN(b->page_tokens - p % b->page_tokens, n_pos - p);

                        /* the rows' first kvl values (c) weighted; k_pe is skipped by the stride */
                        quant_weighted_rows(cache_row(b, tok->pages, (uint32_t) p, j->layer), rw,
                                            run, kvl, sc + h0 * ctx_max + p, ctx_max, h1 - h0,
                                            oh + h0 * kvl, kvl);
                        p += run;
                }
        }
}

/* docs/model.md §4: MLA of block l for the micro-batch; input w->u (normed), output w->out. */
static void mla(struct x4_backend *b, uint32_t l, size_t T) {
        const struct x4_config *c = b->cfg;
        const struct x4_layer_weights *L = &b->w->layers[l];
        struct cpu_work *w = &b->work;
        const size_t H = c->n_embd, nh = c->n_head, kvl = c->kv_lora_rank, rw = b->row_width;
        const size_t qkd = c->qk_nope + c->qk_rope, ql = c->q_lora_rank;

        /* steps 1-2, the two products of a (one hand-off): W_qa·a and kv = W_kva·a */
        matmul_add(b, L->attn_q_a, 0, ql, w->u, H, w->qa, ql, T);
        matmul_add(b, L->attn_kv_a_mqa, 0, rw, w->u, H, w->kv, rw, T);
        matmul_run(b);
        /* step 1: qa = RMSNorm(W_qa·a, q_a_norm); q = W_qb·qa */
        for (size_t t = 0; t < T; t++)
                rmsnorm(w->qa + t * ql, w->qa + t * ql, tensor_f32(L->attn_q_a_norm), ql, c->rms_eps);
        matmul(b, L->attn_q_b, 0, nh * qkd, w->qa, ql, w->q, nh * qkd, T);
        /* step 2: c = RMSNorm(kv[0:kvl], kv_a_norm); k_pe = kv[kvl:] (not normed) */
        for (size_t t = 0; t < T; t++) {
                const struct cpu_token *tok = &b->tokens[t];
                float *kv = w->kv + t * rw;

                rmsnorm(kv, kv, tensor_f32(L->attn_kv_a_norm), kvl, c->rms_eps);
                /* step 3: RoPE on the one shared k_pe and on every head's q_pe, same position
                 * (a NextN row's position id is its slot + X4_MTP_POS_OFFSET, U5) */
                float cs[64], sn[64];
                rope_angles(b, tok->pos + (l >= c->n_layer ? X4_MTP_POS_OFFSET : 0u), cs, sn);
                rope(b, kv + kvl, cs, sn);
                for (size_t h = 0; h < nh; h++)
                        rope(b, w->q + (t * nh + h) * qkd + c->qk_nope, cs, sn);
                /* the 576-wide latent row of this token goes into its sequence's page */
                memcpy(cache_row(b, tok->pages, tok->pos, l), kv, rw * sizeof(float));
        }
        /* absorbed form: q_c[h][j] = Σ_i Kb[h][j][i]·q_nope[h][i]; attn_k_b rows are (h, j) */
        matmul_grouped(b, L->attn_k_b, 0, nh * kvl, kvl, qkd, w->q, nh * qkd, w->qc, nh * kvl, T);
        /* scores, softmax and ô over the cache, every (token, head) on its own */
        struct attention_job aj = { .b = b, .layer = l, .n_tokens = T, .groups = 1 };
        uint64_t work = 0;
        for (size_t t = 0; t < T; t++)
                work += ((uint64_t) b->tokens[t].pos + 1) * nh * rw * 2;
        size_t nt = threadpool_size(b->pool);
        if (work < par_min_work(b))
                attention_rows(&aj, 0, T, 0);
        else {
                if (T < nt)
                        aj.groups = MIN(nt, nh);
                threadpool_run(b->pool, T * aj.groups, attention_rows, &aj);
        }
        /* o[h][d] = Σ_j Vb[h][d][j]·ô[h][j]; attn_v_b rows are (h, d) */
        matmul_grouped(b, L->attn_v_b, 0, nh * c->v_head, c->v_head, kvl, w->ohat, nh * kvl, w->o,
                       nh * c->v_head, T);
        /* step 5: out = W_o · concat_h o[h] */
        matmul(b, L->attn_output, 0, H, w->o, nh * c->v_head, w->out, H, T);
}

/* ---------------------------------------------------------------------------------------------
 * docs/model.md §5: FFN. SwiGLU y = Down(silu(Gate f) ⊙ Up f) with f = w->u; the result lands in `y`. */

static void swiglu(struct x4_backend *b, const struct gguf_tensor *gate,
                   const struct gguf_tensor *up, const struct gguf_tensor *down, size_t expert,
                   const float *x, float *y, size_t T) {
        struct cpu_work *w = &b->work;
        const size_t H = b->cfg->n_embd, ff = gate->ne[1];

        matmul_add(b, gate, expert * ff, ff, x, H, w->gate, ff, T);
        matmul_add(b, up, expert * ff, ff, x, H, w->up, ff, T);
        matmul_run(b);
        for (size_t i = 0; i < T * ff; i++)
                w->gate[i] = siluf(w->gate[i]) * w->up[i];
        matmul(b, down, expert * H, H, w->gate, ff, y, H, T);
}

/* docs/model.md §5 MoE steps 1-3: fp32 router, sigmoid scores, top-k of s + bias (bias for selection only;
 * ties go to the lower expert id), weights from the unbiased scores. `ranked`, when not NULL,
 * receives the n_expert values top-k ranked (s + bias) for the route_trace hook. */
static void moe_route(const struct x4_config *c, const float *z, const float *bias, int32_t *sel,
                      float *gw, float *ranked) {
        const uint32_t E = c->n_expert, K = c->n_expert_used;
        float s[256], sum = 0.0f;
        bool taken[256] = { false };

        if (c->expert_gating == 1) {
                /* softmax gating (not the release; kept for other DeepSeek-shaped files) */
                float mx = z[0], tot = 0.0f;

                for (uint32_t e = 1; e < E; e++)
                        mx = fmaxf(mx, z[e]);
                for (uint32_t e = 0; e < E; e++) {
                        s[e] = expf(z[e] - mx);
                        tot += s[e];
                }
                for (uint32_t e = 0; e < E; e++)
                        s[e] /= tot;
        } else
                for (uint32_t e = 0; e < E; e++)
                        s[e] = sigmoidf(z[e]);

        for (uint32_t k = 0; k < K; k++) {
                int32_t best = -1;
                float best_v = 0.0f;

                for (uint32_t e = 0; e < E; e++) {
                        float v = s[e] + (bias ? bias[e] : 0.0f);

                        /* strict > keeps the lower id on ties */
                        if (!taken[e] && (best < 0 || v > best_v)) {
                                best = (int32_t) e;
                                best_v = v;
                        }
                }
                taken[best] = true;
                sel[k] = best;
                gw[k] = s[best];
        }
        if (ranked)
                /* the same sum as in the loop above, so the hook sees exactly what was ranked */
                for (uint32_t e = 0; e < E; e++)
                        ranked[e] = s[e] + (bias ? bias[e] : 0.0f);
        if (c->expert_weights_norm) {
                for (uint32_t k = 0; k < K; k++)
                        sum += gw[k];
                for (uint32_t k = 0; k < K; k++)
                        gw[k] /= sum + 1e-20f;
        }
        for (uint32_t k = 0; k < K; k++)
                gw[k] *= c->expert_weights_scale;
}

/* y = Σ_k g_k·y_k (selection order) + shared (weight 1, always on; v1 != NULL): a fixed order */
static void moe_combine_tokens(void *ctx, size_t begin, size_t end, unsigned thread) {
        const struct token_job *j = ctx;
        struct cpu_work *w = &j->b->work;
        const size_t H = j->b->cfg->n_embd, K = j->b->cfg->n_expert_used;

        (void) thread;
        for (size_t t = begin; t < end; t++) {
                float *y = w->out + t * H;

                memset(y, 0, H * sizeof(float));
                for (size_t k = 0; k < K; k++)
                        quant_weighted_rows(w->ye + (size_t) w->row_of[t * K + k] * H, H, 1, H,
                                            w->gw + t * K + k, 1, 1, y, H);
                if (j->v1) /* 1·shared: exactly shared */
                        quant_weighted_rows(w->shared + t * H, H, 1, H, j->v1, 1, 1, y, H);
        }
}

static void moe(struct x4_backend *b, uint32_t l, size_t T) {
        const struct x4_config *c = b->cfg;
        const struct x4_layer_weights *L = &b->w->layers[l];
        struct cpu_work *w = &b->work;
        const size_t H = c->n_embd, E = c->n_expert, K = c->n_expert_used;

        /* steps 1-3 */
        matmul(b, L->ffn_gate_inp, 0, E, w->u, H, w->router, E, T);
        for (size_t t = 0; t < T; t++) {
                float ranked[256];

                moe_route(c, w->router + t * E, tensor_f32(L->exp_probs_b), w->sel + t * K,
                          w->gw + t * K, b->route_trace ? ranked : NULL);
                if (b->route_trace)
                        b->route_trace(l, b->token_base + (uint32_t) t, ranked, (uint32_t) E,
                                       w->sel + t * K, (uint32_t) K, b->route_trace_userdata);
        }

        /* step 4, grouped by expert (prefill reads each expert's rows once): the inputs of the
         * (token, slot) pairs that chose expert e are gathered into rows first[e]..first[e+1) of
         * xe, in token order; row_of[t·K + k] remembers where each pair went */
        size_t n = 0, first[257];
        for (size_t e = 0; e < E; e++) {
                first[e] = n;
                for (size_t t = 0; t < T; t++)
                        for (size_t k = 0; k < K; k++)
                                if (w->sel[t * K + k] == (int32_t) e) {
                                        memcpy(w->xe + n * H, w->u + t * H, H * sizeof(float));
                                        w->row_of[t * K + k] = (uint32_t) n++;
                                }
        }
        first[E] = n;

        /* gate and up of every chosen expert and of the shared expert: one hand-off */
        const size_t ffe = L->ffn_gate_exps->ne[1];
        const size_t ffs = L->ffn_gate_shexp ? L->ffn_gate_shexp->ne[1] : 0;
        for (size_t e = 0; e < E; e++) {
                size_t ne = first[e + 1] - first[e];

                matmul_add(b, L->ffn_gate_exps, e * ffe, ffe, w->xe + first[e] * H, H,
                           w->ge + first[e] * ffe, ffe, ne);
                matmul_add(b, L->ffn_up_exps, e * ffe, ffe, w->xe + first[e] * H, H,
                           w->ue + first[e] * ffe, ffe, ne);
        }
        if (ffs) {
                matmul_add(b, L->ffn_gate_shexp, 0, ffs, w->u, H, w->gate, ffs, T);
                matmul_add(b, L->ffn_up_shexp, 0, ffs, w->u, H, w->up, ffs, T);
        }
        matmul_run(b);
        /* silu(g) ⊙ u in fp32 */
        for (size_t i = 0; i < n * ffe; i++)
                w->ge[i] = siluf(w->ge[i]) * w->ue[i];
        for (size_t i = 0; i < T * ffs; i++)
                w->gate[i] = siluf(w->gate[i]) * w->up[i];
        /* the downs: one hand-off */
        for (size_t e = 0; e < E; e++)
                matmul_add(b, L->ffn_down_exps, e * H, H, w->ge + first[e] * ffe, ffe,
                           w->ye + first[e] * H, H, first[e + 1] - first[e]);
        if (ffs)
                matmul_add(b, L->ffn_down_shexp, 0, H, w->gate, ffs, w->shared, H, T);
        matmul_run(b);

        static const float one = 1.0f;
        run_tokens(b, T, (K + 1) * H, moe_combine_tokens, ffs ? &one : NULL, NULL);
}

/* The output head (docs/model.md §3 steps 3-4, §8 step 5) for the tokens of a micro-batch that want
 * a logits or hidden row: hn = RMSNorm(pre, norm) (pre: T rows of n_embd), the hidden row (U4: hn
 * or pre), and out · hn for the logits rows, consecutive in batch order, in one product. */
static void head(struct x4_backend *b, size_t T, const float *pre, const float *norm,
                 const struct gguf_tensor *out, float *logits, float *hidden) {
        const struct x4_config *c = b->cfg;
        struct cpu_work *w = &b->work;
        const size_t H = c->n_embd;
        size_t n_out = 0;
        int64_t row0 = -1;

        for (size_t t = 0; t < T; t++) {
                const struct cpu_token *tok = &b->tokens[t];
                const float *x = pre + t * H;
                float *hn = w->hidden + n_out * H;

                if (tok->logits_row < 0 && tok->hidden_row < 0)
                        continue;
                rmsnorm(hn, x, norm, H, c->rms_eps);
                if (tok->hidden_row >= 0)
                        memcpy(hidden + (size_t) tok->hidden_row * H, X4_MTP_H_POST_NORM ? hn : x,
                               H * sizeof(float));
                if (tok->logits_row < 0)
                        continue;
                if (row0 < 0)
                        row0 = tok->logits_row;
                assert(tok->logits_row == row0 + (int64_t) n_out);
                n_out++;
        }
        if (n_out > 0)
                matmul(b, out, 0, c->n_vocab, w->hidden, H, logits + (size_t) row0 * c->n_vocab,
                       c->n_vocab, n_out);
}

/* ---------------------------------------------------------------------------------------------
 * docs/model.md §3: the trunk for one micro-batch of T tokens (b->tokens). Writes each token's cache rows
 * and, for tokens with a logits row, that row of `logits`. */

static void trunk(struct x4_backend *b, size_t T, float *logits, float *hidden) {
        const struct x4_config *c = b->cfg;
        const struct x4_weights *W = b->w;
        struct cpu_work *w = &b->work;
        const size_t H = c->n_embd, hc = c->hc_mult, zlen = hc * H;
        size_t emb_rb = tensor_row_bytes(W->token_embd);

        /* step 1: e = token_embd[id]; X[s] = e for all s */
        for (size_t t = 0; t < T; t++) {
                float *X = w->x + t * zlen;

                quant_dequantize_row(W->token_embd->type,
                                     (const uint8_t *) W->token_embd->data +
                                             (size_t) b->tokens[t].id * emb_rb,
                                     X, H);
                for (size_t s = 1; s < hc; s++)
                        memcpy(X + s * H, X, H * sizeof(float));
        }

        /* step 2: the blocks */
        for (uint32_t l = 0; l < c->n_layer; l++) {
                const struct x4_layer_weights *L = &W->layers[l];

                /* attention sublayer: HC, a = RMSNorm(u, attn_norm), o = MLA(a), post-map */
                hc_pre(b, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, T);
                run_tokens(b, T, H, norm_tokens, tensor_f32(L->attn_norm), NULL);
                mla(b, l, T);
                hc_post(b, T);

                /* FFN sublayer: HC, f = RMSNorm(u, ffn_norm), m = FFN(f), post-map */
                hc_pre(b, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, T);
                run_tokens(b, T, H, norm_tokens, tensor_f32(L->ffn_norm), NULL);
                if (L->ffn_gate_inp)
                        moe(b, l, T);
                else
                        swiglu(b, L->ffn_gate, L->ffn_up, L->ffn_down, 0, w->u, w->out, T);
                hc_post(b, T);
        }

        /* steps 3-4 for the tokens that want logits or hidden rows: h = mean of the streams (÷hc,
         * not a sum) into w->u, then the head: RMSNorm(h, output_norm), output · h */
        for (size_t t = 0; t < T; t++) {
                const float *X = w->x + t * zlen;
                const struct cpu_token *tok = &b->tokens[t];
                float *mean = w->u + t * H;

                if (tok->logits_row < 0 && tok->hidden_row < 0)
                        continue;
                for (size_t i = 0; i < H; i++) {
                        float s = X[i];

                        for (size_t k = 1; k < hc; k++)
                                s += X[k * H + i];
                        mean[i] = s / (float) hc;
                }
        }
        head(b, T, w->u, tensor_f32(W->output_norm), W->output, logits, hidden);
}

/* ---------------------------------------------------------------------------------------------
 * The seam. */

/* Cut a batch's tokens into micro-batches in batch order and run `block` (trunk, nextn_block) on
 * each; token_base numbers the route_trace tokens across micro-batches. `nseqs` (a NextN batch,
 * `seqs` unused) gives every row the hidden it combines with its id; a trunk batch's rows have
 * none. */
static void run_microbatches(struct x4_backend *b, const struct x4_seq *seqs,
                             const struct x4_nextn_seq *nseqs, uint32_t n_seqs,
                             void (*block)(struct x4_backend *b, size_t T, float *logits, float *hidden),
                             float *logits, float *hidden) {
        size_t T = 0;
        int64_t row = 0, hrow = 0;

        b->token_base = 0;
        for (uint32_t i = 0; i < n_seqs; i++) {
                const struct x4_seq *s = nseqs ? &nseqs[i].seq : &seqs[i];

                for (uint32_t k = 0; k < s->n_tokens; k++) {
                        struct cpu_token *tok = &b->tokens[T++];
                        bool last = k == s->n_tokens - 1;
                        bool want = s->logits == X4_LOGITS_ALL || (s->logits == X4_LOGITS_LAST && last);
                        bool want_h = s->hidden == X4_LOGITS_ALL || (s->hidden == X4_LOGITS_LAST && last);

                        tok->id = s->tokens[k];
                        tok->pos = s->pos0 + k;
                        tok->pages = s->pages;
                        tok->h = nseqs ? nseqs[i].h + (size_t) k * b->cfg->n_embd : NULL;
                        tok->logits_row = want ? row++ : -1;
                        tok->hidden_row = want_h ? hrow++ : -1;
                        if (T == CPU_MICROBATCH) {
                                block(b, T, logits, hidden);
                                b->token_base += (uint32_t) T;
                                T = 0;
                        }
                }
        }
        if (T > 0)
                block(b, T, logits, hidden);
}

static int cpu_forward(struct x4_backend *b, const struct x4_batch *batch, float *logits, char *err,
                       size_t err_size) {
        const struct x4_config *c = b->cfg;

        /* the seam's contract, checked before touching the cache (kernels/backend.c) */
        {
                struct x4_batch_limits lim = { .n_vocab = c->n_vocab, .n_pages = b->n_pages,
                                               .page_tokens = b->page_tokens };
                char msg[256];
                int r = x4_batch_check(batch, logits, &lim, msg, sizeof msg);
                if (r < 0)
                        return error_set(err, err_size, -r, "%s", msg);
        }

        run_microbatches(b, batch->seqs, NULL, batch->n_seqs, trunk, logits, batch->hidden);
        return 0;
}

/* ---------------------------------------------------------------------------------------------
 * docs/model.md §8: the NextN (MTP) block for one micro-batch of T rows (b->tokens: id = the token
 * at t + 1, pos = t, h = the hidden of the token at t). Writes the NextN layer's cache rows and
 * the requested draft logits / hidden rows. */

static void x_add_out(struct x4_backend *b, size_t T) {
        const size_t H = b->cfg->n_embd;
        struct cpu_work *w = &b->work;

        for (size_t i = 0; i < T * H; i++)
                w->x[i] += w->out[i];
}

static void nextn_block(struct x4_backend *b, size_t T, float *logits, float *hidden) {
        const struct x4_config *c = b->cfg;
        const struct x4_nextn_weights *N = &b->w->nextn;
        const uint32_t l = c->n_layer;
        const struct x4_layer_weights *L = &b->w->layers[l];
        struct cpu_work *w = &b->work;
        const size_t H = c->n_embd;
        size_t emb_rb = tensor_row_bytes(N->embed_tokens);

        /* steps 2-3: e = RMSNorm(embed_tokens[id], enorm), g = RMSNorm(h, hnorm),
         * x = eh_proj · concat(e, g) (embedding half first); x has stride H in w->x */
        for (size_t t = 0; t < T; t++) {
                float *eh = w->eh + t * 2 * H;

                quant_dequantize_row(N->embed_tokens->type,
                                     (const uint8_t *) N->embed_tokens->data +
                                             (size_t) b->tokens[t].id * emb_rb,
                                     eh, H);
                rmsnorm(eh, eh, tensor_f32(N->enorm), H, c->rms_eps);
                rmsnorm(eh + H, b->tokens[t].h, tensor_f32(N->hnorm), H, c->rms_eps);
        }
        matmul(b, N->eh_proj, 0, H, w->eh, 2 * H, w->x, H, T);

        /* step 4: a plain DeepSeek layer, no HC: x += MLA(RMSNorm(x, attn_norm)),
         * x += FFN(RMSNorm(x, ffn_norm)) */
        memcpy(w->u, w->x, T * H * sizeof(float));
        run_tokens(b, T, H, norm_tokens, tensor_f32(L->attn_norm), NULL);
        mla(b, l, T);
        x_add_out(b, T);
        memcpy(w->u, w->x, T * H * sizeof(float));
        run_tokens(b, T, H, norm_tokens, tensor_f32(L->ffn_norm), NULL);
        if (L->ffn_gate_inp)
                moe(b, l, T);
        else
                swiglu(b, L->ffn_gate, L->ffn_up, L->ffn_down, 0, w->u, w->out, T);
        x_add_out(b, T);

        /* step 5: logits = shared_head_head · RMSNorm(x, shared_head_norm) */
        head(b, T, w->x, tensor_f32(N->shared_head_norm), N->shared_head_head, logits, hidden);
}

static int cpu_nextn(struct x4_backend *b, const struct x4_nextn_batch *batch, float *logits,
                     char *err, size_t err_size) {
        const struct x4_config *c = b->cfg;

        {
                struct x4_batch_limits lim = { .n_vocab = c->n_vocab, .n_pages = b->n_pages,
                                               .page_tokens = b->page_tokens };
                char msg[256];
                int r = x4_nextn_check(batch, logits, &lim, b->mtp, msg, sizeof msg);
                if (r < 0)
                        return error_set(err, err_size, -r, "cpu backend: %s", msg);
        }

        run_microbatches(b, NULL, batch->seqs, batch->n_seqs, nextn_block, logits, batch->hidden);
        return 0;
}

static void work_free(struct cpu_work *w, unsigned n_threads) {
        float **fields[] = { &w->x, &w->tmp, &w->hcw, &w->pre, &w->post, &w->comb, &w->u, &w->out,
                             &w->qa, &w->q, &w->kv, &w->qc, &w->ohat, &w->o, &w->gate, &w->up,
                             &w->router, &w->gw, &w->xe, &w->ge, &w->ue, &w->ye, &w->shared, &w->hidden,
                             &w->eh };

        for (size_t i = 0; i < ELEMENTSOF(fields); i++)
                free(*fields[i]);
        free(w->sel);
        free(w->row_of);
        if (w->scores)
                for (unsigned i = 0; i < n_threads; i++)
                        free(w->scores[i]);
        free(w->scores);
        if (w->panel)
                for (unsigned i = 0; i < n_threads; i++)
                        free(w->panel[i]);
        free(w->panel);
        if (w->qcat)
                for (unsigned i = 0; i < n_threads; i++)
                        free(w->qcat[i]);
        free(w->qcat);
        memset(w, 0, sizeof *w);
}

static int work_alloc(struct x4_backend *b, uint64_t *bytes) {
        const struct x4_config *c = b->cfg;
        struct cpu_work *w = &b->work;
        const size_t T = CPU_MICROBATCH, H = c->n_embd, hc = c->hc_mult, nh = c->n_head;
        const size_t K = c->n_expert_used;
        size_t ff = 1;
        const size_t ctx = (size_t) b->n_pages * b->page_tokens;
        const unsigned nt = threadpool_size(b->pool);

        /* the widest gate/up of any FFN (dense, routed expert, shared expert), and the longest
         * row of any product (the panel) */
        size_t kmax = b->w->output->ne[0];
        if (b->mtp)
                kmax = MAX(kmax, (size_t) b->w->nextn.eh_proj->ne[0]);
        for (uint32_t l = 0; l < c->n_layer + (b->mtp ? 1u : 0u); l++) {
                const struct x4_layer_weights *L = &b->w->layers[l];
                const struct gguf_tensor *g[] = { L->ffn_gate, L->ffn_gate_exps, L->ffn_gate_shexp };
                const struct gguf_tensor *m[] = {
                        L->hc_attn_fn,    L->hc_ffn_fn,      L->attn_q_a,       L->attn_q_b,
                        L->attn_kv_a_mqa, L->attn_k_b,       L->attn_v_b,       L->attn_output,
                        L->ffn_gate,      L->ffn_up,         L->ffn_down,       L->ffn_gate_inp,
                        L->ffn_gate_exps, L->ffn_up_exps,    L->ffn_down_exps,  L->ffn_gate_shexp,
                        L->ffn_up_shexp,  L->ffn_down_shexp,
                };

                for (size_t i = 0; i < ELEMENTSOF(g); i++)
                        if (g[i])
                                ff = MAX(ff, (size_t) g[i]->ne[1]);
                for (size_t i = 0; i < ELEMENTSOF(m); i++)
                        if (m[i])
                                kmax = MAX(kmax, (size_t) m[i]->ne[0]);
        }

        struct {
                float **p;
                size_t n;
        } f[] = {
                { &w->x, T * hc * H },
                { &w->tmp, T * hc * H },
                { &w->hcw, T * (2 * hc + hc * hc) },
                { &w->pre, T * hc },
                { &w->post, T * hc },
                { &w->comb, T * hc * hc },
                { &w->u, T * H },
                { &w->out, T * H },
                { &w->qa, T * c->q_lora_rank },
                { &w->q, T * nh * (c->qk_nope + c->qk_rope) },
                { &w->kv, T * b->row_width },
                { &w->qc, T * nh * c->kv_lora_rank },
                { &w->ohat, T * nh * c->kv_lora_rank },
                { &w->o, T * nh * c->v_head },
                { &w->gate, 0 }, /* T × the widest FFN, set below */
                { &w->up, 0 },
                { &w->router, T * MAX(c->n_expert, 1u) },
                { &w->gw, T * MAX(K, 1u) },
                { &w->xe, T * MAX(K, 1u) * H },
                { &w->ge, T * MAX(K, 1u) * MAX(c->n_ff_exp, 1u) },
                { &w->ue, T * MAX(K, 1u) * MAX(c->n_ff_exp, 1u) },
                { &w->ye, T * MAX(K, 1u) * H },
                { &w->shared, T * H },
                { &w->hidden, T * H },
                { &w->eh, b->mtp ? T * 2 * H : 0 },
        };

        *bytes = 0;
        size_t largest = 0;
        for (size_t i = 0; i < ELEMENTSOF(f); i++) {
                if (f[i].p == &w->gate || f[i].p == &w->up)
                        f[i].n = T * ff;
                largest = MAX(largest, f[i].n);
                if (f[i].n == 0)
                        continue;
                *f[i].p = calloc(f[i].n, sizeof(float));
                if (!*f[i].p)
                        return -ENOMEM;
                *bytes += f[i].n * sizeof(float);
        }
        w->sel = calloc(T * MAX(K, 1u), sizeof(int32_t));
        w->row_of = calloc(T * MAX(K, 1u), sizeof(uint32_t));
        w->scores = calloc(nt, sizeof(float *));
        w->panel = calloc(nt, sizeof(float *));
        w->qcat = calloc(nt, sizeof(float *));
        if (!w->sel || !w->row_of || !w->scores || !w->panel || !w->qcat)
                return -ENOMEM;
        for (unsigned i = 0; i < nt; i++) {
                w->panel[i] = calloc(MATMUL_PANEL * kmax, sizeof(float));
                if (!w->panel[i])
                        return -ENOMEM;
        }
        b->mm->panel = w->panel;
        if (b->fast_bf16 || b->fast_q8) {
                /* a set's inputs are at most two workspace arrays (the routed experts' gathered
                 * rows and the shared expert's input), each converted at most for both kinds (a
                 * file whose gate and up differ: BF16 and a quantized type), at most 2 bytes a
                 * value each (bf16; a q8 row is 1 + 4/32 + 4/16 bytes a value, padded to 64 bytes: at
                 * most 2 for rows of 32 values and more), plus 64 bytes of alignment a job */
                b->mm->fast_bf16 = b->fast_bf16;
                b->mm->fast_q8 = b->fast_q8;
                b->mm->xc_cap = 2 * 2 * largest * sizeof(uint16_t) + MATMUL_MAX_JOBS * 64;
                b->mm->xc = aligned_alloc(64, (b->mm->xc_cap + 63) & ~(size_t) 63);
                if (!b->mm->xc)
                        return -ENOMEM;
                *bytes += b->mm->xc_cap;
        }
        *bytes += (uint64_t) nt * MATMUL_PANEL * kmax * sizeof(float);
        for (unsigned i = 0; i < nt; i++) {
                w->scores[i] = calloc(nh * ctx, sizeof(float));
                w->qcat[i] = calloc(nh * b->row_width, sizeof(float));
                if (!w->scores[i] || !w->qcat[i])
                        return -ENOMEM;
        }
        *bytes += 2 * T * K * 4 + (uint64_t) nt * (nh * ctx + nh * b->row_width) * sizeof(float);
        return 0;
}

static void cpu_destroy(struct x4_backend *b) {
        if (!b)
                return;
        if (b->pool)
                work_free(&b->work, threadpool_size(b->pool));
        threadpool_free(b->pool);
        free(b->cache);
        for (size_t i = 0; i < b->n_packed; i++)
                if (b->packed[i].data)
                        munmap(b->packed[i].data, b->packed[i].bytes);
        free(b->packed);
        if (b->mm)
                free(b->mm->xc);
        free(b->mm);
        free(b);
}
DEFINE_TRIVIAL_CLEANUP_FUNC(struct x4_backend *, cpu_destroy);

/* Check a tensor the forward reads: present, of a type quant.c computes (dot/dequant), or F32
 * when it is read directly as a vector. */
static int check_tensor(const char *what, uint32_t layer, const struct gguf_tensor *t, bool f32) {
        const struct ggml_type_info *ti;

        if (!t)
                return log_error_errno(EINVAL, "cpu backend: blk.%u.%s missing from the weight table",
                                       layer, what);
        ti = ggml_type_get(t->type);
        if (f32 && t->type != GGML_TYPE_F32)
                return log_error_errno(EINVAL, "%s: type F32 expected by the cpu backend, file has %s",
                                       t->name, ggml_type_name(t->type));
        if (!ti || !ti->computable)
                return log_error_errno(EOPNOTSUPP, "%s: type %s is not computable by the cpu backend",
                                       t->name, ggml_type_name(t->type));
        return 0;
}

struct tensor_check {
        const char *name;
        const struct gguf_tensor *t;
        bool f32;
};

/* Layer l's tensors: the `own` ones first (a trunk layer's HC, the NextN block's), then those of a
 * DeepSeek layer every layer has (norms, MLA, the FFN dense or MoE), in that order. */
static int check_layer(uint32_t l, const struct x4_layer_weights *L, const struct tensor_check *own,
                       size_t n_own) {
        bool is_moe = L->ffn_gate_inp != NULL;
        const struct tensor_check list[] = {
                { "attn_norm", L->attn_norm, true },
                { "ffn_norm", L->ffn_norm, true },
                { "attn_q_a", L->attn_q_a, false },
                { "attn_q_a_norm", L->attn_q_a_norm, true },
                { "attn_q_b", L->attn_q_b, false },
                { "attn_kv_a_mqa", L->attn_kv_a_mqa, false },
                { "attn_kv_a_norm", L->attn_kv_a_norm, true },
                { "attn_k_b", L->attn_k_b, false },
                { "attn_v_b", L->attn_v_b, false },
                { "attn_output", L->attn_output, false },
                { "ffn_gate", is_moe ? L->ffn_gate_exps : L->ffn_gate, false },
                { "ffn_up", is_moe ? L->ffn_up_exps : L->ffn_up, false },
                { "ffn_down", is_moe ? L->ffn_down_exps : L->ffn_down, false },
        };
        int r;

        for (size_t i = 0; i < n_own; i++)
                if ((r = check_tensor(own[i].name, l, own[i].t, own[i].f32)) < 0)
                        return r;
        for (size_t i = 0; i < ELEMENTSOF(list); i++)
                if ((r = check_tensor(list[i].name, l, list[i].t, list[i].f32)) < 0)
                        return r;
        if (is_moe && L->exp_probs_b && (r = check_tensor("exp_probs_b", l, L->exp_probs_b, true)) < 0)
                return r;
        if (is_moe && L->ffn_gate_shexp &&
            ((r = check_tensor("ffn_up_shexp", l, L->ffn_up_shexp, false)) < 0 ||
             (r = check_tensor("ffn_down_shexp", l, L->ffn_down_shexp, false)) < 0))
                return r;
        return 0;
}

static int check_weights(const struct x4_config *c, const struct x4_weights *W) {
        int r;

        if (c->hc_mult < 1 || c->hc_mult > X4_HC_MAX)
                return log_error_errno(EINVAL, "cpu backend: hc_mult %u, expected 1..%u", c->hc_mult,
                                       X4_HC_MAX);
        if (c->qk_rope / 2 > 64 || c->qk_rope % 2)
                return log_error_errno(EINVAL, "cpu backend: qk_rope %u, expected an even value <= 128",
                                       c->qk_rope);
        if (c->n_expert > 256 || c->n_expert_used > c->n_expert ||
            (c->n_expert > 0 && c->n_expert_used == 0))
                return log_error_errno(EINVAL,
                                       "cpu backend: %u experts with %u used, expected 1 <= used <= experts <= 256",
                                       c->n_expert, c->n_expert_used);
        if ((r = check_tensor("token_embd", 0, W->token_embd, false)) < 0 ||
            (r = check_tensor("output_norm", 0, W->output_norm, true)) < 0 ||
            (r = check_tensor("output", 0, W->output, false)) < 0)
                return r;
        for (uint32_t l = 0; l < c->n_layer; l++) {
                const struct x4_layer_weights *L = &W->layers[l];
                const struct tensor_check hc[] = {
                        { "hc_attn_fn", L->hc_attn_fn, false },
                        { "hc_attn_base", L->hc_attn_base, true },
                        { "hc_attn_scale", L->hc_attn_scale, true },
                        { "hc_ffn_fn", L->hc_ffn_fn, false },
                        { "hc_ffn_base", L->hc_ffn_base, true },
                        { "hc_ffn_scale", L->hc_ffn_scale, true },
                };

                if ((r = check_layer(l, L, hc, ELEMENTSOF(hc))) < 0)
                        return r;
        }
        return 0;
}

/* The NextN block (MTP): present in the file and of types the forward computes. */
static int check_nextn(const struct x4_config *c, const struct x4_weights *W) {
        const uint32_t l = c->n_layer;
        const struct x4_layer_weights *L = &W->layers[l];
        const struct x4_nextn_weights *N = &W->nextn;

        if (!W->has_nextn)
                return log_error_errno(EOPNOTSUPP,
                                       "cpu backend: MTP needs the model's NextN block (blk.%u): the "
                                       "file has xing4_0.nextn_predict_layers = %u%s",
                                       l, c->n_nextn, c->n_nextn ? " but not all of its tensors" : "");
        const struct tensor_check own[] = {
                { "nextn.eh_proj", N->eh_proj, false },
                { "nextn.embed_tokens", N->embed_tokens, false },
                { "nextn.shared_head_head", N->shared_head_head, false },
                { "nextn.enorm", N->enorm, true },
                { "nextn.hnorm", N->hnorm, true },
                { "nextn.shared_head_norm", N->shared_head_norm, true },
        };

        return check_layer(l, L, own, ELEMENTSOF(own));
}

/* Fast numerics: the matrices the products read are copied once, here, into memory of their own
 * on huge pages, the quantized ones packed for the integer kernels (quant_q8_pack); the mapped
 * file's pages of each are then dropped, so the copy takes their place in memory rather than
 * doubling it (memory_used counts the file once). A quantized matrix whose row length the
 * kernels do not take keeps the fp32 reference and the file's pages. */
struct pack_task {
        const struct gguf_tensor *t;
        uint8_t *dst;
        size_t rb, k, R, units; /* units: 16-row groups, the last one possibly short */
};

static void pack_units(void *ctx, size_t begin, size_t end, unsigned thread) {
        const struct pack_task *p = ctx;
        size_t r0 = begin * 16, r1 = MIN(end * 16, p->R);

        (void) thread;
        if (p->t->type == GGML_TYPE_BF16) /* a plain copy, on huge pages */
                memcpy(p->dst + r0 * p->rb, (const uint8_t *) p->t->data + r0 * p->rb, (r1 - r0) * p->rb);
        else
                quant_q8_pack(p->t->type, (const uint8_t *) p->t->data + r0 * p->rb, p->rb, r1 - r0,
                              p->k, p->dst + r0 * p->rb);
}

/* quantized matrices the integer kernels take are packed; BF16 ones are copied as they are (on
 * huge pages: at the release's width the decode step read 17% faster from the copy than from
 * the file's 4 KB pages, 2026-12-05, bench/RESULTS.md) */
static bool packable(const struct x4_backend *b, const struct gguf_tensor *t) {
        if (t && t->type == GGML_TYPE_BF16)
                return true;
        return t && b->fast_q8 && quant_q8_supported(t->type) && t->ne[0] % quant_q8_block_values(t->type) == 0;
}

/* MemAvailable of /proc/meminfo in bytes (free memory and what the kernel can reclaim, the
 * model file's page cache included), 0 when unknown */
static uint64_t mem_available(void) {
        _cleanup_fclose_ FILE *f = fopen("/proc/meminfo", "re");
        char line[128];
        uint64_t kb = 0;

        while (f && fgets(line, sizeof line, f))
                if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1)
                        return kb * 1024;
        return 0;
}

/* the bytes of a matrix's packed copy: a BF16 one as in the file, a quantized one in the integer
 * kernels' layout with its last group padded to 16 rows */
static size_t packed_copy_bytes(const struct gguf_tensor *t) {
        const size_t k = t->ne[0], R = t->n_elements / t->ne[0];
        return t->type == GGML_TYPE_BF16 ? t->size : quant_q8_packed_bytes(t->type, R, k);
}

static int pack_weights(struct x4_backend *b, const struct x4_backend_params *params) {
        const struct x4_config *c = b->cfg;
        size_t cap = 4 + (size_t) b->n_cache_layers * 17, n = 0, total = 0, done = 0;
        _cleanup_free_ const struct gguf_tensor **list = calloc(cap, sizeof *list);

        if (!list)
                return -ENOMEM;
        list[n++] = b->w->output;
        if (b->mtp) {
                list[n++] = b->w->nextn.eh_proj;
                list[n++] = b->w->nextn.shared_head_head;
        }
        for (uint32_t l = 0; l < b->n_cache_layers; l++) {
                const struct x4_layer_weights *L = &b->w->layers[l];
                const struct gguf_tensor *m[] = {
                        L->hc_attn_fn,    L->hc_ffn_fn,     L->attn_q_a,      L->attn_q_b,
                        L->attn_kv_a_mqa, L->attn_k_b,      L->attn_v_b,      L->attn_output,
                        L->ffn_gate,      L->ffn_up,        L->ffn_down,      L->ffn_gate_exps,
                        L->ffn_up_exps,   L->ffn_down_exps, L->ffn_gate_shexp, L->ffn_up_shexp,
                        L->ffn_down_shexp,
                };
                for (size_t i = 0; i < ELEMENTSOF(m); i++)
                        list[n++] = m[i];
        }
        assert(n <= cap);
        (void) c;
        b->packed = calloc(n, sizeof *b->packed);
        if (!b->packed)
                return -ENOMEM;
        const struct gguf_tensor *ref = NULL; /* a quantized matrix left on the reference */
        size_t n_ref = 0;
        for (size_t i = 0; i < n; i++)
                if (packable(b, list[i])) {
                        b->packed[b->n_packed++].t = list[i];
                        total += packed_copy_bytes(list[i]);
                } else if (list[i] && list[i]->type != GGML_TYPE_F32 && list[i]->type != GGML_TYPE_F16) {
                        ref = ref ? ref : list[i];
                        n_ref++;
                }
        if (ref) /* rows the kernels do not take */
                log_info("cpu backend: fast numerics: %zu quantized matrices (e.g. %s, %s) keep the fp32 "
                         "reference: their rows are not whole blocks of the integer kernels",
                         n_ref, ref->name, ggml_type_name(ref->type));
        qsort(b->packed, b->n_packed, sizeof *b->packed, packed_cmp);
        size_t u = 0; /* a tensor listed twice (a tied head) is packed once */
        for (size_t i = 0; i < b->n_packed; i++)
                if (u == 0 || b->packed[u - 1].t != b->packed[i].t)
                        b->packed[u++] = b->packed[i];
                else
                        total -= packed_copy_bytes(b->packed[i].t);
        b->n_packed = u;
        /* the copies are anonymous memory where the file's pages could be evicted and read again:
         * a model larger than the memory the kernel can give keeps the reference for them */
        uint64_t avail = mem_available();
        if (avail && total > avail) {
                log_warning("cpu backend: fast numerics: copying the matrices needs %.1f GiB and %.1f GiB of memory is available, so they stay in the file's pages and the quantized ones keep the fp32 reference",
                            total / 1073741824.0, avail / 1073741824.0);
                b->n_packed = 0;
                return 0;
        }

        for (size_t i = 0; i < b->n_packed; i++) {
                struct cpu_packed *pk = &b->packed[i];
                const struct gguf_tensor *t = pk->t;
                struct pack_task task = {
                        .t = t,
                        .rb = tensor_row_bytes(t),
                        .k = t->ne[0],
                        .R = t->n_elements / t->ne[0],
                };
                const size_t bytes = packed_copy_bytes(t);
                void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

                if (m == MAP_FAILED) { /* the rest keep the reference (a product uses a copy only where one exists) */
                        log_warning("cpu backend: fast numerics: cannot allocate %" PRIu64 " bytes to copy %s (%s): it and %zu more matrices stay in the file's pages (quantized ones on the fp32 reference)",
                                    (uint64_t) bytes, t->name, strerror(errno), b->n_packed - i - 1);
                        b->n_packed = i;
                        break;
                }
                pk->data = m;
                pk->bytes = bytes;
                (void) madvise(m, bytes, MADV_HUGEPAGE); /* streamed end to end every token */
                task.dst = m;
                task.units = DIV_ROUND_UP(task.R, 16);
                threadpool_run(b->pool, task.units, pack_units, &task);
                gguf_drop_pages(x4_model_gguf(b->model), t->data, t->size);
                done += t->size;
                if (params->progress && total)
                        params->progress((double) done / (double) total, "cpu: packing weights for the fast numerics",
                                         params->progress_userdata);
        }
        if (b->n_packed)
                log_info("cpu backend: fast numerics: %zu matrices (%.1f MiB) copied onto huge pages, the quantized ones packed for the integer products",
                         b->n_packed, done / 1048576.0);
        return 0;
}

/* A matrix of the trunk in a format the release does not use (a user's llama.cpp quantization:
 * Q4_K, Q5_0 ...), or NULL. */
static const struct gguf_tensor *user_format_matrix(const struct x4_backend *b) {
        for (uint32_t l = 0; l < b->cfg->n_layer; l++) {
                const struct x4_layer_weights *L = &b->w->layers[l];
                const struct gguf_tensor *m[] = { L->attn_q_a, L->attn_output, L->ffn_up, L->ffn_up_exps, L->ffn_down_exps };
                for (size_t i = 0; i < ELEMENTSOF(m); i++)
                        if (m[i] && m[i]->type != GGML_TYPE_F32 && m[i]->type != GGML_TYPE_F16 &&
                            m[i]->type != GGML_TYPE_BF16 && m[i]->type != GGML_TYPE_Q8_0 &&
                            m[i]->type != GGML_TYPE_Q6_K && m[i]->type != GGML_TYPE_IQ4_NL)
                                return m[i];
        }
        return NULL;
}

static int cpu_create_backend(const struct x4_model *model, const struct x4_backend_params *params,
                              struct x4_backend **ret) {
        _cleanup_(cpu_destroyp) struct x4_backend *b = NULL;
        const struct x4_config *c = x4_model_config(model);
        unsigned n_threads = params->n_threads;
        uint64_t page_bytes, work_bytes, cache_bytes;
        int r;

        r = check_weights(c, x4_model_weights(model));
        if (r < 0)
                return r;
        if (params->mtp && (r = check_nextn(c, x4_model_weights(model))) < 0)
                return r;
        if (params->cache_type != X4_CACHE_F32)
                return log_error_errno(EOPNOTSUPP,
                                       "cpu backend: cache type %u not supported, F32 (%u) expected",
                                       params->cache_type, X4_CACHE_F32);
        if (params->page_tokens == 0)
                return log_error_errno(EINVAL, "cpu backend: page_tokens is 0, at least 1 expected");

        b = calloc(1, sizeof *b);
        if (!b)
                return log_error_errno(ENOMEM, "cpu backend: out of memory");
        b->model = model;
        b->cfg = c;
        b->w = x4_model_weights(model);
        b->page_tokens = params->page_tokens;
        b->route_trace = params->route_trace;
        b->route_trace_userdata = params->route_trace_userdata;
        b->row_width = c->kv_lora_rank + c->qk_rope;
        b->mtp = params->mtp;
        if (params->cpu_math > X4_CPU_MATH_FAST)
                return log_error_errno(EINVAL, "cpu backend: numerics %u unknown, %u (fp32) or %u (fast) expected",
                                       params->cpu_math, X4_CPU_MATH_FP32, X4_CPU_MATH_FAST);
        b->fast_bf16 = params->cpu_math == X4_CPU_MATH_FAST && quant_bf16_dot_available();
        b->fast_q8 = params->cpu_math == X4_CPU_MATH_FAST && quant_q8_dot_available();
        if (params->cpu_math == X4_CPU_MATH_FAST && !b->fast_bf16 && !b->fast_q8)
                log_warning("cpu backend: fast numerics asked, but this CPU has neither AVX2 with FMA nor AVX-512: every product keeps the fp32 reference");
        else if (params->cpu_math == X4_CPU_MATH_FAST && !b->fast_bf16)
                log_info("cpu backend: fast numerics: this CPU has no BF16 dot instruction (AVX512_BF16), so BF16 products keep the fp32 reference");
        b->n_cache_layers = c->n_layer + (b->mtp ? 1u : 0u);
        b->page_floats = (size_t) b->n_cache_layers * b->page_tokens * b->row_width;
        page_bytes = b->page_floats * sizeof(float);
        b->n_pages = params->n_pages;
        if (b->n_pages == 0) {
                /* derive: the memory limit (default 1 GiB of cache) minus the mapped file */
                uint64_t file = gguf_file_size(x4_model_gguf(model));
                /* a limit the weights and one page cannot fit in is a mistake worth a refusal,
                 * not a daemon with a one-page context */
                if (params->memory_limit && params->memory_limit < file + page_bytes)
                        return log_error_errno(ENOSPC, "cpu backend: the memory limit of %" PRIu64 " bytes (%.1f MiB) "
                                               "cannot hold the model file (%" PRIu64 " bytes, %.1f MiB) and one cache "
                                               "page (%" PRIu64 " bytes): at least %" PRIu64 " expected",
                                               params->memory_limit, params->memory_limit / 1048576.0, file,
                                               file / 1048576.0, page_bytes, file + page_bytes);
                uint64_t budget = params->memory_limit > file ? params->memory_limit - file : (uint64_t) 1 << 30;
                uint64_t max_pages = DIV_ROUND_UP((uint64_t) c->n_ctx_train, b->page_tokens);

                b->n_pages = (uint32_t) MIN(MAX(budget / page_bytes, 1), max_pages);
        }
        if (!mul_u64_ok(page_bytes, b->n_pages, &cache_bytes) || cache_bytes > SIZE_MAX / 2)
                return log_error_errno(EOVERFLOW, "cpu backend: %u pages of %" PRIu64 " bytes overflow",
                                       b->n_pages, page_bytes);

        long n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
        if (n_threads == 0)
                n_threads = n_cpus > 0 ? (unsigned) n_cpus : 1;
        else if (n_cpus > 0 && n_threads > (unsigned long) n_cpus)
                log_warning("cpu backend: %u threads on %ld CPUs: more threads than CPUs only wait on each "
                            "other (every product waits for its slowest thread); 0 (the default) takes one a CPU",
                            n_threads, n_cpus);
        r = threadpool_new(n_threads, &b->pool);
        if (r < 0)
                return r;

        for (uint32_t i = 0; i < c->qk_rope / 2; i++)
                b->inv_freq[i] = 0.0f;
        x4_config_rope_inv_freq(c, b->inv_freq);

        b->mm = calloc(1, sizeof *b->mm);
        if (!b->mm)
                return log_error_errno(ENOMEM, "cpu backend: out of memory");
        b->cache = calloc(b->n_pages, page_bytes);
        if (!b->cache)
                return log_error_errno(ENOMEM, "cpu backend: cannot allocate the latent cache: %u pages of %" PRIu64 " bytes",
                                       b->n_pages, page_bytes);
        r = work_alloc(b, &work_bytes);
        if (r < 0)
                return log_error_errno(r, "cpu backend: cannot allocate the workspace for %u tokens",
                                       CPU_MICROBATCH);
        if (b->fast_q8 || b->fast_bf16) {
                r = pack_weights(b, params);
                if (r < 0)
                        return log_error_errno(r, "cpu backend: cannot pack the weights for the fast numerics");
        } else if (params->cpu_math == X4_CPU_MATH_FP32 && quant_q8_dot_available()) {
                const struct gguf_tensor *u = user_format_matrix(b);
                if (u) /* a user's quantization: the reference has no fused one-token kernels for it */
                        log_info("cpu backend: %s is %s, which the fp32 reference dequantizes each step; --cpu-math fast "
                                 "multiplies it in integers, several times faster (xing4d(8), --cpu-math)",
                                 u->name, ggml_type_name(u->type));
        }
        b->memory_used = gguf_file_size(x4_model_gguf(model)) + cache_bytes + work_bytes;
        if (params->progress)
                params->progress(1.0, "cpu: weights mapped", params->progress_userdata);
        *ret = TAKE_PTR(b);
        return 0;
}

/* The seam's create: the checks under it log their reason, handed back as a value in err. */
static int cpu_create(const struct x4_model *model, const struct x4_backend_params *params,
                      struct x4_backend **ret, char *err, size_t err_size) {
        log_clear_last_error();
        return log_error_value(cpu_create_backend(model, params, ret), err, err_size);
}

static void cpu_caps(struct x4_backend *b, struct x4_backend_caps *ret) {
        long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

        *ret = (struct x4_backend_caps) {
                .name = "cpu",
                .n_pages = b->n_pages,
                .page_tokens = b->page_tokens,
                .max_batch_tokens = CPU_MICROBATCH,
                .cache_type = X4_CACHE_F32,
                .mtp = b->mtp,
                .memory_used = b->memory_used,
                .memory_total = pages > 0 && psize > 0 ? (uint64_t) pages * (uint64_t) psize : 0,
        };
}

static size_t cpu_page_bytes(struct x4_backend *b) {
        return b->page_floats * sizeof(float);
}

static int check_page(struct x4_backend *b, uint32_t page, const char *what, char *err,
                      size_t err_size) {
        char msg[160];
        int r = x4_page_check(page, b->n_pages, what, msg, sizeof msg);

        return r < 0 ? error_set(err, err_size, -r, "%s", msg) : 0;
}

static int cpu_page_read(struct x4_backend *b, uint32_t page, void *dst, char *err, size_t err_size) {
        int r = check_page(b, page, "read of", err, err_size);

        if (r < 0)
                return r;
        memcpy(dst, b->cache + (size_t) page * b->page_floats, cpu_page_bytes(b));
        return 0;
}

static int cpu_page_write(struct x4_backend *b, uint32_t page, const void *src, char *err,
                          size_t err_size) {
        int r = check_page(b, page, "write of", err, err_size);

        if (r < 0)
                return r;
        memcpy(b->cache + (size_t) page * b->page_floats, src, cpu_page_bytes(b));
        return 0;
}

static int cpu_page_copy(struct x4_backend *b, uint32_t dst, uint32_t src, char *err, size_t err_size) {
        int r;

        if ((r = check_page(b, dst, "copy to", err, err_size)) < 0 ||
            (r = check_page(b, src, "copy from", err, err_size)) < 0)
                return r;
        if (dst != src)
                memcpy(b->cache + (size_t) dst * b->page_floats,
                       b->cache + (size_t) src * b->page_floats, cpu_page_bytes(b));
        return 0;
}

const struct x4_backend_ops x4_backend_cpu = {
        .name = "cpu",
        .create = cpu_create,
        .destroy = cpu_destroy,
        .forward = cpu_forward,
        .caps = cpu_caps,
        .page_bytes = cpu_page_bytes,
        .page_read = cpu_page_read,
        .page_write = cpu_page_write,
        .page_copy = cpu_page_copy,
        .nextn = cpu_nextn,
};
