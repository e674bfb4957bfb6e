/* SPDX-License-Identifier: MIT */
#include "backend.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

uint32_t x4_batch_logits_rows(const struct x4_batch *batch) {
        uint32_t rows = 0;

        for (uint32_t i = 0; i < batch->n_seqs; i++)
                rows += x4_mode_rows(batch->seqs[i].logits, batch->seqs[i].n_tokens);
        return rows;
}

uint32_t x4_batch_hidden_rows(const struct x4_batch *batch) {
        uint32_t rows = 0;

        for (uint32_t i = 0; i < batch->n_seqs; i++)
                rows += x4_mode_rows(batch->seqs[i].hidden, batch->seqs[i].n_tokens);
        return rows;
}

uint32_t x4_nextn_logits_rows(const struct x4_nextn_batch *batch) {
        uint32_t rows = 0;

        for (uint32_t i = 0; i < batch->n_seqs; i++)
                rows += x4_mode_rows(batch->seqs[i].seq.logits, batch->seqs[i].seq.n_tokens);
        return rows;
}

uint32_t x4_nextn_hidden_rows(const struct x4_nextn_batch *batch) {
        uint32_t rows = 0;

        for (uint32_t i = 0; i < batch->n_seqs; i++)
                rows += x4_mode_rows(batch->seqs[i].seq.hidden, batch->seqs[i].seq.n_tokens);
        return rows;
}

#define REFUSE(err, ...) (snprintf(msg, msg_size, __VA_ARGS__), -(err))

static int seq_check(const struct x4_seq *s, uint32_t i, const float *logits, const float *hidden,
                     const struct x4_batch_limits *lim, char *msg, size_t msg_size) {
        {
                uint64_t end = (uint64_t) s->pos0 + s->n_tokens;

                if (s->n_tokens == 0 || !s->tokens)
                        return REFUSE(EINVAL, "sequence %u: n_tokens is 0, at least 1 expected", i);
                for (uint32_t k = 0; k < s->n_tokens; k++)
                        if (s->tokens[k] < 0 || (uint32_t) s->tokens[k] >= lim->n_vocab)
                                return REFUSE(EINVAL,
                                              "sequence %u token %u: id %d outside the vocabulary, "
                                              "expected 0..%u",
                                              i, k, s->tokens[k], lim->n_vocab - 1);
                if (s->prompt_tokens > s->n_tokens)
                        return REFUSE(EINVAL,
                                      "sequence %u: prompt_tokens %u, expected at most n_tokens "
                                      "(%u)",
                                      i, s->prompt_tokens, s->n_tokens);
                if (s->logits > X4_LOGITS_ALL)
                        return REFUSE(EINVAL, "sequence %u: logits mode %u, expected 0..2", i,
                                      s->logits);
                if (s->logits != X4_LOGITS_NONE && !logits)
                        return REFUSE(EINVAL,
                                      "sequence %u: logits requested but no output buffer", i);
                if (s->hidden > X4_LOGITS_ALL)
                        return REFUSE(EINVAL, "sequence %u: hidden mode %u, expected 0..2", i,
                                      s->hidden);
                if (s->hidden != X4_LOGITS_NONE && !hidden)
                        return REFUSE(EINVAL,
                                      "sequence %u: hidden rows requested but no output buffer", i);
                uint64_t need = (end + lim->page_tokens - 1) / lim->page_tokens;
                if (!s->pages || s->n_pages < need)
                        return REFUSE(ERANGE,
                                      "sequence %u: positions up to %llu need %llu pages of %u "
                                      "tokens, its page table has %u",
                                      i, (unsigned long long) end - 1, (unsigned long long) need,
                                      lim->page_tokens, s->pages ? s->n_pages : 0);
                for (uint64_t k = 0; k < need; k++)
                        if (s->pages[k] >= lim->n_pages)
                                return REFUSE(ERANGE,
                                              "sequence %u: page table entry %llu is page %u, the "
                                              "cache has %u pages (0..%u)",
                                              i, (unsigned long long) k, s->pages[k], lim->n_pages,
                                              lim->n_pages - 1);
        }
        return 0;
}

int x4_batch_check(const struct x4_batch *batch, const float *logits,
                   const struct x4_batch_limits *lim, char *msg, size_t msg_size) {
        if (!batch || batch->n_seqs == 0 || !batch->seqs)
                return REFUSE(EINVAL, "batch has no sequences, at least 1 expected");
        for (uint32_t i = 0; i < batch->n_seqs; i++) {
                int r = seq_check(&batch->seqs[i], i, logits, batch->hidden, lim, msg, msg_size);
                if (r < 0)
                        return r;
        }
        return 0;
}

