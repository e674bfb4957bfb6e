# SPDX-License-Identifier: MIT
"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) over the scripted
fake daemon: what each request field becomes in the protocol request (the fake records it), the
answer's shape, the event stream byte for byte, and errors in Anthropic's shape naming the field.
Constraints (forced tools) are checked as far as the request the daemon gets: honouring them is
the engine's (tests/compat and the engine's own tests check real constrained output)."""
import json

import pytest

import sse_fixture

TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def msg(content="hi", **kw):
    body = {"model": "claude-sonnet-4-5-20250929", "max_tokens": 64, "messages": [{"role": "user", "content": content}]}
    body.update(kw)
    return body


def last_request(fake):
    return json.loads(fake["record"].read_text().splitlines()[-1])


def post(bridge, body, path="/v1/messages", **kw):
    return bridge.post(path, body, headers={"anthropic-version": "2023-06-01", **kw.pop("headers", {})}, **kw)


def assert_anthropic_error(st, body, want_status, want_type, part):
    assert st == want_status, body
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == want_type, body
    assert part in body["error"]["message"], body["error"]["message"]


def test_basic_answer_and_mapping(fake, fake_bridge):
    st, _, body = post(fake_bridge, msg("hi", system=[{"type": "text", "text": "Be brief.",
                                                        "cache_control": {"type": "ephemeral"}}],
                                        temperature=0.5, top_p=0.9, top_k=40, stop_sequences=["END"],
                                        metadata={"user_id": "u1"}))
    assert st == 200, body
    assert body["type"] == "message" and body["role"] == "assistant"
    assert body["id"].startswith("msg_")
    assert body["model"] == "claude-sonnet-4-5-20250929"  # the name asked for, served by the alias
    assert body["content"][-1] == {"type": "text", "text": "Hello, world"}
    assert body["stop_reason"] == "end_turn" and body["stop_sequence"] is None
    assert body["usage"] == {"input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3,
                             "output_tokens": 3}
    r = last_request(fake)
    assert r["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert r["enable_thinking"] is False  # the API's default: no thinking unless asked
    assert r["max_tokens"] == 64 and r["stop"] == ["END"]
    assert r["sampling"] == {"temperature": 0.5, "top_p": 0.9, "top_k": 40}
    assert "constraint" not in r


def test_stop_sequence_reported(fake_bridge):
    st, _, body = post(fake_bridge, msg("stop-here", stop_sequences=["END"]))
    assert st == 200 and body["stop_reason"] == "stop_sequence" and body["stop_sequence"] == "END", body


def test_thinking_budget_and_blocks(fake, fake_bridge):
    st, _, body = post(fake_bridge, msg("hi", thinking={"type": "enabled", "budget_tokens": 2048}))
    assert st == 200, body
    # a signature clients can keep and send back: the same as the stream's signature_delta
    # (fixtures/messages-text.sse), a digest of the text
    assert body["content"][0] == {"type": "thinking", "thinking": "Let me think.",
                                  "signature": "xing4d-9acf7fade953e586"}
    r = last_request(fake)
    assert r["enable_thinking"] is True and r["thinking_budget"] == 2048
    st, _, body = post(fake_bridge, msg("think-long", thinking={"type": "enabled", "budget_tokens": 10}))
    assert body["stop_reason"] == "max_tokens" and [b["type"] for b in body["content"]] == ["thinking"]


def test_history_blocks_map_to_the_chat(fake, fake_bridge):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "xxx"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}],
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "And tomorrow?"}]},
    ]
    st, _, body = post(fake_bridge, {"model": "xing4", "max_tokens": 16, "messages": messages})
    assert st == 200, body
    assert last_request(fake)["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning": "Use the tool.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "content": "sunny", "name": "get_weather"},
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_tool_error_result_is_marked(fake, fake_bridge):
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                              "content": "boom"}]}]
    st, _, _ = post(fake_bridge, {"model": "xing4", "max_tokens": 16, "messages": messages})
    assert st == 200
    assert last_request(fake)["messages"][-1] == {"role": "tool", "content": "Error: boom", "name": "f"}


def test_tools_and_tool_use_answer(fake, fake_bridge):
    st, _, body = post(fake_bridge, msg("weather?", tools=TOOLS))
    assert st == 200, body
    assert body["stop_reason"] == "tool_use"
    use = body["content"][-1]
    assert use["type"] == "tool_use" and use["name"] == "get_weather" and use["input"] == {"city": "Paris"}
    assert use["id"].startswith("toolu_") and len(use["id"]) <= 40
    r = last_request(fake)
    assert r["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": TOOLS[0]["input_schema"], "description": "Weather of a city"}}]
    assert r["constraint"] == {"tool_calls": None}  # auto: each call held to the tools' syntax


@pytest.mark.parametrize("choice,want", [({"type": "any"}, {"tool": None}),
                                         ({"type": "tool", "name": "get_weather"}, {"tool": "get_weather"}),
                                         ({"type": "auto"}, {"tool_calls": None}),
                                         ({"type": "none"}, None)])
def test_tool_choice_becomes_the_constraint(fake, fake_bridge, choice, want):
    st, _, body = post(fake_bridge, msg("weather?", tools=TOOLS, tool_choice=choice))
    assert st == 200, body
    r = last_request(fake)
    assert r.get("constraint") == want


def test_tool_choice_none_keeps_tools_and_answers_a_call_as_text(fake, fake_bridge):
    # the tools stay in the prompt (as Anthropic's and vLLM's do); the model may not call one: the
    # call the fake daemon answers with comes back as its text
    st, _, body = post(fake_bridge, msg("hi", tools=TOOLS, tool_choice={"type": "none"}))
    assert st == 200, body
    assert [t["function"]["name"] for t in last_request(fake)["tools"]] == ["get_weather"]
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    assert body["content"][1]["text"] == '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
    assert body["stop_reason"] == "end_turn"


def test_output_format_json_schema(fake, fake_bridge):
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    st, _, body = post(fake_bridge, msg("q", output_format={"type": "json_schema", "schema": schema}))
    assert st == 200, body
    assert last_request(fake)["constraint"] == {"json_schema": schema}
    assert json.loads(body["content"][-1]["text"]) == {"answer": "yes"}


@pytest.mark.parametrize("body,field,part", [
    ({"model": "xing4", "messages": [{"role": "user", "content": "x"}]}, "max_tokens", "max_tokens: required"),
    (msg(max_tokens=0), "max_tokens", "max_tokens"),
    (msg(temperature=1.5), "temperature", "temperature: 1.5 is out of range"),
    (msg(top_k=-1), "top_k", "top_k"),
    (msg(stop_sequences="END"), "stop_sequences", "stop_sequences: an array"),
    (msg(stop_sequences=[""]), "stop_sequences", "entry 0"),
    (msg(thinking={"type": "enabled"}), "thinking", "thinking.budget_tokens: required"),
    (msg(thinking={"type": "enabled", "budget_tokens": 0}), "thinking", "budget_tokens"),
    (msg(thinking={"type": "sometimes"}), "thinking", "thinking.type: \"enabled\", \"adaptive\" or \"disabled\""),
    (msg(system=5), "system", "system: a string or an array"),
    (msg(system=[{"type": "hologram"}]), "system", "system[0]: content block type \"hologram\""),
    (msg([{"type": "hologram"}]), "unknown", "unknown content block type \"hologram\""),
    ({"model": "xing4", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role",
     "messages[0].role: \"system\""),
    (msg(tools=[{"name": "f"}]), "tools", "tools[0].input_schema: required"),
    (msg(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools", "tools[0].type"),
    (msg(tools=TOOLS, tool_choice={"type": "tool"}), "tool_choice", "tool_choice.name: required"),
    (msg(tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}), "tool_choice", "\"nope\" is not one"),
    (msg(tool_choice={"type": "any"}), "tool_choice", "needs a non-empty \"tools\""),
    (msg(tools=TOOLS, tool_choice={"type": "maybe"}), "tool_choice", "tool_choice.type"),
    (msg(output_format={"type": "json_schema"}), "output_format", "output_format.schema"),
    (msg(output_config={"format": {"type": "nope"}}), "output_config", "output_config.format: {\"type\": \"json_schema\""),
    (msg(output_config=3), "output_config", "output_config: an object expected"),
    (msg(metadata=[]), "metadata", "metadata: an object"),
    (msg(mcp_servers=[{"type": "url", "url": "https://mcp.example/sse", "name": "ex"}]), "mcp_servers",
     "mcp_servers: remote MCP servers"),
])
def test_bad_values_are_400_in_anthropic_shape(fake_bridge, body, field, part):
    st, _, out = post(fake_bridge, body)
    assert_anthropic_error(st, out, 400, "invalid_request_error", part)


@pytest.mark.parametrize("value", [None, []])
def test_no_mcp_servers_is_fine(fake_bridge, value):
    st, _, out = post(fake_bridge, msg(mcp_servers=value))
    assert st == 200, out


def test_unknown_model_and_other_errors_in_anthropic_shape(fake, fake_bridge, make_bridge, tmp_path):
    st, _, out = post(fake_bridge, msg(model="gpt-4o"))
    assert_anthropic_error(st, out, 404, "not_found_error", "\"gpt-4o\" does not exist")
    st, _, out = fake_bridge.post("/v1/messages", msg(), headers={"Content-Type": "text/plain"})
    assert_anthropic_error(st, out, 415, "invalid_request_error", "Content-Type")
    st, _, out = post(fake_bridge, "{not json")
    assert_anthropic_error(st, out, 400, "invalid_request_error", "not valid JSON")
    st, _, out = post(fake_bridge, msg("error-invalid"))
    assert_anthropic_error(st, out, 400, "invalid_request_error", "scripted refusal")
    st, _, out = post(fake_bridge, msg("error-internal"))
    assert_anthropic_error(st, out, 500, "api_error", "scripted internal failure")
    st, _, out = fake_bridge.request("GET", "/v1/messages")
    assert_anthropic_error(st, out, 405, "invalid_request_error", "only POST")


def test_auth_with_x_api_key_or_bearer(fake, make_bridge, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sk-one\n")
    b = make_bridge([fake["socket"]], "--api-key-file", str(keys))
    st, _, out = post(b, msg())
    assert_anthropic_error(st, out, 401, "authentication_error", "x-api-key")
    st, _, out = post(b, msg(), headers={"x-api-key": "sk-wrong"})
    assert st == 401
    st, _, out = post(b, msg(), headers={"x-api-key": "sk-one"})
    assert st == 200, out
    st, _, out = post(b, msg(), headers={"Authorization": "Bearer sk-one"})
    assert st == 200, out


def test_beta_query_and_cache_control_accepted(fake_bridge):
    body = msg([{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "5m"}}],
               tools=[dict(TOOLS[0], cache_control={"type": "ephemeral"})])
    st, _, out = post(fake_bridge, body, path="/v1/messages?beta=true",
                      headers={"anthropic-beta": "prompt-caching-2024-07-31"})
    assert st == 200, out


def test_count_tokens(fake, fake_bridge):
    st, _, out = post(fake_bridge, {"model": "claude-sonnet-4-5", "system": "s",
                                    "messages": [{"role": "user", "content": "hi"}]},
                      path="/v1/messages/count_tokens?beta=true")
    assert st == 200 and out == {"input_tokens": 7}, out
    r = last_request(fake)
    assert r["max_tokens"] == 1 and r["messages"][0] == {"role": "system", "content": "s"}
    assert r["count_only"] is True  # protocol 1.4; max_tokens 1 for a 1.3 daemon
    st, _, out = post(fake_bridge, {"model": "xing4", "messages": []}, path="/v1/messages/count_tokens")
    assert_anthropic_error(st, out, 400, "invalid_request_error", "messages: a non-empty array")


def raw_stream(bridge, body, path="/v1/messages"):
    return sse_fixture.stream(bridge, path, body)


def test_stream_bytes_text_and_thinking(fake_bridge):
    data = raw_stream(fake_bridge, msg("hi", stream=True, thinking={"type": "enabled", "budget_tokens": 1024}))
    sse_fixture.check("messages-text", data)


def test_stream_bytes_tool_use(fake_bridge):
    data = raw_stream(fake_bridge, msg("weather?", stream=True, tools=TOOLS))
    sse_fixture.check("messages-tool-use", data)


def test_assistant_prefill_is_continued(fake, fake_bridge):
    # an assistant message with text last is a prefill (Anthropic's API): the daemon is asked to
    # leave it open instead of answering a new turn after it
    st, _, body = post(fake_bridge, {**msg("hi"), "messages": [{"role": "user", "content": "hi"},
                                                              {"role": "assistant", "content": "{\"a\": "}]})
    assert st == 200, body
    r = last_request(fake)
    assert r["messages"][-1] == {"role": "assistant", "content": "{\"a\": "}
    assert r["add_generation_prompt"] is False
    st, _, body = post(fake_bridge, {**msg("hi"), "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "Sure"}]}],
        "stream": True})
    assert st == 200 and last_request(fake)["add_generation_prompt"] is False
    # an ordinary turn gets the generation prompt (the field is left unset)
    post(fake_bridge, msg("hi"))
    assert "add_generation_prompt" not in last_request(fake)
    # a constrained answer starts at its first token: a prefill before it is refused, not garbled
    prefill = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}]
    st, _, body = post(fake_bridge, {**msg("hi"), "messages": prefill,
                                     "output_format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert_anthropic_error(st, body, 400, "invalid_request_error", "cannot be combined with output_format")
    st, _, body = post(fake_bridge, {**msg("hi"), "messages": prefill, "tools": TOOLS, "tool_choice": {"type": "any"}})
    assert_anthropic_error(st, body, 400, "invalid_request_error", "a forced tool call")


def sse_events(data):
    return [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]


def test_empty_answer_streamed_and_not_streamed_alike(fake_bridge):
    # a turn that ends before any text: the non-streaming answer has one empty text block, and so
    # must the message a client assembles from the stream (the SDK's finalMessage())
    st, _, body = post(fake_bridge, msg("say-nothing"))
    assert st == 200, body
    assert body["content"] == [{"type": "text", "text": ""}] and body["stop_reason"] == "end_turn"
    events = sse_events(raw_stream(fake_bridge, msg("say-nothing", stream=True)))
    assert [e["type"] for e in events] == ["message_start", "ping", "content_block_start", "content_block_stop",
                                           "message_delta", "message_stop"]
    assert events[2]["index"] == 0 and events[2]["content_block"] == {"type": "text", "text": ""}
    assert events[3]["index"] == 0
    assert events[4]["delta"]["stop_reason"] == "end_turn"


def test_stream_error_after_start(fake_bridge):
    data = raw_stream(fake_bridge, msg("error-after-start", stream=True))
    sse_fixture.check("messages-error", data)


def test_message_start_reports_the_prompt_size(bridge):
    # the SDK and Claude Code show message_start's usage while the answer streams: the prompt's
    # tokens are known once it is prefilled (the daemon's first chunk says so), not 0
    body = msg("Tell me about the weather in Paris today.", stream=True, max_tokens=4)
    for _ in range(2):  # the second time the prompt comes from the prefix cache
        events = sse_events(raw_stream(bridge, body))
        start = events[0]["message"]["usage"]
        final = [e for e in events if e["type"] == "message_delta"][-1]["usage"]
        assert start["input_tokens"] + start["cache_read_input_tokens"] > 0, start
        assert start["input_tokens"] == final["input_tokens"], (start, final)
        assert start["cache_read_input_tokens"] == final["cache_read_input_tokens"], (start, final)
        assert start["output_tokens"] == 0


def test_images_and_documents_become_notes(fake, fake_bridge):
    """Clients resend the whole history: an image a tool returned (Claude Code's Read of a PNG) or
    a pasted screenshot must not fail every later turn, so the model gets a note in its place; a
    text document gets its text."""
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    content = [{"type": "text", "text": "look"}, img,
               {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc body"}}]
    body = {"model": "xing4", "max_tokens": 8, "messages": [
        {"role": "user", "content": content},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": "a.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "ok"}, img]}]}]}
    st, _, out = post(fake_bridge, body)
    assert st == 200, out
    msgs = last_request(fake)["messages"]
    assert msgs[0]["content"] == "look\n[image omitted: image/png: this model reads text only]\ndoc body"
    assert msgs[2]["content"] == "ok\n[image omitted: image/png: this model reads text only]"


def test_thinking_adaptive_and_output_config_format(fake, fake_bridge):
    st, _, out = post(fake_bridge, msg(thinking={"type": "adaptive"}))
    assert st == 200, out
    r = last_request(fake)
    assert r["enable_thinking"] is True and "thinking_budget" not in r, r
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    st, _, out = post(fake_bridge, msg("q", output_config={"format": {"type": "json_schema", "schema": schema}}))
    assert st == 200, out
    assert last_request(fake)["constraint"] == {"json_schema": schema}


def test_a_generation_cancelled_elsewhere_is_an_error(fake_bridge):
    """x4ctl cancel, DELETE /v1/requests/ID or the daemon stopping: not an empty end_turn (an agent
    would end its turn on it) but an error in Anthropic's shape, also mid-stream."""
    st, _, out = post(fake_bridge, msg("cancelled-elsewhere"))
    assert_anthropic_error(st, out, 499, "api_error", "was cancelled after 1 tokens")
    body = msg("cancelled-elsewhere")
    body["stream"] = True
    c = fake_bridge.conn()
    c.request("POST", "/v1/messages", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    assert r.status == 200 and "event: error\n" in data, data
    assert "message_stop" not in data and '"stop_reason":"end_turn"' not in data, data


def test_count_tokens_on_the_real_daemon_generates_nothing(bridge, daemon):
    """Counting renders and tokenizes only: no generation, no slot, and a conversation over the
    context is counted (clients count to learn that it no longer fits), where a generation of the
    same prompt is refused in Anthropic's words."""
    before = daemon.stats()
    big = {"model": "claude-x", "messages": [{"role": "user", "content": "word " * 270000}]}
    st, _, out = post(bridge, big, path="/v1/messages/count_tokens")
    assert st == 200 and out["input_tokens"] > 262144, out
    small = {"model": "claude-x", "system": "Be brief.", "messages": [{"role": "user", "content": "Hi there"}]}
    st, _, out = post(bridge, small, path="/v1/messages/count_tokens")
    assert st == 200, out
    after = daemon.stats()
    assert after["completion_tokens_total"] == before["completion_tokens_total"], (before, after)
    assert after["prompt_tokens_total"] == before["prompt_tokens_total"], (before, after)
    st, _, gen = post(bridge, {**small, "max_tokens": 1})
    assert st == 200 and gen["usage"]["input_tokens"] + gen["usage"]["cache_read_input_tokens"] == out["input_tokens"]
    st, _, err = post(bridge, {**big, "max_tokens": 4})
    assert_anthropic_error(st, err, 400, "invalid_request_error", "prompt is too long: ")


def test_request_id_header(fake_bridge):
    st, hdrs, out = post(fake_bridge, msg())
    assert st == 200 and hdrs.get("request-id") == out["id"], (hdrs, out["id"])


def test_anthropic_client_tools_get_their_published_schemas(fake, fake_bridge):
    """bash_* and text_editor_* are client tools named by type alone: the model gets them with
    their schemas; server tools (web search) are refused naming what they are."""
    st, _, out = post(fake_bridge, msg("list files", tools=[
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]))
    assert st == 200, out
    tools = {t["function"]["name"]: t["function"] for t in last_request(fake)["tools"]}
    assert tools["bash"]["parameters"]["properties"]["command"]["type"] == "string"
    ed = tools["str_replace_based_edit_tool"]["parameters"]
    assert "str_replace" in ed["properties"]["command"]["enum"] and ed["required"] == ["command", "path"]
    st, _, out = post(fake_bridge, msg(tools=[{"type": "web_search_20250305", "name": "web_search"}]))
    assert_anthropic_error(st, out, 400, "invalid_request_error", "server tools (web search")


def test_a_turn_of_dropped_blocks_is_still_a_user_turn(fake, fake_bridge):
    body = {"model": "claude-x", "max_tokens": 8, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "web_search_tool_result", "tool_use_id": "x", "content": []}]}]}
    st, _, out = post(fake_bridge, body)
    assert st == 200, out
    assert last_request(fake)["messages"][-1] == {"role": "user", "content": ""}


def test_error_shapes_follow_the_route(fake_bridge):
    st, _, out = fake_bridge.post("/v1//messages", {"model": "claude-x", "messages": []},
                                  headers={"anthropic-version": "2023-06-01"})
    assert st == 400 and out["type"] == "error", out
    # an anthropic-version header (a proxy forwarding it) does not change the chat route's shape
    st, _, out = fake_bridge.post("/v1/chat/completions", {"model": "xing4", "messages": []},
                                  headers={"anthropic-version": "2023-06-01"})
    assert st == 400 and "error" in out and "code" in out["error"], out


def test_counting_adds_no_prompt_tokens_to_the_metrics(fake_bridge):
    def prompt_total():
        st, _, body = fake_bridge.request("GET", "/metrics")
        text = body.decode() if isinstance(body, bytes) else str(body)
        return [line for line in text.splitlines() if line.startswith("xing4_http_prompt_tokens_total")]
    before = prompt_total()
    st, _, out = post(fake_bridge, {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]},
                      path="/v1/messages/count_tokens")
    assert st == 200
    assert prompt_total() == before
