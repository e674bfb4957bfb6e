/* SPDX-License-Identifier: MIT */
/* x4-template FILE.jinja CONTEXT.json: prints the rendering of a chat template with the JSON
 * object as its variables, byte-exact, to stdout. Exits 1 with a message naming the line, column
 * and construct on a template error or an unsupported construct; 2 on bad usage or unreadable files.
 * FILE may be "-xing4" for the built-in Xing4 template. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "chat/chat.h"
#include "chat/chat_xing4.h"
#include "common/json.h"
#include "common/log.h"

static int read_file(const char *path, char **ret, size_t *ret_len) {
        _cleanup_fclose_ FILE *f = fopen(path, "rb");
        if (!f)
                return log_error_errno(errno, "%s: cannot open: %m", path);
        size_t cap = 65536, len = 0;
        _cleanup_free_ char *buf = malloc(cap);
        if (!buf)
                return log_error_errno(ENOMEM, "%s: out of memory", path);
        for (;;) {
                if (len == cap) {
                        char *nb = realloc(buf, cap *= 2);
                        if (!nb)
                                return log_error_errno(ENOMEM, "%s: out of memory", path);
                        buf = nb;
                }
                size_t n = fread(buf + len, 1, cap - len, f);
                len += n;
                if (n == 0) {
                        if (ferror(f))
                                return log_error_errno(EIO, "%s: read error", path);
                        break;
                }
        }
        *ret = TAKE_PTR(buf);
        *ret_len = len;
        return 0;
}

int main(int argc, char **argv) {
        log_set_ident("x4-template");
        if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
                printf("usage: x4-template FILE.jinja|-xing4 CONTEXT.json\n"
                       "  renders the chat template (or the built-in Xing4 one) with the JSON context\n");
                return 0;
        }
        if (argc != 3) {
                fprintf(stderr, "usage: x4-template FILE.jinja|-xing4 CONTEXT.json\n");
                return 2;
        }
        _cleanup_free_ char *text = NULL;
        size_t len = 0;
        if (streq(argv[1], "-xing4")) {
                text = strdup(chat_xing4_template);
                if (!text)
                        return 2;
                len = strlen(text);
        } else if (read_file(argv[1], &text, &len) < 0)
                return 2;
        _cleanup_(json_freep) struct json_value *ctx = NULL;
        if (json_parse_file(argv[2], &ctx, NULL, 0) < 0)
                return 2;
        if (json_type(ctx) != JSON_OBJECT) {
                log_error("%s: the context must be a JSON object", argv[2]);
                return 2;
        }
        _cleanup_(chat_template_freep) struct chat_template *t = NULL;
        if (chat_template_parse_len(text, len, &t, NULL, 0) < 0)
                return 1;
        _cleanup_free_ char *out = NULL;
        size_t out_len = 0;
        if (chat_template_render_len(t, ctx, &out, &out_len, NULL, 0) < 0)
                return 1;
        if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout) != 0) {
                log_error("stdout: write error");
                return 2;
        }
        return 0;
}
