/* SPDX-License-Identifier: MIT */
/* Length-prefixed framing of the xing4d protocol (proto/README.md "Framing"): each message is a
 * 4-byte big-endian payload length followed by the payload (one serialized xing4.Frame).
 *
 * The decoder is fed arbitrary byte chunks (whatever read() returned) and yields whole payloads.
 * The announced length is checked against the cap BEFORE anything is allocated, so a peer cannot
 * make us reserve memory by sending a large header. No protobuf here: this file is shared by the
 * daemon, libx4client and the bridge, and is unit-tested and fuzzed on its own. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

#define X4_PROTO_MAJOR 1u
#define X4_PROTO_MINOR 6u

#define FRAME_HEADER_SIZE 4u
/* Default cap: a 262,144-token prompt as packed varints is < 1 MiB; chat text a few MiB. */
#define FRAME_MAX_DEFAULT (16u << 20)
/* No cap may exceed this (the header is 32 bits; keep 2 GiB away from int overflows). */
#define FRAME_MAX_LIMIT (1u << 30)

struct frame_decoder;

/* max_payload: largest accepted payload in bytes, 1..FRAME_MAX_LIMIT. */
int frame_decoder_new(uint32_t max_payload, struct frame_decoder **ret);
void frame_decoder_free(struct frame_decoder *d);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct frame_decoder *, frame_decoder_free);

/* Optional: admit(len, userdata) is called when a header announces a payload of len bytes, before
 * anything is allocated for it; a negative errno return refuses the frame: feed returns it (the
 * callback logs why) and the decoder is broken, like for -EMSGSIZE. The daemon uses it to bound
 * the memory all its connections' unfinished frames hold together. */
void frame_decoder_set_admit(struct frame_decoder *d, int (*admit)(uint32_t len, void *userdata),
                             void *userdata);

/* Between frames: give back a buffer kept from a large frame (idle connections then hold none). */
void frame_decoder_trim(struct frame_decoder *d);

/* Consume bytes from data[0..len). Stops after completing one frame, so *consumed may be < len;
 * call again with the rest. Returns 1 when a frame is complete (see frame_decoder_payload), 0 when
 * more bytes are needed (all of len consumed), -EMSGSIZE when the announced length exceeds the cap
 * ("frame payload of N bytes exceeds the limit of M bytes" in err: error_set(), common/log.h),
 * -ENOMEM. After an error the decoder is unusable (the stream has lost sync); the caller closes
 * the connection. A refusal by admit leaves err as it was: the callback knows why. */
int frame_decoder_feed(struct frame_decoder *d, const void *data, size_t len, size_t *consumed,
                       char *err, size_t err_size);

/* The last completed payload; valid until the next feed. */
void frame_decoder_payload(const struct frame_decoder *d, const uint8_t **payload, size_t *len);

/* Bytes of a partial frame held (header or body); 0 at a frame boundary. */
size_t frame_decoder_pending(const struct frame_decoder *d);

/* Write the header for a payload of len bytes. -EMSGSIZE (logged) if len > max_payload. */
int frame_encode_header(size_t len, uint32_t max_payload, uint8_t header[FRAME_HEADER_SIZE]);

/* Parse a header: the announced length. */
uint32_t frame_header_length(const uint8_t header[FRAME_HEADER_SIZE]);
