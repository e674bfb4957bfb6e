/* SPDX-License-Identifier: MIT */
/* Prompt preparation on the prep thread: text, tokens or chat to token ids, snapshot reads, the
 * sampler, output parser and grammar of a request; and the prep thread itself. */
#include "engine/internal.h"
#include "common/escape.h"

/* The last `<think>` among the prompt's final tokens, followed only by whitespace. */
static bool prompt_ends_in_think(const struct sched *s, const int32_t *ids, size_t n) {
        if (s->think_id < 0 || !s->p.tokenizer)
                return false;
        for (size_t k = n; k > 0 && k + 4 > n; k--) {
                if (ids[k - 1] != s->think_id)
                        continue;
                _cleanup_free_ char *tail = NULL;
                size_t len = 0;
                if (tokenizer_decode(s->p.tokenizer, ids + k, n - k, 0, &tail, &len) < 0)
                        return false;
                for (size_t i = 0; i < len; i++)
                        if (tail[i] != ' ' && tail[i] != '\n' && tail[i] != '\r' && tail[i] != '\t')
                                return false;
                return true;
        }
        return false;
}

_printf_(3, 4) static bool prep_fail(struct job *j, int code, const char *fmt, ...) {
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        j->prep_code = code;
        free(j->prep_msg);
        j->prep_msg = strdup(buf);
        return false;
}

_Static_assert((int) SCHED_CONSTRAINT_JSON_OBJECT == (int) GRAMMAR_JSON_OBJECT &&
                       (int) SCHED_CONSTRAINT_JSON_SCHEMA == (int) GRAMMAR_JSON_SCHEMA &&
                       (int) SCHED_CONSTRAINT_TOOL == (int) GRAMMAR_TOOL &&
                       (int) SCHED_CONSTRAINT_TOOL_CALLS == (int) GRAMMAR_TOOL_CALLS,
               "enum sched_constraint mirrors enum grammar_kind");

/* The grammar and matcher of a constrained request (on the prep thread, as part of prepare(); the
 * vocabulary index is built there on first use and only read by the engine thread afterwards).
 * On failure the error is recorded in the job: false. */
static bool prepare_constraint(struct sched *s, struct job *j) {
        const struct sched_request *r = j->r;
        char err[1024];
        int ret;

        if (!s->gvocab && (ret = grammar_vocab_new(s->p.tokenizer, &s->gvocab)) < 0) {
                prep_fail(j, SCHED_ERR_INTERNAL, "constraint: cannot index the vocabulary: %s",
                          strerror(-ret));
                return false;
        }
        ret = grammar_compile_constraint_flags((enum grammar_kind) r->constraint, r->constraint_schema,
                                               r->tools_json, r->constraint_tool, s->p.tokenizer,
                                               (r->constraint_lenient ? GRAMMAR_LENIENT : 0) |
                                                       (r->constraint_or_calls ? GRAMMAR_OR_TOOL_CALLS : 0),
                                               &j->grammar,
                                               err, sizeof err);
        if (ret == -EINVAL && r->constraint == SCHED_CONSTRAINT_TOOL_CALLS && grammar_tools_strict(r->tools_json) == 0) {
                /* tool_choice auto, no tool marked strict: the calls go unconstrained, as before
                 * lazy calls existed, rather than the request refused */
                log_warning("request %llu: its tool calls are not held to the tools' schemas: %s",
                            (unsigned long long) r->id, err);
                return true;
        }
        if (ret < 0) {
                prep_fail(j, ret == -ENOMEM ? SCHED_ERR_INTERNAL : SCHED_ERR_INVALID_ARGUMENT, "%s", err);
                return false;
        }
        /* the turn ends with EOS or `<_end>` once the output is complete */
        int32_t ends[2] = { s->eos_id, tokenizer_special_id(s->p.tokenizer, TOKENIZER_SPECIAL_END) };
        j->gmask = malloc(DIV_ROUND_UP(s->cfg->n_vocab, 64) * sizeof *j->gmask);
        if (!j->gmask || grammar_matcher_new(j->grammar, s->gvocab, ends, 2, &j->gm) < 0) {
                prep_fail(j, SCHED_ERR_INTERNAL, "constraint: out of memory");
                return false;
        }
        j->gm_on = !j->thinking;
        return true;
}

#define PLAIN_MARK "\x02x4d-plain-5f1c-"

