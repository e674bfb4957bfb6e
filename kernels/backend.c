/* SPDX-License-Identifier: MIT */
#include "backend.h"

#include <dlfcn.h>
#include <errno.h>
#include <string.h>

#include "util/log.h"

uint32_t x4_batch_logits_rows(const struct x4_batch *batch) {
        uint32_t rows = 0;

        for (uint32_t i = 0; i < batch->n_seqs; i++) {
                const struct x4_seq *s = &batch->seqs[i];
                if (s->logits == X4_LOGITS_LAST && s->n_tokens > 0)
                        rows += 1;
                else if (s->logits == X4_LOGITS_ALL)
                        rows += s->n_tokens;
        }
        return rows;
}

void x4_backend_params_default_log(int level, const char *message, void *userdata) {
        (void) userdata;
        (void) log_internal(level, 0, __FILE__, __LINE__, __func__, "%s", message);
}

#ifndef X4_CUDA_MODULE_DIR
#define X4_CUDA_MODULE_DIR ""
#endif

/* The CUDA backend lives in xing4d-cuda.so so the daemon runs where CUDA is not installed.
 * X4_CUDA_MODULE overrides the path (tests, build tree). */
static int backend_load_cuda(const struct x4_backend_ops **ret) {
        static const struct x4_backend_ops *cached;
        const char *path = getenv("X4_CUDA_MODULE");
        char buf[4096];
        void *h;

        if (cached) {
                *ret = cached;
                return 0;
        }
        if (!path || !*path) {
                if (X4_CUDA_MODULE_DIR[0])
                        snprintf(buf, sizeof buf, "%s/xing4d-cuda.so", X4_CUDA_MODULE_DIR);
                else
                        snprintf(buf, sizeof buf, "xing4d-cuda.so");
                path = buf;
        }
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h)
                return log_error_errno(ENOENT, "cannot load the CUDA backend module %s: %s", path,
                                       dlerror());
        const struct x4_backend_ops *ops = dlsym(h, "x4_backend_cuda");
        if (!ops) {
                dlclose(h);
                return log_error_errno(ENOENT, "%s has no symbol x4_backend_cuda", path);
        }
        *ret = cached = ops;
        return 0;
}

int x4_backend_get(const char *name, const struct x4_backend_ops **ret) {
        if (streq(name, "cpu")) {
                *ret = &x4_backend_cpu;
                return 0;
        }
        if (streq(name, "cuda"))
                return backend_load_cuda(ret);
        return log_error_errno(EINVAL, "unknown device '%s': expected cpu or cuda",
                               name ? name : "(null)");
}
