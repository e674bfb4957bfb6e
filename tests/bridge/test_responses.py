# SPDX-License-Identifier: MIT
"""POST /v1/responses (OpenAI's Responses API) over the scripted fake daemon: input items and
instructions as the protocol's chat, tools and tool_choice, text.format as the Constraint,
previous_response_id from the bridge's store (and its bounds), the response object, and the event
stream byte for byte."""
import json
import time

import pytest

import sse_fixture
from conftest import assert_openai_error

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": False}


def last_request(fake):
    return json.loads(fake["record"].read_text().splitlines()[-1])


def resp(input="hi", **kw):
    body = {"model": "xing4", "input": input}
    body.update(kw)
    return body


def test_string_input_and_response_object(fake, fake_bridge):
    st, _, body = fake_bridge.post("/v1/responses", resp("hi", instructions="Be brief.", max_output_tokens=50,
                                                         temperature=0.3, top_p=0.5))
    assert st == 200, body
    assert body["object"] == "response" and body["status"] == "completed" and body["id"].startswith("resp_")
    assert [o["type"] for o in body["output"]] == ["reasoning", "message"]
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert body["output"][1]["content"][0]["type"] == "output_text"
    assert body["output"][1]["content"][0]["text"] == "Hello, world"
    assert body["usage"] == {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 3,
                             "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 10}
    assert body["instructions"] == "Be brief." and body["max_output_tokens"] == 50
    r = last_request(fake)
    assert r["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert r["max_tokens"] == 50 and r["sampling"] == {"temperature": 0.3, "top_p": 0.5}


def test_items_map_to_the_chat(fake, fake_bridge):
    items = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
        {"role": "user", "content": "Thanks"},
    ]
    st, _, body = fake_bridge.post("/v1/responses", resp(items, reasoning={"effort": "none"}))
    assert st == 200, body
    r = last_request(fake)
    assert r["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning": "Need the tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "content": "sunny", "name": "get_weather"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks"},
    ]
    assert r["enable_thinking"] is False


def test_hosted_tools_are_left_out(fake, fake_bridge):
    # what Codex sends besides its function tools
    tools = TOOLS + [{"type": "web_search", "external_web_access": False},
                     {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "x"}]},
                     {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}]
    st, _, body = fake_bridge.post("/v1/responses", resp("weather?", tools=tools))
    assert st == 200, body
    assert [t["function"]["name"] for t in last_request(fake)["tools"]] == ["get_weather", "apply_patch"]
    st, _, body = fake_bridge.post("/v1/responses", resp("hi", tools=tools[1:3]))
    assert st == 200 and "tools" not in last_request(fake)


def test_function_call_answer(fake, fake_bridge):
    st, _, body = fake_bridge.post("/v1/responses", resp("weather?", tools=TOOLS))
    assert st == 200, body
    call = body["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert call["call_id"].startswith("call_") and len(call["call_id"]) <= 40
    assert last_request(fake)["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": TOOLS[0]["parameters"], "description": "Weather of a city"}}]


