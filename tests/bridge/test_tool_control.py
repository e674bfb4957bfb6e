# SPDX-License-Identifier: MIT
"""How many tool calls an answer may hold, over the scripted fake daemon, in all three APIs:
parallel_tool_calls false (Anthropic: tool_choice.disable_parallel_tool_use) ends the answer with
its first call, and the rest of the generation is cancelled in the daemon; tool_choice "none"
keeps the tools in the prompt, and a call the model writes anyway is answered as its text.

The fake daemon answers "two-calls" with two calls and then waits for a Cancel: a Done with 1
completion token is the sign that the bridge cancelled (without one it sends a third call)."""
import json

import pytest

from conftest import assert_openai_error, chat

FUNCS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
RS_TOOLS = [{"type": "function", "name": "get_weather", "parameters": FUNCS[0]["function"]["parameters"]}]
AM_TOOLS = [{"name": "get_weather", "input_schema": FUNCS[0]["function"]["parameters"]}]
CALL_TEXT = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'


def last_request(fake):
    return json.loads(fake["record"].read_text().splitlines()[-1])


def stream(bridge, path, body, headers=None):
    """The data of each SSE event of a streamed answer (JSON), "[DONE]" left out."""
    c = bridge.conn()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    assert r.status == 200, data
    out = []
    for block in data.strip().split("\n\n"):
        line = [x for x in block.split("\n") if x.startswith("data: ")][0][6:]
        if line != "[DONE]":
            out.append(json.loads(line))
    return out


def anthropic(content, **kw):
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": content}],
            "tools": AM_TOOLS}
    body.update(kw)
    return body


AM_HEADERS = {"anthropic-version": "2023-06-01"}

# ---- parallel_tool_calls: false ------------------------------------------------------------------


def test_chat_one_call_when_parallel_calls_are_off(fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions",
                                   chat("two-calls", tools=FUNCS, parallel_tool_calls=False))
    assert st == 200, body
    choice = body["choices"][0]
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [{"city": "Paris"}]
    assert choice["finish_reason"] == "tool_calls"
    assert body["usage"]["completion_tokens"] == 1  # the daemon was cancelled after the call


def test_chat_stream_one_call_when_parallel_calls_are_off(fake_bridge):
    chunks = stream(fake_bridge, "/v1/chat/completions",
                    chat("two-calls", tools=FUNCS, parallel_tool_calls=False, stream=True))
    calls = [tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])]
    assert {tc["index"] for tc in calls} == {0}
    assert json.loads("".join(tc["function"]["arguments"] for tc in calls)) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_parallel_tool_calls_must_be_a_boolean(fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("hi", tools=FUNCS, parallel_tool_calls="no"))
    assert_openai_error(st, body, 400, "parallel_tool_calls: true or false expected", "parallel_tool_calls")


def test_responses_one_call_when_parallel_calls_are_off(fake_bridge):
    body = {"model": "xing4", "input": "two-calls", "tools": RS_TOOLS, "parallel_tool_calls": False}
    st, _, r = fake_bridge.post("/v1/responses", body)
    assert st == 200, r
    calls = [o for o in r["output"] if o["type"] == "function_call"]
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Paris"}]
    assert r["status"] == "completed" and r["parallel_tool_calls"] is False
    assert r["usage"]["output_tokens"] == 1
    events = stream(fake_bridge, "/v1/responses", {**body, "stream": True})
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["reasoning", "function_call"]
    assert events[-1]["type"] == "response.completed"
    assert [o["type"] for o in events[-1]["response"]["output"]] == ["reasoning", "function_call"]


def test_anthropic_one_tool_use_when_parallel_use_is_disabled(fake_bridge):
    choice = {"type": "auto", "disable_parallel_tool_use": True}
    st, _, body = fake_bridge.post("/v1/messages", anthropic("two-calls", tool_choice=choice), headers=AM_HEADERS)
    assert st == 200, body
    assert [b["input"] for b in body["content"] if b["type"] == "tool_use"] == [{"city": "Paris"}]
    assert body["stop_reason"] == "tool_use" and body["usage"]["output_tokens"] == 1
    events = stream(fake_bridge, "/v1/messages", anthropic("two-calls", tool_choice=choice, stream=True), AM_HEADERS)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts.count("tool_use") == 1
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == ["tool_use"]


# ---- tool_choice: none ---------------------------------------------------------------------------


def test_chat_tool_choice_none_keeps_the_tools_and_answers_text(fake, fake_bridge):
    st, _, body = fake_bridge.post("/v1/chat/completions", chat("weather?", tools=FUNCS, tool_choice="none"))
    assert st == 200, body
    assert last_request(fake)["tools"] == FUNCS
    choice = body["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["message"]["content"] == CALL_TEXT
    assert choice["finish_reason"] == "stop"
    chunks = stream(fake_bridge, "/v1/chat/completions",
                    chat("weather?", tools=FUNCS, tool_choice="none", stream=True))
    assert not any("tool_calls" in ch["delta"] for c in chunks for ch in c["choices"])
    assert "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"]) == CALL_TEXT
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_responses_tool_choice_none_keeps_the_tools_and_answers_text(fake, fake_bridge):
    st, _, r = fake_bridge.post("/v1/responses", {"model": "xing4", "input": "weather?", "tools": RS_TOOLS,
                                                  "tool_choice": "none"})
    assert st == 200, r
    assert [t["function"]["name"] for t in last_request(fake)["tools"]] == ["get_weather"]
    assert [o["type"] for o in r["output"]] == ["reasoning", "message"]
    assert r["output"][1]["content"][0]["text"] == CALL_TEXT


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_tool_choice_none_forces_nothing(fake, fake_bridge, api):
    if api == "chat":
        st, _, _ = fake_bridge.post("/v1/chat/completions", chat("hi", tools=FUNCS, tool_choice="none"))
    elif api == "responses":
        st, _, _ = fake_bridge.post("/v1/responses", {"model": "xing4", "input": "hi", "tools": RS_TOOLS,
                                                      "tool_choice": "none"})
    else:
        st, _, _ = fake_bridge.post("/v1/messages", anthropic("hi", tool_choice={"type": "none"}), headers=AM_HEADERS)
    assert st == 200
    assert "constraint" not in last_request(fake)
