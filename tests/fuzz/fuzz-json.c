/* SPDX-License-Identifier: MIT */
/* libFuzzer target for the JSON module: any input is either refused with a "line L column C"
 * message or parses into a tree whose dump reads back to the same tree (dump is a fixed point),
 * with and without ensure_ascii, compact, sorted and indented. Non-finite doubles (1e999) are
 * written as Python writes them (Infinity), which strict JSON cannot read back: those trees skip
 * the read-back check. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"

static bool all_finite(const struct json_value *v) {
        switch (json_type(v)) {
        case JSON_DOUBLE:
                return isfinite(json_number(v));
        case JSON_ARRAY:
                for (size_t i = 0; i < json_count(v); i++)
                        if (!all_finite(json_array_at(v, i)))
                                return false;
                return true;
        case JSON_OBJECT:
                for (size_t i = 0; i < json_count(v); i++)
                        if (!all_finite(json_object_value_at(v, i)))
                                return false;
                return true;
        default:
                return true;
        }
}

/* dump(parse(dump(v, flags))) == dump(v, flags) */
static void check_fixed_point(const struct json_value *v, unsigned flags, int indent) {
        _cleanup_free_ char *a = json_dump(v, flags, indent);
        if (!a)
                __builtin_trap();
        _cleanup_(json_freep) struct json_value *w = NULL;
        if (json_parse(a, strlen(a), "dump", &w, NULL, 0) < 0)
                __builtin_trap(); /* we wrote something we cannot read */
        _cleanup_free_ char *b = json_dump(w, flags, indent);
        if (!b || strcmp(a, b) != 0)
                __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(json_freep) struct json_value *v = NULL;

        log_set_max_level(LOG_CRIT);
        log_clear_last_error();
        if (json_parse((const char *) data, size, "fuzz", &v, NULL, 0) < 0) {
                /* every refusal says where */
                if (strncmp(log_last_error(), "fuzz: line ", 11) != 0)
                        __builtin_trap();
                return 0;
        }
        if (!all_finite(v)) {
                free(json_dump(v, JSON_ASCII | JSON_SORT_KEYS, 2));
                return 0;
        }
        check_fixed_point(v, 0, 0);
        check_fixed_point(v, JSON_ASCII, 0);
        check_fixed_point(v, JSON_COMPACT | JSON_SORT_KEYS, 0);
        check_fixed_point(v, JSON_ASCII, 3);
        /* ensure_ascii changes the spelling, never the value */
        _cleanup_free_ char *plain = json_dump(v, 0, 0), *ascii = json_dump(v, JSON_ASCII, 0);
        _cleanup_(json_freep) struct json_value *w = NULL;
        if (json_parse(ascii, strlen(ascii), "ascii", &w, NULL, 0) < 0)
                __builtin_trap();
        _cleanup_free_ char *again = json_dump(w, 0, 0);
        if (strcmp(plain, again) != 0)
                __builtin_trap();
        return 0;
}
