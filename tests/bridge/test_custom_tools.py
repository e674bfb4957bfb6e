# SPDX-License-Identifier: MIT
"""Responses API custom tools (type "custom": free-form text input, such as Codex's apply_patch)
over the scripted fake daemon: offered to the model as a function of one string argument, input;
its calls answered as custom_tool_call items (streamed with response.custom_tool_call_input.delta
and .done); custom_tool_call and custom_tool_call_output items of a later turn as the call and its
result; bad definitions a 400 naming the field."""
import json

import pytest

from conftest import assert_openai_error
from fakedaemon import PATCH

GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
               "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR}}
FUNC = {"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def recorded(fake):
    return json.loads(fake["record"].read_text().splitlines()[-1])


def resp(input, **kw):
    return {"model": "xing4", "input": input, "tools": [FUNC, APPLY_PATCH], **kw}


def events_of(bridge, body):
    c = bridge.conn()
    c.request("POST", "/v1/responses", body=json.dumps({**body, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    assert r.status == 200, data
    return [json.loads(block.split("\ndata: ", 1)[1]) for block in data.strip().split("\n\n")]


def test_custom_tool_is_offered_as_a_function_of_one_string(fake, fake_bridge):
    st, _, body = fake_bridge.post("/v1/responses", resp("hi"))
    assert st == 200, body
    tools = recorded(fake)["tools"]
    assert [t["function"]["name"] for t in tools] == ["get_weather", "apply_patch"]
    fn = tools[1]["function"]
    assert fn["parameters"]["properties"]["input"]["type"] == "string"
    assert fn["parameters"]["required"] == ["input"]
    # the grammar is not enforced, so the model is told it
    assert fn["description"].startswith("Edit files with a patch.") and GRAMMAR in fn["description"]
    assert body["tools"][1] == APPLY_PATCH  # the response echoes the request's own tools


def test_custom_tool_call_answer(fake_bridge):
    st, _, body = fake_bridge.post("/v1/responses", resp("patch-it"))
    assert st == 200, body
    item = body["output"][-1]
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch"
    assert item["input"] == PATCH and item["status"] == "completed"
    assert item["call_id"].startswith("call_") and item["id"].startswith("ctc_")


def test_custom_tool_call_stream_events(fake_bridge):
    events = events_of(fake_bridge, resp("patch-it"))
    kinds = [e["type"] for e in events]
    i = kinds.index("response.custom_tool_call_input.delta")
    assert kinds[i - 1:i + 3] == ["response.output_item.added", "response.custom_tool_call_input.delta",
                                  "response.custom_tool_call_input.done", "response.output_item.done"]
    added, delta, done, item_done = events[i - 1:i + 3]
    assert added["item"]["type"] == "custom_tool_call" and added["item"]["input"] == ""
    assert delta["delta"] == PATCH and done["input"] == PATCH
    assert delta["item_id"] == done["item_id"] == item_done["item"]["id"]
    assert item_done["item"]["input"] == PATCH
    assert "response.function_call_arguments.delta" not in kinds
    assert events[-1]["response"]["output"][-1] == item_done["item"]


def test_custom_tool_call_and_output_items_replay(fake, fake_bridge):
    items = [{"role": "user", "content": "add hello.txt"},
             {"type": "custom_tool_call", "call_id": "call_7", "name": "apply_patch", "input": PATCH},
             {"type": "custom_tool_call_output", "call_id": "call_7", "output": "Done!"}]
    st, _, body = fake_bridge.post("/v1/responses", resp(items))
    assert st == 200, body
    msgs = recorded(fake)["messages"]
    assert msgs[1]["role"] == "assistant"
    call = msgs[1]["tool_calls"][0]
    assert call["id"] == "call_7" and call["function"]["name"] == "apply_patch"
    assert json.loads(call["function"]["arguments"]) == {"input": PATCH}
    assert msgs[2] == {"role": "tool", "content": "Done!", "name": "apply_patch"}


def test_custom_tool_call_output_continues_a_stored_response(fake, fake_bridge):
    st, _, first = fake_bridge.post("/v1/responses", resp("patch-it"))
    assert st == 200, first
    call = first["output"][-1]
    st, _, second = fake_bridge.post("/v1/responses", resp(
        [{"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Done!"}],
        previous_response_id=first["id"]))
    assert st == 200, second
    msgs = recorded(fake)["messages"]
    assert json.loads(msgs[-2]["tool_calls"][0]["function"]["arguments"]) == {"input": PATCH}
    assert msgs[-1] == {"role": "tool", "content": "Done!", "name": "apply_patch"}


def test_tool_choice_names_a_custom_tool(fake, fake_bridge):
    st, _, body = fake_bridge.post("/v1/responses", resp("q", tool_choice={"type": "custom", "name": "apply_patch"}))
    assert st == 200, body
    assert recorded(fake)["constraint"] == {"tool": "apply_patch"}


@pytest.mark.parametrize("kw,param,part", [
    ({"tools": [{"type": "custom"}]}, "tools[0].name", "required"),
    ({"tools": [{"type": "custom", "name": "p", "description": 3}]}, "tools[0].description", "a string expected"),
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "regexp"}}]}, "tools[0].format",
     '{"type": "text"} or {"type": "grammar"'),
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "grammar", "definition": 1}}]},
     "tools[0].format.definition", "a string expected"),
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "ebnf"}}]},
     "tools[0].format.syntax", '"lark" or "regex" expected'),
    ({"tools": [FUNC, {"type": "custom", "name": "get_weather"}]}, "tools[1].name",
     '"get_weather" is also the name of tools[0]'),
    ({"tools": [FUNC, APPLY_PATCH], "tool_choice": {"type": "custom", "name": "get_weather"}}, "tool_choice.name",
     "not one of the request's custom tools"),
    ({"tools": [FUNC, APPLY_PATCH], "tool_choice": {"type": "function", "name": "apply_patch"}}, "tool_choice.name",
     "not one of the request's function tools"),
    ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch"}]}, "input[0]",
     'needs "call_id", "name" and "input" strings'),
    ({"input": [{"type": "custom_tool_call_output", "output": "x"}]}, "input[0].call_id", "required"),
])
def test_bad_custom_tools_name_the_field(fake_bridge, kw, param, part):
    st, _, body = fake_bridge.post("/v1/responses", {"model": "xing4", "input": "hi", **kw})
    assert_openai_error(st, body, 400, part, param)
