/* SPDX-License-Identifier: MIT */
#include "common/frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

struct frame_decoder {
        uint32_t max_payload;
        uint8_t header[FRAME_HEADER_SIZE];
        uint32_t header_have; /* 0..4 */
        uint8_t *body;        /* allocated once the header is complete and checked */
        uint32_t body_len;
        uint32_t body_have;
        uint32_t body_cap;    /* capacity of body, reused between frames */
        bool complete;        /* body holds a whole frame, handed out until the next feed */
        bool broken;
        int (*admit)(uint32_t len, void *userdata);
        void *admit_userdata;
};

void frame_decoder_set_admit(struct frame_decoder *d, int (*admit)(uint32_t len, void *userdata),
                             void *userdata) {
        d->admit = admit;
        d->admit_userdata = userdata;
}

void frame_decoder_trim(struct frame_decoder *d) {
        if (d->broken)
                return;
        if (d->complete) { /* the caller is done with the payload it was handed */
                d->complete = false;
                d->header_have = 0;
        }
        if (frame_decoder_pending(d) || d->body_cap <= 65536)
                return;
        free(d->body);
        d->body = NULL;
        d->body_cap = 0;
}

int frame_decoder_new(uint32_t max_payload, struct frame_decoder **ret) {
        struct frame_decoder *d;

        if (max_payload == 0 || max_payload > FRAME_MAX_LIMIT)
                return log_error_errno(EINVAL, "frame limit %u bytes: must be 1..%u", max_payload,
                                       FRAME_MAX_LIMIT);
        d = calloc(1, sizeof *d);
        if (!d)
                return log_error_errno(ENOMEM, "frame decoder: out of memory");
        d->max_payload = max_payload;
        *ret = d;
        return 0;
}

void frame_decoder_free(struct frame_decoder *d) {
        if (!d)
                return;
        free(d->body);
        free(d);
}

uint32_t frame_header_length(const uint8_t h[FRAME_HEADER_SIZE]) {
        return (uint32_t) h[0] << 24 | (uint32_t) h[1] << 16 | (uint32_t) h[2] << 8 | h[3];
}

int frame_encode_header(size_t len, uint32_t max_payload, uint8_t h[FRAME_HEADER_SIZE]) {
        if (len > max_payload)
                return log_error_errno(EMSGSIZE,
                                       "frame payload of %zu bytes exceeds the limit of %u bytes",
                                       len, max_payload);
        h[0] = (uint8_t) (len >> 24);
        h[1] = (uint8_t) (len >> 16);
        h[2] = (uint8_t) (len >> 8);
        h[3] = (uint8_t) len;
        return 0;
}

/* The header is complete: check the cap, then make room for the body. */
static int start_body(struct frame_decoder *d, char *err, size_t err_size) {
        uint32_t n = frame_header_length(d->header);

        if (n > d->max_payload) {
                d->broken = true;
                return error_set(err, err_size, EMSGSIZE,
                                 "frame payload of %u bytes exceeds the limit of %u bytes", n,
                                 d->max_payload);
        }
        if (d->admit) {
                int r = d->admit(n, d->admit_userdata);
                if (r < 0) {
                        d->broken = true;
                        return r;
                }
        }
        if (n > d->body_cap || (d->body_cap > 65536 && n < d->body_cap / 4)) {
                /* grow as needed; give back a big buffer once frames are small again */
                uint8_t *b = malloc(n ? n : 1);
                if (!b) {
                        d->broken = true;
                        return error_set(err, err_size, ENOMEM,
                                         "frame payload of %u bytes: out of memory", n);
                }
                free(d->body);
                d->body = b;
                d->body_cap = n ? n : 1;
        }
        d->body_len = n;
        d->body_have = 0;
        return 0;
}

int frame_decoder_feed(struct frame_decoder *d, const void *data, size_t len, size_t *consumed,
                       char *err, size_t err_size) {
        const uint8_t *p = data;
        size_t used = 0;
        int r;

        *consumed = 0;
        if (d->broken)
                return error_set(err, err_size, EPROTO, "frame stream lost sync after an earlier error");
        if (d->complete) {
                d->complete = false;
                d->header_have = 0;
        }

        while (d->header_have < FRAME_HEADER_SIZE) {
                if (used == len) {
                        *consumed = used;
                        return 0;
                }
                d->header[d->header_have++] = p[used++];
                if (d->header_have == FRAME_HEADER_SIZE) {
                        r = start_body(d, err, err_size);
                        if (r < 0) {
                                *consumed = used;
                                return r;
                        }
                }
        }

        size_t want = d->body_len - d->body_have;
        size_t take = MIN(want, len - used);
        if (take > 0)
                memcpy(d->body + d->body_have, p + used, take);
        d->body_have += (uint32_t) take;
        used += take;
        *consumed = used;
        if (d->body_have < d->body_len)
                return 0;
        d->complete = true;
        return 1;
}

void frame_decoder_payload(const struct frame_decoder *d, const uint8_t **payload, size_t *len) {
        *payload = d->complete ? d->body : NULL;
        *len = d->complete ? d->body_len : 0;
}

size_t frame_decoder_pending(const struct frame_decoder *d) {
        if (d->complete)
                return 0;
        return d->header_have + (d->header_have == FRAME_HEADER_SIZE ? d->body_have : 0);
}
