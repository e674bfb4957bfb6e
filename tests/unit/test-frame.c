/* SPDX-License-Identifier: MIT */
/* Framing: whole frames come out whatever the chunking of the byte stream, and an oversized
 * header is refused before anything is allocated, with a message naming both sizes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/frame.h"
#include "common/log.h"

/* Build a stream of frames whose payload i has i*37 % 300 bytes of pattern (i + k). */
static size_t build_stream(uint8_t *buf, size_t cap, unsigned n_frames) {
        size_t off = 0;
        for (unsigned i = 0; i < n_frames; i++) {
                size_t n = (i * 37u) % 300u;
                assert_true(off + 4 + n <= cap);
                assert_int_equal(frame_encode_header(n, FRAME_MAX_DEFAULT, buf + off), 0);
                off += 4;
                for (size_t k = 0; k < n; k++)
                        buf[off + k] = (uint8_t) (i + k);
                off += n;
        }
        return off;
}

static void check_chunked(size_t chunk) {
        static uint8_t stream[64 * 1024];
        _cleanup_(frame_decoder_freep) struct frame_decoder *d = NULL;
        unsigned n_frames = 50, got = 0;
        size_t total = build_stream(stream, sizeof stream, n_frames);

        assert_int_equal(frame_decoder_new(FRAME_MAX_DEFAULT, &d), 0);
        for (size_t off = 0; off < total;) {
                size_t len = MIN(chunk, total - off), used = 0;
                while (used < len) {
                        size_t c;
                        int r = frame_decoder_feed(d, stream + off + used, len - used, &c, NULL, 0);
                        assert_true(r >= 0);
                        used += c;
                        if (r == 1) {
                                const uint8_t *p;
                                size_t n;
                                frame_decoder_payload(d, &p, &n);
                                assert_int_equal(n, (got * 37u) % 300u);
                                for (size_t k = 0; k < n; k++)
                                        assert_int_equal(p[k], (uint8_t) (got + k));
                                got++;
                        }
                }
                off += len;
        }
        assert_int_equal(got, n_frames);
        assert_int_equal(frame_decoder_pending(d), 0);
}

static void test_chunkings(void **state) {
        /* byte by byte, odd sizes straddling headers, and all at once */
        size_t sizes[] = { 1, 2, 3, 5, 7, 64, 301, 4096, 1 << 20 };
        for (size_t i = 0; i < ELEMENTSOF(sizes); i++)
                check_chunked(sizes[i]);
}

static void test_empty_payload(void **state) {
        _cleanup_(frame_decoder_freep) struct frame_decoder *d = NULL;
        uint8_t zero[4] = { 0, 0, 0, 0 };
        size_t c;
        const uint8_t *p;
        size_t n = 99;

        assert_int_equal(frame_decoder_new(16, &d), 0);
        assert_int_equal(frame_decoder_feed(d, zero, 3, &c, NULL, 0), 0);
        assert_int_equal(c, 3);
        assert_int_equal(frame_decoder_pending(d), 3);
        assert_int_equal(frame_decoder_feed(d, zero + 3, 1, &c, NULL, 0), 1);
        frame_decoder_payload(d, &p, &n);
        assert_int_equal(n, 0);
}

static void test_oversized_refused(void **state) {
        _cleanup_(frame_decoder_freep) struct frame_decoder *d = NULL;
        /* 0xFFFFFFFF announced: must be refused without allocating 4 GiB */
        uint8_t hdr[6] = { 0xff, 0xff, 0xff, 0xff, 1, 2 };
        size_t c;

        assert_int_equal(frame_decoder_new(1024, &d), 0);
        assert_int_equal(frame_decoder_feed(d, hdr, sizeof hdr, &c, NULL, 0), -EMSGSIZE);
        assert_int_equal(c, 4);
        assert_string_equal(log_last_error(),
                            "frame payload of 4294967295 bytes exceeds the limit of 1024 bytes");
        /* the stream is out of sync: further feeding fails */
        char err[128] = "";
        assert_int_equal(frame_decoder_feed(d, hdr + 4, 2, &c, err, sizeof err), -EPROTO);
        assert_string_equal(err, "frame stream lost sync after an earlier error");
}

