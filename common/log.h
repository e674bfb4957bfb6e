/* SPDX-License-Identifier: MIT */
/* Logging with systemd's conventions: levels are syslog's, error helpers return -|errno| so a
 * caller writes `return log_error_errno(r, "...")`. The last error message of each thread is kept
 * so callers that answer a client (daemon, tools) and tests can show/assert the exact text. */
#pragma once

#include <errno.h>
#include <syslog.h>

#include "common/macro.h"

typedef void (*log_sink_t)(int level, const char *message, void *userdata);

/* Messages above max_level (numerically) are dropped; default LOG_INFO. */
void log_set_max_level(int level);
int log_get_max_level(void);
/* A level's syslog name (emerg, alert, crit, err, warning, notice, info, debug) as its number;
 * -EINVAL for anything else. */
int log_level_from_string(const char *s);
/* X4_LOG_LEVEL=NAME, when set, replaces the max level (the tools keep their own messages to one
 * error line by default; this shows the library's and the backend's warnings, e.g. which knobs a
 * measurement took). An unknown name is said on stderr and ignored. */
void log_max_level_from_env(void);
/* Replace the stderr sink (NULL restores it). Used by tests to capture messages. */
void log_set_sink(log_sink_t sink, void *userdata);
/* Prefix every line with this name ("xing4d"); NULL for none. */
void log_set_ident(const char *ident);

/* The last message logged at LOG_ERR or LOG_WARNING by this thread ("" if none). It is kept even
 * when the level is filtered out, so library errors are always retrievable. */
const char *log_last_error(void);
void log_clear_last_error(void);

int log_internal(int level, int error, const char *file, int line, const char *func,
                 const char *format, ...) _printf_(6, 7);

/* Errors as values (docs/design.md, "Errors"). A function whose failure a client may see takes
 * `char *err, size_t err_size` as its last two parameters, returns -errno and writes one line
 * saying what is wrong (and where) into err; the caller owns the buffer and decides what becomes
 * of the text (the daemon puts it into the client's Error frame). error_set() is how such a
 * function fails:
 *
 *         return error_set(err, err_size, EINVAL, "messages[%zu].role: a string expected", i);
 *
 * It fills err (truncating to err_size - 1 bytes) and returns -|error| (-EINVAL for 0); the
 * message is also logged at LOG_DEBUG. A caller with no use for the text passes NULL, 0: the
 * message is then logged at LOG_ERR as before, so tools and tests still find it in
 * log_last_error(). Library code below the request path (GGUF, model, kernels' set-up) still
 * logs its errors; the logger is for operators, not the channel to clients. */
#define error_set(err, err_size, error, ...)                                                       \
        log_error_set((err), (err_size), (error), __FILE__, __LINE__, __func__, __VA_ARGS__)
int log_error_set(char *err, size_t err_size, int error, const char *file, int line,
                  const char *func, const char *format, ...) _printf_(7, 8);

/* A boundary where errors become values over code that fails by logging (GGUF reading, a
 * backend's set-up and device calls): returns r and, when it is an error, writes this thread's
 * last logged error (strerror(-r) when there is none) into err. The boundary calls
 * log_clear_last_error() when it starts; a module with its own copy of the logger (the CUDA
 * backend) gets its own copy of this too, so its reason comes back without passing through the
 * caller's logger. */
int log_error_value(int r, char *err, size_t err_size);

/* Returns -|error| (or -EINVAL when error is 0) so it can be returned directly. */
#define log_error_errno(error, ...)                                                                \
        log_internal(LOG_ERR, (error), __FILE__, __LINE__, __func__, __VA_ARGS__)
#define log_warning_errno(error, ...)                                                              \
        log_internal(LOG_WARNING, (error), __FILE__, __LINE__, __func__, __VA_ARGS__)
#define log_error(...) (void) log_internal(LOG_ERR, 0, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define log_warning(...)                                                                           \
        (void) log_internal(LOG_WARNING, 0, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define log_info(...) (void) log_internal(LOG_INFO, 0, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define log_debug(...) (void) log_internal(LOG_DEBUG, 0, __FILE__, __LINE__, __func__, __VA_ARGS__)
