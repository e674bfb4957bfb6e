/* SPDX-License-Identifier: MIT */
/* x4client-hello: the smallest libx4client program. Connects to xing4d, generates from a prompt
 * and streams the text to stdout.
 *
 *   cc x4client-hello.c $(pkg-config --cflags --libs libx4client) -o x4client-hello
 *   ./x4client-hello "Write a haiku about the sea."        # socket: $X4_SOCKET or the default
 *
 * Exit status: 0 when the request ended with a Done, 1 otherwise (the reason on stderr). */
#include <stdio.h>
#include <stdlib.h>
#include <x4client.h>

static int on_chunk(const struct x4_chunk *chunk, void *userdata) {
        size_t *n = userdata;
        if (chunk->channel == X4_CHANNEL_CONTENT) {
                fwrite(chunk->text, 1, chunk->text_len, stdout);
                fflush(stdout);
        }
        *n += chunk->n_token_ids;
        return 0; /* nonzero would cancel the request */
}

int main(int argc, char **argv) {
        const char *prompt = argc > 1 ? argv[1] : "Hello!";
        x4_client *c = NULL;
        x4_request *req = NULL;
        struct x4_done done;
        size_t n_tokens = 0;
        int r, ret = EXIT_FAILURE;

        r = x4_client_new(&c);
        if (r < 0) {
                fprintf(stderr, "x4_client_new: %s\n", x4_strerror(r));
                return EXIT_FAILURE;
        }
        x4_client_set_name(c, "x4client-hello");
        r = x4_client_connect(c, NULL);
        if (r < 0) {
                fprintf(stderr, "connect: %s\n", x4_client_last_error(c));
                goto out;
        }
        req = x4_request_new();
        if (!req || x4_request_add_message(req, "user", prompt) < 0 ||
            x4_request_set_max_tokens(req, 32) < 0 || x4_request_set_seed(req, 1) < 0) {
                fprintf(stderr, "cannot build the request\n");
                goto out;
        }
        r = x4_client_generate(c, req, on_chunk, &n_tokens, &done);
        if (r < 0) {
                fprintf(stderr, "generate: %s\n", x4_client_last_error(c));
                goto out;
        }
        printf("\n[%s: %u prompt tokens, %u generated, %zu streamed]\n", x4_client_server_version(c),
               done.prompt_tokens, done.completion_tokens, n_tokens);
        ret = EXIT_SUCCESS;
out:
        x4_request_free(req);
        x4_client_free(c);
        return ret;
}
