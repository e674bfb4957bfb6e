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

int log_level_from_string(const char *s) {
        static const char *names[] = { "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug" };
        for (int i = 0; s && i < 8; i++)
                if (strcmp(s, names[i]) == 0)
                        return i;
        return -EINVAL;
}

void log_max_level_from_env(void) {
        const char *e = getenv("X4_LOG_LEVEL");
        if (!e || !*e)
                return;
        int level = log_level_from_string(e);
        if (level < 0)
                fprintf(stderr, "X4_LOG_LEVEL=%s ignored: one of err, warning, notice, info, debug expected\n", e);
        else
                max_level = level;
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

int log_error_value(int r, char *err, size_t err_size) {
        if (r >= 0 || !err || err_size == 0)
                return r;
        snprintf(err, err_size, "%s", last_error[0] ? last_error : strerror(-r));
        return r;
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

static int log_emit(int level, int error, const char *buf);

/* Formats the message; hands it to err (when there is one) and to the log. */
static int log_vset(char *err, size_t err_size, int level, int error, const char *format, va_list ap) {
        char buf[1024];

        vsnprintf(buf, sizeof buf, format, ap);
        if (err && err_size > 0)
                snprintf(err, err_size, "%s", buf);
        return log_emit(level, error, buf);
}

int log_internal(int level, int error, const char *file, int line, const char *func,
                 const char *format, ...) {
        va_list ap;
        (void) file, (void) line, (void) func;
        va_start(ap, format);
        int r = log_vset(NULL, 0, level, error, format, ap);
        va_end(ap);
        return r;
}

int log_error_set(char *err, size_t err_size, int error, const char *file, int line,
                  const char *func, const char *format, ...) {
        va_list ap;
        (void) file, (void) line, (void) func;
        va_start(ap, format);
        /* with a buffer the message is the caller's: the log gets it at debug level only */
        int r = log_vset(err, err_size, err && err_size > 0 ? LOG_DEBUG : LOG_ERR, error, format, ap);
        va_end(ap);
        return r;
}

static int log_emit(int level, int error, const char *buf) {
        int saved_errno = errno;

        if (level <= LOG_WARNING)
                snprintf(last_error, sizeof last_error, "%s", buf);

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
