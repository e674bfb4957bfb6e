/* SPDX-License-Identifier: MIT */
#include "threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/log.h"

/* How long a worker waiting for the next job, or the caller waiting for the workers, polls
 * before it sleeps on the condition variable. A decode step hands work to the pool every few
 * tens of microseconds, and a sleeping thread takes ~50 µs to wake on the VMs we measured (more
 * than most of those jobs take): polling briefly makes the hand-off cost ~1 µs, and the short
 * limit keeps an idle pool from burning the cores we share (it sleeps after 200 µs). */
#define THREADPOOL_SPIN_NS 200000

struct threadpool_worker {
        struct threadpool *pool;
        unsigned index;
        pthread_t thread;
};

struct threadpool {
        unsigned n_threads;
        struct threadpool_worker *workers; /* n_threads - 1 of them; the caller is thread 0 */
        unsigned n_started;

        /* generation, pending and shutdown are atomics (polled without the lock); the lock and the
         * condition variables are for sleeping on them */
        pthread_mutex_t lock;
        pthread_cond_t wake; /* a new job (generation bumped) or shutdown */
        pthread_cond_t done; /* pending reached 0 */
        unsigned long generation;
        unsigned pending;
        bool shutdown;

        /* the current job */
        threadpool_fn_t fn;
        void *ctx;
        size_t n;
};

/* Range of thread i: the first n % k threads get one extra element. Depends on (n, k) only. */
static void threadpool_range(size_t n, unsigned k, unsigned i, size_t *begin, size_t *end) {
        size_t q = n / k, r = n % k;

        *begin = i * q + MIN((size_t) i, r);
        *end = *begin + q + (i < r ? 1 : 0);
}

static uint64_t now_ns(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* One poll's wait: a pause for the first THREADPOOL_PAUSE_NS, then a yield, so a partner thread
 * that the (shared, busy) machine descheduled can run on this core instead of us polling. */
#define THREADPOOL_PAUSE_NS 20000

static inline void cpu_relax(uint64_t waited_ns) {
        if (waited_ns > THREADPOOL_PAUSE_NS) {
                sched_yield();
                return;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
}

/* Poll until the next job or shutdown, up to THREADPOOL_SPIN_NS. */
static bool worker_spin(struct threadpool *p, unsigned long seen) {
        uint64_t t0 = now_ns(), waited = 0;

        for (unsigned i = 1;; i++) {
                if (__atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) != seen ||
                    __atomic_load_n(&p->shutdown, __ATOMIC_ACQUIRE))
                        return true;
                cpu_relax(waited);
                if (i % 16 == 0 && (waited = now_ns() - t0) > THREADPOOL_SPIN_NS)
                        return false;
        }
}

static void *threadpool_worker_main(void *arg) {
        struct threadpool_worker *w = arg;
        struct threadpool *p = w->pool;
        unsigned long seen = 0;

        for (;;) {
                size_t begin, end;

                if (!worker_spin(p, seen)) {
                        pthread_mutex_lock(&p->lock);
                        while (!__atomic_load_n(&p->shutdown, __ATOMIC_ACQUIRE) &&
                               __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) == seen)
                                pthread_cond_wait(&p->wake, &p->lock);
                        pthread_mutex_unlock(&p->lock);
                }
                if (__atomic_load_n(&p->shutdown, __ATOMIC_ACQUIRE))
                        return NULL;
                /* the job's fields were written before the release that bumped generation */
                seen = __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE);
                threadpool_fn_t fn = p->fn;
                void *ctx = p->ctx;
                size_t n = p->n;

                threadpool_range(n, p->n_threads, w->index, &begin, &end);
                if (begin < end)
                        fn(ctx, begin, end, w->index);

                if (__atomic_sub_fetch(&p->pending, 1, __ATOMIC_ACQ_REL) == 0) {
                        pthread_mutex_lock(&p->lock);
                        pthread_cond_signal(&p->done);
                        pthread_mutex_unlock(&p->lock);
                }
        }
}

int threadpool_new(unsigned n_threads, struct threadpool **ret) {
        struct threadpool *p;

        if (n_threads < 1)
                return log_error_errno(EINVAL, "thread pool: at least 1 thread expected, got %u",
                                       n_threads);
        p = calloc(1, sizeof *p);
        if (!p)
                return log_error_errno(ENOMEM, "thread pool: out of memory");
        p->n_threads = n_threads;
        pthread_mutex_init(&p->lock, NULL);
        pthread_cond_init(&p->wake, NULL);
        pthread_cond_init(&p->done, NULL);
        if (n_threads > 1) {
                p->workers = calloc(n_threads - 1, sizeof *p->workers);
                if (!p->workers) {
                        threadpool_free(p);
                        return log_error_errno(ENOMEM, "thread pool: out of memory");
                }
        }
        for (unsigned i = 1; i < n_threads; i++) {
                struct threadpool_worker *w = &p->workers[i - 1];
                int r;

                w->pool = p;
                w->index = i;
                r = pthread_create(&w->thread, NULL, threadpool_worker_main, w);
                if (r != 0) {
                        threadpool_free(p);
                        return log_error_errno(r, "thread pool: cannot start thread %u of %u: %s",
                                               i + 1, n_threads, strerror(r));
                }
                p->n_started++;
        }
        *ret = p;
        return 0;
}

void threadpool_free(struct threadpool *p) {
        if (!p)
                return;
        pthread_mutex_lock(&p->lock);
        __atomic_store_n(&p->shutdown, true, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
        for (unsigned i = 0; i < p->n_started; i++)
                pthread_join(p->workers[i].thread, NULL);
        pthread_cond_destroy(&p->done);
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->lock);
        free(p->workers);
        free(p);
}

unsigned threadpool_size(const struct threadpool *p) {
        return p->n_threads;
}

void threadpool_run(struct threadpool *p, size_t n, threadpool_fn_t fn, void *ctx) {
        size_t begin, end;

        if (n == 0)
                return;
        /* Small jobs, or a pool of one: no hand-off (the split is the same either way, since
         * every element's result is independent of which thread computes it). */
        if (p->n_threads == 1 || n == 1) {
                fn(ctx, 0, n, 0);
                return;
        }

        /* no worker reads the job fields now: the previous run waited for all of them */
        p->fn = fn;
        p->ctx = ctx;
        p->n = n;
        __atomic_store_n(&p->pending, p->n_threads - 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&p->generation, 1, __ATOMIC_RELEASE);
        pthread_mutex_lock(&p->lock); /* wakes the workers that went to sleep */
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);

        threadpool_range(n, p->n_threads, 0, &begin, &end);
        if (begin < end)
                fn(ctx, begin, end, 0);

        uint64_t t0 = now_ns(), waited = 0;
        for (unsigned i = 1; __atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) > 0; i++) {
                cpu_relax(waited);
                if (i % 16 == 0 && (waited = now_ns() - t0) > THREADPOOL_SPIN_NS) {
                        pthread_mutex_lock(&p->lock);
                        while (__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) > 0)
                                pthread_cond_wait(&p->done, &p->lock);
                        pthread_mutex_unlock(&p->lock);
                        break;
                }
        }
}
