/* SPDX-License-Identifier: MIT */
/* A stand-in backend module for test-bench-cli.c, which compiles it into a shared object at test
 * time and hands it to x4-bench as the "cuda" device (X4_CUDA_MODULE). Not a test itself (meson
 * builds only tests/unit/test-*.c).
 *
 * It computes nothing. It writes every call x4-bench makes to the file $X4_FAKE_TRACE, one line
 * each, so the test can check the cache layout, the decode setup's prefills and page copies and
 * when profiling is on; and it has the optional profile op, with fixed counts per forward, so the
 * test can check the report's arithmetic where no GPU is:
 * per forward 10 kernels: "attention" 2 kernels, 0.5 ms; "experts" 8 kernels, 1.5 ms. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"

struct x4_backend {
        FILE *trace;
        uint32_t n_pages, page_tokens, cache_type;
        bool profiling;
        uint64_t forwards;
};

static int fake_create(const struct x4_model *model, const struct x4_backend_params *params,
                       struct x4_backend **ret, char *err, size_t err_size) {
        const char *path = getenv("X4_FAKE_TRACE");
        struct x4_backend *b;

        (void) model, (void) err, (void) err_size;
        if (params->n_pages == 0 || params->page_tokens == 0)
                return -EINVAL;
        b = calloc(1, sizeof *b);
        if (!b)
                return -ENOMEM;
        b->trace = fopen(path ? path : "/dev/null", "we");
        if (!b->trace) {
                free(b);
                return -errno;
        }
        b->n_pages = params->n_pages;
        b->page_tokens = params->page_tokens;
        b->cache_type = params->cache_type;
        fprintf(b->trace, "create pages=%u page_tokens=%u cache=%u\n", b->n_pages, b->page_tokens,
                b->cache_type);
        *ret = b;
        return 0;
}

static void fake_destroy(struct x4_backend *b) {
        fprintf(b->trace, "destroy\n");
        fclose(b->trace);
        free(b);
}

/* "fwd" and per sequence " pos0+n_tokens@page,page,..": the page table up to the last new
 * token's page only, so the line shows what the forward reads */
static int fake_forward(struct x4_backend *b, const struct x4_batch *batch, float *logits, char *err,
                        size_t err_size) {
        (void) logits;
        (void) err;
        (void) err_size;
        fprintf(b->trace, "fwd");
        for (uint32_t i = 0; i < batch->n_seqs; i++) {
                const struct x4_seq *s = &batch->seqs[i];
                uint32_t end = s->pos0 + s->n_tokens;
                uint32_t used = (end + b->page_tokens - 1) / b->page_tokens;

                if (s->n_tokens == 0 || used > s->n_pages)
                        return -ERANGE;
                /* the whole table must name pages of the cache, not only the part this reads */
                for (uint32_t k = 0; k < s->n_pages; k++)
                        if (s->pages[k] >= b->n_pages)
                                return -ERANGE;
                fprintf(b->trace, " %u+%u@", s->pos0, s->n_tokens);
                for (uint32_t k = 0; k < used; k++)
                        fprintf(b->trace, "%s%u", k ? "," : "", s->pages[k]);
        }
        fprintf(b->trace, "\n");
        if (b->profiling)
                b->forwards++;
        return 0;
}

static void fake_caps(struct x4_backend *b, struct x4_backend_caps *ret) {
        *ret = (struct x4_backend_caps) {
                .name = "cuda:fake",
                .n_pages = b->n_pages,
                .page_tokens = b->page_tokens,
                .max_batch_tokens = 1u << 20,
                .cache_type = b->cache_type,
        };
}

static size_t fake_page_bytes(struct x4_backend *b) {
        (void) b;
        return 0;
}

static int fake_page_io(struct x4_backend *b, uint32_t page, void *buf, char *err, size_t err_size) {
        (void) buf;
        (void) err;
        (void) err_size;
        return page < b->n_pages ? 0 : -ERANGE;
}

static int fake_page_write(struct x4_backend *b, uint32_t page, const void *src, char *err,
                           size_t err_size) {
        (void) src;
        (void) err;
        (void) err_size;
        return page < b->n_pages ? 0 : -ERANGE;
}

static int fake_page_copy(struct x4_backend *b, uint32_t dst, uint32_t src, char *err,
                          size_t err_size) {
        (void) err;
        (void) err_size;
        if (dst >= b->n_pages || src >= b->n_pages)
                return -ERANGE;
        fprintf(b->trace, "copy %u<-%u\n", dst, src);
        return 0;
}

static int fake_profile(struct x4_backend *b, bool on, struct x4_backend_profile *ret) {
        fprintf(b->trace, "profile %s\n", on ? "on" : "off");
        if (on)
                b->forwards = 0;
        b->profiling = on;
        if (ret) {
                /* in the order a backend might list them: not sorted by time */
                *ret = (struct x4_backend_profile) {
                        .forwards = b->forwards,
                        .kernels = 10 * b->forwards,
                        .n_classes = 2,
                };
                ret->classes[0].name = "attention";
                ret->classes[0].kernels = 2 * b->forwards;
                ret->classes[0].ms = 0.5 * (double) b->forwards;
                ret->classes[1].name = "experts";
                ret->classes[1].kernels = 8 * b->forwards;
                ret->classes[1].ms = 1.5 * (double) b->forwards;
                ret->classes[1].bytes = 3000000000ull * b->forwards; /* attention's: not counted (0) */
        }
        return 0;
}

__attribute__((visibility("default"))) const struct x4_backend_ops x4_backend_cuda = {
        .name = "cuda",
        .create = fake_create,
        .destroy = fake_destroy,
        .forward = fake_forward,
        .caps = fake_caps,
        .page_bytes = fake_page_bytes,
        .page_read = fake_page_io,
        .page_write = fake_page_write,
        .page_copy = fake_page_copy,
        .profile = fake_profile,
};
