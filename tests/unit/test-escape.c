/* SPDX-License-Identifier: MIT */
/* cescape: what a client sends can neither forge a log line nor put invalid UTF-8 in an Error.
 * utf8_invalid_at: where text stops being UTF-8 (x4ctl names that byte). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/escape.h"

static const char *esc(const char *s, size_t len, size_t size) {
        static char buf[256];
        return cescape(s, len, buf, size);
}

static void test_plain_text_and_utf8_pass(void **state) {
        assert_string_equal(esc("pytest 1.0", 10, 256), "pytest 1.0");
        /* é, €, 😀: two, three and four bytes */
        const char *u = "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
        assert_string_equal(esc(u, strlen(u), 256), u);
}

static void test_controls_are_escaped(void **state) {
        const char *s = "a\nINFO forged\r\t\\\x1b[31m\x7f";
        assert_string_equal(esc(s, strlen(s), 256), "a\\nINFO forged\\r\\t\\\\\\x1b[31m\\x7f");
        /* C1 controls (U+0080..U+009F) are escaped too, U+00A0 is not */
        assert_string_equal(esc("\xc2\x85|\xc2\xa0", 5, 256), "\\xc2\\x85|\xc2\xa0");
        /* an embedded NUL, when the length is known */
        assert_string_equal(esc("a\0b", 3, 256), "a\\x00b");
}

static void test_invalid_utf8_is_escaped(void **state) {
        /* lone continuation, truncated sequence, overlong '/', surrogate, above U+10FFFF */
        const char *s = "\x80|\xe2\x82|\xc0\xaf|\xed\xa0\x80|\xf4\x90\x80\x80";
        assert_string_equal(esc(s, strlen(s), 256),
                            "\\x80|\\xe2\\x82|\\xc0\\xaf|\\xed\\xa0\\x80|\\xf4\\x90\\x80\\x80");
}

static void test_truncation_keeps_characters_whole(void **state) {
        assert_string_equal(esc("abcde", 5, 6), "abcde"); /* fits exactly */
        assert_string_equal(esc("abcdef", 6, 6), "ab...");
        /* never half an escape or half a UTF-8 sequence */
        assert_string_equal(esc("a\n", 2, 5), "a\\n");
        assert_string_equal(esc("a\x01zzzz", 6, 8), "a...");
        assert_string_equal(esc("\xe2\x82\xac\xe2\x82\xac", 6, 7), "\xe2\x82\xac\xe2\x82\xac");
        assert_string_equal(esc("\xe2\x82\xac\xe2\x82\xac", 6, 6), "...");
        assert_string_equal(esc("abc", 3, 1), "");
}

static void test_utf8_invalid_at(void **state) {
        assert_int_equal(utf8_invalid_at("", 0), 0);
        assert_int_equal(utf8_invalid_at("caf\xc3\xa9 \xf0\x9f\x98\x80", 10), 10);
        assert_int_equal(utf8_invalid_at("ab\xff", 3), 2);
        assert_int_equal(utf8_invalid_at("caf\xe9", 4), 3);          /* Latin-1 */
        assert_int_equal(utf8_invalid_at("x\xc3", 2), 1);            /* cut short */
        assert_int_equal(utf8_invalid_at("\xc0\xaf", 2), 0);         /* overlong */
        assert_int_equal(utf8_invalid_at("a\xed\xa0\x80", 4), 1);    /* a surrogate */
        assert_int_equal(utf8_invalid_at("a\0b", 3), 3);             /* NUL is UTF-8 */
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_plain_text_and_utf8_pass),
                cmocka_unit_test(test_controls_are_escaped),
                cmocka_unit_test(test_invalid_utf8_is_escaped),
                cmocka_unit_test(test_truncation_keeps_characters_whole),
                cmocka_unit_test(test_utf8_invalid_at),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