/* The rendered chat prompt with each plain marker (PLAIN_MARK, the index of a message marked[],
 * \x03) replaced by that message's content, and the spans those contents take (with cont, the
 * continued final message's text at the end is left as it is); false when out of memory. A marker
 * the template repeated gives a span each time; *complete is false when one it dropped or changed
 * leaves a marked message out. */
static bool plain_spans(const struct sched_request *r, const bool *marked, bool cont, char **rendered,
                        struct tokenizer_span **ret, size_t *ret_n, bool *complete) {
        const char *in = *rendered, *end = in + strlen(in);
        size_t cap = 8, n = 0, len = 0, alloc = strlen(in) + 1;
        struct tokenizer_span *sp = malloc(cap * sizeof *sp);
        char *out = malloc(alloc);
        _cleanup_free_ bool *seen = calloc(r->n_messages + 1, sizeof *seen);
        size_t cont_len = cont ? strlen(r->messages[r->n_messages - 1].content) : 0;
        const char *cont_at = cont ? end - cont_len : NULL; /* the continued text ends the prompt */

        if (!sp || !out || !seen)
                goto oom;
        while (in < end) {
                const char *mk = cont_at && cont_at < end ? memmem(in, (size_t) (cont_at - in), PLAIN_MARK, strlen(PLAIN_MARK))
                                                          : strstr(in, PLAIN_MARK);
                char *ep = NULL;
                unsigned long k = mk ? strtoul(mk + strlen(PLAIN_MARK), &ep, 10) : 0;
                bool ok = mk && ep && *ep == '\x03' && k < r->n_messages && marked[k];
                const char *upto = mk ? mk : cont_at ? cont_at : end;
                const char *put = ok ? r->messages[k].content : NULL;
                size_t put_len = put ? strlen(put) : 0, keep = (size_t) (upto - in) + (mk && !ok ? 1 : 0);
                if (len + keep + put_len + 1 > alloc) {
                        char *o = realloc(out, alloc = 2 * (len + keep + put_len + 1));
                        if (!o)
                                goto oom;
                        out = o;
                }
                memcpy(out + len, in, keep);
                len += keep;
                in += keep;
                if (!mk)
                        break;
                if (!ok)
                        continue; /* not one of ours: its first byte went out as text */
                if (n == cap) {
                        struct tokenizer_span *q = realloc(sp, (cap *= 2) * sizeof *sp);
                        if (!q)
                                goto oom;
                        sp = q;
                }
                seen[k] = true;
                sp[n++] = (struct tokenizer_span) { len, len + put_len };
                memcpy(out + len, put, put_len);
                len += put_len;
                in = ep + 1;
        }
        if (cont_at && in < end) { /* the continued final message (the assistant's: no span) */
                if (len + (size_t) (end - in) + 1 > alloc) {
                        char *o = realloc(out, alloc = len + (size_t) (end - in) + 1);
                        if (!o)
                                goto oom;
                        out = o;
                }
                memcpy(out + len, in, (size_t) (end - in));
                len += (size_t) (end - in);
        }
        out[len] = 0;
        /* every marked message put back, and no marker left in another form (a template that
         * writes messages through tojson escapes the marker's control bytes) */
        *complete = strstr(out, &PLAIN_MARK[1]) == NULL; /* the marker past its control byte */
        for (size_t i = 0; i < r->n_messages && *complete; i++)
                if (marked[i] && !seen[i])
                        *complete = false;
        free(*rendered);
        *rendered = out;
        *ret = sp;
        *ret_n = n;
        return true;
oom:
        free(sp);
        free(out);
        return false;
}

/* A chat prompt: the messages and tools as one JSON context (chat_context_build, which also turns
 * OpenAI's tool-call arguments into objects), rendered by the model's template or the built-in
 * Xing4 one, then tokenized into *ids, *n. On failure the error is recorded in the job: false. */
