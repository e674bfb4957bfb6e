/* SPDX-License-Identifier: MIT */
#include "common/escape.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at p (1..4), 0 if it is not one (RFC 3629: no overlongs,
 * no surrogates, nothing above U+10FFFF). */
static size_t utf8_seq(const uint8_t *p, size_t left) {
        uint8_t b = p[0];
        size_t n;
        uint8_t lo = 0x80, hi = 0xBF; /* range of the second byte */

        if (b < 0x80)
                return 1;
        if (b >= 0xC2 && b <= 0xDF)
                n = 2;
        else if (b >= 0xE0 && b <= 0xEF) {
                n = 3;
                if (b == 0xE0)
                        lo = 0xA0;
                else if (b == 0xED)
                        hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
                n = 4;
                if (b == 0xF0)
                        lo = 0x90;
                else if (b == 0xF4)
                        hi = 0x8F;
        } else
                return 0;
        if (left < n || p[1] < lo || p[1] > hi)
                return 0;
        for (size_t i = 2; i < n; i++)
                if ((p[i] & 0xC0) != 0x80)
                        return 0;
        return n;
}

/* The escaped form of the character at p[i] into tmp (8 bytes); its input length in *ret_n. */
size_t utf8_invalid_at(const char *s, size_t len) {
        const uint8_t *p = (const uint8_t *) s;
        size_t i = 0, n;
        while (i < len && (n = utf8_seq(p + i, len - i)) > 0)
                i += n;
        return i;
}

static size_t escape_one(const uint8_t *p, size_t i, size_t len, char tmp[static 8], size_t *ret_n) {
        size_t n = utf8_seq(p + i, len - i), tn = 0;

        if (n == 1 && p[i] >= 0x20 && p[i] < 0x7F && p[i] != '\\') {
                tmp[tn++] = (char) p[i];
        } else if (n == 1 && (p[i] == '\\' || p[i] == '\n' || p[i] == '\r' || p[i] == '\t')) {
                tmp[tn++] = '\\';
                tmp[tn++] = p[i] == '\\' ? '\\' : p[i] == '\n' ? 'n' : p[i] == '\r' ? 'r' : 't';
        } else if (n >= 2 && !(n == 2 && p[i] == 0xC2 && p[i + 1] < 0xA0)) {
                memcpy(tmp, p + i, n);
                tn = n;
        } else {
                /* a control character (C0, DEL, C1: each byte) or a byte of invalid UTF-8 */
                n = n == 2 ? 2 : 1;
                static const char hex[] = "0123456789abcdef";
                for (size_t k = 0; k < n; k++) {
                        tmp[tn++] = '\\';
                        tmp[tn++] = 'x';
                        tmp[tn++] = hex[p[i + k] >> 4];
                        tmp[tn++] = hex[p[i + k] & 15];
                }
        }
        *ret_n = n;
        return tn;
}

char *cescape(const char *s, size_t len, char *buf, size_t size) {
        const uint8_t *p = (const uint8_t *) s;
        size_t o = 0, total = 0, n;
        char tmp[8];

        if (size == 0)
                return buf;
        for (size_t i = 0; i < len; i += n)
                total += escape_one(p, i, len, tmp, &n);
        /* it all fits, or we stop early enough to leave room for "..." */
        size_t room = total + 1 <= size ? size - 1 : (size >= 4 ? size - 4 : 0);
        for (size_t i = 0; i < len; i += n) {
                size_t tn = escape_one(p, i, len, tmp, &n);
                if (o + tn > room)
                        break;
                memcpy(buf + o, tmp, tn);
                o += tn;
        }
        if (total + 1 > size && size >= 4) {
                memcpy(buf + o, "...", 3);
                o += 3;
        }
        buf[o] = 0;
        return buf;
}
