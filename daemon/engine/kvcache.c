/* SPDX-License-Identifier: MIT */
#include "kvcache.h"

#include <errno.h>
#include <stdlib.h>

#include "common/log.h"

struct kvcache {
        uint32_t n_pages, page_tokens;
        uint32_t n_free;
        uint32_t *free_list; /* stack of free page ids, [0, n_free) */
        uint32_t *refs;      /* per page */
};

int kvcache_new(uint32_t n_pages, uint32_t page_tokens, struct kvcache **ret) {
        struct kvcache *kv;

        if (n_pages == 0 || page_tokens == 0)
                return log_error_errno(EINVAL, "cache: %u pages of %u tokens: both must be >= 1",
                                       n_pages, page_tokens);
        kv = calloc(1, sizeof *kv);
        if (!kv)
                return log_error_errno(ENOMEM, "cache: out of memory");
        kv->free_list = malloc((size_t) n_pages * sizeof *kv->free_list);
        kv->refs = calloc(n_pages, sizeof *kv->refs);
        if (!kv->free_list || !kv->refs) {
                kvcache_free(kv);
                return log_error_errno(ENOMEM, "cache: out of memory for %u pages", n_pages);
        }
        kv->n_pages = n_pages;
        kv->page_tokens = page_tokens;
        /* lowest ids on top of the stack: page 0 is handed out first (readable in logs/tests) */
        for (uint32_t i = 0; i < n_pages; i++)
                kv->free_list[i] = n_pages - 1 - i;
        kv->n_free = n_pages;
        *ret = kv;
        return 0;
}

void kvcache_free(struct kvcache *kv) {
        if (!kv)
                return;
        free(kv->free_list);
        free(kv->refs);
        free(kv);
}

uint32_t kvcache_n_pages(const struct kvcache *kv) {
        return kv->n_pages;
}

uint32_t kvcache_page_tokens(const struct kvcache *kv) {
        return kv->page_tokens;
}

uint32_t kvcache_n_free(const struct kvcache *kv) {
        return kv->n_free;
}

uint32_t kvcache_pages_for(const struct kvcache *kv, uint64_t n_tokens) {
        uint64_t p = DIV_ROUND_UP(n_tokens, (uint64_t) kv->page_tokens);
        return p > UINT32_MAX ? UINT32_MAX : (uint32_t) p;
}

int kvcache_alloc(struct kvcache *kv, uint32_t n, uint32_t *pages) {
        if (n > kv->n_free)
                return log_error_errno(ENOSPC, "cache: %u pages wanted, %u free of %u", n,
                                       kv->n_free, kv->n_pages);
        for (uint32_t i = 0; i < n; i++) {
                uint32_t p = kv->free_list[--kv->n_free];
                kv->refs[p] = 1;
                pages[i] = p;
        }
        return 0;
}

int kvcache_ref(struct kvcache *kv, const uint32_t *pages, uint32_t n, char *err, size_t err_size) {
        for (uint32_t i = 0; i < n; i++) {
                if (pages[i] >= kv->n_pages)
                        return error_set(err, err_size, EINVAL, "cache: page %u out of range (0..%u)",
                                         pages[i], kv->n_pages - 1);
                if (kv->refs[pages[i]] == 0)
                        return error_set(err, err_size, EINVAL, "cache: page %u is free, cannot share it",
                                         pages[i]);
        }
        for (uint32_t i = 0; i < n; i++)
                kv->refs[pages[i]]++;
        return 0;
}

int kvcache_release(struct kvcache *kv, const uint32_t *pages, uint32_t n) {
        int r = 0;
        for (uint32_t i = 0; i < n; i++) {
                uint32_t p = pages[i];
                if (p >= kv->n_pages) {
                        r = log_error_errno(EINVAL, "cache: page %u out of range (0..%u)", p,
                                            kv->n_pages - 1);
                        continue;
                }
                if (kv->refs[p] == 0) {
                        r = log_error_errno(EINVAL, "cache: page %u released but already free", p);
                        continue;
                }
                if (--kv->refs[p] == 0)
                        kv->free_list[kv->n_free++] = p;
        }
        return r;
}

int kvcache_refcount(const struct kvcache *kv, uint32_t page) {
        if (page >= kv->n_pages)
                return -EINVAL;
        return (int) kv->refs[page];
}
