/* SPDX-License-Identifier: MIT */
/* Fuzz the frame decoder: arbitrary bytes fed in chunk sizes taken from the input must never
 * crash, never hand out more than the cap, and must yield the same frames as one big feed. */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "common/frame.h"
#include "common/log.h"

#define CAP 4096u

static unsigned decode(const uint8_t *data, size_t size, size_t chunk, uint64_t *sum) {
        _cleanup_(frame_decoder_freep) struct frame_decoder *d = NULL;
        unsigned frames = 0;

        assert(frame_decoder_new(CAP, &d) == 0);
        for (size_t off = 0; off < size;) {
                size_t len = MIN(chunk, size - off), c;
                int r = frame_decoder_feed(d, data + off, len, &c, NULL, 0);
                assert(c <= len);
                off += c;
                if (r < 0)
                        break;
                if (r == 1) {
                        const uint8_t *p;
                        size_t n;
                        frame_decoder_payload(d, &p, &n);
                        assert(n <= CAP);
                        for (size_t k = 0; k < n; k++)
                                *sum = *sum * 31 + p[k];
                        frames++;
                }
        }
        return frames;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static int quiet;
        uint64_t s1 = 0, s2 = 0;

        if (!quiet) {
                log_set_max_level(LOG_CRIT);
                quiet = 1;
        }
        if (size < 1)
                return 0;
        size_t chunk = 1 + data[0] % 17;
        unsigned a = decode(data + 1, size - 1, chunk, &s1);
        unsigned b = decode(data + 1, size - 1, SIZE_MAX, &s2);
        assert(a == b && s1 == s2);
        return 0;
}
