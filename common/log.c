/* SPDX-License-Identifier: MIT */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int max_level = LOG_INFO;
static log_sink_t sink;
static void *sink_userdata;
static const char *ident;
static _Thread_local char last_error[1024];

void log_set_max_level(int level) {
        max_level = level;
}

int log_get_max_level(void) {
        return max_level;
}

void log_set_sink(log_sink_t s, void *userdata) {
        sink = s;
        sink_userdata = userdata;
}

void log_set_ident(const char *i) {
        ident = i;
}

const char *log_last_error(void) {
        return last_error;
}

void log_clear_last_error(void) {
        last_error[0] = 0;
}

static const char *level_name(int level) {
        switch (level) {
        case LOG_EMERG:
        case LOG_ALERT:
        case LOG_CRIT:
        case LOG_ERR:
                return "error";
        case LOG_WARNING:
                return "warning";
        case LOG_NOTICE:
        case LOG_INFO:
                return NULL;
        default:
                return "debug";
        }
}

int log_internal(int level, int error, const char *file, int line, const char *func,
                 const char *format, ...) {
        char buf[1024];
        va_list ap;
        int saved_errno = errno;

        (void) file;
        (void) line;
        (void) func;

        va_start(ap, format);
        vsnprintf(buf, sizeof buf, format, ap);
        va_end(ap);

        if (level <= LOG_WARNING)
                memcpy(last_error, buf, sizeof last_error);

        if (level <= max_level) {
                if (sink)
                        sink(level, buf, sink_userdata);
                else {
                        /* under journald (JOURNAL_STREAM set) a "<N>" prefix carries the level;
                         * in a terminal a word does */
                        const char *name = level_name(level);
                        if (getenv("JOURNAL_STREAM"))
                                fprintf(stderr, "<%d>%s\n", level, buf);
                        else
                                fprintf(stderr, "%s%s%s%s%s\n", ident ? ident : "",
                                        ident ? ": " : "", name ? name : "", name ? ": " : "",
                                        buf);
                }
        }

        errno = saved_errno;
        if (error == 0)
                return -EINVAL;
        return error < 0 ? error : -error;
}
