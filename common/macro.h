/* SPDX-License-Identifier: MIT */
/* Small helpers every module uses: scope cleanup (systemd style), sizes, overflow checks. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)

#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define DIV_ROUND_UP(a, b) (((a) + (b) - 1) / (b))

/* Hand a pointer out of a _cleanup_ scope: returns it and leaves NULL behind. */
#define TAKE_PTR(p)                                                                                \
        ({                                                                                         \
                __typeof__(p) _taken_ = (p);                                                       \
                (p) = NULL;                                                                        \
                _taken_;                                                                           \
        })
#define TAKE_FD(fd)                                                                                \
        ({                                                                                         \
                int _fd_ = (fd);                                                                   \
                (fd) = -1;                                                                         \
                _fd_;                                                                              \
        })

static inline void freep(void *p) {
        free(*(void **) p);
}
#define _cleanup_free_ _cleanup_(freep)

static inline void closep(int *fd) {
        if (*fd >= 0)
                close(*fd);
}
#define _cleanup_close_ _cleanup_(closep)

static inline void fclosep(FILE **f) {
        if (*f)
                fclose(*f);
}
#define _cleanup_fclose_ _cleanup_(fclosep)

/* Declares `static inline void funcp(type *p)` calling func(*p) when *p is set. */
#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func)                                                    \
        static inline void func##p(type *p) {                                                      \
                if (*p)                                                                            \
                        func(*p);                                                                  \
        }

/* a*b and a+b for sizes that come from files: false on overflow. */
static inline bool mul_u64_ok(uint64_t a, uint64_t b, uint64_t *ret) {
        return !__builtin_mul_overflow(a, b, ret);
}
static inline bool add_u64_ok(uint64_t a, uint64_t b, uint64_t *ret) {
        return !__builtin_add_overflow(a, b, ret);
}

static inline bool streq(const char *a, const char *b) {
        return a && b && __builtin_strcmp(a, b) == 0;
}
