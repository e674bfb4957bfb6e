/* SPDX-License-Identifier: MIT */
#include "threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

struct threadpool_worker {
        struct threadpool *pool;
        unsigned index;
        pthread_t thread;
};

struct threadpool {
        unsigned n_threads;
        struct threadpool_worker *workers; /* n_threads - 1 of them; the caller is thread 0 */
        unsigned n_started;

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

static void *threadpool_worker_main(void *arg) {
        struct threadpool_worker *w = arg;
        struct threadpool *p = w->pool;
        unsigned long seen = 0;

        for (;;) {
                size_t begin, end;

                pthread_mutex_lock(&p->lock);
                while (!p->shutdown && p->generation == seen)
                        pthread_cond_wait(&p->wake, &p->lock);
                if (p->shutdown) {
                        pthread_mutex_unlock(&p->lock);
                        return NULL;
                }
                seen = p->generation;
                threadpool_fn_t fn = p->fn;
                void *ctx = p->ctx;
                size_t n = p->n;
                pthread_mutex_unlock(&p->lock);

                threadpool_range(n, p->n_threads, w->index, &begin, &end);
                if (begin < end)
                        fn(ctx, begin, end, w->index);

                pthread_mutex_lock(&p->lock);
                if (--p->pending == 0)
                        pthread_cond_signal(&p->done);
                pthread_mutex_unlock(&p->lock);
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
        p->shutdown = true;
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

        pthread_mutex_lock(&p->lock);
        p->fn = fn;
        p->ctx = ctx;
        p->n = n;
        p->pending = p->n_threads - 1;
        p->generation++;
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);

        threadpool_range(n, p->n_threads, 0, &begin, &end);
        if (begin < end)
                fn(ctx, begin, end, 0);

        pthread_mutex_lock(&p->lock);
        while (p->pending > 0)
                pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
}