@pytest.mark.parametrize("kw,want", [
    ({"tools": TOOLS, "tool_choice": "required"}, {"tool": None}),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather"}}, {"tool": "get_weather"}),
    ({"text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA, "strict": True}}},
     {"json_schema": SCHEMA}),
    ({"text": {"format": {"type": "json_object"}}}, {"json_object": True}),
    ({"text": {"format": {"type": "text"}}}, None),
])
def test_constraint_reaches_the_daemon(fake, fake_bridge, kw, want):
    st, _, body = fake_bridge.post("/v1/responses", resp("q", **kw))
    assert st == 200, body
    assert last_request(fake).get("constraint") == want
    if want and "tool" not in want:
        assert json.loads(body["output"][-1]["content"][0]["text"]) == {"answer": "yes"}


def test_previous_response_id_continues_the_conversation(fake, fake_bridge):
    st, _, first = fake_bridge.post("/v1/responses", resp("weather?", tools=TOOLS, instructions="Old rules."))
    assert st == 200, first
    call = first["output"][-1]
    st, _, second = fake_bridge.post("/v1/responses", resp(
        [{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}],
        previous_response_id=first["id"], tools=TOOLS, instructions="New rules."))
    assert st == 200, second
    assert second["previous_response_id"] == first["id"]
    r = last_request(fake)
    # the new instructions only (as OpenAI does), the earlier turn, the answer's call, its result
    assert r["messages"] == [
        {"role": "system", "content": "New rules."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "reasoning": "Need weather.",
         "tool_calls": [{"id": call["call_id"], "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "sunny", "name": "get_weather"},
    ]
    assert second["output"][-1]["content"][0]["text"] == "It is sunny in Paris."


def test_previous_response_id_unknown_or_not_stored(fake_bridge):
    st, _, body = fake_bridge.post("/v1/responses", resp("x", previous_response_id="resp_nope"))
    e = assert_openai_error(st, body, 400, 'response "resp_nope" is not stored here', param="previous_response_id")
    assert e["code"] == "previous_response_not_found"
    st, _, first = fake_bridge.post("/v1/responses", resp("x", store=False))
    st, _, body = fake_bridge.post("/v1/responses", resp("y", previous_response_id=first["id"]))
    assert st == 400, body


def test_store_bounds(fake, make_bridge):
    b = make_bridge([fake["socket"]], "--response-store", "2")
    ids = [b.post("/v1/responses", resp(f"turn {i}"))[2]["id"] for i in range(3)]
    assert b.post("/v1/responses", resp("x", previous_response_id=ids[0]))[0] == 400  # evicted: oldest
    assert b.post("/v1/responses", resp("x", previous_response_id=ids[2]))[0] == 200
    b = make_bridge([fake["socket"]], "--response-retention", "1")
    rid = b.post("/v1/responses", resp("x"))[2]["id"]
    assert b.post("/v1/responses", resp("x", previous_response_id=rid))[0] == 200
    time.sleep(2.1)
    assert b.post("/v1/responses", resp("x", previous_response_id=rid))[0] == 400  # past the retention
    b = make_bridge([fake["socket"]], "--response-store", "0")
    rid = b.post("/v1/responses", resp("x"))[2]["id"]
    assert b.post("/v1/responses", resp("x", previous_response_id=rid))[0] == 400


def test_max_output_tokens_is_incomplete(fake_bridge):
    st, _, body = fake_bridge.post("/v1/responses", resp("think-long"))
    assert st == 200 and body["status"] == "incomplete", body
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize("kw,param,part", [
    ({"input": None}, "input", "a string or an array"),
    ({"input": []}, "input", "a non-empty array"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role", "\"user\", \"assistant\""),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "input[0].content[0]", "content part type \"input_image\" is not supported"),
    ({"input": [{"type": "input_file", "file_id": "f"}]}, "input[0]", "\"input_file\" is not supported"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "item type \"item_reference\""),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]", "needs \"call_id\""),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "required"),
    ({"max_output_tokens": 0}, "max_output_tokens", "out of range"),
    ({"temperature": 3}, "temperature", "out of range"),
    ({"instructions": 5}, "instructions", "a string expected"),
    ({"tools": [{"type": "teleport"}]}, "tools[0].type", "unknown tool type \"teleport\""),
    ({"tools": [{"type": "function"}]}, "tools[0].name", "required"),
    ({"tool_choice": "required"}, "tool_choice", "needs a non-empty \"tools\""),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name", "\"nope\""),
    ({"tools": TOOLS, "tool_choice": "often"}, "tool_choice", "\"often\""),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type", "\"xml\""),
    ({"text": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "text.format.name", "required"),
    ({"text": {"format": {"type": "json_schema", "name": "a", "schema": []}}}, "text.format.schema", "object"),
    ({"tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format",
     "cannot be combined"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "\"none\", \"minimal\""),
    ({"background": True}, "background", "not supported"),
    # server-side state this bridge does not have: refused, not silently answered without it
    ({"conversation": "conv_123"}, "conversation", "a stored conversation"),
    ({"conversation": {"id": "conv_123"}}, "conversation", "not supported"),
    ({"prompt": {"id": "pmpt_1", "version": "2"}}, "prompt", "a stored prompt template"),
    ({"stream": "yes"}, "stream", "true or false"),
])
def test_bad_values_name_the_field(fake_bridge, kw, param, part):
    body = resp("q")
    body.update(kw)
    if body["input"] is None:
        del body["input"]
        st, _, out = fake_bridge.post("/v1/responses", body)
        assert_openai_error(st, out, 400, "input: required", param="input")
        body["input"] = 5
    st, _, out = fake_bridge.post("/v1/responses", body)
    assert_openai_error(st, out, 400, part, param=param)


