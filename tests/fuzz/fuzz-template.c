/* SPDX-License-Identifier: MIT */
/* Fuzz the chat template interpreter: arbitrary bytes as a template are parsed and, when they
 * parse, rendered with a small fixed conversation under tight budgets, so neither a loop nor a
 * recursion nor an output blow-up can hang or exhaust the fuzzer. Failures must be errors with a
 * message, never crashes; a successful render must respect the output limit. */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "chat/chat.h"
#include "common/json.h"
#include "common/log.h"

static const char context_json[] =
        "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true,"
        " \"enable_thinking\": false, \"messages\": ["
        "{\"role\": \"system\", \"content\": \"Be brief.\"},"
        "{\"role\": \"user\", \"content\": \"Hi \\u00e9 {{x}}\"},"
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\":"
        " {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}]},"
        "{\"role\": \"tool\", \"content\": [{\"type\": \"text\", \"text\": \"ok\"}]}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static struct json_value *ctx;
        if (!ctx) {
                log_set_max_level(LOG_CRIT);
                assert(json_parse(context_json, strlen(context_json), "fuzz context", &ctx, NULL, 0) == 0);
        }
        _cleanup_(chat_template_freep) struct chat_template *t = NULL;
        if (chat_template_parse_len((const char *) data, size, &t, NULL, 0) < 0) {
                assert(log_last_error()[0] != 0);
                return 0;
        }
        chat_template_set_limits(t, &(struct chat_limits) {
                .max_steps = 200000,
                .max_output = 1u << 20,
                .max_depth = 40,
                .max_memory = 64u << 20,
        });
        char *out = NULL;
        size_t len = 0;
        log_clear_last_error();
        int r = chat_template_render_len(t, ctx, &out, &len, NULL, 0);
        if (r < 0)
                assert(log_last_error()[0] != 0);
        else {
                assert(len <= (1u << 20));
                assert(strlen(out) <= len);
        }
        free(out);
        return 0;
}
