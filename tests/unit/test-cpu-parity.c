/* SPDX-License-Identifier: MIT */
/* Oracle parity of the CPU backend on the xing4-tiny-a fixture (tests/fixtures/xing4-tiny-a):
 * every case of cases.json is run the way its README describes (the prompt as ONE batch with
 * logits for every position, then each decode id fed on its own at the next position) and the
 * stored rows are compared with
 *   - the float64 spec reference (*.ref_f64.f32.bin): max |ours - ref| <= 1e-4 × max |ref| per
 *     case (we compute in fp32 with exact dequantization, so only fp32 rounding separates us);
 *   - llama.cpp's logits (*.logits.f32.bin): rms(ours - llama) / rms(llama) <= 3e-2 per case
 *     (llama.cpp rounds activations to bf16/q8; the README measures 0.016 for the reference).
 * The measured errors are printed per case. With X4_TEST_CPU_MATH=fast the fast numerics are held
 * to FAST_REF_BOUND against the float64 reference instead, and to the same llama.cpp bound.
 * X4_TEST_FIXTURE names another fixture folder: xing4-tiny-a-q4km is the same model requantized
 * by llama.cpp to Q4_K_M (Q4_K, Q5_0, Q5_1, Q8_0, Q6_K), with llama.cpp's logits and no float64
 * reference. A case without one is held to llama.cpp's logits row by row: the median row's rms
 * difference at most ROW_MEDIAN_BOUND and the argmax the same in 3 rows of 4. Its prompts were
 * chosen for the release's model, not for this one: some rows sit at a near tie of the expert
 * choice (a top-k margin of 1e-3), where llama.cpp's q8 activations choose another expert and
 * the row moves by up to 65% (the fixture's README). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model/xing4.h"
#include "common/json.h"
#include "common/log.h"

#define PAGE_TOKENS 256u
/* X4_TEST_CPU_MATH=fast (meson's cpu-parity-fast): the fast numerics round activations to bf16
 * and q8 (kernels/cpu/quant.h), as llama.cpp does; their bound against the float64 reference */
#define FAST_REF_BOUND 3e-2
/* a case without a float64 reference: its median row against llama.cpp (on xing4-tiny-a-q4km the
 * medians were 2.3e-2 to 2.7e-2 with the reference numerics, 3.2e-2 to 3.3e-2 with the fast ones;
 * a misread format moves every row by tens of percent) */
#define ROW_MEDIAN_BOUND 4e-2

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return x < y ? -1 : x > y;
}

static char fixture_dir[4096];

static void fixture_path(char *buf, size_t size, const char *name) {
        snprintf(buf, size, "%s/%s", fixture_dir, name);
}

/* The whole file as float32 rows; asserts its size is rows × vocab floats. */
static float *read_rows(const char *name, size_t rows, size_t vocab) {
        char path[4200];
        float *buf = malloc(rows * vocab * sizeof(float));
        FILE *f;

        fixture_path(path, sizeof path, name);
        f = fopen(path, "re");
        assert_non_null(f);
        assert_non_null(buf);
        assert_int_equal(fread(buf, sizeof(float) * vocab, rows, f), rows);
        assert_int_equal(fgetc(f), EOF); /* nothing beyond the stated shape */
        fclose(f);
        return buf;
}

static int32_t *json_ids(const struct json_value *arr, size_t *n) {
        int32_t *ids;

        assert_non_null(arr);
        assert_int_equal(json_type(arr), JSON_ARRAY);
        *n = json_count(arr);
        ids = calloc(*n ? *n : 1, sizeof *ids);
        assert_non_null(ids);
        for (size_t i = 0; i < *n; i++)
                ids[i] = (int32_t) json_int(json_array_at(arr, i));
        return ids;
}