static bool prepare_chat_once(struct sched *s, struct job *j, int32_t **ids, size_t *n, bool plain,
                              bool *plain_lost) {
        const struct sched_request *r = j->r;
        char err[1024];
        int ret;
        /* Chat.add_generation_prompt = false with a final assistant message that has text (and no
         * tool calls, which the template writes after it): that message stays open and the answer
         * continues it (an assistant prefill, as Anthropic's API and HF's continue_final_message
         * have it). Its content is rendered as a marker first, so whatever the template puts
         * after a message (`<_end>`, a newline) is found and cut, then the text is put back in
         * the marker's place. */
        static const char marker[] = "\x02x4d-continue-final-message-5f1c\x03";
        /* A user, system or tool message whose content holds the text of a registered special
         * (`<_bot>`, `</think>`, `<tool_call>` typed by a user or returned by a tool) is rendered
         * as a marker too, then put back as a plain span: its specials' text is tokenized as
         * text, so such a message cannot write a role marker or end a turn (the template's own
         * specials are unchanged). The assistant's own turns keep theirs: a client may send back
         * `<think>…</think>` inline for the template to take apart. */
        size_t n_plain = 0;
        _cleanup_free_ bool *marked = calloc(r->n_messages + 1, sizeof *marked);
        if (!marked) {
                prep_fail(j, SCHED_ERR_INTERNAL, "out of memory building the chat prompt");
                return false;
        }
        const struct sched_message *last = r->n_messages ? &r->messages[r->n_messages - 1] : NULL;
        /* a chat snapshot is its conversation as the start of a longer one: no generation prompt,
         * and a final assistant message closed as the template closes it */
        bool gen = !r->no_generation_prompt && !r->snapshot_create;
        bool cont = !gen && !r->snapshot_create && last && streq(last->role, "assistant") && last->content &&
                    last->content[0] && !last->tool_calls_json; /* its calls come after the text */

        _cleanup_(json_freep) struct json_value *ctx = json_new_object();
        struct json_value *msgs = json_new_array();
        _cleanup_free_ char *rendered = NULL;
        bool ok = ctx && msgs && json_object_set(ctx, "messages", msgs) == 0;
        if (!ok)
                json_free(msgs);
        for (size_t i = 0; ok && i < r->n_messages; i++) {
                const struct sched_message *m = &r->messages[i];
                struct json_value *o = json_new_object();
                ok = o && json_array_append(msgs, o) == 0;
                if (!ok) {
                        json_free(o);
                        break;
                }
                const char *content = cont && m == last ? marker : m->content ? m->content : "";
                char mk[64];
                if (plain && content == m->content && !streq(m->role, "assistant") &&
                    tokenizer_text_has_special(s->p.tokenizer, m->content, strlen(m->content))) {
                        snprintf(mk, sizeof mk, PLAIN_MARK "%zu\x03", i);
                        content = mk;
                        marked[i] = true;
                        n_plain++;
                }
                ok = json_object_set(o, "role", json_new_string(m->role, strlen(m->role))) == 0 &&
                     json_object_set(o, "content", json_new_string(content, strlen(content))) == 0;
                if (ok && m->name)
                        ok = json_object_set(o, "name", json_new_string(m->name, strlen(m->name))) == 0;
                if (ok && m->reasoning)
                        ok = json_object_set(o, "reasoning_content",
                                             json_new_string(m->reasoning, strlen(m->reasoning))) == 0;
                if (ok && m->tool_calls_json) {
                        struct json_value *tc;
                        char what[64];
                        snprintf(what, sizeof what, "prompt.chat.messages[%zu].tool_calls_json", i);
                        if (json_parse(m->tool_calls_json, strlen(m->tool_calls_json), what, &tc, err,
                                       sizeof err) < 0) {
                                prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "%s", err);
                                return false;
                        }
                        ok = json_object_set(o, "tool_calls", tc) == 0;
                }
        }
        if (ok && r->tools_json) {
                struct json_value *tools;
                if (json_parse(r->tools_json, strlen(r->tools_json), "prompt.chat.tools_json",
                               &tools, err, sizeof err) < 0) {
                        prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "%s", err);
                        return false;
                }
                ok = json_object_set(ctx, "tools", tools) == 0;
        }
        if (ok)
                ok = json_object_set(ctx, "add_generation_prompt", json_new_bool(gen)) == 0;
        if (ok && r->enable_thinking >= 0)
                ok = json_object_set(ctx, "enable_thinking",
                                     json_new_bool(r->enable_thinking)) == 0;
        if (!ok) {
                prep_fail(j, SCHED_ERR_INTERNAL, "out of memory building the chat context");
                return false;
        }
        /* one HF-style context for both renderers: chat_context_build also turns
         * OpenAI's tool-call arguments (JSON text) into objects, so the Xing4 format
         * renders them as <param_key>/<param_value> pairs, not as the JSON fallback */
        _cleanup_(json_freep) struct json_value *full = NULL;
        ret = chat_context_build(json_object_get(ctx, "messages"),
                                 json_object_get(ctx, "tools"), gen, r->enable_thinking,
                                 s->bos_text, s->eos_text, &full, err, sizeof err);
        if (ret >= 0) {
                if (s->tmpl) /* the model's own template (docs/model.md §7 best practice) */
                        ret = chat_template_render(s->tmpl, full, &rendered, err, sizeof err);
                else
                        ret = chat_xing4_render(full, &rendered, err, sizeof err);
        }
        if (ret >= 0 && cont) {
                /* the last marker is the final message's (an earlier one would be the user's own
                 * text); the template's end of the message after it is dropped */
                char *at = NULL;
                for (char *p = rendered; (p = strstr(p, marker)); p++)
                        at = p;
                if (!at) {
                        prep_fail(j, SCHED_ERR_INVALID_ARGUMENT,
                                  "prompt.chat: the chat template does not render the final assistant "
                                  "message's content as given, so the answer cannot continue it");
                        return false;
                }
                size_t keep = (size_t) (at - rendered), add = strlen(last->content);
                char *cut = malloc(keep + add + 1);
                if (!cut) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "out of memory building the chat prompt");
                        return false;
                }
                memcpy(cut, rendered, keep);
                memcpy(cut + keep, last->content, add + 1);
                free(rendered);
                rendered = cut;
        }
        _cleanup_free_ struct tokenizer_span *spans = NULL;
        size_t n_spans = 0;
        if (ret >= 0 && n_plain) {
                bool complete = false;
                if (!plain_spans(r, marked, cont, &rendered, &spans, &n_spans, &complete)) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "out of memory building the chat prompt");
                        return false;
                }
                if (!complete) { /* the template changed or dropped a marker: render as given */
                        *plain_lost = true;
                        return false;
                }
        }
        if (ret >= 0)
                ret = tokenizer_encode_spans(s->p.tokenizer, rendered, strlen(rendered), spans, n_spans, ids, n,
                                             err, sizeof err);
        if (ret < 0) {
                prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "prompt.chat: %s", err);
                return false;
        }
        return true;
}

