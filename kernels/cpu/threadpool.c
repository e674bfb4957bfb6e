/* SPDX-License-Identifier: MIT */
/* The pool hands a job to its workers through an atomic generation counter and collects them
 * through an atomic count of pending workers. Waiting on either is a short spin followed by a
 * condition variable: when the machine has a core for every runnable thread, a worker that
 * spins picks a job up in well under a microsecond instead of the tens of microseconds of a
 * futex wake-up, and the CPU backend splits much smaller products (threadpool_handoff_cheap). On
 * a machine whose cores are all busy (more runnable threads than online CPUs, from
 * /proc/loadavg's count of runnable threads, sampled every THREADPOOL_PROBE_NS), a spinning thread only takes
 * a core from the thread it waits for, so nobody spins: the pool then behaves as a plain
 * sleeping pool. The caller's waits outlasting the spin often (a worker lost its core) turn
 * spinning off for two seconds whatever the count says. Which thread computes which range never depends on any of this. */
#include "threadpool.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

/* How long a waiting thread spins before it sleeps: long enough to span the serial work between
 * two products of a decode step, short enough that an idle daemon's workers are asleep at once. */
#define THREADPOOL_SPIN_NS 50000ull
/* How often the caller re-reads the machine's load to decide whether spinning pays; spinning
 * stops for THREADPOOL_BACKOFF_NS when more than 1/THREADPOOL_LONG_WAIT_DEN of the caller's
 * waits for its workers (at least THREADPOOL_WAITS_MIN since the last probe) took over
 * THREADPOOL_LONG_WAIT_NS: a worker that lost its core comes back after a scheduler slice
 * (milliseconds), while two halves of one job rarely finish that far apart. */
#define THREADPOOL_PROBE_NS 100000000ull
#define THREADPOOL_WAITS_MIN 20
#define THREADPOOL_LONG_WAIT_NS 1000000ull
#define THREADPOOL_LONG_WAIT_DEN 5
#define THREADPOOL_BACKOFF_NS 2000000000ull

struct threadpool_worker {
        struct threadpool *pool;
        unsigned index;
        pthread_t thread;
};

struct threadpool {
        unsigned n_threads;
        struct threadpool_worker *workers; /* n_threads - 1 of them; the caller is thread 0 */
        unsigned n_started;

        _Atomic unsigned long generation; /* bumped per job (release: the job is published) */
        _Atomic unsigned pending;         /* workers not yet done with the current job */
        _Atomic bool spin;                /* spinning pays now (threadpool_probe) */
        _Atomic unsigned n_spinning;      /* workers spinning for a job now */
        _Atomic bool shutdown;

        pthread_mutex_t lock;
        pthread_cond_t wake; /* a new job or shutdown, for workers asleep */
        pthread_cond_t done; /* pending reached 0, for a caller asleep */
        unsigned n_asleep;   /* workers in cond_wait(wake), under lock */
        bool caller_asleep;  /* under lock */

        /* the current job, written before the generation is bumped */
        threadpool_fn_t fn;
        void *ctx;
        size_t n;

        /* the load probe (caller only) */
        int loadavg_fd;
        unsigned long long next_probe_ns;
        unsigned n_cpus;
        double others;  /* other runnable threads on the machine, averaged over the probes */
        unsigned n_waits, n_waits_long; /* caller waits since the last probe; past the spin */
        int forced; /* X4_CPU_SPIN: -1 auto, 0 never, 1 always */
};

static unsigned long long now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (unsigned long long) ts.tv_sec * 1000000000ull + (unsigned long long) ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
}

/* Range of thread i: the first n % k threads get one extra element. Depends on (n, k) only. */
static void threadpool_range(size_t n, unsigned k, unsigned i, size_t *begin, size_t *end) {
        size_t q = n / k, r = n % k;

        *begin = i * q + MIN((size_t) i, r);
        *end = *begin + q + (i < r ? 1 : 0);
}

/* Runnable threads of the machine (this pool's included), or -1: the fourth field of
 * /proc/loadavg, "running/total", the same count as /proc/stat's procs_running. /proc/stat is
 * not read: on a machine with many interrupt lines its "intr" line alone can be tens of KB. */
static long procs_running(int fd) {
        char buf[256];
        ssize_t k = pread(fd, buf, sizeof buf - 1, 0);
        if (k <= 0)
                return -1;
        buf[k] = 0;
        char *s = buf;
        for (int field = 0; field < 3; field++) {
                s = strchr(s, ' ');
                if (!s)
                        return -1;
                s++;
        }
        char *end;
        long n = strtol(s, &end, 10);
        return end != s && *end == '/' ? n : -1;
}

long threadpool_machine_running(void) {
        int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -1;
        long n = procs_running(fd);
        close(fd);
        return n;
}

/* Spin when every runnable thread has a core: the other runnable threads of the machine (from
 * procs_running, less the caller and this pool's spinning workers), averaged over the last probes,
 * plus this pool's n_threads fit in the online CPUs (with one to spare for noise), and the
 * caller's waits do not say otherwise. Sampled at most every THREADPOOL_PROBE_NS by
 * the caller; the workers only read the verdict. */
