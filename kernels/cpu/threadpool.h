/* SPDX-License-Identifier: MIT */
/* A small pthread pool for the CPU backend: run fn over [0, n) split into one fixed contiguous
 * range per thread. The split depends only on (n, n_threads), and callers only ever split OUTPUT
 * elements (rows, tokens, heads), never a reduction, so results do not depend on the thread count
 * (docs/design.md "Numerics"). The calling thread does range 0 itself. Waiting threads spin for up
 * to 50 µs before they sleep on a condition variable, but only while the machine has a core for
 * every runnable thread (/proc/stat; on a machine whose cores are shared with other work a
 * spinning thread delays the one it waits for, so then they only sleep). X4_CPU_SPIN=0 or 1
 * forces either. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "common/macro.h"

struct threadpool;

/* fn(ctx, begin, end, thread): process [begin, end); thread in [0, n_threads) indexes per-thread
 * scratch. Called at most once per thread per run, never with an empty range. */
typedef void (*threadpool_fn_t)(void *ctx, size_t begin, size_t end, unsigned thread);

/* n_threads >= 1 (the caller counts as one). -errno (logged) if a thread cannot be started. */
int threadpool_new(unsigned n_threads, struct threadpool **ret);
void threadpool_free(struct threadpool *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct threadpool *, threadpool_free);

unsigned threadpool_size(const struct threadpool *p);

/* Whether a hand-off to the workers costs about a microsecond now (they spin) rather than a
 * wake-up of tens of microseconds: callers split smaller jobs then. Caller thread only. */
bool threadpool_handoff_cheap(struct threadpool *p);

/* The machine's runnable threads now (the caller included, so at least 1), as the pool's spin
 * guard reads them; -1 where the count cannot be read (the pool then never spins). */
long threadpool_machine_running(void);

/* Run fn over [0, n) and return when every range is done. Not reentrant: one run at a time. */
void threadpool_run(struct threadpool *p, size_t n, threadpool_fn_t fn, void *ctx);
