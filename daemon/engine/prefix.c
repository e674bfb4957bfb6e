/* SPDX-License-Identifier: MIT */
#include "prefix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kvcache.h"

struct node {
        struct node *parent, *child, *sibling;
        uint32_t page;
        uint32_t n_children;
        uint32_t index; /* in store->nodes */
        uint64_t last_used;
        uint32_t prompt; /* how many of its tokens (the first) were computed as prompt tokens */
        int32_t tokens[]; /* page_tokens ids */
};

struct prefix_store {
        struct kvcache *kv;
        uint32_t page_tokens, max_pages;
        bool classes; /* the backend computes prompt and generated tokens differently */
        struct node *root; /* no page, no tokens */
        struct node **nodes; /* every node but the root, for eviction scans */
        uint32_t n_nodes, cap_nodes;
        uint64_t tick;
        struct prefix_stats st;
};

int prefix_new(struct kvcache *kv, uint32_t max_pages, bool classes, struct prefix_store **ret) {
        struct prefix_store *p = calloc(1, sizeof *p);
        if (!p)
                return log_error_errno(ENOMEM, "prefix store: out of memory");
        p->root = calloc(1, sizeof *p->root);
        if (!p->root) {
                free(p);
                return log_error_errno(ENOMEM, "prefix store: out of memory");
        }
        p->kv = kv;
        p->classes = classes;
        p->page_tokens = kvcache_page_tokens(kv);
        p->max_pages = max_pages ? MIN(max_pages, kvcache_n_pages(kv)) : kvcache_n_pages(kv);
        *ret = p;
        return 0;
}

void prefix_free(struct prefix_store *p) {
        if (!p)
                return;
        for (uint32_t i = 0; i < p->n_nodes; i++) {
                (void) kvcache_release(p->kv, &p->nodes[i]->page, 1);
                free(p->nodes[i]);
        }
        free(p->nodes);
        free(p->root);
        free(p);
}

/* The prompt-class tokens of page k of a sequence whose first n_prompt tokens are its prompt
 * (all of them when the backend has no classes). */
static uint32_t page_prompt(const struct prefix_store *p, uint64_t k, uint64_t n_prompt) {
        uint64_t start = k * p->page_tokens;
        if (!p->classes || n_prompt >= start + p->page_tokens)
                return p->page_tokens;
        return n_prompt > start ? (uint32_t) (n_prompt - start) : 0;
}

static struct node *find_child(const struct prefix_store *p, const struct node *parent,
                               const int32_t *tokens, uint32_t prompt) {
        for (struct node *c = parent->child; c; c = c->sibling)
                if (c->prompt == prompt &&
                    memcmp(c->tokens, tokens, p->page_tokens * sizeof *tokens) == 0)
                        return c;
        return NULL;
}

uint32_t prefix_match(struct prefix_store *p, const int32_t *tokens, uint64_t n, uint64_t n_prompt,
                      uint32_t max_pages, uint32_t *pages) {
        const struct node *at = p->root;
        uint32_t k = 0;
        uint64_t full = n / p->page_tokens;

        p->tick++;
        while (k < max_pages && k < full) {
                struct node *c = find_child(p, at, tokens + (uint64_t) k * p->page_tokens,
                                            page_prompt(p, k, n_prompt));
                if (!c)
                        break;
                c->last_used = p->tick;
                pages[k++] = c->page;
                at = c;
        }
        /* the pages are in the store, so they are referenced: this cannot fail */
        if (k && kvcache_ref(p->kv, pages, k, NULL, 0) < 0)
                k = 0;
        return k;
}

void prefix_count(struct prefix_store *p, uint32_t n_pages) {
        if (n_pages) {
                p->st.hits++;
                p->st.tokens_reused += (uint64_t) n_pages * p->page_tokens;
        } else
                p->st.misses++;
}

static void unlink_node(struct prefix_store *p, struct node *c) {
        struct node *parent = c->parent;
        for (struct node **l = &parent->child; *l; l = &(*l)->sibling)
                if (*l == c) {
                        *l = c->sibling;
                        break;
                }
        parent->n_children--;
        p->nodes[c->index] = p->nodes[--p->n_nodes];
        p->nodes[c->index]->index = c->index;
}

/* keep: a node that must stay (the node an insert is attaching to) */
static uint32_t evict(struct prefix_store *p, uint32_t want, const struct node *keep) {
        uint32_t freed = 0;

        while (freed < want) {
                struct node *victim = NULL;
                for (uint32_t i = 0; i < p->n_nodes; i++) {
                        struct node *c = p->nodes[i];
                        if (c == keep || c->n_children || kvcache_refcount(p->kv, c->page) != 1)
                                continue;
                        if (!victim || c->last_used < victim->last_used)
                                victim = c;
                }
                if (!victim)
                        break;
                unlink_node(p, victim);
                (void) kvcache_release(p->kv, &victim->page, 1);
                free(victim);
                freed++;
                p->st.evicted++;
        }
        return freed;
}

uint32_t prefix_evict(struct prefix_store *p, uint32_t want) {
        return evict(p, want, NULL);
}

int prefix_insert(struct prefix_store *p, const int32_t *tokens, uint64_t n, uint64_t n_prompt,
                  const uint32_t *pages, uint32_t n_pages) {
        struct node *at = p->root;
        uint64_t full = MIN(n / p->page_tokens, (uint64_t) n_pages);
        int added = 0;

        p->tick++;
        for (uint64_t k = 0; k < full; k++) {
                const int32_t *key = tokens + k * p->page_tokens;
                uint32_t prompt = page_prompt(p, k, n_prompt);
                struct node *c = find_child(p, at, key, prompt);
                if (c) {
                        c->last_used = p->tick;
                        at = c;
                        continue;
                }
                /* make room; the path walked so far is touched now, so it is not the LRU leaf */
                if (p->n_nodes >= p->max_pages && evict(p, 1, at) == 0)
                        break;
                if (p->n_nodes == p->cap_nodes) {
                        uint32_t cap = MAX(p->cap_nodes * 2, 64u);
                        struct node **a = realloc(p->nodes, cap * sizeof *a);
                        if (!a)
                                return log_error_errno(ENOMEM, "prefix store: out of memory");
                        p->nodes = a;
                        p->cap_nodes = cap;
                }
                c = calloc(1, sizeof *c + p->page_tokens * sizeof *c->tokens);
                if (!c)
                        return log_error_errno(ENOMEM, "prefix store: out of memory");
                char why[256];
                if (kvcache_ref(p->kv, &pages[k], 1, why, sizeof why) < 0) {
                        free(c);
                        return log_error_errno(EINVAL, "prefix store: page %u of position %llu "
                                               "is not allocated: %s", pages[k],
                                               (unsigned long long) (k * p->page_tokens), why);
                }
                memcpy(c->tokens, key, p->page_tokens * sizeof *key);
                c->page = pages[k];
                c->prompt = prompt;
                c->last_used = p->tick;
                c->parent = at;
                c->sibling = at->child;
                at->child = c;
                at->n_children++;
                c->index = p->n_nodes;
                p->nodes[p->n_nodes++] = c;
                added++;
                at = c;
        }
        return added;
}

void prefix_get_stats(const struct prefix_store *p, struct prefix_stats *ret) {
        *ret = p->st;
        ret->pages_held = p->n_nodes;
        ret->pages_idle = 0;
        for (uint32_t i = 0; i < p->n_nodes; i++)
                ret->pages_idle += kvcache_refcount(p->kv, p->nodes[i]->page) == 1;
}