int x4_nextn_check(const struct x4_nextn_batch *batch, const float *logits,
                   const struct x4_batch_limits *lim, bool mtp, char *msg, size_t msg_size) {
        if (!mtp)
                return REFUSE(EOPNOTSUPP, "MTP (NextN forward): the backend was created without "
                                          "MTP (mtp off)");
        if (!batch || batch->n_seqs == 0 || !batch->seqs)
                return REFUSE(EINVAL, "NextN batch has no sequences, at least 1 expected");
        for (uint32_t i = 0; i < batch->n_seqs; i++) {
                int r;

                if (!batch->seqs[i].h)
                        return REFUSE(EINVAL, "NextN sequence %u: no hidden rows (h) given", i);
                r = seq_check(&batch->seqs[i].seq, i, logits, batch->hidden, lim, msg, msg_size);
                if (r < 0)
                        return r;
        }
        return 0;
}
#undef REFUSE

void *x4_host_alloc(const struct x4_backend_ops *ops, struct x4_backend *b, size_t bytes) {
        if (ops && ops->host_alloc && ops->host_free)
                return ops->host_alloc(b, bytes);
        return malloc(bytes ? bytes : 1);
}

void x4_host_free(const struct x4_backend_ops *ops, struct x4_backend *b, void *p) {
        if (!p)
                return;
        if (ops && ops->host_alloc && ops->host_free)
                ops->host_free(b, p);
        else
                free(p);
}

float *x4_host_grow(const struct x4_backend_ops *ops, struct x4_backend *b, float **p, size_t *cap, size_t n) {
        if (n <= *cap && *p)
                return *p;
        if (n > SIZE_MAX / sizeof(float))
                return NULL;
        float *q = x4_host_alloc(ops, b, n * sizeof *q);
        if (!q)
                return NULL;
        if (*p && *cap)
                memcpy(q, *p, *cap * sizeof *q);
        x4_host_free(ops, b, *p);
        *p = q;
        *cap = n;
        return q;
}

int x4_page_check(uint32_t page, uint32_t n_pages, const char *what, char *msg, size_t msg_size) {
        if (page < n_pages)
                return 0;
        snprintf(msg, msg_size, "%s cache page %u: out of range, the cache has %u pages (0..%u)",
                 what, page, n_pages, n_pages - 1);
        return -ERANGE;
}

void x4_backend_params_default_log(int level, const char *message, void *userdata) {
        (void) userdata;
        (void) log_internal(level, 0, __FILE__, __LINE__, __func__, "%s", message);
}

#ifndef X4_CUDA_MODULE_DIR
#define X4_CUDA_MODULE_DIR ""
#endif

/* The CUDA backend lives in xing4d-cuda.so so the daemon runs where CUDA is not installed.
 * X4_CUDA_MODULE overrides the path (tests, build tree). */
static int backend_load_cuda(const struct x4_backend_ops **ret, char *err, size_t err_size) {
        static const struct x4_backend_ops *cached;
        const char *path = getenv("X4_CUDA_MODULE");
        char buf[4096];
        void *h;

        if (cached) {
                *ret = cached;
                return 0;
        }
        if (!path || !*path) {
                if (X4_CUDA_MODULE_DIR[0])
                        snprintf(buf, sizeof buf, "%s/xing4d-cuda.so", X4_CUDA_MODULE_DIR);
                else
                        snprintf(buf, sizeof buf, "xing4d-cuda.so");
                path = buf;
        }
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h)
                return error_set(err, err_size, ENOENT, "cannot load the CUDA backend module %s: %s",
                                 path, dlerror());
        const struct x4_backend_ops *ops = dlsym(h, "x4_backend_cuda");
        if (!ops) {
                dlclose(h);
                return error_set(err, err_size, ENOENT, "%s has no symbol x4_backend_cuda", path);
        }
        *ret = cached = ops;
        return 0;
}

int x4_backend_get(const char *name, const struct x4_backend_ops **ret, char *err, size_t err_size) {
        if (streq(name, "cpu")) {
                *ret = &x4_backend_cpu;
                return 0;
        }
        if (streq(name, "cuda"))
                return backend_load_cuda(ret, err, err_size);
        return error_set(err, err_size, EINVAL, "unknown device '%s': expected cpu or cuda",
                         name ? name : "(null)");
}
