# SPDX-License-Identifier: MIT
"""What real clients send that a strict reading of the API would refuse or mishandle (found by a
black-box audit): a base URL with a trailing slash joined to "/v1/..." ("//v1/..."), reasoning
effort on chat completions, top_p 0, the legacy completions defaults, a replayed refusal part, an
SDK sending both auth headers, Anthropic clients on the shared /v1/models route."""
import json

from conftest import assert_openai_error, chat


def last_request(fake):
    return json.loads(fake["record"].read_text().splitlines()[-1])


def test_a_double_slash_before_v1_is_the_same_route(fake_bridge):
    for path in ("//v1/chat/completions", "/v1//chat/completions"):
        st, _, body = fake_bridge.post(path, chat())
        assert st == 200 and body["object"] == "chat.completion", (path, body)
    st, _, body = fake_bridge.request("GET", "//v1/models")
    assert st == 200 and body["object"] == "list", body
    st, _, body = fake_bridge.post("//v1/nowhere", chat())
    assert_openai_error(st, body, 404, "POST /v1/nowhere")


def test_reasoning_effort_none_turns_reasoning_off(fake, fake_bridge):
    for effort, thinking in (("none", False), ("minimal", False)):
        st, _, body = fake_bridge.post("/v1/chat/completions", chat(reasoning_effort=effort))
        assert st == 200, body
        assert last_request(fake)["enable_thinking"] is thinking
    st, _, body = fake_bridge.post("/v1/chat/completions", chat(reasoning_effort="high"))
    assert st == 200 and last_request(fake).get("enable_thinking", True) is True
    # an explicit chat_template_kwargs wins
    st, _, body = fake_bridge.post("/v1/chat/completions", chat(reasoning_effort="none",
                                                                chat_template_kwargs={"enable_thinking": True}))
    assert st == 200 and last_request(fake)["enable_thinking"] is True
    st, _, body = fake_bridge.post("/v1/chat/completions", chat(reasoning_effort="bogus"))
    assert_openai_error(st, body, 400, "reasoning_effort", "reasoning_effort")


def test_top_p_zero_is_greedy(fake, fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat(top_p=0))
    assert st == 200, body
    s = last_request(fake)["sampling"]
    assert s.get("top_k") == 1 and "top_p" not in s, s
    st, _, body = fake_bridge.post("/v1/messages", {"model": "claude-x", "max_tokens": 4, "top_p": 0,
                                                    "messages": [{"role": "user", "content": "hi"}]},
                                   headers={"anthropic-version": "2023-06-01"})
    assert st == 200 and last_request(fake)["sampling"].get("top_k") == 1, body
    st, _, body = fake_bridge.post("/v1/chat/completions", chat(top_p=-0.1))
    assert_openai_error(st, body, 400, "top_p", "top_p")


def test_legacy_completions_defaults(fake, fake_bridge):
    st, _, body = fake_bridge.post("/v1/completions", {"model": "xing4", "prompt": "Once upon"})
    assert st == 200, body
    assert last_request(fake)["max_tokens"] == 16  # the legacy API's default, not the daemon's
    st, _, body = fake_bridge.post("/v1/completions", {"model": "xing4", "prompt": "x", "max_tokens": 40,
                                                       "suffix": ""})
    assert st == 200 and last_request(fake)["max_tokens"] == 40, body
    st, _, body = fake_bridge.post("/v1/completions", {"model": "xing4", "prompt": [[1, 2, 3]], "max_tokens": 2})
    assert st == 200, body
    st, _, body = fake_bridge.post("/v1/completions", {"model": "xing4", "prompt": "x", "suffix": "y"})
    assert_openai_error(st, body, 400, "suffix", "suffix")


def test_a_replayed_refusal_part_is_text(fake, fake_bridge):
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
            {"role": "user", "content": "Why?"}]
    st, _, body = fake_bridge.post("/v1/chat/completions", chat(messages=msgs))
    assert st == 200, body
    assert last_request(fake)["messages"][1]["content"] == "I can't."


def test_either_auth_header_may_hold_the_key(fake, make_bridge, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sk-one\n")
    b = make_bridge([fake["socket"]], "--api-key-file", str(keys))
    st, _, _ = b.post("/v1/chat/completions", chat(), headers={"Authorization": "Bearer wrong", "x-api-key": "sk-one"})
    assert st == 200
    st, _, _ = b.post("/v1/chat/completions", chat(), headers={"Authorization": "Bearer sk-one", "x-api-key": "no"})
    assert st == 200
    st, _, _ = b.post("/v1/chat/completions", chat(), headers={"Authorization": "Bearer wrong", "x-api-key": "no"})
    assert st == 401


def test_anthropic_clients_get_their_error_shape_on_models(fake_bridge):
    st, _, body = fake_bridge.request("GET", "/v1/models/gpt-4", headers={"anthropic-version": "2023-06-01"})
    assert st == 404 and body["type"] == "error" and body["error"]["type"] == "not_found_error", body
    st, _, body = fake_bridge.request("GET", "/v1/models/gpt-4")
    assert_openai_error(st, body, 404, "gpt-4")


def test_schemas_written_for_validation_are_lenient_unless_strict(fake, fake_bridge):
    """A forced tool call and a non-strict json_schema ask the daemon to ignore the keywords it
    cannot enforce (Constraint.lenient) instead of refusing them: MCP and Pydantic schemas carry
    pattern / minLength / minimum routinely. strict: true keeps the exact subset."""
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string", "pattern": "^/"}}}}}]
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("x", tools=tools, tool_choice="required"))
    assert st == 200, body
    assert last_request(fake).get("constraint_lenient") is True
    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}
    for strict, lenient in ((False, True), (None, True), (True, None)):
        js = {"name": "P", "schema": schema}
        if strict is not None:
            js["strict"] = strict
        st, _, body = fake_bridge.post("/v1/chat/completions",
                                       chat("x", response_format={"type": "json_schema", "json_schema": js}))
        assert st == 200, body
        assert last_request(fake).get("constraint_lenient") is lenient, (strict, last_request(fake))
    st, _, body = fake_bridge.post("/v1/messages", {
        "model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1}}}}],
        "tool_choice": {"type": "tool", "name": "get_weather"}}, headers={"anthropic-version": "2023-06-01"})
    assert st == 200 and last_request(fake).get("constraint_lenient") is True, body


def test_nested_fields_are_named_whole(fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat(stream=True, stream_options={"include_usage": "yes"}))
    assert_openai_error(st, body, 400, "stream_options.include_usage: true or false expected",
                        "stream_options.include_usage")
    st, _, body = fake_bridge.post("/v1/chat/completions", chat(chat_template_kwargs={"thinking_budget": "x"}))
    assert_openai_error(st, body, 400, "chat_template_kwargs.thinking_budget", "chat_template_kwargs.thinking_budget")


def test_completions_logprobs_zero_gives_the_sampled_tokens(bridge):
    st, _, body = bridge.post("/v1/completions", {"model": "xing4", "prompt": "The cloud", "max_tokens": 3,
                                                  "logprobs": 0, "temperature": 0})
    assert st == 200, body
    lp = body["choices"][0]["logprobs"]
    n = body["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == n and all(t == {} for t in lp["top_logprobs"]), lp
