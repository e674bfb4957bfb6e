/* SPDX-License-Identifier: MIT */
/* What the developer tools share: the options that name a model and a backend, the --help and
 * unknown-option ending of an option loop, integer options, the one-line failure and reading a
 * whole stream. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/xing4.h"

/* --model, --config, --assume-release-defaults and --device, as getopt_long values 'm', 'c', 'R'
 * and 'D': stores `arg` in *mp or *device and returns true; false for any other option. */
bool tool_model_option(int c, const char *arg, struct x4_model_params *mp, const char **device);

/* The end of an option switch: 'h' prints the usage on stdout and returns exit status 0; anything
 * else (an unknown option, which getopt has already named) prints it on stderr and returns 1. */
int tool_usage_exit(int c, void (*usage)(FILE *f));

/* `s` as an integer in [min, max] into *ret; otherwise logs "OPT: 'S' is not an integer >= MIN"
 * and returns -EINVAL. */
int tool_parse_u32(const char *opt, const char *s, uint32_t min, uint32_t max, uint32_t *ret);

/* Prints the last logged error as "IDENT: MESSAGE" ("IDENT: failed" when none) on stderr and
 * returns exit status 1. */
int tool_fail(const char *ident);

/* All of `f` into a malloc'ed buffer *ret (allocated even for an empty stream) of *ret_len bytes;
 * -ENOMEM, nothing logged, when memory runs out. */
int tool_read_all(FILE *f, char **ret, size_t *ret_len);
