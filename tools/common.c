/* SPDX-License-Identifier: MIT */
#include "tools/common.h"

#include <errno.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/util.h"

bool tool_model_option(int c, const char *arg, struct x4_model_params *mp, const char **device) {
        switch (c) {
        case 'm':
                mp->path = arg;
                return true;
        case 'c':
                mp->config_path = arg;
                return true;
        case 'R':
                mp->assume_release_defaults = true;
                return true;
        case 'D':
                *device = arg;
                return true;
        default:
                return false;
        }
}

int tool_usage_exit(int c, void (*usage)(FILE *f)) {
        usage(c == 'h' ? stdout : stderr);
        return c == 'h' ? 0 : 1;
}

int tool_parse_u32(const char *opt, const char *s, uint32_t min, uint32_t max, uint32_t *ret) {
        uint32_t v;
        if (parse_u32(s, &v) < 0 || v < min || v > max)
                return log_error_errno(EINVAL, "%s: '%s' is not an integer >= %u", opt, s, min);
        *ret = v;
        return 0;
}

int tool_fail(const char *ident) {
        fprintf(stderr, "%s: %s\n", ident, *log_last_error() ? log_last_error() : "failed");
        return 1;
}

int tool_read_all(FILE *f, char **ret, size_t *ret_len) {
        char *text = NULL;
        size_t len = 0, cap = 0;
        for (;;) {
                if (len + 65536 > cap) {
                        cap = cap ? cap * 2 : 1 << 20;
                        char *p = realloc(text, cap);
                        if (!p) {
                                free(text);
                                return -ENOMEM;
                        }
                        text = p;
                }
                size_t got = fread(text + len, 1, cap - len, f);
                if (got == 0)
                        break;
                len += got;
        }
        *ret = text;
        *ret_len = len;
        return 0;
}