static void run_case(const struct x4_backend_ops *ops, struct x4_backend *b, uint32_t n_vocab,
                     const struct json_value *cs, double ref_bound) {
        const char *id = json_string(json_object_get(cs, "id"));
        size_t n_prompt, n_decode, n_rows;
        _cleanup_free_ int32_t *prompt = json_ids(json_object_get(cs, "prompt_ids"), &n_prompt);
        _cleanup_free_ int32_t *decode = json_ids(json_object_get(cs, "decode_ids"), &n_decode);
        _cleanup_free_ int32_t *positions = json_ids(json_object_get(cs, "row_positions"), &n_rows);
        _cleanup_free_ uint32_t *pages = NULL;
        _cleanup_free_ float *all = NULL, *ours = NULL, *ref = NULL, *llama = NULL;
        uint32_t n_pages = (uint32_t) ((n_prompt + n_decode + PAGE_TOKENS - 1) / PAGE_TOKENS);
        double max_err = 0, max_ref = 0, se = 0, sl = 0;
        size_t argmax_agree = 0;
        _cleanup_free_ double *row_rms = NULL;

        pages = calloc(n_pages, sizeof *pages);
        all = malloc((n_prompt + n_decode) * n_vocab * sizeof(float));
        ours = malloc(n_rows * n_vocab * sizeof(float));
        assert_non_null(pages);
        assert_non_null(all);
        assert_non_null(ours);
        for (uint32_t i = 0; i < n_pages; i++)
                pages[i] = i;

        /* the prompt as one batch, logits for every position */
        struct x4_seq seq = { .tokens = prompt, .n_tokens = (uint32_t) n_prompt, .pos0 = 0,
                              .pages = pages, .n_pages = n_pages, .logits = X4_LOGITS_ALL };
        struct x4_batch batch = { .seqs = &seq, .n_seqs = 1 };
        assert_int_equal(ops->forward(b, &batch, all, NULL, 0), 0);
        /* then each decode id alone at the next position */
        for (size_t k = 0; k < n_decode; k++) {
                seq = (struct x4_seq) { .tokens = decode + k, .n_tokens = 1,
                                        .pos0 = (uint32_t) (n_prompt + k), .pages = pages,
                                        .n_pages = n_pages, .logits = X4_LOGITS_LAST };
                assert_int_equal(ops->forward(b, &batch, all + (n_prompt + k) * n_vocab, NULL, 0), 0);
        }
        for (size_t r = 0; r < n_rows; r++) {
                assert_true(positions[r] >= 0 && (size_t) positions[r] < n_prompt + n_decode);
                memcpy(ours + r * n_vocab, all + (size_t) positions[r] * n_vocab,
                       n_vocab * sizeof(float));
        }

        const char *ref_file = json_string(json_object_get(cs, "reference_f64_logits_file"));
        llama = read_rows(json_string(json_object_get(cs, "logits_file")), n_rows, n_vocab);
        ref = ref_file ? read_rows(ref_file, n_rows, n_vocab) : NULL;
        row_rms = calloc(n_rows, sizeof *row_rms);
        assert_non_null(row_rms);
        for (size_t r = 0; r < n_rows; r++) {
                size_t am_o = 0, am_r = 0;
                double rse = 0, rsl = 0;

                for (size_t v = 0; v < n_vocab; v++) {
                        size_t i = r * n_vocab + v;

                        const float *cmp = ref ? ref : llama; /* argmax against the f64 reference, else llama.cpp */

                        assert_true(isfinite(ours[i]));
                        if (ref) {
                                max_err = fmax(max_err, fabs((double) ours[i] - ref[i]));
                                max_ref = fmax(max_ref, fabs((double) ref[i]));
                        }
                        rse += ((double) ours[i] - llama[i]) * ((double) ours[i] - llama[i]);
                        rsl += (double) llama[i] * llama[i];
                        if (ours[i] > ours[r * n_vocab + am_o])
                                am_o = v;
                        if (cmp[i] > cmp[r * n_vocab + am_r])
                                am_r = v;
                }
                argmax_agree += am_o == am_r;
                se += rse;
                sl += rsl;
                row_rms[r] = sqrt(rse / rsl);
        }
        double rel = ref ? max_err / max_ref : 0, rms_rel = sqrt(se / sl);

        if (ref)
                print_message("%-16s rows %2zu  vs f64 ref: max abs %.3g (max |ref| %.3g, rel %.3g <= %g)"
                              "  argmax %zu/%zu  vs llama.cpp: rms rel %.4f (<= 3e-2)\n",
                              id, n_rows, max_err, max_ref, rel, ref_bound, argmax_agree, n_rows, rms_rel);
        if (ref) {
                assert_true(rel <= ref_bound);
                assert_true(rms_rel <= 3e-2);
                return;
        }
        for (size_t r = 0; r < n_rows; r++)
                print_message("%-16s row %2zu (position %d) vs llama.cpp: rms rel %.4f\n", id, r, positions[r], row_rms[r]);
        qsort(row_rms, n_rows, sizeof *row_rms, cmp_double);
        double median = n_rows % 2 ? row_rms[n_rows / 2] : (row_rms[n_rows / 2 - 1] + row_rms[n_rows / 2]) / 2;
        print_message("%-16s rows %2zu  no f64 ref  vs llama.cpp: median row rms rel %.4f (<= %g), argmax %zu/%zu "
                      "(>= 3/4)\n",
                      id, n_rows, median, ROW_MEDIAN_BOUND, argmax_agree, n_rows);
        assert_true(median <= ROW_MEDIAN_BOUND);
        assert_true(4 * argmax_agree >= 3 * n_rows);
}