/* ---- chat snapshots: conversation prefixes ---------------------------------------------------- */

/* The fields of a message a chat snapshot keeps (its JSON's keys: the protocol's names). */
static const struct {
        const char *key;
        size_t off;
} msg_fields[] = {
        { "role", offsetof(struct sched_message, role) },
        { "content", offsetof(struct sched_message, content) },
        { "reasoning", offsetof(struct sched_message, reasoning) },
        { "tool_calls_json", offsetof(struct sched_message, tool_calls_json) },
        { "name", offsetof(struct sched_message, name) },
};

static char **msg_field(struct sched_message *m, size_t k) {
        return (char **) ((char *) m + msg_fields[k].off);
}

/* What a snapshot created from chat keeps besides its tokens: {"messages": [...], "tools_json":
 * "..."}, so a chat request on it can be rendered as one conversation (NULL when out of memory). */
static char *chat_snapshot_meta(const struct sched_request *r) {
        _cleanup_(json_freep) struct json_value *o = json_new_object();
        struct json_value *msgs = json_new_array();
        if (!o) {
                json_free(msgs);
                return NULL;
        }
        if (json_object_set(o, "messages", msgs) < 0) /* msgs is o's (or NULL) */
                return NULL;
        for (size_t i = 0; i < r->n_messages; i++) {
                struct json_value *m = json_new_object();
                if (json_array_append(msgs, m) < 0)
                        return NULL;
                for (size_t k = 0; k < ELEMENTSOF(msg_fields); k++) {
                        const char *v = *msg_field(&r->messages[i], k);
                        if (v && json_object_set(m, msg_fields[k].key, json_new_string(v, strlen(v))) < 0)
                                return NULL;
                }
        }
        if (r->tools_json && r->tools_json[0] &&
            json_object_set(o, "tools_json", json_new_string(r->tools_json, strlen(r->tools_json))) < 0)
                return NULL;
        return json_dump(o, JSON_COMPACT, 0);
}

static bool msg_equal(struct sched_message *a, struct sched_message *b) {
        for (size_t k = 0; k < ELEMENTSOF(msg_fields); k++) {
                const char *x = *msg_field(a, k), *y = *msg_field(b, k);
                if (!streq(x ? x : "", y ? y : ""))
                        return false;
        }
        return true;
}

