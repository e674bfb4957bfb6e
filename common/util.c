/* SPDX-License-Identifier: MIT */
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int parse_uint(const char *s, int base, uint64_t max, uint64_t *ret) {
        char *end;

        if (!s || !*s || *s == '-')
                return -EINVAL;
        errno = 0;
        unsigned long long v = strtoull(s, &end, base);
        if (errno || end == s || *end || v > max)
                return -EINVAL;
        *ret = v;
        return 0;
}

int parse_u64(const char *s, uint64_t *ret) {
        return parse_uint(s, 10, UINT64_MAX, ret);
}

int parse_u32(const char *s, uint32_t *ret) {
        uint64_t v;
        int r = parse_uint(s, 10, UINT32_MAX, &v);
        if (r < 0)
                return r;
        *ret = (uint32_t) v;
        return 0;
}

int parse_i32(const char *s, int32_t *ret) {
        char *end;

        if (!s || !*s)
                return -EINVAL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || *end || v < INT32_MIN || v > INT32_MAX)
                return -EINVAL;
        *ret = (int32_t) v;
        return 0;
}

int parse_size(const char *s, uint64_t *ret) {
        char *end;

        if (!s || !*s || *s == '-')
                return -EINVAL;
        errno = 0;
        unsigned long long x = strtoull(s, &end, 10);
        if (errno)
                return -EINVAL;
        unsigned shift = 0;
        if (*end == 'K' || *end == 'k')
                shift = 10;
        else if (*end == 'M' || *end == 'm')
                shift = 20;
        else if (*end == 'G' || *end == 'g')
                shift = 30;
        else if (*end == 'T' || *end == 't')
                shift = 40;
        else if (*end)
                return -EINVAL;
        if (shift && end[1] && !(end[1] == 'i' && end[2] == 'B' && !end[3]) && !(end[1] == 'B' && !end[2]))
                return -EINVAL;
        if (shift && x > (UINT64_MAX >> shift))
                return -EINVAL;
        *ret = (uint64_t) x << shift;
        return 0;
}

int parse_bool(const char *s, bool *ret) {
        static const char *const yes[] = { "1", "yes", "true", "on" }, *const no[] = { "0", "no", "false", "off" };

        for (size_t i = 0; s && i < sizeof yes / sizeof yes[0]; i++) {
                if (strcmp(s, yes[i]) == 0) {
                        *ret = true;
                        return 0;
                }
                if (strcmp(s, no[i]) == 0) {
                        *ret = false;
                        return 0;
                }
        }
        return -EINVAL;
}

char *strip(char *s) {
        while (*s == ' ' || *s == '\t')
                s++;
        size_t n = strlen(s);
        while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
                s[--n] = 0;
        return s;
}

double now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
