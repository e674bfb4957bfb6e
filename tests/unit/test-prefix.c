/* SPDX-License-Identifier: MIT */
/* Prefix store: the longest stored prefix is found in whole pages only, matched pages are shared
 * (refcount), pages come back to the cache when evicted, least recently used leaves first, and
 * pages a request still uses are never evicted. Page size 4 tokens to keep the cases readable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/kvcache.h"
#include "engine/prefix.h"
#include "common/log.h"

#define PT 4

/* A request: allocate pages for n tokens, as the scheduler does. */
static void take(struct kvcache *kv, uint32_t n_pages, uint32_t *pages) {
        assert_int_equal(kvcache_alloc(kv, n_pages, pages), 0);
}

static void test_match_whole_pages_only(void **state) {
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        _cleanup_(prefix_freep) struct prefix_store *ps = NULL;
        int32_t a[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
        uint32_t pa[3], m[3];
        struct prefix_stats st;

        assert_int_equal(kvcache_new(16, PT, &kv), 0);
        assert_int_equal(prefix_new(kv, 0, false, &ps), 0);
        assert_int_equal(prefix_match(ps, a, 10, 10, 3, m), 0); /* empty store */
        prefix_count(ps, 0);
        take(kv, 3, pa);
        /* 10 tokens: 2 full pages stored, the partial third is not */
        assert_int_equal(prefix_insert(ps, a, 10, 10, pa, 3), 2);
        assert_int_equal(kvcache_refcount(kv, pa[0]), 2);
        assert_int_equal(kvcache_refcount(kv, pa[2]), 1);
        /* inserting again adds nothing */
        assert_int_equal(prefix_insert(ps, a, 10, 10, pa, 3), 0);
        assert_int_equal(kvcache_release(kv, pa, 3), 0);
        assert_int_equal(kvcache_n_free(kv), 14);

        /* same first page, different second: 1 page reused */
        int32_t b[9] = { 1, 2, 3, 4, 5, 6, 7, 99, 11 };
        assert_int_equal(prefix_match(ps, b, 9, 9, 3, m), 1);
        assert_int_equal(m[0], pa[0]);
        assert_int_equal(kvcache_refcount(kv, pa[0]), 2);
        assert_int_equal(kvcache_release(kv, m, 1), 0);
        /* full match, but the caller caps it (it must compute at least one token) */
        assert_int_equal(prefix_match(ps, a, 8, 8, 1, m), 1);
        assert_int_equal(kvcache_release(kv, m, 1), 0);
        assert_int_equal(prefix_match(ps, a, 10, 10, 3, m), 2);
        assert_int_equal(m[1], pa[1]);
        assert_int_equal(kvcache_release(kv, m, 2), 0);
        /* a different first token: nothing, even if later pages agree */
        int32_t c[8] = { 0, 2, 3, 4, 5, 6, 7, 8 };
        assert_int_equal(prefix_match(ps, c, 8, 8, 2, m), 0);
        /* fewer tokens than a page: nothing */
        assert_int_equal(prefix_match(ps, a, 3, 3, 3, m), 0);

        prefix_count(ps, 1);
        prefix_count(ps, 2);
        prefix_get_stats(ps, &st);
        assert_int_equal(st.hits, 2);
        assert_int_equal(st.misses, 1);
        assert_int_equal(st.tokens_reused, (1 + 2) * PT);
        assert_int_equal(st.pages_held, 2);
}

static void test_eviction_lru_leaves_and_in_use(void **state) {
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        _cleanup_(prefix_freep) struct prefix_store *ps = NULL;
        int32_t x[8] = { 1, 1, 1, 1, 2, 2, 2, 2 }, y[8] = { 3, 3, 3, 3, 4, 4, 4, 4 };
        uint32_t px[2], py[2], m[2];
        struct prefix_stats st;

        assert_int_equal(kvcache_new(6, PT, &kv), 0);
        assert_int_equal(prefix_new(kv, 0, false, &ps), 0);
        take(kv, 2, px);
        assert_int_equal(prefix_insert(ps, x, 8, 8, px, 2), 2);
        assert_int_equal(kvcache_release(kv, px, 2), 0);
        take(kv, 2, py);
        assert_int_equal(prefix_insert(ps, y, 8, 8, py, 2), 2);
        assert_int_equal(kvcache_release(kv, py, 2), 0);
        assert_int_equal(kvcache_n_free(kv), 2);
        /* x is used again: y becomes the least recently used */
        assert_int_equal(prefix_match(ps, x, 8, 8, 2, m), 2);
        assert_int_equal(kvcache_release(kv, m, 2), 0);
        /* one page wanted: y's leaf (its second page) goes first, not its root */
        assert_int_equal(prefix_evict(ps, 1), 1);
        assert_int_equal(kvcache_refcount(kv, py[1]), 0);
        assert_int_equal(kvcache_refcount(kv, py[0]), 1);
        assert_int_equal(prefix_match(ps, y, 8, 8, 2, m), 1);
        /* y's first page is in use by that match now: not evictable; x's two pages are */
        assert_int_equal(prefix_evict(ps, 10), 2);
        assert_int_equal(kvcache_refcount(kv, px[0]), 0);
        assert_int_equal(kvcache_refcount(kv, py[0]), 2);
        assert_int_equal(kvcache_release(kv, m, 1), 0);
        assert_int_equal(prefix_evict(ps, 10), 1);
        assert_int_equal(kvcache_n_free(kv), 6);
        prefix_get_stats(ps, &st);
        assert_int_equal(st.pages_held, 0);
        assert_int_equal(st.evicted, 4);
}

static void test_budget(void **state) {
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        _cleanup_(prefix_freep) struct prefix_store *ps = NULL;
        int32_t t[12] = { 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7 }, u[4] = { 8, 8, 8, 8 };
        uint32_t pt[3], pu[1];

        assert_int_equal(kvcache_new(8, PT, &kv), 0);
        assert_int_equal(prefix_new(kv, 2, false, &ps), 0);
        take(kv, 3, pt);
        /* budget 2 and the request still holds its pages: only 2 stored */
        assert_int_equal(prefix_insert(ps, t, 12, 12, pt, 3), 2);
        assert_int_equal(kvcache_release(kv, pt, 3), 0);
        assert_int_equal(kvcache_n_free(kv), 6);
        /* a new path evicts the LRU leaf to stay within the budget */
        take(kv, 1, pu);
        assert_int_equal(prefix_insert(ps, u, 4, 4, pu, 1), 1);
        assert_int_equal(kvcache_release(kv, pu, 1), 0);
        assert_int_equal(kvcache_refcount(kv, pt[1]), 0);
        assert_int_equal(kvcache_refcount(kv, pt[0]), 1);
        assert_int_equal(kvcache_n_free(kv), 6);
}

static void test_free_releases_everything(void **state) {
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        struct prefix_store *ps = NULL;
        int32_t t[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
        uint32_t p[2];

        assert_int_equal(kvcache_new(4, PT, &kv), 0);
        assert_int_equal(prefix_new(kv, 0, false, &ps), 0);
        take(kv, 2, p);
        assert_int_equal(prefix_insert(ps, t, 8, 8, p, 2), 2);
        assert_int_equal(kvcache_release(kv, p, 2), 0);
        assert_int_equal(kvcache_n_free(kv), 2);
        prefix_free(ps);
        assert_int_equal(kvcache_n_free(kv), 4);
}

static void test_insert_of_a_free_page_is_refused(void **state) {
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        _cleanup_(prefix_freep) struct prefix_store *ps = NULL;
        int32_t t[4] = { 1, 2, 3, 4 };
        uint32_t p[1] = { 3 };

        assert_int_equal(kvcache_new(4, PT, &kv), 0);
        assert_int_equal(prefix_new(kv, 0, false, &ps), 0);
        assert_int_equal(prefix_insert(ps, t, 4, 4, p, 1), -EINVAL);
        assert_string_equal(log_last_error(), "prefix store: page 3 of position 0 is not allocated: "
                                              "cache: page 3 is free, cannot share it");
}

/* A backend whose prompt tokens compute differently (x4_backend_caps.prompt_class): a page
 * matches only where the request's prompt covers the same positions as the stored one's did. */
static void test_classes(void **state) {
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        _cleanup_(prefix_freep) struct prefix_store *ps = NULL;
        /* turn 1: a 6-token prompt and 6 generated tokens, cached in 3 pages */
        int32_t t[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
        uint32_t p[3], m[3];

        assert_int_equal(kvcache_new(8, PT, &kv), 0);
        assert_int_equal(prefix_new(kv, 0, true, &ps), 0);
        take(kv, 3, p);
        assert_int_equal(prefix_insert(ps, t, 12, 6, p, 3), 3);
        assert_int_equal(kvcache_release(kv, p, 3), 0);
        /* turn 2, whose prompt is all 12 tokens and more: only page 0 was all prompt */
        assert_int_equal(prefix_match(ps, t, 12, 13, 3, m), 1);
        assert_int_equal(m[0], p[0]);
        assert_int_equal(kvcache_release(kv, m, 1), 0);
        /* the same request resuming after a preemption (prompt 6): all three pages */
        assert_int_equal(prefix_match(ps, t, 12, 6, 3, m), 3);
        assert_int_equal(m[2], p[2]);
        assert_int_equal(kvcache_release(kv, m, 3), 0);
        /* a request with the same tokens but a 5-token prompt: page 1 differs (2 vs 1 prompt
         * tokens), so page 0 only */
        assert_int_equal(prefix_match(ps, t, 12, 5, 3, m), 1);
        assert_int_equal(kvcache_release(kv, m, 1), 0);
        /* turn 2 stores its own pages 1 and 2 beside turn 1's: both kept */
        uint32_t q[3];
        take(kv, 3, q);
        q[0] = p[0]; /* it reused page 0 */
        assert_int_equal(kvcache_ref(kv, &q[0], 1, NULL, 0), 0);
        assert_int_equal(prefix_insert(ps, t, 12, 12, q, 3), 2);
        assert_int_equal(prefix_match(ps, t, 12, 12, 3, m), 3);
        assert_int_equal(m[1], q[1]);
        assert_int_equal(kvcache_release(kv, m, 3), 0);
        assert_int_equal(prefix_match(ps, t, 12, 6, 3, m), 3);
        assert_int_equal(m[1], p[1]);
        assert_int_equal(kvcache_release(kv, m, 3), 0);
        assert_int_equal(kvcache_release(kv, q, 3), 0);

        /* without classes the prompt length plays no part */
        _cleanup_(prefix_freep) struct prefix_store *plain = NULL;
        assert_int_equal(prefix_new(kv, 0, false, &plain), 0);
        uint32_t r[3];
        take(kv, 2, r);
        int32_t u[8] = { 9, 9, 9, 9, 8, 8, 8, 8 };
        assert_int_equal(prefix_insert(plain, u, 8, 1, r, 2), 2);
        assert_int_equal(prefix_match(plain, u, 8, 8, 2, m), 2);
        assert_int_equal(kvcache_release(kv, m, 2), 0);
        assert_int_equal(kvcache_release(kv, r, 2), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_classes),
                cmocka_unit_test(test_match_whole_pages_only),
                cmocka_unit_test(test_eviction_lru_leaves_and_in_use),
                cmocka_unit_test(test_budget),
                cmocka_unit_test(test_free_releases_everything),
                cmocka_unit_test(test_insert_of_a_free_page_is_refused),
        };
        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
