/* SPDX-License-Identifier: MIT */
/* Fuzz the daemon's request dispatch: any bytes as a frame payload are decoded as a protobuf Frame
 * and handed to what the server does with it before the engine (daemon/server.c: the generate
 * request converted to a scheduler request, snapshot names checked), then to the scheduler's
 * validation (ranges, token ids, stop strings, constraints compiled) on a real scheduler over the
 * tiny fixture model. Nothing may crash or leak; every refusal names a field. server.c is compiled
 * into this target so its static converters are reachable. */
#include "../../daemon/server.c"

#include "backend.h"
#include "chat/tokenizer.h"
#include "model/xing4.h"

#ifndef X4_FIXTURES
#define X4_FIXTURES "tests/fixtures"
#endif

static struct sched *S;

static void setup(void) {
        static struct x4_model *model;
        static struct x4_backend *backend;
        static struct tokenizer *tok;
        char path[4096];
        const char *env = getenv("X4_FIXTURES");

        log_set_max_level(-1);
        snprintf(path, sizeof path, "%s/xing4-tiny-a/model.gguf", env && *env ? env : X4_FIXTURES);
        struct x4_model_params mp = { .path = path };
        struct x4_backend_params bp = { .n_threads = 1, .page_tokens = 16, .n_pages = 8 };
        if (x4_model_open(&mp, &model, NULL, 0) < 0 || x4_backend_cpu.create(model, &bp, &backend, NULL, 0) < 0)
                abort();
        if (tokenizer_new_from_gguf(x4_model_gguf(model), &tok, NULL, 0) < 0)
                tok = NULL; /* token-id prompts only */
        struct sched_params sp = { .model = model, .ops = &x4_backend_cpu, .backend = backend,
                                   .tokenizer = tok, .max_running = 2, .max_waiting = 2 };
        if (sched_new(&sp, &S) < 0)
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char err[1024];

        if (!S)
                setup();
        Xing4__Frame *f = xing4__frame__unpack(NULL, size, data);
        if (!f)
                return 0;
        switch (f->body_case) {
        case XING4__FRAME__BODY_GENERATE: {
                struct sched_request *r = NULL;
                if (convert_generate(f->generate, &r) >= 0 && r) {
                        err[0] = 0;
                        int code = sched_validate(S, r, err, sizeof err);
                        if (code != 0 && !err[0])
                                abort(); /* a refusal always says what is wrong */
                        sched_request_free(r);
                }
                break;
        }
        case XING4__FRAME__BODY_SNAPSHOT:
                if (f->snapshot->name)
                        (void) sched_snapshot_check_name(f->snapshot->name, err, sizeof err);
                break;
        default:
                break;
        }
        xing4__frame__free_unpacked(f, NULL);
        return 0;
}
