/* SPDX-License-Identifier: MIT */
/* The CUDA module (xing4d-cuda.so) carries its own copy of the logger, so its errors reach the
 * caller only through struct x4_backend_params.log. Loaded from the build tree and asked to start
 * on the tiny fixture model with a device ordinal no machine has, create() must fail with -errno
 * and the caller's log_last_error() must say why ("CUDA backend: ..."): this is the text the
 * daemon's "--device auto" line shows. Runs without a GPU (libcudart is enough: the module then
 * fails one step earlier, "no usable CUDA device"); skipped when the module was not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../kernels/backend.h"
#include "model/xing4.h"
#include "common/log.h"

static char module_path[4096];

struct captured {
        unsigned calls;
        int last_level;
        char last[1024];
};

static void capture_log(int level, const char *message, void *userdata) {
        struct captured *c = userdata;
        c->calls++;
        c->last_level = level;
        snprintf(c->last, sizeof c->last, "%s", message);
}

struct env {
        struct x4_model *model;
        const struct x4_backend_ops *ops;
};

static int setup(void **state) {
        const char *build = getenv("X4_BUILD_DIR");
        struct env *e;

        if (!build || !*build) {
                fprintf(stderr, "X4_BUILD_DIR not set: cannot find the CUDA module\n");
                return -1;
        }
        snprintf(module_path, sizeof module_path, "%s/kernels/cuda/xing4d-cuda.so", build);
        if (access(module_path, R_OK) != 0)
                return 0; /* not built (-Dcuda=disabled): every test skips */
        setenv("X4_CUDA_MODULE", module_path, 1);

        e = calloc(1, sizeof *e);
        assert_non_null(e);
        struct x4_model_params mp = {.path = X4_FIXTURES "/xing4-tiny-a/model.gguf"};
        assert_int_equal(x4_model_open(&mp, &e->model, NULL, 0), 0);
        int r = x4_backend_get("cuda", &e->ops, NULL, 0);
        if (r < 0)
                fail_msg("%s built but not loadable: %s", module_path, log_last_error());
        *state = e;
        return 0;
}

static int teardown(void **state) {
        struct env *e = *state;
        if (e) {
                x4_model_free(e->model);
                free(e);
        }
        return 0;
}

#define SKIP_UNLESS_BUILT(e)                                                                       \
        do {                                                                                       \
                if (!(e)) {                                                                        \
                        fprintf(stderr, "%s not built: skipped\n", module_path);                  \
                        skip();                                                                    \
                }                                                                                  \
        } while (0)

/* create() hands the module's reason back as a value (err), whatever the logger does. */
static void test_create_failure_as_value(void **state) {
        struct env *e = *state;
        struct x4_backend *b = NULL;
        SKIP_UNLESS_BUILT(e);

        struct x4_backend_params bp = {.page_tokens = 16, .n_pages = 2, .device = 999,
                                       .log = x4_backend_params_default_log};
        char msg[512] = "";
        log_clear_last_error();
        int r = e->ops->create(e->model, &bp, &b, msg, sizeof msg);
        assert_true(r < 0);
        assert_null(b);
        assert_true(r == -ENODEV || r == -EIO || r == -EOPNOTSUPP);
        /* no device: "CUDA backend: no usable CUDA device: <cudart's reason>";
         * on a GPU machine: "CUDA backend: device 999 requested, N present" */
        if (!strstr(msg, "CUDA backend: no usable CUDA device: ") &&
            !strstr(msg, "CUDA backend: device 999 requested, "))
                fail_msg("err \"%s\" does not say why the CUDA backend did not start", msg);
        /* the cause after the colon is not empty (was: "CUDA backend not available ()") */
        assert_true(strlen(msg) > strlen("CUDA backend: no usable CUDA device: "));
}

/* A caller's own callback gets the message once, at error level; after the failed create the
 * module no longer forwards (a later create without a callback does not reach the old one). */
static void test_create_failure_custom_callback(void **state) {
        struct env *e = *state;
        struct x4_backend *b = NULL;
        struct captured cap = {0};
        SKIP_UNLESS_BUILT(e);

        struct x4_backend_params bp = {.page_tokens = 16, .n_pages = 2, .device = 999,
                                       .log = capture_log, .log_userdata = &cap};
        assert_true(e->ops->create(e->model, &bp, &b, NULL, 0) < 0);
        assert_int_equal(cap.calls, 1);
        assert_int_equal(cap.last_level, LOG_ERR);
        assert_non_null(strstr(cap.last, "CUDA backend: "));

        /* without a callback the module's messages stay in its own logger (stderr, quietened
         * and stderr), the old callback is not called */
        int saved = dup(STDERR_FILENO);
        int devnull = open("/dev/null", O_WRONLY);
        assert_true(saved >= 0 && devnull >= 0);
        dup2(devnull, STDERR_FILENO);
        struct x4_backend_params bp2 = {.page_tokens = 16, .n_pages = 2, .device = 999};
        char msg[512] = "";
        int r = e->ops->create(e->model, &bp2, &b, msg, sizeof msg);
        dup2(saved, STDERR_FILENO);
        close(saved);
        close(devnull);
        assert_true(r < 0);
        assert_int_equal(cap.calls, 1);
        /* the reason still comes back, from the module's own logger */
        assert_non_null(strstr(msg, "CUDA backend: "));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_create_failure_as_value),
                cmocka_unit_test(test_create_failure_custom_callback),
        };
        const char *build = getenv("X4_BUILD_DIR");
        if (build && *build) {
                snprintf(module_path, sizeof module_path, "%s/kernels/cuda/xing4d-cuda.so", build);
                if (access(module_path, R_OK) != 0) {
                        /* meson counts 77 as skipped, not passed */
                        fprintf(stderr, "%s not built (-Dcuda=disabled): skipped\n", module_path);
                        return 77;
                }
        }
        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, setup, teardown);
}
