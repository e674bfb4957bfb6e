/* SPDX-License-Identifier: MIT */
/* The paged latent cache's page allocator (docs/design.md "The backend seam": the backend owns the
 * memory, this owns which page belongs to whom). Pages are refcounted so a prefix or snapshot page
 * can be shared by several sequences; a page returns to the free list when its last reference is
 * released. The allocator is used by the engine thread only (no locking); the counters it exports
 * are plain reads for stats.
 *
 * Budget: callers reserve every page a request can need (prompt + max output) at admission, so a
 * running request never stalls mid-generation for a page; kvcache_alloc() is all-or-nothing. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"

struct kvcache;

/* n_pages pages of page_tokens tokens each; both >= 1. */
int kvcache_new(uint32_t n_pages, uint32_t page_tokens, struct kvcache **ret);
void kvcache_free(struct kvcache *kv);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct kvcache *, kvcache_free);

uint32_t kvcache_n_pages(const struct kvcache *kv);
uint32_t kvcache_page_tokens(const struct kvcache *kv);
uint32_t kvcache_n_free(const struct kvcache *kv);
/* Pages needed to hold n_tokens positions. */
uint32_t kvcache_pages_for(const struct kvcache *kv, uint64_t n_tokens);

/* Take n pages (refcount 1 each) into pages[0..n). All or nothing: -ENOSPC, logged as
 * "cache: N pages wanted, M free of T", when fewer are free; nothing is taken then. */
int kvcache_alloc(struct kvcache *kv, uint32_t n, uint32_t *pages);
/* Add a reference to each page (sharing). -EINVAL for a page that is free or out of range, said
 * in err (error_set(), common/log.h: NULL, 0 logs it); then no reference is added. */
int kvcache_ref(struct kvcache *kv, const uint32_t *pages, uint32_t n, char *err, size_t err_size);
/* Drop one reference of each page; pages reaching 0 go back to the free list. -EINVAL (logged) on
 * a page that is already free (a double release: a bug in the caller, reported, not crashed). */
int kvcache_release(struct kvcache *kv, const uint32_t *pages, uint32_t n);
/* 0 for a free page, -EINVAL out of range. */
int kvcache_refcount(const struct kvcache *kv, uint32_t page);
