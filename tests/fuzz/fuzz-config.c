/* SPDX-License-Identifier: MIT */
/* Fuzz the daemon's INI configuration parser (daemon/main.c load_config + apply_option): any
 * bytes as /etc/xing4d/xing4d.conf must be taken or refused with a message, never crash, leak or
 * leave an option half set. main.c is compiled into this target with its main() renamed. */
#define main xing4d_main
#include "../../daemon/main.c"
#undef main

#include <sys/mman.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static int quiet;
        char path[64];

        if (!quiet) {
                log_set_max_level(-1); /* refusals are expected: keep the fuzzer's output clean */
                quiet = 1;
        }
        int fd = memfd_create("xing4d.conf", MFD_CLOEXEC);
        if (fd < 0)
                return 0;
        if (size > 0 && write(fd, data, size) != (ssize_t) size) {
                close(fd);
                return 0;
        }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        struct options o = { .grace_s = 30.0, .hello_timeout_s = 10.0, .idle_timeout_s = 600.0,
                             .page_tokens = 256, .log_level = LOG_INFO };
        (void) load_config(&o, path, true);
        options_free(&o);
        close(fd);
        return 0;
}