def raw_stream(bridge, body):
    return sse_fixture.stream(bridge, "/v1/responses", body)


def test_empty_answer_streamed_and_not_streamed_alike(fake_bridge):
    # a turn that ends before any text: the non-streamed output is one empty message; the stream
    # had no item events and an empty output in response.completed
    st, _, body = fake_bridge.post("/v1/responses", resp("say-nothing"))
    assert st == 200, body
    assert [(o["type"], o["content"][0]["text"]) for o in body["output"]] == [("message", "")]
    events = [json.loads(line[6:]) for line in raw_stream(fake_bridge, {**resp("say-nothing"), "stream": True})
              .decode().splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[-1]["response"]
    assert [(o["type"], o["content"][0]["text"]) for o in done["output"]] == [("message", "")]
    assert events[6]["item"] == done["output"][0]


def test_stream_bytes_text(fake_bridge):
    sse_fixture.check("responses-text", raw_stream(fake_bridge, resp("hi", stream=True)))


def test_stream_bytes_function_call(fake_bridge):
    sse_fixture.check("responses-function-call", raw_stream(fake_bridge, resp("weather?", stream=True, tools=TOOLS)))


def test_stream_error_after_start(fake_bridge):
    sse_fixture.check("responses-error", raw_stream(fake_bridge, resp("error-after-start", stream=True)))


def test_stream_sequence_numbers_count_up(fake_bridge):
    data = raw_stream(fake_bridge, resp("weather?", stream=True, tools=TOOLS)).decode()
    events = [json.loads(block.split("\ndata: ", 1)[1]) for block in data.strip().split("\n\n")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"


def test_stored_conversation_is_not_changed_by_a_later_turn(fake, fake_bridge):
    st, _, first = fake_bridge.post("/v1/responses", resp("hi"))
    call = {"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"}
    st, _, _ = fake_bridge.post("/v1/responses", resp([call], previous_response_id=first["id"]))
    assert st == 200
    assert last_request(fake)["messages"][-1]["tool_calls"][0]["id"] == "c9"
    st, _, _ = fake_bridge.post("/v1/responses", resp("again", previous_response_id=first["id"]))
    assert st == 200
    sent = last_request(fake)["messages"]
    assert sent[1] == {"role": "assistant", "content": "Hello, world", "reasoning": "Let me think."}
    assert sent[2] == {"role": "user", "content": "again"}


def test_stored_responses_belong_to_their_api_key(fake, make_bridge, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sk-a\nsk-b\n")
    b = make_bridge([fake["socket"]], "--api-key-file", str(keys))
    a = {"Authorization": "Bearer sk-a"}
    st, _, first = b.post("/v1/responses", resp("hi"), headers=a)
    assert st == 200, first
    st, _, _ = b.post("/v1/responses", resp("x", previous_response_id=first["id"]), headers=a)
    assert st == 200
    st, _, body = b.post("/v1/responses", resp("x", previous_response_id=first["id"]),
                         headers={"Authorization": "Bearer sk-b"})
    assert_openai_error(st, body, 400, "is not stored here", param="previous_response_id")


def sse_events(data):
    return [json.loads(b[len("data: "):]) for b in data.decode().split("\n") if b.startswith("data: {")]


def stream_raw(bridge, body, conf=None):
    c = bridge.conn()
    t0 = time.monotonic()
    c.request("POST", "/v1/responses", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    headers_s = time.monotonic() - t0
    data = r.read()
    c.close()
    return r, headers_s, data


def test_a_cancelled_stream_fails_instead_of_completing(fake_bridge):
    """Cut short from elsewhere (x4ctl cancel, DELETE /v1/requests/ID): response.completed would
    read as a finished answer to Codex and the Agents SDK; response.failed says it is not, and the
    cut item is incomplete."""
    r, _, data = stream_raw(fake_bridge, resp("cancelled-elsewhere", stream=True))
    ev = sse_events(data)
    types = [e["type"] for e in ev]
    assert types[0] == "response.created" and types[-1] == "response.failed", types
    assert "response.completed" not in types
    fail = ev[-1]["response"]
    assert fail["status"] == "failed" and fail["error"]["code"] == "request_cancelled", fail
    assert fail["output"][0]["status"] == "incomplete", fail["output"]
    assert r.getheader("x-request-id") == fail["id"]
    # not streamed: the response itself says so
    st, _, body = fake_bridge.post("/v1/responses", resp("cancelled-elsewhere"))
    assert st == 200 and body["status"] == "cancelled", body


def test_response_created_goes_out_with_the_headers(make_bridge, fake, tmp_path):
    """A long prefill (the fake's progress frame, then 2 s): response.created comes at once, so the
    client knows the id (and can cancel) before the first token."""
    conf = tmp_path / "http.conf"
    conf.write_text("[xing4-http]\nsse-keepalive = 5\n")
    b = make_bridge([fake["socket"]], "--config", str(conf))
    c = b.conn()
    t0 = time.monotonic()
    c.request("POST", "/v1/responses", body=json.dumps(resp("progress-2", stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first = r.readline() + r.readline()
    created_s = time.monotonic() - t0
    rest = r.read()
    c.close()
    assert created_s < 1.5 and b"response.created" in first, (created_s, first)
    assert sse_events(first + rest)[-1]["type"] == "response.completed"


def test_reasoning_effort_values(fake, fake_bridge):
    for effort, thinking in (("xhigh", True), ("minimal", False), ("none", False)):
        st, _, body = fake_bridge.post("/v1/responses", resp(reasoning={"effort": effort}))
        assert st == 200, body
        assert last_request(fake).get("enable_thinking", True) is thinking, effort


def test_stored_responses_can_be_retrieved_and_deleted(fake_bridge):
    st, _, made = fake_bridge.post("/v1/responses", resp("hi"))
    assert st == 200, made
    st, _, got = fake_bridge.request("GET", f"/v1/responses/{made['id']}")
    assert st == 200 and got == made, (got, made)
    r, _, data = stream_raw(fake_bridge, resp("hi", stream=True))
    done = sse_events(data)[-1]["response"]
    st, _, got = fake_bridge.request("GET", f"/v1/responses/{done['id']}")
    assert st == 200 and got["output"] == done["output"] and got["status"] == "completed", got
    st, _, gone = fake_bridge.request("DELETE", f"/v1/responses/{made['id']}")
    assert st == 200 and gone == {"id": made["id"], "object": "response", "deleted": True}, gone
    for method in ("GET", "DELETE"):
        st, _, body = fake_bridge.request(method, f"/v1/responses/{made['id']}")
        assert_openai_error(st, body, 404, "not found", None)
        assert body["error"]["code"] == "not_found"
    st, _, unstored = fake_bridge.post("/v1/responses", resp("hi", store=False))
    st, _, body = fake_bridge.request("GET", f"/v1/responses/{unstored['id']}")
    assert st == 404, body


def test_input_items_of_a_stored_response(fake_bridge):
    """GET /v1/responses/ID/input_items (the SDK's responses.inputItems.list): the input as sent,
    as items with ids, newest first by default, paged by limit and after."""
    st, _, made = fake_bridge.post("/v1/responses", resp("hi"))
    assert st == 200, made
    st, _, page = fake_bridge.request("GET", f"/v1/responses/{made['id']}/input_items")
    assert st == 200, page
    assert page["object"] == "list" and page["has_more"] is False, page
    (item,) = page["data"]
    assert item["type"] == "message" and item["role"] == "user", item
    assert item["content"] == [{"type": "input_text", "text": "hi"}] and item["id"], item
    assert page["first_id"] == page["last_id"] == item["id"]
    items = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "one"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]}]
    st, _, made = fake_bridge.post("/v1/responses", resp(items))
    assert st == 200, made
    url = f"/v1/responses/{made['id']}/input_items"
    st, _, page = fake_bridge.request("GET", url)
    texts = [i["content"][0]["text"] for i in page["data"]]
    assert texts == ["two", "one", "Be brief."], page
    st, _, page = fake_bridge.request("GET", url + "?order=asc&limit=2")
    assert [i["content"][0]["text"] for i in page["data"]] == ["Be brief.", "one"] and page["has_more"], page
    st, _, page = fake_bridge.request("GET", url + f"?order=asc&after={page['last_id']}")
    assert [i["content"][0]["text"] for i in page["data"]] == ["two"] and not page["has_more"], page
    st, _, body = fake_bridge.request("GET", url + "?limit=0")
    assert_openai_error(st, body, 400, "limit: an integer from 1 to 100", "limit")
    st, _, body = fake_bridge.request("GET", "/v1/responses/resp_nope/input_items")
    assert_openai_error(st, body, 404, "not found", None)
