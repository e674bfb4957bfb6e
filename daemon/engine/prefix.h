/* SPDX-License-Identifier: MIT */
/* The automatic prefix store (docs/design.md "Threads and flow of one request", step 2): a trie over
 * token ids at page granularity. Each node is one FULL cache page (page_tokens token ids as its
 * key) and holds one kvcache reference to the page that caches those positions; its parent is the
 * page before it. A new request whose prompt starts with k stored pages takes a reference to each
 * (kvcache_ref) and prefills only the rest.
 *
 * Why full pages only: a page is only written while its positions are being prefilled or decoded,
 * so a full page of a prompt never changes again and can be read by any number of sequences. A
 * partially matching last page is not shared (no copy-on-write): its tokens are recomputed, which
 * keeps the invariant simple (reused pages are bit-identical to recomputation because the backends
 * compute a position's cache row from tokens 0..p only, batch- and chunk-invariantly).
 *
 * Classes: a backend with x4_backend_caps.prompt_class computes a request's prompt tokens on other
 * kernels than the tokens it generated, so a page's bytes depend on which of its positions were
 * prompt tokens. Each node keeps that count (its first `prompt` tokens) and a page matches only a
 * request whose own classes at those positions are the same: turn 2 of a chat, whose prompt holds
 * turn 1's answer, reuses turn 1's prompt pages and computes the answer's pages again as prompt
 * tokens; a preempted request resuming finds its own pages. Its logits then never depend on what
 * the store happened to hold.
 *
 * Budget and eviction: the store holds at most max_pages pages. Pages only the store references
 * (refcount 1) are evictable, least recently used LEAVES first (a parent is only evicted after its
 * children, so every stored path stays a valid prefix). Engine thread only, no locking. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"

struct kvcache;
struct prefix_store;

struct prefix_stats {
        uint64_t hits;          /* lookups that reused >= 1 page */
        uint64_t misses;        /* lookups that reused none */
        uint64_t tokens_reused; /* sum of reused tokens */
        uint64_t evicted;       /* pages given back to the cache */
        uint32_t pages_held;    /* nodes (pages) in the store now */
        uint32_t pages_idle;    /* of those, pages no request uses (evictable: free for admission) */
};

/* max_pages: the most pages the store may hold (0 = as many as the cache has); classes: the
 * backend's x4_backend_caps.prompt_class (false: every page matches whatever its classes). */
int prefix_new(struct kvcache *kv, uint32_t max_pages, bool classes, struct prefix_store **ret);
/* Drops every reference the store holds. */
void prefix_free(struct prefix_store *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct prefix_store *, prefix_free);

/* The longest stored prefix of tokens[0..n) in full pages, at most max_pages of them, where the
 * sequence's first n_prompt tokens are its prompt (its classes; see above). Writes the
 * page ids into pages[], takes one reference to each for the caller (release them with
 * kvcache_release) and marks them recently used. Returns the number of pages (0: none). */
uint32_t prefix_match(struct prefix_store *p, const int32_t *tokens, uint64_t n, uint64_t n_prompt,
                      uint32_t max_pages, uint32_t *pages);
/* Count one admission in the stats: a hit reusing n_pages pages, or a miss (0). Separate from
 * prefix_match() because an admission may be retried (not enough free pages yet). */
void prefix_count(struct prefix_store *p, uint32_t n_pages);

/* Store the full pages of a sequence: tokens[0..n) cached in pages[0..) (pages[i] holds positions
 * i*page_tokens ..), its first n_prompt tokens computed as its prompt. Pages already stored (same token path) are only marked used; new nodes take a
 * reference to the caller's page. Stops (without error) when the budget is full and nothing can
 * be evicted. Returns the number of pages newly stored, or -ENOMEM. */
int prefix_insert(struct prefix_store *p, const int32_t *tokens, uint64_t n, uint64_t n_prompt,
                  const uint32_t *pages, uint32_t n_pages);

/* Give back up to `want` pages that only the store references, least recently used leaves first.
 * Returns the number of pages that went back to the cache's free list. */
uint32_t prefix_evict(struct prefix_store *p, uint32_t want);

void prefix_get_stats(const struct prefix_store *p, struct prefix_stats *ret);