/* Two tools_json texts that parse to the same JSON (spacing aside). */
static bool same_tools(const char *a, const char *b) {
        _cleanup_(json_freep) struct json_value *x = NULL, *y = NULL;
        if (json_parse(a, strlen(a), "tools_json", &x, NULL, 0) < 0 ||
            json_parse(b, strlen(b), "tools_json", &y, NULL, 0) < 0)
                return streq(a, b);
        _cleanup_free_ char *dx = json_dump(x, JSON_COMPACT, 0), *dy = json_dump(y, JSON_COMPACT, 0);
        return dx && dy && streq(dx, dy);
}

/* A chat request on a chat snapshot becomes the whole conversation: the snapshot's messages, then
 * the request's (those that repeat the snapshot's whole conversation, or its system message, left
 * out), with the snapshot's tools unless the request sends the same ones. Rendered once, so there is
 * one BOS and one system turn. On failure the error is recorded in the job: false. */
static bool chat_on_snapshot(struct job *j) {
        struct sched_request *r = j->r;
        const char *name = r->snapshot;
        _cleanup_(json_freep) struct json_value *meta = NULL;
        char err[512], a[96], b[96];

        if (json_parse(j->snap_meta, strlen(j->snap_meta), "snapshot", &meta, err, sizeof err) < 0 ||
            json_type(json_object_get(meta, "messages")) != JSON_ARRAY)
                return prep_fail(j, SCHED_ERR_INTERNAL, "snapshot '%s': its conversation does not read back (%s)",
                                 name, json_type(meta) == JSON_OBJECT ? "no messages" : err);
        const struct json_value *sm = json_object_get(meta, "messages");
        const char *tools = json_string(json_object_get(meta, "tools_json"));
        size_t ns = json_count(sm), skip = 0;
        struct sched_message *all = calloc(ns + r->n_messages + 1, sizeof *all);
        if (!all)
                return prep_fail(j, SCHED_ERR_INTERNAL, "out of memory");
        for (size_t i = 0; i < ns; i++) {
                for (size_t k = 0; k < ELEMENTSOF(msg_fields); k++) {
                        const char *v = json_string(json_object_get(json_array_at(sm, i), msg_fields[k].key));
                        if (v && !(*msg_field(&all[i], k) = strdup(v))) {
                                eng_messages_free(all, ns);
                                return prep_fail(j, SCHED_ERR_INTERNAL, "out of memory");
                        }
                }
                if (!all[i].role) { /* a damaged file: what a request is refused for */
                        eng_messages_free(all, ns);
                        return prep_fail(j, SCHED_ERR_INTERNAL,
                                         "snapshot '%s': its conversation does not read back (message %zu "
                                         "has no role)", name, i);
                }
        }
        /* a client that sends the whole history each time: the snapshot's part is not repeated */
        while (skip < ns && skip < r->n_messages && msg_equal(&all[skip], &r->messages[skip]))
                skip++;
        if (skip < ns)
                skip = 0;
        if (!skip && r->n_messages && streq(r->messages[0].role, "system")) {
                const char *mine = r->messages[0].content ? r->messages[0].content : "";
                const char *theirs = ns && all[0].role && streq(all[0].role, "system") ? all[0].content : NULL;
                cescape(mine, strlen(mine), a, sizeof a);
                if (!theirs) {
                        eng_messages_free(all, ns);
                        return prep_fail(j, SCHED_ERR_INVALID_ARGUMENT,
                                         "prompt.chat.messages[0]: a system message (\"%s\"), but snapshot '%s' "
                                         "starts its conversation without one, and a system message cannot "
                                         "follow it; leave it out, or create the snapshot with it "
                                         "(x4ctl snapshot create --system)", a, name);
                }
                if (!streq(mine, theirs)) {
                        cescape(theirs, strlen(theirs), b, sizeof b);
                        eng_messages_free(all, ns);
                        return prep_fail(j, SCHED_ERR_INVALID_ARGUMENT,
                                         "prompt.chat.messages[0]: the system message \"%s\" differs from "
                                         "snapshot '%s''s system message \"%s\"; leave it out (the snapshot's "
                                         "is used) or send the same text", a, name, b);
                }
                skip = 1;
        }
        if (r->tools_json && r->tools_json[0] && !(tools && same_tools(r->tools_json, tools))) {
                eng_messages_free(all, ns);
                return prep_fail(j, SCHED_ERR_INVALID_ARGUMENT,
                                 tools ? "prompt.chat.tools_json: differs from the tools snapshot '%s' was made "
                                         "with; leave it out (the snapshot's are used) or send the same tools"
                                       : "prompt.chat.tools_json: snapshot '%s' was made without tools, and a "
                                         "template renders them before the conversation; create the snapshot "
                                         "with these tools",
                                 name);
        }
        if (tools && !(r->tools_json && r->tools_json[0])) {
                char *t = strdup(tools);
                if (!t) {
                        eng_messages_free(all, ns);
                        return prep_fail(j, SCHED_ERR_INTERNAL, "out of memory");
                }
                free(r->tools_json);
                r->tools_json = t; /* also the tools whose calls the output is parsed for */
        }
        /* the request's own messages move over (the prep thread owns the request meanwhile) */
        memcpy(all + ns, r->messages + skip, (r->n_messages - skip) * sizeof *all);
        memset(r->messages + skip, 0, (r->n_messages - skip) * sizeof *all);
        eng_messages_free(r->messages, r->n_messages);
        r->messages = all;
        r->n_messages = ns + r->n_messages - skip;
        return true;
}

