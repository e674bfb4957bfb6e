/* SPDX-License-Identifier: MIT */
/* Page allocator: all-or-nothing allocation against the budget, sharing by refcount, pages come
 * back exactly when their last user releases them, and misuse is reported with its page. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/kvcache.h"
#include "common/log.h"

static void test_alloc_until_full(void **state) {
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        uint32_t a[6], b[3];

        assert_int_equal(kvcache_new(8, 256, &kv), 0);
        assert_int_equal(kvcache_pages_for(kv, 0), 0);
        assert_int_equal(kvcache_pages_for(kv, 256), 1);
        assert_int_equal(kvcache_pages_for(kv, 257), 2);
        assert_int_equal(kvcache_alloc(kv, 6, a), 0);
        assert_int_equal(kvcache_n_free(kv), 2);
        /* distinct pages */
        for (int i = 0; i < 6; i++)
                for (int j = i + 1; j < 6; j++)
                        assert_int_not_equal(a[i], a[j]);
        /* all or nothing */
        assert_int_equal(kvcache_alloc(kv, 3, b), -ENOSPC);
        assert_string_equal(log_last_error(), "cache: 3 pages wanted, 2 free of 8");
        assert_int_equal(kvcache_n_free(kv), 2);
        assert_int_equal(kvcache_release(kv, a, 6), 0);
        assert_int_equal(kvcache_n_free(kv), 8);
        assert_int_equal(kvcache_alloc(kv, 8, (uint32_t[8]){ 0 }), 0);
        assert_int_equal(kvcache_n_free(kv), 0);
}

static void test_sharing(void **state) {
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        uint32_t p[2];

        assert_int_equal(kvcache_new(4, 16, &kv), 0);
        assert_int_equal(kvcache_alloc(kv, 2, p), 0);
        assert_int_equal(kvcache_ref(kv, p, 2, NULL, 0), 0);
        assert_int_equal(kvcache_refcount(kv, p[0]), 2);
        assert_int_equal(kvcache_release(kv, p, 2), 0);
        /* still held by the other user */
        assert_int_equal(kvcache_n_free(kv), 2);
        assert_int_equal(kvcache_refcount(kv, p[1]), 1);
        assert_int_equal(kvcache_release(kv, p, 2), 0);
        assert_int_equal(kvcache_n_free(kv), 4);
        assert_int_equal(kvcache_refcount(kv, p[0]), 0);
}

static void test_misuse(void **state) {
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        uint32_t p;
        struct kvcache *none = NULL;

        assert_int_equal(kvcache_new(0, 16, &none), -EINVAL);
        assert_string_equal(log_last_error(), "cache: 0 pages of 16 tokens: both must be >= 1");
        assert_int_equal(kvcache_new(2, 16, &kv), 0);
        assert_int_equal(kvcache_alloc(kv, 1, &p), 0);
        assert_int_equal(kvcache_release(kv, &p, 1), 0);
        assert_int_equal(kvcache_release(kv, &p, 1), -EINVAL);
        assert_string_equal(log_last_error(), "cache: page 0 released but already free");
        assert_int_equal(kvcache_n_free(kv), 2); /* a double release does not grow the list */
        assert_int_equal(kvcache_ref(kv, &p, 1, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "cache: page 0 is free, cannot share it");
        uint32_t bad = 7;
        assert_int_equal(kvcache_ref(kv, &bad, 1, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "cache: page 7 out of range (0..1)");
        assert_int_equal(kvcache_refcount(kv, 7), -EINVAL);
}

static void test_churn(void **state) {
        /* many alloc/release rounds of varying sizes never lose or duplicate a page */
        _cleanup_(kvcache_freep) struct kvcache *kv = NULL;
        uint32_t held[64][8], n_held[64] = { 0 };
        uint32_t seed = 12345;

        assert_int_equal(kvcache_new(100, 4, &kv), 0);
        for (int round = 0; round < 5000; round++) {
                seed = seed * 1103515245u + 12345u;
                unsigned slot = (seed >> 8) % 64, n = 1 + (seed >> 20) % 8;
                if (n_held[slot]) {
                        assert_int_equal(kvcache_release(kv, held[slot], n_held[slot]), 0);
                        n_held[slot] = 0;
                } else if (kvcache_alloc(kv, n, held[slot]) == 0)
                        n_held[slot] = n;
                uint32_t used = 0;
                for (int s = 0; s < 64; s++)
                        used += n_held[s];
                assert_int_equal(kvcache_n_free(kv) + used, 100);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_alloc_until_full),
                cmocka_unit_test(test_sharing),
                cmocka_unit_test(test_misuse),
                cmocka_unit_test(test_churn),
        };
        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
