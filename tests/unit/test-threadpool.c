/* SPDX-License-Identifier: MIT */
/* The CPU backend's thread pool: every index of [0, n) is handled exactly once, by one of at most
 * n_threads contiguous ranges whose split depends only on (n, n_threads) (the determinism of the
 * forward relies on callers splitting outputs, and on this split being stable); runs of every
 * size back to back; refusal of 0 threads by message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/threadpool.h"
#include "common/log.h"

#define MAX_N 1000
#define MAX_THREADS 4

struct record {
        unsigned hits[MAX_N];         /* how often each index was handled */
        unsigned owner[MAX_N];        /* which thread handled it */
        size_t begin[MAX_THREADS], end[MAX_THREADS];
        unsigned calls[MAX_THREADS];  /* fn calls per thread in this run */
        pthread_mutex_t lock;
};

static void record_range(void *ctx, size_t begin, size_t end, unsigned thread) {
        struct record *r = ctx;

        assert_true(begin < end);
        assert_true(thread < MAX_THREADS);
        /* each thread writes only its own slots and its own indices: no lock needed for those */
        for (size_t i = begin; i < end; i++) {
                r->hits[i]++;
                r->owner[i] = thread;
        }
        pthread_mutex_lock(&r->lock);
        r->begin[thread] = begin;
        r->end[thread] = end;
        r->calls[thread]++;
        pthread_mutex_unlock(&r->lock);
}

static void run_and_check(struct threadpool *p, unsigned n_threads, size_t n) {
        static struct record r;
        size_t expect = 0;

        memset(&r, 0, sizeof r);
        pthread_mutex_init(&r.lock, NULL);
        threadpool_run(p, n, record_range, &r);
        for (size_t i = 0; i < n; i++)
                if (r.hits[i] != 1)
                        fail_msg("n %zu, %u threads: index %zu handled %u times", n, n_threads, i,
                                 r.hits[i]);
        /* ranges are contiguous, in thread order, sizes differing by at most one */
        for (unsigned t = 0; t < n_threads; t++) {
                size_t size = n / n_threads + (t < n % n_threads ? 1 : 0);

                if (n > 1 && n_threads > 1) {
                        if (size == 0) {
                                assert_int_equal(r.calls[t], 0);
                                continue;
                        }
                        assert_int_equal(r.calls[t], 1);
                        assert_int_equal(r.begin[t], expect);
                        assert_int_equal(r.end[t], expect + size);
                }
                expect += size;
        }
        if (n == 1 || n_threads == 1) /* one range, on the calling thread */
                for (size_t i = 0; i < n; i++)
                        assert_int_equal(r.owner[i], 0);
        pthread_mutex_destroy(&r.lock);
}

static void test_split(void **state) {
        static const size_t sizes[] = { 0, 1, 2, 3, 5, 7, 64, 999, MAX_N };

        (void) state;
        for (unsigned nt = 1; nt <= MAX_THREADS; nt++) {
                struct threadpool *p = NULL;

                assert_int_equal(threadpool_new(nt, &p), 0);
                assert_int_equal(threadpool_size(p), nt);
                /* many back-to-back runs: no lost wake-up, no stale job */
                for (unsigned rep = 0; rep < 200; rep++)
                        for (size_t i = 0; i < ELEMENTSOF(sizes); i++)
                                run_and_check(p, nt, sizes[i]);
                threadpool_free(p);
        }
}

/* The same with the workers always spinning between jobs (X4_CPU_SPIN=1), never spinning (0),
 * and deciding from the machine's load (unset): the hand-off through the atomic generation and
 * pending counts, the fall-back to the condition variables after a spin times out (a pause
 * between runs longer than the 50 µs spin), and shutdown of spinning workers. */
static void split_with_spin(const char *mode) {
        static const size_t sizes[] = { 2, 3, 64, 999 };

        if (mode)
                setenv("X4_CPU_SPIN", mode, 1);
        else
                unsetenv("X4_CPU_SPIN");
        for (unsigned nt = 2; nt <= MAX_THREADS; nt++) {
                struct threadpool *p = NULL;

                assert_int_equal(threadpool_new(nt, &p), 0);
                if (mode)
                        assert_int_equal(threadpool_handoff_cheap(p), mode[0] == '1');
                for (unsigned rep = 0; rep < 2000; rep++) {
                        run_and_check(p, nt, sizes[rep % ELEMENTSOF(sizes)]);
                        if (rep % 500 == 0) { /* workers asleep: the condition variable path */
                                struct timespec ts = { 0, 2000000 };
                                nanosleep(&ts, NULL);
                        }
                }
                threadpool_free(p);
        }
        unsetenv("X4_CPU_SPIN");
}

static void test_split_spinning(void **state) {
        (void) state;
        split_with_spin("1");
        split_with_spin("0");
        split_with_spin(NULL);
}

/* The spin guard's reading of the machine: at least this thread is running. A parse that fails
 * (the count past what was read, a changed format) would return -1 and leave the pool asleep
 * between jobs on every machine, halving one-token steps without any other symptom. */
static void test_reads_machine_running(void **state) {
        (void) state;
        long n = threadpool_machine_running();
        assert_true(n >= 1);
        assert_true(n < 1000000);
}

static void test_refuses_zero_threads(void **state) {
        struct threadpool *p = NULL;

        (void) state;
        assert_int_equal(threadpool_new(0, &p), -EINVAL);
        assert_null(p);
        assert_string_equal(log_last_error(), "thread pool: at least 1 thread expected, got 0");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_split),
                cmocka_unit_test(test_split_spinning),
                cmocka_unit_test(test_reads_machine_running),
                cmocka_unit_test(test_refuses_zero_threads),
        };

        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
