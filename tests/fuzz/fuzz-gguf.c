/* SPDX-License-Identifier: MIT */
/* libFuzzer target for the GGUF reader: any input either is refused with a message or opens into
 * a file whose every key, every array element (nested too) and every tensor's data can be read
 * through the public API without touching memory outside the input. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gguf/gguf.h"
#include "common/log.h"

static volatile uint64_t sink;

static void touch(const void *p, uint64_t n) {
        const uint8_t *b = p;
        uint64_t sum = 0;
        for (uint64_t i = 0; i < n; i++)
                sum += b[i];
        sink += sum;
}

static void walk_array(const struct gguf_value *arr, int depth) {
        /* the reader refuses nesting deeper than 8; anything deeper here is a reader bug */
        if (depth > 8)
                __builtin_trap();
        if (arr->type != GGUF_TYPE_ARRAY)
                __builtin_trap();
        for (uint64_t i = 0; i < arr->arr.n; i++) {
                uint64_t u;
                int64_t s;
                double d;
                bool b;
                struct gguf_string str;
                struct gguf_value e;

                if (gguf_array_get_u64(arr, i, &u) == 0)
                        sink += u;
                if (gguf_array_get_i64(arr, i, &s) == 0)
                        sink += (uint64_t) s;
                if (gguf_array_get_f64(arr, i, &d) == 0)
                        sink += d == d;
                if (gguf_array_get_bool(arr, i, &b) == 0)
                        sink += b;
                if (gguf_array_get_string(arr, i, &str) == 0)
                        touch(str.data, str.len);
                if (gguf_array_get_array(arr, i, &e) == 0)
                        walk_array(&e, depth + 1);
        }
        /* one past the end is refused, not read */
        if (gguf_array_get_u64(arr, arr->arr.n, &(uint64_t) { 0 }) != -ERANGE)
                __builtin_trap();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        (void) argc;
        (void) argv;
        log_set_max_level(LOG_CRIT);
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        struct gguf_file *f = NULL;
        int r;

        log_clear_last_error();
        r = gguf_open_buffer(data, size, &f);
        if (r < 0) {
                /* every refusal says why */
                if (f || log_last_error()[0] == 0)
                        __builtin_trap();
                return 0;
        }

        sink += gguf_version(f) + gguf_alignment(f) + gguf_data_offset(f) + gguf_file_size(f);
        if (gguf_data_offset(f) > gguf_file_size(f))
                __builtin_trap();

        for (size_t i = 0; i < gguf_kv_count(f); i++) {
                const struct gguf_kv *kv = gguf_kv_at(f, i);
                const char *key = kv->key;
                uint64_t u;
                uint32_t u32;
                int64_t s;
                double d;
                bool b;
                struct gguf_string str;
                const struct gguf_value *arr;

                if (gguf_kv_find(f, key) != kv)
                        __builtin_trap();
                touch(key, strlen(key));
                if (gguf_get_u64(f, key, &u) == 0)
                        sink += u;
                if (gguf_get_u32(f, key, &u32) == 0)
                        sink += u32;
                if (gguf_get_i64(f, key, &s) == 0)
                        sink += (uint64_t) s;
                if (gguf_get_f64(f, key, &d) == 0)
                        sink += d == d;
                if (gguf_get_bool(f, key, &b) == 0)
                        sink += b;
                if (gguf_get_string(f, key, &str) == 0)
                        touch(str.data, str.len);
                if (gguf_get_array(f, key, &arr) == 0)
                        walk_array(arr, 1);
                sink += strlen(gguf_value_type_name(kv->value.type));
        }

        for (size_t i = 0; i < gguf_tensor_count(f); i++) {
                const struct gguf_tensor *t = gguf_tensor_at(f, i);
                const uint8_t *p = t->data;

                if (gguf_tensor_find(f, t->name) != t)
                        __builtin_trap();
                if (t->size == 0 || p < data || p + t->size > data + size)
                        __builtin_trap();
                sink += p[0] + p[t->size - 1] + t->n_elements + t->type;
        }

        gguf_close(f);
        return 0;
}