static void test_limit_boundary(void **state) {
        _cleanup_(frame_decoder_freep) struct frame_decoder *d = NULL;
        uint8_t buf[4 + 100];
        size_t c;

        assert_int_equal(frame_decoder_new(100, &d), 0);
        assert_int_equal(frame_encode_header(100, 100, buf), 0);
        memset(buf + 4, 'x', 100);
        assert_int_equal(frame_decoder_feed(d, buf, sizeof buf, &c, NULL, 0), 1);
        assert_int_equal(c, sizeof buf);

        assert_int_equal(frame_encode_header(101, 100, buf), -EMSGSIZE);
        assert_string_equal(log_last_error(),
                            "frame payload of 101 bytes exceeds the limit of 100 bytes");
        buf[3] = 101;
        assert_int_equal(frame_decoder_feed(d, buf, 4, &c, NULL, 0), -EMSGSIZE);
}

static void test_bad_limits(void **state) {
        struct frame_decoder *d = NULL;
        assert_int_equal(frame_decoder_new(0, &d), -EINVAL);
        assert_string_equal(log_last_error(), "frame limit 0 bytes: must be 1..1073741824");
        assert_int_equal(frame_decoder_new(FRAME_MAX_LIMIT + 1u, &d), -EINVAL);
        assert_null(d);
}

static void test_header_roundtrip(void **state) {
        uint8_t h[4];
        assert_int_equal(frame_encode_header(0x01020304, FRAME_MAX_LIMIT, h), 0);
        assert_int_equal(h[0], 1);
        assert_int_equal(h[3], 4);
        assert_int_equal(frame_header_length(h), 0x01020304);
}

/* The admit hook sees every announced size before the body buffer exists; a refusal breaks the
 * stream like an oversized header does. */
static int admit_below_1000(uint32_t len, void *userdata) {
        unsigned *calls = userdata;
        (*calls)++;
        return len < 1000 ? 0 : -ENOBUFS;
}

static void test_admit_hook_and_trim(void **state) {
        _cleanup_(frame_decoder_freep) struct frame_decoder *d = NULL;
        static uint8_t buf[4 + 100000];
        unsigned calls = 0;
        size_t c;

        assert_int_equal(frame_decoder_new(FRAME_MAX_DEFAULT, &d), 0);
        frame_decoder_set_admit(d, admit_below_1000, &calls);
        assert_int_equal(frame_encode_header(10, FRAME_MAX_DEFAULT, buf), 0);
        memset(buf + 4, 'a', 10);
        assert_int_equal(frame_decoder_feed(d, buf, 14, &c, NULL, 0), 1);
        assert_int_equal(calls, 1);
        frame_decoder_trim(d); /* small buffers are kept: harmless */
        assert_int_equal(frame_decoder_pending(d), 0);
        /* refused: nothing allocated, the stream is broken */
        assert_int_equal(frame_encode_header(100000, FRAME_MAX_DEFAULT, buf), 0);
        assert_int_equal(frame_decoder_feed(d, buf, 4, &c, NULL, 0), -ENOBUFS);
        assert_int_equal(calls, 2);
        assert_int_equal(frame_decoder_feed(d, buf, 1, &c, NULL, 0), -EPROTO);

        /* without the hook a large frame is taken; trim after it is handed out gives the
         * buffer back and the next frame decodes normally */
        _cleanup_(frame_decoder_freep) struct frame_decoder *e = NULL;
        assert_int_equal(frame_decoder_new(FRAME_MAX_DEFAULT, &e), 0);
        memset(buf + 4, 'b', 100000);
        assert_int_equal(frame_decoder_feed(e, buf, sizeof buf, &c, NULL, 0), 1);
        const uint8_t *p;
        size_t n;
        frame_decoder_payload(e, &p, &n);
        assert_int_equal(n, 100000);
        assert_int_equal(p[99999], 'b');
        frame_decoder_trim(e);
        assert_int_equal(frame_decoder_pending(e), 0);
        assert_int_equal(frame_encode_header(3, FRAME_MAX_DEFAULT, buf), 0);
        memcpy(buf + 4, "xyz", 3);
        assert_int_equal(frame_decoder_feed(e, buf, 5, &c, NULL, 0), 0);
        assert_int_equal(frame_decoder_pending(e), 5);
        assert_int_equal(frame_decoder_feed(e, buf + 5, 2, &c, NULL, 0), 1);
        frame_decoder_payload(e, &p, &n);
        assert_int_equal(n, 3);
        assert_memory_equal(p, "xyz", 3);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_chunkings),        cmocka_unit_test(test_empty_payload),
                cmocka_unit_test(test_oversized_refused), cmocka_unit_test(test_limit_boundary),
                cmocka_unit_test(test_bad_limits),       cmocka_unit_test(test_header_roundtrip),
                cmocka_unit_test(test_admit_hook_and_trim),
        };
        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
