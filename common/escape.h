/* SPDX-License-Identifier: MIT */
/* Client-supplied text (client names, snapshot names, roles, stop strings) reaches the log and
 * Error messages. Raw, it can forge log lines (an embedded newline), drive a terminal (escape
 * sequences) or break a client's protobuf decoder (a string field that is not valid UTF-8). */
#pragma once

#include <stddef.h>

/* Copy s[0..len) into buf (size bytes, always NUL-terminated) with printable ASCII and valid
 * UTF-8 passed through; backslash becomes \\, \n \r \t stay readable as escapes, every other
 * control character (C0, DEL, C1) and every byte that is not part of valid UTF-8 becomes \xNN.
 * Out of room: cut at a character boundary and end with "...". Returns buf. */
char *cescape(const char *s, size_t len, char *buf, size_t size);

/* Offset of the first byte of s[0..len) that is not part of valid UTF-8 (RFC 3629), or len when
 * all of it is. */
size_t utf8_invalid_at(const char *s, size_t len);
