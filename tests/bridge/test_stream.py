# SPDX-License-Identifier: MIT
"""Responses: SSE framing byte for byte (against the scripted fake daemon, whose output is known),
the chunk sequence OpenAI clients rely on, reasoning and tool-call mapping, and cancellation."""
import json
import threading
import time

from conftest import assert_openai_error, chat


def raw_stream(bridge, body):
    c = bridge.conn()
    c.request("POST", "/v1/chat/completions" if "messages" in body else "/v1/completions",
              body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()  # http.client undoes the chunked transfer encoding
    c.close()
    return r, data


def fingerprint(model="xing4", file_fingerprint="fake-fingerprint"):
    """The system_fingerprint the bridge answers with: "fp_xing4d_" + 10 hex digits of FNV-1a over
    the served name and the daemon's model fingerprint (the fake daemon's is "fake-fingerprint")."""
    h = 0xcbf29ce484222325
    for b in f"{model}\n{file_fingerprint}".encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "fp_xing4d_%010x" % (h & 0xFFFFFFFFFF)


def test_sse_bytes_are_exact(fake_bridge):
    r, data = raw_stream(fake_bridge, chat("hi", stream=True, stream_options={"include_usage": True}))
    assert r.status == 200
    assert r.getheader("Content-Type") == "text/event-stream; charset=utf-8"
    assert r.getheader("Cache-Control") == "no-cache"
    first = json.loads(data.split(b"\n\n")[0][len(b"data: "):])
    cid, created = first["id"], first["created"]
    head = '{"id":"%s","object":"chat.completion.chunk","created":%d,"model":"xing4","choices":' % (cid, created)

    # every chunk names the model's fingerprint; with include_usage each one before the usage chunk
    # has "usage": null, as OpenAI's do
    tail = ',"system_fingerprint":"%s"' % fingerprint()

    def ev(choices):
        return "data: " + head + choices + tail + ',"usage":null}\n\n'
    expected = (
        ev('[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]')
        + ev('[{"index":0,"delta":{"reasoning_content":"Let me think.","reasoning":"Let me think."},'
             '"logprobs":null,"finish_reason":null}]')
        + ev('[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]')
        + ev('[{"index":0,"delta":{"content":", world"},"logprobs":null,"finish_reason":null}]')
        + ev('[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]')
        + "data: " + head + '[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,'
        '"prompt_tokens_details":{"cached_tokens":3},"completion_tokens_details":{"reasoning_tokens":1}}' + tail
        + "}\n\n" + "data: [DONE]\n\n")
    assert data.decode() == expected


def test_completions_stream_bytes_are_exact(fake_bridge):
    r, data = raw_stream(fake_bridge, {"model": "xing4", "prompt": "hi", "stream": True})
    first = json.loads(data.split(b"\n\n")[0][len(b"data: "):])
    head = '{"id":"%s","object":"text_completion","created":%d,"model":"xing4","choices":' % (
        first["id"], first["created"])
    # without include_usage no chunk has a usage field
    expected = "".join("data: " + head + '[{"text":%s,"index":0,"logprobs":null,"finish_reason":%s}],'
                       '"system_fingerprint":"%s"}\n\n' % (json.dumps(t), f, fingerprint()) for t, f in [("Let me think.", "null"), ("Hello", "null"), (", world", "null"),
                                       ("", '"stop"')]) + "data: [DONE]\n\n"
    assert data.decode() == expected


def test_non_streaming_answers_carry_the_system_fingerprint(fake_bridge):
    for path, body in (("/v1/chat/completions", chat("hi")), ("/v1/completions", {"model": "xing4", "prompt": "hi"})):
        st, _, first = fake_bridge.post(path, body)
        st2, _, second = fake_bridge.post(path, body)
        assert st == st2 == 200, first
        assert first["system_fingerprint"] == second["system_fingerprint"] == fingerprint()
        assert "usage" in first and first["usage"] is not None


def test_non_streaming_maps_reasoning_and_usage(fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("hi"))
    assert st == 200
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    msg = body["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "Hello, world", "reasoning_content": "Let me think.",
                   "reasoning": "Let me think."}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                             "prompt_tokens_details": {"cached_tokens": 3},
                             "completion_tokens_details": {"reasoning_tokens": 1}}


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def test_tool_call_non_streaming(fake_bridge, fake):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("weather in Paris?", tools=TOOLS))
    assert st == 200, body
    ch = body["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    assert ch["message"]["content"] is None
    (call,) = ch["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    # the daemon got the tool definitions as given
    sent = json.loads(fake["record"].read_text().splitlines()[-1])
    assert sent["tools"] == TOOLS


def test_tool_call_streaming_fragments_concatenate(fake_bridge):
    r, data = raw_stream(fake_bridge, chat("weather?", tools=TOOLS, stream=True))
    events = [json.loads(x[6:]) for x in data.decode().split("\n\n") if x and x != "data: [DONE]"]
    deltas = [e["choices"][0]["delta"] for e in events]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert all(c["index"] == 0 for c in calls)
    assert len(calls) >= 2  # a naming delta, then argument fragments
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Paris"}'
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # the raw tool-call channel text is not leaked as content
    assert not any(d.get("content") for d in deltas)


def test_tool_result_round_trip_reaches_the_template(fake_bridge, fake):
    msgs = [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24C"}]
    st, _, body = fake_bridge.post("/v1/chat/completions", {"model": "xing4", "messages": msgs, "tools": TOOLS})
    assert st == 200, body
    assert body["choices"][0]["message"]["content"] == "It is sunny in Paris."
    sent = json.loads(fake["record"].read_text().splitlines()[-1])
    # the assistant's call travels in ChatMessage.tool_calls_json as OpenAI's array (the daemon's
    # template renders it), not inlined in the content; the tool message carries the name of the
    # call it answers (looked up by tool_call_id)
    assert sent["messages"][1] == {"role": "assistant", "content": "", "tool_calls": msgs[1]["tool_calls"]}
    assert sent["messages"][2] == {"role": "tool", "content": "sunny, 24C", "name": "get_weather"}


def test_history_reasoning_and_tool_name_are_sent(fake_bridge, fake):
    msgs = [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "Checking.", "reasoning_content": "I should look it up.",
             "tool_calls": [{"id": "c9", "type": "function",
                             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "name": "weather_api", "tool_call_id": "c9", "content": "sunny"},
            {"role": "assistant", "content": "Sunny.", "reasoning": "Easy."},
            {"role": "user", "content": "thanks"}]
    st, _, body = fake_bridge.post("/v1/chat/completions", {"model": "xing4", "messages": msgs})
    assert st == 200, body
    sent = json.loads(fake["record"].read_text().splitlines()[-1])["messages"]
    assert sent[1] == {"role": "assistant", "content": "Checking.", "reasoning": "I should look it up.",
                       "tool_calls": msgs[1]["tool_calls"]}
    # an explicit name wins over the id lookup
    assert sent[2] == {"role": "tool", "content": "sunny", "name": "weather_api"}
    assert sent[3] == {"role": "assistant", "content": "Sunny.", "reasoning": "Easy."}
    assert sent[4] == {"role": "user", "content": "thanks"}


def test_bad_tool_call_history_is_refused_naming_the_field(fake_bridge):
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                                 "function": {"arguments": "{}"}}]}]
    st, _, body = fake_bridge.post("/v1/chat/completions", {"model": "xing4", "messages": msgs})
    assert st == 400, body
    assert body["error"]["param"] == "messages[1].tool_calls"
    assert "entry 0 has no function.name" in body["error"]["message"]
    msgs[1]["tool_calls"] = [{"function": {"name": "f", "arguments": 5}}]
    st, _, body = fake_bridge.post("/v1/chat/completions", {"model": "xing4", "messages": msgs})
    assert st == 400, body
    assert "function.arguments must be a JSON string or an object, got" in body["error"]["message"]