static void threadpool_probe(struct threadpool *p) {
        if (p->forced >= 0 || p->n_threads == 1)
                return;
        unsigned long long t = now_ns();
        if (t < p->next_probe_ns)
                return;
        p->next_probe_ns = t + THREADPOOL_PROBE_NS;
        long running = p->loadavg_fd >= 0 ? procs_running(p->loadavg_fd) : -1;
        if (running < 0) {
                atomic_store_explicit(&p->spin, false, memory_order_relaxed);
                return;
        }
        long mine = 1 + (long) atomic_load_explicit(&p->n_spinning, memory_order_relaxed);
        double others = (double) (running > mine ? running - mine : 0);
        /* a thread of another process running now and then (a VM agent, a shell) is noise:
         * up to one more than the cores, on average, still spins, and the waits decide */
        p->others = 0.75 * p->others + 0.25 * others;
        bool spin = p->others + (double) p->n_threads <= (double) p->n_cpus + 1.0;
        /* the direct evidence: while spinning, the caller's waits for the workers outlast the
         * spin (a worker lost its core to another thread): no spinning for a while */
        if (atomic_load_explicit(&p->spin, memory_order_relaxed) && p->n_waits >= THREADPOOL_WAITS_MIN &&
            p->n_waits_long * THREADPOOL_LONG_WAIT_DEN > p->n_waits) {
                spin = false;
                p->next_probe_ns = t + THREADPOOL_BACKOFF_NS;
        }
        p->n_waits = p->n_waits_long = 0;
        atomic_store_explicit(&p->spin, spin, memory_order_relaxed);
}

static void *threadpool_worker_main(void *arg) {
        struct threadpool_worker *w = arg;
        struct threadpool *p = w->pool;
        unsigned long seen = 0;

        for (;;) {
                size_t begin, end;
                unsigned long g = atomic_load_explicit(&p->generation, memory_order_acquire);

                if (g == seen && !atomic_load_explicit(&p->shutdown, memory_order_relaxed) &&
                    atomic_load_explicit(&p->spin, memory_order_relaxed)) {
                        unsigned long long until = now_ns() + THREADPOOL_SPIN_NS;
                        atomic_fetch_add_explicit(&p->n_spinning, 1, memory_order_relaxed);
                        for (unsigned i = 0; g == seen; i++) {
                                cpu_relax();
                                g = atomic_load_explicit(&p->generation, memory_order_acquire);
                                if ((i & 63) == 63 && now_ns() > until)
                                        break;
                        }
                        atomic_fetch_sub_explicit(&p->n_spinning, 1, memory_order_relaxed);
                }
                if (g == seen) {
                        pthread_mutex_lock(&p->lock);
                        p->n_asleep++;
                        while (!atomic_load(&p->shutdown) &&
                               (g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen)
                                pthread_cond_wait(&p->wake, &p->lock);
                        p->n_asleep--;
                        pthread_mutex_unlock(&p->lock);
                }
                if (atomic_load(&p->shutdown))
                        return NULL;
                seen = g;
                threadpool_range(p->n, p->n_threads, w->index, &begin, &end);
                if (begin < end)
                        p->fn(p->ctx, begin, end, w->index);

                /* release: this range's results are visible to the caller that sees 0 */
                if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
                        pthread_mutex_lock(&p->lock);
                        if (p->caller_asleep)
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
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        p->n_cpus = nc > 0 ? (unsigned) nc : 1;
        p->loadavg_fd = -1;
        p->forced = -1;
        const char *f = getenv("X4_CPU_SPIN");
        if (f && (!strcmp(f, "0") || !strcmp(f, "1")))
                p->forced = f[0] - '0';
        if (p->forced < 0 && n_threads > 1)
                p->loadavg_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
        atomic_store(&p->spin, p->forced == 1);
        threadpool_probe(p);
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
        atomic_store(&p->shutdown, true);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
        for (unsigned i = 0; i < p->n_started; i++)
                pthread_join(p->workers[i].thread, NULL);
        if (p->loadavg_fd >= 0)
                close(p->loadavg_fd);
        pthread_cond_destroy(&p->done);
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->lock);
        free(p->workers);
        free(p);
}

unsigned threadpool_size(const struct threadpool *p) {
        return p->n_threads;
}

bool threadpool_handoff_cheap(struct threadpool *p) {
        threadpool_probe(p);
        return p->n_threads > 1 && atomic_load_explicit(&p->spin, memory_order_relaxed);
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
        threadpool_probe(p);
        p->fn = fn;
        p->ctx = ctx;
        p->n = n;
        atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
        /* release: the job's fields and pending are visible to a worker that sees the bump */
        atomic_fetch_add_explicit(&p->generation, 1, memory_order_acq_rel);
        /* workers asleep (or about to be: they count themselves under the lock before checking
         * the generation) need the condition variable */
        pthread_mutex_lock(&p->lock);
        if (p->n_asleep > 0)
                pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);

        threadpool_range(n, p->n_threads, 0, &begin, &end);
        if (begin < end)
                fn(ctx, begin, end, 0);

        bool spin = atomic_load_explicit(&p->spin, memory_order_relaxed);
        unsigned long long w0 = spin ? now_ns() : 0;
        if (spin)
                p->n_waits++;
        if (atomic_load_explicit(&p->pending, memory_order_acquire) != 0 && spin) {
                unsigned long long until = w0 + THREADPOOL_SPIN_NS;
                for (unsigned i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++) {
                        cpu_relax();
                        if ((i & 63) == 63 && now_ns() > until)
                                break;
                }
        }
        if (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) {
                pthread_mutex_lock(&p->lock);
                p->caller_asleep = true;
                while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
                        pthread_cond_wait(&p->done, &p->lock);
                p->caller_asleep = false;
                pthread_mutex_unlock(&p->lock);
                if (spin && now_ns() - w0 > THREADPOOL_LONG_WAIT_NS)
                        p->n_waits_long++;
        }
}
