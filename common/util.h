/* SPDX-License-Identifier: MIT */
/* Small helpers every program here needs (the daemon, the tools, x4ctl, libx4client, the bridge):
 * whole-string number parsing and the monotonic clock. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* Whole-string unsigned parsing: s holds only digits of `base` (strtoull's bases: 0 also takes
 * "0x" and a leading 0 for octal), no sign, no spaces, nothing after; the value is at most max.
 * 0, or -EINVAL for NULL, empty, "-1", "12x", overflow or a value above max; *ret is untouched
 * then. parse_u64 and parse_u32 are the decimal ones. */
int parse_uint(const char *s, int base, uint64_t max, uint64_t *ret);
int parse_u64(const char *s, uint64_t *ret);
int parse_u32(const char *s, uint32_t *ret);
/* Decimal, an optional '-', within int32_t. */
int parse_i32(const char *s, int32_t *ret);
/* A byte count with an optional binary suffix: "1048576", "512M", "8G", "8GiB", "1TB". */
int parse_size(const char *s, uint64_t *ret);
/* 1/yes/true/on or 0/no/false/off. */
int parse_bool(const char *s, bool *ret);

/* A config line's text: leading spaces and tabs and trailing whitespace (the line end too) cut, in
 * place; returns the first byte kept. */
char *strip(char *s);

/* Milliseconds on CLOCK_MONOTONIC (durations and deadlines, never wall time). */
double now_ms(void);
