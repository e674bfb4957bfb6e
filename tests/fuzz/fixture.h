/* SPDX-License-Identifier: MIT */
/* The committed fixture tokenizer the fuzzers load once (tests/tokenizer/spm-bpe8k.gguf, 8,000
 * pieces with byte fallback): $X4_TOKENIZER_FIXTURE, else
 * $X4_SOURCE_DIR/tests/tokenizer/spm-bpe8k.gguf, else found from the source tree this file was
 * compiled from. A header, not a .c: tests/fuzz builds each fuzz-NAME.c on its own. */
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/tokenizer.h"
#include "common/log.h"

/* Loads the fixture into *tok, its file name into path; on failure prints "IDENT: cannot load
 * PATH: ERROR" and aborts. Logging is left at LOG_CRIT (the fuzzers' inputs are mostly errors). */
static inline void fuzz_load_tokenizer(const char *ident, struct tokenizer **tok, char *path, size_t size) {
        const char *env = getenv("X4_TOKENIZER_FIXTURE");
        const char *src = getenv("X4_SOURCE_DIR");
        if (env)
                snprintf(path, size, "%s", env);
        else if (src)
                snprintf(path, size, "%s/tests/tokenizer/spm-bpe8k.gguf", src);
        else {
                /* __FILE__ is <source>/tests/fuzz/fixture.h */
                snprintf(path, size, "%s", __FILE__);
                char *slash = strrchr(path, '/');
                if (slash)
                        snprintf(slash, size - (size_t) (slash - path), "/../tokenizer/spm-bpe8k.gguf");
        }
        log_set_max_level(LOG_CRIT);
        if (tokenizer_load(path, tok) < 0) {
                fprintf(stderr, "%s: cannot load %s: %s\n", ident, path, log_last_error());
                abort();
        }
}