static bool prepare_chat(struct sched *s, struct job *j, int32_t **ids, size_t *n) {
        bool lost = false;
        if (prepare_chat_once(s, j, ids, n, true, &lost))
                return true;
        if (!lost)
                return false; /* failed, and said why (prep_fail) */
        log_debug("request %llu: the chat template does not render message contents as given; a special's "
                  "text in them stays special", (unsigned long long) j->r->id);
        return prepare_chat_once(s, j, ids, n, false, &lost);
}

/* Text, tokens or chat → token ids, a snapshot's file read, the sampler and output parser. Runs
 * on the prep thread (eng_prep_main): it touches only the job's own fields and what is read-only
 * after start (params, tokenizer, template). On failure it records the error in the job
 * (prep_code, prep_msg) for the engine thread to report; returns false. */
static bool prepare(struct sched *s, struct job *j) {
        struct sched_request *r = j->r;
        int32_t *ids = NULL;
        _cleanup_free_ int32_t *prefix = NULL; /* the snapshot's tokens */
        size_t n = 0;
        char err[1024]; /* what a failing call says, for the client (error_set, common/log.h) */
        int ret;

        if (r->snapshot) {
                /* read first: a chat snapshot's conversation is part of a chat request's */
                int code = eng_snap_load(s, j, &prefix, err, sizeof err);
                if (code)
                        return prep_fail(j, code, "%s", err);
        }
        /* a chat request on a chat snapshot is rendered as one conversation that starts with the
         * snapshot's; any other request's prompt is prepared on its own and follows its tokens */
        bool conv = r->snapshot && j->snap_meta && r->prompt == SCHED_PROMPT_CHAT;
        if (conv && !chat_on_snapshot(j))
                return false;
        if (r->snapshot_create && r->prompt == SCHED_PROMPT_CHAT && !(j->snap_meta = chat_snapshot_meta(r)))
                return prep_fail(j, SCHED_ERR_INTERNAL, "out of memory for the snapshot's conversation");
        if (r->prompt == SCHED_PROMPT_TOKENS) {
                ids = malloc(r->n_tokens * sizeof *ids);
                if (!ids) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "out of memory");
                        return false;
                }
                memcpy(ids, r->tokens, r->n_tokens * sizeof *ids);
                n = r->n_tokens;
        } else if (r->prompt == SCHED_PROMPT_TEXT) {
                ret = tokenizer_encode(s->p.tokenizer, r->text, strlen(r->text), 0, &ids, &n, err,
                                       sizeof err);
                if (ret < 0) {
                        prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "prompt.text: %s", err);
                        return false;
                }
        } else if (!prepare_chat(s, j, &ids, &n))
                return false;
        if (n == 0) {
                free(ids);
                prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "prompt: no tokens after tokenizing");
                return false;
        }
        /* a prompt ending in `<think>` or `<think>\n` (the generation prompt with thinking on,
         * whatever rendered it) makes the output start in the reasoning channel */
        j->thinking = prompt_ends_in_think(s, ids, n);
        if (conv) {
                /* the snapshot's tokens must start the rendering: their cache rows are reused */
                size_t at = 0;
                while (at < j->snap_n && at < n && ids[at] == prefix[at])
                        at++;
                if (at < j->snap_n) {
                        free(ids);
                        return prep_fail(j, SCHED_ERR_INVALID_ARGUMENT,
                                         "snapshot '%s': this conversation's rendering does not start with the "
                                         "snapshot's %u tokens (they differ at token %zu of %zu): the chat "
                                         "template renders the snapshot's messages otherwise once more follow "
                                         "(or with this request's options), so its cache cannot be used here; "
                                         "send the conversation without the snapshot",
                                         r->snapshot, j->snap_n, at, n);
                }
                if (n == j->snap_n) {
                        free(ids);
                        return prep_fail(j, SCHED_ERR_INVALID_ARGUMENT,
                                         "prompt: adds no tokens to snapshot '%s' (%u tokens); at least "
                                         "one expected (a message, or the generation prompt)",
                                         r->snapshot, j->snap_n);
                }
                log_debug("request %llu: a chat on snapshot '%s': %u of its %zu prompt tokens from the "
                          "snapshot", (unsigned long long) r->id, r->snapshot, j->snap_n, n);
        } else if (r->snapshot) {
                /* the snapshot's tokens come first; they are cached once admitted */
                int32_t *all = malloc(((size_t) j->snap_n + n) * sizeof *all);
                if (!all) {
                        free(ids);
                        prep_fail(j, SCHED_ERR_INTERNAL, "out of memory");
                        return false;
                }
                memcpy(all, prefix, (size_t) j->snap_n * sizeof *all);
                memcpy(all + j->snap_n, ids, n * sizeof *all);
                free(ids);
                ids = all;
                n += j->snap_n;
        }
        j->create = r->snapshot_create != NULL;
        if (r->count_only) { /* the size is the answer: no context check, nothing admitted or cached */
                free(ids);
                j->n_prompt = (uint32_t) MIN(n, (size_t) UINT32_MAX);
                j->snap_n = 0;
                j->count_only = true;
                return true;
        }
        if (n >= s->ctx_limit) {
                free(ids);
                prep_fail(j, SCHED_ERR_TOO_LARGE,
                         "prompt of %zu tokens leaves no room for output in the context limit of "
                         "%u tokens", n, s->ctx_limit);
                return false;
        }
        j->n_prompt = (uint32_t) n;
        j->max_tokens = j->create ? 0 : r->has_max_tokens ? r->max_tokens : s->p.max_tokens_default;
        if (s->p.max_tokens_limit && j->max_tokens > s->p.max_tokens_limit)
                j->max_tokens = s->p.max_tokens_limit; /* the admin's ceiling: ends with LENGTH */
        if (j->max_tokens > s->ctx_limit - j->n_prompt)
                j->max_tokens = s->ctx_limit - j->n_prompt; /* ends with LENGTH at the limit */
        j->seq = realloc(ids, ((size_t) j->n_prompt + j->max_tokens) * sizeof *ids);
        if (!j->seq) {
                free(ids);
                prep_fail(j, SCHED_ERR_INTERNAL, "out of memory for %u tokens",
                         j->n_prompt + j->max_tokens);
                return false;
        }
        j->n_seq = j->n_prompt;
        if (!j->create) {
                const struct sched_sampling *q = &r->sampling;
                struct sampler_params sp;
                sampler_params_default(&sp);
                if (q->has_temperature)
                        sp.temperature = q->temperature;
                if (q->has_top_k)
                        sp.top_k = (int32_t) MIN(q->top_k, s->cfg->n_vocab);
                if (q->has_top_p)
                        sp.top_p = q->top_p;
                if (q->has_min_p)
                        sp.min_p = q->min_p;
                if (q->has_repetition_penalty)
                        sp.repetition_penalty = q->repetition_penalty;
                if (q->has_presence_penalty)
                        sp.presence_penalty = q->presence_penalty;
                if (q->has_frequency_penalty)
                        sp.frequency_penalty = q->frequency_penalty;
                /* no seed: a different stream per request */
                sp.seed = q->has_seed ? q->seed
                                      : (uint64_t) (now_ms() * 1000.0) ^ (r->id << 32) ^ 0x9e3779b97f4a7c15ull;
                if (sampler_new(&sp, s->cfg->n_vocab, &j->sampler, err, sizeof err) < 0) {
                        prep_fail(j, SCHED_ERR_INVALID_ARGUMENT, "sampling: %s", err);
                        return false;
                }
                /* prompt tokens count for the repetition penalty */
                if (sampler_add_prompt(j->sampler, j->seq, j->n_prompt, err, sizeof err) < 0) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "%s", err);
                        return false;
                }
        }
        if (s->p.tokenizer && !j->create) {
                /* the chat generation prompt ends inside <think> unless thinking is off */
                struct outparse_config oc = {
                        .thinking = j->thinking,
                        .thinking_budget = r->has_thinking_budget ? r->thinking_budget : -1,
                        .stop_strings = (const char *const *) r->stop,
                        .n_stop_strings = r->n_stop,
                        .stop_ids = r->stop_ids,
                        .n_stop_ids = r->n_stop_ids,
                        .emit = eng_on_outparse,
                        .userdata = j,
                };
                /* a chat request's output is parsed for calls of the tools it offers only (none
                 * offered: `<tool_call>` is text), as an OpenAI or Anthropic client expects */
                _cleanup_(json_freep) struct json_value *tools = NULL;
                _cleanup_free_ const char **names = NULL;
                _cleanup_free_ const struct json_value **params = NULL;
                if (r->prompt == SCHED_PROMPT_CHAT) {
                        size_t n = 0;
                        if (r->tools_json && r->tools_json[0] &&
                            json_parse(r->tools_json, strlen(r->tools_json), "tools_json", &tools, NULL, 0) >= 0 &&
                            json_type(tools) == JSON_ARRAY && json_count(tools) > 0) {
                                names = calloc(json_count(tools), sizeof *names);
                                params = calloc(json_count(tools), sizeof *params);
                                if (!names || !params) {
                                        prep_fail(j, SCHED_ERR_INTERNAL, "out of memory for the tool names");
                                        return false;
                                }
                                for (size_t i = 0; i < json_count(tools); i++) {
                                        const struct json_value *tv = json_array_at(tools, i);
                                        const struct json_value *fn = json_object_get(tv, "function") ?: tv;
                                        const char *tn = json_string(json_object_get(fn, "name"));
                                        if (tn && tn[0]) {
                                                /* a native call's values are typed by these */
                                                params[n] = json_object_get(fn, "parameters");
                                                names[n++] = tn;
                                        }
                                }
                        }
                        oc.tool_names = names;
                        oc.n_tool_names = n;
                        oc.tool_parameters = params;
                        oc.no_tool_calls = n == 0;
                }
                if (tokenizer_stream_new(s->p.tokenizer, TOKENIZER_DECODE_SKIP_SPECIALS, &j->ts) < 0) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "out of memory for the detokenizer");
                        return false;
                }
                /* the output continues the prompt: after a chat template's generation prompt (a
                 * special) its first word has no space before it; after raw text it keeps it */
                tokenizer_stream_after(j->ts, j->seq[j->n_prompt - 1]);
                if (outparse_new(s->p.tokenizer, &oc, &j->op, err, sizeof err) < 0) {
                        prep_fail(j, SCHED_ERR_INTERNAL, "%s", err);
                        return false;
                }
        }
        if (r->constraint != SCHED_CONSTRAINT_NONE && !j->create && !prepare_constraint(s, j))
                return false;
        j->s = s;
        j->prepared = true;
        return true;
}