def test_tool_round_trip_is_accepted_by_the_real_daemon(bridge):
    msgs = [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    st, _, body = bridge.post("/v1/chat/completions", {"model": "xing4", "messages": msgs, "tools": TOOLS,
                                                      "max_tokens": 4})
    assert st == 200, body
    assert body["usage"]["prompt_tokens"] > 40  # tool definitions + call + result were rendered
    # the call reaches the daemon's template as a call: arguments given as JSON text or as an
    # object render alike (the <param_key> form), and the call adds to the prompt
    n_text = body["usage"]["prompt_tokens"]
    msgs[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    st, _, body = bridge.post("/v1/chat/completions", {"model": "xing4", "messages": msgs, "tools": TOOLS,
                                                      "max_tokens": 4})
    assert st == 200, body
    assert body["usage"]["prompt_tokens"] == n_text
    del msgs[1]["tool_calls"]
    st, _, body = bridge.post("/v1/chat/completions", {"model": "xing4", "messages": msgs, "tools": TOOLS,
                                                      "max_tokens": 4})
    assert st == 200, body
    assert body["usage"]["prompt_tokens"] < n_text - 5


def test_thinking_switch_on_the_real_daemon(bridge):
    st, _, on = bridge.post("/v1/chat/completions", chat("hi", max_tokens=6, temperature=0))
    st2, _, off = bridge.post("/v1/chat/completions",
                              chat("hi", max_tokens=6, temperature=0,
                                   chat_template_kwargs={"enable_thinking": False}))
    assert st == 200 and st2 == 200
    # thinking on: the generation prompt opens <think>, so output starts in the reasoning channel
    assert "reasoning_content" in on["choices"][0]["message"]
    assert on["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    assert "reasoning_content" not in off["choices"][0]["message"]
    assert off["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_parameters_reach_the_daemon(fake_bridge, fake):
    body = chat("hi", temperature=0.5, top_p=0.9, top_k=5, min_p=0.1, seed=7, presence_penalty=0.5,
                frequency_penalty=0.25, stop=["x", "y"], max_completion_tokens=33, user="u1", ignore_eos=True)
    assert fake_bridge.post("/v1/chat/completions", body)[0] == 200
    sent = json.loads(fake["record"].read_text().splitlines()[-1])
    assert sent["max_tokens"] == 33 and sent["stop"] == ["x", "y"] and sent["ignore_eos"] is True
    # SamplingParams fields 1,2,3,4,5,7,8 (temperature..seed, presence, frequency)
    assert sent["sampling_fields"] == [1, 2, 3, 4, 5, 7, 8]


def test_ignore_eos_generates_max_tokens(bridge):
    # a random model ends some answers after a few tokens; with ignore_eos every one runs to max_tokens
    for seed in range(6):
        st, _, body = bridge.post("/v1/chat/completions", chat("hi", max_tokens=24, seed=seed, ignore_eos=True))
        assert st == 200, body
        assert body["usage"]["completion_tokens"] == 24 and body["choices"][0]["finish_reason"] == "length"


def test_assistant_prefill_continues_the_message(bridge):
    # Anthropic's prefill (an assistant message last) and vLLM's continue_final_message: the model
    # continues that message's text instead of answering a new turn after it. Greedy, the answer
    # is exactly the raw completion of the template's text up to the prefill (the demo model's
    # template is the Xing4 one: <_system><_user>TEXT<_bot></think>ANSWER...)
    raw = bridge.post("/v1/completions", {"model": "xing4", "prompt": "<_system><_user>hi<_bot></think>Well",
                                          "max_tokens": 8, "temperature": 0})[2]
    want = raw["choices"][0]["text"]
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well"}]
    st, _, body = bridge.post("/v1/messages", {"model": "xing4", "max_tokens": 8, "temperature": 0,
                                               "messages": history})
    assert st == 200, body
    assert body["content"] == [{"type": "text", "text": want}]
    assert body["usage"]["input_tokens"] + body["usage"]["cache_read_input_tokens"] == raw["usage"]["prompt_tokens"]
    st, _, body = bridge.post("/v1/chat/completions", {"model": "xing4", "max_tokens": 8, "temperature": 0,
                                                       "messages": history, "continue_final_message": True,
                                                       "add_generation_prompt": False})
    assert st == 200, body
    assert body["choices"][0]["message"]["content"] == want
    assert "reasoning_content" not in body["choices"][0]["message"]
    # without the flag an OpenAI chat answers a new turn after the assistant's
    st, _, body = bridge.post("/v1/chat/completions", {"model": "xing4", "max_tokens": 8, "temperature": 0,
                                                       "messages": history})
    assert st == 200 and body["usage"]["prompt_tokens"] > raw["usage"]["prompt_tokens"]
    st, _, body = bridge.post("/v1/chat/completions", chat("hi", continue_final_message=True))
    assert_openai_error(st, body, 400, "the last message must be the assistant's", param="continue_final_message")
    st, _, body = bridge.post("/v1/chat/completions", {"model": "xing4", "max_tokens": 8, "messages": history,
                                                       "continue_final_message": True,
                                                       "response_format": {"type": "json_object"}})
    assert_openai_error(st, body, 400, "cannot be combined with response_format", param="continue_final_message")


def test_completion_logprobs_have_text_offsets(bridge):
    # text_offset was always []: one entry per token, where it starts in the output (characters)
    body = {"model": "xing4", "prompt": "Hello", "max_tokens": 12, "logprobs": 1, "seed": 10, "ignore_eos": True}
    st, _, out = bridge.post("/v1/completions", body)
    assert st == 200, out
    text, lp = out["choices"][0]["text"], out["choices"][0]["logprobs"]
    assert len(lp["text_offset"]) == len(lp["tokens"]) == 12
    assert "".join(lp["tokens"]) == text
    for tok, off in zip(lp["tokens"], lp["text_offset"]):
        assert text[off:off + len(tok)] == tok, (tok, off, text)
    # streamed: the same offsets, continuing across chunks
    c = bridge.conn()
    c.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    offsets, tokens = [], []
    for line in r.read().decode().splitlines():
        if line.startswith("data: {"):
            ch = json.loads(line[6:])["choices"]
            if ch and ch[0].get("logprobs"):
                offsets += ch[0]["logprobs"]["text_offset"]
                tokens += ch[0]["logprobs"]["tokens"]
    c.close()
    assert tokens == lp["tokens"] and offsets == lp["text_offset"]


def test_seeded_greedy_is_reproducible_through_the_bridge(bridge):
    a = bridge.post("/v1/completions", {"model": "xing4", "prompt": "The cloud", "max_tokens": 8,
                                        "temperature": 0})[2]
    b = bridge.post("/v1/completions", {"model": "xing4", "prompt": "The cloud", "max_tokens": 8,
                                        "temperature": 0})[2]
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["usage"]["completion_tokens"] <= 8


def test_logprobs_are_mapped(bridge):
    st, _, body = bridge.post("/v1/chat/completions", chat("hi", max_tokens=3, logprobs=True, top_logprobs=2,
                                                           chat_template_kwargs={"enable_thinking": False}))
    assert st == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for t in content:
        assert t["logprob"] <= 0 and len(t["top_logprobs"]) == 2
        assert t["top_logprobs"][0]["logprob"] >= t["top_logprobs"][1]["logprob"]


def test_delete_cancels_a_running_request(bridge, daemon):
    before = daemon.stats()["requests_cancelled"]
    c = bridge.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(chat("go on", max_tokens=4000, stream=True, ignore_eos=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first = json.loads(r.readline().decode()[6:])
    st, _, body = bridge.request("DELETE", f"/v1/requests/{first['id']}")
    assert st == 200 and body["id"] == first["id"] and body["cancelled"] is True
    rest = r.read().decode()
    events = [json.loads(x[6:]) for x in rest.split("\n\n") if x.startswith("data: {")]
    # OpenAI's finish_reason has no "cancelled" (typed clients such as async-openai reject the
    # chunk): the stream ends with an error event saying the answer is incomplete
    assert all(e["choices"][0]["finish_reason"] in (None, "stop", "length") for e in events[:-1]), events
    assert events[-1]["error"]["code"] == "request_cancelled", events[-1]
    assert "the generation was cancelled after" in events[-1]["error"]["message"]
    c.close()
    assert daemon.stats()["requests_cancelled"] == before + 1


def test_client_disconnect_cancels_in_the_daemon(bridge, daemon):
    for stream in (False, True):
        before = daemon.stats()["requests_cancelled"]
        c = bridge.conn()
        c.request("POST", "/v1/chat/completions", body=json.dumps(chat("go on", max_tokens=4000, stream=stream, ignore_eos=True)),
                  headers={"Content-Type": "application/json"})
        # wait until the daemon runs it, then hang up without reading
        deadline = time.monotonic() + 30
        while not daemon.stats()["requests"]:
            assert time.monotonic() < deadline, "request never started"
        c.sock.close()
        c.close()
        deadline = time.monotonic() + 30
        while True:
            s = daemon.stats()
            if s["requests_cancelled"] == before + 1 and not s["requests"]:
                break
            assert time.monotonic() < deadline, f"not cancelled (stream={stream}): {s}"


def test_thinking_budget_caps_reasoning(bridge):
    for extra, budget in (({"thinking_budget": 3}, 3),
                          ({"chat_template_kwargs": {"thinking_budget": 5}}, 5)):
        st, _, body = bridge.post("/v1/chat/completions", chat("hi", max_tokens=20, temperature=0, **extra))
        assert st == 200, body
        # the daemon forces </think> after the budget; the rest of the 20 tokens are content
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == budget
        assert body["choices"][0]["message"]["content"]
    st, _, body = bridge.post("/v1/chat/completions", chat(thinking_budget=-2))
    assert st == 400 and body["error"]["param"] == "thinking_budget"


def test_logprobs_without_alternatives_and_completions_logprobs(bridge):
    st, _, body = bridge.post("/v1/chat/completions", chat("hi", max_tokens=2, logprobs=True))
    assert st == 200
    assert all(t["top_logprobs"] == [] for t in body["choices"][0]["logprobs"]["content"])
    st, _, body = bridge.post("/v1/completions", {"model": "xing4", "prompt": "The cloud", "max_tokens": 3,
                                                  "logprobs": 3, "temperature": 0})
    lp = body["choices"][0]["logprobs"]
    n = body["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
    assert all(len(t) <= 3 for t in lp["top_logprobs"]) and all(x <= 0 for x in lp["token_logprobs"])
    # greedy: the chosen token is the most likely one
    for tok, lpv, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert abs(max(top.values()) - lpv) < 1e-6
        # the alternatives read as the token does in the text (a leading space kept)
        assert tok in top, (tok, top)
    assert "".join(lp["tokens"]) == body["choices"][0]["text"], (lp["tokens"], body["choices"][0]["text"])


def test_a_long_prefill_gets_headers_and_keep_alives(make_bridge, fake, tmp_path):
    # the fake daemon answers "slow-3" after 3 s of silence, as a long prompt's prefill would
    # (sending no progress): the headers go out after sse-keepalive seconds with the first comment
    conf = tmp_path / "http.conf"
    conf.write_text("[xing4-http]\nsse-keepalive = 1\n")
    b = make_bridge([fake["socket"]], "--config", str(conf))
    c = b.conn()
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body=json.dumps(chat("slow-3", stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    headers_s = time.monotonic() - t0
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream; charset=utf-8"
    assert 0.8 < headers_s < 2, f"headers after {headers_s:.1f} s"
    data = r.read().decode()
    c.close()
    head, _, rest = data.partition("data: ")
    # a comment at least every second (sse-keepalive) until the first token, then the stream
    assert head.count(": keep-alive\n\n") >= 2 and head == ": keep-alive\n\n" * head.count(":"), head
    assert ": keep-alive" not in rest and rest.endswith("data: [DONE]\n\n")
    assert '"content":"Hello"' in rest


def post_running(bridge, daemon, max_tokens):
    """A non-streamed chat request posted from a thread, once the daemon runs it: (thread, {"r":
    the (status, headers, body) once it is answered})."""
    out = {}

    def call():
        out["r"] = bridge.post("/v1/chat/completions", chat("go on", max_tokens=max_tokens, ignore_eos=True))
    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 30
    while not daemon.stats()["requests"]:
        assert time.monotonic() < deadline, "the request never reached the daemon"
        time.sleep(0.02)
    return t, out


def test_cancelled_non_streaming_request_is_an_error_not_finish_reason_cancelled(bridge, daemon):
    # x4ctl cancel (or the daemon stopping) ends a request whose client still waits: the answer
    # is incomplete, and OpenAI's finish_reason has no value for that ("cancelled" breaks typed
    # clients), so it is a 499 error that SDKs do not retry
    import subprocess
    from conftest import X4CTL
    t, out = post_running(bridge, daemon, 4000)
    sid = daemon.stats()["requests"][0]["server_request_id"]
    r = subprocess.run([str(X4CTL), "--socket", daemon.sock, "cancel", str(sid)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    t.join(30)
    st, _, body = out["r"]
    e = assert_openai_error(st, body, 499, "the generation was cancelled after ")
    assert e["code"] == "request_cancelled" and "the answer is incomplete" in e["message"], e


def test_a_refusal_after_a_slow_tokenization_keeps_its_status(make_bridge, fake, tmp_path):
    # "late-invalid": the daemon refuses the prompt after 1.5 s (a long prompt's tokenization, then
    # "prompt of N tokens leaves no room"): a streamed request still gets the 400, not a 200 and an
    # error event, since nothing said the prompt was taken
    conf = tmp_path / "http.conf"
    conf.write_text("[xing4-http]\nsse-keepalive = 5\n")
    b = make_bridge([fake["socket"]], "--config", str(conf))
    st, hdrs, body = b.post("/v1/chat/completions", chat("late-invalid", stream=True))
    assert st == 400, (st, body)
    assert body["error"]["code"] == "context_length_exceeded", body
    st, hdrs, body = b.post("/v1/messages", {"model": "claude-x", "max_tokens": 8, "stream": True,
                                             "messages": [{"role": "user", "content": "late-invalid"}]},
                            headers={"anthropic-version": "2023-06-01"})
    assert st == 400 and body["type"] == "error", (st, body)
    assert body["error"]["message"].startswith("prompt is too long: "), body


def test_prefill_progress_sends_the_headers(make_bridge, fake, tmp_path):
    # "progress-2": a progress frame, then 2 s until the answer: the prompt was taken, so the
    # headers go at the progress frame, well before sse-keepalive (5 s)
    conf = tmp_path / "http.conf"
    conf.write_text("[xing4-http]\nsse-keepalive = 5\n")
    b = make_bridge([fake["socket"]], "--config", str(conf))
    c = b.conn()
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body=json.dumps(chat("progress-2", stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    headers_s = time.monotonic() - t0
    assert r.status == 200 and headers_s < 1.5, headers_s
    data = r.read().decode()
    c.close()
    assert '"content":"Hello"' in data and data.endswith("data: [DONE]\n\n")


def test_a_tool_call_being_written_still_gets_headers_and_keep_alives(make_bridge, fake, tmp_path):
    # "call-slow": a token of a call (no text to show) at once, the whole call 2.5 s later: the
    # token says the prompt was taken (headers at once), and the silence gets keep-alives
    conf = tmp_path / "http.conf"
    conf.write_text("[xing4-http]\nsse-keepalive = 1\n")
    b = make_bridge([fake["socket"]], "--config", str(conf))
    c = b.conn()
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body=json.dumps(chat("call-slow", stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    headers_s = time.monotonic() - t0
    data = r.read().decode()
    c.close()
    assert r.status == 200 and headers_s < 0.9, headers_s
    assert data.count(": keep-alive\n\n") >= 1 and '"name":"get_weather"' in data, data


def test_a_cancel_by_the_daemon_shutting_down_is_a_503_to_retry(fake_bridge):
    """Done.server_shutdown (the daemon's grace period ran out): the request was fine, so it is a
    503 with Retry-After, which the SDKs retry, not the 499 of a client's own cancel."""
    st, hdrs, body = fake_bridge.post("/v1/chat/completions", chat("cancelled-by-shutdown"))
    e = assert_openai_error(st, body, 503, "because the daemon is shutting down")
    assert e["code"] == "shutting_down" and "retry" in e["message"], e
    assert int(hdrs["retry-after"]) >= 1, hdrs
    st, hdrs, body = fake_bridge.post("/v1/messages", {"model": "claude-x", "max_tokens": 8, "messages": [
        {"role": "user", "content": "cancelled-by-shutdown"}]}, headers={"anthropic-version": "2023-06-01"})
    assert st == 503 and body["error"]["type"] == "overloaded_error", body
    assert "retry-after" in hdrs
    # streamed: the error event says the same
    c = fake_bridge.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(chat("cancelled-by-shutdown", stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    assert '"code":"shutting_down"' in data and "[DONE]" not in data, data
    # a cancel from elsewhere stays a 499
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("cancelled-elsewhere"))
    assert st == 499 and body["error"]["code"] == "request_cancelled", body


def test_daemon_grace_period_over_is_a_503(demo_model, make_bridge, tmp_path):
    """The real daemon says which cancels are its shutdown's: SIGTERM with a 1 s grace period while
    a non-streamed request runs gives its client a 503 to retry."""
    import signal
    from conftest import Daemon, DAEMON_CONF
    d = Daemon(tmp_path, demo_model, conf=DAEMON_CONF + "grace = 1\n")
    try:
        t, out = post_running(make_bridge([d.sock]), d, 100000)
        d.proc.send_signal(signal.SIGTERM)
        t.join(60)
        st, hdrs, body = out["r"]
        e = assert_openai_error(st, body, 503, "because the daemon is shutting down")
        assert e["code"] == "shutting_down" and "retry-after" in hdrs, (e, hdrs)
    finally:
        d.close()


def test_drain_window_over_ends_streams_with_a_shutdown_error(fake, make_bridge, tmp_path):
    """SIGTERM, then the drain window (drain-timeout) runs out mid-stream: the stream gets an error
    event saying so and a proper end of its chunked body (not a cut connection), and the log says
    it was the shutdown, not the client going away."""
    import signal
    conf = tmp_path / "http.conf"
    conf.write_text("[xing4-http]\ndrain-timeout = 1\n")
    b = make_bridge([fake["socket"]], "--config", str(conf))
    c = b.conn(timeout=20)
    c.request("POST", "/v1/chat/completions", body=json.dumps(chat("slow", stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200  # the stream is under way: its headers follow the first token
    b.proc.send_signal(signal.SIGTERM)
    data = r.read().decode()  # http.client raises IncompleteRead on a cut chunked body
    c.close()
    assert '"code":"shutting_down"' in data and "xing4-http is shutting down" in data, data
    assert "[DONE]" not in data
    assert b.proc.wait(timeout=15) == 0
    log = b.exited_log()
    assert "drain window of 1 s is over" in log and "client went away" not in log, log


def test_logprobs_cover_exactly_the_content(fake_bridge):
    """As OpenAI's: the tokens of logprobs.content join to the content; special tokens (</think>,
    <_end>) and reasoning tokens are left out, and a token whose text was held back comes with the
    text it turned out to be."""
    want = ["Hel", "lo", " wor", "ld"]
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("logprob-specials", logprobs=True, top_logprobs=1))
    assert st == 200, body
    m = body["choices"][0]
    tokens = [e["token"] for e in m["logprobs"]["content"]]
    assert tokens == want and "".join(tokens) == m["message"]["content"], (tokens, m)
    c = fake_bridge.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(chat("logprob-specials", logprobs=True, stream=True)),
              headers={"Content-Type": "application/json"})
    data = c.getresponse().read().decode()
    c.close()
    streamed, text = [], ""
    for line in data.splitlines():
        if line.startswith("data: {"):
            ch = json.loads(line[6:])["choices"]
            if ch:
                text += ch[0]["delta"].get("content") or ""
                streamed += [e["token"] for e in (ch[0].get("logprobs") or {}).get("content") or []]
    assert streamed == want and text == "Hello world", (streamed, data)


def test_a_forced_call_has_no_content_logprobs(fake_bridge):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    st, _, body = fake_bridge.post("/v1/chat/completions", chat(
        "call-specials", tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        logprobs=True))
    assert st == 200, body
    m = body["choices"][0]
    assert m["message"]["content"] is None and m["message"]["tool_calls"], m
    assert m["logprobs"]["content"] == [], m["logprobs"]
