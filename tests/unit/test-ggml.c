/* SPDX-License-Identifier: MIT */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>

#include "gguf/ggml.h"

static void test_row_bytes(void **state) {
        uint64_t n;

        (void) state;
        /* docs/model.md §6: a 3584-wide IQ4_NL row is 112 blocks = 2016 B; Q6_K 14 blocks = 2940 B */
        assert_int_equal(ggml_row_bytes(GGML_TYPE_IQ4_NL, 3584, &n), 0);
        assert_int_equal(n, 2016);
        assert_int_equal(ggml_row_bytes(GGML_TYPE_Q6_K, 3584, &n), 0);
        assert_int_equal(n, 2940);
        assert_int_equal(ggml_row_bytes(GGML_TYPE_BF16, 3584, &n), 0);
        assert_int_equal(n, 7168);
        /* ragged rows and unknown types are refused */
        assert_int_equal(ggml_row_bytes(GGML_TYPE_IQ4_NL, 33, &n), -EINVAL);
        assert_int_equal(ggml_row_bytes(4, 32, &n), -EINVAL);
        assert_int_equal(ggml_row_bytes(GGML_TYPE_F32, UINT64_MAX / 2, &n), -EOVERFLOW);
        assert_string_equal(ggml_type_name(GGML_TYPE_IQ4_NL), "IQ4_NL");
        assert_string_equal(ggml_type_name(77), "type#77");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_row_bytes),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