static void test_fixture_cases(void **state) {
        _cleanup_(x4_model_freep) struct x4_model *model = NULL;
        _cleanup_(json_freep) struct json_value *cases = NULL;
        struct x4_backend *b = NULL;
        const struct x4_backend_ops *ops;
        char path[4200];
        size_t max_tokens = 0;

        const char *math = getenv("X4_TEST_CPU_MATH");
        bool fast = math && !strcmp(math, "fast");

        (void) state;
        fixture_path(path, sizeof path, "model.gguf");
        struct x4_model_params mp = { .path = path };
        assert_int_equal(x4_model_open(&mp, &model, NULL, 0), 0);
        fixture_path(path, sizeof path, "cases.json");
        assert_int_equal(json_parse_file(path, &cases, NULL, 0), 0);
        const struct json_value *list = json_object_get(cases, "cases");
        assert_non_null(list);
        assert_int_equal(json_count(list), 3);
        for (size_t i = 0; i < json_count(list); i++) {
                const struct json_value *cs = json_array_at(list, i);
                size_t n = json_count(json_object_get(cs, "prompt_ids")) +
                           json_count(json_object_get(cs, "decode_ids"));
                max_tokens = n > max_tokens ? n : max_tokens;
        }

        assert_int_equal(x4_backend_get("cpu", &ops, NULL, 0), 0);
        struct x4_backend_params bp = {
                .n_threads = 2,
                .page_tokens = PAGE_TOKENS,
                .n_pages = (uint32_t) ((max_tokens + PAGE_TOKENS - 1) / PAGE_TOKENS),
                .cache_type = X4_CACHE_F32,
                .cpu_math = fast ? X4_CPU_MATH_FAST : X4_CPU_MATH_FP32,
        };
        assert_int_equal(ops->create(model, &bp, &b, NULL, 0), 0);
        for (size_t i = 0; i < json_count(list); i++)
                run_case(ops, b, x4_model_config(model)->n_vocab, json_array_at(list, i),
                         fast ? FAST_REF_BOUND : 1e-4);
        ops->destroy(b);
}

int main(void) {
        const char *env = getenv("X4_FIXTURES"), *name = getenv("X4_TEST_FIXTURE");
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fixture_cases),
        };

        snprintf(fixture_dir, sizeof fixture_dir, "%s/%s", env && *env ? env : X4_FIXTURES,
                 name && *name ? name : "xing4-tiny-a");
        log_set_max_level(LOG_WARNING);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
