/* SPDX-License-Identifier: MIT */
/* The loop thread (docs/design.md "Threads and flow"): a libevent loop that accepts connections on the
 * listening socket, decodes length-prefixed frames (size cap before allocation), validates and
 * dispatches them, hands generation to the scheduler and streams its events back. Every bad input
 * is answered with an Error frame naming the problem; only a broken framing (oversized header) or
 * a failed handshake closes the connection. SIGTERM/SIGINT: stop accepting, answer new requests
 * with UNAVAILABLE, let running ones finish for the grace period, then cancel them; the loop ends
 * when nothing is in flight. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"

struct sched;

struct server_model_info {
        const char *architecture, *name, *fingerprint, *backend, *model_path, *config_source;
        uint32_t n_vocab, n_ctx, n_layer, n_embd, n_expert, n_expert_used;
        int32_t bos_id, eos_id;
        bool has_tokenizer;
};

struct server_params {
        int listen_fd;          /* listening AF_UNIX stream socket (not owned) */
        struct sched *sched;
        uint32_t max_frame;     /* bytes per frame payload */
        uint32_t max_connections;
        double grace_s;         /* SIGTERM: how long running requests may finish */
        double hello_timeout_s; /* a connection without Hello by then is closed (0: no limit) */
        double idle_timeout_s;  /* a connection with nothing in flight and nothing received for
                                 * this long is closed (0: never) */
        uint64_t max_pending_bytes; /* unfinished frames larger than 64 KiB, all connections
                                     * together (0: the default, 256 MiB) */
        uint32_t output_high_water; /* bytes queued to a client before its requests pause */
        const char *server_version;
        struct server_model_info model;
};

struct server;

int server_new(const struct server_params *params, struct server **ret);
void server_free(struct server *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct server *, server_free);

/* Run until a termination signal has been handled and nothing is in flight. 0 on a clean stop. */
int server_run(struct server *s);