void eng_prep_enqueue(struct sched *s, struct job *j) {
        j->prep_queued = true;
        pthread_mutex_lock(&s->lock);
        j->prep_next = NULL;
        if (s->prep_tail)
                s->prep_tail->prep_next = j;
        else
                s->prep_head = j;
        s->prep_tail = j;
        pthread_cond_signal(&s->prep_wake);
        pthread_mutex_unlock(&s->lock);
}

void *eng_prep_main(void *userdata) {
        struct sched *s = userdata;

        log_set_ident("xing4d");
        pthread_mutex_lock(&s->lock);
        for (;;) {
                while (!s->quit && !s->prep_head)
                        pthread_cond_wait(&s->prep_wake, &s->lock);
                if (s->quit)
                        break;
                struct job *j = s->prep_head;
                s->prep_head = j->prep_next;
                if (!s->prep_head)
                        s->prep_tail = NULL;
                pthread_mutex_unlock(&s->lock);
                if (j->state == JOB_SAVING) {
                        char err[512];
                        int code = eng_snap_write_chunk(s, j, err, sizeof err);
                        if (code)
                                (void) prep_fail(j, code, "%s", err);
                        free(j->snap_data);
                        j->snap_data = NULL;
                } else
                        (void) prepare(s, j);
                pthread_mutex_lock(&s->lock);
                j->prep_next = s->prepped;
                s->prepped = j;
                pthread_cond_signal(&s->wake);
        }
        pthread_mutex_unlock(&s->lock);
        return NULL;
}

